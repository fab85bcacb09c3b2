//! The `spur-operator` binary: parses the command line and wires the library to the real
//! world (TCP, the process's clock). No logic lives here.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use spur_operator::check::{check_controller, describe_failure};
use spur_operator::config::ControllerArgs;
use spur_operator::net::TcpNetwork;
use spur_operator::telemetry::{self, LogFormat};

/// Kubernetes operator for the Spur workload manager.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    /// Log format.
    #[arg(
        long,
        global = true,
        env = "SPUR_OPERATOR_LOG_FORMAT",
        value_enum,
        default_value_t
    )]
    log_format: LogFormat,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Connect to spurctld with the operator's bounds, call Ping, and report the
    /// controller's hostname, version and round-trip time. Exits non-zero, naming the
    /// cause, when the controller cannot be reached within those bounds.
    CheckController(ControllerArgs),
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    // The check speaks in its one result line; the client's own warnings would repeat it.
    let default_level = match cli.command {
        Command::CheckController(_) => "error",
    };
    telemetry::init(cli.log_format, default_level);
    match cli.command {
        Command::CheckController(args) => {
            let settings = match args.validate() {
                Ok(settings) => settings,
                Err(e) => {
                    eprintln!("spur-operator: {e}");
                    return ExitCode::from(2);
                }
            };
            match check_controller(&settings, TcpNetwork).await {
                Ok(report) => {
                    println!("spurctld at {}: {report}", settings.addr);
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!(
                        "spurctld at {} is not answering: {}",
                        settings.addr,
                        describe_failure(&e, &settings)
                    );
                    ExitCode::FAILURE
                }
            }
        }
    }
}
