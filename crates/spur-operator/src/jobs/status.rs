//! Mirroring the controller's job state into SpurJob status.
//!
//! The state of every active job is read with one GetJobs per interval for all the jobs
//! this operator tracks, not one GetJob per job: at 10,000 active SpurJobs that is one
//! call every 2 s instead of 5,000 a second.

use std::time::Duration;

use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::Store;
use kube::{Api, ResourceExt};
use serde_json::json;
use spur_proto as pb;

use super::crd::{Condition, SpurJob, SpurJobStatus};
use crate::clock::WallClock;
use crate::controller::ControllerClient;
use crate::metrics::Metrics;

pub const INVALID_STATE: &str = "Invalid";

/// `JOB_RUNNING` → `RUNNING`.
pub fn state_name(state: pb::JobState) -> &'static str {
    let name = state.as_str_name();
    name.strip_prefix("JOB_").unwrap_or(name)
}

/// Whether a state (as status shows it) is final.
pub fn is_terminal(state: &str) -> bool {
    matches!(
        state,
        "COMPLETED"
            | "FAILED"
            | "CANCELLED"
            | "TIMEOUT"
            | "NODE_FAIL"
            | "DEADLINE"
            | "OUT_OF_MEMORY"
            | "PREEMPTED"
    )
}

/// Sets a condition, keeping its transition time while its status does not change.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    now: &str,
) {
    let status = if status { "True" } else { "False" };
    let updated = Condition {
        type_: type_.to_owned(),
        status: status.to_owned(),
        reason: reason.to_owned(),
        message: message.to_owned(),
        last_transition_time: Some(now.to_owned()),
    };
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(existing) if existing.status == status => {
            existing.reason = updated.reason;
            existing.message = updated.message;
        }
        Some(existing) => *existing = updated,
        None => conditions.push(updated),
    }
}

/// The status `current` should have given the controller's `info`; `None` when nothing
/// changes (so an unchanged job costs no API write).
pub fn mirrored(current: &SpurJobStatus, info: &pb::JobInfo, now: &str) -> Option<SpurJobStatus> {
    let state = state_name(info.state());
    let mut next = current.clone();
    next.state = Some(state.to_owned());
    next.assigned_nodes = info
        .nodelist
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(str::to_owned)
        .collect();
    let reason = info.state_reason.trim();
    next.message = (!reason.is_empty() && reason != "None").then(|| reason.to_owned());
    let running = matches!(state, "RUNNING" | "COMPLETING");
    set_condition(&mut next.conditions, "Running", running, state, reason, now);
    if is_terminal(state) {
        let message = if info.exit_code != 0 {
            format!(
                "exit code {}{}",
                info.exit_code,
                if reason.is_empty() {
                    String::new()
                } else {
                    format!(": {reason}")
                }
            )
        } else {
            reason.to_owned()
        };
        set_condition(&mut next.conditions, "Finished", true, state, &message, now);
    }
    (next != *current).then_some(next)
}

/// Writes `status` with a merge patch on the status subresource (no resourceVersion, so
/// no conflict with spec edits; the next round repairs a lost write).
pub async fn patch_status(
    api: &Api<SpurJob>,
    name: &str,
    status: &SpurJobStatus,
) -> Result<(), kube::Error> {
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": status })),
    )
    .await
    .map(|_| ())
}

/// Every `interval`, reads the state of all tracked active jobs with one GetJobs and
/// mirrors what changed. Runs until dropped.
pub async fn run_poller(
    store: Store<SpurJob>,
    kube: kube::Client,
    controller: ControllerClient,
    interval: Duration,
    clock: WallClock,
    metrics: Metrics,
) {
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        poll_once(&store, &kube, &controller, &clock, &metrics).await;
    }
}

pub async fn poll_once(
    store: &Store<SpurJob>,
    kube: &kube::Client,
    controller: &ControllerClient,
    clock: &WallClock,
    metrics: &Metrics,
) {
    // The store iterates in no fixed order; sort so calls and writes are reproducible.
    let mut active: Vec<(u32, std::sync::Arc<SpurJob>)> = store
        .state()
        .into_iter()
        .filter(|job| job.metadata.deletion_timestamp.is_none())
        .filter_map(|job| {
            let status = job.status.as_ref()?;
            let id = status.spur_job_id?;
            let done = status.state.as_deref().is_some_and(is_terminal);
            (!done).then_some((id, job))
        })
        .collect();
    if active.is_empty() {
        return;
    }
    active.sort_by(|a, b| {
        a.0.cmp(&b.0)
            .then_with(|| a.1.name_any().cmp(&b.1.name_any()))
    });
    let job_ids = active.iter().map(|(id, _)| *id).collect();
    let answer = match controller
        .get_jobs(pb::GetJobsRequest {
            job_ids,
            ..Default::default()
        })
        .await
    {
        Ok(answer) => answer,
        Err(e) => {
            tracing::warn!(error = %e, jobs = active.len(), "could not read job states; trying again next round");
            return;
        }
    };
    let now = clock.timestamp().to_string();
    for info in answer.jobs {
        let Ok(index) = active.binary_search_by(|(id, _)| id.cmp(&info.job_id)) else {
            continue;
        };
        let job = &active[index].1;
        let current = job.status.clone().unwrap_or_default();
        let Some(next) = mirrored(&current, &info, &now) else {
            continue;
        };
        let api: Api<SpurJob> = Api::namespaced(kube.clone(), &job.namespace().unwrap_or_default());
        match patch_status(&api, &job.name_any(), &next).await {
            Ok(()) => {
                tracing::info!(spurjob = %job.name_any(), job_id = info.job_id, state = ?next.state, "mirrored the job's state")
            }
            Err(e) => {
                metrics.reconcile_error("spurjob", "status_patch");
                tracing::warn!(spurjob = %job.name_any(), error = %e, "could not write status; next round tries again");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(state: pb::JobState, nodes: &str, reason: &str, exit: i32) -> pb::JobInfo {
        pb::JobInfo {
            job_id: 4,
            state: state as i32,
            nodelist: nodes.into(),
            state_reason: reason.into(),
            exit_code: exit,
            ..Default::default()
        }
    }

    #[test]
    fn mirrors_state_nodes_and_conditions() {
        let pending = SpurJobStatus {
            state: Some("PENDING".into()),
            spur_job_id: Some(4),
            ..Default::default()
        };
        let running = mirrored(
            &pending,
            &info(pb::JobState::JobRunning, "a, b", "None", 0),
            "t1",
        )
        .unwrap();
        assert_eq!(running.state.as_deref(), Some("RUNNING"));
        assert_eq!(running.assigned_nodes, ["a", "b"]);
        assert_eq!(running.message, None);
        assert_eq!(running.spur_job_id, Some(4));
        let cond = &running.conditions[0];
        assert_eq!(
            (cond.type_.as_str(), cond.status.as_str()),
            ("Running", "True")
        );

        // Nothing new: no write.
        assert_eq!(
            mirrored(
                &running,
                &info(pb::JobState::JobRunning, "a,b", "None", 0),
                "t2"
            ),
            None
        );

        let failed = mirrored(
            &running,
            &info(pb::JobState::JobFailed, "a,b", "OOMKilled", 137),
            "t3",
        )
        .unwrap();
        assert_eq!(failed.state.as_deref(), Some("FAILED"));
        assert_eq!(failed.message.as_deref(), Some("OOMKilled"));
        let finished = failed
            .conditions
            .iter()
            .find(|c| c.type_ == "Finished")
            .unwrap();
        assert_eq!(finished.message, "exit code 137: OOMKilled");
        let running_cond = failed
            .conditions
            .iter()
            .find(|c| c.type_ == "Running")
            .unwrap();
        assert_eq!(running_cond.status, "False");
        assert_eq!(running_cond.last_transition_time.as_deref(), Some("t3"));
    }

    #[test]
    fn terminal_states() {
        for s in [
            "COMPLETED",
            "FAILED",
            "CANCELLED",
            "TIMEOUT",
            "NODE_FAIL",
            "OUT_OF_MEMORY",
        ] {
            assert!(is_terminal(s), "{s}");
        }
        for s in [
            "PENDING",
            "RUNNING",
            "COMPLETING",
            "SUSPENDED",
            "REQUEUED",
            INVALID_STATE,
        ] {
            assert!(!is_terminal(s), "{s}");
        }
        assert_eq!(state_name(pb::JobState::JobNodeFail), "NODE_FAIL");
    }
}
