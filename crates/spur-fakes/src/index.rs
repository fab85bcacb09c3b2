//! A small index of the API server's objects, kept up to date from its change feed, so
//! the harness's checks and kubelet read a few fields instead of listing (and cloning)
//! every object many times a simulated second.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::Value;
use spur_judge::checks::Observation;

use crate::api_server::ApiServer;
use crate::api_server::seed::MANAGED_LABEL;
use crate::api_server::store::{Change, ChangeKind};

pub use spur_judge::records::SpurJobView;

/// What the kubelet needs of a pod.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodView {
    pub namespace: String,
    pub name: String,
    pub phase: String,
    pub bound: bool,
    pub deleting: bool,
    pub job_id: Option<u32>,
    /// The (first) container's name and image, as its status reports them.
    pub container: Value,
    pub image: Value,
    pub run_secs: Option<u64>,
    /// How long the pod stays Pending, bound, before it runs (`SIM_START_SECONDS`).
    pub start_secs: Option<u64>,
    pub exit_code: Option<i32>,
    pub oom: bool,
}

#[derive(Debug, Default)]
pub struct Index {
    /// Labelled nodes that are not being deleted.
    pub managed_nodes: BTreeMap<String, ()>,
    /// SpurJobs by namespace/name.
    pub spurjobs: BTreeMap<String, SpurJobView>,
    /// Pods by namespace/name.
    pub pods: BTreeMap<String, PodView>,
}

impl Index {
    /// The API server's side of a checks' sample, the same on every stage: SpurJobs by
    /// name, the controller job ids that have pods, and the labelled nodes.
    pub fn fill_observation(&self, seen: &mut Observation) {
        seen.spurjobs = self
            .spurjobs
            .iter()
            .map(|(k, v)| (k.rsplit('/').next().unwrap_or(k).to_owned(), v.clone()))
            .collect();
        seen.pod_job_ids = self.pods.values().filter_map(|p| p.job_id).collect();
        seen.managed_nodes = self.managed_nodes.keys().cloned().collect();
    }
}

#[derive(Clone, Debug, Default)]
pub struct ObjectIndex(Arc<Mutex<Index>>);

fn key(object: &Value) -> String {
    format!(
        "{}/{}",
        object["metadata"]["namespace"].as_str().unwrap_or_default(),
        object["metadata"]["name"].as_str().unwrap_or_default()
    )
}

fn env_of(pod: &Value, name: &str) -> Option<String> {
    pod["spec"]["containers"].as_array()?.first()?["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)?["value"]
        .as_str()
        .map(str::to_owned)
}

/// A pod's `SIM_RUN_SECONDS`, `SIM_START_SECONDS` or `SIM_EXIT_CODE`. With `SIM_FAILING_RANK=r` they speak of
/// the pod of node rank `r` alone (`SPUR_NODE_RANK`), and with `SIM_FAILING_RUNS=n` of the
/// job's first `n` runs alone (`SPUR_RUN_ATTEMPT`); the other pods run
/// `SIM_OTHERS_RUN_SECONDS` (else the kubelet's default) and succeed.
fn fate<T: std::str::FromStr>(pod: &Value, name: &str) -> Option<T> {
    let number = |name: &str| env_of(pod, name).and_then(|v| v.parse::<u32>().ok());
    let later_run = number("SIM_FAILING_RUNS")
        .is_some_and(|runs| number("SPUR_RUN_ATTEMPT").unwrap_or(1) > runs);
    let other_rank = env_of(pod, "SIM_FAILING_RANK")
        .is_some_and(|failing| env_of(pod, "SPUR_NODE_RANK").as_deref() != Some(failing.as_str()));
    let others = later_run || other_rank;
    let value = match (others, name) {
        (false, _) => env_of(pod, name),
        (true, "SIM_RUN_SECONDS") => env_of(pod, "SIM_OTHERS_RUN_SECONDS"),
        (true, _) => None,
    };
    value?.parse().ok()
}

impl ObjectIndex {
    /// An index fed by `api`'s changes from now on (objects created before are missed:
    /// attach it first).
    pub fn attach(api: &ApiServer) -> ObjectIndex {
        let index = ObjectIndex::default();
        let feed = index.clone();
        api.observe(move |change| feed.apply(change));
        index
    }

    pub fn lock(&self) -> MutexGuard<'_, Index> {
        self.0.lock().expect("index lock")
    }

    fn apply(&self, change: &Change) {
        let object = &*change.object;
        let gone = change.kind == ChangeKind::Deleted;
        let mut index = self.lock();
        match object["kind"].as_str().unwrap_or_default() {
            "Node" => {
                let name = object["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                let managed = object["metadata"]["labels"][MANAGED_LABEL] == "true"
                    && object["metadata"]["deletionTimestamp"].is_null();
                if managed && !gone {
                    index.managed_nodes.insert(name, ());
                } else {
                    index.managed_nodes.remove(&name);
                }
            }
            "SpurJob" => {
                let key = key(object);
                if gone {
                    index.spurjobs.remove(&key);
                } else {
                    index.spurjobs.insert(key, spurjob_view(object));
                }
            }
            "Pod" => {
                let key = key(object);
                if gone {
                    index.pods.remove(&key);
                } else {
                    index.pods.insert(key, pod_view(object));
                }
            }
            _ => {}
        }
    }
}

/// What the world reads of a SpurJob object.
fn spurjob_view(object: &Value) -> SpurJobView {
    SpurJobView {
        uid: object["metadata"]["uid"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        spur_job_id: object["status"]["spurJobId"].as_u64().map(|v| v as u32),
        state: object["status"]["state"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
    }
}

/// What the kubelet reads of a Pod object, its fate from the container's `SIM_*`
/// variables.
fn pod_view(object: &Value) -> PodView {
    PodView {
        namespace: object["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        name: object["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        phase: object["status"]["phase"]
            .as_str()
            .unwrap_or("Pending")
            .to_owned(),
        bound: object["spec"]["nodeName"].is_string(),
        deleting: !object["metadata"]["deletionTimestamp"].is_null(),
        job_id: object["metadata"]["labels"][spur_operator::LABEL_JOB_ID]
            .as_str()
            .and_then(|v| v.parse().ok()),
        container: object["spec"]["containers"][0]["name"].clone(),
        image: object["spec"]["containers"][0]["image"].clone(),
        run_secs: fate(object, "SIM_RUN_SECONDS"),
        start_secs: fate(object, "SIM_START_SECONDS"),
        exit_code: fate(object, "SIM_EXIT_CODE"),
        oom: env_of(object, "SIM_OOM").is_some(),
    }
}
