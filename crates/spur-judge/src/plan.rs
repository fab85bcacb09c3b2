//! A scenario drawn from one seed: the workload and a mix of the faults of docs/specs.md,
//! "The simulation".

use std::ops::Range;
use std::time::Duration;

use rand::RngExt;
use rand_chacha::ChaCha8Rng;

use crate::seed::rng_for;
use crate::service::ServiceSetup;

/// What every generated scenario shares; each default is the one docs/specs.md ("The
/// simulation") judges at.
#[derive(Clone, Debug)]
pub struct ScenarioConfig {
    /// Labelled nodes.
    pub nodes: usize,
    /// SpurJobs created over the workload window.
    pub jobs: usize,
    /// SpurJobs are created over this window from the start.
    pub workload_window: Duration,
    /// Fraction of SpurJobs deleted while pending or running.
    pub delete_fraction: f64,
    /// The operator may start up to this long before the first controller leader.
    pub max_controller_delay: Duration,
    /// Faults drawn per scenario (at least one).
    pub max_faults: usize,
    /// After the last fault heals the world stays healthy this long, so liveness can be
    /// judged.
    pub quiet_period: Duration,
    /// Pods run for a duration drawn from this range.
    pub pod_run_time: (Duration, Duration),
    /// Fraction of pods that fail (exit code 1).
    pub pod_failure_fraction: f64,
    /// After each fault that ends the leader (a leader kill), one more SpurJob is created
    /// within this long of it, while the replicas elect a new leader, so the submission lag
    /// after a leader change gets a sample from every such fault, not only from the rare
    /// job that happened to wait through one.
    pub election_job_within: Duration,
    /// Fraction of scenarios that run two operator replicas, each with one
    /// `operator-leader-change`: a quarter, so most seeds keep the one-replica scenarios
    /// and their coverage of every other fault.
    pub two_replica_fraction: f64,
    /// How long the replica a leader change takes down stays down: longer than a takeover
    /// (lease duration plus two retry periods, 25 s with the defaults), so the other
    /// replica must take over before it returns; at most 90 s, as a pod's restart
    /// back-off would allow.
    pub leader_change_down: (Duration, Duration),
    /// Flags added to the second replica's (after the profile's): empty in every sweep;
    /// tests break that replica with them to show the checks catch it.
    pub operator_b_flags: Vec<String>,
    /// Flags added to every replica's (after the profile's): empty in every sweep; tests
    /// break the operator with them to show the checks catch it.
    pub operator_flags: Vec<String>,
    /// Breaks of the world struck at their times: empty in every sweep; tests strike them
    /// to show the checks catch them.
    pub sabotage: Vec<(Duration, Sabotage)>,
    /// What [`ScenarioConfig::with_intensity`] set; a replay needs the same.
    pub intensity: Intensity,
    /// Also draw the run as a [`crate::timeline::Timeline`] (`replay --html`); the
    /// operator's calls are caught only where the simulation's `timeline_calls::layer` is
    /// installed. Changes nothing the simulation observes.
    pub timeline: bool,
}

/// Everything a run needs beyond its seed and profile to replay: how hard a sweep presses
/// each scenario beyond the defaults the deadlines are judged at (`spur-sim run
/// --fault-density N --duration D`), the simulation's step (`--tick`) and the Service's
/// setup when a run forces one (`--service`, `--no-endpoint`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Intensity {
    /// Multiplies the faults drawn per scenario (up to `3 × N`); they overlap more as
    /// their count grows, since each strikes anywhere in the workload window, and above 1
    /// also in the quiet period after it (see [`plan`]).
    pub fault_density: u32,
    /// The workload window: faults and SpurJobs (20 per 180 s) spread over it.
    pub duration: Duration,
    /// turmoil's step: every timer fires on a multiple of it, so another step is another
    /// run of the same seed.
    pub tick: Duration,
    /// The `spurctld` Service forced on every seed (`--service`, `--no-endpoint`); `None`:
    /// each seed draws its own ([`Intensity::service_for`]), so a sweep covers every setup
    /// users deploy.
    pub service: Option<ServiceSetup>,
}

/// The workload window of docs/specs.md ("The simulation"), the one the deadlines are
/// judged at.
const WORKLOAD_WINDOW: Duration = Duration::from_secs(180);
/// SpurJobs created over [`WORKLOAD_WINDOW`].
const JOBS_PER_WINDOW: usize = 20;
/// Faults drawn at most per scenario at density 1.
const MAX_FAULTS: usize = 3;
/// turmoil's step in scenarios: 20 ms still resolves every bound the operator uses (the
/// shortest is a 250 ms retry or hedge), and a coarser step runs a sweep faster.
pub const DEFAULT_TICK: Duration = Duration::from_millis(20);

impl Default for Intensity {
    fn default() -> Self {
        Intensity {
            fault_density: 1,
            duration: WORKLOAD_WINDOW,
            tick: DEFAULT_TICK,
            service: None,
        }
    }
}

impl Intensity {
    /// The flags that give this intensity, empty for the default (for replay commands).
    pub fn args(&self) -> String {
        let mut args = String::new();
        if self.fault_density != 1 {
            args.push_str(&format!(" --fault-density {}", self.fault_density));
        }
        if self.duration != WORKLOAD_WINDOW {
            args.push_str(&format!(
                " --duration {}",
                humantime::format_duration(self.duration)
            ));
        }
        if self.tick != DEFAULT_TICK {
            args.push_str(&format!(
                " --tick {}",
                humantime::format_duration(self.tick)
            ));
        }
        if let Some(service) = self.service {
            args.push_str(&service.args());
        }
        args
    }

    /// The Service of `seed`'s world: the forced one, else drawn from the seed on a stream
    /// of its own, so a seed's plan is the same whichever Service it runs behind.
    pub fn service_for(&self, seed: u64) -> ServiceSetup {
        self.service.unwrap_or_else(|| {
            let mut rng = rng_for(seed, "service-setup");
            ServiceSetup::ALL[rng.random_range(0..ServiceSetup::ALL.len())]
        })
    }

    /// This intensity with `seed`'s Service forced: its flags replay the seed exactly.
    pub fn for_seed(&self, seed: u64) -> Intensity {
        Intensity {
            service: Some(self.service_for(seed)),
            ..*self
        }
    }
}

impl ScenarioConfig {
    /// This config with `intensity`'s fault count and workload window (and as many
    /// SpurJobs per second of it as the default has).
    pub fn with_intensity(mut self, intensity: Intensity) -> Self {
        self.max_faults = MAX_FAULTS * intensity.fault_density.max(1) as usize;
        self.workload_window = intensity.duration;
        let scale = intensity.duration.as_secs_f64() / WORKLOAD_WINDOW.as_secs_f64();
        self.jobs = ((JOBS_PER_WINDOW as f64 * scale).round() as usize).max(1);
        self.intensity = intensity;
        self
    }
}

impl Default for ScenarioConfig {
    fn default() -> Self {
        Self {
            nodes: 4,
            jobs: JOBS_PER_WINDOW,
            workload_window: WORKLOAD_WINDOW,
            delete_fraction: 0.1,
            max_controller_delay: Duration::from_secs(60),
            max_faults: MAX_FAULTS,
            quiet_period: Duration::from_secs(120),
            pod_run_time: (Duration::from_secs(5), Duration::from_secs(60)),
            pod_failure_fraction: 0.1,
            election_job_within: Duration::from_secs(4),
            two_replica_fraction: 0.25,
            leader_change_down: (Duration::from_secs(30), Duration::from_secs(90)),
            operator_b_flags: Vec::new(),
            operator_flags: Vec::new(),
            sabotage: Vec::new(),
            intensity: Intensity::default(),
            timeline: false,
        }
    }
}

/// One SpurJob of the workload.
#[derive(Clone, Debug)]
pub struct PlannedJob {
    pub name: String,
    pub create_at: Duration,
    pub run_secs: u64,
    pub exit_code: i32,
    pub delete_at: Option<Duration>,
}

/// The fault classes of docs/specs.md ("The simulation").
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The leader pod is partitioned, then crashed: connections to it hang.
    LeaderKillSilent,
    /// The leader's process dies: connections close.
    LeaderKillGraceful,
    /// A follower pod dies.
    FollowerKill,
    /// The leader's process is frozen (SIGSTOP) for a while, then thawed; it stays in the
    /// Service. Named scenarios only: drawing it would change every seed's plan.
    LeaderFreeze { thaw_after: Duration },
    /// The leader is cut off from the other replicas (a stale leader that keeps answering
    /// what it can). Named scenarios only. With `steer`, the lab first resets the
    /// operator's connections to the other replicas until its only one is to the replica
    /// named (the simulation cuts the leader as it finds it: where the operator is then
    /// is its seed's draw).
    LeaderCutOff {
        heal_after: Duration,
        steer: Option<SteerTo>,
    },
    /// A follower (the first by slot) is cut off from the other replicas: it forgets its
    /// leader and refuses writes at once (`"not the Raft leader"`) until the cut heals.
    /// Named scenarios only. With `operator_on_it`, the lab then resets the operator's
    /// connections to the other replicas until its only one is to that follower.
    FollowerCutOff {
        heal_after: Duration,
        operator_on_it: bool,
    },
    /// The operator cannot reach one replica for a while.
    PartitionOperatorReplica { slot: usize, heal_after: Duration },
    /// One replica is cut off from the other two (forces an election when it leads).
    PartitionReplica { slot: usize, heal_after: Duration },
    /// The API server answers 503 for a while.
    ApiOutage { duration: Duration },
    /// Every watch stream is cut.
    WatchCut,
    /// The next status writes get 409.
    StatusConflict { writes: u32 },
    /// The operator's process restarts.
    OperatorRestart,
    /// A node's NotReady taint comes and goes.
    NodeNotReadyFlap { node: usize, down_for: Duration },
    /// A node's allocatable changes.
    NodeResourcesChanged { node: usize },
    /// The leader applies the next SubmitJob and its reply is lost: the caller sees the call
    /// hang (`hang`) or fail with a transport error.
    ReplyLost { hang: bool },
    /// The operator cannot reach any replica behind the Service for a while.
    PartitionOperatorService { heal_after: Duration },
    /// A labelled node is deleted from the cluster.
    NodeDeleted { node: usize },
    /// With two operator replicas: the one the Lease names is lost to the lease for
    /// `down_for` (see [`LeaderChange`]); the other must take over by the lease meanwhile.
    OperatorLeaderChange {
        how: LeaderChange,
        down_for: Duration,
    },
}

/// Where the lab puts the acting operator's only controller connection before a fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SteerTo {
    /// The replica the fault strikes (the leader).
    Leader,
    /// A follower (the first by slot), whose forwards then go into the fault.
    Follower,
    /// The leader, only after the cut, once a job's end reached the new leader: the lab
    /// then cuts the operator off from the other replicas until a few seconds after its
    /// channel is to the cut leader, which answers reads from a copy that never saw that
    /// end (the lab's `leader-cut-stale-read`).
    LeaderOnceAnEndLanded,
}

/// How an operator leader change takes the leading replica away.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaderChange {
    /// Its process crashes (connections close) and restarts after the down time.
    Crash,
    /// SIGTERM: it drains, releases the lease, exits, and restarts after the down time.
    Sigterm,
    /// It keeps running but is cut off from the API server: it can neither renew nor
    /// see that another took over, and must stop acting on its own (the split brain a
    /// lease exists to prevent).
    Isolate,
}

impl Fault {
    /// The name used in results (`leader-kill-silent@61.2s`).
    pub fn name(&self) -> &'static str {
        match self {
            Fault::LeaderKillSilent => "leader-kill-silent",
            Fault::LeaderKillGraceful => "leader-kill-graceful",
            Fault::FollowerKill => "follower-kill",
            Fault::LeaderFreeze { .. } => "leader-freeze",
            Fault::LeaderCutOff { .. } => "leader-cut-off",
            Fault::FollowerCutOff { .. } => "follower-cut-off",
            Fault::PartitionOperatorReplica { .. } => "partition-operator-replica",
            Fault::PartitionReplica { .. } => "partition-replica",
            Fault::ApiOutage { .. } => "api-outage",
            Fault::WatchCut => "watch-cut",
            Fault::StatusConflict { .. } => "status-conflict",
            Fault::OperatorRestart => "operator-restart",
            Fault::NodeNotReadyFlap { .. } => "node-not-ready-flap",
            Fault::NodeResourcesChanged { .. } => "node-resources-changed",
            Fault::ReplyLost { .. } => "reply-lost",
            Fault::PartitionOperatorService { .. } => "partition-operator-service",
            Fault::NodeDeleted { .. } => "node-deleted",
            Fault::OperatorLeaderChange { .. } => "operator-leader-change",
        }
    }

    /// Whether the fault always takes the leader away, so the replicas elect another.
    pub fn ends_the_leader(&self) -> bool {
        matches!(
            self,
            Fault::LeaderKillSilent
                | Fault::LeaderKillGraceful
                | Fault::LeaderFreeze { .. }
                | Fault::LeaderCutOff { .. }
        )
    }

    /// How long after it starts the world is whole again.
    pub fn heals_after(&self) -> Duration {
        match self {
            // A killed pod is replaced (StatefulSet) after ~10 s, then catches up.
            Fault::LeaderKillSilent | Fault::LeaderKillGraceful | Fault::FollowerKill => {
                Duration::from_secs(30)
            }
            Fault::LeaderFreeze { thaw_after } => *thaw_after,
            Fault::LeaderCutOff { heal_after, .. } | Fault::FollowerCutOff { heal_after, .. } => {
                *heal_after
            }
            Fault::PartitionOperatorReplica { heal_after, .. }
            | Fault::PartitionReplica { heal_after, .. }
            | Fault::PartitionOperatorService { heal_after } => *heal_after,
            Fault::ApiOutage { duration } => *duration,
            Fault::NodeNotReadyFlap { down_for, .. }
            | Fault::OperatorLeaderChange { down_for, .. } => *down_for,
            _ => Duration::from_secs(1),
        }
    }
}

#[derive(Clone, Debug)]
pub struct PlannedFault {
    pub at: Duration,
    pub fault: Fault,
}

/// Everything a seed decides.
#[derive(Clone, Debug)]
pub struct Plan {
    pub seed: u64,
    pub nodes: usize,
    /// When the controller replicas start (the operator starts at 0).
    pub controllers_at: Duration,
    /// The operator replicas' hosts (`operator`, and `operator-b` when two run).
    pub operators: Vec<&'static str>,
    pub jobs: Vec<PlannedJob>,
    pub faults: Vec<PlannedFault>,
    /// When the run ends: after the last fault healed plus the quiet period, and after
    /// the workload's last event.
    pub end: Duration,
}

/// Fault classes the generator draws from, by their arm in [`draw_fault`]: every class of
/// docs/specs.md ("The simulation") that a seed may strike.
const DRAWN: [usize; 14] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13];

/// The scenario `seed` draws. Every draw comes from the seed's own streams in a fixed
/// order (controller start, SpurJobs, faults, then the jobs created during elections), so
/// a seed plans the same scenario in every process.
pub fn plan(seed: u64, config: &ScenarioConfig) -> Plan {
    let mut rng = rng_for(seed, "scenario");
    let controllers_at =
        Duration::from_secs_f64(rng.random_range(0.0..=config.max_controller_delay.as_secs_f64()));
    let mut jobs = draw_jobs(&mut rng, config);
    let window = workload_window(controllers_at, config);
    let mut faults = draw_faults(&mut rng, config, &window);
    let operators = match draw_leader_change(seed, config, &window) {
        Some(change) => {
            faults.push(change);
            vec![crate::hosts::OPERATOR, crate::hosts::OPERATOR_B]
        }
        None => vec![crate::hosts::OPERATOR],
    };
    faults.sort_by_key(|f| f.at);
    jobs.extend(election_jobs(&mut rng, config, &faults));
    jobs.sort_by_key(|j| j.create_at);
    let end = plan_end(&faults, &jobs, controllers_at, config.quiet_period);
    Plan {
        seed,
        nodes: config.nodes,
        controllers_at,
        operators,
        jobs,
        faults,
        end,
    }
}

/// The workload's SpurJobs, in creation order: each created somewhere in the workload
/// window, running a drawn time, some failing and some deleted.
fn draw_jobs(rng: &mut ChaCha8Rng, config: &ScenarioConfig) -> Vec<PlannedJob> {
    let mut jobs = Vec::with_capacity(config.jobs);
    for i in 0..config.jobs {
        let create_at =
            Duration::from_millis(rng.random_range(0..=config.workload_window.as_millis() as u64));
        let run_secs =
            rng.random_range(config.pod_run_time.0.as_secs()..=config.pod_run_time.1.as_secs());
        let exit_code = i32::from(rng.random_bool(config.pod_failure_fraction));
        let delete_at = rng
            .random_bool(config.delete_fraction)
            .then(|| create_at + Duration::from_secs(rng.random_range(1..=run_secs + 20)));
        jobs.push(PlannedJob {
            name: format!("job-{i:03}"),
            create_at,
            run_secs,
            exit_code,
            delete_at,
        });
    }
    jobs.sort_by_key(|j| j.create_at);
    jobs
}

/// Where faults strike: from 10 s after the controller starts (so it is up), for the
/// workload window.
fn workload_window(controllers_at: Duration, config: &ScenarioConfig) -> Range<Duration> {
    let start = controllers_at + Duration::from_secs(10);
    start..start + config.workload_window
}

/// The drawn faults, at least one, in the order drawn.
fn draw_faults(
    rng: &mut ChaCha8Rng,
    config: &ScenarioConfig,
    window: &Range<Duration>,
) -> Vec<PlannedFault> {
    let count = rng.random_range(1..=config.max_faults.max(1));
    let mut faults = Vec::with_capacity(count);
    // Denser scenarios also strike in the quiet period after the window, where no SpurJob
    // is created but jobs still run, end and are mirrored; the plan still ends a whole
    // quiet period after the last heal, so every liveness check keeps its window.
    let faults_end = if config.intensity.fault_density > 1 {
        window.end + config.quiet_period
    } else {
        window.end
    };
    for _ in 0..count {
        let at = Duration::from_millis(
            rng.random_range(window.start.as_millis() as u64..faults_end.as_millis() as u64),
        );
        let fault = draw_fault(rng, config);
        faults.push(PlannedFault { at, fault });
    }
    faults
}

/// One fault of a class from [`DRAWN`], with its parameters. A flat table: one arm a
/// class, each drawing its parameters in field order.
fn draw_fault(rng: &mut ChaCha8Rng, config: &ScenarioConfig) -> Fault {
    match DRAWN[rng.random_range(0..DRAWN.len())] {
        0 => Fault::LeaderKillSilent,
        1 => Fault::LeaderKillGraceful,
        2 => Fault::FollowerKill,
        3 => Fault::PartitionOperatorReplica {
            slot: rng.random_range(0..3),
            heal_after: Duration::from_secs(rng.random_range(5..=60)),
        },
        4 => Fault::PartitionReplica {
            slot: rng.random_range(0..3),
            heal_after: Duration::from_secs(rng.random_range(5..=60)),
        },
        5 => Fault::ApiOutage {
            duration: Duration::from_secs(rng.random_range(2..=30)),
        },
        6 => Fault::WatchCut,
        7 => Fault::StatusConflict {
            writes: rng.random_range(1..=3),
        },
        8 => Fault::OperatorRestart,
        9 => Fault::NodeNotReadyFlap {
            node: rng.random_range(0..config.nodes.max(1)),
            down_for: Duration::from_secs(rng.random_range(2..=40)),
        },
        10 => Fault::NodeResourcesChanged {
            node: rng.random_range(0..config.nodes.max(1)),
        },
        11 => Fault::ReplyLost {
            hang: rng.random_bool(0.5),
        },
        12 => Fault::PartitionOperatorService {
            heal_after: Duration::from_secs(rng.random_range(5..=60)),
        },
        _ => Fault::NodeDeleted {
            node: rng.random_range(0..config.nodes.max(1)),
        },
    }
}

/// For a seed that runs two operator replicas, its one leader change. Drawn from a stream
/// of its own, so a seed's one-replica plan is the same whether or not it also runs a
/// second replica.
fn draw_leader_change(
    seed: u64,
    config: &ScenarioConfig,
    window: &Range<Duration>,
) -> Option<PlannedFault> {
    let mut rng = rng_for(seed, "operator-replicas");
    if !rng.random_bool(config.two_replica_fraction) {
        return None;
    }
    let at = Duration::from_millis(
        rng.random_range(window.start.as_millis() as u64..window.end.as_millis() as u64),
    );
    let (low, high) = config.leader_change_down;
    Some(PlannedFault {
        at,
        fault: Fault::OperatorLeaderChange {
            how: [
                LeaderChange::Crash,
                LeaderChange::Sigterm,
                LeaderChange::Isolate,
            ][rng.random_range(0..3)],
            down_for: Duration::from_millis(
                rng.random_range(low.as_millis() as u64..=high.as_millis() as u64),
            ),
        },
    })
}

/// One SpurJob created while the replicas elect a new leader after each fault that ends
/// the leader (`faults` in time order): `election-<index of the fault>`.
fn election_jobs(
    rng: &mut ChaCha8Rng,
    config: &ScenarioConfig,
    faults: &[PlannedFault],
) -> Vec<PlannedJob> {
    let mut jobs = Vec::new();
    for (i, f) in faults.iter().enumerate() {
        if !f.fault.ends_the_leader() {
            continue;
        }
        let create_at = f.at
            + Duration::from_millis(
                rng.random_range(0..=config.election_job_within.as_millis() as u64),
            );
        let run_secs =
            rng.random_range(config.pod_run_time.0.as_secs()..=config.pod_run_time.1.as_secs());
        jobs.push(PlannedJob {
            name: format!("election-{i}"),
            create_at,
            run_secs,
            exit_code: 0,
            delete_at: None,
        });
    }
    jobs
}

/// When the run ends: a whole quiet period after the last heal (or the controller's
/// start), and at least 30 s after the workload's last pod ended.
fn plan_end(
    faults: &[PlannedFault],
    jobs: &[PlannedJob],
    controllers_at: Duration,
    quiet_period: Duration,
) -> Duration {
    let healed = faults
        .iter()
        .map(|f| f.at + f.fault.heals_after())
        .max()
        .unwrap_or_default()
        .max(controllers_at);
    let workload_done = jobs
        .iter()
        .map(|j| j.create_at + Duration::from_secs(j.run_secs))
        .max()
        .unwrap_or_default();
    (healed + quiet_period).max(workload_done + Duration::from_secs(30))
}

/// A deliberate break of the world, by SpurJob name, for the tests that show a check
/// fires on a real run. Never drawn by a seed: only a test's [`ScenarioConfig::sabotage`]
/// strikes them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Sabotage {
    /// Another writer clears the SpurJob's `status.spurJobId`.
    ClearSpurJobId { job: String },
    /// Another writer sets the SpurJob's `status.spurJobId` to the id of SpurJob `to`'s
    /// controller job.
    SpurJobIdOf { job: String, to: String },
    /// Another controller's finalizer on the SpurJob: once deleted, it never goes.
    HoldFinalizer { job: String },
    /// A second controller job carrying the SpurJob's UID, submitted straight to the
    /// controller leader (its spec copied from the first) and marked running there at
    /// once, as if some agent had taken its launch: past what the operator can stop (it
    /// refuses a duplicate's launch and cancels it, `spur_operator::jobs::duplicates`).
    DuplicateJob { job: String },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_intensity_plans_exactly_the_default_scenarios() {
        let plain = ScenarioConfig::default();
        let pressed = ScenarioConfig::default().with_intensity(Intensity::default());
        for seed in 0..50 {
            assert_eq!(
                format!("{:?}", plan(seed, &plain)),
                format!("{:?}", plan(seed, &pressed))
            );
        }
        assert_eq!(Intensity::default().args(), "");
    }

    #[test]
    fn a_denser_longer_intensity_draws_more_faults_and_jobs_and_says_how_to_replay() {
        let intensity = Intensity {
            fault_density: 4,
            duration: Duration::from_secs(600),
            ..Intensity::default()
        };
        let config = ScenarioConfig::default().with_intensity(intensity);
        let count = |config: &ScenarioConfig| -> usize {
            (0..200)
                .map(|seed| {
                    plan(seed, config)
                        .faults
                        .iter()
                        .filter(|f| !matches!(f.fault, Fault::OperatorLeaderChange { .. }))
                        .count()
                })
                .sum()
        };
        let (dense, plain) = (count(&config), count(&ScenarioConfig::default()));
        assert!(
            dense > 3 * plain,
            "{dense} faults at density 4, {plain} at 1"
        );
        for seed in 0..200 {
            let plan = plan(seed, &config);
            assert!(
                plan.faults.len() <= 12 + 1,
                "seed {seed}: {:?}",
                plan.faults
            );
            assert_eq!(
                plan.jobs
                    .iter()
                    .filter(|j| j.name.starts_with("job-"))
                    .count(),
                67
            );
            // Faults strike in the window and the quiet after it, and the plan keeps a
            // whole quiet period after the last heal.
            let faults_end = plan.controllers_at + Duration::from_secs(10 + 600 + 120);
            assert!(plan.faults.iter().all(|f| f.at < faults_end));
            let healed = plan
                .faults
                .iter()
                .map(|f| f.at + f.fault.heals_after())
                .max()
                .expect("faults");
            assert!(plan.end >= healed + Duration::from_secs(120));
        }
        let window_end = |plan: &Plan| plan.controllers_at + Duration::from_secs(10 + 600);
        assert!(
            (0..200).any(|seed| {
                let plan = plan(seed, &config);
                plan.faults.iter().any(|f| f.at >= window_end(&plan))
            }),
            "no fault struck in the quiet period of 200 dense seeds"
        );
        assert_eq!(intensity.args(), " --fault-density 4 --duration 10m");
        let unconfirmed = Intensity {
            service: Some(ServiceSetup::cluster_ip(
                crate::service::NoEndpoint::DropUnconfirmed,
            )),
            ..intensity
        };
        assert_eq!(
            unconfirmed.args(),
            " --fault-density 4 --duration 10m --service clusterip --no-endpoint drop-unconfirmed"
        );
    }

    #[test]
    fn each_seed_draws_its_service_and_a_forced_one_holds_for_every_seed() {
        let drawn = Intensity::default();
        let mut counts = std::collections::BTreeMap::new();
        for seed in 0..400 {
            let service = drawn.service_for(seed);
            assert_eq!(service, drawn.service_for(seed), "seed {seed}");
            *counts.entry(service.name()).or_insert(0) += 1;
            // The replay names what was drawn, and forcing it draws nothing else.
            let replayed = drawn.for_seed(seed);
            assert_eq!(replayed.args(), service.args());
            assert_eq!(replayed.service_for(seed), service);
        }
        assert_eq!(counts.len(), ServiceSetup::ALL.len(), "{counts:?}");
        assert!(counts.values().all(|n| *n >= 70), "{counts:?}");
        let forced = Intensity {
            service: Some(ServiceSetup::HEADLESS),
            ..Intensity::default()
        };
        assert!((0..50).all(|seed| forced.service_for(seed) == ServiceSetup::HEADLESS));
        assert_eq!(forced.args(), " --service headless");
    }

    #[test]
    fn the_same_seed_plans_the_same_scenario() {
        let config = ScenarioConfig::default();
        let a = plan(7, &config);
        let b = plan(7, &config);
        assert_eq!(format!("{a:?}"), format!("{b:?}"));
        assert_ne!(format!("{a:?}"), format!("{:?}", plan(8, &config)));
    }

    #[test]
    fn every_fault_class_appears_across_seeds() {
        let config = ScenarioConfig::default();
        let mut seen = std::collections::BTreeSet::new();
        for seed in 0..200 {
            for f in plan(seed, &config).faults {
                seen.insert(f.fault.name());
            }
        }
        // Every drawn class, and the leader change of two-replica scenarios.
        assert_eq!(seen.len(), DRAWN.len() + 1, "{seen:?}");
        assert!(seen.contains("partition-replica"));
        assert!(seen.contains("operator-leader-change"));
    }

    #[test]
    fn a_quarter_of_seeds_run_two_replicas_each_with_one_leader_change() {
        let config = ScenarioConfig::default();
        let mut two = 0;
        let mut hows = std::collections::BTreeMap::new();
        for seed in 0..400 {
            let plan = plan(seed, &config);
            let changes: Vec<&PlannedFault> = plan
                .faults
                .iter()
                .filter(|f| matches!(f.fault, Fault::OperatorLeaderChange { .. }))
                .collect();
            if plan.operators.len() == 2 {
                two += 1;
                assert_eq!(changes.len(), 1, "seed {seed}");
                let Fault::OperatorLeaderChange { how, down_for } = changes[0].fault else {
                    unreachable!()
                };
                *hows.entry(format!("{how:?}")).or_insert(0) += 1;
                assert!(down_for >= config.leader_change_down.0, "seed {seed}");
                assert!(plan.end >= changes[0].at + down_for + config.quiet_period);
            } else {
                assert!(changes.is_empty(), "seed {seed}");
            }
            // The rest of the plan is the one-replica plan of the same seed.
            let one = plan_with_fraction(seed, 0.0);
            let others: Vec<String> = plan
                .faults
                .iter()
                .filter(|f| !matches!(f.fault, Fault::OperatorLeaderChange { .. }))
                .map(|f| format!("{f:?}"))
                .collect();
            let expected: Vec<String> = one.faults.iter().map(|f| format!("{f:?}")).collect();
            assert_eq!(others, expected, "seed {seed}");
        }
        assert!(
            (70..=130).contains(&two),
            "{two} of 400 seeds run two replicas"
        );
        assert_eq!(hows.len(), 3, "{hows:?}");
        assert!(hows.values().all(|n| *n > 15), "{hows:?}");
    }

    fn plan_with_fraction(seed: u64, fraction: f64) -> Plan {
        let config = ScenarioConfig {
            two_replica_fraction: fraction,
            ..ScenarioConfig::default()
        };
        plan(seed, &config)
    }

    #[test]
    fn a_job_is_created_during_each_election_a_leader_kill_starts() {
        let config = ScenarioConfig::default();
        let mut kills = 0;
        for seed in 0..200 {
            let plan = plan(seed, &config);
            for (i, f) in plan.faults.iter().enumerate() {
                let job = plan.jobs.iter().find(|j| j.name == format!("election-{i}"));
                if f.fault.ends_the_leader() {
                    kills += 1;
                    let job = job.expect("a job for each leader kill");
                    assert!(job.create_at >= f.at);
                    assert!(job.create_at <= f.at + config.election_job_within);
                } else {
                    assert!(job.is_none(), "seed {seed}: {:?}", f.fault);
                }
            }
            assert!(plan.jobs.is_sorted_by_key(|j| j.create_at));
        }
        assert!(kills > 20, "{kills} leader kills in 200 seeds");
    }
}
