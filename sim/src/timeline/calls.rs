//! The operator's own account of each controller call: its `spur_operator::rpc` events
//! (method, how the call ended, how long it took), caught by a tracing layer and placed on
//! the lane of the host that made it.
//!
//! turmoil runs every host on one thread and has no public "current host", but it gives
//! each host a tokio runtime of its own: a host registers its runtime's id when its
//! software starts ([`enter_host`]), and the layer looks the id up. Only a timeline's run
//! installs the layer; the events it catches change nothing the simulation observes.

use std::cell::RefCell;

use tracing::field::{Field, Visit};
use tracing_subscriber::layer::Context;

use super::CallMark;

/// The operator's target for one event per controller call.
pub const TARGET: &str = "spur_operator::rpc";

thread_local! {
    /// Each host's runtime on this thread (a scenario's thread runs all its hosts).
    static HOSTS: RefCell<Vec<(tokio::runtime::Id, String)>> = const { RefCell::new(Vec::new()) };
    /// The calls caught on this thread since the last [`take`].
    static CALLS: RefCell<Vec<CallMark>> = const { RefCell::new(Vec::new()) };
}

/// The calls caught on this thread (one scenario's) since the last call, in the order
/// they ended.
pub fn take() -> Vec<CallMark> {
    CALLS.with(|calls| std::mem::take(&mut *calls.borrow_mut()))
}

/// The layer that catches the operator's calls, filtered to their events: install it
/// (with any other layers) before a timeline's scenario runs.
pub fn layer<S>() -> impl tracing_subscriber::Layer<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    use tracing_subscriber::Layer as _;
    CallLayer.with_filter(
        tracing_subscriber::filter::Targets::new().with_target(TARGET, tracing::Level::DEBUG),
    )
}

/// Installs [`layer`] alone as the process's subscriber, once (later calls do nothing).
/// Process-wide on purpose: tracing caches each callsite's interest globally, so a
/// subscriber scoped to one thread can miss events while other threads come and go.
pub fn catch_in_this_process() {
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = tracing_subscriber::registry().with(layer()).try_init();
    });
}

/// Notes that the software of `host` runs on the current tokio runtime (called again on a
/// restart, which gives the host a new runtime).
pub fn enter_host(host: &str) {
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let id = handle.id();
    HOSTS.with(|hosts| {
        let mut hosts = hosts.borrow_mut();
        hosts.retain(|(_, h)| h != host);
        hosts.push((id, host.to_owned()));
    });
}

fn current_host() -> Option<String> {
    let id = tokio::runtime::Handle::try_current().ok()?.id();
    HOSTS.with(|hosts| {
        hosts
            .borrow()
            .iter()
            .find(|(i, _)| *i == id)
            .map(|(_, h)| h.clone())
    })
}

/// Keeps each call event in [`CALLS`] of the thread it happened on.
struct CallLayer;

#[derive(Default)]
struct Fields {
    method: String,
    outcome: String,
    elapsed_ms: u64,
    error: String,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "method" => self.method = value.to_owned(),
            "outcome" => self.outcome = value.to_owned(),
            "error" => self.error = value.to_owned(),
            _ => {}
        }
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        if field.name() == "elapsed_ms" {
            self.elapsed_ms = value;
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let text = format!("{value:?}");
        self.record_str(field, text.trim_matches('"'));
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for CallLayer {
    fn on_event(&self, event: &tracing::Event<'_>, _ctx: Context<'_, S>) {
        if event.metadata().target() != TARGET {
            return;
        }
        let (Some(lane), Some(at)) = (current_host(), turmoil::sim_elapsed()) else {
            return;
        };
        let mut fields = Fields::default();
        event.record(&mut fields);
        let to_ms = at.as_millis() as u64;
        let mark = CallMark {
            lane,
            from_ms: to_ms.saturating_sub(fields.elapsed_ms),
            to_ms,
            method: fields.method,
            outcome: fields.outcome,
            detail: fields.error,
        };
        CALLS.with(|calls| calls.borrow_mut().push(mark));
    }
}

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
