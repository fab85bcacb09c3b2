//! Seeded fault scenarios: one seed plans a workload and a mix of faults
//! ([`plan`]), the real operator runs through them, and the checks of sim.md judge the
//! world's ground truth ([`checks`]). A failure prints the command that replays it.

pub mod observe;
pub mod sabotage;
pub mod stage;

pub use spur_judge::checks;
pub use spur_judge::plan;

use std::cell::Cell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::harness::{OPERATOR_LEASE, OperatorStop, Sim};
use crate::operator::KUBE_API_HOST;
use crate::world::{KillMode, World};
pub use checks::{Deadlines, Violation};
pub use plan::{Fault, Intensity, LeaderChange, Plan, ScenarioConfig, plan};
use spur_fakes::api_server::{ApiResult, ApiServer, OutageMode};
use spur_fakes::leases::LeaseHistory;
use spur_fakes::model::LostReply;
use spur_judge::profiles::Profile;
use spur_judge::stage::Settings;
use stage::SimStage;

pub use spur_judge::hosts::{OPERATOR, OPERATOR_B, PROBER, PROBER_B, REPLACE_AFTER, SAMPLE};
pub use spur_judge::outcome::{LagStats, Outcome};

/// Runs the scenario of `seed` on a thread of its own, so per-thread state left by an
/// earlier scenario (hash keys, the entropy stream) cannot change this one: a seed gives
/// the same trace whether it runs first in a process or thousandth.
pub fn run_isolated(seed: u64, profile: Profile, config: &ScenarioConfig) -> Outcome {
    let config = config.clone();
    let replay_args = config.intensity.for_seed(seed).args();
    let service = Some(config.intensity.service_for(seed));
    std::thread::Builder::new()
        .name(format!("seed-{seed}"))
        .stack_size(32 << 20)
        .spawn(move || run(seed, profile, &config))
        .expect("spawn a scenario thread")
        .join()
        .unwrap_or_else(|panic| {
            let what = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_default();
            let violation = Violation {
                check: "panic",
                object: "scenario".into(),
                at: Duration::ZERO,
                detail: what,
            };
            Outcome {
                service,
                replay_args,
                ..Outcome::failed(seed, profile, violation)
            }
        })
}

/// Runs the scenario of `seed` with the operator configured by `profile`.
pub fn run(seed: u64, profile: Profile, config: &ScenarioConfig) -> Outcome {
    run_plan(&plan(seed, config), profile, config)
}

/// Runs `plan` (a seed's, or one the lab also runs on real processes) with the operator
/// configured by `profile`; the seed is the plan's.
pub fn run_plan(plan: &Plan, profile: Profile, config: &ScenarioConfig) -> Outcome {
    let settings = Settings {
        profile,
        timeline: config.timeline,
        started: Instant::now(),
    };
    let mut stage = SimStage::new(plan, profile, config);
    spur_judge::stage::run(plan, &mut stage, settings)
}

/// The operator replica the Lease names now (ground truth), else `operator`: partitions
/// of "the operator" cut the replica that acts, whichever it is.
fn acting_operator(leases: &LeaseHistory, stops: &BTreeMap<String, OperatorStop>) -> String {
    leases
        .holder(OPERATOR_LEASE)
        .filter(|h| stops.contains_key(h))
        .unwrap_or_else(|| OPERATOR.to_owned())
}

/// Cuts replica `slot` off from the other replicas until `heal_at`.
fn cut_from_peers(w: &mut World, slot: usize, heal_at: Duration) {
    let cut = w.cluster().host_of(slot);
    let others: Vec<String> = (0..w.cluster().config().replicas)
        .filter(|s| *s != slot)
        .map(|s| w.cluster().host_of(s))
        .collect();
    for other in &others {
        w.partition(&cut, other);
    }
    w.at(heal_at, move |w| {
        for other in &others {
            w.repair(&cut, other);
        }
    });
}

/// A fault aimed at the leader, when there is none: in the trace, and not one of the
/// scenario's faults.
fn skipped_for_no_leader(w: &World, fault: &Fault, skip: impl FnOnce()) {
    w.trace().record(
        crate::determinism::sim_elapsed(),
        "harness",
        format!("{} skipped: no controller leader to strike", fault.name()),
    );
    skip();
}

/// Schedules `fault` at `at`; one that finds nothing to strike when it comes (no leader to
/// kill, freeze or cut off) is traced as skipped and reported through `skip`.
fn schedule_fault(
    sim: &mut Sim,
    at: Duration,
    fault: Fault,
    api_up: Rc<Cell<bool>>,
    skip: impl FnOnce() + 'static,
) {
    let api = sim.api.clone();
    let leases = sim.leases.clone();
    let stops: BTreeMap<String, OperatorStop> = sim
        .operator_hosts()
        .into_iter()
        .filter_map(|h| sim.operator_stop(&h).map(|s| (h, s)))
        .collect();
    sim.world.at(at, move |w: &mut World| {
        let now = w.elapsed();
        match fault {
            Fault::LeaderKillSilent => kill_leader(w, &fault, KillMode::Silent, now, skip),
            Fault::LeaderKillGraceful => kill_leader(w, &fault, KillMode::Graceful, now, skip),
            Fault::LeaderFreeze { thaw_after } => freeze_leader(w, &fault, now + thaw_after, skip),
            Fault::LeaderCutOff { heal_after, .. } => {
                cut_off_leader(w, &fault, now + heal_after, skip)
            }
            Fault::FollowerKill => kill_follower(w, &fault, now, skip),
            Fault::FollowerCutOff { heal_after, .. } => {
                let follower = first_follower(w).expect("three replicas");
                cut_from_peers(w, follower, now + heal_after);
            }
            Fault::PartitionReplica { slot, heal_after } => {
                cut_from_peers(w, slot, now + heal_after);
            }
            Fault::PartitionOperatorReplica { slot, heal_after } => {
                let replicas = vec![w.cluster().host_of(slot)];
                let operator = acting_operator(&leases, &stops);
                cut_operator_from(w, operator, replicas, now + heal_after);
            }
            Fault::PartitionOperatorService { heal_after } => {
                let replicas: Vec<String> = (0..w.cluster().config().replicas)
                    .map(|slot| w.cluster().host_of(slot))
                    .collect();
                let operator = acting_operator(&leases, &stops);
                cut_operator_from(w, operator, replicas, now + heal_after);
            }
            Fault::ApiOutage { duration } => api_outage(w, &api, api_up, now + duration),
            Fault::WatchCut => api
                .faults()
                .cut_watches(spur_fakes::api_server::CutKind::Abort),
            Fault::StatusConflict { writes } => api.faults().conflict_next_status_writes(writes),
            Fault::OperatorRestart => restart_operator(w, now, skip),
            Fault::OperatorLeaderChange { how, down_for } => {
                let leader = acting_operator(&leases, &stops);
                change_operator_leader(w, leader, &stops, how, now, down_for);
            }
            Fault::NodeNotReadyFlap { node, down_for } => {
                flap_node_ready(w, &api, node, now + down_for)
            }
            Fault::NodeResourcesChanged { node } => change_node_resources(&api, node),
            Fault::NodeDeleted { node } => delete_node(&api, node),
            Fault::ReplyLost { hang } => lose_next_submit_reply(w, hang),
        }
    });
}

/// The first controller replica by slot that does not lead now, if any.
fn first_follower(w: &World) -> Option<usize> {
    let leader = w.leader();
    (0..w.cluster().config().replicas).find(|slot| Some(w.cluster().host_of(*slot)) != leader)
}

/// Kills the controller leader with `mode`, and replaces its pod [`REPLACE_AFTER`] later.
fn kill_leader(w: &mut World, fault: &Fault, mode: KillMode, now: Duration, skip: impl FnOnce()) {
    if let Some(leader) = w.leader()
        && let Some(slot) = w.cluster().slot_of(&leader)
    {
        w.kill(&leader, mode);
        w.at(now + REPLACE_AFTER, move |w| {
            w.replace_replica(slot);
        });
    } else {
        skipped_for_no_leader(w, fault, skip);
    }
}

/// Freezes the controller leader until `thaw_at`.
fn freeze_leader(w: &mut World, fault: &Fault, thaw_at: Duration, skip: impl FnOnce()) {
    if let Some(leader) = w.leader() {
        w.freeze(&leader);
        w.at(thaw_at, move |w| w.thaw(&leader));
    } else {
        skipped_for_no_leader(w, fault, skip);
    }
}

/// Cuts the controller leader off from the other replicas until `heal_at`.
fn cut_off_leader(w: &mut World, fault: &Fault, heal_at: Duration, skip: impl FnOnce()) {
    if let Some(leader) = w.leader()
        && let Some(slot) = w.cluster().slot_of(&leader)
    {
        cut_from_peers(w, slot, heal_at);
    } else {
        skipped_for_no_leader(w, fault, skip);
    }
}

/// Kills the first follower silently, and replaces its pod [`REPLACE_AFTER`] later.
fn kill_follower(w: &mut World, fault: &Fault, now: Duration, skip: impl FnOnce()) {
    if let Some(slot) = first_follower(w) {
        w.kill_replica(slot, KillMode::Silent);
        w.at(now + REPLACE_AFTER, move |w| {
            w.replace_replica(slot);
        });
    } else {
        w.trace().record(
            crate::determinism::sim_elapsed(),
            "harness",
            format!("{} skipped: no controller follower to strike", fault.name()),
        );
        skip();
    }
}

/// Cuts `operator` off from each of `replicas` until `heal_at`.
fn cut_operator_from(w: &mut World, operator: String, replicas: Vec<String>, heal_at: Duration) {
    for replica in &replicas {
        w.partition(&operator, replica);
    }
    w.at(heal_at, move |w| {
        for replica in &replicas {
            w.repair(&operator, replica);
        }
    });
}

/// The API server answers 503 until `end_at`; `api_up` follows it for the checks.
fn api_outage(w: &mut World, api: &ApiServer, api_up: Rc<Cell<bool>>, end_at: Duration) {
    api.faults().start_outage(OutageMode::Unavailable);
    api_up.set(false);
    let api = api.clone();
    w.at(end_at, move |_| {
        api.faults().end_outage();
        api_up.set(true);
    });
}

/// Restarts the operator, unless it is down: a replica that a leader change took down is
/// already on its way back, and restarting it early would run it with its SIGTERM pending.
fn restart_operator(w: &mut World, now: Duration, skip: impl FnOnce()) {
    if w.net().is_down(OPERATOR) {
        w.trace()
            .record(now, "harness", format!("{OPERATOR} is down: no restart"));
        skip();
    } else {
        w.restart(OPERATOR);
    }
}

/// Takes the acting operator replica `leader` away from the lease as `how` says, and
/// brings it back `down_for` after `now`.
fn change_operator_leader(
    w: &mut World,
    leader: String,
    stops: &BTreeMap<String, OperatorStop>,
    how: LeaderChange,
    now: Duration,
    down_for: Duration,
) {
    let stop = stops[&leader].clone();
    match how {
        LeaderChange::Isolate => {
            w.partition(&leader, KUBE_API_HOST);
            w.at(now + down_for, move |w| w.repair(&leader, KUBE_API_HOST));
            return;
        }
        // The process drains, releases the lease and exits; the pod is out of the
        // picture (not ready) from now.
        LeaderChange::Sigterm => {
            w.trace()
                .record(now, "harness", format!("stop {leader} (SIGTERM)"));
            w.net().mark_down(&leader);
            stop.stop();
        }
        LeaderChange::Crash => w.kill(&leader, KillMode::Graceful),
    }
    w.at(now + down_for, move |w| {
        stop.reset();
        w.restart(&leader);
    });
}

/// The controller leader applies the next SubmitJob and loses its reply: the caller's
/// call hangs (`hang`) or fails with a transport error.
fn lose_next_submit_reply(w: &World, hang: bool) {
    let how = if hang {
        LostReply::Hang
    } else {
        LostReply::TransportError
    };
    w.cluster().lose_next_reply("SubmitJob", how);
}

/// Taints Node `node` NotReady, and clears its taints at `clear_at`.
fn flap_node_ready(w: &mut World, api: &ApiServer, node: usize, clear_at: Duration) {
    let name = format!("node-{node}");
    let taint = json!({"spec": {"taints": [
        {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]}});
    let tainted = api.merge_patch("v1", "Node", None, &name, &taint, false);
    landed(&format!("taint Node {name}"), tainted, Missing::Expected);
    let api = api.clone();
    w.at(clear_at, move |_| {
        let clear = json!({"spec": {"taints": null}});
        let cleared = api.merge_patch("v1", "Node", None, &name, &clear, false);
        landed(&format!("untaint Node {name}"), cleared, Missing::Expected);
    });
}

/// Changes the allocatable CPU of Node `node`.
fn change_node_resources(api: &ApiServer, node: usize) {
    let name = format!("node-{node}");
    let change = json!({"status": {"allocatable": {"cpu": "48"}}});
    let changed = api.merge_patch("v1", "Node", None, &name, &change, true);
    landed(&format!("change Node {name}"), changed, Missing::Expected);
}

/// Deletes Node `node`.
fn delete_node(api: &ApiServer, node: usize) {
    let name = format!("node-{node}");
    let deleted = api.delete("v1", "Node", None, &name);
    landed(&format!("delete Node {name}"), deleted, Missing::Expected);
}

/// Whether the object of a harness write may already be gone.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Missing {
    /// A node a node-deleted fault removed earlier: a later fault on it strikes nothing.
    Expected,
    Fails,
}

/// The harness's own writes to the API server must land: one that failed unseen would
/// shrink the workload or drop a fault, and the seed would pass for less. A failure ends
/// the seed (the scenario's thread panics, and the seed fails with this message).
fn landed<T>(what: &str, result: ApiResult<T>, missing: Missing) {
    match result {
        Ok(_) => {}
        Err(e) if missing == Missing::Expected && e.code == 404 => {}
        Err(e) => panic!(
            "the harness could not {what}: {} {} {}",
            e.code, e.reason, e.message
        ),
    }
}
