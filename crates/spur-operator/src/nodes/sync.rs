//! Keeps the controller's view of the labelled Kubernetes nodes in step.
//!
//! One driver task owns the state of every node and decides, per node, the next call to
//! make (register, mark DOWN or IDLE, mark deleted). Calls run with bounded concurrency
//! through the one `ControllerClient`; a failure or refusal backs off that node alone,
//! so one refused node never blocks, or re-lists, the others. What the controller accepted
//! is remembered only after it accepted it, so a refused registration is tried again
//! (lesson 3 of docs/architecture.md).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::Stream;
use futures::future::{BoxFuture, FutureExt, Shared};
use futures::stream::{FuturesUnordered, StreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::runtime::watcher;
use spur_proto as pb;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::admission::{self, JoinToken};
use super::heartbeat::Rejoin;
use super::resources::{AgentEndpoint, Availability, registration};
use crate::controller::ControllerClient;
use crate::metrics::Metrics;
use crate::retry::{Backoff, BackoffPolicy, Entropy};

/// Tunables of node sync; defaults and reasons live on the flags in `config`.
#[derive(Clone, Debug)]
pub struct NodeSyncConfig {
    /// Calls in flight at once.
    pub concurrency: usize,
    /// Per-node retry after a failure or refusal.
    pub retry: BackoffPolicy,
    /// How often a summary of failures may be logged.
    pub failure_log_interval: Duration,
    pub agent: AgentEndpoint,
    /// Sent as the agent version at registration.
    pub version: String,
    /// What a NotReady (or unreachable) taint is told to the controller as.
    pub not_ready: NotReadyState,
    /// Node conditions that drain a node while `True` (`--drain-on-node-condition`).
    pub drain_conditions: Vec<String>,
    /// The join token every registration carries (`--controller-join-token-file`).
    pub join_token: Option<JoinToken>,
    /// How long before its node token expires a node registers again
    /// (`--node-token-renew-before`).
    pub node_token_renew_before: Duration,
}

/// The state a node with a NotReady or unreachable taint is given at the controller
/// (`--not-ready-node-state`). In spurctld (fidelity row 5, and its source) DOWN fails
/// every job running on the node at once (NODE_FAIL), while DRAIN only stops new work
/// (DRAINING while jobs run) and leaves them running; both are admin holds that only an
/// explicit IDLE lifts, which the operator sends once the taint is gone.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum NotReadyState {
    /// No new jobs; running ones go on (a kubelet blip must not kill a day-long job).
    #[default]
    Drain,
    /// No new jobs, and the running ones fail at once.
    Down,
    /// Tell the controller nothing: it keeps scheduling onto the node.
    Ignore,
}

impl NotReadyState {
    fn node_state(self) -> Option<pb::NodeState> {
        match self {
            NotReadyState::Drain => Some(pb::NodeState::NodeDrain),
            NotReadyState::Down => Some(pb::NodeState::NodeDown),
            NotReadyState::Ignore => None,
        }
    }
}

/// The nodes the controller accepted, with the token it gave each; shared with the
/// heartbeat task.
#[derive(Clone, Default)]
pub struct Registered(Arc<Mutex<BTreeMap<String, String>>>);

impl Registered {
    /// A snapshot, in name order.
    pub fn snapshot(&self) -> Vec<(String, String)> {
        let map = self.0.lock().expect("registered lock");
        map.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }

    pub fn len(&self) -> usize {
        self.0.lock().expect("registered lock").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn contains(&self, name: &str) -> bool {
        self.0.lock().expect("registered lock").contains_key(name)
    }

    /// The node token `name` heartbeats with, if registered.
    pub fn token_of(&self, name: &str) -> Option<String> {
        self.0.lock().expect("registered lock").get(name).cloned()
    }

    pub(crate) fn insert(&self, name: &str, token: String) -> usize {
        let mut map = self.0.lock().expect("registered lock");
        map.insert(name.to_owned(), token);
        map.len()
    }

    fn remove(&self, name: &str) -> usize {
        let mut map = self.0.lock().expect("registered lock");
        map.remove(name);
        map.len()
    }
}

/// The reason sent with UpdateNode DOWN for a node that left Kubernetes (or the selector).
pub const DELETED_REASON: &str = "node deleted from Kubernetes";

#[derive(Debug)]
struct Tracked {
    /// What the node should be registered as; `None` once it left Kubernetes.
    desired: Option<pb::RegisterAgentRequest>,
    availability: Availability,
    /// What the controller accepted.
    registered: Option<pb::RegisterAgentRequest>,
    /// The availability the controller acknowledged; `None` when unknown (a registration
    /// never changes a known node's state, so after this process's first registration of
    /// a node, a hold an earlier operator left is unknown, and the availability is sent).
    acked: Option<Availability>,
    /// The controller does not know the node: its registration creates it, IDLE.
    unknown_to_controller: bool,
    in_flight: bool,
    queued: bool,
    retry_at: Option<Instant>,
    backoff: Backoff,
    /// Since when the node has been waiting to be registered (for the lag metric).
    waiting_since: Option<Instant>,
    /// The field warnings last logged, so an unchanged bad field is logged once.
    warned: Vec<super::resources::FieldWarning>,
    /// When the node registers again for a fresh node token.
    renew_at: Option<Instant>,
    /// Its node token is due for renewal: it registers again once nothing more urgent
    /// (its registration, its availability) is owed.
    renew_due: bool,
}

/// The next call a node needs.
#[derive(Clone, Debug, PartialEq)]
enum Action {
    Register(pb::RegisterAgentRequest),
    SetAvailability(Availability),
    /// Mark DOWN because the node is gone; the entry is forgotten once acknowledged.
    MarkGone,
    /// Gone and never registered: nothing to tell the controller.
    Forget,
}

impl Tracked {
    fn next_action(&self) -> Option<Action> {
        match &self.desired {
            None if self.registered.is_some() || self.acked.is_some() => Some(Action::MarkGone),
            None => Some(Action::Forget),
            Some(desired) if self.registered.as_ref() != Some(desired) => {
                Some(Action::Register(desired.clone()))
            }
            Some(_) if self.acked.as_ref() != Some(&self.availability) => {
                Some(Action::SetAvailability(self.availability.clone()))
            }
            Some(desired) if self.renew_due => Some(Action::Register(desired.clone())),
            Some(_) => None,
        }
    }
}

/// A failed node call: what went wrong, whether it was a transport failure, and the line
/// an admission or authentication refusal gets (naming what to set).
#[derive(Clone, Debug)]
struct Failure {
    error: String,
    kind: crate::controller::FailureKind,
    problem: Option<String>,
}

impl Failure {
    fn of(error: &crate::controller::ControllerError, join_token: Option<&JoinToken>) -> Failure {
        Failure {
            error: error.to_string(),
            kind: error.kind(),
            problem: admission::registration_problem(error.code(), error.message(), join_token),
        }
    }
}
type Outcome = (String, Action, Result<Reply, Failure>);

/// A node call that succeeded, or found the node unknown to the controller.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Reply {
    /// Done; an accepted registration carries the node token.
    Done(Option<String>),
    /// `node X not found`: the controller lost the node (UpdateNode says so as INTERNAL,
    /// fidelity row 5); it is registered again.
    NodeUnknown,
}

/// The node sync driver. Feed it watcher events with [`NodeSync::run`].
pub struct NodeSync {
    config: NodeSyncConfig,
    controller: ControllerClient,
    metrics: Metrics,
    entropy: Entropy,
    registered: Registered,
    nodes: BTreeMap<String, Tracked>,
    ready: VecDeque<String>,
    delayed: BTreeSet<(Instant, String)>,
    in_flight: FuturesUnordered<BoxFuture<'static, Outcome>>,
    relisted: Option<BTreeSet<String>>,
    failures: FailureLog,
    holds: AdminHolds,
    /// Nodes due to register again for a fresh node token, by when.
    renewals: BTreeSet<(Instant, String)>,
    /// The admission or authentication refusal last logged, so it is one line until it
    /// changes or a registration is accepted.
    admission_problem: Option<String>,
}

impl NodeSync {
    pub fn new(
        config: NodeSyncConfig,
        controller: ControllerClient,
        metrics: Metrics,
        entropy: Entropy,
        registered: Registered,
    ) -> NodeSync {
        let failures = FailureLog::new(config.failure_log_interval);
        NodeSync {
            config,
            controller,
            metrics,
            entropy,
            registered,
            nodes: BTreeMap::new(),
            ready: VecDeque::new(),
            delayed: BTreeSet::new(),
            in_flight: FuturesUnordered::new(),
            relisted: None,
            failures,
            holds: AdminHolds::default(),
            renewals: BTreeSet::new(),
            admission_problem: None,
        }
    }

    /// Runs until `stop` completes, then lets the calls in flight finish and returns
    /// (dropping the task instead cancels them: that is what losing the lease does).
    /// `rejoins` carries nodes whose heartbeat answered NOT_FOUND (the controller lost them)
    /// or refused their node token: they are registered again at once.
    pub async fn run<S>(
        mut self,
        events: S,
        mut rejoins: mpsc::UnboundedReceiver<Rejoin>,
        stop: impl std::future::Future<Output = ()>,
    ) where
        S: Stream<Item = Result<watcher::Event<Node>, watcher::Error>>,
    {
        tokio::pin!(events);
        tokio::pin!(stop);
        let mut events_open = true;
        let mut rejoins_open = true;
        loop {
            self.launch_ready();
            self.publish_drained();
            let next_retry = self.delayed.first().map(|(at, _)| *at);
            let next_renewal = self.renewals.first().map(|(at, _)| *at);
            tokio::select! {
                () = &mut stop => {
                    while let Some(outcome) = self.in_flight.next().await {
                        self.on_outcome(outcome);
                    }
                    return;
                }
                event = events.next(), if events_open => match event {
                    Some(Ok(event)) => self.on_event(event),
                    Some(Err(e)) => tracing::warn!(error = %e, "node watch failed; it backs off and resumes"),
                    None => events_open = false,
                },
                Some(outcome) = self.in_flight.next(), if !self.in_flight.is_empty() => {
                    self.on_outcome(outcome);
                }
                rejoin = rejoins.recv(), if rejoins_open => match rejoin {
                    Some(Rejoin::Forgotten(name)) => self.on_forgotten(&name),
                    Some(Rejoin::TokenRefused { node, token }) => {
                        self.on_token_refused(&node, &token);
                    }
                    None => rejoins_open = false,
                },
                () = tokio::time::sleep_until(next_retry.unwrap_or_else(Instant::now)), if next_retry.is_some() => {
                    self.release_due();
                }
                () = tokio::time::sleep_until(next_renewal.unwrap_or_else(Instant::now)), if next_renewal.is_some() => {
                    self.renew_due();
                }
                else => return,
            }
        }
    }

    /// `spur_operator_nodes_drained`: the registered nodes spurctld acknowledged a hold
    /// for, by why.
    fn publish_drained(&self) {
        let mut counts = [("cordoned", 0i64), ("condition", 0), ("not_ready", 0)];
        for tracked in self.nodes.values() {
            let Some(kind) = tracked.acked.as_ref().and_then(Availability::drain_kind) else {
                continue;
            };
            if let Some((_, count)) = counts.iter_mut().find(|(k, _)| *k == kind) {
                *count += 1;
            }
        }
        for (reason, count) in counts {
            self.metrics
                .nodes_drained
                .get_or_create(&crate::metrics::DrainLabels { reason })
                .set(count);
        }
    }

    fn on_event(&mut self, event: watcher::Event<Node>) {
        match event {
            watcher::Event::Init => self.relisted = Some(BTreeSet::new()),
            watcher::Event::InitApply(node) => {
                if let (Some(seen), Some(name)) = (&mut self.relisted, &node.metadata.name) {
                    seen.insert(name.clone());
                }
                self.upsert(&node);
            }
            watcher::Event::InitDone => {
                // Nodes that vanished while the watch was down get no Delete event.
                if let Some(seen) = self.relisted.take() {
                    let vanished: Vec<String> = self
                        .nodes
                        .keys()
                        .filter(|n| !seen.contains(*n))
                        .cloned()
                        .collect();
                    for name in vanished {
                        self.remove(&name);
                    }
                }
            }
            watcher::Event::Apply(node) => self.upsert(&node),
            watcher::Event::Delete(node) => {
                if let Some(name) = &node.metadata.name {
                    self.remove(name);
                }
            }
        }
    }

    fn upsert(&mut self, node: &Node) {
        let Some(name) = node.metadata.name.clone() else {
            return;
        };
        let (desired, warnings) = registration(node, &self.config.agent, &self.config.version);
        let availability = match super::resources::availability(node, &self.config.drain_conditions)
        {
            Availability::Down { .. } if self.config.not_ready == NotReadyState::Ignore => {
                Availability::Up
            }
            availability => availability,
        };
        let now = Instant::now();
        let entropy = self.entropy.clone();
        let retry = self.config.retry;
        let tracked = self.nodes.entry(name.clone()).or_insert_with(|| Tracked {
            desired: None,
            availability: Availability::Up,
            registered: None,
            acked: None,
            unknown_to_controller: false,
            in_flight: false,
            queued: false,
            retry_at: None,
            backoff: retry.start(entropy),
            waiting_since: Some(now),
            warned: Vec::new(),
            renew_at: None,
            renew_due: false,
        });
        if !warnings.is_empty() && warnings != tracked.warned {
            for w in &warnings {
                tracing::warn!(node = %name, field = %w.field, reason = %w.reason, "registering the node without this field");
            }
        }
        tracked.warned = warnings;
        if tracked.registered.as_ref() != Some(&desired) && tracked.waiting_since.is_none() {
            tracked.waiting_since = Some(now);
        }
        tracked.desired = Some(desired);
        tracked.availability = availability;
        self.consider(&name);
    }

    fn remove(&mut self, name: &str) {
        if let Some(tracked) = self.nodes.get_mut(name) {
            tracked.desired = None;
            tracked.waiting_since = None;
            self.consider(name);
        }
    }

    fn on_forgotten(&mut self, name: &str) {
        let Some(tracked) = self.nodes.get_mut(name) else {
            return;
        };
        if tracked.desired.is_none() {
            return;
        }
        tracing::info!(node = %name, "the controller forgot the node; registering it again");
        tracked.registered = None;
        tracked.acked = None;
        tracked.unknown_to_controller = true;
        tracked.backoff.reset();
        tracked.waiting_since.get_or_insert_with(Instant::now);
        if let Some(at) = tracked.retry_at.take() {
            self.delayed.remove(&(at, name.to_owned()));
        }
        let count = self.registered.remove(name);
        self.metrics.nodes_registered.set(count as i64);
        self.consider(name);
    }

    /// A heartbeat's node token was refused: the node registers again for a new one, on its
    /// own backoff. spurctld still knows it, so what it acknowledged holds. A refusal of a
    /// token already replaced (the heartbeat raced a renewal) is stale and ignored.
    fn on_token_refused(&mut self, name: &str, token: &str) {
        if self.registered.token_of(name).as_deref() != Some(token) {
            return;
        }
        let Some(tracked) = self.nodes.get_mut(name) else {
            return;
        };
        if tracked.desired.is_none() {
            return;
        }
        tracing::info!(node = %name, "its node token was refused; registering the node again for a new one");
        tracked.registered = None;
        let count = self.registered.remove(name);
        self.metrics.nodes_registered.set(count as i64);
        self.consider(name);
    }

    /// Drops `name`'s entry, with its renewal.
    fn forget_node(&mut self, name: &str) {
        if let Some(at) = self.nodes.remove(name).and_then(|tracked| tracked.renew_at) {
            self.renewals.remove(&(at, name.to_owned()));
        }
    }

    /// Queues the node if it needs a call and none is running or waiting.
    fn consider(&mut self, name: &str) {
        let Some(tracked) = self.nodes.get_mut(name) else {
            return;
        };
        if tracked.in_flight || tracked.queued || tracked.retry_at.is_some() {
            return;
        }
        match tracked.next_action() {
            None => {}
            Some(Action::Forget) => self.forget_node(name),
            Some(_) => {
                tracked.queued = true;
                self.ready.push_back(name.to_owned());
            }
        }
    }

    fn release_due(&mut self) {
        let now = Instant::now();
        while let Some((at, _)) = self.delayed.first() {
            if *at > now {
                break;
            }
            let (_, name) = self.delayed.pop_first().expect("first exists");
            if let Some(tracked) = self.nodes.get_mut(&name) {
                tracked.retry_at = None;
            }
            self.consider(&name);
        }
    }

    /// Nodes whose node token is due for renewal register again; the old token serves
    /// their heartbeats until the new one replaces it.
    fn renew_due(&mut self) {
        let now = Instant::now();
        while let Some((at, _)) = self.renewals.first() {
            if *at > now {
                break;
            }
            let (at, name) = self.renewals.pop_first().expect("first exists");
            let Some(tracked) = self.nodes.get_mut(&name) else {
                continue;
            };
            if tracked.renew_at != Some(at) {
                continue;
            }
            tracked.renew_at = None;
            if tracked.desired.is_some() {
                tracing::debug!(node = %name, "registering the node again for a fresh node token");
                tracked.renew_due = true;
                self.consider(&name);
            }
        }
    }

    /// Schedules `name`'s next registration for a fresh node token, if `token` expires.
    fn schedule_renewal(&mut self, name: &str, token: &str) {
        let Some(tracked) = self.nodes.get_mut(name) else {
            return;
        };
        if let Some(at) = tracked.renew_at.take() {
            self.renewals.remove(&(at, name.to_owned()));
        }
        let renew_before = self.config.node_token_renew_before;
        if let Some(delay) = admission::renewal_delay(token, renew_before) {
            let at = Instant::now() + delay;
            tracked.renew_at = Some(at);
            self.renewals.insert((at, name.to_owned()));
        }
    }

    /// Logs an admission or authentication refusal once, as one line naming what to set,
    /// until it changes or a registration is accepted; any other failure is left to the
    /// failure summary.
    fn log_admission_problem(&mut self, problem: Option<String>) {
        let Some(problem) = problem else {
            return;
        };
        if self.admission_problem.as_ref() != Some(&problem) {
            tracing::error!("{problem}");
            self.admission_problem = Some(problem);
        }
    }

    fn launch_ready(&mut self) {
        while self.in_flight.len() < self.config.concurrency.max(1) {
            let Some(name) = self.ready.pop_front() else {
                return;
            };
            let Some(tracked) = self.nodes.get_mut(&name) else {
                continue;
            };
            tracked.queued = false;
            // Decided now, not when queued: the node may have changed meanwhile.
            let Some(action) = tracked.next_action() else {
                continue;
            };
            if action == Action::Forget {
                self.forget_node(&name);
                continue;
            }
            tracked.in_flight = true;
            self.metrics
                .reconciles
                .get_or_create(&crate::metrics::ReconcileLabels { kind: "node" })
                .inc();
            let controller = self.controller.clone();
            let not_ready = self.config.not_ready;
            let holds = self.holds.clone();
            let join_token = self.config.join_token.clone();
            self.in_flight.push(Box::pin(call(
                controller, holds, name, action, not_ready, join_token,
            )));
        }
    }

    fn on_outcome(&mut self, (name, action, result): Outcome) {
        let Some(tracked) = self.nodes.get_mut(&name) else {
            return;
        };
        let mut renewal = None;
        tracked.in_flight = false;
        match result {
            Ok(Reply::NodeUnknown) if matches!(action, Action::SetAvailability(_)) => {
                tracked.backoff.reset();
                tracing::info!(node = %name, "the controller does not know the node; registering it again");
                tracked.registered = None;
                tracked.acked = None;
                tracked.unknown_to_controller = true;
                tracked.waiting_since.get_or_insert_with(Instant::now);
                let count = self.registered.remove(&name);
                self.metrics.nodes_registered.set(count as i64);
            }
            Ok(reply) => {
                let token = match reply {
                    Reply::Done(token) => token,
                    // Unknown to the controller: nothing left to mark.
                    Reply::NodeUnknown => None,
                };
                tracked.backoff.reset();
                match action {
                    Action::Register(request) => {
                        let token = token.unwrap_or_default();
                        on_registered(
                            tracked,
                            &self.metrics,
                            &self.registered,
                            &name,
                            request,
                            token.clone(),
                        );
                        self.admission_problem = None;
                        renewal = Some(token);
                    }
                    Action::SetAvailability(availability) => {
                        tracing::info!(node = %name, ?availability, "node availability acknowledged");
                        tracked.acked = Some(availability);
                    }
                    Action::MarkGone => {
                        tracing::info!(node = %name, "node marked DOWN as deleted");
                        let count = self.registered.remove(&name);
                        self.metrics.nodes_registered.set(count as i64);
                        if tracked.desired.is_some() {
                            // It came back while the call ran: register it afresh (and
                            // lift the DOWN just sent).
                            tracked.registered = None;
                            tracked.acked = None;
                        } else {
                            self.forget_node(&name);
                            return;
                        }
                    }
                    Action::Forget => {}
                }
            }
            Err(failure) => self.on_failure(&name, &action, failure),
        }
        if let Some(token) = renewal {
            self.schedule_renewal(&name, &token);
        }
        self.consider(&name);
    }

    /// A failed call: `name` retries alone after its backoff, and an admission problem is
    /// logged once.
    fn on_failure(&mut self, name: &str, action: &Action, failure: Failure) {
        let Some(tracked) = self.nodes.get_mut(name) else {
            return;
        };
        let delay = tracked.backoff.delay_after(failure.kind);
        let at = Instant::now() + delay;
        tracked.retry_at = Some(at);
        self.delayed.insert((at, name.to_owned()));
        let kind = match action {
            Action::Register(_) => "register",
            _ => "update_node",
        };
        self.metrics.reconcile_error("node", kind);
        let error = failure.error;
        tracing::debug!(node = %name, %error, ?delay, "node call failed; retrying this node alone");
        self.failures.record(name, &error);
        self.log_admission_problem(failure.problem);
    }
}

/// Records `name`'s accepted registration: the request it now holds, the availability it
/// leaves acknowledged, and the lag and count metrics.
fn on_registered(
    tracked: &mut Tracked,
    metrics: &Metrics,
    registered: &Registered,
    name: &str,
    request: pb::RegisterAgentRequest,
    token: String,
) {
    tracked.registered = Some(request);
    tracked.renew_due = false;
    // A registration never changes a known node's state: what was acknowledged still holds,
    // and when nothing was (this process's first registration of the node), the availability
    // is sent. A node new to the controller starts IDLE.
    if std::mem::take(&mut tracked.unknown_to_controller) {
        tracked.acked = Some(Availability::Up);
    }
    if let Some(since) = tracked.waiting_since.take() {
        metrics
            .registration_lag_seconds
            .observe(since.elapsed().as_secs_f64());
    }
    let count = registered.insert(name, token);
    metrics.nodes_registered.set(count as i64);
    tracing::info!(node = %name, "node registered with the controller");
}

/// Makes the call an action needs. `Ok(Reply::Done(Some(token)))` for an accepted
/// registration.
async fn call(
    controller: ControllerClient,
    holds: AdminHolds,
    name: String,
    action: Action,
    not_ready: NotReadyState,
    join_token: Option<JoinToken>,
) -> Outcome {
    let result = match &action {
        Action::Register(request) => match controller
            .register_agent(pb::RegisterAgentRequest {
                join_token: join_token
                    .as_ref()
                    .map(JoinToken::current)
                    .unwrap_or_default(),
                ..request.clone()
            })
            .await
        {
            Ok(answer) if answer.accepted => Ok(Reply::Done(Some(answer.node_token))),
            Ok(answer) => Err(Failure {
                error: format!("registration refused: {}", answer.message),
                kind: crate::controller::FailureKind::Answer,
                problem: None,
            }),
            Err(e) => Err(Failure::of(&e, join_token.as_ref())),
        },
        Action::SetAvailability(availability) => match node_update(availability, not_ready) {
            Some((state, reason)) if keeps_admin_holds(state) => {
                match holds.read(&controller).await.map(|h| h.get(&name).cloned()) {
                    Ok(Some(hold)) => {
                        tracing::info!(node = %name, hold = %hold, ?availability, "spurctld holds the node at an administrator's word; kept");
                        Ok(Reply::Done(None))
                    }
                    Ok(None) => update_node(&controller, &name, state, reason).await,
                    Err(e) => Err(e),
                }
            }
            Some((state, reason)) => update_node(&controller, &name, state, reason).await,
            None => Ok(Reply::Done(None)),
        },
        Action::MarkGone => {
            update_node(
                &controller,
                &name,
                pb::NodeState::NodeDown,
                DELETED_REASON.into(),
            )
            .await
        }
        Action::Forget => Ok(Reply::Done(None)),
    };
    (name, action, result)
}

/// The UpdateNode an availability is sent as, or `None` to send nothing.
fn node_update(
    availability: &Availability,
    not_ready: NotReadyState,
) -> Option<(pb::NodeState, String)> {
    match availability {
        Availability::Up => Some((pb::NodeState::NodeIdle, String::new())),
        Availability::Down { reason } => not_ready.node_state().map(|s| (s, reason.clone())),
        Availability::Drain { reason } => Some((pb::NodeState::NodeDrain, reason.clone())),
    }
}

/// Whether sending `state` waits on an administrator's hold: IDLE would lift it and DRAIN
/// would write over its reason. DOWN does not: a node Kubernetes lost is lost either way.
fn keeps_admin_holds(state: pb::NodeState) -> bool {
    matches!(state, pb::NodeState::NodeIdle | pb::NodeState::NodeDrain)
}

/// A read of the administrator's holds spurctld keeps ([`super::resources::admin_hold`]),
/// by node, as every caller waiting on it gets it.
type HoldsRead = Shared<BoxFuture<'static, Result<Arc<BTreeMap<String, String>>, Failure>>>;

/// The administrator's holds, read with one GetNodes of the drained nodes for every node
/// call that asks while that read is in flight: a burst of first IDLEs (thousands of nodes
/// registering at start-up) makes a few small reads, not one per node. A call joins only a
/// read still in flight, so what it decides on is no older than its own read would be.
#[derive(Clone, Default)]
struct AdminHolds {
    reading: Arc<Mutex<Option<HoldsRead>>>,
}

impl AdminHolds {
    async fn read(
        &self,
        controller: &ControllerClient,
    ) -> Result<Arc<BTreeMap<String, String>>, Failure> {
        let read = {
            let mut reading = self.reading.lock().expect("admin holds lock");
            match reading.as_ref() {
                Some(read) if read.peek().is_none() => read.clone(),
                _ => {
                    let read = read_holds(controller.clone()).boxed().shared();
                    *reading = Some(read.clone());
                    read
                }
            }
        };
        read.await
    }
}

async fn read_holds(
    controller: ControllerClient,
) -> Result<Arc<BTreeMap<String, String>>, Failure> {
    let drained = controller
        .get_nodes(pb::GetNodesRequest {
            states: vec![
                pb::NodeState::NodeDrain as i32,
                pb::NodeState::NodeDraining as i32,
            ],
            ..Default::default()
        })
        .await
        .map_err(|e| Failure::of(&e, None))?
        .nodes;
    Ok(Arc::new(
        drained
            .iter()
            .filter_map(|n| Some((n.name.clone(), super::resources::admin_hold(n)?.to_owned())))
            .collect(),
    ))
}

/// Whether a failed UpdateNode says the controller does not know the node: INTERNAL
/// `node X not found` (spurctld), or NOT_FOUND.
fn node_unknown(error: &crate::controller::ControllerError, name: &str) -> bool {
    match error.code() {
        tonic::Code::NotFound => true,
        tonic::Code::Internal => error.says_node_not_found(name),
        _ => false,
    }
}

async fn update_node(
    controller: &ControllerClient,
    name: &str,
    state: pb::NodeState,
    reason: String,
) -> Result<Reply, Failure> {
    let request = pb::UpdateNodeRequest {
        name: name.to_owned(),
        state: Some(state as i32),
        reason: Some(reason),
        ..Default::default()
    };
    match controller.update_node(request).await {
        Ok(()) => Ok(Reply::Done(None)),
        Err(e) if node_unknown(&e, name) => Ok(Reply::NodeUnknown),
        Err(e) => Err(Failure::of(&e, None)),
    }
}

/// Summarises failures into one log line per interval instead of one per node: with
/// 5,000 nodes and the controller away, per-node lines would drown everything else.
pub(crate) struct FailureLog {
    interval: Duration,
    last: Option<Instant>,
    count: usize,
    sample: Option<(String, String)>,
}

impl FailureLog {
    pub(crate) fn new(interval: Duration) -> FailureLog {
        FailureLog {
            interval,
            last: None,
            count: 0,
            sample: None,
        }
    }

    pub(crate) fn record(&mut self, node: &str, error: &str) {
        self.count += 1;
        self.sample = Some((node.to_owned(), error.to_owned()));
        let now = Instant::now();
        if self.last.is_none_or(|last| now - last >= self.interval) {
            let (node, error) = self.sample.take().expect("just set");
            tracing::warn!(failures = self.count, node = %node, %error, "node sync calls failed (count since the last report; the node named is the latest)");
            self.count = 0;
            self.last = Some(now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tracked(
        desired: Option<&str>,
        availability: Availability,
        registered: Option<&str>,
        acked: Option<Availability>,
    ) -> Tracked {
        let request = |cpus: &str| pb::RegisterAgentRequest {
            hostname: "n1".into(),
            version: cpus.into(),
            ..Default::default()
        };
        Tracked {
            desired: desired.map(request),
            availability,
            registered: registered.map(request),
            acked,
            unknown_to_controller: false,
            in_flight: false,
            queued: false,
            retry_at: None,
            backoff: crate::retry::BackoffPolicy {
                initial: Duration::from_secs(1),
                max: Duration::from_secs(1),
                jitter: 0.0,
                transient: None,
            }
            .start(Entropy::from_seed(1)),
            waiting_since: None,
            warned: Vec::new(),
            renew_at: None,
            renew_due: false,
        }
    }

    #[test]
    fn the_next_call_registers_then_sends_the_availability_then_nothing_and_marks_a_gone_node() {
        let drain = Availability::Drain {
            reason: "Kubernetes: cordoned".into(),
        };
        let register = |v: &str| {
            Some(Action::Register(pb::RegisterAgentRequest {
                hostname: "n1".into(),
                version: v.into(),
                ..Default::default()
            }))
        };
        let table = [
            // Not yet registered, or registered with other resources: register.
            (
                tracked(Some("a"), Availability::Up, None, None),
                register("a"),
            ),
            (
                tracked(
                    Some("b"),
                    Availability::Up,
                    Some("a"),
                    Some(Availability::Up),
                ),
                register("b"),
            ),
            // Registered: the availability, until it is acknowledged (also after a restart,
            // when nothing was: a hold an earlier operator left is unknown).
            (
                tracked(Some("a"), Availability::Up, Some("a"), None),
                Some(Action::SetAvailability(Availability::Up)),
            ),
            (
                tracked(Some("a"), drain.clone(), Some("a"), Some(Availability::Up)),
                Some(Action::SetAvailability(drain.clone())),
            ),
            (
                tracked(Some("a"), drain.clone(), Some("a"), Some(drain.clone())),
                None,
            ),
            // Gone from Kubernetes: marked DOWN if spurctld knew it, else forgotten.
            (
                tracked(None, Availability::Up, Some("a"), None),
                Some(Action::MarkGone),
            ),
            (
                tracked(None, Availability::Up, None, Some(Availability::Up)),
                Some(Action::MarkGone),
            ),
            (
                tracked(None, Availability::Up, None, None),
                Some(Action::Forget),
            ),
        ];
        for (i, (node, expected)) in table.into_iter().enumerate() {
            assert_eq!(node.next_action(), expected, "row {i}: {node:?}");
        }
    }

    #[test]
    fn a_due_renewal_registers_again_only_after_the_availability_is_sent_and_never_when_gone() {
        let cordoned = Availability::Drain {
            reason: "cordoned".into(),
        };
        let mut node = tracked(
            Some("8"),
            cordoned.clone(),
            Some("8"),
            Some(Availability::Up),
        );
        node.renew_due = true;
        assert_eq!(
            node.next_action(),
            Some(Action::SetAvailability(cordoned.clone()))
        );
        node.acked = Some(cordoned);
        assert!(matches!(node.next_action(), Some(Action::Register(_))));
        node.desired = None;
        assert_eq!(
            node.next_action(),
            Some(Action::MarkGone),
            "a renewal keeps the node known"
        );
    }

    #[test]
    fn a_not_ready_node_is_drained_by_default_and_never_failed_unless_asked() {
        let down = Availability::Down {
            reason: "Kubernetes taint node.kubernetes.io/not-ready:NoExecute".into(),
        };
        let reason = || "Kubernetes taint node.kubernetes.io/not-ready:NoExecute".to_owned();
        assert_eq!(NotReadyState::default(), NotReadyState::Drain);
        let table = [
            (
                Availability::Up,
                NotReadyState::Drain,
                Some((pb::NodeState::NodeIdle, String::new())),
            ),
            (
                Availability::Up,
                NotReadyState::Ignore,
                Some((pb::NodeState::NodeIdle, String::new())),
            ),
            (
                down.clone(),
                NotReadyState::Drain,
                Some((pb::NodeState::NodeDrain, reason())),
            ),
            (
                down.clone(),
                NotReadyState::Down,
                Some((pb::NodeState::NodeDown, reason())),
            ),
            (down, NotReadyState::Ignore, None),
            (
                Availability::Drain {
                    reason: "Kubernetes: cordoned".into(),
                },
                NotReadyState::Ignore,
                Some((pb::NodeState::NodeDrain, "Kubernetes: cordoned".into())),
            ),
        ];
        for (availability, mode, expected) in table {
            assert_eq!(
                node_update(&availability, mode),
                expected,
                "{availability:?} {mode:?}"
            );
        }
    }

    #[test]
    fn an_update_for_a_node_the_controller_lost_is_recognised() {
        let e = |code, message: &str| crate::controller::ControllerError::Status {
            method: "UpdateNode",
            code,
            message: message.into(),
            leader_hint: None,
        };
        let table = [
            (tonic::Code::Internal, "node gpu-1 not found", true),
            (tonic::Code::NotFound, "anything", true),
            (tonic::Code::Internal, "node gpu-2 not found", false),
            (tonic::Code::Internal, "raft propose failed: x", false),
            (tonic::Code::Unavailable, "node gpu-1 not found", false),
            (
                tonic::Code::PermissionDenied,
                "update node requires cluster admin",
                false,
            ),
        ];
        for (code, message, expected) in table {
            assert_eq!(
                node_unknown(&e(code, message), "gpu-1"),
                expected,
                "{code:?} {message}"
            );
        }
    }
}
