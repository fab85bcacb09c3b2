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
/// spurd's OOM sentinel: the bit it ORs into a completion report's `signal` when the kernel
/// OOM-killed the job; spurctld strips it and ends the job OUT_OF_MEMORY.
pub const OOM_SIGNAL_FLAG: i32 = 0x1000;

impl JobState {
    /// spurctld's own name for the state, as its messages (`job 5 is already Completed`)
    /// and upstream's operator's SpurJob status write it.
    pub fn spurctld_name(self) -> &'static str {
        match self {
            JobState::JobPending => "Pending",
            JobState::JobRunning => "Running",
            JobState::JobCompleting => "Completing",
            JobState::JobCompleted => "Completed",
            JobState::JobFailed => "Failed",
            JobState::JobCancelled => "Cancelled",
            JobState::JobTimeout => "Timeout",
            JobState::JobNodeFail => "NodeFail",
            JobState::JobPreempted => "Preempted",
            JobState::JobSuspended => "Suspended",
            JobState::JobDeadline => "Deadline",
            JobState::JobOutOfMemory => "OutOfMemory",
            JobState::JobRequeued => "Requeued",
        }
    }
}
