//! What a cluster's storage provisioner and ServiceAccount controller do, over the
//! [`ApiServer`] handle: every Pending claim bound to a directory of its own, and a
//! `default` ServiceAccount in every namespace.
//!
//! A claim is bound as a local-path provisioner binds it: `<dir>/<namespace>/<claim>` made,
//! the claim `Bound` with the capacity it requested and `volumeName: pvc-<uid>`. The
//! directory outlives the claim's pods (a StatefulSet's replacement pod finds its data)
//! and goes with the cluster's directory. No PersistentVolume object is made: the kubelet
//! finds the directory from the claim.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};
use spur_fakes::api_server::ApiServer;

/// How often claims and namespaces are looked at.
#[derive(Clone, Debug)]
pub struct ClaimsConfig {
    /// Default 200 ms, the kubelet's sync period: a StatefulSet's pod waits for its claim
    /// about one pass.
    pub period: Duration,
}

impl Default for ClaimsConfig {
    fn default() -> Self {
        Self {
            period: Duration::from_millis(200),
        }
    }
}

/// The directory a claim is bound to.
pub fn claim_dir(dir: &Path, namespace: &str, claim: &str) -> PathBuf {
    dir.join(namespace).join(claim)
}

/// Binds each Pending claim; the claims bound. A claim whose directory cannot be made
/// stays Pending and is named in the error.
pub fn bind_claims(api: &ApiServer, dir: &Path) -> anyhow::Result<Vec<String>> {
    let mut bound = Vec::new();
    for claim in api.list("v1", "PersistentVolumeClaim")? {
        if claim["status"]["phase"] == "Bound" {
            continue;
        }
        let (ns, name) = (
            text(&claim["metadata"]["namespace"]),
            text(&claim["metadata"]["name"]),
        );
        let path = claim_dir(dir, ns, name);
        std::fs::create_dir_all(&path)
            .map_err(|e| anyhow::anyhow!("claim {ns}/{name}: {}: {e}", path.display()))?;
        let capacity = claim["spec"]["resources"]["requests"]["storage"].clone();
        let uid = text(&claim["metadata"]["uid"]);
        api.merge_patch(
            "v1",
            "PersistentVolumeClaim",
            Some(ns),
            name,
            &json!({"spec": {"volumeName": format!("pvc-{uid}")}}),
            false,
        )?;
        let modes = claim["spec"]["accessModes"].clone();
        let status = json!({"status": {"phase": "Bound", "capacity": {"storage": capacity}, "accessModes": modes}});
        api.merge_patch("v1", "PersistentVolumeClaim", Some(ns), name, &status, true)?;
        bound.push(format!("{ns}/{name}"));
    }
    Ok(bound)
}

/// Creates the `default` ServiceAccount of every namespace that lacks one, as the
/// controller manager does; the namespaces given one.
pub fn default_service_accounts(api: &ApiServer) -> anyhow::Result<Vec<String>> {
    let accounts = api.list("v1", "ServiceAccount")?;
    let mut made = Vec::new();
    for namespace in api.list("v1", "Namespace")? {
        let ns = text(&namespace["metadata"]["name"]);
        let has = accounts
            .iter()
            .any(|a| a["metadata"]["namespace"] == ns && a["metadata"]["name"] == "default");
        if has || namespace["metadata"]["deletionTimestamp"].is_string() {
            continue;
        }
        api.create(json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": "default", "namespace": ns}}))?;
        made.push(ns.to_owned());
    }
    Ok(made)
}

fn text(value: &Value) -> &str {
    value.as_str().unwrap_or_default()
}

/// Both passes for ever, each `config.period`; a failed pass is reported once until it
/// changes, and tried again at the next period.
pub async fn run_claims(api: ApiServer, dir: PathBuf, config: ClaimsConfig) {
    let pass = || bind_claims(&api, &dir).and_then(|_| default_service_accounts(&api));
    super::every(config.period, "cluster storage", pass).await;
}

#[cfg(test)]
mod tests {
    use spur_fakes::api_server::ApiServerConfig;

    use super::*;

    #[test]
    fn a_pending_claim_is_bound_to_its_directory_and_namespaces_get_a_default_account() {
        let api = ApiServer::new(ApiServerConfig::default());
        api.create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "spur"}}))
            .expect("namespace");
        api.create(json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "spool-spurctld-0", "namespace": "spur"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}))
            .expect("claim");
        let dir = std::env::temp_dir().join(format!("spur-claims-{}", std::process::id()));
        assert_eq!(
            bind_claims(&api, &dir).expect("bind"),
            vec!["spur/spool-spurctld-0"]
        );
        assert!(dir.join("spur/spool-spurctld-0").is_dir());
        let claim = api
            .get(
                "v1",
                "PersistentVolumeClaim",
                Some("spur"),
                "spool-spurctld-0",
            )
            .expect("get");
        assert_eq!(claim["status"]["phase"], "Bound");
        assert_eq!(claim["status"]["capacity"]["storage"], "1Gi");
        assert!(
            claim["spec"]["volumeName"]
                .as_str()
                .is_some_and(|v| v.starts_with("pvc-"))
        );
        assert!(
            bind_claims(&api, &dir).expect("again").is_empty(),
            "a bound claim stays"
        );
        let made = default_service_accounts(&api).expect("accounts");
        assert!(made.contains(&"spur".to_owned()), "{made:?}");
        assert!(default_service_accounts(&api).expect("again").is_empty());
        std::fs::remove_dir_all(&dir).expect("clean up");
    }
}
