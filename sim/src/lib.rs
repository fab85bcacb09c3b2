//! The deterministic simulation of spur-operator's world (see docs/specs.md, "The simulation"):
//! the turmoil stage the other crates' parts run on, and the `spur-sim` command line.
//!
//! - [`world`]: one turmoil simulation per seed, with the controller replicas, the faults
//!   and the trace; [`net`]: turmoil glue for tonic, hyper and axum, the `spurctld`
//!   Service, and the modelled kernel (SYN timeout) and frozen processes.
//! - [`harness`]: a world with the API server, labelled nodes and operator replicas in it;
//!   [`operator`]: the real operator on a simulated host; [`prober`]: a kubelet's readiness
//!   probe there.
//! - [`scenario`]: a plan run in the simulation, observed and judged.
//! - [`determinism`]: what makes a seed replay exactly; [`smoke`]: `spur-sim world-smoke`,
//!   a fixed scenario printing its trace hash, which shows it across processes.
//! - [`timeline_calls`]: the operator's account of its calls, caught for a timeline.
//! - [`cli`]: `spur-sim`'s commands.
//!
//! What runs on this stage lives in the crates that do not need turmoil: the plans, checks,
//! records, reports and timelines in `spur_judge`; the spurctld model, the API server and
//! the kubelet in `spur_fakes`; the same plans on real processes in `spur_lab`.

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
