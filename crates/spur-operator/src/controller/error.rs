//! What a failed controller call means for the channel it went over.

use std::time::Duration;

use tonic::Code;

use crate::net::DialTimedOut;

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

/// An answer that reports a passing failure of the controller itself, not a verdict on
/// the request: `INTERNAL "raft propose failed: …"` comes from a leader cut off from its
/// majority once it learns of a newer term (fidelity row 8), and the next leader takes the
/// same write. Retried like UNAVAILABLE.
pub fn is_transient_answer(code: Code, message: &str) -> bool {
    matches!(code, Code::Internal | Code::Unavailable)
        && message.trim_start().starts_with("raft propose failed")
}

/// What follows `job <job_id>` at the start of `message`, if it starts so.
fn job_message(message: &str, job_id: u32) -> Option<&str> {
    let rest = message.trim().strip_prefix("job ")?;
    let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
    let (id, rest) = rest.split_at(digits);
    (id.parse::<u32>().ok()? == job_id).then_some(rest)
}

/// Why a connection could not be opened.
#[derive(Clone, Debug, thiserror::Error)]
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
            if let Some(bound) = e.downcast_ref::<DialTimedOut>() {
                return ConnectError::Timeout(bound.0);
            }
            if let Some(io) = e.downcast_ref::<std::io::Error>()
                && io.kind() == std::io::ErrorKind::ConnectionRefused
            {
                return ConnectError::Refused(text);
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

/// `outer: middle: inner`, skipping causes whose text the outer one already shows.
pub(crate) fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    append_causes(err.to_string(), err.source())
}

/// A status's message followed by its causes: tonic's own message for a dead connection
/// is only "http2 error"; the cause says "keep-alive timed out".
pub fn status_text(status: &tonic::Status) -> String {
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
#[derive(Clone, Debug, thiserror::Error)]
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
    /// Not sent: the fence refused a leader-only call ([`crate::fence`]).
    #[error("{method}: not sent: {refused}")]
    NotActing {
        method: &'static str,
        refused: crate::fence::Refused,
    },
}

impl ControllerError {
    /// The gRPC code the failure amounts to; a failed connect is UNAVAILABLE, as a gRPC
    /// client reports it; a call the fence kept back is ABORTED (retried as an answer, by
    /// whichever replica acts next).
    pub fn code(&self) -> Code {
        match self {
            ControllerError::Connect { .. } => Code::Unavailable,
            ControllerError::Status { code, .. } => *code,
            ControllerError::NotActing { .. } => Code::Aborted,
        }
    }

    /// The status message (empty for a failed connect or a call not sent).
    pub fn message(&self) -> &str {
        match self {
            ControllerError::Status { message, .. } => message,
            ControllerError::Connect { .. } | ControllerError::NotActing { .. } => "",
        }
    }

    /// How the failed call is retried: a transport failure, or an answer that says the
    /// failure passes ([`is_transient_answer`]), on the short transient cadence; any
    /// other answer with a doubling backoff. The channel rule is [`classify`] of the code
    /// alone (the client applies it), so a transient answer keeps its channel: the
    /// controller did answer.
    pub fn kind(&self) -> FailureKind {
        if is_transient_answer(self.code(), self.message()) {
            return FailureKind::Transport;
        }
        classify(self.code())
    }

    pub fn is_transport(&self) -> bool {
        self.kind() == FailureKind::Transport
    }

    /// `job <job_id> not found`, as CancelJob (INTERNAL), GetJob and ReportJobStatus
    /// (NOT_FOUND) say it.
    pub fn says_job_not_found(&self, job_id: u32) -> bool {
        job_message(self.message(), job_id).is_some_and(|rest| rest == " not found")
    }

    /// `job <job_id> is already <State>`: CancelJob of a job that has ended (INTERNAL;
    /// FAILED_PRECONDITION from other methods).
    pub fn says_job_already_ended(&self, job_id: u32) -> bool {
        job_message(self.message(), job_id).is_some_and(|rest| {
            rest.strip_prefix(" is already ")
                .is_some_and(|state| !state.trim().is_empty())
        })
    }

    /// `node <name> not found`: UpdateNode (INTERNAL) for a node the controller does not
    /// know (Heartbeat's NOT_FOUND adds a question after it).
    pub fn says_node_not_found(&self, name: &str) -> bool {
        self.message()
            .trim()
            .strip_prefix("node ")
            .and_then(|rest| rest.strip_prefix(name))
            .is_some_and(|rest| rest == " not found" || rest.starts_with(" not found "))
    }

    /// `node <name> is not allocated to job <job_id>`: ReportJobStatus for a node outside
    /// the job's allocation (INVALID_ARGUMENT), which is also the answer while the job is
    /// still being dispatched.
    pub fn says_node_not_allocated(&self, name: &str, job_id: u32) -> bool {
        self.code() == Code::InvalidArgument
            && self.message().trim() == format!("node {name} is not allocated to job {job_id}")
    }

    pub fn leader_hint(&self) -> Option<&str> {
        match self {
            ControllerError::Status { leader_hint, .. } => leader_hint.as_deref(),
            ControllerError::Connect { .. } | ControllerError::NotActing { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::DialError;

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

    fn status(code: Code, message: &str) -> ControllerError {
        ControllerError::Status {
            method: "Test",
            code,
            message: message.into(),
            leader_hint: None,
        }
    }

    #[test]
    fn raft_propose_failures_are_retried_as_transient_on_a_kept_channel() {
        use FailureKind::*;
        let table = [
            (
                Code::Internal,
                "raft propose failed: has to forward request to: Some(2)",
                Transport,
            ),
            (Code::Internal, "raft propose failed", Transport),
            (Code::Unavailable, "raft propose failed: timeout", Transport),
            (Code::Internal, "job 4 not found", Answer),
            (Code::Internal, "state machine: raft propose failed", Answer),
            (Code::InvalidArgument, "raft propose failed", Answer),
            (Code::NotFound, "raft propose failed", Answer),
        ];
        for (code, message, kind) in table {
            assert_eq!(status(code, message).kind(), kind, "{code:?} {message}");
        }
        // The channel rule looks at the code alone: INTERNAL keeps the channel.
        assert_eq!(classify(Code::Internal), Answer);
    }

    #[test]
    fn job_and_node_messages_are_read_exactly() {
        let e = |m: &str| status(Code::Internal, m);
        assert!(e("job 12 not found").says_job_not_found(12));
        assert!(e(" job 12 not found ").says_job_not_found(12));
        assert!(!e("job 12 not found").says_job_not_found(1));
        assert!(!e("job 123 not found").says_job_not_found(12));
        assert!(!e("job 12 not found in partition").says_job_not_found(12));
        assert!(!e("user 12 not found").says_job_not_found(12));
        assert!(!e("job  not found").says_job_not_found(0));
        assert!(!e("job 99999999999 not found").says_job_not_found(12));

        for state in ["Completed", "NodeFail", "Cancelled", "OutOfMemory"] {
            assert!(e(&format!("job 5 is already {state}")).says_job_already_ended(5));
        }
        assert!(!e("job 5 is already ").says_job_already_ended(5));
        assert!(!e("job 6 is already Completed").says_job_already_ended(5));
        assert!(!e("raft propose failed: job 5 is already Completed").says_job_already_ended(5));

        assert!(e("node gpu-1 not found").says_node_not_found("gpu-1"));
        assert!(e("node gpu-1 not found — is the node registered?").says_node_not_found("gpu-1"));
        assert!(!e("node gpu-10 not found").says_node_not_found("gpu-1"));
        assert!(!e("node gpu-1 is down").says_node_not_found("gpu-1"));
        assert!(!e("job 1 not found").says_node_not_found("gpu-1"));

        let refused = status(
            Code::InvalidArgument,
            "node gpu-1 is not allocated to job 7",
        );
        assert!(refused.says_node_not_allocated("gpu-1", 7));
        assert!(!refused.says_node_not_allocated("gpu-1", 8));
        assert!(!refused.says_node_not_allocated("gpu-2", 7));
        assert!(
            !status(Code::Internal, "node gpu-1 is not allocated to job 7")
                .says_node_not_allocated("gpu-1", 7)
        );
    }

    #[test]
    fn connect_errors_are_sorted_by_their_cause() {
        // As the Connector gives them, under tonic's own transport error.
        let refused =
            DialError::Failed(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert!(matches!(
            ConnectError::from_transport(&refused),
            ConnectError::Refused(_)
        ));
        let timed_out = DialError::TimedOut(DialTimedOut(Duration::from_secs(10)));
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
