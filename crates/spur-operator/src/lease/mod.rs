//! Leader election among operator replicas with a coordination.k8s.io/v1 Lease, or, where
//! RBAC refuses leases (upstream's ClusterRole grants none), the leader annotation of a
//! ConfigMap of the same name ([`lock`]). Where both are refused, or the namespace is
//! missing, the replica never acts and says why in one line ([`blocked`]).
//!
//! Written here rather than taken from a crate: the maintained lease crates read the
//! system clock for `renewTime` and sleep on their own schedule, which would make a
//! simulated run depend on the machine's clock. This one takes its wall clock from
//! [`WallClock`] and its timers from tokio, both of which the simulation drives.
//!
//! The rule that keeps two replicas from acting at once: a contender takes the lease over
//! only after it has seen the same `renewTime` for a whole lease duration, measured on its
//! own clock from when it first saw it; the holder stops acting when a renewal has not
//! succeeded within the renew deadline (shorter than the lease duration) of the start of
//! its last successful renewal. So the holder always stops before anyone else may start.

use std::future::Future;
use std::time::Duration;

mod blocked;
mod lock;

use k8s_openapi::api::coordination::v1::LeaseSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::clock::WallClock;
use crate::fence::Fence;
use crate::flags::parse_duration;
use crate::metrics::Metrics;
use blocked::{Blocked, Refusal, fallback_line};
pub use lock::LockKind;
use lock::Locks;

#[derive(Clone, Debug)]
pub struct LeaseConfig {
    pub name: String,
    pub namespace: String,
    /// This replica's identity (its pod name).
    pub identity: String,
    pub lease_duration: Duration,
    /// The holder stops acting when it could not renew for this long.
    pub renew_deadline: Duration,
    /// Time between renewals (and between attempts to acquire).
    pub retry_period: Duration,
    /// Bound on each API call.
    pub call_timeout: Duration,
}

impl LeaseConfig {
    /// The deadlines must nest, or two replicas could act at once.
    pub fn validate(&self) -> Result<(), String> {
        if self.renew_deadline >= self.lease_duration {
            return Err("--lease-renew-deadline must be shorter than --lease-duration".into());
        }
        if self.retry_period >= self.renew_deadline {
            return Err("--lease-retry-period must be shorter than --lease-renew-deadline".into());
        }
        if self.call_timeout > self.renew_deadline {
            return Err("--kube-call-timeout must not exceed --lease-renew-deadline".into());
        }
        Ok(())
    }
}

/// What a contender last saw of the lease, and when.
struct Observed {
    holder: Option<String>,
    renew_time: Option<MicroTime>,
    at: Instant,
}

/// What a replica does with the Lease it read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Decision {
    /// Another replica holds it and has renewed it within its duration: keep off.
    Wait,
    /// Ours: renew it, keeping its acquire time and transitions.
    Renew,
    /// Released (no holder), or its holder has not renewed it for its whole duration:
    /// take it, one transition more.
    TakeOver,
}

/// The takeover rule, value in and value out. `observed` is what this replica saw of the
/// lease before and since when, on its own clock; it is updated when the holder or the
/// renew time changed. The holder's `renewTime` is never compared with `now`: it was read
/// from the holder's clock. A lease counts as expired once its (holder, renewTime) has
/// stayed the same for the duration the holder advertised (else `default_duration`),
/// counted from when this replica first saw it.
fn decide(
    me: &str,
    spec: &LeaseSpec,
    observed: &mut Option<Observed>,
    now: Instant,
    default_duration: Duration,
) -> Decision {
    let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
    if holder.as_deref() == Some(me) {
        return Decision::Renew;
    }
    let changed = observed
        .as_ref()
        .is_none_or(|o| o.holder != holder || o.renew_time != spec.renew_time);
    if changed {
        *observed = Some(Observed {
            holder: holder.clone(),
            renew_time: spec.renew_time.clone(),
            at: now,
        });
    }
    let seen_since = observed.as_ref().map_or(now, |o| o.at);
    let duration = spec
        .lease_duration_seconds
        .and_then(|s| u64::try_from(s).ok())
        .map_or(default_duration, Duration::from_secs);
    if holder.is_some() && now.duration_since(seen_since) < duration {
        Decision::Wait
    } else {
        Decision::TakeOver
    }
}

#[derive(Debug, thiserror::Error)]
enum LeaseError {
    #[error("the Lease API call did not answer within {0:?}")]
    Timeout(Duration),
    #[error("someone else changed the lease first")]
    Conflict,
    #[error("RBAC refused {} {}", .0.verb, .0.kind.resource())]
    Forbidden(Refusal),
    #[error("{}", .0.line())]
    Blocked(Blocked),
    #[error(transparent)]
    Kube(#[from] kube::Error),
}

/// Sorts an API error on a lock object: the answers the election acts on get their own
/// variant; the rest are retried at the next round.
fn classify(kind: LockKind, verb: &'static str, namespace: &str, error: kube::Error) -> LeaseError {
    let kube::Error::Api(status) = error else {
        return LeaseError::Kube(error);
    };
    let missing_namespace = status.is_not_found()
        && (status
            .details
            .as_ref()
            .is_some_and(|d| d.kind == "namespaces")
            || status.message.starts_with("namespaces \""));
    if status.is_forbidden() {
        LeaseError::Forbidden(Refusal::from_message(kind, verb, &status.message))
    } else if verb == "create" && missing_namespace {
        LeaseError::Blocked(Blocked::NamespaceMissing {
            namespace: namespace.to_owned(),
        })
    } else if status.is_conflict() || status.is_already_exists() {
        LeaseError::Conflict
    } else {
        LeaseError::Kube(kube::Error::Api(status))
    }
}

/// What the election looks like from outside: `/readyz`, the metrics and the log.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ElectionStatus {
    /// The kind of object the record lives in.
    pub lock: LockKind,
    /// Why this replica cannot take part, in one line, when it cannot.
    pub blocked: Option<String>,
}

/// What a replica carries from one round to the next.
#[derive(Default)]
struct Campaign {
    /// What it last saw of the lock it uses.
    observed: Option<Observed>,
    /// What it last saw of the ConfigMap lock while electing with the Lease.
    observed_other: Option<Observed>,
    /// Set once a Lease call was refused: the ConfigMap is the lock for the rest of this
    /// process (a grant added later is picked up by the next rollout).
    lease_refused: Option<Refusal>,
    /// Set once reading the ConfigMap was refused: no replica of this ServiceAccount can
    /// hold it, so a replica electing with the Lease stops looking at it.
    config_map_refused: bool,
}

pub struct Elector {
    locks: Locks,
    config: LeaseConfig,
    clock: WallClock,
    metrics: Metrics,
    leading: watch::Sender<bool>,
    status: watch::Sender<ElectionStatus>,
    /// Held open until the renew deadline of each successful renewal.
    fence: Fence,
}

/// What [`Elector::new`] hands its caller: whether to act, and how the election stands.
pub struct ElectionWatch {
    pub leading: watch::Receiver<bool>,
    pub status: watch::Receiver<ElectionStatus>,
}

impl Elector {
    pub fn new(
        client: kube::Client,
        config: LeaseConfig,
        clock: WallClock,
        metrics: Metrics,
        fence: Fence,
    ) -> (Elector, ElectionWatch) {
        let (leading, leading_rx) = watch::channel(false);
        let (status, status_rx) = watch::channel(ElectionStatus::default());
        let locks = Locks::new(client, &config.name, &config.namespace);
        metrics.set_election(LockKind::Lease.label(), false);
        let elector = Elector {
            locks,
            config,
            clock,
            metrics,
            leading,
            status,
            fence,
        };
        let watch = ElectionWatch {
            leading: leading_rx,
            status: status_rx,
        };
        (elector, watch)
    }

    /// Campaigns, holds and renews until `shutdown` completes, then releases the lock if
    /// held. The receivers returned by [`Elector::new`] say whether to act.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut campaign = Campaign::default();
        // Start of the last successful renewal (or acquisition).
        let mut renewed_at: Option<Instant> = None;
        loop {
            let attempt_started = Instant::now();
            let leading = renewed_at.is_some();
            let acting_deadline = renewed_at.map(|at| at + self.config.renew_deadline);
            let attempt = self.attempt(&mut campaign);
            let outcome = tokio::select! {
                () = &mut shutdown => break,
                () = sleep_until_opt(acting_deadline) => None,
                outcome = attempt => Some(outcome),
            };
            if let Some(outcome) = &outcome {
                self.publish(&campaign, outcome);
            }
            match outcome {
                Some(Ok(true)) => {
                    if !leading {
                        tracing::info!(identity = %self.config.identity, lease = %self.config.name, lock = self.lock_kind(&campaign).label(), "acquired the lease; acting as leader");
                    }
                    renewed_at = Some(attempt_started);
                    // The hold ends on its own when this renewal's deadline passes.
                    self.fence
                        .hold_until(attempt_started + self.config.renew_deadline);
                    self.set_leading(true);
                }
                Some(Ok(false)) => {
                    if leading {
                        tracing::warn!(identity = %self.config.identity, "the lease was taken over; stopping");
                    }
                    renewed_at = None;
                    self.set_leading(false);
                }
                Some(Err(LeaseError::Blocked(_))) => {}
                Some(Err(e)) => {
                    tracing::warn!(identity = %self.config.identity, error = %e, "lease call failed");
                }
                None => {}
            }
            // A leader that has not renewed within its deadline stops acting now, even
            // while the call that would renew is still hanging.
            if let Some(at) = renewed_at
                && Instant::now() >= at + self.config.renew_deadline
            {
                tracing::warn!(identity = %self.config.identity, "could not renew the lease in time; stopping before it can be taken over");
                renewed_at = None;
                self.set_leading(false);
            }
            let next = attempt_started + self.config.retry_period;
            tokio::select! {
                () = &mut shutdown => break,
                () = tokio::time::sleep_until(next.max(Instant::now())) => {}
            }
        }
        self.stop(renewed_at.is_some(), self.lock_kind(&campaign))
            .await;
    }

    /// Stops acting and, if it led, releases its lock so a standby takes over at once.
    async fn stop(&self, was_leading: bool, kind: LockKind) {
        self.set_leading(false);
        if was_leading {
            match self.release(kind).await {
                Ok(()) => tracing::info!(identity = %self.config.identity, "released the lease"),
                Err(e) => {
                    tracing::warn!(error = %e, "could not release the lease; it expires on its own")
                }
            }
        }
    }

    fn lock_kind(&self, campaign: &Campaign) -> LockKind {
        if campaign.lease_refused.is_some() {
            LockKind::ConfigMap
        } else {
            LockKind::Lease
        }
    }

    /// Tells `/readyz`, the metrics and the log how the election stands; a line is logged
    /// when it changes, not every round.
    fn publish(&self, campaign: &Campaign, outcome: &Result<bool, LeaseError>) {
        let blocked = match outcome {
            Err(LeaseError::Blocked(why)) => Some(why.line()),
            _ => None,
        };
        let status = ElectionStatus {
            lock: self.lock_kind(campaign),
            blocked,
        };
        let before = self.status.borrow().clone();
        if before == status {
            return;
        }
        if let Some(line) = &status.blocked {
            tracing::error!(identity = %self.config.identity, "{line}");
        } else if before.blocked.is_some() {
            tracing::info!(identity = %self.config.identity, "the election can run again");
        }
        if status.lock != before.lock
            && let Some(refusal) = &campaign.lease_refused
        {
            tracing::warn!(identity = %self.config.identity, "{}", fallback_line(&self.config.namespace, &self.config.name, refusal));
        }
        self.metrics
            .set_election(status.lock.label(), status.blocked.is_some());
        self.status.send_replace(status);
    }

    fn set_leading(&self, leading: bool) {
        if !leading {
            self.fence.end_hold();
        }
        self.metrics.leader.set(i64::from(leading));
        self.leading.send_if_modified(|current| {
            let changed = *current != leading;
            *current = leading;
            changed
        });
    }

    /// One API call on a lock object, bounded, its error sorted.
    async fn call<T>(
        &self,
        kind: LockKind,
        verb: &'static str,
        call: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, LeaseError> {
        match tokio::time::timeout(self.config.call_timeout, call).await {
            Err(_) => Err(LeaseError::Timeout(self.config.call_timeout)),
            Ok(result) => result.map_err(|e| classify(kind, verb, &self.config.namespace, e)),
        }
    }

    /// One round: acquire, renew, or observe. `Ok(true)` when this replica holds the lock.
    /// The Lease first; once RBAC refused it, the ConfigMap; when that is refused too, the
    /// election is blocked and the replica never acts.
    async fn attempt(&self, campaign: &mut Campaign) -> Result<bool, LeaseError> {
        if campaign.lease_refused.is_none() {
            match self.attempt_on(LockKind::Lease, campaign).await {
                Err(LeaseError::Forbidden(refusal)) => {
                    campaign.lease_refused = Some(refusal);
                    campaign.observed = None;
                }
                other => return other,
            }
        }
        match self.attempt_on(LockKind::ConfigMap, campaign).await {
            Err(LeaseError::Forbidden(config_map)) => {
                Err(LeaseError::Blocked(Blocked::Forbidden {
                    namespace: self.config.namespace.clone(),
                    lease: campaign.lease_refused.clone().expect("refused above"),
                    config_map,
                }))
            }
            other => other,
        }
    }

    /// One round on the lock object of `kind`.
    async fn attempt_on(
        &self,
        kind: LockKind,
        campaign: &mut Campaign,
    ) -> Result<bool, LeaseError> {
        let current = self.call(kind, "get", self.locks.read(kind)).await?;
        let decision = match &current {
            None => Decision::TakeOver,
            Some(object) => decide(
                &self.config.identity,
                &object.record(),
                &mut campaign.observed,
                Instant::now(),
                self.config.lease_duration,
            ),
        };
        if decision == Decision::Wait
            || (decision == Decision::TakeOver
                && kind == LockKind::Lease
                && self.config_map_held(campaign).await?)
        {
            return Ok(false);
        }
        let Some(current) = current else {
            let fresh = self.locks.fresh(kind, self.held_spec(None, 0));
            return settle(self.call(kind, "create", self.locks.create(&fresh)).await);
        };
        let spec = current.record();
        let (transitions, acquire_time) = match decision {
            Decision::Renew => (
                spec.lease_transitions.unwrap_or(0),
                spec.acquire_time.clone(),
            ),
            _ => (spec.lease_transitions.unwrap_or(0) + 1, None),
        };
        // Write ourselves in, guarded by the resourceVersion we read so a concurrent
        // contender cannot also win.
        let updated = current.with_record(self.held_spec(acquire_time, transitions));
        let won = settle(
            self.call(kind, "update", self.locks.replace(&updated))
                .await,
        )?;
        if won {
            campaign.observed = None;
        }
        Ok(won)
    }

    /// Whether another replica holds the ConfigMap lock and renews it. A replica electing
    /// with the Lease asks before taking it, so one that elected with the ConfigMap while
    /// the Lease was refused to it is never overlapped by one granted the Lease later.
    async fn config_map_held(&self, campaign: &mut Campaign) -> Result<bool, LeaseError> {
        if campaign.config_map_refused {
            return Ok(false);
        }
        let kind = LockKind::ConfigMap;
        match self.call(kind, "get", self.locks.read(kind)).await {
            Ok(None) => Ok(false),
            Ok(Some(map)) => Ok(decide(
                &self.config.identity,
                &map.record(),
                &mut campaign.observed_other,
                Instant::now(),
                self.config.lease_duration,
            ) == Decision::Wait),
            Err(LeaseError::Forbidden(_)) => {
                campaign.config_map_refused = true;
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    fn held_spec(&self, acquire_time: Option<MicroTime>, transitions: i32) -> LeaseSpec {
        let now = MicroTime(self.clock.timestamp());
        LeaseSpec {
            holder_identity: Some(self.config.identity.clone()),
            lease_duration_seconds: Some(
                i32::try_from(self.config.lease_duration.as_secs()).unwrap_or(i32::MAX),
            ),
            acquire_time: Some(acquire_time.unwrap_or_else(|| now.clone())),
            renew_time: Some(now),
            lease_transitions: Some(transitions),
            ..Default::default()
        }
    }

    /// Gives the lock up so a standby takes over at once instead of after it expires.
    async fn release(&self, kind: LockKind) -> Result<(), LeaseError> {
        let Some(current) = self.call(kind, "get", self.locks.read(kind)).await? else {
            return Ok(());
        };
        let mut spec = current.record();
        if spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.renew_time = None;
        spec.acquire_time = None;
        let released = current.with_record(spec);
        self.call(kind, "update", self.locks.replace(&released))
            .await
    }
}

/// A write's outcome as the round counts it: lost to a concurrent writer is not an error.
fn settle(result: Result<(), LeaseError>) -> Result<bool, LeaseError> {
    match result {
        Ok(()) => Ok(true),
        Err(LeaseError::Conflict) => Ok(false),
        Err(e) => Err(e),
    }
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The Lease that elects the acting replica. Flattened into `spur-operator run`.
#[derive(clap::Args, Clone, Debug)]
pub struct LeaseArgs {
    /// Name of the Lease that elects the acting replica.
    #[arg(
        long,
        env = "SPUR_OPERATOR_LEASE_NAME",
        default_value = "spur-operator"
    )]
    pub lease_name: String,

    /// How long a Lease holds without renewal before a standby may take over. 15 s, as
    /// client-go's default: a crashed leader is replaced within about 15 s.
    #[arg(long, env = "SPUR_OPERATOR_LEASE_DURATION", default_value = "15s", value_parser = parse_duration)]
    pub lease_duration: Duration,

    /// The holder stops acting when it has not renewed for this long; shorter than the
    /// lease duration so it always stops before a standby can start.
    #[arg(long, env = "SPUR_OPERATOR_LEASE_RENEW_DEADLINE", default_value = "10s", value_parser = parse_duration)]
    pub lease_renew_deadline: Duration,

    /// Time between renewals (and a standby's attempts). Two tries fit in the deadline.
    #[arg(long, env = "SPUR_OPERATOR_LEASE_RETRY_PERIOD", default_value = "5s", value_parser = parse_duration)]
    pub lease_retry_period: Duration,

    /// Bound on each Lease API call, so a hung API server cannot hold a renewal past the
    /// renew deadline.
    #[arg(long, env = "SPUR_OPERATOR_KUBE_CALL_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    pub kube_call_timeout: Duration,
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn lease(holder: Option<&str>, renewed_at: i64, seconds: Option<i32>) -> LeaseSpec {
        LeaseSpec {
            holder_identity: holder.map(str::to_owned),
            renew_time: Some(MicroTime(Timestamp::from_second(renewed_at).unwrap())),
            lease_duration_seconds: seconds,
            ..Default::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_is_taken_over_only_once_its_renew_time_stood_still_for_its_duration() {
        let default = Duration::from_secs(15);
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut seen = None;
        // (what was read, when, what follows)
        let steps: [(LeaseSpec, u64, Decision); 8] = [
            // Ours, whatever its age: renew.
            (lease(Some("me"), 0, Some(15)), 0, Decision::Renew),
            // Another holder's: wait for its whole advertised duration, on our clock.
            (lease(Some("other"), 100, Some(10)), 1, Decision::Wait),
            (lease(Some("other"), 100, Some(10)), 10, Decision::Wait),
            // Renewed meanwhile: the wait starts again from when we saw the renewal.
            (lease(Some("other"), 108, Some(10)), 10, Decision::Wait),
            (lease(Some("other"), 108, Some(10)), 19, Decision::Wait),
            (lease(Some("other"), 108, Some(10)), 20, Decision::TakeOver),
            // Without an advertised duration, ours (15 s) counts, from the first sight of
            // a new holder.
            (lease(Some("third"), 1, None), 21, Decision::Wait),
            (lease(Some("third"), 1, None), 36, Decision::TakeOver),
        ];
        for (i, (spec, when, expected)) in steps.iter().enumerate() {
            assert_eq!(
                decide("me", spec, &mut seen, at(*when), default),
                *expected,
                "step {i}: {spec:?} at {when} s"
            );
        }
        // Released (no holder, or an empty one): taken at once.
        for holder in [None, Some("")] {
            let mut fresh = None;
            assert_eq!(
                decide(
                    "me",
                    &lease(holder, 0, Some(15)),
                    &mut fresh,
                    at(40),
                    default
                ),
                Decision::TakeOver
            );
        }
    }
}

#[cfg(test)]
mod election_tests {
    use super::*;
    use serde_json::{Value, json};
    use std::sync::{Arc, Mutex};

    const SERVICE_ACCOUNT: &str = "system:serviceaccount:spur:default";

    /// Kubernetes' 403 for `verb` on `resource`, as the API server words it.
    fn forbidden(verb: &str, resource: &str, group: &str) -> (u16, Value) {
        let message = format!(
            "{resource} \"spur-operator\" is forbidden: User \"{SERVICE_ACCOUNT}\" cannot {verb} \
             resource \"{resource}\" in API group \"{group}\" in the namespace \"spur\""
        );
        let status = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
            "reason": "Forbidden", "code": 403, "message": message,
            "details": {"name": "spur-operator", "group": group, "kind": resource}});
        (403, status)
    }

    fn not_found(message: &str, kind: &str) -> (u16, Value) {
        let status = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
            "reason": "NotFound", "code": 404, "message": message,
            "details": {"name": "spur", "kind": kind}});
        (404, status)
    }

    type Calls = Arc<Mutex<Vec<(String, Value)>>>;

    /// An API server answering each call with `answer(method, path)`; a 201 echoes the body.
    fn api(answer: fn(&http::Method, &str) -> (u16, Value), calls: Calls) -> kube::Client {
        let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
            let calls = calls.clone();
            async move {
                let (method, path) = (request.method().clone(), request.uri().path().to_owned());
                let body = request.into_body().collect_bytes().await?;
                let body: Value = serde_json::from_slice(&body).unwrap_or_default();
                let (code, mut answer) = answer(&method, &path);
                if code == 201 {
                    answer = body.clone();
                }
                calls
                    .lock()
                    .unwrap()
                    .push((format!("{method} {path}"), body));
                Ok::<_, kube::Error>(
                    http::Response::builder()
                        .status(code)
                        .body(kube::client::Body::from(answer.to_string().into_bytes()))
                        .expect("response"),
                )
            }
        });
        kube::Client::new(service, "spur")
    }

    /// Runs one elector for a few rounds; how the election stood, and the metrics.
    async fn elect(
        answer: fn(&http::Method, &str) -> (u16, Value),
    ) -> (bool, ElectionStatus, Calls, Metrics) {
        let calls = Calls::default();
        let config = LeaseConfig {
            name: "spur-operator".into(),
            namespace: "spur".into(),
            identity: "operator-0".into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(5),
            call_timeout: Duration::from_secs(5),
        };
        let metrics = Metrics::new();
        let (elector, watch) = Elector::new(
            api(answer, calls.clone()),
            config,
            WallClock::system(),
            metrics.clone(),
            Fence::default(),
        );
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(elector.run(async move {
            let _ = stopped.await;
        }));
        tokio::time::sleep(Duration::from_secs(12)).await;
        let outcome = (*watch.leading.borrow(), watch.status.borrow().clone());
        let _ = stop.send(());
        task.await.expect("the elector ends");
        (outcome.0, outcome.1, calls, metrics)
    }

    /// The elector wrote nothing: every call it made was a read.
    fn only_reads(calls: &Calls) -> bool {
        let calls = calls.lock().unwrap();
        calls.iter().all(|(what, _)| what.starts_with("GET"))
    }

    /// The RBAC verb of the calls the elector makes.
    fn verb_of(method: &http::Method) -> &'static str {
        match *method {
            http::Method::POST => "create",
            http::Method::PUT => "update",
            _ => "get",
        }
    }

    fn leases_refused(method: &http::Method, path: &str) -> (u16, Value) {
        let verb = verb_of(method);
        if path.contains("/leases") {
            forbidden(verb, "leases", "coordination.k8s.io")
        } else if method == http::Method::GET {
            not_found("configmaps \"spur-operator\" not found", "configmaps")
        } else {
            (201, Value::Null)
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_replica_refused_leases_elects_with_a_config_map_and_acts() {
        let (leading, status, calls, metrics) = elect(leases_refused).await;
        assert!(leading);
        assert_eq!(status.lock, LockKind::ConfigMap);
        assert_eq!(status.blocked, None);
        let calls = calls.lock().unwrap();
        let (_, created) = calls
            .iter()
            .find(|(what, _)| what == "POST /api/v1/namespaces/spur/configmaps")
            .expect("the ConfigMap lock was created");
        let record = created["metadata"]["annotations"][lock::LEADER_ANNOTATION]
            .as_str()
            .expect("the leader annotation");
        let record: Value = serde_json::from_str(record).unwrap();
        assert_eq!(record["holderIdentity"], "operator-0");
        assert_eq!(record["leaseDurationSeconds"], 15);
        let text = metrics.encode();
        assert!(
            text.contains("spur_operator_election_lock{kind=\"configmap\"} 1"),
            "{text}"
        );
        assert!(text.contains("spur_operator_election_blocked 0"), "{text}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_replica_refused_both_locks_never_acts_and_names_the_rule_to_add() {
        fn refused(method: &http::Method, path: &str) -> (u16, Value) {
            let verb = verb_of(method);
            match path.contains("/leases") {
                true => forbidden(verb, "leases", "coordination.k8s.io"),
                false => forbidden(verb, "configmaps", ""),
            }
        }
        let (leading, status, calls, metrics) = elect(refused).await;
        assert!(!leading);
        let line = status.blocked.expect("blocked");
        assert!(
            line.contains("ServiceAccount spur/default may not get leases"),
            "{line}"
        );
        assert!(line.contains("namespace \"spur\""), "{line}");
        assert!(only_reads(&calls), "{:?}", calls.lock().unwrap());
        assert!(
            metrics
                .encode()
                .contains("spur_operator_election_blocked 1")
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_missing_namespace_blocks_the_election_and_names_it() {
        fn missing(method: &http::Method, _: &str) -> (u16, Value) {
            match *method {
                http::Method::GET => not_found(
                    "leases.coordination.k8s.io \"spur-operator\" not found",
                    "leases",
                ),
                _ => not_found("namespaces \"spur\" not found", "namespaces"),
            }
        }
        let (leading, status, _, _) = elect(missing).await;
        assert!(!leading);
        assert_eq!(status.lock, LockKind::Lease);
        let line = status.blocked.expect("blocked");
        assert!(
            line.contains("namespace \"spur\", where its Lease goes, does not exist"),
            "{line}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_replica_granted_leases_waits_while_another_holds_the_config_map() {
        fn config_map_held(method: &http::Method, path: &str) -> (u16, Value) {
            if path.contains("/configmaps") && *method == http::Method::GET {
                let now = k8s_openapi::jiff::Timestamp::now();
                let record = json!({"holderIdentity": "operator-1", "leaseDurationSeconds": 15,
                    "renewTime": MicroTime(now), "leaderTransitions": 0});
                let map = json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": "spur-operator", "namespace": "spur", "resourceVersion": "1",
                        "annotations": {lock::LEADER_ANNOTATION: record.to_string()}}});
                return (200, map);
            }
            if *method == http::Method::GET {
                return not_found(
                    "leases.coordination.k8s.io \"spur-operator\" not found",
                    "leases",
                );
            }
            (201, Value::Null)
        }
        let (leading, status, calls, _) = elect(config_map_held).await;
        assert!(
            !leading,
            "the ConfigMap's holder renews (a fresh renewTime each read)"
        );
        assert_eq!(status.lock, LockKind::Lease);
        assert!(only_reads(&calls), "{:?}", calls.lock().unwrap());
    }
}
