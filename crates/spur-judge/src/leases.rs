//! The Leases' history as the API server applied it: who each Lease named as holder, from
//! which resourceVersion and simulated time. A stage feeds it from the API server's change
//! feed, so it is the store's ground truth whoever wrote the Lease, and kept small:
//! only changes of holder are kept (a renewal every few seconds is not one), plus the time
//! of the last write to each Lease.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// From `rv` on (until the next term), the Lease named `holder` (`None`: nobody, or the
/// Lease did not exist).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Term {
    pub rv: u64,
    pub at: Duration,
    pub holder: Option<String>,
}

#[derive(Debug, Default)]
struct Lease {
    terms: Vec<Term>,
    /// When the Lease was last written (a renewal included).
    written_at: Duration,
}

/// Every Lease's terms, by `namespace/name`. Cheap to clone; clones share the history.
#[derive(Clone, Debug, Default)]
pub struct LeaseHistory(Arc<Mutex<BTreeMap<String, Lease>>>);

impl LeaseHistory {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, Lease>> {
        self.0.lock().expect("lease history lock")
    }

    /// Notes that Lease `key` named `holder` from `rv` at `at` (tests build histories
    /// with it).
    pub fn record(&self, key: &str, rv: u64, at: Duration, holder: Option<String>) {
        let mut leases = self.lock();
        let lease = leases.entry(key.to_owned()).or_default();
        lease.written_at = at;
        if lease.terms.last().is_none_or(|t| t.holder != holder) {
            lease.terms.push(Term { rv, at, holder });
        }
    }

    /// Who Lease `key` names now.
    pub fn holder(&self, key: &str) -> Option<String> {
        self.lock()
            .get(key)
            .and_then(|l| l.terms.last())
            .and_then(|t| t.holder.clone())
    }

    /// The term in force just before resourceVersion `rv` was applied: what a write at
    /// `rv` found the Lease saying. `None` when the Lease did not exist yet.
    pub fn term_before(&self, key: &str, rv: u64) -> Option<Term> {
        let leases = self.lock();
        let terms = &leases.get(key)?.terms;
        let i = terms.partition_point(|t| t.rv < rv);
        i.checked_sub(1).map(|i| terms[i].clone())
    }

    /// The term in force at simulated time `at` (a change applied at `at` included), for
    /// what has no resourceVersion (a call to the controller).
    pub fn term_at(&self, key: &str, at: Duration) -> Option<Term> {
        let leases = self.lock();
        let terms = &leases.get(key)?.terms;
        let i = terms.partition_point(|t| t.at <= at);
        i.checked_sub(1).map(|i| terms[i].clone())
    }

    /// Whether the Lease `key` named `holder` at any instant from `from` to `to`.
    pub fn named_within(&self, key: &str, holder: &str, from: Duration, to: Duration) -> bool {
        let named = |t: &Term| t.holder.as_deref() == Some(holder);
        self.term_at(key, from).is_some_and(|t| named(&t))
            || self.lock().get(key).is_some_and(|l| {
                l.terms
                    .iter()
                    .any(|t| t.at > from && t.at <= to && named(t))
            })
    }

    /// Whether `holder` took Lease `key` over at a resourceVersion strictly between
    /// `after` and `before`.
    pub fn acquired_between(&self, key: &str, holder: &str, after: u64, before: u64) -> bool {
        self.lock().get(key).is_some_and(|l| {
            l.terms
                .iter()
                .any(|t| t.rv > after && t.rv < before && t.holder.as_deref() == Some(holder))
        })
    }

    /// Every term of Lease `key`, oldest first.
    pub fn terms(&self, key: &str) -> Vec<Term> {
        self.lock()
            .get(key)
            .map(|l| l.terms.clone())
            .unwrap_or_default()
    }

    /// When Lease `key` was last written, if ever.
    pub fn written_at(&self, key: &str) -> Option<Duration> {
        self.lock().get(key).map(|l| l.written_at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_changes_of_holder_make_terms() {
        let h = LeaseHistory::default();
        let key = "ns/l";
        h.record(key, 3, Duration::from_secs(1), Some("a".into()));
        h.record(key, 5, Duration::from_secs(6), Some("a".into()));
        h.record(key, 9, Duration::from_secs(11), None);
        h.record(key, 12, Duration::from_secs(12), Some("b".into()));
        assert_eq!(h.terms(key).len(), 3);
        assert_eq!(h.written_at(key), Some(Duration::from_secs(12)));
        assert_eq!(h.term_before(key, 3), None);
        assert_eq!(h.term_before(key, 4).unwrap().holder.as_deref(), Some("a"));
        assert_eq!(h.term_before(key, 10).unwrap().holder, None);
        assert_eq!(h.term_before(key, 13).unwrap().holder.as_deref(), Some("b"));
        assert_eq!(h.holder(key).as_deref(), Some("b"));
        assert_eq!(h.term_at(key, Duration::from_millis(500)), None);
        let at = |s| h.term_at(key, Duration::from_secs(s)).unwrap().holder;
        assert_eq!(at(6).as_deref(), Some("a"));
        assert_eq!(at(11), None);
        assert_eq!(at(12).as_deref(), Some("b"));
        assert!(h.acquired_between(key, "b", 9, 13));
        assert!(!h.acquired_between(key, "b", 12, 20));
        assert!(!h.acquired_between(key, "a", 3, 20));
    }
}
