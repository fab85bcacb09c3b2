//! A user's kubectl on the process pods: `kubectl logs`, `kubectl exec` (in the pod's
//! namespaces, with its exit code), the API server's proxy to a Service and to a pod, and
//! `kubectl port-forward`.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::{ClusterProcess, runnable, workspace};
use crate::common::kubectl::kubectl_binary;

/// How long the pods have to become Ready after the apply (spurctld elects, the
/// operator's replicas pass their readiness probes).
const READY_WITHIN: Duration = Duration::from_secs(150);
/// How long one kubectl streaming call (port-forward's first line, a GET through it) may take.
const CALL_WITHIN: Duration = Duration::from_secs(20);

/// A Service for the operator's `http` port (deploy/ names the port on its pods; its own
/// Service is the agent's), as a user adds one for health checks through the API server.
const OPERATOR_HTTP_SERVICE: &str = "apiVersion: v1
kind: Service
metadata:
  name: spur-operator
  namespace: spur-system
spec:
  selector:
    app.kubernetes.io/name: spur-operator
  ports:
    - name: http
      port: 8080
      targetPort: http
";

#[test]
fn kubectl_logs_exec_proxy_and_port_forward_reach_the_process_pods() {
    if !runnable() {
        return;
    }
    let cluster = ClusterProcess::start("podio");
    let examples = workspace().join("deploy/examples/cluster");
    cluster.apply(&["-f", &examples.join("spurctld.yaml").display().to_string()]);
    cluster.apply(&["-k", &workspace().join("deploy").display().to_string()]);
    let service = cluster.dir.join("operator-http.yaml");
    std::fs::write(&service, OPERATOR_HTTP_SERVICE).expect("write the Service");
    cluster.apply(&["-f", &service.display().to_string()]);
    let operator = ready_pod(
        &cluster,
        "spur-system",
        "app.kubernetes.io/name=spur-operator",
    );
    running(&cluster, "spur", "spurctld-0");

    logs_are_the_containers_output(&cluster, &operator);
    exec_runs_inside_the_pod(&cluster);
    proxy_reaches_the_operator(&cluster, &operator);
    port_forward_reaches_the_operator(&cluster, &operator);
    cluster.stop();
}

/// The name of a Ready pod of `selector` once one is (fails with the cluster's state).
pub(super) fn ready_pod(cluster: &ClusterProcess, namespace: &str, selector: &str) -> String {
    let deadline = Instant::now() + READY_WITHIN;
    let template = r#"jsonpath={range .items[*]}{.metadata.name} {.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}"#;
    while Instant::now() < deadline {
        let (_, out) = cluster.kubectl(&[
            "get", "pods", "-n", namespace, "-l", selector, "-o", template,
        ]);
        let ready = out
            .lines()
            .find_map(|l| l.strip_suffix(" True").map(str::to_owned));
        if let Some(name) = ready {
            return name;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    panic!(
        "no pod of {selector} in {namespace} is Ready\n{}",
        cluster.diagnose()
    );
}

/// Waits for pod `name` to run (an exec needs no readiness).
fn running(cluster: &ClusterProcess, namespace: &str, name: &str) {
    let deadline = Instant::now() + READY_WITHIN;
    while Instant::now() < deadline {
        let (_, phase) = cluster.kubectl(&[
            "get",
            "pod",
            "-n",
            namespace,
            name,
            "-o",
            "jsonpath={.status.phase}",
        ]);
        if phase.trim() == "Running" {
            return;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    panic!(
        "pod {namespace}/{name} is not Running\n{}",
        cluster.diagnose()
    );
}

fn logs_are_the_containers_output(cluster: &ClusterProcess, operator: &str) {
    let (ok, out) = cluster.kubectl(&["logs", "-n", "spur-system", operator]);
    assert!(
        ok && !out.trim().is_empty(),
        "kubectl logs {operator}: {out:?}"
    );
    let uid_dir = std::fs::read_dir(cluster.dir.join("logs"))
        .expect("the log directory")
        .flatten()
        .find(|d| {
            d.file_name()
                .to_string_lossy()
                .starts_with(&format!("spur-system_{operator}_"))
        })
        .expect("the operator pod's log directory");
    let file = std::fs::read_to_string(uid_dir.path().join("operator.log")).expect("its log file");
    let first = out.lines().next().unwrap_or_default();
    assert!(
        file.starts_with(first),
        "kubectl logs begins as the log file: {first:?}"
    );
    let (ok, tail) = cluster.kubectl(&["logs", "-n", "spur-system", operator, "--tail=1"]);
    assert!(
        ok && tail.trim_end().lines().count() == 1,
        "kubectl logs --tail=1: {tail:?}"
    );
    println!("kubectl logs {operator}: {} lines", out.lines().count());
}

fn exec_runs_inside_the_pod(cluster: &ClusterProcess) {
    let exec = |command: &[&str]| {
        cluster.kubectl(&[&["exec", "-n", "spur", "spurctld-0", "--"][..], command].concat())
    };
    let (ok, hostname) = exec(&["hostname"]);
    assert!(
        ok && hostname.trim() == "spurctld-0",
        "hostname in the pod: {hostname:?}"
    );
    let (ok, hosts) = exec(&["cat", "/etc/hosts"]);
    assert!(
        ok && hosts.contains("spurctld-0.spurctld.spur.svc.cluster.local"),
        "the pod's /etc/hosts is its namespace's: {hosts:?}"
    );
    let (ok, resolv) = exec(&["cat", "/etc/resolv.conf"]);
    assert!(
        ok && resolv.contains("search spur.svc.cluster.local svc.cluster.local cluster.local")
            && resolv.contains("nameserver 127.0.0.1"),
        "the pod's resolv.conf has the kubelet's search path and no nameserver off the \
         pod: {resolv:?}"
    );
    let (found, _) = exec(&[
        "getent",
        "hosts",
        "spurctld-9.spurctld.spur.svc.cluster.local",
    ]);
    assert!(!found, "a name the cluster does not hold does not resolve");
    let status = Command::new(kubectl_binary())
        .arg("--kubeconfig")
        .arg(&cluster.kubeconfig)
        .args([
            "exec",
            "-n",
            "spur",
            "spurctld-0",
            "--",
            "sh",
            "-c",
            "exit 3",
        ])
        .stdin(Stdio::null())
        .status()
        .expect("run kubectl exec");
    assert_eq!(
        status.code(),
        Some(3),
        "kubectl exec exits with the command's code"
    );
}

fn proxy_reaches_the_operator(cluster: &ClusterProcess, operator: &str) {
    let service = "/api/v1/namespaces/spur-system/services/spur-operator:http/proxy/readyz";
    // The Service's endpoints follow the pods' readiness within a pass of the controller.
    let deadline = Instant::now() + READY_WITHIN;
    let (mut ok, mut out) = cluster.kubectl(&["get", "--raw", service]);
    while !ok && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
        (ok, out) = cluster.kubectl(&["get", "--raw", service]);
    }
    assert!(ok && !out.trim().is_empty(), "GET {service}: {out}");
    let metrics = format!("/api/v1/namespaces/spur-system/pods/{operator}:8080/proxy/metrics");
    let (ok, out) = cluster.kubectl(&["get", "--raw", &metrics]);
    assert!(ok && out.contains("# TYPE"), "GET {metrics}: {out}");
    let missing = "/api/v1/namespaces/spur-system/services/spur-operator:nope/proxy/readyz";
    let (ok, out) = cluster.kubectl(&["get", "--raw", missing]);
    assert!(
        !ok && out.contains("ServiceUnavailable"),
        "GET {missing}: {out}"
    );
}

/// `kubectl port-forward` of operator pod `pod`'s `remote` port: the process (to kill) and
/// the local port it printed, if it printed one in time.
pub(super) fn forward_to_operator(
    cluster: &ClusterProcess,
    pod: &str,
    remote: u16,
) -> (std::process::Child, Option<u16>) {
    let mut forward = Command::new(kubectl_binary())
        .arg("--kubeconfig")
        .arg(&cluster.kubeconfig)
        .args([
            "port-forward",
            "-n",
            "spur-system",
            &format!("pod/{pod}"),
            &format!(":{remote}"),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start kubectl port-forward");
    let port = first_forwarded_port(&mut forward);
    (forward, port)
}

fn port_forward_reaches_the_operator(cluster: &ClusterProcess, operator: &str) {
    let (mut forward, port) = forward_to_operator(cluster, operator, 8080);
    let answer = port.map(get_healthz);
    let _ = forward.kill();
    let _ = forward.wait();
    let answer = answer.expect("kubectl port-forward printed its local port");
    let answer = answer.expect("GET /healthz through the port-forward");
    assert!(
        answer.starts_with("HTTP/1.1 200"),
        "GET /healthz through the forward: {answer:?}"
    );
}

/// The local port of `kubectl port-forward`'s first "Forwarding from 127.0.0.1:PORT" line.
fn first_forwarded_port(forward: &mut std::process::Child) -> Option<u16> {
    let stdout = forward.stdout.take()?;
    let (found, port) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            println!("port-forward: {line}");
            let parsed = line
                .strip_prefix("Forwarding from 127.0.0.1:")
                .and_then(|rest| rest.split_whitespace().next()?.parse::<u16>().ok());
            if let Some(port) = parsed {
                let _ = found.send(port);
            }
        }
    });
    port.recv_timeout(CALL_WITHIN).ok()
}

fn get_healthz(port: u16) -> std::io::Result<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(CALL_WITHIN))?;
    stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    Ok(answer)
}
