#![allow(dead_code)]
//! Shared helpers for the integration tests (must run as root for eBPF).

use std::{
    io::{BufRead, BufReader, Write},
    process::{Child, Command, Stdio},
    time::Duration,
};

use vigil_ebpf::{Detector, DetectorMode, EventChannel, ExitEvent};

thread_local! {
    /// The eBPF variant [`detector`] loads on this thread (each `#[tokio::test]` runs on a thread of its own).
    pub(crate) static CHANNEL: std::cell::Cell<EventChannel> = const { std::cell::Cell::new(EventChannel::RingBuffer) };
}

pub(crate) const TIMEOUT: Duration = Duration::from_secs(5);

/// Spawns the helper in `--wait-stdin` mode: it does nothing until `go()`.
pub(crate) fn spawn_gated(args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_vigil-exit-helper"))
        .arg("--wait-stdin")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn helper")
}

/// Releases a gated helper.
pub(crate) fn go(child: &mut Child) {
    let stdin = child.stdin.as_mut().expect("piped stdin");
    stdin.write_all(b"go\n").unwrap();
    stdin.flush().unwrap();
}

/// Waits for the helper's "ready" line (hog modes).
pub(crate) fn wait_ready(child: &mut Child) {
    let out = child.stdout.take().expect("piped stdout");
    let mut line = String::new();
    BufReader::new(out).read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready");
}

pub(crate) fn detector(mode: DetectorMode) -> Detector {
    let d = Detector::choose_with(mode, CHANNEL.get()).expect("detector");
    match mode {
        DetectorMode::RequireEbpf => assert_eq!(d.description(), "ebpf"),
        DetectorMode::ForceUserspace => assert_eq!(d.description(), "userspace (forced)"),
        DetectorMode::Auto => {}
    }
    d
}

pub(crate) async fn next_within(det: &mut Detector, t: Duration) -> Option<ExitEvent> {
    tokio::time::timeout(t, det.next_event()).await.ok().flatten()
}

pub(crate) fn kill(pid: u32, sig: i32) {
    // SAFETY: kill(2) with a pid we spawned and still own (not yet reaped).
    let rc = unsafe { libc::kill(pid as libc::pid_t, sig) };
    assert_eq!(rc, 0, "kill({pid}, {sig})");
}
