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
//!   the scenario's plan): [`rng_for`] derives one ChaCha stream per purpose from the
//!   seed, so adding a new consumer does not shift the draws of the others.
//! - **the wall clock**: the simulation starts at the fixed [`EPOCH`]; simulated peers take
//!   timestamps from [`sim_now`], never from `SystemTime::now`.
//! - **hash map iteration order**: state that is iterated uses `BTreeMap`/`BTreeSet`.
//! - **threads**: every host runs on turmoil's single-threaded runtimes; nothing in the
//!   simulation uses `spawn_blocking` or a thread pool.
//! - **getrandom** (std's `HashMap` keys, tower's and ahash's hashers, rand's thread RNG):
//!   like mad-turmoil, this crate defines the C symbols `getrandom` and `getentropy`, so
//!   every binary that links `spur-sim` (the `spur-sim` binary and the tests) gets
//!   [`deterministic_bytes`] instead of the OS's entropy: each thread draws the same fixed
//!   stream, so a `HashMap` a library iterates has the same order in every run. Never link
//!   this crate into a production binary. (glibc's own start-up call to the getrandom
//!   syscall is untouched; it does not reach Rust code.)
//! - **fastrand** (kube-runtime's backoff jitter, through backon): [`seed_process`] seeds
//!   the calling thread's generator from the seed. Its unseeded default mixes in the real
//!   clock.
//! - **not closed**: a library reading the real wall clock (hyper's `date` header) or
//!   `std::time::Instant` directly. Nothing the trace records depends on either; tokio's
//!   clock is turmoil's.

pub use spur_fakes::clock::{EPOCH, epoch, rng_for, sim_elapsed, sim_now};
use spur_fakes::clock::{HostWorld, install_host_world};

/// Gives the fakes turmoil's answers for this process: the simulated time on the current
/// host, and which host an address belongs to (they may not link turmoil themselves).
pub fn install_turmoil_host_world() {
    install_host_world(HostWorld {
        elapsed: turmoil::sim_elapsed,
        peer_host: crate::net::peer_host,
    });
}

/// Seeds the process-level generators that cannot be handed a seed (fastrand's
/// thread-local one) for a world on the current thread.
pub fn seed_process(seed: u64) {
    install_turmoil_host_world();
    fastrand::seed(seed);
}

thread_local! {
    /// Each thread's position in the fixed stream [`deterministic_bytes`] draws from.
    static ENTROPY_STATE: std::cell::Cell<u64> = const { std::cell::Cell::new(0x5eed_5eed_5eed_5eed) };
}

/// Fills `dest` from a fixed per-thread stream (SplitMix64): what `getrandom` returns in
/// any binary linking this crate.
pub fn deterministic_bytes(dest: &mut [u8]) {
    ENTROPY_STATE.with(|state| {
        for chunk in dest.chunks_mut(8) {
            let mut z = state.get().wrapping_add(0x9e37_79b9_7f4a_7c15);
            state.set(z);
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            chunk.copy_from_slice(&z.to_le_bytes()[..chunk.len()]);
        }
    });
}

/// Replaces libc's `getrandom(2)` wrapper: see the module documentation.
///
/// # Safety
/// `buf` must be valid for `buflen` bytes of writes, as for libc's.
#[unsafe(no_mangle)]
#[inline(never)]
pub unsafe extern "C" fn getrandom(buf: *mut u8, buflen: usize, _flags: u32) -> isize {
    if buf.is_null() {
        return -1;
    }
    // SAFETY: the caller hands a buffer of `buflen` writable bytes, per getrandom(2).
    let dest = unsafe { std::slice::from_raw_parts_mut(buf, buflen) };
    deterministic_bytes(dest);
    buflen as isize
}

/// Replaces libc's `getentropy(3)`: see [`getrandom`].
///
/// # Safety
/// `buf` must be valid for `buflen` bytes of writes.
#[unsafe(no_mangle)]
#[inline(never)]
pub unsafe extern "C" fn getentropy(buf: *mut u8, buflen: usize) -> i32 {
    if buf.is_null() || buflen > 256 {
        return -1;
    }
    // SAFETY: as for `getrandom`.
    unsafe { getrandom(buf, buflen, 0) };
    0
}

#[cfg(test)]
mod tests {
    use rand::RngExt;

    use super::*;

    #[test]
    #[allow(unexpected_cfgs, clippy::assertions_on_constants)]
    fn built_with_tokio_unstable_so_turmoil_seeds_every_runtime() {
        // `RUSTFLAGS` in the environment replaces `.cargo/config.toml`'s flags silently.
        assert!(
            cfg!(tokio_unstable),
            "build with --cfg tokio_unstable (see .cargo/config.toml) or seeds do not replay"
        );
    }

    #[test]
    fn purposes_draw_independent_streams() {
        let a: u64 = rng_for(7, "service").random();
        let b: u64 = rng_for(7, "election").random();
        let a_again: u64 = rng_for(7, "service").random();
        assert_ne!(a, b);
        assert_eq!(a, a_again);
    }

    #[test]
    fn std_hash_maps_iterate_in_the_same_order_in_every_run() {
        // Every thread starts the same stream, so a fresh thread sees the same keys.
        let order = || {
            std::thread::spawn(|| {
                let map: std::collections::HashMap<u32, ()> = (0..64).map(|i| (i, ())).collect();
                map.keys().copied().collect::<Vec<_>>()
            })
            .join()
            .unwrap()
        };
        assert_eq!(order(), order());
    }
}
