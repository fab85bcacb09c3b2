//! deploy/networkpolicy.yaml enforced: spurctld's pods reach the operator's agent port,
//! other pods do not, and its HTTP port stays open to all. Each connect runs in a pod of
//! its own (no `kubectl exec` into process pods), which prints what it reached to its log.
//! Probe pods run on both nodes, so each operator replica is tried from its own bridge
//! (bridged traffic) and from the other node's (routed), and through a Service's clusterIP
//! (DNATed).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::json;

use super::{ClusterProcess, logs, runnable};

/// How long one connect may take before it counts as refused: a dropped SYN never answers.
const CONNECT_BOUND_SECS: u32 = 2;

/// How long a probe pod waits before its first connect: its address joins the policies'
/// rules a pass (200 ms) after the kubelet reports it, as a CNI programs a new pod's
/// policies a moment after the pod starts.
const SETTLE_SECS: u32 = 2;

#[test]
fn deploys_network_policy_admits_only_spurctld_to_the_agent_port() {
    if !runnable() {
        return;
    }
    let cluster = ClusterProcess::deployed("netpol");
    let operators = operator_addresses(&cluster);
    let vip = agent_service(&cluster);
    let mut targets: Vec<String> = Vec::new();
    for port in [6818, 8080] {
        targets.extend(operators.keys().map(|ip| format!("{ip}:{port}")));
        targets.push(format!("{vip}:{port}"));
    }
    println!("operators (pod IP: node IP) {operators:?}, Service {vip}");
    let probes = [
        ("spur", "as-spurctld", json!({"app": "spurctld"})),
        ("spur", "in-spur", json!({"app": "not-spurctld"})),
        ("default", "in-default", json!({})),
    ];
    let mut started = Vec::new();
    for node in ["node-0", "node-1"] {
        for (namespace, name, labels) in &probes {
            let pod = format!("{name}-{node}");
            start_probe(&cluster, namespace, &pod, node, labels, &targets);
            started.push((*namespace, pod, *name == "as-spurctld"));
        }
    }
    for (namespace, pod, is_spurctld) in &started {
        let reached = probe_outcome(&cluster, namespace, pod);
        for target in &targets {
            let want = if *is_spurctld || target.ends_with(":8080") {
                "open"
            } else {
                "closed"
            };
            assert_eq!(
                reached.get(target).map(String::as_str),
                Some(want),
                "{namespace}/{pod} to {target}: {reached:?}\n{}",
                cluster.diagnose()
            );
        }
        println!("{namespace}/{pod}: {reached:?}");
    }
    cluster.stop();
}

/// The operator replicas' pod IPs and node addresses, once both have an address.
fn operator_addresses(cluster: &ClusterProcess) -> BTreeMap<String, String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, out) = cluster.kubectl(&[
            "get",
            "pods",
            "-n",
            "spur-system",
            "-l",
            "app.kubernetes.io/name=spur-operator",
            "-o",
            "jsonpath={range .items[*]}{.status.podIP}={.status.hostIP} {end}",
        ]);
        let found: BTreeMap<String, String> = out
            .split_whitespace()
            .filter_map(|pair| pair.split_once('='))
            .filter(|(pod, _)| !pod.is_empty())
            .map(|(pod, node)| (pod.to_owned(), node.to_owned()))
            .collect();
        if found.len() == 2 {
            return found;
        }
        assert!(
            Instant::now() < deadline,
            "two operator pods with addresses: {out}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// A Service with a clusterIP in front of the operator's ports (deploy/'s own is headless),
/// so the DNATed path is tried too; its clusterIP, once an endpoint of it is ready.
fn agent_service(cluster: &ClusterProcess) -> String {
    let service = json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "agent-vip", "namespace": "spur-system"},
        "spec": {"selector": {"app.kubernetes.io/name": "spur-operator"},
            "ports": [{"name": "agent", "port": 6818, "targetPort": "agent"},
                {"name": "http", "port": 8080, "targetPort": "http"}]}});
    apply_json(cluster, "agent-vip", &service);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, ip) = cluster.kubectl(&[
            "get",
            "service",
            "-n",
            "spur-system",
            "agent-vip",
            "-o",
            "jsonpath={.spec.clusterIP}",
        ]);
        let (_, ready) = cluster.kubectl(&[
            "get",
            "endpointslices",
            "-n",
            "spur-system",
            "-l",
            "kubernetes.io/service-name=agent-vip",
            "-o",
            "jsonpath={.items[*].endpoints[*].conditions.ready}",
        ]);
        if ip.starts_with("10.96.") && ready.contains("true") {
            // The Services' rules follow the slice within their period.
            std::thread::sleep(Duration::from_secs(1));
            return ip.trim().to_owned();
        }
        assert!(
            Instant::now() < deadline,
            "Service agent-vip: clusterIP {ip:?}, ready {ready:?}"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

fn apply_json(cluster: &ClusterProcess, name: &str, object: &serde_json::Value) {
    let path = cluster.dir.join(format!("{name}.json"));
    std::fs::write(&path, object.to_string()).expect("write the manifest");
    cluster.apply(&["-f", &path.display().to_string()]);
}

/// A pod on `node` that connects to each target once and prints `TARGET open` or
/// `TARGET closed`. Never ready, so a pod labelled as spurctld joins no Service's records.
fn start_probe(
    cluster: &ClusterProcess,
    namespace: &str,
    pod: &str,
    node: &str,
    labels: &serde_json::Value,
    targets: &[String],
) {
    let script = format!(
        "sleep {SETTLE_SECS}; for t in {}; do if timeout {CONNECT_BOUND_SECS} bash -c \"</dev/tcp/${{t%:*}}/${{t#*:}}\" 2>/dev/null; \
         then echo \"$t open\"; else echo \"$t closed\"; fi; done",
        targets.join(" ")
    );
    let manifest = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": pod, "namespace": namespace, "labels": labels},
        "spec": {"nodeName": node, "restartPolicy": "Never",
            "containers": [{"name": "connect", "image": "busybox",
                "command": ["bash", "-c", script],
                "readinessProbe": {"exec": {"command": ["false"]}}}]}});
    apply_json(cluster, pod, &manifest);
}

/// What the probe pod reached: each target's `open` or `closed`, once it has exited.
fn probe_outcome(cluster: &ClusterProcess, namespace: &str, pod: &str) -> BTreeMap<String, String> {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let (_, phase) = cluster.kubectl(&[
            "get",
            "pod",
            "-n",
            namespace,
            pod,
            "-o",
            "jsonpath={.status.phase}",
        ]);
        if phase == "Succeeded" || phase == "Failed" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{namespace}/{pod} is {phase:?}, not done\n{}",
            cluster.diagnose()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let prefix = format!("{namespace}_{pod}_");
    let log = logs(&cluster.dir.join("logs"))
        .into_iter()
        .find(|l| {
            l.parent()
                .and_then(|d| d.file_name())
                .is_some_and(|d| d.to_string_lossy().starts_with(&prefix))
        })
        .unwrap_or_else(|| panic!("no log of {namespace}/{pod}"));
    let text = std::fs::read_to_string(&log).expect("read the probe's log");
    text.lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(target, outcome)| (target.to_owned(), outcome.to_owned()))
        .collect()
}
