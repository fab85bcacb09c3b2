//! Three simulated spurctld replicas (docs/specs.md: the simulation's replicas, and "How a
//! replicated spurctld answers" in the wire subset).
//!
//! - [`state`]: the replicated state machine (nodes, jobs, the next job id) and the log's
//!   commands. Pure: no I/O, no clock.
//! - [`auth`]: the bearer-token check spurctld makes of every caller (`[auth]`).
//! - [`admission`]: token admission (`[admission] mode = "token"`): join and node tokens.
//! - [`calls`]: who made each write call, for the checks.
//! - [`cluster`]: the replicated log shared through the harness, who leads, elections
//!   among the reachable majority, and each replica's (possibly stale) view.
//! - [`replica`]: one replica's `slurm.SlurmController` server: writes on the leader,
//!   forwarding from followers with one unbounded client per leader, reads.
//! - [`scheduler`]: places pending jobs on idle nodes and dispatches them: `LaunchJob` on
//!   every node at once, RUNNING only when all confirmed, backoff and hold on failure; the
//!   leader's health check.
//! - [`hostlist`]: `JobInfo.nodelist` compressed as spurctld compresses it.
//! - [`limits`]: spurctld's message and submission size limits.
//! - [`tcp`]: the same replicas over real TCP (`spur-sim controllers`).
//! - [`processes`]: the same replicas as one process each, for the lab without the real
//!   spurctld (`spur-sim replica`, `spur-sim replica-state`).

pub mod admission;
pub mod auth;
pub mod calls;
pub mod cluster;
pub mod hostlist;
pub mod limits;
pub mod processes;
pub mod replica;
pub mod scheduler;
pub mod state;
pub mod tcp;

use std::time::Duration;

pub use crate::clock::Clock;
pub use cluster::{Cluster, LostReply, RefusalKind, Role};
pub use replica::Replica;

/// The port spurctld serves clients on (its default).
pub const CLIENT_PORT: u16 = 6817;
/// The port the replicas replicate on (its default).
pub const RAFT_PORT: u16 = 6821;

/// The controller replicas' tunables. Each default carries its reason.
#[derive(Clone, Debug)]
pub struct ControllerConfig {
    /// Number of replicas: spurctld's StatefulSet runs 3, so one may fail.
    pub replicas: usize,
    /// Port of the client service: spurctld's default.
    pub port: u16,
    /// Shortest time from losing the leader to a new one: a real three-replica spurctld
    /// elects about 4.5 to 7 s after a kill or freeze (3 s leader lease plus an election
    /// timeout of 1.5 to 3 s, ticks every 750 ms; docs/specs.md, fidelity row 20).
    pub election_min: Duration,
    /// Longest time from losing the leader to a new one (see `election_min`).
    pub election_max: Duration,
    /// How long a follower that no longer hears its leader keeps naming it (and trying to
    /// forward to it) before it forgets it and refuses writes at once: about the leader
    /// lease plus an election timeout (docs/specs.md, fidelity row 10).
    pub forget_leader_after: Duration,
    /// How often a leader without a quorum checks again whether it can commit a write
    /// (the write waits meanwhile, as a Raft proposal does).
    pub commit_retry: Duration,
    /// How often the leader's scheduler looks for pending jobs: spurctld's
    /// `[scheduler] interval_secs` is 1 s, and a submission wakes it at once; half a
    /// second keeps the model's launch lag within the real one.
    pub schedule_interval: Duration,
    /// The first wait after a failed dispatch, doubled per failure: spurctld's
    /// `max(2 × interval + 3, 5)` seconds.
    pub dispatch_backoff: Duration,
    /// The longest wait after a failed dispatch (`max_launch_backoff_secs`, 300).
    pub dispatch_backoff_max: Duration,
    /// How long a running job requeued by a client (`RequeueJob`) waits before it may be
    /// dispatched again: spurctld's `max(2 × interval + 3, 5)` seconds, which keeps the
    /// scheduler from re-dispatching it into its own in-flight cancel.
    pub requeue_hold: Duration,
    /// Failed dispatches after which a job is held (`max_batch_requeue`, 5).
    pub max_batch_requeue: u32,
    /// Bound on the leader's CancelJob calls to agents (spurctld's 5 s); its LaunchJob
    /// calls have no bound at all, as spurctld's do.
    pub agent_cancel_timeout: Duration,
    /// Nodes silent this long go DOWN "Not responding" and their jobs NODE_FAIL
    /// (`heartbeat_timeout_secs`, 90).
    pub heartbeat_timeout: Duration,
    /// How often the leader's health check looks for silent nodes (spurctld's 30 s).
    pub health_tick: Duration,
    /// Terminal jobs are evicted this long after they ended
    /// (`terminal_job_retention_secs`, 3600).
    pub terminal_retention: Duration,
    /// The shortest time an ended job is kept whatever `terminal_retention` says: spurctld
    /// floors the retention to its accounting reconcile interval (120 s), so a job's
    /// accounting row is repaired before the job is gone.
    pub retention_floor: Duration,
    /// The version string `Ping` answers.
    pub version: String,
    /// When set, the key the replicas sign a bearer token with (HS256, valid 5 minutes
    /// from the simulated time) on each call to an agent, as a spurctld configured with an
    /// `[auth] jwt_key` does: claims `sub: "spurctld", uid: 0, iat, exp, admin: true`.
    ///
    /// It is spurctld's one `[auth] jwt_key`, so it is also the key the replicas verify
    /// their callers' tokens with; without it a caller's token is refused.
    pub agent_key: Option<Vec<u8>>,
    /// `[auth] mode = "required"`: every call needs a valid token, Ping included. Off,
    /// spurctld's default (`permissive`) admits a call without one.
    pub auth_required: bool,
    /// `[admission] mode = "token"`: a registration needs a join token `CreateToken` made,
    /// and a heartbeat the node token its registration was answered with. Off, spurctld's
    /// default (`open`): neither is asked for, and a registration's node token is empty.
    pub token_admission: bool,
    /// How long a node token is valid: spurctld fixes 7 days; a simulation shortens it to
    /// see the operator renew its nodes' tokens in minutes.
    pub node_token_lifetime: Duration,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        Self {
            replicas: 3,
            port: spur_proto::CONTROLLER_PORT,
            election_min: Duration::from_millis(4500),
            election_max: Duration::from_secs(7),
            forget_leader_after: Duration::from_secs(5),
            commit_retry: Duration::from_millis(100),
            schedule_interval: Duration::from_millis(500),
            dispatch_backoff: Duration::from_secs(5),
            dispatch_backoff_max: Duration::from_secs(300),
            requeue_hold: Duration::from_secs(5),
            max_batch_requeue: 5,
            agent_cancel_timeout: Duration::from_secs(5),
            heartbeat_timeout: Duration::from_secs(90),
            health_tick: Duration::from_secs(30),
            terminal_retention: Duration::from_secs(3600),
            retention_floor: Duration::from_secs(120),
            version: "spur-sim".to_owned(),
            agent_key: None,
            auth_required: false,
            token_admission: false,
            node_token_lifetime: admission::NODE_TOKEN_LIFETIME,
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
