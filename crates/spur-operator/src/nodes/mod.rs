//! Node sync and heartbeats: the labelled Kubernetes nodes, as the controller sees them.

pub mod admission;
mod args;
pub mod heartbeat;
pub mod resources;
pub mod sync;

pub use admission::JoinToken;
pub use args::NodeArgs;
pub use resources::AgentEndpoint;
pub use sync::{NodeSync, NodeSyncConfig, NotReadyState, Registered};

#[cfg(test)]
mod tests;
