//! Services as kube-proxy makes them, in nftables of the cluster's network namespace: each
//! Service with a clusterIP is DNATed to its ready endpoints, chosen at random per
//! connection, and masqueraded, so the reply comes back through the node that translated
//! it: a pod answering a pod of its own bridge would otherwise answer it directly, and
//! the client would see an address it never called. The API server gives each Service its
//! clusterIP when it is created (`spur_fakes::api_server::service_ips`).
//!
//! A Service with no ready endpoint has no rule: its clusterIP has no route, so a connect
//! fails at once (host unreachable), where kube-proxy's reject answers connection refused.
//! TCP only; a UDP port is left out, and so is a NodePort's node port.

use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::time::Duration;

use serde_json::Value;
use spur_fakes::api_server::ApiServer;
use spur_fakes::workloads::SERVICE_NAME_LABEL;

/// The nftables table the rules live in.
const TABLE: &str = "spurcluster";

/// How often Services and endpoints are looked at.
#[derive(Clone, Debug)]
pub struct ServicesConfig {
    /// Default 200 ms, the cluster DNS's period: a pod that turns Ready is reachable
    /// through its Service about when its name resolves.
    pub period: Duration,
}

impl Default for ServicesConfig {
    fn default() -> Self {
        Self {
            period: Duration::from_millis(200),
        }
    }
}

/// The whole table for these Services and EndpointSlices, replacing the last one in one
/// transaction (`nft -f`).
pub fn ruleset(services: &[Value], slices: &[Value]) -> String {
    let mut rules =
        format!("table ip {TABLE} {{}}\ndelete table ip {TABLE}\ntable ip {TABLE} {{\n");
    rules.push_str("  chain services {\n    type nat hook prerouting priority dstnat;\n");
    for svc in services {
        let Some(vip) = svc["spec"]["clusterIP"]
            .as_str()
            .and_then(|ip| ip.parse::<Ipv4Addr>().ok())
        else {
            continue;
        };
        for port in svc["spec"]["ports"].as_array().into_iter().flatten() {
            if port["protocol"].as_str().unwrap_or("TCP") != "TCP" {
                continue;
            }
            let targets = endpoints(svc, slices, text(&port["name"]));
            if targets.is_empty() {
                continue;
            }
            let map: Vec<String> = (targets.iter().enumerate())
                .map(|(i, (ip, target))| format!("{i} : {ip} . {target}"))
                .collect();
            let _ = writeln!(
                rules,
                "    ip daddr {vip} tcp dport {} dnat ip to numgen random mod {} map {{ {} }}",
                port["port"].as_i64().unwrap_or_default(),
                targets.len(),
                map.join(", ")
            );
        }
    }
    rules.push_str("  }\n  chain replies {\n    type nat hook postrouting priority srcnat;\n");
    rules.push_str("    ct status dnat masquerade\n  }\n}\n");
    rules
}

/// The ready endpoints of `svc` for its port named `port_name`: each address with the
/// port its slice resolved.
fn endpoints(svc: &Value, slices: &[Value], port_name: &str) -> Vec<(Ipv4Addr, i64)> {
    let mine = slices.iter().filter(|s| {
        s["metadata"]["namespace"] == svc["metadata"]["namespace"]
            && s["metadata"]["labels"][SERVICE_NAME_LABEL] == svc["metadata"]["name"]
    });
    let mut targets = Vec::new();
    for slice in mine {
        let ports = slice["ports"].as_array().into_iter().flatten();
        let Some(target) = ports
            .filter(|p| text(&p["name"]) == port_name)
            .find_map(|p| p["port"].as_i64())
        else {
            continue;
        };
        let ready = (slice["endpoints"].as_array().into_iter().flatten())
            .filter(|e| e["conditions"]["ready"] != false);
        for endpoint in ready {
            let addresses = endpoint["addresses"].as_array().into_iter().flatten();
            targets.extend(
                addresses
                    .filter_map(|a| a.as_str()?.parse().ok())
                    .map(|ip| (ip, target)),
            );
        }
    }
    targets.sort();
    targets
}

fn text(value: &Value) -> &str {
    value.as_str().unwrap_or_default()
}

/// One pass: the rules installed if they changed; `last` is the
/// ruleset installed before.
pub fn refresh_services(api: &ApiServer, last: &mut String) -> anyhow::Result<()> {
    let services = api.list("v1", "Service")?;
    let slices = api.list("discovery.k8s.io/v1", "EndpointSlice")?;
    let rules = ruleset(&services, &slices);
    if rules != *last {
        crate::kernel::run("nft", &["-f", "-"], Some(&rules))?;
        *last = rules;
    }
    Ok(())
}

/// Keeps the Services' rules current for ever, a pass each `config.period`; a failed pass
/// is reported once until it changes.
pub async fn run_services(api: ApiServer, config: ServicesConfig) {
    let mut installed = String::new();
    let pass = || refresh_services(&api, &mut installed);
    super::every(config.period, "cluster services", pass).await;
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn ready_endpoints_are_dnated_on_their_resolved_port_and_unready_ones_left_out() {
        let svc = json!({"metadata": {"name": "agent", "namespace": "spur"},
            "spec": {"clusterIP": "10.96.0.10", "ports": [{"name": "grpc", "port": 6818}]}});
        let slice = json!({"metadata": {"namespace": "spur", "labels": {SERVICE_NAME_LABEL: "agent"}},
            "ports": [{"name": "grpc", "port": 16818}],
            "endpoints": [{"addresses": ["10.244.1.3"], "conditions": {"ready": true}},
                {"addresses": ["10.244.0.4"], "conditions": {"ready": false}}]});
        let rules = ruleset(std::slice::from_ref(&svc), &[slice]);
        assert!(
            rules.contains("ip daddr 10.96.0.10 tcp dport 6818 dnat ip to numgen random mod 1 map { 0 : 10.244.1.3 . 16818 }"),
            "{rules}"
        );
        assert!(!rules.contains("10.244.0.4"), "{rules}");
        assert!(
            !ruleset(&[svc], &[]).contains("dnat ip to"),
            "no endpoint, no rule"
        );
    }
}
