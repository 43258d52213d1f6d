//! A node as a broker reports it when it joins (counts of hwloc objects), and where its topology comes from.
//!
//! Plain data: discovering the node with hwloc is `vigil-hwloc`'s job, which re-exports these types; the sans-IO
//! broker (`vigil-core`) and the job shell read them without linking hwloc.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

/// A topology source string that is not `live`, `synthetic:<desc>` or `xml:<path>` (the text given).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid topology source '{0}' (expected 'live', 'synthetic:<desc>' or 'xml:<path>')")]
pub struct InvalidTopologySource(pub String);

/// Where a node's topology comes from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum TopologySource {
    /// Discover the hardware of the machine this process runs on
    /// (including I/O devices, so GPUs can be counted).
    Live,
    /// An hwloc synthetic description, e.g. `"pack:4 numa:1 core:24 pu:2"`
    /// (see hwloc's "Synthetic topologies" documentation).
    Synthetic(String),
    /// An hwloc XML export (from `lstopo foo.xml` or
    /// hwloc's `Topology::export_xml_file`).
    XmlFile(PathBuf),
}

impl fmt::Display for TopologySource {
    /// Formats as `live`, `synthetic:<desc>` or `xml:<path>`; this is the
    /// string stored in [`NodeResources::source`].
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TopologySource::Live => f.write_str("live"),
            TopologySource::Synthetic(d) => write!(f, "synthetic:{d}"),
            TopologySource::XmlFile(p) => write!(f, "xml:{}", p.display()),
        }
    }
}

impl FromStr for TopologySource {
    type Err = InvalidTopologySource;

    /// Parses the [`Display`](fmt::Display) form: `live`,
    /// `synthetic:<desc>` or `xml:<path>` (no trimming of `<desc>`/`<path>`).
    fn from_str(s: &str) -> Result<Self, InvalidTopologySource> {
        if s == "live" {
            Ok(TopologySource::Live)
        } else if let Some(d) = s.strip_prefix("synthetic:") {
            Ok(TopologySource::Synthetic(d.to_string()))
        } else if let Some(p) = s.strip_prefix("xml:") {
            Ok(TopologySource::XmlFile(PathBuf::from(p)))
        } else {
            Err(InvalidTopologySource(s.to_string()))
        }
    }
}

/// Summary a broker reports when it joins.
///
/// All counts are numbers of hwloc objects on the node (allowed ones only
/// for live topologies, i.e. respecting the process's cgroup/cpuset).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct NodeResources {
    /// Number of `Core` objects.
    pub cores: u32,
    /// Number of `PU` objects (hardware threads).
    pub pus: u32,
    /// Number of `NUMANode` objects.
    pub numa: u32,
    /// Number of `Package` objects (sockets).
    pub packages: u32,
    /// Number of GPUs: the declared count if one was given to
    /// `NodeTopology::resources` (`vigil-hwloc`), otherwise the discovered count.
    pub gpus: u32,
    /// hwloc OS-device names of the discovered GPUs (e.g. `"cuda0"`,
    /// `"rsmi1"`), in topology order; empty when the GPU count was declared
    /// rather than discovered.
    pub gpu_names: Vec<String>,
    /// Where the topology came from: `"live"`, `"synthetic:<desc>"` or
    /// `"xml:<path>"`.
    pub source: String,
}
