//! What a controller answers, pinned on the model AND on the real spurctld.
//!
//! Each case is written against the wire protocol only (a plain tonic client, and a small
//! agent server of its own) and runs on the simulated replicas, then on real spurctld
//! processes it starts itself (`../shared/peers/spurctld/spurctld` or `$SPURCTLD`): one
//! replica and three under Raft on loopback addresses of their own, fresh for each case,
//! killed at the end even on panic. A case that fails on the model and passes on the real
//! binary is a bug in the model (docs/specs.md's fidelity rows, numbers in brackets).
//!
//! ```text
//! cargo test -p spur-sim --test controller_conformance            # model + real
//! SPURCTLD=/path/to/spurctld cargo test -p spur-sim --test controller_conformance
//! ```

#[path = "conformance/agent.rs"]
mod agent;
#[path = "conformance/limits.rs"]
mod limits;
#[path = "conformance/rows.rs"]
mod rows;
#[path = "conformance/target.rs"]
mod target;

use std::time::Duration;

use agent::{LaunchRule, TestAgent};
use spur_proto as pb;
use target::{Replicas, Setup, Target, conformance};
use tonic::Code;

fn registration(name: &str, address: &str, port: u32) -> pb::RegisterAgentRequest {
    pb::RegisterAgentRequest {
        hostname: name.to_owned(),
        resources: Some(pb::ResourceSet {
            cpus: 8,
            memory_mb: 16_384,
            ..Default::default()
        }),
        version: "conformance".to_owned(),
        address: address.to_owned(),
        port,
        ..Default::default()
    }
}

/// A registration whose agent nobody serves: the controller may try to launch there and
/// must survive failing to.
fn unreachable_node(name: &str) -> pb::RegisterAgentRequest {
    registration(name, "127.0.0.1", 1)
}

fn spec(name: &str) -> pb::JobSpec {
    pb::JobSpec {
        name: name.to_owned(),
        num_nodes: 1,
        num_tasks: 1,
        tasks_per_node: 1,
        cpus_per_task: 1,
        comment: format!("spurjob-uid={name}"),
        ..Default::default()
    }
}

fn submit(spec: pb::JobSpec) -> pb::SubmitJobRequest {
    pb::SubmitJobRequest { spec: Some(spec) }
}

fn heartbeat(name: &str) -> pb::HeartbeatRequest {
    pb::HeartbeatRequest {
        hostname: name.to_owned(),
        cpu_load: 10,
        free_memory_mb: 1024,
        ..Default::default()
    }
}

async fn job(target: &Target, id: u32) -> pb::JobInfo {
    target
        .client()
        .await
        .get_job(pb::GetJobRequest { job_id: id })
        .await
        .unwrap_or_else(|s| panic!("{}: GetJob {id}: {s:?}", target.name))
        .into_inner()
}

/// Polls job `id` every 200 ms until `done` holds; panics after `limit`.
async fn until_job(
    target: &Target,
    id: u32,
    limit: Duration,
    what: &str,
    done: impl Fn(&pb::JobInfo) -> bool,
) -> pb::JobInfo {
    let start = tokio::time::Instant::now();
    loop {
        let info = job(target, id).await;
        if done(&info) {
            return info;
        }
        assert!(
            start.elapsed() < limit,
            "{}: job {id} not {what} after {limit:?}: {info:?}{}",
            target.name,
            target.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn state(info: &pb::JobInfo) -> pb::JobState {
    pb::JobState::try_from(info.state).unwrap_or(pb::JobState::JobPending)
}

// ---- Registration and heartbeats [6, 18]

#[test]
fn a_node_registers_again_and_registration_is_never_accepted_false() {
    conformance(100, Replicas::Any, Setup::default(), |target| async move {
        let mut client = target.client().await;
        for cpus in [4, 8] {
            let mut request = unreachable_node("conf-node-a");
            request.resources.as_mut().unwrap().cpus = cpus;
            let answer = client.register_agent(request).await.unwrap().into_inner();
            assert!(answer.accepted, "{}: {answer:?}", target.name);
        }
    });
}

#[test]
fn a_heartbeat_of_a_known_node_is_accepted_and_of_an_unknown_one_not_found() {
    conformance(101, Replicas::Any, Setup::default(), |target| async move {
        let mut client = target.client().await;
        client
            .register_agent(unreachable_node("conf-node-b"))
            .await
            .unwrap();
        client.heartbeat(heartbeat("conf-node-b")).await.unwrap();
        let status = client.heartbeat(heartbeat("conf-ghost")).await.unwrap_err();
        assert_eq!(status.code(), Code::NotFound, "{}: {status:?}", target.name);
        assert!(
            status
                .message()
                .contains("node conf-ghost not found — is the node registered?"),
            "{}: {status:?}",
            target.name
        );
    });
}

// ---- Ping [3]

#[test]
fn ping_is_answered_locally_with_the_replicas_own_hostname_also_while_the_leader_is_frozen() {
    conformance(
        102,
        Replicas::Three,
        Setup::default(),
        |target| async move {
            for slot in 0..target.replicas() {
                let answer = target.replica(slot).await.ping(()).await.unwrap();
                assert_eq!(
                    answer.get_ref().hostname,
                    target.hostname(slot),
                    "{}: replica {slot}",
                    target.name
                );
            }
            let leader = target.wait_for_leader().await;
            target.freeze(leader).await;
            for slot in (0..target.replicas()).filter(|s| *s != leader) {
                let mut client = target.replica(slot).await;
                let asked = tokio::time::Instant::now();
                let answer = tokio::time::timeout(Duration::from_secs(2), client.ping(()))
                    .await
                    .unwrap_or_else(|_| {
                        panic!(
                            "{}: a follower's Ping hung while the leader was frozen",
                            target.name
                        )
                    })
                    .unwrap();
                assert_eq!(answer.get_ref().hostname, target.hostname(slot));
                assert!(asked.elapsed() < Duration::from_secs(1));
            }
            target.thaw(leader).await;
        },
    );
}

#[test]
fn a_frozen_replica_completes_a_connect_and_then_answers_nothing_until_thawed() {
    // SIGSTOP stops the process, not its kernel: the handshake completes and the request
    // is taken in, and it is answered once the process runs again. (The model once left
    // connects to a frozen replica unanswered, so a client's probe there failed at its
    // connect bound instead of its read bound.)
    conformance(
        124,
        Replicas::Three,
        Setup::default(),
        |target| async move {
            let leader = target.wait_for_leader().await;
            let frozen = (leader + 1) % 3;
            target.freeze(frozen).await;
            let asked = tokio::time::Instant::now();
            let mut client =
                tokio::time::timeout(Duration::from_secs(3), target.try_replica(frozen))
                    .await
                    .ok()
                    .flatten()
                    .unwrap_or_else(|| {
                        panic!(
                            "{}: no connect to the frozen replica completed",
                            target.name
                        )
                    });
            assert!(
                asked.elapsed() < Duration::from_secs(1),
                "{}: the connect took {:?}",
                target.name,
                asked.elapsed()
            );
            let held = tokio::spawn(async move { client.ping(()).await });
            tokio::time::sleep(Duration::from_secs(2)).await;
            assert!(
                !held.is_finished(),
                "{}: a frozen replica answered a Ping",
                target.name
            );
            target.thaw(frozen).await;
            let answer = tokio::time::timeout(Duration::from_secs(5), held)
                .await
                .unwrap_or_else(|_| panic!("{}: no answer 5 s after the thaw", target.name))
                .unwrap()
                .unwrap();
            assert_eq!(answer.get_ref().hostname, target.hostname(frozen));
        },
    );
}

// ---- Nodes [5]

#[test]
fn update_node_of_an_unknown_node_is_internal_with_a_state_and_ok_without() {
    conformance(103, Replicas::Any, Setup::default(), |target| async move {
        let mut client = target.client().await;
        let with_state = pb::UpdateNodeRequest {
            name: "conf-ghost".to_owned(),
            state: Some(pb::NodeState::NodeDown as i32),
            reason: Some("conformance".to_owned()),
            ..Default::default()
        };
        let status = client.update_node(with_state).await.unwrap_err();
        assert_eq!(status.code(), Code::Internal, "{}: {status:?}", target.name);
        assert!(
            status.message().contains("node conf-ghost not found"),
            "{}: {status:?}",
            target.name
        );
        let without = pb::UpdateNodeRequest {
            name: "conf-ghost".to_owned(),
            ..Default::default()
        };
        client
            .update_node(without)
            .await
            .unwrap_or_else(|s| panic!("{}: {s:?}", target.name));
    });
}

#[test]
fn a_nodes_state_is_updated() {
    conformance(104, Replicas::Any, Setup::default(), |target| async move {
        let mut client = target.client().await;
        client
            .register_agent(unreachable_node("conf-node-c"))
            .await
            .unwrap();
        for state in [pb::NodeState::NodeDrain, pb::NodeState::NodeIdle] {
            client
                .update_node(pb::UpdateNodeRequest {
                    name: "conf-node-c".to_owned(),
                    state: Some(state as i32),
                    reason: Some("conformance".to_owned()),
                    ..Default::default()
                })
                .await
                .unwrap();
            // Read back: the update took, and nothing else answered for it.
            let nodes = client
                .get_nodes(pb::GetNodesRequest::default())
                .await
                .unwrap()
                .into_inner()
                .nodes;
            let node = nodes
                .iter()
                .find(|n| n.name == "conf-node-c")
                .unwrap_or_else(|| panic!("{}: conf-node-c not listed: {nodes:?}", target.name));
            assert_eq!(node.state(), state, "{}: {node:?}", target.name);
        }
    });
}

/// GetNodes filters by state and by a hostlist of names: node sync reads the drained nodes
/// alone, once, to keep an administrator's drain.
#[test]
fn get_nodes_answers_only_the_nodes_in_the_states_and_the_hostlist_asked_for() {
    conformance(119, Replicas::Any, Setup::default(), |target| async move {
        let mut client = target.client().await;
        for name in ["conf-g1", "conf-g2", "conf-g3"] {
            client.register_agent(unreachable_node(name)).await.unwrap();
        }
        client
            .update_node(pb::UpdateNodeRequest {
                name: "conf-g2".to_owned(),
                state: Some(pb::NodeState::NodeDrain as i32),
                reason: Some("admin: RMA 12".to_owned()),
                ..Default::default()
            })
            .await
            .unwrap();
        let names = |request: pb::GetNodesRequest| {
            let mut client = client.clone();
            async move {
                let mut nodes: Vec<(String, String)> = client
                    .get_nodes(request)
                    .await
                    .unwrap()
                    .into_inner()
                    .nodes
                    .into_iter()
                    .map(|n| (n.name, n.state_reason))
                    .collect();
                nodes.sort();
                nodes
            }
        };
        let drained = names(pb::GetNodesRequest {
            states: vec![
                pb::NodeState::NodeDrain as i32,
                pb::NodeState::NodeDraining as i32,
            ],
            ..Default::default()
        })
        .await;
        assert_eq!(
            drained,
            [("conf-g2".to_owned(), "admin: RMA 12".to_owned())],
            "{}",
            target.name
        );
        let listed: Vec<String> = names(pb::GetNodesRequest {
            nodelist: "conf-g[1,3]".to_owned(),
            ..Default::default()
        })
        .await
        .into_iter()
        .map(|(name, _)| name)
        .collect();
        assert_eq!(listed, ["conf-g1", "conf-g3"], "{}", target.name);
    });
}

// ---- Jobs [2, 9, 14, 16, 17]

#[test]
fn a_job_is_read_back_by_id_and_by_a_comma_list_of_names_with_its_comment() {
    conformance(105, Replicas::Any, Setup::default(), |target| async move {
        let mut client = target.client().await;
        let mut ids = Vec::new();
        for name in ["conf-a", "conf-b", "conf-c"] {
            ids.push(
                client
                    .submit_job(submit(spec(name)))
                    .await
                    .unwrap()
                    .into_inner()
                    .job_id,
            );
        }
        let info = job(&target, ids[0]).await;
        assert_eq!(info.name, "conf-a");
        assert_eq!(info.comment, "spurjob-uid=conf-a");
        assert_eq!(state(&info), pb::JobState::JobPending);

        let by_names = client
            .get_jobs(pb::GetJobsRequest {
                name: "conf-a,conf-c".to_owned(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .jobs;
        let mut names: Vec<_> = by_names.iter().map(|j| j.name.as_str()).collect();
        names.sort();
        assert_eq!(names, ["conf-a", "conf-c"], "{}", target.name);
        assert!(
            by_names
                .iter()
                .all(|j| j.comment.starts_with("spurjob-uid="))
        );
    });
}

#[test]
fn cancel_of_an_unknown_and_of_a_finished_job_is_internal() {
    conformance(106, Replicas::Any, Setup::default(), |target| async move {
        let mut client = target.client().await;
        let status = client
            .cancel_job(pb::CancelJobRequest {
                job_id: 999_999,
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::Internal, "{}: {status:?}", target.name);
        assert!(
            status.message().contains("job 999999 not found"),
            "{}: {status:?}",
            target.name
        );

        let id = client
            .submit_job(submit(spec("conf-cancel")))
            .await
            .unwrap()
            .into_inner()
            .job_id;
        let cancel = pb::CancelJobRequest {
            job_id: id,
            ..Default::default()
        };
        client.cancel_job(cancel.clone()).await.unwrap();
        let info = job(&target, id).await;
        assert_eq!(state(&info), pb::JobState::JobCancelled);
        let again = client.cancel_job(cancel).await.unwrap_err();
        assert_eq!(again.code(), Code::Internal, "{}: {again:?}", target.name);
        assert!(
            again.message().contains(&format!("job {id} is already")),
            "{}: {again:?}",
            target.name
        );
    });
}

#[test]
fn a_gpu_gres_entry_together_with_gpus_per_node_is_refused_and_each_alone_accepted() {
    conformance(107, Replicas::Any, Setup::default(), |target| async move {
        let mut client = target.client().await;
        let gres = vec!["gpu:any:2".to_owned()];
        let per_node = Some(pb::GpuRequest {
            count: 2,
            gpu_type: String::new(),
        });
        let both = pb::JobSpec {
            gres: gres.clone(),
            gpus_per_node: per_node.clone(),
            ..spec("conf-gpu-both")
        };
        let status = client.submit_job(submit(both)).await.unwrap_err();
        assert_eq!(
            status.code(),
            Code::InvalidArgument,
            "{}: {status:?}",
            target.name
        );
        assert!(
            status.message().contains("only one GPU request form"),
            "{}: {status:?}",
            target.name
        );
        for (name, spec) in [
            (
                "gres",
                pb::JobSpec {
                    gres,
                    ..spec("conf-gpu-gres")
                },
            ),
            (
                "gpus_per_node",
                pb::JobSpec {
                    gpus_per_node: per_node,
                    ..spec("conf-gpu-per-node")
                },
            ),
        ] {
            client
                .submit_job(submit(spec))
                .await
                .unwrap_or_else(|s| panic!("{}: {name} alone: {s:?}", target.name));
        }
    });
}

#[test]
fn an_array_job_is_expanded_into_tasks_that_clone_the_comment() {
    conformance(108, Replicas::Any, Setup::default(), |target| async move {
        let mut client = target.client().await;
        let array = pb::JobSpec {
            array_spec: "0-2".to_owned(),
            ..spec("conf-array")
        };
        let parent = client
            .submit_job(submit(array))
            .await
            .unwrap()
            .into_inner()
            .job_id;
        let tasks = client
            .get_jobs(pb::GetJobsRequest {
                name: "conf-array".to_owned(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .jobs;
        assert_eq!(tasks.len(), 3, "{}: {tasks:?}", target.name);
        assert!(
            tasks.iter().all(|t| t.comment == "spurjob-uid=conf-array"),
            "{}: {tasks:?}",
            target.name
        );
        assert!(
            tasks.iter().all(|t| t.job_id != parent),
            "{}: the parent id {parent} has no record of its own: {tasks:?}",
            target.name
        );
        // The parent is shown as an aggregate of its tasks, by GetJob and by id in GetJobs.
        let shown = job(&target, parent).await;
        assert_eq!(shown.job_id, parent);
        assert_eq!(shown.comment, "spurjob-uid=conf-array");
        assert_eq!(state(&shown), pb::JobState::JobPending, "{}", target.name);
        let by_id = client
            .get_jobs(pb::GetJobsRequest {
                job_ids: vec![parent],
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .jobs;
        assert_eq!(
            by_id.iter().map(|j| j.job_id).collect::<Vec<_>>(),
            [parent],
            "{}",
            target.name
        );
        // Cancelling the parent finds no job; each task is cancelled on its own.
        let status = client
            .cancel_job(pb::CancelJobRequest {
                job_id: parent,
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::Internal, "{}: {status:?}", target.name);
        for task in &tasks {
            client
                .cancel_job(pb::CancelJobRequest {
                    job_id: task.job_id,
                    ..Default::default()
                })
                .await
                .unwrap();
        }
        let ended = job(&target, parent).await;
        assert_eq!(state(&ended), pb::JobState::JobCancelled, "{}", target.name);
    });
}

// ---- Dispatch to an agent [1, 4, 7, 15]

/// Registers `names` with `agent`'s address; returns the agent's socket as spurctld sends
/// it in `peer_nodes`.
async fn register_with(target: &Target, names: &[&str], agent: TestAgent) -> (TestAgent, String) {
    let (address, port) = target.serve_agent(agent.clone()).await;
    let mut client = target.client().await;
    for name in names {
        client
            .register_agent(registration(name, &address, port))
            .await
            .unwrap();
        client.heartbeat(heartbeat(name)).await.unwrap();
    }
    (agent, format!("{address}:{port}"))
}

fn two_node_spec(name: &str) -> pb::JobSpec {
    pb::JobSpec {
        num_nodes: 2,
        num_tasks: 4,
        tasks_per_node: 2,
        ..spec(name)
    }
}

#[test]
fn a_launch_names_sockets_in_peer_nodes_and_node_names_in_the_spec_and_the_job_ends_when_every_node_reported()
 {
    conformance(110, Replicas::Any, Setup::default(), |target| async move {
        let (agent, socket) = register_with(
            &target,
            &["conf-n1", "conf-n2"],
            TestAgent::new(LaunchRule::Accept),
        )
        .await;
        let mut client = target.client().await;
        let id = client
            .submit_job(submit(two_node_spec("conf-two")))
            .await
            .unwrap()
            .into_inner()
            .job_id;
        // spurctld commits RUNNING, then the nodes: for a moment a running job lists none.
        let info = until_job(&target, id, Duration::from_secs(20), "running", |j| {
            state(j) == pb::JobState::JobRunning && !j.nodelist.is_empty()
        })
        .await;
        // [15] a compressed hostlist.
        assert_eq!(info.nodelist, "conf-n[1-2]", "{}", target.name);

        let mut launches = agent.launches(id);
        launches.sort_by_key(|l| l.task_offset);
        assert_eq!(launches.len(), 2, "{}: {launches:?}", target.name);
        let names: Vec<&str> = launches.iter().map(|l| l.target_node.as_str()).collect();
        let nodelist = launches[0].spec.as_ref().unwrap().nodelist.clone();
        for (rank, launch) in launches.iter().enumerate() {
            assert_eq!(launch.peer_nodes, [socket.clone(), socket.clone()]);
            assert_eq!(launch.task_offset, rank as u32 * 2, "{}", target.name);
            let spec = launch.spec.as_ref().unwrap();
            assert_eq!(spec.nodelist, nodelist);
            let position = spec
                .nodelist
                .split(',')
                .position(|n| n == launch.target_node);
            assert_eq!(position, Some(rank), "{}: {launch:?}", target.name);
            assert!(launch.run_attempt >= 1, "{}: {launch:?}", target.name);
        }
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(sorted, ["conf-n1", "conf-n2"]);

        let report = |node: &str, exit_code: i32| pb::ReportJobStatusRequest {
            job_id: id,
            state: if exit_code == 0 {
                pb::JobState::JobCompleted as i32
            } else {
                pb::JobState::JobFailed as i32
            },
            exit_code,
            reporting_node: node.to_owned(),
            run_attempt: launches[0].run_attempt,
            ..Default::default()
        };
        // [7] an empty reporting node is an OK no-op.
        client.report_job_status(report("", 0)).await.unwrap();
        assert_eq!(state(&job(&target, id).await), pb::JobState::JobRunning);
        // A node outside the allocation is refused.
        let outside = client
            .report_job_status(report("conf-elsewhere", 0))
            .await
            .unwrap_err();
        assert_eq!(
            outside.code(),
            Code::InvalidArgument,
            "{}: {outside:?}",
            target.name
        );
        assert!(
            outside
                .message()
                .contains(&format!("node conf-elsewhere is not allocated to job {id}")),
            "{}: {outside:?}",
            target.name
        );
        // One node's end moves the job to COMPLETING until the other reports; the job's
        // result is the first node's (rank 0), whatever the others exited with.
        client.report_job_status(report(names[0], 0)).await.unwrap();
        let partial = state(&job(&target, id).await);
        assert_eq!(partial, pb::JobState::JobCompleting, "{}", target.name);
        client.report_job_status(report(names[1], 3)).await.unwrap();
        let done = until_job(&target, id, Duration::from_secs(5), "ended", |j| {
            state(j) != pb::JobState::JobCompleting
        })
        .await;
        assert_eq!(
            state(&done),
            pb::JobState::JobCompleted,
            "{}: {done:?}",
            target.name
        );
        assert_eq!(done.exit_code, 0, "{}: {done:?}", target.name);
    });
}

/// spurd's OOM sentinel: a report whose signal carries bit 0x1000 ends the job
/// OUT_OF_MEMORY with reason `OutOfMemory`, whatever its state and exit code; the
/// operator reports an OOMKilled container this way.
#[test]
fn a_report_with_the_oom_bit_in_its_signal_ends_the_job_out_of_memory() {
    conformance(117, Replicas::Any, Setup::default(), |target| async move {
        let (agent, _) =
            register_with(&target, &["conf-oom"], TestAgent::new(LaunchRule::Accept)).await;
        let mut client = target.client().await;
        let id = client
            .submit_job(submit(spec("conf-oom-job")))
            .await
            .unwrap()
            .into_inner()
            .job_id;
        until_job(&target, id, Duration::from_secs(20), "running", |j| {
            state(j) == pb::JobState::JobRunning && !j.nodelist.is_empty()
        })
        .await;
        let run_attempt = agent.launches(id)[0].run_attempt;
        client
            .report_job_status(pb::ReportJobStatusRequest {
                job_id: id,
                state: pb::JobState::JobFailed as i32,
                exit_code: 137,
                signal: spur_operator::OOM_KILLED_SIGNAL,
                message: "OOMKilled".to_owned(),
                reporting_node: "conf-oom".to_owned(),
                run_attempt,
                ..Default::default()
            })
            .await
            .unwrap();
        let done = until_job(&target, id, Duration::from_secs(5), "ended", |j| {
            state(j) != pb::JobState::JobRunning && state(j) != pb::JobState::JobCompleting
        })
        .await;
        assert_eq!(
            state(&done),
            pb::JobState::JobOutOfMemory,
            "{}: {done:?}",
            target.name
        );
        assert_eq!(done.exit_code, 137, "{}: {done:?}", target.name);
        assert_eq!(
            done.state_reason, "OutOfMemory",
            "{}: {done:?}",
            target.name
        );
    });
}

#[test]
fn a_job_stays_pending_while_its_launch_is_held_open() {
    conformance(111, Replicas::Any, Setup::default(), |target| async move {
        let (agent, _) =
            register_with(&target, &["conf-held"], TestAgent::new(LaunchRule::Hold)).await;
        let mut client = target.client().await;
        let id = client
            .submit_job(submit(spec("conf-held-job")))
            .await
            .unwrap()
            .into_inner()
            .job_id;
        agent
            .wait_for_launches(id, 1, Duration::from_secs(20))
            .await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let held = job(&target, id).await;
        assert_eq!(
            state(&held),
            pb::JobState::JobPending,
            "{}: {held:?}",
            target.name
        );
        assert_eq!(
            held.nodelist, "",
            "{}: no nodes while dispatching",
            target.name
        );
        // [7] a report during the dispatch is refused: the job has no nodes yet.
        let early = client
            .report_job_status(pb::ReportJobStatusRequest {
                job_id: id,
                state: pb::JobState::JobCompleted as i32,
                reporting_node: "conf-held".to_owned(),
                run_attempt: 1,
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(
            early.code(),
            Code::InvalidArgument,
            "{}: {early:?}",
            target.name
        );
        assert!(
            early
                .message()
                .contains(&format!("node conf-held is not allocated to job {id}")),
            "{}: {early:?}",
            target.name
        );
        agent.release();
        until_job(&target, id, Duration::from_secs(10), "running", |j| {
            state(j) == pb::JobState::JobRunning
        })
        .await;
    });
}

#[test]
fn a_refused_launch_cancels_the_launched_nodes_and_is_retried_with_the_same_run_attempt_after_5s() {
    conformance(112, Replicas::Any, Setup::default(), |target| async move {
        let (agent, _) = register_with(
            &target,
            &["conf-r1", "conf-r2"],
            TestAgent::new(LaunchRule::RefuseFirstOn("conf-r2".to_owned())),
        )
        .await;
        let mut client = target.client().await;
        let id = client
            .submit_job(submit(two_node_spec("conf-refused")))
            .await
            .unwrap()
            .into_inner()
            .job_id;
        until_job(&target, id, Duration::from_secs(40), "running", |j| {
            state(j) == pb::JobState::JobRunning
        })
        .await;
        let launches = agent.launch_times(id);
        assert_eq!(launches.len(), 4, "{}: two rounds of two", target.name);
        let attempts: Vec<u32> = launches.iter().map(|(l, _)| l.run_attempt).collect();
        assert!(
            attempts.iter().all(|a| *a == attempts[0]),
            "{}: the retry keeps the run attempt: {attempts:?}",
            target.name
        );
        let gap = launches[2].1.duration_since(launches[0].1);
        assert!(
            gap >= Duration::from_millis(4500) && gap <= Duration::from_secs(12),
            "{}: retried {gap:?} after the refusal",
            target.name
        );
        let cancels = agent.cancels(id);
        assert!(
            cancels.contains(&9),
            "{}: the node that launched is cancelled with signal 9: {cancels:?}",
            target.name
        );
    });
}

// ---- Elections [8, 10, 20]

#[test]
fn a_killed_leader_is_replaced_within_about_6s_and_job_ids_continue() {
    conformance(
        120,
        Replicas::Three,
        Setup::default(),
        |target| async move {
            let mut client = target.client().await;
            let before = client
                .submit_job(submit(spec("conf-pre")))
                .await
                .unwrap()
                .into_inner()
                .job_id;
            let leader = target.wait_for_leader().await;
            let follower = (leader + 1) % 3;
            target.kill(leader).await;
            let killed = tokio::time::Instant::now();
            let mut refusals = 0;
            let after = loop {
                let result = match target.try_replica(follower).await {
                    Some(mut client) => client.submit_job(submit(spec("conf-post"))).await,
                    None => Err(tonic::Status::unavailable("connect")),
                };
                match result {
                    Ok(answer) => break answer.into_inner().job_id,
                    Err(status) => {
                        assert!(
                            matches!(
                                status.code(),
                                Code::Unavailable | Code::Unknown | Code::Internal
                            ),
                            "{}: {status:?}",
                            target.name
                        );
                        refusals += 1;
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            };
            let took = killed.elapsed();
            assert!(
                refusals > 0,
                "{}: writes failed during the election",
                target.name
            );
            assert!(
                took >= Duration::from_secs(3) && took <= Duration::from_secs(12),
                "{}: a new leader took writes {took:?} after the kill",
                target.name
            );
            assert!(after > before, "{}: {after} after {before}", target.name);
        },
    );
}

#[test]
fn a_follower_without_a_leader_refuses_writes_not_the_raft_leader_without_a_hint() {
    conformance(
        121,
        Replicas::Three,
        Setup::default(),
        |target| async move {
            let leader = target.wait_for_leader().await;
            let survivor = (leader + 1) % 3;
            target.kill(leader).await;
            target.kill((leader + 2) % 3).await;
            let start = tokio::time::Instant::now();
            loop {
                let mut client = target.replica(survivor).await;
                let answer = tokio::time::timeout(
                    Duration::from_secs(3),
                    client.submit_job(submit(spec("conf-orphan"))),
                )
                .await;
                if let Ok(Err(status)) = &answer
                    && status.code() == Code::Unavailable
                    && status.message() == "not the Raft leader"
                    && status.metadata().get(spur_proto::LEADER_HINT_KEY).is_none()
                {
                    break;
                }
                assert!(
                    start.elapsed() < Duration::from_secs(20),
                    "{}: still {answer:?} 20 s after losing the majority",
                    target.name
                );
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        },
    );
}

#[test]
fn a_leader_without_quorum_still_accepts_heartbeats() {
    conformance(
        122,
        Replicas::Three,
        Setup::default(),
        |target| async move {
            let mut client = target.client().await;
            client
                .register_agent(unreachable_node("conf-lonely"))
                .await
                .unwrap();
            let leader = target.wait_for_leader().await;
            target.kill((leader + 1) % 3).await;
            target.kill((leader + 2) % 3).await;
            tokio::time::sleep(Duration::from_secs(1)).await;
            let mut client = target.replica(leader).await;
            client
                .heartbeat(heartbeat("conf-lonely"))
                .await
                .unwrap_or_else(|s| panic!("{}: {s:?}", target.name));
        },
    );
}

#[test]
fn down_fails_a_running_job_at_once_and_drain_leaves_it_running() {
    conformance(113, Replicas::Any, Setup::default(), |target| async move {
        let (agent, _) = register_with(
            &target,
            &["conf-down", "conf-drain"],
            TestAgent::new(LaunchRule::Accept),
        )
        .await;
        let mut client = target.client().await;
        let mut ids = Vec::new();
        for name in ["conf-on-down", "conf-on-drain"] {
            let id = client
                .submit_job(submit(spec(name)))
                .await
                .unwrap()
                .into_inner()
                .job_id;
            until_job(&target, id, Duration::from_secs(20), "running", |j| {
                state(j) == pb::JobState::JobRunning && !j.nodelist.is_empty()
            })
            .await;
            ids.push(id);
        }
        for id in &ids {
            let node = job(&target, *id).await.nodelist;
            let node_state = if node == "conf-down" {
                pb::NodeState::NodeDown
            } else {
                pb::NodeState::NodeDrain
            };
            client
                .update_node(pb::UpdateNodeRequest {
                    name: node,
                    state: Some(node_state as i32),
                    reason: Some("conformance".to_owned()),
                    ..Default::default()
                })
                .await
                .unwrap();
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        for id in &ids {
            let info = job(&target, *id).await;
            let expected = if info.nodelist == "conf-down" {
                pb::JobState::JobNodeFail
            } else {
                pb::JobState::JobRunning
            };
            assert_eq!(state(&info), expected, "{}: {info:?}", target.name);
            if expected == pb::JobState::JobNodeFail {
                assert_eq!(info.exit_code, -1, "{}: {info:?}", target.name);
                // UpdateNode does not tell the agent.
                assert!(agent.cancels(*id).is_empty(), "{}", target.name);
            }
        }
    });
}

#[test]
fn a_cancel_of_a_running_job_tells_its_agent_with_signal_0() {
    conformance(114, Replicas::Any, Setup::default(), |target| async move {
        let (agent, _) =
            register_with(&target, &["conf-c1"], TestAgent::new(LaunchRule::Accept)).await;
        let mut client = target.client().await;
        let id = client
            .submit_job(submit(spec("conf-cancel-running")))
            .await
            .unwrap()
            .into_inner()
            .job_id;
        until_job(&target, id, Duration::from_secs(20), "running", |j| {
            state(j) == pb::JobState::JobRunning && !j.nodelist.is_empty()
        })
        .await;
        client
            .cancel_job(pb::CancelJobRequest {
                job_id: id,
                ..Default::default()
            })
            .await
            .unwrap();
        let start = tokio::time::Instant::now();
        while agent.cancels(id).is_empty() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "{}: the agent was not told",
                target.name
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(agent.cancels(id), [0], "{}", target.name);
        assert_eq!(state(&job(&target, id).await), pb::JobState::JobCancelled);
    });
}

/// `scontrol requeue` (the failure policy's restart): a running job goes back to PENDING
/// under its id, waiting for `BeginTime`, with no start time and no nodes; its agent is told
/// to stop with signal 0; it is launched again with the next run attempt no sooner than 5 s
/// later. Refused: an unknown job (FAILED_PRECONDITION), another user's job
/// (PERMISSION_DENIED), and a job already pending.
#[test]
fn a_requeued_running_job_is_pending_under_its_id_and_launched_again_with_the_next_run_attempt_after_5s()
 {
    conformance(118, Replicas::Any, Setup::default(), |target| async move {
        let (agent, _) =
            register_with(&target, &["conf-q1"], TestAgent::new(LaunchRule::Accept)).await;
        let mut client = target.client().await;
        let id = client
            .submit_job(submit(pb::JobSpec {
                user: "conf-user".to_owned(),
                ..spec("conf-requeue")
            }))
            .await
            .unwrap()
            .into_inner()
            .job_id;
        until_job(&target, id, Duration::from_secs(20), "running", |j| {
            state(j) == pb::JobState::JobRunning && !j.nodelist.is_empty()
        })
        .await;
        let requeue = |job_id: u32, user: &str| pb::RequeueJobRequest {
            job_id,
            user: user.to_owned(),
            hold: false,
        };
        let unknown = client
            .requeue_job(requeue(id + 1000, "conf-user"))
            .await
            .unwrap_err();
        assert_eq!(
            unknown.code(),
            Code::FailedPrecondition,
            "{}: {unknown:?}",
            target.name
        );
        assert!(
            unknown.message().contains("not found"),
            "{}: {unknown:?}",
            target.name
        );
        let stranger = client
            .requeue_job(requeue(id, "conf-other"))
            .await
            .unwrap_err();
        assert_eq!(
            stranger.code(),
            Code::PermissionDenied,
            "{}: {stranger:?}",
            target.name
        );
        assert_eq!(state(&job(&target, id).await), pb::JobState::JobRunning);

        let answer = client
            .requeue_job(requeue(id, "conf-user"))
            .await
            .unwrap()
            .into_inner();
        let requeued_at = tokio::time::Instant::now();
        assert_eq!(answer.requeued, 1, "{}: {answer:?}", target.name);
        let info = job(&target, id).await;
        assert_eq!(
            state(&info),
            pb::JobState::JobPending,
            "{}: {info:?}",
            target.name
        );
        assert_eq!(info.state_reason, "BeginTime", "{}: {info:?}", target.name);
        assert!(info.start_time.is_none(), "{}: {info:?}", target.name);
        assert!(info.nodelist.is_empty(), "{}: {info:?}", target.name);
        let again = client
            .requeue_job(requeue(id, "conf-user"))
            .await
            .unwrap_err();
        assert_eq!(
            again.code(),
            Code::FailedPrecondition,
            "{}: {again:?}",
            target.name
        );
        assert!(
            again.message().contains("already pending"),
            "{}: {again:?}",
            target.name
        );
        while agent.cancels(id).is_empty() {
            assert!(
                requeued_at.elapsed() < Duration::from_secs(10),
                "{}: the agent was not told",
                target.name
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(agent.cancels(id), [0], "{}", target.name);

        until_job(&target, id, Duration::from_secs(30), "running again", |j| {
            state(j) == pb::JobState::JobRunning && !j.nodelist.is_empty()
        })
        .await;
        let launches = agent.launch_times(id);
        assert_eq!(launches.len(), 2, "{}: {launches:?}", target.name);
        assert_eq!(
            launches[1].0.run_attempt,
            launches[0].0.run_attempt + 1,
            "{}: {launches:?}",
            target.name
        );
        let gap = launches[1].1.duration_since(requeued_at);
        assert!(
            gap >= Duration::from_millis(4500),
            "{}: launched again {gap:?} after the requeue",
            target.name
        );
    });
}

/// The claims of a `Bearer <JWT>` header (not verified: the agent under test does that).
fn claims(header: &str) -> serde_json::Value {
    use base64::Engine;
    let token = header.strip_prefix("Bearer ").expect("a bearer token");
    let payload = token.split('.').nth(1).expect("three parts");
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload)
        .expect("base64url");
    serde_json::from_slice(&bytes).expect("JSON claims")
}

#[test]
fn with_a_jwt_key_spurctld_sends_the_agent_a_token_with_its_claims_and_none_without() {
    for key in [None, Some("conformance-agent-key-of-32-bytes!!")] {
        let setup = Setup {
            jwt_key: key.map(str::to_owned),
            ..Setup::default()
        };
        conformance(115, Replicas::One, setup, move |target| async move {
            let (agent, _) =
                register_with(&target, &["conf-auth"], TestAgent::new(LaunchRule::Accept)).await;
            let mut client = target.client().await;
            let id = client
                .submit_job(submit(spec("conf-auth-job")))
                .await
                .unwrap()
                .into_inner()
                .job_id;
            agent
                .wait_for_launches(id, 1, Duration::from_secs(20))
                .await;
            let headers = agent.authorizations();
            match key {
                None => assert!(
                    headers.iter().all(Option::is_none),
                    "{}: {headers:?}",
                    target.name
                ),
                Some(_) => {
                    let header = headers[0].as_deref().expect("a token");
                    let claims = claims(header);
                    assert_eq!(claims["sub"], "spurctld", "{}: {claims}", target.name);
                    assert_eq!(claims["uid"], 0, "{}: {claims}", target.name);
                    assert_eq!(claims["admin"], true, "{}: {claims}", target.name);
                    let exp = claims["exp"].as_u64().expect("exp");
                    let iat = claims["iat"].as_u64().expect("iat");
                    assert_eq!(exp - iat, 300, "{}: {claims}", target.name);
                }
            }
        });
    }
}

/// The node comes back too: a DOWN the health check made is lifted by the first tick
/// (every 30 s) that finds a heartbeat within the timeout (spurctld's
/// `HeartbeatRecovered`; an UpdateNode to DOWN would lock it). The node's job failed, so
/// nothing holds it: IDLE.
#[test]
fn a_node_silent_past_the_heartbeat_timeout_goes_down_and_its_job_node_fails() {
    let setup = Setup {
        heartbeat_timeout_secs: Some(5),
        ..Setup::default()
    };
    conformance(116, Replicas::One, setup, |target| async move {
        let (agent, _) = register_with(
            &target,
            &["conf-silent"],
            TestAgent::new(LaunchRule::Accept),
        )
        .await;
        let mut client = target.client().await;
        let id = client
            .submit_job(submit(spec("conf-silent-job")))
            .await
            .unwrap()
            .into_inner()
            .job_id;
        until_job(&target, id, Duration::from_secs(20), "running", |j| {
            state(j) == pb::JobState::JobRunning
        })
        .await;
        // No more heartbeats: the health check ticks at the replica's start and every
        // 30 s after, and its grace of 30 s counts from the first tick that found the
        // replica leading, by the clock readings of the ticks. A lone real replica leads
        // within milliseconds of its start, yet its tick at start may not see it yet, and
        // a tick one period after the grace began may read a hair under 30 s: the node
        // goes DOWN at the tick at 30, 60 or (CI saw it) 90 s; the model's at 60 s. The
        // job ran within the first seconds, so 95 s from now covers them all.
        let info = until_job(&target, id, Duration::from_secs(95), "failed", |j| {
            state(j) == pb::JobState::JobNodeFail
        })
        .await;
        assert_eq!(info.exit_code, -1, "{}: {info:?}", target.name);
        let start = tokio::time::Instant::now();
        while !agent.cancels(id).contains(&9) {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "{}: the agent was not told with signal 9: {:?}",
                target.name,
                agent.cancels(id)
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        // A heartbeat of a DOWN node is still accepted, and heartbeats bring it back
        // within a tick; each second, so one is always within the 5 s timeout.
        let start = tokio::time::Instant::now();
        loop {
            client.heartbeat(heartbeat("conf-silent")).await.unwrap();
            let node = client
                .get_nodes(pb::GetNodesRequest::default())
                .await
                .unwrap()
                .into_inner()
                .nodes
                .into_iter()
                .find(|n| n.name == "conf-silent")
                .expect("still registered");
            if node.state == pb::NodeState::NodeIdle as i32 {
                break;
            }
            assert_eq!(
                node.state,
                pb::NodeState::NodeDown as i32,
                "{}: {node:?}",
                target.name
            );
            assert!(
                start.elapsed() < Duration::from_secs(35),
                "{}: still DOWN {:?} after heartbeats resumed",
                target.name,
                start.elapsed()
            );
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });
}

#[test]
fn writes_through_a_follower_hang_while_the_leader_is_frozen_until_a_new_leader_takes_over() {
    conformance(
        123,
        Replicas::Three,
        Setup::default(),
        |target| async move {
            // A fresh real cluster may elect twice, seconds apart: the leader is asked again
            // once the follower forwards, and the freeze waits for one that stayed. The
            // second election can still fall between that check and the freeze (CI saw a
            // write answered at once on real-3): then the replica frozen led no more, and
            // the round is made again. The model elects once, so there an answer is a
            // failure.
            let mut rounds = 0;
            let (leader, follower, frozen) = loop {
                rounds += 1;
                assert!(rounds <= 5, "{}: the leader keeps changing", target.name);
                let leader = target.wait_for_leader().await;
                let follower = (leader + 1) % 3;
                // The follower's forwarding client is made before the freeze (a follower of
                // a fresh cluster may not know the leader for a moment).
                let mut client = target.replica(follower).await;
                let start = tokio::time::Instant::now();
                while let Err(status) = client.submit_job(submit(spec("conf-before-freeze"))).await
                {
                    assert!(
                        start.elapsed() < Duration::from_secs(10),
                        "{}: the follower forwards no write: {status:?}",
                        target.name
                    );
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                if target.wait_for_leader().await != leader {
                    continue;
                }
                target.freeze(leader).await;
                let frozen = tokio::time::Instant::now();
                let hung = tokio::time::timeout(
                    Duration::from_secs(2),
                    client.submit_job(submit(spec("conf-frozen"))),
                )
                .await;
                if hung.is_err() {
                    break (leader, follower, frozen);
                }
                assert!(
                    target.name != "sim",
                    "{}: a write through the follower answered at once: {hung:?}",
                    target.name
                );
                target.thaw(leader).await;
            };
            let took = loop {
                let mut client = target.replica(follower).await;
                if let Ok(Ok(_)) = tokio::time::timeout(
                    Duration::from_secs(3),
                    client.submit_job(submit(spec("conf-after-freeze"))),
                )
                .await
                {
                    break frozen.elapsed();
                }
                assert!(
                    frozen.elapsed() < Duration::from_secs(30),
                    "{}: no write answered 30 s after the freeze{}",
                    target.name,
                    target.logs()
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            };
            assert!(
                took >= Duration::from_secs(3) && took <= Duration::from_secs(15),
                "{}: a write was answered {took:?} after the freeze",
                target.name
            );
            target.thaw(leader).await;
        },
    );
}

#[test]
fn a_submission_to_an_unknown_partition_is_invalid_argument_and_to_the_default_one_accepted() {
    conformance(109, Replicas::Any, Setup::default(), |target| async move {
        let mut client = target.client().await;
        let unknown = pb::JobSpec {
            partition: "conf-nowhere".to_owned(),
            ..spec("conf-partition")
        };
        let status = client.submit_job(submit(unknown)).await.unwrap_err();
        assert_eq!(
            status.code(),
            Code::InvalidArgument,
            "{}: {status:?}",
            target.name
        );
        assert!(
            status
                .message()
                .contains("partition 'conf-nowhere' not found"),
            "{}: {status:?}",
            target.name
        );
        let default = pb::JobSpec {
            partition: "default".to_owned(),
            ..spec("conf-partition")
        };
        client
            .submit_job(submit(default))
            .await
            .unwrap_or_else(|s| panic!("{}: {s:?}", target.name));
    });
}

// ---- Token admission [12]

fn token_admission() -> Setup {
    Setup {
        token_admission: true,
        ..Setup::default()
    }
}

/// A registration carrying `join_token`.
fn admitted(name: &str, join_token: &str) -> pb::RegisterAgentRequest {
    pb::RegisterAgentRequest {
        join_token: join_token.to_owned(),
        ..unreachable_node(name)
    }
}

fn with_node_token(name: &str, node_token: &str) -> pb::HeartbeatRequest {
    pb::HeartbeatRequest {
        node_token: node_token.to_owned(),
        ..heartbeat(name)
    }
}

/// The code and text of a refusal; panics on an answer.
fn refusal<T: std::fmt::Debug>(answer: Result<T, tonic::Status>) -> (Code, String) {
    let status = answer.expect_err("refused");
    (status.code(), status.message().to_owned())
}

async fn create_token(target: &Target, ttl_secs: Option<u32>) -> pb::CreateTokenResponse {
    let mut client = target.client().await;
    client
        .create_token(pb::CreateTokenRequest { ttl_secs })
        .await
        .unwrap_or_else(|s| panic!("{}: CreateToken: {s:?}", target.name))
        .into_inner()
}

#[test]
fn under_open_admission_a_registration_is_answered_with_no_node_token() {
    conformance(120, Replicas::One, Setup::default(), |target| async move {
        let mut client = target.client().await;
        let answer = client.register_agent(unreachable_node("conf-open")).await;
        let answer = answer.unwrap().into_inner();
        assert!(answer.accepted, "{}: {answer:?}", target.name);
        assert_eq!(answer.node_token, "", "{}", target.name);
    });
}

#[test]
fn under_token_admission_a_registration_needs_a_join_token_and_a_heartbeat_its_node_token() {
    conformance(121, Replicas::Any, token_admission(), |target| async move {
        let name = target.name;
        let mut client = target.client().await;
        let unadmitted = client.register_agent(unreachable_node("conf-tok")).await;
        let required = (Code::Unauthenticated, "admission token required".to_owned());
        assert_eq!(refusal(unadmitted), required, "{name}");
        let malformed = client.register_agent(admitted("conf-tok", "abc")).await;
        let format = (Code::PermissionDenied, "invalid token format".to_owned());
        assert_eq!(refusal(malformed), format, "{name}");
        let unknown = format!("000000.{}", "0".repeat(64));
        let unknown = client.register_agent(admitted("conf-tok", &unknown)).await;
        let not_found = (Code::PermissionDenied, "token not found: 000000".to_owned());
        assert_eq!(refusal(unknown), not_found, "{name}");

        let created = create_token(&target, None).await;
        let (id, secret) = created.token.split_once('.').expect("<id>.<secret>");
        assert_eq!(
            (id, id.len(), secret.len()),
            (created.token_id.as_str(), 6, 64),
            "{name}"
        );
        let wrong = format!("{id}.{}", "0".repeat(64));
        let wrong = client.register_agent(admitted("conf-tok", &wrong)).await;
        let secret_refused = (Code::PermissionDenied, "invalid token secret".to_owned());
        assert_eq!(refusal(wrong), secret_refused, "{name}");
        let answer = client
            .register_agent(admitted("conf-tok", &created.token))
            .await;
        let node_token = answer.unwrap().into_inner().node_token;
        let claims = claims(&format!("Bearer {node_token}"));
        assert_eq!(claims["sub"], "conf-tok", "{name}: {claims}");
        let lifetime = claims["exp"].as_u64().unwrap() - claims["iat"].as_u64().unwrap();
        assert_eq!(lifetime, 7 * 24 * 3600, "{name}: {claims}");

        let beat = |token: &str| with_node_token("conf-tok", token);
        let missing = refusal(client.heartbeat(beat("")).await);
        let missing_wanted = (Code::Unauthenticated, "node token required".to_owned());
        assert_eq!(missing, missing_wanted, "{name}");
        let forged = refusal(client.heartbeat(beat("garbage")).await);
        let forged_wanted = (
            Code::Unauthenticated,
            "invalid node token: InvalidToken".to_owned(),
        );
        assert_eq!(forged, forged_wanted, "{name}");
        let borrowed = with_node_token("conf-other", &node_token);
        let borrowed = refusal(client.heartbeat(borrowed).await);
        let mismatch = (
            Code::PermissionDenied,
            "node token hostname mismatch".to_owned(),
        );
        assert_eq!(borrowed, mismatch, "{name}");
        client.heartbeat(beat(&node_token)).await.unwrap();
    });
}

#[test]
fn a_revoked_or_expired_join_token_admits_no_one_while_its_node_tokens_still_serve() {
    conformance(122, Replicas::Any, token_admission(), |target| async move {
        let name = target.name;
        let mut client = target.client().await;
        let created = create_token(&target, None).await;
        let answer = client
            .register_agent(admitted("conf-rev", &created.token))
            .await;
        let node_token = answer.unwrap().into_inner().node_token;
        let revoke = pb::RevokeTokenRequest {
            token_id: created.token_id.clone(),
        };
        client.revoke_token(revoke).await.unwrap();
        let again = client
            .register_agent(admitted("conf-rev", &created.token))
            .await;
        let revoked = (Code::PermissionDenied, "token revoked".to_owned());
        assert_eq!(refusal(again), revoked, "{name}");
        let beat = with_node_token("conf-rev", &node_token);
        client.heartbeat(beat).await.unwrap();
        let unknown = pb::RevokeTokenRequest {
            token_id: "ffffff".to_owned(),
        };
        let unknown = refusal(client.revoke_token(unknown).await);
        let not_found = (Code::NotFound, "token not found: ffffff".to_owned());
        assert_eq!(unknown, not_found, "{name}");

        let short = create_token(&target, Some(1)).await;
        tokio::time::sleep(Duration::from_millis(2500)).await;
        // A leader again: under load three real replicas may have elected anew meanwhile.
        let mut client = target.client().await;
        let late = client
            .register_agent(admitted("conf-rev", &short.token))
            .await;
        let expired = (Code::PermissionDenied, "token expired".to_owned());
        assert_eq!(refusal(late), expired, "{name}");
    });
}
