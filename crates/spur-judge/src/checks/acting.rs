//! sim.md's safety check "at most one operator replica acts as leader at a time, per its
//! lease", judged from ground truth: the writes the API server applied, each with the host
//! its connection came from ([`spur_fakes::api_server::writes`]), against the Lease's holders as
//! the store applied them ([`crate::leases`]). Never from the replicas' `leading` flags
//! or their logs.
//!
//! What only a leader writes: everything an operator replica writes except Leases. A
//! standby's only writes are its campaign on the Lease (create, takeover, and its release
//! on shutdown; see `spur_operator::lease`); every other write comes from the leader's
//! tasks (SpurJob finalizers and status, Events, orphan and job pod deletes, pod-end
//! reports) or from the agent, which refuses LaunchJob and CancelJob unless this replica
//! holds the SpurJob store only a leader has. Writes to any Lease are left out, whatever
//! its name, so a replica campaigning on the wrong Lease is caught by what it then writes.
//!
//! A replica's identity in the Lease is its pod name, which is its host name in the
//! simulation (see `crate::operator::config_from_flags`).
//!
//! On the controller's side, every write call (RegisterAgent, Heartbeat, UpdateNode,
//! SubmitJob, CancelJob, ReportJobStatus) an operator replica makes is leader-only too:
//! a standby only Pings, for its readiness ([`spur_fakes::model::calls`]).
//!
//! Two rules:
//! - `acting-without-lease`: each leader-only write is applied while the Lease names its
//!   writer (the term in force just before the write's resourceVersion), and each write
//!   call reaches the controller while the Lease names its caller (the term in force at
//!   the simulated time the replica received it: calls have no resourceVersion);
//! - `acting-interleaved`: when the writer of leader-only writes changes from one replica
//!   to another, the Lease passed to the new writer between the old writer's last write
//!   and the new writer's first: two replicas' writes never interleave within one term.
//!
//! A message a cut held lands when the cut heals, as a kernel's retransmission delivers it
//! (`crate::records::Cut`), whoever holds the Lease by then: no sender can recall what it
//! sent, and neither spurctld nor the API server takes a fencing token. So a write that
//! lands outside its sender's term, just after a cut between the two hosts healed, is
//! judged by when it may have been sent: it passes if the Lease named its sender at some
//! instant of the cut (the operator's fence refuses a write from a replica the Lease does
//! not name when it is sent), and is counted in [`ActingCheck::landed_after_cut`].

use std::collections::BTreeSet;
use std::time::Duration;

use crate::leases::{LeaseHistory, Term};
use crate::records::CallRecord;
use crate::records::Cut;
use crate::records::WriteRecord;

use crate::checks::Violation;

/// The last leader-only write judged.
#[derive(Clone, Debug)]
struct Acted {
    host: String,
    rv: u64,
    at: Duration,
    what: String,
}

/// Judges operator replicas' writes as they are applied.
#[derive(Debug)]
pub struct ActingCheck {
    /// The Lease that elects the acting replica, `namespace/name`.
    lease: String,
    /// The operator replicas' hosts; writes from other hosts are not theirs to judge.
    replicas: BTreeSet<String>,
    last: Option<Acted>,
    /// Each rule flags a host once per Lease term (rv of the term, or 0 for none) and
    /// per server (API or controller), so one mistake does not bury the report under every
    /// write that followed it.
    flagged: BTreeSet<(&'static str, &'static str, String, u64)>,
    lost_flagged: bool,
    calls_lost_flagged: bool,
    /// Controller write calls judged, per host.
    pub calls_judged: std::collections::BTreeMap<String, usize>,
    /// Leader-only writes judged, per host (a check that judged nothing proves nothing).
    pub judged: std::collections::BTreeMap<String, usize>,
    /// Writes and write calls that landed outside their sender's term after a cut that held
    /// them healed, per host (see the module doc).
    pub landed_after_cut: std::collections::BTreeMap<String, usize>,
}

fn describe(w: &WriteRecord) -> String {
    format!(
        "{} {}{}",
        w.method.as_str(),
        w.object(),
        if w.status { " (status)" } else { "" }
    )
}

/// What the Lease said in `term`.
fn named(term: Option<&Term>) -> String {
    match term {
        Some(Term {
            holder: Some(h),
            at,
            ..
        }) => format!("the lease named {h} (since {:.1}s)", at.as_secs_f64()),
        Some(t) => format!("the lease named nobody (since {:.1}s)", t.at.as_secs_f64()),
        None => "the lease did not exist".to_owned(),
    }
}

/// A record that lost `lost` entries cannot be judged: a violation of its own, once.
fn incomplete(
    flagged: &mut bool,
    object: &str,
    what: &str,
    lost: u64,
    at: Duration,
) -> Option<Violation> {
    if lost == 0 || *flagged {
        return None;
    }
    *flagged = true;
    Some(Violation {
        check: "acting-record",
        object: object.into(),
        at,
        detail: format!("{lost} {what} were not recorded: cannot judge who acted"),
    })
}

fn is_lease(w: &WriteRecord) -> bool {
    w.kind == "Lease"
}

impl ActingCheck {
    pub fn new(lease: &str, replicas: &[&str]) -> ActingCheck {
        ActingCheck {
            lease: lease.to_owned(),
            replicas: replicas.iter().map(|r| (*r).to_owned()).collect(),
            last: None,
            flagged: BTreeSet::new(),
            lost_flagged: false,
            calls_lost_flagged: false,
            calls_judged: Default::default(),
            judged: Default::default(),
            landed_after_cut: Default::default(),
        }
    }

    /// Whether a message from `host` that reached `server` at `at` may have been held by a
    /// cut between them that healed just before, and sent while the Lease named `host`;
    /// counted when so.
    fn landed_after_cut(
        &mut self,
        cuts: &[Cut],
        leases: &LeaseHistory,
        (host, server, at): (&str, &str, Duration),
    ) -> bool {
        let held = cuts.iter().any(|cut| {
            let (Some(healed), Some(landed_by)) = (cut.healed, cut.landed_by) else {
                return false;
            };
            // On its way when the cut began: sent at most a landing's time before.
            let sent_from = cut.from.saturating_sub(landed_by - healed);
            cut.may_have_held(host, server, at)
                && leases.named_within(&self.lease, host, sent_from, healed)
        });
        if held {
            *self.landed_after_cut.entry(host.to_owned()).or_default() += 1;
        }
        held
    }

    /// Judges `writes` (in the order applied, as [`spur_fakes::api_server::ApiServer::take_writes`]
    /// gives them) against `leases`; `lost` counts writes the server could not record,
    /// which makes the record incomplete and is a violation of its own.
    pub fn judge(
        &mut self,
        writes: &[WriteRecord],
        leases: &LeaseHistory,
        lost: u64,
        cuts: &[Cut],
    ) -> Vec<Violation> {
        let at = writes.last().map_or(Duration::ZERO, |w| w.at);
        let mut violations: Vec<Violation> = incomplete(
            &mut self.lost_flagged,
            "kube-api/writes",
            "writes",
            lost,
            at,
        )
        .into_iter()
        .collect();
        for w in writes {
            let Some(host) = w.host.as_deref() else {
                continue;
            };
            if !self.replicas.contains(host) || is_lease(w) {
                continue;
            }
            self.judge_write(&mut violations, w, host, leases, cuts);
        }
        violations
    }

    /// Judges one leader-only write of replica `host` by both rules, then remembers it as
    /// the last write the next one is weighed against.
    fn judge_write(
        &mut self,
        violations: &mut Vec<Violation>,
        w: &WriteRecord,
        host: &str,
        leases: &LeaseHistory,
        cuts: &[Cut],
    ) {
        *self.judged.entry(host.to_owned()).or_default() += 1;
        let term = leases.term_before(&self.lease, w.rv);
        let holder = term.as_ref().and_then(|t| t.holder.as_deref());
        if holder != Some(host)
            && self.landed_after_cut(cuts, leases, (host, crate::hosts::KUBE_API_HOST, w.at))
        {
            return; // not an act of the term it landed in
        }
        let since = term.as_ref().map_or(0, |t| t.rv);
        if holder != Some(host) {
            let named = named(term.as_ref());
            self.flag(
                violations,
                ("acting-without-lease", "kube-api"),
                host,
                since,
                w,
                format!("{host} applied {} while {named}", describe(w)),
            );
        }
        self.check_interleaved(violations, w, host, since, leases);
        self.last = Some(Acted {
            host: host.to_owned(),
            rv: w.rv,
            at: w.at,
            what: describe(w),
        });
    }

    /// `acting-interleaved`: a write of `host` after another replica's last one needs the
    /// Lease to have passed to `host` between them (`since`: the rv of the term it landed in).
    fn check_interleaved(
        &mut self,
        violations: &mut Vec<Violation>,
        w: &WriteRecord,
        host: &str,
        since: u64,
        leases: &LeaseHistory,
    ) {
        let Some(prev) = &self.last else {
            return;
        };
        if prev.host == host || leases.acquired_between(&self.lease, host, prev.rv, w.rv) {
            return;
        }
        let detail = format!(
            "{host} applied {} at {:.1}s after {} applied {} at {:.1}s, and the lease did not pass to {host} between",
            describe(w),
            w.at.as_secs_f64(),
            prev.host,
            prev.what,
            prev.at.as_secs_f64()
        );
        self.flag(
            violations,
            ("acting-interleaved", "kube-api"),
            host,
            since,
            w,
            detail,
        );
    }

    /// Judges the controller write calls `calls` (in the order received) against
    /// `leases`; `lost` counts calls the controller could not record.
    pub fn judge_calls(
        &mut self,
        calls: &[CallRecord],
        leases: &LeaseHistory,
        lost: u64,
        cuts: &[Cut],
    ) -> Vec<Violation> {
        let at = calls.last().map_or(Duration::ZERO, |c| c.at);
        let mut violations: Vec<Violation> = incomplete(
            &mut self.calls_lost_flagged,
            "spurctld/calls",
            "calls",
            lost,
            at,
        )
        .into_iter()
        .collect();
        for call in calls {
            if !self.replicas.contains(&call.caller) {
                continue;
            }
            *self.calls_judged.entry(call.caller.clone()).or_default() += 1;
            let term = leases.term_at(&self.lease, call.at);
            if term.as_ref().and_then(|t| t.holder.as_deref()) == Some(call.caller.as_str())
                || self.landed_after_cut(cuts, leases, (&call.caller, &call.replica, call.at))
            {
                continue;
            }
            let detail = format!(
                "{} called {} on {} at {:.1}s while {}",
                call.caller,
                call.method,
                call.replica,
                call.at.as_secs_f64(),
                named(term.as_ref())
            );
            let (host, at) = (call.caller.clone(), call.at);
            let key = (
                "acting-without-lease",
                "spurctld",
                host.clone(),
                term.map_or(0, |t| t.rv),
            );
            if self.flagged.insert(key) {
                violations.push(Violation {
                    check: "acting-without-lease",
                    object: format!("operator/{host}"),
                    at,
                    detail,
                });
            }
        }
        violations
    }

    fn flag(
        &mut self,
        out: &mut Vec<Violation>,
        (check, server): (&'static str, &'static str),
        host: &str,
        term: u64,
        w: &WriteRecord,
        detail: String,
    ) {
        if self.flagged.insert((check, server, host.to_owned(), term)) {
            out.push(Violation {
                check,
                object: format!("operator/{host}"),
                at: w.at,
                detail,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::WriteMethod;

    const LEASE: &str = "spur-system/spur-operator";

    fn write(rv: u64, host: &str, kind: &str) -> WriteRecord {
        WriteRecord {
            rv,
            at: Duration::from_secs(rv),
            host: Some(host.into()),
            method: WriteMethod::Patch,
            kind: kind.into(),
            namespace: Some("default".into()),
            name: format!("obj-{rv}"),
            status: false,
            holder: None,
        }
    }

    fn history(terms: &[(u64, Option<&str>)]) -> LeaseHistory {
        let h = LeaseHistory::default();
        for (rv, holder) in terms {
            h.record(
                LEASE,
                *rv,
                Duration::from_secs(*rv),
                holder.map(str::to_owned),
            );
        }
        h
    }

    fn checks(v: &[Violation]) -> Vec<&'static str> {
        v.iter().map(|v| v.check).collect()
    }

    #[test]
    fn a_takeover_by_the_lease_passes() {
        let leases = history(&[(1, Some("a")), (10, None), (12, Some("b")), (20, Some("a"))]);
        let mut check = ActingCheck::new(LEASE, &["a", "b"]);
        let writes = [
            write(2, "a", "SpurJob"),
            write(5, "a", "Pod"),
            // b's campaign is not acting.
            write(8, "b", "Lease"),
            write(13, "b", "Pod"),
            write(21, "a", "Event"),
            // Not a replica: not judged.
            write(22, "kubectl", "Pod"),
        ];
        assert!(check.judge(&writes, &leases, 0, &[]).is_empty());
        assert_eq!(check.judged["a"], 3);
        assert_eq!(check.judged["b"], 1);
    }

    #[test]
    fn a_write_while_the_lease_names_another_is_flagged() {
        let leases = history(&[(1, Some("a")), (12, Some("b"))]);
        let mut check = ActingCheck::new(LEASE, &["a", "b"]);
        let v = check.judge(
            &[write(2, "a", "Pod"), write(13, "a", "Pod")],
            &leases,
            0,
            &[],
        );
        assert_eq!(checks(&v), ["acting-without-lease"]);
        assert!(
            v[0].detail.contains("a applied patch Pod default/obj-13"),
            "{}",
            v[0].detail
        );
        assert!(v[0].detail.contains("the lease named b"), "{}", v[0].detail);
        assert_eq!(v[0].at, Duration::from_secs(13));
        // Before the lease exists, nobody acts.
        let mut check = ActingCheck::new(LEASE, &["a"]);
        let v = check.judge(&[write(1, "a", "Pod")], &history(&[(5, Some("a"))]), 0, &[]);
        assert!(v[0].detail.contains("did not exist"), "{}", v[0].detail);
    }

    #[test]
    fn two_replicas_on_different_leases_interleave() {
        // a holds the lease the check watches; b campaigns on a lease of its own, so
        // each believes it leads.
        let leases = history(&[(1, Some("a"))]);
        let mut check = ActingCheck::new(LEASE, &["a", "b"]);
        let v = check.judge(
            &[
                write(2, "a", "Pod"),
                write(3, "b", "Lease"),
                write(4, "b", "Pod"),
                write(5, "a", "Pod"),
                write(6, "b", "Pod"),
            ],
            &leases,
            0,
            &[],
        );
        assert_eq!(
            checks(&v),
            [
                "acting-without-lease",
                "acting-interleaved",
                "acting-interleaved"
            ]
        );
        assert!(
            v[1].detail
                .contains("after a applied patch Pod default/obj-2"),
            "{}",
            v[1].detail
        );
    }

    #[test]
    fn a_controller_call_while_the_lease_names_another_is_flagged() {
        let leases = history(&[(1, Some("a")), (12, Some("b"))]);
        let call = |secs, caller: &str| CallRecord {
            at: Duration::from_secs(secs),
            caller: caller.into(),
            replica: "spurctld-0".into(),
            method: "SubmitJob",
        };
        let mut check = ActingCheck::new(LEASE, &["a", "b"]);
        let calls = [
            call(2, "a"),
            call(12, "b"),
            call(13, "a"),
            call(14, "a"),
            call(15, "x"),
        ];
        let v = check.judge_calls(&calls, &leases, 0, &[]);
        assert_eq!(checks(&v), ["acting-without-lease"]);
        assert!(
            v[0].detail
                .contains("a called SubmitJob on spurctld-0 at 13.0s while the lease named b"),
            "{}",
            v[0].detail
        );
        assert_eq!(check.calls_judged["a"], 3);
    }

    #[test]
    fn a_call_a_cut_held_is_judged_by_when_it_may_have_been_sent() {
        // a leads until 12 s, b from 12 s; a cut between a and spurctld-0 from 10 s to
        // 20 s holds what a sent, and it lands at the heal (seed 941 after partitions
        // began to hold).
        let leases = history(&[(1, Some("a")), (12, Some("b"))]);
        let cut = |from, healed| Cut {
            hosts: ("a".into(), "spurctld-0".into()),
            from: Duration::from_secs(from),
            healed: Some(Duration::from_secs(healed)),
            landed_by: Some(Duration::from_secs(healed) + Duration::from_millis(20)),
        };
        let at = |secs: f64, replica: &str| CallRecord {
            at: Duration::from_secs_f64(secs),
            caller: "a".into(),
            replica: replica.into(),
            method: "ReportJobStatus",
        };
        let mut check = ActingCheck::new(LEASE, &["a", "b"]);
        let v = check.judge_calls(&[at(20.01, "spurctld-0")], &leases, 0, &[cut(10, 20)]);
        assert!(v.is_empty(), "{v:?}");
        assert_eq!(check.landed_after_cut["a"], 1);
        for (call, cuts, why) in [
            (
                at(20.5, "spurctld-0"),
                [cut(10, 20)],
                "landed after what the cut held",
            ),
            (
                at(20.01, "spurctld-1"),
                [cut(10, 20)],
                "another replica: not held",
            ),
            (
                at(30.01, "spurctld-0"),
                [cut(13, 30)],
                "a never held the Lease while cut",
            ),
        ] {
            let mut check = ActingCheck::new(LEASE, &["a", "b"]);
            let v = check.judge_calls(&[call], &leases, 0, &cuts);
            assert_eq!(checks(&v), ["acting-without-lease"], "{why}");
            assert!(check.landed_after_cut.is_empty(), "{why}");
        }
    }

    #[test]
    fn a_lost_record_is_a_violation() {
        let mut check = ActingCheck::new(LEASE, &["a"]);
        let v = check.judge(&[], &history(&[]), 2, &[]);
        assert_eq!(checks(&v), ["acting-record"]);
        assert!(
            check.judge(&[], &history(&[]), 2, &[]).is_empty(),
            "flagged once"
        );
    }
}
