//! Cluster DNS as `/etc/hosts` files: what CoreDNS's kubernetes plugin would answer a pod,
//! written as one hosts file per namespace, which each container of that namespace has
//! bind-mounted at `/etc/hosts`.
//!
//! A hosts file has no search path, so each record lists every name a pod's resolver
//! reaches through its search domains (`<ns>.svc.cluster.local`, `svc.cluster.local`,
//! `cluster.local`): `svc.ns.svc.cluster.local svc.ns.svc svc.ns` in every namespace's
//! file, and the short `svc` only in the Service's own namespace's file.
//!
//! - a Service with a clusterIP: its clusterIPs;
//! - a headless Service (`clusterIP: None`): its ready endpoints' addresses, one line each
//!   (as the lab's headless records do: glibc returns every line of a name), not-ready ones
//!   too with `publishNotReadyAddresses`; and `hostname.svc...` for an endpoint whose pod
//!   has `spec.hostname` and `spec.subdomain` = the Service (a StatefulSet's pods);
//! - `kubernetes.default...`: the API server's address, handed in.
//!
//! A name the hosts file does not hold fails at once, as CoreDNS answers NXDOMAIN for a
//! name of the cluster's domain it does not know: each pod's `/etc/resolv.conf`
//! ([`resolv_conf`]) names a nameserver on the pod's own loopback, where nothing listens.
//! With the host's resolv.conf a pod's query would leave through its default route for
//! the host's nameserver, which the host drops, and glibc would wait out its timeout
//! (seconds) on every lookup of a not-yet-Ready pod's name.
//!
//! Not answered, knowingly: ExternalName Services (a CNAME has no hosts-file form), pod
//! records (`1-2-3-4.ns.pod.cluster.local`), SRV records, and a pod's own hostname (the file
//! is shared by a namespace's pods).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::io::Write as _;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use spur_fakes::api_server::{ApiResult, ApiServer};
use spur_fakes::workloads::SERVICE_NAME_LABEL;

/// The cluster's DNS domain: the kubelet's `--cluster-domain` default, which manifests and
/// kind's clusters assume.
pub const CLUSTER_DOMAIN: &str = "cluster.local";

/// How the hosts files are kept fresh.
#[derive(Clone, Debug)]
pub struct DnsConfig {
    /// How often the records are recomputed and the files rewritten if they changed
    /// (default 200 ms, the process kubelet's sync period: a pod that turns Ready resolves
    /// about as soon as its status shows, and a pass reads four lists of a small cluster).
    pub period: Duration,
}

impl Default for DnsConfig {
    fn default() -> Self {
        Self {
            period: Duration::from_millis(200),
        }
    }
}

/// What the records are computed from: the API server's objects at one moment.
#[derive(Clone, Debug, Default)]
pub struct DnsView {
    pub namespaces: Vec<Value>,
    pub services: Vec<Value>,
    pub slices: Vec<Value>,
    pub pods: Vec<Value>,
}

impl DnsView {
    pub fn read(api: &ApiServer) -> ApiResult<Self> {
        Ok(Self {
            namespaces: api.list("v1", "Namespace")?,
            services: api.list("v1", "Service")?,
            slices: api.list("discovery.k8s.io/v1", "EndpointSlice")?,
            pods: api.list("v1", "Pod")?,
        })
    }
}

/// One hosts line: `ip` answers `prefix` under namespace `namespace` (`prefix` is `svc` or
/// `hostname.svc`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Record {
    namespace: String,
    prefix: String,
    ip: IpAddr,
}

impl Record {
    /// The names this record answers for a pod in `reader`'s namespace.
    fn names(&self, reader: &str) -> Vec<String> {
        let (prefix, ns) = (&self.prefix, &self.namespace);
        let mut names = vec![
            format!("{prefix}.{ns}.svc.{CLUSTER_DOMAIN}"),
            format!("{prefix}.{ns}.svc"),
            format!("{prefix}.{ns}"),
        ];
        if ns == reader {
            names.push(prefix.clone());
        }
        names
    }
}

/// Each namespace's hosts file text, by namespace: every namespace that has a Namespace
/// object, a Service or a pod. `api_address` answers `kubernetes.default`.
pub fn hosts_files(view: &DnsView, api_address: IpAddr) -> BTreeMap<String, String> {
    let records = records(view, api_address);
    let namespaces: BTreeSet<&str> = (view.namespaces.iter())
        .map(name)
        .chain(view.services.iter().chain(&view.pods).map(namespace))
        .filter(|ns| !ns.is_empty())
        .collect();
    namespaces
        .into_iter()
        .map(|ns| (ns.to_owned(), hosts_text(ns, &records)))
        .collect()
}

/// The `/etc/resolv.conf` a pod of `namespace` sees: the kubelet's search path for
/// `dnsPolicy: ClusterFirst` and `ndots:5`, and a nameserver that refuses at once (see the
/// module's comment).
pub fn resolv_conf(namespace: &str) -> String {
    format!(
        "# Written by the spur-lab kubelet: names resolve from /etc/hosts only.\n\
         search {namespace}.svc.{CLUSTER_DOMAIN} svc.{CLUSTER_DOMAIN} {CLUSTER_DOMAIN}\n\
         nameserver 127.0.0.1\n\
         options ndots:5\n"
    )
}

fn hosts_text(reader: &str, records: &BTreeSet<Record>) -> String {
    let mut text = format!(
        "# Cluster DNS for pods in namespace {reader} (spur-lab), rewritten in place.\n\
         127.0.0.1 localhost\n\
         ::1 localhost ip6-localhost ip6-loopback\n"
    );
    for record in records {
        let _ = writeln!(text, "{} {}", record.ip, record.names(reader).join(" "));
    }
    text
}

/// Every record of the cluster, sorted by namespace, name and address.
fn records(view: &DnsView, api_address: IpAddr) -> BTreeSet<Record> {
    let record = |ns: &str, prefix: &str, ip| Record {
        namespace: ns.to_owned(),
        prefix: prefix.to_owned(),
        ip,
    };
    let mut records = BTreeSet::from([record("default", "kubernetes", api_address)]);
    for svc in &view.services {
        let (ns, svc_name) = (namespace(svc), name(svc));
        // The API server's own Service is answered from the address handed in.
        if (ns, svc_name) == ("default", "kubernetes") || svc["spec"]["type"] == "ExternalName" {
            continue;
        }
        if svc["spec"]["clusterIP"] == "None" {
            for (ip, hostname) in headless_endpoints(view, svc) {
                records.insert(record(ns, svc_name, ip));
                if let Some(host) = hostname {
                    records.insert(record(ns, &format!("{host}.{svc_name}"), ip));
                }
            }
        } else {
            for ip in cluster_ips(svc) {
                records.insert(record(ns, svc_name, ip));
            }
        }
    }
    records
}

/// `spec.clusterIPs` (both families of a dual-stack Service), or `spec.clusterIP`.
fn cluster_ips(svc: &Value) -> Vec<IpAddr> {
    let listed = svc["spec"]["clusterIPs"]
        .as_array()
        .filter(|a| !a.is_empty());
    let ips = listed.map_or_else(|| vec![&svc["spec"]["clusterIP"]], |a| a.iter().collect());
    ips.into_iter()
        .filter_map(|ip| ip.as_str()?.parse().ok())
        .collect()
}

/// The addresses a headless Service answers, each with its pod's hostname when the pod
/// names this Service as its subdomain.
fn headless_endpoints(view: &DnsView, svc: &Value) -> Vec<(IpAddr, Option<String>)> {
    let publish_not_ready = svc["spec"]["publishNotReadyAddresses"] == true;
    let slices = (view.slices.iter())
        .filter(|s| namespace(s) == namespace(svc))
        .filter(|s| s["metadata"]["labels"][SERVICE_NAME_LABEL] == name(svc));
    let endpoints = slices.flat_map(|s| s["endpoints"].as_array().into_iter().flatten());
    // An endpoint without a ready condition is ready, as the API defines it.
    let ready = endpoints.filter(|e| publish_not_ready || e["conditions"]["ready"] != false);
    ready
        .flat_map(|e| {
            let hostname = pod_hostname(view, svc, e);
            let addresses = e["addresses"].as_array().into_iter().flatten();
            addresses
                .filter_map(|a| a.as_str()?.parse().ok())
                .map(move |ip| (ip, hostname.clone()))
        })
        .collect()
}

/// The endpoint's pod's `spec.hostname`, if its `spec.subdomain` is this Service.
fn pod_hostname(view: &DnsView, svc: &Value, endpoint: &Value) -> Option<String> {
    let target = &endpoint["targetRef"];
    let pod = view
        .pods
        .iter()
        .find(|p| namespace(p) == target["namespace"] && name(p) == target["name"])?;
    let spec = &pod["spec"];
    (spec["subdomain"] == name(svc))
        .then(|| spec["hostname"].as_str().filter(|h| !h.is_empty()))
        .flatten()
        .map(str::to_owned)
}

fn name(o: &Value) -> &str {
    o["metadata"]["name"].as_str().unwrap_or_default()
}

fn namespace(o: &Value) -> &str {
    o["metadata"]["namespace"].as_str().unwrap_or_default()
}

/// The directory of the hosts files: `<dir>/<namespace>` for each namespace.
#[derive(Clone, Debug)]
pub struct HostsFiles {
    pub dir: PathBuf,
}

impl HostsFiles {
    /// The file a pod of `namespace` has bind-mounted at `/etc/hosts`.
    pub fn path(&self, namespace: &str) -> PathBuf {
        self.dir.join(namespace)
    }

    /// Writes each namespace's file whose content differs; the namespaces written.
    pub fn write(&self, files: &BTreeMap<String, String>) -> std::io::Result<Vec<String>> {
        std::fs::create_dir_all(&self.dir)?;
        let mut written = Vec::new();
        for (ns, text) in files {
            if write_in_place(&self.path(ns), text)? {
                written.push(ns.clone());
            }
        }
        Ok(written)
    }
}

/// Rewrites `path` with `text` unless it holds it already; whether it wrote. Truncated and
/// written, never renamed: each container's `/etc/hosts` is a bind mount of this inode.
fn write_in_place(path: &Path, text: &str) -> std::io::Result<bool> {
    if std::fs::read(path).is_ok_and(|old| old == text.as_bytes()) {
        return Ok(false);
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)?;
    file.write_all(text.as_bytes())?;
    Ok(true)
}

/// One pass: reads the API server and rewrites the files that changed; the namespaces
/// written.
pub fn refresh_dns(
    api: &ApiServer,
    files: &HostsFiles,
    api_address: IpAddr,
) -> anyhow::Result<Vec<String>> {
    let view = DnsView::read(api)?;
    Ok(files.write(&hosts_files(&view, api_address))?)
}

/// Keeps `<dir>/<namespace>` fresh for ever, a pass each `config.period`; a failed pass is
/// reported once until it changes, and tried again at the next period.
pub async fn run_dns(api: ApiServer, dir: PathBuf, api_address: IpAddr, config: DnsConfig) {
    let files = HostsFiles { dir };
    super::every(config.period, "cluster DNS", || {
        refresh_dns(&api, &files, api_address)
    })
    .await;
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// A headless Service of a StatefulSet with one ready and one unready pod, a ClusterIP
    /// Service, and the API server's own.
    fn view() -> DnsView {
        let pod = |name: &str| {
            json!({"metadata": {"name": name, "namespace": "spur"},
            "spec": {"hostname": name, "subdomain": "spurctld"}})
        };
        let endpoint = |name: &str, ip: &str, ready: bool| {
            json!({"addresses": [ip],
            "conditions": {"ready": ready},
            "targetRef": {"kind": "Pod", "name": name, "namespace": "spur"}})
        };
        DnsView {
            namespaces: vec![json!({"metadata": {"name": "spur-system"}})],
            services: vec![
                json!({"metadata": {"name": "spurctld", "namespace": "spur"},
                    "spec": {"clusterIP": "None"}}),
                json!({"metadata": {"name": "spur-operator", "namespace": "spur-system"},
                    "spec": {"clusterIP": "10.96.0.20"}}),
                json!({"metadata": {"name": "kubernetes", "namespace": "default"},
                    "spec": {"clusterIP": "10.96.0.1"}}),
            ],
            slices: vec![json!({"metadata": {"namespace": "spur",
                    "labels": {SERVICE_NAME_LABEL: "spurctld"}},
                "endpoints": [endpoint("spurctld-0", "10.244.0.2", true),
                    endpoint("spurctld-1", "10.244.1.2", false)]})],
            pods: vec![pod("spurctld-0"), pod("spurctld-1")],
        }
    }

    #[test]
    fn statefulset_pods_answer_by_name_and_short_names_stay_in_their_namespace() {
        let files = hosts_files(&view(), "10.244.0.1".parse().expect("ip"));
        let spur = &files["spur"];
        assert!(
            spur.contains("10.244.0.2 spurctld-0.spurctld.spur.svc.cluster.local"),
            "{spur}"
        );
        assert!(spur.contains("10.244.0.2 spurctld.spur.svc.cluster.local spurctld.spur.svc spurctld.spur spurctld\n"), "{spur}");
        assert!(
            !spur.contains("10.244.1.2"),
            "an unready endpoint is not answered: {spur}"
        );
        let system = &files["spur-system"];
        assert!(
            system.contains(
                "10.244.0.2 spurctld.spur.svc.cluster.local spurctld.spur.svc spurctld.spur\n"
            ),
            "{system}"
        );
        assert!(
            system.contains("10.96.0.20 spur-operator.spur-system.svc.cluster.local"),
            "{system}"
        );
        assert!(
            system.contains("10.244.0.1 kubernetes.default.svc.cluster.local"),
            "{system}"
        );
        assert!(
            !system.contains("10.96.0.1 "),
            "the API server's own Service is the address handed in"
        );
    }

    #[test]
    fn an_unchanged_file_is_not_rewritten() {
        let dir = std::env::temp_dir().join(format!("spur-dns-{}", std::process::id()));
        let files = HostsFiles { dir: dir.clone() };
        let text = hosts_files(&view(), "10.244.0.1".parse().expect("ip"));
        assert_eq!(files.write(&text).expect("write").len(), text.len());
        assert!(files.write(&text).expect("again").is_empty());
        std::fs::remove_dir_all(&dir).expect("clean up");
    }
}
