//! The kinds the API server serves: built-in ones, and any CRD once applied.

use serde_json::Value;

use super::error::{ApiError, ApiResult};

/// Identifies a served resource: API group (empty for the core group), version, plural.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ResourceKey {
    /// API group, `""` for the core group.
    pub group: String,
    /// API version within the group.
    pub version: String,
    /// Lower-case plural name, as in the URL path.
    pub plural: String,
}

/// What the server knows about one served resource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourceType {
    /// API group, `""` for the core group.
    pub group: String,
    /// API version within the group.
    pub version: String,
    /// Kind, as in the objects' `kind`.
    pub kind: String,
    /// Plural, as in the URL path.
    pub plural: String,
    /// Singular name, for discovery.
    pub singular: String,
    /// Short names kubectl accepts (`no`, `po`, ...).
    pub short_names: Vec<String>,
    /// Namespaced (`/namespaces/{ns}/...`) or cluster-scoped.
    pub namespaced: bool,
    /// Has a `status` subresource: the main path keeps the stored status and only
    /// `.../status` changes it.
    pub status_subresource: bool,
    /// Defined by a CustomResourceDefinition (status is dropped on create, as for CRs).
    pub custom: bool,
    /// A CRD version's `additionalPrinterColumns`: what `kubectl get` shows after the name.
    pub printer_columns: Vec<PrinterColumn>,
}

/// One of a CRD version's `additionalPrinterColumns`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrinterColumn {
    pub name: String,
    /// `string`, `integer`, `date`, ...
    pub type_: String,
    /// A simple JSONPath (`.status.state`): dotted field names only.
    pub json_path: String,
    /// 0: shown by default; more: with `-o wide`.
    pub priority: u64,
}

impl ResourceType {
    fn builtin(
        group: &str,
        version: &str,
        kind: &str,
        plural: &str,
        short: &[&str],
        namespaced: bool,
        status: bool,
    ) -> Self {
        Self {
            group: group.to_owned(),
            version: version.to_owned(),
            kind: kind.to_owned(),
            plural: plural.to_owned(),
            singular: kind.to_lowercase(),
            short_names: short.iter().map(|s| (*s).to_owned()).collect(),
            namespaced,
            status_subresource: status,
            custom: false,
            printer_columns: Vec::new(),
        }
    }

    /// Key under which the store keeps this resource's objects.
    pub fn key(&self) -> ResourceKey {
        ResourceKey {
            group: self.group.clone(),
            version: self.version.clone(),
            plural: self.plural.clone(),
        }
    }

    /// `apiVersion` of the objects: `v1` or `group/version`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// Group-qualified plural, as error messages name it (`leases.coordination.k8s.io`).
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.clone()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }
}

/// The kinds every server starts with.
pub fn builtin_types() -> Vec<ResourceType> {
    BUILTIN
        .iter()
        .map(
            |&(group, version, kind, plural, short, namespaced, status)| {
                ResourceType::builtin(group, version, kind, plural, short, namespaced, status)
            },
        )
        .collect()
}

/// Group, version, kind, plural, short names, namespaced, status subresource: one kind a
/// line, so the table reads like `kubectl api-resources`.
type Builtin = (
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    &'static [&'static str],
    bool,
    bool,
);

#[rustfmt::skip]
const BUILTIN: &[Builtin] = &[
    ("", "v1", "Namespace", "namespaces", &["ns"], false, true),
    ("", "v1", "Node", "nodes", &["no"], false, true),
    ("", "v1", "Pod", "pods", &["po"], true, true),
    ("", "v1", "Service", "services", &["svc"], true, true),
    ("", "v1", "ConfigMap", "configmaps", &["cm"], true, false),
    ("", "v1", "Event", "events", &["ev"], true, false),
    ("events.k8s.io", "v1", "Event", "events", &["ev"], true, false),
    ("coordination.k8s.io", "v1", "Lease", "leases", &[], true, false),
    // What deploy/ and deploy/sim-sweep/ hold, so `kubectl apply -k` works against
    // this server: stored and served like any object, with no controller behind them.
    ("", "v1", "ServiceAccount", "serviceaccounts", &["sa"], true, false),
    ("apps", "v1", "Deployment", "deployments", &["deploy"], true, true),
    ("batch", "v1", "Job", "jobs", &[], true, true),
    // The workloads the controllers in `crate::workloads` run (none runs unless spawned).
    ("", "v1", "Secret", "secrets", &[], true, false),
    ("", "v1", "PersistentVolumeClaim", "persistentvolumeclaims", &["pvc"], true, true),
    ("apps", "v1", "ReplicaSet", "replicasets", &["rs"], true, true),
    ("apps", "v1", "StatefulSet", "statefulsets", &["sts"], true, true),
    ("discovery.k8s.io", "v1", "EndpointSlice", "endpointslices", &[], true, false),
    ("policy", "v1", "PodDisruptionBudget", "poddisruptionbudgets", &["pdb"], true, true),
    ("networking.k8s.io", "v1", "NetworkPolicy", "networkpolicies", &["netpol"], true, false),
    ("rbac.authorization.k8s.io", "v1", "ClusterRole", "clusterroles", &[], false, false),
    ("rbac.authorization.k8s.io", "v1", "ClusterRoleBinding", "clusterrolebindings", &[], false, false),
    ("rbac.authorization.k8s.io", "v1", "Role", "roles", &[], true, false),
    ("rbac.authorization.k8s.io", "v1", "RoleBinding", "rolebindings", &[], true, false),
    ("apiextensions.k8s.io", "v1", "CustomResourceDefinition", "customresourcedefinitions", &["crd", "crds"], false, true),
];

/// The label Kubernetes (1.21 and later) keeps on every Namespace, its name, so a
/// NetworkPolicy's namespaceSelector can pick a namespace by name.
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// What the real API server does to an object of some kinds before storing it, on create
/// and update alike: a Secret's `stringData` is merged into `data` (base64, winning over
/// `data`'s same keys) and never stored, its `type` defaults to `Opaque`, and each `data`
/// value must be base64 (422 otherwise); a Namespace is labelled with its name
/// ([`NAMESPACE_NAME_LABEL`]), whatever the write said of that label.
pub fn normalize(rt: &ResourceType, obj: &mut Value) -> ApiResult<()> {
    if rt.group.is_empty() && rt.kind == "Secret" {
        normalize_secret(obj)?;
    }
    if rt.group.is_empty() && rt.kind == "Namespace" {
        label_namespace_with_its_name(obj);
    }
    Ok(())
}

fn label_namespace_with_its_name(obj: &mut Value) {
    let Some(name) = obj["metadata"]["name"].as_str().map(str::to_owned) else {
        return;
    };
    let meta = &mut obj["metadata"];
    if !meta["labels"].is_object() {
        meta["labels"] = Value::Object(serde_json::Map::new());
    }
    meta["labels"][NAMESPACE_NAME_LABEL] = Value::String(name);
}

fn normalize_secret(obj: &mut Value) -> ApiResult<()> {
    let Some(fields) = obj.as_object_mut() else {
        return Ok(());
    };
    let string_data = fields.remove("stringData");
    if fields.get("data").is_none_or(Value::is_null) {
        fields.insert("data".into(), Value::Object(serde_json::Map::new()));
    }
    let data = fields["data"]
        .as_object_mut()
        .ok_or_else(|| ApiError::invalid("Secret is invalid: data: must be a map"))?;
    for (key, value) in data.iter() {
        if value.as_str().and_then(base64_decode).is_none() {
            return Err(ApiError::invalid(format!(
                "Secret is invalid: data[{key}]: Invalid value: must be base64-encoded bytes"
            )));
        }
    }
    if let Some(Value::Object(strings)) = string_data {
        for (key, value) in strings {
            let text = value.as_str().unwrap_or_default();
            data.insert(key, Value::String(base64_encode(text.as_bytes())));
        }
    }
    if data.is_empty() {
        fields.remove("data");
    }
    if fields
        .get("type")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        fields.insert("type".into(), Value::String("Opaque".into()));
    }
    Ok(())
}

const BASE64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 with padding, as a Secret's `data` holds it.
pub fn base64_encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(BASE64[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Decodes standard padded base64; `None` when `text` is not that.
pub fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let bytes = text.as_bytes();
    if !bytes.len().is_multiple_of(4) {
        return None;
    }
    let mut out = Vec::with_capacity(bytes.len() / 4 * 3);
    for (index, chunk) in bytes.chunks(4).enumerate() {
        let last = index + 1 == bytes.len() / 4;
        let pad = chunk.iter().rev().take_while(|b| **b == b'=').count();
        if pad > 2 || (pad > 0 && !last) {
            return None;
        }
        let mut n = 0u32;
        for (i, b) in chunk[..4 - pad].iter().enumerate() {
            let v = BASE64.iter().position(|c| c == b)? as u32;
            n |= v << (18 - 6 * i);
        }
        out.extend((0..3 - pad).map(|i| (n >> (16 - 8 * i)) as u8));
    }
    Some(out)
}

/// The resources a CustomResourceDefinition serves, one per served version.
pub fn types_from_crd(crd: &Value) -> ApiResult<Vec<ResourceType>> {
    let spec = &crd["spec"];
    let text = |v: &Value, what: &str| -> ApiResult<String> {
        v.as_str()
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .ok_or_else(|| {
                ApiError::invalid(format!("CustomResourceDefinition: {what} is required"))
            })
    };
    let group = text(&spec["group"], "spec.group")?;
    let names = &spec["names"];
    let kind = text(&names["kind"], "spec.names.kind")?;
    let plural = text(&names["plural"], "spec.names.plural")?;
    let singular = names["singular"]
        .as_str()
        .map_or_else(|| kind.to_lowercase(), str::to_owned);
    let short_names: Vec<String> = names["shortNames"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    let namespaced = crd_namespaced(spec)?;
    let expected_name = format!("{plural}.{group}");
    if crd["metadata"]["name"].as_str() != Some(expected_name.as_str()) {
        return Err(ApiError::invalid(format!(
            "CustomResourceDefinition: metadata.name must be {expected_name}"
        )));
    }
    let versions = spec["versions"]
        .as_array()
        .filter(|v| !v.is_empty())
        .ok_or_else(|| {
            ApiError::invalid(
                "CustomResourceDefinition: spec.versions must list at least one version",
            )
        })?;
    let mut types = Vec::new();
    for version in versions {
        if version["served"].as_bool() == Some(false) {
            continue;
        }
        types.push(ResourceType {
            group: group.clone(),
            version: text(&version["name"], "spec.versions[].name")?,
            kind: kind.clone(),
            plural: plural.clone(),
            singular: singular.clone(),
            short_names: short_names.clone(),
            namespaced,
            status_subresource: version["subresources"]["status"].is_object(),
            custom: true,
            printer_columns: printer_columns(version),
        });
    }
    Ok(types)
}

/// Whether a CRD's `spec.scope` makes its objects namespaced; 422 for another scope.
fn crd_namespaced(spec: &Value) -> ApiResult<bool> {
    match spec["scope"].as_str() {
        Some("Namespaced") => Ok(true),
        Some("Cluster") => Ok(false),
        other => Err(ApiError::invalid(format!(
            "CustomResourceDefinition: spec.scope {other:?} is not Namespaced or Cluster"
        ))),
    }
}

/// A CRD version's `additionalPrinterColumns`, skipping any without a name or path.
fn printer_columns(version: &Value) -> Vec<PrinterColumn> {
    version["additionalPrinterColumns"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| {
            Some(PrinterColumn {
                name: c["name"].as_str()?.to_owned(),
                type_: c["type"].as_str().unwrap_or("string").to_owned(),
                json_path: c["jsonPath"].as_str()?.to_owned(),
                priority: c["priority"].as_u64().unwrap_or(0),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn crd_yields_its_served_versions() {
        let crd = json!({
            "metadata": {"name": "spurjobs.spur.amd.com"},
            "spec": {
                "group": "spur.amd.com",
                "scope": "Namespaced",
                "names": {"kind": "SpurJob", "plural": "spurjobs", "shortNames": ["sj"]},
                "versions": [
                    {"name": "v1alpha1", "served": true, "subresources": {"status": {}}},
                    {"name": "v0", "served": false},
                ],
            }
        });
        let types = types_from_crd(&crd).unwrap();
        assert_eq!(types.len(), 1);
        assert_eq!(types[0].api_version(), "spur.amd.com/v1alpha1");
        assert_eq!(types[0].qualified(), "spurjobs.spur.amd.com");
        assert!(types[0].status_subresource && types[0].namespaced && types[0].custom);
        assert_eq!(types[0].short_names, vec!["sj"]);
    }

    #[test]
    fn base64_round_trips() {
        for text in ["", "a", "ab", "abc", "hello", "s3cr3t!\n"] {
            let encoded = base64_encode(text.as_bytes());
            assert_eq!(base64_decode(&encoded).unwrap(), text.as_bytes());
        }
        assert_eq!(base64_encode(b"hello"), "aGVsbG8=");
        assert!(base64_decode("a=bc").is_none() && base64_decode("abc").is_none());
    }

    #[test]
    fn secret_string_data_goes_into_data() {
        let rt = builtin_types()
            .into_iter()
            .find(|t| t.kind == "Secret")
            .unwrap();
        let mut s = json!({"data": {"a": "eA=="}, "stringData": {"a": "y", "b": "hello"}});
        normalize(&rt, &mut s).unwrap();
        assert_eq!(
            s,
            json!({"data": {"a": "eQ==", "b": "aGVsbG8="}, "type": "Opaque"})
        );
        let mut bad = json!({"data": {"a": "not base64"}});
        assert_eq!(normalize(&rt, &mut bad).unwrap_err().code, 422);
    }

    #[test]
    fn crd_with_wrong_name_is_invalid() {
        let crd = json!({"metadata": {"name": "x"}, "spec": {"group": "g", "scope": "Cluster",
            "names": {"kind": "K", "plural": "ks"}, "versions": [{"name": "v1", "served": true}]}});
        assert_eq!(types_from_crd(&crd).unwrap_err().code, 422);
    }
}
