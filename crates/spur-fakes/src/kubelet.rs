//! A simulated kubelet: runs the pods bound to nodes by moving them through their phases.
//!
//! A pod starts at once, runs for the seconds its `job` container's `SIM_RUN_SECONDS`
//! says (else the configured default) and ends with the exit code `SIM_EXIT_CODE` says
//! (else 0), or `OOMKilled` when `SIM_OOM` is set; `SIM_START_SECONDS` holds it Pending
//! (`ContainerCreating`) that long first. `SIM_FAILING_RANK` narrows these to one rank of a
//! multi-node job (`index::fate`). The SpurJob's `env` carries these into
//! the pod, so a scenario decides each job's fate.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Value, json};

use crate::api_server::ApiServer;
use crate::index::{ObjectIndex, PodView};
use crate::model::Clock;

#[derive(Clone, Debug)]
pub struct KubeletConfig {
    /// How often pods are looked at: the granularity of start and end times.
    pub period: Duration,
    /// How long a pod runs when its spec does not say.
    pub default_run_time: Duration,
}

impl Default for KubeletConfig {
    fn default() -> Self {
        Self {
            period: Duration::from_millis(250),
            default_run_time: Duration::from_secs(10),
        }
    }
}

/// Runs the kubelets of every node until the host stops, on the simulated clock.
pub async fn run(
    api: ApiServer,
    index: ObjectIndex,
    config: KubeletConfig,
) -> Result<(), Box<dyn std::error::Error>> {
    run_with_clock(api, index, config, Clock::simulated()).await;
    Ok(())
}

/// Runs the kubelets of every node forever, reading time from `clock` (the real clock
/// when the operator runs as a process against the API server over TCP).
pub async fn run_with_clock(
    api: ApiServer,
    index: ObjectIndex,
    config: KubeletConfig,
    clock: Clock,
) {
    let timestamp = || {
        k8s_openapi::jiff::Timestamp::try_from((clock.wall)())
            .map(|t| t.to_string())
            .unwrap_or_default()
    };
    // When each running pod started, and when each held pod was first seen, by
    // namespace/name.
    let mut started: BTreeMap<String, Duration> = BTreeMap::new();
    let mut held: BTreeMap<String, Duration> = BTreeMap::new();
    loop {
        tokio::time::sleep(config.period).await;
        let now = (clock.elapsed)();
        let mut live = BTreeMap::new();
        let mut waiting = BTreeMap::new();
        for (key, pod) in bound_pods(&index) {
            if pod.phase == "Pending"
                && let Some(hold) = pod.start_secs
            {
                let since = *held.get(&key).unwrap_or(&now);
                waiting.insert(key.clone(), since);
                if now.saturating_sub(since) < Duration::from_secs(hold) {
                    if !held.contains_key(&key) {
                        patch_status(&api, &pod, &creating_status(&pod));
                    }
                    continue;
                }
            }
            match pod.phase.as_str() {
                "Pending" => {
                    patch_status(&api, &pod, &running_status(&pod, timestamp));
                    live.insert(key, now);
                }
                "Running" => {
                    let since = *started.get(&key).unwrap_or(&now);
                    live.insert(key, since);
                    let run_time = pod
                        .run_secs
                        .map_or(config.default_run_time, Duration::from_secs);
                    if now.saturating_sub(since) < run_time {
                        continue;
                    }
                    patch_status(&api, &pod, &terminated_status(&pod, timestamp));
                }
                _ => {}
            }
        }
        started = live;
        held = waiting;
    }
}

/// The pods bound to a node and not being deleted, by namespace/name.
fn bound_pods(index: &ObjectIndex) -> Vec<(String, PodView)> {
    index
        .lock()
        .pods
        .iter()
        .filter(|(_, p)| p.bound && !p.deleting)
        .map(|(k, p)| (k.clone(), p.clone()))
        .collect()
}

/// Merge-patches the pod's status subresource with `status`.
fn patch_status(api: &ApiServer, pod: &PodView, status: &Value) {
    let _ = api.merge_patch(
        "v1",
        "Pod",
        Some(pod.namespace.as_str()),
        pod.name.as_str(),
        status,
        true,
    );
}

/// A held pod's status: Pending, its container `ContainerCreating`.
fn creating_status(pod: &PodView) -> Value {
    json!({"status": {
        "phase": "Pending",
        "containerStatuses": [{"name": pod.container, "ready": false, "restartCount": 0,
            "image": pod.image, "imageID": "",
            "state": {"waiting": {"reason": "ContainerCreating"}}}],
    }})
}

/// A started pod's status: Running since now.
fn running_status(pod: &PodView, timestamp: impl Fn() -> String) -> Value {
    json!({"status": {
        "phase": "Running",
        "startTime": timestamp(),
        "containerStatuses": [{"name": pod.container, "ready": true, "restartCount": 0,
            "image": pod.image, "imageID": "",
            "state": {"running": {"startedAt": timestamp()}}}],
    }})
}

/// An ended pod's status: its container terminated with the exit code its spec decides
/// (137 and `OOMKilled` for an OOM kill), the pod Succeeded on 0, else Failed.
fn terminated_status(pod: &PodView, timestamp: impl Fn() -> String) -> Value {
    let exit_code = if pod.oom {
        137
    } else {
        pod.exit_code.unwrap_or(0)
    };
    let reason = match (pod.oom, exit_code) {
        (true, _) => "OOMKilled",
        (false, 0) => "Completed",
        _ => "Error",
    };
    json!({"status": {
        "phase": if exit_code == 0 { "Succeeded" } else { "Failed" },
        "containerStatuses": [{"name": pod.container, "ready": false, "restartCount": 0,
            "image": pod.image, "imageID": "",
            "state": {"terminated": {"exitCode": exit_code, "reason": reason,
                "finishedAt": timestamp()}}}],
    }})
}
