//! Where the fakes read time, and what they ask of the world they run in.
//!
//! The fakes run inside the simulation (turmoil's hosts, simulated time) and in the lab
//! (real TCP, the machine's clock), and may not link the simulator. The simulation hands in
//! what only it can answer through [`install_host_world`]; elsewhere those answers are
//! `None`, as the simulator's own functions answer outside a simulated host.
//!
//! Simulated time starts at one epoch, [`EPOCH`] (spur-judge's, which the scenarios'
//! expectations read too). Two clocks read it: [`Clock`], where the spurctld replicas, the
//! kubelet and the workload controllers read time (plain functions, copied freely), and
//! [`TimeSource`], where the API server stamps `creationTimestamp` and
//! `deletionTimestamp` (a closure, as it keeps what it has seen: the world's time, the last
//! simulated time).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use k8s_openapi::jiff::{SignedDuration, Timestamp};

pub use spur_judge::seed::{EPOCH, epoch, rng_for};

/// What only a simulator knows: the simulated time on the current host, and which
/// simulated host an address belongs to. Both answer `None` outside a simulated host.
#[derive(Clone, Copy, Debug)]
pub struct HostWorld {
    pub elapsed: fn() -> Option<Duration>,
    pub peer_host: fn(SocketAddr) -> Option<String>,
}

static HOST_WORLD: OnceLock<HostWorld> = OnceLock::new();

/// Installs the simulator's answers for this process (the first call wins; a process
/// hosts one simulator).
pub fn install_host_world(world: HostWorld) {
    let _ = HOST_WORLD.set(world);
}

/// Simulated time on the current host, if it runs in a simulation.
pub fn host_elapsed() -> Option<Duration> {
    HOST_WORLD.get().and_then(|w| (w.elapsed)())
}

/// Simulated time since the start of the simulation, as seen by the current host; zero
/// outside a simulation (the replicas over real TCP).
pub fn sim_elapsed() -> Duration {
    host_elapsed().unwrap_or_default()
}

/// The simulated wall clock: the fixed epoch plus the simulated time.
pub fn sim_now() -> SystemTime {
    epoch() + sim_elapsed()
}

/// The simulated host a connection came from, by its peer address; `None` outside a
/// simulation (a real TCP peer has no simulated name).
pub fn peer_host(peer: SocketAddr) -> Option<String> {
    HOST_WORLD.get().and_then(|w| (w.peer_host)(peer))
}

/// The world's simulated time, readable from outside any simulated host (a harness between
/// steps, an action due at a time), where [`host_elapsed`] has no answer.
#[derive(Clone, Debug, Default)]
pub struct WorldTime(Arc<AtomicU64>);

impl WorldTime {
    pub fn elapsed(&self) -> Duration {
        Duration::from_nanos(self.0.load(Ordering::Relaxed))
    }

    /// Set by the world after each step.
    pub fn set(&self, elapsed: Duration) {
        self.0.store(
            u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }
}

/// Where the replicas read time: simulated in the simulation, real over real TCP.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    /// Monotonic time since the start of the run.
    pub elapsed: fn() -> Duration,
    /// Wall-clock time, for timestamps in answers.
    pub wall: fn() -> SystemTime,
}

fn real_elapsed() -> Duration {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START.get_or_init(std::time::Instant::now).elapsed()
}

impl Clock {
    /// The machine's clocks: elapsed since the first use in this process, and the wall
    /// clock (for the replicas over real TCP and the kubelet beside a real operator).
    pub fn real() -> Self {
        real_elapsed();
        Self {
            elapsed: real_elapsed,
            wall: SystemTime::now,
        }
    }

    /// The simulation's clock from the fixed epoch (see [`install_host_world`]).
    pub fn simulated() -> Self {
        Self {
            elapsed: sim_elapsed,
            wall: sim_now,
        }
    }
}

/// A source of "now" for the API server's timestamps. The API server never reads the wall
/// clock itself: a run must stamp the same times in any process.
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
            let elapsed = match host_elapsed() {
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
    pub fn of_world(time: WorldTime) -> Self {
        Self::from_fn(move || epoch_plus(host_elapsed().unwrap_or_else(|| time.elapsed())))
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

/// [`EPOCH`] plus `elapsed`, as a timestamp (the latest one past its range).
fn epoch_plus(elapsed: Duration) -> Timestamp {
    let epoch = SignedDuration::try_from(EPOCH)
        .ok()
        .and_then(|since_unix| Timestamp::UNIX_EPOCH.checked_add(since_unix).ok())
        .expect("the epoch is a valid timestamp");
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

    #[test]
    fn both_clocks_start_at_the_same_epoch() {
        let wall = Timestamp::try_from(epoch()).expect("the epoch is a valid timestamp");
        assert_eq!(epoch_plus(Duration::ZERO), wall);
    }
}
