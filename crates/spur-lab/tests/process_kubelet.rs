//! The process kubelet against the simulated API server over TCP, in a private network
//! namespace: a busybox-style pod serving HTTP with python3, probes, env, pod-to-pod
//! traffic, an unmapped image, graceful deletion, and nothing left afterwards.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, PostParams};
use serde_json::{Value, json};
use spur_fakes::api_server::auth::UserInfo;
use spur_fakes::api_server::{ApiServer, ApiServerConfig};
use spur_fakes::clock::TimeSource;
use spur_lab::cluster::{KubeletConfig, images::ImageTable, run_kubelet};

const NODE: &str = "node-a";
const PYTHON: &str = "/usr/bin/python3";

/// Why this machine cannot run the test, if it cannot.
fn skip_reason() -> Option<String> {
    if let Some(why) = spur_lab::kernel::missing_tools() {
        return Some(why);
    }
    (!Path::new(PYTHON).is_file()).then(|| format!("{PYTHON} is missing (the pod's server)"))
}

/// Removes the test's directory on every path out.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        if std::thread::panicking() {
            print_logs(&self.0.join("logs"));
        }
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The containers' logs, printed when the test failed.
fn print_logs(dir: &Path) {
    for pod in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        for log in std::fs::read_dir(pod.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let text = std::fs::read_to_string(log.path()).unwrap_or_default();
            eprintln!("--- {}\n{text}", log.path().display());
        }
    }
}

#[test]
fn a_process_kubelet_runs_probes_and_deletes_pods_leaving_nothing() {
    if let Some(why) = skip_reason() {
        // CI runs as root with the tools installed: there a skip would hide a failure.
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI cannot run the process kubelet: {why}"
        );
        eprintln!("SKIPPED process_kubelet: {why}");
        return;
    }
    // This test's thread (and what it forks) enters a namespace of its own.
    spur_lab::kernel::enter_private_network().expect("private network namespace");
    let dir = TempDir(std::env::temp_dir().join(format!("spur-kubelet-{}", std::process::id())));
    std::fs::create_dir_all(dir.0.join("shared")).unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    // The pod runs as uid 1000 and writes here.
    std::fs::set_permissions(dir.0.join("shared"), std::fs::Permissions::from_mode(0o777)).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let outcome = runtime
        .block_on(async { tokio::time::timeout(Duration::from_secs(120), scenario(&dir.0)).await });
    outcome.expect("the scenario overran 120 s").unwrap();
}

async fn scenario(dir: &Path) -> anyhow::Result<()> {
    let server = ApiServer::new(ApiServerConfig {
        clock: Some(TimeSource::from_fn(Timestamp::now)),
        anonymous: Some(UserInfo::admin()),
        ..ApiServerConfig::default()
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    let serving = tokio::spawn({
        let server = server.clone();
        async move { server.serve(listener).await }
    });
    let client = kube::Client::try_from(kube::Config::new(url.parse()?))?;
    server.create(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}))?;
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut config = KubeletConfig::new(ImageTable::with_defaults(&workspace), dir.join("logs"));
    config.restart_backoff = Duration::from_secs(1);
    // Long enough for a poll to see ErrImagePull before ImagePullBackOff.
    config.image_backoff = Duration::from_secs(5);
    let kubelet = tokio::spawn({
        let client = client.clone();
        async move { run_kubelet(client, NODE, config).await }
    });
    let result = pods(&client, dir).await;
    // Stopping the kubelet (dropping its future) must remove whatever it made.
    kubelet.abort();
    let stopped = kubelet.await;
    serving.abort();
    result?;
    assert!(
        stopped.is_err_and(|e| e.is_cancelled()),
        "the kubelet ended by itself"
    );
    nothing_left()
}

/// The pods' story: web ready, env seen, a peer reaches it, an unmapped image, deletion.
async fn pods(client: &kube::Client, dir: &Path) -> anyhow::Result<()> {
    let api = kube::Api::<Pod>::namespaced(client.clone(), "default");
    let shared = dir.join("shared");
    api.create(&PostParams::default(), &serde_json::from_value(unmapped())?)
        .await?;
    let waiting = |reason: &'static str| {
        move |p: &Value| p["status"]["containerStatuses"][0]["state"]["waiting"]["reason"] == reason
    };
    let pulled = wait(&api, "nginx", waiting("ErrImagePull")).await?;
    let message = pulled["status"]["containerStatuses"][0]["state"]["waiting"]["message"].clone();
    assert!(
        message.as_str().is_some_and(|m| m.contains("nginx:1.25")),
        "{message}"
    );
    wait(&api, "nginx", waiting("ImagePullBackOff")).await?;
    assert_eq!(
        wait(&api, "nginx", |_| true).await?["status"]["phase"],
        "Pending"
    );

    let maps =
        kube::Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), "default");
    let map = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "web"},
        "data": {"greeting": "hi"}});
    maps.create(&PostParams::default(), &serde_json::from_value(map)?)
        .await?;
    api.create(
        &PostParams::default(),
        &serde_json::from_value(web(&shared))?,
    )
    .await?;
    let ready = wait(&api, "web", |p| {
        condition(p, "Ready") && p["status"]["phase"] == "Running"
    })
    .await?;
    let ip = ready["status"]["podIP"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(ip.starts_with("10.244."), "podIP {ip} is on the pod CIDR");
    assert_eq!(ready["status"]["podIPs"][0]["ip"], ip.as_str());
    assert_eq!(ready["status"]["containerStatuses"][0]["ready"], true);
    let log = std::fs::read_to_string(log_of(dir, &ready))?;
    let expected = format!("env: hello-web-on-{NODE} ip={ip} host=web arg={ip} uid=1000 conf=hi");
    assert!(log.contains(&expected), "the log {log:?} has {expected:?}");

    api.create(&PostParams::default(), &serde_json::from_value(peer(&ip))?)
        .await?;
    let peer = wait(&api, "peer", |p| p["status"]["phase"] == "Succeeded").await?;
    let terminated = &peer["status"]["containerStatuses"][0]["state"]["terminated"];
    assert_eq!(
        (
            terminated["exitCode"].as_i64(),
            terminated["reason"].as_str()
        ),
        (Some(0), Some("Completed"))
    );

    delete_web(&api, &shared).await?;
    for name in ["peer", "nginx"] {
        api.delete(name, &DeleteParams::default()).await?;
        gone(&api, name).await?;
    }
    Ok(())
}

/// Deleting web SIGTERMs its process (its trap writes a file), then the pod goes, and no
/// process is left in its network namespace.
async fn delete_web(api: &kube::Api<Pod>, shared: &Path) -> anyhow::Result<()> {
    let pid: u32 = std::fs::read_to_string(shared.join("pid"))?
        .trim()
        .parse()?;
    let netns = std::fs::read_link(format!("/proc/{pid}/ns/net"))?;
    api.delete("web", &DeleteParams::default()).await?;
    gone(api, "web").await?;
    let term = std::fs::read_to_string(shared.join("term")).unwrap_or_default();
    assert_eq!(term.trim(), "sigterm", "the container saw SIGTERM");
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "the container's process is gone"
    );
    let holders = processes_in(&netns);
    assert!(
        holders.is_empty(),
        "processes {holders:?} still hold the pod's namespace"
    );
    Ok(())
}

/// After the kubelet stopped: no veth, no bridge, no named namespace.
fn nothing_left() -> anyhow::Result<()> {
    let links = output("ip", &["-o", "link"])?;
    assert!(
        !links.contains("spv") && !links.contains("spurbr0"),
        "links left: {links}"
    );
    let named = output("ip", &["netns", "list"])?;
    assert!(!named.contains("spur"), "named namespaces left: {named}");
    Ok(())
}

fn output(program: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = std::process::Command::new(program).args(args).output()?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The processes whose network namespace is `netns` (a `net:[inode]` link).
fn processes_in(netns: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter(|e| std::fs::read_link(e.path().join("ns/net")).is_ok_and(|l| l == netns))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

fn log_of(dir: &Path, pod: &Value) -> PathBuf {
    let uid = pod["metadata"]["uid"].as_str().unwrap_or_default();
    dir.join("logs")
        .join(format!("default_web_{uid}"))
        .join("server.log")
}

fn condition(pod: &Value, kind: &str) -> bool {
    pod["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == kind && c["status"] == "True")
    })
}

/// Polls pod `name` until `done` holds (30 s at most).
async fn wait(
    api: &kube::Api<Pod>,
    name: &str,
    done: impl Fn(&Value) -> bool,
) -> anyhow::Result<Value> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut last = Value::Null;
    while tokio::time::Instant::now() < deadline {
        if let Some(pod) = api.get_opt(name).await? {
            last = serde_json::to_value(pod)?;
            if done(&last) {
                return Ok(last);
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    anyhow::bail!("pod {name} never got there; last seen: {last:#}")
}

/// Polls until pod `name` is gone (30 s at most).
async fn gone(api: &kube::Api<Pod>, name: &str) -> anyhow::Result<()> {
    for _ in 0..150 {
        if api.get_opt(name).await?.is_none() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    anyhow::bail!("pod {name} was never removed")
}

/// A busybox pod as uid 1000: prints its env, serves HTTP on 8080, and notes SIGTERM.
fn web(shared: &Path) -> Value {
    let d = shared.display();
    // The host's directory reaches the container only as a volume, at /shared; the
    // ConfigMap's key is a file under /etc/web.
    let script = "echo \"env: $GREETING ip=$POD_IP host=`hostname` arg=$1 uid=`id -u` \
         conf=`cat /etc/web/greeting`\"; echo $$$$ > /shared/pid; \
         trap 'echo sigterm > /shared/term; exit 0' TERM; \
         PYTHON -m http.server 8080 --bind 0.0.0.0 & wait"
        .replace("PYTHON", PYTHON);
    let field = |path: &str| json!({"fieldRef": {"fieldPath": path}});
    let probe = |kind: Value| {
        let mut p = json!({"periodSeconds": 1, "failureThreshold": 3});
        p.as_object_mut()
            .unwrap()
            .extend(kind.as_object().unwrap().clone());
        p
    };
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": "default"},
    "spec": {"nodeName": NODE, "terminationGracePeriodSeconds": 10, "containers": [{
        "name": "server", "image": "docker.io/library/busybox:1.36",
        "command": ["sh", "-c", script], "args": ["web", "$(POD_IP)"],
        "securityContext": {"runAsUser": 1000, "runAsGroup": 1000},
        "ports": [{"name": "http", "containerPort": 8080}],
        "volumeMounts": [{"name": "shared", "mountPath": "/shared"},
            {"name": "conf", "mountPath": "/etc/web", "readOnly": true}],
        "env": [
            {"name": "POD_NAME", "valueFrom": field("metadata.name")},
            {"name": "POD_IP", "valueFrom": field("status.podIP")},
            {"name": "NODE", "valueFrom": field("spec.nodeName")},
            {"name": "GREETING", "value": "hello-$(POD_NAME)-on-$(NODE)"},
        ],
        "readinessProbe": probe(json!({"httpGet": {"port": "http", "path": "/"}})),
        "livenessProbe": probe(json!({"tcpSocket": {"port": 8080}, "initialDelaySeconds": 10})),
    }],
    "volumes": [{"name": "shared", "hostPath": {"path": d.to_string(), "type": "Directory"}},
        {"name": "conf", "configMap": {"name": "web"}}]}})
}

/// A pod that fetches web's page by its address, once.
fn peer(web_ip: &str) -> Value {
    let fetch = "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)";
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "peer", "namespace": "default"},
    "spec": {"nodeName": NODE, "restartPolicy": "Never", "containers": [{
        "name": "fetch", "image": "python:3", "command": [PYTHON, "-c", fetch, "http://$(WEB):8080/"],
        "env": [{"name": "WEB", "value": web_ip}],
    }]}})
}

/// A pod whose image no table entry maps.
fn unmapped() -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "nginx", "namespace": "default"},
        "spec": {"nodeName": NODE, "containers": [{"name": "nginx", "image": "nginx:1.25"}]}})
}
