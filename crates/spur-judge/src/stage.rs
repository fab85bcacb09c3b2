//! One runner for a plan on either stage, the simulation's world or the lab's real
//! processes: the runner owns the plan's schedule, the sampling cadence, the checks and the
//! outcome; a [`Stage`] carries out what it is told and reports what its world shows.
//!
//! The trait is synchronous so that the simulation's step loop implements it directly; the
//! lab implements it by blocking on its own runtime for each call.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use crate::checks::acting::ActingCheck;
use crate::checks::readiness::{ReadinessJudge, WorldView};
use crate::checks::{AcceptedJob, Bracket, Deadlines, Duplicates, Monitor, Observation, Violation};
use crate::hosts::{OPERATOR, SAMPLE};
use crate::outcome::Outcome;
use crate::plan::{Fault, Plan, PlannedJob};
use crate::probes::{ProbeLog, ProbeRule};
use crate::profiles::Profile;
use crate::service::ServiceSetup;
use crate::timeline::{CallMark, FaultSpan, Lane, Recorder, Span, Timeline};

/// What the plan has a stage carry out at a time of its own.
#[derive(Clone, Debug)]
pub enum Action {
    /// The controller replicas start.
    StartControllers,
    /// A SpurJob is created.
    Create(PlannedJob),
    /// The plan's fault number `index` strikes.
    Strike { index: usize, fault: Fault },
}

/// What a stage says of itself once a run is over.
#[derive(Clone, Debug)]
pub struct Ending {
    pub trace_hash: String,
    /// Calls the operator replicas made to the controller ([`Outcome::rpcs`]).
    pub rpcs: usize,
    pub service: Option<ServiceSetup>,
    pub replay_args: String,
}

/// A stage's share of a run's timeline; the runner adds what the checks recorded.
#[derive(Clone, Debug, Default)]
pub struct Drawing {
    pub title: String,
    pub replay: String,
    pub note: String,
    pub lanes: Vec<Lane>,
    /// Spans the stage saw itself (the simulation's trace); the sampled terms follow.
    pub spans: Vec<Span>,
    pub faults: Vec<FaultSpan>,
    pub calls: Vec<CallMark>,
}

/// Where a plan runs: what the runner asks of the simulation and of the lab alike.
pub trait Stage {
    /// How a failure of the stage itself is named among the violations.
    const NAME: &'static str;
    /// Starts operator replica `name` with the stage's flags for it.
    fn start_operator(&mut self, name: &str) -> Result<(), String>;
    /// The log the stage's prober of `operator`'s `/readyz` fills.
    fn probes(&mut self, operator: &str) -> Result<ProbeLog, String>;
    /// Has `action` carried out at `at` (the simulation at exactly `at`, the lab at its
    /// first step at or after it); called for the whole plan before the first step.
    fn schedule(&mut self, at: Duration, action: Action);
    /// Runs the world on to `to`, carrying out what is due.
    fn advance(&mut self, to: Duration) -> Result<(), String>;
    /// The time the checks judge at now.
    fn now(&self) -> Duration;
    /// Whether the stage's API server outage is over (or never began).
    fn api_up(&self) -> bool;
    /// Deletes SpurJob `name` now.
    fn delete(&mut self, name: &str) -> Result<(), String>;
    /// Judges the writes and calls the stage recorded since the last sample; a stage that
    /// records none judges none.
    fn judge_acting(&mut self, _acting: &mut ActingCheck) -> Vec<Violation> {
        Vec::new()
    }
    /// The world's ground truth now.
    fn observe(&mut self, operators: &[&str]) -> Observation;
    /// What `operator`'s readiness answer depends on now.
    fn readiness_view(&mut self, operator: &str) -> WorldView;
    /// Indexes of the plan's faults that found nothing to strike since the last call.
    fn take_skipped(&mut self) -> Vec<usize>;
    /// Operators the stage restarted on its own (not a planned operator-restart) since the
    /// last call, and when.
    fn take_restarts(&mut self) -> Vec<(String, Duration)> {
        Vec::new()
    }
    /// Every job the controller accepted, or `None` when the stage could not read them.
    fn accepted_jobs(&mut self) -> Option<Vec<AcceptedJob>>;
    /// What the stage says of itself at the end.
    fn ending(&mut self) -> Ending;
    /// The stage's share of the timeline of a run that ended at `end`.
    fn drawing(&mut self, plan: &Plan, skipped: &BTreeSet<usize>, end: Duration) -> Drawing;
}

/// How a run is set up beyond its plan and stage.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    pub profile: Profile,
    /// Whether to draw the run's timeline.
    pub timeline: bool,
    /// When the run began, for its wall time (the stage may have been built before).
    pub started: Instant,
}

/// Runs `plan` on `stage` and judges it.
pub fn run<S: Stage>(plan: &Plan, stage: &mut S, settings: Settings) -> Outcome {
    let mut run = Run::start(plan, stage, settings.timeline);
    while run.failure.is_none() && stage.now() < plan.end {
        run.sample(stage);
    }
    run.finish(stage, settings)
}

/// A run's state between samples.
struct Run<'p> {
    plan: &'p Plan,
    monitor: Monitor,
    /// What the samples showed over time, kept when the run draws a timeline.
    recorder: Option<Recorder>,
    /// sim.md's readiness check, one judge per operator replica.
    readiness: Vec<ReadinessJudge>,
    /// The plan's operator restarts not yet passed, latest first, by fault index.
    restarts: Vec<(Duration, usize)>,
    /// The plan's deletions, in time order, and how many were carried out.
    deletions: Vec<(Duration, String)>,
    deleted: usize,
    skipped: BTreeSet<usize>,
    next_sample: Duration,
    failure: Option<String>,
}

impl<'p> Run<'p> {
    /// Starts the operators and their probers, and schedules the plan on `stage`.
    fn start<S: Stage>(plan: &'p Plan, stage: &mut S, timeline: bool) -> Self {
        let mut failure = None;
        for host in &plan.operators {
            if let Err(e) = stage.start_operator(host) {
                failure.get_or_insert(e);
            }
        }
        // The Deployment's probe: every 5 s, 3 s to answer, three failures to drop. A
        // standby is probed too: its /readyz must tell the same truth from where it stands.
        let mut readiness = Vec::new();
        for host in &plan.operators {
            match stage.probes(host) {
                Ok(probes) => readiness.push(ReadinessJudge::new(
                    Deadlines::default().readiness,
                    probes,
                    ProbeRule::DEPLOYMENT,
                    host,
                )),
                Err(e) => {
                    failure.get_or_insert(e);
                }
            }
        }
        let mut restarts: Vec<(Duration, usize)> = plan
            .faults
            .iter()
            .enumerate()
            .filter(|(_, f)| f.fault == Fault::OperatorRestart)
            .map(|(index, f)| (f.at, index))
            .collect();
        restarts.reverse();
        schedule(plan, stage);
        let monitor = Monitor::new(Deadlines::default(), &plan.operators);
        let recorder = timeline.then(Recorder::default);
        let mut deletions: Vec<(Duration, String)> = plan
            .jobs
            .iter()
            .filter_map(|j| j.delete_at.map(|at| (at, j.name.clone())))
            .collect();
        deletions.sort();
        Run {
            plan,
            monitor,
            recorder,
            readiness,
            restarts,
            deletions,
            deleted: 0,
            skipped: BTreeSet::new(),
            next_sample: Duration::ZERO,
            failure,
        }
    }

    /// Advances `stage` to the next sample, carries out the deletions due and judges what
    /// the world shows.
    fn sample<S: Stage>(&mut self, stage: &mut S) {
        self.next_sample += SAMPLE;
        if let Err(e) = stage.advance(self.next_sample) {
            self.failure = Some(e);
            return;
        }
        self.skipped.extend(stage.take_skipped());
        // Deletions are the runner's own, between samples, so the monitor notes each as
        // it is made.
        while let Some((at, name)) = self.deletions.get(self.deleted) {
            if *at > stage.now() {
                break;
            }
            if let Err(e) = stage.delete(name) {
                self.failure = Some(e);
                return;
            }
            self.monitor.deleted(name, *at);
            self.deleted += 1;
        }
        let (_, acting) = self.monitor.acting_parts();
        let acting = stage.judge_acting(acting);
        self.monitor.violations.extend(acting);
        let seen = stage.observe(&self.plan.operators);
        self.monitor.observe(&seen, stage.now(), stage.api_up());
        if let Some(recorder) = &mut self.recorder {
            recorder.observe(&seen, stage.now());
        }
        self.restarted(stage);
        for judge in &mut self.readiness {
            let view = stage.readiness_view(judge.operator());
            if let Some(violation) = judge.judge(view, stage.now()) {
                self.monitor.violations.push(violation);
            }
        }
    }

    /// Tells the readiness judges of the operators restarted by now: the plan's
    /// operator-restarts that struck (restarting `OPERATOR` in place) and the stage's own.
    fn restarted<S: Stage>(&mut self, stage: &mut S) {
        let mut restarted = Vec::new();
        while self
            .restarts
            .last()
            .is_some_and(|(at, _)| *at <= stage.now())
        {
            let (at, index) = self.restarts.pop().expect("not empty");
            if !self.skipped.contains(&index) {
                restarted.push((OPERATOR.to_owned(), at));
            }
        }
        restarted.extend(stage.take_restarts());
        for (operator, at) in restarted {
            for judge in &mut self.readiness {
                if judge.operator() == operator {
                    judge.restarted(at);
                }
            }
        }
    }

    /// The whole run's checks, and what it came to.
    fn finish<S: Stage>(mut self, stage: &mut S, settings: Settings) -> Outcome {
        let now = stage.now();
        self.skipped.extend(stage.take_skipped());
        let duplicates = self.duplicates(stage, now);
        let faults: Vec<String> = self
            .plan
            .faults
            .iter()
            .enumerate()
            .filter(|(index, _)| !self.skipped.contains(index))
            .map(|(_, planned)| {
                format!("{}@{:.1}s", planned.fault.name(), planned.at.as_secs_f64())
            })
            .collect();
        let violations = self.violations::<S>(now);
        let ending = stage.ending();
        let timeline = self.recorder.take().map(|recorder| {
            let drawing = stage.drawing(self.plan, &self.skipped, now);
            Box::new(draw(
                drawing,
                recorder,
                (&self.monitor.brackets, &violations),
                now,
            ))
        });
        let lags = &self.monitor.lags;
        Outcome {
            seed: self.plan.seed,
            profile: settings.profile,
            violations,
            trace_hash: ending.trace_hash,
            sim_secs: now.as_secs_f64(),
            wall_ms: settings.started.elapsed().as_millis(),
            faults,
            registration_lags: lags.registration.clone(),
            submission_lags: lags.submission.clone(),
            status_lags: lags.status.clone(),
            failover_submission_lags: lags.failover_submission.clone(),
            duplicates: duplicates.ran,
            duplicates_stopped: duplicates.stopped,
            rpcs: ending.rpcs,
            acting_writes: self.monitor.acting_writes().clone(),
            acting_calls: self.monitor.acting_calls().clone(),
            landed_after_cut: self.monitor.landed_after_cut().clone(),
            service: ending.service,
            replay_args: ending.replay_args,
            timeline,
        }
    }

    /// The duplicate check on every job the controller accepted, as the stage read them.
    fn duplicates<S: Stage>(&mut self, stage: &mut S, now: Duration) -> Duplicates {
        let accepted = stage.accepted_jobs();
        if accepted.is_none() {
            self.monitor.violations.push(Violation {
                check: S::NAME,
                object: "controller".into(),
                at: now,
                detail: "no leader answered at the end: the duplicate check could not run".into(),
            });
        }
        self.monitor
            .finish_with(accepted.as_deref().unwrap_or_default(), now)
    }

    /// Every violation of the run, with the checks that could not judge and the stage's
    /// own failure.
    fn violations<S: Stage>(&mut self, now: Duration) -> Vec<Violation> {
        let mut violations = std::mem::take(&mut self.monitor.violations);
        // Every scenario ends with a quiet period longer than the readiness deadline: a
        // check that never judged would pass silently, so that is a failure of its own.
        for judge in &self.readiness {
            if judge.judged == 0 && self.failure.is_none() {
                violations.push(Violation {
                    check: "readiness",
                    object: format!("{}/readyz", judge.operator()),
                    at: now,
                    detail: "never judged: the world never held still for the deadline".into(),
                });
            }
        }
        if let Some(e) = self.failure.take() {
            violations.push(Violation {
                check: S::NAME,
                object: "world".into(),
                at: now,
                detail: e,
            });
        }
        violations
    }
}

/// Schedules the plan's timed actions on `stage`, in one order on every stage: the
/// controllers, the SpurJobs, the faults.
fn schedule<S: Stage>(plan: &Plan, stage: &mut S) {
    stage.schedule(plan.controllers_at, Action::StartControllers);
    for job in &plan.jobs {
        stage.schedule(job.create_at, Action::Create(job.clone()));
    }
    for (index, planned) in plan.faults.iter().enumerate() {
        let fault = planned.fault.clone();
        stage.schedule(planned.at, Action::Strike { index, fault });
    }
}

/// A run's timeline: the stage's drawing, with the terms, SpurJobs and deadlines the checks
/// recorded.
fn draw(
    drawing: Drawing,
    recorder: Recorder,
    (brackets, violations): (&[Bracket], &[Violation]),
    end: Duration,
) -> Timeline {
    let (terms, jobs) = recorder.finish(end);
    let mut spans = drawing.spans;
    spans.extend(terms);
    let mut calls = drawing.calls;
    calls.sort_by(|a, b| (a.from_ms, &a.lane).cmp(&(b.from_ms, &b.lane)));
    let (deadlines, violations) = crate::timeline::deadlines(brackets, violations);
    Timeline {
        title: drawing.title,
        replay: drawing.replay,
        note: drawing.note,
        end_ms: end.as_millis() as u64,
        lanes: drawing.lanes,
        spans,
        faults: drawing.faults,
        calls,
        jobs,
        deadlines,
        violations,
    }
}
