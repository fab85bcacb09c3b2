//! One turmoil simulation per seed: the network, the controller replicas, the faults, the
//! trace. The rest of the simulation (the API server, the operator, the scenarios) adds its
//! hosts to a [`World`] and drives it.
//!
//! ```no_run
//! # use spur_sim::world::{World, KillMode};
//! # use std::time::Duration;
//! let mut world = World::new(42);
//! world.start_controllers();
//! let dialer = world.dialer("operator"); // routes `spurctld:6817` like kube-proxy
//! world.client("operator", async move { /* real tonic over `dialer` */ Ok(()) });
//! world.at(Duration::from_secs(30), |w| {
//!     let leader = w.leader().expect("a leader");
//!     w.kill(&leader, KillMode::Silent);
//! });
//! world.run().unwrap();
//! println!("{}", world.trace_hash());
//! ```

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::determinism::{epoch, rng_for, sim_elapsed};
use crate::net::{
    FreezableListener, NetConfig, Network, ServiceDialer, SimListener, TurmoilDialer,
};
pub use spur_fakes::clock::WorldTime;
use spur_fakes::model::state::LogEntry;
use spur_fakes::model::{Clock, Cluster, ControllerConfig, Replica, scheduler};
use spur_judge::trace::Trace;

pub use spur_judge::hosts::CONTROLLER_SERVICE;

/// Everything a world is built from, besides the seed.
#[derive(Clone, Debug)]
pub struct WorldConfig {
    /// The network's tunables.
    pub net: NetConfig,
    /// The controller replicas' tunables.
    pub controller: ControllerConfig,
    /// turmoil's step: 1 ms resolves every timeout the operator uses.
    pub tick: Duration,
    /// A run longer than this (simulated) is an error: a stuck scenario fails instead of
    /// running forever.
    pub max_duration: Duration,
    /// Shortest one-way latency of a message: pods in one cluster.
    pub min_latency: Duration,
    /// Longest one-way latency of a message (turmoil draws between the two).
    pub max_latency: Duration,
}

impl Default for WorldConfig {
    fn default() -> Self {
        Self {
            net: NetConfig::default(),
            controller: ControllerConfig::default(),
            tick: Duration::from_millis(1),
            max_duration: Duration::from_secs(3600),
            min_latency: Duration::from_micros(200),
            max_latency: Duration::from_millis(5),
        }
    }
}

/// How a pod dies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KillMode {
    /// Partitioned from everyone, then crashed: its address stops answering, open
    /// connections to it hang and new connects time out (a killed pod's IP, or a frozen
    /// process).
    Silent,
    /// Crashed: its connections close with FIN or reset, connects are refused.
    Graceful,
}

type Action = Box<dyn FnOnce(&mut World)>;

/// One simulated world for one seed.
pub struct World {
    sim: turmoil::Sim<'static>,
    seed: u64,
    net: Network,
    cluster: Cluster,
    trace: Trace,
    /// Registered hosts, to cut a silently killed one off from all of them.
    hosts: BTreeSet<String>,
    /// Actions due at a simulated time, in (time, order added).
    actions: Vec<(Duration, u64, Action)>,
    actions_added: u64,
    /// Simulated time as of the last step, for clocks read outside any host.
    time: WorldTime,
    /// Every cut that held traffic (partitions and freezes), in the order made.
    cuts: Vec<Cut>,
    /// How long after a heal what the cut held has surely landed: a message's longest
    /// latency, twice (a request and the segment that completes it), and a few steps.
    landing: Duration,
}

pub use spur_judge::records::Cut;
use spur_judge::records::ordered_pair;

impl World {
    /// A world with the default configuration.
    pub fn new(seed: u64) -> Self {
        Self::with_config(seed, WorldConfig::default())
    }

    /// A world for `seed`: turmoil, the Service's picks and the elections all draw from it.
    pub fn with_config(seed: u64, config: WorldConfig) -> Self {
        crate::determinism::seed_process(seed);
        let sim = turmoil::Builder::new()
            .rng_seed(seed)
            .epoch(epoch())
            .tick_duration(config.tick)
            .simulation_duration(config.max_duration)
            .min_message_latency(config.min_latency)
            .max_message_latency(config.max_latency)
            .build();
        let trace = Trace::new();
        let net = Network::new(config.net, rng_for(seed, "service"), trace.clone());
        net.add_service(CONTROLLER_SERVICE);
        let cluster = Cluster::new(
            config.controller,
            rng_for(seed, "election"),
            Some(Arc::new(net.clone())),
            trace.clone(),
        );
        trace.record(Duration::ZERO, "harness", format!("world seed={seed}"));
        Self {
            sim,
            seed,
            net,
            cluster,
            trace,
            hosts: BTreeSet::new(),
            actions: Vec::new(),
            actions_added: 0,
            time: WorldTime::default(),
            cuts: Vec::new(),
            landing: config.max_latency * 2 + config.tick * 10,
        }
    }

    /// Every cut that held traffic so far, in the order made.
    pub fn cuts(&self) -> &[Cut] {
        &self.cuts
    }

    fn cut(&mut self, a: &str, b: &str) {
        self.record_cut(a, b);
        self.sim.hold(a, b);
    }

    fn heal(&mut self, a: &str, b: &str) {
        self.record_heal(a, b);
        self.sim.release(a, b);
    }

    /// Records that what passes between `a` and `b` is held from now (by a cut, or by a
    /// frozen process that reads nothing), for the checks that judge a message landing
    /// after the heal by when it was sent.
    fn record_cut(&mut self, a: &str, b: &str) {
        self.cuts.push(Cut {
            hosts: ordered_pair(a, b),
            from: self.sim.elapsed(),
            healed: None,
            landed_by: None,
        });
    }

    fn record_heal(&mut self, a: &str, b: &str) {
        let now = self.sim.elapsed();
        let hosts = ordered_pair(a, b);
        let landing = self.landing;
        if let Some(cut) = self
            .cuts
            .iter_mut()
            .rev()
            .find(|c| c.hosts == hosts && c.healed.is_none())
        {
            cut.healed = Some(now);
            cut.landed_by = Some(now + landing);
        }
    }

    /// The seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The network record (partitions, black holes, Services).
    pub fn net(&self) -> &Network {
        &self.net
    }

    /// The controller replicas' shared state: leader, term, the log.
    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    /// The trace.
    pub fn trace(&self) -> &Trace {
        &self.trace
    }

    /// The trace's hash so far.
    pub fn trace_hash(&self) -> String {
        self.trace.hash_hex()
    }

    /// Simulated time since the start.
    pub fn elapsed(&self) -> Duration {
        self.sim.elapsed()
    }

    /// The world's simulated time, for clocks read outside any host.
    pub fn time(&self) -> WorldTime {
        self.time.clone()
    }

    /// The current leader's host, if a leader is elected and alive.
    pub fn leader(&self) -> Option<String> {
        self.cluster.leader()
    }

    /// A copy of the replicated log, for checks.
    pub fn log(&self) -> Vec<LogEntry> {
        self.cluster.log()
    }

    /// A dialer for software on `local` that routes `spurctld` like kube-proxy.
    pub fn dialer(&self, local: &str) -> ServiceDialer {
        self.net.dialer(local)
    }

    /// A dialer for software on `local` without Services.
    pub fn plain_dialer(&self, local: &str) -> TurmoilDialer {
        self.net.plain_dialer(local)
    }

    fn register(&mut self, name: &str) {
        self.hosts.insert(name.to_owned());
        self.trace
            .record(self.sim.elapsed(), "harness", format!("host {name} added"));
    }

    /// Adds test code as a turmoil client: the run ends when every client finished.
    pub fn client(
        &mut self,
        name: &str,
        software: impl Future<Output = turmoil::Result> + 'static,
    ) {
        self.register(name);
        self.sim.client(name, software);
    }

    /// Adds a host whose software `software` builds (again after a restart).
    pub fn host<F, Fut>(&mut self, name: &str, software: F)
    where
        F: Fn() -> Fut + 'static,
        Fut: Future<Output = turmoil::Result> + 'static,
    {
        self.register(name);
        self.sim.host(name, software);
    }

    /// Starts every controller replica's current pod.
    pub fn start_controllers(&mut self) {
        for slot in 0..self.cluster.config().replicas {
            self.start_replica(slot);
        }
    }

    /// Starts the current pod of replica `slot` as a host serving `slurm.SlurmController`.
    pub fn start_replica(&mut self, slot: usize) {
        let host = self.cluster.host_of(slot);
        let cluster = self.cluster.clone();
        let net = self.net.clone();
        let name = host.clone();
        self.host(&host, move || {
            serve_replica(slot, name.clone(), cluster.clone(), net.clone())
        });
    }

    /// Kills the host `name`. A controller replica leaves its Service after the
    /// propagation delay and its slot stays empty until [`World::replace_replica`].
    pub fn kill(&mut self, name: &str, mode: KillMode) {
        let now = self.sim.elapsed();
        self.trace
            .record(now, "harness", format!("kill {name} ({mode:?})"));
        self.net.mark_down(name);
        if mode == KillMode::Silent {
            self.net.black_hole(name);
            for other in &self.hosts {
                if other != name {
                    self.sim.partition(name, other.as_str());
                }
            }
        }
        self.sim.crash(name);
        if self.cluster.slot_of(name).is_some() {
            self.cluster.died(name, now);
            self.net
                .set_endpoint_ready(CONTROLLER_SERVICE, name, false, now);
        }
    }

    /// Restarts the software of host `name` in place (same name and address), as a
    /// process restart does. Partitions made by a silent kill stay until repaired.
    pub fn restart(&mut self, name: &str) {
        self.trace
            .record(self.sim.elapsed(), "harness", format!("restart {name}"));
        self.net.revive(name);
        self.sim.bounce(name);
    }

    /// Kills the current pod of replica `slot`; returns its host.
    pub fn kill_replica(&mut self, slot: usize, mode: KillMode) -> String {
        let host = self.cluster.host_of(slot);
        self.kill(&host, mode);
        host
    }

    /// Kills the current leader; returns its host, or `None` without a leader.
    pub fn kill_leader(&mut self, mode: KillMode) -> Option<String> {
        let leader = self.leader()?;
        self.kill(&leader, mode);
        Some(leader)
    }

    /// Starts a replacement pod for replica `slot` (a new host with a new address, as a
    /// StatefulSet does); returns its host name.
    pub fn replace_replica(&mut self, slot: usize) -> String {
        let host = self.cluster.replace(slot);
        self.trace.record(
            self.sim.elapsed(),
            "harness",
            format!("replace replica {slot} with {host}"),
        );
        self.start_replica(slot);
        host
    }

    /// Cuts `a` off from `b` (both ways). New connects between them go unanswered (the
    /// dialer retransmits SYNs as a kernel does); what the open connections send, and what
    /// was on its way, is held, not lost: a kernel retransmits it, and it arrives once the
    /// cut heals (see [`World::repair`]).
    pub fn partition(&mut self, a: &str, b: &str) {
        self.trace.record(
            self.sim.elapsed(),
            "harness",
            format!("partition {a} | {b}"),
        );
        self.net.partition(a, b);
        self.cut(a, b);
    }

    /// Heals a partition between `a` and `b`, delivering what it held. A kernel delivers
    /// it at the connection's next retransmission, up to one retransmission timeout after
    /// the heal; turmoil's links carry every connection between two hosts at once, and new
    /// connects must pass at the heal, so the held segments arrive at the heal: the model
    /// is early by at most that timeout for a connection that had data in flight
    /// (`spur-sim lab-heal` measures the kernel's side). Held, not dropped, because
    /// turmoil's TCP never retransmits: an h2 connection that lost a frame would hang for
    /// good after the heal, which no kernel does.
    pub fn repair(&mut self, a: &str, b: &str) {
        self.trace
            .record(self.sim.elapsed(), "harness", format!("repair {a} | {b}"));
        self.net.repair(a, b);
        self.heal(a, b);
    }

    /// Freezes host `name` (a SIGSTOPped process): it reads, answers and sends nothing,
    /// and talks to no replica, while its kernel still completes handshakes and takes in
    /// what is sent ([`crate::net::Freezable`]); unlike a kill it stays a ready endpoint of
    /// its Service, as a tcpSocket probe still connects to it.
    pub fn freeze(&mut self, name: &str) {
        self.trace
            .record(self.sim.elapsed(), "harness", format!("freeze {name}"));
        self.net.freeze(name);
        // What it takes in meanwhile is read at the thaw, as a healed cut delivers it.
        for other in self.others(name) {
            self.record_cut(name, &other);
        }
    }

    /// Thaws a host [`World::freeze`] froze: it reads what waited for it, and answers.
    pub fn thaw(&mut self, name: &str) {
        self.trace
            .record(self.sim.elapsed(), "harness", format!("thaw {name}"));
        self.net.thaw(name);
        for other in self.others(name) {
            self.record_heal(name, &other);
        }
    }

    /// Every registered host but `name`.
    fn others(&self, name: &str) -> Vec<String> {
        self.hosts.iter().filter(|h| *h != name).cloned().collect()
    }

    /// Runs `action` on the world when simulated time reaches `at`.
    pub fn at(&mut self, at: Duration, action: impl FnOnce(&mut World) + 'static) {
        self.actions_added += 1;
        self.actions
            .push((at, self.actions_added, Box::new(action)));
        self.actions.sort_by_key(|(at, order, _)| (*at, *order));
    }

    /// One step: due actions, elections, then every host for one tick. Returns whether
    /// every client finished.
    pub fn step(&mut self) -> turmoil::Result<bool> {
        let now = self.sim.elapsed();
        self.time.set(now);
        while self.actions.first().is_some_and(|(at, _, _)| *at <= now) {
            let (_, _, action) = self.actions.remove(0);
            action(self);
        }
        self.cluster.tick(now);
        let done = self.sim.step();
        self.time.set(self.sim.elapsed());
        done
    }

    /// Runs until every client finished (an error if one failed or time ran out).
    pub fn run(&mut self) -> turmoil::Result {
        while !self.step()? {}
        Ok(())
    }

    /// Runs until simulated time `until` (clients may still run).
    pub fn run_until(&mut self, until: Duration) -> turmoil::Result {
        while self.sim.elapsed() < until {
            self.step()?;
        }
        Ok(())
    }
}

/// The software of one replica pod: listen, become ready, schedule, serve.
async fn serve_replica(
    slot: usize,
    host: String,
    cluster: Cluster,
    net: Network,
) -> turmoil::Result {
    // Its connections stop while the host is frozen; its kernel still accepts them.
    let listener = FreezableListener::new(
        SimListener::bind(cluster.config().port).await?,
        &host,
        net.clone(),
    );
    cluster.started(slot, &host, sim_elapsed());
    net.set_endpoint_ready(CONTROLLER_SERVICE, &host, true, sim_elapsed());
    let cluster_calls = cluster.clone();
    let replica = Replica::new(
        slot,
        &host,
        cluster,
        net.plain_dialer(&host),
        Clock::simulated(),
    );
    tokio::spawn(scheduler::run(replica.clone()));
    tonic::transport::Server::builder()
        .layer(spur_fakes::model::calls::recorder(cluster_calls, host))
        .add_service(spur_fakes::model::limits::server(replica))
        .serve_with_incoming(spur_operator::net::incoming(listener))
        .await?;
    Ok(())
}
