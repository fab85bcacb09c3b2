//! The `spur-operator` binary: parses the command line and wires the library to the real
//! world (TCP, the process's clock). No logic lives here.

use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use spur_operator::LogFormat;
use spur_operator::Seams;
use spur_operator::clock::WallClock;
use spur_operator::net::TcpNetwork;
use spur_operator::{
    ControllerArgs, NamespaceSource, RunArgs, fallback_agent_address, resolve_namespace,
};
use spur_operator::{README_BEGIN, README_END, config_table, splice};
use spur_operator::{check_controller, describe_failure};

/// `--version`. A build with `--cfg tokio_unstable` (which only the simulation needs, to
/// seed its runtimes; `.cargo/config.toml` turns it on for development) says so: the
/// release build of the image is made without it, and `ci/image.sh` checks this line.
#[cfg(tokio_unstable)]
const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (a development build: --cfg tokio_unstable)"
);
#[cfg(not(tokio_unstable))]
const LONG_VERSION: &str = env!("CARGO_PKG_VERSION");

/// Kubernetes operator for the Spur workload manager.
///
/// With no subcommand it runs the operator, taking `run`'s flags, as upstream's operator
/// (`spur-k8s`) does, so its manifests' command lines work unchanged.
#[derive(Parser)]
#[command(
    version,
    long_version = LONG_VERSION,
    about,
    args_conflicts_with_subcommands = true
)]
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

    /// Log level or `tracing` filter directives (`info`, `spur_operator=debug`), as
    /// upstream's `--log-level`. `RUST_LOG`, when set, wins. Unset: `info` for `run`, and
    /// `error` for the one-shot commands, whose result line says what matters.
    #[arg(long, global = true, env = "SPUR_OPERATOR_LOG_LEVEL")]
    log_level: Option<String>,

    #[command(subcommand)]
    command: Option<Command>,

    /// `run`'s flags, for a command line with no subcommand.
    #[command(flatten)]
    run: Box<RunArgs>,
}

#[derive(Subcommand)]
enum Command {
    /// Run the operator: register the labelled nodes with spurctld and heartbeat them,
    /// serve /healthz, /readyz and /metrics, and act only while holding the Lease.
    Run(Box<RunArgs>),
    /// Connect to spurctld with the operator's bounds, call Ping, and report the
    /// controller's hostname, version and round-trip time. Exits non-zero, naming the
    /// cause, when the controller cannot be reached within those bounds.
    CheckController(Box<ControllerArgs>),
    /// Print the SpurJob CustomResourceDefinition as YAML (what deploy/crd.yaml holds).
    #[command(visible_alias = "generate-crd")]
    Crd,
    /// Print the Markdown table of `run`'s flags (the configuration reference in
    /// docs/operating.md). With `--write`, replace the table between its markers in
    /// docs/operating.md instead, or in the file `--write PATH` names.
    ConfigTable {
        #[arg(long, value_name = "PATH", num_args = 0..=1,
              default_missing_value = "docs/operating.md")]
        write: Option<std::path::PathBuf>,
    },
}

/// `spur-operator run`'s flags, global ones included.
fn run_command() -> clap::Command {
    let mut cli = <Cli as clap::CommandFactory>::command();
    cli.build();
    cli.find_subcommand("run")
        .expect("the run subcommand")
        .clone()
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let command = cli.command.unwrap_or(Command::Run(cli.run));
    // The check speaks in its one result line; the client's own warnings would repeat it.
    let default_level = match command {
        Command::Run(_) => "info",
        Command::CheckController(_) | Command::Crd | Command::ConfigTable { .. } => "error",
    };
    if let Err(e) =
        spur_operator::init_telemetry(cli.log_format, cli.log_level.as_deref(), default_level)
    {
        eprintln!("spur-operator: --log-level: {e}");
        return ExitCode::from(2);
    }
    match command {
        Command::Run(mut args) => match run(&mut args).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("spur-operator: {e:#}");
                ExitCode::FAILURE
            }
        },
        Command::Crd => {
            print!("{}", spur_operator::crd_yaml());
            ExitCode::SUCCESS
        }
        Command::ConfigTable { write } => config_table_command(write),
        Command::CheckController(args) => check_controller_command(&args).await,
    }
}

/// `config-table`: prints the table, or with `--write` replaces it in `write`'s file.
fn config_table_command(write: Option<std::path::PathBuf>) -> ExitCode {
    let table = config_table(&run_command());
    let Some(path) = write else {
        print!("{table}");
        return ExitCode::SUCCESS;
    };
    let written = std::fs::read_to_string(&path)
        .map_err(|e| e.to_string())
        .and_then(|text| {
            splice(&text, &table)
                .ok_or_else(|| format!("no {README_BEGIN} ... {README_END} markers"))
        })
        .and_then(|text| std::fs::write(&path, text).map_err(|e| e.to_string()));
    match written {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("spur-operator: {}: {e}", path.display());
            ExitCode::FAILURE
        }
    }
}

/// `check-controller`: one line on whether spurctld answers, and if not, why.
async fn check_controller_command(args: &ControllerArgs) -> ExitCode {
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

async fn run(args: &mut RunArgs) -> anyhow::Result<()> {
    let (namespace, source) = own_namespace(args);
    tracing::info!(%namespace, from = %source, "the operator's namespace: its Lease goes there");
    args.namespace = Some(namespace);
    if args.agent.agent_address.is_none() {
        let var = |name| std::env::var(name).ok();
        args.agent.agent_address =
            fallback_agent_address(var("SPUR_OPERATOR_ADDRESS"), var("POD_IP"));
    }
    let config = args.validate()?;
    if let Some(token) = &config.node_sync.join_token {
        let file = token.path().display();
        tracing::info!(%file, "registrations carry the join token this file holds (spurctld's token admission)");
    }
    let kube_config = match &config.kubeconfig {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("--kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                .await
                .with_context(|| format!("--kubeconfig {}", path.display()))?
        }
        None => kube::Config::infer()
            .await
            .context("no in-cluster configuration and no usable default kubeconfig")?,
    };
    let kube = kube::Client::try_from(kube_config).context("building the Kubernetes client")?;
    let seams = Seams {
        network: TcpNetwork,
        kube,
        clock: WallClock::system(),
        seed: process_seed(),
    };
    spur_operator::run(seams, config, shutdown_signal()).await?;
    Ok(())
}

/// Where Kubernetes mounts a pod's service account namespace.
const SERVICE_ACCOUNT_NAMESPACE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

/// The operator's own namespace, from the first source that names one.
fn own_namespace(args: &RunArgs) -> (String, NamespaceSource) {
    let pod_namespace = std::env::var("POD_NAMESPACE").ok();
    let service_account = std::fs::read_to_string(SERVICE_ACCOUNT_NAMESPACE).ok();
    let context = kubeconfig_namespace(args.kubeconfig.as_deref());
    resolve_namespace(
        args.namespace.as_deref(),
        pod_namespace.as_deref(),
        service_account.as_deref(),
        context.as_deref(),
    )
}

/// The namespace the kubeconfig's current context names, if it names one.
fn kubeconfig_namespace(path: Option<&std::path::Path>) -> Option<String> {
    let config = match path {
        Some(path) => kube::config::Kubeconfig::read_from(path).ok()?,
        None => kube::config::Kubeconfig::read().ok()?,
    };
    let current = config.current_context.as_deref()?;
    let named = config.contexts.iter().find(|c| c.name == current)?;
    named.context.as_ref()?.namespace.clone()
}

/// Seeds retry jitter; it need not be secret, only different between replicas.
fn process_seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    nanos ^ (u64::from(std::process::id()) << 32)
}

/// Completes on SIGTERM (Kubernetes stopping the pod) or SIGINT.
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("install the SIGTERM handler");
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: shutting down"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Upstream's command lines (`spur-k8s` flags, no subcommand, `generate-crd`) parse to
    /// the same settings as ours.
    #[test]
    fn upstreams_command_lines_are_accepted() {
        let upstream = Cli::try_parse_from([
            "spur-operator",
            "--controller-addr",
            "spurctld.spur:6817",
            "--listen",
            "[::]:6818",
            "--address",
            "10.0.0.7",
            "--health-addr",
            "[::]:8080",
            "--auth-mode",
            "required",
            "--jwt-key",
            "secret",
            "--log-level",
            "debug",
            "--identity",
            "operator-0",
        ])
        .expect("upstream's flags parse");
        assert!(
            upstream.command.is_none(),
            "no subcommand runs the operator"
        );
        assert_eq!(upstream.log_level.as_deref(), Some("debug"));
        let config = upstream.run.validate().expect("upstream's flags validate");
        assert_eq!(config.agent_listen, "[::]:6818".parse().unwrap());
        assert_eq!(config.health_listen, "[::]:8080".parse().unwrap());
        assert_eq!(
            config.controller.addr.to_string(),
            "http://spurctld.spur:6817"
        );
        let ours = Cli::try_parse_from([
            "spur-operator",
            "run",
            "--controller-addr",
            "spurctld.spur:6817",
            "--agent-listen",
            "[::]:6818",
            "--agent-address",
            "10.0.0.7",
            "--health-listen",
            "[::]:8080",
            "--agent-auth",
            "required",
            "--agent-auth-key",
            "secret",
            "--identity",
            "operator-0",
        ])
        .expect("our flags parse");
        let Some(Command::Run(args)) = ours.command else {
            panic!("`run` is the run subcommand");
        };
        assert_eq!(
            format!("{:?}", args.validate().unwrap()),
            format!("{config:?}")
        );
        let crd = Cli::try_parse_from(["spur-operator", "generate-crd"]).unwrap();
        assert!(matches!(crd.command, Some(Command::Crd)));
        let quota = Cli::try_parse_from([
            "spur-operator",
            "--enable-quota",
            "--address",
            "10.0.0.7",
            "--identity",
            "operator-0",
        ])
        .unwrap();
        let refused = quota.run.validate().unwrap_err().to_string();
        assert!(refused.contains("--enable-quota"), "{refused}");
    }

    #[test]
    fn the_operating_guide_configuration_table_is_current() {
        let guide = include_str!("../../../docs/operating.md");
        let expected = splice(guide, &config_table(&run_command()))
            .expect("docs/operating.md has the configuration table's markers");
        assert!(
            guide == expected,
            "docs/operating.md's configuration table is stale: run `cargo run -p spur-operator -- config-table --write docs/operating.md`"
        );
    }

    /// Every metric family the operator exports is in docs/operating.md's list, and every
    /// one listed is exported.
    #[test]
    fn the_operating_guide_lists_exactly_the_exported_metrics() {
        let guide = include_str!("../../../docs/operating.md");
        let section = guide
            .split("\n## Metrics\n")
            .nth(1)
            .and_then(|rest| rest.split("\n## ").next())
            .expect("docs/operating.md has a Metrics section");
        let exported = spur_operator::Metrics::with_a_series_of_each().family_names();
        let listed: std::collections::BTreeSet<String> = section
            .lines()
            .filter_map(|l| l.strip_prefix("| `"))
            .map(|l| {
                l.split(['`', '{'])
                    .next()
                    .unwrap()
                    .trim_end_matches("_total")
                    .to_owned()
            })
            .collect();
        assert!(!exported.is_empty());
        assert_eq!(
            exported, listed,
            "docs/operating.md's Metrics table against the exported families"
        );
    }

    #[test]
    fn the_table_lists_global_and_run_flags_with_their_environment() {
        let table = config_table(&run_command());
        for row in [
            "| `--log-format` | `SPUR_OPERATOR_LOG_FORMAT` | `text` |",
            "| `--controller-connect-timeout` | `SPUR_OPERATOR_CONTROLLER_CONNECT_TIMEOUT` | `2s` |",
            "| `--agent-address` (`--address`) | `SPUR_OPERATOR_AGENT_ADDRESS` | (unset) |",
            "| `--agent-auth-key` (`--jwt-key`) | `SPUR_JWT_KEY` | (unset) |",
        ] {
            assert!(table.contains(row), "{row} missing from\n{table}");
        }
    }
}
