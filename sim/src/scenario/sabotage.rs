//! Deliberate breaks of the world, for the tests that show a check fires on a real run:
//! another writer clobbering a SpurJob's status, another controller's finalizer holding
//! a deleted SpurJob, a second controller job planted for one SpurJob. Never drawn by a
//! seed: only a test's [`super::ScenarioConfig::sabotage`] strikes them.

use std::time::Duration;

use serde_json::json;
use spur_operator::uid_in_comment;

use crate::world::World;
use spur_fakes::api_server::ApiServer;
use spur_fakes::model::state::{Command, Effect};

/// The finalizer [`Sabotage::HoldFinalizer`] adds: nobody ever removes it.
pub const HOLD: &str = "sim.spur.amd.com/hold";

pub use spur_judge::plan::Sabotage;

/// The API version of SpurJobs.
const V: &str = "spur.amd.com/v1alpha1";
/// The namespace the scenario's SpurJobs live in.
const NS: Option<&str> = Some("default");

/// Strikes `sabotage` now; panics (failing the seed with the message) when it finds
/// nothing to break, so a test cannot pass on a sabotage that never happened.
pub fn strike(w: &mut World, api: &ApiServer, sabotage: &Sabotage, now: Duration) {
    match sabotage {
        Sabotage::ClearSpurJobId { job } => patch_spur_job_id(api, job, serde_json::Value::Null),
        Sabotage::SpurJobIdOf { job, to } => {
            let id = read_spur_job(api, to)["status"]["spurJobId"]
                .as_u64()
                .unwrap_or_else(|| panic!("sabotage: {to} has no spurJobId yet to lend {job}"));
            patch_spur_job_id(api, job, json!(id));
        }
        Sabotage::HoldFinalizer { job } => hold_finalizer(api, job),
        Sabotage::DuplicateJob { job } => plant_duplicate(w, api, job, now),
    }
    w.trace()
        .record(now, "harness", format!("sabotage: {sabotage:?}"));
}

/// SpurJob `job` as the API server holds it.
fn read_spur_job(api: &ApiServer, job: &str) -> serde_json::Value {
    api.get(V, "SpurJob", NS, job)
        .unwrap_or_else(|e| panic!("sabotage: read {job}: {}", e.message))
}

/// Writes `id` as the spurJobId of SpurJob `job`'s status, as another writer would.
fn patch_spur_job_id(api: &ApiServer, job: &str, id: serde_json::Value) {
    api.merge_patch(
        V,
        "SpurJob",
        NS,
        job,
        &json!({"status": {"spurJobId": id}}),
        true,
    )
    .unwrap_or_else(|e| panic!("sabotage: patch the status of {job}: {}", e.message));
}

/// Adds [`HOLD`] to SpurJob `job`'s finalizers.
fn hold_finalizer(api: &ApiServer, job: &str) {
    let object = read_spur_job(api, job);
    let mut finalizers: Vec<serde_json::Value> = object["metadata"]["finalizers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    finalizers.push(json!(HOLD));
    api.merge_patch(
        V,
        "SpurJob",
        NS,
        job,
        &json!({"metadata": {"finalizers": finalizers}}),
        false,
    )
    .unwrap_or_else(|e| panic!("sabotage: hold {job}: {}", e.message));
}

/// Submits a copy of SpurJob `job`'s controller job on the controller leader and runs it,
/// as a second controller job for one SpurJob would.
fn plant_duplicate(w: &World, api: &ApiServer, job: &str, now: Duration) {
    let uid = read_spur_job(api, job)["metadata"]["uid"]
        .as_str()
        .expect("a SpurJob has a uid")
        .to_owned();
    let cluster = w.cluster();
    let slot = cluster
        .leader_with_quorum()
        .and_then(|leader| cluster.slot_of(&leader))
        .expect("sabotage: a controller leader to plant the duplicate on");
    let spec = cluster
        .read(slot, |state| {
            state
                .jobs
                .values()
                .find(|j| uid_in_comment(&j.spec.comment) == Some(uid.as_str()))
                .map(|j| j.spec.clone())
        })
        .unwrap_or_else(|| panic!("sabotage: {job} has no controller job to copy"));
    let at = crate::determinism::epoch() + now;
    let planted = cluster
        .propose(
            slot,
            Command::SubmitJob {
                spec: Box::new(spec),
                at,
            },
            now,
        )
        .unwrap_or_else(|e| panic!("sabotage: plant a duplicate of {job}: {e:?}"));
    let Effect::JobId(job_id) = planted else {
        panic!("sabotage: the duplicate of {job} got no id: {planted:?}");
    };
    cluster
        .propose(slot, Command::JobRunning { job_id, at }, now)
        .unwrap_or_else(|e| panic!("sabotage: run the duplicate of {job}: {e:?}"));
}
