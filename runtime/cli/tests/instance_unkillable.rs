//! Unkillable tasks (issue 40, item 4; docs/failure-detection.md "Unkillable tasks"): a task that SIGKILL cannot
//! end (uninterruptible sleep on a FUSE file system whose daemon reads requests and never answers them,
//! `tests/common/stuckfs.py`) does not keep its job from ending; its node is drained with the reason
//! `unkillable tasks of job ID`, the job's eventlog says so, and nothing else is placed there until an admin
//! undrains it.

mod common;

use common::*;
use std::io::BufRead;
use std::time::{Duration, Instant};

/// The kill timeout of the instance under test: SIGTERM to SIGKILL, then SIGKILL to the drain.
const KILL_TIMEOUT: Duration = Duration::from_secs(1);

/// Beyond the two kill timeouts, what a loaded machine may add to a job's end (requests, the shell's exit, the
/// cgroup look-ups, a report through the overlay).
const MARGIN: Duration = Duration::from_secs(10);

/// The FUSE daemon of `stuckfs.py`, killed (and with it every request stuck on it) when dropped.
struct StuckFs {
    child: std::process::Child,
    /// The mount point as any process sees it: through the daemon's root, in its mount namespace.
    path: String,
    _dir: tempfile::TempDir,
}

impl StuckFs {
    /// Start the daemon; `None` (said) where it cannot mount: no /dev/fuse, no python3, not root.
    fn start() -> Option<StuckFs> {
        let dir = tempdir();
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).expect("mkdir");
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/common/stuckfs.py");
        let mut child = std::process::Command::new("python3")
            .arg(script)
            .arg(&mnt)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| eprintln!("skipped: cannot run python3: {e}"))
            .ok()?;
        let mut line = String::new();
        let _ = std::io::BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line);
        let Some(pid) = line.strip_prefix("ready ").and_then(|p| p.trim().parse::<u32>().ok()) else {
            let out = child.wait_with_output().expect("wait");
            eprintln!("skipped: no FUSE mount here: {}", String::from_utf8_lossy(&out.stderr).trim());
            return None;
        };
        let path = format!("/proc/{pid}/root{}", mnt.display());
        Some(StuckFs { child, path, _dir: dir })
    }
}

impl Drop for StuckFs {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The state letter of process `pid` (`/proc/PID/stat`'s third field: `S`, `D`...), `None` once it is gone.
fn proc_state(pid: i32) -> Option<char> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    s.rsplit_once(") ")?.1.chars().next()
}

/// Rank `r`'s `(state, reason)` in `vigil resource status --json`.
fn rank_state(inst: &Instance, r: usize) -> (String, String) {
    let v = inst.vigil(&["resource", "status", "--json"]).json();
    let row = &v["ranks"][r];
    (row["state"].as_str().unwrap_or("").to_string(), row["reason"].as_str().unwrap_or("").to_string())
}

#[test]
fn a_task_sigkill_cannot_end_ends_its_job_drains_its_node_and_keeps_other_jobs_off_it() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root (a cgroup v2 per job, a FUSE mount)");
        return;
    }
    let inst = Instance::start(2, &[&format!("exec.kill-timeout={}s", KILL_TIMEOUT.as_secs())]);
    let up = inst.vigil(&["uptime"]);
    if !up.stdout.contains("jobs contained by: cgroup2") {
        eprintln!("skipped: jobs are not in cgroups here:\n{}", up.stdout);
        return;
    }
    // Declared after the instance: dropped first, so that its stuck process ends before the instance stops.
    let Some(fs) = StuckFs::start() else { return };
    // Task 1 (on rank 1) waits on the file system; task 0 (rank 0) sleeps.
    let script = format!("if [ \"$VIGIL_TASK_RANK\" = 1 ]; then exec stat {}; fi; exec sleep 300", fs.path);
    let id = inst.submit(&["-N2", "-n2", "sh", "-c", &script]);
    let mut stuck = Vec::new();
    assert!(
        wait_for(Duration::from_secs(30), || {
            stuck = processes_with_argv(&["stat", &fs.path]);
            !stuck.is_empty()
        }),
        "the task never ran stat: {}",
        inst.state(&id)
    );
    let pid = stuck[0].0;
    // Its request is with the daemon (it sleeps there) before the job is cancelled.
    assert!(wait_for(Duration::from_secs(10), || proc_state(pid) == Some('S')), "state {:?}", proc_state(pid));
    let wait = inst.vigil_spawn(&["job", "wait", &id]);
    let t0 = Instant::now();
    inst.vigil(&["cancel", &id]).ok();
    // SIGTERM, SIGKILL a kill timeout later: the task is in uninterruptible sleep, and stays.
    assert!(wait_for(Duration::from_secs(20), || proc_state(pid) == Some('D')), "state {:?}", proc_state(pid));
    // The job ends anyway: its `vigil job wait` returns within the two kill timeouts and a margin.
    let out = wait.wait(2 * KILL_TIMEOUT + MARGIN + Duration::from_secs(5));
    let took = t0.elapsed();
    eprintln!("cancel -> vigil job wait returned: {:.2} s (kill timeout {KILL_TIMEOUT:?}, twice)", took.as_secs_f64());
    assert!(!out.timed_out, "vigil job wait did not return:\n{}", out.dump());
    assert!(took <= 2 * KILL_TIMEOUT + MARGIN, "the job took {took:?} to end after its cancel");
    assert!(took >= KILL_TIMEOUT, "the job ended {took:?} after its cancel, before SIGKILL was even sent");
    assert_eq!(inst.state(&id), "INACTIVE");
    assert_eq!(proc_state(pid), Some('D'), "the task is still there, unkillable");
    // Rank 1 is drained with the reason, shown by `vigil resource status`; rank 0 is not.
    let reason = format!("unkillable tasks of job {id}");
    assert_eq!(rank_state(&inst, 1), ("drained".to_string(), reason.clone()));
    assert_eq!(rank_state(&inst, 0).0, "avail");
    let text = inst.vigil(&["resource", "status"]);
    assert!(text.stdout.contains(&reason), "{}", text.dump());
    // The job's eventlog has the exception, naming the process.
    let log = inst.vigil(&["job", "eventlog", &id]);
    log.ok();
    let exc = log.stdout.lines().find(|l| l.contains("exception") && l.contains("unkillable"));
    let exc = exc.unwrap_or_else(|| panic!("no unkillable exception:\n{}", log.dump()));
    assert!(exc.contains(&format!("processes {pid} ")) && exc.contains("(rank 1)"), "{exc}");
    // A two-node job is not placed while rank 1 is drained; a one-node job runs on rank 0.
    let two = inst.submit(&["-N2", "-n2", "true"]);
    let one = inst.vigil(&["run", "-N1", "sh", "-c", "echo rank $VIGIL_BROKER_RANK"]);
    one.ok();
    assert!(!one.stdout.contains("rank 1"), "{}", one.dump());
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(inst.state(&two), "SCHED");

    // The daemon goes: the stuck request fails, the process ends, and its cgroup empties.
    drop(fs);
    assert!(wait_for(Duration::from_secs(10), || proc_state(pid).is_none()), "state {:?}", proc_state(pid));
    // The admin undrains the node: the waiting job runs on both.
    inst.vigil(&["resource", "undrain", "1"]).ok();
    let w = inst.vigil_t(&["job", "wait", &two], Duration::from_secs(30));
    w.ok();
    assert_eq!(rank_state(&inst, 1).0, "avail");
}
