//! Vigil started by other launchers (issue 18): `vigil broker` run as the tasks of MPICH's hydra forms an
//! instance across them through PMI-1, rank 0 runs the command after `--`, and its exit code comes back.

mod common;

use common::*;
use std::process::Command;
use std::time::Duration;

/// `mpiexec.hydra -launcher fork -n N vigil broker -- ARGS...` in `dir` (its TMPDIR).
fn hydra_cmd(dir: &std::path::Path, n: u32, args: &[&str]) -> Command {
    let mut c = Command::new("mpiexec.hydra");
    c.args(["-launcher", "fork", "-n", &n.to_string(), vigil_bin(), "broker", "--"])
        .args(args)
        .env("TMPDIR", dir)
        .env("PATH", path_env())
        .current_dir(dir);
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("VIGIL_")) {
        c.env_remove(k);
    }
    c
}

/// Ctrl-C to the launcher reaches the brokers, not the command rank 0 runs (its own process group): rank 0 hands
/// it on, so `vigil run` cancels its job instead of the job running to its end (60 s).
#[test]
fn ctrl_c_to_hydra_reaches_the_initial_program() {
    let dir = tempdir();
    let r = spawn(hydra_cmd(dir.path(), 2, &["vigil", "run", "-N2", "sleep", "60"]), Some(dir.path()));
    std::thread::sleep(Duration::from_secs(3));
    // SAFETY: kill(2) of the launcher we spawned.
    unsafe { libc::kill(r.pid() as i32, libc::SIGINT) };
    let o = r.wait(Duration::from_secs(30));
    kill_marked(dir.path());
    assert!(!o.timed_out && o.elapsed < Duration::from_secs(25), "ran on after Ctrl-C: {}", o.dump());
    assert!(o.stderr.contains("interrupted by user"), "the job was canceled: {}", o.dump());
    // (What mpiexec.hydra then exits with is its own business: 0 here after a forwarded Ctrl-C.)
}

/// `mpiexec.hydra -launcher fork -n N vigil broker -- ARGS...` in a fresh directory (its TMPDIR); the output and
/// what it left in that directory.
fn hydra(n: u32, args: &[&str]) -> (Output, Vec<String>) {
    let dir = tempdir();
    let mut c = Command::new("mpiexec.hydra");
    c.args(["-launcher", "fork", "-n", &n.to_string(), vigil_bin(), "broker", "--"])
        .args(args)
        .env("TMPDIR", dir.path())
        .env("PATH", path_env())
        .current_dir(dir.path());
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("VIGIL_")) {
        c.env_remove(k);
    }
    let o = run(c, Duration::from_secs(60), Some(dir.path()));
    kill_marked(dir.path());
    let left = std::fs::read_dir(dir.path())
        .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    (o, left)
}

#[test]
fn hydra_launches_an_instance_that_runs_a_job_on_every_broker() {
    let (o, left) =
        hydra(4, &["vigil", "run", "-N4", "-n8", "sh", "-c", "echo task $VIGIL_TASK_RANK on $VIGIL_BROKER_RANK"]);
    assert_eq!(o.code, 0, "{}", o.dump());
    let mut tasks: Vec<&str> = o.stdout.lines().filter(|l| l.starts_with("task ")).collect();
    tasks.sort_unstable();
    assert_eq!(tasks.len(), 8, "{}", o.dump());
    for b in 0..4 {
        assert_eq!(tasks.iter().filter(|l| l.ends_with(&format!(" on {b}"))).count(), 2, "{}", o.dump());
    }
    assert!(left.iter().all(|f| !f.starts_with("vigil-pmi-")), "run directories left behind: {left:?}");
}

#[test]
fn hydra_returns_the_initial_programs_exit_code() {
    let (o, _) = hydra(2, &["sh", "-c", "vigil getattr size; exit 7"]);
    assert_eq!(o.code, 7, "{}", o.dump());
    assert_eq!(o.stdout.lines().next(), Some("2"), "{}", o.dump());
    // A failed job inside is the initial program's business: its code passes through.
    let (o, _) = hydra(2, &["vigil", "run", "-N2", "false"]);
    assert_eq!(o.code, 1, "{}", o.dump());
}
