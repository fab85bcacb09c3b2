//! `spur-sim cluster`: a Kubernetes whose pods are processes. The simulated API server
//! (RBAC enforced, TLS as pods expect it), the workload controllers, the cluster's DNS as
//! hosts files, claims bound to directories, and a process kubelet per node, all in a
//! private network namespace; kubectl reaches the API server on the host's loopback
//! through the kubeconfig it writes.
//!
//! Everything the cluster starts lives in that namespace or dies with the process: the
//! namespace is unnamed (it goes with the last process in it), each pod's processes die
//! with the kubelet thread that forked them, and the kubelets remove their bridges when
//! they stop.

use std::io::Write as _;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use spur_fakes::api_server::service_ips::ServiceIpRange;
use spur_fakes::api_server::store::StoreConfig;
use spur_fakes::api_server::tls::{TlsConfig, TlsIdentity};
use spur_fakes::api_server::{ApiServer, ApiServerConfig};
use spur_fakes::clock::Clock;
use spur_fakes::clock::TimeSource;
use spur_fakes::workloads::{self, WorkloadsConfig};

use super::dns::{self, DnsConfig};
use super::images::ImageTable;
use super::{KubeletConfig, ServiceAccountIssuer, claims, network_policy, run_kubelet, services};

/// Where pods reach the API server: the first node's bridge address, which the cluster's
/// namespace owns, so every pod routes to it through its own node's gateway.
const API_ADDRESS: Ipv4Addr = Ipv4Addr::new(10, 244, 0, 1);
/// The API server's port for pods, kube-apiserver's default secure port.
const API_PORT: u16 = 6443;

/// Start a local Kubernetes whose pods run as processes; prints its kubeconfig. Needs root.
#[derive(clap::Args, Debug, Clone)]
pub struct ClusterArgs {
    /// The cluster's files: kubeconfig, CA, container logs, hosts files, claims. Emptied
    /// at start, so a cluster never inherits another's state.
    #[arg(long, default_value = "/tmp/spur-cluster")]
    pub dir: PathBuf,
    /// How many nodes (node-0, node-1, ...), each with a kubelet and a /24 of the pod
    /// network. Two by default: the operator's two replicas land on different nodes, and a
    /// two-node SpurJob has somewhere to run.
    #[arg(long, default_value_t = 2)]
    pub nodes: usize,
    /// Where kubectl reaches the API server on this machine (port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:6443")]
    pub listen: SocketAddr,
    /// More image table files (lines `REPOSITORY COMMAND PROGRAM`; see `--print-images`),
    /// read after the built-in table; a later line wins.
    #[arg(long = "images")]
    pub image_tables: Vec<PathBuf>,
    /// Print the image table in force and exit.
    #[arg(long)]
    pub print_images: bool,
}

/// Runs the cluster until SIGINT or SIGTERM.
pub fn main(args: ClusterArgs) -> anyhow::Result<bool> {
    let images = image_table(&args)?;
    if args.print_images {
        print!("{}", images.describe());
        return Ok(true);
    }
    if let Some(why) = crate::kernel::missing_tools() {
        anyhow::bail!("the cluster cannot start: {why}");
    }
    reset_dir(&args.dir)?;
    // Bound before the namespace changes, so kubectl on this machine can reach it.
    let host_listener = std::net::TcpListener::bind(args.listen)
        .map_err(|e| anyhow::anyhow!("--listen {}: {e}", args.listen))?;
    host_listener.set_nonblocking(true)?;
    crate::kernel::enter_private_network()?;
    // Pods on different nodes talk through the cluster's namespace, which routes
    // between the nodes' bridges.
    std::fs::write("/proc/sys/net/ipv4/ip_forward", "1")?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(run(args, images, host_listener))?;
    Ok(true)
}

/// The built-in image table and the user's files.
fn image_table(args: &ClusterArgs) -> anyhow::Result<ImageTable> {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut images = ImageTable::with_defaults(&workspace);
    for file in &args.image_tables {
        images.extend_from_file(file)?;
    }
    Ok(images)
}

fn reset_dir(dir: &Path) -> anyhow::Result<()> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => anyhow::bail!("--dir {}: cannot empty it: {e}", dir.display()),
    }
    std::fs::create_dir_all(dir)?;
    Ok(())
}

/// The cluster's parts, started in order; returns after a stop signal, once every kubelet
/// has removed what it made.
async fn run(
    args: ClusterArgs,
    images: ImageTable,
    host_listener: std::net::TcpListener,
) -> anyhow::Result<()> {
    let identity = TlsIdentity::generate(&TlsConfig::with_ips(vec![
        IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V4(API_ADDRESS),
    ]))?;
    let api = api_server(args.nodes)?;
    let host_listener = tokio::net::TcpListener::from_std(host_listener)?;
    let host_addr = host_listener.local_addr()?;
    let pod_listener =
        tokio::net::TcpListener::bind(SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), API_PORT))
            .await?;
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(serve(api.clone(), host_listener, identity.clone()));
    tasks.spawn(serve(api.clone(), pod_listener, identity.clone()));
    tasks.spawn(workloads::run(
        api.clone(),
        Clock::real(),
        WorkloadsConfig::default(),
    ));
    let hosts_dir = args.dir.join("hosts");
    std::fs::create_dir_all(&hosts_dir)?;
    tasks.spawn(dns::run_dns(
        api.clone(),
        hosts_dir.clone(),
        IpAddr::V4(API_ADDRESS),
        DnsConfig::default(),
    ));
    let claims_dir = args.dir.join("claims");
    tasks.spawn(claims::run_claims(
        api.clone(),
        claims_dir.clone(),
        claims::ClaimsConfig::default(),
    ));
    tasks.spawn(services::run_services(
        api.clone(),
        services::ServicesConfig::default(),
    ));
    tasks.spawn(network_policy::run_network_policy(
        api.clone(),
        Default::default(),
    ));
    let template = kubelet_config(&args.dir, images, &api, &identity, hosts_dir, claims_dir);
    api.set_pod_backend(Arc::new(super::pod_io::ProcessPods::new(
        template.processes.clone(),
        template.log_dir.clone(),
        Default::default(),
    )));
    let kubelets = Kubelets::start(&api, args.nodes, &template)?;
    let kubeconfig = write_kubeconfig(&args.dir, &api, &identity, host_addr)?;
    announce(&args, host_addr, &kubeconfig);
    wait_for_stop().await?;
    println!("spur-sim cluster: stopping (pods, namespaces and bridges go with it)");
    kubelets.stop();
    tasks.abort_all();
    Ok(())
}

/// The API server a fresh cluster has: RBAC enforced, no anonymous access, the wall clock
/// for timestamps, clusterIPs from kubeadm's range, and `nodes` Ready nodes labelled for the operator.
fn api_server(nodes: usize) -> anyhow::Result<ApiServer> {
    let api = ApiServer::new(ApiServerConfig {
        clock: Some(TimeSource::from_fn(k8s_openapi::jiff::Timestamp::now)),
        store: StoreConfig {
            service_cluster_ips: Some(ServiceIpRange::KUBEADM),
            ..StoreConfig::default()
        },
        ..ApiServerConfig::default()
    });
    api.seed_nodes(nodes)
        .map_err(|e| anyhow::anyhow!("the nodes: {e:?}"))?;
    Ok(api)
}

/// Serves the API over TLS; an error of the listener is the cluster's end, so it is said.
async fn serve(api: ApiServer, listener: tokio::net::TcpListener, identity: TlsIdentity) {
    if let Err(e) = api.serve_tls(listener, identity).await {
        eprintln!("spur-sim cluster: the API server stopped serving: {e}");
    }
}

/// The settings every node's kubelet shares; each node then gets its own bridge and /24.
fn kubelet_config(
    dir: &Path,
    images: ImageTable,
    api: &ApiServer,
    identity: &TlsIdentity,
    hosts_dir: PathBuf,
    claims_dir: PathBuf,
) -> KubeletConfig {
    let mut config = KubeletConfig::new(images, dir.join("logs"));
    config.hosts_dir = Some(hosts_dir);
    config.claims_dir = claims_dir;
    config.memory_cgroups = super::cgroup::MemoryCgroups::create(Default::default())
        .map_err(|why| eprintln!("spur-sim cluster: memory limits are not enforced: {why}"))
        .ok()
        .map(Arc::new);
    let minting = api.clone();
    config.service_accounts = Some(ServiceAccountIssuer {
        token: Arc::new(move |namespace: &str, name: &str| {
            minting.service_account_token(namespace, name).map_err(|_| {
                format!("serviceaccount \"{name}\" not found in namespace {namespace}")
            })
        }),
        ca_pem: identity.ca_pem().to_owned(),
        host: API_ADDRESS.to_string(),
        port: API_PORT,
    });
    config
}

/// One kubelet thread a node: each runs its own runtime, so the processes it forks live
/// exactly as long as it does (they die with the thread that forked them).
struct Kubelets {
    stops: Vec<tokio::sync::oneshot::Sender<()>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Kubelets {
    fn start(api: &ApiServer, nodes: usize, template: &KubeletConfig) -> anyhow::Result<Self> {
        let mut kubelets = Kubelets {
            stops: Vec::new(),
            threads: Vec::new(),
        };
        for node in 0..nodes {
            let config = node_config(template, node)?;
            let (stop, stopped) = tokio::sync::oneshot::channel();
            let api = api.clone();
            let thread = std::thread::Builder::new()
                .name(format!("kubelet-{node}"))
                .spawn(move || run_node(api, node, config, stopped))?;
            kubelets.stops.push(stop);
            kubelets.threads.push(thread);
        }
        Ok(kubelets)
    }

    /// Stops every kubelet and waits for each to remove its pods and bridge.
    fn stop(self) {
        drop(self.stops);
        for thread in self.threads {
            let _ = thread.join();
        }
    }
}

/// Node `node`'s bridge `spurbr<node>` and pod range 10.244.<node>.0/24.
fn node_config(template: &KubeletConfig, node: usize) -> anyhow::Result<KubeletConfig> {
    let octet = u8::try_from(node)
        .ok()
        .filter(|n| *n < u8::MAX)
        .ok_or_else(|| anyhow::anyhow!("--nodes: at most 255 (one /24 of 10.244.0.0/16 each)"))?;
    let mut config = template.clone();
    config.bridge = format!("spurbr{node}");
    config.pod_cidr = (Ipv4Addr::new(10, 244, octet, 0), 24);
    Ok(config)
}

/// A kubelet until its stop; the kubelet's own errors are printed, since the cluster goes on
/// with its other nodes.
fn run_node(
    api: ApiServer,
    node: usize,
    config: KubeletConfig,
    stopped: tokio::sync::oneshot::Receiver<()>,
) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => return eprintln!("kubelet node-{node}: no runtime: {e}"),
    };
    runtime.block_on(async move {
        let client = api.in_memory_client();
        let name = format!("node-{node}");
        tokio::select! {
            result = run_kubelet(client, &name, config) => {
                if let Err(e) = result {
                    eprintln!("kubelet {name}: {e:#}");
                }
            }
            _ = stopped => {}
        }
    });
}

/// Writes the CA and a kubeconfig for kubectl (the cluster admin's token, over TLS).
fn write_kubeconfig(
    dir: &Path,
    api: &ApiServer,
    identity: &TlsIdentity,
    addr: SocketAddr,
) -> anyhow::Result<PathBuf> {
    let ca = dir.join("ca.crt");
    std::fs::write(&ca, identity.ca_pem())?;
    let text = format!(
        "apiVersion: v1\n\
         kind: Config\n\
         clusters:\n\
         - name: spur-cluster\n  cluster:\n    server: https://{addr}\n    certificate-authority: {ca}\n\
         users:\n\
         - name: spur-cluster-admin\n  user:\n    token: {token}\n\
         contexts:\n\
         - name: spur-cluster\n  context:\n    cluster: spur-cluster\n    user: spur-cluster-admin\n    namespace: default\n\
         current-context: spur-cluster\n",
        ca = ca.display(),
        token = api.admin_token(),
    );
    let path = dir.join("kubeconfig");
    // Written whole then renamed: a caller polling for the file never reads half of it.
    let tmp = dir.join("kubeconfig.tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}

fn announce(args: &ClusterArgs, addr: SocketAddr, kubeconfig: &Path) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "spur-sim cluster: {} nodes, API server https://{addr}, logs under {}\n\
         export KUBECONFIG={}",
        args.nodes,
        args.dir.join("logs").display(),
        kubeconfig.display()
    );
    let _ = out.flush();
}

async fn wait_for_stop() -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    Ok(())
}
