//! The simulation's focused cases: the operator, the model of spurctld and the simulated API
//! server, each in a world built for one behaviour. One binary, so the simulation is compiled
//! and linked once for all of them.

#[path = "../common/mod.rs"]
mod common;

mod admission;
mod checks_fire;
mod controller_model;
mod cut_replica;
mod failover;
mod kube_api;
mod network;
mod operator_jobs;
mod operator_nodes;
mod rbac;
mod readiness;
mod timeline;
