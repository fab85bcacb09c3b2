//! A small `slurm.SlurmAgent` inside the test: records every call the controller makes and
//! answers launches as the case's rule says.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use spur_proto as pb;
use tokio::sync::watch;
use tokio::time::Instant;
use tonic::{Request, Response, Status};

/// How the agent answers a LaunchJob.
#[derive(Clone, Debug)]
pub enum LaunchRule {
    /// Every launch succeeds at once.
    Accept,
    /// Every launch waits until [`TestAgent::release`], then succeeds.
    Hold,
    /// The first launch on this node is refused (`success: false`); all others succeed.
    RefuseFirstOn(String),
    /// Every launch is refused (`success: false`).
    RefuseAll,
}

#[derive(Default)]
struct Calls {
    launches: Vec<(pb::LaunchJobRequest, Instant)>,
    cancels: Vec<pb::AgentCancelJobRequest>,
    /// The `authorization` header of each call, in order.
    authorizations: Vec<Option<String>>,
    refused_once: bool,
}

/// The agent; clones share what it recorded.
#[derive(Clone)]
pub struct TestAgent {
    rule: LaunchRule,
    calls: Arc<Mutex<Calls>>,
    released: watch::Sender<bool>,
}

impl TestAgent {
    pub fn new(rule: LaunchRule) -> Self {
        Self {
            rule,
            calls: Arc::default(),
            released: watch::Sender::new(false),
        }
    }

    /// Lets held launches answer.
    pub fn release(&self) {
        self.released.send_replace(true);
    }

    /// The launches of `job_id` so far, in arrival order.
    pub fn launches(&self, job_id: u32) -> Vec<pb::LaunchJobRequest> {
        self.launch_times(job_id)
            .into_iter()
            .map(|(l, _)| l)
            .collect()
    }

    /// The launches of `job_id` with when each arrived.
    pub fn launch_times(&self, job_id: u32) -> Vec<(pb::LaunchJobRequest, Instant)> {
        let calls = self.calls.lock().unwrap();
        calls
            .launches
            .iter()
            .filter(|(l, _)| l.job_id == job_id)
            .cloned()
            .collect()
    }

    /// The signals of the cancels of `job_id` so far.
    pub fn cancels(&self, job_id: u32) -> Vec<i32> {
        let calls = self.calls.lock().unwrap();
        calls
            .cancels
            .iter()
            .filter(|c| c.job_id == job_id)
            .map(|c| c.signal)
            .collect()
    }

    /// The `authorization` header of every call so far.
    pub fn authorizations(&self) -> Vec<Option<String>> {
        self.calls.lock().unwrap().authorizations.clone()
    }

    /// Waits until `count` launches of `job_id` arrived; panics after `limit`.
    pub async fn wait_for_launches(&self, job_id: u32, count: usize, limit: Duration) {
        let start = Instant::now();
        while self.launch_times(job_id).len() < count {
            assert!(
                start.elapsed() < limit,
                "{count} launches of job {job_id} did not arrive in {limit:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn record_authorization<T>(&self, request: &Request<T>) {
        let header = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        self.calls.lock().unwrap().authorizations.push(header);
    }
}

#[tonic::async_trait]
impl pb::SlurmAgent for TestAgent {
    async fn launch_job(
        &self,
        request: Request<pb::LaunchJobRequest>,
    ) -> Result<Response<pb::LaunchJobResponse>, Status> {
        self.record_authorization(&request);
        let launch = request.into_inner();
        let refuse = {
            let mut calls = self.calls.lock().unwrap();
            calls.launches.push((launch.clone(), Instant::now()));
            match &self.rule {
                LaunchRule::RefuseFirstOn(node)
                    if *node == launch.target_node && !calls.refused_once =>
                {
                    calls.refused_once = true;
                    true
                }
                LaunchRule::RefuseAll => true,
                _ => false,
            }
        };
        if matches!(self.rule, LaunchRule::Hold) {
            let mut released = self.released.subscribe();
            let _ = released.wait_for(|r| *r).await;
        }
        Ok(Response::new(pb::LaunchJobResponse {
            success: !refuse,
            error: if refuse {
                "refused by the conformance agent".to_owned()
            } else {
                String::new()
            },
            ..Default::default()
        }))
    }

    async fn cancel_job(
        &self,
        request: Request<pb::AgentCancelJobRequest>,
    ) -> Result<Response<()>, Status> {
        self.record_authorization(&request);
        self.calls
            .lock()
            .unwrap()
            .cancels
            .push(request.into_inner());
        Ok(Response::new(()))
    }
}
