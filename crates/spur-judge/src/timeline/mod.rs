//! A run as a picture: hosts as lanes, faults as shaded spans, controller calls as marks
//! coloured by how they ended, leader terms, each SpurJob's life and each deadline as a
//! bracket, met or missed ([`Timeline`]), written as one self-contained HTML file
//! ([`html::render`]). A failing seed is read from it at a glance, where its trace is
//! thousands of lines.
//!
//! The parts come from where the checks' ground truth comes from: the samples the checks
//! judge ([`Recorder::observe`]), the deadlines they judged ([`Bracket`]), the harness's
//! trace lines (kills, freezes, partitions) and the replicas' (each answer), and the
//! operator's own account of each call it made (the simulation's `timeline_calls`, a real
//! operator's log through [`operator_log`]), which only it can give (a call abandoned or
//! never connected reaches no replica).

pub mod html;
pub mod operator_log;

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use crate::checks::{Bracket, Observation, Violation};
use crate::trace::TraceEvent;

fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

/// What a lane stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LaneKind {
    Operator,
    Controller,
    Api,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Lane {
    pub name: String,
    pub kind: LaneKind,
}

/// A stretch of time on one lane: a leader term, the Lease held, the host down, frozen
/// or cut off from another.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Span {
    pub lane: String,
    /// `leader`, `lease`, `down`, `frozen` or `cut`.
    pub kind: &'static str,
    pub from_ms: u64,
    pub to_ms: u64,
    pub label: String,
}

/// A fault of the scenario, from when it struck to when it healed, over the lanes it hit.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FaultSpan {
    pub name: String,
    pub from_ms: u64,
    pub to_ms: u64,
    pub lanes: Vec<String>,
}

/// One controller call: as the operator saw it (on its lane, from sent to ended) or as a
/// replica answered it (on the replica's lane, at the answer).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CallMark {
    pub lane: String,
    pub from_ms: u64,
    pub to_ms: u64,
    pub method: String,
    /// `answered`, `refused`, `transport`, `abandoned` or `fenced`.
    pub outcome: String,
    pub detail: String,
}

/// A SpurJob's life as the samples saw it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct JobLife {
    pub name: String,
    pub created_ms: u64,
    pub submitted_ms: Option<u64>,
    pub job_id: Option<u32>,
    /// Each state `status.state` took, from when.
    pub states: Vec<(u64, String)>,
    pub gone_ms: Option<u64>,
}

/// A deadline as the checks judged it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DeadlineMark {
    pub check: String,
    pub object: String,
    pub from_ms: u64,
    pub due_ms: u64,
    pub end_ms: u64,
    pub met: bool,
    /// The violation, for a missed one.
    pub violation: Option<String>,
}

/// A violation, placed on its object's row.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ViolationMark {
    pub check: String,
    pub object: String,
    pub at_ms: u64,
    pub text: String,
}

/// Everything one picture of a run shows.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Timeline {
    pub title: String,
    /// The command that runs it again.
    pub replay: String,
    /// What the picture does not show, when something is missing (the lab's calls).
    pub note: String,
    pub end_ms: u64,
    pub lanes: Vec<Lane>,
    pub spans: Vec<Span>,
    pub faults: Vec<FaultSpan>,
    pub calls: Vec<CallMark>,
    pub jobs: Vec<JobLife>,
    pub deadlines: Vec<DeadlineMark>,
    pub violations: Vec<ViolationMark>,
}

/// The lanes of a run: the operator replicas, the controller replicas, the API server.
pub fn lanes(operators: &[&str], replicas: impl IntoIterator<Item = String>) -> Vec<Lane> {
    let operators = operators.iter().map(|o| Lane {
        name: (*o).to_owned(),
        kind: LaneKind::Operator,
    });
    let replicas = replicas.into_iter().map(|name| Lane {
        name,
        kind: LaneKind::Controller,
    });
    let api = Lane {
        name: crate::hosts::KUBE_API_HOST.to_owned(),
        kind: LaneKind::Api,
    };
    operators.chain(replicas).chain([api]).collect()
}

/// What the checks' samples show over time: leader terms, the Lease's holder, SpurJobs.
#[derive(Debug, Default)]
pub struct Recorder {
    leader: Option<(String, Duration)>,
    holder: Option<(String, Duration)>,
    terms: Vec<Span>,
    jobs: BTreeMap<String, JobLife>,
}

impl Recorder {
    /// One sample, as the checks saw it at `now`.
    pub fn observe(&mut self, seen: &Observation, now: Duration) {
        Self::follow(
            &mut self.leader,
            &mut self.terms,
            seen.leader.as_deref(),
            now,
            "leader",
        );
        Self::follow(
            &mut self.holder,
            &mut self.terms,
            seen.holder.as_deref(),
            now,
            "lease",
        );
        for (name, view) in &seen.spurjobs {
            let life = self.jobs.entry(name.clone()).or_insert_with(|| JobLife {
                name: name.clone(),
                created_ms: ms(now),
                ..JobLife::default()
            });
            if life.job_id.is_none()
                && let Some(id) = view.spur_job_id
            {
                life.job_id = Some(id);
                life.submitted_ms = Some(ms(now));
            }
            if life.states.last().is_none_or(|(_, s)| *s != view.state) {
                life.states.push((ms(now), view.state.clone()));
            }
        }
        for (name, life) in &mut self.jobs {
            if life.gone_ms.is_none() && !seen.spurjobs.contains_key(name) {
                life.gone_ms = Some(ms(now));
            }
        }
    }

    /// Opens and closes the spans of whoever `now_holding` names (a leader, the Lease).
    fn follow(
        current: &mut Option<(String, Duration)>,
        spans: &mut Vec<Span>,
        now_holding: Option<&str>,
        now: Duration,
        kind: &'static str,
    ) {
        if current.as_ref().map(|(h, _)| h.as_str()) == now_holding {
            return;
        }
        if let Some((host, since)) = current.take() {
            spans.push(Span {
                lane: host,
                kind,
                from_ms: ms(since),
                to_ms: ms(now),
                label: kind.to_owned(),
            });
        }
        *current = now_holding.map(|h| (h.to_owned(), now));
    }

    /// The terms and jobs seen, the open ones closed at `end`.
    pub fn finish(mut self, end: Duration) -> (Vec<Span>, Vec<JobLife>) {
        Self::follow(&mut self.leader, &mut self.terms, None, end, "leader");
        Self::follow(&mut self.holder, &mut self.terms, None, end, "lease");
        (self.terms, self.jobs.into_values().collect())
    }
}

/// The deadlines the checks judged, each missed one with the violation it raised, and the
/// violations that were no deadline's (placed by themselves).
pub fn deadlines(
    brackets: &[Bracket],
    violations: &[Violation],
) -> (Vec<DeadlineMark>, Vec<ViolationMark>) {
    let marks = brackets
        .iter()
        .map(|b| DeadlineMark {
            check: b.check.to_owned(),
            object: b.object.clone(),
            from_ms: ms(b.from),
            due_ms: ms(b.due),
            end_ms: ms(b.end),
            met: b.met,
            violation: (!b.met)
                .then(|| {
                    violations
                        .iter()
                        .find(|v| v.check == b.check && v.object == b.object && v.at == b.end)
                        .map(ToString::to_string)
                })
                .flatten(),
        })
        .collect();
    let alone = violations
        .iter()
        .map(|v| ViolationMark {
            check: v.check.to_owned(),
            object: v.object.clone(),
            at_ms: ms(v.at),
            text: v.to_string(),
        })
        .collect();
    (marks, alone)
}

/// The spans the harness's trace lines tell (hosts killed, stopped, frozen, cut off) and
/// the calls each replica answered, up to `end`.
pub fn from_trace(events: &[TraceEvent], end: Duration) -> (Vec<Span>, Vec<CallMark>) {
    let mut spans = OpenSpans::default();
    let mut calls = Vec::new();
    for event in events {
        let at = ms(event.at);
        let text = event.event.as_str();
        if event.host == "harness" {
            spans.harness_line(text, at);
        } else if event.host.starts_with("spurctld") {
            if text == "replica started" {
                spans.close(&event.host, "down", "", at);
            } else if let Some(call) = answered_call(&event.host, text, at) {
                calls.push(call);
            }
        }
    }
    let mut spans = spans.close_all(ms(end));
    spans.sort_by(|a, b| (a.from_ms, &a.lane).cmp(&(b.from_ms, &b.lane)));
    (spans, calls)
}

/// The spans a trace has told so far: the closed ones, and the open ones by (lane, kind,
/// the other end of a cut) with when they opened.
#[derive(Default)]
struct OpenSpans {
    open: BTreeMap<(String, &'static str, String), u64>,
    closed: Vec<Span>,
}

impl OpenSpans {
    /// Opens a span, unless one of the same lane, kind and other end is open.
    fn open(&mut self, lane: &str, kind: &'static str, other: &str, at: u64) {
        self.open
            .entry((lane.to_owned(), kind, other.to_owned()))
            .or_insert(at);
    }

    /// Closes the open span of that lane, kind and other end at `at`, if there is one.
    fn close(&mut self, lane: &str, kind: &'static str, other: &str, at: u64) {
        self.close_key((lane.to_owned(), kind, other.to_owned()), at);
    }

    fn close_key(&mut self, key: (String, &'static str, String), at: u64) {
        let Some(from) = self.open.remove(&key) else {
            return;
        };
        let label = match key.1 {
            "cut" => format!("cut off from {}", key.2),
            kind => kind.to_owned(),
        };
        self.closed.push(Span {
            lane: key.0,
            kind: key.1,
            from_ms: from,
            to_ms: at,
            label,
        });
    }

    /// One of the harness's lines: `kill`/`stop`/`restart` a host, `freeze`/`thaw` it,
    /// `partition`/`repair` two (`a | b`, a span on each lane).
    fn harness_line(&mut self, text: &str, at: u64) {
        let (verb, rest) = text.split_once(' ').unwrap_or((text, ""));
        match verb {
            "kill" | "stop" => {
                let host = rest.split_whitespace().next().unwrap_or(rest);
                self.open(host, "down", "", at);
            }
            "restart" => self.close(rest, "down", "", at),
            "freeze" => self.open(rest, "frozen", "", at),
            "thaw" => self.close(rest, "frozen", "", at),
            "partition" | "repair" => {
                let Some((a, b)) = rest.split_once(" | ") else {
                    return;
                };
                for (this, other) in [(a, b), (b, a)] {
                    if verb == "partition" {
                        self.open(this, "cut", other, at);
                    } else {
                        self.close(this, "cut", other, at);
                    }
                }
            }
            _ => {}
        }
    }

    /// Every span, those still open closed at `end`.
    fn close_all(mut self, end: u64) -> Vec<Span> {
        let still_open: Vec<_> = self.open.keys().cloned().collect();
        for key in still_open {
            self.close_key(key, end);
        }
        self.closed
    }
}

/// The call a replica's trace line answered: `Method -> ok …` or `Method -> Code
/// message`; `None` for its other lines (forwards, commits).
fn answered_call(host: &str, text: &str, at: u64) -> Option<CallMark> {
    let (method, answer) = text.split_once(" -> ")?;
    if method.contains(' ') {
        return None;
    }
    let outcome = if answer.starts_with("ok") {
        "answered"
    } else {
        "refused"
    };
    Some(CallMark {
        lane: host.to_owned(),
        from_ms: at,
        to_ms: at,
        method: method.to_owned(),
        outcome: outcome.to_owned(),
        // Already cut to a readable length where the replica traced it.
        detail: answer.to_owned(),
    })
}

/// The hosts `events` name at `at` in the harness's lines: the lanes a fault struck.
pub fn struck_at(events: &[TraceEvent], at: Duration) -> Vec<String> {
    let mut hosts = Vec::new();
    for event in events.iter().filter(|e| e.host == "harness" && e.at == at) {
        let Some((verb, rest)) = event.event.split_once(' ') else {
            continue;
        };
        let named: Vec<&str> = match verb {
            "kill" | "stop" => rest.split_whitespace().take(1).collect(),
            "restart" | "freeze" => vec![rest],
            "partition" => rest.split(" | ").collect(),
            _ => Vec::new(),
        };
        for host in named {
            if !hosts.iter().any(|h| h == host) {
                hosts.push(host.to_owned());
            }
        }
    }
    hosts
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::SpurJobView;

    fn event(at_ms: u64, host: &str, text: &str) -> TraceEvent {
        TraceEvent {
            at: Duration::from_millis(at_ms),
            host: host.to_owned(),
            event: text.to_owned(),
        }
    }

    #[test]
    fn the_trace_gives_kills_freezes_cuts_and_each_answer() {
        let events = [
            event(1000, "harness", "kill spurctld-0 (Silent)"),
            event(1000, "harness", "partition operator | spurctld-1"),
            event(1500, "spurctld-1", "Ping -> ok PingResponse { … }"),
            event(
                1600,
                "spurctld-2",
                "SubmitJob -> Unavailable not the Raft leader",
            ),
            event(1700, "spurctld-2", "GetJobs (forwarded) -> ok …"),
            event(2000, "harness", "freeze spurctld-2"),
            event(3000, "harness", "repair operator | spurctld-1"),
            event(4000, "spurctld-0", "replica started"),
        ];
        let (spans, calls) = from_trace(&events, Duration::from_secs(9));
        let got: Vec<(&str, &str, u64, u64)> = spans
            .iter()
            .map(|s| (s.lane.as_str(), s.kind, s.from_ms, s.to_ms))
            .collect();
        assert_eq!(
            got,
            [
                ("operator", "cut", 1000, 3000),
                ("spurctld-0", "down", 1000, 4000),
                ("spurctld-1", "cut", 1000, 3000),
                ("spurctld-2", "frozen", 2000, 9000),
            ]
        );
        let outcomes: Vec<(&str, &str)> = calls
            .iter()
            .map(|c| (c.method.as_str(), c.outcome.as_str()))
            .collect();
        assert_eq!(outcomes, [("Ping", "answered"), ("SubmitJob", "refused")]);
        assert_eq!(
            struck_at(&events, Duration::from_secs(1)),
            ["spurctld-0", "operator", "spurctld-1"]
        );
    }

    #[test]
    fn samples_give_terms_and_each_jobs_life() {
        let mut recorder = Recorder::default();
        let mut seen = Observation {
            leader: Some("spurctld-0".into()),
            holder: Some("operator".into()),
            ..Observation::default()
        };
        seen.spurjobs.insert(
            "job-a".into(),
            SpurJobView {
                uid: "u".into(),
                spur_job_id: None,
                state: String::new(),
            },
        );
        recorder.observe(&seen, Duration::from_secs(1));
        seen.leader = None;
        let job = seen.spurjobs.get_mut("job-a").expect("inserted");
        job.spur_job_id = Some(7);
        job.state = "Pending".into();
        recorder.observe(&seen, Duration::from_secs(2));
        seen.leader = Some("spurctld-1".into());
        seen.spurjobs.clear();
        recorder.observe(&seen, Duration::from_secs(3));
        let (terms, jobs) = recorder.finish(Duration::from_secs(5));
        let got: Vec<(&str, &str, u64, u64)> = terms
            .iter()
            .map(|s| (s.lane.as_str(), s.kind, s.from_ms, s.to_ms))
            .collect();
        assert_eq!(
            got,
            [
                ("spurctld-0", "leader", 1000, 2000),
                ("spurctld-1", "leader", 3000, 5000),
                ("operator", "lease", 1000, 5000),
            ]
        );
        assert_eq!(
            jobs,
            [JobLife {
                name: "job-a".into(),
                created_ms: 1000,
                submitted_ms: Some(2000),
                job_id: Some(7),
                states: vec![(1000, String::new()), (2000, "Pending".into())],
                gone_ms: Some(3000),
            }]
        );
    }
}
