//! `spur-sim`: runs the simulated world (see docs/specs.md, "The simulation").

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "spur-sim",
    about = "Deterministic simulation of spur-operator's world",
    after_help = "Exit status: 0 when every scenario passed, 1 when a scenario failed its checks, 2 on an error (bad arguments or input)."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run seeded fault scenarios and judge them (one JSON object each with `--json`).
    Run(spur_sim::cli::RunArgs),
    /// Run one seed again, exactly: its result, its trace hash, and with `--trace` its trace.
    Replay(spur_sim::cli::ReplayArgs),
    /// Run the same seeds under several profiles and print one table; exits 1 when
    /// `default` fails a seed (the older profiles are expected to).
    Compare(spur_sim::cli::CompareArgs),
    /// Join the `run --json` output of sweep shards into one summary a profile.
    Merge(spur_sim::cli::MergeArgs),
    /// Scenarios per second and simulated seconds per wall second, on one thread.
    Bench {
        #[arg(long, default_value_t = 10)]
        seeds: u64,
    },
    /// Time for the operator to register many nodes once the controller is ready.
    BenchNodes {
        #[arg(long, default_value_t = 5000)]
        nodes: usize,
        /// Round trip between hosts, in milliseconds.
        #[arg(long, default_value_t = 10)]
        rtt_ms: u64,
    },
    /// Controller calls per second with many active SpurJobs (simulated time).
    BenchJobs {
        #[arg(long, default_value_t = 10_000)]
        jobs: usize,
    },
    /// The simulated controller replicas over real TCP: three replicas and the `spurctld`
    /// Service on `--listen`, for local use and comparison with a real spurctld.
    Controllers(spur_fakes::model::tcp::ControllersArgs),
    /// The simulated replicas' shared state and servers, for replica processes
    /// (`spur-sim replica`) to serve through; what the lab runs without the real spurctld.
    ReplicaState(spur_fakes::model::processes::StateArgs),
    /// One simulated replica as a process of its own on its pod's address (see
    /// `replica-state`).
    Replica(spur_fakes::model::processes::ReplicaArgs),
    /// The named scenarios on real processes (real spurctld, the real operator binary) in
    /// a private network namespace, faults made by the kernel; `--compare-sim` sets each
    /// beside its simulated twin. Needs root.
    Lab(spur_lab::LabArgs),
    /// The operator at scale against the real three replicas, in the lab: time to
    /// register many nodes, then the steady state with many active SpurJobs. Needs root.
    LabBench(spur_lab::bench::LabBenchArgs),
    /// What the real spurctld can take: each call the operator makes, driven as fast as one
    /// replica, or the leader of three, answers; calls a second and latencies a kind.
    LabLimits(spur_lab::limits::LimitsArgs),
    /// How long after a network cut heals the kernel delivers what an open connection sent
    /// across it, against the simulation's delivery at the heal. Needs root.
    LabHeal(spur_lab::heal::LabHealArgs),
    /// A local Kubernetes whose pods are processes: the simulated API server with RBAC,
    /// the workload controllers, DNS, and a process kubelet per node, in a private network
    /// namespace; prints the kubeconfig for kubectl and runs until stopped. Needs root.
    Cluster(spur_lab::cluster::up::ClusterArgs),
    /// Serve the simulated Kubernetes API server over TCP (and write a kubeconfig for it).
    KubeApi(spur_fakes::api_server::cli::KubeApiArgs),
    /// Runs a small fixed scenario and prints its trace hash: the same seed must print the
    /// same hash in any process (the cross-process determinism test runs it).
    WorldSmoke {
        /// The seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
}

fn main() -> std::process::ExitCode {
    match run(Cli::parse().command) {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::from(1),
        Err(e) => {
            eprintln!("spur-sim: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}

/// Whether every scenario passed (commands without scenarios pass when they succeed).
fn run(command: Command) -> anyhow::Result<bool> {
    match command {
        Command::Run(args) => spur_sim::cli::run(args),
        Command::Replay(args) => spur_sim::cli::replay(args),
        Command::Compare(args) => spur_sim::cli::compare(args),
        Command::Merge(args) => spur_sim::cli::merge(args),
        Command::Bench { seeds } => spur_sim::cli::bench(seeds),
        Command::BenchNodes { nodes, rtt_ms } => spur_sim::cli::bench_nodes(nodes, rtt_ms),
        Command::BenchJobs { jobs } => spur_sim::cli::bench_jobs(jobs),
        Command::Lab(args) => spur_lab::main(
            args,
            spur_lab::Twin {
                run: spur_sim::scenario::run_plan,
                catch_calls: || spur_sim::cli::install_subscriber(None, true),
            },
        ),
        Command::LabBench(args) => spur_lab::bench::main(args),
        Command::LabHeal(args) => spur_lab::heal::main(args),
        Command::LabLimits(args) => spur_lab::limits::main(args),
        Command::Cluster(args) => spur_lab::cluster::up::main(args),
        Command::Controllers(args) => {
            spur_fakes::model::tcp::main(args)?;
            Ok(true)
        }
        Command::ReplicaState(args) => {
            spur_fakes::model::processes::state_main(args)?;
            Ok(true)
        }
        Command::Replica(args) => {
            spur_fakes::model::processes::replica_main(args)?;
            Ok(true)
        }
        Command::KubeApi(args) => {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime.block_on(spur_fakes::api_server::cli::run(args))?;
            Ok(true)
        }
        Command::WorldSmoke { seed } => {
            let report = spur_sim::smoke::run(seed)?;
            println!(
                "seed={} trace_hash={} sim_secs={:.3} events={} job_ids={:?}",
                report.seed, report.trace_hash, report.sim_secs, report.events, report.job_ids
            );
            Ok(true)
        }
    }
}
