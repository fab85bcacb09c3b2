//! Three simulated spurctld replicas (sim.md, "Controller replicas"; wire.md, last section).
//!
//! - [`state`]: the replicated state machine (nodes, jobs, the next job id) and the log's
//!   commands. Pure: no I/O, no clock.
//! - [`calls`]: who made each write call, for the checks.
//! - [`cluster`]: the replicated log shared through the harness, who leads, elections
//!   among the reachable majority, and each replica's (possibly stale) view.
//! - [`replica`]: one replica's `slurm.SlurmController` server: writes on the leader,
//!   forwarding from followers with one unbounded client per leader, reads.
//! - [`scheduler`]: places pending jobs on idle nodes and calls `SlurmAgent.LaunchJob`.
//! - [`tcp`]: the same replicas over real TCP (`spur-sim controllers`).

pub mod calls;
pub mod cluster;
pub mod replica;
pub mod scheduler;
pub mod state;
pub mod tcp;

use std::time::{Duration, SystemTime};

pub use cluster::{Cluster, LostReply, RefusalKind, Role};
pub use replica::Replica;

/// The controller replicas' tunables. Each default carries its reason.
#[derive(Clone, Debug)]
pub struct ControllerConfig {
    /// Number of replicas: spurctld's StatefulSet runs 3, so one may fail.
    pub replicas: usize,
    /// Port of the client service: spurctld's default.
    pub port: u16,
    /// Shortest time from losing the leader to a new one: a real three-replica spurctld
    /// took about 5 s after a kill and 6 s after a freeze; Raft's randomised election
    /// timeout plus the time to notice spreads that over 3 to 8 s.
    pub election_min: Duration,
    /// Longest time from losing the leader to a new one (see `election_min`).
    pub election_max: Duration,
    /// How often a leader without a quorum checks again whether it can commit a write
    /// (the write waits meanwhile, as a Raft proposal does).
    pub commit_retry: Duration,
    /// How often the leader's scheduler looks for pending jobs: short enough that the
    /// submission-to-launch lag stays well under the operator's deadlines.
    pub schedule_interval: Duration,
    /// Connect timeout of the leader's client to an agent for `LaunchJob`/`CancelJob`;
    /// spurctld bounds these calls so one dead agent does not stall scheduling.
    pub agent_connect_timeout: Duration,
    /// Bound on one `LaunchJob`/`CancelJob` call (see `agent_connect_timeout`).
    pub agent_request_timeout: Duration,
    /// The version string `Ping` answers.
    pub version: String,
    /// When set, the key the replicas sign a bearer token with (HS256, valid 5 minutes
    /// from the simulated time) on each call to an agent, as a spurctld configured with an
    /// agent key does.
    pub agent_key: Option<Vec<u8>>,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        Self {
            replicas: 3,
            port: spur_proto::CONTROLLER_PORT,
            election_min: Duration::from_secs(3),
            election_max: Duration::from_secs(8),
            commit_retry: Duration::from_millis(100),
            schedule_interval: Duration::from_millis(500),
            agent_connect_timeout: Duration::from_secs(5),
            agent_request_timeout: Duration::from_secs(10),
            version: "spur-sim".to_owned(),
            agent_key: None,
        }
    }
}

/// The name of replica `slot`, generation `generation` (0 for the first pod):
/// `spurctld-0`, then `spurctld-0-r1`, … for its replacements.
pub fn replica_host(slot: usize, generation: u32) -> String {
    if generation == 0 {
        format!("spurctld-{slot}")
    } else {
        format!("spurctld-{slot}-r{generation}")
    }
}

/// Where the replicas read time: simulated in the simulation, real over real TCP.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    /// Monotonic time since the start of the run.
    pub elapsed: fn() -> Duration,
    /// Wall-clock time, for timestamps in answers.
    pub wall: fn() -> SystemTime,
}

impl Clock {
    /// turmoil's simulated clock from the fixed epoch.
    pub fn simulated() -> Self {
        Self {
            elapsed: crate::determinism::sim_elapsed,
            wall: crate::determinism::sim_now,
        }
    }
}
