//! Property tests: placement never panics and keeps its invariants.

use proptest::prelude::*;
use std::collections::BTreeSet;
use vigil_hwloc::*;

const SMALL: &str = "pack:2 numa:2 core:4 pu:1"; // 16 cores, 4 NUMA (core/4)
const ELCAP: &str = "pack:4 numa:1 core:24 pu:2"; // 96 cores, core k -> PUs 2k,2k+1

fn load(desc: &str) -> NodeTopology {
    NodeTopology::load(&TopologySource::Synthetic(desc.into())).unwrap()
}

fn cpu_mode() -> impl Strategy<Value = CpuAffinity> {
    prop_oneof![Just(CpuAffinity::Off), Just(CpuAffinity::On), Just(CpuAffinity::PerTask)]
}
fn gpu_mode() -> impl Strategy<Value = GpuAffinity> {
    prop_oneof![Just(GpuAffinity::Off), Just(GpuAffinity::On), Just(GpuAffinity::PerTask)]
}

fn request(max_core: u32, max_cores: usize, max_tasks: u32) -> impl Strategy<Value = PlacementRequest> {
    (
        prop::collection::vec(0..max_core, 0..max_cores),
        prop::collection::vec(0u32..8, 0..6),
        0..max_tasks,
        0u32..6,
        0u32..4,
        cpu_mode(),
        gpu_mode(),
    )
        .prop_map(|(cores, gpus, ntasks, cpt, gpt, ca, ga)| PlacementRequest {
            cores,
            gpus,
            ntasks,
            cores_per_task: cpt,
            gpus_per_task: gpt,
            cpu_affinity: ca,
            gpu_affinity: ga,
        })
}

/// Check the result of `place` against the documented contract.
fn check(
    req: &PlacementRequest,
    ncores: u32,
    pus_of: impl Fn(u32) -> Vec<u32>,
    numa_of: impl Fn(u32) -> u32,
    res: Result<Vec<TaskPlacement>, TopoError>,
) -> Result<(), TestCaseError> {
    // Predict errors.
    if let Some(&bad) = req.cores.iter().find(|&&c| c >= ncores) {
        prop_assert_eq!(res, Err(TopoError::UnknownCore { index: bad, available: ncores }));
        return Ok(());
    }
    let alloc: BTreeSet<u32> = req.cores.iter().copied().collect();
    if alloc.len() != req.cores.len() {
        prop_assert!(matches!(res, Err(TopoError::DuplicateCore(_))), "{:?}", res);
        return Ok(());
    }
    if req.ntasks == 0 {
        prop_assert_eq!(res, Ok(vec![]));
        return Ok(());
    }
    if alloc.is_empty() && req.cpu_affinity != CpuAffinity::Off {
        prop_assert_eq!(res, Err(TopoError::NoCores { ntasks: req.ntasks }));
        return Ok(());
    }
    let p = res.map_err(|e| TestCaseError::fail(format!("unexpected error {e}")))?;
    prop_assert_eq!(p.len(), req.ntasks as usize);
    let alloc_v: Vec<u32> = alloc.iter().copied().collect();
    let c = req.cores_per_task.max(1) as usize;
    let m = alloc.len();
    let n = req.ntasks as usize;
    let mut owners = BTreeSet::new();
    for tp in &p {
        let cores: BTreeSet<u32> = tp.cores.iter().copied().collect();
        prop_assert!(cores.is_subset(&alloc));
        prop_assert_eq!(cores.len(), tp.cores.len());
        let want_numa: BTreeSet<u32> = tp.cores.iter().map(|&c| numa_of(c)).collect();
        prop_assert_eq!(tp.numa.iter().copied().collect::<BTreeSet<_>>(), want_numa);
        let want_cpus: Vec<u32> = {
            let mut v: Vec<u32> = tp.cores.iter().flat_map(|&c| pus_of(c)).collect();
            v.sort_unstable();
            v
        };
        match req.cpu_affinity {
            CpuAffinity::Off => {
                prop_assert_eq!(&tp.cpus, &None);
                prop_assert_eq!(&tp.cores, &alloc_v);
            }
            CpuAffinity::On => {
                prop_assert_eq!(&tp.cores, &alloc_v);
                prop_assert_eq!(tp.cpus.clone(), Some(want_cpus));
            }
            CpuAffinity::PerTask => {
                prop_assert!(!tp.cores.is_empty());
                prop_assert_eq!(tp.cpus.clone(), Some(want_cpus));
                if m >= n * c {
                    prop_assert!(tp.cores.len() >= c);
                    if m == n * c {
                        prop_assert_eq!(tp.cores.len(), c);
                    }
                    for core in &tp.cores {
                        prop_assert!(owners.insert(*core), "core {} shared", core);
                    }
                } else {
                    prop_assert_eq!(tp.cores.len(), c.min(m));
                }
            }
        }
        match req.gpu_affinity {
            GpuAffinity::Off => prop_assert_eq!(&tp.gpus, &None),
            GpuAffinity::On => prop_assert_eq!(&tp.gpus, &Some(req.gpus.clone())),
            GpuAffinity::PerTask => {
                let g = tp.gpus.as_ref().unwrap();
                if req.gpus_per_task > 0 {
                    prop_assert!(g.len() <= req.gpus_per_task as usize);
                }
            }
        }
    }
    if req.cpu_affinity == CpuAffinity::PerTask && m >= n * c {
        prop_assert_eq!(owners, alloc, "per-task shares must cover the allocation");
        // rank order gets ascending cores
        for w in p.windows(2) {
            prop_assert!(w[0].cores.last() < w[1].cores.first());
        }
    }
    if req.gpu_affinity == GpuAffinity::PerTask {
        let all: Vec<u32> = p.iter().flat_map(|t| t.gpus.clone().unwrap()).collect();
        let expect_len =
            if req.gpus_per_task == 0 { req.gpus.len() } else { req.gpus.len().min(n * req.gpus_per_task as usize) };
        prop_assert_eq!(&all[..], &req.gpus[..expect_len]);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn place_small_never_panics(req in request(20, 14, 20)) {
        let t = load(SMALL);
        let res = t.place(&req);
        check(&req, 16, |c| vec![c], |c| c / 4, res)?;
    }

    #[test]
    fn place_elcap_invariants(req in request(100, 100, 40)) {
        let t = load(ELCAP);
        let res = t.place(&req);
        check(&req, 96, |c| vec![2 * c, 2 * c + 1], |c| c / 24, res)?;
    }

    #[test]
    fn synthetic_load_never_panics(desc in "((pack|core|pu|numa|l3|l2|group|bogus):[0-9] ?){0,4}|[ -~]{0,12}") {
        if let Ok(t) = NodeTopology::load(&TopologySource::Synthetic(desc)) {
            let r = t.resources(None);
            prop_assert!(r.pus >= 1);
            let _ = t.place(&PlacementRequest { cores: (0..r.cores.min(8)).collect(), ntasks: 3, ..Default::default() });
        }
    }

    #[test]
    fn source_parse_never_panics(s in ".{0,10}") {
        let _ = s.parse::<TopologySource>();
    }
}
