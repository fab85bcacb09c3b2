//! Objects a fresh cluster starts with.

use serde_json::{Value, json};

/// The label the operator selects its nodes by.
pub const MANAGED_LABEL: &str = "spur.amd.com/managed";

/// Node `node-{i}`: labelled for the operator, Ready, with cpu, memory and GPUs allocatable.
pub fn node(i: usize) -> Value {
    let name = format!("node-{i}");
    let resources = json!({"cpu": "64", "memory": "256Gi", "amd.com/gpu": "8", "pods": "110"});
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {MANAGED_LABEL: "true", "kubernetes.io/hostname": name, "kubernetes.io/os": "linux"},
        },
        "spec": {},
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status"}],
            "addresses": [{"type": "Hostname", "address": name}],
        },
    })
}
