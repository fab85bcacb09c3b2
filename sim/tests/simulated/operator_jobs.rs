//! A SpurJob through its whole life in the simulated world, and one deleted while running.

use std::time::Duration;

use serde_json::json;
use spur_proto::JobState;
use spur_sim::harness::Sim;

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn start(seed: u64) -> Sim {
    let mut sim = Sim::new(seed);
    sim.add_nodes(2);
    sim.start_kubelet();
    sim.start_operator("operator", &[]);
    sim
}

/// The Warning events on SpurJob `name`, as (reason, note), oldest first.
fn warnings(sim: &Sim, name: &str) -> Vec<(String, String)> {
    sim.api
        .list("events.k8s.io/v1", "Event")
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e["regarding"]["name"] == name && e["type"] == "Warning")
        .map(|e| {
            let text = |k: &str| e[k].as_str().unwrap_or_default().to_owned();
            (text("reason"), text("note"))
        })
        .collect()
}

/// The condition of `type_` in `status`, as (status, reason, message).
fn condition(status: &serde_json::Value, type_: &str) -> Option<(String, String, String)> {
    let found = status["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)?;
    let text = |k: &str| found[k].as_str().unwrap_or_default().to_owned();
    Some((text("status"), text("reason"), text("message")))
}

#[test]
fn a_spurjob_runs_to_completion() {
    let mut sim = start(21);
    sim.world.run_until(secs(10)).unwrap();
    sim.create_spurjob(
        "default",
        "hello",
        json!({"image": "busybox", "command": ["sh", "-c", "echo hi"],
               "env": {"SIM_RUN_SECONDS": "5"}, "gpus": {"count": 1}}),
    );
    sim.world.run_until(secs(60)).unwrap();

    let job = sim.spurjob("default", "hello").expect("the SpurJob exists");
    let status = &job["status"];
    let id = status["spurJobId"].as_u64().expect("submitted") as u32;
    assert_eq!(status["state"], "Completed", "{status:#}");
    let finished = status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Finished")
        .expect("a Finished condition");
    assert_eq!(finished["status"], "True");
    assert!(
        job["metadata"]["finalizers"]
            .as_array()
            .unwrap()
            .contains(&json!("spur.amd.com/cleanup"))
    );

    let info = sim
        .controller_job(id)
        .expect("the controller knows the job");
    assert_eq!(info.state(), JobState::JobCompleted);
    let pods = sim.pods("default");
    assert_eq!(pods.len(), 1);
    let pod = &pods[0];
    assert_eq!(pod["spec"]["nodeName"], info.nodelist.as_str());
    assert_eq!(
        pod["metadata"]["annotations"]["spur.amd.com/reported"],
        "true"
    );
    assert_eq!(
        pod["spec"]["containers"][0]["resources"]["limits"]["amd.com/gpu"],
        "1"
    );
    // Exactly one submission.
    assert_eq!(sim.world.cluster().job_ids(), vec![id]);
    // The submission lag is measured from the SpurJob's creation, in simulated time: one
    // observation, below the few seconds the submission took.
    let metrics = sim.operator("operator").unwrap().metrics.encode();
    assert!(
        metrics.contains("spur_operator_spurjob_submission_lag_seconds_count 1"),
        "{metrics}"
    );
    let sum: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("spur_operator_spurjob_submission_lag_seconds_sum "))
        .unwrap()
        .parse()
        .unwrap();
    assert!((0.0..5.0).contains(&sum), "submission lag {sum}s");
}

#[test]
fn an_arrays_gpu_seconds_are_its_tasks_summed() {
    let mut sim = start(28);
    sim.world.run_until(secs(10)).unwrap();
    // Three tasks of 2 GPUs each, about 10 s apiece, on two nodes: two at once, then one.
    sim.create_spurjob(
        "default",
        "sweep",
        json!({"image": "busybox", "arraySpec": "0-2", "gpus": {"count": 2},
               "env": {"SIM_RUN_SECONDS": "10"}}),
    );
    sim.world.run_until(secs(90)).unwrap();
    let status = &sim.spurjob("default", "sweep").unwrap()["status"];
    assert_eq!(status["state"], "Completed", "{status:#}");
    let metrics = sim.operator("operator").unwrap().metrics.encode();
    let used: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("spur_operator_gpu_seconds_total{namespace=\"default\"} "))
        .unwrap_or_else(|| panic!("no GPU-seconds in {metrics}"))
        .parse()
        .unwrap();
    // 3 tasks x 2 GPUs x 10 s, plus each task's report lag.
    assert!((60.0..=75.0).contains(&used), "{used} GPU-seconds");
}

#[test]
fn a_failed_pod_fails_the_job_with_its_exit_code() {
    let mut sim = start(22);
    sim.world.run_until(secs(10)).unwrap();
    sim.create_spurjob(
        "default",
        "crash",
        json!({"image": "busybox", "env": {"SIM_RUN_SECONDS": "2", "SIM_EXIT_CODE": "3"}}),
    );
    sim.world.run_until(secs(40)).unwrap();
    let status = &sim.spurjob("default", "crash").unwrap()["status"];
    assert_eq!(status["state"], "Failed", "{status:#}");
    let id = status["spurJobId"].as_u64().unwrap() as u32;
    assert_eq!(sim.controller_job(id).unwrap().exit_code, 3);
}

/// A two-node job whose rank 1 fails with exit code 3 after 5 s while rank 0 would run an
/// hour, under the failure policy `policy`; returns the simulation at `at` seconds.
fn rank_1_fails(seed: u64, policy: &str, others_run_secs: u64, at: u64) -> Sim {
    let mut sim = start(seed);
    sim.world.run_until(secs(10)).unwrap();
    sim.create_spurjob(
        "default",
        "train",
        json!({"image": "busybox", "numNodes": 2,
               "failurePolicy": {"onRankFailure": policy},
               "env": {"SIM_FAILING_RANK": "1", "SIM_RUN_SECONDS": "5", "SIM_EXIT_CODE": "3",
                       "SIM_OTHERS_RUN_SECONDS": others_run_secs.to_string()}}),
    );
    sim.world.run_until(secs(at)).unwrap();
    sim
}

#[test]
fn one_failed_rank_stops_the_others_and_fails_the_job_with_its_exit_code() {
    let sim = rank_1_fails(23, "FailJob", 3600, 40);
    let status = &sim.spurjob("default", "train").unwrap()["status"];
    assert_eq!(status["state"], "Failed", "{status:#}");
    let id = status["spurJobId"].as_u64().unwrap() as u32;
    let job = sim.controller_job(id).unwrap();
    assert_eq!(job.state(), JobState::JobFailed);
    assert_eq!(
        job.exit_code, 3,
        "the failed rank's exit, not the stopped one's"
    );
    let nodes = spur_operator::nodes_of(&job.nodelist).unwrap();
    assert_eq!(nodes.len(), 2, "{}", job.nodelist);
    let (rank0, rank1) = (nodes[0].as_str(), nodes[1].as_str());
    let results = &status["nodeResults"];
    assert_eq!(results[rank1]["result"], "Failed", "{results:#}");
    assert_eq!(results[rank1]["exitCode"], 3);
    assert_eq!(results[rank0]["result"], "Stopped", "{results:#}");
    assert!(
        results[rank0]["message"]
            .as_str()
            .unwrap()
            .contains(&format!("the pod on {rank1} failed")),
        "{results:#}"
    );
    let failed = status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Failed")
        .expect("a Failed condition");
    assert_eq!(
        failed["message"],
        format!("exit code 3 (failed on {rank1})"),
        "{failed:#}"
    );
    // kubectl describe: the failure and the stop, as Warnings on the SpurJob.
    let events: Vec<(String, String)> = warnings(&sim, "train")
        .into_iter()
        .filter(|(reason, _)| reason != "Failed")
        .collect();
    assert_eq!(
        events,
        [
            (
                "PodFailed".to_owned(),
                format!("the pod on {rank1} failed: exit code 3: Error")
            ),
            (
                "RanksStopped".to_owned(),
                format!(
                    "stopped the pods on {rank0} (failurePolicy FailJob): the pod on {rank1} failed"
                )
            ),
        ]
    );
    // The stopped rank's pod is gone; the failed one's stays for its log.
    let pods = sim.pods("default");
    assert_eq!(pods.len(), 1, "{pods:#?}");
    assert_eq!(pods[0]["spec"]["nodeName"], rank1);
    let metrics = sim.operator("operator").unwrap().metrics.encode();
    assert!(
        metrics.contains("spur_operator_ranks_stopped_total 1"),
        "{metrics}"
    );
}

#[test]
fn a_rank_not_running_by_the_start_timeout_fails_the_job_and_frees_every_node() {
    let mut sim = start(25);
    sim.world.run_until(secs(10)).unwrap();
    // Rank 1's pod would sit in ContainerCreating for ten minutes; rank 0 runs an hour.
    sim.create_spurjob(
        "default",
        "stuck",
        json!({"image": "busybox", "numNodes": 2, "startTimeout": "30s",
               "env": {"SIM_FAILING_RANK": "1", "SIM_START_SECONDS": "600",
                       "SIM_OTHERS_RUN_SECONDS": "3600"}}),
    );
    sim.world.run_until(secs(30)).unwrap();
    assert_eq!(sim.pods("default").len(), 2, "both pods, one held");
    sim.world.run_until(secs(60)).unwrap();
    let status = &sim.spurjob("default", "stuck").unwrap()["status"];
    assert_eq!(status["state"], "Failed", "{status:#}");
    let id = status["spurJobId"].as_u64().unwrap() as u32;
    let job = sim.controller_job(id).unwrap();
    assert_eq!(job.state(), JobState::JobFailed);
    let nodes = spur_operator::nodes_of(&job.nodelist).unwrap();
    let results = &status["nodeResults"];
    assert_eq!(results[&nodes[1]]["result"], "Failed", "{results:#}");
    assert_eq!(
        results[&nodes[1]]["message"],
        "not Running within its startTimeout of 30s: ContainerCreating"
    );
    assert_eq!(results[&nodes[0]]["result"], "Stopped", "{results:#}");
    // Neither pod is left: the held one would otherwise start later with no job.
    assert!(sim.pods("default").is_empty(), "{:#?}", sim.pods("default"));
    let metrics = sim.operator("operator").unwrap().metrics.encode();
    assert!(
        metrics.contains("spur_operator_launch_failures_total{reason=\"StartTimeout\"} 1"),
        "{metrics}"
    );
}

#[test]
fn a_failed_rank_restarts_the_job_under_its_id_and_its_next_run_completes() {
    let mut sim = start(26);
    sim.world.run_until(secs(10)).unwrap();
    // In the first run rank 1 fails after 5 s with exit code 3; every later pod runs 20 s
    // and succeeds.
    sim.create_spurjob(
        "default",
        "retry",
        json!({"image": "busybox", "numNodes": 2,
               "failurePolicy": {"maxRestarts": 2},
               "env": {"SIM_FAILING_RANK": "1", "SIM_FAILING_RUNS": "1", "SIM_RUN_SECONDS": "5",
                       "SIM_EXIT_CODE": "3", "SIM_OTHERS_RUN_SECONDS": "20"}}),
    );
    sim.world.run_until(secs(25)).unwrap();
    let first = sim.spurjob("default", "retry").unwrap()["status"].clone();
    let id = first["spurJobId"].as_u64().expect("submitted") as u32;
    sim.world.run_until(secs(120)).unwrap();
    let status = &sim.spurjob("default", "retry").unwrap()["status"];
    assert_eq!(status["state"], "Completed", "{status:#}");
    assert_eq!(
        status["spurJobId"].as_u64(),
        Some(u64::from(id)),
        "same job id"
    );
    let job = sim.controller_job(id).unwrap();
    assert_eq!(job.state(), JobState::JobCompleted, "{job:?}");
    // Each node's latest result is of the second run, which succeeded.
    let results = status["nodeResults"].as_object().unwrap();
    assert_eq!(results.len(), 2, "{results:#?}");
    for result in results.values() {
        assert_eq!(result["result"], "Succeeded", "{results:#?}");
        assert_eq!(result["runAttempt"], 2, "{results:#?}");
    }
    let events = warnings(&sim, "retry");
    let restarted: Vec<&String> = events
        .iter()
        .filter(|(reason, _)| reason == "Restarted")
        .map(|(_, note)| note)
        .collect();
    assert_eq!(restarted.len(), 1, "{events:#?}");
    assert!(
        restarted[0].starts_with("restart 1 of at most 2 (failurePolicy.maxRestarts): the pod on ")
            && restarted[0].ends_with(&format!(
                "failed; spurctld runs job {id} again under the same id"
            )),
        "{events:#?}"
    );
    // The failed rank's pod stays for its log; rank 0's pod of the first run was stopped.
    let mut pods: Vec<(String, String)> = sim
        .pods("default")
        .into_iter()
        .map(|p| {
            let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
            (text(&p["metadata"]["name"]), text(&p["status"]["phase"]))
        })
        .collect();
    pods.sort();
    let phases: Vec<&str> = pods.iter().map(|(_, phase)| phase.as_str()).collect();
    let mut sorted = phases.clone();
    sorted.sort();
    assert_eq!(sorted, ["Failed", "Succeeded", "Succeeded"], "{pods:#?}");
    let metrics = sim.operator("operator").unwrap().metrics.encode();
    assert!(
        metrics.contains("spur_operator_job_restarts_total{reason=\"PodFailed\"} 1"),
        "{metrics}"
    );
}

#[test]
fn a_start_timeout_requeues_the_job_until_its_restarts_are_spent_then_fails_it() {
    let mut sim = start(27);
    sim.world.run_until(secs(10)).unwrap();
    // Rank 1's pod never starts in time, in any run.
    sim.create_spurjob(
        "default",
        "late",
        json!({"image": "busybox", "numNodes": 2, "startTimeout": "20s",
               "failurePolicy": {"onStartTimeout": "Requeue", "maxRestarts": 1},
               "env": {"SIM_FAILING_RANK": "1", "SIM_START_SECONDS": "600",
                       "SIM_OTHERS_RUN_SECONDS": "3600"}}),
    );
    sim.world.run_until(secs(50)).unwrap();
    let status = sim.spurjob("default", "late").unwrap()["status"].clone();
    assert_ne!(
        status["state"], "Failed",
        "restarted, not failed: {status:#}"
    );
    sim.world.run_until(secs(120)).unwrap();
    let status = &sim.spurjob("default", "late").unwrap()["status"];
    assert_eq!(status["state"], "Failed", "{status:#}");
    let id = status["spurJobId"].as_u64().unwrap() as u32;
    assert_eq!(sim.controller_job(id).unwrap().state(), JobState::JobFailed);
    let failed: Vec<&serde_json::Value> = status["nodeResults"]
        .as_object()
        .unwrap()
        .values()
        .filter(|r| r["result"] == "Failed")
        .collect();
    assert_eq!(failed.len(), 1, "{status:#}");
    assert_eq!(
        failed[0]["runAttempt"], 2,
        "the second run failed the job: {status:#}"
    );
    let events = warnings(&sim, "late");
    let restarts = events.iter().filter(|(r, _)| r == "Restarted").count();
    assert_eq!(restarts, 1, "{events:#?}");
    // No pod is left: a late pod would otherwise start with no job behind it.
    assert!(sim.pods("default").is_empty(), "{:#?}", sim.pods("default"));
    let metrics = sim.operator("operator").unwrap().metrics.encode();
    for line in [
        "spur_operator_job_restarts_total{reason=\"StartTimeout\"} 1",
        "spur_operator_launch_failures_total{reason=\"StartTimeout\"} 2",
    ] {
        assert!(metrics.contains(line), "{line} in {metrics}");
    }
}

#[test]
fn with_wait_for_others_the_job_ends_when_its_last_rank_does_with_rank_0s_verdict() {
    // Rank 1 fails at about 15 s; rank 0 runs on to about 45 s.
    let mut sim = rank_1_fails(24, "WaitForOthers", 30, 35);
    let status = sim.spurjob("default", "train").unwrap()["status"].clone();
    assert_eq!(status["state"], "Completing", "{status:#}");
    assert_eq!(sim.pods("default").len(), 2, "no pod stopped");
    sim.world.run_until(secs(80)).unwrap();
    let status = &sim.spurjob("default", "train").unwrap()["status"];
    // spurctld's verdict is its first node's: rank 0 succeeded, so the job did.
    assert_eq!(status["state"], "Completed", "{status:#}");
    let results = status["nodeResults"].as_object().unwrap();
    let mut outcomes: Vec<&str> = results
        .values()
        .map(|r| r["result"].as_str().unwrap())
        .collect();
    outcomes.sort();
    assert_eq!(outcomes, ["Failed", "Succeeded"], "{results:#?}");
    let metrics = sim.operator("operator").unwrap().metrics.encode();
    assert!(
        metrics.contains("spur_operator_ranks_stopped_total 0"),
        "{metrics}"
    );
}

#[test]
fn an_invalid_spurjob_gets_a_message_and_is_not_submitted() {
    let mut sim = start(23);
    sim.world.run_until(secs(5)).unwrap();
    sim.create_spurjob(
        "default",
        "bad",
        json!({"image": "busybox", "timeLimit": "4 fortnights"}),
    );
    sim.create_spurjob(
        "default",
        "good",
        json!({"image": "busybox", "env": {"SIM_RUN_SECONDS": "1"}}),
    );
    sim.world.run_until(secs(30)).unwrap();
    let bad = &sim.spurjob("default", "bad").unwrap()["status"];
    // Upstream's state name, so `kubectl wait --for=jsonpath='{.status.state}'=Failed`
    // ends; ours in the condition.
    assert_eq!(bad["state"], "Failed", "{bad:#}");
    let (status, reason, _) = condition(bad, "Failed").expect("a Failed condition");
    assert_eq!((status.as_str(), reason.as_str()), ("True", "Invalid"));
    assert!(
        bad["message"]
            .as_str()
            .unwrap()
            .starts_with("spec.timeLimit:"),
        "{bad:#}"
    );
    assert!(bad["spurJobId"].is_null());
    let good = &sim.spurjob("default", "good").unwrap()["status"];
    assert_eq!(
        good["state"], "Completed",
        "the bad one did not hold up the good one"
    );
    assert_eq!(sim.world.cluster().job_ids().len(), 1);
    let events = sim.api.list("events.k8s.io/v1", "Event").unwrap();
    assert!(
        events
            .iter()
            .any(|e| e["reason"] == "InvalidSpec" && e["regarding"]["name"] == "bad"),
        "a Warning event names the bad SpurJob"
    );
}

#[test]
fn a_refused_spurjob_is_failed_with_upstreams_message_and_runs_once_its_spec_is_fixed() {
    let mut sim = start(25);
    sim.world.run_until(secs(5)).unwrap();
    sim.create_spurjob(
        "default",
        "refused",
        json!({"image": "busybox", "partition": "nonexistent", "env": {"SIM_RUN_SECONDS": "1"}}),
    );
    sim.world.run_until(secs(20)).unwrap();
    let status = sim.spurjob("default", "refused").unwrap()["status"].clone();
    assert_eq!(status["state"], "Failed", "{status:#}");
    assert_eq!(
        status["message"], "rejected by spurctld: partition 'nonexistent' not found",
        "as upstream 0.9 words it"
    );
    let (_, reason, detail) = condition(&status, "Failed").expect("a Failed condition");
    assert_eq!(reason, "Refused");
    assert!(detail.contains("INVALID_ARGUMENT"), "{detail}");
    assert!(status["spurJobId"].is_null());
    assert!(sim.world.cluster().job_ids().is_empty());
    assert!(
        warnings(&sim, "refused")
            .iter()
            .any(|(reason, _)| reason == "SubmitRefused"),
        "{:?}",
        warnings(&sim, "refused")
    );
    // An edit submits it again: the refusal's end is forgotten and the job runs.
    sim.api
        .merge_patch(
            "spur.amd.com/v1alpha1",
            "SpurJob",
            Some("default"),
            "refused",
            &json!({"spec": {"partition": "default"}}),
            false,
        )
        .unwrap();
    sim.world.run_until(secs(60)).unwrap();
    let status = sim.spurjob("default", "refused").unwrap()["status"].clone();
    assert_eq!(status["state"], "Completed", "{status:#}");
    assert_eq!(condition(&status, "Failed"), None, "{status:#}");
    let (finished, reason, _) = condition(&status, "Finished").unwrap();
    assert_eq!((finished.as_str(), reason.as_str()), ("True", "Completed"));
}

#[test]
fn a_malformed_volume_or_secret_entry_is_left_out_with_a_warning_and_the_job_runs() {
    let mut sim = start(26);
    sim.world.run_until(secs(5)).unwrap();
    sim.create_spurjob(
        "default",
        "tolerant",
        json!({"image": "busybox", "env": {"SIM_RUN_SECONDS": "1"},
               "volumes": ["relative:/x", "/data:/data:ro"],
               "secretEnv": {"TOKEN": "no-slash", "HF_TOKEN": "hf/token"}}),
    );
    sim.world.run_until(secs(40)).unwrap();
    let status = sim.spurjob("default", "tolerant").unwrap()["status"].clone();
    assert_eq!(status["state"], "Completed", "{status:#}");
    let (dropped, reason, message) = condition(&status, "EntriesDropped").expect("named");
    assert_eq!(
        (dropped.as_str(), reason.as_str()),
        ("True", "MalformedEntries")
    );
    for named in [
        "spec.volumes[0]: `relative:/x`",
        "spec.secretEnv.TOKEN: `no-slash`",
    ] {
        assert!(message.contains(named), "{named} in {message}");
    }
    let warned = warnings(&sim, "tolerant");
    assert!(
        warned
            .iter()
            .any(|(reason, note)| reason == "EntriesDropped" && *note == message),
        "{warned:?}"
    );
    let pods = sim.pods("default");
    assert_eq!(pods.len(), 1);
    let container = &pods[0]["spec"]["containers"][0];
    assert_eq!(container["volumeMounts"][0]["mountPath"], "/data");
    assert_eq!(container["volumeMounts"].as_array().unwrap().len(), 1);
    let secrets: Vec<&str> = container["env"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| !e["valueFrom"].is_null())
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(secrets, ["HF_TOKEN"]);
}

#[test]
fn deleting_a_running_spurjob_cancels_its_job_and_removes_its_pods() {
    let mut sim = start(24);
    sim.world.run_until(secs(10)).unwrap();
    sim.create_spurjob(
        "default",
        "long",
        json!({"image": "busybox", "env": {"SIM_RUN_SECONDS": "3600"}}),
    );
    sim.world.run_until(secs(30)).unwrap();
    let status = sim.spurjob("default", "long").unwrap()["status"].clone();
    assert_eq!(status["state"], "Running", "{status:#}");
    let id = status["spurJobId"].as_u64().unwrap() as u32;
    assert_eq!(sim.pods("default").len(), 1);

    sim.api
        .delete("spur.amd.com/v1alpha1", "SpurJob", Some("default"), "long")
        .unwrap();
    sim.world.run_until(secs(50)).unwrap();
    assert!(
        sim.spurjob("default", "long").is_none(),
        "the finalizer let it go"
    );
    assert_eq!(
        sim.controller_job(id).unwrap().state(),
        JobState::JobCancelled
    );
    assert!(sim.pods("default").is_empty());
}

/// A world whose controllers sign agent calls with `controller_key`, and an operator that
/// requires tokens under `operator_key`.
fn start_with_agent_keys(seed: u64, controller_key: &[u8], operator_key: &[u8]) -> Sim {
    use spur_sim::world::WorldConfig;
    let mut config = WorldConfig::default();
    config.controller.agent_key = Some(controller_key.to_vec());
    let mut sim = Sim::with_config(seed, config);
    sim.add_nodes(2);
    sim.start_kubelet();
    let path =
        std::env::temp_dir().join(format!("spur-sim-agent-key-{}-{seed}", std::process::id()));
    std::fs::write(&path, operator_key).unwrap();
    let flag_path = path.to_str().unwrap().to_owned();
    sim.start_operator(
        "operator",
        &[
            "--agent-auth",
            "required",
            "--agent-auth-key-file",
            &flag_path,
        ],
    );
    // The key is read when the flags are validated, at start.
    std::fs::remove_file(path).unwrap();
    sim
}

const AGENT_KEY: &[u8] = b"spurctld-agent-key-32-bytes-long";

#[test]
fn with_agent_auth_required_a_signed_launch_runs_and_a_forged_one_is_refused() {
    let job = json!({"image": "busybox", "env": {"SIM_RUN_SECONDS": "2"}});

    let mut sim = start_with_agent_keys(23, AGENT_KEY, AGENT_KEY);
    sim.world.run_until(secs(10)).unwrap();
    sim.create_spurjob("default", "signed", job.clone());
    sim.world.run_until(secs(60)).unwrap();
    let status = &sim.spurjob("default", "signed").unwrap()["status"];
    assert_eq!(status["state"], "Completed", "{status:#}");

    let mut sim = start_with_agent_keys(23, b"a-different-key-of-32-bytes-long", AGENT_KEY);
    sim.world.run_until(secs(10)).unwrap();
    sim.create_spurjob("default", "forged", job);
    sim.world.run_until(secs(60)).unwrap();
    let status = &sim.spurjob("default", "forged").unwrap()["status"];
    assert_ne!(status["state"], "Completed", "{status:#}");
    assert!(
        sim.pods("default").is_empty(),
        "no pod for a refused launch"
    );
    let refused = sim.world.trace().find("Unauthenticated");
    assert!(
        !refused.is_empty(),
        "the controller saw its launches refused"
    );
    let metrics = sim.operator("operator").unwrap().metrics.encode();
    assert!(
        metrics.contains("spur_operator_agent_calls_total{result=\"refused\"}"),
        "{metrics}"
    );
}

/// The status poller reads every active job with one GetJobs per interval (2 s), however
/// many there are: no call per job in the steady state.
#[test]
fn many_active_spurjobs_cost_one_getjobs_per_interval() {
    let load = spur_sim::cli::measure_active_jobs(300).unwrap();
    assert_eq!(
        load.calls.keys().collect::<Vec<_>>(),
        ["GetJobs"],
        "{load:?}"
    );
    assert_eq!(load.per_second(load.calls["GetJobs"]), 0.5, "{load:?}");
    assert!(load.submitted_after < secs(10), "{load:?}");
    // The replicas answered those, and the channel's own reads and Pings besides (its
    // rotation every 20 s), which the operator's counter leaves out: still no call a job.
    assert!(
        load.answered["GetJobs"] >= load.calls["GetJobs"],
        "{load:?}"
    );
    let total: usize = load.answered.values().sum();
    assert!(load.per_second(total) < 1.0, "{load:?}");
}

/// A second job of `job`'s SpurJob planted at the controller's leader, as a submission
/// given up on and applied late is: the same spec, a fresh id, pending. Returns its id.
fn land_late_duplicate(sim: &Sim, job_id: u32) -> u32 {
    use spur_fakes::model::state::{Command, Effect};
    let cluster = sim.world.cluster();
    let slot = cluster
        .leader_with_quorum()
        .and_then(|leader| cluster.slot_of(&leader))
        .expect("a controller leader");
    let spec = cluster.read(slot, |state| state.jobs[&job_id].spec.clone());
    let now = sim.world.elapsed();
    let at = spur_sim::determinism::epoch() + now;
    let command = Command::SubmitJob {
        spec: Box::new(spec),
        at,
    };
    match cluster.propose(slot, command, now) {
        Ok(Effect::JobId(id)) => id,
        other => panic!("the late duplicate was not applied: {other:?}"),
    }
}

/// The watch for a late duplicate is recorded on the SpurJob
/// (`status.unansweredSubmissionAt`), so the replica that acts after a failover cancels a
/// second job its predecessor's unanswered SubmitJob left, while it waits in the queue,
/// and the finalizer cancels one still queued at deletion.
#[test]
fn a_duplicate_landing_after_an_operator_failover_is_cancelled_by_the_replica_that_took_over() {
    use spur_fakes::model::LostReply;
    let mut sim = Sim::new(25);
    sim.add_nodes(1);
    sim.start_kubelet();
    sim.start_operator("operator-a", &[]);
    sim.world.run_until(secs(15)).unwrap();
    sim.start_operator("operator-b", &[]);
    // Applied, and answered with a transport error: the operator cannot tell it landed.
    sim.world
        .cluster()
        .lose_next_reply("SubmitJob", LostReply::TransportError);
    // Every GPU of the one node: a second job of it can only wait.
    let spec = json!({"image": "busybox", "gpus": {"count": 8},
                      "env": {"SIM_RUN_SECONDS": "3600"}});
    sim.create_spurjob("default", "late", spec);
    sim.world.run_until(secs(40)).unwrap();
    let status = sim.spurjob("default", "late").unwrap()["status"].clone();
    let id = status["spurJobId"].as_u64().expect("submitted") as u32;
    assert!(status["unansweredSubmissionAt"].is_string(), "{status:#}");
    assert_eq!(
        sim.leases
            .holder(spur_sim::harness::OPERATOR_LEASE)
            .as_deref(),
        Some("operator-a")
    );

    sim.world
        .kill("operator-a", spur_sim::world::KillMode::Silent);
    sim.world.run_until(secs(90)).unwrap();
    assert_eq!(
        sim.leases
            .holder(spur_sim::harness::OPERATOR_LEASE)
            .as_deref(),
        Some("operator-b")
    );
    let duplicate = land_late_duplicate(&sim, id);
    // Within one watch interval (30 s), before it could ever launch.
    sim.world.run_until(secs(125)).unwrap();
    assert_eq!(
        sim.controller_job(duplicate).unwrap().state(),
        JobState::JobCancelled
    );
    assert_eq!(
        sim.controller_job(id).unwrap().state(),
        JobState::JobRunning
    );
    let pods = sim.pods("default");
    assert_eq!(pods.len(), 1, "no pod for the duplicate");

    // Another lands and the SpurJob is deleted at once: the finalizer finds it by name.
    let second = land_late_duplicate(&sim, id);
    sim.api
        .delete("spur.amd.com/v1alpha1", "SpurJob", Some("default"), "late")
        .unwrap();
    sim.world.run_until(secs(135)).unwrap();
    assert!(
        sim.spurjob("default", "late").is_none(),
        "the finalizer let it go"
    );
    for job in [id, second] {
        assert_eq!(
            sim.controller_job(job).unwrap().state(),
            JobState::JobCancelled,
            "job {job}"
        );
    }
}
