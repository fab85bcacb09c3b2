//! `spur-sim cluster` as a user meets it: the cluster started as a process, kubectl run
//! against the kubeconfig it prints, and the cluster stopped with SIGTERM, leaving no
//! process behind. The cases are in the modules below; this one holds what they share.

mod agent_auth;
mod apply;
mod ha;
mod memory;
mod network_policy;
mod observe;
mod pod_io;
mod strike;

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::kubectl::kubectl_binary;

/// Why this machine cannot run the cluster, if it cannot.
fn missing() -> Option<String> {
    if let Some(why) = spur_lab::kernel::missing_tools() {
        return Some(why);
    }
    if spur_lab::real_peer::binary().is_none() {
        return Some("the real spurctld was not found (set SPURCTLD)".into());
    }
    let operator = operator_binary();
    (!operator.is_file()).then(|| {
        format!(
            "{} is missing: cargo build -p spur-operator",
            operator.display()
        )
    })
}

fn operator_binary() -> PathBuf {
    std::env::var_os("SPUR_OPERATOR_BIN").map_or_else(
        || workspace().join("target/debug/spur-operator"),
        PathBuf::from,
    )
}

pub(super) fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The cluster's process; killed (and with it every pod) if the test ends early.
pub(super) struct ClusterProcess {
    pub(super) child: Child,
    pub(super) dir: PathBuf,
    pub(super) kubeconfig: PathBuf,
}

impl ClusterProcess {
    pub(super) fn start(name: &str) -> ClusterProcess {
        let dir = std::env::temp_dir().join(format!("spur-cluster-{name}-{}", std::process::id()));
        let mut child = Command::new(env!("CARGO_BIN_EXE_spur-sim"))
            .args([
                "cluster",
                "--listen",
                "127.0.0.1:0",
                "--nodes",
                "2",
                "--dir",
            ])
            .arg(&dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start spur-sim cluster");
        let stdout = child.stdout.take().expect("piped");
        let mut lines = BufReader::new(stdout).lines();
        let kubeconfig = loop {
            let line = lines
                .next()
                .expect("spur-sim cluster ended before printing its kubeconfig")
                .expect("its output");
            println!("cluster: {line}");
            if let Some(path) = line.strip_prefix("export KUBECONFIG=") {
                break PathBuf::from(path);
            }
        };
        // Keep reading its output, so it never blocks on a full pipe.
        std::thread::spawn(move || {
            lines.for_each(|l| println!("cluster: {}", l.unwrap_or_default()))
        });
        ClusterProcess {
            child,
            dir,
            kubeconfig,
        }
    }

    /// A cluster with upstream's spurctld StatefulSet and `deploy/` applied, once
    /// `hello.yaml`'s SpurJob completed on it.
    pub(super) fn deployed(name: &str) -> ClusterProcess {
        let cluster = ClusterProcess::start(name);
        let examples = workspace().join("deploy/examples/cluster");
        let file = |name: &str| examples.join(name).display().to_string();
        cluster.apply(&["-f", &file("spurctld.yaml")]);
        cluster.apply(&["-k", &workspace().join("deploy").display().to_string()]);
        cluster.apply(&["-f", &file("hello.yaml")]);
        completes(&cluster, "hello");
        cluster
    }

    /// Runs kubectl against the cluster: its status and combined output.
    pub(super) fn kubectl(&self, args: &[&str]) -> (bool, String) {
        let out = Command::new(kubectl_binary())
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .output()
            .expect("run kubectl");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    }

    pub(super) fn apply(&self, args: &[&str]) {
        let (ok, out) = self.kubectl(&[&["apply"], args].concat());
        assert!(ok, "kubectl apply {args:?}: {out}");
        println!("{out}");
    }

    /// What a person would look at when the job did not complete.
    pub(super) fn diagnose(&self) -> String {
        let mut text = String::new();
        for args in [
            &["get", "pods", "-A", "-o", "wide"][..],
            &["get", "spurjobs", "-A", "-o", "yaml"],
            &["get", "events", "-A"],
        ] {
            text.push_str(&format!("--- kubectl {args:?}\n{}\n", self.kubectl(args).1));
        }
        for log in logs(&self.dir.join("logs")) {
            let content = std::fs::read_to_string(&log).unwrap_or_default();
            let tail: Vec<&str> = content.lines().rev().take(40).collect();
            text.push_str(&format!("--- {}\n", log.display()));
            for line in tail.into_iter().rev() {
                text.push_str(line);
                text.push('\n');
            }
        }
        text
    }

    /// SIGTERM, as a user's Ctrl-C; the cluster must be gone within 30 s.
    pub(super) fn stop(mut self) {
        let netns = std::fs::read_link(format!("/proc/{}/ns/net", self.child.id())).ok();
        // SAFETY: kill(2) on our own child's pid has no memory-safety preconditions.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                assert!(status.success(), "spur-sim cluster exited with {status}");
                let left = netns.map(|n| processes_in(&n)).unwrap_or_default();
                assert!(left.is_empty(), "processes {left:?} outlived the cluster");
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("spur-sim cluster did not stop within 30 s of SIGTERM");
    }
}

impl Drop for ClusterProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // Killed, the cluster could not remove its cgroups itself.
        let cgroups = spur_lab::cluster::cgroup::CgroupConfig::default();
        spur_lab::cluster::cgroup::remove_left_by(self.child.id(), &cgroups);
        // A failed case keeps its logs for the person reading the failure.
        if std::thread::panicking() {
            eprintln!("the cluster's files are kept in {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Every container log under the cluster's log directory.
pub(super) fn logs(dir: &Path) -> Vec<PathBuf> {
    let pods = std::fs::read_dir(dir).into_iter().flatten().flatten();
    let mut logs: Vec<PathBuf> = pods
        .flat_map(|pod| {
            std::fs::read_dir(pod.path())
                .into_iter()
                .flatten()
                .flatten()
        })
        .map(|log| log.path())
        .collect();
    logs.sort();
    logs
}

/// The processes whose network namespace is `netns` (a `net:[inode]` link).
fn processes_in(netns: &Path) -> Vec<String> {
    let entries = std::fs::read_dir("/proc").into_iter().flatten().flatten();
    entries
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter(|e| std::fs::read_link(e.path().join("ns/net")).is_ok_and(|l| l == netns))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

/// Polls the SpurJob's state until `want` (or the deadline); the last state seen.
pub(super) fn wait_for_state(
    cluster: &ClusterProcess,
    name: &str,
    want: &str,
    within: Duration,
) -> String {
    let deadline = Instant::now() + within;
    let mut state = String::new();
    while Instant::now() < deadline {
        let (_, out) = cluster.kubectl(&["get", "spurjob", name, "-o", "jsonpath={.status.state}"]);
        state = out.trim().to_owned();
        if state == want {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    state
}

/// Skips the test (loudly) where it cannot run; under CI that is a failure.
pub(super) fn runnable() -> bool {
    if let Some(why) = missing() {
        // CI runs as root with everything installed: there a skip would hide a failure.
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI cannot run the cluster: {why}"
        );
        eprintln!("SKIPPED cluster: {why}");
        return false;
    }
    true
}

/// Waits for SpurJob `name` to complete, or fails with the cluster's state.
pub(super) fn completes(cluster: &ClusterProcess, name: &str) {
    let started = Instant::now();
    let state = wait_for_state(cluster, name, "Completed", Duration::from_secs(150));
    assert!(
        state == "Completed",
        "SpurJob {name} is {state:?} after {:?}, not Completed\n{}",
        started.elapsed(),
        cluster.diagnose()
    );
    println!(
        "SpurJob {name} Completed {:?} after it was applied",
        started.elapsed()
    );
}
