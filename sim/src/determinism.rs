//! What makes one seed replay exactly, in any process.
//!
//! Sources of nondeterminism and how each is closed:
//!
//! - **tokio's internal RNG** (the branch order of `tokio::select!`, used by hyper, h2 and
//!   tonic as well as by us): the repository's `.cargo/config.toml` builds with
//!   `--cfg tokio_unstable`, under which turmoil seeds every simulated host's runtime from
//!   the simulation's seed (`tokio::runtime::Builder::rng_seed`). Without that flag tokio
//!   seeds it from `RandomState`, i.e. from the OS, and runs diverge.
//! - **turmoil's RNG** (message latency, host runtime seeds): `Builder::rng_seed(seed)`.
//! - **our own randomness** (the Service's picks, election times, every simulated peer and
//!   later the fault schedule): [`rng_for`] derives one ChaCha stream per purpose from the
//!   seed, so adding a new consumer does not shift the draws of the others.
//! - **the wall clock**: the simulation starts at the fixed [`EPOCH`]; simulated peers take
//!   timestamps from [`sim_now`], never from `SystemTime::now`.
//! - **hash map iteration order**: state that is iterated uses `BTreeMap`/`BTreeSet`.
//! - **threads**: every host runs on turmoil's single-threaded runtimes; nothing in the
//!   simulation uses `spawn_blocking` or a thread pool.
//! - **getrandom / fastrand**: nothing on the simulated path draws from them (the trace hash
//!   test across two processes checks it); unlike mad-turmoil we do not override the
//!   `getrandom` symbol, which would also change the behaviour of the test harness.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// Wall-clock time at the start of every simulation: 2026-01-01T00:00:00Z. Fixed so that
/// timestamps in the trace are the same in every run.
pub const EPOCH: Duration = Duration::from_secs(1_767_225_600);

/// The fixed epoch as a `SystemTime`.
pub fn epoch() -> SystemTime {
    UNIX_EPOCH + EPOCH
}

/// Simulated time since the start of the simulation, as seen by the current host.
/// Outside a simulation (the real-TCP `controllers` command) it is zero.
pub fn sim_elapsed() -> Duration {
    turmoil::sim_elapsed().unwrap_or_default()
}

/// The simulated wall clock: the fixed epoch plus the simulated time.
pub fn sim_now() -> SystemTime {
    epoch() + sim_elapsed()
}

/// An RNG for one purpose (e.g. `"service"`, `"election"`), derived from the seed.
/// Each purpose gets its own ChaCha stream, so draws for one purpose do not depend on how
/// many draws another purpose made.
pub fn rng_for(seed: u64, purpose: &str) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(crate::trace::fnv1a(purpose.as_bytes()));
    rng
}

#[cfg(test)]
mod tests {
    use rand::RngExt;

    use super::*;

    #[test]
    fn purposes_draw_independent_streams() {
        let a: u64 = rng_for(7, "service").random();
        let b: u64 = rng_for(7, "election").random();
        let a_again: u64 = rng_for(7, "service").random();
        assert_ne!(a, b);
        assert_eq!(a, a_again);
    }
}
