//! The simulated network: turmoil glue, the `spurctld` Service and the modelled kernel.
//!
//! turmoil moves the bytes. What turmoil does not model, this module adds:
//!
//! - **the kernel's SYN retries**: in turmoil a SYN to a partitioned host is dropped and the
//!   connect fails at once; on Linux the SYN is retransmitted (after 1, 2, 4, … s) and the
//!   connect fails only after about 127 s. [`TurmoilDialer`] checks the harness's record of
//!   partitions and dead hosts before each (re)transmission instead.
//! - **the Service** (`spurctld`): [`ServiceDialer`] picks a ready replica with the seeded
//!   RNG, as kube-proxy does, and drops the SYN (or refuses it) when none is ready. An
//!   endpoint change reaches the Service only after the propagation delay.
//!
//! [`Network`] holds that shared record; the [`crate::world::World`] keeps it in step with
//! turmoil's own partitions.

mod frozen;
mod io;
mod service;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use rand_chacha::ChaCha8Rng;
use spur_fakes::clock::sim_elapsed;
use spur_operator::net::Dialer;

pub use frozen::{Freezable, FreezableListener};
pub use io::{BareTurmoilDialer, SimListener, peer_host};
pub use service::ServiceDialer;
use service::ServiceTable;

use spur_judge::trace::Trace;

pub use spur_judge::service::{NoEndpoint, ServiceKind, ServiceSetup};

/// The network's tunables: every bound here is the kernel's or Kubernetes', not a choice
/// of ours.
#[derive(Clone, Debug)]
pub struct NetConfig {
    /// First SYN retransmission timeout. Linux: 1 s.
    pub syn_initial_rto: Duration,
    /// SYN retransmissions before the kernel gives up. Linux `tcp_syn_retries` = 6, which
    /// with a 1 s initial timeout doubling each time gives up after 127 s.
    pub syn_retries: u32,
    /// How long an endpoint change (ready or not) takes to reach the Service's routing.
    /// Kubernetes: the EndpointSlice controller and kube-proxy take about a second.
    pub endpoint_propagation: Duration,
    /// What the Service does with no ready endpoint. Default `Drop`, the seed's failure. A
    /// ClusterIP Service's only: a headless one has no address to send a SYN to.
    pub no_endpoint: NoEndpoint,
    /// The Service's kind. Default ClusterIP, the seed's cluster.
    pub service: ServiceKind,
}

impl Default for NetConfig {
    fn default() -> Self {
        Self {
            syn_initial_rto: Duration::from_secs(1),
            syn_retries: 6,
            endpoint_propagation: Duration::from_secs(1),
            no_endpoint: NoEndpoint::Drop,
            service: ServiceKind::ClusterIp,
        }
    }
}

impl NetConfig {
    /// When the kernel gives up on a SYN that is never answered: the initial timeout
    /// doubled over every retry, 1 + 2 + … + 64 = 127 s by default.
    pub fn syn_timeout(&self) -> Duration {
        (0..=self.syn_retries)
            .map(|i| self.syn_initial_rto * (1 << i))
            .sum()
    }
}

/// The harness's record of the network: which hosts are black holes (silently killed),
/// which pairs are partitioned, and the Services. Cloning shares it.
#[derive(Clone, Debug)]
pub struct Network {
    inner: Arc<Mutex<NetState>>,
    config: Arc<NetConfig>,
    trace: Trace,
}

#[derive(Debug)]
struct NetState {
    /// Hosts whose packets vanish: a pod killed silently keeps its address unanswered.
    black_holes: BTreeSet<String>,
    /// Hosts whose software is gone and whose connects are refused at once (a process
    /// that died: its pod's address answers no more). turmoil itself would hold a SYN to
    /// a crashed host forever, as it delivers nothing to a host that does not run.
    down: BTreeSet<String>,
    /// Partitioned pairs, smaller name first.
    partitions: BTreeSet<(String, String)>,
    /// Hosts whose processes are stopped (SIGSTOP): their kernel still completes
    /// handshakes and takes in what is sent, but nothing is read, answered or sent.
    frozen: BTreeSet<String>,
    /// The tasks of frozen hosts' connections, woken at a thaw.
    thaw_wakers: Vec<std::task::Waker>,
    /// Services by name.
    services: BTreeMap<String, ServiceTable>,
    /// The Services' picks among ready endpoints.
    rng: ChaCha8Rng,
}

impl NetState {
    fn reaches(&self, from: &str, to: &str) -> bool {
        !self.black_holes.contains(from)
            && !self.black_holes.contains(to)
            && !self.partitions.contains(&pair(from, to))
    }
}

fn pair(a: &str, b: &str) -> (String, String) {
    if a <= b {
        (a.to_owned(), b.to_owned())
    } else {
        (b.to_owned(), a.to_owned())
    }
}

impl Network {
    /// A network with no faults and no Services. `rng` drives the Services' picks.
    pub fn new(config: NetConfig, rng: ChaCha8Rng, trace: Trace) -> Self {
        Self {
            inner: Arc::new(Mutex::new(NetState {
                black_holes: BTreeSet::new(),
                down: BTreeSet::new(),
                partitions: BTreeSet::new(),
                frozen: BTreeSet::new(),
                thaw_wakers: Vec::new(),
                services: BTreeMap::new(),
                rng,
            })),
            config: Arc::new(config),
            trace,
        }
    }

    /// The network's tunables.
    pub fn config(&self) -> &NetConfig {
        &self.config
    }

    /// The trace events are recorded to.
    pub fn trace(&self) -> &Trace {
        &self.trace
    }

    fn state(&self) -> std::sync::MutexGuard<'_, NetState> {
        self.inner.lock().expect("network lock")
    }

    /// Makes `host` a black hole: nothing sent to it is ever answered.
    pub fn black_hole(&self, host: &str) {
        self.state().black_holes.insert(host.to_owned());
    }

    /// Marks `host` down: connects to it are refused at once.
    pub fn mark_down(&self, host: &str) {
        self.state().down.insert(host.to_owned());
    }

    /// `host` runs again (restarted in place): neither down nor a black hole.
    pub fn revive(&self, host: &str) {
        let mut state = self.state();
        state.down.remove(host);
        state.black_holes.remove(host);
    }

    /// Whether `host` is down (refusing connects).
    pub fn is_down(&self, host: &str) -> bool {
        self.state().down.contains(host)
    }

    /// Records a partition between `a` and `b` (the world applies it to turmoil too).
    pub fn partition(&self, a: &str, b: &str) {
        self.state().partitions.insert(pair(a, b));
    }

    /// Removes a partition between `a` and `b`.
    pub fn repair(&self, a: &str, b: &str) {
        self.state().partitions.remove(&pair(a, b));
    }

    /// Whether a packet from `from` reaches `to` (ignoring whether software runs there).
    pub fn can_reach(&self, from: &str, to: &str) -> bool {
        self.state().reaches(from, to)
    }

    /// Stops `host`'s processes (SIGSTOP). Unlike a partition, its kernel goes on: a
    /// connect to it completes and what is sent to it is taken in, but its connections
    /// (see [`Freezable`]) read, answer and send nothing until [`Network::thaw`], and it
    /// talks to no replica ([`Network::talks`]).
    pub fn freeze(&self, host: &str) {
        self.state().frozen.insert(host.to_owned());
    }

    /// Lets `host`'s processes run again (SIGCONT): they read what waited for them.
    pub fn thaw(&self, host: &str) {
        let wakers = {
            let mut state = self.state();
            state.frozen.remove(host);
            std::mem::take(&mut state.thaw_wakers)
        };
        for waker in wakers {
            waker.wake();
        }
    }

    /// Whether `host`'s processes are stopped.
    pub fn is_frozen(&self, host: &str) -> bool {
        self.state().frozen.contains(host)
    }

    /// Ready while `host` runs; while it is frozen, pending until the thaw.
    fn poll_running(&self, host: &str, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        let mut state = self.state();
        if state.frozen.contains(host) {
            state.thaw_wakers.push(cx.waker().clone());
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    }

    /// Whether the processes on `a` and `b` exchange messages: packets pass and neither
    /// is frozen (what Raft's heartbeats and votes need).
    pub fn talks(&self, a: &str, b: &str) -> bool {
        // One lock: the cluster asks this for every pair of replicas on every step.
        let state = self.state();
        state.reaches(a, b) && !state.frozen.contains(a) && !state.frozen.contains(b)
    }

    /// Declares a Service `name`, with no endpoints yet. It forwards a connection to the
    /// same port on the endpoint it picks.
    pub fn add_service(&self, name: &str) {
        self.state()
            .services
            .insert(name.to_owned(), ServiceTable::new());
    }

    /// Marks `host` ready or not behind Service `service`, as of simulated time `now`.
    /// The Service sees the change after the propagation delay.
    pub fn set_endpoint_ready(&self, service: &str, host: &str, ready: bool, now: Duration) {
        let delay = self.config.endpoint_propagation;
        let mut state = self.state();
        if let Some(table) = state.services.get_mut(service)
            && table.set_ready(host, ready, now, delay)
        {
            drop(state);
            let word = if ready { "ready" } else { "not ready" };
            self.trace
                .record(now, "harness", format!("endpoint {service}/{host} {word}"));
        }
    }

    /// The endpoints of `service` the Service routes to at `now`.
    pub fn ready_endpoints(&self, service: &str, now: Duration) -> Vec<String> {
        let delay = self.config.endpoint_propagation;
        self.state()
            .services
            .get(service)
            .map(|table| table.visible_ready(now, delay))
            .unwrap_or_default()
    }

    /// The Service named by `host` (`spurctld` or `spurctld.<namespace>…`), if any.
    fn service_for(&self, host: &str) -> Option<String> {
        let state = self.state();
        state
            .services
            .keys()
            .find(|name| {
                host == name.as_str()
                    || host
                        .strip_prefix(name.as_str())
                        .is_some_and(|rest| rest.starts_with('.'))
            })
            .cloned()
    }

    /// Picks a ready endpoint of `service` with the seeded RNG, like kube-proxy.
    fn pick_endpoint(&self, service: &str, now: Duration) -> Option<String> {
        let delay = self.config.endpoint_propagation;
        let mut state = self.state();
        let NetState { services, rng, .. } = &mut *state;
        let ready = services.get(service)?.visible_ready(now, delay);
        if ready.is_empty() {
            return None;
        }
        let index = rand::RngExt::random_range(rng, 0..ready.len());
        Some(ready[index].clone())
    }

    /// A dialer for software on `local`, with the Services routed.
    pub fn dialer(&self, local: &str) -> ServiceDialer {
        ServiceDialer::new(self.plain_dialer(local))
    }

    /// A dialer for software on `local` that knows no Services.
    pub fn plain_dialer(&self, local: &str) -> TurmoilDialer {
        TurmoilDialer {
            net: self.clone(),
            local: Arc::from(local),
        }
    }
}

/// Opens turmoil TCP streams from one host, with the kernel's SYN retries modelled: while
/// the peer is partitioned away or dead silently, the SYN is retransmitted on the kernel's
/// schedule and the connect fails with `TimedOut` after [`NetConfig::syn_timeout`].
#[derive(Clone, Debug)]
pub struct TurmoilDialer {
    net: Network,
    local: Arc<str>,
}

impl TurmoilDialer {
    /// The host this dialer connects from.
    pub fn local(&self) -> &str {
        &self.local
    }

    /// The network this dialer uses.
    pub fn network(&self) -> &Network {
        &self.net
    }
}

/// The error of a SYN the kernel gave up on.
pub(crate) fn syn_timed_out(host: &str, port: u16) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("connect to {host}:{port}: connection timed out (SYN never answered)"),
    )
}

impl Dialer for TurmoilDialer {
    type Stream = turmoil::net::TcpStream;

    fn dial(
        &self,
        host: &str,
        port: u16,
    ) -> BoxFuture<'static, std::io::Result<turmoil::net::TcpStream>> {
        let net = self.net.clone();
        let local = self.local.clone();
        let host = host.to_owned();
        Box::pin(async move {
            let mut rto = net.config.syn_initial_rto;
            let mut retries_left = net.config.syn_retries;
            while !net.can_reach(&local, &host) {
                if rto == net.config.syn_initial_rto {
                    net.trace.record(
                        sim_elapsed(),
                        &local,
                        format!("SYN to {host}:{port} unanswered"),
                    );
                }
                tokio::time::sleep(rto).await;
                if retries_left == 0 {
                    net.trace.record(
                        sim_elapsed(),
                        &local,
                        format!("connect to {host}:{port} timed out (kernel)"),
                    );
                    return Err(syn_timed_out(&host, port));
                }
                retries_left -= 1;
                rto *= 2;
            }
            if net.is_down(&host) {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::ConnectionRefused,
                    format!("connect to {host}:{port}: connection refused"),
                ));
            }
            turmoil::net::TcpStream::connect((host.as_str(), port)).await
        })
    }
}

/// The replicas learn who reaches whom from the simulated network's faults.
impl spur_fakes::model::cluster::Reach for Network {
    fn talks(&self, a: &str, b: &str) -> bool {
        Network::talks(self, a, b)
    }

    fn is_frozen(&self, host: &str) -> bool {
        Network::is_frozen(self, host)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_syn_timeout_is_linux_127_seconds() {
        assert_eq!(NetConfig::default().syn_timeout(), Duration::from_secs(127));
    }
}
