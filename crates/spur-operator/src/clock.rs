//! The one source of wall-clock time (timestamps written to Kubernetes objects).
//!
//! Durations and timers use tokio's clock, which the simulation drives; wall-clock
//! timestamps come only from here, so the simulation can hand in its own epoch and a run
//! never depends on the day it ran.

use std::sync::Arc;
use std::time::SystemTime;

use k8s_openapi::jiff::Timestamp;

#[derive(Clone)]
pub struct WallClock(Arc<dyn Fn() -> SystemTime + Send + Sync>);

impl WallClock {
    /// The operating system's clock (production).
    pub fn system() -> WallClock {
        WallClock(Arc::new(SystemTime::now))
    }

    /// A clock of the caller's making (the simulation's: a fixed epoch plus simulated time).
    pub fn from_fn(now: impl Fn() -> SystemTime + Send + Sync + 'static) -> WallClock {
        WallClock(Arc::new(now))
    }

    pub fn now(&self) -> SystemTime {
        (self.0)()
    }

    /// Now, as Kubernetes timestamps carry it.
    pub fn timestamp(&self) -> Timestamp {
        Timestamp::try_from(self.now()).unwrap_or(Timestamp::UNIX_EPOCH)
    }
}

impl std::fmt::Debug for WallClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("WallClock").field(&self.now()).finish()
    }
}
