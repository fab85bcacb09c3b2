//! A simulated cluster with the operator in it: the world (network and controller
//! replicas), the API server with the SpurJob CRD, labelled nodes, and operator replicas
//! started from flags. Scenarios and tests build on this.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;

use kube::CustomResourceExt;
use serde_json::{Value, json};
use spur_operator::Handles;
use spur_operator::SpurJob;

use crate::operator::{KUBE_API_HOST, KUBE_API_PORT, config_from_flags, run_operator};
use crate::world::{World, WorldConfig};
use spur_fakes::api_server::install::{install_operator_identity, operator_rbac};
use spur_fakes::api_server::store::StoreConfig;
use spur_fakes::api_server::{ApiServer, ApiServerConfig, seed};
use spur_fakes::clock::TimeSource;
use spur_fakes::index::ObjectIndex;
use spur_fakes::leases::LeaseHistory;
use spur_judge::trace::fnv1a;

pub use spur_judge::hosts::{OPERATOR_LEASE, OPERATOR_NAMESPACE};

/// Asks an operator replica to shut down as on SIGTERM (drain, release the lease, exit),
/// and lets a restart run it again.
#[derive(Clone)]
pub struct OperatorStop(Rc<tokio::sync::watch::Sender<bool>>);

impl OperatorStop {
    /// Starts the replica's graceful shutdown.
    pub fn stop(&self) {
        self.0.send_replace(true);
    }

    /// The next start of the process runs until stopped again.
    pub fn reset(&self) {
        self.0.send_replace(false);
    }
}

pub struct Sim {
    pub world: World,
    pub api: ApiServer,
    /// The API server's objects, as the checks and the kubelet read them.
    pub index: ObjectIndex,
    /// Who each Lease named, as the API server applied it.
    pub leases: LeaseHistory,
    seed: u64,
    /// The operator's ServiceAccount token: what every replica acts with.
    operator_token: String,
    operators: Rc<RefCell<BTreeMap<String, Handles>>>,
    stops: BTreeMap<String, OperatorStop>,
}

impl Sim {
    pub fn new(seed: u64) -> Sim {
        Sim::with_config(seed, WorldConfig::default())
    }

    /// A world for `seed` with the API server up (the CRD applied, the operator's
    /// namespace, ServiceAccount and `deploy/rbac.yaml` applied) and the controller
    /// replicas started.
    pub fn with_config(seed: u64, config: WorldConfig) -> Sim {
        let mut sim = Sim::without_controllers(seed, config);
        sim.world.start_controllers();
        sim
    }

    /// Like [`Sim::with_config`], but the controller replicas' pods start only at `start`
    /// (simulated): until then the `spurctld` Service has no endpoint, as on a new
    /// cluster where the operator comes up before the controller.
    pub fn with_controllers_at(seed: u64, config: WorldConfig, start: Duration) -> Sim {
        let mut sim = Sim::without_controllers(seed, config);
        sim.world.at(start, |w| w.start_controllers());
        sim
    }

    /// As [`Sim::with_config`], but the controller replicas are left to the caller.
    pub fn without_controllers(seed: u64, config: WorldConfig) -> Sim {
        let mut world = World::with_config(seed, config);
        let api = ApiServer::new(ApiServerConfig {
            store: StoreConfig {
                seed,
                ..Default::default()
            },
            clock: Some(TimeSource::of_world(world.time())),
            ..ApiServerConfig::default()
        });
        let index = ObjectIndex::attach(&api);
        let leases = spur_fakes::leases::attach(&api, world.time());
        api.create(json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": OPERATOR_NAMESPACE},
        }))
        .expect("create the operator's namespace");
        let crd = serde_json::to_value(SpurJob::crd()).expect("the CRD serialises");
        api.create(crd).expect("apply the SpurJob CRD");
        let operator_token =
            install_operator_identity(&api, OPERATOR_NAMESPACE, operator_rbac(OPERATOR_NAMESPACE))
                .expect("apply the operator's ServiceAccount and RBAC");
        let server = api.clone();
        world.host(KUBE_API_HOST, move || {
            let server = server.clone();
            async move {
                let listener = crate::net::SimListener::bind(KUBE_API_PORT).await?;
                server.serve(listener).await?;
                Ok(())
            }
        });
        Sim {
            world,
            api,
            index,
            leases,
            seed,
            operator_token,
            operators: Rc::default(),
            stops: BTreeMap::new(),
        }
    }

    /// Adds `node-0` .. `node-{count-1}`, labelled for the operator.
    pub fn add_nodes(&self, count: usize) {
        for i in 0..count {
            self.add_node(seed::node(i));
        }
    }

    pub fn add_node(&self, node: Value) {
        self.api.create(node).expect("create a node");
    }

    /// Starts an operator replica on host `name`, configured by `flags` as the binary would
    /// be. A restart of the host (`world.restart`) runs it afresh, as a new process.
    pub fn start_operator(&mut self, name: &str, flags: &[&str]) {
        let flags: Vec<String> = flags.iter().map(|f| (*f).to_owned()).collect();
        let config = config_from_flags(name, &flags).expect("the operator's flags are valid");
        let dialer = self.world.dialer(name);
        let seed = self.seed ^ fnv1a(name.as_bytes());
        let token = self.operator_token.clone();
        let operators = self.operators.clone();
        let host = name.to_owned();
        let stop = OperatorStop(Rc::new(tokio::sync::watch::channel(false).0));
        self.stops.insert(name.to_owned(), stop.clone());
        self.world.host(name, move || {
            let (dialer, config, operators, host, token) = (
                dialer.clone(),
                config.clone(),
                operators.clone(),
                host.clone(),
                token.clone(),
            );
            let mut stopped = stop.0.subscribe();
            async move {
                crate::timeline_calls::enter_host(&host);
                let (started, handles) = tokio::sync::oneshot::channel();
                let shutdown = async move {
                    let _ = stopped.wait_for(|s| *s).await;
                };
                let run = run_operator(dialer, config, seed, token, shutdown, started);
                let publish = async move {
                    if let Ok(handles) = handles.await {
                        operators.borrow_mut().insert(host, handles);
                    }
                };
                let (result, ()) = tokio::join!(run, publish);
                result?;
                Ok(())
            }
        });
    }

    /// Starts the simulated kubelets that run the pods bound to nodes.
    pub fn start_kubelet(&mut self) {
        let (api, index) = (self.api.clone(), self.index.clone());
        self.world.host("kubelet", move || {
            spur_fakes::kubelet::run(
                api.clone(),
                index.clone(),
                spur_fakes::kubelet::KubeletConfig::default(),
            )
        });
    }

    /// Creates SpurJob `namespace/name` with `spec`.
    pub fn create_spurjob(&self, namespace: &str, name: &str, spec: Value) -> Value {
        self.api
            .create(json!({
                "apiVersion": "spur.amd.com/v1alpha1",
                "kind": "SpurJob",
                "metadata": {"name": name, "namespace": namespace},
                "spec": spec,
            }))
            .expect("create a SpurJob")
    }

    /// SpurJob `namespace/name` as the API server holds it.
    pub fn spurjob(&self, namespace: &str, name: &str) -> Option<Value> {
        self.api
            .get("spur.amd.com/v1alpha1", "SpurJob", Some(namespace), name)
            .ok()
    }

    /// The pods in `namespace`, by name.
    pub fn pods(&self, namespace: &str) -> Vec<Value> {
        let mut pods: Vec<Value> = self
            .api
            .list("v1", "Pod")
            .unwrap_or_default()
            .into_iter()
            .filter(|p| p["metadata"]["namespace"] == namespace)
            .collect();
        pods.sort_by_key(|p| {
            p["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        });
        pods
    }

    /// The controller's view of job `id` (the leader's copy).
    pub fn controller_job(&self, id: u32) -> Option<spur_proto::JobInfo> {
        let cluster = self.world.cluster();
        let slot = cluster.leader().and_then(|l| cluster.slot_of(&l))?;
        cluster.read(slot, |state| state.jobs.get(&id).map(|j| j.info()))
    }

    /// The running operator replica on `name`, once started.
    pub fn operator(&self, name: &str) -> Option<Handles> {
        self.operators.borrow().get(name).cloned()
    }

    /// The handle that shuts operator replica `name` down gracefully.
    pub fn operator_stop(&self, name: &str) -> Option<OperatorStop> {
        self.stops.get(name).cloned()
    }

    /// The hosts operator replicas were started on.
    pub fn operator_hosts(&self) -> Vec<String> {
        self.stops.keys().cloned().collect()
    }

    /// Operator replicas that currently act as leader, by their own flags (for tests of
    /// the flag; safety checks judge the API server's record instead, see
    /// [`spur_judge::checks::acting`]).
    pub fn leading_operators(&self) -> Vec<String> {
        self.operators
            .borrow()
            .iter()
            .filter(|(_, h)| *h.leading.borrow())
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// The nodes the controller has registered (as the current leader's copy shows).
    pub fn registered_nodes(&self) -> Vec<String> {
        let cluster = self.world.cluster();
        let Some(slot) = cluster.leader().and_then(|l| cluster.slot_of(&l)) else {
            return Vec::new();
        };
        cluster.read(slot, |state| state.nodes.keys().cloned().collect())
    }

    /// `method` calls that succeeded, each counted once: at the replica the caller reached
    /// (a follower's forward is traced as `(forwarded)` at the leader).
    pub fn successful_calls(&self, method: &str) -> usize {
        self.world.trace().find(&format!("{method} -> ok")).len()
    }
}
