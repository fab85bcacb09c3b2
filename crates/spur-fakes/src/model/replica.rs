//! One replica's `slurm.SlurmController` server.
//!
//! Answers as a real highly available spurctld answers (docs/specs.md: "How a replicated
//! spurctld answers" in the wire subset, and the fidelity rows): the leader applies writes; a follower forwards them over its own unbounded
//! tonic client (one per leader, cached) with `x-spur-forwarded: true` and returns that
//! client's answer or error as its own; with no forwarding client it answers UNAVAILABLE
//! `not the Raft leader`, with `x-spur-leader` only while it knows a leader. Reads are
//! forwarded when possible and otherwise served from the replica's own, possibly stale,
//! copy. Ping is answered locally, never forwarded. The codes and texts of refusals are
//! spurctld's, pinned by `sim/tests/controller_conformance.rs` on the real binary.

use std::future::Future;
use std::sync::{Arc, Mutex};

use spur_operator::net::Dialer;
use spur_proto as pb;
use spur_proto::{FORWARDED_KEY, LEADER_HINT_KEY, SlurmControllerClient};
use tonic::metadata::AsciiMetadataValue;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Request, Response, Status};

use super::Clock;
use super::admission;
use super::auth::{AuthPolicy, Caller};
use super::cluster::{Cluster, LostReply, ProposeError, RefusalKind, Role};
use super::scheduler;
use super::state::{AgentStop, Command, Effect, node_not_found};
use spur_operator::net::Connector;

type Client = SlurmControllerClient<Channel>;

/// How much of an answer the trace shows.
const MAX_ANSWER_IN_TRACE: usize = 160;

/// One replica's server. Cloning shares it.
#[derive(Clone)]
pub struct Replica<D: Dialer> {
    inner: Arc<ReplicaInner<D>>,
}

struct ReplicaInner<D> {
    slot: usize,
    host: String,
    cluster: Cluster,
    dialer: D,
    clock: Clock,
    /// The forwarding client, for the leader it was made for.
    forward: Mutex<Option<(String, Client)>>,
}

/// UNAVAILABLE from a replica that cannot reach a leader, as spurctld answers it: the
/// same text with or without a leader, the hint only while it knows one.
pub fn not_leader(leader: Option<&str>, port: u16) -> Status {
    let mut status = Status::unavailable("not the Raft leader");
    if let Some(leader) = leader
        && let Ok(value) = format!("{leader}:{port}").parse()
    {
        status.metadata_mut().insert(LEADER_HINT_KEY, value);
    }
    status
}

/// The GPU request forms of a spec (a `gpu:` gres entry is one): spurctld accepts one.
fn gpu_request_forms(spec: &pb::JobSpec) -> usize {
    usize::from(spec.gpus_per_node.is_some())
        + usize::from(spec.gres.iter().any(|g| g.starts_with("gpu")))
}

/// SubmitJob's refusals, in spurctld's words (INVALID_ARGUMENT).
fn validate(spec: &pb::JobSpec) -> Result<(), Status> {
    if !spec.partition.is_empty() && spec.partition != "default" {
        return Err(Status::invalid_argument(format!(
            "partition '{}' not found",
            spec.partition
        )));
    }
    if gpu_request_forms(spec) > 1 {
        return Err(Status::invalid_argument(
            "only one GPU request form (gpus, gpus_per_node, gpus_per_task, or a gpu gres entry) may be set",
        ));
    }
    super::limits::check_submission_size(spec)?;
    if !spec.array_spec.is_empty() {
        super::state::array_tasks(&spec.array_spec)
            .map_err(|e| Status::invalid_argument(format!("invalid array spec: {e}")))?;
    }
    Ok(())
}

/// Whether a forward failed in the transport rather than being answered by the leader.
fn is_transport_error(status: &Status) -> bool {
    matches!(
        status.code(),
        Code::Unavailable | Code::Unknown | Code::Cancelled | Code::DeadlineExceeded
    )
}

/// The same code, message and leader hint, without the leader's response headers.
fn relay(status: Status) -> Status {
    let mut relayed = Status::new(status.code(), status.message());
    if let Some(hint) = status.metadata().get(LEADER_HINT_KEY) {
        relayed.metadata_mut().insert(LEADER_HINT_KEY, hint.clone());
    }
    relayed
}

fn forwarded<T>(request: &Request<T>) -> bool {
    request.metadata().get(FORWARDED_KEY).is_some()
}

enum Route {
    Local,
    Forward(String),
    Refuse(Option<String>),
}

impl<D: Dialer> Replica<D> {
    /// The server of the pod `host` in replica slot `slot`.
    pub fn new(slot: usize, host: &str, cluster: Cluster, dialer: D, clock: Clock) -> Self {
        Self {
            inner: Arc::new(ReplicaInner {
                slot,
                host: host.to_owned(),
                cluster,
                dialer,
                clock,
                forward: Mutex::new(None),
            }),
        }
    }

    /// Its slot.
    pub fn slot(&self) -> usize {
        self.inner.slot
    }

    /// Its host name.
    pub fn host(&self) -> &str {
        &self.inner.host
    }

    /// The shared cluster.
    pub fn cluster(&self) -> &Cluster {
        &self.inner.cluster
    }

    /// Its dialer (for forwards and agent calls).
    pub fn dialer(&self) -> &D {
        &self.inner.dialer
    }

    /// Its clock.
    pub fn clock(&self) -> Clock {
        self.inner.clock
    }

    /// Time since the start of the run, by this replica's clock.
    pub(super) fn now(&self) -> std::time::Duration {
        (self.inner.clock.elapsed)()
    }

    fn port(&self) -> u16 {
        self.inner.cluster.config().port
    }

    /// Records `event` on this replica in the trace.
    pub(super) fn record(&self, event: String) {
        self.inner
            .cluster
            .trace()
            .record(self.now(), &self.inner.host, event);
    }

    fn route(&self, forwarded: bool) -> Route {
        match self.inner.cluster.role(self.inner.slot) {
            Role::Leader => Route::Local,
            Role::Follower {
                leader: Some(leader),
            } if !forwarded => Route::Forward(leader),
            Role::Follower { leader } => Route::Refuse(leader),
        }
    }

    /// The cached forwarding client for `leader`, or a new one. Like spurctld's, it has
    /// no connect timeout, no keepalive and no request bound.
    async fn forward_client(&self, leader: &str) -> Result<Client, Status> {
        if let Some((cached_for, client)) = &*self.inner.forward.lock().expect("forward lock")
            && cached_for == leader
        {
            return Ok(client.clone());
        }
        let uri = format!("http://{leader}:{}", self.port());
        let endpoint = Endpoint::from_shared(uri).map_err(|e| Status::internal(e.to_string()))?;
        let connector = Connector::new(self.inner.dialer.clone());
        match endpoint.connect_with_connector(connector).await {
            Ok(channel) => {
                // spurctld's leader client: requests up to 8 MiB, answers up to 32 MiB.
                let client = SlurmControllerClient::new(channel)
                    .max_encoding_message_size(super::limits::MAX_REQUEST_BYTES)
                    .max_decoding_message_size(super::limits::MAX_RESPONSE_BYTES);
                *self.inner.forward.lock().expect("forward lock") =
                    Some((leader.to_owned(), client.clone()));
                Ok(client)
            }
            Err(error) => {
                self.record(format!("forward connect to {leader} failed: {error}"));
                Err(not_leader(Some(leader), self.port()))
            }
        }
    }

    /// Sends `message` to `leader` through `call` and returns its answer as ours.
    async fn forward<Req, Resp, F, Fut>(
        &self,
        method: &str,
        leader: &str,
        message: Req,
        authorization: Option<AsciiMetadataValue>,
        call: F,
    ) -> Result<Response<Resp>, Status>
    where
        F: FnOnce(Client, Request<Req>) -> Fut,
        Fut: Future<Output = Result<Response<Resp>, Status>>,
    {
        let client = self.forward_client(leader).await?;
        let mut request = Request::new(message);
        request
            .metadata_mut()
            .insert(FORWARDED_KEY, "true".parse().expect("ascii"));
        // Only the caller's token travels with a forward, as spurctld sends it on.
        if let Some(authorization) = authorization {
            request
                .metadata_mut()
                .insert("authorization", authorization);
        }
        match call(client, request).await {
            Ok(response) => Ok(Response::new(response.into_inner())),
            Err(status) => {
                self.record(format!(
                    "{method} forward to {leader}: {:?} {}",
                    status.code(),
                    status.message()
                ));
                Err(relay(status))
            }
        }
    }

    /// Commits `command` on this replica as leader, waiting while it lacks a majority. A
    /// proposal of a leader cut off from its majority waits until the replica learns of a
    /// newer term (another leader reaches it, or it wins a new election itself) and then
    /// fails, as an openraft proposal of an older term does (docs/specs.md, fidelity row 8).
    pub(super) async fn commit(&self, command: Command) -> Result<Effect, Status> {
        let proposed_in = self.inner.cluster.term();
        loop {
            match self
                .inner
                .cluster
                .propose(self.inner.slot, command.clone(), self.now())
            {
                Ok(outcome) => return Ok(outcome),
                Err(ProposeError::Refused(status)) => return Err(status),
                Err(ProposeError::NotLeader { leader }) => {
                    return Err(not_leader(leader.as_deref(), self.port()));
                }
                Err(ProposeError::NoQuorum) => {
                    tokio::time::sleep(self.inner.cluster.config().commit_retry).await;
                    let cluster = &self.inner.cluster;
                    let newer = cluster.term() != proposed_in
                        && (cluster.role(self.inner.slot) != Role::Leader
                            || cluster.leader().as_deref() == Some(self.inner.host.as_str()));
                    if newer {
                        return Err(Status::internal(
                            "raft propose failed: the proposal's term has ended (a newer leader was elected)",
                        ));
                    }
                }
            }
        }
    }

    /// A write: applied here when leading, else forwarded.
    async fn write<Req, Resp: std::fmt::Debug, F, Fut, L, LFut>(
        &self,
        method: &str,
        request: Request<Req>,
        local: L,
        call: F,
    ) -> Result<Response<Resp>, Status>
    where
        F: FnOnce(Client, Request<Req>) -> Fut,
        Fut: Future<Output = Result<Response<Resp>, Status>>,
        L: FnOnce(Req) -> LFut,
        LFut: Future<Output = Result<Resp, Status>>,
    {
        let from_a_replica = forwarded(&request);
        if let Err(refused) = self.caller(&request) {
            let answer = Err(refused);
            self.record_answer(method, from_a_replica, &answer);
            return answer;
        }
        let route = self.route(from_a_replica);
        let authorization = request.metadata().get("authorization").cloned();
        let message = request.into_inner();
        let answer = match route {
            Route::Local => match local(message).await {
                Ok(applied) => match self.inner.cluster.take_lost_reply(method) {
                    None => Ok(Response::new(applied)),
                    Some(how) => {
                        self.record(format!(
                            "{method} applied; its reply is lost ({how:?}): {applied:?}"
                        ));
                        match how {
                            LostReply::TransportError => Err(Status::unknown("transport error")),
                            LostReply::Hang => std::future::pending().await,
                        }
                    }
                },
                Err(status) => Err(status),
            },
            Route::Forward(leader) => {
                self.forward(method, &leader, message, authorization, call)
                    .await
            }
            Route::Refuse(leader) => Err(not_leader(leader.as_deref(), self.port())),
        };
        self.record_answer(method, from_a_replica, &answer);
        answer
    }

    /// A read: forwarded when possible, else served from this replica's copy.
    async fn read<Req, Resp: std::fmt::Debug, F, Fut>(
        &self,
        method: &str,
        request: Request<Req>,
        local: impl FnOnce(&Req) -> Result<Resp, Status>,
        call: F,
    ) -> Result<Response<Resp>, Status>
    where
        Req: Clone,
        F: FnOnce(Client, Request<Req>) -> Fut,
        Fut: Future<Output = Result<Response<Resp>, Status>>,
    {
        let from_a_replica = forwarded(&request);
        if let Err(refused) = self.caller(&request) {
            let answer = Err(refused);
            self.record_answer(method, from_a_replica, &answer);
            return answer;
        }
        let route = self.route(from_a_replica);
        let authorization = request.metadata().get("authorization").cloned();
        let message = request.into_inner();
        let answer = match route {
            Route::Forward(leader) => {
                match self
                    .forward(method, &leader, message.clone(), authorization, call)
                    .await
                {
                    Err(status) if is_transport_error(&status) => {
                        local(&message).map(Response::new)
                    }
                    answer => answer,
                }
            }
            Route::Local | Route::Refuse(_) => local(&message).map(Response::new),
        };
        self.record_answer(method, from_a_replica, &answer);
        answer
    }

    /// Records the answer to a `method` call; one a follower forwarded is marked so, so the
    /// trace tells the calls a client made from their forwards (`Ping (forwarded) -> ok`).
    fn record_answer<T: std::fmt::Debug>(
        &self,
        method: &str,
        forwarded: bool,
        answer: &Result<Response<T>, Status>,
    ) {
        let method = if forwarded {
            format!("{method} (forwarded)")
        } else {
            method.to_owned()
        };
        let event = match answer {
            Ok(response) => {
                // Long answers (GetJobs) are cut: the trace records what happened, the
                // log holds the state.
                let mut shown = format!("{:?}", response.get_ref());
                if shown.len() > MAX_ANSWER_IN_TRACE {
                    let cut = (0..=MAX_ANSWER_IN_TRACE)
                        .rev()
                        .find(|i| shown.is_char_boundary(*i))
                        .unwrap_or(0);
                    shown.truncate(cut);
                    shown.push('…');
                }
                format!("{method} -> ok {shown}")
            }
            Err(status) => format!("{method} -> {:?} {}", status.code(), status.message()),
        };
        self.record(event);
    }

    /// The verified caller of `request` (`None`: no token, and the mode admits that), or
    /// spurctld's refusal.
    fn caller<T>(&self, request: &Request<T>) -> Result<Option<Caller>, Status> {
        let config = self.inner.cluster.config();
        let policy = AuthPolicy {
            key: config.agent_key.as_deref(),
            required: config.auth_required,
        };
        policy.caller(request.metadata(), (self.inner.clock.wall)())
    }

    /// `request` with its user field (the one `user` picks) set to the verified caller, as
    /// spurctld trusts a token's subject over what a request says; unchanged without one.
    fn as_caller<T>(
        &self,
        mut request: Request<T>,
        user: impl FnOnce(&mut T) -> Option<&mut String>,
    ) -> Request<T> {
        if let Ok(Some(caller)) = self.caller(&request)
            && let Some(field) = user(request.get_mut())
        {
            *field = caller.user;
        }
        request
    }

    /// spurctld's check of an admin call (`op`, as its refusal names it): a caller with no
    /// token is trusted, as permissive trusts it; a token must name an admin.
    fn require_admin<T>(&self, request: &Request<T>, op: &str) -> Result<(), Status> {
        match self.caller(request)? {
            Some(caller) if !caller.admin => Err(Status::permission_denied(format!(
                "{op} requires cluster admin"
            ))),
            _ => Ok(()),
        }
    }

    /// Whether `registration` changes what this replica, leading, holds of the node; one
    /// that does not is answered without a proposal, as spurctld answers it. A replica no
    /// longer leading lets the commit give the answer.
    fn registration_changes(&self, registration: &Command) -> bool {
        let Command::RegisterNode {
            name,
            address,
            port,
            resources,
            labels,
        } = registration
        else {
            return true;
        };
        self.inner
            .cluster
            .leader_local(self.inner.slot, |state| {
                Ok(state.registration_changes(name, address, *port, resources, labels))
            })
            .unwrap_or(true)
    }

    /// The node token a registration is answered with: empty under open admission; under
    /// token admission, once its join token passed spurctld's checks on the leader's copy.
    fn admit(&self, registration: &pb::RegisterAgentRequest) -> Result<String, Status> {
        let config = self.inner.cluster.config();
        if !config.token_admission {
            return Ok(String::new());
        }
        let now = (self.inner.clock.wall)();
        let checked = self.inner.cluster.leader_local(self.inner.slot, |state| {
            admission::admit(
                &registration.join_token,
                |id| state.join_tokens.get(id),
                now,
            )
        });
        self.leader_answer(checked)?;
        Ok(admission::node_token(
            &registration.hostname,
            self.node_token_key(),
            now,
            config.node_token_lifetime,
        ))
    }

    /// Under token admission, a heartbeat's node token must be one this cluster signed for
    /// its host, not expired.
    fn check_node_token(&self, heartbeat: &pb::HeartbeatRequest) -> Result<(), Status> {
        if !self.inner.cluster.config().token_admission {
            return Ok(());
        }
        let now = (self.inner.clock.wall)();
        admission::check_node_token(
            &heartbeat.node_token,
            &heartbeat.hostname,
            self.node_token_key(),
            now,
        )
    }

    /// `[auth] jwt_key`, or the well-known key spurctld signs node tokens with without one.
    fn node_token_key(&self) -> &[u8] {
        self.inner
            .cluster
            .config()
            .agent_key
            .as_deref()
            .unwrap_or(admission::DEFAULT_NODE_TOKEN_KEY)
    }

    /// A leader-local check's outcome as the client's answer.
    fn leader_answer<T>(&self, checked: Result<T, ProposeError>) -> Result<T, Status> {
        match checked {
            Ok(value) => Ok(value),
            Err(ProposeError::Refused(status)) => Err(status),
            Err(ProposeError::NotLeader { leader }) => {
                Err(not_leader(leader.as_deref(), self.port()))
            }
            Err(ProposeError::NoQuorum) => unreachable!("a leader-local check"),
        }
    }

    /// Spawns `SlurmAgent.CancelJob` on the nodes a cancelled job held.
    fn stop_on_agents(&self, stops: Vec<AgentStop>) {
        for stop in stops {
            let replica = self.clone();
            tokio::spawn(async move {
                scheduler::stop_on_agent(&replica, &stop).await;
            });
        }
    }
}

#[tonic::async_trait]
impl<D: Dialer> pb::SlurmController for Replica<D> {
    async fn ping(&self, request: Request<()>) -> Result<Response<pb::PingResponse>, Status> {
        // Answered by this process alone, leader or not: it says "this replica is up",
        // nothing about leadership.
        let answer = self.caller(&request).map(|_| {
            Response::new(pb::PingResponse {
                hostname: self.inner.host.clone(),
                server_time: Some((self.inner.clock.wall)().into()),
                version: self.inner.cluster.config().version.clone(),
            })
        });
        self.record_answer("Ping", forwarded(&request), &answer);
        answer
    }

    async fn register_agent(
        &self,
        request: Request<pb::RegisterAgentRequest>,
    ) -> Result<Response<pb::RegisterAgentResponse>, Status> {
        let this = self.clone();
        self.write(
            "RegisterAgent",
            request,
            |req| async move {
                match this.inner.cluster.registration_refusal(this.now()) {
                    Some(RefusalKind::PermissionDenied) => {
                        return Err(Status::permission_denied("registration refused"));
                    }
                    Some(RefusalKind::NotAccepted) => {
                        return Ok(pb::RegisterAgentResponse {
                            accepted: false,
                            message: "registration refused for now".to_owned(),
                            node_token: String::new(),
                        });
                    }
                    None => {}
                }
                let node_token = this.admit(&req)?;
                let name = req.hostname.clone();
                this.inner
                    .cluster
                    .heard_from(this.inner.slot, &name, this.now());
                let command = Command::RegisterNode {
                    name: req.hostname,
                    address: req.address,
                    port: req.port,
                    resources: req.resources.unwrap_or_default(),
                    labels: req.labels,
                };
                if this.registration_changes(&command) {
                    this.commit(command).await?;
                }
                Ok(pb::RegisterAgentResponse {
                    accepted: true,
                    message: "registered".to_owned(),
                    node_token,
                })
            },
            |mut client, request| async move { client.register_agent(request).await },
        )
        .await
    }

    async fn heartbeat(
        &self,
        request: Request<pb::HeartbeatRequest>,
    ) -> Result<Response<pb::HeartbeatResponse>, Status> {
        let this = self.clone();
        self.write(
            "Heartbeat",
            request,
            |req| async move {
                this.check_node_token(&req)?;
                // Kept in the leader's memory, no Raft write: a leader without a quorum
                // answers it too.
                let known = this.inner.cluster.leader_local(this.inner.slot, |state| {
                    if state.nodes.contains_key(&req.hostname) {
                        Ok(())
                    } else {
                        Err(node_not_found(&req.hostname))
                    }
                });
                this.leader_answer(known)?;
                this.inner
                    .cluster
                    .heard_from(this.inner.slot, &req.hostname, this.now());
                Ok(pb::HeartbeatResponse {})
            },
            |mut client, request| async move { client.heartbeat(request).await },
        )
        .await
    }

    async fn update_node(
        &self,
        request: Request<pb::UpdateNodeRequest>,
    ) -> Result<Response<()>, Status> {
        let this = self.clone();
        // Judged by the replica that applies it, the leader, as spurctld judges it there.
        let admin = self.require_admin(&request, "update node");
        self.write(
            "UpdateNode",
            request,
            |req| async move {
                admin?;
                let state = match req.state {
                    Some(value) => Some(
                        pb::NodeState::try_from(value)
                            .map_err(|_| Status::invalid_argument("invalid node state"))?,
                    ),
                    None => None,
                };
                // Nothing to change: spurctld answers OK without looking the node up.
                if state.is_none() && req.labels.is_empty() && req.remove_labels.is_empty() {
                    return Ok(());
                }
                this.commit(Command::UpdateNode {
                    name: req.name,
                    state,
                    reason: req.reason,
                    labels: req.labels,
                    remove_labels: req.remove_labels,
                })
                .await?;
                Ok(())
            },
            |mut client, request| async move { client.update_node(request).await },
        )
        .await
    }

    async fn submit_job(
        &self,
        request: Request<pb::SubmitJobRequest>,
    ) -> Result<Response<pb::SubmitJobResponse>, Status> {
        let this = self.clone();
        // spurctld also looks the subject up in its passwd for the job's uid; the model
        // keeps no passwd and takes the name as it is.
        let request = self.as_caller(request, |r| r.spec.as_mut().map(|s| &mut s.user));
        self.write(
            "SubmitJob",
            request,
            |req| async move {
                let spec = req
                    .spec
                    .ok_or_else(|| Status::invalid_argument("missing job spec"))?;
                validate(&spec)?;
                let at = (this.inner.clock.wall)();
                match this
                    .commit(Command::SubmitJob {
                        spec: Box::new(spec),
                        at,
                    })
                    .await?
                {
                    Effect::JobId(job_id) => Ok(pb::SubmitJobResponse {
                        job_id,
                        warnings: Vec::new(),
                    }),
                    other => Err(Status::internal(format!("unexpected outcome {other:?}"))),
                }
            },
            |mut client, request| async move { client.submit_job(request).await },
        )
        .await
    }

    async fn get_job(
        &self,
        request: Request<pb::GetJobRequest>,
    ) -> Result<Response<pb::JobInfo>, Status> {
        let cluster = self.inner.cluster.clone();
        let slot = self.inner.slot;
        self.read(
            "GetJob",
            request,
            move |req| {
                cluster.read(slot, |state| {
                    state
                        .display(req.job_id)
                        .ok_or_else(|| Status::not_found(format!("job {} not found", req.job_id)))
                })
            },
            |mut client, request| async move { client.get_job(request).await },
        )
        .await
    }

    async fn get_jobs(
        &self,
        request: Request<pb::GetJobsRequest>,
    ) -> Result<Response<pb::GetJobsResponse>, Status> {
        let cluster = self.inner.cluster.clone();
        let slot = self.inner.slot;
        self.read(
            "GetJobs",
            request,
            move |req| {
                Ok(pb::GetJobsResponse {
                    jobs: cluster.read(slot, |state| state.query(req)),
                })
            },
            |mut client, request| async move { client.get_jobs(request).await },
        )
        .await
    }

    async fn get_nodes(
        &self,
        request: Request<pb::GetNodesRequest>,
    ) -> Result<Response<pb::GetNodesResponse>, Status> {
        let cluster = self.inner.cluster.clone();
        let slot = self.inner.slot;
        self.read(
            "GetNodes",
            request,
            move |req| {
                // spurctld's filters: a hostlist of names, and states (partitions are not
                // modelled: every node is in the default one).
                let names: Option<Vec<String>> = (!req.nodelist.trim().is_empty()).then(|| {
                    spur_operator::expand_hostlist(req.nodelist.trim()).unwrap_or_default()
                });
                Ok(pb::GetNodesResponse {
                    nodes: cluster.read(slot, |state| {
                        state
                            .nodes
                            .iter()
                            .filter(|(name, _)| names.as_ref().is_none_or(|n| n.contains(name)))
                            .filter(|(_, node)| {
                                req.states.is_empty() || req.states.contains(&(node.state as i32))
                            })
                            .map(|(name, node)| pb::NodeInfo {
                                name: name.clone(),
                                state: node.state.into(),
                                state_reason: node.reason.clone(),
                            })
                            .collect()
                    }),
                })
            },
            |mut client, request| async move { client.get_nodes(request).await },
        )
        .await
    }

    async fn cancel_job(
        &self,
        request: Request<pb::CancelJobRequest>,
    ) -> Result<Response<()>, Status> {
        let this = self.clone();
        let request = self.as_caller(request, |r| Some(&mut r.user));
        self.write(
            "CancelJob",
            request,
            |req| async move {
                let at = (this.inner.clock.wall)();
                let outcome = this
                    .commit(Command::CancelJob {
                        job_id: req.job_id,
                        user: req.user,
                        at,
                    })
                    .await?;
                if let Effect::Stop(stops) = outcome {
                    this.stop_on_agents(stops);
                }
                Ok(())
            },
            |mut client, request| async move { client.cancel_job(request).await },
        )
        .await
    }

    async fn requeue_job(
        &self,
        request: Request<pb::RequeueJobRequest>,
    ) -> Result<Response<pb::RequeueJobResponse>, Status> {
        let this = self.clone();
        let request = self.as_caller(request, |r| Some(&mut r.user));
        self.write(
            "RequeueJob",
            request,
            |req| async move {
                if req.hold {
                    return Err(Status::unimplemented(
                        "the model does not requeue a job held (no client asks it to)",
                    ));
                }
                let defer_until =
                    (this.inner.clock.wall)() + this.inner.cluster.config().requeue_hold;
                let outcome = this
                    .commit(Command::RequeueJob {
                        job_id: req.job_id,
                        user: req.user,
                        defer_until,
                    })
                    .await?;
                if let Effect::Stop(stops) = outcome {
                    this.stop_on_agents(stops);
                }
                Ok(pb::RequeueJobResponse {
                    requeued: 1,
                    skipped: Vec::new(),
                })
            },
            |mut client, request| async move { client.requeue_job(request).await },
        )
        .await
    }

    async fn report_job_status(
        &self,
        request: Request<pb::ReportJobStatusRequest>,
    ) -> Result<Response<()>, Status> {
        let this = self.clone();
        self.write(
            "ReportJobStatus",
            request,
            |req| async move {
                let state = pb::JobState::try_from(req.state)
                    .map_err(|_| Status::invalid_argument("invalid job state"))?;
                // No node named: an OK no-op, whatever the state.
                if req.reporting_node.is_empty() {
                    return Ok(());
                }
                let upper = |s: pb::JobState| s.as_str_name().trim_start_matches("JOB_").to_owned();
                if !matches!(state, pb::JobState::JobCompleted | pb::JobState::JobFailed) {
                    return Err(Status::invalid_argument(format!(
                        "invalid completion state {}; only COMPLETED or FAILED are accepted for completion reports",
                        upper(state)
                    )));
                }
                let expected = if req.exit_code == 0 {
                    pb::JobState::JobCompleted
                } else {
                    pb::JobState::JobFailed
                };
                if state != expected {
                    return Err(Status::invalid_argument(format!(
                        "completion state {} does not match exit_code {}; expected {}",
                        upper(state),
                        req.exit_code,
                        upper(expected)
                    )));
                }
                let at = (this.inner.clock.wall)();
                this.commit(Command::ReportJobStatus {
                    job_id: req.job_id,
                    node: req.reporting_node,
                    exit_code: req.exit_code,
                    oom: req.signal & pb::OOM_SIGNAL_FLAG != 0,
                    run_attempt: req.run_attempt,
                    at,
                })
                .await?;
                Ok(())
            },
            |mut client, request| async move { client.report_job_status(request).await },
        )
        .await
    }
    async fn create_token(
        &self,
        request: Request<pb::CreateTokenRequest>,
    ) -> Result<Response<pb::CreateTokenResponse>, Status> {
        let this = self.clone();
        let admin = self.require_admin(&request, "create token");
        self.write(
            "CreateToken",
            request,
            |req| async move {
                admin?;
                let (id, secret) = this.inner.cluster.new_join_token();
                let ttl = req.ttl_secs.filter(|secs| *secs > 0);
                let expires_at = ttl.map(|secs| {
                    (this.inner.clock.wall)() + std::time::Duration::from_secs(secs.into())
                });
                let token = admission::record(&secret, expires_at);
                this.commit(Command::CreateToken {
                    id: id.clone(),
                    token,
                })
                .await?;
                Ok(pb::CreateTokenResponse {
                    token: format!("{id}.{secret}"),
                    token_id: id,
                })
            },
            |mut client, request| async move { client.create_token(request).await },
        )
        .await
    }

    async fn revoke_token(
        &self,
        request: Request<pb::RevokeTokenRequest>,
    ) -> Result<Response<pb::RevokeTokenResponse>, Status> {
        let this = self.clone();
        let admin = self.require_admin(&request, "revoke token");
        self.write(
            "RevokeToken",
            request,
            |req| async move {
                admin?;
                this.commit(Command::RevokeToken { id: req.token_id })
                    .await?;
                Ok(pb::RevokeTokenResponse {})
            },
            |mut client, request| async move { client.revoke_token(request).await },
        )
        .await
    }
}
