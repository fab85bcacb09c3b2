//! The replicated state machine: what every replica's copy of the log amounts to.
//!
//! Pure: commands carry the times they were proposed at, so every replica applying the
//! same log reaches the same state.

use std::collections::BTreeMap;
use std::time::SystemTime;

use spur_proto as pb;
use tonic::Status;

/// A command in the replicated log.
#[derive(Clone, Debug)]
pub enum Command {
    /// A node registered (or registered again: refreshes resources and address).
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
    /// A job submitted; it gets the next job id.
    SubmitJob {
        spec: Box<pb::JobSpec>,
        at: SystemTime,
    },
    /// A job cancelled.
    CancelJob { job_id: u32, at: SystemTime },
    /// The scheduler placed a job on nodes (run attempt `attempt`).
    StartJob {
        job_id: u32,
        nodes: Vec<String>,
        attempt: u32,
        at: SystemTime,
    },
    /// A `LaunchJob` of attempt `attempt` failed: the job goes back to pending.
    LaunchFailed { job_id: u32, attempt: u32 },
    /// One node's end of a job.
    ReportJobStatus {
        job_id: u32,
        node: String,
        exit_code: i32,
        at: SystemTime,
    },
    /// State loss: the controller forgets every registered node.
    ForgetNodes,
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
            Command::StartJob { job_id, nodes, .. } => {
                format!("start job {job_id} on {}", nodes.join(","))
            }
            Command::LaunchFailed { job_id, attempt } => {
                format!("launch of job {job_id} attempt {attempt} failed")
            }
            Command::ReportJobStatus {
                job_id,
                node,
                exit_code,
                ..
            } => format!("job {job_id} on {node} ended exit={exit_code}"),
            Command::ForgetNodes => "forget all nodes".to_owned(),
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
    pub outcome: Outcome,
}

/// What applying a command produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Nothing to report.
    Done,
    /// A submission's new job id.
    JobId(u32),
    /// A cancelled job whose nodes the agents must stop (name, address, port).
    Cancelled(Vec<(String, String, u32)>),
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
    /// The nodes of the current allocation, in placement order.
    pub nodes: Vec<String>,
    /// Exit codes reported so far, by node.
    pub reports: BTreeMap<String, i32>,
    pub exit_code: i32,
    /// Run attempt of the current allocation (1 for the first launch).
    pub attempt: u32,
}

impl Job {
    fn is_terminal(&self) -> bool {
        !matches!(
            self.state,
            pb::JobState::JobPending | pb::JobState::JobRunning
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
            nodelist: self.nodes.join(","),
            exit_code: self.exit_code,
            comment: self.spec.comment.clone(),
        }
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
}

impl Default for StateMachine {
    fn default() -> Self {
        Self {
            nodes: BTreeMap::new(),
            jobs: BTreeMap::new(),
            next_job_id: 1,
            applied: 0,
        }
    }
}

/// The answer to a heartbeat or update for a node the controller does not know.
pub fn node_not_found(name: &str) -> Status {
    Status::not_found(format!("node {name} not found — is the node registered?"))
}

impl StateMachine {
    /// Whether `command` may be appended, judged on the leader's state. A refusal is the
    /// answer the client gets.
    pub fn check(&self, command: &Command) -> Result<(), Status> {
        match command {
            Command::RegisterNode { name, .. } if name.is_empty() => {
                Err(Status::invalid_argument("hostname is empty"))
            }
            Command::UpdateNode { name, .. } if !self.nodes.contains_key(name) => {
                Err(node_not_found(name))
            }
            Command::CancelJob { job_id, .. } | Command::ReportJobStatus { job_id, .. }
                if !self.jobs.contains_key(job_id) =>
            {
                Err(Status::not_found(format!("job {job_id} not found")))
            }
            _ => Ok(()),
        }
    }

    /// Applies one command. Commands were checked before they were appended; anything
    /// that no longer fits (a report for a cancelled job) is ignored.
    pub fn apply(&mut self, command: &Command) -> Outcome {
        self.applied += 1;
        match command {
            Command::RegisterNode {
                name,
                address,
                port,
                resources,
                labels,
            } => {
                let node = self.nodes.entry(name.clone()).or_insert_with(|| Node {
                    address: String::new(),
                    port: 0,
                    resources: pb::ResourceSet::default(),
                    labels: BTreeMap::new(),
                    state: pb::NodeState::NodeIdle,
                    reason: String::new(),
                    running_job: None,
                });
                node.address = address.clone();
                node.port = *port;
                node.resources = resources.clone();
                node.labels = labels.clone();
                Outcome::Done
            }
            Command::UpdateNode {
                name,
                state,
                reason,
                labels,
                remove_labels,
            } => {
                if let Some(node) = self.nodes.get_mut(name) {
                    if let Some(state) = state {
                        node.state = *state;
                    }
                    if let Some(reason) = reason {
                        node.reason = reason.clone();
                    }
                    node.labels.extend(labels.clone());
                    for key in remove_labels {
                        node.labels.remove(key);
                    }
                }
                Outcome::Done
            }
            Command::SubmitJob { spec, at } => {
                let id = self.next_job_id;
                self.next_job_id += 1;
                self.jobs.insert(
                    id,
                    Job {
                        id,
                        spec: spec.as_ref().clone(),
                        state: pb::JobState::JobPending,
                        state_reason: "Priority".to_owned(),
                        submit_time: *at,
                        start_time: None,
                        end_time: None,
                        nodes: Vec::new(),
                        reports: BTreeMap::new(),
                        exit_code: 0,
                        attempt: 0,
                    },
                );
                Outcome::JobId(id)
            }
            Command::CancelJob { job_id, at } => {
                let Some(job) = self.jobs.get_mut(job_id) else {
                    return Outcome::Done;
                };
                if job.is_terminal() {
                    return Outcome::Done;
                }
                job.state = pb::JobState::JobCancelled;
                job.state_reason = "cancelled".to_owned();
                job.end_time = Some(*at);
                let nodes = job.nodes.clone();
                let stops = self.release_nodes(*job_id, &nodes);
                Outcome::Cancelled(stops)
            }
            Command::StartJob {
                job_id,
                nodes,
                attempt,
                at,
            } => {
                let Some(job) = self.jobs.get_mut(job_id) else {
                    return Outcome::Done;
                };
                job.state = pb::JobState::JobRunning;
                job.state_reason = String::new();
                job.start_time = Some(*at);
                job.nodes = nodes.clone();
                job.reports.clear();
                job.attempt = *attempt;
                for name in nodes {
                    if let Some(node) = self.nodes.get_mut(name) {
                        node.running_job = Some(*job_id);
                        node.state = pb::NodeState::NodeAllocated;
                    }
                }
                Outcome::Done
            }
            Command::LaunchFailed { job_id, attempt } => {
                let Some(job) = self.jobs.get_mut(job_id) else {
                    return Outcome::Done;
                };
                if job.state != pb::JobState::JobRunning || job.attempt != *attempt {
                    return Outcome::Done;
                }
                job.state = pb::JobState::JobPending;
                job.state_reason = "launch failed".to_owned();
                job.start_time = None;
                let nodes = std::mem::take(&mut job.nodes);
                self.release_nodes(*job_id, &nodes);
                Outcome::Done
            }
            Command::ReportJobStatus {
                job_id,
                node,
                exit_code,
                at,
            } => {
                let Some(job) = self.jobs.get_mut(job_id) else {
                    return Outcome::Done;
                };
                if job.is_terminal() {
                    return Outcome::Done;
                }
                // A report without a node name stands for the job's only node.
                let node = if node.is_empty() && job.nodes.len() == 1 {
                    job.nodes[0].clone()
                } else {
                    node.clone()
                };
                job.reports.insert(node, *exit_code);
                let all_reported =
                    !job.nodes.is_empty() && job.nodes.iter().all(|n| job.reports.contains_key(n));
                if all_reported {
                    let failed = job.reports.values().find(|code| **code != 0).copied();
                    job.exit_code = failed.unwrap_or(0);
                    job.state = if failed.is_some() {
                        pb::JobState::JobFailed
                    } else {
                        pb::JobState::JobCompleted
                    };
                    job.end_time = Some(*at);
                    let nodes = job.nodes.clone();
                    self.release_nodes(*job_id, &nodes);
                }
                Outcome::Done
            }
            Command::ForgetNodes => {
                self.nodes.clear();
                Outcome::Done
            }
        }
    }

    /// Frees the nodes `job_id` held; returns (name, address, port) of each.
    fn release_nodes(&mut self, job_id: u32, names: &[String]) -> Vec<(String, String, u32)> {
        let mut freed = Vec::new();
        for name in names {
            if let Some(node) = self.nodes.get_mut(name) {
                if node.running_job == Some(job_id) {
                    node.running_job = None;
                    if node.state == pb::NodeState::NodeAllocated {
                        node.state = pb::NodeState::NodeIdle;
                    }
                }
                freed.push((name.clone(), node.address.clone(), node.port));
            }
        }
        freed
    }

    /// Pending jobs that fit on idle nodes now, with the nodes each gets (by name order).
    pub fn placements(&self) -> Vec<(u32, Vec<String>)> {
        let mut idle: Vec<&String> = self
            .nodes
            .iter()
            .filter(|(_, node)| node.state == pb::NodeState::NodeIdle && node.running_job.is_none())
            .map(|(name, _)| name)
            .collect();
        let mut placements = Vec::new();
        for job in self.jobs.values() {
            if job.state != pb::JobState::JobPending {
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

    /// Jobs matching a `GetJobs` request, by id.
    pub fn query(&self, request: &pb::GetJobsRequest) -> Vec<pb::JobInfo> {
        self.jobs
            .values()
            .filter(|job| {
                (request.states.is_empty() || request.states.contains(&(job.state as i32)))
                    && (request.job_ids.is_empty() || request.job_ids.contains(&job.id))
                    && (request.name.is_empty() || request.name == job.spec.name)
                    && (request.user.is_empty() || request.user == job.spec.user)
                    && (request.partition.is_empty() || request.partition == job.spec.partition)
                    && (request.account.is_empty() || request.account == job.spec.account)
            })
            .map(Job::info)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at() -> SystemTime {
        crate::determinism::epoch()
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
        assert_eq!(state.apply(&submit("a", 1)), Outcome::JobId(1));
        assert_eq!(state.apply(&submit("b", 1)), Outcome::JobId(2));
    }

    #[test]
    fn a_job_completes_when_every_node_reported() {
        let mut state = StateMachine::default();
        state.apply(&register("n1"));
        state.apply(&register("n2"));
        state.apply(&submit("j", 2));
        let placements = state.placements();
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
        assert!(state.placements().is_empty(), "nodes are allocated");
        let report = |node: &str, exit_code| Command::ReportJobStatus {
            job_id: 1,
            node: node.to_owned(),
            exit_code,
            at: at(),
        };
        state.apply(&report("n1", 0));
        assert_eq!(state.jobs[&1].state, pb::JobState::JobRunning);
        state.apply(&report("n2", 3));
        assert_eq!(state.jobs[&1].state, pb::JobState::JobFailed);
        assert_eq!(state.jobs[&1].exit_code, 3);
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
            tonic::Code::NotFound
        );
        let cancel = Command::CancelJob {
            job_id: 9,
            at: at(),
        };
        assert_eq!(
            state.check(&cancel).unwrap_err().code(),
            tonic::Code::NotFound
        );
    }
}
