//! Discovery documents (`/version`, `/api`, `/apis`, resource lists) and the `Table` form
//! kubectl asks `get` for.

use std::collections::BTreeMap;

use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

use super::{clock::parse_time, resources::ResourceType, store::Store, watch::partial_metadata};

const VERBS: [&str; 8] = [
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

/// `/version`.
pub fn version() -> Value {
    json!({
        "major": "1", "minor": "33", "gitVersion": "v1.33.0-spur-sim", "gitCommit": "spur-sim",
        "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.24",
        "compiler": "gc", "platform": "linux/amd64",
    })
}

/// `/api`: the core group's versions.
pub fn core_versions() -> Value {
    json!({
        "kind": "APIVersions", "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "kube-api:443"}],
    })
}

fn groups(store: &Store) -> BTreeMap<String, Vec<String>> {
    let mut groups: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for t in store.resources().filter(|t| !t.group.is_empty()) {
        let versions = groups.entry(t.group.clone()).or_default();
        if !versions.contains(&t.version) {
            versions.push(t.version.clone());
        }
    }
    groups
}

fn group_doc(name: &str, versions: &[String]) -> Value {
    let gv = |v: &String| json!({"groupVersion": format!("{name}/{v}"), "version": v});
    json!({"name": name, "versions": versions.iter().map(gv).collect::<Vec<_>>(), "preferredVersion": gv(&versions[0])})
}

/// `/apis`: every named group.
pub fn group_list(store: &Store) -> Value {
    let groups: Vec<Value> = groups(store)
        .iter()
        .map(|(name, versions)| group_doc(name, versions))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `/apis/{group}`: one group, `None` when not served.
pub fn group(store: &Store, name: &str) -> Option<Value> {
    let groups = groups(store);
    let versions = groups.get(name)?;
    let mut doc = group_doc(name, versions);
    doc["kind"] = json!("APIGroup");
    doc["apiVersion"] = json!("v1");
    Some(doc)
}

/// `/api/v1` or `/apis/{group}/{version}`: the resources served there, `None` when none.
pub fn resource_list(store: &Store, group: &str, version: &str) -> Option<Value> {
    let types: Vec<&ResourceType> = store
        .resources()
        .filter(|t| t.group == group && t.version == version)
        .collect();
    if types.is_empty() {
        return None;
    }
    let mut resources = Vec::new();
    for t in types {
        resources.push(json!({
            "name": t.plural, "singularName": t.singular, "namespaced": t.namespaced, "kind": t.kind,
            "verbs": VERBS, "shortNames": t.short_names,
        }));
        if t.status_subresource {
            resources.push(json!({
                "name": format!("{}/status", t.plural), "singularName": "", "namespaced": t.namespaced,
                "kind": t.kind, "verbs": ["get", "patch", "update"],
            }));
        }
    }
    let group_version = if group.is_empty() {
        version.to_owned()
    } else {
        format!("{group}/{version}")
    };
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": resources}),
    )
}

/// A `meta.k8s.io/v1` Table of objects, with the columns kubectl prints by default.
pub fn table(
    rt: &ResourceType,
    objects: &[&Value],
    resource_version: &str,
    now: Timestamp,
) -> Value {
    let rows: Vec<Value> = objects
        .iter()
        .map(|o| {
            let meta = &o["metadata"];
            let age = meta["creationTimestamp"]
                .as_str()
                .and_then(parse_time)
                .map_or_else(
                    || "<unknown>".to_owned(),
                    |created| human_age(now.as_second().saturating_sub(created.as_second())),
                );
            json!({"cells": [meta["name"].clone(), age], "object": partial_metadata(o)})
        })
        .collect();
    json!({
        "kind": "Table", "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": [
            {"name": "Name", "type": "string", "format": "name", "description": format!("Name of the {}", rt.kind), "priority": 0},
            {"name": "Age", "type": "string", "format": "", "description": "Time since creation", "priority": 0},
        ],
        "rows": rows,
    })
}

fn human_age(secs: i64) -> String {
    match secs.max(0) {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}
