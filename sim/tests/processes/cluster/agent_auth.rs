//! deploy/ with `components/agent-auth` and spurctld given the same key, as
//! docs/operating.md ("Tokens on the agent") tells a user to deploy it: spurctld's signed
//! LaunchJob is served (a SpurJob completes), and a caller without a token is refused each
//! call that reads or changes what runs in a pod.

use std::time::Duration;

use spur_proto as pb;
use spur_proto::slurm_agent_client::SlurmAgentClient;
use tonic::Code;

use super::pod_io::{forward_to_operator, ready_pod};
use super::{ClusterProcess, completes, runnable, workspace};

/// The key spurctld signs its agent calls with, and the operator verifies them with.
const AGENT_KEY: &str = "cluster-agent-key-of-thirty-two-bytes";

#[test]
fn with_the_agent_auth_component_spurctlds_signed_calls_are_served_and_unsigned_ones_refused() {
    if !runnable() {
        return;
    }
    let cluster = ClusterProcess::start("agent-auth");
    cluster.apply(&["-f", &signing_spurctld(&cluster)]);
    cluster.apply(&["-f", &agent_key_secret(&cluster)]);
    cluster.apply(&["-k", &with_agent_auth(&cluster)]);
    let hello = workspace().join("deploy/examples/cluster/hello.yaml");
    cluster.apply(&["-f", &hello.display().to_string()]);
    completes(&cluster, "hello");

    let operator = ready_pod(
        &cluster,
        "spur-system",
        "app.kubernetes.io/name=spur-operator",
    );
    let (mut forward, port) = forward_to_operator(&cluster, &operator, 6818);
    let refusals = port.map(unsigned_calls);
    let _ = forward.kill();
    let _ = forward.wait();
    let refusals = refusals.expect("kubectl port-forward printed its local port");
    for (call, code) in refusals {
        assert_eq!(code, Code::Unauthenticated, "{call} without a token");
    }
    cluster.stop();
}

/// The operator's namespace and Secret `spur-agent-key` holding [`AGENT_KEY`], as a
/// manifest in the cluster's directory (`kubectl create` sends protobuf, which the simulated
/// API server does not read; `apply` sends JSON).
fn agent_key_secret(cluster: &ClusterProcess) -> String {
    let manifest = format!(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: spur-system\n---\n\
         apiVersion: v1\nkind: Secret\nmetadata:\n  name: spur-agent-key\n  namespace: spur-system\n\
         stringData:\n  jwt_key: {AGENT_KEY}\n"
    );
    let path = cluster.dir.join("agent-key.yaml");
    std::fs::write(&path, manifest).expect("write the Secret");
    path.display().to_string()
}

/// Upstream's spurctld example with `[auth] jwt_key` set, written into the cluster's
/// directory: spurctld then signs every call to the agent.
fn signing_spurctld(cluster: &ClusterProcess) -> String {
    let example = workspace().join("deploy/examples/cluster/spurctld.yaml");
    let text = std::fs::read_to_string(example).expect("the spurctld example");
    let section = format!(
        "    [auth]\n    plugin = \"jwt\"\n    jwt_key = \"{AGENT_KEY}\"\n\n    [controller]\n"
    );
    let signing = text.replacen("    [controller]\n", &section, 1);
    assert_ne!(
        signing, text,
        "the example's config has a [controller] section"
    );
    let path = cluster.dir.join("spurctld-signing.yaml");
    std::fs::write(&path, signing).expect("write the spurctld manifest");
    path.display().to_string()
}

/// A user's kustomization beside deploy/ listing the component, in the cluster's directory
/// (kustomize takes only relative paths to what it builds on).
fn with_agent_auth(cluster: &ClusterProcess) -> String {
    let dir = cluster.dir.join("with-agent-auth");
    std::fs::create_dir_all(&dir).expect("the kustomization's directory");
    let dir = dir.canonicalize().expect("its path");
    let deploy = workspace().join("deploy").canonicalize().expect("deploy/");
    let up = "../".repeat(dir.components().count() - 1);
    let deploy = format!(
        "{up}{}",
        deploy.display().to_string().trim_start_matches('/')
    );
    let kustomization =
        format!("resources: [{deploy}]\ncomponents: [{deploy}/components/agent-auth]\n");
    std::fs::write(dir.join("kustomization.yaml"), kustomization).expect("write it");
    dir.display().to_string()
}

/// ExecInJob, StreamJobOutput, CancelJob and SuspendJob sent with no token through the
/// forward at `port`: each call's gRPC code.
fn unsigned_calls(port: u16) -> Vec<(&'static str, Code)> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async move {
        let endpoint = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
            .expect("an endpoint")
            .timeout(Duration::from_secs(10));
        let channel = endpoint
            .connect()
            .await
            .expect("the agent through the forward");
        let mut agent = SlurmAgentClient::new(channel);
        let code = |answer: Result<(), tonic::Status>| answer.err().map_or(Code::Ok, |s| s.code());
        let exec = pb::ExecInJobRequest {
            job_id: 1,
            command: vec!["id".into()],
            user: String::new(),
        };
        let output = pb::StreamJobOutputRequest {
            job_id: 1,
            stream: "stdout".into(),
            user: String::new(),
        };
        let cancel = pb::AgentCancelJobRequest {
            job_id: 1,
            signal: 0,
        };
        let suspend = pb::AgentSuspendJobRequest {
            job_id: 1,
            resume: false,
        };
        vec![
            ("ExecInJob", code(agent.exec_in_job(exec).await.map(drop))),
            (
                "StreamJobOutput",
                code(agent.stream_job_output(output).await.map(drop)),
            ),
            ("CancelJob", code(agent.cancel_job(cancel).await.map(drop))),
            (
                "SuspendJob",
                code(agent.suspend_job(suspend).await.map(drop)),
            ),
        ]
    })
}
