//! Who wrote what: every write the API server applied over HTTP, with the host the
//! connection came from and the simulated time it was applied. Ground truth for the
//! simulation's checks (which operator replica acted, and when), read from the server's
//! side of the connection, never from what a client says about itself.
//!
//! Writes made directly on an [`super::ApiServer`] (the harness acting as kubelet or
//! user) come from no host and are not recorded; the change feed
//! ([`super::ApiServer::observe`]) has them.

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
    /// Simulated time it was applied (turmoil's clock on the API server's host; zero
    /// outside a simulation).
    pub at: Duration,
    /// The host the connection came from (turmoil's reverse lookup of the peer address);
    /// `None` over a transport with no host names (in-memory pipes, a laptop's TCP).
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

/// Applied writes not yet taken, in the order applied.
pub type WriteLog = crate::record_log::RecordLog<WriteRecord>;
