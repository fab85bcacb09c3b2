//! `spur-sim`: runs the simulated world (see shared/spec/sim.md).

fn main() {}
