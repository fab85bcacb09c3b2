//! Thousands of seeded fault scenarios under the `default` profile: every check of sim.md
//! must hold on every seed. `SIM_SEEDS=a..b` chooses the seeds (default `0..2000`); a
//! failure lists each failing seed, its violated checks and the command that replays it.

use std::time::Duration;

use spur_judge::profiles::Profile;
use spur_sim::cli::{Seeds, run_seeds, run_seeds_with};
use spur_sim::scenario::{ScenarioConfig, plan, run_isolated};

fn seeds() -> Vec<u64> {
    let range = std::env::var("SIM_SEEDS").unwrap_or_else(|_| "0..2000".to_owned());
    let seeds: Seeds = range.parse().expect("SIM_SEEDS is a range such as 0..2000");
    seeds.0.collect()
}

fn threads() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

#[test]
fn every_seed_meets_every_check_with_the_default_profile() {
    let seeds = seeds();
    let outcomes = run_seeds(&seeds, Profile::Default, threads(), |_| {});
    let failed: Vec<String> = outcomes
        .iter()
        .filter(|o| !o.passed())
        .map(|o| {
            let violations: Vec<String> = o.violations.iter().map(|v| format!("    {v}")).collect();
            format!(
                "seed {} (faults {:?}):\n{}\n    replay: {}",
                o.seed,
                o.faults,
                violations.join("\n"),
                o.replay_command()
            )
        })
        .collect();
    assert_eq!(outcomes.len(), seeds.len());
    assert!(
        failed.is_empty(),
        "{} of {} seeds failed:\n{}",
        failed.len(),
        seeds.len(),
        failed.join("\n")
    );
    // The scenarios did something, and the checks judged it: every one registered nodes,
    // submitted jobs, mirrored the end of some, and made leader-only writes and controller
    // write calls the acting check weighed against the Lease.
    let idle: Vec<String> = outcomes
        .iter()
        .filter(|o| {
            o.registration_lags.is_empty()
                || o.submission_lags.is_empty()
                || o.status_lags.is_empty()
                || o.acting_writes.values().sum::<usize>() == 0
                || o.acting_calls.values().sum::<usize>() == 0
        })
        .map(|o| {
            format!(
                "seed {}: {} registrations, {} submissions, {} statuses, acting writes {:?}, acting calls {:?}",
                o.seed,
                o.registration_lags.len(),
                o.submission_lags.len(),
                o.status_lags.len(),
                o.acting_writes,
                o.acting_calls
            )
        })
        .collect();
    assert!(
        idle.is_empty(),
        "seeds that judged nothing:\n{}",
        idle.join("\n")
    );
}

#[test]
fn every_fiftieth_seed_replays_to_the_same_trace() {
    let config = ScenarioConfig::default();
    let seeds: Vec<u64> = seeds().into_iter().step_by(50).collect();
    let first = run_seeds(&seeds, Profile::Default, threads(), |_| {});
    for (seed, earlier) in seeds.iter().zip(&first) {
        let again = run_isolated(*seed, Profile::Default, &config);
        assert_eq!(
            earlier.trace_hash, again.trace_hash,
            "seed {seed} gave two different traces: replay with `spur-sim replay --seed {seed} --trace`"
        );
    }
}

/// The first `count` seeds of a sweep that run two operator replicas.
fn two_replica_seeds(count: usize) -> Vec<u64> {
    let config = ScenarioConfig::default();
    (0..)
        .filter(|seed| plan(*seed, &config).operators.len() == 2)
        .take(count)
        .collect()
}

#[test]
fn two_replicas_hand_over_by_the_lease_through_a_leader_change() {
    let seeds = two_replica_seeds(6);
    let outcomes = run_seeds(&seeds, Profile::Default, threads(), |_| {});
    let mut both_acted = 0;
    for o in &outcomes {
        assert!(
            o.passed(),
            "seed {}: {:?}\n    replay: {}",
            o.seed,
            o.violations,
            o.replay_command()
        );
        assert!(
            o.faults
                .iter()
                .any(|f| f.starts_with("operator-leader-change@")),
            "seed {}: {:?}",
            o.seed,
            o.faults
        );
        both_acted += usize::from(o.acting_writes.values().filter(|n| **n > 0).count() == 2);
    }
    // The leader change hands the work over: both replicas wrote as leader, one after the
    // other (a change after the workload ended may leave the new leader nothing to write).
    assert!(both_acted >= 4, "{both_acted} of {} seeds", seeds.len());
}

/// The checks can fail on two-replica scenarios: a second replica on a Lease of its own
/// acts beside the first, and one that takes the lease but cannot reach the controller
/// (a wrong address) holds the lease and does nothing.
#[test]
fn a_broken_second_replica_fails_the_checks() {
    // A leader change while SpurJobs are still being created, so a replica that takes
    // over and does nothing leaves some waiting.
    let config = ScenarioConfig::default();
    let seed = two_replica_seeds(20)
        .into_iter()
        .find(|seed| {
            plan(*seed, &config).faults.iter().any(|f| {
                f.fault.name() == "operator-leader-change" && f.at < Duration::from_secs(100)
            })
        })
        .expect("an early leader change");
    let run_with = |flags: &[&str]| {
        let config = ScenarioConfig {
            operator_b_flags: flags.iter().map(|f| (*f).to_owned()).collect(),
            ..ScenarioConfig::default()
        };
        let outcome = run_isolated(seed, Profile::Default, &config);
        outcome
            .violations
            .iter()
            .map(|v| v.check)
            .collect::<Vec<_>>()
    };
    let checks = run_with(&["--lease-name", "spur-operator-b"]);
    assert!(checks.contains(&"acting-without-lease"), "{checks:?}");
    let checks = run_with(&["--controller-addr", "http://nowhere:6817"]);
    assert!(
        checks.contains(&"submission") || checks.contains(&"registration"),
        "{checks:?}"
    );
}

/// A fault aimed at the controller leader that strikes before any leader exists does
/// nothing, so it is not reported as one of the scenario's faults (it used to be listed,
/// making a sweep look harsher than it was).
#[test]
fn a_leader_kill_with_no_leader_is_not_counted_as_a_fault() {
    use spur_judge::plan::PlannedFault;
    let config = ScenarioConfig::default();
    let mut planned = plan(3, &config);
    planned.controllers_at = Duration::from_secs(30);
    planned.operators.truncate(1);
    planned.faults = vec![
        PlannedFault {
            at: Duration::from_secs(5),
            fault: spur_sim::scenario::Fault::LeaderKillSilent,
        },
        PlannedFault {
            at: Duration::from_secs(60),
            fault: spur_sim::scenario::Fault::WatchCut,
        },
    ];
    let outcome = spur_sim::scenario::run_plan(&planned, Profile::Default, &config);
    assert_eq!(outcome.faults, ["watch-cut@60.0s"], "{outcome:?}");
    assert!(outcome.passed(), "{:?}", outcome.violations);
}

/// Seeds outside 0..2000 that once failed (found by `spur-sim run --seeds ...` and the moving
/// window of `ci/test.sh`), each with what broke; they run with every `cargo test`.
const PINNED: &[(u64, &str)] = &[
    // Status 15.3 s late: after partition-replica the operator read from a replica
    // answering from its stale copy (a leader cut off from its peers, or a follower that
    // forgot its leader), picked by a rotation right after the job's end was reported
    // elsewhere; fixed by rule 6 of `controller::policy` (read-your-writes).
    (102027, "a follower that forgot its leader"),
    (105313, "a follower that forgot its leader"),
    (106392, "a leader cut off from its peers"),
    (106877, "a follower that forgot its leader"),
    // Status 15.75 s late: a replica cut off from its peers when the job was created
    // answered every poll for it with no jobs at all, which rule 6 did not judge until it
    // also weighed the ids a read asked for.
    (107160, "a leader cut off from its peers, asked by id"),
    // operator-b not ready for 15 s: the follower it probed through forwarded nothing for
    // the 150 s after a replica partition healed, because the model dropped what a cut
    // held and turmoil's TCP never retransmits, so the forward connection hung for good. A
    // kernel retransmits: cuts now hold and deliver at the heal (`world::Cut`).
    (
        101513,
        "a forward connection that lost a frame in a partition",
    ),
];

/// The Service these seeds' cases were found behind (ClusterIP dropping a SYN with no
/// endpoint), before each seed drew its own.
fn found_behind() -> ScenarioConfig {
    ScenarioConfig::default().with_intensity(spur_sim::scenario::Intensity {
        service: Some(spur_sim::net::ServiceSetup::cluster_ip(
            spur_sim::net::NoEndpoint::Drop,
        )),
        ..Default::default()
    })
}

/// Seed 941 once cuts held instead of dropping: the leader's ReportJobStatus, sent across a
/// cut to spurctld-0 before a leader change, landed when the cut healed 22 s into
/// operator-b's term. It is judged by when it may have been sent, and counted.
#[test]
#[ignore = "the world changed since these seeds were found (RBAC objects at start, the ConfigMap check, the pass-over rule): they no longer produce the case, which the checks still judge on every seed; new seeds are to be found by a sweep"]
fn a_call_a_cut_held_lands_after_the_lease_moved_and_is_judged_by_its_sending() {
    let outcomes = run_seeds_with(&[941], Profile::Default, &found_behind(), 1, |_| {});
    let outcome = &outcomes[0];
    assert!(outcome.passed(), "{:?}", outcome.violations);
    assert!(
        outcome
            .landed_after_cut
            .get("operator")
            .copied()
            .unwrap_or(0)
            > 0,
        "{:?}",
        outcome.landed_after_cut
    );
}

/// Seeds 106265 and 109870, once cuts held what crossed them: a SubmitJob forwarded across
/// a replica partition, given up on by the operator, landed at the heal as a second job of
/// its SpurJob (spurctld does not deduplicate). The operator stops it before it runs
/// (`jobs::duplicates`: in 106265 the agent refused job 20's launch, naming job 17, and
/// cancelled it), so the check counts it as stopped, not as a duplicate that ran.
#[test]
#[ignore = "the world changed since these seeds were found (RBAC objects at start, the ConfigMap check, the pass-over rule): they no longer produce the case, which the checks still judge on every seed; new seeds are to be found by a sweep"]
fn a_second_job_a_heal_delivers_is_stopped_before_it_runs() {
    let outcomes = run_seeds_with(
        &[106265, 109870],
        Profile::Default,
        &found_behind(),
        2,
        |_| {},
    );
    for outcome in &outcomes {
        assert!(
            outcome.passed(),
            "seed {}: {:?}",
            outcome.seed,
            outcome.violations
        );
        assert!(
            outcome.duplicates_stopped > 0,
            "seed {}: no second job landed: the case no longer happens",
            outcome.seed
        );
    }
}

#[test]
fn the_pinned_regressions_pass() {
    let seeds: Vec<u64> = PINNED.iter().map(|(seed, _)| *seed).collect();
    let outcomes = run_seeds(&seeds, Profile::Default, threads(), |_| {});
    assert_eq!(outcomes.len(), PINNED.len());
    let failed: Vec<String> = outcomes
        .iter()
        .filter(|o| !o.passed())
        .map(|o| {
            let why = PINNED
                .iter()
                .find(|(seed, _)| *seed == o.seed)
                .map_or("", |p| p.1);
            format!(
                "seed {} (once: {why}): {:?}\n    replay: {}",
                o.seed,
                o.violations,
                o.replay_command()
            )
        })
        .collect();
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}
