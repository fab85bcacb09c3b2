//! Controller replicas under faults: silent and graceful leader kills, elections, a
//! follower that cannot reach the leader.

use crate::common;

use std::time::Duration;

use common::{KillSwitch, channel, now, run_with_kills, submit, wait_for_leader};
use spur_proto::LEADER_HINT_KEY;
use spur_sim::world::{KillMode, World};
use tonic::Code;

fn follower_of(hosts: &[String], leader: &str) -> String {
    hosts.iter().find(|h| *h != leader).unwrap().clone()
}

#[test]
fn before_the_first_election_writes_answer_not_the_raft_leader_without_a_hint() {
    let mut world = World::new(10);
    world.start_controllers();
    let dialer = world.plain_dialer("operator");
    world.client("operator", async move {
        let mut client = channel(dialer, "spurctld-0", |e| e).await?;
        let status = client.submit_job(submit("early")).await.unwrap_err();
        assert_eq!(status.code(), Code::Unavailable);
        assert_eq!(status.message(), "not the Raft leader");
        assert!(status.metadata().get(LEADER_HINT_KEY).is_none());
        Ok(())
    });
    world.run().unwrap();
}

#[test]
fn after_a_silent_leader_kill_a_call_on_an_open_channel_hangs_until_keepalive_fires() {
    let mut world = World::new(11);
    world.start_controllers();
    let cluster = world.cluster().clone();
    let dialer = world.plain_dialer("operator");
    let kills = KillSwitch::default();
    let switch = kills.clone();
    world.client("operator", async move {
        let leader = wait_for_leader(&cluster).await;
        let mut client = channel(dialer, &leader, |e| {
            e.http2_keep_alive_interval(Duration::from_secs(10))
                .keep_alive_timeout(Duration::from_secs(5))
                .keep_alive_while_idle(true)
        })
        .await?;
        client.submit_job(submit("before")).await?;

        switch.kill(&leader, KillMode::Silent).await;
        let started = now();
        let status = client.submit_job(submit("after")).await.unwrap_err();
        let took = now() - started;
        // Nothing answers; only the keepalive (a ping every 10 s, 5 s to answer) notices.
        assert!(
            took >= Duration::from_secs(5) && took <= Duration::from_secs(16),
            "failed after {took:?}"
        );
        assert_eq!(status.code(), Code::Unavailable, "{status:?}");
        Ok(())
    });
    run_with_kills(&mut world, &kills);
}

#[test]
fn after_a_silent_leader_kill_a_write_through_a_follower_hangs_on_its_forward() {
    let mut world = World::new(12);
    world.start_controllers();
    let cluster = world.cluster().clone();
    let hosts = cluster.hosts();
    let dialer = world.plain_dialer("operator");
    let kills = KillSwitch::default();
    let switch = kills.clone();
    world.client("operator", async move {
        let leader = wait_for_leader(&cluster).await;
        let follower = follower_of(&hosts, &leader);
        let mut client = channel(dialer.clone(), &follower, |e| e).await?;
        // The follower makes and caches its forwarding client to this leader.
        let first = client
            .submit_job(submit("before"))
            .await?
            .into_inner()
            .job_id;

        switch.kill(&leader, KillMode::Silent).await;
        let started = now();
        let hung =
            tokio::time::timeout(Duration::from_secs(60), client.submit_job(submit("during")))
                .await;
        assert!(
            hung.is_err(),
            "the forward to the black-holed leader hangs: {hung:?}"
        );
        assert!(now() - started >= Duration::from_secs(60));
        let new_leader = cluster.leader().expect("a new leader by now");
        assert_ne!(new_leader, leader);

        // A new request through the same follower reaches the new leader (directly, or
        // through a new forwarding client), and job ids continue the sequence.
        let mut client = channel(dialer, &follower, |e| e).await?;
        let next = client
            .submit_job(submit("after"))
            .await?
            .into_inner()
            .job_id;
        assert!(next > first, "job id {next} after {first}");
        Ok(())
    });
    run_with_kills(&mut world, &kills);
}

#[test]
fn a_follower_that_cannot_connect_to_the_leader_answers_not_the_raft_leader_with_a_hint() {
    let mut world = World::new(13);
    world.start_controllers();
    let cluster = world.cluster().clone();
    let hosts = cluster.hosts();
    // Let the first election finish, then cut one follower off from the leader only.
    world.run_until(Duration::from_secs(10)).unwrap();
    let leader = world.leader().expect("elected within 10 s");
    let follower = follower_of(&hosts, &leader);
    world.partition(&follower, &leader);
    let dialer = world.plain_dialer("operator");
    world.client("operator", async move {
        let mut client = channel(dialer, &follower, |e| e).await?;
        let started = now();
        let status = client.submit_job(submit("cut-off")).await.unwrap_err();
        // Its first connect to the leader waits out the kernel's SYN retries.
        assert!(now() - started >= Duration::from_secs(127));
        assert_eq!(status.code(), Code::Unavailable);
        assert_eq!(status.message(), "not the Raft leader");
        let hint = status.metadata().get(LEADER_HINT_KEY).expect("leader hint");
        assert_eq!(hint.to_str()?, format!("{leader}:6817"));
        Ok(())
    });
    world.run().unwrap();
}

#[test]
fn during_an_election_writes_answer_unavailable_and_then_job_ids_keep_increasing() {
    let mut world = World::new(14);
    world.start_controllers();
    let cluster = world.cluster().clone();
    let hosts = cluster.hosts();
    let dialer = world.plain_dialer("operator");
    let kills = KillSwitch::default();
    let switch = kills.clone();
    world.client("operator", async move {
        let leader = wait_for_leader(&cluster).await;
        let follower = follower_of(&hosts, &leader);
        let mut client = channel(dialer, &follower, |e| e).await?;
        let mut last = 0;
        for n in 0..3 {
            last = client
                .submit_job(submit(&format!("pre-{n}")))
                .await?
                .into_inner()
                .job_id;
        }

        switch.kill(&leader, KillMode::Graceful).await;
        let killed_at = now();
        let mut errors = Vec::new();
        let next = loop {
            match client.submit_job(submit("post")).await {
                Ok(response) => break response.into_inner().job_id,
                Err(status) => {
                    errors.push((status.code(), status.message().to_owned()));
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        };
        let took = now() - killed_at;
        assert!(!errors.is_empty(), "writes fail while the election runs");
        for (code, message) in &errors {
            assert!(
                (*code == Code::Unknown && message == "transport error")
                    || (*code == Code::Unavailable && message == "tcp connect error")
                    // The follower forgets the dead leader before the election ends.
                    || (*code == Code::Unavailable && message == "not the Raft leader"),
                "unexpected answer during the election: {code:?} {message}"
            );
        }
        assert!(
            took >= Duration::from_secs(3) && took <= Duration::from_secs(9),
            "the election took {took:?}"
        );
        assert!(next > last, "job id {next} continues after {last}");
        Ok(())
    });
    run_with_kills(&mut world, &kills);
}

#[test]
fn a_leader_cut_off_from_the_majority_stalls_writes_while_the_majority_elects_another() {
    let mut world = World::new(15);
    world.start_controllers();
    world.run_until(Duration::from_secs(10)).unwrap();
    let old = world.leader().expect("a leader within 10 s");
    let hosts = world.cluster().hosts();
    for other in hosts.iter().filter(|h| **h != old) {
        world.partition(&old, other);
    }
    let cut_at = world.elapsed();
    let others: Vec<String> = hosts.iter().filter(|h| **h != old).cloned().collect();
    let heal = old.clone();
    world.at(cut_at + Duration::from_secs(30), move |w| {
        for other in &others {
            w.repair(&heal, other);
        }
    });
    let cluster = world.cluster().clone();
    let dialer = world.plain_dialer("operator");
    world.client("operator", async move {
        // The stale leader cannot commit: the write waits until the partition heals and
        // it learns of the new leader's term, then fails as an openraft proposal of an
        // ended term does (fidelity.md row 8); the next write is refused with the hint.
        let mut client = channel(dialer, &old, |e| e).await?;
        let status = client.submit_job(submit("stalled")).await.unwrap_err();
        assert!(
            now() >= cut_at + Duration::from_secs(30),
            "answered at {:?}",
            now()
        );
        let new = cluster.leader().expect("the majority elected a leader");
        assert_ne!(new, old);
        assert_eq!(status.code(), Code::Internal, "{status:?}");
        assert!(
            status.message().starts_with("raft propose failed"),
            "{status:?}"
        );
        // Now a follower of the new leader, it forwards the next write there.
        client
            .submit_job(submit("after"))
            .await
            .expect("forwarded to the new leader");
        Ok(())
    });
    world.run().unwrap();
    let elected = world.trace().find("elected leader, term 2");
    assert_eq!(elected.len(), 1);
    let took = elected[0].at - cut_at;
    assert!(
        took >= Duration::from_secs(3) && took <= Duration::from_secs(8),
        "the majority elected a new leader after {took:?}"
    );
}

#[test]
fn a_forward_in_flight_when_the_leader_dies_answers_transport_error_then_tcp_connect_error() {
    let mut world = World::new(31);
    world.start_controllers();
    let cluster = world.cluster().clone();
    let hosts = cluster.hosts();
    let dialer = world.plain_dialer("operator");
    let kills = KillSwitch::default();
    let switch = kills.clone();
    world.client("operator", async move {
        let leader = wait_for_leader(&cluster).await;
        let follower = follower_of(&hosts, &leader);
        let mut client = channel(dialer, &follower, |e| e).await?;
        client.submit_job(submit("warm-up")).await?;

        // The kill lands while the follower's forward is on its way (the latencies are
        // drawn from the seed, so this timing is the same in every run).
        let mut in_flight = client.clone();
        let call = tokio::spawn(async move { in_flight.submit_job(submit("in-flight")).await });
        tokio::time::sleep(Duration::from_micros(1500)).await;
        switch.kill(&leader, KillMode::Graceful).await;
        let status = call.await?.unwrap_err();
        assert_eq!(status.code(), Code::Unknown, "{status:?}");
        assert_eq!(status.message(), "transport error");

        // Then, until the election ends, every write fails to reconnect to the dead leader.
        let status = client.submit_job(submit("next")).await.unwrap_err();
        assert_eq!(status.code(), Code::Unavailable, "{status:?}");
        assert_eq!(status.message(), "tcp connect error");
        assert!(status.metadata().get(LEADER_HINT_KEY).is_none());
        Ok(())
    });
    run_with_kills(&mut world, &kills);
}
