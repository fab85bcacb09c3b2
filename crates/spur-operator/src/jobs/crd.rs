//! The SpurJob custom resource: `spur.amd.com/v1alpha1`, kind `SpurJob`.

use std::collections::BTreeMap;

use kube::CustomResource;
use kube::CustomResourceExt;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A batch job for the Spur workload manager, run as pods on the nodes spurctld allocates.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "spur.amd.com",
    version = "v1alpha1",
    kind = "SpurJob",
    namespaced,
    status = "SpurJobStatus",
    shortname = "sj",
    printcolumn = r#"{"name":"State","type":"string","jsonPath":".status.state"}"#,
    printcolumn = r#"{"name":"Job ID","type":"integer","jsonPath":".status.spurJobId"}"#,
    printcolumn = r#"{"name":"Nodes","type":"string","jsonPath":".status.assignedNodes"}"#,
    printcolumn = r#"{"name":"GPUs","type":"integer","jsonPath":".spec.gpus.count"}"#,
    printcolumn = r#"{"name":"Cause","type":"string","priority":1,"jsonPath":".status.conditions[?(@.type==\"Failed\")].reason"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","priority":1,"jsonPath":".status.message"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct SpurJobSpec {
    /// Job name in spurctld; the object's name when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Container image every task runs.
    pub image: String,
    /// The program: `command` then `args` replace the image's ENTRYPOINT and CMD (`args`
    /// alone are the whole command); with neither, the pod runs `sleep infinity`. As
    /// upstream's operator runs it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// Appended to `command`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Environment from Secrets: `NAME: secret/key`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub secret_env: BTreeMap<String, String>,
    /// GPUs per node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus: Option<GpuSpec>,
    /// Nodes to allocate [1].
    #[serde(default = "one")]
    pub num_nodes: u32,
    /// Tasks on each node [1].
    #[serde(default = "one")]
    pub tasks_per_node: u32,
    /// CPUs per task [1].
    #[serde(default = "one")]
    pub cpus_per_task: u32,
    /// Memory per node, as a quantity (`64Gi`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_per_node: Option<String>,
    /// Wall-time limit: `4h`, `1h30m`, `1h30`, `2d`, `1:30:00`, `1-12:00`, or a bare number
    /// of minutes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_limit: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
    /// `/host/path:/container/path[:ro]` or `pvc:claim:/container/path[:ro]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<String>,
    #[serde(default, skip_serializing_if = "is_false")]
    pub host_network: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    pub privileged: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    pub host_ipc: bool,
    /// Size of the `/dev/shm` memory volume, as a quantity (`16Gi`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shm_size: Option<String>,
    /// Further resources per node, passed to spurctld as they are.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra_resources: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    /// Extra node labels the pods require, on top of the node spurctld chose.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account: Option<String>,
    /// Job array, as spurctld reads it (`0-15%4`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array_spec: Option<String>,
    /// Dependencies, as spurctld reads them (`afterok:123`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dependencies: Vec<String>,
    /// How long each node's pod may take, from its creation, to be Running: a duration as
    /// `timeLimit` reads one (`90s`, `10m`, a bare number of minutes). A pod that is not
    /// Running by then fails its node, with why it waited (`Unschedulable: ...`), and the
    /// failure policy ends the job; its GPUs are not held by ranks waiting on one that will
    /// not come. Unset: no limit, though a pod that can never start (an image that cannot
    /// be pulled, a bad config) fails its node at once either way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_timeout: Option<String>,
    /// What happens to a multi-node job when one node's pod fails.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_policy: Option<FailurePolicy>,
}

/// A job's answer to one failed rank, or one that did not start in time.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailurePolicy {
    /// `FailJob` (the default): the other nodes' pods are stopped at once and the job ends
    /// Failed with the failed pod's exit code; a training job whose peer died would
    /// otherwise hang in its next collective while holding every GPU. `WaitForOthers`: the
    /// others run to their own end; spurctld keeps the job Completing meanwhile and ends it
    /// by itself after its `CompleteWait` (300 s unless configured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_rank_failure: Option<String>,
    /// `FailJob` (the default): a pod not Running by `startTimeout` fails the job.
    /// `Requeue`: the job is put back in spurctld's queue under the same id and run again
    /// (spurctld holds it at least 5 s first), while `maxRestarts` allows; then it fails.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_start_timeout: Option<String>,
    /// How many times the job is run again after a failed run, as JobSet's `maxRestarts`:
    /// when one pod fails under `onRankFailure: FailJob` (every node's pod is stopped and
    /// spurctld requeues the job under the same id), and when a pod misses `startTimeout`
    /// under `onStartTimeout: Requeue`. Counted by spurctld's run attempt, so a run spurctld
    /// restarted by itself (a node failure, a preemption) counts too. 0 (the default): a
    /// failed run fails the job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_restarts: Option<u32>,
}

fn one() -> u32 {
    1
}

fn is_false(b: &bool) -> bool {
    !*b
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuSpec {
    /// GPUs per node. Omitted, 0: no GPU is requested, whatever `gpuType` says, as
    /// upstream's operator reads `gpus: {gpuType: x}`.
    #[serde(default)]
    pub count: u32,
    /// GPU model (`mi300x`); any when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_type: Option<String>,
}

/// A pod toleration, as in a Pod spec.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Toleration {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// `Exists` or `Equal`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effect: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub toleration_seconds: Option<i64>,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SpurJobStatus {
    /// The controller's job state in its own names, as upstream's operator writes them
    /// (`Pending`, `Running`, `Completed`, `Failed`, `NodeFail`, `OutOfMemory`, …). A spec
    /// that cannot be submitted, a submission spurctld refused (`rejected by spurctld: …`)
    /// and a job spurctld no longer knows are `Failed` too: the `Failed` condition's reason
    /// says which (`Invalid`, `Refused`, `Lost`), the message why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// The controller's job id; once set, it never changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spur_job_id: Option<u32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub assigned_nodes: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pods: Vec<String>,
    /// When the job started running at spurctld (RFC 3339), once it has.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<String>,
    /// When the job ended at spurctld (RFC 3339), once it has.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_time: Option<String>,
    /// Why the job is where it is: the controller's reason, or what is wrong with the spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The generation of the spec the state speaks of; a spec found invalid or refused is
    /// tried again only once the generation moves past it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// For an array SpurJob: how many of its tasks are in each state (`Running: 3`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub array_tasks: BTreeMap<String, u32>,
    /// How each node's pod ended, by node name, written as each pod ends (a later run
    /// attempt's pod replaces an earlier one's).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_results: BTreeMap<String, NodeResult>,
    /// When a submission of this SpurJob last went unanswered (RFC 3339). spurctld may
    /// still apply it as a second job, so the jobs carrying the SpurJob's UID are read back
    /// for one until `--duplicate-watch` after this, and deletion cancels every one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unanswered_submission_at: Option<String>,
}

/// How one node's pod of a job ended.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeResult {
    pub pod: String,
    /// spurctld's run attempt the pod ran for (0 for the first run).
    #[serde(default)]
    pub run_attempt: u32,
    /// `Succeeded`, `Failed`, or `Stopped` (ended by the failure policy after another
    /// node's pod failed).
    pub result: String,
    /// The container's exit code; none for a pod that was stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The container's reason and message (`OOMKilled`, `ImagePullBackOff: ...`), or which
    /// node's failure stopped it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// `Submitted`, `Queued`, `Scheduled`, `Running`, `Requeued`, `Finished`, `Succeeded`,
/// `Failed`, `EntriesDropped`.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// RFC 3339.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
}

/// The CRD as YAML, as `spur-operator crd` prints it and `deploy/crd.yaml` holds it.
pub fn crd_yaml() -> String {
    let crd = SpurJob::crd();
    serde_yaml_ng::to_string(&crd).expect("the CRD serialises")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_apply_to_a_minimal_object() {
        let job: SpurJob = serde_json::from_value(serde_json::json!({
            "apiVersion": "spur.amd.com/v1alpha1",
            "kind": "SpurJob",
            "metadata": {"name": "hello", "namespace": "ml"},
            "spec": {"image": "busybox"}
        }))
        .unwrap();
        assert_eq!(job.spec.num_nodes, 1);
        assert_eq!(job.spec.tasks_per_node, 1);
        assert_eq!(job.spec.cpus_per_task, 1);
        assert!(job.status.is_none());
        // Upstream accepts a GPU type without a count (and requests no GPU).
        let typed_only: SpurJob = serde_json::from_value(serde_json::json!({
            "apiVersion": "spur.amd.com/v1alpha1",
            "kind": "SpurJob",
            "metadata": {"name": "typed", "namespace": "ml"},
            "spec": {"image": "busybox", "gpus": {"gpuType": "mi300x"}}
        }))
        .expect("gpus without count parses");
        assert_eq!(typed_only.spec.gpus.unwrap().count, 0);
    }

    #[test]
    fn crd_has_status_subresource_and_columns() {
        let yaml = crd_yaml();
        for needle in [
            "name: spurjobs.spur.amd.com",
            "kind: SpurJob",
            "scope: Namespaced",
            "status: {}",
            "jsonPath: .status.state",
            "jsonPath: .status.spurJobId",
            "jsonPath: .status.conditions[?(@.type==\"Failed\")].reason",
            "name: Job ID",
            "jsonPath: .metadata.creationTimestamp",
            "secretEnv:",
        ] {
            assert!(yaml.contains(needle), "missing {needle} in\n{yaml}");
        }
    }

    #[test]
    fn deploy_crd_yaml_is_current() {
        // CI's drift check: regenerate with `spur-operator crd > deploy/crd.yaml`.
        let committed = include_str!("../../../../deploy/crd.yaml");
        assert!(
            committed == crd_yaml(),
            "deploy/crd.yaml is stale: run `cargo run -p spur-operator -- crd > deploy/crd.yaml`"
        );
    }
}
