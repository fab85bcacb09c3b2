//! A Kubernetes API server for unit tests: reads answer NotFound, writes are recorded.

use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What reached the API server: `METHOD path`, and each write's body.
pub type Writes = Arc<Mutex<Vec<(String, serde_json::Value)>>>;

/// An API server that answers reads NotFound after `read_delay` and every write at
/// once (as created), recording it.
pub fn api_server(writes: Writes, read_delay: Duration) -> kube::Client {
    api_server_refusing(writes, read_delay, |_| false)
}

/// [`api_server`], answering Kubernetes' 403 to each write whose `METHOD path` `refused`
/// picks (RBAC saying no); a refused write is not recorded.
pub fn api_server_refusing(
    writes: Writes,
    read_delay: Duration,
    refused: fn(&str) -> bool,
) -> kube::Client {
    let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
        let writes = writes.clone();
        async move {
            if request.method() == http::Method::GET {
                tokio::time::sleep(read_delay).await;
                let status = serde_json::json!({
                    "kind": "Status", "apiVersion": "v1", "status": "Failure",
                    "reason": "NotFound", "code": 404, "message": "not found",
                });
                return Ok::<_, kube::Error>(
                    http::Response::builder()
                        .status(404)
                        .body(kube::client::Body::from(status.to_string().into_bytes()))
                        .expect("response"),
                );
            }
            let what = format!("{} {}", request.method(), request.uri().path());
            if refused(&what) {
                let status = serde_json::json!({
                    "kind": "Status", "apiVersion": "v1", "status": "Failure",
                    "reason": "Forbidden", "code": 403,
                    "message": format!("forbidden: User \"system:serviceaccount:spur:default\" cannot {what}"),
                });
                return Ok(http::Response::builder()
                    .status(403)
                    .body(kube::client::Body::from(status.to_string().into_bytes()))
                    .expect("response"));
            }
            let created = request.into_body().collect_bytes().await?;
            let body = serde_json::from_slice(&created).unwrap_or_default();
            writes.lock().expect("writes").push((what, body));
            Ok(http::Response::builder()
                .status(201)
                .body(kube::client::Body::from(created))
                .expect("response"))
        }
    });
    kube::Client::new(service, "default")
}
