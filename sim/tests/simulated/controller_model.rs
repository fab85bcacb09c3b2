//! The controller model beyond the wire conformance: optional refusals, state loss, the
//! scheduler, replacement pods, stale reads.

use crate::common;

use std::time::Duration;

use common::{channel, now, submit, wait_for_leader};
use spur_fakes::model::RefusalKind;
use spur_proto as pb;
use spur_sim::smoke::{FakeAgent, until_ok};
use spur_sim::world::{KillMode, World};
use tonic::Code;

fn registration(node: &str, agent: &str) -> pb::RegisterAgentRequest {
    pb::RegisterAgentRequest {
        hostname: node.to_owned(),
        address: agent.to_owned(),
        port: u32::from(spur_proto::AGENT_PORT),
        resources: Some(pb::ResourceSet {
            cpus: 4,
            memory_mb: 8192,
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[test]
fn a_registration_refused_for_a_while_is_accepted_afterwards() {
    for (seed, kind) in [
        (20, RefusalKind::PermissionDenied),
        (21, RefusalKind::NotAccepted),
    ] {
        let mut world = World::new(seed);
        world.start_controllers();
        world
            .cluster()
            .refuse_registrations(Duration::from_secs(30), kind);
        let cluster = world.cluster().clone();
        let dialer = world.plain_dialer("operator");
        world.client("operator", async move {
            let leader = wait_for_leader(&cluster).await;
            let mut client = channel(dialer, &leader, |e| e).await?;
            match (
                kind,
                client.register_agent(registration("n1", "operator")).await,
            ) {
                (RefusalKind::PermissionDenied, Err(status)) => {
                    assert_eq!(status.code(), Code::PermissionDenied)
                }
                (RefusalKind::NotAccepted, Ok(response)) => {
                    assert!(!response.get_ref().accepted);
                    assert!(!response.get_ref().message.is_empty());
                }
                (kind, answer) => panic!("{kind:?}: unexpected {answer:?}"),
            }
            tokio::time::sleep(Duration::from_secs(30).saturating_sub(now())).await;
            let accepted = client
                .register_agent(registration("n1", "operator"))
                .await?;
            assert!(accepted.get_ref().accepted);
            Ok(())
        });
        world.run().unwrap();
    }
}

#[test]
fn after_a_state_loss_a_heartbeat_is_not_found_until_the_node_registers_again() {
    let mut world = World::new(22);
    world.start_controllers();
    world.at(Duration::from_secs(20), |w| {
        let now = w.elapsed();
        w.cluster().forget_nodes(now);
    });
    let cluster = world.cluster().clone();
    let dialer = world.dialer("operator");
    world.client("operator", async move {
        wait_for_leader(&cluster).await;
        let heartbeat = pb::HeartbeatRequest {
            hostname: "n1".to_owned(),
            ..Default::default()
        };
        until_ok(&dialer, |mut c| async move {
            c.register_agent(registration("n1", "operator")).await
        })
        .await;
        let mut client = spur_sim::smoke::connect_controller(dialer.clone()).await?;
        client.heartbeat(heartbeat.clone()).await?;

        tokio::time::sleep(Duration::from_secs(21).saturating_sub(now())).await;
        let status = client.heartbeat(heartbeat.clone()).await.unwrap_err();
        assert_eq!(status.code(), Code::NotFound);
        assert_eq!(
            status.message(),
            "node n1 not found — is the node registered?"
        );

        client
            .register_agent(registration("n1", "operator"))
            .await?;
        client.heartbeat(heartbeat).await?;
        Ok(())
    });
    world.run().unwrap();
}

#[test]
fn the_scheduler_launches_a_job_once_on_each_of_its_nodes_and_completes_it_on_the_reports() {
    let mut world = World::new(23);
    world.start_controllers();
    let agent_a = FakeAgent::new(world.dialer("agent-a"), Duration::from_secs(2));
    let agent_b = FakeAgent::new(world.dialer("agent-b"), Duration::from_secs(4));
    let (serve_a, serve_b) = (agent_a.clone(), agent_b.clone());
    world.host("agent-a", move || serve_a.clone().serve());
    world.host("agent-b", move || serve_b.clone().serve());
    let dialer = world.dialer("operator");
    world.client("operator", async move {
        for (node, agent) in [("n1", "agent-a"), ("n2", "agent-b")] {
            let request = registration(node, agent);
            until_ok(&dialer, |mut c| {
                let request = request.clone();
                async move { c.register_agent(request).await }
            })
            .await;
        }
        let spec = pb::JobSpec {
            name: "two-nodes".to_owned(),
            num_nodes: 2,
            ..Default::default()
        };
        let id = until_ok(&dialer, |mut c| {
            let spec = spec.clone();
            async move {
                let r = c
                    .submit_job(pb::SubmitJobRequest { spec: Some(spec) })
                    .await?;
                Ok(r.into_inner().job_id)
            }
        })
        .await;
        let submitted = now();
        let job = loop {
            let job = until_ok(&dialer, |mut c| async move {
                Ok(c.get_job(pb::GetJobRequest { job_id: id })
                    .await?
                    .into_inner())
            })
            .await;
            if job.state != pb::JobState::JobPending as i32
                && job.state != pb::JobState::JobRunning as i32
                && job.state != pb::JobState::JobCompleting as i32
            {
                break job;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        };
        assert_eq!(job.state, pb::JobState::JobCompleted as i32, "{job:?}");
        // A compressed hostlist, as spurctld shows it.
        assert_eq!(job.nodelist, "n[1-2]");
        // The slower agent reports after 4 s: the job ends only then.
        assert!(now() - submitted >= Duration::from_secs(4));
        Ok(())
    });
    world.run().unwrap();

    for (agent, node) in [(&agent_a, "n1"), (&agent_b, "n2")] {
        let launches = agent.launches();
        assert_eq!(launches.len(), 1, "one LaunchJob per node: {launches:?}");
        assert_eq!(launches[0].target_node, node);
        // Agent sockets, not names: the names are in the spec's nodelist.
        assert_eq!(launches[0].peer_nodes, ["agent-a:6818", "agent-b:6818"]);
        assert_eq!(launches[0].spec.as_ref().unwrap().nodelist, "n1,n2");
        assert_eq!(launches[0].run_attempt, 1);
    }
}

#[test]
fn a_replacement_pod_has_a_new_name_catches_up_and_joins_the_service() {
    let mut world = World::new(24);
    world.start_controllers();
    world.run_until(Duration::from_secs(10)).unwrap();
    let leader = world.leader().expect("a leader within 10 s");
    let slot = (0..3)
        .find(|slot| world.cluster().host_of(*slot) != leader)
        .unwrap();
    let old = world.cluster().host_of(slot);
    world.kill(&old, KillMode::Graceful);
    let replacement = world.replace_replica(slot);
    assert_eq!(replacement, format!("{old}-r1"));

    let dialer = world.plain_dialer("operator");
    let cluster = world.cluster().clone();
    let name = replacement.clone();
    world.client("operator", async move {
        let mut client = channel(dialer.clone(), &leader, |e| e).await?;
        let id = client.submit_job(submit("kept")).await?.into_inner().job_id;
        // The new pod answers Ping itself, under its own name, and has the job in its copy.
        let mut fresh = channel(dialer, &name, |e| e).await?;
        assert_eq!(fresh.ping(()).await?.into_inner().hostname, name);
        let copy = cluster.read(slot, |state| state.jobs.contains_key(&id));
        assert!(copy, "the replacement caught up with the log");
        Ok(())
    });
    world
        .run_until(world.elapsed() + Duration::from_secs(3))
        .unwrap();
    let routed = world.net().ready_endpoints("spurctld", world.elapsed());
    assert!(routed.contains(&replacement), "{routed:?}");
    assert!(!routed.contains(&old), "{routed:?}");
    world.run().unwrap();
}

#[test]
fn a_follower_cut_off_serves_reads_from_its_stale_copy_and_catches_up_when_healed() {
    let mut world = World::new(25);
    world.start_controllers();
    world.run_until(Duration::from_secs(10)).unwrap();
    let leader = world.leader().expect("a leader within 10 s");
    let hosts = world.cluster().hosts();
    let cut = hosts.iter().find(|h| **h != leader).unwrap().clone();
    for other in hosts.iter().filter(|h| **h != cut) {
        world.partition(&cut, other);
    }
    let heal_at = Duration::from_secs(200);
    let others: Vec<String> = hosts.iter().filter(|h| **h != cut).cloned().collect();
    let to_heal = cut.clone();
    world.at(heal_at, move |w| {
        for other in &others {
            w.repair(&to_heal, other);
        }
    });
    let dialer = world.plain_dialer("operator");
    world.client("operator", async move {
        let mut via_leader = channel(dialer.clone(), &leader, |e| e).await?;
        let id = via_leader
            .submit_job(submit("unseen"))
            .await?
            .into_inner()
            .job_id;
        let mut via_cut = channel(dialer, &cut, |e| e).await?;
        // Its forward cannot connect (the kernel gives up after 127 s); the read is then
        // served from its own copy, which never saw the job.
        let stale = via_cut.get_job(pb::GetJobRequest { job_id: id }).await;
        assert_eq!(stale.unwrap_err().code(), Code::NotFound);

        tokio::time::sleep((heal_at + Duration::from_secs(1)).saturating_sub(now())).await;
        let fresh = via_cut.get_job(pb::GetJobRequest { job_id: id }).await?;
        assert_eq!(fresh.into_inner().name, "unseen");
        Ok(())
    });
    world.run().unwrap();
}

#[test]
fn a_lost_reply_leaves_the_write_applied_and_only_the_next_reply_is_lost() {
    use spur_fakes::model::LostReply;

    let mut world = World::new(26);
    world.start_controllers();
    let cluster = world.cluster().clone();
    let dialer = world.plain_dialer("operator");
    world.client("operator", async move {
        let leader = wait_for_leader(&cluster).await;
        let hosts = cluster.hosts();
        let follower = hosts.iter().find(|h| **h != leader).unwrap().clone();

        // Straight to the leader: applied, answered UNKNOWN "transport error".
        let mut via_leader = channel(dialer.clone(), &leader, |e| e).await?;
        cluster.lose_next_reply("SubmitJob", LostReply::TransportError);
        let lost = via_leader.submit_job(submit("lost")).await.unwrap_err();
        assert_eq!(
            (lost.code(), lost.message()),
            (Code::Unknown, "transport error")
        );
        assert_eq!(cluster.job_ids(), [1], "the write was applied");
        // One reply only: the next write is answered.
        let next = via_leader.submit_job(submit("next")).await?.into_inner();
        assert_eq!(next.job_id, 2);

        // Through a follower: the leader applies the forward and loses its reply; the
        // follower relays the same error.
        let mut via_follower = channel(dialer.clone(), &follower, |e| e).await?;
        cluster.lose_next_reply("SubmitJob", LostReply::TransportError);
        let relayed = via_follower
            .submit_job(submit("forwarded"))
            .await
            .unwrap_err();
        assert_eq!(relayed.code(), Code::Unknown);
        assert_eq!(cluster.job_ids(), [1, 2, 3]);

        // Hang: applied, and no answer ever comes; only the caller's bound ends the call.
        cluster.lose_next_reply("SubmitJob", LostReply::Hang);
        let waited = tokio::time::timeout(
            Duration::from_secs(60),
            via_leader.submit_job(submit("hang")),
        )
        .await;
        assert!(waited.is_err(), "a hung reply was answered: {waited:?}");
        assert_eq!(cluster.job_ids(), [1, 2, 3, 4]);
        // Other methods are unaffected by an armed SubmitJob fault.
        cluster.lose_next_reply("SubmitJob", LostReply::TransportError);
        via_leader
            .register_agent(registration("n1", "operator"))
            .await?;
        Ok(())
    });
    world.run().unwrap();
    assert_eq!(world.trace().find("its reply is lost").len(), 3);
}

#[test]
fn a_replacement_of_the_dead_leader_does_not_inherit_its_leadership() {
    let mut world = World::new(27);
    world.start_controllers();
    world.run_until(Duration::from_secs(10)).unwrap();
    let leader = world.leader().expect("a leader within 10 s");
    let term = world.cluster().term();
    let slot = world.cluster().slot_of(&leader).unwrap();
    world.kill(&leader, KillMode::Graceful);
    // The replacement starts before the election can end (at least 3 s).
    world.replace_replica(slot);
    world.run_until(Duration::from_secs(12)).unwrap();
    assert_eq!(world.leader(), None, "no leader without an election");
    world.run_until(Duration::from_secs(30)).unwrap();
    assert!(world.leader().is_some());
    assert_eq!(
        world.cluster().term(),
        term + 1,
        "the new leader won an election"
    );
}
