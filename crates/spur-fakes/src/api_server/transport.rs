//! In-memory connections to the API server (a [`spur_operator::net::Listener`] and its
//! [`Dialer`]). The server serves any listener of the seam: tokio TCP on a laptop, the
//! simulation's listener, these pipes in tests.

use std::{io, net::SocketAddr};

use futures::future::BoxFuture;
use spur_operator::net::{Dialer, Listener};
use tokio::{io::DuplexStream, sync::mpsc};

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

impl Listener for MemoryListener {
    type Conn = DuplexStream;

    /// The peer is `0.0.0.0:0`: a pipe has no address, and no simulated host has that one.
    fn accept(&mut self) -> BoxFuture<'_, io::Result<(DuplexStream, SocketAddr)>> {
        Box::pin(async move {
            let pipe = self.0.recv().await.ok_or_else(|| {
                io::Error::new(io::ErrorKind::NotConnected, "every memory dialer is gone")
            })?;
            Ok((pipe, SocketAddr::from(([0, 0, 0, 0], 0))))
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
