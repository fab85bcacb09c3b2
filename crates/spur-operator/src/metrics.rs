//! The operator's Prometheus metrics (served on `/metrics` by `health`).

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RpcLabels {
    pub method: &'static str,
    pub code: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MethodLabels {
    pub method: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RuleLabels {
    pub rule: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FenceLabels {
    /// `not_holding`, `expired` or `closed` (`fence::Refused`).
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LockLabels {
    /// One of [`ELECTION_LOCKS`].
    pub kind: &'static str,
}

/// The values of `spur_operator_election_lock`'s `kind` label, one for each kind of
/// object an election record can live in (`lease::LockKind::label`).
pub const ELECTION_LOCKS: [&str; 2] = ["lease", "configmap"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RestartLabels {
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DuplicateLabels {
    /// Where it was found: `launch` (the agent), `watch` (the reconciler's read-back after
    /// an unanswered SubmitJob) or `deletion` (the finalizer).
    pub found_at: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SpurJobLabels {
    pub namespace: String,
    /// `status.state`, or `New` before the operator wrote one.
    pub state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NamespaceLabels {
    pub namespace: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LaunchFailureLabels {
    /// Why a launch failed: the agent's refusal (`not_acting`, `not_registered`,
    /// `no_spurjob`, `deleting`, `invalid`, `kubernetes_api`, `timeout`) or the pod's waiting reason
    /// (`ImagePullBackOff`, `CreateContainerConfigError`, ...).
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DrainLabels {
    /// Why: `cordoned`, `condition` (a `--drain-on-node-condition`), `not_ready`.
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AgentCallLabels {
    /// The token check's result: `verified`, `without_token`, `unchecked`, `refused`.
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeLabels {
    pub node: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReconcileLabels {
    /// What was reconciled: `node`, `spurjob`, `pod`.
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReconcileErrorLabels {
    pub kind: &'static str,
    /// The error's variant, e.g. `controller_unavailable`, `refused`, `invalid_spec`.
    pub error: &'static str,
}

/// Every metric the operator exports. Cheap to clone: the families share their values.
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    pub rpcs: Family<RpcLabels, Counter>,
    pub rpc_seconds: Family<MethodLabels, Histogram>,
    pub channel_connects: Counter,
    pub channel_connect_failures: Counter,
    pub channel_drops: Counter,
    /// Each time a rule of the controller channel's policy fired (`controller::policy`).
    pub channel_rules: Family<RuleLabels, Counter>,
    pub nodes_registered: Gauge,
    /// Registered nodes spurctld holds (DRAIN, or DOWN) at the operator's word, by why.
    pub nodes_drained: Family<DrainLabels, Gauge>,
    pub registration_lag_seconds: Histogram,
    pub heartbeat_failures: Counter,
    /// Per node: seconds since spurctld last accepted its heartbeat, as of the latest round.
    pub heartbeat_age_seconds: Family<NodeLabels, Gauge<f64, AtomicU64>>,
    pub agent_calls: Family<AgentCallLabels, Counter>,
    pub submission_lag_seconds: Histogram,
    /// SpurJobs by namespace and state, as of the status poller's latest round.
    pub spurjobs: Family<SpurJobLabels, Gauge>,
    /// From a SpurJob's creation to the poller seeing its job run.
    pub start_lag_seconds: Histogram,
    pub launch_failures: Family<LaunchFailureLabels, Counter>,
    /// GPU-seconds of the jobs that ended, by namespace.
    pub gpu_seconds: Family<NamespaceLabels, Counter<f64, AtomicU64>>,
    pub reconciles: Family<ReconcileLabels, Counter>,
    pub reconcile_errors: Family<ReconcileErrorLabels, Counter>,
    pub leader: Gauge,
    /// 1 for the kind of object the election record lives in.
    pub election_lock: Family<LockLabels, Gauge>,
    /// 1 while RBAC or a missing namespace keeps this replica out of the election.
    pub election_blocked: Gauge,
    pub fence_refusals: Family<FenceLabels, Counter>,
    pub duplicates_cancelled: Family<DuplicateLabels, Counter>,
    /// Pods stopped by their job's failure policy (`jobs::failure`).
    pub ranks_stopped: Counter,
    /// Jobs spurctld was asked to run again by their failure policy, by what failed.
    pub job_restarts: Family<RestartLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// Sets the election's gauges: which lock it uses (one of [`ELECTION_LOCKS`]) and
    /// whether it is blocked.
    pub fn set_election(&self, lock: &'static str, blocked: bool) {
        debug_assert!(ELECTION_LOCKS.contains(&lock), "unknown lock kind {lock}");
        for kind in ELECTION_LOCKS {
            let used = i64::from(kind == lock);
            self.election_lock
                .get_or_create(&LockLabels { kind })
                .set(used);
        }
        self.election_blocked.set(i64::from(blocked));
    }

    pub fn new() -> Metrics {
        let mut metrics = Metrics {
            // Replaced below, once every family is registered in it.
            registry: Arc::default(),
            rpcs: Family::<RpcLabels, Counter>::default(),
            // 1 ms to ~65 s: an answer, a bound firing, and anything slower.
            rpc_seconds: Family::<MethodLabels, Histogram>::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.001, 2.0, 17))
            }),
            channel_connects: Counter::default(),
            channel_connect_failures: Counter::default(),
            channel_drops: Counter::default(),
            channel_rules: Family::<RuleLabels, Counter>::default(),
            nodes_registered: Gauge::default(),
            nodes_drained: Family::<DrainLabels, Gauge>::default(),
            registration_lag_seconds: Histogram::new(exponential_buckets(0.01, 2.0, 16)),
            heartbeat_failures: Counter::default(),
            heartbeat_age_seconds: Family::<NodeLabels, Gauge<f64, AtomicU64>>::default(),
            // 10 ms to ~5.5 min, as registration: a submission within a second, one held up
            // by an election, and one held up for minutes all land in their own buckets.
            submission_lag_seconds: Histogram::new(exponential_buckets(0.01, 2.0, 16)),
            spurjobs: Family::<SpurJobLabels, Gauge>::default(),
            // 100 ms to ~27 min: a job that starts at once, one that queued for minutes.
            start_lag_seconds: Histogram::new(exponential_buckets(0.1, 2.0, 15)),
            launch_failures: Family::<LaunchFailureLabels, Counter>::default(),
            gpu_seconds: Family::<NamespaceLabels, Counter<f64, AtomicU64>>::default(),
            agent_calls: Family::<AgentCallLabels, Counter>::default(),
            reconciles: Family::<ReconcileLabels, Counter>::default(),
            reconcile_errors: Family::<ReconcileErrorLabels, Counter>::default(),
            leader: Gauge::default(),
            election_lock: Family::<LockLabels, Gauge>::default(),
            election_blocked: Gauge::default(),
            fence_refusals: Family::<FenceLabels, Counter>::default(),
            duplicates_cancelled: Family::<DuplicateLabels, Counter>::default(),
            ranks_stopped: Counter::default(),
            job_restarts: Family::<RestartLabels, Counter>::default(),
        };
        // Registered in this order, which is the order /metrics lists them in.
        let mut registry = Registry::with_prefix("spur_operator");
        metrics.register_controller_channel(&mut registry);
        metrics.register_nodes(&mut registry);
        metrics.register_work(&mut registry);
        metrics.register_leadership(&mut registry);
        metrics.register_recovery(&mut registry);
        metrics.registry = Arc::new(registry);
        metrics
    }

    /// The calls to spurctld and the channel they share.
    fn register_controller_channel(&self, registry: &mut Registry) {
        registry.register(
            "controller_rpcs",
            "Calls to spurctld by method and gRPC code",
            self.rpcs.clone(),
        );
        registry.register(
            "controller_rpc_duration_seconds",
            "Latency of calls to spurctld, including the connect when one was needed",
            self.rpc_seconds.clone(),
        );
        registry.register(
            "controller_channel_connects",
            "Channels to spurctld opened",
            self.channel_connects.clone(),
        );
        registry.register(
            "controller_channel_connect_failures",
            "Attempts to open a channel to spurctld that failed (timeout, refused, TLS)",
            self.channel_connect_failures.clone(),
        );
        registry.register(
            "controller_channel_drops",
            "Channels to spurctld dropped after a transport failure",
            self.channel_drops.clone(),
        );
        registry.register(
            "controller_channel_rules",
            "Times each rule of the controller channel's policy fired",
            self.channel_rules.clone(),
        );
    }

    /// The nodes: registration, drains and heartbeats.
    fn register_nodes(&self, registry: &mut Registry) {
        registry.register(
            "nodes_registered",
            "Kubernetes nodes the controller has accepted",
            self.nodes_registered.clone(),
        );
        registry.register("nodes_drained", "Nodes spurctld holds from new work at the operator's word (DRAIN, or DOWN for not_ready if so configured), by reason: cordoned, condition, not_ready", self.nodes_drained.clone());
        registry.register(
            "node_registration_lag_seconds",
            "From a node needing registration to the controller accepting it",
            self.registration_lag_seconds.clone(),
        );
        registry.register(
            "heartbeat_failures",
            "Node heartbeats that failed",
            self.heartbeat_failures.clone(),
        );
        registry.register("node_heartbeat_age_seconds", "Seconds since spurctld last accepted the node's heartbeat, as of the latest round (spurctld marks a node DOWN, failing its jobs, past 90 s)", self.heartbeat_age_seconds.clone());
    }

    /// The SpurJobs, their launches, and every reconciliation.
    fn register_work(&self, registry: &mut Registry) {
        registry.register("spurjob_submission_lag_seconds", "From a SpurJob's creation to spurctld accepting its job (or the operator adopting the job a lost reply left)", self.submission_lag_seconds.clone());
        registry.register("spurjobs", "SpurJobs by namespace and state (status.state; New before the operator wrote one), as of the status poller's latest round", self.spurjobs.clone());
        registry.register(
            "spurjob_start_lag_seconds",
            "From a SpurJob's creation to the status poller seeing its job Running",
            self.start_lag_seconds.clone(),
        );
        registry.register("launch_failures", "Launches that failed, by reason: the agent's refusal of a LaunchJob, or the waiting reason of a pod that will never start", self.launch_failures.clone());
        registry.register("gpu_seconds", "GPU-seconds of the SpurJobs that ended (GPUs per node x nodes x spurctld's run time), by namespace", self.gpu_seconds.clone());
        registry.register("agent_calls", "Calls to the virtual agent by token check result: verified, without_token (admitted by permissive), unchecked, refused", self.agent_calls.clone());
        registry.register(
            "reconciles",
            "Reconciliations by kind",
            self.reconciles.clone(),
        );
        registry.register(
            "reconcile_errors",
            "Failed reconciliations by kind and error",
            self.reconcile_errors.clone(),
        );
    }

    /// The election and the fence on writes made for it.
    fn register_leadership(&self, registry: &mut Registry) {
        registry.register(
            "leader",
            "1 while this replica holds the operator's lease and acts",
            self.leader.clone(),
        );
        registry.register("election_lock", "1 for the object the leader election uses: lease, or configmap where RBAC refuses leases", self.election_lock.clone());
        registry.register("election_blocked", "1 while this replica cannot take part in the leader election (RBAC refuses both lock kinds, or its namespace is missing): it never acts; /readyz and the log name what to add", self.election_blocked.clone());
        registry.register("fence_refusals", "Writes on behalf of leadership refused because this replica's hold on the Lease had ended, ran out, or was closed for shutdown", self.fence_refusals.clone());
    }

    /// What the operator undid or redid: duplicates, stopped ranks, restarts.
    fn register_recovery(&self, registry: &mut Registry) {
        registry.register("duplicate_jobs_cancelled", "Second controller jobs of one SpurJob (a SubmitJob given up on and applied later) cancelled, by where they were found", self.duplicates_cancelled.clone());
        registry.register("ranks_stopped", "Pods of multi-node jobs stopped by the job's failure policy (FailJob) after another node's pod of the same run failed", self.ranks_stopped.clone());
        registry.register("job_restarts", "Jobs requeued in spurctld under the same id by their failure policy (maxRestarts), by what failed: PodFailed or StartTimeout", self.job_restarts.clone());
    }

    /// Counts one restart of a job by its failure policy, after `reason`.
    pub fn job_restarted(&self, reason: &'static str) {
        self.job_restarts
            .get_or_create(&RestartLabels { reason })
            .inc();
    }

    /// Counts one duplicate job cancelled, found at `found_at`.
    pub fn duplicate_cancelled(&self, found_at: &'static str) {
        self.duplicates_cancelled
            .get_or_create(&DuplicateLabels { found_at })
            .inc();
    }

    /// Counts one write the fence refused, for `reason`.
    pub fn fence_refused(&self, reason: &'static str) {
        self.fence_refusals
            .get_or_create(&FenceLabels { reason })
            .inc();
    }

    /// Records one controller call.
    pub fn observe_rpc(&self, method: &'static str, code: tonic::Code, elapsed: Duration) {
        self.rpcs
            .get_or_create(&RpcLabels {
                method,
                code: code_name(code),
            })
            .inc();
        self.rpc_seconds
            .get_or_create(&MethodLabels { method })
            .observe(elapsed.as_secs_f64());
    }

    /// Counts one firing of the channel rule `rule`.
    pub fn channel_rule(&self, rule: &'static str) {
        self.channel_rules.get_or_create(&RuleLabels { rule }).inc();
    }

    /// A registry with one series in every family (a labelled family shows in the
    /// exposition only once it has one): what the README's list and the dashboard in
    /// `deploy/dashboards/` are checked against.
    pub fn with_a_series_of_each() -> Metrics {
        let metrics = Metrics::new();
        metrics.observe_rpc("Ping", tonic::Code::Ok, std::time::Duration::from_millis(1));
        metrics.reconcile_error("node", "register");
        metrics.agent_auth("verified");
        metrics.channel_rule("hedge");
        metrics.fence_refused("closed");
        metrics.duplicate_cancelled("launch");
        metrics.job_restarted("PodFailed");
        metrics.set_election("lease", false);
        metrics
            .reconciles
            .get_or_create(&ReconcileLabels { kind: "node" })
            .inc();
        metrics.launch_failed("timeout");
        metrics
            .spurjobs
            .get_or_create(&SpurJobLabels {
                namespace: "ml".to_owned(),
                state: "Running".to_owned(),
            })
            .set(1);
        metrics
            .gpu_seconds
            .get_or_create(&NamespaceLabels {
                namespace: "ml".to_owned(),
            })
            .inc_by(1.0);
        metrics
            .nodes_drained
            .get_or_create(&DrainLabels { reason: "cordoned" })
            .set(0);
        metrics
            .heartbeat_age_seconds
            .get_or_create(&NodeLabels {
                node: "node-0".to_owned(),
            })
            .set(1.0);
        metrics
    }

    /// The names of the families in the exposition (`spur_operator_...`, without the
    /// `_total` a counter's series add).
    pub fn family_names(&self) -> std::collections::BTreeSet<String> {
        self.encode()
            .lines()
            .filter_map(|l| l.strip_prefix("# HELP "))
            .filter_map(|l| l.split(' ').next())
            .map(str::to_owned)
            .collect()
    }

    /// One failed launch, by `reason`.
    pub fn launch_failed(&self, reason: &str) {
        self.launch_failures
            .get_or_create(&LaunchFailureLabels {
                reason: reason.to_owned(),
            })
            .inc();
    }

    pub fn agent_auth(&self, result: &'static str) {
        self.agent_calls
            .get_or_create(&AgentCallLabels { result })
            .inc();
    }

    pub fn reconcile_error(&self, kind: &'static str, error: &'static str) {
        self.reconcile_errors
            .get_or_create(&ReconcileErrorLabels { kind, error })
            .inc();
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)
            .expect("writing to a String cannot fail");
        text
    }
}

/// gRPC code names as the gRPC spec spells them, for labels.
pub fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        Cancelled => "CANCELLED",
        Unknown => "UNKNOWN",
        InvalidArgument => "INVALID_ARGUMENT",
        DeadlineExceeded => "DEADLINE_EXCEEDED",
        NotFound => "NOT_FOUND",
        AlreadyExists => "ALREADY_EXISTS",
        PermissionDenied => "PERMISSION_DENIED",
        ResourceExhausted => "RESOURCE_EXHAUSTED",
        FailedPrecondition => "FAILED_PRECONDITION",
        Aborted => "ABORTED",
        OutOfRange => "OUT_OF_RANGE",
        Unimplemented => "UNIMPLEMENTED",
        Internal => "INTERNAL",
        Unavailable => "UNAVAILABLE",
        DataLoss => "DATA_LOSS",
        Unauthenticated => "UNAUTHENTICATED",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_names_every_family() {
        let m = Metrics::new();
        m.observe_rpc("Ping", tonic::Code::Ok, Duration::from_millis(3));
        m.observe_rpc(
            "SubmitJob",
            tonic::Code::Unavailable,
            Duration::from_secs(2),
        );
        m.channel_drops.inc();
        m.leader.set(1);
        m.reconcile_error("spurjob", "invalid_spec");
        m.heartbeat_age_seconds
            .get_or_create(&NodeLabels {
                node: "gpu-1".into(),
            })
            .set(30.5);
        m.nodes_drained
            .get_or_create(&DrainLabels { reason: "cordoned" })
            .set(2);
        let text = m.encode();
        for needle in [
            "spur_operator_nodes_drained{reason=\"cordoned\"} 2",
            "spur_operator_controller_rpcs_total{method=\"Ping\",code=\"OK\"} 1",
            "spur_operator_controller_rpcs_total{method=\"SubmitJob\",code=\"UNAVAILABLE\"} 1",
            "spur_operator_controller_rpc_duration_seconds_count{method=\"SubmitJob\"} 1",
            "spur_operator_controller_channel_drops_total 1",
            "spur_operator_leader 1",
            "spur_operator_reconcile_errors_total{kind=\"spurjob\",error=\"invalid_spec\"} 1",
            "# TYPE spur_operator_nodes_registered gauge",
            "# TYPE spur_operator_node_registration_lag_seconds histogram",
            "# TYPE spur_operator_spurjob_submission_lag_seconds histogram",
            "spur_operator_heartbeat_failures_total 0",
            "# TYPE spur_operator_node_heartbeat_age_seconds gauge",
            "spur_operator_node_heartbeat_age_seconds{node=\"gpu-1\"} 30.5",
        ] {
            assert!(text.contains(needle), "missing {needle} in\n{text}");
        }
        assert!(text.ends_with("# EOF\n"));
    }
}
