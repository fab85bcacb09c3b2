//! A stopped process's connections (SIGSTOP): the kernel completed their handshakes and
//! takes in what the peer sends, but the process reads, answers and sends nothing, not
//! even an HTTP/2 PING's ack, until it runs again. Wrapping the connections a host's
//! server accepts, rather than cutting the host off, keeps the kernel's half: a connect to
//! a frozen spurctld completes (a conformance case pins it on the real binary), and a
//! probe on it waits out its bound, as on a real cluster, instead of an unanswered SYN.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use futures::future::BoxFuture;
use spur_operator::net::Listener;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::Network;

/// A connection of `host` that stops while the host is frozen.
pub struct Freezable<S> {
    inner: S,
    host: String,
    net: Network,
}

impl<S: AsyncRead + Unpin> AsyncRead for Freezable<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        ready!(self.net.poll_running(&self.host, cx));
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Freezable<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        ready!(self.net.poll_running(&self.host, cx));
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.net.poll_running(&self.host, cx));
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.net.poll_running(&self.host, cx));
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A listener of `host` whose accepted connections are [`Freezable`]. Accepting goes on
/// while frozen, as the kernel's backlog takes connections in; the connections stop.
pub struct FreezableListener<L> {
    inner: L,
    host: String,
    net: Network,
}

impl<L> FreezableListener<L> {
    pub fn new(inner: L, host: &str, net: Network) -> Self {
        Self {
            inner,
            host: host.to_owned(),
            net,
        }
    }
}

impl<L: Listener> Listener for FreezableListener<L> {
    type Conn = Freezable<L::Conn>;

    fn accept(&mut self) -> BoxFuture<'_, io::Result<(Self::Conn, SocketAddr)>> {
        Box::pin(async move {
            let (inner, peer) = self.inner.accept().await?;
            let conn = Freezable {
                inner,
                host: self.host.clone(),
                net: self.net.clone(),
            };
            Ok((conn, peer))
        })
    }
}
