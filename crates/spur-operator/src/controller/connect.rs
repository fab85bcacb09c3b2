//! Opening a bounded channel to spurctld. Nothing else in the project opens one.

use std::io;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use http::Uri;
use hyper_util::rt::TokioIo;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use super::address::{ControllerAddr, Scheme};
use super::error::{ConnectError, DialTimedOut};
use crate::config::{ChannelConfig, TlsConfig};
use crate::net::Dialer;

/// Opens a channel to `addr` over `dialer` with the bounds of `config`:
///
/// - the dial, TLS and HTTP/2 handshakes together are bounded by the connect timeout (a
///   dropped SYN must not hang for the kernel's ~127 s);
/// - HTTP/2 keepalive pings find a connection whose peer vanished;
/// - every request carries the request bound (as a local timer and as `grpc-timeout`).
///
/// The dialer is the network seam: TCP in production, simulated streams in `sim/`.
pub async fn connect<D: Dialer>(
    addr: &ControllerAddr,
    config: &ChannelConfig,
    dialer: D,
) -> Result<Channel, ConnectError> {
    let endpoint = endpoint(addr, config)?;
    let dial = DialService {
        dialer,
        host: addr.host.clone(),
        port: addr.port,
        timeout: config.connect_timeout,
        hedge: config.hedge(),
    };
    let connecting = endpoint.connect_with_connector(dial);
    let result = match config.connect_timeout {
        Some(bound) => tokio::time::timeout(bound, connecting)
            .await
            .map_err(|_| ConnectError::Timeout(bound))?,
        None => connecting.await,
    };
    result.map_err(|e| ConnectError::from_transport(&e))
}

fn endpoint(addr: &ControllerAddr, config: &ChannelConfig) -> Result<Endpoint, ConnectError> {
    let mut endpoint = Endpoint::from_shared(addr.to_string())
        .map_err(|e| ConnectError::Other(format!("{addr} is not a usable URI: {e}")))?;
    if let Some(keepalive) = config.keepalive {
        endpoint = endpoint
            .http2_keep_alive_interval(keepalive.interval)
            .keep_alive_timeout(keepalive.timeout)
            .keep_alive_while_idle(keepalive.while_idle);
    }
    if let Some(bound) = config.request_timeout {
        endpoint = endpoint.timeout(bound);
    }
    if addr.scheme == Scheme::Https {
        let tls = tls_config(addr, config.tls.as_ref());
        endpoint = endpoint
            .tls_config(tls)
            .map_err(|e| ConnectError::Tls(e.to_string()))?;
    }
    Ok(endpoint)
}

fn tls_config(addr: &ControllerAddr, tls: Option<&TlsConfig>) -> ClientTlsConfig {
    let mut config = ClientTlsConfig::new();
    let domain = tls
        .and_then(|t| t.domain.clone())
        .unwrap_or_else(|| addr.host.clone());
    config = config.domain_name(domain);
    match tls.and_then(|t| t.ca_pem.as_ref()) {
        Some(ca) => config = config.ca_certificate(Certificate::from_pem(ca)),
        None => config = config.with_native_roots(),
    }
    if let Some((cert, key)) = tls.and_then(|t| t.identity.as_ref()) {
        config = config.identity(Identity::from_pem(cert, key));
    }
    config
}

/// Adapts a [`Dialer`] to the `Service<Uri>` tonic connects through, bounding each dial.
///
/// The bound is applied here as well as around the whole connect because tonic's channel
/// reconnects on its own after a connection dies: that dial must be bounded too.
#[derive(Clone)]
struct DialService<D> {
    dialer: D,
    host: String,
    port: u16,
    timeout: Option<Duration>,
    hedge: Option<Duration>,
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

impl<D: Dialer> tower::Service<Uri> for DialService<D> {
    type Response = TokioIo<D::Stream>;
    type Error = io::Error;
    type Future = BoxFuture<'static, io::Result<Self::Response>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: Uri) -> Self::Future {
        // The URI is the one built from the same address; dialing the parsed host and port
        // avoids re-parsing brackets and defaults.
        let dialing = hedged_dial(
            self.dialer.clone(),
            self.host.clone(),
            self.port,
            self.hedge,
        );
        let timeout = self.timeout;
        Box::pin(async move {
            let stream = match timeout {
                Some(bound) => tokio::time::timeout(bound, dialing)
                    .await
                    .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, DialTimedOut(bound)))??,
                None => dialing.await?,
            };
            Ok(TokioIo::new(stream))
        })
    }
}
