//! What a broker is started with: its place in the instance, its attributes, and what its driver needs to reach
//! its peers (listener, endpoints, overlay key). Plain data, built by `vigil start` or read from a system
//! instance's bootstrap file; the rules read the first part, the driver all of it.

use crate::idset::IdSet;
use crate::topology::Topology;
use std::path::PathBuf;
use vigil_proto::node::TopologySource;

/// How a broker gets its overlay listening socket.
#[derive(Debug, Clone)]
pub enum ListenSpec {
    /// An already bound TCP listener inherited from `vigil start` (file descriptor number).
    Fd(i32),
    /// Bind this endpoint (`tcp://host:port`).
    Endpoint(String),
}

/// Everything a broker needs to start.
#[derive(Debug, Clone)]
pub struct BrokerOptions {
    /// This broker's rank.
    pub rank: u32,
    /// Number of brokers.
    pub size: u32,
    /// TBON shape.
    pub topo: Topology,
    /// Host name reported to rank 0.
    pub hostname: String,
    /// Instance identifier (peers with another id are refused).
    pub instance: String,
    /// Connect endpoint of every rank, by rank (only the parent's is used).
    pub endpoints: Vec<String>,
    /// Every rank's host name as configured (`bootstrap.hosts`), by rank; empty where not known (test and nested
    /// instances). Rank 0 shows it for a rank that has not joined (yet: after a restart of rank 0).
    pub hosts: Vec<String>,
    /// Overlay listener.
    pub listen: ListenSpec,
    /// Directory for sockets and logs.
    pub rundir: PathBuf,
    /// Attributes set with `-S` (reported by getattr).
    pub config: crate::attrs::BrokerConfig,
    /// Initial program (rank 0 only); `None` = run none and stay up until signalled.
    pub initial_program: Option<Vec<String>>,
    /// Where this node's topology comes from.
    pub topology: TopologySource,
    /// Declared GPU count overriding discovery.
    pub declared_gpus: Option<u32>,
    /// This node as already discovered (the JSON file `vigil discover-node` prints): `vigil start` discovers the machine once
    /// for all the brokers of a test instance. `None`: the broker discovers its node.
    pub discovered: Option<PathBuf>,
    /// Seconds to wait for the parent to accept our connection.
    pub connect_timeout: f64,
    /// Cores and GPUs this broker owns, when it is part of a nested instance (from the enclosing job's R);
    /// `None` = the whole node as discovered.
    pub resources_override: Option<(IdSet, IdSet)>,
    /// URI of the enclosing instance's broker on this node, for a nested instance.
    pub parent_uri: Option<String>,
    /// The instance's overlay key: every overlay link is authenticated and encrypted with it (see `secure`).
    pub key: vigil_proto::key::OverlayKey,
}
