//! A `kube::Client` over any [`Dialer`]: how the simulation hands the operator a client that
//! talks to the simulated API server over the simulated network.

use std::{
    task::{Context, Poll},
    time::Duration,
};

use futures::future::BoxFuture;
use http::{Request, Response, StatusCode, Uri, uri::PathAndQuery};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::Body;
use spur_operator::net::{Connector, Dialer};
use tower::{BoxError, ServiceBuilder, ServiceExt as _};

/// How long an idle pooled connection is kept (hyper's default).
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// kube-rs' server retry: first delay, cap, and most retries (`RetryPolicy::server_retry`).
const RETRY_FIRST_DELAY: Duration = Duration::from_millis(5);
const RETRY_MAX_DELAY: Duration = Duration::from_secs(1000);
const RETRY_MAX_ATTEMPTS: u32 = 15;

/// Transport settings of a client over a dialer, mirroring what `kube::Client::try_from`
/// builds from a `kube::Config` (so the operator meets the same client in the simulation as
/// in production).
#[derive(Clone, Debug)]
pub struct ClientOptions {
    /// Namespace of `Api::default_namespaced`.
    pub default_namespace: String,
    /// Bound on each connect; kube's default is 30 s.
    pub connect_timeout: Option<Duration>,
    /// Retry 429, 503 and 504 answers as kube's default client does (up to 15 times, the
    /// delay doubling from 5 ms up to 1000 s). Unlike kube's, the delays carry no jitter:
    /// kube's jitter comes from an unseeded RNG, which a deterministic run cannot have.
    pub retry_server_errors: bool,
    /// Sent as `Authorization: Bearer` on every request (a ServiceAccount's token, or an
    /// admin's); `None` sends no credentials.
    pub bearer_token: Option<String>,
}

impl Default for ClientOptions {
    /// What `kube::Config::new` sets.
    fn default() -> Self {
        Self::from_config(&kube::Config::new(Uri::from_static("http://kube-api")))
    }
}

impl ClientOptions {
    /// The transport settings of a `kube::Config` (its URL, TLS and auth do not apply).
    pub fn from_config(config: &kube::Config) -> Self {
        Self {
            default_namespace: config.default_namespace.clone(),
            connect_timeout: config.connect_timeout,
            retry_server_errors: config.default_retry,
            bearer_token: None,
        }
    }
}

/// A `kube::Client` whose connections to `http://{host}:{port}` are opened by `dialer`, with
/// kube's default transport settings ([`ClientOptions::default`]).
pub fn client_over<D: Dialer>(dialer: D, host: &str, port: u16) -> kube::Client {
    client_over_with(dialer, host, port, &ClientOptions::default())
}

/// A `kube::Client` whose connections to `http://{host}:{port}` are opened by `dialer`.
///
/// Plain HTTP/1.1, hyper's connection pool, and the bearer token, connect bound and
/// server-error retries of `options`; no read timeout (kube's default has none either).
pub fn client_over_with<D: Dialer>(
    dialer: D,
    host: &str,
    port: u16,
    options: &ClientOptions,
) -> kube::Client {
    let authority: http::uri::Authority = format!("{host}:{port}").parse().unwrap_or_else(|_| {
        // An unparsable host still dials through the dialer; the URI only needs to be valid.
        http::uri::Authority::from_static("kube-api:80")
    });
    let http = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .pool_timer(TokioTimer::new())
        .pool_idle_timeout(POOL_IDLE_TIMEOUT)
        .build(
            Connector::new(dialer)
                .to(host, port)
                .dial_timeout(options.connect_timeout),
        );
    let authorization: Option<http::HeaderValue> = options
        .bearer_token
        .as_ref()
        .and_then(|t| format!("Bearer {t}").parse().ok());
    let base_uri = move |mut req: Request<Body>| {
        if let Some(value) = &authorization {
            req.headers_mut()
                .insert(http::header::AUTHORIZATION, value.clone());
        }
        let path = req
            .uri()
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| PathAndQuery::from_static("/"));
        *req.uri_mut() = Uri::builder()
            .scheme("http")
            .authority(authority.clone())
            .path_and_query(path)
            .build()
            .expect("scheme, authority and path make a URI");
        req
    };
    let namespace = options.default_namespace.clone();
    if options.retry_server_errors {
        let service = ServiceBuilder::new()
            .map_request(base_uri)
            .service(RetryServerErrors { inner: http });
        kube::Client::new(service, namespace)
    } else {
        let service = ServiceBuilder::new()
            .map_request(base_uri)
            .service(http)
            .map_err(BoxError::from);
        kube::Client::new(service, namespace)
    }
}

/// Retries 429, 503 and 504 answers with a doubling delay, as kube's default client does.
#[derive(Clone)]
struct RetryServerErrors<S> {
    inner: S,
}

impl<S> tower::Service<Request<Body>> for RetryServerErrors<S>
where
    S: tower::Service<Request<Body>, Response = Response<Incoming>> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send,
{
    type Response = Response<Incoming>;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<Self::Response, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, mut req: Request<Body>) -> Self::Future {
        // The ready service serves the first attempt; clones serve the retries.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(async move {
            let mut delay = RETRY_FIRST_DELAY;
            let mut attempt = 0;
            loop {
                let again = (attempt < RETRY_MAX_ATTEMPTS)
                    .then(|| copy_request(&req))
                    .flatten();
                let response = inner.call(req).await.map_err(Into::into)?;
                let status = response.status();
                let retryable = matches!(
                    status,
                    StatusCode::TOO_MANY_REQUESTS
                        | StatusCode::SERVICE_UNAVAILABLE
                        | StatusCode::GATEWAY_TIMEOUT
                );
                match again {
                    Some(next) if retryable => {
                        tokio::time::sleep(delay).await;
                        delay = (delay * 2).min(RETRY_MAX_DELAY);
                        attempt += 1;
                        req = next;
                        inner.ready().await.map_err(Into::into)?;
                    }
                    _ => return Ok(response),
                }
            }
        })
    }
}

/// A copy of a request whose body is in memory (a streamed body cannot be sent twice).
fn copy_request(req: &Request<Body>) -> Option<Request<Body>> {
    let mut copy = Request::new(req.body().try_clone()?);
    *copy.method_mut() = req.method().clone();
    *copy.uri_mut() = req.uri().clone();
    *copy.version_mut() = req.version();
    *copy.headers_mut() = req.headers().clone();
    Some(copy)
}
