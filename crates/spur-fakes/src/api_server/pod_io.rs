//! A pod's log (`pods/log`) and exec (`pods/exec`) subresources, for the simulated pods.
//!
//! A simulated container runs nothing, so what it prints is decided by its spec, which
//! keeps both answers a function of the pod object (deterministic, no side store):
//! - its log, once it started, is its `SIM_STDOUT` variable and a newline; with
//!   `follow=true` the answer stays open until the container ends or the pod goes;
//! - an exec runs in a tiny shell: `echo WORDS` prints them, `printenv NAME` prints the
//!   container's variable (exit 1 if unset), `sh -c 'exit N'` exits N, `true`/`false`;
//!   anything else is "command not found", exit 127. It answers over a WebSocket in
//!   Kubernetes' channel protocol (v5, else v4), as a real API server relays the kubelet.
//!
//! The refusals are a real API server's: 404 for a missing pod, 400 for an unknown
//! container, for a container that has not started, and for exec into a finished pod.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use http::{HeaderMap, HeaderValue, StatusCode, header};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;

use super::error::{ApiError, ApiResult};
use super::server::Shared;

/// How often a followed log looks for the container's end.
const FOLLOW_POLL: Duration = Duration::from_millis(100);
/// The exec subprotocols served, preferred first (kube-client offers both).
const PROTOCOLS: [&str; 2] = ["v5.channel.k8s.io", "v4.channel.k8s.io"];

/// `(namespace, pod, subresource)` when `segments` name a pod's log or exec.
pub(crate) fn pod_subresource<'a>(segments: &[&'a str]) -> Option<(&'a str, &'a str, &'a str)> {
    match segments {
        [
            "api",
            "v1",
            "namespaces",
            ns,
            "pods",
            name,
            sub @ ("log" | "exec"),
        ] => Some((ns, name, sub)),
        _ => None,
    }
}

fn pod(shared: &Shared, namespace: &str, name: &str) -> ApiResult<Arc<Value>> {
    let store = shared.store.lock().expect("store lock");
    let rt = store
        .type_for("v1", "Pod")
        .ok_or_else(|| ApiError::unknown_path("pods"))?;
    store.get(&rt, Some(namespace), name)
}

/// The container `requested` names (or the only one), with its status.
fn container<'a>(
    pod: &'a Value,
    requested: Option<&str>,
) -> ApiResult<(&'a Value, Option<&'a Value>)> {
    let name = pod["metadata"]["name"].as_str().unwrap_or_default();
    let containers = pod["spec"]["containers"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    let found = match requested {
        Some(wanted) => containers
            .iter()
            .find(|c| c["name"] == wanted)
            .ok_or_else(|| {
                ApiError::bad_request(format!("container {wanted} is not valid for pod {name}"))
            })?,
        None if containers.len() == 1 => &containers[0],
        None => {
            return Err(ApiError::bad_request(format!(
                "a container name must be specified for pod {name}"
            )));
        }
    };
    let status = pod["status"]["containerStatuses"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|s| s["name"] == found["name"]);
    Ok((found, status))
}

fn env_value<'a>(container: &'a Value, name: &str) -> Option<&'a str> {
    container["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)?["value"]
        .as_str()
}

fn started(status: Option<&Value>) -> bool {
    status.is_some_and(|s| {
        s["state"].get("running").is_some() || s["state"].get("terminated").is_some()
    })
}

fn finished(pod: &Value) -> bool {
    matches!(
        pod["status"]["phase"].as_str(),
        Some("Succeeded" | "Failed")
    )
}

/// The log of a started container.
fn log_text(container: &Value) -> String {
    env_value(container, "SIM_STDOUT")
        .map(|out| format!("{out}\n"))
        .unwrap_or_default()
}

/// `GET .../pods/NAME/log[?container=C&follow=true]`.
pub(crate) fn log_response(
    shared: Arc<Shared>,
    namespace: &str,
    name: &str,
    container_param: Option<&str>,
    follow: bool,
) -> ApiResult<Response> {
    let object = pod(&shared, namespace, name)?;
    let (spec, status) = container(&object, container_param)?;
    let container_name = spec["name"].as_str().unwrap_or_default().to_owned();
    if !started(status) {
        return Err(ApiError::bad_request(format!(
            "container \"{container_name}\" in pod \"{name}\" is waiting to start: ContainerCreating"
        )));
    }
    let text = log_text(spec);
    let plain = [(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"))];
    if !follow || finished(&object) {
        return Ok((plain, text).into_response());
    }
    // Followed: the text now, then the end of the answer once the container ended.
    let (namespace, name) = (namespace.to_owned(), name.to_owned());
    let ended = async move {
        loop {
            tokio::time::sleep(FOLLOW_POLL).await;
            match pod(&shared, &namespace, &name) {
                Ok(object) if !finished(&object) => continue,
                _ => return,
            }
        }
    };
    let body = futures::stream::once(async move { Ok::<_, std::io::Error>(Bytes::from(text)) })
        .chain(futures::stream::once(ended).filter_map(|()| async { None }));
    Ok((plain, Body::from_stream(body)).into_response())
}

/// What a command run in a simulated container prints and how it exits.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExecOutcome {
    pub stdout: String,
    pub stderr: String,
    pub exit_code: i32,
}

/// Runs `argv` in the tiny shell of a simulated container whose spec is `container`.
pub fn run(argv: &[String], container: &Value) -> ExecOutcome {
    let words: Vec<&str> = argv.iter().map(String::as_str).collect();
    let ok = |stdout: String| ExecOutcome {
        stdout,
        ..ExecOutcome::default()
    };
    match words.as_slice() {
        ["echo", rest @ ..] => ok(format!("{}\n", rest.join(" "))),
        ["true"] => ok(String::new()),
        ["false"] => ExecOutcome {
            exit_code: 1,
            ..ExecOutcome::default()
        },
        ["printenv", name] => match env_value(container, name) {
            Some(value) => ok(format!("{value}\n")),
            None => ExecOutcome {
                exit_code: 1,
                ..ExecOutcome::default()
            },
        },
        ["sh", "-c", script] if script.trim().starts_with("exit ") => {
            match script.trim()["exit ".len()..].trim().parse::<i32>() {
                Ok(code) => ExecOutcome {
                    exit_code: code & 0xff,
                    ..ExecOutcome::default()
                },
                Err(_) => ExecOutcome {
                    stderr: format!("sh: exit: {script}: numeric argument required\n"),
                    exit_code: 2,
                    ..ExecOutcome::default()
                },
            }
        }
        [program, ..] => ExecOutcome {
            stderr: format!("sh: {program}: command not found\n"),
            exit_code: 127,
            ..ExecOutcome::default()
        },
        [] => ExecOutcome {
            stderr: "you must specify at least one command for the container\n".to_owned(),
            exit_code: 1,
            ..ExecOutcome::default()
        },
    }
}

/// The `Status` a real API server sends on the exec's error channel.
fn exit_status(outcome: &ExecOutcome, argv: &[String]) -> Value {
    if outcome.exit_code == 0 {
        return json!({"metadata": {}, "status": "Success"});
    }
    json!({
        "metadata": {},
        "status": "Failure",
        "message": format!(
            "command terminated with non-zero exit code: error executing command {argv:?}, exit code {}",
            outcome.exit_code
        ),
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": outcome.exit_code.to_string()}]},
    })
}

/// `GET|POST .../pods/NAME/exec?command=..&container=..&stdout=true&stderr=true`, upgraded
/// to a WebSocket.
pub(crate) fn exec_response(
    shared: Arc<Shared>,
    namespace: &str,
    name: &str,
    mut req: Request,
) -> ApiResult<Response> {
    let query = ExecQuery::of(req.uri());
    let object = pod(&shared, namespace, name)?;
    let (spec, status) = container(&object, query.container.as_deref())?;
    check_exec(&object, spec, status, &query.argv)?;
    let (key, protocol) = websocket_upgrade(req.headers())?;
    let outcome = run(&query.argv, spec);
    let frames = exec_frames(&outcome, &exit_status(&outcome, &query.argv), &query);
    let upgraded = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        let Ok(upgraded) = upgraded.await else {
            return;
        };
        let mut socket =
            WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None).await;
        for message in frames {
            if socket.send(message).await.is_err() {
                return;
            }
        }
        let _ = socket.close(None).await;
        // Drain what the client still sends (its stdin close, its close reply).
        while let Some(Ok(_)) = socket.next().await {}
    });
    let accept = derive_accept_key(key.as_bytes());
    Ok(Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(header::CONNECTION, "Upgrade")
        .header(header::UPGRADE, "websocket")
        .header(header::SEC_WEBSOCKET_ACCEPT, accept)
        .header(header::SEC_WEBSOCKET_PROTOCOL, protocol)
        .body(Body::empty())
        .expect("a valid upgrade answer"))
}

/// An exec's query: the command (`command` repeats, one word each), the container, and
/// which output streams the client wants.
struct ExecQuery {
    argv: Vec<String>,
    container: Option<String>,
    stdout: bool,
    stderr: bool,
}

impl ExecQuery {
    fn of(uri: &http::Uri) -> Self {
        let pairs: Vec<(String, String)> = uri
            .query()
            .map(|q| {
                form_urlencoded::parse(q.as_bytes())
                    .map(|(k, v)| (k.into_owned(), v.into_owned()))
                    .collect()
            })
            .unwrap_or_default();
        let argv: Vec<String> = pairs
            .iter()
            .filter(|(k, _)| k == "command")
            .map(|(_, v)| v.clone())
            .collect();
        let container = pairs
            .iter()
            .find(|(k, _)| k == "container")
            .map(|(_, v)| v.clone());
        let wants = |key: &str| {
            pairs
                .iter()
                .any(|(k, v)| k == key && matches!(v.as_str(), "true" | "1"))
        };
        Self {
            argv,
            container,
            stdout: wants("stdout"),
            stderr: wants("stderr"),
        }
    }
}

/// A real API server's refusals of an exec: into a finished pod, into a container not
/// started yet, or with no command.
fn check_exec(
    object: &Value,
    spec: &Value,
    status: Option<&Value>,
    argv: &[String],
) -> ApiResult<()> {
    if finished(object) {
        return Err(ApiError::bad_request(format!(
            "cannot exec into a container in a completed pod; current phase is {}",
            object["status"]["phase"].as_str().unwrap_or_default()
        )));
    }
    if !started(status) {
        return Err(ApiError::bad_request(format!(
            "unable to upgrade connection: container not found (\"{}\")",
            spec["name"].as_str().unwrap_or_default()
        )));
    }
    if argv.is_empty() {
        return Err(ApiError::bad_request(
            "you must specify at least one command for the container",
        ));
    }
    Ok(())
}

/// The WebSocket key and the channel subprotocol chosen, when the request is a WebSocket
/// upgrade offering one we serve; 400 otherwise.
fn websocket_upgrade(headers: &HeaderMap) -> ApiResult<(HeaderValue, &'static str)> {
    let upgrade = headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    let key = headers.get(header::SEC_WEBSOCKET_KEY).cloned();
    let offered: Vec<String> = headers
        .get(header::SEC_WEBSOCKET_PROTOCOL)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.split(',').map(|p| p.trim().to_owned()).collect())
        .unwrap_or_default();
    let protocol = PROTOCOLS
        .into_iter()
        .find(|p| offered.iter().any(|o| o == p));
    let (Some(key), true, Some(protocol)) = (key, upgrade, protocol) else {
        return Err(ApiError::bad_request(
            "exec needs a WebSocket upgrade offering v5.channel.k8s.io or v4.channel.k8s.io",
        ));
    };
    Ok((key, protocol))
}

/// The exec's answer in the channel protocol: stdout on channel 1 and stderr on 2 when
/// wanted and not empty, then the exit `status` on the error channel, 3.
fn exec_frames(outcome: &ExecOutcome, status: &Value, query: &ExecQuery) -> Vec<Message> {
    let frame = |channel: u8, data: &[u8]| {
        let mut bytes = Vec::with_capacity(data.len() + 1);
        bytes.push(channel);
        bytes.extend_from_slice(data);
        Message::binary(bytes)
    };
    let mut frames = Vec::new();
    if query.stdout && !outcome.stdout.is_empty() {
        frames.push(frame(1, outcome.stdout.as_bytes()));
    }
    if query.stderr && !outcome.stderr.is_empty() {
        frames.push(frame(2, outcome.stderr.as_bytes()));
    }
    frames.push(frame(3, status.to_string().as_bytes()));
    frames
}

#[cfg(test)]
mod tests {
    use super::*;

    fn container() -> Value {
        json!({"name": "spur-job", "env": [{"name": "SPUR_JOB_ID", "value": "7"}]})
    }

    fn argv(words: &[&str]) -> Vec<String> {
        words.iter().map(|w| (*w).to_owned()).collect()
    }

    #[test]
    fn the_tiny_shell() {
        let c = container();
        assert_eq!(run(&argv(&["echo", "a", "b"]), &c).stdout, "a b\n");
        assert_eq!(run(&argv(&["printenv", "SPUR_JOB_ID"]), &c).stdout, "7\n");
        assert_eq!(run(&argv(&["printenv", "NOPE"]), &c).exit_code, 1);
        assert_eq!(run(&argv(&["sh", "-c", "exit 3"]), &c).exit_code, 3);
        assert_eq!(run(&argv(&["sh", "-c", "exit x"]), &c).exit_code, 2);
        assert_eq!(run(&argv(&["false"]), &c).exit_code, 1);
        let missing = run(&argv(&["nvidia-smi"]), &c);
        assert_eq!(missing.exit_code, 127);
        assert!(missing.stderr.contains("nvidia-smi"), "{missing:?}");
    }

    #[test]
    fn a_failed_command_carries_its_exit_code_as_a_real_server_does() {
        let failed = exit_status(
            &ExecOutcome {
                exit_code: 3,
                ..ExecOutcome::default()
            },
            &argv(&["x"]),
        );
        assert_eq!(failed["reason"], "NonZeroExitCode");
        assert_eq!(
            failed["details"]["causes"][0],
            json!({"reason": "ExitCode", "message": "3"})
        );
        let ok = exit_status(&ExecOutcome::default(), &argv(&["x"]));
        assert_eq!(ok["status"], "Success");
    }
}
