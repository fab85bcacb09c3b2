//! spurctld's gRPC protocol as Rust types, clients and servers.
//!
//! Generated at build time from `proto/slurm.proto` (see `build.rs`). Package `slurm`, so
//! the paths are `/slurm.SlurmController/<Method>` and `/slurm.SlurmAgent/<Method>`.

#[allow(clippy::all, clippy::pedantic, missing_docs)]
mod generated {
    tonic::include_proto!("slurm");
}

pub use generated::*;

pub use slurm_agent_client::SlurmAgentClient;
pub use slurm_agent_server::{SlurmAgent, SlurmAgentServer};
pub use slurm_controller_client::SlurmControllerClient;
pub use slurm_controller_server::{SlurmController, SlurmControllerServer};

/// The well-known types the protocol uses.
pub use prost_types::{Duration, Timestamp};

/// Default port of spurctld's client service.
pub const CONTROLLER_PORT: u16 = 6817;
/// Default port of the agent service (the operator's virtual agent).
pub const AGENT_PORT: u16 = 6818;
/// Metadata key a follower sets to name the leader's `host:port`.
pub const LEADER_HINT_KEY: &str = "x-spur-leader";
/// Metadata key a follower sets on a write it forwards to the leader.
pub const FORWARDED_KEY: &str = "x-spur-forwarded";
