//! The seed sweeps: thousands of seeded fault scenarios judged by every check, the README's
//! compare table and the pinned seeds. One binary, so the simulation is compiled and linked
//! once for all of them; each sweep spreads its seeds over the machine's cores itself.

#[path = "../common/mod.rs"]
mod common;

mod readme_figures;
mod scenarios;
mod seed_failures;
