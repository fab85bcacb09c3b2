//! The Deployment controller: one ReplicaSet per pod template (`<deploy>-<pod-template-hash>`,
//! the hash also labelling its selector and pods), scaled by the strategy: `RollingUpdate`
//! (`maxSurge` 25% rounded up and `maxUnavailable` 25% rounded down by default: new pods
//! first, old ones scaled away as new ones become available) or `Recreate`. Old
//! ReplicaSets at zero beyond `revisionHistoryLimit` (10) are deleted.

use serde_json::{Value, json};

use super::common::{
    condition, controller_ref, deleting, int_or_percent, name, namespace, owned_by, spec_replicas,
    status_count, template_hash,
};
use crate::api_server::ApiServer;
use crate::clock::Clock;

pub const HASH_LABEL: &str = "pod-template-hash";
const REVISION: &str = "deployment.kubernetes.io/revision";

/// One pass over every Deployment.
pub fn reconcile_all(api: &ApiServer, clock: &Clock) {
    let (Ok(deploys), Ok(sets)) = (
        api.list("apps/v1", "Deployment"),
        api.list("apps/v1", "ReplicaSet"),
    ) else {
        return;
    };
    for d in deploys.iter().filter(|d| !deleting(d)) {
        reconcile(api, clock, d, &sets);
    }
}

fn reconcile(api: &ApiServer, clock: &Clock, d: &Value, sets: &[Value]) {
    let owned = owned_by(sets, d);
    let hash = template_hash(&d["spec"]["template"]);
    let found = owned
        .iter()
        .find(|rs| rs["metadata"]["labels"][HASH_LABEL] == hash.as_str());
    let new_rs = match found {
        Some(rs) => (*rs).clone(),
        None => match create_replicaset(api, d, &hash, &owned) {
            Ok(rs) => rs,
            Err(_) => return,
        },
    };
    let mut olds: Vec<&Value> = owned
        .into_iter()
        .filter(|rs| name(rs) != name(&new_rs))
        .collect();
    olds.sort_by_key(|rs| revision(rs));
    let replicas = spec_replicas(d).max(0);
    if d["spec"]["paused"] != true {
        if d["spec"]["strategy"]["type"] == "Recreate" {
            recreate(api, &new_rs, &olds, replicas);
        } else {
            rolling(api, d, &new_rs, &olds, replicas);
        }
        clean_up(api, d, &olds);
    }
    write_status(api, clock, d, &new_rs, &olds);
}

fn revision(rs: &Value) -> i64 {
    rs["metadata"]["annotations"][REVISION]
        .as_str()
        .and_then(|r| r.parse().ok())
        .unwrap_or(0)
}

fn create_replicaset(
    api: &ApiServer,
    d: &Value,
    hash: &str,
    owned: &[&Value],
) -> Result<Value, ()> {
    let mut template = d["spec"]["template"].clone();
    template["metadata"]["labels"][HASH_LABEL] = json!(hash);
    let mut selector = d["spec"]["selector"].clone();
    selector["matchLabels"][HASH_LABEL] = json!(hash);
    let next_revision = owned.iter().map(|rs| revision(rs)).max().unwrap_or(0) + 1;
    let rs = json!({
        "apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {
            "name": format!("{}-{hash}", name(d)), "namespace": namespace(d),
            "labels": template["metadata"]["labels"],
            "annotations": {REVISION: next_revision.to_string()},
            "ownerReferences": [controller_ref(d)],
        },
        "spec": {"replicas": 0, "selector": selector, "template": template,
            "minReadySeconds": d["spec"]["minReadySeconds"].as_i64().unwrap_or(0)},
    });
    api.create(rs).map_err(|_| ())
}

fn scale(api: &ApiServer, rs: &Value, replicas: i64) {
    if spec_replicas(rs) != replicas {
        let patch = json!({"spec": {"replicas": replicas}});
        let _ = api.merge_patch(
            "apps/v1",
            "ReplicaSet",
            Some(namespace(rs)),
            name(rs),
            &patch,
            false,
        );
    }
}

/// `(maxSurge, maxUnavailable)` for `replicas`; both zero would stall, so unavailable is 1.
fn rolling_limits(d: &Value, replicas: i64) -> (i64, i64) {
    let params = &d["spec"]["strategy"]["rollingUpdate"];
    let surge = int_or_percent(&params["maxSurge"], replicas, "25%", true);
    let unavailable = int_or_percent(&params["maxUnavailable"], replicas, "25%", false);
    if surge == 0 && unavailable == 0 {
        (0, 1)
    } else {
        (surge, unavailable)
    }
}

fn rolling(api: &ApiServer, d: &Value, new_rs: &Value, olds: &[&Value], replicas: i64) {
    let (surge, max_unavailable) = rolling_limits(d, replicas);
    let old_total: i64 = olds.iter().map(|rs| spec_replicas(rs)).sum();
    let current = spec_replicas(new_rs);
    let room = (replicas + surge - current - old_total).max(0);
    let target = if old_total == 0 || current >= replicas {
        replicas
    } else {
        current + room.min(replicas - current)
    };
    scale(api, new_rs, target);
    // Old replicas go as far as availability allows: first their unavailable pods, then
    // available ones while the available total stays at replicas - maxUnavailable.
    let min_available = replicas - max_unavailable;
    let new_unavailable = target - status_count(new_rs, "availableReplicas");
    let mut cleanup = (target + old_total - min_available - new_unavailable).max(0);
    let mut available: i64 = status_count(new_rs, "availableReplicas")
        + olds
            .iter()
            .map(|rs| status_count(rs, "availableReplicas"))
            .sum::<i64>();
    let mut sizes: Vec<i64> = olds.iter().map(|rs| spec_replicas(rs)).collect();
    for (rs, size) in olds.iter().zip(sizes.iter_mut()) {
        let unhealthy = (*size - status_count(rs, "availableReplicas")).max(0);
        let cut = unhealthy.min(cleanup);
        cleanup -= cut;
        *size -= cut;
    }
    for (rs, size) in olds.iter().zip(sizes.iter_mut()) {
        let cut = (available - min_available).max(0).min(*size);
        available -= cut;
        *size -= cut;
        scale(api, rs, *size);
    }
}

fn recreate(api: &ApiServer, new_rs: &Value, olds: &[&Value], replicas: i64) {
    for rs in olds {
        scale(api, rs, 0);
    }
    if olds
        .iter()
        .all(|rs| status_count(rs, "replicas") == 0 && spec_replicas(rs) == 0)
    {
        scale(api, new_rs, replicas);
    }
}

/// Deletes the oldest ReplicaSets at zero beyond `revisionHistoryLimit`.
fn clean_up(api: &ApiServer, d: &Value, olds: &[&Value]) {
    let limit = d["spec"]["revisionHistoryLimit"]
        .as_i64()
        .unwrap_or(10)
        .max(0) as usize;
    let idle: Vec<&&Value> = olds
        .iter()
        .filter(|rs| spec_replicas(rs) == 0 && status_count(rs, "replicas") == 0)
        .collect();
    for rs in idle.iter().take(idle.len().saturating_sub(limit)) {
        let _ = api.delete("apps/v1", "ReplicaSet", Some(namespace(rs)), name(rs));
    }
}

fn write_status(api: &ApiServer, clock: &Clock, d: &Value, new_rs: &Value, olds: &[&Value]) {
    let all: Vec<&Value> = std::iter::once(new_rs)
        .chain(olds.iter().copied())
        .collect();
    let sum = |field: &str| all.iter().map(|rs| status_count(rs, field)).sum::<i64>();
    let (total, ready, available) = (
        sum("replicas"),
        sum("readyReplicas"),
        sum("availableReplicas"),
    );
    let updated = status_count(new_rs, "replicas");
    let replicas = spec_replicas(d).max(0);
    let (_, max_unavailable) = rolling_limits(d, replicas);
    let previous = &d["status"]["conditions"];
    let enough = available >= replicas - max_unavailable;
    let (why, what) = if enough {
        (
            "MinimumReplicasAvailable",
            "Deployment has minimum availability.",
        )
    } else {
        (
            "MinimumReplicasUnavailable",
            "Deployment does not have minimum availability.",
        )
    };
    let done = updated == replicas && total == replicas && available == replicas;
    let progress = if done {
        (
            "NewReplicaSetAvailable",
            format!(
                "ReplicaSet \"{}\" has successfully progressed.",
                name(new_rs)
            ),
        )
    } else {
        (
            "ReplicaSetUpdated",
            format!("ReplicaSet \"{}\" is progressing.", name(new_rs)),
        )
    };
    let status = json!({"status": {
        "observedGeneration": d["metadata"]["generation"],
        "replicas": total, "updatedReplicas": updated, "readyReplicas": ready,
        "availableReplicas": available, "unavailableReplicas": (replicas - available).max(0),
        "conditions": [
            condition(previous, "Available", enough, why, what, clock),
            condition(previous, "Progressing", true, progress.0, &progress.1, clock),
        ],
    }});
    let _ = api.merge_patch(
        "apps/v1",
        "Deployment",
        Some(namespace(d)),
        name(d),
        &status,
        true,
    );
}
