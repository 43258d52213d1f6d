//! The resource pool, as a plain state machine (which job goes first is `backfill.rs`'s business).
//!
//! The pool holds, per broker rank, the cores and GPUs the rank reported when it joined (ids as in R, RFC 20),
//! what is allocated, and the rank's state: `up` (online, not lost), `drained` (administrative, with a reason),
//! `torpid` (no new work), `removed` (left the instance for good: RFC 28 `shrink`, nested instances only).
//! Allocation is first fit in rank order: the lowest ranks and the lowest core ids first. First fit is complete:
//! [`Pool::allocate`] fails only when no placement exists, which is what lets a reservation be computed by
//! freeing running jobs and trying again (`backfill.rs`).

use crate::idset::IdSet;
use crate::jobspec::JobRequest;
use serde::Serialize;
use std::collections::BTreeMap;

/// One rank's resources and state.
#[derive(Clone, Debug, Serialize)]
pub struct RankPool {
    /// Broker rank.
    pub rank: u32,
    /// Hostname the broker reported.
    pub hostname: String,
    /// Every core id (hwloc logical index) of the node.
    pub cores: IdSet,
    /// Every GPU id of the node.
    pub gpus: IdSet,
    /// Cores currently allocated to jobs.
    pub alloc_cores: IdSet,
    /// GPUs currently allocated to jobs.
    pub alloc_gpus: IdSet,
    /// Broker is online (joined and not lost).
    pub up: bool,
    /// Peer is torpid: up, but no new work is placed there.
    pub torpid: bool,
    /// Drain reason when drained (administratively removed from scheduling).
    pub drained: Option<String>,
    /// When the rank was drained, seconds since the epoch.
    pub drained_at: Option<f64>,
    /// The rank left the instance for good (RFC 28 `shrink`: a nested instance's lost broker never returns): it
    /// no longer counts for what the instance can ever run ([`Pool::feasible`]) and a re-registration is ignored.
    pub removed: bool,
    /// Free cores and GPUs, counted when the pool changes them ([`RankPool::recount`]), so that a scheduling
    /// pass reads a count instead of walking id sets.
    #[serde(skip)]
    nfree: (u32, u32),
}

impl RankPool {
    /// True if new work may be placed on this rank.
    pub fn schedulable(&self) -> bool {
        self.up && !self.removed && !self.torpid && self.drained.is_none()
    }
    /// Free cores and GPUs. Counted, not subtracted: a rank that re-registered with fewer ids than its jobs still
    /// hold has allocated ids outside its set, and none of those are free.
    fn nfree(&self) -> (u32, u32) {
        self.nfree
    }
    /// Count the free cores and GPUs again (after `cores`, `gpus`, `alloc_cores` or `alloc_gpus` changed).
    fn recount(&mut self) {
        // Walk the smaller set: `all` minus the ids of `used` that are in it.
        let free = |all: &IdSet, used: &IdSet| {
            if used.is_empty() {
                all.len() as u32
            } else if used.len() < all.len() {
                (all.len() - used.iter().filter(|i| all.contains(*i)).count()) as u32
            } else {
                all.iter().filter(|i| !used.contains(*i)).count() as u32
            }
        };
        self.nfree = (free(&self.cores, &self.alloc_cores), free(&self.gpus, &self.alloc_gpus));
    }
    fn free_cores(&self) -> IdSet {
        self.cores.difference(&self.alloc_cores)
    }
    fn free_gpus(&self) -> IdSet {
        self.gpus.difference(&self.alloc_gpus)
    }
}

/// The share of one rank given to a job.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RankAlloc {
    /// Broker rank.
    pub rank: u32,
    /// Allocated core ids.
    pub cores: IdSet,
    /// Allocated GPU ids.
    pub gpus: IdSet,
    /// Number of jobspec slots placed on this rank.
    pub slots: u32,
}

/// Why a request can never be satisfied by this instance (refused at submit).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Unsatisfiable {
    /// More nodes than the instance has (ranks it lost for good, RFC 28 `shrink`, are not counted).
    #[error("requested {want} nodes but this instance has {have}")]
    Nodes {
        /// Requested.
        want: u32,
        /// Available in the instance.
        have: u32,
    },
    /// A slot larger than any node.
    #[error("requested {want_cores} cores and {want_gpus} GPUs per node but the largest node has {have_cores} cores and {have_gpus} GPUs")]
    NodeTooSmall {
        /// Cores wanted on one node.
        want_cores: u32,
        /// GPUs wanted on one node.
        want_gpus: u32,
        /// Cores of the largest node.
        have_cores: u32,
        /// GPUs of the largest node.
        have_gpus: u32,
    },
    /// Fewer nodes satisfy the job's constraints (`--requires`, `--nodelist`, `--exclude`) than it needs.
    #[error("requested {want} node(s) but {have} of this instance's nodes satisfy the job's constraints")]
    Constrained {
        /// Nodes needed (1 for a request of slots).
        want: u32,
        /// Nodes of the instance that satisfy the constraints.
        have: u32,
    },
    /// A node range with a task total (`-N MIN-MAX -n N`) that no node count of its range can hold: each count
    /// needs its own number of slots per node ([`JobRequest::slots_on`]).
    #[error("requested {ntasks} tasks on {min}-{max} nodes but no node count in that range fits this instance: {why}")]
    NodeRange {
        /// Fewest nodes.
        min: u32,
        /// Most nodes.
        max: u32,
        /// Tasks to spread over them.
        ntasks: u32,
        /// What the largest and the smallest count would need and how many nodes have it, e.g. `3 nodes would
        /// need 2 cores each (2 nodes have that); 2 nodes would need 3 cores each (none has that)`.
        why: String,
    },
    /// More slots than the instance can hold.
    #[error("requested {want} slots of {cores} cores and {gpus} GPUs but this instance holds at most {have}")]
    Slots {
        /// Slots wanted.
        want: u32,
        /// Cores per slot.
        cores: u32,
        /// GPUs per slot.
        gpus: u32,
        /// Slots the whole instance could hold.
        have: u32,
    },
}

/// Free and allocated core and GPU counts per rank, for what-if questions ("would this fit once those jobs
/// end?") without cloning any id set ([`Pool::counts`], used by `backfill.rs`). [`Counts::fits`] answers as
/// [`Pool::allocate`] would on the pool with the same frees.
#[derive(Clone, Debug)]
pub struct Counts {
    rows: Vec<CountRow>,
}

#[derive(Clone, Copy, Debug)]
struct CountRow {
    rank: u32,
    cores: u32,
    gpus: u32,
    free_cores: u32,
    free_gpus: u32,
    alloc_cores: u32,
    alloc_gpus: u32,
    schedulable: bool,
}

impl Counts {
    /// Give back `alloc` (as [`Pool::free`] would).
    pub fn free<'a>(&mut self, alloc: impl IntoIterator<Item = &'a RankAlloc>) {
        for a in alloc {
            if let Ok(i) = self.rows.binary_search_by_key(&a.rank, |r| r.rank) {
                let r = &mut self.rows[i];
                let (c, g) = (a.cores.len() as u32, a.gpus.len() as u32);
                r.alloc_cores = r.alloc_cores.saturating_sub(c);
                r.alloc_gpus = r.alloc_gpus.saturating_sub(g);
                r.free_cores = r.free_cores.saturating_add(c).min(r.cores);
                r.free_gpus = r.free_gpus.saturating_add(g).min(r.gpus);
            }
        }
    }

    /// Whether [`Pool::allocate`] would place `req`.
    pub fn fits(&self, req: &JobRequest) -> bool {
        let (c, g) = (req.cores_per_slot, req.gpus_per_slot);
        let ranks = self.rows.iter().filter(|r| r.schedulable);
        match req.nnodes {
            Some(n) => {
                let open = ranks.filter(|r| !req.exclusive || (r.alloc_cores == 0 && r.alloc_gpus == 0));
                if req.slots_vary() {
                    return range_count(req, open.map(|r| Pool::fit(r.free_cores, r.free_gpus, c, g)).collect())
                        .is_some();
                }
                let per = req.slots_per_node.unwrap_or(1);
                let ok = open.filter(|r| Pool::fit(r.free_cores, r.free_gpus, c, g) >= per).count();
                ok as u64 >= u64::from(n)
            }
            None => {
                let have: u64 = ranks.map(|r| u64::from(Pool::fit(r.free_cores, r.free_gpus, c, g))).sum();
                have >= u64::from(req.nslots)
            }
        }
    }
}

/// The most nodes a node range with a task total ([`JobRequest::slots_vary`]) can take, given how many slots each
/// candidate node can hold (`caps`, in any order): the largest count `k` of its range for which `k` nodes hold
/// [`JobRequest::slots_on`]`(k)` slots each (Slurm takes as many nodes of `--nodes=min-max` as it can). `None`
/// if no count of the range can be placed.
fn range_count(req: &JobRequest, mut caps: Vec<u32>) -> Option<u32> {
    let min = req.nnodes?;
    let max = req.nnodes_max.unwrap_or(min).max(min);
    caps.sort_unstable_by(|a, b| b.cmp(a));
    let top = max.min(u32::try_from(caps.len()).unwrap_or(u32::MAX));
    // caps[k - 1] is the k-th largest: k nodes hold s slots each iff it holds s.
    (min..=top).rev().find(|&k| caps[k as usize - 1] >= req.slots_on(k))
}

/// Whether the job's constraints (RFC 31) let it run on rank `r`.
fn eligible(req: &JobRequest, r: &RankPool) -> bool {
    req.constraint.as_ref().is_none_or(|c| c.matches(r.rank, &r.hostname))
}

/// Resource pool of an instance, keyed by rank.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Pool {
    /// Per-rank resources (only ranks that joined at least once).
    pub ranks: BTreeMap<u32, RankPool>,
}

impl Pool {
    /// Add (or refresh, on re-join) a rank with its node's cores and GPUs; marks it up.
    pub fn add_rank(&mut self, rank: u32, hostname: &str, cores: IdSet, gpus: IdSet) {
        let e = self.ranks.entry(rank).or_insert_with(|| RankPool {
            rank,
            hostname: hostname.to_string(),
            cores: cores.clone(),
            gpus: gpus.clone(),
            alloc_cores: IdSet::new(),
            alloc_gpus: IdSet::new(),
            up: true,
            torpid: false,
            drained: None,
            drained_at: None,
            removed: false,
            nfree: (0, 0),
        });
        e.hostname = hostname.to_string();
        e.cores = cores;
        e.gpus = gpus;
        e.up = true;
        e.torpid = false;
        e.recount();
    }

    /// Slots of `c` cores and `g` GPUs that fit in `cores` free cores and `gpus` free GPUs.
    fn fit(cores: u32, gpus: u32, c: u32, g: u32) -> u32 {
        let by_c = cores.checked_div(c).unwrap_or(u32::MAX);
        let by_g = gpus.checked_div(g).unwrap_or(u32::MAX);
        by_c.min(by_g)
    }

    /// Check whether `req` could ever run here (every rank of the instance, free or not, up or not; not the
    /// ranks it lost for good).
    pub fn feasible(&self, req: &JobRequest) -> Result<(), Unsatisfiable> {
        self.feasible_on(req, |r| !r.removed)
    }

    /// Check whether `req` could run on the ranks schedulable now, once every job on them has ended: a job that
    /// cannot, in an instance whose lost or drained nodes may return, waits without holding back the queue.
    pub fn feasible_now(&self, req: &JobRequest) -> bool {
        self.feasible_on(req, RankPool::schedulable).is_ok()
    }

    /// [`Pool::feasible`] on the ranks `keep` accepts.
    fn feasible_on(&self, req: &JobRequest, keep: impl Fn(&RankPool) -> bool) -> Result<(), Unsatisfiable> {
        let c = req.cores_per_slot;
        let g = req.gpus_per_slot;
        let ranks = || self.ranks.values().filter(|r| keep(r) && eligible(req, r));
        if req.constraint.is_some() {
            let (want, have) = (req.nnodes.unwrap_or(1), ranks().count() as u32);
            if have < want {
                return Err(Unsatisfiable::Constrained { want, have });
            }
        }
        let (max_c, max_g) = ranks()
            .map(|r| (r.cores.len() as u32, r.gpus.len() as u32))
            .fold((0, 0), |a, b| (a.0.max(b.0), a.1.max(b.1)));
        match req.nnodes {
            Some(n) => {
                let have = ranks().count() as u32;
                if n > have {
                    return Err(Unsatisfiable::Nodes { want: n, have });
                }
                let cap = |r: &RankPool| Self::fit(r.cores.len() as u32, r.gpus.len() as u32, c, g);
                if req.slots_vary() {
                    if range_count(req, ranks().map(cap).collect()).is_none() {
                        return Err(Self::range_unsatisfiable(req, ranks().map(cap).collect()));
                    }
                    return Ok(());
                }
                let per = req.slots_per_node.unwrap_or(1);
                let fits = ranks().filter(|r| cap(r) >= per).count() as u32;
                if fits < n {
                    // Saturating: a jobspec may ask for 2^31 slots of 2 cores.
                    return Err(Unsatisfiable::NodeTooSmall {
                        want_cores: per.saturating_mul(c),
                        want_gpus: per.saturating_mul(g),
                        have_cores: max_c,
                        have_gpus: max_g,
                    });
                }
            }
            None => {
                if Self::fit(max_c, max_g, c, g) == 0 {
                    return Err(Unsatisfiable::NodeTooSmall {
                        want_cores: c,
                        want_gpus: g,
                        have_cores: max_c,
                        have_gpus: max_g,
                    });
                }
                let have: u64 =
                    ranks().map(|r| Self::fit(r.cores.len() as u32, r.gpus.len() as u32, c, g) as u64).sum();
                if (req.nslots as u64) > have {
                    return Err(Unsatisfiable::Slots {
                        want: req.nslots,
                        cores: c,
                        gpus: g,
                        have: have.min(u32::MAX as u64) as u32,
                    });
                }
            }
        }
        Ok(())
    }

    /// Why a node range with a task total fits no count of its range, given the slots each node could hold
    /// (`caps`): what its largest possible count and its minimum would need ([`Unsatisfiable::NodeRange`]).
    fn range_unsatisfiable(req: &JobRequest, caps: Vec<u32>) -> Unsatisfiable {
        let (c, g) = (req.cores_per_slot, req.gpus_per_slot);
        let min = req.nnodes.unwrap_or(1);
        let max = req.nnodes_max.unwrap_or(min).max(min);
        let top = max.min(caps.len() as u32).max(min);
        let counts = if top == min { vec![min] } else { vec![top, min] };
        let why: Vec<String> = counts
            .into_iter()
            .map(|k| {
                let per = req.slots_on(k);
                let (pc, pg) = (per.saturating_mul(c), per.saturating_mul(g));
                let amount = if pg == 0 { format!("{pc} cores") } else { format!("{pc} cores and {pg} GPUs") };
                let have = match caps.iter().filter(|&&cap| cap >= per).count() {
                    0 => "none has that".to_string(),
                    1 => "1 node has that".to_string(),
                    h => format!("{h} nodes have that"),
                };
                format!("{k} nodes would need {amount} each ({have})")
            })
            .collect();
        Unsatisfiable::NodeRange { min, max, ntasks: req.ntasks, why: why.join("; ") }
    }

    /// Try to allocate `req` now from schedulable ranks. `None` if it does not fit at the moment.
    /// On success the resources are marked allocated. A node range takes as many nodes as fit now up to its
    /// maximum; with a task total, the largest count whose share of the tasks fits on that many nodes
    /// ([`JobRequest::slots_on`]).
    pub fn allocate(&mut self, req: &JobRequest) -> Option<Vec<RankAlloc>> {
        let c = req.cores_per_slot;
        let g = req.gpus_per_slot;
        let mut plan: Vec<RankAlloc> = Vec::new();
        match req.nnodes {
            Some(n) => {
                let (per, most) = if req.slots_vary() {
                    let open = self.ranks.values().filter(|r| {
                        r.schedulable()
                            && eligible(req, r)
                            && (!req.exclusive || (r.alloc_cores.is_empty() && r.alloc_gpus.is_empty()))
                    });
                    let k = range_count(req, open.map(|r| Self::fit(r.nfree().0, r.nfree().1, c, g)).collect())?;
                    (req.slots_on(k), k)
                } else {
                    // A node range takes as many as fit now up to its maximum.
                    (req.slots_per_node.unwrap_or(1), req.nnodes_max.unwrap_or(n).max(n))
                };
                for r in self.ranks.values().filter(|r| r.schedulable() && eligible(req, r)) {
                    if plan.len() as u32 == most {
                        break;
                    }
                    if req.exclusive && (!r.alloc_cores.is_empty() || !r.alloc_gpus.is_empty()) {
                        continue;
                    }
                    let (nc, ng) = r.nfree();
                    if Self::fit(nc, ng, c, g) >= per {
                        let (fc, fg) = (r.free_cores(), r.free_gpus());
                        let (cores, gpus) = if req.exclusive {
                            (r.cores.clone(), r.gpus.clone())
                        } else {
                            (
                                fc.iter().take(per.saturating_mul(c) as usize).collect(),
                                fg.iter().take(per.saturating_mul(g) as usize).collect(),
                            )
                        };
                        plan.push(RankAlloc { rank: r.rank, cores, gpus, slots: per });
                    }
                }
                if (plan.len() as u32) < n {
                    return None;
                }
            }
            None => {
                let mut left = req.nslots;
                for r in self.ranks.values().filter(|r| r.schedulable() && eligible(req, r)) {
                    if left == 0 {
                        break;
                    }
                    let (nc, ng) = r.nfree();
                    let k = Self::fit(nc, ng, c, g).min(left);
                    if k > 0 {
                        let (fc, fg) = (r.free_cores(), r.free_gpus());
                        plan.push(RankAlloc {
                            rank: r.rank,
                            cores: fc.iter().take(k.saturating_mul(c) as usize).collect(),
                            gpus: fg.iter().take(k.saturating_mul(g) as usize).collect(),
                            slots: k,
                        });
                        left -= k;
                    }
                }
                if left > 0 {
                    return None;
                }
            }
        }
        self.take(&plan);
        Some(plan)
    }

    /// Why `req`, which [`Pool::allocate`] cannot place now, is waiting: what it needs, what the schedulable ranks
    /// can give at the moment, and the ranks out of scheduling (the REASON of Slurm's `squeue`, Flux's
    /// `reason_pending`). Shape: `resources: needs 4 nodes with 2 cores free, 2 can take it now (1 busy, 1 torpid, 1 down)` or
    /// `resources: needs 8 slots of 2 cores, 3 free now (1 drained)`; `gone` counts ranks lost for good (shrink).
    /// Only the ranks the job may run on are counted (its constraints: `--requires`, `-w`, `--exclude`, a
    /// hostfile's hosts), not the whole instance; the others are said as `N outside its node selection`, so that a
    /// job waiting because of its own `-x` or `-w` says so.
    pub fn pending_reason(&self, req: &JobRequest) -> String {
        let (c, g) = (req.cores_per_slot, req.gpus_per_slot);
        let (mut down, mut torpid, mut drained, mut gone) = (0u32, 0u32, 0u32, 0u32);
        let outside = self.ranks.values().filter(|r| !r.removed && !eligible(req, r)).count() as u32;
        for r in self.ranks.values().filter(|r| eligible(req, r)) {
            if r.removed {
                gone += 1;
            } else if !r.up {
                down += 1;
            } else if r.drained.is_some() {
                drained += 1;
            } else if r.torpid {
                torpid += 1;
            }
        }
        let amount = |c: u32, g: u32| match (c, g) {
            (c, 0) => format!("{c} core{}", if c == 1 { "" } else { "s" }),
            (c, g) => format!("{c} core{} and {g} GPU{}", if c == 1 { "" } else { "s" }, if g == 1 { "" } else { "s" }),
        };
        let out = |busy: Option<u32>| {
            let parts: Vec<String> = [
                (busy.unwrap_or(0), "busy"),
                (torpid, "torpid"),
                (down, "down"),
                (drained, "drained"),
                (gone, "gone"),
                (outside, "outside its node selection"),
            ]
            .iter()
            .filter(|(k, _)| *k > 0)
            .map(|(k, what)| format!("{k} {what}"))
            .collect();
            if parts.is_empty() {
                String::new()
            } else {
                format!(" ({})", parts.join(", "))
            }
        };
        match req.nnodes {
            Some(n) => {
                // A node range with a task total: counted for its most nodes, the smallest share each.
                let max = req.nnodes_max.unwrap_or(n).max(n);
                let per = req.slots_on(max);
                let (mut now, mut busy) = (0u32, 0u32);
                for r in self.ranks.values().filter(|r| r.schedulable() && eligible(req, r)) {
                    let (nc, ng) = r.nfree();
                    let idle = r.alloc_cores.is_empty() && r.alloc_gpus.is_empty();
                    if Self::fit(nc, ng, c, g) >= per && (idle || !req.exclusive) {
                        now += 1;
                    } else {
                        busy += 1;
                    }
                }
                let (pc, pg) = (per.saturating_mul(c), per.saturating_mul(g));
                let nodes = if n == 1 { "node" } else { "nodes" };
                if req.slots_vary() && max > n {
                    let (fc, fg) = (req.slots_on(n).saturating_mul(c), req.slots_on(n).saturating_mul(g));
                    let whole = if req.exclusive { "whole nodes, " } else { "" };
                    return format!(
                        "resources: needs {n}-{max} {whole}nodes for {} tasks: {max} with {} free each, or {n} with \
                         {} free each; {now} can take {} now{}",
                        req.ntasks,
                        amount(pc, pg),
                        amount(fc, fg),
                        amount(pc, pg),
                        out(Some(busy))
                    );
                }
                let n = match req.nnodes_max {
                    Some(max) if max > n => format!("{n} (up to {max})"),
                    _ => n.to_string(),
                };
                let what = if req.exclusive {
                    format!("whole {nodes} with at least {}", amount(pc, pg))
                } else {
                    format!("{nodes} with {} free", amount(pc, pg))
                };
                format!("resources: needs {n} {what}, {now} can take it now{}", out(Some(busy)))
            }
            None => {
                let free: u64 = self
                    .ranks
                    .values()
                    .filter(|r| r.schedulable() && eligible(req, r))
                    .map(|r| {
                        let (nc, ng) = r.nfree();
                        Self::fit(nc, ng, c, g) as u64
                    })
                    .sum();
                format!(
                    "resources: needs {} slot{} of {}, {free} free now{}",
                    req.nslots,
                    if req.nslots == 1 { "" } else { "s" },
                    amount(c, g),
                    out(None)
                )
            }
        }
    }

    /// Mark `alloc` allocated (a plan [`Pool::allocate`] made on another pool whose free resources are a subset of
    /// this one's, as `backfill.rs` does with the pool that hides the reservation).
    pub fn take(&mut self, alloc: &[RankAlloc]) {
        for a in alloc {
            if let Some(r) = self.ranks.get_mut(&a.rank) {
                r.alloc_cores = r.alloc_cores.union(&a.cores);
                r.alloc_gpus = r.alloc_gpus.union(&a.gpus);
                r.recount();
            }
        }
    }

    /// The pool's [`Counts`] for `req`: the ranks its constraints exclude count as not schedulable.
    pub fn counts(&self, req: &JobRequest) -> Counts {
        let rows = self
            .ranks
            .values()
            .map(|r| {
                let (free_cores, free_gpus) = r.nfree();
                CountRow {
                    rank: r.rank,
                    cores: r.cores.len() as u32,
                    gpus: r.gpus.len() as u32,
                    free_cores,
                    free_gpus,
                    alloc_cores: r.alloc_cores.len() as u32,
                    alloc_gpus: r.alloc_gpus.len() as u32,
                    schedulable: r.schedulable() && eligible(req, r),
                }
            })
            .collect();
        Counts { rows }
    }

    /// Free cores on the schedulable ranks (a bound: no request for more cores fits now).
    pub fn free_cores_now(&self) -> u64 {
        self.ranks.values().filter(|r| r.schedulable()).map(|r| u64::from(r.nfree().0)).sum()
    }

    /// Return an allocation's resources on `ranks` (all of it when `ranks` is `None`).
    pub fn free(&mut self, alloc: &[RankAlloc], ranks: Option<&IdSet>) {
        for a in alloc {
            if ranks.is_some_and(|s| !s.contains(a.rank)) {
                continue;
            }
            if let Some(r) = self.ranks.get_mut(&a.rank) {
                r.alloc_cores = r.alloc_cores.difference(&a.cores);
                r.alloc_gpus = r.alloc_gpus.difference(&a.gpus);
                r.recount();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn req(nnodes: Option<u32>, nslots: u32, c: u32, g: u32) -> JobRequest {
        let mut b = crate::jobspec::JobspecBuilder::new(vec!["true".to_string()])
            .ntasks(nslots)
            .cores_per_task(c)
            .gpus_per_task(g);
        if let Some(n) = nnodes {
            b = b.nnodes(n);
        }
        b.build().unwrap().validate().unwrap()
    }

    fn pool(n: u32, cores: u32, gpus: u32) -> Pool {
        let mut p = Pool::default();
        for r in 0..n {
            p.add_rank(r, &format!("node{r}"), (0..cores).collect(), (0..gpus).collect());
        }
        p
    }

    /// `--exclude`, `--nodelist`, `--requires`: only the nodes the constraint accepts are counted, placed on and
    /// said in the pending reason; a request more of them cannot satisfy is refused saying so.
    #[test]
    fn constraints_choose_the_nodes() {
        use crate::constraint::Constraint;
        let mut p = pool(4, 2, 0);
        let with = |r: JobRequest, c: Option<Constraint>| JobRequest { constraint: c, ..r };
        let not1 = Constraint::from_options(&[], None, Some("node1")).unwrap();
        let a = p.allocate(&with(req(Some(2), 2, 1, 0), not1.clone())).unwrap();
        assert_eq!(a.iter().map(|x| x.rank).collect::<Vec<_>>(), vec![0, 2], "node1 excluded");
        assert_eq!(
            p.feasible(&with(req(Some(4), 4, 1, 0), not1.clone())),
            Err(Unsatisfiable::Constrained { want: 4, have: 3 })
        );
        let only3 = Constraint::from_options(&[], Some("node3"), None).unwrap();
        let b = p.allocate(&with(req(None, 2, 1, 0), only3.clone())).unwrap();
        assert_eq!(b.iter().map(|x| (x.rank, x.slots)).collect::<Vec<_>>(), vec![(3, 2)]);
        // node3 is full now: the job waits, counting node3 alone, though node1 is idle.
        let wait = with(req(Some(1), 1, 1, 0), only3);
        assert!(p.allocate(&wait).is_none() && !p.counts(&wait).fits(&wait));
        assert!(p.counts(&req(Some(1), 1, 1, 0)).fits(&req(Some(1), 1, 1, 0)), "unconstrained, node1 fits");
        assert_eq!(
            p.pending_reason(&wait),
            "resources: needs 1 node with 1 core free, 0 can take it now (1 busy, 3 outside its node selection)"
        );
        let none = Constraint::from_options(&["host:login1".into()], None, None).unwrap();
        assert_eq!(p.feasible(&with(req(None, 1, 1, 0), none)), Err(Unsatisfiable::Constrained { want: 1, have: 0 }));
    }

    /// `-N MIN-MAX`: as many nodes as fit now, up to MAX; placed once MIN fit; waiting (and said so) below MIN.
    #[test]
    fn node_range_takes_up_to_max() {
        let range = |min: u32, max: u32| {
            let b = crate::jobspec::JobspecBuilder::new(vec!["true".to_string()]).nnodes_range(min, max);
            b.build().unwrap().validate().unwrap()
        };
        let mut p = pool(4, 1, 0);
        let a = p.allocate(&range(2, 3)).unwrap();
        assert_eq!(a.iter().map(|x| x.rank).collect::<Vec<_>>(), vec![0, 1, 2], "all three it may take");
        p.ranks.get_mut(&3).unwrap().drained = Some("maint".into());
        let r = range(1, 4);
        assert!(p.allocate(&r).is_none() && !p.counts(&r).fits(&r), "no node free");
        assert_eq!(
            p.pending_reason(&r),
            "resources: needs 1 (up to 4) node with 1 core free, 0 can take it now (3 busy, 1 drained)"
        );
        p.free(&a, Some(&IdSet::from_iter([1])));
        let b = p.allocate(&r).unwrap();
        assert_eq!(b.iter().map(|x| x.rank).collect::<Vec<_>>(), vec![1], "MIN is enough to start");
        assert_eq!(p.feasible(&range(5, 6)), Err(Unsatisfiable::Nodes { want: 5, have: 4 }));
        assert!(p.feasible(&range(4, 9)).is_ok(), "MAX beyond the instance is fine");
    }

    #[test]
    fn node_request_first_fit() {
        let mut p = pool(4, 2, 0);
        let a = p.allocate(&req(Some(4), 8, 1, 0)).unwrap();
        assert_eq!(a.iter().map(|x| x.rank).collect::<Vec<_>>(), vec![0, 1, 2, 3]);
        assert!(a.iter().all(|x| x.cores.len() == 2 && x.slots == 2));
        assert!(p.allocate(&req(None, 1, 1, 0)).is_none(), "pool is full");
        p.free(&a, None);
        assert!(p.allocate(&req(None, 1, 1, 0)).is_some());
    }

    #[test]
    fn drained_and_down_ranks_are_skipped() {
        let mut p = pool(3, 2, 0);
        p.ranks.get_mut(&0).unwrap().drained = Some("maint".into());
        p.ranks.get_mut(&1).unwrap().up = false;
        let a = p.allocate(&req(Some(1), 1, 1, 0)).unwrap();
        assert_eq!(a[0].rank, 2);
        assert!(p.allocate(&req(Some(2), 2, 1, 0)).is_none());
        assert!(p.feasible(&req(Some(3), 3, 1, 0)).is_ok(), "drained/down ranks still count for feasibility");
    }

    #[test]
    fn infeasible_requests_name_what_is_missing() {
        let p = pool(4, 2, 0);
        assert_eq!(p.feasible(&req(Some(5), 5, 1, 0)), Err(Unsatisfiable::Nodes { want: 5, have: 4 }));
        assert!(matches!(p.feasible(&req(None, 1, 3, 0)), Err(Unsatisfiable::NodeTooSmall { .. })));
        assert!(matches!(p.feasible(&req(None, 1, 1, 1)), Err(Unsatisfiable::NodeTooSmall { have_gpus: 0, .. })));
        assert!(matches!(p.feasible(&req(None, 9, 1, 0)), Err(Unsatisfiable::Slots { want: 9, have: 8, .. })));
        let e = p.feasible(&req(Some(5), 5, 1, 0)).unwrap_err().to_string();
        assert!(e.contains("5 nodes") && e.contains("has 4"), "{e}");
    }

    #[test]
    fn pending_reason_says_what_is_missing_and_why() {
        let mut p = pool(4, 4, 0);
        let a = p.allocate(&req(Some(1), 1, 4, 0)).unwrap(); // rank 0 full
        assert_eq!(a[0].rank, 0);
        p.ranks.get_mut(&1).unwrap().torpid = true;
        p.ranks.get_mut(&2).unwrap().up = false;
        let r = req(Some(2), 2, 1, 0);
        assert!(p.allocate(&r).is_none());
        assert_eq!(
            p.pending_reason(&r),
            "resources: needs 2 nodes with 1 core free, 1 can take it now (1 busy, 1 torpid, 1 down)"
        );
        let r = req(None, 6, 2, 0);
        assert!(p.allocate(&r).is_none());
        assert_eq!(p.pending_reason(&r), "resources: needs 6 slots of 2 cores, 2 free now (1 torpid, 1 down)");
        p.ranks.get_mut(&3).unwrap().drained = Some("maint".into());
        assert_eq!(
            p.pending_reason(&r),
            "resources: needs 6 slots of 2 cores, 0 free now (1 torpid, 1 down, 1 drained)"
        );
    }

    #[test]
    fn gpus_are_allocated_per_slot() {
        let mut p = pool(2, 96, 4);
        let a = p.allocate(&req(None, 6, 8, 1)).unwrap();
        assert_eq!(a.len(), 2);
        assert_eq!(a[0].gpus.len(), 4);
        assert_eq!(a[1].gpus.len(), 2);
        assert_eq!(a[1].cores.len(), 16);
    }

    proptest! {
        /// `Counts::fits` answers as `Pool::allocate` does, after any allocations and frees (backfill.rs plans on
        /// counts and relies on it).
        #[test]
        fn counts_fit_as_allocate_places(
            jobs in proptest::collection::vec((proptest::option::of(1u32..4), 1u32..6, 1u32..3, 0u32..2, any::<bool>()), 1..20),
            probe in (proptest::option::of(1u32..5), 1u32..9, 1u32..3, 0u32..2, any::<bool>()),
        ) {
            let mut p = pool(4, 4, 2);
            p.ranks.get_mut(&3).unwrap().torpid = true;
            let mut live = Vec::new();
            let mk = |(n, s, c, g, x): (Option<u32>, u32, u32, u32, bool)| {
                let mut r = req(n, n.map_or(s, |n| s.max(n)), c, g);
                r.exclusive = x && n.is_some();
                r
            };
            for (i, j) in jobs.into_iter().enumerate() {
                if let Some(a) = p.allocate(&mk(j)) {
                    live.push(a);
                }
                if i % 3 == 2 {
                    if let Some(a) = live.pop() { p.free(&a, None); }
                }
            }
            let probe = mk(probe);
            prop_assert_eq!(p.counts(&probe).fits(&probe), p.clone().allocate(&probe).is_some());
            // And after freeing one more job, on counts and on the pool alike.
            if let Some(a) = live.pop() {
                let mut counts = p.counts(&probe);
                counts.free(&a);
                p.free(&a, None);
                prop_assert_eq!(counts.fits(&probe), p.clone().allocate(&probe).is_some());
            }
        }

        #[test]
        fn never_overallocates(jobs in proptest::collection::vec((proptest::option::of(1u32..4), 1u32..6, 1u32..3, 0u32..2), 1..20)) {
            let mut p = pool(4, 4, 2);
            let mut live = Vec::new();
            for (i, (n, s, c, g)) in jobs.into_iter().enumerate() {
                let s = n.map_or(s, |n| s.max(n));
                let r = req(n, s, c, g);
                if let Some(a) = p.allocate(&r) {
                    let slots: u32 = a.iter().map(|x| x.slots).sum();
                    prop_assert!(slots >= r.nslots.min(slots));
                    for x in &a {
                        prop_assert!(x.cores.len() as u32 >= x.slots * c);
                    }
                    live.push(a);
                }
                for rp in p.ranks.values() {
                    prop_assert!(rp.alloc_cores.is_subset(&rp.cores));
                    prop_assert!(rp.alloc_gpus.is_subset(&rp.gpus));
                }
                let total: usize = live.iter().flatten().map(|x| x.cores.len()).sum();
                let alloc: usize = p.ranks.values().map(|r| r.alloc_cores.len()).sum();
                prop_assert_eq!(total, alloc, "allocations never overlap");
                if i % 3 == 2 { if let Some(a) = live.pop() { p.free(&a, None); } }
            }
        }
    }
}
