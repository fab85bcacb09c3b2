//! The lab as a [`Stage`]: the same runner as the simulation's (replicas start, SpurJobs
//! come and go, the fault strikes and heals), judged by the same checks from the lab's
//! ground truth. Each call blocks on the lab's runtime, whose tasks run only meanwhile.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use serde_json::json;
use spur_operator::is_terminal;
use tokio::runtime::Runtime;

use super::world::{API_IP, Lab, Stop};
use spur_judge::checks::readiness::WorldView;
use spur_judge::checks::{AcceptedJob, Observation};
use spur_judge::hosts::{KUBE_API_HOST, OPERATOR, OPERATOR_B, REPLACE_AFTER};
use spur_judge::outcome::Outcome;
use spur_judge::plan::{Fault, LeaderChange, Plan, PlannedJob, SteerTo};
use spur_judge::probes::ProbeLog;
use spur_judge::profiles::Profile;
use spur_judge::stage::{Action, Drawing, Ending, Settings, Stage};
use spur_judge::timeline::FaultSpan;

/// What the lab does at a time: the plan's actions and the follow-ups they schedule.
#[derive(Clone, Debug)]
enum Event {
    Plan(Action),
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

/// Runs `plan` on `lab` (already built, nothing started) with `profile`'s operator. Call it
/// outside `runtime` (not from one of its tasks), with the runtime entered.
pub fn run_plan(
    runtime: &Runtime,
    lab: &mut Lab,
    plan: &Plan,
    profile: Profile,
    operator_b_flags: &[String],
    timeline: bool,
) -> Outcome {
    let settings = Settings {
        profile,
        timeline,
        started: Instant::now(),
    };
    lab.start_clock();
    let mut stage = LabStage {
        runtime,
        lab,
        operator_b_flags,
        events: BTreeMap::new(),
        order: 0,
        probes: Vec::new(),
        api_up: true,
        leader: None,
        struck: Vec::new(),
        skipped: Vec::new(),
        restarts: Vec::new(),
        next_scrape: SCRAPE_EVERY,
    };
    spur_judge::stage::run(plan, &mut stage, settings)
}

/// The lab's processes, with what its runner needs to know of them.
struct LabStage<'r> {
    runtime: &'r Runtime,
    lab: &'r mut Lab,
    operator_b_flags: &'r [String],
    /// What is due when, in the order it was scheduled.
    events: BTreeMap<(Duration, u64), Event>,
    order: u64,
    /// Each operator's readiness answers, by its index in the lab.
    probes: Vec<(usize, ProbeLog)>,
    api_up: bool,
    /// The last controller leader seen, whom a leader fault struck.
    leader: Option<String>,
    /// Each fault as it struck, over the lanes it hit, for the timeline.
    struck: Vec<FaultSpan>,
    skipped: Vec<usize>,
    restarts: Vec<(String, Duration)>,
    next_scrape: Duration,
}

impl LabStage<'_> {
    fn at(&mut self, when: Duration, event: Event) {
        self.order += 1;
        self.events.insert((when, self.order), event);
    }

    /// One step to `to`: what is due, the lab's own bookkeeping, the call counters.
    async fn step(&mut self, to: Duration) -> anyhow::Result<()> {
        tokio::time::sleep(to.saturating_sub(self.lab.now())).await;
        let now = self.lab.now();
        while let Some(entry) = self.events.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let later = match entry.remove() {
                Event::Plan(Action::Strike { index, fault }) => {
                    self.strike(index, fault, now).await?
                }
                event => {
                    if let Event::StartOperator(name) = &event {
                        self.restarts.push((name.clone(), now));
                    }
                    carry_out(self.lab, event, now, &mut self.api_up).await?
                }
            };
            for (when, follow_up) in later {
                self.at(when, follow_up);
            }
        }
        self.lab.tick().await?;
        if now >= self.next_scrape {
            self.next_scrape += SCRAPE_EVERY;
            self.lab.scrape_all_calls().await;
        }
        Ok(())
    }

    /// Strikes the plan's fault `index`, noting its lanes, or that it found nothing to
    /// strike.
    async fn strike(
        &mut self,
        index: usize,
        fault: Fault,
        now: Duration,
    ) -> anyhow::Result<Vec<(Duration, Event)>> {
        let span = FaultSpan {
            name: fault.name().to_owned(),
            from_ms: now.as_millis() as u64,
            to_ms: (now + fault.heals_after()).as_millis() as u64,
            lanes: fault_lanes(
                &fault,
                self.leader.as_deref(),
                &acting_operator(self.lab),
                self.lab.replica_count(),
            ),
        };
        let name = fault.name();
        match strike(self.lab, fault, now, &mut self.api_up).await? {
            Some(later) => {
                self.struck.push(span);
                Ok(later)
            }
            None => {
                eprintln!(
                    "lab: {name} skipped: nothing to strike ({:.1}s)",
                    now.as_secs_f64()
                );
                self.skipped.push(index);
                Ok(Vec::new())
            }
        }
    }
}

impl Stage for LabStage<'_> {
    const NAME: &'static str = "lab";

    fn start_operator(&mut self, name: &str) -> Result<(), String> {
        let extra: &[String] = if name == OPERATOR_B {
            self.operator_b_flags
        } else {
            &[]
        };
        self.lab
            .start_operator(name, extra)
            .map_err(|e| format!("{e:#}"))
    }

    fn probes(&mut self, operator: &str) -> Result<ProbeLog, String> {
        let index = self
            .lab
            .operator_index(operator)
            .map_err(|e| format!("{e:#}"))?;
        let log = ProbeLog::default();
        self.probes.push((index, log.clone()));
        Ok(log)
    }

    fn schedule(&mut self, at: Duration, action: Action) {
        self.at(at, Event::Plan(action));
    }

    fn advance(&mut self, to: Duration) -> Result<(), String> {
        let runtime = self.runtime;
        runtime
            .block_on(self.step(to))
            .map_err(|e| format!("{e:#}"))
    }

    fn now(&self) -> Duration {
        self.lab.now()
    }

    fn api_up(&self) -> bool {
        self.api_up
    }

    fn delete(&mut self, name: &str) -> Result<(), String> {
        // The lab's own writes must land, or the run would judge less than it claims.
        self.lab
            .api
            .delete("spur.amd.com/v1alpha1", "SpurJob", Some("default"), name)
            .map(|_| ())
            .map_err(|e| format!("the lab could not delete SpurJob {name}: {e}"))
    }

    fn observe(&mut self, _operators: &[&str]) -> Observation {
        let seen = self.runtime.block_on(self.lab.observe());
        if seen.leader.is_some() {
            self.leader.clone_from(&seen.leader);
        }
        for (index, at, ready) in self.lab.take_probe_answers() {
            if let Some((_, log)) = self.probes.iter().find(|(i, _)| *i == index) {
                log.record(at, ready);
            }
        }
        seen
    }

    fn readiness_view(&mut self, operator: &str) -> WorldView {
        self.lab.readiness_view(operator, self.api_up)
    }

    fn take_skipped(&mut self) -> Vec<usize> {
        std::mem::take(&mut self.skipped)
    }

    fn take_restarts(&mut self) -> Vec<(String, Duration)> {
        std::mem::take(&mut self.restarts)
    }

    fn accepted_jobs(&mut self) -> Option<Vec<AcceptedJob>> {
        let mut jobs = self.runtime.block_on(self.lab.controller_jobs())?;
        jobs.sort_by_key(|j| j.id);
        let accepted = jobs.into_iter().map(|job| AcceptedJob {
            id: job.id,
            live: !is_terminal(job.state),
            ran: job.started,
            comment: job.comment,
        });
        Some(accepted.collect())
    }

    fn ending(&mut self) -> Ending {
        self.runtime.block_on(self.lab.scrape_all_calls());
        Ending {
            trace_hash: "lab".into(),
            rpcs: self.lab.controller_calls() as usize,
            service: None,
            replay_args: String::new(),
        }
    }

    fn drawing(&mut self, plan: &Plan, _skipped: &BTreeSet<usize>, _end: Duration) -> Drawing {
        drawing(self.lab, plan, std::mem::take(&mut self.struck))
    }
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

/// The lab's share of a run's timeline: its lanes, the faults as they struck, and the
/// operators' calls read from their logs.
fn drawing(lab: &Lab, plan: &Plan, faults: Vec<FaultSpan>) -> Drawing {
    let lanes = spur_judge::timeline::lanes(
        &plan.operators,
        (0..lab.replica_count()).map(|s| format!("spurctld-{s}")),
    );
    let mut calls = Vec::new();
    for name in &plan.operators {
        let log = std::fs::read_to_string(lab.operator_log(name)).unwrap_or_default();
        calls.extend(spur_judge::timeline::operator_log::from_operator_log(
            &log,
            name,
            lab.started_wall(),
        ));
    }
    Drawing {
        note: "The operators' calls are read from their JSON logs (wall clock, to the \
               millisecond). The real replicas log no call, so their lanes show only their \
               leader terms; the simulated twin's page draws each answer."
            .into(),
        lanes,
        faults,
        calls,
        ..Drawing::default()
    }
}

/// The operator replica the Lease names, else `operator`: partitions of "the operator"
/// cut the replica that acts, as in the simulation.
fn acting_operator(lab: &Lab) -> String {
    lab.lease_holder().unwrap_or_else(|| OPERATOR.to_owned())
}

/// Creates SpurJob `job`.
fn create(lab: &Lab, job: &PlannedJob) -> anyhow::Result<()> {
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
        .map_err(|e| anyhow::anyhow!("the lab could not create SpurJob {}: {e}", job.name))?;
    Ok(())
}

/// Carries out `event` (not a strike); returns the events it schedules.
async fn carry_out(
    lab: &mut Lab,
    event: Event,
    now: Duration,
    api_up: &mut bool,
) -> anyhow::Result<Vec<(Duration, Event)>> {
    match event {
        Event::Plan(Action::StartControllers) => {
            for slot in 0..lab.replica_count() {
                lab.start_replica(slot)?;
            }
        }
        Event::Plan(Action::Create(job)) => create(lab, &job)?,
        Event::Plan(Action::Strike { .. }) => unreachable!("LabStage::strike strikes"),
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
            return steer_once_an_end_landed(lab, onto, ended, until, now).await;
        }
        Event::HealOnceOn { onto, pairs, until } => {
            let on = lab.operator_connections(&acting_operator(lab))?;
            if on.contains(&onto) || now >= until {
                eprintln!(
                    "lab: the operator's connections are to {on:?}; its cut heals in {:?} ({:.1}s)",
                    STALE_STEER_HOLD,
                    now.as_secs_f64()
                );
                return Ok(vec![(now + STALE_STEER_HOLD, Event::Repair(pairs))]);
            }
            let again = Event::HealOnceOn { onto, pairs, until };
            return Ok(vec![(now + STALE_STEER_EVERY, again)]);
        }
    }
    Ok(Vec::new())
}

/// `leader-cut-stale-read`'s steering: once a job's end reached the new leader, cuts the
/// operator off from every replica but the cut leader `onto`.
async fn steer_once_an_end_landed(
    lab: &mut Lab,
    onto: usize,
    ended: usize,
    until: Duration,
    now: Duration,
) -> anyhow::Result<Vec<(Duration, Event)>> {
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
        let heal = Event::HealOnceOn {
            onto,
            pairs,
            until: now + STALE_STEER_CUT,
        };
        Ok(vec![(now + STALE_STEER_EVERY, heal)])
    } else if now < until {
        let again = Event::SteerOnceAnEndLanded { onto, ended, until };
        Ok(vec![(now + STALE_STEER_EVERY, again)])
    } else {
        anyhow::bail!("no job's end reached a new leader by {until:?}: nothing to steer by")
    }
}

/// Strikes `fault`; returns the events it schedules, or `None` when it found nothing to
/// strike (no leader to kill, freeze or cut off).
async fn strike(
    lab: &mut Lab,
    fault: Fault,
    now: Duration,
    api_up: &mut bool,
) -> anyhow::Result<Option<Vec<(Duration, Event)>>> {
    let replicas = lab.replica_count();
    let leader = lab.leader_slot();
    let later = match fault {
        Fault::LeaderKillSilent
        | Fault::LeaderKillGraceful
        | Fault::LeaderFreeze { .. }
        | Fault::LeaderCutOff { .. } => {
            let Some(slot) = leader else {
                return Ok(None);
            };
            strike_leader(lab, fault, slot, now).await?
        }
        Fault::FollowerKill => {
            let Some(slot) = (0..replicas).find(|s| Some(*s) != leader) else {
                return Ok(None);
            };
            lab.kill_replica(slot, true)?;
            vec![(now + REPLACE_AFTER, Event::ReplaceReplica(slot))]
        }
        Fault::FollowerCutOff {
            heal_after,
            operator_on_it,
        } => {
            let follower = (0..replicas)
                .find(|s| Some(*s) != leader)
                .expect("three replicas");
            let heal = cut_from_replicas(lab, follower)?;
            // Steered once the follower has forgotten its leader: before that its forwards
            // hang, no probe of it passes and the operator's patience leaves it at once;
            // after, it serves reads from its own copy and refuses every write.
            if operator_on_it {
                tokio::time::sleep(FORGET_LEADER).await;
                steer_onto(lab, &acting_operator(lab), follower).await?;
            }
            vec![(now + heal_after, heal)]
        }
        Fault::PartitionReplica { slot, heal_after } => {
            vec![(now + heal_after, cut_from_replicas(lab, slot)?)]
        }
        Fault::ApiOutage { duration } => {
            lab.api_outage(true);
            *api_up = false;
            vec![(now + duration, Event::ApiBack)]
        }
        fault => strike_operator(lab, fault, now).await?,
    };
    Ok(Some(later))
}

/// Strikes controller leader `slot` with a leader fault.
async fn strike_leader(
    lab: &mut Lab,
    fault: Fault,
    slot: usize,
    now: Duration,
) -> anyhow::Result<Vec<(Duration, Event)>> {
    let replicas = lab.replica_count();
    let mut later = Vec::new();
    match fault {
        Fault::LeaderFreeze { thaw_after } => {
            lab.freeze_replica(slot, true);
            later.push((now + thaw_after, Event::Thaw(slot)));
        }
        Fault::LeaderCutOff { heal_after, steer } => {
            let onto = match steer {
                None => None,
                Some(SteerTo::Leader) => Some(slot),
                Some(SteerTo::Follower) => (0..replicas).find(|s| *s != slot),
                Some(SteerTo::LeaderOnceAnEndLanded) => {
                    let ended = lab.controller_jobs().await.map_or(0, |j| ended_jobs(&j));
                    let steer = Event::SteerOnceAnEndLanded {
                        onto: slot,
                        ended,
                        until: now + heal_after,
                    };
                    later.push((now + STALE_STEER_EVERY, steer));
                    None
                }
            };
            if let Some(onto) = onto {
                steer_onto(lab, &acting_operator(lab), onto).await?;
            }
            let now = lab.now();
            later.push((now + heal_after, cut_from_replicas(lab, slot)?));
        }
        fault => {
            lab.kill_replica(slot, fault == Fault::LeaderKillSilent)?;
            later.push((now + REPLACE_AFTER, Event::ReplaceReplica(slot)));
        }
    }
    Ok(later)
}

/// Strikes the acting operator, the API server's watches and writes, or (for the faults
/// no named scenario has) fails the run.
async fn strike_operator(
    lab: &mut Lab,
    fault: Fault,
    now: Duration,
) -> anyhow::Result<Vec<(Duration, Event)>> {
    let replicas = lab.replica_count();
    let mut later = Vec::new();
    match fault {
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
        Fault::OperatorRestart => {
            lab.stop_operator(OPERATOR, Stop::Kill).await?;
            lab.start_operator(OPERATOR, &[])?;
        }
        Fault::OperatorLeaderChange { how, down_for } => {
            later.push(change_operator_leader(lab, how, down_for, now).await?);
        }
        Fault::WatchCut => lab
            .api
            .faults()
            .cut_watches(spur_fakes::api_server::CutKind::Abort),
        Fault::StatusConflict { writes } => lab.api.faults().conflict_next_status_writes(writes),
        fault => {
            anyhow::bail!(
                "the lab has no named scenario with {} (a seed's fault; run it with `spur-sim run`)",
                fault.name()
            )
        }
    }
    Ok(later)
}

/// Takes the acting operator out of the picture for `down_for`; returns what brings it back.
async fn change_operator_leader(
    lab: &mut Lab,
    how: LeaderChange,
    down_for: Duration,
    now: Duration,
) -> anyhow::Result<(Duration, Event)> {
    let leader = acting_operator(lab);
    match how {
        LeaderChange::Isolate => {
            let pair = (lab.operator_ip(&leader).expect("an operator"), API_IP);
            lab.partition(pair.0, pair.1, true)?;
            Ok((now + down_for, Event::Repair(vec![pair])))
        }
        LeaderChange::Sigterm | LeaderChange::Crash => {
            let stop = if how == LeaderChange::Sigterm {
                Stop::Term
            } else {
                Stop::Kill
            };
            lab.stop_operator(&leader, stop).await?;
            Ok((now + down_for, Event::StartOperator(leader)))
        }
    }
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
