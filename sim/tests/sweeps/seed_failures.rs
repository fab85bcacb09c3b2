//! The seed's own failures (../shared/spec/seed-fix.txt) as named regression scenarios,
//! each on a fixed seed, each run with the profiles that tell them apart.
//!
//! Times are simulated. Lags are measured as sim.md's checks define them: registration
//! from "a leader exists and the Service has a ready endpoint", submission from the later
//! of "created" and "a leader exists". Each scenario first asserts its own precondition,
//! so a change in the world cannot make it silently test nothing.

use std::time::Duration;

use crate::common;
use common::{run_until_true, s};

use serde_json::{Value, json};
use spur_fakes::model::{ControllerConfig, LostReply, RefusalKind};
use spur_judge::profiles::Profile;
use spur_operator::uid_in_comment;
use spur_sim::harness::Sim;
use spur_sim::scenario::ScenarioConfig;
use spur_sim::world::{KillMode, WorldConfig};

/// sim.md's deadlines.
const REGISTRATION_DEADLINE: Duration = Duration::from_secs(15);
const SUBMISSION_DEADLINE: Duration = Duration::from_secs(20);

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// When the first leader elected at or after `after` took over, from the trace.
fn leader_elected_after(sim: &Sim, after: Duration) -> Option<Duration> {
    sim.world
        .trace()
        .find("elected leader")
        .into_iter()
        .map(|e| e.at)
        .find(|at| *at >= after)
}

/// When the `spurctld` Service first routed to a ready endpoint: the first endpoint
/// became ready, plus the propagation delay.
fn service_ready_at(sim: &Sim) -> Option<Duration> {
    let delay = sim.world.net().config().endpoint_propagation;
    sim.world
        .trace()
        .find("endpoint spurctld/")
        .into_iter()
        .find(|e| e.event.ends_with(" ready") && !e.event.ends_with("not ready"))
        .map(|e| e.at + delay)
}

/// The replica the Service last picked for a connection from `host`.
fn last_pick(sim: &Sim, host: &str, before: Duration) -> Option<String> {
    sim.world
        .trace()
        .find("service spurctld -> ")
        .into_iter()
        .rfind(|e| e.host == host && e.at <= before)
        .and_then(|e| e.event.rsplit(' ').next().map(str::to_owned))
}

fn short_job() -> Value {
    json!({"image": "busybox", "env": {"SIM_RUN_SECONDS": "5"}})
}

fn spurjob_id(sim: &Sim, name: &str) -> Option<u32> {
    sim.spurjob("default", name)
        .and_then(|job| job["status"]["spurJobId"].as_u64())
        .map(|id| id as u32)
}

fn uid_of(sim: &Sim, name: &str) -> String {
    sim.spurjob("default", name).expect("the SpurJob exists")["metadata"]["uid"]
        .as_str()
        .expect("a uid")
        .to_owned()
}

/// The controller jobs (every id the log handed out) whose comment carries `uid`.
fn jobs_carrying(sim: &Sim, uid: &str) -> Vec<u32> {
    sim.world
        .cluster()
        .job_ids()
        .into_iter()
        .filter(|id| {
            sim.controller_job(*id)
                .is_some_and(|job| uid_in_comment(&job.comment) == Some(uid))
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// (a) The first registration, with the operator up before the controller.
// ---------------------------------------------------------------------------------------

/// Seed of scenario (a): its first leader comes ~13 s after the operator starts (12.9 s;
/// found by trying seeds 7001 to 7022 with the replicas starting at 9 s on the model with
/// 4.5 to 7 s elections, for a first leader 12 to 16 s in: 7005, 7006, 7011, 7013, 7014,
/// 7017 and 7022 give 12.0 to 13.1 s; 7001, the seed before, now elects at 9.9 s).
const SEED_A: u64 = 7017;
/// When the replica pods start: the first leader follows after the sampled election.
const CONTROLLERS_START_A: Duration = Duration::from_secs(9);

struct FirstRegistration {
    leader_at: Duration,
    service_ready_at: Duration,
    registered_at: Option<Duration>,
}

impl FirstRegistration {
    /// From "a leader exists and the Service has a ready endpoint".
    fn ready_at(&self) -> Duration {
        self.leader_at.max(self.service_ready_at)
    }

    fn lag(&self) -> Option<Duration> {
        self.registered_at.map(|at| at - self.ready_at())
    }
}

fn first_registration(profile: Profile) -> FirstRegistration {
    let mut sim = Sim::with_controllers_at(SEED_A, WorldConfig::default(), CONTROLLERS_START_A);
    sim.add_nodes(2);
    sim.start_operator("operator", &profile.flags());
    let registered_at =
        run_until_true(&mut sim, secs(200), |sim| sim.registered_nodes().len() == 2);
    let leader_at = leader_elected_after(&sim, Duration::ZERO).expect("a leader was elected");
    let service_ready_at = service_ready_at(&sim).expect("the Service got an endpoint");
    // The precondition: the operator came up ~14 s before the first leader, and its first
    // connect found no endpoint (so the SYN was dropped).
    assert!(
        (secs(12)..=secs(16)).contains(&leader_at),
        "{profile}: the first leader came at {}, not ~14 s after the operator started",
        s(leader_at)
    );
    assert!(
        !sim.world
            .trace()
            .find("service spurctld: no endpoint, SYN dropped")
            .is_empty(),
        "{profile}: the operator never met the Service without an endpoint"
    );
    FirstRegistration {
        leader_at,
        service_ready_at,
        registered_at,
    }
}

/// seed-fix.txt, first failure: "The first registration of the nodes came three minutes
/// late." The operator starts before the controller, its SYN to the endpoint-less Service
/// is dropped, and without a connect timeout it waits out the kernel's SYN retries (the
/// real cluster: 133 s; the modelled kernel gives up after 127 s).
#[test]
fn a_first_registration_behind_a_dropped_syn() {
    let default = first_registration(Profile::Default);
    let lag = default.lag();
    eprintln!(
        "(a) default: leader {} service ready {} registered {:?} lag {:?}",
        s(default.leader_at),
        s(default.service_ready_at),
        default.registered_at.map(s),
        lag.map(s)
    );
    assert!(
        lag.is_some_and(|lag| lag <= REGISTRATION_DEADLINE),
        "default: nodes registered at {:?}, {:?} after a leader and a ready endpoint \
         ({}); the deadline is {}",
        default.registered_at.map(s),
        lag.map(s),
        s(default.ready_at()),
        s(REGISTRATION_DEADLINE)
    );

    let unbounded = first_registration(Profile::Unbounded);
    eprintln!(
        "(a) unbounded: leader {} service ready {} registered {:?} lag {:?}",
        s(unbounded.leader_at),
        s(unbounded.service_ready_at),
        unbounded.registered_at.map(s),
        unbounded.lag().map(s)
    );
    let at = unbounded
        .registered_at
        .expect("unbounded: the nodes register once the kernel gives up");
    // The dropped SYN fails after 127 s; the retry then connects at once.
    assert!(
        (secs(127)..=secs(135)).contains(&at),
        "unbounded: registered at {} (lag {}), expected just after the kernel's 127 s \
         SYN timeout",
        s(at),
        s(unbounded.lag().unwrap_or_default())
    );
    assert!(unbounded.lag().unwrap() > REGISTRATION_DEADLINE);
}

/// The first registration after controllers that start at `start`, with the operator's
/// `flags`: its lag from "a leader exists and the Service has a ready endpoint", and
/// whether a SYN of the operator's was dropped by the endpoint-less Service.
fn late_controller(seed: u64, start: Duration, flags: &[&str]) -> (Option<Duration>, bool) {
    let mut sim = Sim::with_controllers_at(seed, WorldConfig::default(), start);
    sim.add_nodes(2);
    sim.start_operator("operator", flags);
    let registered_at =
        run_until_true(&mut sim, secs(120), |sim| sim.registered_nodes().len() == 2);
    let leader_at = leader_elected_after(&sim, Duration::ZERO).expect("a leader was elected");
    let ready_at = service_ready_at(&sim)
        .expect("the Service got an endpoint")
        .max(leader_at);
    let dropped = !sim
        .world
        .trace()
        .find("service spurctld: no endpoint, SYN dropped")
        .is_empty();
    (registered_at.map(|at| at.saturating_sub(ready_at)), dropped)
}

/// Seed of the hedged-dial scenario (scenario (a)'s seed before the model's elections
/// took 4.5 to 7 s).
const SEED_HEDGE: u64 = 7001;
/// When the controllers start in the hedged-dial scenario: the operator's dial whose SYN
/// the Service dropped is still in flight when the Service gets its endpoint (found by
/// trying start times 8 to 16 s in 40 ms steps with the channel policy of issue 18: 9.32
/// to 9.92 s and 15.68 to 16.0 s hold it; 9.40 s measured 0.1 s hedged and 2.0 s with
/// `--controller-rules-off hedge`).
const CONTROLLERS_START_HEDGE: Duration = Duration::from_millis(9_400);

/// Issue 8: registration within a second of "a leader exists and the Service has a ready
/// endpoint". The operator's dial in flight when the endpoint became ready had its SYN
/// dropped; it holds the connect for the whole 2 s connect timeout unless the operator
/// dials again meanwhile (rule 3 of `controller::policy`, every 250 ms by default).
#[test]
fn a_hedged_dial_registers_within_a_second_of_the_first_endpoint() {
    let target = secs(1);
    let (hedged, dropped) = late_controller(SEED_HEDGE, CONTROLLERS_START_HEDGE, &[]);
    assert!(
        dropped,
        "precondition: a SYN met the Service without an endpoint"
    );
    eprintln!("hedged: lag {:?}", hedged.map(s));
    assert!(
        hedged.is_some_and(|lag| lag <= target),
        "default: registered {:?} after the Service could answer; target {}",
        hedged.map(s),
        s(target)
    );
    let (unhedged, _) = late_controller(
        SEED_HEDGE,
        CONTROLLERS_START_HEDGE,
        &["--controller-rules-off", "hedge"],
    );
    eprintln!("unhedged: lag {:?}", unhedged.map(s));
    assert!(
        unhedged.is_some_and(|lag| lag > target),
        "without hedging: registered {:?} after the Service could answer; expected the \
         dropped SYN to hold it past {}",
        unhedged.map(s),
        s(target)
    );
}

// ---------------------------------------------------------------------------------------
// (b) The leader pod killed silently under the operator's channel.
// ---------------------------------------------------------------------------------------

/// Seed of scenario (b): the Service's last pick for the operator is the leader.
const SEED_B: u64 = 7011;

struct SubmissionAfterKill {
    trace_hash: String,
    killed_at: Duration,
    created_at: Duration,
    new_leader_at: Option<Duration>,
    submitted_at: Option<Duration>,
}

impl SubmissionAfterKill {
    fn lag(&self) -> Option<Duration> {
        let from = self.created_at.max(self.new_leader_at?);
        self.submitted_at.map(|at| at.saturating_sub(from))
    }

    fn describe(&self) -> String {
        format!(
            "killed {} created {} new leader {:?} submitted {:?} lag {:?}",
            s(self.killed_at),
            s(self.created_at),
            self.new_leader_at.map(s),
            self.submitted_at.map(s),
            self.lag().map(s)
        )
    }
}

fn silent_leader_kill(profile: Profile) -> SubmissionAfterKill {
    silent_kill(
        SEED_B,
        &profile.flags(),
        true,
        Duration::ZERO,
        &profile.to_string(),
    )
}

/// The leader dies silently at 40 s, a SpurJob is created `create_after` that. The
/// precondition: the operator's channel leads to the leader (`to_leader`) or to a follower.
fn silent_kill(
    seed: u64,
    flags: &[&str],
    to_leader: bool,
    create_after: Duration,
    label: &str,
) -> SubmissionAfterKill {
    let mut sim = Sim::new(seed);
    sim.add_nodes(2);
    // The controller is up first: this scenario is about the kill, not the first connect.
    sim.world.run_until(secs(10)).unwrap();
    sim.start_operator("operator", flags);
    let up = run_until_true(&mut sim, secs(60), |sim| sim.registered_nodes().len() == 2);
    assert!(up.is_some(), "{label}: the nodes never registered");
    sim.world.run_until(secs(40)).unwrap();

    let leader = sim.world.leader().expect("a leader");
    let now = sim.world.elapsed();
    let picked = last_pick(&sim, "operator", now);
    assert_eq!(
        picked.as_deref() == Some(leader.as_str()),
        to_leader,
        "{label}: precondition: the operator's channel must lead to {} (it leads to {picked:?}, the leader is {leader})",
        if to_leader {
            "the leader"
        } else {
            "a follower"
        }
    );
    sim.world.kill(&leader, KillMode::Silent);
    let killed_at = sim.world.elapsed();
    sim.world.run_until(killed_at + create_after).unwrap();
    sim.create_spurjob("default", "after-kill", short_job());
    let created_at = sim.world.elapsed();
    let submitted_at = run_until_true(&mut sim, killed_at + secs(150), |sim| {
        spurjob_id(sim, "after-kill").is_some()
    });
    SubmissionAfterKill {
        trace_hash: sim.world.trace_hash(),
        killed_at,
        created_at,
        new_leader_at: leader_elected_after(&sim, killed_at),
        submitted_at,
    }
}

/// seed-fix.txt, second failure (runs 1, 3 and 5; test_new_leader_accepts_writes): "A
/// killed controller Pod stalled the job controller for a minute or two." The leader pod
/// dies silently while the operator's one channel leads to it; a SpurJob created right
/// after waits on the dead connection. The simulation has no retransmission timeout, so
/// without keepalive or a request bound it waits for good (the real kernel gave up after
/// 64 to 110 s).
#[test]
fn a_silent_leader_kill_under_the_channel() {
    let default = silent_leader_kill(Profile::Default);
    eprintln!("(b) default: {}", default.describe());
    assert!(
        default.lag().is_some_and(|lag| lag <= SUBMISSION_DEADLINE),
        "default: {}; the deadline is {} after the new leader",
        default.describe(),
        s(SUBMISSION_DEADLINE)
    );

    let unbounded = silent_leader_kill(Profile::Unbounded);
    eprintln!("(b) unbounded: {}", unbounded.describe());
    let new_leader = unbounded.new_leader_at.expect("unbounded: a new leader");
    assert!(
        unbounded
            .submitted_at
            .is_none_or(|at| at > new_leader + SUBMISSION_DEADLINE),
        "unbounded: {}; expected it late (past {})",
        unbounded.describe(),
        s(new_leader + SUBMISSION_DEADLINE)
    );
}

/// Seed of the follower variant: the Service's last pick for the operator is a follower,
/// and with the SpurJob created 3 s after the kill, a call is stuck on it when the new
/// leader is elected (found by trying seeds 7012 to 7038 and creation 0 to 4.5 s after the
/// kill, on the model before Ping was answered locally).
const SEED_B_FOLLOWER: u64 = 7026;

/// The seed's runs 3 and 5 again, with the operator's channel through a follower: the
/// follower forwards the SpurJob's writes to the dead leader with no bound (wire.md), and
/// each hangs until the operator's own request bound unless the channel policy leaves it.
/// The default must submit within 3 s of the election (issue 8's target). Measured with
/// the policy of issue 18: 2.1 s, and 2.1 s with `--controller-rules-off patience` too:
/// the followers' probes hang until the election, so no round finds a replica to leave
/// the write for before the retry would anyway (with the probe fallback, since deleted,
/// the default took 0.1 s here). Patience is earned by the cut-leader scenario
/// (`cut_replica.rs`) and the sweep (README: what each rule buys).
#[test]
fn a_silent_leader_kill_behind_a_follower() {
    let run = silent_kill(
        SEED_B_FOLLOWER,
        &[],
        false,
        Duration::from_secs(3),
        "default",
    );
    eprintln!("(b, follower) default: {}", run.describe());
    let lag = run
        .lag()
        .unwrap_or_else(|| panic!("default: {}", run.describe()));
    assert!(lag <= secs(3), "default: {} after the election", s(lag));
}

// ---------------------------------------------------------------------------------------
// (c) The first registration refused.
// ---------------------------------------------------------------------------------------

/// seed-fix.txt, "The node watcher also ends on a refused registration instead of logging
/// it": a node whose first registration was refused was not tried again until its
/// resources changed. Here the refusal clears and nothing else happens (no node change,
/// no restart, no forgotten node): the node must still get registered.
#[test]
fn a_refused_first_registration_is_retried_once_the_refusal_clears() {
    let refused_until = secs(25);
    for (seed, kind) in [
        (7003, RefusalKind::PermissionDenied),
        (7004, RefusalKind::NotAccepted),
    ] {
        let mut sim = Sim::new(seed);
        sim.add_nodes(2);
        sim.world
            .cluster()
            .refuse_registrations(refused_until, kind);
        sim.start_operator("operator", &[]);
        let versions = |sim: &Sim| -> Vec<Value> {
            sim.api
                .list("v1", "Node")
                .unwrap()
                .iter()
                .map(|n| n["metadata"]["resourceVersion"].clone())
                .collect()
        };
        let before = versions(&sim);
        let registered_at =
            run_until_true(&mut sim, secs(120), |sim| sim.registered_nodes().len() == 2);
        // The precondition: registrations reached a leader and were refused.
        let refused = match kind {
            RefusalKind::PermissionDenied => "RegisterAgent -> PermissionDenied",
            RefusalKind::NotAccepted => {
                "RegisterAgent -> ok RegisterAgentResponse { accepted: false"
            }
        };
        let refusals = sim.world.trace().find(refused).len();
        assert!(refusals >= 2, "{kind:?}: only {refusals} refusals");
        let at = registered_at
            .unwrap_or_else(|| panic!("{kind:?}: never registered after the refusal cleared"));
        eprintln!(
            "(c) {kind:?}: refused until {} ({refusals} refusals), registered at {} (lag {})",
            s(refused_until),
            s(at),
            s(at - refused_until)
        );
        assert!(at >= refused_until);
        // The per-node backoff is capped at --retry-max (30 s): no later than that.
        assert!(
            at - refused_until <= secs(30),
            "{kind:?}: registered {} after the refusal cleared",
            s(at - refused_until)
        );
        assert_eq!(versions(&sim), before, "no node changed: no other trigger");
        assert!(sim.world.trace().find("restart operator").is_empty());
        // Each node committed once: the retries after the refusal, nothing more.
        assert_eq!(sim.world.trace().find(": register node ").len(), 2);
    }
}

// ---------------------------------------------------------------------------------------
// (d) UNAVAILABLE from the followers through a 10 s election.
// ---------------------------------------------------------------------------------------

/// Seed of scenario (d).
const SEED_D: u64 = 7005;

fn ten_second_elections() -> WorldConfig {
    WorldConfig {
        controller: ControllerConfig {
            election_min: secs(10),
            election_max: secs(10),
            ..ControllerConfig::default()
        },
        ..WorldConfig::default()
    }
}

fn election_after_kill(profile: Profile) -> SubmissionAfterKill {
    let mut sim = Sim::with_config(SEED_D, ten_second_elections());
    sim.add_nodes(2);
    sim.start_operator("operator", &profile.flags());
    let up = run_until_true(&mut sim, secs(60), |sim| sim.registered_nodes().len() == 2);
    assert!(up.is_some(), "{profile}: the nodes never registered");
    sim.world.run_until(secs(40)).unwrap();
    let leader = sim.world.kill_leader(KillMode::Graceful).expect("a leader");
    let killed_at = sim.world.elapsed();
    sim.create_spurjob("default", "in-election", short_job());
    let created_at = sim.world.elapsed();
    let submitted_at = run_until_true(&mut sim, killed_at + secs(150), |sim| {
        spurjob_id(sim, "in-election").is_some()
    });
    // The precondition: the operator's writes met UNAVAILABLE from a follower while the
    // election ran.
    let during_election: Vec<_> = sim
        .world
        .trace()
        .find("SubmitJob -> Unavailable")
        .into_iter()
        .filter(|e| e.at >= killed_at && e.at < killed_at + secs(10) && e.host != leader)
        .collect();
    assert!(
        !during_election.is_empty(),
        "{profile}: no SubmitJob met UNAVAILABLE during the election"
    );
    SubmissionAfterKill {
        trace_hash: sim.world.trace_hash(),
        killed_at,
        created_at,
        new_leader_at: leader_elected_after(&sim, killed_at),
        submitted_at,
    }
}

/// seed-fix.txt, run 9: "right after a Pod kill, a follower answers cannot reach leader
/// while the election runs, and the job controller's own error backoff doubles to 32 s
/// and beyond, so a SpurJob created in that moment is submitted after the test's 60 s
/// window." The leader is killed (its process dies) under a 10 s election, a SpurJob is
/// created at once, and every write meets UNAVAILABLE from a follower until the election
/// ends.
///
/// What this measures, honestly: the operator's backoff is per SpurJob, so a fresh
/// SpurJob's doubling (1 + 2 + 4 + 8 s under `seed-fix`) reaches the new leader 15 s
/// after creation, 5 s after the election: within the deadline. The seed's doubling
/// reached 32 s only because it had been failing for over 31 s; the next scenario gives
/// it that long.
#[test]
fn unavailable_through_a_ten_second_election() {
    let default = election_after_kill(Profile::Default);
    eprintln!("(d) default: {}", default.describe());
    assert!(
        default.lag().is_some_and(|lag| lag <= SUBMISSION_DEADLINE),
        "default: {}; the deadline is {}",
        default.describe(),
        s(SUBMISSION_DEADLINE)
    );
    let seed_fix = election_after_kill(Profile::SeedFix);
    eprintln!("(d) seed-fix: {}", seed_fix.describe());
    // The profile replays the seed's doubling: attempts at +0, +1, +3, +7, +15 s.
    let waited = seed_fix.submitted_at.expect("seed-fix: submitted") - seed_fix.created_at;
    assert!(
        (secs(15)..secs(16)).contains(&waited),
        "seed-fix: {}; expected the doubling backoff's fifth attempt, 15 s after creation",
        seed_fix.describe()
    );
    assert!(
        default.submitted_at < seed_fix.submitted_at,
        "default ({}) is no faster than seed-fix ({})",
        default.describe(),
        seed_fix.describe()
    );
}

/// Seed of the run 9 replay.
const SEED_D2: u64 = 7010;

/// Two of three replicas die together; the dead follower's replacement pod starts
/// `replacement_after` later, and the next 10 s election round elects a leader.
fn leaderless_window(profile: Profile, replacement_after: Duration) -> SubmissionAfterKill {
    let mut sim = Sim::with_config(SEED_D2, ten_second_elections());
    sim.add_nodes(2);
    sim.start_operator("operator", &profile.flags());
    let up = run_until_true(&mut sim, secs(60), |sim| sim.registered_nodes().len() == 2);
    assert!(up.is_some(), "{profile}: the nodes never registered");
    sim.world.run_until(secs(40)).unwrap();
    // The leader and one follower die together (one Kubernetes node taking two pods):
    // the survivor has no majority and answers UNAVAILABLE until a replacement pod joins.
    let leader = sim.world.kill_leader(KillMode::Graceful).expect("a leader");
    let cluster = sim.world.cluster().clone();
    let leader_slot = cluster.slot_of(&leader).unwrap();
    let other = (0..3).find(|slot| *slot != leader_slot).unwrap();
    sim.world.kill_replica(other, KillMode::Graceful);
    let killed_at = sim.world.elapsed();
    sim.world.at(killed_at + replacement_after, move |w| {
        w.replace_replica(other);
    });
    sim.create_spurjob("default", "leaderless", short_job());
    let created_at = sim.world.elapsed();
    let submitted_at = run_until_true(&mut sim, killed_at + secs(150), |sim| {
        spurjob_id(sim, "leaderless").is_some()
    });
    let unavailable = sim
        .world
        .trace()
        .find("SubmitJob -> Unavailable")
        .into_iter()
        .filter(|e| e.at >= killed_at)
        .count();
    assert!(
        unavailable >= 3,
        "{profile}: precondition: SubmitJob met UNAVAILABLE only {unavailable} times"
    );
    SubmissionAfterKill {
        trace_hash: sim.world.trace_hash(),
        killed_at,
        created_at,
        new_leader_at: leader_elected_after(&sim, killed_at),
        submitted_at,
    }
}

/// seed-fix.txt, run 9, with the window the seed's backoff needed to reach 32 s: writes
/// meet UNAVAILABLE for 30 to 40 s (two of three replicas die; a replacement joins and
/// the next 10 s election round elects a leader). A doubling backoff's next attempt then
/// comes up to its cap after the new leader: 32 s for `seed-fix`; up to 30 s for the
/// default's own doubling too, before it retried flat through elections: with
/// `--retry-transient off` the default measured 26.8 s with the 30 s window (late) and
/// 16.8 s with the 40 s one.
#[test]
fn run_nine_a_doubled_backoff_misses_the_new_leader() {
    for replacement_after in [secs(25), secs(32)] {
        let default = leaderless_window(Profile::Default, replacement_after);
        eprintln!(
            "(d2) default, replaced after {}: {}",
            s(replacement_after),
            default.describe()
        );
        let window = default.new_leader_at.expect("a new leader") - default.killed_at;
        assert!(
            window >= secs(30),
            "precondition: the leaderless window lasted only {}",
            s(window)
        );
        assert!(
            default.lag().is_some_and(|lag| lag <= SUBMISSION_DEADLINE),
            "default: {}; the deadline is {}",
            default.describe(),
            s(SUBMISSION_DEADLINE)
        );
    }
    // With a 40 s window the seed's doubling (attempts at +0, +1, +3, +7, +15, +31, +63 s)
    // overshoots the new leader by 23 s.
    let seed_fix = leaderless_window(Profile::SeedFix, secs(32));
    eprintln!("(d2) seed-fix, replaced after 32s: {}", seed_fix.describe());
    assert!(
        seed_fix.lag().is_none_or(|lag| lag > SUBMISSION_DEADLINE),
        "seed-fix: {}; expected the doubled backoff to make it late",
        seed_fix.describe()
    );
}

// ---------------------------------------------------------------------------------------
// (e) A SubmitJob's reply lost after the controller applied it.
// ---------------------------------------------------------------------------------------

/// Runs scenario (e) with the operator's `flags` (`label` names them in messages): the
/// time from the lost reply to the SpurJob's recorded id.
fn lost_reply(seed: u64, label: &str, flags: &[&str], how: LostReply) -> Duration {
    let profile = label;
    let mut sim = Sim::new(seed);
    sim.add_nodes(1);
    sim.start_operator("operator", flags);
    let up = run_until_true(&mut sim, secs(60), |sim| sim.registered_nodes().len() == 1);
    assert!(up.is_some(), "{profile}: the node never registered");
    sim.world.cluster().lose_next_reply("SubmitJob", how);
    sim.create_spurjob("default", "lost-reply", short_job());
    let created_at = sim.world.elapsed();
    let submitted = run_until_true(&mut sim, created_at + secs(120), |sim| {
        spurjob_id(sim, "lost-reply").is_some()
    });
    let applied_unanswered = sim
        .world
        .trace()
        .find("SubmitJob applied; its reply is lost");
    assert_eq!(
        applied_unanswered.len(),
        1,
        "{profile} {how:?}: precondition: one SubmitJob was applied and its reply lost"
    );
    let at = submitted.unwrap_or_else(|| panic!("{profile} {how:?}: never got its id"));
    let ids = sim.world.cluster().job_ids();
    let job = sim.spurjob("default", "lost-reply").unwrap();
    eprintln!(
        "(e) {profile} {how:?}: reply lost at {}, id recorded at {}, log ids {ids:?}",
        s(applied_unanswered[0].at),
        s(at)
    );
    assert_eq!(ids.len(), 1, "{profile} {how:?}: a duplicate job: {ids:?}");
    assert_eq!(spurjob_id(&sim, "lost-reply"), Some(ids[0]));
    assert_eq!(jobs_carrying(&sim, &uid_of(&sim, "lost-reply")), ids);
    let submitted = job["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Submitted")
        .cloned()
        .unwrap();
    assert_eq!(
        submitted["reason"], "Adopted",
        "{profile} {how:?}: the original job was adopted: {submitted:#}"
    );
    at - applied_unanswered[0].at
}

/// The ambiguity seed-fix.txt's approach leaves open: it treats UNKNOWN and
/// DEADLINE_EXCEEDED on any call as a transport failure and retries ("failed to report
/// job status: Timeout expired", then the next attempt), but a write that failed that
/// way may have been applied. wire.md records a real follower answering UNKNOWN
/// "transport error" when its connection to the leader broke under a forwarded write.
/// The controller applies a SubmitJob and its reply is lost: the operator must adopt the
/// job rather than submit it twice.
#[test]
fn a_lost_submit_reply_is_adopted_not_duplicated() {
    lost_reply(7006, "default", &[], LostReply::TransportError);
    lost_reply(
        7006,
        "seed-fix",
        &Profile::SeedFix.flags(),
        LostReply::TransportError,
    );
}

/// Issue 8: the reply never comes. Without a read-back only the request bound (5 s) ends
/// the call, and the retry finds the job; reading the submission back every second
/// (`--submit-read-back`) finds it while the call still waits, and nothing is sent twice.
///
/// The read-back is compared with patience off in both arms (`--controller-rules-off
/// patience`): with it, a SubmitJob unanswered for a second is abandoned once a new
/// channel serves, and the retry's UID lookup finds the job as the read-back would.
/// Measured on seed 7007: default 1.1 s; patience off 1.1 s; patience and read-back off
/// 5.7 s (the request bound).
#[test]
fn a_hung_submit_reply_is_read_back_within_seconds() {
    let with = lost_reply(7007, "default", &[], LostReply::Hang);
    assert!(
        with <= secs(2),
        "default: id {} after the lost reply",
        s(with)
    );
    let patience_off = ["--controller-rules-off", "patience"];
    let read_back_alone = lost_reply(7007, "patience off", &patience_off, LostReply::Hang);
    let without = lost_reply(
        7007,
        "patience and read-back off",
        &[
            patience_off[0],
            patience_off[1],
            "--submit-read-back",
            "off",
        ],
        LostReply::Hang,
    );
    assert!(
        read_back_alone <= secs(2),
        "patience off: id {} after the lost reply",
        s(read_back_alone)
    );
    assert!(
        without >= secs(5),
        "patience and read-back off: id {} after the lost reply, before the request bound",
        s(without)
    );
}

// ---------------------------------------------------------------------------------------
// (f) The operator restarts between submitting and recording the id.
// ---------------------------------------------------------------------------------------

/// Not a failure the seed logged, but the same gap as the lost reply, opened by sim.md's
/// "operator process restart" fault: the process restarts after the controller applied
/// its SubmitJob and before the SpurJob's status recorded the id (the seed's operator
/// kept no record outside the SpurJob either). The new process must find the job, not
/// submit it again.
#[test]
fn an_operator_restart_between_submit_and_status_does_not_duplicate() {
    let mut sim = Sim::new(7008);
    sim.add_nodes(1);
    sim.start_operator("operator", &[]);
    let up = run_until_true(&mut sim, secs(60), |sim| sim.registered_nodes().len() == 1);
    assert!(up.is_some(), "the node never registered");
    sim.create_spurjob("default", "restart", short_job());
    let created_at = sim.world.elapsed();
    // Step by step until the controller commits the job, then restart at once: the reply
    // is still on its way, the status patch not yet sent.
    while sim.world.cluster().job_ids().is_empty() {
        assert!(
            sim.world.elapsed() < created_at + secs(30),
            "the SpurJob was never submitted"
        );
        sim.world.step().unwrap();
    }
    let committed_at = sim.world.elapsed();
    assert_eq!(
        spurjob_id(&sim, "restart"),
        None,
        "precondition: the restart comes before the status records the id"
    );
    sim.world.restart("operator");
    let recorded = run_until_true(&mut sim, committed_at + secs(60), |sim| {
        spurjob_id(sim, "restart").is_some()
    });
    let at = recorded.expect("the restarted operator records the id");
    let ids = sim.world.cluster().job_ids();
    eprintln!(
        "(f) restart: committed {}, id recorded at {}, log ids {ids:?}",
        s(committed_at),
        s(at)
    );
    assert_eq!(ids.len(), 1, "a duplicate job: {ids:?}");
    assert_eq!(jobs_carrying(&sim, &uid_of(&sim, "restart")), ids);
    assert_eq!(spurjob_id(&sim, "restart"), Some(ids[0]));
}

/// The same gap through the API server (sim.md's "status patch conflict"): the status patch after a successful SubmitJob
/// fails with 409 Conflict (twice), and the retries must adopt the submitted job.
#[test]
fn a_failed_status_patch_after_submit_does_not_duplicate() {
    let mut sim = Sim::new(7009);
    sim.add_nodes(1);
    sim.start_operator("operator", &[]);
    let up = run_until_true(&mut sim, secs(60), |sim| sim.registered_nodes().len() == 1);
    assert!(up.is_some(), "the node never registered");
    sim.api.faults().conflict_next_status_writes(2);
    sim.create_spurjob("default", "conflict", short_job());
    let created_at = sim.world.elapsed();
    let at = run_until_true(&mut sim, created_at + secs(60), |sim| {
        spurjob_id(sim, "conflict").is_some()
    })
    .expect("the id is recorded");
    let ids = sim.world.cluster().job_ids();
    eprintln!(
        "(f) status conflict: created {}, id recorded at {}, log ids {ids:?}",
        s(created_at),
        s(at)
    );
    assert_eq!(ids.len(), 1, "a duplicate job: {ids:?}");
    assert_eq!(jobs_carrying(&sim, &uid_of(&sim, "conflict")), ids);
    let submitted = sim.spurjob("default", "conflict").unwrap()["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Submitted")
        .cloned()
        .unwrap();
    assert_eq!(submitted["reason"], "Adopted", "{submitted:#}");
}

/// A fixed seed is a regression test only if it replays: the same seed and profile give
/// the same trace, byte for byte.
#[test]
fn a_scenario_replays_from_its_seed() {
    let first = silent_leader_kill(Profile::Default);
    let again = silent_leader_kill(Profile::Default);
    assert_eq!(first.trace_hash, again.trace_hash);
    assert_eq!(first.submitted_at, again.submitted_at);
    let other = election_after_kill(Profile::Default);
    assert_ne!(first.trace_hash, other.trace_hash);
}

// ---------------------------------------------------------------------------------------
// Issue 8: a replica avoided while cut off, then elected.
// ---------------------------------------------------------------------------------------

struct ElectedWhileAvoided {
    /// The leader cut off from its peers while a write through it hung.
    cut: String,
    /// Who led after the second election, and when it was elected.
    new_leader: Option<String>,
    elected_at: Option<Duration>,
    submitted_at: Option<Duration>,
}

/// The leader is cut off from its peers while the operator's channel leads to it and a
/// SpurJob is created: the write hangs, the operator avoids that replica, and the others
/// elect a leader. 12 s later the cut heals and the new leader's process dies; the
/// replicas left elect again while the third one, still forwarding to the dead leader,
/// refuses writes as UNAVAILABLE "tcp connect error" and answers Pings from its own state
/// (wire.md). A second SpurJob is created right after the death.
fn elected_while_avoided(seed: u64, flags: &[&str]) -> ElectedWhileAvoided {
    let mut sim = Sim::new(seed);
    sim.add_nodes(1);
    sim.world.run_until(secs(10)).unwrap();
    sim.start_operator("operator", flags);
    let up = run_until_true(&mut sim, secs(60), |sim| sim.registered_nodes().len() == 1);
    assert!(up.is_some(), "the node never registered");
    sim.world.run_until(secs(40)).unwrap();
    let cut = sim.world.leader().expect("a leader");
    let replicas = sim.world.cluster().config().replicas;
    let others: Vec<String> = (0..replicas)
        .map(|slot| sim.world.cluster().host_of(slot))
        .filter(|host| *host != cut)
        .collect();
    for other in &others {
        sim.world.partition(&cut, other);
    }
    let cut_at = sim.world.elapsed();
    sim.create_spurjob("default", "during-cut", short_job());
    sim.world.run_until(cut_at + secs(12)).unwrap();
    for other in &others {
        sim.world.repair(&cut, other);
    }
    let second = sim.world.leader();
    if let Some(second) = &second {
        sim.world.kill(second, KillMode::Graceful);
    }
    let killed_at = sim.world.elapsed();
    sim.create_spurjob("default", "after-kill", short_job());
    let submitted_at = run_until_true(&mut sim, killed_at + secs(60), |sim| {
        spurjob_id(sim, "after-kill").is_some()
    });
    let elected_at = leader_elected_after(&sim, killed_at);
    let new_leader = sim.world.leader();
    eprintln!(
        "seed {seed}: cut {cut} at {}, second leader {second:?}, killed {}, elected {:?} at {:?}, submitted {:?}",
        s(cut_at),
        s(killed_at),
        new_leader,
        elected_at.map(s),
        submitted_at.map(s)
    );
    ElectedWhileAvoided {
        cut,
        new_leader,
        elected_at,
        submitted_at,
    }
}

/// Seeds where the replica cut off is the one elected after the second leader's death:
/// found by trying seeds 7040 to 7069. 7054's follower answers "not the Raft leader"
/// naming the dead leader, 7068's hangs once the cut replica leads. The policy of issue 18
/// avoids a replica only within the patience round that replaces a channel to it, so
/// nothing keeps the elected replica avoided: 7054 submitted 0.4 s after its election,
/// 7068 0.5 s. (With the write the cut held delivered at the heal, `world::Cut`, neither
/// needs the abandon rule any more: without it, 7054 took 0.8 s, and no seed of 7000 to
/// 7069 took over 1.2 s; it took 6.1 s when cuts dropped what they held. The rule's case
/// is now [`abandoning_calls_left_on_a_replaced_channel_serves_the_next_leader`].)
const SEEDS_ELECTED_WHILE_AVOIDED: [u64; 2] = [7054, 7068];

/// Issue 8: a replica that was cut off and is then elected serves the operator within
/// 3 s of its election.
#[test]
fn a_replica_avoided_while_cut_off_is_used_once_elected() {
    for seed in SEEDS_ELECTED_WHILE_AVOIDED {
        let run = elected_while_avoided(seed, &[]);
        assert_eq!(
            run.new_leader.as_deref(),
            Some(run.cut.as_str()),
            "seed {seed}: precondition: the replica cut off is elected"
        );
        let elected_at = run.elected_at.expect("an election after the death");
        let at = run
            .submitted_at
            .unwrap_or_else(|| panic!("seed {seed}: never submitted"));
        let lag = at.saturating_sub(elected_at);
        assert!(
            lag <= secs(3),
            "seed {seed}: id {} after the election",
            s(lag)
        );
    }
}

/// Seed `seed` of the generated mix under the default profile, the operator given `flags`,
/// behind the ClusterIP Service that drops a SYN with no endpoint: what the lags below were
/// measured behind, before each seed drew its Service.
fn run_with_flags(seed: u64, flags: &[&str]) -> spur_sim::scenario::Outcome {
    let config = ScenarioConfig {
        operator_flags: flags.iter().map(|f| (*f).to_owned()).collect(),
        ..ScenarioConfig::default().with_intensity(spur_sim::scenario::Intensity {
            service: Some(spur_sim::net::ServiceSetup::cluster_ip(
                spur_sim::net::NoEndpoint::Drop,
            )),
            ..Default::default()
        })
    };
    spur_sim::scenario::run(seed, Profile::Default, &config)
}

/// Seed 7163 of the generated mix (two replica partitions, at 50 s and 103 s): the
/// SpurJobs created around each election wait on a channel whose replica forwards into
/// the cut. Measured (`spur-sim run --seeds 7163..7164 --json`, after-election lags):
/// 0.75 to 1.5 s; with `--controller-rules-off abandon` 4.5 to 5.5 s, over sim.md's 3 s.
/// Found by sweeping 7000..7300 with the rule off (p99 after an election 5.5 s).
#[test]
fn abandoning_calls_left_on_a_replaced_channel_serves_the_next_leader() {
    let run = |flags: &[&str]| run_with_flags(7163, flags);
    let shipped = run(&[]);
    assert!(shipped.passed(), "{:?}", shipped.violations);
    let worst = shipped.failover_submission_lags.iter().max().copied();
    assert!(
        worst.is_some_and(|ms| ms <= 3_000),
        "after an election: {:?} ms",
        shipped.failover_submission_lags
    );
    let off = run(&["--controller-rules-off", "abandon"]);
    let worst = off.failover_submission_lags.iter().max().copied();
    assert!(
        worst.is_some_and(|ms| ms > 3_000),
        "abandon off: after an election {:?} ms; expected one over 3 s",
        off.failover_submission_lags
    );
}

/// Rule 1 of `controller::policy` (a failed call drops its channel), on seed 278 of the
/// generated mix (status conflicts at 73.7 s, a replica cut off from its peers at 98.1 s).
/// Which failed call kept its channel there was not traced; the lag is what pins the rule.
/// Measured (`spur-sim run --seeds 278..279 --json`, submission lags): at most 1.5 s; with
/// `--controller-rules-off drop-on-failure` one SpurJob waited 18.25 s for its id. Found by sweeping 0..300 with the rule off (seeds
/// 33, 64 and 278 over 10 s; none as shipped).
#[test]
fn dropping_a_channel_whose_call_failed_keeps_seed_278s_submissions_within_seconds() {
    let run = |flags: &[&str]| run_with_flags(278, flags);
    let shipped = run(&[]);
    assert!(shipped.passed(), "{:?}", shipped.violations);
    let worst = shipped.submission_lags.iter().max().copied();
    assert!(
        worst.is_some_and(|ms| ms <= 3_000),
        "submission lags: {:?} ms",
        shipped.submission_lags
    );
    let off = run(&["--controller-rules-off", "drop-on-failure"]);
    let worst = off.submission_lags.iter().max().copied();
    assert!(
        worst.is_some_and(|ms| ms > 10_000),
        "drop-on-failure off: submission lags {:?} ms; expected one over 10 s",
        off.submission_lags
    );
}

/// Seeds behind a headless Service (upstream's manifests) where the operator is cut off
/// from the leader while a follower is cut off from its peers: the name resolves to the
/// three pods in one order, each round of dials took them in turn from the same point, and
/// the follower, answering the probe first from its own copy, was shared round after round
/// while it refused every write. Found by sweeping the seeds of 0..100000 whose plans
/// overlap the two partitions, with `--service headless` (four of 325 failed; submission
/// 20.2 s late and more). Rule 1 of `controller::policy` now passes over the replica that
/// failed a call.
const HEADLESS_CUT_FOLLOWER: [u64; 4] = [19821, 25164, 60224, 67495];

fn headless(flags: &[&str]) -> ScenarioConfig {
    ScenarioConfig {
        operator_flags: flags.iter().map(|f| (*f).to_owned()).collect(),
        ..ScenarioConfig::default().with_intensity(spur_sim::scenario::Intensity {
            service: Some(spur_sim::net::ServiceSetup::HEADLESS),
            ..Default::default()
        })
    }
}

#[test]
fn behind_a_headless_service_a_follower_that_refuses_writes_is_passed_over() {
    let outcomes = spur_sim::cli::run_seeds_with(
        &HEADLESS_CUT_FOLLOWER,
        Profile::Default,
        &headless(&[]),
        2,
        |_| {},
    );
    for outcome in &outcomes {
        assert!(
            outcome
                .faults
                .iter()
                .any(|f| f.starts_with("partition-replica@"))
                && outcome
                    .faults
                    .iter()
                    .any(|f| f.starts_with("partition-operator-replica@")),
            "seed {}: precondition: both partitions struck: {:?}",
            outcome.seed,
            outcome.faults
        );
        assert!(
            outcome.passed(),
            "seed {}: {:?}\n    replay: {}",
            outcome.seed,
            outcome.violations,
            outcome.replay_command()
        );
    }
    // With the rule off the same seed waits past the deadline again.
    let off = spur_sim::scenario::run(
        HEADLESS_CUT_FOLLOWER[0],
        Profile::Default,
        &headless(&["--controller-rules-off", "avoid"]),
    );
    assert!(
        off.violations.iter().any(|v| v.check == "submission"),
        "avoid off: {:?}",
        off.violations
    );
}
