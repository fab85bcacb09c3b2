//! Where the fakes read time, and what they ask of the world they run in.
//!
//! The fakes run inside the simulation (turmoil's hosts, simulated time) and in the lab
//! (real TCP, the machine's clock), and may not link the simulator. The simulation hands in
//! what only it can answer through [`install_host_world`]; elsewhere those answers are
//! `None`, as the simulator's own functions answer outside a simulated host.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

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
