//! # Vigil runtime
//!
//! The core library of Vigil, a resource-manager runtime for HPC clusters in the family of Flux and Slurm, and
//! the home of the `vigil` command (CLI and broker).
//!
//! Layout (see `docs/architecture.md`):
//! - sans-IO core: [`topology`] (TBON math), [`message`] (wire codec), [`jobs`] (job manager, scheduler and
//!   exec rules as state machines with time passed in);
//! - formats from the Flux RFCs: [`idset`] (RFC 22), [`hostlist`] (RFC 29), [`duration`] (RFC 23),
//!   [`eventlog`] (RFC 18), [`r`] (RFC 20), [`jobspec`] (RFC 14/25);
//! - node discovery and placement with hwloc: [`hwloc`];
//! - I/O around the core: [`broker`] (overlay transport, local connector, services), [`client`], [`cli`];
//! - the broker ↔ job shell contract: [`shellproto`].

pub mod broker;
pub mod cli;
pub mod client;
pub mod duration;
pub mod eventlog;
pub mod hostlist;
pub mod hwloc;
pub mod idset;
pub mod jobs;
pub mod jobspec;
pub mod membership;
pub mod message;
pub mod pmi;
pub mod r;
pub mod shellproto;
pub mod topology;

/// Wall-clock time in seconds since the Unix epoch.
pub fn broker_now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}
