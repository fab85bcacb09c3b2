//! The agent's token check over real gRPC on loopback: the interceptor answers
//! UNAUTHENTICATED, naming why, before the agent sees the call; a call it admits reaches the
//! agent (which, with no SpurJobs to serve, answers that this replica is not acting).

use std::time::Duration;

use serde_json::json;
use spur_operator::Metrics;
use spur_operator::Registered;
use spur_operator::clock::WallClock;
use spur_operator::{Agent, serve_agent as serve};
use spur_operator::{AgentAuth, AgentAuthMode, sign_agent_token as sign};
use spur_proto as pb;
use tonic::Code;

const KEY: &[u8] = b"0123456789abcdef0123456789abcdef";

/// Serves the agent with `mode` on 127.0.0.1; its address and its metrics.
async fn agent(mode: AgentAuthMode) -> (String, Metrics) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // Never called: without a SpurJob store the agent answers before touching Kubernetes.
    let kube =
        kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap();
    let (_jobs_tx, jobs_rx) = tokio::sync::watch::channel(None);
    let agent = Agent::new(kube, jobs_rx, Registered::default());
    let auth = AgentAuth::new(
        mode,
        Some(KEY),
        Duration::from_secs(30),
        WallClock::system(),
    );
    let metrics = Metrics::new();
    tokio::spawn(serve(
        agent,
        auth,
        metrics.clone(),
        listener,
        std::future::pending(),
    ));
    (format!("http://{addr}"), metrics)
}

async fn launch(addr: &str, token: Option<&str>) -> tonic::Status {
    let mut client = pb::SlurmAgentClient::connect(addr.to_owned())
        .await
        .unwrap();
    let mut request = tonic::Request::new(pb::LaunchJobRequest {
        job_id: 7,
        target_node: "node-0".into(),
        ..Default::default()
    });
    if let Some(token) = token {
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {token}").parse().unwrap());
    }
    client.launch_job(request).await.unwrap_err()
}

fn valid_token() -> String {
    let exp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 300;
    sign(KEY, &json!({"sub": "spurctld", "exp": exp}))
}

#[tokio::test]
async fn required_refuses_a_call_without_a_token_and_admits_a_signed_one() {
    let (addr, metrics) = agent(AgentAuthMode::Required).await;
    let refused = launch(&addr, None).await;
    assert_eq!(refused.code(), Code::Unauthenticated);
    assert!(
        refused.message().contains("no bearer token"),
        "{}",
        refused.message()
    );

    let forged = launch(
        &addr,
        Some(&sign(b"not the agent key, but 32 bytes.", &json!({}))),
    )
    .await;
    assert_eq!(forged.code(), Code::Unauthenticated);
    assert!(
        forged.message().contains("signature"),
        "{}",
        forged.message()
    );

    let admitted = launch(&addr, Some(&valid_token())).await;
    assert_eq!(admitted.code(), Code::Unavailable, "{admitted:?}");
    assert!(
        admitted.message().contains("not the acting one"),
        "{}",
        admitted.message()
    );

    let text = metrics.encode();
    assert!(
        text.contains("spur_operator_agent_calls_total{result=\"refused\"} 2"),
        "{text}"
    );
    assert!(
        text.contains("spur_operator_agent_calls_total{result=\"verified\"} 1"),
        "{text}"
    );
}

#[tokio::test]
async fn permissive_admits_a_call_without_a_token_but_not_a_forged_one() {
    let (addr, metrics) = agent(AgentAuthMode::Permissive).await;
    assert_eq!(launch(&addr, None).await.code(), Code::Unavailable);
    assert_eq!(
        launch(&addr, Some("a.b.c")).await.code(),
        Code::Unauthenticated
    );
    let text = metrics.encode();
    assert!(
        text.contains("spur_operator_agent_calls_total{result=\"without_token\"} 1"),
        "{text}"
    );
}
