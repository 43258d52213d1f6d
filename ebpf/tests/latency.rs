//! kill -9 -> detection latency for a child with 1 GiB resident, compared
//! with the time at which a blocked waitpid() returns. Printed, not asserted
//! (run with `--nocapture`). Run as root.

mod common;

use std::time::Duration;

use common::*;
use vigil_ebpf::{DetectorMode, EventSource, monotonic_ns};

const MIB: &str = "1024";
const RUNS: usize = 3;

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

async fn measure(mode: DetectorMode) {
    for run in 0..RUNS {
        let mut det = detector(mode);
        let mut child = spawn_gated(&["hog", MIB]);
        go(&mut child);
        wait_ready(&mut child);
        let pid = child.id();
        det.watch(pid).unwrap();

        // A thread blocked in waitpid() for the same child.
        let waiter = std::thread::spawn(move || {
            let st = child.wait().unwrap();
            (monotonic_ns(), st)
        });
        std::thread::sleep(Duration::from_millis(100)); // let it block

        let t_kill = monotonic_ns();
        kill(pid, libc::SIGKILL);
        let ev = next_within(&mut det, TIMEOUT).await.expect("exit event");
        let t_recv = monotonic_ns();
        let (t_wait, st) = waiter.join().unwrap();
        assert_eq!(ev.pid, pid);
        let stamp = if ev.source == EventSource::Ebpf {
            format!("kill->bpf tracepoint {:7.3} ms, ", ms(ev.ktime_ns.saturating_sub(t_kill)))
        } else {
            String::new()
        };
        eprintln!(
            "LATENCY [{:<9}] run {run}: {stamp}kill->event in userspace {:7.3} ms, kill->waitpid return {:7.3} ms ({st}; event status {:?})",
            format!("{:?}", det.backend()),
            ms(t_recv - t_kill),
            ms(t_wait - t_kill),
            ev.status,
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_1gib_ebpf_vs_waitpid() {
    measure(DetectorMode::RequireEbpf).await;
    measure(DetectorMode::ForceUserspace).await;
}
