//! The core/v1 view of `events.k8s.io/v1` Events.
//!
//! A real API server keeps one Event store and serves it in both group versions; the
//! operator writes `events.k8s.io/v1` and `kubectl describe` reads core/v1 (selecting on
//! `involvedObject.*`). Listing core/v1 Events here includes the `events.k8s.io/v1` ones in
//! their core/v1 shape, so `kubectl describe spurjob NAME` against `spur-sim kube-api` shows
//! what the operator told. Field by field as Kubernetes converts them
//! (`regarding` → `involvedObject`, `note` → `message`, `series.count` → `count`, ...).

use serde_json::{Value, json};

/// `event` (an `events.k8s.io/v1` Event) as core/v1 shows it.
pub fn core_event(event: &Value) -> Value {
    let series = &event["series"];
    let count = series["count"]
        .as_u64()
        .or_else(|| event["deprecatedCount"].as_u64())
        .unwrap_or(1);
    let controller = event["reportingController"].clone();
    let mut core = json!({
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": event["metadata"].clone(),
        "involvedObject": event["regarding"].clone(),
        "related": event["related"].clone(),
        "reason": event["reason"].clone(),
        "message": event["note"].clone(),
        "type": event["type"].clone(),
        "action": event["action"].clone(),
        "eventTime": event["eventTime"].clone(),
        "firstTimestamp": event["deprecatedFirstTimestamp"].clone(),
        "lastTimestamp": event["deprecatedLastTimestamp"].clone(),
        "count": count,
        "source": {"component": controller.clone()},
        "reportingComponent": controller,
        "reportingInstance": event["reportingInstance"].clone(),
    });
    if series.is_object() {
        core["series"] = json!({
            "count": series["count"].clone(),
            "lastObservedTime": series["lastObservedTime"].clone(),
        });
    }
    if let Some(fields) = core.as_object_mut() {
        fields.retain(|_, v| !v.is_null());
    }
    core
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_events_k8s_io_event_reads_as_core_v1_with_its_series_count() {
        let event = json!({
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": "train.1", "namespace": "ml"},
            "regarding": {"kind": "SpurJob", "name": "train", "namespace": "ml", "uid": "u1"},
            "reason": "PodFailed", "note": "the pod on node-1 failed: exit code 3",
            "type": "Warning", "action": "Reconcile",
            "eventTime": "2026-12-03T13:00:00.000000Z",
            "reportingController": "spur.amd.com/operator", "reportingInstance": "op-0",
            "series": {"count": 3, "lastObservedTime": "2026-12-03T13:05:00.000000Z"},
        });
        let core = core_event(&event);
        assert_eq!(core["apiVersion"], "v1");
        assert_eq!(core["involvedObject"]["name"], "train");
        assert_eq!(core["involvedObject"]["uid"], "u1");
        assert_eq!(core["message"], "the pod on node-1 failed: exit code 3");
        assert_eq!(core["count"], 3);
        assert_eq!(core["series"]["count"], 3);
        assert_eq!(core["source"]["component"], "spur.amd.com/operator");
        assert!(core.get("firstTimestamp").is_none());
        let single = core_event(&json!({"regarding": {"name": "x"}, "note": "hi"}));
        assert_eq!(single["count"], 1);
        assert!(single.get("series").is_none());
    }
}
