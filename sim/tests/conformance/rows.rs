//! Cases for the fidelity rows that were cheap to pin once RequeueJob and GetNodes existed:
//! a stale run attempt [7], re-registration [5, 18], who may cancel [9], a requeue of an
//! ended job, the hold after failed launches [4], the eviction of ended jobs [17] and the
//! controller's authentication of its callers [12].

use std::time::Duration;

use spur_proto as pb;
use tonic::Code;

use super::agent::{LaunchRule, TestAgent};
use super::target::{Replicas, Setup, Target, conformance};
use super::{heartbeat, job, register_with, spec, state, submit, unreachable_node, until_job};

fn requeue(job_id: u32, user: &str) -> pb::RequeueJobRequest {
    pb::RequeueJobRequest {
        job_id,
        user: user.to_owned(),
        hold: false,
    }
}

fn completed_on(node: &str, job_id: u32, run_attempt: u32) -> pb::ReportJobStatusRequest {
    pb::ReportJobStatusRequest {
        job_id,
        state: pb::JobState::JobCompleted as i32,
        exit_code: 0,
        reporting_node: node.to_owned(),
        run_attempt,
        ..Default::default()
    }
}

/// Submits a one-node job owned by `user` and waits until it runs.
async fn running_job(target: &Target, name: &str, user: &str) -> u32 {
    let id = target
        .client()
        .await
        .submit_job(submit(pb::JobSpec {
            user: user.to_owned(),
            ..spec(name)
        }))
        .await
        .unwrap()
        .into_inner()
        .job_id;
    until_job(target, id, Duration::from_secs(20), "running", |j| {
        state(j) == pb::JobState::JobRunning && !j.nodelist.is_empty()
    })
    .await;
    id
}

/// Node `name` as GetNodes lists it.
async fn node(target: &Target, name: &str) -> pb::NodeInfo {
    let nodes = target
        .client()
        .await
        .get_nodes(pb::GetNodesRequest::default())
        .await
        .unwrap()
        .into_inner()
        .nodes;
    nodes
        .iter()
        .find(|n| n.name == name)
        .cloned()
        .unwrap_or_else(|| panic!("{}: {name} not listed: {nodes:?}", target.name))
}

// ---- ReportJobStatus [7]

/// The pods of a requeued run may end after the next run started: their report names the
/// old run attempt and must neither end nor fail the new run.
#[test]
fn a_report_of_an_older_run_attempt_is_ignored_and_the_current_attempts_report_ends_the_job() {
    conformance(125, Replicas::Any, Setup::default(), |target| async move {
        let (agent, _) =
            register_with(&target, &["conf-st1"], TestAgent::new(LaunchRule::Accept)).await;
        let id = running_job(&target, "conf-stale", "conf-user").await;
        let mut client = target.client().await;
        client
            .requeue_job(requeue(id, "conf-user"))
            .await
            .unwrap_or_else(|s| panic!("{}: {s:?}", target.name));
        agent
            .wait_for_launches(id, 2, Duration::from_secs(30))
            .await;
        until_job(&target, id, Duration::from_secs(10), "running again", |j| {
            state(j) == pb::JobState::JobRunning && !j.nodelist.is_empty()
        })
        .await;
        let launches = agent.launches(id);
        let (old, current) = (launches[0].run_attempt, launches[1].run_attempt);
        assert!(old < current, "{}: {launches:?}", target.name);

        client
            .report_job_status(completed_on("conf-st1", id, old))
            .await
            .unwrap_or_else(|s| panic!("{}: a stale report: {s:?}", target.name));
        tokio::time::sleep(Duration::from_millis(500)).await;
        let info = job(&target, id).await;
        assert_eq!(
            state(&info),
            pb::JobState::JobRunning,
            "{}: after a report of attempt {old}: {info:?}",
            target.name
        );

        client
            .report_job_status(completed_on("conf-st1", id, current))
            .await
            .unwrap();
        let done = until_job(&target, id, Duration::from_secs(5), "ended", |j| {
            state(j) != pb::JobState::JobRunning && state(j) != pb::JobState::JobCompleting
        })
        .await;
        assert_eq!(state(&done), pb::JobState::JobCompleted, "{}", target.name);
    });
}

// ---- Registration [5, 18]

/// After an operator restart every node registers again: a node an administrator drained,
/// or marked DOWN, stays so, whether the registration changes its resources or not, and
/// heartbeats do not lift the hold either.
#[test]
fn a_drained_or_down_node_keeps_its_state_when_it_registers_again() {
    conformance(126, Replicas::Any, Setup::default(), |target| async move {
        let mut client = target.client().await;
        let held = [
            ("conf-rr-drain", pb::NodeState::NodeDrain),
            ("conf-rr-down", pb::NodeState::NodeDown),
        ];
        for (name, node_state) in held {
            client.register_agent(unreachable_node(name)).await.unwrap();
            client
                .update_node(pb::UpdateNodeRequest {
                    name: name.to_owned(),
                    state: Some(node_state as i32),
                    reason: Some("admin: RMA 7".to_owned()),
                    ..Default::default()
                })
                .await
                .unwrap();
        }
        for cpus in [8, 16] {
            for (name, node_state) in held {
                let mut again = unreachable_node(name);
                again.resources.as_mut().unwrap().cpus = cpus;
                let answer = client.register_agent(again).await.unwrap().into_inner();
                assert!(answer.accepted, "{}: {answer:?}", target.name);
                client.heartbeat(heartbeat(name)).await.unwrap();
                let node = node(&target, name).await;
                assert_eq!(
                    node.state(),
                    node_state,
                    "{}: after registering with {cpus} cpus: {node:?}",
                    target.name
                );
                assert_eq!(node.state_reason, "admin: RMA 7", "{}", target.name);
            }
        }
    });
}

/// spurctld compares a registration with the node it has and proposes nothing when they
/// match. A client sees that only where a proposal cannot commit: a leader whose
/// followers are gone answers a registration that changes nothing at once, and holds one
/// that changes the resources.
#[test]
fn an_unchanged_registration_is_answered_by_a_leader_without_quorum_and_a_changed_one_waits() {
    conformance(
        127,
        Replicas::Three,
        Setup::default(),
        |target| async move {
            let mut client = target.client().await;
            client
                .register_agent(unreachable_node("conf-rr-lone"))
                .await
                .unwrap();
            let leader = target.wait_for_leader().await;
            target.kill((leader + 1) % 3).await;
            target.kill((leader + 2) % 3).await;
            tokio::time::sleep(Duration::from_secs(1)).await;
            let mut client = target.replica(leader).await;
            let unchanged = tokio::time::timeout(
                Duration::from_secs(3),
                client.register_agent(unreachable_node("conf-rr-lone")),
            )
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "{}: an unchanged registration waited for a quorum",
                    target.name
                )
            })
            .unwrap_or_else(|s| panic!("{}: {s:?}", target.name));
            assert!(unchanged.get_ref().accepted, "{}", target.name);

            let mut changed = unreachable_node("conf-rr-lone");
            changed.resources.as_mut().unwrap().cpus = 32;
            let answer =
                tokio::time::timeout(Duration::from_secs(3), client.register_agent(changed)).await;
            assert!(
                answer.is_err(),
                "{}: a changed registration was answered without a quorum: {answer:?}",
                target.name
            );
        },
    );
}

// ---- CancelJob [9]

#[test]
fn only_the_owner_root_or_an_empty_user_may_cancel_a_job() {
    conformance(128, Replicas::Any, Setup::default(), |target| async move {
        let mut client = target.client().await;
        let mut ids = Vec::new();
        for name in ["conf-own-1", "conf-own-2", "conf-own-3"] {
            let id = client
                .submit_job(submit(pb::JobSpec {
                    user: "conf-owner".to_owned(),
                    ..spec(name)
                }))
                .await
                .unwrap()
                .into_inner()
                .job_id;
            ids.push(id);
        }
        let cancel = |job_id: u32, user: &str| pb::CancelJobRequest {
            job_id,
            user: user.to_owned(),
            ..Default::default()
        };
        let refused = client
            .cancel_job(cancel(ids[0], "conf-other"))
            .await
            .unwrap_err();
        assert_eq!(
            refused.code(),
            Code::PermissionDenied,
            "{}: {refused:?}",
            target.name
        );
        assert!(
            refused
                .message()
                .contains("user conf-other cannot cancel job owned by conf-owner"),
            "{}: {refused:?}",
            target.name
        );
        assert_eq!(state(&job(&target, ids[0]).await), pb::JobState::JobPending);
        for (id, user) in [(ids[0], "conf-owner"), (ids[1], "root"), (ids[2], "")] {
            client
                .cancel_job(cancel(id, user))
                .await
                .unwrap_or_else(|s| panic!("{}: cancel by {user:?}: {s:?}", target.name));
            let info = job(&target, id).await;
            assert_eq!(state(&info), pb::JobState::JobCancelled, "{}", target.name);
        }
    });
}

// ---- RequeueJob of an ended job

/// The failure policy may restart a SpurJob whose job already ended: spurctld takes the
/// ended job back to PENDING under its id at once (no 5 s hold: nothing of it still runs)
/// and runs it again with the next run attempt. Only its owner may.
#[test]
fn a_requeued_ended_job_is_pending_again_at_once_and_runs_with_the_next_run_attempt() {
    conformance(129, Replicas::Any, Setup::default(), |target| async move {
        let (agent, _) =
            register_with(&target, &["conf-rq1"], TestAgent::new(LaunchRule::Accept)).await;
        let id = running_job(&target, "conf-ended", "conf-user").await;
        let first = agent.launches(id)[0].run_attempt;
        let mut client = target.client().await;
        client
            .report_job_status(completed_on("conf-rq1", id, first))
            .await
            .unwrap();
        until_job(&target, id, Duration::from_secs(5), "completed", |j| {
            state(j) == pb::JobState::JobCompleted
        })
        .await;

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
        let answer = client
            .requeue_job(requeue(id, "conf-user"))
            .await
            .unwrap_or_else(|s| panic!("{}: {s:?}", target.name))
            .into_inner();
        let requeued_at = tokio::time::Instant::now();
        assert_eq!(answer.requeued, 1, "{}: {answer:?}", target.name);
        assert!(answer.skipped.is_empty(), "{}: {answer:?}", target.name);

        agent
            .wait_for_launches(id, 2, Duration::from_secs(10))
            .await;
        let launches = agent.launch_times(id);
        let gap = launches[1].1.duration_since(requeued_at);
        assert!(
            gap < Duration::from_secs(4),
            "{}: launched again {gap:?} after the requeue",
            target.name
        );
        assert_eq!(launches[1].0.run_attempt, first + 1, "{}", target.name);
        let info = until_job(&target, id, Duration::from_secs(10), "running again", |j| {
            state(j) == pb::JobState::JobRunning && !j.nodelist.is_empty()
        })
        .await;
        assert!(info.end_time.is_none(), "{}: {info:?}", target.name);
        // Nothing of the ended run was running: the agent is told nothing.
        assert!(agent.cancels(id).is_empty(), "{}", target.name);
    });
}

// ---- The hold after failed launches [4]

/// spurctld backs a refused launch off 5 s doubling (capped by `max_launch_backoff_secs`,
/// shortened here to 1 s) and holds the job when a launch fails after `max_batch_requeue`
/// (5) retries: the job stays PENDING with no nodes, and no further launch comes.
#[test]
fn a_job_whose_launches_keep_failing_is_held_after_max_batch_requeue_failures() {
    let setup = Setup {
        max_launch_backoff_secs: Some(1),
        ..Setup::default()
    };
    conformance(130, Replicas::Any, setup, |target| async move {
        let (agent, _) = register_with(
            &target,
            &["conf-fail"],
            TestAgent::new(LaunchRule::RefuseAll),
        )
        .await;
        let id = target
            .client()
            .await
            .submit_job(submit(spec("conf-never")))
            .await
            .unwrap()
            .into_inner()
            .job_id;
        let info = until_job(&target, id, Duration::from_secs(40), "held", |j| {
            j.state_reason.contains("MaxRequeue")
        })
        .await;
        let tries = agent.launches(id).len();
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(
            agent.launches(id).len(),
            tries,
            "{}: launched again after the hold",
            target.name
        );
        assert_eq!(tries, HELD_AFTER_LAUNCHES, "{}: {info:?}", target.name);
        let held = job(&target, id).await;
        assert_eq!(
            state(&held),
            pb::JobState::JobPending,
            "{}: {held:?}",
            target.name
        );
        assert!(held.nodelist.is_empty(), "{}: {held:?}", target.name);
    });
}

/// How many launches a job whose every launch fails gets before the hold: the first and
/// `max_batch_requeue` (5) retries; the hold comes with the failure of the last.
const HELD_AFTER_LAUNCHES: usize = 6;

// ---- Eviction of ended jobs [17]

/// spurctld keeps an ended job at least 120 s (its accounting reconcile interval) whatever
/// `terminal_job_retention_secs` says, and evicts it on the next scheduler pass after that:
/// then GetJob answers NOT_FOUND and GetJobs omits it.
#[test]
fn an_ended_job_is_evicted_after_the_retention_floor_of_120s() {
    let setup = Setup {
        terminal_retention_secs: Some(1),
        ..Setup::default()
    };
    conformance(131, Replicas::One, setup, |target| async move {
        let mut client = target.client().await;
        let id = client
            .submit_job(submit(spec("conf-evicted")))
            .await
            .unwrap()
            .into_inner()
            .job_id;
        client
            .cancel_job(pb::CancelJobRequest {
                job_id: id,
                ..Default::default()
            })
            .await
            .unwrap();
        let ended = tokio::time::Instant::now();
        let gone = loop {
            let answer = client.get_job(pb::GetJobRequest { job_id: id }).await;
            match answer {
                Ok(info) => assert_eq!(
                    state(info.get_ref()),
                    pb::JobState::JobCancelled,
                    "{}",
                    target.name
                ),
                Err(status) => {
                    assert_eq!(status.code(), Code::NotFound, "{}: {status:?}", target.name);
                    break ended.elapsed();
                }
            }
            assert!(
                ended.elapsed() < Duration::from_secs(135),
                "{}: job {id} still kept {:?} after it ended",
                target.name,
                ended.elapsed()
            );
            tokio::time::sleep(Duration::from_secs(1)).await;
        };
        assert!(
            gone >= Duration::from_secs(119),
            "{}: evicted {gone:?} after it ended",
            target.name
        );
        let listed = client
            .get_jobs(pb::GetJobsRequest::default())
            .await
            .unwrap()
            .into_inner()
            .jobs;
        assert!(
            listed.iter().all(|j| j.job_id != id),
            "{}: {listed:?}",
            target.name
        );
    });
}

// ---- Authentication [12]

/// A bearer token for `subject`, signed with `key` as `spur token user` signs one; valid
/// far beyond any case on either clock.
fn bearer(key: &str, subject: &str) -> String {
    let token = spur_operator::sign_agent_token(
        key.as_bytes(),
        &serde_json::json!({"sub": subject, "uid": 0, "iat": 1_700_000_000u64,
            "exp": 4_000_000_000u64}),
    );
    format!("Bearer {token}")
}

/// `message` as a request carrying `authorization`, if any.
fn with_token<T>(message: T, authorization: Option<&str>) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(value) = authorization {
        request
            .metadata_mut()
            .insert("authorization", value.parse().expect("ascii"));
    }
    request
}

fn assert_unauthenticated<T: std::fmt::Debug>(
    target: &Target,
    what: &str,
    answer: Result<T, tonic::Status>,
    message: &str,
) {
    let status = answer.expect_err(what);
    assert_eq!(
        status.code(),
        Code::Unauthenticated,
        "{}: {what}: {status:?}",
        target.name
    );
    assert!(
        status.message().contains(message),
        "{}: {what}: {status:?}",
        target.name
    );
}

const AUTH_KEY: &str = "conformance-client-key-of-32-bytes";

/// `[auth] mode = "required"` with a key: a call without a token is refused, Ping
/// included; with a valid one it is answered, and the token's subject is the caller: a
/// job it submits is its own, and a cancel it sends is judged as its, whatever the
/// request's `user` says.
#[test]
fn in_required_mode_a_call_without_a_token_is_unauthenticated_and_a_tokens_subject_is_the_user() {
    let setup = Setup {
        jwt_key: Some(AUTH_KEY.to_owned()),
        auth_required: true,
        ..Setup::default()
    };
    conformance(132, Replicas::One, setup, |target| async move {
        let mut client = target.client().await;
        let missing = "authentication required";
        assert_unauthenticated(&target, "Ping", client.ping(()).await, missing);
        let unsigned = client.submit_job(submit(spec("conf-anon"))).await;
        assert_unauthenticated(&target, "SubmitJob", unsigned, missing);

        // A subject spurctld's passwd knows (it looks the submitter up), and not root,
        // whose jobs it refuses by default.
        let owner = bearer(AUTH_KEY, "nobody");
        client
            .ping(with_token((), Some(&owner)))
            .await
            .unwrap_or_else(|s| panic!("{}: Ping with a token: {s:?}", target.name));
        let id = client
            .submit_job(with_token(
                submit(pb::JobSpec {
                    user: "conf-claimed".to_owned(),
                    ..spec("conf-signed")
                }),
                Some(&owner),
            ))
            .await
            .unwrap_or_else(|s| panic!("{}: SubmitJob with a token: {s:?}", target.name))
            .into_inner()
            .job_id;
        let info = client
            .get_job(with_token(pb::GetJobRequest { job_id: id }, Some(&owner)))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(info.user, "nobody", "{}: {info:?}", target.name);

        let other = bearer(AUTH_KEY, "conf-other");
        let cancel = pb::CancelJobRequest {
            job_id: id,
            user: "root".to_owned(),
            ..Default::default()
        };
        let refused = client
            .cancel_job(with_token(cancel.clone(), Some(&other)))
            .await
            .unwrap_err();
        assert_eq!(
            refused.code(),
            Code::PermissionDenied,
            "{}: {refused:?}",
            target.name
        );
        assert!(
            refused
                .message()
                .contains("user conf-other cannot cancel job owned by nobody"),
            "{}: {refused:?}",
            target.name
        );
        client
            .cancel_job(with_token(cancel, Some(&owner)))
            .await
            .unwrap_or_else(|s| panic!("{}: {s:?}", target.name));
    });
}

/// Without a key (spurctld's default) a call without a token is answered, and one with a
/// token is refused, whatever it calls: the operator must not send one.
#[test]
fn without_a_key_a_call_presenting_a_token_is_unauthenticated() {
    conformance(133, Replicas::One, Setup::default(), |target| async move {
        let mut client = target.client().await;
        let token = bearer(AUTH_KEY, "root");
        let keyless = "no auth.jwt_key is configured";
        let ping = client.ping(with_token((), Some(&token))).await;
        assert_unauthenticated(&target, "Ping", ping, keyless);
        let submitted = client
            .submit_job(with_token(submit(spec("conf-token")), Some(&token)))
            .await;
        assert_unauthenticated(&target, "SubmitJob", submitted, keyless);
        let heartbeat = client
            .heartbeat(with_token(heartbeat("conf-nobody"), Some(&token)))
            .await;
        assert_unauthenticated(&target, "Heartbeat", heartbeat, keyless);
        client
            .ping(())
            .await
            .unwrap_or_else(|s| panic!("{}: Ping without a token: {s:?}", target.name));
    });
}

/// A token with the `admin` claim, as `spur token user --admin` signs one.
fn admin_bearer(key: &str, subject: &str) -> String {
    let token = spur_operator::sign_agent_token(
        key.as_bytes(),
        &serde_json::json!({"sub": subject, "uid": 0, "iat": 1_700_000_000u64,
            "exp": 4_000_000_000u64, "admin": true}),
    );
    format!("Bearer {token}")
}

/// With a key, the admin calls [12] (CreateToken, RevokeToken, UpdateNode) refuse a token
/// that names no admin, `PERMISSION_DENIED "<op> requires cluster admin"`, and serve one
/// with the `admin` claim or the subject `root`; a call with no token, which permissive
/// admits, is trusted. The operator's UpdateNode (a drain) therefore needs an admin token,
/// or none.
#[test]
fn with_a_key_the_admin_calls_refuse_a_token_that_names_no_admin() {
    let setup = Setup {
        jwt_key: Some(AUTH_KEY.to_owned()),
        ..Setup::default()
    };
    conformance(137, Replicas::One, setup, |target| async move {
        let mut client = target.client().await;
        client
            .register_agent(unreachable_node("conf-admin-node"))
            .await
            .unwrap();
        let user = bearer(AUTH_KEY, "nobody");
        let refused = |what: &str, answer: Result<(), tonic::Status>, op: &str| {
            let status = answer.expect_err(what);
            assert_eq!(
                status.code(),
                Code::PermissionDenied,
                "{}: {what}: {status:?}",
                target.name
            );
            assert_eq!(
                status.message(),
                format!("{op} requires cluster admin"),
                "{}: {what}",
                target.name
            );
        };
        let create = || pb::CreateTokenRequest { ttl_secs: None };
        let drain = || pb::UpdateNodeRequest {
            name: "conf-admin-node".to_owned(),
            state: Some(pb::NodeState::NodeDrain as i32),
            ..Default::default()
        };
        let created = client.create_token(with_token(create(), Some(&user))).await;
        refused("CreateToken", created.map(drop), "create token");
        let drained = client.update_node(with_token(drain(), Some(&user))).await;
        refused("UpdateNode", drained.map(drop), "update node");
        let revoke = pb::RevokeTokenRequest {
            token_id: "000000".to_owned(),
        };
        let revoked = client.revoke_token(with_token(revoke, Some(&user))).await;
        refused("RevokeToken", revoked.map(drop), "revoke token");

        let admin = admin_bearer(AUTH_KEY, "nobody");
        let root = bearer(AUTH_KEY, "root");
        for token in [Some(admin.as_str()), Some(root.as_str()), None] {
            let made = client.create_token(with_token(create(), token)).await;
            let made =
                made.unwrap_or_else(|s| panic!("{}: CreateToken {token:?}: {s:?}", target.name));
            let revoke = pb::RevokeTokenRequest {
                token_id: made.into_inner().token_id,
            };
            client
                .revoke_token(with_token(revoke, token))
                .await
                .unwrap_or_else(|s| panic!("{}: RevokeToken {token:?}: {s:?}", target.name));
            client
                .update_node(with_token(drain(), token))
                .await
                .unwrap_or_else(|s| panic!("{}: UpdateNode {token:?}: {s:?}", target.name));
        }
    });
}
