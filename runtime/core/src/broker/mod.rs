//! The broker's rules: one sans-IO state machine per broker, joined with its peers into a TBON.
//!
//! [`core::Broker`] takes inputs with the time they happened and hands back effects and its next deadline
//! (`core.rs`, with `routing.rs`, `liveness.rs`, `reparent.rs`, `rejoin.rs` and `services/`). Routing decisions
//! use the pure [`crate::topology`] functions; the instance services of rank 0 (job manager, scheduler, exec,
//! resource) are the sans-IO [`crate::jobs::JobCore`]. The tokio driver in `vigil` owns every socket, process and
//! detector, feeds a broker its inputs and carries out its effects; the simulator (`vigil-sim`) does the same for
//! thousands of brokers on virtual time.
//!
//! Services and their topics:
//! - every rank: `broker.*` (ping, getattr, lsattr, sub, unsub, info), `rexec.*` (start and signal job shells,
//!   and pass a PMI exchange's answer down the tree: `pmi_down.rs`);
//! - rank 0: `job-manager.*`, `job-info.*`, `job-exec.*`, `resource.*`, `overlay.*`.
//!
//! The modules are public for the driver and the simulator, which drive the state machine and read its state;
//! the contract is the module documentation of `core.rs`, not every field.

pub mod access;
pub mod confirm;
#[doc(hidden)]
pub mod core;
#[cfg(test)]
mod fuzz_tests;
pub mod links;
#[doc(hidden)]
pub mod liveness;
pub mod metrics;
mod options;
pub mod pmi_down;
#[doc(hidden)]
pub mod rejoin;
#[doc(hidden)]
pub mod reparent;
#[doc(hidden)]
pub mod routing;
#[doc(hidden)]
pub mod services;
pub mod store;
pub mod testing;
#[cfg(test)]
mod tests;
pub mod unkillable;

pub use self::options::BrokerOptions;
