//! `spur-operator check-controller` against a live controller and a dead one, over real
//! TCP on loopback, as a person would run it.

use std::process::Command;

use spur_proto as pb;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::{Request, Response, Status};

/// Answers Ping like spurctld; nothing else is needed for the check.
struct PingOnly;

#[tonic::async_trait]
impl pb::SlurmController for PingOnly {
    async fn ping(&self, _: Request<()>) -> Result<Response<pb::PingResponse>, Status> {
        Ok(Response::new(pb::PingResponse {
            hostname: "spurctld-test".into(),
            server_time: None,
            version: "9.9.9".into(),
        }))
    }
    async fn register_agent(
        &self,
        _: Request<pb::RegisterAgentRequest>,
    ) -> Result<Response<pb::RegisterAgentResponse>, Status> {
        Err(Status::unimplemented("test"))
    }
    async fn heartbeat(
        &self,
        _: Request<pb::HeartbeatRequest>,
    ) -> Result<Response<pb::HeartbeatResponse>, Status> {
        Err(Status::unimplemented("test"))
    }
    async fn update_node(&self, _: Request<pb::UpdateNodeRequest>) -> Result<Response<()>, Status> {
        Err(Status::unimplemented("test"))
    }
    async fn submit_job(
        &self,
        _: Request<pb::SubmitJobRequest>,
    ) -> Result<Response<pb::SubmitJobResponse>, Status> {
        Err(Status::unimplemented("test"))
    }
    async fn get_job(
        &self,
        _: Request<pb::GetJobRequest>,
    ) -> Result<Response<pb::JobInfo>, Status> {
        Err(Status::unimplemented("test"))
    }
    async fn get_nodes(
        &self,
        _: Request<pb::GetNodesRequest>,
    ) -> Result<Response<pb::GetNodesResponse>, Status> {
        Err(Status::unimplemented(
            "GetNodes is the lab's, not the operator's",
        ))
    }
    async fn get_jobs(
        &self,
        _: Request<pb::GetJobsRequest>,
    ) -> Result<Response<pb::GetJobsResponse>, Status> {
        Err(Status::unimplemented("test"))
    }
    async fn cancel_job(&self, _: Request<pb::CancelJobRequest>) -> Result<Response<()>, Status> {
        Err(Status::unimplemented("test"))
    }
    async fn report_job_status(
        &self,
        _: Request<pb::ReportJobStatusRequest>,
    ) -> Result<Response<()>, Status> {
        Err(Status::unimplemented("test"))
    }
}

fn check_controller(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_spur-operator"))
        .arg("check-controller")
        .args(args)
        .env_remove("SPUR_OPERATOR_CONTROLLER_ADDR")
        .output()
        .expect("run spur-operator");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn reports_a_live_controller() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(pb::SlurmControllerServer::new(PingOnly))
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    let addr = addr.to_string();
    let (code, stdout, stderr) =
        tokio::task::spawn_blocking(move || check_controller(&["--controller-addr", &addr]))
            .await
            .unwrap();
    assert_eq!(code, 0, "stdout: {stdout}\nstderr: {stderr}");
    assert!(
        stdout.contains("hostname=spurctld-test version=9.9.9 rtt="),
        "{stdout}"
    );
}

#[test]
fn names_the_cause_when_nothing_listens() {
    // A port that was just free: the connect is refused at once.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let (code, stdout, stderr) =
        check_controller(&["--controller-addr", &format!("127.0.0.1:{port}")]);
    assert_eq!(code, 1, "stdout: {stdout}\nstderr: {stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.contains("is not answering") && last.contains("connection refused"),
        "{stderr}"
    );
}

#[test]
fn refuses_a_bad_address_in_one_line() {
    let (code, _, stderr) = check_controller(&["--controller-addr", "ftp://spurctld"]);
    assert_eq!(code, 2);
    assert_eq!(
        stderr.trim(),
        "spur-operator: --controller-addr: unsupported scheme `ftp://`: use http:// or https://"
    );
}
