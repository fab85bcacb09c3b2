//! The one long-lived client of spurctld.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex as SyncMutex};

use futures::future::BoxFuture;
use spur_proto as pb;
use tonic::metadata::{AsciiMetadataValue, MetadataMap};
use tonic::transport::Channel;
use tonic::{Code, Request, Response, Status};

use super::address::ControllerAddr;
use super::connect::connect;
use super::error::{ConnectError, ControllerError, FailureKind, classify, status_text};
use crate::config::ChannelConfig;
use crate::metrics::Metrics;
use crate::net::Dialer;

type Connector = dyn Fn() -> BoxFuture<'static, Result<Channel, ConnectError>> + Send + Sync;

/// The operator's client of spurctld: cheap to clone, safe to share between tasks.
///
/// It holds at most one channel. A call that fails with a transport failure (UNAVAILABLE,
/// UNKNOWN, CANCELLED, DEADLINE_EXCEEDED, or a failed connect) drops that channel, and the
/// next call connects afresh: a request bound alone would cancel the call but leave the
/// next one waiting on the same dead connection (the seed's runs 3 and 5). An answer such
/// as NOT_FOUND keeps the channel.
///
/// With a connect probe, each new channel is first Pinged: the answer's hostname names
/// whose state the channel's reads come from. When a write went unanswered within the
/// request bound while a Ping on the same channel is answered, that name is marked, and a
/// new channel whose probe names it (or fails) is dropped and dialed again, a few times
/// at most.
#[derive(Clone)]
pub struct ControllerClient {
    inner: Arc<Inner>,
}

struct Inner {
    addr: ControllerAddr,
    connector: Box<Connector>,
    max_message_bytes: usize,
    max_age: Option<std::time::Duration>,
    authorization: Option<AsciiMetadataValue>,
    /// Held across a connect, so concurrent callers share one connect instead of racing.
    slot: tokio::sync::Mutex<Slot>,
    /// Bound on the Ping that probes each new Service channel; `None`: no probe.
    probe: Option<std::time::Duration>,
    /// The view (probe hostname) of a channel whose write went unanswered, and when.
    stalled: SyncMutex<Option<(String, tokio::time::Instant)>>,
    leader_hint: SyncMutex<Option<String>>,
    stats: Counters,
    metrics: Option<Metrics>,
}

#[derive(Default)]
struct Slot {
    channel: Option<(u64, Channel)>,
    /// When the current channel was opened (for the maximum age).
    opened: Option<tokio::time::Instant>,
    /// Generation of the next channel, so a late failure on an old channel cannot drop a
    /// newer one.
    next_generation: u64,
}

impl Slot {
    fn expired(&self, max_age: Option<std::time::Duration>) -> bool {
        match (max_age, self.opened) {
            (Some(max_age), Some(opened)) => opened.elapsed() >= max_age,
            _ => false,
        }
    }

    /// Keeps `channel` as the one every call shares, from now.
    fn keep(&mut self, generation: u64, channel: Channel) {
        self.channel = Some((generation, channel));
        self.opened = Some(tokio::time::Instant::now());
    }
}

/// Dials through the Service for one channel when the probe turns channels down; the
/// last one is kept whatever its probe said, so a wrong verdict costs a few dials, never
/// the channel.
const PROBE_DIALS: usize = 4;

/// How long a view whose write went unanswered is avoided. A cut replica stays cut for
/// as long as the partition lasts; once it rejoins, its reads forward to the leader and
/// its probe names the leader, so a long memory costs nothing then.
const STALL_MEMORY: std::time::Duration = std::time::Duration::from_secs(30);

/// Whether a call changes state (only the Raft leader applies it; wire.md).
fn is_write(method: &str) -> bool {
    matches!(
        method,
        "RegisterAgent"
            | "Heartbeat"
            | "UpdateNode"
            | "SubmitJob"
            | "CancelJob"
            | "ReportJobStatus"
    )
}

#[derive(Default)]
struct Counters {
    connects: AtomicU64,
    connect_failures: AtomicU64,
    drops: AtomicU64,
}

/// How often the client connected and dropped its channel.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClientStats {
    pub connects: u64,
    pub connect_failures: u64,
    pub drops: u64,
}

impl ControllerClient {
    /// A client of `addr` that connects through `dialer` with the bounds of `config`. No
    /// connection is opened until the first call. `token`, when set, is sent as
    /// `authorization: Bearer <token>` on every call.
    pub fn new<D: Dialer>(
        addr: ControllerAddr,
        config: ChannelConfig,
        token: Option<&str>,
        dialer: D,
    ) -> Result<Self, ControllerError> {
        let authorization = token
            .map(|t| {
                format!("Bearer {t}")
                    .parse::<AsciiMetadataValue>()
                    .map_err(|_| ControllerError::Connect {
                        addr: addr.to_string(),
                        source: ConnectError::Other(
                            "the bearer token holds characters a header cannot carry".into(),
                        ),
                    })
            })
            .transpose()?;
        let max_message_bytes = config.max_message_bytes;
        let max_age = config.max_age;
        let probe = config.connect_probe;
        let target = addr.clone();
        let connector: Box<Connector> = Box::new(move || {
            let (target, config, dialer) = (target.clone(), config.clone(), dialer.clone());
            Box::pin(async move { connect(&target, &config, dialer).await })
        });
        Ok(ControllerClient {
            inner: Arc::new(Inner {
                addr,
                connector,
                max_message_bytes,
                max_age,
                authorization,
                slot: tokio::sync::Mutex::new(Slot::default()),
                probe,
                stalled: SyncMutex::new(None),
                leader_hint: SyncMutex::new(None),
                stats: Counters::default(),
                metrics: None,
            }),
        })
    }

    /// Exports calls, connects and drops to `metrics`. Call before sharing the client.
    pub fn with_metrics(mut self, metrics: Metrics) -> Self {
        Arc::get_mut(&mut self.inner)
            .expect("with_metrics is called before the client is cloned")
            .metrics = Some(metrics);
        self
    }

    pub fn addr(&self) -> &ControllerAddr {
        &self.inner.addr
    }

    pub fn stats(&self) -> ClientStats {
        let c = &self.inner.stats;
        ClientStats {
            connects: c.connects.load(Ordering::Relaxed),
            connect_failures: c.connect_failures.load(Ordering::Relaxed),
            drops: c.drops.load(Ordering::Relaxed),
        }
    }

    /// The leader named by the last UNAVAILABLE answer that carried `x-spur-leader`.
    pub fn leader_hint(&self) -> Option<String> {
        self.inner
            .leader_hint
            .lock()
            .expect("leader hint lock")
            .clone()
    }

    /// Whether a channel is open (for readiness and tests).
    pub async fn is_connected(&self) -> bool {
        self.inner.slot.lock().await.channel.is_some()
    }

    pub async fn ping(&self) -> Result<pb::PingResponse, ControllerError> {
        self.call("Ping", (), |mut c, r| async move { c.ping(r).await })
            .await
    }

    pub async fn register_agent(
        &self,
        request: pb::RegisterAgentRequest,
    ) -> Result<pb::RegisterAgentResponse, ControllerError> {
        self.call("RegisterAgent", request, |mut c, r| async move {
            c.register_agent(r).await
        })
        .await
    }

    pub async fn heartbeat(
        &self,
        request: pb::HeartbeatRequest,
    ) -> Result<pb::HeartbeatResponse, ControllerError> {
        self.call("Heartbeat", request, |mut c, r| async move {
            c.heartbeat(r).await
        })
        .await
    }

    pub async fn update_node(&self, request: pb::UpdateNodeRequest) -> Result<(), ControllerError> {
        self.call("UpdateNode", request, |mut c, r| async move {
            c.update_node(r).await
        })
        .await
    }

    pub async fn submit_job(
        &self,
        request: pb::SubmitJobRequest,
    ) -> Result<pb::SubmitJobResponse, ControllerError> {
        self.call("SubmitJob", request, |mut c, r| async move {
            c.submit_job(r).await
        })
        .await
    }

    pub async fn get_job(&self, job_id: u32) -> Result<pb::JobInfo, ControllerError> {
        let request = pb::GetJobRequest { job_id };
        self.call(
            "GetJob",
            request,
            |mut c, r| async move { c.get_job(r).await },
        )
        .await
    }

    pub async fn get_jobs(
        &self,
        request: pb::GetJobsRequest,
    ) -> Result<pb::GetJobsResponse, ControllerError> {
        self.call(
            "GetJobs",
            request,
            |mut c, r| async move { c.get_jobs(r).await },
        )
        .await
    }

    pub async fn cancel_job(&self, request: pb::CancelJobRequest) -> Result<(), ControllerError> {
        self.call("CancelJob", request, |mut c, r| async move {
            c.cancel_job(r).await
        })
        .await
    }

    pub async fn report_job_status(
        &self,
        request: pb::ReportJobStatusRequest,
    ) -> Result<(), ControllerError> {
        self.call("ReportJobStatus", request, |mut c, r| async move {
            c.report_job_status(r).await
        })
        .await
    }

    /// Runs one RPC on the current channel (connecting first if there is none) and
    /// applies the channel rule to its outcome.
    async fn call<Req, Resp, F, Fut>(
        &self,
        method: &'static str,
        message: Req,
        rpc: F,
    ) -> Result<Resp, ControllerError>
    where
        F: FnOnce(pb::SlurmControllerClient<Channel>, Request<Req>) -> Fut,
        Fut: Future<Output = Result<Response<Resp>, Status>>,
    {
        let started = tokio::time::Instant::now();
        let result = self.call_once(method, message, rpc).await;
        if let Some(metrics) = &self.inner.metrics {
            let code = result
                .as_ref()
                .err()
                .map_or(Code::Ok, ControllerError::code);
            metrics.observe_rpc(method, code, started.elapsed());
        }
        result
    }

    async fn call_once<Req, Resp, F, Fut>(
        &self,
        method: &'static str,
        message: Req,
        rpc: F,
    ) -> Result<Resp, ControllerError>
    where
        F: FnOnce(pb::SlurmControllerClient<Channel>, Request<Req>) -> Fut,
        Fut: Future<Output = Result<Response<Resp>, Status>>,
    {
        let (generation, channel) = self.channel().await?;
        let client = pb::SlurmControllerClient::new(channel.clone())
            .max_decoding_message_size(self.inner.max_message_bytes)
            .max_encoding_message_size(self.inner.max_message_bytes);
        let mut request = Request::new(message);
        if let Some(auth) = &self.inner.authorization {
            request.metadata_mut().insert("authorization", auth.clone());
        }
        match rpc(client, request).await {
            Ok(response) => Ok(response.into_inner()),
            Err(status) => {
                let leader_hint = leader_hint(status.metadata());
                if status.code() == Code::Unavailable && leader_hint.is_some() {
                    *self.inner.leader_hint.lock().expect("leader hint lock") = leader_hint.clone();
                }
                let error = ControllerError::Status {
                    method,
                    code: status.code(),
                    // The causes say which bound fired (e.g. "keep-alive timed out").
                    message: status_text(&status),
                    leader_hint,
                };
                if classify(status.code()) == FailureKind::Transport {
                    // A write the replica took and never answered within the bound: if it
                    // still answers a read on the same channel, it serves reads it cannot
                    // back with commits (a leader cut off from its peers), and the name its
                    // Ping gives is avoided for a while. A replica whose reads hang too (a
                    // follower whose forward hangs) is not named: the probe of any new
                    // channel to it fails anyway, and the name it would give is the
                    // leader's, which every healthy replica gives too.
                    let unanswered_write = is_write(method)
                        && matches!(status.code(), Code::Cancelled | Code::DeadlineExceeded);
                    let stalled = match self.inner.probe {
                        Some(bound) if unanswered_write => self.probe(channel, bound).await.ok(),
                        _ => None,
                    };
                    self.drop_channel(generation, stalled, &error).await;
                }
                Err(error)
            }
        }
    }

    /// The open channel, or a new one through the Service, probed when a probe is set.
    async fn channel(&self) -> Result<(u64, Channel), ControllerError> {
        let mut slot = self.inner.slot.lock().await;
        if slot.expired(self.inner.max_age) && slot.channel.take().is_some() {
            tracing::debug!(addr = %self.inner.addr, "rotating the controller channel after its maximum age");
        }
        if let Some((generation, channel)) = &slot.channel {
            return Ok((*generation, channel.clone()));
        }
        let dials = if self.inner.probe.is_some() {
            PROBE_DIALS
        } else {
            1
        };
        for dial in 1..=dials {
            let (generation, channel) = self.open(&mut slot).await?;
            let Some(bound) = self.inner.probe else {
                slot.keep(generation, channel.clone());
                return Ok((generation, channel));
            };
            let view = self.probe(channel.clone(), bound).await;
            let refused = match &view {
                Ok(view) => self
                    .is_stalled(view)
                    .then(|| format!("its reads come from {view}, whose writes went unanswered")),
                Err(error) => Some(format!("its probe failed: {error}")),
            };
            match refused {
                Some(why) if dial < dials => {
                    tracing::info!(addr = %self.inner.addr, dial, %why, "turning a new controller channel down; dialing again");
                }
                _ => {
                    slot.keep(generation, channel.clone());
                    return Ok((generation, channel));
                }
            }
        }
        unreachable!("the last dial returns")
    }

    /// Pings over a new channel within `bound`: the hostname that answered.
    async fn probe(&self, channel: Channel, bound: std::time::Duration) -> Result<String, String> {
        let mut client = pb::SlurmControllerClient::new(channel);
        let mut request = Request::new(());
        request.set_timeout(bound);
        if let Some(auth) = &self.inner.authorization {
            request.metadata_mut().insert("authorization", auth.clone());
        }
        match tokio::time::timeout(bound, client.ping(request)).await {
            Ok(Ok(answer)) => Ok(answer.into_inner().hostname),
            Ok(Err(status)) => Err(format!("{:?} {}", status.code(), status.message())),
            Err(_) => Err(format!("no answer within {bound:?}")),
        }
    }

    fn is_stalled(&self, view: &str) -> bool {
        matches!(&*self.inner.stalled.lock().expect("stalled lock"),
            Some((stalled, at)) if stalled == view && at.elapsed() < STALL_MEMORY)
    }

    /// A new channel with its generation. The caller keeps it in `slot` only once its probe
    /// accepted it: a caller cancelled mid-probe (a readiness probe's bound, a request's)
    /// must not leave an unvetted channel behind for every other call to use.
    async fn open(&self, slot: &mut Slot) -> Result<(u64, Channel), ControllerError> {
        match (self.inner.connector)().await {
            Ok(channel) => {
                let generation = slot.next_generation;
                slot.next_generation += 1;
                self.inner.stats.connects.fetch_add(1, Ordering::Relaxed);
                if let Some(m) = &self.inner.metrics {
                    m.channel_connects.inc();
                }
                tracing::debug!(addr = %self.inner.addr, generation, "connected to spurctld");
                Ok((generation, channel))
            }
            Err(source) => {
                self.inner
                    .stats
                    .connect_failures
                    .fetch_add(1, Ordering::Relaxed);
                if let Some(m) = &self.inner.metrics {
                    m.channel_connect_failures.inc();
                }
                Err(ControllerError::Connect {
                    addr: self.inner.addr.to_string(),
                    source,
                })
            }
        }
    }

    /// Drops the channel of `generation` after a transport failure. `stalled` names the
    /// replica's view when a write went unanswered while reads were answered: it is
    /// avoided for a while.
    async fn drop_channel(
        &self,
        generation: u64,
        stalled: Option<String>,
        cause: &ControllerError,
    ) {
        let mut slot = self.inner.slot.lock().await;
        if matches!(slot.channel, Some((current, _)) if current == generation) {
            slot.channel = None;
            if let Some(view) = stalled {
                tracing::warn!(%view, "a write went unanswered on a channel whose reads {view} answers; avoiding it");
                *self.inner.stalled.lock().expect("stalled lock") =
                    Some((view, tokio::time::Instant::now()));
            }
            self.inner.stats.drops.fetch_add(1, Ordering::Relaxed);
            if let Some(m) = &self.inner.metrics {
                m.channel_drops.inc();
            }
            // Once per channel: concurrent calls failing on the same dead connection find
            // the slot already empty and stay quiet.
            tracing::warn!(addr = %self.inner.addr, %cause, "dropping the controller channel; the next call connects afresh");
        }
    }
}

fn leader_hint(metadata: &MetadataMap) -> Option<String> {
    metadata
        .get(spur_proto::LEADER_HINT_KEY)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(str::to_owned)
}
