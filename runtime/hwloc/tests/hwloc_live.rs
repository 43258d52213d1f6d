//! Tests against the live machine: loading and placing on it (binding is the shell's, tested there).

use std::collections::BTreeSet;
use vigil_hwloc::*;

#[test]
fn live_topology_loads() {
    let t = NodeTopology::load(&TopologySource::Live).expect("live topology");
    assert!(t.is_live());
    let r = t.resources(None);
    assert!(r.cores >= 1, "{r:?}");
    assert!(r.pus >= r.cores, "{r:?}");
    assert!(r.numa >= 1, "{r:?}");
    assert_eq!(r.source, "live");
    assert_eq!(r.gpus as usize, r.gpu_names.len());
    assert_eq!(t.resources(Some(3)).gpus, 3);

    // Binding everything gives a superset of what this thread may run on.
    let all: Vec<u32> = (0..r.cores).collect();
    let p = t
        .place(&PlacementRequest {
            cores: all.clone(),
            gpus: vec![],
            ntasks: 1,
            cores_per_task: r.cores,
            gpus_per_task: 0,
            cpu_affinity: CpuAffinity::PerTask,
            gpu_affinity: GpuAffinity::Off,
        })
        .unwrap();
    assert_eq!(p[0].cores, all);
    let cpus: BTreeSet<u32> = p[0].cpus.clone().unwrap().into_iter().collect();
    assert_eq!(cpus.len() as u32, r.pus);
    for c in allowed_cpus() {
        assert!(cpus.contains(&c), "allowed cpu {c} not in topology {cpus:?}");
    }
}

/// The CPUs this thread may run on (`sched_getaffinity`), as OS PU indices.
fn allowed_cpus() -> Vec<u32> {
    // SAFETY: cpu_set_t is a plain array of integers; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to a cpu_set_t of the size passed.
    let rc = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    assert_eq!(rc, 0, "sched_getaffinity: {}", std::io::Error::last_os_error());
    // SAFETY: every index is < CPU_SETSIZE, in bounds of the set.
    (0..libc::CPU_SETSIZE as u32).filter(|&c| unsafe { libc::CPU_ISSET(c as usize, &set) }).collect()
}
