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

use crate::agent::AgentArgs;
use crate::agent_auth::AgentAuthMode;
use crate::controller::{ControllerArgs, ControllerSettings};
use crate::flags::{ConfigError, parse_duration, read_file};
use crate::jobs::{JobsArgs, JobsTuning};
use crate::lease::{LeaseArgs, LeaseConfig};
use crate::nodes::heartbeat::HeartbeatConfig;
use crate::nodes::{AgentEndpoint, NodeArgs, NodeSyncConfig};
use crate::retry::{BackoffPolicy, RetryArgs};
use crate::selector::Selector;

/// Everything `spur-operator run` takes: the controller channel's flags, the operator's
/// own, then each module's (node sync, the agent, retries, the Lease, SpurJobs). Each
/// default carries its reason.
/// The namespace when nothing names the operator's own: the one this project's manifests
/// deploy to.
pub const DEFAULT_NAMESPACE: &str = "spur-system";

/// Where the operator's namespace came from, for the start-up line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NamespaceSource {
    Flag,
    PodNamespace,
    ServiceAccount,
    Kubeconfig,
    Default,
}

impl std::fmt::Display for NamespaceSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            NamespaceSource::Flag => "--namespace",
            NamespaceSource::PodNamespace => "POD_NAMESPACE",
            NamespaceSource::ServiceAccount => "the in-cluster service account",
            NamespaceSource::Kubeconfig => "the kubeconfig's context",
            NamespaceSource::Default => "no other source: the default",
        })
    }
}

/// The operator's own namespace, from the first source that names one: the flag, the
/// Downward API's POD_NAMESPACE, the in-cluster service account, the kubeconfig context.
pub fn resolve_namespace(
    flag: Option<&str>,
    pod_namespace: Option<&str>,
    service_account: Option<&str>,
    kubeconfig: Option<&str>,
) -> (String, NamespaceSource) {
    [
        (flag, NamespaceSource::Flag),
        (pod_namespace, NamespaceSource::PodNamespace),
        (service_account, NamespaceSource::ServiceAccount),
        (kubeconfig, NamespaceSource::Kubeconfig),
    ]
    .into_iter()
    .find_map(|(value, source)| {
        let value = value?.trim();
        (!value.is_empty()).then(|| (value.to_owned(), source))
    })
    .unwrap_or_else(|| (DEFAULT_NAMESPACE.to_owned(), NamespaceSource::Default))
}

#[derive(Args, Clone, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub controller: ControllerArgs,

    /// Kubeconfig to use; in-cluster configuration (or the default kubeconfig) when unset.
    #[arg(long, env = "SPUR_OPERATOR_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,

    /// Namespace of the operator's Lease: the operator's own. Unset, it is POD_NAMESPACE
    /// (the Downward API's metadata.namespace, as upstream's manifests set it), else the
    /// in-cluster service account's, else the kubeconfig context's, else spur-system
    /// (this project's manifests).
    #[arg(long, env = "SPUR_OPERATOR_NAMESPACE")]
    pub namespace: Option<String>,

    /// This replica's name in the Lease; the pod name (HOSTNAME) when unset.
    #[arg(long, env = "SPUR_OPERATOR_IDENTITY")]
    pub identity: Option<String>,

    /// Upstream's quota reconciler switch. Not provided here: set, the operator refuses
    /// to start and says so, rather than run without the quotas a team relies on.
    #[arg(long, hide = true)]
    pub enable_quota: bool,

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

    /// Bound on each readiness probe (the API server's version; the controller channel's
    /// probe read, which a replica answers only while it serves forwarded reads). Below
    /// kubelet's default probe timeout, so /readyz answers with a reason instead of timing
    /// out.
    #[arg(long, env = "SPUR_OPERATOR_PROBE_TIMEOUT", default_value = "2s", value_parser = parse_duration)]
    pub probe_timeout: Duration,

    /// On SIGTERM, how long calls in flight may take to finish before the process exits.
    /// Under Kubernetes' default 30 s grace period.
    #[arg(long, env = "SPUR_OPERATOR_SHUTDOWN_GRACE", default_value = "10s", value_parser = parse_duration)]
    pub shutdown_grace: Duration,

    #[command(flatten)]
    pub nodes: NodeArgs,

    #[command(flatten)]
    pub agent: AgentArgs,

    #[command(flatten)]
    pub retry: RetryArgs,

    #[command(flatten)]
    pub lease: LeaseArgs,

    #[command(flatten)]
    pub jobs: JobsArgs,
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
    pub status_read_at_once: bool,
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
            Selector::parse(&self.nodes.node_selector).map_err(|e| ConfigError::Invalid {
                flag: "--node-selector",
                reason: e.to_string(),
            })?;
        let agent_address = self.agent_address()?;
        let agent_auth = self.agent_auth()?;
        self.check_values()?;
        let lease = self.lease_config()?;
        let retry = BackoffPolicy {
            initial: self.retry.retry_initial,
            max: self.retry.retry_max,
            jitter: self.retry.retry_jitter,
            transient: self.retry.retry_transient.0,
        };
        Ok(OperatorConfig {
            controller,
            agent_auth,
            kubeconfig: self.kubeconfig.clone(),
            node_selector,
            agent_listen: self.agent.agent_listen,
            health_listen: self.health_listen,
            probe_timeout: self.probe_timeout,
            retry,
            node_sync: self.node_sync_config(agent_address, retry)?,
            heartbeat: HeartbeatConfig {
                interval: self.nodes.heartbeat_interval,
                concurrency: self.nodes.heartbeat_concurrency,
            },
            lease,
            shutdown_grace: self.shutdown_grace,
            status_poll_interval: self.jobs.status_poll_interval,
            status_read_at_once: self.jobs.status_read_at_once,
            job_lost_after: self.jobs.job_lost_after,
            submit_read_back: self.jobs.submit_read_back.0,
            reconcile_concurrency: self.jobs.reconcile_concurrency,
            jobs: JobsTuning {
                precondition_retry: self.jobs.submit_precondition_retry,
                report_refusal_retries: self.jobs.report_refusal_retries,
                report_refusal_delay: self.jobs.report_refusal_delay,
                lost_after: self.jobs.job_lost_after,
                duplicate_watch: self.jobs.duplicate_watch,
                duplicate_watch_interval: self.jobs.duplicate_watch_interval,
            },
            agent_launch_timeout: self.agent.agent_launch_timeout,
            agent_exec: crate::job_io::ExecLimits {
                timeout: self.agent.agent_exec_timeout,
                output_bytes: self.agent.agent_exec_output_limit,
            },
            default_user: self.jobs.default_user.trim().to_owned(),
            event_series_window: self.event_series_window,
        })
    }

    /// The address spurctld dials back: without one no launch can reach this replica.
    fn agent_address(&self) -> Result<String, ConfigError> {
        self.agent
            .agent_address
            .clone()
            .filter(|a| !a.trim().is_empty())
            .ok_or(ConfigError::Invalid {
                flag: "--agent-address",
                reason:
                    "required: the address spurctld dials back (the pod IP, from the Downward API)"
                        .into(),
            })
    }

    /// How the agent checks spurctld's tokens, with the key read from its file or flag.
    fn agent_auth(&self) -> Result<AgentAuthConfig, ConfigError> {
        let agent_key = match (&self.agent.agent_auth_key_file, &self.agent.agent_auth_key) {
            (Some(path), _) => Some(read_agent_key(path)?),
            (None, Some(value)) => Some(agent_key_from(
                "--agent-auth-key",
                "the value",
                value.as_bytes().to_vec(),
            )?),
            (None, None) => None,
        };
        if self.agent.agent_auth == AgentAuthMode::Required && agent_key.is_none() {
            return Err(ConfigError::Invalid {
                flag: "--agent-auth",
                reason:
                    "`required` needs --agent-auth-key-file (or --agent-auth-key): without a key no token can be verified"
                        .into(),
            });
        }
        Ok(AgentAuthConfig {
            mode: self.agent.agent_auth,
            key: agent_key,
            leeway: self.agent.agent_auth_leeway,
        })
    }

    /// Refuses the first value that cannot work, in the order listed: each check is one
    /// flag's (or two flags') own, so a table reads better than a chain of `if`s.
    fn check_values(&self) -> Result<(), ConfigError> {
        let (retry, jobs, agent) = (&self.retry, &self.jobs, &self.agent);
        let refusals = [
            (
                self.enable_quota,
                "--enable-quota",
                "upstream's quota reconciler (per-account Namespace, ResourceQuota, LimitRange and RBAC) is not part of this operator; run without the flag and keep quotas in your own manifests (docs/migrating.md)",
            ),
            (
                !(0.0..=1.0).contains(&retry.retry_jitter),
                "--retry-jitter",
                "must be a fraction between 0 and 1",
            ),
            (
                retry.retry_initial.is_zero() || retry.retry_initial > retry.retry_max,
                "--retry-initial",
                "must be above zero and at most --retry-max",
            ),
            (
                jobs.status_poll_interval.is_zero(),
                "--status-poll-interval",
                "must be above zero",
            ),
            (
                !jobs.duplicate_watch.is_zero() && jobs.duplicate_watch_interval.is_zero(),
                "--duplicate-watch-interval",
                "must be above zero while --duplicate-watch is on",
            ),
            (
                agent.agent_launch_timeout.is_zero(),
                "--agent-launch-timeout",
                "must be above zero",
            ),
            (
                agent.agent_exec_timeout.is_zero(),
                "--agent-exec-timeout",
                "must be above zero",
            ),
            (
                agent.agent_exec_output_limit == 0,
                "--agent-exec-output-limit",
                "must be above zero (a command's output would always be dropped)",
            ),
            (
                jobs.default_user.trim().is_empty(),
                "--default-user",
                "must name a user",
            ),
            (
                self.nodes.heartbeat_interval.is_zero(),
                "--heartbeat-interval",
                "must be above zero",
            ),
        ];
        match refusals.into_iter().find(|(refused, _, _)| *refused) {
            Some((_, flag, reason)) => Err(ConfigError::Invalid {
                flag,
                reason: reason.into(),
            }),
            None => Ok(()),
        }
    }

    /// The election's settings; the identity falls back to `HOSTNAME`, the pod's name.
    fn lease_config(&self) -> Result<LeaseConfig, ConfigError> {
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
            name: self.lease.lease_name.clone(),
            namespace: self
                .namespace
                .clone()
                .unwrap_or_else(|| DEFAULT_NAMESPACE.to_owned()),
            identity,
            lease_duration: self.lease.lease_duration,
            renew_deadline: self.lease.lease_renew_deadline,
            retry_period: self.lease.lease_retry_period,
            call_timeout: self.lease.kube_call_timeout,
        };
        lease.validate().map_err(|reason| ConfigError::Invalid {
            flag: "--lease-*",
            reason,
        })?;
        Ok(lease)
    }

    /// Node sync's settings: registrations name `agent_address` as the agent's, and a
    /// failed node call backs off by `retry`, as every other object's does.
    fn node_sync_config(
        &self,
        agent_address: String,
        retry: BackoffPolicy,
    ) -> Result<NodeSyncConfig, ConfigError> {
        let join_token = match &self.nodes.controller_join_token_file {
            Some(path) => Some(crate::nodes::JoinToken::load(path)?),
            None => None,
        };
        Ok(NodeSyncConfig {
            concurrency: self.nodes.register_concurrency,
            retry,
            failure_log_interval: self.nodes.failure_log_interval,
            agent: AgentEndpoint {
                address: agent_address,
                port: self.agent.agent_listen.port(),
            },
            version: concat!("spur-operator/", env!("CARGO_PKG_VERSION")).to_owned(),
            not_ready: self.nodes.not_ready_node_state,
            drain_conditions: self
                .nodes
                .drain_on_node_condition
                .iter()
                .map(|c| c.trim().to_owned())
                .filter(|c| !c.is_empty())
                .collect(),
            join_token,
            node_token_renew_before: self.nodes.node_token_renew_before,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_namespace_is_the_first_source_that_names_one() {
        use NamespaceSource as S;
        let cases = [
            (
                (Some("flag"), Some("pod"), Some("sa"), Some("ctx")),
                ("flag", S::Flag),
            ),
            (
                (None, Some("spur"), Some("sa"), Some("ctx")),
                ("spur", S::PodNamespace),
            ),
            (
                (None, Some(" "), Some("sa\n"), Some("ctx")),
                ("sa", S::ServiceAccount),
            ),
            ((None, None, None, Some("ctx")), ("ctx", S::Kubeconfig)),
            ((None, None, None, None), (DEFAULT_NAMESPACE, S::Default)),
        ];
        for ((flag, pod, sa, ctx), (want, source)) in cases {
            assert_eq!(
                resolve_namespace(flag, pod, sa, ctx),
                (want.to_owned(), source),
                "{flag:?} {pod:?} {sa:?} {ctx:?}"
            );
        }
    }

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

    use clap::Parser;

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
