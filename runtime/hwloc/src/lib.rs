//! # Vigil node topology
//!
//! Node hardware topology (hwloc): discovery and placement, for the broker (which reports its node's resources
//! and places the tasks of the shells it starts). Binding is not here: the job shell binds its tasks itself
//! (`vigil-shell`'s `bind` module) with the placement its broker hands it, and links no hwloc crate.
//!
//! This crate wraps [`hwlocality`] (Rust bindings to hwloc 2.x) to
//!
//! * load a node's topology from the live machine, an hwloc synthetic
//!   description, or an hwloc XML file ([`NodeTopology::load`]);
//! * summarise it for a broker joining the instance ([`NodeResources`]);
//! * compute per-task CPU/GPU placement in the style of the Flux shell's
//!   `cpu-affinity` / `gpu-affinity` options ([`NodeTopology::place`]).
//!
//! The options ([`CpuAffinity`], [`GpuAffinity`]) and cpu lists ([`format_cpulist`], [`parse_cpulist`]) are
//! plain data from [`vigil_proto::affinity`], re-exported here under their old paths.
//!
//! Index conventions used throughout:
//!
//! * **core indices** are hwloc *logical* indices of `Core` objects
//!   (`0..cores`, in topology order);
//! * **cpu / PU indices** are *OS* indices of processing units, i.e. the
//!   numbers the kernel uses in `sched_setaffinity` and `/proc/*/status`;
//! * **NUMA indices** are hwloc logical indices of `NUMANode` objects;
//! * **GPU ids** are opaque per-node ids `0..gpus` chosen by the scheduler.
//!
//! No public function panics on any input: every failure is reported as a
//! [`TopoError`].

mod placement;

pub use placement::{PlacementRequest, TaskPlacement, MAX_TASKS};
// Plain data the broker, the CLI and the shell share (the shell without linking this crate).
pub use vigil_proto::affinity::{
    format_cpulist, parse_cpulist, CpuAffinity, GpuAffinity, InvalidAffinity, InvalidCpuList,
};

use hwlocality::object::attributes::ObjectAttributes;
use hwlocality::object::types::{OSDeviceType, ObjectType};
use hwlocality::object::TopologyObject;
use hwlocality::topology::builder::TypeFilter;
use hwlocality::Topology;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Errors produced by this crate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopoError {
    /// hwloc could not load the topology. `origin` is the source in the
    /// same textual form as [`NodeResources::source`] (`"live"`,
    /// `"synthetic:<desc>"`, `"xml:<path>"`), `reason` is hwloc's complaint.
    #[error("cannot load topology from {origin}: {reason}")]
    Load {
        /// Where the topology was being loaded from.
        origin: String,
        /// Human-readable cause reported by hwloc/hwlocality.
        reason: String,
    },

    /// A topology source string given to `TopologySource::from_str` is
    /// not `live`, `synthetic:<desc>` or `xml:<path>`.
    #[error("invalid topology source '{0}' (expected 'live', 'synthetic:<desc>' or 'xml:<path>')")]
    InvalidSource(String),

    /// An allocated core (logical index of a `Core` object) does not exist
    /// on this topology, which has `available` cores (valid indices are
    /// `0..available`).
    #[error("allocated core {index} does not exist on this node (it has {available} cores)")]
    UnknownCore {
        /// The offending logical core index.
        index: u32,
        /// Number of `Core` objects in the topology.
        available: u32,
    },

    /// The same logical core index appears more than once in
    /// [`PlacementRequest::cores`].
    #[error("allocated core {0} is listed more than once")]
    DuplicateCore(u32),

    /// CPU binding (`on` / `per-task`) was requested for `ntasks > 0` tasks
    /// but no core was allocated on this node.
    #[error("cpu affinity requested for {ntasks} tasks but no cores are allocated on this node")]
    NoCores {
        /// Number of tasks in the request.
        ntasks: u32,
    },

    /// [`PlacementRequest::ntasks`] exceeds [`MAX_TASKS`].
    #[error("{ntasks} tasks requested on one node; at most {max} are supported")]
    TooManyTasks {
        /// Number of tasks in the request.
        ntasks: u32,
        /// The limit, [`MAX_TASKS`].
        max: u32,
    },

    /// hwloc's work distribution failed (should not happen for valid
    /// cores; carries hwlocality's message).
    #[error("hwloc work distribution failed: {0}")]
    Distribute(String),

    /// hwlocality panicked internally; the panic was caught and turned into
    /// this error. Carries the panic message when it was a string.
    #[error("internal hwloc binding error: {0}")]
    Internal(String),
}

// Where a topology comes from and what a broker reports of its node are plain data the sans-IO broker
// (vigil-core) reads too: they live in `vigil-proto` and keep their paths here.
pub use vigil_proto::node::{InvalidTopologySource, NodeResources, TopologySource};

impl From<InvalidTopologySource> for TopoError {
    fn from(e: InvalidTopologySource) -> TopoError {
        TopoError::InvalidSource(e.0)
    }
}

/// A loaded node topology: an [`hwlocality::Topology`] plus the
/// [`TopologySource`] it came from.
pub struct NodeTopology {
    topo: Topology,
    source: TopologySource,
}

impl fmt::Debug for NodeTopology {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodeTopology")
            .field("source", &self.source)
            .field("cores", &self.topo.objects_with_type(ObjectType::Core).len())
            .field("pus", &self.topo.objects_with_type(ObjectType::PU).len())
            .finish()
    }
}

/// Turn a caught panic payload into a message.
fn panic_message(p: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic".to_string()
    }
}

/// Run `f`, converting a panic inside hwlocality into [`TopoError::Internal`].
pub(crate) fn guarded<T>(f: impl FnOnce() -> Result<T, TopoError>) -> Result<T, TopoError> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| Err(TopoError::Internal(panic_message(p))))
}

fn build_topology(src: &TopologySource) -> Result<Topology, TopoError> {
    let load_err = |reason: String| TopoError::Load { origin: src.to_string(), reason };
    let builder = Topology::builder();
    let builder = match src {
        TopologySource::Live => builder,
        TopologySource::Synthetic(desc) => builder.from_synthetic(desc).map_err(|e| load_err(e.to_string()))?,
        TopologySource::XmlFile(path) => {
            // hwlocality 1.0.0-alpha.13's `from_xml_file` panics
            // (`unreachable!`) when hwloc reports anything but EINVAL, e.g.
            // ENOENT or EISDIR, so read the file ourselves and hand hwloc
            // the buffer.
            let text = std::fs::read_to_string(path).map_err(|e| load_err(e.to_string()))?;
            builder.from_xml(&text).map_err(|e| load_err(e.to_string()))?
        }
    };
    // Keep "important" I/O objects (PCI devices, bridges with children,
    // OS devices such as CUDA/OpenCL/RSMI/NVML/LevelZero GPUs, NICs,
    // storage). The default filter drops all I/O, which would hide GPUs.
    // Synthetic topologies have no I/O; the filter is harmless there.
    let builder = builder.with_io_type_filter(TypeFilter::KeepImportant).map_err(|e| load_err(e.to_string()))?;
    builder.build().map_err(|e| load_err(e.to_string()))
}

/// Backends whose OS devices are counted as GPUs, in tie-break priority
/// order. Each backend enumerates the same physical devices, so they are
/// counted per backend and the largest count wins (no double counting of
/// `cuda0` + `nvml0` + `opencl0d0` for one board).
const GPU_BACKENDS: [(&str, &str); 5] = [
    // (subtype as reported by hwloc, OS device name prefix)
    ("CUDA", "cuda"),
    ("RSMI", "rsmi"),
    ("LevelZero", "ze"),
    ("NVML", "nvml"),
    ("OpenCL", "opencl"),
];

/// If `obj` is a GPU/co-processor OS device from a known compute backend,
/// return the index of that backend in [`GPU_BACKENDS`].
fn gpu_backend(obj: &TopologyObject) -> Option<usize> {
    if obj.object_type() != ObjectType::OSDevice {
        return None;
    }
    match obj.attributes() {
        Some(ObjectAttributes::OSDevice(a))
            if matches!(a.device_type(), OSDeviceType::GPU | OSDeviceType::CoProcessor) => {}
        _ => return None,
    }
    let subtype = obj.subtype().map(|s| s.to_string_lossy().into_owned());
    let name = obj.name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    GPU_BACKENDS.iter().position(|(sub, prefix)| {
        subtype.as_deref().is_some_and(|s| s.eq_ignore_ascii_case(sub))
            || (name.starts_with(prefix) && name[prefix.len()..].starts_with(|c: char| c.is_ascii_digit()))
    })
}

fn count_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

impl NodeTopology {
    /// Load a topology from `src`.
    ///
    /// Live and XML topologies are loaded with I/O discovery enabled
    /// (`KeepImportant` for PCI devices, bridges and OS devices) so GPUs can
    /// be counted by [`resources`](Self::resources).
    ///
    /// # Errors
    /// [`TopoError::Load`] if hwloc rejects the synthetic description, cannot
    /// read/parse the XML file, or fails to discover the live machine.
    pub fn load(src: &TopologySource) -> Result<Self, TopoError> {
        let topo = guarded(|| build_topology(src)).map_err(|e| match e {
            TopoError::Internal(msg) => {
                TopoError::Load { origin: src.to_string(), reason: format!("hwlocality panicked: {msg}") }
            }
            other => other,
        })?;
        Ok(NodeTopology { topo, source: src.clone() })
    }

    /// `true` iff the topology was discovered from the running machine
    /// ([`TopologySource::Live`]); only then can its PU indices be used for
    /// real binding.
    pub fn is_live(&self) -> bool {
        matches!(self.source, TopologySource::Live)
    }

    /// The topology as an hwloc XML document (for shells to load quickly instead of rediscovering the machine).
    ///
    /// # Errors
    /// [`TopoError::Internal`] if hwloc cannot export it.
    pub fn export_xml(&self) -> Result<String, TopoError> {
        guarded(|| {
            self.topo
                .export_xml(hwlocality::topology::export::xml::XMLExportFlags::empty())
                .map(|x| x.to_string())
                .map_err(|e| TopoError::Internal(format!("hwloc XML export failed: {e}")))
        })
    }

    /// The source this topology was loaded from.
    pub fn source(&self) -> &TopologySource {
        &self.source
    }

    /// The underlying hwlocality topology, for queries this crate does not
    /// wrap.
    pub fn topology(&self) -> &Topology {
        &self.topo
    }

    /// Summarise the node.
    ///
    /// `declared_gpus`: `Some(n)` overrides discovery (for synthetic nodes
    /// and testing): `gpus = n` and `gpu_names` is empty. With `None`, GPUs
    /// are discovered from OS devices of type GPU/co-processor created by
    /// the CUDA, RSMI, LevelZero, NVML or OpenCL backends; the count is the
    /// largest per-backend count (one board appears once per backend).
    /// DRM (`card0`, `renderD128`) and display devices are not counted, as
    /// they include BMC/VGA adapters.
    pub fn resources(&self, declared_gpus: Option<u32>) -> NodeResources {
        let count = |t| count_u32(self.topo.objects_with_type(t).len());
        let (gpus, gpu_names) = match declared_gpus {
            Some(n) => (n, Vec::new()),
            None => {
                let names = self.discovered_gpus();
                (count_u32(names.len()), names)
            }
        };
        NodeResources {
            cores: count(ObjectType::Core),
            pus: count(ObjectType::PU),
            numa: count(ObjectType::NUMANode),
            packages: count(ObjectType::Package),
            gpus,
            gpu_names,
            source: self.source.to_string(),
        }
    }

    /// Names of discovered GPU OS devices from the backend that sees the
    /// most devices (ties broken by [`GPU_BACKENDS`] order).
    fn discovered_gpus(&self) -> Vec<String> {
        let mut per_backend: Vec<Vec<String>> = vec![Vec::new(); GPU_BACKENDS.len()];
        for obj in self.topo.objects_with_type(ObjectType::OSDevice) {
            if let Some(b) = gpu_backend(obj) {
                let name = obj.name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
                per_backend[b].push(name);
            }
        }
        let mut best: Vec<String> = Vec::new();
        for names in per_backend {
            if names.len() > best.len() {
                best = names;
            }
        }
        best
    }

    /// Compute per-task placement on this node; see [`PlacementRequest`]
    /// for the semantics of each affinity mode.
    ///
    /// Returns exactly `req.ntasks` placements, in task-rank order.
    ///
    /// # Errors
    /// * [`TopoError::UnknownCore`] / [`TopoError::DuplicateCore`] for a bad
    ///   entry in `req.cores` (checked in every mode);
    /// * [`TopoError::NoCores`] if binding is requested for tasks but
    ///   `req.cores` is empty;
    /// * [`TopoError::TooManyTasks`] if `req.ntasks > MAX_TASKS`;
    /// * [`TopoError::Distribute`] / [`TopoError::Internal`] if hwloc fails.
    pub fn place(&self, req: &PlacementRequest) -> Result<Vec<TaskPlacement>, TopoError> {
        guarded(|| placement::place(&self.topo, req))
    }
}

/// hwloc plugins a process that only discovers its node never needs, as `HWLOC_PLUGINS_BLACKLIST` takes them
/// (file names, comma-separated):
/// * `hwloc_xml_libxml.so`: XML through libxml2, which pulls in ICU and libstdc++; hwloc's built-in XML code
///   reads and writes the same format, and libstdc++ is never unloaded, so loading the plugin once costs a
///   broker ~0.8 MB resident for its whole life;
/// * `hwloc_gl.so`: X displays (through libX11), which [`NodeTopology::resources`] never counts as GPUs.
///
/// The PCI and OpenCL (and CUDA, NVML, RSMI, LevelZero, where installed) plugins stay: they find the GPUs.
pub const UNUSED_PLUGINS: &str = "hwloc_xml_libxml.so,hwloc_gl.so";

/// Keeps hwloc from loading [`UNUSED_PLUGINS`] in this process, unless `HWLOC_PLUGINS_BLACKLIST` is already set
/// (the user's choice wins). hwloc reads the variable when it first loads a topology.
///
/// # Safety
/// Sets an environment variable: call it before the process starts any thread (no other thread may read or
/// write the environment at the same time).
pub unsafe fn skip_unused_plugins() {
    if std::env::var_os("HWLOC_PLUGINS_BLACKLIST").is_none() {
        std::env::set_var("HWLOC_PLUGINS_BLACKLIST", UNUSED_PLUGINS);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_display_parse() {
        for s in [
            TopologySource::Live,
            TopologySource::Synthetic("pack:2 core:2 pu:1".into()),
            TopologySource::XmlFile("/tmp/x.xml".into()),
        ] {
            assert_eq!(s.to_string().parse::<TopologySource>().unwrap(), s);
        }
        assert_eq!("bogus".parse::<TopologySource>(), Err(InvalidTopologySource("bogus".into())));
        assert!(matches!(TopoError::from(InvalidTopologySource("x".into())), TopoError::InvalidSource(_)));
    }
}
