//! `kubectl apply -k deploy/` against the simulated API server, as CI's stand-in for a
//! cluster: the kustomization renders, kubectl finds every kind in discovery, a client
//! dry run accepts every object, a real apply creates them and a second apply changes
//! nothing it should not; then the example SpurJob is accepted by the installed CRD.

use crate::common;

use common::kubectl::KubeApiProcess;

/// The objects `deploy/` holds, as kubectl names them.
const OPERATOR_OBJECTS: [&str; 11] = [
    "namespace/spur-system",
    "customresourcedefinition.apiextensions.k8s.io/spurjobs.spur.amd.com",
    "serviceaccount/spur-operator",
    "role.rbac.authorization.k8s.io/spur-operator-lease",
    "clusterrole.rbac.authorization.k8s.io/spur-operator",
    "rolebinding.rbac.authorization.k8s.io/spur-operator-lease",
    "clusterrolebinding.rbac.authorization.k8s.io/spur-operator",
    "service/spur-operator-agent",
    "deployment.apps/spur-operator",
    "poddisruptionbudget.policy/spur-operator",
    "networkpolicy.networking.k8s.io/spur-operator",
];

fn deploy_dir(sub: &str) -> String {
    format!("{}/../deploy/{sub}", env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn kubectl_apply_dry_run_accepts_the_operator_manifests() {
    let server = KubeApiProcess::start("deploy-dry-run", 0);
    let out = server.kubectl(&["apply", "--dry-run=client", "-k", &deploy_dir("")], None);
    for object in OPERATOR_OBJECTS {
        assert!(
            out.contains(&format!("{object} created (dry run)")),
            "{object}: {out}"
        );
    }
    // A dry run leaves nothing behind.
    let (_, left) = server.try_kubectl(
        &["get", "deployments", "-n", "spur-system", "-o", "name"],
        None,
    );
    assert!(!left.contains("deployment.apps/spur-operator"), "{left}");

    let sweep = server.kubectl(
        &["apply", "--dry-run=client", "-k", &deploy_dir("sim-sweep")],
        None,
    );
    assert!(
        sweep.contains("job.batch/spur-sim-sweep created (dry run)"),
        "{sweep}"
    );
}

#[test]
fn applying_the_manifests_installs_the_operator_and_its_crd() {
    let server = KubeApiProcess::start("deploy-apply", 0);
    let out = server.kubectl(&["apply", "-k", &deploy_dir("")], None);
    for object in OPERATOR_OBJECTS {
        assert!(
            out.contains(&format!("{object} created")),
            "{object}: {out}"
        );
    }
    let again = server.kubectl(&["apply", "-k", &deploy_dir("")], None);
    assert!(
        again.contains("deployment.apps/spur-operator unchanged"),
        "{again}"
    );
    let replicas = server.kubectl(
        &[
            "get",
            "deployment",
            "spur-operator",
            "-n",
            "spur-system",
            "-o",
            "jsonpath={.spec.replicas}",
        ],
        None,
    );
    assert_eq!(replicas.trim(), "2");
    // The installed CRD serves SpurJobs: the example is accepted and shows in a table.
    let example = format!(
        "{}/../deploy/examples/spurjob.yaml",
        env!("CARGO_MANIFEST_DIR")
    );
    let created = server.kubectl(&["apply", "-f", &example], None);
    assert!(
        created.contains("spurjob.spur.amd.com/allreduce-smoke created"),
        "{created}"
    );
    let jobs = server.kubectl(&["get", "spurjobs", "-n", "default"], None);
    assert!(jobs.contains("allreduce-smoke"), "{jobs}");
}
