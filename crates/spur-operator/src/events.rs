//! Kubernetes Events (events.k8s.io/v1) about the objects the operator handles.
//!
//! Written here rather than with kube-runtime's `Recorder`, which stamps events with the
//! system clock: events carry the injected [`WallClock`] so a simulated run is the same
//! every time.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Resource, ResourceExt};

use crate::clock::WallClock;

#[derive(Clone)]
pub struct EventPublisher {
    kube: kube::Client,
    clock: WallClock,
    /// `reportingInstance`: this replica.
    instance: String,
    sequence: Arc<AtomicU64>,
}

pub const REPORTING_CONTROLLER: &str = "spur.amd.com/spur-operator";

impl EventPublisher {
    pub fn new(kube: kube::Client, clock: WallClock, instance: String) -> EventPublisher {
        EventPublisher {
            kube,
            clock,
            instance,
            sequence: Arc::default(),
        }
    }

    /// A Warning about `object`. Best effort: a failure is logged, never returned, since
    /// the status message already carries the same words.
    pub async fn warning<K>(&self, object: &K, reason: &str, note: &str)
    where
        K: Resource<DynamicType = ()>,
    {
        self.publish(object, "Warning", reason, note).await;
    }

    pub async fn normal<K>(&self, object: &K, reason: &str, note: &str)
    where
        K: Resource<DynamicType = ()>,
    {
        self.publish(object, "Normal", reason, note).await;
    }

    async fn publish<K>(&self, object: &K, type_: &str, reason: &str, note: &str)
    where
        K: Resource<DynamicType = ()>,
    {
        let namespace = object.namespace().unwrap_or_else(|| "default".into());
        let sequence = self.sequence.fetch_add(1, Ordering::Relaxed);
        let now = self.clock.timestamp();
        let event = Event {
            metadata: ObjectMeta {
                // Unique per replica and event, like client-go's `<object>.<hex time>`.
                name: Some(format!(
                    "{}.{:x}{:04x}",
                    object.name_any(),
                    now.as_millisecond(),
                    sequence % 0x10000
                )),
                namespace: Some(namespace.clone()),
                ..Default::default()
            },
            event_time: Some(MicroTime(now)),
            type_: Some(type_.to_owned()),
            reason: Some(reason.to_owned()),
            // The API server refuses notes over 1 kB.
            note: Some(note.chars().take(1000).collect()),
            action: Some("Reconcile".to_owned()),
            regarding: Some(ObjectReference {
                api_version: Some(K::api_version(&()).into_owned()),
                kind: Some(K::kind(&()).into_owned()),
                name: Some(object.name_any()),
                namespace: object.namespace(),
                uid: object.uid(),
                resource_version: object.resource_version(),
                ..Default::default()
            }),
            reporting_controller: Some(REPORTING_CONTROLLER.to_owned()),
            reporting_instance: Some(self.instance.clone()),
            ..Default::default()
        };
        let api: Api<Event> = Api::namespaced(self.kube.clone(), &namespace);
        if let Err(e) = api.create(&PostParams::default(), &event).await {
            tracing::warn!(object = %object.name_any(), %reason, error = %e, "could not publish an event");
        }
    }
}
