//! Timestamps for `creationTimestamp` and `deletionTimestamp`, from an injected clock.
//!
//! The API server never reads the wall clock: a run must stamp the same times in any process.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use k8s_openapi::jiff::{SignedDuration, Timestamp};

/// The fixed epoch simulated time starts at: 2026-01-01T00:00:00Z.
pub const DEFAULT_EPOCH_SECS: i64 = 1_767_225_600;

/// A source of "now" for the objects' timestamps.
#[derive(Clone)]
pub struct TimeSource(Arc<dyn Fn() -> Timestamp + Send + Sync>);

impl std::fmt::Debug for TimeSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("TimeSource").field(&self.now()).finish()
    }
}

impl TimeSource {
    /// A clock from any function (the simulation hands in its own).
    pub fn from_fn(now: impl Fn() -> Timestamp + Send + Sync + 'static) -> Self {
        Self(Arc::new(now))
    }

    /// The fixed epoch plus elapsed time: turmoil's simulated time when called on a turmoil
    /// host, otherwise tokio's clock since this call (paused in tests, real on a laptop).
    ///
    /// Once it has seen turmoil's time, a call from outside any host (a harness between
    /// simulation steps) gets the last simulated time seen, never the wall clock.
    pub fn simulated() -> Self {
        let start = tokio::time::Instant::now();
        // Nanoseconds of simulated time last seen, plus one; zero: never in a simulation.
        let last_sim = Arc::new(AtomicU64::new(0));
        Self::from_fn(move || {
            let elapsed = match crate::clock::host_elapsed() {
                Some(sim) => {
                    let nanos = u64::try_from(sim.as_nanos()).unwrap_or(u64::MAX - 1);
                    last_sim.store(nanos + 1, Ordering::Relaxed);
                    sim
                }
                None => match last_sim.load(Ordering::Relaxed) {
                    0 => start.elapsed(),
                    seen => Duration::from_nanos(seen - 1),
                },
            };
            epoch_plus(elapsed)
        })
    }

    /// Turmoil's simulated time on a host; outside any host (a harness between steps, a
    /// world action), the world's time as of its last step.
    pub fn of_world(time: crate::clock::WorldTime) -> Self {
        Self::from_fn(move || {
            epoch_plus(crate::clock::host_elapsed().unwrap_or_else(|| time.elapsed()))
        })
    }

    /// Now, by this clock.
    pub fn now(&self) -> Timestamp {
        (self.0)()
    }

    /// Now, formatted as a Kubernetes `Time` (RFC 3339, whole seconds).
    pub fn now_rfc3339(&self) -> String {
        format_time(self.now())
    }
}

fn epoch_plus(elapsed: Duration) -> Timestamp {
    let epoch = Timestamp::from_second(DEFAULT_EPOCH_SECS).expect("the epoch is a valid timestamp");
    epoch
        .checked_add(SignedDuration::try_from(elapsed).unwrap_or(SignedDuration::MAX))
        .unwrap_or(Timestamp::MAX)
}

/// RFC 3339 with whole seconds, as `metav1.Time` is serialised.
pub fn format_time(t: Timestamp) -> String {
    let whole = Timestamp::from_second(t.as_second()).unwrap_or(t);
    whole.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// Parses a `metav1.Time`; `None` when it is not RFC 3339.
pub fn parse_time(s: &str) -> Option<Timestamp> {
    s.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn simulated_clock_follows_tokio_time() {
        let clock = TimeSource::simulated();
        assert_eq!(clock.now_rfc3339(), "2026-01-01T00:00:00Z");
        tokio::time::advance(Duration::from_millis(61_500)).await;
        assert_eq!(clock.now_rfc3339(), "2026-01-01T00:01:01Z");
    }
}
