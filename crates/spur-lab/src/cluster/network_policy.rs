//! NetworkPolicy as a CNI enforces it, in nftables of the cluster's network namespace: a
//! pod selected by a policy of its namespace with `Ingress` (or `Egress`) among its
//! policyTypes is isolated that way, and a connection to (from) it passes when some rule
//! of some policy selecting it admits the peer and the port; replies of an admitted
//! connection pass, and pods no policy selects are untouched.
//!
//! The rules sit on the forward hook of the cluster's namespace, which every packet between
//! two pods crosses with its original source: traffic between nodes is routed there, a
//! Service's traffic is routed there with its destination already DNATed (prerouting) and
//! its source not yet masqueraded (postrouting), and traffic between two pods of one bridge
//! reaches it through br_netfilter (`bridge-nf-call-iptables`, as kubeadm requires it).
//! Traffic the namespace itself sends or receives (the kubelets' probes, the API server)
//! crosses the output and input hooks instead, so no policy refuses it.
//!
//! Left out: IPv6 ipBlocks (the pod network is IPv4), and a named port of an egress rule
//! towards an ipBlock (only pods name ports).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::time::Duration;

use serde_json::Value;
use spur_fakes::api_server::ApiServer;

/// The nftables table the rules live in.
const TABLE: &str = "spurnetpol";

/// Where br_netfilter is switched on for the cluster's namespace.
const BRIDGE_CALLS_IPTABLES: &str = "/proc/sys/net/bridge/bridge-nf-call-iptables";

/// How often policies, pods and namespaces are looked at.
#[derive(Clone, Debug)]
pub struct NetworkPolicyConfig {
    /// Default 200 ms, the Services' period: a new pod is isolated about when a Service
    /// first sends it traffic.
    pub period: Duration,
}

impl Default for NetworkPolicyConfig {
    fn default() -> Self {
        Self {
            period: Duration::from_millis(200),
        }
    }
}

/// Which way a policy's rules face.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Direction {
    Ingress,
    Egress,
}

impl Direction {
    fn policy_type(self) -> &'static str {
        match self {
            Self::Ingress => "Ingress",
            Self::Egress => "Egress",
        }
    }

    fn rules_field(self) -> &'static str {
        match self {
            Self::Ingress => "ingress",
            Self::Egress => "egress",
        }
    }

    fn peers_field(self) -> &'static str {
        match self {
            Self::Ingress => "from",
            Self::Egress => "to",
        }
    }

    /// The isolated pod's address field in a packet.
    fn own(self) -> &'static str {
        match self {
            Self::Ingress => "daddr",
            Self::Egress => "saddr",
        }
    }

    /// The peer's address field in a packet.
    fn peer(self) -> &'static str {
        match self {
            Self::Ingress => "saddr",
            Self::Egress => "daddr",
        }
    }
}

/// A pod that has an address and may still send or receive.
struct Pod<'a> {
    object: &'a Value,
    namespace: &'a str,
    ip: Ipv4Addr,
}

impl Pod<'_> {
    fn labels(&self) -> &Value {
        &self.object["metadata"]["labels"]
    }

    fn name(&self) -> &str {
        self.object["metadata"]["name"].as_str().unwrap_or_default()
    }

    /// The node's address, where the kubelet's probes come from.
    fn host_ip(&self) -> Option<Ipv4Addr> {
        self.object["status"]["hostIP"].as_str()?.parse().ok()
    }

    /// The number of the container port named `name` for `protocol` (lower case).
    fn named_port(&self, name: &str, protocol: &str) -> Option<i64> {
        let containers = self.object["spec"]["containers"].as_array()?;
        let ports = containers
            .iter()
            .flat_map(|c| c["ports"].as_array().into_iter().flatten());
        ports
            .filter(|p| p["name"] == name && protocol_of(p) == protocol)
            .find_map(|p| p["containerPort"].as_i64())
    }
}

fn pods_with_addresses(pods: &[Value]) -> Vec<Pod<'_>> {
    let live = pods.iter().filter(|p| {
        let phase = p["status"]["phase"].as_str().unwrap_or_default();
        phase != "Succeeded" && phase != "Failed" && p["spec"]["hostNetwork"] != true
    });
    live.filter_map(|object| {
        Some(Pod {
            object,
            namespace: object["metadata"]["namespace"].as_str()?,
            ip: object["status"]["podIP"].as_str()?.parse().ok()?,
        })
    })
    .collect()
}

/// Whether `labels` match a LabelSelector (`matchLabels`, `matchExpressions`); an empty
/// selector matches everything, as a NetworkPolicy reads it.
fn selects(selector: &Value, labels: &Value) -> bool {
    let wanted = selector["matchLabels"].as_object().into_iter().flatten();
    if !wanted.into_iter().all(|(k, v)| labels.get(k) == Some(v)) {
        return false;
    }
    let expressions = selector["matchExpressions"]
        .as_array()
        .into_iter()
        .flatten();
    expressions.into_iter().all(|e| {
        let value = labels.get(e["key"].as_str().unwrap_or_default());
        let listed = |v: &Value| e["values"].as_array().is_some_and(|vs| vs.contains(v));
        match e["operator"].as_str().unwrap_or_default() {
            "In" => value.is_some_and(listed),
            "NotIn" => !value.is_some_and(listed),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            _ => false,
        }
    })
}

/// The policy's types as Kubernetes defaults them: `Ingress`, and `Egress` when it has
/// egress rules.
fn isolates(policy: &Value, direction: Direction) -> bool {
    match policy["spec"]["policyTypes"].as_array() {
        Some(types) => types.iter().any(|t| t == direction.policy_type()),
        None => direction == Direction::Ingress || policy["spec"]["egress"].is_array(),
    }
}

fn protocol_of(port: &Value) -> String {
    port["protocol"]
        .as_str()
        .unwrap_or("TCP")
        .to_ascii_lowercase()
}

/// The whole table for these objects, replacing the last one in one transaction
/// (`nft -f`): a chain for each isolated pod and direction, jumped to from the forward hook.
pub fn ruleset(policies: &[Value], pods: &[Value], namespaces: &[Value]) -> String {
    let pods = pods_with_addresses(pods);
    let namespace_labels: BTreeMap<&str, &Value> = namespaces
        .iter()
        .filter_map(|n| Some((n["metadata"]["name"].as_str()?, &n["metadata"]["labels"])))
        .collect();
    let world = World {
        pods: &pods,
        namespace_labels,
    };
    let mut rules =
        format!("table ip {TABLE} {{}}\ndelete table ip {TABLE}\ntable ip {TABLE} {{\n");
    let mut jumps = String::new();
    for direction in [Direction::Ingress, Direction::Egress] {
        for (index, pod) in pods.iter().enumerate() {
            let selecting: Vec<&Value> = (policies.iter())
                .filter(|p| p["metadata"]["namespace"] == pod.namespace)
                .filter(|p| isolates(p, direction))
                .filter(|p| selects(&p["spec"]["podSelector"], pod.labels()))
                .collect();
            if selecting.is_empty() {
                continue;
            }
            let chain = format!("{}_{index}", direction.rules_field());
            let _ = writeln!(jumps, "    ip {} {} jump {chain}", direction.own(), pod.ip);
            rules.push_str(&world.pod_chain(&chain, direction, pod, &selecting));
        }
    }
    rules.push_str(
        "  chain forward {\n    type filter hook forward priority filter; policy accept;\n",
    );
    rules.push_str("    ct state established,related accept\n");
    rules.push_str(&jumps);
    rules.push_str("  }\n}\n");
    rules
}

/// What a policy's peers are picked from.
struct World<'a> {
    pods: &'a [Pod<'a>],
    namespace_labels: BTreeMap<&'a str, &'a Value>,
}

/// Who a peer of a rule is.
enum Peer<'a> {
    Anyone,
    Pods(Vec<&'a Pod<'a>>),
    /// An `ipBlock` as nft matches it (`10.0.0.0/8 ip saddr != { ... }`, the address
    /// field left to the caller).
    Block(String),
}

impl<'a> World<'a> {
    /// The chain of `pod` for `direction`: what any selecting policy admits returns to the
    /// forward hook (where the peer's own chain may still refuse it), the rest is dropped.
    fn pod_chain(
        &self,
        chain: &str,
        direction: Direction,
        pod: &Pod,
        policies: &[&Value],
    ) -> String {
        let mut text = format!(
            "  chain {chain} {{\n    # {}/{}: {} {}\n",
            pod.namespace,
            pod.name(),
            direction.rules_field(),
            policies
                .iter()
                .map(|p| p["metadata"]["name"].as_str().unwrap_or_default())
                .collect::<Vec<_>>()
                .join(", ")
        );
        if direction == Direction::Ingress
            && let Some(node) = pod.host_ip()
        {
            // A real kubelet probes from its node, which policies do not block in practice;
            // here the probes leave the cluster's namespace on the output hook and never
            // cross this one, and this line keeps that true should they be routed.
            let _ = writeln!(text, "    ip saddr {node} return");
        }
        for policy in policies {
            let rules = policy["spec"][direction.rules_field()].as_array();
            for rule in rules.into_iter().flatten() {
                for line in self.rule_lines(direction, rule, pod, policy) {
                    let _ = writeln!(text, "    {line}return");
                }
            }
        }
        text.push_str("    counter drop\n  }\n");
        text
    }

    /// One policy rule as match texts (each ending in a space), one per peer and port; none
    /// when it admits nobody.
    fn rule_lines(
        &self,
        direction: Direction,
        rule: &Value,
        pod: &Pod,
        policy: &Value,
    ) -> Vec<String> {
        let policy_namespace = policy["metadata"]["namespace"].as_str().unwrap_or_default();
        let peers: Vec<Peer> = match rule[direction.peers_field()].as_array() {
            Some(peers) if !peers.is_empty() => peers
                .iter()
                .map(|p| self.peer(p, policy_namespace))
                .collect(),
            _ => vec![Peer::Anyone],
        };
        let ports: Vec<&Value> = rule["ports"].as_array().into_iter().flatten().collect();
        let mut lines = Vec::new();
        for peer in &peers {
            if ports.is_empty() {
                lines.extend(peer_text(direction, peer));
                continue;
            }
            for port in &ports {
                lines.extend(self.peer_and_port(direction, peer, port, pod));
            }
        }
        lines
    }

    /// The pods (or block) one `from`/`to` entry names: a podSelector alone picks pods of
    /// the policy's namespace, a namespaceSelector alone every pod of the namespaces it
    /// picks, both together the pods both pick.
    fn peer(&self, peer: &Value, policy_namespace: &str) -> Peer<'a> {
        if peer["ipBlock"].is_object() {
            return Peer::Block(ip_block(&peer["ipBlock"]).unwrap_or_default());
        }
        let (pod_selector, namespace_selector) = (&peer["podSelector"], &peer["namespaceSelector"]);
        let chosen = self.pods.iter().filter(|p| {
            let in_namespace = if namespace_selector.is_object() {
                let labels = self.namespace_labels.get(p.namespace).copied();
                labels.is_some_and(|l| selects(namespace_selector, l))
            } else {
                p.namespace == policy_namespace
            };
            in_namespace && (!pod_selector.is_object() || selects(pod_selector, p.labels()))
        });
        Peer::Pods(chosen.collect())
    }

    /// Matches of one peer and one port; a named port resolves against the destination's
    /// containers: the isolated pod for ingress, each peer pod for egress.
    fn peer_and_port(
        &self,
        direction: Direction,
        peer: &Peer,
        port: &Value,
        pod: &Pod,
    ) -> Vec<String> {
        let named = port["port"].as_str().filter(|p| p.parse::<u16>().is_err());
        match (named, direction, peer) {
            (Some(_), Direction::Ingress, _) | (None, _, _) => {
                let Some(port_text) = port_text(port, pod) else {
                    return Vec::new();
                };
                let peers = peer_text(direction, peer);
                peers
                    .into_iter()
                    .map(|p| format!("{p}{port_text}"))
                    .collect()
            }
            (Some(_), Direction::Egress, Peer::Block(_)) => Vec::new(),
            (Some(_), Direction::Egress, Peer::Anyone) => {
                let every = Peer::Pods(self.pods.iter().collect());
                self.peer_and_port(direction, &every, port, pod)
            }
            (Some(_), Direction::Egress, Peer::Pods(pods)) => pods
                .iter()
                .filter_map(|target| {
                    let one = Peer::Pods(vec![target]);
                    let port_text = port_text(port, target)?;
                    Some(format!("{}{port_text}", peer_text(direction, &one)?))
                })
                .collect(),
        }
    }
}

/// The peer's match (ending in a space, empty for anyone); none for a peer that is nobody.
fn peer_text(direction: Direction, peer: &Peer) -> Option<String> {
    let field = direction.peer();
    match peer {
        Peer::Anyone => Some(String::new()),
        Peer::Pods(pods) if pods.is_empty() => None,
        Peer::Pods(pods) => {
            let ips: Vec<String> = pods.iter().map(|p| p.ip.to_string()).collect();
            Some(format!("ip {field} {{ {} }} ", ips.join(", ")))
        }
        Peer::Block(block) if block.is_empty() => None,
        Peer::Block(block) => Some(block.replace("{field}", field)),
    }
}

/// An ipBlock as nft matches it, `{field}` standing for the address field; `None` when its
/// CIDR is not IPv4.
fn ip_block(block: &Value) -> Option<String> {
    let cidr = network(block["cidr"].as_str()?)?;
    let mut text = format!("ip {{field}} {cidr} ");
    let except: Vec<String> = (block["except"].as_array().into_iter().flatten())
        .filter_map(|e| network(e.as_str()?))
        .collect();
    if !except.is_empty() {
        let _ = write!(text, "ip {{field}} != {{ {} }} ", except.join(", "));
    }
    Some(text)
}

/// `a.b.c.d/n` with its host bits cleared, as nft wants a prefix.
fn network(cidr: &str) -> Option<String> {
    let (address, prefix) = cidr.split_once('/')?;
    let (address, prefix): (Ipv4Addr, u32) = (address.parse().ok()?, prefix.parse().ok()?);
    let mask = u32::MAX.checked_shl(32 - prefix.min(32)).unwrap_or(0);
    (prefix <= 32).then(|| format!("{}/{prefix}", Ipv4Addr::from(u32::from(address) & mask)))
}

/// A policy port as nft matches it (ending in a space); a named port resolved against
/// `target`'s containers, `None` when it names none of them.
fn port_text(port: &Value, target: &Pod) -> Option<String> {
    let protocol = protocol_of(port);
    if !["tcp", "udp", "sctp"].contains(&protocol.as_str()) {
        return None;
    }
    let number = match &port["port"] {
        Value::Null => return Some(format!("meta l4proto {protocol} ")),
        Value::Number(n) => n.as_i64()?,
        Value::String(s) => match s.parse::<i64>() {
            Ok(n) => n,
            Err(_) => target.named_port(s, &protocol)?,
        },
        _ => return None,
    };
    match port["endPort"].as_i64().filter(|end| *end > number) {
        Some(end) if port["port"].is_number() => Some(format!("{protocol} dport {number}-{end} ")),
        _ => Some(format!("{protocol} dport {number} ")),
    }
}

/// One pass: the rules installed if they changed; `last` is the ruleset installed before.
pub fn refresh_network_policy(api: &ApiServer, last: &mut String) -> anyhow::Result<()> {
    let policies = api.list("networking.k8s.io/v1", "NetworkPolicy")?;
    let pods = api.list("v1", "Pod")?;
    let namespaces = api.list("v1", "Namespace")?;
    let rules = ruleset(&policies, &pods, &namespaces);
    if rules != *last {
        crate::kernel::run("nft", &["-f", "-"], Some(&rules))?;
        *last = rules;
    }
    Ok(())
}

/// Makes traffic between two pods of one bridge cross the forward hook (br_netfilter),
/// where otherwise only routed traffic would.
fn filter_bridged_traffic() -> anyhow::Result<()> {
    if !std::path::Path::new(BRIDGE_CALLS_IPTABLES).exists() {
        let _ = crate::kernel::run("modprobe", &["br_netfilter"], None);
    }
    std::fs::write(BRIDGE_CALLS_IPTABLES, "1").map_err(|e| {
        anyhow::anyhow!(
            "{BRIDGE_CALLS_IPTABLES}: {e} (no br_netfilter): policies do not see traffic \
             between two pods of one node"
        )
    })
}

/// The installed table, deleted when the loop stops (the namespace it lives in would take
/// it too, but only once its last process is gone).
struct Installed(String);

impl Drop for Installed {
    fn drop(&mut self) {
        if !self.0.is_empty() {
            let _ = crate::kernel::run("nft", &["delete", "table", "ip", TABLE], None);
        }
    }
}

/// Keeps the policies' rules current for ever, a pass each `config.period`; a failed pass
/// is reported once until it changes.
pub async fn run_network_policy(api: ApiServer, config: NetworkPolicyConfig) {
    if let Err(e) = filter_bridged_traffic() {
        eprintln!("cluster network policy: {e:#}");
    }
    let mut installed = Installed(String::new());
    let pass = || refresh_network_policy(&api, &mut installed.0);
    super::every(config.period, "cluster network policy", pass).await;
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(namespace: &str, name: &str, ip: &str, labels: Value) -> Value {
        json!({"metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": {"containers": [{"name": "c", "ports": [
                {"name": "agent", "containerPort": 6818},
                {"name": "metrics", "containerPort": 9090, "protocol": "UDP"}]}]},
            "status": {"phase": "Running", "podIP": ip, "hostIP": "10.244.0.1"}})
    }

    fn namespace(name: &str) -> Value {
        json!({"metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name}}})
    }

    fn policy(namespace: &str, spec: Value) -> Value {
        json!({"metadata": {"name": "p", "namespace": namespace}, "spec": spec})
    }

    /// deploy/networkpolicy.yaml's spec.
    fn deploys_policy() -> Value {
        policy(
            "spur-system",
            json!({"podSelector": {"matchLabels": {"app.kubernetes.io/name": "spur-operator"}},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [{"podSelector": {"matchLabels": {"app": "spurctld"}},
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "spur"}}}],
                 "ports": [{"port": 6818, "protocol": "TCP"}]},
                {"ports": [{"port": 8080, "protocol": "TCP"}]}]}),
        )
    }

    fn world() -> (Vec<Value>, Vec<Value>) {
        let pods = vec![
            pod(
                "spur-system",
                "operator",
                "10.244.1.2",
                json!({"app.kubernetes.io/name": "spur-operator"}),
            ),
            pod(
                "spur",
                "spurctld-0",
                "10.244.0.2",
                json!({"app": "spurctld"}),
            ),
            pod("spur", "other", "10.244.0.3", json!({"app": "other"})),
            pod(
                "default",
                "spurctld-lookalike",
                "10.244.0.4",
                json!({"app": "spurctld"}),
            ),
        ];
        let namespaces = ["spur-system", "spur", "default"].map(namespace).to_vec();
        (pods, namespaces)
    }

    /// The lines of the chain whose comment names `pod`.
    fn chain_of<'a>(rules: &'a str, pod: &str) -> Vec<&'a str> {
        let start = rules
            .find(&format!("# {pod}:"))
            .unwrap_or_else(|| panic!("no chain for {pod}:\n{rules}"));
        let end = rules[start..].find("  }").expect("the chain ends");
        rules[start..start + end]
            .lines()
            .skip(1)
            .map(str::trim)
            .collect()
    }

    #[test]
    fn deploys_policy_admits_spurctld_to_the_agent_port_and_everyone_to_http() {
        let (pods, namespaces) = world();
        let rules = ruleset(&[deploys_policy()], &pods, &namespaces);
        assert_eq!(
            chain_of(&rules, "spur-system/operator"),
            [
                "ip saddr 10.244.0.1 return",
                "ip saddr { 10.244.0.2 } tcp dport 6818 return",
                "tcp dport 8080 return",
                "counter drop",
            ],
            "{rules}"
        );
        assert!(
            rules.contains("ip daddr 10.244.1.2 jump ingress_0"),
            "{rules}"
        );
        assert!(
            rules.contains("ct state established,related accept"),
            "{rules}"
        );
        assert_eq!(
            rules.matches("jump").count(),
            1,
            "only the operator is isolated: {rules}"
        );
        assert!(
            rules.find("chain ingress_0").unwrap() < rules.find("chain forward").unwrap(),
            "a chain is defined before it is jumped to"
        );
    }

    #[test]
    fn a_peer_of_both_selectors_needs_both_and_one_of_either_takes_its_own() {
        let (pods, namespaces) = world();
        let spec = |peer: Value| {
            policy(
                "spur-system",
                json!({"podSelector": {}, "ingress": [{"from": [peer]}]}),
            )
        };
        let admitted = |peer: Value| {
            let rules = ruleset(&[spec(peer)], &pods, &namespaces);
            chain_of(&rules, "spur-system/operator")[1].to_owned()
        };
        assert_eq!(
            admitted(json!({"podSelector": {"matchLabels": {"app": "spurctld"}}})),
            "counter drop",
            "a podSelector alone picks the policy's own namespace, where no spurctld is"
        );
        assert_eq!(
            admitted(
                json!({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "spur"}}})
            ),
            "ip saddr { 10.244.0.2, 10.244.0.3 } return"
        );
        assert_eq!(
            admitted(
                json!({"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "spurctld"}}})
            ),
            "ip saddr { 10.244.0.2, 10.244.0.4 } return"
        );
        assert_eq!(
            admitted(json!({"ipBlock": {"cidr": "10.244.7.9/16", "except": ["10.244.0.0/24"]}})),
            "ip saddr 10.244.0.0/16 ip saddr != { 10.244.0.0/24 } return"
        );
        let everyone = ruleset(
            &[policy(
                "spur-system",
                json!({"podSelector": {}, "ingress": [{}]}),
            )],
            &pods,
            &namespaces,
        );
        assert_eq!(chain_of(&everyone, "spur-system/operator")[1], "return");
        let nobody = ruleset(
            &[policy(
                "spur-system",
                json!({"podSelector": {}, "policyTypes": ["Ingress"]}),
            )],
            &pods,
            &namespaces,
        );
        assert_eq!(
            chain_of(&nobody, "spur-system/operator")[1..],
            ["counter drop"]
        );
    }

    #[test]
    fn expressions_select_as_kubernetes_defines_them() {
        let labels = json!({"app": "spurctld", "tier": "control"});
        let expression = |operator: &str, values: Value| {
            selects(
                &json!({"matchExpressions": [{"key": "app", "operator": operator, "values": values}]}),
                &labels,
            )
        };
        assert!(expression("In", json!(["spurctld", "x"])));
        assert!(!expression("In", json!(["x"])));
        assert!(expression("NotIn", json!(["x"])));
        assert!(!expression("NotIn", json!(["spurctld"])));
        assert!(expression("Exists", Value::Null));
        assert!(!expression("DoesNotExist", Value::Null));
        assert!(
            !expression("Sideways", Value::Null),
            "an unknown operator matches nothing"
        );
        let absent = json!({"matchExpressions": [{"key": "zone", "operator": "DoesNotExist"}]});
        assert!(selects(&absent, &labels));
        assert!(
            selects(&json!({}), &labels),
            "an empty selector picks everything"
        );
        assert!(!selects(&json!({"matchLabels": {"tier": "data"}}), &labels));
    }

    #[test]
    fn ports_resolve_names_ranges_and_protocols_against_the_destination() {
        let (pods, namespaces) = world();
        let with_ports = |ports: Value| {
            let spec = json!({"podSelector": {}, "ingress": [{"ports": ports}]});
            let rules = ruleset(&[policy("spur-system", spec)], &pods, &namespaces);
            chain_of(&rules, "spur-system/operator")[1..].join("; ")
        };
        assert_eq!(
            with_ports(json!([{"port": "agent"}])),
            "tcp dport 6818 return; counter drop"
        );
        assert_eq!(
            with_ports(json!([{"port": "metrics", "protocol": "UDP"}])),
            "udp dport 9090 return; counter drop"
        );
        assert_eq!(
            with_ports(json!([{"port": "metrics"}])),
            "counter drop",
            "the TCP port of that name is none"
        );
        assert_eq!(
            with_ports(json!([{"port": 6818, "endPort": 6820}])),
            "tcp dport 6818-6820 return; counter drop"
        );
        assert_eq!(
            with_ports(json!([{"protocol": "UDP"}])),
            "meta l4proto udp return; counter drop"
        );
    }

    #[test]
    fn egress_isolates_the_source_and_resolves_named_ports_at_each_peer() {
        let (pods, namespaces) = world();
        let spec = json!({"podSelector": {"matchLabels": {"app": "spurctld"}},
            "policyTypes": ["Egress"],
            "egress": [{"to": [{"namespaceSelector": {}, "podSelector":
                {"matchLabels": {"app.kubernetes.io/name": "spur-operator"}}}],
                "ports": [{"port": "agent"}]}]});
        let rules = ruleset(&[policy("spur", spec)], &pods, &namespaces);
        assert!(
            rules.contains("ip saddr 10.244.0.2 jump egress_1"),
            "{rules}"
        );
        assert_eq!(
            chain_of(&rules, "spur/spurctld-0"),
            [
                "ip daddr { 10.244.1.2 } tcp dport 6818 return",
                "counter drop"
            ]
        );
        assert!(
            !rules.contains("jump ingress"),
            "no pod is isolated for ingress: {rules}"
        );
        let implied = policy("spur", json!({"podSelector": {}, "egress": [{}]}));
        let both = ruleset(&[implied], &pods, &namespaces);
        assert!(
            both.contains("jump ingress_1") && both.contains("jump egress_1"),
            "{both}"
        );
    }

    #[test]
    fn pods_without_an_address_or_done_are_neither_isolated_nor_peers() {
        let (mut pods, namespaces) = world();
        pods[1]["status"]["phase"] = json!("Succeeded");
        pods[2]["status"] = json!({"phase": "Pending"});
        let rules = ruleset(&[deploys_policy()], &pods, &namespaces);
        assert_eq!(
            chain_of(&rules, "spur-system/operator")[1..],
            ["tcp dport 8080 return", "counter drop"],
            "{rules}"
        );
        let none = ruleset(&[], &pods, &namespaces);
        assert!(!none.contains("jump"), "{none}");
    }
}
