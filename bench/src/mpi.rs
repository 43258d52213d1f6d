//! `vigil-bench mpi`: MPI launch latency and nested-instance (alloc) start-up.
//!
//! (a) Wall time of `vigil run -N4 -n8 ./hello` (examples/mpi/hello.c built with `mpicc`) inside a running
//!     4-broker `vigil start --test-size=4` instance, against `mpiexec.hydra -launcher fork -n 8 ./hello` run
//!     directly on the same machine, outside any Vigil instance, in the same benchmark run. Hydra's runs are
//!     split in two halves, before and after the Vigil instance, so slow drift of the machine's load hits both.
//! (b) Wall time of `vigil alloc -N4 true` inside a 4-broker instance: submit, start a 4-broker child
//!     instance, run `true` in it, shut it down, and wait until the alloc job is inactive.
//!
//! Both Vigil measurements are taken by `vigil-bench inner mpi`, started as the instance's initial program.
//! Every run's output is checked (8 distinct ranks of 8, exit code 0); a wrong output fails the metric.

use crate::{
    find_vigil, last_line, now_epoch_s, r4, results_dir, run_captured, scratch_file, summarize, vigil_version,
    write_results, Captured,
};
use crate::{run_timed, Ended};
use clap::Args;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Default timed runs per metric (the brief asks for at least 10).
pub(crate) const DEFAULT_RUNS: usize = 20;
/// MPI ranks of the hello job.
const RANKS: usize = 8;
/// Nodes (brokers) of the instance and of the alloc.
const NODES: u32 = 4;
/// How long one launch (either launcher) or one alloc may take before it counts as hung.
const LAUNCH_TIMEOUT_S: u64 = 60;
/// How long the whole instance running the inner harness may take.
const INSTANCE_TIMEOUT_S: u64 = 900;

/// Options of `vigil-bench mpi`.
#[derive(Args, Debug)]
pub(crate) struct MpiArgs {
    /// Timed runs per metric (at least 10), each after one untimed warm-up.
    #[arg(long, default_value_t = DEFAULT_RUNS)]
    pub(crate) runs: usize,
}

/// Options of the hidden `vigil-bench inner mpi`.
#[derive(Args, Debug)]
pub(crate) struct InnerMpiArgs {
    /// Timed runs of each measurement.
    #[arg(long)]
    runs: usize,
    /// The `vigil` binary.
    #[arg(long)]
    vigil: PathBuf,
    /// Directory holding the compiled `hello` (the working directory of the runs).
    #[arg(long)]
    dir: PathBuf,
    /// File receiving the JSON results.
    #[arg(long)]
    out: PathBuf,
}

/// Results of `vigil-bench inner mpi`, passed back to the outer harness as JSON.
#[derive(Serialize, Deserialize, Debug, Default)]
struct InnerMpiResult {
    /// Wall time of each timed `vigil run -N4 -n8 ./hello`, seconds.
    run_s: Vec<f64>,
    /// Wall time of each timed `vigil alloc -N4 true`, seconds.
    alloc_s: Vec<f64>,
    /// Error of the `vigil run` measurement, if any.
    run_error: Option<String>,
    /// Error of the `vigil alloc` measurement, if any.
    alloc_error: Option<String>,
}

/// Check the output of an 8-rank hello: exactly ranks 0..8, each saying "of 8".
fn check_hello(stdout: &str) -> Result<(), String> {
    let mut seen = [false; RANKS];
    let mut lines = 0;
    for l in stdout.lines().filter(|l| l.starts_with("hello from rank ")) {
        lines += 1;
        let w: Vec<&str> = l.split_whitespace().collect();
        let rank: usize = w.get(3).and_then(|r| r.parse().ok()).ok_or_else(|| format!("malformed line {l:?}"))?;
        if w.get(5).copied() != Some(&RANKS.to_string()) || rank >= RANKS || seen[rank] {
            return Err(format!("unexpected line {l:?}"));
        }
        seen[rank] = true;
    }
    if lines != RANKS {
        return Err(format!(
            "{lines} hello lines instead of {RANKS}: {:?}",
            stdout.lines().take(10).collect::<Vec<_>>()
        ));
    }
    Ok(())
}

/// Run `cmd` (in `dir`) once, check its exit status (and its hello output if `hello`), return its wall time.
fn time_launch(mut cmd: Command, dir: &Path, what: &str, hello: bool) -> Result<f64, String> {
    cmd.current_dir(dir);
    match run_captured(cmd, Duration::from_secs(LAUNCH_TIMEOUT_S))? {
        Captured::Exited { status, elapsed_s, stdout, stderr } => {
            if !status.success() {
                return Err(format!("`{what}` failed: {status}: {}", last_line(&stderr)));
            }
            if hello {
                check_hello(&stdout).map_err(|e| format!("`{what}`: {e}"))?;
            }
            Ok(elapsed_s)
        }
        Captured::TimedOut => Err(format!("`{what}` hung: killed after {LAUNCH_TIMEOUT_S} s")),
    }
}

/// `n` timed runs of `make()` after `warmup` untimed ones; the samples so far and the first error.
fn sample(n: usize, warmup: usize, mut once: impl FnMut() -> Result<f64, String>) -> (Vec<f64>, Option<String>) {
    let mut v = Vec::new();
    for i in 0..warmup + n {
        match once() {
            Ok(s) if i >= warmup => v.push(s),
            Ok(_) => {}
            Err(e) => return (v, Some(e)),
        }
    }
    (v, None)
}

/// The hydra command line as measured.
const HYDRA_CMD: &str = "mpiexec.hydra -launcher fork -n 8 ./hello";
/// The Vigil command line as measured.
const VIGIL_RUN_CMD: &str = "vigil run -N4 -n8 ./hello";
/// The alloc command line as measured.
const ALLOC_CMD: &str = "vigil alloc -N4 true";

/// One hydra launch of the hello in `dir`.
fn hydra_once(dir: &Path) -> Result<f64, String> {
    let mut cmd = Command::new("mpiexec.hydra");
    cmd.args(["-launcher", "fork", "-n", &RANKS.to_string(), "./hello"]);
    // Nothing of a Vigil instance may leak into hydra's world (this harness is not run inside one, but be sure).
    for k in ["VIGIL_URI", "PMI_FD", "PMI_RANK", "PMI_SIZE", "PMI_SPAWNED"] {
        cmd.env_remove(k);
    }
    time_launch(cmd, dir, HYDRA_CMD, true)
}

/// Compile examples/mpi/hello.c into `dir/hello`.
fn build_hello(dir: &Path) -> Result<(), String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/mpi/hello.c");
    let out = Command::new("mpicc")
        .arg("-O2")
        .arg("-o")
        .arg(dir.join("hello"))
        .arg(&src)
        .output()
        .map_err(|e| format!("cannot run mpicc (install an MPI, e.g. mpich): {e}"))?;
    if !out.status.success() {
        return Err(format!("mpicc {} failed: {}", src.display(), last_line(&String::from_utf8_lossy(&out.stderr))));
    }
    Ok(())
}

/// A summary of samples as JSON (median, min, max, rounded to 0.1 ms) plus the samples.
fn series_json(v: &[f64], error: &Option<String>) -> Value {
    let (median, min, max) = summarize(v);
    json!({
        "samples": v.iter().copied().map(r4).collect::<Vec<_>>(),
        "median": median.map(r4), "min": min.map(r4), "max": max.map(r4),
        "error": error,
    })
}

/// Table cell of a value in seconds.
fn cell(v: Option<f64>) -> String {
    v.map(|x| format!("{x:.3}")).unwrap_or_else(|| "-".into())
}

/// Table cell of a median: "FAILED" when there is an error.
fn median_cell(v: &[f64], error: &Option<String>) -> String {
    let (m, _, _) = summarize(v);
    match (error, m) {
        (Some(_), None) => "FAILED".into(),
        (Some(_), m) => format!("{} (FAILED)", cell(m)),
        (None, m) => cell(m),
    }
}

/// `vigil-bench mpi`: measure, print the table, write bench/results/mpi.{json,md}.
pub(crate) fn run(a: &MpiArgs, vigil: Option<PathBuf>, out_dir: Option<PathBuf>) -> Result<i32, String> {
    if a.runs < 10 {
        eprintln!("vigil-bench: warning: --runs {} is below the 10 runs the published table uses", a.runs);
    }
    if a.runs == 0 {
        return Err("--runs must be at least 1".into());
    }
    let vigil = find_vigil(vigil)?;
    let out_dir = results_dir(out_dir);
    let dir = std::env::temp_dir().join(format!("vigil-bench-mpi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let r = measure(a.runs, &vigil, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    let m = r?;

    let (hydra_med, hydra_min, hydra_max) = summarize(&m.hydra_s);
    let (run_med, run_min, run_max) = summarize(&m.inner.run_s);
    let (_, alloc_min, alloc_max) = summarize(&m.inner.alloc_s);
    let ratio = match (hydra_med, run_med, &m.hydra_error, &m.inner.run_error) {
        (Some(h), Some(v), None, None) if v > 0.0 => Some(h / v),
        _ => None,
    };
    let mut table = String::from(
        "| metric | runs | vigil median | min | max | reference (same machine, same run) | ref. median | ref. min | ref. max | ratio |\n\
         |---|---:|---:|---:|---:|---|---:|---:|---:|---:|\n",
    );
    table.push_str(&format!(
        "| `{VIGIL_RUN_CMD}` launch latency, 4-broker instance (s) | {} | {} | {} | {} | `{HYDRA_CMD}`, outside Vigil | {} | {} | {} | {} |\n",
        m.inner.run_s.len(),
        median_cell(&m.inner.run_s, &m.inner.run_error),
        cell(run_min),
        cell(run_max),
        if m.hydra_error.is_some() { "FAILED".into() } else { cell(hydra_med) },
        cell(hydra_min),
        cell(hydra_max),
        ratio.map(|r| format!("{r:.1}x")).unwrap_or_else(|| "-".into()),
    ));
    table.push_str(&format!(
        "| `{ALLOC_CMD}` wall time, 4-broker instance (s) | {} | {} | {} | {} | `flux alloc -N4 true`: flux-core not installed here | - | - | - | - |\n",
        m.inner.alloc_s.len(),
        median_cell(&m.inner.alloc_s, &m.inner.alloc_error),
        cell(alloc_min),
        cell(alloc_max),
    ));
    let errors: Vec<(&str, &String)> =
        [("hydra", &m.hydra_error), ("vigil run", &m.inner.run_error), ("vigil alloc", &m.inner.alloc_error)]
            .into_iter()
            .filter_map(|(k, e)| e.as_ref().map(|e| (k, e)))
            .collect();
    println!("{table}");
    for (k, e) in &errors {
        eprintln!("vigil-bench: FAILED {k}: {e}");
    }

    let version = vigil_version(&vigil);
    let hydra_version = Command::new("mpiexec.hydra")
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .find(|l| l.contains("Version"))
                .map(|l| l.split_whitespace().last().unwrap_or("").to_string())
        })
        .unwrap_or_default();
    let ncpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let now_s = now_epoch_s().floor();
    let doc = json!({
        "benchmark": "vigil-bench mpi",
        "vigil_version": version,
        "hydra_version": hydra_version,
        "runs": a.runs,
        "unix_time_s": now_s,
        "cpus": ncpus,
        "mpi_hello_launch": {
            "vigil": {"command": VIGIL_RUN_CMD, "instance": "vigil start --test-size=4", "series": series_json(&m.inner.run_s, &m.inner.run_error)},
            "hydra": {"command": HYDRA_CMD, "where": "directly, outside any Vigil instance; half the runs before and half after the instance", "series": series_json(&m.hydra_s, &m.hydra_error)},
            "ratio_hydra_over_vigil": ratio.map(|r| (r * 100.0).round() / 100.0),
        },
        "alloc": {
            "vigil": {"command": ALLOC_CMD, "instance": "vigil start --test-size=4", "series": series_json(&m.inner.alloc_s, &m.inner.alloc_error)},
            "reference": "flux alloc -N4 true: flux-core is not installed on this machine, so no ratio",
        },
    });
    let mut md = format!(
        "# MPI launch and alloc\n\n`vigil-bench mpi --runs {}` ({version}, MPICH hydra {hydra_version}, {ncpus} CPUs, unix time {now_s}). \
         Medians, min and max over {} timed runs each after one warm-up, measured in the same run. \
         Ratio = hydra median / vigil median (>1: Vigil launches faster). Every run's output is checked: \
         8 distinct ranks of 8.\n\n{table}\n\
         The flux-core reference for alloc (`flux alloc -N4 true`) is not installed on this machine, so that row has no ratio.\n",
        a.runs, a.runs
    );
    if !errors.is_empty() {
        md.push_str("\nFailures:\n\n");
        for (k, e) in &errors {
            md.push_str(&format!("- {k}: {e}\n"));
        }
    }
    write_results(&out_dir, "mpi", &doc, &md)?;
    Ok(if errors.is_empty() { 0 } else { 1 })
}

/// Everything `mpi` measured.
struct Measured {
    /// Hydra wall times.
    hydra_s: Vec<f64>,
    /// Why hydra could not be measured (fully).
    hydra_error: Option<String>,
    /// Vigil's figures, from the inner harness.
    inner: InnerMpiResult,
}

/// Build the hello, time hydra (two halves) around one 4-broker instance running the inner harness.
fn measure(runs: usize, vigil: &Path, dir: &Path) -> Result<Measured, String> {
    build_hello(dir)?;
    let first = runs.div_ceil(2);
    eprintln!("vigil-bench: {HYDRA_CMD} ({first} runs + 1 warm-up)");
    let (mut hydra_s, mut hydra_error) = sample(first, 1, || hydra_once(dir));

    eprintln!(
        "vigil-bench: {VIGIL_RUN_CMD} and {ALLOC_CMD} in a {NODES}-broker instance ({runs} runs + 1 warm-up each)"
    );
    let out = scratch_file("mpi");
    let me = std::env::current_exe().map_err(|e| format!("cannot locate this binary: {e}"))?;
    let mut cmd = Command::new(vigil);
    cmd.arg("start").arg(format!("--test-size={NODES}")).arg(&me).args(["inner", "mpi"]);
    cmd.arg(format!("--runs={runs}")).arg("--vigil").arg(vigil).arg("--dir").arg(dir).arg("--out").arg(&out);
    let ended = run_timed(cmd, Duration::from_secs(INSTANCE_TIMEOUT_S))?;
    let mut inner: InnerMpiResult = match std::fs::read_to_string(&out) {
        Ok(s) => serde_json::from_str(&s).map_err(|e| format!("bad inner results in {}: {e}", out.display()))?,
        Err(_) => InnerMpiResult { run_error: Some("the inner harness wrote no results".into()), ..Default::default() },
    };
    let _ = std::fs::remove_file(&out);
    let instance_err = match ended {
        Ended::Exited { status, .. } if !status.success() => {
            Some(format!("instance running the inner harness failed: {status}"))
        }
        Ended::TimedOut => {
            Some(format!("instance running the inner harness hung: killed after {INSTANCE_TIMEOUT_S} s"))
        }
        Ended::Exited { .. } => None,
    };
    if let Some(e) = instance_err {
        if inner.run_error.is_none() && inner.alloc_error.is_none() {
            inner.alloc_error = Some(e);
        }
    }

    if hydra_error.is_none() {
        eprintln!("vigil-bench: {HYDRA_CMD} ({} more runs)", runs - first);
        let (more, err) = sample(runs - first, 0, || hydra_once(dir));
        hydra_s.extend(more);
        hydra_error = err;
    }
    Ok(Measured { hydra_s, hydra_error, inner })
}

/// `vigil-bench inner mpi`: time `vigil run -N4 -n8 ./hello`, then `vigil alloc -N4 true`; write the results.
pub(crate) fn inner_mpi(a: InnerMpiArgs) -> i32 {
    let mut res = InnerMpiResult::default();
    if std::env::var(vigil::client::URI_ENV).is_err() {
        res.run_error = Some("VIGIL_URI is not set: run me inside `vigil start`".into());
    } else {
        let (v, e) = sample(a.runs, 1, || {
            let mut cmd = Command::new(&a.vigil);
            cmd.arg("run").arg(format!("-N{NODES}")).arg(format!("-n{RANKS}")).arg("./hello");
            time_launch(cmd, &a.dir, VIGIL_RUN_CMD, true)
        });
        res.run_s = v;
        res.run_error = e;
        let (v, e) = sample(a.runs, 1, || {
            let mut cmd = Command::new(&a.vigil);
            cmd.arg("alloc").arg(format!("-N{NODES}")).arg("true");
            time_launch(cmd, &a.dir, ALLOC_CMD, false)
        });
        res.alloc_s = v;
        res.alloc_error = e;
    }
    for e in [&res.run_error, &res.alloc_error].into_iter().flatten() {
        eprintln!("vigil-bench inner: {e}");
    }
    let ok = res.run_error.is_none() && res.alloc_error.is_none();
    crate::write_inner_result(&a.out, &res, ok)
}
