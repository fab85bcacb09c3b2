//! The simulated replicas as separate processes over real TCP: what the lab runs when the
//! real spurctld is absent (`spur-sim lab --replicas simulated`), so the lab itself runs
//! anywhere.
//!
//! Each replica is a process of its own (`spur-sim replica`) in its own pod: it listens on
//! its pod's address for clients (6817) and for its peers (6821), so the lab's kernel
//! faults reach it as they reach a real spurctld: a black-holed address, a partition by
//! address pair, SIGSTOP (its kernel still completes handshakes, nothing is answered),
//! SIGKILL and a replacement on the same name. The replicated state itself, the model's
//! [`Cluster`] with the three [`Replica`] servers, lives in one more process
//! (`spur-sim replica-state`), reached from each replica process over a Unix socket the
//! firewall never touches. What the model needs of the network it learns from the
//! replica processes alone:
//!
//! - a replica runs while its process holds its report connection open, and is stopped
//!   when it sends no report for [`STALE`];
//! - two replicas talk while each one's pings to the other's peer port come back (every
//!   [`PING_EVERY`] over a connection bound to its own address, so the kernel's drops
//!   between the two addresses stop them).
//!
//! Calls a replica makes (a follower's forward to the leader, the leader's calls to the
//! agents) leave from that replica's address, so they meet the same faults. Each replica
//! process logs `simulated replica vote: T<term>-N<node>:committed` when the leader it
//! names changes, as spurctld logs its Raft votes: the lab reads who leads from either.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use spur_operator::net::Dialer;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpSocket, TcpStream, UnixListener, UnixStream};
use tokio::task::JoinHandle;

use super::cluster::Reach;
use super::{CLIENT_PORT, RAFT_PORT};
use super::{Clock, Cluster, ControllerConfig, Replica, Role, limits, replica_host, scheduler};
use crate::clock::rng_for;
use spur_judge::trace::Trace;

/// How often a replica process pings each peer and reports to the state process: well
/// inside the model's quickest reaction (a follower forgets a silent leader after 5 s).
pub const PING_EVERY: Duration = Duration::from_millis(100);
/// A ping, or a connect to a peer, unanswered this long counts the peer as unreachable.
pub const PING_BOUND: Duration = Duration::from_millis(400);
/// A peer whose last answered ping is older than this is out of reach; a replica process
/// that has not reported for this long is stopped. Five pings: one lost packet is not a
/// partition.
pub const STALE: Duration = Duration::from_millis(500);

/// Arguments of `spur-sim replica-state`.
#[derive(Clone, Debug, clap::Args)]
pub struct StateArgs {
    /// Where the Unix sockets go: `report.sock`, and `replica-<slot>.sock` per replica.
    #[arg(long)]
    pub dir: PathBuf,
    /// Each replica's pod address, in slot order (the first is `spurctld-0`).
    #[arg(long = "ip", required = true)]
    pub ips: Vec<Ipv4Addr>,
    /// Seed of the election times and winners.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

/// Arguments of `spur-sim replica`.
#[derive(Clone, Debug, clap::Args)]
pub struct ReplicaArgs {
    /// This replica's slot (`spurctld-<slot>`).
    #[arg(long)]
    pub slot: usize,
    /// The state process's directory (see `replica-state --dir`).
    #[arg(long)]
    pub dir: PathBuf,
    /// Every replica's pod address, in slot order; this one's is `--slot`'s.
    #[arg(long = "ip", required = true)]
    pub ips: Vec<Ipv4Addr>,
}

fn report_socket(dir: &Path) -> PathBuf {
    dir.join("report.sock")
}

fn replica_socket(dir: &Path, slot: usize) -> PathBuf {
    dir.join(format!("replica-{slot}.sock"))
}

/// Binds a Unix socket any pod's user may connect to.
fn bind_unix(path: &Path) -> anyhow::Result<UnixListener> {
    let _ = std::fs::remove_file(path);
    let listener =
        UnixListener::bind(path).map_err(|e| anyhow::anyhow!("bind {}: {e}", path.display()))?;
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o777))?;
    Ok(listener)
}

/// What the replica processes last reported, by slot.
#[derive(Debug)]
struct Reports {
    hosts: BTreeMap<String, usize>,
    slots: Mutex<Vec<Report>>,
}

#[derive(Clone, Debug, Default)]
struct Report {
    /// Its report connection is open: the process runs (or is stopped).
    connected: bool,
    /// When its last report arrived.
    at: Option<Instant>,
    /// The peers its pings reached, by slot.
    reaches: BTreeSet<usize>,
}

impl Report {
    fn fresh(&self, now: Instant) -> bool {
        self.connected && self.at.is_some_and(|at| now.duration_since(at) < STALE)
    }
}

impl Reach for Reports {
    fn talks(&self, a: &str, b: &str) -> bool {
        let (Some(&a), Some(&b)) = (self.hosts.get(a), self.hosts.get(b)) else {
            return false;
        };
        let now = Instant::now();
        let slots = self.slots.lock().expect("reports lock");
        let (ra, rb) = (&slots[a], &slots[b]);
        ra.fresh(now) && rb.fresh(now) && ra.reaches.contains(&b) && rb.reaches.contains(&a)
    }

    fn is_frozen(&self, host: &str) -> bool {
        let Some(&slot) = self.hosts.get(host) else {
            return false;
        };
        let report = &self.slots.lock().expect("reports lock")[slot];
        report.connected && !report.fresh(Instant::now())
    }
}

/// Dials from one replica's own address: replica names at their pods' client ports, any
/// other host (an agent) as given.
#[derive(Clone, Debug)]
struct FromReplica {
    source: Ipv4Addr,
    replicas: Arc<BTreeMap<String, Ipv4Addr>>,
}

impl Dialer for FromReplica {
    type Stream = TcpStream;

    fn dial(&self, host: &str, port: u16) -> BoxFuture<'static, std::io::Result<TcpStream>> {
        let source = self.source;
        let target = self.replicas.get(host).map(|ip| (*ip, CLIENT_PORT));
        let host = host.to_owned();
        Box::pin(async move {
            let addr = match target {
                Some((ip, port)) => SocketAddr::new(ip.into(), port),
                None => tokio::net::lookup_host((host.as_str(), port))
                    .await?
                    .find(SocketAddr::is_ipv4)
                    .ok_or_else(|| std::io::Error::other(format!("no IPv4 address for {host}")))?,
            };
            let stream = connect_from(source, addr).await?;
            stream.set_nodelay(true)?;
            Ok(stream)
        })
    }
}

/// A TCP connection from `source` (a pod's address) to `addr`.
async fn connect_from(source: Ipv4Addr, addr: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(source.into(), 0))?;
    socket.connect(addr).await
}

/// `spur-sim replica-state`: the model's replicated state and its three servers.
pub fn state_main(args: StateArgs) -> anyhow::Result<()> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?
        .block_on(run_state(args))
}

async fn run_state(args: StateArgs) -> anyhow::Result<()> {
    let clock = Clock::real();
    let config = ControllerConfig {
        replicas: args.ips.len(),
        ..ControllerConfig::default()
    };
    let hosts: BTreeMap<String, usize> = (0..args.ips.len())
        .map(|slot| (replica_host(slot, 0), slot))
        .collect();
    let reports = Arc::new(Reports {
        hosts: hosts.clone(),
        slots: Mutex::new(vec![Report::default(); args.ips.len()]),
    });
    let cluster = Cluster::new(
        config,
        rng_for(args.seed, "election"),
        Some(reports.clone() as Arc<dyn Reach>),
        Trace::new(),
    );
    let addresses: Arc<BTreeMap<String, Ipv4Addr>> = Arc::new(
        hosts
            .iter()
            .map(|(host, slot)| (host.clone(), args.ips[*slot]))
            .collect(),
    );
    let servers = serve_replicas(&args, &cluster, &addresses, clock)?;
    let reports_listener = bind_unix(&report_socket(&args.dir))?;
    spawn_report_listener(reports_listener, cluster.clone(), reports.clone(), clock);
    eprintln!(
        "replica-state: {} replicas in {}",
        args.ips.len(),
        args.dir.display()
    );
    let mut leader = None;
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        cluster.tick((clock.elapsed)());
        let now = cluster.leader_with_quorum();
        if now != leader {
            eprintln!(
                "replica-state: leader {}, term {}",
                now.as_deref().unwrap_or("none"),
                cluster.term()
            );
            leader = now;
        }
        if servers.iter().any(|s| s.is_finished()) {
            anyhow::bail!("a replica server stopped");
        }
    }
}

/// Spawns each replica of `cluster` with its scheduler and its gRPC server on its Unix
/// socket in `args.dir`, dialling out from its own address.
fn serve_replicas(
    args: &StateArgs,
    cluster: &Cluster,
    addresses: &Arc<BTreeMap<String, Ipv4Addr>>,
    clock: Clock,
) -> anyhow::Result<Vec<JoinHandle<Result<(), tonic::transport::Error>>>> {
    let mut servers = Vec::new();
    for (slot, ip) in args.ips.iter().enumerate() {
        let host = replica_host(slot, 0);
        let dialer = FromReplica {
            source: *ip,
            replicas: addresses.clone(),
        };
        let replica = Replica::new(slot, &host, cluster.clone(), dialer, clock);
        tokio::spawn(scheduler::run(replica.clone()));
        let listener = bind_unix(&replica_socket(&args.dir, slot))?;
        let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
        servers.push(tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(limits::server(replica))
                .serve_with_incoming(incoming),
        ));
    }
    Ok(servers)
}

/// Serves each replica process's report connection (see [`serve_reports`]).
fn spawn_report_listener(
    listener: UnixListener,
    cluster: Cluster,
    reports: Arc<Reports>,
    clock: Clock,
) {
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(serve_reports(
                stream,
                cluster.clone(),
                reports.clone(),
                clock,
            ));
        }
    });
}

/// One replica process's report connection: `hello <slot>`, then `reach <slots>` lines;
/// answered with `vote <term> <leader slot>` whenever the leader that replica names
/// changes. Its end is the process's death.
async fn serve_reports(stream: UnixStream, cluster: Cluster, reports: Arc<Reports>, clock: Clock) {
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read).lines();
    let Ok(Some(hello)) = lines.next_line().await else {
        return;
    };
    let Some(slot) = hello
        .strip_prefix("hello ")
        .and_then(|s| s.parse::<usize>().ok())
        .filter(|s| *s < cluster.hosts().len())
    else {
        return;
    };
    let host = replica_host(slot, 0);
    {
        let mut slots = reports.slots.lock().expect("reports lock");
        slots[slot] = Report {
            connected: true,
            at: Some(Instant::now()),
            reaches: BTreeSet::new(),
        };
    }
    cluster.started(slot, &host, (clock.elapsed)());
    let votes = {
        let cluster = cluster.clone();
        tokio::spawn(async move {
            let mut told = None;
            loop {
                let leader = match cluster.role(slot) {
                    Role::Leader => Some(slot),
                    Role::Follower { leader } => leader.and_then(|l| cluster.slot_of(&l)),
                };
                // Only a change of the leader named is news (a stale leader cut off from
                // the majority keeps naming itself at its old term).
                if let Some(leader) = leader.filter(|l| told != Some(*l)) {
                    let term = cluster.term();
                    if write
                        .write_all(format!("vote {term} {leader}\n").as_bytes())
                        .await
                        .is_err()
                    {
                        return;
                    }
                    told = Some(leader);
                }
                tokio::time::sleep(PING_EVERY).await;
            }
        })
    };
    while let Ok(Some(line)) = lines.next_line().await {
        let Some(list) = line.strip_prefix("reach") else {
            continue;
        };
        let reaches = list
            .split(',')
            .filter_map(|s| s.trim().parse::<usize>().ok())
            .collect();
        let mut slots = reports.slots.lock().expect("reports lock");
        slots[slot].at = Some(Instant::now());
        slots[slot].reaches = reaches;
    }
    votes.abort();
    reports.slots.lock().expect("reports lock")[slot].connected = false;
    cluster.died(&host, (clock.elapsed)());
}

/// `spur-sim replica`: one replica's process.
pub fn replica_main(args: ReplicaArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.slot < args.ips.len(),
        "--slot {} but only {} addresses given",
        args.slot,
        args.ips.len()
    );
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(run_replica(args))
}

async fn run_replica(args: ReplicaArgs) -> anyhow::Result<()> {
    let me = args.ips[args.slot];
    let name = replica_host(args.slot, 0);
    let clients = TcpListener::bind((me, CLIENT_PORT))
        .await
        .map_err(|e| anyhow::anyhow!("bind {me}:{CLIENT_PORT}: {e}"))?;
    let peers = TcpListener::bind((me, RAFT_PORT))
        .await
        .map_err(|e| anyhow::anyhow!("bind {me}:{RAFT_PORT}: {e}"))?;
    // The state process may still be starting: wait for its socket.
    let report = loop {
        match UnixStream::connect(report_socket(&args.dir)).await {
            Ok(stream) => break stream,
            Err(_) => tokio::time::sleep(PING_EVERY).await,
        }
    };
    eprintln!("simulated replica {name} on {me}:{CLIENT_PORT}");
    let backend = replica_socket(&args.dir, args.slot);
    tokio::spawn(async move {
        while let Ok((inbound, _)) = clients.accept().await {
            let backend = backend.clone();
            tokio::spawn(async move {
                let _ = inbound.set_nodelay(true);
                if let Ok(outbound) = UnixStream::connect(&backend).await {
                    let (mut inbound, mut outbound) = (inbound, outbound);
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    tokio::spawn(async move {
        while let Ok((stream, _)) = peers.accept().await {
            tokio::spawn(echo(stream));
        }
    });
    let answered: Arc<Mutex<BTreeMap<usize, Instant>>> = Arc::default();
    for (slot, ip) in args.ips.iter().enumerate() {
        if slot != args.slot {
            tokio::spawn(ping(me, *ip, slot, answered.clone()));
        }
    }
    let (read, mut write) = report.into_split();
    write
        .write_all(format!("hello {}\n", args.slot).as_bytes())
        .await?;
    let reporter = report_reach(write, answered);
    let votes = async move {
        let mut lines = BufReader::new(read).lines();
        while let Some(line) = lines.next_line().await? {
            let mut words = line.split_whitespace().skip(1);
            if let (Some(term), Some(Ok(leader))) =
                (words.next(), words.next().map(str::parse::<usize>))
            {
                eprintln!("simulated replica vote: T{term}-N{}:committed", leader + 1);
            }
        }
        Ok::<(), std::io::Error>(())
    };
    // Either end closing means the state process is gone: so is this replica.
    tokio::select! {
        result = reporter => result?,
        result = votes => result?,
    }
    anyhow::bail!("the state process closed the report connection")
}

/// Reports the peers whose pings came back within [`STALE`], every [`PING_EVERY`], until
/// the state process hangs up.
async fn report_reach(
    mut write: tokio::net::unix::OwnedWriteHalf,
    answered: Arc<Mutex<BTreeMap<usize, Instant>>>,
) -> std::io::Result<()> {
    loop {
        let now = Instant::now();
        let reached: Vec<String> = answered
            .lock()
            .expect("pings lock")
            .iter()
            .filter(|(_, at)| now.duration_since(**at) < STALE)
            .map(|(slot, _)| slot.to_string())
            .collect();
        let line = format!("reach {}\n", reached.join(","));
        write.write_all(line.as_bytes()).await?;
        tokio::time::sleep(PING_EVERY).await;
    }
}

/// Answers a peer's pings: each byte back as it came.
async fn echo(mut stream: TcpStream) {
    let mut byte = [0u8; 1];
    while stream.read_exact(&mut byte).await.is_ok() {
        if stream.write_all(&byte).await.is_err() {
            return;
        }
    }
}

/// Pings the peer at `peer` from `me`, noting in `answered` when it last answered.
async fn ping(
    me: Ipv4Addr,
    peer: Ipv4Addr,
    slot: usize,
    answered: Arc<Mutex<BTreeMap<usize, Instant>>>,
) {
    let addr = SocketAddr::new(peer.into(), RAFT_PORT);
    loop {
        let connected = tokio::time::timeout(PING_BOUND, connect_from(me, addr)).await;
        let Ok(Ok(mut stream)) = connected else {
            tokio::time::sleep(PING_EVERY).await;
            continue;
        };
        let _ = stream.set_nodelay(true);
        loop {
            let round = async {
                stream.write_all(&[1]).await?;
                let mut byte = [0u8; 1];
                stream.read_exact(&mut byte).await?;
                Ok::<(), std::io::Error>(())
            };
            match tokio::time::timeout(PING_BOUND, round).await {
                Ok(Ok(())) => {
                    answered
                        .lock()
                        .expect("pings lock")
                        .insert(slot, Instant::now());
                }
                _ => break,
            }
            tokio::time::sleep(PING_EVERY).await;
        }
        tokio::time::sleep(PING_EVERY).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reports(slots: Vec<Report>) -> Reports {
        Reports {
            hosts: (0..slots.len()).map(|s| (replica_host(s, 0), s)).collect(),
            slots: Mutex::new(slots),
        }
    }

    fn report(at: Instant, reaches: &[usize]) -> Report {
        Report {
            connected: true,
            at: Some(at),
            reaches: reaches.iter().copied().collect(),
        }
    }

    #[test]
    fn two_replicas_talk_only_while_both_report_and_each_reaches_the_other() {
        let now = Instant::now();
        let world = reports(vec![
            report(now, &[1, 2]),
            report(now, &[0]),
            report(now, &[0]),
        ]);
        assert!(world.talks("spurctld-0", "spurctld-1"));
        assert!(world.talks("spurctld-2", "spurctld-0"));
        // 1 and 2 do not list each other: a partition between their addresses.
        assert!(!world.talks("spurctld-1", "spurctld-2"));
        // Half a reach is no reach: a one-way drop stops every ping's round trip anyway.
        let one_way = reports(vec![report(now, &[1]), report(now, &[]), report(now, &[])]);
        assert!(!one_way.talks("spurctld-0", "spurctld-1"));
        assert!(!world.talks("spurctld-0", "spurctld-9"));
    }

    #[test]
    fn a_replica_that_stops_reporting_is_frozen_and_one_that_hung_up_is_dead_not_frozen() {
        let now = Instant::now();
        let long_ago = now - STALE - Duration::from_millis(1);
        let mut hung_up = report(now, &[0, 1]);
        hung_up.connected = false;
        let world = reports(vec![
            report(now, &[1, 2]),
            report(long_ago, &[0, 2]),
            hung_up,
        ]);
        assert!(!world.is_frozen("spurctld-0"));
        assert!(world.is_frozen("spurctld-1"));
        assert!(
            !world.talks("spurctld-0", "spurctld-1"),
            "a stopped process talks to nobody"
        );
        assert!(!world.is_frozen("spurctld-2"));
        assert!(
            !world.talks("spurctld-0", "spurctld-2"),
            "a dead process talks to nobody"
        );
    }
}
