//! Patch semantics by content type, on top of the json-patch crate.

use serde_json::Value;

use super::error::{ApiError, ApiResult};

/// The patch flavours kube-rs sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatchKind {
    /// RFC 6902 JSON patch (`application/json-patch+json`), including `test`.
    Json,
    /// RFC 7386 merge patch (`application/merge-patch+json`).
    Merge,
    /// Strategic merge (`application/strategic-merge-patch+json`), treated as a merge patch:
    /// lists are replaced whole rather than merged by key.
    StrategicMerge,
    /// Server-side apply (`application/apply-patch+yaml`), treated as a forced merge patch.
    /// Only its JSON form is understood (kube-rs sends JSON).
    Apply,
}

impl PatchKind {
    /// The patch kind a `Content-Type` names; 415 for anything else.
    pub fn from_content_type(content_type: &str) -> ApiResult<Self> {
        let media = content_type
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        match media.as_str() {
            "application/json-patch+json" => Ok(Self::Json),
            "application/merge-patch+json" => Ok(Self::Merge),
            "application/strategic-merge-patch+json" => Ok(Self::StrategicMerge),
            "application/apply-patch+yaml" | "application/apply-patch+json" => Ok(Self::Apply),
            _ => Err(ApiError::unsupported_media_type(content_type)),
        }
    }
}

/// Parses a patch body: 400 when it is not JSON of the right shape.
pub fn parse_patch_body(kind: PatchKind, body: &[u8]) -> ApiResult<Value> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the patch body is not valid JSON: {e}")))?;
    match kind {
        PatchKind::Json if !value.is_array() => Err(ApiError::bad_request(
            "a JSON patch must be an array of operations",
        )),
        PatchKind::Merge | PatchKind::StrategicMerge | PatchKind::Apply if !value.is_object() => {
            Err(ApiError::bad_request(
                "a merge or apply patch must be a JSON object",
            ))
        }
        _ => Ok(value),
    }
}

/// Applies a parsed patch to `target`, giving the patched object.
///
/// A JSON patch whose operations do not parse is a 400; one that fails to apply (a failed
/// `test`, a missing path) is a 422, as a real API server answers.
pub fn apply_patch(kind: PatchKind, target: &Value, patch: &Value) -> ApiResult<Value> {
    let mut result = target.clone();
    match kind {
        PatchKind::Json => {
            let ops: json_patch::Patch = serde_json::from_value(patch.clone())
                .map_err(|e| ApiError::bad_request(format!("invalid JSON patch: {e}")))?;
            for op in ops.0 {
                // Kubernetes' JSON patch (evanphx/json-patch) lets `test` of `null` pass on a
                // missing path; kube-rs' finalizer helper relies on it.
                if let json_patch::PatchOperation::Test(test) = &op
                    && test.value.is_null()
                    && result.pointer(test.path.as_str()).is_none()
                {
                    continue;
                }
                json_patch::patch(&mut result, &[op]).map_err(|e| {
                    ApiError::invalid(format!("the JSON patch could not be applied: {e}"))
                })?;
            }
        }
        PatchKind::Merge | PatchKind::StrategicMerge | PatchKind::Apply => {
            json_patch::merge(&mut result, patch)
        }
    }
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn content_types() {
        assert_eq!(
            PatchKind::from_content_type("application/merge-patch+json").unwrap(),
            PatchKind::Merge
        );
        assert_eq!(
            PatchKind::from_content_type("application/apply-patch+yaml").unwrap(),
            PatchKind::Apply
        );
        assert_eq!(
            PatchKind::from_content_type("text/plain").unwrap_err().code,
            415
        );
    }

    #[test]
    fn json_patch_test_failure_is_422_and_garbage_is_400() {
        let obj = json!({"metadata": {"finalizers": ["a"]}});
        let ok = json!([{"op": "test", "path": "/metadata/finalizers/0", "value": "a"},
                        {"op": "remove", "path": "/metadata/finalizers/0"}]);
        let patched = apply_patch(PatchKind::Json, &obj, &ok).unwrap();
        assert_eq!(patched, json!({"metadata": {"finalizers": []}}));
        let failing = json!([{"op": "test", "path": "/metadata/finalizers/0", "value": "b"}]);
        assert_eq!(
            apply_patch(PatchKind::Json, &obj, &failing)
                .unwrap_err()
                .code,
            422
        );
        let absent = json!([{"op": "test", "path": "/metadata/labels", "value": null},
                            {"op": "add", "path": "/metadata/labels", "value": {}}]);
        assert_eq!(
            apply_patch(PatchKind::Json, &obj, &absent).unwrap()["metadata"]["labels"],
            json!({})
        );
        let garbage = json!([{"op": "frobnicate"}]);
        assert_eq!(
            apply_patch(PatchKind::Json, &obj, &garbage)
                .unwrap_err()
                .code,
            400
        );
        assert_eq!(
            parse_patch_body(PatchKind::Merge, b"not json")
                .unwrap_err()
                .code,
            400
        );
        assert_eq!(
            parse_patch_body(PatchKind::Json, b"{}").unwrap_err().code,
            400
        );
    }

    #[test]
    fn merge_patch_removes_nulls() {
        let obj = json!({"spec": {"a": 1, "b": 2}});
        let patched = apply_patch(
            PatchKind::Merge,
            &obj,
            &json!({"spec": {"a": null, "c": 3}}),
        )
        .unwrap();
        assert_eq!(patched, json!({"spec": {"b": 2, "c": 3}}));
    }
}
