//! "A Kubernetes made of processes": a kubelet that runs the pods bound to its node as real
//! Linux processes, each pod in network and UTS namespaces of its own on a bridge.
//!
//! - [`images`]: which host program an image and command run;
//! - [`pod_net`]: the bridge, each pod's namespaces, veth and address;
//! - [`containers`]: a container's environment, command line and process;
//! - [`pod_state`]: a pod's containers through starts, exits, restarts and probes, and the
//!   status they make;
//! - [`cgroup`]: a memory cgroup a container, limited as its spec says, and whether the
//!   kernel's OOM killer acted in it;
//! - [`probes`]: readiness and liveness;
//! - [`mounts`]: a container's filesystem: an overlay of the host's root, its volumes, the
//!   cluster's hosts file;
//! - [`volumes`]: a pod's volumes made on the host (configMap, secret, emptyDir, claims,
//!   hostPath, projected, the service-account credentials);
//! - [`pod_io`]: the pods' log, exec, port-forward and proxy, as the API server serves them;
//! - [`kubelet`]: the loop that reads the API server and drives all of the above;
//! - [`dns`], [`claims`], [`services`]: the cluster's DNS as hosts files, claims bound to
//!   directories and `default` ServiceAccounts, Services' clusterIPs as kube-proxy's rules;
//! - [`network_policy`]: NetworkPolicies as nftables rules on the cluster's forward hook;
//! - [`up`]: `spur-sim cluster`, all of it behind one command and a kubeconfig.
//!
//! The caller runs [`run_kubelet`] inside a private network namespace of its own
//! ([`crate::kernel::enter_private_network`]), on a thread that outlives the pods (each
//! process dies with the thread that forked it). The kubelet stops when its future is
//! dropped: every process, namespace, veth and the bridge go with it.

pub mod cgroup;
pub mod claims;
pub mod containers;
pub mod dns;
pub mod images;
pub mod kubelet;
pub mod mounts;
pub mod network_policy;
pub mod pod_io;
pub mod pod_net;
pub mod pod_state;
pub mod probes;
pub mod services;
pub mod up;
pub mod volumes;

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

pub use kubelet::run_kubelet;

/// Runs `pass` for ever, once each `period`; a failed pass is reported (as `what: error`)
/// once until its error changes, and tried again at the next period. The cluster's
/// controllers (DNS, claims, Services) are such loops.
pub(crate) async fn every<T>(
    period: Duration,
    what: &str,
    mut pass: impl FnMut() -> anyhow::Result<T>,
) {
    let mut ticks = tokio::time::interval(period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_error = None;
    loop {
        ticks.tick().await;
        let error = pass().err().map(|e| format!("{e:#}"));
        if error.is_some() && error != last_error {
            eprintln!("{what}: {}", error.as_deref().unwrap_or_default());
        }
        last_error = error;
    }
}

/// The kubelet's settings.
#[derive(Clone, Debug)]
pub struct KubeletConfig {
    /// Which program each image runs.
    pub images: images::ImageTable,
    /// Where each pod's container logs go (`<dir>/<namespace>_<pod>_<uid>/<container>.log`).
    pub log_dir: PathBuf,
    /// The pod network (default 10.244.0.0/16, flannel's and kind's): its first address is
    /// the bridge's, the rest the pods'.
    pub pod_cidr: (Ipv4Addr, u8),
    /// The bridge's name (default `spurbr0`: short, as link names are at most 15 bytes).
    pub bridge: String,
    /// How often pods, processes and probes are looked at (default 200 ms: a restart or a
    /// probe's verdict shows within it, and a poll of one node's pods costs little).
    pub sync_period: Duration,
    /// The first delay before restarting a container that exited (default 10 s, the
    /// kubelet's); it doubles at each exit up to `restart_backoff_max`.
    pub restart_backoff: Duration,
    /// The longest restart delay (default 300 s, the kubelet's).
    pub restart_backoff_max: Duration,
    /// A container that ran this long before exiting restarts after `restart_backoff`
    /// again (default 10 min, the kubelet's).
    pub backoff_reset: Duration,
    /// The first delay before pulling an unmapped image again (default 10 s, the kubelet's
    /// image back-off); doubles up to `restart_backoff_max`. The table is re-read at
    /// each try, so an image added meanwhile starts.
    pub image_backoff: Duration,
    /// A container's grace after a liveness probe failed: SIGTERM, then SIGKILL after this
    /// (default 2 s: the probe already waited failureThreshold periods).
    pub liveness_grace: Duration,
    /// Grace after deletion when a pod's spec has no terminationGracePeriodSeconds (30 s,
    /// the API's default). The simulated API server stamps deletionGracePeriodSeconds 0 on
    /// every delete, so the spec's value is the one honoured.
    pub default_grace: Duration,
    /// The finalizer this kubelet puts on every pod it runs, so a deletion waits for its
    /// processes to stop (the simulated API server removes a pod at once otherwise).
    pub finalizer: String,
    /// How long a pod whose volume could not be made waits before the next try (default
    /// 2 s: a claim is bound within a pass of the claims controller, and a real kubelet's
    /// first volume retries are as quick).
    pub mount_retry: Duration,
    /// How often a running pod's configMap, secret, downwardAPI and projected volumes are
    /// brought up to date (default 2 s: a real kubelet takes up to its sync period, a
    /// minute, plus its cache's TTL; here an edit shows while one watches, for one read of
    /// the in-memory API server a volume a pod a period).
    pub volume_refresh: Duration,
    /// The cluster's hosts files, `<dir>/<namespace>` bound at each container's
    /// `/etc/hosts` ([`dns`]); `None`: the host's.
    pub hosts_dir: Option<PathBuf>,
    /// Where bound claims live (`<dir>/<namespace>/<claim>`, [`claims`]; default
    /// `<log_dir>/claims`).
    pub claims_dir: PathBuf,
    /// Issues the tokens of service-account volumes and the automatic credentials, and
    /// tells pods where the API server is; `None`: pods get no credentials.
    pub service_accounts: Option<ServiceAccountIssuer>,
    /// Where containers' memory cgroups go, shared by every node's kubelet; `None`: memory
    /// limits are not enforced (no cgroup, so no `OOMKilled`).
    pub memory_cgroups: Option<Arc<cgroup::MemoryCgroups>>,
    /// Where the kubelet records each running container's process, for exec and
    /// port-forward ([`pod_io`]); clones share it, so every node's kubelet fills in one.
    pub processes: pod_io::ContainerProcesses,
}

/// The token issuer and the API server's address a pod is given.
#[derive(Clone)]
pub struct ServiceAccountIssuer {
    /// A token of ServiceAccount `(namespace, name)`; `Err` names why none is issued.
    #[allow(clippy::type_complexity)]
    pub token: Arc<dyn Fn(&str, &str) -> Result<String, String> + Send + Sync>,
    /// The CA a pod's `ca.crt` holds.
    pub ca_pem: String,
    /// `KUBERNETES_SERVICE_HOST` and `KUBERNETES_SERVICE_PORT`.
    pub host: String,
    pub port: u16,
}

impl std::fmt::Debug for ServiceAccountIssuer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceAccountIssuer")
            .field("host", &self.host)
            .field("port", &self.port)
            .finish_non_exhaustive()
    }
}

impl KubeletConfig {
    /// The defaults above, with `images` and logs under `log_dir`.
    pub fn new(images: images::ImageTable, log_dir: PathBuf) -> Self {
        let claims_dir = log_dir.join("claims");
        Self {
            images,
            log_dir,
            pod_cidr: (Ipv4Addr::new(10, 244, 0, 0), 16),
            bridge: "spurbr0".into(),
            sync_period: Duration::from_millis(200),
            restart_backoff: Duration::from_secs(10),
            restart_backoff_max: Duration::from_secs(300),
            backoff_reset: Duration::from_secs(600),
            image_backoff: Duration::from_secs(10),
            liveness_grace: Duration::from_secs(2),
            default_grace: Duration::from_secs(30),
            finalizer: "spur.rocm.com/process-kubelet".into(),
            mount_retry: Duration::from_secs(2),
            volume_refresh: Duration::from_secs(2),
            hosts_dir: None,
            claims_dir,
            service_accounts: None,
            memory_cgroups: None,
            processes: pod_io::ContainerProcesses::default(),
        }
    }
}
