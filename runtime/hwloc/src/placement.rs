//! Per-task CPU/GPU placement (Flux shell `cpu-affinity` / `gpu-affinity`
//! semantics) on top of hwloc's `distrib` algorithm.

use super::TopoError;
use hwlocality::cpu::cpuset::CpuSet;
use hwlocality::object::depth::NormalDepth;
use hwlocality::object::types::ObjectType;
use hwlocality::object::TopologyObject;
use hwlocality::topology::DistributeFlags;
use hwlocality::Topology;
use serde::{Deserialize, Serialize};
use vigil_proto::affinity::{CpuAffinity, GpuAffinity};

/// Largest [`PlacementRequest::ntasks`] accepted by
/// [`NodeTopology::place`](super::NodeTopology::place) (65536 tasks on one
/// node); larger requests get [`TopoError::TooManyTasks`] instead of
/// exhausting memory.
pub const MAX_TASKS: u32 = 1 << 16;

/// What a job was given on this node and how its tasks should be placed.
///
/// # CPU placement (`cpu_affinity`)
///
/// Let `m = cores.len()`, `n = ntasks`, `c = max(cores_per_task, 1)`
/// (`0` is treated as `1`). Allocated cores are first sorted by logical
/// index.
///
/// * [`CpuAffinity::PerTask`]:
///   * `m >= n * c`: hwloc's `distrib` algorithm
///     (`Topology::distribute_items`) is run with the allocated `Core`
///     objects as roots (in logical order) and `max_depth` = core depth, so
///     a core is never split. This is a linear distribution weighted by PU
///     count: task `i` starts at allocated core `floor(i * m / n)` (for
///     equal-SMT cores) and owns every core up to the next task's first
///     core. So with `m == n * c` each task gets exactly `c` consecutive
///     cores; with spare cores each task gets its whole share (spare cores
///     are handed out, not left idle; e.g. 4 tasks on 4x24 cores get one
///     package each, as `hwloc-distrib --to core` does). Shares never
///     overlap. If hwloc's result ever violates "disjoint, >= c cores each,
///     exactly c when `m == n*c`" (possible only with cores of unequal PU
///     counts), the count-based split above is used instead.
///   * `m < n * c` (oversubscription, never an error): task `i` gets cores
///     `sorted[(i*c + j) % m]` for `j in 0..min(c, m)`, i.e. blocks of `c`
///     dealt round-robin, so tasks share cores.
/// * [`CpuAffinity::On`]: every task gets all allocated cores.
/// * [`CpuAffinity::Off`]: every task's `cores` are all allocated cores and
///   `cpus` is `None`.
///
/// # GPU placement (`gpu_affinity`), with `G = gpus.len()`, `g = gpus_per_task`
///
/// * [`GpuAffinity::PerTask`], `g > 0`: task `i` gets
///   `gpus[i*g .. (i+1)*g]` clipped to `0..G` (so possibly fewer or none).
/// * [`GpuAffinity::PerTask`], `g == 0`: GPUs are split evenly in
///   consecutive blocks, the first `G % n` tasks getting one extra
///   (`G < n` means the last tasks get none).
/// * [`GpuAffinity::On`]: every task gets all of `gpus`.
/// * [`GpuAffinity::Off`]: `gpus` is `None`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct PlacementRequest {
    /// Logical indices of the `Core` objects allocated to the job on this
    /// node (any order; no duplicates; each `< NodeResources::cores`).
    pub cores: Vec<u32>,
    /// GPU ids (`0..NodeResources::gpus`) allocated on this node; passed
    /// through verbatim, not validated against the topology.
    pub gpus: Vec<u32>,
    /// Number of tasks to place on this node (`<= MAX_TASKS`).
    pub ntasks: u32,
    /// Cores each task should get (`0` is treated as `1`).
    pub cores_per_task: u32,
    /// GPUs each task should get (`0` = split evenly, see above).
    pub gpus_per_task: u32,
    /// CPU binding policy.
    pub cpu_affinity: CpuAffinity,
    /// GPU binding policy.
    pub gpu_affinity: GpuAffinity,
}

pub use vigil_proto::shellproto::TaskPlacement;

fn to_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Count-based linear split of `m` items into `n` consecutive chunks:
/// chunk `j` is `floor(j*m/n) .. floor((j+1)*m/n)`. Requires `n >= 1`.
pub(crate) fn linear_chunks(m: usize, n: usize) -> Vec<std::ops::Range<usize>> {
    let (m64, n64) = (m as u128, n as u128);
    (0..n)
        .map(|j| {
            let j = j as u128;
            let a = (j * m64 / n64) as usize;
            let b = ((j + 1) * m64 / n64) as usize;
            a..b
        })
        .collect()
}

/// Per-task lists of allocated-core *positions* (indices into `alloc`) for
/// the per-task policy. `alloc` is sorted by logical index, non-empty,
/// `n >= 1`, `c >= 1`.
fn per_task_cores(
    topo: &Topology,
    alloc: &[&TopologyObject],
    n: usize,
    c: usize,
) -> Result<Vec<Vec<usize>>, TopoError> {
    let m = alloc.len();
    let need = (n as u128) * (c as u128);
    if (m as u128) < need {
        // Oversubscribe: deal blocks of c cores round-robin.
        let per = c.min(m);
        return Ok((0..n)
            .map(|i| {
                let mut v: Vec<usize> =
                    (0..per).map(|j| ((i as u128 * c as u128 + j as u128) % m as u128) as usize).collect();
                v.sort_unstable();
                v.dedup();
                v
            })
            .collect());
    }

    let depth = NormalDepth::try_from(alloc[0].depth())
        .map_err(|d| TopoError::Internal(format!("core object at non-normal depth {d}")))?;
    let sets = topo
        .distribute_items(alloc, n, depth, DistributeFlags::empty())
        .map_err(|e| TopoError::Distribute(e.to_string()))?;

    let mut owner: Vec<Option<usize>> = vec![None; m];
    let mut result: Vec<Vec<usize>> = Vec::with_capacity(n);
    let mut ok = sets.len() == n;
    for (t, set) in sets.iter().enumerate() {
        let mut mine = Vec::new();
        for (pos, core) in alloc.iter().enumerate() {
            let Some(cs) = core.cpuset() else { continue };
            if !cs.is_empty() && set.includes(&*cs) {
                if owner[pos].is_some() {
                    ok = false;
                }
                owner[pos] = Some(t);
                mine.push(pos);
            }
        }
        if mine.len() < c || (m as u128 == need && mine.len() != c) {
            ok = false;
        }
        result.push(mine);
    }
    if ok {
        Ok(result)
    } else {
        Ok(linear_chunks(m, n).into_iter().map(|r| r.collect()).collect())
    }
}

/// Implementation of [`super::NodeTopology::place`].
pub(crate) fn place(topo: &Topology, req: &PlacementRequest) -> Result<Vec<TaskPlacement>, TopoError> {
    if req.ntasks > MAX_TASKS {
        return Err(TopoError::TooManyTasks { ntasks: req.ntasks, max: MAX_TASKS });
    }
    let all_cores: Vec<&TopologyObject> = topo.objects_with_type(ObjectType::Core).collect();
    for &idx in &req.cores {
        if idx as usize >= all_cores.len() {
            return Err(TopoError::UnknownCore { index: idx, available: to_u32(all_cores.len()) });
        }
    }
    let mut sorted = req.cores.clone();
    sorted.sort_unstable();
    if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
        return Err(TopoError::DuplicateCore(w[0]));
    }
    let n = req.ntasks as usize;
    if n == 0 {
        return Ok(Vec::new());
    }
    if sorted.is_empty() && req.cpu_affinity != CpuAffinity::Off {
        return Err(TopoError::NoCores { ntasks: req.ntasks });
    }
    let alloc: Vec<&TopologyObject> = sorted.iter().map(|&i| all_cores[i as usize]).collect();
    let c = (req.cores_per_task as usize).max(1);

    let task_positions: Vec<Vec<usize>> = match req.cpu_affinity {
        CpuAffinity::PerTask => per_task_cores(topo, &alloc, n, c)?,
        CpuAffinity::On | CpuAffinity::Off => {
            let all: Vec<usize> = (0..alloc.len()).collect();
            vec![all; n]
        }
    };

    let numa_nodes: Vec<(u32, CpuSet)> = topo
        .objects_with_type(ObjectType::NUMANode)
        .filter_map(|o| o.cpuset().map(|s| (to_u32(o.logical_index()), s.clone_target())))
        .collect();

    let mut out = Vec::with_capacity(n);
    for (i, positions) in task_positions.iter().enumerate() {
        let mut set = CpuSet::new();
        for &p in positions {
            if let Some(cs) = alloc[p].cpuset() {
                set |= &*cs;
            }
        }
        let cores: Vec<u32> = positions.iter().map(|&p| sorted[p]).collect();
        let cpus = match req.cpu_affinity {
            CpuAffinity::Off => None,
            _ => Some(set.iter_set().map(|b| to_u32(usize::from(b))).collect()),
        };
        let numa: Vec<u32> = numa_nodes.iter().filter(|(_, ns)| ns.intersects(&set)).map(|(l, _)| *l).collect();
        out.push(TaskPlacement { cpus, cores, numa, gpus: gpus_for_task(req, i, n) });
    }
    Ok(out)
}

/// GPU ids for task `i` of `n` (see [`PlacementRequest`]).
fn gpus_for_task(req: &PlacementRequest, i: usize, n: usize) -> Option<Vec<u32>> {
    let gpus = &req.gpus;
    let total = gpus.len();
    match req.gpu_affinity {
        GpuAffinity::Off => None,
        GpuAffinity::On => Some(gpus.clone()),
        GpuAffinity::PerTask => {
            let (start, end) = if req.gpus_per_task > 0 {
                let g = req.gpus_per_task as u128;
                let s = (i as u128 * g).min(total as u128) as usize;
                let e = ((i as u128 + 1) * g).min(total as u128) as usize;
                (s, e)
            } else {
                let base = total / n;
                let extra = total % n;
                let s = i * base + i.min(extra);
                let len = base + usize::from(i < extra);
                (s, s + len)
            };
            Some(gpus[start..end].to_vec())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_are_balanced_partition() {
        for m in 1..40 {
            for n in 1..=m {
                let ch = linear_chunks(m, n);
                assert_eq!(ch.len(), n);
                assert_eq!(ch[0].start, 0);
                assert_eq!(ch[n - 1].end, m);
                for w in ch.windows(2) {
                    assert_eq!(w[0].end, w[1].start);
                }
                for r in &ch {
                    assert!(r.len() >= m / n && r.len() <= m.div_ceil(n));
                }
            }
        }
    }
}
