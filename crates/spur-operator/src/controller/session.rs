//! Read-your-writes across channels: the client remembers which jobs a controller has
//! acknowledged as ended, and a read that still shows one of them pending or running well
//! after that, or asked for it by id and does not show it at all, came from a replica that
//! is behind (rule 6 of [`super::policy`]).
//!
//! Two replicas of spurctld answer reads from their own copy (fidelity.md rows 8, 10, 11):
//! a leader cut off from its majority, and a follower that forgot its leader. Neither says
//! so, both answer Pings and the probe's read at once, and the Service may pick either on
//! any dial (rotation included). What the operator can see is that such a replica
//! contradicts what it was told: its agent reported a job's end, a replica acknowledged
//! it, and the job still reads as running. Pure: no I/O, no clock of its own.

use std::collections::BTreeMap;
use std::time::Duration;

use spur_proto as pb;
use tokio::time::Instant;

use super::policy::{DialId, ReplicaId};

/// How long an acknowledgement is remembered when no read ever looks at its job (the
/// status mirror reads every job it follows every few seconds, so this is ample).
pub const ACK_MEMORY: Duration = Duration::from_secs(300);
/// Acknowledgements remembered at most; the oldest go first.
pub const MAX_ACKS: usize = 10_000;

/// A read that contradicts an acknowledged write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Behind {
    pub job_id: u32,
    /// The job's state as the read showed it; `None` when the read was asked for the job by
    /// id and did not show it (a replica cut off from its majority when the job was created
    /// never heard of it).
    pub shown: Option<pb::JobState>,
    /// How long after the acknowledgement the read was sent.
    pub after: Duration,
}

impl std::fmt::Display for Behind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.shown {
            Some(state) => write!(
                f,
                "the replica is behind: it shows job {} {} {:?} after a report of its end was acknowledged",
                self.job_id,
                state.as_str_name(),
                self.after
            ),
            None => write!(
                f,
                "the replica is behind: asked for job {} by id, it does not know the job {:?} after a report of its end was acknowledged",
                self.job_id, self.after
            ),
        }
    }
}

/// The channel a read came over, and the replica it reached when its Ping named it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadFrom {
    pub dial: Option<DialId>,
    pub replica: Option<ReplicaId>,
}

/// An acknowledged end of a job.
#[derive(Clone, Copy, Debug)]
struct Ack {
    at: Instant,
    /// A read showed the job ended: from then on only a read that does not know the job
    /// contradicts it (one that shows it pending or running again saw a requeue).
    seen_ended: bool,
    /// A read contradicted it and its replica was left.
    left: Option<Left>,
}

/// The replica a contradiction left: when first, and the last channel that contradicted.
#[derive(Clone, Copy, Debug)]
struct Left {
    first: Instant,
    dial: Option<DialId>,
    replica: Option<ReplicaId>,
}

impl Left {
    /// Whether `from` is known to reach another replica than the one left (a channel's
    /// name is its own, so the same channel never qualifies).
    fn elsewhere(&self, from: ReadFrom) -> bool {
        matches!((self.replica, from.replica), (Some(left), Some(now)) if left != now)
    }
}

/// The acknowledged ends of jobs, by job id.
#[derive(Debug)]
pub struct Session {
    acked: BTreeMap<u32, Ack>,
    /// How long a replica that contradicted an acknowledgement is left again when read
    /// again (see [`Session::check`]).
    window: Duration,
}

impl Session {
    pub fn new(window: Duration) -> Session {
        Session {
            acked: BTreeMap::new(),
            window,
        }
    }

    /// A report that job `job_id` ended on one of its nodes was acknowledged at `at`: the
    /// job is COMPLETING or has ended (fidelity.md row 7), unless the report was for an
    /// older attempt (then it was ignored; see [`Session::check`]).
    pub fn acknowledged(&mut self, job_id: u32, at: Instant) {
        self.acked.insert(
            job_id,
            Ack {
                at,
                seen_ended: false,
                left: None,
            },
        );
        self.acked
            .retain(|_, acked| at.duration_since(acked.at) <= ACK_MEMORY);
        while self.acked.len() > MAX_ACKS {
            let oldest = self
                .acked
                .iter()
                .min_by_key(|(id, acked)| (acked.at, **id))
                .map(|(id, _)| *id);
            match oldest {
                Some(id) => self.acked.remove(&id),
                None => break,
            };
        }
    }

    /// Checks the jobs a read sent at `sent` over `from` answered with, and the ids it asked
    /// for (`asked`: only for a read that filters by id alone, so every asked job that
    /// exists must be shown), against the acknowledgements older than `grace` (a replica
    /// that forwards reads to the leader answers from the leader's state; one that applies
    /// the leader's commits lags by a heartbeat, 500 ms).
    ///
    /// A read that shows the job pending or running contradicts the acknowledgement, and its
    /// replica is left. The acknowledgement is kept: read again through the same replica, or
    /// one no Ping has named, it is left again, since the operator may reach nothing else
    /// for a while (a leader cut off from its peers: believing its second read would leave
    /// the SpurJob Running until the cut heals). It is settled, and the read taken
    /// as the truth, once another replica repeats the contradiction, or the same one still
    /// does the session's window after the first: a report for an attempt the controller had already
    /// replaced is acknowledged and ignored, and that job reads as running everywhere.
    ///
    /// A read that shows the job ended agrees, and the acknowledgement is kept (until
    /// [`ACK_MEMORY`]): a later read by id that does not know the job at all still came
    /// from a replica that is behind (a rotation onto a leader cut off from its peers, after
    /// one read on the real leader had agreed, would otherwise leave the SpurJob Running),
    /// while one that shows it pending or running again saw a requeue.
    pub fn check(
        &mut self,
        jobs: &[pb::JobInfo],
        asked: &[u32],
        sent: Instant,
        from: ReadFrom,
        grace: Duration,
    ) -> Option<Behind> {
        let shown = jobs.iter().map(|job| (job.job_id, Some(job.state())));
        let missing = self.missing(jobs, asked);
        let mut behind = None;
        for (job_id, state) in shown.chain(missing) {
            let Some(ack) = self.acked.get_mut(&job_id) else {
                continue;
            };
            let contradicts = match state {
                None => true,
                Some(pb::JobState::JobPending | pb::JobState::JobRunning) => !ack.seen_ended,
                Some(_) => {
                    ack.seen_ended = true;
                    continue;
                }
            };
            if !contradicts {
                self.acked.remove(&job_id); // requeued after the end a read showed
                continue;
            }
            let Some(after) = sent.checked_duration_since(ack.at) else {
                continue; // sent before the acknowledgement: may rightly not know of it
            };
            if after < grace {
                continue;
            }
            let left = match ack.left {
                None => Left {
                    first: sent,
                    dial: from.dial,
                    replica: from.replica,
                },
                Some(left) => {
                    let settled = left.elsewhere(from)
                        || sent.saturating_duration_since(left.first) >= self.window;
                    if settled {
                        self.acked.remove(&job_id);
                        continue;
                    }
                    // The same replica (or one not known to be another): the latest channel
                    // to it is the one a Ping will name.
                    Left {
                        first: left.first,
                        dial: from.dial.or(left.dial),
                        replica: from.replica.or(left.replica),
                    }
                }
            };
            ack.left = Some(left);
            behind.get_or_insert(Behind {
                job_id,
                shown: state,
                after,
            });
        }
        behind
    }

    /// The acknowledged ids among `asked` that `jobs` leaves out, as shown in no state.
    fn missing(&self, jobs: &[pb::JobInfo], asked: &[u32]) -> Vec<(u32, Option<pb::JobState>)> {
        // Only the acknowledged ids are looked up in the answer, not every id a poll asks
        // for.
        asked
            .iter()
            .filter(|id| self.acked.contains_key(id))
            .filter(|id| !jobs.iter().any(|job| job.job_id == **id))
            .map(|id| (*id, None))
            .collect()
    }

    /// Dial `dial`'s Ping named `replica`: the replica an acknowledgement's contradiction
    /// over that channel left.
    pub fn named(&mut self, dial: DialId, replica: ReplicaId) {
        for ack in self.acked.values_mut() {
            if let Some(left) = ack.left.as_mut().filter(|left| left.dial == Some(dial)) {
                left.replica = Some(replica);
            }
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.acked.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRACE: Duration = Duration::from_secs(2);
    const WINDOW: Duration = Duration::from_secs(10);
    const UNNAMED: ReadFrom = ReadFrom {
        dial: None,
        replica: None,
    };

    fn over(dial: DialId, replica: Option<ReplicaId>) -> ReadFrom {
        ReadFrom {
            dial: Some(dial),
            replica,
        }
    }

    fn job(job_id: u32, state: pb::JobState) -> pb::JobInfo {
        pb::JobInfo {
            job_id,
            state: state.into(),
            ..Default::default()
        }
    }

    fn secs(start: Instant, s: f64) -> Instant {
        start + Duration::from_secs_f64(s)
    }

    #[test]
    fn a_read_that_still_shows_an_acknowledged_end_running_is_behind() {
        let t0 = Instant::now();
        let mut session = Session::new(WINDOW);
        session.acknowledged(7, t0);
        let running = [
            job(3, pb::JobState::JobRunning),
            job(7, pb::JobState::JobRunning),
        ];
        assert_eq!(
            session.check(&running, &[], secs(t0, 2.5), over(1, Some(0)), GRACE),
            Some(Behind {
                job_id: 7,
                shown: Some(pb::JobState::JobRunning),
                after: Duration::from_millis(2500),
            })
        );
        // Another replica repeats it: the report was for a replaced attempt, taken as the
        // truth.
        assert_eq!(
            session.check(&running, &[], secs(t0, 4.5), over(2, Some(1)), GRACE),
            None
        );
        assert_eq!(session.len(), 0);
    }

    #[test]
    fn a_replica_left_for_a_stale_read_is_left_again_while_it_is_all_the_operator_reaches() {
        // A leader cut off from its peers: the round after the first firing could reach only
        // the cut leader again, over a channel no Ping named.
        let t0 = Instant::now();
        let mut session = Session::new(WINDOW);
        session.acknowledged(7, t0);
        let running = [job(7, pb::JobState::JobRunning)];
        assert!(
            session
                .check(&running, &[], secs(t0, 2.5), over(1, None), GRACE)
                .is_some()
        );
        assert!(
            session
                .check(&running, &[], secs(t0, 3.0), over(2, None), GRACE)
                .is_some(),
            "not known to be another replica"
        );
        // The Pings name both channels: the same replica.
        session.named(2, 0);
        assert!(
            session
                .check(&running, &[], secs(t0, 4.0), over(3, Some(0)), GRACE)
                .is_some(),
            "the same replica, still behind"
        );
        assert_eq!(session.len(), 1);
        // Healed: another replica shows the end.
        let ended = [job(7, pb::JobState::JobCompleted)];
        assert_eq!(
            session.check(&ended, &[], secs(t0, 5.0), over(4, Some(1)), GRACE),
            None
        );
        assert_eq!(
            session.len(),
            1,
            "kept: the stale replica may be read again"
        );
        assert!(
            session
                .check(&[], &[7], secs(t0, 6.0), over(5, Some(0)), GRACE)
                .is_some(),
            "it still does not know the job"
        );
    }

    #[test]
    fn a_contradiction_from_the_replica_left_is_the_truth_once_it_outlasts_the_window() {
        // A one-replica controller and a report for an attempt it had replaced: every read
        // shows the job running; the status poll fails for at most the window.
        let t0 = Instant::now();
        let mut session = Session::new(WINDOW);
        session.acknowledged(7, t0);
        let running = [job(7, pb::JobState::JobRunning)];
        let mut firings = 0;
        let mut at = 2.0;
        while session
            .check(&running, &[], secs(t0, at), over(1, Some(0)), GRACE)
            .is_some()
        {
            firings += 1;
            at += 2.0;
        }
        assert_eq!(firings, 5, "at 2, 4, 6, 8 and 10 s; settled at 12 s");
        assert_eq!(session.len(), 0);
    }

    #[test]
    fn a_read_within_the_grace_or_sent_before_the_acknowledgement_is_not_judged() {
        let t0 = secs(Instant::now(), 10.0);
        let mut session = Session::new(WINDOW);
        session.acknowledged(7, t0);
        let running = [job(7, pb::JobState::JobPending)];
        assert_eq!(
            session.check(&running, &[], t0 - Duration::from_secs(1), UNNAMED, GRACE),
            None
        );
        assert_eq!(
            session.check(&running, &[], secs(t0, 1.9), UNNAMED, GRACE),
            None
        );
        assert_eq!(session.len(), 1, "still waiting for a read that can judge");
        assert!(
            session
                .check(&running, &[], secs(t0, 2.0), UNNAMED, GRACE)
                .is_some()
        );
    }

    #[test]
    fn after_a_read_that_agrees_only_one_that_does_not_know_the_job_is_behind() {
        let t0 = Instant::now();
        let mut session = Session::new(WINDOW);
        session.acknowledged(7, t0);
        session.acknowledged(8, t0);
        let read = [
            job(7, pb::JobState::JobCompleting),
            job(8, pb::JobState::JobFailed),
        ];
        assert_eq!(
            session.check(&read, &[7, 8], secs(t0, 0.1), UNNAMED, GRACE),
            None
        );
        assert_eq!(session.len(), 2, "kept: a replica behind may still be read");
        let later = [job(7, pb::JobState::JobRunning)];
        assert_eq!(
            session.check(&later, &[7], secs(t0, 5.0), UNNAMED, GRACE),
            None,
            "requeued: a new run"
        );
        assert_eq!(session.len(), 1, "the requeue settles it");
        // A rotation onto a leader cut off from its peers, which never heard of job 8, read
        // by id after the grace.
        assert_eq!(
            session.check(&[], &[8], secs(t0, 6.0), UNNAMED, GRACE),
            Some(Behind {
                job_id: 8,
                shown: None,
                after: Duration::from_secs(6),
            })
        );
        assert_eq!(
            session.len(),
            1,
            "kept, in case the next read is as far behind"
        );
    }

    #[test]
    fn a_read_asked_for_an_acknowledged_job_by_id_that_does_not_show_it_is_behind() {
        // A replica cut off from its majority when the job was created answers
        // a poll for it with no jobs at all.
        let t0 = Instant::now();
        let mut session = Session::new(WINDOW);
        session.acknowledged(16, t0);
        let other = [job(3, pb::JobState::JobRunning)];
        assert_eq!(
            session.check(&[], &[16], secs(t0, 1.0), UNNAMED, GRACE),
            None,
            "within the grace"
        );
        assert_eq!(
            session.check(&other, &[3], secs(t0, 3.0), UNNAMED, GRACE),
            None,
            "not asked for: a filtered read may rightly leave it out"
        );
        assert_eq!(
            session.check(&other, &[3, 16], secs(t0, 3.0), UNNAMED, GRACE),
            Some(Behind {
                job_id: 16,
                shown: None,
                after: Duration::from_secs(3),
            })
        );
        assert_eq!(
            session.len(),
            1,
            "kept, in case the next read is as far behind"
        );
    }

    #[test]
    fn acknowledgements_are_bounded_in_age_and_number() {
        let t0 = Instant::now();
        let mut session = Session::new(WINDOW);
        session.acknowledged(1, t0);
        session.acknowledged(2, t0 + ACK_MEMORY + Duration::from_secs(1));
        assert_eq!(session.len(), 1, "the first is older than the memory");
        let later = t0 + ACK_MEMORY * 2;
        for id in 0..(MAX_ACKS as u32 + 5) {
            session.acknowledged(100 + id, later + Duration::from_millis(u64::from(id)));
        }
        assert_eq!(session.len(), MAX_ACKS);
        let running = [
            job(100, pb::JobState::JobRunning),
            job(104, pb::JobState::JobRunning),
        ];
        assert_eq!(
            session.check(&running, &[], later + ACK_MEMORY, UNNAMED, GRACE),
            None,
            "the oldest were dropped"
        );
        let newest = [job(100 + MAX_ACKS as u32 + 4, pb::JobState::JobRunning)];
        assert!(
            session
                .check(&newest, &[], later + ACK_MEMORY, UNNAMED, GRACE)
                .is_some()
        );
    }
}
