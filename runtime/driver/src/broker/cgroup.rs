//! Job containment with cgroup v2 (the driver's side: file system calls only; no rule lives here).
//!
//! A broker that can write to its own cgroup v2 (found from `/proc/self/mountinfo` and the `0::` line of
//! `/proc/self/cgroup`, never a hard-coded path; a system instance gets it by systemd delegation, `Delegate=yes`)
//! makes a subtree `vigil-broker-PID` there, and in it one cgroup per job shell, `job-ID.N` (N counts this broker's
//! shells: a job that runs again here, requeued, never gets the cgroup of its earlier run, see [`Cgroups::job`]).
//! The shell is created
//! in its cgroup (`clone3(CLONE_INTO_CGROUP)`, see spawn.rs), so every task and everything they start, `setsid` or
//! not, is in it. Where that is not available (before Linux 5.7, or not on x86_64) the broker moves the shell into
//! its cgroup right after spawning it and before writing its input, which the shell reads before it does anything
//! else; that move costs milliseconds per shell (an RCU grace period), and `vigil uptime` says the broker does it.
//! (Not from the child between fork and exec: a `pre_exec` hook forces a full `fork` of the broker, whose cost
//! grows with rank 0's memory, that is with the queue, where `posix_spawn` does not.) When the shell ends, `cgroup.kill` (Linux 5.14; else a
//! SIGKILL to every pid listed, until none is left) ends whatever is left, the job's CPU time (`cpu.stat`) and peak
//! memory (`memory.peak`, where the memory controller is enabled) are read, and the cgroup is removed.
//!
//! **Memory.** The job option `memory=SIZE` sets `memory.max` of the job's cgroup. That needs the memory
//! controller enabled for the job cgroups, which the broker does at start where it can: in its subtree, and in its
//! own cgroup when that has the controller but has not enabled it for its children. The kernel allows the latter
//! only in a cgroup that holds no process itself ("no internal processes"), so the broker first moves itself into
//! a leaf of its subtree, `vigil-broker-PID-RANK/broker` (a systemd unit with `Delegate=yes` holds only the broker;
//! a login shell's scope holds the shell too, and then memory limits are not available). Where the controller
//! cannot be had, a job asking for a limit runs without it and is told why on its stderr; `vigil uptime` says so.
//! With the controller, the job's peak memory (`memory.peak`) and its OOM kills (`memory.events`) are recorded.
//!
//! Without a usable cgroup2 (none mounted, not writable, `exec.containment=pgroup`), jobs are kept by process
//! groups as before: the broker says so once and `vigil uptime` shows it.

use crate::jobs::JobId;
use crate::shellproto::Usage;
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
    /// Choose by `exec.containment` (`auto`, `cgroup`, `pgroup`) and `exec.cgroup-spawn` (`auto`, `move`):
    /// `Err` only when `cgroup` was asked for and cannot be had. `sweep`: remove first what brokers that died
    /// without cleaning up left beside ours (one broker per machine does it: see [`Cgroups::create`]).
    pub(crate) fn choose(how: &str, spawn: &str, rank: u32, sweep: bool) -> Result<Containment, String> {
        if how == "pgroup" {
            return Ok(Containment::ProcessGroups("exec.containment=pgroup".into()));
        }
        match Cgroups::create(rank, spawn == "move", sweep) {
            Ok(c) => Ok(Containment::Cgroup(c)),
            Err(why) if how == "cgroup" => Err(format!("exec.containment=cgroup, but {why}")),
            Err(why) => Ok(Containment::ProcessGroups(why)),
        }
    }

    /// One line for `vigil uptime`: `cgroup2 (/sys/fs/cgroup/...)` or `process groups (why)`.
    pub(crate) fn describe(&self) -> String {
        match self {
            Containment::Cgroup(c) => {
                let memory = match &c.memory {
                    Ok(()) => "memory limits available".to_string(),
                    Err(why) => format!("no memory limits: {why}"),
                };
                let spawn = match &c.direct {
                    Ok(()) => String::new(),
                    Err(why) => format!("; shells moved in after start: {why}"),
                };
                format!("cgroup2 ({}; {memory}{spawn})", c.root.display())
            }
            Containment::ProcessGroups(why) => format!("process groups ({why})"),
        }
    }
}

/// This broker's cgroup subtree.
#[derive(Debug)]
pub(crate) struct Cgroups {
    /// `<cgroup2 mount>/<our cgroup>/vigil-broker-PID-RANK`.
    root: PathBuf,
    /// The memory controller is enabled for the job cgroups, or why not.
    pub(crate) memory: Result<(), String>,
    /// Shells can be created in their cgroup ([`super::spawn`]), or why not (they are moved in after start).
    pub(crate) direct: Result<(), String>,
    /// Shells started by this broker so far: the `N` of `job-ID.N`.
    started: std::sync::atomic::AtomicU64,
}

/// The leaf of a broker's subtree the broker moves itself into to enable the memory controller above it.
const BROKER_LEAF: &str = "broker";

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
    /// Make this broker's subtree, or say why not; with `sweep`, first remove the stale subtrees beside it
    /// ([`remove_stale`]). Every broker of a test instance shares one parent cgroup, so one sweeping each would
    /// look up every other broker's process: N × N lookups (a quarter of a 1,024-broker start-up's CPU), hence
    /// one per machine, the detector rank (`broker.detector-rank`; every broker where it is unset, one per node).
    fn create(rank: u32, move_shells: bool, sweep: bool) -> Result<Cgroups, String> {
        let mount = cgroup2_mount().ok_or("no cgroup2 file system is mounted")?;
        let own = own_cgroup().ok_or("this process is in no cgroup v2 (/proc/self/cgroup has no 0:: line)")?;
        let base = mount.join(own.trim_start_matches('/'));
        if sweep {
            remove_stale(&base);
        }
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
        let memory = enable_memory(&base, &root);
        let direct = if move_shells { Err("exec.cgroup-spawn=move".into()) } else { super::spawn::supported() };
        Ok(Cgroups { root, memory, direct, started: 0.into() })
    }

    /// A new cgroup for job `id`'s shell, `job-ID.N`, its `cgroup.procs` open for [`JobCgroup::adopt`].
    ///
    /// Never one made before, even for the same job: the cgroup of a requeued job's earlier run on this node may
    /// still be there (it is removed once its killed processes have left), and a child created with
    /// `clone3(CLONE_INTO_CGROUP)` in a cgroup that was once killed through `cgroup.kill` is killed at birth (seen
    /// on Linux 6.18: the requeued run's shell died of SIGKILL before it could report; the test below).
    pub(crate) fn job(&self, id: JobId) -> Result<JobCgroup, String> {
        let n = self.started.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = self.root.join(format!("job-{}.{n}", id.f58()));
        std::fs::create_dir(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let procs = std::fs::OpenOptions::new()
            .write(true)
            .open(dir.join("cgroup.procs"))
            .map_err(|e| format!("{}: {e}", dir.display()))?;
        Ok(JobCgroup { dir, procs })
    }

    /// Remove the subtree (when the broker ends): every job cgroup in it is killed first (not the broker's own
    /// leaf, where this broker may be: the next broker to start here removes what is left).
    pub(crate) fn remove(&self) {
        if let Ok(rd) = std::fs::read_dir(&self.root) {
            for e in rd.flatten().filter(|e| e.path().is_dir() && e.file_name() != BROKER_LEAF) {
                kill_all(&e.path());
                let _ = remove_when_empty(&e.path());
            }
        }
        let _ = std::fs::remove_dir(&self.root);
    }
}

/// Whether `controller` is listed in the file `dir/file` (`cgroup.controllers` or `cgroup.subtree_control`).
fn lists(dir: &Path, file: &str, controller: &str) -> bool {
    std::fs::read_to_string(dir.join(file)).is_ok_and(|s| s.split_whitespace().any(|c| c == controller))
}

/// Enable the memory controller for the job cgroups under `root` (see the module docs), or say why not.
fn enable_memory(base: &Path, root: &Path) -> Result<(), String> {
    if !lists(root, "cgroup.controllers", "memory") {
        if !lists(base, "cgroup.controllers", "memory") {
            return Err(format!("the memory controller is not available in {}", base.display()));
        }
        // `base` has it but does not give it to its children: enable it there, from a leaf of our own.
        let leaf = root.join(BROKER_LEAF);
        let me = std::process::id().to_string();
        std::fs::create_dir(&leaf)
            .and_then(|_| std::fs::write(leaf.join("cgroup.procs"), &me))
            .map_err(|e| format!("cannot move this broker into {}: {e}", leaf.display()))?;
        if let Err(e) = std::fs::write(base.join("cgroup.subtree_control"), "+memory") {
            // Back where we were (allowed: nothing was enabled there), so that nothing changed.
            let _ = std::fs::write(base.join("cgroup.procs"), &me);
            let _ = std::fs::remove_dir(&leaf);
            let why = if e.raw_os_error() == Some(libc::EBUSY) {
                "it holds other processes (run the broker in a cgroup of its own, e.g. a systemd unit with Delegate=yes)"
                    .to_string()
            } else {
                e.to_string()
            };
            return Err(format!("cannot enable the memory controller in {}: {why}", base.display()));
        }
    }
    std::fs::write(root.join("cgroup.subtree_control"), "+memory")
        .map_err(|e| format!("cannot enable the memory controller in {}: {e}", root.display()))
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
        let c = Cgroups { root: e.path(), memory: Err(String::new()), direct: Err(String::new()), started: 0.into() };
        c.remove();
        // Its broker is gone: so is anything in its leaf.
        let _ = remove_when_empty(&e.path());
    }
}

/// One job shell's cgroup.
#[derive(Debug)]
pub(crate) struct JobCgroup {
    dir: PathBuf,
    procs: std::fs::File,
}

impl JobCgroup {
    /// Limit the job's memory on this node to `bytes` (`memory.max`; no swap beyond it, `memory.swap.max` 0 where
    /// swap is accounted), or say why not.
    pub(crate) fn limit_memory(&self, bytes: u64) -> Result<(), String> {
        std::fs::write(self.dir.join("memory.max"), bytes.to_string())
            .map_err(|e| format!("cannot set {}: {e}", self.dir.join("memory.max").display()))?;
        let _ = std::fs::write(self.dir.join("memory.swap.max"), "0");
        Ok(())
    }

    /// The cgroup's directory (under the cgroup2 mount).
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// The cgroup's directory, open for [`super::spawn::spawn`] (`O_RDONLY | O_DIRECTORY`, close-on-exec).
    pub(crate) fn open_dir(&self) -> Result<std::fs::File, String> {
        std::fs::File::open(&self.dir).map_err(|e| format!("{}: {e}", self.dir.display()))
    }

    /// Move process `pid` (the job's shell, before it has started anything) into this cgroup.
    pub(crate) fn adopt(&self, pid: i32) -> Result<(), String> {
        use std::io::Write;
        (&self.procs)
            .write_all(pid.to_string().as_bytes())
            .map_err(|e| format!("cannot move pid {pid} into {}: {e}", self.dir.display()))
    }

    /// The shell ended: kill what is left and read the usage. The cgroup itself goes with [`EndedCgroup::remove`],
    /// which the caller may do after it has reported the job's end (it waits for the killed processes to leave).
    pub(crate) fn finish(self) -> (Usage, EndedCgroup) {
        kill_all(&self.dir);
        let stats = usage(&self.dir);
        (stats, EndedCgroup { dir: self.dir })
    }
}

/// A job cgroup whose processes were killed ([`JobCgroup::finish`]), still to be removed.
#[derive(Debug)]
pub(crate) struct EndedCgroup {
    dir: PathBuf,
}

impl EndedCgroup {
    /// Remove it (and any cgroup a nested broker made inside it) once its killed processes have left.
    pub(crate) fn remove(self) {
        let _ = remove_when_empty(&self.dir);
    }

    /// The pids still in it or below, waiting up to `wait` for the killed processes to leave (they do within
    /// milliseconds, unless one is in uninterruptible sleep: `unkillable.rs` in the broker's core). Empty once
    /// `cgroup.events` says it is not populated (or the cgroup is gone).
    pub(crate) fn left_after(&self, wait: std::time::Duration) -> Vec<u32> {
        let start = std::time::Instant::now();
        loop {
            if !self.populated() {
                return Vec::new();
            }
            if start.elapsed() >= wait {
                return pids_below(&self.dir);
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }

    /// Whether a process is still in it or below (`populated 1` in `cgroup.events`; false if it cannot be read).
    pub(crate) fn populated(&self) -> bool {
        std::fs::read_to_string(self.dir.join("cgroup.events"))
            .is_ok_and(|s| s.lines().any(|l| l.trim() == "populated 1"))
    }
}

/// Every pid in cgroup `dir` and its descendants (`cgroup.procs` of each), ascending.
fn pids_below(dir: &Path) -> Vec<u32> {
    let mut pids: Vec<u32> = std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten().filter(|e| e.file_type().is_ok_and(|t| t.is_dir())) {
            pids.extend(pids_below(&e.path()));
        }
    }
    pids.sort_unstable();
    pids
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
    u.oom_kills = std::fs::read_to_string(dir.join("memory.events")).ok().and_then(|s| oom_kills(&s));
    u
}

/// The `oom_kill` count of a `memory.events` file's text.
pub(crate) fn oom_kills(events: &str) -> Option<u64> {
    events.lines().find_map(|l| l.strip_prefix("oom_kill ")).and_then(|n| n.trim().parse().ok())
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

    /// A job that runs again on this node (requeued) gets a new cgroup, in which its shell lives, though the
    /// cgroup of its first run, killed at its end, is still there.
    #[tokio::test]
    async fn a_job_that_runs_again_gets_a_new_cgroup_and_its_shell_lives() {
        let cgroups = match Cgroups::create(u32::MAX, false, true) {
            Ok(c) => c,
            Err(e) => return eprintln!("no usable cgroup2 here ({e}): skipped"),
        };
        let id = JobId(42);
        let first = cgroups.job(id).expect("the first run's cgroup");
        let (_, first) = first.finish(); // cgroup.kill, as at the end of a run; not removed yet
        let again = cgroups.job(id).expect("the second run's cgroup");
        assert_ne!(again.dir(), first.dir.as_path());
        let dir = again.open_dir().expect("open");
        match super::super::spawn::spawn(Path::new("/bin/true"), &[], &[], &dir, None, false) {
            Err(super::super::spawn::SpawnError::Unsupported(e)) => eprintln!("no clone3 into a cgroup ({e})"),
            Err(e) => panic!("{e}"),
            Ok(child) => {
                drop(child.stdin);
                let status = super::super::spawn::wait(child.pid, child.pidfd).await.expect("wait");
                assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "wait status {status:#x}");
            }
        }
        cgroups.remove();
    }

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
        let events = "low 0\nhigh 0\nmax 12\noom 2\noom_kill 2\noom_group_kill 0\n";
        assert_eq!(oom_kills(events), Some(2));
        assert_eq!(oom_kills("low 0\n"), None);
    }
}
