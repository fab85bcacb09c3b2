//! The replicated state machine: what every replica's copy of the log amounts to.
//!
//! Pure: commands carry the times they were proposed at, so every replica applying the
//! same log reaches the same state.

use std::collections::BTreeMap;
use std::time::SystemTime;

use spur_proto as pb;
use tonic::Status;

use super::admission::JoinTokenRecord;

/// The `state_reason` spurctld gives a job that ended OUT_OF_MEMORY.
const OOM_REASON: &str = "OutOfMemory";

/// A command in the replicated log.
#[derive(Clone, Debug)]
pub enum Command {
    /// A node registered (or registered again: refreshes resources and address, never
    /// its state).
    RegisterNode {
        name: String,
        address: String,
        port: u32,
        resources: pb::ResourceSet,
        labels: BTreeMap<String, String>,
    },
    /// An `UpdateNode` request.
    UpdateNode {
        name: String,
        state: Option<pb::NodeState>,
        reason: Option<String>,
        labels: BTreeMap<String, String>,
        remove_labels: Vec<String>,
    },
    /// A job submitted; it gets the next job id (an array: the parent id, its tasks the
    /// ids after it).
    SubmitJob {
        spec: Box<pb::JobSpec>,
        at: SystemTime,
    },
    /// A job cancelled by `user` (`""` and `root` may cancel any job, others their own).
    CancelJob {
        job_id: u32,
        user: String,
        at: SystemTime,
    },
    /// `scontrol requeue` by `user`: a running job goes back to PENDING under its id, not
    /// dispatched again before `defer_until` (spurctld computes it on the leader, so every
    /// replica applies one instant); a finished one re-pends at once.
    RequeueJob {
        job_id: u32,
        user: String,
        defer_until: SystemTime,
    },
    /// Every node of a dispatch confirmed its LaunchJob: the job is RUNNING, its nodes
    /// not yet recorded (spurctld commits the state change, then [`Command::StartJob`]).
    JobRunning { job_id: u32, at: SystemTime },
    /// The running job's nodes (run attempt `attempt`).
    StartJob {
        job_id: u32,
        nodes: Vec<String>,
        attempt: u32,
        at: SystemTime,
    },
    /// A dispatch failed: the job stays pending, not before `retry_at` (spurctld's
    /// `JobDispatchBackoff`), or is held once `max_requeue` retries have failed too.
    DispatchFailed {
        job_id: u32,
        detail: String,
        retry_at: SystemTime,
        max_requeue: u32,
    },
    /// One node's end of a job.
    ReportJobStatus {
        job_id: u32,
        node: String,
        exit_code: i32,
        /// The report's signal carried spurd's OOM bit (0x1000).
        oom: bool,
        run_attempt: u32,
        at: SystemTime,
    },
    /// The leader's health check: nodes silent too long go DOWN "Not responding" and
    /// their jobs NODE_FAIL.
    NodesNotResponding { names: Vec<String>, at: SystemTime },
    /// The leader's health check: DOWN nodes that no admin holds, heard from within the
    /// timeout, come back (spurctld's `HeartbeatRecovered`: IDLE, or ALLOCATED while a job
    /// holds them).
    NodesRecovered { names: Vec<String> },
    /// Terminal jobs that ended before `before` are evicted (spurctld keeps them an hour).
    EvictJobs { before: SystemTime },
    /// State loss: the controller forgets every registered node.
    ForgetNodes,
    /// `CreateToken`: a join token, kept as its secret's hash.
    CreateToken { id: String, token: JoinTokenRecord },
    /// `RevokeToken`: the join token admits no more registrations.
    RevokeToken { id: String },
}

impl Command {
    /// A short description for the trace.
    pub fn describe(&self) -> String {
        match self {
            Command::RegisterNode { name, .. } => format!("register node {name}"),
            Command::UpdateNode { name, state, .. } => {
                format!("update node {name} state={state:?}")
            }
            Command::SubmitJob { spec, .. } => format!("submit job name={}", spec.name),
            Command::CancelJob { job_id, .. } => format!("cancel job {job_id}"),
            Command::RequeueJob { job_id, .. } => format!("requeue job {job_id}"),
            Command::JobRunning { job_id, .. } => format!("job {job_id} running"),
            Command::StartJob { job_id, nodes, .. } => {
                format!("start job {job_id} on {}", nodes.join(","))
            }
            Command::DispatchFailed { job_id, detail, .. } => {
                format!("dispatch of job {job_id} failed: {detail}")
            }
            Command::ReportJobStatus {
                job_id,
                node,
                exit_code,
                ..
            } => format!("job {job_id} on {node} ended exit={exit_code}"),
            Command::NodesNotResponding { names, .. } => {
                format!("nodes not responding: {}", names.join(","))
            }
            Command::NodesRecovered { names } => {
                format!("nodes recovered: {}", names.join(","))
            }
            Command::EvictJobs { .. } => "evict old terminal jobs".to_owned(),
            Command::ForgetNodes => "forget all nodes".to_owned(),
            Command::CreateToken { id, .. } => format!("create join token {id}"),
            Command::RevokeToken { id } => format!("revoke join token {id}"),
        }
    }
}

/// One entry of the replicated log.
#[derive(Clone, Debug)]
pub struct LogEntry {
    /// Position in the log, from 1.
    pub index: u64,
    /// The leader's term when it was appended.
    pub term: u64,
    /// What it does.
    pub command: Command,
    /// What applying it produced (the job id of a submission).
    pub outcome: Effect,
}

/// What applying a command produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Effect {
    /// Nothing to report.
    Done,
    /// A submission's new job id.
    JobId(u32),
    /// Jobs whose nodes the agents must be told to stop: (job, node, address, port, signal).
    Stop(Vec<AgentStop>),
}

/// A CancelJob the leader sends an agent after a state change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentStop {
    pub job_id: u32,
    pub node: String,
    pub address: String,
    pub port: u32,
    pub signal: i32,
}

/// A registered node.
#[derive(Clone, Debug)]
pub struct Node {
    pub address: String,
    pub port: u32,
    pub resources: pb::ResourceSet,
    pub labels: BTreeMap<String, String>,
    pub state: pb::NodeState,
    pub reason: String,
    pub running_job: Option<u32>,
    /// Put in a hold state by UpdateNode (DOWN, DRAIN, ERROR, SUSPENDED...): heartbeats do
    /// not lift it, only an UpdateNode out of it does. The health check's own DOWN keeps
    /// the lock as it was (spurctld's `admin_locked`).
    pub admin_locked: bool,
}

impl Node {
    /// DOWN or ERROR with no admin hold: what the leader's health check brings back once
    /// the node's heartbeats are heard again (spurctld's `HeartbeatRecovered`).
    pub fn recoverable(&self) -> bool {
        matches!(
            self.state,
            pb::NodeState::NodeDown | pb::NodeState::NodeError
        ) && !self.admin_locked
    }
}

/// A job.
#[derive(Clone, Debug)]
pub struct Job {
    pub id: u32,
    pub spec: pb::JobSpec,
    pub state: pb::JobState,
    pub state_reason: String,
    pub submit_time: SystemTime,
    pub start_time: Option<SystemTime>,
    pub end_time: Option<SystemTime>,
    /// The nodes of the current allocation, in rank order (empty while pending, also
    /// during a dispatch).
    pub nodes: Vec<String>,
    /// Exit codes reported so far, by node.
    pub reports: BTreeMap<String, i32>,
    /// A node's report of this run carried the OOM bit: the job ends OUT_OF_MEMORY.
    pub oom_killed: bool,
    pub exit_code: i32,
    /// Run attempt of the last start (0 before the first): a dispatch uses this + 1, so a
    /// failed dispatch's retry carries the same value.
    pub attempt: u32,
    /// Failed dispatches so far.
    pub requeue_count: u32,
    /// Not dispatched before this time (after a failed dispatch).
    pub begin_time: Option<SystemTime>,
    /// Held: never dispatched again (a failure after `max_batch_requeue` retries).
    pub held: bool,
    /// For an array task: its parent's id and its index.
    pub array: Option<(u32, u32)>,
}

impl Job {
    /// A job just submitted: PENDING for "Priority", never started.
    fn pending(id: u32, spec: pb::JobSpec, submit_time: SystemTime) -> Self {
        Self {
            id,
            spec,
            state: pb::JobState::JobPending,
            state_reason: "Priority".to_owned(),
            submit_time,
            start_time: None,
            end_time: None,
            nodes: Vec::new(),
            reports: BTreeMap::new(),
            oom_killed: false,
            exit_code: 0,
            attempt: 0,
            requeue_count: 0,
            begin_time: None,
            held: false,
            array: None,
        }
    }

    /// Whether the job ended (PREEMPTED and REQUEUED come back to PENDING, so they are not).
    pub fn is_terminal(&self) -> bool {
        matches!(
            self.state,
            pb::JobState::JobCompleted
                | pb::JobState::JobFailed
                | pb::JobState::JobCancelled
                | pb::JobState::JobTimeout
                | pb::JobState::JobNodeFail
                | pb::JobState::JobDeadline
                | pb::JobState::JobOutOfMemory
        )
    }

    /// The job as `GetJob` answers it.
    pub fn info(&self) -> pb::JobInfo {
        pb::JobInfo {
            job_id: self.id,
            name: self.spec.name.clone(),
            user: self.spec.user.clone(),
            partition: self.spec.partition.clone(),
            account: self.spec.account.clone(),
            state: self.state as i32,
            state_reason: self.state_reason.clone(),
            submit_time: Some(self.submit_time.into()),
            start_time: self.start_time.map(Into::into),
            end_time: self.end_time.map(Into::into),
            num_nodes: self.spec.num_nodes.max(1),
            nodelist: super::hostlist::compress(&self.nodes),
            exit_code: self.exit_code,
            comment: self.spec.comment.clone(),
        }
    }

    /// The state, reason and exit code of a job every node reported: its first node's
    /// exit decides, whatever the others exited with, unless any node was OOM-killed.
    fn reported_result(&self) -> (pb::JobState, &'static str, i32) {
        let primary = self.reports[&self.nodes[0]];
        let (state, reason) = if self.oom_killed {
            (pb::JobState::JobOutOfMemory, OOM_REASON)
        } else if primary == 0 {
            (pb::JobState::JobCompleted, "")
        } else {
            (pb::JobState::JobFailed, "")
        };
        (state, reason, primary)
    }

    fn end(&mut self, state: pb::JobState, reason: &str, exit_code: i32, at: SystemTime) {
        self.state = state;
        self.state_reason = reason.to_owned();
        self.exit_code = exit_code;
        self.end_time = Some(at);
    }
}

/// The state every replica derives from the log.
#[derive(Clone, Debug)]
pub struct StateMachine {
    pub nodes: BTreeMap<String, Node>,
    pub jobs: BTreeMap<u32, Job>,
    /// The id the next submission gets. Job ids start at 1 and never repeat.
    pub next_job_id: u32,
    /// How many log entries this copy has applied.
    pub applied: u64,
    /// The join tokens `CreateToken` made, by id.
    pub join_tokens: BTreeMap<String, JoinTokenRecord>,
}

impl Default for StateMachine {
    fn default() -> Self {
        Self {
            nodes: BTreeMap::new(),
            jobs: BTreeMap::new(),
            next_job_id: 1,
            applied: 0,
            join_tokens: BTreeMap::new(),
        }
    }
}

/// The answer to a heartbeat for a node the controller does not know.
pub fn node_not_found(name: &str) -> Status {
    Status::not_found(format!("node {name} not found — is the node registered?"))
}

/// A node state that is an admin hold: it fails the node's running jobs, and heartbeats
/// do not lift it (only an explicit IDLE does). DRAIN is not one of them for running work:
/// a busy node drains.
fn fails_running_jobs(state: pb::NodeState) -> bool {
    matches!(
        state,
        pb::NodeState::NodeDown | pb::NodeState::NodeError | pb::NodeState::NodeSuspended
    )
}

/// The states an UpdateNode locks against recovery by heartbeat (spurctld's
/// `NodeState::is_admin_hold`); moving a node out of them clears the lock.
fn is_admin_hold(state: pb::NodeState) -> bool {
    matches!(
        state,
        pb::NodeState::NodeDown
            | pb::NodeState::NodeDrain
            | pb::NodeState::NodeDraining
            | pb::NodeState::NodeError
            | pb::NodeState::NodeSuspended
    )
}

/// Whether a report of `run_attempt` is older than the job's current attempt (0 is unset).
fn is_stale(run_attempt: u32, current: u32) -> bool {
    run_attempt != 0 && current != 0 && run_attempt < current
}

/// The port a registration's agent is dialled on: 0 means the agent's default.
fn agent_port(port: u32) -> u32 {
    if port == 0 {
        u32::from(spur_proto::AGENT_PORT)
    } else {
        port
    }
}

/// Whether `user` may cancel a job of `owner`: spurctld treats `""` and `root` as its own
/// trusted callers, anyone else must own the job.
fn may_cancel(user: &str, owner: &str) -> bool {
    user.is_empty() || user == "root" || user == owner
}

/// The task indices of an array spec such as `0-3`, `1,4,7`, `0-10:2`, with an optional
/// `%N` concurrency limit (ignored here); an error when it does not parse.
pub fn array_tasks(spec: &str) -> Result<Vec<u32>, String> {
    let body = spec.split('%').next().unwrap_or_default().trim();
    if body.is_empty() {
        return Err("empty spec".to_owned());
    }
    let mut tasks = Vec::new();
    for part in body.split(',') {
        let (range, step) = match part.split_once(':') {
            Some((range, step)) => (
                range,
                step.trim()
                    .parse::<u32>()
                    .map_err(|_| format!("bad step {step}"))?,
            ),
            None => (part, 1),
        };
        if step == 0 {
            return Err("step cannot be 0".to_owned());
        }
        let number = |s: &str| {
            s.trim()
                .parse::<u32>()
                .map_err(|_| format!("bad index {s}"))
        };
        let (from, to) = match range.split_once('-') {
            Some((a, b)) => (number(a)?, number(b)?),
            None => (number(range)?, number(range)?),
        };
        if from > to {
            return Err(format!("{from} > {to}"));
        }
        tasks.extend((from..=to).step_by(step as usize));
    }
    if tasks.len() > 100_000 {
        return Err(format!(
            "array too large: {} tasks (max 100000)",
            tasks.len()
        ));
    }
    Ok(tasks)
}

impl StateMachine {
    /// Whether `command` may be appended, judged on the leader's state. A refusal is the
    /// answer the client gets, with spurctld's code and text.
    pub fn check(&self, command: &Command) -> Result<(), Status> {
        match command {
            Command::RegisterNode { name, .. } if name.is_empty() => {
                Err(Status::invalid_argument("hostname is empty"))
            }
            Command::UpdateNode { name, .. } if !self.nodes.contains_key(name) => {
                Err(Status::internal(format!("node {name} not found")))
            }
            Command::RevokeToken { id } if !self.join_tokens.contains_key(id) => {
                Err(Status::not_found(format!("token not found: {id}")))
            }
            Command::CancelJob { job_id, user, .. } => match self.jobs.get(job_id) {
                None => Err(Status::internal(format!("job {job_id} not found"))),
                Some(job) if job.is_terminal() => Err(Status::internal(format!(
                    "job {job_id} is already {}",
                    job.state.spurctld_name()
                ))),
                Some(job) if !may_cancel(user, &job.spec.user) => Err(Status::permission_denied(
                    format!("user {user} cannot cancel job owned by {}", job.spec.user),
                )),
                Some(_) => Ok(()),
            },
            // In spurctld's order (`requeue_one_job`): unknown, not the owner, then the state.
            Command::RequeueJob { job_id, user, .. } => {
                let Some(job) = self.jobs.get(job_id) else {
                    return Err(Status::failed_precondition(format!(
                        "job {job_id} not found"
                    )));
                };
                if user.is_empty() || *user != job.spec.user {
                    return Err(Status::permission_denied(format!(
                        "user {user} cannot requeue job owned by {}",
                        job.spec.user
                    )));
                }
                let refusal = match job.state {
                    pb::JobState::JobPending => "is already pending",
                    pb::JobState::JobCompleting => "is completing; cannot requeue",
                    pb::JobState::JobPreempted | pb::JobState::JobRequeued => {
                        "is already being requeued"
                    }
                    _ => return Ok(()),
                };
                Err(Status::failed_precondition(format!(
                    "job {job_id} {refusal}"
                )))
            }
            // In spurctld's order: unknown, finished (OK), an older attempt (OK, ignored),
            // a node outside the allocation (also while a dispatch is in flight).
            Command::ReportJobStatus {
                job_id,
                node,
                run_attempt,
                ..
            } => match self.jobs.get(job_id) {
                None => Err(Status::not_found(format!("job {job_id} not found"))),
                Some(job) if job.is_terminal() || is_stale(*run_attempt, job.attempt) => Ok(()),
                Some(job) if !job.nodes.contains(node) => Err(Status::invalid_argument(format!(
                    "node {node} is not allocated to job {job_id}"
                ))),
                Some(_) => Ok(()),
            },
            _ => Ok(()),
        }
    }

    /// Applies one command. Commands were checked before they were appended; anything
    /// that no longer fits (a report for a cancelled job) is ignored.
    pub fn apply(&mut self, command: &Command) -> Effect {
        self.applied += 1;
        match command {
            Command::RegisterNode {
                name,
                address,
                port,
                resources,
                labels,
            } => self.register_node(name, address, *port, resources, labels),
            Command::UpdateNode {
                name,
                state,
                reason,
                labels,
                remove_labels,
            } => self.update_node(name, *state, reason.as_deref(), labels, remove_labels),
            Command::SubmitJob { spec, at } => self.submit_job(spec, *at),
            Command::CancelJob { job_id, at, .. } => self.cancel_job(*job_id, *at),
            Command::RequeueJob {
                job_id,
                defer_until,
                ..
            } => self.requeue_job(*job_id, *defer_until),
            Command::StartJob {
                job_id,
                nodes,
                attempt,
                at,
            } => self.start_job(*job_id, nodes, *attempt, *at),
            Command::JobRunning { job_id, at } => self.job_running(*job_id, *at),
            Command::DispatchFailed {
                job_id,
                detail,
                retry_at,
                max_requeue,
            } => self.dispatch_failed(*job_id, detail, *retry_at, *max_requeue),
            Command::ReportJobStatus {
                job_id,
                node,
                exit_code,
                oom,
                run_attempt,
                at,
            } => self.report_job_status(*job_id, node, *exit_code, *oom, *run_attempt, *at),
            Command::NodesNotResponding { names, at } => self.nodes_not_responding(names, *at),
            Command::NodesRecovered { names } => self.nodes_recovered(names),
            Command::EvictJobs { before } => {
                self.jobs.retain(|_, job| {
                    !job.is_terminal() || job.end_time.is_none_or(|t| t >= *before)
                });
                Effect::Done
            }
            Command::ForgetNodes => {
                self.nodes.clear();
                Effect::Done
            }
            Command::CreateToken { id, token } => {
                self.join_tokens.insert(id.clone(), token.clone());
                Effect::Done
            }
            Command::RevokeToken { id } => {
                if let Some(token) = self.join_tokens.get_mut(id) {
                    token.revoked = true;
                }
                Effect::Done
            }
        }
    }

    /// [`Command::RegisterNode`]: a new node starts IDLE; one registering again keeps its
    /// state and takes the new address and resources.
    fn register_node(
        &mut self,
        name: &str,
        address: &str,
        port: u32,
        resources: &pb::ResourceSet,
        labels: &BTreeMap<String, String>,
    ) -> Effect {
        let node = self.nodes.entry(name.to_owned()).or_insert_with(|| Node {
            address: String::new(),
            port: 0,
            resources: pb::ResourceSet::default(),
            labels: BTreeMap::new(),
            state: pb::NodeState::NodeIdle,
            reason: String::new(),
            running_job: None,
            admin_locked: false,
        });
        node.address = address.to_owned();
        node.port = agent_port(port);
        node.resources = resources.clone();
        node.labels = labels.clone();
        Effect::Done
    }

    /// Whether a registration of `name` would change what this state holds of it (a new
    /// node, other resources, address, port or labels). spurctld proposes nothing for one
    /// that does not, so a leader without a quorum still answers it.
    pub fn registration_changes(
        &self,
        name: &str,
        address: &str,
        port: u32,
        resources: &pb::ResourceSet,
        labels: &BTreeMap<String, String>,
    ) -> bool {
        self.nodes.get(name).is_none_or(|node| {
            node.address != address
                || node.port != agent_port(port)
                || node.resources != *resources
                || node.labels != *labels
        })
    }

    /// [`Command::UpdateNode`]: a hold state locks the node, and DOWN (ERROR, SUSPENDED)
    /// fails its running jobs.
    fn update_node(
        &mut self,
        name: &String,
        state: Option<pb::NodeState>,
        reason: Option<&str>,
        labels: &BTreeMap<String, String>,
        remove_labels: &[String],
    ) -> Effect {
        let Some(node) = self.nodes.get_mut(name) else {
            return Effect::Done;
        };
        if let Some(reason) = reason {
            node.reason = reason.to_owned();
        }
        node.labels.extend(labels.clone());
        for key in remove_labels {
            node.labels.remove(key);
        }
        if let Some(state) = state {
            node.state = state;
            node.admin_locked = is_admin_hold(state);
            if fails_running_jobs(state) {
                // The agent is not told (spurctld's UpdateNode path sends nothing).
                self.fail_jobs_on(std::slice::from_ref(name), "NodeDown", None);
            }
        }
        Effect::Done
    }

    /// [`Command::SubmitJob`]: the job takes the next id; an array's parent takes it and
    /// each task the ids after it.
    fn submit_job(&mut self, spec: &pb::JobSpec, at: SystemTime) -> Effect {
        let id = self.next_job_id;
        self.next_job_id += 1;
        if spec.array_spec.is_empty() {
            self.jobs.insert(id, Job::pending(id, spec.clone(), at));
        } else {
            // The parent id has no record of its own; each task is a full clone
            // (name and comment too) with the next id.
            let tasks = array_tasks(&spec.array_spec).unwrap_or_default();
            for index in tasks {
                let task_id = self.next_job_id;
                self.next_job_id += 1;
                let mut task = spec.clone();
                task.array_spec.clear();
                let mut record = Job::pending(task_id, task, at);
                record.array = Some((id, index));
                self.jobs.insert(task_id, record);
            }
        }
        Effect::JobId(id)
    }

    /// [`Command::CancelJob`]: a live job ends CANCELLED and its agents are told to stop.
    fn cancel_job(&mut self, job_id: u32, at: SystemTime) -> Effect {
        let Some(job) = self.jobs.get_mut(&job_id) else {
            return Effect::Done;
        };
        if job.is_terminal() {
            return Effect::Done;
        }
        job.end(pb::JobState::JobCancelled, "cancelled", job.exit_code, at);
        let nodes = std::mem::take(&mut job.nodes);
        Effect::Stop(self.release_nodes(job_id, &nodes, 0))
    }

    /// [`Command::RequeueJob`]: a running job re-pends not before `defer_until` and its
    /// agents are told to stop; an ended one re-pends at once.
    fn requeue_job(&mut self, job_id: u32, defer_until: SystemTime) -> Effect {
        let Some(job) = self.jobs.get_mut(&job_id) else {
            return Effect::Done;
        };
        let live = matches!(
            job.state,
            pb::JobState::JobRunning | pb::JobState::JobSuspended
        );
        if !live && !job.is_terminal() {
            return Effect::Done;
        }
        job.state = pb::JobState::JobPending;
        job.start_time = None;
        job.end_time = None;
        job.exit_code = 0;
        job.reports.clear();
        job.oom_killed = false;
        if !live {
            // Its nodes were freed when it ended.
            job.state_reason = "None".to_owned();
            return Effect::Done;
        }
        job.state_reason = "BeginTime".to_owned();
        job.begin_time = Some(defer_until);
        let nodes = std::mem::take(&mut job.nodes);
        Effect::Stop(self.release_nodes(job_id, &nodes, 0))
    }

    /// [`Command::StartJob`]: a pending or just-running job without nodes takes `nodes`
    /// for run attempt `attempt`.
    fn start_job(&mut self, job_id: u32, nodes: &[String], attempt: u32, at: SystemTime) -> Effect {
        let Some(job) = self.jobs.get_mut(&job_id) else {
            return Effect::Done;
        };
        if !matches!(
            job.state,
            pb::JobState::JobPending | pb::JobState::JobRunning
        ) || !job.nodes.is_empty()
        {
            return Effect::Done;
        }
        job.state = pb::JobState::JobRunning;
        job.state_reason = String::new();
        job.start_time.get_or_insert(at);
        job.nodes = nodes.to_vec();
        job.reports.clear();
        job.oom_killed = false;
        job.attempt = attempt;
        for name in nodes {
            if let Some(node) = self.nodes.get_mut(name) {
                node.running_job = Some(job_id);
                if node.state == pb::NodeState::NodeIdle {
                    node.state = pb::NodeState::NodeAllocated;
                }
            }
        }
        Effect::Done
    }

    /// [`Command::JobRunning`]: a pending job is RUNNING from `at`.
    fn job_running(&mut self, job_id: u32, at: SystemTime) -> Effect {
        if let Some(job) = self.jobs.get_mut(&job_id)
            && job.state == pb::JobState::JobPending
        {
            job.state = pb::JobState::JobRunning;
            job.state_reason = String::new();
            job.start_time = Some(at);
        }
        Effect::Done
    }

    /// [`Command::DispatchFailed`]: the pending job waits until `retry_at`, or is held
    /// when one more fails after `max_requeue` retries.
    fn dispatch_failed(
        &mut self,
        job_id: u32,
        detail: &str,
        retry_at: SystemTime,
        max_requeue: u32,
    ) -> Effect {
        let Some(job) = self.jobs.get_mut(&job_id) else {
            return Effect::Done;
        };
        if job.state != pb::JobState::JobPending {
            return Effect::Done;
        }
        // spurctld holds a job whose failures already reached the limit when one more
        // fails: `max_requeue` backed-off retries, then the hold at the next failure.
        if job.requeue_count >= max_requeue {
            job.held = true;
            job.state_reason = "JobHoldMaxRequeue".to_owned();
        } else {
            job.requeue_count += 1;
            job.begin_time = Some(retry_at);
            job.state_reason = format!("JobLaunchFailure ({detail})");
        }
        Effect::Done
    }

    /// [`Command::ReportJobStatus`]: records one node's exit; the first report moves a
    /// running job to COMPLETING, the last one ends it and frees its nodes.
    fn report_job_status(
        &mut self,
        job_id: u32,
        node: &String,
        exit_code: i32,
        oom: bool,
        run_attempt: u32,
        at: SystemTime,
    ) -> Effect {
        let Some(job) = self.jobs.get_mut(&job_id) else {
            return Effect::Done;
        };
        // A finished job, or a report of an older attempt, is ignored.
        if job.is_terminal() || is_stale(run_attempt, job.attempt) {
            return Effect::Done;
        }
        if !job.nodes.contains(node) {
            return Effect::Done;
        }
        job.reports.insert(node.clone(), exit_code);
        job.oom_killed |= oom;
        if job.state == pb::JobState::JobRunning {
            job.state = pb::JobState::JobCompleting;
            job.end_time = Some(at);
        }
        let all_reported = job.nodes.iter().all(|n| job.reports.contains_key(n));
        if all_reported {
            let (state, reason, primary) = job.reported_result();
            job.end(state, reason, primary, at);
            let nodes = job.nodes.clone();
            self.release_nodes(job_id, &nodes, 0);
        }
        Effect::Done
    }

    /// [`Command::NodesNotResponding`]: the nodes go DOWN and their jobs NODE_FAIL, their
    /// agents told to stop with SIGKILL.
    fn nodes_not_responding(&mut self, names: &[String], at: SystemTime) -> Effect {
        for name in names {
            if let Some(node) = self.nodes.get_mut(name) {
                node.state = pb::NodeState::NodeDown;
                node.reason = "Not responding".to_owned();
            }
        }
        Effect::Stop(self.fail_jobs_on(names, "NodeDown", Some((at, 9))))
    }

    /// [`Command::NodesRecovered`]: each recoverable node is IDLE again, or ALLOCATED
    /// while a job holds it.
    fn nodes_recovered(&mut self, names: &[String]) -> Effect {
        for name in names {
            if let Some(node) = self.nodes.get_mut(name)
                && node.recoverable()
            {
                node.state = if node.running_job.is_some() {
                    pb::NodeState::NodeAllocated
                } else {
                    pb::NodeState::NodeIdle
                };
                node.reason.clear();
            }
        }
        Effect::Done
    }

    /// Fails every running job on `names` (NODE_FAIL, exit -1) and frees their nodes; with
    /// `stop`, the agents of those nodes are told to stop it with that signal.
    fn fail_jobs_on(
        &mut self,
        names: &[String],
        reason: &str,
        stop: Option<(SystemTime, i32)>,
    ) -> Vec<AgentStop> {
        let at = stop.map_or_else(crate::clock::epoch, |(at, _)| at);
        let failed: Vec<u32> = self
            .jobs
            .values()
            .filter(|job| {
                matches!(
                    job.state,
                    pb::JobState::JobRunning
                        | pb::JobState::JobCompleting
                        | pb::JobState::JobSuspended
                ) && job.nodes.iter().any(|n| names.contains(n))
            })
            .map(|job| job.id)
            .collect();
        let mut stops = Vec::new();
        for id in failed {
            let job = self.jobs.get_mut(&id).expect("listed");
            let end = job.end_time.unwrap_or(at);
            job.end(pb::JobState::JobNodeFail, reason, -1, end);
            let nodes = job.nodes.clone();
            let freed = self.release_nodes(id, &nodes, stop.map_or(0, |(_, s)| s));
            if stop.is_some() {
                stops.extend(freed);
            }
        }
        stops
    }

    /// Frees the nodes `job_id` held; returns the agent stops for them with `signal`.
    fn release_nodes(&mut self, job_id: u32, names: &[String], signal: i32) -> Vec<AgentStop> {
        let mut freed = Vec::new();
        for name in names {
            if let Some(node) = self.nodes.get_mut(name) {
                if node.running_job == Some(job_id) {
                    node.running_job = None;
                    if node.state == pb::NodeState::NodeAllocated {
                        node.state = pb::NodeState::NodeIdle;
                    }
                }
                freed.push(AgentStop {
                    job_id,
                    node: name.clone(),
                    address: node.address.clone(),
                    port: node.port,
                    signal,
                });
            }
        }
        freed
    }

    /// Pending jobs that may be dispatched at `now` onto idle nodes, with the nodes each
    /// gets (by name order).
    pub fn placements(&self, now: SystemTime) -> Vec<(u32, Vec<String>)> {
        let mut idle: Vec<&String> = self
            .nodes
            .iter()
            .filter(|(_, node)| node.state == pb::NodeState::NodeIdle && node.running_job.is_none())
            .map(|(name, _)| name)
            .collect();
        let mut placements = Vec::new();
        for job in self.jobs.values() {
            if job.state != pb::JobState::JobPending
                || job.held
                || job.begin_time.is_some_and(|t| t > now)
            {
                continue;
            }
            let wanted = job.spec.num_nodes.max(1) as usize;
            if wanted > idle.len() {
                continue;
            }
            let nodes = idle.drain(..wanted).cloned().collect();
            placements.push((job.id, nodes));
        }
        placements
    }

    /// Job `id` as GetJob shows it: its record, or for an array parent (which has none)
    /// an aggregate of its tasks, as spurctld synthesises it: the first task's spec, the
    /// tasks' aggregate state (PENDING until every task ended, then COMPLETED when all did,
    /// else the worst end), the earliest start, the latest end and the worst exit code.
    pub fn display(&self, id: u32) -> Option<pb::JobInfo> {
        if let Some(job) = self.jobs.get(&id) {
            return Some(job.info());
        }
        let mut tasks: Vec<&Job> = self
            .jobs
            .values()
            .filter(|j| j.array.is_some_and(|(parent, _)| parent == id))
            .collect();
        tasks.sort_by_key(|t| t.array.map(|(_, index)| index));
        let first = tasks.first()?;
        let mut parent = (*first).clone();
        parent.id = id;
        parent.nodes.clear();
        let ended = tasks.iter().all(|t| t.is_terminal());
        parent.state = if !ended {
            pb::JobState::JobPending
        } else if tasks.iter().all(|t| t.state == pb::JobState::JobCompleted) {
            pb::JobState::JobCompleted
        } else {
            let rank = |s: pb::JobState| match s {
                pb::JobState::JobOutOfMemory => 6,
                pb::JobState::JobFailed => 5,
                pb::JobState::JobDeadline => 4,
                pb::JobState::JobNodeFail => 3,
                pb::JobState::JobTimeout => 2,
                pb::JobState::JobCancelled => 1,
                _ => 0,
            };
            tasks
                .iter()
                .map(|t| t.state)
                .filter(|s| *s != pb::JobState::JobCompleted)
                .max_by_key(|s| rank(*s))
                .unwrap_or(pb::JobState::JobCompleted)
        };
        parent.start_time = tasks.iter().filter_map(|t| t.start_time).min();
        parent.end_time = if ended {
            tasks.iter().filter_map(|t| t.end_time).max()
        } else {
            None
        };
        parent.exit_code = if ended {
            tasks
                .iter()
                .map(|t| t.exit_code)
                .filter(|c| *c != 0)
                .max()
                .unwrap_or(0)
        } else {
            0
        };
        Some(parent.info())
    }

    /// Jobs matching a `GetJobs` request, by id; a requested id with no record may be an
    /// array parent, shown as [`StateMachine::display`] does. `name` is a comma-separated
    /// list of exact names.
    pub fn query(&self, request: &pb::GetJobsRequest) -> Vec<pb::JobInfo> {
        let names: Vec<&str> = request
            .name
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .collect();
        let matches = |info: &pb::JobInfo| {
            (request.states.is_empty() || request.states.contains(&info.state))
                && (names.is_empty() || names.contains(&info.name.as_str()))
                && (request.user.is_empty() || request.user == info.user)
                && (request.partition.is_empty() || request.partition == info.partition)
                && (request.account.is_empty() || request.account == info.account)
        };
        let mut found: Vec<pb::JobInfo> = self
            .jobs
            .values()
            .filter(|job| request.job_ids.is_empty() || request.job_ids.contains(&job.id))
            .map(Job::info)
            .filter(|info| matches(info))
            .collect();
        for id in &request.job_ids {
            if !self.jobs.contains_key(id)
                && let Some(parent) = self.display(*id)
                && matches(&parent)
            {
                found.push(parent);
            }
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at() -> SystemTime {
        crate::clock::epoch()
    }

    fn register(name: &str) -> Command {
        Command::RegisterNode {
            name: name.to_owned(),
            address: "operator".to_owned(),
            port: 6818,
            resources: pb::ResourceSet::default(),
            labels: BTreeMap::new(),
        }
    }

    fn submit(name: &str, nodes: u32) -> Command {
        Command::SubmitJob {
            spec: Box::new(pb::JobSpec {
                name: name.to_owned(),
                num_nodes: nodes,
                ..Default::default()
            }),
            at: at(),
        }
    }

    #[test]
    fn job_ids_increase_from_one() {
        let mut state = StateMachine::default();
        assert_eq!(state.apply(&submit("a", 1)), Effect::JobId(1));
        assert_eq!(state.apply(&submit("b", 1)), Effect::JobId(2));
    }

    #[test]
    fn a_job_completes_when_every_node_reported() {
        let mut state = StateMachine::default();
        state.apply(&register("n1"));
        state.apply(&register("n2"));
        state.apply(&submit("j", 2));
        let placements = state.placements(at());
        assert_eq!(
            placements,
            vec![(1, vec!["n1".to_owned(), "n2".to_owned()])]
        );
        state.apply(&Command::StartJob {
            job_id: 1,
            nodes: placements[0].1.clone(),
            attempt: 1,
            at: at(),
        });
        assert!(state.placements(at()).is_empty(), "nodes are allocated");
        let report = |node: &str, exit_code| Command::ReportJobStatus {
            job_id: 1,
            node: node.to_owned(),
            exit_code,
            oom: false,
            run_attempt: 1,
            at: at(),
        };
        state.apply(&report("n2", 3));
        assert_eq!(state.jobs[&1].state, pb::JobState::JobCompleting);
        state.apply(&report("n1", 0));
        // The first node decides the job's result.
        assert_eq!(state.jobs[&1].state, pb::JobState::JobCompleted);
        assert_eq!(state.jobs[&1].exit_code, 0);
        assert_eq!(state.nodes["n1"].state, pb::NodeState::NodeIdle);
    }

    #[test]
    fn unknown_nodes_and_jobs_are_refused() {
        let state = StateMachine::default();
        let update = Command::UpdateNode {
            name: "ghost".to_owned(),
            state: None,
            reason: None,
            labels: BTreeMap::new(),
            remove_labels: Vec::new(),
        };
        assert_eq!(
            state.check(&update).unwrap_err().code(),
            tonic::Code::Internal
        );
        let cancel = Command::CancelJob {
            job_id: 9,
            user: String::new(),
            at: at(),
        };
        let refused = state.check(&cancel).unwrap_err();
        assert_eq!(refused.code(), tonic::Code::Internal);
        assert_eq!(refused.message(), "job 9 not found");
    }

    #[test]
    fn an_array_takes_the_ids_after_its_parent_and_clones_the_comment() {
        let mut state = StateMachine::default();
        let mut spec = pb::JobSpec {
            name: "a".to_owned(),
            comment: "spurjob-uid=u".to_owned(),
            array_spec: "0-2".to_owned(),
            ..Default::default()
        };
        let parent = state.apply(&Command::SubmitJob {
            spec: Box::new(spec.clone()),
            at: at(),
        });
        assert_eq!(parent, Effect::JobId(1));
        assert!(!state.jobs.contains_key(&1));
        assert_eq!(state.jobs.keys().copied().collect::<Vec<_>>(), [2, 3, 4]);
        assert!(
            state
                .jobs
                .values()
                .all(|j| j.spec.comment == "spurjob-uid=u")
        );
        spec.array_spec.clear();
        assert_eq!(
            state.apply(&Command::SubmitJob {
                spec: Box::new(spec),
                at: at()
            }),
            Effect::JobId(5)
        );
    }

    #[test]
    fn array_specs_parse_as_spurctld_reads_them() {
        assert_eq!(array_tasks("0-3").unwrap(), [0, 1, 2, 3]);
        assert_eq!(array_tasks("1,4,7%2").unwrap(), [1, 4, 7]);
        assert_eq!(array_tasks("0-6:3").unwrap(), [0, 3, 6]);
        assert!(array_tasks("").is_err());
        assert!(array_tasks("3-1").is_err());
        assert!(array_tasks("0-4:0").is_err());
    }

    #[test]
    fn down_fails_the_running_job_and_drain_does_not() {
        for (node_state, expected) in [
            (pb::NodeState::NodeDown, pb::JobState::JobNodeFail),
            (pb::NodeState::NodeDrain, pb::JobState::JobRunning),
        ] {
            let mut state = StateMachine::default();
            state.apply(&register("n1"));
            state.apply(&submit("j", 1));
            state.apply(&Command::StartJob {
                job_id: 1,
                nodes: vec!["n1".to_owned()],
                attempt: 1,
                at: at(),
            });
            state.apply(&Command::UpdateNode {
                name: "n1".to_owned(),
                state: Some(node_state),
                reason: None,
                labels: BTreeMap::new(),
                remove_labels: Vec::new(),
            });
            assert_eq!(state.jobs[&1].state, expected, "{node_state:?}");
        }
    }
}
