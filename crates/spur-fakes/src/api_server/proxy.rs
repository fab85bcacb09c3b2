//! The API server's proxy: `.../pods/NAME[:PORT]/proxy/PATH` and
//! `.../services/[SCHEME:]NAME[:PORT]/proxy/PATH` forward the request over HTTP/1.1 to the
//! pod, as `kubectl get --raw` and health checks through the API server use them.
//!
//! A pod's port is a number or one of its containers' named ports, else its first
//! container port. A Service's port is matched by name or number (or is its only one); the
//! request goes to the first ready endpoint of its EndpointSlices that serves that port, at
//! the slice's resolved port number. The connection comes from the server's
//! [`super::pod_backend::PodBackend`] (`dial`): the simulated pods refuse it with 503.
//! Plain HTTP only: an `https:` scheme is refused.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use http::{HeaderName, header};
use hyper_util::rt::TokioIo;
use serde_json::Value;

use super::error::{ApiError, ApiResult};
use super::pod_backend::PodTarget;
use super::pod_io;
use super::selectors::{Filter, LabelSelector};
use super::server::Shared;

/// How long the pod has to answer a proxied request's head (a real API server's proxy
/// waits as long as its client does; kubectl's own 32 s bound is above it).
const RESPONSE_HEAD_TIMEOUT: Duration = Duration::from_secs(30);
/// The label that ties an EndpointSlice to its Service.
const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// What a proxy path names.
pub(crate) struct ProxyTarget<'a> {
    namespace: &'a str,
    /// `pods` or `services`.
    kind: &'a str,
    /// `[scheme:]name[:port]`, as the path gives it.
    name: &'a str,
}

/// The proxy target when `segments` name one.
pub(crate) fn proxy_target<'a>(segments: &[&'a str]) -> Option<ProxyTarget<'a>> {
    match segments {
        [
            "api",
            "v1",
            "namespaces",
            namespace,
            kind @ ("pods" | "services"),
            name,
            "proxy",
            ..,
        ] => Some(ProxyTarget {
            namespace,
            kind,
            name,
        }),
        _ => None,
    }
}

/// `(scheme, name, port)` of `[scheme:]name[:port]`.
fn split_name(raw: &str) -> (&str, &str, &str) {
    let parts: Vec<&str> = raw.split(':').collect();
    match parts.as_slice() {
        [name] => ("", name, ""),
        [name, port] => ("", name, port),
        [scheme, name, port, ..] => (scheme, name, port),
        [] => ("", "", ""),
    }
}

/// Forwards the request to the target's pod and answers what the pod answers.
pub(crate) async fn proxy_response(
    shared: Arc<Shared>,
    target: ProxyTarget<'_>,
    req: Request,
) -> ApiResult<Response> {
    let (scheme, name, port) = split_name(target.name);
    if !matches!(scheme, "" | "http") {
        return Err(ApiError::bad_request(format!(
            "proxying over {scheme} is not supported: pods are reached over plain HTTP"
        )));
    }
    let (pod, port) = match target.kind {
        "pods" => {
            let pod = pod_io::pod(&shared, target.namespace, name)?;
            let port = pod_port(&pod, port)?;
            (pod, port)
        }
        _ => service_endpoint(&shared, target.namespace, name, port)?,
    };
    let prefix = format!(
        "/api/v1/namespaces/{}/{}/{}/proxy",
        target.namespace, target.kind, target.name
    );
    let rest = req.uri().path().get(prefix.len()..).unwrap_or_default();
    let path = match (rest, req.uri().query()) {
        ("", None) => "/".to_owned(),
        ("", Some(q)) => format!("/?{q}"),
        (p, None) => p.to_owned(),
        (p, Some(q)) => format!("{p}?{q}"),
    };
    let address = format!(
        "{}:{port}",
        pod["status"]["podIP"].as_str().unwrap_or_default()
    );
    let target = PodTarget::new(shared.clone(), pod, String::new());
    let connection = shared.pod_backend().dial(target, port).await?;
    forward(connection, req, &path, &address).await
}

/// The pod's port `wanted` names: a number, a container port's name, or (empty) the first
/// container port.
fn pod_port(pod: &Value, wanted: &str) -> ApiResult<u16> {
    if let Ok(number) = wanted.parse::<u16>() {
        return Ok(number);
    }
    let ports: Vec<&Value> = pod["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|c| c["ports"].as_array().into_iter().flatten())
        .collect();
    let found = ports
        .iter()
        .find(|p| wanted.is_empty() || p["name"] == wanted)
        .and_then(|p| p["containerPort"].as_u64())
        .and_then(|p| u16::try_from(p).ok());
    let name = pod["metadata"]["name"].as_str().unwrap_or_default();
    found.ok_or_else(|| match wanted {
        "" => ApiError::service_unavailable(format!(
            "pod {name} names no container port: give one in the path (NAME:PORT)"
        )),
        _ => ApiError::service_unavailable(format!("pod {name} has no port named {wanted:?}")),
    })
}

/// The pod and port a Service's `port` (name, number, or empty for its only one) is
/// served at: the first ready endpoint of its slices that serves it.
fn service_endpoint(
    shared: &Shared,
    namespace: &str,
    name: &str,
    port: &str,
) -> ApiResult<(Arc<Value>, u16)> {
    let (service, slices) = {
        let store = shared.store.lock().expect("store lock");
        let services = store
            .type_for("v1", "Service")
            .ok_or_else(|| ApiError::unknown_path("services"))?;
        let service = store.get(&services, Some(namespace), name)?;
        let slices = match store.type_for("discovery.k8s.io/v1", "EndpointSlice") {
            Some(rt) => {
                let filter = Filter {
                    namespace: Some(namespace.to_owned()),
                    labels: LabelSelector::parse(&format!("{SERVICE_NAME_LABEL}={name}"))?,
                    ..Filter::default()
                };
                store.list(&rt, &filter, None, None)?.items
            }
            None => Vec::new(),
        };
        (service, slices)
    };
    let ports = service["spec"]["ports"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let chosen = ports
        .iter()
        .find(|p| {
            (port.is_empty() && ports.len() == 1)
                || p["name"] == port
                || p["port"].as_u64().is_some_and(|n| n.to_string() == port)
        })
        .ok_or_else(|| {
            ApiError::service_unavailable(format!(
                "no service port {port:?} found for service {name:?}"
            ))
        })?;
    let port_name = chosen["name"].as_str().unwrap_or_default();
    let unavailable =
        || ApiError::service_unavailable(format!("no endpoints available for service {name:?}"));
    let (pod_name, number) = slices
        .iter()
        .find_map(|slice| ready_endpoint(slice, port_name))
        .ok_or_else(unavailable)?;
    let pod = pod_io::pod(shared, namespace, &pod_name).map_err(|_| unavailable())?;
    Ok((pod, number))
}

/// A slice's first ready endpoint's pod, and the slice's number for port `port_name`.
fn ready_endpoint(slice: &Value, port_name: &str) -> Option<(String, u16)> {
    let number = slice["ports"]
        .as_array()?
        .iter()
        .find(|p| p["name"].as_str().unwrap_or_default() == port_name)?["port"]
        .as_u64()
        .and_then(|p| u16::try_from(p).ok())?;
    let endpoint = slice["endpoints"]
        .as_array()?
        .iter()
        .find(|e| e["conditions"]["ready"] != false && e["targetRef"]["kind"] == "Pod")?;
    Some((endpoint["targetRef"]["name"].as_str()?.to_owned(), number))
}

/// Headers that belong to one hop (RFC 9110 §7.6.1) and the caller's credentials, which
/// are the API server's and never reach the pod.
fn hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "authorization"
            | "host"
    )
}

/// Sends `req` to `path` over `connection` (HTTP/1.1) and relays the answer, its body
/// streamed.
async fn forward(
    connection: super::pod_backend::BoxedConnection,
    req: Request,
    path: &str,
    address: &str,
) -> ApiResult<Response> {
    let failed = |e: &dyn std::fmt::Display| {
        ApiError::service_unavailable(format!("error trying to reach {address}: {e}"))
    };
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(connection))
        .await
        .map_err(|e| failed(&e))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let (parts, body) = req.into_parts();
    let mut outgoing = http::Request::builder().method(parts.method).uri(path);
    for (name, value) in parts.headers.iter().filter(|(n, _)| !hop_by_hop(n)) {
        outgoing = outgoing.header(name, value);
    }
    let outgoing = outgoing
        .header(header::HOST, address)
        .body(body)
        .map_err(|e| ApiError::bad_request(format!("the proxied request: {e}")))?;
    let answer = tokio::time::timeout(RESPONSE_HEAD_TIMEOUT, sender.send_request(outgoing))
        .await
        .map_err(|_| failed(&format!("no answer within {RESPONSE_HEAD_TIMEOUT:?}")))?
        .map_err(|e| failed(&e))?;
    let (mut parts, body) = answer.into_parts();
    let relayed: Vec<HeaderName> = parts
        .headers
        .keys()
        .filter(|n| hop_by_hop(n))
        .cloned()
        .collect();
    for name in relayed {
        parts.headers.remove(name);
    }
    Ok(Response::from_parts(parts, Body::new(body)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn names_carry_scheme_and_port() {
        assert_eq!(split_name("op"), ("", "op", ""));
        assert_eq!(split_name("op:http"), ("", "op", "http"));
        assert_eq!(split_name("https:op:8443"), ("https", "op", "8443"));
    }

    #[test]
    fn a_pod_port_is_a_number_a_name_or_the_first() {
        let pod = json!({"metadata": {"name": "p"}, "spec": {"containers": [
            {"name": "c", "ports": [{"name": "agent", "containerPort": 6818},
                {"name": "http", "containerPort": 8080}]}]}});
        assert_eq!(pod_port(&pod, "9090").unwrap(), 9090);
        assert_eq!(pod_port(&pod, "http").unwrap(), 8080);
        assert_eq!(pod_port(&pod, "").unwrap(), 6818);
        assert_eq!(pod_port(&pod, "metrics").unwrap_err().code, 503);
    }

    #[test]
    fn a_service_goes_to_a_ready_endpoint_at_the_slice_port() {
        let slice = json!({"ports": [{"name": "http", "port": 8080}],
            "endpoints": [
                {"conditions": {"ready": false}, "targetRef": {"kind": "Pod", "name": "a"}},
                {"conditions": {"ready": true}, "targetRef": {"kind": "Pod", "name": "b"}}]});
        assert_eq!(ready_endpoint(&slice, "http"), Some(("b".to_owned(), 8080)));
        assert_eq!(ready_endpoint(&slice, "agent"), None);
    }
}
