//! `spur-sim`: runs the simulated world (see shared/spec/sim.md).

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "spur-sim",
    about = "The deterministic simulation of spur-operator's world"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Serve the simulated Kubernetes API server over TCP.
    KubeApi(spur_sim::kube_api::cli::KubeApiArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    match cli.command {
        Command::KubeApi(args) => runtime.block_on(spur_sim::kube_api::cli::run(args))?,
    }
    Ok(())
}
