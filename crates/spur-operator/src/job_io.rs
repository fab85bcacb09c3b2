//! A job's pod as spur's CLI reaches it through the agent: `spur exec` (ExecInJob, which
//! spurctld relays to the agent of the job's first node) and the job's output
//! (StreamJobOutput, which `sattach` and `srun` dial at the first node).
//!
//! Both act on the job's first pod: the rank-0 pod of its newest run, which runs on the
//! first node of the allocation, where spurd would answer. Upstream's operator looks for a
//! pod named `spur-job-<id>`, which its launches never create (they add the node name), so
//! its exec and output always fail; here the pod is found by its `spur.amd.com/job-id`
//! label, upstream's pods included (a swap keeps them reachable).

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status as ExitStatus;
use kube::api::{AttachParams, ListParams, LogParams};
use kube::{Api, ResourceExt};
use spur_proto as pb;
use tokio::io::{AsyncRead, AsyncReadExt};
use tonic::Status;

use crate::jobs::LABEL_JOB_ID;
use crate::jobs::pods::{ANNOTATION_RUN_ATTEMPT, CONTAINER};

/// Bounds on one exec (`--agent-exec-timeout`, `--agent-exec-output-limit`, where the
/// defaults' reasons are).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExecLimits {
    pub timeout: Duration,
    /// The most of each of stdout and stderr returned.
    pub output_bytes: usize,
}

impl Default for ExecLimits {
    /// The flags' defaults (a config test holds them equal).
    fn default() -> Self {
        ExecLimits {
            timeout: Duration::from_secs(60),
            output_bytes: 1 << 20,
        }
    }
}

/// Chunks of output in flight to one StreamJobOutput caller before reading the pod's log
/// waits for it: a slow reader holds the log stream, not memory.
const OUTPUT_CHUNKS_IN_FLIGHT: usize = 16;
/// The size of one output chunk.
const OUTPUT_CHUNK_BYTES: usize = 16 * 1024;

/// The node rank a pod runs (ours and upstream's set it in the container's environment).
fn rank(pod: &Pod) -> u32 {
    let env = pod
        .spec
        .as_ref()
        .and_then(|s| s.containers.iter().find(|c| c.name == CONTAINER))
        .and_then(|c| c.env.as_ref());
    env.into_iter()
        .flatten()
        .find(|e| e.name == "SPUR_NODE_RANK" || e.name == "NODE_RANK")
        .and_then(|e| e.value.as_deref()?.parse().ok())
        .unwrap_or(0)
}

fn run_attempt(pod: &Pod) -> u32 {
    pod.annotations()
        .get(ANNOTATION_RUN_ATTEMPT)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn running(pod: &Pod) -> bool {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

/// The job's first pod among `pods`: not being deleted; a running one before any other,
/// then the newest run attempt, then the lowest rank, then by name.
pub fn first_pod(pods: Vec<Pod>) -> Option<Pod> {
    pods.into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .min_by(|a, b| {
            running(b)
                .cmp(&running(a))
                .then_with(|| run_attempt(b).cmp(&run_attempt(a)))
                .then_with(|| rank(a).cmp(&rank(b)))
                .then_with(|| a.name_any().cmp(&b.name_any()))
        })
}

/// Finds job `job_id`'s first pod, in any namespace.
pub async fn find_first_pod(kube: &kube::Client, job_id: u32) -> Result<Pod, Status> {
    let selector = format!(
        "{LABEL_JOB_ID}={job_id},{}",
        crate::jobs::managed_selector()
    );
    let pods: Api<Pod> = Api::all(kube.clone());
    let listed = pods
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(|e| kube_error(&format!("listing job {job_id}'s pods"), e))?;
    first_pod(listed.items).ok_or_else(|| {
        Status::not_found(format!(
            "job {job_id} has no pod (not launched by this operator, or already cleaned up)"
        ))
    })
}

/// A Kubernetes API error as the agent answers it: the API's refusals keep their meaning
/// (400, a pod that is not running, is FAILED_PRECONDITION), the rest is UNAVAILABLE.
fn kube_error(what: &str, e: kube::Error) -> Status {
    match &e {
        kube::Error::Api(s) if s.code == 404 => Status::not_found(format!("{what}: {}", s.message)),
        kube::Error::Api(s) if s.code == 400 => {
            Status::failed_precondition(format!("{what}: {}", s.message))
        }
        kube::Error::Api(s) if s.code == 403 => Status::permission_denied(format!(
            "{what}: {} (does the operator's Role allow it?)",
            s.message
        )),
        _ => Status::unavailable(format!("{what}: Kubernetes API: {e}")),
    }
}

/// The command's exit code from the Status the API server ends an exec with: 0 on
/// Success; on NonZeroExitCode the code in its ExitCode cause; 1 for any other failure
/// (the command could not be run).
pub fn exit_code(status: Option<&ExitStatus>) -> i32 {
    let Some(status) = status else { return 1 };
    if status.status.as_deref() == Some("Success") {
        return 0;
    }
    status
        .details
        .as_ref()
        .and_then(|d| d.causes.as_ref())
        .into_iter()
        .flatten()
        .find(|c| c.reason.as_deref() == Some("ExitCode"))
        .and_then(|c| c.message.as_deref()?.trim().parse().ok())
        .unwrap_or(1)
}

/// Reads `reader` to its end, keeping at most `limit` bytes; says whether any was dropped.
async fn read_bounded(reader: Option<impl AsyncRead + Unpin>, limit: usize) -> (Vec<u8>, bool) {
    let Some(mut reader) = reader else {
        return (Vec::new(), false);
    };
    let mut kept = Vec::new();
    let _ = (&mut reader)
        .take(limit as u64)
        .read_to_end(&mut kept)
        .await;
    // The rest must still be read: the exec's status arrives after all its output.
    let dropped = tokio::io::copy(&mut reader, &mut tokio::io::sink())
        .await
        .unwrap_or(0);
    (kept, dropped > 0)
}

fn text(bytes: Vec<u8>, cut: bool, stream: &str, limit: usize) -> String {
    let mut text = String::from_utf8_lossy(&bytes).into_owned();
    if cut {
        text.push_str(&format!(
            "\n[spur-operator: {stream} cut at {limit} bytes]\n"
        ));
    }
    text
}

/// Runs `command` in `pod`'s job container and returns what it printed and its exit code.
pub async fn exec(
    kube: &kube::Client,
    pod: &Pod,
    command: Vec<String>,
    limits: ExecLimits,
) -> Result<pb::ExecInJobResponse, Status> {
    if command.is_empty() {
        return Err(Status::invalid_argument("ExecInJob: command is empty"));
    }
    let name = pod.name_any();
    let pods: Api<Pod> = Api::namespaced(kube.clone(), &pod.namespace().unwrap_or_default());
    let attach = AttachParams::default()
        .container(CONTAINER)
        .stdin(false)
        .stdout(true)
        .stderr(true)
        .max_stdout_buf_size(OUTPUT_CHUNK_BYTES)
        .max_stderr_buf_size(OUTPUT_CHUNK_BYTES);
    let run = async {
        let mut process = pods
            .exec(&name, command, &attach)
            .await
            .map_err(|e| kube_error(&format!("exec into pod {name}"), e))?;
        let status = process.take_status();
        let ((stdout, stdout_cut), (stderr, stderr_cut)) = tokio::join!(
            read_bounded(process.stdout(), limits.output_bytes),
            read_bounded(process.stderr(), limits.output_bytes),
        );
        let status = match status {
            Some(status) => status.await,
            None => None,
        };
        let exit_code = exit_code(status.as_ref());
        let _ = process.join().await;
        Ok::<_, Status>(pb::ExecInJobResponse {
            success: exit_code == 0,
            exit_code,
            stdout: text(stdout, stdout_cut, "stdout", limits.output_bytes),
            stderr: text(stderr, stderr_cut, "stderr", limits.output_bytes),
        })
    };
    match tokio::time::timeout(limits.timeout, run).await {
        Ok(answer) => answer,
        Err(_) => Err(Status::deadline_exceeded(format!(
            "exec into pod {name} did not end within {:?} (--agent-exec-timeout)",
            limits.timeout
        ))),
    }
}

/// The output of `pod`'s job container, followed until it ends, as StreamJobOutput chunks
/// ending with an `eof` chunk. Kubernetes keeps one log of a container's stdout and stderr
/// together: it is the `stdout` stream (and the default); `stderr` is empty, so a client
/// that follows both does not print everything twice.
pub async fn output(
    kube: &kube::Client,
    pod: &Pod,
    stream: &str,
) -> Result<tokio::sync::mpsc::Receiver<Result<pb::StreamJobOutputChunk, Status>>, Status> {
    let (tx, rx) = tokio::sync::mpsc::channel(OUTPUT_CHUNKS_IN_FLIGHT);
    let eof = pb::StreamJobOutputChunk {
        data: Vec::new(),
        eof: true,
    };
    match stream {
        "" | "stdout" => {}
        "stderr" => {
            let _ = tx.send(Ok(eof)).await;
            return Ok(rx);
        }
        other => {
            return Err(Status::invalid_argument(format!(
                "StreamJobOutput: stream {other:?} is neither \"stdout\" nor \"stderr\""
            )));
        }
    }
    let name = pod.name_any();
    let pods: Api<Pod> = Api::namespaced(kube.clone(), &pod.namespace().unwrap_or_default());
    let params = LogParams {
        container: Some(CONTAINER.to_owned()),
        follow: true,
        ..LogParams::default()
    };
    let log = pods
        .log_stream(&name, &params)
        .await
        .map_err(|e| kube_error(&format!("reading pod {name}'s log"), e))?;
    tokio::spawn(async move {
        use futures::AsyncReadExt as _;
        let mut log = Box::pin(log);
        let mut buf = vec![0u8; OUTPUT_CHUNK_BYTES];
        loop {
            match log.read(&mut buf).await {
                Ok(0) => break,
                Ok(n) => {
                    let chunk = pb::StreamJobOutputChunk {
                        data: buf[..n].to_vec(),
                        eof: false,
                    };
                    // The caller went away: stop reading the log.
                    if tx.send(Ok(chunk)).await.is_err() {
                        return;
                    }
                }
                Err(e) => {
                    let _ = tx
                        .send(Err(Status::unavailable(format!(
                            "reading pod {name}'s log: {e}"
                        ))))
                        .await;
                    return;
                }
            }
        }
        let _ = tx.send(Ok(eof)).await;
    });
    Ok(rx)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{Container, EnvVar, PodSpec, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{StatusCause, StatusDetails, Time};

    use super::*;

    fn pod(name: &str, phase: &str, rank: u32, attempt: u32) -> Pod {
        let mut pod = Pod {
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: CONTAINER.into(),
                    env: Some(vec![EnvVar {
                        name: "SPUR_NODE_RANK".into(),
                        value: Some(rank.to_string()),
                        ..Default::default()
                    }]),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            status: Some(PodStatus {
                phase: Some(phase.into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        pod.metadata.name = Some(name.into());
        pod.metadata.annotations =
            Some([(ANNOTATION_RUN_ATTEMPT.to_owned(), attempt.to_string())].into());
        pod
    }

    fn names(pods: Vec<Pod>) -> Option<String> {
        first_pod(pods).map(|p| p.name_any())
    }

    #[test]
    fn the_first_pod_is_the_running_rank_0_of_the_newest_run() {
        assert_eq!(names(vec![]), None);
        assert_eq!(
            names(vec![pod("r1", "Running", 1, 0), pod("r0", "Running", 0, 0)]),
            Some("r0".into())
        );
        // A rerun's pods before the last run's, a running pod before a finished one.
        assert_eq!(
            names(vec![
                pod("old", "Running", 0, 0),
                pod("new", "Running", 0, 1)
            ]),
            Some("new".into())
        );
        assert_eq!(
            names(vec![
                pod("done", "Succeeded", 0, 1),
                pod("live", "Running", 1, 0)
            ]),
            Some("live".into())
        );
        let mut going = pod("going", "Running", 0, 0);
        going.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        assert_eq!(
            names(vec![going, pod("rank1", "Pending", 1, 0)]),
            Some("rank1".into())
        );
    }

    #[test]
    fn the_exit_code_comes_from_the_status_the_exec_ends_with() {
        let failure = |causes: Option<Vec<StatusCause>>| ExitStatus {
            status: Some("Failure".into()),
            reason: Some("NonZeroExitCode".into()),
            details: Some(StatusDetails {
                causes,
                ..Default::default()
            }),
            ..Default::default()
        };
        let cause = |reason: &str, message: &str| StatusCause {
            reason: Some(reason.into()),
            message: Some(message.into()),
            ..Default::default()
        };
        let success = ExitStatus {
            status: Some("Success".into()),
            ..Default::default()
        };
        assert_eq!(exit_code(Some(&success)), 0);
        assert_eq!(
            exit_code(Some(&failure(Some(vec![cause("ExitCode", "3")])))),
            3
        );
        assert_eq!(
            exit_code(Some(&failure(Some(vec![cause("ExitCode", "x")])))),
            1
        );
        assert_eq!(
            exit_code(Some(&failure(Some(vec![cause("Other", "3")])))),
            1
        );
        assert_eq!(exit_code(Some(&failure(None))), 1);
        assert_eq!(exit_code(None), 1);
    }
}
