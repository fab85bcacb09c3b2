//! A whole installation on real processes: real spurctld replicas (one, or three behind a
//! ClusterIP-like Service), the real `spur-operator` binary, the simulated Kubernetes API
//! server over TCP and a kubelet stand-in on the real clock. Everything it starts stops
//! when it is dropped, even when a case panics.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use kube::CustomResourceExt;
use serde_json::{Value, json};
use spur_fakes::api_server::cli::write_kubeconfig;
use spur_fakes::api_server::install::{install_operator_identity, operator_rbac};
use spur_fakes::api_server::{ApiServer, ApiServerConfig};
use spur_fakes::index::ObjectIndex;
use spur_fakes::kubelet::{self, KubeletConfig};
use spur_fakes::model::Clock;
use spur_lab::real_peer::{self, RealCluster, RealConfig};
use spur_operator::SpurJob;
use spur_proto as pb;
use spur_proto::SlurmControllerClient;
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};

pub const SPURJOB: (&str, &str) = ("spur.amd.com/v1alpha1", "SpurJob");
pub const NAMESPACE: &str = "default";
/// Where the operator keeps its Lease (its `--namespace`).
const OPERATOR_NAMESPACE: &str = "spur-system";
/// The namespace upstream's manifests deploy spurctld and the operator to.
pub const UPSTREAM_NAMESPACE: &str = "spur";
/// Upstream's ClusterRole and its binding to `spur`'s `default` ServiceAccount.
const UPSTREAM_RBAC: &str = include_str!("upstream-rbac.yaml");

/// Upstream's `operator.yaml` command line: its three flags and no subcommand, with its
/// env (`POD_IP`, `POD_NAMESPACE`, `SPUR_OPERATOR_ADDRESS`). The addresses are this
/// stack's, since no cluster DNS resolves here, and the in-cluster configuration is a
/// kubeconfig holding the ServiceAccount's token.
fn upstream_operator_command(
    binary: &std::path::Path,
    kubeconfig: &std::path::Path,
    service: SocketAddr,
    agent_ip: std::net::Ipv4Addr,
) -> Command {
    let mut command = Command::new(binary);
    command
        .arg(format!("--controller-addr={service}"))
        .arg(format!("--listen={agent_ip}:{}", spur_proto::AGENT_PORT))
        .arg(format!("--health-addr={agent_ip}:8080"))
        .env("POD_IP", agent_ip.to_string())
        .env("POD_NAMESPACE", UPSTREAM_NAMESPACE)
        .env("SPUR_OPERATOR_ADDRESS", agent_ip.to_string())
        .env("KUBECONFIG", kubeconfig)
        .env("HOSTNAME", "spur-k8s-operator-5f7c9d-x2x7q");
    command
}

/// Upstream's ClusterRole bound to `spur`'s `default` ServiceAccount; that account's token.
fn install_upstream_identity(api: &ApiServer) -> String {
    let account = json!({"apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": "default", "namespace": UPSTREAM_NAMESPACE}});
    // Kubernetes makes every namespace's `default` account; the API server may have too.
    let _ = api.create(account);
    let objects = spur_fakes::api_server::install::documents(UPSTREAM_RBAC, UPSTREAM_NAMESPACE)
        .expect("upstream-rbac.yaml parses");
    for object in objects {
        api.create(object).expect("apply upstream's RBAC");
    }
    api.service_account_token(UPSTREAM_NAMESPACE, "default")
        .expect("a token of spur's default ServiceAccount")
}

/// The operator binary: `$SPUR_OPERATOR_BIN`, else beside this test's executable
/// (`target/<profile>/spur-operator`, which `cargo test --workspace` builds).
fn operator_binary() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("SPUR_OPERATOR_BIN") {
        return Some(PathBuf::from(path));
    }
    let exe = std::env::current_exe().ok()?;
    let path = exe.parent()?.parent()?.join("spur-operator");
    path.is_file().then_some(path)
}

/// What a case starts.
#[derive(Clone, Debug)]
pub struct StackConfig {
    /// spurctld replicas: 1, or 3 under Raft.
    pub replicas: usize,
    /// Labelled Kubernetes nodes (`node-0`, ...), each with 64 CPUs and 8 GPUs.
    pub nodes: usize,
    /// spurctld signs its agent calls with this key, and the operator requires them.
    pub agent_key: Option<String>,
    /// Extra flags for `spur-operator run`.
    pub operator_flags: Vec<String>,
    /// Start the operator with the rest; when false, the case starts it itself with
    /// [`Stack::start_operator`] (a swap from upstream's operator prepares the world first).
    pub start_operator: bool,
    /// Upstream's layout instead of ours: the operator started as upstream's
    /// `operator.yaml` starts upstream's (its flags, no subcommand, its env), acting as
    /// `spur`'s `default` ServiceAccount under upstream's ClusterRole.
    pub upstream_layout: bool,
    /// More namespaces to create (for SpurJobs).
    pub namespaces: Vec<String>,
    /// spurctld's `[admission] mode = "token"`; the operator is given a join token
    /// `CreateToken` made unless `withhold_join_token`.
    pub token_admission: bool,
    pub withhold_join_token: bool,
}

impl Default for StackConfig {
    fn default() -> Self {
        Self {
            replicas: 1,
            nodes: 2,
            agent_key: None,
            operator_flags: Vec::new(),
            start_operator: true,
            upstream_layout: false,
            namespaces: Vec::new(),
            token_admission: false,
            withhold_join_token: false,
        }
    }
}

pub struct Stack {
    pub cluster: RealCluster,
    pub api: ApiServer,
    operator: Option<Child>,
    /// The operator's command until it is started.
    operator_command: Option<Command>,
    operator_log: PathBuf,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// A join token from `spur token create`'s call, asked of each replica in turn until one
/// answers (a follower forwards it to the leader; before an election none can).
async fn create_join_token(cluster: &RealCluster) -> String {
    for _ in 0..60 {
        for slot in 0..cluster.replicas() {
            let endpoint = Endpoint::from_shared(format!("http://{}", cluster.addr(slot)))
                .expect("uri")
                .connect_timeout(Duration::from_secs(2))
                .timeout(Duration::from_secs(5));
            let Ok(channel) = endpoint.connect().await else {
                continue;
            };
            let request = pb::CreateTokenRequest { ttl_secs: None };
            if let Ok(answer) = SlurmControllerClient::new(channel)
                .create_token(request)
                .await
            {
                return answer.into_inner().token;
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    panic!("no replica made a join token in 30 s{}", cluster.logs());
}

impl Stack {
    /// A kubeconfig of the stack's API server (plain HTTP) with an admin's token, for a
    /// person's kubectl (the operator's own holds its ServiceAccount's token).
    pub fn admin_kubeconfig(&self) -> PathBuf {
        self.cluster.dir().join("stack").join("admin-kubeconfig")
    }

    /// Starts everything, on the current tokio runtime; fails, naming it, when a real
    /// binary is missing.
    pub async fn start(config: StackConfig) -> Stack {
        let spurctld = real_peer::binary_or_fail("end to end on the real spurctld");
        let operator_bin = operator_binary().unwrap_or_else(|| {
            panic!(
                "end to end: the spur-operator binary is missing beside the tests, so this case \
                 cannot run (cargo build -p spur-operator)"
            )
        });
        let cluster = RealCluster::start(
            &spurctld,
            RealConfig {
                replicas: config.replicas,
                heartbeat_timeout_secs: None,
                jwt_key: config.agent_key.clone(),
                token_admission: config.token_admission,
                ..RealConfig::default()
            },
        )
        .expect("start spurctld");
        let dir = cluster.dir().join("stack");
        std::fs::create_dir_all(&dir).expect("stack dir");
        let mut tasks = Vec::new();

        // The Service: one address in front of the replicas.
        let service = SocketAddr::new(cluster.spare_ip(1).into(), real_peer::CLIENT_PORT);
        let listener = tokio::net::TcpListener::bind(service)
            .await
            .expect("bind the Service");
        let backends = (0..cluster.replicas()).map(|s| cluster.addr(s)).collect();
        tasks.push(tokio::spawn(real_peer::serve_service(
            listener, backends, 1,
        )));

        // The API server, its CRD, its nodes, and the kubelet stand-in.
        let api = ApiServer::new(ApiServerConfig {
            clock: Some(spur_fakes::clock::TimeSource::from_fn(
                k8s_openapi::jiff::Timestamp::now,
            )),
            ..ApiServerConfig::default()
        });
        let crd = serde_json::to_value(SpurJob::crd()).expect("the CRD serialises");
        api.create(crd).expect("apply the SpurJob CRD");
        let operator_namespace = match config.upstream_layout {
            true => UPSTREAM_NAMESPACE,
            false => OPERATOR_NAMESPACE,
        };
        let namespaces = [operator_namespace, NAMESPACE]
            .into_iter()
            .chain(config.namespaces.iter().map(String::as_str));
        for namespace in namespaces {
            let object = json!({"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": namespace}});
            // The API server may start with `default`.
            let _ = api.create(object);
        }
        let token = match config.upstream_layout {
            true => install_upstream_identity(&api),
            false => install_operator_identity(
                &api,
                OPERATOR_NAMESPACE,
                operator_rbac(OPERATOR_NAMESPACE),
            )
            .expect("the operator's ServiceAccount and RBAC"),
        };
        let index = ObjectIndex::attach(&api);
        api.seed_nodes(config.nodes).expect("nodes");
        let api_addr = SocketAddr::new(cluster.spare_ip(2).into(), 0);
        let listener = tokio::net::TcpListener::bind(api_addr)
            .await
            .expect("bind the API server");
        let api_url = format!("http://{}", listener.local_addr().expect("addr"));
        let served = api.clone();
        tasks.push(tokio::spawn(async move {
            let _ = served.serve(listener).await;
        }));
        let kubelet_config = KubeletConfig {
            period: Duration::from_millis(100),
            default_run_time: Duration::from_secs(2),
        };
        tasks.push(tokio::spawn(kubelet::run_with_clock(
            api.clone(),
            index,
            kubelet_config,
            Clock::real(),
        )));
        let kubeconfig = dir.join("kubeconfig");
        // The operator acts as its ServiceAccount, under deploy/rbac.yaml as applied.
        write_kubeconfig(&kubeconfig, &api_url, &token, operator_namespace).expect("kubeconfig");
        let admin = dir.join("admin-kubeconfig");
        write_kubeconfig(&admin, &api_url, &api.admin_token(), NAMESPACE).expect("kubeconfig");

        let agent_ip = cluster.spare_ip(0);
        let mut command = if config.upstream_layout {
            upstream_operator_command(&operator_bin, &kubeconfig, service, agent_ip)
        } else {
            Command::new(&operator_bin)
        };
        command
            .env("RUST_LOG", "info,spur_operator=debug")
            .env("NO_COLOR", "1");
        if !config.upstream_layout {
            command
                .arg("run")
                .arg("--kubeconfig")
                .arg(&kubeconfig)
                .arg("--controller-addr")
                .arg(format!("http://{service}"))
                .arg("--agent-listen")
                .arg(format!("{agent_ip}:{}", spur_proto::AGENT_PORT))
                .arg("--agent-address")
                .arg(agent_ip.to_string())
                .arg("--health-listen")
                .arg(format!("{agent_ip}:8080"))
                .arg("--identity")
                .arg("operator-e2e")
                .args(&config.operator_flags);
        }
        if let Some(key) = &config.agent_key {
            let key_file = dir.join("agent-key");
            std::fs::write(&key_file, key).expect("key file");
            command
                .arg("--agent-auth")
                .arg("required")
                .arg("--agent-auth-key-file")
                .arg(&key_file);
        }
        if config.token_admission && !config.withhold_join_token {
            let token_file = dir.join("join-token");
            let token = create_join_token(&cluster).await;
            std::fs::write(&token_file, format!("{token}\n")).expect("token file");
            command.arg("--controller-join-token-file").arg(&token_file);
        }
        let mut stack = Stack {
            cluster,
            api,
            operator: None,
            operator_command: Some(command),
            operator_log: dir.join("operator.log"),
            tasks,
        };
        if config.start_operator {
            stack.start_operator();
        }
        stack
    }

    /// Starts the operator (once; a second call does nothing).
    pub fn start_operator(&mut self) {
        let Some(mut command) = self.operator_command.take() else {
            return;
        };
        let out = std::fs::File::create(&self.operator_log).expect("operator log");
        let operator = command
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("log"))
            .stderr(out)
            .spawn()
            .expect("start spur-operator");
        self.operator = Some(operator);
    }

    /// The operator's /metrics exposition (its health port on the agent's address).
    pub async fn metrics(&self) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let addr = SocketAddr::new(self.cluster.spare_ip(0).into(), 8080);
        let mut stream = tokio::net::TcpStream::connect(addr)
            .await
            .expect("connect to /metrics");
        stream
            .write_all(b"GET /metrics HTTP/1.0\r\nHost: operator\r\n\r\n")
            .await
            .expect("ask for /metrics");
        let mut answer = String::new();
        stream
            .read_to_string(&mut answer)
            .await
            .expect("read /metrics");
        answer
    }

    /// The operator's whole log so far.
    pub fn operator_log(&self) -> String {
        std::fs::read_to_string(&self.operator_log).unwrap_or_default()
    }

    /// The operator's log and the replicas' logs' tails, for a failure message.
    pub fn logs(&self) -> String {
        let operator = self.operator_log();
        let tail: Vec<&str> = operator.lines().rev().take(40).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        format!(
            "\n--- spur-operator (last 40 lines)\n{}\n{}",
            tail.join("\n"),
            self.cluster.logs()
        )
    }

    /// A channel to replica `slot`.
    pub async fn replica(&self, slot: usize) -> SlurmControllerClient<Channel> {
        let channel = Endpoint::from_shared(format!("http://{}", self.cluster.addr(slot)))
            .expect("uri")
            .connect_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(5))
            .connect()
            .await
            .expect("connect to spurctld");
        SlurmControllerClient::new(channel)
    }

    /// spurctld's own view of the jobs named `name` (asked of the leader).
    pub async fn controller_jobs(&self, name: &str) -> Vec<pb::JobInfo> {
        let slot = self.cluster.leader().unwrap_or(0);
        self.replica(slot)
            .await
            .get_jobs(pb::GetJobsRequest {
                name: name.to_owned(),
                ..Default::default()
            })
            .await
            .map(|r| r.into_inner().jobs)
            .unwrap_or_default()
    }

    /// Creates a SpurJob named `name` with `spec`.
    pub fn create_spurjob(&self, name: &str, spec: Value) -> Value {
        self.create_spurjob_in(NAMESPACE, name, spec)
    }

    /// Creates a SpurJob named `name` with `spec` in `namespace`.
    pub fn create_spurjob_in(&self, namespace: &str, name: &str, spec: Value) -> Value {
        self.api
            .create(json!({
                "apiVersion": SPURJOB.0,
                "kind": SPURJOB.1,
                "metadata": {"name": name, "namespace": namespace},
                "spec": spec,
            }))
            .expect("create the SpurJob")
    }

    /// Deletes the SpurJob `name` of `namespace`, as `kubectl delete` does.
    pub fn delete_spurjob_in(&self, namespace: &str, name: &str) {
        self.api
            .delete(SPURJOB.0, SPURJOB.1, Some(namespace), name)
            .expect("delete the SpurJob");
    }

    /// The SpurJob `name`, if it exists.
    pub fn spurjob(&self, name: &str) -> Option<Value> {
        self.spurjob_in(NAMESPACE, name)
    }

    /// The SpurJob `name` of `namespace`, if it exists.
    pub fn spurjob_in(&self, namespace: &str, name: &str) -> Option<Value> {
        self.api
            .get(SPURJOB.0, SPURJOB.1, Some(namespace), name)
            .ok()
    }

    /// The SpurJob's `status.state`.
    pub fn state(&self, name: &str) -> Option<String> {
        self.state_in(NAMESPACE, name)
    }

    /// The `status.state` of SpurJob `name` of `namespace`.
    pub fn state_in(&self, namespace: &str, name: &str) -> Option<String> {
        self.spurjob_in(namespace, name)
            .and_then(|j| j["status"]["state"].as_str().map(str::to_owned))
    }

    /// The pods of the SpurJob `name` (by the UID label the operator puts on them).
    pub fn pods(&self, name: &str) -> Vec<Value> {
        let Some(uid) = self
            .spurjob(name)
            .and_then(|j| j["metadata"]["uid"].as_str().map(str::to_owned))
        else {
            return Vec::new();
        };
        self.api
            .list("v1", "Pod")
            .unwrap_or_default()
            .into_iter()
            .filter(|p| p["metadata"]["labels"]["spur.amd.com/spurjob-uid"] == uid.as_str())
            .collect()
    }

    /// Waits until `done` holds, checking every 200 ms; returns how long it took from
    /// `since`. Panics after `limit` with what it saw and the logs.
    pub async fn until(
        &self,
        what: &str,
        since: Instant,
        limit: Duration,
        done: impl Fn(&Stack) -> bool,
    ) -> Duration {
        loop {
            if done(self) {
                return since.elapsed();
            }
            if since.elapsed() > limit {
                panic!("{what}: not after {limit:?}{}", self.logs());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        if let Some(operator) = &mut self.operator {
            let _ = operator.kill();
            let _ = operator.wait();
        }
        for task in &self.tasks {
            task.abort();
        }
    }
}
