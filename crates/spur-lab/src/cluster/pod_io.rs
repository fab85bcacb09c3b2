//! The process pods behind the API server's `pods/log`, `pods/exec`, `pods/portforward`
//! and proxy: [`ProcessPods`], the [`PodBackend`] `spur-sim cluster` sets.
//!
//! - a log is the container's log file the kubelet writes
//!   (`<log_dir>/<namespace>_<pod>_<uid>/<container>.log`, stdout and stderr together,
//!   every run appended), with `tailLines` and `follow`; not `previous` (one file holds
//!   every run) nor `timestamps` (no line's time is kept), which are refused and ignored;
//! - an exec runs the command inside the container: the network, UTS and mount namespaces
//!   of its process (found through [`ContainerProcesses`], which the kubelet fills in), its
//!   root, its environment as it started, its user, groups and working directory. No
//!   terminal is allocated (`tty` runs the command on pipes);
//! - a port-forward connects to `127.0.0.1:PORT` inside the pod's network namespace, as
//!   a kubelet's does; the proxy dials the pod's IP from the cluster's namespace, where the
//!   API server runs and every node's bridge is routed, as a real API server dials it.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd as _, OwnedFd};
use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt as _;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{Container, Pod};
use spur_fakes::api_server::pod_backend::{
    BoxedConnection, ExecExit, ExecRequest, ExecSession, LogRequest, LogStream, OutputStream,
    PodBackend, PodTarget,
};
use spur_fakes::api_server::{ApiError, ApiResult};

use super::containers;
use crate::kernel::check;

/// The bounds of the process pods' answers.
#[derive(Clone, Debug)]
pub struct PodIoConfig {
    /// How long a port-forward or proxy connect may take (default 5 s: a pod's port on
    /// this machine answers at once or refuses; only a dead pod's address stays silent,
    /// and kubectl should hear so well within its own 30 s).
    pub connect_timeout: Duration,
    /// How often a followed log looks for more lines and for its container's end (default
    /// 200 ms, the kubelet's sync period: the container's end shows no sooner).
    pub follow_poll: Duration,
}

impl Default for PodIoConfig {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(5),
            follow_poll: Duration::from_millis(200),
        }
    }
}

/// Which process runs each container now, by pod uid and container name: the kubelet
/// records a start, and forgets a pod once it is gone. Cheap to clone; clones share it.
#[derive(Clone, Debug, Default)]
pub struct ContainerProcesses(Arc<Mutex<BTreeMap<(String, String), u32>>>);

impl ContainerProcesses {
    /// Container `container` of pod `pod_uid` runs as `pid` (from now on, until it restarts).
    pub fn started(&self, pod_uid: &str, container: &str, pid: u32) {
        let key = (pod_uid.to_owned(), container.to_owned());
        self.0.lock().expect("process lock").insert(key, pid);
    }

    /// The pod's containers are gone.
    pub fn forget_pod(&self, pod_uid: &str) {
        self.0
            .lock()
            .expect("process lock")
            .retain(|(uid, _), _| uid != pod_uid);
    }

    /// The process of a container that runs now.
    pub fn running(&self, pod_uid: &str, container: &str) -> Option<u32> {
        let key = (pod_uid.to_owned(), container.to_owned());
        let pid = *self.0.lock().expect("process lock").get(&key)?;
        // An exited container's process is a zombie until the kubelet reaps it.
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let after_name = state.rsplit_once(')')?.1.trim_start();
        (!after_name.starts_with('Z')).then_some(pid)
    }
}

/// The process pods, as the API server's [`PodBackend`].
pub struct ProcessPods {
    processes: ContainerProcesses,
    log_dir: PathBuf,
    config: PodIoConfig,
}

impl ProcessPods {
    /// The pods whose processes `processes` records and whose logs are under `log_dir`
    /// (the kubelets' [`super::KubeletConfig::log_dir`]).
    pub fn new(processes: ContainerProcesses, log_dir: PathBuf, config: PodIoConfig) -> Self {
        Self {
            processes,
            log_dir,
            config,
        }
    }

    fn pid(&self, target: &PodTarget) -> ApiResult<u32> {
        self.processes
            .running(target.uid(), &target.container)
            .ok_or_else(|| {
                ApiError::bad_request(format!(
                    "container {:?} in pod {:?} is not running",
                    target.container,
                    target.name()
                ))
            })
    }

    /// A process of the pod, whichever container it is of: its network namespace is the pod's.
    fn any_pid(&self, target: &PodTarget) -> ApiResult<u32> {
        let containers = target.pod["spec"]["containers"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        containers
            .iter()
            .filter_map(|c| c["name"].as_str())
            .find_map(|name| self.processes.running(target.uid(), name))
            .ok_or_else(|| {
                ApiError::service_unavailable(format!(
                    "pod {:?} has no running container",
                    target.name()
                ))
            })
    }
}

impl PodBackend for ProcessPods {
    fn log(
        &self,
        target: PodTarget,
        request: LogRequest,
    ) -> BoxFuture<'static, ApiResult<LogStream>> {
        let path = self
            .log_dir
            .join(format!(
                "{}_{}_{}",
                target.namespace(),
                target.name(),
                target.uid()
            ))
            .join(format!("{}.log", target.container));
        let poll = self.config.follow_poll;
        Box::pin(async move {
            if request.previous {
                return Err(ApiError::bad_request(format!(
                    "previous terminated container {:?} in pod {:?} not found: the process \
                     kubelet keeps every run of a container in one log",
                    target.container,
                    target.name()
                )));
            }
            let bytes = read_log(&path).await?;
            let start = tail_start(&bytes, request.tail_lines);
            let first = Bytes::copy_from_slice(&bytes[start..]);
            let now = futures::stream::once(async move { Ok(first) });
            if !request.follow {
                return Ok(now.boxed());
            }
            Ok(now.chain(follow(path, bytes.len(), target, poll)).boxed())
        })
    }

    fn exec(
        &self,
        target: PodTarget,
        request: ExecRequest,
    ) -> BoxFuture<'static, ApiResult<ExecSession>> {
        let started = self
            .pid(&target)
            .and_then(|pid| start_exec(pid, &target, &request));
        Box::pin(async move { started })
    }

    fn port_forward(
        &self,
        target: PodTarget,
        port: u16,
    ) -> BoxFuture<'static, ApiResult<BoxedConnection>> {
        let pid = self.any_pid(&target);
        let timeout = self.config.connect_timeout;
        Box::pin(async move {
            let name = target.name().to_owned();
            let refused = |e: io::Error| {
                ApiError::service_unavailable(format!(
                    "connecting to 127.0.0.1:{port} inside pod {name:?}: {e}"
                ))
            };
            let netns = open(&format!("/proc/{}/ns/net", pid?)).map_err(refused)?;
            let stream = connect_inside(netns, port, timeout)
                .await
                .map_err(refused)?;
            Ok(Box::new(stream) as BoxedConnection)
        })
    }

    fn dial(&self, target: PodTarget, port: u16) -> BoxFuture<'static, ApiResult<BoxedConnection>> {
        let timeout = self.config.connect_timeout;
        Box::pin(async move {
            let ip = target.pod["status"]["podIP"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            let refused = |why: String| {
                ApiError::service_unavailable(format!("error trying to reach {ip}:{port}: {why}"))
            };
            let address: std::net::IpAddr = ip
                .parse()
                .map_err(|_| refused(format!("pod {:?} has no IP yet", target.name())))?;
            let connect = tokio::net::TcpStream::connect((address, port));
            let stream = tokio::time::timeout(timeout, connect)
                .await
                .map_err(|_| refused(format!("no answer within {timeout:?}")))?
                .map_err(|e| refused(e.to_string()))?;
            Ok(Box::new(stream) as BoxedConnection)
        })
    }
}

/// A container's log so far; none yet is an empty one.
async fn read_log(path: &Path) -> ApiResult<Vec<u8>> {
    match tokio::fs::read(path).await {
        Ok(bytes) => Ok(bytes),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(ApiError::internal(format!("{}: {e}", path.display()))),
    }
}

/// Where the last `lines` lines of `log` start (a last line without its newline counts).
fn tail_start(log: &[u8], lines: Option<usize>) -> usize {
    let Some(lines) = lines else { return 0 };
    let body = log.strip_suffix(b"\n").unwrap_or(log);
    let mut seen = 0;
    for (i, byte) in body.iter().enumerate().rev() {
        if *byte == b'\n' {
            seen += 1;
            if seen == lines {
                return i + 1;
            }
        }
    }
    if lines == 0 { log.len() } else { 0 }
}

/// What the container prints after `offset`, until it stops running (then what it printed
/// last).
fn follow(path: PathBuf, offset: usize, target: PodTarget, poll: Duration) -> LogStream {
    let state = (path, offset, target, false);
    futures::stream::unfold(state, move |(path, offset, target, ended)| async move {
        loop {
            if ended {
                return None;
            }
            tokio::time::sleep(poll).await;
            let running = target
                .current()
                .is_some_and(|pod| container_running(&pod, &target.container));
            let Ok(bytes) = read_log(&path).await else {
                return None;
            };
            if bytes.len() > offset {
                let new = Bytes::copy_from_slice(&bytes[offset..]);
                return Some((Ok(new), (path, bytes.len(), target, !running)));
            }
            if !running {
                return None;
            }
        }
    })
    .boxed()
}

fn container_running(pod: &serde_json::Value, container: &str) -> bool {
    pod["status"]["containerStatuses"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|s| s["name"] == container && s["state"].get("running").is_some())
}

fn open(path: &str) -> io::Result<OwnedFd> {
    Ok(std::fs::File::open(path)?.into())
}

/// Connects to `127.0.0.1:port` in the network namespace `netns`, from a thread of its own
/// that enters it (the namespace is the thread's; the socket keeps it after).
async fn connect_inside(
    netns: OwnedFd,
    port: u16,
    timeout: Duration,
) -> io::Result<tokio::net::TcpStream> {
    let (done, result) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let connect = || {
            // SAFETY: setns(2) on an fd this thread owns; it changes this thread only.
            check(unsafe { libc::setns(netns.as_raw_fd(), libc::CLONE_NEWNET) })?;
            let address = std::net::SocketAddr::from(([127, 0, 0, 1], port));
            std::net::TcpStream::connect_timeout(&address, timeout)
        };
        let _ = done.send(connect());
    });
    let stream = result
        .await
        .map_err(|_| io::Error::other("the connecting thread ended"))??;
    stream.set_nonblocking(true)?;
    tokio::net::TcpStream::from_std(stream)
}

/// Starts `request`'s command inside the container whose process is `pid`; a program the
/// container does not have ends at once with 127 and the shell's words, as a runtime's
/// "executable file not found" does.
fn start_exec(pid: u32, target: &PodTarget, request: &ExecRequest) -> ApiResult<ExecSession> {
    let pod: Pod = serde_json::from_value((*target.pod).clone())
        .map_err(|e| ApiError::internal(format!("the pod: {e}")))?;
    let spec = target
        .container_spec()
        .cloned()
        .and_then(|c| serde_json::from_value::<Container>(c).ok())
        .ok_or_else(|| {
            ApiError::bad_request(format!("container {:?} is not valid", target.container))
        })?;
    let failed = |e: io::Error| ApiError::internal(format!("exec in pod {:?}: {e}", target.name()));
    let env = environment(pid).map_err(failed)?;
    let path = env
        .get("PATH")
        .map_or(containers::DEFAULT_PATH, String::as_str);
    let Some(program) = which(&request.command[0], path, pid) else {
        let message = format!(
            "{}: executable file not found in $PATH\n",
            request.command[0]
        );
        return Ok(ExecSession {
            stdin: None,
            stdout: None,
            stderr: request
                .stderr
                .then(|| Box::new(io::Cursor::new(message.into_bytes())) as OutputStream),
            exit: Box::pin(std::future::ready(ExecExit::Code(127))),
        });
    };
    let mut command =
        command_in(pid, &pod, &spec, &program, &request.command[1..], &env).map_err(failed)?;
    let pipe = |wanted: bool| {
        if wanted {
            Stdio::piped()
        } else {
            Stdio::null()
        }
    };
    command
        .stdin(pipe(request.stdin))
        .stdout(pipe(request.stdout))
        .stderr(pipe(request.stderr));
    let mut child = tokio::process::Command::from(command)
        .kill_on_drop(true)
        .spawn()
        .map_err(failed)?;
    Ok(ExecSession {
        stdin: child.stdin.take().map(|s| Box::new(s) as _),
        stdout: child.stdout.take().map(|s| Box::new(s) as _),
        stderr: child.stderr.take().map(|s| Box::new(s) as _),
        exit: Box::pin(async move {
            match child.wait().await {
                Ok(status) => ExecExit::Code(
                    status
                        .code()
                        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0)),
                ),
                Err(e) => ExecExit::Failed(format!("waiting for the command: {e}")),
            }
        }),
    })
}

/// The environment the container's process started with.
fn environment(pid: u32) -> io::Result<BTreeMap<String, String>> {
    let raw = std::fs::read(format!("/proc/{pid}/environ"))?;
    Ok(raw
        .split(|b| *b == 0)
        .filter_map(|entry| {
            let text = String::from_utf8_lossy(entry);
            let (name, value) = text.split_once('=')?;
            Some((name.to_owned(), value.to_owned()))
        })
        .collect())
}

/// `program` as the container finds it: a path as it is, else the first directory of
/// `path` that holds it under the container's root.
fn which(program: &str, path: &str, pid: u32) -> Option<PathBuf> {
    if program.contains('/') {
        return Some(PathBuf::from(program));
    }
    let root = PathBuf::from(format!("/proc/{pid}/root"));
    std::env::split_paths(path)
        .map(|d| d.join(program))
        .find(|p| root.join(p.strip_prefix("/").unwrap_or(p)).is_file())
}

/// `program args` entering the container of process `pid`: its namespaces (network, UTS,
/// mount), its root, its working directory, then its user.
fn command_in(
    pid: u32,
    pod: &Pod,
    spec: &Container,
    program: &Path,
    args: &[String],
    env: &BTreeMap<String, String>,
) -> io::Result<std::process::Command> {
    let namespaces = [
        (open(&format!("/proc/{pid}/ns/net"))?, libc::CLONE_NEWNET),
        (open(&format!("/proc/{pid}/ns/uts"))?, libc::CLONE_NEWUTS),
        (open(&format!("/proc/{pid}/ns/mnt"))?, libc::CLONE_NEWNS),
    ];
    let root = open(&format!("/proc/{pid}/root"))?;
    let workdir = CString::new(spec.working_dir.as_deref().unwrap_or("/").as_bytes())
        .map_err(|_| io::Error::other("the working directory holds a NUL"))?;
    let (uid, gid) = containers::user_of(pod, spec);
    let groups = containers::groups_of(pod);
    let mut command = std::process::Command::new(program);
    command.args(args).env_clear().envs(env);
    // SAFETY: setns, fchdir, chroot, chdir, setgroups, setgid, setuid and prctl are
    // async-signal-safe, on fds and memory owned by the closure, made before the fork.
    unsafe {
        command.pre_exec(move || {
            for (fd, kind) in &namespaces {
                check(libc::setns(fd.as_raw_fd(), *kind))?;
            }
            // Joining the mount namespace put this process at its root; the container's
            // own root is the chroot inside it.
            check(libc::fchdir(root.as_raw_fd()))?;
            check(libc::chroot(c".".as_ptr()))?;
            check(libc::chdir(workdir.as_ptr()))?;
            check(libc::setgroups(groups.len(), groups.as_ptr()))?;
            check(libc::setgid(gid))?;
            check(libc::setuid(uid))?;
            check(libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL))
        });
    }
    Ok(command)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tail_is_the_last_lines() {
        let log = b"one\ntwo\nthree\n";
        assert_eq!(&log[tail_start(log, Some(2))..], b"two\nthree\n");
        assert_eq!(&log[tail_start(log, Some(5))..], log);
        assert_eq!(&log[tail_start(log, Some(0))..], b"");
        let unterminated = b"a\nb";
        assert_eq!(&unterminated[tail_start(unterminated, Some(1))..], b"b");
        assert_eq!(tail_start(log, None), 0);
    }

    #[test]
    fn a_process_is_running_until_it_is_a_zombie_or_gone() {
        let processes = ContainerProcesses::default();
        processes.started("uid-1", "main", std::process::id());
        assert_eq!(processes.running("uid-1", "main"), Some(std::process::id()));
        assert_eq!(processes.running("uid-1", "other"), None);
        processes.forget_pod("uid-1");
        assert_eq!(processes.running("uid-1", "main"), None);
    }
}
