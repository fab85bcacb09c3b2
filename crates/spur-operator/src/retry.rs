//! Backoff with jitter drawn from an injected, seeded RNG.
//!
//! Jitter keeps many keys (nodes, jobs) from retrying in lockstep after a shared failure;
//! drawing it from a seeded RNG keeps the simulation replayable. Production seeds the RNG
//! from the OS once at start-up; the simulation from the scenario's seed.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::flags::{RetryRange, parse_duration, parse_range};

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

/// Doubling delays between `initial` and `max`, each shortened by up to `jitter` (a
/// fraction): the bound is never exceeded, and equal keys spread out.
///
/// A transient failure (the controller unreachable or mid-election: a transport failure)
/// is retried instead on a short jittered cadence, `transient`, without doubling: a
/// doubling backoff grown during an election outlasts it (docs/evidence.md, "The seed's
/// own runs"). `None` doubles for every failure (the seed's behaviour, kept for the
/// simulation's profiles).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BackoffPolicy {
    pub initial: Duration,
    pub max: Duration,
    pub jitter: f64,
    pub transient: Option<(Duration, Duration)>,
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

    /// The delay after a failure of `kind`: short and flat for a transport failure when
    /// the policy says so, doubling otherwise.
    pub fn delay_after(&mut self, kind: crate::controller::FailureKind) -> Duration {
        match (kind, self.policy.transient) {
            (crate::controller::FailureKind::Transport, Some((low, high))) => {
                self.entropy.between(low, high)
            }
            _ => self.next_delay(),
        }
    }

    /// Back to the initial delay, after a success.
    pub fn reset(&mut self) {
        self.attempt = 0;
    }
}

/// One [`Backoff`] per key (a SpurJob's uid, a pod's name), for the error policies of the
/// reconcilers: one failing object never slows the others, each key's delays grow from its
/// own first failure, and a success forgets the key, so only keys failing now are held.
#[derive(Debug)]
pub struct Backoffs {
    policy: BackoffPolicy,
    entropy: Entropy,
    failing: Mutex<BTreeMap<String, Backoff>>,
}

impl Backoffs {
    pub fn new(policy: BackoffPolicy, entropy: Entropy) -> Backoffs {
        Backoffs {
            policy,
            entropy,
            failing: Mutex::default(),
        }
    }

    /// The delay before `key`'s next attempt, after a failure of `kind`.
    pub fn delay_after(&self, key: &str, kind: crate::controller::FailureKind) -> Duration {
        self.failing
            .lock()
            .expect("backoffs lock")
            .entry(key.to_owned())
            .or_insert_with(|| self.policy.start(self.entropy.clone()))
            .delay_after(kind)
    }

    /// `key` succeeded: its next failure starts from the initial delay again.
    pub fn succeeded(&self, key: &str) {
        self.failing.lock().expect("backoffs lock").remove(key);
    }

    /// Keys failing now.
    #[cfg(test)]
    fn failing(&self) -> usize {
        self.failing.lock().expect("backoffs lock").len()
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

/// The retry of one object's failed or refused work. Flattened into `spur-operator run`.
#[derive(clap::Args, Clone, Debug)]
pub struct RetryArgs {
    /// First delay before retrying a failed or refused call for one object. Short, so a
    /// blip costs well under a second.
    #[arg(long, env = "SPUR_OPERATOR_RETRY_INITIAL", default_value = "500ms", value_parser = parse_duration)]
    pub retry_initial: Duration,

    /// Longest delay between retries for one object; doubling stops here. 30 s bounds how
    /// stale a refused node can get once the refusal clears.
    #[arg(long, env = "SPUR_OPERATOR_RETRY_MAX", default_value = "30s", value_parser = parse_duration)]
    pub retry_max: Duration,

    /// Fraction by which each retry delay is shortened at random, so objects that failed
    /// together do not retry in lockstep.
    #[arg(long, env = "SPUR_OPERATOR_RETRY_JITTER", default_value_t = 0.2)]
    pub retry_jitter: f64,

    /// Retry after a transport failure (controller unreachable, mid-election: UNAVAILABLE
    /// and the like) at a random delay in this range, without doubling, or `off` to double
    /// as for any failure. An election takes seconds; a doubling backoff grown during it
    /// outlasts it, while this retries within a second of the new leader at a few calls
    /// per second per object.
    #[arg(long, env = "SPUR_OPERATOR_RETRY_TRANSIENT", default_value = "250ms..1s",
          value_parser = parse_range)]
    pub retry_transient: RetryRange,
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: BackoffPolicy = BackoffPolicy {
        initial: Duration::from_millis(500),
        max: Duration::from_secs(30),
        jitter: 0.0,
        transient: Some((Duration::from_millis(250), Duration::from_secs(1))),
    };

    #[test]
    fn each_key_backs_off_alone_and_a_success_forgets_it() {
        use crate::controller::FailureKind::Answer;
        let backoffs = Backoffs::new(POLICY, Entropy::from_seed(1));
        let ms = Duration::from_millis;
        assert_eq!(backoffs.delay_after("a", Answer), ms(500));
        assert_eq!(backoffs.delay_after("a", Answer), ms(1000));
        assert_eq!(backoffs.delay_after("a", Answer), ms(2000));
        // Another key starts from the first delay, whatever "a" went through.
        assert_eq!(backoffs.delay_after("b", Answer), ms(500));
        assert_eq!(backoffs.failing(), 2);
        backoffs.succeeded("a");
        assert_eq!(backoffs.failing(), 1);
        assert_eq!(backoffs.delay_after("a", Answer), ms(500));
        backoffs.succeeded("a");
        backoffs.succeeded("b");
        backoffs.succeeded("never failed");
        assert_eq!(backoffs.failing(), 0);
    }

    #[test]
    fn transport_failures_retry_fast_and_flat_refusals_double() {
        use crate::controller::FailureKind::{Answer, Transport};
        let mut b = POLICY.start(Entropy::from_seed(4));
        for _ in 0..50 {
            let d = b.delay_after(Transport);
            assert!(
                d >= Duration::from_millis(250) && d <= Duration::from_secs(1),
                "{d:?}"
            );
        }
        assert_eq!(b.delay_after(Answer), Duration::from_millis(500));
        assert_eq!(b.delay_after(Answer), Duration::from_secs(1));
        let mut doubling = BackoffPolicy {
            transient: None,
            ..POLICY
        }
        .start(Entropy::from_seed(4));
        let delays: Vec<_> = (0..4).map(|_| doubling.delay_after(Transport)).collect();
        assert_eq!(
            delays[3],
            Duration::from_secs(4),
            "the seed's doubling: {delays:?}"
        );
    }

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
