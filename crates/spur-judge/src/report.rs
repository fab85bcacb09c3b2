//! Scenario results as the JSON lines of docs/specs.md ("The simulation"), their summary
//! and table, and `spur-sim merge`, which joins the lines of sweep shards run on different
//! machines into one summary exactly as if one process had run every seed.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::outcome::{LagStats, Outcome};
use crate::service::ServiceSetup;

/// One scenario's line: the fields docs/specs.md names, plus every lag it measured
/// (`lags_ms`), so that percentiles over many shards can be computed exactly rather than
/// averaged.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScenarioRecord {
    pub seed: u64,
    pub profile: String,
    pub passed: bool,
    pub violations: Vec<String>,
    pub trace_hash: String,
    pub sim_secs: f64,
    pub wall_ms: u64,
    pub faults: Vec<String>,
    /// The `spurctld` Service it ran behind (`headless`, `clusterip/drop`, ...); empty in
    /// the lines of builds that always ran one.
    #[serde(default)]
    pub service: String,
    pub metrics: RecordMetrics,
    pub lags_ms: Lags,
    pub replay: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RecordMetrics {
    pub registration_lag_ms: LagSummary,
    pub submission_lag_ms: LagSummary,
    pub status_lag_ms: LagSummary,
    /// Beyond the first, the controller jobs of one SpurJob that ran or may still run.
    pub duplicates: usize,
    /// Second controller jobs of SpurJobs that ended without running (the operator
    /// stopped them: `duplicate-submission`'s doc).
    #[serde(default)]
    pub duplicates_stopped: usize,
    /// Calls the operator made to the controller replicas (a forward is not a second call;
    /// the readiness probe's Pings are calls).
    pub rpcs: usize,
    /// Leader-only writes the API server applied from each operator replica (the acting
    /// check judged them all): a replica that never wrote never acted.
    #[serde(default)]
    pub acting_writes: BTreeMap<String, usize>,
    /// Per operator replica, its writes a healed cut delivered after its Lease had moved on
    /// (judged by when they may have been sent).
    #[serde(default)]
    pub landed_after_cut: BTreeMap<String, usize>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LagSummary {
    pub count: usize,
    pub p50: u64,
    pub p99: u64,
    pub max: u64,
}

impl From<LagStats> for LagSummary {
    fn from(s: LagStats) -> LagSummary {
        LagSummary {
            count: s.count,
            p50: s.p50,
            p99: s.p99,
            max: s.max,
        }
    }
}

/// Every lag one scenario measured, in milliseconds.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Lags {
    pub registration: Vec<u64>,
    pub submission: Vec<u64>,
    pub status: Vec<u64>,
    /// From a new leader's election to the id of each SpurJob waiting then.
    #[serde(default)]
    pub failover_submission: Vec<u64>,
}

impl From<&Outcome> for ScenarioRecord {
    fn from(o: &Outcome) -> ScenarioRecord {
        let lag = |v: &[u64]| LagSummary::from(LagStats::of(v));
        ScenarioRecord {
            seed: o.seed,
            profile: o.profile.name().to_owned(),
            passed: o.passed(),
            violations: o.violations.iter().map(ToString::to_string).collect(),
            trace_hash: o.trace_hash.clone(),
            sim_secs: (o.sim_secs * 10.0).round() / 10.0,
            wall_ms: u64::try_from(o.wall_ms).unwrap_or(u64::MAX),
            faults: o.faults.clone(),
            service: o.service.map(ServiceSetup::name).unwrap_or_default(),
            metrics: RecordMetrics {
                registration_lag_ms: lag(&o.registration_lags),
                submission_lag_ms: lag(&o.submission_lags),
                status_lag_ms: lag(&o.status_lags),
                duplicates: o.duplicates,
                duplicates_stopped: o.duplicates_stopped,
                rpcs: o.rpcs,
                acting_writes: o.acting_writes.clone(),
                landed_after_cut: o.landed_after_cut.clone(),
            },
            lags_ms: Lags {
                registration: o.registration_lags.clone(),
                submission: o.submission_lags.clone(),
                status: o.status_lags.clone(),
                failover_submission: o.failover_submission_lags.clone(),
            },
            replay: o.replay_command(),
        }
    }
}

impl ScenarioRecord {
    /// The record as one JSON line, fields in docs/specs.md's order.
    pub fn to_line(&self) -> String {
        serde_json::to_string(self).expect("a record serializes")
    }
}

/// What many scenarios of one profile came to.
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    pub profile: String,
    pub scenarios: usize,
    pub passed: usize,
    /// Seed and replay command of each failed scenario, in seed order.
    pub failed: Vec<(u64, String)>,
    pub registration: LagStats,
    pub submission: LagStats,
    pub status: LagStats,
    pub failover_submission: LagStats,
    pub duplicates: usize,
    pub duplicates_stopped: usize,
    pub rpcs_per_sim_minute: f64,
    /// The same scenarios by the Service they ran behind, in name order.
    pub by_service: Vec<ServiceSummary>,
}

/// What the scenarios behind one Service setup came to.
#[derive(Clone, Debug, PartialEq)]
pub struct ServiceSummary {
    /// [`crate::service::ServiceSetup::name`].
    pub service: String,
    pub scenarios: usize,
    pub passed: usize,
    pub registration: LagStats,
    pub submission: LagStats,
    pub failover_submission: LagStats,
    pub status: LagStats,
}

/// One lag over every record, every value of it (exact percentiles, not an average).
fn lag_over(records: &[&ScenarioRecord], lags: fn(&ScenarioRecord) -> &[u64]) -> LagStats {
    let values: Vec<u64> = records
        .iter()
        .flat_map(|r| lags(r).iter().copied())
        .collect();
    LagStats::of(&values)
}

impl ServiceSummary {
    /// One summary a Service setup the records name (records that name none are left out).
    fn of_each(records: &[ScenarioRecord]) -> Vec<ServiceSummary> {
        let mut by: BTreeMap<&str, Vec<&ScenarioRecord>> = BTreeMap::new();
        for r in records.iter().filter(|r| !r.service.is_empty()) {
            by.entry(&r.service).or_default().push(r);
        }
        by.into_iter()
            .map(|(service, records)| ServiceSummary {
                service: service.to_owned(),
                scenarios: records.len(),
                passed: records.iter().filter(|r| r.passed).count(),
                registration: lag_over(&records, |r| &r.lags_ms.registration),
                submission: lag_over(&records, |r| &r.lags_ms.submission),
                failover_submission: lag_over(&records, |r| &r.lags_ms.failover_submission),
                status: lag_over(&records, |r| &r.lags_ms.status),
            })
            .collect()
    }
}

impl Summary {
    pub fn of(profile: &str, records: &[ScenarioRecord]) -> Summary {
        let every: Vec<&ScenarioRecord> = records.iter().collect();
        let all = |lags: fn(&ScenarioRecord) -> &[u64]| lag_over(&every, lags);
        let mut failed: Vec<(u64, String)> = records
            .iter()
            .filter(|r| !r.passed)
            .map(|r| (r.seed, r.replay.clone()))
            .collect();
        failed.sort();
        let rpcs: usize = records.iter().map(|r| r.metrics.rpcs).sum();
        let minutes: f64 = records.iter().map(|r| r.sim_secs).sum::<f64>() / 60.0;
        Summary {
            profile: profile.to_owned(),
            scenarios: records.len(),
            passed: records.iter().filter(|r| r.passed).count(),
            failed,
            registration: all(|r| &r.lags_ms.registration),
            submission: all(|r| &r.lags_ms.submission),
            status: all(|r| &r.lags_ms.status),
            failover_submission: all(|r| &r.lags_ms.failover_submission),
            duplicates: records.iter().map(|r| r.metrics.duplicates).sum(),
            duplicates_stopped: records.iter().map(|r| r.metrics.duplicates_stopped).sum(),
            rpcs_per_sim_minute: if minutes > 0.0 {
                (rpcs as f64 / minutes * 10.0).round() / 10.0
            } else {
                0.0
            },
            by_service: ServiceSummary::of_each(records),
        }
    }

    pub fn to_json(&self, wall_ms: Option<u128>) -> Value {
        let lag =
            |s: &LagStats| json!({"count": s.count, "p50": s.p50, "p99": s.p99, "max": s.max});
        let mut summary = json!({
            "profile": self.profile,
            "scenarios": self.scenarios,
            "passed": self.passed,
            "failed": self.failed.iter().map(|(seed, replay)| json!({"seed": seed, "replay": replay})).collect::<Vec<_>>(),
            "registration_lag_ms": lag(&self.registration),
            "submission_lag_ms": lag(&self.submission),
            "status_lag_ms": lag(&self.status),
            "failover_submission_lag_ms": lag(&self.failover_submission),
            "duplicates": self.duplicates,
            "duplicates_stopped": self.duplicates_stopped,
            "rpcs_per_sim_minute": self.rpcs_per_sim_minute,
        });
        let by_service: serde_json::Map<String, Value> = self
            .by_service
            .iter()
            .map(|s| {
                let figures = json!({
                    "scenarios": s.scenarios,
                    "passed": s.passed,
                    "registration_lag_ms": lag(&s.registration),
                    "submission_lag_ms": lag(&s.submission),
                    "failover_submission_lag_ms": lag(&s.failover_submission),
                    "status_lag_ms": lag(&s.status),
                });
                (s.service.clone(), figures)
            })
            .collect();
        summary["by_service"] = Value::Object(by_service);
        if let Some(wall_ms) = wall_ms {
            summary["wall_ms"] = json!(wall_ms);
        }
        json!({ "summary": summary })
    }
}

/// The table a person reads: one row a profile, and under it one row for each Service
/// setup its scenarios ran behind (pass count and lags; duplicates and calls are the
/// profile's).
pub struct Table<'a>(pub &'a [Summary]);

/// A row's label under its profile: the Service setup, indented.
fn service_label(service: &ServiceSummary) -> String {
    format!("  {}", service.service)
}

fn secs(s: &LagStats) -> String {
    format!(
        "{:.1}/{:.1}/{:.1}s",
        s.p50 as f64 / 1000.0,
        s.p99 as f64 / 1000.0,
        s.max as f64 / 1000.0
    )
}

impl fmt::Display for Table<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let width = self
            .0
            .iter()
            .flat_map(|s| {
                std::iter::once(s.profile.len())
                    .chain(s.by_service.iter().map(|k| service_label(k).len()))
            })
            .fold(10, usize::max);
        writeln!(
            f,
            "{:<width$} {:>9} {:>24} {:>22} {:>26} {:>18} {:>5} {:>9}",
            "profile",
            "passed",
            "registration p50/p99/max",
            "submission p50/p99/max",
            "after election p50/p99/max",
            "status p50/p99/max",
            "dups",
            "rpcs/min"
        )?;
        for s in self.0 {
            writeln!(
                f,
                "{:<width$} {:>9} {:>24} {:>22} {:>26} {:>18} {:>5} {:>9.1}",
                s.profile,
                format!("{}/{}", s.passed, s.scenarios),
                secs(&s.registration),
                secs(&s.submission),
                secs(&s.failover_submission),
                secs(&s.status),
                s.duplicates,
                s.rpcs_per_sim_minute,
            )?;
            for k in &s.by_service {
                writeln!(
                    f,
                    "{:<width$} {:>9} {:>24} {:>22} {:>26} {:>18}",
                    service_label(k),
                    format!("{}/{}", k.passed, k.scenarios),
                    secs(&k.registration),
                    secs(&k.submission),
                    secs(&k.failover_submission),
                    secs(&k.status),
                )?;
            }
        }
        Ok(())
    }
}

/// Why shards could not be merged.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum MergeError {
    #[error("{source_name}:{line}: not a scenario line of `spur-sim run --json`: {reason}")]
    Malformed {
        source_name: String,
        line: usize,
        reason: String,
    },
    #[error(
        "seed {seed} ({profile}) appears twice with different results ({first} and {second}): shards of different builds or settings"
    )]
    Conflict {
        seed: u64,
        profile: String,
        first: String,
        second: String,
    },
    #[error(
        "{missing} of the expected seeds have no result (the first: {first:?}); a shard is missing or incomplete"
    )]
    Missing { missing: usize, first: Vec<u64> },
    #[error("no scenario lines in the input")]
    Empty,
}

/// Scenario lines joined across shards: by profile, then seed.
#[derive(Debug, Default)]
pub struct Merged {
    by_profile: BTreeMap<String, BTreeMap<u64, (ScenarioRecord, String)>>,
}

impl Merged {
    /// Adds the lines of one shard's output. Summary lines are skipped (they are
    /// recomputed); a seed seen before with the same trace hash (a retried pod) is kept
    /// once; with another hash it is a conflict.
    pub fn add(&mut self, source_name: &str, text: &str) -> Result<(), MergeError> {
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            let malformed = |reason: String| MergeError::Malformed {
                source_name: source_name.to_owned(),
                line: i + 1,
                reason,
            };
            let value: Value = serde_json::from_str(line).map_err(|e| malformed(e.to_string()))?;
            if value.get("summary").is_some() {
                continue;
            }
            let record: ScenarioRecord =
                serde_json::from_value(value).map_err(|e| malformed(e.to_string()))?;
            let here = format!("{source_name}:{}", i + 1);
            let seeds = self.by_profile.entry(record.profile.clone()).or_default();
            match seeds.get(&record.seed) {
                Some((seen, _)) if seen.trace_hash == record.trace_hash => {}
                Some((_, there)) => {
                    return Err(MergeError::Conflict {
                        seed: record.seed,
                        profile: record.profile,
                        first: there.clone(),
                        second: here,
                    });
                }
                None => {
                    seeds.insert(record.seed, (record, here));
                }
            }
        }
        Ok(())
    }

    /// Fails when any profile lacks a seed of `expected`.
    pub fn check_complete(&self, expected: std::ops::Range<u64>) -> Result<(), MergeError> {
        if self.by_profile.is_empty() {
            return Err(MergeError::Empty);
        }
        let mut missing = Vec::new();
        for seeds in self.by_profile.values() {
            missing.extend(expected.clone().filter(|s| !seeds.contains_key(s)));
        }
        missing.sort_unstable();
        missing.dedup();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(MergeError::Missing {
                missing: missing.len(),
                first: missing.into_iter().take(5).collect(),
            })
        }
    }

    /// One summary a profile, in name order.
    pub fn summaries(&self) -> Result<Vec<Summary>, MergeError> {
        if self.by_profile.is_empty() {
            return Err(MergeError::Empty);
        }
        Ok(self
            .by_profile
            .iter()
            .map(|(profile, seeds)| {
                let records: Vec<ScenarioRecord> = seeds.values().map(|(r, _)| r.clone()).collect();
                Summary::of(profile, &records)
            })
            .collect())
    }
}

/// The lag metrics a picture of lags shows, with their deadlines, and each one's samples
/// from `records`.
pub fn lag_panels() -> [crate::plot::Panel<'static>; 4] {
    use crate::plot::Panel;
    let d = crate::checks::Deadlines::default();
    [
        Panel {
            title: "registration",
            deadline: Some(d.registration),
        },
        Panel {
            title: "submission",
            deadline: Some(d.submission),
        },
        Panel {
            title: "submission after a leader change",
            deadline: Some(d.submission),
        },
        Panel {
            title: "status",
            deadline: Some(d.status),
        },
    ]
}

/// Every record's lags, per metric of [`lag_panels`].
pub fn lag_samples(records: &[ScenarioRecord]) -> Vec<Vec<u64>> {
    let mut samples = vec![Vec::new(); 4];
    for r in records {
        samples[0].extend(&r.lags_ms.registration);
        samples[1].extend(&r.lags_ms.submission);
        samples[2].extend(&r.lags_ms.failover_submission);
        samples[3].extend(&r.lags_ms.status);
    }
    samples
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(seed: u64, hash: &str, passed: bool, registration: Vec<u64>) -> ScenarioRecord {
        ScenarioRecord {
            seed,
            profile: "default".into(),
            passed,
            violations: if passed { vec![] } else { vec!["late".into()] },
            trace_hash: hash.into(),
            sim_secs: 60.0,
            wall_ms: 10,
            faults: vec![],
            service: if seed.is_multiple_of(2) {
                "headless"
            } else {
                "clusterip/drop"
            }
            .into(),
            metrics: RecordMetrics {
                registration_lag_ms: LagStats::of(&registration).into(),
                submission_lag_ms: LagSummary::default(),
                status_lag_ms: LagSummary::default(),
                duplicates: 0,
                duplicates_stopped: 0,
                rpcs: 30,
                acting_writes: BTreeMap::new(),
                landed_after_cut: BTreeMap::new(),
            },
            lags_ms: Lags {
                registration,
                ..Lags::default()
            },
            replay: format!("replay {seed}"),
        }
    }

    fn lines(records: &[ScenarioRecord]) -> String {
        let mut text: String = records
            .iter()
            .map(|r| format!("{}\n", r.to_line()))
            .collect();
        let summary = Summary::of("default", records).to_json(Some(5));
        text.push_str(&format!("{summary}\n"));
        text
    }

    #[test]
    fn shards_merge_to_the_summary_of_one_run() {
        let all: Vec<ScenarioRecord> = (0..6)
            .map(|s| record(s, &format!("h{s}"), s != 4, vec![s * 100, 5000 - s]))
            .collect();
        let mut merged = Merged::default();
        merged
            .add(
                "shard-0",
                &lines(&[all[0].clone(), all[2].clone(), all[4].clone()]),
            )
            .unwrap();
        merged
            .add(
                "shard-1",
                &lines(&[all[1].clone(), all[3].clone(), all[5].clone()]),
            )
            .unwrap();
        merged.check_complete(0..6).unwrap();
        let summaries = merged.summaries().unwrap();
        assert_eq!(summaries, vec![Summary::of("default", &all)]);
        assert_eq!(summaries[0].passed, 5);
        assert_eq!(summaries[0].failed, vec![(4, "replay 4".to_owned())]);
        // Exact percentiles over every lag, not an average of the shards' percentiles.
        assert_eq!(summaries[0].registration.max, 5000);
        assert_eq!(summaries[0].registration.count, 12);
    }

    #[test]
    fn each_service_setup_has_its_pass_count_and_lags_under_the_profile() {
        let all: Vec<ScenarioRecord> = (0..6)
            .map(|s| record(s, &format!("h{s}"), s != 4, vec![s * 100]))
            .collect();
        let summary = Summary::of("default", &all);
        let names: Vec<&str> = summary
            .by_service
            .iter()
            .map(|k| k.service.as_str())
            .collect();
        assert_eq!(names, ["clusterip/drop", "headless"]);
        let headless = &summary.by_service[1];
        assert_eq!((headless.passed, headless.scenarios), (2, 3));
        assert_eq!(headless.registration.max, 400);
        let table = Table(std::slice::from_ref(&summary)).to_string();
        let rows: Vec<&str> = table.lines().collect();
        assert_eq!(rows.len(), 4, "{table}");
        assert!(rows[2].starts_with("  clusterip/drop ") && rows[2].contains("3/3"));
        assert!(rows[3].starts_with("  headless ") && rows[3].contains("2/3"));
        let json = summary.to_json(None);
        assert_eq!(json["summary"]["by_service"]["headless"]["passed"], 2);
    }

    #[test]
    fn a_retried_shard_counts_once_and_a_conflict_is_named() {
        let mut merged = Merged::default();
        merged
            .add("a", &lines(&[record(1, "h1", true, vec![1])]))
            .unwrap();
        merged
            .add("a-retry", &lines(&[record(1, "h1", true, vec![1])]))
            .unwrap();
        assert_eq!(merged.summaries().unwrap()[0].scenarios, 1);
        let err = merged
            .add("b", &lines(&[record(1, "other", true, vec![1])]))
            .unwrap_err();
        assert_eq!(
            err,
            MergeError::Conflict {
                seed: 1,
                profile: "default".into(),
                first: "a:1".into(),
                second: "b:1".into()
            }
        );
    }

    #[test]
    fn missing_seeds_and_malformed_lines_are_errors_that_say_where() {
        let mut merged = Merged::default();
        merged
            .add("a", &lines(&[record(0, "h0", true, vec![])]))
            .unwrap();
        assert_eq!(
            merged.check_complete(0..3),
            Err(MergeError::Missing {
                missing: 2,
                first: vec![1, 2]
            })
        );
        let err = merged.add("b", "{\"seed\": 3}\n").unwrap_err();
        assert!(
            matches!(&err, MergeError::Malformed { source_name, line: 1, .. } if source_name == "b"),
            "{err}"
        );
        assert_eq!(Merged::default().summaries(), Err(MergeError::Empty));
    }
}
