//! A Service's clusterIP, given by the API server in the create's answer as kube-apiserver's
//! allocator gives it (`--service-cluster-ip-range`): the lowest free address of the range,
//! so two runs that create the same Services give the same addresses. A clusterIP a client
//! asks for is kept if it is in the range and free; `None` (headless) and ExternalName
//! Services get none. An update that leaves the field out keeps the one given, and none
//! may change it, as in Kubernetes.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

use serde_json::{Value, json};

use super::error::{ApiError, ApiResult};

/// The addresses Services get their clusterIP from, both ends included.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServiceIpRange {
    pub first: Ipv4Addr,
    pub last: Ipv4Addr,
}

impl ServiceIpRange {
    /// kubeadm's default 10.96.0.0/16, from 10.96.0.10: below it kubeadm keeps the
    /// `kubernetes` Service's and the cluster DNS's addresses.
    pub const KUBEADM: Self = Self {
        first: Ipv4Addr::new(10, 96, 0, 10),
        last: Ipv4Addr::new(10, 96, 255, 254),
    };

    fn contains(&self, ip: Ipv4Addr) -> bool {
        (self.first..=self.last).contains(&ip)
    }
}

/// Gives the new Service `obj` its clusterIP, given the Services that exist.
pub(crate) fn assign<'a>(
    range: ServiceIpRange,
    existing: impl Iterator<Item = &'a Value>,
    obj: &mut Value,
) -> ApiResult<()> {
    let spec = &obj["spec"];
    if spec["type"] == "ExternalName" || spec["clusterIP"] == "None" {
        return Ok(());
    }
    let used: BTreeSet<Ipv4Addr> = existing.filter_map(cluster_ip).collect();
    let ip = match spec["clusterIP"].as_str().filter(|ip| !ip.is_empty()) {
        Some(asked) => checked_request(range, &used, asked, &obj["metadata"]["name"])?,
        None => lowest_free(range, &used)?,
    };
    obj["spec"]["clusterIP"] = json!(ip.to_string());
    obj["spec"]["clusterIPs"] = json!([ip.to_string()]);
    Ok(())
}

/// Keeps the clusterIP `existing` was given through an update `next` that leaves it out,
/// and refuses one that changes it.
pub(crate) fn carry_over(existing: &Value, next: &mut Value) -> ApiResult<()> {
    let given = &existing["spec"]["clusterIP"];
    let asked = next["spec"]["clusterIP"].as_str().unwrap_or_default();
    if given.is_null() || !next["spec"].is_object() {
        return Ok(());
    }
    if asked.is_empty() {
        next["spec"]["clusterIP"] = given.clone();
        next["spec"]["clusterIPs"] = existing["spec"]["clusterIPs"].clone();
        return Ok(());
    }
    if given != asked {
        return Err(ApiError::invalid(format!(
            "Service \"{}\" is invalid: spec.clusterIPs[0]: Invalid value: []string{{\"{asked}\"}}: \
             may not change once set",
            text(&existing["metadata"]["name"]),
        )));
    }
    Ok(())
}

fn checked_request(
    range: ServiceIpRange,
    used: &BTreeSet<Ipv4Addr>,
    asked: &str,
    name: &Value,
) -> ApiResult<Ipv4Addr> {
    let invalid = |why: String| {
        ApiError::invalid(format!(
            "Service \"{}\" is invalid: spec.clusterIPs[0]: Invalid value: \"{asked}\": {why}",
            text(name)
        ))
    };
    let ip: Ipv4Addr = asked
        .parse()
        .map_err(|_| invalid("must be a valid IP address, (e.g. 10.9.8.7)".into()))?;
    if !range.contains(ip) {
        return Err(invalid(format!(
            "provided IP is not in the valid range ({}-{})",
            range.first, range.last
        )));
    }
    if used.contains(&ip) {
        return Err(invalid("provided IP is already allocated".into()));
    }
    Ok(ip)
}

fn lowest_free(range: ServiceIpRange, used: &BTreeSet<Ipv4Addr>) -> ApiResult<Ipv4Addr> {
    (u32::from(range.first)..=u32::from(range.last))
        .map(Ipv4Addr::from)
        .find(|ip| !used.contains(ip))
        .ok_or_else(|| {
            ApiError::internal(format!(
                "failed to allocate a serviceIP: range {}-{} is full",
                range.first, range.last
            ))
        })
}

fn cluster_ip(service: &Value) -> Option<Ipv4Addr> {
    service["spec"]["clusterIP"].as_str()?.parse().ok()
}

fn text(value: &Value) -> &str {
    value.as_str().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::super::store::{Store, StoreConfig};
    use super::*;
    use crate::clock::TimeSource;

    #[test]
    fn a_create_answers_with_the_address_and_a_replace_keeps_it() {
        let mut store = Store::new(
            TimeSource::from_fn(|| k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            StoreConfig {
                service_cluster_ips: Some(ServiceIpRange::KUBEADM),
                ..StoreConfig::default()
            },
        );
        let rt = store.type_for("v1", "Service").expect("the Service kind");
        let web = json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"ports": [{"port": 80}]}});
        let created = store
            .create(&rt, Some("default"), web.clone())
            .expect("create");
        assert_eq!(created["spec"]["clusterIP"], "10.96.0.10");
        let replaced = store
            .update(&rt, Some("default"), "web", web, false)
            .expect("a replace without the field");
        assert_eq!(replaced["spec"]["clusterIP"], "10.96.0.10");
    }

    fn service(spec: Value) -> Value {
        json!({"metadata": {"name": "web"}, "spec": spec})
    }

    #[test]
    fn the_lowest_free_address_is_given_and_headless_ones_get_none() {
        let range = ServiceIpRange::KUBEADM;
        let first = service(json!({"clusterIP": "10.96.0.10"}));
        let mut next = service(json!({"ports": [{"port": 80}]}));
        assign(range, [&first].into_iter(), &mut next).expect("a free address");
        assert_eq!(next["spec"]["clusterIP"], "10.96.0.11");
        assert_eq!(next["spec"]["clusterIPs"], json!(["10.96.0.11"]));
        let mut headless = service(json!({"clusterIP": "None"}));
        assign(range, [&first].into_iter(), &mut headless).expect("headless");
        assert_eq!(headless["spec"]["clusterIP"], "None");
        assert!(headless["spec"]["clusterIPs"].is_null());
    }

    #[test]
    fn an_asked_address_is_kept_only_in_the_range_and_free() {
        let range = ServiceIpRange::KUBEADM;
        let taken = service(json!({"clusterIP": "10.96.0.20"}));
        let ask = |ip: &str| {
            let mut obj = service(json!({"clusterIP": ip}));
            assign(range, [&taken].into_iter(), &mut obj).map(|()| obj)
        };
        assert_eq!(
            ask("10.96.0.21").expect("free")["spec"]["clusterIP"],
            "10.96.0.21"
        );
        let taken_error = ask("10.96.0.20").expect_err("taken").message;
        assert!(taken_error.contains("already allocated"), "{taken_error}");
        let outside = ask("192.168.0.1").expect_err("outside").message;
        assert!(outside.contains("not in the valid range"), "{outside}");
        assert!(ask("ten").is_err());
    }

    #[test]
    fn an_update_keeps_the_address_and_may_not_change_it() {
        let existing = service(json!({"clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10"]}));
        let mut silent = service(json!({"ports": [{"port": 81}]}));
        carry_over(&existing, &mut silent).expect("kept");
        assert_eq!(silent["spec"]["clusterIP"], "10.96.0.10");
        let mut changed = service(json!({"clusterIP": "10.96.0.99"}));
        let error = carry_over(&existing, &mut changed)
            .expect_err("changed")
            .message;
        assert!(error.contains("may not change"), "{error}");
    }
}
