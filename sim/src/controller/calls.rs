//! Who called the controller: every write call (registration, heartbeat, node update,
//! submission, cancellation, job report) a replica received straight from a client, with
//! the host its connection came from and the simulated time. Ground truth for the acting
//! check on the controller side: a standby operator replica only Pings.

use std::net::SocketAddr;
use std::time::Duration;

use spur_proto::FORWARDED_KEY;

use super::Cluster;

/// One write call, as the replica that first received it saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallRecord {
    /// Simulated time the replica received it.
    pub at: Duration,
    /// The calling host (turmoil's reverse lookup of the connection's peer).
    pub caller: String,
    /// The replica that received it.
    pub replica: String,
    /// The gRPC method (`SubmitJob`, …).
    pub method: &'static str,
}

/// Calls not yet taken, in the order received.
pub type CallLog = crate::record_log::RecordLog<CallRecord>;

/// The write methods of `slurm.SlurmController`: what only an acting operator calls, as
/// the operator's fence knows them.
pub use spur_operator::controller::LEADER_WRITES as WRITE_METHODS;

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
    turmoil::sim_elapsed()?;
    // tonic hands the peer address of a [`crate::net::SimStream`] in as connection info.
    let peer = request
        .extensions()
        .get::<Option<SocketAddr>>()
        .copied()??;
    Some(CallRecord {
        at: crate::determinism::sim_elapsed(),
        caller: turmoil::reverse_lookup(peer.ip())?,
        replica: replica.to_owned(),
        method,
    })
}
