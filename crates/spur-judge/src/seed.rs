//! What one seed decides without a simulator: an RNG stream per purpose, and the fixed
//! wall-clock epoch every run starts at.

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

/// An RNG for one purpose (e.g. `"service"`, `"election"`), derived from the seed.
/// Each purpose gets its own ChaCha stream, so draws for one purpose do not depend on how
/// many draws another purpose made.
pub fn rng_for(seed: u64, purpose: &str) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(crate::trace::fnv1a(purpose.as_bytes()));
    rng
}
