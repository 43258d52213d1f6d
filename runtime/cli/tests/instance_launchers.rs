//! Vigil started by other launchers (issue 18): `vigil broker` run as the tasks of MPICH's hydra or of Slurm's
//! `srun --mpi=pmi2` forms an instance across them through PMI-1 or PMI-2, rank 0 runs the command after `--`,
//! and its exit code comes back.

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
    hydra_with(n, &[], args)
}

/// [`hydra`] with environment `env` given to the brokers.
fn hydra_with(n: u32, env: &[(&str, &str)], args: &[&str]) -> (Output, Vec<String>) {
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
    c.envs(env.iter().copied());
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

/// The 8 `task T on B` lines of a job of 8 tasks on 4 brokers, two on each: what is missing, or nothing.
fn two_tasks_on_each_of_4(o: &Output) -> Result<(), String> {
    let tasks: Vec<&str> = o.stdout.lines().filter(|l| l.starts_with("task ")).collect();
    if tasks.len() != 8 {
        return Err(format!("{} task lines, not 8", tasks.len()));
    }
    for b in 0..4 {
        let n = tasks.iter().filter(|l| l.ends_with(&format!(" on {b}"))).count();
        if n != 2 {
            return Err(format!("{n} tasks on broker {b}, not 2"));
        }
    }
    Ok(())
}

const EIGHT_TASKS: [&str; 7] =
    ["vigil", "run", "-N4", "-n8", "sh", "-c", "echo task $VIGIL_TASK_RANK on $VIGIL_BROKER_RANK"];

/// Either protocol can be forced (`VIGIL_PMI`); hydra serves both.
#[test]
fn hydra_bootstraps_through_pmi1_or_pmi2_when_told_to() {
    for wire in ["pmi1", "pmi2"] {
        let (o, _) = hydra_with(4, &[("VIGIL_PMI", wire)], &EIGHT_TASKS);
        assert_eq!(o.code, 0, "VIGIL_PMI={wire}: {}", o.dump());
        two_tasks_on_each_of_4(&o).unwrap_or_else(|e| panic!("VIGIL_PMI={wire}: {e}: {}", o.dump()));
    }
    let (o, _) = hydra_with(2, &[("VIGIL_PMI", "pmi3")], &["true"]);
    assert_ne!(o.code, 0, "{}", o.dump());
    assert!(o.stderr.contains("VIGIL_PMI=pmi3: expected pmi1, pmi2 or auto"), "{}", o.dump());
}

/// `ci/slurm-cluster.sh` of this repository.
fn slurm_script() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../ci/slurm-cluster.sh")
}

/// A one-node Slurm cluster of its own (`ci/slurm-cluster.sh`), stopped when dropped.
struct Slurm {
    dir: tempfile::TempDir,
}

impl Slurm {
    /// Started, or `None` with the reason printed where this machine cannot run one (not root, no slurm-wlm or
    /// munge: `ci/setup.sh` installs them).
    fn up() -> Option<Slurm> {
        let dir = tempdir();
        let o = std::process::Command::new(slurm_script())
            .args(["up", dir.path().to_str().unwrap()])
            .output()
            .expect("ci/slurm-cluster.sh");
        match o.status.code() {
            Some(0) => Some(Slurm { dir }),
            Some(3) => {
                eprintln!("Slurm tests skipped: {}", String::from_utf8_lossy(&o.stderr).trim());
                None
            }
            _ => panic!(
                "ci/slurm-cluster.sh up failed:\n{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            ),
        }
    }

    /// `srun --overcommit -n N --mpi=pmi2 vigil broker -- ARGS...` (environment `env` added), in a fresh directory.
    fn srun(&self, n: u32, env: &[(&str, &str)], args: &[&str]) -> Output {
        let work = tempdir();
        let mut c = Command::new("srun");
        c.args(["--overcommit", "-n", &n.to_string(), "--mpi=pmi2", vigil_bin(), "broker", "--"])
            .args(args)
            .env("SLURM_CONF", self.dir.path().join("slurm.conf"))
            .env("TMPDIR", work.path())
            .env("PATH", path_env())
            .current_dir(work.path());
        for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("VIGIL_") || k.starts_with("SLURM_")) {
            c.env_remove(k);
        }
        c.envs(env.iter().copied());
        let o = run(c, Duration::from_secs(90), Some(work.path()));
        kill_marked(work.path());
        o
    }
}

impl Drop for Slurm {
    fn drop(&mut self) {
        let _ = std::process::Command::new(slurm_script()).args(["down", self.dir.path().to_str().unwrap()]).status();
    }
}

/// `srun --mpi=pmi2 -n 4 vigil broker -- CMD`: the brokers bootstrap through Slurm's PMI-2 server (and through
/// its PMI-1 one when told to), run a job on every broker, and the command's exit code is srun's.
#[test]
fn slurm_srun_pmi2_launches_an_instance_that_runs_a_job_on_every_broker() {
    let Some(slurm) = Slurm::up() else { return };
    for env in [&[][..], &[("VIGIL_PMI", "pmi1")][..]] {
        let o = slurm.srun(4, env, &EIGHT_TASKS);
        assert_eq!(o.code, 0, "{env:?}: {}", o.dump());
        two_tasks_on_each_of_4(&o).unwrap_or_else(|e| panic!("{env:?}: {e}: {}", o.dump()));
    }
    let o = slurm.srun(2, &[], &["sh", "-c", "vigil getattr size; exit 7"]);
    assert_eq!(o.code, 7, "{}", o.dump());
    assert_eq!(o.stdout.lines().next(), Some("2"), "{}", o.dump());
}
