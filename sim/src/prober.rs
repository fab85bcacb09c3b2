//! A kubelet's readiness probe, in the simulated world: `GET /readyz` on a host's port
//! every period, bounded by a timeout, each result recorded with its simulated time. A
//! refused or hung connection counts as not ready, as it does for a kubelet.

use std::time::Duration;

use hyper_util::rt::TokioIo;

use crate::determinism::sim_elapsed;
use crate::world::World;
use spur_judge::trace::Trace;

pub use spur_judge::probes::{ProbeLog, ProbeRule};

/// Starts a host `prober` that probes `target:port` `path`.
pub fn start(
    world: &mut World,
    prober: &str,
    target: &str,
    port: u16,
    path: &'static str,
    period: Duration,
    timeout: Duration,
) -> ProbeLog {
    let log = ProbeLog::default();
    let (sink, target, trace, host) = (
        log.clone(),
        target.to_owned(),
        world.trace().clone(),
        prober.to_owned(),
    );
    world.host(prober, move || {
        let probe = Probe {
            sink: sink.clone(),
            trace: trace.clone(),
            host: host.clone(),
            target: target.clone(),
            port,
            path,
        };
        probe.forever(period, timeout)
    });
    log
}

struct Probe {
    sink: ProbeLog,
    trace: Trace,
    host: String,
    target: String,
    port: u16,
    path: &'static str,
}

impl Probe {
    async fn forever(self, period: Duration, timeout: Duration) -> turmoil::Result {
        // A kubelet starts a probe every period; a slow one delays the next, never
        // overlaps it.
        let mut ticks = tokio::time::interval(period);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last = None;
        loop {
            ticks.tick().await;
            let answer = tokio::time::timeout(timeout, get(&self.target, self.port, self.path))
                .await
                .unwrap_or_else(|_| Err("no answer in time".to_owned()));
            let ready = matches!(&answer, Ok((200, _)));
            self.sink.record(sim_elapsed(), ready);
            // The trace shows each change of answer, with the body that explains it.
            let shown = match &answer {
                Ok((status, body)) => format!("{status} {}", body.trim().replace('\n', "; ")),
                Err(e) => e.clone(),
            };
            if last.as_ref() != Some(&shown) {
                self.trace.record(
                    crate::determinism::sim_elapsed(),
                    &self.host,
                    format!("GET {} -> {shown}", self.path),
                );
                last = Some(shown);
            }
        }
    }
}

/// One GET: the status code and body, or why no answer came.
async fn get(target: &str, port: u16, path: &str) -> Result<(u16, String), String> {
    let stream = turmoil::net::TcpStream::connect((target, port))
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    tokio::spawn(conn);
    let request = hyper::Request::get(path)
        .header(hyper::header::HOST, target)
        .body(axum::body::Body::empty())
        .map_err(|e| e.to_string())?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| format!("request: {e}"))?;
    let status = response.status().as_u16();
    let body = axum::body::to_bytes(axum::body::Body::new(response.into_body()), 64 << 10)
        .await
        .map_err(|e| format!("body: {e}"))?;
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log(answers: &[bool]) -> ProbeLog {
        let log = ProbeLog::default();
        for (i, ready) in answers.iter().enumerate() {
            log.record(Duration::from_secs(5 * i as u64), *ready);
        }
        log
    }

    #[test]
    fn the_kubelet_needs_three_failures_in_a_row_to_drop_a_pod_and_one_success_to_add_it() {
        let rule = ProbeRule::DEPLOYMENT;
        let end = Duration::from_secs(3600);
        assert!(
            !log(&[]).kubelet_ready(end, &rule),
            "not ready before any answer"
        );
        assert!(log(&[true]).kubelet_ready(end, &rule));
        assert!(log(&[true, false, false]).kubelet_ready(end, &rule));
        assert!(!log(&[true, false, false, false]).kubelet_ready(end, &rule));
        assert!(
            log(&[true, false, false, true, false, false]).kubelet_ready(end, &rule),
            "a success between resets the count"
        );
        assert!(log(&[true, false, false, false, true]).kubelet_ready(end, &rule));
        // Only the answers up to the time asked about count.
        let dropped = log(&[true, false, false, false]);
        assert!(dropped.kubelet_ready(Duration::from_secs(10), &rule));
        assert!(!dropped.kubelet_ready(Duration::from_secs(15), &rule));
        assert_eq!(
            dropped.last(2, Duration::from_secs(12)),
            [
                (Duration::from_secs(5), false),
                (Duration::from_secs(10), false)
            ]
        );
    }

    #[test]
    fn the_kubelet_acts_within_the_probes_its_rule_needs() {
        let rule = ProbeRule::DEPLOYMENT;
        assert_eq!(rule.lag(true), Duration::from_secs(8));
        assert_eq!(rule.lag(false), Duration::from_secs(18));
    }
}
