//! Liveness, readiness and metrics over HTTP: `/healthz`, `/readyz`, `/metrics`.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use futures::future::BoxFuture;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;

use crate::metrics::Metrics;
use crate::net::Listener;

/// One part of readiness: the API server, the controller.
pub trait Probe: Send + Sync + 'static {
    /// Ok when the part answers; otherwise why not, in a few words.
    fn check(&self) -> BoxFuture<'_, Result<(), String>>;
}

impl<F> Probe for F
where
    F: Fn() -> BoxFuture<'static, Result<(), String>> + Send + Sync + 'static,
{
    fn check(&self) -> BoxFuture<'_, Result<(), String>> {
        self()
    }
}

/// What the health server reports on.
#[derive(Clone)]
pub struct Health {
    metrics: Metrics,
    probes: Arc<Vec<(&'static str, Box<dyn Probe>)>>,
    probe_timeout: Duration,
}

impl Health {
    /// `probe_timeout` bounds each probe, so `/readyz` answers within it even when a part
    /// hangs (kubelet's own probe timeout would otherwise count a hang as a failure with
    /// no reason given).
    pub fn new(
        metrics: Metrics,
        probes: Vec<(&'static str, Box<dyn Probe>)>,
        probe_timeout: Duration,
    ) -> Health {
        Health {
            metrics,
            probes: Arc::new(probes),
            probe_timeout,
        }
    }

    /// Runs every probe concurrently; the failures, by name, in the order given.
    pub async fn readiness(&self) -> Vec<String> {
        let checks = self.probes.iter().map(|(name, probe)| async move {
            match tokio::time::timeout(self.probe_timeout, probe.check()).await {
                Ok(Ok(())) => None,
                Ok(Err(why)) => Some(format!("{name}: {why}")),
                Err(_) => Some(format!(
                    "{name}: no answer within {}",
                    humantime::format_duration(self.probe_timeout)
                )),
            }
        });
        futures::future::join_all(checks)
            .await
            .into_iter()
            .flatten()
            .collect()
    }

    pub fn router(self) -> Router {
        Router::new()
            .route("/healthz", get(|| async { "ok\n" }))
            .route("/readyz", get(readyz))
            .route("/metrics", get(metrics))
            .with_state(self)
    }
}

async fn readyz(State(health): State<Health>) -> impl IntoResponse {
    let failures = health.readiness().await;
    if failures.is_empty() {
        (StatusCode::OK, "ok\n".to_owned())
    } else {
        let mut body = String::from("not ready\n");
        for failure in failures {
            body.push_str(&failure);
            body.push('\n');
        }
        (StatusCode::SERVICE_UNAVAILABLE, body)
    }
}

async fn metrics(State(health): State<Health>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        health.metrics.encode(),
    )
}

/// Serves `router` over HTTP/1.1 on `listener` until `shutdown` completes; connections
/// already accepted finish on their own.
pub async fn serve_http<L: Listener>(
    mut listener: L,
    router: Router,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            () = &mut shutdown => return,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((conn, _peer)) => {
                let service = TowerToHyperService::new(router.clone());
                tokio::spawn(async move {
                    let conn = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(conn), service);
                    if let Err(e) = conn.await {
                        tracing::debug!(error = %e, "health connection ended with an error");
                    }
                });
            }
            Err(e) => {
                // Accept errors (too many open files) are transient; keep serving.
                tracing::warn!(error = %e, "health server: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probe(result: Result<(), &'static str>, delay: Duration) -> Box<dyn Probe> {
        Box::new(move || -> BoxFuture<'static, Result<(), String>> {
            Box::pin(async move {
                tokio::time::sleep(delay).await;
                result.map_err(str::to_owned)
            })
        })
    }

    async fn get_body(router: Router, path: &str) -> (StatusCode, String) {
        use tower::ServiceExt;
        let response = router
            .oneshot(
                axum::http::Request::get(path)
                    .body(axum::body::Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        (status, String::from_utf8(bytes.to_vec()).unwrap())
    }

    #[tokio::test(start_paused = true)]
    async fn readyz_names_each_failing_part_within_the_probe_bound() {
        let health = Health::new(
            Metrics::new(),
            vec![
                ("kube-apiserver", probe(Ok(()), Duration::ZERO)),
                ("spurctld", probe(Err("connect timed out"), Duration::ZERO)),
                ("hung", probe(Ok(()), Duration::from_secs(3600))),
            ],
            Duration::from_secs(2),
        );
        let started = tokio::time::Instant::now();
        let (status, body) = get_body(health.router(), "/readyz").await;
        assert_eq!(started.elapsed(), Duration::from_secs(2));
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            body,
            "not ready\nspurctld: connect timed out\nhung: no answer within 2s\n"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn ready_live_and_metrics() {
        let metrics = Metrics::new();
        metrics.leader.set(1);
        let health = Health::new(
            metrics,
            vec![("spurctld", probe(Ok(()), Duration::from_millis(5)))],
            Duration::from_secs(2),
        );
        let router = health.router();
        assert_eq!(
            get_body(router.clone(), "/readyz").await,
            (StatusCode::OK, "ok\n".into())
        );
        assert_eq!(
            get_body(router.clone(), "/healthz").await,
            (StatusCode::OK, "ok\n".into())
        );
        let (status, body) = get_body(router, "/metrics").await;
        assert_eq!(status, StatusCode::OK);
        assert!(body.contains("spur_operator_leader 1"), "{body}");
    }
}
