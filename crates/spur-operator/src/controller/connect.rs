//! Opening a bounded channel to spurctld. Nothing else in the project opens one.

use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use super::address::{ControllerAddr, Scheme};
use super::error::ConnectError;
use super::{ChannelConfig, TlsConfig};
use crate::net::{Connector, Dialer};

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
    let dial = Connector::new(dialer)
        .to(&addr.host, addr.port)
        .dial_timeout(config.connect_timeout)
        .hedge(config.hedge());
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
