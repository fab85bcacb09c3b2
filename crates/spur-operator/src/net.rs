//! The network seam: how the operator opens byte streams.
//!
//! Production hands in [`TcpNetwork`]; the simulation hands in a dialer over turmoil's
//! simulated TCP (and a kube-proxy-like Service). Nothing in the operator opens a socket
//! on its own, so the same control loops run in both worlds. [`Connector`] is the one
//! adapter from a [`Dialer`] to the clients (tonic's and hyper's), and [`incoming`] the one
//! from a [`Listener`] to tonic's server, for the operator, the simulation and the tests.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use http::Uri;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::TokioIo;
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
///
/// A name that resolves to several addresses (a headless Service: one per ready pod) is
/// dialed in turn (see [`dial_in_turn`]): tokio's own `connect` tries them in the
/// resolver's order, so behind a connect bound every dial would wait on the same first
/// address, a killed pod whose packets vanish, for as long as DNS still lists it.
#[derive(Clone, Copy, Debug, Default)]
pub struct TcpNetwork;

/// Where TCP dials start among a name's addresses. One for the process: any two dials in
/// a row start at different addresses, which is all the rotation needs.
static TCP_TURNS: Turns = Turns::new();

impl Dialer for TcpNetwork {
    type Stream = tokio::net::TcpStream;

    fn dial(&self, host: &str, port: u16) -> BoxFuture<'static, io::Result<Self::Stream>> {
        let host = host.to_owned();
        Box::pin(async move {
            let addresses: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), port))
                .await
                .map_err(|e| io::Error::new(e.kind(), format!("resolve {host}: {e}")))?
                .collect();
            dial_in_turn(&host, &addresses, TCP_TURNS.next(), |&addr| async move {
                let stream = tokio::net::TcpStream::connect(addr).await?;
                stream.set_nodelay(true)?;
                Ok(stream)
            })
            .await
        })
    }
}

/// Hands each dial of a name with several addresses the index it starts at: one further
/// than the dial before.
#[derive(Debug, Default)]
pub struct Turns(AtomicUsize);

impl Turns {
    pub const fn new() -> Self {
        Self(AtomicUsize::new(0))
    }

    /// The start of the next dial.
    pub fn next(&self) -> usize {
        self.0.fetch_add(1, Ordering::Relaxed)
    }
}

/// Connects to `host`'s `addresses` with `connect`, beginning at index `start` (modulo
/// their number) and moving on through the rest, wrapping around, only when an address
/// fails at once (refused, unreachable): the first stream wins. Starting each dial one
/// address further on (see [`Turns`]) is what lets the hedged dials of a [`Connector`]
/// reach the other pods of a headless Service while one of them swallows SYNs. No address
/// at all (a headless Service with no ready pod) fails at once, naming `host`.
pub async fn dial_in_turn<A, S, F, Fut>(
    host: &str,
    addresses: &[A],
    start: usize,
    mut connect: F,
) -> io::Result<S>
where
    F: FnMut(&A) -> Fut,
    Fut: Future<Output = io::Result<S>>,
{
    let mut last = None;
    for addr in in_turn(addresses, start) {
        match connect(addr).await {
            Ok(stream) => return Ok(stream),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("{host} resolves to no address"),
        )
    }))
}

/// Every item once, beginning at `start` (modulo the length) and wrapping around.
fn in_turn<T>(items: &[T], start: usize) -> impl Iterator<Item = &T> + '_ {
    let from = start % items.len().max(1);
    items[from..].iter().chain(&items[..from])
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
pub trait Sockets: Dialer + Binder {}
impl<N: Dialer + Binder> Sockets for N {}

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
    /// `conn`, accepted from `peer`.
    pub fn new(conn: C, peer: SocketAddr) -> Self {
        Accepted { conn, peer }
    }

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

/// A [`Dialer`] as the `tower::Service<Uri>` that tonic (`Endpoint::connect_with_connector`)
/// and hyper-util's client open their connections through.
#[derive(Clone, Debug)]
pub struct Connector<D> {
    dialer: D,
    /// Dial this instead of the URI's host and port.
    to: Option<(String, u16)>,
    dial_timeout: Option<Duration>,
    hedge: Option<Duration>,
}

impl<D: Dialer> Connector<D> {
    /// Dials each URI's host and port (80 or 443, by its scheme, when it names none), with
    /// no bound of its own.
    pub fn new(dialer: D) -> Self {
        Connector {
            dialer,
            to: None,
            dial_timeout: None,
            hedge: None,
        }
    }

    /// Dials `host:port` whatever the URI: a client of one address parsed it already, and
    /// dialing the parsed address avoids re-parsing brackets and default ports.
    pub fn to(mut self, host: &str, port: u16) -> Self {
        self.to = Some((host.to_owned(), port));
        self
    }

    /// Bounds each dial. A client that bounds its whole connect needs this too: tonic's
    /// channel reconnects on its own after a connection dies, and that dial must be
    /// bounded as well (a dropped SYN hangs for the kernel's retries, about 127 s).
    pub fn dial_timeout(mut self, bound: Option<Duration>) -> Self {
        self.dial_timeout = bound;
        self
    }

    /// Dials again every `every` while no dial has completed (see [`hedged_dial`]).
    pub fn hedge(mut self, every: Option<Duration>) -> Self {
        self.hedge = every;
        self
    }
}

/// Why a [`Connector`] opened no connection. Displays as hyper-util's own connector does
/// (`tcp connect error`), so a client over this seam reports what it would over
/// hyper-util's TCP (tonic: `UNAVAILABLE "tcp connect error"`); the cause is the source.
#[derive(Debug, thiserror::Error)]
pub enum DialError {
    /// The URI names no host.
    #[error("invalid URI {0}: no host")]
    NoHost(Uri),
    /// The dial failed (refused, unreachable, unknown host).
    #[error("tcp connect error")]
    Failed(#[source] io::Error),
    /// The dial did not complete within [`Connector::dial_timeout`].
    #[error("tcp connect error")]
    TimedOut(#[source] DialTimedOut),
}

/// A dial's own bound fired.
#[derive(Debug, thiserror::Error)]
#[error("connect timed out after {}", humantime::format_duration(*.0))]
pub struct DialTimedOut(pub Duration);

impl<D: Dialer> tower::Service<Uri> for Connector<D> {
    type Response = Dialed<D::Stream>;
    type Error = DialError;
    type Future = BoxFuture<'static, Result<Self::Response, DialError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), DialError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let (host, port) = match &self.to {
            Some((host, port)) => (host.clone(), *port),
            None => {
                let Some(host) = uri.host() else {
                    return Box::pin(async move { Err(DialError::NoHost(uri)) });
                };
                let host = host.trim_start_matches('[').trim_end_matches(']');
                let port = uri.port_u16().unwrap_or(match uri.scheme_str() {
                    Some("https") => 443,
                    _ => 80,
                });
                (host.to_owned(), port)
            }
        };
        let dialing = hedged_dial(self.dialer.clone(), host, port, self.hedge);
        let bound = self.dial_timeout;
        Box::pin(async move {
            let stream = match bound {
                Some(bound) => tokio::time::timeout(bound, dialing)
                    .await
                    .map_err(|_| DialError::TimedOut(DialTimedOut(bound)))?,
                None => dialing.await,
            }
            .map_err(DialError::Failed)?;
            Ok(Dialed(TokioIo::new(stream)))
        })
    }
}

/// Dials `host:port`, and again every `hedge` while no dial has completed; the first
/// stream wins and the others are dropped. A dial whose SYN a Service with no ready
/// endpoint dropped never completes; the next one, made once an endpoint is ready,
/// connects at once. A dial that fails ends the connect when no other is pending (a
/// refusal is an answer, not a lost SYN).
async fn hedged_dial<D: Dialer>(
    dialer: D,
    host: String,
    port: u16,
    hedge: Option<Duration>,
) -> io::Result<D::Stream> {
    use futures::StreamExt as _;
    let Some(every) = hedge else {
        return dialer.dial(&host, port).await;
    };
    let mut dials = futures::stream::FuturesUnordered::new();
    dials.push(dialer.dial(&host, port));
    let mut next = tokio::time::Instant::now() + every;
    loop {
        tokio::select! {
            Some(result) = dials.next() => match result {
                Ok(stream) => return Ok(stream),
                Err(error) if dials.is_empty() => return Err(error),
                Err(_) => {}
            },
            _ = tokio::time::sleep_until(next) => {
                dials.push(dialer.dial(&host, port));
                next += every;
            }
        }
    }
}

/// A dialed stream as hyper's clients take it.
#[derive(Debug)]
pub struct Dialed<S>(TokioIo<S>);

impl<S> Connection for Dialed<S> {
    fn connected(&self) -> Connected {
        Connected::new()
    }
}

impl<S: AsyncRead + Unpin> hyper::rt::Read for Dialed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> hyper::rt::Write for Dialed<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_start_visits_every_address_once_beginning_further_on() {
        let items = [1, 2, 3];
        let turns: Vec<Vec<i32>> = (0..4)
            .map(|s| in_turn(&items, s).copied().collect())
            .collect();
        assert_eq!(
            turns,
            [vec![1, 2, 3], vec![2, 3, 1], vec![3, 1, 2], vec![1, 2, 3]]
        );
        assert_eq!(in_turn::<i32>(&[], 5).count(), 0);
    }

    /// Two listeners on one port at different loopback addresses, as two pods behind a
    /// headless Service; which one accepted tells where a dial went.
    async fn two_pods() -> (Vec<SocketAddr>, Vec<tokio::net::TcpListener>) {
        let first = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = first.local_addr().unwrap().port();
        let second = tokio::net::TcpListener::bind(("127.0.0.3", port))
            .await
            .unwrap();
        let addresses = vec![first.local_addr().unwrap(), second.local_addr().unwrap()];
        (addresses, vec![first, second])
    }

    async fn tcp(addresses: &[SocketAddr], start: usize) -> io::Result<tokio::net::TcpStream> {
        dial_in_turn("pods", addresses, start, |&addr| {
            tokio::net::TcpStream::connect(addr)
        })
        .await
    }

    #[tokio::test]
    async fn consecutive_turns_reach_different_pods() {
        let (addresses, listeners) = two_pods().await;
        let turns = Turns::new();
        for pod in 0..2 {
            let stream = tcp(&addresses, turns.next()).await.unwrap();
            assert_eq!(stream.peer_addr().unwrap(), addresses[pod]);
            let (_, from) = listeners[pod].accept().await.unwrap();
            assert_eq!(from, stream.local_addr().unwrap());
        }
    }

    #[tokio::test]
    async fn a_refused_address_passes_the_dial_to_the_next() {
        let (mut addresses, _listeners) = two_pods().await;
        let port = addresses[0].port();
        // Nothing listens on 127.0.0.2 at that port: refused at once.
        addresses.insert(0, SocketAddr::from(([127, 0, 0, 2], port)));
        let stream = tcp(&addresses, 0).await.unwrap();
        assert_eq!(stream.peer_addr().unwrap(), addresses[1]);
        let refused = tcp(&addresses[..1], 0).await.unwrap_err();
        assert_eq!(refused.kind(), io::ErrorKind::ConnectionRefused);
    }

    #[tokio::test]
    async fn a_name_without_addresses_fails_at_once_naming_it() {
        let error = tcp(&[], 7).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::NotFound);
        assert_eq!(error.to_string(), "pods resolves to no address");
    }
}
