//! Least privilege, measured: the operator runs as its ServiceAccount under
//! `deploy/rbac.yaml` as applied, and the API server authorises it by RBAC. Under the
//! whole file a healthy run is never refused; without any one rule, the smallest thing
//! that needs it fails and the API server answered 403 for it.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use serde_json::{Value, json};
use spur_fakes::api_server::install::{RBAC_YAML, operator_rbac};
use spur_proto as pb;
use spur_sim::harness::{OPERATOR_NAMESPACE, Sim};
use tonic::transport::Endpoint;

const RBAC_V1: &str = "rbac.authorization.k8s.io/v1";
const OPERATOR_USER: &str = "system:serviceaccount:spur-system:spur-operator";

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// A rule of `deploy/rbac.yaml`: the role holding it and its first resource.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Rule {
    role: (&'static str, &'static str),
    group: &'static str,
    resource: &'static str,
}

const CLUSTER_ROLE: (&str, &str) = ("ClusterRole", "spur-operator");
const LEASE_ROLE: (&str, &str) = ("Role", "spur-operator-lease");

const fn rule(
    role: (&'static str, &'static str),
    group: &'static str,
    resource: &'static str,
) -> Rule {
    Rule {
        role,
        group,
        resource,
    }
}

/// Every rule of the file, each earned by the test named beside it.
const EARNED: [(Rule, &str); 11] = [
    (
        rule(CLUSTER_ROLE, "", "nodes"),
        "without_nodes_no_node_is_registered",
    ),
    (
        rule(CLUSTER_ROLE, "spur.amd.com", "spurjobs"),
        "without_spurjobs_no_job_is_submitted",
    ),
    (
        rule(CLUSTER_ROLE, "spur.amd.com", "spurjobs/status"),
        "without_spurjobs_status_the_state_is_never_mirrored",
    ),
    (
        rule(CLUSTER_ROLE, "spur.amd.com", "spurjobs/finalizers"),
        "without_spurjobs_finalizers_no_pod_may_block_its_owners_deletion",
    ),
    (
        rule(CLUSTER_ROLE, "", "pods"),
        "without_pods_no_pod_is_created",
    ),
    (
        rule(CLUSTER_ROLE, "", "pods/exec"),
        "without_pods_exec_spur_exec_fails",
    ),
    (
        rule(CLUSTER_ROLE, "", "pods/log"),
        "without_pods_log_a_jobs_output_cannot_be_followed",
    ),
    (
        rule(CLUSTER_ROLE, "", "services"),
        "without_services_a_multi_node_job_gets_no_service",
    ),
    (
        rule(CLUSTER_ROLE, "events.k8s.io", "events"),
        "without_events_an_invalid_spurjob_gets_no_warning",
    ),
    (
        rule(LEASE_ROLE, "coordination.k8s.io", "leases"),
        "without_leases_no_replica_leads",
    ),
    (
        rule(LEASE_ROLE, "", "configmaps"),
        "without_configmaps_a_replica_takes_the_lease_while_the_config_map_lock_is_renewed",
    ),
];

#[test]
fn every_rule_of_the_file_is_earned_by_a_test() {
    let mut in_file = Vec::new();
    for doc in operator_rbac(OPERATOR_NAMESPACE) {
        for r in doc["rules"].as_array().into_iter().flatten() {
            let first = |key: &str| r[key][0].as_str().unwrap_or_default().to_owned();
            in_file.push((
                doc["kind"].as_str().unwrap().to_owned(),
                first("apiGroups"),
                first("resources"),
            ));
        }
    }
    let earned: Vec<(String, String, String)> = EARNED
        .iter()
        .map(|(r, _)| {
            (
                r.role.0.to_owned(),
                r.group.to_owned(),
                r.resource.to_owned(),
            )
        })
        .collect();
    assert_eq!(
        in_file, earned,
        "a rule of deploy/rbac.yaml without a test (or the reverse)"
    );
    assert!(RBAC_YAML.contains("name: spur-operator"));
}

/// A world whose operator's roles lack `dropped`.
fn world(seed: u64, dropped: Option<Rule>) -> Sim {
    let sim = Sim::new(seed);
    if let Some(dropped) = dropped {
        set_rules(&sim, dropped.role, |rules| {
            rules.retain(|r| {
                !(r["apiGroups"][0] == dropped.group && r["resources"][0] == dropped.resource)
            });
        });
    }
    sim
}

/// Rewrites the rules of one of the operator's roles, as `kubectl edit` would.
fn set_rules(sim: &Sim, role: (&str, &str), edit: impl FnOnce(&mut Vec<Value>)) {
    let namespace = (role.0 == "Role").then_some(OPERATOR_NAMESPACE);
    let current = sim
        .api
        .get(RBAC_V1, role.0, namespace, role.1)
        .expect("the role");
    let mut rules = current["rules"].as_array().cloned().unwrap_or_default();
    let before = rules.len();
    edit(&mut rules);
    assert!(rules.len() <= before);
    sim.api
        .merge_patch(
            RBAC_V1,
            role.0,
            namespace,
            role.1,
            &json!({"rules": rules}),
            false,
        )
        .expect("edit the role");
}

/// Starts nodes, the kubelet and one operator replica.
fn start(sim: &mut Sim) {
    sim.add_nodes(2);
    sim.start_kubelet();
    sim.start_operator("operator", &[]);
}

/// The 403s the operator received, as messages.
fn refusals(sim: &Sim) -> Vec<String> {
    sim.api
        .denials()
        .into_iter()
        .filter(|d| d.code == 403 && d.user.as_deref() == Some(OPERATOR_USER))
        .map(|d| d.message)
        .collect()
}

/// Asserts the API server refused the operator `what` (a part of the 403's message).
fn assert_refused(sim: &Sim, what: &str) {
    let refused = refusals(sim);
    assert!(
        refused.iter().any(|m| m.contains(what)),
        "no 403 containing {what:?} among {refused:#?}"
    );
}

fn spurjob(sim: &Sim, name: &str) -> Value {
    sim.spurjob("default", name).expect("the SpurJob exists")
}

/// A one-node job running `run_secs`, created once the operator is up.
fn run_job(sim: &mut Sim, name: &str, extra: Value, run_secs: u64, until: u64) {
    sim.world.run_until(secs(10)).unwrap();
    let mut spec = json!({"image": "busybox", "env": {"SIM_RUN_SECONDS": run_secs.to_string(),
        "SIM_STDOUT": "hello from the job"}});
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
        spec.extend(extra.clone());
    }
    sim.create_spurjob("default", name, spec);
    sim.world.run_until(secs(until)).unwrap();
}

/// What a `spur exec` and a `sattach` of job `id` got from the operator's agent.
#[derive(Debug, Default)]
struct JobIo {
    exec: Option<Result<pb::ExecInJobResponse, tonic::Status>>,
    output: Option<Result<String, tonic::Status>>,
}

/// At simulated second `at`, calls the operator's agent as spur's CLI would: an exec and a
/// followed output of the SpurJob `name`'s job.
fn job_io_at(sim: &mut Sim, name: &str, at: u64) -> Rc<RefCell<JobIo>> {
    sim.world.run_until(secs(at)).unwrap();
    let id = spurjob(sim, name)["status"]["spurJobId"]
        .as_u64()
        .expect("submitted") as u32;
    let got = Rc::new(RefCell::new(JobIo::default()));
    let dialer = sim.world.plain_dialer("cli");
    let out = got.clone();
    sim.world.client("cli", async move {
        let endpoint = Endpoint::from_shared(format!("http://operator:{}", pb::AGENT_PORT))?;
        let channel = endpoint
            .connect_with_connector(spur_operator::net::Connector::new(dialer))
            .await?;
        let mut agent = pb::SlurmAgentClient::new(channel);
        let exec = agent
            .exec_in_job(pb::ExecInJobRequest {
                job_id: id,
                command: vec!["echo".into(), "hi".into()],
                user: "k8s".into(),
            })
            .await
            .map(tonic::Response::into_inner);
        out.borrow_mut().exec = Some(exec);
        let request = pb::StreamJobOutputRequest {
            job_id: id,
            stream: "stdout".into(),
            user: "k8s".into(),
        };
        let output = match agent.stream_job_output(request).await {
            Ok(stream) => read_output(stream.into_inner()).await,
            Err(status) => Err(status),
        };
        out.borrow_mut().output = Some(output);
        Ok(())
    });
    got
}

async fn read_output(
    mut stream: tonic::Streaming<pb::StreamJobOutputChunk>,
) -> Result<String, tonic::Status> {
    let mut text = Vec::new();
    while let Some(chunk) = stream.message().await? {
        text.extend(chunk.data);
        if chunk.eof {
            break;
        }
    }
    Ok(String::from_utf8_lossy(&text).into_owned())
}

#[test]
fn the_operator_under_the_whole_file_is_never_refused() {
    let mut sim = world(41, None);
    start(&mut sim);
    sim.world.run_until(secs(10)).unwrap();
    sim.create_spurjob(
        "default",
        "bad",
        json!({"image": "busybox", "timeLimit": "4 fortnights"}),
    );
    sim.create_spurjob(
        "default",
        "pair",
        json!({"image": "busybox", "numNodes": 2,
        "env": {"SIM_RUN_SECONDS": "5"}}),
    );
    run_job(&mut sim, "one", json!({}), 30, 15);
    let io = job_io_at(&mut sim, "one", 25);
    sim.world.run_until(secs(70)).unwrap();
    sim.api
        .delete("spur.amd.com/v1alpha1", "SpurJob", Some("default"), "pair")
        .unwrap();
    sim.world.run_until(secs(80)).unwrap();

    assert_eq!(sim.api.denials(), [], "nobody was refused");
    assert_eq!(sim.registered_nodes().len(), 2);
    assert_eq!(spurjob(&sim, "one")["status"]["state"], "Completed");
    let bad = &spurjob(&sim, "bad")["status"];
    assert!(
        bad["message"]
            .as_str()
            .unwrap_or_default()
            .starts_with("spec.timeLimit:"),
        "{bad:#}"
    );
    assert!(
        sim.api
            .list("events.k8s.io/v1", "Event")
            .unwrap()
            .iter()
            .any(|e| e["reason"] == "InvalidSpec"),
        "a Warning event names the invalid SpurJob"
    );
    assert!(
        sim.spurjob("default", "pair").is_none(),
        "the finalizer was removed"
    );
    let io = io.borrow();
    let exec = io
        .exec
        .as_ref()
        .expect("exec answered")
        .as_ref()
        .expect("exec ran");
    assert_eq!((exec.exit_code, exec.stdout.as_str()), (0, "hi\n"));
    let output = io
        .output
        .as_ref()
        .expect("output answered")
        .as_ref()
        .expect("output read");
    assert!(output.contains("hello from the job"), "{output:?}");
}

#[test]
fn without_nodes_no_node_is_registered() {
    let mut sim = world(42, Some(EARNED[0].0));
    start(&mut sim);
    sim.world.run_until(secs(20)).unwrap();
    assert_eq!(sim.registered_nodes(), Vec::<String>::new());
    assert_refused(
        &sim,
        "cannot list resource \"nodes\" in API group \"\" at the cluster scope",
    );
}

#[test]
fn without_spurjobs_no_job_is_submitted() {
    let mut sim = world(43, Some(EARNED[1].0));
    start(&mut sim);
    run_job(&mut sim, "j", json!({}), 5, 40);
    assert!(spurjob(&sim, "j")["status"].is_null());
    assert_eq!(sim.world.cluster().job_ids(), Vec::<u32>::new());
    assert_refused(
        &sim,
        "cannot list resource \"spurjobs\" in API group \"spur.amd.com\" at the cluster scope",
    );
}

#[test]
fn without_spurjobs_status_the_state_is_never_mirrored() {
    let mut sim = world(44, Some(EARNED[2].0));
    start(&mut sim);
    run_job(&mut sim, "j", json!({}), 5, 40);
    assert!(
        spurjob(&sim, "j")["status"]["state"].is_null(),
        "{}",
        spurjob(&sim, "j")
    );
    assert_refused(
        &sim,
        "spurjobs.spur.amd.com \"j\" is forbidden: User \"system:serviceaccount:spur-system:spur-operator\" cannot patch resource \"spurjobs/status\" in API group \"spur.amd.com\" in the namespace \"default\"",
    );
}

#[test]
fn without_spurjobs_finalizers_no_pod_may_block_its_owners_deletion() {
    let mut sim = world(45, Some(EARNED[3].0));
    start(&mut sim);
    run_job(&mut sim, "j", json!({}), 5, 40);
    assert_eq!(sim.pods("default"), Vec::<Value>::new());
    assert_ne!(spurjob(&sim, "j")["status"]["state"], "Completed");
    assert_refused(
        &sim,
        "cannot set blockOwnerDeletion if an ownerReference refers to a resource you can't set finalizers on: User \"system:serviceaccount:spur-system:spur-operator\" cannot update resource \"spurjobs/finalizers\" in API group \"spur.amd.com\" in the namespace \"default\"",
    );
}

#[test]
fn without_pods_no_pod_is_created() {
    let mut sim = world(46, Some(EARNED[4].0));
    start(&mut sim);
    run_job(&mut sim, "j", json!({}), 5, 40);
    assert_eq!(sim.pods("default"), Vec::<Value>::new());
    assert_ne!(spurjob(&sim, "j")["status"]["state"], "Completed");
    assert_refused(
        &sim,
        "cannot create resource \"pods\" in API group \"\" in the namespace \"default\"",
    );
}

/// The exec and output of a running job in world `sim` (its roles edited already).
fn job_io_in(mut sim: Sim) -> (Sim, Rc<RefCell<JobIo>>) {
    start(&mut sim);
    run_job(&mut sim, "j", json!({}), 60, 15);
    let io = job_io_at(&mut sim, "j", 25);
    sim.world.run_until(secs(30)).unwrap();
    (sim, io)
}

#[test]
fn without_pods_exec_spur_exec_fails() {
    let (sim, io) = job_io_in(world(47, Some(EARNED[5].0)));
    let exec = io.borrow_mut().exec.take().expect("exec answered");
    assert!(exec.is_err(), "{exec:?}");
    assert_refused(
        &sim,
        "cannot create resource \"pods/exec\" in API group \"\" in the namespace \"default\"",
    );
}

/// The rule's `get`: what an older API server authorises a WebSocket exec as.
#[test]
fn without_get_on_pods_exec_an_older_api_server_refuses_spur_exec() {
    let sim = world(52, None);
    sim.api.authorize_exec_upgrade_as_get(true);
    set_rules(&sim, CLUSTER_ROLE, |rules| {
        for r in rules
            .iter_mut()
            .filter(|r| r["resources"][0] == "pods/exec")
        {
            r["verbs"].as_array_mut().unwrap().retain(|v| v != "get");
        }
    });
    let (sim, io) = job_io_in(sim);
    let exec = io.borrow_mut().exec.take().expect("exec answered");
    assert!(exec.is_err(), "{exec:?}");
    assert_refused(
        &sim,
        "cannot get resource \"pods/exec\" in API group \"\" in the namespace \"default\"",
    );
}

#[test]
fn without_pods_log_a_jobs_output_cannot_be_followed() {
    let (sim, io) = job_io_in(world(48, Some(EARNED[6].0)));
    let output = io.borrow_mut().output.take().expect("output answered");
    assert!(output.is_err(), "{output:?}");
    assert_refused(
        &sim,
        "cannot get resource \"pods/log\" in API group \"\" in the namespace \"default\"",
    );
}

#[test]
fn without_services_a_multi_node_job_gets_no_service() {
    let mut sim = world(49, Some(EARNED[7].0));
    start(&mut sim);
    run_job(&mut sim, "pair", json!({"numNodes": 2}), 5, 40);
    assert_eq!(sim.api.list("v1", "Service").unwrap(), Vec::<Value>::new());
    assert_ne!(spurjob(&sim, "pair")["status"]["state"], "Completed");
    assert_refused(
        &sim,
        "cannot create resource \"services\" in API group \"\" in the namespace \"default\"",
    );
}

#[test]
fn without_events_an_invalid_spurjob_gets_no_warning() {
    let mut sim = world(50, Some(EARNED[8].0));
    start(&mut sim);
    run_job(&mut sim, "bad", json!({"timeLimit": "4 fortnights"}), 5, 30);
    let status = &spurjob(&sim, "bad")["status"];
    let message = status["message"].as_str().unwrap_or_default();
    assert!(message.starts_with("spec.timeLimit:"), "{status:#}");
    assert_eq!(
        sim.api.list("events.k8s.io/v1", "Event").unwrap(),
        Vec::<Value>::new()
    );
    assert_refused(
        &sim,
        "cannot create resource \"events\" in API group \"events.k8s.io\" in the namespace \"default\"",
    );
}

#[test]
fn without_leases_no_replica_leads() {
    let mut sim = world(51, Some(EARNED[9].0));
    start(&mut sim);
    sim.world.run_until(secs(30)).unwrap();
    assert_eq!(sim.leading_operators(), Vec::<String>::new());
    assert_eq!(sim.registered_nodes(), Vec::<String>::new());
    assert_refused(
        &sim,
        "leases.coordination.k8s.io \"spur-operator\" is forbidden: User \"system:serviceaccount:spur-system:spur-operator\" cannot get resource \"leases\" in API group \"coordination.k8s.io\" in the namespace \"spur-system\"",
    );
}

/// Runs 30 s in which a replica of the ConfigMap era (one that elected with the leader
/// annotation while leases were refused to it) renews that lock every second.
fn with_the_config_map_lock_renewed(sim: &mut Sim) {
    let record = |second: u64| {
        json!({"holderIdentity": "configmap-era-replica", "leaseDurationSeconds": 15,
            "renewTime": format!("2026-01-01T00:00:{second:02}.000000Z"), "leaderTransitions": 0})
        .to_string()
    };
    let annotations = |second| json!({"control-plane.alpha.kubernetes.io/leader": record(second)});
    sim.api
        .create(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "spur-operator", "namespace": OPERATOR_NAMESPACE,
                "annotations": annotations(0)}}))
        .expect("the ConfigMap lock");
    start(sim);
    for second in 1..30 {
        sim.world.run_until(secs(second)).unwrap();
        let renewed = json!({"metadata": {"annotations": annotations(second)}});
        sim.api
            .merge_patch(
                "v1",
                "ConfigMap",
                Some(OPERATOR_NAMESPACE),
                "spur-operator",
                &renewed,
                false,
            )
            .expect("renew the ConfigMap lock");
    }
}

#[test]
fn with_configmaps_no_replica_takes_the_lease_while_the_config_map_lock_is_renewed() {
    let mut sim = world(52, None);
    with_the_config_map_lock_renewed(&mut sim);
    assert_eq!(sim.leading_operators(), Vec::<String>::new());
    assert_eq!(sim.api.denials(), [], "nobody was refused");
}

#[test]
fn without_configmaps_a_replica_takes_the_lease_while_the_config_map_lock_is_renewed() {
    let mut sim = world(52, Some(EARNED[10].0));
    with_the_config_map_lock_renewed(&mut sim);
    assert_eq!(
        sim.leading_operators(),
        ["operator"],
        "two replicas act at once"
    );
    assert_refused(
        &sim,
        "configmaps \"spur-operator\" is forbidden: User \"system:serviceaccount:spur-system:spur-operator\" cannot get resource \"configmaps\"",
    );
}
