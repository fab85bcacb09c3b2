//! A SpurJob's second controller job: found and cancelled before it runs.
//!
//! [`super::submit`] never sends a second SubmitJob while it can see the first may land.
//! What it cannot see is a SubmitJob it gave up on that spurctld applies later: spurctld
//! does not deduplicate (every SubmitJob takes a fresh id), a follower forwards a write to
//! the leader with no deadline of its own, and a kernel retransmits what a network cut
//! held once the cut heals (ROCm/spur `cluster.rs` and `server.rs`). So a
//! SubmitJob abandoned in a cut, and the retry that succeeded elsewhere, can leave two
//! jobs carrying one SpurJob's UID. The job the SpurJob records (`status.spurJobId`) is
//! the one; any other is a duplicate, removed at the first of three places it shows:
//!
//! - **at launch** (the agent): a LaunchJob for a job whose UID belongs to a SpurJob that
//!   records another id is refused, so no pod is created, and the job is cancelled
//!   ([`launch_is_duplicate`]);
//! - **while watched** (the reconciler): after a submission with an attempt that went
//!   unanswered (recorded with the id, as `status.unansweredSubmissionAt`, so the replica
//!   acting after a failover watches too), the SpurJob's jobs are read back by name every
//!   `--duplicate-watch-interval` for `--duplicate-watch`, and every live job carrying its
//!   UID but the recorded one is cancelled ([`cancel_duplicates`]), so a duplicate waiting
//!   in the queue does not hold a place there;
//! - **at deletion** (the finalizer): every live job carrying the UID is cancelled, the
//!   recorded one and, after any unanswered attempt, every other found by name.
//!
//! An array's tasks all carry the SpurJob's UID (fidelity row 16) and GetJobs does not say
//! which array a task belongs to, so an array is judged at launch only, where the
//! LaunchJob names its array's id.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use spur_proto as pb;

use super::convert::uid_in_comment;
use super::status::{is_terminal, state_name};
use crate::controller::{ControllerClient, ControllerError};

/// Whether a LaunchJob is for a duplicate: its SpurJob records another job. `recorded` is
/// the SpurJob's `status.spurJobId` (for an array, its array's id); `None` until the
/// status write of its submission lands, when nothing can be told apart yet and the
/// launch goes ahead.
pub fn launch_is_duplicate(
    recorded: Option<u32>,
    is_array: bool,
    launch: &pb::LaunchJobRequest,
) -> bool {
    let Some(recorded) = recorded else {
        return false;
    };
    let launched = if is_array {
        launch.array_job_id
    } else {
        launch.job_id
    };
    // An array task launched without its array's id cannot be judged: let it run.
    launched != 0 && launched != recorded
}

/// Whether a failed SubmitJob may still be applied later: it was sent and no verdict came
/// back (abandoned, timed out, its connection lost, or a stale leader's "raft propose
/// failed", whose entry a heal may yet commit). A refusal, a call never sent, or "not the
/// Raft leader" from a follower that knows no leader settled it.
pub fn may_still_apply(error: &ControllerError) -> bool {
    // `is_transport` is the retry rule's own reading: no verdict, or a passing failure.
    matches!(
        error,
        ControllerError::Status {
            method: "SubmitJob",
            ..
        }
    ) && error.is_transport()
        && !error.message().contains("not the Raft leader")
}

/// The live jobs among `jobs` that carry `uid` and are not `keep`: the duplicates to
/// cancel, lowest id first.
pub fn duplicates_of(jobs: &[pb::JobInfo], uid: &str, keep: u32) -> Vec<u32> {
    let mut ids: Vec<u32> = jobs
        .iter()
        .filter(|job| job.job_id != keep)
        .filter(|job| uid_in_comment(&job.comment) == Some(uid))
        .filter(|job| !is_terminal(state_name(job.state())))
        .map(|job| job.job_id)
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// Reads the jobs named `name` and cancels each live one carrying `uid` but `keep`;
/// answers the ids cancelled. A duplicate that ended meanwhile is not an error.
pub async fn cancel_duplicates(
    controller: &ControllerClient,
    name: &str,
    uid: &str,
    keep: u32,
) -> Result<Vec<u32>, ControllerError> {
    let found = super::submit::jobs_of(controller, name, uid).await?;
    let mut cancelled = Vec::new();
    for job_id in duplicates_of(&found, uid, keep) {
        if cancel(controller, job_id).await? {
            cancelled.push(job_id);
        }
    }
    Ok(cancelled)
}

/// Cancels one duplicate; `false` if it had already ended.
pub async fn cancel(controller: &ControllerClient, job_id: u32) -> Result<bool, ControllerError> {
    match controller
        .cancel_job(pb::CancelJobRequest {
            job_id,
            signal: 0,
            user: String::new(),
        })
        .await
    {
        Ok(()) => Ok(true),
        Err(e) if e.says_job_already_ended(job_id) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Submissions that went unanswered, not yet recorded on their SpurJob, by UID: the time of
/// the latest. It is written with the submission's status, in the one write that records
/// the id: a write of its own would wake the reconciler at once, ahead of its backoff.
#[derive(Debug, Default)]
pub struct Unanswered(std::sync::Mutex<std::collections::BTreeMap<String, String>>);

impl Unanswered {
    /// A SubmitJob for `uid` went unanswered at `at` (RFC 3339): it may still be applied.
    pub fn note(&self, uid: &str, at: &str) {
        let mut entries = self.0.lock().expect("unanswered lock");
        entries.insert(uid.to_owned(), at.to_owned());
    }

    /// The latest unanswered submission of `uid` not yet recorded.
    pub fn latest(&self, uid: &str) -> Option<String> {
        self.0.lock().expect("unanswered lock").get(uid).cloned()
    }

    /// Forgets `uid`: its SpurJob's status records it, or the SpurJob is gone.
    pub fn forget(&self, uid: &str) {
        self.0.lock().expect("unanswered lock").remove(uid);
    }
}

/// What the reconciler does about a submitted SpurJob's watch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WatchStep {
    /// Not watched, or its watch is over: nothing.
    Idle,
    /// Read back now, and again after this long.
    Sweep(Duration),
}

/// The watch step at `now` of a SpurJob whose submission last went unanswered at
/// `unanswered_at` (its status's `unansweredSubmissionAt`), given how long a watch lasts
/// and how often it reads. Recorded on the SpurJob, not in a replica's memory, so the
/// replica acting after a failover watches on what its predecessor gave up on.
pub fn watch_step(
    unanswered_at: Option<&str>,
    now: Timestamp,
    lasts: Duration,
    every: Duration,
) -> WatchStep {
    let Some(since) = unanswered_at.and_then(|at| at.parse::<Timestamp>().ok()) else {
        return WatchStep::Idle;
    };
    if now.duration_since(since).as_secs_f64() >= lasts.as_secs_f64() {
        return WatchStep::Idle;
    }
    WatchStep::Sweep(every)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launch(job_id: u32, array_job_id: u32) -> pb::LaunchJobRequest {
        pb::LaunchJobRequest {
            job_id,
            array_job_id,
            ..Default::default()
        }
    }

    #[test]
    fn a_launch_is_a_duplicate_only_when_its_spurjob_records_another_job() {
        // (recorded, array, job id, array id) -> duplicate?
        let cases = [
            (None, false, 7, 0, false),
            (Some(7), false, 7, 0, false),
            (Some(5), false, 7, 0, true),
            // An array: judged by the array's id, not the task's.
            (Some(5), true, 8, 5, false),
            (Some(5), true, 12, 11, true),
            (Some(5), true, 12, 0, false),
            (None, true, 12, 11, false),
        ];
        for (recorded, array, job_id, array_id, want) in cases {
            assert_eq!(
                launch_is_duplicate(recorded, array, &launch(job_id, array_id)),
                want,
                "recorded {recorded:?}, array {array}, job {job_id}, array id {array_id}"
            );
        }
    }

    fn submit_failed(code: tonic::Code, message: &str) -> ControllerError {
        ControllerError::Status {
            method: "SubmitJob",
            code,
            message: message.to_owned(),
            leader_hint: None,
        }
    }

    #[test]
    fn only_a_submission_sent_without_a_verdict_may_still_apply() {
        use tonic::Code;
        assert!(may_still_apply(&submit_failed(
            Code::Cancelled,
            "abandoned"
        )));
        assert!(may_still_apply(&submit_failed(Code::DeadlineExceeded, "")));
        assert!(may_still_apply(&submit_failed(
            Code::Unavailable,
            "connection reset"
        )));
        assert!(may_still_apply(&submit_failed(
            Code::Internal,
            "raft propose failed: has to forward request to: 2"
        )));
        assert!(!may_still_apply(&submit_failed(
            Code::Unavailable,
            "not the Raft leader"
        )));
        assert!(!may_still_apply(&submit_failed(
            Code::InvalidArgument,
            "no partition"
        )));
        assert!(!may_still_apply(&submit_failed(
            Code::Internal,
            "job spec too large"
        )));
        let read = ControllerError::Status {
            method: "GetJobs",
            code: Code::Cancelled,
            message: String::new(),
            leader_hint: None,
        };
        assert!(!may_still_apply(&read));
    }

    fn job(job_id: u32, comment: &str, state: pb::JobState) -> pb::JobInfo {
        pb::JobInfo {
            job_id,
            comment: comment.to_owned(),
            state: state as i32,
            ..Default::default()
        }
    }

    #[test]
    fn the_duplicates_are_the_live_jobs_of_the_uid_but_the_recorded_one() {
        let jobs = [
            job(9, "spurjob-uid=u1", pb::JobState::JobPending),
            job(4, "spurjob-uid=u1", pb::JobState::JobRunning),
            job(5, "spurjob-uid=u1", pb::JobState::JobRunning),
            job(6, "spurjob-uid=u1", pb::JobState::JobCancelled),
            job(7, "spurjob-uid=u2", pb::JobState::JobPending),
            job(8, "", pb::JobState::JobPending),
        ];
        assert_eq!(duplicates_of(&jobs, "u1", 5), vec![4, 9]);
        assert_eq!(duplicates_of(&jobs, "u2", 7), Vec::<u32>::new());
        assert_eq!(duplicates_of(&jobs, "u3", 1), Vec::<u32>::new());
    }

    #[test]
    fn a_watch_sweeps_until_it_lasted_its_time_after_the_last_unanswered_submission() {
        let start: Timestamp = "2026-12-07T10:00:00Z".parse().unwrap();
        let at = |secs: i64| start + k8s_openapi::jiff::SignedDuration::from_secs(secs);
        let lasts = Duration::from_secs(600);
        let every = Duration::from_secs(30);
        let step = |unanswered: Option<&str>, now| watch_step(unanswered, now, lasts, every);
        assert_eq!(step(None, start), WatchStep::Idle);
        let first = start.to_string();
        assert_eq!(step(Some(&first), at(599)), WatchStep::Sweep(every));
        assert_eq!(step(Some(&first), at(600)), WatchStep::Idle);
        // A later unanswered attempt is what the status then records.
        let later = at(100).to_string();
        assert_eq!(step(Some(&later), at(650)), WatchStep::Sweep(every));
        assert_eq!(step(Some(&later), at(700)), WatchStep::Idle);
        assert_eq!(step(Some("not a time"), start), WatchStep::Idle);
    }
}
