//! The lab's world: real spurctld replicas and real `spur-operator` processes, each a pod
//! with its own address, user and hostname inside the lab's network namespace; the
//! simulated API server over real TCP with a kubelet stand-in on the real clock; a
//! `spurctld` Service with endpoints managed as Kubernetes would, in either kind (a ClusterIP
//! made by nftables, or headless: a name each operator pod's `/etc/hosts` resolves to the
//! ready replicas); and the faults, made by the kernel (nftables drops) and by signals.
//! The replicas are the real spurctld, or the simulated ones as one process each
//! ([`Replicas`]).

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::Context;
use kube::CustomResourceExt;
use serde_json::json;
use spur_operator::SpurJob;
use spur_operator::state_name;
use spur_operator::uid_in_comment;
use spur_proto as pb;
use spur_proto::SlurmControllerClient;
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};

use super::kernel::{Firewall, ImageRoot, NoEndpoint, Pod};
use crate::real_peer::{CLIENT_PORT, RAFT_PORT, RaftLogs};
use spur_fakes::api_server::cli::write_kubeconfig;
use spur_fakes::api_server::install::{install_operator_identity, operator_rbac};
use spur_fakes::api_server::{ApiServer, ApiServerConfig, OutageMode};
use spur_fakes::index::ObjectIndex;
use spur_fakes::kubelet::{self, KubeletConfig};
use spur_fakes::model::Clock;
use spur_judge::checks::{ControllerView, Observation};
use spur_judge::service::ServiceKind;

/// The Service's ClusterIP.
pub const SERVICE_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 2, 1);
/// The Service's name, as a pod in another namespace resolves it (upstream's manifests:
/// Service `spurctld` in namespace `spur`; the operator's default deployment dials it).
pub const SERVICE_NAME: &str = "spurctld.spur.svc";
/// The API server's address.
pub const API_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 4, 1);
const API_PORT: u16 = 6443;
/// A killed pod leaves the Service's endpoints this long after it died, and a started one
/// joins this long after it listens: the simulation's `endpoint_propagation`.
const ENDPOINT_PROPAGATION: Duration = Duration::from_secs(1);
/// The operator's path inside its image (the Dockerfile's ENTRYPOINT).
pub const IMAGE_OPERATOR: &str = "/usr/local/bin/spur-operator";

/// How long the lab waits for one ground-truth read of a replica.
const READ_BOUND: Duration = Duration::from_secs(1);

/// A job as the replicas' leader shows it at the end of a run.
pub struct LeaderJob {
    pub id: u32,
    pub state: &'static str,
    pub exit_code: i32,
    /// It has a start time: its agents took its launch.
    pub started: bool,
    pub comment: String,
}

/// The controller replicas the lab runs.
#[derive(Clone, Debug)]
pub enum Replicas {
    /// The real spurctld, this binary.
    Real(PathBuf),
    /// The simulated replicas as one process each (`controller::processes`), from this
    /// spur-sim binary.
    Simulated(PathBuf),
}

impl std::fmt::Display for Replicas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Replicas::Real(path) => write!(f, "the real spurctld ({})", path.display()),
            Replicas::Simulated(path) => write!(
                f,
                "the simulated replicas, one process each ({} replica)",
                path.display()
            ),
        }
    }
}

/// What the lab runs.
#[derive(Clone, Debug)]
pub struct LabSetup {
    pub replicas: Replicas,
    pub operator: PathBuf,
    /// Where the pods' files go (removed when the lab ends unless kept).
    pub dir: PathBuf,
    /// Flags for every operator replica (the profile's).
    pub operator_flags: Vec<String>,
    /// What the Service does while it has no ready endpoint.
    pub no_endpoint: NoEndpoint,
    /// The Service's kind.
    pub service: ServiceKind,
    /// Run each operator from this image root filesystem (ci/image.sh's `rootfs/`), as
    /// the image runs, instead of `operator` from the host.
    pub operator_root: Option<PathBuf>,
}

struct Replica {
    pod: Pod,
    child: Option<Child>,
    frozen: bool,
    /// Whether the Service lists it (as the endpoints controller last published).
    in_service: bool,
    /// How far its log has been read for Raft votes.
    log_read: u64,
}

struct OperatorPod {
    name: String,
    pod: Pod,
    child: Option<Child>,
    /// Controller calls counted by processes of this pod that have exited.
    calls_banked: u64,
    /// The running process's count as last scraped.
    calls_seen: u64,
}

impl Replica {
    /// Replica `slot`'s pod (127.0.1.x, hostname `spurctld-<slot>`), not yet started.
    fn new(slot: usize) -> Replica {
        Replica {
            pod: Pod {
                name: format!("spurctld-{slot}"),
                ip: Ipv4Addr::new(127, 0, 1, slot as u8 + 1),
                uid: 20001 + slot as u32,
            },
            child: None,
            frozen: false,
            in_service: false,
            log_read: 0,
        }
    }
}

impl OperatorPod {
    /// Operator pod `i` named `name` (127.0.3.x), not yet started.
    fn new(i: usize, name: &str) -> OperatorPod {
        OperatorPod {
            name: name.to_owned(),
            pod: Pod {
                name: name.to_owned(),
                ip: operator_ip(i),
                uid: 20011 + i as u32,
            },
            child: None,
            calls_banked: 0,
            calls_seen: 0,
        }
    }
}

/// One lab run. Every process it started is killed when it is dropped (and, should the
/// lab itself die, by each pod's death signal).
pub struct Lab {
    setup: LabSetup,
    started: Instant,
    /// The wall clock when the plan's clock started: the operators' log lines carry it.
    started_wall: std::time::SystemTime,
    replicas: Vec<Replica>,
    operators: Vec<OperatorPod>,
    firewall: Firewall,
    pub api: ApiServer,
    pub index: ObjectIndex,
    /// Endpoint changes not yet published: (when, slot, ready).
    endpoint_changes: Vec<(Duration, usize, bool)>,
    /// The Raft votes the replicas logged, which name the leader.
    raft: RaftLogs,
    clients: Vec<Option<SlurmControllerClient<Channel>>>,
    kubeconfig: PathBuf,
    /// With a headless Service: the operators' `/etc/hosts`, the Service's DNS records.
    hosts: Option<PathBuf>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// The kubelet stand-in's readiness answers not yet taken: (operator index, when, 200).
    probe_answers: ProbeAnswers,
    /// With the simulated replicas: the process holding their shared state.
    replica_state: Option<Child>,
}

/// Readiness answers shared between the prober task and the lab's loop.
type ProbeAnswers = std::sync::Arc<std::sync::Mutex<Vec<(usize, Instant, bool)>>>;

/// How a replica or operator process is stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    Kill,
    Term,
}

impl Lab {
    /// The API server with its CRD, namespaces and `nodes` labelled nodes, the kubelet
    /// stand-in, and an empty Service; no replica and no operator yet.
    pub async fn new(setup: LabSetup, nodes: usize, operators: &[&str]) -> anyhow::Result<Lab> {
        let _ = std::fs::remove_dir_all(&setup.dir);
        std::fs::create_dir_all(&setup.dir)?;
        let (api, index, token) = api_server(nodes)?;
        let (tasks, probe_answers) = serve_api(&api, &index, operators.len()).await?;
        let kubeconfig = setup.dir.join("kubeconfig");
        // The operator processes act as their ServiceAccount, under deploy/rbac.yaml.
        let url = format!("http://{API_IP}:{API_PORT}");
        write_kubeconfig(&kubeconfig, &url, &token, "spur-system")?;
        let replicas = (0..3).map(Replica::new).collect::<Vec<_>>();
        let operators = operators
            .iter()
            .enumerate()
            .map(|(i, name)| OperatorPod::new(i, name))
            .collect::<Vec<_>>();
        let firewall = empty_service(&replicas, &operators, setup.no_endpoint);
        firewall.apply()?;
        let replica_state = match &setup.replicas {
            Replicas::Real(_) => None,
            Replicas::Simulated(exe) => Some(start_replica_state(&setup.dir, exe, &replicas)?),
        };
        let hosts = headless_hosts(&setup)?;
        Ok(Lab {
            setup,
            started: Instant::now(),
            started_wall: std::time::SystemTime::now(),
            replicas,
            operators,
            firewall,
            api,
            index,
            endpoint_changes: Vec::new(),
            raft: RaftLogs::default(),
            clients: vec![None, None, None],
            kubeconfig,
            hosts,
            tasks,
            probe_answers,
            replica_state,
        })
    }

    /// Time since the lab started: the plan's clock.
    pub fn now(&self) -> Duration {
        self.started.elapsed()
    }

    /// Restarts the plan's clock (once the world is built).
    pub fn start_clock(&mut self) {
        self.started = Instant::now();
        self.started_wall = std::time::SystemTime::now();
    }

    /// The wall clock at the plan's start.
    pub fn started_wall(&self) -> std::time::SystemTime {
        self.started_wall
    }

    /// Operator replica `name`'s log (every start of it appends).
    pub fn operator_log(&self, name: &str) -> PathBuf {
        self.setup.dir.join(format!("{name}.log"))
    }

    pub fn replica_count(&self) -> usize {
        self.replicas.len()
    }

    pub fn replica_ip(&self, slot: usize) -> Ipv4Addr {
        self.replicas[slot].pod.ip
    }

    pub fn operator_ip(&self, name: &str) -> Option<Ipv4Addr> {
        self.operators
            .iter()
            .find(|o| o.name == name)
            .map(|o| o.pod.ip)
    }

    fn replica_file(&self, slot: usize, what: &str) -> PathBuf {
        self.setup.dir.join(format!("spurctld-{slot}.{what}"))
    }

    /// Starts replica `slot` on its state directory (a first start, or the replacement
    /// pod of a StatefulSet: same name, same address, same state).
    pub fn start_replica(&mut self, slot: usize) -> anyhow::Result<()> {
        let pod = self.replicas[slot].pod.clone();
        let mut command = match &self.setup.replicas {
            Replicas::Real(spurctld) => self.spurctld_command(spurctld, slot)?,
            Replicas::Simulated(exe) => {
                // Its state is the state process's: a restart on the same slot is the
                // same replica again, caught up from the log.
                let mut command = Command::new(exe);
                command
                    .arg("replica")
                    .arg("--slot")
                    .arg(slot.to_string())
                    .arg("--dir")
                    .arg(replica_state_dir(&self.setup.dir));
                for replica in &self.replicas {
                    command.arg("--ip").arg(replica.pod.ip.to_string());
                }
                command
            }
        };
        let log = open_log(&self.replica_file(slot, "log"))?;
        command
            .current_dir(&self.setup.dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        let child = pod.command(command).spawn()?;
        let replica = &mut self.replicas[slot];
        replica.child = Some(child);
        replica.frozen = false;
        self.clients[slot] = None;
        Ok(())
    }

    /// The real spurctld of replica `slot`, with its config and state directory written.
    fn spurctld_command(&self, spurctld: &Path, slot: usize) -> anyhow::Result<Command> {
        let pod = &self.replicas[slot].pod;
        let state = self.replica_file(slot, "state");
        std::fs::create_dir_all(&state)?;
        std::os::unix::fs::chown(&state, Some(pod.uid), Some(pod.uid))?;
        let mut text = String::from("cluster_name = \"lab\"\n[controller]\n");
        let _ = writeln!(text, "listen_addr = \"{}:{CLIENT_PORT}\"", pod.ip);
        let _ = writeln!(text, "state_dir = \"{}\"", state.display());
        let peers: Vec<String> = self
            .replicas
            .iter()
            .map(|r| format!("\"{}:{RAFT_PORT}\"", r.pod.ip))
            .collect();
        let _ = writeln!(text, "peers = [{}]", peers.join(", "));
        let _ = writeln!(text, "node_id = {}", slot + 1);
        let _ = writeln!(text, "raft_listen_addr = \"{}:{RAFT_PORT}\"", pod.ip);
        text.push_str("[[partitions]]\nname = \"default\"\ndefault = true\n");
        let config = self.replica_file(slot, "conf");
        std::fs::write(&config, text)?;
        let mut command = Command::new(spurctld);
        command
            .arg("-D")
            .arg("-f")
            .arg(&config)
            .arg("--state-dir")
            .arg(&state)
            .arg("--listen")
            .arg(format!("{}:{CLIENT_PORT}", pod.ip))
            .env("NO_COLOR", "1")
            .env("RUST_LOG", "info");
        Ok(command)
    }

    /// Kills replica `slot`: with `silent`, its address is black-holed first (a pod whose
    /// packets vanish); it leaves the Service after the propagation delay.
    pub fn kill_replica(&mut self, slot: usize, silent: bool) -> anyhow::Result<()> {
        if silent {
            self.firewall.black_holed.push(self.replicas[slot].pod.ip);
            self.firewall.apply()?;
        }
        let now = self.now();
        let replica = &mut self.replicas[slot];
        if let Some(mut child) = replica.child.take() {
            if replica.frozen {
                signal(child.id(), libc::SIGCONT);
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        replica.frozen = false;
        self.endpoint_changes
            .push((now + ENDPOINT_PROPAGATION, slot, false));
        Ok(())
    }

    /// The replacement pod of a killed replica: its address answers again and it starts
    /// on its state directory.
    pub fn replace_replica(&mut self, slot: usize) -> anyhow::Result<()> {
        let ip = self.replicas[slot].pod.ip;
        self.firewall.black_holed.retain(|b| *b != ip);
        self.firewall.apply()?;
        self.start_replica(slot)
    }

    /// SIGSTOP (`true`) or SIGCONT replica `slot`. A frozen replica stays in the Service:
    /// its kernel still completes the handshakes of a tcpSocket probe.
    pub fn freeze_replica(&mut self, slot: usize, frozen: bool) {
        let replica = &mut self.replicas[slot];
        if let Some(child) = &replica.child {
            signal(
                child.id(),
                if frozen { libc::SIGSTOP } else { libc::SIGCONT },
            );
            replica.frozen = frozen;
        }
    }

    /// The replicas operator `name` holds an established connection to, as the replicas'
    /// sockets show them (the operator's own end names only the Service's address).
    pub fn operator_connections(&self, name: &str) -> anyhow::Result<BTreeSet<usize>> {
        let operator = self.operator_ip(name).context("no such operator")?;
        let mut on = BTreeSet::new();
        for slot in 0..self.replicas.len() {
            let src = format!("{}:{CLIENT_PORT}", self.replicas[slot].pod.ip);
            let out = std::process::Command::new("ss")
                .args(["-tnH", "state", "established", "src", &src, "dst"])
                .arg(operator.to_string())
                .output()
                .context("ss (iproute2)")?;
            if !String::from_utf8_lossy(&out.stdout).trim().is_empty() {
                on.insert(slot);
            }
        }
        Ok(on)
    }

    /// Resets operator `name`'s connections to replica `slot`, as the replica's kernel
    /// would (`ss -K`: the operator gets a RST on its next read or write).
    pub fn reset_operator_connections(&self, name: &str, slot: usize) -> anyhow::Result<()> {
        let operator = self.operator_ip(name).context("no such operator")?;
        let src = format!("{}:{CLIENT_PORT}", self.replicas[slot].pod.ip);
        let status = std::process::Command::new("ss")
            .args(["-K", "-tnH", "state", "established", "src", &src, "dst"])
            .arg(operator.to_string())
            .stdout(std::process::Stdio::null())
            .status()
            .context("ss -K (iproute2)")?;
        anyhow::ensure!(status.success(), "ss -K failed: {status}");
        Ok(())
    }

    /// The readiness answers the kubelet stand-in got since the last call, for operator
    /// index, when each probe was sent (the plan's clock) and whether it said ready.
    /// Answers from before the plan's clock started are dropped.
    pub fn take_probe_answers(&self) -> Vec<(usize, Duration, bool)> {
        let taken = std::mem::take(&mut *self.probe_answers.lock().expect("no holder panics"));
        taken
            .into_iter()
            .filter_map(|(i, at, ready)| Some((i, at.checked_duration_since(self.started)?, ready)))
            .collect()
    }

    /// What operator `name`'s `/readyz` should reflect now, by the lab's truth: its process
    /// runs, it reaches the API server (`api_up`: the lab's outage is off), and some ready
    /// endpoint of the Service is a replica whose process runs and whose address is not
    /// black-holed, reachable from it (a frozen one stays, as in the simulation: its
    /// kernel completes connects).
    pub fn readiness_view(
        &self,
        name: &str,
        api_up: bool,
    ) -> spur_judge::checks::readiness::WorldView {
        let ip = self.operator_ip(name).expect("an operator of the plan");
        let endpoints = self
            .replicas
            .iter()
            .filter(|r| {
                self.firewall.endpoints.contains(&r.pod.ip)
                    && r.child.is_some()
                    && !self.firewall.black_holed.contains(&r.pod.ip)
                    && !self.firewall.cut(ip, r.pod.ip)
            })
            .map(|r| r.pod.name.clone())
            .collect();
        spur_judge::checks::readiness::WorldView {
            up: self.operator_running(name),
            api_up: api_up && !self.firewall.cut(ip, API_IP),
            endpoints,
            leader: self
                .leader_slot()
                .map(|s| self.replicas[s].pod.name.clone()),
        }
    }

    /// Cuts `a` off from `b` (`cut`), or heals that.
    pub fn partition(&mut self, a: Ipv4Addr, b: Ipv4Addr, cut: bool) -> anyhow::Result<()> {
        self.firewall
            .partitions
            .retain(|p| *p != (a, b) && *p != (b, a));
        if cut {
            self.firewall.partitions.push((a, b));
        }
        self.firewall.apply()?;
        Ok(())
    }

    /// Starts operator replica `name`.
    pub fn start_operator(&mut self, name: &str, extra: &[String]) -> anyhow::Result<()> {
        let i = self.operator_index(name)?;
        let pod = self.operators[i].pod.clone();
        let log = open_log(&self.setup.dir.join(format!("{name}.log")))?;
        let image = match &self.setup.operator_root {
            Some(root) => Some(ImageRoot::new(root, &self.setup.dir)?),
            None => None,
        };
        let mut command = match image {
            Some(_) => Command::new(IMAGE_OPERATOR),
            None => Command::new(&self.setup.operator),
        };
        command
            .arg("run")
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--controller-addr")
            .arg(match self.setup.service {
                ServiceKind::ClusterIp => format!("http://{SERVICE_IP}:{CLIENT_PORT}"),
                ServiceKind::Headless => format!("http://{SERVICE_NAME}:{CLIENT_PORT}"),
            })
            .arg("--agent-listen")
            .arg(format!("{}:{}", pod.ip, spur_proto::AGENT_PORT))
            .arg("--agent-address")
            .arg(pod.ip.to_string())
            .arg("--health-listen")
            .arg(format!("{}:8080", pod.ip))
            .arg("--identity")
            .arg(name)
            .arg("--namespace")
            .arg("spur-system")
            .args(&self.setup.operator_flags)
            .args(extra)
            // JSON: the timeline reads each call's line back (lab::run).
            .arg("--log-format")
            .arg("json")
            .env("RUST_LOG", "info,spur_operator=debug")
            .env("NO_COLOR", "1")
            .current_dir(&self.setup.dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        let hosts = match &self.hosts {
            Some(path) => Some(std::ffi::CString::new(path.as_os_str().as_encoded_bytes())?),
            None => None,
        };
        // The pod's user must be able to reach the binary (a copy under /root cannot be).
        let program = PathBuf::from(command.get_program());
        let child = pod
            .command_in(command, image.as_ref(), hosts.as_deref())
            .spawn()
            .map_err(|e| {
                anyhow::anyhow!(
                    "start {name} ({}) as uid {}: {e}",
                    program.display(),
                    pod.uid
                )
            })?;
        let operator = &mut self.operators[i];
        operator.child = Some(child);
        Ok(())
    }

    /// Stops operator replica `name` (SIGKILL, or SIGTERM and waits for it to exit).
    pub async fn stop_operator(&mut self, name: &str, how: Stop) -> anyhow::Result<()> {
        let i = self.operator_index(name)?;
        self.scrape_calls(i).await;
        let operator = &mut self.operators[i];
        if let Some(mut child) = operator.child.take() {
            match how {
                Stop::Kill => {
                    let _ = child.kill();
                }
                Stop::Term => {
                    signal(child.id(), libc::SIGTERM);
                    let deadline = Instant::now() + Duration::from_secs(30);
                    while child.try_wait()?.is_none() && Instant::now() < deadline {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    let _ = child.kill();
                }
            }
            let _ = child.wait();
        }
        operator.calls_banked += std::mem::take(&mut operator.calls_seen);
        Ok(())
    }

    pub(crate) fn operator_index(&self, name: &str) -> anyhow::Result<usize> {
        self.operators
            .iter()
            .position(|o| o.name == name)
            .ok_or_else(|| anyhow::anyhow!("no operator replica named {name}"))
    }

    /// Starts or ends an API server outage (503s, watches cut), as the simulation's.
    pub fn api_outage(&self, on: bool) {
        if on {
            self.api.faults().start_outage(OutageMode::Unavailable);
        } else {
            self.api.faults().end_outage();
        }
    }

    /// The endpoints controller and the Raft log reader: call often (every sample).
    pub async fn tick(&mut self) -> anyhow::Result<()> {
        let now = self.now();
        // A replica joins the Service once it accepts connections (a tcpSocket probe).
        for slot in 0..self.replicas.len() {
            let replica = &self.replicas[slot];
            let pending = self.endpoint_changes.iter().any(|(_, s, _)| *s == slot);
            if replica.child.is_none() || replica.in_service || pending {
                continue;
            }
            let addr = SocketAddr::new(replica.pod.ip.into(), CLIENT_PORT);
            let probe = tokio::time::timeout(
                Duration::from_millis(200),
                tokio::net::TcpStream::connect(addr),
            );
            if matches!(probe.await, Ok(Ok(_))) {
                self.endpoint_changes
                    .push((now + ENDPOINT_PROPAGATION, slot, true));
            }
        }
        let due: Vec<(Duration, usize, bool)> = self
            .endpoint_changes
            .iter()
            .copied()
            .filter(|(at, _, _)| *at <= now)
            .collect();
        if !due.is_empty() {
            self.endpoint_changes.retain(|(at, _, _)| *at > now);
            for (_, slot, ready) in due {
                // A pod killed before it joined must not join late.
                self.replicas[slot].in_service = ready && self.replicas[slot].child.is_some();
            }
            self.firewall.endpoints = self
                .replicas
                .iter()
                .filter(|r| r.in_service)
                .map(|r| r.pod.ip)
                .collect();
            self.firewall.apply()?;
            if let Some(path) = &self.hosts {
                write_hosts(path, &self.firewall.endpoints)?;
            }
        }
        self.read_votes();
        Ok(())
    }

    /// Reads the replicas' new log lines for openraft's votes (`vote is changing from … to
    /// T<term>-N<node>:committed`), which name the leader ([`RaftLogs`]).
    fn read_votes(&mut self) {
        for slot in 0..self.replicas.len() {
            let path = self.replica_file(slot, "log");
            let Ok(text) = std::fs::read(&path) else {
                continue;
            };
            let from = self.replicas[slot].log_read as usize;
            if text.len() <= from {
                continue;
            }
            // Only whole lines: a line being written is read next time.
            let Some(end) = text[from..].iter().rposition(|b| *b == b'\n') else {
                continue;
            };
            let chunk = String::from_utf8_lossy(&text[from..from + end]);
            for line in chunk.lines() {
                self.raft.read(slot, line);
            }
            self.replicas[slot].log_read = (from + end + 1) as u64;
        }
    }

    /// The leader with a quorum, as ground truth: the leader by the Raft logs, while its
    /// process runs unfrozen and reaches a majority.
    pub fn leader_slot(&self) -> Option<usize> {
        let slot = self.raft.leader_slot()?;
        let up = |s: usize| {
            let r = &self.replicas[s];
            r.child.is_some() && !r.frozen && !self.firewall.black_holed.contains(&r.pod.ip)
        };
        if slot >= self.replicas.len() || !up(slot) {
            return None;
        }
        let reach = (0..self.replicas.len())
            .filter(|s| {
                *s == slot
                    || (up(*s)
                        && !self
                            .firewall
                            .cut(self.replicas[slot].pod.ip, self.replicas[*s].pod.ip))
            })
            .count();
        (reach * 2 > self.replicas.len()).then_some(slot)
    }

    async fn client(&mut self, slot: usize) -> Option<SlurmControllerClient<Channel>> {
        if let Some(client) = &self.clients[slot] {
            return Some(client.clone());
        }
        let uri = format!("http://{}:{CLIENT_PORT}", self.replicas[slot].pod.ip);
        let channel = Endpoint::from_shared(uri)
            .ok()?
            .connect_timeout(READ_BOUND)
            .timeout(READ_BOUND)
            .connect()
            .await
            .ok()?;
        let client = SlurmControllerClient::new(channel);
        self.clients[slot] = Some(client.clone());
        Some(client)
    }

    /// Every job the leader knows. `None` when no leader
    /// answered within the bound.
    pub async fn controller_jobs(&mut self) -> Option<Vec<LeaderJob>> {
        let slot = self.leader_slot()?;
        let mut client = self.client(slot).await?;
        let jobs = match client.get_jobs(pb::GetJobsRequest::default()).await {
            Ok(reply) => reply.into_inner().jobs,
            Err(_) => {
                self.clients[slot] = None;
                return None;
            }
        };
        Some(
            jobs.into_iter()
                .map(|j| LeaderJob {
                    id: j.job_id,
                    state: state_name(
                        pb::JobState::try_from(j.state).unwrap_or(pb::JobState::JobPending),
                    ),
                    exit_code: j.exit_code,
                    started: j.start_time.is_some(),
                    comment: j.comment,
                })
                .collect(),
        )
    }

    /// Every node the replica in `slot` knows, and those it holds DOWN.
    async fn controller_nodes(
        &mut self,
        slot: usize,
    ) -> Option<(BTreeSet<String>, BTreeSet<String>)> {
        let mut client = self.client(slot).await?;
        match client.get_nodes(pb::GetNodesRequest::default()).await {
            Ok(reply) => {
                let nodes = reply.into_inner().nodes;
                let down = nodes
                    .iter()
                    .filter(|n| n.state == pb::NodeState::NodeDown as i32)
                    .map(|n| n.name.clone())
                    .collect();
                Some((nodes.into_iter().map(|n| n.name).collect(), down))
            }
            Err(_) => {
                self.clients[slot] = None;
                None
            }
        }
    }

    fn operator_running(&self, name: &str) -> bool {
        self.operators
            .iter()
            .any(|o| o.name == name && o.child.is_some())
    }

    /// The operator replica the Lease names, per the API server.
    pub fn lease_holder(&self) -> Option<String> {
        self.api
            .get(
                "coordination.k8s.io/v1",
                "Lease",
                Some("spur-system"),
                "spur-operator",
            )
            .ok()
            .and_then(|lease| lease["spec"]["holderIdentity"].as_str().map(str::to_owned))
            .filter(|h| self.operators.iter().any(|o| o.name == *h))
    }

    /// One sample of ground truth, for the simulation's checks.
    pub async fn observe(&mut self) -> Observation {
        let holder = self.lease_holder();
        let acting_operator = holder.clone().filter(|h| {
            self.operator_running(h)
                && self
                    .operator_ip(h)
                    .is_some_and(|ip| !self.firewall.cut(ip, API_IP))
        });
        let endpoint_reachable = acting_operator.as_ref().is_some_and(|op| {
            let ip = self.operator_ip(op).expect("an operator");
            self.firewall
                .endpoints
                .iter()
                .any(|e| !self.firewall.cut(ip, *e))
        });
        let leader_slot = self.leader_slot();
        let mut controller = None;
        if let Some(slot) = leader_slot
            && let Some((registered, down)) = self.controller_nodes(slot).await
            && let Some(jobs) = self.controller_jobs().await
        {
            controller = Some(ControllerView {
                // spurctld does not tell which agent address a node has: after a takeover
                // a node counts as registered as soon as it is known at all.
                registered,
                down,
                owners: jobs
                    .iter()
                    .filter_map(|job| Some((job.id, uid_in_comment(&job.comment)?.to_owned())))
                    .collect(),
                jobs: jobs
                    .into_iter()
                    .map(|job| (job.id, (job.state, job.exit_code)))
                    .collect(),
            });
        }
        let mut seen = Observation {
            holder,
            acting_operator,
            endpoint_reachable,
            leader: leader_slot.map(|s| self.replicas[s].pod.name.clone()),
            controller,
            ..Observation::default()
        };
        self.index.lock().fill_observation(&mut seen);
        seen
    }

    /// Operator `name`'s process id, while it runs.
    pub fn operator_pid(&self, name: &str) -> Option<u32> {
        self.operators
            .iter()
            .find(|o| o.name == name)?
            .child
            .as_ref()
            .map(Child::id)
    }

    /// The sum of operator `name`'s metric series whose line starts with `prefix` (a
    /// family name with the start of its labels), scraped now.
    pub async fn operator_metric(&self, name: &str, prefix: &str) -> Option<f64> {
        let ip = self.operator_ip(name)?;
        let text = tokio::time::timeout(
            READ_BOUND,
            http_get(SocketAddr::new(ip.into(), 8080), "/metrics"),
        )
        .await
        .ok()?
        .ok()?;
        Some(
            text.lines()
                .filter(|l| l.starts_with(prefix))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum(),
        )
    }

    /// How many nodes the leader knows, if a leader answers.
    pub async fn registered_count(&mut self) -> Option<usize> {
        let slot = self.leader_slot()?;
        self.controller_nodes(slot).await.map(|(n, _)| n.len())
    }

    /// Scrapes operator `i`'s controller call count (`spur_operator_controller_rpcs_total`).
    async fn scrape_calls(&mut self, i: usize) {
        if self.operators[i].child.is_none() {
            return;
        }
        let addr = SocketAddr::new(self.operators[i].pod.ip.into(), 8080);
        if let Ok(Ok(text)) = tokio::time::timeout(READ_BOUND, http_get(addr, "/metrics")).await {
            let calls = text
                .lines()
                .filter(|l| l.starts_with("spur_operator_controller_rpcs_total{"))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum::<f64>() as u64;
            self.operators[i].calls_seen = calls;
        }
    }

    /// Scrapes every running operator's call count.
    pub async fn scrape_all_calls(&mut self) {
        for i in 0..self.operators.len() {
            self.scrape_calls(i).await;
        }
    }

    /// Controller calls made by every operator process so far.
    pub fn controller_calls(&self) -> u64 {
        self.operators
            .iter()
            .map(|o| o.calls_banked + o.calls_seen)
            .sum()
    }

    /// The tail of every process's log, for a failure's report.
    pub fn log_tails(&self, lines: usize) -> String {
        let mut all = String::new();
        let mut names: Vec<String> = self.operators.iter().map(|o| o.name.clone()).collect();
        names.extend((0..self.replicas.len()).map(|s| format!("spurctld-{s}")));
        for name in names {
            let path = self.setup.dir.join(format!("{name}.log"));
            let text = std::fs::read_to_string(path).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(lines).collect();
            let _ = writeln!(all, "--- {name} (last {lines} lines)");
            for line in tail.into_iter().rev() {
                let _ = writeln!(all, "{line}");
            }
        }
        all
    }

    pub fn dir(&self) -> &Path {
        &self.setup.dir
    }

    /// What each operator's controller channel decided ([`channel_decisions`] of its
    /// log), at most `max` lines, the latest kept: enough to read why a call waited, when
    /// the run's directory is not kept (CI).
    pub fn channel_decisions(&self, max: usize) -> Vec<String> {
        let mut lines: Vec<String> = self
            .operators
            .iter()
            .flat_map(|operator| {
                let log = std::fs::read_to_string(self.operator_log(&operator.name));
                channel_decisions(&log.unwrap_or_default(), &operator.name)
            })
            .collect();
        let skip = lines.len().saturating_sub(max);
        lines.split_off(skip)
    }
}

/// The controller client's lines at INFO and above in an operator's JSON log (dials that
/// failed, channels replaced or dropped, replicas left), one line each, named `operator`.
fn channel_decisions(log: &str, operator: &str) -> Vec<String> {
    let mut lines = Vec::new();
    for line in log.lines() {
        let Ok(entry) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if entry["target"] != "spur_operator::controller::client"
            || entry["level"] == "DEBUG"
            || entry["level"] == "TRACE"
        {
            continue;
        }
        let mut said = format!(
            "{operator} {} {} {}",
            entry["timestamp"].as_str().unwrap_or("?"),
            entry["level"].as_str().unwrap_or("?"),
            entry["fields"]["message"].as_str().unwrap_or("?"),
        );
        if let Some(fields) = entry["fields"].as_object() {
            for (key, value) in fields.iter().filter(|(k, _)| *k != "message") {
                let value = value.as_str().map_or(value.to_string(), str::to_owned);
                let _ = write!(said, " {key}={value}");
            }
        }
        lines.push(said);
    }
    lines
}

impl Drop for Lab {
    fn drop(&mut self) {
        if let Some(mut child) = self.replica_state.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        for replica in &mut self.replicas {
            if let Some(mut child) = replica.child.take() {
                signal(child.id(), libc::SIGCONT);
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        for operator in &mut self.operators {
            if let Some(mut child) = operator.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// The API server on the real clock with the SpurJob CRD, the namespaces, the operator's
/// ServiceAccount and RBAC, and `nodes` labelled nodes; with its index and the
/// ServiceAccount's token.
fn api_server(nodes: usize) -> anyhow::Result<(ApiServer, ObjectIndex, String)> {
    let api = ApiServer::new(ApiServerConfig {
        clock: Some(spur_fakes::clock::TimeSource::from_fn(
            k8s_openapi::jiff::Timestamp::now,
        )),
        ..ApiServerConfig::default()
    });
    api.create(serde_json::to_value(SpurJob::crd())?)
        .map_err(|e| anyhow::anyhow!("the SpurJob CRD: {e:?}"))?;
    for namespace in ["spur-system", "default"] {
        let _ = api.create(json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": namespace}}));
    }
    let token = install_operator_identity(&api, "spur-system", operator_rbac("spur-system"))
        .map_err(|e| anyhow::anyhow!("the operator's ServiceAccount and RBAC: {e:?}"))?;
    let index = ObjectIndex::attach(&api);
    api.seed_nodes(nodes)
        .map_err(|e| anyhow::anyhow!("nodes: {e:?}"))?;
    Ok((api, index, token))
}

/// Serves `api` over TCP on [`API_IP`], with the kubelet stand-in and its readiness probe
/// of `operators` operator pods: the tasks, and where the probe's answers go.
async fn serve_api(
    api: &ApiServer,
    index: &ObjectIndex,
    operators: usize,
) -> anyhow::Result<(Vec<tokio::task::JoinHandle<()>>, ProbeAnswers)> {
    let listener = tokio::net::TcpListener::bind(SocketAddr::new(API_IP.into(), API_PORT))
        .await
        .map_err(|e| anyhow::anyhow!("bind the API server on {API_IP}:{API_PORT}: {e}"))?;
    let served = api.clone();
    let mut tasks = vec![tokio::spawn(async move {
        let _ = served.serve(listener).await;
    })];
    tasks.push(tokio::spawn(kubelet::run_with_clock(
        api.clone(),
        index.clone(),
        KubeletConfig {
            period: Duration::from_millis(100),
            default_run_time: Duration::from_secs(2),
        },
        Clock::real(),
    )));
    // The kubelet's readiness probe of each operator pod, as deploy/deployment.yaml
    // asks (the simulation's prober does the same): /readyz reads through the
    // operator's channel, so its bounded read takes part in the channel's story.
    let probe_answers = ProbeAnswers::default();
    tasks.push(tokio::spawn(probe_readiness(
        (0..operators).map(operator_ip).collect(),
        probe_answers.clone(),
    )));
    Ok((tasks, probe_answers))
}

/// The firewall of every pod with the Service as it starts: no endpoint, no fault.
fn empty_service(
    replicas: &[Replica],
    operators: &[OperatorPod],
    no_endpoint: NoEndpoint,
) -> Firewall {
    let pods = replicas
        .iter()
        .map(|r| r.pod.clone())
        .chain(operators.iter().map(|o| o.pod.clone()))
        .collect();
    Firewall {
        pods,
        service: (SERVICE_IP, CLIENT_PORT),
        endpoints: Vec::new(),
        no_endpoint,
        black_holed: Vec::new(),
        partitions: Vec::new(),
    }
}

/// With a headless Service: its records' file, empty until a replica is ready (the
/// operator pods mount it as their `/etc/hosts`).
fn headless_hosts(setup: &LabSetup) -> anyhow::Result<Option<PathBuf>> {
    match setup.service {
        ServiceKind::ClusterIp => Ok(None),
        ServiceKind::Headless => {
            if let Some(root) = &setup.operator_root
                && !root.join("etc/hosts").is_file()
            {
                anyhow::bail!(
                    "{} has no /etc/hosts to mount the headless Service's records on: \
                     an image from before the file (rebuild it with ci/image.sh)",
                    root.display()
                );
            }
            let path = setup.dir.join("hosts");
            write_hosts(&path, &[])?;
            Ok(Some(path))
        }
    }
}

/// Where the simulated replicas' state process keeps its Unix sockets.
fn replica_state_dir(dir: &Path) -> PathBuf {
    dir.join("replicas")
}

/// Starts the process holding the simulated replicas' shared state (`spur-sim
/// replica-state`), as a pod of its own user so it dies with the lab. It listens on Unix
/// sockets only; its calls out leave from each replica's own address.
fn start_replica_state(dir: &Path, exe: &Path, replicas: &[Replica]) -> anyhow::Result<Child> {
    let sockets = replica_state_dir(dir);
    std::fs::create_dir_all(&sockets)?;
    let pod = Pod {
        name: "spurctld-state".to_owned(),
        ip: Ipv4Addr::new(127, 0, 5, 1),
        uid: 20021,
    };
    std::os::unix::fs::chown(&sockets, Some(pod.uid), Some(pod.uid))?;
    let log = open_log(&dir.join("spurctld-state.log"))?;
    let mut command = Command::new(exe);
    command.arg("replica-state").arg("--dir").arg(&sockets);
    for replica in replicas {
        command.arg("--ip").arg(replica.pod.ip.to_string());
    }
    command
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    Ok(pod.command(command).spawn()?)
}

/// Writes the headless Service's records: one line per ready replica, in the endpoints'
/// order (as DNS answers with a headless Service's addresses). In place, not by rename:
/// each operator pod's `/etc/hosts` is a bind mount of this very file.
fn write_hosts(path: &Path, ready: &[Ipv4Addr]) -> anyhow::Result<()> {
    let mut text = String::from("127.0.0.1 localhost\n");
    for ip in ready {
        let _ = writeln!(text, "{ip} {SERVICE_NAME} {SERVICE_NAME}.cluster.local");
    }
    std::fs::write(path, text)
        .map_err(|e| anyhow::anyhow!("write the Service's records to {}: {e}", path.display()))
}

fn open_log(path: &Path) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
}

fn signal(pid: u32, signal: libc::c_int) {
    // SAFETY: kill(2) on a child this lab started and has not yet reaped.
    unsafe {
        libc::kill(pid as libc::pid_t, signal);
    }
}

/// The address of operator pod `i`.
fn operator_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 3, i as u8 + 1)
}

/// A kubelet's readiness probe of every operator pod, forever: `GET /readyz` each period,
/// bounded by the probe's timeout, a slow one delaying the next. Each answer (ready when
/// it is a 200 within the timeout; a refused or hung connection is not) goes to `answers`
/// with the time it was sent, for the readiness judge of the lab's loop.
async fn probe_readiness(ips: Vec<Ipv4Addr>, answers: ProbeAnswers) {
    let rule = spur_judge::probes::ProbeRule::DEPLOYMENT;
    let mut ticks = tokio::time::interval(rule.period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let sent = Instant::now();
        let probes = ips.iter().map(|ip| {
            tokio::time::timeout(
                rule.timeout,
                http_get(SocketAddr::new((*ip).into(), 8080), "/readyz"),
            )
        });
        let results = futures::future::join_all(probes).await;
        let mut answers = answers.lock().expect("no holder panics");
        for (i, result) in results.into_iter().enumerate() {
            let ready = matches!(result, Ok(Ok(text)) if text.starts_with("HTTP/1.1 200"));
            answers.push((i, sent, ready));
        }
    }
}

/// A plain HTTP/1.1 GET (the operator's metrics), without a client crate for one call.
async fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut body = Vec::new();
    stream.read_to_end(&mut body).await?;
    Ok(String::from_utf8_lossy(&body).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channel_decisions_are_the_clients_lines_at_info_and_above() {
        let log = [
            r#"{"timestamp":"2026-12-05T03:18:03.707Z","level":"WARN","fields":{"message":"dropping the controller channel; the next call connects afresh","addr":"http://spurctld:6817","cause":"GetJobs: no answer"},"target":"spur_operator::controller::client"}"#,
            r#"{"timestamp":"2026-12-05T03:18:03.708Z","level":"DEBUG","fields":{"message":"controller call ended","method":"GetJobs"},"target":"spur_operator::rpc"}"#,
            r#"{"timestamp":"2026-12-05T03:18:03.709Z","level":"DEBUG","fields":{"message":"the controller channel every call shares","generation":3},"target":"spur_operator::controller::client"}"#,
            "not json",
            r#"{"timestamp":"2026-12-05T03:18:04.467Z","level":"INFO","fields":{"message":"replacing the controller channel","rule":"patience"},"target":"spur_operator::controller::client"}"#,
            r#"{"timestamp":"2026-12-05T03:18:04.723Z","level":"WARN","fields":{"message":"could not read job states"},"target":"spur_operator::jobs::status"}"#,
        ]
        .join("\n");
        assert_eq!(
            channel_decisions(&log, "operator-b"),
            [
                "operator-b 2026-12-05T03:18:03.707Z WARN dropping the controller channel; the next call connects afresh addr=http://spurctld:6817 cause=GetJobs: no answer",
                "operator-b 2026-12-05T03:18:04.467Z INFO replacing the controller channel rule=patience",
            ]
        );
    }
}
