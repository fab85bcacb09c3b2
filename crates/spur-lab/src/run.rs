//! Runs one plan in the lab: the same schedule as the simulation's `run_plan` (replicas
//! start, SpurJobs come and go, the fault strikes and heals), judged by the same checks
//! from the lab's ground truth.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use serde_json::json;
use spur_operator::is_terminal;

use super::world::{API_IP, Lab, Stop};
use spur_judge::checks::readiness::ReadinessJudge;
use spur_judge::checks::{AcceptedJob, Deadlines, Duplicates, Monitor, Violation};
use spur_judge::hosts::{KUBE_API_HOST, OPERATOR, OPERATOR_B, REPLACE_AFTER, SAMPLE};
use spur_judge::outcome::Outcome;
use spur_judge::plan::{Fault, LeaderChange, Plan, PlannedJob, SteerTo};
use spur_judge::probes::{ProbeLog, ProbeRule};
use spur_judge::profiles::Profile;
use spur_judge::timeline::{FaultSpan, Timeline};

/// What the lab does at a time of the plan.
#[derive(Clone, Debug)]
enum Event {
    StartReplicas,
    Create(PlannedJob),
    Delete(String),
    Fault(Fault),
    ReplaceReplica(usize),
    Thaw(usize),
    Repair(Vec<(Ipv4Addr, Ipv4Addr)>),
    ApiBack,
    StartOperator(String),
    /// Cuts the acting operator off from every replica but `onto` once the leader, another
    /// replica, holds more ended jobs than `ended` (checked every [`STALE_STEER_EVERY`],
    /// given up at `until`).
    SteerOnceAnEndLanded {
        onto: usize,
        ended: usize,
        until: Duration,
    },
    /// Heals that cut [`STALE_STEER_HOLD`] after the operator is connected to `onto` again
    /// (its connections to the others linger, their ends unable to close through the cut),
    /// or at `until`.
    HealOnceOn {
        onto: usize,
        pairs: Vec<(Ipv4Addr, Ipv4Addr)>,
        until: Duration,
    },
}

/// How often the operators' call counters are read.
const SCRAPE_EVERY: Duration = Duration::from_secs(2);

/// Runs `plan` on `lab` (already built, nothing started) with `profile`'s operator.
pub async fn run_plan(
    lab: &mut Lab,
    plan: &Plan,
    profile: Profile,
    operator_b_flags: &[String],
    timeline: bool,
) -> anyhow::Result<Outcome> {
    let wall = Instant::now();
    let mut events: BTreeMap<(Duration, u64), Event> = BTreeMap::new();
    let mut order = 0;
    let mut at = |events: &mut BTreeMap<(Duration, u64), Event>, when: Duration, event: Event| {
        order += 1;
        events.insert((when, order), event);
    };
    at(&mut events, plan.controllers_at, Event::StartReplicas);
    for job in &plan.jobs {
        at(&mut events, job.create_at, Event::Create(job.clone()));
        if let Some(delete_at) = job.delete_at {
            at(&mut events, delete_at, Event::Delete(job.name.clone()));
        }
    }
    let mut faults = Vec::new();
    for planned in &plan.faults {
        faults.push(format!(
            "{}@{:.1}s",
            planned.fault.name(),
            planned.at.as_secs_f64()
        ));
        at(&mut events, planned.at, Event::Fault(planned.fault.clone()));
    }

    lab.start_clock();
    for name in &plan.operators {
        let extra: &[String] = if *name == OPERATOR_B {
            operator_b_flags
        } else {
            &[]
        };
        lab.start_operator(name, extra)?;
    }
    let mut monitor = Monitor::new(Deadlines::default(), &plan.operators);
    if timeline {
        monitor = monitor.recording();
    }
    // sim.md's readiness check on the kubelet stand-in's answers, against the lab's truth:
    // one judge per operator pod, by its index in the lab.
    let mut readiness: Vec<(usize, ReadinessJudge)> = plan
        .operators
        .iter()
        .map(|name| {
            Ok((
                lab.operator_index(name)?,
                ReadinessJudge::new(
                    Deadlines::default().readiness,
                    ProbeLog::default(),
                    ProbeRule::DEPLOYMENT,
                    name,
                ),
            ))
        })
        .collect::<anyhow::Result<_>>()?;
    // Each fault as it struck, over the lanes it hit, for the timeline.
    let mut struck: Vec<FaultSpan> = Vec::new();
    let mut leader: Option<String> = None;
    let mut api_up = true;
    let mut next_sample = SAMPLE;
    let mut next_scrape = SCRAPE_EVERY;
    while lab.now() < plan.end {
        tokio::time::sleep(next_sample.saturating_sub(lab.now())).await;
        next_sample += SAMPLE;
        let now = lab.now();
        while let Some(entry) = events.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let event = entry.remove();
            if let Event::Fault(fault) = &event {
                struck.push(FaultSpan {
                    name: fault.name().to_owned(),
                    from_ms: now.as_millis() as u64,
                    to_ms: (now + fault.heals_after()).as_millis() as u64,
                    lanes: fault_lanes(
                        fault,
                        leader.as_deref(),
                        &acting_operator(lab),
                        lab.replica_count(),
                    ),
                });
            }
            if let Some(name) = restarts_operator(&event) {
                for (_, judge) in &mut readiness {
                    if judge.operator() == name {
                        judge.restarted(now);
                    }
                }
            }
            for (when, follow_up) in carry_out(lab, event, now, &mut monitor, &mut api_up).await? {
                at(&mut events, when, follow_up);
            }
        }
        lab.tick().await?;
        let seen = lab.observe().await;
        if seen.leader.is_some() {
            leader.clone_from(&seen.leader);
        }
        monitor.observe(&seen, lab.now(), api_up);
        for (index, at, ready) in lab.take_probe_answers() {
            if let Some((_, judge)) = readiness.iter_mut().find(|(i, _)| *i == index) {
                judge.record(at, ready);
            }
        }
        for (_, judge) in &mut readiness {
            let view = lab.readiness_view(judge.operator(), api_up);
            if let Some(violation) = judge.judge(view, lab.now()) {
                monitor.violations.push(violation);
            }
        }
        if now >= next_scrape {
            next_scrape += SCRAPE_EVERY;
            lab.scrape_all_calls().await;
        }
    }
    lab.scrape_all_calls().await;
    let now = lab.now();
    let duplicates = match lab.controller_jobs().await {
        Some(mut jobs) => {
            jobs.sort_by_key(|j| j.id);
            let accepted: Vec<AcceptedJob> = jobs
                .into_iter()
                .map(|job| AcceptedJob {
                    id: job.id,
                    live: !is_terminal(job.state),
                    ran: job.started,
                    comment: job.comment,
                })
                .collect();
            monitor.finish_with(&accepted, now)
        }
        None => {
            monitor.violations.push(Violation {
                check: "lab",
                object: "controller".into(),
                at: now,
                detail: "no leader answered at the end: the duplicate check could not run".into(),
            });
            Duplicates::default()
        }
    };
    let mut violations = std::mem::take(&mut monitor.violations);
    // As in the simulation: a readiness check that never judged would pass silently.
    for (_, judge) in &readiness {
        if judge.judged == 0 {
            violations.push(Violation {
                check: "readiness",
                object: format!("{}/readyz", judge.operator()),
                at: now,
                detail: "never judged: the world never held still for the deadline".into(),
            });
        }
    }
    let timeline = monitor.recorder.take().map(|recorder| {
        let mut timeline = lab_timeline(
            plan,
            recorder,
            struck,
            (&monitor.brackets, &violations),
            now,
            lab.replica_count(),
        );
        for name in &plan.operators {
            let log = std::fs::read_to_string(lab.operator_log(name)).unwrap_or_default();
            timeline
                .calls
                .extend(spur_judge::timeline::operator_log::from_operator_log(
                    &log,
                    name,
                    lab.started_wall(),
                ));
        }
        timeline
            .calls
            .sort_by(|a, b| (a.from_ms, &a.lane).cmp(&(b.from_ms, &b.lane)));
        Box::new(timeline)
    });
    Ok(Outcome {
        seed: plan.seed,
        profile,
        violations,
        trace_hash: "lab".into(),
        sim_secs: now.as_secs_f64(),
        wall_ms: wall.elapsed().as_millis(),
        faults,
        registration_lags: monitor.lags.registration.clone(),
        submission_lags: monitor.lags.submission.clone(),
        status_lags: monitor.lags.status.clone(),
        failover_submission_lags: monitor.lags.failover_submission.clone(),
        duplicates: duplicates.ran,
        duplicates_stopped: duplicates.stopped,
        rpcs: lab.controller_calls() as usize,
        acting_writes: BTreeMap::new(),
        acting_calls: BTreeMap::new(),
        landed_after_cut: BTreeMap::new(),
        service: None,
        replay_args: String::new(),
        timeline,
    })
}

/// The lanes a fault hits in the lab: the leader it struck (the last one seen), the
/// acting operator, the API server, or every replica when the fault names none.
fn fault_lanes(
    fault: &Fault,
    leader: Option<&str>,
    operator: &str,
    replicas: usize,
) -> Vec<String> {
    let replicas = || {
        (0..replicas)
            .map(|s| format!("spurctld-{s}"))
            .collect::<Vec<_>>()
    };
    match fault {
        Fault::LeaderKillSilent
        | Fault::LeaderKillGraceful
        | Fault::LeaderFreeze { .. }
        | Fault::LeaderCutOff { .. } => leader.map_or_else(replicas, |l| vec![l.to_owned()]),
        Fault::PartitionOperatorReplica { slot, .. } => {
            vec![operator.to_owned(), format!("spurctld-{slot}")]
        }
        Fault::PartitionOperatorService { .. } => {
            let mut lanes = vec![operator.to_owned()];
            lanes.extend(replicas());
            lanes
        }
        Fault::OperatorRestart => vec![OPERATOR.to_owned()],
        Fault::OperatorLeaderChange { how, .. } => {
            let mut lanes = vec![operator.to_owned()];
            if *how == LeaderChange::Isolate {
                lanes.push(KUBE_API_HOST.to_owned());
            }
            lanes
        }
        Fault::ApiOutage { .. }
        | Fault::WatchCut
        | Fault::StatusConflict { .. }
        | Fault::NodeNotReadyFlap { .. }
        | Fault::NodeResourcesChanged { .. }
        | Fault::NodeDeleted { .. } => vec![KUBE_API_HOST.to_owned()],
        Fault::FollowerKill
        | Fault::FollowerCutOff { .. }
        | Fault::PartitionReplica { .. }
        | Fault::ReplyLost { .. } => replicas(),
    }
}

/// A lab run's timeline: what the checks sampled (terms, the Lease, SpurJobs, deadlines)
/// and the faults as they struck. The real operator's calls are not caught here (its log
/// is a process's, not the simulation's), so its lanes carry no call marks.
fn lab_timeline(
    plan: &Plan,
    recorder: spur_judge::timeline::Recorder,
    faults: Vec<FaultSpan>,
    (brackets, violations): (&[spur_judge::checks::Bracket], &[Violation]),
    end: Duration,
    replicas: usize,
) -> Timeline {
    let lanes = spur_judge::timeline::lanes(
        &plan.operators,
        (0..replicas).map(|s| format!("spurctld-{s}")),
    );
    let (spans, jobs) = recorder.finish(end);
    let (deadlines, violations) = spur_judge::timeline::deadlines(brackets, violations);
    Timeline {
        title: String::new(),
        replay: String::new(),
        note: "The operators' calls are read from their JSON logs (wall clock, to the \
               millisecond). The real replicas log no call, so their lanes show only their \
               leader terms; the simulated twin's page draws each answer."
            .into(),
        end_ms: end.as_millis() as u64,
        lanes,
        spans,
        faults,
        calls: Vec::new(),
        jobs,
        deadlines,
        violations,
    }
}

/// The operator `event` (re)starts, whose readiness is judged afresh from then.
fn restarts_operator(event: &Event) -> Option<String> {
    match event {
        Event::StartOperator(name) => Some(name.clone()),
        Event::Fault(Fault::OperatorRestart) => Some(OPERATOR.to_owned()),
        _ => None,
    }
}

/// The operator replica the Lease names, else `operator`: partitions of "the operator"
/// cut the replica that acts, as in the simulation.
fn acting_operator(lab: &Lab) -> String {
    lab.lease_holder().unwrap_or_else(|| OPERATOR.to_owned())
}

/// Carries out `event`; returns the events it schedules.
async fn carry_out(
    lab: &mut Lab,
    event: Event,
    now: Duration,
    monitor: &mut Monitor,
    api_up: &mut bool,
) -> anyhow::Result<Vec<(Duration, Event)>> {
    let mut later = Vec::new();
    match event {
        Event::StartReplicas => {
            for slot in 0..lab.replica_count() {
                lab.start_replica(slot)?;
            }
        }
        Event::Create(job) => {
            let spec = json!({
                "image": "busybox",
                "command": ["sh", "-c", "true"],
                "env": {"SIM_RUN_SECONDS": job.run_secs.to_string(),
                        "SIM_EXIT_CODE": job.exit_code.to_string()},
            });
            // The lab's own writes must land, or the run would judge less than it claims.
            lab.api
                .create(json!({
                    "apiVersion": "spur.amd.com/v1alpha1", "kind": "SpurJob",
                    "metadata": {"name": job.name, "namespace": "default"}, "spec": spec,
                }))
                .map_err(|e| {
                    anyhow::anyhow!("the lab could not create SpurJob {}: {e}", job.name)
                })?;
        }
        Event::Delete(name) => {
            lab.api
                .delete("spur.amd.com/v1alpha1", "SpurJob", Some("default"), &name)
                .map_err(|e| anyhow::anyhow!("the lab could not delete SpurJob {name}: {e}"))?;
            monitor.deleted(&name, now);
        }
        Event::ReplaceReplica(slot) => lab.replace_replica(slot)?,
        Event::Thaw(slot) => lab.freeze_replica(slot, false),
        Event::Repair(pairs) => {
            for (a, b) in pairs {
                lab.partition(a, b, false)?;
            }
        }
        Event::ApiBack => {
            lab.api_outage(false);
            *api_up = true;
        }
        Event::StartOperator(name) => lab.start_operator(&name, &[])?,
        Event::SteerOnceAnEndLanded { onto, ended, until } => {
            let landed = match lab.leader_slot() {
                Some(leader) if leader != onto => lab
                    .controller_jobs()
                    .await
                    .is_some_and(|jobs| ended_jobs(&jobs) > ended),
                _ => false,
            };
            if landed {
                // A connection to the cut leader from before would pass for the new one.
                lab.reset_operator_connections(&acting_operator(lab), onto)?;
                let operator = lab.operator_ip(&acting_operator(lab)).expect("an operator");
                let pairs = cut_off(lab, operator, onto)?;
                eprintln!(
                    "lab: a job's end reached the new leader; the operator is cut off from \
                     every replica but spurctld-{onto} ({:.1}s)",
                    now.as_secs_f64()
                );
                later.push((
                    now + STALE_STEER_EVERY,
                    Event::HealOnceOn {
                        onto,
                        pairs,
                        until: now + STALE_STEER_CUT,
                    },
                ));
            } else if now < until {
                later.push((
                    now + STALE_STEER_EVERY,
                    Event::SteerOnceAnEndLanded { onto, ended, until },
                ));
            } else {
                anyhow::bail!(
                    "no job's end reached a new leader by {until:?}: nothing to steer by"
                );
            }
        }
        Event::HealOnceOn { onto, pairs, until } => {
            let on = lab.operator_connections(&acting_operator(lab))?;
            if on.contains(&onto) || now >= until {
                eprintln!(
                    "lab: the operator's connections are to {on:?}; its cut heals in {:?} ({:.1}s)",
                    STALE_STEER_HOLD,
                    now.as_secs_f64()
                );
                later.push((now + STALE_STEER_HOLD, Event::Repair(pairs)));
            } else {
                later.push((
                    now + STALE_STEER_EVERY,
                    Event::HealOnceOn { onto, pairs, until },
                ));
            }
        }
        Event::Fault(fault) => later = strike(lab, fault, now, api_up).await?,
    }
    Ok(later)
}

async fn strike(
    lab: &mut Lab,
    fault: Fault,
    now: Duration,
    api_up: &mut bool,
) -> anyhow::Result<Vec<(Duration, Event)>> {
    let mut later = Vec::new();
    let replicas = lab.replica_count();
    let leader = lab.leader_slot();
    match fault {
        Fault::LeaderKillSilent | Fault::LeaderKillGraceful => {
            if let Some(slot) = leader {
                lab.kill_replica(slot, fault == Fault::LeaderKillSilent)?;
                later.push((now + REPLACE_AFTER, Event::ReplaceReplica(slot)));
            }
        }
        Fault::FollowerKill => {
            if let Some(slot) = (0..replicas).find(|s| Some(*s) != leader) {
                lab.kill_replica(slot, true)?;
                later.push((now + REPLACE_AFTER, Event::ReplaceReplica(slot)));
            }
        }
        Fault::LeaderFreeze { thaw_after } => {
            if let Some(slot) = leader {
                lab.freeze_replica(slot, true);
                later.push((now + thaw_after, Event::Thaw(slot)));
            }
        }
        Fault::LeaderCutOff { heal_after, steer } => {
            if let Some(slot) = leader {
                let onto = match steer {
                    None => None,
                    Some(SteerTo::Leader) => Some(slot),
                    Some(SteerTo::Follower) => (0..replicas).find(|s| *s != slot),
                    Some(SteerTo::LeaderOnceAnEndLanded) => {
                        let ended = lab.controller_jobs().await.map_or(0, |j| ended_jobs(&j));
                        later.push((
                            now + STALE_STEER_EVERY,
                            Event::SteerOnceAnEndLanded {
                                onto: slot,
                                ended,
                                until: now + heal_after,
                            },
                        ));
                        None
                    }
                };
                if let Some(onto) = onto {
                    steer_onto(lab, &acting_operator(lab), onto).await?;
                }
                let now = lab.now();
                later.push((now + heal_after, cut_from_replicas(lab, slot)?));
            }
        }
        Fault::FollowerCutOff {
            heal_after,
            operator_on_it,
        } => {
            let follower = (0..replicas)
                .find(|s| Some(*s) != leader)
                .expect("three replicas");
            later.push((now + heal_after, cut_from_replicas(lab, follower)?));
            // Steered once the follower has forgotten its leader: before that its forwards
            // hang, no probe of it passes and the operator's patience leaves it at once;
            // after, it serves reads from its own copy and refuses every write.
            if operator_on_it {
                tokio::time::sleep(FORGET_LEADER).await;
                steer_onto(lab, &acting_operator(lab), follower).await?;
            }
        }
        Fault::PartitionReplica { slot, heal_after } => {
            later.push((now + heal_after, cut_from_replicas(lab, slot)?));
        }
        Fault::PartitionOperatorReplica { slot, heal_after } => {
            let operator = lab.operator_ip(&acting_operator(lab)).expect("an operator");
            let pair = (operator, lab.replica_ip(slot));
            lab.partition(pair.0, pair.1, true)?;
            later.push((now + heal_after, Event::Repair(vec![pair])));
        }
        Fault::PartitionOperatorService { heal_after } => {
            let operator = lab.operator_ip(&acting_operator(lab)).expect("an operator");
            let pairs: Vec<_> = (0..replicas)
                .map(|s| (operator, lab.replica_ip(s)))
                .collect();
            for (a, b) in &pairs {
                lab.partition(*a, *b, true)?;
            }
            later.push((now + heal_after, Event::Repair(pairs)));
        }
        Fault::ApiOutage { duration } => {
            lab.api_outage(true);
            *api_up = false;
            later.push((now + duration, Event::ApiBack));
        }
        Fault::OperatorRestart => {
            lab.stop_operator(OPERATOR, Stop::Kill).await?;
            lab.start_operator(OPERATOR, &[])?;
        }
        Fault::OperatorLeaderChange { how, down_for } => {
            let leader = acting_operator(lab);
            match how {
                LeaderChange::Isolate => {
                    let pair = (lab.operator_ip(&leader).expect("an operator"), API_IP);
                    lab.partition(pair.0, pair.1, true)?;
                    later.push((now + down_for, Event::Repair(vec![pair])));
                }
                LeaderChange::Sigterm | LeaderChange::Crash => {
                    let stop = if how == LeaderChange::Sigterm {
                        Stop::Term
                    } else {
                        Stop::Kill
                    };
                    lab.stop_operator(&leader, stop).await?;
                    later.push((now + down_for, Event::StartOperator(leader)));
                }
            }
        }
        Fault::WatchCut => lab
            .api
            .faults()
            .cut_watches(spur_fakes::api_server::CutKind::Abort),
        Fault::StatusConflict { writes } => lab.api.faults().conflict_next_status_writes(writes),
        Fault::NodeNotReadyFlap { .. }
        | Fault::NodeResourcesChanged { .. }
        | Fault::NodeDeleted { .. }
        | Fault::ReplyLost { .. } => {
            anyhow::bail!(
                "the lab has no named scenario with {} (a seed's fault; run it with `spur-sim run`)",
                fault.name()
            )
        }
    }
    Ok(later)
}

/// How long [`steer_onto`] may take: an operator dials afresh at its next call, and the
/// readiness probe alone calls every 5 s.
const STEER_BOUND: Duration = Duration::from_secs(30);
/// How often `leader-cut-stale-read` looks for an end at the new leader: well inside the
/// operator's status poll (2 s), which must not mirror it before the channel moves.
const STALE_STEER_EVERY: Duration = Duration::from_millis(100);
/// The longest the operator waits to be on the cut leader: its patience (1 s) replaces the
/// hung channel with one to the cut leader well before.
const STALE_STEER_CUT: Duration = Duration::from_secs(3);
/// How long the operator stays cut off from the others once on the cut leader: a partition
/// that leaves it on the stale replica's side for a while. Two status polls (2 s apart)
/// and the retries between them read the cut leader in that time, so rule 6 leaves it and
/// can find nothing else, at least twice; once the cut heals, its next leaving must reach
/// another replica.
const STALE_STEER_HOLD: Duration = Duration::from_secs(5);

/// Jobs the leader holds that ended.
fn ended_jobs(jobs: &[super::world::LeaderJob]) -> usize {
    jobs.iter().filter(|j| is_terminal(j.state)).count()
}

/// How long a follower cut off from its peers takes to forget its leader and refuse
/// writes: spurctld's leader lease (3 s) and an election timeout (1.5 to 3 s), with room.
const FORGET_LEADER: Duration = Duration::from_secs(8);

/// Resets `operator`'s connections to every replica but `slot` until its only connection
/// is to `slot`: each reset fails the operator's next call on it, and it dials the Service
/// again, which picks a replica at random.
async fn steer_onto(lab: &mut Lab, operator: &str, slot: usize) -> anyhow::Result<()> {
    let from = lab.now();
    let mut resets = 0;
    loop {
        let on = lab.operator_connections(operator)?;
        if on.len() == 1 && on.contains(&slot) {
            eprintln!(
                "lab: {operator}'s only controller connection is to spurctld-{slot} after {resets} \
                 resets ({:.1}s)",
                lab.now().saturating_sub(from).as_secs_f64()
            );
            return Ok(());
        }
        if lab.now().saturating_sub(from) > STEER_BOUND {
            anyhow::bail!(
                "{operator} did not settle on spurctld-{slot} within {STEER_BOUND:?} \
                 ({resets} resets; connected to {on:?})"
            );
        }
        for other in on.iter().filter(|s| **s != slot) {
            lab.reset_operator_connections(operator, *other)?;
            resets += 1;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Cuts replica `slot` off from the other replicas; returns the event that heals it.
fn cut_from_replicas(lab: &mut Lab, slot: usize) -> anyhow::Result<Event> {
    let cut = lab.replica_ip(slot);
    Ok(Event::Repair(cut_off(lab, cut, slot)?))
}

/// Cuts `from` off from every replica but `except`; returns the pairs cut.
fn cut_off(
    lab: &mut Lab,
    from: Ipv4Addr,
    except: usize,
) -> anyhow::Result<Vec<(Ipv4Addr, Ipv4Addr)>> {
    let pairs: Vec<_> = (0..lab.replica_count())
        .filter(|s| *s != except)
        .map(|s| (from, lab.replica_ip(s)))
        .collect();
    for (a, b) in &pairs {
        lab.partition(*a, *b, true)?;
    }
    Ok(pairs)
}
