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
/// whose state the channel's reads come from (its view). When a write went unanswered
/// within the request bound while a Ping on the same channel still gives the same view,
/// that name is marked, and a new channel whose probe names it (or fails) is dropped and
/// dialed again, a few times at most. The mark is cleared by a write through it that is
/// answered, or by one elsewhere refused as UNAVAILABLE (no other replica reaches a
/// leader, so the marked one may lead again).
///
/// With a leader recheck as well, a call outstanding for longer than the recheck asks a
/// fresh channel through the Service for its view; when that names another replica than
/// the call's channel did, leadership moved since the channel was vetted, and the call
/// (stuck behind a forward to a leader that is gone, or on a leader cut off from its
/// peers) is abandoned and the fresh channel takes its place; so is a call whose channel
/// answers no Ping of its own while the fresh one does.
///
/// Dials run on a task of their own, hedged while no probe is accepted, and a channel
/// past its maximum age is replaced only by one whose probe is.
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
    slot: Arc<tokio::sync::Mutex<Slot>>,
    /// Bound on the Ping that probes each new Service channel; `None`: no probe.
    probe: Option<std::time::Duration>,
    /// The view (probe hostname) of a channel whose write went unanswered, and when.
    stalled: SyncMutex<Option<(String, tokio::time::Instant)>>,
    /// While no new channel's probe was accepted, another dial starts this often.
    hedge: Option<std::time::Duration>,
    /// Dials for one channel while probes turn channels down, and per leader recheck.
    probe_dials: usize,
    recheck_dials: usize,
    /// How long a view whose write went unanswered is avoided.
    stall_memory: std::time::Duration,
    /// How long a call may be outstanding before a fresh channel is asked for its view;
    /// `None`: calls wait for their own bound.
    recheck: Option<std::time::Duration>,
    /// The last fresh view taken for a recheck, shared by the calls waiting at the time.
    fresh: tokio::sync::Mutex<Option<Fresh>>,
    leader_hint: SyncMutex<Option<String>>,
    stats: Counters,
    metrics: Option<Metrics>,
}

#[derive(Default)]
struct Slot {
    channel: Option<(u64, Channel)>,
    /// Whose state the current channel's reads came from when it was probed.
    view: Option<String>,
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

    /// Keeps `channel` (whose probe gave `view`) as the one every call shares, from now;
    /// returns them for the caller.
    fn keep(
        &mut self,
        generation: u64,
        channel: Channel,
        view: Option<String>,
    ) -> (u64, Channel, Option<String>) {
        tracing::debug!(
            generation,
            view = view.as_deref().unwrap_or("-"),
            "the controller channel every call shares"
        );
        self.channel = Some((generation, channel.clone()));
        self.view = view.clone();
        self.opened = Some(tokio::time::Instant::now());
        (generation, channel, view)
    }
}

/// A channel dialed and probed to see whose state the Service's replicas serve now, or
/// the failure to: taken at most once per recheck interval, whatever the number of
/// waiting calls.
#[derive(Clone)]
struct Fresh {
    at: tokio::time::Instant,
    probed: Option<(Channel, String)>,
}

/// What a round of dials found: the first channel whose view was accepted, else the first
/// whose probe was answered, the last whose probe was not, and the last dial's error.
#[derive(Default)]
struct Dialed {
    accepted: Option<(Channel, String)>,
    answered: Option<(Channel, String)>,
    unanswered: Option<Channel>,
    error: Option<ControllerError>,
}

/// Why a waiting call is left, and the fresh channel to use instead.
struct Abandon {
    why: String,
    /// The call's channel answered no Ping of its own (so no need to ask it again).
    silent: bool,
    fresh_view: String,
    fresh: Channel,
}

/// The outcome of a call raced against the recheck.
enum Outcome<T> {
    Answered(Result<Response<T>, Status>),
    /// The call's channel is no longer worth waiting on (see [`Abandon`]).
    Abandoned(Abandon),
}

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
        let hedge = config.connect_hedge;
        let (probe_dials, recheck_dials, stall_memory) = (
            config.probe_dials.max(1),
            config.recheck_dials.max(1),
            config.stall_memory,
        );
        // Views come from the probe: without one there is nothing to compare.
        let recheck = config.leader_recheck.filter(|_| probe.is_some());
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
                slot: Arc::new(tokio::sync::Mutex::new(Slot::default())),
                probe,
                stalled: SyncMutex::new(None),
                recheck,
                hedge,
                probe_dials,
                recheck_dials,
                stall_memory,
                fresh: tokio::sync::Mutex::new(None),
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

    /// A Ping that fails as DEADLINE_EXCEEDED unless answered within `bound` of now, the
    /// channel included. The bound is kept inside the client so an unanswered Ping drops
    /// the channel as any call that times out does: a caller's own timeout only cancels the
    /// call, and the next one (the readiness probe's, 5 s later) would wait on the same
    /// stuck channel, a follower cut off from its leader, whose forwards hang.
    pub async fn ping_within(
        &self,
        bound: std::time::Duration,
    ) -> Result<pb::PingResponse, ControllerError> {
        let deadline = tokio::time::Instant::now() + bound;
        self.call("Ping", (), move |mut c, r| async move {
            tokio::time::timeout_at(deadline, c.ping(r))
                .await
                .unwrap_or_else(|_| {
                    Err(Status::deadline_exceeded(format!(
                        "no answer within {bound:?}"
                    )))
                })
        })
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
        let (generation, channel, view) = self.channel().await?;
        let client = pb::SlurmControllerClient::new(channel.clone())
            .max_decoding_message_size(self.inner.max_message_bytes)
            .max_encoding_message_size(self.inner.max_message_bytes);
        let mut request = Request::new(message);
        if let Some(auth) = &self.inner.authorization {
            request.metadata_mut().insert("authorization", auth.clone());
        }
        let started = tokio::time::Instant::now();
        let answer = rpc(client, request);
        let outcome = match self.inner.recheck {
            Some(every) => tokio::select! {
                answer = answer => Outcome::Answered(answer),
                abandon = self.until_abandoned(&channel, view.as_deref(), every) => {
                    Outcome::Abandoned(abandon)
                }
            },
            None => Outcome::Answered(answer.await),
        };
        match outcome {
            Outcome::Answered(Ok(response)) => {
                if is_write(method) {
                    self.forgive(view.as_deref());
                }
                Ok(response.into_inner())
            }
            Outcome::Abandoned(Abandon {
                why,
                silent,
                fresh_view,
                fresh,
            }) => {
                let error = ControllerError::Status {
                    method,
                    code: Code::Cancelled,
                    message: format!("abandoned after {:?}: {why}", started.elapsed()),
                    leader_hint: None,
                };
                let stalled = match self.inner.probe {
                    Some(bound) if is_write(method) && !silent => {
                        self.still_serves(channel, view.as_deref(), bound).await
                    }
                    _ => None,
                };
                // A channel opened since this call started whose reads come from the same
                // outdated view (kept by a recheck while that view still looked current) is
                // no better: it goes too, or the next calls would read from it again.
                let outdated = (!silent).then_some(view.as_deref()).flatten();
                self.drop_channel(generation, outdated, stalled, &error)
                    .await;
                self.offer(fresh, fresh_view).await;
                Err(error)
            }
            Outcome::Answered(Err(status)) => {
                let leader_hint = leader_hint(status.metadata());
                if status.code() == Code::Unavailable && leader_hint.is_some() {
                    *self.inner.leader_hint.lock().expect("leader hint lock") = leader_hint.clone();
                }
                if is_write(method) && status.code() == Code::Unavailable {
                    self.refused(view.as_deref());
                }
                let error = ControllerError::Status {
                    method,
                    code: status.code(),
                    // The causes say which bound fired (e.g. "keep-alive timed out").
                    message: status_text(&status),
                    leader_hint,
                };
                if classify(status.code()) == FailureKind::Transport {
                    let unanswered_write = is_write(method)
                        && matches!(status.code(), Code::Cancelled | Code::DeadlineExceeded);
                    let stalled = match self.inner.probe {
                        Some(bound) if unanswered_write => {
                            self.still_serves(channel, view.as_deref(), bound).await
                        }
                        _ => None,
                    };
                    self.drop_channel(generation, None, stalled, &error).await;
                }
                Err(error)
            }
        }
    }

    /// The open channel, or a new one through the Service, probed when a probe is set.
    async fn channel(&self) -> Result<(u64, Channel, Option<String>), ControllerError> {
        let mut slot = self.inner.slot.clone().lock_owned().await;
        // A channel past its maximum age is replaced only by one whose probe is accepted:
        // when every dial reaches a replica that does not answer (two of three followers
        // whose forwards hang), rotating would trade a working channel for a dead one.
        let mut rotated = None;
        if slot.expired(self.inner.max_age)
            && let Some((generation, channel)) = slot.channel.take()
        {
            tracing::debug!(addr = %self.inner.addr, "rotating the controller channel after its maximum age");
            rotated = Some((generation, channel, slot.view.clone()));
        }
        if let Some((generation, channel)) = &slot.channel {
            return Ok((*generation, channel.clone(), slot.view.clone()));
        }
        // Dials and probes run on a task of their own, holding the slot: a caller cancelled
        // meanwhile (a readiness probe's 2 s bound) leaves them to finish for the next
        // caller, instead of the next caller starting again from the first dial.
        let client = self.clone();
        tokio::spawn(async move { client.fill(slot, rotated).await })
            .await
            .unwrap_or_else(|failed| {
                Err(ControllerError::Connect {
                    addr: self.inner.addr.to_string(),
                    source: ConnectError::Other(format!("the connect task failed: {failed}")),
                })
            })
    }

    /// Dials through the Service until a channel's probe accepts it (a few dials at most)
    /// and keeps it in `slot`; `rotated`, the channel being replaced for its age, is kept
    /// again when none is.
    async fn fill(
        &self,
        mut slot: tokio::sync::OwnedMutexGuard<Slot>,
        rotated: Option<(u64, Channel, Option<String>)>,
    ) -> Result<(u64, Channel, Option<String>), ControllerError> {
        let Some(bound) = self.inner.probe else {
            let channel = self.dial().await?;
            return Ok(Self::keep_new(&mut slot, channel, None));
        };
        let dialed = self
            .dial_until(self.inner.probe_dials, bound, |view| !self.is_stalled(view))
            .await;
        if dialed.accepted.is_none()
            && let Some((generation, channel, view)) = rotated
        {
            tracing::info!(addr = %self.inner.addr, "no new channel was accepted; keeping the current one for another maximum age");
            return Ok(slot.keep(generation, channel, view));
        }
        // When no dial was accepted, one whose probe was answered (by a view whose writes
        // went unanswered) is kept over one whose probe got no answer: a replica that
        // answers may have healed since; one that does not answer serves nothing (a
        // follower whose forwards hang stays so until its kernel gives up, even after the
        // leader it forwards to is reachable again).
        match dialed {
            Dialed {
                accepted: Some((channel, view)),
                ..
            }
            | Dialed {
                answered: Some((channel, view)),
                ..
            } => Ok(Self::keep_new(&mut slot, channel, Some(view))),
            Dialed {
                unanswered: Some(channel),
                ..
            } => Ok(Self::keep_new(&mut slot, channel, None)),
            Dialed { error, .. } => Err(error.expect("a dial that made no channel failed")),
        }
    }

    fn keep_new(
        slot: &mut Slot,
        channel: Channel,
        view: Option<String>,
    ) -> (u64, Channel, Option<String>) {
        let generation = slot.next_generation;
        slot.next_generation += 1;
        slot.keep(generation, channel, view)
    }

    /// Dials through the Service and probes each new channel within `bound` until one's
    /// view is accepted, `dials` at most. With a connect hedge a further dial starts
    /// whenever the hedge passes without an accepted probe (a Ping answers in milliseconds
    /// inside a cluster, so one still waiting has most likely reached a replica whose
    /// forwards hang, and the Service may pick a better one); without, dials go one after
    /// another.
    async fn dial_until(
        &self,
        dials: usize,
        bound: std::time::Duration,
        accept: impl Fn(&str) -> bool,
    ) -> Dialed {
        let attempt = || async {
            let channel = self.dial().await?;
            let view = self.probe(channel.clone(), bound).await;
            Ok::<_, ControllerError>((channel, view))
        };
        let mut dialed = Dialed::default();
        let mut pending = futures::stream::FuturesUnordered::new();
        let mut started = 0;
        let mut next_start = Some(tokio::time::Instant::now());
        loop {
            if started < dials && next_start.is_some_and(|at| tokio::time::Instant::now() >= at) {
                pending.push(attempt());
                started += 1;
                // Without a hedge, the next dial waits for this one's verdict.
                next_start = self
                    .inner
                    .hedge
                    .map(|hedge| tokio::time::Instant::now() + hedge);
            }
            if pending.is_empty() {
                return dialed;
            }
            let hedge_at = next_start.filter(|_| started < dials);
            tokio::select! {
                Some(result) = futures::StreamExt::next(&mut pending) => {
                    let why = match result {
                        Ok((channel, Ok(view))) if accept(&view) => {
                            dialed.accepted = Some((channel, view));
                            return dialed;
                        }
                        Ok((channel, Ok(view))) => {
                            let why = format!("its reads come from {view}, which is avoided");
                            dialed.answered.get_or_insert((channel, view));
                            why
                        }
                        Ok((channel, Err(error))) => {
                            dialed.unanswered = Some(channel);
                            format!("its probe failed: {error}")
                        }
                        Err(error) => {
                            let why = error.to_string();
                            dialed.error = Some(error);
                            why
                        }
                    };
                    if started < dials {
                        tracing::info!(addr = %self.inner.addr, dial = started, %why, "turning a new controller channel down; dialing again");
                        next_start = Some(tokio::time::Instant::now());
                    }
                }
                () = async { tokio::time::sleep_until(hedge_at.expect("guarded")).await }, if hedge_at.is_some() => {}
            }
        }
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

    /// The view to avoid after a write on `channel` went unanswered: the channel's own, when
    /// a Ping on it still gives that. A replica answering reads from its own state while
    /// its writes never commit is a leader cut off from its peers. A replica whose reads
    /// hang too (a follower whose forward hangs) is not named: the probe of any new channel
    /// to it fails anyway. Nor is one whose Ping now names another replica: leadership moved
    /// since the channel was vetted (the write hung on a forward to the old leader), and the
    /// name it gives is the new leader's, which every healthy replica gives too.
    async fn still_serves(
        &self,
        channel: Channel,
        view: Option<&str>,
        bound: std::time::Duration,
    ) -> Option<String> {
        let now = self.probe(channel, bound).await.ok()?;
        (view == Some(now.as_str())).then_some(now)
    }

    /// Resolves once the call waiting on `channel` (whose probe gave `view`) is not worth
    /// waiting on, checking every `every` with a fresh channel through the Service:
    /// - the fresh channel gives another view: leadership moved since `channel` was vetted
    ///   (a channel kept although its probe got no answer, `None`, has no view to keep:
    ///   any answer moves it);
    /// - it gives the same view (or one avoided for an unanswered write), but `channel`
    ///   answers no Ping of its own within the probe's bound: a follower whose forward to
    ///   that same leader hangs (cut off from it after the probe). HTTP/2 multiplexes, so a
    ///   channel that is merely busy with a slow answer still answers a Ping.
    ///
    /// Never resolves while the fresh view cannot be taken or the slow channel answers.
    async fn until_abandoned(
        &self,
        channel: &Channel,
        view: Option<&str>,
        every: std::time::Duration,
    ) -> Abandon {
        // Checks start every `every`, however long each took (a probe that gets no answer
        // takes its whole bound).
        let mut next = tokio::time::Instant::now() + every;
        loop {
            tokio::time::sleep_until(next).await;
            next += every;
            let Some((fresh, fresh_view)) = self.fresh_view(every, view).await.probed else {
                continue;
            };
            // A replica avoided for an unanswered write is no proof that leadership moved,
            // but it still beats a channel that answers no Ping at all.
            let avoided = self.is_stalled(&fresh_view);
            if !avoided && Some(fresh_view.as_str()) != view {
                return Abandon {
                    why: format!(
                        "the replicas answer for {fresh_view} now, this channel's reads came from {}",
                        view.unwrap_or("a replica whose probe got no answer")
                    ),
                    silent: false,
                    fresh_view,
                    fresh,
                };
            }
            if let Some(bound) = self.inner.probe
                && let Err(error) = self.probe(channel.clone(), bound).await
            {
                return Abandon {
                    why: format!(
                        "this channel answers no Ping ({error}) while a new one's reads come from {fresh_view}"
                    ),
                    silent: true,
                    fresh_view,
                    fresh,
                };
            }
        }
    }

    /// A fresh channel's view, reused by every call asking within `max_age` of it. A
    /// dial whose probe gives `unlike` (the asking call's own view) is followed by one more:
    /// the Service may have picked the very replica the call is stuck on, a leader cut off
    /// from its peers, which answers for itself.
    async fn fresh_view(&self, max_age: std::time::Duration, unlike: Option<&str>) -> Fresh {
        let mut last = self.inner.fresh.lock().await;
        if let Some(fresh) = &*last
            && fresh.at.elapsed() < max_age
        {
            return fresh.clone();
        }
        let at = tokio::time::Instant::now();
        let probed = match self.inner.probe {
            Some(bound) => {
                let dialed = self
                    .dial_until(self.inner.recheck_dials, bound, |view| {
                        Some(view) != unlike && !self.is_stalled(view)
                    })
                    .await;
                dialed.accepted.or(dialed.answered)
            }
            None => None,
        };
        let fresh = Fresh { at, probed };
        *last = Some(fresh.clone());
        fresh
    }

    /// Takes a fresh channel (whose probe gave `view`) as the shared one when the slot is
    /// empty, saving the next call a dial and a probe.
    async fn offer(&self, channel: Channel, view: String) {
        let mut slot = self.inner.slot.lock().await;
        if slot.channel.is_none() {
            let _ = Self::keep_new(&mut slot, channel, Some(view));
        }
    }

    /// A write through `view` was answered: it is no longer avoided (the partition that
    /// cut it off healed before its peers elected another leader).
    fn forgive(&self, view: Option<&str>) {
        let mut stalled = self.inner.stalled.lock().expect("stalled lock");
        if stalled
            .as_ref()
            .is_some_and(|(name, _)| Some(name.as_str()) == view)
        {
            tracing::info!(
                view,
                "a write through a view that was avoided was answered; using it again"
            );
            *stalled = None;
        }
    }

    /// A write through `view` was refused as UNAVAILABLE: the replica serving that view
    /// reaches no leader (an election, or a follower whose leader is gone; a leader hint on
    /// the refusal names a leader that follower could not connect to, wire.md). A replica
    /// avoided for a write that hung is then tried again: the partition that cut it off may
    /// have healed and its peers elected it, while a follower still forwarding to a dead
    /// leader refuses every write. If it is still cut off, its next write hangs and the
    /// leader recheck leaves it within a second, marking it again; nothing could commit
    /// elsewhere meanwhile.
    fn refused(&self, view: Option<&str>) {
        let mut stalled = self.inner.stalled.lock().expect("stalled lock");
        if let Some((avoided, _)) = stalled.take() {
            tracing::info!(
                avoided,
                refused_by = view.unwrap_or("-"),
                "a write was refused as unavailable; trying the avoided replica again"
            );
        }
    }

    fn is_stalled(&self, view: &str) -> bool {
        matches!(&*self.inner.stalled.lock().expect("stalled lock"),
            Some((stalled, at)) if stalled == view && at.elapsed() < self.inner.stall_memory)
    }

    /// Connects through the Service, counting the connect or its failure.
    async fn dial(&self) -> Result<Channel, ControllerError> {
        match (self.inner.connector)().await {
            Ok(channel) => {
                self.inner.stats.connects.fetch_add(1, Ordering::Relaxed);
                if let Some(m) = &self.inner.metrics {
                    m.channel_connects.inc();
                }
                Ok(channel)
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

    /// Drops the channel of `generation` after a transport failure, or whatever channel
    /// is shared now when its view is `outdated`. `stalled` names the replica's view when a
    /// write went unanswered while reads were answered: it is avoided for a while.
    async fn drop_channel(
        &self,
        generation: u64,
        outdated: Option<&str>,
        stalled: Option<String>,
        cause: &ControllerError,
    ) {
        let mut slot = self.inner.slot.lock().await;
        let outdated = outdated.is_some() && slot.view.as_deref() == outdated;
        if matches!(slot.channel, Some((current, _)) if current == generation || outdated) {
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
