//! The jobs whose state this operator has just changed at spurctld (a pod's end reported, a
//! run requeued), handed to the status poller so it reads them at once: a SpurJob shows its
//! job's end a round trip after the report, not at the next poll.
//!
//! Ids arriving while a read is in flight wait for the next one, so a burst of ends costs one
//! GetJobs per round trip, not one per job.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// Cheap to clone; clones share the same pending ids.
#[derive(Clone, Debug, Default)]
pub struct StatusNudge {
    inner: Arc<Inner>,
    /// Off (`--status-read-at-once false`): nothing is ever pending.
    off: bool,
}

#[derive(Debug, Default)]
struct Inner {
    pending: Mutex<BTreeSet<u32>>,
    woken: Notify,
}

impl StatusNudge {
    /// A nudge that passes ids on when `on`, and drops them otherwise.
    pub fn new(on: bool) -> StatusNudge {
        StatusNudge {
            inner: Arc::default(),
            off: !on,
        }
    }

    /// Job `job_id`'s state changed at spurctld by this operator's doing.
    pub fn changed(&self, job_id: u32) {
        if self.off {
            return;
        }
        self.inner
            .pending
            .lock()
            .expect("nudge lock")
            .insert(job_id);
        self.inner.woken.notify_one();
    }

    /// Waits until some job changed; every id pending, in order.
    pub async fn next(&self) -> Vec<u32> {
        loop {
            let woken = self.inner.woken.notified();
            let taken = std::mem::take(&mut *self.inner.pending.lock().expect("nudge lock"));
            if !taken.is_empty() {
                return taken.into_iter().collect();
            }
            woken.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn ids_changed_meanwhile_come_in_one_batch_and_each_once() {
        let nudge = StatusNudge::default();
        nudge.changed(7);
        nudge.changed(3);
        nudge.changed(7);
        assert_eq!(nudge.next().await, vec![3, 7]);
        let waiting = tokio::spawn({
            let nudge = nudge.clone();
            async move { nudge.next().await }
        });
        tokio::task::yield_now().await;
        nudge.changed(9);
        assert_eq!(waiting.await.expect("the waiter"), vec![9]);
    }

    #[tokio::test]
    async fn an_off_nudge_passes_nothing_on() {
        let nudge = StatusNudge::new(false);
        nudge.changed(7);
        let next = tokio::time::timeout(std::time::Duration::from_millis(10), nudge.next());
        assert!(next.await.is_err(), "nothing is pending");
    }
}
