//! The simulated replicas over real TCP, in one process: `spur-sim controllers`.
//!
//! Three replicas listen on ephemeral loopback ports; a small TCP proxy on `--listen`
//! plays the `spurctld` Service and spreads connections over them. Elections and
//! forwarding behave as in the simulation (without network faults), so the conformance
//! suite can run against this, a real spurctld, or the simulation alike.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use rand::RngExt;
use rand_chacha::ChaCha8Rng;
use spur_operator::net::{Dialer, TcpNetwork};
use tokio::net::{TcpListener, TcpStream};

use super::{Clock, Cluster, ControllerConfig, Replica, limits, replica_host, scheduler};
use crate::clock::rng_for;
use spur_judge::trace::Trace;

/// Arguments of `spur-sim controllers`.
#[derive(Clone, Debug, clap::Args)]
pub struct ControllersArgs {
    /// Where the Service listens (what clients dial as spurctld).
    #[arg(long, default_value = "127.0.0.1:6817")]
    pub listen: SocketAddr,
    /// Seed of the Service's picks and the election times.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Print every trace event to stderr.
    #[arg(long)]
    pub verbose: bool,
}

/// Why the real-TCP replicas stopped.
#[derive(Debug, thiserror::Error)]
pub enum ControllersError {
    /// A listener could not be bound.
    #[error("bind {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    /// A replica's server failed.
    #[error("replica server: {0}")]
    Serve(#[from] tonic::transport::Error),
    /// The tokio runtime could not be built.
    #[error("tokio runtime: {0}")]
    Runtime(std::io::Error),
}

/// `spur-sim controllers`: builds a multi-threaded runtime and runs [`run`] on it.
pub fn main(args: ControllersArgs) -> Result<(), ControllersError> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(ControllersError::Runtime)?
        .block_on(run(args))
}

/// Dials replica names (`spurctld-1`) at their loopback ports, anything else over TCP.
#[derive(Clone, Debug)]
struct LoopbackDialer {
    replicas: Arc<BTreeMap<String, SocketAddr>>,
}

impl Dialer for LoopbackDialer {
    type Stream = TcpStream;

    fn dial(&self, host: &str, port: u16) -> BoxFuture<'static, std::io::Result<TcpStream>> {
        match self.replicas.get(host) {
            Some(addr) => {
                let addr = *addr;
                Box::pin(async move { TcpStream::connect(addr).await })
            }
            None => TcpNetwork.dial(host, port),
        }
    }
}

/// Runs the replicas and the Service until the process is stopped.
pub async fn run(args: ControllersArgs) -> Result<(), ControllersError> {
    let clock = Clock::real();
    let config = ControllerConfig::default();
    let trace = Trace::new();

    let (listeners, addrs) = bind_replicas(config.replicas).await?;
    let service =
        TcpListener::bind(args.listen)
            .await
            .map_err(|source| ControllersError::Bind {
                addr: args.listen,
                source,
            })?;
    let dialer = LoopbackDialer {
        replicas: Arc::new(addrs.clone()),
    };
    let cluster = Cluster::new(config, rng_for(args.seed, "election"), None, trace.clone());

    let mut servers = Vec::new();
    for (slot, listener) in listeners.into_iter().enumerate() {
        let host = replica_host(slot, 0);
        cluster.started(slot, &host, (clock.elapsed)());
        let replica = Replica::new(slot, &host, cluster.clone(), dialer.clone(), clock);
        tokio::spawn(scheduler::run(replica.clone()));
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        servers.push(tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(limits::server(replica))
                .serve_with_incoming(incoming),
        ));
        eprintln!("replica {host} on {}", addrs[&host]);
    }

    spawn_ticker(cluster.clone(), clock, args.verbose);

    let service_addr = service
        .local_addr()
        .map_err(|source| ControllersError::Bind {
            addr: args.listen,
            source,
        })?;
    // Printed with the bound port, so `--listen 127.0.0.1:0` can be used by tests.
    eprintln!("service spurctld on {service_addr}");
    let rng = rng_for(args.seed, "service");
    spawn_service(service, addrs.values().copied().collect(), rng);

    for server in servers {
        if let Ok(result) = server.await {
            result?;
        }
    }
    Ok(())
}

/// Binds one loopback listener per replica; returns them with each replica's address by
/// host name.
async fn bind_replicas(
    replicas: usize,
) -> Result<(Vec<TcpListener>, BTreeMap<String, SocketAddr>), ControllersError> {
    let loopback: SocketAddr = ([127, 0, 0, 1], 0).into();
    let mut listeners = Vec::new();
    let mut addrs = BTreeMap::new();
    for slot in 0..replicas {
        let listener =
            TcpListener::bind(loopback)
                .await
                .map_err(|source| ControllersError::Bind {
                    addr: loopback,
                    source,
                })?;
        let addr = listener
            .local_addr()
            .map_err(|source| ControllersError::Bind {
                addr: loopback,
                source,
            })?;
        addrs.insert(replica_host(slot, 0), addr);
        listeners.push(listener);
    }
    Ok((listeners, addrs))
}

/// Ticks the cluster every 50 ms and prints each change of leader (and, with `verbose`,
/// every new trace event) to stderr.
fn spawn_ticker(ticker: Cluster, clock: Clock, verbose: bool) {
    tokio::spawn(async move {
        let mut printed = 0;
        let mut last_leader = None;
        loop {
            tokio::time::sleep(Duration::from_millis(50)).await;
            ticker.tick((clock.elapsed)());
            let leader = ticker.leader();
            if leader != last_leader {
                eprintln!("leader: {}", leader.as_deref().unwrap_or("none"));
                last_leader = leader;
            }
            if verbose {
                let events = ticker.trace().events();
                for event in &events[printed..] {
                    eprintln!("{event}");
                }
                printed = events.len();
            }
        }
    });
}

/// Plays the `spurctld` Service: proxies each accepted connection to a replica picked at
/// random, as kube-proxy does.
fn spawn_service(service: TcpListener, backends: Vec<SocketAddr>, rng: ChaCha8Rng) {
    let rng = Arc::new(Mutex::new(rng));
    tokio::spawn(async move {
        loop {
            let Ok((mut inbound, _)) = service.accept().await else {
                continue;
            };
            let pick = rng
                .lock()
                .expect("rng lock")
                .random_range(0..backends.len());
            let backend = backends[pick];
            tokio::spawn(async move {
                if let Ok(mut outbound) = TcpStream::connect(backend).await {
                    let _ = inbound.set_nodelay(true);
                    let _ = outbound.set_nodelay(true);
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
}
