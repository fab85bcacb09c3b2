//! Who called the controller: every write call (registration, heartbeat, node update,
//! submission, cancellation, job report) a replica received straight from a client, with
//! the host its connection came from and the simulated time. Ground truth for the acting
//! check on the controller side: a standby operator replica only Pings.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::Duration;

use tonic::Request;

/// Records kept until a reader takes them: as [`crate::kube_api::writes::WRITE_LOG_LIMIT`],
/// far above the few calls a sample interval sees, and the loss is counted.
pub const CALL_LOG_LIMIT: usize = 65_536;

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

/// Calls not yet taken, oldest first.
#[derive(Debug, Default)]
pub struct CallLog {
    records: VecDeque<CallRecord>,
    dropped: u64,
}

impl CallLog {
    pub fn push(&mut self, record: CallRecord) {
        if self.records.len() >= CALL_LOG_LIMIT {
            self.dropped += 1;
            return;
        }
        self.records.push_back(record);
    }

    pub fn take(&mut self) -> Vec<CallRecord> {
        self.records.drain(..).collect()
    }

    pub fn dropped(&self) -> u64 {
        self.dropped
    }
}

/// The host a request's connection came from, in a simulation (tonic hands the peer
/// address of a [`crate::net::SimStream`] in as connection info); `None` over real TCP.
pub fn caller_host<T>(request: &Request<T>) -> Option<String> {
    turmoil::sim_elapsed()?;
    let peer = request
        .extensions()
        .get::<Option<SocketAddr>>()
        .copied()??;
    turmoil::reverse_lookup(peer.ip())
}
