//! The network seam: how the operator opens byte streams.
//!
//! Production hands in [`TcpDialer`]; the simulation hands in a dialer over turmoil's
//! simulated TCP (and a kube-proxy-like Service). Nothing in the operator opens a socket
//! on its own, so the same control loops run in both worlds.

use std::io;

use futures::future::BoxFuture;
use tokio::io::{AsyncRead, AsyncWrite};

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

/// Real TCP through tokio, with Nagle's algorithm off (gRPC messages are small and
/// latency-bound).
#[derive(Clone, Copy, Debug, Default)]
pub struct TcpDialer;

impl Dialer for TcpDialer {
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
