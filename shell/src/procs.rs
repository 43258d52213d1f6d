//! This shell's processes: its job cgroup (OOM kills counted in `memory.events`, everything killed at once), its
//! process group (signals passed on to the tasks, and whatever they started), and the signals the broker sends it.

use tokio::sync::mpsc;

/// This shell's cgroup v2 directory: as its broker says ([`vigil_proto::shellproto::CGROUP_ENV`]), else its
/// `0::` line in `/proc/self/cgroup` under the cgroup2 mount of `/proc/self/mountinfo`.
fn own_cgroup_dir() -> Option<std::path::PathBuf> {
    // Where the broker created this shell in its job's cgroup, it says which.
    if let Some(dir) = std::env::var_os(vigil_proto::shellproto::CGROUP_ENV) {
        return Some(dir.into());
    }
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mount = info.lines().find_map(|l| {
        let (pre, post) = l.split_once(" - ")?;
        (post.split_whitespace().next()? == "cgroup2").then(|| pre.split_whitespace().nth(4).map(str::to_string))?
    })?;
    let cg = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let own = cg.lines().find_map(|l| l.strip_prefix("0::"))?.trim_start_matches('/').to_string();
    Some(std::path::Path::new(&mount).join(own))
}

/// `memory.events` of this shell's cgroup, where it has one (the memory controller enabled for it).
pub(crate) fn own_memory_events() -> Option<std::path::PathBuf> {
    let p = own_cgroup_dir()?.join("memory.events");
    p.exists().then_some(p)
}

/// Kill everything in this shell's job cgroup, the shell included: only a cgroup a broker made for a job
/// (`vigil-broker-*/job-*`), never one this shell merely happens to run in.
pub(crate) fn kill_own_job_cgroup() {
    let Some(dir) = own_cgroup_dir() else { return };
    let name = |p: &std::path::Path| p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let ours = name(&dir).starts_with("job-") && dir.parent().is_some_and(|p| name(p).starts_with("vigil-broker-"));
    if ours {
        let _ = std::fs::write(dir.join("cgroup.kill"), "1");
    }
}

/// The `oom_kill` count in the `memory.events` file at `path`.
pub(crate) fn oom_kills(path: &std::path::Path) -> Option<u64> {
    let s = std::fs::read_to_string(path).ok()?;
    s.lines().find_map(|l| l.strip_prefix("oom_kill ")).and_then(|n| n.trim().parse().ok())
}

/// Pass the signals the broker sends this shell for its tasks ([`vigil_proto::shellproto::SHELL_FORWARDED_SIGNALS`])
/// to `sig_tx`, by number.
pub(crate) fn forward_signals(sig_tx: &mpsc::UnboundedSender<i32>) {
    let mut sigs = Vec::new();
    for name in vigil_proto::shellproto::SHELL_FORWARDED_SIGNALS {
        let Ok(sig) = name.parse::<nix::sys::signal::Signal>() else { continue };
        let k = tokio::signal::unix::SignalKind::from_raw(sig as i32);
        if let Ok(s) = tokio::signal::unix::signal(k) {
            sigs.push((k.as_raw_value(), s));
        }
    }
    for (num, mut s) in sigs {
        let tx = sig_tx.clone();
        tokio::spawn(async move {
            while s.recv().await.is_some() {
                let _ = tx.send(num);
            }
        });
    }
}

/// SIGKILL to every process of this shell's process group but the shell itself ([`signal_own_group`]).
pub(crate) fn kill_own_group() -> usize {
    signal_own_group(libc::SIGKILL)
}

/// Signal `sig` to every process of this shell's process group but the shell itself: the job's tasks and whatever
/// they started without leaving the group (the broker started the shell as the leader of a group of its own), so
/// that each gets one copy (the broker signals the shell alone for the signals it passes on,
/// [`vigil_proto::shellproto::SHELL_FORWARDED_SIGNALS`]). Found through `/proc/PID/stat` (its fifth field is the
/// process group); returns how many were signalled: 0 when this shell does not lead a group of its own (started
/// by hand), and the caller then signals its tasks one by one.
pub(crate) fn signal_own_group(sig: i32) -> usize {
    // SAFETY: getpgrp and getpid have no preconditions and cannot fail.
    let (pgrp, me) = unsafe { (libc::getpgrp(), libc::getpid()) };
    if pgrp != me {
        return 0; // not the leader of a group of our own (started by hand?): the group is not the job's
    }
    let Ok(dir) = std::fs::read_dir("/proc") else { return 0 };
    let mut n = 0;
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else { continue };
        if pid == me {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else { continue };
        // "PID (COMM) STATE PPID PGRP ...": COMM may hold spaces and parentheses, so split after the last ')'.
        let group = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(2)?.parse::<i32>().ok());
        if group == Some(pgrp) {
            // SAFETY: plain kill(2) on a process of our own process group.
            if unsafe { libc::kill(pid, sig) } == 0 {
                n += 1;
            }
        }
    }
    n
}
