//! Our operator in upstream's world: started as upstream's `operator.yaml` starts upstream's
//! (its flags, no subcommand; `POD_IP`, `POD_NAMESPACE`, `SPUR_OPERATOR_ADDRESS`), acting as
//! the `default` ServiceAccount of namespace `spur` under upstream's ClusterRole with RBAC
//! enforced, against the real spurctld; SpurJobs in `spur` and in `spur-user1`, the second
//! namespace upstream's suite makes. Each ends as upstream's users expect.

use std::time::Duration;

use serde_json::json;
use tokio::time::Instant;

use super::stack::{Stack, StackConfig, UPSTREAM_NAMESPACE};
use super::{e2e, job_spec};

/// The second namespace, named as upstream's suite names it (`<namespace>-user1`).
const USER_NAMESPACE: &str = "spur-user1";

async fn ends_as(stack: &Stack, namespace: &str, name: &str, want: &str, since: Instant) {
    stack
        .until(
            &format!("{namespace}/{name}: {want}"),
            since,
            Duration::from_secs(60),
            |s| s.state_in(namespace, name).as_deref() == Some(want),
        )
        .await;
}

#[test]
fn upstreams_layout_runs_spurjobs_in_two_namespaces() {
    let config = StackConfig {
        upstream_layout: true,
        namespaces: vec![USER_NAMESPACE.to_owned()],
        ..StackConfig::default()
    };
    e2e(config, |stack| async move {
        let start = Instant::now();
        let ns = UPSTREAM_NAMESPACE;
        stack.create_spurjob_in(ns, "it-simple", job_spec(json!({})));
        stack.create_spurjob_in(USER_NAMESPACE, "it-cross-ns", job_spec(json!({})));
        let failing = json!({"env": {"SIM_RUN_SECONDS": "1", "SIM_EXIT_CODE": "42"}});
        stack.create_spurjob_in(ns, "it-fail", job_spec(failing));
        let long = json!({"env": {"SIM_RUN_SECONDS": "600"}});
        stack.create_spurjob_in(ns, "it-cancel", job_spec(long));
        ends_as(&stack, ns, "it-simple", "Completed", start).await;
        ends_as(&stack, USER_NAMESPACE, "it-cross-ns", "Completed", start).await;
        ends_as(&stack, ns, "it-fail", "Failed", start).await;
        for (namespace, name) in [(ns, "it-simple"), (USER_NAMESPACE, "it-cross-ns")] {
            let job = stack.spurjob_in(namespace, name).expect("the SpurJob");
            assert!(job["status"]["spurJobId"].is_u64(), "{job}");
        }
        // The cross-namespace job's pod ran in its own namespace, none leaked into `spur`.
        let pods = stack.api.list("v1", "Pod").unwrap_or_default();
        let in_namespace = |name: &str, namespace: &str| {
            pods.iter().any(|p| {
                p["metadata"]["labels"]["spur.amd.com/job-name"] == name
                    && p["metadata"]["namespace"] == namespace
            })
        };
        assert!(in_namespace("it-cross-ns", USER_NAMESPACE));
        assert!(!in_namespace("it-cross-ns", ns));
        // Cancellation: deleting a running SpurJob removes it and its pods.
        stack
            .until("it-cancel: running", start, Duration::from_secs(60), |s| {
                s.state_in(ns, "it-cancel").as_deref() == Some("Running")
            })
            .await;
        let deleted = Instant::now();
        stack.delete_spurjob_in(ns, "it-cancel");
        stack
            .until(
                "it-cancel: gone with its pods",
                deleted,
                Duration::from_secs(20),
                |s| {
                    s.spurjob_in(ns, "it-cancel").is_none()
                        && s.api.list("v1", "Pod").unwrap_or_default().iter().all(|p| {
                            p["metadata"]["labels"]["spur.amd.com/job-name"] != "it-cancel"
                        })
                },
            )
            .await;
        // The election ran on what upstream's ClusterRole grants: a ConfigMap in `spur`.
        let lock = stack
            .api
            .get("v1", "ConfigMap", Some(ns), "spur-operator")
            .expect("the ConfigMap lock in the pod's namespace");
        let record = lock["metadata"]["annotations"]["control-plane.alpha.kubernetes.io/leader"]
            .as_str()
            .unwrap_or_default();
        assert!(record.contains("holderIdentity"), "{lock}");
        // RBAC refused only what upstream's ClusterRole lacks and the operator does without:
        // the Lease, once (it then elects with the ConfigMap), and events.k8s.io, once per
        // Event written before the first refusal was met (then core Events).
        let refused: Vec<String> = stack.api.denials().into_iter().map(|d| d.request).collect();
        let lease =
            |r: &&String| r.starts_with("GET /apis/coordination.k8s.io/v1/namespaces/spur/leases/");
        let events = |r: &&String| r.starts_with("POST /apis/events.k8s.io/v1/");
        assert!(
            refused.iter().all(|r| lease(&r) || events(&r)),
            "{refused:?}"
        );
        assert_eq!(refused.iter().filter(lease).count(), 1, "{refused:?}");
        assert!(refused.iter().filter(events).count() <= 4, "{refused:?}");
        let core_events = stack.api.list("v1", "Event").unwrap_or_default();
        assert!(
            core_events
                .iter()
                .any(|e| e["involvedObject"]["name"] == "it-fail"),
            "a core Event names the failed SpurJob"
        );
        let log = stack.operator_log();
        assert!(
            log.contains("electing with ConfigMap spur/spur-operator"),
            "{}",
            stack.logs()
        );
        assert!(!log.contains("spur-system"), "{}", stack.logs());
        eprintln!(
            "e2e upstream layout: every case ended {:.1}s after start",
            start.elapsed().as_secs_f64()
        );
    });
}
