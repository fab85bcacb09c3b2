//! Watch streams: newline-delimited JSON events from the store's change history.

use std::{
    io,
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use bytes::Bytes;
use futures::Stream;
use serde_json::{Value, json};
use tokio::{sync::watch, time::Instant};

use super::{
    error::ApiError,
    faults::{CutKind, FaultState, OutageMode},
    resources::ResourceType,
    selectors::Filter,
    server::Shared,
    store::{Change, ChangeKind},
};

/// How often a stream that asked for bookmarks gets one (a real server: about a minute).
const BOOKMARK_INTERVAL: Duration = Duration::from_secs(60);

/// What a watch request asked for.
#[derive(Clone, Debug)]
pub struct WatchRequest {
    /// The resource watched.
    pub resource: ResourceType,
    /// Namespace, labels, fields.
    pub filter: Filter,
    /// Start after this resourceVersion; `None` (absent or `0`) starts with the current
    /// objects as ADDED events.
    pub from: Option<u64>,
    /// `sendInitialEvents=true`: the initial ADDED events end with a marked BOOKMARK.
    pub send_initial_events: bool,
    /// `allowWatchBookmarks=true`.
    pub bookmarks: bool,
    /// `timeoutSeconds`: the stream ends cleanly after this.
    pub timeout: Duration,
    /// Objects as `PartialObjectMetadata`.
    pub metadata_only: bool,
}

struct WatchState {
    _open: OpenWatch,
    shared: Arc<Shared>,
    req: WatchRequest,
    position: u64,
    pending: Option<Bytes>,
    deadline: Instant,
    next_bookmark: Instant,
    changes: watch::Receiver<u64>,
    faults: watch::Receiver<FaultState>,
    cuts_seen: u64,
    finished: bool,
}

/// The body of a watch response.
pub fn watch_stream(
    shared: Arc<Shared>,
    req: WatchRequest,
) -> impl Stream<Item = io::Result<Bytes>> + Send {
    let now = Instant::now();
    let faults = shared.faults.subscribe();
    let cuts_seen = faults.borrow().cuts;
    let (changes, position, pending, finished) = {
        let store = shared.store.lock().expect("store lock");
        let changes = store.subscribe();
        match req.from {
            Some(rv) if rv < store.compacted_rv() => {
                let err = ApiError::expired(format!(
                    "too old resource version: {rv} ({})",
                    store.compacted_rv() + 1
                ));
                (changes, rv, Some(error_line(&err)), true)
            }
            Some(rv) => (changes, rv, None, false),
            None => {
                let page = store.list(&req.resource, &req.filter, None, None);
                let mut out = Vec::new();
                for obj in page.map(|p| p.items).unwrap_or_default() {
                    out.extend_from_slice(&event_line("ADDED", &render(&req, &obj)));
                }
                if req.send_initial_events {
                    let mut mark = bookmark(&req, store.resource_version());
                    mark["metadata"]["annotations"] = json!({"k8s.io/initial-events-end": "true"});
                    out.extend_from_slice(&event_line("BOOKMARK", &mark));
                }
                (
                    changes,
                    store.resource_version(),
                    Some(Bytes::from(out)),
                    false,
                )
            }
        }
    };
    let state = WatchState {
        _open: OpenWatch::new(shared.clone()),
        shared,
        deadline: now + req.timeout,
        next_bookmark: now + BOOKMARK_INTERVAL,
        req,
        position,
        pending,
        changes,
        faults,
        cuts_seen,
        finished,
    };
    futures::stream::unfold(state, |mut state| async move {
        let item = state.next_chunk().await?;
        Some((item, state))
    })
}

/// Counts a stream as open for as long as it lives.
struct OpenWatch(Arc<Shared>);

impl OpenWatch {
    fn new(shared: Arc<Shared>) -> Self {
        shared.watches_started.fetch_add(1, Ordering::Relaxed);
        shared.watches_open.fetch_add(1, Ordering::Relaxed);
        Self(shared)
    }
}

impl Drop for OpenWatch {
    fn drop(&mut self) {
        self.0.watches_open.fetch_sub(1, Ordering::Relaxed);
    }
}

impl WatchState {
    async fn next_chunk(&mut self) -> Option<io::Result<Bytes>> {
        loop {
            if let Some(chunk) = self.pending.take().filter(|c| !c.is_empty()) {
                return Some(Ok(chunk));
            }
            if self.finished {
                return None;
            }
            let faults = self.faults.borrow_and_update().clone();
            if faults.cuts != self.cuts_seen {
                self.finished = true;
                return match faults.cut_kind {
                    Some(CutKind::Expire) => Some(Ok(error_line(&ApiError::expired(
                        "the watch was expired by a fault",
                    )))),
                    _ => Some(Err(io::Error::new(
                        io::ErrorKind::ConnectionAborted,
                        "watch cut by a fault",
                    ))),
                };
            }
            match faults.outage {
                Some(OutageMode::Unavailable) => {
                    self.finished = true;
                    return Some(Err(io::Error::new(
                        io::ErrorKind::ConnectionAborted,
                        "API server unavailable",
                    )));
                }
                Some(OutageMode::Hang) => {
                    // Stalled: deliver nothing until the outage ends or the stream times out.
                    tokio::select! {
                        r = self.faults.changed() => if r.is_err() { return None },
                        () = tokio::time::sleep_until(self.deadline) => return None,
                    }
                    continue;
                }
                None => {}
            }
            self.changes.borrow_and_update();
            let lines = self.lines_since_position();
            if !lines.is_empty() {
                return Some(Ok(lines));
            }
            tokio::select! {
                r = self.changes.changed() => if r.is_err() { return None },
                r = self.faults.changed() => if r.is_err() { return None },
                () = tokio::time::sleep_until(self.deadline) => return None,
                () = tokio::time::sleep_until(self.next_bookmark), if self.req.bookmarks => {
                    self.next_bookmark += BOOKMARK_INTERVAL;
                    return Some(Ok(Bytes::from(event_line("BOOKMARK", &bookmark(&self.req, self.position)))));
                }
            }
        }
    }

    /// The event lines of the changes after `position`, which moves to now; an error line,
    /// ending the stream, when those changes are no longer kept.
    fn lines_since_position(&mut self) -> Bytes {
        let store = self.shared.store.lock().expect("store lock");
        let changes = store.changes_after(&self.req.resource.key(), self.position);
        let current = store.resource_version();
        match changes {
            Err(e) => {
                self.finished = true;
                error_line(&e)
            }
            Ok(changes) => {
                self.position = current;
                let mut out = Vec::new();
                for change in changes {
                    if let Some(kind) = event_type(&self.req.filter, &change) {
                        out.extend_from_slice(&event_line(
                            kind,
                            &render(&self.req, &change.object),
                        ));
                    }
                }
                Bytes::from(out)
            }
        }
    }
}

/// The event type a filtered watch sees for `change`, if it sees it at all: a label
/// change moves an object into or out of a filtered watch.
fn event_type(filter: &Filter, change: &Change) -> Option<&'static str> {
    let now_matches = filter.matches(&change.object);
    let was_matching = change.previous.as_ref().is_some_and(|p| filter.matches(p));
    match change.kind {
        ChangeKind::Added if now_matches => Some("ADDED"),
        ChangeKind::Modified if now_matches && was_matching => Some("MODIFIED"),
        ChangeKind::Modified if now_matches => Some("ADDED"),
        ChangeKind::Modified if was_matching => Some("DELETED"),
        ChangeKind::Deleted if now_matches || was_matching => Some("DELETED"),
        _ => None,
    }
}

fn render(req: &WatchRequest, obj: &Value) -> Value {
    if req.metadata_only {
        partial_metadata(obj)
    } else {
        obj.clone()
    }
}

/// The `PartialObjectMetadata` form of an object.
pub fn partial_metadata(obj: &Value) -> Value {
    json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata", "metadata": obj["metadata"].clone()})
}

fn bookmark(req: &WatchRequest, rv: u64) -> Value {
    let (api_version, kind) = if req.metadata_only {
        (
            "meta.k8s.io/v1".to_owned(),
            "PartialObjectMetadata".to_owned(),
        )
    } else {
        (req.resource.api_version(), req.resource.kind.clone())
    };
    json!({"apiVersion": api_version, "kind": kind, "metadata": {"resourceVersion": rv.to_string()}})
}

fn event_line(kind: &str, object: &Value) -> Vec<u8> {
    let mut line = serde_json::to_vec(&json!({"type": kind, "object": object}))
        .expect("JSON values serialise");
    line.push(b'\n');
    line
}

fn error_line(err: &ApiError) -> Bytes {
    Bytes::from(event_line("ERROR", &err.to_status()))
}
