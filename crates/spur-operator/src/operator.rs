//! The operator's entry point: takes its world as arguments and reaches nothing on its own
//! (docs/architecture.md, "The seams"). The binary hands in TCP, a kube Client from
//! kubeconfig and the system clock; the simulation hands in turmoil streams, a Client over
//! the simulated network and its own clock.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::runtime::reflector::Store;
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

use crate::agent::Agent;
use crate::agent_auth::AgentAuth;
use crate::clock::WallClock;
use crate::config::OperatorConfig;
use crate::controller::{ControllerClient, ControllerError};
use crate::events::EventPublisher;
use crate::fence::Fence;
use crate::health::{Health, Probe, serve_http};
use crate::jobs::SpurJob;
use crate::jobs::nudge::StatusNudge;
use crate::jobs::reconcile::JobsContext;
use crate::jobs::reports::ReportContext;
use crate::lease::{ElectionStatus, Elector};
use crate::metrics::Metrics;
use crate::net::Sockets;
use crate::nodes::heartbeat;
use crate::nodes::{NodeSync, Registered};
use crate::retry::{Backoffs, Entropy};

/// What the operator runs in: the seams production (TCP, the process's clock) and the
/// simulation hand in.
pub struct Seams<N> {
    pub network: N,
    pub kube: kube::Client,
    pub clock: WallClock,
    /// Seeds every random choice (retry jitter); production draws it from the OS.
    pub seed: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("cannot create the controller client: {0}")]
    Controller(#[from] ControllerError),
    #[error("cannot listen on {addr} for {what}: {source}")]
    Listen {
        what: &'static str,
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
}

/// Handles into a running operator, for its host (the binary or a simulation).
#[derive(Clone)]
pub struct Handles {
    pub metrics: Metrics,
    pub controller: ControllerClient,
    pub leading: watch::Receiver<bool>,
    pub registered: Registered,
}

/// Runs the operator until `shutdown` completes: serves health, campaigns for the lease,
/// and while leading runs node sync and heartbeats. On shutdown it stops taking new work,
/// lets calls in flight finish within the grace period, then releases the lease.
pub async fn run<N: Sockets>(
    seams: Seams<N>,
    config: OperatorConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<(), RunError> {
    let (started, ready) = tokio::sync::oneshot::channel();
    drop(ready);
    run_with_handles(seams, config, shutdown, started).await
}

/// [`run`], also sending [`Handles`] once everything is started.
pub async fn run_with_handles<N: Sockets>(
    seams: Seams<N>,
    config: OperatorConfig,
    shutdown: impl Future<Output = ()>,
    started: tokio::sync::oneshot::Sender<Handles>,
) -> Result<(), RunError> {
    let metrics = Metrics::new();
    let entropy = Entropy::from_seed(seams.seed);
    // Every write made on behalf of leadership goes through the fence: the API writes by
    // way of `acting_kube`, the controller's leader-only calls inside the client. Only the
    // elector (the Lease itself) and the readiness probe use the unfenced client.
    let fence = Fence::with_metrics(metrics.clone());
    let acting_kube = fence.kube_client(seams.kube.clone());
    let controller = controller_client(&seams, &config, &metrics, &fence)?;
    let events = EventPublisher::new(
        acting_kube.clone(),
        seams.clock.clone(),
        config.lease.identity.clone(),
    )
    .with_series_window(config.event_series_window);
    let (jobs_tx, jobs_rx) = watch::channel::<Option<Store<SpurJob>>>(None);
    let registered = Registered::default();
    let parts = Parts {
        kube: &acting_kube,
        controller: &controller,
        metrics: &metrics,
        entropy: &entropy,
        registered: &registered,
        events: &events,
        jobs_tx: &jobs_tx,
    };

    let mut standing = Standing::start(&seams, &config, &parts, &fence, jobs_rx).await?;
    let _ = started.send(Handles {
        metrics: metrics.clone(),
        controller: controller.clone(),
        leading: standing.leading.clone(),
        registered: registered.clone(),
    });
    tokio::pin!(shutdown);
    act_while_leading(
        &seams,
        &config,
        &parts,
        &mut standing.leading,
        shutdown.as_mut(),
    )
    .await;
    // No SpurJob store from here on: the agent refuses new launches.
    let _ = jobs_tx.send(None);
    standing.stop(config.shutdown_grace, &fence).await;
    Ok(())
}

/// What runs for the replica's whole life, leading or not: health, the agent and the
/// elector, with the switches that stop them.
struct Standing {
    /// Stops health and the agent from serving.
    stopping: watch::Sender<bool>,
    health: tokio::task::JoinHandle<()>,
    /// The agent's calls in flight, drained before the Lease is released.
    agent_calls: Agent,
    agent: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
    /// Whether this replica holds the Lease.
    leading: watch::Receiver<bool>,
    /// Releases the Lease.
    release: watch::Sender<bool>,
    elector: tokio::task::JoinHandle<()>,
}

impl Standing {
    /// Binds and serves health and the agent, then campaigns for the Lease.
    async fn start<N: Sockets>(
        seams: &Seams<N>,
        config: &OperatorConfig,
        parts: &Parts<'_>,
        fence: &Fence,
        jobs: watch::Receiver<Option<Store<SpurJob>>>,
    ) -> Result<Standing, RunError> {
        let (stopping_tx, stopping) = watch::channel(false);
        let health_listener = listen(&seams.network, config.health_listen, "health").await?;
        let (elector, election) = Elector::new(
            seams.kube.clone(),
            config.lease.clone(),
            seams.clock.clone(),
            parts.metrics.clone(),
            fence.clone(),
        );
        let health = serve_health(
            seams,
            config,
            parts.metrics,
            parts.controller,
            &election.status,
            health_listener,
            stopping.clone(),
        );
        let agent_listener = listen(&seams.network, config.agent_listen, "the agent").await?;
        let agent = Agent::new(parts.kube.clone(), jobs, parts.registered.clone())
            .with_launch_timeout(config.agent_launch_timeout)
            .with_exec_limits(config.agent_exec)
            .with_metrics(parts.metrics.clone())
            .with_controller(parts.controller.clone());
        let agent_calls = agent.clone();
        let agent_task = serve_agent(
            seams,
            config,
            agent,
            parts.metrics.clone(),
            agent_listener,
            stopping,
        );
        let leading = election.leading.clone();
        let (release, released) = watch::channel(false);
        let elector = tokio::spawn(elector.run(wait_for(released)));
        Ok(Standing {
            stopping: stopping_tx,
            health,
            agent_calls,
            agent: agent_task,
            leading,
            release,
            elector,
        })
    }

    /// Stops everything, in an order that leaves no write unled: the agent stops taking
    /// calls and lets those in flight finish while the hold lasts; then no write passes,
    /// and those in flight are answered, before the Lease is released (a pod created after
    /// the release would be a write nobody leads); then health and the agent stop serving.
    async fn stop(self, grace: std::time::Duration, fence: &Fence) {
        drain_writes(grace, &self.agent_calls, fence).await;
        let _ = self.release.send(true);
        let _ = self.elector.await;
        let _ = self.stopping.send(true);
        let _ = self.health.await;
        if let Ok(Err(e)) = self.agent.await {
            tracing::warn!(error = %e, "the agent server ended with an error");
        }
    }
}

/// The one client every call to spurctld goes through, its leader-only calls fenced.
fn controller_client<N: Sockets>(
    seams: &Seams<N>,
    config: &OperatorConfig,
    metrics: &Metrics,
    fence: &Fence,
) -> Result<ControllerClient, RunError> {
    let settings = &config.controller;
    Ok(ControllerClient::new(
        settings.addr.clone(),
        settings.channel.clone(),
        settings.token.as_deref(),
        seams.network.clone(),
    )?
    .with_metrics(metrics.clone())
    .with_fence(fence.clone()))
}

/// Serves `/healthz`, `/readyz` and `/metrics` on `listener` until `stopping`.
fn serve_health<N: Sockets>(
    seams: &Seams<N>,
    config: &OperatorConfig,
    metrics: &Metrics,
    controller: &ControllerClient,
    election: &watch::Receiver<ElectionStatus>,
    listener: <N as crate::net::Binder>::Listener,
    stopping: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    let health = Health::new(
        metrics.clone(),
        readiness_probes(
            seams.kube.clone(),
            controller.clone(),
            election.clone(),
            config.probe_timeout,
        ),
        config.probe_timeout,
    );
    tokio::spawn(serve_http(listener, health.router(), wait_for(stopping)))
}

/// Serves the agent on `listener`, checking spurctld's tokens, until `stopping`.
fn serve_agent<N: Sockets>(
    seams: &Seams<N>,
    config: &OperatorConfig,
    agent: Agent,
    metrics: Metrics,
    listener: <N as crate::net::Binder>::Listener,
    stopping: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<Result<(), tonic::transport::Error>> {
    let auth = &config.agent_auth;
    let port = config.agent_listen.port();
    if let Some(open) = crate::agent_auth::open_calls_warning(auth.mode, auth.key.is_some(), port) {
        tracing::warn!("{open}");
    }
    let agent_auth = AgentAuth::new(
        auth.mode,
        auth.key.as_ref().map(|k| k.0.as_slice()),
        auth.leeway,
        seams.clock.clone(),
    );
    tokio::spawn(crate::agent::serve(
        agent,
        agent_auth,
        metrics,
        listener,
        wait_for(stopping),
    ))
}

/// Whenever this replica leads, runs the leader's tasks until it stops leading (they stop
/// at once, before another replica may start) or `shutdown` completes (they get the
/// shutdown grace to finish the calls in flight).
async fn act_while_leading<N: Sockets>(
    seams: &Seams<N>,
    config: &OperatorConfig,
    parts: &Parts<'_>,
    leading: &mut watch::Receiver<bool>,
    mut shutdown: Pin<&mut impl Future<Output = ()>>,
) {
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            result = leading.wait_for(|l| *l) => if result.is_err() { break },
        }
        let (drain_tx, drain) = watch::channel(false);
        let mut tasks = start_leader_tasks(seams, config, parts, drain);
        let shutting_down = tokio::select! {
            () = &mut shutdown => true,
            _ = leading.wait_for(|l| !*l) => false,
        };
        if shutting_down {
            let _ = drain_tx.send(true);
            let drained = tokio::time::timeout(config.shutdown_grace, async {
                while tasks.join_next().await.is_some() {}
            })
            .await;
            if drained.is_err() {
                tracing::warn!(
                    "calls still in flight after the shutdown grace period; abandoning them"
                );
            }
            tasks.abort_all();
            break;
        }
        // Lost the lease: stop at once, before another replica may start.
        let _ = parts.jobs_tx.send(None);
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
        tracing::info!("stopped acting: no longer the leader");
    }
}

/// Lets the agent's calls in flight finish, then closes the fence and lets the writes in
/// flight be answered, each within `grace`: after this no write passes.
async fn drain_writes(grace: std::time::Duration, agent_calls: &Agent, fence: &Fence) {
    if tokio::time::timeout(grace, agent_calls.drained())
        .await
        .is_err()
    {
        tracing::warn!("agent calls still in flight after the shutdown grace period");
    }
    fence.close();
    if tokio::time::timeout(grace, fence.drained()).await.is_err() {
        tracing::warn!("writes still in flight after the shutdown grace period");
    }
}

/// How many reconciliations of one kind run at once.
fn reconcile_limits(config: &OperatorConfig) -> kube::runtime::controller::Config {
    kube::runtime::controller::Config::default().concurrency(config.reconcile_concurrency)
}

/// What the leader's tasks share with the rest of the operator.
struct Parts<'a> {
    /// The fenced client: every write checked against the Lease when it is sent.
    kube: &'a kube::Client,
    controller: &'a ControllerClient,
    metrics: &'a Metrics,
    entropy: &'a Entropy,
    registered: &'a Registered,
    events: &'a EventPublisher,
    jobs_tx: &'a watch::Sender<Option<Store<SpurJob>>>,
}

/// Starts the leader's tasks, each stopping at `drain`: SpurJobs, pod reports, nodes.
fn start_leader_tasks<N: Sockets>(
    seams: &Seams<N>,
    config: &OperatorConfig,
    parts: &Parts<'_>,
    drain: watch::Receiver<bool>,
) -> JoinSet<()> {
    let mut tasks = JoinSet::new();
    let nudge = StatusNudge::new(config.status_read_at_once);
    start_spurjob_tasks(seams, config, parts, &drain, &nudge, &mut tasks);
    start_pod_reports(seams, config, parts, &drain, &nudge, &mut tasks);
    start_node_tasks(config, parts, drain, &mut tasks);
    tasks
}

/// SpurJobs: submit, record, cancel on deletion; then mirror state by polling.
fn start_spurjob_tasks<N: Sockets>(
    seams: &Seams<N>,
    config: &OperatorConfig,
    parts: &Parts<'_>,
    drain: &watch::Receiver<bool>,
    nudge: &StatusNudge,
    tasks: &mut JoinSet<()>,
) {
    let Parts {
        kube,
        controller,
        metrics,
        entropy,
        events,
        jobs_tx,
        ..
    } = *parts;
    let jobs_ctx = Arc::new(
        JobsContext::new(
            kube.clone(),
            controller.clone(),
            metrics.clone(),
            events.clone(),
            seams.clock.clone(),
            config.retry,
            entropy.clone(),
        )
        .with_submit_read_back(config.submit_read_back)
        .with_tuning(config.jobs)
        .with_default_user(&config.default_user),
    );
    let (store, jobs_run) = crate::jobs::reconcile::run(
        kube.clone(),
        jobs_ctx,
        reconcile_limits(config),
        config.retry.start(entropy.clone()),
    );
    let _ = jobs_tx.send(Some(store.clone()));
    // Every leader task stops at the drain: one that polls on would keep a shutdown
    // waiting out the whole grace period, holding the lease and saying "ready".
    tasks.spawn(until_drained(drain.clone(), jobs_run));
    tasks.spawn(until_drained(
        drain.clone(),
        crate::jobs::status::Poller {
            store: store.clone(),
            kube: kube.clone(),
            controller: controller.clone(),
            clock: seams.clock.clone(),
            metrics: metrics.clone(),
            events: events.clone(),
            nudge: nudge.clone(),
        }
        .run(config.status_poll_interval, config.job_lost_after),
    ));
    tasks.spawn(until_drained(
        drain.clone(),
        crate::jobs::orphans::delete_orphans(kube.clone(), store),
    ));
}

/// Pods: report each one's end, upstream's operator's pods included (a swap adopts them).
fn start_pod_reports<N: Sockets>(
    seams: &Seams<N>,
    config: &OperatorConfig,
    parts: &Parts<'_>,
    drain: &watch::Receiver<bool>,
    nudge: &StatusNudge,
    tasks: &mut JoinSet<()>,
) {
    let Parts {
        kube,
        controller,
        metrics,
        entropy,
        events,
        ..
    } = *parts;
    let pods = crate::jobs::reports::run(
        ReportContext {
            kube: kube.clone(),
            controller: controller.clone(),
            metrics: metrics.clone(),
            tuning: config.jobs,
            clock: seams.clock.clone(),
            events: events.clone(),
            backoffs: Backoffs::new(config.retry, entropy.clone()),
            nudge: nudge.clone(),
        },
        reconcile_limits(config),
        config.retry.start(entropy.clone()),
    );
    tasks.spawn(until_drained(drain.clone(), pods));
}

/// Nodes: keep the labelled ones registered and their availability sent, and heartbeat
/// every registered one; a node whose heartbeat finds it forgotten by spurctld goes back
/// to node sync to be registered again.
fn start_node_tasks(
    config: &OperatorConfig,
    parts: &Parts<'_>,
    drain: watch::Receiver<bool>,
    tasks: &mut JoinSet<()>,
) {
    let Parts {
        kube,
        controller,
        metrics,
        entropy,
        registered,
        ..
    } = *parts;
    let (forgotten_tx, forgotten_rx) = mpsc::unbounded_channel();
    let nodes = Api::<Node>::all(kube.clone());
    let watch_backoff = config.retry.start(entropy.clone());
    let events = watcher(
        nodes,
        watcher::Config::default().labels(&config.node_selector.to_string()),
    )
    .backoff(watch_backoff);
    let sync = NodeSync::new(
        config.node_sync.clone(),
        controller.clone(),
        metrics.clone(),
        entropy.clone(),
        registered.clone(),
    );
    tasks.spawn(sync.run(events, forgotten_rx, wait_for(drain.clone())));
    let beats = heartbeat::run(
        controller.clone(),
        registered.clone(),
        config.heartbeat,
        metrics.clone(),
        forgotten_tx,
    );
    tasks.spawn(until_drained(drain, beats));
}

fn readiness_probes(
    kube: kube::Client,
    controller: ControllerClient,
    election: watch::Receiver<ElectionStatus>,
    bound: std::time::Duration,
) -> Vec<(&'static str, Box<dyn Probe>)> {
    let kube = Arc::new(kube);
    let api_server = move || -> BoxFuture<'static, Result<(), String>> {
        let kube = kube.clone();
        Box::pin(async move {
            kube.apiserver_version()
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        })
    };
    let spurctld = move || -> BoxFuture<'static, Result<(), String>> {
        let controller = controller.clone();
        Box::pin(async move {
            controller
                .check_within(bound)
                .await
                .map_err(|e| e.to_string())
        })
    };
    // A replica that can never act is not ready: its pod says why where people look.
    let election = move || -> BoxFuture<'static, Result<(), String>> {
        let blocked = election.borrow().blocked.clone();
        Box::pin(async move { blocked.map_or(Ok(()), Err) })
    };
    vec![
        ("kube-apiserver", Box::new(api_server)),
        ("spurctld", Box::new(spurctld)),
        ("election", Box::new(election)),
    ]
}

/// Binds `addr` for `what`, naming both when it fails.
async fn listen<N: Sockets>(
    network: &N,
    addr: std::net::SocketAddr,
    what: &'static str,
) -> Result<<N as crate::net::Binder>::Listener, RunError> {
    network
        .bind(addr)
        .await
        .map_err(|source| RunError::Listen { what, addr, source })
}

/// Runs `work` until it ends or the drain starts.
async fn until_drained(drain: watch::Receiver<bool>, work: impl Future<Output = ()>) {
    tokio::select! {
        () = work => {}
        () = wait_for(drain) => {}
    }
}

/// Completes once the flag turns true (or its sender is gone).
async fn wait_for(mut flag: watch::Receiver<bool>) {
    let _ = flag.wait_for(|set| *set).await;
}
