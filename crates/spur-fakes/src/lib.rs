//! The peers the operator talks to, as fakes it cannot tell from the real ones: the model
//! of spurctld, the Kubernetes API server (with RBAC), and a kubelet. They run in the
//! simulation and in the lab alike, so they never touch the simulator or the kernel: time
//! and host names come in through [`clock`].
//!
//! - [`model`]: three spurctld replicas sharing one replicated log, served over tonic.
//! - [`api_server`]: an in-memory Kubernetes API server that kube-rs talks to over HTTP.
//! - [`kubelet`]: runs pods bound to nodes, as far as the operator can see.
//! - [`index`] and [`leases`]: views of the API server's objects and of who held a Lease.
//!
//! They record what they do in the judge's records (`spur_judge::trace`, `records`).

pub mod api_server;
pub mod clock;
pub mod index;
pub mod kubelet;
pub mod leases;
pub mod model;
pub mod workloads;
