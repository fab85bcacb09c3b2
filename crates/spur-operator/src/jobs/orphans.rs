//! Pods left by SpurJobs deleted while no operator replica was acting.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams};
use kube::runtime::reflector::Store;
use kube::{Api, ResourceExt};

use super::{LABEL_SPURJOB_UID, SpurJob, managed_selector};

/// The pods orphan cleanup may look at: under either `managed-by` value, and carrying the
/// SpurJob-UID label. The `managed-by` value alone no longer tells our pods from upstream's
/// (we write upstream's value), but only this operator ever writes the UID label, so an
/// upstream pod whose job was adopted after a swap is never listed, let alone deleted.
pub fn orphan_selector() -> String {
    format!("{},{LABEL_SPURJOB_UID}", managed_selector())
}

/// Whether `pod` is an orphan: it names, by its UID label, a SpurJob not among `live`. A pod
/// without the label, or with an empty one, is not ours to judge, whatever selected it.
pub fn is_orphan(pod: &Pod, live: &BTreeSet<String>) -> bool {
    pod.labels()
        .get(LABEL_SPURJOB_UID)
        .is_some_and(|owner| !owner.is_empty() && !live.contains(owner))
}

/// Deletes the pods the operator made for SpurJobs that no longer exist (deleted while no
/// replica was acting, so no finalizer ran). Runs once the SpurJob store is complete.
pub async fn delete_orphans(kube: kube::Client, store: Store<SpurJob>) {
    if store.wait_until_ready().await.is_err() {
        return;
    }
    let live: BTreeSet<String> = store.state().iter().filter_map(|job| job.uid()).collect();
    let pods: Api<Pod> = Api::all(kube.clone());
    let selector = orphan_selector();
    let listed = match pods.list(&ListParams::default().labels(&selector)).await {
        Ok(listed) => listed,
        Err(e) => {
            tracing::warn!(error = %e, "could not list pods to find orphans");
            return;
        }
    };
    for pod in listed.into_iter().filter(|pod| is_orphan(pod, &live)) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Selector;
    use crate::jobs::{LABEL_JOB_ID, LABEL_MANAGED_BY, MANAGED_BY, MANAGED_BY_EARLIER};

    fn pod(labels: &[(&str, &str)]) -> Pod {
        let mut pod = Pod::default();
        pod.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        );
        pod
    }

    #[test]
    fn only_pods_carrying_a_dead_spurjobs_uid_are_orphans_never_upstreams() {
        let selector = Selector::parse(&orphan_selector()).expect("a selector");
        let live: BTreeSet<String> = ["uid-live".to_owned()].into();
        let gone = (LABEL_SPURJOB_UID, "uid-gone");
        // (labels, deleted)
        let cases: [(&[(&str, &str)], bool); 6] = [
            // Ours, of a deleted SpurJob, under the value written now and the earlier one.
            (&[(LABEL_MANAGED_BY, MANAGED_BY), gone], true),
            (&[(LABEL_MANAGED_BY, MANAGED_BY_EARLIER), gone], true),
            // Ours, of a live SpurJob.
            (
                &[
                    (LABEL_MANAGED_BY, MANAGED_BY),
                    (LABEL_SPURJOB_UID, "uid-live"),
                ],
                false,
            ),
            // Upstream's pod of an adopted job: the same managed-by value, no UID label.
            (
                &[(LABEL_MANAGED_BY, MANAGED_BY), (LABEL_JOB_ID, "7")],
                false,
            ),
            (
                &[(LABEL_MANAGED_BY, MANAGED_BY), (LABEL_SPURJOB_UID, "")],
                false,
            ),
            // Another tool's pod that happens to carry the UID label.
            (&[(LABEL_MANAGED_BY, "other"), gone], false),
        ];
        for (labels, deleted) in cases {
            let p = pod(labels);
            let listed = selector.matches(p.metadata.labels.as_ref().expect("labels"));
            assert_eq!(listed && is_orphan(&p, &live), deleted, "{labels:?}");
        }
    }
}
