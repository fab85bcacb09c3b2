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
//! A SubmitJob that has not answered within the read-back interval is read back: while it
//! waits, the operator asks every interval whether a job carrying the UID exists, and
//! adopts it when one does. spurctld commits a submission in milliseconds, so one still
//! waiting has either been applied with its reply lost (which only the request bound
//! would otherwise end, 5 s later) or is on its way (a forward, a commit waiting for a
//! quorum), in which case nothing is found and the call goes on waiting. No second
//! submission is ever sent while the first may still land.
//!
//! What this relies on from spurctld: GetJobs filters by name and returns `comment`
//! unchanged; jobs stay listed after they end (until spurctld purges them); and a read
//! sees the writes acknowledged before it (a follower serving a read from stale local
//! state could miss a submission that was applied a moment earlier, and the operator
//! would submit again). If spurctld hid the comment from the caller, no job would match,
//! and a lost reply would lead to a second submission: `spur-sim` checks for duplicates
//! so such a change shows up as a violation rather than silently.

use std::time::Duration;

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

/// The jobs named `name` that carry `uid` in their comment: a SpurJob's submissions (an
/// array's tasks, or a duplicate beside its job), as spurctld lists them.
pub async fn jobs_of(
    controller: &ControllerClient,
    name: &str,
    uid: &str,
) -> Result<Vec<pb::JobInfo>, ControllerError> {
    let found = controller
        .get_jobs(pb::GetJobsRequest {
            name: name.to_owned(),
            ..Default::default()
        })
        .await?;
    Ok(found
        .jobs
        .into_iter()
        .filter(|job| uid_in_comment(&job.comment) == Some(uid))
        .collect())
}

/// The controller job already carrying `uid`, if any; the lowest id if (through some
/// earlier fault) there are several, so every replica picks the same one.
pub async fn find_by_uid(
    controller: &ControllerClient,
    name: &str,
    uid: &str,
) -> Result<Option<u32>, ControllerError> {
    let found = jobs_of(controller, name, uid).await?;
    Ok(found.iter().map(|job| job.job_id).min())
}

/// Adopts the job carrying `uid`, or submits `spec` (whose comment carries `uid`),
/// reading the submission back every `read_back` while it waits for its answer.
pub async fn submit_once(
    controller: &ControllerClient,
    spec: pb::JobSpec,
    uid: &str,
    read_back: Option<Duration>,
) -> Result<Submission, ControllerError> {
    if let Some(id) = find_by_uid(controller, &spec.name, uid).await? {
        return Ok(Submission::Adopted(id));
    }
    let name = spec.name.clone();
    let submit = controller.submit_job(pb::SubmitJobRequest { spec: Some(spec) });
    let Some(every) = read_back else {
        return Ok(Submission::Submitted(submit.await?.job_id));
    };
    // One turn for the submission and its read-backs, counted from when it is sent.
    controller
        .in_one_turn(submit_or_read_back(controller, submit, &name, uid, every))
        .await
}

/// The submission's answer, or the job it carried once a read-back every `every` finds it.
async fn submit_or_read_back(
    controller: &ControllerClient,
    submit: impl std::future::Future<Output = Result<pb::SubmitJobResponse, ControllerError>>,
    name: &str,
    uid: &str,
    every: Duration,
) -> Result<Submission, ControllerError> {
    let read_back = async {
        loop {
            tokio::time::sleep(every).await;
            // A failed read settles nothing: the submission's own answer still may.
            if let Ok(Some(id)) = find_by_uid(controller, name, uid).await {
                return id;
            }
        }
    };
    tokio::select! {
        // The answer first when both are ready: polled in a fixed order, not a random one.
        biased;
        answer = submit => Ok(Submission::Submitted(answer?.job_id)),
        id = read_back => {
            tracing::info!(job = %name, job_id = id, "SubmitJob still unanswered, but the job it carried was applied: adopted");
            Ok(Submission::Adopted(id))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::Instant;

    use super::*;
    use crate::controller::ChannelConfig;
    use crate::controller::ControllerAddr;
    use crate::controller::testing::{MemoryNetwork, ScriptedController};

    const UID: &str = "uid-1";
    const READ_BACK: Option<Duration> = Some(Duration::from_secs(1));

    /// One replica, and a channel without patience: with it a SubmitJob unanswered for
    /// a second is abandoned once a new channel serves (controller::policy, rule 4), and
    /// these tests are about what the read-back finds meanwhile.
    fn setup() -> (ScriptedController, ControllerClient) {
        setup_with(ChannelConfig::default().max_in_flight)
    }

    /// [`setup`], with at most `max_in_flight` calls in flight.
    fn setup_with(max_in_flight: usize) -> (ScriptedController, ControllerClient) {
        let controller = ScriptedController::default();
        let network = MemoryNetwork::start(controller.clone());
        let client = ControllerClient::new(
            ControllerAddr::new("spurctld", 6817),
            ChannelConfig {
                rules_off: [crate::controller::Rule::Patience].into(),
                max_in_flight,
                ..ChannelConfig::default()
            },
            None,
            network,
        )
        .unwrap();
        (controller, client)
    }

    fn spec() -> pb::JobSpec {
        pb::JobSpec {
            name: "train".into(),
            comment: format!("spurjob-uid={UID}"),
            ..Default::default()
        }
    }

    /// Also with one call in flight allowed: the unanswered SubmitJob holds that turn, and
    /// its read-back shares it instead of waiting behind it for the request bound.
    #[tokio::test(start_paused = true)]
    async fn a_submission_whose_reply_is_lost_is_read_back_and_adopted() {
        for max_in_flight in [ChannelConfig::default().max_in_flight, 1] {
            let (controller, client) = setup_with(max_in_flight);
            controller.lose_next_submit_reply();
            let started = Instant::now();
            let submission = submit_once(&client, spec(), UID, READ_BACK).await.unwrap();
            assert_eq!(
                submission,
                Submission::Adopted(7),
                "{max_in_flight} in flight"
            );
            // The first read-back found it, well inside the 5 s request bound.
            assert!(
                started.elapsed() < Duration::from_secs(2),
                "{max_in_flight} in flight: {:?}",
                started.elapsed()
            );
            assert_eq!(controller.jobs().len(), 1);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn without_read_back_a_lost_reply_waits_for_the_request_bound() {
        let (controller, client) = setup();
        controller.lose_next_submit_reply();
        let started = Instant::now();
        let err = submit_once(&client, spec(), UID, None).await.unwrap_err();
        assert!(started.elapsed() >= Duration::from_secs(5), "{err}");
        // The retry finds the job the lost reply carried.
        let submission = submit_once(&client, spec(), UID, None).await.unwrap();
        assert_eq!(submission, Submission::Adopted(7));
        assert_eq!(controller.jobs().len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_submission_is_read_back_without_being_sent_again() {
        let (controller, client) = setup();
        // Applied only after 3 s: the read-backs at 1 s and 2 s find nothing.
        controller.set_delay(Duration::from_secs(3));
        let submission = submit_once(&client, spec(), UID, READ_BACK).await.unwrap();
        assert_eq!(submission, Submission::Submitted(7));
        assert_eq!(controller.jobs().len(), 1);
        assert_eq!(controller.log(), ["SubmitJob train"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_job_of_the_same_name_from_another_spurjob_is_not_adopted() {
        let (controller, client) = setup();
        let other = pb::JobSpec {
            comment: "spurjob-uid=someone-else".into(),
            ..spec()
        };
        submit_once(&client, other, "someone-else", READ_BACK)
            .await
            .unwrap();
        controller.lose_next_submit_reply();
        let submission = submit_once(&client, spec(), UID, READ_BACK).await.unwrap();
        assert_eq!(submission, Submission::Adopted(8));
    }
}
