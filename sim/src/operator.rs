//! The real operator in the simulated world: its network seam over turmoil, its kube
//! Client over the simulated network to the simulated API server, its wall clock the
//! simulation's, and its configuration given as the same flags production takes.

use std::future::Future;
use std::io;
use std::net::SocketAddr;

use clap::Parser;
use futures::future::BoxFuture;
use spur_operator::Handles;
use spur_operator::clock::WallClock;
use spur_operator::net::{Binder, Dialer};
use spur_operator::{OperatorConfig, RunArgs};

use crate::determinism::sim_now;
use crate::net::{ServiceDialer, SimListener};
use spur_fakes::api_server::{ClientOptions, client_over_with};

pub use spur_judge::hosts::{KUBE_API_HOST, KUBE_API_PORT};

/// The operator's network in the simulation: dials through the `spurctld` Service like
/// kube-proxy, listens on the simulated host.
#[derive(Clone)]
pub struct OperatorNetwork {
    dialer: ServiceDialer,
}

impl OperatorNetwork {
    pub fn new(dialer: ServiceDialer) -> Self {
        Self { dialer }
    }
}

impl Dialer for OperatorNetwork {
    type Stream = turmoil::net::TcpStream;

    fn dial(
        &self,
        host: &str,
        port: u16,
    ) -> BoxFuture<'static, io::Result<turmoil::net::TcpStream>> {
        self.dialer.dial(host, port)
    }
}

impl Binder for OperatorNetwork {
    type Listener = SimListener;

    fn bind(&self, addr: SocketAddr) -> BoxFuture<'static, io::Result<SimListener>> {
        Box::pin(SimListener::bind_addr(addr))
    }
}

#[derive(Parser)]
struct Flags {
    #[command(flatten)]
    run: RunArgs,
}

/// The operator's configuration from command-line flags, exactly as the binary parses
/// them, so a profile is a list of flags and nothing else.
pub fn config_from_flags(host: &str, flags: &[String]) -> Result<OperatorConfig, String> {
    let mut argv = vec![
        "spur-operator".to_owned(),
        "--agent-address".to_owned(),
        host.to_owned(),
        "--identity".to_owned(),
        host.to_owned(),
        "--namespace".to_owned(),
        "spur-system".to_owned(),
    ];
    argv.extend(flags.iter().cloned());
    let parsed = Flags::try_parse_from(argv).map_err(|e| e.to_string())?;
    parsed.run.validate().map_err(|e| e.to_string())
}

/// Runs the operator on the current simulated host until `shutdown` completes, acting on
/// the API server with `token` (its ServiceAccount's, as in a pod).
pub async fn run_operator(
    dialer: ServiceDialer,
    config: OperatorConfig,
    seed: u64,
    token: String,
    shutdown: impl Future<Output = ()>,
    started: tokio::sync::oneshot::Sender<Handles>,
) -> Result<(), spur_operator::RunError> {
    let options = ClientOptions {
        bearer_token: Some(token),
        ..ClientOptions::default()
    };
    let kube = client_over_with(dialer.clone(), KUBE_API_HOST, KUBE_API_PORT, &options);
    let seams = spur_operator::Seams {
        network: OperatorNetwork::new(dialer),
        kube,
        clock: WallClock::from_fn(sim_now),
        seed,
    };
    spur_operator::run_with_handles(seams, config, shutdown, started).await
}

#[cfg(test)]
mod tests {
    use spur_judge::profiles::Profile;

    use super::config_from_flags;

    #[test]
    fn every_profile_is_a_valid_operator_configuration() {
        for profile in Profile::ALL {
            let flags: Vec<String> = profile.flags().iter().map(|f| f.to_string()).collect();
            let config =
                config_from_flags("operator", &flags).unwrap_or_else(|e| panic!("{profile}: {e}"));
            let channel = &config.controller.channel;
            match profile {
                Profile::Unbounded => {
                    assert_eq!(channel.connect_probe, None);
                    assert_eq!(channel.hedge(), None);
                    assert_eq!(channel.connect_timeout, None);
                    assert_eq!(channel.request_timeout, None);
                    assert_eq!(channel.keepalive, None);
                }
                Profile::SeedFix | Profile::Default => {
                    assert!(channel.connect_timeout.is_some() && channel.keepalive.is_some());
                    assert_eq!(channel.connect_probe.is_some(), profile == Profile::Default);
                }
            }
            assert_eq!(profile.name().parse::<Profile>(), Ok(profile));
        }
    }
}
