//! What the workload controllers share: reading objects' metadata, owner references,
//! label selectors, pod readiness, the pod-template hash, and making pods from templates.

use serde_json::{Map, Value, json};

use crate::clock::Clock;

pub(crate) fn name(obj: &Value) -> &str {
    obj["metadata"]["name"].as_str().unwrap_or_default()
}

pub(crate) fn namespace(obj: &Value) -> &str {
    obj["metadata"]["namespace"].as_str().unwrap_or_default()
}

pub(crate) fn uid(obj: &Value) -> &str {
    obj["metadata"]["uid"].as_str().unwrap_or_default()
}

pub(crate) fn deleting(obj: &Value) -> bool {
    !obj["metadata"]["deletionTimestamp"].is_null()
}

/// `spec.replicas`, 1 when absent (as the real server defaults it).
pub(crate) fn spec_replicas(obj: &Value) -> i64 {
    obj["spec"]["replicas"].as_i64().unwrap_or(1)
}

/// A `status` count, 0 when absent.
pub(crate) fn status_count(obj: &Value, field: &str) -> i64 {
    obj["status"][field].as_i64().unwrap_or(0)
}

/// The uid of the object's controller (the owner reference with `controller: true`).
pub(crate) fn controller_uid(obj: &Value) -> Option<&str> {
    obj["metadata"]["ownerReferences"]
        .as_array()?
        .iter()
        .find(|r| r["controller"] == true)?["uid"]
        .as_str()
}

/// The objects of `objects` in `owner`'s namespace whose controller is `owner`.
pub(crate) fn owned_by<'a>(objects: &'a [Value], owner: &Value) -> Vec<&'a Value> {
    objects
        .iter()
        .filter(|o| namespace(o) == namespace(owner) && controller_uid(o) == Some(uid(owner)))
        .collect()
}

/// An owner reference to `owner` as its controller.
pub(crate) fn controller_ref(owner: &Value) -> Value {
    json!({
        "apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": name(owner),
        "uid": uid(owner), "controller": true, "blockOwnerDeletion": true,
    })
}

/// Whether a pod is Ready: its `Ready` condition is True; without one (the simulated
/// kubelet sets none), when it is Running with every container ready.
pub(crate) fn pod_ready(pod: &Value) -> bool {
    let conditions = pod["status"]["conditions"].as_array();
    if let Some(ready) = conditions.and_then(|c| c.iter().find(|c| c["type"] == "Ready")) {
        return ready["status"] == "True";
    }
    let statuses = pod["status"]["containerStatuses"].as_array();
    pod["status"]["phase"] == "Running"
        && statuses.is_some_and(|s| !s.is_empty() && s.iter().all(|c| c["ready"] == true))
}

/// Not being deleted and not ended (Succeeded or Failed): a pod a controller counts.
pub(crate) fn pod_active(pod: &Value) -> bool {
    let phase = pod["status"]["phase"].as_str().unwrap_or("Pending");
    !deleting(pod) && phase != "Succeeded" && phase != "Failed"
}

/// Whether `labels` match every pair of a map selector (a Service's `spec.selector`).
pub(crate) fn map_matches(selector: &Value, labels: &Value) -> bool {
    selector
        .as_object()
        .is_some_and(|m| m.iter().all(|(k, v)| labels.get(k) == Some(v)))
}

/// Whether `labels` match a `LabelSelector` (`matchLabels` and `matchExpressions`). An
/// empty or absent selector matches nothing, as for a workload's `spec.selector`.
pub(crate) fn selector_matches(selector: &Value, labels: &Value) -> bool {
    let match_labels = &selector["matchLabels"];
    let expressions = selector["matchExpressions"].as_array();
    let empty =
        match_labels.as_object().is_none_or(Map::is_empty) && expressions.is_none_or(Vec::is_empty);
    if empty || (match_labels.is_object() && !map_matches(match_labels, labels)) {
        return false;
    }
    expressions.into_iter().flatten().all(|e| {
        let key = e["key"].as_str().unwrap_or_default();
        let value = labels.get(key);
        let listed = |v: &Value| e["values"].as_array().is_some_and(|vs| vs.contains(v));
        match e["operator"].as_str().unwrap_or_default() {
            "In" => value.is_some_and(listed),
            "NotIn" => !value.is_some_and(listed),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            _ => false,
        }
    })
}

/// JSON with object keys sorted at every level, whatever order the map keeps them in.
fn canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                canonical(&map[key], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical(item, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// A short, stable hash of a pod template: FNV-1a (32 bits) of its canonical JSON, its
/// decimal digits mapped onto the alphabet Kubernetes uses for `pod-template-hash`.
pub(crate) fn template_hash(template: &Value) -> String {
    let mut text = String::new();
    canonical(template, &mut text);
    let hash = text.bytes().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    hash.to_string()
        .bytes()
        .map(|d| ALPHABET[usize::from(d) % ALPHABET.len()] as char)
        .collect()
}

/// A pod from `template` in `owner`'s namespace, controlled by `owner`, with `extra_labels`.
pub(crate) fn pod_from_template(template: &Value, owner: &Value, extra_labels: &Value) -> Value {
    let mut labels = template["metadata"]["labels"].clone();
    if !labels.is_object() {
        labels = json!({});
    }
    for (k, v) in extra_labels.as_object().into_iter().flatten() {
        labels[k] = v.clone();
    }
    let mut metadata = json!({
        "namespace": namespace(owner), "labels": labels,
        "ownerReferences": [controller_ref(owner)],
    });
    if template["metadata"]["annotations"].is_object() {
        metadata["annotations"] = template["metadata"]["annotations"].clone();
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": template["spec"]})
}

/// Now by `clock`'s wall time, as a Kubernetes `Time`.
pub(crate) fn timestamp(clock: &Clock) -> String {
    k8s_openapi::jiff::Timestamp::try_from((clock.wall)())
        .map(crate::clock::format_time)
        .unwrap_or_default()
}

/// A condition `{type, status, reason, message}` stamped now, or with the time `previous`
/// conditions carry for the same type and status (so an unchanged condition is unchanged).
pub(crate) fn condition(
    previous: &Value,
    kind: &str,
    ok: bool,
    reason: &str,
    message: &str,
    clock: &Clock,
) -> Value {
    let status = if ok { "True" } else { "False" };
    let old = previous
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == kind));
    let since = match old {
        Some(old) if old["status"] == status => old["lastTransitionTime"].clone(),
        _ => Value::String(timestamp(clock)),
    };
    json!({"type": kind, "status": status, "reason": reason, "message": message,
        "lastTransitionTime": since, "lastUpdateTime": since})
}

/// `maxSurge`/`maxUnavailable`: an integer, or a percentage of `total` rounded up or down.
pub(crate) fn int_or_percent(value: &Value, total: i64, default: &str, round_up: bool) -> i64 {
    match value {
        Value::Number(n) => n.as_i64().unwrap_or(0),
        other => {
            let text = other.as_str().unwrap_or(default);
            let percent: i64 = text.trim_end_matches('%').parse().unwrap_or(0);
            let scaled = percent * total;
            if round_up {
                (scaled + 99) / 100
            } else {
                scaled / 100
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_match_as_kubernetes_does() {
        let labels = json!({"app": "web", "tier": "front"});
        let sel = json!({"matchLabels": {"app": "web"},
            "matchExpressions": [{"key": "tier", "operator": "In", "values": ["front"]},
                                 {"key": "gone", "operator": "DoesNotExist"}]});
        assert!(selector_matches(&sel, &labels));
        assert!(!selector_matches(
            &json!({"matchLabels": {"app": "db"}}),
            &labels
        ));
        assert!(
            !selector_matches(&json!({}), &labels),
            "empty selects nothing"
        );
        assert!(map_matches(&json!({"app": "web"}), &labels));
    }

    #[test]
    fn template_hash_ignores_key_order_and_sees_changes() {
        let a: Value = serde_json::from_str(r#"{"x": 1, "y": {"b": 2, "a": 1}}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"y": {"a": 1, "b": 2}, "x": 1}"#).unwrap();
        assert_eq!(template_hash(&a), template_hash(&b));
        assert_ne!(template_hash(&a), template_hash(&json!({"x": 2})));
        assert!(template_hash(&a).chars().all(|c| c.is_ascii_alphanumeric()));
    }

    #[test]
    fn percentages_round_as_deployments_do() {
        assert_eq!(int_or_percent(&Value::Null, 2, "25%", true), 1);
        assert_eq!(int_or_percent(&Value::Null, 2, "25%", false), 0);
        assert_eq!(int_or_percent(&json!(3), 10, "25%", false), 3);
        assert_eq!(int_or_percent(&json!("50%"), 5, "25%", false), 2);
    }
}
