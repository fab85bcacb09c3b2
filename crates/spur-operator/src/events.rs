//! Kubernetes Events (events.k8s.io/v1) about the objects the operator handles; core/v1
//! Events once RBAC refuses the newer group (upstream's ClusterRole grants only core
//! events), so a SpurJob's Warning reaches `kubectl describe` under either.
//!
//! Written here rather than with kube-runtime's `Recorder`, which stamps events with the
//! system clock: events carry the injected [`WallClock`] so a simulated run is the same
//! every time. Like that recorder, a repeat of an event is counted on the first one as an
//! event series (`series.count`, `series.lastObservedTime`) rather than written again.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event as CoreEvent, EventSource, ObjectReference};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Resource, ResourceExt};

use serde_json::json;

use crate::clock::WallClock;

/// The most event series remembered at once: a bound on memory when many distinct events
/// fall within one window (each entry is a few hundred bytes). Past it the oldest is
/// forgotten, and its next repeat starts a new Event.
const MAX_SERIES: usize = 4096;

/// The identity of a repeated event: namespace, object UID (else name), type, reason, note.
type SeriesKey = (String, String, String, String, String);

/// An Event written, to count its repeats on.
struct Series {
    event: String,
    count: i32,
    last: Timestamp,
}

#[derive(Clone)]
pub struct EventPublisher {
    kube: kube::Client,
    clock: WallClock,
    /// `reportingInstance`: this replica.
    instance: String,
    sequence: Arc<AtomicU64>,
    /// `--event-series-window`.
    series_window: Duration,
    series: Arc<Mutex<BTreeMap<SeriesKey, Series>>>,
    /// Set once RBAC refused events.k8s.io: core/v1 Events from then on.
    core_only: Arc<AtomicBool>,
    /// Set once RBAC refused both groups, so that is said once, not on every event.
    refusal_said: Arc<AtomicBool>,
}

/// One Event as written, whichever group carries it.
struct Draft<'a> {
    namespace: &'a str,
    name: &'a str,
    regarding: ObjectReference,
    type_: &'a str,
    reason: &'a str,
    note: String,
    now: Timestamp,
}

pub const REPORTING_CONTROLLER: &str = "spur.amd.com/spur-operator";

/// `object` as an Event's `regarding`.
pub fn reference_to<K>(object: &K) -> ObjectReference
where
    K: Resource<DynamicType = ()>,
{
    ObjectReference {
        api_version: Some(K::api_version(&()).into_owned()),
        kind: Some(K::kind(&()).into_owned()),
        name: Some(object.name_any()),
        namespace: object.namespace(),
        uid: object.uid(),
        resource_version: object.resource_version(),
        ..Default::default()
    }
}

impl EventPublisher {
    pub fn new(kube: kube::Client, clock: WallClock, instance: String) -> EventPublisher {
        EventPublisher {
            kube,
            clock,
            instance,
            sequence: Arc::default(),
            series_window: Duration::from_secs(360),
            series: Arc::default(),
            core_only: Arc::default(),
            refusal_said: Arc::default(),
        }
    }

    /// Repeats within `window` of the last are counted on the first Event (zero: every
    /// event is written anew).
    pub fn with_series_window(mut self, window: Duration) -> EventPublisher {
        self.series_window = window;
        self
    }

    /// A Warning about `object`. Best effort: a failure is logged, never returned, since
    /// the status message already carries the same words.
    pub async fn warning<K>(&self, object: &K, reason: &str, note: &str)
    where
        K: Resource<DynamicType = ()>,
    {
        self.publish(reference_to(object), "Warning", reason, note)
            .await;
    }

    /// A Warning about the object `regarding` names (one known by reference only, such as
    /// a pod's owner).
    pub async fn warning_about(&self, regarding: ObjectReference, reason: &str, note: &str) {
        self.publish(regarding, "Warning", reason, note).await;
    }

    pub async fn normal<K>(&self, object: &K, reason: &str, note: &str)
    where
        K: Resource<DynamicType = ()>,
    {
        self.publish(reference_to(object), "Normal", reason, note)
            .await;
    }

    async fn publish(&self, regarding: ObjectReference, type_: &str, reason: &str, note: &str) {
        let namespace = regarding
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let object = regarding.name.clone().unwrap_or_default();
        let now = self.clock.timestamp();
        // The API server refuses notes over 1 kB.
        let note: String = note.chars().take(1000).collect();
        let key: SeriesKey = (
            namespace.clone(),
            regarding.uid.clone().unwrap_or_else(|| object.clone()),
            type_.to_owned(),
            reason.to_owned(),
            note.clone(),
        );
        if let Some((event, count)) = self.repeat(&key, now) {
            match self.count_repeat(&namespace, &event, count, now).await {
                Ok(()) => return,
                Err(e) => {
                    tracing::info!(%object, %reason, error = %e, "could not count a repeated event on its series; writing it anew");
                    self.forget(&key);
                }
            }
        }
        let sequence = self.sequence.fetch_add(1, Ordering::Relaxed);
        // Unique per replica and event, like client-go's `<object>.<hex time>`.
        let name = format!(
            "{object}.{:x}{:04x}",
            now.as_millisecond(),
            sequence % 0x10000
        );
        let draft = Draft {
            namespace: &namespace,
            name: &name,
            regarding,
            type_,
            reason,
            note,
            now,
        };
        match self.create(&draft).await {
            Ok(()) => self.remember(key, name, now),
            Err(e) if is_forbidden(&e) => self.say_refused_once(&e),
            Err(e) => {
                tracing::warn!(%object, %reason, error = %e, "could not publish an event");
            }
        }
    }

    /// Writes `draft` as an events.k8s.io Event, or as a core one once that group was refused.
    async fn create(&self, draft: &Draft<'_>) -> Result<(), kube::Error> {
        if !self.core_only.load(Ordering::Relaxed) {
            let api: Api<Event> = Api::namespaced(self.kube.clone(), draft.namespace);
            match api.create(&PostParams::default(), &self.event(draft)).await {
                Err(e) if is_forbidden(&e) => {
                    tracing::warn!(error = %e, "events.k8s.io Events are refused: writing core/v1 Events instead; to write events.k8s.io/v1, grant apiGroups [events.k8s.io], resources [events], verbs [create, patch]");
                    self.core_only.store(true, Ordering::Relaxed);
                }
                other => return other.map(drop),
            }
        }
        let api: Api<CoreEvent> = Api::namespaced(self.kube.clone(), draft.namespace);
        api.create(&PostParams::default(), &self.core_event(draft))
            .await
            .map(drop)
    }

    /// Counts a repeat on the Event written first, in the group it was written in.
    async fn count_repeat(
        &self,
        namespace: &str,
        event: &str,
        count: i32,
        now: Timestamp,
    ) -> Result<(), kube::Error> {
        let params = PatchParams::default();
        if self.core_only.load(Ordering::Relaxed) {
            let patch = json!({ "count": count, "lastTimestamp": Time(now) });
            let api: Api<CoreEvent> = Api::namespaced(self.kube.clone(), namespace);
            return api
                .patch(event, &params, &Patch::Merge(&patch))
                .await
                .map(drop);
        }
        let patch = json!({ "series": { "count": count, "lastObservedTime": MicroTime(now) } });
        let api: Api<Event> = Api::namespaced(self.kube.clone(), namespace);
        api.patch(event, &params, &Patch::Merge(&patch))
            .await
            .map(drop)
    }

    fn event(&self, draft: &Draft<'_>) -> Event {
        Event {
            metadata: ObjectMeta {
                name: Some(draft.name.to_owned()),
                namespace: Some(draft.namespace.to_owned()),
                ..Default::default()
            },
            event_time: Some(MicroTime(draft.now)),
            type_: Some(draft.type_.to_owned()),
            reason: Some(draft.reason.to_owned()),
            note: Some(draft.note.clone()),
            action: Some("Reconcile".to_owned()),
            regarding: Some(draft.regarding.clone()),
            reporting_controller: Some(REPORTING_CONTROLLER.to_owned()),
            reporting_instance: Some(self.instance.clone()),
            ..Default::default()
        }
    }

    fn core_event(&self, draft: &Draft<'_>) -> CoreEvent {
        CoreEvent {
            metadata: ObjectMeta {
                name: Some(draft.name.to_owned()),
                namespace: Some(draft.namespace.to_owned()),
                ..Default::default()
            },
            involved_object: draft.regarding.clone(),
            type_: Some(draft.type_.to_owned()),
            reason: Some(draft.reason.to_owned()),
            message: Some(draft.note.clone()),
            first_timestamp: Some(Time(draft.now)),
            last_timestamp: Some(Time(draft.now)),
            count: Some(1),
            source: Some(EventSource {
                component: Some(REPORTING_CONTROLLER.to_owned()),
                host: None,
            }),
            reporting_component: Some(REPORTING_CONTROLLER.to_owned()),
            reporting_instance: Some(self.instance.clone()),
            ..Default::default()
        }
    }

    /// Both groups refused: said once, naming the rule, since nothing else is lost (each
    /// event's words are also in the object's status).
    fn say_refused_once(&self, error: &kube::Error) {
        if !self.refusal_said.swap(true, Ordering::Relaxed) {
            tracing::error!(error = %error, "no Event can be written: grant the operator's ServiceAccount apiGroups [events.k8s.io], resources [events], verbs [create, patch] (or the same on core events)");
        }
    }

    /// The Event `key` repeats and its new count, when it repeats one within the window.
    fn repeat(&self, key: &SeriesKey, now: Timestamp) -> Option<(String, i32)> {
        let mut series = self.series.lock().expect("event series lock");
        let window = self.series_window;
        series.retain(|_, s| within(s.last, now, window));
        let entry = series.get_mut(key)?;
        entry.count = entry.count.saturating_add(1);
        entry.last = now;
        Some((entry.event.clone(), entry.count))
    }

    fn remember(&self, key: SeriesKey, event: String, now: Timestamp) {
        if self.series_window.is_zero() {
            return;
        }
        let mut series = self.series.lock().expect("event series lock");
        if series.len() >= MAX_SERIES
            && let Some(oldest) = series
                .iter()
                .min_by_key(|(_, s)| s.last)
                .map(|(k, _)| k.clone())
        {
            series.remove(&oldest);
        }
        series.insert(
            key,
            Series {
                event,
                count: 1,
                last: now,
            },
        );
    }

    fn forget(&self, key: &SeriesKey) {
        self.series.lock().expect("event series lock").remove(key);
    }
}

fn is_forbidden(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.is_forbidden())
}

/// `last` is less than `window` before `now`.
fn within(last: Timestamp, now: Timestamp, window: Duration) -> bool {
    let since = now.duration_since(last).as_secs_f64();
    since < window.as_secs_f64()
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use k8s_openapi::api::core::v1::Pod;

    use super::*;
    use crate::kube_testing::{Writes, api_server};

    #[tokio::test]
    async fn a_repeated_event_is_counted_on_its_series_within_the_window_only() {
        let writes = Writes::default();
        let kube = api_server(writes.clone(), Duration::ZERO);
        let at = Arc::new(Mutex::new(
            SystemTime::UNIX_EPOCH + Duration::from_secs(1_000),
        ));
        let clock = {
            let at = at.clone();
            WallClock::from_fn(move || *at.lock().unwrap())
        };
        let advance = |secs: u64| *at.lock().unwrap() += Duration::from_secs(secs);
        let events = EventPublisher::new(kube, clock, "replica-a".into())
            .with_series_window(Duration::from_secs(360));
        let mut job = Pod::default();
        job.metadata.name = Some("train".into());
        job.metadata.namespace = Some("ml".into());
        job.metadata.uid = Some("u1".into());
        let failed = "the pod on gpu-1 failed: exit code 3";
        events.warning(&job, "PodFailed", failed).await;
        advance(60);
        events.warning(&job, "PodFailed", failed).await;
        advance(300);
        events.warning(&job, "PodFailed", failed).await;
        events
            .warning(&job, "PodFailed", "the pod on gpu-2 failed: exit code 3")
            .await;
        events.normal(&job, "PodFailed", failed).await;
        // More than the window after the last repeat: a new Event.
        advance(361);
        events.warning(&job, "PodFailed", failed).await;
        let writes = writes.lock().unwrap().clone();
        let summary: Vec<(String, serde_json::Value)> = writes
            .iter()
            .map(|(what, body)| {
                let detail = if what.starts_with("PATCH") {
                    body["series"]["count"].clone()
                } else {
                    body["note"].clone()
                };
                (what.clone(), detail)
            })
            .collect();
        let post = "POST /apis/events.k8s.io/v1/namespaces/ml/events".to_owned();
        let first = writes[0].1["metadata"]["name"].as_str().unwrap().to_owned();
        let patch = format!("PATCH /apis/events.k8s.io/v1/namespaces/ml/events/{first}");
        assert_eq!(
            summary,
            [
                (post.clone(), json!(failed)),
                (patch.clone(), json!(2)),
                (patch, json!(3)),
                (post.clone(), json!("the pod on gpu-2 failed: exit code 3")),
                (post.clone(), json!(failed)),
                (post, json!(failed)),
            ]
        );
        assert_eq!(
            writes[4].1["type"], "Normal",
            "another type is another series"
        );
        assert_eq!(
            writes[2].1["series"]["lastObservedTime"],
            json!("1970-01-01T00:22:40.000000Z")
        );
    }

    #[tokio::test]
    async fn where_rbac_refuses_events_k8s_io_core_events_carry_them_and_their_repeats() {
        let writes = Writes::default();
        let refused = |what: &str| what.contains("/apis/events.k8s.io/");
        let kube =
            crate::kube_testing::api_server_refusing(writes.clone(), Duration::ZERO, refused);
        let events = EventPublisher::new(kube, WallClock::system(), "replica-a".into());
        let mut job = Pod::default();
        job.metadata.name = Some("train".into());
        job.metadata.namespace = Some("ml".into());
        events
            .warning(&job, "Invalid", "spec.timeLimit: unknown unit")
            .await;
        events
            .warning(&job, "Invalid", "spec.timeLimit: unknown unit")
            .await;
        let writes = writes.lock().unwrap().clone();
        let first = writes[0].1["metadata"]["name"].as_str().unwrap().to_owned();
        let what: Vec<&str> = writes.iter().map(|(what, _)| what.as_str()).collect();
        assert_eq!(
            what,
            [
                "POST /api/v1/namespaces/ml/events".to_owned(),
                format!("PATCH /api/v1/namespaces/ml/events/{first}"),
            ]
        );
        assert_eq!(writes[0].1["message"], "spec.timeLimit: unknown unit");
        assert_eq!(writes[0].1["involvedObject"]["name"], "train");
        assert_eq!(writes[0].1["type"], "Warning");
        assert_eq!(writes[1].1["count"], 2);
    }
}
