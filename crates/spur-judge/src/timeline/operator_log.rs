//! The operator's own account of each controller call, read from a real operator's JSON
//! log (the simulation catches the same events in process: `spur_sim::timeline_calls`).

use super::CallMark;

/// The operator's target for one event per controller call.
pub const TARGET: &str = "spur_operator::rpc";

/// The same account from a real operator's JSON log (`--log-format json`, with
/// `spur_operator::rpc` at debug): each call's line, on lane `lane`, timed from `start`
/// (the wall clock of the run's start). Lines of other targets, or that do not parse,
/// are skipped: the log is the operator's, not written for this.
pub fn from_operator_log(text: &str, lane: &str, start: std::time::SystemTime) -> Vec<CallMark> {
    let mut marks = Vec::new();
    for line in text.lines() {
        let Ok(entry) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if entry["target"] != TARGET {
            continue;
        }
        let Some(at) = entry["timestamp"]
            .as_str()
            .and_then(|t| humantime::parse_rfc3339_weak(t).ok())
            .and_then(|t| t.duration_since(start).ok())
        else {
            continue;
        };
        let fields = &entry["fields"];
        let text = |name: &str| fields[name].as_str().unwrap_or_default().to_owned();
        let to_ms = at.as_millis() as u64;
        marks.push(CallMark {
            lane: lane.to_owned(),
            from_ms: to_ms.saturating_sub(fields["elapsed_ms"].as_u64().unwrap_or(0)),
            to_ms,
            method: text("method"),
            outcome: text("outcome"),
            detail: text("error"),
        });
    }
    marks
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn a_real_operators_json_log_gives_its_calls() {
        let start = UNIX_EPOCH + Duration::from_secs(1_764_673_800); // 2025-12-02T11:10:00Z
        let log = concat!(
            r#"{"timestamp":"2025-12-02T11:10:02.500000Z","level":"DEBUG","fields":{"message":"controller call ended","method":"GetJobs","outcome":"transport","code":"cancelled","elapsed_ms":2000,"error":"GetJobs: no answer"},"target":"spur_operator::rpc"}"#,
            "\n",
            r#"{"timestamp":"2025-12-02T11:10:03.000000Z","level":"INFO","fields":{"message":"leading"},"target":"spur_operator::lease"}"#,
            "\nnot json\n",
            r#"{"timestamp":"2025-12-02T11:10:04.250000Z","level":"DEBUG","fields":{"message":"controller call ended","method":"Ping","outcome":"answered","code":"ok","elapsed_ms":3,"error":""},"target":"spur_operator::rpc"}"#,
        );
        let marks = from_operator_log(log, "operator", start);
        assert_eq!(
            marks,
            [
                CallMark {
                    lane: "operator".into(),
                    from_ms: 500,
                    to_ms: 2500,
                    method: "GetJobs".into(),
                    outcome: "transport".into(),
                    detail: "GetJobs: no answer".into(),
                },
                CallMark {
                    lane: "operator".into(),
                    from_ms: 4247,
                    to_ms: 4250,
                    method: "Ping".into(),
                    outcome: "answered".into(),
                    detail: String::new(),
                },
            ]
        );
    }
}
