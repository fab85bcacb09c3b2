//! `spur-sim lab-limits`: what the real spurctld can take. Drives one replica, or the
//! leader of three under Raft, with each call the operator makes (RegisterAgent, Heartbeat,
//! SubmitJob, GetJobs), as fast as it answers: a closed loop of `--concurrency` callers
//! sharing one HTTP/2 channel, as the operator's calls share one, for `--duration` a kind.
//! Every RegisterAgent names a new node (an unchanged re-registration makes no proposal),
//! every SubmitJob a job that stays queued.
//! Prints each kind's answered calls a second and latencies; the operator's rates are
//! judged against these (`lab-bench`). A benchmark: its figures are wall-clock.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use spur_operator::status_text;
use spur_proto as pb;
use tonic::transport::Channel;

use crate::real_peer::{RealCluster, RealConfig};

#[derive(Debug, clap::Args)]
pub struct LimitsArgs {
    /// 1, or 3 under Raft (the leader is driven: writes through a follower are forwarded).
    #[arg(long, default_value_t = 3)]
    pub replicas: usize,
    /// Callers in flight at once. Default 16: the answered rate of one replica stops
    /// growing past 8 to 16; at 64 on one channel many calls fail with a transport error.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// How long each call kind is driven. Default 10 s: long enough for Raft's batching to
    /// settle, short enough to run all four kinds in under a minute.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Each call's deadline. Default 5 s, the operator's own write bound.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub deadline: Duration,
    /// One JSON object a kind instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// The call kinds, in the order they are driven: nodes first, so heartbeats have nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallKind {
    RegisterAgent,
    Heartbeat,
    SubmitJob,
    GetJobs,
}

impl CallKind {
    const ALL: [CallKind; 4] = [
        CallKind::RegisterAgent,
        CallKind::Heartbeat,
        CallKind::SubmitJob,
        CallKind::GetJobs,
    ];

    fn name(self) -> &'static str {
        match self {
            CallKind::RegisterAgent => "RegisterAgent",
            CallKind::Heartbeat => "Heartbeat",
            CallKind::SubmitJob => "SubmitJob",
            CallKind::GetJobs => "GetJobs",
        }
    }
}

/// What driving one kind measured.
#[derive(Clone, Debug)]
pub struct Limit {
    pub kind: CallKind,
    pub answered: u64,
    pub refused: u64,
    pub per_second: f64,
    pub p50: Duration,
    pub p99: Duration,
    /// The first refusal's code and message, if any.
    pub first_refusal: Option<String>,
}

pub fn main(args: LimitsArgs) -> anyhow::Result<bool> {
    anyhow::ensure!(
        args.replicas == 1 || args.replicas == 3,
        "--replicas must be 1 or 3, not {}",
        args.replicas
    );
    anyhow::ensure!(args.concurrency > 0, "--concurrency must be at least 1");
    let binary = crate::real_peer::binary()
        .ok_or_else(|| anyhow::anyhow!("the real spurctld was not found (set SPURCTLD)"))?;
    let config = RealConfig {
        replicas: args.replicas,
        ..RealConfig::default()
    };
    let cluster = RealCluster::start(&binary, config)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let limits = runtime.block_on(drive_all(&cluster, &args))?;
    for limit in &limits {
        println!("{}", render(limit, args.replicas, args.json));
    }
    Ok(limits.iter().all(|l| l.answered > 0))
}

/// Waits for a leader that takes writes, then drives each kind in turn.
async fn drive_all(cluster: &RealCluster, args: &LimitsArgs) -> anyhow::Result<Vec<Limit>> {
    let channel = leader_channel(cluster).await?;
    let mut limits = Vec::new();
    for kind in CallKind::ALL {
        limits.push(drive(kind, channel.clone(), args).await);
    }
    Ok(limits)
}

/// A channel to the replica that leads once a write succeeds through it (a fresh
/// three-replica cluster refuses writes between its first two terms).
async fn leader_channel(cluster: &RealCluster) -> anyhow::Result<Channel> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if let Some(slot) = cluster.leader() {
            let url = format!("http://{}", cluster.addr(slot));
            let channel = Channel::from_shared(url)?.connect().await?;
            let mut client = pb::SlurmControllerClient::new(channel.clone());
            if client.register_agent(registration(0)).await.is_ok() {
                return Ok(channel);
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    anyhow::bail!("no spurctld replica took a write within 30 s")
}

/// Drives `kind` from `args.concurrency` callers for `args.duration`.
async fn drive(kind: CallKind, channel: Channel, args: &LimitsArgs) -> Limit {
    let next = Arc::new(AtomicU64::new(0));
    let stop_at = Instant::now() + args.duration;
    let started = Instant::now();
    let callers: Vec<_> = (0..args.concurrency)
        .map(|_| {
            let client = pb::SlurmControllerClient::new(channel.clone());
            let next = next.clone();
            let deadline = args.deadline;
            tokio::spawn(caller_loop(kind, client, next, stop_at, deadline))
        })
        .collect();
    let mut tally = Tally::default();
    for caller in callers {
        if let Ok(one) = caller.await {
            tally.merge(one);
        }
    }
    tally.limit(kind, started.elapsed())
}

/// One caller's calls, back to back, until `stop_at`.
async fn caller_loop(
    kind: CallKind,
    mut client: pb::SlurmControllerClient<Channel>,
    next: Arc<AtomicU64>,
    stop_at: Instant,
    deadline: Duration,
) -> Tally {
    let mut tally = Tally::default();
    while Instant::now() < stop_at {
        let n = next.fetch_add(1, Ordering::Relaxed);
        let sent = Instant::now();
        let outcome = tokio::time::timeout(deadline, call(kind, &mut client, n)).await;
        match outcome {
            Ok(Ok(())) => tally.latencies.push(sent.elapsed()),
            // With its causes: tonic's message for a broken connection is only
            // "transport error"; the cause (a GOAWAY and its reason) is under it.
            Ok(Err(status)) => {
                tally.refuse(format!("{:?} {}", status.code(), status_text(&status)))
            }
            Err(_) => tally.refuse(format!("no answer within {deadline:?}")),
        }
    }
    tally
}

/// How many nodes the RegisterAgent phase spreads over: a re-registration of an unchanged
/// node makes no Raft proposal, so each call names a node not seen before, up to this many.
const NODES: u64 = 100_000;
/// The nodes the heartbeats go round: the first ones registered (a RegisterAgent phase
/// answered at a few hundred a second registers more than these in its first seconds;
/// a heartbeat of a node it did not reach is counted as refused, NOT_FOUND).
const HEARTBEAT_NODES: u64 = 1000;

async fn call(
    kind: CallKind,
    client: &mut pb::SlurmControllerClient<Channel>,
    n: u64,
) -> Result<(), tonic::Status> {
    match kind {
        CallKind::RegisterAgent => {
            client.register_agent(registration(n)).await?;
        }
        CallKind::Heartbeat => {
            let hostname = node_name(n % HEARTBEAT_NODES);
            let request = pb::HeartbeatRequest {
                hostname,
                ..Default::default()
            };
            client.heartbeat(request).await?;
        }
        CallKind::SubmitJob => {
            client.submit_job(submission(n)).await?;
        }
        CallKind::GetJobs => {
            let request = pb::GetJobsRequest {
                job_ids: vec![(n % 1000) as u32 + 1],
                ..Default::default()
            };
            client.get_jobs(request).await?;
        }
    }
    Ok(())
}

fn node_name(n: u64) -> String {
    format!("limit-{:06}", n % NODES)
}

fn registration(n: u64) -> pb::RegisterAgentRequest {
    pb::RegisterAgentRequest {
        hostname: node_name(n),
        resources: Some(pb::ResourceSet {
            cpus: 8,
            memory_mb: 16_384,
            ..Default::default()
        }),
        version: "spur-sim lab-limits".to_owned(),
        // Nobody serves it: a job scheduled there fails its launch, which the limits
        // avoid by asking more CPUs than any node has (below).
        address: "127.0.0.1".to_owned(),
        port: 1,
        ..Default::default()
    }
}

/// A job that stays queued: more CPUs per task than a node has, so the scheduler never
/// dispatches it and the phase measures submission alone.
fn submission(n: u64) -> pb::SubmitJobRequest {
    pb::SubmitJobRequest {
        spec: Some(pb::JobSpec {
            name: format!("limit-{n}"),
            num_nodes: 1,
            num_tasks: 1,
            tasks_per_node: 1,
            cpus_per_task: 1024,
            comment: format!("spurjob-uid=limit-{n}"),
            ..Default::default()
        }),
    }
}

/// Answers and refusals of one or more callers.
#[derive(Default)]
struct Tally {
    latencies: Vec<Duration>,
    refused: u64,
    first_refusal: Option<String>,
}

impl Tally {
    fn refuse(&mut self, why: String) {
        self.refused += 1;
        self.first_refusal.get_or_insert(why);
    }

    fn merge(&mut self, other: Tally) {
        self.latencies.extend(other.latencies);
        self.refused += other.refused;
        if self.first_refusal.is_none() {
            self.first_refusal = other.first_refusal;
        }
    }

    fn limit(mut self, kind: CallKind, took: Duration) -> Limit {
        self.latencies.sort();
        let at = |q: f64| {
            let i = ((self.latencies.len() as f64 - 1.0) * q).round() as usize;
            self.latencies.get(i).copied().unwrap_or_default()
        };
        let answered = self.latencies.len() as u64;
        Limit {
            kind,
            answered,
            refused: self.refused,
            per_second: answered as f64 / took.as_secs_f64().max(1e-9),
            p50: at(0.5),
            p99: at(0.99),
            first_refusal: self.first_refusal,
        }
    }
}

fn render(limit: &Limit, replicas: usize, json: bool) -> String {
    if json {
        return serde_json::json!({
            "replicas": replicas,
            "call": limit.kind.name(),
            "answered": limit.answered,
            "refused": limit.refused,
            "per_second": (limit.per_second * 10.0).round() / 10.0,
            "p50_ms": limit.p50.as_secs_f64() * 1e3,
            "p99_ms": limit.p99.as_secs_f64() * 1e3,
            "first_refusal": limit.first_refusal,
        })
        .to_string();
    }
    let refusal = limit
        .first_refusal
        .as_deref()
        .map(|r| format!("; first refusal: {r}"))
        .unwrap_or_default();
    format!(
        "{replicas} replica(s) {:<14} {:>8.1}/s  p50 {:>6.1} ms  p99 {:>6.1} ms  ({} answered, {} refused{refusal})",
        limit.kind.name(),
        limit.per_second,
        limit.p50.as_secs_f64() * 1e3,
        limit.p99.as_secs_f64() * 1e3,
        limit.answered,
        limit.refused,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tally_counts_answers_a_second_and_keeps_the_first_refusal() {
        let mut tally = Tally::default();
        tally.latencies.extend((1..=100).map(Duration::from_millis));
        tally.refuse("Unavailable not the Raft leader".into());
        tally.refuse("Internal later".into());
        let limit = tally.limit(CallKind::SubmitJob, Duration::from_secs(2));
        assert_eq!(limit.answered, 100);
        assert_eq!(limit.refused, 2);
        assert_eq!(limit.per_second, 50.0);
        assert_eq!(limit.p50, Duration::from_millis(51));
        assert_eq!(limit.p99, Duration::from_millis(99));
        assert_eq!(
            limit.first_refusal.as_deref(),
            Some("Unavailable not the Raft leader")
        );
    }
}
