//! The one long-lived client of spurctld: a thin driver of the channel policy
//! ([`super::policy`], whose module doc describes what the channel does and why). It runs
//! the policy's commands (dials, probes, calls) as tasks and feeds their outcomes back,
//! all under one lock.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use spur_proto as pb;
use tokio::sync::oneshot;
use tonic::metadata::{AsciiMetadataValue, MetadataMap};
use tonic::transport::Channel;
use tonic::{Code, Request, Response, Status};

use super::ChannelConfig;
use super::address::ControllerAddr;
use super::connect::connect;
use super::error::{ConnectError, ControllerError, FailureKind, classify, status_text};
use super::policy::{CallId, Command, DialId, Ended, Event, Policy, ReplicaId, Rule, Rules};
use super::session::{ReadFrom, Session};
use crate::fence::{Fence, Permit, Refused};
use crate::metrics::Metrics;
use crate::net::Dialer;

tokio::task_local! {
    /// Set while a task runs work inside one turn ([`ControllerClient::in_one_turn`]): the
    /// client (by its address) whose calls in that work take no turn of their own.
    static TURN_OF: usize;
}

type Connector = dyn Fn() -> BoxFuture<'static, Result<Channel, ConnectError>> + Send + Sync;
/// Where a call waits for the channel the policy gives it.
type ChannelWait = oneshot::Receiver<Result<Channel, ControllerError>>;

/// The operator's client of spurctld: cheap to clone, safe to share between tasks. No
/// connection is opened until the first call.
#[derive(Clone)]
pub struct ControllerClient {
    inner: Arc<Inner>,
}

struct Inner {
    addr: ControllerAddr,
    connector: Box<Connector>,
    max_message_bytes: usize,
    authorization: Option<AsciiMetadataValue>,
    /// One permit a call in flight (`--controller-max-in-flight`); tokio's semaphore is
    /// fair, so calls start in the order they asked, and a seed replays.
    in_flight: tokio::sync::Semaphore,
    state: Mutex<State>,
    metrics: Option<Metrics>,
    /// Checked by each leader-only call ([`LEADER_WRITES`]) once it has its channel, at the
    /// moment it is sent; `None` for a client that acts for no Lease (`check-controller`).
    fence: Option<Fence>,
}

/// The methods of `slurm.SlurmController` only the acting operator calls: writes. A
/// standby Pings (readiness) and reads (GetJob, GetJobs) but never makes one of these.
pub const LEADER_WRITES: [&str; 7] = [
    "RegisterAgent",
    "Heartbeat",
    "UpdateNode",
    "SubmitJob",
    "CancelJob",
    "RequeueJob",
    "ReportJobStatus",
];

/// Everything the policy's commands act on, under the client's one lock.
struct State {
    policy: Policy,
    /// Channels dialed and not yet discarded or dropped, by dial.
    channels: BTreeMap<DialId, Channel>,
    /// Calls waiting for their channel.
    waiting: BTreeMap<CallId, oneshot::Sender<Result<Channel, ControllerError>>>,
    /// Calls on a channel, told here when they are abandoned.
    running: BTreeMap<CallId, oneshot::Sender<()>>,
    /// Why the last dial or probe failed: what waiting calls fail with when no dial of a
    /// round made a channel that serves.
    last_dial_error: Option<ControllerError>,
    /// Why the last call failed in transport: the cause the drop it leads to is logged
    /// with (the policy decides whether to drop; the call's own path only reports).
    last_call_failure: Option<String>,
    next_call: CallId,
    /// The replicas' names seen, numbered in the order first seen.
    replicas: BTreeMap<String, ReplicaId>,
    /// Whether a ticker task runs (it ends when the policy wants no tick).
    ticking: bool,
    /// Bumped whenever a tick may be due earlier than the ticker sleeps for.
    wake: Arc<tokio::sync::Notify>,
    /// The jobs whose end a replica acknowledged, for rule 6.
    session: Session,
}

/// The jobs an answer shows, judged by rule 6 (reads that show none are not judged).
trait Answer {
    fn jobs(&self) -> &[pb::JobInfo] {
        &[]
    }
}

impl Answer for pb::GetJobsResponse {
    fn jobs(&self) -> &[pb::JobInfo] {
        &self.jobs
    }
}

impl Answer for pb::JobInfo {
    fn jobs(&self) -> &[pb::JobInfo] {
        std::slice::from_ref(self)
    }
}

impl Answer for () {}
impl Answer for pb::PingResponse {}
impl Answer for pb::RegisterAgentResponse {}
impl Answer for pb::HeartbeatResponse {}
impl Answer for pb::SubmitJobResponse {}
impl Answer for pb::GetNodesResponse {}
impl Answer for pb::RequeueJobResponse {}

/// The job ids a read asks for by id alone, so that every one of them that exists must be
/// in its answer (rule 6 also judges an acknowledged job an answer leaves out). A read with
/// any other filter asks for none: it may rightly leave a job out.
trait Question {
    fn asked(&self) -> &[u32] {
        &[]
    }
}

impl Question for pb::GetJobsRequest {
    fn asked(&self) -> &[u32] {
        let by_id_alone = self.states.is_empty()
            && self.user.is_empty()
            && self.partition.is_empty()
            && self.account.is_empty()
            && self.name.is_empty();
        if by_id_alone { &self.job_ids } else { &[] }
    }
}

impl Question for pb::GetJobRequest {
    fn asked(&self) -> &[u32] {
        std::slice::from_ref(&self.job_id)
    }
}

impl Question for () {}
impl Question for pb::RegisterAgentRequest {}
impl Question for pb::HeartbeatRequest {}
impl Question for pb::UpdateNodeRequest {}
impl Question for pb::SubmitJobRequest {}
impl Question for pb::CancelJobRequest {}
impl Question for pb::RequeueJobRequest {}
impl Question for pb::ReportJobStatusRequest {}
impl Question for pb::GetNodesRequest {}

/// The probe of a new channel: a job that cannot exist. A follower forwards it to the leader
/// (and answers it only if that forward does), so an answer within the bound says the
/// replica serves reads now; the leader answers from its own state.
fn probe_request() -> pb::GetJobsRequest {
    pb::GetJobsRequest {
        job_ids: vec![u32::MAX],
        ..Default::default()
    }
}

/// Tells the policy a call ended when its future is dropped before it did (the caller's own
/// timeout), so the policy does not wait on it.
struct CallGuard<'a> {
    client: &'a ControllerClient,
    call: CallId,
    armed: bool,
}

impl CallGuard<'_> {
    fn end(mut self, ended: Ended) {
        self.armed = false;
        self.client.feed(Event::CallEnded {
            call: self.call,
            ended,
        });
    }
}

impl Drop for CallGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.client.feed(Event::CallEnded {
                call: self.call,
                ended: Ended::Left,
            });
        }
    }
}

impl ControllerClient {
    /// A client of `addr` that connects through `dialer` with the bounds of `config`.
    /// `token`, when set, is sent as `authorization: Bearer <token>` on every call.
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
        let in_flight = tokio::sync::Semaphore::new(config.max_in_flight);
        let session = Session::new(config.behind_window);
        let policy = Policy::new(Rules::from_config(&config));
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
                authorization,
                in_flight,
                state: Mutex::new(State {
                    policy,
                    channels: BTreeMap::new(),
                    waiting: BTreeMap::new(),
                    running: BTreeMap::new(),
                    last_dial_error: None,
                    last_call_failure: None,
                    next_call: 0,
                    replicas: BTreeMap::new(),
                    ticking: false,
                    wake: Arc::new(tokio::sync::Notify::new()),
                    session,
                }),
                metrics: None,
                fence: None,
            }),
        })
    }

    /// Exports calls, connects, drops and the channel rules that fired to `metrics`. Call
    /// before sharing the client.
    pub fn with_metrics(mut self, metrics: Metrics) -> Self {
        Arc::get_mut(&mut self.inner)
            .expect("with_metrics is called before the client is cloned")
            .metrics = Some(metrics);
        self
    }

    /// Fences the leader-only calls ([`LEADER_WRITES`]) with `fence`. Call before sharing
    /// the client.
    pub fn with_fence(mut self, fence: Fence) -> Self {
        Arc::get_mut(&mut self.inner)
            .expect("with_fence is called before the client is cloned")
            .fence = Some(fence);
        self
    }

    /// The fence's permit for `method` if it is a leader-only call of a fenced client.
    fn fenced(&self, method: &'static str) -> Result<Option<Permit>, Refused> {
        match &self.inner.fence {
            Some(fence) if LEADER_WRITES.contains(&method) => fence.enter().map(Some),
            _ => Ok(None),
        }
    }

    /// Whether a channel is shared now.
    #[cfg(test)]
    pub async fn is_connected(&self) -> bool {
        self.lock().policy.shared().is_some()
    }

    pub async fn ping(&self) -> Result<pb::PingResponse, ControllerError> {
        self.call("Ping", (), |mut c, r| async move { c.ping(r).await })
            .await
    }

    /// The readiness check: the probe's read (answered only when the replica reached serves
    /// forwarded reads, so a follower whose forwards hang fails it), within `bound` of now,
    /// the channel included. The bound is kept inside the client so an unanswered check
    /// fails as DEADLINE_EXCEEDED and drops the channel as any call that times out does: a
    /// caller's own timeout only leaves the call, and the next check would wait on the
    /// same stuck channel.
    pub async fn check_within(&self, bound: std::time::Duration) -> Result<(), ControllerError> {
        let deadline = tokio::time::Instant::now() + bound;
        // Not behind the bound on calls in flight: whether spurctld answers must not be
        // judged by how long the operator's own calls keep their turns.
        self.call_now("GetJobs", probe_request(), move |mut c, r| async move {
            tokio::time::timeout_at(deadline, c.get_jobs(r))
                .await
                .unwrap_or_else(|_| {
                    Err(Status::deadline_exceeded(format!(
                        "no answer within {bound:?}"
                    )))
                })
        })
        .await
        .map(|_| ())
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

    pub async fn get_nodes(
        &self,
        request: pb::GetNodesRequest,
    ) -> Result<pb::GetNodesResponse, ControllerError> {
        self.call("GetNodes", request, |mut c, r| async move {
            c.get_nodes(r).await
        })
        .await
    }

    pub async fn cancel_job(&self, request: pb::CancelJobRequest) -> Result<(), ControllerError> {
        self.call("CancelJob", request, |mut c, r| async move {
            c.cancel_job(r).await
        })
        .await
    }

    /// Puts a running job back in spurctld's queue under the same id (the failure policy's
    /// restart).
    pub async fn requeue_job(
        &self,
        request: pb::RequeueJobRequest,
    ) -> Result<pb::RequeueJobResponse, ControllerError> {
        self.call("RequeueJob", request, |mut c, r| async move {
            c.requeue_job(r).await
        })
        .await
    }

    /// Reports a job's end on one node; once acknowledged, a read that still shows the job
    /// running a grace later is from a replica that is behind (rule 6).
    pub async fn report_job_status(
        &self,
        request: pb::ReportJobStatusRequest,
    ) -> Result<(), ControllerError> {
        let (job_id, named) = (request.job_id, !request.reporting_node.is_empty());
        let answer = self
            .call("ReportJobStatus", request, |mut c, r| async move {
                c.report_job_status(r).await
            })
            .await;
        // A report that names no node is an accepted no-op (fidelity.md row 7).
        if answer.is_ok() && named {
            self.lock()
                .session
                .acknowledged(job_id, tokio::time::Instant::now());
        }
        answer
    }

    /// Runs one RPC once it has its turn among the calls in flight
    /// (`--controller-max-in-flight`). The wait for a turn is not the call's: the policy,
    /// the metrics and the log time the call from its turn.
    async fn call<Req, Resp, F, Fut>(
        &self,
        method: &'static str,
        message: Req,
        rpc: F,
    ) -> Result<Resp, ControllerError>
    where
        F: FnOnce(pb::SlurmControllerClient<Channel>, Request<Req>) -> Fut,
        Fut: Future<Output = Result<Response<Resp>, Status>>,
        Req: Question,
        Resp: Answer,
    {
        let in_a_shared_turn = TURN_OF.try_with(|&client| client == self.id()) == Ok(true);
        let _turn = match in_a_shared_turn {
            true => None,
            false => Some(self.take_turn().await),
        };
        self.call_now(method, message, rpc).await
    }

    /// Runs `work` in one turn among the calls in flight: its calls through this client
    /// share that turn instead of queueing for their own. For a call raced with a read
    /// that may rescue it (the submission's read-back), which would otherwise wait behind
    /// the very calls that hold every turn.
    pub async fn in_one_turn<T>(&self, work: impl Future<Output = T>) -> T {
        let _turn = self.take_turn().await;
        TURN_OF.scope(self.id(), work).await
    }

    async fn take_turn(&self) -> tokio::sync::SemaphorePermit<'_> {
        (self.inner.in_flight.acquire().await).expect("the client never closes its semaphore")
    }

    /// This client's identity among clients, for [`TURN_OF`].
    fn id(&self) -> usize {
        Arc::as_ptr(&self.inner) as usize
    }

    /// Runs one RPC on the channel the policy gives it and reports how it ended.
    async fn call_now<Req, Resp, F, Fut>(
        &self,
        method: &'static str,
        message: Req,
        rpc: F,
    ) -> Result<Resp, ControllerError>
    where
        F: FnOnce(pb::SlurmControllerClient<Channel>, Request<Req>) -> Fut,
        Fut: Future<Output = Result<Response<Resp>, Status>>,
        Req: Question,
        Resp: Answer,
    {
        let started = tokio::time::Instant::now();
        let result = self.call_once(method, message, rpc).await;
        let code = result
            .as_ref()
            .err()
            .map_or(Code::Ok, ControllerError::code);
        if let Some(metrics) = &self.inner.metrics {
            metrics.observe_rpc(method, code, started.elapsed());
        }
        // One line a call, at debug: how each ended, for a person reading the log and for
        // the simulation's timeline (which catches this target).
        tracing::debug!(
            target: "spur_operator::rpc",
            method,
            outcome = call_outcome(&result),
            code = crate::metrics::code_name(code),
            elapsed_ms = started.elapsed().as_millis() as u64,
            error = result.as_ref().err().map(ToString::to_string).unwrap_or_default(),
            "controller call ended"
        );
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
        Req: Question,
        Resp: Answer,
    {
        let asked = message.asked().to_vec();
        let (call, channel, abandoned) = self.enter_call();
        let guard = CallGuard {
            client: self,
            call,
            armed: true,
        };
        let channel = match self.await_channel(channel).await {
            Ok(channel) => channel,
            Err(error) => {
                guard.end(Ended::Left);
                return Err(error);
            }
        };
        // Checked now, not when the call started: the wait for a channel can outlast the
        // hold on the Lease. Held until the answer, so a release waits for it.
        let _permit = match self.fenced(method) {
            Ok(permit) => permit,
            Err(refused) => {
                guard.end(Ended::Left);
                return Err(ControllerError::NotActing { method, refused });
            }
        };
        let (client, request) = self.request_on(channel, message);
        let started = tokio::time::Instant::now();
        let answer = tokio::select! {
            answer = rpc(client, request) => answer,
            Ok(()) = abandoned => {
                guard.end(Ended::Left);
                return Err(ControllerError::Status {
                    method,
                    code: Code::Cancelled,
                    message: format!(
                        "abandoned after {:?}: another channel through the Service serves reads",
                        started.elapsed()
                    ),
                    leader_hint: None,
                });
            }
        };
        match answer {
            Ok(response) => self.on_response(guard, method, &asked, started, response),
            Err(status) => Err(self.on_status(guard, method, &asked, started, status)),
        }
    }

    /// Enters a call: gives it an id and a place among the calls waiting for a channel and
    /// those that can be abandoned, and tells the policy it started.
    fn enter_call(&self) -> (CallId, ChannelWait, oneshot::Receiver<()>) {
        let mut state = self.lock();
        let call = state.next_call;
        state.next_call += 1;
        let (give, channel) = oneshot::channel();
        let (abandon, abandoned) = oneshot::channel();
        state.waiting.insert(call, give);
        state.running.insert(call, abandon);
        self.apply(&mut state, Event::CallStarted { call });
        (call, channel, abandoned)
    }

    /// The channel the policy gives a call, or why it gives none.
    async fn await_channel(&self, channel: ChannelWait) -> Result<Channel, ControllerError> {
        match channel.await {
            Ok(Ok(channel)) => Ok(channel),
            Ok(Err(error)) => Err(error),
            Err(_) => Err(self.connect_error("the client stopped waiting for a channel")),
        }
    }

    /// A client on `channel` and the request carrying `message`, with the bounds on message
    /// size and the authorization this client sends.
    fn request_on<Req>(
        &self,
        channel: Channel,
        message: Req,
    ) -> (pb::SlurmControllerClient<Channel>, Request<Req>) {
        let client = pb::SlurmControllerClient::new(channel)
            .max_decoding_message_size(self.inner.max_message_bytes)
            .max_encoding_message_size(self.inner.max_message_bytes);
        let mut request = Request::new(message);
        if let Some(auth) = &self.inner.authorization {
            request.metadata_mut().insert("authorization", auth.clone());
        }
        (client, request)
    }

    /// Ends a call answered by `response`: as answered, or as behind (rule 6).
    fn on_response<Resp: Answer>(
        &self,
        guard: CallGuard<'_>,
        method: &'static str,
        asked: &[u32],
        started: tokio::time::Instant,
        response: Response<Resp>,
    ) -> Result<Resp, ControllerError> {
        let response = response.into_inner();
        if let Some(behind) = self.behind(guard.call, response.jobs(), asked, started) {
            return Err(self.leave_behind(guard, method, behind));
        }
        guard.end(Ended::Answered);
        Ok(response)
    }

    /// Ends a call that failed with `status`, as behind, failed (the channel's fault) or
    /// answered (the request's), and gives the error its caller gets.
    fn on_status(
        &self,
        guard: CallGuard<'_>,
        method: &'static str,
        asked: &[u32],
        started: tokio::time::Instant,
        status: Status,
    ) -> ControllerError {
        // NOT_FOUND for a job whose end a replica acknowledged: this one never heard of it.
        if status.code() == Code::NotFound
            && let Some(behind) = self.behind(guard.call, &[], asked, started)
        {
            return self.leave_behind(guard, method, behind);
        }
        let leader_hint = leader_hint(status.metadata());
        let error = ControllerError::Status {
            method,
            code: status.code(),
            // The causes say which bound fired (e.g. "keep-alive timed out").
            message: status_text(&status),
            leader_hint,
        };
        let ended = match classify(status.code()) {
            FailureKind::Transport => {
                self.lock().last_call_failure = Some(error.to_string());
                Ended::Failed
            }
            FailureKind::Answer => Ended::Answered,
        };
        guard.end(ended);
        // Not a cause for a later drop when this failure dropped nothing.
        self.lock().last_call_failure = None;
        error
    }

    /// Rule 6: whether `jobs`, read by `call` sent at `sent` that asked for `asked` by id,
    /// contradict an acknowledged end.
    fn behind(
        &self,
        call: CallId,
        jobs: &[pb::JobInfo],
        asked: &[u32],
        sent: tokio::time::Instant,
    ) -> Option<super::session::Behind> {
        if jobs.is_empty() && asked.is_empty() {
            return None;
        }
        let mut state = self.lock();
        let grace = state.policy.rules().read_your_writes?;
        let (dial, replica) = state.policy.channel_of(call);
        let from = ReadFrom { dial, replica };
        state.session.check(jobs, asked, sent, from, grace)
    }

    /// Ends a call whose read was behind as the policy's cue to leave its replica, and
    /// answers it UNAVAILABLE so its caller tries again.
    fn leave_behind(
        &self,
        guard: CallGuard<'_>,
        method: &'static str,
        behind: super::session::Behind,
    ) -> ControllerError {
        tracing::warn!(addr = %self.inner.addr, %behind, "leaving the controller replica reached: its reads are behind");
        guard.end(Ended::Behind);
        ControllerError::Status {
            method,
            code: Code::Unavailable,
            message: behind.to_string(),
            leader_hint: None,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner.state.lock().expect("controller client lock")
    }

    fn feed(&self, event: Event) {
        let mut state = self.lock();
        self.apply(&mut state, event);
    }

    /// Feeds `event` to the policy and carries out what it answers.
    fn apply(&self, state: &mut State, event: Event) {
        let commands = state.policy.on(tokio::time::Instant::now(), event);
        for command in commands {
            self.execute(state, command);
        }
        if let Some(metrics) = &self.inner.metrics {
            for rule in state.policy.take_fired() {
                metrics.channel_rule(rule.name());
            }
        } else {
            state.policy.take_fired();
        }
        self.schedule_tick(state);
    }

    fn execute(&self, state: &mut State, command: Command) {
        match command {
            Command::Dial { dial } => {
                let client = self.clone();
                spawn(async move { client.dial(dial).await });
            }
            Command::Probe { dial, named } => {
                let Some((channel, bound)) = probe_target(state, dial) else {
                    return;
                };
                let client = self.clone();
                spawn(async move {
                    let deadline = tokio::time::Instant::now() + bound;
                    if named {
                        client.name(dial, channel.clone(), bound).await;
                    }
                    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                    let answered = client.probe(channel, left).await;
                    client.feed(Event::Probed { dial, answered });
                });
            }
            Command::Name { dial } => {
                let Some((channel, bound)) = probe_target(state, dial) else {
                    return;
                };
                let client = self.clone();
                spawn(async move { client.name(dial, channel, bound).await });
            }
            Command::Share { dial } => {
                tracing::debug!(
                    generation = dial,
                    "the controller channel every call shares"
                );
            }
            Command::Use { call, dial } => {
                let channel = state.channels.get(&dial).cloned();
                if let (Some(give), Some(channel)) = (state.waiting.remove(&call), channel) {
                    let _ = give.send(Ok(channel));
                }
            }
            Command::Drop { dial, rule } => {
                state.channels.remove(&dial);
                if rule == Rule::DropOnFailure {
                    let cause = state.last_call_failure.take();
                    let cause = cause.as_deref().unwrap_or("a call failed in transport");
                    tracing::warn!(addr = %self.inner.addr, %cause, "dropping the controller channel; the next call connects afresh");
                    if let Some(m) = &self.inner.metrics {
                        m.channel_drops.inc();
                    }
                } else {
                    tracing::info!(addr = %self.inner.addr, rule = rule.name(), "replacing the controller channel");
                }
            }
            Command::Discard { dial } => {
                state.channels.remove(&dial);
            }
            Command::Abandon { call } => {
                if let Some(abandon) = state.running.remove(&call) {
                    let _ = abandon.send(());
                }
            }
            Command::Fail { call } => {
                let error = state
                    .last_dial_error
                    .clone()
                    .unwrap_or_else(|| self.connect_error("no dial made a channel"));
                if let Some(give) = state.waiting.remove(&call) {
                    let _ = give.send(Err(error));
                }
            }
        }
    }

    /// Keeps one ticker task running while the policy wants ticks.
    fn schedule_tick(&self, state: &mut State) {
        if state.policy.next_wake().is_none() {
            return;
        }
        if state.ticking {
            state.wake.notify_one();
            return;
        }
        let (client, wake) = (self.clone(), state.wake.clone());
        state.ticking = spawn(async move {
            loop {
                let next = {
                    let mut state = client.lock();
                    match state.policy.next_wake() {
                        Some(at) => at,
                        None => {
                            state.ticking = false;
                            return;
                        }
                    }
                };
                tokio::select! {
                    () = tokio::time::sleep_until(next) => {
                        let mut state = client.lock();
                        client.apply(&mut state, Event::Tick);
                    }
                    () = wake.notified() => {}
                }
            }
        });
    }

    /// Dials the Service (dial `dial` of the policy) and reports the outcome.
    async fn dial(&self, dial: DialId) {
        let dialed = (self.inner.connector)().await;
        let mut state = self.lock();
        let ok = match dialed {
            Ok(channel) => {
                if let Some(m) = &self.inner.metrics {
                    m.channel_connects.inc();
                }
                state.channels.insert(dial, channel);
                true
            }
            Err(source) => {
                if let Some(m) = &self.inner.metrics {
                    m.channel_connect_failures.inc();
                }
                tracing::info!(addr = %self.inner.addr, %source, "a connect to the controller failed");
                state.last_dial_error = Some(ControllerError::Connect {
                    addr: self.inner.addr.to_string(),
                    source,
                });
                false
            }
        };
        self.apply(&mut state, Event::Dialed { dial, ok });
    }

    /// Pings `channel` within `bound` and tells the policy which replica answered (every
    /// replica answers Ping itself with its own name: fidelity.md row 3).
    async fn name(&self, dial: DialId, channel: Channel, bound: std::time::Duration) {
        let mut client = pb::SlurmControllerClient::new(channel);
        let mut request = Request::new(());
        request.set_timeout(bound);
        if let Some(auth) = &self.inner.authorization {
            request.metadata_mut().insert("authorization", auth.clone());
        }
        let Ok(Ok(answer)) = tokio::time::timeout(bound, client.ping(request)).await else {
            return;
        };
        let hostname = answer.into_inner().hostname;
        let mut state = self.lock();
        let next = state.replicas.len() as ReplicaId;
        let replica = *state.replicas.entry(hostname).or_insert(next);
        state.session.named(dial, replica);
        self.apply(&mut state, Event::Named { dial, replica });
    }

    /// The probe's read over a new channel within `bound`: whether it was answered.
    async fn probe(&self, channel: Channel, bound: std::time::Duration) -> bool {
        let mut client = pb::SlurmControllerClient::new(channel)
            .max_decoding_message_size(self.inner.max_message_bytes);
        let mut request = Request::new(probe_request());
        request.set_timeout(bound);
        if let Some(auth) = &self.inner.authorization {
            request.metadata_mut().insert("authorization", auth.clone());
        }
        let verdict = match tokio::time::timeout(bound, client.get_jobs(request)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(status)) if classify(status.code()) == FailureKind::Answer => Ok(()),
            Ok(Err(status)) => Err(format!("{:?} {}", status.code(), status.message())),
            Err(_) => Err(format!("no answer within {bound:?}")),
        };
        match verdict {
            Ok(()) => true,
            Err(why) => {
                tracing::info!(addr = %self.inner.addr, %why, "a new controller channel's probe failed");
                self.lock().last_dial_error = Some(self.connect_error(&format!(
                    "the channel's probe (a forwarded read) failed: {why}"
                )));
                false
            }
        }
    }

    fn connect_error(&self, why: &str) -> ControllerError {
        ControllerError::Connect {
            addr: self.inner.addr.to_string(),
            source: ConnectError::Other(why.to_owned()),
        }
    }
}

/// Dial `dial`'s channel and the probe's bound, for a probe or a Ping that names it.
fn probe_target(state: &State, dial: DialId) -> Option<(Channel, std::time::Duration)> {
    Some((
        state.channels.get(&dial)?.clone(),
        state.policy.rules().probe?,
    ))
}

/// Spawns `task` on the current runtime; outside one (a call dropped while its runtime
/// shuts down) there is nothing left to do it for.
fn spawn(task: impl Future<Output = ()> + Send + 'static) -> bool {
    let runtime = tokio::runtime::Handle::try_current();
    if let Ok(runtime) = &runtime {
        runtime.spawn(task);
    }
    runtime.is_ok()
}

fn leader_hint(metadata: &MetadataMap) -> Option<String> {
    metadata
        .get(spur_proto::LEADER_HINT_KEY)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(str::to_owned)
}

/// How a call ended, in the words of the operator's call log: `answered` (the controller
/// gave its answer), `refused` (it answered with an error), `transport` (no answer: the
/// connection failed or a bound fired), `abandoned` (the channel rule gave up on it) or
/// `fenced` (not sent: this replica no longer holds the Lease).
fn call_outcome<T>(result: &Result<T, ControllerError>) -> &'static str {
    match result {
        Ok(_) => "answered",
        Err(ControllerError::NotActing { .. }) => "fenced",
        Err(ControllerError::Status { code, message, .. })
            if *code == Code::Cancelled && message.starts_with("abandoned") =>
        {
            "abandoned"
        }
        Err(error) => match classify(error.code()) {
            FailureKind::Answer => "refused",
            FailureKind::Transport => "transport",
        },
    }
}

#[cfg(test)]
mod question_tests {
    use super::*;

    #[test]
    fn only_a_read_by_id_alone_asks_for_its_ids() {
        let by_id = pb::GetJobsRequest {
            job_ids: vec![4, 9],
            ..Default::default()
        };
        assert_eq!(by_id.asked(), &[4, 9]);
        let by_name = pb::GetJobsRequest {
            job_ids: vec![4],
            name: "train".into(),
            ..Default::default()
        };
        assert!(
            by_name.asked().is_empty(),
            "the name filter may leave job 4 out"
        );
        let by_state = pb::GetJobsRequest {
            job_ids: vec![4],
            states: vec![pb::JobState::JobRunning.into()],
            ..Default::default()
        };
        assert!(by_state.asked().is_empty());
        assert_eq!(pb::GetJobRequest { job_id: 7 }.asked(), &[7]);
    }
}
