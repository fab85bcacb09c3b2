//! The judge: what a scenario is and whether a run of it went right, on either stage (the
//! simulation or real processes). Its input is what a run records; it runs nothing itself,
//! so it links neither the simulator nor the kernel's interfaces.
//!
//! - [`plan`] and [`catalogue`]: a seed's drawn plan, and the named scenarios.
//! - [`checks`]: the checks of a run, against an [`checks::Observation`] of its world.
//! - [`records`], [`leases`], [`probes`], [`trace`]: what a run records for them.
//! - [`stage`]: the one runner of a plan, on any [`stage::Stage`].
//! - [`outcome`], [`report`], [`plot`], [`timeline`]: what a run came to, and its pictures.

pub mod catalogue;
pub mod checks;
pub mod hosts;
pub mod leases;
pub mod outcome;
pub mod plan;
pub mod plot;
pub mod probes;
pub mod profiles;
pub mod record_log;
pub mod records;
pub mod report;
pub mod seed;
pub mod service;
pub mod stage;
pub mod timeline;
pub mod trace;
