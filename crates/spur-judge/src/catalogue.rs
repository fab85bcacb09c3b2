//! The lab's named scenarios: the seed's faults, one each, as plans the lab runs on real
//! processes and the simulation runs as their twin (`spur-sim lab --compare-sim`).
//!
//! Each is short (about a minute of real time) so CI can run all of them: a small
//! workload around one fault struck once the cluster has settled.

use std::time::Duration;

use crate::hosts::{OPERATOR, OPERATOR_B};
use crate::plan::{Fault, LeaderChange, Plan, PlannedFault, PlannedJob, SteerTo};

/// When the fault strikes (the operator starts at 0 and the replicas with it, except in
/// `late-controller`): after a fresh cluster's two first elections and the first jobs.
const FAULT_AT: Duration = Duration::from_secs(25);
/// Labelled nodes.
const NODES: usize = 4;

/// Every named scenario, in the order the lab runs them.
pub const NAMES: [&str; 13] = [
    "late-controller",
    "leader-kill-silent",
    "leader-kill-graceful",
    "leader-freeze",
    "follower-kill",
    "partition-operator-replica",
    "leader-cut-off",
    "partition-operator-service",
    "api-outage",
    "operator-restart",
    "operator-leader-crash",
    "operator-leader-sigterm",
    "operator-leader-isolated",
];

/// Named scenarios the lab runs only when asked by name (`--scenario`): each takes minutes
/// of real time, too long for CI's lab.
pub const EXTENDED: [&str; 5] = [
    LEADER_CUT_IDLE,
    LEADER_CUT_LONG,
    LEADER_CUT_FOLLOWER,
    FOLLOWER_CUT_OFF,
    LEADER_CUT_STALE_READ,
];

/// The long cut of `sim/tests/simulated/cut_replica.rs` on real processes: what earns rotation in the
/// lab.
pub const LEADER_CUT_IDLE: &str = "leader-cut-idle";
/// How long `leader-cut-idle` keeps the leader cut off: spurctld's new leader waits its
/// grace after the election, then marks a node DOWN once no heartbeat came for its
/// timeout (90 s), at a health check (every 30 s): 105 s after the cut in the simulation.
const IDLE_CUT: Duration = Duration::from_secs(200);
/// The same cut, three times longer: what can earn avoidance (rule 5's passing over of the
/// replica a rotation left), since the longer the cut the likelier that rotations without
/// it land back on the cut leader for three heartbeat rounds in a row (90 s) and lose the
/// nodes.
pub const LEADER_CUT_LONG: &str = "leader-cut-long";
const LONG_CUT: Duration = Duration::from_secs(600);
/// `leader-cut-off` with the operator's only channel on a follower, whose forwards then
/// hang in the cut, and three SpurJobs created before the new leader: the lab's version of
/// the case that earns abandonment (rule 4) in the simulation.
pub const LEADER_CUT_FOLLOWER: &str = "leader-cut-follower";
/// A follower cut off from its peers for 40 s, then made the operator's only channel: it
/// forgets its leader and refuses every write at once, and SpurJobs are created meanwhile.
/// The lab's version of the case that earns dropping a channel whose call failed (rule 1)
/// in the simulation: a channel kept on it is left only when another rule moves it.
pub const FOLLOWER_CUT_OFF: &str = "follower-cut-off";
/// The leader cut off from its peers for 60 s; a SpurJob created after the election ends
/// at the new leader, and then the operator's channel is made to go to the cut leader,
/// whose copy never heard of that job, while nothing more is written: the lab's version
/// of the pinned seeds that earn reading your writes (rule 6) in the simulation. Kept
/// there, the status read sees no end until a rotation leaves the replica.
pub const LEADER_CUT_STALE_READ: &str = "leader-cut-stale-read";
const STALE_READ_CUT: Duration = Duration::from_secs(60);

/// What a named scenario is about, for `--list` and the tables.
pub fn describe(name: &str) -> &'static str {
    match name {
        "late-controller" => {
            "the operator starts 14 s before the replicas; the Service drops SYNs meanwhile"
        }
        "leader-kill-silent" => "the leader's address is black-holed, then its process killed",
        "leader-kill-graceful" => "the leader's process is killed (connections reset)",
        "leader-freeze" => "the leader is frozen (SIGSTOP) for 20 s and stays in the Service",
        "follower-kill" => "a follower is black-holed and killed, replaced 10 s later",
        "partition-operator-replica" => "the operator is cut off from replica 0 for 20 s",
        "leader-cut-off" => "the leader is cut off from the other replicas for 20 s",
        "partition-operator-service" => "the operator is cut off from every replica for 15 s",
        "api-outage" => "the API server answers 503 for 15 s",
        "operator-restart" => "the operator's process is killed and started again",
        "operator-leader-crash" => "two operators; the lease holder crashes for 30 s",
        "operator-leader-sigterm" => "two operators; the lease holder gets SIGTERM, back in 30 s",
        "operator-leader-isolated" => {
            "two operators; the lease holder is cut off from the API server for 30 s"
        }
        LEADER_CUT_IDLE => {
            "the leader, the operator's only channel, is cut off from the other replicas for \
             200 s while no job runs"
        }
        LEADER_CUT_FOLLOWER => {
            "the leader is cut off from the other replicas for 20 s while the operator's only \
             channel is to a follower"
        }
        LEADER_CUT_STALE_READ => {
            "the leader is cut off from the other replicas for 60 s; once a job's end reached \
             the new leader, the operator can reach only the cut leader, until 5 s after its \
             channel went there"
        }
        FOLLOWER_CUT_OFF => {
            "a follower is cut off from the other replicas for 40 s, then made the operator's \
             only channel"
        }
        LEADER_CUT_LONG => {
            "the leader, the operator's only channel, is cut off from the other replicas for \
             600 s while no job runs"
        }
        _ => "",
    }
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn job(name: &str, create_at: Duration, run_secs: u64, exit_code: i32) -> PlannedJob {
    PlannedJob {
        name: name.to_owned(),
        create_at,
        run_secs,
        exit_code,
        delete_at: None,
    }
}

/// The named scenario's plan, or `None` for an unknown name. `quiet` is how long the world
/// stays whole after the fault healed and the workload ended.
pub fn plan(name: &str, quiet: Duration) -> Option<Plan> {
    match name {
        LEADER_CUT_IDLE => return Some(idle_cut_plan(IDLE_CUT, quiet)),
        LEADER_CUT_LONG => return Some(idle_cut_plan(LONG_CUT, quiet)),
        LEADER_CUT_STALE_READ => return Some(stale_read_plan(quiet)),
        _ => {}
    }
    let setup = setup(name)?;
    let mut jobs = workload(setup.controllers_at);
    let mut faults = Vec::new();
    if let Some(fault) = setup.fault {
        if fault.ends_the_leader() {
            jobs.extend(election_jobs(name));
        }
        faults.push(PlannedFault {
            at: FAULT_AT,
            fault,
        });
    }
    if name == FOLLOWER_CUT_OFF {
        // Beside job-004 and job-005: more while the operator is steered onto the
        // follower and after, one every 6 s.
        for (i, at) in [10, 16, 22, 28].into_iter().enumerate() {
            jobs.push(job(&format!("cut-{i}"), FAULT_AT + secs(at), 5, 0));
        }
    }
    jobs.sort_by_key(|j| j.create_at);
    let end = end_of(&faults, &jobs, setup.controllers_at) + quiet;
    Some(Plan {
        // Named plans are not drawn from a seed; the simulation's twin still needs one
        // for its own randomness (latencies, elections).
        seed: 1,
        nodes: NODES,
        controllers_at: setup.controllers_at,
        operators: setup.operators,
        jobs,
        faults,
        end,
    })
}

/// What a named scenario with the common workload sets up besides it.
struct Setup {
    /// When the controller replicas start.
    controllers_at: Duration,
    /// The operator replicas' hosts.
    operators: Vec<&'static str>,
    /// The one fault struck at [`FAULT_AT`], if any.
    fault: Option<Fault>,
}

/// The setup of the named scenarios with the common workload, or `None` for another name.
/// A flat table: one arm a scenario.
fn setup(name: &str) -> Option<Setup> {
    let mut controllers_at = Duration::ZERO;
    let mut operators = vec![OPERATOR];
    let fault = match name {
        "late-controller" => {
            controllers_at = secs(14);
            None
        }
        "leader-kill-silent" => Some(Fault::LeaderKillSilent),
        "leader-kill-graceful" => Some(Fault::LeaderKillGraceful),
        "leader-freeze" => Some(Fault::LeaderFreeze {
            thaw_after: secs(20),
        }),
        "follower-kill" => Some(Fault::FollowerKill),
        "partition-operator-replica" => Some(Fault::PartitionOperatorReplica {
            slot: 0,
            heal_after: secs(20),
        }),
        "leader-cut-off" => Some(Fault::LeaderCutOff {
            heal_after: secs(20),
            steer: None,
        }),
        LEADER_CUT_FOLLOWER => Some(Fault::LeaderCutOff {
            heal_after: secs(20),
            steer: Some(SteerTo::Follower),
        }),
        FOLLOWER_CUT_OFF => Some(Fault::FollowerCutOff {
            heal_after: secs(40),
            operator_on_it: true,
        }),
        "partition-operator-service" => Some(Fault::PartitionOperatorService {
            heal_after: secs(15),
        }),
        "api-outage" => Some(Fault::ApiOutage { duration: secs(15) }),
        "operator-restart" => Some(Fault::OperatorRestart),
        "operator-leader-crash" | "operator-leader-sigterm" | "operator-leader-isolated" => {
            operators.push(OPERATOR_B);
            let how = match name {
                "operator-leader-crash" => LeaderChange::Crash,
                "operator-leader-sigterm" => LeaderChange::Sigterm,
                _ => LeaderChange::Isolate,
            };
            Some(Fault::OperatorLeaderChange {
                how,
                down_for: secs(30),
            })
        }
        _ => return None,
    };
    Some(Setup {
        controllers_at,
        operators,
        fault,
    })
}

/// The common workload: six SpurJobs over the first 40 s after the controller starts
/// (the first before it), one failing and one deleted while it runs.
fn workload(start: Duration) -> Vec<PlannedJob> {
    let mut jobs = vec![
        job("job-000", secs(2), 5, 0),
        job("job-001", start + secs(8), 6, 1),
        job("job-002", start + secs(15), 8, 0),
        job("job-003", start + secs(22), 40, 0),
        job("job-004", start + secs(32), 5, 0),
        job("job-005", start + secs(40), 6, 0),
    ];
    jobs[3].delete_at = Some(start + secs(50));
    jobs
}

/// The SpurJobs created while the replicas elect another leader after the fault: a sample
/// of the submission lag after a leader change.
fn election_jobs(name: &str) -> Vec<PlannedJob> {
    let mut jobs = vec![job("election-0", FAULT_AT + secs(1), 5, 0)];
    if name == LEADER_CUT_FOLLOWER {
        // Two more while the forwards hang, before the replicas can elect (4.5 s).
        jobs.push(job("election-1", FAULT_AT + secs(2), 5, 0));
        jobs.push(job("election-2", FAULT_AT + secs(3), 5, 0));
    }
    jobs
}

/// When the fault has healed (or the controller started, without one) and the workload's
/// last SpurJob has ended or been deleted, whichever is later.
fn end_of(faults: &[PlannedFault], jobs: &[PlannedJob], controllers_at: Duration) -> Duration {
    let healed = faults
        .iter()
        .map(|f| f.at + f.fault.heals_after())
        .max()
        .unwrap_or(controllers_at);
    let workload_done = jobs
        .iter()
        .map(|j| j.delete_at.unwrap_or(j.create_at + secs(j.run_secs)))
        .max()
        .unwrap_or_default();
    healed.max(workload_done)
}

/// `leader-cut-idle` and `leader-cut-long`: two short jobs end before the cut (`cut`
/// long), and nothing is written after it, so the operator only heartbeats, polls and
/// probes: every one of those a cut leader answers from its own state, so nothing fails or
/// waits and only rotation (rule 5 of `spur_operator::controller::policy`) takes the
/// heartbeats to a replica that forwards them to the new leader. Judged by the
/// node-liveness check.
fn idle_cut_plan(cut: Duration, quiet: Duration) -> Plan {
    let fault = Fault::LeaderCutOff {
        heal_after: cut,
        steer: Some(SteerTo::Leader),
    };
    Plan {
        seed: 1,
        nodes: NODES,
        controllers_at: Duration::ZERO,
        operators: vec![OPERATOR],
        jobs: vec![job("job-000", secs(2), 5, 0), job("job-001", secs(8), 6, 1)],
        end: FAULT_AT + fault.heals_after() + quiet,
        faults: vec![PlannedFault {
            at: FAULT_AT,
            fault,
        }],
    }
}

/// `leader-cut-stale-read`: two short jobs end before the cut; `stale-0` is created after
/// the election (the cut leader holds its submission, so patience takes it to a replica
/// that reaches the new leader) and ends there; nothing is written after that end, so
/// once the channel is on the cut leader (heartbeats and reads it answers itself) only
/// rule 6, or a rotation, takes it away.
fn stale_read_plan(quiet: Duration) -> Plan {
    let fault = Fault::LeaderCutOff {
        heal_after: STALE_READ_CUT,
        steer: Some(SteerTo::LeaderOnceAnEndLanded),
    };
    Plan {
        seed: 1,
        nodes: NODES,
        controllers_at: Duration::ZERO,
        operators: vec![OPERATOR],
        jobs: vec![
            job("job-000", secs(2), 5, 0),
            job("job-001", secs(8), 6, 1),
            job("stale-0", FAULT_AT + secs(10), 5, 0),
        ],
        end: FAULT_AT + fault.heals_after() + quiet,
        faults: vec![PlannedFault {
            at: FAULT_AT,
            fault,
        }],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_named_scenario_has_a_plan_and_a_description() {
        for name in NAMES {
            let plan = plan(name, secs(20)).unwrap_or_else(|| panic!("{name}"));
            assert!(!describe(name).is_empty(), "{name}");
            assert!(
                plan.end >= plan.controllers_at + secs(60),
                "{name}: {:?}",
                plan.end
            );
            assert!(plan.jobs.is_sorted_by_key(|j| j.create_at));
            let leader_fault = plan.faults.iter().any(|f| f.fault.ends_the_leader());
            assert_eq!(
                leader_fault,
                plan.jobs.iter().any(|j| j.name == "election-0"),
                "{name}"
            );
        }
        assert!(plan("no-such", secs(20)).is_none());
        for name in EXTENDED {
            let plan = plan(name, secs(20)).unwrap_or_else(|| panic!("{name}"));
            assert!(!describe(name).is_empty(), "{name}");
            assert!(!NAMES.contains(&name), "{name}");
            if [LEADER_CUT_FOLLOWER, FOLLOWER_CUT_OFF, LEADER_CUT_STALE_READ].contains(&name) {
                continue;
            }
            // In the idle cuts nothing is written once the fault strikes.
            let fault_at = plan.faults[0].at;
            assert!(
                plan.jobs
                    .iter()
                    .all(|j| j.create_at + secs(j.run_secs) < fault_at)
            );
        }
    }
}
