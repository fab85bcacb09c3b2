//! The HTTP side: routing Kubernetes API paths to the store, and serving connections.

use std::{
    collections::BTreeMap,
    future::Future,
    io,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use axum::{
    Json, Router,
    body::Body,
    extract::{Query, Request, State},
    response::{IntoResponse, Response},
};
use bytes::Bytes;
use http::{HeaderMap, Method, StatusCode, header};
use hyper_util::{
    rt::{TokioExecutor, TokioIo, TokioTimer},
    server::conn::auto,
    service::TowerToHyperService,
};
use serde_json::{Value, json};
use spur_operator::net::Listener;
use tokio::io::{AsyncRead, AsyncWrite};

use crate::clock::TimeSource;

use super::{
    access::{self, Authorization, Denial},
    auth::{Tokens, UserInfo},
    client::{ClientOptions, client_over_with},
    discovery,
    error::{ApiError, ApiResult},
    event_view,
    faults::{CutKind, Faults},
    patch::{PatchKind, parse_patch_body},
    pod_backend::{LogRequest, PodBackend, SimulatedPods},
    pod_io, port_forward, proxy, rbac,
    resources::{ResourceKey, ResourceType},
    seed,
    selectors::{FieldSelector, Filter, LabelSelector},
    store::{Change, ListPage, Preconditions, Store, StoreConfig},
    tls::TlsIdentity,
    transport::memory_pair,
    watch::{WatchRequest, partial_metadata, watch_stream},
    writes::{WriteLog, WriteMethod, WriteRecord, lease_holder},
};

/// Largest request body taken (a real server takes 3 MiB objects; patches are small).
const MAX_BODY: usize = 16 * 1024 * 1024;
/// The media type of the OpenAPI v2 answer (Go rejects the "@v1.0" of the real one).
const OPENAPI_V2_PROTOBUF: &str = "application/octet-stream";
/// A watch without `timeoutSeconds` ends after this (a real server picks 30 to 60 minutes).
const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(1800);

/// State shared by every connection.
pub(crate) struct Shared {
    pub(crate) store: Mutex<Store>,
    pub(crate) faults: Faults,
    /// Watch streams started so far.
    pub(crate) watches_started: AtomicU64,
    /// Watch streams open now.
    pub(crate) watches_open: AtomicU64,
    /// Writes applied over HTTP, with the writing host (locked while the store's lock is
    /// held, so records are in resourceVersion order).
    pub(crate) writes: Mutex<WriteLog>,
    /// Whether requests are authenticated and authorised.
    pub(crate) authorization: Authorization,
    /// See [`ApiServer::authorize_exec_upgrade_as_get`].
    pub(crate) exec_upgrade_as_get: std::sync::atomic::AtomicBool,
    /// See [`ApiServerConfig::anonymous`].
    pub(crate) anonymous: Option<UserInfo>,
    /// The bearer tokens the server accepts.
    pub(crate) tokens: Mutex<Tokens>,
    /// Requests refused with 401 or 403, in order.
    pub(crate) denials: Mutex<Vec<Denial>>,
    /// What answers for pods' logs, execs, port-forwards and proxies.
    pub(crate) pod_backend: std::sync::RwLock<Arc<dyn PodBackend>>,
}

impl Shared {
    pub(crate) fn pod_backend(&self) -> Arc<dyn PodBackend> {
        self.pod_backend.read().expect("pod backend lock").clone()
    }
}

/// The host a connection came from, handed to every request on it.
#[derive(Clone, Debug)]
struct Peer(Option<Arc<str>>);

/// Settings of an [`ApiServer`].
#[derive(Clone, Debug, Default)]
pub struct ApiServerConfig {
    /// History size and seed.
    pub store: StoreConfig,
    /// Where timestamps come from; `None`: [`TimeSource::simulated`], started at creation.
    pub clock: Option<TimeSource>,
    /// RBAC (the default), or allow-all for a test of the store itself.
    pub authorization: Authorization,
    /// Who a request without any credentials is: nobody (401, the default), or a user.
    /// kubectl sends no credentials over plain HTTP (client-go sends them only over TLS), so
    /// `spur-sim kube-api` makes it the admin, as kube-apiserver's old insecure port did.
    pub anonymous: Option<UserInfo>,
}

/// An in-memory Kubernetes API server. Cheap to clone; clones share the same state.
#[derive(Clone)]
pub struct ApiServer {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for ApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiServer")
            .field("resource_version", &self.resource_version())
            .finish()
    }
}

impl ApiServer {
    /// A server with the built-in kinds, the `default` and `kube-system` namespaces.
    pub fn new(config: ApiServerConfig) -> Self {
        let clock = config.clock.unwrap_or_else(TimeSource::simulated);
        let store = Store::new(clock, config.store);
        Self {
            shared: Arc::new(Shared {
                store: Mutex::new(store),
                faults: Faults::default(),
                watches_started: AtomicU64::new(0),
                watches_open: AtomicU64::new(0),
                writes: Mutex::new(WriteLog::default()),
                authorization: config.authorization,
                exec_upgrade_as_get: std::sync::atomic::AtomicBool::new(false),
                anonymous: config.anonymous,
                tokens: Mutex::new(Tokens::default()),
                denials: Mutex::new(Vec::new()),
                pod_backend: std::sync::RwLock::new(Arc::new(SimulatedPods)),
            }),
        }
    }

    /// A new bearer token for `user` (see [`super::auth`]).
    pub fn mint_token(&self, user: UserInfo) -> String {
        self.shared.tokens.lock().expect("token lock").mint(user)
    }

    /// A new token of the cluster admin (`system:masters`): what Kubernetes' own parts,
    /// the judges and the tests' kubectl act with.
    pub fn admin_token(&self) -> String {
        self.mint_token(UserInfo::admin())
    }

    /// A new token of ServiceAccount `namespace/name`, as a TokenRequest gives one: the
    /// ServiceAccount must exist.
    pub fn service_account_token(&self, namespace: &str, name: &str) -> ApiResult<String> {
        self.get("v1", "ServiceAccount", Some(namespace), name)?;
        Ok(self.mint_token(UserInfo::service_account(namespace, name)))
    }

    /// Authorises a WebSocket `pods/exec` (a GET upgraded) as `get`, as older Kubernetes
    /// releases did, instead of the `create` newer ones require (the default).
    pub fn authorize_exec_upgrade_as_get(&self, yes: bool) {
        self.shared
            .exec_upgrade_as_get
            .store(yes, Ordering::Relaxed);
    }

    /// Puts `backend` behind pods' logs, execs, port-forwards and proxies, in place of the
    /// simulated pods' answers (see [`super::pod_backend`]).
    pub fn set_pod_backend(&self, backend: Arc<dyn PodBackend>) {
        *self.shared.pod_backend.write().expect("pod backend lock") = backend;
    }

    /// The requests refused with 401 or 403 so far.
    pub fn denials(&self) -> Vec<Denial> {
        self.shared.denials.lock().expect("denial lock").clone()
    }

    /// The fault switches.
    pub fn faults(&self) -> &Faults {
        &self.shared.faults
    }

    /// Forgets all history: every watch open now ends with an in-stream 410, and so does
    /// any watch or continued list from a resourceVersion before now.
    pub fn expire_resource_versions(&self) {
        self.store().compact();
        self.shared.faults.cut_watches(CutKind::Expire);
    }

    /// The current resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.store().resource_version()
    }

    /// Calls `observer` with every change from now on, in resourceVersion order, as it
    /// happens: what the simulation's safety checks and trace hash read. It runs under the
    /// store's lock, so it must not call back into the server.
    pub fn observe(&self, observer: impl Fn(&Change) + Send + Sync + 'static) {
        self.store().observe(Arc::new(observer));
    }

    /// Takes the writes applied over HTTP since the last call, in the order applied, each
    /// with the host that made it (see [`super::writes`]).
    pub fn take_writes(&self) -> Vec<WriteRecord> {
        self.shared.writes.lock().expect("write log lock").take()
    }

    /// Writes that were not recorded because the log was full (nobody took them).
    pub fn writes_dropped(&self) -> u64 {
        self.shared.writes.lock().expect("write log lock").dropped()
    }

    /// Watch streams started so far, and open now.
    pub fn watch_counts(&self) -> (u64, u64) {
        (
            self.shared.watches_started.load(Ordering::Relaxed),
            self.shared.watches_open.load(Ordering::Relaxed),
        )
    }

    /// The axum router serving the API (for embedding; [`ApiServer::serve`] uses it).
    pub fn router(&self) -> Router {
        Router::new()
            .fallback(handle)
            .with_state(self.shared.clone())
    }

    /// Serves every connection `listener` accepts, each on its own task, until accepting
    /// fails; in a simulation, the writes of each are recorded under its peer's host.
    pub async fn serve<L: Listener>(&self, mut listener: L) -> io::Result<()> {
        loop {
            let (io, peer) = listener.accept().await?;
            tokio::spawn(self.serve_connection_from(io, crate::clock::peer_host(peer)));
        }
    }

    /// [`ApiServer::serve`] over TLS with `identity`: each accepted connection's handshake
    /// runs on its own task, bounded by the identity's handshake timeout, so a stalled
    /// client delays no other; a failed handshake ends only its connection.
    pub async fn serve_tls<L: Listener>(
        &self,
        mut listener: L,
        identity: TlsIdentity,
    ) -> io::Result<()> {
        loop {
            let (io, peer) = listener.accept().await?;
            let (server, identity) = (self.clone(), identity.clone());
            tokio::spawn(async move {
                let handshake = identity.acceptor().accept(io);
                match tokio::time::timeout(identity.handshake_timeout(), handshake).await {
                    Ok(Ok(tls)) => {
                        server
                            .serve_connection_from(tls, crate::clock::peer_host(peer))
                            .await;
                    }
                    Ok(Err(error)) => tracing::debug!(%error, %peer, "TLS handshake failed"),
                    Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                }
            });
        }
    }

    /// Serves one connection (HTTP/1.1 or h2) until it closes.
    pub fn serve_connection<IO>(&self, io: IO) -> impl Future<Output = ()> + Send + 'static
    where
        IO: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        self.serve_connection_from(io, None)
    }

    /// [`ApiServer::serve_connection`] for a connection from host `peer`, which the
    /// writes it makes are recorded under.
    pub fn serve_connection_from<IO>(
        &self,
        io: IO,
        peer: Option<String>,
    ) -> impl Future<Output = ()> + Send + 'static
    where
        IO: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        let router = self
            .router()
            .layer(axum::Extension(Peer(peer.map(Arc::from))));
        let service = TowerToHyperService::new(router);
        async move {
            let mut builder = auto::Builder::new(TokioExecutor::new());
            // No header-read timeout: idle pooled client connections must stay open.
            builder
                .http1()
                .timer(TokioTimer::new())
                .header_read_timeout(None);
            // With upgrades: a pods/exec answer switches its connection to a WebSocket.
            if let Err(error) = builder
                .serve_connection_with_upgrades(TokioIo::new(io), service)
                .await
            {
                tracing::debug!(%error, "API server connection ended with an error");
            }
        }
    }

    /// An admin's client connected to this server through in-memory pipes, with kube's
    /// default transport settings (spawns the serving task on the current runtime).
    pub fn in_memory_client(&self) -> kube::Client {
        self.in_memory_client_with(&ClientOptions {
            bearer_token: Some(self.admin_token()),
            ..ClientOptions::default()
        })
    }

    /// [`ApiServer::in_memory_client`] with other transport settings.
    pub fn in_memory_client_with(&self, options: &ClientOptions) -> kube::Client {
        let (dialer, listener) = memory_pair();
        let server = self.clone();
        tokio::spawn(async move {
            // Ends when every clone of the client is gone.
            let _ = server.serve(listener).await;
        });
        client_over_with(dialer, "kube-api", 80, options)
    }

    /// Adds `count` labelled nodes (`node-0`, ...), as `--seed-nodes` does.
    pub fn seed_nodes(&self, count: usize) -> ApiResult<()> {
        for i in 0..count {
            self.create(seed::node(i))?;
        }
        Ok(())
    }

    /// Creates an object directly (no HTTP), by its `apiVersion`, `kind` and `metadata.namespace`.
    pub fn create(&self, obj: Value) -> ApiResult<Value> {
        let mut store = self.store();
        let rt = type_of(&store, &obj)?;
        let ns = obj["metadata"]["namespace"].as_str().map(str::to_owned);
        Ok((*store.create(&rt, ns.as_deref(), obj)?).clone())
    }

    /// Reads an object directly.
    pub fn get(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> ApiResult<Value> {
        let store = self.store();
        let rt = known_type(&store, api_version, kind)?;
        Ok((*store.get(&rt, namespace, name)?).clone())
    }

    /// Every object of a kind, ordered by namespace and name.
    pub fn list(&self, api_version: &str, kind: &str) -> ApiResult<Vec<Value>> {
        let store = self.store();
        let rt = known_type(&store, api_version, kind)?;
        Ok(store
            .list(&rt, &Filter::default(), None, None)?
            .items
            .iter()
            .map(|o| (**o).clone())
            .collect())
    }

    /// Merge-patches an object (or only its status) directly.
    pub fn merge_patch(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
        patch: &Value,
        status: bool,
    ) -> ApiResult<Value> {
        let mut store = self.store();
        let rt = known_type(&store, api_version, kind)?;
        Ok((*store.patch(&rt, namespace, name, PatchKind::Merge, patch, status)?).clone())
    }

    /// Deletes an object directly (finalizers hold it, as over HTTP).
    pub fn delete(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> ApiResult<Value> {
        let mut store = self.store();
        let rt = known_type(&store, api_version, kind)?;
        Ok((*store.delete(&rt, namespace, name, &Preconditions::default())?).clone())
    }

    fn store(&self) -> std::sync::MutexGuard<'_, Store> {
        self.shared.store.lock().expect("store lock")
    }
}

fn known_type(store: &Store, api_version: &str, kind: &str) -> ApiResult<ResourceType> {
    store.type_for(api_version, kind).ok_or_else(|| {
        ApiError::unknown_path(&format!(
            "no kind {kind:?} is registered for version {api_version:?}"
        ))
    })
}

fn type_of(store: &Store, obj: &Value) -> ApiResult<ResourceType> {
    let api_version = obj["apiVersion"].as_str().unwrap_or_default();
    let kind = obj["kind"].as_str().unwrap_or_default();
    known_type(store, api_version, kind)
}

fn error_response(err: &ApiError) -> Response {
    let code = StatusCode::from_u16(err.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (code, Json(err.to_status())).into_response()
}

async fn handle(State(shared): State<Arc<Shared>>, mut req: Request) -> Response {
    let method = req.method().clone();
    let uri = req.uri().clone();
    let host = req.extensions().get::<Peer>().and_then(|p| p.0.clone());
    let response = match shared
        .faults
        .gate()
        .await
        .and_then(|()| access::check(&shared, &method, &uri, req.headers(), host))
    {
        Err(err) => error_response(&err),
        Ok(user) => {
            if let Some(user) = user {
                req.extensions_mut().insert(user);
            }
            match route(shared, req).await {
                Ok(response) => response,
                Err(err) => error_response(&err),
            }
        }
    };
    tracing::debug!(%method, %uri, status = response.status().as_u16(), "kube-api request");
    response
}

/// What a resource path names.
struct Target {
    rt: ResourceType,
    namespace: Option<String>,
    name: Option<String>,
    status: bool,
    /// `.../scale` (see [`super::scale`]).
    scale: bool,
}

/// How the client asked for objects in the `Accept` header.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Shape {
    Full,
    Metadata,
    Table,
}

fn shape(headers: &HeaderMap) -> Shape {
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if accept.contains("as=Table") {
        Shape::Table
    } else if accept.contains("as=PartialObjectMetadata") {
        Shape::Metadata
    } else {
        Shape::Full
    }
}

/// Answers one authorised request: a pod's exec or log, discovery, or a resource path.
async fn route(shared: Arc<Shared>, req: Request) -> ApiResult<Response> {
    let path = req.uri().path().to_owned();
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    if let Some((ns, name, sub)) = pod_io::pod_subresource(&segments) {
        return pod_subresource_response(shared, ns, name, sub, req).await;
    }
    if let Some(target) = proxy::proxy_target(&segments) {
        return proxy::proxy_response(shared, target, req).await;
    }
    let (parts, body) = req.into_parts();
    let query = query_params(&parts.uri)?;
    let (group, version, rest) = match segments.as_slice() {
        ["api", "v1", rest @ ..] if !rest.is_empty() => ("", "v1", rest),
        ["apis", group, version, rest @ ..] if !rest.is_empty() => (*group, *version, rest),
        _ if parts.method == Method::GET => return discovery_response(&shared, &segments, &path),
        _ => return Err(ApiError::unknown_path(&path)),
    };
    let target = {
        let store = shared.store.lock().expect("store lock");
        resolve(&store, group, version, rest).ok_or_else(|| ApiError::unknown_path(&path))?
    };
    let body = axum::body::to_bytes(body, MAX_BODY)
        .await
        .map_err(|e| ApiError::bad_request(format!("could not read the request body: {e}")))?;
    if query.contains_key("dryRun") {
        return Err(ApiError::bad_request(
            "dryRun is not supported by spur-sim's API server",
        ));
    }
    serve_resource(shared, &parts, &body, &query, target)
}

/// The query string's parameters; 400 when it does not parse.
fn query_params(uri: &http::Uri) -> ApiResult<BTreeMap<String, String>> {
    Query::try_from_uri(uri)
        .map(|q| q.0)
        .map_err(|e| ApiError::bad_request(format!("invalid query: {e}")))
}

/// A pod's `exec`, `portforward` or `log` subresource.
async fn pod_subresource_response(
    shared: Arc<Shared>,
    ns: &str,
    name: &str,
    sub: &str,
    req: Request,
) -> ApiResult<Response> {
    match sub {
        "exec" => return pod_io::exec_response(shared, ns, name, req).await,
        "portforward" => return port_forward::response(shared, ns, name, req),
        _ => {}
    }
    let query = query_params(req.uri())?;
    let flag = |key: &str| matches!(query.get(key).map(String::as_str), Some("true" | "1"));
    let tail_lines = match query.get("tailLines").filter(|t| !t.is_empty()) {
        Some(t) => Some(
            t.parse::<usize>()
                .map_err(|_| ApiError::bad_request(format!("invalid tailLines {t:?}")))?,
        ),
        None => None,
    };
    let request = LogRequest {
        follow: flag("follow"),
        tail_lines,
        previous: flag("previous"),
        timestamps: flag("timestamps"),
    };
    pod_io::log_response(
        shared,
        ns,
        name,
        query.get("container").map(String::as_str),
        request,
    )
    .await
}

/// Answers a request on a resource path by its method: read, list or watch, or write.
fn serve_resource(
    shared: Arc<Shared>,
    parts: &http::request::Parts,
    body: &Bytes,
    query: &BTreeMap<String, String>,
    target: Target,
) -> ApiResult<Response> {
    let peer = parts.extensions.get::<Peer>().and_then(|p| p.0.clone());
    let user = parts.extensions.get::<UserInfo>().cloned();
    let shape = shape(&parts.headers);
    let content_type = content_type(&parts.headers);
    let Target {
        rt,
        namespace,
        name,
        status,
        scale,
    } = target;
    let ns = namespace.as_deref();
    if let (true, Some(name)) = (scale, &name) {
        return scale_response(&shared, parts, body, &peer, &rt, ns, name);
    }

    match (&parts.method, name) {
        (&Method::GET, None) => list_or_watch(shared, rt, namespace, query, shape),
        (&Method::GET, Some(name)) => get_response(&shared, &rt, ns, &name, shape),
        (&Method::POST, None) => {
            if rt.namespaced && ns.is_none() {
                return Err(ApiError::method_not_allowed("POST"));
            }
            let obj = json_body(content_type, body)?;
            if let Some(user) = &user {
                admit_create(&shared, user, parts, &obj, &peer)?;
            }
            let created = write(&shared, &peer, WriteMethod::Create, &rt, false, |store| {
                store.create(&rt, ns, obj)
            })?;
            Ok((StatusCode::CREATED, Json((*created).clone())).into_response())
        }
        (&Method::PUT, Some(name)) => {
            let obj = json_body(content_type, body)?;
            injected_status_conflict(&shared, &rt, status, &name)?;
            let updated = write(&shared, &peer, WriteMethod::Update, &rt, status, |store| {
                store.update(&rt, ns, &name, obj, status)
            })?;
            Ok(Json((*updated).clone()).into_response())
        }
        (&Method::PATCH, Some(name)) => {
            let kind = PatchKind::from_content_type(content_type)?;
            let patch = parse_patch_body(kind, body)?;
            injected_status_conflict(&shared, &rt, status, &name)?;
            let patched = write(&shared, &peer, WriteMethod::Patch, &rt, status, |store| {
                store.patch(&rt, ns, &name, kind, &patch, status)
            })?;
            Ok(Json((*patched).clone()).into_response())
        }
        (&Method::DELETE, Some(name)) => {
            let pre = preconditions(body)?;
            let deleted = write(&shared, &peer, WriteMethod::Delete, &rt, false, |store| {
                store.delete(&rt, ns, &name, &pre)
            })?;
            Ok(Json((*deleted).clone()).into_response())
        }
        (&Method::DELETE, None) => delete_collection(&shared, &peer, &rt, namespace, query),
        (method, _) => Err(ApiError::method_not_allowed(method.as_str())),
    }
}

/// The request's Content-Type, or "" without one (or with one that is not text).
fn content_type(headers: &HeaderMap) -> &str {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

/// GET, PUT or PATCH on `.../scale`: the object's Scale, written to its `spec.replicas`.
fn scale_response(
    shared: &Shared,
    parts: &http::request::Parts,
    body: &Bytes,
    peer: &Option<Arc<str>>,
    rt: &ResourceType,
    ns: Option<&str>,
    name: &str,
) -> ApiResult<Response> {
    use super::scale::{ScaleChange, scale_of, write as write_scale};
    let content_type = content_type(&parts.headers);
    let object = match parts.method {
        Method::GET => shared.store.lock().expect("store lock").get(rt, ns, name)?,
        Method::PUT => {
            let scale = json_body(content_type, body)?;
            write(shared, peer, WriteMethod::Update, rt, false, |store| {
                write_scale(store, rt, ns, name, ScaleChange::Replace(&scale))
            })?
        }
        Method::PATCH => {
            let kind = PatchKind::from_content_type(content_type)?;
            let patch = parse_patch_body(kind, body)?;
            write(shared, peer, WriteMethod::Patch, rt, false, |store| {
                write_scale(store, rt, ns, name, ScaleChange::Patch(kind, &patch))
            })?
        }
        ref other => return Err(ApiError::method_not_allowed(other.as_str())),
    };
    Ok(Json(scale_of(&object)).into_response())
}

/// A status write refused with 409 when the faults hold a conflict for the next one.
fn injected_status_conflict(
    shared: &Shared,
    rt: &ResourceType,
    status: bool,
    name: &str,
) -> ApiResult<()> {
    if status && shared.faults.take_status_conflict() {
        return Err(ApiError::conflict(
            &rt.qualified(),
            &rt.group,
            &rt.plural,
            name,
        ));
    }
    Ok(())
}

/// GET on a collection: a watch stream when asked for one, else one page of the list in
/// the shape the client asked for.
fn list_or_watch(
    shared: Arc<Shared>,
    rt: ResourceType,
    namespace: Option<String>,
    query: &BTreeMap<String, String>,
    shape: Shape,
) -> ApiResult<Response> {
    let filter = filter_from(query, namespace)?;
    if matches!(query.get("watch").map(String::as_str), Some("true" | "1")) {
        return watch_response(shared, rt, filter, query, shape == Shape::Metadata);
    }
    let limit = match query.get("limit").filter(|l| !l.is_empty()) {
        Some(l) => Some(
            l.parse::<usize>()
                .map_err(|_| ApiError::bad_request(format!("invalid limit {l:?}")))?,
        ),
        None => None,
    };
    let store = shared.store.lock().expect("store lock");
    let mut page = store.list(
        &rt,
        &filter,
        limit,
        query.get("continue").map(String::as_str),
    )?;
    if rt.group.is_empty() && rt.plural == "events" && page.continue_token.is_none() {
        add_newer_events(&store, &filter, &mut page)?;
    }
    let rv = page.resource_version.to_string();
    let mut meta = json!({"resourceVersion": rv});
    if let Some(token) = &page.continue_token {
        meta["continue"] = json!(token);
    }
    if let Some(remaining) = page.remaining {
        meta["remainingItemCount"] = json!(remaining);
    }
    let list = match shape {
        Shape::Table => {
            let objects: Vec<&Value> = page.items.iter().map(|o| &**o).collect();
            let mut table = discovery::table(&rt, &objects, &rv, store.clock().now());
            table["metadata"] = meta;
            table
        }
        Shape::Metadata => json!({
            "kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1", "metadata": meta,
            "items": page.items.iter().map(|o| partial_metadata(o)).collect::<Vec<_>>(),
        }),
        Shape::Full => json!({
            "kind": format!("{}List", rt.kind), "apiVersion": rt.api_version(), "metadata": meta,
            "items": page.items.iter().map(|o| &**o).collect::<Vec<_>>(),
        }),
    };
    Ok(Json(list).into_response())
}

/// Appends to a last page of core Events the `events.k8s.io` Events that match `filter`,
/// shown as core ones: one Event store serves both group versions (see `event_view`).
fn add_newer_events(store: &Store, filter: &Filter, page: &mut ListPage) -> ApiResult<()> {
    let newer = ResourceKey {
        group: "events.k8s.io".to_owned(),
        version: "v1".to_owned(),
        plural: "events".to_owned(),
    };
    if let Some(newer) = store.resource(&newer).cloned() {
        let everything = Filter {
            namespace: filter.namespace.clone(),
            ..Filter::default()
        };
        let told = store.list(&newer, &everything, None, None)?;
        page.items.extend(
            told.items
                .iter()
                .map(|e| event_view::core_event(e))
                .filter(|e| filter.matches(e))
                .map(Arc::new),
        );
    }
    Ok(())
}

/// GET on one object, in the shape the client asked for.
fn get_response(
    shared: &Shared,
    rt: &ResourceType,
    ns: Option<&str>,
    name: &str,
    shape: Shape,
) -> ApiResult<Response> {
    let store = shared.store.lock().expect("store lock");
    let obj = store.get(rt, ns, name)?;
    let out = match shape {
        Shape::Table => {
            let rv = obj["metadata"]["resourceVersion"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            discovery::table(rt, &[&obj], &rv, store.clock().now())
        }
        Shape::Metadata => partial_metadata(&obj),
        Shape::Full => (*obj).clone(),
    };
    Ok(Json(out).into_response())
}

/// DELETE on a collection: deletes every matching object, one recorded write each, and
/// answers the list of what was deleted.
fn delete_collection(
    shared: &Shared,
    peer: &Option<Arc<str>>,
    rt: &ResourceType,
    namespace: Option<String>,
    query: &BTreeMap<String, String>,
) -> ApiResult<Response> {
    let filter = filter_from(query, namespace)?;
    let mut store = shared.store.lock().expect("store lock");
    let names: Vec<(Option<String>, String)> = store
        .list(rt, &filter, None, None)?
        .items
        .iter()
        .map(|o| {
            let ns = o["metadata"]["namespace"].as_str().map(str::to_owned);
            (
                ns,
                o["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            )
        })
        .collect();
    let mut items = Vec::new();
    for (ns, name) in names {
        let before = store.resource_version();
        let deleted = store.delete(rt, ns.as_deref(), &name, &Preconditions::default())?;
        record_write(
            shared,
            &store,
            before,
            peer,
            WriteMethod::Delete,
            rt,
            false,
            &deleted,
        );
        items.push((*deleted).clone());
    }
    let rv = store.resource_version().to_string();
    Ok(Json(
        json!({"kind": format!("{}List", rt.kind), "apiVersion": rt.api_version(),
        "metadata": {"resourceVersion": rv}, "items": items}),
    )
    .into_response())
}

/// The admission check of a create by `user` (owner references), its refusal logged.
fn admit_create(
    shared: &Shared,
    user: &UserInfo,
    parts: &http::request::Parts,
    obj: &Value,
    peer: &Option<Arc<str>>,
) -> ApiResult<()> {
    let attrs = rbac::Attributes::of_request(
        parts.method.as_str(),
        parts.uri.path(),
        &BTreeMap::new(),
        false,
    );
    let store = shared.store.lock().expect("store lock");
    let admitted = access::admit_owner_references(&store, user, &attrs, obj);
    drop(store);
    if let Err(err) = &admitted {
        let request = format!("{} {}", parts.method, parts.uri);
        access::record(shared, err, Some(user), peer.clone(), request);
    }
    admitted
}

/// Applies one write under the store's lock and records it (see [`record_write`]).
fn write(
    shared: &Shared,
    peer: &Option<Arc<str>>,
    method: WriteMethod,
    rt: &ResourceType,
    status: bool,
    apply: impl FnOnce(&mut Store) -> ApiResult<Arc<Value>>,
) -> ApiResult<Arc<Value>> {
    let mut store = shared.store.lock().expect("store lock");
    let before = store.resource_version();
    let object = apply(&mut store)?;
    record_write(shared, &store, before, peer, method, rt, status, &object);
    Ok(object)
}

/// Records a write that changed something (the resourceVersion moved past `before`);
/// a repeated delete of an object already being deleted changes nothing and is not one.
/// Called with the store's lock held, so the log is in resourceVersion order.
#[allow(clippy::too_many_arguments)]
fn record_write(
    shared: &Shared,
    store: &Store,
    before: u64,
    peer: &Option<Arc<str>>,
    method: WriteMethod,
    rt: &ResourceType,
    status: bool,
    object: &Value,
) {
    let rv = store.resource_version();
    if rv == before {
        return;
    }
    let meta = &object["metadata"];
    let is_lease = rt.kind == "Lease" && rt.group == "coordination.k8s.io";
    shared
        .writes
        .lock()
        .expect("write log lock")
        .push(WriteRecord {
            rv,
            at: crate::clock::host_elapsed().unwrap_or_default(),
            host: peer.clone(),
            method,
            kind: rt.kind.clone(),
            namespace: meta["namespace"].as_str().map(str::to_owned),
            name: meta["name"].as_str().unwrap_or_default().to_owned(),
            status,
            holder: if is_lease && method != WriteMethod::Delete {
                lease_holder(object)
            } else {
                None
            },
        });
}

/// Resolves `{plural}[/{name}[/status]]` or `namespaces/{ns}/{plural}[/{name}[/status]]`.
fn resolve(store: &Store, group: &str, version: &str, rest: &[&str]) -> Option<Target> {
    let lookup = |plural: &str| {
        store
            .resource(&ResourceKey {
                group: group.to_owned(),
                version: version.to_owned(),
                plural: plural.to_owned(),
            })
            .cloned()
    };
    let (rt, namespace, tail) = match rest {
        ["namespaces", ns, plural, tail @ ..] if lookup(plural).is_some_and(|t| t.namespaced) => {
            (lookup(plural)?, Some((*ns).to_owned()), tail)
        }
        [plural, tail @ ..] => (lookup(plural)?, None, tail),
        [] => return None,
    };
    let (name, status, scale) = match tail {
        [] => (None, false, false),
        [name] => (Some((*name).to_owned()), false, false),
        [name, "status"] => (Some((*name).to_owned()), true, false),
        [name, "scale"] if super::scale::has_scale(&rt) => (Some((*name).to_owned()), false, true),
        _ => return None,
    };
    // Named namespaced objects live under a namespace; cluster-scoped ones never do; only
    // kinds with a status subresource serve `.../status`.
    if (rt.namespaced && namespace.is_none() && name.is_some())
        || (status && !rt.status_subresource)
    {
        return None;
    }
    Some(Target {
        rt,
        namespace,
        name,
        status,
        scale,
    })
}

fn discovery_response(shared: &Shared, segments: &[&str], path: &str) -> ApiResult<Response> {
    let store = shared.store.lock().expect("store lock");
    let doc = match segments {
        [] => {
            json!({"paths": ["/api", "/api/v1", "/apis", "/healthz", "/livez", "/readyz", "/version"]})
        }
        ["version"] => discovery::version(),
        ["healthz" | "livez" | "readyz"] => return Ok("ok".into_response()),
        // An empty OpenAPI v2 document (a zero-length protobuf message): kubectl's client-side
        // validation finds no schema and accepts the objects as they are.
        ["openapi", "v2"] => {
            return Ok((
                [(header::CONTENT_TYPE, OPENAPI_V2_PROTOBUF)],
                Vec::<u8>::new(),
            )
                .into_response());
        }
        ["api"] => discovery::core_versions(),
        ["api", "v1"] => {
            discovery::resource_list(&store, "", "v1").expect("the core group is built in")
        }
        ["apis"] => discovery::group_list(&store),
        ["apis", group] => {
            discovery::group(&store, group).ok_or_else(|| ApiError::unknown_path(path))?
        }
        ["apis", group, version] => discovery::resource_list(&store, group, version)
            .ok_or_else(|| ApiError::unknown_path(path))?,
        _ => return Err(ApiError::unknown_path(path)),
    };
    Ok(Json(doc).into_response())
}

fn filter_from(query: &BTreeMap<String, String>, namespace: Option<String>) -> ApiResult<Filter> {
    let labels = query
        .get("labelSelector")
        .map(|s| LabelSelector::parse(s))
        .transpose()?
        .unwrap_or_default();
    let fields = query
        .get("fieldSelector")
        .map(|s| FieldSelector::parse(s))
        .transpose()?
        .unwrap_or_default();
    Ok(Filter {
        namespace,
        labels,
        fields,
    })
}

fn watch_response(
    shared: Arc<Shared>,
    rt: ResourceType,
    filter: Filter,
    query: &BTreeMap<String, String>,
    metadata_only: bool,
) -> ApiResult<Response> {
    let from = match query.get("resourceVersion").map(String::as_str) {
        None | Some("" | "0") => None,
        Some(rv) => Some(
            rv.parse::<u64>()
                .map_err(|_| ApiError::bad_request(format!("invalid resourceVersion {rv:?}")))?,
        ),
    };
    let timeout = match query.get("timeoutSeconds").filter(|t| !t.is_empty()) {
        Some(t) => Duration::from_secs(
            t.parse()
                .map_err(|_| ApiError::bad_request(format!("invalid timeoutSeconds {t:?}")))?,
        ),
        None => DEFAULT_WATCH_TIMEOUT,
    };
    let flag = |name: &str| query.get(name).is_some_and(|v| v == "true" || v == "1");
    let req = WatchRequest {
        resource: rt,
        filter,
        from,
        send_initial_events: flag("sendInitialEvents"),
        bookmarks: flag("allowWatchBookmarks"),
        timeout,
        metadata_only,
    };
    let body = Body::from_stream(watch_stream(shared, req));
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}

/// A JSON request body: 415 for another content type, 400 when it does not parse.
fn json_body(content_type: &str, body: &Bytes) -> ApiResult<Value> {
    let media = content_type.split(';').next().unwrap_or("").trim();
    if !media.eq_ignore_ascii_case("application/json") {
        return Err(ApiError::unsupported_media_type(content_type));
    }
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}")))?;
    if !value.is_object() {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
        ));
    }
    Ok(value)
}

/// `DeleteOptions.preconditions` from an optional delete body.
fn preconditions(body: &Bytes) -> ApiResult<Preconditions> {
    if body.is_empty() {
        return Ok(Preconditions::default());
    }
    let options: Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(format!("the delete options are not valid JSON: {e}"))
    })?;
    let pre = &options["preconditions"];
    Ok(Preconditions {
        uid: pre["uid"].as_str().map(str::to_owned),
        resource_version: pre["resourceVersion"].as_str().map(str::to_owned),
    })
}
