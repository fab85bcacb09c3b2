//! A kubelet's readiness probe as the judge reads it: the rule a kubelet follows and the
//! answers each probe got, in time order. The stages probe; this only records and reads.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

/// How a kubelet acts on a readiness probe: deploy/deployment.yaml's `readinessProbe`
/// (a test there holds the two equal).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProbeRule {
    pub period: Duration,
    pub timeout: Duration,
    /// Failed answers in a row that take a ready pod out of its Services.
    pub failure_threshold: usize,
    /// Successful answers in a row that put it back.
    pub success_threshold: usize,
}

impl ProbeRule {
    /// periodSeconds 5, timeoutSeconds 3, failureThreshold 3, successThreshold 1 (the
    /// Kubernetes default, which a readiness probe may raise).
    pub const DEPLOYMENT: ProbeRule = ProbeRule {
        period: Duration::from_secs(5),
        timeout: Duration::from_secs(3),
        failure_threshold: 3,
        success_threshold: 1,
    };

    /// The longest a kubelet takes to act on an answer that changed: the probes it needs
    /// in a row (the first may have just been sent), each answered within the timeout.
    pub fn lag(&self, to_ready: bool) -> Duration {
        let needed = if to_ready {
            self.success_threshold
        } else {
            self.failure_threshold
        };
        self.period * needed as u32 + self.timeout
    }
}

/// Probe results in time order: when, and whether the answer was 200.
#[derive(Clone, Default)]
pub struct ProbeLog(Rc<RefCell<Vec<(Duration, bool)>>>);

impl ProbeLog {
    /// Records a result (the prober's; tests build logs by hand with it).
    pub fn record(&self, at: Duration, ready: bool) {
        self.0.borrow_mut().push((at, ready));
    }

    /// Whether a kubelet following `rule` holds the pod ready after the answers up to
    /// `at`: not ready until `success_threshold` successes in a row, then ready until
    /// `failure_threshold` failures in a row, and so on.
    pub fn kubelet_ready(&self, at: Duration, rule: &ProbeRule) -> bool {
        let (mut ready, mut run) = (false, 0);
        for (_, answer) in self.0.borrow().iter().take_while(|(t, _)| *t <= at) {
            if *answer == ready {
                run = 0;
                continue;
            }
            run += 1;
            let needed = if *answer {
                rule.success_threshold
            } else {
                rule.failure_threshold
            };
            if run >= needed {
                ready = *answer;
                run = 0;
            }
        }
        ready
    }

    /// The first answer in `(after, to]` that said ready, and when.
    pub fn first_ready(&self, after: Duration, to: Duration) -> Option<Duration> {
        self.0
            .borrow()
            .iter()
            .find(|(t, ready)| *ready && *t > after && *t <= to)
            .map(|(t, _)| *t)
    }

    /// The last `n` answers at or before `at`, oldest first.
    pub fn last(&self, n: usize, at: Duration) -> Vec<(Duration, bool)> {
        let log = self.0.borrow();
        let end = log.partition_point(|(t, _)| *t <= at);
        log[end.saturating_sub(n)..end].to_vec()
    }

    /// The last result at or before `at`.
    pub fn at(&self, at: Duration) -> Option<bool> {
        let log = self.0.borrow();
        let i = log.partition_point(|(t, _)| *t <= at);
        i.checked_sub(1).map(|i| log[i].1)
    }

    pub fn len(&self) -> usize {
        self.0.borrow().len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.borrow().is_empty()
    }
}
