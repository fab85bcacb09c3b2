//! A multi-node job's failure policy, and each node's result in the SpurJob's status.
//!
//! spurctld ends a multi-node job only once every allocated node has reported its end
//! (fidelity row 7): the first report moves the job to COMPLETING, and the others are
//! awaited up to spurctld's CompleteWait (300 s by default), when it ends the job by
//! itself. A training job whose peer died does not end by itself meanwhile: its other
//! ranks block in their next collective, holding every GPU. Under `FailJob` the operator
//! reports the other nodes' ends at once, with the failed pod's exit code (spurctld takes
//! a job's exit from its first node's report, so the job ends with the exit that caused
//! it), then deletes their pods. `WaitForOthers` leaves them to run to their own end.
//!
//! The policy travels on the pods (annotation [`ANNOTATION_ON_RANK_FAILURE`], on the pods
//! of multi-node jobs only), so the pod reports decide without reading the SpurJob, and a
//! pod launched before the SpurJob changed keeps the policy it started with.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use super::LABEL_JOB_ID;
use super::crd::{NodeResult, SpurJobSpec};
use super::pods::{ANNOTATION_REPORTED, ANNOTATION_RUN_ATTEMPT};
use super::reports::{PodEnd, pod_end};

/// The policy a multi-node job's pods carry: [`OnRankFailure::as_str`].
pub const ANNOTATION_ON_RANK_FAILURE: &str = "spur.amd.com/on-rank-failure";

/// `spec.startTimeout` in seconds, on each pod of a SpurJob that sets one.
pub const ANNOTATION_START_TIMEOUT: &str = "spur.amd.com/start-timeout-seconds";

/// `spec.failurePolicy.onRankFailure`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnRankFailure {
    /// Stop the other nodes' pods and end the job Failed.
    #[default]
    FailJob,
    /// Let the other nodes' pods run to their own end.
    WaitForOthers,
}

impl OnRankFailure {
    const ALL: [OnRankFailure; 2] = [OnRankFailure::FailJob, OnRankFailure::WaitForOthers];

    pub fn as_str(self) -> &'static str {
        match self {
            OnRankFailure::FailJob => "FailJob",
            OnRankFailure::WaitForOthers => "WaitForOthers",
        }
    }

    pub fn parse(value: &str) -> Result<OnRankFailure, String> {
        Self::ALL
            .into_iter()
            .find(|p| p.as_str() == value)
            .ok_or_else(|| {
                format!(
                    "`{value}` is not one of {}",
                    Self::ALL.map(OnRankFailure::as_str).join(", ")
                )
            })
    }

    /// The SpurJob's policy; `FailJob` when it names none.
    pub fn of(spec: &SpurJobSpec) -> Result<OnRankFailure, String> {
        match spec
            .failure_policy
            .as_ref()
            .and_then(|p| p.on_rank_failure.as_deref())
        {
            None => Ok(OnRankFailure::default()),
            Some(value) => OnRankFailure::parse(value),
        }
    }

    /// The policy `pod` was launched with; `None` for a one-node job's pod and for pods
    /// launched without one (upstream's), which keep spurctld's own behaviour.
    pub fn of_pod(pod: &Pod) -> Option<OnRankFailure> {
        OnRankFailure::parse(pod.annotations().get(ANNOTATION_ON_RANK_FAILURE)?).ok()
    }
}

/// The run attempt `pod` was launched for (0 when unannotated: the first run).
pub fn run_attempt(pod: &Pod) -> u32 {
    pod.annotations()
        .get(ANNOTATION_RUN_ATTEMPT)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Where a pod that has not ended stands against its start timeout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StartCheck {
    /// Running, or no start timeout to keep.
    Nothing,
    /// Not Running yet; look again after this long.
    Wait(Duration),
    /// Not Running when its start timeout ran out: its node failed, for this reason.
    Missed(String),
}

/// `pod` (not ended) against its [`ANNOTATION_START_TIMEOUT`], counted from its creation, at
/// `now`.
pub fn start_check(pod: &Pod, now: Timestamp) -> StartCheck {
    let Some(timeout) = pod
        .annotations()
        .get(ANNOTATION_START_TIMEOUT)
        .and_then(|v| v.parse::<u64>().ok())
    else {
        return StartCheck::Nothing;
    };
    let status = pod.status.as_ref();
    if status.and_then(|s| s.phase.as_deref()) == Some("Running") {
        return StartCheck::Nothing;
    }
    let Some(created) = pod.metadata.creation_timestamp.as_ref() else {
        return StartCheck::Nothing;
    };
    let waited = now.duration_since(created.0).as_secs_f64().max(0.0);
    let waited = Duration::from_secs_f64(waited);
    let timeout = Duration::from_secs(timeout);
    if waited < timeout {
        return StartCheck::Wait(timeout - waited);
    }
    StartCheck::Missed(format!(
        "not Running within its startTimeout of {}: {}",
        humantime::format_duration(timeout),
        why_waiting(pod)
    ))
}

/// Why a pod that is not Running waits, as its status tells: not scheduled (the
/// scheduler's reason), or its container waiting (the kubelet's), else its phase.
fn why_waiting(pod: &Pod) -> String {
    let status = pod.status.clone().unwrap_or_default();
    let unscheduled = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False");
    let waiting = status
        .container_statuses
        .iter()
        .flatten()
        .find_map(|c| c.state.as_ref()?.waiting.clone());
    let (reason, message) = match (unscheduled, waiting) {
        (Some(c), _) => (c.reason.clone(), c.message.clone()),
        (None, Some(w)) => (w.reason, w.message),
        (None, None) => (status.phase, None),
    };
    let reason = reason.unwrap_or_else(|| "Pending".to_owned());
    match message.filter(|m| !m.is_empty()) {
        Some(message) => format!("{reason}: {message}"),
        None => reason,
    }
}

/// The pods `failed`'s failure stops, in name order: the same job's other pods of the same
/// run attempt that have not ended, been reported or begun deleting.
pub fn ranks_to_stop<'a>(failed: &Pod, pods: &'a [Pod]) -> Vec<&'a Pod> {
    let job = failed.labels().get(LABEL_JOB_ID);
    let attempt = run_attempt(failed);
    let mut stop: Vec<&Pod> = pods
        .iter()
        .filter(|p| p.name_any() != failed.name_any())
        .filter(|p| job.is_some() && p.labels().get(LABEL_JOB_ID) == job)
        .filter(|p| run_attempt(p) == attempt)
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| !p.annotations().contains_key(ANNOTATION_REPORTED))
        .filter(|p| pod_end(p).is_none())
        .collect();
    stop.sort_by_key(|p| p.name_any());
    stop
}

/// The result of `pod`, which ended as `end`.
pub fn node_result(pod: &Pod, end: &PodEnd) -> NodeResult {
    NodeResult {
        pod: pod.name_any(),
        run_attempt: run_attempt(pod),
        result: if end.exit_code == 0 {
            "Succeeded"
        } else {
            "Failed"
        }
        .to_owned(),
        exit_code: Some(end.exit_code),
        message: end.message.clone(),
    }
}

/// The result of `pod`, stopped because the pod on `failed_node` failed as `end`.
pub fn stopped_result(pod: &Pod, failed_node: &str, end: &PodEnd) -> NodeResult {
    NodeResult {
        pod: pod.name_any(),
        run_attempt: run_attempt(pod),
        result: "Stopped".to_owned(),
        exit_code: None,
        message: format!(
            "stopped by the failure policy: the pod on {failed_node} failed with exit code {}",
            end.exit_code
        ),
    }
}

/// The nodes whose pods failed in the latest run attempt `results` tell of, in name order
/// (not those the failure policy stopped).
pub fn failed_nodes(results: &BTreeMap<String, NodeResult>) -> Vec<&str> {
    let Some(latest) = results.values().map(|r| r.run_attempt).max() else {
        return Vec::new();
    };
    results
        .iter()
        .filter(|(_, r)| r.run_attempt == latest && r.result == "Failed")
        .map(|(node, _)| node.as_str())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateTerminated, ContainerStatus, PodStatus,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn pod(name: &str, job: &str, attempt: u32, phase: &str) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some(name.into());
        p.metadata.labels = Some([(LABEL_JOB_ID.to_owned(), job.to_owned())].into());
        p.metadata.annotations =
            Some([(ANNOTATION_RUN_ATTEMPT.to_owned(), attempt.to_string())].into());
        let terminated = (phase == "Failed").then(|| ContainerStatus {
            name: super::super::pods::CONTAINER.into(),
            state: Some(ContainerState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: 3,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        });
        p.status = Some(PodStatus {
            phase: Some(phase.into()),
            container_statuses: terminated.map(|t| vec![t]),
            ..Default::default()
        });
        p
    }

    #[test]
    fn the_policy_is_one_of_two_names_and_fail_job_by_default() {
        let mut spec = SpurJobSpec::default();
        assert_eq!(OnRankFailure::of(&spec), Ok(OnRankFailure::FailJob));
        spec.failure_policy = Some(super::super::crd::FailurePolicy {
            on_rank_failure: Some("WaitForOthers".into()),
        });
        assert_eq!(OnRankFailure::of(&spec), Ok(OnRankFailure::WaitForOthers));
        spec.failure_policy = Some(super::super::crd::FailurePolicy {
            on_rank_failure: Some("failjob".into()),
        });
        assert_eq!(
            OnRankFailure::of(&spec),
            Err("`failjob` is not one of FailJob, WaitForOthers".into())
        );
        let mut p = pod("a", "7", 0, "Running");
        assert_eq!(OnRankFailure::of_pod(&p), None);
        p.annotations_mut()
            .insert(ANNOTATION_ON_RANK_FAILURE.into(), "WaitForOthers".into());
        assert_eq!(
            OnRankFailure::of_pod(&p),
            Some(OnRankFailure::WaitForOthers)
        );
    }

    #[test]
    fn a_failure_stops_the_same_runs_pods_that_still_run_and_no_others() {
        let failed = pod("j7-r1", "7", 2, "Failed");
        let mut reported = pod("j7-r3", "7", 2, "Running");
        reported
            .annotations_mut()
            .insert(ANNOTATION_REPORTED.into(), "true".into());
        let mut deleting = pod("j7-r4", "7", 2, "Running");
        deleting.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        let pods = vec![
            pod("j7-r2", "7", 2, "Running"),
            failed.clone(),
            pod("j7-r0", "7", 2, "Pending"),
            reported,
            deleting,
            pod("j7-r5", "7", 2, "Failed"),
            pod("j7-old", "7", 1, "Running"),
            pod("j8-r0", "8", 2, "Running"),
        ];
        let names: Vec<String> = ranks_to_stop(&failed, &pods)
            .into_iter()
            .map(|p| p.name_any())
            .collect();
        assert_eq!(names, ["j7-r0", "j7-r2"]);
        let mut unlabelled = failed.clone();
        unlabelled.metadata.labels = None;
        assert!(ranks_to_stop(&unlabelled, &pods).is_empty());
    }

    #[test]
    fn a_pod_not_running_by_its_start_timeout_fails_with_why_it_waited() {
        use k8s_openapi::api::core::v1::{ContainerStateWaiting, PodCondition};
        let created = Timestamp::from_second(1_000).unwrap();
        let at = |s: i64| Timestamp::from_second(1_000 + s).unwrap();
        let mut p = pod("j7-r1", "7", 0, "Pending");
        p.metadata.creation_timestamp = Some(Time(created));
        assert_eq!(
            start_check(&p, at(500)),
            StartCheck::Nothing,
            "no timeout set"
        );
        p.annotations_mut()
            .insert(ANNOTATION_START_TIMEOUT.into(), "90".into());
        assert_eq!(
            start_check(&p, at(30)),
            StartCheck::Wait(Duration::from_secs(60))
        );
        assert_eq!(
            start_check(&p, at(90)),
            StartCheck::Missed("not Running within its startTimeout of 1m 30s: Pending".into())
        );
        let status = p.status.as_mut().unwrap();
        status.container_statuses = Some(vec![ContainerStatus {
            name: super::super::pods::CONTAINER.into(),
            state: Some(ContainerState {
                waiting: Some(ContainerStateWaiting {
                    reason: Some("ContainerCreating".into()),
                    message: None,
                }),
                ..Default::default()
            }),
            ..Default::default()
        }]);
        assert_eq!(
            start_check(&p, at(91)),
            StartCheck::Missed(
                "not Running within its startTimeout of 1m 30s: ContainerCreating".into()
            )
        );
        // The scheduler's reason comes first: the pod never reached a kubelet.
        p.status.as_mut().unwrap().conditions = Some(vec![PodCondition {
            type_: "PodScheduled".into(),
            status: "False".into(),
            reason: Some("Unschedulable".into()),
            message: Some("0/4 nodes are available: 4 Insufficient amd.com/gpu.".into()),
            ..Default::default()
        }]);
        assert_eq!(
            start_check(&p, at(91)),
            StartCheck::Missed(
                "not Running within its startTimeout of 1m 30s: Unschedulable: 0/4 nodes are available: 4 Insufficient amd.com/gpu.".into()
            )
        );
        // Running in time: nothing more to keep; a clock behind the creation waits it all.
        p.status.as_mut().unwrap().phase = Some("Running".into());
        assert_eq!(start_check(&p, at(500)), StartCheck::Nothing);
        p.status.as_mut().unwrap().phase = Some("Pending".into());
        assert_eq!(
            start_check(&p, at(-10)),
            StartCheck::Wait(Duration::from_secs(90))
        );
    }

    #[test]
    fn results_name_the_failed_nodes_of_the_latest_run_only() {
        let end = PodEnd {
            exit_code: 3,
            message: "Error".into(),
            oom: false,
        };
        let failed = pod("j7-r1", "7", 1, "Failed");
        let mut results = BTreeMap::new();
        assert!(failed_nodes(&results).is_empty());
        results.insert(
            "gpu-0".to_owned(),
            node_result(&pod("old", "7", 0, "Failed"), &end),
        );
        results.insert("gpu-1".to_owned(), node_result(&failed, &end));
        results.insert(
            "gpu-2".to_owned(),
            stopped_result(&pod("j7-r2", "7", 1, "Running"), "gpu-1", &end),
        );
        results.insert(
            "gpu-3".to_owned(),
            node_result(&pod("j7-r3", "7", 1, "Succeeded"), &PodEnd::default()),
        );
        assert_eq!(failed_nodes(&results), ["gpu-1"]);
        assert_eq!(results["gpu-1"].result, "Failed");
        assert_eq!(results["gpu-1"].exit_code, Some(3));
        assert_eq!(results["gpu-2"].result, "Stopped");
        assert_eq!(results["gpu-2"].exit_code, None);
        assert!(
            results["gpu-2"]
                .message
                .contains("the pod on gpu-1 failed with exit code 3")
        );
        assert_eq!(results["gpu-3"].result, "Succeeded");
    }
}
