//! `spur-operator run`'s flags for SpurJobs.

use std::time::Duration;

use crate::flags::{Bound, parse_duration};

/// SpurJobs: reconciling, mirroring, duplicates, refusals and reports. Flattened into
/// `spur-operator run`.
#[derive(clap::Args, Clone, Debug)]
pub struct JobsArgs {
    /// The user a SpurJob's job runs as at spurctld when its `spur.amd.com/user` annotation
    /// names none. `k8s`: spurctld takes the user of an unauthenticated submission as given
    /// and does not check it, an empty user would make every job ownerless (any caller could
    /// cancel it), and `root` is refused by spurd's default `allow_root_jobs = false`; with a
    /// token, spurctld replaces it with the token's subject anyway.
    #[arg(long, env = "SPUR_OPERATOR_DEFAULT_USER", default_value = "k8s")]
    pub default_user: String,

    /// SpurJob and pod reconciliations in flight at once. kube-runtime's default is
    /// unbounded: an operator starting with 10,000 SpurJobs would open 10,000 calls to
    /// spurctld and the API server at the same moment. 32, as for node registration.
    #[arg(long, env = "SPUR_OPERATOR_RECONCILE_CONCURRENCY", default_value_t = 32,
          value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub reconcile_concurrency: u16,

    /// How often the state of every active job is read (one GetJobs for all of them) and
    /// mirrored into SpurJob status. 2 s keeps status within seconds of the controller at
    /// one call per interval whatever the number of jobs.
    #[arg(long, env = "SPUR_OPERATOR_STATUS_POLL_INTERVAL", default_value = "2s", value_parser = parse_duration)]
    pub status_poll_interval: Duration,

    /// Whether a job this operator has just changed at spurctld (a pod's end reported, a
    /// run requeued) is read and mirrored at once, or only by the next poll. On, a SpurJob
    /// shows its job's end a round trip after the report, at one GetJobs per batch of
    /// reports; off, up to --status-poll-interval later.
    #[arg(long, env = "SPUR_OPERATOR_STATUS_READ_AT_ONCE", default_value_t = true,
          action = clap::ArgAction::Set)]
    pub status_read_at_once: bool,

    /// How long a job must be missing from every GetJobs, without a sighting, before it is
    /// asked about with GetJob and, if unknown, marked `Failed` with reason `Lost`; and how
    /// long CancelJob may answer "job N not found" before a deleted SpurJob's finalizer is
    /// removed. spurctld evicts a job at least 120 s (by default 3600 s) after it ended, so
    /// a job really gone stays gone; but a stale replica (a follower cut off, or a leader
    /// cut off from its majority, which never steps down) answers from an old state and
    /// does not know newer jobs. 2 minutes is many channel rotations (20 s) to other
    /// replicas.
    #[arg(long, env = "SPUR_OPERATOR_JOB_LOST_AFTER", default_value = "2m", value_parser = parse_duration)]
    pub job_lost_after: Duration,

    /// A SubmitJob unanswered this long is read back (a GetJobs by its name) every this
    /// long while it waits, and the job it carried adopted once it shows up, or `off`.
    /// spurctld commits a submission in milliseconds; one waiting a second has most likely
    /// been applied with its reply lost, which otherwise costs the whole request bound
    /// (5 s) before the retry finds it. A read finding nothing leaves the call waiting, so
    /// no second submission is sent; the cost is one read per second per waiting call.
    #[arg(long, env = "SPUR_OPERATOR_SUBMIT_READ_BACK", default_value = "1s")]
    pub submit_read_back: Bound,

    /// After a SubmitJob that went unanswered (abandoned, timed out, its connection lost),
    /// how long the SpurJob's jobs are read back for a second one carrying its UID, which
    /// is then cancelled. spurctld does not deduplicate, and forwards a write to its leader
    /// with no deadline, so a SubmitJob held by a network cut lands when the cut heals and a
    /// kernel retransmits it: after the cut's whole length plus up to two minutes of
    /// retransmission backoff. 10 minutes outlasts any cut the operator rides out without
    /// losing its nodes (spurctld marks them DOWN after 90 s without a heartbeat); a later
    /// duplicate is still refused and cancelled at launch. `0s`: no watch.
    #[arg(long, env = "SPUR_OPERATOR_DUPLICATE_WATCH", default_value = "10m", value_parser = parse_duration)]
    pub duplicate_watch: Duration,

    /// How often a watched SpurJob's jobs are read (one GetJobs by name). A duplicate that
    /// spurctld can schedule is launched within a second and refused then; this read is
    /// for one waiting in the queue. 30 s: at most 20 reads per watched SpurJob, and only
    /// SpurJobs whose submission went unanswered are watched.
    #[arg(long, env = "SPUR_OPERATOR_DUPLICATE_WATCH_INTERVAL", default_value = "30s", value_parser = parse_duration)]
    pub duplicate_watch_interval: Duration,

    /// After spurctld refused a SpurJob's submission with FAILED_PRECONDITION (a condition
    /// outside the spec, such as a user unknown on the controller's host), how long before
    /// the same spec is tried again. 5 min: an administrator's fix is picked up without a
    /// spec edit, at one call per refused SpurJob per 5 minutes. INVALID_ARGUMENT and
    /// PERMISSION_DENIED wait for a spec change instead.
    #[arg(long, env = "SPUR_OPERATOR_SUBMIT_PRECONDITION_RETRY", default_value = "5m", value_parser = parse_duration)]
    pub submit_precondition_retry: Duration,

    /// How many times a pod's end report refused with "node X is not allocated to job N" is
    /// sent again before it is given up. spurctld answers so while the job is still being
    /// dispatched (PENDING until every node accepted its launch, which takes a second), and
    /// for good once the node left the allocation: 15 tries 2 s apart outlast a dispatch
    /// many times over and end.
    #[arg(
        long,
        env = "SPUR_OPERATOR_REPORT_REFUSAL_RETRIES",
        default_value_t = 15
    )]
    pub report_refusal_retries: u32,

    /// The delay between those tries; also how long a failure policy's restart waits before
    /// it tries again while its job is still being dispatched (it cannot be requeued then).
    #[arg(long, env = "SPUR_OPERATOR_REPORT_REFUSAL_DELAY", default_value = "2s", value_parser = parse_duration)]
    pub report_refusal_delay: Duration,
}
