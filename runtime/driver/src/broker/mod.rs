//! The broker: one per node, joined with its peers into a TBON.
//!
//! The broker's rules are one sans-IO state machine in `vigil-core` (`broker/core.rs`, with `routing.rs`,
//! `liveness.rs`, `reparent.rs`, `rejoin.rs` and `services/`): inputs and the time in, effects out. This module
//! is its tokio driver (`driver.rs`): it owns every socket, process and detector, feeds the state machine its
//! inputs and carries out its effects. Everything that blocks (sockets, processes) runs in small tasks that talk
//! to the driver through one channel, so a slow peer or client never stalls routing.
//!
//! What is here: `driver.rs` (the loop), `effects.rs` (carrying out the broker's effects), `shells.rs` (starting
//! job shells off the loop; `imp.rs`, the privileged launcher `vigil-imp` a multi-user instance's brokers use when
//! they are not root),
//! `links_up.rs` (accepting children, connecting to the parent), `health.rs` (the node health check),
//! `discover.rs` (what the node has), `options.rs` (what only the driver needs to start), `transport.rs`,
//! `rdma_link.rs`, `ofi_link.rs` and [`secure`] (the overlay links), `local.rs` (the local connector), `detect/`
//! (failure detectors and the prober, a file per job), `spawn.rs` and `cgroup.rs` (job shell processes and their
//! containment), `store.rs` and `redo.rs` (rank 0's state directory in SQLite and its redo log) with
//! `statedir_io.rs` (their threads while the broker runs), [`config`] (a system instance's TOML bootstrap).

mod cgroup;
pub mod config;
pub(crate) mod detect;
mod discover;
mod driver;
mod effects;
mod health;
mod imp;
mod link_set;
mod links_up;
mod local;
mod metrics;
mod ofi_link;
mod options;
mod placement;
mod priority;
pub(crate) mod rdma_link;
pub mod secure;
mod shells;
mod spawn;
mod statedir_io;
// Public only for `vigil-bench restart`, which fills a store with the real `Store::commit`; not an API.
#[doc(hidden)]
pub mod redo;
pub mod store;
pub mod transport;
mod upgrade;

// The broker's rules (`vigil-core`), under the paths this crate's driver and simulator use.
pub(crate) use vigil_core::broker::{confirm, core, liveness, reparent};

pub use self::discover::{discover_in_child_to, discover_node_main};
pub use self::driver::{run, BrokerOptions};
pub use self::ofi_link::process_exiting;
pub use self::options::{DriverOptions, ListenSpec};
