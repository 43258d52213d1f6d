//! Task placement for the job shells this broker starts: hwloc's `distrib` over the node's topology
//! ([`vigil_hwloc::NodeTopology::place`]), loaded once per broker instead of once per shell. The result travels in
//! [`ShellInput::placement`]; the shell binds and exports it (`VIGIL_TASK_CPUS`) and links no hwloc itself.

use crate::shellproto::{ShellInput, ShellPlacement};
use std::str::FromStr;
use vigil_hwloc::{CpuAffinity, GpuAffinity, NodeTopology, PlacementRequest, TopologySource};

/// A loaded topology and whether it is this machine's (binding to it is real), or why hwloc could not load it.
type Loaded = Result<(NodeTopology, bool), String>;

/// The node's topology as the broker's shells see it, loaded at the first shell and kept: one broker serves one
/// node, whose topology string (`live`, `live-xml:PATH`, `synthetic:...`, `xml:PATH`) does not change.
#[derive(Default)]
pub(super) struct Placer {
    /// The topology string loaded, and what loading it gave.
    loaded: Option<(String, Loaded)>,
}

impl Placer {
    /// The placement of `input`'s tasks on this node, or `None` for a `cpu-count` node (no hwloc topology: the
    /// shell places its tasks by CPU number). Never fails: what goes wrong is in [`ShellPlacement::error`] (the
    /// job fails) or [`ShellPlacement::notes`] (the job runs unbound, and is told).
    pub(super) fn place(&mut self, input: &ShellInput) -> Option<ShellPlacement> {
        if input.topology == "cpu-count" {
            return None;
        }
        let fail = |error: String| Some(ShellPlacement { error: Some(error), ..ShellPlacement::default() });
        let cpu = match input.option_str("cpu-affinity").map(|v| CpuAffinity::from_str(&v)) {
            Some(Err(e)) => return fail(e.to_string()),
            Some(Ok(c)) => c,
            None => CpuAffinity::PerTask,
        };
        let gpu = match input.option_str("gpu-affinity").map(|v| GpuAffinity::from_str(&v)) {
            Some(Err(e)) => return fail(e.to_string()),
            Some(Ok(g)) => g,
            None => GpuAffinity::PerTask,
        };
        if self.loaded.as_ref().is_none_or(|(s, _)| *s != input.topology) {
            self.loaded = Some((input.topology.clone(), load(&input.topology)));
        }
        let (src, topo) = self.loaded.as_ref()?;
        let leader = input.shell_rank == 0;
        let mut out = ShellPlacement::default();
        match topo {
            Ok((topo, live)) => {
                let req = PlacementRequest {
                    cores: input.cores.clone(),
                    gpus: input.gpus.clone(),
                    ntasks: input.local_tasks,
                    cores_per_task: input.cores_per_task.max(1),
                    gpus_per_task: input.gpus_per_task,
                    cpu_affinity: cpu,
                    gpu_affinity: gpu,
                };
                match topo.place(&req) {
                    Ok(tasks) => out.tasks = tasks,
                    Err(e) => return fail(format!("placement failed: {e}")),
                }
                out.bind = *live && cpu != CpuAffinity::Off;
                if !live && cpu != CpuAffinity::Off && leader {
                    out.notes.push(format!(
                        "vigil-shell: {src} topology: task placement computed and exported in VIGIL_TASK_CPUS, but not bound"
                    ));
                }
            }
            Err(e) => {
                if leader {
                    out.notes.push(format!("vigil-shell: hwloc unavailable ({e}); tasks are not bound"));
                }
            }
        }
        Some(out)
    }
}

/// Load topology `s` with hwloc: (the topology, whether it is this machine's, so that binding to it is real).
/// `live-xml:PATH` is the broker's snapshot of this very machine (see `discover_node`); one whose file is gone
/// is discovered again.
fn load(s: &str) -> Loaded {
    let (src, snapshot) = match s.strip_prefix("live-xml:") {
        Some(p) if std::path::Path::new(p).exists() => (TopologySource::XmlFile(p.into()), true),
        Some(_) => (TopologySource::Live, false),
        None => (TopologySource::from_str(s).unwrap_or(TopologySource::Live), false),
    };
    let topo = NodeTopology::load(&src).map_err(|e| e.to_string())?;
    let live = topo.is_live() || snapshot;
    Ok((topo, live))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(topology: &str, cores: &[u32], tasks: u32, options: serde_json::Value) -> ShellInput {
        serde_json::from_value(serde_json::json!({
            "id": 1, "id_f58": "f1", "shell_rank": 0, "broker_rank": 0, "nshells": 1, "ntasks": tasks,
            "first_task": 0, "local_tasks": tasks, "cores": cores, "gpus": [], "cores_per_task": 1,
            "gpus_per_task": 0, "command": ["true"], "environment": {}, "cwd": null, "options": options,
            "taskmap": null, "r": null, "topology": topology, "declared_gpus": null, "uri": "local:///x",
        }))
        .unwrap()
    }

    #[test]
    fn the_broker_places_each_task_on_its_own_cores_and_binds_only_on_this_machine() {
        let mut p = Placer::default();
        // A synthetic node of 2 packages x 2 cores x 2 PUs: placement is computed, exported, not bound.
        let syn = "synthetic:pack:2 core:2 pu:2";
        let got = p.place(&input(syn, &[0, 1, 2, 3], 2, serde_json::json!({}))).unwrap();
        assert_eq!(got.error, None);
        assert_eq!(got.tasks.len(), 2);
        assert_eq!(got.tasks[0].cores, vec![0, 1]);
        assert_eq!(got.tasks[1].cores, vec![2, 3]);
        assert_eq!(got.tasks[0].cpus, Some(vec![0, 1, 2, 3]));
        assert!(!got.bind);
        assert!(got.notes.iter().any(|n| n.contains("but not bound")), "{:?}", got.notes);
        // cpu-affinity=off: no CPUs, nothing to tell.
        let off = p.place(&input(syn, &[0, 1], 1, serde_json::json!({"cpu-affinity": "off"}))).unwrap();
        assert_eq!(off.tasks[0].cpus, None);
        assert!(off.notes.is_empty() && !off.bind);
    }

    #[test]
    fn a_bad_option_fails_the_job_and_a_topology_hwloc_cannot_load_runs_it_unbound() {
        let mut p = Placer::default();
        let bad = p.place(&input("synthetic:core:2 pu:1", &[0], 1, serde_json::json!({"cpu-affinity": "sideways"})));
        let e = bad.unwrap().error.unwrap();
        assert!(e.contains("cpu-affinity") && e.contains("sideways"), "{e}");
        let gone = p.place(&input("xml:/nonexistent/topo.xml", &[0], 1, serde_json::json!({}))).unwrap();
        assert_eq!(gone.error, None);
        assert!(gone.tasks.is_empty() && !gone.bind);
        assert!(gone.notes.iter().any(|n| n.contains("hwloc unavailable")), "{:?}", gone.notes);
        // No hwloc topology at all: the shell places by CPU number.
        assert_eq!(p.place(&input("cpu-count", &[0], 1, serde_json::json!({}))), None);
    }
}
