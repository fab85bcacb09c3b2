//! A pod's containers through starts, exits, restarts and probes, and the status they make.

use std::os::unix::process::ExitStatusExt as _;
use std::path::PathBuf;
use std::process::Child;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, Pod};
use serde_json::{Value, json};

use super::KubeletConfig;
use super::cgroup::ContainerCgroup;
use super::containers;
use super::images::Unresolved;
use super::pod_net::PodNet;
use super::probes::{self, Action, ProbeState};

/// What a container's status reports as its state.
#[derive(Clone, Debug)]
pub enum State {
    Waiting {
        reason: String,
        message: String,
    },
    Running {
        started_at: String,
    },
    Terminated {
        exit_code: i32,
        reason: String,
        started_at: String,
        finished_at: String,
    },
}

/// One container's process and history.
#[derive(Debug)]
pub struct ContainerRun {
    pub spec: Container,
    pub child: Option<Child>,
    pub state: State,
    pub last_state: Option<State>,
    pub restart_count: u32,
    pub started: Option<Instant>,
    /// When the next start (or pull) may happen, and the delay after that.
    pub next_start: Instant,
    pub backoff: Duration,
    pub image_failures: u32,
    /// No restart will come: the pod's policy let it end.
    pub done: bool,
    pub readiness: ProbeState,
    pub liveness: ProbeState,
    /// When a liveness kill's SIGKILL is due.
    pub kill_at: Option<Instant>,
    /// The running process's memory cgroup; removed when it exits.
    pub cgroup: Option<ContainerCgroup>,
}

impl ContainerRun {
    pub fn new(spec: Container, config: &KubeletConfig) -> Self {
        Self {
            spec,
            child: None,
            state: State::Waiting {
                reason: "ContainerCreating".into(),
                message: String::new(),
            },
            last_state: None,
            restart_count: 0,
            started: None,
            next_start: Instant::now(),
            backoff: config.restart_backoff,
            image_failures: 0,
            done: false,
            readiness: ProbeState::new(false),
            liveness: ProbeState::new(true),
            kill_at: None,
            cgroup: None,
        }
    }

    /// Whether the container is ready: running and its readiness probe (if any) passing.
    pub fn ready(&self) -> bool {
        matches!(self.state, State::Running { .. })
            && (self.spec.readiness_probe.is_none() || self.readiness.ok)
    }

    /// Records an exit (if one happened) and decides whether and when it restarts; whether
    /// it was the kernel's OOM killer that ended the container.
    pub fn reap(&mut self, policy: &str, config: &KubeletConfig) -> bool {
        let Some(child) = &mut self.child else {
            return false;
        };
        let Ok(Some(status)) = child.try_wait() else {
            return false;
        };
        self.child = None;
        self.kill_at = None;
        let code = status
            .code()
            .unwrap_or_else(|| 128 + status.signal().unwrap_or(9));
        let ran = self.started.map_or(Duration::ZERO, |s| s.elapsed());
        let started_at = match &self.state {
            State::Running { started_at } => started_at.clone(),
            _ => String::new(),
        };
        // Dropping the cgroup kills what the process left in it, as a runtime does.
        let oom_killed = self.cgroup.take().is_some_and(|c| c.oom_killed());
        let reason = terminated_reason(code, oom_killed);
        self.exited(code, reason, started_at);
        self.plan_restart(policy, code, ran, config);
        reason == OOM_KILLED
    }

    fn exited(&mut self, exit_code: i32, reason: &str, started_at: String) {
        self.state = State::Terminated {
            exit_code,
            reason: reason.into(),
            started_at,
            finished_at: now(),
        };
        self.readiness = ProbeState::new(false);
        self.liveness = ProbeState::new(true);
    }

    /// restartPolicy: Always restarts, OnFailure only after a failure, Never not; each
    /// restart waits the back-off, which doubles unless the container ran long.
    fn plan_restart(&mut self, policy: &str, code: i32, ran: Duration, config: &KubeletConfig) {
        let restart = match policy {
            "Never" => false,
            "OnFailure" => code != 0,
            _ => true,
        };
        if !restart {
            self.done = true;
            return;
        }
        if ran >= config.backoff_reset {
            self.backoff = config.restart_backoff;
        }
        self.next_start = Instant::now() + self.backoff;
        self.backoff = (self.backoff * 2).min(config.restart_backoff_max);
    }

    /// Shows `CrashLoopBackOff` while a restart waits, the last run as `lastState`.
    pub fn show_backoff(&mut self) {
        if self.done || self.child.is_some() || Instant::now() >= self.next_start {
            return;
        }
        if let State::Terminated { .. } = self.state {
            let name = self.spec.name.clone();
            self.last_state = Some(self.state.clone());
            self.state = State::Waiting {
                reason: "CrashLoopBackOff".into(),
                message: format!("back-off restarting failed container {name}"),
            };
        }
    }

    /// Waiting to start for `reason` (ContainerCreating, CreateContainerConfigError...).
    pub fn waiting(&mut self, reason: &str, message: String) {
        self.state = State::Waiting {
            reason: reason.into(),
            message,
        };
    }

    /// Whether a start is due now.
    pub fn start_due(&self) -> bool {
        !self.done && self.child.is_none() && Instant::now() >= self.next_start
    }

    /// An image that is not in the table: ErrImagePull at once, ImagePullBackOff while the
    /// back-off runs.
    pub fn pull_failed(&mut self, message: String, config: &KubeletConfig) {
        let reason = if self.image_failures == 0 {
            "ErrImagePull"
        } else {
            "ImagePullBackOff"
        };
        let delay = config.image_backoff * 2u32.saturating_pow(self.image_failures.min(8));
        self.next_start = Instant::now() + delay.min(config.restart_backoff_max);
        self.image_failures += 1;
        self.state = State::Waiting {
            reason: reason.into(),
            message,
        };
    }

    /// A start that failed before the program ran (no such command, bad environment).
    pub fn start_failed(&mut self, why: Unresolved, policy: &str, config: &KubeletConfig) {
        match why {
            Unresolved::NoImage(message) => self.pull_failed(message, config),
            Unresolved::NoCommand(message) => {
                self.exited(128, "StartError", String::new());
                if let State::Terminated { reason, .. } = &mut self.state {
                    *reason = format!("StartError: {message}");
                }
                self.plan_restart(policy, 128, Duration::ZERO, config);
            }
        }
    }

    /// A process started in `cgroup`: Running, counted as a restart after the first.
    pub fn running(&mut self, child: Child, cgroup: Option<ContainerCgroup>) {
        if self.started.is_some() {
            self.restart_count += 1;
        }
        if matches!(self.state, State::Terminated { .. }) {
            self.last_state = Some(self.state.clone());
        }
        self.child = Some(child);
        self.cgroup = cgroup;
        self.started = Some(Instant::now());
        self.image_failures = 0;
        self.state = State::Running { started_at: now() };
    }

    /// A failed liveness probe: SIGTERM now, SIGKILL after the grace.
    pub fn kill_for_liveness(&mut self, config: &KubeletConfig) {
        if let (Some(child), None) = (&self.child, self.kill_at) {
            containers::signal(child, libc::SIGTERM);
            self.kill_at = Some(Instant::now() + config.liveness_grace);
        }
        if let (Some(child), Some(at)) = (&self.child, self.kill_at)
            && Instant::now() >= at
        {
            containers::signal(child, libc::SIGKILL);
        }
    }

    /// The container's entry in `status.containerStatuses`.
    pub fn status(&self) -> Value {
        let mut status = json!({
            "name": self.spec.name,
            "image": self.spec.image.clone().unwrap_or_default(),
            "imageID": "",
            "ready": self.ready(),
            "started": matches!(self.state, State::Running { .. }),
            "restartCount": self.restart_count,
            "state": state_json(&self.state),
        });
        if let Some(last) = &self.last_state {
            status["lastState"] = state_json(last);
        }
        status
    }
}

impl Drop for ContainerRun {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            containers::signal(child, libc::SIGKILL);
            let _ = child.wait();
        }
    }
}

/// The reason a container's runtime reports for an exit.
const OOM_KILLED: &str = "OOMKilled";

/// A terminated state's reason as containerd gives it: `OOMKilled` for a failed run during
/// which the OOM killer acted in the container's cgroup (it may have killed a child, whose
/// shell then exits 137 itself), else `Completed` for 0 and `Error` for the rest, SIGKILL
/// from anyone else included.
pub fn terminated_reason(exit_code: i32, oom_killed: bool) -> &'static str {
    match exit_code {
        0 => "Completed",
        _ if oom_killed => OOM_KILLED,
        _ => "Error",
    }
}

fn state_json(state: &State) -> Value {
    match state {
        State::Waiting { reason, message } => {
            json!({"waiting": {"reason": reason, "message": message}})
        }
        State::Running { started_at } => json!({"running": {"startedAt": started_at}}),
        State::Terminated {
            exit_code,
            reason,
            started_at,
            finished_at,
        } => {
            let (reason, message) = reason.split_once(": ").unwrap_or((reason, ""));
            let mut terminated = json!({"exitCode": exit_code, "reason": reason,
                "message": message, "finishedAt": finished_at});
            // A run that never started has no start time; an empty one is no timestamp,
            // and clients (the kubelet's own list) refuse the whole pod over it.
            if !started_at.is_empty() {
                terminated["startedAt"] = json!(started_at);
            }
            json!({"terminated": terminated})
        }
    }
}

/// Now, as the API's timestamps are written.
pub fn now() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .round(k8s_openapi::jiff::Unit::Second)
        .map_or_else(|_| String::new(), |t| t.to_string())
}

/// One pod this kubelet runs.
#[derive(Debug)]
pub struct PodRun {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub pod: Pod,
    /// Containers first: they die before the namespace their pause holds.
    pub containers: Vec<ContainerRun>,
    pub net: PodNet,
    /// The node's address on the pod network (the bridge's).
    pub host_ip: std::net::Ipv4Addr,
    pub dir: PathBuf,
    pub start_time: String,
    /// When SIGKILL is due, once deletion began.
    pub kill_at: Option<Instant>,
    /// The last status written, so an unchanged one is not written again.
    pub written: Value,
    /// The volumes' host paths, once made.
    pub volumes: Option<std::collections::BTreeMap<String, PathBuf>>,
    /// The last FailedMount reason reported, so a retry does not repeat its event.
    pub mount_error: Option<String>,
    /// How up to date its volumes' files are.
    pub freshness: super::volumes::Freshness,
}

impl PodRun {
    pub fn policy(&self) -> String {
        self.pod
            .spec
            .as_ref()
            .and_then(|s| s.restart_policy.clone())
            .unwrap_or_else(|| "Always".into())
    }

    /// Pending until every container started once; then Running while any runs or will
    /// restart; Succeeded when all ended with 0 for good, Failed when one did not.
    pub fn phase(&self) -> &'static str {
        if self
            .containers
            .iter()
            .any(|c| c.started.is_none() && !c.done)
        {
            return "Pending";
        }
        if self.containers.iter().all(|c| c.done && c.child.is_none()) {
            let failed = self
                .containers
                .iter()
                .any(|c| !matches!(c.state, State::Terminated { exit_code: 0, .. }));
            return if failed { "Failed" } else { "Succeeded" };
        }
        "Running"
    }

    /// The pod's `status`.
    pub fn status(&self) -> Value {
        let ready = self.containers.iter().all(ContainerRun::ready);
        let condition = |kind: &str, yes: bool| json!({"type": kind, "status": if yes { "True" } else { "False" }});
        let ip = self.net.ip.to_string();
        json!({
            "phase": self.phase(),
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "hostIP": self.host_ip.to_string(),
            "startTime": self.start_time,
            "conditions": [
                condition("PodScheduled", true),
                condition("Initialized", true),
                condition("ContainersReady", ready),
                condition("Ready", ready),
            ],
            "containerStatuses": self.containers.iter().map(ContainerRun::status).collect::<Vec<_>>(),
        })
    }

    /// Runs the probes that are due and acts on their verdicts.
    pub async fn probe(&mut self, config: &KubeletConfig) {
        let now = Instant::now();
        let sandbox_ip = self.net.ip;
        for i in 0..self.containers.len() {
            let Some(started) = self.containers[i].started else {
                continue;
            };
            if self.containers[i].child.is_none() {
                continue;
            }
            let spec = self.containers[i].spec.clone();
            if let Some(probe) = &spec.readiness_probe
                && self.containers[i].readiness.due(probe, started, now)
            {
                let passed = self.run_probe(probe, &spec, sandbox_ip).await;
                self.containers[i]
                    .readiness
                    .record(probe, passed, Instant::now());
            }
            if let Some(probe) = &spec.liveness_probe
                && self.containers[i].liveness.due(probe, started, now)
            {
                let passed = self.run_probe(probe, &spec, sandbox_ip).await;
                self.containers[i]
                    .liveness
                    .record(probe, passed, Instant::now());
            }
            if !self.containers[i].liveness.ok {
                self.containers[i].kill_for_liveness(config);
            }
        }
    }

    /// One probe run, bounded by its timeout.
    async fn run_probe(
        &self,
        probe: &k8s_openapi::api::core::v1::Probe,
        spec: &Container,
        ip: std::net::Ipv4Addr,
    ) -> bool {
        let timeout = probes::timeout(probe);
        let run = async {
            match probes::action(probe, spec, ip) {
                Action::Tcp(host, port) => probes::tcp(host, port).await,
                Action::Http(host, port, path) => probes::http(host, port, &path).await,
                Action::Exec(command) => self.exec(spec, &command, timeout).await,
                Action::Unsupported => false,
            }
        };
        tokio::time::timeout(timeout, run).await.unwrap_or(false)
    }

    /// An exec probe: the command in the pod as the container's user, exit 0 passes.
    async fn exec(&self, spec: &Container, command: &[String], timeout: Duration) -> bool {
        let Some((program, args)) = command.split_first() else {
            return false;
        };
        let (uid, gid) = containers::user_of(&self.pod, spec);
        // The command runs inside the container: its root, its volumes, its hosts file.
        let running = self.containers.iter().find(|c| c.spec.name == spec.name);
        let pid = running.and_then(|c| c.child.as_ref()).map(Child::id);
        let cgroup = running.and_then(|c| c.cgroup.as_ref());
        let Some(pid) = pid else {
            return false;
        };
        let Ok(root) = std::ffi::CString::new(format!("/proc/{pid}/root")) else {
            return false;
        };
        let sandbox = containers::Sandbox {
            netns: &self.net.netns,
            utsns: &self.net.utsns,
            uid,
            gid,
            groups: containers::groups_of(&self.pod),
            cgroup,
            filesystem: containers::Filesystem::Enter(root),
        };
        let Some(program) = which(program, pid) else {
            return false;
        };
        let mut cmd = containers::command(&sandbox, &program, args, &Default::default());
        cmd.stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        let Ok(mut child) = cmd.spawn() else {
            return false;
        };
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return status.success();
            }
            if Instant::now() >= deadline {
                containers::signal(&child, libc::SIGKILL);
                let _ = child.wait();
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// An exec probe's program as the container sees it: a path as it is, else the first
/// directory of the container's default PATH that holds it under its root.
fn which(program: &str, pid: u32) -> Option<PathBuf> {
    if program.contains('/') {
        return Some(PathBuf::from(program));
    }
    let root = PathBuf::from(format!("/proc/{pid}/root"));
    std::env::split_paths(containers::DEFAULT_PATH)
        .map(|d| d.join(program))
        .find(|p| root.join(p.strip_prefix("/").unwrap_or(p)).is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_failed_run_with_an_oom_kill_is_oom_killed() {
        assert_eq!(terminated_reason(137, true), "OOMKilled");
        assert_eq!(terminated_reason(1, true), "OOMKilled");
        assert_eq!(terminated_reason(137, false), "Error");
        assert_eq!(terminated_reason(0, true), "Completed");
        assert_eq!(terminated_reason(0, false), "Completed");
    }

    #[test]
    fn a_sigkill_without_a_cgroup_is_an_error_137_and_restarts_after_the_back_off() {
        let config = KubeletConfig::new(
            super::super::images::ImageTable::with_defaults(std::path::Path::new(".")),
            std::env::temp_dir(),
        );
        let spec: Container = serde_json::from_value(json!({"name": "c"})).expect("container");
        let mut run = ContainerRun::new(spec, &config);
        let child = std::process::Command::new("/bin/sh")
            .args(["-c", "kill -9 $$"])
            .spawn()
            .expect("sh");
        run.running(child, None);
        while run.child.is_some() {
            assert!(!run.reap("Always", &config), "no cgroup, so no OOM kill");
            std::thread::sleep(Duration::from_millis(10));
        }
        let status = run.status();
        assert_eq!(status["state"]["terminated"]["exitCode"], 137);
        assert_eq!(status["state"]["terminated"]["reason"], "Error");
        assert!(!run.done && run.next_start > Instant::now());
    }
}
