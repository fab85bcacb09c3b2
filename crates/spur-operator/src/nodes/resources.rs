//! What the controller is told about a Kubernetes node: pure functions of the Node.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use spur_proto as pb;

use crate::quantity;

/// The extended resources that count GPUs, and the GPU type a node without a
/// `spur.amd.com/gpu-type` label registers with: upstream's names, so a SpurJob asking
/// for `gpuType: amd-gpu` finds the same nodes on either operator.
const GPU_RESOURCES: [(&str, &str); 2] =
    [("amd.com/gpu", "amd-gpu"), ("nvidia.com/gpu", "nvidia-gpu")];
pub const GPU_TYPE_LABEL: &str = "spur.amd.com/gpu-type";
pub const GPU_MEMORY_LABEL: &str = "spur.amd.com/gpu-memory-mb";
pub const GPU_LINK_LABEL: &str = "spur.amd.com/gpu-link";
/// Taints the node lifecycle controller puts on a node whose kubelet stopped reporting.
const NOT_READY_TAINTS: [&str; 2] = [
    "node.kubernetes.io/not-ready",
    "node.kubernetes.io/unreachable",
];

/// Where the controller dials back: the operator's virtual agent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentEndpoint {
    pub address: String,
    pub port: u16,
}

/// A value on the node that could not be used, named for the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldWarning {
    pub field: String,
    pub reason: String,
}

/// The registration for `node`, with what parses; each unusable field yields a warning
/// and counts as zero, so a node with one bad quantity is still registered.
pub fn registration(
    node: &Node,
    agent: &AgentEndpoint,
    version: &str,
) -> (pb::RegisterAgentRequest, Vec<FieldWarning>) {
    let name = node.metadata.name.clone().unwrap_or_default();
    let labels = node.metadata.labels.clone().unwrap_or_default();
    let empty = BTreeMap::new();
    let allocatable = node
        .status
        .as_ref()
        .and_then(|s| s.allocatable.as_ref())
        .unwrap_or(&empty);
    let mut warnings = Vec::new();
    let cpus = allocated(allocatable, "cpu", &mut warnings).map_or(0, |q| saturate_u32(q.whole()));
    let memory_mb =
        allocated(allocatable, "memory", &mut warnings).map_or(0, |q| saturate_u64(q.mebibytes()));
    let gpus = gpus(allocatable, &labels, &mut warnings);
    let request = pb::RegisterAgentRequest {
        hostname: name,
        resources: Some(pb::ResourceSet {
            cpus,
            memory_mb,
            gpus,
            generic: BTreeMap::new(),
        }),
        version: version.to_owned(),
        address: agent.address.clone(),
        port: u32::from(agent.port),
        wg_pubkey: String::new(),
        labels,
        join_token: String::new(),
    };
    (request, warnings)
}

/// The node's allocatable `key`, if it has one that parses; one that does not yields a
/// warning.
fn allocated(
    allocatable: &BTreeMap<String, Quantity>,
    key: &str,
    warnings: &mut Vec<FieldWarning>,
) -> Option<quantity::Quantity> {
    let raw = allocatable.get(key)?;
    quantity::parse(&raw.0)
        .map_err(|e| {
            warnings.push(FieldWarning {
                field: format!("status.allocatable[{key}]"),
                reason: e.to_string(),
            })
        })
        .ok()
}

/// One entry per GPU the node's allocatable counts, numbered across vendors, with the type,
/// memory and links its labels give.
fn gpus(
    allocatable: &BTreeMap<String, Quantity>,
    labels: &BTreeMap<String, String>,
    warnings: &mut Vec<FieldWarning>,
) -> Vec<pb::GpuResource> {
    let mut gpus = Vec::new();
    for (resource, vendor) in GPU_RESOURCES {
        let Some(count) = allocated(allocatable, resource, warnings).map(|q| q.whole()) else {
            continue;
        };
        let gpu_type = labels
            .get(GPU_TYPE_LABEL)
            .cloned()
            .unwrap_or_else(|| vendor.to_owned());
        let memory_mb = gpu_memory_mb(labels, warnings);
        let link_type = gpu_link(labels, warnings);
        // A GPU count beyond a node's physical slots is a typo, not hardware.
        let count = count.min(64) as u32;
        for device_id in 0..count {
            let peer_gpus = if link_type == pb::GpuLinkType::GpuLinkPcie {
                Vec::new()
            } else {
                (0..count).filter(|d| *d != device_id).collect()
            };
            gpus.push(pb::GpuResource {
                device_id: gpus.len() as u32,
                gpu_type: gpu_type.clone(),
                memory_mb,
                peer_gpus,
                link_type: link_type as i32,
            });
        }
    }
    gpus
}

/// Each GPU's memory in MiB, from the node's label; 0 without one, or with one that does
/// not parse.
fn gpu_memory_mb(labels: &BTreeMap<String, String>, warnings: &mut Vec<FieldWarning>) -> u64 {
    match labels.get(GPU_MEMORY_LABEL).map(|v| v.parse::<u64>()) {
        Some(Ok(mb)) => mb,
        Some(Err(_)) => {
            warnings.push(FieldWarning {
                field: format!("metadata.labels[{GPU_MEMORY_LABEL}]"),
                reason: "not a whole number of MiB".into(),
            });
            0
        }
        None => 0,
    }
}

/// How the node's GPUs are linked, from its label; PCIe (no peers) without one.
fn gpu_link(
    labels: &BTreeMap<String, String>,
    warnings: &mut Vec<FieldWarning>,
) -> pb::GpuLinkType {
    match labels.get(GPU_LINK_LABEL).map(|v| v.to_ascii_lowercase()) {
        None => pb::GpuLinkType::GpuLinkPcie,
        Some(link) => match link.as_str() {
            "pcie" => pb::GpuLinkType::GpuLinkPcie,
            "xgmi" | "infinity-fabric" => pb::GpuLinkType::GpuLinkXgmi,
            "nvlink" => pb::GpuLinkType::GpuLinkNvlink,
            _ => {
                warnings.push(FieldWarning {
                    field: format!("metadata.labels[{GPU_LINK_LABEL}]"),
                    reason: format!("`{link}` is not pcie, xgmi or nvlink"),
                });
                pb::GpuLinkType::GpuLinkPcie
            }
        },
    }
}

/// Whether the controller should schedule onto the node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Availability {
    Up,
    /// Not ready (a NotReady or unreachable taint): told as `--not-ready-node-state` says.
    Down {
        reason: String,
    },
    /// Cordoned, or one of the `--drain-on-node-condition` conditions holds: DRAIN, so the
    /// jobs running there finish and no new one starts, which is what a cordon means.
    Drain {
        reason: String,
    },
}

impl Availability {
    /// The label of `spur_operator_nodes_drained` this availability counts under.
    pub fn drain_kind(&self) -> Option<&'static str> {
        match self {
            Availability::Up => None,
            Availability::Down { .. } => Some("not_ready"),
            Availability::Drain { reason } if reason.starts_with(CONDITION_REASON) => {
                Some("condition")
            }
            Availability::Drain { .. } => Some("cordoned"),
        }
    }
}

/// On a node: why it is cordoned, for the drain reason spurctld shows (`sinfo -R`).
pub const DRAIN_REASON_ANNOTATION: &str = "spur.amd.com/drain-reason";
const CORDON_REASON: &str = "Kubernetes: cordoned";
const CONDITION_REASON: &str = "Kubernetes: node condition";

/// What the node's taints, cordon and conditions make it, most severe first: not ready
/// (DOWN or DRAIN as configured), then a `drain_conditions` condition that is `True`, then
/// a cordon (with the reason of its `spur.amd.com/drain-reason` annotation).
pub fn availability(node: &Node, drain_conditions: &[String]) -> Availability {
    let spec = node.spec.as_ref();
    let taints = spec.and_then(|s| s.taints.as_deref()).unwrap_or_default();
    if let Some(taint) = taints
        .iter()
        .find(|t| NOT_READY_TAINTS.contains(&t.key.as_str()))
    {
        return Availability::Down {
            reason: format!("Kubernetes taint {}:{}", taint.key, taint.effect),
        };
    }
    let conditions = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default();
    // In the configured order, so the reason shown does not depend on the node's.
    for wanted in drain_conditions {
        if let Some(condition) = conditions
            .iter()
            .find(|c| &c.type_ == wanted && c.status == "True")
        {
            let detail = condition
                .message
                .as_deref()
                .or(condition.reason.as_deref())
                .map(str::trim)
                .filter(|d| !d.is_empty());
            return Availability::Drain {
                reason: match detail {
                    Some(detail) => format!("{CONDITION_REASON} {wanted}: {detail}"),
                    None => format!("{CONDITION_REASON} {wanted}"),
                },
            };
        }
    }
    if spec.and_then(|s| s.unschedulable) == Some(true) {
        let annotated = node
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(DRAIN_REASON_ANNOTATION))
            .map(|r| r.trim())
            .filter(|r| !r.is_empty());
        return Availability::Drain {
            reason: match annotated {
                Some(why) => format!("{CORDON_REASON}: {why}"),
                None => CORDON_REASON.to_owned(),
            },
        };
    }
    Availability::Up
}

/// Why spurctld holds `node` at someone else's word, when it does: a DRAIN (or DRAINING)
/// whose reason is not one this operator writes, so an administrator's (`scontrol update
/// state=drain reason=...`). The operator neither lifts it (IDLE) nor writes its own
/// reason over it (DRAIN); a Kubernetes cordon on such a node changes nothing in spurctld.
pub fn admin_hold(node: &spur_proto::NodeInfo) -> Option<&str> {
    let held = matches!(
        node.state(),
        spur_proto::NodeState::NodeDrain | spur_proto::NodeState::NodeDraining
    );
    let reason = node.state_reason.trim();
    let ours = reason.starts_with("Kubernetes") || reason == super::sync::DELETED_REASON;
    (held && !ours).then_some(reason)
}

fn saturate_u32(v: u128) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

fn saturate_u64(v: u128) -> u64 {
    u64::try_from(v).unwrap_or(u64::MAX)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeSpec, NodeStatus, Taint};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    pub(crate) fn node(name: &str, allocatable: &[(&str, &str)], labels: &[(&str, &str)]) -> Node {
        let mut node = Node::default();
        node.metadata.name = Some(name.into());
        node.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        node.status = Some(NodeStatus {
            allocatable: Some(
                allocatable
                    .iter()
                    .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                    .collect(),
            ),
            ..Default::default()
        });
        node
    }

    const AGENT: fn() -> AgentEndpoint = || AgentEndpoint {
        address: "10.9.8.7".into(),
        port: 6818,
    };

    #[test]
    fn a_gpu_node_registers_with_its_allocatable() {
        let n = node(
            "gpu-1",
            &[
                ("cpu", "127500m"),
                ("memory", "1056768000Ki"),
                ("amd.com/gpu", "8"),
                ("pods", "110"),
            ],
            &[
                (GPU_TYPE_LABEL, "mi300x"),
                (GPU_MEMORY_LABEL, "196608"),
                (GPU_LINK_LABEL, "xgmi"),
                ("spur.amd.com/managed", "true"),
            ],
        );
        let (req, warnings) = registration(&n, &AGENT(), "spur-operator/0.1.0");
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(req.hostname, "gpu-1");
        assert_eq!((req.address.as_str(), req.port), ("10.9.8.7", 6818));
        let res = req.resources.unwrap();
        assert_eq!(res.cpus, 127);
        assert_eq!(res.memory_mb, 1_032_000);
        assert_eq!(res.gpus.len(), 8);
        let third = &res.gpus[2];
        assert_eq!(third.device_id, 2);
        assert_eq!(third.gpu_type, "mi300x");
        assert_eq!(third.memory_mb, 196_608);
        assert_eq!(third.link_type, pb::GpuLinkType::GpuLinkXgmi as i32);
        assert_eq!(third.peer_gpus, vec![0, 1, 3, 4, 5, 6, 7]);
        assert_eq!(req.labels.get("spur.amd.com/managed").unwrap(), "true");
    }

    #[test]
    fn nvidia_defaults_and_cpu_only_nodes() {
        let n = node(
            "n",
            &[("cpu", "4"), ("memory", "8Gi"), ("nvidia.com/gpu", "2")],
            &[],
        );
        let res = registration(&n, &AGENT(), "v").0.resources.unwrap();
        assert_eq!((res.cpus, res.memory_mb), (4, 8192));
        assert!(
            res.gpus
                .iter()
                .all(|g| g.gpu_type == "nvidia-gpu" && g.peer_gpus.is_empty())
        );
        let cpu_only = node("c", &[("cpu", "2")], &[]);
        let res = registration(&cpu_only, &AGENT(), "v").0.resources.unwrap();
        assert_eq!((res.cpus, res.memory_mb, res.gpus.len()), (2, 0, 0));
    }

    #[test]
    fn unparseable_fields_are_named_and_the_rest_registers() {
        let n = node(
            "bad",
            &[("cpu", "lots"), ("memory", "16Gi"), ("amd.com/gpu", "2")],
            &[
                (GPU_MEMORY_LABEL, "big"),
                (GPU_LINK_LABEL, "carrier-pigeon"),
            ],
        );
        let (req, warnings) = registration(&n, &AGENT(), "v");
        let fields: Vec<&str> = warnings.iter().map(|w| w.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "status.allocatable[cpu]",
                "metadata.labels[spur.amd.com/gpu-memory-mb]",
                "metadata.labels[spur.amd.com/gpu-link]"
            ]
        );
        let res = req.resources.unwrap();
        assert_eq!((res.cpus, res.memory_mb, res.gpus.len()), (0, 16384, 2));
    }

    #[test]
    fn not_ready_taints_mean_down() {
        let mut n = node("n", &[], &[]);
        assert_eq!(availability(&n, &[]), Availability::Up);
        n.spec = Some(NodeSpec {
            taints: Some(vec![
                Taint {
                    key: "gpu".into(),
                    effect: "NoSchedule".into(),
                    ..Default::default()
                },
                Taint {
                    key: "node.kubernetes.io/not-ready".into(),
                    effect: "NoExecute".into(),
                    ..Default::default()
                },
            ]),
            ..Default::default()
        });
        assert_eq!(
            availability(&n, &[]),
            Availability::Down {
                reason: "Kubernetes taint node.kubernetes.io/not-ready:NoExecute".into()
            }
        );
    }

    fn condition(
        type_: &str,
        status: &str,
        message: &str,
    ) -> k8s_openapi::api::core::v1::NodeCondition {
        k8s_openapi::api::core::v1::NodeCondition {
            type_: type_.into(),
            status: status.into(),
            message: Some(message.into()),
            ..Default::default()
        }
    }

    #[test]
    fn only_a_drain_with_a_reason_the_operator_never_writes_is_an_administrators() {
        let node = |state: spur_proto::NodeState, reason: &str| spur_proto::NodeInfo {
            name: "gpu-1".into(),
            state: state as i32,
            state_reason: reason.into(),
        };
        use spur_proto::NodeState::*;
        let table = [
            (NodeDrain, "RMA 77", Some("RMA 77")),
            (NodeDraining, " bad DIMM ", Some("bad DIMM")),
            (NodeDrain, "", Some("")),
            (NodeDrain, "Kubernetes: cordoned: RMA 77", None),
            (NodeDrain, "Kubernetes: node condition GPUProblem", None),
            (
                NodeDrain,
                "Kubernetes taint node.kubernetes.io/unreachable:NoExecute",
                None,
            ),
            (NodeDrain, "node deleted from Kubernetes", None),
            (NodeDown, "admin: dead PSU", None),
            (NodeIdle, "RMA 77", None),
            (NodeAllocated, "", None),
        ];
        for (state, reason, held) in table {
            assert_eq!(
                admin_hold(&node(state, reason)),
                held,
                "{state:?} {reason:?}"
            );
        }
    }

    #[test]
    fn a_cordon_or_a_configured_condition_drains_with_its_reason() {
        let gpu_problem = vec!["GPUProblem".to_owned()];
        let mut n = node("n", &[], &[]);
        n.status.get_or_insert_with(Default::default).conditions = Some(vec![
            condition("Ready", "True", "kubelet is posting ready status"),
            condition("GPUProblem", "False", "all GPUs healthy"),
        ]);
        assert_eq!(availability(&n, &gpu_problem), Availability::Up);

        n.spec = Some(NodeSpec {
            unschedulable: Some(true),
            ..Default::default()
        });
        let cordoned = availability(&n, &gpu_problem);
        assert_eq!(
            cordoned,
            Availability::Drain {
                reason: "Kubernetes: cordoned".into()
            }
        );
        assert_eq!(cordoned.drain_kind(), Some("cordoned"));
        n.metadata.annotations = Some(
            [(
                DRAIN_REASON_ANNOTATION.to_owned(),
                " RMA ticket 4411 ".to_owned(),
            )]
            .into(),
        );
        assert_eq!(
            availability(&n, &gpu_problem),
            Availability::Drain {
                reason: "Kubernetes: cordoned: RMA ticket 4411".into()
            }
        );

        // A condition drains by itself, cordoned or not, and names itself.
        n.spec = None;
        n.status.as_mut().unwrap().conditions = Some(vec![condition(
            "GPUProblem",
            "True",
            "GPU 3: uncorrectable ECC errors",
        )]);
        let sick = availability(&n, &gpu_problem);
        assert_eq!(
            sick,
            Availability::Drain {
                reason: "Kubernetes: node condition GPUProblem: GPU 3: uncorrectable ECC errors"
                    .into()
            }
        );
        assert_eq!(sick.drain_kind(), Some("condition"));
        // Only configured conditions count.
        assert_eq!(availability(&n, &[]), Availability::Up);

        // Not ready wins over both.
        n.spec = Some(NodeSpec {
            unschedulable: Some(true),
            taints: Some(vec![Taint {
                key: "node.kubernetes.io/unreachable".into(),
                effect: "NoExecute".into(),
                ..Default::default()
            }]),
            ..Default::default()
        });
        let unreachable = availability(&n, &gpu_problem);
        assert_eq!(unreachable.drain_kind(), Some("not_ready"));
    }
}
