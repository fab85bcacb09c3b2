//! The leader's scheduler: pending jobs onto registered idle nodes, then
//! `SlurmAgent.LaunchJob` on the address and port each node registered, once per node.

use spur_operator::net::Dialer;
use spur_proto as pb;
use spur_proto::SlurmAgentClient;
use tonic::transport::{Channel, Endpoint};

use super::Replica;
use super::cluster::Role;
use super::state::Command;
use crate::net::DialerConnector;

/// One `LaunchJob` call to make.
#[derive(Clone, Debug)]
pub struct Launch {
    pub job_id: u32,
    /// The node it runs on (`target_node`).
    pub node: String,
    /// Where the node's agent listens (from its registration).
    pub address: String,
    pub port: u32,
    pub spec: pb::JobSpec,
    /// Every node of the allocation.
    pub peers: Vec<String>,
    pub task_offset: u32,
    /// Run attempt, from 1.
    pub attempt: u32,
}

/// Runs the scheduler of `replica` forever; it acts only while the replica leads.
pub async fn run<D: Dialer>(replica: Replica<D>) {
    let interval = replica.cluster().config().schedule_interval;
    loop {
        tokio::time::sleep(interval).await;
        if replica.cluster().role(replica.slot()) != Role::Leader {
            continue;
        }
        let at = (replica.clock().wall)();
        let launches = replica
            .cluster()
            .schedule(replica.slot(), replica.now(), at);
        for launch in launches {
            let replica = replica.clone();
            tokio::spawn(async move { launch_on_agent(&replica, launch).await });
        }
    }
}

async fn agent_client<D: Dialer>(
    replica: &Replica<D>,
    address: &str,
    port: u32,
) -> Result<SlurmAgentClient<Channel>, String> {
    let config = replica.cluster().config();
    let endpoint = Endpoint::from_shared(format!("http://{address}:{port}"))
        .map_err(|e| e.to_string())?
        .connect_timeout(config.agent_connect_timeout)
        .timeout(config.agent_request_timeout);
    let channel = endpoint
        .connect_with_connector(DialerConnector::new(replica.dialer().clone()))
        .await
        .map_err(|e| format!("connect: {e}"))?;
    Ok(SlurmAgentClient::new(channel))
}

/// `message` as a call to an agent, with a bearer token when the replicas have an agent key.
fn agent_request<D: Dialer, T>(replica: &Replica<D>, message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(key) = &replica.cluster().config().agent_key {
        let exp = (crate::determinism::EPOCH + replica.now()).as_secs() + 300;
        let token = spur_operator::agent_auth::sign(
            key,
            &serde_json::json!({"sub": "spurctld", "exp": exp}),
        );
        let value = format!("Bearer {token}")
            .parse()
            .expect("a token is visible ASCII");
        request.metadata_mut().insert("authorization", value);
    }
    request
}

async fn launch_on_agent<D: Dialer>(replica: &Replica<D>, launch: Launch) {
    let request = pb::LaunchJobRequest {
        job_id: launch.job_id,
        spec: Some(launch.spec.clone()),
        allocated: None,
        peer_nodes: launch.peers.clone(),
        task_offset: launch.task_offset,
        target_node: launch.node.clone(),
        array_job_id: 0,
        array_task_id: 0,
        run_attempt: launch.attempt,
    };
    let result = match agent_client(replica, &launch.address, launch.port).await {
        Ok(mut client) => match client.launch_job(agent_request(replica, request)).await {
            Ok(response) if response.get_ref().success => Ok(()),
            Ok(response) => Err(format!("refused: {}", response.get_ref().error)),
            Err(status) => Err(format!("{:?} {}", status.code(), status.message())),
        },
        Err(error) => Err(error),
    };
    match result {
        Ok(()) => replica.record(format!(
            "LaunchJob job {} on {} attempt {}: ok",
            launch.job_id, launch.node, launch.attempt
        )),
        Err(error) => {
            replica.record(format!(
                "LaunchJob job {} on {} attempt {}: {error}",
                launch.job_id, launch.node, launch.attempt
            ));
            // The job goes back to pending; a replica that lost the lead meanwhile
            // leaves that to the new leader's view of the job.
            let _ = replica
                .commit(Command::LaunchFailed {
                    job_id: launch.job_id,
                    attempt: launch.attempt,
                })
                .await;
        }
    }
}

/// Tells the agent of `node` to stop `job_id` (after a cancellation).
pub(super) async fn cancel_on_agent<D: Dialer>(
    replica: &Replica<D>,
    job_id: u32,
    node: &str,
    address: &str,
    port: u32,
) {
    let result = match agent_client(replica, address, port).await {
        Ok(mut client) => client
            .cancel_job(agent_request(
                replica,
                pb::AgentCancelJobRequest { job_id, signal: 0 },
            ))
            .await
            .map(|_| ())
            .map_err(|status| format!("{:?} {}", status.code(), status.message())),
        Err(error) => Err(error),
    };
    let outcome = match result {
        Ok(()) => "ok".to_owned(),
        Err(error) => error,
    };
    replica.record(format!("agent CancelJob job {job_id} on {node}: {outcome}"));
}
