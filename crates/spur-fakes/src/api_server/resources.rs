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
    use ResourceType as R;
    vec![
        R::builtin("", "v1", "Namespace", "namespaces", &["ns"], false, true),
        R::builtin("", "v1", "Node", "nodes", &["no"], false, true),
        R::builtin("", "v1", "Pod", "pods", &["po"], true, true),
        R::builtin("", "v1", "Service", "services", &["svc"], true, true),
        R::builtin("", "v1", "ConfigMap", "configmaps", &["cm"], true, false),
        R::builtin("", "v1", "Event", "events", &["ev"], true, false),
        R::builtin(
            "events.k8s.io",
            "v1",
            "Event",
            "events",
            &["ev"],
            true,
            false,
        ),
        R::builtin(
            "coordination.k8s.io",
            "v1",
            "Lease",
            "leases",
            &[],
            true,
            false,
        ),
        // What deploy/ and deploy/sim-sweep/ hold, so `kubectl apply -k` works against
        // this server: stored and served like any object, with no controller behind them.
        R::builtin(
            "",
            "v1",
            "ServiceAccount",
            "serviceaccounts",
            &["sa"],
            true,
            false,
        ),
        R::builtin(
            "apps",
            "v1",
            "Deployment",
            "deployments",
            &["deploy"],
            true,
            true,
        ),
        R::builtin("batch", "v1", "Job", "jobs", &[], true, true),
        R::builtin(
            "policy",
            "v1",
            "PodDisruptionBudget",
            "poddisruptionbudgets",
            &["pdb"],
            true,
            true,
        ),
        R::builtin(
            "networking.k8s.io",
            "v1",
            "NetworkPolicy",
            "networkpolicies",
            &["netpol"],
            true,
            false,
        ),
        R::builtin(
            "rbac.authorization.k8s.io",
            "v1",
            "ClusterRole",
            "clusterroles",
            &[],
            false,
            false,
        ),
        R::builtin(
            "rbac.authorization.k8s.io",
            "v1",
            "ClusterRoleBinding",
            "clusterrolebindings",
            &[],
            false,
            false,
        ),
        R::builtin(
            "rbac.authorization.k8s.io",
            "v1",
            "Role",
            "roles",
            &[],
            true,
            false,
        ),
        R::builtin(
            "rbac.authorization.k8s.io",
            "v1",
            "RoleBinding",
            "rolebindings",
            &[],
            true,
            false,
        ),
        R::builtin(
            "apiextensions.k8s.io",
            "v1",
            "CustomResourceDefinition",
            "customresourcedefinitions",
            &["crd", "crds"],
            false,
            true,
        ),
    ]
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
    fn crd_with_wrong_name_is_invalid() {
        let crd = json!({"metadata": {"name": "x"}, "spec": {"group": "g", "scope": "Cluster",
            "names": {"kind": "K", "plural": "ks"}, "versions": [{"name": "v1", "served": true}]}});
        assert_eq!(types_from_crd(&crd).unwrap_err().code, 422);
    }
}
