//! What a controller answers, written against the wire protocol only: a plain tonic client
//! and no knowledge of the model.
//!
//! By default each case runs against the simulated replicas (through the simulated
//! `spurctld` Service). With `SPUR_CONFORMANCE_ADDR=host:port` it runs against any
//! controller over real TCP, a real spurctld or `spur-sim controllers`:
//!
//! ```text
//! SPUR_CONFORMANCE_ADDR=127.0.0.1:6817 cargo test -p spur-sim --test controller_conformance
//! ```
//!
//! The model-only cases at the end (a leader kill) need the simulation and are skipped
//! against a real address.

mod common;

use std::future::Future;
use std::time::Duration;

use common::{KillSwitch, channel, now, run_with_kills, submit, wait_for_leader};
use spur_proto as pb;
use spur_proto::SlurmControllerClient;
use spur_sim::net::ServiceDialer;
use spur_sim::world::{KillMode, World};
use tonic::Code;
use tonic::transport::{Channel, Endpoint};

/// Where the cases send their requests.
#[derive(Clone)]
enum Target {
    /// The simulated replicas, through the simulated Service.
    Sim(ServiceDialer),
    /// A controller over real TCP.
    Tcp(String),
}

impl Target {
    /// A channel to the controller, connecting again until it succeeds (the simulated
    /// Service has no ready endpoint for the first second).
    async fn client(&self) -> SlurmControllerClient<Channel> {
        for _ in 0..30 {
            if let Some(client) = self.try_client().await {
                return client;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        panic!("could not connect to the controller");
    }

    async fn try_client(&self) -> Option<SlurmControllerClient<Channel>> {
        match self {
            Target::Sim(dialer) => channel(dialer.clone(), "spurctld", |e| {
                e.connect_timeout(Duration::from_secs(2))
                    .timeout(Duration::from_secs(10))
            })
            .await
            .ok(),
            Target::Tcp(addr) => {
                let channel = Endpoint::from_shared(format!("http://{addr}"))
                    .expect("address")
                    .connect_timeout(Duration::from_secs(2))
                    .timeout(Duration::from_secs(10))
                    .connect()
                    .await
                    .ok()?;
                Some(SlurmControllerClient::new(channel))
            }
        }
    }

    /// Waits until a leader answers writes: an update of a node nobody registered is
    /// refused by a leader (an answer) and UNAVAILABLE without one.
    async fn wait_for_leader(&self) {
        loop {
            let mut client = self.client().await;
            let probe = pb::UpdateNodeRequest {
                name: "conformance-probe-never-registered".to_owned(),
                ..Default::default()
            };
            match client.update_node(probe).await {
                Err(status) if status.code() == Code::Unavailable => {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                _ => return,
            }
        }
    }
}

/// Names unique to this run, so repeated runs against one controller do not collide.
fn unique(name: &str) -> String {
    match std::env::var("SPUR_CONFORMANCE_ADDR") {
        Ok(_) => {
            let stamp = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_millis();
            format!("{name}-{}-{stamp}", std::process::id())
        }
        Err(_) => name.to_owned(),
    }
}

/// Runs `case` against the target chosen by the environment.
fn conformance<F, Fut>(seed: u64, case: F)
where
    F: FnOnce(Target) -> Fut,
    Fut: Future<Output = ()> + 'static,
{
    if let Ok(addr) = std::env::var("SPUR_CONFORMANCE_ADDR") {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let target = Target::Tcp(addr);
        runtime.block_on(async move {
            target.wait_for_leader().await;
            case(target).await;
        });
        return;
    }
    let mut world = World::new(seed);
    world.start_controllers();
    let target = Target::Sim(world.dialer("conformance"));
    let run = case(target.clone());
    world.client("conformance", async move {
        target.wait_for_leader().await;
        run.await;
        Ok(())
    });
    world.run().expect("simulation");
}

fn registration(name: &str, cpus: u32) -> pb::RegisterAgentRequest {
    pb::RegisterAgentRequest {
        hostname: name.to_owned(),
        resources: Some(pb::ResourceSet {
            cpus,
            memory_mb: 16_384,
            ..Default::default()
        }),
        version: "conformance".to_owned(),
        // An agent address nothing listens on: the controller may try to launch jobs
        // there and must survive failing to.
        address: "127.0.0.1".to_owned(),
        port: 1,
        ..Default::default()
    }
}

#[test]
fn a_node_registers_and_registers_again() {
    conformance(100, |target| async move {
        let name = unique("conf-node-a");
        let mut client = target.client().await;
        let first = client.register_agent(registration(&name, 4)).await.unwrap();
        assert!(first.get_ref().accepted, "{first:?}");
        let again = client.register_agent(registration(&name, 8)).await.unwrap();
        assert!(
            again.get_ref().accepted,
            "re-registration is accepted: {again:?}"
        );
    });
}

#[test]
fn a_heartbeat_of_a_known_node_is_accepted_and_of_an_unknown_one_is_not_found() {
    conformance(101, |target| async move {
        let name = unique("conf-node-b");
        let mut client = target.client().await;
        client.register_agent(registration(&name, 4)).await.unwrap();
        let heartbeat = |hostname: &str| pb::HeartbeatRequest {
            hostname: hostname.to_owned(),
            cpu_load: 10,
            free_memory_mb: 1024,
            ..Default::default()
        };
        client.heartbeat(heartbeat(&name)).await.unwrap();

        let ghost = unique("conf-ghost");
        let status = client.heartbeat(heartbeat(&ghost)).await.unwrap_err();
        assert_eq!(status.code(), Code::NotFound, "{status:?}");
        assert!(status.message().contains(&ghost), "{status:?}");
    });
}

#[test]
fn a_nodes_state_is_updated() {
    conformance(102, |target| async move {
        let name = unique("conf-node-c");
        let mut client = target.client().await;
        client.register_agent(registration(&name, 4)).await.unwrap();
        let update = |state: pb::NodeState, reason: &str| pb::UpdateNodeRequest {
            name: name.clone(),
            state: Some(state as i32),
            reason: Some(reason.to_owned()),
            ..Default::default()
        };
        client
            .update_node(update(pb::NodeState::NodeDrain, "conformance"))
            .await
            .unwrap();
        client
            .update_node(update(pb::NodeState::NodeIdle, ""))
            .await
            .unwrap();
    });
}

#[test]
fn a_job_is_submitted_read_back_by_id_and_by_name_with_its_comment_and_cancelled() {
    conformance(103, |target| async move {
        let name = unique("conf-job");
        let mut client = target.client().await;
        let id = client
            .submit_job(submit(&name))
            .await
            .unwrap()
            .into_inner()
            .job_id;
        assert!(id > 0);

        let job = client
            .get_job(pb::GetJobRequest { job_id: id })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(job.job_id, id);
        assert_eq!(job.name, name);
        assert_eq!(job.comment, format!("spurjob-uid={name}"));

        let by_name = client
            .get_jobs(pb::GetJobsRequest {
                name: name.clone(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .jobs;
        let found = by_name
            .iter()
            .find(|j| j.job_id == id)
            .expect("found by name");
        assert_eq!(found.comment, format!("spurjob-uid={name}"));
        assert!(by_name.iter().all(|j| j.name == name));

        client
            .cancel_job(pb::CancelJobRequest {
                job_id: id,
                ..Default::default()
            })
            .await
            .unwrap();
        let job = client
            .get_job(pb::GetJobRequest { job_id: id })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(job.state, pb::JobState::JobCancelled as i32);
    });
}

#[test]
fn a_job_status_report_is_accepted_and_a_state_other_than_completed_or_failed_refused() {
    conformance(104, |target| async move {
        let mut client = target.client().await;
        let id = client
            .submit_job(submit(&unique("conf-report")))
            .await
            .unwrap()
            .into_inner()
            .job_id;
        let report = |state: pb::JobState, exit_code| pb::ReportJobStatusRequest {
            job_id: id,
            state: state as i32,
            exit_code,
            ..Default::default()
        };
        let refused = client
            .report_job_status(report(pb::JobState::JobRunning, 0))
            .await;
        assert!(refused.is_err(), "JOB_RUNNING is not a report: {refused:?}");
        client
            .report_job_status(report(pb::JobState::JobCompleted, 0))
            .await
            .unwrap();
    });
}

// The model alone: a leader kill needs the simulation.

#[test]
fn model_a_leader_kill_answers_unavailable_and_job_ids_keep_increasing() {
    if std::env::var("SPUR_CONFORMANCE_ADDR").is_ok() {
        return;
    }
    let mut world = World::new(105);
    world.start_controllers();
    let cluster = world.cluster().clone();
    let dialer = world.dialer("conformance");
    let kills = KillSwitch::default();
    let switch = kills.clone();
    world.client("conformance", async move {
        let target = Target::Sim(dialer);
        target.wait_for_leader().await;
        let leader = wait_for_leader(&cluster).await;
        let mut before = 0;
        for n in 0..3 {
            let mut client = target.client().await;
            before = client
                .submit_job(submit(&format!("pre-{n}")))
                .await?
                .into_inner()
                .job_id;
        }
        switch.kill(&leader, KillMode::Graceful).await;
        let killed_at = now();
        let mut unavailable = 0;
        let after = loop {
            // A fresh channel each time, as a careful client does after a transport error.
            let result = match channel(target_dialer(&target), "spurctld", |e| {
                e.connect_timeout(Duration::from_secs(2))
                    .timeout(Duration::from_secs(5))
            })
            .await
            {
                Ok(mut client) => client.submit_job(submit("post")).await,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
            match result {
                Ok(response) => break response.into_inner().job_id,
                Err(status) => {
                    assert!(
                        matches!(status.code(), Code::Unavailable | Code::Unknown),
                        "{status:?}"
                    );
                    unavailable += 1;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        };
        assert!(unavailable > 0, "writes failed while the election ran");
        assert!(now() - killed_at <= Duration::from_secs(10));
        assert!(after > before, "job id {after} continues after {before}");
        Ok(())
    });
    run_with_kills(&mut world, &kills);
}

fn target_dialer(target: &Target) -> ServiceDialer {
    match target {
        Target::Sim(dialer) => dialer.clone(),
        Target::Tcp(_) => unreachable!("model-only case"),
    }
}
