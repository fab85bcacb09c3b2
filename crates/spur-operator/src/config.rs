//! `spur-operator run`'s command line, with the default of every tunable and the reason
//! for it.
//!
//! The command line (clap, with a `SPUR_OPERATOR_*` environment twin for every flag) is
//! parsed into argument structs, then validated into plain config values that the rest of
//! the library takes. Validation names the flag that is wrong, so bad input is a one-line
//! error rather than a panic. The controller channel's flags are its own module's
//! ([`crate::controller::ControllerArgs`]), flattened in here; what flags share is in
//! [`crate::flags`].

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use clap::builder::TypedValueParser as _;

use crate::agent_auth::AgentAuthMode;
use crate::controller::{ControllerArgs, ControllerSettings};
use crate::flags::{Bound, ConfigError, RetryRange, parse_duration, parse_range, read_file};
use crate::jobs::JobsTuning;
use crate::lease::LeaseConfig;
use crate::nodes::heartbeat::HeartbeatConfig;
use crate::nodes::{AgentEndpoint, NodeSyncConfig, NotReadyState};
use crate::retry::BackoffPolicy;
use crate::selector::Selector;

/// Everything `spur-operator run` takes. Each default carries its reason.
#[derive(Args, Clone, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub controller: ControllerArgs,

    /// Kubeconfig to use; in-cluster configuration (or the default kubeconfig) when unset.
    #[arg(long, env = "SPUR_OPERATOR_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,

    /// Namespace of the operator's Lease (the operator's own; set it from the Downward
    /// API's metadata.namespace).
    #[arg(long, env = "SPUR_OPERATOR_NAMESPACE", default_value = "spur-system")]
    pub namespace: String,

    /// This replica's name in the Lease; the pod name (HOSTNAME) when unset.
    #[arg(long, env = "SPUR_OPERATOR_IDENTITY")]
    pub identity: Option<String>,

    /// Label selector of the Kubernetes nodes the operator registers with spurctld.
    /// Opt-in by label, so nodes meant for other workloads are never offered.
    #[arg(
        long,
        env = "SPUR_OPERATOR_NODE_SELECTOR",
        default_value = "spur.amd.com/managed=true"
    )]
    pub node_selector: String,

    /// Address the virtual agent listens on for spurctld's LaunchJob calls.
    #[arg(
        long,
        visible_alias = "listen",
        env = "SPUR_OPERATOR_AGENT_LISTEN",
        default_value = "0.0.0.0:6818"
    )]
    pub agent_listen: SocketAddr,

    /// Address spurctld dials back to reach the agent: this pod's IP (Downward API
    /// status.podIP). Not a load-balanced Service: spurctld must reach the acting replica,
    /// and the standby refuses launches. Unset, upstream's `SPUR_OPERATOR_ADDRESS` is
    /// used, then `POD_IP`, as upstream's manifests set them.
    #[arg(long, visible_alias = "address", env = "SPUR_OPERATOR_AGENT_ADDRESS")]
    pub agent_address: Option<String>,

    /// How the agent treats spurctld's bearer tokens (HS256 JWTs under
    /// --agent-auth-key-file): `required` refuses a call without a valid one; `permissive`
    /// refuses an invalid token but admits a call with none (counted in
    /// spur_operator_agent_calls_total), so tokens can be rolled out before they are
    /// enforced; `disabled` ignores them. Permissive by default: a spurctld that sends no
    /// token keeps working, and one that sends a token has it checked.
    #[arg(
        long,
        visible_alias = "auth-mode",
        env = "SPUR_OPERATOR_AGENT_AUTH",
        value_enum,
        default_value_t
    )]
    pub agent_auth: AgentAuthMode,

    /// File holding the HS256 key spurctld signs agent tokens with (its `[auth] jwt_key`'s
    /// bytes; one trailing newline is ignored). Any non-empty length is accepted, as
    /// spurctld signs with whatever key it is given; below the 32 bytes RFC 7518 asks of an
    /// HS256 key a warning is logged. Without it no token is checked, which
    /// `--agent-auth required` does not allow.
    #[arg(long, env = "SPUR_OPERATOR_AGENT_AUTH_KEY_FILE")]
    pub agent_auth_key_file: Option<PathBuf>,

    /// The same key given as its value, as upstream's `--jwt-key`/`SPUR_JWT_KEY` take it
    /// (from a Secret in the environment; on the command line it shows in `ps`). Prefer
    /// --agent-auth-key-file, a mounted Secret file.
    #[arg(
        long,
        visible_alias = "jwt-key",
        env = "SPUR_JWT_KEY",
        hide_env_values = true,
        conflicts_with = "agent_auth_key_file"
    )]
    pub agent_auth_key: Option<String>,

    /// Upstream's quota reconciler switch. Not provided here: set, the operator refuses
    /// to start and says so, rather than run without the quotas a team relies on.
    #[arg(long, hide = true)]
    pub enable_quota: bool,

    /// Clock skew forgiven when checking a token's `exp` and `nbf`. 30 s: nodes kept by NTP
    /// differ by milliseconds, and a token long expired is still refused.
    #[arg(long, env = "SPUR_OPERATOR_AGENT_AUTH_LEEWAY", default_value = "30s", value_parser = parse_duration)]
    pub agent_auth_leeway: Duration,

    /// Bound on one LaunchJob's Kubernetes work (reading the node, creating the pod and the
    /// Service); past it the agent answers UNAVAILABLE and spurctld retries after its
    /// backoff. spurctld waits on a LaunchJob with no bound and handles its assignments one
    /// after another, so an API server that does not answer would otherwise hold up all its
    /// scheduling. 10 s: a healthy API server answers a launch's three calls in
    /// milliseconds, and an outage then costs spurctld at most 10 s per assignment (its
    /// LaunchJobs to one job's nodes go out together) before it backs off and moves on.
    #[arg(long, env = "SPUR_OPERATOR_AGENT_LAUNCH_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub agent_launch_timeout: Duration,

    /// Bound on one `spur exec` into a job's pod (ExecInJob, relayed by spurctld), from the
    /// call to the command's exit; past it the agent answers DEADLINE_EXCEEDED. spur exec
    /// runs one-shot commands (`nvidia-smi`, `rocm-smi`, `cat` a log) and spurctld waits on
    /// the call with no bound of its own. 60 s: such commands end in seconds, and a hung one
    /// holds no more than a minute of the caller's time.
    #[arg(long, env = "SPUR_OPERATOR_AGENT_EXEC_TIMEOUT", default_value = "60s", value_parser = parse_duration)]
    pub agent_exec_timeout: Duration,

    /// The most of each of an exec's stdout and stderr returned, in bytes; the rest is read
    /// and dropped, and the answer says it was cut. 1 MiB: ExecInJobResponse carries both in
    /// one message, and two of these stay well inside the 4 MiB gRPC clients take by default.
    #[arg(long, env = "SPUR_OPERATOR_AGENT_EXEC_OUTPUT_LIMIT", default_value_t = 1 << 20)]
    pub agent_exec_output_limit: usize,

    /// The user a SpurJob's job runs as at spurctld when its `spur.amd.com/user` annotation
    /// names none. `k8s`: spurctld takes the user of an unauthenticated submission as given
    /// and does not check it, an empty user would make every job ownerless (any caller could
    /// cancel it), and `root` is refused by spurd's default `allow_root_jobs = false`; with a
    /// token, spurctld replaces it with the token's subject anyway.
    #[arg(long, env = "SPUR_OPERATOR_DEFAULT_USER", default_value = "k8s")]
    pub default_user: String,

    /// An Event repeated (same object, type, reason and note) within this long of its last
    /// occurrence is counted on the first one (`series.count`) instead of written again,
    /// as kubectl shows "(x4 over 10m)". 6m: client-go's and kube-runtime's recorders use
    /// the same window, so a pod failing again on every retry of a job makes one line.
    #[arg(long, env = "SPUR_OPERATOR_EVENT_SERIES_WINDOW", default_value = "6m", value_parser = parse_duration)]
    pub event_series_window: Duration,

    /// Address of /healthz, /readyz and /metrics. All interfaces: kubelet probes and
    /// Prometheus scrape the pod IP.
    #[arg(
        long,
        visible_alias = "health-addr",
        env = "SPUR_OPERATOR_HEALTH_LISTEN",
        default_value = "0.0.0.0:8080"
    )]
    pub health_listen: SocketAddr,

    /// Bound on each readiness probe (API server, controller Ping). Below kubelet's
    /// default probe timeout, so /readyz answers with a reason instead of timing out.
    #[arg(long, env = "SPUR_OPERATOR_PROBE_TIMEOUT", default_value = "2s", value_parser = parse_duration)]
    pub probe_timeout: Duration,

    /// Node registration and update calls in flight at once. 32 registers 5,000 nodes in
    /// about 5 s at a 10 ms round trip (`spur-sim bench-nodes`: most through a follower,
    /// which forwards each to the leader, a second round trip) without flooding the
    /// controller's Raft log.
    #[arg(long, env = "SPUR_OPERATOR_REGISTER_CONCURRENCY", default_value_t = 32,
          value_parser = clap::value_parser!(u16).range(1..=1024).map(usize::from))]
    pub register_concurrency: usize,

    /// SpurJob and pod reconciliations in flight at once. kube-runtime's default is
    /// unbounded: an operator starting with 10,000 SpurJobs would open 10,000 calls to
    /// spurctld and the API server at the same moment. 32, as for node registration.
    #[arg(long, env = "SPUR_OPERATOR_RECONCILE_CONCURRENCY", default_value_t = 32,
          value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub reconcile_concurrency: u16,

    /// Time between heartbeats of every registered node. spurctld marks a node DOWN after
    /// missing several; 30 s keeps well inside that at 5,000 nodes' worth of calls.
    #[arg(long, env = "SPUR_OPERATOR_HEARTBEAT_INTERVAL", default_value = "30s", value_parser = parse_duration)]
    pub heartbeat_interval: Duration,

    /// Heartbeat calls in flight at once.
    #[arg(long, env = "SPUR_OPERATOR_HEARTBEAT_CONCURRENCY", default_value_t = 32,
          value_parser = clap::value_parser!(u16).range(1..=1024).map(usize::from))]
    pub heartbeat_concurrency: usize,

    /// First delay before retrying a failed or refused call for one object. Short, so a
    /// blip costs well under a second.
    #[arg(long, env = "SPUR_OPERATOR_RETRY_INITIAL", default_value = "500ms", value_parser = parse_duration)]
    pub retry_initial: Duration,

    /// Longest delay between retries for one object; doubling stops here. 30 s bounds how
    /// stale a refused node can get once the refusal clears.
    #[arg(long, env = "SPUR_OPERATOR_RETRY_MAX", default_value = "30s", value_parser = parse_duration)]
    pub retry_max: Duration,

    /// Fraction by which each retry delay is shortened at random, so objects that failed
    /// together do not retry in lockstep.
    #[arg(long, env = "SPUR_OPERATOR_RETRY_JITTER", default_value_t = 0.2)]
    pub retry_jitter: f64,

    /// Retry after a transport failure (controller unreachable, mid-election: UNAVAILABLE
    /// and the like) at a random delay in this range, without doubling, or `off` to double
    /// as for any failure. An election takes seconds; a doubling backoff grown during it
    /// outlasts it (the seed's run 9 waited 32 s), while this retries within a second of
    /// the new leader at a few calls per second per object.
    #[arg(long, env = "SPUR_OPERATOR_RETRY_TRANSIENT", default_value = "250ms..1s",
          value_parser = parse_range)]
    pub retry_transient: RetryRange,

    /// Name of the Lease that elects the acting replica.
    #[arg(
        long,
        env = "SPUR_OPERATOR_LEASE_NAME",
        default_value = "spur-operator"
    )]
    pub lease_name: String,

    /// How long a Lease holds without renewal before a standby may take over. 15 s, as
    /// client-go's default: a crashed leader is replaced within about 15 s.
    #[arg(long, env = "SPUR_OPERATOR_LEASE_DURATION", default_value = "15s", value_parser = parse_duration)]
    pub lease_duration: Duration,

    /// The holder stops acting when it has not renewed for this long; shorter than the
    /// lease duration so it always stops before a standby can start.
    #[arg(long, env = "SPUR_OPERATOR_LEASE_RENEW_DEADLINE", default_value = "10s", value_parser = parse_duration)]
    pub lease_renew_deadline: Duration,

    /// Time between renewals (and a standby's attempts). Two tries fit in the deadline.
    #[arg(long, env = "SPUR_OPERATOR_LEASE_RETRY_PERIOD", default_value = "5s", value_parser = parse_duration)]
    pub lease_retry_period: Duration,

    /// Bound on each Lease API call, so a hung API server cannot hold a renewal past the
    /// renew deadline.
    #[arg(long, env = "SPUR_OPERATOR_KUBE_CALL_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    pub kube_call_timeout: Duration,

    /// On SIGTERM, how long calls in flight may take to finish before the process exits.
    /// Under Kubernetes' default 30 s grace period.
    #[arg(long, env = "SPUR_OPERATOR_SHUTDOWN_GRACE", default_value = "10s", value_parser = parse_duration)]
    pub shutdown_grace: Duration,

    /// How often the state of every active job is read (one GetJobs for all of them) and
    /// mirrored into SpurJob status. 2 s keeps status within seconds of the controller at
    /// one call per interval whatever the number of jobs.
    #[arg(long, env = "SPUR_OPERATOR_STATUS_POLL_INTERVAL", default_value = "2s", value_parser = parse_duration)]
    pub status_poll_interval: Duration,

    /// How long a job must be missing from every GetJobs, without a sighting, before it is
    /// asked about with GetJob and, if unknown, marked Lost; and how long CancelJob may
    /// answer "job N not found" before a deleted SpurJob's finalizer is removed. spurctld
    /// evicts a job at least 120 s (by default 3600 s) after it ended, so a job really gone
    /// stays gone; but a stale replica (a follower cut off, or a leader cut off from its
    /// majority, which never steps down) answers from an old state and does not know newer
    /// jobs. 2 minutes is many channel rotations (20 s) to other replicas.
    #[arg(long, env = "SPUR_OPERATOR_JOB_LOST_AFTER", default_value = "2m", value_parser = parse_duration)]
    pub job_lost_after: Duration,

    /// A SubmitJob unanswered this long is read back (a GetJobs by its name) every this
    /// long while it waits, and the job it carried adopted once it shows up, or `off`.
    /// spurctld commits a submission in milliseconds; one waiting a second has most likely
    /// been applied with its reply lost, which otherwise costs the whole request bound
    /// (5 s) before the retry finds it. A read finding nothing leaves the call waiting, so
    /// no second submission is sent; the cost is one read per second per waiting call.
    #[arg(long, env = "SPUR_OPERATOR_SUBMIT_READ_BACK", default_value = "1s")]
    pub submit_read_back: Bound,

    /// After a SubmitJob that went unanswered (abandoned, timed out, its connection lost),
    /// how long the SpurJob's jobs are read back for a second one carrying its UID, which
    /// is then cancelled. spurctld does not deduplicate, and forwards a write to its leader
    /// with no deadline, so a SubmitJob held by a network cut lands when the cut heals and a
    /// kernel retransmits it: after the cut's whole length plus up to two minutes of
    /// retransmission backoff. 10 minutes outlasts any cut the operator rides out without
    /// losing its nodes (spurctld marks them DOWN after 90 s without a heartbeat); a later
    /// duplicate is still refused and cancelled at launch. `0s`: no watch.
    #[arg(long, env = "SPUR_OPERATOR_DUPLICATE_WATCH", default_value = "10m", value_parser = parse_duration)]
    pub duplicate_watch: Duration,

    /// How often a watched SpurJob's jobs are read (one GetJobs by name). A duplicate that
    /// spurctld can schedule is launched within a second and refused then; this read is
    /// for one waiting in the queue. 30 s: at most 20 reads per watched SpurJob, and only
    /// SpurJobs whose submission went unanswered are watched.
    #[arg(long, env = "SPUR_OPERATOR_DUPLICATE_WATCH_INTERVAL", default_value = "30s", value_parser = parse_duration)]
    pub duplicate_watch_interval: Duration,

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

    /// After spurctld refused a SpurJob's submission with FAILED_PRECONDITION (a condition
    /// outside the spec, such as a user unknown on the controller's host), how long before
    /// the same spec is tried again. 5 min: an administrator's fix is picked up without a
    /// spec edit, at one call per refused SpurJob per 5 minutes. INVALID_ARGUMENT and
    /// PERMISSION_DENIED wait for a spec change instead.
    #[arg(long, env = "SPUR_OPERATOR_SUBMIT_PRECONDITION_RETRY", default_value = "5m", value_parser = parse_duration)]
    pub submit_precondition_retry: Duration,

    /// How many times a pod's end report refused with "node X is not allocated to job N" is
    /// sent again before it is given up. spurctld answers so while the job is still being
    /// dispatched (PENDING until every node accepted its launch, which takes a second), and
    /// for good once the node left the allocation: 15 tries 2 s apart outlast a dispatch
    /// many times over and end.
    #[arg(
        long,
        env = "SPUR_OPERATOR_REPORT_REFUSAL_RETRIES",
        default_value_t = 15
    )]
    pub report_refusal_retries: u32,

    /// The delay between those tries; also how long a failure policy's restart waits before
    /// it tries again while its job is still being dispatched (it cannot be requeued then).
    #[arg(long, env = "SPUR_OPERATOR_REPORT_REFUSAL_DELAY", default_value = "2s", value_parser = parse_duration)]
    pub report_refusal_delay: Duration,
}

/// The agent's token check, validated.
#[derive(Clone, Debug)]
pub struct AgentAuthConfig {
    pub mode: AgentAuthMode,
    pub key: Option<AgentKey>,
    pub leeway: Duration,
}

/// The agent key's bytes; never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct AgentKey(pub Vec<u8>);

impl fmt::Debug for AgentKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AgentKey(<{} bytes>)", self.0.len())
    }
}

fn read_agent_key(path: &Path) -> Result<AgentKey, ConfigError> {
    const FLAG: &str = "--agent-auth-key-file";
    let key = read_file(FLAG, path)?;
    agent_key_from(FLAG, &path.display().to_string(), key)
}

/// The key from its bytes as given (`what` names where they came from).
fn agent_key_from(
    flag: &'static str,
    what: &str,
    mut key: Vec<u8>,
) -> Result<AgentKey, ConfigError> {
    // Files written by `echo` or an editor end in a newline that is not part of the key.
    if key.ends_with(b"\n") {
        key.pop();
        if key.ends_with(b"\r") {
            key.pop();
        }
    }
    // Any length spurctld signs with is accepted (a short one is warned about where the
    // key is used, `AgentAuth::new`); an empty key is refused: under one spurctld sends no
    // token at all, so checking tokens against it is a configuration error.
    if key.is_empty() {
        return Err(ConfigError::Invalid {
            flag,
            reason: format!("{what} is empty; spurctld sends no token under an empty jwt_key"),
        });
    }
    Ok(AgentKey(key))
}

/// The agent address when `--agent-address` is unset: upstream's `SPUR_OPERATOR_ADDRESS`,
/// then `POD_IP` (the Downward API's status.podIP), as upstream's operator falls back.
/// Blank values count as unset.
pub fn fallback_agent_address(
    upstream_address: Option<String>,
    pod_ip: Option<String>,
) -> Option<String> {
    [upstream_address, pod_ip]
        .into_iter()
        .flatten()
        .find(|a| !a.trim().is_empty())
}

/// The validated form of [`RunArgs`].
#[derive(Clone, Debug)]
pub struct OperatorConfig {
    pub controller: ControllerSettings,
    pub agent_auth: AgentAuthConfig,
    pub kubeconfig: Option<PathBuf>,
    pub node_selector: Selector,
    pub agent_listen: SocketAddr,
    pub health_listen: SocketAddr,
    pub probe_timeout: Duration,
    /// The retry of one object's failed or refused work (`--retry-*`): SpurJobs, pod
    /// reports, the watches; node sync takes the same (`node_sync.retry`).
    pub retry: BackoffPolicy,
    pub node_sync: NodeSyncConfig,
    pub heartbeat: HeartbeatConfig,
    pub lease: LeaseConfig,
    pub shutdown_grace: Duration,
    pub status_poll_interval: Duration,
    pub job_lost_after: Duration,
    pub submit_read_back: Option<Duration>,
    pub reconcile_concurrency: u16,
    /// The SpurJob refusal and report tunables (`--submit-precondition-retry`,
    /// `--report-refusal-*`).
    pub jobs: JobsTuning,
    /// Bound on one LaunchJob's Kubernetes work (`--agent-launch-timeout`).
    pub agent_launch_timeout: Duration,
    /// Bounds on one exec into a job's pod (`--agent-exec-*`).
    pub agent_exec: crate::job_io::ExecLimits,
    /// The user a SpurJob without a `spur.amd.com/user` annotation submits as.
    pub default_user: String,
    /// How long a repeated Event joins its first one's series (`--event-series-window`).
    pub event_series_window: Duration,
}

impl RunArgs {
    pub fn validate(&self) -> Result<OperatorConfig, ConfigError> {
        let controller = self.controller.validate()?;
        let node_selector =
            Selector::parse(&self.node_selector).map_err(|e| ConfigError::Invalid {
                flag: "--node-selector",
                reason: e.to_string(),
            })?;
        let agent_address = self
            .agent_address
            .clone()
            .filter(|a| !a.trim().is_empty())
            .ok_or(ConfigError::Invalid {
                flag: "--agent-address",
                reason:
                    "required: the address spurctld dials back (the pod IP, from the Downward API)"
                        .into(),
            })?;
        let agent_key = match (&self.agent_auth_key_file, &self.agent_auth_key) {
            (Some(path), _) => Some(read_agent_key(path)?),
            (None, Some(value)) => Some(agent_key_from(
                "--agent-auth-key",
                "the value",
                value.as_bytes().to_vec(),
            )?),
            (None, None) => None,
        };
        if self.agent_auth == AgentAuthMode::Required && agent_key.is_none() {
            return Err(ConfigError::Invalid {
                flag: "--agent-auth",
                reason:
                    "`required` needs --agent-auth-key-file (or --agent-auth-key): without a key no token can be verified"
                        .into(),
            });
        }
        if self.enable_quota {
            return Err(ConfigError::Invalid {
                flag: "--enable-quota",
                reason: "upstream's quota reconciler (per-account Namespace, ResourceQuota, LimitRange and RBAC) is not part of this operator; run without the flag and keep quotas in your own manifests (docs/migrating.md)".into(),
            });
        }
        if !(0.0..=1.0).contains(&self.retry_jitter) {
            return Err(ConfigError::Invalid {
                flag: "--retry-jitter",
                reason: "must be a fraction between 0 and 1".into(),
            });
        }
        if self.retry_initial.is_zero() || self.retry_initial > self.retry_max {
            return Err(ConfigError::Invalid {
                flag: "--retry-initial",
                reason: "must be above zero and at most --retry-max".into(),
            });
        }
        if self.status_poll_interval.is_zero() {
            return Err(ConfigError::Invalid {
                flag: "--status-poll-interval",
                reason: "must be above zero".into(),
            });
        }
        if !self.duplicate_watch.is_zero() && self.duplicate_watch_interval.is_zero() {
            return Err(ConfigError::Invalid {
                flag: "--duplicate-watch-interval",
                reason: "must be above zero while --duplicate-watch is on".into(),
            });
        }
        if self.agent_launch_timeout.is_zero() {
            return Err(ConfigError::Invalid {
                flag: "--agent-launch-timeout",
                reason: "must be above zero".into(),
            });
        }
        if self.agent_exec_timeout.is_zero() {
            return Err(ConfigError::Invalid {
                flag: "--agent-exec-timeout",
                reason: "must be above zero".into(),
            });
        }
        if self.agent_exec_output_limit == 0 {
            return Err(ConfigError::Invalid {
                flag: "--agent-exec-output-limit",
                reason: "must be above zero (a command's output would always be dropped)".into(),
            });
        }
        if self.default_user.trim().is_empty() {
            return Err(ConfigError::Invalid {
                flag: "--default-user",
                reason: "must name a user".into(),
            });
        }
        if self.heartbeat_interval.is_zero() {
            return Err(ConfigError::Invalid {
                flag: "--heartbeat-interval",
                reason: "must be above zero".into(),
            });
        }
        let identity = self
            .identity
            .clone()
            .or_else(|| std::env::var("HOSTNAME").ok())
            .filter(|i| !i.is_empty())
            .ok_or(ConfigError::Invalid {
                flag: "--identity",
                reason: "required when HOSTNAME is unset".into(),
            })?;
        let lease = LeaseConfig {
            name: self.lease_name.clone(),
            namespace: self.namespace.clone(),
            identity,
            lease_duration: self.lease_duration,
            renew_deadline: self.lease_renew_deadline,
            retry_period: self.lease_retry_period,
            call_timeout: self.kube_call_timeout,
        };
        lease.validate().map_err(|reason| ConfigError::Invalid {
            flag: "--lease-*",
            reason,
        })?;
        let retry = BackoffPolicy {
            initial: self.retry_initial,
            max: self.retry_max,
            jitter: self.retry_jitter,
            transient: self.retry_transient.0,
        };
        Ok(OperatorConfig {
            controller,
            agent_auth: AgentAuthConfig {
                mode: self.agent_auth,
                key: agent_key,
                leeway: self.agent_auth_leeway,
            },
            kubeconfig: self.kubeconfig.clone(),
            node_selector,
            agent_listen: self.agent_listen,
            health_listen: self.health_listen,
            probe_timeout: self.probe_timeout,
            retry,
            node_sync: NodeSyncConfig {
                concurrency: self.register_concurrency,
                retry,
                failure_log_interval: self.failure_log_interval,
                agent: AgentEndpoint {
                    address: agent_address,
                    port: self.agent_listen.port(),
                },
                version: concat!("spur-operator/", env!("CARGO_PKG_VERSION")).to_owned(),
                not_ready: self.not_ready_node_state,
                drain_conditions: self
                    .drain_on_node_condition
                    .iter()
                    .map(|c| c.trim().to_owned())
                    .filter(|c| !c.is_empty())
                    .collect(),
            },
            heartbeat: HeartbeatConfig {
                interval: self.heartbeat_interval,
                concurrency: self.heartbeat_concurrency,
            },
            lease,
            shutdown_grace: self.shutdown_grace,
            status_poll_interval: self.status_poll_interval,
            job_lost_after: self.job_lost_after,
            submit_read_back: self.submit_read_back.0,
            reconcile_concurrency: self.reconcile_concurrency,
            jobs: JobsTuning {
                precondition_retry: self.submit_precondition_retry,
                report_refusal_retries: self.report_refusal_retries,
                report_refusal_delay: self.report_refusal_delay,
                lost_after: self.job_lost_after,
                duplicate_watch: self.duplicate_watch,
                duplicate_watch_interval: self.duplicate_watch_interval,
            },
            agent_launch_timeout: self.agent_launch_timeout,
            agent_exec: crate::job_io::ExecLimits {
                timeout: self.agent_exec_timeout,
                output_bytes: self.agent_exec_output_limit,
            },
            default_user: self.default_user.trim().to_owned(),
            event_series_window: self.event_series_window,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::controller::{ChannelConfig, Rule};

    #[test]
    fn the_agent_address_falls_back_to_upstreams_variable_then_the_pod_ip() {
        let some = |v: &str| Some(v.to_owned());
        assert_eq!(
            fallback_agent_address(some("op.spur.svc"), some("10.0.0.7")),
            some("op.spur.svc")
        );
        assert_eq!(
            fallback_agent_address(some(" "), some("10.0.0.7")),
            some("10.0.0.7")
        );
        assert_eq!(
            fallback_agent_address(None, some("10.0.0.7")),
            some("10.0.0.7")
        );
        assert_eq!(fallback_agent_address(None, some("")), None);
    }
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        controller: ControllerArgs,
    }

    fn parse(args: &[&str]) -> Result<ControllerSettings, String> {
        let cli = Cli::try_parse_from(std::iter::once("test").chain(args.iter().copied()))
            .map_err(|e| e.to_string())?;
        cli.controller.validate().map_err(|e| e.to_string())
    }

    #[test]
    fn flag_defaults_match_the_config_defaults() {
        let settings = parse(&[]).unwrap();
        assert_eq!(settings.channel, ChannelConfig::default());
        assert_eq!(settings.addr.to_string(), "http://spurctld:6817");
        assert_eq!(settings.token, None);
    }

    #[test]
    fn channel_rules_can_be_switched_off_by_name_and_a_wrong_name_is_named() {
        let settings = parse(&["--controller-rules-off", "hedge,rotate"]).unwrap();
        assert_eq!(
            settings.channel.rules_off,
            BTreeSet::from([Rule::Hedge, Rule::Rotate])
        );
        assert_eq!(settings.channel.hedge(), None);
        let err = parse(&["--controller-rules-off", "hedge,recheck"]).unwrap_err();
        assert!(err.contains("unknown rule `recheck`"), "{err}");
    }

    #[test]
    fn keepalive_finds_a_dead_peer_before_the_request_bound_fires() {
        let c = ChannelConfig::default();
        let keepalive = c.keepalive.unwrap();
        assert!(keepalive.interval + keepalive.timeout < c.request_timeout.unwrap());
    }

    #[test]
    fn transient_retry_range_parses() {
        assert_eq!(
            parse_range("250ms..1s"),
            Ok(RetryRange(Some((
                Duration::from_millis(250),
                Duration::from_secs(1)
            ))))
        );
        assert_eq!(parse_range("off"), Ok(RetryRange(None)));
        assert!(parse_range("2s..1s").is_err() && parse_range("1s").is_err());
    }

    #[test]
    fn bounds_parse_and_switch_off() {
        let settings = parse(&[
            "--controller-connect-timeout",
            "2s",
            "--controller-request-timeout",
            "off",
            "--controller-keepalive-interval",
            "1m 30s",
            "--controller-keepalive-timeout",
            "750ms",
        ])
        .unwrap();
        assert_eq!(
            settings.channel.connect_timeout,
            Some(Duration::from_secs(2))
        );
        assert_eq!(settings.channel.request_timeout, None);
        let keepalive = settings.channel.keepalive.unwrap();
        assert_eq!(keepalive.interval, Duration::from_secs(90));
        assert_eq!(keepalive.timeout, Duration::from_millis(750));

        let off = parse(&["--controller-keepalive-interval", "off"]).unwrap();
        assert_eq!(off.channel.keepalive, None);
    }

    #[test]
    fn bad_values_name_their_flag() {
        let err = parse(&["--controller-connect-timeout", "soon"]).unwrap_err();
        assert!(err.contains("--controller-connect-timeout"), "{err}");
        let err = parse(&["--controller-request-timeout", "0s"]).unwrap_err();
        assert!(err.contains("zero"), "{err}");
        let err = parse(&["--controller-addr", "ftp://x:1"]).unwrap_err();
        assert!(err.starts_with("--controller-addr:"), "{err}");
        let err = parse(&["--controller-tls-ca-file", "/nonexistent"]).unwrap_err();
        assert!(err.contains("not https://"), "{err}");
        let err = parse(&[
            "--controller-addr",
            "https://spurctld:6817",
            "--controller-tls-ca-file",
            "/nonexistent/ca.pem",
        ])
        .unwrap_err();
        assert!(
            err.starts_with("--controller-tls-ca-file: cannot read /nonexistent/ca.pem"),
            "{err}"
        );
        let err = parse(&[
            "--controller-addr",
            "https://spurctld:6817",
            "--controller-tls-cert-file",
            "/nonexistent/cert.pem",
        ])
        .unwrap_err();
        assert!(
            err.starts_with("--controller-tls-key-file: required"),
            "{err}"
        );
    }

    #[test]
    fn launch_timeout_and_default_user() {
        let config = parse_run(&[]).unwrap();
        assert_eq!(config.agent_launch_timeout, Duration::from_secs(10));
        assert_eq!(config.default_user, "k8s");
        let config =
            parse_run(&["--agent-launch-timeout", "2s", "--default-user", " batch "]).unwrap();
        assert_eq!(config.agent_launch_timeout, Duration::from_secs(2));
        assert_eq!(config.default_user, "batch");
        let err = parse_run(&["--agent-launch-timeout", "0s"]).unwrap_err();
        assert!(err.contains("--agent-launch-timeout"), "{err}");
        assert_eq!(config.agent_exec, crate::job_io::ExecLimits::default());
        assert_eq!(config.agent_exec.timeout, Duration::from_secs(60));
        assert_eq!(config.agent_exec.output_bytes, 1 << 20);
        let err = parse_run(&["--agent-exec-timeout", "0s"]).unwrap_err();
        assert!(err.contains("--agent-exec-timeout"), "{err}");
        let err = parse_run(&["--agent-exec-output-limit", "0"]).unwrap_err();
        assert!(err.contains("--agent-exec-output-limit"), "{err}");
        let err = parse_run(&["--default-user", " "]).unwrap_err();
        assert!(err.contains("--default-user"), "{err}");
    }

    #[test]
    fn token_file_is_trimmed_and_checked() {
        let dir = std::env::temp_dir().join(format!("spur-token-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("good");
        std::fs::write(&good, "s3cr3t-token\n").unwrap();
        let bad = dir.join("bad");
        std::fs::write(&bad, "two words").unwrap();
        let empty = dir.join("empty");
        std::fs::write(&empty, "\n").unwrap();

        let settings = parse(&["--controller-token-file", good.to_str().unwrap()]).unwrap();
        assert_eq!(settings.token.as_deref(), Some("s3cr3t-token"));
        let err = parse(&["--controller-token-file", bad.to_str().unwrap()]).unwrap_err();
        assert!(err.contains("visible ASCII"), "{err}");
        let err = parse(&["--controller-token-file", empty.to_str().unwrap()]).unwrap_err();
        assert!(err.contains("is empty"), "{err}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[derive(Parser)]
    struct RunCli {
        #[command(flatten)]
        run: RunArgs,
    }

    fn parse_run(args: &[&str]) -> Result<OperatorConfig, String> {
        let base = ["test", "--agent-address", "127.0.0.1", "--identity", "op-0"];
        let cli = RunCli::try_parse_from(base.iter().chain(args.iter()).copied())
            .map_err(|e| e.to_string())?;
        cli.run.validate().map_err(|e| e.to_string())
    }

    #[test]
    fn agent_auth_needs_a_key_when_required() {
        let dir = std::env::temp_dir().join(format!("spur-agent-key-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("good");
        std::fs::write(&good, "0123456789abcdef0123456789abcdef\n").unwrap();
        let short = dir.join("short");
        std::fs::write(&short, "too-short\n").unwrap();

        let config = parse_run(&[]).unwrap();
        assert_eq!(config.agent_auth.mode, AgentAuthMode::Permissive);
        assert!(config.agent_auth.key.is_none());
        assert_eq!(config.agent_auth.leeway, Duration::from_secs(30));

        let err = parse_run(&["--agent-auth", "required"]).unwrap_err();
        assert!(
            err.contains("--agent-auth: `required` needs --agent-auth-key-file"),
            "{err}"
        );
        let config = parse_run(&[
            "--agent-auth",
            "required",
            "--agent-auth-key-file",
            good.to_str().unwrap(),
        ])
        .unwrap();
        // The trailing newline is not part of the key, and the key is never printed.
        assert_eq!(
            config.agent_auth.key.as_ref().unwrap().0,
            b"0123456789abcdef0123456789abcdef"
        );
        assert!(!format!("{config:?}").contains("0123456789abcdef"));
        // Any length spurctld signs with is accepted; an empty key is not.
        let config = parse_run(&["--agent-auth-key-file", short.to_str().unwrap()]).unwrap();
        assert_eq!(config.agent_auth.key.as_ref().unwrap().0, b"too-short");
        let empty = dir.join("empty");
        std::fs::write(&empty, "\n").unwrap();
        let err = parse_run(&["--agent-auth-key-file", empty.to_str().unwrap()]).unwrap_err();
        assert!(err.contains("is empty"), "{err}");
        let err = parse_run(&["--agent-auth", "sometimes"]).unwrap_err();
        assert!(err.contains("required, permissive, disabled"), "{err}");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
