//! The ReplicaSet controller: keeps `spec.replicas` active pods (named `<rs>-<5 chars>`,
//! from the store's seeded `generateName`) controlled by each ReplicaSet, and reports
//! their counts in its status.

use std::cmp::Reverse;

use serde_json::{Value, json};

use super::common::{
    deleting, name, namespace, owned_by, pod_active, pod_from_template, pod_ready,
    selector_matches, spec_replicas,
};
use super::schedule::Scheduler;
use crate::api_server::ApiServer;

/// One pass over every ReplicaSet.
pub fn reconcile_all(api: &ApiServer, scheduler: &mut Scheduler) {
    let (Ok(sets), Ok(pods)) = (api.list("apps/v1", "ReplicaSet"), api.list("v1", "Pod")) else {
        return;
    };
    for rs in sets.iter().filter(|rs| !deleting(rs)) {
        reconcile(api, scheduler, rs, &pods);
    }
}

fn reconcile(api: &ApiServer, scheduler: &mut Scheduler, rs: &Value, pods: &[Value]) {
    let mut active: Vec<&Value> = owned_by(pods, rs)
        .into_iter()
        .filter(|p| pod_active(p))
        .collect();
    let want = spec_replicas(rs).max(0) as usize;
    if active.len() < want {
        for _ in active.len()..want {
            let mut pod = pod_from_template(&rs["spec"]["template"], rs, &json!({}));
            pod["metadata"]["generateName"] = json!(format!("{}-", name(rs)));
            scheduler.place(api, &mut pod);
            let _ = api.create(pod);
        }
    } else if active.len() > want {
        // Unbound first, then not Ready, then the newest: what a real ReplicaSet gives up.
        active.sort_by_key(|p| {
            (
                p["spec"]["nodeName"].is_string(),
                pod_ready(p),
                Reverse(
                    p["metadata"]["creationTimestamp"]
                        .as_str()
                        .unwrap_or_default(),
                ),
                Reverse(name(p)),
            )
        });
        for pod in &active[..active.len() - want] {
            let _ = api.delete("v1", "Pod", Some(namespace(pod)), name(pod));
        }
        active.drain(..active.len() - want);
    }
    write_status(api, rs, &active);
}

fn write_status(api: &ApiServer, rs: &Value, active: &[&Value]) {
    let ready = active.iter().filter(|p| pod_ready(p)).count();
    let labelled = active
        .iter()
        .filter(|p| selector_matches(&rs["spec"]["selector"], &p["metadata"]["labels"]))
        .count();
    let status = json!({"status": {
        "replicas": active.len(),
        "fullyLabeledReplicas": labelled,
        "readyReplicas": ready,
        "availableReplicas": ready,
        "observedGeneration": rs["metadata"]["generation"],
    }});
    let _ = api.merge_patch(
        "apps/v1",
        "ReplicaSet",
        Some(namespace(rs)),
        name(rs),
        &status,
        true,
    );
}
