//! Pods left by SpurJobs deleted while no operator replica was acting.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams};
use kube::runtime::reflector::Store;
use kube::{Api, ResourceExt};

use super::{LABEL_MANAGED_BY, LABEL_SPURJOB_UID, MANAGED_BY, SpurJob};

/// Deletes the pods the operator made for SpurJobs that no longer exist (deleted while no
/// replica was acting, so no finalizer ran). Runs once the SpurJob store is complete.
pub async fn delete_orphans(kube: kube::Client, store: Store<SpurJob>) {
    if store.wait_until_ready().await.is_err() {
        return;
    }
    let live: std::collections::BTreeSet<String> =
        store.state().iter().filter_map(|job| job.uid()).collect();
    let pods: Api<Pod> = Api::all(kube.clone());
    let selector = format!("{LABEL_MANAGED_BY}={MANAGED_BY}");
    let listed = match pods.list(&ListParams::default().labels(&selector)).await {
        Ok(listed) => listed,
        Err(e) => {
            tracing::warn!(error = %e, "could not list pods to find orphans");
            return;
        }
    };
    for pod in listed {
        let owner = pod
            .labels()
            .get(LABEL_SPURJOB_UID)
            .cloned()
            .unwrap_or_default();
        if live.contains(&owner) {
            continue;
        }
        let namespaced: Api<Pod> =
            Api::namespaced(kube.clone(), &pod.namespace().unwrap_or_default());
        match namespaced
            .delete(&pod.name_any(), &DeleteParams::default())
            .await
        {
            Ok(_) => tracing::info!(pod = %pod.name_any(), "deleted an orphaned job pod"),
            Err(e) => {
                tracing::warn!(pod = %pod.name_any(), error = %e, "could not delete an orphaned pod")
            }
        }
    }
}
