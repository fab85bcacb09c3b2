//! SpurJobs: the custom resource, its conversion to the controller's JobSpec, the
//! reconciler that submits and mirrors them, and the reports of their pods' ends.

pub mod convert;
pub mod crd;
pub mod pods;
pub mod reconcile;
pub mod reports;
pub mod status;
pub mod submit;

pub use crd::{SpurJob, SpurJobSpec, SpurJobStatus};

/// Keeps a deleted SpurJob until its job is cancelled and its pods are gone.
pub const FINALIZER: &str = "spur.amd.com/cleanup";
/// On every pod and Service of a job: the controller's job id.
pub const LABEL_JOB_ID: &str = "spur.amd.com/job-id";
/// On every pod the operator creates, so orphans can be found.
pub const LABEL_MANAGED_BY: &str = "spur.amd.com/managed-by";
pub const MANAGED_BY: &str = "spur-operator";
/// The owning SpurJob's UID.
pub const LABEL_SPURJOB_UID: &str = "spur.amd.com/spurjob-uid";

/// The headless Service of a multi-node job.
pub fn service_name(job_id: u32) -> String {
    format!("spur-job-{job_id}")
}
