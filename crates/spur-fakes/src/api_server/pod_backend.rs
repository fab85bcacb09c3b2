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
    fn log(
        &self,
        target: PodTarget,
        request: LogRequest,
    ) -> BoxFuture<'static, ApiResult<LogStream>>;
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
    fn log(
        &self,
        target: PodTarget,
        request: LogRequest,
    ) -> BoxFuture<'static, ApiResult<LogStream>> {
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

    fn dial(
        &self,
        target: PodTarget,
        _port: u16,
    ) -> BoxFuture<'static, ApiResult<BoxedConnection>> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api_server::{ApiServer, ApiServerConfig};
    use serde_json::json;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    fn server_with_pod() -> ApiServer {
        let api = ApiServer::new(ApiServerConfig::default());
        api.create(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "default"},
            "spec": {"containers": [{"name": "c", "ports": [{"name": "http", "containerPort": 8080}]}]}}))
            .unwrap();
        api
    }

    /// A client that hears a 503 at once (kube's default transport retries it).
    fn client(api: &ApiServer) -> kube::Client {
        api.in_memory_client_with(&crate::api_server::ClientOptions {
            bearer_token: Some(api.admin_token()),
            retry_server_errors: false,
            ..crate::api_server::ClientOptions::default()
        })
    }

    async fn get(client: &kube::Client, path: &str) -> Result<String, kube::Error> {
        client
            .request_text(http::Request::get(path).body(Vec::new()).unwrap())
            .await
    }

    fn code(result: Result<String, kube::Error>) -> (u16, String) {
        match result {
            Err(kube::Error::Api(status)) => (status.code, status.message),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn the_simulated_pods_refuse_proxies_with_503() {
        let api = server_with_pod();
        let client = client(&api);
        let (status, message) = code(
            get(
                &client,
                "/api/v1/namespaces/default/pods/p:8080/proxy/metrics",
            )
            .await,
        );
        assert_eq!(status, 503);
        assert!(message.contains("no process backend"), "{message}");
        let (status, _) = code(get(&client, "/api/v1/namespaces/default/pods/nope/proxy/").await);
        assert_eq!(status, 404);
        let (status, message) = code(
            get(
                &client,
                "/api/v1/namespaces/default/pods/https:p:8443/proxy/",
            )
            .await,
        );
        assert_eq!(status, 400, "{message}");
    }

    /// A backend whose every port answers HTTP with the path it was asked for.
    struct EchoPods;

    impl PodBackend for EchoPods {
        fn log(&self, t: PodTarget, r: LogRequest) -> BoxFuture<'static, ApiResult<LogStream>> {
            SimulatedPods.log(t, r)
        }
        fn exec(&self, t: PodTarget, r: ExecRequest) -> BoxFuture<'static, ApiResult<ExecSession>> {
            SimulatedPods.exec(t, r)
        }
        fn port_forward(
            &self,
            t: PodTarget,
            p: u16,
        ) -> BoxFuture<'static, ApiResult<BoxedConnection>> {
            self.dial(t, p)
        }
        fn dial(
            &self,
            target: PodTarget,
            port: u16,
        ) -> BoxFuture<'static, ApiResult<BoxedConnection>> {
            let (ours, mut theirs) = tokio::io::duplex(4096);
            let pod = target.name().to_owned();
            tokio::spawn(async move {
                let mut head = vec![0u8; 1024];
                let n = theirs.read(&mut head).await.unwrap_or(0);
                let line = String::from_utf8_lossy(&head[..n])
                    .lines()
                    .next()
                    .unwrap_or_default()
                    .to_owned();
                let body = format!("{pod}:{port} {line}");
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                );
                let _ = theirs.write_all(answer.as_bytes()).await;
            });
            Box::pin(async move { Ok(Box::new(ours) as BoxedConnection) })
        }
    }

    #[tokio::test]
    async fn a_proxy_forwards_the_path_to_the_backends_connection() {
        let api = server_with_pod();
        api.set_pod_backend(Arc::new(EchoPods));
        let client = client(&api);
        let answer = get(
            &client,
            "/api/v1/namespaces/default/pods/p:http/proxy/metrics?x=1",
        )
        .await
        .unwrap();
        assert_eq!(answer, "p:8080 GET /metrics?x=1 HTTP/1.1");
        let answer = get(&client, "/api/v1/namespaces/default/pods/p/proxy")
            .await
            .unwrap();
        assert_eq!(answer, "p:8080 GET / HTTP/1.1");
        api.create(json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "s", "namespace": "default"},
            "spec": {"ports": [{"name": "web", "port": 80, "targetPort": "http"}]}}))
            .unwrap();
        let (status, message) =
            code(get(&client, "/api/v1/namespaces/default/services/s:web/proxy/").await);
        assert_eq!(status, 503);
        assert!(message.contains("no endpoints available"), "{message}");
        api.create(
            json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "s-1", "namespace": "default",
                "labels": {"kubernetes.io/service-name": "s"}},
            "addressType": "IPv4", "ports": [{"name": "web", "port": 8080}],
            "endpoints": [{"addresses": ["10.0.0.9"], "conditions": {"ready": true},
                "targetRef": {"kind": "Pod", "name": "p", "namespace": "default"}}]}),
        )
        .unwrap();
        let answer = get(
            &client,
            "/api/v1/namespaces/default/services/s:web/proxy/readyz",
        )
        .await
        .unwrap();
        assert_eq!(answer, "p:8080 GET /readyz HTTP/1.1");
        let (status, _) = code(
            get(
                &client,
                "/api/v1/namespaces/default/services/s:other/proxy/",
            )
            .await,
        );
        assert_eq!(status, 503);
    }
}
