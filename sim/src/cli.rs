//! `spur-sim run | replay | compare | merge | bench`: the scenario runner's command line.

use std::collections::BTreeMap;
use std::io::Read;
use std::ops::Range;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::scenario::{Outcome, ScenarioConfig, run_isolated};
use spur_judge::profiles::Profile;
use spur_judge::report::{Merged, ScenarioRecord, Summary, Table};

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
    #[command(flatten)]
    pub intensity: IntensityArgs,
}

/// How hard each scenario is pressed, and at what step; the defaults are what the deadlines
/// are judged at.
#[derive(Args, Debug, Clone, Copy)]
pub struct IntensityArgs {
    /// Draw up to 3 × N faults per scenario instead of 3 (they overlap more as N grows;
    /// above 1 they also strike in the quiet period after the workload window).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub fault_density: u32,
    /// The workload window faults and SpurJobs spread over (20 SpurJobs per 180 s).
    #[arg(long, default_value = "180s", value_parser = parse_window)]
    pub duration: std::time::Duration,
    /// The simulation's step (turmoil's tick): every timer fires on a multiple of it, so
    /// another step is another run of the same seed. 20 ms resolves every bound the
    /// operator uses (the shortest is 250 ms).
    #[arg(long, default_value = "20ms", value_parser = parse_tick)]
    pub tick: std::time::Duration,
    /// Force the `spurctld` Service's kind on every seed: `clusterip` (a virtual address
    /// routed to a ready replica at random, as on the seed's cluster) or `headless` (its
    /// name resolves to the ready replicas, as upstream deploys it). Without it (and
    /// without --no-endpoint) each seed draws its Service from the four setups users meet
    /// (headless, and ClusterIP with each --no-endpoint), as it draws its faults; a
    /// replay command names the one drawn.
    #[arg(long, value_parser = crate::net::ServiceKind::parse)]
    pub service: Option<crate::net::ServiceKind>,
    /// What a forced ClusterIP Service does with a SYN while no replica is ready: `drop`
    /// (sent where it is swallowed, every retransmit following it: the seed's cluster; the
    /// default with --service clusterip), `reject` (refused at once, kube-proxy's rule) or
    /// `drop-unconfirmed` (dropped before conntrack confirms it, so each retransmit is
    /// routed afresh). Alone it forces a ClusterIP Service; a headless one ignores it.
    #[arg(long, value_parser = crate::net::NoEndpoint::parse)]
    pub no_endpoint: Option<crate::net::NoEndpoint>,
}

fn parse_tick(text: &str) -> Result<std::time::Duration, String> {
    let tick = humantime::parse_duration(text).map_err(|e| format!("{text:?}: {e}"))?;
    if tick < std::time::Duration::from_millis(1) || tick > std::time::Duration::from_millis(100) {
        return Err(format!(
            "{text:?}: the tick must be between 1ms and 100ms (a longer step no longer resolves the operator's 250ms bounds)"
        ));
    }
    Ok(tick)
}

fn parse_window(text: &str) -> Result<std::time::Duration, String> {
    let window = humantime::parse_duration(text).map_err(|e| format!("{text:?}: {e}"))?;
    if window < std::time::Duration::from_secs(30)
        || window > std::time::Duration::from_secs(86_400)
    {
        return Err(format!("{text:?}: the window must be between 30s and 24h"));
    }
    Ok(window)
}

impl IntensityArgs {
    pub fn config(&self) -> ScenarioConfig {
        ScenarioConfig::default().with_intensity(crate::scenario::Intensity {
            fault_density: self.fault_density,
            duration: self.duration,
            tick: self.tick,
            service: self.service_setup(),
        })
    }

    /// The Service these flags force, if they force one.
    fn service_setup(&self) -> Option<crate::net::ServiceSetup> {
        use crate::net::{NoEndpoint, ServiceKind, ServiceSetup};
        match (self.service, self.no_endpoint) {
            (None, None) => None,
            (kind, no_endpoint) => Some(ServiceSetup::new(
                kind.unwrap_or(ServiceKind::ClusterIp),
                no_endpoint.unwrap_or(NoEndpoint::Drop),
            )),
        }
    }
}

#[derive(Args, Debug)]
pub struct ReplayArgs {
    #[arg(long)]
    pub seed: u64,
    #[arg(long, default_value = "default")]
    pub profile: Profile,
    #[command(flatten)]
    pub intensity: IntensityArgs,
    /// Print the whole trace.
    #[arg(long)]
    pub trace: bool,
    /// Also print the operator's own log lines at these levels (an `EnvFilter`, e.g.
    /// `spur_operator=debug`), interleaved with the trace. They carry no time of their own:
    /// the wall clock would mean nothing, and the trace lines around them give the sim's.
    #[arg(long)]
    pub log: Option<String>,
    /// Also draw the run as one self-contained HTML page in FILE: hosts as lanes, faults,
    /// every controller call coloured by how it ended, leader terms, each SpurJob's life
    /// and each deadline met (green) or missed (red).
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
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
    /// Also write the table into this file (README.md) between its compare-table markers;
    /// `sim/tests/sweeps/readme_figures.rs` fails when the README's table is not what this prints.
    #[arg(long)]
    pub readme: Option<PathBuf>,
    /// Also draw each lag's distribution per profile (cumulative, log time axis, the
    /// deadline as a line) as an SVG picture in this file.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
}

/// The markers around the README's compare table; the opening one names the command that
/// made the table, whose `--seeds` the test that holds it reads.
pub const COMPARE_BEGIN: &str = "<!-- compare-table:begin";
pub const COMPARE_END: &str = "<!-- compare-table:end -->";

/// `text` with the block between the compare-table markers replaced by `table` (fenced),
/// and the opening marker naming the command for `seeds`; `None` without the markers.
pub fn splice_compare_table(text: &str, seeds: &Range<u64>, table: &str) -> Option<String> {
    let begin = text.find(COMPARE_BEGIN)?;
    let end = text[begin..].find(COMPARE_END)? + begin;
    let marker = format!(
        "{COMPARE_BEGIN} (spur-sim compare --seeds {}..{} --readme README.md) -->",
        seeds.start, seeds.end
    );
    Some(format!(
        "{}{marker}\n```\n{table}```\n{}",
        &text[..begin],
        &text[end..]
    ))
}

/// The seeds the README's compare table was made with, from its opening marker.
pub fn compare_table_seeds(text: &str) -> Option<Range<u64>> {
    let begin = text.find(COMPARE_BEGIN)?;
    let line = text[begin..].lines().next()?;
    let seeds = line.split("--seeds ").nth(1)?.split_whitespace().next()?;
    Seeds::from_str(seeds).ok().map(|s| s.0)
}

/// The compare table of `seeds` under `profiles` (simulated figures only: the same seeds
/// give the same table in any process), with each profile's summary and records.
pub fn compare_runs(
    seeds: &[u64],
    profiles: &[Profile],
    jobs: usize,
) -> (String, Vec<Summary>, Vec<Vec<ScenarioRecord>>) {
    let records: Vec<Vec<ScenarioRecord>> = profiles
        .iter()
        .map(|profile| run_with_progress(seeds, *profile, &ScenarioConfig::default(), jobs, false))
        .collect();
    let summaries: Vec<Summary> = profiles
        .iter()
        .zip(&records)
        .map(|(profile, records)| Summary::of(profile.name(), records))
        .collect();
    (Table(&summaries).to_string(), summaries, records)
}

/// The picture of `compare --plot`: each lag's distribution under each profile.
pub fn compare_plot(
    seeds: &Range<u64>,
    profiles: &[Profile],
    records: &[Vec<ScenarioRecord>],
) -> String {
    let series: Vec<spur_judge::plot::Series<'_>> = profiles
        .iter()
        .zip(records)
        .map(|(profile, records)| spur_judge::plot::Series {
            name: profile.name(),
            samples: spur_judge::report::lag_samples(records),
        })
        .collect();
    let title = format!(
        "Lags by profile, seeds {}..{} (spur-sim compare --plot)",
        seeds.start, seeds.end
    );
    spur_judge::plot::cdf_svg(&title, &spur_judge::report::lag_panels(), &series)
}

/// Runs `seeds` under `profile` on `jobs` threads; outcomes in seed order.
pub fn run_seeds(
    seeds: &[u64],
    profile: Profile,
    jobs: usize,
    progress: impl FnMut(&Outcome) + Send,
) -> Vec<Outcome> {
    run_seeds_with(seeds, profile, &ScenarioConfig::default(), jobs, progress)
}

/// [`run_seeds`] with `config` instead of the default scenario config.
pub fn run_seeds_with(
    seeds: &[u64],
    profile: Profile,
    config: &ScenarioConfig,
    jobs: usize,
    mut progress: impl FnMut(&Outcome) + Send,
) -> Vec<Outcome> {
    let next = AtomicU64::new(0);
    let results = Mutex::new(Vec::with_capacity(seeds.len()));
    let progress = Mutex::new(&mut progress);
    std::thread::scope(|scope| {
        for _ in 0..jobs.max(1) {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                    let Some(&seed) = seeds.get(i) else { break };
                    let outcome = run_isolated(seed, profile, config);
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

/// A progress bar on stderr for a long run; hidden when stdout carries JSON lines or
/// stderr is not a terminal.
fn progress_bar(total: usize, label: &str, hidden: bool) -> ProgressBar {
    let bar = if hidden {
        ProgressBar::hidden()
    } else {
        ProgressBar::with_draw_target(Some(total as u64), ProgressDrawTarget::stderr())
    };
    bar.set_style(
        ProgressStyle::with_template(
            "{prefix:>9} {bar:40} {pos}/{len} scenarios, {msg} failed, {elapsed} (eta {eta})",
        )
        .expect("a valid template"),
    );
    bar.set_prefix(label.to_owned());
    bar.set_message("0");
    bar
}

/// Runs `seeds` under `profile` with a progress bar, printing each line with `json`.
fn run_with_progress(
    seeds: &[u64],
    profile: Profile,
    config: &ScenarioConfig,
    jobs: usize,
    json: bool,
) -> Vec<ScenarioRecord> {
    let bar = progress_bar(seeds.len(), profile.name(), json);
    let mut failed = 0usize;
    let outcomes = run_seeds_with(seeds, profile, config, jobs, |o| {
        if json {
            println!("{}", ScenarioRecord::from(o).to_line());
        }
        if !o.passed() {
            failed += 1;
            bar.set_message(failed.to_string());
        }
        bar.inc(1);
    });
    bar.finish_and_clear();
    outcomes.iter().map(ScenarioRecord::from).collect()
}

fn print_failures(records: &[ScenarioRecord]) {
    for r in records.iter().filter(|r| !r.passed) {
        println!("seed {} ({}) failed:", r.seed, r.profile);
        for v in &r.violations {
            println!("  {v}");
        }
        println!("  replay: {}", r.replay);
    }
}

pub fn run(args: RunArgs) -> anyhow::Result<bool> {
    let seeds = seeds_of(&args.seeds, args.shard);
    let started = Instant::now();
    let config = args.intensity.config();
    let records = run_with_progress(&seeds, args.profile, &config, args.jobs, args.json);
    let summary = Summary::of(args.profile.name(), &records);
    if args.json {
        println!("{}", summary.to_json(Some(started.elapsed().as_millis())));
    } else {
        print!("{}", Table(std::slice::from_ref(&summary)));
        print_failures(&records);
    }
    Ok(summary.failed.is_empty())
}

pub fn replay(args: ReplayArgs) -> anyhow::Result<bool> {
    if args.trace {
        // SAFETY: set before any thread that reads the environment is started.
        unsafe { std::env::set_var("SPUR_SIM_TRACE", "1") };
    }
    let log = match &args.log {
        Some(filter) => Some(
            tracing_subscriber::EnvFilter::try_new(filter)
                .map_err(|e| anyhow::anyhow!("--log {filter}: {e}"))?,
        ),
        None => None,
    };
    install_subscriber(log, args.html.is_some());
    let mut config = args.intensity.config();
    config.timeline = args.html.is_some();
    let outcome = run_isolated(args.seed, args.profile, &config);
    let record = ScenarioRecord::from(&outcome);
    println!("{}", serde_json::to_string_pretty(&record)?);
    if let (Some(path), Some(timeline)) = (&args.html, &outcome.timeline) {
        spur_judge::timeline::html::write_page(path, timeline)?;
    }
    Ok(record.passed)
}

/// The process's tracing: the operator's log lines on stderr under `log`, and the
/// timeline's catch of its calls with `timeline`.
pub fn install_subscriber(log: Option<tracing_subscriber::EnvFilter>, timeline: bool) {
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    if log.is_none() && !timeline {
        return;
    }
    let fmt = log.map(|filter| {
        tracing_subscriber::fmt::layer()
            .without_time()
            .with_writer(std::io::stderr)
            .with_filter(filter)
    });
    let calls = timeline.then(crate::timeline_calls::layer);
    tracing_subscriber::registry().with(fmt).with(calls).init();
}

pub fn compare(args: CompareArgs) -> anyhow::Result<bool> {
    if args.readme.is_some() && !args.profiles.is_empty() {
        anyhow::bail!("--readme writes the table of all three profiles: drop --profile");
    }
    let profiles = if args.profiles.is_empty() {
        Profile::ALL.to_vec()
    } else {
        args.profiles
    };
    let seeds = seeds_of(&args.seeds, None);
    let (table, summaries, records) = compare_runs(&seeds, &profiles, args.jobs);
    print!("{table}");
    if let Some(path) = &args.plot {
        let svg = compare_plot(&args.seeds.0, &profiles, &records);
        std::fs::write(path, svg)
            .map_err(|e| anyhow::anyhow!("writing the plot to {}: {e}", path.display()))?;
        eprintln!("plot: {}", path.display());
    }
    if let Some(path) = &args.readme {
        let text = std::fs::read_to_string(path)?;
        let written = splice_compare_table(&text, &args.seeds.0, &table).ok_or_else(|| {
            anyhow::anyhow!(
                "{}: no {COMPARE_BEGIN} ... {COMPARE_END} markers",
                path.display()
            )
        })?;
        std::fs::write(path, written)?;
    }
    // The older profiles are expected to fail (that is the comparison); `default` is the
    // operator as it ships, so a failure of it fails the command, each seed with its replay.
    let mut default_passed = true;
    for summary in summaries
        .iter()
        .filter(|s| s.profile == Profile::Default.name())
    {
        for (seed, replay) in &summary.failed {
            default_passed = false;
            println!("seed {seed} (default) failed; replay: {replay}");
        }
    }
    Ok(default_passed)
}

/// `spur-sim merge`: joins the JSON lines of shards into one summary a profile.
#[derive(Args, Debug)]
pub struct MergeArgs {
    /// Files holding the output of `spur-sim run --json` (one shard each); `-` for stdin.
    #[arg(required = true)]
    pub inputs: Vec<PathBuf>,
    /// The seed range the sweep covered: fail, naming them, when seeds have no result.
    #[arg(long)]
    pub seeds: Option<Seeds>,
    /// Print the summaries as JSON lines instead of the table.
    #[arg(long)]
    pub json: bool,
}

pub fn merge(args: MergeArgs) -> anyhow::Result<bool> {
    let mut merged = Merged::default();
    for input in &args.inputs {
        let (name, text) = if input.as_os_str() == "-" {
            let mut text = String::new();
            std::io::stdin().read_to_string(&mut text)?;
            ("stdin".to_owned(), text)
        } else {
            let text = std::fs::read_to_string(input)
                .map_err(|e| anyhow::anyhow!("reading {}: {e}", input.display()))?;
            (input.display().to_string(), text)
        };
        merged.add(&name, &text)?;
    }
    if let Some(seeds) = &args.seeds {
        merged.check_complete(seeds.0.clone())?;
    }
    let summaries = merged.summaries()?;
    if args.json {
        for s in &summaries {
            println!("{}", s.to_json(None));
        }
    } else {
        print!("{}", Table(&summaries));
        for s in &summaries {
            for (seed, replay) in &s.failed {
                println!("seed {seed} ({}) failed; replay: {replay}", s.profile);
            }
        }
    }
    Ok(summaries.iter().all(|s| s.failed.is_empty()))
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

/// What [`measure_nodes`] found.
#[derive(Debug)]
pub struct NodesLoad {
    /// From the controller being ready to the last node registered (simulated).
    pub registered_after: std::time::Duration,
    /// The replica that led when the last node registered.
    pub leader: String,
    /// Per replica: registrations it answered, and calls of any kind.
    pub per_replica: BTreeMap<String, (usize, usize)>,
}

/// How long the operator takes to register `nodes` nodes once the controller is ready, at
/// a round trip of `rtt_ms` between every pair of hosts (simulated time; the wall time is
/// the simulation's own cost), and which replicas it reached.
pub fn measure_nodes(nodes: usize, rtt_ms: u64) -> anyhow::Result<NodesLoad> {
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
    let mut per_replica: BTreeMap<String, (usize, usize)> = Default::default();
    let answered =
        spur_fakes::model::calls::answered(&sim.world.trace().events(), Duration::ZERO, done_at);
    for ((replica, method), count) in answered {
        let entry = per_replica.entry(replica).or_default();
        entry.1 += count;
        if method == "RegisterAgent" {
            entry.0 += count;
        }
    }
    Ok(NodesLoad {
        registered_after: done_at - ready_at,
        leader: sim.world.cluster().leader_with_quorum().unwrap_or_default(),
        per_replica,
    })
}

/// `spur-sim bench-nodes`: [`measure_nodes`], printed.
pub fn bench_nodes(nodes: usize, rtt_ms: u64) -> anyhow::Result<bool> {
    let started = Instant::now();
    let load = measure_nodes(nodes, rtt_ms)?;
    println!(
        "{nodes} nodes registered {:.2} s after the controller was ready ({rtt_ms} ms round trip, simulated); {:.1} s of wall time",
        load.registered_after.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    // Which replicas the operator reached, as they answered: a follower forwards each
    // registration to the leader, one more round trip each.
    for (replica, (registrations, calls)) in &load.per_replica {
        println!(
            "  {replica:<14} {registrations:>6} registrations, {calls:>6} calls answered{}",
            if *replica == load.leader {
                "  (leader)"
            } else {
                "  (follower: forwarded to the leader)"
            }
        );
    }
    Ok(true)
}

/// The controller calls per second the operator makes with `jobs` active SpurJobs, in the
/// steady state after all are submitted (simulated time): the status poller's one GetJobs
/// per interval for all of them, not one call per job.
pub fn measure_active_jobs(jobs: usize) -> anyhow::Result<ActiveJobsLoad> {
    use std::time::Duration;

    use crate::harness::Sim;
    use crate::world::WorldConfig;

    const WINDOW: Duration = Duration::from_secs(60);
    let config = WorldConfig {
        max_duration: Duration::from_secs(3600),
        ..WorldConfig::default()
    };
    // No nodes: every job stays PENDING, so all of them stay active and polled.
    let mut sim = Sim::with_config(1, config);
    sim.start_operator("operator", &[]);
    run_until(&mut sim, Duration::from_secs(5))?;
    let (created_at, submitted_at) = submit_all(&mut sim, jobs)?;
    // Let the status writes of the first round settle, then count one window of the calls
    // the operator made (its own counter: a call a follower forwards is still one call).
    let window_start = submitted_at + Duration::from_secs(30);
    run_until(&mut sim, window_start)?;
    let before = operator_calls(&sim);
    run_until(&mut sim, window_start + WINDOW)?;
    let mut by_method = operator_calls(&sim);
    for (method, count) in &mut by_method {
        *count -= before.get(method).copied().unwrap_or(0);
    }
    by_method.retain(|_, count| *count > 0);
    let mut answered: BTreeMap<String, usize> = BTreeMap::new();
    for ((_, method), count) in spur_fakes::model::calls::answered(
        &sim.world.trace().events(),
        window_start,
        window_start + WINDOW,
    ) {
        *answered.entry(method).or_default() += count;
    }
    Ok(ActiveJobsLoad {
        submitted_after: submitted_at - created_at,
        window: WINDOW,
        calls: by_method,
        answered,
    })
}

/// Runs `sim` until simulated time `until`.
fn run_until(sim: &mut crate::harness::Sim, until: std::time::Duration) -> anyhow::Result<()> {
    sim.world
        .run_until(until)
        .map_err(|e| anyhow::anyhow!("the simulation failed: {e}"))
}

/// Creates `jobs` SpurJobs and runs until the controller holds a job for each (checked
/// every simulated second); returns when they were created and when all were submitted.
fn submit_all(
    sim: &mut crate::harness::Sim,
    jobs: usize,
) -> anyhow::Result<(std::time::Duration, std::time::Duration)> {
    use std::time::Duration;

    for i in 0..jobs {
        sim.create_spurjob(
            "default",
            &format!("job-{i:05}"),
            serde_json::json!({"image": "busybox", "command": ["true"]}),
        );
    }
    let created_at = sim.world.elapsed();
    let mut now = created_at;
    loop {
        now += Duration::from_secs(1);
        run_until(sim, now)?;
        let submitted = sim.world.cluster().job_ids().len();
        if submitted >= jobs {
            return Ok((created_at, now));
        }
        if now - created_at > Duration::from_secs(1800) {
            anyhow::bail!("only {submitted} of {jobs} SpurJobs submitted after 1800 s");
        }
    }
}

/// The calls the operator made so far by method, as its own
/// `spur_operator_controller_rpcs_total` counter has them.
fn operator_calls(sim: &crate::harness::Sim) -> BTreeMap<String, usize> {
    let text = sim
        .operator("operator")
        .expect("the operator runs")
        .metrics
        .encode();
    let mut by_method = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("spur_operator_controller_rpcs_total{method=\"") else {
            continue;
        };
        let (method, rest) = rest.split_once('"').unwrap_or_default();
        let count: f64 = rest
            .rsplit(' ')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or(0.0);
        *by_method.entry(method.to_owned()).or_default() += count as usize;
    }
    by_method
}

/// What [`measure_active_jobs`] found.
#[derive(Debug)]
pub struct ActiveJobsLoad {
    /// From creating the SpurJobs to the controller holding every job (simulated).
    pub submitted_after: std::time::Duration,
    /// The steady-state window the calls were counted over (simulated).
    pub window: std::time::Duration,
    /// Calls the operator made in the window, by method, as its own counter
    /// (`spur_operator_controller_rpcs_total`) has them.
    pub calls: BTreeMap<String, usize>,
    /// Calls the replicas answered in the window, by method: the controller's cost, with
    /// the channel's probes and Pings, which the operator's counter leaves out.
    pub answered: BTreeMap<String, usize>,
}

impl ActiveJobsLoad {
    pub fn per_second(&self, calls: usize) -> f64 {
        calls as f64 / self.window.as_secs_f64()
    }
}

/// `spur-sim bench-jobs`: [`measure_active_jobs`], printed.
pub fn bench_jobs(jobs: usize) -> anyhow::Result<bool> {
    let started = Instant::now();
    let load = measure_active_jobs(jobs)?;
    let total: usize = load.answered.values().sum();
    println!(
        "{jobs} active SpurJobs, all submitted {:.1} s after creation; steady state over {} s (simulated): {:.2} calls/s answered by the replicas",
        load.submitted_after.as_secs_f64(),
        load.window.as_secs(),
        load.per_second(total)
    );
    for (method, count) in &load.answered {
        println!(
            "  {method:<16} {count:>6} answered  {:.2}/s   (the operator counted {})",
            load.per_second(*count),
            load.calls.get(method).copied().unwrap_or(0)
        );
    }
    println!("{:.1} s of wall time", started.elapsed().as_secs_f64());
    Ok(true)
}
