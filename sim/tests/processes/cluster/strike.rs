//! The lab's strikes on a cluster deployed as users deploy it: `deploy/` and upstream's
//! spurctld StatefulSet applied, then the spurctld leader's pod frozen with SIGSTOP (a
//! hung node or a stopped process: its kernel still completes connects, so its tcpSocket
//! readiness probe passes and it stays in the headless Service). The survivors must elect
//! a new leader, a SpurJob created at the freeze must get its id within 3 s of that
//! election, and once thawed the old leader follows and the job completes.

use std::path::Path;
use std::time::{Duration, SystemTime};

use super::observe::{Watch, jsonpath, leadership_after, leaderships, poll, seconds_between};
use super::{ClusterProcess, completes, runnable, workspace};

/// The bound on a SpurJob's id after the new leader's election.
const ID_AFTER_ELECTION: Duration = Duration::from_secs(3);

/// The processes of pod `pod`: descendants of the cluster's process whose environment
/// names the pod as `HOSTNAME` (the kubelet sets it, as a real one does).
fn pod_processes(cluster: &ClusterProcess, pod: &str) -> Vec<u32> {
    let cluster_pid = cluster.child.id();
    let wanted = format!("HOSTNAME={pod}");
    let pids = std::fs::read_dir("/proc").into_iter().flatten().flatten();
    pids.filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
        .filter(|&pid| descends_from(pid, cluster_pid))
        .filter(|pid| {
            let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            environ
                .split(|b| *b == 0)
                .any(|var| var == wanted.as_bytes())
        })
        .collect()
}

fn descends_from(mut pid: u32, ancestor: u32) -> bool {
    while pid > 1 {
        if pid == ancestor {
            return true;
        }
        let Some(parent) = parent_of(pid) else {
            return false;
        };
        pid = parent;
    }
    false
}

/// The parent's pid, from `/proc/<pid>/stat` (after the command's closing parenthesis:
/// state, then ppid).
fn parent_of(pid: u32) -> Option<u32> {
    let stat =
        std::fs::read_to_string(Path::new("/proc").join(pid.to_string()).join("stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(1)?.parse().ok()
}

fn signal_all(pids: &[u32], signal: libc::c_int) {
    for &pid in pids {
        // SAFETY: kill(2) on pids of this cluster's pods, found just above.
        unsafe { libc::kill(pid as libc::pid_t, signal) };
    }
}

/// Thaws the frozen pod whatever happens, so the cluster can stop it on the way out.
struct Frozen(Vec<u32>);

impl Drop for Frozen {
    fn drop(&mut self) {
        signal_all(&self.0, libc::SIGCONT);
    }
}

#[test]
fn the_spurctld_leader_frozen_a_survivor_is_elected_and_a_spurjob_gets_its_id_soon_after() {
    if !runnable() {
        return;
    }
    let cluster = ClusterProcess::start("strike");
    let examples = workspace().join("deploy/examples/cluster");
    let file = |name: &str| examples.join(name).display().to_string();
    cluster.apply(&["-f", &file("spurctld.yaml")]);
    cluster.apply(&["-k", &workspace().join("deploy").display().to_string()]);
    cluster.apply(&["-f", &file("hello.yaml")]);
    completes(&cluster, "hello");
    let log_dir = cluster.dir.join("logs");
    let leader = leaderships(&log_dir).pop().expect("a leader");
    let pod = format!("spurctld-{}", leader.node - 1);
    let pids = pod_processes(&cluster, &pod);
    assert!(!pids.is_empty(), "no process of pod {pod} found");
    let frozen_at = SystemTime::now();
    signal_all(&pids, libc::SIGSTOP);
    let frozen = Frozen(pids);
    let hello = std::fs::read_to_string(file("hello.yaml")).expect("read hello.yaml");
    let manifest = cluster.dir.join("frozen.yaml");
    let job = hello.replace("name: hello\n", "name: frozen\n");
    std::fs::write(&manifest, job).expect("write the SpurJob");
    cluster.apply(&["-f", &manifest.display().to_string()]);
    let id_watch = Watch::start(&cluster, &["spurjob", "frozen"], "{.status.spurJobId}");
    let elected = poll("a survivor elected", &cluster, || {
        leadership_after(&log_dir, frozen_at).filter(|l| l.node != leader.node)
    });
    let (id_at, id) = poll("the SpurJob's id", &cluster, || {
        id_watch.first(|l| l.parse::<u64>().is_ok())
    });
    let ready = jsonpath(
        &cluster,
        &["get", "pod", "-n", "spur", &pod],
        "{.status.conditions[?(@.type==\"Ready\")].status}",
    );
    let id_after = seconds_between(elected.at, id_at);
    println!(
        "froze {pod} (the leader); N{} elected {:.2} s after the freeze; SpurJob id {id} \
         {:.2} s after the freeze, {id_after:.2} s after the election; the frozen pod's \
         Ready is {ready}",
        elected.node,
        seconds_between(frozen_at, elected.at),
        seconds_between(frozen_at, id_at),
    );
    assert_eq!(ready, "True", "a frozen pod passes its tcpSocket probe");
    assert!(
        id_after <= ID_AFTER_ELECTION.as_secs_f64(),
        "the SpurJob got its id {id_after:.2} s after the election"
    );
    drop(frozen);
    completes(&cluster, "frozen");
    cluster.stop();
}
