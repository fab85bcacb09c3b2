//! sim.md's readiness check: `/readyz` tells the truth within [15 s] of a change.
//!
//! The truth, from the world's state: the operator is ready when the API server answers and
//! some ready endpoint of the controller's Service is alive and reachable from the
//! operator. What `/readyz` says comes from a kubelet-like prober on its own host (see
//! [`crate::prober`]). "Within 15 s of a change" is judged from the last change of the
//! world the answer depends on: the API server, the set of live ready endpoints the
//! operator reaches, the quorum leader (a follower forwarding a read to a leader that died
//! hangs until the election names another, which `/readyz` rightly reports), and the
//! operator's own restarts. Once all of those have held for the deadline, some probe of
//! the last deadline must agree with the truth: a moment's disagreement is what a
//! kubelet's failure threshold absorbs; disagreeing for the whole deadline is not telling
//! the truth.

use std::time::Duration;

use crate::harness::Sim;
use crate::operator::KUBE_API_HOST;
use crate::prober::ProbeLog;
use crate::world::CONTROLLER_SERVICE;

use super::Violation;

/// What the judge needs to know each sample.
pub struct ReadinessJudge {
    deadline: Duration,
    probes: ProbeLog,
    operator: String,
    /// The world the answer depends on at the last sample, and since when it has held.
    world: Option<(WorldView, Duration)>,
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
            world: None,
            started_at: Duration::ZERO,
            flagged: false,
            judged: 0,
        }
    }

    /// The operator host this judge probes.
    pub fn operator(&self) -> &str {
        &self.operator
    }

    /// The operator process was restarted at `at`.
    pub fn restarted(&mut self, at: Duration) {
        self.started_at = at;
        self.flagged = false;
    }

    /// What the readiness answer depends on, now.
    fn view(&self, sim: &Sim, now: Duration, api_up: bool) -> WorldView {
        let net = sim.world.net();
        let endpoints: Vec<String> = net
            .ready_endpoints(CONTROLLER_SERVICE, now)
            .into_iter()
            .filter(|e| !net.is_down(e) && net.can_reach(&self.operator, e))
            .collect();
        let leader = sim.world.cluster().leader_with_quorum();
        WorldView {
            up: !net.is_down(&self.operator),
            api_up: api_up && net.can_reach(&self.operator, KUBE_API_HOST),
            endpoints,
            leader,
        }
    }

    pub fn sample(&mut self, sim: &Sim, now: Duration, api_up: bool) -> Option<Violation> {
        let view = self.view(sim, now, api_up);
        let since = match &self.world {
            Some((held, since)) if *held == view => *since,
            _ => {
                self.flagged = false;
                now
            }
        };
        let truth = view.ready();
        let reachable = !view.endpoints.is_empty();
        let (process_up, api_reachable) = (view.up, view.api_up);
        self.world = Some((view, since));
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
                "said {said} for {:.0}s; since {:.1}s the process is {}, the API server is {} and a controller endpoint is {}",
                self.deadline.as_secs_f64(),
                settled_since.as_secs_f64(),
                if process_up { "up" } else { "down" },
                match (api_up, api_reachable) {
                    (true, true) => "up",
                    (true, false) => "unreachable",
                    (false, _) => "down",
                },
                if reachable {
                    "reachable"
                } else {
                    "unreachable"
                },
            ),
        })
    }
}

/// The parts of the world `/readyz` reflects.
#[derive(Clone, Debug, PartialEq, Eq)]
struct WorldView {
    /// The operator's process runs (not crashed, not shutting down): a process that is
    /// gone answers no probe, which the kubelet counts as not ready.
    up: bool,
    /// The API server answers, and this operator can reach it.
    api_up: bool,
    /// Live, ready controller endpoints the operator can reach.
    endpoints: Vec<String>,
    leader: Option<String>,
}

impl WorldView {
    /// Whether the operator should say it is ready.
    fn ready(&self) -> bool {
        self.up && self.api_up && !self.endpoints.is_empty()
    }
}
