//! `spur-sim`: runs the simulated world (see shared/spec/sim.md).

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "spur-sim",
    about = "Deterministic simulation of spur-operator's world"
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
    /// Run the same seeds under several profiles and print one table.
    Compare(spur_sim::cli::CompareArgs),
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
    /// The simulated controller replicas over real TCP: three replicas and the `spurctld`
    /// Service on `--listen`, for local use and comparison with a real spurctld.
    Controllers(spur_sim::controller::tcp::ControllersArgs),
    /// Serve the simulated Kubernetes API server over TCP (and write a kubeconfig for it).
    KubeApi(spur_sim::kube_api::cli::KubeApiArgs),
    /// Runs a small fixed scenario and prints its trace hash. A temporary harness until the
    /// scenario runner exists; the same seed must print the same hash in any process.
    WorldSmoke {
        /// The seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
}

fn main() -> anyhow::Result<std::process::ExitCode> {
    let ok = |passed: bool| {
        Ok(if passed {
            std::process::ExitCode::SUCCESS
        } else {
            std::process::ExitCode::FAILURE
        })
    };
    match Cli::parse().command {
        Command::Run(args) => return ok(spur_sim::cli::run(args)?),
        Command::Replay(args) => return ok(spur_sim::cli::replay(args)?),
        Command::Compare(args) => return ok(spur_sim::cli::compare(args)?),
        Command::Bench { seeds } => return ok(spur_sim::cli::bench(seeds)?),
        Command::BenchNodes { nodes, rtt_ms } => {
            return ok(spur_sim::cli::bench_nodes(nodes, rtt_ms)?);
        }
        Command::Controllers(args) => spur_sim::controller::tcp::main(args)?,
        Command::KubeApi(args) => {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime.block_on(spur_sim::kube_api::cli::run(args))?;
        }
        Command::WorldSmoke { seed } => {
            let report = spur_sim::smoke::run(seed)?;
            println!(
                "seed={} trace_hash={} sim_secs={:.3} events={} job_ids={:?}",
                report.seed, report.trace_hash, report.sim_secs, report.events, report.job_ids
            );
        }
    }
    Ok(std::process::ExitCode::SUCCESS)
}
