//! What stands behind a pod's `log`, `exec`, `portforward` and `proxy`: a [`PodBackend`]
//! the server holds, as a real API server has its kubelets behind it.
//!
//! The server checks what a real API server checks (the pod, its container, its phase,
//! RBAC) and speaks the protocols (chunked logs, the WebSocket channel protocol, SPDY over
//! WebSocket for port-forward, HTTP for proxy); the backend only answers for the pod:
//! bytes of a log, a running command, a connection to a port. The default is
//! [`SimulatedPods`], whose pods run nothing: their answers are decided by their spec, so
//! the simulation stays a function of its seed. `spur-sim cluster` sets a backend whose
//! pods are processes ([`super::ApiServer::set_pod_backend`]).

use std::io;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt as _;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite};

use super::error::{ApiError, ApiResult};
use super::pod_io;
use super::server::Shared;

/// How often the simulated backend's followed log looks for the container's end.
const FOLLOW_POLL: Duration = Duration::from_millis(100);

/// A byte stream both ways to a port of a pod.
pub trait PodConnection: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> PodConnection for T {}

/// A connection to a pod's port.
pub type BoxedConnection = Box<dyn PodConnection>;
/// A log's bytes as they come.
pub type LogStream = BoxStream<'static, io::Result<Bytes>>;
/// A command's stdout or stderr.
pub type OutputStream = Box<dyn AsyncRead + Send + Unpin>;
/// A command's stdin.
pub type InputStream = Box<dyn AsyncWrite + Send + Unpin>;

/// The pod (and, for log and exec, the container) a request is for, checked by the server.
#[derive(Clone)]
pub struct PodTarget {
    /// The pod as it was when the request came.
    pub pod: Arc<Value>,
    /// The container's name; empty for a port-forward or proxy, which are the pod's.
    pub container: String,
    shared: Arc<Shared>,
}

impl PodTarget {
    pub(crate) fn new(shared: Arc<Shared>, pod: Arc<Value>, container: String) -> Self {
        Self {
            pod,
            container,
            shared,
        }
    }

    fn meta(&self, key: &str) -> &str {
        self.pod["metadata"][key].as_str().unwrap_or_default()
    }

    pub fn namespace(&self) -> &str {
        self.meta("namespace")
    }

    pub fn name(&self) -> &str {
        self.meta("name")
    }

    pub fn uid(&self) -> &str {
        self.meta("uid")
    }

    /// The container's spec in the pod.
    pub fn container_spec(&self) -> Option<&Value> {
        self.pod["spec"]["containers"]
            .as_array()?
            .iter()
            .find(|c| c["name"] == self.container.as_str())
    }

    /// The pod as the store holds it now; `None` once it is gone (or replaced under its
    /// name by another pod), which ends a followed log.
    pub fn current(&self) -> Option<Arc<Value>> {
        let object = pod_io::pod(&self.shared, self.namespace(), self.name()).ok()?;
        (object["metadata"]["uid"] == self.pod["metadata"]["uid"]).then_some(object)
    }
}

/// A log request's options (`GET .../pods/NAME/log?...`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogRequest {
    /// Keep the answer open and send what the container prints until it ends.
    pub follow: bool,
    /// Only the last lines (`tailLines`).
    pub tail_lines: Option<usize>,
    /// The previous run's log (`previous`).
    pub previous: bool,
    /// Each line prefixed with its RFC 3339 time (`timestamps`).
    pub timestamps: bool,
}

/// An exec request: the command and which streams the client attached.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExecRequest {
    pub command: Vec<String>,
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
}

/// How a command ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExecExit {
    /// It ran and exited with this code.
    Code(i32),
    /// It could not be run or waited for; the message is the error channel's.
    Failed(String),
}

/// A started command: its streams (those the request asked for) and its end. The server
/// relays the outputs until both end, then waits for `exit`; dropping the session (the
/// client went away) may end the command.
pub struct ExecSession {
    pub stdin: Option<InputStream>,
    pub stdout: Option<OutputStream>,
    pub stderr: Option<OutputStream>,
    pub exit: BoxFuture<'static, ExecExit>,
}

/// What answers for a pod's containers and ports.
pub trait PodBackend: Send + Sync + 'static {
    /// The log of `target`'s started container.
    fn log(&self, target: PodTarget, request: LogRequest) -> BoxFuture<'static, ApiResult<LogStream>>;
    /// Runs a command in `target`'s running container.
    fn exec(
        &self,
        target: PodTarget,
        request: ExecRequest,
    ) -> BoxFuture<'static, ApiResult<ExecSession>>;
    /// A connection to `port` as seen from inside the pod (`localhost:port`), as a
    /// kubelet's port-forward opens it.
    fn port_forward(
        &self,
        target: PodTarget,
        port: u16,
    ) -> BoxFuture<'static, ApiResult<BoxedConnection>>;
    /// A connection to the pod's address and `port`, as the API server's proxy dials it.
    fn dial(&self, target: PodTarget, port: u16) -> BoxFuture<'static, ApiResult<BoxedConnection>>;
}

/// The simulation's pods: a log is the container's `SIM_STDOUT` and a newline, an exec runs
/// in [`pod_io::run`]'s tiny shell, and no pod has a port to connect to.
#[derive(Clone, Copy, Debug, Default)]
pub struct SimulatedPods;

impl PodBackend for SimulatedPods {
    fn log(&self, target: PodTarget, request: LogRequest) -> BoxFuture<'static, ApiResult<LogStream>> {
        let text = target
            .container_spec()
            .map(pod_io::log_text)
            .unwrap_or_default();
        let now = futures::stream::once(async move { Ok(Bytes::from(text)) });
        if !request.follow || pod_io::finished(&target.pod) {
            return Box::pin(async move { Ok(now.boxed()) });
        }
        // Followed: the text now, then the end of the answer once the container ended.
        let ended = async move {
            loop {
                tokio::time::sleep(FOLLOW_POLL).await;
                match target.current() {
                    Some(object) if !pod_io::finished(&object) => continue,
                    _ => return,
                }
            }
        };
        let stream = now.chain(futures::stream::once(ended).filter_map(|()| async { None }));
        Box::pin(async move { Ok(stream.boxed()) })
    }

    fn exec(
        &self,
        target: PodTarget,
        request: ExecRequest,
    ) -> BoxFuture<'static, ApiResult<ExecSession>> {
        let spec = target.container_spec().cloned().unwrap_or_default();
        let outcome = pod_io::run(&request.command, &spec);
        let output = |wanted: bool, text: String| -> Option<OutputStream> {
            wanted.then(|| Box::new(io::Cursor::new(text.into_bytes())) as OutputStream)
        };
        let session = ExecSession {
            stdin: None,
            stdout: output(request.stdout, outcome.stdout),
            stderr: output(request.stderr, outcome.stderr),
            exit: Box::pin(std::future::ready(ExecExit::Code(outcome.exit_code))),
        };
        Box::pin(async move { Ok(session) })
    }

    fn port_forward(
        &self,
        target: PodTarget,
        _port: u16,
    ) -> BoxFuture<'static, ApiResult<BoxedConnection>> {
        Box::pin(async move { Err(no_process_backend(&target)) })
    }

    fn dial(&self, target: PodTarget, _port: u16) -> BoxFuture<'static, ApiResult<BoxedConnection>> {
        Box::pin(async move { Err(no_process_backend(&target)) })
    }
}

/// The simulated pods' refusal of a connection: they run nothing that listens.
fn no_process_backend(target: &PodTarget) -> ApiError {
    ApiError::service_unavailable(format!(
        "no process backend: pod {}/{} is simulated and runs no process to connect to",
        target.namespace(),
        target.name()
    ))
}
