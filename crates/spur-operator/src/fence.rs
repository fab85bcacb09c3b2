//! The fence on the operator's writes. Everything the operator writes on behalf of
//! leadership (a SpurJob's status, an event, a pod and its Service, an orphan's deletion,
//! a registration, a heartbeat, a submission, a report) is checked against the Lease at the
//! moment the write leaves the process, not when the work that makes it began: a
//! reconciliation or a LaunchJob that started while this replica led may reach its write
//! after the Lease has moved on (a LaunchJob awaits a Node read and a pod create; a
//! submission may wait seconds for a channel).
//!
//! The elector holds the fence open until the renew deadline of its last successful
//! renewal, so the hold ends on its own at the moment the elector would stop acting,
//! whether or not its task has run yet; a contender takes over only a whole lease duration
//! after it saw that renewal, which leaves `lease duration - renew deadline` for a write
//! that passed the fence to land. A write holds a permit until it is answered; on
//! shutdown the fence closes and [`Fence::drained`] waits for the writes in flight before
//! the Lease is released, so no write lands after the release.

use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use http::{Method, Request, Response};
use kube::client::Body;
use tokio::sync::{OwnedRwLockReadGuard, RwLock};
use tokio::time::Instant;

/// Why a write was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("this operator replica does not hold the Lease")]
    NotHolding,
    #[error(
        "this operator replica's hold on the Lease ran out {} ago (not renewed within the renew deadline)",
        humantime::format_duration(*.0)
    )]
    Expired(Duration),
    #[error("this operator replica is shutting down and releasing the Lease")]
    Closed,
}

impl Refused {
    /// The reason's label on `spur_operator_fence_refusals_total`.
    pub fn reason(&self) -> &'static str {
        match self {
            Refused::NotHolding => "not_holding",
            Refused::Expired(_) => "expired",
            Refused::Closed => "closed",
        }
    }
}

/// Shared by the elector (which opens and ends the hold) and every writer; cheap to clone.
#[derive(Clone, Default)]
pub struct Fence {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    hold: Mutex<Hold>,
    /// Read-held by each write while it is in flight; [`Fence::drained`] takes it
    /// exclusively.
    in_flight: Arc<RwLock<()>>,
    /// Counts the writes refused, by reason.
    metrics: Option<crate::metrics::Metrics>,
}

#[derive(Default)]
struct Hold {
    /// Writes pass until this instant.
    until: Option<Instant>,
    /// Set once on shutdown: no hold opens again.
    closed: bool,
}

/// Held by a write from the fence until its answer.
#[must_use = "the write is fenced only while its permit is held"]
pub struct Permit {
    _in_flight: OwnedRwLockReadGuard<()>,
}

impl Fence {
    pub fn new() -> Fence {
        Fence::default()
    }

    /// A fence that counts the writes it refuses in `metrics`.
    pub fn with_metrics(metrics: crate::metrics::Metrics) -> Fence {
        Fence {
            inner: Arc::new(Inner {
                metrics: Some(metrics),
                ..Inner::default()
            }),
        }
    }

    /// Lets writes pass until `until` (the renew deadline of the renewal that just
    /// succeeded). Ignored once the fence is closed.
    pub fn hold_until(&self, until: Instant) {
        let mut hold = self.lock();
        if !hold.closed {
            hold.until = Some(until);
        }
    }

    /// Ends the hold now: the Lease was lost or taken over.
    pub fn end_hold(&self) {
        self.lock().until = None;
    }

    /// Ends the hold for good: the replica is shutting down.
    pub fn close(&self) {
        let mut hold = self.lock();
        hold.closed = true;
        hold.until = None;
    }

    /// Whether a write may go now; the permit must be held until the write is answered.
    pub fn enter(&self) -> Result<Permit, Refused> {
        let entered = self.try_enter();
        if let (Err(refused), Some(metrics)) = (&entered, &self.inner.metrics) {
            metrics.fence_refused(refused.reason());
        }
        entered
    }

    fn try_enter(&self) -> Result<Permit, Refused> {
        // The permit first, then the check: a close that comes after the check finds this
        // write in flight and waits for it; one that came before fails the check. (Checked
        // first, a close and a whole drain could pass between the check and the permit.)
        // A drain waiting for the writes in flight refuses new ones.
        let in_flight = self
            .inner
            .in_flight
            .clone()
            .try_read_owned()
            .map_err(|_| Refused::Closed)?;
        self.check()?;
        Ok(Permit {
            _in_flight: in_flight,
        })
    }

    /// Whether a write may go now, without taking a permit.
    fn check(&self) -> Result<(), Refused> {
        let hold = self.lock();
        if hold.closed {
            return Err(Refused::Closed);
        }
        let until = hold.until.ok_or(Refused::NotHolding)?;
        let now = Instant::now();
        if now >= until {
            return Err(Refused::Expired(now - until));
        }
        Ok(())
    }

    /// Completes once no write that passed the fence is still in flight.
    pub async fn drained(&self) {
        drop(self.inner.in_flight.write().await);
    }

    /// A client whose writes (any method but GET, HEAD and OPTIONS; watches are GETs) pass
    /// this fence, each at the moment it is sent; reads pass untouched. Errors of the
    /// underlying client come out as they would from it.
    pub fn kube_client(&self, client: kube::Client) -> kube::Client {
        let namespace = client.default_namespace().to_owned();
        kube::Client::new(
            FencedService {
                fence: self.clone(),
                client,
            },
            namespace,
        )
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Hold> {
        self.inner.hold.lock().expect("fence lock")
    }
}

/// Whether a request of this method changes anything.
fn is_write(method: &Method) -> bool {
    !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// The tower service under a fenced [`kube::Client`].
#[derive(Clone)]
struct FencedService {
    fence: Fence,
    client: kube::Client,
}

impl tower::Service<Request<Body>> for FencedService {
    type Response = Response<Body>;
    type Error = tower::BoxError;
    type Future = BoxFuture<'static, Result<Response<Body>, tower::BoxError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let permit = if is_write(request.method()) {
            match self.fence.enter() {
                Ok(permit) => Some(permit),
                Err(refused) => {
                    tracing::info!(method = %request.method(), path = request.uri().path(), %refused, "write refused by the fence");
                    return Box::pin(std::future::ready(Err(refused.into())));
                }
            }
        } else {
            None
        };
        let client = self.client.clone();
        Box::pin(async move {
            // `kube::Client::send` hands back a `kube::Error` boxed; the outer client
            // unboxes it again, so the caller sees the inner client's error unchanged.
            let answer = client.send(request).await;
            drop(permit);
            answer.map_err(Into::into)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_hold_ends_at_its_deadline_without_anyone_ending_it() {
        let fence = Fence::new();
        assert_eq!(fence.check(), Err(Refused::NotHolding));
        fence.hold_until(Instant::now() + Duration::from_secs(10));
        assert_eq!(fence.check(), Ok(()));
        tokio::time::advance(Duration::from_millis(9_999)).await;
        assert_eq!(fence.check(), Ok(()));
        tokio::time::advance(Duration::from_millis(2)).await;
        assert_eq!(
            fence.check(),
            Err(Refused::Expired(Duration::from_millis(1)))
        );
        fence.hold_until(Instant::now() + Duration::from_secs(10));
        fence.end_hold();
        assert_eq!(fence.check(), Err(Refused::NotHolding));
    }

    #[tokio::test(start_paused = true)]
    async fn each_refused_write_is_counted_by_its_reason() {
        let metrics = crate::metrics::Metrics::new();
        let fence = Fence::with_metrics(metrics.clone());
        assert!(fence.enter().is_err());
        fence.hold_until(Instant::now() + Duration::from_secs(1));
        drop(fence.enter().expect("held"));
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(fence.enter().is_err());
        fence.close();
        assert!(fence.enter().is_err());
        assert!(fence.enter().is_err());
        let text = metrics.encode();
        for line in [
            "spur_operator_fence_refusals_total{reason=\"not_holding\"} 1",
            "spur_operator_fence_refusals_total{reason=\"expired\"} 1",
            "spur_operator_fence_refusals_total{reason=\"closed\"} 2",
        ] {
            assert!(text.contains(line), "{line} in:\n{text}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_closed_fence_stays_closed_and_drains_the_writes_in_flight() {
        let fence = Fence::new();
        fence.hold_until(Instant::now() + Duration::from_secs(10));
        let permit = fence.enter().expect("held");
        fence.close();
        fence.hold_until(Instant::now() + Duration::from_secs(10));
        assert_eq!(fence.check(), Err(Refused::Closed));
        let drained = tokio::spawn({
            let fence = fence.clone();
            async move { fence.drained().await }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(
            !drained.is_finished(),
            "drained while a write was in flight"
        );
        drop(permit);
        drained.await.expect("drain task");
    }

    #[tokio::test(start_paused = true)]
    async fn a_drain_refuses_writes_that_come_while_it_waits() {
        let fence = Fence::new();
        fence.hold_until(Instant::now() + Duration::from_secs(10));
        let permit = fence.enter().expect("held");
        let drained = tokio::spawn({
            let fence = fence.clone();
            async move { fence.drained().await }
        });
        tokio::task::yield_now().await;
        assert!(matches!(fence.enter(), Err(Refused::Closed)));
        drop(permit);
        drained.await.expect("drain task");
    }

    #[test]
    fn only_reads_pass_unfenced() {
        for method in [Method::GET, Method::HEAD, Method::OPTIONS] {
            assert!(!is_write(&method), "{method}");
        }
        for method in [Method::POST, Method::PUT, Method::PATCH, Method::DELETE] {
            assert!(is_write(&method), "{method}");
        }
    }
}
