//! The broker: one per node, joined with its peers into a TBON.
//!
//! The broker's rules are one sans-IO state machine (`core.rs`, with `routing.rs`, `liveness.rs` and
//! `services.rs`): inputs and the time in, effects out. Its tokio driver (`driver.rs`) owns every socket, process
//! and detector, feeds it inputs and carries out its effects. Routing decisions use the pure
//! [`crate::topology`] functions; the instance services of rank 0 (job manager, scheduler, exec, resource) are the
//! sans-IO [`crate::jobs::JobCore`]. Everything that blocks (sockets, processes) runs in small tasks that talk to
//! the driver through one channel, so a slow peer or client never stalls routing.
//!
//! Services and their topics:
//! - every rank: `broker.*` (ping, getattr, lsattr, sub, unsub, info), `rexec.*` (start and signal job shells);
//! - rank 0: `job-manager.*`, `job-info.*`, `job-exec.*`, `resource.*`, `overlay.*`.

mod cgroup;
pub mod config;
pub(crate) mod core;
pub(crate) mod detect;
mod driver;
#[cfg(test)]
mod fuzz_tests;
mod link_set;
pub(crate) mod liveness;
mod local;
mod ofi_link;
pub(crate) mod rdma_link;
pub(crate) mod rejoin;
pub(crate) mod reparent;
mod routing;
pub mod secure;
mod services;
mod spawn;
// Public only for `vigil-bench restart`, which fills a store with the real `Store::commit`; not an API.
#[doc(hidden)]
pub mod store;
#[cfg(test)]
mod tests;
pub mod transport;
mod upgrade;

pub use self::driver::{discover_in_child_to, discover_node_main, run, BrokerOptions, ListenSpec};
