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

/// Strikes `sabotage` now; panics (failing the seed with the message) when it finds
/// nothing to break, so a test cannot pass on a sabotage that never happened.
pub fn strike(w: &mut World, api: &ApiServer, sabotage: &Sabotage, now: Duration) {
    const V: &str = "spur.amd.com/v1alpha1";
    let ns = Some("default");
    let patch_status = |job: &str, id: serde_json::Value| {
        api.merge_patch(
            V,
            "SpurJob",
            ns,
            job,
            &json!({"status": {"spurJobId": id}}),
            true,
        )
        .unwrap_or_else(|e| panic!("sabotage: patch the status of {job}: {}", e.message));
    };
    match sabotage {
        Sabotage::ClearSpurJobId { job } => patch_status(job, serde_json::Value::Null),
        Sabotage::SpurJobIdOf { job, to } => {
            let other = api
                .get(V, "SpurJob", ns, to)
                .unwrap_or_else(|e| panic!("sabotage: read {to}: {}", e.message));
            let id = other["status"]["spurJobId"]
                .as_u64()
                .unwrap_or_else(|| panic!("sabotage: {to} has no spurJobId yet to lend {job}"));
            patch_status(job, json!(id));
        }
        Sabotage::HoldFinalizer { job } => {
            let object = api
                .get(V, "SpurJob", ns, job)
                .unwrap_or_else(|e| panic!("sabotage: read {job}: {}", e.message));
            let mut finalizers: Vec<serde_json::Value> = object["metadata"]["finalizers"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            finalizers.push(json!(HOLD));
            api.merge_patch(
                V,
                "SpurJob",
                ns,
                job,
                &json!({"metadata": {"finalizers": finalizers}}),
                false,
            )
            .unwrap_or_else(|e| panic!("sabotage: hold {job}: {}", e.message));
        }
        Sabotage::DuplicateJob { job } => {
            let uid =
                api.get(V, "SpurJob", ns, job)
                    .unwrap_or_else(|e| panic!("sabotage: read {job}: {}", e.message))["metadata"]
                    ["uid"]
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
    }
    w.trace()
        .record(now, "harness", format!("sabotage: {sabotage:?}"));
}
