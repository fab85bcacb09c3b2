//! The run's trace: every notable event as (simulated time, host, event), and a hash of it.
//!
//! Two runs of one seed must produce the same trace byte for byte; the hash (64-bit FNV-1a
//! over the encoded events, a stable hasher unlike std's randomly keyed `DefaultHasher`)
//! makes that cheap to compare, also across processes.

use std::sync::{Arc, Mutex};
use std::time::Duration;

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// 64-bit FNV-1a of `bytes`.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    fnv1a_extend(FNV_OFFSET, bytes)
}

fn fnv1a_extend(mut hash: u64, bytes: &[u8]) -> u64 {
    for byte in bytes {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(FNV_PRIME);
    }
    hash
}

/// One recorded event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceEvent {
    /// Simulated time since the start of the run.
    pub at: Duration,
    /// The host the event happened on (`harness` for the world's own actions).
    pub host: String,
    /// What happened, in words.
    pub event: String,
}

impl std::fmt::Display for TraceEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:>10.3}s {:<14} {}",
            self.at.as_secs_f64(),
            self.host,
            self.event
        )
    }
}

/// A shared, append-only trace. Cloning shares it.
#[derive(Clone, Debug)]
pub struct Trace {
    inner: Arc<Mutex<TraceInner>>,
}

#[derive(Debug)]
struct TraceInner {
    events: Vec<TraceEvent>,
    hash: u64,
    /// Echo events to stderr as they happen (for debugging a seed).
    echo: bool,
}

impl Default for Trace {
    fn default() -> Self {
        Self::new()
    }
}

impl Trace {
    /// An empty trace.
    pub fn new() -> Self {
        Self {
            inner: Arc::new(Mutex::new(TraceInner {
                events: Vec::new(),
                hash: FNV_OFFSET,
                echo: std::env::var_os("SPUR_SIM_TRACE").is_some(),
            })),
        }
    }

    /// Records an event that happened on `host` at simulated time `at`.
    pub fn record(&self, at: Duration, host: &str, event: impl Into<String>) {
        let event = TraceEvent {
            at,
            host: host.to_owned(),
            event: event.into(),
        };
        let mut inner = self.inner.lock().expect("trace lock");
        // Encoding: nanoseconds (little endian), host, NUL, event, NUL.
        let mut hash = fnv1a_extend(inner.hash, &(at.as_nanos() as u64).to_le_bytes());
        hash = fnv1a_extend(hash, event.host.as_bytes());
        hash = fnv1a_extend(hash, &[0]);
        hash = fnv1a_extend(hash, event.event.as_bytes());
        hash = fnv1a_extend(hash, &[0]);
        inner.hash = hash;
        if inner.echo {
            eprintln!("{event}");
        }
        inner.events.push(event);
    }

    /// The hash of everything recorded so far, as 16 hex digits.
    pub fn hash_hex(&self) -> String {
        format!("{:016x}", self.inner.lock().expect("trace lock").hash)
    }

    /// A copy of the events recorded so far.
    pub fn events(&self) -> Vec<TraceEvent> {
        self.inner.lock().expect("trace lock").events.clone()
    }

    /// Events whose text contains `needle`.
    pub fn find(&self, needle: &str) -> Vec<TraceEvent> {
        let inner = self.inner.lock().expect("trace lock");
        inner
            .events
            .iter()
            .filter(|e| e.event.contains(needle))
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_matches_reference_values() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }

    #[test]
    fn hash_depends_on_time_host_and_event() {
        let hash_of = |at: u64, host: &str, event: &str| {
            let trace = Trace::new();
            trace.record(Duration::from_millis(at), host, event);
            trace.hash_hex()
        };
        let base = hash_of(1, "a", "x");
        assert_eq!(base, hash_of(1, "a", "x"));
        assert_ne!(base, hash_of(2, "a", "x"));
        assert_ne!(base, hash_of(1, "b", "x"));
        assert_ne!(base, hash_of(1, "a", "y"));
    }
}
