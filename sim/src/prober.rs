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

/// Probe results in time order: when, and whether the answer was 200.
#[derive(Clone, Default)]
pub struct ProbeLog(Rc<RefCell<Vec<(Duration, bool)>>>);

impl ProbeLog {
    /// The last result at or before `at`.
    pub fn at(&self, at: Duration) -> Option<bool> {
        let log = self.0.borrow();
        let i = log.partition_point(|(t, _)| *t <= at);
        i.checked_sub(1).map(|i| log[i].1)
    }

    /// The results in `from..=to`.
    pub fn between(&self, from: Duration, to: Duration) -> Vec<bool> {
        let log = self.0.borrow();
        log.iter()
            .filter(|(t, _)| (from..=to).contains(t))
            .map(|(_, ready)| *ready)
            .collect()
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
            self.sink.0.borrow_mut().push((sim_elapsed(), ready));
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
