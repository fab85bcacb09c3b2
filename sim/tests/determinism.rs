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
