//! What this node has: its cores, GPUs and topology, found with hwloc when the broker starts ([`discover`]),
//! preferably in a child process (`vigil discover-node`, [`discover_node_main`]) or read from a file
//! `vigil start` wrote once for all of a test instance's brokers ([`discover_in_child_to`]).
//!
//! Where the tasks of a job go on the node found here is `placement.rs`'s; the loop that starts with it is
//! `driver.rs`'s.

use super::BrokerOptions;
use crate::hwloc::{NodeResources, NodeTopology, TopologySource};
use tracing::{debug, warn};

/// Discover the node with hwloc; degrade to the CPU count if hwloc is unavailable or disabled
/// (`resource.discovery=cpu-count`). The degradation is logged once and shown by `vigil uptime`. Returns the
/// node's resources and where its shells find its topology.
///
/// hwloc runs in a child process (`vigil discover-node`, [`discover_node`]) when it can: discovering a live
/// node loads hwloc's plugins and libpciaccess, whose PCI name tables are never freed, and leaves the broker's
/// heap fragmented, ~1 MB resident for the broker's whole life for a result of a few numbers. Should the child
/// not run (no `vigil` binary to start), the broker discovers the node itself.
pub(super) fn discover(opts: &BrokerOptions, discovered: Option<&std::path::Path>) -> (NodeResources, String) {
    let rank = opts.rank;
    let forced = opts.config.discovery == crate::attrs::Discovery::CpuCount;
    let xml = opts.rundir.join(format!("topology-{rank}.xml"));
    let shared = discovered.and_then(|p| match read_discovered(p) {
        Ok(d) => Some(d),
        Err(e) => {
            debug!("{}: {e}; discovering the node", p.display());
            None
        }
    });
    let loaded = if forced {
        Err("disabled by resource.discovery=cpu-count".to_string())
    } else if let Some(d) = shared {
        d
    } else {
        match discover_in_child(&opts.config.topology, opts.config.gpus, &xml) {
            Ok(r) => r,
            Err(why) => {
                debug!("node discovery in a child process failed ({why}); discovering here");
                discover_node(&opts.config.topology, opts.config.gpus, &xml)
            }
        }
    };
    match loaded {
        Ok(found) => found,
        Err(e) => {
            let n = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0))
                .map(|set| (0..nix::sched::CpuSet::count()).filter(|&i| set.is_set(i).unwrap_or(false)).count() as u32)
                .unwrap_or(1)
                .max(1);
            warn!("hwloc topology unavailable ({e}); falling back to {n} cores from the CPU count, tasks bound by CPU number");
            let r = NodeResources {
                cores: n,
                pus: n,
                numa: 1,
                packages: 1,
                gpus: opts.config.gpus.unwrap_or(0),
                gpu_names: vec![],
                source: format!("cpu-count ({e})"),
            };
            (r, "cpu-count".to_string())
        }
    }
}

/// What [`discover_node`] found, as `vigil discover-node` prints it (one JSON object on stdout).
#[derive(serde::Serialize, serde::Deserialize)]
struct Discovered {
    /// The node's resources, or why hwloc could not load the topology.
    resources: Result<NodeResources, String>,
    /// Where the shells find the topology (`live-xml:PATH`, or the source itself).
    topology: String,
}

/// Load `source` with hwloc and summarise it. A live topology is also written to `xml` as hwloc XML, for the
/// shells to load quickly instead of rediscovering the machine (~20 ms of CPU each); the returned topology
/// string then names it (`live-xml:PATH`). `Err`: hwloc could not load the topology.
fn discover_node(
    source: &TopologySource,
    declared_gpus: Option<u32>,
    xml: &std::path::Path,
) -> Result<(NodeResources, String), String> {
    let t = NodeTopology::load(source).map_err(|e| e.to_string())?;
    let mut src = source.to_string();
    if t.is_live() {
        match t.export_xml().map_err(|e| e.to_string()).and_then(|x| {
            xml.parent()
                .map_or(Ok(()), std::fs::create_dir_all)
                .and_then(|_| std::fs::write(xml, x))
                .map_err(|e| e.to_string())
        }) {
            Ok(()) => src = format!("live-xml:{}", xml.display()),
            Err(e) => debug!("no topology snapshot for shells ({e}); they will discover the node themselves"),
        }
    }
    Ok((t.resources(declared_gpus), src))
}

/// A [`Discovered`] node from a file (written by [`discover_in_child_to`]).
fn read_discovered(p: &std::path::Path) -> Result<Result<(NodeResources, String), String>, String> {
    let text = std::fs::read(p).map_err(|e| e.to_string())?;
    let d: Discovered = serde_json::from_slice(&text).map_err(|e| format!("not understood: {e}"))?;
    Ok(d.resources.map(|r| (r, d.topology)))
}

/// Runs `vigil discover-node` (the binary `exe`) and writes its answer to `out`, for brokers to read with
/// [`DriverOptions::discovered`](super::DriverOptions::discovered). `Err` says why there is no answer (the brokers then discover the node
/// themselves); an hwloc failure is an answer, which each broker then reports.
pub fn discover_in_child_to(
    exe: &std::path::Path,
    source: &TopologySource,
    declared_gpus: Option<u32>,
    xml: &std::path::Path,
    out: &std::path::Path,
) -> Result<(), String> {
    let answer = run_discover_node(exe, source, declared_gpus, xml)?;
    std::fs::write(out, answer).map_err(|e| format!("cannot write {}: {e}", out.display()))
}

/// `vigil discover-node` run from `exe`: its answer (checked to be a [`Discovered`]).
fn run_discover_node(
    exe: &std::path::Path,
    source: &TopologySource,
    declared_gpus: Option<u32>,
    xml: &std::path::Path,
) -> Result<Vec<u8>, String> {
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("discover-node").arg(format!("--source={source}")).arg("--xml").arg(xml);
    if let Some(n) = declared_gpus {
        cmd.arg(format!("--gpus={n}"));
    }
    cmd.stdin(std::process::Stdio::null()).stderr(std::process::Stdio::inherit());
    let out = cmd.output().map_err(|e| format!("cannot start it: {e}"))?;
    if !out.status.success() {
        return Err(format!("it ended with {}", out.status));
    }
    serde_json::from_slice::<Discovered>(&out.stdout).map_err(|e| format!("its answer is not understood: {e}"))?;
    Ok(out.stdout)
}

/// [`discover_node`] in a child process (`vigil discover-node`). The outer `Err` says why the child gave no
/// answer; the inner result is the discovery's.
fn discover_in_child(
    source: &TopologySource,
    declared_gpus: Option<u32>,
    xml: &std::path::Path,
) -> Result<Result<(NodeResources, String), String>, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the vigil binary: {e}"))?;
    let answer = run_discover_node(&exe, source, declared_gpus, xml)?;
    let d: Discovered = serde_json::from_slice(&answer).map_err(|e| format!("its answer is not understood: {e}"))?;
    Ok(d.resources.map(|r| (r, d.topology)))
}

/// `vigil discover-node --source=SOURCE --xml=PATH [--gpus=N]` (internal, run by the broker at start): prints
/// the node it found as one JSON object; returns the exit code (0 also when hwloc cannot load the topology:
/// the answer says so).
pub fn discover_node_main(source: &str, declared_gpus: Option<u32>, xml: &std::path::Path) -> i32 {
    let source = match source.parse::<TopologySource>() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("vigil: {e}");
            return 1;
        }
    };
    let (resources, topology) = match discover_node(&source, declared_gpus, xml) {
        Ok((r, t)) => (Ok(r), t),
        Err(e) => (Err(e), source.to_string()),
    };
    match serde_json::to_string(&Discovered { resources, topology }) {
        Ok(j) => {
            println!("{j}");
            0
        }
        Err(e) => {
            eprintln!("vigil: {e}");
            1
        }
    }
}
