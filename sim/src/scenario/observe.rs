//! The simulation's side of the checks: what a sample of the simulated world shows, read
//! from its state (the judge reads the same [`Observation`] from the lab's processes).

use std::collections::BTreeSet;
use std::time::Duration;

use spur_fakes::model::state::{Command, Effect, LogEntry, StateMachine};
use spur_judge::checks::acting::ActingCheck;
use spur_judge::checks::readiness::{ReadinessJudge, WorldView};
use spur_judge::checks::{AcceptedJob, ControllerView, Observation, Violation};
use spur_judge::hosts::{CONTROLLER_SERVICE, KUBE_API_HOST, OPERATOR_LEASE};
use spur_operator::{state_name, uid_in_comment};

use crate::harness::Sim;

/// Judges what `sim`'s API server applied and its controller replicas received since
/// the last call.
pub fn judge_acting(acting: &mut ActingCheck, sim: &Sim) -> Vec<Violation> {
    let writes = sim.api.take_writes();
    let cuts = sim.world.cuts();
    let mut violations = acting.judge(&writes, &sim.leases, sim.api.writes_dropped(), cuts);
    let cluster = sim.world.cluster();
    let calls = cluster.take_calls();
    violations.extend(acting.judge_calls(&calls, &sim.leases, cluster.calls_dropped(), cuts));
    violations
}

/// Every job the simulated controller accepted, from its replicated log: replayed into a
/// fresh copy of the state machine, as a replica derives its state, noting each job that
/// started.
pub fn accepted_jobs(log: &[LogEntry]) -> Vec<AcceptedJob> {
    let mut state = StateMachine::default();
    let mut started: BTreeSet<u32> = BTreeSet::new();
    let mut submitted: Vec<(u32, String)> = Vec::new();
    for entry in log {
        if let Command::JobRunning { job_id, .. } = &entry.command {
            let array = state.jobs.get(job_id).and_then(|job| job.array);
            started.insert(array.map_or(*job_id, |(parent, _)| parent));
        }
        state.apply(&entry.command);
        if let (Command::SubmitJob { spec, .. }, Effect::JobId(id)) =
            (&entry.command, &entry.outcome)
        {
            submitted.push((*id, spec.comment.clone()));
        }
    }
    submitted
        .into_iter()
        .map(|(id, comment)| AcceptedJob {
            id,
            comment,
            ran: started.contains(&id),
            live: state.jobs.values().any(|job| {
                let of = job.array.map_or(job.id, |(parent, _)| parent);
                of == id && !job.is_terminal()
            }),
        })
        .collect()
}

/// The simulated world's ground truth at `now`.
pub fn observe_sim(sim: &Sim, now: Duration, operators: &[&str]) -> Observation {
    let cluster = sim.world.cluster();
    let leader = cluster.leader_with_quorum();
    let leader_slot = leader.as_ref().and_then(|l| cluster.slot_of(l));
    let net = sim.world.net();
    // A takeover's wait for the lease to expire is nobody's deadline, but a replica that
    // holds the lease and does nothing misses them all.
    let holder = sim
        .leases
        .holder(OPERATOR_LEASE)
        .filter(|h| operators.contains(&h.as_str()));
    let acting_operator = holder
        .clone()
        .filter(|h| !net.is_down(h) && net.can_reach(h, KUBE_API_HOST));
    let endpoint_reachable = acting_operator.as_ref().is_some_and(|op| {
        net.ready_endpoints(CONTROLLER_SERVICE, now)
            .into_iter()
            .any(|e| net.can_reach(op, &e))
    });
    let controller = leader_slot.map(|slot| {
        cluster.read(slot, |state| ControllerView {
            registered: state
                .nodes
                .iter()
                .filter(|(_, n)| acting_operator.as_ref().is_none_or(|op| n.address == *op))
                .map(|(name, _)| name.clone())
                .collect(),
            down: state
                .nodes
                .iter()
                .filter(|(_, n)| n.state == spur_proto::NodeState::NodeDown)
                .map(|(name, _)| name.clone())
                .collect(),
            jobs: state
                .jobs
                .iter()
                .map(|(id, j)| (*id, (state_name(j.state), j.exit_code)))
                .collect(),
            owners: state
                .jobs
                .iter()
                .filter_map(|(id, j)| Some((*id, uid_in_comment(&j.spec.comment)?.to_owned())))
                .collect(),
        })
    });
    let mut seen = Observation {
        holder,
        acting_operator,
        endpoint_reachable,
        leader,
        controller,
        ..Observation::default()
    };
    sim.index.lock().fill_observation(&mut seen);
    seen
}

/// One readiness sample of the simulated world at `now`.
pub fn sample_readiness(
    judge: &mut ReadinessJudge,
    sim: &Sim,
    now: Duration,
    api_up: bool,
) -> Option<Violation> {
    let seen = view(judge.operator(), sim, now, api_up);
    judge.judge(seen, now)
}

/// What `operator`'s readiness answer depends on, now, in the simulated world.
pub fn view(operator: &str, sim: &Sim, now: Duration, api_up: bool) -> WorldView {
    let net = sim.world.net();
    let endpoints: Vec<String> = net
        .ready_endpoints(CONTROLLER_SERVICE, now)
        .into_iter()
        .filter(|e| !net.is_down(e) && net.can_reach(operator, e))
        .collect();
    let leader = sim.world.cluster().leader_with_quorum();
    WorldView {
        up: !net.is_down(operator),
        api_up: api_up && net.can_reach(operator, KUBE_API_HOST),
        endpoints,
        leader,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepted_jobs_replays_the_log_for_who_ran_and_who_may_still_run() {
        use spur_proto as pb;
        let at = spur_judge::seed::epoch();
        let spec = |uid: &str, array: &str| {
            Box::new(pb::JobSpec {
                name: "j".into(),
                comment: format!("k8s {}{uid}", spur_operator::UID_TAG),
                array_spec: array.into(),
                ..Default::default()
            })
        };
        let mut state = StateMachine::default();
        let mut log = Vec::new();
        for command in [
            Command::SubmitJob {
                spec: spec("a", ""),
                at,
            }, // 1: runs
            Command::SubmitJob {
                spec: spec("a", ""),
                at,
            }, // 2: cancelled before it ran
            Command::SubmitJob {
                spec: spec("b", ""),
                at,
            }, // 3: still pending
            Command::SubmitJob {
                spec: spec("c", "0-1"),
                at,
            }, // 4: tasks 5 and 6
            Command::JobRunning { job_id: 1, at },
            Command::CancelJob {
                job_id: 2,
                user: String::new(),
                at,
            },
            Command::JobRunning { job_id: 6, at },
        ] {
            let outcome = state.apply(&command);
            log.push(LogEntry {
                index: log.len() as u64 + 1,
                term: 1,
                command,
                outcome,
            });
        }
        let got: Vec<(u32, bool, bool)> = accepted_jobs(&log)
            .iter()
            .map(|j| (j.id, j.ran, j.live))
            .collect();
        assert_eq!(
            got,
            [
                (1, true, true),
                (2, false, false),
                (3, false, true),
                // The array ran through its task 6; task 5 is still pending.
                (4, true, true),
            ]
        );
    }
}
