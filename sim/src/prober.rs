//! A kubelet's readiness probe, in the simulated world: `GET /readyz` on a host's port
//! every period, bounded by a timeout, each result recorded with its simulated time. A
//! refused or hung connection counts as not ready, as it does for a kubelet.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use hyper_util::rt::TokioIo;

use crate::determinism::sim_elapsed;
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
    let (sink, target) = (log.clone(), target.to_owned());
    world.host(prober, move || {
        probe_forever(sink.clone(), target.clone(), port, path, period, timeout)
    });
    log
}

async fn probe_forever(
    sink: ProbeLog,
    target: String,
    port: u16,
    path: &'static str,
    period: Duration,
    timeout: Duration,
) -> turmoil::Result {
    // A kubelet starts a probe every period; a slow one delays the next, never overlaps it.
    let mut ticks = tokio::time::interval(period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let ready = tokio::time::timeout(timeout, probe(&target, port, path))
            .await
            .is_ok_and(|status| status == Some(200));
        sink.0.borrow_mut().push((sim_elapsed(), ready));
    }
}

/// One GET; the status code, or `None` when no answer came.
async fn probe(target: &str, port: u16, path: &str) -> Option<u16> {
    let stream = turmoil::net::TcpStream::connect((target, port))
        .await
        .ok()?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .ok()?;
    tokio::spawn(conn);
    let request = hyper::Request::get(path)
        .header(hyper::header::HOST, target)
        .body(axum::body::Body::empty())
        .ok()?;
    let response = sender.send_request(request).await.ok()?;
    Some(response.status().as_u16())
}
