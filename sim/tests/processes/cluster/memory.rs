//! Memory limits enforced by the kernel through each container's cgroup: a pod over its
//! limit is `OOMKilled`/137 with an event, one under it completes, one that restarts counts
//! its OOM kills; and a ConfigMap edited under a running pod reaches its mounted file
//! but not its `subPath` mount. The pods name their node, since the cluster's scheduler
//! places only the pods of workloads.

use std::time::{Duration, Instant};

use super::{ClusterProcess, logs, runnable};

/// Allocates 200 MB (`tail` keeps a line with no newline whole) against a 32Mi limit.
const HOG: &str = "head -c 200000000 /dev/zero | tail";
/// The same pipeline at 1 MB, well under the limit.
const MODEST: &str = "head -c 1000000 /dev/zero | tail >/dev/null";

const PODS: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: hog}
spec:
  nodeName: node-0
  restartPolicy: Never
  containers:
    - name: hog
      image: busybox:1.36
      command: [sh, -c, "HOG"]
      resources: {limits: {memory: 32Mi}}
---
apiVersion: v1
kind: Pod
metadata: {name: modest}
spec:
  nodeName: node-0
  restartPolicy: Never
  containers:
    - name: modest
      image: busybox:1.36
      command: [sh, -c, "MODEST"]
      resources: {limits: {memory: 32Mi}}
---
apiVersion: v1
kind: Pod
metadata: {name: hog-again}
spec:
  nodeName: node-0
  restartPolicy: Always
  containers:
    - name: hog
      image: busybox:1.36
      command: [sh, -c, "HOG"]
      resources: {limits: {memory: 32Mi}}
"#;

const READER: &str = r#"
apiVersion: v1
kind: ConfigMap
metadata: {name: settings}
data: {greeting: hello}
---
apiVersion: v1
kind: Pod
metadata: {name: reader}
spec:
  nodeName: node-1
  containers:
    - name: reader
      image: busybox:1.36
      command: [sh, -c, 'while true; do echo "now=$(cat /etc/settings/greeting) pinned=$(cat /etc/pinned/greeting)"; sleep 0.3; done']
      volumeMounts:
        - {name: settings, mountPath: /etc/settings}
        - {name: settings, mountPath: /etc/pinned/greeting, subPath: greeting}
  volumes:
    - name: settings
      configMap: {name: settings}
"#;

#[test]
fn memory_limits_kill_with_oomkilled_and_configmap_edits_reach_running_pods() {
    if !runnable() {
        return;
    }
    let cluster = ClusterProcess::start("memory");
    let pid = cluster.child.id();
    let manifest = cluster.dir.join("memory.yaml");
    let pods = PODS.replace("HOG", HOG).replace("MODEST", MODEST);
    std::fs::write(&manifest, format!("{pods}---{READER}")).expect("write the pods");
    cluster.apply(&["-f", &manifest.display().to_string()]);

    let hog = wait_for(&cluster, "hog", "{.status.phase}", "Failed", 60);
    let terminated = ".status.containerStatuses[0].state.terminated";
    let reason = get(&cluster, "hog", &format!("{{{terminated}.reason}}"));
    let code = get(&cluster, "hog", &format!("{{{terminated}.exitCode}}"));
    assert_eq!(
        (hog.as_str(), reason.as_str(), code.as_str()),
        ("Failed", "OOMKilled", "137"),
        "the pod over its limit\n{}",
        cluster.diagnose()
    );
    let events = cluster.kubectl(&[
        "get",
        "events",
        "-o",
        r#"jsonpath={range .items[*]}{.involvedObject.name}/{.reason}{"\n"}{end}"#,
    ]);
    assert!(
        events.1.lines().any(|l| l == "hog/OOMKilled"),
        "an OOMKilled event on the pod: {}",
        events.1
    );
    let modest = wait_for(&cluster, "modest", "{.status.phase}", "Succeeded", 60);
    assert_eq!(
        modest,
        "Succeeded",
        "the pod under its limit\n{}",
        cluster.diagnose()
    );

    let count = "{.status.containerStatuses[0].restartCount}";
    let restarts = wait_for(&cluster, "hog-again", count, "1", 60);
    let last = "{.status.containerStatuses[0].lastState.terminated.reason}";
    let again = get(&cluster, "hog-again", last);
    assert!(
        again == "OOMKilled" && restarts.parse::<u32>().is_ok_and(|n| n >= 1),
        "restartPolicy Always restarts an OOM-killed container after the back-off: last \
         {again:?}, {restarts} restarts\n{}",
        cluster.diagnose()
    );

    a_configmap_edit_reaches_the_running_pods_file(&cluster);
    cluster.stop();
    let left: Vec<_> = ["/sys/fs/cgroup/memory", "/sys/fs/cgroup"]
        .iter()
        .map(|root| std::path::Path::new(root).join(format!("spur-cluster-{pid}")))
        .filter(|p| p.exists())
        .collect();
    assert!(left.is_empty(), "cgroups {left:?} outlived the cluster");
}

/// The reader prints its mounted file; after `kubectl patch` of a new value, the file
/// shows it within the kubelet's refresh, while its `subPath` mount of the same key keeps
/// the value it started with, as Kubernetes' does.
fn a_configmap_edit_reaches_the_running_pods_file(cluster: &ClusterProcess) {
    wait_for(cluster, "reader", "{.status.phase}", "Running", 60);
    wait_for_log(cluster, "now=hello pinned=hello", Duration::from_secs(30));
    let (ok, out) = cluster.kubectl(&[
        "patch",
        "configmap",
        "settings",
        "--type=merge",
        "-p",
        r#"{"data":{"greeting":"goodbye"}}"#,
    ]);
    assert!(ok, "kubectl patch configmap: {out}");
    let edited = Instant::now();
    wait_for_log(cluster, "now=goodbye pinned=hello", Duration::from_secs(30));
    println!(
        "the edit reached the pod's file {:?} after kubectl patch",
        edited.elapsed()
    );
}

/// Polls `kubectl get pod name -o jsonpath=path` until it prints `want`, for `seconds`;
/// the last output.
fn wait_for(cluster: &ClusterProcess, name: &str, path: &str, want: &str, seconds: u64) -> String {
    let deadline = Instant::now() + Duration::from_secs(seconds);
    loop {
        let seen = get(cluster, name, path);
        if seen == want || Instant::now() >= deadline {
            return seen;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

fn get(cluster: &ClusterProcess, name: &str, path: &str) -> String {
    let jsonpath = format!("jsonpath={path}");
    cluster
        .kubectl(&["get", "pod", name, "-o", &jsonpath])
        .1
        .trim()
        .to_owned()
}

/// Waits until the reader's log has a line `line`, or fails with what it printed.
fn wait_for_log(cluster: &ClusterProcess, line: &str, within: Duration) {
    let deadline = Instant::now() + within;
    let read = || {
        let logs = logs(&cluster.dir.join("logs"));
        let log = logs
            .iter()
            .find(|l| l.to_string_lossy().contains("_reader_"));
        log.map(|l| std::fs::read_to_string(l).unwrap_or_default())
            .unwrap_or_default()
    };
    while Instant::now() < deadline {
        if read().lines().any(|l| l == line) {
            return;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    let text = read();
    let tail: Vec<&str> = text.lines().rev().take(5).collect();
    panic!("the reader never printed {line:?} within {within:?}; last lines {tail:?}");
}
