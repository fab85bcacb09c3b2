//! The columns kube-apiserver's table printers give the kinds a person lists most, so
//! `kubectl get pods` and `kubectl get services` read as on a real cluster: a pod's
//! readiness, status and restarts (its address and node with `-o wide`), a Service's type,
//! clusterIP and ports. The status text follows kubectl's rules: a waiting or terminated
//! container's reason over the phase, `Terminating` once deletion began.

use serde_json::{Value, json};

/// One column: its name, its cell for an object, and its priority (1: `-o wide` only).
pub struct Column {
    pub name: &'static str,
    pub cell: fn(&Value) -> Value,
    pub priority: u8,
}

/// The columns of `kind` between its name and its age, if it has a printer here.
pub fn columns(group: &str, kind: &str) -> Option<&'static [Column]> {
    match (group, kind) {
        ("", "Pod") => Some(POD),
        ("", "Service") => Some(SERVICE),
        _ => None,
    }
}

const POD: &[Column] = &[
    Column {
        name: "Ready",
        cell: pod_ready,
        priority: 0,
    },
    Column {
        name: "Status",
        cell: pod_status,
        priority: 0,
    },
    Column {
        name: "Restarts",
        cell: pod_restarts,
        priority: 0,
    },
    Column {
        name: "IP",
        cell: pod_ip,
        priority: 1,
    },
    Column {
        name: "Node",
        cell: pod_node,
        priority: 1,
    },
];

const SERVICE: &[Column] = &[
    Column {
        name: "Type",
        cell: service_type,
        priority: 0,
    },
    Column {
        name: "Cluster-IP",
        cell: service_cluster_ip,
        priority: 0,
    },
    Column {
        name: "External-IP",
        cell: |_| json!("<none>"),
        priority: 0,
    },
    Column {
        name: "Port(s)",
        cell: service_ports,
        priority: 0,
    },
];

fn statuses(pod: &Value) -> &[Value] {
    pod["status"]["containerStatuses"]
        .as_array()
        .map_or(&[], Vec::as_slice)
}

fn pod_ready(pod: &Value) -> Value {
    let total = pod["spec"]["containers"].as_array().map_or(0, Vec::len);
    let ready = statuses(pod).iter().filter(|s| s["ready"] == true).count();
    json!(format!("{ready}/{total}"))
}

fn pod_status(pod: &Value) -> Value {
    if pod["metadata"]["deletionTimestamp"].is_string() {
        return json!("Terminating");
    }
    let mut reason = pod["status"]["reason"]
        .as_str()
        .or_else(|| pod["status"]["phase"].as_str())
        .unwrap_or("Pending")
        .to_owned();
    for status in statuses(pod).iter().rev() {
        let state = &status["state"];
        if let Some(waiting) = state["waiting"]["reason"].as_str() {
            reason = waiting.to_owned();
        } else if state["terminated"].is_object() {
            reason = terminated_reason(&state["terminated"]);
        }
    }
    json!(reason)
}

/// A terminated container's reason, else its signal or exit code, as kubectl shows it.
fn terminated_reason(terminated: &Value) -> String {
    match (terminated["reason"].as_str(), terminated["signal"].as_i64()) {
        (Some(reason), _) if !reason.is_empty() => reason.to_owned(),
        (_, Some(signal)) if signal != 0 => format!("Signal:{signal}"),
        _ => format!("ExitCode:{}", terminated["exitCode"].as_i64().unwrap_or(0)),
    }
}

fn pod_restarts(pod: &Value) -> Value {
    let restarts: i64 = statuses(pod)
        .iter()
        .filter_map(|s| s["restartCount"].as_i64())
        .sum();
    json!(restarts)
}

fn pod_ip(pod: &Value) -> Value {
    json!(pod["status"]["podIP"].as_str().unwrap_or("<none>"))
}

fn pod_node(pod: &Value) -> Value {
    json!(pod["spec"]["nodeName"].as_str().unwrap_or("<none>"))
}

fn service_type(service: &Value) -> Value {
    json!(service["spec"]["type"].as_str().unwrap_or("ClusterIP"))
}

fn service_cluster_ip(service: &Value) -> Value {
    json!(service["spec"]["clusterIP"].as_str().unwrap_or("<none>"))
}

fn service_ports(service: &Value) -> Value {
    let ports: Vec<String> = service["spec"]["ports"]
        .as_array()
        .map_or(&[][..], Vec::as_slice)
        .iter()
        .map(|p| {
            let protocol = p["protocol"].as_str().unwrap_or("TCP");
            format!("{}/{protocol}", p["port"].as_i64().unwrap_or(0))
        })
        .collect();
    json!(if ports.is_empty() {
        "<none>".to_owned()
    } else {
        ports.join(",")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cells(kind: &str, object: &Value) -> Vec<Value> {
        let columns = columns("", kind).expect("a printer");
        columns.iter().map(|c| (c.cell)(object)).collect()
    }

    #[test]
    fn a_pods_row_shows_readiness_the_containers_reason_and_restarts() {
        let pod = json!({
            "metadata": {"name": "web"},
            "spec": {"nodeName": "node-1", "containers": [{"name": "a"}, {"name": "b"}]},
            "status": {"phase": "Running", "podIP": "10.244.1.3", "containerStatuses": [
                {"ready": true, "restartCount": 2, "state": {"running": {}}},
                {"ready": false, "restartCount": 1,
                 "state": {"waiting": {"reason": "CrashLoopBackOff"}}},
            ]},
        });
        assert_eq!(
            cells("Pod", &pod),
            [
                json!("1/2"),
                json!("CrashLoopBackOff"),
                json!(3),
                json!("10.244.1.3"),
                json!("node-1")
            ]
        );
    }

    #[test]
    fn an_ended_or_deleted_pod_says_so() {
        let oom = json!({"spec": {"containers": [{}]}, "status": {"phase": "Failed",
            "containerStatuses": [{"state": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}}]}});
        assert_eq!(pod_status(&oom), "OOMKilled");
        let bare =
            json!({"status": {"containerStatuses": [{"state": {"terminated": {"exitCode": 3}}}]}});
        assert_eq!(pod_status(&bare), "ExitCode:3");
        let going = json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"},
            "status": {"phase": "Running"}});
        assert_eq!(pod_status(&going), "Terminating");
    }

    #[test]
    fn a_services_row_shows_its_type_address_and_ports() {
        let service = json!({"spec": {"clusterIP": "10.96.0.10",
            "ports": [{"port": 6818}, {"port": 53, "protocol": "UDP"}]}});
        assert_eq!(
            cells("Service", &service),
            [
                json!("ClusterIP"),
                json!("10.96.0.10"),
                json!("<none>"),
                json!("6818/TCP,53/UDP")
            ]
        );
    }
}
