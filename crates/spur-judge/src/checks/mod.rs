//! The checks of sim.md, judged against the world's ground truth (the API server's objects
//! and the controller's replicated log), never against the operator's own state or logs.
//! Who acts is the replica the operator Lease names as the API server applied it; its
//! writes are judged by [`acting`].

pub mod acting;
pub mod readiness;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use spur_names::{is_terminal, uid_in_comment};

use crate::hosts::OPERATOR_LEASE;
use crate::records::SpurJobView;

use acting::ActingCheck;

/// The liveness deadlines, in simulated time.
#[derive(Clone, Copy, Debug)]
pub struct Deadlines {
    pub registration: Duration,
    pub submission: Duration,
    pub status: Duration,
    pub deletion: Duration,
    pub readiness: Duration,
    /// A registered node the controller leader holds DOWN after the world has been healthy
    /// this long (a leader with a quorum, an operator that acts and reaches an endpoint):
    /// spurctld marks a node DOWN after its heartbeat timeout (90 s) without a heartbeat,
    /// and the operator sends one each heartbeat interval (30 s), so a world healthy for
    /// both has had a full timeout of heartbeat rounds. The cut leader of
    /// `sim/tests/simulated/cut_replica.rs` (and the lab's `leader-cut-idle`) is what it catches: an
    /// operator whose heartbeats all go to a leader cut off from its peers.
    pub node_liveness: Duration,
    /// With the API server up, some live operator replica holds the Lease within this of
    /// the last holder going away: the lease duration (15 s) a standby waits from first
    /// seeing the last renewal, plus a retry period (5 s) before it saw it and one more
    /// before its next attempt.
    pub takeover: Duration,
}

impl Default for Deadlines {
    fn default() -> Self {
        Self {
            registration: Duration::from_secs(15),
            submission: Duration::from_secs(20),
            status: Duration::from_secs(15),
            deletion: Duration::from_secs(20),
            readiness: Duration::from_secs(15),
            node_liveness: Duration::from_secs(120),
            takeover: Duration::from_secs(25),
        }
    }
}

/// A violated check: which, on what, when.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub check: &'static str,
    pub object: String,
    pub at: Duration,
    pub detail: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {} at {:.1}s: {}",
            self.check,
            self.object,
            self.at.as_secs_f64(),
            self.detail
        )
    }
}

#[derive(Default)]
struct NodeWatch {
    exists_since: Duration,
    registered: bool,
    flagged: bool,
    /// Since when the leader has held it DOWN, while registered.
    down_since: Option<Duration>,
    down_flagged: bool,
}

#[derive(Default)]
struct JobWatch {
    created_at: Duration,
    id: Option<u32>,
    /// When the SpurJob's id was first seen, until the controller showed that job.
    id_unconfirmed_since: Option<Duration>,
    submission_flagged: bool,
    terminal: Option<(Duration, &'static str)>,
    status_done: bool,
    status_flagged: bool,
    deleted_at: Option<Duration>,
    /// When a new leader was elected while this job still waited for its id.
    waiting_at_election: Option<Duration>,
    deletion_done: bool,
    deletion_flagged: bool,
}

/// Lags measured, in milliseconds.
#[derive(Clone, Debug, Default)]
pub struct Lags {
    pub registration: Vec<u64>,
    pub submission: Vec<u64>,
    pub status: Vec<u64>,
    /// From a new leader's election (or the world being whole again after it) to the
    /// spurJobId of each SpurJob that was waiting for one then (issue 8's "submission lag
    /// after a leader change").
    pub failover_submission: Vec<u64>,
}

/// Samples the world and keeps the checks' state between samples.
pub struct Monitor {
    deadlines: Deadlines,
    /// The operator replicas' hosts.
    operators: Vec<String>,
    /// Who acted, judged from the API server's record against the Lease.
    acting: ActingCheck,
    /// Since when, with the API server up, no live replica has held the Lease.
    leaderless_since: Option<Duration>,
    takeover_flagged: bool,
    healthy_since: Option<Duration>,
    /// The last leader with a quorum seen, to notice the election of another.
    last_leader: Option<String>,
    nodes: BTreeMap<String, NodeWatch>,
    jobs: BTreeMap<String, JobWatch>,
    pub violations: Vec<Violation>,
    pub lags: Lags,
    /// Every deadline judged, met or missed: the brackets of a run's timeline.
    pub brackets: Vec<Bracket>,
}

/// One deadline as it was judged: waiting from `from`, due at `from + deadline`, and met
/// at `end` or found missed at `end`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bracket {
    pub check: &'static str,
    pub object: String,
    pub from: Duration,
    pub due: Duration,
    pub end: Duration,
    pub met: bool,
}

fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

impl Monitor {
    pub fn new(deadlines: Deadlines, operators: &[&str]) -> Self {
        Self {
            deadlines,
            operators: operators.iter().map(|o| (*o).to_owned()).collect(),
            acting: ActingCheck::new(OPERATOR_LEASE, operators),
            leaderless_since: None,
            takeover_flagged: false,
            healthy_since: None,
            last_leader: None,
            nodes: BTreeMap::new(),
            jobs: BTreeMap::new(),
            violations: Vec::new(),
            lags: Lags::default(),
            brackets: Vec::new(),
        }
    }

    /// Notes that SpurJob `name` was deleted at `at` (by the workload).
    pub fn deleted(&mut self, name: &str, at: Duration) {
        self.jobs.entry(name.to_owned()).or_default().deleted_at = Some(at);
    }

    /// Notes `check`'s deadline on `object`, waited for from `from`, met (or found missed)
    /// at `end`.
    fn bracket(
        &mut self,
        check: &'static str,
        object: String,
        from: Duration,
        end: Duration,
        met: bool,
    ) {
        let deadline = match check {
            "registration" => self.deadlines.registration,
            "submission" => self.deadlines.submission,
            "status" => self.deadlines.status,
            _ => self.deadlines.deletion,
        };
        self.brackets.push(Bracket {
            check,
            object,
            from,
            due: from + deadline,
            end,
            met,
        });
    }

    fn violate(&mut self, check: &'static str, object: &str, at: Duration, detail: String) {
        self.violations.push(Violation {
            check,
            object: object.to_owned(),
            at,
            detail,
        });
    }

    /// The operator replicas' hosts, and the check of who acts, for a stage that judges
    /// its own records of writes and calls before it observes.
    pub fn acting_parts(&mut self) -> (&[String], &mut ActingCheck) {
        (&self.operators, &mut self.acting)
    }

    /// One sample of what the world looks like at `now`, however it was read (the
    /// simulation's state, or the lab's reads of real processes).
    pub fn observe(&mut self, seen: &Observation, now: Duration, api_up: bool) {
        self.check_takeover(
            now,
            api_up,
            seen.acting_operator.is_some(),
            seen.holder.as_deref(),
        );
        let operator_up = seen.acting_operator.is_some();
        // Healthy from "a leader with a quorum exists and the Service has a ready
        // endpoint" the operator can reach: a ready endpoint cut off from that leader (a
        // partitioned replica, which stays in the Service and may serve stale reads) is
        // the operator's problem to get around, not a reason to stop judging; the operator
        // cut off from every endpoint (partition-operator-service) is a world in which
        // nothing can be submitted.
        let healthy = seen.leader.is_some() && seen.endpoint_reachable && operator_up && api_up;
        self.healthy_since = match (healthy, self.healthy_since) {
            (true, None) => Some(now),
            (true, since) => since,
            (false, _) => None,
        };
        // SpurJobs are noted as they appear, leader or not: one created mid-election is
        // waiting when the next leader is elected.
        self.note_new_jobs(seen, now);
        if let Some(current) = &seen.leader {
            if self
                .last_leader
                .as_ref()
                .is_some_and(|last| last != current)
            {
                for watch in self.jobs.values_mut() {
                    if watch.id.is_none() && watch.deleted_at.is_none() {
                        watch.waiting_at_election = Some(now);
                    }
                }
            }
            self.last_leader = Some(current.clone());
        }
        let Some(controller) = &seen.controller else {
            return;
        };
        self.check_nodes(seen, now, &controller.registered);
        self.check_node_liveness(now, &controller.down);
        self.check_jobs(seen, now, &controller.jobs);
        self.check_owners(seen, now, controller);
    }

    /// Leader-only writes judged, per operator replica.
    pub fn acting_writes(&self) -> &BTreeMap<String, usize> {
        &self.acting.judged
    }

    /// Controller write calls judged, per operator replica.
    pub fn acting_calls(&self) -> &BTreeMap<String, usize> {
        &self.acting.calls_judged
    }

    /// Writes and write calls that landed outside their sender's term after a cut that held
    /// them healed, per operator replica.
    pub fn landed_after_cut(&self) -> &BTreeMap<String, usize> {
        &self.acting.landed_after_cut
    }

    /// sim.md's lease liveness, which bounds the pause the deadlines take while nobody
    /// holds the lease: with the API server up, a live replica holds it within
    /// [`Deadlines::takeover`].
    fn check_takeover(&mut self, now: Duration, api_up: bool, held: bool, holder: Option<&str>) {
        if held || !api_up {
            self.leaderless_since = None;
            self.takeover_flagged = false;
            return;
        }
        let since = *self.leaderless_since.get_or_insert(now);
        if !self.takeover_flagged && now.saturating_sub(since) > self.deadlines.takeover {
            self.takeover_flagged = true;
            let named = holder.map_or("nobody".to_owned(), |h| {
                format!("{h}, which is down or cut off from the API server")
            });
            self.violate(
                "lease-takeover",
                &format!("lease/{OPERATOR_LEASE}"),
                now,
                format!(
                    "no live operator replica has held the lease since {:.1}s (it names {named})",
                    since.as_secs_f64()
                ),
            );
        }
    }

    fn note_new_jobs(&mut self, seen: &Observation, now: Duration) {
        for name in seen.spurjobs.keys() {
            if !self.jobs.contains_key(name) {
                self.jobs.insert(
                    name.to_owned(),
                    JobWatch {
                        created_at: now,
                        ..Default::default()
                    },
                );
            }
        }
    }

    /// Since when a waiting object has had a healthy world: the later of its own start
    /// and the start of the current healthy stretch.
    fn waiting_from(&self, since: Duration) -> Option<Duration> {
        self.healthy_since.map(|h| h.max(since))
    }

    /// Node liveness, a check of ours beside sim.md's ([`Deadlines::node_liveness`]): once
    /// per node DOWN at the leader in a world healthy for the whole window.
    fn check_node_liveness(&mut self, now: Duration, down: &BTreeSet<String>) {
        let window = self.deadlines.node_liveness;
        let healthy_long = self
            .healthy_since
            .is_some_and(|since| now.saturating_sub(since) >= window);
        for (name, watch) in &mut self.nodes {
            let is_down = watch.registered && down.contains(name);
            if !is_down {
                watch.down_since = None;
                watch.down_flagged = false;
                continue;
            }
            let down_since = *watch.down_since.get_or_insert(now);
            if !healthy_long || watch.down_flagged {
                continue;
            }
            watch.down_flagged = true;
            let since = self.healthy_since.expect("healthy");
            let detail = format!(
                "the controller leader holds it DOWN since {:.1}s though the world was healthy \
                 since {:.1}s: no heartbeat of the operator's reached the leader",
                down_since.as_secs_f64(),
                since.as_secs_f64()
            );
            self.violations.push(Violation {
                check: "node-liveness",
                object: format!("node/{name}"),
                at: now,
                detail,
            });
        }
    }

    fn check_nodes(&mut self, seen: &Observation, now: Duration, registered: &BTreeSet<String>) {
        let present = &seen.managed_nodes;
        for name in present {
            self.nodes.entry(name.clone()).or_insert_with(|| NodeWatch {
                exists_since: now,
                ..Default::default()
            });
        }
        self.nodes.retain(|name, _| present.contains(name));
        let names: Vec<String> = self.nodes.keys().cloned().collect();
        for name in names {
            let (exists_since, was_registered, flagged) = {
                let w = &self.nodes[&name];
                (w.exists_since, w.registered, w.flagged)
            };
            let is_registered = registered.contains(&name);
            let from = self.waiting_from(exists_since);
            if is_registered && !was_registered {
                if let Some(from) = from {
                    self.lags.registration.push(ms(now.saturating_sub(from)));
                    self.bracket("registration", format!("node/{name}"), from, now, true);
                }
            } else if !is_registered
                && !flagged
                && let Some(from) = from
                && now.saturating_sub(from) > self.deadlines.registration
            {
                self.bracket("registration", format!("node/{name}"), from, now, false);
                self.violate(
                    "registration",
                    &format!("node/{name}"),
                    now,
                    format!(
                        "not registered {:.1}s after it could have been (healthy since {:.1}s)",
                        now.saturating_sub(from).as_secs_f64(),
                        from.as_secs_f64()
                    ),
                );
                self.nodes.get_mut(&name).expect("tracked").flagged = true;
            }
            let watch = self.nodes.get_mut(&name).expect("tracked");
            watch.registered = is_registered;
            if is_registered {
                watch.flagged = false;
            }
        }
    }

    /// The per-SpurJob checks (its id, its submission, its status), then the deletions,
    /// which also weigh SpurJobs already gone from the sample.
    fn check_jobs(
        &mut self,
        seen: &Observation,
        now: Duration,
        controller: &BTreeMap<u32, (&'static str, i32)>,
    ) {
        for (name, view) in &seen.spurjobs {
            self.check_submission(name, view, now);
            self.check_status(name, &view.state, now, controller);
        }
        self.check_deletions(seen, now, controller);
    }

    /// Submission: a SpurJob gets a spurJobId within its deadline, and keeps it once it
    /// has one.
    fn check_submission(&mut self, name: &str, view: &SpurJobView, now: Duration) {
        let state = &view.state;
        let (created_at, known_id, deleted) = {
            let w = &self.jobs[name];
            (w.created_at, w.id, w.deleted_at.is_some())
        };
        match (known_id, view.spur_job_id) {
            (Some(old), Some(new)) if old != new => self.violate(
                "spurjob-id-changed",
                &format!("spurjob/{name}"),
                now,
                format!("status.spurJobId went from {old} to {new}"),
            ),
            // A recorded id that disappears is as lost as one that changes: the job
            // it named is no longer tied to its SpurJob.
            (Some(old), None) => {
                self.violate(
                    "spurjob-id-changed",
                    &format!("spurjob/{name}"),
                    now,
                    format!("status.spurJobId {old} was cleared"),
                );
                self.jobs.get_mut(name).expect("tracked").id = None;
            }
            (None, Some(new)) => self.note_submitted(name, new, created_at, now),
            // Every SpurJob a scenario creates is valid: one the operator ends without a
            // job (`Failed`, or `Invalid` as earlier versions wrote it: a spec it or the
            // controller refused) will never be submitted. Exempting it from the
            // deadline, as this check once did, could only hide that bug.
            (None, None)
                if !deleted && is_terminal(state) && !self.jobs[name].submission_flagged =>
            {
                self.violate(
                    "submission",
                    &format!("spurjob/{name}"),
                    now,
                    format!("marked {state} without a job, though every SpurJob of the workload is valid"),
                );
                self.jobs.get_mut(name).expect("tracked").submission_flagged = true;
            }
            (None, None) if !deleted => self.check_submission_deadline(name, created_at, now),
            _ => {}
        }
    }

    /// Records the id a SpurJob was first seen with, and the lags it was submitted in.
    fn note_submitted(&mut self, name: &str, id: u32, created_at: Duration, now: Duration) {
        if let Some(from) = self.waiting_from(created_at) {
            self.lags.submission.push(ms(now.saturating_sub(from)));
            self.bracket("submission", format!("spurjob/{name}"), from, now, true);
        }
        // From the election, or from when the world was whole again when
        // something else (the API server, the Service) was still down then:
        // the same "could have been submitted" as the submission deadline.
        if let Some(elected) = self.jobs[name].waiting_at_election
            && let Some(from) = self.waiting_from(elected)
        {
            self.lags
                .failover_submission
                .push(ms(now.saturating_sub(from)));
        }
        let watch = self.jobs.get_mut(name).expect("tracked");
        watch.id = Some(id);
        watch.id_unconfirmed_since = Some(now);
    }

    /// Flags, once, a SpurJob still without an id past its deadline of healthy time.
    fn check_submission_deadline(&mut self, name: &str, created_at: Duration, now: Duration) {
        let flagged = self.jobs[name].submission_flagged;
        if let Some(from) = self.waiting_from(created_at)
            && !flagged
            && now.saturating_sub(from) > self.deadlines.submission
        {
            self.bracket("submission", format!("spurjob/{name}"), from, now, false);
            self.violate(
                "submission",
                &format!("spurjob/{name}"),
                now,
                format!(
                    "no spurJobId {:.1}s after it could have been submitted",
                    now.saturating_sub(from).as_secs_f64()
                ),
            );
            self.jobs.get_mut(name).expect("tracked").submission_flagged = true;
        }
    }

    /// Status: a terminal state in the controller reaches the SpurJob (one not deleted,
    /// whose id is known), `state` being the state its status shows.
    fn check_status(
        &mut self,
        name: &str,
        state: &str,
        now: Duration,
        controller: &BTreeMap<u32, (&'static str, i32)>,
    ) {
        let Some(id) = self.jobs[name].id else {
            return;
        };
        if self.jobs[name].deleted_at.is_some() {
            return;
        }
        let Some((controller_state, _)) = controller.get(&id) else {
            return;
        };
        if !is_terminal(controller_state) {
            return;
        }
        let watch = self.jobs.get_mut(name).expect("tracked");
        let (terminal_at, terminal_state) = *watch.terminal.get_or_insert((now, controller_state));
        if watch.status_done {
            return;
        }
        if state == terminal_state {
            watch.status_done = true;
            if let Some(from) = self.healthy_since.map(|h| h.max(terminal_at)) {
                self.lags.status.push(ms(now.saturating_sub(from)));
                self.bracket("status", format!("spurjob/{name}"), from, now, true);
            }
        } else if let Some(from) = self.healthy_since.map(|h| h.max(terminal_at))
            && !watch.status_flagged
            && now.saturating_sub(from) > self.deadlines.status
        {
            watch.status_flagged = true;
            self.bracket("status", format!("spurjob/{name}"), from, now, false);
            self.violate(
                "status",
                &format!("spurjob/{name}"),
                now,
                format!(
                    "controller says {terminal_state} since {:.1}s; status says {state:?}",
                    terminal_at.as_secs_f64()
                ),
            );
        }
    }

    /// Deletion: the object goes, its job is cancelled (or over), its pods go.
    fn check_deletions(
        &mut self,
        seen: &Observation,
        now: Duration,
        controller: &BTreeMap<u32, (&'static str, i32)>,
    ) {
        let (by_name, pods_by_job) = (&seen.spurjobs, &seen.pod_job_ids);
        let names: Vec<String> = self.jobs.keys().cloned().collect();
        for name in names {
            let watch = &self.jobs[&name];
            let Some(deleted_at) = watch.deleted_at else {
                continue;
            };
            if watch.deletion_done {
                continue;
            }
            let gone = !by_name.contains_key(&name);
            let job_over = watch
                .id
                .is_none_or(|id| controller.get(&id).is_none_or(|(s, _)| is_terminal(s)));
            let pods_gone = watch.id.is_none_or(|id| !pods_by_job.contains(&id));
            if gone && job_over && pods_gone {
                self.jobs.get_mut(&name).expect("tracked").deletion_done = true;
                if let Some(from) = self.waiting_from(deleted_at) {
                    self.bracket("deletion", format!("spurjob/{name}"), from, now, true);
                }
                continue;
            }
            if let Some(from) = self.waiting_from(deleted_at)
                && !watch.deletion_flagged
                && now.saturating_sub(from) > self.deadlines.deletion
            {
                self.jobs.get_mut(&name).expect("tracked").deletion_flagged = true;
                self.bracket("deletion", format!("spurjob/{name}"), from, now, false);
                self.violate(
                    "deletion",
                    &format!("spurjob/{name}"),
                    now,
                    format!(
                        "object gone: {gone}, job cancelled: {job_over}, pods gone: {pods_gone}"
                    ),
                );
            }
        }
    }

    /// A SpurJob's `spurJobId` names the controller job submitted for it: one whose comment
    /// carries the SpurJob's UID (fidelity row 14: what the operator must guarantee, in place
    /// of the increasing ids the real controller does not promise). Judged once per id, when the leader
    /// first shows that job; an id the leader has not shown for the submission deadline
    /// of healthy time names no job at all. (The workload submits no arrays, whose parent
    /// id has no job record of its own.)
    fn check_owners(&mut self, seen: &Observation, now: Duration, controller: &ControllerView) {
        for (name, view) in &seen.spurjobs {
            let Some(watch) = self.jobs.get(name) else {
                continue;
            };
            let (Some(id), Some(since)) = (watch.id, watch.id_unconfirmed_since) else {
                continue;
            };
            let detail = if controller.jobs.contains_key(&id) {
                match controller.owners.get(&id) {
                    Some(owner) if *owner == view.uid => None,
                    Some(owner) => Some(format!(
                        "status.spurJobId {id} names the controller job of SpurJob {owner}, not {}",
                        view.uid
                    )),
                    None => Some(format!(
                        "status.spurJobId {id} names a controller job whose comment carries no SpurJob UID"
                    )),
                }
            } else {
                match self.waiting_from(since) {
                    Some(from) if now.saturating_sub(from) > self.deadlines.submission => {
                        Some(format!(
                            "status.spurJobId {id} names no job the controller leader has shown in {:.1}s",
                            now.saturating_sub(from).as_secs_f64()
                        ))
                    }
                    _ => continue,
                }
            };
            self.jobs
                .get_mut(name)
                .expect("tracked")
                .id_unconfirmed_since = None;
            if let Some(detail) = detail {
                self.violate(
                    "spurjob-id-names-its-job",
                    &format!("spurjob/{name}"),
                    now,
                    detail,
                );
            }
        }
    }

    /// The check on the whole run: at most one controller job of each SpurJob runs.
    /// `accepted` is every job the controller accepted, with its comment, whether it ran
    /// and whether it may still run. spurctld does not deduplicate, and a SubmitJob the
    /// operator gave up on in a cut can land after the heal (`crate::records::Cut`); what the
    /// operator must guarantee is that such a second job is stopped before it starts
    /// (`spur_operator`'s `jobs::duplicates`): two jobs of one SpurJob that ran, or that
    /// are still pending at the end, are a violation; a second job that ended without
    /// running is counted in [`Duplicates::stopped`]. (Whether job ids increase is the
    /// controller's business, which the real one does not promise in submission order
    /// (fidelity.md row 14); what the operator must guarantee is judged here and by
    /// `spurjob-id-names-its-job`.)
    ///
    /// And every deletion was judged: a SpurJob deleted in the run whose deletion neither
    /// completed nor outlived its deadline was never weighed (the world never held still
    /// long enough), which would otherwise pass unseen.
    pub fn finish_with(&mut self, accepted: &[AcceptedJob], now: Duration) -> Duplicates {
        let unjudged: Vec<(String, Duration)> = self
            .jobs
            .iter()
            .filter(|(_, w)| !w.deletion_done && !w.deletion_flagged)
            .filter_map(|(name, w)| Some((name.clone(), w.deleted_at?)))
            .collect();
        for (name, deleted_at) in unjudged {
            self.violate(
                "deletion",
                &format!("spurjob/{name}"),
                now,
                format!(
                    "never judged: deleted at {:.1}s, neither gone nor past its deadline by the end",
                    deleted_at.as_secs_f64()
                ),
            );
        }
        let mut by_uid: BTreeMap<&str, Vec<&AcceptedJob>> = BTreeMap::new();
        for job in accepted {
            if let Some(uid) = uid_in_comment(&job.comment) {
                by_uid.entry(uid).or_default().push(job);
            }
        }
        let mut duplicates = Duplicates::default();
        for (uid, jobs) in by_uid {
            if jobs.len() < 2 {
                continue;
            }
            let ids: Vec<u32> = jobs.iter().map(|j| j.id).collect();
            let running: Vec<u32> = jobs
                .iter()
                .filter(|j| j.ran || j.live)
                .map(|j| j.id)
                .collect();
            duplicates.stopped += jobs.len() - running.len().max(1);
            if running.len() > 1 {
                duplicates.ran += running.len() - 1;
                self.violate(
                    "duplicate-submission",
                    &format!("spurjob-uid/{uid}"),
                    now,
                    format!(
                        "controller jobs {ids:?} carry the same SpurJob, and {running:?} ran or may still run"
                    ),
                );
            }
        }
        duplicates
    }
}

/// One job the controller accepted, as the whole-run duplicate check weighs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AcceptedJob {
    pub id: u32,
    pub comment: String,
    /// It started on its agents (for an array, one of its tasks did).
    pub ran: bool,
    /// It has not ended by the end of the run (for an array, one of its tasks): it may
    /// still run.
    pub live: bool,
}

/// The second controller jobs of SpurJobs a run left (`Monitor::finish_with`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Duplicates {
    /// Beyond the first, the jobs of one SpurJob that ran or may still run: violations.
    pub ran: usize,
    /// Second jobs that ended without running: the operator stopped them in time.
    pub stopped: usize,
}

/// What one sample sees of the world's ground truth. The simulation fills it from its
/// state; the lab from real processes (the replicas' own answers and the
/// API server's records), so both are judged by the same checks.
#[derive(Clone, Debug, Default)]
pub struct Observation {
    /// The operator replica the Lease names, per the API server.
    pub holder: Option<String>,
    /// The holder, while its process runs and it can reach the API server: "the operator"
    /// whose deadlines these are. A holder cut off from the API server can neither renew
    /// nor act: it is as gone as a crashed one, and the other replica must take over.
    pub acting_operator: Option<String>,
    /// Whether the acting operator can reach some ready endpoint of the Service.
    pub endpoint_reachable: bool,
    /// The controller leader that has a quorum, by a name that changes with each leader.
    pub leader: Option<String>,
    /// The leader's state, when there is one.
    pub controller: Option<ControllerView>,
    /// SpurJobs by name.
    pub spurjobs: BTreeMap<String, SpurJobView>,
    /// Controller job ids that have pods.
    pub pod_job_ids: BTreeSet<u32>,
    /// The labelled Kubernetes nodes the operator must register.
    pub managed_nodes: BTreeSet<String>,
}

/// The controller leader's state as one sample sees it.
#[derive(Clone, Debug, Default)]
pub struct ControllerView {
    /// Nodes registered with the acting operator's agent address: after a takeover the
    /// controller must launch on the new leader, so the new leader registers every node
    /// again. With no acting operator, every registered node.
    pub registered: BTreeSet<String>,
    /// Nodes the leader holds DOWN.
    pub down: BTreeSet<String>,
    /// Every job: its state's name and exit code.
    pub jobs: BTreeMap<u32, (&'static str, i32)>,
    /// The SpurJob UID each job's comment carries (jobs whose comment carries none are
    /// absent).
    pub owners: BTreeMap<u32, String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::SpurJobView;

    fn seen_with(id: Option<u32>) -> Observation {
        Observation {
            spurjobs: [(
                "job-000".to_owned(),
                SpurJobView {
                    uid: "uid-0".into(),
                    spur_job_id: id,
                    state: "Pending".into(),
                },
            )]
            .into(),
            holder: Some("operator".into()),
            acting_operator: Some("operator".into()),
            endpoint_reachable: true,
            leader: Some("spurctld-0".into()),
            controller: Some(ControllerView::default()),
            ..Default::default()
        }
    }

    fn fired(ids: &[Option<u32>]) -> Vec<String> {
        let mut monitor = Monitor::new(Deadlines::default(), &["operator"]);
        for (i, id) in ids.iter().enumerate() {
            monitor.observe(&seen_with(*id), Duration::from_secs(i as u64), true);
        }
        monitor
            .violations
            .iter()
            .filter(|v| v.check == "spurjob-id-changed")
            .map(|v| v.detail.clone())
            .collect()
    }

    const SECOND: Duration = Duration::from_secs(1);

    /// The checks named `check` that fired on `samples` (one a second from 0 s), with the
    /// API server up throughout.
    fn fired_on(check: &str, monitor: &mut Monitor, samples: &[Observation]) -> Vec<String> {
        for (i, seen) in samples.iter().enumerate() {
            monitor.observe(seen, SECOND * i as u32, true);
        }
        monitor
            .violations
            .iter()
            .filter(|v| v.check == check)
            .map(|v| v.to_string())
            .collect()
    }

    /// Job 5 of job-000 ended COMPLETED on the controller; the SpurJob's status says `state`.
    fn ended_with_status(state: &str) -> Observation {
        let mut seen = seen_with(Some(5));
        seen.spurjobs.get_mut("job-000").expect("job-000").state = state.into();
        seen.controller = Some(ControllerView {
            jobs: [(5, ("Completed", 0))].into(),
            ..Default::default()
        });
        seen
    }

    /// node-0, registered; the leader holds it DOWN when `down`; the world healthy when
    /// `healthy` (else no leader with a quorum).
    fn node_sample(down: bool, healthy: bool) -> Observation {
        let mut seen = seen_with(None);
        seen.spurjobs.clear();
        seen.managed_nodes = ["node-0".to_owned()].into();
        seen.controller = Some(ControllerView {
            registered: ["node-0".to_owned()].into(),
            down: if down {
                ["node-0".to_owned()].into()
            } else {
                BTreeSet::new()
            },
            ..Default::default()
        });
        if !healthy {
            seen.leader = None;
            seen.controller = None;
        }
        seen
    }

    #[test]
    fn node_liveness_fires_once_for_a_node_held_down_in_a_world_healthy_for_its_window() {
        let window = Deadlines::default().node_liveness.as_secs() as usize;
        // Up for 30 s, then DOWN: the window counts from when the world became healthy.
        let mut samples: Vec<Observation> = (0..30).map(|_| node_sample(false, true)).collect();
        samples.extend((30..window + 10).map(|_| node_sample(true, true)));
        let mut monitor = Monitor::new(Deadlines::default(), &["operator"]);
        assert_eq!(
            fired_on("node-liveness", &mut monitor, &samples),
            [format!(
                "node-liveness node/node-0 at {window}.0s: the controller leader holds it DOWN \
                 since 30.0s though the world was healthy since 0.0s: no heartbeat of the \
                 operator's reached the leader"
            )]
        );
        // DOWN for as long, but the world was not healthy until 60 s (no leader with a
        // quorum): nobody could have heartbeated the leader, so nothing fires yet.
        let mut samples: Vec<Observation> = (0..60).map(|_| node_sample(true, false)).collect();
        samples.extend((60..window + 59).map(|_| node_sample(true, true)));
        let mut monitor = Monitor::new(Deadlines::default(), &["operator"]);
        assert!(fired_on("node-liveness", &mut monitor, &samples).is_empty());
        // A node that came back UP is judged afresh.
        let mut samples: Vec<Observation> =
            (0..window + 1).map(|_| node_sample(true, true)).collect();
        samples.push(node_sample(false, true));
        samples.push(node_sample(true, true));
        let mut monitor = Monitor::new(Deadlines::default(), &["operator"]);
        assert_eq!(fired_on("node-liveness", &mut monitor, &samples).len(), 2);
    }

    #[test]
    fn status_fires_when_an_end_has_not_reached_the_spurjob_within_its_deadline() {
        // RUNNING for 16 samples (15 s after the end was first seen): too late.
        let late: Vec<Observation> = (0..17).map(|_| ended_with_status("Running")).collect();
        let mut monitor = Monitor::new(Deadlines::default(), &["operator"]);
        assert_eq!(
            fired_on("status", &mut monitor, &late),
            [
                "status spurjob/job-000 at 16.0s: controller says Completed since 0.0s; status says \"Running\""
            ]
        );
        // The end reaches it at 15 s: in time, and its lag is measured.
        let mut in_time: Vec<Observation> = (0..15).map(|_| ended_with_status("Running")).collect();
        in_time.extend((0..5).map(|_| ended_with_status("Completed")));
        let mut monitor = Monitor::new(Deadlines::default(), &["operator"]);
        assert!(fired_on("status", &mut monitor, &in_time).is_empty());
        assert_eq!(monitor.lags.status, [15_000]);
    }

    #[test]
    fn registration_fires_on_a_labelled_node_the_controller_never_registers() {
        let deadline = Deadlines::default().registration.as_secs() as usize;
        let mut unregistered = seen_with(None);
        unregistered.spurjobs.clear();
        unregistered.managed_nodes = ["node-0".to_owned()].into();
        let mut monitor = Monitor::new(Deadlines::default(), &["operator"]);
        assert_eq!(
            fired_on(
                "registration",
                &mut monitor,
                &vec![unregistered.clone(); deadline + 3]
            ),
            [
                "registration node/node-0 at 16.0s: not registered 16.0s after it could have been (healthy since 0.0s)"
            ]
        );
        assert!(monitor.lags.registration.is_empty());

        // Registered at 4 s: in time, its lag measured, nothing fires.
        let mut registered = unregistered.clone();
        registered.controller = Some(ControllerView {
            registered: ["node-0".to_owned()].into(),
            ..Default::default()
        });
        let mut samples = vec![unregistered; 4];
        samples.extend(vec![registered; deadline]);
        let mut monitor = Monitor::new(Deadlines::default(), &["operator"]);
        assert!(fired_on("registration", &mut monitor, &samples).is_empty());
        assert_eq!(monitor.lags.registration, [4_000]);
    }

    #[test]
    fn deletion_fires_until_the_object_its_job_and_its_pods_are_all_gone() {
        let deadline = Deadlines::default().deletion.as_secs() as usize;
        let running = {
            let mut seen = seen_with(Some(5));
            seen.controller = Some(ControllerView {
                jobs: [(5, ("Running", 0))].into(),
                ..Default::default()
            });
            seen.pod_job_ids = [5].into();
            seen
        };
        // The object is gone, but its job still runs and its pod is still there.
        let mut lingering = running.clone();
        lingering.spurjobs.clear();
        let mut monitor = Monitor::new(Deadlines::default(), &["operator"]);
        monitor.observe(&running, Duration::ZERO, true);
        monitor.deleted("job-000", Duration::ZERO);
        let samples = vec![lingering.clone(); deadline + 2];
        assert_eq!(
            fired_on("deletion", &mut monitor, &samples),
            [
                "deletion spurjob/job-000 at 21.0s: object gone: true, job cancelled: false, pods gone: false"
            ]
        );
        // Cancelled and its pods removed within the deadline: nothing fires.
        let mut done = lingering;
        done.controller = Some(ControllerView {
            jobs: [(5, ("Cancelled", 0))].into(),
            ..Default::default()
        });
        done.pod_job_ids.clear();
        let mut monitor = Monitor::new(Deadlines::default(), &["operator"]);
        monitor.observe(&running, Duration::ZERO, true);
        monitor.deleted("job-000", Duration::ZERO);
        assert!(fired_on("deletion", &mut monitor, &vec![done; deadline + 2]).is_empty());
        monitor.finish_with(&[], SECOND * 60);
        let deletions: Vec<String> = deletion_violations(&monitor);
        assert!(
            deletions.is_empty(),
            "a judged deletion is not judged again: {deletions:?}"
        );

        // Deleted while the world was never whole (the API server down throughout): the
        // deadline never started, so the end of the run says it was never judged.
        let mut monitor = Monitor::new(Deadlines::default(), &["operator"]);
        monitor.observe(&running, Duration::ZERO, true);
        monitor.deleted("job-000", SECOND);
        for i in 2..(deadline as u32 + 10) {
            monitor.observe(&lingering_unhealthy(&running), SECOND * i, false);
        }
        monitor.finish_with(&[], SECOND * 60);
        assert_eq!(
            deletion_violations(&monitor),
            [
                "deletion spurjob/job-000 at 60.0s: never judged: deleted at 1.0s, neither gone nor past its deadline by the end"
            ]
        );
    }

    fn deletion_violations(monitor: &Monitor) -> Vec<String> {
        monitor
            .violations
            .iter()
            .filter(|v| v.check == "deletion")
            .map(|v| v.to_string())
            .collect()
    }

    /// `seen` with its SpurJobs gone (observed with the API server down: no healthy time).
    fn lingering_unhealthy(seen: &Observation) -> Observation {
        let mut seen = seen.clone();
        seen.spurjobs.clear();
        seen
    }

    #[test]
    fn lease_takeover_fires_when_no_live_replica_holds_the_lease_with_the_api_server_up() {
        let takeover = Deadlines::default().takeover.as_secs() as usize;
        let mut unheld = seen_with(None);
        unheld.holder = Some("operator".into());
        unheld.acting_operator = None; // its holder is down
        let mut monitor = Monitor::new(Deadlines::default(), &["operator"]);
        assert_eq!(
            fired_on(
                "lease-takeover",
                &mut monitor,
                &vec![unheld.clone(); takeover + 2]
            ),
            [
                "lease-takeover lease/spur-system/spur-operator at 26.0s: no live operator replica has held the lease since 0.0s (it names operator, which is down or cut off from the API server)"
            ]
        );
        // With the API server down nobody can take it over: not judged.
        let mut monitor = Monitor::new(Deadlines::default(), &["operator"]);
        for i in 0..takeover + 2 {
            monitor.observe(&unheld, SECOND * i as u32, false);
        }
        assert!(monitor.violations.is_empty());
    }

    #[test]
    fn duplicate_submission_fires_when_two_jobs_of_one_spurjob_ran_or_may_still_run() {
        let job = |id: u32, uid: &str, ran: bool, live: bool| AcceptedJob {
            id,
            comment: format!("k8s {}{uid}", spur_names::UID_TAG),
            ran,
            live,
        };
        let mut monitor = Monitor::new(Deadlines::default(), &["operator"]);
        // One job each: nothing to judge.
        let one_each = [job(1, "a", true, false), job(2, "b", true, true)];
        assert_eq!(
            monitor.finish_with(&one_each, SECOND),
            Duplicates::default()
        );
        // A second job that ended without running (the operator cancelled it in time):
        // counted, not a violation; the same when neither ran (a deleted SpurJob).
        let stopped = [
            job(1, "a", true, false),
            job(2, "a", false, false),
            job(3, "b", false, false),
            job(4, "b", false, false),
        ];
        assert_eq!(
            monitor.finish_with(&stopped, SECOND),
            Duplicates { ran: 0, stopped: 2 }
        );
        assert!(monitor.violations.is_empty(), "{:?}", monitor.violations);
        // Both ran; or one ran and the other is still pending at the end.
        for (second, why) in [
            (job(2, "a", true, false), "both ran"),
            (job(2, "a", false, true), "the second may still run"),
        ] {
            let mut monitor = Monitor::new(Deadlines::default(), &["operator"]);
            let jobs = [job(1, "a", true, false), job(3, "b", true, false), second];
            assert_eq!(
                monitor.finish_with(&jobs, SECOND),
                Duplicates { ran: 1, stopped: 0 },
                "{why}"
            );
            let fired: Vec<String> = monitor.violations.iter().map(|v| v.to_string()).collect();
            assert_eq!(
                fired,
                [
                    "duplicate-submission spurjob-uid/a at 1.0s: controller jobs [1, 2] carry the same SpurJob, and [1, 2] ran or may still run"
                ],
                "{why}"
            );
        }
    }

    #[test]
    fn submission_fires_at_once_on_a_spurjob_marked_invalid_and_at_its_deadline_otherwise() {
        let with_state = |state: &str| {
            let mut seen = seen_with(None);
            seen.spurjobs.get_mut("job-000").expect("job-000").state = state.into();
            seen
        };
        let mut monitor = Monitor::new(Deadlines::default(), &["operator"]);
        let invalid = vec![with_state("Failed"); 3];
        assert_eq!(
            fired_on("submission", &mut monitor, &invalid),
            [
                "submission spurjob/job-000 at 0.0s: marked Failed without a job, though every SpurJob of the workload is valid"
            ]
        );
        let deadline = Deadlines::default().submission.as_secs() as usize;
        let mut monitor = Monitor::new(Deadlines::default(), &["operator"]);
        let waiting = vec![with_state("Pending"); deadline + 2];
        assert_eq!(
            fired_on("submission", &mut monitor, &waiting),
            [
                "submission spurjob/job-000 at 21.0s: no spurJobId 21.0s after it could have been submitted"
            ]
        );
        let mut monitor = Monitor::new(Deadlines::default(), &["operator"]);
        let mut in_time = vec![with_state("Pending"); deadline];
        in_time.push(seen_with(Some(5)));
        assert!(fired_on("submission", &mut monitor, &in_time).is_empty());
    }

    #[test]
    fn spurjob_id_changed_fires_on_a_new_id_and_on_a_cleared_one_never_on_the_first() {
        assert!(fired(&[None, Some(5), Some(5)]).is_empty());
        assert_eq!(
            fired(&[None, Some(5), Some(6)]),
            ["status.spurJobId went from 5 to 6"]
        );
        assert_eq!(fired(&[Some(5), None]), ["status.spurJobId 5 was cleared"]);
    }

    /// job-000 (uid-0) names job 5, which the controller shows owned by `owner` (absent:
    /// the controller does not show job 5 at all).
    fn naming_job_of(owner: Option<Option<&str>>) -> Observation {
        let mut seen = seen_with(Some(5));
        let controller = seen.controller.as_mut().expect("a controller");
        if let Some(owner) = owner {
            controller.jobs.insert(5, ("Pending", 0));
            if let Some(owner) = owner {
                controller.owners.insert(5, owner.to_owned());
            }
        }
        seen
    }

    #[test]
    fn spurjob_id_names_its_job_fires_on_another_owner_no_owner_and_no_job() {
        let check = "spurjob-id-names-its-job";
        let mut monitor = Monitor::new(Deadlines::default(), &["operator"]);
        let own = [seen_with(None), naming_job_of(Some(Some("uid-0")))];
        assert!(fired_on(check, &mut monitor, &own).is_empty());

        let mut monitor = Monitor::new(Deadlines::default(), &["operator"]);
        let other = [seen_with(None), naming_job_of(Some(Some("uid-9")))];
        assert_eq!(
            fired_on(check, &mut monitor, &other),
            [
                "spurjob-id-names-its-job spurjob/job-000 at 1.0s: status.spurJobId 5 names the controller job of SpurJob uid-9, not uid-0"
            ]
        );

        let mut monitor = Monitor::new(Deadlines::default(), &["operator"]);
        let untagged = [seen_with(None), naming_job_of(Some(None))];
        assert_eq!(
            fired_on(check, &mut monitor, &untagged),
            [
                "spurjob-id-names-its-job spurjob/job-000 at 1.0s: status.spurJobId 5 names a controller job whose comment carries no SpurJob UID"
            ]
        );

        // Not shown yet is no verdict until the submission deadline has passed; judged
        // once, not at every sample after it.
        let deadline = Deadlines::default().submission.as_secs() as usize;
        let mut monitor = Monitor::new(Deadlines::default(), &["operator"]);
        let mut missing = vec![seen_with(None)];
        missing.extend(vec![naming_job_of(None); deadline + 3]);
        assert_eq!(
            fired_on(check, &mut monitor, &missing),
            [
                "spurjob-id-names-its-job spurjob/job-000 at 22.0s: status.spurJobId 5 names no job the controller leader has shown in 21.0s"
            ]
        );
        let mut monitor = Monitor::new(Deadlines::default(), &["operator"]);
        let mut late = vec![seen_with(None)];
        late.extend(vec![naming_job_of(None); deadline]);
        late.push(naming_job_of(Some(Some("uid-0"))));
        assert!(fired_on(check, &mut monitor, &late).is_empty());
    }
}
