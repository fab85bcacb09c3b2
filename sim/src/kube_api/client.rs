//! A `kube::Client` over any [`Dialer`]: how the simulation hands the operator a client that
//! talks to the simulated API server over the simulated network.

use std::{
    io,
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use futures::future::BoxFuture;
use http::{Request, Uri, uri::PathAndQuery};
use hyper_util::{
    client::legacy::connect::{Connected, Connection},
    rt::{TokioExecutor, TokioIo, TokioTimer},
};
use spur_operator::net::Dialer;
use tower::{BoxError, ServiceBuilder, ServiceExt as _};

/// How long an idle pooled connection is kept (hyper's default).
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// A `kube::Client` whose connections to `http://{host}:{port}` are opened by `dialer`,
/// with `default` as its default namespace.
///
/// Plain HTTP/1.1, no authentication, hyper's connection pool; the client adds no timeouts
/// of its own (bounding calls is the caller's business, as in production).
pub fn client_over<D: Dialer>(dialer: D, host: &str, port: u16) -> kube::Client {
    let authority: http::uri::Authority = format!("{host}:{port}").parse().unwrap_or_else(|_| {
        // An unparsable host still dials through the dialer; the URI only needs to be valid.
        http::uri::Authority::from_static("kube-api:80")
    });
    let http = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .pool_timer(TokioTimer::new())
        .pool_idle_timeout(POOL_IDLE_TIMEOUT)
        .build(DialConnector {
            dialer,
            host: host.to_owned(),
            port,
        });
    let service = ServiceBuilder::new()
        .map_request(move |mut req: Request<kube::client::Body>| {
            let path = req
                .uri()
                .path_and_query()
                .cloned()
                .unwrap_or_else(|| PathAndQuery::from_static("/"));
            *req.uri_mut() = Uri::builder()
                .scheme("http")
                .authority(authority.clone())
                .path_and_query(path)
                .build()
                .expect("scheme, authority and path make a URI");
            req
        })
        .service(http)
        .map_err(BoxError::from);
    kube::Client::new(service, "default")
}

/// A hyper connector that dials every connection to one address through a [`Dialer`].
#[derive(Clone)]
struct DialConnector<D> {
    dialer: D,
    host: String,
    port: u16,
}

impl<D: Dialer> tower::Service<Uri> for DialConnector<D> {
    type Response = Dialed<D::Stream>;
    type Error = io::Error;
    type Future = BoxFuture<'static, io::Result<Self::Response>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: Uri) -> Self::Future {
        let dial = self.dialer.dial(&self.host, self.port);
        Box::pin(async move { Ok(Dialed(TokioIo::new(dial.await?))) })
    }
}

/// A dialed stream as hyper's client wants it.
struct Dialed<S>(TokioIo<S>);

impl<S> Connection for Dialed<S> {
    fn connected(&self) -> Connected {
        Connected::new()
    }
}

impl<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin> hyper::rt::Read for Dialed<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin> hyper::rt::Write for Dialed<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }
}
