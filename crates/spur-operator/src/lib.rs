//! spur-operator: bridges Kubernetes and the Spur workload manager's controller.
//!
//! All logic lives in this library; the `spur-operator` binary only wires it to the real
//! world (see docs/architecture.md, "The seams").
//!
//! Every module is private. The two seams (`clock`, `net`) are public whole, since the
//! simulation implements them; everything else the binary, the simulation and the tests
//! use is re-exported below, by name, so the compiler can tell what nothing uses.

mod agent;
mod agent_auth;
mod check;
pub mod clock;
mod config;
mod controller;
mod events;
mod fence;
mod flags;
mod health;
mod hostlist;
mod job_io;
mod jobs;
#[cfg(test)]
mod kube_testing;
mod lease;
mod metrics;
pub mod net;
mod nodes;
mod operator;
mod quantity;
mod reference;
mod retry;
mod selector;
mod telemetry;

// Running the operator: its command line, its configuration and its world.
pub use config::{
    NamespaceSource, OperatorConfig, RunArgs, fallback_agent_address, resolve_namespace,
};
pub use controller::ControllerArgs;
pub use operator::{Handles, RunError, Seams, run, run_with_handles};
pub use telemetry::{LogFormat, init as init_telemetry};

// `spur-operator check-controller`.
pub use check::{check_controller, describe_failure};

// The generated reference: the CRD, docs/operating.md's config table, the metric families.
pub use jobs::crd::crd_yaml;
pub use metrics::Metrics;
pub use reference::{README_BEGIN, README_END, config_table, splice};

// The virtual agent, served alone by its tests.
pub use agent::{Agent, serve as serve_agent};
pub use agent_auth::{AgentAuth, AgentAuthMode, sign as sign_agent_token};
pub use nodes::Registered;

// What the simulation's checks and models share with the operator, so the two never
// disagree: the SpurJob and how its jobs are tagged, spurctld's state names, the writes
// only its leader takes, a refusal's text with its causes, hostlists and label selectors.
pub use controller::{LEADER_WRITES, status_text};
pub use hostlist::expand as expand_hostlist;
pub use jobs::convert::{UID_TAG, job_spec, uid_in_comment};
pub use jobs::reports::OOM_KILLED_SIGNAL;
pub use jobs::status::{is_terminal, nodes_of, state_name};
pub use jobs::{LABEL_JOB_ID, SpurJob};
pub use selector::Selector;

// Kubernetes quantities, which the process kubelet reads memory limits with.
pub use quantity::{Quantity, QuantityError, parse as parse_quantity};
