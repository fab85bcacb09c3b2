//! Mirroring the controller's job state into SpurJob status.
//!
//! The state of every active job is read with one GetJobs per interval for all the jobs
//! this operator tracks, not one GetJob per job: at 10,000 active SpurJobs that is one
//! call every 2 s instead of 5,000 a second.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::Store;
use kube::{Api, ResourceExt};
use serde_json::json;
use spur_proto as pb;

use super::crd::{Condition, SpurJob, SpurJobStatus};
use super::nudge::StatusNudge;
use crate::clock::WallClock;
use crate::controller::ControllerClient;
use crate::events::EventPublisher;
use crate::metrics::Metrics;

pub use spur_names::{INVALID_REASON, LOST_REASON, OWN_ENDS, REFUSED_REASON, is_terminal};

/// The state as status shows it: spurctld's own names (`Running`, `NodeFail`,
/// `OutOfMemory`), which upstream's operator writes too, so `kubectl wait
/// --for=jsonpath='{.status.state}'=Completed` and dashboards written for it match.
pub fn state_name(state: pb::JobState) -> &'static str {
    state.spurctld_name()
}

/// Which of this operator's own ends ([`INVALID_REASON`], [`REFUSED_REASON`],
/// [`LOST_REASON`]) `status` records: as `Failed` with that reason on its `Failed`
/// condition, or as the state itself, as earlier versions wrote it.
pub fn own_end(status: &SpurJobStatus) -> Option<&'static str> {
    let state = status.state.as_deref()?;
    if let Some(earlier) = OWN_ENDS.into_iter().find(|name| *name == state) {
        return Some(earlier);
    }
    if state != state_name(pb::JobState::JobFailed) {
        return None;
    }
    let failed = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Failed" && c.status == "True")?;
    OWN_ENDS.into_iter().find(|name| *name == failed.reason)
}

/// Ends `next` as `Failed` for one of this operator's own reasons: `message` in the status
/// (what a person reads first), `detail` in the `Finished` and `Failed` conditions, and a
/// `Running` condition, where there is one, made False.
pub fn end_here(next: &mut SpurJobStatus, reason: &str, message: &str, detail: &str, now: &str) {
    next.state = Some(state_name(pb::JobState::JobFailed).to_owned());
    next.message = Some(message.to_owned());
    if next.conditions.iter().any(|c| c.type_ == "Running") {
        set_condition(&mut next.conditions, "Running", false, reason, detail, now);
    }
    set_condition(&mut next.conditions, "Finished", true, reason, detail, now);
    set_condition(&mut next.conditions, "Failed", true, reason, detail, now);
}

/// Forgets an end written before the job was submitted (an invalid or refused spec, since
/// edited): its `Finished` and `Failed` conditions speak of no job.
pub fn clear_unsubmitted_end(next: &mut SpurJobStatus) {
    next.conditions
        .retain(|c| !matches!(c.type_.as_str(), "Finished" | "Failed"));
}

/// The node names of `JobInfo.nodelist`, a compressed hostlist (fidelity row 15).
pub fn nodes_of(nodelist: &str) -> Result<Vec<String>, crate::hostlist::HostlistError> {
    crate::hostlist::expand(nodelist)
}

/// Sets a condition, keeping its transition time while its status does not change.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    now: &str,
) {
    let status = if status { "True" } else { "False" };
    let updated = Condition {
        type_: type_.to_owned(),
        status: status.to_owned(),
        reason: reason.to_owned(),
        message: message.to_owned(),
        last_transition_time: Some(now.to_owned()),
    };
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(existing) if existing.status == status => {
            existing.reason = updated.reason;
            existing.message = updated.message;
        }
        Some(existing) => *existing = updated,
        None => conditions.push(updated),
    }
}

/// The status `current` should have given the controller's `info`; `None` when nothing
/// changes (so an unchanged job costs no API write).
pub fn mirrored(current: &SpurJobStatus, info: &pb::JobInfo, now: &str) -> Option<SpurJobStatus> {
    let state = state_name(info.state());
    let mut next = current.clone();
    next.state = Some(state.to_owned());
    // A nodelist that does not parse keeps the nodes last shown rather than showing a
    // wrong list (`poll_once` logs it).
    if let Ok(nodes) = nodes_of(&info.nodelist) {
        next.assigned_nodes = nodes;
    }
    next.start_time = timestamp(info.start_time.as_ref()).or(next.start_time);
    next.end_time = timestamp(info.end_time.as_ref()).or(next.end_time);
    let reason = state_reason(info);
    next.message = (!reason.is_empty()).then(|| reason.to_owned());
    let running = matches!(
        info.state(),
        pb::JobState::JobRunning | pb::JobState::JobCompleting
    );
    set_condition(&mut next.conditions, "Running", running, state, reason, now);
    progress_conditions(current, &mut next, info, now);
    if is_terminal(state) {
        let message = if info.exit_code != 0 {
            format!(
                "exit code {}{}",
                info.exit_code,
                if reason.is_empty() {
                    String::new()
                } else {
                    format!(": {reason}")
                }
            )
        } else {
            reason.to_owned()
        };
        set_condition(&mut next.conditions, "Finished", true, state, &message, now);
        let succeeded = info.state() == pb::JobState::JobCompleted;
        let (kind, detail) = if succeeded {
            ("Succeeded", message.clone())
        } else {
            // The node whose pod failed, when the pod reports told; else the job's nodes.
            let failed_on = super::failure::failed_nodes(&next.node_results);
            let on = if !failed_on.is_empty() {
                format!(" (failed on {})", failed_on.join(","))
            } else if next.assigned_nodes.is_empty() {
                String::new()
            } else {
                format!(" (nodes {})", next.assigned_nodes.join(","))
            };
            ("Failed", format!("{message}{on}").trim().to_owned())
        };
        set_condition(&mut next.conditions, kind, true, state, &detail, now);
        // The exit code is what a person looks for first in a failed job's message.
        next.message = (!message.is_empty()).then_some(message);
    }
    (next != *current).then_some(next)
}

/// spurctld's reason for the job's state, empty where it has none: it says `None` then, as
/// Slurm does, which a person reading the SpurJob would take for a message.
fn state_reason(info: &pb::JobInfo) -> &str {
    match info.state_reason.trim() {
        "None" => "",
        reason => reason,
    }
}

/// The `Queued` condition's message while the job waits for `why`.
pub fn queued_message(why: &str) -> String {
    format!("waiting in spurctld's queue: {why}")
}

/// The conditions of a job's way through spurctld's queue, from `info`:
///
/// - `Queued`: True while it waits (PENDING), with spurctld's reason for waiting
///   (`Resources`, `Priority`, a dependency...); False once it left the queue.
/// - `Scheduled`: True once spurctld allocated it nodes (named in the message); False
///   again when it was put back in the queue.
/// - `Requeued`: True once spurctld put it back after it had started (a node failed, it
///   was preempted), with its reason; `Preempted` when spurctld says it was. Kept True
///   afterwards: its transition time says when it last happened.
fn progress_conditions(
    current: &SpurJobStatus,
    next: &mut SpurJobStatus,
    info: &pb::JobInfo,
    now: &str,
) {
    let state = info.state();
    let reason = state_reason(info);
    let reason = (!reason.is_empty()).then_some(reason);
    let waiting = matches!(state, pb::JobState::JobPending | pb::JobState::JobRequeued);
    set_queued(&mut next.conditions, state, reason, waiting, now);
    let was_started = matches!(
        current.state.as_deref(),
        Some("Running") | Some("Completing") | Some("Suspended")
    );
    let put_back = matches!(
        state,
        pb::JobState::JobPreempted | pb::JobState::JobRequeued
    ) || (waiting && was_started);
    if put_back {
        let kind = if state == pb::JobState::JobPreempted {
            "Preempted"
        } else {
            reason.unwrap_or("Requeued")
        };
        set_condition(
            &mut next.conditions,
            "Requeued",
            true,
            kind,
            &format!(
                "spurctld put the job back in its queue: {}",
                reason.unwrap_or(kind)
            ),
            now,
        );
    }
    set_scheduled(next, waiting, put_back, now);
}

/// `Queued`: True while the job waits in the queue (`waiting`), naming spurctld's `reason`;
/// False, naming its `state`, once it left.
fn set_queued(
    conditions: &mut Vec<Condition>,
    state: pb::JobState,
    reason: Option<&str>,
    waiting: bool,
    now: &str,
) {
    let (queued_reason, queued_message) = if waiting {
        let why = reason.unwrap_or("Pending");
        (why, queued_message(why))
    } else {
        (
            state_name(state),
            format!("left the queue: {}", state_name(state)),
        )
    };
    set_condition(
        conditions,
        "Queued",
        waiting,
        queued_reason,
        &queued_message,
        now,
    );
}

/// `Scheduled`: True once the job, no longer `waiting`, has nodes; False again once it
/// was `put_back` in the queue after being scheduled.
fn set_scheduled(next: &mut SpurJobStatus, waiting: bool, put_back: bool, now: &str) {
    let allocated = !waiting && !next.assigned_nodes.is_empty();
    if allocated {
        set_condition(
            &mut next.conditions,
            "Scheduled",
            true,
            "NodesAllocated",
            &format!("on {}", next.assigned_nodes.join(",")),
            now,
        );
    } else if put_back
        && next
            .conditions
            .iter()
            .any(|c| c.type_ == "Scheduled" && c.status == "True")
    {
        set_condition(
            &mut next.conditions,
            "Scheduled",
            false,
            "Requeued",
            "back in spurctld's queue",
            now,
        );
    }
}

/// `spur_operator_spurjobs`: every SpurJob not being deleted, by namespace and state.
fn count_by_state(store: &Store<SpurJob>, metrics: &Metrics) {
    let mut counts: BTreeMap<(String, String), i64> = BTreeMap::new();
    for job in store.state() {
        if job.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let state = job
            .status
            .as_ref()
            .and_then(|s| s.state.clone())
            .unwrap_or_else(|| "New".to_owned());
        *counts
            .entry((job.namespace().unwrap_or_default(), state))
            .or_default() += 1;
    }
    metrics.spurjobs.clear();
    for ((namespace, state), count) in counts {
        metrics
            .spurjobs
            .get_or_create(&crate::metrics::SpurJobLabels { namespace, state })
            .set(count);
    }
}

/// The GPU-seconds a job that ran from `start` to `end` (RFC 3339) used: its GPUs per node
/// times its nodes times the run time. `None` for an array (its tasks' times are their own)
/// or without both times.
pub fn gpu_seconds(job: &SpurJob, start: Option<&str>, end: Option<&str>) -> Option<f64> {
    if job.spec.array_spec.is_some() {
        return None;
    }
    let gpus = job.spec.gpus.as_ref().map_or(0, |g| g.count);
    let start: k8s_openapi::jiff::Timestamp = start?.parse().ok()?;
    let end: k8s_openapi::jiff::Timestamp = end?.parse().ok()?;
    let seconds = end.duration_since(start).as_secs_f64().max(0.0);
    Some(f64::from(gpus) * f64::from(job.spec.num_nodes) * seconds)
}

/// The GPU-seconds an array SpurJob's tasks used, from `tasks` (jobs of any SpurJob): each
/// of its tasks that ended, with both times, counts its GPUs per node times its nodes times
/// its run time. A task still running or without times counts nothing.
pub fn array_gpu_seconds(job: &SpurJob, tasks: &[pb::JobInfo]) -> f64 {
    let Some(uid) = job.uid() else {
        return 0.0;
    };
    let per_run = job.spec.gpus.as_ref().map_or(0, |g| g.count) * job.spec.num_nodes;
    tasks
        .iter()
        .filter(|t| super::convert::uid_in_comment(&t.comment) == Some(uid.as_str()))
        .filter(|t| is_terminal(state_name(t.state())))
        .filter_map(|t| {
            let (start, end) = (
                instant(t.start_time.as_ref())?,
                instant(t.end_time.as_ref())?,
            );
            Some(end.duration_since(start).as_secs_f64().max(0.0))
        })
        .map(|seconds| f64::from(per_run) * seconds)
        .sum()
}

/// A controller timestamp as RFC 3339; `None` when unset (spurctld leaves zero).
fn timestamp(at: Option<&pb::Timestamp>) -> Option<String> {
    instant(at).map(|t| t.to_string())
}

/// A controller timestamp; `None` when unset (spurctld leaves zero).
pub fn instant(at: Option<&pb::Timestamp>) -> Option<k8s_openapi::jiff::Timestamp> {
    let at = at.filter(|t| t.seconds > 0)?;
    k8s_openapi::jiff::Timestamp::new(at.seconds, at.nanos.clamp(0, 999_999_999)).ok()
}

/// The Event a status change is told with, when its state changed: `(warning, reason,
/// note)`. The reason is the new state; a job's end that is not a success is a Warning.
pub fn state_event(
    before: &SpurJobStatus,
    after: &SpurJobStatus,
    job_id: u32,
) -> Option<(bool, String, String)> {
    let state = after.state.as_deref()?;
    if before.state.as_deref() == Some(state) {
        return None;
    }
    let from = before.state.as_deref().unwrap_or("Submitted");
    let mut note = format!("job {job_id}: {from} -> {state}");
    if !after.assigned_nodes.is_empty() && !is_terminal(state) {
        note.push_str(&format!(" on {}", after.assigned_nodes.join(",")));
    }
    if let Some(message) = after.message.as_deref().filter(|m| !m.is_empty()) {
        note.push_str(&format!(": {message}"));
    }
    let warning = is_terminal(state) && !matches!(state, "Completed" | "Cancelled");
    let warning = warning || matches!(state, "Preempted" | "Requeued");
    // `Lost` says more than `Failed` to whoever reads the Events.
    let reason = own_end(after).unwrap_or(state);
    Some((warning, reason.to_owned(), note))
}

/// The status of a SpurJob whose job spurctld no longer knows; `None` once it is final.
/// Written as `Failed` (reason `Lost`): the job may have succeeded, but nothing says so,
/// and a pipeline waiting for `Completed` must not go on with work whose result is
/// unknown, while one waiting for `Failed` (or either end) must not hang. The other ends
/// would each claim a cause not seen (`NodeFail`, `Cancelled`, `Timeout`).
pub fn lost(current: &SpurJobStatus, job_id: u32, now: &str) -> Option<SpurJobStatus> {
    if current.state.as_deref().is_some_and(is_terminal) {
        return None;
    }
    let last = current.state.as_deref().unwrap_or("unknown");
    let message = format!(
        "spurctld no longer knows job {job_id} (it forgets ended jobs after an hour); its last state seen here was {last}, so how it ended is unknown"
    );
    let mut next = current.clone();
    set_condition(
        &mut next.conditions,
        "Running",
        false,
        LOST_REASON,
        &message,
        now,
    );
    end_here(&mut next, LOST_REASON, &message, &message, now);
    Some(next)
}

/// Task counts by state of an array job: the tasks are the jobs whose comment carries the
/// SpurJob's UID (each task clones the parent's comment, fidelity row 16).
pub fn array_tasks(jobs: &[pb::JobInfo], uid: &str) -> BTreeMap<String, u32> {
    let mut counts = BTreeMap::new();
    for job in jobs {
        if super::convert::uid_in_comment(&job.comment) == Some(uid) {
            *counts
                .entry(state_name(job.state()).to_owned())
                .or_insert(0) += 1;
        }
    }
    counts
}

/// What the poller remembers between rounds: since when each job has been missing from
/// GetJobs. A job is asked about with GetJob only once it has been missing for
/// `lost_after` without a sighting in between: a stale replica (a follower cut off, or a
/// leader cut off from the majority, which never steps down) answers reads from an old
/// state and does not know newer jobs, while a job spurctld really evicted stays missing.
#[derive(Debug)]
pub struct PollMemory {
    missing_since: BTreeMap<u32, tokio::time::Instant>,
    lost_after: Duration,
}

impl PollMemory {
    pub fn new(lost_after: Duration) -> PollMemory {
        PollMemory {
            missing_since: BTreeMap::new(),
            lost_after,
        }
    }

    /// Records a round in which `job_id` was missing at `now`; true once it has been
    /// missing long enough to ask GetJob about it.
    fn missed(&mut self, job_id: u32, now: tokio::time::Instant) -> bool {
        let since = *self.missing_since.entry(job_id).or_insert(now);
        now.saturating_duration_since(since) >= self.lost_after
    }

    fn seen(&mut self, job_id: u32) {
        self.missing_since.remove(&job_id);
    }

    /// Forgets the jobs no longer polled.
    fn retain(&mut self, polled: &[u32]) {
        self.missing_since
            .retain(|id, _| polled.binary_search(id).is_ok());
    }
}

/// The name a SpurJob's job carries at spurctld (as `convert::job_spec` sets it).
pub(crate) fn job_name(job: &SpurJob) -> String {
    job.spec.name.clone().unwrap_or_else(|| job.name_any())
}

/// Writes `status` with a merge patch on the status subresource (no resourceVersion, so
/// no conflict with spec edits; the next round repairs a lost write).
pub async fn patch_status(
    api: &Api<SpurJob>,
    name: &str,
    status: &SpurJobStatus,
) -> Result<(), kube::Error> {
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(status_patch(status)),
    )
    .await
    .map(|_| ())
}

/// The merge patch that writes `status`, all but `nodeResults`: the pod reports write each
/// node's result as its pod ends, and a status computed from a SpurJob read before that
/// would put the earlier run's result back.
fn status_patch(status: &SpurJobStatus) -> serde_json::Value {
    let mut status = serde_json::to_value(status).unwrap_or_default();
    if let Some(fields) = status.as_object_mut() {
        fields.remove("nodeResults");
    }
    json!({ "status": status })
}

/// What the status poller reads from and writes to.
pub struct Poller {
    pub store: Store<SpurJob>,
    pub kube: kube::Client,
    pub controller: ControllerClient,
    pub clock: WallClock,
    pub metrics: Metrics,
    pub events: EventPublisher,
    /// The jobs this operator just changed, read between polls.
    pub nudge: StatusNudge,
}

impl Poller {
    /// Every `interval`, reads the state of all tracked active jobs with one GetJobs and
    /// mirrors what changed; a job missing for `lost_after` is asked about alone. Between
    /// polls, reads the jobs [`StatusNudge`] names as soon as it names them. Runs until
    /// dropped.
    pub async fn run(self, interval: Duration, lost_after: Duration) {
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut memory = PollMemory::new(lost_after);
        loop {
            // Biased: the order of two ready branches must not depend on a random draw,
            // or a seed would not replay.
            tokio::select! {
                biased;
                _ = ticks.tick() => self.poll_once(&mut memory).await,
                changed = self.nudge.next() => self.read_changed(&changed, &mut memory).await,
            }
        }
    }

    /// Reads and mirrors the jobs of `job_ids` (sorted) that are still active, with one
    /// GetJobs. An id no SpurJob tracks may be an array's task (its pods carry the task's
    /// id), so the active arrays are read too. What this misses (a failed read, a job not
    /// in the answer) the next poll finds.
    async fn read_changed(&self, job_ids: &[u32], memory: &mut PollMemory) {
        let all = active_jobs(&self.store);
        // Sorted by id, as active_jobs gives them.
        let tracked = |id: &u32| all.binary_search_by_key(id, |(active, _)| *active).is_ok();
        let tasks_among = job_ids.iter().any(|id| !tracked(id));
        let active: Vec<(u32, Arc<SpurJob>)> = all
            .iter()
            .filter(|(id, job)| {
                job_ids.binary_search(id).is_ok() || (tasks_among && job.spec.array_spec.is_some())
            })
            .cloned()
            .collect();
        if active.is_empty() {
            return;
        }
        // A failed read is said there; the next poll reads these jobs again.
        let _ = self.read_and_mirror(&active, memory).await;
    }

    /// Reads `active` (and its arrays' tasks) with one GetJobs and mirrors the answer: the
    /// time it was mirrored at and which of `active` were answered for, or `None` when the
    /// read failed (said here).
    async fn read_and_mirror(
        &self,
        active: &[(u32, Arc<SpurJob>)],
        memory: &mut PollMemory,
    ) -> Option<(String, Vec<bool>)> {
        let tasks = array_tasks_of(&self.controller, active).await;
        let request = pb::GetJobsRequest {
            job_ids: active.iter().map(|(id, _)| *id).collect(),
            ..Default::default()
        };
        let answer = match self.controller.get_jobs(request).await {
            Ok(answer) => answer,
            Err(e) => {
                tracing::warn!(error = %e, jobs = active.len(), "could not read job states; trying again next round");
                return None;
            }
        };
        let now = self.clock.timestamp().to_string();
        let answered = self
            .mirror_answer(active, answer.jobs, tasks.as_deref(), &now, memory)
            .await;
        Some((now, answered))
    }

    /// One round: counts the SpurJobs by state, reads every active job's state (and every
    /// array's tasks) and writes what changed.
    pub async fn poll_once(&self, memory: &mut PollMemory) {
        count_by_state(&self.store, &self.metrics);
        let active = active_jobs(&self.store);
        let job_ids: Vec<u32> = active.iter().map(|(id, _)| *id).collect();
        memory.retain(&job_ids);
        if active.is_empty() {
            return;
        }
        let Some((now, answered)) = self.read_and_mirror(&active, memory).await else {
            return;
        };
        self.ask_about_missing(&active, &answered, &now, memory)
            .await;
    }

    /// Mirrors each job of GetJobs' answer, `infos`, into every SpurJob of `active` tracking
    /// it; an array's from its `tasks` too. Whether each of `active` was answered for.
    async fn mirror_answer(
        &self,
        active: &[(u32, Arc<SpurJob>)],
        mut infos: Vec<pb::JobInfo>,
        tasks: Option<&[pb::JobInfo]>,
        now: &str,
        memory: &mut PollMemory,
    ) -> Vec<bool> {
        let mut answered = vec![false; active.len()];
        infos.sort_by_key(|info| info.job_id);
        infos.dedup_by_key(|info| info.job_id);
        for info in infos {
            // Every SpurJob tracking this id (there should be one), sorted by id.
            let first = active.partition_point(|(id, _)| *id < info.job_id);
            for (i, (id, job)) in active.iter().enumerate().skip(first) {
                if *id != info.job_id {
                    break;
                }
                answered[i] = true;
                memory.seen(info.job_id);
                if let Err(e) = nodes_of(&info.nodelist) {
                    tracing::warn!(spurjob = %job.name_any(), job_id = info.job_id, nodelist = %info.nodelist, error = %e, "spurctld's nodelist does not parse; the nodes shown are left as they were");
                }
                let current = job.status.clone().unwrap_or_default();
                let mut next = mirrored(&current, &info, now).unwrap_or_else(|| current.clone());
                let mut used = None;
                if job.spec.array_spec.is_some()
                    && let Some(tasks) = tasks
                {
                    next.array_tasks = array_tasks(tasks, &job.uid().unwrap_or_default());
                    used = Some(array_gpu_seconds(job, tasks));
                }
                if next != current {
                    let written = Written {
                        job_id: info.job_id,
                        gpu_seconds: used,
                    };
                    self.write(job, &next, written).await;
                }
            }
        }
        answered
    }

    /// Missing from GetJobs: ended and evicted long ago, or not yet visible through a
    /// lagging follower. Asked about once missing for a while; NOT_FOUND is final.
    async fn ask_about_missing(
        &self,
        active: &[(u32, Arc<SpurJob>)],
        answered: &[bool],
        now: &str,
        memory: &mut PollMemory,
    ) {
        for (i, (job_id, job)) in active.iter().enumerate() {
            if answered[i] || !memory.missed(*job_id, tokio::time::Instant::now()) {
                continue;
            }
            match self.controller.get_job(*job_id).await {
                Err(e) if e.code() == tonic::Code::NotFound => {
                    let current = job.status.clone().unwrap_or_default();
                    if let Some(next) = lost(&current, *job_id, now) {
                        let written = Written {
                            job_id: *job_id,
                            gpu_seconds: None,
                        };
                        self.write(job, &next, written).await;
                    }
                }
                Ok(info) if info.job_id == *job_id => {
                    memory.seen(*job_id);
                    let current = job.status.clone().unwrap_or_default();
                    if let Some(next) = mirrored(&current, &info, now) {
                        let written = Written {
                            job_id: *job_id,
                            gpu_seconds: None,
                        };
                        self.write(job, &next, written).await;
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(spurjob = %job.name_any(), job_id, error = %e, "could not read a job missing from GetJobs; trying again next round");
                }
            }
        }
    }
}

/// The SpurJobs whose jobs are still active, by job id. The store iterates in no fixed
/// order; sorted so calls and writes are reproducible.
fn active_jobs(store: &Store<SpurJob>) -> Vec<(u32, Arc<SpurJob>)> {
    let mut active: Vec<(u32, Arc<SpurJob>)> = store
        .state()
        .into_iter()
        .filter(|job| job.metadata.deletion_timestamp.is_none())
        .filter_map(|job| {
            let status = job.status.as_ref()?;
            let id = status.spur_job_id?;
            let done = status.state.as_deref().is_some_and(is_terminal);
            (!done).then_some((id, job))
        })
        .collect();
    active.sort_by(|a, b| {
        a.0.cmp(&b.0)
            .then_with(|| a.1.name_any().cmp(&b.1.name_any()))
    });
    active
}

/// The tasks of the arrays among `active`, read by name; `None` when there are none or
/// the read failed. An array's parent id has no record of its own: GetJobs answers for it
/// with the tasks' aggregate, and the tasks themselves are found by name and UID.
async fn array_tasks_of(
    controller: &ControllerClient,
    active: &[(u32, Arc<SpurJob>)],
) -> Option<Vec<pb::JobInfo>> {
    let arrays: Vec<&Arc<SpurJob>> = active
        .iter()
        .map(|(_, job)| job)
        .filter(|job| job.spec.array_spec.is_some())
        .collect();
    if arrays.is_empty() {
        return None;
    }
    let mut names: Vec<String> = arrays.iter().map(|job| job_name(job)).collect();
    names.sort();
    names.dedup();
    match controller
        .get_jobs(pb::GetJobsRequest {
            name: names.join(","),
            ..Default::default()
        })
        .await
    {
        Ok(answer) => Some(answer.jobs),
        Err(e) => {
            tracing::warn!(error = %e, "could not read array tasks; trying again next round");
            None
        }
    }
}

/// The job-level metrics of a status change: its start lag when it starts running, its
/// GPU-seconds when it ends (an array's, `array_used`, summed over its tasks).
fn record_transition(
    job: &SpurJob,
    before: &SpurJobStatus,
    after: &SpurJobStatus,
    array_used: Option<f64>,
    clock: &WallClock,
    metrics: &Metrics,
) {
    let was = before.state.as_deref();
    let now = after.state.as_deref();
    if now == Some("Running")
        && was != Some("Running")
        && let Some(created) = &job.metadata.creation_timestamp
    {
        let lag = clock.timestamp().duration_since(created.0).as_secs_f64();
        metrics.start_lag_seconds.observe(lag.max(0.0));
    }
    let ended = now.is_some_and(is_terminal) && !was.is_some_and(is_terminal);
    if ended
        && let Some(used) = array_used
            .or_else(|| gpu_seconds(job, after.start_time.as_deref(), after.end_time.as_deref()))
        && used > 0.0
    {
        metrics
            .gpu_seconds
            .get_or_create(&crate::metrics::NamespaceLabels {
                namespace: job.namespace().unwrap_or_default(),
            })
            .inc_by(used);
    }
}

/// What a status write is about besides the status itself.
struct Written {
    job_id: u32,
    /// For an array, the GPU-seconds its tasks used ([`array_gpu_seconds`]); a single job's
    /// come from its own times.
    gpu_seconds: Option<f64>,
}

impl Poller {
    /// Writes `next` as `job`'s status, then counts and tells what changed.
    async fn write(&self, job: &SpurJob, next: &SpurJobStatus, written: Written) {
        let Written {
            job_id,
            gpu_seconds: array_used,
        } = written;
        let api: Api<SpurJob> =
            Api::namespaced(self.kube.clone(), &job.namespace().unwrap_or_default());
        match patch_status(&api, &job.name_any(), next).await {
            Ok(()) => {
                tracing::info!(spurjob = %job.name_any(), job_id, state = ?next.state, "mirrored the job's state");
                let before = job.status.clone().unwrap_or_default();
                record_transition(job, &before, next, array_used, &self.clock, &self.metrics);
                if let Some((warning, reason, note)) = state_event(&before, next, job_id) {
                    if warning {
                        self.events.warning(job, &reason, &note).await;
                    } else {
                        self.events.normal(job, &reason, &note).await;
                    }
                }
            }
            Err(e) => {
                self.metrics.reconcile_error("spurjob", "status_patch");
                tracing::warn!(spurjob = %job.name_any(), error = %e, "could not write status; next round tries again");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_write_leaves_the_node_results_the_pod_reports_wrote() {
        let read_before = SpurJobStatus {
            state: Some("Running".into()),
            node_results: [(
                "node-0".to_owned(),
                crate::jobs::crd::NodeResult {
                    pod: "spur-job-1-0".into(),
                    result: "Stopped".into(),
                    run_attempt: 1,
                    ..Default::default()
                },
            )]
            .into(),
            ..Default::default()
        };
        let reported = json!({ "pod": "spur-job-1-0-r2", "runAttempt": 2, "result": "Succeeded" });
        let mut job = json!({ "status": { "nodeResults": { "node-0": reported.clone() } } });
        json_patch::merge(&mut job, &status_patch(&read_before));
        assert_eq!(job["status"]["nodeResults"]["node-0"], reported);
        assert_eq!(job["status"]["state"], "Running");
    }

    fn info(state: pb::JobState, nodes: &str, reason: &str, exit: i32) -> pb::JobInfo {
        pb::JobInfo {
            job_id: 4,
            state: state as i32,
            nodelist: nodes.into(),
            state_reason: reason.into(),
            exit_code: exit,
            ..Default::default()
        }
    }

    #[test]
    fn spurctlds_none_reason_is_no_message_on_the_status_or_its_conditions() {
        let running = SpurJobStatus {
            state: Some("Running".into()),
            spur_job_id: Some(4),
            ..Default::default()
        };
        let done = info(pb::JobState::JobCompleted, "node-0", "None", 0);
        let next = mirrored(&running, &done, "t1").expect("a change");
        assert_eq!(next.message, None);
        let with_none: Vec<_> = next
            .conditions
            .iter()
            .filter(|c| c.message.contains("None"))
            .map(|c| c.type_.as_str())
            .collect();
        assert!(
            with_none.is_empty(),
            "conditions saying None: {with_none:?}"
        );
        let failed = info(pb::JobState::JobFailed, "node-0", "None", 3);
        let next = mirrored(&running, &failed, "t1").expect("a change");
        assert_eq!(next.message.as_deref(), Some("exit code 3"));
    }

    #[test]
    fn a_job_spurctld_forgot_is_lost_once_with_its_last_state_named() {
        let running = SpurJobStatus {
            state: Some("Running".into()),
            spur_job_id: Some(4),
            ..Default::default()
        };
        let lost_one = lost(&running, 4, "t1").expect("a change");
        assert_eq!(
            lost_one.state.as_deref(),
            Some("Failed"),
            "upstream's name; the reason says Lost"
        );
        assert_eq!(own_end(&lost_one), Some(LOST_REASON));
        assert_eq!(lost_one.spur_job_id, Some(4));
        let message = lost_one.message.as_deref().unwrap();
        assert!(message.contains("job 4"), "{message}");
        assert!(
            message.contains("last state seen here was Running"),
            "{message}"
        );
        let conditions: Vec<_> = lost_one
            .conditions
            .iter()
            .map(|c| (c.type_.as_str(), c.status.as_str(), c.reason.as_str()))
            .collect();
        assert_eq!(
            conditions,
            [
                ("Running", "False", LOST_REASON),
                ("Finished", "True", LOST_REASON),
                ("Failed", "True", LOST_REASON)
            ]
        );
        // Already lost: nothing to write, however often it is asked again.
        assert_eq!(lost(&lost_one, 4, "t2"), None);
        // A SpurJob never seen in any state says so.
        let never = lost(&SpurJobStatus::default(), 9, "t1").unwrap();
        assert!(never.message.unwrap().contains("was unknown"));
    }

    #[test]
    fn mirrors_state_nodes_and_conditions() {
        let pending = SpurJobStatus {
            state: Some("Pending".into()),
            spur_job_id: Some(4),
            ..Default::default()
        };
        let running = mirrored(
            &pending,
            &info(pb::JobState::JobRunning, "a, b", "None", 0),
            "t1",
        )
        .unwrap();
        assert_eq!(running.state.as_deref(), Some("Running"));
        assert_eq!(running.assigned_nodes, ["a", "b"]);
        assert_eq!(running.message, None);
        assert_eq!(running.spur_job_id, Some(4));
        let cond = &running.conditions[0];
        assert_eq!(
            (cond.type_.as_str(), cond.status.as_str()),
            ("Running", "True")
        );

        // Nothing new: no write.
        assert_eq!(
            mirrored(
                &running,
                &info(pb::JobState::JobRunning, "a,b", "None", 0),
                "t2"
            ),
            None
        );

        let failed = mirrored(
            &running,
            &info(pb::JobState::JobFailed, "a,b", "OOMKilled", 137),
            "t3",
        )
        .unwrap();
        assert_eq!(failed.state.as_deref(), Some("Failed"));
        assert_eq!(failed.message.as_deref(), Some("exit code 137: OOMKilled"));
        let finished = failed
            .conditions
            .iter()
            .find(|c| c.type_ == "Finished")
            .unwrap();
        assert_eq!(finished.message, "exit code 137: OOMKilled");
        let running_cond = failed
            .conditions
            .iter()
            .find(|c| c.type_ == "Running")
            .unwrap();
        assert_eq!(running_cond.status, "False");
        assert_eq!(running_cond.last_transition_time.as_deref(), Some("t3"));
    }

    fn condition<'a>(
        status: &'a SpurJobStatus,
        type_: &str,
    ) -> Option<(&'a str, &'a str, &'a str)> {
        status
            .conditions
            .iter()
            .find(|c| c.type_ == type_)
            .map(|c| (c.status.as_str(), c.reason.as_str(), c.message.as_str()))
    }

    #[test]
    fn a_job_queued_scheduled_requeued_and_failed_shows_each_step_as_a_condition() {
        let submitted = SpurJobStatus {
            state: Some("Pending".into()),
            spur_job_id: Some(4),
            ..Default::default()
        };
        let waiting = mirrored(
            &submitted,
            &info(pb::JobState::JobPending, "", "Resources", 0),
            "t1",
        )
        .unwrap();
        assert_eq!(
            condition(&waiting, "Queued"),
            Some((
                "True",
                "Resources",
                "waiting in spurctld's queue: Resources"
            ))
        );
        assert_eq!(condition(&waiting, "Scheduled"), None);

        let running = mirrored(
            &waiting,
            &info(pb::JobState::JobRunning, "gpu-[1-2]", "None", 0),
            "t2",
        )
        .unwrap();
        assert_eq!(
            condition(&running, "Queued"),
            Some(("False", "Running", "left the queue: Running"))
        );
        assert_eq!(
            condition(&running, "Scheduled"),
            Some(("True", "NodesAllocated", "on gpu-1,gpu-2"))
        );
        assert_eq!(condition(&running, "Requeued"), None);

        // A node failed under it: spurctld puts it back in the queue.
        let requeued = mirrored(
            &running,
            &info(pb::JobState::JobPending, "", "NodeFail", 0),
            "t3",
        )
        .unwrap();
        assert_eq!(
            condition(&requeued, "Requeued"),
            Some((
                "True",
                "NodeFail",
                "spurctld put the job back in its queue: NodeFail"
            ))
        );
        assert_eq!(
            condition(&requeued, "Scheduled"),
            Some(("False", "Requeued", "back in spurctld's queue"))
        );
        assert_eq!(condition(&requeued, "Queued").map(|c| c.0), Some("True"));

        let again = mirrored(
            &requeued,
            &info(pb::JobState::JobRunning, "gpu-3", "None", 0),
            "t4",
        )
        .unwrap();
        assert_eq!(condition(&again, "Scheduled").map(|c| c.0), Some("True"));
        // Kept, with when it last happened.
        let kept = again
            .conditions
            .iter()
            .find(|c| c.type_ == "Requeued")
            .unwrap();
        assert_eq!(
            (kept.status.as_str(), kept.last_transition_time.as_deref()),
            ("True", Some("t3"))
        );

        let failed = mirrored(
            &again,
            &info(pb::JobState::JobFailed, "gpu-3", "NonZeroExitCode", 3),
            "t5",
        )
        .unwrap();
        assert_eq!(
            condition(&failed, "Failed"),
            Some((
                "True",
                "Failed",
                "exit code 3: NonZeroExitCode (nodes gpu-3)"
            ))
        );
        assert_eq!(condition(&failed, "Succeeded"), None);
        // Once the pod reports told which node's pod failed, the condition names it.
        let mut reported = again.clone();
        reported.assigned_nodes = vec!["gpu-1".into(), "gpu-2".into()];
        for (node, result) in [("gpu-1", "Stopped"), ("gpu-2", "Failed")] {
            reported.node_results.insert(
                node.into(),
                crate::jobs::crd::NodeResult {
                    pod: format!("pod-{node}"),
                    result: result.into(),
                    ..Default::default()
                },
            );
        }
        let failed_on = mirrored(
            &reported,
            &info(pb::JobState::JobFailed, "gpu-[1-2]", "NonZeroExitCode", 3),
            "t5",
        )
        .unwrap();
        assert_eq!(
            condition(&failed_on, "Failed").map(|c| c.2),
            Some("exit code 3: NonZeroExitCode (failed on gpu-2)")
        );

        let preempted = mirrored(
            &running,
            &info(pb::JobState::JobPreempted, "gpu-[1-2]", "", 0),
            "t6",
        )
        .unwrap();
        assert_eq!(
            condition(&preempted, "Requeued").map(|c| c.1),
            Some("Preempted")
        );

        let done = mirrored(
            &running,
            &info(pb::JobState::JobCompleted, "gpu-[1-2]", "None", 0),
            "t7",
        )
        .unwrap();
        assert_eq!(condition(&done, "Succeeded").map(|c| c.0), Some("True"));
        assert_eq!(condition(&done, "Failed"), None);
    }

    #[test]
    fn each_state_change_is_one_event_and_an_unsuccessful_end_a_warning() {
        let status = |state: Option<&str>, nodes: &[&str], message: Option<&str>| SpurJobStatus {
            state: state.map(str::to_owned),
            assigned_nodes: nodes.iter().map(|n| (*n).to_owned()).collect(),
            message: message.map(str::to_owned),
            ..SpurJobStatus::default()
        };
        let event = |warning: bool, reason: &str, note: &str| {
            Some((warning, reason.to_owned(), note.to_owned()))
        };
        let table = [
            (
                status(None, &[], None),
                status(Some("Pending"), &[], Some("Priority")),
                event(false, "Pending", "job 7: Submitted -> Pending: Priority"),
            ),
            (
                status(Some("Pending"), &[], None),
                status(Some("Running"), &["gpu-1", "gpu-2"], None),
                event(false, "Running", "job 7: Pending -> Running on gpu-1,gpu-2"),
            ),
            (
                status(Some("Running"), &["gpu-1"], None),
                status(Some("Running"), &["gpu-1"], Some("new words")),
                None,
            ),
            (
                status(Some("Running"), &["gpu-1"], None),
                status(Some("Completed"), &["gpu-1"], None),
                event(false, "Completed", "job 7: Running -> Completed"),
            ),
            (
                status(Some("Running"), &["gpu-1"], None),
                status(Some("Failed"), &["gpu-1"], Some("exit code 3")),
                event(true, "Failed", "job 7: Running -> Failed: exit code 3"),
            ),
            (
                status(Some("Running"), &[], None),
                status(Some("OutOfMemory"), &[], Some("OutOfMemory")),
                event(
                    true,
                    "OutOfMemory",
                    "job 7: Running -> OutOfMemory: OutOfMemory",
                ),
            ),
            (
                status(Some("Running"), &[], None),
                status(Some("Requeued"), &[], None),
                event(true, "Requeued", "job 7: Running -> Requeued"),
            ),
            (
                status(Some("Running"), &[], None),
                status(Some("Cancelled"), &[], None),
                event(false, "Cancelled", "job 7: Running -> Cancelled"),
            ),
        ];
        for (before, after, expected) in table {
            assert_eq!(state_event(&before, &after, 7), expected, "{after:?}");
        }
    }

    #[test]
    fn gpu_seconds_are_gpus_per_node_times_nodes_times_the_run() {
        let job = |gpus: Option<u32>, nodes: u32, array: bool| {
            let mut job = SpurJob::new(
                "j",
                crate::jobs::crd::SpurJobSpec {
                    image: "x".into(),
                    gpus: gpus.map(|count| crate::jobs::crd::GpuSpec {
                        count,
                        gpu_type: None,
                    }),
                    num_nodes: nodes,
                    array_spec: array.then(|| "0-3".to_owned()),
                    ..Default::default()
                },
            );
            job.metadata.namespace = Some("ml".into());
            job
        };
        let (start, end) = (Some("2026-01-01T00:00:00Z"), Some("2026-01-01T00:10:00Z"));
        assert_eq!(
            gpu_seconds(&job(Some(8), 2, false), start, end),
            Some(9600.0)
        );
        assert_eq!(gpu_seconds(&job(None, 1, false), start, end), Some(0.0));
        assert_eq!(gpu_seconds(&job(Some(8), 1, true), start, end), None);
        assert_eq!(gpu_seconds(&job(Some(8), 1, false), start, None), None);
        assert_eq!(
            gpu_seconds(&job(Some(8), 1, false), Some("soon"), end),
            None
        );
        // A clock step backwards never counts negative time.
        assert_eq!(gpu_seconds(&job(Some(8), 1, false), end, start), Some(0.0));
    }

    #[test]
    fn an_arrays_gpu_seconds_are_the_sum_over_its_ended_tasks() {
        let mut job = SpurJob::new(
            "sweep",
            crate::jobs::crd::SpurJobSpec {
                image: "x".into(),
                gpus: Some(crate::jobs::crd::GpuSpec {
                    count: 2,
                    gpu_type: None,
                }),
                num_nodes: 2,
                array_spec: Some("0-3".into()),
                ..Default::default()
            },
        );
        job.metadata.uid = Some("u1".into());
        let at = |seconds: i64| Some(pb::Timestamp { seconds, nanos: 0 });
        let task = |uid: &str, state: pb::JobState, start: i64, end: i64| pb::JobInfo {
            state: state as i32,
            comment: format!("spurjob-uid={uid}"),
            start_time: (start > 0).then(|| at(start)).flatten(),
            end_time: (end > 0).then(|| at(end)).flatten(),
            ..Default::default()
        };
        let base = 1_764_000_000;
        let tasks = [
            task("u1", pb::JobState::JobCompleted, base, base + 100),
            task("u1", pb::JobState::JobFailed, base, base + 10),
            // Still running, or never started: nothing yet.
            task("u1", pb::JobState::JobRunning, base, 0),
            task("u1", pb::JobState::JobCancelled, 0, base + 5),
            // Another SpurJob's task.
            task("u2", pb::JobState::JobCompleted, base, base + 1000),
        ];
        // 2 GPUs per node x 2 nodes x (100 s + 10 s).
        assert_eq!(array_gpu_seconds(&job, &tasks), 440.0);
        assert_eq!(array_gpu_seconds(&job, &[]), 0.0);
    }

    #[test]
    fn start_and_end_times_are_mirrored_once_spurctld_has_them() {
        let mut running = info(pb::JobState::JobRunning, "n1", "", 0);
        running.start_time = Some(pb::Timestamp {
            seconds: 1_764_000_000,
            nanos: 0,
        });
        let next = mirrored(&SpurJobStatus::default(), &running, "now").unwrap();
        assert_eq!(next.start_time.as_deref(), Some("2025-11-24T16:00:00Z"));
        assert_eq!(next.end_time, None);
        let mut done = info(pb::JobState::JobCompleted, "n1", "", 0);
        done.end_time = Some(pb::Timestamp {
            seconds: 1_764_000_600,
            nanos: 0,
        });
        // A later answer without the start keeps it.
        let next = mirrored(&next, &done, "now").unwrap();
        assert_eq!(next.start_time.as_deref(), Some("2025-11-24T16:00:00Z"));
        assert_eq!(next.end_time.as_deref(), Some("2025-11-24T16:10:00Z"));
    }

    #[test]
    fn terminal_states_in_upstreams_names_and_in_the_names_earlier_versions_wrote() {
        let terminal = [
            pb::JobState::JobCompleted,
            pb::JobState::JobFailed,
            pb::JobState::JobCancelled,
            pb::JobState::JobTimeout,
            pb::JobState::JobNodeFail,
            pb::JobState::JobDeadline,
            pb::JobState::JobOutOfMemory,
        ];
        for state in terminal {
            assert!(is_terminal(state_name(state)), "{state:?}");
            // `JOB_NODE_FAIL` → `NODE_FAIL`, as earlier versions wrote it.
            let earlier = state.as_str_name().trim_start_matches("JOB_");
            assert!(is_terminal(earlier), "{earlier}");
        }
        // Our own ends, as earlier versions wrote them in the state.
        for earlier in [INVALID_REASON, REFUSED_REASON, LOST_REASON] {
            assert!(is_terminal(earlier), "{earlier}");
        }
        for state in [
            pb::JobState::JobPending,
            pb::JobState::JobRunning,
            pb::JobState::JobCompleting,
            pb::JobState::JobSuspended,
            pb::JobState::JobRequeued,
            pb::JobState::JobPreempted,
        ] {
            assert!(!is_terminal(state_name(state)), "{state:?}");
        }
        // Upstream's spelling, which `kubectl wait` and dashboards match.
        assert_eq!(state_name(pb::JobState::JobNodeFail), "NodeFail");
        assert_eq!(state_name(pb::JobState::JobOutOfMemory), "OutOfMemory");
        assert_eq!(state_name(pb::JobState::JobCompleted), "Completed");
    }

    #[test]
    fn nodelists_are_expanded_and_a_bad_one_keeps_the_nodes_shown() {
        let pending = SpurJobStatus {
            state: Some("Pending".into()),
            ..Default::default()
        };
        let table: &[(&str, &[&str])] = &[
            (
                "node[001-003,005]",
                &["node001", "node002", "node003", "node005"],
            ),
            ("gpu-node-[1-2]", &["gpu-node-1", "gpu-node-2"]),
            ("a,b", &["a", "b"]),
            ("solo", &["solo"]),
            ("", &[]),
        ];
        for (nodelist, nodes) in table {
            let next = mirrored(
                &pending,
                &info(pb::JobState::JobRunning, nodelist, "", 0),
                "t",
            )
            .unwrap();
            assert_eq!(next.assigned_nodes, *nodes, "{nodelist}");
        }
        let running = mirrored(&pending, &info(pb::JobState::JobRunning, "a", "", 0), "t").unwrap();
        let next = mirrored(
            &running,
            &info(pb::JobState::JobRunning, "a[1-", "", 0),
            "t",
        );
        assert_eq!(next.map(|n| n.assigned_nodes), None, "nothing changes");
    }

    #[test]
    fn a_preempted_or_requeued_job_is_not_finished_and_comes_back_pending() {
        let running = mirrored(
            &SpurJobStatus::default(),
            &info(pb::JobState::JobRunning, "a", "", 0),
            "t1",
        )
        .unwrap();
        for state in [pb::JobState::JobPreempted, pb::JobState::JobRequeued] {
            let next = mirrored(&running, &info(state, "", "Preempted", 0), "t2").unwrap();
            assert!(!is_terminal(next.state.as_deref().unwrap()));
            assert!(
                next.conditions.iter().all(|c| c.type_ != "Finished"),
                "{state:?}"
            );
            assert!(next.assigned_nodes.is_empty());
            let back = mirrored(
                &next,
                &info(pb::JobState::JobPending, "", "Priority", 0),
                "t3",
            )
            .unwrap();
            assert_eq!(back.state.as_deref(), Some("Pending"));
        }
    }

    #[test]
    fn a_job_spurctld_forgot_is_lost_once() {
        let running = SpurJobStatus {
            state: Some("Running".into()),
            spur_job_id: Some(4),
            ..Default::default()
        };
        let lost_status = lost(&running, 4, "t").unwrap();
        assert_eq!(lost_status.state.as_deref(), Some("Failed"));
        let message = lost_status.message.as_deref().unwrap();
        assert!(
            message.contains("job 4") && message.contains("Running"),
            "{message}"
        );
        let finished = lost_status
            .conditions
            .iter()
            .find(|c| c.type_ == "Finished")
            .unwrap();
        assert_eq!(
            (finished.status.as_str(), finished.reason.as_str()),
            ("True", LOST_REASON)
        );
        assert_eq!(lost(&lost_status, 4, "t2"), None);
    }

    #[test]
    fn our_own_ends_are_written_failed_with_the_reason_and_read_back_in_either_form() {
        let upstreams = [
            "Pending",
            "Running",
            "Completing",
            "Completed",
            "Failed",
            "Cancelled",
            "Timeout",
            "NodeFail",
            "OutOfMemory",
        ];
        for reason in [INVALID_REASON, REFUSED_REASON, LOST_REASON] {
            let mut next = SpurJobStatus::default();
            end_here(&mut next, reason, "why", "detail", "t");
            let state = next.state.as_deref().unwrap();
            assert!(upstreams.contains(&state), "{reason}: {state}");
            assert!(is_terminal(state));
            assert_eq!(own_end(&next), Some(reason));
            assert_eq!(next.message.as_deref(), Some("why"));
            let failed = next
                .conditions
                .iter()
                .find(|c| c.type_ == "Failed")
                .unwrap();
            assert_eq!(
                (failed.reason.as_str(), failed.message.as_str()),
                (reason, "detail")
            );
            // As an earlier version wrote it: the reason as the state.
            let earlier = SpurJobStatus {
                state: Some(reason.into()),
                ..Default::default()
            };
            assert_eq!(own_end(&earlier), Some(reason));
            // An edit that resubmits forgets it.
            clear_unsubmitted_end(&mut next);
            next.state = Some("Pending".into());
            assert_eq!(own_end(&next), None);
            assert!(next.conditions.is_empty());
        }
        // spurctld's own Failed is not ours.
        let theirs = mirrored(
            &SpurJobStatus::default(),
            &info(pb::JobState::JobFailed, "n1", "NonZeroExitCode", 1),
            "t",
        )
        .unwrap();
        assert_eq!(own_end(&theirs), None);
        // The Event of a lost job names it so.
        let running = SpurJobStatus {
            state: Some("Running".into()),
            ..Default::default()
        };
        let lost_one = lost(&running, 4, "t").unwrap();
        let (warning, reason, _) = state_event(&running, &lost_one, 4).unwrap();
        assert!(warning);
        assert_eq!(reason, LOST_REASON);
    }

    #[test]
    fn array_tasks_are_counted_by_state_for_their_spurjob_only() {
        let task = |id: u32, state: pb::JobState, uid: &str| pb::JobInfo {
            job_id: id,
            state: state as i32,
            comment: format!("spurjob-uid={uid}"),
            ..Default::default()
        };
        let jobs = [
            task(11, pb::JobState::JobRunning, "u1"),
            task(12, pb::JobState::JobRunning, "u1"),
            task(13, pb::JobState::JobPending, "u1"),
            task(14, pb::JobState::JobCompleted, "u1"),
            task(21, pb::JobState::JobRunning, "u2"),
            pb::JobInfo {
                job_id: 30,
                ..Default::default()
            },
        ];
        let counts = array_tasks(&jobs, "u1");
        assert_eq!(
            counts.into_iter().collect::<Vec<_>>(),
            [
                ("Completed".into(), 1),
                ("Pending".into(), 1),
                ("Running".into(), 2)
            ]
        );
        assert!(array_tasks(&jobs, "u3").is_empty());
    }

    #[test]
    fn a_job_is_asked_about_only_after_missing_for_the_whole_lost_after() {
        let start = tokio::time::Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        let mut memory = PollMemory::new(Duration::from_secs(120));
        assert!(!memory.missed(4, at(0)));
        assert!(!memory.missed(4, at(119)));
        memory.seen(4);
        assert!(
            !memory.missed(4, at(120)),
            "seen in between: counting starts again"
        );
        assert!(!memory.missed(4, at(239)));
        assert!(memory.missed(4, at(240)));
        memory.retain(&[5]);
        assert!(
            !memory.missed(4, at(241)),
            "forgotten once no longer polled"
        );
    }
}
