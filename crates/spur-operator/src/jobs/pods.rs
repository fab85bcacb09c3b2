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
use super::crd::{SpurJob, SpurJobSpec};
use super::failure::{
    self, ANNOTATION_MAX_RESTARTS, ANNOTATION_ON_RANK_FAILURE, ANNOTATION_ON_START_TIMEOUT,
    ANNOTATION_START_TIMEOUT, OnRankFailure, OnStartTimeout, PolicyName,
};
use super::{
    LABEL_JOB_ID, LABEL_JOB_NAME, LABEL_MANAGED_BY, LABEL_SPURJOB_UID, LABEL_TARGET_NODE,
    MANAGED_BY, label_value, service_name,
};

pub const ANNOTATION_RUN_ATTEMPT: &str = "spur.amd.com/run-attempt";
pub const ANNOTATION_TARGET_NODE: &str = "spur.amd.com/target-node";
pub const ANNOTATION_REPORTED: &str = "spur.amd.com/reported";
/// The container that runs the job's tasks: upstream's name, so `kubectl logs -c spur-job`
/// and `kubectl exec -c spur-job` keep working, and pods upstream's operator started are
/// read the same way.
pub const CONTAINER: &str = "spur-job";

/// How many pod names [`pod_name`] tries for one (job, rank, attempt) before giving up:
/// each earlier name is held by a pod still terminating (or by another SpurJob's pod), and
/// that many at once means something else is wrong; the launch is then refused as
/// UNAVAILABLE so spurctld tries again after its backoff.
pub const MAX_POD_GENERATIONS: u32 = 8;

/// The pod's name: the same for the same (job, rank, attempt, generation), so a repeated
/// LaunchJob finds the pod it already created instead of making a second.
///
/// `generation` is 0 for the first name tried. A retry of a failed dispatch keeps the same
/// `run_attempt` (spurctld increments it only when a job starts), so it may find the pod of
/// the cancelled dispatch still terminating under that name: it then moves on to
/// generation 1, 2, … (`-g<n>`), the first name free or held by a live pod of the same
/// launch. The walk is deterministic (it depends only on which pods exist), and pod reports
/// find the node from the pod's annotation and spec, never from its name.
pub fn pod_name(job_id: u32, rank: usize, run_attempt: u32, generation: u32) -> String {
    let mut name = format!("spur-job-{job_id}-{rank}");
    if run_attempt > 1 {
        name.push_str(&format!("-r{run_attempt}"));
    }
    if generation > 0 {
        name.push_str(&format!("-g{generation}"));
    }
    name
}

/// Where a LaunchJob puts its pod: the node's rank and the allocation's node names, in
/// rank order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    pub rank: usize,
    pub nodes: Vec<String>,
}

/// The per-node task count spurctld used for `task_offset`: the spec's `tasks_per_node`,
/// or when it is unset (0) `num_tasks / num_nodes` floored at 1, as spurctld's dispatch
/// derives it (so 1 for a spec that sets neither).
pub fn tasks_per_node(spec: Option<&pb::JobSpec>) -> u32 {
    match spec {
        Some(s) if s.tasks_per_node > 0 => s.tasks_per_node,
        Some(s) => (s.num_tasks / s.num_nodes.max(1)).max(1),
        None => 1,
    }
}

/// The allocation's node names from the LaunchJob's `spec.nodelist` (comma-separated, in
/// rank order); empty when spurctld sent none.
pub fn nodelist(launch: &pb::LaunchJobRequest) -> Vec<String> {
    launch
        .spec
        .as_ref()
        .map(|s| s.nodelist.as_str())
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The node's rank and the job's nodes, from a LaunchJob as spurctld sends it:
/// `task_offset = rank × tasks_per_node`, and `spec.nodelist` holds the allocated names in
/// rank order, so the target node must sit at that rank in it. `peer_nodes` is not used:
/// it holds each node's agent socket (`addr:port`), the same for every node this operator
/// registered. Without a nodelist the job is taken as one node, the target; a rank above 0
/// then has no way to find its peers and is refused. An error names what disagrees.
pub fn placement(launch: &pb::LaunchJobRequest) -> Result<Placement, String> {
    let target = launch.target_node.as_str();
    if target.is_empty() {
        return Err(format!(
            "job {}'s LaunchJob names no target node",
            launch.job_id
        ));
    }
    let per_node = tasks_per_node(launch.spec.as_ref());
    if !launch.task_offset.is_multiple_of(per_node) {
        return Err(format!(
            "job {}'s task_offset {} on node {target} is not a multiple of its {per_node} tasks per node",
            launch.job_id, launch.task_offset
        ));
    }
    let rank = usize::try_from(launch.task_offset / per_node).unwrap_or(usize::MAX);
    let nodes = nodelist(launch);
    if nodes.is_empty() {
        if rank != 0 {
            return Err(format!(
                "job {}'s LaunchJob has no nodelist, but its task_offset {} puts node {target} at rank {rank}: without the allocation's node names its pod cannot find its peers",
                launch.job_id, launch.task_offset
            ));
        }
        return Ok(Placement {
            rank,
            nodes: vec![target.to_owned()],
        });
    }
    let listed = nodes.join(",");
    let Some(position) = nodes.iter().position(|n| n == target) else {
        return Err(format!(
            "node {target} is not in job {}'s nodelist ({listed})",
            launch.job_id
        ));
    };
    if nodes.get(rank).map(String::as_str) != Some(target) {
        return Err(format!(
            "job {}'s task_offset {} gives node {target} rank {rank} ({per_node} tasks per node), but it is at position {position} of the nodelist ({listed})",
            launch.job_id, launch.task_offset
        ));
    }
    Ok(Placement { rank, nodes })
}

/// Builds the pod for `launch` on its target node, named for `generation` (see
/// [`pod_name`]). `gpu_resource` is the node's GPU resource name (`amd.com/gpu` or
/// `nvidia.com/gpu`).
pub fn build_pod(
    job: &SpurJob,
    launch: &pb::LaunchJobRequest,
    gpu_resource: &str,
    generation: u32,
) -> Result<Pod, String> {
    let spec = &job.spec;
    let Placement { rank, nodes } = placement(launch)?;
    let name = pod_name(launch.job_id, rank, launch.run_attempt, generation);
    let num_nodes = nodes.len();
    let labels = pod_labels(job, launch);
    let annotations = pod_annotations(spec, launch, num_nodes)?;
    let allocated = launch.allocated.clone().unwrap_or_default();
    let gpus = gpu_count(&allocated, spec);
    let env = pod_env(
        job,
        launch,
        &Rendezvous {
            rank,
            nodes: &nodes,
            namespace: job.namespace().as_deref().unwrap_or("default"),
        },
        &GpuEnv {
            count: gpus,
            resource: gpu_resource,
        },
    );

    let resources = container_resources(spec, launch, &allocated, gpus, gpu_resource);
    let (volumes, mounts) = pod_volumes(spec);
    let container = job_container(spec, env, resources, mounts);
    let tolerations = pod_tolerations(spec);
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

/// The pod's one container: the spec's image and command, with `env`, `resources` as both
/// requests and limits, and `mounts`.
fn job_container(
    spec: &SpurJobSpec,
    env: Vec<EnvVar>,
    resources: BTreeMap<String, Quantity>,
    mounts: Vec<VolumeMount>,
) -> Container {
    Container {
        name: CONTAINER.to_owned(),
        image: Some(spec.image.clone()),
        command: Some(container_command(&spec.command, &spec.args)),
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
    }
}

/// The pod's labels: its job id and its SpurJob's UID, which the pod reports and the
/// orphan sweep select by; this operator as its manager; and the SpurJob's name and the
/// node, as upstream's operator labels them.
fn pod_labels(job: &SpurJob, launch: &pb::LaunchJobRequest) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    labels.insert(LABEL_JOB_ID.to_owned(), launch.job_id.to_string());
    labels.insert(LABEL_MANAGED_BY.to_owned(), MANAGED_BY.to_owned());
    labels.insert(LABEL_SPURJOB_UID.to_owned(), job.uid().unwrap_or_default());
    labels.insert(LABEL_JOB_NAME.to_owned(), label_value(&job.name_any()));
    labels.insert(
        LABEL_TARGET_NODE.to_owned(),
        label_value(&launch.target_node),
    );
    labels
}

/// The annotations the pod reports read back: its run attempt and target node, its start
/// timeout, and the failure policy it was launched under (so a SpurJob edited while the
/// pod runs does not change what its end means). An error names the spec field that does
/// not parse.
fn pod_annotations(
    spec: &SpurJobSpec,
    launch: &pb::LaunchJobRequest,
    num_nodes: usize,
) -> Result<BTreeMap<String, String>, String> {
    let mut annotations = BTreeMap::new();
    annotations.insert(
        ANNOTATION_RUN_ATTEMPT.to_owned(),
        launch.run_attempt.to_string(),
    );
    annotations.insert(
        ANNOTATION_TARGET_NODE.to_owned(),
        launch.target_node.clone(),
    );
    if let Some(timeout) = &spec.start_timeout {
        let seconds =
            convert::parse_time_limit(timeout).map_err(|e| format!("spec.startTimeout: {e}"))?;
        annotations.insert(ANNOTATION_START_TIMEOUT.to_owned(), seconds.to_string());
    }
    let restarts = failure::max_restarts(spec);
    if restarts > 0 {
        annotations.insert(ANNOTATION_MAX_RESTARTS.to_owned(), restarts.to_string());
    }
    let on_start_timeout =
        OnStartTimeout::of(spec).map_err(|e| format!("spec.failurePolicy.onStartTimeout: {e}"))?;
    if on_start_timeout != OnStartTimeout::default() {
        annotations.insert(
            ANNOTATION_ON_START_TIMEOUT.to_owned(),
            on_start_timeout.as_str().to_owned(),
        );
    }
    if num_nodes > 1 {
        annotations.insert(
            ANNOTATION_ON_RANK_FAILURE.to_owned(),
            OnRankFailure::of(spec)
                .map_err(|e| format!("spec.failurePolicy.onRankFailure: {e}"))?
                .as_str()
                .to_owned(),
        );
    }
    Ok(annotations)
}

/// The GPUs the pod gets: those spurctld allocated on the node, else the spec's count.
fn gpu_count(allocated: &pb::ResourceAllocations, spec: &SpurJobSpec) -> u64 {
    allocated
        .devices
        .get("gpu")
        .map(|d| d.devices.iter().map(|a| a.count.max(1)).sum::<u64>())
        .filter(|n| *n > 0)
        .or_else(|| spec.gpus.as_ref().map(|g| u64::from(g.count)))
        .unwrap_or(0)
}

/// The spec's tolerations, as Kubernetes types.
fn pod_tolerations(spec: &SpurJobSpec) -> Vec<K8sToleration> {
    spec.tolerations
        .iter()
        .map(|t| K8sToleration {
            key: t.key.clone(),
            operator: t.operator.clone(),
            value: t.value.clone(),
            effect: t.effect.clone(),
            toleration_seconds: t.toleration_seconds,
        })
        .collect()
}

/// The container's resources, requests equal to limits: the allocation is what spurctld
/// reserved on the node (CPUs, memory, GPUs), and every `extraResources` key as upstream's
/// operator sets it (an RDMA, MIG or hugepages request gets a pod with the device; an
/// extended resource must have requests equal to limits). Where an extra key names what
/// the allocation already set, the allocation wins: a pod asking for more than spurctld
/// reserved would overcommit the node behind spurctld's back.
pub fn container_resources(
    spec: &SpurJobSpec,
    launch: &pb::LaunchJobRequest,
    allocated: &pb::ResourceAllocations,
    gpus: u64,
    gpu_resource: &str,
) -> BTreeMap<String, Quantity> {
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
    let mut resources = BTreeMap::new();
    resources.insert("cpu".to_owned(), Quantity(cpus.max(1).to_string()));
    if memory_mb > 0 {
        resources.insert("memory".to_owned(), Quantity(format!("{memory_mb}Mi")));
    }
    if gpus > 0 {
        resources.insert(gpu_resource.to_owned(), Quantity(gpus.to_string()));
    }
    for (key, value) in &spec.extra_resources {
        resources
            .entry(key.clone())
            .or_insert_with(|| Quantity(value.clone()));
    }
    resources
}

/// The pod's volumes and the container's mounts: each well-formed `volumes` entry (a
/// malformed one is left out, as upstream's operator leaves it out; the reconciler tells
/// the user which, see `convert::dropped_entries`), then `/dev/shm` when `shmSize` is set.
/// A volume keeps its entry's index in its name, so dropping one never renames another.
fn pod_volumes(spec: &SpurJobSpec) -> (Vec<Volume>, Vec<VolumeMount>) {
    let mut volumes = Vec::new();
    let mut mounts = Vec::new();
    for (i, raw) in spec.volumes.iter().enumerate() {
        let volume_name = format!("vol-{i}");
        let Ok(parsed) = convert::parse_volume(raw) else {
            continue;
        };
        let (source, target, read_only) = match parsed {
            JobVolume::HostPath {
                source,
                target,
                read_only,
            } => (
                Volume {
                    name: volume_name.clone(),
                    // Created when missing, as upstream's operator mounts it.
                    host_path: Some(HostPathVolumeSource {
                        path: source,
                        type_: Some("DirectoryOrCreate".to_owned()),
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
    (volumes, mounts)
}

/// The port of a multi-node job's rendezvous (torchrun's and upstream's default), exposed
/// by its headless Service.
pub const RENDEZVOUS_PORT: u16 = 29500;

/// Where a pod sits among its job's pods, for the rendezvous variables.
pub struct Rendezvous<'a> {
    pub rank: usize,
    /// The allocation's nodes, in rank order.
    pub nodes: &'a [String],
    pub namespace: &'a str,
}

/// The GPUs a pod was given.
pub struct GpuEnv<'a> {
    pub count: u64,
    /// `amd.com/gpu` or `nvidia.com/gpu`.
    pub resource: &'a str,
}

/// The container's environment, as a job script written for spurd, Slurm or torchrun
/// expects it, and as upstream's operator sets it (so images that start there start here):
///
/// - `SPUR_*` with their `SLURM_*` twins (job id, name, partition, account, QOS, nodes,
///   tasks, CPUs, node id, nodelist, `SPURD_NODENAME`), the array's ids for an array task,
///   and ours (`SPUR_NODE_RANK`, `SPUR_NUM_NODES`, `SPUR_TASK_OFFSET`, `SPUR_RUN_ATTEMPT`);
/// - torchrun's `NODE_RANK`, `LOCAL_RANK` (0), `LOCAL_WORLD_SIZE` and `NPROC_PER_NODE` (the
///   node's tasks), and for a multi-node job `MASTER_ADDR`, `MASTER_PORT`, `WORLD_SIZE`
///   and `RANK` counted in nodes, as upstream does. `MASTER_ADDR` names the rank-0 pod
///   (`node-0.spur-job-<id>.<namespace>.svc`), where upstream names the headless Service,
///   which resolves to every pod, so a rank could rendezvous with itself;
/// - with GPUs: `GPU_ENABLE_PAL=0` on AMD, and for a multi-node job on the pod network
///   `NCCL_SOCKET_IFNAME=eth0` (a pod's interface; with `hostNetwork` the host's interface
///   is unknown here, so it is left to the user);
/// - then the user's `env` and `secretEnv`, which win: a built variable the user also
///   names is left out (upstream appends the user's after its own, leaving duplicates).
///
/// `secretEnv` references are optional as upstream's are: a missing Secret or key leaves
/// the variable unset instead of holding the pod in CreateContainerConfigError.
pub fn pod_env(
    job: &SpurJob,
    launch: &pb::LaunchJobRequest,
    at: &Rendezvous<'_>,
    gpus: &GpuEnv<'_>,
) -> Vec<EnvVar> {
    let spec = &job.spec;
    let built = built_env(spec, launch, at, gpus);
    let named_by_user = |name: &str| {
        spec.env.contains_key(name)
            || spec
                .secret_env
                .get(name)
                .is_some_and(|r| convert::parse_secret_ref(r).is_ok())
    };
    let mut env: Vec<EnvVar> = built
        .into_iter()
        .filter(|(name, _)| !named_by_user(name))
        .map(|(name, value)| EnvVar {
            name,
            value: Some(value),
            ..Default::default()
        })
        .collect();
    env.extend(user_env(spec));
    env
}

/// The user's `env`, then a reference to a Secret's key for each `secretEnv` entry. A
/// malformed reference is left out, as upstream leaves it out; the reconciler tells the
/// user which.
fn user_env(spec: &SpurJobSpec) -> Vec<EnvVar> {
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
        let Ok((secret, key)) = convert::parse_secret_ref(reference) else {
            continue;
        };
        env.push(EnvVar {
            name: var.clone(),
            value_from: Some(EnvVarSource {
                secret_key_ref: Some(SecretKeySelector {
                    name: secret,
                    key,
                    optional: Some(true),
                }),
                ..Default::default()
            }),
            ..Default::default()
        });
    }
    env
}

/// What the operator sets itself, before the user's: the scheduler's variables
/// ([`scheduler_env`]), ours and torchrun's, the rendezvous for a multi-node job, and the
/// GPU runtime's.
fn built_env(
    spec: &SpurJobSpec,
    launch: &pb::LaunchJobRequest,
    at: &Rendezvous<'_>,
    gpus: &GpuEnv<'_>,
) -> Vec<(String, String)> {
    let per_node = tasks_per_node(launch.spec.as_ref());
    let num_nodes = at.nodes.len();
    let multi_node = num_nodes > 1;
    let mut built = scheduler_env(launch, at, per_node);
    built.extend(
        [
            ("SPUR_NODE_RANK", at.rank.to_string()),
            ("SPUR_NUM_NODES", num_nodes.to_string()),
            ("SPUR_TASK_OFFSET", launch.task_offset.to_string()),
            ("SPUR_RUN_ATTEMPT", launch.run_attempt.to_string()),
            ("SPUR_TARGET_NODE", launch.target_node.clone()),
            ("NODE_RANK", at.rank.to_string()),
            ("LOCAL_RANK", "0".to_owned()),
            ("LOCAL_WORLD_SIZE", per_node.to_string()),
            ("NPROC_PER_NODE", per_node.to_string()),
        ]
        .map(|(name, value)| (name.to_owned(), value)),
    );
    if multi_node {
        built.extend(
            [
                (
                    "MASTER_ADDR",
                    format!(
                        "node-0.{}.{}.svc",
                        service_name(launch.job_id),
                        at.namespace
                    ),
                ),
                ("MASTER_PORT", RENDEZVOUS_PORT.to_string()),
                ("WORLD_SIZE", num_nodes.to_string()),
                ("RANK", at.rank.to_string()),
            ]
            .map(|(name, value)| (name.to_owned(), value)),
        );
    }
    if gpus.count > 0 {
        if gpus.resource != NVIDIA_GPU {
            built.push(("GPU_ENABLE_PAL".into(), "0".to_owned()));
        }
        if multi_node && !spec.host_network {
            built.push(("NCCL_SOCKET_IFNAME".into(), "eth0".to_owned()));
        }
    }
    built
}

/// `SPUR_*` with their `SLURM_*` twins, read from the job as spurctld sent it, and the
/// node's name as `SPURD_NODENAME` and `SLURMD_NODENAME`.
fn scheduler_env(
    launch: &pb::LaunchJobRequest,
    at: &Rendezvous<'_>,
    per_node: u32,
) -> Vec<(String, String)> {
    let unset = pb::JobSpec::default();
    let controller_spec = launch.spec.as_ref().unwrap_or(&unset);
    let num_nodes = at.nodes.len();
    let nodelist = at.nodes.join(",");
    let num_tasks = if controller_spec.num_tasks > 0 {
        controller_spec.num_tasks
    } else {
        per_node.saturating_mul(u32::try_from(num_nodes).unwrap_or(u32::MAX))
    };
    let cpus_on_node = per_node.saturating_mul(controller_spec.cpus_per_task.max(1));
    let mut twins = vec![
        ("JOB_ID", launch.job_id.to_string()),
        ("JOBID", launch.job_id.to_string()),
        ("JOB_NAME", controller_spec.name.clone()),
        ("JOB_PARTITION", controller_spec.partition.clone()),
        ("JOB_ACCOUNT", controller_spec.account.clone()),
        ("JOB_QOS", controller_spec.qos.clone()),
        ("NNODES", num_nodes.to_string()),
        ("JOB_NUM_NODES", num_nodes.to_string()),
        ("NTASKS", num_tasks.to_string()),
        ("NPROCS", num_tasks.to_string()),
        ("CPUS_PER_TASK", controller_spec.cpus_per_task.to_string()),
        ("CPUS_ON_NODE", cpus_on_node.to_string()),
        ("TASKS_PER_NODE", per_node.to_string()),
        ("NODEID", at.rank.to_string()),
        ("NODELIST", nodelist.clone()),
        ("JOB_NODELIST", nodelist),
    ];
    if launch.array_job_id > 0 {
        twins.push(("ARRAY_JOB_ID", launch.array_job_id.to_string()));
        twins.push(("ARRAY_TASK_ID", launch.array_task_id.to_string()));
    }
    // Each as SPUR_<name> and SLURM_<name>; the node's name as SPURD_/SLURMD_NODENAME.
    let mut built: Vec<(String, String)> = Vec::new();
    for (name, value) in twins {
        built.push((format!("SPUR_{name}"), value.clone()));
        built.push((format!("SLURM_{name}"), value));
    }
    built.push(("SPURD_NODENAME".into(), launch.target_node.clone()));
    built.push(("SLURMD_NODENAME".into(), launch.target_node.clone()));
    built
}

/// The container's command, as upstream's operator runs it (so a SpurJob written for it
/// runs the same program here): `command` then `args` replace the image's ENTRYPOINT and
/// CMD; `args` alone are the whole command; with neither the pod runs `sleep infinity`, a
/// pod to `kubectl exec` into for as long as the job's time limit allows.
pub fn container_command(command: &[String], args: &[String]) -> Vec<String> {
    if command.is_empty() && args.is_empty() {
        return vec!["sleep".to_owned(), "infinity".to_owned()];
    }
    command.iter().chain(args).cloned().collect()
}

/// NVIDIA's GPU resource; any other GPU is taken as AMD's.
const NVIDIA_GPU: &str = "nvidia.com/gpu";

/// Whether `existing`, found under the name a launch wanted, is that launch's own pod (a
/// repeated LaunchJob), so the launch is done: the same SpurJob, node and run attempt, and
/// not being deleted. A pod of the cancelled dispatch still terminating, or one left by
/// another SpurJob whose job had the same id, is not: the launch needs a pod of its own.
pub fn is_launched_pod(existing: &Pod, job_uid: &str, launch: &pb::LaunchJobRequest) -> bool {
    let meta = &existing.metadata;
    let label = |k: &str| {
        meta.labels
            .as_ref()
            .and_then(|l| l.get(k))
            .map(String::as_str)
    };
    let annotation = |k: &str| {
        meta.annotations
            .as_ref()
            .and_then(|a| a.get(k))
            .map(String::as_str)
    };
    let attempt = launch.run_attempt.to_string();
    meta.deletion_timestamp.is_none()
        && label(LABEL_SPURJOB_UID) == Some(job_uid)
        && label(LABEL_JOB_ID) == Some(launch.job_id.to_string().as_str())
        && annotation(ANNOTATION_TARGET_NODE) == Some(launch.target_node.as_str())
        && annotation(ANNOTATION_RUN_ATTEMPT) == Some(attempt.as_str())
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
                port: i32::from(RENDEZVOUS_PORT),
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

    const NODELIST: &str = "node-a,node-b";
    const TASKS_PER_NODE: u32 = 8;

    /// A LaunchJob as spurctld sends it: every peer is the operator's agent socket, the
    /// offset is rank × tasks per node, and the names are in `spec.nodelist`.
    fn launch_at(target: &str, rank: u32) -> pb::LaunchJobRequest {
        pb::LaunchJobRequest {
            job_id: 12,
            spec: Some(pb::JobSpec {
                num_nodes: 2,
                num_tasks: 2 * TASKS_PER_NODE,
                tasks_per_node: TASKS_PER_NODE,
                nodelist: NODELIST.into(),
                gres: vec!["gpu:8".into()],
                ..Default::default()
            }),
            peer_nodes: vec!["10.0.0.5:6818".into(), "10.0.0.5:6818".into()],
            task_offset: rank * TASKS_PER_NODE,
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

    fn launch(target: &str) -> pb::LaunchJobRequest {
        let rank = NODELIST.split(',').position(|n| n == target).unwrap_or(0);
        launch_at(target, rank as u32)
    }

    fn env_of(pod: &Pod, name: &str) -> Option<String> {
        pod.spec.as_ref()?.containers[0]
            .env
            .as_ref()?
            .iter()
            .find(|e| e.name == name)?
            .value
            .clone()
    }

    #[test]
    fn a_multi_node_pod_gets_torchrun_and_slurm_variables_naming_the_rank_0_pod() {
        let pod = build_pod(&job(), &launch("node-b"), "amd.com/gpu", 0).unwrap();
        let env = |name: &str| env_of(&pod, name);
        for (name, value) in [
            ("MASTER_ADDR", "node-0.spur-job-12.ml.svc"),
            ("MASTER_PORT", "29500"),
            ("WORLD_SIZE", "2"),
            ("RANK", "1"),
            ("NODE_RANK", "1"),
            ("LOCAL_RANK", "0"),
            ("LOCAL_WORLD_SIZE", "8"),
            ("NPROC_PER_NODE", "8"),
            ("SLURM_JOB_ID", "12"),
            ("SLURM_NNODES", "2"),
            ("SLURM_NTASKS", "16"),
            ("SLURM_NODEID", "1"),
            ("SLURM_NODELIST", NODELIST),
            ("SLURMD_NODENAME", "node-b"),
            ("SPUR_NODEID", "1"),
            ("SPUR_TASKS_PER_NODE", "8"),
            ("GPU_ENABLE_PAL", "0"),
            ("NCCL_SOCKET_IFNAME", "eth0"),
        ] {
            assert_eq!(env(name).as_deref(), Some(value), "{name}");
        }
        assert_eq!(env("SLURM_ARRAY_TASK_ID"), None, "not an array task");
        // The pod's own DNS name is what MASTER_ADDR names for rank 0.
        let rank0 = build_pod(&job(), &launch("node-a"), "amd.com/gpu", 0).unwrap();
        let spec = rank0.spec.unwrap();
        assert_eq!(
            format!(
                "{}.{}.ml.svc",
                spec.hostname.unwrap(),
                spec.subdomain.unwrap()
            ),
            env("MASTER_ADDR").unwrap()
        );
    }

    #[test]
    fn a_single_node_nvidia_pod_gets_no_rendezvous_address_and_no_amd_variable() {
        let mut single = launch_at("node-a", 0);
        single.spec.as_mut().unwrap().nodelist = "node-a".into();
        single.array_job_id = 40;
        single.array_task_id = 3;
        let pod = build_pod(&job(), &single, "nvidia.com/gpu", 0).unwrap();
        for absent in [
            "MASTER_ADDR",
            "WORLD_SIZE",
            "RANK",
            "GPU_ENABLE_PAL",
            "NCCL_SOCKET_IFNAME",
        ] {
            assert_eq!(env_of(&pod, absent), None, "{absent}");
        }
        assert_eq!(env_of(&pod, "SLURM_ARRAY_JOB_ID").as_deref(), Some("40"));
        assert_eq!(env_of(&pod, "SPUR_ARRAY_TASK_ID").as_deref(), Some("3"));
        assert_eq!(env_of(&pod, "LOCAL_WORLD_SIZE").as_deref(), Some("8"));
    }

    #[test]
    fn the_command_is_commands_then_args_and_a_pod_with_neither_sleeps() {
        let strings = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        for (command, args, runs) in [
            (
                &["torchrun"][..],
                &["train.py"][..],
                &["torchrun", "train.py"][..],
            ),
            (&[][..], &["python", "x.py"][..], &["python", "x.py"][..]),
            (
                &["bash", "-c", "nvidia-smi"][..],
                &[][..],
                &["bash", "-c", "nvidia-smi"][..],
            ),
            (&[][..], &[][..], &["sleep", "infinity"][..]),
        ] {
            assert_eq!(
                container_command(&strings(command), &strings(args)),
                strings(runs),
                "{command:?} {args:?}"
            );
        }
        let pod = build_pod(&job(), &launch("node-a"), "amd.com/gpu", 0).unwrap();
        let container = &pod.spec.unwrap().containers[0];
        assert_eq!(
            container.command.as_deref(),
            Some(&strings(&["torchrun", "train.py"])[..])
        );
        assert_eq!(container.args, None, "the image's CMD is replaced too");
    }

    #[test]
    fn the_users_env_wins_over_a_built_variable_without_a_duplicate() {
        let mut job = job();
        job.spec
            .env
            .insert("NCCL_SOCKET_IFNAME".into(), "ib0".into());
        job.spec.env.insert("MASTER_PORT".into(), "23456".into());
        let pod = build_pod(&job, &launch("node-b"), "amd.com/gpu", 0).unwrap();
        let env = pod.spec.unwrap().containers[0].env.clone().unwrap();
        let values = |name: &str| -> Vec<Option<String>> {
            env.iter()
                .filter(|e| e.name == name)
                .map(|e| e.value.clone())
                .collect()
        };
        assert_eq!(values("NCCL_SOCKET_IFNAME"), [Some("ib0".to_owned())]);
        assert_eq!(values("MASTER_PORT"), [Some("23456".to_owned())]);
        let secret = env.iter().find(|e| e.name == "HF_TOKEN").unwrap();
        let optional = secret.value_from.as_ref().unwrap().secret_key_ref.as_ref();
        assert_eq!(
            optional.and_then(|k| k.optional),
            Some(true),
            "optional as upstream's: a missing Secret leaves the variable unset"
        );
    }

    #[test]
    fn the_pod_is_pinned_sized_and_labelled() {
        let pod = build_pod(&job(), &launch("node-b"), "amd.com/gpu", 0).unwrap();
        assert_eq!(pod.metadata.name.as_deref(), Some("spur-job-12-1"));
        assert_eq!(pod.metadata.namespace.as_deref(), Some("ml"));
        let labels = pod.metadata.labels.as_ref().unwrap();
        assert_eq!(labels[LABEL_JOB_ID], "12");
        assert_eq!(
            labels[LABEL_MANAGED_BY], "spur-k8s-operator",
            "upstream's value, which users' selectors match"
        );
        assert_eq!(labels[LABEL_SPURJOB_UID], "uid-1");
        assert_eq!(labels[LABEL_JOB_NAME], "train");
        assert_eq!(labels[LABEL_TARGET_NODE], "node-b");
        let annotations = pod.metadata.annotations.as_ref().unwrap();
        assert_eq!(annotations[ANNOTATION_TARGET_NODE], "node-b");
        assert_eq!(annotations[ANNOTATION_RUN_ATTEMPT], "1");
        let owner = &pod.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("SpurJob", "uid-1")
        );
        assert_eq!(env_of(&pod, "SPUR_NODE_RANK").as_deref(), Some("1"));
        assert_eq!(env_of(&pod, "SPUR_NUM_NODES").as_deref(), Some("2"));
        assert_eq!(env_of(&pod, "SPUR_NODELIST").as_deref(), Some(NODELIST));
        assert_eq!(env_of(&pod, "SPUR_TASK_OFFSET").as_deref(), Some("8"));
        let spec = pod.spec.unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("node-b"));
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
        let mounts = c.volume_mounts.as_ref().unwrap();
        let paths: Vec<_> = mounts.iter().map(|m| m.mount_path.as_str()).collect();
        assert_eq!(paths, ["/data", "/ckpt", "/dev/shm"]);
        assert_eq!(mounts[0].read_only, Some(true));
        let host_path = spec.volumes.as_ref().unwrap()[0].host_path.as_ref();
        assert_eq!(
            host_path.and_then(|h| h.type_.as_deref()),
            Some("DirectoryOrCreate")
        );
        let volumes = spec.volumes.unwrap();
        assert_eq!(
            volumes[2].empty_dir.as_ref().unwrap().medium.as_deref(),
            Some("Memory")
        );
    }

    #[test]
    fn rank_comes_from_the_task_offset_and_the_nodelist() {
        // (target, task_offset, tasks_per_node in the spec, nodelist, expected rank or a
        // piece of the refusal)
        type Case = (
            &'static str,
            u32,
            u32,
            &'static str,
            Result<usize, &'static str>,
        );
        let cases: &[Case] = &[
            ("node-a", 0, 8, NODELIST, Ok(0)),
            ("node-b", 8, 8, NODELIST, Ok(1)),
            // tasks_per_node unset: spurctld used num_tasks / num_nodes (16 / 2).
            ("node-b", 8, 0, NODELIST, Ok(1)),
            ("node-a", 0, 8, " node-a , node-b ,", Ok(0)),
            ("node-b", 0, 8, NODELIST, Err("gives node node-b rank 0")),
            (
                "node-a",
                8,
                8,
                NODELIST,
                Err("at position 0 of the nodelist (node-a,node-b)"),
            ),
            ("node-a", 16, 8, NODELIST, Err("rank 2")),
            (
                "node-c",
                0,
                8,
                NODELIST,
                Err("node node-c is not in job 12's nodelist (node-a,node-b)"),
            ),
            ("node-b", 4, 8, NODELIST, Err("not a multiple")),
            ("", 0, 8, NODELIST, Err("no target node")),
            // No nodelist: a one-node job on the target.
            ("node-a", 0, 8, "", Ok(0)),
            ("node-b", 8, 8, "", Err("has no nodelist")),
            ("node-b", u32::MAX, 1, NODELIST, Err("rank")),
        ];
        for (target, offset, per_node, nodelist, expected) in cases {
            let mut l = launch_at(target, 0);
            l.task_offset = *offset;
            let spec = l.spec.as_mut().unwrap();
            spec.tasks_per_node = *per_node;
            spec.nodelist = (*nodelist).into();
            let got = placement(&l);
            match expected {
                Ok(rank) => {
                    let p = got.unwrap_or_else(|e| panic!("{target} {offset}: {e}"));
                    assert_eq!(p.rank, *rank, "{target} {offset}");
                }
                Err(piece) => {
                    let err = got.expect_err(&format!("{target} {offset} {nodelist:?} placed"));
                    assert!(err.contains(piece), "{target} {offset}: {err}");
                }
            }
        }
    }

    #[test]
    fn peer_sockets_never_name_nodes() {
        // All peers are the same socket; nothing of them shows in the pod.
        let pod = build_pod(&job(), &launch("node-a"), "amd.com/gpu", 0).unwrap();
        assert_eq!(env_of(&pod, "SPUR_NODE_RANK").as_deref(), Some("0"));
        assert_eq!(env_of(&pod, "SPUR_NODELIST").as_deref(), Some(NODELIST));
        // Without a nodelist: one node, the target, however many peers there are.
        let mut single = launch("node-a");
        single.spec.as_mut().unwrap().nodelist.clear();
        let pod = build_pod(&job(), &single, "amd.com/gpu", 0).unwrap();
        assert_eq!(env_of(&pod, "SPUR_NUM_NODES").as_deref(), Some("1"));
        assert_eq!(env_of(&pod, "SPUR_NODELIST").as_deref(), Some("node-a"));
        assert_eq!(pod.spec.unwrap().subdomain, None);
        // No spec at all: one node, rank 0.
        let bare = pb::LaunchJobRequest {
            job_id: 3,
            target_node: "node-a".into(),
            ..Default::default()
        };
        assert_eq!(
            placement(&bare),
            Ok(Placement {
                rank: 0,
                nodes: vec!["node-a".into()]
            })
        );
    }

    #[test]
    fn the_name_is_stable_and_a_stranger_node_is_refused() {
        let a = build_pod(&job(), &launch("node-a"), "amd.com/gpu", 0).unwrap();
        let b = build_pod(&job(), &launch("node-a"), "amd.com/gpu", 0).unwrap();
        assert_eq!(a.metadata.name, b.metadata.name);
        let mut retry = launch("node-a");
        retry.run_attempt = 2;
        let c = build_pod(&job(), &retry, "amd.com/gpu", 0).unwrap();
        assert_eq!(c.metadata.name.as_deref(), Some("spur-job-12-0-r2"));
        let d = build_pod(&job(), &retry, "amd.com/gpu", 3).unwrap();
        assert_eq!(d.metadata.name.as_deref(), Some("spur-job-12-0-r2-g3"));
        assert_eq!(pod_name(12, 1, 1, 1), "spur-job-12-1-g1");
        let err = build_pod(&job(), &launch_at("node-z", 0), "amd.com/gpu", 0).unwrap_err();
        assert!(err.contains("not in job 12's nodelist"), "{err}");
    }

    #[test]
    fn only_a_live_pod_of_the_same_launch_counts_as_launched() {
        let l = launch("node-b");
        let pod = build_pod(&job(), &l, "amd.com/gpu", 0).unwrap();
        assert!(is_launched_pod(&pod, "uid-1", &l));
        let mut terminating = pod.clone();
        terminating.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default()),
        );
        assert!(!is_launched_pod(&terminating, "uid-1", &l));
        assert!(!is_launched_pod(&pod, "uid-2", &l));
        let mut elsewhere = l.clone();
        elsewhere.target_node = "node-a".into();
        assert!(!is_launched_pod(&pod, "uid-1", &elsewhere));
        let mut later = l.clone();
        later.run_attempt = 2;
        assert!(!is_launched_pod(&pod, "uid-1", &later));
        assert!(!is_launched_pod(&Pod::default(), "uid-1", &l));
    }

    #[test]
    fn a_headless_service_selects_the_jobs_pods() {
        let svc = build_service(&job(), 12);
        assert_eq!(
            svc.metadata.labels.as_ref().unwrap()[LABEL_MANAGED_BY],
            "spur-k8s-operator"
        );
        let spec = svc.spec.unwrap();
        assert_eq!(spec.cluster_ip.as_deref(), Some("None"));
        assert_eq!(spec.selector.unwrap()[LABEL_JOB_ID], "12");
    }

    #[test]
    fn extra_resources_are_requested_and_limited_alike_beside_the_allocation() {
        let mut job = job();
        job.spec.extra_resources = [
            ("rdma/hca_shared_devices_a", "1"),
            ("nvidia.com/mig-1g.10gb", "2"),
            ("hugepages-2Mi", "1Gi"),
            // Named by the allocation too: spurctld's reservation is kept.
            ("cpu", "2"),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .into();
        let pod = build_pod(&job, &launch("node-a"), "amd.com/gpu", 0).unwrap();
        let resources = pod.spec.unwrap().containers[0].resources.clone().unwrap();
        let requests = resources.requests.unwrap();
        let limits = resources.limits.unwrap();
        for (key, value) in [
            ("rdma/hca_shared_devices_a", "1"),
            ("nvidia.com/mig-1g.10gb", "2"),
            ("hugepages-2Mi", "1Gi"),
            ("cpu", "32"),
            ("memory", "65536Mi"),
            ("amd.com/gpu", "8"),
        ] {
            assert_eq!(requests[key].0, value, "requests {key}");
            assert_eq!(limits[key].0, value, "limits {key}");
        }
        assert_eq!(requests, limits);
    }

    #[test]
    fn a_malformed_volume_or_secret_entry_is_left_out_and_the_rest_kept() {
        let mut job = job();
        job.spec.volumes = vec![
            "relative:/x".into(),
            "/data:/data:ro".into(),
            "nfs:server:/x:ro:extra".into(),
            "pvc:ckpt:/ckpt".into(),
        ];
        job.spec
            .secret_env
            .insert("SPUR_JOB_NAME".into(), "no-slash".into());
        let pod = build_pod(&job, &launch("node-a"), "amd.com/gpu", 0).expect("a pod");
        let spec = pod.spec.clone().unwrap();
        let volumes: Vec<_> = spec.volumes.unwrap().into_iter().map(|v| v.name).collect();
        assert_eq!(
            volumes,
            ["vol-1", "vol-3", "dshm"],
            "names keep their index"
        );
        let container = &spec.containers[0];
        let paths: Vec<_> = container
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .map(|m| (m.name.as_str(), m.mount_path.as_str()))
            .collect();
        assert_eq!(
            paths,
            [("vol-1", "/data"), ("vol-3", "/ckpt"), ("dshm", "/dev/shm")]
        );
        let env = container.env.as_ref().unwrap();
        assert!(
            env.iter().any(|e| e.name == "HF_TOKEN"),
            "the good one kept"
        );
        // The dropped reference does not hide the built variable of its name either.
        let named: Vec<_> = env.iter().filter(|e| e.name == "SPUR_JOB_NAME").collect();
        assert_eq!(named.len(), 1, "{named:?}");
        assert!(named[0].value_from.is_none(), "{named:?}");
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        fn node() -> impl Strategy<Value = String> {
            prop_oneof!["node-[0-3]", "\\PC{0,12}"]
        }

        proptest! {
            /// A LaunchJob with any fields gets a pod or an error that names the job: never
            /// a panic. A pod it does get runs on the target node, at a rank inside the
            /// nodelist, under a name Kubernetes accepts.
            #[test]
            fn any_launch_is_a_pod_on_its_target_or_a_named_error(
                job_id in any::<u32>(),
                run_attempt in any::<u32>(),
                task_offset in any::<u32>(),
                tasks_per_node in 0u32..10,
                num_tasks in any::<u32>(),
                num_nodes in any::<u32>(),
                target in node(),
                listed in prop::collection::vec(node(), 0..5),
                generation in 0u32..5,
            ) {
                let launch = pb::LaunchJobRequest {
                    job_id,
                    run_attempt,
                    task_offset,
                    target_node: target.clone(),
                    spec: Some(pb::JobSpec {
                        tasks_per_node,
                        num_tasks,
                        num_nodes,
                        nodelist: listed.join(","),
                        ..Default::default()
                    }),
                    ..Default::default()
                };
                match build_pod(&job(), &launch, "amd.com/gpu", generation) {
                    Ok(pod) => {
                        let Placement { rank, nodes } = placement(&launch).expect("a pod was built");
                        prop_assert_eq!(nodes.get(rank), Some(&target));
                        let name = pod.metadata.name.clone().unwrap_or_default();
                        prop_assert!(name.len() <= 63, "{}", name);
                        prop_assert!(
                            name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
                            "{}", name
                        );
                        let spec = pod.spec.expect("a pod spec");
                        prop_assert_eq!(spec.node_name.as_deref(), Some(target.as_str()));
                    }
                    Err(e) => prop_assert!(
                        e.contains(&job_id.to_string()) || e.contains("secret"),
                        "{}", e
                    ),
                }
            }
        }
    }
}
