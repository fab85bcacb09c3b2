//! Every kind of SpurJob end to end on real processes: the real `spur-operator` binary,
//! real spurctld (one replica, or three under Raft behind a Service), the simulated API
//! server over TCP and a kubelet stand-in that runs pods to their end (`SIM_RUN_SECONDS`,
//! `SIM_EXIT_CODE`, `SIM_OOM` in a SpurJob's env decide how). Each case asserts on the
//! SpurJob's status, its pods, and spurctld's own view, and prints how long the SpurJob
//! took from creation to its pods and to its final state.
//!
//! Without the binaries (outside CI) each case prints one loud line and does nothing; in CI
//! a missing binary fails it.

#[path = "real_e2e/stack.rs"]
mod stack;
#[path = "real_e2e/upstream.rs"]
mod upstream;
#[path = "real_e2e/upstream_layout.rs"]
mod upstream_layout;

use std::future::Future;
use std::time::Duration;

use serde_json::{Value, json};
use spur_proto as pb;
use stack::{NAMESPACE, SPURJOB, Stack, StackConfig};
use tokio::time::Instant;

/// Runs `case` on a fresh stack, bounded to 150 s.
fn e2e<F, Fut>(config: StackConfig, case: F)
where
    F: FnOnce(Stack) -> Fut,
    Fut: Future<Output = ()>,
{
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async move {
        let stack = Stack::start(config).await;
        if tokio::time::timeout(Duration::from_secs(150), case(stack))
            .await
            .is_err()
        {
            panic!("the case did not finish within 150 s");
        }
    });
}

fn job_spec(extra: Value) -> Value {
    let mut spec = json!({
        "image": "busybox:1.36",
        "command": ["sh", "-c", "true"],
        "numNodes": 1,
        "tasksPerNode": 1,
        "cpusPerTask": 1,
        "env": {"SIM_RUN_SECONDS": "2"},
    });
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
        for (key, value) in extra {
            spec.insert(key.clone(), value.clone());
        }
    }
    spec
}

/// A one-node, one-task busybox job as spurctld takes it straight from a client (not
/// through our operator): what upstream's operator submits, or a late duplicate.
fn one_node_busybox(name: &str) -> pb::JobSpec {
    pb::JobSpec {
        name: name.to_owned(),
        num_nodes: 1,
        num_tasks: 1,
        tasks_per_node: 1,
        cpus_per_task: 1,
        argv: vec!["sh".into(), "-c".into(), "true".into()],
        container_image: "busybox:1.36".to_owned(),
        ..Default::default()
    }
}

fn terminal(state: &str) -> bool {
    spur_operator::is_terminal(state)
}

/// Waits for `n` pods of `name` and then for its final state; prints both times.
async fn run_to_end(stack: &Stack, name: &str, pods: usize, created: Instant) -> (String, Value) {
    let to_pods = stack
        .until(
            &format!("{name}: {pods} pod(s)"),
            created,
            Duration::from_secs(60),
            |s| s.pods(name).len() >= pods,
        )
        .await;
    let to_end = stack
        .until(
            &format!("{name}: a final state"),
            created,
            Duration::from_secs(90),
            |s| s.state(name).is_some_and(|st| terminal(&st)),
        )
        .await;
    eprintln!(
        "e2e {name}: pods {:.1}s after creation, final state {:.1}s after creation",
        to_pods.as_secs_f64(),
        to_end.as_secs_f64()
    );
    let job = stack.spurjob(name).expect("the SpurJob");
    (
        job["status"]["state"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        job,
    )
}

/// With `SPUR_E2E_KUBECTL` naming a kubectl binary, prints what kubectl shows of SpurJob
/// `name` through the stack's API server (`get -o wide`, `describe`), for a person to read.
/// Nothing is asserted on it.
fn show_with_kubectl(stack: &Stack, name: &str) {
    let Ok(kubectl) = std::env::var("SPUR_E2E_KUBECTL") else {
        return;
    };
    let kubeconfig = stack.admin_kubeconfig();
    for args in [
        vec!["get", "spurjob", name, "-o", "wide"],
        vec!["describe", "spurjob", name],
    ] {
        let output = std::process::Command::new(&kubectl)
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(&args)
            .output()
            .expect("run kubectl");
        eprintln!(
            "$ kubectl {}\n{}{}",
            args.join(" "),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

fn id_of(job: &Value) -> u32 {
    job["status"]["spurJobId"].as_u64().expect("a spurJobId") as u32
}

async fn controller_state(stack: &Stack, name: &str, id: u32) -> pb::JobState {
    stack
        .controller_jobs(name)
        .await
        .into_iter()
        .find(|j| j.job_id == id)
        .map(|j| pb::JobState::try_from(j.state).unwrap_or(pb::JobState::JobPending))
        .unwrap_or_else(|| panic!("spurctld has no job {id} named {name}"))
}

fn env_of(pod: &Value) -> std::collections::BTreeMap<String, String> {
    pod["spec"]["containers"][0]["env"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| {
            Some((
                e["name"].as_str()?.to_owned(),
                e["value"].as_str()?.to_owned(),
            ))
        })
        .collect()
}

#[test]
fn a_cpu_job_runs_to_completion_on_one_replica_and_on_three() {
    for replicas in [1, 3] {
        let config = StackConfig {
            replicas,
            ..StackConfig::default()
        };
        e2e(config, |stack| async move {
            let created = Instant::now();
            stack.create_spurjob("cpu", job_spec(json!({})));
            let (state, job) = run_to_end(&stack, "cpu", 1, created).await;
            assert_eq!(state, "Completed", "{job}{}", stack.logs());
            let id = id_of(&job);
            assert_eq!(
                controller_state(&stack, "cpu", id).await,
                pb::JobState::JobCompleted
            );
            let pod = &stack.pods("cpu")[0];
            assert_eq!(pod["status"]["phase"], "Succeeded");
        });
    }
}

/// The operator's count of its Heartbeat calls spurctld answered with `code`.
fn heartbeats_answered(metrics: &str, code: &str) -> u64 {
    let series =
        format!("spur_operator_controller_rpcs_total{{method=\"Heartbeat\",code=\"{code}\"}}");
    counter(metrics, &series)
}

/// A counter's value in the operator's metrics text; 0 while it has not been counted.
fn counter(metrics: &str, series: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix(series)?
                .strip_prefix(' ')?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

/// spurctld in token admission (docs/specs.md row 12): with the join token of
/// `--controller-join-token-file` the nodes register, heartbeat with their node tokens and
/// run a job; without one the operator says, in one line, which flag to set.
#[test]
fn under_token_admission_a_job_completes_with_the_join_token_and_without_one_a_line_names_the_flag()
{
    for replicas in [1, 3] {
        let config = StackConfig {
            replicas,
            token_admission: true,
            // Rounds every second, so the case sees several inside its run.
            operator_flags: vec!["--heartbeat-interval".into(), "1s".into()],
            ..StackConfig::default()
        };
        e2e(config, |stack| async move {
            let created = Instant::now();
            stack.create_spurjob("admitted", job_spec(json!({})));
            let (state, job) = run_to_end(&stack, "admitted", 1, created).await;
            assert_eq!(state, "Completed", "{job}{}", stack.logs());
            // Three rounds of both nodes' heartbeats, each carrying its node token.
            let since = Instant::now();
            let mut metrics = stack.metrics().await;
            while heartbeats_answered(&metrics, "OK") < 6
                && since.elapsed() < Duration::from_secs(15)
            {
                tokio::time::sleep(Duration::from_millis(500)).await;
                metrics = stack.metrics().await;
            }
            assert!(
                heartbeats_answered(&metrics, "OK") >= 6,
                "heartbeats accepted\n{metrics}{}",
                stack.logs()
            );
            for refused in ["UNAUTHENTICATED", "PERMISSION_DENIED"] {
                assert_eq!(
                    heartbeats_answered(&metrics, refused),
                    0,
                    "{refused}\n{metrics}"
                );
            }
        });
    }
    let config = StackConfig {
        token_admission: true,
        withhold_join_token: true,
        ..StackConfig::default()
    };
    e2e(config, |stack| async move {
        let hint = "set --controller-join-token-file";
        let start = Instant::now();
        while !stack.operator_log().contains(hint) {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "no line names the flag{}",
                stack.logs()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        // Registrations go on being refused (both nodes, each on its backoff); the line is
        // not repeated.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let log = stack.operator_log();
        assert_eq!(log.matches(hint).count(), 1, "{}", stack.logs());
    });
}

#[test]
fn a_gpu_job_gets_its_gpus_and_a_two_node_gpu_job_two_ranked_pods_and_a_headless_service() {
    e2e(StackConfig::default(), |stack| async move {
        let created = Instant::now();
        stack.create_spurjob("gpu", job_spec(json!({"gpus": {"count": 2}})));
        stack.create_spurjob(
            "gpu-two",
            job_spec(json!({"gpus": {"count": 8}, "numNodes": 2, "env": {"SIM_RUN_SECONDS": "3"}})),
        );
        let (state, job) = run_to_end(&stack, "gpu", 1, created).await;
        assert_eq!(state, "Completed", "{job}{}", stack.logs());
        let pod = &stack.pods("gpu")[0];
        assert_eq!(
            pod["spec"]["containers"][0]["resources"]["limits"]["amd.com/gpu"], "2",
            "{pod}"
        );

        let (state, job) = run_to_end(&stack, "gpu-two", 2, created).await;
        assert_eq!(state, "Completed", "{job}{}", stack.logs());
        let id = id_of(&job);
        let pods = stack.pods("gpu-two");
        let mut ranks: Vec<(String, String)> = pods
            .iter()
            .map(|p| {
                let env = env_of(p);
                (
                    env.get("SPUR_NODE_RANK").cloned().unwrap_or_default(),
                    p["spec"]["nodeName"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                )
            })
            .collect();
        ranks.sort();
        assert_eq!(ranks.len(), 2, "{pods:?}");
        assert_eq!((ranks[0].0.as_str(), ranks[1].0.as_str()), ("0", "1"));
        assert_ne!(ranks[0].1, ranks[1].1, "two different nodes");
        for pod in &pods {
            let env = env_of(pod);
            assert_eq!(
                env.get("SPUR_NUM_NODES").map(String::as_str),
                Some("2"),
                "{env:?}"
            );
            let nodelist = env.get("SPUR_NODELIST").cloned().unwrap_or_default();
            assert_eq!(nodelist.split(',').count(), 2, "{env:?}");
            assert_eq!(
                pod["spec"]["containers"][0]["resources"]["limits"]["amd.com/gpu"], "8",
                "{pod}"
            );
        }
        let service = stack
            .api
            .get("v1", "Service", Some(NAMESPACE), &format!("spur-job-{id}"));
        let service = service.expect("the job's headless Service");
        assert_eq!(service["spec"]["clusterIP"], "None", "{service}");

        // The job-level metrics saw both: ended (as of the poller's next round), started,
        // and their GPU-seconds (2 GPUs for about 2 s, 16 GPUs for about 3 s).
        let completed = "spur_operator_spurjobs{namespace=\"default\",state=\"Completed\"} 2";
        let since = Instant::now();
        let mut metrics = stack.metrics().await;
        while !metrics.contains(completed) && since.elapsed() < Duration::from_secs(10) {
            tokio::time::sleep(Duration::from_millis(500)).await;
            metrics = stack.metrics().await;
        }
        let value = |series: &str| -> f64 {
            metrics
                .lines()
                .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
                .unwrap_or_else(|| panic!("{series} not in\n{metrics}"))
        };
        assert_eq!(
            value("spur_operator_spurjobs{namespace=\"default\",state=\"Completed\"}"),
            2.0
        );
        assert!(value("spur_operator_spurjob_start_lag_seconds_count") >= 2.0);
        let gpu_seconds = value("spur_operator_gpu_seconds_total{namespace=\"default\"}");
        assert!((20.0..=200.0).contains(&gpu_seconds), "{gpu_seconds}");
    });
}

#[test]
fn an_array_job_runs_each_task_and_ends_when_all_did() {
    e2e(StackConfig::default(), |stack| async move {
        let created = Instant::now();
        stack.create_spurjob("array", job_spec(json!({"arraySpec": "0-2"})));
        let (state, job) = run_to_end(&stack, "array", 3, created).await;
        assert_eq!(state, "Completed", "{job}{}", stack.logs());
        let tasks = stack.controller_jobs("array").await;
        assert_eq!(tasks.len(), 3, "{tasks:?}");
        assert!(
            tasks
                .iter()
                .all(|t| t.state == pb::JobState::JobCompleted as i32),
            "{tasks:?}"
        );
    });
}

/// An OOMKilled container is reported with spurd's OOM bit, so the real spurctld ends the
/// job OUT_OF_MEMORY (not FAILED), and status says `OutOfMemory` as upstream's does.
#[test]
fn an_oom_killed_pod_ends_its_job_out_of_memory() {
    e2e(StackConfig::default(), |stack| async move {
        let created = Instant::now();
        stack.create_spurjob(
            "oom",
            job_spec(json!({"env": {"SIM_RUN_SECONDS": "1", "SIM_OOM": "1"}})),
        );
        let (state, job) = run_to_end(&stack, "oom", 1, created).await;
        assert_eq!(state, "OutOfMemory", "{job}{}", stack.logs());
        let id = id_of(&job);
        assert_eq!(
            controller_state(&stack, "oom", id).await,
            pb::JobState::JobOutOfMemory
        );
    });
}

#[test]
fn a_failing_pod_ends_its_job_failed_with_the_exit_code_in_status() {
    e2e(StackConfig::default(), |stack| async move {
        let created = Instant::now();
        stack.create_spurjob(
            "fails",
            job_spec(json!({"env": {"SIM_RUN_SECONDS": "3", "SIM_EXIT_CODE": "3"}})),
        );
        let (state, job) = run_to_end(&stack, "fails", 1, created).await;
        assert_eq!(state, "Failed", "{job}{}", stack.logs());
        let message = job["status"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("exit code 3"), "{job}");
        let id = id_of(&job);
        assert_eq!(
            controller_state(&stack, "fails", id).await,
            pb::JobState::JobFailed
        );
        // When it ran, from spurctld's own clock.
        let (start, end) = (
            job["status"]["startTime"].as_str().unwrap_or_default(),
            job["status"]["endTime"].as_str().unwrap_or_default(),
        );
        let start: k8s_openapi::jiff::Timestamp = start.parse().expect("status.startTime");
        let end: k8s_openapi::jiff::Timestamp = end.parse().expect("status.endTime");
        assert!(start <= end, "{job}");
        // kubectl describe: an Event for each state it went through, the end a Warning.
        let uid = job["metadata"]["uid"].clone();
        let events: Vec<(String, String, String)> = stack
            .api
            .list("events.k8s.io/v1", "Event")
            .unwrap_or_default()
            .into_iter()
            .filter(|e| e["regarding"]["uid"] == uid)
            .map(|e| {
                let text = |k: &str| e[k].as_str().unwrap_or_default().to_owned();
                (text("type"), text("reason"), text("note"))
            })
            .collect();
        let failed = events.iter().find(|(_, reason, _)| reason == "Failed");
        let failed = failed.unwrap_or_else(|| panic!("no Failed event: {events:?}"));
        assert_eq!(failed.0, "Warning", "{events:?}");
        assert!(failed.2.contains("exit code 3"), "{events:?}");
        // It ran for 3 s, longer than the 2 s status poll, so Running was seen; each
        // state is told once.
        let running = events.iter().filter(|(_, reason, _)| reason == "Running");
        assert_eq!(
            running.map(|(t, _, _)| t.as_str()).collect::<Vec<_>>(),
            ["Normal"],
            "{events:?}"
        );
        assert_eq!(
            events
                .iter()
                .filter(|(_, reason, _)| reason == "Failed")
                .count(),
            1
        );
        // Its way through spurctld as conditions.
        let condition = |type_: &str| {
            job["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|c| c["type"] == type_)
                .map(|c| {
                    let text = |k: &str| c[k].as_str().unwrap_or_default().to_owned();
                    (text("status"), text("reason"), text("message"))
                })
                .unwrap_or_else(|| panic!("no {type_} condition: {job}"))
        };
        assert_eq!(condition("Submitted").0, "True", "{job}");
        assert_eq!(condition("Queued").0, "False", "{job}");
        // spurctld picks either node.
        let node = job["status"]["assignedNodes"][0].as_str().expect("a node");
        let scheduled = condition("Scheduled");
        assert_eq!(
            (scheduled.0.as_str(), scheduled.2),
            ("True", format!("on {node}")),
            "{job}"
        );
        let failed = condition("Failed");
        assert_eq!(failed.0, "True", "{job}");
        assert!(
            failed.2.contains("exit code 3") && failed.2.contains(node),
            "{job}"
        );
        assert!(
            job["status"]["conditions"]
                .as_array()
                .unwrap()
                .iter()
                .all(|c| c["type"] != "Succeeded")
        );
    });
}

#[test]
fn one_failed_rank_of_a_two_node_job_stops_the_other_and_fails_the_job_with_its_exit_code() {
    e2e(StackConfig::default(), |stack| async move {
        let created = Instant::now();
        // Rank 1 fails with exit code 3 after 3 s; rank 0 would run ten minutes.
        stack.create_spurjob(
            "rank-fails",
            job_spec(json!({"numNodes": 2, "env": {
                "SIM_FAILING_RANK": "1", "SIM_RUN_SECONDS": "3", "SIM_EXIT_CODE": "3",
                "SIM_OTHERS_RUN_SECONDS": "600"}})),
        );
        let (state, job) = run_to_end(&stack, "rank-fails", 2, created).await;
        assert_eq!(state, "Failed", "{job}{}", stack.logs());
        let id = id_of(&job);
        let info = stack
            .controller_jobs("rank-fails")
            .await
            .into_iter()
            .find(|j| j.job_id == id)
            .expect("spurctld knows the job");
        assert_eq!(info.state(), pb::JobState::JobFailed, "{info:?}");
        assert_eq!(info.exit_code, 3, "the failed rank's exit: {info:?}");
        let pods = stack.pods("rank-fails");
        let rank_of = |pod: &Value| env_of(pod).get("SPUR_NODE_RANK").cloned();
        let failed_node = pods
            .iter()
            .find(|p| rank_of(p).as_deref() == Some("1"))
            .and_then(|p| p["spec"]["nodeName"].as_str())
            .expect("rank 1's pod stays, for its log")
            .to_owned();
        // Rank 0's pod was stopped: deleted, its end told to spurctld by the operator.
        let gone = stack
            .until(
                "rank 0's pod deleted",
                created,
                Duration::from_secs(30),
                |s| {
                    s.pods("rank-fails")
                        .iter()
                        .all(|p| rank_of(p).as_deref() != Some("0"))
                },
            )
            .await;
        eprintln!(
            "e2e rank-fails: rank 0's pod gone {:.1}s after creation",
            gone.as_secs_f64()
        );
        let results = &job["status"]["nodeResults"];
        assert_eq!(results[&failed_node]["result"], "Failed", "{job}");
        assert_eq!(results[&failed_node]["exitCode"], 3, "{job}");
        let stopped: Vec<&Value> = results
            .as_object()
            .expect("nodeResults")
            .values()
            .filter(|r| r["result"] == "Stopped")
            .collect();
        assert_eq!(stopped.len(), 1, "{job}");
        let failed = job["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "Failed")
            .unwrap_or_else(|| panic!("no Failed condition: {job}"));
        assert_eq!(
            failed["message"],
            format!("exit code 3: NonZeroExitCode (failed on {failed_node})"),
            "{job}"
        );
        let uid = job["metadata"]["uid"].clone();
        let reasons: Vec<String> = stack
            .api
            .list("events.k8s.io/v1", "Event")
            .unwrap_or_default()
            .into_iter()
            .filter(|e| e["regarding"]["uid"] == uid && e["type"] == "Warning")
            .map(|e| e["reason"].as_str().unwrap_or_default().to_owned())
            .collect();
        for reason in ["PodFailed", "RanksStopped", "Failed"] {
            assert_eq!(
                reasons.iter().filter(|r| *r == reason).count(),
                1,
                "{reason}: {reasons:?}"
            );
        }
        let metrics = stack.metrics().await;
        assert!(
            metrics.contains("spur_operator_ranks_stopped_total 1"),
            "{metrics}"
        );
        show_with_kubectl(&stack, "rank-fails");
    });
}

#[test]
fn a_failed_rank_restarts_the_job_under_its_id_and_its_second_run_completes() {
    e2e(StackConfig::default(), |stack| async move {
        let created = Instant::now();
        // In the first run rank 1 fails with exit code 3 after 3 s; every other pod runs
        // 8 s and succeeds (rank 0 of the first run is stopped before then: had it ended
        // first, spurctld would have ended the job on its report).
        stack.create_spurjob(
            "restarts",
            job_spec(
                json!({"numNodes": 2, "failurePolicy": {"maxRestarts": 1}, "env": {
                "SIM_FAILING_RANK": "1", "SIM_FAILING_RUNS": "1", "SIM_RUN_SECONDS": "3",
                "SIM_EXIT_CODE": "3", "SIM_OTHERS_RUN_SECONDS": "8"}}),
            ),
        );
        let second_run = stack
            .until(
                "restarts: a pod of the second run",
                created,
                Duration::from_secs(60),
                |s| {
                    s.pods("restarts")
                        .iter()
                        .any(|p| env_of(p).get("SPUR_RUN_ATTEMPT").map(String::as_str) == Some("2"))
                },
            )
            .await;
        let (state, job) = run_to_end(&stack, "restarts", 2, created).await;
        eprintln!(
            "e2e restarts: the second run's first pod {:.1}s after creation",
            second_run.as_secs_f64()
        );
        assert_eq!(state, "Completed", "{job}{}", stack.logs());
        let id = id_of(&job);
        assert_eq!(
            controller_state(&stack, "restarts", id).await,
            pb::JobState::JobCompleted
        );
        let results = job["status"]["nodeResults"]
            .as_object()
            .expect("nodeResults");
        assert_eq!(results.len(), 2, "{job}");
        for result in results.values() {
            assert_eq!(result["result"], "Succeeded", "{job}");
            assert_eq!(result["runAttempt"], 2, "{job}");
        }
        // The first run's failed pod stays for its log; its other pod was stopped.
        let first_run: Vec<String> = stack
            .pods("restarts")
            .iter()
            .filter(|p| env_of(p).get("SPUR_RUN_ATTEMPT").map(String::as_str) == Some("1"))
            .map(|p| p["status"]["phase"].as_str().unwrap_or_default().to_owned())
            .collect();
        assert_eq!(first_run, ["Failed"], "{job}");
        let uid = job["metadata"]["uid"].clone();
        let restarted: Vec<String> = stack
            .api
            .list("events.k8s.io/v1", "Event")
            .unwrap_or_default()
            .into_iter()
            .filter(|e| e["regarding"]["uid"] == uid && e["reason"] == "Restarted")
            .map(|e| e["note"].as_str().unwrap_or_default().to_owned())
            .collect();
        assert_eq!(restarted.len(), 1, "{restarted:?}");
        assert!(
            restarted[0].starts_with("restart 1 of at most 1"),
            "{restarted:?}"
        );
        let metrics = stack.metrics().await;
        assert!(
            metrics.contains("spur_operator_job_restarts_total{reason=\"PodFailed\"} 1"),
            "{metrics}"
        );
    });
}

#[test]
fn a_rank_not_running_by_the_start_timeout_fails_the_job_and_leaves_no_pod() {
    e2e(StackConfig::default(), |stack| async move {
        let created = Instant::now();
        // Rank 1's pod would sit in ContainerCreating for ten minutes; rank 0 runs ten.
        stack.create_spurjob(
            "start-late",
            job_spec(json!({"numNodes": 2, "startTimeout": "8s", "env": {
                "SIM_FAILING_RANK": "1", "SIM_START_SECONDS": "600",
                "SIM_OTHERS_RUN_SECONDS": "600"}})),
        );
        let (state, job) = run_to_end(&stack, "start-late", 2, created).await;
        assert_eq!(state, "Failed", "{job}{}", stack.logs());
        let id = id_of(&job);
        assert_eq!(
            controller_state(&stack, "start-late", id).await,
            pb::JobState::JobFailed
        );
        let results = job["status"]["nodeResults"]
            .as_object()
            .expect("nodeResults");
        let mut outcomes: Vec<(&str, &str)> = results
            .values()
            .map(|r| {
                (
                    r["result"].as_str().unwrap_or_default(),
                    r["message"].as_str().unwrap_or_default(),
                )
            })
            .collect();
        outcomes.sort();
        assert_eq!(outcomes.len(), 2, "{job}");
        assert_eq!(
            outcomes[0],
            (
                "Failed",
                "not Running within its startTimeout of 8s: ContainerCreating"
            ),
            "{job}"
        );
        assert_eq!(outcomes[1].0, "Stopped", "{job}");
        let gone = stack
            .until("no pod left", created, Duration::from_secs(30), |s| {
                s.pods("start-late").is_empty()
            })
            .await;
        eprintln!(
            "e2e start-late: no pod left {:.1}s after creation",
            gone.as_secs_f64()
        );
        let metrics = stack.metrics().await;
        assert!(
            metrics.contains("spur_operator_launch_failures_total{reason=\"StartTimeout\"} 1"),
            "{metrics}"
        );
    });
}

#[test]
fn a_start_timeout_under_requeue_runs_the_job_again_and_fails_it_once_its_restarts_are_spent() {
    e2e(StackConfig::default(), |stack| async move {
        let created = Instant::now();
        // Rank 1's pod would sit in ContainerCreating for ten minutes, in every run.
        stack.create_spurjob(
            "start-again",
            job_spec(json!({"numNodes": 2, "startTimeout": "5s",
                "failurePolicy": {"onStartTimeout": "Requeue", "maxRestarts": 1},
                "env": {"SIM_FAILING_RANK": "1", "SIM_START_SECONDS": "600",
                        "SIM_OTHERS_RUN_SECONDS": "600"}})),
        );
        let (state, job) = run_to_end(&stack, "start-again", 2, created).await;
        assert_eq!(state, "Failed", "{job}{}", stack.logs());
        let id = id_of(&job);
        assert_eq!(
            controller_state(&stack, "start-again", id).await,
            pb::JobState::JobFailed
        );
        let failed: Vec<&Value> = job["status"]["nodeResults"]
            .as_object()
            .expect("nodeResults")
            .values()
            .filter(|r| r["result"] == "Failed")
            .collect();
        assert_eq!(failed.len(), 1, "{job}");
        assert_eq!(
            failed[0]["runAttempt"], 2,
            "the second run failed the job: {job}"
        );
        let gone = stack
            .until("no pod left", created, Duration::from_secs(30), |s| {
                s.pods("start-again").is_empty()
            })
            .await;
        eprintln!(
            "e2e start-again: no pod left {:.1}s after creation",
            gone.as_secs_f64()
        );
        let metrics = stack.metrics().await;
        for line in [
            "spur_operator_job_restarts_total{reason=\"StartTimeout\"} 1",
            "spur_operator_launch_failures_total{reason=\"StartTimeout\"} 2",
        ] {
            assert!(metrics.contains(line), "{line} in {metrics}");
        }
    });
}

#[test]
fn a_spurjob_deleted_while_running_is_cancelled_and_its_pods_and_finalizer_go_within_20s() {
    e2e(StackConfig::default(), |stack| async move {
        let created = Instant::now();
        stack.create_spurjob("long", job_spec(json!({"env": {"SIM_RUN_SECONDS": "600"}})));
        stack
            .until("long: running", created, Duration::from_secs(60), |s| {
                s.state("long").as_deref() == Some("Running") && !s.pods("long").is_empty()
            })
            .await;
        let id = id_of(&stack.spurjob("long").expect("job"));
        let deleted = Instant::now();
        stack
            .api
            .delete(SPURJOB.0, SPURJOB.1, Some(NAMESPACE), "long")
            .expect("delete");
        let took = stack
            .until("long: gone", deleted, Duration::from_secs(20), |s| {
                s.spurjob("long").is_none()
                    && s.api.list("v1", "Pod").unwrap_or_default().iter().all(|p| {
                        p["metadata"]["labels"]["spur.amd.com/job-id"] != id.to_string().as_str()
                    })
            })
            .await;
        eprintln!("e2e long: gone {:.1}s after deletion", took.as_secs_f64());
        assert_eq!(
            controller_state(&stack, "long", id).await,
            pb::JobState::JobCancelled
        );
    });
}

/// spurctld does not deduplicate, and a SubmitJob the operator gave up on in a network cut
/// lands when a kernel retransmits it after the heal: a second job carrying the SpurJob's
/// UID. Planted here as that late submission would arrive; the agent refuses its launch
/// and cancels it, and the SpurJob's own job runs on untouched.
#[test]
fn a_late_second_job_of_a_spurjob_is_refused_at_launch_and_cancelled_without_a_pod() {
    e2e(StackConfig::default(), |stack| async move {
        let created = Instant::now();
        stack.create_spurjob("dup", job_spec(json!({"env": {"SIM_RUN_SECONDS": "6"}})));
        stack
            .until("dup: running", created, Duration::from_secs(60), |s| {
                s.state("dup").as_deref() == Some("Running")
            })
            .await;
        let job = stack.spurjob("dup").expect("the SpurJob");
        let id = id_of(&job);
        let uid = job["metadata"]["uid"].as_str().expect("a uid").to_owned();
        let leader = stack.cluster.leader().expect("a single replica leads");
        let planted = Instant::now();
        let second = stack
            .replica(leader)
            .await
            .submit_job(pb::SubmitJobRequest {
                spec: Some(pb::JobSpec {
                    comment: format!("spurjob-uid={uid}"),
                    ..one_node_busybox("dup")
                }),
            })
            .await
            .expect("the late submission is applied")
            .into_inner()
            .job_id;
        assert_ne!(second, id);
        let cancelled = loop {
            let state = controller_state(&stack, "dup", second).await;
            if state == pb::JobState::JobCancelled {
                break planted.elapsed();
            }
            assert!(
                planted.elapsed() < Duration::from_secs(30),
                "job {second} still {state:?} 30 s after it was planted{}",
                stack.logs()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        eprintln!(
            "e2e dup: the second job cancelled {:.1}s after it was applied",
            cancelled.as_secs_f64()
        );
        let (state, job) = run_to_end(&stack, "dup", 1, created).await;
        assert_eq!(state, "Completed");
        assert_eq!(id_of(&job), id, "the SpurJob keeps its own job");
        let pods_of_second = stack
            .api
            .list("v1", "Pod")
            .unwrap_or_default()
            .into_iter()
            .filter(|p| {
                p["metadata"]["labels"]["spur.amd.com/job-id"] == second.to_string().as_str()
            })
            .count();
        assert_eq!(pods_of_second, 0, "the second job got no pod");
        let metrics = stack.metrics().await;
        assert!(
            metrics.contains("spur_operator_duplicate_jobs_cancelled_total{found_at=\"launch\"} 1"),
            "{metrics}"
        );
    });
}

#[test]
fn a_spurjob_deleted_after_its_job_ended_loses_its_finalizer() {
    e2e(StackConfig::default(), |stack| async move {
        let created = Instant::now();
        stack.create_spurjob("short", job_spec(json!({})));
        let (state, _) = run_to_end(&stack, "short", 1, created).await;
        assert_eq!(state, "Completed");
        let deleted = Instant::now();
        stack
            .api
            .delete(SPURJOB.0, SPURJOB.1, Some(NAMESPACE), "short")
            .expect("delete");
        stack
            .until("short: gone", deleted, Duration::from_secs(20), |s| {
                s.spurjob("short").is_none()
            })
            .await;
    });
}

#[test]
fn a_spurjob_spurctld_refuses_says_why_in_its_status_and_is_not_retried() {
    e2e(StackConfig::default(), |stack| async move {
        let created = Instant::now();
        stack.create_spurjob("refused", job_spec(json!({"partition": "nonexistent"})));
        stack
            .until("refused: Failed", created, Duration::from_secs(30), |s| {
                s.state("refused").as_deref() == Some("Failed")
            })
            .await;
        let job = stack.spurjob("refused").expect("job");
        let message = job["status"]["message"].as_str().unwrap_or_default();
        assert!(
            message.starts_with("rejected by spurctld: ")
                && message.contains("partition 'nonexistent' not found"),
            "{job}"
        );
        assert!(stack.controller_jobs("refused").await.is_empty());
        let events = stack
            .api
            .list("events.k8s.io/v1", "Event")
            .unwrap_or_default();
        assert!(
            events
                .iter()
                .any(|e| e["type"] == "Warning" && e["regarding"]["name"] == "refused"),
            "a Warning event: {events:?}"
        );
        // Not retried: the refusal stays, and spurctld still has no job of that name.
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(stack.state("refused").as_deref(), Some("Failed"));
        assert!(stack.controller_jobs("refused").await.is_empty());
    });
}

#[test]
fn a_job_survives_its_node_turning_not_ready() {
    e2e(StackConfig::default(), |stack| async move {
        let created = Instant::now();
        stack.create_spurjob(
            "tainted",
            job_spec(json!({"env": {"SIM_RUN_SECONDS": "12"}})),
        );
        stack
            .until("tainted: running", created, Duration::from_secs(60), |s| {
                s.state("tainted").as_deref() == Some("Running") && !s.pods("tainted").is_empty()
            })
            .await;
        let node = stack.pods("tainted")[0]["spec"]["nodeName"]
            .as_str()
            .expect("a node")
            .to_owned();
        stack
            .api
            .merge_patch(
                "v1",
                "Node",
                None,
                &node,
                &json!({"spec": {"taints": [{"key": "node.kubernetes.io/not-ready",
                    "effect": "NoSchedule"}]}}),
                false,
            )
            .expect("taint");
        let (state, job) = run_to_end(&stack, "tainted", 1, created).await;
        assert_eq!(state, "Completed", "{job}{}", stack.logs());
    });
}

#[test]
fn a_spurjob_pending_when_the_leader_is_killed_is_submitted_within_3s_of_the_new_leader() {
    let config = StackConfig {
        replicas: 3,
        ..StackConfig::default()
    };
    e2e(config, |mut stack| async move {
        let created = Instant::now();
        stack.create_spurjob("before", job_spec(json!({})));
        stack
            .until("before: submitted", created, Duration::from_secs(30), |s| {
                s.spurjob("before")
                    .is_some_and(|j| j["status"]["spurJobId"].is_u64())
            })
            .await;
        let leader = stack.cluster.leader().expect("a leader");
        stack.cluster.kill(leader);
        let killed = Instant::now();
        stack.create_spurjob("after", job_spec(json!({})));
        let elected = stack
            .until("a new leader", killed, Duration::from_secs(20), |s| {
                s.cluster.leader().is_some_and(|l| l != leader)
            })
            .await;
        let submitted = stack
            .until("after: submitted", killed, Duration::from_secs(30), |s| {
                s.spurjob("after")
                    .is_some_and(|j| j["status"]["spurJobId"].is_u64())
            })
            .await;
        eprintln!(
            "e2e leader kill: new leader {:.1}s after the kill, SpurJob submitted {:.1}s after it",
            elected.as_secs_f64(),
            submitted.as_secs_f64()
        );
        assert!(
            submitted.saturating_sub(elected) <= Duration::from_secs(3),
            "submitted {:.1}s after the new leader{}",
            submitted.saturating_sub(elected).as_secs_f64(),
            stack.logs()
        );
        let (state, _) = run_to_end(&stack, "after", 1, created).await;
        assert_eq!(state, "Completed", "{}", stack.logs());
    });
}

/// The agent's calls whose token check gave `result` (`verified`, `refused`, ...).
fn agent_calls(metrics: &str, result: &str) -> u64 {
    counter(
        metrics,
        &format!("spur_operator_agent_calls_total{{result=\"{result}\"}}"),
    )
}

/// The agent requiring tokens, spurctld signing with the same key: its LaunchJob and its
/// CancelJob (a `scancel`) are verified and served, none refused.
#[test]
fn with_agent_auth_required_and_spurctlds_jwt_key_jobs_run_and_are_cancelled() {
    let config = StackConfig {
        agent_key: Some("e2e-agent-key-thirty-two-bytes-long!".to_owned()),
        ..StackConfig::default()
    };
    e2e(config, |stack| async move {
        let created = Instant::now();
        stack.create_spurjob("authed", job_spec(json!({})));
        let (state, job) = run_to_end(&stack, "authed", 1, created).await;
        assert_eq!(state, "Completed", "{job}{}", stack.logs());

        stack.create_spurjob(
            "authed-long",
            job_spec(json!({"env": {"SIM_RUN_SECONDS": "600"}})),
        );
        stack
            .until(
                "authed-long: running",
                created,
                Duration::from_secs(60),
                |s| {
                    s.state("authed-long").as_deref() == Some("Running")
                        && !s.pods("authed-long").is_empty()
                },
            )
            .await;
        let launched = agent_calls(&stack.metrics().await, "verified");
        let id = id_of(&stack.spurjob("authed-long").expect("job"));
        let cancel = pb::CancelJobRequest {
            job_id: id,
            ..Default::default()
        };
        stack
            .replica(0)
            .await
            .cancel_job(cancel)
            .await
            .expect("scancel");
        let cancelled = Instant::now();
        stack
            .until(
                "authed-long: cancelled",
                cancelled,
                Duration::from_secs(20),
                |s| s.state("authed-long").as_deref() == Some("Cancelled"),
            )
            .await;
        let since = Instant::now();
        let mut metrics = stack.metrics().await;
        while agent_calls(&metrics, "verified") <= launched
            && since.elapsed() < Duration::from_secs(10)
        {
            tokio::time::sleep(Duration::from_millis(200)).await;
            metrics = stack.metrics().await;
        }
        assert!(
            agent_calls(&metrics, "verified") > launched,
            "spurctld's CancelJob verified\n{metrics}"
        );
        assert_eq!(agent_calls(&metrics, "refused"), 0, "{metrics}");
    });
}

/// A swap from upstream's operator with a job in flight: spurctld launched it through
/// upstream's agent, whose pod (upstream's name, labels and container) is running, and
/// whose SpurJob carries upstream's finalizer, label and status. Ours takes over: the
/// job is not submitted again, the pod is neither replaced nor orphaned, its end is
/// reported, and the SpurJob ends `Completed`; a SpurJob upstream had already finished is
/// not touched at all.
#[test]
fn a_swap_from_upstreams_operator_adopts_its_running_job_and_pod_without_resubmitting() {
    let config = StackConfig {
        start_operator: false,
        ..StackConfig::default()
    };
    e2e(config, |mut stack| async move {
        let agent_addr =
            std::net::SocketAddr::new(stack.cluster.spare_ip(3).into(), pb::AGENT_PORT);
        let agent = upstream::serve(
            upstream::UpstreamAgent {
                api: stack.api.clone(),
            },
            agent_addr,
        )
        .await;
        let leader = stack
            .cluster
            .leader()
            .expect("a single replica leads at once");
        let mut controller = stack.replica(leader).await;
        controller
            .register_agent(upstream::registration("node-0", agent_addr))
            .await
            .expect("upstream registers node-0");
        let spec = json!({
            "name": "swap", "image": "busybox:1.36", "command": ["sh", "-c", "true"],
            "numNodes": 1, "tasksPerNode": 1, "cpusPerTask": 1,
            "env": {"SIM_RUN_SECONDS": "12"},
        });
        let job_id = controller
            .submit_job(pb::SubmitJobRequest {
                spec: Some(pb::JobSpec {
                    environment: [("SIM_RUN_SECONDS".to_owned(), "12".to_owned())].into(),
                    ..one_node_busybox("swap")
                }),
            })
            .await
            .expect("upstream submits the job")
            .into_inner()
            .job_id;
        upstream::create_spurjob(&stack.api, "swap", spec.clone(), job_id, "Pending");
        let finished = upstream::create_spurjob(
            &stack.api,
            "finished",
            json!({"name": "finished", "image": "busybox:1.36"}),
            job_id + 1000,
            "Completed",
        );
        let pod_name = upstream::pod_name(job_id, "node-0");
        let started = Instant::now();
        stack
            .until(
                "upstream's pod running",
                started,
                Duration::from_secs(30),
                |s| {
                    s.api
                        .get("v1", "Pod", Some(NAMESPACE), &pod_name)
                        .is_ok_and(|p| p["status"]["phase"] == "Running")
                },
            )
            .await;
        stack
            .api
            .merge_patch(
                SPURJOB.0,
                SPURJOB.1,
                Some(NAMESPACE),
                "swap",
                &json!({"status": {"state": "Running", "assignedNodes": ["node-0"], "pods": [pod_name]}}),
                true,
            )
            .expect("upstream mirrors Running");
        let running = stack
            .api
            .get("v1", "Pod", Some(NAMESPACE), &pod_name)
            .expect("the pod");
        let pod_uid = running["metadata"]["uid"].clone();

        // The swap: upstream's operator stops, ours starts while the pod still runs.
        agent.abort();
        stack.start_operator();
        let swapped = Instant::now();
        stack
            .until(
                "the adopted SpurJob completes",
                swapped,
                Duration::from_secs(60),
                |s| s.state("swap").is_some_and(|st| terminal(&st)),
            )
            .await;
        assert_eq!(
            stack.state("swap").as_deref(),
            Some("Completed"),
            "{}",
            stack.logs()
        );
        let pod = stack
            .api
            .get("v1", "Pod", Some(NAMESPACE), &pod_name)
            .expect("upstream's pod is still there");
        assert_eq!(
            pod["metadata"]["uid"], pod_uid,
            "the same pod, not a new one"
        );
        assert_eq!(pod["status"]["phase"], "Succeeded", "{pod}");
        assert_eq!(
            pod["metadata"]["annotations"]["spur.amd.com/reported"], "true",
            "its end was reported: {pod}"
        );
        let ours: Vec<Value> = stack
            .api
            .list("v1", "Pod")
            .unwrap_or_default()
            .into_iter()
            // Ours carry the SpurJob-UID label; upstream's never do (both write its
            // managed-by value).
            .filter(|p| !p["metadata"]["labels"]["spur.amd.com/spurjob-uid"].is_null())
            .collect();
        assert!(ours.is_empty(), "no second pod: {ours:?}");
        let jobs = stack.controller_jobs("swap").await;
        assert_eq!(jobs.len(), 1, "submitted once: {jobs:?}");
        assert_eq!(jobs[0].job_id, job_id);
        assert_eq!(jobs[0].state, pb::JobState::JobCompleted as i32, "{jobs:?}");
        let after = stack.spurjob("finished").expect("the finished SpurJob");
        assert_eq!(
            after["metadata"]["resourceVersion"], finished["metadata"]["resourceVersion"],
            "a SpurJob upstream finished is left alone: {after}"
        );
        eprintln!(
            "e2e swap: completed {:.1}s after our operator started",
            swapped.elapsed().as_secs_f64()
        );
        // The nodes are ours now: a new SpurJob runs through our agent.
        let created = Instant::now();
        stack.create_spurjob("after-swap", job_spec(json!({})));
        let (state, job) = run_to_end(&stack, "after-swap", 1, created).await;
        assert_eq!(state, "Completed", "{job}{}", stack.logs());
    });
}

/// The SpurJobs under `deploy/examples/upstream/`, as teams on upstream's operator write
/// them (single node, GPU, two-node torchrun, array, secretEnv with volumes), by name.
fn upstream_examples() -> Vec<(String, Value)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/examples/upstream");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).expect("read an example");
            let object: Value = serde_yaml_ng::from_str(&text)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let name = object["metadata"]["name"]
                .as_str()
                .expect("a name")
                .to_owned();
            (name, object)
        })
        .collect()
}

fn container(pod: &Value) -> &Value {
    &pod["spec"]["containers"][0]
}

/// Upstream's SpurJobs, unchanged, run to `Completed` on the real spurctld, each with the
/// pods its fields ask for.
#[test]
fn upstreams_example_spurjobs_run_unchanged() {
    let examples = upstream_examples();
    let names: Vec<&str> = examples.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        ["sweep", "finetune", "evaluate", "preprocess", "pretrain"],
        "one example of each kind"
    );
    e2e(StackConfig::default(), |stack| async move {
        let created = Instant::now();
        // Every field the examples use is one our CRD declares: a real API server would
        // prune an unknown one silently (the simulated one keeps it).
        let crd = serde_json::to_value(<spur_operator::SpurJob as kube::CustomResourceExt>::crd())
            .expect("the CRD");
        let declared = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
            ["properties"];
        for (name, object) in &examples {
            for field in object["spec"].as_object().expect("a spec").keys() {
                assert!(
                    declared.get(field).is_some(),
                    "{name}: spec.{field} is not in the CRD"
                );
            }
            stack
                .api
                .create(object.clone())
                .expect("create the example");
        }
        let pods_of = [
            ("sweep", 4),
            ("finetune", 1),
            ("evaluate", 1),
            ("preprocess", 1),
            ("pretrain", 2),
        ];
        for (name, pods) in pods_of {
            let (state, job) = run_to_end(&stack, name, pods, created).await;
            assert_eq!(state, "Completed", "{name}: {job}{}", stack.logs());
        }

        let preprocess = &stack.pods("preprocess")[0];
        assert_eq!(
            container(preprocess)["command"],
            json!(["python", "-c", "print('shards ready')"]),
            "args alone are the whole command"
        );
        assert_eq!(
            env_of(preprocess).get("SHARDS").map(String::as_str),
            Some("64")
        );

        let finetune = &stack.pods("finetune")[0];
        assert_eq!(
            container(finetune)["command"],
            json!(["python", "/workspace/finetune.py", "--epochs", "3"])
        );
        assert_eq!(
            container(finetune)["resources"]["limits"]["amd.com/gpu"],
            "2"
        );
        let shm = finetune["spec"]["volumes"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|v| v["emptyDir"]["medium"] == "Memory");
        assert_eq!(
            shm.map(|v| v["emptyDir"]["sizeLimit"].clone()),
            Some(json!("16Gi")),
            "{finetune}"
        );

        let pretrain = stack.pods("pretrain");
        let mut ranks: Vec<String> = pretrain
            .iter()
            .map(|pod| {
                let env = env_of(pod);
                for var in [
                    "MASTER_ADDR",
                    "MASTER_PORT",
                    "WORLD_SIZE",
                    "NODE_RANK",
                    "NPROC_PER_NODE",
                    "NCCL_SOCKET_IFNAME",
                    "GPU_ENABLE_PAL",
                ] {
                    assert!(env.contains_key(var), "{var} missing: {env:?}");
                }
                assert_eq!(env["WORLD_SIZE"], "2");
                assert_eq!(env["NPROC_PER_NODE"], "8");
                assert_eq!(container(pod)["resources"]["limits"]["amd.com/gpu"], "8");
                assert_eq!(pod["spec"]["hostIPC"], true);
                env["NODE_RANK"].clone()
            })
            .collect();
        ranks.sort();
        assert_eq!(ranks, ["0", "1"]);
        let masters: std::collections::BTreeSet<String> = pretrain
            .iter()
            .map(|pod| env_of(pod)["MASTER_ADDR"].clone())
            .collect();
        assert_eq!(masters.len(), 1, "one rendezvous address: {masters:?}");

        let mut tasks: Vec<String> = stack
            .pods("sweep")
            .iter()
            .map(|pod| {
                env_of(pod)
                    .get("SLURM_ARRAY_TASK_ID")
                    .cloned()
                    .unwrap_or_default()
            })
            .collect();
        tasks.sort();
        assert_eq!(tasks, ["0", "1", "2", "3"]);

        let evaluate = &stack.pods("evaluate")[0];
        let token = container(evaluate)["env"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|e| e["name"] == "HF_TOKEN")
            .cloned()
            .unwrap_or_default();
        assert_eq!(
            token["valueFrom"]["secretKeyRef"],
            json!({"name": "hf-creds", "key": "token", "optional": true}),
            "{evaluate}"
        );
        let volumes = evaluate["spec"]["volumes"].clone();
        let volumes = volumes.as_array().cloned().unwrap_or_default();
        assert!(
            volumes
                .iter()
                .any(|v| v["hostPath"]
                    == json!({"path": "/mnt/datasets", "type": "DirectoryOrCreate"})),
            "{volumes:?}"
        );
        assert!(
            volumes
                .iter()
                .any(|v| v["persistentVolumeClaim"]["claimName"] == "checkpoints"),
            "{volumes:?}"
        );
    });
}

/// What spur's CLI does with a running job reaches its pod: `spur exec` through spurctld
/// (ExecInJob, relayed to our agent) runs in the job's pod and returns its output and exit
/// code; `sattach --output-only` (StreamJobOutput at the first node's agent) follows the
/// pod's log until the job ends; `scontrol suspend` is accepted and the job still ends.
#[test]
fn spur_exec_and_output_streaming_reach_the_jobs_pod() {
    e2e(StackConfig::default(), |stack| async move {
        let created = Instant::now();
        stack.create_spurjob(
            "io",
            job_spec(json!({"env": {"SIM_RUN_SECONDS": "8", "SIM_STDOUT": "step 1/1 loss=0.25"}})),
        );
        stack
            .until("io: a running pod", created, Duration::from_secs(60), |s| {
                s.pods("io")
                    .iter()
                    .any(|p| p["status"]["phase"] == "Running")
            })
            .await;
        let id = id_of(&stack.spurjob("io").expect("the SpurJob"));
        let leader = stack.cluster.leader().unwrap_or(0);
        let mut controller = stack.replica(leader).await;
        let exec = |command: &[&str]| pb::ExecInJobRequest {
            job_id: id,
            command: command.iter().map(|w| (*w).to_owned()).collect(),
            user: "k8s".to_owned(),
        };
        let answer = controller
            .exec_in_job(exec(&["printenv", "SPUR_JOB_ID"]))
            .await
            .unwrap_or_else(|e| panic!("spur exec: {e}{}", stack.logs()))
            .into_inner();
        assert_eq!(
            (answer.success, answer.exit_code, answer.stdout.as_str()),
            (true, 0, format!("{id}\n").as_str()),
            "{answer:?}"
        );
        let answer = controller
            .exec_in_job(exec(&["sh", "-c", "exit 3"]))
            .await
            .expect("spur exec of a failing command")
            .into_inner();
        assert_eq!((answer.success, answer.exit_code), (false, 3), "{answer:?}");
        let answer = controller
            .exec_in_job(exec(&["nvidia-smi"]))
            .await
            .expect("spur exec of a missing command")
            .into_inner();
        assert_eq!(answer.exit_code, 127, "{answer:?}");
        assert!(answer.stderr.contains("nvidia-smi"), "{answer:?}");

        // scontrol suspend: spurctld marks the job and tells the agent, which accepts (a
        // pod cannot be paused); the job then ends as its pod does.
        controller
            .suspend_job(pb::SuspendJobRequest {
                job_id: id,
                user: "k8s".to_owned(),
            })
            .await
            .expect("scontrol suspend");
        assert_eq!(
            controller_state(&stack, "io", id).await,
            pb::JobState::JobSuspended
        );
        stack
            .until(
                "the agent told of the suspension",
                created,
                Duration::from_secs(30),
                |s| s.operator_log().contains("Kubernetes cannot pause a pod"),
            )
            .await;

        // sattach dials the first node's agent: ours, at the address it registered.
        let agent = format!("http://{}:{}", stack.cluster.spare_ip(0), pb::AGENT_PORT);
        let mut agent = pb::SlurmAgentClient::connect(agent)
            .await
            .expect("connect to the agent");
        let mut stream = agent
            .stream_job_output(pb::StreamJobOutputRequest {
                job_id: id,
                stream: "stdout".to_owned(),
                user: "k8s".to_owned(),
            })
            .await
            .expect("StreamJobOutput")
            .into_inner();
        let mut output = Vec::new();
        let mut eof = false;
        while let Some(chunk) = stream.message().await.expect("a chunk") {
            assert!(!eof, "nothing after eof");
            output.extend(chunk.data);
            eof = chunk.eof;
        }
        assert!(eof, "the stream ends with an eof chunk");
        assert_eq!(String::from_utf8_lossy(&output), "step 1/1 loss=0.25\n");
        // The log was followed to the container's end, so the job is over by now.
        let (state, job) = run_to_end(&stack, "io", 1, created).await;
        assert_eq!(state, "Completed", "{job}{}", stack.logs());
        let stderr = agent
            .stream_job_output(pb::StreamJobOutputRequest {
                job_id: id,
                stream: "stderr".to_owned(),
                user: "k8s".to_owned(),
            })
            .await
            .expect("StreamJobOutput of stderr")
            .into_inner()
            .message()
            .await
            .expect("a chunk");
        assert_eq!(
            stderr.map(|c| (c.data.is_empty(), c.eof)),
            Some((true, true))
        );
    });
}

/// spurctld's own view of `node`: its state and reason.
async fn node_state(stack: &Stack, node: &str) -> Option<(pb::NodeState, String)> {
    let slot = stack.cluster.leader().unwrap_or(0);
    let nodes = stack
        .replica(slot)
        .await
        .get_nodes(pb::GetNodesRequest::default())
        .await
        .ok()?
        .into_inner()
        .nodes;
    nodes
        .into_iter()
        .find(|n| n.name == node)
        .map(|n| (n.state(), n.state_reason))
}

/// `kubectl cordon` (with a reason annotated) drains the node in the real spurctld, so new
/// jobs go elsewhere; uncordoning makes it IDLE again; a configured node condition
/// (a node-problem-detector's `GPUProblem`) drains it by itself, naming the condition; a
/// drain an administrator set in spurctld is kept through a cordon and an uncordon.
#[test]
fn a_cordoned_or_gpu_problem_node_is_drained_in_spurctld_and_lifted_after() {
    let config = StackConfig {
        operator_flags: vec!["--drain-on-node-condition".into(), "GPUProblem".into()],
        ..StackConfig::default()
    };
    e2e(config, |stack| async move {
        // Conditions are the Node's status, a subresource of their own.
        let patch_node = |patch: Value| {
            stack
                .api
                .merge_patch(
                    "v1",
                    "Node",
                    None,
                    "node-1",
                    &patch,
                    patch.get("status").is_some(),
                )
                .expect("patch node-1");
        };
        let wait_for = |want: pb::NodeState, reason: &'static str| {
            let stack = &stack;
            async move {
                let since = Instant::now();
                loop {
                    let seen = node_state(stack, "node-1").await;
                    if seen
                        .as_ref()
                        .is_some_and(|(s, r)| *s == want && r.contains(reason))
                    {
                        return since.elapsed();
                    }
                    assert!(
                        since.elapsed() < Duration::from_secs(20),
                        "node-1: {want:?} with {reason:?} not within 20 s (saw {seen:?}){}",
                        stack.logs()
                    );
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        };
        wait_for(pb::NodeState::NodeIdle, "").await;

        patch_node(json!({
            "metadata": {"annotations": {"spur.amd.com/drain-reason": "RMA ticket 4411"}},
            "spec": {"unschedulable": true},
        }));
        let took = wait_for(
            pb::NodeState::NodeDrain,
            "Kubernetes: cordoned: RMA ticket 4411",
        )
        .await;
        eprintln!(
            "e2e cordon: node drained in spurctld {:.1}s after the cordon",
            took.as_secs_f64()
        );
        // Two one-node jobs at once: both run on node-0, none on the drained node.
        let created = Instant::now();
        for name in ["c1", "c2"] {
            stack.create_spurjob(name, job_spec(json!({"numNodes": 1})));
        }
        for name in ["c1", "c2"] {
            let (state, job) = run_to_end(&stack, name, 1, created).await;
            assert_eq!(state, "Completed", "{job}{}", stack.logs());
            assert_eq!(stack.pods(name)[0]["spec"]["nodeName"], "node-0", "{name}");
        }

        patch_node(json!({"spec": {"unschedulable": false}}));
        wait_for(pb::NodeState::NodeIdle, "").await;

        patch_node(json!({"status": {"conditions": [
            {"type": "Ready", "status": "True"},
            {"type": "GPUProblem", "status": "True", "message": "GPU 3: uncorrectable ECC errors"},
        ]}}));
        wait_for(
            pb::NodeState::NodeDrain,
            "Kubernetes: node condition GPUProblem: GPU 3: uncorrectable ECC errors",
        )
        .await;
        patch_node(json!({"status": {"conditions": [
            {"type": "Ready", "status": "True"},
            {"type": "GPUProblem", "status": "False", "message": "healthy"},
        ]}}));
        wait_for(pb::NodeState::NodeIdle, "").await;

        // An administrator's drain in spurctld is kept: neither a cordon (which would write
        // its own reason over it) nor the uncordon after it (IDLE) touches it.
        let slot = stack.cluster.leader().unwrap_or(0);
        stack
            .replica(slot)
            .await
            .update_node(pb::UpdateNodeRequest {
                name: "node-1".into(),
                state: Some(pb::NodeState::NodeDrain as i32),
                reason: Some("admin: RMA 77".into()),
                ..Default::default()
            })
            .await
            .expect("an administrator's drain");
        wait_for(pb::NodeState::NodeDrain, "admin: RMA 77").await;
        for unschedulable in [true, false] {
            patch_node(json!({"spec": {"unschedulable": unschedulable}}));
            // The operator answers a cordon within 0.2 s (above); give it far longer.
            tokio::time::sleep(Duration::from_secs(3)).await;
            assert_eq!(
                node_state(&stack, "node-1").await,
                Some((pb::NodeState::NodeDrain, "admin: RMA 77".to_owned())),
                "unschedulable: {unschedulable}{}",
                stack.logs()
            );
        }
    });
}
