//! Thousands of seeded fault scenarios under the `default` profile: every check of sim.md
//! must hold on every seed. `SIM_SEEDS=a..b` chooses the seeds (default `0..2000`); a
//! failure lists each failing seed, its violated checks and the command that replays it.

use spur_sim::cli::{Seeds, run_seeds};
use spur_sim::profiles::Profile;
use spur_sim::scenario::{ScenarioConfig, run_isolated};

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
    // The scenarios did something: every one registered nodes and submitted jobs.
    assert!(
        outcomes
            .iter()
            .all(|o| !o.registration_lags.is_empty() && !o.submission_lags.is_empty())
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
