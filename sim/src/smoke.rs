//! `spur-sim world-smoke`: a small fixed scenario whose trace hash shows that a seed
//! replays exactly, also across processes.
//!
//! Smaller than any scenario, so a cross-process check stays quick: a client registers a
//! node whose agent is [`FakeAgent`], submits jobs through the `spurctld` Service, loses
//! the leader (killed gracefully at 20 s), submits more, and waits until the agent ran
//! every job.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use spur_operator::net::Dialer;
use spur_proto as pb;
use spur_proto::{SlurmAgentServer, SlurmControllerClient};
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Response, Status};

use crate::determinism::sim_elapsed;
use spur_operator::net::Connector;

use crate::net::{ServiceDialer, SimListener};
use crate::world::{KillMode, World};

/// What a smoke run produced.
#[derive(Clone, Debug)]
pub struct SmokeReport {
    pub seed: u64,
    pub trace_hash: String,
    pub sim_secs: f64,
    pub events: usize,
    /// The ids the client got for its submissions, in order.
    pub job_ids: Vec<u32>,
}

/// Why a smoke run failed.
#[derive(Debug, thiserror::Error)]
#[error("smoke run for seed {seed} failed: {message}")]
pub struct SmokeError {
    pub seed: u64,
    pub message: String,
}

/// A channel to the controller through `dialer` (`http://spurctld:6817`), with the bounds
/// of a careful client: 2 s to connect, 5 s per request.
pub async fn connect_controller<D: Dialer>(
    dialer: D,
) -> Result<SlurmControllerClient<Channel>, tonic::transport::Error> {
    let channel = Endpoint::from_static("http://spurctld:6817")
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(5))
        .connect_with_connector(Connector::new(dialer))
        .await?;
    Ok(SlurmControllerClient::new(channel))
}

/// Calls `call` on a fresh channel until it succeeds, 500 ms apart.
pub async fn until_ok<D, T, F, Fut>(dialer: &D, mut call: F) -> T
where
    D: Dialer,
    F: FnMut(SlurmControllerClient<Channel>) -> Fut,
    Fut: Future<Output = Result<T, Status>>,
{
    loop {
        if let Ok(client) = connect_controller(dialer.clone()).await
            && let Ok(value) = call(client).await
        {
            return value;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A minimal `SlurmAgent`: accepts every launch, "runs" the job for `run_for`, and reports
/// it completed through the Service.
#[derive(Clone)]
pub struct FakeAgent {
    dialer: ServiceDialer,
    run_for: Duration,
    launches: Arc<Mutex<Vec<pb::LaunchJobRequest>>>,
}

impl FakeAgent {
    /// An agent that dials the controller through `dialer`.
    pub fn new(dialer: ServiceDialer, run_for: Duration) -> Self {
        Self {
            dialer,
            run_for,
            launches: Arc::default(),
        }
    }

    /// Every launch received so far.
    pub fn launches(&self) -> Vec<pb::LaunchJobRequest> {
        self.launches.lock().expect("launches lock").clone()
    }

    /// Serves the agent on port 6818 of the current host.
    pub async fn serve(self) -> turmoil::Result {
        let listener = SimListener::bind(spur_proto::AGENT_PORT).await?;
        tonic::transport::Server::builder()
            .add_service(SlurmAgentServer::new(self))
            .serve_with_incoming(listener.incoming())
            .await?;
        Ok(())
    }
}

#[tonic::async_trait]
impl pb::SlurmAgent for FakeAgent {
    async fn launch_job(
        &self,
        request: Request<pb::LaunchJobRequest>,
    ) -> Result<Response<pb::LaunchJobResponse>, Status> {
        let launch = request.into_inner();
        self.launches
            .lock()
            .expect("launches lock")
            .push(launch.clone());
        let dialer = self.dialer.clone();
        let run_for = self.run_for;
        tokio::spawn(async move {
            tokio::time::sleep(run_for).await;
            let report = pb::ReportJobStatusRequest {
                job_id: launch.job_id,
                state: pb::JobState::JobCompleted as i32,
                exit_code: 0,
                reporting_node: launch.target_node.clone(),
                run_attempt: launch.run_attempt,
                ..Default::default()
            };
            until_ok(&dialer, |mut client| {
                let report = report.clone();
                async move { client.report_job_status(report).await }
            })
            .await;
        });
        Ok(Response::new(pb::LaunchJobResponse {
            success: true,
            ..Default::default()
        }))
    }

    async fn cancel_job(
        &self,
        _request: Request<pb::AgentCancelJobRequest>,
    ) -> Result<Response<()>, Status> {
        Ok(Response::new(()))
    }
}

/// Runs the smoke scenario for `seed`.
pub fn run(seed: u64) -> Result<SmokeReport, SmokeError> {
    let fail = |message: String| SmokeError { seed, message };
    let mut world = World::new(seed);
    world.start_controllers();

    let agent = FakeAgent::new(world.dialer("agent"), Duration::from_secs(3));
    world.host("agent", move || agent.clone().serve());

    world.at(Duration::from_secs(20), |world| {
        world.kill_leader(KillMode::Graceful);
    });

    let job_ids = Arc::new(Mutex::new(Vec::new()));
    let dialer = world.dialer("client");
    world.client("client", client(dialer, job_ids.clone()));

    world.run().map_err(|e| fail(e.to_string()))?;
    let job_ids = job_ids.lock().expect("ids lock").clone();
    Ok(SmokeReport {
        seed,
        trace_hash: world.trace_hash(),
        sim_secs: world.elapsed().as_secs_f64(),
        events: world.trace().events().len(),
        job_ids,
    })
}

/// The smoke client: registers the node, submits three jobs before the leader kill and
/// three after it (their ids into `ids`), and ends once the agent ran all six.
async fn client(dialer: ServiceDialer, ids: Arc<Mutex<Vec<u32>>>) -> turmoil::Result {
    register_node(&dialer).await;
    for n in 0..6 {
        if n == 3 {
            // Past the leader kill at 20 s.
            let wait = Duration::from_secs(21).saturating_sub(sim_elapsed());
            tokio::time::sleep(wait).await;
        }
        let id = submit(&dialer, n).await;
        ids.lock().expect("ids lock").push(id);
    }
    loop {
        let jobs = until_ok(&dialer, |mut client| async move {
            let response = client.get_jobs(pb::GetJobsRequest::default()).await?;
            Ok(response.into_inner().jobs)
        })
        .await;
        let done = jobs
            .iter()
            .filter(|job| job.state == pb::JobState::JobCompleted as i32)
            .count();
        if done == 6 {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Registers `node-1`, served by the agent host, until the controller accepts it.
async fn register_node(dialer: &ServiceDialer) {
    let register = pb::RegisterAgentRequest {
        hostname: "node-1".to_owned(),
        address: "agent".to_owned(),
        port: u32::from(spur_proto::AGENT_PORT),
        resources: Some(pb::ResourceSet {
            cpus: 8,
            memory_mb: 32_768,
            ..Default::default()
        }),
        ..Default::default()
    };
    until_ok(dialer, |mut client| {
        let register = register.clone();
        async move { client.register_agent(register).await }
    })
    .await;
}

/// Submits `job-<n>` until the controller takes it; returns its id.
async fn submit(dialer: &ServiceDialer, n: u32) -> u32 {
    let spec = pb::JobSpec {
        name: format!("job-{n}"),
        num_nodes: 1,
        comment: format!("smoke-{n}"),
        ..Default::default()
    };
    until_ok(dialer, |mut client| {
        let spec = spec.clone();
        async move {
            let response = client
                .submit_job(pb::SubmitJobRequest { spec: Some(spec) })
                .await?;
            Ok(response.into_inner().job_id)
        }
    })
    .await
}
