//! Cases for the fidelity rows about sizes and freshness: a job's nodelist as a compressed
//! hostlist [15], the 4 MiB submission cap [16] and the 8 MiB request limit [21], and how
//! soon a follower's reads show a write the leader answered [19].

use std::time::Duration;

use prost::Message;
use spur_proto as pb;
use tonic::Code;
use tonic::transport::Channel;

use super::agent::{LaunchRule, TestAgent};
use super::target::{Replicas, Setup, Target, conformance};
use super::{register_with, spec, state, submit, until_job};

// ---- JobInfo.nodelist [15]

/// The nodes registered: numbered names with a gap (no 004), a drained one the job must
/// not take, and prefixes whose digits order naturally (rack2 before rack10).
const NUMBERED_NODES: [&str; 7] = [
    "conf-node001",
    "conf-node002",
    "conf-node003",
    "conf-node005",
    "conf-node006",
    "conf-rack10-n1",
    "conf-rack2-n1",
];

/// What spurctld's `hostlist::compress` makes of the six nodes the job runs on.
const COMPRESSED: &str = "conf-node[001-003,005],conf-rack2-n1,conf-rack10-n1";

#[test]
fn a_jobs_nodelist_is_the_compressed_hostlist_of_its_nodes_in_natural_prefix_order() {
    conformance(134, Replicas::Any, Setup::default(), |target| async move {
        register_with(&target, &NUMBERED_NODES, TestAgent::new(LaunchRule::Accept)).await;
        let mut client = target.client().await;
        client
            .update_node(pb::UpdateNodeRequest {
                name: "conf-node006".to_owned(),
                state: Some(pb::NodeState::NodeDrain as i32),
                reason: Some("conformance".to_owned()),
                ..Default::default()
            })
            .await
            .unwrap();
        let six_nodes = pb::JobSpec {
            num_nodes: 6,
            num_tasks: 6,
            tasks_per_node: 1,
            ..spec("conf-hostlist")
        };
        let id = client
            .submit_job(submit(six_nodes))
            .await
            .unwrap()
            .into_inner()
            .job_id;
        let info = until_job(&target, id, Duration::from_secs(20), "running", |j| {
            state(j) == pb::JobState::JobRunning && !j.nodelist.is_empty()
        })
        .await;
        assert_eq!(info.nodelist, COMPRESSED, "{}: GetJob", target.name);
        let listed = client
            .get_jobs(pb::GetJobsRequest {
                name: "conf-hostlist".to_owned(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .jobs;
        let nodelists: Vec<&str> = listed.iter().map(|j| j.nodelist.as_str()).collect();
        assert_eq!(nodelists, [COMPRESSED], "{}: GetJobs", target.name);
    });
}

// ---- Size limits [16, 21]

const MIB: usize = 1024 * 1024;

/// A client that sends up to 16 MiB, so a request over spurctld's 8 MiB reaches its
/// decoder instead of being stopped by the client's own encoder.
async fn unlimited_client(target: &Target) -> pb::SlurmControllerClient<Channel> {
    target.client().await.max_encoding_message_size(16 * MIB)
}

fn with_script(script: String) -> pb::SubmitJobRequest {
    submit(pb::JobSpec {
        script,
        ..spec("conf-size")
    })
}

/// SubmitJob's refusal of `request`: its code and message.
async fn refusal(
    client: &mut pb::SlurmControllerClient<Channel>,
    request: pb::SubmitJobRequest,
) -> (Code, String) {
    let status = client.submit_job(request).await.map(|_| ()).unwrap_err();
    (status.code(), status.message().to_owned())
}

fn too_large(mib: &str) -> (Code, String) {
    let message = format!(
        "job submission too large: {mib} MiB serialized, limit is 4 MiB (reduce script, environment, or argv size)"
    );
    (Code::InvalidArgument, message)
}

/// spurctld measures a spec as JSON: a script of 4 MiB is refused, one 64 KiB shorter is
/// taken, and 2.2 MB of newlines, which JSON escapes to two bytes each, is refused too.
#[test]
fn a_spec_over_4_mib_as_json_is_refused_invalid_argument_and_a_request_over_8_mib_out_of_range() {
    conformance(135, Replicas::Any, Setup::default(), |target| async move {
        let mut client = unlimited_client(&target).await;
        let over = refusal(&mut client, with_script("x".repeat(4 * MIB))).await;
        assert_eq!(over, too_large("4.0"), "{}", target.name);
        let newlines = refusal(&mut client, with_script("\n".repeat(2_200_000))).await;
        assert_eq!(newlines, too_large("4.2"), "{}", target.name);
        client
            .submit_job(with_script("x".repeat(4 * MIB - 64 * 1024)))
            .await
            .unwrap_or_else(|s| panic!("{}: a spec under 4 MiB: {s:?}", target.name));

        let huge = with_script("x".repeat(8 * MIB));
        let decoded = format!(
            "Error, decoded message length too large: found {} bytes, the limit is: {} bytes",
            huge.encoded_len(),
            8 * MIB
        );
        let refused = refusal(&mut client, huge).await;
        assert_eq!(refused, (Code::OutOfRange, decoded), "{}", target.name);
        // The refusal is the call's, not the connection's: the next call is answered.
        client
            .submit_job(submit(spec("conf-size-after")))
            .await
            .unwrap_or_else(|s| panic!("{}: after the refusal: {s:?}", target.name));
    });
}

// ---- Reads through a follower [11, 19]

async fn job_through(target: &Target, slot: usize, id: u32) -> Result<pb::JobInfo, String> {
    let mut client = target.replica(slot).await;
    let read = client.get_job(pb::GetJobRequest { job_id: id });
    match tokio::time::timeout(Duration::from_secs(3), read).await {
        Ok(Ok(info)) => Ok(info.into_inner()),
        Ok(Err(status)) => Err(format!("{status:?}")),
        Err(_) => Err("no answer in 3 s".to_owned()),
    }
}

/// A follower forwards a read to the leader, so it shows a write at once; and it applies
/// the leader's commits within a heartbeat or so, so 2 s after the write its own copy
/// (what it answers from once the leader is gone) holds it as well.
#[test]
fn a_write_is_read_through_a_follower_at_once_and_is_in_the_followers_own_copy_within_2s() {
    conformance(
        136,
        Replicas::Three,
        Setup::default(),
        |target| async move {
            let leader = target.wait_for_leader().await;
            let followers = [(leader + 1) % 3, (leader + 2) % 3];
            let mut client = target.replica(leader).await;
            let id = client
                .submit_job(submit(spec("conf-fresh")))
                .await
                .unwrap_or_else(|s| panic!("{}: {s:?}", target.name))
                .into_inner()
                .job_id;
            let answered = tokio::time::Instant::now();
            for slot in followers {
                let read = job_through(&target, slot, id).await;
                let name = read.as_ref().map(|j| j.name.as_str());
                assert_eq!(name, Ok("conf-fresh"), "{}: replica {slot}", target.name);
            }
            tokio::time::sleep_until(answered + Duration::from_secs(2)).await;
            target.kill(leader).await;
            for slot in followers {
                let read = job_through(&target, slot, id).await;
                let name = read.as_ref().map(|j| j.name.as_str());
                assert_eq!(
                    name,
                    Ok("conf-fresh"),
                    "{}: replica {slot} after the leader died{}",
                    target.name,
                    target.logs()
                );
            }
        },
    );
}
