//! The simulated Kubernetes API server (shared/spec/sim.md, "API server").
//!
//! An in-memory store of JSON objects with a global resourceVersion and a change history,
//! served over HTTP so that kube-rs (its watcher, Controller and finalizer helper included)
//! runs against it unchanged: over turmoil's TCP in a simulation, over tokio TCP on a
//! laptop (`spur-sim kube-api`), over in-memory pipes in tests.
//!
//! - start: [`ApiServer::new`], then [`ApiServer::serve`] with any [`transport::Accept`]
//!   (a turmoil or tokio `TcpListener`, a [`transport::MemoryListener`]);
//! - clients: [`client::client_over`] builds a `kube::Client` over any
//!   `spur_operator::net::Dialer`; [`ApiServer::in_memory_client`] for tests;
//! - faults: [`ApiServer::faults`] and [`ApiServer::expire_resource_versions`].

pub mod cli;
pub mod client;
pub mod clock;
mod discovery;
pub mod error;
pub mod faults;
pub mod patch;
pub mod resources;
pub mod seed;
pub mod selectors;
mod server;
pub mod store;
pub mod transport;
mod watch;

pub use client::{ClientOptions, client_over, client_over_with};
pub use error::ApiError;
pub use faults::{CutKind, Faults, OutageMode};
pub use server::{ApiServer, ApiServerConfig};
