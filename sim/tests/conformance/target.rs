//! Where a conformance case runs: the simulated replicas, or real spurctld processes.
//!
//! A case is an async function of a [`Target`]. [`conformance`] runs it on the model (in a
//! turmoil world, seeded) and on the real binary (one replica, three, or both), and the
//! same assertions must hold on each: a model that drifts from the real controller fails
//! a named case.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use spur_fakes::model::ControllerConfig;
use spur_lab::real_peer::{self, RealCluster, RealConfig};
use spur_operator::net::Connector;
use spur_proto as pb;
use spur_proto::{SlurmAgentServer, SlurmControllerClient};
use spur_sim::net::SimListener;
use spur_sim::world::{KillMode, World, WorldConfig};
use tonic::Code;
use tonic::transport::{Channel, Endpoint};

/// Which targets a case runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Replicas {
    /// The model with three replicas, and one real replica and three.
    Any,
    /// Three replicas only (the case kills or freezes one).
    Three,
    /// The model, and one real replica (a slow case whose answer does not depend on Raft).
    One,
}

/// What a case may configure about the controller, on both targets.
#[derive(Clone, Debug, Default)]
pub struct Setup {
    /// Nodes silent this long go DOWN (spurctld's `heartbeat_timeout_secs`).
    pub heartbeat_timeout_secs: Option<u64>,
    /// The key spurctld signs its agent calls with (`[auth] jwt_key`).
    pub jwt_key: Option<String>,
    /// The longest wait between two failed launches of a job (spurctld's
    /// `max_launch_backoff_secs`, 300): shortened, a case sees the hold after five
    /// failures in seconds instead of the 155 s the doubling takes.
    pub max_launch_backoff_secs: Option<u64>,
    /// How long an ended job is kept (`terminal_job_retention_secs`, 3600).
    pub terminal_retention_secs: Option<u64>,
    /// `[auth] mode = "required"` (with `jwt_key`): every call needs a token.
    pub auth_required: bool,
    /// `[admission] mode = "token"`: registrations need a join token.
    pub token_admission: bool,
}

/// A request to the harness: what a case cannot do from inside the simulation.
#[derive(Clone, Debug)]
enum Control {
    Kill(usize),
    Freeze(usize),
    Thaw(usize),
}

enum Backend {
    Sim {
        world_dialer: spur_sim::net::ServiceDialer,
        hosts: Vec<String>,
        controls: Arc<Mutex<Vec<Control>>>,
        cluster: spur_fakes::model::Cluster,
    },
    Real(Arc<Mutex<RealCluster>>),
}

/// One target of a case.
#[derive(Clone)]
pub struct Target {
    backend: Arc<Backend>,
    /// `"sim"`, `"real-1"` or `"real-3"`, for messages.
    pub name: &'static str,
}

/// The timeouts of a careful client: what the cases call with.
fn endpoint(uri: String) -> Endpoint {
    Endpoint::from_shared(uri)
        .expect("uri")
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(10))
}

impl Target {
    /// How many replicas.
    pub fn replicas(&self) -> usize {
        match &*self.backend {
            Backend::Sim { hosts, .. } => hosts.len(),
            Backend::Real(cluster) => cluster.lock().unwrap().replicas(),
        }
    }

    /// A channel to replica `slot` (not through a Service), retried for 15 s.
    pub async fn replica(&self, slot: usize) -> SlurmControllerClient<Channel> {
        for _ in 0..30 {
            if let Some(client) = self.try_replica(slot).await {
                return client;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        panic!("{}: could not connect to replica {slot}", self.name);
    }

    /// One attempt at a channel to replica `slot`.
    pub async fn try_replica(&self, slot: usize) -> Option<SlurmControllerClient<Channel>> {
        match &*self.backend {
            Backend::Sim {
                world_dialer,
                hosts,
                ..
            } => endpoint(format!("http://{}:6817", hosts[slot]))
                .connect_with_connector(Connector::new(world_dialer.clone()))
                .await
                .ok()
                .map(SlurmControllerClient::new),
            Backend::Real(cluster) => {
                let addr = cluster.lock().unwrap().addr(slot);
                endpoint(format!("http://{addr}"))
                    .connect()
                    .await
                    .ok()
                    .map(SlurmControllerClient::new)
            }
        }
    }

    /// A channel to the leader (waits until one answers writes).
    pub async fn client(&self) -> SlurmControllerClient<Channel> {
        let slot = self.wait_for_leader().await;
        self.replica(slot).await
    }

    /// The host name a Ping on replica `slot` must answer with: the process's own.
    pub fn hostname(&self, slot: usize) -> String {
        match &*self.backend {
            Backend::Sim { hosts, .. } => hosts[slot].clone(),
            // On one machine every real replica shares the machine's host name.
            Backend::Real(_) => std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|h| h.trim().to_owned())
                .unwrap_or_default(),
        }
    }

    /// The replica that leads now, by the target's own account (the model's cluster, the
    /// real replicas' logs); `None` while there is none.
    pub fn leader(&self) -> Option<usize> {
        match &*self.backend {
            Backend::Sim { cluster, .. } => {
                let leader = cluster.leader()?;
                cluster.slot_of(&leader)
            }
            Backend::Real(cluster) => cluster.lock().unwrap().leader(),
        }
    }

    /// Waits until some replica leads and a write through it is answered by a leader (an
    /// update of a node nobody registered is refused by a leader, UNAVAILABLE without
    /// one); returns that replica. Panics after 30 s.
    pub async fn wait_for_leader(&self) -> usize {
        for _ in 0..300 {
            if let Some(slot) = self.leader()
                && let Some(mut client) = self.try_replica(slot).await
            {
                let probe = pb::UpdateNodeRequest {
                    name: "conformance-probe-never-registered".to_owned(),
                    ..Default::default()
                };
                match client.update_node(probe).await {
                    Err(status) if status.code() == Code::Unavailable => {}
                    Err(status) if status.code() == Code::Unknown => {}
                    _ => return slot,
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("{}: no leader after 30 s{}", self.name, self.logs());
    }

    /// The real replicas' logs, for a failure message (empty on the model).
    pub fn logs(&self) -> String {
        match &*self.backend {
            Backend::Sim { .. } => String::new(),
            Backend::Real(cluster) => format!("\n{}", cluster.lock().unwrap().logs()),
        }
    }

    /// Kills replica `slot` (SIGKILL; the model's graceful crash: connections reset).
    pub async fn kill(&self, slot: usize) {
        self.control(Control::Kill(slot)).await;
    }

    /// Freezes replica `slot` (SIGSTOP; the model's `World::freeze`).
    pub async fn freeze(&self, slot: usize) {
        self.control(Control::Freeze(slot)).await;
    }

    /// Thaws replica `slot` (SIGCONT; the partition healed).
    pub async fn thaw(&self, slot: usize) {
        self.control(Control::Thaw(slot)).await;
    }

    async fn control(&self, control: Control) {
        match &*self.backend {
            Backend::Sim { controls, .. } => {
                controls.lock().unwrap().push(control);
                // The harness carries it out before the next step.
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            Backend::Real(cluster) => {
                let mut cluster = cluster.lock().unwrap();
                match control {
                    Control::Kill(slot) => cluster.kill(slot),
                    Control::Freeze(slot) => cluster.freeze(slot),
                    Control::Thaw(slot) => cluster.thaw(slot),
                }
            }
        }
    }

    /// Serves `agent` where the controller can reach it; returns the address and port to
    /// register (the model: this host's name; real: a loopback address of the cluster's).
    pub async fn serve_agent<A: pb::SlurmAgent>(&self, agent: A) -> (String, u32) {
        let port = spur_proto::AGENT_PORT;
        match &*self.backend {
            Backend::Sim { .. } => {
                let listener = SimListener::bind(port).await.expect("bind the agent");
                tokio::spawn(async move {
                    let _ = tonic::transport::Server::builder()
                        .add_service(SlurmAgentServer::new(agent))
                        .serve_with_incoming(listener.incoming())
                        .await;
                });
                ("conformance".to_owned(), u32::from(port))
            }
            Backend::Real(cluster) => {
                let ip = cluster.lock().unwrap().spare_ip(0);
                let addr = SocketAddr::new(ip.into(), port);
                let listener = tokio::net::TcpListener::bind(addr)
                    .await
                    .expect("bind the agent");
                tokio::spawn(async move {
                    let _ = tonic::transport::Server::builder()
                        .add_service(SlurmAgentServer::new(agent))
                        .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(
                            listener,
                        ))
                        .await;
                });
                (ip.to_string(), u32::from(port))
            }
        }
    }
}

/// The hard bound on one case on the real binary. The longest case, a silent node, waits
/// up to three of spurctld's 30 s health ticks for the node to go DOWN and one more for it
/// to come back.
const CASE_BOUND: Duration = Duration::from_secs(150);

type Case = Box<dyn Fn(Target) -> Pin<Box<dyn Future<Output = ()>>>>;

/// Runs `case` on the model and on the real binary (as `replicas` says); `seed` decides
/// the model's world. Without the real binary the case fails, naming it (see
/// `spur_lab::real_peer`).
pub fn conformance<F, Fut>(seed: u64, replicas: Replicas, setup: Setup, case: F)
where
    F: Fn(Target) -> Fut + 'static,
    Fut: Future<Output = ()> + 'static,
{
    let case: Case = Box::new(move |target| Box::pin(case(target)));
    run_on_model(seed, &setup, &case);
    let binary = real_peer::binary_or_fail("controller conformance");
    let counts: &[usize] = match replicas {
        Replicas::Any => &[1, 3],
        Replicas::Three => &[3],
        Replicas::One => &[1],
    };
    for &count in counts {
        run_on_real(&binary, count, &setup, &case);
    }
}

fn run_on_model(seed: u64, setup: &Setup, case: &Case) {
    let defaults = ControllerConfig::default();
    let config = WorldConfig {
        controller: ControllerConfig {
            heartbeat_timeout: setup
                .heartbeat_timeout_secs
                .map_or(defaults.heartbeat_timeout, Duration::from_secs),
            agent_key: setup.jwt_key.as_ref().map(|k| k.as_bytes().to_vec()),
            dispatch_backoff_max: setup
                .max_launch_backoff_secs
                .map_or(defaults.dispatch_backoff_max, Duration::from_secs),
            terminal_retention: setup
                .terminal_retention_secs
                .map_or(defaults.terminal_retention, Duration::from_secs),
            auth_required: setup.auth_required,
            token_admission: setup.token_admission,
            ..defaults
        },
        ..WorldConfig::default()
    };
    let mut world = World::with_config(seed, config);
    world.start_controllers();
    let cluster = world.cluster().clone();
    let hosts: Vec<String> = (0..cluster.config().replicas)
        .map(|slot| cluster.host_of(slot))
        .collect();
    let controls = Arc::new(Mutex::new(Vec::new()));
    let target = Target {
        backend: Arc::new(Backend::Sim {
            world_dialer: world.dialer("conformance"),
            hosts: hosts.clone(),
            controls: controls.clone(),
            cluster,
        }),
        name: "sim",
    };
    let run = case(target.clone());
    world.client("conformance", async move {
        target.wait_for_leader().await;
        run.await;
        Ok(())
    });
    loop {
        let requests: Vec<Control> = controls.lock().unwrap().drain(..).collect();
        for control in requests {
            match control {
                Control::Kill(slot) => world.kill(&hosts[slot], KillMode::Graceful),
                // SIGSTOP: the model's freeze (its kernel's half still answers).
                Control::Freeze(slot) => world.freeze(&hosts[slot]),
                Control::Thaw(slot) => world.thaw(&hosts[slot]),
            }
        }
        if world
            .step()
            .unwrap_or_else(|e| panic!("sim (seed {seed}): {e}"))
        {
            return;
        }
    }
}

fn run_on_real(binary: &std::path::Path, replicas: usize, setup: &Setup, case: &Case) {
    let cluster = RealCluster::start(
        binary,
        RealConfig {
            replicas,
            heartbeat_timeout_secs: setup.heartbeat_timeout_secs,
            jwt_key: setup.jwt_key.clone(),
            max_launch_backoff_secs: setup.max_launch_backoff_secs,
            terminal_retention_secs: setup.terminal_retention_secs,
            auth_required: setup.auth_required,
            token_admission: setup.token_admission,
        },
    )
    .expect("start spurctld");
    let target = Target {
        backend: Arc::new(Backend::Real(Arc::new(Mutex::new(cluster)))),
        name: if replicas == 1 { "real-1" } else { "real-3" },
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let run = case(target.clone());
    // A hard bound: a case that hangs on the real binary fails with the replicas' logs.
    let outcome = runtime.block_on(async {
        target.wait_for_leader().await;
        tokio::time::timeout(CASE_BOUND, run).await
    });
    if outcome.is_err() {
        panic!(
            "{}: case did not finish in {CASE_BOUND:?}{}",
            target.name,
            target.logs()
        );
    }
}
