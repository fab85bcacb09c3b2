//! Where connections come from: any listener of byte streams (tokio TCP on a laptop,
//! turmoil TCP in a simulation, in-memory pipes in tests), and dialers for the client side.

use std::{future::Future, io};

use futures::future::BoxFuture;
use spur_operator::net::Dialer;
use tokio::{
    io::{AsyncRead, AsyncWrite, DuplexStream},
    sync::mpsc,
};

/// A source of accepted connections the API server serves.
pub trait Accept: Send + 'static {
    /// An accepted connection.
    type Io: AsyncRead + AsyncWrite + Send + Unpin + 'static;

    /// Waits for the next connection; an error ends serving.
    fn accept(&mut self) -> impl Future<Output = io::Result<Self::Io>> + Send;

    /// The name of the host a connection comes from, when the transport knows one
    /// (recorded with each write it makes).
    fn peer_host(_io: &Self::Io) -> Option<String> {
        None
    }
}

impl Accept for tokio::net::TcpListener {
    type Io = tokio::net::TcpStream;

    async fn accept(&mut self) -> io::Result<Self::Io> {
        let (stream, _) = tokio::net::TcpListener::accept(self).await?;
        stream.set_nodelay(true)?;
        Ok(stream)
    }
}

impl Accept for turmoil::net::TcpListener {
    type Io = turmoil::net::TcpStream;

    async fn accept(&mut self) -> io::Result<Self::Io> {
        let (stream, _) = turmoil::net::TcpListener::accept(self).await?;
        Ok(stream)
    }

    /// turmoil's name for the peer's address (called on the accepting host).
    fn peer_host(io: &Self::Io) -> Option<String> {
        let peer = io.peer_addr().ok()?;
        turmoil::reverse_lookup(peer.ip())
    }
}

/// Size of each in-memory pipe's buffer; a watch event is far smaller.
const PIPE_BUFFER: usize = 256 * 1024;

/// The server side of in-memory connections (see [`memory_pair`]).
#[derive(Debug)]
pub struct MemoryListener(mpsc::UnboundedReceiver<DuplexStream>);

/// Dials in-memory connections to a [`MemoryListener`]; host and port are ignored.
#[derive(Clone, Debug)]
pub struct MemoryDialer(mpsc::UnboundedSender<DuplexStream>);

/// An in-memory dialer and the listener its connections arrive at.
pub fn memory_pair() -> (MemoryDialer, MemoryListener) {
    let (tx, rx) = mpsc::unbounded_channel();
    (MemoryDialer(tx), MemoryListener(rx))
}

impl Accept for MemoryListener {
    type Io = DuplexStream;

    async fn accept(&mut self) -> io::Result<Self::Io> {
        self.0.recv().await.ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotConnected, "every memory dialer is gone")
        })
    }
}

impl Dialer for MemoryDialer {
    type Stream = DuplexStream;

    fn dial(&self, _host: &str, _port: u16) -> BoxFuture<'static, io::Result<Self::Stream>> {
        let (client, server) = tokio::io::duplex(PIPE_BUFFER);
        let sent = self.0.send(server);
        Box::pin(async move {
            sent.map_err(|_| {
                io::Error::new(
                    io::ErrorKind::ConnectionRefused,
                    "the in-memory API server is gone",
                )
            })?;
            Ok(client)
        })
    }
}

/// Dials over turmoil's simulated TCP from the calling host, bare: none of the world's network
/// model (the kernel's SYN retries, partitions, Services) that `crate::net::TurmoilDialer`
/// adds. For the API server's own tests.
#[derive(Clone, Copy, Debug, Default)]
pub struct BareTurmoilDialer;

impl Dialer for BareTurmoilDialer {
    type Stream = turmoil::net::TcpStream;

    fn dial(&self, host: &str, port: u16) -> BoxFuture<'static, io::Result<Self::Stream>> {
        let host = host.to_owned();
        Box::pin(async move { turmoil::net::TcpStream::connect((host.as_str(), port)).await })
    }
}
