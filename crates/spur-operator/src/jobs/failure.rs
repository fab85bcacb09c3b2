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
use super::crd::{FailurePolicy, NodeResult, SpurJobSpec};
use super::pods::{ANNOTATION_REPORTED, ANNOTATION_RUN_ATTEMPT};
use super::reports::{PodEnd, pod_end};

/// The policy a multi-node job's pods carry: [`OnRankFailure::as_str`].
pub const ANNOTATION_ON_RANK_FAILURE: &str = "spur.amd.com/on-rank-failure";

/// `spec.startTimeout` in seconds, on each pod of a SpurJob that sets one.
pub const ANNOTATION_START_TIMEOUT: &str = "spur.amd.com/start-timeout-seconds";

/// A policy of `spec.failurePolicy` named by one of a few words.
pub trait PolicyName: Copy + Default + 'static {
    /// Every policy, in the order an error lists them.
    const ALL: &'static [Self];

    fn as_str(self) -> &'static str;

    /// Its field of `spec.failurePolicy`, as written.
    fn field(policy: &FailurePolicy) -> Option<&str>;

    fn parse(value: &str) -> Result<Self, String> {
        Self::ALL
            .iter()
            .copied()
            .find(|p| p.as_str() == value)
            .ok_or_else(|| {
                let names: Vec<&str> = Self::ALL.iter().map(|p| p.as_str()).collect();
                format!("`{value}` is not one of {}", names.join(", "))
            })
    }

    /// The SpurJob's policy; the default when it names none.
    fn of(spec: &SpurJobSpec) -> Result<Self, String> {
        match spec.failure_policy.as_ref().and_then(Self::field) {
            None => Ok(Self::default()),
            Some(value) => Self::parse(value),
        }
    }
}

/// `spec.failurePolicy.onRankFailure`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnRankFailure {
    /// Stop the other nodes' pods and end the job Failed.
    #[default]
    FailJob,
    /// Let the other nodes' pods run to their own end.
    WaitForOthers,
}

impl PolicyName for OnRankFailure {
    const ALL: &'static [Self] = &[OnRankFailure::FailJob, OnRankFailure::WaitForOthers];

    fn as_str(self) -> &'static str {
        match self {
            OnRankFailure::FailJob => "FailJob",
            OnRankFailure::WaitForOthers => "WaitForOthers",
        }
    }

    fn field(policy: &FailurePolicy) -> Option<&str> {
        policy.on_rank_failure.as_deref()
    }
}

impl OnRankFailure {
    /// The policy `pod` was launched with; `None` for a one-node job's pod and for pods
    /// launched without one (upstream's), which keep spurctld's own behaviour.
    pub fn of_pod(pod: &Pod) -> Option<OnRankFailure> {
        OnRankFailure::parse(pod.annotations().get(ANNOTATION_ON_RANK_FAILURE)?).ok()
    }
}

/// `spec.failurePolicy.maxRestarts`, on each pod of a SpurJob that allows restarts.
pub const ANNOTATION_MAX_RESTARTS: &str = "spur.amd.com/max-restarts";

/// `spec.failurePolicy.onStartTimeout`, on each pod of a SpurJob whose policy is `Requeue`.
pub const ANNOTATION_ON_START_TIMEOUT: &str = "spur.amd.com/on-start-timeout";

/// `spec.failurePolicy.onStartTimeout`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnStartTimeout {
    /// The node whose pod is late fails, and with it the job.
    #[default]
    FailJob,
    /// spurctld runs the job again, while `maxRestarts` allows.
    Requeue,
}

impl PolicyName for OnStartTimeout {
    const ALL: &'static [Self] = &[OnStartTimeout::FailJob, OnStartTimeout::Requeue];

    fn as_str(self) -> &'static str {
        match self {
            OnStartTimeout::FailJob => "FailJob",
            OnStartTimeout::Requeue => "Requeue",
        }
    }

    fn field(policy: &FailurePolicy) -> Option<&str> {
        policy.on_start_timeout.as_deref()
    }
}

/// `spec.failurePolicy.maxRestarts` (0 when unset).
pub fn max_restarts(spec: &SpurJobSpec) -> u32 {
    spec.failure_policy
        .as_ref()
        .and_then(|p| p.max_restarts)
        .unwrap_or(0)
}

/// Checks `spec.failurePolicy` as a whole; an error names the field (under
/// `failurePolicy.`) and what is wrong with it.
pub fn check_policy(spec: &SpurJobSpec) -> Result<(), (&'static str, String)> {
    OnRankFailure::of(spec).map_err(|e| ("onRankFailure", e))?;
    if OnStartTimeout::of(spec).map_err(|e| ("onStartTimeout", e))? == OnStartTimeout::Requeue {
        if spec.start_timeout.is_none() {
            return Err((
                "onStartTimeout",
                "`Requeue` acts when a pod misses `startTimeout`, which is not set".to_owned(),
            ));
        }
        if max_restarts(spec) == 0 {
            return Err((
                "onStartTimeout",
                "`Requeue` runs the job again, which needs `maxRestarts` of at least 1".to_owned(),
            ));
        }
    }
    Ok(())
}

/// How a run failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunFailure {
    /// A node's pod ended with a failure (or can never start).
    PodFailed,
    /// A node's pod was not Running by its start timeout.
    StartTimeout,
}

impl RunFailure {
    /// The `reason` label of `spur_operator_job_restarts_total`.
    pub fn reason(self) -> &'static str {
        match self {
            RunFailure::PodFailed => "PodFailed",
            RunFailure::StartTimeout => "StartTimeout",
        }
    }
}

/// What a failed run comes to under the policy its pod carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AfterFailure {
    /// The pod's end is reported: the job fails (or, under `WaitForOthers`, waits for its
    /// other nodes).
    Report,
    /// spurctld is asked to run the job again: this is restart `restart` of at most `max`.
    Restart { restart: u32, max: u32 },
}

/// What the failure of `pod`'s run comes to. Restarts are counted by spurctld's run attempt:
/// run N has had N - 1 restarts, whoever asked for them.
pub fn after_failure(pod: &Pod, failure: RunFailure) -> AfterFailure {
    let annotations = pod.annotations();
    let max = annotations
        .get(ANNOTATION_MAX_RESTARTS)
        .and_then(|v| v.parse::<u32>().ok())
        .unwrap_or(0);
    let restarts = match failure {
        RunFailure::PodFailed => OnRankFailure::of_pod(pod) != Some(OnRankFailure::WaitForOthers),
        RunFailure::StartTimeout => {
            annotations
                .get(ANNOTATION_ON_START_TIMEOUT)
                .map(String::as_str)
                == Some(OnStartTimeout::Requeue.as_str())
        }
    };
    let done = run_attempt(pod).max(1) - 1;
    if restarts && done < max {
        AfterFailure::Restart {
            restart: done + 1,
            max,
        }
    } else {
        AfterFailure::Report
    }
}

/// How much later than a pod's creation its job's start may be, for the pod to be of the
/// job's current run. spurctld starts a run before it sends the run's launches, so a pod of
/// the current run was created after the start; a later run starts no sooner than
/// spurctld's requeue hold (5 s) after the earlier run's pod failed. Halfway between
/// tolerates 2.5 s of skew between spurctld's clock and the API server's.
pub const LATER_RUN_AFTER: Duration = Duration::from_millis(2500);

/// Whether spurctld's job, whose current run started at `job_start` (`None`: it is not
/// running), is still on the run `pod` was created for. A pod of a run already restarted
/// must not restart the job again.
pub fn is_current_run(pod: &Pod, job_start: Option<Timestamp>) -> bool {
    let Some(start) = job_start else {
        return false;
    };
    let Some(created) = pod.metadata.creation_timestamp.as_ref() else {
        return true;
    };
    start.duration_since(created.0).as_secs_f64() <= LATER_RUN_AFTER.as_secs_f64()
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

/// The result of `pod`, stopped by the failure policy, for the reason `message` says
/// ([`fail_job_note`], [`restart_note`]).
pub fn stopped_result(pod: &Pod, message: &str) -> NodeResult {
    NodeResult {
        pod: pod.name_any(),
        run_attempt: run_attempt(pod),
        result: "Stopped".to_owned(),
        exit_code: None,
        message: message.to_owned(),
    }
}

/// Why `FailJob` stopped a pod: the pod on `failed_node` failed as `end`.
pub fn fail_job_note(failed_node: &str, end: &PodEnd) -> String {
    format!(
        "stopped by the failure policy: the pod on {failed_node} failed with exit code {}",
        end.exit_code
    )
}

/// Why a restart stopped a pod: the pod on `failed_node` failed as `end`.
pub fn restart_note(failed_node: &str, end: &PodEnd) -> String {
    let why = if end.message.is_empty() {
        format!("exit code {}", end.exit_code)
    } else {
        end.message.clone()
    };
    format!("stopped for a restart of the job: the pod on {failed_node} failed ({why})")
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

    fn with(mut p: Pod, annotations: &[(&str, &str)]) -> Pod {
        for (k, v) in annotations {
            p.annotations_mut().insert((*k).into(), (*v).into());
        }
        p
    }

    #[test]
    fn a_failed_run_restarts_while_run_attempts_leave_restarts_and_the_policy_asks() {
        use AfterFailure::{Report, Restart};
        use RunFailure::{PodFailed, StartTimeout};
        let two = [(ANNOTATION_MAX_RESTARTS, "2")];
        let requeue = [
            (ANNOTATION_MAX_RESTARTS, "2"),
            (ANNOTATION_ON_START_TIMEOUT, "Requeue"),
        ];
        let wait = [
            (ANNOTATION_MAX_RESTARTS, "2"),
            (ANNOTATION_ON_RANK_FAILURE, "WaitForOthers"),
        ];
        type Annotations<'a> = &'a [(&'a str, &'a str)];
        let cases: [(Annotations, u32, RunFailure, AfterFailure); 10] = [
            // No maxRestarts: every failure is reported.
            (&[], 1, PodFailed, Report),
            (&[], 1, StartTimeout, Report),
            // Run N has had N - 1 restarts (an unannotated pod is of the first run).
            (&two, 0, PodFailed, Restart { restart: 1, max: 2 }),
            (&two, 1, PodFailed, Restart { restart: 1, max: 2 }),
            (&two, 2, PodFailed, Restart { restart: 2, max: 2 }),
            (&two, 3, PodFailed, Report),
            // A start timeout restarts only under onStartTimeout: Requeue.
            (&two, 1, StartTimeout, Report),
            (&requeue, 2, StartTimeout, Restart { restart: 2, max: 2 }),
            (&requeue, 3, StartTimeout, Report),
            // WaitForOthers leaves a failed rank to spurctld.
            (&wait, 1, PodFailed, Report),
        ];
        for (annotations, attempt, failure, expected) in cases {
            let p = with(pod("j7-r0", "7", attempt, "Failed"), annotations);
            assert_eq!(
                after_failure(&p, failure),
                expected,
                "{annotations:?} run {attempt} {failure:?}"
            );
        }
    }

    #[test]
    fn a_pod_is_of_the_current_run_unless_the_job_started_well_after_its_creation() {
        let mut p = pod("j7-r0", "7", 1, "Failed");
        let created = Timestamp::from_second(1_000_000).unwrap();
        p.metadata.creation_timestamp = Some(Time(created));
        let at = |ms: i64| Some(created + k8s_openapi::jiff::SignedDuration::from_millis(ms));
        // The run started before its pods were made, or a little after by the clocks' skew.
        assert!(is_current_run(&p, at(-30_000)));
        assert!(is_current_run(&p, at(2_000)));
        // A later run starts at least 5 s after this pod failed.
        assert!(!is_current_run(&p, at(5_000)));
        assert!(!is_current_run(&p, at(60_000)));
        // Not running at all: no run of this pod to restart.
        assert!(!is_current_run(&p, None));
    }

    #[test]
    fn requeue_on_a_start_timeout_needs_a_start_timeout_and_restarts_to_spend() {
        let policy = |on_start: Option<&str>, max: Option<u32>| super::super::crd::FailurePolicy {
            on_start_timeout: on_start.map(str::to_owned),
            max_restarts: max,
            ..Default::default()
        };
        let spec = |timeout: Option<&str>, policy| SpurJobSpec {
            start_timeout: timeout.map(str::to_owned),
            failure_policy: Some(policy),
            ..Default::default()
        };
        assert_eq!(
            check_policy(&spec(Some("5m"), policy(Some("Requeue"), Some(1)))),
            Ok(())
        );
        assert_eq!(check_policy(&spec(None, policy(None, Some(3)))), Ok(()));
        assert_eq!(
            check_policy(&spec(Some("5m"), policy(Some("FailJob"), None))),
            Ok(())
        );
        let field = |r: Result<(), (&'static str, String)>| r.unwrap_err().0;
        assert_eq!(
            field(check_policy(&spec(
                Some("5m"),
                policy(Some("Requeue"), None)
            ))),
            "onStartTimeout"
        );
        assert_eq!(
            field(check_policy(&spec(
                Some("5m"),
                policy(Some("Requeue"), Some(0))
            ))),
            "onStartTimeout"
        );
        assert_eq!(
            field(check_policy(&spec(None, policy(Some("Requeue"), Some(2))))),
            "onStartTimeout"
        );
        assert_eq!(
            check_policy(&spec(Some("5m"), policy(Some("retry"), Some(2)))),
            Err((
                "onStartTimeout",
                "`retry` is not one of FailJob, Requeue".to_owned()
            ))
        );
    }

    #[test]
    fn the_policy_is_one_of_two_names_and_fail_job_by_default() {
        let mut spec = SpurJobSpec::default();
        assert_eq!(OnRankFailure::of(&spec), Ok(OnRankFailure::FailJob));
        spec.failure_policy = Some(super::super::crd::FailurePolicy {
            on_rank_failure: Some("WaitForOthers".into()),
            ..Default::default()
        });
        assert_eq!(OnRankFailure::of(&spec), Ok(OnRankFailure::WaitForOthers));
        spec.failure_policy = Some(super::super::crd::FailurePolicy {
            on_rank_failure: Some("failjob".into()),
            ..Default::default()
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
            stopped_result(
                &pod("j7-r2", "7", 1, "Running"),
                &fail_job_note("gpu-1", &end),
            ),
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
