//! Backoff with jitter drawn from an injected, seeded RNG.
//!
//! Jitter keeps many keys (nodes, jobs) from retrying in lockstep after a shared failure;
//! drawing it from a seeded RNG keeps the simulation replayable. Production seeds the RNG
//! from the OS once at start-up; the simulation from the scenario's seed.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// A shared, seeded source of randomness. Cloning shares the stream.
#[derive(Clone, Debug)]
pub struct Entropy(Arc<Mutex<ChaCha8Rng>>);

impl Entropy {
    pub fn from_seed(seed: u64) -> Entropy {
        Entropy(Arc::new(Mutex::new(ChaCha8Rng::seed_from_u64(seed))))
    }

    /// A uniform draw in `[0, 1)`.
    pub fn unit(&self) -> f64 {
        self.0.lock().expect("entropy lock").random::<f64>()
    }

    /// A uniform duration in `[low, high]`.
    pub fn between(&self, low: Duration, high: Duration) -> Duration {
        if high <= low {
            return low;
        }
        low + (high - low).mul_f64(self.unit())
    }
}

/// The delay before retrying a call that met UNAVAILABLE from the controller while it
/// elects a leader: uniform in [`max` / 4, `max`]. Short and flat rather than doubling,
/// because an election ends within seconds and a doubled delay overshoots the new leader
/// by up to the delay it reached (the seed's run 9); jittered so many objects failing
/// together do not retry in lockstep.
pub fn election_retry_delay(max: Duration, entropy: &Entropy) -> Duration {
    entropy.between(max / 4, max)
}

/// Doubling delays between `initial` and `max`, each shortened by up to `jitter` (a
/// fraction): the bound is never exceeded, and equal keys spread out.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BackoffPolicy {
    pub initial: Duration,
    pub max: Duration,
    pub jitter: f64,
}

impl BackoffPolicy {
    pub fn start(self, entropy: Entropy) -> Backoff {
        Backoff {
            policy: self,
            attempt: 0,
            entropy,
        }
    }
}

/// The backoff state of one key.
#[derive(Clone, Debug)]
pub struct Backoff {
    policy: BackoffPolicy,
    attempt: u32,
    entropy: Entropy,
}

impl Backoff {
    /// The delay before the next attempt; each call doubles the base, up to the maximum.
    pub fn next_delay(&mut self) -> Duration {
        let doubled = self
            .policy
            .initial
            .saturating_mul(1u32.checked_shl(self.attempt).unwrap_or(u32::MAX));
        let base = doubled.min(self.policy.max);
        self.attempt = self.attempt.saturating_add(1);
        let jitter = self.policy.jitter.clamp(0.0, 1.0);
        base.mul_f64(1.0 - jitter * self.entropy.unit())
    }

    /// Back to the initial delay, after a success.
    pub fn reset(&mut self) {
        self.attempt = 0;
    }

    pub fn attempts(&self) -> u32 {
        self.attempt
    }
}

impl Iterator for Backoff {
    type Item = Duration;
    fn next(&mut self) -> Option<Duration> {
        Some(self.next_delay())
    }
}

/// Lets kube-runtime's watchers back off with our seeded jitter instead of their own
/// unseeded one, which would make a simulated run unrepeatable.
impl kube::runtime::utils::Backoff for Backoff {
    fn reset(&mut self) {
        Backoff::reset(self);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: BackoffPolicy = BackoffPolicy {
        initial: Duration::from_millis(500),
        max: Duration::from_secs(30),
        jitter: 0.0,
    };

    #[test]
    fn doubles_up_to_the_maximum_and_resets() {
        let mut b = POLICY.start(Entropy::from_seed(1));
        let delays: Vec<u64> = (0..9).map(|_| b.next_delay().as_millis() as u64).collect();
        assert_eq!(
            delays,
            [500, 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000]
        );
        b.reset();
        assert_eq!(b.next_delay(), Duration::from_millis(500));
        // Far past any sensible attempt count, still bounded and no overflow.
        for _ in 0..100 {
            assert!(b.next_delay() <= POLICY.max);
        }
    }

    #[test]
    fn jitter_only_shortens_and_is_replayable() {
        let policy = BackoffPolicy {
            jitter: 0.5,
            ..POLICY
        };
        let run = |seed| {
            let mut b = policy.start(Entropy::from_seed(seed));
            (0..20).map(|_| b.next_delay()).collect::<Vec<_>>()
        };
        let a = run(7);
        assert_eq!(a, run(7), "same seed, same delays");
        assert_ne!(a, run(8), "another seed, other delays");
        let mut plain = POLICY.start(Entropy::from_seed(0));
        for d in a {
            let base = plain.next_delay();
            assert!(
                d <= base && d >= base / 2,
                "{d:?} outside [{:?}, {base:?}]",
                base / 2
            );
        }
    }

    #[test]
    fn election_retries_stay_short_and_flat() {
        let e = Entropy::from_seed(5);
        let max = Duration::from_secs(1);
        let delays: Vec<Duration> = (0..200).map(|_| election_retry_delay(max, &e)).collect();
        assert!(
            delays
                .iter()
                .all(|d| *d >= Duration::from_millis(250) && *d <= max),
            "{delays:?}"
        );
        // Spread over the range, not all alike.
        let (low, high) = (delays.iter().min().unwrap(), delays.iter().max().unwrap());
        assert!(
            *high - *low > Duration::from_millis(500),
            "{low:?}..{high:?}"
        );
    }

    #[test]
    fn between_stays_in_range() {
        let e = Entropy::from_seed(3);
        for _ in 0..1000 {
            let d = e.between(Duration::from_secs(3), Duration::from_secs(8));
            assert!(d >= Duration::from_secs(3) && d <= Duration::from_secs(8));
        }
        assert_eq!(
            e.between(Duration::from_secs(5), Duration::from_secs(1)),
            Duration::from_secs(5)
        );
    }
}
