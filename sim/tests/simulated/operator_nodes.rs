//! The real operator in the simulated world: node registration, heartbeats, NotReady,
//! refusals, forgotten nodes, and leader election between two replicas.

use std::time::Duration;

use serde_json::json;
use spur_fakes::model::RefusalKind;
use spur_judge::checks::acting::ActingCheck;
use spur_sim::harness::{OPERATOR_LEASE, Sim};

/// Fast heartbeats so a test sees several in a short run.
const FLAGS: &[&str] = &["--heartbeat-interval", "5s"];

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

#[test]
fn registers_and_heartbeats_every_labelled_node() {
    let mut sim = Sim::new(11);
    sim.add_nodes(4);
    // A node without the label is not the operator's.
    sim.add_node(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "cpu-only", "labels": {"kubernetes.io/hostname": "cpu-only"}},
        "status": {"allocatable": {"cpu": "8", "memory": "16Gi"}}
    }));
    sim.start_operator("operator", FLAGS);
    sim.world.run_until(secs(40)).unwrap();

    assert_eq!(
        sim.registered_nodes(),
        ["node-0", "node-1", "node-2", "node-3"]
    );
    let handles = sim.operator("operator").expect("the operator started");
    assert!(*handles.leading.borrow(), "a lone replica takes the lease");
    assert_eq!(handles.registered.len(), 4);
    // Heartbeats every 5 s for 4 nodes since registration: several rounds.
    let beats = sim.successful_calls("Heartbeat");
    assert!(beats >= 4 * 4, "only {beats} heartbeats");
    // The node's resources came from its allocatable.
    let cluster = sim.world.cluster();
    let slot = cluster.slot_of(&cluster.leader().unwrap()).unwrap();
    let (cpus, gpus, address) = cluster.read(slot, |s| {
        let n = &s.nodes["node-2"];
        let r = n.resources.clone();
        (r.cpus, r.gpus.len(), n.address.clone())
    });
    assert_eq!((cpus, gpus, address.as_str()), (64, 8, "operator"));
}

#[test]
fn a_not_ready_taint_reaches_the_controller_and_clears() {
    let mut sim = Sim::new(12);
    sim.add_nodes(2);
    sim.start_operator("operator", FLAGS);
    sim.world.run_until(secs(20)).unwrap();
    let taint = json!({"spec": {"taints": [
        {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}
    ]}});
    sim.api
        .merge_patch("v1", "Node", None, "node-1", &taint, false)
        .unwrap();
    sim.world.run_until(secs(25)).unwrap();
    let state_of = |sim: &Sim, node: &str| {
        let cluster = sim.world.cluster();
        let slot = cluster.slot_of(&cluster.leader().unwrap()).unwrap();
        cluster.read(slot, |s| {
            (s.nodes[node].state, s.nodes[node].reason.clone())
        })
    };
    // DRAIN by default (`--not-ready-node-state`): spurctld keeps the node's running jobs.
    let (state, reason) = state_of(&sim, "node-1");
    assert_eq!(state, spur_proto::NodeState::NodeDrain);
    assert!(reason.contains("not-ready"), "{reason}");
    assert_eq!(state_of(&sim, "node-0").0, spur_proto::NodeState::NodeIdle);

    let clear = json!({"spec": {"taints": null}});
    sim.api
        .merge_patch("v1", "Node", None, "node-1", &clear, false)
        .unwrap();
    sim.world.run_until(secs(30)).unwrap();
    assert_eq!(state_of(&sim, "node-1").0, spur_proto::NodeState::NodeIdle);
}

fn node_state(sim: &Sim, node: &str) -> (spur_proto::NodeState, String) {
    let cluster = sim.world.cluster();
    let slot = cluster.slot_of(&cluster.leader().unwrap()).unwrap();
    cluster.read(slot, |s| {
        (s.nodes[node].state, s.nodes[node].reason.clone())
    })
}

#[test]
fn a_cordon_drains_the_node_with_its_reason_an_uncordon_lifts_it_and_an_admins_drain_stays() {
    let mut sim = Sim::new(13);
    sim.add_nodes(2);
    sim.start_operator("operator", FLAGS);
    sim.world.run_until(secs(20)).unwrap();
    let patch = |sim: &Sim, patch: serde_json::Value| {
        sim.api
            .merge_patch("v1", "Node", None, "node-1", &patch, false)
            .unwrap();
    };
    patch(
        &sim,
        json!({"metadata": {"annotations": {"spur.amd.com/drain-reason": "RMA 4411"}},
               "spec": {"unschedulable": true}}),
    );
    sim.world.run_until(secs(25)).unwrap();
    assert_eq!(
        node_state(&sim, "node-1"),
        (
            spur_proto::NodeState::NodeDrain,
            "Kubernetes: cordoned: RMA 4411".to_owned()
        )
    );
    assert_eq!(
        node_state(&sim, "node-0").0,
        spur_proto::NodeState::NodeIdle
    );
    patch(&sim, json!({"spec": {"unschedulable": false}}));
    sim.world.run_until(secs(30)).unwrap();
    assert_eq!(
        node_state(&sim, "node-1").0,
        spur_proto::NodeState::NodeIdle
    );

    // An administrator drains node-1 in spurctld; no cordon, uncordon or restart of the
    // operator touches it.
    let cluster = sim.world.cluster().clone();
    let slot = cluster.slot_of(&cluster.leader().unwrap()).unwrap();
    cluster
        .propose(
            slot,
            spur_fakes::model::state::Command::UpdateNode {
                name: "node-1".into(),
                state: Some(spur_proto::NodeState::NodeDrain),
                reason: Some("admin: RMA 77".into()),
                labels: Default::default(),
                remove_labels: Vec::new(),
            },
            sim.world.elapsed(),
        )
        .expect("the administrator's drain");
    let held = (spur_proto::NodeState::NodeDrain, "admin: RMA 77".to_owned());
    for (at, unschedulable) in [(35, true), (40, false)] {
        patch(&sim, json!({"spec": {"unschedulable": unschedulable}}));
        sim.world.run_until(secs(at)).unwrap();
        assert_eq!(
            node_state(&sim, "node-1"),
            held,
            "unschedulable: {unschedulable}"
        );
    }
    sim.world.restart("operator");
    sim.world.run_until(secs(60)).unwrap();
    assert_eq!(node_state(&sim, "node-1"), held, "after a restart");
    assert_eq!(
        node_state(&sim, "node-0").0,
        spur_proto::NodeState::NodeIdle
    );
}

#[test]
fn a_refused_registration_is_retried_alone_until_accepted() {
    let mut sim = Sim::new(13);
    sim.add_nodes(3);
    // Every registration is refused for the first 20 s.
    sim.world
        .cluster()
        .refuse_registrations(secs(20), RefusalKind::NotAccepted);
    sim.start_operator("operator", FLAGS);
    sim.world.run_until(secs(19)).unwrap();
    assert!(sim.registered_nodes().is_empty());
    // Once the refusal clears, each node's own backoff brings it in: no restart, no
    // node change, no other trigger.
    sim.world.run_until(secs(60)).unwrap();
    assert_eq!(sim.registered_nodes(), ["node-0", "node-1", "node-2"]);
}

#[test]
fn a_forgotten_node_is_registered_again_after_its_heartbeat() {
    let mut sim = Sim::new(14);
    sim.add_nodes(2);
    sim.start_operator("operator", FLAGS);
    sim.world.run_until(secs(20)).unwrap();
    assert_eq!(sim.registered_nodes().len(), 2);
    // Registrations the leader committed (a call a follower forwards is answered, and
    // traced, by both replicas, so answers would count it twice).
    let commits = |sim: &Sim| sim.world.trace().find(": register node ").len();
    let registrations = commits(&sim);
    // Between two heartbeat rounds (every 5 s from the operator's start).
    sim.world.run_until(Duration::from_millis(22_500)).unwrap();
    sim.world.cluster().forget_nodes(sim.world.elapsed());
    sim.world.run_until(secs(24)).unwrap();
    assert!(
        sim.registered_nodes().is_empty(),
        "the controller lost its nodes"
    );
    // The next heartbeat answers NOT_FOUND and brings re-registration at once.
    sim.world.run_until(secs(30)).unwrap();
    assert_eq!(sim.registered_nodes().len(), 2);
    assert!(!sim.world.trace().find("Heartbeat -> NotFound").is_empty());
    assert_eq!(commits(&sim), registrations + 2);
}

/// Runs `sim` to `until` in 1 s steps, judging who acted from the API server's record
/// against the Lease (never the replicas' own flags); returns the violations.
fn judge_acting(sim: &mut Sim, check: &mut ActingCheck, from: u64, until: u64) -> Vec<String> {
    let mut violations = Vec::new();
    for t in from + 1..=until {
        sim.world.run_until(secs(t)).unwrap();
        violations.extend(
            spur_sim::scenario::observe::judge_acting(check, sim)
                .iter()
                .map(ToString::to_string),
        );
    }
    violations
}

fn submit_jobs(sim: &Sim, prefix: &str, count: usize) {
    for i in 0..count {
        sim.create_spurjob(
            "default",
            &format!("{prefix}-{i}"),
            json!({"image": "busybox", "command": ["true"],
                   "env": {"SIM_RUN_SECONDS": "5", "SIM_EXIT_CODE": "0"}}),
        );
    }
}

/// The nodes' agent addresses as the controller's leader holds them.
fn node_addresses(sim: &Sim) -> Vec<String> {
    let cluster = sim.world.cluster();
    let slot = cluster.slot_of(&cluster.leader().unwrap()).unwrap();
    cluster.read(slot, |s| {
        s.nodes.values().map(|n| n.address.clone()).collect()
    })
}

#[test]
fn with_two_replicas_exactly_one_acts() {
    let mut sim = Sim::new(15);
    sim.add_nodes(2);
    sim.start_kubelet();
    sim.start_operator("operator-a", FLAGS);
    sim.start_operator("operator-b", FLAGS);
    let mut check = ActingCheck::new(OPERATOR_LEASE, &["operator-a", "operator-b"]);
    submit_jobs(&sim, "first", 3);
    let violations = judge_acting(&mut sim, &mut check, 0, 40);
    assert!(violations.is_empty(), "{violations:#?}");
    // Ground truth: one term, and only its holder wrote anything a leader writes.
    let terms = sim.leases.terms(OPERATOR_LEASE);
    assert_eq!(terms.len(), 1, "{terms:?}");
    let leader = terms[0].holder.clone().expect("a holder");
    let other = if leader == "operator-a" {
        "operator-b"
    } else {
        "operator-a"
    };
    assert!(
        check.judged.get(&leader).is_some_and(|n| *n > 3),
        "{:?}",
        check.judged
    );
    assert!(!check.judged.contains_key(other), "{:?}", check.judged);
    // And only the leader called the controller's writes (registrations, heartbeats).
    assert!(
        check.calls_judged.get(&leader).is_some_and(|n| *n > 4),
        "{:?}",
        check.calls_judged
    );
    assert!(
        !check.calls_judged.contains_key(other),
        "{:?}",
        check.calls_judged
    );
    assert_eq!(sim.registered_nodes().len(), 2);
    let addresses = node_addresses(&sim);
    assert!(addresses.iter().all(|a| *a == leader), "{addresses:?}");

    // The leader dies: the other takes the lease over, acts, and re-registers the nodes
    // with its own address.
    sim.world.kill(&leader, spur_sim::world::KillMode::Silent);
    submit_jobs(&sim, "second", 3);
    let violations = judge_acting(&mut sim, &mut check, 40, 75);
    assert!(violations.is_empty(), "{violations:#?}");
    assert_eq!(sim.leases.holder(OPERATOR_LEASE).as_deref(), Some(other));
    assert!(
        check.judged.get(other).is_some_and(|n| *n > 3),
        "{:?}",
        check.judged
    );
    assert!(
        check.calls_judged.get(other).is_some_and(|n| *n > 4),
        "{:?}",
        check.calls_judged
    );
    for name in ["second-0", "second-1", "second-2"] {
        let job = sim.spurjob("default", name).unwrap();
        assert!(job["status"]["spurJobId"].is_u64(), "{name}: {job}");
    }
    let addresses = node_addresses(&sim);
    assert!(addresses.iter().all(|a| a == other), "{addresses:?}");
}

/// The check can fail: two replicas campaigning on different Leases both act, and the
/// API server's record shows it.
#[test]
fn two_replicas_on_different_leases_are_caught_acting_together() {
    let mut sim = Sim::new(16);
    sim.add_nodes(2);
    sim.start_kubelet();
    sim.start_operator("operator-a", FLAGS);
    let mut flags = FLAGS.to_vec();
    flags.extend(["--lease-name", "spur-operator-b"]);
    sim.start_operator("operator-b", &flags);
    let mut check = ActingCheck::new(OPERATOR_LEASE, &["operator-a", "operator-b"]);
    submit_jobs(&sim, "job", 3);
    let violations = judge_acting(&mut sim, &mut check, 0, 30);
    assert!(
        violations
            .iter()
            .any(|v| v.contains("acting-without-lease")),
        "{violations:#?}"
    );
    assert!(
        violations.iter().any(|v| v.contains("acting-interleaved")),
        "{violations:#?}"
    );
    // Both believed they led, by their own flags: what the old test would have missed
    // had it read only the lease the deployment uses.
    assert_eq!(sim.leading_operators().len(), 2);
}

/// The fence on the agent's writes, in a world: the acting replica is stopped (SIGTERM)
/// while LaunchJobs wait on a slow API server (each call 1.5 s, so a launch's Node read
/// and pod create take 3 s). Its Lease is released only once the launches in flight are
/// answered, no pod is created by a replica the Lease does not name at that moment, and
/// every job still gets its pod, from the replica that takes over.
#[test]
fn a_sigterm_during_launches_on_a_slow_api_server_leaves_no_write_outside_the_lease() {
    let mut sim = Sim::new(17);
    sim.add_nodes(2);
    sim.start_kubelet();
    sim.start_operator("operator-a", FLAGS);
    sim.start_operator("operator-b", FLAGS);
    let mut check = ActingCheck::new(OPERATOR_LEASE, &["operator-a", "operator-b"]);
    let violations = judge_acting(&mut sim, &mut check, 0, 10);
    assert!(violations.is_empty(), "{violations:#?}");
    let leader = sim.leases.holder(OPERATOR_LEASE).expect("a leader");
    let other = if leader == "operator-a" {
        "operator-b"
    } else {
        "operator-a"
    };
    sim.api.faults().set_latency(Duration::from_millis(1500));
    submit_jobs(&sim, "slow", 3);
    // Stop the leader once the first LaunchJob is answered: the next is under way (a call
    // that started after the stop would be refused at once, not answered `ok`).
    let mut at = secs(10);
    while sim.world.trace().find("LaunchJob job").is_empty() {
        at += Duration::from_millis(100);
        assert!(at < secs(60), "no launch within 50 s");
        sim.world.run_until(at).unwrap();
        no_violations(&mut check, &mut sim);
    }
    let in_flight = sim.world.trace().find("LaunchJob job").len();
    sim.operator_stop(&leader).expect("stop handle").stop();
    let violations = judge_acting(&mut sim, &mut check, at.as_secs(), 90);
    assert!(violations.is_empty(), "{violations:#?}");
    // The launch in flight at the stop was answered (its pod made) before the Lease was
    // released, and the other replica took over only after.
    let launches = sim.world.trace().find("LaunchJob job");
    let answered = launches
        .get(in_flight)
        .expect("the launch in flight was answered");
    assert!(answered.event.ends_with(": ok"), "{answered}");
    let terms = sim.leases.terms(OPERATOR_LEASE);
    let released = terms
        .iter()
        .find(|t| t.at > at)
        .expect("the Lease changed after the stop");
    assert!(released.at >= answered.at, "{terms:?} vs {answered}");
    assert_eq!(sim.leases.holder(OPERATOR_LEASE).as_deref(), Some(other));
    // Every job still got its pod.
    for i in 0..3 {
        let name = format!("slow-{i}");
        let job = sim.spurjob("default", &name).unwrap();
        assert!(job["status"]["spurJobId"].is_u64(), "{name}: {job}");
    }
    assert_eq!(sim.pods("default").len(), 3);
}

fn no_violations(check: &mut ActingCheck, sim: &mut Sim) {
    let violations: Vec<String> = spur_sim::scenario::observe::judge_acting(check, sim)
        .iter()
        .map(ToString::to_string)
        .collect();
    assert!(violations.is_empty(), "{violations:#?}");
}
