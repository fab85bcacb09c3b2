//! What a real cluster's controller manager does for workloads, as controllers over the
//! [`ApiServer`] handle (direct reads and writes, no HTTP, no RBAC): the Deployment,
//! ReplicaSet and StatefulSet controllers, the EndpointSlice controller, and a stand-in
//! for the scheduler (see [`schedule`]).
//!
//! Each pass lists what it needs and writes what differs (a write that changes nothing
//! does not move the resourceVersion), so a pass is deterministic for a given store, and
//! the controllers read time only from the [`Clock`] handed in. Nothing spawns them by
//! default: a caller runs [`run`] beside the kubelet, or drives [`Workloads::step`].
//!
//! Where they differ from the real controllers, knowingly: no adoption or orphaning by
//! selector (ownership is the controller owner reference), no `minReadySeconds` (Ready is
//! available), no `progressDeadlineSeconds`, no hash-collision counter, no
//! ControllerRevision objects (a StatefulSet's revision is `<sts>-<template hash>`), and a
//! pod with no `Ready` condition counts as Ready when Running with every container ready
//! (what the simulated kubelet reports).

mod common;
pub mod deployment;
pub mod endpointslice;
pub mod replicaset;
pub mod schedule;
pub mod statefulset;

use std::time::Duration;

use crate::api_server::ApiServer;
use crate::clock::Clock;

pub use deployment::HASH_LABEL;
pub use endpointslice::SERVICE_NAME_LABEL;
pub use statefulset::{POD_INDEX_LABEL, POD_NAME_LABEL};

/// How often [`run`] makes a pass.
#[derive(Clone, Debug)]
pub struct WorkloadsConfig {
    pub period: Duration,
}

impl Default for WorkloadsConfig {
    fn default() -> Self {
        Self {
            period: Duration::from_millis(250),
        }
    }
}

/// The controllers' state between passes: the scheduler's round-robin position.
#[derive(Debug)]
pub struct Workloads {
    api: ApiServer,
    clock: Clock,
    scheduler: schedule::Scheduler,
}

impl Workloads {
    pub fn new(api: ApiServer, clock: Clock) -> Self {
        Self {
            api,
            clock,
            scheduler: schedule::Scheduler::default(),
        }
    }

    /// One pass of every controller, in the order their outputs feed each other.
    pub fn step(&mut self) {
        deployment::reconcile_all(&self.api, &self.clock);
        replicaset::reconcile_all(&self.api, &mut self.scheduler);
        statefulset::reconcile_all(&self.api, &mut self.scheduler);
        self.scheduler
            .bind_unbound(&self.api, &["ReplicaSet", "StatefulSet"]);
        endpointslice::reconcile_all(&self.api);
    }
}

/// Runs every workload controller forever, a pass each `config.period` of tokio time.
pub async fn run(api: ApiServer, clock: Clock, config: WorkloadsConfig) {
    let mut workloads = Workloads::new(api, clock);
    loop {
        tokio::time::sleep(config.period).await;
        workloads.step();
    }
}
