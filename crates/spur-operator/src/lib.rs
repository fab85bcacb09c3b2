//! spur-operator: bridges Kubernetes and the Spur workload manager's controller.
//!
//! All logic lives in this library; the `spur-operator` binary only wires it to the real
//! world (see `../shared/DESIGN.md`, "The seams").

pub mod agent;
pub mod agent_auth;
pub mod check;
pub mod clock;
pub mod config;
pub mod controller;
pub mod events;
pub mod fence;
pub mod health;
pub mod hostlist;
pub mod job_io;
pub mod jobs;
#[cfg(test)]
mod kube_testing;
pub mod lease;
pub mod metrics;
pub mod net;
pub mod nodes;
pub mod operator;
pub mod quantity;
pub mod reference;
pub mod retry;
pub mod selector;
pub mod telemetry;
