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

use spur_judge::timeline::CallMark;
use spur_judge::timeline::operator_log::TARGET;

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
