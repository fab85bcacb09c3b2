//! What `deploy/` and the Dockerfile promise, checked against the operator itself: the
//! Deployment's flags and environment parse with the operator's own command line, its
//! ports are the operator's defaults, RBAC grants exactly the calls the operator makes,
//! the example SpurJob converts, and the image runs the binary as the same non-root user.
//! `kubectl kustomize` renders the manifests (ci/install-deps.sh installs kubectl).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use clap::{Args, FromArgMatches, ValueEnum};
use serde_json::Value;
use spur_operator::LogFormat;
use spur_operator::RunArgs;
use spur_operator::SpurJob;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `kubectl kustomize <dir>` as JSON documents.
fn render(dir: &str) -> Vec<Value> {
    let kubectl = std::env::var("KUBECTL").unwrap_or_else(|_| "kubectl".into());
    let out = Command::new(&kubectl)
        .arg("kustomize")
        .arg(repo().join(dir))
        .output()
        .unwrap_or_else(|e| panic!("running {kubectl}: {e} (ci/install-deps.sh installs it)"));
    assert!(
        out.status.success(),
        "kubectl kustomize {dir} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|doc| {
            serde_yaml_ng::from_value::<Value>(serde::Deserialize::deserialize(doc).unwrap())
                .unwrap()
        })
        .collect()
}

fn one<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    let found: Vec<&Value> = docs
        .iter()
        .filter(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .collect();
    assert_eq!(found.len(), 1, "expected one {kind} {name}");
    found[0]
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap_or(&Vec::new())
        .iter()
        .map(|s| s.as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn the_kustomization_holds_every_object_in_the_operators_namespace() {
    let docs = render("deploy");
    let mut kinds: Vec<String> = docs
        .iter()
        .map(|d| {
            format!(
                "{}/{}",
                d["kind"].as_str().unwrap(),
                d["metadata"]["name"].as_str().unwrap()
            )
        })
        .collect();
    kinds.sort();
    assert_eq!(
        kinds,
        [
            "ClusterRole/spur-operator",
            "ClusterRoleBinding/spur-operator",
            "CustomResourceDefinition/spurjobs.spur.amd.com",
            "Deployment/spur-operator",
            "Namespace/spur-system",
            "NetworkPolicy/spur-operator",
            "PodDisruptionBudget/spur-operator",
            "Role/spur-operator-lease",
            "RoleBinding/spur-operator-lease",
            "Service/spur-operator-agent",
            "ServiceAccount/spur-operator",
        ]
    );
    for doc in &docs {
        let kind = doc["kind"].as_str().unwrap();
        let cluster_scoped = matches!(
            kind,
            "Namespace" | "CustomResourceDefinition" | "ClusterRole" | "ClusterRoleBinding"
        );
        if !cluster_scoped {
            assert_eq!(doc["metadata"]["namespace"], "spur-system", "{kind}");
        }
    }
    for binding in ["ClusterRoleBinding", "RoleBinding"] {
        let name = if binding == "RoleBinding" {
            "spur-operator-lease"
        } else {
            "spur-operator"
        };
        let subject = &one(&docs, binding, name)["subjects"][0];
        assert_eq!(subject["name"], "spur-operator");
        assert_eq!(subject["namespace"], "spur-system");
    }
}

/// Every (group, resource) the operator touches and the verbs its code uses; anything
/// broader (a wildcard, secrets, leases cluster-wide) fails here. That each rule is needed
/// is shown by `sim/tests/rbac.rs`, which runs the operator without it.
#[test]
fn rbac_grants_exactly_the_calls_the_operator_makes() {
    let docs = render("deploy");
    let rules = |doc: &Value| -> BTreeMap<String, Vec<String>> {
        let mut out = BTreeMap::new();
        for rule in doc["rules"].as_array().unwrap() {
            for group in strings(&rule["apiGroups"]) {
                for resource in strings(&rule["resources"]) {
                    let mut verbs = strings(&rule["verbs"]);
                    verbs.sort();
                    let old = out.insert(format!("{group}/{resource}"), verbs);
                    assert!(old.is_none(), "{group}/{resource} appears in two rules");
                }
            }
        }
        out
    };
    let expect = |pairs: &[(&str, &[&str])]| -> BTreeMap<String, Vec<String>> {
        pairs
            .iter()
            .map(|(k, verbs)| {
                let mut verbs: Vec<String> = verbs.iter().map(|v| (*v).to_owned()).collect();
                verbs.sort();
                ((*k).to_owned(), verbs)
            })
            .collect()
    };
    assert_eq!(
        rules(one(&docs, "ClusterRole", "spur-operator")),
        expect(&[
            ("/nodes", &["get", "list", "watch"]),
            (
                "/pods",
                &["create", "delete", "get", "list", "watch", "patch"]
            ),
            // spur exec (a WebSocket exec: create from Kubernetes 1.30, get before).
            ("/pods/exec", &["create", "get"]),
            // sattach and srun following a job's output.
            ("/pods/log", &["get"]),
            ("/services", &["create", "delete"]),
            ("events.k8s.io/events", &["create", "patch"]),
            ("spur.amd.com/spurjobs", &["list", "watch", "patch"]),
            ("spur.amd.com/spurjobs/status", &["patch"]),
            ("spur.amd.com/spurjobs/finalizers", &["update"]),
        ])
    );
    assert_eq!(
        rules(one(&docs, "Role", "spur-operator-lease")),
        expect(&[
            ("coordination.k8s.io/leases", &["get", "create", "update"]),
            // The ConfigMap lock, read before taking the Lease (lease::lock).
            ("/configmaps", &["get"]),
        ])
    );
}

/// The container's environment and arguments, resolved as the kubelet would (Downward API
/// fields from `fields`, `$(VAR)` references expanded), then handed to the operator's own
/// command line: every `SPUR_OPERATOR_*` variable must name one of its flags.
fn operator_command_line(container: &Value, fields: &BTreeMap<&str, &str>) -> Vec<String> {
    let mut env: BTreeMap<String, String> = BTreeMap::new();
    let mut order = Vec::new();
    for var in container["env"].as_array().unwrap() {
        let name = var["name"].as_str().unwrap().to_owned();
        let value = if let Some(path) = var["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
            fields
                .get(path)
                .unwrap_or_else(|| panic!("no sample for the Downward API field {path}"))
                .to_string()
        } else {
            let mut value = var["value"].as_str().unwrap().to_owned();
            for (k, v) in &env {
                value = value.replace(&format!("$({k})"), v);
            }
            assert!(
                !value.contains("$("),
                "{name}: unresolved reference in {value}"
            );
            value
        };
        env.insert(name.clone(), value);
        order.push(name);
    }
    let command = RunArgs::augment_args(clap::Command::new("run").no_binary_name(true));
    let mut line: Vec<String> = strings(&container["args"]);
    assert_eq!(line, ["run"], "the container runs `spur-operator run`");
    line.clear();
    for name in order.iter().filter(|n| n.starts_with("SPUR_OPERATOR_")) {
        if name == "SPUR_OPERATOR_LOG_FORMAT" {
            // A global flag of the binary, not of `run`.
            LogFormat::from_str(&env[name], false)
                .unwrap_or_else(|e| panic!("SPUR_OPERATOR_LOG_FORMAT: {e}"));
            continue;
        }
        let arg = command
            .get_arguments()
            .find(|a| a.get_env().is_some_and(|e| e == name.as_str()))
            .unwrap_or_else(|| panic!("{name} is not the environment variable of any flag"));
        line.push(format!("--{}={}", arg.get_long().unwrap(), env[name]));
    }
    line
}

#[test]
fn the_deployment_runs_the_operator_as_its_flags_expect() {
    let docs = render("deploy");
    let deployment = one(&docs, "Deployment", "spur-operator");
    let spec = &deployment["spec"];
    assert_eq!(spec["replicas"], 2, "one acting replica and a standby");
    let pod = &spec["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "spur-operator");
    let labels = &spec["template"]["metadata"]["labels"];
    assert_eq!(
        spec["selector"]["matchLabels"]["app.kubernetes.io/name"],
        labels["app.kubernetes.io/name"]
    );
    let container = &pod["containers"][0];

    let fields = BTreeMap::from([
        ("metadata.name", "spur-operator-7d9f-abcde"),
        ("metadata.namespace", "spur-system"),
        ("status.podIP", "127.0.0.1"),
    ]);
    let line = operator_command_line(container, &fields);
    let command = RunArgs::augment_args(clap::Command::new("run").no_binary_name(true));
    // Only the command line: the test's own environment must not fill in flags.
    let matches = command
        .try_get_matches_from(&line)
        .unwrap_or_else(|e| panic!("{line:?}: {e}"));
    let args = RunArgs::from_arg_matches(&matches).unwrap();
    let config = args.validate().unwrap_or_else(|e| panic!("{line:?}: {e}"));
    assert_eq!(config.lease.identity, "spur-operator-7d9f-abcde");
    assert_eq!(config.lease.namespace, "spur-system");
    assert_eq!(config.node_sync.agent.address, "127.0.0.1");

    // The ports the manifests name are the ones the operator listens on.
    let port = |name: &str| -> u64 {
        container["ports"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .unwrap_or_else(|| panic!("no container port {name}"))["containerPort"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(port("agent"), u64::from(config.agent_listen.port()));
    assert_eq!(port("http"), u64::from(config.health_listen.port()));
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    for probe in ["livenessProbe", "readinessProbe"] {
        assert_eq!(container[probe]["httpGet"]["port"], "http");
        // The probe must outlast /readyz's own bound, so a slow part answers with a reason.
        let timeout = container[probe]["timeoutSeconds"].as_u64().unwrap();
        assert!(
            timeout > config.probe_timeout.as_secs(),
            "{probe} timeout {timeout}s"
        );
    }
    // The grace period covers the operator's own drain, so the Lease is released.
    let grace = pod["terminationGracePeriodSeconds"].as_u64().unwrap();
    assert!(
        grace > config.shutdown_grace.as_secs(),
        "terminationGracePeriodSeconds {grace}"
    );
    for bound in ["requests", "limits"] {
        for what in ["cpu", "memory"] {
            assert!(
                container["resources"][bound][what].is_string(),
                "resources.{bound}.{what}"
            );
        }
    }

    // Hardened: non-root, read-only root, no escalation, no capabilities, RuntimeDefault.
    let security = &container["securityContext"];
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(security["readOnlyRootFilesystem"], true);
    assert_eq!(strings(&security["capabilities"]["drop"]), ["ALL"]);
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    let uid = pod["securityContext"]["runAsUser"].as_u64().unwrap();
    assert_ne!(uid, 0);
    assert_eq!(
        dockerfile_user(),
        uid,
        "the image's USER and the pod's runAsUser"
    );
}

#[test]
fn the_agent_port_is_reachable_only_from_spurctld() {
    let docs = render("deploy");
    let service = one(&docs, "Service", "spur-operator-agent");
    assert_eq!(service["spec"]["ports"][0]["port"], 6818);
    assert_eq!(service["spec"]["ports"][0]["targetPort"], "agent");
    assert_eq!(
        service["spec"]["clusterIP"], "None",
        "a load-balanced address would send launches to the standby"
    );
    let policy = &one(&docs, "NetworkPolicy", "spur-operator")["spec"];
    assert_eq!(strings(&policy["policyTypes"]), ["Ingress"]);
    let rules = policy["ingress"].as_array().unwrap();
    let admitting = |port: u64| -> Vec<&Value> {
        rules
            .iter()
            .filter(|r| {
                r["ports"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|p| p["port"] == port)
            })
            .collect()
    };
    let agent_rules = admitting(6818);
    assert_eq!(agent_rules.len(), 1);
    let from = agent_rules[0]["from"]
        .as_array()
        .expect("the agent port names its peers");
    assert_eq!(from.len(), 1);
    // Upstream's spurctld (issue 19): `app: spurctld` in namespace `spur`, both at once.
    assert_eq!(from[0]["podSelector"]["matchLabels"]["app"], "spurctld");
    assert_eq!(
        from[0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
        "spur"
    );
    assert_eq!(
        admitting(8080).len(),
        1,
        "probes and scrapes reach /healthz and /metrics"
    );

    let pdb = &one(&docs, "PodDisruptionBudget", "spur-operator")["spec"];
    assert_eq!(pdb["minAvailable"], 1);
    assert_eq!(
        pdb["selector"]["matchLabels"]["app.kubernetes.io/name"],
        "spur-operator"
    );
}

#[test]
fn the_example_spurjob_is_valid() {
    let text = std::fs::read_to_string(repo().join("deploy/examples/spurjob.yaml")).unwrap();
    let job: SpurJob = serde_yaml_ng::from_str(&text).unwrap();
    let spec = spur_operator::job_spec(&job, "uid-1")
        .unwrap_or_else(|e| panic!("the example SpurJob does not convert: {e}"));
    assert_eq!(spec.num_nodes, job.spec.num_nodes);
    assert!(spec.comment.contains("spurjob-uid=uid-1"));
}

#[test]
fn the_sim_sweep_job_shards_by_completion_index() {
    let docs = render("deploy/sim-sweep");
    let job = one(&docs, "Job", "spur-sim-sweep");
    let spec = &job["spec"];
    assert_eq!(spec["completionMode"], "Indexed");
    let shards = spec["completions"].as_u64().unwrap();
    let container = &spec["template"]["spec"]["containers"][0];
    let env: BTreeMap<String, String> = container["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            (
                v["name"].as_str().unwrap().to_owned(),
                v["value"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(env["SHARDS"], shards.to_string(), "one shard a completion");
    let args = strings(&container["args"]);
    assert_eq!(args[0], "run");
    assert!(
        args.contains(&"--shard=$(JOB_COMPLETION_INDEX)/$(SHARDS)".to_owned()),
        "{args:?}"
    );
    assert!(args.contains(&"--json".to_owned()), "{args:?}");
}

/// The Dockerfile's final stage, read as the image builder would.
struct FinalStage {
    from: String,
    user: Option<String>,
    entrypoint: Option<String>,
}

fn dockerfile() -> (String, FinalStage) {
    let text = std::fs::read_to_string(repo().join("Dockerfile")).unwrap();
    let mut stage = None;
    for line in text.lines().map(str::trim).filter(|l| !l.starts_with('#')) {
        let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
        match word {
            "FROM" => {
                stage = Some(FinalStage {
                    from: rest.to_owned(),
                    user: None,
                    entrypoint: None,
                })
            }
            "USER" => stage.as_mut().unwrap().user = Some(rest.to_owned()),
            "ENTRYPOINT" => stage.as_mut().unwrap().entrypoint = Some(rest.to_owned()),
            _ => {}
        }
    }
    (text, stage.expect("a FROM"))
}

fn dockerfile_user() -> u64 {
    let (_, last) = dockerfile();
    let user = last.user.expect("the final stage sets USER");
    user.split(':')
        .next()
        .unwrap()
        .parse()
        .expect("a numeric uid, which runAsNonRoot can check")
}

/// What the Dockerfile says, read as text; ci/image.sh builds its `runtime` stage and runs
/// the operator from the image (that is where the image is judged to work).
#[test]
fn the_dockerfile_reads_as_a_locked_build_onto_an_empty_base_run_as_nonroot() {
    let (text, last) = dockerfile();
    assert!(
        text.contains("cargo build --release --locked -p spur-operator"),
        "the build stage builds the operator from Cargo.lock"
    );
    assert!(
        text.contains("sh deploy/image/rootfs.sh /out/spur-operator /rootfs"),
        "the build stage assembles the root with the script ci/image.sh runs offline"
    );
    assert_eq!(
        last.from, "scratch AS runtime",
        "the operator's stage is the default (last) one, on an empty base"
    );
    assert!(text.contains("COPY --from=build /rootfs/ /"));
    assert_eq!(
        dockerfile_user(),
        65532,
        "the nonroot user rootfs.sh writes"
    );
    // Exec form: no shell is needed (or present) to start the binary.
    assert_eq!(
        last.entrypoint.as_deref(),
        Some("[\"/usr/local/bin/spur-operator\"]")
    );
    for label in [
        "org.opencontainers.image.version=\"${VERSION}\"",
        "org.opencontainers.image.revision=\"${REVISION}\"",
    ] {
        assert!(text.contains(label), "the image names its {label}");
    }
}

/// The Grafana dashboard in `deploy/dashboards/` is valid JSON, and every metric its
/// queries name is one the operator exports (a renamed family fails here, not on a blank
/// panel).
#[test]
fn the_dashboard_queries_only_exported_metrics() {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/dashboards/spur-operator.json");
    let text = std::fs::read_to_string(&path).expect("the dashboard");
    let dashboard: Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let exported = spur_operator::Metrics::with_a_series_of_each().family_names();
    let mut queried = std::collections::BTreeSet::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{}", panel["title"]);
        for target in targets {
            let expr = target["expr"].as_str().expect("an expr");
            // Every `spur_operator_...` word, less what PromQL adds to a family's name.
            for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
                if !word.starts_with("spur_operator_") {
                    continue;
                }
                let family = ["_bucket", "_count", "_sum", "_total"]
                    .iter()
                    .fold(word, |w, suffix| w.strip_suffix(suffix).unwrap_or(w));
                assert!(
                    exported.contains(family),
                    "panel {}: {word} is not an exported family",
                    panel["title"]
                );
                queried.insert(family.to_owned());
            }
        }
    }
    // The job-level families are what the dashboard is for.
    for family in [
        "spur_operator_spurjobs",
        "spur_operator_spurjob_start_lag_seconds",
        "spur_operator_launch_failures",
        "spur_operator_gpu_seconds",
        "spur_operator_nodes_drained",
    ] {
        assert!(queried.contains(family), "no panel draws {family}");
    }
}
