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

/// The nice value the detector owner's loop runs at.
pub(super) const LOOP_NICE: i32 = -10;

/// Raise the calling thread (the broker's loop) to [`LOOP_NICE`], its children reset to normal priority. Returns
/// what `vigil overlay status` says about it.
pub(super) fn raise_loop() -> String {
    said(try_raise(std::env::var_os("VIGIL_LOOP_NO_NICE").is_some()))
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
