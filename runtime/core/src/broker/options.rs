//! What a broker is started with: its place in the instance, its attributes, and what it resolved at start-up.
//! Plain data, built by `vigil start` or read from a system instance's bootstrap file; the broker's rules read all
//! of it, and so does its driver, which gets what only its I/O needs beside it (`DriverOptions` in
//! `vigil-driver`: the overlay listener, the overlay key, a node already discovered).
//!
//! Each value lives in one place: an attribute (`-S name=value`, a bootstrap file's field) in the typed
//! [`BrokerConfig`](crate::attrs::BrokerConfig) at [`BrokerOptions::config`] (the TBON shape `tbon.topo`, the
//! parent's wait `tbon.connect_timeout`, the node's topology source `resource.synthetic`/`resource.xml`, the
//! declared GPUs `resource.gpus`, the enclosing instance's `parent-uri`...), and here only what no attribute
//! holds: the rank and size, the peers' endpoints and host names, and what was resolved from several sources
//! (the run directory in effect, the enclosing job's resources).

use crate::idset::IdSet;
use std::path::PathBuf;

/// Everything the sans-IO broker needs to start.
#[derive(Debug, Clone)]
pub struct BrokerOptions {
    /// This broker's rank, `0..size`.
    pub rank: u32,
    /// Number of brokers.
    pub size: u32,
    /// Host name reported to rank 0.
    pub hostname: String,
    /// Instance identifier (peers with another id are refused).
    pub instance: String,
    /// Connect endpoint of every rank, by rank (`tcp://ADDR:PORT`; `""` where not known: only the parent's and
    /// the adoptive parents' are needed).
    pub endpoints: Vec<String>,
    /// Every rank's host name as configured (`bootstrap.hosts`), by rank; empty where not known (test and nested
    /// instances). Rank 0 shows it for a rank that has not joined (yet: after a restart of rank 0).
    pub hosts: Vec<String>,
    /// The run directory in effect, for the local connector's socket, job shells' directories and the `up`
    /// file: `vigil broker --rundir`, else `-S rundir=` ([`BrokerConfig::rundir`](crate::attrs::BrokerConfig::rundir),
    /// the attribute as given), else a new directory chosen by the command starting the broker. Shown by
    /// `vigil getattr rundir`.
    pub rundir: PathBuf,
    /// Attributes set with `-S` (and a bootstrap file), typed and checked: the one place each attribute's value
    /// lives (reported by getattr).
    pub config: crate::attrs::BrokerConfig,
    /// Initial program (rank 0 only); `None` = run none and stay up until signalled.
    pub initial_program: Option<Vec<String>>,
    /// Cores and GPUs this broker owns, when it is part of a nested instance (from the enclosing job's R);
    /// `None` = the whole node as discovered.
    pub resources_override: Option<(IdSet, IdSet)>,
}
