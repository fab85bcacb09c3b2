//! SpurJobs: the custom resource, its conversion to the controller's JobSpec, the
//! reconciler that submits and mirrors them, and the reports of their pods' ends.

pub mod convert;
pub mod crd;

pub use crd::{SpurJob, SpurJobSpec, SpurJobStatus};
