//! The channel to spurctld: address parsing, a bounded connect, the policy that decides
//! which channel calls share ([`policy`], the one description of the channel's behaviour)
//! and the one long-lived client that carries it out. Nothing else in the project opens a
//! controller connection.

mod address;
mod args;
mod client;
mod connect;
mod error;
pub mod policy;
mod session;

pub use address::{AddressError, ControllerAddr, Scheme};
pub use args::{ChannelConfig, ControllerArgs, ControllerSettings, TlsConfig};
pub use client::{ControllerClient, LEADER_WRITES};
pub use error::{ConnectError, ControllerError, FailureKind, status_text};
pub use policy::Rule;

#[cfg(test)]
pub(crate) mod testing;
#[cfg(test)]
mod tests;
