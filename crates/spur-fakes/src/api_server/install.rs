//! The operator's identity as users install it: `deploy/serviceaccount.yaml` and
//! `deploy/rbac.yaml`, read from the repository and applied into the operator's namespace
//! as `kubectl apply -k deploy/` would (its kustomization sets the namespace), then a token
//! of that ServiceAccount, which is all the operator gets to act with.

use serde::Deserialize;
use serde_json::Value;

use super::{ApiServer, error::ApiError, error::ApiResult};

/// `deploy/rbac.yaml` as the repository holds it.
pub const RBAC_YAML: &str = include_str!("../../../../deploy/rbac.yaml");
/// `deploy/serviceaccount.yaml` as the repository holds it.
pub const SERVICE_ACCOUNT_YAML: &str = include_str!("../../../../deploy/serviceaccount.yaml");
/// The operator's ServiceAccount (the name both manifests use).
pub const OPERATOR_SERVICE_ACCOUNT: &str = "spur-operator";

/// Kinds kustomize's `namespace:` places in the namespace (the others are cluster-scoped).
const NAMESPACED_KINDS: [&str; 3] = ["ServiceAccount", "Role", "RoleBinding"];

/// The objects of a multi-document YAML manifest, the namespaced ones put in `namespace`.
pub fn documents(yaml: &str, namespace: &str) -> ApiResult<Vec<Value>> {
    let mut out = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_str(yaml) {
        let mut obj = Value::deserialize(doc)
            .map_err(|e| ApiError::bad_request(format!("a manifest does not parse: {e}")))?;
        if obj.is_null() {
            continue;
        }
        let kind = obj["kind"].as_str().unwrap_or_default();
        if NAMESPACED_KINDS.contains(&kind) {
            obj["metadata"]["namespace"] = Value::from(namespace);
        }
        out.push(obj);
    }
    Ok(out)
}

/// The objects of `deploy/rbac.yaml`, installed into `namespace`.
pub fn operator_rbac(namespace: &str) -> Vec<Value> {
    documents(RBAC_YAML, namespace).expect("deploy/rbac.yaml parses")
}

/// Applies the operator's ServiceAccount and `rbac` (the objects of `deploy/rbac.yaml`, or
/// a variant of them a test made) into `namespace`, and returns the ServiceAccount's token.
pub fn install_operator_identity(
    api: &ApiServer,
    namespace: &str,
    rbac: Vec<Value>,
) -> ApiResult<String> {
    for obj in documents(SERVICE_ACCOUNT_YAML, namespace)?
        .into_iter()
        .chain(rbac)
    {
        api.create(obj)?;
    }
    api.service_account_token(namespace, OPERATOR_SERVICE_ACCOUNT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_manifests_name_the_namespaced_objects_in_the_namespace_given() {
        let docs = operator_rbac("spur-system");
        let kinds: Vec<(&str, Option<&str>)> = docs
            .iter()
            .map(|d| {
                (
                    d["kind"].as_str().unwrap(),
                    d["metadata"]["namespace"].as_str(),
                )
            })
            .collect();
        assert_eq!(
            kinds,
            [
                ("ClusterRole", None),
                ("ClusterRoleBinding", None),
                ("Role", Some("spur-system")),
                ("RoleBinding", Some("spur-system")),
            ]
        );
    }
}
