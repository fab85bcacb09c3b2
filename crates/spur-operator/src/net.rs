//! The network seam: how the operator opens byte streams.
//!
//! Production hands in [`TcpNetwork`]; the simulation hands in a dialer over turmoil's
//! simulated TCP (and a kube-proxy-like Service). Nothing in the operator opens a socket
//! on its own, so the same control loops run in both worlds.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Opens a byte stream to `host:port`.
///
/// A dial may take as long as the network lets it (a dropped SYN never completes in the
/// simulation, and only after the kernel's retries on Linux): callers bound it themselves.
pub trait Dialer: Clone + Send + Sync + 'static {
    /// The connected stream.
    type Stream: AsyncRead + AsyncWrite + Send + Unpin + 'static;

    /// Connects to `host:port`. `host` is a name or an IP literal without brackets.
    fn dial(&self, host: &str, port: u16) -> BoxFuture<'static, io::Result<Self::Stream>>;
}

/// Real TCP through tokio (dialing and listening), with Nagle's algorithm off (gRPC messages are small and
/// latency-bound).
#[derive(Clone, Copy, Debug, Default)]
pub struct TcpNetwork;

impl Dialer for TcpNetwork {
    type Stream = tokio::net::TcpStream;

    fn dial(&self, host: &str, port: u16) -> BoxFuture<'static, io::Result<Self::Stream>> {
        let host = host.to_owned();
        Box::pin(async move {
            let stream = tokio::net::TcpStream::connect((host.as_str(), port)).await?;
            stream.set_nodelay(true)?;
            Ok(stream)
        })
    }
}

/// Accepts byte streams on an address (the health and agent servers).
pub trait Binder: Clone + Send + Sync + 'static {
    type Listener: Listener;

    fn bind(&self, addr: SocketAddr) -> BoxFuture<'static, io::Result<Self::Listener>>;
}

/// A bound listener.
pub trait Listener: Send + 'static {
    type Conn: AsyncRead + AsyncWrite + Send + Sync + Unpin + 'static;

    /// The next connection and the peer's address.
    fn accept(&mut self) -> BoxFuture<'_, io::Result<(Self::Conn, SocketAddr)>>;
}

/// Both halves of the network seam, as the operator takes it.
pub trait Network: Dialer + Binder {}
impl<N: Dialer + Binder> Network for N {}

impl Binder for TcpNetwork {
    type Listener = tokio::net::TcpListener;

    fn bind(&self, addr: SocketAddr) -> BoxFuture<'static, io::Result<Self::Listener>> {
        Box::pin(tokio::net::TcpListener::bind(addr))
    }
}

impl Listener for tokio::net::TcpListener {
    type Conn = tokio::net::TcpStream;

    fn accept(&mut self) -> BoxFuture<'_, io::Result<(Self::Conn, SocketAddr)>> {
        Box::pin(async move {
            let (stream, peer) = tokio::net::TcpListener::accept(self).await?;
            stream.set_nodelay(true)?;
            Ok((stream, peer))
        })
    }
}

/// A listener's connections as a stream that tonic's `serve_with_incoming` accepts.
pub fn incoming<L: Listener>(
    listener: L,
) -> impl futures::Stream<Item = io::Result<Accepted<L::Conn>>> + Send + 'static {
    futures::stream::unfold(listener, |mut listener| async move {
        let next = listener
            .accept()
            .await
            .map(|(conn, peer)| Accepted { conn, peer });
        Some((next, listener))
    })
}

/// An accepted connection with the peer's address (tonic's `Connected`).
pub struct Accepted<C> {
    conn: C,
    peer: SocketAddr,
}

impl<C> Accepted<C> {
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }
}

impl<C: Send + Sync + 'static> tonic::transport::server::Connected for Accepted<C> {
    type ConnectInfo = SocketAddr;
    fn connect_info(&self) -> SocketAddr {
        self.peer
    }
}

impl<C: AsyncRead + Unpin> AsyncRead for Accepted<C> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.conn).poll_read(cx, buf)
    }
}

impl<C: AsyncWrite + Unpin> AsyncWrite for Accepted<C> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.conn).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.conn).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.conn).poll_shutdown(cx)
    }
}
