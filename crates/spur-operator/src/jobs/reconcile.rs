//! The SpurJob reconciler: submit once, record the id, cancel and clean up on deletion.
//!
//! Phases, as named: read the object; validate (pure: `convert::job_spec`); submit (adopt
//! or create, see `submit`); write status. State mirroring after submission is the
//! poller's (`status`), so a reconcile never waits on a running job.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{DeleteParams, ListParams};
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{Event as FinalizerEvent, finalizer};
use kube::{Api, ResourceExt};
use spur_proto as pb;
use tonic::Code;

use super::convert;
use super::crd::{SpurJob, SpurJobStatus};
use super::duplicates;
use super::status::{
    INVALID_REASON, REFUSED_REASON, clear_unsubmitted_end, end_here, own_end, patch_status,
    set_condition, state_name,
};
use super::submit::{Submission, jobs_of, submit_once};
use super::{FINALIZER, JobsTuning, LABEL_JOB_ID};
use crate::clock::WallClock;
use crate::controller::{ControllerClient, ControllerError};
use crate::events::EventPublisher;
use crate::metrics::{Metrics, ReconcileLabels};
use crate::retry::{BackoffPolicy, Backoffs, Entropy};

/// What the reconciler works with.
pub struct JobsContext {
    pub kube: kube::Client,
    pub controller: ControllerClient,
    pub metrics: Metrics,
    pub events: EventPublisher,
    pub clock: WallClock,
    /// How often a SubmitJob still waiting for its answer is read back (see
    /// [`submit_once`]), or `None` to wait for the answer alone.
    pub submit_read_back: Option<std::time::Duration>,
    pub tuning: JobsTuning,
    /// `JobSpec.user` for a SpurJob without a `spur.amd.com/user` annotation.
    pub default_user: String,
    /// Each failing SpurJob's backoff, by uid.
    backoffs: Backoffs,
    /// Since when CancelJob has answered "not found" for each job id.
    not_found_since: Mutex<BTreeMap<u32, tokio::time::Instant>>,
    /// Unanswered submissions not yet recorded on their SpurJob's status.
    unanswered: duplicates::Unanswered,
}

impl JobsContext {
    pub fn new(
        kube: kube::Client,
        controller: ControllerClient,
        metrics: Metrics,
        events: EventPublisher,
        clock: WallClock,
        retry: BackoffPolicy,
        entropy: Entropy,
    ) -> JobsContext {
        JobsContext {
            kube,
            controller,
            metrics,
            events,
            clock,
            submit_read_back: None,
            tuning: JobsTuning::default(),
            default_user: convert::DEFAULT_USER.to_owned(),
            backoffs: Backoffs::new(retry, entropy),
            not_found_since: Mutex::default(),
            unanswered: duplicates::Unanswered::default(),
        }
    }

    /// Submits as `user` when a SpurJob names none.
    pub fn with_default_user(mut self, user: &str) -> JobsContext {
        self.default_user = user.to_owned();
        self
    }

    /// Sets the refusal and report tunables (`--submit-precondition-retry` and the like).
    pub fn with_tuning(mut self, tuning: JobsTuning) -> JobsContext {
        self.tuning = tuning;
        self
    }

    /// Reads a waiting SubmitJob back every `every` (see [`submit_once`]).
    pub fn with_submit_read_back(mut self, every: Option<std::time::Duration>) -> JobsContext {
        self.submit_read_back = every;
        self
    }
}

/// A SubmitJob refusal: spurctld's verdict on the spec or its submitter, which the same
/// request would meet again. Shown on the SpurJob, never retried in a loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The spec itself (a GPU form, a partition, a node count): only an edit helps.
    InvalidArgument,
    /// A condition outside the spec (the user unknown on the controller's host): tried
    /// again on a slow cadence, as an administrator may fix it.
    FailedPrecondition,
    /// The submitter may not do this: only an edit (or a grant, with an edit) helps.
    PermissionDenied,
}

impl Refusal {
    /// The refusal a failed submission amounts to; `None` for anything retried as usual
    /// (transport failures, INTERNAL "raft propose failed", failed reads).
    pub fn of(error: &ControllerError) -> Option<Refusal> {
        let ControllerError::Status { method, code, .. } = error else {
            return None;
        };
        if *method != "SubmitJob" {
            return None;
        }
        match code {
            Code::InvalidArgument => Some(Refusal::InvalidArgument),
            Code::FailedPrecondition => Some(Refusal::FailedPrecondition),
            Code::PermissionDenied => Some(Refusal::PermissionDenied),
            _ => None,
        }
    }

    /// The `Submitted` condition's reason that records it.
    pub fn reason(self) -> &'static str {
        match self {
            Refusal::InvalidArgument => "InvalidArgument",
            Refusal::FailedPrecondition => "FailedPrecondition",
            Refusal::PermissionDenied => "PermissionDenied",
        }
    }

    fn from_reason(reason: &str) -> Option<Refusal> {
        [
            Refusal::InvalidArgument,
            Refusal::FailedPrecondition,
            Refusal::PermissionDenied,
        ]
        .into_iter()
        .find(|r| r.reason() == reason)
    }
}

/// Whether a SpurJob with no job yet is submitted now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gate {
    Submit,
    /// Refused, and only a spec change will change that: wait for the watch.
    Wait,
    /// Refused with FAILED_PRECONDITION: tried again after this long.
    RetryIn(std::time::Duration),
}

/// Decides [`Gate`] from the status: a refusal recorded for this generation (`Failed` for
/// [`REFUSED_REASON`], or `Refused` as earlier versions wrote it) holds until the spec
/// changes, or for FAILED_PRECONDITION until `precondition_retry` has passed since it (the
/// `Submitted` condition's transition time, written at each refusal).
pub fn gate(
    status: &SpurJobStatus,
    generation: Option<i64>,
    now: k8s_openapi::jiff::Timestamp,
    precondition_retry: std::time::Duration,
) -> Gate {
    if own_end(status) != Some(REFUSED_REASON) || status.observed_generation != generation {
        return Gate::Submit;
    }
    let Some(submitted) = status.conditions.iter().find(|c| c.type_ == "Submitted") else {
        return Gate::Submit;
    };
    match Refusal::from_reason(&submitted.reason) {
        Some(Refusal::FailedPrecondition) => {
            let at = submitted
                .last_transition_time
                .as_deref()
                .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok());
            // A time that does not parse: try now; the refusal writes a fresh one.
            let Some(at) = at else { return Gate::Submit };
            let elapsed = std::time::Duration::try_from(now.duration_since(at))
                .unwrap_or(std::time::Duration::ZERO);
            match precondition_retry.checked_sub(elapsed) {
                Some(left) if !left.is_zero() => Gate::RetryIn(left),
                _ => Gate::Submit,
            }
        }
        Some(_) => Gate::Wait,
        None => Gate::Submit,
    }
}

/// What a failed CancelJob says about the job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CancelRefusal {
    /// It has ended: nothing to cancel (a terminal state is final on every replica).
    Ended,
    /// The replica does not know it: evicted, an array's parent id, or a stale replica
    /// that has not seen it yet. Final only once it has said so for `--job-lost-after`.
    Unknown,
    /// Anything else: try again.
    Other,
}

/// Reads a failed CancelJob. spurctld says "not found" and "is already <State>" as
/// INTERNAL (fidelity row 9); NOT_FOUND and FAILED_PRECONDITION are taken the same way.
pub fn cancel_refusal(error: &ControllerError, job_id: u32) -> CancelRefusal {
    match error.code() {
        Code::NotFound => CancelRefusal::Unknown,
        Code::FailedPrecondition => CancelRefusal::Ended,
        Code::Internal if error.says_job_already_ended(job_id) => CancelRefusal::Ended,
        Code::Internal if error.says_job_not_found(job_id) => CancelRefusal::Unknown,
        _ => CancelRefusal::Other,
    }
}

/// Whether a CancelJob refusal leaves nothing to cancel, given since when the job has been
/// unknown and how long that may last.
pub fn cancel_is_final(
    refusal: CancelRefusal,
    unknown_for: std::time::Duration,
    lost_after: std::time::Duration,
) -> bool {
    match refusal {
        CancelRefusal::Ended => true,
        CancelRefusal::Unknown => unknown_for >= lost_after,
        CancelRefusal::Other => false,
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("spurctld: {0}")]
    Controller(#[from] ControllerError),
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("finalizer: {0}")]
    Finalizer(String),
}

impl ReconcileError {
    /// Transport failures of the controller are transient; the rest double.
    pub fn failure_kind(&self) -> crate::controller::FailureKind {
        match self {
            ReconcileError::Controller(e) => e.kind(),
            _ => crate::controller::FailureKind::Answer,
        }
    }

    /// The metric label of the error.
    pub fn metric_label(&self) -> &'static str {
        match self {
            ReconcileError::Controller(e) if e.is_transport() => "controller_unavailable",
            ReconcileError::Controller(_) => "controller_refused",
            ReconcileError::Kube(_) => "kube_api",
            ReconcileError::Finalizer(_) => "finalizer",
        }
    }
}

pub async fn reconcile(job: Arc<SpurJob>, ctx: Arc<JobsContext>) -> Result<Action, ReconcileError> {
    ctx.metrics
        .reconciles
        .get_or_create(&ReconcileLabels { kind: "spurjob" })
        .inc();
    let namespace = job.namespace().unwrap_or_default();
    let api: Api<SpurJob> = Api::namespaced(ctx.kube.clone(), &namespace);
    let uid = job.uid().unwrap_or_default();
    let result = finalizer(&api, FINALIZER, job, |event| async {
        match event {
            FinalizerEvent::Apply(job) => apply(&job, &api, &ctx).await,
            FinalizerEvent::Cleanup(job) => cleanup(&job, &ctx).await,
        }
    })
    .await;
    match result {
        Ok(action) => {
            ctx.backoffs.succeeded(&uid);
            Ok(action)
        }
        Err(kube::runtime::finalizer::Error::ApplyFailed(e))
        | Err(kube::runtime::finalizer::Error::CleanupFailed(e)) => Err(e),
        Err(kube::runtime::finalizer::Error::AddFinalizer(e))
        | Err(kube::runtime::finalizer::Error::RemoveFinalizer(e)) => Err(ReconcileError::Kube(e)),
        Err(e) => Err(ReconcileError::Finalizer(e.to_string())),
    }
}

/// The SpurJob reconciler as kube-runtime runs it: every SpurJob is submitted, recorded,
/// mirrored and cancelled on deletion by [`reconcile`], each failing one on its own backoff
/// ([`error_policy`]). Returns the store of SpurJobs it keeps (the agent, the status poller
/// and the orphan cleanup read it) and the task that runs it.
pub fn run(
    kube: kube::Client,
    ctx: Arc<JobsContext>,
    limits: kube::runtime::controller::Config,
    trigger_backoff: crate::retry::Backoff,
) -> (
    kube::runtime::reflector::Store<SpurJob>,
    impl std::future::Future<Output = ()> + Send,
) {
    let jobs = kube::runtime::Controller::new(
        Api::<SpurJob>::all(kube),
        kube::runtime::watcher::Config::default(),
    )
    .with_config(limits)
    .trigger_backoff(trigger_backoff);
    use futures::StreamExt as _;
    let store = jobs.store();
    let task = jobs
        .run(reconcile, error_policy, ctx)
        .for_each(|_| async {});
    (store, task)
}

/// Per-object backoff: one failing SpurJob never slows the others.
pub fn error_policy(job: Arc<SpurJob>, error: &ReconcileError, ctx: Arc<JobsContext>) -> Action {
    let uid = job.uid().unwrap_or_default();
    let delay = ctx.backoffs.delay_after(&uid, error.failure_kind());
    ctx.metrics.reconcile_error("spurjob", error.metric_label());
    tracing::warn!(spurjob = %job.name_any(), namespace = ?job.namespace(), %error, ?delay, "reconcile failed; retrying this SpurJob");
    Action::requeue(delay)
}

async fn apply(
    job: &SpurJob,
    api: &Api<SpurJob>,
    ctx: &JobsContext,
) -> Result<Action, ReconcileError> {
    let mut status = job.status.clone().unwrap_or_default();
    let uid = job.uid().unwrap_or_default();
    note_dropped_entries(job, api, ctx, &mut status).await?;
    if let Some(recorded) = status.spur_job_id {
        // Submitted: from here on the poller mirrors its state; the reconciler only looks
        // for a late duplicate while the submission is watched.
        return watch_for_duplicates(job, &uid, recorded, ctx).await;
    }
    let generation = job.metadata.generation;
    let now = ctx.clock.timestamp().to_string();
    let spec = match convert::job_spec_as(job, &uid, &ctx.default_user) {
        Ok(spec) => spec,
        Err(invalid) => return invalid_spec(job, api, ctx, &status, &invalid, &now).await,
    };
    let gated = gate(
        &status,
        generation,
        ctx.clock.timestamp(),
        ctx.tuning.precondition_retry,
    );
    match gated {
        Gate::Submit => {}
        Gate::Wait => return Ok(Action::await_change()),
        Gate::RetryIn(left) => return Ok(Action::requeue(left)),
    }
    let submission = match submit_once(&ctx.controller, spec, &uid, ctx.submit_read_back).await {
        Ok(submission) => submission,
        Err(error) => match Refusal::of(&error) {
            Some(refusal) => return refused(job, api, ctx, &status, refusal, &error).await,
            None => {
                if duplicates::may_still_apply(&error) && !ctx.tuning.duplicate_watch.is_zero() {
                    ctx.unanswered.note(&uid, &now);
                }
                return Err(error.into());
            }
        },
    };
    let job_id = submission.job_id();
    if let Some(created) = &job.metadata.creation_timestamp {
        let lag = ctx.clock.timestamp().duration_since(created.0);
        ctx.metrics
            .submission_lag_seconds
            .observe(lag.as_secs_f64().max(0.0));
    }
    let how = match submission {
        Submission::Submitted(_) => "Submitted",
        Submission::Adopted(_) => "Adopted",
    };
    let mut next = submitted_status(status, job_id, generation, how, &now);
    if let Some(at) = ctx.unanswered.latest(&uid) {
        next.unanswered_submission_at = Some(at);
    }
    patch_status(api, &job.name_any(), &next).await?;
    ctx.unanswered.forget(&uid);
    tracing::info!(spurjob = %job.name_any(), job_id, how, "SpurJob submitted");
    ctx.events
        .normal(job, how, &format!("spurctld job {job_id}"))
        .await;
    if next.unanswered_submission_at.is_some() {
        return Ok(Action::requeue(ctx.tuning.duplicate_watch_interval));
    }
    Ok(Action::await_change())
}

/// Records on the SpurJob that its spec is `invalid` (once for a generation and message),
/// then waits for an edit: nothing else can make the spec valid.
async fn invalid_spec(
    job: &SpurJob,
    api: &Api<SpurJob>,
    ctx: &JobsContext,
    status: &SpurJobStatus,
    invalid: &convert::ValidationError,
    now: &str,
) -> Result<Action, ReconcileError> {
    let generation = job.metadata.generation;
    let message = invalid.to_string();
    let already_reported = own_end(status) == Some(INVALID_REASON)
        && status.observed_generation == generation
        && status.message.as_deref() == Some(message.as_str());
    if !already_reported {
        // `Failed`, as upstream's users' tooling knows it; `Invalid` in the reason.
        let mut next = status.clone();
        end_here(&mut next, INVALID_REASON, &message, &message, now);
        next.observed_generation = generation;
        set_condition(
            &mut next.conditions,
            "Submitted",
            false,
            "InvalidSpec",
            &message,
            now,
        );
        patch_status(api, &job.name_any(), &next).await?;
        ctx.events.warning(job, "InvalidSpec", &message).await;
        ctx.metrics.reconcile_error("spurjob", "invalid_spec");
        tracing::warn!(spurjob = %job.name_any(), %message, "SpurJob is invalid; waiting for its spec to change");
    }
    // Not retried until the generation changes: the watch brings the edit.
    Ok(Action::await_change())
}

/// `status` once spurctld took the job as `job_id` (`how`: submitted, or adopted after a
/// lost reply): Pending, with the `Submitted` and `Queued` conditions set.
fn submitted_status(
    status: SpurJobStatus,
    job_id: u32,
    generation: Option<i64>,
    how: &str,
    now: &str,
) -> SpurJobStatus {
    let mut next = SpurJobStatus {
        state: Some(state_name(pb::JobState::JobPending).to_owned()),
        spur_job_id: Some(job_id),
        message: None,
        observed_generation: generation,
        ..status
    };
    clear_unsubmitted_end(&mut next);
    set_condition(
        &mut next.conditions,
        "Submitted",
        true,
        how,
        &format!("spurctld job {job_id}"),
        now,
    );
    // What the poller's first look will say of a job waiting for no named reason, so
    // that look costs no write.
    set_condition(
        &mut next.conditions,
        "Queued",
        true,
        "Pending",
        &super::status::queued_message("Pending"),
        now,
    );
    next
}

/// The condition naming the `volumes` and `secretEnv` entries left out of a job's pods.
pub const ENTRIES_DROPPED: &str = "EntriesDropped";

/// What the `EntriesDropped` condition and its Warning Event say of `dropped`; `None` when
/// nothing was dropped.
pub fn dropped_message(dropped: &[convert::ValidationError]) -> Option<String> {
    if dropped.is_empty() {
        return None;
    }
    let each: Vec<String> = dropped.iter().map(ToString::to_string).collect();
    Some(format!(
        "left out of the job's pods, which run without them: {}",
        each.join("; ")
    ))
}

/// Tells the user of each malformed `volumes` and `secretEnv` entry the pods run without
/// ([`convert::dropped_entries`]): the `EntriesDropped` condition names them (False once the
/// spec has none), and a Warning Event says so when the list changes. Writes only on a
/// change, and not for a job that has ended, which gets no more pods.
async fn note_dropped_entries(
    job: &SpurJob,
    api: &Api<SpurJob>,
    ctx: &JobsContext,
    status: &mut SpurJobStatus,
) -> Result<(), ReconcileError> {
    let ended = status.spur_job_id.is_some()
        && status
            .state
            .as_deref()
            .is_some_and(super::status::is_terminal);
    if ended {
        return Ok(());
    }
    let message = dropped_message(&convert::dropped_entries(&job.spec));
    let current = status
        .conditions
        .iter()
        .find(|c| c.type_ == ENTRIES_DROPPED);
    let unchanged = match (current, &message) {
        (None, None) => true,
        (Some(c), Some(m)) => c.status == "True" && c.message == *m,
        (Some(c), None) => c.status == "False",
        (None, Some(_)) => false,
    };
    if unchanged {
        return Ok(());
    }
    let now = ctx.clock.timestamp().to_string();
    let mut next = status.clone();
    let (dropped, reason, text) = match &message {
        Some(m) => (true, "MalformedEntries", m.as_str()),
        None => (
            false,
            "NoneDropped",
            "every volumes and secretEnv entry is used",
        ),
    };
    set_condition(
        &mut next.conditions,
        ENTRIES_DROPPED,
        dropped,
        reason,
        text,
        &now,
    );
    patch_status(api, &job.name_any(), &next).await?;
    if let Some(m) = &message {
        tracing::warn!(spurjob = %job.name_any(), message = %m, "malformed entries left out; the job runs without them");
        ctx.events.warning(job, ENTRIES_DROPPED, m).await;
    }
    *status = next;
    Ok(())
}

/// While `uid`'s submission is watched ([`duplicates`]): cancels every other live job
/// carrying it and comes back after the watch's interval. An array is left to the launch
/// check (a read by name cannot tell its tasks from a second array's).
async fn watch_for_duplicates(
    job: &SpurJob,
    uid: &str,
    recorded: u32,
    ctx: &JobsContext,
) -> Result<Action, ReconcileError> {
    let tuning = &ctx.tuning;
    let unanswered_at = job
        .status
        .as_ref()
        .and_then(|s| s.unanswered_submission_at.as_deref());
    let step = duplicates::watch_step(
        unanswered_at,
        ctx.clock.timestamp(),
        tuning.duplicate_watch,
        tuning.duplicate_watch_interval,
    );
    let duplicates::WatchStep::Sweep(again) = step else {
        return Ok(Action::await_change());
    };
    if job.spec.array_spec.is_some() {
        return Ok(Action::await_change());
    }
    let name = super::status::job_name(job);
    for job_id in duplicates::cancel_duplicates(&ctx.controller, &name, uid, recorded).await? {
        ctx.metrics.duplicate_cancelled("watch");
        let message = format!(
            "spurctld job {job_id} was a second job of this SpurJob (a submission given up on and applied later); cancelled, job {recorded} runs on"
        );
        tracing::warn!(spurjob = %job.name_any(), job_id, recorded, "late duplicate cancelled");
        ctx.events
            .warning(job, "DuplicateCancelled", &message)
            .await;
    }
    Ok(Action::requeue(again))
}

/// Records spurctld's refusal of the submission on the SpurJob, as upstream 0.9 records it
/// (state `Failed`, message `rejected by spurctld: <its words>`), with `Refused` and the
/// gRPC code in the conditions and a Warning event, to hold until the spec changes (or,
/// for FAILED_PRECONDITION, until the slow retry).
async fn refused(
    job: &SpurJob,
    api: &Api<SpurJob>,
    ctx: &JobsContext,
    status: &SpurJobStatus,
    refusal: Refusal,
    error: &ControllerError,
) -> Result<Action, ReconcileError> {
    let now = ctx.clock.timestamp().to_string();
    let message = format!("rejected by spurctld: {}", error.message());
    let detail = format!(
        "spurctld refused the job: {}: {}",
        crate::metrics::code_name(error.code()),
        error.message()
    );
    let mut next = status.clone();
    end_here(&mut next, REFUSED_REASON, &message, &detail, &now);
    next.observed_generation = job.metadata.generation;
    set_condition(
        &mut next.conditions,
        "Submitted",
        false,
        refusal.reason(),
        &detail,
        &now,
    );
    // The refusal's own time, which the FAILED_PRECONDITION retry counts from.
    if let Some(c) = next.conditions.iter_mut().find(|c| c.type_ == "Submitted") {
        c.last_transition_time = Some(now.clone());
    }
    // An earlier attempt that went unanswered may still land: deletion looks for it.
    let uid = job.uid().unwrap_or_default();
    if let Some(at) = ctx.unanswered.latest(&uid) {
        next.unanswered_submission_at = Some(at);
    }
    patch_status(api, &job.name_any(), &next).await?;
    ctx.unanswered.forget(&uid);
    ctx.events.warning(job, "SubmitRefused", &detail).await;
    ctx.metrics.reconcile_error("spurjob", "submit_refused");
    ctx.backoffs.succeeded(&uid);
    match refusal {
        Refusal::FailedPrecondition => {
            let retry = ctx.tuning.precondition_retry;
            tracing::warn!(spurjob = %job.name_any(), %message, ?retry, "spurctld refused the SpurJob; trying again later or when its spec changes");
            Ok(Action::requeue(retry))
        }
        _ => {
            tracing::warn!(spurjob = %job.name_any(), %message, "spurctld refused the SpurJob; waiting for its spec to change");
            Ok(Action::await_change())
        }
    }
}

/// On deletion: cancel the job, delete its pods and Service. Idempotent; every step
/// treats "already gone" as done. An array SpurJob's tasks are cancelled one by one: the
/// parent id has no job of its own to cancel (fidelity row 16).
async fn cleanup(job: &SpurJob, ctx: &JobsContext) -> Result<Action, ReconcileError> {
    let uid = job.uid().unwrap_or_default();
    let (jobs, duplicates_found) = jobs_to_cancel(job, ctx, &uid).await?;
    for &(job_id, live) in &jobs {
        if !live {
            continue;
        }
        cancel_left_job(job, ctx, job_id, duplicates_found.contains(&job_id)).await?;
    }
    let namespace = job.namespace().unwrap_or_default();
    for &(job_id, _) in &jobs {
        delete_job_objects(&ctx.kube, &namespace, job_id, JobPods::All).await?;
    }
    ctx.unanswered.forget(&uid);
    Ok(Action::await_change())
}

/// The jobs a deleted SpurJob leaves, sorted by id, each with whether it may still need
/// cancelling; and the second jobs of a watched submission among them, counted once
/// cancelled.
async fn jobs_to_cancel(
    job: &SpurJob,
    ctx: &JobsContext,
    uid: &str,
) -> Result<(Vec<(u32, bool)>, Vec<u32>), ReconcileError> {
    let recorded = job.status.as_ref().and_then(|s| s.spur_job_id);
    // Any submission that went unanswered, however long ago: one read by name at
    // deletion finds a second job the watch may have missed.
    let unanswered_at = job
        .status
        .as_ref()
        .and_then(|s| s.unanswered_submission_at.as_ref());
    let terminal = job
        .status
        .as_ref()
        .and_then(|s| s.state.as_deref())
        .is_some_and(super::status::is_terminal);
    // (id, whether it may still need cancelling)
    let mut jobs: Vec<(u32, bool)> = Vec::new();
    // Second jobs of a watched submission, counted once cancelled.
    let mut duplicates_found: Vec<u32> = Vec::new();
    if job.spec.array_spec.is_some() {
        let found = jobs_of(&ctx.controller, &super::status::job_name(job), uid).await?;
        jobs.extend(found.iter().map(|j| {
            (
                j.job_id,
                !super::status::is_terminal(super::status::state_name(j.state())),
            )
        }));
        if let Some(id) = recorded {
            jobs.push((id, false));
        }
    } else if let (Some(id), None) = (recorded, unanswered_at) {
        jobs.push((id, !terminal));
    } else {
        // A submission whose status write was lost must still be cancelled, and so must a
        // late duplicate of a watched one ([`duplicates`]).
        if let Some(id) = recorded {
            jobs.push((id, !terminal));
        }
        if let Ok(spec) = convert::job_spec_as(job, uid, &ctx.default_user) {
            for found in jobs_of(&ctx.controller, &spec.name, uid).await? {
                if Some(found.job_id) == recorded {
                    continue;
                }
                let live = !super::status::is_terminal(super::status::state_name(found.state()));
                if live && recorded.is_some() {
                    duplicates_found.push(found.job_id);
                }
                jobs.push((found.job_id, live));
            }
        }
    }
    jobs.sort_unstable();
    jobs.dedup_by_key(|(id, _)| *id);
    Ok((jobs, duplicates_found))
}

/// Cancels `job_id`, one of the deleted `job`'s jobs (a `duplicate` is counted as such).
/// A job already ended, or unknown for longer than a stale replica explains
/// (`--job-lost-after`), has nothing left to cancel.
async fn cancel_left_job(
    job: &SpurJob,
    ctx: &JobsContext,
    job_id: u32,
    duplicate: bool,
) -> Result<(), ReconcileError> {
    match ctx
        .controller
        .cancel_job(pb::CancelJobRequest {
            job_id,
            signal: 0,
            user: String::new(),
        })
        .await
    {
        Ok(()) => {
            if duplicate {
                ctx.metrics.duplicate_cancelled("deletion");
            }
            tracing::info!(spurjob = %job.name_any(), job_id, "job cancelled")
        }
        Err(e) => {
            let refusal = cancel_refusal(&e, job_id);
            let unknown_for = {
                let mut since = ctx.not_found_since.lock().expect("not-found lock");
                if refusal == CancelRefusal::Unknown {
                    let now = tokio::time::Instant::now();
                    now.saturating_duration_since(*since.entry(job_id).or_insert(now))
                } else {
                    since.remove(&job_id);
                    std::time::Duration::ZERO
                }
            };
            if !cancel_is_final(refusal, unknown_for, ctx.tuning.lost_after) {
                return Err(e.into());
            }
            // Already ended, or unknown for long enough: nothing to cancel.
            ctx.not_found_since
                .lock()
                .expect("not-found lock")
                .remove(&job_id);
            tracing::info!(spurjob = %job.name_any(), job_id, error = %e, "nothing left to cancel");
        }
    }
    Ok(())
}

/// Which of a job's pods [`delete_job_objects`] deletes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobPods {
    /// Every one (the SpurJob is going away).
    All,
    /// Those not Succeeded or Failed: an ended pod holds nothing, and keeps its logs and
    /// exit code for `kubectl logs` (the failed rank of a restarted job); it goes with its
    /// SpurJob.
    Unended,
}

/// Deletes the pods (`which` of them) and the headless Service of `job_id` in `namespace`.
pub async fn delete_job_objects(
    kube: &kube::Client,
    namespace: &str,
    job_id: u32,
    which: JobPods,
) -> Result<(), kube::Error> {
    let selector = format!("{LABEL_JOB_ID}={job_id}");
    let pods: Api<Pod> = Api::namespaced(kube.clone(), namespace);
    let listed = pods.list(&ListParams::default().labels(&selector)).await?;
    for pod in listed {
        let ended = matches!(
            pod.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded" | "Failed")
        );
        if which == JobPods::Unended && ended {
            continue;
        }
        match pods.delete(&pod.name_any(), &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.is_not_found() => {}
            Err(e) => return Err(e),
        }
    }
    let services: Api<Service> = Api::namespaced(kube.clone(), namespace);
    match services
        .delete(&super::service_name(job_id), &DeleteParams::default())
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.is_not_found() => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use k8s_openapi::jiff::Timestamp;

    use super::*;
    use crate::jobs::crd::Condition;

    #[tokio::test(start_paused = true)]
    async fn a_watched_submission_has_its_late_duplicate_cancelled_until_the_watch_ends() {
        use crate::controller::testing::{MemoryNetwork, ScriptedController};
        use crate::kube_testing::{Writes, api_server};
        let controller = ScriptedController::default();
        let client = ControllerClient::new(
            crate::controller::ControllerAddr::new("spurctld", 6817),
            crate::controller::ChannelConfig::default(),
            None,
            MemoryNetwork::start(controller.clone()),
        )
        .expect("client");
        // Job 7 is the one the SpurJob records; job 8, the same submission applied later.
        for _ in 0..2 {
            let spec = pb::JobSpec {
                name: "train".into(),
                comment: "spurjob-uid=uid-1".into(),
                ..Default::default()
            };
            client
                .submit_job(pb::SubmitJobRequest { spec: Some(spec) })
                .await
                .expect("submitted");
        }
        let writes = Writes::default();
        let kube = api_server(Arc::clone(&writes), Duration::ZERO);
        let metrics = Metrics::new();
        // Wall time that moves with the paused tokio clock.
        let origin = tokio::time::Instant::now();
        let epoch = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let clock = WallClock::from_fn(move || epoch + origin.elapsed());
        let ctx = JobsContext::new(
            kube.clone(),
            client,
            metrics.clone(),
            EventPublisher::new(kube, clock.clone(), "test".into()),
            clock.clone(),
            BackoffPolicy {
                initial: Duration::from_secs(1),
                max: Duration::from_secs(30),
                jitter: 0.0,
                transient: None,
            },
            Entropy::from_seed(1),
        );
        let mut job = SpurJob::new("train", crate::jobs::crd::SpurJobSpec::default());
        job.metadata.namespace = Some("ml".into());
        job.metadata.uid = Some("uid-1".into());

        // Not watched: nothing is read.
        let action = watch_for_duplicates(&job, "uid-1", 7, &ctx).await.unwrap();
        assert_eq!(action, Action::await_change());
        assert_eq!(controller.log(), ["SubmitJob train", "SubmitJob train"]);

        // A submission went unanswered: the status says so, whichever replica reads it.
        job.status = Some(SpurJobStatus {
            unanswered_submission_at: Some(clock.timestamp().to_string()),
            ..SpurJobStatus::default()
        });
        let action = watch_for_duplicates(&job, "uid-1", 7, &ctx).await.unwrap();
        assert_eq!(action, Action::requeue(Duration::from_secs(30)));
        assert_eq!(
            controller.log().last().map(String::as_str),
            Some("CancelJob 8")
        );
        let states: Vec<_> = controller
            .jobs()
            .iter()
            .map(|j| (j.job_id, j.state()))
            .collect();
        assert_eq!(
            states,
            [
                (7, pb::JobState::JobPending),
                (8, pb::JobState::JobCancelled)
            ]
        );
        let event = writes.lock().unwrap().last().cloned().expect("an event");
        assert_eq!(event.1["reason"], "DuplicateCancelled", "{event:?}");
        assert!(
            metrics
                .encode()
                .contains("duplicate_jobs_cancelled_total{found_at=\"watch\"} 1")
        );

        // Watched on: read again, nothing more to cancel.
        let calls = controller.log().len();
        let action = watch_for_duplicates(&job, "uid-1", 7, &ctx).await.unwrap();
        assert_eq!(action, Action::requeue(Duration::from_secs(30)));
        assert_eq!(
            controller.log().len(),
            calls,
            "a read is not logged; no cancel"
        );

        // Ten minutes after the unanswered submission the watch is over.
        tokio::time::advance(Duration::from_secs(600)).await;
        let action = watch_for_duplicates(&job, "uid-1", 7, &ctx).await.unwrap();
        assert_eq!(action, Action::await_change());
    }

    fn status_error(method: &'static str, code: Code, message: &str) -> ControllerError {
        ControllerError::Status {
            method,
            code,
            message: message.into(),
            leader_hint: None,
        }
    }

    #[test]
    fn only_a_verdict_on_the_submission_is_a_refusal() {
        let gpu = "only one GPU request form (gpus, gpus_per_node, gpus_per_task, or a gpu gres entry) may be set";
        let table = [
            (
                "SubmitJob",
                Code::InvalidArgument,
                gpu,
                Some(Refusal::InvalidArgument),
            ),
            (
                "SubmitJob",
                Code::FailedPrecondition,
                "cannot resolve UNIX credentials for authenticated user 'bob': no such user on this host: bob",
                Some(Refusal::FailedPrecondition),
            ),
            (
                "SubmitJob",
                Code::PermissionDenied,
                "denied",
                Some(Refusal::PermissionDenied),
            ),
            ("SubmitJob", Code::Internal, "raft propose failed: x", None),
            ("SubmitJob", Code::Unavailable, "not the Raft leader", None),
            ("SubmitJob", Code::DeadlineExceeded, "", None),
            ("SubmitJob", Code::Unauthenticated, "bad token", None),
            // The adoption read before the submission is not a verdict on the spec.
            ("GetJobs", Code::InvalidArgument, "bad filter", None),
            ("GetJobs", Code::PermissionDenied, "denied", None),
        ];
        for (method, code, message, expected) in table {
            assert_eq!(
                Refusal::of(&status_error(method, code, message)),
                expected,
                "{method} {code:?}"
            );
        }
        let connect = ControllerError::Connect {
            addr: "x".into(),
            source: crate::controller::ConnectError::Refused("no".into()),
        };
        assert_eq!(Refusal::of(&connect), None);
    }

    fn refused(reason: &str, generation: i64, at: Option<&str>) -> SpurJobStatus {
        let mut status = SpurJobStatus {
            observed_generation: Some(generation),
            conditions: vec![Condition {
                type_: "Submitted".into(),
                status: "False".into(),
                reason: reason.into(),
                message: "spurctld refused the job: …".into(),
                last_transition_time: at.map(str::to_owned),
            }],
            ..Default::default()
        };
        end_here(
            &mut status,
            REFUSED_REASON,
            "rejected by spurctld: …",
            "…",
            "t",
        );
        status
    }

    /// A status whose `Failed` condition is spurctld's, not a refusal's.
    fn failed_by_spurctld(generation: i64, at: &str) -> SpurJobStatus {
        let mut status = refused("InvalidArgument", generation, Some(at));
        for c in &mut status.conditions {
            if c.type_ == "Failed" {
                c.reason = "Failed".into();
            }
        }
        status
    }

    /// The same refusal as an earlier version wrote it: `Refused` as the state.
    fn refused_earlier(reason: &str, generation: i64, at: Option<&str>) -> SpurJobStatus {
        SpurJobStatus {
            state: Some(REFUSED_REASON.into()),
            conditions: refused(reason, generation, at).conditions[..1].to_vec(),
            observed_generation: Some(generation),
            ..Default::default()
        }
    }

    #[test]
    fn a_refusal_holds_until_the_spec_changes_or_a_precondition_retry_is_due() {
        const T0: &str = "2025-01-01T00:00:00Z";
        let retry = Duration::from_secs(300);
        let at = |s: &str| s.parse::<Timestamp>().unwrap();
        let table = [
            // Never refused, or something else: submit.
            (SpurJobStatus::default(), Some(1), T0, Gate::Submit),
            (
                SpurJobStatus {
                    state: Some("Pending".into()),
                    ..Default::default()
                },
                Some(1),
                T0,
                Gate::Submit,
            ),
            // Refused for this generation: wait for an edit.
            (
                refused("InvalidArgument", 1, Some(T0)),
                Some(1),
                "2025-01-02T00:00:00Z",
                Gate::Wait,
            ),
            (
                refused("PermissionDenied", 1, Some(T0)),
                Some(1),
                T0,
                Gate::Wait,
            ),
            // The spec changed since: submit.
            (
                refused("InvalidArgument", 1, Some(T0)),
                Some(2),
                T0,
                Gate::Submit,
            ),
            (
                refused("PermissionDenied", 1, Some(T0)),
                None,
                T0,
                Gate::Submit,
            ),
            // FAILED_PRECONDITION: retried on its cadence.
            (
                refused("FailedPrecondition", 1, Some(T0)),
                Some(1),
                "2025-01-01T00:01:00Z",
                Gate::RetryIn(Duration::from_secs(240)),
            ),
            (
                refused("FailedPrecondition", 1, Some(T0)),
                Some(1),
                "2025-01-01T00:05:00Z",
                Gate::Submit,
            ),
            // A clock that went backwards waits the whole cadence, never less.
            (
                refused("FailedPrecondition", 1, Some("2025-01-01T00:10:00Z")),
                Some(1),
                T0,
                Gate::RetryIn(retry),
            ),
            (
                refused("FailedPrecondition", 1, Some("yesterday")),
                Some(1),
                T0,
                Gate::Submit,
            ),
            (
                refused("FailedPrecondition", 1, None),
                Some(1),
                T0,
                Gate::Submit,
            ),
            (
                refused("SomethingElse", 1, Some(T0)),
                Some(1),
                T0,
                Gate::Submit,
            ),
            // Written as earlier versions wrote it: held the same way.
            (
                refused_earlier("InvalidArgument", 1, Some(T0)),
                Some(1),
                T0,
                Gate::Wait,
            ),
            (
                refused_earlier("FailedPrecondition", 1, Some(T0)),
                Some(1),
                "2025-01-01T00:01:00Z",
                Gate::RetryIn(Duration::from_secs(240)),
            ),
            // spurctld's own Failed (a job that ran) is no refusal.
            (failed_by_spurctld(1, T0), Some(1), T0, Gate::Submit),
        ];
        for (i, (status, generation, now, expected)) in table.into_iter().enumerate() {
            assert_eq!(
                gate(&status, generation, at(now), retry),
                expected,
                "row {i}"
            );
        }
    }

    #[test]
    fn cancelling_a_job_that_ended_is_done_and_one_unknown_only_after_lost_after() {
        use CancelRefusal::{Ended, Other, Unknown};
        let table = [
            (Code::Internal, "job 5 not found", Unknown),
            (Code::Internal, "job 5 is already Completed", Ended),
            (Code::Internal, "job 5 is already NodeFail", Ended),
            (Code::NotFound, "job 5 not found", Unknown),
            (
                Code::FailedPrecondition,
                "job 5 is already Cancelled",
                Ended,
            ),
            // Another job's words, or a passing failure: not done.
            (Code::Internal, "job 6 not found", Other),
            (
                Code::Internal,
                "raft propose failed: job 5 not found",
                Other,
            ),
            (Code::Unavailable, "not the Raft leader", Other),
            (
                Code::PermissionDenied,
                "user bob cannot cancel job owned by alice",
                Other,
            ),
        ];
        for (code, message, expected) in table {
            assert_eq!(
                cancel_refusal(&status_error("CancelJob", code, message), 5),
                expected,
                "{code:?} {message}"
            );
        }
        let lost_after = std::time::Duration::from_secs(120);
        let secs = std::time::Duration::from_secs;
        assert!(cancel_is_final(Ended, secs(0), lost_after));
        // A stale replica may not know the job yet: unknown is final only after a while.
        assert!(!cancel_is_final(Unknown, secs(0), lost_after));
        assert!(!cancel_is_final(Unknown, secs(119), lost_after));
        assert!(cancel_is_final(Unknown, secs(120), lost_after));
        assert!(!cancel_is_final(Other, secs(1000), lost_after));
    }
}
