//! sim.md's readiness check: `/readyz` tells the truth within [15 s] of a change.
//!
//! The truth, from the world's state: the operator is ready when the API server answers and
//! some ready endpoint of the controller's Service is alive and reachable from the
//! operator. What `/readyz` says comes from a kubelet-like prober on its own host (see
//! [`crate::prober`]). Once the truth (and the operator process, which a restart replaces)
//! has held for the deadline, some probe of the last deadline must agree with it: a
//! moment's disagreement (a channel to a pod that just died, until keepalive or the probe's
//! bound ends it) is what a kubelet's failure threshold absorbs; disagreeing for the whole
//! deadline is not telling the truth.

use std::time::Duration;

use crate::harness::Sim;
use crate::prober::ProbeLog;
use crate::world::CONTROLLER_SERVICE;

use super::Violation;

/// What the judge needs to know each sample.
pub struct ReadinessJudge {
    deadline: Duration,
    probes: ProbeLog,
    operator: String,
    /// The truth at the last sample, and since when it has held.
    truth: Option<(bool, Duration)>,
    /// When the operator process last (re)started.
    started_at: Duration,
    /// A violation is reported once per stretch of unchanged truth.
    flagged: bool,
    /// Samples at which the probe was judged (a check that never judged would pass
    /// silently; the scenario reports this count).
    pub judged: usize,
}

impl ReadinessJudge {
    pub fn new(deadline: Duration, probes: ProbeLog, operator: &str) -> Self {
        ReadinessJudge {
            deadline,
            probes,
            operator: operator.to_owned(),
            truth: None,
            started_at: Duration::ZERO,
            flagged: false,
            judged: 0,
        }
    }

    /// The operator process was restarted at `at`.
    pub fn restarted(&mut self, at: Duration) {
        self.started_at = at;
        self.flagged = false;
    }

    /// Whether a live controller endpoint is ready and reachable from the operator.
    fn controller_reachable(&self, sim: &Sim, now: Duration) -> bool {
        let net = sim.world.net();
        net.ready_endpoints(CONTROLLER_SERVICE, now)
            .iter()
            .any(|e| !net.is_down(e) && net.can_reach(&self.operator, e))
    }

    pub fn sample(&mut self, sim: &Sim, now: Duration, api_up: bool) -> Option<Violation> {
        let reachable = self.controller_reachable(sim, now);
        let truth = api_up && reachable;
        let since = match self.truth {
            Some((held, since)) if held == truth => since,
            _ => {
                self.flagged = false;
                now
            }
        };
        self.truth = Some((truth, since));
        let settled_since = since.max(self.started_at);
        if now < settled_since + self.deadline || self.flagged {
            return None;
        }
        self.judged += 1;
        let said = self.probes.between(now - self.deadline, now);
        if said.contains(&truth) {
            return None;
        }
        self.flagged = true;
        let said = if said.is_empty() {
            "nothing (no probe answered)"
        } else if truth {
            "not ready"
        } else {
            "ready"
        };
        Some(Violation {
            check: "readiness",
            object: format!("{}/readyz", self.operator),
            at: now,
            detail: format!(
                "said {said} for {:.0}s; since {:.1}s the API server is {} and a controller endpoint is {}",
                self.deadline.as_secs_f64(),
                settled_since.as_secs_f64(),
                if api_up { "up" } else { "down" },
                if reachable {
                    "reachable"
                } else {
                    "unreachable"
                },
            ),
        })
    }
}
