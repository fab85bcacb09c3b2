//! `spur-operator check-controller`: one Ping over the operator's own bounded channel.

use std::time::Duration;

use crate::controller::ControllerSettings;
use crate::controller::{ControllerClient, ControllerError};
use crate::net::Dialer;

/// What a live controller said.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PingReport {
    pub hostname: String,
    pub version: String,
    /// Time for the Ping alone, after the connection was open.
    pub round_trip: Duration,
    /// Time to open the connection (dial, TLS, HTTP/2).
    pub connect: Duration,
}

/// Connects with the same bounds the operator uses and calls Ping. Fails within those
/// bounds, naming the cause (connect timeout, refused, TLS, deadline, or the answer).
pub async fn check_controller<D: Dialer>(
    settings: &ControllerSettings,
    dialer: D,
) -> Result<PingReport, ControllerError> {
    let client = ControllerClient::new(
        settings.addr.clone(),
        settings.channel.clone(),
        settings.token.as_deref(),
        dialer,
    )?;
    // The first Ping opens the connection; the second measures the round trip alone.
    let started = tokio::time::Instant::now();
    client.ping().await?;
    let connect = started.elapsed();
    let started = tokio::time::Instant::now();
    let pong = client.ping().await?;
    let round_trip = started.elapsed();
    Ok(PingReport {
        hostname: pong.hostname,
        version: pong.version,
        round_trip,
        connect: connect.saturating_sub(round_trip),
    })
}

/// One line naming why the check failed, for the person running it.
pub fn describe_failure(error: &ControllerError, settings: &ControllerSettings) -> String {
    use crate::controller::ConnectError;
    use tonic::Code;
    let bound = |d: Option<Duration>| {
        d.map_or("off".to_owned(), |d| {
            humantime::format_duration(d).to_string()
        })
    };
    let cause = match error {
        ControllerError::Connect { source, .. } => match source {
            ConnectError::Timeout(_) => "connect timeout",
            ConnectError::Refused(_) => "connection refused",
            ConnectError::Tls(_) => "TLS",
            ConnectError::Other(_) => "connect failed",
        },
        ControllerError::Status { code, message, .. } => match code {
            Code::Cancelled if message.contains("Timeout expired") => "deadline",
            Code::Unavailable if message.contains("keep-alive") => "keepalive",
            Code::Unavailable | Code::Unknown => "connection lost",
            _ => "controller answered",
        },
        // check-controller's client has no fence; kept for completeness.
        ControllerError::NotActing { .. } => "not sent",
    };
    let detail = match cause {
        "deadline" => format!(
            "no answer within the request bound ({})",
            bound(settings.channel.request_timeout)
        ),
        "keepalive" => "keepalive pings went unanswered; the peer is gone".to_owned(),
        _ => error.to_string(),
    };
    format!("{cause}: {detail}")
}

impl std::fmt::Display for PingReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "hostname={} version={} rtt={:.1?} connect={:.1?}",
            self.hostname, self.version, self.round_trip, self.connect
        )
    }
}
