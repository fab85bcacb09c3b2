//! What a failed controller call means for the channel it went over.

use std::time::Duration;

use tonic::Code;

/// Whether a failed call says something about the connection or is the controller's
/// answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureKind {
    /// The connection may be dead or lead to the wrong place (a killed pod, a follower
    /// mid-election): drop the channel and connect afresh on the next call.
    Transport,
    /// The controller answered; the channel is healthy and is kept.
    Answer,
}

/// Classifies a gRPC status code. Exhaustive on purpose: a new code must be placed
/// consciously.
pub fn classify(code: Code) -> FailureKind {
    match code {
        Code::Unavailable | Code::Unknown | Code::Cancelled | Code::DeadlineExceeded => {
            FailureKind::Transport
        }
        Code::Ok
        | Code::InvalidArgument
        | Code::NotFound
        | Code::AlreadyExists
        | Code::PermissionDenied
        | Code::ResourceExhausted
        | Code::FailedPrecondition
        | Code::Aborted
        | Code::OutOfRange
        | Code::Unimplemented
        | Code::Internal
        | Code::DataLoss
        | Code::Unauthenticated => FailureKind::Answer,
    }
}

/// Why a connection could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// Nothing answered within the connect bound (a dropped SYN, a stalled handshake).
    #[error("connect timed out after {}", humantime::format_duration(*.0))]
    Timeout(Duration),
    /// The peer refused the connection (nothing listens there).
    #[error("connection refused: {0}")]
    Refused(String),
    /// The TLS handshake or the TLS material failed.
    #[error("TLS: {0}")]
    Tls(String),
    /// Anything else: DNS, unreachable network, a reset during the handshake.
    #[error("{0}")]
    Other(String),
}

impl ConnectError {
    /// Sorts a transport error by walking its causes.
    pub(crate) fn from_transport(err: &(dyn std::error::Error + 'static)) -> ConnectError {
        let text = error_chain(err);
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(err);
        while let Some(e) = cause {
            if let Some(io) = e.downcast_ref::<std::io::Error>() {
                match io.kind() {
                    std::io::ErrorKind::ConnectionRefused => return ConnectError::Refused(text),
                    std::io::ErrorKind::TimedOut => {
                        if let Some(bound) = io
                            .get_ref()
                            .and_then(|inner| inner.downcast_ref::<DialTimedOut>())
                        {
                            return ConnectError::Timeout(bound.0);
                        }
                    }
                    _ => {}
                }
            }
            cause = e.source();
        }
        let lower = text.to_ascii_lowercase();
        if lower.contains("tls") || lower.contains("certificate") || lower.contains("handshake") {
            return ConnectError::Tls(text);
        }
        ConnectError::Other(text)
    }
}

/// The dialer's own bound fired; carried inside an `io::Error` through tonic's connector.
#[derive(Debug, thiserror::Error)]
#[error("connect timed out after {}", humantime::format_duration(*.0))]
pub(crate) struct DialTimedOut(pub Duration);

/// `outer: middle: inner`, skipping causes whose text the outer one already shows.
pub(crate) fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    append_causes(err.to_string(), err.source())
}

/// A status's message followed by its causes: tonic's own message for a dead connection
/// is only "http2 error"; the cause says "keep-alive timed out".
pub(crate) fn status_text(status: &tonic::Status) -> String {
    use std::error::Error as _;
    append_causes(status.message().to_owned(), status.source())
}

fn append_causes(mut text: String, first: Option<&(dyn std::error::Error + 'static)>) -> String {
    let mut cause = first;
    while let Some(e) = cause {
        let part = e.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        cause = e.source();
    }
    text
}

/// A controller call that did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    #[error("cannot connect to spurctld at {addr}: {source}")]
    Connect {
        addr: String,
        #[source]
        source: ConnectError,
    },
    #[error("{method}: {code:?}: {message}")]
    Status {
        method: &'static str,
        code: Code,
        message: String,
        /// The leader a follower named in `x-spur-leader`, if any.
        leader_hint: Option<String>,
    },
}

impl ControllerError {
    /// The gRPC code the failure amounts to; a failed connect is UNAVAILABLE, as a gRPC
    /// client reports it.
    pub fn code(&self) -> Code {
        match self {
            ControllerError::Connect { .. } => Code::Unavailable,
            ControllerError::Status { code, .. } => *code,
        }
    }

    pub fn kind(&self) -> FailureKind {
        classify(self.code())
    }

    pub fn is_transport(&self) -> bool {
        self.kind() == FailureKind::Transport
    }

    /// UNAVAILABLE on an open channel: what a replica answers while it reaches no leader
    /// (mid-election: `no leader elected yet`, `not the Raft leader`, or its own failed
    /// forward), or a connection that died under the call. Either way the next attempt
    /// may well succeed within a second; a failed connect is not this (it took its own
    /// bound already).
    pub fn is_unavailable_status(&self) -> bool {
        matches!(
            self,
            ControllerError::Status {
                code: Code::Unavailable,
                ..
            }
        )
    }

    pub fn leader_hint(&self) -> Option<&str> {
        match self {
            ControllerError::Status { leader_hint, .. } => leader_hint.as_deref(),
            ControllerError::Connect { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_is_classified_as_the_seed_learned() {
        use FailureKind::*;
        let table = [
            (Code::Ok, Answer),
            (Code::Cancelled, Transport),
            (Code::Unknown, Transport),
            (Code::InvalidArgument, Answer),
            (Code::DeadlineExceeded, Transport),
            (Code::NotFound, Answer),
            (Code::AlreadyExists, Answer),
            (Code::PermissionDenied, Answer),
            (Code::ResourceExhausted, Answer),
            (Code::FailedPrecondition, Answer),
            (Code::Aborted, Answer),
            (Code::OutOfRange, Answer),
            (Code::Unimplemented, Answer),
            (Code::Internal, Answer),
            (Code::Unavailable, Transport),
            (Code::DataLoss, Answer),
            (Code::Unauthenticated, Answer),
        ];
        // All 17 codes, by their wire numbers, so a missing row cannot hide.
        for n in 0..=16 {
            assert!(
                table.iter().any(|(c, _)| *c as i32 == n),
                "code {n} untested"
            );
        }
        for (code, expected) in table {
            assert_eq!(classify(code), expected, "{code:?}");
        }
    }

    #[test]
    fn connect_errors_are_sorted_by_their_cause() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert!(matches!(
            ConnectError::from_transport(&refused),
            ConnectError::Refused(_)
        ));
        let timed_out = std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            DialTimedOut(Duration::from_secs(10)),
        );
        let sorted = ConnectError::from_transport(&timed_out);
        assert!(matches!(sorted, ConnectError::Timeout(d) if d == Duration::from_secs(10)));
        assert_eq!(sorted.to_string(), "connect timed out after 10s");
        let other = std::io::Error::other("no route to host");
        assert!(matches!(
            ConnectError::from_transport(&other),
            ConnectError::Other(_)
        ));
        let tls = std::io::Error::other("invalid peer certificate: UnknownIssuer");
        assert!(matches!(
            ConnectError::from_transport(&tls),
            ConnectError::Tls(_)
        ));
    }

    #[test]
    fn a_failed_connect_counts_as_unavailable() {
        let err = ControllerError::Connect {
            addr: "http://spurctld:6817".into(),
            source: ConnectError::Timeout(Duration::from_secs(2)),
        };
        assert_eq!(err.code(), Code::Unavailable);
        assert!(err.is_transport());
        assert_eq!(
            err.to_string(),
            "cannot connect to spurctld at http://spurctld:6817: connect timed out after 2s"
        );
    }
}
