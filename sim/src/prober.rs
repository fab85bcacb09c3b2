//! A kubelet's readiness probe, in the simulated world: `GET /readyz` on a host's port
//! every period, bounded by a timeout, each result recorded with its simulated time. A
//! refused or hung connection counts as not ready, as it does for a kubelet.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use hyper_util::rt::TokioIo;

use crate::determinism::sim_elapsed;
use crate::trace::Trace;
use crate::world::World;

/// How a kubelet acts on a readiness probe: deploy/deployment.yaml's `readinessProbe`
/// (a test there holds the two equal).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProbeRule {
    pub period: Duration,
    pub timeout: Duration,
    /// Failed answers in a row that take a ready pod out of its Services.
    pub failure_threshold: usize,
    /// Successful answers in a row that put it back.
    pub success_threshold: usize,
}

impl ProbeRule {
    /// periodSeconds 5, timeoutSeconds 3, failureThreshold 3, successThreshold 1 (the
    /// Kubernetes default, which a readiness probe may raise).
    pub const DEPLOYMENT: ProbeRule = ProbeRule {
        period: Duration::from_secs(5),
        timeout: Duration::from_secs(3),
        failure_threshold: 3,
        success_threshold: 1,
    };

    /// The longest a kubelet takes to act on an answer that changed: the probes it needs
    /// in a row (the first may have just been sent), each answered within the timeout.
    pub fn lag(&self, to_ready: bool) -> Duration {
        let needed = if to_ready {
            self.success_threshold
        } else {
            self.failure_threshold
        };
        self.period * needed as u32 + self.timeout
    }
}

/// Probe results in time order: when, and whether the answer was 200.
#[derive(Clone, Default)]
pub struct ProbeLog(Rc<RefCell<Vec<(Duration, bool)>>>);

impl ProbeLog {
    /// Records a result (the prober's; tests build logs by hand with it).
    pub fn record(&self, at: Duration, ready: bool) {
        self.0.borrow_mut().push((at, ready));
    }

    /// Whether a kubelet following `rule` holds the pod ready after the answers up to
    /// `at`: not ready until `success_threshold` successes in a row, then ready until
    /// `failure_threshold` failures in a row, and so on.
    pub fn kubelet_ready(&self, at: Duration, rule: &ProbeRule) -> bool {
        let (mut ready, mut run) = (false, 0);
        for (_, answer) in self.0.borrow().iter().take_while(|(t, _)| *t <= at) {
            if *answer == ready {
                run = 0;
                continue;
            }
            run += 1;
            let needed = if *answer {
                rule.success_threshold
            } else {
                rule.failure_threshold
            };
            if run >= needed {
                ready = *answer;
                run = 0;
            }
        }
        ready
    }

    /// The first answer in `(after, to]` that said ready, and when.
    pub fn first_ready(&self, after: Duration, to: Duration) -> Option<Duration> {
        self.0
            .borrow()
            .iter()
            .find(|(t, ready)| *ready && *t > after && *t <= to)
            .map(|(t, _)| *t)
    }

    /// The last `n` answers at or before `at`, oldest first.
    pub fn last(&self, n: usize, at: Duration) -> Vec<(Duration, bool)> {
        let log = self.0.borrow();
        let end = log.partition_point(|(t, _)| *t <= at);
        log[end.saturating_sub(n)..end].to_vec()
    }

    /// The last result at or before `at`.
    pub fn at(&self, at: Duration) -> Option<bool> {
        let log = self.0.borrow();
        let i = log.partition_point(|(t, _)| *t <= at);
        i.checked_sub(1).map(|i| log[i].1)
    }

    pub fn len(&self) -> usize {
        self.0.borrow().len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.borrow().is_empty()
    }
}

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
                self.trace
                    .record_here(&self.host, format!("GET {} -> {shown}", self.path));
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
