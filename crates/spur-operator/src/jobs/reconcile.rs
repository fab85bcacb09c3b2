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
use super::status::{INVALID_STATE, patch_status, set_condition};
use super::submit::{Submission, find_by_uid, submit_once};
use super::{FINALIZER, LABEL_JOB_ID};
use crate::clock::WallClock;
use crate::controller::{ControllerClient, ControllerError};
use crate::events::EventPublisher;
use crate::metrics::{Metrics, ReconcileLabels};
use crate::retry::{Backoff, BackoffPolicy, Entropy};

/// What the reconciler works with.
pub struct JobsContext {
    pub kube: kube::Client,
    pub controller: ControllerClient,
    pub metrics: Metrics,
    pub events: EventPublisher,
    pub clock: WallClock,
    pub retry: BackoffPolicy,
    pub entropy: Entropy,
    /// How often a SubmitJob still waiting for its answer is read back (see
    /// [`submit_once`]), or `None` to wait for the answer alone.
    pub submit_read_back: Option<std::time::Duration>,
    /// Per-object backoff, by UID.
    backoffs: Mutex<BTreeMap<String, Backoff>>,
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
            retry,
            entropy,
            submit_read_back: None,
            backoffs: Mutex::default(),
        }
    }

    /// Reads a waiting SubmitJob back every `every` (see [`submit_once`]).
    pub fn with_submit_read_back(mut self, every: Option<std::time::Duration>) -> JobsContext {
        self.submit_read_back = every;
        self
    }

    fn next_delay(&self, uid: &str, kind: crate::controller::FailureKind) -> std::time::Duration {
        let mut backoffs = self.backoffs.lock().expect("backoffs lock");
        backoffs
            .entry(uid.to_owned())
            .or_insert_with(|| self.retry.start(self.entropy.clone()))
            .delay_after(kind)
    }

    fn succeeded(&self, uid: &str) {
        self.backoffs.lock().expect("backoffs lock").remove(uid);
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
            ctx.succeeded(&uid);
            Ok(action)
        }
        Err(kube::runtime::finalizer::Error::ApplyFailed(e))
        | Err(kube::runtime::finalizer::Error::CleanupFailed(e)) => Err(e),
        Err(kube::runtime::finalizer::Error::AddFinalizer(e))
        | Err(kube::runtime::finalizer::Error::RemoveFinalizer(e)) => Err(ReconcileError::Kube(e)),
        Err(e) => Err(ReconcileError::Finalizer(e.to_string())),
    }
}

/// Per-object backoff: one failing SpurJob never slows the others.
pub fn error_policy(job: Arc<SpurJob>, error: &ReconcileError, ctx: Arc<JobsContext>) -> Action {
    let uid = job.uid().unwrap_or_default();
    let delay = ctx.next_delay(&uid, error.failure_kind());
    ctx.metrics.reconcile_error("spurjob", error.metric_label());
    tracing::warn!(spurjob = %job.name_any(), namespace = ?job.namespace(), %error, ?delay, "reconcile failed; retrying this SpurJob");
    Action::requeue(delay)
}

async fn apply(
    job: &SpurJob,
    api: &Api<SpurJob>,
    ctx: &JobsContext,
) -> Result<Action, ReconcileError> {
    let status = job.status.clone().unwrap_or_default();
    if status.spur_job_id.is_some() {
        // Submitted: from here on the poller mirrors its state.
        return Ok(Action::await_change());
    }
    let uid = job.uid().unwrap_or_default();
    let generation = job.metadata.generation;
    let now = ctx.clock.timestamp().to_string();
    let spec = match convert::job_spec(job, &uid) {
        Ok(spec) => spec,
        Err(invalid) => {
            let message = invalid.to_string();
            let already_reported = status.state.as_deref() == Some(INVALID_STATE)
                && status.observed_generation == generation
                && status.message.as_deref() == Some(message.as_str());
            if !already_reported {
                let mut next = status.clone();
                next.state = Some(INVALID_STATE.to_owned());
                next.message = Some(message.clone());
                next.observed_generation = generation;
                set_condition(
                    &mut next.conditions,
                    "Submitted",
                    false,
                    "InvalidSpec",
                    &message,
                    &now,
                );
                patch_status(api, &job.name_any(), &next).await?;
                ctx.events.warning(job, "InvalidSpec", &message).await;
                ctx.metrics.reconcile_error("spurjob", "invalid_spec");
                tracing::warn!(spurjob = %job.name_any(), %message, "SpurJob is invalid; waiting for its spec to change");
            }
            // Not retried until the generation changes: the watch brings the edit.
            return Ok(Action::await_change());
        }
    };
    let submission = submit_once(&ctx.controller, spec, &uid, ctx.submit_read_back).await?;
    let job_id = submission.job_id();
    if let Some(created) = &job.metadata.creation_timestamp {
        let lag = ctx.clock.timestamp().duration_since(created.0);
        ctx.metrics
            .submission_lag_seconds
            .observe(lag.as_secs_f64().max(0.0));
    }
    let mut next = SpurJobStatus {
        state: Some("PENDING".to_owned()),
        spur_job_id: Some(job_id),
        message: None,
        observed_generation: generation,
        ..status
    };
    let how = match submission {
        Submission::Submitted(_) => "Submitted",
        Submission::Adopted(_) => "Adopted",
    };
    set_condition(
        &mut next.conditions,
        "Submitted",
        true,
        how,
        &format!("spurctld job {job_id}"),
        &now,
    );
    patch_status(api, &job.name_any(), &next).await?;
    tracing::info!(spurjob = %job.name_any(), job_id, how, "SpurJob submitted");
    ctx.events
        .normal(job, how, &format!("spurctld job {job_id}"))
        .await;
    Ok(Action::await_change())
}

/// On deletion: cancel the job, delete its pods and Service. Idempotent; every step
/// treats "already gone" as done.
async fn cleanup(job: &SpurJob, ctx: &JobsContext) -> Result<Action, ReconcileError> {
    let uid = job.uid().unwrap_or_default();
    let recorded = job.status.as_ref().and_then(|s| s.spur_job_id);
    let job_id = match recorded {
        Some(id) => Some(id),
        // A submission whose status write was lost must still be cancelled.
        None => match convert::job_spec(job, &uid) {
            Ok(spec) => find_by_uid(&ctx.controller, &spec.name, &uid).await?,
            Err(_) => None,
        },
    };
    let Some(job_id) = job_id else {
        return Ok(Action::await_change());
    };
    let terminal = job
        .status
        .as_ref()
        .and_then(|s| s.state.as_deref())
        .is_some_and(super::status::is_terminal);
    if !terminal {
        match ctx
            .controller
            .cancel_job(pb::CancelJobRequest {
                job_id,
                signal: 0,
                user: String::new(),
            })
            .await
        {
            Ok(()) => tracing::info!(spurjob = %job.name_any(), job_id, "job cancelled"),
            // Already finished or forgotten: nothing to cancel.
            Err(e) if matches!(e.code(), Code::NotFound | Code::FailedPrecondition) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let namespace = job.namespace().unwrap_or_default();
    delete_job_objects(&ctx.kube, &namespace, job_id).await?;
    Ok(Action::await_change())
}

/// Deletes the pods and the headless Service of `job_id` in `namespace`.
pub async fn delete_job_objects(
    kube: &kube::Client,
    namespace: &str,
    job_id: u32,
) -> Result<(), kube::Error> {
    let selector = format!("{LABEL_JOB_ID}={job_id}");
    let pods: Api<Pod> = Api::namespaced(kube.clone(), namespace);
    let listed = pods.list(&ListParams::default().labels(&selector)).await?;
    for pod in listed {
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
