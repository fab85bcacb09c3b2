//! Readiness and liveness probes: tcpSocket and httpGet to the pod's address from the
//! cluster's namespace (as a kubelet probes from the node), exec inside the pod.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// A probe's counters between runs, reset when its container (re)starts.
#[derive(Clone, Debug)]
pub struct ProbeState {
    pub successes: i32,
    pub failures: i32,
    pub last_run: Option<Instant>,
    /// The verdict: passing readiness starts false, liveness true (Kubernetes' defaults).
    pub ok: bool,
}

impl ProbeState {
    pub fn new(initially: bool) -> Self {
        Self {
            successes: 0,
            failures: 0,
            last_run: None,
            ok: initially,
        }
    }

    /// Whether the probe runs now, for a container running since `started`.
    pub fn due(&self, probe: &Probe, started: Instant, now: Instant) -> bool {
        let delay = secs(probe.initial_delay_seconds, 0);
        let period = secs(probe.period_seconds, 10);
        now >= started + delay && self.last_run.is_none_or(|at| now >= at + period)
    }

    /// Counts one result against the thresholds.
    pub fn record(&mut self, probe: &Probe, passed: bool, now: Instant) {
        self.last_run = Some(now);
        if passed {
            self.successes += 1;
            self.failures = 0;
            if self.successes >= probe.success_threshold.unwrap_or(1) {
                self.ok = true;
            }
        } else {
            self.failures += 1;
            self.successes = 0;
            if self.failures >= probe.failure_threshold.unwrap_or(3) {
                self.ok = false;
            }
        }
    }
}

fn secs(value: Option<i32>, default: i32) -> Duration {
    Duration::from_secs(value.unwrap_or(default).max(0) as u64)
}

/// How a probe is run: tcp/http need the pod's address, exec a process in the pod.
pub enum Action {
    Tcp(Ipv4Addr, u16),
    Http(Ipv4Addr, u16, String),
    Exec(Vec<String>),
    Unsupported,
}

/// What `probe` does for `container` of a pod at `pod_ip`.
pub fn action(probe: &Probe, container: &Container, pod_ip: Ipv4Addr) -> Action {
    let port = |p: &IntOrString| match p {
        IntOrString::Int(n) => u16::try_from(*n).ok(),
        IntOrString::String(name) => container
            .ports
            .iter()
            .flatten()
            .find(|cp| cp.name.as_deref() == Some(name))
            .and_then(|cp| u16::try_from(cp.container_port).ok()),
    };
    let host = |h: &Option<String>| h.as_deref().and_then(|h| h.parse().ok()).unwrap_or(pod_ip);
    if let Some(tcp) = &probe.tcp_socket
        && let Some(p) = port(&tcp.port)
    {
        return Action::Tcp(host(&tcp.host), p);
    }
    if let Some(http) = &probe.http_get
        && let Some(p) = port(&http.port)
    {
        let path = http.path.clone().unwrap_or_else(|| "/".into());
        return Action::Http(host(&http.host), p, path);
    }
    if let Some(exec) = &probe.exec {
        return Action::Exec(exec.command.clone().unwrap_or_default());
    }
    Action::Unsupported
}

/// The probe's timeout (timeoutSeconds, default 1 s as Kubernetes').
pub fn timeout(probe: &Probe) -> Duration {
    secs(probe.timeout_seconds, 1).max(Duration::from_secs(1))
}

/// Whether a TCP connection to `ip:port` opens.
pub async fn tcp(ip: Ipv4Addr, port: u16) -> bool {
    tokio::net::TcpStream::connect((ip, port)).await.is_ok()
}

/// Whether `GET path` answers with a status from 200 to 399 (plain HTTP/1.1).
pub async fn http(ip: Ipv4Addr, port: u16, path: &str) -> bool {
    let Ok(mut stream) = tokio::net::TcpStream::connect((ip, port)).await else {
        return false;
    };
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {ip}:{port}\r\nUser-Agent: kube-probe/1.33\r\n\
         Connection: close\r\n\r\n"
    );
    if stream.write_all(request.as_bytes()).await.is_err() {
        return false;
    }
    let mut head = [0u8; 64];
    let Ok(n) = stream.read(&mut head).await else {
        return false;
    };
    status_ok(&head[..n])
}

/// Whether an HTTP response's first line carries a 2xx or 3xx status.
fn status_ok(head: &[u8]) -> bool {
    let line = String::from_utf8_lossy(head);
    let code = line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse::<u16>().ok());
    line.starts_with("HTTP/") && code.is_some_and(|c| (200..400).contains(&c))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thresholds_flip_the_verdict() {
        let probe = Probe {
            failure_threshold: Some(2),
            success_threshold: Some(1),
            initial_delay_seconds: Some(1),
            period_seconds: Some(2),
            ..Probe::default()
        };
        let start = Instant::now();
        let mut state = ProbeState::new(true);
        assert!(!state.due(&probe, start, start));
        assert!(state.due(&probe, start, start + Duration::from_secs(1)));
        state.record(&probe, false, start);
        assert!(state.ok, "one failure is under the threshold");
        state.record(&probe, false, start);
        assert!(!state.ok);
        assert!(!state.due(&probe, start, start + Duration::from_secs(1)));
        state.record(&probe, true, start);
        assert!(state.ok);
        assert!(status_ok(b"HTTP/1.0 200 OK\r\n") && status_ok(b"HTTP/1.1 302 Found"));
        assert!(!status_ok(b"HTTP/1.1 500 Oops") && !status_ok(b"garbage"));
    }
}
