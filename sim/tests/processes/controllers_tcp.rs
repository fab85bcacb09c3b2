//! `spur-sim controllers`: the replicas over real TCP answer through the Service address.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use spur_proto as pb;
use spur_proto::SlurmControllerClient;
use tonic::Code;

struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn the_replicas_serve_over_real_tcp_and_elect_a_leader() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_spur-sim"))
        .args(["controllers", "--listen", "127.0.0.1:0"])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spur-sim starts");
    let stderr = child.stderr.take().expect("stderr");
    let child = KillOnDrop(child);
    let addr = BufReader::new(stderr)
        .lines()
        .map_while(Result::ok)
        .find_map(|line| line.strip_prefix("service spurctld on ").map(str::to_owned))
        .expect("the Service address is printed");

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let mut client = SlurmControllerClient::connect(format!("http://{addr}"))
            .await
            .expect("connect");
        // Real time: the first election takes 3 to 8 s.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        let id = loop {
            let spec = pb::JobSpec {
                name: "tcp".to_owned(),
                ..Default::default()
            };
            match client
                .submit_job(pb::SubmitJobRequest { spec: Some(spec) })
                .await
            {
                Ok(response) => break response.into_inner().job_id,
                Err(status) if status.code() == Code::Unavailable => {
                    assert!(
                        tokio::time::Instant::now() < deadline,
                        "no leader: {status:?}"
                    );
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(status) => panic!("unexpected answer {status:?}"),
            }
        };
        let job = client
            .get_job(pb::GetJobRequest { job_id: id })
            .await
            .expect("read back")
            .into_inner();
        assert_eq!(job.name, "tcp");
    });
    drop(child);
}
