//! `spur-sim run | replay | compare | bench`: the scenario runner's command line.

use std::io::Write;
use std::ops::Range;
use std::str::FromStr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use clap::Args;

use crate::profiles::Profile;
use crate::scenario::{LagStats, Outcome, ScenarioConfig, run_isolated};

/// A seed range `A..B` (B excluded), or one seed.
#[derive(Clone, Debug)]
pub struct Seeds(pub Range<u64>);

impl FromStr for Seeds {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || format!("`{s}` is not a seed range such as 0..300 or a single seed");
        match s.split_once("..") {
            Some((a, b)) => {
                let (a, b) = (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
                if a >= b {
                    return Err(format!("`{s}` is empty"));
                }
                Ok(Seeds(a..b))
            }
            None => {
                let seed: u64 = s.parse().map_err(|_| bad())?;
                Ok(Seeds(seed..seed + 1))
            }
        }
    }
}

/// `i/n`: this process runs every seed whose index is `i` modulo `n`.
#[derive(Clone, Copy, Debug)]
pub struct Shard {
    pub index: u64,
    pub count: u64,
}

impl FromStr for Shard {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || format!("`{s}` is not a shard such as 0/8");
        let (i, n) = s.split_once('/').ok_or_else(bad)?;
        let (index, count): (u64, u64) =
            (i.parse().map_err(|_| bad())?, n.parse().map_err(|_| bad())?);
        if count == 0 || index >= count {
            return Err(format!("`{s}`: the index must be below the count"));
        }
        Ok(Shard { index, count })
    }
}

#[derive(Args, Debug)]
pub struct RunArgs {
    /// Seeds to run, `A..B` (B excluded).
    #[arg(long, default_value = "0..100")]
    pub seeds: Seeds,
    #[arg(long, default_value = "default")]
    pub profile: Profile,
    /// One JSON object per scenario on stdout, then a JSON summary.
    #[arg(long)]
    pub json: bool,
    /// Run only this shard of the seeds (`i/n`), for sweeps across machines.
    #[arg(long)]
    pub shard: Option<Shard>,
    /// Scenarios run at once (one thread each).
    #[arg(long, default_value_t = 2)]
    pub jobs: usize,
}

#[derive(Args, Debug)]
pub struct ReplayArgs {
    #[arg(long)]
    pub seed: u64,
    #[arg(long, default_value = "default")]
    pub profile: Profile,
    /// Print the whole trace.
    #[arg(long)]
    pub trace: bool,
}

#[derive(Args, Debug)]
pub struct CompareArgs {
    #[arg(long, default_value = "0..100")]
    pub seeds: Seeds,
    /// Profiles side by side (repeat the flag); all three when none is given.
    #[arg(long = "profile")]
    pub profiles: Vec<Profile>,
    #[arg(long, default_value_t = 2)]
    pub jobs: usize,
}

/// Runs `seeds` under `profile` on `jobs` threads; outcomes in seed order.
pub fn run_seeds(
    seeds: &[u64],
    profile: Profile,
    jobs: usize,
    mut progress: impl FnMut(&Outcome) + Send,
) -> Vec<Outcome> {
    let config = ScenarioConfig::default();
    let next = AtomicU64::new(0);
    let results = Mutex::new(Vec::with_capacity(seeds.len()));
    let progress = Mutex::new(&mut progress);
    std::thread::scope(|scope| {
        for _ in 0..jobs.max(1) {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                    let Some(&seed) = seeds.get(i) else { break };
                    let outcome = run_isolated(seed, profile, &config);
                    (progress.lock().expect("progress lock"))(&outcome);
                    results.lock().expect("results lock").push(outcome);
                }
            });
        }
    });
    let mut results = results.into_inner().expect("results lock");
    results.sort_by_key(|o| o.seed);
    results
}

fn seeds_of(seeds: &Seeds, shard: Option<Shard>) -> Vec<u64> {
    seeds
        .0
        .clone()
        .enumerate()
        .filter(|(i, _)| shard.is_none_or(|s| *i as u64 % s.count == s.index))
        .map(|(_, seed)| seed)
        .collect()
}

fn all(outcomes: &[Outcome], lags: impl Fn(&Outcome) -> &[u64]) -> LagStats {
    let values: Vec<u64> = outcomes
        .iter()
        .flat_map(|o| lags(o).iter().copied())
        .collect();
    LagStats::of(&values)
}

pub fn summary_json(outcomes: &[Outcome], profile: Profile, wall_ms: u128) -> serde_json::Value {
    let failed: Vec<serde_json::Value> = outcomes
        .iter()
        .filter(|o| !o.passed())
        .map(|o| serde_json::json!({"seed": o.seed, "replay": o.replay_command()}))
        .collect();
    let lag = |s: LagStats| serde_json::json!({"count": s.count, "p50": s.p50, "p99": s.p99, "max": s.max});
    serde_json::json!({
        "summary": {
            "profile": profile.name(),
            "scenarios": outcomes.len(),
            "passed": outcomes.iter().filter(|o| o.passed()).count(),
            "failed": failed,
            "registration_lag_ms": lag(all(outcomes, |o| &o.registration_lags)),
            "submission_lag_ms": lag(all(outcomes, |o| &o.submission_lags)),
            "status_lag_ms": lag(all(outcomes, |o| &o.status_lags)),
            "duplicates": outcomes.iter().map(|o| o.duplicates).sum::<usize>(),
            "rpcs_per_sim_minute": rpcs_per_minute(outcomes),
            "wall_ms": wall_ms,
        }
    })
}

fn rpcs_per_minute(outcomes: &[Outcome]) -> f64 {
    let rpcs: usize = outcomes.iter().map(|o| o.rpcs).sum();
    let minutes: f64 = outcomes.iter().map(|o| o.sim_secs).sum::<f64>() / 60.0;
    if minutes > 0.0 {
        (rpcs as f64 / minutes * 10.0).round() / 10.0
    } else {
        0.0
    }
}

pub fn run(args: RunArgs) -> anyhow::Result<bool> {
    let seeds = seeds_of(&args.seeds, args.shard);
    let started = Instant::now();
    let total = seeds.len();
    let mut done = 0usize;
    let json = args.json;
    let outcomes = run_seeds(&seeds, args.profile, args.jobs, |o| {
        done += 1;
        if json {
            println!("{}", o.to_json());
        } else {
            eprint!("\r{done}/{total} scenarios");
            let _ = std::io::stderr().flush();
        }
    });
    let wall_ms = started.elapsed().as_millis();
    if json {
        println!("{}", summary_json(&outcomes, args.profile, wall_ms));
    } else {
        eprintln!();
        print_table(&[(args.profile, &outcomes)]);
        for o in outcomes.iter().filter(|o| !o.passed()) {
            println!("seed {} failed:", o.seed);
            for v in &o.violations {
                println!("  {v}");
            }
            println!("  replay: {}", o.replay_command());
        }
    }
    Ok(outcomes.iter().all(Outcome::passed))
}

pub fn replay(args: ReplayArgs) -> anyhow::Result<bool> {
    if args.trace {
        // SAFETY: set before any thread that reads the environment is started.
        unsafe { std::env::set_var("SPUR_SIM_TRACE", "1") };
    }
    let outcome = run_isolated(args.seed, args.profile, &ScenarioConfig::default());
    println!("{}", serde_json::to_string_pretty(&outcome.to_json())?);
    Ok(outcome.passed())
}

pub fn compare(args: CompareArgs) -> anyhow::Result<bool> {
    let profiles = if args.profiles.is_empty() {
        Profile::ALL.to_vec()
    } else {
        args.profiles
    };
    let seeds = seeds_of(&args.seeds, None);
    let mut results = Vec::new();
    for profile in profiles {
        let total = seeds.len();
        let mut done = 0;
        let outcomes = run_seeds(&seeds, profile, args.jobs, |_| {
            done += 1;
            eprint!("\r{profile}: {done}/{total}");
            let _ = std::io::stderr().flush();
        });
        eprintln!();
        results.push((profile, outcomes));
    }
    let table: Vec<(Profile, &Vec<Outcome>)> = results.iter().map(|(p, o)| (*p, o)).collect();
    print_table(&table);
    Ok(true)
}

fn print_table(rows: &[(Profile, &Vec<Outcome>)]) {
    println!(
        "{:<10} {:>9} {:>22} {:>22} {:>22} {:>5} {:>10}",
        "profile",
        "passed",
        "registration p50/p99/max",
        "submission p50/p99/max",
        "status p50/p99/max",
        "dups",
        "rpcs/min"
    );
    for (profile, outcomes) in rows {
        let fmt = |s: LagStats| {
            format!(
                "{:.1}/{:.1}/{:.1}s",
                s.p50 as f64 / 1000.0,
                s.p99 as f64 / 1000.0,
                s.max as f64 / 1000.0
            )
        };
        let passed = outcomes.iter().filter(|o| o.passed()).count();
        println!(
            "{:<10} {:>9} {:>22} {:>22} {:>22} {:>5} {:>10.1}",
            profile.name(),
            format!("{passed}/{}", outcomes.len()),
            fmt(all(outcomes, |o| &o.registration_lags)),
            fmt(all(outcomes, |o| &o.submission_lags)),
            fmt(all(outcomes, |o| &o.status_lags)),
            outcomes.iter().map(|o| o.duplicates).sum::<usize>(),
            rpcs_per_minute(outcomes),
        );
    }
}

/// Scenarios per second and simulated seconds per wall second, on one thread.
pub fn bench(seeds: u64) -> anyhow::Result<bool> {
    let started = Instant::now();
    let list: Vec<u64> = (0..seeds).collect();
    let outcomes = run_seeds(&list, Profile::Default, 1, |_| {});
    let wall = started.elapsed().as_secs_f64();
    let sim: f64 = outcomes.iter().map(|o| o.sim_secs).sum();
    println!(
        "{} scenarios in {:.1}s on one thread: {:.2} scenarios/s, {:.0}x real time ({:.0} simulated s each)",
        outcomes.len(),
        wall,
        outcomes.len() as f64 / wall,
        sim / wall,
        sim / outcomes.len().max(1) as f64
    );
    Ok(true)
}

/// How long the operator takes to register `nodes` nodes once the controller is ready, at
/// a round trip of `rtt_ms` between every pair of hosts (simulated time; the wall time is
/// the simulation's own cost).
pub fn bench_nodes(nodes: usize, rtt_ms: u64) -> anyhow::Result<bool> {
    use std::time::Duration;

    use crate::harness::Sim;
    use crate::world::WorldConfig;

    let one_way = Duration::from_micros(rtt_ms * 500);
    let config = WorldConfig {
        min_latency: one_way,
        max_latency: one_way,
        max_duration: Duration::from_secs(900),
        ..WorldConfig::default()
    };
    let started = Instant::now();
    // The operator is up (and has listed every node) before the controller: the bench
    // measures registration itself, not the first list.
    let mut sim = Sim::with_controllers_at(1, config, Duration::from_secs(5));
    sim.add_nodes(nodes);
    sim.start_operator("operator", &["--heartbeat-interval", "10m"]);
    let step = Duration::from_millis(10);
    let mut now = Duration::ZERO;
    let mut ready_at = None;
    let done_at = loop {
        now += step;
        sim.world
            .run_until(now)
            .map_err(|e| anyhow::anyhow!("the simulation failed: {e}"))?;
        let cluster = sim.world.cluster();
        let ready = cluster.leader_with_quorum().is_some()
            && !sim
                .world
                .net()
                .ready_endpoints(crate::world::CONTROLLER_SERVICE, now)
                .is_empty();
        if ready && ready_at.is_none() {
            ready_at = Some(now);
        }
        if ready_at.is_some() && sim.registered_nodes().len() >= nodes {
            break now;
        }
        if now > Duration::from_secs(600) {
            anyhow::bail!(
                "only {} of {nodes} nodes registered after 600 s",
                sim.registered_nodes().len()
            );
        }
    };
    let ready_at = ready_at.expect("ready before done");
    println!(
        "{nodes} nodes registered {:.2} s after the controller was ready ({rtt_ms} ms round trip, simulated); {:.1} s of wall time",
        (done_at - ready_at).as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    Ok(true)
}
