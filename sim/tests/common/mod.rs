//! Helpers shared by the simulation's tests.
#![allow(dead_code)]

pub mod kubectl;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use spur_operator::net::Connector;
use spur_operator::net::Dialer;
use spur_proto as pb;
use spur_proto::SlurmControllerClient;
use spur_sim::world::{KillMode, World};
use tonic::transport::{Channel, Endpoint};

/// Simulated time on the current host.
pub fn now() -> Duration {
    spur_sim::determinism::sim_elapsed()
}

/// An unbounded channel to `host:6817` through `dialer` (no connect timeout, no keepalive,
/// no request bound) unless the caller configures `endpoint`.
pub async fn channel<D: Dialer>(
    dialer: D,
    host: &str,
    endpoint: impl FnOnce(Endpoint) -> Endpoint,
) -> Result<SlurmControllerClient<Channel>, tonic::transport::Error> {
    let endpoint = endpoint(Endpoint::from_shared(format!("http://{host}:6817")).unwrap());
    let channel = endpoint
        .connect_with_connector(Connector::new(dialer))
        .await?;
    Ok(SlurmControllerClient::new(channel))
}

/// Waits (in simulated time) until the cluster has a leader; returns it.
pub async fn wait_for_leader(cluster: &spur_fakes::model::Cluster) -> String {
    loop {
        if let Some(leader) = cluster.leader() {
            return leader;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Kill requests from test code inside the simulation, carried out by [`run_with_kills`].
#[derive(Clone, Default)]
pub struct KillSwitch {
    requests: Arc<Mutex<Vec<(String, KillMode)>>>,
}

impl KillSwitch {
    /// Asks the harness to kill `host`; it happens before the next tick.
    pub async fn kill(&self, host: &str, mode: KillMode) {
        self.requests.lock().unwrap().push((host.to_owned(), mode));
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Runs `world` until its clients finish, carrying out the kills they ask for.
pub fn run_with_kills(world: &mut World, kills: &KillSwitch) {
    loop {
        let requests: Vec<_> = kills.requests.lock().unwrap().drain(..).collect();
        for (host, mode) in requests {
            world.kill(&host, mode);
        }
        if world.step().expect("simulation failed") {
            return;
        }
    }
}

/// A job spec with a name and comment.
pub fn job(name: &str) -> pb::JobSpec {
    pb::JobSpec {
        name: name.to_owned(),
        num_nodes: 1,
        comment: format!("spurjob-uid={name}"),
        ..Default::default()
    }
}

/// A request submitting `job(name)`.
pub fn submit(name: &str) -> pb::SubmitJobRequest {
    pb::SubmitJobRequest {
        spec: Some(job(name)),
    }
}

/// How finely the named scenarios sample the world when measuring a lag.
pub const SAMPLE: Duration = Duration::from_millis(100);

/// A duration as the scenarios print it.
pub fn s(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

/// Runs until `done` holds (sampled every [`SAMPLE`]) or until `limit`; returns when it
/// first held.
pub fn run_until_true(
    sim: &mut spur_sim::harness::Sim,
    limit: Duration,
    done: impl Fn(&spur_sim::harness::Sim) -> bool,
) -> Option<Duration> {
    loop {
        if done(sim) {
            return Some(sim.world.elapsed());
        }
        if sim.world.elapsed() >= limit {
            return None;
        }
        let next = sim.world.elapsed() + SAMPLE;
        sim.world.run_until(next).expect("the world runs");
    }
}
