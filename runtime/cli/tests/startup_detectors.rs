//! Start-up and exit of a broker do not wait for the eBPF detectors: loading them runs beside the broker, and
//! neither a broker that ends before they are loaded nor one that ends after waits for the load or for the
//! kernel to detach them. Every time compared is measured in the same test (the load's own duration), never
//! against an absolute figure. Own binary: the timings must not share the machine with other instances' tests.

mod common;

use common::*;
use std::time::{Duration, Instant};

#[test]
fn brokers_neither_start_nor_exit_at_the_pace_of_the_ebpf_load() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: eBPF detectors need root");
        return;
    }
    // An instance whose initial program waits until rank 0 reports its eBPF process-exit detector, and marks the
    // moment: spawn → marker is the load, marker → `vigil start` exit is the exit of a broker that loaded them.
    let dir = tempdir();
    let mark = dir.path().join("loaded");
    let script = format!(
        "for i in $(seq 1000); do vigil uptime | grep -q 'process-exit ebpf' && break; sleep 0.01; done; \
         vigil uptime | grep -q 'process-exit ebpf' || exit 3; date +%s%N > {}",
        mark.display()
    );
    let mut c = vigil_cmd(dir.path());
    c.args(["start", "--test-size=1", "sh", "-c", &script]);
    let spawned = std::time::SystemTime::now();
    let out = run(c, Duration::from_secs(60), Some(dir.path()));
    let ended = std::time::SystemTime::now();
    kill_marked(dir.path());
    if out.code == 3 {
        eprintln!("skipped: the eBPF detectors did not load here: {}", out.dump());
        return;
    }
    out.ok();
    let ns = |t: std::time::SystemTime| t.duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    let marked: u64 = std::fs::read_to_string(&mark).expect("marker").trim().parse().expect("ns");
    let load = Duration::from_nanos(marked - ns(spawned));
    let exit_after_load = Duration::from_nanos(ns(ended).saturating_sub(marked));

    // An instance whose initial program exits at once, before the detectors can have loaded.
    let t0 = Instant::now();
    let (out, _d) = start_and_run(1, &[], &["true"], Duration::from_secs(60));
    let short = t0.elapsed();
    out.ok();

    eprintln!("load {load:?}; exit after the load {exit_after_load:?}; whole `true` instance {short:?}");
    assert!(
        exit_after_load * 2 < load,
        "a broker with its detectors loaded took {exit_after_load:?} to exit, against {load:?} to load them: its \
         exit waited (for the detach, or a thread)"
    );
    assert!(
        short < load,
        "`vigil start --test-size=1 true` took {short:?}, longer than loading the detectors ({load:?}): the exit \
         waited for the load"
    );
}
