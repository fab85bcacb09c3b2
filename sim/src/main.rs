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

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
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
    Ok(())
}
