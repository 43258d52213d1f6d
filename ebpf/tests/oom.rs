//! OOM-kill flag: a child in a 64 MiB memory cgroup allocating 512 MiB.
//! Needs root and a cgroup v1 memory hierarchy at /sys/fs/cgroup/memory or
//! cgroup v2 at /sys/fs/cgroup; skipped (with a message) otherwise.

mod common;

use std::path::PathBuf;

use common::*;
use vigil_ebpf::{DetectorMode, ExitStatus};

struct Cg(PathBuf);
impl Drop for Cg {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

fn make_cgroup() -> Option<(Cg, PathBuf)> {
    let name = format!("vigil-oom-test-{}", std::process::id());
    let v1 = PathBuf::from("/sys/fs/cgroup/memory");
    if v1.join("memory.limit_in_bytes").exists() {
        let dir = v1.join(name);
        std::fs::create_dir(&dir).ok()?;
        std::fs::write(dir.join("memory.limit_in_bytes"), "67108864").ok()?;
        let _ = std::fs::write(dir.join("memory.memsw.limit_in_bytes"), "67108864");
        let procs = dir.join("cgroup.procs");
        return Some((Cg(dir), procs));
    }
    let v2 = PathBuf::from("/sys/fs/cgroup");
    if std::fs::read_to_string(v2.join("cgroup.controllers")).ok()?.contains("memory") {
        let dir = v2.join(name);
        std::fs::create_dir(&dir).ok()?;
        std::fs::write(dir.join("memory.max"), "67108864").ok()?;
        let _ = std::fs::write(dir.join("memory.swap.max"), "0");
        let procs = dir.join("cgroup.procs");
        return Some((Cg(dir), procs));
    }
    None
}

#[tokio::test]
async fn oom_kill_is_flagged() {
    let Some((_cg, procs)) = make_cgroup() else {
        eprintln!("SKIP: no usable memory cgroup");
        return;
    };
    let mut det = detector(DetectorMode::RequireEbpf);
    let mut child = spawn_gated(&["cg-hog", procs.to_str().unwrap(), "512"]);
    let pid = child.id();
    det.watch(pid).unwrap();
    go(&mut child);
    let ev = next_within(&mut det, TIMEOUT).await.expect("exit event");
    eprintln!("OOM event: {ev:?}");
    assert_eq!(ev.pid, pid);
    assert_eq!(ev.status, ExitStatus::Signaled { signal: 9, core_dumped: false });
    assert!(ev.oom_killed);
    assert_eq!(ev.si_code, Some(0x80), "SI_KERNEL");
    child.wait().unwrap();
}
