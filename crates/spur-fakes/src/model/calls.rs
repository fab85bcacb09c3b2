//! Who called the controller: every write call (registration, heartbeat, node update,
//! submission, cancellation, job report) a replica received straight from a client, with
//! the host its connection came from and the simulated time. Ground truth for the acting
//! check on the controller side: a standby operator replica only Pings.

use std::net::SocketAddr;
use std::time::Duration;

use spur_proto::FORWARDED_KEY;

use super::Cluster;

pub use spur_judge::records::CallRecord;

/// Calls not yet taken, in the order received.
pub type CallLog = spur_judge::record_log::RecordLog<CallRecord>;

/// The write methods of `slurm.SlurmController`: what only an acting operator calls, as
/// the operator's fence knows them.
pub use spur_operator::LEADER_WRITES as WRITE_METHODS;

/// A tower layer for a replica's gRPC server that records each write call a client makes
/// (not the forwards of other replicas) before the replica sees it: who called is read at
/// the transport, from the connection's peer, never from the request's content.
pub fn recorder<B>(
    cluster: Cluster,
    replica: String,
) -> tower::util::MapRequestLayer<impl Fn(http::Request<B>) -> http::Request<B> + Clone> {
    tower::util::MapRequestLayer::new(move |request: http::Request<B>| {
        if let Some(call) = write_call(&request, &replica) {
            cluster.record_call(call);
        }
        request
    })
}

fn write_call<B>(request: &http::Request<B>, replica: &str) -> Option<CallRecord> {
    if request.headers().contains_key(FORWARDED_KEY) {
        return None;
    }
    let name = request.uri().path().rsplit('/').next()?;
    let method = WRITE_METHODS.into_iter().find(|m| *m == name)?;
    // tonic hands the peer address of an accepted connection in as connection info
    // (`spur_operator::net::Accepted`); outside a simulation it names no host.
    let peer = request.extensions().get::<SocketAddr>().copied()?;
    let caller = crate::clock::peer_host(peer)?;
    Some(CallRecord {
        at: crate::clock::sim_elapsed(),
        caller,
        replica: replica.to_owned(),
        method,
    })
}

/// The calls the replicas answered to clients in `from..to`, by replica and method, from
/// their trace lines (`GetJobs -> ok …`): ground truth for what the operator cost the
/// controller, probes and Pings included, where the operator's own counter sees only the
/// calls it counts. A follower's forward (`GetJobs (forwarded) -> …`) is not a second
/// call, nor is a commit (`commit #4 t2: … -> JobId(2)`).
pub fn answered(
    events: &[spur_judge::trace::TraceEvent],
    from: Duration,
    to: Duration,
) -> std::collections::BTreeMap<(String, String), usize> {
    let mut calls = std::collections::BTreeMap::new();
    for event in events {
        if !event.host.starts_with("spurctld") || !(from..to).contains(&event.at) {
            continue;
        }
        let Some((call, _)) = event.event.split_once(" -> ") else {
            continue;
        };
        if call.contains(' ') {
            continue;
        }
        *calls
            .entry((event.host.clone(), call.to_owned()))
            .or_default() += 1;
    }
    calls
}

#[cfg(test)]
mod tests {
    use super::*;
    use spur_judge::trace::TraceEvent;

    #[test]
    fn answered_counts_clients_calls_not_forwards_or_commits() {
        let event = |at: u64, host: &str, text: &str| TraceEvent {
            at: Duration::from_secs(at),
            host: host.to_owned(),
            event: text.to_owned(),
        };
        let events = [
            event(
                1,
                "spurctld-0",
                "GetJobs -> ok GetJobsResponse { jobs: [] }",
            ),
            event(
                2,
                "spurctld-0",
                "GetJobs (forwarded) -> ok GetJobsResponse { jobs: [] }",
            ),
            event(
                3,
                "spurctld-1",
                "GetJobs -> ok GetJobsResponse { jobs: [] }",
            ),
            event(4, "spurctld-1", "Ping -> ok"),
            event(5, "spurctld-0", "commit #4 t2: submit job x -> JobId(2)"),
            event(6, "operator", "service spurctld: no endpoint, SYN dropped"),
            event(9, "spurctld-1", "Ping -> ok"),
        ];
        let counted = answered(&events, Duration::ZERO, Duration::from_secs(9));
        let expected: std::collections::BTreeMap<(String, String), usize> = [
            (("spurctld-0".to_owned(), "GetJobs".to_owned()), 1),
            (("spurctld-1".to_owned(), "GetJobs".to_owned()), 1),
            (("spurctld-1".to_owned(), "Ping".to_owned()), 1),
        ]
        .into();
        assert_eq!(counted, expected);
    }
}
