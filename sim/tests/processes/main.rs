//! The cases that run `spur-sim` itself as a process: its command line, the model's replicas
//! and the API server over real TCP, `kubectl` against it, and the same seed's trace in two
//! processes.

#[path = "../common/mod.rs"]
mod common;

mod cli;
mod cluster;
mod controllers_tcp;
mod deploy;
mod determinism;
