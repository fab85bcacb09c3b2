//! The deterministic simulation of spur-operator's world (see shared/spec/sim.md).

pub mod kube_api;
