//! Faults a scenario switches on at run time.
//!
//! Every fault is a state change, never a deadline: durations are measured by whoever
//! schedules the fault (on its own clock), so a harness on another turmoil host never mixes
//! its clock with the server's. [`Faults::outage_for`] is the one helper that times itself,
//! on the caller's runtime.

use std::{sync::Arc, time::Duration};

use tokio::sync::watch;

use super::error::ApiError;

/// How the server behaves during an outage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutageMode {
    /// Requests are accepted and never answered until the outage ends; watch streams stall.
    Hang,
    /// Requests get 503 ServiceUnavailable; watch streams are cut.
    Unavailable,
}

/// How the watch streams open at a [`Faults::cut_watches`] end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CutKind {
    /// The connection drops mid-stream (the client sees a broken body).
    Abort,
    /// An in-stream ERROR event with a 410 Status, then a clean end.
    Expire,
}

/// The fault state, shared by the handle and the request path.
#[derive(Clone, Debug, Default)]
pub struct FaultState {
    /// An outage in progress.
    pub outage: Option<OutageMode>,
    /// Added to every answer.
    pub latency: Duration,
    /// How many of the next status writes get 409 Conflict.
    pub status_conflicts: u32,
    /// Bumped at each cut, with how the streams end.
    pub cuts: u64,
    /// How the last cut ends streams.
    pub cut_kind: Option<CutKind>,
}

/// The handle a scenario uses to inject faults into a running API server.
#[derive(Clone, Debug)]
pub struct Faults {
    state: Arc<watch::Sender<FaultState>>,
}

impl Default for Faults {
    fn default() -> Self {
        Self {
            state: Arc::new(watch::Sender::new(FaultState::default())),
        }
    }
}

impl Faults {
    /// Starts an outage that lasts until [`Faults::end_outage`].
    pub fn start_outage(&self, mode: OutageMode) {
        self.state.send_modify(|s| s.outage = Some(mode));
    }

    /// Ends the outage; hung requests proceed.
    pub fn end_outage(&self) {
        self.state.send_modify(|s| s.outage = None);
    }

    /// An outage for `duration` of the caller's clock (spawns a timer on the caller's runtime).
    pub fn outage_for(&self, mode: OutageMode, duration: Duration) {
        self.start_outage(mode);
        let faults = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(duration).await;
            faults.end_outage();
        });
    }

    /// Delays every answer by `latency` (zero to stop).
    pub fn set_latency(&self, latency: Duration) {
        self.state.send_modify(|s| s.latency = latency);
    }

    /// Ends every open watch stream, the way `kind` says.
    pub fn cut_watches(&self, kind: CutKind) {
        self.state.send_modify(|s| {
            s.cuts += 1;
            s.cut_kind = Some(kind);
        });
    }

    /// The next `n` status writes (PUT or PATCH on `.../status`) get 409 Conflict.
    pub fn conflict_next_status_writes(&self, n: u32) {
        self.state.send_modify(|s| s.status_conflicts = n);
    }

    /// A receiver of the fault state (watch streams follow it).
    pub(crate) fn subscribe(&self) -> watch::Receiver<FaultState> {
        self.state.subscribe()
    }

    /// Applies the outage and latency faults to one request.
    pub(crate) async fn gate(&self) -> Result<(), ApiError> {
        let mut rx = self.state.subscribe();
        loop {
            let outage = rx.borrow_and_update().outage;
            match outage {
                None => break,
                Some(OutageMode::Unavailable) => return Err(ApiError::unavailable()),
                Some(OutageMode::Hang) => {
                    if rx.changed().await.is_err() {
                        return Err(ApiError::unavailable());
                    }
                }
            }
        }
        let latency = rx.borrow().latency;
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        Ok(())
    }

    /// Whether this status write must fail with a conflict (consumes one).
    pub(crate) fn take_status_conflict(&self) -> bool {
        let mut hit = false;
        self.state.send_if_modified(|s| {
            hit = s.status_conflicts > 0;
            s.status_conflicts = s.status_conflicts.saturating_sub(1);
            hit
        });
        hit
    }
}
