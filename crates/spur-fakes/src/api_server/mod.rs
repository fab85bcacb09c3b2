//! The simulated Kubernetes API server (docs/specs.md, the simulation's API server).
//!
//! An in-memory store of JSON objects with a global resourceVersion and a change history,
//! served over HTTP so that kube-rs (its watcher, Controller and finalizer helper included)
//! runs against it unchanged: over turmoil's TCP in a simulation, over tokio TCP on a
//! laptop (`spur-sim kube-api`), over in-memory pipes in tests.
//!
//! - start: [`ApiServer::new`], then [`ApiServer::serve`] with any
//!   `spur_operator::net::Listener` (`crate::net::SimListener`, a tokio `TcpListener`, a
//!   [`transport::MemoryListener`]); the state lives in
//!   the `ApiServer` (clones share it), so it survives a restart of the host serving it;
//! - over TLS, as pods reach it: [`tls::TlsIdentity::generate`], then
//!   [`ApiServer::serve_tls`];
//! - clients: [`client_over`] / [`client_over_with`] build a `kube::Client` over any
//!   `spur_operator::net::Dialer`, with kube's default transport (30 s connect bound,
//!   429/503/504 retries); [`ApiServer::in_memory_client`] for tests;
//! - faults: [`ApiServer::faults`] and [`ApiServer::expire_resource_versions`];
//! - checks: [`ApiServer::observe`] sees every change in order; [`ApiServer::take_writes`]
//!   who applied which write over HTTP, and when; direct `create`, `get`,
//!   `list`, `merge_patch`, `delete` let a harness act as kubelet or user without HTTP.
//!
//! Where it differs from a real API server, knowingly:
//! - strategic merge patch is a JSON merge patch (lists are replaced, not merged by key);
//!   server-side apply is a forced merge patch (no managedFields, no field removal);
//! - no admission, no schema validation, no defaulting (save a Service's clusterIP, when
//!   [`store::StoreConfig::service_cluster_ips`] names a range); CRDs are Established at once;
//! - pods go at once on delete (no graceful period); dependents whose owners are all gone
//!   are deleted at once (the garbage collector without its delay); no foreground deletion;
//! - list pages after the first are read from the current state (their resourceVersion is
//!   the first page's, so a watch from it replays what changed meanwhile);
//! - a pod's log and exec come from its spec ([`pod_io`]: `SIM_STDOUT`, a tiny shell), and
//!   port-forward and proxy are refused with 503, unless a [`pod_backend::PodBackend`]
//!   whose pods are processes is set;
//! - `dryRun` is refused; the OpenAPI v2 document is empty (kubectl validates nothing);
//!   watches ignore `as=Table`.

mod access;
pub mod auth;
pub mod cli;
pub mod client;
mod discovery;
pub mod error;
mod event_view;
pub mod faults;
pub mod install;
pub mod patch;
pub mod pod_backend;
pub mod pod_io;
mod port_forward;
mod printers;
mod proxy;
pub mod rbac;
pub mod resources;
pub mod scale;
pub mod seed;
pub mod selectors;
mod server;
pub mod service_ips;
mod spdy;
pub mod store;
pub mod tls;
pub mod transport;
mod watch;
pub mod writes;

pub use access::{Authorization, Denial};
pub use client::{ClientOptions, client_over, client_over_with};
pub use error::{ApiError, ApiResult};
pub use faults::{CutKind, Faults, OutageMode};
pub use pod_backend::{PodBackend, SimulatedPods};
pub use server::{ApiServer, ApiServerConfig};
pub use writes::{WriteMethod, WriteRecord};
