//! # Vigil node topology
//!
//! Node hardware topology (hwloc): discovery, placement and binding, shared by the broker (which reports its
//! node's resources) and the job shell (which places and binds tasks).
//!
//! This crate wraps [`hwlocality`] (Rust bindings to hwloc 2.x) to
//!
//! * load a node's topology from the live machine, an hwloc synthetic
//!   description, or an hwloc XML file ([`NodeTopology::load`]);
//! * summarise it for a broker joining the instance ([`NodeResources`]);
//! * compute per-task CPU/GPU placement in the style of the Flux shell's
//!   `cpu-affinity` / `gpu-affinity` options ([`NodeTopology::place`]);
//! * apply a CPU binding in a freshly forked child ([`CpuMask`],
//!   [`bind_current_process`]) and read back the current one
//!   ([`current_affinity`]).
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
//! [`TopoError`] (or an [`std::io::Error`] for the syscall wrappers).

mod placement;

pub use placement::{CpuAffinity, GpuAffinity, PlacementRequest, TaskPlacement, MAX_TASKS};

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

    /// An affinity option string is not `off`, `on` or `per-task`.
    /// `option` is the option name (`cpu-affinity` / `gpu-affinity`),
    /// `value` the rejected text.
    #[error("invalid {option} value '{value}' (expected 'off', 'on' or 'per-task')")]
    InvalidAffinity {
        /// Name of the option being parsed.
        option: &'static str,
        /// The rejected value, verbatim.
        value: String,
    },

    /// An empty CPU list was given where at least one CPU is required
    /// (e.g. [`CpuMask::new`]).
    #[error("empty cpu list")]
    EmptyCpuList,

    /// A CPU (OS PU index) is not representable in a `cpu_set_t`, i.e. it
    /// is `>= limit` where `limit` is `libc::CPU_SETSIZE` (1024 on glibc).
    #[error("cpu {cpu} is out of range (must be < {limit})")]
    CpuOutOfRange {
        /// The offending OS PU index.
        cpu: u32,
        /// Exclusive upper bound.
        limit: u32,
    },

    /// A CPU list string such as `"0-3,8"` could not be parsed by
    /// [`parse_cpulist`]; carries the offending text.
    #[error("invalid cpu list '{0}'")]
    InvalidCpuList(String),

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

/// Format a list of ids as a compact list `"0-3,8,10-11"` (like Linux cpu
/// lists). Input order and duplicates do not matter; the output is sorted.
/// An empty slice gives `""`.
pub fn format_cpulist(ids: &[u32]) -> String {
    let mut v = ids.to_vec();
    v.sort_unstable();
    v.dedup();
    let mut out = String::new();
    let mut i = 0;
    while i < v.len() {
        let start = v[i];
        let mut end = start;
        while i + 1 < v.len() && end.checked_add(1) == Some(v[i + 1]) {
            i += 1;
            end = v[i];
        }
        if !out.is_empty() {
            out.push(',');
        }
        if start == end {
            out.push_str(&start.to_string());
        } else {
            out.push_str(&format!("{start}-{end}"));
        }
        i += 1;
    }
    out
}

/// Largest number of ids [`parse_cpulist`] will expand (guards memory).
const MAX_CPULIST_LEN: u64 = 1 << 20;

/// Parse a Linux-style cpu list (`"0-3,8,10-11"`, whitespace around items
/// allowed, empty string = empty list) into sorted, de-duplicated ids.
///
/// # Errors
/// [`TopoError::InvalidCpuList`] on syntax errors, reversed ranges, or lists
/// expanding to more than 2^20 ids.
pub fn parse_cpulist(s: &str) -> Result<Vec<u32>, TopoError> {
    let bad = || TopoError::InvalidCpuList(s.to_string());
    let mut out = Vec::new();
    let mut total: u64 = 0;
    if s.trim().is_empty() {
        return Ok(out);
    }
    for item in s.split(',') {
        let item = item.trim();
        let (a, b) = match item.split_once('-') {
            Some((a, b)) => (a.trim(), b.trim()),
            None => (item, item),
        };
        let a: u32 = a.parse().map_err(|_| bad())?;
        let b: u32 = b.parse().map_err(|_| bad())?;
        if a > b {
            return Err(bad());
        }
        total += u64::from(b - a) + 1;
        if total > MAX_CPULIST_LEN {
            return Err(bad());
        }
        out.extend(a..=b);
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// A CPU affinity mask (`libc::cpu_set_t`, i.e. OS PU indices
/// `0..CPU_SETSIZE`) built ahead of time so that it can be applied in a
/// context where allocation is forbidden.
///
/// Typical use: build it in the parent with [`CpuMask::new`], then call
/// [`CpuMask::apply`] from `std::os::unix::process::CommandExt::pre_exec`
/// (after `fork`, before `exec`).
#[derive(Clone, Copy)]
pub struct CpuMask(libc::cpu_set_t);

/// `CPU_SETSIZE` as a `u32`.
const CPU_SETSIZE_U32: u32 = libc::CPU_SETSIZE as u32;

fn empty_cpu_set() -> libc::cpu_set_t {
    // SAFETY: cpu_set_t is a plain array of integers; all-zero is the empty set.
    unsafe { std::mem::zeroed() }
}

impl CpuMask {
    /// Build a mask containing exactly `cpus` (OS PU indices, any order,
    /// duplicates allowed).
    ///
    /// # Errors
    /// [`TopoError::EmptyCpuList`] if `cpus` is empty;
    /// [`TopoError::CpuOutOfRange`] if an index is `>= libc::CPU_SETSIZE`.
    /// CPUs that do not exist on the machine are only detected by the kernel
    /// in [`apply`](Self::apply) (EINVAL if *no* listed CPU is usable).
    pub fn new(cpus: &[u32]) -> Result<Self, TopoError> {
        if cpus.is_empty() {
            return Err(TopoError::EmptyCpuList);
        }
        let mut set = empty_cpu_set();
        for &c in cpus {
            if c >= CPU_SETSIZE_U32 {
                return Err(TopoError::CpuOutOfRange { cpu: c, limit: CPU_SETSIZE_U32 });
            }
            // SAFETY: c < CPU_SETSIZE, so CPU_SET stays in bounds.
            unsafe { libc::CPU_SET(c as usize, &mut set) };
        }
        Ok(CpuMask(set))
    }

    /// The OS PU indices in the mask, ascending.
    pub fn cpus(&self) -> Vec<u32> {
        (0..CPU_SETSIZE_U32)
            .filter(|&c| {
                // SAFETY: c < CPU_SETSIZE, in bounds of the set.
                unsafe { libc::CPU_ISSET(c as usize, &self.0) }
            })
            .collect()
    }

    /// Bind the calling thread (pid 0) to this mask with
    /// `sched_setaffinity`. Async-signal-safe (one syscall, no allocation),
    /// so it may run in `pre_exec`. In a single-threaded child this binds
    /// the whole process; in a multi-threaded process only the calling
    /// thread (and threads/children it creates later) are affected.
    ///
    /// # Errors
    /// The OS error from `sched_setaffinity` (e.g. `EINVAL` if no CPU in
    /// the mask is online and allowed by the cgroup).
    pub fn apply(&self) -> std::io::Result<()> {
        // SAFETY: valid pointer to a fully initialised cpu_set_t of the
        // size passed.
        let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &self.0) };
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }
}

impl fmt::Debug for CpuMask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CpuMask({})", format_cpulist(&self.cpus()))
    }
}

/// Bind the calling thread/process to the given OS PU indices
/// (`sched_setaffinity` on pid 0, see [`CpuMask::apply`] for the thread vs
/// process caveat).
///
/// Async-signal-safe: the `cpu_set_t` lives on the stack and errors are
/// built with `io::Error::from_raw_os_error` (no allocation). Callers that
/// prefer to validate before `fork` can build a [`CpuMask`] with
/// [`CpuMask::new`] and call [`CpuMask::apply`] in `pre_exec`.
///
/// # Errors
/// `EINVAL` (`ErrorKind::InvalidInput`) if `cpus` is empty or an index is
/// `>= libc::CPU_SETSIZE`; otherwise the OS error of `sched_setaffinity`.
pub fn bind_current_process(cpus: &[u32]) -> std::io::Result<()> {
    if cpus.is_empty() {
        return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
    }
    let mut set = empty_cpu_set();
    for &c in cpus {
        if c >= CPU_SETSIZE_U32 {
            return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
        }
        // SAFETY: c < CPU_SETSIZE, so CPU_SET stays in bounds.
        unsafe { libc::CPU_SET(c as usize, &mut set) };
    }
    CpuMask(set).apply()
}

/// Read the calling thread's allowed CPUs (`sched_getaffinity` on pid 0) as
/// ascending OS PU indices. Works on machines with more than
/// `CPU_SETSIZE` CPUs (the buffer grows as needed). Allocates: not for use
/// in `pre_exec`.
///
/// # Errors
/// The OS error from `sched_getaffinity`.
pub fn current_affinity() -> std::io::Result<Vec<u32>> {
    const WORD_BITS: usize = libc::c_ulong::BITS as usize;
    let mut nbits: usize = libc::CPU_SETSIZE as usize;
    loop {
        let mut buf: Vec<libc::c_ulong> = vec![0; nbits / WORD_BITS];
        let bytes = buf.len() * std::mem::size_of::<libc::c_ulong>();
        // SAFETY: buf is `bytes` long and suitably aligned for cpu_set_t's
        // element type; the kernel writes at most `bytes` bytes.
        let rc = unsafe { libc::sched_getaffinity(0, bytes, buf.as_mut_ptr().cast::<libc::cpu_set_t>()) };
        if rc == 0 {
            let mut out = Vec::new();
            for (w, word) in buf.iter().enumerate() {
                for b in 0..WORD_BITS {
                    if word & (1 << b) != 0 {
                        out.push(count_u32(w * WORD_BITS + b));
                    }
                }
            }
            return Ok(out);
        }
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::EINVAL) && nbits < (1 << 22) {
            nbits *= 2;
            continue;
        }
        return Err(err);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpulist_roundtrip() {
        assert_eq!(format_cpulist(&[]), "");
        assert_eq!(format_cpulist(&[3, 0, 1, 2, 8, 11, 10, 10]), "0-3,8,10-11");
        assert_eq!(format_cpulist(&[u32::MAX, u32::MAX - 1]), format!("{}-{}", u32::MAX - 1, u32::MAX));
        assert_eq!(parse_cpulist("0-3,8,10-11").unwrap(), vec![0, 1, 2, 3, 8, 10, 11]);
        assert_eq!(parse_cpulist(" 5 ").unwrap(), vec![5]);
        assert_eq!(parse_cpulist("").unwrap(), Vec::<u32>::new());
        assert!(parse_cpulist("3-1").is_err());
        assert!(parse_cpulist("a").is_err());
        assert!(parse_cpulist("0-4294967295").is_err());
    }

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

    #[test]
    fn cpumask_validation() {
        assert_eq!(CpuMask::new(&[]).unwrap_err(), TopoError::EmptyCpuList);
        assert!(matches!(CpuMask::new(&[0, 5000]), Err(TopoError::CpuOutOfRange { cpu: 5000, .. })));
        assert_eq!(CpuMask::new(&[3, 1, 3]).unwrap().cpus(), vec![1, 3]);
        let e = bind_current_process(&[]).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
        let e = bind_current_process(&[1 << 20]).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
    }
}
