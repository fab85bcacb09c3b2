//! turmoil's TCP as the operator's network seam takes it ([`spur_operator::net`]): a
//! listener that tonic servers (through [`spur_operator::net::incoming`]), axum servers
//! and the operator's own servers accept connections from. Dialed streams are turmoil's
//! own `TcpStream`s.

use std::io;
use std::net::SocketAddr;

use futures::Stream;
use futures::future::BoxFuture;
use spur_operator::net::{Accepted, Dialer, Listener};
use turmoil::net::TcpStream;

/// A turmoil TCP listener for tonic (`serve_with_incoming(listener.incoming())`), axum
/// (`axum::serve(listener, router)`) and anything that takes a [`Listener`].
pub struct SimListener {
    inner: turmoil::net::TcpListener,
}

impl SimListener {
    /// Binds `0.0.0.0:port` on the current simulated host.
    pub async fn bind(port: u16) -> io::Result<Self> {
        Self::bind_addr(SocketAddr::from((std::net::Ipv4Addr::UNSPECIFIED, port))).await
    }

    /// Binds `addr` on the current simulated host.
    pub async fn bind_addr(addr: SocketAddr) -> io::Result<Self> {
        let inner = turmoil::net::TcpListener::bind(addr).await?;
        Ok(Self { inner })
    }

    /// The accepted connections, as a stream tonic serves (each with its peer's address
    /// as connection info).
    pub fn incoming(self) -> impl Stream<Item = io::Result<Accepted<TcpStream>>> + Send + 'static {
        spur_operator::net::incoming(self)
    }
}

impl Listener for SimListener {
    type Conn = TcpStream;

    fn accept(&mut self) -> BoxFuture<'_, io::Result<(TcpStream, SocketAddr)>> {
        Box::pin(self.inner.accept())
    }
}

impl axum::serve::Listener for SimListener {
    type Io = TcpStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            // turmoil's accept fails only when the host is torn down; retry like axum's
            // own TCP listener does, after a pause so a failure cannot spin.
            match self.inner.accept().await {
                Ok(accepted) => return accepted,
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(10)).await,
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

/// The simulated host a connection came from, by its peer address; `None` outside a
/// simulation (a real TCP peer has no turmoil name).
pub fn peer_host(peer: SocketAddr) -> Option<String> {
    turmoil::sim_elapsed()?;
    turmoil::reverse_lookup(peer.ip())
}

/// Dials over turmoil's simulated TCP from the calling host, bare: none of the world's
/// network model (the kernel's SYN retries, partitions, Services) that
/// [`super::TurmoilDialer`] adds. For the API server's own tests.
#[derive(Clone, Copy, Debug, Default)]
pub struct BareTurmoilDialer;

impl Dialer for BareTurmoilDialer {
    type Stream = turmoil::net::TcpStream;

    fn dial(&self, host: &str, port: u16) -> BoxFuture<'static, io::Result<Self::Stream>> {
        let host = host.to_owned();
        Box::pin(async move { turmoil::net::TcpStream::connect((host.as_str(), port)).await })
    }
}
