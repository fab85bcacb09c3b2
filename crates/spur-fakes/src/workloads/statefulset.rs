//! The StatefulSet controller: pods `<sts>-<ordinal>` with stable names, hostnames
//! (`spec.hostname`, `spec.subdomain` = `spec.serviceName`) and claims.
//!
//! - `podManagementPolicy: OrderedReady` (the default): ordinal N is created only once
//!   every lower one is Ready, one pod per pass; extra pods go highest ordinal first, one
//!   at a time, while the others are Ready. `Parallel`: all at once.
//! - A deleted or ended (Succeeded/Failed) pod is replaced under the same name.
//! - `volumeClaimTemplates` make PVCs `<claim>-<sts>-<ordinal>` before the pod; they
//!   outlive the pod (and, unless `persistentVolumeClaimRetentionPolicy.whenDeleted` is
//!   `Delete`, the StatefulSet), so a replacement mounts the same claim. No provisioner
//!   binds them: they stay without a status.
//! - `updateStrategy: RollingUpdate` (the default): once all pods are Ready, the highest
//!   ordinal at or above `partition` whose `controller-revision-hash` is outdated is deleted
//!   (and recreated from the new template). `OnDelete`: only deleted pods change.

use serde_json::{Value, json};

use super::common::{
    controller_ref, deleting, name, namespace, owned_by, pod_active, pod_from_template, pod_ready,
    spec_replicas, template_hash,
};
use super::schedule::Scheduler;
use crate::api_server::ApiServer;

pub const POD_NAME_LABEL: &str = "statefulset.kubernetes.io/pod-name";
pub const POD_INDEX_LABEL: &str = "apps.kubernetes.io/pod-index";
const REVISION_LABEL: &str = "controller-revision-hash";

/// One pass over every StatefulSet.
pub fn reconcile_all(api: &ApiServer, scheduler: &mut Scheduler) {
    let (Ok(sets), Ok(pods)) = (api.list("apps/v1", "StatefulSet"), api.list("v1", "Pod")) else {
        return;
    };
    for sts in sets.iter().filter(|s| !deleting(s)) {
        reconcile(api, scheduler, sts, &pods);
    }
}

fn ordinal(sts: &Value, pod: &Value) -> Option<i64> {
    name(pod)
        .strip_prefix(name(sts))?
        .strip_prefix('-')?
        .parse()
        .ok()
}

fn revision(sts: &Value) -> String {
    format!("{}-{}", name(sts), template_hash(&sts["spec"]["template"]))
}

fn reconcile(api: &ApiServer, scheduler: &mut Scheduler, sts: &Value, pods: &[Value]) {
    let mut owned: Vec<(i64, &Value)> = owned_by(pods, sts)
        .into_iter()
        .filter_map(|p| Some((ordinal(sts, p)?, p)))
        .collect();
    owned.sort_by_key(|(i, _)| *i);
    // Ended pods are deleted now and made again on a later pass.
    for (_, pod) in owned.iter().filter(|(_, p)| !deleting(p) && !pod_active(p)) {
        let _ = api.delete("v1", "Pod", Some(namespace(pod)), name(pod));
    }
    let live: Vec<(i64, &Value)> = owned.into_iter().filter(|(_, p)| pod_active(p)).collect();
    let replicas = spec_replicas(sts).max(0);
    let parallel = sts["spec"]["podManagementPolicy"] == "Parallel";
    let mut all_ready = true;
    for i in 0..replicas {
        match live.iter().find(|(o, _)| *o == i) {
            Some((_, pod)) => all_ready &= pod_ready(pod),
            None => {
                create_pod(api, scheduler, sts, i);
                all_ready = false;
                if !parallel {
                    break;
                }
            }
        }
        if !parallel && !all_ready {
            break;
        }
    }
    scale_down(api, &live, replicas, parallel, all_ready);
    if all_ready {
        roll(api, sts, &live, replicas);
    }
    write_status(api, sts, &live, replicas);
}

fn scale_down(api: &ApiServer, live: &[(i64, &Value)], replicas: i64, parallel: bool, ready: bool) {
    let extra = live.iter().rev().filter(|(i, _)| *i >= replicas);
    for (_, pod) in extra.take(if parallel {
        usize::MAX
    } else {
        usize::from(ready)
    }) {
        let _ = api.delete("v1", "Pod", Some(namespace(pod)), name(pod));
    }
}

/// Deletes the highest outdated pod at or above the partition, to be made anew.
fn roll(api: &ApiServer, sts: &Value, live: &[(i64, &Value)], replicas: i64) {
    let strategy = &sts["spec"]["updateStrategy"];
    if strategy["type"] == "OnDelete" {
        return;
    }
    let partition = strategy["rollingUpdate"]["partition"].as_i64().unwrap_or(0);
    let current = revision(sts);
    let outdated = live.iter().rev().find(|(i, p)| {
        *i < replicas
            && *i >= partition
            && p["metadata"]["labels"][REVISION_LABEL] != current.as_str()
    });
    if let Some((_, pod)) = outdated {
        let _ = api.delete("v1", "Pod", Some(namespace(pod)), name(pod));
    }
}

fn create_pod(api: &ApiServer, scheduler: &mut Scheduler, sts: &Value, i: i64) {
    let pod_name = format!("{}-{i}", name(sts));
    let labels = json!({POD_NAME_LABEL: pod_name, POD_INDEX_LABEL: i.to_string(),
        REVISION_LABEL: revision(sts)});
    let mut pod = pod_from_template(&sts["spec"]["template"], sts, &labels);
    pod["metadata"]["name"] = json!(pod_name);
    pod["spec"]["hostname"] = json!(pod_name);
    if let Some(service) = sts["spec"]["serviceName"]
        .as_str()
        .filter(|s| !s.is_empty())
    {
        pod["spec"]["subdomain"] = json!(service);
    }
    for claim in sts["spec"]["volumeClaimTemplates"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let Some(claim_name) = ensure_claim(api, sts, claim, i) else {
            return;
        };
        mount_claim(&mut pod, name(claim), &claim_name);
    }
    scheduler.place(api, &mut pod);
    let _ = api.create(pod);
}

/// The volume named `volume` of `pod` becomes (or is added as) a mount of claim `claim`.
fn mount_claim(pod: &mut Value, volume: &str, claim: &str) {
    let entry = json!({"name": volume, "persistentVolumeClaim": {"claimName": claim}});
    if !pod["spec"]["volumes"].is_array() {
        pod["spec"]["volumes"] = json!([]);
    }
    let volumes = pod["spec"]["volumes"].as_array_mut().expect("set above");
    volumes.retain(|v| v["name"] != volume);
    volumes.push(entry);
}

/// Creates claim `<template>-<sts>-<i>` unless it exists; its name, or `None` on failure.
fn ensure_claim(api: &ApiServer, sts: &Value, template: &Value, i: i64) -> Option<String> {
    let claim_name = format!("{}-{}-{i}", name(template), name(sts));
    let ns = namespace(sts);
    if api
        .get("v1", "PersistentVolumeClaim", Some(ns), &claim_name)
        .is_ok()
    {
        return Some(claim_name);
    }
    let mut labels = template["metadata"]["labels"].clone();
    if !labels.is_object() {
        labels = json!({});
    }
    for (k, v) in sts["spec"]["selector"]["matchLabels"]
        .as_object()
        .into_iter()
        .flatten()
    {
        labels[k] = v.clone();
    }
    let mut metadata = json!({"name": claim_name, "namespace": ns, "labels": labels});
    if sts["spec"]["persistentVolumeClaimRetentionPolicy"]["whenDeleted"] == "Delete" {
        metadata["ownerReferences"] = json!([controller_ref(sts)]);
    }
    let claim = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": metadata, "spec": template["spec"]});
    api.create(claim).ok().map(|_| claim_name)
}

fn write_status(api: &ApiServer, sts: &Value, live: &[(i64, &Value)], replicas: i64) {
    let current = revision(sts);
    let ready = live.iter().filter(|(_, p)| pod_ready(p)).count();
    let updated = live
        .iter()
        .filter(|(_, p)| p["metadata"]["labels"][REVISION_LABEL] == current.as_str())
        .count();
    let settled = updated == live.len() && live.len() as i64 == replicas;
    let previous = sts["status"]["currentRevision"]
        .as_str()
        .unwrap_or(&current);
    let current_revision = if settled { current.as_str() } else { previous };
    let at_current = live
        .iter()
        .filter(|(_, p)| p["metadata"]["labels"][REVISION_LABEL] == current_revision)
        .count();
    let status = json!({"status": {
        "observedGeneration": sts["metadata"]["generation"],
        "replicas": live.len(), "readyReplicas": ready, "availableReplicas": ready,
        "currentReplicas": at_current, "updatedReplicas": updated,
        "currentRevision": current_revision, "updateRevision": current,
    }});
    let _ = api.merge_patch(
        "apps/v1",
        "StatefulSet",
        Some(namespace(sts)),
        name(sts),
        &status,
        true,
    );
}
