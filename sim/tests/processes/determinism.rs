//! One seed, one trace: in one process and across processes.

use std::process::Command;

#[test]
fn the_same_seed_gives_the_same_trace_hash_and_another_seed_another() {
    let first = spur_sim::smoke::run(7).expect("smoke run");
    let second = spur_sim::smoke::run(7).expect("smoke run");
    assert_eq!(first.trace_hash, second.trace_hash);
    assert_eq!(first.events, second.events);
    let other = spur_sim::smoke::run(8).expect("smoke run");
    assert_ne!(first.trace_hash, other.trace_hash);

    // The run did what it says: six jobs, ids strictly increasing across the leader kill.
    assert_eq!(first.job_ids.len(), 6);
    assert!(
        first.job_ids.windows(2).all(|w| w[0] < w[1]),
        "{:?}",
        first.job_ids
    );
}

#[test]
fn two_processes_print_the_same_hash_for_a_seed() {
    let run = || {
        let output = Command::new(env!("CARGO_BIN_EXE_spur-sim"))
            .args(["world-smoke", "--seed", "3"])
            .output()
            .expect("spur-sim runs");
        assert!(output.status.success(), "{output:?}");
        String::from_utf8(output.stdout).expect("utf-8")
    };
    let first = run();
    assert!(first.contains("trace_hash="), "{first}");
    assert_eq!(first, run());
}

/// A busier run: a silent leader kill, a replacement pod, a partition, clients with
/// keepalive and timeouts through the Service. Returns the trace hash.
fn faulty_run(seed: u64) -> String {
    use std::time::Duration;

    use spur_proto as pb;
    use spur_sim::smoke::until_ok;
    use spur_sim::world::{KillMode, World};

    let mut world = World::new(seed);
    world.start_controllers();
    world.at(Duration::from_secs(15), |w| {
        let leader = w.leader().expect("a leader by 15 s");
        let slot = w.cluster().slot_of(&leader).unwrap();
        w.kill(&leader, KillMode::Silent);
        w.at(Duration::from_secs(25), move |w| {
            w.replace_replica(slot);
        });
    });
    world.at(Duration::from_secs(30), |w| {
        w.partition("client-b", "spurctld-1")
    });
    for client in ["client-a", "client-b"] {
        let dialer = world.dialer(client);
        world.client(client, async move {
            for n in 0..10 {
                let spec = pb::JobSpec {
                    name: format!("{n}"),
                    ..Default::default()
                };
                until_ok(&dialer, |mut c| {
                    let spec = spec.clone();
                    async move {
                        c.submit_job(pb::SubmitJobRequest { spec: Some(spec) })
                            .await
                    }
                })
                .await;
                tokio::time::sleep(Duration::from_secs(4)).await;
            }
            Ok(())
        });
    }
    world.run().expect("the run ends");
    let ids = world.cluster().job_ids();
    // A submission whose answer was lost may have been applied and retried: at least 20.
    assert!(ids.len() >= 20, "{ids:?}");
    assert!(ids.windows(2).all(|w| w[0] < w[1]));
    world.trace_hash()
}

#[test]
fn a_run_with_silent_kills_partitions_and_replacements_replays_exactly() {
    assert_eq!(faulty_run(41), faulty_run(41));
}
