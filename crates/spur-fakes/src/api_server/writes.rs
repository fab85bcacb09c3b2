//! Who wrote what: every write the API server applied over HTTP, with the host the
//! connection came from and the simulated time it was applied. Ground truth for the
//! simulation's checks (which operator replica acted, and when), read from the server's
//! side of the connection, never from what a client says about itself.
//!
//! Writes made directly on an [`super::ApiServer`] (the harness acting as kubelet or
//! user) come from no host and are not recorded; the change feed
//! ([`super::ApiServer::observe`]) has them.

pub use spur_judge::records::{WriteMethod, WriteRecord, lease_holder};

/// Applied writes not yet taken, in the order applied.
pub type WriteLog = spur_judge::record_log::RecordLog<WriteRecord>;
