//! The deterministic simulation of spur-operator's world (see docs/specs.md, "The simulation").
//!
//! - [`net`]: turmoil glue for tonic, hyper and axum; the `spurctld` Service; the modelled
//!   kernel (SYN timeout) and pod kills.
//! - [`controller`]: three simulated spurctld replicas sharing one replicated log.
//! - [`kube_api`]: an in-memory Kubernetes API server that kube-rs talks to over HTTP.
//! - [`operator`]: the real operator on a simulated host; [`leases`]: who the Leases named,
//!   as the API server applied them.
//! - [`world`]: one turmoil simulation per seed, with the replicas, faults and the trace.
//! - [`trace`] and [`determinism`]: what makes a seed replay exactly, and the proof.
//! - [`scenario`]: seeded fault scenarios and their checks ([`record_log`] holds the writes
//!   and calls they judge); [`report`]: their JSON lines,
//!   summaries, and the merging of sweep shards; [`cli`]: `spur-sim`'s commands.
//! - [`smoke`]: `spur-sim world-smoke`, a fixed scenario printing its trace hash.

pub mod cli;
pub mod determinism;
pub mod harness;
pub mod net;
pub mod operator;
pub mod prober;
pub mod scenario;
pub mod smoke;
pub mod timeline_calls;
pub mod world;
