//! What upstream's operator (`spur-k8s` in ROCm/spur) leaves behind on a cluster, built from
//! the facts of its behaviour (names, labels, status values), not from its code: a virtual
//! agent that answers spurctld's LaunchJob with a pod as upstream names and labels it, and
//! SpurJobs in the shape its reconciler writes them. A swap case runs it, stops it, and
//! starts ours on the same world.

use std::net::SocketAddr;

use serde_json::{Value, json};
use spur_fakes::api_server::ApiServer;
use spur_proto as pb;
use tonic::{Request, Response, Status};

use super::stack::{NAMESPACE, SPURJOB};

/// Upstream's `spur.amd.com/managed-by` value and the version it registers nodes with.
pub const MANAGED_BY: &str = "spur-k8s-operator";

/// Upstream's pod name: `spur-job-<id>-<node>` (the node sanitised; ours are plain here).
pub fn pod_name(job_id: u32, node: &str) -> String {
    format!("spur-job-{job_id}-{node}")
}

/// Upstream's virtual agent, reduced to what a swap needs: a launch creates the job's pod
/// on the target node, in the namespace of the SpurJob labelled with the job's id.
#[derive(Clone)]
pub struct UpstreamAgent {
    pub api: ApiServer,
}

#[tonic::async_trait]
impl pb::SlurmAgent for UpstreamAgent {
    async fn launch_job(
        &self,
        request: Request<pb::LaunchJobRequest>,
    ) -> Result<Response<pb::LaunchJobResponse>, Status> {
        let launch = request.into_inner();
        let spec = launch.spec.unwrap_or_default();
        let env: Vec<Value> = spec
            .environment
            .iter()
            .map(|(name, value)| json!({"name": name, "value": value}))
            .chain([json!({"name": "SPUR_JOB_ID", "value": launch.job_id.to_string()})])
            .collect();
        let pod = json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod_name(launch.job_id, &launch.target_node),
                "namespace": NAMESPACE,
                "labels": {
                    "spur.amd.com/job-id": launch.job_id.to_string(),
                    "spur.amd.com/managed-by": MANAGED_BY,
                    "spur.amd.com/job-name": spec.name,
                    "spur.amd.com/target-node": launch.target_node,
                },
            },
            "spec": {
                "restartPolicy": "Never",
                "nodeName": launch.target_node,
                "containers": [{
                    "name": "spur-job",
                    "image": spec.container_image,
                    "command": spec.argv,
                    "env": env,
                }],
            },
        });
        let answer = match self.api.create(pod) {
            Ok(_) => pb::LaunchJobResponse {
                success: true,
                ..Default::default()
            },
            Err(e) => pb::LaunchJobResponse {
                success: false,
                error: format!("create pod: {e:?}"),
                ..Default::default()
            },
        };
        Ok(Response::new(answer))
    }

    async fn cancel_job(
        &self,
        _request: Request<pb::AgentCancelJobRequest>,
    ) -> Result<Response<()>, Status> {
        Ok(Response::new(()))
    }
}

/// Serves `agent` on `addr` until the returned task is aborted.
pub async fn serve(agent: UpstreamAgent, addr: SocketAddr) -> tokio::task::JoinHandle<()> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .expect("bind upstream's agent");
    tokio::spawn(async move {
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        let _ = tonic::transport::Server::builder()
            .add_service(pb::SlurmAgentServer::new(agent))
            .serve_with_incoming(incoming)
            .await;
    })
}

/// Node `name`'s registration as upstream's heartbeat sends it, its agent at `agent`.
pub fn registration(name: &str, agent: SocketAddr) -> pb::RegisterAgentRequest {
    pb::RegisterAgentRequest {
        hostname: name.to_owned(),
        resources: Some(pb::ResourceSet {
            cpus: 64,
            memory_mb: 256 * 1024,
            ..Default::default()
        }),
        version: MANAGED_BY.to_owned(),
        address: agent.ip().to_string(),
        port: u32::from(agent.port()),
        ..Default::default()
    }
}

/// A SpurJob as upstream's reconciler leaves one it submitted: its finalizer, the job-id
/// label, and `status.state` in upstream's names (`Pending`, `Running`, `Completed`...).
pub fn create_spurjob(api: &ApiServer, name: &str, spec: Value, job_id: u32, state: &str) -> Value {
    api.create(json!({
        "apiVersion": SPURJOB.0,
        "kind": SPURJOB.1,
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "finalizers": ["spur.amd.com/cleanup"],
            "labels": {"spur.amd.com/job-id": job_id.to_string()},
        },
        "spec": spec,
    }))
    .expect("create upstream's SpurJob");
    api.merge_patch(
        SPURJOB.0,
        SPURJOB.1,
        Some(NAMESPACE),
        name,
        &json!({"status": {"state": state, "spurJobId": job_id, "pods": [], "assignedNodes": []}}),
        true,
    )
    .expect("write upstream's status")
}
