//! What a run records and the judge reads, whichever stage ran it: the writes the API
//! server applied, the write calls the controller received, the SpurJobs as they stand,
//! the network cuts. The stages fill these in; the checks only read them.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

/// The verb of a write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum WriteMethod {
    Create,
    Update,
    Patch,
    Delete,
}

impl WriteMethod {
    pub fn as_str(self) -> &'static str {
        match self {
            WriteMethod::Create => "create",
            WriteMethod::Update => "update",
            WriteMethod::Patch => "patch",
            WriteMethod::Delete => "delete",
        }
    }
}

/// One applied write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriteRecord {
    /// The resourceVersion the write produced: the order writes were applied in.
    pub rv: u64,
    /// Simulated time it was applied (zero where the stage has no simulated clock).
    pub at: Duration,
    /// The host the connection came from (the simulated host of the peer address); `None`
    /// over a transport with no host names (in-memory pipes, a laptop's TCP).
    pub host: Option<Arc<str>>,
    pub method: WriteMethod,
    pub kind: String,
    /// `None` for cluster-scoped objects.
    pub namespace: Option<String>,
    pub name: String,
    /// Whether the write went to the `status` subresource.
    pub status: bool,
    /// For a Lease, the `spec.holderIdentity` the write left (`None`: released or unset).
    pub holder: Option<String>,
}

impl WriteRecord {
    /// `kind namespace/name` (or `kind name`), as a violation names the object.
    pub fn object(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("{} {ns}/{}", self.kind, self.name),
            None => format!("{} {}", self.kind, self.name),
        }
    }
}

/// The holder a Lease object names, if any.
pub fn lease_holder(lease: &Value) -> Option<String> {
    lease["spec"]["holderIdentity"]
        .as_str()
        .filter(|h| !h.is_empty())
        .map(str::to_owned)
}

/// One write call, as the replica that first received it saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallRecord {
    /// Simulated time the replica received it.
    pub at: Duration,
    /// The calling host (the simulated host of the connection's peer).
    pub caller: String,
    /// The replica that received it.
    pub replica: String,
    /// The gRPC method (`SubmitJob`, …).
    pub method: &'static str,
}

/// What the checks need of a SpurJob.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SpurJobView {
    pub uid: String,
    pub spur_job_id: Option<u32>,
    pub state: String,
}

/// A cut between two hosts that held what crossed it (a partition or a freeze; a silent
/// kill's cut drops instead): a message sent across it while it lasted, or on its way when
/// it began, lands when it heals. The checks that judge a message by when it arrived
/// (`checks::acting`) ask whether it came across one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cut {
    /// The two hosts, in order.
    pub hosts: (String, String),
    pub from: Duration,
    /// When it healed, if it has.
    pub healed: Option<Duration>,
    /// By when what it held has landed, once healed.
    pub landed_by: Option<Duration>,
}

impl Cut {
    /// Whether a message from `from` to `to` arriving at `at` may have been held by this
    /// cut: the cut joins the two hosts and had healed just before `at`.
    pub fn may_have_held(&self, from: &str, to: &str, at: Duration) -> bool {
        let joins = self.hosts == ordered_pair(from, to);
        joins
            && self
                .healed
                .zip(self.landed_by)
                .is_some_and(|(healed, by)| healed <= at && at <= by)
    }
}

/// Two hosts in the order a [`Cut`] names them.
pub fn ordered_pair(a: &str, b: &str) -> (String, String) {
    if a <= b {
        (a.to_owned(), b.to_owned())
    } else {
        (b.to_owned(), a.to_owned())
    }
}
