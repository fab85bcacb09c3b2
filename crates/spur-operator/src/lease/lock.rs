//! The objects an election record can live in: a coordination.k8s.io Lease, which our RBAC
//! grants, or the leader annotation on a ConfigMap, which upstream's ClusterRole grants where
//! it grants nothing on leases. Both carry the same record, so one takeover rule serves both.

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use serde::{Deserialize, Serialize};

/// The annotation client-go's ConfigMap lock used, with its record's field names, so a
/// person who knows that lock reads ours the same way.
pub const LEADER_ANNOTATION: &str = "control-plane.alpha.kubernetes.io/leader";

/// Which kind of object holds the election record.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LockKind {
    #[default]
    Lease,
    ConfigMap,
}

impl LockKind {
    /// The resource as RBAC names it.
    pub fn resource(self) -> &'static str {
        match self {
            LockKind::Lease => "leases",
            LockKind::ConfigMap => "configmaps",
        }
    }

    /// The label on `spur_operator_election_lock`.
    pub fn label(self) -> &'static str {
        match self {
            LockKind::Lease => "lease",
            LockKind::ConfigMap => "configmap",
        }
    }
}

/// A lock object as read, keeping its metadata so a replace is guarded by the
/// resourceVersion that was read.
#[derive(Clone, Debug)]
pub enum LockObject {
    Lease(Lease),
    ConfigMap(ConfigMap),
}

/// The record as a ConfigMap's annotation carries it.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
struct AnnotationRecord {
    #[serde(default)]
    holder_identity: String,
    #[serde(default)]
    lease_duration_seconds: i32,
    #[serde(default)]
    acquire_time: Option<MicroTime>,
    #[serde(default)]
    renew_time: Option<MicroTime>,
    #[serde(default)]
    leader_transitions: i32,
}

impl LockObject {
    /// A new object of `kind` carrying `record`.
    pub fn new(kind: LockKind, name: &str, namespace: &str, record: LeaseSpec) -> LockObject {
        let metadata = ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            ..Default::default()
        };
        let empty = match kind {
            LockKind::Lease => LockObject::Lease(Lease {
                metadata,
                spec: None,
            }),
            LockKind::ConfigMap => LockObject::ConfigMap(ConfigMap {
                metadata,
                ..Default::default()
            }),
        };
        empty.with_record(record)
    }

    #[cfg(test)]
    fn kind(&self) -> LockKind {
        match self {
            LockObject::Lease(_) => LockKind::Lease,
            LockObject::ConfigMap(_) => LockKind::ConfigMap,
        }
    }

    /// The election record. A ConfigMap without the annotation, or with one that does not
    /// parse, has no holder: it is free to take, as client-go treats it.
    pub fn record(&self) -> LeaseSpec {
        match self {
            LockObject::Lease(lease) => lease.spec.clone().unwrap_or_default(),
            LockObject::ConfigMap(map) => {
                let annotation = map
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(LEADER_ANNOTATION));
                let parsed: AnnotationRecord = annotation
                    .and_then(|text| serde_json::from_str(text).ok())
                    .unwrap_or_default();
                LeaseSpec {
                    holder_identity: Some(parsed.holder_identity),
                    lease_duration_seconds: Some(parsed.lease_duration_seconds).filter(|s| *s > 0),
                    acquire_time: parsed.acquire_time,
                    renew_time: parsed.renew_time,
                    lease_transitions: Some(parsed.leader_transitions),
                    ..Default::default()
                }
            }
        }
    }

    /// The same object carrying `record` instead.
    pub fn with_record(&self, record: LeaseSpec) -> LockObject {
        match self {
            LockObject::Lease(lease) => {
                let mut lease = lease.clone();
                lease.spec = Some(record);
                LockObject::Lease(lease)
            }
            LockObject::ConfigMap(map) => {
                let mut map = map.clone();
                let annotation = AnnotationRecord {
                    holder_identity: record.holder_identity.unwrap_or_default(),
                    lease_duration_seconds: record.lease_duration_seconds.unwrap_or(0),
                    acquire_time: record.acquire_time,
                    renew_time: record.renew_time,
                    leader_transitions: record.lease_transitions.unwrap_or(0),
                };
                let text = serde_json::to_string(&annotation).expect("a record serialises");
                map.metadata
                    .annotations
                    .get_or_insert_with(Default::default)
                    .insert(LEADER_ANNOTATION.to_owned(), text);
                LockObject::ConfigMap(map)
            }
        }
    }
}

/// The API of both kinds, in the operator's namespace.
#[derive(Clone)]
pub struct Locks {
    leases: Api<Lease>,
    config_maps: Api<ConfigMap>,
    name: String,
    namespace: String,
}

impl Locks {
    pub fn new(client: kube::Client, name: &str, namespace: &str) -> Locks {
        Locks {
            leases: Api::namespaced(client.clone(), namespace),
            config_maps: Api::namespaced(client, namespace),
            name: name.to_owned(),
            namespace: namespace.to_owned(),
        }
    }

    pub async fn read(&self, kind: LockKind) -> Result<Option<LockObject>, kube::Error> {
        Ok(match kind {
            LockKind::Lease => self
                .leases
                .get_opt(&self.name)
                .await?
                .map(LockObject::Lease),
            LockKind::ConfigMap => self
                .config_maps
                .get_opt(&self.name)
                .await?
                .map(LockObject::ConfigMap),
        })
    }

    /// A fresh object of `kind` carrying `record`.
    pub fn fresh(&self, kind: LockKind, record: LeaseSpec) -> LockObject {
        LockObject::new(kind, &self.name, &self.namespace, record)
    }

    pub async fn create(&self, object: &LockObject) -> Result<(), kube::Error> {
        let params = PostParams::default();
        match object {
            LockObject::Lease(lease) => self.leases.create(&params, lease).await.map(drop),
            LockObject::ConfigMap(map) => self.config_maps.create(&params, map).await.map(drop),
        }
    }

    pub async fn replace(&self, object: &LockObject) -> Result<(), kube::Error> {
        let params = PostParams::default();
        match object {
            LockObject::Lease(lease) => self
                .leases
                .replace(&self.name, &params, lease)
                .await
                .map(drop),
            LockObject::ConfigMap(map) => self
                .config_maps
                .replace(&self.name, &params, map)
                .await
                .map(drop),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    #[test]
    fn each_lock_kind_has_its_election_label() {
        let labels = [LockKind::Lease, LockKind::ConfigMap].map(LockKind::label);
        assert_eq!(labels, crate::metrics::ELECTION_LOCKS);
    }

    #[test]
    fn a_config_map_carries_the_same_record_a_lease_does() {
        let record = LeaseSpec {
            holder_identity: Some("operator-0".into()),
            lease_duration_seconds: Some(15),
            acquire_time: Some(MicroTime(Timestamp::from_second(100).unwrap())),
            renew_time: Some(MicroTime(Timestamp::from_second(160).unwrap())),
            lease_transitions: Some(3),
            ..Default::default()
        };
        for kind in [LockKind::Lease, LockKind::ConfigMap] {
            let object = LockObject::new(kind, "spur-operator", "spur", record.clone());
            assert_eq!(object.kind(), kind);
            assert_eq!(object.record(), record, "{kind:?}");
        }
    }

    #[test]
    fn a_config_map_without_a_readable_record_has_no_holder() {
        let mut map = ConfigMap::default();
        let free = LockObject::ConfigMap(map.clone()).record();
        assert_eq!(free.holder_identity.as_deref(), Some(""));
        map.metadata.annotations =
            Some([(LEADER_ANNOTATION.to_owned(), "{not json".to_owned())].into());
        let garbled = LockObject::ConfigMap(map).record();
        assert_eq!(garbled.holder_identity.as_deref(), Some(""));
        assert_eq!(garbled.renew_time, None);
    }
}
