//! Node sync and heartbeats against the scripted controller, on tokio's paused clock.

use std::sync::atomic::Ordering;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, NodeSpec, Taint};
use kube::runtime::watcher;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;

use super::heartbeat;
use super::resources::tests::node;
use super::{AgentEndpoint, NodeSync, NodeSyncConfig, NotReadyState, Registered};
use crate::controller::ChannelConfig;
use crate::controller::testing::{MemoryNetwork, ScriptedController};
use crate::controller::{ControllerAddr, ControllerClient};
use crate::metrics::Metrics;
use crate::retry::{BackoffPolicy, Entropy};

type Events = mpsc::UnboundedSender<Result<watcher::Event<Node>, watcher::Error>>;

struct Harness {
    controller: ScriptedController,
    client: ControllerClient,
    events: Events,
    forgotten: mpsc::UnboundedSender<heartbeat::Rejoin>,
    registered: Registered,
    metrics: Metrics,
}

const RETRY: BackoffPolicy = BackoffPolicy {
    initial: Duration::from_millis(500),
    max: Duration::from_secs(8),
    jitter: 0.0,
    transient: None,
};

fn start(concurrency: usize) -> Harness {
    start_with(
        concurrency,
        NotReadyState::default(),
        ScriptedController::default(),
    )
}

fn start_with(
    concurrency: usize,
    not_ready: NotReadyState,
    controller: ScriptedController,
) -> Harness {
    let network = MemoryNetwork::start(controller.clone());
    let client = ControllerClient::new(
        ControllerAddr::new("spurctld", 6817),
        // Without the connect probe: these tests script every call the controller sees.
        ChannelConfig {
            connect_probe: None,
            ..ChannelConfig::default()
        },
        None,
        network,
    )
    .unwrap();
    let (events, events_rx) = mpsc::unbounded_channel();
    let (forgotten, forgotten_rx) = mpsc::unbounded_channel();
    let registered = Registered::default();
    let metrics = Metrics::new();
    let sync = NodeSync::new(
        NodeSyncConfig {
            concurrency,
            retry: RETRY,
            failure_log_interval: Duration::from_secs(10),
            agent: AgentEndpoint {
                address: "10.0.0.9".into(),
                port: 6818,
            },
            version: "test".into(),
            not_ready,
            drain_conditions: vec!["GPUProblem".into()],
            join_token: None,
            node_token_renew_before: Duration::from_secs(24 * 3600),
        },
        client.clone(),
        metrics.clone(),
        Entropy::from_seed(1),
        registered.clone(),
    );
    tokio::spawn(sync.run(
        UnboundedReceiverStream::new(events_rx),
        forgotten_rx,
        std::future::pending(),
    ));
    Harness {
        controller,
        client,
        events,
        forgotten,
        registered,
        metrics,
    }
}

fn gpu_node(name: &str) -> Node {
    node(
        name,
        &[("cpu", "8"), ("memory", "32Gi"), ("amd.com/gpu", "1")],
        &[],
    )
}

fn tainted(mut node: Node) -> Node {
    node.spec = Some(NodeSpec {
        taints: Some(vec![Taint {
            key: "node.kubernetes.io/not-ready".into(),
            effect: "NoSchedule".into(),
            ..Default::default()
        }]),
        ..Default::default()
    });
    node
}

impl Harness {
    fn list(&self, nodes: Vec<Node>) {
        self.events.send(Ok(watcher::Event::Init)).unwrap();
        for n in nodes {
            self.events.send(Ok(watcher::Event::InitApply(n))).unwrap();
        }
        self.events.send(Ok(watcher::Event::InitDone)).unwrap();
    }

    fn apply(&self, node: Node) {
        self.events.send(Ok(watcher::Event::Apply(node))).unwrap();
    }

    fn delete(&self, node: Node) {
        self.events.send(Ok(watcher::Event::Delete(node))).unwrap();
    }

    fn calls(&self, prefix: &str) -> Vec<String> {
        self.controller
            .log()
            .into_iter()
            .filter(|l| l.starts_with(prefix))
            .collect()
    }
}

async fn settle(d: Duration) {
    tokio::time::sleep(d).await;
}

#[tokio::test(start_paused = true)]
async fn registers_every_listed_node_once() {
    let h = start(32);
    h.list(vec![gpu_node("a"), gpu_node("b"), gpu_node("c")]);
    settle(Duration::from_millis(100)).await;
    // Concurrent, so in any order: each once.
    let mut calls = h.calls("RegisterAgent");
    calls.sort();
    assert_eq!(
        calls,
        ["RegisterAgent a", "RegisterAgent b", "RegisterAgent c"]
    );
    assert_eq!(h.registered.len(), 3);
    assert_eq!(h.metrics.nodes_registered.get(), 3);
    // An unchanged node is not registered again; a changed one is.
    h.apply(gpu_node("a"));
    let mut bigger = gpu_node("b");
    bigger
        .status
        .as_mut()
        .unwrap()
        .allocatable
        .as_mut()
        .unwrap()
        .insert(
            "cpu".into(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("16".into()),
        );
    h.apply(bigger);
    settle(Duration::from_millis(100)).await;
    assert_eq!(h.calls("RegisterAgent").len(), 4);
    assert_eq!(h.calls("RegisterAgent").last().unwrap(), "RegisterAgent b");
}

#[tokio::test(start_paused = true)]
async fn a_refused_node_is_retried_alone_until_accepted() {
    let h = start(32);
    h.controller.refuse_registration("b", 2);
    let started = tokio::time::Instant::now();
    h.list(vec![gpu_node("a"), gpu_node("b"), gpu_node("c")]);
    settle(Duration::from_millis(100)).await;
    assert!(h.registered.contains("a") && h.registered.contains("c"));
    assert!(!h.registered.contains("b"), "refused, so not remembered");
    // Retries at 0.5 s and then 1 s later, with no other trigger.
    while !h.registered.contains("b") {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "b never registered"
        );
        settle(Duration::from_millis(10)).await;
    }
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(1500) && took < Duration::from_millis(1600),
        "{took:?}"
    );
    // The first three went out together, in any order; then b alone, twice.
    let calls = h.calls("RegisterAgent");
    let mut first = calls[..3].to_vec();
    first.sort();
    assert_eq!(
        first,
        ["RegisterAgent a", "RegisterAgent b", "RegisterAgent c"]
    );
    assert_eq!(
        calls[3..],
        ["RegisterAgent b", "RegisterAgent b"],
        "the others were not registered again"
    );
}

#[tokio::test(start_paused = true)]
async fn a_controller_outage_backs_off_and_recovers() {
    let h = start(32);
    for _ in 0..3 {
        h.controller
            .fail_next(tonic::Status::unavailable("no leader elected yet"));
    }
    let started = tokio::time::Instant::now();
    h.list(vec![gpu_node("a")]);
    // Each failure doubles the wait (RETRY: 0.5 s, then 1 s, then 2 s; no jitter): the
    // fourth attempt, which succeeds, goes out 3.5 s after the first, and no sooner.
    let mut attempts = Vec::new();
    loop {
        if h.calls("RegisterAgent").len() > attempts.len() {
            attempts.push(started.elapsed());
        }
        if h.registered.contains("a") {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "a never registered"
        );
        settle(Duration::from_millis(10)).await;
    }
    let at: Vec<u64> = attempts
        .iter()
        .map(|d| (d.as_millis() as u64 + 50) / 100 * 100)
        .collect();
    assert_eq!(
        at,
        [0, 500, 1500, 3500],
        "attempts at (ms, to 0.1 s): {attempts:?}"
    );
    assert_eq!(h.calls("RegisterAgent").len(), 4);
}

#[tokio::test(start_paused = true)]
async fn not_ready_taint_drains_and_comes_back_idle() {
    let h = start(32);
    h.list(vec![tainted(gpu_node("a"))]);
    settle(Duration::from_millis(100)).await;
    assert_eq!(
        h.controller.log(),
        ["RegisterAgent a", "UpdateNode a NODE_DRAIN"]
    );
    h.apply(gpu_node("a"));
    settle(Duration::from_millis(100)).await;
    assert_eq!(
        h.calls("UpdateNode").last().unwrap(),
        "UpdateNode a NODE_IDLE"
    );
    // A refused update is retried until acknowledged.
    h.controller
        .fail_next(tonic::Status::unavailable("not the Raft leader"));
    h.apply(tainted(gpu_node("a")));
    settle(Duration::from_secs(2)).await;
    assert_eq!(
        h.calls("UpdateNode"),
        [
            "UpdateNode a NODE_DRAIN",
            "UpdateNode a NODE_IDLE",
            "UpdateNode a NODE_DRAIN",
            "UpdateNode a NODE_DRAIN"
        ]
    );
}

fn drained(h: &Harness, reason: &'static str) -> i64 {
    h.metrics
        .nodes_drained
        .get_or_create(&crate::metrics::DrainLabels { reason })
        .get()
}

#[tokio::test(start_paused = true)]
async fn a_cordon_or_a_gpu_problem_drains_and_lifting_it_comes_back_idle() {
    // Ignore concerns NotReady taints only: a cordon still drains.
    let h = start_with(32, NotReadyState::Ignore, ScriptedController::default());
    let mut cordoned = gpu_node("a");
    cordoned.spec = Some(NodeSpec {
        unschedulable: Some(true),
        ..Default::default()
    });
    h.list(vec![cordoned, gpu_node("b")]);
    settle(Duration::from_millis(100)).await;
    // (b, known to this controller, is told IDLE at its first registration, as any node.)
    assert_eq!(h.calls("UpdateNode a"), ["UpdateNode a NODE_DRAIN"]);
    assert_eq!((drained(&h, "cordoned"), drained(&h, "condition")), (1, 0));
    h.apply(gpu_node("a"));
    settle(Duration::from_millis(100)).await;
    assert_eq!(
        h.calls("UpdateNode a"),
        ["UpdateNode a NODE_DRAIN", "UpdateNode a NODE_IDLE"]
    );
    assert_eq!(drained(&h, "cordoned"), 0);

    let mut sick = gpu_node("b");
    sick.status.as_mut().unwrap().conditions =
        Some(vec![k8s_openapi::api::core::v1::NodeCondition {
            type_: "GPUProblem".into(),
            status: "True".into(),
            message: Some("GPU 3: uncorrectable ECC errors".into()),
            ..Default::default()
        }]);
    h.apply(sick);
    settle(Duration::from_millis(100)).await;
    assert_eq!(
        h.calls("UpdateNode").last().unwrap(),
        "UpdateNode b NODE_DRAIN"
    );
    assert_eq!(drained(&h, "condition"), 1);
    h.apply(gpu_node("b"));
    settle(Duration::from_millis(100)).await;
    assert_eq!(
        h.calls("UpdateNode").last().unwrap(),
        "UpdateNode b NODE_IDLE"
    );
    assert_eq!(drained(&h, "condition"), 0);
}

#[tokio::test(start_paused = true)]
async fn not_ready_taint_goes_down_only_when_asked_and_ignore_sends_nothing() {
    let h = start_with(32, NotReadyState::Down, ScriptedController::default());
    h.list(vec![tainted(gpu_node("a"))]);
    settle(Duration::from_millis(100)).await;
    assert_eq!(
        h.controller.log(),
        ["RegisterAgent a", "UpdateNode a NODE_DOWN"]
    );

    let h = start_with(32, NotReadyState::Ignore, ScriptedController::default());
    h.list(vec![tainted(gpu_node("a"))]);
    settle(Duration::from_millis(100)).await;
    // Registered and treated as healthy: its (first) availability is IDLE.
    assert_eq!(
        h.controller.log(),
        ["RegisterAgent a", "UpdateNode a NODE_IDLE"]
    );
}

#[tokio::test(start_paused = true)]
async fn an_administrators_drain_is_neither_lifted_nor_overwritten() {
    let controller = ScriptedController::default();
    controller.hold_node("a", spur_proto::NodeState::NodeDrain, "RMA 77");
    controller.hold_node(
        "b",
        spur_proto::NodeState::NodeDrain,
        "Kubernetes: cordoned",
    );
    let h = start_with(32, NotReadyState::Drain, controller.clone());
    // A restart: both known to spurctld, both Ready and uncordoned in Kubernetes.
    h.list(vec![gpu_node("a"), gpu_node("b")]);
    settle(Duration::from_millis(100)).await;
    // The operator's own hold is lifted; the administrator's is kept.
    assert_eq!(h.calls("UpdateNode"), ["UpdateNode b NODE_IDLE"]);
    // A cordon writes no reason of its own over it either.
    let mut cordoned = gpu_node("a");
    cordoned.spec.get_or_insert_default().unschedulable = Some(true);
    h.apply(cordoned);
    settle(Duration::from_millis(100)).await;
    assert_eq!(h.calls("UpdateNode"), ["UpdateNode b NODE_IDLE"]);
}

#[tokio::test(start_paused = true)]
async fn the_first_idles_of_many_nodes_share_one_read_of_the_administrators_holds() {
    let controller = ScriptedController::default();
    controller.hold_node("n07", spur_proto::NodeState::NodeDrain, "RMA 7");
    controller.set_read_delay(Duration::from_millis(20));
    let h = start_with(64, NotReadyState::Drain, controller.clone());
    let names: Vec<String> = (0..40).map(|i| format!("n{i:02}")).collect();
    h.list(names.iter().map(|n| gpu_node(n)).collect());
    settle(Duration::from_secs(1)).await;
    // Every node but the held one is made IDLE, and the 40 decisions took one read, made
    // while every call was waiting on it; one read per node would be 40.
    assert_eq!(h.calls("UpdateNode").len(), 39);
    assert!(
        !h.calls("UpdateNode")
            .contains(&"UpdateNode n07 NODE_IDLE".to_owned())
    );
    assert_eq!(
        controller
            .node_reads
            .load(std::sync::atomic::Ordering::SeqCst),
        1
    );
    // A later decision reads afresh: the hold may have changed meanwhile.
    controller.hold_node("n07", spur_proto::NodeState::NodeIdle, "");
    let mut cordoned = gpu_node("n12");
    cordoned.spec.get_or_insert_default().unschedulable = Some(true);
    h.apply(cordoned);
    settle(Duration::from_secs(1)).await;
    assert_eq!(
        controller
            .node_reads
            .load(std::sync::atomic::Ordering::SeqCst),
        2
    );
}

#[tokio::test(start_paused = true)]
async fn a_restarted_operator_lifts_the_hold_its_predecessor_left() {
    // spurctld keeps a node's state across re-registration: a node an earlier operator
    // drained stays drained until IDLE is sent.
    let controller = ScriptedController::default();
    let before = start_with(32, NotReadyState::Drain, controller.clone());
    before.list(vec![tainted(gpu_node("a"))]);
    settle(Duration::from_millis(100)).await;
    assert_eq!(before.calls("UpdateNode"), ["UpdateNode a NODE_DRAIN"]);

    let after = start_with(32, NotReadyState::Drain, controller.clone());
    after.list(vec![gpu_node("a")]);
    settle(Duration::from_millis(100)).await;
    assert_eq!(
        after.calls("UpdateNode"),
        ["UpdateNode a NODE_DRAIN", "UpdateNode a NODE_IDLE"]
    );
    // Registering again (new resources) does not repeat it: the state is known now.
    let mut bigger = gpu_node("a");
    bigger
        .status
        .as_mut()
        .unwrap()
        .allocatable
        .as_mut()
        .unwrap()
        .insert(
            "cpu".into(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("16".into()),
        );
    after.apply(bigger);
    settle(Duration::from_millis(100)).await;
    assert_eq!(after.calls("RegisterAgent").len(), 3);
    assert_eq!(after.calls("UpdateNode").len(), 2);
}

#[tokio::test(start_paused = true)]
async fn an_update_for_a_node_the_controller_lost_registers_it_again() {
    let h = start(32);
    h.list(vec![gpu_node("a")]);
    settle(Duration::from_millis(100)).await;
    assert_eq!(h.calls("UpdateNode"), ["UpdateNode a NODE_IDLE"]);
    // spurctld lost the node: the taint's DRAIN answers INTERNAL "node a not found".
    h.controller
        .fail_next(tonic::Status::internal("node a not found"));
    h.apply(tainted(gpu_node("a")));
    settle(Duration::from_millis(100)).await;
    assert_eq!(
        h.controller.log(),
        [
            "RegisterAgent a",
            "UpdateNode a NODE_IDLE",
            "UpdateNode a NODE_DRAIN",
            "RegisterAgent a",
            "UpdateNode a NODE_DRAIN"
        ]
    );
    assert!(h.registered.contains("a"));
    // Healthy again: IDLE, once.
    h.apply(gpu_node("a"));
    settle(Duration::from_millis(100)).await;
    assert_eq!(
        h.calls("UpdateNode").last().unwrap(),
        "UpdateNode a NODE_IDLE"
    );
    assert_eq!(h.calls("RegisterAgent").len(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_deleted_node_is_marked_down_and_forgotten() {
    let h = start(32);
    h.list(vec![gpu_node("a"), gpu_node("b")]);
    settle(Duration::from_millis(100)).await;
    h.delete(gpu_node("a"));
    settle(Duration::from_millis(100)).await;
    assert_eq!(
        h.calls("UpdateNode a NODE_DOWN"),
        ["UpdateNode a NODE_DOWN"]
    );
    assert!(!h.registered.contains("a"));
    // A node that vanished while the watch was down is noticed at the re-list.
    h.list(vec![gpu_node("a")]);
    settle(Duration::from_millis(100)).await;
    assert_eq!(
        h.calls("UpdateNode b NODE_DOWN"),
        ["UpdateNode b NODE_DOWN"]
    );
    assert_eq!(h.calls("UpdateNode a NODE_DOWN").len(), 1);
    assert!(h.registered.contains("a") && !h.registered.contains("b"));
}

#[tokio::test(start_paused = true)]
async fn a_forgotten_node_is_registered_again_at_once() {
    let h = start(32);
    h.list(vec![gpu_node("a"), gpu_node("b")]);
    settle(Duration::from_millis(100)).await;
    let round = heartbeat::round(&h.client, &h.registered, 8, &h.metrics).await;
    assert_eq!((round.sent, round.failed), (2, 0));
    assert!(
        h.calls("Heartbeat a token-a").len() == 1,
        "the node token is sent"
    );

    h.controller.forget_all();
    let round = heartbeat::round(&h.client, &h.registered, 8, &h.metrics).await;
    assert_eq!(round.forgotten, ["a", "b"]);
    for name in round.forgotten {
        h.forgotten
            .send(heartbeat::Rejoin::Forgotten(name))
            .unwrap();
    }
    settle(Duration::from_millis(100)).await;
    assert!(h.controller.knows("a") && h.controller.knows("b"));
    assert_eq!(h.calls("RegisterAgent").len(), 4);
    let round = heartbeat::round(&h.client, &h.registered, 8, &h.metrics).await;
    assert_eq!(round.failed, 0);
}

#[tokio::test(start_paused = true)]
async fn registration_concurrency_is_bounded() {
    let h = start(32);
    h.controller.set_delay(Duration::from_millis(10));
    let started = tokio::time::Instant::now();
    h.list((0..200).map(|i| gpu_node(&format!("n{i:03}"))).collect());
    while h.registered.len() < 200 {
        settle(Duration::from_millis(1)).await;
    }
    assert_eq!(h.controller.max_in_flight.load(Ordering::SeqCst), 32);
    // 200 nodes, 32 at a time, 10 ms each: seven waves.
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(70) && took < Duration::from_millis(90),
        "{took:?}"
    );
}
