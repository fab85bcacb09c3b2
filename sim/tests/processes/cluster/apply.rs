//! `deploy/` and upstream's operator manifests applied to the cluster, each completing a
//! SpurJob; then upstream's HA scenario, each spurctld pod deleted in turn.

use std::time::{Duration, Instant};

use super::{ClusterProcess, completes, runnable, wait_for_state, workspace};

/// Upstream's manifests as a migrating user has them (spurctld's StatefulSet, upstream's
/// operator Deployment, Service and RBAC), with this project's operator run for upstream's
/// `spur-k8s-operator` command: spurctld reaches it through the Service's clusterIP.
#[test]
fn upstreams_manifests_with_our_operator_complete_a_spurjob() {
    if !runnable() {
        return;
    }
    let cluster = ClusterProcess::start("upstream");
    let examples = workspace().join("deploy/examples/cluster");
    let file = |name: &str| examples.join(name).display().to_string();
    cluster.apply(&[
        "-f",
        &workspace().join("deploy/crd.yaml").display().to_string(),
    ]);
    cluster.apply(&[
        "-f",
        &file("spurctld.yaml"),
        "-f",
        &file("upstream-operator.yaml"),
    ]);
    cluster.apply(&["-f", &file("hello.yaml")]);
    completes(&cluster, "hello");
    cluster.stop();
}

#[test]
fn deploy_applied_to_a_cluster_of_processes_completes_a_spurjob() {
    if !runnable() {
        return;
    }
    let cluster = ClusterProcess::deployed("deploy");
    let (_, leases) = cluster.kubectl(&[
        "get",
        "lease",
        "-n",
        "spur-system",
        "-o",
        "jsonpath={.items[*].spec.holderIdentity}",
    ]);
    assert!(
        leases.trim().starts_with("spur-operator-"),
        "one operator replica holds the Lease: {leases:?}"
    );
    each_spurctld_pod_deleted_a_spurjob_created_meanwhile_completes(&cluster);
    cluster.stop();
}

/// Upstream's HA scenario, each replica in turn (one of them leads): a spurctld pod
/// deleted, a SpurJob created at once; the StatefulSet brings the pod back under its name
/// with its claim, and the SpurJob completes.
fn each_spurctld_pod_deleted_a_spurjob_created_meanwhile_completes(cluster: &ClusterProcess) {
    let hello = std::fs::read_to_string(workspace().join("deploy/examples/cluster/hello.yaml"))
        .expect("read hello.yaml");
    for replica in 0..3 {
        let pod = format!("spurctld-{replica}");
        let (deleted, out) =
            cluster.kubectl(&["delete", "pod", "-n", "spur", &pod, "--wait=false"]);
        assert!(deleted, "kubectl delete pod {pod}: {out}");
        let name = format!("hello-after-{pod}");
        let manifest = cluster.dir.join(format!("{name}.yaml"));
        std::fs::write(
            &manifest,
            hello.replace("name: hello\n", &format!("name: {name}\n")),
        )
        .expect("write the SpurJob");
        cluster.apply(&["-f", &manifest.display().to_string()]);
        let started = Instant::now();
        let state = wait_for_state(cluster, &name, "Completed", Duration::from_secs(150));
        assert!(
            state == "Completed",
            "SpurJob {name} is {state:?} after {:?}\n{}",
            started.elapsed(),
            cluster.diagnose()
        );
        println!(
            "SpurJob {name} Completed {:?} after {pod} was deleted",
            started.elapsed()
        );
    }
    let (_, pods) = cluster.kubectl(&[
        "get",
        "pods",
        "-n",
        "spur",
        "-o",
        "jsonpath={range .items[*]}{.metadata.name}={.status.phase} {end}",
    ]);
    for replica in 0..3 {
        assert!(
            pods.contains(&format!("spurctld-{replica}=Running")),
            "the StatefulSet brought every replica back under its name: {pods}"
        );
    }
}
