//! The broker: one per node, joined with its peers into a TBON.
//!
//! One task owns all broker state (`Core`) and handles a stream of `Input`s: messages from the parent, the
//! children and local clients, link closures, shell reports, timers. Routing decisions use the pure
//! [`crate::topology`] functions; the instance services of rank 0 (job manager, scheduler, exec, resource) are the
//! sans-IO [`crate::jobs::JobCore`]. Everything that blocks (sockets, processes) runs in small tasks that talk to
//! the core through channels, so a slow peer or client never stalls routing.
//!
//! Services and their topics:
//! - every rank: `broker.*` (ping, getattr, lsattr, sub, unsub, info), `rexec.*` (start and signal job shells);
//! - rank 0: `job-manager.*`, `job-info.*`, `job-exec.*`, `resource.*`, `overlay.*`.

pub mod config;
mod core;
pub(crate) mod detect;
mod local;
pub(crate) mod rdma_link;
pub mod secure;
mod services;
pub mod transport;

pub use self::core::{run, BrokerOptions, ListenSpec};
