//! Who wrote what: every write the API server applied over HTTP, with the host the
//! connection came from and the simulated time it was applied. Ground truth for the
//! simulation's checks (which operator replica acted, and when), read from the server's
//! side of the connection, never from what a client says about itself.
//!
//! Writes made directly on an [`super::ApiServer`] (the harness acting as kubelet or
//! user) come from no host and are not recorded; the change feed
//! ([`super::ApiServer::observe`]) has them.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

/// Records kept until a reader takes them. A scenario's checks take them every sample
/// (250 ms), when a few dozen at most are waiting; a test that never reads stops
/// recording here instead of growing without bound, and the loss is counted so a check
/// can refuse to judge an incomplete record.
pub const WRITE_LOG_LIMIT: usize = 65_536;

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

/// Applied writes not yet taken, oldest first, bounded by [`WRITE_LOG_LIMIT`].
#[derive(Debug, Default)]
pub struct WriteLog {
    records: VecDeque<WriteRecord>,
    dropped: u64,
}

impl WriteLog {
    pub fn push(&mut self, record: WriteRecord) {
        if self.records.len() >= WRITE_LOG_LIMIT {
            self.dropped += 1;
            return;
        }
        self.records.push_back(record);
    }

    /// Takes every record so far, in the order applied.
    pub fn take(&mut self) -> Vec<WriteRecord> {
        self.records.drain(..).collect()
    }

    /// Records lost because nobody took them in time.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(rv: u64) -> WriteRecord {
        WriteRecord {
            rv,
            at: Duration::ZERO,
            host: None,
            method: WriteMethod::Create,
            kind: "Pod".into(),
            namespace: Some("default".into()),
            name: format!("p{rv}"),
            status: false,
            holder: None,
        }
    }

    #[test]
    fn the_log_is_bounded_and_counts_what_it_lost() {
        let mut log = WriteLog::default();
        for rv in 0..(WRITE_LOG_LIMIT as u64 + 3) {
            log.push(record(rv));
        }
        assert_eq!(log.dropped(), 3);
        let taken = log.take();
        assert_eq!(taken.len(), WRITE_LOG_LIMIT);
        assert!(taken.is_sorted_by_key(|r| r.rv));
        assert!(log.take().is_empty());
        log.push(record(1));
        assert_eq!(log.take().len(), 1);
    }
}
