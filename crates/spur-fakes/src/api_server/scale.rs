//! The `scale` subresource of Deployments, ReplicaSets and StatefulSets: an
//! `autoscaling/v1` Scale read from the object, whose `spec.replicas` is written back to
//! the object's (what `kubectl scale` and the HorizontalPodAutoscaler use).

use std::sync::Arc;

use serde_json::{Value, json};

use super::{
    error::{ApiError, ApiResult},
    patch::{PatchKind, apply_patch},
    resources::ResourceType,
    store::Store,
};

/// Whether the resource serves `.../scale`.
pub fn has_scale(rt: &ResourceType) -> bool {
    rt.group == "apps"
        && matches!(
            rt.kind.as_str(),
            "Deployment" | "ReplicaSet" | "StatefulSet"
        )
}

/// The Scale of `obj`: its desired and current replicas, and its selector as a string.
pub fn scale_of(obj: &Value) -> Value {
    let meta = &obj["metadata"];
    let selector = obj["spec"]["selector"]["matchLabels"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default();
    json!({
        "apiVersion": "autoscaling/v1", "kind": "Scale",
        "metadata": {"name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"],
            "resourceVersion": meta["resourceVersion"], "creationTimestamp": meta["creationTimestamp"]},
        "spec": {"replicas": obj["spec"]["replicas"].as_i64().unwrap_or(1)},
        "status": {"replicas": obj["status"]["replicas"].as_i64().unwrap_or(0), "selector": selector},
    })
}

/// Writes a Scale (a PUT's body, or `patch` applied to the current Scale) to the object's
/// `spec.replicas`; 409 for a stale resourceVersion, 422 for a missing or negative count.
pub fn write(
    store: &mut Store,
    rt: &ResourceType,
    namespace: Option<&str>,
    name: &str,
    change: ScaleChange<'_>,
) -> ApiResult<Arc<Value>> {
    let current = store.get(rt, namespace, name)?;
    let scale = match change {
        ScaleChange::Replace(scale) => scale.clone(),
        ScaleChange::Patch(kind, patch) => apply_patch(kind, &scale_of(&current), patch)?,
    };
    let replicas = scale["spec"]["replicas"]
        .as_i64()
        .filter(|r| *r >= 0)
        .ok_or_else(|| {
            ApiError::invalid(format!(
                "Scale.autoscaling \"{name}\" is invalid: spec.replicas: must be a non-negative integer"
            ))
        })?;
    let rv = scale["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or_default();
    if !rv.is_empty() && Some(rv) != current["metadata"]["resourceVersion"].as_str() {
        return Err(ApiError::conflict(
            &rt.qualified(),
            &rt.group,
            &rt.plural,
            name,
        ));
    }
    let patch = json!({"spec": {"replicas": replicas}});
    store.patch(rt, namespace, name, PatchKind::Merge, &patch, false)
}

/// What a write to `.../scale` brings.
pub enum ScaleChange<'a> {
    Replace(&'a Value),
    Patch(PatchKind, &'a Value),
}
