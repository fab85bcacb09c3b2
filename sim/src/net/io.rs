//! Adapters so tonic and axum servers serve turmoil's TCP streams.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A turmoil TCP stream that tonic's server and hyper accept (it carries the peer address
/// as tonic connection info).
#[derive(Debug)]
pub struct SimStream {
    inner: turmoil::net::TcpStream,
}

impl SimStream {
    /// Wraps a connected turmoil stream.
    pub fn new(inner: turmoil::net::TcpStream) -> Self {
        Self { inner }
    }

    /// The remote end's address.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.inner.peer_addr()
    }
}

impl AsyncRead for SimStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for SimStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl tonic::transport::server::Connected for SimStream {
    type ConnectInfo = Option<SocketAddr>;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.peer_addr().ok()
    }
}

/// A turmoil TCP listener for tonic (`serve_with_incoming(listener.incoming())`) and axum
/// (`axum::serve(listener, router)`).
pub struct SimListener {
    inner: turmoil::net::TcpListener,
}

impl SimListener {
    /// Binds `0.0.0.0:port` on the current simulated host.
    pub async fn bind(port: u16) -> io::Result<Self> {
        let inner =
            turmoil::net::TcpListener::bind((std::net::Ipv4Addr::UNSPECIFIED, port)).await?;
        Ok(Self { inner })
    }

    /// The accepted connections, as a stream tonic serves.
    pub fn incoming(self) -> impl Stream<Item = io::Result<SimStream>> + Send + 'static {
        futures::stream::unfold(self, |listener| async move {
            let accepted = listener.inner.accept().await;
            Some((accepted.map(|(stream, _)| SimStream::new(stream)), listener))
        })
    }
}

impl axum::serve::Listener for SimListener {
    type Io = SimStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            // turmoil's accept fails only when the host is torn down; retry like axum's
            // own TCP listener does, after a pause so a failure cannot spin.
            match self.inner.accept().await {
                Ok((stream, peer)) => return (SimStream::new(stream), peer),
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(10)).await,
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}
