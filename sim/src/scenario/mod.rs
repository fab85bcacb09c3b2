//! Seeded fault scenarios: one seed plans a workload and a mix of faults
//! ([`plan`]), the real operator runs through them, and the checks of sim.md judge the
//! world's ground truth ([`checks`]). A failure prints the command that replays it.

pub mod observe;
pub mod sabotage;

pub use spur_judge::checks;
pub use spur_judge::plan;

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::harness::{OPERATOR_LEASE, OperatorStop, Sim};
use crate::net::NetConfig;
use crate::operator::KUBE_API_HOST;
use crate::prober::ProbeRule;
use crate::world::{KillMode, World, WorldConfig};
pub use checks::{Deadlines, Violation};
use observe::{SampleSim, sample_readiness};
pub use plan::{Fault, Intensity, LeaderChange, Plan, ScenarioConfig, plan};
use spur_fakes::api_server::{ApiResult, OutageMode};
use spur_fakes::leases::LeaseHistory;
use spur_fakes::model::LostReply;
use spur_judge::checks::readiness::ReadinessJudge;
use spur_judge::profiles::Profile;

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
            Outcome {
                seed,
                profile,
                violations: vec![Violation {
                    check: "panic",
                    object: "scenario".into(),
                    at: Duration::ZERO,
                    detail: what,
                }],
                trace_hash: String::new(),
                sim_secs: 0.0,
                wall_ms: 0,
                faults: Vec::new(),
                registration_lags: Vec::new(),
                submission_lags: Vec::new(),
                status_lags: Vec::new(),
                failover_submission_lags: Vec::new(),
                duplicates: 0,
                duplicates_stopped: 0,
                rpcs: 0,
                acting_writes: BTreeMap::new(),
                acting_calls: BTreeMap::new(),
                landed_after_cut: BTreeMap::new(),
                service,
                replay_args,
                timeline: None,
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
    let started = Instant::now();
    let seed = plan.seed;
    let service = config.intensity.service_for(seed);
    let world_config = WorldConfig {
        max_duration: plan.end + Duration::from_secs(60),
        tick: config.intensity.tick,
        net: NetConfig {
            service: service.kind,
            no_endpoint: service.no_endpoint,
            ..NetConfig::default()
        },
        ..WorldConfig::default()
    };
    let mut sim = Sim::without_controllers(seed, world_config);
    sim.world.trace().record(
        Duration::ZERO,
        "harness",
        format!("service spurctld is {}", service.name()),
    );
    sim.add_nodes(plan.nodes);
    sim.start_kubelet();
    for host in &plan.operators {
        let mut flags = profile.flags();
        flags.extend(config.operator_flags.iter().map(String::as_str));
        if *host == OPERATOR_B {
            flags.extend(config.operator_b_flags.iter().map(String::as_str));
        }
        sim.start_operator(host, &flags);
    }
    // sim.md's readiness check, as the Deployment probes (ProbeRule::DEPLOYMENT: every
    // 5 s, 3 s to answer, three failures to drop; 8080 is the health port every profile
    // keeps). It was left out of the mix while 10 of
    // 2,000 seeds found /readyz saying "not ready" for over 15 s with a live endpoint
    // reachable: a follower whose forwards hang after a replica partition (wire.md) hung
    // the readiness Ping, whose 2 s bound cancelled the channel's dials midway, so every
    // caller started again from the first dial and met that follower again. Dials now
    // finish on their own task, and a call stuck on such a channel leaves it once another
    // replica answers (the leader recheck).
    // A standby is probed too: its /readyz checks the same API server and controller as
    // the leader's (health.rs does not ask who leads), so it must tell the same truth
    // from where it stands, and a standby that says "ready" can take over at once.
    let mut readiness: Vec<ReadinessJudge> = plan
        .operators
        .iter()
        .map(|host| {
            let prober = if *host == OPERATOR { PROBER } else { PROBER_B };
            let probes = crate::prober::start(
                &mut sim.world,
                prober,
                host,
                8080,
                "/readyz",
                ProbeRule::DEPLOYMENT.period,
                ProbeRule::DEPLOYMENT.timeout,
            );
            ReadinessJudge::new(
                Deadlines::default().readiness,
                probes,
                ProbeRule::DEPLOYMENT,
                host,
            )
        })
        .collect();
    let mut restarts: Vec<(Duration, usize)> = plan
        .faults
        .iter()
        .enumerate()
        .filter(|(_, f)| f.fault == Fault::OperatorRestart)
        .map(|(index, f)| (f.at, index))
        .collect();
    restarts.reverse();
    sim.world.at(plan.controllers_at, |w| w.start_controllers());

    let api_up = Rc::new(Cell::new(true));
    for job in &plan.jobs {
        let api = sim.api.clone();
        let (name, run_secs, exit_code) = (job.name.clone(), job.run_secs, job.exit_code);
        sim.world.at(job.create_at, move |_| {
            let spec = json!({
                "image": "busybox",
                "command": ["sh", "-c", "true"],
                "env": {"SIM_RUN_SECONDS": run_secs.to_string(), "SIM_EXIT_CODE": exit_code.to_string()},
            });
            let created = api.create(json!({
                "apiVersion": "spur.amd.com/v1alpha1", "kind": "SpurJob",
                "metadata": {"name": name, "namespace": "default"}, "spec": spec,
            }));
            landed(&format!("create SpurJob {name}"), created, Missing::Fails);
        });
    }
    // Faults that found nothing to strike (a leader kill with no leader), by index: traced
    // when they happen and left out of the scenario's faults.
    let skipped: Rc<RefCell<BTreeSet<usize>>> = Rc::default();
    for (index, planned) in plan.faults.iter().enumerate() {
        let skip = {
            let skipped = skipped.clone();
            move || {
                skipped.borrow_mut().insert(index);
            }
        };
        schedule_fault(
            &mut sim,
            planned.at,
            planned.fault.clone(),
            api_up.clone(),
            skip,
        );
    }

    for (at, sabotage) in &config.sabotage {
        let (api, sabotage, at) = (sim.api.clone(), sabotage.clone(), *at);
        sim.world
            .at(at, move |w| sabotage::strike(w, &api, &sabotage, at));
    }
    let mut monitor = checks::Monitor::new(Deadlines::default(), &plan.operators);
    if config.timeline {
        monitor = monitor.recording();
        // Calls an earlier run on this thread left.
        crate::timeline_calls::take();
    }
    let mut deletions: Vec<(Duration, String)> = plan
        .jobs
        .iter()
        .filter_map(|j| j.delete_at.map(|at| (at, j.name.clone())))
        .collect();
    deletions.sort();
    let mut next_deletion = 0;
    let mut now = Duration::ZERO;
    let mut failure = None;
    while now < plan.end {
        now += SAMPLE;
        if let Err(e) = sim.world.run_until(now) {
            failure = Some(e.to_string());
            break;
        }
        while let Some((at, name)) = deletions.get(next_deletion) {
            if *at > now {
                break;
            }
            let deleted = sim
                .api
                .delete("spur.amd.com/v1alpha1", "SpurJob", Some("default"), name);
            landed(&format!("delete SpurJob {name}"), deleted, Missing::Fails);
            monitor.deleted(name, *at);
            next_deletion += 1;
        }
        monitor.sample(&sim, now, api_up.get());
        while restarts.last().is_some_and(|(at, _)| *at <= now) {
            // operator-restart restarts `operator` in place (see schedule_fault), unless
            // it found the replica down and skipped.
            let (at, index) = restarts.pop().expect("not empty");
            if !skipped.borrow().contains(&index) {
                readiness[0].restarted(at);
            }
        }
        for judge in &mut readiness {
            if let Some(v) = sample_readiness(judge, &sim, now, api_up.get()) {
                monitor.violations.push(v);
            }
        }
    }
    let duplicates = monitor.finish(&sim, now);
    let skipped = skipped.borrow();
    let faults: Vec<String> = plan
        .faults
        .iter()
        .enumerate()
        .filter(|(index, _)| !skipped.contains(index))
        .map(|(_, planned)| format!("{}@{:.1}s", planned.fault.name(), planned.at.as_secs_f64()))
        .collect();
    let mut violations = std::mem::take(&mut monitor.violations);
    // Every scenario ends with a quiet period longer than the readiness deadline: a check
    // that never judged would pass silently, so that is a failure of its own.
    for judge in &readiness {
        if judge.judged == 0 && failure.is_none() {
            violations.push(Violation {
                check: "readiness",
                object: format!("{}/readyz", judge.operator()),
                at: now,
                detail: "never judged: the world never held still for the deadline".into(),
            });
        }
    }
    if let Some(e) = failure {
        violations.push(Violation {
            check: "simulation",
            object: "world".into(),
            at: now,
            detail: e,
        });
    }
    let events = sim.world.trace().events();
    let rpcs = controller_calls(&events);
    let timeline = monitor.recorder.take().map(|recorder| {
        // A named scenario's caller (the lab) puts its own title and replay.
        let title = format!("seed {seed}, profile {profile}");
        let replay = format!(
            "cargo run --release -p spur-sim -- replay --seed {seed} --profile {profile}{} --html FILE",
            config.intensity.for_seed(seed).args()
        );
        Box::new(scenario_timeline(
            &events,
            plan,
            &skipped,
            recorder,
            (&monitor.brackets, &violations),
            now,
            (title, replay),
        ))
    });
    Outcome {
        seed,
        profile,
        violations,
        trace_hash: sim.world.trace_hash(),
        sim_secs: now.as_secs_f64(),
        wall_ms: started.elapsed().as_millis(),
        faults,
        registration_lags: monitor.lags.registration.clone(),
        submission_lags: monitor.lags.submission.clone(),
        status_lags: monitor.lags.status.clone(),
        failover_submission_lags: monitor.lags.failover_submission.clone(),
        duplicates: duplicates.ran,
        duplicates_stopped: duplicates.stopped,
        rpcs,
        acting_writes: monitor.acting_writes().clone(),
        acting_calls: monitor.acting_calls().clone(),
        landed_after_cut: monitor.landed_after_cut().clone(),
        service: Some(service),
        replay_args: config.intensity.for_seed(seed).args(),
        timeline,
    }
}

/// The timeline of a finished run: lanes for the operator replicas, every controller
/// replica the run had and the API server; the plan's faults that struck, each over the
/// lanes the harness named when it struck (the API server's for its own faults).
fn scenario_timeline(
    events: &[spur_judge::trace::TraceEvent],
    plan: &Plan,
    skipped: &BTreeSet<usize>,
    recorder: spur_judge::timeline::Recorder,
    (brackets, violations): (&[checks::Bracket], &[Violation]),
    end: Duration,
    (title, replay): (String, String),
) -> spur_judge::timeline::Timeline {
    use spur_judge::timeline::{FaultSpan, Timeline};
    let mut replicas = BTreeSet::new();
    for event in events {
        if event.host.starts_with("spurctld") {
            replicas.insert(event.host.clone());
        }
    }
    let lanes = spur_judge::timeline::lanes(&plan.operators, replicas.iter().cloned());
    let faults = plan
        .faults
        .iter()
        .enumerate()
        .filter(|(index, _)| !skipped.contains(index))
        .map(|(_, planned)| {
            let api_fault = matches!(
                planned.fault,
                Fault::ApiOutage { .. }
                    | Fault::WatchCut
                    | Fault::StatusConflict { .. }
                    | Fault::NodeNotReadyFlap { .. }
                    | Fault::NodeResourcesChanged { .. }
                    | Fault::NodeDeleted { .. }
            );
            let mut struck = spur_judge::timeline::struck_at(events, planned.at);
            if api_fault {
                struck = vec![KUBE_API_HOST.to_owned()];
            } else if struck.is_empty() {
                struck = replicas.iter().cloned().collect();
            }
            FaultSpan {
                name: planned.fault.name().to_owned(),
                from_ms: planned.at.as_millis() as u64,
                to_ms: (planned.at + planned.fault.heals_after()).as_millis() as u64,
                lanes: struck,
            }
        })
        .collect();
    let (mut spans, mut calls) = spur_judge::timeline::from_trace(events, end);
    let (terms, jobs) = recorder.finish(end);
    spans.extend(terms);
    calls.extend(crate::timeline_calls::take());
    calls.sort_by(|a, b| (a.from_ms, &a.lane).cmp(&(b.from_ms, &b.lane)));
    let (deadlines, violations) = spur_judge::timeline::deadlines(brackets, violations);
    Timeline {
        title,
        replay,
        note: String::new(),
        end_ms: end.as_millis() as u64,
        lanes,
        spans,
        faults,
        calls,
        jobs,
        deadlines,
        violations,
    }
}

/// The operator replica the Lease names now (ground truth), else `operator`: partitions
/// of "the operator" cut the replica that acts, whichever it is.
fn acting_operator(leases: &LeaseHistory, stops: &BTreeMap<String, OperatorStop>) -> String {
    leases
        .holder(OPERATOR_LEASE)
        .filter(|h| stops.contains_key(h))
        .unwrap_or_else(|| OPERATOR.to_owned())
}

/// Calls the operator replicas made to the controller, as the replicas answered them
/// ([`spur_fakes::model::calls::answered`]).
fn controller_calls(events: &[spur_judge::trace::TraceEvent]) -> usize {
    spur_fakes::model::calls::answered(events, Duration::ZERO, Duration::MAX)
        .values()
        .sum()
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
            Fault::LeaderKillSilent | Fault::LeaderKillGraceful => {
                let mode = if fault == Fault::LeaderKillSilent {
                    KillMode::Silent
                } else {
                    KillMode::Graceful
                };
                if let Some(leader) = w.leader()
                    && let Some(slot) = w.cluster().slot_of(&leader)
                {
                    w.kill(&leader, mode);
                    w.at(now + REPLACE_AFTER, move |w| {
                        w.replace_replica(slot);
                    });
                } else {
                    skipped_for_no_leader(w, &fault, skip);
                }
            }
            Fault::LeaderFreeze { thaw_after } => {
                if let Some(leader) = w.leader() {
                    w.freeze(&leader);
                    w.at(now + thaw_after, move |w| w.thaw(&leader));
                } else {
                    skipped_for_no_leader(w, &fault, skip);
                }
            }
            Fault::LeaderCutOff { heal_after, .. } => {
                if let Some(leader) = w.leader()
                    && let Some(slot) = w.cluster().slot_of(&leader)
                {
                    cut_from_peers(w, slot, now + heal_after);
                } else {
                    skipped_for_no_leader(w, &fault, skip);
                }
            }
            Fault::FollowerKill => {
                let leader = w.leader();
                let follower = (0..w.cluster().config().replicas)
                    .find(|slot| Some(w.cluster().host_of(*slot)) != leader);
                if let Some(slot) = follower {
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
            Fault::PartitionOperatorReplica { slot, heal_after } => {
                let replica = w.cluster().host_of(slot);
                let operator = acting_operator(&leases, &stops);
                w.partition(&operator, &replica);
                w.at(now + heal_after, move |w| w.repair(&operator, &replica));
            }
            Fault::FollowerCutOff { heal_after, .. } => {
                let leader = w.leader();
                let follower = (0..w.cluster().config().replicas)
                    .find(|slot| Some(w.cluster().host_of(*slot)) != leader)
                    .expect("three replicas");
                cut_from_peers(w, follower, now + heal_after);
            }
            Fault::PartitionReplica { slot, heal_after } => {
                cut_from_peers(w, slot, now + heal_after);
            }
            Fault::ApiOutage { duration } => {
                api.faults().start_outage(OutageMode::Unavailable);
                api_up.set(false);
                let api = api.clone();
                w.at(now + duration, move |_| {
                    api.faults().end_outage();
                    api_up.set(true);
                });
            }
            Fault::WatchCut => api
                .faults()
                .cut_watches(spur_fakes::api_server::CutKind::Abort),
            Fault::StatusConflict { writes } => api.faults().conflict_next_status_writes(writes),
            // A replica that a leader change took down is already on its way back: its
            // restart is that fault's to make (restarting it early would also run it
            // with its SIGTERM still pending).
            Fault::OperatorRestart if w.net().is_down(OPERATOR) => {
                w.trace()
                    .record(now, "harness", format!("{OPERATOR} is down: no restart"));
                skip();
            }
            Fault::OperatorRestart => w.restart(OPERATOR),
            Fault::NodeNotReadyFlap { node, down_for } => {
                let name = format!("node-{node}");
                let taint = json!({"spec": {"taints": [
                    {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]}});
                let tainted = api.merge_patch("v1", "Node", None, &name, &taint, false);
                landed(&format!("taint Node {name}"), tainted, Missing::Expected);
                let api = api.clone();
                w.at(now + down_for, move |_| {
                    let clear = json!({"spec": {"taints": null}});
                    let cleared = api.merge_patch("v1", "Node", None, &name, &clear, false);
                    landed(&format!("untaint Node {name}"), cleared, Missing::Expected);
                });
            }
            Fault::NodeResourcesChanged { node } => {
                let name = format!("node-{node}");
                let change = json!({"status": {"allocatable": {"cpu": "48"}}});
                let changed = api.merge_patch("v1", "Node", None, &name, &change, true);
                landed(&format!("change Node {name}"), changed, Missing::Expected);
            }
            Fault::ReplyLost { hang } => {
                let how = if hang {
                    LostReply::Hang
                } else {
                    LostReply::TransportError
                };
                w.cluster().lose_next_reply("SubmitJob", how);
            }
            Fault::PartitionOperatorService { heal_after } => {
                let replicas: Vec<String> = (0..w.cluster().config().replicas)
                    .map(|slot| w.cluster().host_of(slot))
                    .collect();
                let operator = acting_operator(&leases, &stops);
                for replica in &replicas {
                    w.partition(&operator, replica);
                }
                w.at(now + heal_after, move |w| {
                    for replica in &replicas {
                        w.repair(&operator, replica);
                    }
                });
            }
            Fault::NodeDeleted { node } => {
                let name = format!("node-{node}");
                let deleted = api.delete("v1", "Node", None, &name);
                landed(&format!("delete Node {name}"), deleted, Missing::Expected);
            }
            Fault::OperatorLeaderChange { how, down_for } => {
                let leader = acting_operator(&leases, &stops);
                let stop = stops[&leader].clone();
                match how {
                    LeaderChange::Isolate => {
                        w.partition(&leader, KUBE_API_HOST);
                        w.at(now + down_for, move |w| w.repair(&leader, KUBE_API_HOST));
                        return;
                    }
                    // The process drains, releases the lease and exits; the pod is out of
                    // the picture (not ready) from now.
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
        }
    });
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
