//! Discovery documents (`/version`, `/api`, `/apis`, resource lists) and the `Table` form
//! kubectl asks `get` for.

use std::collections::BTreeMap;

use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

use super::{printers, resources::ResourceType, store::Store, watch::partial_metadata};
use crate::clock::parse_time;

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
        if super::scale::has_scale(t) {
            resources.push(json!({
                "name": format!("{}/scale", t.plural), "singularName": "", "namespaced": t.namespaced,
                "group": "autoscaling", "version": "v1", "kind": "Scale", "verbs": ["get", "patch", "update"],
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

/// A `meta.k8s.io/v1` Table of objects, with the columns kubectl prints by default: the
/// name, a built-in kind's own columns ([`printers`]) and the age, or for a custom resource
/// its CRD's printer columns after the name.
pub fn table(
    rt: &ResourceType,
    objects: &[&Value],
    resource_version: &str,
    now: Timestamp,
) -> Value {
    let age_of = |value: &Value| {
        value.as_str().and_then(parse_time).map_or_else(
            || "<unknown>".to_owned(),
            |at| human_age(now.as_second().saturating_sub(at.as_second())),
        )
    };
    let mut columns = vec![
        json!({"name": "Name", "type": "string", "format": "name", "description": format!("Name of the {}", rt.kind), "priority": 0}),
    ];
    // A built-in kind's printer: its first columns, the age, then the wide ones.
    let printer = printers::columns(&rt.group, &rt.kind).unwrap_or(&[]);
    let (narrow, wide): (Vec<_>, Vec<_>) = printer.iter().partition(|c| c.priority == 0);
    let definition = |c: &printers::Column| json!({"name": c.name, "type": "string", "format": "", "description": c.name, "priority": c.priority});
    columns.extend(narrow.iter().map(|c| definition(c)));
    if rt.printer_columns.is_empty() {
        columns.push(json!({"name": "Age", "type": "string", "format": "", "description": "Time since creation", "priority": 0}));
    }
    columns.extend(wide.iter().map(|c| definition(c)));
    for column in &rt.printer_columns {
        columns.push(json!({"name": column.name, "type": column.type_, "format": "", "description": column.json_path, "priority": column.priority}));
    }
    let rows: Vec<Value> = objects
        .iter()
        .map(|o| {
            let meta = &o["metadata"];
            let mut cells = vec![meta["name"].clone()];
            cells.extend(narrow.iter().map(|c| (c.cell)(o)));
            if rt.printer_columns.is_empty() {
                cells.push(json!(age_of(&meta["creationTimestamp"])));
            }
            cells.extend(wide.iter().map(|c| (c.cell)(o)));
            for column in &rt.printer_columns {
                let value = column
                    .json_path
                    .trim_start_matches('.')
                    .split('.')
                    .try_fold(*o, |v, field| v.get(field))
                    .unwrap_or(&Value::Null);
                cells.push(match (column.type_.as_str(), value) {
                    (_, Value::Null) => Value::Null,
                    ("date", v) => json!(age_of(v)),
                    (_, Value::Array(items)) => json!(Value::Array(items.clone()).to_string()),
                    (_, v) => v.clone(),
                });
            }
            json!({"cells": cells, "object": partial_metadata(o)})
        })
        .collect();
    json!({
        "kind": "Table", "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": columns,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api_server::resources::types_from_crd;

    #[test]
    fn a_custom_resources_table_has_its_crds_printer_columns_after_the_name() {
        let crd = json!({
            "metadata": {"name": "spurjobs.spur.amd.com"},
            "spec": {
                "group": "spur.amd.com", "scope": "Namespaced",
                "names": {"kind": "SpurJob", "plural": "spurjobs"},
                "versions": [{"name": "v1alpha1", "served": true, "additionalPrinterColumns": [
                    {"name": "State", "type": "string", "jsonPath": ".status.state"},
                    {"name": "Nodes", "type": "string", "jsonPath": ".status.assignedNodes"},
                    {"name": "GPUs", "type": "integer", "jsonPath": ".spec.gpus.count"},
                    {"name": "Reason", "type": "string", "jsonPath": ".status.message", "priority": 1},
                    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                ]}],
            }
        });
        let rt = types_from_crd(&crd).unwrap().remove(0);
        let job = json!({
            "metadata": {"name": "train", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"gpus": {"count": 8}},
            "status": {"state": "Running", "assignedNodes": ["n1", "n2"]},
        });
        let now: Timestamp = "2026-01-01T00:05:00Z".parse().unwrap();
        let table = table(&rt, &[&job], "7", now);
        let names: Vec<&str> = table["columnDefinitions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["Name", "State", "Nodes", "GPUs", "Reason", "Age"]);
        assert_eq!(table["columnDefinitions"][4]["priority"], 1);
        assert_eq!(
            table["rows"][0]["cells"],
            json!(["train", "Running", "[\"n1\",\"n2\"]", 8, null, "5m"])
        );
    }
}
