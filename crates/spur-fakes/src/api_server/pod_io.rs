//! A pod's log (`pods/log`) and exec (`pods/exec`) subresources: the checks and protocols
//! of a real API server, in front of the server's [`super::pod_backend::PodBackend`].
//!
//! - a log, once its container started, is the backend's bytes: whole when complete (not
//!   followed, or the pod ended), streamed while `follow=true`;
//! - an exec answers over a WebSocket in Kubernetes' channel protocol (v5, else v4), as a
//!   real API server relays the kubelet: stdin on channel 0, stdout on 1, stderr on 2, and
//!   the exit `Status` on 3, which carries a non-zero code as `kubectl exec` reads it.
//!
//! The simulated pods' answers come from their spec (see [`run`]): a log is the
//! container's `SIM_STDOUT` variable and a newline; an exec runs in a tiny shell: `echo
//! WORDS` prints them, `printenv NAME` prints the container's variable (exit 1 if unset),
//! `sh -c 'exit N'` exits N, `true`/`false`; anything else is "command not found", exit 127.
//!
//! The refusals are a real API server's: 404 for a missing pod, 400 for an unknown
//! container, for a container that has not started, and for exec into a finished pod.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use http::{HeaderMap, HeaderValue, StatusCode, header};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role};

use super::error::{ApiError, ApiResult};
use super::pod_backend::{
    ExecExit, ExecRequest, ExecSession, InputStream, LogRequest, OutputStream, PodTarget,
};
use super::server::Shared;

/// The exec subprotocols served, preferred first (kube-client offers both).
const PROTOCOLS: [&str; 2] = ["v5.channel.k8s.io", "v4.channel.k8s.io"];
/// The most bytes of a command's output one message carries (a real kubelet's buffer).
const RELAY_CHUNK: usize = 32 * 1024;

/// `(namespace, pod, subresource)` when `segments` name a pod's log, exec or portforward.
pub(crate) fn pod_subresource<'a>(segments: &[&'a str]) -> Option<(&'a str, &'a str, &'a str)> {
    match segments {
        [
            "api",
            "v1",
            "namespaces",
            ns,
            "pods",
            name,
            sub @ ("log" | "exec" | "portforward"),
        ] => Some((ns, name, sub)),
        _ => None,
    }
}

pub(crate) fn pod(shared: &Shared, namespace: &str, name: &str) -> ApiResult<Arc<Value>> {
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

pub(crate) fn finished(pod: &Value) -> bool {
    matches!(
        pod["status"]["phase"].as_str(),
        Some("Succeeded" | "Failed")
    )
}

/// The log of a started container.
pub(crate) fn log_text(container: &Value) -> String {
    env_value(container, "SIM_STDOUT")
        .map(|out| format!("{out}\n"))
        .unwrap_or_default()
}

/// `GET .../pods/NAME/log[?container=C&follow=true&tailLines=N&previous=true]`: the
/// backend's bytes, whole when the log is complete (not followed, or the pod ended),
/// streamed while followed.
pub(crate) async fn log_response(
    shared: Arc<Shared>,
    namespace: &str,
    name: &str,
    container_param: Option<&str>,
    request: LogRequest,
) -> ApiResult<Response> {
    let object = pod(&shared, namespace, name)?;
    let (spec, status) = container(&object, container_param)?;
    let container_name = spec["name"].as_str().unwrap_or_default().to_owned();
    if !started(status) {
        return Err(ApiError::bad_request(format!(
            "container \"{container_name}\" in pod \"{name}\" is waiting to start: ContainerCreating"
        )));
    }
    let complete = !request.follow || finished(&object);
    let target = PodTarget::new(shared.clone(), object, container_name);
    let stream = shared.pod_backend().log(target, request).await?;
    let plain = [(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"))];
    if complete {
        let chunks: Vec<Bytes> = stream
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect::<std::io::Result<_>>()
            .map_err(|e| ApiError::internal(format!("reading the log of {name}: {e}")))?;
        return Ok((plain, chunks.concat()).into_response());
    }
    Ok((plain, Body::from_stream(stream)).into_response())
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
fn exit_status(exit: &ExecExit, argv: &[String]) -> Value {
    let code = match exit {
        ExecExit::Code(0) => return json!({"metadata": {}, "status": "Success"}),
        ExecExit::Code(code) => *code,
        ExecExit::Failed(message) => {
            return json!({"metadata": {}, "status": "Failure", "message": message,
                "reason": "InternalError"});
        }
    };
    json!({
        "metadata": {},
        "status": "Failure",
        "message": format!(
            "command terminated with non-zero exit code: error executing command {argv:?}, exit code {code}"
        ),
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]},
    })
}

/// `GET|POST .../pods/NAME/exec?command=..&container=..&stdin=..&stdout=..&stderr=..`,
/// upgraded to a WebSocket: the backend's command, relayed in the channel protocol.
pub(crate) async fn exec_response(
    shared: Arc<Shared>,
    namespace: &str,
    name: &str,
    mut req: Request,
) -> ApiResult<Response> {
    let query = ExecQuery::of(req.uri());
    let object = pod(&shared, namespace, name)?;
    let (spec, status) = container(&object, query.container.as_deref())?;
    check_exec(&object, spec, status, &query.request.command)?;
    let (key, protocol) = websocket_upgrade(req.headers(), &PROTOCOLS)?;
    let container_name = spec["name"].as_str().unwrap_or_default().to_owned();
    let target = PodTarget::new(shared.clone(), object, container_name);
    let argv = query.request.command.clone();
    let session = shared.pod_backend().exec(target, query.request).await?;
    let upgraded = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        let Ok(upgraded) = upgraded.await else {
            return;
        };
        let socket =
            WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None).await;
        relay_exec(socket, session, &argv).await;
    });
    Ok(switching_protocols(&key, protocol))
}

/// The `101 Switching Protocols` answer accepting WebSocket `key` with `protocol`.
pub(crate) fn switching_protocols(key: &HeaderValue, protocol: &str) -> Response {
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(header::CONNECTION, "Upgrade")
        .header(header::UPGRADE, "websocket")
        .header(
            header::SEC_WEBSOCKET_ACCEPT,
            derive_accept_key(key.as_bytes()),
        )
        .header(header::SEC_WEBSOCKET_PROTOCOL, protocol)
        .body(Body::empty())
        .expect("a valid upgrade answer")
}

/// One read of an optional output; never ready once it is gone.
async fn read_some(output: &mut Option<OutputStream>, buf: &mut [u8]) -> std::io::Result<usize> {
    match output {
        Some(reader) => reader.read(buf).await,
        None => std::future::pending().await,
    }
}

/// Relays a command's session: stdout on channel 1 and stderr on 2 as they come (stdout
/// first when both are ready, so a simulated answer's frames keep their order), the
/// client's channel 0 to stdin (v5's close of channel 0 closes it), then the exit status on
/// the error channel, 3, once both outputs ended.
async fn relay_exec<S>(mut socket: WebSocketStream<S>, mut session: ExecSession, argv: &[String])
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let (mut out_buf, mut err_buf) = (vec![0u8; RELAY_CHUNK], vec![0u8; RELAY_CHUNK]);
    let mut client_open = true;
    while session.stdout.is_some() || session.stderr.is_some() {
        tokio::select! {
            biased;
            read = read_some(&mut session.stdout, &mut out_buf) => match read {
                Ok(n) if n > 0 => {
                    if socket.send(channel_frame(1, &out_buf[..n])).await.is_err() { return; }
                }
                _ => session.stdout = None,
            },
            read = read_some(&mut session.stderr, &mut err_buf) => match read {
                Ok(n) if n > 0 => {
                    if socket.send(channel_frame(2, &err_buf[..n])).await.is_err() { return; }
                }
                _ => session.stderr = None,
            },
            message = socket.next(), if client_open => match message {
                Some(Ok(message)) => client_input(&mut session.stdin, message).await,
                // The client went away: nobody reads the answer.
                _ => client_open = false,
            },
        }
    }
    let exit = session.exit.await;
    let status = exit_status(&exit, argv).to_string();
    if socket
        .send(channel_frame(3, status.as_bytes()))
        .await
        .is_ok()
    {
        // A normal closure: kubectl reads it as the streams' end, where a close frame
        // without a code (1005) is an error it prints.
        let normal = CloseFrame {
            code: CloseCode::Normal,
            reason: "".into(),
        };
        let _ = socket.close(Some(normal)).await;
        // Drain what the client still sends (its stdin close, its close reply).
        while let Some(Ok(_)) = socket.next().await {}
    }
}

/// A client's message during an exec: stdin bytes (channel 0) written to the command, or
/// v5's close of a channel (255, then the channel), which for 0 closes the command's stdin.
/// Terminal resizes (channel 4) are ignored: no exec here has a terminal.
async fn client_input(stdin: &mut Option<InputStream>, message: Message) {
    let Message::Binary(data) = message else {
        return;
    };
    match data.split_first() {
        Some((0, bytes)) => {
            if let Some(writer) = stdin
                && (writer.write_all(bytes).await.is_err() || writer.flush().await.is_err())
            {
                *stdin = None;
            }
        }
        Some((255, [0])) => {
            if let Some(mut writer) = stdin.take() {
                let _ = writer.shutdown().await;
            }
        }
        _ => {}
    }
}

/// An exec's query: the command (`command` repeats, one word each), the container, and
/// which streams the client attached.
struct ExecQuery {
    request: ExecRequest,
    container: Option<String>,
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
        let command: Vec<String> = pairs
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
            request: ExecRequest {
                command,
                stdin: wants("stdin"),
                stdout: wants("stdout"),
                stderr: wants("stderr"),
                tty: wants("tty"),
            },
            container,
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

/// The WebSocket key and the subprotocol chosen (the first of `served` the client offers),
/// when the request is a WebSocket upgrade offering one; 400 otherwise.
pub(crate) fn websocket_upgrade(
    headers: &HeaderMap,
    served: &[&'static str],
) -> ApiResult<(HeaderValue, &'static str)> {
    let upgrade = headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    let key = headers.get(header::SEC_WEBSOCKET_KEY).cloned();
    let offered: Vec<String> = headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(',').map(|p| p.trim().to_owned()))
        .collect();
    let protocol = served
        .iter()
        .copied()
        .find(|p| offered.iter().any(|o| o == p));
    let (Some(key), true, Some(protocol)) = (key, upgrade, protocol) else {
        return Err(ApiError::bad_request(format!(
            "this subresource needs a WebSocket upgrade offering one of {}",
            served.join(", ")
        )));
    };
    Ok((key, protocol))
}

/// One message of the channel protocol: the channel's byte, then the data.
pub(crate) fn channel_frame(channel: u8, data: &[u8]) -> Message {
    let mut bytes = Vec::with_capacity(data.len() + 1);
    bytes.push(channel);
    bytes.extend_from_slice(data);
    Message::binary(bytes)
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
        let failed = exit_status(&ExecExit::Code(3), &argv(&["x"]));
        assert_eq!(failed["reason"], "NonZeroExitCode");
        assert_eq!(
            failed["details"]["causes"][0],
            json!({"reason": "ExitCode", "message": "3"})
        );
        let ok = exit_status(&ExecExit::Code(0), &argv(&["x"]));
        assert_eq!(ok["status"], "Success");
    }
}
