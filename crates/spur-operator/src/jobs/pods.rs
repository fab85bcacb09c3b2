//! The pod (and headless Service) that runs one node's share of a job: pure functions of
//! the SpurJob and the controller's LaunchJob.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, EmptyDirVolumeSource, EnvVar, EnvVarSource, HostPathVolumeSource,
    PersistentVolumeClaimVolumeSource, Pod, PodSpec, ResourceRequirements, SecretKeySelector,
    SecurityContext, Service, ServicePort, ServiceSpec, Toleration as K8sToleration, Volume,
    VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::{Resource, ResourceExt};
use spur_proto as pb;

use super::convert::{self, Volume as JobVolume};
use super::crd::SpurJob;
use super::{LABEL_JOB_ID, LABEL_MANAGED_BY, LABEL_SPURJOB_UID, MANAGED_BY, service_name};

pub const ANNOTATION_RUN_ATTEMPT: &str = "spur.amd.com/run-attempt";
pub const ANNOTATION_TARGET_NODE: &str = "spur.amd.com/target-node";
pub const ANNOTATION_REPORTED: &str = "spur.amd.com/reported";
/// The container that runs the job's tasks.
pub const CONTAINER: &str = "job";

/// The pod's name: the same for the same (job, node, attempt), so a repeated LaunchJob
/// finds the pod it already created instead of making a second.
pub fn pod_name(job_id: u32, rank: usize, run_attempt: u32) -> String {
    if run_attempt > 1 {
        format!("spur-job-{job_id}-{rank}-r{run_attempt}")
    } else {
        format!("spur-job-{job_id}-{rank}")
    }
}

/// The node's rank in the allocation: its index in `peer_nodes` (0 for a one-node job).
pub fn rank(launch: &pb::LaunchJobRequest) -> Option<usize> {
    if launch.peer_nodes.is_empty() {
        return Some(0);
    }
    launch
        .peer_nodes
        .iter()
        .position(|n| *n == launch.target_node)
}

/// Builds the pod for `launch` on its target node. `gpu_resource` is the node's GPU
/// resource name (`amd.com/gpu` or `nvidia.com/gpu`).
pub fn build_pod(
    job: &SpurJob,
    launch: &pb::LaunchJobRequest,
    gpu_resource: &str,
) -> Result<Pod, String> {
    let spec = &job.spec;
    let rank = rank(launch).ok_or_else(|| {
        format!(
            "target node {} is not in the allocation {:?}",
            launch.target_node, launch.peer_nodes
        )
    })?;
    let name = pod_name(launch.job_id, rank, launch.run_attempt);
    let uid = job.uid().unwrap_or_default();
    let num_nodes = launch.peer_nodes.len().max(1);

    let mut labels = BTreeMap::new();
    labels.insert(LABEL_JOB_ID.to_owned(), launch.job_id.to_string());
    labels.insert(LABEL_MANAGED_BY.to_owned(), MANAGED_BY.to_owned());
    labels.insert(LABEL_SPURJOB_UID.to_owned(), uid.clone());
    let mut annotations = BTreeMap::new();
    annotations.insert(
        ANNOTATION_RUN_ATTEMPT.to_owned(),
        launch.run_attempt.to_string(),
    );
    annotations.insert(
        ANNOTATION_TARGET_NODE.to_owned(),
        launch.target_node.clone(),
    );

    let mut env: Vec<EnvVar> = spec
        .env
        .iter()
        .map(|(k, v)| EnvVar {
            name: k.clone(),
            value: Some(v.clone()),
            ..Default::default()
        })
        .collect();
    for (var, reference) in &spec.secret_env {
        let (secret, key) = convert::parse_secret_ref(reference)?;
        env.push(EnvVar {
            name: var.clone(),
            value_from: Some(EnvVarSource {
                secret_key_ref: Some(SecretKeySelector {
                    name: secret,
                    key,
                    optional: Some(false),
                }),
                ..Default::default()
            }),
            ..Default::default()
        });
    }
    let spur_env = [
        ("SPUR_JOB_ID", launch.job_id.to_string()),
        ("SPUR_NODE_RANK", rank.to_string()),
        ("SPUR_NUM_NODES", num_nodes.to_string()),
        ("SPUR_NODELIST", launch.peer_nodes.join(",")),
        ("SPUR_TASKS_PER_NODE", spec.tasks_per_node.to_string()),
        ("SPUR_TASK_OFFSET", launch.task_offset.to_string()),
        ("SPUR_RUN_ATTEMPT", launch.run_attempt.to_string()),
    ];
    env.extend(spur_env.into_iter().map(|(k, v)| EnvVar {
        name: k.to_owned(),
        value: Some(v),
        ..Default::default()
    }));

    // Requests equal limits: the allocation is what spurctld reserved on the node.
    let allocated = launch.allocated.clone().unwrap_or_default();
    let cpus = if allocated.cpus > 0 {
        allocated.cpus
    } else {
        spec.tasks_per_node.saturating_mul(spec.cpus_per_task)
    };
    let memory_mb = if allocated.memory_mb > 0 {
        allocated.memory_mb
    } else {
        launch.spec.as_ref().map_or(0, |s| s.memory_per_node_mb)
    };
    let gpus = allocated
        .devices
        .get("gpu")
        .map(|d| d.devices.iter().map(|a| a.count.max(1)).sum::<u64>())
        .filter(|n| *n > 0)
        .or_else(|| spec.gpus.as_ref().map(|g| u64::from(g.count)))
        .unwrap_or(0);
    let mut resources = BTreeMap::new();
    resources.insert("cpu".to_owned(), Quantity(cpus.max(1).to_string()));
    if memory_mb > 0 {
        resources.insert("memory".to_owned(), Quantity(format!("{memory_mb}Mi")));
    }
    if gpus > 0 {
        resources.insert(gpu_resource.to_owned(), Quantity(gpus.to_string()));
    }

    let mut volumes = Vec::new();
    let mut mounts = Vec::new();
    for (i, raw) in spec.volumes.iter().enumerate() {
        let volume_name = format!("vol-{i}");
        let (source, target, read_only) = match convert::parse_volume(raw)? {
            JobVolume::HostPath {
                source,
                target,
                read_only,
            } => (
                Volume {
                    name: volume_name.clone(),
                    host_path: Some(HostPathVolumeSource {
                        path: source,
                        type_: None,
                    }),
                    ..Default::default()
                },
                target,
                read_only,
            ),
            JobVolume::Claim {
                claim,
                target,
                read_only,
            } => (
                Volume {
                    name: volume_name.clone(),
                    persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                        claim_name: claim,
                        read_only: Some(read_only),
                    }),
                    ..Default::default()
                },
                target,
                read_only,
            ),
        };
        volumes.push(source);
        mounts.push(VolumeMount {
            name: volume_name,
            mount_path: target,
            read_only: Some(read_only),
            ..Default::default()
        });
    }
    if let Some(size) = &spec.shm_size {
        volumes.push(Volume {
            name: "dshm".to_owned(),
            empty_dir: Some(EmptyDirVolumeSource {
                medium: Some("Memory".to_owned()),
                size_limit: Some(Quantity(size.clone())),
            }),
            ..Default::default()
        });
        mounts.push(VolumeMount {
            name: "dshm".to_owned(),
            mount_path: "/dev/shm".to_owned(),
            ..Default::default()
        });
    }

    let container = Container {
        name: CONTAINER.to_owned(),
        image: Some(spec.image.clone()),
        command: (!spec.command.is_empty()).then(|| spec.command.clone()),
        args: (!spec.args.is_empty()).then(|| spec.args.clone()),
        env: Some(env),
        resources: Some(ResourceRequirements {
            requests: Some(resources.clone()),
            limits: Some(resources),
            ..Default::default()
        }),
        volume_mounts: (!mounts.is_empty()).then_some(mounts),
        security_context: spec.privileged.then(|| SecurityContext {
            privileged: Some(true),
            ..Default::default()
        }),
        ..Default::default()
    };
    let tolerations: Vec<K8sToleration> = spec
        .tolerations
        .iter()
        .map(|t| K8sToleration {
            key: t.key.clone(),
            operator: t.operator.clone(),
            value: t.value.clone(),
            effect: t.effect.clone(),
            toleration_seconds: t.toleration_seconds,
        })
        .collect();
    let multi_node = num_nodes > 1;
    Ok(Pod {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: job.namespace(),
            labels: Some(labels),
            annotations: Some(annotations),
            owner_references: Some(vec![owner_reference(job)]),
            ..Default::default()
        },
        spec: Some(PodSpec {
            // spurctld placed the job: pin the pod to that node, bypassing the scheduler.
            node_name: Some(launch.target_node.clone()),
            restart_policy: Some("Never".to_owned()),
            containers: vec![container],
            volumes: (!volumes.is_empty()).then_some(volumes),
            tolerations: (!tolerations.is_empty()).then_some(tolerations),
            node_selector: (!spec.node_selector.is_empty()).then(|| spec.node_selector.clone()),
            host_network: spec.host_network.then_some(true),
            host_ipc: spec.host_ipc.then_some(true),
            priority_class_name: spec.priority_class.clone(),
            service_account_name: spec.service_account.clone(),
            hostname: multi_node.then(|| format!("node-{rank}")),
            subdomain: multi_node.then(|| service_name(launch.job_id)),
            ..Default::default()
        }),
        status: None,
    })
}

/// The headless Service that gives a multi-node job's pods stable names
/// (`node-<rank>.spur-job-<id>`).
pub fn build_service(job: &SpurJob, job_id: u32) -> Service {
    let mut selector = BTreeMap::new();
    selector.insert(LABEL_JOB_ID.to_owned(), job_id.to_string());
    let mut labels = selector.clone();
    labels.insert(LABEL_MANAGED_BY.to_owned(), MANAGED_BY.to_owned());
    Service {
        metadata: ObjectMeta {
            name: Some(service_name(job_id)),
            namespace: job.namespace(),
            labels: Some(labels),
            owner_references: Some(vec![owner_reference(job)]),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".to_owned()),
            selector: Some(selector),
            // Peers must resolve each other before all are ready.
            publish_not_ready_addresses: Some(true),
            ports: Some(vec![ServicePort {
                name: Some("rendezvous".to_owned()),
                port: 29500,
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: None,
    }
}

fn owner_reference(job: &SpurJob) -> OwnerReference {
    OwnerReference {
        api_version: SpurJob::api_version(&()).into_owned(),
        kind: SpurJob::kind(&()).into_owned(),
        name: job.name_any(),
        uid: job.uid().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jobs::crd::{GpuSpec, SpurJobSpec, Toleration};

    fn job() -> SpurJob {
        let mut job = SpurJob::new(
            "train",
            SpurJobSpec {
                image: "rocm/pytorch:6".into(),
                command: vec!["torchrun".into()],
                args: vec!["train.py".into()],
                env: [("A".to_string(), "1".to_string())].into(),
                secret_env: [("HF_TOKEN".to_string(), "hf/token".to_string())].into(),
                gpus: Some(GpuSpec {
                    count: 8,
                    gpu_type: None,
                }),
                num_nodes: 2,
                tasks_per_node: 8,
                cpus_per_task: 4,
                volumes: vec!["/data:/data:ro".into(), "pvc:ckpt:/ckpt".into()],
                shm_size: Some("16Gi".into()),
                tolerations: vec![Toleration {
                    key: Some("gpu".into()),
                    operator: Some("Exists".into()),
                    ..Default::default()
                }],
                host_ipc: true,
                ..Default::default()
            },
        );
        job.metadata.namespace = Some("ml".into());
        job.metadata.uid = Some("uid-1".into());
        job
    }

    fn launch(target: &str) -> pb::LaunchJobRequest {
        pb::LaunchJobRequest {
            job_id: 12,
            peer_nodes: vec!["n1".into(), "n2".into()],
            target_node: target.into(),
            allocated: Some(pb::ResourceAllocations {
                cpus: 32,
                memory_mb: 65536,
                devices: [(
                    "gpu".to_string(),
                    pb::DeviceAllocations {
                        devices: (0..8)
                            .map(|d| pb::AllocatedDevice {
                                device_id: d,
                                count: 1,
                            })
                            .collect(),
                    },
                )]
                .into(),
            }),
            run_attempt: 1,
            ..Default::default()
        }
    }

    #[test]
    fn the_pod_is_pinned_sized_and_labelled() {
        let pod = build_pod(&job(), &launch("n2"), "amd.com/gpu").unwrap();
        assert_eq!(pod.metadata.name.as_deref(), Some("spur-job-12-1"));
        assert_eq!(pod.metadata.namespace.as_deref(), Some("ml"));
        let labels = pod.metadata.labels.as_ref().unwrap();
        assert_eq!(labels[LABEL_JOB_ID], "12");
        assert_eq!(labels[LABEL_MANAGED_BY], "spur-operator");
        assert_eq!(labels[LABEL_SPURJOB_UID], "uid-1");
        let owner = &pod.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("SpurJob", "uid-1")
        );
        let spec = pod.spec.unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("n2"));
        assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
        assert_eq!(spec.hostname.as_deref(), Some("node-1"));
        assert_eq!(spec.subdomain.as_deref(), Some("spur-job-12"));
        assert_eq!(spec.host_ipc, Some(true));
        let c = &spec.containers[0];
        let limits = c.resources.as_ref().unwrap().limits.as_ref().unwrap();
        assert_eq!(limits["cpu"].0, "32");
        assert_eq!(limits["memory"].0, "65536Mi");
        assert_eq!(limits["amd.com/gpu"].0, "8");
        let env = c.env.as_ref().unwrap();
        let secret = env.iter().find(|e| e.name == "HF_TOKEN").unwrap();
        let key = secret
            .value_from
            .as_ref()
            .unwrap()
            .secret_key_ref
            .as_ref()
            .unwrap();
        assert_eq!((key.name.as_str(), key.key.as_str()), ("hf", "token"));
        let rank = env.iter().find(|e| e.name == "SPUR_NODE_RANK").unwrap();
        assert_eq!(rank.value.as_deref(), Some("1"));
        let mounts = c.volume_mounts.as_ref().unwrap();
        let paths: Vec<_> = mounts.iter().map(|m| m.mount_path.as_str()).collect();
        assert_eq!(paths, ["/data", "/ckpt", "/dev/shm"]);
        assert_eq!(mounts[0].read_only, Some(true));
        let volumes = spec.volumes.unwrap();
        assert_eq!(
            volumes[2].empty_dir.as_ref().unwrap().medium.as_deref(),
            Some("Memory")
        );
    }

    #[test]
    fn the_name_is_stable_and_a_stranger_node_is_refused() {
        let a = build_pod(&job(), &launch("n1"), "amd.com/gpu").unwrap();
        let b = build_pod(&job(), &launch("n1"), "amd.com/gpu").unwrap();
        assert_eq!(a.metadata.name, b.metadata.name);
        let mut retry = launch("n1");
        retry.run_attempt = 2;
        let c = build_pod(&job(), &retry, "amd.com/gpu").unwrap();
        assert_eq!(c.metadata.name.as_deref(), Some("spur-job-12-0-r2"));
        let err = build_pod(&job(), &launch("n9"), "amd.com/gpu").unwrap_err();
        assert!(err.contains("not in the allocation"), "{err}");
    }

    #[test]
    fn a_headless_service_selects_the_jobs_pods() {
        let svc = build_service(&job(), 12);
        let spec = svc.spec.unwrap();
        assert_eq!(spec.cluster_ip.as_deref(), Some("None"));
        assert_eq!(spec.selector.unwrap()[LABEL_JOB_ID], "12");
    }
}
