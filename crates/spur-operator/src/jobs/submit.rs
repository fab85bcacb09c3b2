//! Submitting a SpurJob exactly once.
//!
//! Every submission carries the SpurJob's UID in `JobSpec.comment` (`spurjob-uid=<uid>`).
//! Before submitting, the operator asks spurctld for jobs of that name and adopts one
//! whose comment carries the UID instead of creating a second. That covers:
//!
//! - a SubmitJob whose reply was lost after spurctld applied it;
//! - a status patch that failed after a successful submit;
//! - an operator restart or leader change between the two.
//!
//! What this relies on from spurctld: GetJobs filters by name and returns `comment`
//! unchanged; jobs stay listed after they end (until spurctld purges them); and a read
//! sees the writes acknowledged before it (a follower serving a read from stale local
//! state could miss a submission that was applied a moment earlier, and the operator
//! would submit again). If spurctld hid the comment from the caller, no job would match,
//! and a lost reply would lead to a second submission: `spur-sim` checks for duplicates
//! so such a change shows up as a violation rather than silently.

use spur_proto as pb;

use super::convert::uid_in_comment;
use crate::controller::{ControllerClient, ControllerError};

/// How a SpurJob got its controller job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Submission {
    Submitted(u32),
    /// An earlier submission of the same SpurJob was found and taken over.
    Adopted(u32),
}

impl Submission {
    pub fn job_id(self) -> u32 {
        match self {
            Submission::Submitted(id) | Submission::Adopted(id) => id,
        }
    }
}

/// The controller job already carrying `uid`, if any; the lowest id if (through some
/// earlier fault) there are several, so every replica picks the same one.
pub async fn find_by_uid(
    controller: &ControllerClient,
    name: &str,
    uid: &str,
) -> Result<Option<u32>, ControllerError> {
    let found = controller
        .get_jobs(pb::GetJobsRequest {
            name: name.to_owned(),
            ..Default::default()
        })
        .await?;
    Ok(found
        .jobs
        .iter()
        .filter(|job| uid_in_comment(&job.comment) == Some(uid))
        .map(|job| job.job_id)
        .min())
}

/// Adopts the job carrying `uid`, or submits `spec` (whose comment carries `uid`).
pub async fn submit_once(
    controller: &ControllerClient,
    spec: pb::JobSpec,
    uid: &str,
) -> Result<Submission, ControllerError> {
    if let Some(id) = find_by_uid(controller, &spec.name, uid).await? {
        return Ok(Submission::Adopted(id));
    }
    let answer = controller
        .submit_job(pb::SubmitJobRequest { spec: Some(spec) })
        .await?;
    Ok(Submission::Submitted(answer.job_id))
}
