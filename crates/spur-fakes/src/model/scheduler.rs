//! The leader's scheduler and health check, as spurctld's (docs/specs.md, fidelity rows
//! 1, 4 and 6):
//!
//! - pending jobs are placed on idle nodes and dispatched one job after another: a
//!   `LaunchJob` to every node of the allocation at once, with no connect or request
//!   bound (so one hung launch holds up all scheduling, as in spurctld);
//! - only when every node confirmed does the job become RUNNING; on any failure the nodes
//!   that launched are told to stop (signal 9), and the job stays PENDING until a backoff
//!   of 5 s doubling (capped at 300 s) has passed, held after 5 failures; the retry
//!   carries the same `run_attempt`;
//! - every 30 s the leader marks nodes whose heartbeats it has not heard for the timeout
//!   DOWN "Not responding", fails their jobs (NODE_FAIL) and tells their agents (signal 9),
//!   once a grace of the timeout (at least 30 s) counted from its first leading tick is over.

use std::time::Duration;

use spur_operator::net::Dialer;
use spur_proto as pb;
use spur_proto::SlurmAgentClient;
use tonic::transport::{Channel, Endpoint};

use super::Replica;
use super::cluster::Role;
use super::state::{AgentStop, Command, Effect};
use spur_operator::net::Connector;

/// One node of a dispatch.
#[derive(Clone, Debug)]
pub struct DispatchNode {
    pub name: String,
    /// Where the node's agent listens (from its registration).
    pub address: String,
    pub port: u32,
}

/// One job's dispatch: a `LaunchJob` per node.
#[derive(Clone, Debug)]
pub struct Dispatch {
    pub job_id: u32,
    /// The job's run attempt + 1 (a failed dispatch does not change the job's attempt, so
    /// its retry carries the same value).
    pub attempt: u32,
    /// Failed dispatches before this one (for the backoff).
    pub requeue_count: u32,
    pub spec: pb::JobSpec,
    /// For an array task: its parent's id and its index.
    pub array: Option<(u32, u32)>,
    /// In rank order.
    pub nodes: Vec<DispatchNode>,
}

impl Dispatch {
    /// The `LaunchJob` request for the node of rank `rank`: `peer_nodes` holds every
    /// node's agent socket, `spec.nodelist` the node names in rank order, `task_offset`
    /// the rank times the tasks per node.
    pub fn request(&self, rank: usize) -> pb::LaunchJobRequest {
        let spec = &self.spec;
        let num_nodes = spec.num_nodes.max(1);
        let tasks_per_node = if spec.tasks_per_node > 0 {
            spec.tasks_per_node
        } else {
            (spec.num_tasks / num_nodes).max(1)
        };
        let mut sent = spec.clone();
        sent.nodelist = self
            .nodes
            .iter()
            .map(|n| n.name.as_str())
            .collect::<Vec<_>>()
            .join(",");
        // spurctld sends the node's GPUs as one `gpu:` gres entry and clears the other
        // GPU request forms.
        let gpus = gpu_count(spec);
        sent.gres.retain(|g| !g.starts_with("gpu"));
        sent.gpus_per_node = None;
        if gpus > 0 {
            sent.gres.push(format!("gpu:{gpus}"));
        }
        pb::LaunchJobRequest {
            job_id: self.job_id,
            spec: Some(sent),
            allocated: None,
            peer_nodes: self
                .nodes
                .iter()
                .map(|n| format!("{}:{}", n.address, n.port))
                .collect(),
            task_offset: rank as u32 * tasks_per_node,
            target_node: self.nodes[rank].name.clone(),
            array_job_id: self.array.map_or(0, |(parent, _)| parent),
            array_task_id: self.array.map_or(0, |(_, index)| index),
            run_attempt: self.attempt,
        }
    }

    /// The CancelJob that tells `node`'s agent to stop this job with `signal`.
    fn stop(&self, node: &DispatchNode, signal: i32) -> AgentStop {
        AgentStop {
            job_id: self.job_id,
            node: node.name.clone(),
            address: node.address.clone(),
            port: node.port,
            signal,
        }
    }
}

/// GPUs per node a spec asks for, in whichever single form it uses.
fn gpu_count(spec: &pb::JobSpec) -> u64 {
    if let Some(request) = &spec.gpus_per_node {
        return u64::from(request.count);
    }
    spec.gres
        .iter()
        .filter_map(|g| g.strip_prefix("gpu:"))
        .filter_map(|rest| rest.rsplit(':').next()?.parse::<u64>().ok())
        .sum()
}

/// The wait after `failures` failed dispatches: 5 s doubling, capped.
fn backoff(base: Duration, max: Duration, failures: u32) -> Duration {
    base.saturating_mul(1u32 << failures.min(16)).min(max)
}

/// Runs the scheduler and health check of `replica` forever; they act only while the
/// replica leads. The health check is a task of its own, as in spurctld, so a dispatch
/// that hangs does not stop it.
pub async fn run<D: Dialer>(replica: Replica<D>) {
    tokio::spawn(health(replica.clone()));
    let interval = replica.cluster().config().schedule_interval;
    loop {
        tokio::time::sleep(interval).await;
        if replica.cluster().is_frozen(replica.slot())
            || replica.cluster().role(replica.slot()) != Role::Leader
        {
            continue;
        }
        evict(&replica).await;
        let at = (replica.clock().wall)();
        // One job after another, each waiting for all its nodes.
        for dispatch in replica.cluster().schedule(replica.slot(), at) {
            self::dispatch(&replica, dispatch).await;
        }
    }
}

/// spurctld's health check: a tick at start and every `health_tick` after (a tokio
/// interval), acting only on a leader whose grace is over.
async fn health<D: Dialer>(replica: Replica<D>) {
    let config = replica.cluster().config();
    let mut ticks = tokio::time::interval(config.health_tick);
    let mut grace = LeadershipGrace::new(config.heartbeat_timeout.max(config.health_tick));
    loop {
        ticks.tick().await;
        if replica.cluster().is_frozen(replica.slot()) {
            continue; // a stopped process's timer fires once it runs again
        }
        let leads = replica.cluster().role(replica.slot()) == Role::Leader;
        let may_mark_down = grace.over(leads, replica.now());
        if leads {
            health_check(&replica, may_mark_down).await;
        }
    }
}

/// The post-election grace of spurctld's health check, as spurctld keeps it: it counts
/// from the first tick at which the replica found itself leading, not from the election
/// (so up to one tick later), and restarts at any tick it does not lead. spurctld reads a
/// real clock at each tick, so a tick one period after the grace began may fall a hair
/// short and wait one more; the model's exact clock never does (the conformance case on
/// silent nodes bounds both).
#[derive(Debug)]
struct LeadershipGrace {
    grace: Duration,
    leading_since: Option<Duration>,
}

impl LeadershipGrace {
    fn new(grace: Duration) -> Self {
        Self {
            grace,
            leading_since: None,
        }
    }

    /// At a tick at `now`: whether a leader may mark nodes DOWN.
    fn over(&mut self, leads: bool, now: Duration) -> bool {
        if !leads {
            self.leading_since = None;
            return false;
        }
        let since = *self.leading_since.get_or_insert(now);
        now.saturating_sub(since) >= self.grace
    }
}

/// One tick of the health check on a leader: silent nodes go DOWN once the grace is over
/// (`may_mark_down`), and DOWN nodes heard from again come back at any tick, as spurctld's
/// `check_node_health` does (its grace holds back only the marking).
async fn health_check<D: Dialer>(replica: &Replica<D>, may_mark_down: bool) {
    let recovered = replica
        .cluster()
        .recovered_nodes(replica.slot(), replica.now());
    if !recovered.is_empty() {
        let _ = replica
            .commit(Command::NodesRecovered { names: recovered })
            .await;
    }
    if !may_mark_down {
        return;
    }
    let silent = replica
        .cluster()
        .silent_nodes(replica.slot(), replica.now());
    if silent.is_empty() {
        return;
    }
    let at = (replica.clock().wall)();
    if let Ok(Effect::Stop(stops)) = replica
        .commit(Command::NodesNotResponding { names: silent, at })
        .await
    {
        for stop in stops {
            let replica = replica.clone();
            tokio::spawn(async move { stop_on_agent(&replica, &stop).await });
        }
    }
}

async fn evict<D: Dialer>(replica: &Replica<D>) {
    let config = replica.cluster().config();
    let retention = config.terminal_retention.max(config.retention_floor);
    let Some(before) = (replica.clock().wall)().checked_sub(retention) else {
        return;
    };
    let due = replica.cluster().read(replica.slot(), |state| {
        state
            .jobs
            .values()
            .any(|j| j.is_terminal() && j.end_time.is_some_and(|t| t < before))
    });
    if due {
        let _ = replica.commit(Command::EvictJobs { before }).await;
    }
}

async fn agent_client<D: Dialer>(
    replica: &Replica<D>,
    address: &str,
    port: u32,
    bound: Option<Duration>,
) -> Result<SlurmAgentClient<Channel>, String> {
    let mut endpoint =
        Endpoint::from_shared(format!("http://{address}:{port}")).map_err(|e| e.to_string())?;
    if let Some(bound) = bound {
        endpoint = endpoint.connect_timeout(bound).timeout(bound);
    }
    let channel = endpoint
        .connect_with_connector(Connector::new(replica.dialer().clone()))
        .await
        .map_err(|e| format!("connect: {e}"))?;
    Ok(SlurmAgentClient::new(channel))
}

/// `message` as a call to an agent, with a bearer token when the replicas have an agent
/// key: spurctld's claims, valid 5 minutes.
fn agent_request<D: Dialer, T>(replica: &Replica<D>, message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(key) = &replica.cluster().config().agent_key {
        let iat = (crate::clock::EPOCH + replica.now()).as_secs();
        let token = spur_operator::sign_agent_token(
            key,
            &serde_json::json!({"sub": "spurctld", "uid": 0, "iat": iat, "exp": iat + 300,
                "admin": true}),
        );
        let value = format!("Bearer {token}")
            .parse()
            .expect("a token is visible ASCII");
        request.metadata_mut().insert("authorization", value);
    }
    request
}

/// One `LaunchJob`: `Ok` when the agent confirmed it.
async fn launch<D: Dialer>(
    replica: &Replica<D>,
    node: &DispatchNode,
    request: pb::LaunchJobRequest,
) -> Result<(), String> {
    let mut client = agent_client(replica, &node.address, node.port, None).await?;
    match client.launch_job(agent_request(replica, request)).await {
        Ok(response) if response.get_ref().success => Ok(()),
        Ok(response) => Err(format!("agent rejected job: {}", response.get_ref().error)),
        Err(status) => Err(format!("{:?} {}", status.code(), status.message())),
    }
}

/// Sends every node of `dispatch` its LaunchJob at once; the job starts when all confirmed,
/// else the dispatch fails and backs off.
async fn dispatch<D: Dialer>(replica: &Replica<D>, dispatch: Dispatch) {
    let launches = dispatch.nodes.iter().enumerate().map(|(rank, node)| {
        let request = dispatch.request(rank);
        async move { launch(replica, node, request).await }
    });
    let results = futures::future::join_all(launches).await;
    for (node, result) in dispatch.nodes.iter().zip(&results) {
        let outcome = match result {
            Ok(()) => "ok".to_owned(),
            Err(e) => e.clone(),
        };
        replica.record(format!(
            "LaunchJob job {} on {} attempt {}: {outcome}",
            dispatch.job_id, node.name, dispatch.attempt
        ));
    }
    let confirmed: Vec<&DispatchNode> = dispatch
        .nodes
        .iter()
        .zip(&results)
        .filter(|(_, r)| r.is_ok())
        .map(|(n, _)| n)
        .collect();
    if confirmed.len() == dispatch.nodes.len() {
        start_confirmed(replica, &dispatch).await;
    } else {
        fail_dispatch(replica, &dispatch, &confirmed).await;
    }
}

/// Every node confirmed: commits JOB RUNNING, then the job's nodes. A job that did not
/// start (cancelled meanwhile, or the replica lost the lead) is stopped on every agent.
async fn start_confirmed<D: Dialer>(replica: &Replica<D>, dispatch: &Dispatch) {
    let at = (replica.clock().wall)();
    let running = Command::JobRunning {
        job_id: dispatch.job_id,
        at,
    };
    let start = Command::StartJob {
        job_id: dispatch.job_id,
        nodes: dispatch.nodes.iter().map(|n| n.name.clone()).collect(),
        attempt: dispatch.attempt,
        at,
    };
    let started = match replica.commit(running).await {
        Ok(_) => replica.commit(start).await.map(|_| ()),
        Err(status) => Err(status),
    };
    // A job cancelled while its dispatch ran does not start: spurctld's start_job
    // fails, and the agents are told to stop it.
    let running = started.is_ok()
        && replica.cluster().read(replica.slot(), |state| {
            state
                .jobs
                .get(&dispatch.job_id)
                .is_some_and(|job| job.state == pb::JobState::JobRunning && !job.nodes.is_empty())
        });
    if !running {
        // Confirmed but not started (the replica lost the lead): the agents stop it.
        for node in &dispatch.nodes {
            stop_on_agent(replica, &dispatch.stop(node, 0)).await;
        }
    }
}

/// Some node did not confirm: the confirmed ones are told to stop (SIGKILL) and the job
/// waits out its backoff, or is held after too many failures.
async fn fail_dispatch<D: Dialer>(
    replica: &Replica<D>,
    dispatch: &Dispatch,
    confirmed: &[&DispatchNode],
) {
    for node in confirmed {
        stop_on_agent(replica, &dispatch.stop(node, 9)).await;
    }
    let config = replica.cluster().config();
    let wait = backoff(
        config.dispatch_backoff,
        config.dispatch_backoff_max,
        dispatch.requeue_count,
    );
    let failed = Command::DispatchFailed {
        job_id: dispatch.job_id,
        detail: format!(
            "dispatch confirmation failed: {} of {} nodes confirmed",
            confirmed.len(),
            dispatch.nodes.len()
        ),
        retry_at: (replica.clock().wall)() + wait,
        max_requeue: config.max_batch_requeue,
    };
    // A replica that lost the lead meanwhile leaves the job to the new leader.
    let _ = replica.commit(failed).await;
}

/// Tells the agent of `stop.node` to stop `stop.job_id`, bounded as spurctld bounds it.
pub(super) async fn stop_on_agent<D: Dialer>(replica: &Replica<D>, stop: &AgentStop) {
    let bound = replica.cluster().config().agent_cancel_timeout;
    let call = async {
        let mut client = agent_client(replica, &stop.address, stop.port, Some(bound)).await?;
        client
            .cancel_job(agent_request(
                replica,
                pb::AgentCancelJobRequest {
                    job_id: stop.job_id,
                    signal: stop.signal,
                },
            ))
            .await
            .map(|_| ())
            .map_err(|status| format!("{:?} {}", status.code(), status.message()))
    };
    let outcome = match tokio::time::timeout(bound, call).await {
        Ok(Ok(())) => "ok".to_owned(),
        Ok(Err(error)) => error,
        Err(_) => format!("no answer in {bound:?}"),
    };
    replica.record(format!(
        "agent CancelJob job {} signal {} on {}: {outcome}",
        stop.job_id, stop.signal, stop.node
    ));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_from_5s_to_300s() {
        let waits: Vec<u64> = (0..8)
            .map(|n| backoff(Duration::from_secs(5), Duration::from_secs(300), n).as_secs())
            .collect();
        assert_eq!(waits, [5, 10, 20, 40, 80, 160, 300, 300]);
    }

    #[test]
    fn a_launch_names_sockets_as_peers_and_names_in_the_spec() {
        let node = |name: &str| DispatchNode {
            name: name.to_owned(),
            address: "10.0.0.5".to_owned(),
            port: 6818,
        };
        let dispatch = Dispatch {
            job_id: 7,
            attempt: 1,
            requeue_count: 0,
            array: None,
            spec: pb::JobSpec {
                num_nodes: 2,
                tasks_per_node: 4,
                gpus_per_node: Some(pb::GpuRequest {
                    count: 2,
                    gpu_type: String::new(),
                }),
                ..Default::default()
            },
            nodes: vec![node("b"), node("a")],
        };
        let second = dispatch.request(1);
        assert_eq!(second.peer_nodes, ["10.0.0.5:6818", "10.0.0.5:6818"]);
        assert_eq!(second.task_offset, 4);
        assert_eq!(second.target_node, "a");
        let spec = second.spec.unwrap();
        assert_eq!(spec.nodelist, "b,a");
        assert_eq!(spec.gres, ["gpu:2"]);
        assert!(spec.gpus_per_node.is_none());
    }
}
