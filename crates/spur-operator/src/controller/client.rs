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

type Connector =
    dyn Fn(ControllerAddr) -> BoxFuture<'static, Result<Channel, ConnectError>> + Send + Sync;

/// The operator's client of spurctld: cheap to clone, safe to share between tasks.
///
/// It holds at most one channel through the configured address (the Service). A call that
/// fails with a transport failure (UNAVAILABLE, UNKNOWN, CANCELLED, DEADLINE_EXCEEDED, or a
/// failed connect) drops that channel, and the next call connects afresh: a request bound
/// alone would cancel the call but leave the next one waiting on the same dead connection
/// (the seed's runs 3 and 5). An answer such as NOT_FOUND keeps the channel.
///
/// With `follow_leader`, a follower's `UNAVAILABLE` carrying `x-spur-leader` pins the
/// leader it names: every later call (writes and reads alike) goes over a second channel
/// to that address, opened through the same dialer with the same bounds. The pin is let
/// go, and calls go through the Service again, when a connect to the leader fails, when a
/// call on that channel fails in the transport, when the leader answers that it does not
/// lead without naming another, and when the channel reaches its maximum age. An address
/// whose pin failed is not pinned again for one maximum age (or 10 s), so a hint naming
/// a dead leader costs one failed connect, not one per call.
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
    follow_leader: bool,
    /// Bound on the Ping that probes each new Service channel; `None`: no probe.
    probe: Option<std::time::Duration>,
    /// The view (probe hostname) of a channel whose write went unanswered, and when.
    stalled: SyncMutex<Option<(String, tokio::time::Instant)>>,
    /// The channel to the leader named by a hint, while it is pinned.
    pinned: tokio::sync::Mutex<Pinned>,
    /// Generation of the next channel (of either kind), so a late failure on an old
    /// channel cannot drop a newer one.
    next_generation: AtomicU64,
    leader_hint: SyncMutex<Option<String>>,
    stats: Counters,
    metrics: Option<Metrics>,
}

#[derive(Default)]
struct Slot {
    channel: Option<(u64, Channel)>,
    /// When the current channel was opened (for the maximum age).
    opened: Option<tokio::time::Instant>,
    /// The `hostname` the connect probe's Ping answered on this channel: whose state its
    /// reads come from (the leader's, through a follower that can forward).
    view: Option<String>,
}

impl Slot {
    fn expired(&self, max_age: Option<std::time::Duration>) -> bool {
        match (max_age, self.opened) {
            (Some(max_age), Some(opened)) => opened.elapsed() >= max_age,
            _ => false,
        }
    }
}

/// The leader a hint named, and the channel to it.
#[derive(Default)]
struct Pinned {
    target: Option<ControllerAddr>,
    slot: Slot,
    /// The last address whose pin failed, and when: not pinned again for a while.
    failed: Option<(ControllerAddr, tokio::time::Instant)>,
}

/// Which channel a call went over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Route {
    Service,
    Leader,
}

/// How long an address whose pin failed is not pinned again, when channels have no
/// maximum age.
const REPIN_AFTER: std::time::Duration = std::time::Duration::from_secs(10);

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
        let follow_leader = config.follow_leader;
        let probe = config.connect_probe;
        let connector: Box<Connector> = Box::new(move |target: ControllerAddr| {
            let (config, dialer) = (config.clone(), dialer.clone());
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
                follow_leader,
                probe,
                stalled: SyncMutex::new(None),
                pinned: tokio::sync::Mutex::new(Pinned::default()),
                next_generation: AtomicU64::new(0),
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
            || self.inner.pinned.lock().await.slot.channel.is_some()
    }

    /// The leader calls are pinned to, if any (`host:port`).
    pub async fn pinned_leader(&self) -> Option<String> {
        self.inner
            .pinned
            .lock()
            .await
            .target
            .as_ref()
            .map(ControllerAddr::authority)
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
        let (route, generation, channel) = self.channel().await?;
        let client = pb::SlurmControllerClient::new(channel)
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
                let not_leader = status.code() == Code::Unavailable && leader_hint.is_some();
                if not_leader {
                    *self.inner.leader_hint.lock().expect("leader hint lock") = leader_hint.clone();
                }
                let error = ControllerError::Status {
                    method,
                    code: status.code(),
                    // The causes say which bound fired (e.g. "keep-alive timed out").
                    message: status_text(&status),
                    leader_hint: leader_hint.clone(),
                };
                if classify(status.code()) == FailureKind::Transport {
                    // A write the replica took and never answered within the bound, on a
                    // channel whose probe it answered: it cannot commit (a replica cut off
                    // from its peers). Its view is avoided for a while.
                    let stalled = is_write(method)
                        && matches!(status.code(), Code::Cancelled | Code::DeadlineExceeded);
                    self.drop_channel(route, generation, stalled, &error).await;
                }
                if self.inner.follow_leader
                    && let Some(hint) = leader_hint.filter(|_| not_leader)
                {
                    self.pin(&hint).await;
                }
                Err(error)
            }
        }
    }

    /// The channel for the next call: the pinned leader's when one is pinned and can be
    /// opened, else the Service's.
    async fn channel(&self) -> Result<(Route, u64, Channel), ControllerError> {
        if self.inner.follow_leader {
            let mut pinned = self.inner.pinned.lock().await;
            if let Some(target) = pinned.target.clone() {
                if pinned.slot.expired(self.inner.max_age) {
                    // Back to the Service, which knows which replicas are ready; a
                    // follower's next hint pins the leader again.
                    tracing::debug!(leader = %target, "the pinned leader's channel reached its maximum age; back to the Service");
                    *pinned = Pinned {
                        failed: pinned.failed.take(),
                        ..Pinned::default()
                    };
                } else {
                    match self.open(&mut pinned.slot, &target).await {
                        Ok((generation, channel)) => {
                            return Ok((Route::Leader, generation, channel));
                        }
                        Err(error) => {
                            tracing::warn!(leader = %target, %error, "cannot reach the leader a follower named; calls go through the Service again");
                            *pinned = Pinned {
                                failed: Some((target, tokio::time::Instant::now())),
                                ..Pinned::default()
                            };
                        }
                    }
                }
            }
        }
        let mut slot = self.inner.slot.lock().await;
        if slot.expired(self.inner.max_age) && slot.channel.take().is_some() {
            tracing::debug!(addr = %self.inner.addr, "rotating the controller channel after its maximum age");
        }
        if let Some((generation, channel)) = &slot.channel {
            return Ok((Route::Service, *generation, channel.clone()));
        }
        let dials = if self.inner.probe.is_some() {
            PROBE_DIALS
        } else {
            1
        };
        for dial in 1..=dials {
            let (generation, channel) = self.open(&mut slot, &self.inner.addr).await?;
            let Some(bound) = self.inner.probe else {
                return Ok((Route::Service, generation, channel));
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
                    slot.channel = None;
                }
                _ => {
                    slot.view = view.ok();
                    return Ok((Route::Service, generation, channel));
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

    /// Pins the leader `hint` names (after a not-leader answer).
    async fn pin(&self, hint: &str) {
        let Ok(mut target) = hint.parse::<ControllerAddr>() else {
            tracing::debug!(hint, "x-spur-leader is not an address; not following it");
            return;
        };
        // The leader speaks the scheme the Service does.
        target.scheme = self.inner.addr.scheme;
        let mut pinned = self.inner.pinned.lock().await;
        if pinned.target.as_ref() == Some(&target) {
            return;
        }
        // (A pinned replica that answers "not the Raft leader" naming itself lands here:
        // its failure let it go a moment ago.)
        let hold_off = self.inner.max_age.unwrap_or(REPIN_AFTER);
        if matches!(&pinned.failed, Some((failed, at)) if *failed == target && at.elapsed() < hold_off)
        {
            return;
        }
        tracing::info!(leader = %target, "following the leader a follower named");
        *pinned = Pinned {
            target: Some(target),
            slot: Slot::default(),
            failed: pinned.failed.take(),
        };
    }

    /// The open channel of `slot`, or a new one to `target`.
    async fn open(
        &self,
        slot: &mut Slot,
        target: &ControllerAddr,
    ) -> Result<(u64, Channel), ControllerError> {
        if let Some((generation, channel)) = &slot.channel {
            return Ok((*generation, channel.clone()));
        }
        match (self.inner.connector)(target.clone()).await {
            Ok(channel) => {
                let generation = self.inner.next_generation.fetch_add(1, Ordering::Relaxed);
                slot.channel = Some((generation, channel.clone()));
                slot.opened = Some(tokio::time::Instant::now());
                self.inner.stats.connects.fetch_add(1, Ordering::Relaxed);
                if let Some(m) = &self.inner.metrics {
                    m.channel_connects.inc();
                }
                tracing::debug!(addr = %target, generation, "connected to spurctld");
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
                    addr: target.to_string(),
                    source,
                })
            }
        }
    }

    /// Drops `route`'s channel of `generation` after a transport failure; a pinned leader
    /// whose channel failed is let go, so the next call goes through the Service. When
    /// `stalled` (a write went unanswered), the channel's view is avoided for a while.
    async fn drop_channel(
        &self,
        route: Route,
        generation: u64,
        stalled: bool,
        cause: &ControllerError,
    ) {
        let dropped = match route {
            Route::Service => {
                let mut slot = self.inner.slot.lock().await;
                let current = matches!(slot.channel, Some((g, _)) if g == generation);
                if current {
                    slot.channel = None;
                    if let Some(view) = slot.view.take().filter(|_| stalled) {
                        tracing::warn!(%view, "a write went unanswered on a channel whose reads come from {view}; avoiding it");
                        *self.inner.stalled.lock().expect("stalled lock") =
                            Some((view, tokio::time::Instant::now()));
                    }
                }
                current
            }
            Route::Leader => {
                let mut pinned = self.inner.pinned.lock().await;
                let current = matches!(pinned.slot.channel, Some((g, _)) if g == generation);
                if current && let Some(target) = pinned.target.take() {
                    tracing::warn!(leader = %target, %cause, "the pinned leader failed; calls go through the Service again");
                    *pinned = Pinned {
                        failed: Some((target, tokio::time::Instant::now())),
                        ..Pinned::default()
                    };
                }
                current
            }
        };
        if dropped {
            self.inner.stats.drops.fetch_add(1, Ordering::Relaxed);
            if let Some(m) = &self.inner.metrics {
                m.channel_drops.inc();
            }
            // Once per channel: concurrent calls failing on the same dead connection find
            // the slot already empty and stay quiet.
            tracing::warn!(addr = %self.inner.addr, ?route, %cause, "dropping the controller channel; the next call connects afresh");
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
