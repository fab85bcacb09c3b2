//! The lab's strikes on a cluster deployed as users deploy it: `deploy/` and upstream's
//! spurctld StatefulSet applied, then the spurctld leader's pod frozen with SIGSTOP (a
//! hung node or a stopped process: its kernel still completes connects, so its tcpSocket
//! readiness probe passes and it stays in the headless Service). The survivors must elect
//! a new leader, a SpurJob created at the freeze must get its id within 3 s of that
//! election, and once thawed the old leader follows and the job completes. Then the new
//! leader's pod is cut off the network (every packet in its network namespace dropped, as
//! the lab black-holes a host): the same bounds hold, and once healed the job completes.

use std::path::Path;
use std::time::{Duration, SystemTime};

use super::observe::{
    Leadership, Watch, jsonpath, leadership_after, leaderships, poll, seconds_between,
};
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

/// A SpurJob named `name` created from hello.yaml.
fn create_spurjob(cluster: &ClusterProcess, name: &str) {
    let hello = workspace().join("deploy/examples/cluster/hello.yaml");
    let hello = std::fs::read_to_string(hello).expect("read hello.yaml");
    let manifest = cluster.dir.join(format!("{name}.yaml"));
    let job = hello.replace("name: hello\n", &format!("name: {name}\n"));
    std::fs::write(&manifest, job).expect("write the SpurJob");
    cluster.apply(&["-f", &manifest.display().to_string()]);
}

/// Strikes the leader's pod with `strike` (which returns what undoes it), creates SpurJob
/// `name` at once, and holds the bound on its id after a survivor's election; the strike
/// is undone and the job must complete.
fn strike_the_leader<U>(
    cluster: &ClusterProcess,
    name: &str,
    strike: impl FnOnce(&[u32]) -> U,
) -> (String, Leadership, f64) {
    let log_dir = cluster.dir.join("logs");
    let leader = leaderships(&log_dir).pop().expect("a leader");
    let pod = format!("spurctld-{}", leader.node - 1);
    let pids = pod_processes(cluster, &pod);
    assert!(!pids.is_empty(), "no process of pod {pod} found");
    let struck_at = SystemTime::now();
    let undo = strike(&pids);
    create_spurjob(cluster, name);
    let id_watch = Watch::start(cluster, &["spurjob", name], "{.status.spurJobId}");
    let elected = poll("a survivor elected", cluster, || {
        leadership_after(&log_dir, struck_at).filter(|l| l.node != leader.node)
    });
    let (id_at, id) = poll("the SpurJob's id", cluster, || {
        id_watch.first(|l| l.parse::<u64>().is_ok())
    });
    let ready = jsonpath(
        cluster,
        &["get", "pod", "-n", "spur", &pod],
        "{.status.conditions[?(@.type==\"Ready\")].status}",
    );
    let id_after = seconds_between(elected.at, id_at);
    println!(
        "{name}: struck {pod} (the leader); N{} elected {:.2} s after; SpurJob id {id} \
         {:.2} s after the strike, {id_after:.2} s after the election; the struck pod's \
         Ready is {ready}",
        elected.node,
        seconds_between(struck_at, elected.at),
        seconds_between(struck_at, id_at),
    );
    assert!(
        id_after <= ID_AFTER_ELECTION.as_secs_f64(),
        "{name}: the SpurJob got its id {id_after:.2} s after the election"
    );
    drop(undo);
    completes(cluster, name);
    (ready, elected, id_after)
}

/// Drops every packet in the pod's network namespace until dropped itself.
struct Cut {
    pid: u32,
}

const CUT_TABLE: &str = "spurstrike";

impl Cut {
    fn start(pid: u32) -> Cut {
        let rules = format!(
            "table inet {CUT_TABLE} {{\n\
             chain input {{ type filter hook input priority -300; policy drop; }}\n\
             chain output {{ type filter hook output priority -300; policy drop; }}\n}}\n"
        );
        nft_in(pid, &["-f", "-"], Some(&rules));
        Cut { pid }
    }
}

impl Drop for Cut {
    fn drop(&mut self) {
        nft_in(self.pid, &["delete", "table", "inet", CUT_TABLE], None);
    }
}

/// Runs nft in the network namespace of process `pid`.
fn nft_in(pid: u32, args: &[&str], stdin: Option<&str>) {
    use std::io::Write as _;
    let mut child = std::process::Command::new("nsenter")
        .arg(format!("--net=/proc/{pid}/ns/net"))
        .arg("nft")
        .args(args)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("run nsenter nft");
    let mut input = child.stdin.take().expect("piped");
    input
        .write_all(stdin.unwrap_or_default().as_bytes())
        .expect("write the rules");
    drop(input);
    let status = child.wait().expect("wait for nft");
    assert!(
        status.success(),
        "nft {args:?} in the netns of {pid}: {status}"
    );
}

#[test]
fn the_spurctld_leader_frozen_then_cut_off_a_survivor_is_elected_and_each_spurjob_gets_its_id_soon_after()
 {
    if !runnable() {
        return;
    }
    let cluster = ClusterProcess::deployed("strike");
    let (ready, _, _) = strike_the_leader(&cluster, "frozen", |pids| {
        signal_all(pids, libc::SIGSTOP);
        Frozen(pids.to_vec())
    });
    assert_eq!(ready, "True", "a frozen pod passes its tcpSocket probe");
    strike_the_leader(&cluster, "cut-off", |pids| Cut::start(pids[0]));
    cluster.stop();
}
