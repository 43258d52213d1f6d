//! Job containment (issue 18): a cgroup v2 per job shell, so that nothing a job started outlives it (not even a
//! `setsid`'d process), its CPU time recorded; process groups when cgroups are off, and said so.

mod common;

use common::*;
use std::time::Duration;

/// Processes whose command line is exactly `sleep ARG`.
fn sleeps(arg: &str) -> Vec<i32> {
    let want = format!("sleep\0{arg}\0");
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|p| std::fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|c| c == want.as_bytes()))
        .collect()
}

/// The `jobs contained by:` line of `vigil uptime`.
fn containment(inst: &Instance) -> String {
    let u = inst.vigil(&["uptime"]);
    u.ok();
    u.stdout.lines().find_map(|l| l.trim().strip_prefix("jobs contained by: ")).unwrap_or_default().to_string()
}

fn cgroups_here() -> bool {
    nix::unistd::geteuid().is_root() && std::path::Path::new("/proc/self/cgroup").exists()
}

#[test]
fn a_task_that_calls_setsid_does_not_outlive_its_job() {
    setsid_task_does_not_outlive_its_job(&[], "613");
}

/// The same where shells are moved into their cgroup after start (a kernel before 5.7, or not x86_64), which is
/// said in `vigil uptime`.
#[test]
fn a_task_that_calls_setsid_does_not_outlive_its_job_when_shells_are_moved_in() {
    setsid_task_does_not_outlive_its_job(&["exec.cgroup-spawn=move"], "614");
}

fn setsid_task_does_not_outlive_its_job(attrs: &[&str], tag: &str) {
    if !cgroups_here() {
        eprintln!("skipped: needs root for a cgroup v2 of its own");
        return;
    }
    let inst = Instance::start(2, attrs);
    let how = containment(&inst);
    assert!(how.starts_with("cgroup2 ("), "{how}");
    assert_eq!(how.contains("shells moved in after start: exec.cgroup-spawn=move"), !attrs.is_empty(), "{how}");
    // Where the shell is created in its cgroup, so is every task: the job's own view says which cgroup it is in.
    let r = inst.vigil(&["run", "-N2", "sh", "-c", "grep ^0:: /proc/self/cgroup"]);
    r.ok();
    assert_eq!(r.stdout.lines().filter(|l| l.contains("/job-")).count(), 2, "{}", r.stdout);
    // Ends normally, with a session of its own left in the background.
    let r =
        inst.vigil(&["run", "-N2", "sh", "-c", &format!("setsid sleep {tag}.25 </dev/null >/dev/null 2>&1 & echo ok")]);
    r.ok();
    assert!(
        wait_for(Duration::from_secs(5), || sleeps(&format!("{tag}.25")).is_empty()),
        "left behind: {:?}",
        sleeps(&format!("{tag}.25"))
    );
    // Canceled while running.
    let o = inst.vigil(&[
        "submit",
        "-N2",
        "sh",
        "-c",
        &format!("setsid sleep {tag}.5 </dev/null >/dev/null 2>&1 & sleep 300"),
    ]);
    o.ok();
    let id = o.stdout.trim().to_string();
    assert!(
        wait_for(Duration::from_secs(10), || sleeps(&format!("{tag}.5")).len() == 2),
        "{:?}",
        sleeps(&format!("{tag}.5"))
    );
    inst.vigil(&["cancel", &id]).ok();
    inst.vigil_t(&["job", "wait", &id], Duration::from_secs(30));
    assert!(
        wait_for(Duration::from_secs(5), || sleeps(&format!("{tag}.5")).is_empty()),
        "left behind: {:?}",
        sleeps(&format!("{tag}.5"))
    );
    // The job's CPU time, from its cgroups, in its record and its finish event.
    let o = inst.vigil(&["submit", "-N2", "sh", "-c", "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done"]);
    o.ok();
    let id = o.stdout.trim().to_string();
    inst.vigil(&["job", "wait", &id]).ok();
    let info = inst.job_info(&id)["info"].clone();
    let cpu = info["usage"]["cpu_usec"].as_u64().unwrap_or(0);
    assert!(cpu > 0, "{info}");
    assert!(info["usage"]["cpu_user_usec"].as_u64().is_some_and(|u| u <= cpu), "{info}");
    // The brokers' cgroups go with them.
    // "cgroup2 (PATH; memory limits ...)"
    let dir =
        how.trim_start_matches("cgroup2 (").split(';').next().unwrap_or_default().trim_end_matches(')').to_string();
    assert!(std::path::Path::new(&dir).is_dir(), "{dir}");
    inst.stop_with(0).0.code_is(0);
    assert!(!std::path::Path::new(&dir).exists(), "{dir} left behind");
}

#[test]
fn process_groups_when_cgroups_are_off_and_said_so() {
    let inst = Instance::start(2, &["exec.containment=pgroup"]);
    assert_eq!(containment(&inst), "process groups (exec.containment=pgroup)");
    inst.vigil(&["run", "-N2", "true"]).ok();
    let o = inst.vigil(&["submit", "true"]);
    o.ok();
    let id = o.stdout.trim().to_string();
    inst.vigil(&["job", "wait", &id]).ok();
    assert!(inst.job_info(&id)["info"]["usage"].is_null(), "no cgroup, no usage: {}", inst.job_info(&id));
    // A bad value is refused before any broker starts, naming the attribute.
    let dir = tempdir();
    let mut c = vigil_cmd(dir.path());
    c.args(["start", "--test-size=1", "-S", "exec.containment=jail", "true"]);
    let o = run(c, Duration::from_secs(20), Some(dir.path()));
    assert_ne!(o.code, 0, "{}", o.dump());
    assert!(o.stderr.contains("exec.containment"), "{}", o.dump());
}

/// `-o memory=SIZE` where it cannot be applied (process groups; or a cgroup2 without the memory controller, as on
/// this machine's hybrid layout): the job runs, its stderr says why on each node, `vigil uptime` says whether limits
/// are available; a bad size is refused at submit, naming the option. (Limits that apply, and the OOM reports, are
/// tested where a full cgroup v2 exists: `ci/memory-cgroup-test.sh` in the soft-RoCE VM.)
#[test]
fn a_memory_limit_that_cannot_be_applied_is_said_and_the_job_runs() {
    for attrs in [&["exec.containment=pgroup"][..], &[][..]] {
        let inst = Instance::start(2, attrs);
        let how = containment(&inst);
        let o = inst.vigil(&["run", "-N2", "-o", "memory=64M", "echo", "ran"]);
        o.ok();
        assert_eq!(o.stdout.matches("ran").count(), 2, "{}", o.dump());
        if how.contains("memory limits available") {
            assert!(!o.stderr.contains("not applied"), "{}", o.dump());
            continue;
        }
        for rank in 0..2 {
            assert!(
                o.stderr.lines().any(|l| l.starts_with("vigil-shell: memory=64M not applied on ")
                    && l.contains(&format!("(rank {rank}): "))),
                "{attrs:?}: no note for rank {rank}: {}",
                o.dump()
            );
        }
        if attrs.is_empty() && how.starts_with("cgroup2 (") {
            assert!(how.contains("no memory limits: "), "{how}");
        }
        let bad = inst.vigil(&["run", "-o", "memory=lots", "true"]);
        assert_ne!(bad.code, 0, "{}", bad.dump());
        assert!(bad.stderr.contains("-o memory=lots: 'lots' is not a size"), "{}", bad.dump());
    }
}

/// A broker killed with `kill -9` takes its jobs' cgroups with it: the job shell, left without its broker, kills
/// its whole cgroup, so a `setsid`'d process of the job does not live on until some later broker cleans up.
#[test]
fn a_setsid_process_does_not_outlive_its_broker_killed_with_sigkill() {
    if !cgroups_here() {
        eprintln!("skipped: needs root for a cgroup v2 of its own");
        return;
    }
    let inst = Instance::start(2, &[]);
    let o = inst.vigil(&["submit", "-N2", "sh", "-c", "setsid sleep 613.75 </dev/null >/dev/null 2>&1 & sleep 300"]);
    o.ok();
    let id = o.stdout.trim().to_string();
    assert!(wait_for(Duration::from_secs(10), || sleeps("613.75").len() == 2), "{:?}", sleeps("613.75"));
    let pid = inst.vigil(&["getattr", "-r", "1", "broker.pid"]);
    pid.ok();
    let pid: i32 = pid.stdout.trim().parse().expect("a pid");
    // SAFETY: kill(2) of the broker this test started.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    inst.vigil_t(&["job", "wait", &id], Duration::from_secs(30));
    // Rank 0's job shell goes with the job; rank 1's, with its broker.
    assert!(wait_for(Duration::from_secs(5), || sleeps("613.75").is_empty()), "left behind: {:?}", sleeps("613.75"));
}
