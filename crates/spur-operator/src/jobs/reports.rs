//! Reporting each job pod's end to spurctld with ReportJobStatus.
//!
//! A report is marked on the pod (annotation `spur.amd.com/reported`) only after the
//! controller accepted it, so a restart or a leader change re-sends an unmarked report
//! and never loses one. The window between acceptance and the mark can repeat a report;
//! spurctld must (and the simulated one does) take a repeat for the same node and
//! run attempt as a no-op.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::{Api, ResourceExt};
use serde_json::json;
use spur_proto as pb;
use tonic::Code;

use super::crd::NodeResult;
use super::failure::{
    AfterFailure, OnRankFailure, RunFailure, StartCheck, after_failure, fail_job_note,
    is_current_run, node_result, ranks_to_stop, restart_note, run_attempt, start_check,
    stopped_result,
};
use super::nudge::StatusNudge;
use super::pods::{ANNOTATION_REPORTED, ANNOTATION_TARGET_NODE, CONTAINER};
use super::{JobsTuning, LABEL_JOB_ID, SpurJob};
use crate::clock::WallClock;
use crate::controller::ControllerClient;
use crate::events::EventPublisher;
use crate::metrics::{Metrics, ReconcileLabels};
use crate::retry::Backoffs;

/// How a pod ended, as the controller is told.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodEnd {
    pub exit_code: i32,
    pub message: String,
    /// The kubelet killed the job's container for exceeding its memory limit.
    pub oom: bool,
}

/// The signal an OOMKilled container is reported with: spurd's OOM sentinel over SIGKILL
/// (what the kernel's OOM killer sends), so spurctld ends the job OUT_OF_MEMORY instead of
/// FAILED, as for spurd's own cgroup OOM kills. Upstream's operator sets the same bit.
pub const OOM_KILLED_SIGNAL: i32 = pb::OOM_SIGNAL_FLAG | 9;

/// Container waiting reasons that mean the pod will never start.
const NEVER_STARTS: [&str; 5] = [
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "ErrImageNeverPull",
    "CreateContainerConfigError",
];

/// The pod's end, or `None` while it may still run.
pub fn pod_end(pod: &Pod) -> Option<PodEnd> {
    let status = pod.status.as_ref()?;
    let job_container = status
        .container_statuses
        .as_deref()
        .unwrap_or_default()
        .iter()
        .find(|c| c.name == CONTAINER);
    match status.phase.as_deref() {
        Some("Succeeded") => Some(PodEnd::default()),
        Some("Failed") => {
            let terminated = job_container
                .and_then(|c| c.state.as_ref())
                .and_then(|s| s.terminated.as_ref());
            match terminated {
                Some(t) => Some(PodEnd {
                    exit_code: if t.exit_code == 0 { 1 } else { t.exit_code },
                    message: match t.reason.as_deref() {
                        Some("OOMKilled") => "OOMKilled".to_owned(),
                        Some(reason) => format!("{reason}: {}", t.message.as_deref().unwrap_or(""))
                            .trim_end_matches([':', ' '])
                            .to_owned(),
                        None => String::new(),
                    },
                    oom: t.reason.as_deref() == Some("OOMKilled"),
                }),
                // Rejected by the kubelet before any container ran (admission).
                None => Some(PodEnd {
                    exit_code: 1,
                    message: format!(
                        "rejected by the node: {}: {}",
                        status.reason.as_deref().unwrap_or("Failed"),
                        status.message.as_deref().unwrap_or("")
                    ),
                    oom: false,
                }),
            }
        }
        _ => {
            let reason = never_starts(pod)?;
            let waiting = job_container
                .and_then(|c| c.state.as_ref())
                .and_then(|s| s.waiting.as_ref())?;
            Some(PodEnd {
                exit_code: 1,
                message: format!("{reason}: {}", waiting.message.as_deref().unwrap_or("")),
                oom: false,
            })
        }
    }
}

/// Why the pod's job container will never start (`ImagePullBackOff`, ...), if it will not.
pub fn never_starts(pod: &Pod) -> Option<&str> {
    let status = pod.status.as_ref()?;
    if matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
        return None;
    }
    let reason = status
        .container_statuses
        .as_deref()?
        .iter()
        .find(|c| c.name == CONTAINER)?
        .state
        .as_ref()?
        .waiting
        .as_ref()?
        .reason
        .as_deref()?;
    NEVER_STARTS.contains(&reason).then_some(reason)
}

pub struct ReportContext {
    pub kube: kube::Client,
    pub controller: ControllerClient,
    pub metrics: Metrics,
    /// The report tunables (`--report-refusal-*`).
    pub tuning: JobsTuning,
    /// What start timeouts are judged by.
    pub clock: WallClock,
    /// Where a failed pod is told, as a Warning on its SpurJob.
    pub events: EventPublisher,
    /// Each pod whose report is failing, by name.
    pub backoffs: Backoffs,
    /// Told of each job a report or requeue changed, so its SpurJob is read at once.
    pub nudge: StatusNudge,
}

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("spurctld: {0}")]
    Controller(#[from] crate::controller::ControllerError),
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
}

/// The node a pod's report names: the node spurctld launched it for (the target-node
/// annotation), else the node it was bound to. spurctld ignores a report naming no node
/// (fidelity row 7).
pub fn reporting_node(pod: &Pod) -> String {
    let annotated = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_TARGET_NODE))
        .map(|n| n.trim())
        .filter(|n| !n.is_empty());
    match annotated {
        Some(node) => node.to_owned(),
        None => pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default(),
    }
}

/// What to do after spurctld refused a report with "node X is not allocated to job N",
/// `refusals` times before this one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AfterRefusal {
    /// Send it again after this delay (the job may still be mid-dispatch: PENDING with no
    /// nodes until every node accepted its launch, fidelity row 4).
    Retry(std::time::Duration),
    /// Stop: the node is not (or no longer) in the job's allocation.
    GiveUp,
}

pub fn after_refusal(refusals: u32, tuning: &JobsTuning) -> AfterRefusal {
    if refusals < tuning.report_refusal_retries {
        AfterRefusal::Retry(tuning.report_refusal_delay)
    } else {
        AfterRefusal::GiveUp
    }
}

/// The pod reports as kube-runtime runs them: every pod of a SpurJob (upstream's
/// operator's included, so a swap adopts them) has its end reported by [`reconcile_pod`],
/// each failing one on its own backoff, forgotten once it succeeds.
pub fn run(
    ctx: ReportContext,
    limits: kube::runtime::controller::Config,
    trigger_backoff: crate::retry::Backoff,
) -> impl std::future::Future<Output = ()> + Send {
    use futures::StreamExt as _;
    let managed = super::managed_selector();
    kube::runtime::Controller::new(
        Api::<Pod>::all(ctx.kube.clone()),
        kube::runtime::watcher::Config::default().labels(&managed),
    )
    .with_config(limits)
    .trigger_backoff(trigger_backoff)
    .run(
        |pod: Arc<Pod>, ctx: Arc<ReportContext>| async move {
            let name = pod.name_any();
            let done = reconcile_pod(pod, ctx.clone()).await;
            if done.is_ok() {
                ctx.backoffs.succeeded(&name);
            }
            done
        },
        |pod: Arc<Pod>, error, ctx: Arc<ReportContext>| {
            let kind = match error {
                ReportError::Controller(e) => e.kind(),
                ReportError::Kube(_) => crate::controller::FailureKind::Answer,
            };
            let delay = ctx.backoffs.delay_after(&pod.name_any(), kind);
            tracing::warn!(pod = %pod.name_any(), %error, ?delay, "could not report the pod's end; retrying");
            Action::requeue(delay)
        },
        Arc::new(ctx),
    )
    .for_each(|_| async {})
}

pub async fn reconcile_pod(pod: Arc<Pod>, ctx: Arc<ReportContext>) -> Result<Action, ReportError> {
    let annotations = pod.metadata.annotations.clone().unwrap_or_default();
    if annotations.contains_key(ANNOTATION_REPORTED) || pod.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let (end, start_missed) = match ending(&pod, &ctx.clock) {
        Ok(ending) => ending,
        Err(action) => return Ok(action),
    };
    let Some(job_id) = pod
        .labels()
        .get(LABEL_JOB_ID)
        .and_then(|v| v.parse::<u32>().ok())
    else {
        return Ok(Action::await_change());
    };
    ctx.metrics
        .reconciles
        .get_or_create(&ReconcileLabels { kind: "pod" })
        .inc();
    let namespace = pod.namespace().unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(ctx.kube.clone(), &namespace);
    let node = reporting_node(&pod);
    // The SpurJob shows the result before spurctld hears of it, so the status that
    // mirrors the job's end can name the node that failed.
    record_results(&ctx, &pod, [(node.clone(), node_result(&pod, &end))]).await?;
    let failure = if start_missed {
        Some(RunFailure::StartTimeout)
    } else {
        (end.exit_code != 0).then_some(RunFailure::PodFailed)
    };
    let restart = match failure.map(|f| (f, after_failure(&pod, f))) {
        Some((failure, AfterFailure::Restart { restart, max })) => {
            let run = FailedRun {
                pod: &pod,
                pods: &pods,
                job_id,
                node: &node,
                end: &end,
                failure,
            };
            match restart_run(&ctx, run, restart, max).await? {
                Restart::Done => true,
                Restart::Refused => false,
                Restart::NotYet(delay) => return Ok(Action::requeue(delay)),
            }
        }
        _ => false,
    };
    let stopped = if restart {
        Vec::new()
    } else {
        report_end(&ctx, &pods, &pod, job_id, &node, &end, start_missed).await?
    };
    // Told once the pod is done with (a failed step above retries the whole reconcile, which
    // would tell it twice).
    tell_failure(&ctx, &pod, &node, &end, &stopped).await;
    if start_missed {
        ctx.metrics.launch_failed("StartTimeout");
    }
    if let Some(reason) = never_starts(&pod) {
        ctx.metrics.launch_failed(reason);
    }
    tracing::info!(pod = %pod.name_any(), job_id, node = %node, exit_code = end.exit_code, message = %end.message, restart, "the pod's end is handled");
    Ok(Action::await_change())
}

/// Reports the end of a run that is not restarted, stops the other ranks when the job fails
/// with it, and marks the pod reported (or deletes it); the ranks it stopped.
async fn report_end(
    ctx: &ReportContext,
    pods: &Api<Pod>,
    pod: &Pod,
    job_id: u32,
    node: &str,
    end: &PodEnd,
    start_missed: bool,
) -> Result<Vec<String>, ReportError> {
    let request = end_report(pod, job_id, node, end);
    let reported = report(ctx, pod, request).await?;
    let mut stopped = Vec::new();
    if end.exit_code != 0 && OnRankFailure::of_pod(pod) == Some(OnRankFailure::FailJob) {
        stopped = stop_other_ranks(ctx, pods, pod, node, end).await?;
    }
    if start_missed {
        // Deleted rather than marked: its job is over, and were it to start later it would
        // run with no job behind it. A pod being deleted is not reconciled again.
        delete_pod(pods, pod).await?;
    } else {
        mark_reported(pods, pod, &reported).await?;
    }
    Ok(stopped)
}

/// How `pod` ended, and whether by missing its start timeout; `Err`, with what to do
/// instead, while there is nothing to report yet.
fn ending(pod: &Pod, clock: &WallClock) -> Result<(PodEnd, bool), Action> {
    match pod_end(pod) {
        Some(end) => Ok((end, false)),
        None => match start_check(pod, clock.timestamp()) {
            StartCheck::Nothing => Err(Action::await_change()),
            StartCheck::Wait(left) => Err(Action::requeue(left)),
            StartCheck::Missed(why) => {
                let end = PodEnd {
                    exit_code: 1,
                    message: why,
                    oom: false,
                };
                Ok((end, true))
            }
        },
    }
}

/// The report of `pod`'s `end` on `node`, for the run it was launched for.
fn end_report(pod: &Pod, job_id: u32, node: &str, end: &PodEnd) -> pb::ReportJobStatusRequest {
    pb::ReportJobStatusRequest {
        job_id,
        state: if end.exit_code == 0 {
            pb::JobState::JobCompleted
        } else {
            pb::JobState::JobFailed
        } as i32,
        exit_code: end.exit_code,
        signal: if end.oom { OOM_KILLED_SIGNAL } else { 0 },
        message: end.message.clone(),
        reporting_node: node.to_owned(),
        run_attempt: run_attempt(pod),
        ..Default::default()
    }
}

/// Tells the SpurJob of a failed pod that it failed, and which pods of its run were
/// `stopped` for it.
async fn tell_failure(
    ctx: &ReportContext,
    pod: &Pod,
    node: &str,
    end: &PodEnd,
    stopped: &[String],
) {
    if end.exit_code != 0
        && let Some(owner) = owner_of(pod)
    {
        // No pod name in the note: the same node failing on each run of the job is one
        // event series ("x3").
        let note = format!(
            "the pod on {node} failed: exit code {}{}",
            end.exit_code,
            if end.message.is_empty() {
                String::new()
            } else {
                format!(": {}", end.message)
            }
        );
        ctx.events
            .warning_about(owner.clone(), "PodFailed", &note)
            .await;
        if !stopped.is_empty() {
            let note = format!(
                "stopped the pods on {} (failurePolicy FailJob): the pod on {node} failed",
                stopped.join(",")
            );
            ctx.events.warning_about(owner, "RanksStopped", &note).await;
        }
    }
}

/// A run that failed, as one of its pods tells.
struct FailedRun<'a> {
    /// The pod that failed, or missed its start timeout.
    pod: &'a Pod,
    /// The pods of its namespace.
    pods: &'a Api<Pod>,
    job_id: u32,
    /// The node the pod reports for.
    node: &'a str,
    end: &'a PodEnd,
    failure: RunFailure,
}

/// The reason a job requeued while running waits with in spurctld: its eligibility is
/// deferred (at least 5 s) so it is not dispatched into its own cancel.
const REQUEUE_HOLD: &str = "BeginTime";

/// How a restart went.
enum Restart {
    /// The job was requeued (now or by an earlier try), and the run's pods are done with.
    Done,
    /// spurctld will not requeue the job: it already ended or is ending (another node
    /// reported first), or the operator may not requeue it. The pod's end is reported as
    /// without a restart.
    Refused,
    /// The job is still being dispatched (PENDING until every node accepted its launch,
    /// fidelity row 4), so it cannot be requeued yet: try again after this long.
    NotYet(std::time::Duration),
}

/// The failure policy's restart ([`AfterFailure::Restart`]): spurctld requeues the job under
/// its id (and tells the agents to stop it), the run's pods on the other nodes are stopped,
/// and the failed pod is kept, marked, for its logs (one past its start timeout is
/// deleted).
async fn restart_run(
    ctx: &ReportContext,
    run: FailedRun<'_>,
    restart: u32,
    max: u32,
) -> Result<Restart, ReportError> {
    let FailedRun {
        pod,
        job_id,
        node,
        failure,
        ..
    } = run;
    let info = match ctx.controller.get_job(job_id).await {
        Ok(info) => info,
        Err(e) if e.code() == Code::NotFound => return Ok(Restart::Refused),
        Err(e) => return Err(e.into()),
    };
    let state = info.state();
    let started = super::status::instant(info.start_time.as_ref());
    let live = matches!(state, pb::JobState::JobRunning | pb::JobState::JobSuspended);
    // A pod of a run already requeued (the job waits out spurctld's hold, or runs again)
    // asks for nothing more: a requeue now would stop the next run.
    let already = (state == pb::JobState::JobPending && info.state_reason == REQUEUE_HOLD)
        || (live && !is_current_run(pod, started));
    if state == pb::JobState::JobPending && !already {
        return Ok(Restart::NotYet(ctx.tuning.report_refusal_delay));
    }
    if !already {
        if !live || !requeue(ctx, pod, job_id, &info.user).await? {
            return Ok(Restart::Refused);
        }
        ctx.metrics.job_restarted(failure.reason());
        if let Some(owner) = owner_of(pod) {
            let why = match failure {
                RunFailure::PodFailed => format!("the pod on {node} failed"),
                RunFailure::StartTimeout => format!("the pod on {node} missed its startTimeout"),
            };
            let note = format!(
                "restart {restart} of at most {max} (failurePolicy.maxRestarts): {why}; spurctld runs job {job_id} again under the same id"
            );
            ctx.events.warning_about(owner, "Restarted", &note).await;
        }
        tracing::info!(pod = %pod.name_any(), job_id, node, restart, max, reason = failure.reason(), "asked spurctld to run the job again");
    }
    end_run(ctx, run).await?;
    Ok(Restart::Done)
}

/// Asks spurctld to run `job_id` again: whether it will (another node's pod of the run may
/// have asked first); `false` when it refuses for good, which the pod's report then says.
async fn requeue(
    ctx: &ReportContext,
    pod: &Pod,
    job_id: u32,
    user: &str,
) -> Result<bool, ReportError> {
    let request = pb::RequeueJobRequest {
        job_id,
        user: user.to_owned(),
        hold: false,
    };
    match ctx.controller.requeue_job(request).await {
        Ok(_) => {
            ctx.nudge.changed(job_id);
            Ok(true)
        }
        // Another node's pod of the run asked first.
        Err(e)
            if e.code() == Code::FailedPrecondition
                && (e.message().contains("already pending")
                    || e.message().contains("already being requeued")) =>
        {
            Ok(true)
        }
        Err(e)
            if matches!(
                e.code(),
                Code::FailedPrecondition | Code::PermissionDenied | Code::NotFound
            ) =>
        {
            tracing::warn!(pod = %pod.name_any(), job_id, error = %e, "spurctld would not requeue the job; reporting the pod's end instead");
            Ok(false)
        }
        Err(e) => Err(e.into()),
    }
}

/// Ends a requeued run's pods: the others still running are stopped, and the failed one
/// is kept, marked, for its logs (one past its start timeout is deleted).
async fn end_run(ctx: &ReportContext, run: FailedRun<'_>) -> Result<(), ReportError> {
    let FailedRun {
        pod,
        pods,
        job_id,
        node,
        end,
        failure,
    } = run;
    // spurctld tells the agents to stop the run too, but a lost CancelJob is never sent
    // again: the run's pods still running are stopped here.
    let siblings = job_pods(pods, &job_id.to_string()).await?;
    let stop = ranks_to_stop(pod, &siblings);
    record_results(
        ctx,
        pod,
        stop.iter().map(|p| {
            (
                reporting_node(p),
                stopped_result(p, &restart_note(node, end)),
            )
        }),
    )
    .await?;
    for sibling in stop {
        delete_pod(pods, sibling).await?;
        ctx.metrics.ranks_stopped.inc();
    }
    if failure == RunFailure::StartTimeout {
        delete_pod(pods, pod).await?;
    } else {
        mark_reported(pods, pod, &format!("restarted: run {}", run_attempt(pod))).await?;
    }
    Ok(())
}

/// Sends `request` for `pod`; the value for the pod's reported mark once spurctld took it
/// or has no use for it. Refusals are retried here, inside this one reconciliation: a
/// mark on the pod would itself wake the pod's reconciliation at once and spend the bound
/// in a burst.
async fn report(
    ctx: &ReportContext,
    pod: &Pod,
    request: pb::ReportJobStatusRequest,
) -> Result<String, ReportError> {
    let (job_id, node) = (request.job_id, request.reporting_node.clone());
    let mut refusals = 0u32;
    loop {
        match ctx.controller.report_job_status(request.clone()).await {
            Ok(()) => {
                ctx.nudge.changed(job_id);
                return Ok("true".to_owned());
            }
            // The job is gone or already over (cancelled): nothing left to tell.
            Err(e) if matches!(e.code(), Code::NotFound | Code::FailedPrecondition) => {
                tracing::info!(pod = %pod.name_any(), job_id, error = %e, "controller no longer needs this report");
                return Ok("true".to_owned());
            }
            Err(e) if e.says_node_not_allocated(&node, job_id) => {
                match after_refusal(refusals, &ctx.tuning) {
                    AfterRefusal::Retry(delay) => {
                        refusals += 1;
                        tracing::info!(pod = %pod.name_any(), job_id, node = %node, refusals, ?delay, "spurctld does not count the node in the job yet (mid-dispatch?); reporting again");
                        tokio::time::sleep(delay).await;
                    }
                    AfterRefusal::GiveUp => {
                        tracing::warn!(pod = %pod.name_any(), job_id, node = %node, refusals, error = %e, "spurctld never counted the node in the job; giving up on this report");
                        return Ok(format!("refused: {}", e.message()));
                    }
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// The pods of job `job_id` (every run) in `pods`' namespace.
async fn job_pods(pods: &Api<Pod>, job_id: &str) -> Result<Vec<Pod>, kube::Error> {
    let selector = format!("{LABEL_JOB_ID}={job_id}");
    Ok(pods
        .list(&ListParams::default().labels(&selector))
        .await?
        .items)
}

async fn delete_pod(pods: &Api<Pod>, pod: &Pod) -> Result<(), kube::Error> {
    match pods.delete(&pod.name_any(), &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

async fn mark_reported(pods: &Api<Pod>, pod: &Pod, reported: &str) -> Result<(), kube::Error> {
    let mark = json!({ "metadata": { "annotations": { ANNOTATION_REPORTED: reported } } });
    pods.patch(
        &pod.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&mark),
    )
    .await?;
    Ok(())
}

/// The SpurJob that owns `pod`, as an Event's `regarding`.
fn owner_of(pod: &Pod) -> Option<ObjectReference> {
    let owner = pod
        .owner_references()
        .iter()
        .find(|o| o.kind == "SpurJob")?;
    Some(ObjectReference {
        api_version: Some(owner.api_version.clone()),
        kind: Some(owner.kind.clone()),
        name: Some(owner.name.clone()),
        namespace: pod.namespace(),
        uid: Some(owner.uid.clone()),
        ..Default::default()
    })
}

/// Merges `results` into `status.nodeResults` of the SpurJob that owns `pod`; nothing for
/// a pod no SpurJob owns, or whose SpurJob is gone.
async fn record_results(
    ctx: &ReportContext,
    pod: &Pod,
    results: impl IntoIterator<Item = (String, NodeResult)>,
) -> Result<(), kube::Error> {
    let Some(owner) = pod.owner_references().iter().find(|o| o.kind == "SpurJob") else {
        return Ok(());
    };
    let results: BTreeMap<String, NodeResult> = results
        .into_iter()
        .filter(|(node, _)| !node.is_empty())
        .collect();
    if results.is_empty() {
        return Ok(());
    }
    let spurjobs: Api<SpurJob> =
        Api::namespaced(ctx.kube.clone(), &pod.namespace().unwrap_or_default());
    let patch = node_results_patch(&results);
    match spurjobs
        .patch_status(&owner.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

/// The merge patch that writes each of `results` whole: a field a result leaves out
/// (a stopped pod's exit code, an empty message) is removed, not kept from an earlier run.
fn node_results_patch(results: &BTreeMap<String, NodeResult>) -> serde_json::Value {
    let entries: serde_json::Map<String, serde_json::Value> = results
        .iter()
        .map(|(node, result)| {
            let mut entry = json!({ "exitCode": null, "message": null });
            if let (Some(fields), Ok(serde_json::Value::Object(set))) =
                (entry.as_object_mut(), serde_json::to_value(result))
            {
                fields.extend(set);
            }
            (node.clone(), entry)
        })
        .collect();
    json!({ "status": { "nodeResults": entries } })
}

/// The failure policy `FailJob` (see [`super::failure`]): the same run's pods on the other
/// nodes are reported ended with `end`'s exit code, so spurctld ends the job now, with the
/// exit that caused it, then deleted. Returns the nodes whose pods it stopped.
async fn stop_other_ranks(
    ctx: &ReportContext,
    pods: &Api<Pod>,
    failed: &Pod,
    failed_node: &str,
    end: &PodEnd,
) -> Result<Vec<String>, ReportError> {
    let job_id = failed
        .labels()
        .get(LABEL_JOB_ID)
        .cloned()
        .unwrap_or_default();
    let siblings = job_pods(pods, &job_id).await?;
    let stop = ranks_to_stop(failed, &siblings);
    if stop.is_empty() {
        return Ok(Vec::new());
    }
    record_results(
        ctx,
        failed,
        stop.iter().map(|p| {
            (
                reporting_node(p),
                stopped_result(p, &fail_job_note(failed_node, end)),
            )
        }),
    )
    .await?;
    let stopped_nodes: Vec<String> = stop.iter().map(|p| reporting_node(p)).collect();
    for pod in stop {
        let node = reporting_node(pod);
        let request = pb::ReportJobStatusRequest {
            job_id: job_id.parse().unwrap_or_default(),
            state: pb::JobState::JobFailed as i32,
            exit_code: end.exit_code,
            message: format!("stopped: the pod on {failed_node} failed"),
            reporting_node: node.clone(),
            run_attempt: run_attempt(pod),
            ..Default::default()
        };
        report(ctx, pod, request).await?;
        // Deleted, not marked: a mark first would leave the pod running were the delete to
        // fail, since a retry stops only pods not yet reported.
        delete_pod(pods, pod).await?;
        ctx.metrics.ranks_stopped.inc();
        tracing::info!(pod = %pod.name_any(), job_id, node = %node, failed_node, "stopped by the failure policy: another node's pod of the job failed");
    }
    Ok(stopped_nodes)
}

#[cfg(test)]
mod tests {
    use super::*;

    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateTerminated, ContainerStateWaiting, ContainerStatus, PodStatus,
    };

    #[test]
    fn a_nodes_result_replaces_the_earlier_runs_whole() {
        let stopped = NodeResult {
            pod: "spur-job-1-0".into(),
            run_attempt: 1,
            result: "Stopped".into(),
            exit_code: None,
            message: "stopped for a restart of the job".into(),
        };
        let succeeded = NodeResult {
            pod: "spur-job-1-0-r2".into(),
            run_attempt: 2,
            result: "Succeeded".into(),
            exit_code: Some(0),
            message: String::new(),
        };
        let mut job = json!({ "status": { "nodeResults": {} } });
        for (first, then) in [(&stopped, &succeeded), (&succeeded, &stopped)] {
            for result in [first, then] {
                let results = BTreeMap::from([("node-0".to_owned(), result.clone())]);
                json_patch::merge(&mut job, &node_results_patch(&results));
            }
            let written: NodeResult =
                serde_json::from_value(job["status"]["nodeResults"]["node-0"].clone()).unwrap();
            assert_eq!(&written, then);
        }
    }

    fn pod(phase: &str, state: Option<ContainerState>) -> Pod {
        Pod {
            status: Some(PodStatus {
                phase: Some(phase.into()),
                container_statuses: state.map(|s| {
                    vec![ContainerStatus {
                        name: CONTAINER.into(),
                        state: Some(s),
                        ..Default::default()
                    }]
                }),
                reason: Some("OutOfgpu".into()),
                message: Some("insufficient amd.com/gpu".into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn terminated(code: i32, reason: &str) -> Option<ContainerState> {
        Some(ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: code,
                reason: Some(reason.into()),
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    #[test]
    fn the_report_names_the_launch_target_else_the_bound_node() {
        let mut p = Pod::default();
        assert_eq!(reporting_node(&p), "");
        p.spec = Some(k8s_openapi::api::core::v1::PodSpec {
            node_name: Some("bound".into()),
            ..Default::default()
        });
        assert_eq!(reporting_node(&p), "bound");
        p.metadata.annotations = Some(
            [(ANNOTATION_TARGET_NODE.to_owned(), " target ".to_owned())]
                .into_iter()
                .collect(),
        );
        assert_eq!(reporting_node(&p), "target");
        p.metadata.annotations = Some(
            [(ANNOTATION_TARGET_NODE.to_owned(), " ".to_owned())]
                .into_iter()
                .collect(),
        );
        assert_eq!(reporting_node(&p), "bound");
    }

    #[test]
    fn a_report_refused_during_dispatch_is_retried_a_bounded_number_of_times() {
        let tuning = JobsTuning {
            report_refusal_retries: 3,
            report_refusal_delay: std::time::Duration::from_secs(2),
            ..JobsTuning::default()
        };
        let table = [
            (0, AfterRefusal::Retry(std::time::Duration::from_secs(2))),
            (2, AfterRefusal::Retry(std::time::Duration::from_secs(2))),
            (3, AfterRefusal::GiveUp),
            (u32::MAX, AfterRefusal::GiveUp),
        ];
        for (refusals, expected) in table {
            assert_eq!(after_refusal(refusals, &tuning), expected, "{refusals}");
        }
        let never = JobsTuning {
            report_refusal_retries: 0,
            ..tuning
        };
        assert_eq!(after_refusal(0, &never), AfterRefusal::GiveUp);
    }

    #[test]
    fn each_way_a_pod_ends() {
        assert_eq!(pod_end(&pod("Running", None)), None);
        assert_eq!(
            pod_end(&pod("Succeeded", terminated(0, "Completed"))),
            Some(PodEnd::default())
        );
        assert_eq!(
            pod_end(&pod("Failed", terminated(137, "OOMKilled"))),
            Some(PodEnd {
                exit_code: 137,
                message: "OOMKilled".into(),
                oom: true,
            })
        );
        assert!(
            !pod_end(&pod("Failed", terminated(137, "Error")))
                .unwrap()
                .oom
        );
        assert_eq!(
            pod_end(&pod("Failed", terminated(3, "Error")))
                .unwrap()
                .exit_code,
            3
        );
        let rejected = pod_end(&pod("Failed", None)).unwrap();
        assert_eq!(rejected.exit_code, 1);
        assert!(
            rejected.message.contains("OutOfgpu"),
            "{}",
            rejected.message
        );
        let pull = pod_end(&pod(
            "Pending",
            Some(ContainerState {
                waiting: Some(ContainerStateWaiting {
                    reason: Some("ImagePullBackOff".into()),
                    message: Some("no such image".into()),
                }),
                ..Default::default()
            }),
        ))
        .unwrap();
        assert_eq!(pull.message, "ImagePullBackOff: no such image");
        let creating = pod(
            "Pending",
            Some(ContainerState {
                waiting: Some(ContainerStateWaiting {
                    reason: Some("ContainerCreating".into()),
                    message: None,
                }),
                ..Default::default()
            }),
        );
        assert_eq!(pod_end(&creating), None);
        // Counted as a launch failure by its reason; a pod on its way is not one.
        let pulling = pod(
            "Pending",
            Some(ContainerState {
                waiting: Some(ContainerStateWaiting {
                    reason: Some("ImagePullBackOff".into()),
                    message: None,
                }),
                ..Default::default()
            }),
        );
        assert_eq!(never_starts(&pulling), Some("ImagePullBackOff"));
        assert_eq!(never_starts(&creating), None);
        assert_eq!(never_starts(&pod("Failed", terminated(1, "Error"))), None);
    }
}
