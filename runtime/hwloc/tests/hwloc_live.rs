//! Tests against the live machine: loading, binding round trips.

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
    for c in current_affinity().unwrap() {
        assert!(cpus.contains(&c), "allowed cpu {c} not in topology {cpus:?}");
    }
}

/// A CPU this process may use: 0 if allowed, otherwise the first allowed.
fn target_cpu() -> u32 {
    let aff = current_affinity().unwrap();
    assert!(!aff.is_empty());
    if aff.contains(&0) {
        0
    } else {
        aff[0]
    }
}

#[test]
fn bind_roundtrip_in_thread() {
    let cpu = target_cpu();
    let before_main = current_affinity().unwrap();
    std::thread::spawn(move || {
        let before = current_affinity().unwrap();
        bind_current_process(&[cpu]).unwrap();
        assert_eq!(current_affinity().unwrap(), vec![cpu]);
        // restore
        bind_current_process(&before).unwrap();
        assert_eq!(current_affinity().unwrap(), before);
    })
    .join()
    .unwrap();
    // other threads were never affected
    assert_eq!(current_affinity().unwrap(), before_main);
}

#[test]
fn bind_rejects_bad_cpus() {
    std::thread::spawn(|| {
        let before = current_affinity().unwrap();
        assert!(bind_current_process(&[]).is_err());
        assert!(bind_current_process(&[100_000]).is_err());
        if !before.contains(&1023) {
            let e = bind_current_process(&[1023]).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
        }
        assert_eq!(current_affinity().unwrap(), before, "failed binds must not change affinity");
    })
    .join()
    .unwrap();
}

/// Build the mask before fork, apply it in the child with only
/// async-signal-safe calls, report via exit status.
#[test]
fn cpumask_apply_in_forked_child() {
    let cpu = target_cpu();
    let mask = CpuMask::new(&[cpu]).unwrap();
    let before = current_affinity().unwrap();
    // SAFETY: the child only performs async-signal-safe operations
    // (sched_setaffinity, sched_getaffinity, _exit).
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let code = if mask.apply().is_err() {
            2
        } else {
            // SAFETY: zeroed cpu_set_t is valid; syscalls on our own stack data.
            unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
                    3
                } else if libc::CPU_COUNT(&set) == 1 && libc::CPU_ISSET(cpu as usize, &set) {
                    0
                } else {
                    4
                }
            }
        };
        // SAFETY: terminate the child without running destructors/atexit.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    let rc = unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(rc, pid);
    assert!(libc::WIFEXITED(status), "child did not exit normally");
    assert_eq!(libc::WEXITSTATUS(status), 0, "child binding check failed");
    assert_eq!(current_affinity().unwrap(), before, "parent affinity changed");
}

/// The intended production use: `pre_exec(move || mask.apply())`.
#[test]
fn cpumask_in_pre_exec() {
    use std::os::unix::process::CommandExt;
    let cpu = target_cpu();
    let mask = CpuMask::new(&[cpu]).unwrap();
    let mut cmd = std::process::Command::new("cat");
    cmd.arg("/proc/self/status");
    // SAFETY: CpuMask::apply is async-signal-safe.
    unsafe {
        cmd.pre_exec(move || mask.apply());
    }
    let out = cmd.output().expect("run cat");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .expect("Cpus_allowed_list in /proc/self/status");
    assert_eq!(parse_cpulist(line.trim()).unwrap(), vec![cpu]);
    assert_eq!(format_cpulist(&[cpu]), line.trim());
}
