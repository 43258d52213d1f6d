//! Process-exit detection, for both backends. Run as root.

mod common;

use std::os::unix::process::ExitStatusExt;

use common::*;
use vigil_ebpf::{Backend, DetectorMode, EventSource, ExitStatus, monotonic_ns};

const EBPF: DetectorMode = DetectorMode::RequireEbpf;
const USER: DetectorMode = DetectorMode::ForceUserspace;

fn expected_source(mode: DetectorMode) -> EventSource {
    if mode == EBPF { EventSource::Ebpf } else { EventSource::Pidfd }
}

async fn kill9(mode: DetectorMode) {
    let mut det = detector(mode);
    let mut child = spawn_gated(&["sleep"]);
    let pid = child.id();
    det.watch(pid).unwrap();
    let t0 = monotonic_ns();
    kill(pid, libc::SIGKILL);
    let ev = next_within(&mut det, TIMEOUT).await.expect("exit event");
    let t1 = monotonic_ns();
    eprintln!("[{:?}] kill -9 -> event: {:.3} ms, {ev:?}", det.backend(), (t1 - t0) as f64 / 1e6);
    assert_eq!(ev.pid, pid);
    assert_eq!(ev.status, ExitStatus::Signaled { signal: 9, core_dumped: false });
    assert_eq!(ev.source, expected_source(mode));
    assert!(t1 - t0 < 1_000_000_000, "event took too long");
    if mode == EBPF {
        assert_eq!(ev.sender_pid, Some(std::process::id()));
        assert_eq!(ev.si_code, Some(0), "SI_USER");
        assert!(ev.ktime_ns >= t0 && ev.ktime_ns <= t1);
        assert_eq!(ev.comm.as_deref(), Some("vigil-exit-help"));
    }
    // The detector must not have reaped the child.
    assert_eq!(child.wait().unwrap().signal(), Some(9));
}

async fn exit3(mode: DetectorMode) {
    let mut det = detector(mode);
    let mut child = spawn_gated(&["exit", "3"]);
    let pid = child.id();
    det.watch(pid).unwrap();
    go(&mut child);
    let ev = next_within(&mut det, TIMEOUT).await.expect("exit event");
    assert_eq!(ev.pid, pid);
    assert_eq!(ev.status, ExitStatus::Exited(3));
    assert_eq!(ev.source, expected_source(mode));
    assert_eq!(ev.sender_pid, None);
    assert!(!ev.oom_killed);
    assert_eq!(child.wait().unwrap().code(), Some(3));
}

async fn exit_from_thread(mode: DetectorMode) {
    let mut det = detector(mode);
    let mut child = spawn_gated(&["exit-thread", "7"]);
    let pid = child.id();
    det.watch(pid).unwrap();
    go(&mut child);
    let ev = next_within(&mut det, TIMEOUT).await.expect("exit event");
    assert_eq!(ev.pid, pid);
    assert_eq!(ev.status, ExitStatus::Exited(7));
    // exactly one event for the two-thread process
    assert!(next_within(&mut det, std::time::Duration::from_millis(300)).await.is_none());
    assert_eq!(child.wait().unwrap().code(), Some(7));
}

async fn segv(mode: DetectorMode, args: &[&str]) {
    let mut det = detector(mode);
    let mut child = spawn_gated(args);
    let pid = child.id();
    det.watch(pid).unwrap();
    go(&mut child);
    let ev = next_within(&mut det, TIMEOUT).await.expect("exit event");
    eprintln!("[{:?}] {args:?}: {ev:?}", det.backend());
    assert_eq!(ev.pid, pid);
    assert_eq!(ev.status.signal(), Some(11));
    if mode == EBPF {
        // kernel-generated: raised in the context of the faulting process
        assert_eq!(ev.sender_pid, Some(pid));
        assert!(ev.si_code.unwrap() > 0, "SEGV_* code, got {:?}", ev.si_code);
    }
    assert_eq!(child.wait().unwrap().signal(), Some(11));
}

async fn unwatched(mode: DetectorMode) {
    let mut det = detector(mode);
    let mut quiet = spawn_gated(&["exit", "0"]);
    let mut watched_then_unwatched = spawn_gated(&["exit", "1"]);
    let mut loud = spawn_gated(&["exit", "5"]);
    det.watch(watched_then_unwatched.id()).unwrap();
    det.unwatch(watched_then_unwatched.id()).unwrap();
    go(&mut quiet);
    go(&mut watched_then_unwatched);
    quiet.wait().unwrap();
    watched_then_unwatched.wait().unwrap();
    assert!(
        next_within(&mut det, std::time::Duration::from_millis(300)).await.is_none(),
        "event for an unwatched process"
    );
    det.watch(loud.id()).unwrap();
    go(&mut loud);
    let ev = next_within(&mut det, TIMEOUT).await.expect("exit event");
    assert_eq!(ev.pid, loud.id());
    assert_eq!(ev.status, ExitStatus::Exited(5));
    loud.wait().unwrap();
    assert!(next_within(&mut det, std::time::Duration::from_millis(200)).await.is_none());
}

/// Watching a process that is already a zombie still yields an event.
async fn already_dead(mode: DetectorMode) {
    let mut det = detector(mode);
    let mut child = spawn_gated(&["exit", "4"]);
    go(&mut child);
    // wait until it is a zombie, without reaping it
    let pidfd_probe = std::time::Instant::now();
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", child.id())).unwrap();
        if stat.rsplit(')').next().unwrap().trim_start().starts_with('Z') {
            break;
        }
        assert!(pidfd_probe.elapsed() < TIMEOUT);
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    det.watch(child.id()).unwrap();
    let ev = next_within(&mut det, TIMEOUT).await.expect("exit event");
    assert_eq!(ev.pid, child.id());
    assert_eq!(ev.status, ExitStatus::Exited(4));
    let src = if mode == EBPF { EventSource::WatchRace } else { EventSource::Pidfd };
    assert_eq!(ev.source, src);
    child.wait().unwrap();
    // and a reaped pid is refused
    assert!(det.watch(child.id()).is_err());
}

macro_rules! both {
    ($name:ident, $body:ident) => {
        mod $name {
            use super::*;
            #[tokio::test]
            async fn ebpf() {
                $body(EBPF).await
            }
            #[tokio::test]
            async fn userspace() {
                $body(USER).await
            }
            /// The variant for kernels without the BPF ring buffer (before 5.8), forced here.
            #[tokio::test]
            async fn ebpf_perf_buffer() {
                CHANNEL.set(vigil_ebpf::EventChannel::PerfBuffer);
                $body(EBPF).await
            }
        }
    };
}

both!(kill9_reports_signal_9, kill9);
both!(exit3_reports_code_3, exit3);
both!(exit_from_non_main_thread, exit_from_thread);
async fn segv_main(m: DetectorMode) {
    segv(m, &["segv"]).await
}
async fn segv_thread(m: DetectorMode) {
    segv(m, &["segv-thread"]).await
}
both!(sigsegv_reports_signal_11, segv_main);
both!(sigsegv_in_thread_reports_signal_11, segv_thread);
both!(unwatched_process_no_event, unwatched);
both!(watch_after_exit, already_dead);

/// As root: eBPF. Otherwise (e.g. under `setpriv --reuid=65534`): the
/// fallback with reason "userspace (no root)", and it still works.
#[tokio::test]
async fn auto_mode_choice() {
    let mut d = detector(DetectorMode::Auto);
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        assert_eq!(d.backend(), Backend::Ebpf, "{}", d.description());
    } else {
        assert_eq!(d.description(), "userspace (no root)");
    }
    let mut child = spawn_gated(&["exit", "9"]);
    d.watch(child.id()).unwrap();
    go(&mut child);
    let ev = next_within(&mut d, TIMEOUT).await.expect("exit event");
    assert_eq!(ev.status, ExitStatus::Exited(9));
    child.wait().unwrap();
}

#[test]
fn no_runtime_is_an_error() {
    assert!(matches!(
        vigil_ebpf::Detector::with_mode(DetectorMode::ForceUserspace),
        Err(vigil_ebpf::EbpfError::NoRuntime)
    ));
}
