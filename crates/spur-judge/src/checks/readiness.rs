//! sim.md's readiness check: `/readyz` tells the truth within [15 s] of a change, as a
//! kubelet acting on it with the Deployment's probe (every 5 s, 3 s to answer, three
//! failures in a row to take the pod out of its Services, one success to put it back)
//! would see it.
//!
//! The truth, from the world's state: the operator is ready when the API server answers and
//! some ready endpoint of the controller's Service is alive and reachable from the
//! operator. What `/readyz` says comes from a kubelet-like prober on its own host (see
//! [`crate::probes`]). The deadline runs from the last change of the world the answer
//! depends on: the API server, the set of live ready endpoints the operator reaches, the
//! quorum leader (a follower forwarding a read to a leader that died hangs until the
//! election names another, which `/readyz` rightly reports), and the operator's own
//! restarts. Once all of those have held for the deadline:
//!
//! - while the truth is "not ready", no answer may say ready: the kubelet puts a pod back
//!   into its Services on one success, so a single lie routes traffic to it;
//! - once the kubelet has had the probes its rule needs to act on a truthful answer
//!   ([`ProbeRule::lag`]), the state it holds must be the truth at every sample: a
//!   failure or two in a row while ready is what the failure threshold absorbs, three is
//!   not.

use std::time::Duration;

use crate::probes::{ProbeLog, ProbeRule};

use crate::checks::Violation;

/// What the judge needs to know each sample.
pub struct ReadinessJudge {
    deadline: Duration,
    probes: ProbeLog,
    rule: ProbeRule,
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
    /// A judge of the answers in `probes`, made by a prober following `rule`.
    pub fn new(deadline: Duration, probes: ProbeLog, rule: ProbeRule, operator: &str) -> Self {
        ReadinessJudge {
            deadline,
            probes,
            rule,
            operator: operator.to_owned(),
            world: None,
            started_at: Duration::ZERO,
            flagged: false,
            judged: 0,
        }
    }

    /// Records an answer of the prober's (the lab's, whose prober is a task of its own).
    pub fn record(&self, at: Duration, ready: bool) {
        self.probes.record(at, ready);
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

    /// Judges the answers against `view`, the world as it is at `now` however it was read
    /// (the simulation's state, or the lab's processes and firewall).
    pub fn judge(&mut self, view: WorldView, now: Duration) -> Option<Violation> {
        let since = match &self.world {
            Some((held, since)) if *held == view => *since,
            _ => {
                self.flagged = false;
                now
            }
        };
        let settled_since = since.max(self.started_at);
        let violation = self
            .wrong(view.ready(), settled_since, now)
            .map(|wrong| self.violation(wrong, &view, settled_since, now));
        self.world = Some((view, since));
        violation
    }

    /// How the answers got `truth` wrong at `now`, once per stretch of unchanged truth,
    /// and only after the world has held since `settled_since` for the deadline.
    fn wrong(&mut self, truth: bool, settled_since: Duration, now: Duration) -> Option<Wrong> {
        if now < settled_since + self.deadline || self.flagged {
            return None;
        }
        self.judged += 1;
        let wrong = verdict(
            &self.probes,
            &self.rule,
            truth,
            settled_since + self.deadline,
            now,
        )?;
        self.flagged = true;
        Some(wrong)
    }

    /// The violation `wrong` is, described with the last answers and the world `view`
    /// that has held since `settled_since`.
    fn violation(
        &self,
        wrong: Wrong,
        view: &WorldView,
        settled_since: Duration,
        now: Duration,
    ) -> Violation {
        let said = match wrong {
            Wrong::LiedReady(at) => format!("said ready at {:.1}s", at.as_secs_f64()),
            Wrong::Held(ready) => format!(
                "the kubelet holds it {}",
                if ready { "ready" } else { "not ready" }
            ),
        };
        Violation {
            check: "readiness",
            object: format!("{}/readyz", self.operator),
            at: now,
            detail: format!(
                "{said} ({} failures in a row to drop it, {} success to add it; last answers: {}); since {:.1}s the process is {}, the API server is {} and a controller endpoint is {}",
                self.rule.failure_threshold,
                self.rule.success_threshold,
                self.last_answers(now),
                settled_since.as_secs_f64(),
                if view.up { "up" } else { "down" },
                if view.api_up {
                    "up and reachable"
                } else {
                    "down or unreachable"
                },
                if view.endpoints.is_empty() {
                    "unreachable"
                } else {
                    "reachable"
                },
            ),
        }
    }

    /// The prober's last answers up to `now`, as many as the failure threshold counts.
    fn last_answers(&self, now: Duration) -> String {
        let answers: Vec<String> = self
            .probes
            .last(self.rule.failure_threshold, now)
            .iter()
            .map(|(at, ready)| {
                format!(
                    "{} at {:.1}s",
                    if *ready { "ready" } else { "not ready" },
                    at.as_secs_f64()
                )
            })
            .collect();
        if answers.is_empty() {
            "none".to_owned()
        } else {
            answers.join(", ")
        }
    }
}

/// How the answers got the truth wrong.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Wrong {
    /// An answer said ready, at this time, while the truth was "not ready".
    LiedReady(Duration),
    /// The kubelet, having had the probes to act, holds this state against the truth.
    Held(bool),
}

/// Judges `probes` against `truth` at `now`, the answers having been due to tell it since
/// `due` (the world settled plus the deadline): see the module doc.
pub fn verdict(
    probes: &ProbeLog,
    rule: &ProbeRule,
    truth: bool,
    due: Duration,
    now: Duration,
) -> Option<Wrong> {
    if !truth && let Some(at) = probes.first_ready(due, now) {
        return Some(Wrong::LiedReady(at));
    }
    if now < due + rule.lag(truth) {
        return None;
    }
    let held = probes.kubelet_ready(now, rule);
    (held != truth).then_some(Wrong::Held(held))
}

/// The parts of the world `/readyz` reflects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorldView {
    /// The operator's process runs (not crashed, not shutting down): a process that is
    /// gone answers no probe, which the kubelet counts as not ready.
    pub up: bool,
    /// The API server answers, and this operator can reach it.
    pub api_up: bool,
    /// Live, ready controller endpoints the operator can reach.
    pub endpoints: Vec<String>,
    /// The leader with a quorum: a change of it is a change of the world the answer
    /// depends on.
    pub leader: Option<String>,
}

impl WorldView {
    /// Whether the operator should say it is ready.
    fn ready(&self) -> bool {
        self.up && self.api_up && !self.endpoints.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    /// Answers every 5 s from `from`.
    fn answers(from: u64, said: &[bool]) -> ProbeLog {
        let log = ProbeLog::default();
        for (i, ready) in said.iter().enumerate() {
            log.record(secs(from + 5 * i as u64), *ready);
        }
        log
    }

    const RULE: ProbeRule = ProbeRule::DEPLOYMENT;

    #[test]
    fn one_ready_answer_while_not_ready_fires_at_once() {
        // Two of three answers tell the truth: the judge before the kubelet's rule passed
        // this (some answer agreed); a kubelet puts the pod back on the one that lies.
        let log = answers(20, &[false, true, false]);
        assert_eq!(
            verdict(&log, &RULE, false, secs(15), secs(26)),
            Some(Wrong::LiedReady(secs(25)))
        );
        // A lie before the answers were due is not judged; the failures after it are.
        let late = answers(10, &[true, false, false, false]);
        assert_eq!(verdict(&late, &RULE, false, secs(15), secs(34)), None);
        assert_eq!(verdict(&late, &RULE, false, secs(15), secs(60)), None);
    }

    #[test]
    fn a_kubelet_that_never_drops_a_pod_that_is_not_ready_fires_once_it_had_the_probes() {
        // The operator kept saying ready until the deadline and then nothing arrived.
        let log = answers(0, &[true, true, true, true]);
        assert_eq!(
            verdict(&log, &RULE, false, secs(15), secs(32)),
            None,
            "not yet"
        );
        assert_eq!(
            verdict(&log, &RULE, false, secs(15), secs(33)),
            Some(Wrong::Held(true))
        );
    }

    #[test]
    fn two_failures_while_ready_are_absorbed_three_are_not() {
        let absorbed = answers(20, &[true, false, false, true]);
        assert_eq!(verdict(&absorbed, &RULE, true, secs(15), secs(40)), None);
        let dropped = answers(20, &[true, false, false, false]);
        assert_eq!(
            verdict(&dropped, &RULE, true, secs(15), secs(36)),
            Some(Wrong::Held(false))
        );
        // Ready is due one probe after the deadline: none by then is a pod left out.
        let never = answers(0, &[false, false, false, false, false]);
        assert_eq!(verdict(&never, &RULE, true, secs(15), secs(22)), None);
        assert_eq!(
            verdict(&never, &RULE, true, secs(15), secs(23)),
            Some(Wrong::Held(false))
        );
    }
}
