//! `spur-operator run`'s flags for node sync and heartbeats.

use std::path::PathBuf;
use std::time::Duration;

use clap::builder::TypedValueParser as _;

use super::NotReadyState;
use crate::flags::parse_duration;

/// Node sync and heartbeats: which nodes, how fast, and what a not-ready node becomes.
/// Flattened into `spur-operator run`.
#[derive(clap::Args, Clone, Debug)]
pub struct NodeArgs {
    /// Label selector of the Kubernetes nodes the operator registers with spurctld.
    /// Opt-in by label, so nodes meant for other workloads are never offered.
    #[arg(
        long,
        env = "SPUR_OPERATOR_NODE_SELECTOR",
        default_value = "spur.amd.com/managed=true"
    )]
    pub node_selector: String,

    /// Node registration and update calls in flight at once. 32 registers thousands of
    /// nodes in seconds, even through a follower that forwards each to the leader, without
    /// flooding the controller's Raft log (measured: docs/evidence.md).
    #[arg(long, env = "SPUR_OPERATOR_REGISTER_CONCURRENCY", default_value_t = 32,
          value_parser = clap::value_parser!(u16).range(1..=1024).map(usize::from))]
    pub register_concurrency: usize,

    /// Time between heartbeats of every registered node. spurctld marks a node DOWN after
    /// missing several; 30 s keeps well inside that at 5,000 nodes' worth of calls.
    #[arg(long, env = "SPUR_OPERATOR_HEARTBEAT_INTERVAL", default_value = "30s", value_parser = parse_duration)]
    pub heartbeat_interval: Duration,

    /// Heartbeat calls in flight at once.
    #[arg(long, env = "SPUR_OPERATOR_HEARTBEAT_CONCURRENCY", default_value_t = 32,
          value_parser = clap::value_parser!(u16).range(1..=1024).map(usize::from))]
    pub heartbeat_concurrency: usize,

    /// A file holding the join token spurctld's token admission (`[admission] mode =
    /// "token"`) asks of every registration, as `spur token create` prints it: mount it
    /// from a Secret. Read again at each registration, so a Secret rotated in place is
    /// used without a restart. Unset, registrations carry none, as an `open` spurctld
    /// (its default) expects.
    #[arg(long, env = "SPUR_OPERATOR_CONTROLLER_JOIN_TOKEN_FILE")]
    pub controller_join_token_file: Option<PathBuf>,

    /// A node registers again for a fresh node token this long before its token expires
    /// (never before half its life). spurctld's node tokens last 7 days and a heartbeat
    /// with an expired one is refused; a day ahead leaves a day of retries through a
    /// controller outage before any heartbeat is refused.
    #[arg(long, env = "SPUR_OPERATOR_NODE_TOKEN_RENEW_BEFORE", default_value = "24h", value_parser = parse_duration)]
    pub node_token_renew_before: Duration,

    /// At most one summary line of node sync failures per this interval.
    #[arg(long, env = "SPUR_OPERATOR_FAILURE_LOG_INTERVAL", default_value = "10s", value_parser = parse_duration)]
    pub failure_log_interval: Duration,

    /// What a node with a NotReady or unreachable taint is told to spurctld as: `drain`
    /// (no new jobs; running ones go on), `down` (running jobs fail at once, NODE_FAIL), or
    /// `ignore` (nothing). `drain`: a kubelet that stops reporting for a moment has not
    /// killed its containers, and spurctld's DOWN would fail every job on the node at once
    /// (a node truly gone still fails its jobs through missed heartbeats and the pods'
    /// reports). Once the taint is gone the operator sends IDLE, which lifts either hold.
    #[arg(
        long,
        env = "SPUR_OPERATOR_NOT_READY_NODE_STATE",
        value_enum,
        default_value_t
    )]
    pub not_ready_node_state: NotReadyState,

    /// Node condition types that drain a node in spurctld while their status is `True`
    /// (comma-separated), e.g. the `GPUProblem` a node-problem-detector sets. The drain
    /// reason spurctld shows is the condition's type and message, and IDLE lifts it once the
    /// condition clears. Empty: which conditions mean "take no new work" is the cluster's
    /// to say. A cordoned node (`kubectl cordon`) is drained regardless, with the reason of
    /// its `spur.amd.com/drain-reason` annotation.
    #[arg(
        long,
        env = "SPUR_OPERATOR_DRAIN_ON_NODE_CONDITION",
        value_delimiter = ','
    )]
    pub drain_on_node_condition: Vec<String>,
}
