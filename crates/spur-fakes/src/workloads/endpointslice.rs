//! The EndpointSlice controller: for each Service with a selector, slices labelled
//! `kubernetes.io/service-name` (named `<svc>-<5 chars>` by the store's seeded
//! `generateName`), owned by the Service, listing the matching pods that have a
//! `status.podIP`.
//!
//! As on a real cluster, a pod that is not Ready stays listed with `conditions.ready:
//! false` (clients route to ready endpoints only), unless `publishNotReadyAddresses`
//! makes it ready; pods being deleted or ended, or without an IP, are left out. Ports come
//! from the Service's, `targetPort` resolved by number or by a container port's name;
//! pods that resolve the ports differently go in different slices, one per port set.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::common::{
    controller_ref, deleting, map_matches, name, namespace, pod_active, pod_ready,
};
use crate::api_server::ApiServer;

pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
const MANAGED_BY_LABEL: &str = "endpointslice.kubernetes.io/managed-by";
const MANAGED_BY: &str = "endpointslice-controller.k8s.io";

/// One pass over every Service.
pub fn reconcile_all(api: &ApiServer) {
    let (Ok(services), Ok(pods), Ok(slices)) = (
        api.list("v1", "Service"),
        api.list("v1", "Pod"),
        api.list("discovery.k8s.io/v1", "EndpointSlice"),
    ) else {
        return;
    };
    for svc in services.iter().filter(|s| !deleting(s)) {
        let selector = &svc["spec"]["selector"];
        if selector.as_object().is_none_or(serde_json::Map::is_empty) {
            continue;
        }
        let ours: Vec<&Value> = slices
            .iter()
            .filter(|s| namespace(s) == namespace(svc))
            .filter(|s| s["metadata"]["labels"][SERVICE_NAME_LABEL] == name(svc))
            .filter(|s| s["metadata"]["labels"][MANAGED_BY_LABEL] == MANAGED_BY)
            .collect();
        let members: Vec<&Value> = pods
            .iter()
            .filter(|p| namespace(p) == namespace(svc) && pod_active(p))
            .filter(|p| p["status"]["podIP"].is_string())
            .filter(|p| map_matches(selector, &p["metadata"]["labels"]))
            .collect();
        reconcile(api, svc, &members, &ours);
    }
}

/// Groups the members by their resolved ports, and makes the slices hold those groups.
fn reconcile(api: &ApiServer, svc: &Value, members: &[&Value], slices: &[&Value]) {
    let mut groups: BTreeMap<String, (Value, Vec<Value>)> = BTreeMap::new();
    for pod in members {
        let ports = resolve_ports(svc, pod);
        let group = groups
            .entry(ports.to_string())
            .or_insert_with(|| (ports, Vec::new()));
        group.1.push(endpoint(svc, pod));
    }
    if groups.is_empty() {
        // A selector matching nothing still has one (empty) slice, as a real cluster shows.
        let ports = resolve_ports(svc, &Value::Null);
        groups.insert(ports.to_string(), (ports, Vec::new()));
    }
    let mut unused: Vec<&Value> = slices.to_vec();
    for (ports, endpoints) in groups.into_values() {
        let body = json!({"addressType": address_type(&endpoints), "ports": ports, "endpoints": endpoints});
        let same_ports = unused.iter().position(|s| s["ports"] == body["ports"]);
        match same_ports.or((!unused.is_empty()).then_some(0)) {
            Some(at) => {
                let slice = unused.remove(at);
                let _ = api.merge_patch(
                    "discovery.k8s.io/v1",
                    "EndpointSlice",
                    Some(namespace(slice)),
                    name(slice),
                    &body,
                    false,
                );
            }
            None => create_slice(api, svc, body),
        }
    }
    for slice in unused {
        let _ = api.delete(
            "discovery.k8s.io/v1",
            "EndpointSlice",
            Some(namespace(slice)),
            name(slice),
        );
    }
}

fn create_slice(api: &ApiServer, svc: &Value, mut body: Value) {
    body["apiVersion"] = json!("discovery.k8s.io/v1");
    body["kind"] = json!("EndpointSlice");
    body["metadata"] = json!({
        "generateName": format!("{}-", name(svc)), "namespace": namespace(svc),
        "labels": {SERVICE_NAME_LABEL: name(svc), MANAGED_BY_LABEL: MANAGED_BY},
        "ownerReferences": [controller_ref(svc)],
    });
    let _ = api.create(body);
}

fn address_type(endpoints: &[Value]) -> &'static str {
    let v6 = endpoints
        .first()
        .and_then(|e| e["addresses"][0].as_str())
        .is_some_and(|a| a.contains(':'));
    if v6 { "IPv6" } else { "IPv4" }
}

fn endpoint(svc: &Value, pod: &Value) -> Value {
    let ready = pod_ready(pod) || svc["spec"]["publishNotReadyAddresses"] == true;
    let mut e = json!({
        "addresses": [pod["status"]["podIP"]],
        "conditions": {"ready": ready, "serving": pod_ready(pod), "terminating": false},
        "targetRef": {"kind": "Pod", "namespace": namespace(pod), "name": name(pod),
            "uid": pod["metadata"]["uid"]},
    });
    if let Some(node) = pod["spec"]["nodeName"].as_str() {
        e["nodeName"] = json!(node);
    }
    if let Some(host) = pod["spec"]["hostname"].as_str() {
        e["hostname"] = json!(host);
    }
    e
}

/// The Service's ports as this pod serves them; a named `targetPort` the pod's containers
/// do not name is left out (`Null` pod: numbers only).
fn resolve_ports(svc: &Value, pod: &Value) -> Value {
    let container_port = |wanted: &str| {
        pod["spec"]["containers"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|c| c["ports"].as_array().into_iter().flatten())
            .find(|p| p["name"] == wanted)
            .and_then(|p| p["containerPort"].as_i64())
    };
    let ports: Vec<Value> = svc["spec"]["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| {
            let number = match &p["targetPort"] {
                Value::Number(n) => n.as_i64(),
                Value::String(s) => s.parse().ok().or_else(|| container_port(s)),
                _ => p["port"].as_i64(),
            }?;
            let mut port =
                json!({"port": number, "protocol": p["protocol"].as_str().unwrap_or("TCP")});
            port["name"] = json!(p["name"].as_str().unwrap_or_default());
            if let Some(app) = p["appProtocol"].as_str() {
                port["appProtocol"] = json!(app);
            }
            Some(port)
        })
        .collect();
    Value::Array(ports)
}
