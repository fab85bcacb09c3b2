//! Leader election among operator replicas with a coordination.k8s.io/v1 Lease.
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

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::clock::WallClock;
use crate::fence::Fence;
use crate::flags::parse_duration;
use crate::metrics::Metrics;

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
    #[error(transparent)]
    Kube(#[from] kube::Error),
}

pub struct Elector {
    api: Api<Lease>,
    config: LeaseConfig,
    clock: WallClock,
    metrics: Metrics,
    leading: watch::Sender<bool>,
    /// Held open until the renew deadline of each successful renewal.
    fence: Fence,
}

impl Elector {
    pub fn new(
        client: kube::Client,
        config: LeaseConfig,
        clock: WallClock,
        metrics: Metrics,
        fence: Fence,
    ) -> (Elector, watch::Receiver<bool>) {
        let (leading, rx) = watch::channel(false);
        let api = Api::namespaced(client, &config.namespace);
        (
            Elector {
                api,
                config,
                clock,
                metrics,
                leading,
                fence,
            },
            rx,
        )
    }

    /// Campaigns, holds and renews until `shutdown` completes, then releases the lease if
    /// held. The receiver returned by [`Elector::new`] says whether to act.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut observed: Option<Observed> = None;
        // Start of the last successful renewal (or acquisition).
        let mut renewed_at: Option<Instant> = None;
        loop {
            let attempt_started = Instant::now();
            let leading = renewed_at.is_some();
            let acting_deadline = renewed_at.map(|at| at + self.config.renew_deadline);
            let attempt = self.attempt(&mut observed);
            let outcome = tokio::select! {
                () = &mut shutdown => break,
                () = sleep_until_opt(acting_deadline) => None,
                outcome = attempt => Some(outcome),
            };
            match outcome {
                Some(Ok(true)) => {
                    if !leading {
                        tracing::info!(identity = %self.config.identity, lease = %self.config.name, "acquired the lease; acting as leader");
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
        let was_leading = renewed_at.is_some();
        self.set_leading(false);
        if was_leading {
            match self.bounded(self.release()).await {
                Ok(()) => tracing::info!(identity = %self.config.identity, "released the lease"),
                Err(e) => {
                    tracing::warn!(error = %e, "could not release the lease; it expires on its own")
                }
            }
        }
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

    async fn bounded<T>(
        &self,
        call: impl Future<Output = Result<T, LeaseError>>,
    ) -> Result<T, LeaseError> {
        tokio::time::timeout(self.config.call_timeout, call)
            .await
            .map_err(|_| LeaseError::Timeout(self.config.call_timeout))?
    }

    /// One round: acquire, renew, or observe. `Ok(true)` when this replica holds the lease.
    async fn attempt(&self, observed: &mut Option<Observed>) -> Result<bool, LeaseError> {
        let name = &self.config.name;
        let Some(lease) = self
            .bounded(async { Ok(self.api.get_opt(name).await?) })
            .await?
        else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    namespace: Some(self.config.namespace.clone()),
                    ..Default::default()
                },
                spec: Some(self.held_spec(None, 0)),
            };
            return match self
                .bounded(self.write(self.api.create(&PostParams::default(), &lease)))
                .await
            {
                Ok(()) => Ok(true),
                Err(LeaseError::Conflict) => Ok(false),
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let (transitions, acquire_time) = match decide(
            &self.config.identity,
            &spec,
            observed,
            Instant::now(),
            self.config.lease_duration,
        ) {
            Decision::Wait => return Ok(false),
            Decision::Renew => (
                spec.lease_transitions.unwrap_or(0),
                spec.acquire_time.clone(),
            ),
            Decision::TakeOver => (spec.lease_transitions.unwrap_or(0) + 1, None),
        };
        // Write ourselves in, guarded by the resourceVersion we read so a concurrent
        // contender cannot also win.
        let mut updated = lease.clone();
        updated.spec = Some(self.held_spec(acquire_time, transitions));
        match self
            .bounded(self.write(self.api.replace(name, &PostParams::default(), &updated)))
            .await
        {
            Ok(()) => {
                *observed = None;
                Ok(true)
            }
            Err(LeaseError::Conflict) => Ok(false),
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

    async fn write(
        &self,
        call: impl Future<Output = Result<Lease, kube::Error>>,
    ) -> Result<(), LeaseError> {
        match call.await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.is_conflict() || status.is_already_exists() => {
                Err(LeaseError::Conflict)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Gives the lease up so a standby takes over at once instead of after it expires.
    async fn release(&self) -> Result<(), LeaseError> {
        let Some(mut lease) = self.api.get_opt(&self.config.name).await? else {
            return Ok(());
        };
        let spec = lease.spec.get_or_insert_with(Default::default);
        if spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.renew_time = None;
        spec.acquire_time = None;
        self.write(
            self.api
                .replace(&self.config.name, &PostParams::default(), &lease),
        )
        .await
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
