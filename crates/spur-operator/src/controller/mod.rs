//! The channel to spurctld: address parsing, a bounded connect, and the one long-lived
//! client that drops its channel after a transport failure. Nothing else in the project
//! opens a controller connection.

mod address;
mod client;
mod connect;
mod error;

pub use address::{AddressError, ControllerAddr, Scheme};
pub use client::{ClientStats, ControllerClient};
pub use connect::connect;
pub use error::{ConnectError, ControllerError, FailureKind, classify};

#[cfg(test)]
pub(crate) mod testing;
#[cfg(test)]
mod tests;
