//! The priority of the broker's loop, where verdicts are made, on the broker that owns its machine's detectors.
//!
//! **Why.** On the overload soak (`bench/soak.sh`: busy loops, a memory hog, 72 brokers and a compiler on 2 CPUs,
//! load average 12 to 30), rank 0's prober reported a silent child's misses on time, but its loop, at normal
//! priority, did not run for up to 1.4 s at a time: one turn measured 1,405 ms between two clock readings with
//! nothing between them, and the median report reached the loop 265 ms after it was sent. A verdict waits for the
//! loop, so a dead node was judged a second late.
//!
//! **How.** The loop's thread gets nice −10 (`setpriority`, per thread on Linux): about ten times the CPU share
//! of a normal thread when the CPUs are contended, and first pick on wake-up, without being real-time (a busy loop,
//! such as rank 0 taking 10,000 submissions, still shares the CPU with the jobs; the prober, whose work per period
//! is microseconds, is the real-time one). `SCHED_RESET_ON_FORK` first: every thread and process created from the
//! loop from then on (job shells, the initial program, health checks, the blocking threads that start shells)
//! starts at nice 0. Needs `CAP_SYS_NICE`; without it the loop stays at normal priority, said once in the log and
//! in `vigil overlay status`. `VIGIL_LOOP_NO_NICE` in the environment turns it off (for comparisons).
//!
//! **The autogroup.** A thread's nice weighs only against the threads of its own scheduling group. With
//! `CONFIG_SCHED_AUTOGROUP` on (`kernel.sched_autogroup_enabled = 1`, the default of Debian's and RHEL's kernels),
//! every session (`setsid`) of a process in the root CPU cgroup is such a group, and the CPUs are shared between
//! groups by the group's own nice (`/proc/PID/autogroup`, sched(7)), whatever its threads' nice. A broker started
//! as a session leader (a systemd unit, `ci/netns-cluster.sh`) is alone in its group, and its loop at nice −10
//! still waited: on the overload soak (load average ~19, 72 brokers) rank 0's loop thread, runnable, waited
//! 0.2-4.5 s for a CPU at a time, about 50 s of each 100 s, and silent kills were judged 0.5-3.1 s late; with its
//! autogroup at nice −10 too, 0.34-0.5 s (bench/results/soak.txt). So a broker that leads its session also sets its autogroup's nice to
//! [`LOOP_NICE`] (the group holds the broker alone: job shells start sessions of their own, spawn.rs). One that does not lead its
//! session (brokers of `vigil start`, sharing the user's terminal session) leaves the group alone, since raising it
//! would raise every process of that session, and says so. Under a CPU cgroup of its own (a systemd unit with
//! `CPUAccounting=`) the autogroup does not apply: the broker and its job shells share the unit's CPU group (the
//! broker enables only the memory controller below it, cgroup.rs), where the loop's nice weighs against the jobs'
//! tasks; the unit's `CPUWeight=` weighs it against other units.

use std::path::Path;

/// The nice value the detector owner's loop runs at.
pub(super) const LOOP_NICE: i32 = -10;

/// Raise the calling thread (the broker's loop) to [`LOOP_NICE`], its children reset to normal priority. Returns
/// what `vigil overlay status` says about it.
pub(super) fn raise_loop() -> String {
    let off = std::env::var_os("VIGIL_LOOP_NO_NICE").is_some();
    let thread = try_raise(off);
    let raised = thread.is_ok();
    let mut s = said(thread);
    if raised {
        // SAFETY: getsid(0) and getpid have no preconditions.
        let leader = unsafe { libc::getsid(0) == libc::getpid() };
        let enabled = std::fs::read_to_string("/proc/sys/kernel/sched_autogroup_enabled").ok();
        s += &autogroup(enabled.as_deref(), leader, Path::new("/proc/self/autogroup"));
    }
    s
}

/// Set the caller's autogroup to nice [`LOOP_NICE`] when autogroups are on (`enabled`: the content of
/// `kernel.sched_autogroup_enabled`, `None` if the kernel has none) and the caller leads its session; `file` is
/// `/proc/self/autogroup` (content `/autogroup-N nice X`, sched(7)). Returns what to add to the status line: empty
/// when autogroups are off, else `, autogroup nice -10`, or why the group was left as it is (logged once).
fn autogroup(enabled: Option<&str>, leader: bool, file: &Path) -> String {
    if enabled.map(str::trim) != Some("1") {
        return String::new();
    }
    let current = || {
        std::fs::read_to_string(file)
            .ok()
            .and_then(|c| c.split_whitespace().nth(2).and_then(|n| n.parse::<i32>().ok()))
            .map_or_else(|| "?".to_string(), |n| n.to_string())
    };
    if !leader {
        return format!(", autogroup left at nice {} (shared with its session)", current());
    }
    match std::fs::write(file, LOOP_NICE.to_string()) {
        Ok(()) => format!(", autogroup nice {LOOP_NICE}"),
        Err(e) => {
            tracing::warn!(
                "the broker's autogroup stays at nice {} (nice {LOOP_NICE} refused: {e}); under CPU overload its verdicts may come late",
                current()
            );
            format!(", autogroup left at nice {} (nice {LOOP_NICE} refused: {e})", current())
        }
    }
}

/// What is logged (once) and shown of the outcome of [`try_raise`].
fn said(r: std::io::Result<()>) -> String {
    match r {
        Ok(()) => format!("loop at nice {LOOP_NICE}"),
        Err(e) => {
            tracing::warn!(
                "the broker's loop runs at normal priority (nice {LOOP_NICE} refused: {e}); under CPU overload its verdicts may come late"
            );
            format!("loop at normal priority (nice {LOOP_NICE} refused: {e})")
        }
    }
}

fn try_raise(off: bool) -> std::io::Result<()> {
    if off {
        return Err(std::io::Error::other("VIGIL_LOOP_NO_NICE is set"));
    }
    let p = libc::sched_param { sched_priority: 0 };
    // SAFETY: sched_setscheduler on pid 0 (the calling thread) with a valid sched_param we own.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_OTHER | libc::SCHED_RESET_ON_FORK, &p) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    // SAFETY: setpriority on this thread's own id (Linux applies PRIO_PROCESS to one thread).
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, LOOP_NICE) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    /// Nice of thread `tid` of this process, from /proc.
    fn nice_of(tid: i32) -> i32 {
        let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).expect("stat");
        // Field 19 (nice) counted after the command's closing parenthesis.
        let rest = &stat[stat.rfind(')').expect("comm") + 2..];
        rest.split(' ').nth(16).expect("nice").parse().expect("number")
    }

    #[test]
    fn the_autogroup_is_raised_only_when_on_and_the_broker_leads_its_session() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = dir.path().join("autogroup");
        std::fs::write(&f, "/autogroup-7 nice 0\n").unwrap();
        // Off, or a kernel without autogroups: nothing said, nothing written.
        assert_eq!(super::autogroup(Some("0\n"), true, &f), "");
        assert_eq!(super::autogroup(None, true, &f), "");
        // On, but the group is the user's whole session: left, and said.
        assert_eq!(super::autogroup(Some("1\n"), false, &f), ", autogroup left at nice 0 (shared with its session)");
        assert_eq!(std::fs::read_to_string(&f).unwrap(), "/autogroup-7 nice 0\n");
        // On, and the broker leads its session: the group's nice is written.
        assert_eq!(super::autogroup(Some("1\n"), true, &f), ", autogroup nice -10");
        assert_eq!(std::fs::read_to_string(&f).unwrap().trim(), "-10");
        // A refusal is said with the group's nice as it stays.
        let gone = dir.path().join("no/such/autogroup");
        let said = super::autogroup(Some("1"), true, &gone);
        assert!(said.starts_with(", autogroup left at nice ? (nice -10 refused: "), "{said}");
    }

    #[test]
    fn a_loop_left_at_normal_priority_says_why() {
        std::thread::spawn(|| {
            let said = super::said(super::try_raise(true));
            assert!(said.contains("normal priority") && said.contains("VIGIL_LOOP_NO_NICE"), "{said}");
            // SAFETY: gettid has no preconditions.
            assert_eq!(nice_of(unsafe { libc::gettid() }), 0);
        })
        .join()
        .expect("test thread");
    }

    #[test]
    fn the_loop_is_raised_and_what_it_starts_runs_at_normal_priority() {
        std::thread::spawn(|| {
            let said = super::raise_loop();
            // SAFETY: gettid has no preconditions.
            let me = unsafe { libc::gettid() };
            if !said.contains("refused") {
                assert_eq!(nice_of(me), super::LOOP_NICE, "{said}");
            } else {
                eprintln!("not privileged here: {said}");
                return;
            }
            // A thread it starts, and a process.
            // SAFETY: gettid has no preconditions.
            let child = std::thread::spawn(|| nice_of(unsafe { libc::gettid() })).join().expect("thread");
            assert_eq!(child, 0, "a thread started by the loop");
            let out = std::process::Command::new("sh").arg("-c").arg("cut -d' ' -f19 /proc/self/stat").output();
            let n: i32 = String::from_utf8_lossy(&out.expect("sh").stdout).trim().parse().expect("nice");
            assert_eq!(n, 0, "a process started by the loop");
        })
        .join()
        .expect("test thread");
    }
}
