//! A connector that lets tonic (`Endpoint::connect_with_connector`) and a hyper client
//! open their connections through any [`Dialer`].

use std::pin::Pin;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use http::Uri;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::TokioIo;
use spur_operator::net::Dialer;

/// Why a connection could not be opened. Displays as hyper-util's own connector does
/// (`tcp connect error`), so tonic reports `UNAVAILABLE "tcp connect error"` as it does
/// against a real spurctld; the cause is the error's source.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The URI names no host.
    #[error("invalid URI {0}: no host")]
    NoHost(Uri),
    /// The dial failed (refused, timed out, unknown host).
    #[error("tcp connect error")]
    Dial(#[source] std::io::Error),
}

/// A `tower::Service<Uri>` over a [`Dialer`]: the port comes from the URI, or 80/443 from
/// its scheme.
#[derive(Clone, Debug)]
pub struct DialerConnector<D> {
    dialer: D,
}

impl<D: Dialer> DialerConnector<D> {
    /// Wraps `dialer`.
    pub fn new(dialer: D) -> Self {
        Self { dialer }
    }
}

impl<D: Dialer> tower::Service<Uri> for DialerConnector<D> {
    type Response = DialedIo<D::Stream>;
    type Error = ConnectError;
    type Future = BoxFuture<'static, Result<Self::Response, ConnectError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), ConnectError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let Some(host) = uri.host() else {
            return Box::pin(async move { Err(ConnectError::NoHost(uri)) });
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let port = uri.port_u16().unwrap_or(match uri.scheme_str() {
            Some("https") => 443,
            _ => 80,
        });
        let dial = self.dialer.dial(host, port);
        Box::pin(async move {
            let stream = dial.await.map_err(ConnectError::Dial)?;
            Ok(DialedIo {
                io: TokioIo::new(stream),
            })
        })
    }
}

/// A dialed stream as hyper sees it.
#[derive(Debug)]
pub struct DialedIo<S> {
    io: TokioIo<S>,
}

impl<S> Connection for DialedIo<S> {
    fn connected(&self) -> Connected {
        Connected::new()
    }
}

impl<S> hyper::rt::Read for DialedIo<S>
where
    S: tokio::io::AsyncRead + Unpin,
{
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<S> hyper::rt::Write for DialedIo<S>
where
    S: tokio::io::AsyncWrite + Unpin,
{
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}
