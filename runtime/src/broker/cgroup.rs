//! Job containment with cgroup v2 (the driver's side: file system calls only; no rule lives here).
//!
//! A broker that can write to its own cgroup v2 (found from `/proc/self/mountinfo` and the `0::` line of
//! `/proc/self/cgroup`, never a hard-coded path; a system instance gets it by systemd delegation, `Delegate=yes`)
//! makes a subtree `vigil-broker-PID` there, and in it one cgroup per job shell, `job-ID`. The shell joins its
//! cgroup before it runs (its `cgroup.procs` is written from the child between fork and exec), so every task and
//! everything they start, `setsid` or not, is in it. When the shell ends, `cgroup.kill` (Linux 5.14; else a
//! SIGKILL to every pid listed, until none is left) ends whatever is left, the job's CPU time (`cpu.stat`) and peak
//! memory (`memory.peak`, where the memory controller is enabled) are read, and the cgroup is removed.
//!
//! Without a usable cgroup2 (none mounted, not writable, `exec.containment=pgroup`), jobs are kept by process
//! groups as before: the broker says so once and `vigil uptime` shows it.

use crate::jobs::JobId;
use crate::shellproto::Usage;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

/// How this broker keeps its jobs' processes, for status output.
#[derive(Debug)]
pub(crate) enum Containment {
    /// A cgroup v2 per job under this broker's subtree.
    Cgroup(Cgroups),
    /// Process groups only, and why.
    ProcessGroups(String),
}

impl Containment {
    /// Choose by `exec.containment` (`auto`, `cgroup`, `pgroup`): `Err` only when `cgroup` was asked for and cannot
    /// be had.
    pub(crate) fn choose(how: &str, rank: u32) -> Result<Containment, String> {
        if how == "pgroup" {
            return Ok(Containment::ProcessGroups("exec.containment=pgroup".into()));
        }
        match Cgroups::create(rank) {
            Ok(c) => Ok(Containment::Cgroup(c)),
            Err(why) if how == "cgroup" => Err(format!("exec.containment=cgroup, but {why}")),
            Err(why) => Ok(Containment::ProcessGroups(why)),
        }
    }

    /// One line for `vigil uptime`: `cgroup2 (/sys/fs/cgroup/...)` or `process groups (why)`.
    pub(crate) fn describe(&self) -> String {
        match self {
            Containment::Cgroup(c) => format!("cgroup2 ({})", c.root.display()),
            Containment::ProcessGroups(why) => format!("process groups ({why})"),
        }
    }
}

/// This broker's cgroup subtree.
#[derive(Debug)]
pub(crate) struct Cgroups {
    /// `<cgroup2 mount>/<our cgroup>/vigil-broker-PID`.
    root: PathBuf,
}

/// The cgroup2 mount point, from `/proc/self/mountinfo` (the fifth field of a line whose file system type, after
/// the ` - ` separator, is `cgroup2`).
fn cgroup2_mount() -> Option<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().find_map(|l| {
        let (pre, post) = l.split_once(" - ")?;
        if post.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        pre.split_whitespace().nth(4).map(PathBuf::from)
    })
}

/// This process's cgroup v2 path (the `0::PATH` line of `/proc/self/cgroup`).
fn own_cgroup() -> Option<String> {
    let s = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    s.lines().find_map(|l| l.strip_prefix("0::")).map(str::to_string)
}

impl Cgroups {
    /// Make this broker's subtree, or say why not.
    fn create(rank: u32) -> Result<Cgroups, String> {
        let mount = cgroup2_mount().ok_or("no cgroup2 file system is mounted")?;
        let own = own_cgroup().ok_or("this process is in no cgroup v2 (/proc/self/cgroup has no 0:: line)")?;
        let base = mount.join(own.trim_start_matches('/'));
        remove_stale(&base);
        let root = base.join(format!("vigil-broker-{}-{rank}", std::process::id()));
        std::fs::create_dir(&root).map_err(|e| format!("cannot create a cgroup under {}: {e}", base.display()))?;
        // A cgroup we cannot move a process into is of no use: find out now, with one that is thrown away.
        let probe = root.join("probe");
        let ok = std::fs::create_dir(&probe).and_then(|_| {
            let procs = std::fs::OpenOptions::new().write(true).open(probe.join("cgroup.procs"))?;
            drop(procs);
            Ok(())
        });
        let _ = std::fs::remove_dir(&probe);
        if let Err(e) = ok {
            let _ = std::fs::remove_dir(&root);
            return Err(format!("cannot use cgroups under {}: {e}", base.display()));
        }
        Ok(Cgroups { root })
    }

    /// A cgroup for job `id`'s shell, its `cgroup.procs` open for the child to join it.
    pub(crate) fn job(&self, id: JobId) -> Result<JobCgroup, String> {
        let dir = self.root.join(format!("job-{}", id.f58()));
        match std::fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(format!("cannot create {}: {e}", dir.display())),
        }
        let procs = std::fs::OpenOptions::new()
            .write(true)
            .open(dir.join("cgroup.procs"))
            .map_err(|e| format!("{}: {e}", dir.display()))?;
        Ok(JobCgroup { dir, procs: procs.into() })
    }

    /// Remove the subtree (when the broker ends): every job cgroup in it is killed first.
    pub(crate) fn remove(&self) {
        if let Ok(rd) = std::fs::read_dir(&self.root) {
            for e in rd.flatten().filter(|e| e.path().is_dir()) {
                kill_all(&e.path());
                let _ = remove_when_empty(&e.path());
            }
        }
        let _ = std::fs::remove_dir(&self.root);
    }
}

/// Remove the subtrees that brokers which died without cleaning up (`kill -9`) left under `base`: those named
/// `vigil-broker-PID-RANK` whose PID runs no more. Their job cgroups are killed first.
fn remove_stale(base: &Path) {
    let Ok(rd) = std::fs::read_dir(base) else { return };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix("vigil-broker-").and_then(|r| r.split('-').next()) else { continue };
        if pid.parse::<u32>().is_err() || Path::new("/proc").join(pid).exists() {
            continue;
        }
        let c = Cgroups { root: e.path() };
        c.remove();
    }
}

/// One job shell's cgroup.
#[derive(Debug)]
pub(crate) struct JobCgroup {
    dir: PathBuf,
    procs: OwnedFd,
}

impl JobCgroup {
    /// The descriptor of this cgroup's `cgroup.procs`, which the child writes `0` to (itself) before it runs.
    pub(crate) fn procs_fd(&self) -> i32 {
        self.procs.as_raw_fd()
    }

    /// The shell ended: kill what is left, read the usage, remove the cgroup.
    pub(crate) fn finish(self) -> Usage {
        kill_all(&self.dir);
        let stats = usage(&self.dir);
        drop(self.procs);
        let _ = remove_when_empty(&self.dir);
        stats
    }
}

/// What the kernel accounted for cgroup `dir`: CPU time (`cpu.stat`, present in every cgroup2 cgroup) and peak
/// memory (`memory.peak`, with the memory controller, Linux 5.19).
fn usage(dir: &Path) -> Usage {
    let mut u = Usage::default();
    if let Ok(s) = std::fs::read_to_string(dir.join("cpu.stat")) {
        for l in s.lines() {
            let mut it = l.split_whitespace();
            let (Some(k), Some(n)) = (it.next(), it.next().and_then(|n| n.parse::<u64>().ok())) else { continue };
            match k {
                "usage_usec" => u.cpu_usec = Some(n),
                "user_usec" => u.cpu_user_usec = Some(n),
                "system_usec" => u.cpu_system_usec = Some(n),
                _ => {}
            }
        }
    }
    u.memory_peak = std::fs::read_to_string(dir.join("memory.peak")).ok().and_then(|s| s.trim().parse::<u64>().ok());
    u
}

/// Kill every process in cgroup `dir` and below: `cgroup.kill`, else SIGKILL to each pid listed until none is.
fn kill_all(dir: &Path) {
    if std::fs::write(dir.join("cgroup.kill"), "1").is_ok() {
        return;
    }
    for _ in 0..50 {
        let pids: Vec<i32> = std::fs::read_to_string(dir.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        if pids.is_empty() {
            return;
        }
        for p in pids {
            // SAFETY: plain kill(2) of a process listed in a cgroup of ours.
            unsafe { libc::kill(p, libc::SIGKILL) };
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// Remove cgroup `dir`, its descendants first (a nested instance's broker makes its own subtree inside its job's
/// cgroup), once no process is left in them (killed processes leave within milliseconds).
fn remove_when_empty(dir: &Path) -> std::io::Result<()> {
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten().filter(|e| e.file_type().is_ok_and(|t| t.is_dir())) {
            let _ = remove_when_empty(&e.path());
        }
    }
    let mut last = Ok(());
    for _ in 0..100 {
        match std::fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => last = Err(e),
            Err(e) => return Err(e),
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    last
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_and_cgroup_lines_are_read_as_the_kernel_writes_them() {
        // Whatever this machine has: a cgroup2 mount, when present, is a directory, and our own cgroup starts
        // with '/'.
        if let Some(m) = cgroup2_mount() {
            assert!(m.is_dir(), "{}", m.display());
        }
        if let Some(c) = own_cgroup() {
            assert!(c.starts_with('/'), "{c}");
        }
        assert_eq!(usage(Path::new("/nonexistent")), Usage::default());
    }
}
