//! `vigil-bench`: Vigil's benchmark harness, comparing against flux-core 0.88 figures measured on the same machine.
//!
//! `cargo run --release -p vigil-bench -- [--runs 5] [--vigil PATH]` measures, each over `--runs` runs:
//! 1. the wall time of `vigil start --test-size=N true` for N = 1, 4, 16;
//! 2. the latency of `vigil run -N4 true` inside a running 4-broker instance;
//! 3. the throughput of 200 `true` jobs submitted at once to that instance;
//! 4. the resident memory of the brokers of an idle 4-broker instance.
//!
//! Metrics 2 and 3 are measured by this same binary started as the instance's initial program
//! (`vigil-bench inner jobs ...`, hidden); metric 4 by `vigil-bench inner rss ...`. Each writes its samples
//! as JSON to a file the outer harness names and reads back after the instance has exited.
//!
//! The results are printed as a markdown table and written to `bench/results/first-light.{json,md}`.
//! The exit code is 0 if every metric was measured, 1 otherwise (a failed metric is still recorded, with
//! its error, so a hang or a failed job shows up in the results instead of disappearing).
//!
//! Two more groups are subcommands, each writing `bench/results/<group>.{json,md}`:
//! - `vigil-bench mpi` (module [`mpi`]): launch latency of an 8-rank MPI hello under `vigil run` versus
//!   `mpiexec.hydra` on this machine, and the wall time of `vigil alloc -N4 true`;
//! - `vigil-bench detect` (module [`detect`], root only): failure-detection latencies on network-namespace
//!   nodes (`ci/netns-cluster.sh`), taken from rank 0's own resource and job eventlogs.
//!
//! - `vigil-bench sched` (module [`sched`]): throughput of 200, 10,000 and 64,000 `true` jobs queued at once
//!   and `vigil run` latency, against a one-node Slurm 22.05 cluster started and stopped in the same run.
//!
//! - `vigil-bench metrics-cost` (module [`metrics_cost`]): 10,000-job throughput with rank 0's metrics endpoint
//!   scraped every second against not scraped, alternating in the same run.
//!
//! - `vigil-bench restart` (module [`restart`]): rank 0 killed with SIGKILL and restarted on its state directory,
//!   time to ready at 0, 10,000 and 100,000 kept jobs, and submit throughput with the store on and off.
//!
//! - `vigil-bench uring` (module [`uring`]): an `io_uring` overlay link ([`uring_link`]) against the tokio
//!   (epoll) transport on loopback TCP, RPC round trip and streaming throughput; needs no `vigil` binary.
//!
//! - `vigil-bench auth` (module [`auth`]): authenticated, encrypted overlay links against plain ones, same
//!   harness as `uring`, plus handshake time and, with `--before`, start-up of a plain build against this one.
//!
//! - `vigil-bench ckpt` (module [`ckpt`], root only): the N+1 checkpoint/restart example under a silent node
//!   kill, kill to every rank resumed from its checkpoint, against Slurm 22.05 in the same run.
//!
//! - `vigil-bench fwq` (module [`fwq`]): fixed-work-quanta OS noise on the core it is pinned to, one JSON line;
//!   `bench/probe-cost.sh` runs it on the parent's core.
//!
//! `vigil-bench all` runs first light, then `mpi`, then `detect`.

use clap::{Args, Parser, Subcommand};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

mod auth;
mod ckpt;
mod depsched;
mod detect;
mod fwq;
mod jobcore;
mod metrics_cost;
mod mpi;
mod netswitch;
mod nodekill;
mod restart;
mod sched;
mod sim;
mod tick;
mod uring;
mod uring_link;
mod xdp_hub;

/// Counts live heap bytes for `vigil-bench jobcore` (a relaxed add per allocation; nothing else measures it).
#[global_allocator]
static ALLOC: jobcore::Counting = jobcore::Counting;

/// flux-core 0.88 reference: `flux start --test-size=1 true` wall time on this machine, seconds.
const REF_START_N1_S: f64 = 0.91;
/// flux-core 0.88 reference: `flux start --test-size=4 true` wall time on this machine, seconds.
const REF_START_N4_S: f64 = 1.43;
/// flux-core 0.88 reference: `flux start --test-size=16 true` wall time on this machine, seconds.
const REF_START_N16_S: f64 = 3.51;
/// flux-core 0.88 reference: latency of `flux run -N4 true` in a 4-broker instance, seconds.
const REF_RUN_N4_LATENCY_S: f64 = 0.27;
/// flux-core 0.88 reference: throughput of 200 `true` jobs submitted at once to a 4-broker instance, jobs/s.
const REF_THROUGHPUT_JOBS_PER_S: f64 = 43.0;
/// flux-core 0.88 reference: VmRSS of one idle broker of a 4-broker instance, MB.
const REF_IDLE_BROKER_RSS_MB: f64 = 18.0;

/// Number of jobs submitted at once in the throughput benchmark.
const THROUGHPUT_JOBS: usize = 200;
/// Number of brokers of the instance used for the latency, throughput and RSS benchmarks.
const INSTANCE_SIZE: u32 = 4;
/// How long one `vigil start --test-size=N true` may take before it counts as hung.
const START_TIMEOUT_S: u64 = 30;
/// How long the instance running the latency and throughput benchmarks may take in total.
const JOBS_INSTANCE_TIMEOUT_S: u64 = 900;
/// How long the instance measuring idle RSS may take.
const RSS_INSTANCE_TIMEOUT_S: u64 = 60;
/// How long the idle instance sits before its brokers' RSS is read, seconds.
const RSS_SETTLE_S: f64 = 1.0;
/// How long `vigil run -N4 true` may take before the latency benchmark gives up.
const RUN_TIMEOUT_S: u64 = 60;

/// Command line of `vigil-bench`.
#[derive(Parser, Debug)]
#[command(name = "vigil-bench", about = "Benchmark Vigil against flux-core 0.88 reference figures")]
struct Cli {
    /// Timed runs per metric (at least 5 for the published table).
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// The `vigil` binary to benchmark (default: `vigil` next to this binary, i.e. target/release/vigil).
    #[arg(long, value_name = "PATH", global = true)]
    vigil: Option<PathBuf>,
    /// Directory receiving the results, `<group>.json` and `<group>.md` (default: bench/results of the source tree).
    #[arg(long, value_name = "DIR", global = true)]
    out_dir: Option<PathBuf>,
    /// Benchmark group to run (default: the first-light table).
    #[command(subcommand)]
    cmd: Option<TopCmd>,
}

/// Subcommands of `vigil-bench`: benchmark groups, and hidden modes for the harness itself.
#[derive(Subcommand, Debug)]
enum TopCmd {
    /// MPI hello launch latency (`vigil run` vs `mpiexec.hydra`) and `vigil alloc -N4 true` wall time.
    Mpi(mpi::MpiArgs),
    /// Job throughput at queue depth (200, 10,000, 64,000) and job latency, Vigil and Slurm in the same run.
    Sched(sched::SchedArgs),
    /// Cost of serving metrics: 10,000-job throughput with rank 0's `/metrics` scraped every second against not
    /// scraped, alternating in the same run.
    MetricsCost(metrics_cost::MetricsCostArgs),
    /// Rank 0 restart to ready (kill -9, restart on its state directory) at 0, 10,000, 100,000 jobs, and submit
    /// throughput with the store on and off.
    Restart(restart::RestartArgs),
    /// Cost per job of the job manager and scheduler at queue depth (200, 10,000, 64,000), in-process: the
    /// sans-IO job core alone and rank 0's broker in the simulator, with heap bytes per queued job.
    Jobcore(jobcore::JobcoreArgs),
    /// Issue 39's scheduler benchmark: 10,000 jobs in 1,000 `afterok` chains of 10, and 10,000 at random
    /// urgencies, against 10,000 plain jobs, in the job core (in-process) and in real instances, same run.
    Depsched(depsched::DepschedArgs),
    /// The N+1 checkpoint/restart example under a silent node kill: time until every rank resumed from its
    /// checkpoint, Vigil and Slurm 22.05 in the same run (needs root).
    Ckpt(ckpt::CkptArgs),
    /// Failure-detection latencies on network-namespace nodes (needs root).
    Detect(detect::DetectArgs),
    /// io_uring vs tokio (epoll) for overlay TCP links: RPC round trip and streaming throughput.
    Uring(uring::UringArgs),
    /// Cost of authenticated, encrypted overlay links against plain ones: round trip, throughput, handshake.
    Auth(auth::AuthArgs),
    /// The deterministic simulator of the real sans-IO broker: N brokers on virtual time, with faults and
    /// invariants (`--json` for one report, `--table` for the committed table).
    Sim(sim::SimArgs),
    /// Fixed-work-quanta OS noise: what else running on this core steals from a compute-bound process.
    Fwq(fwq::FwqArgs),
    /// The floor of a periodic prober: wake every period, send one datagram, report the CPU time that took.
    Tick(tick::TickArgs),
    /// Test-bed switch for `bench/probe-cost.sh PARENT_RX=xdp`: hand probe replies to the parent's port as XDP
    /// frames, as a NIC with native XDP receives them (needs root; runs until killed).
    XdpHub(xdp_hub::XdpHubArgs),
    /// Test-bed switch with seeded delay, jitter and loss between netns nodes (`ci/netns-cluster.sh impair`),
    /// in place of netem, which this machine's kernel lacks (needs root; runs until killed).
    Netswitch(netswitch::NetswitchArgs),
    /// First light, then `mpi`, then `detect`.
    All(AllArgs),
    /// Measurements taken from inside an instance (run as its initial program).
    #[command(hide = true, subcommand)]
    Inner(InnerCmd),
}

/// Options of `vigil-bench all`.
#[derive(Args, Debug)]
struct AllArgs {
    /// Timed runs per first-light metric.
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Timed runs per `mpi` metric.
    #[arg(long, default_value_t = mpi::DEFAULT_RUNS)]
    mpi_runs: usize,
    /// Trials per `detect` measurement.
    #[arg(long, default_value_t = detect::DEFAULT_TRIALS)]
    trials: usize,
}

/// What the inner harness measures.
#[derive(Subcommand, Debug)]
enum InnerCmd {
    /// Latency of `vigil run -N4 true`, then throughput of a burst of `true` jobs.
    Jobs(InnerJobsArgs),
    /// VmRSS of every broker of the (idle) instance.
    Rss(InnerRssArgs),
    /// `vigil run -N4 -n8 ./hello` latency and `vigil alloc -N4 true` wall time.
    Mpi(mpi::InnerMpiArgs),
    /// `vigil run` latencies and one throughput burst for `vigil-bench sched`.
    Sched(sched::InnerSchedArgs),
    /// CPU time of rank 0's broker (the prober) over an idle period.
    ProbeCost(detect::InnerCostArgs),
}

/// Options of `vigil-bench inner jobs`.
#[derive(Args, Debug)]
struct InnerJobsArgs {
    /// Timed runs of each measurement.
    #[arg(long)]
    runs: usize,
    /// The `vigil` binary used for `vigil run`.
    #[arg(long)]
    vigil: PathBuf,
    /// Jobs per throughput burst.
    #[arg(long, default_value_t = THROUGHPUT_JOBS)]
    jobs: usize,
    /// Nodes requested by the latency job (`vigil run -N<nodes> true`).
    #[arg(long, default_value_t = INSTANCE_SIZE)]
    nodes: u32,
    /// File receiving the JSON results.
    #[arg(long)]
    out: PathBuf,
}

/// Options of `vigil-bench inner rss`.
#[derive(Args, Debug)]
struct InnerRssArgs {
    /// Number of brokers expected in the instance.
    #[arg(long)]
    expect: usize,
    /// Seconds to wait after the instance is up before reading RSS.
    #[arg(long, default_value_t = RSS_SETTLE_S)]
    settle_s: f64,
    /// File receiving the JSON results.
    #[arg(long)]
    out: PathBuf,
}

/// Results of `vigil-bench inner jobs`, passed back to the outer harness as JSON.
#[derive(Serialize, Deserialize, Debug, Default)]
struct InnerJobsResult {
    /// Latency of each timed `vigil run -N4 true`, seconds.
    run_latency_s: Vec<f64>,
    /// Jobs per second of each throughput burst (jobs / time from first submit to last INACTIVE).
    throughput_jobs_per_s: Vec<f64>,
    /// Time to get all submit responses of each burst, seconds.
    submit_s: Vec<f64>,
    /// First error met, if any (the samples above are then incomplete).
    error: Option<String>,
}

/// Results of `vigil-bench inner rss`, passed back to the outer harness as JSON.
#[derive(Serialize, Deserialize, Debug, Default)]
struct InnerRssResult {
    /// VmRSS of each broker, MB (1 MB = 1024 kB of /proc/PID/status).
    broker_rss_mb: Vec<f64>,
    /// Error, if the brokers could not be found or read.
    error: Option<String>,
}

/// Which direction of a metric is an improvement.
#[derive(Serialize, Debug, Clone, Copy, PartialEq)]
#[serde(rename_all = "lowercase")]
enum Better {
    /// Smaller is better (times, memory).
    Lower,
    /// Larger is better (throughput).
    Higher,
}

/// One row of the results: samples, their summary, the reference figure and the improvement ratio.
#[derive(Serialize, Debug)]
struct Metric {
    /// Machine name with the unit as suffix, e.g. `start_n4_wall_s`.
    name: String,
    /// Human label for the markdown table.
    label: String,
    /// Unit of the samples (`s`, `jobs/s`, `MB`).
    unit: String,
    /// Which direction is better.
    better: Better,
    /// Raw samples.
    samples: Vec<f64>,
    /// Median of the samples.
    median: Option<f64>,
    /// Smallest sample.
    min: Option<f64>,
    /// Largest sample.
    max: Option<f64>,
    /// flux-core 0.88 figure on this machine.
    flux_088: f64,
    /// Improvement factor over flux-core (>1 means Vigil is better): reference/vigil for lower-is-better
    /// metrics, vigil/reference for throughput.
    ratio: Option<f64>,
    /// Why the metric could not be measured (fully), if so.
    error: Option<String>,
}

impl Metric {
    /// A metric from its samples; computes the summary and ratio.
    fn new(
        name: &str,
        label: &str,
        unit: &str,
        better: Better,
        flux_088: f64,
        samples: Vec<f64>,
        error: Option<String>,
    ) -> Metric {
        let (median, min, max) = summarize(&samples);
        let ratio = median.filter(|m| *m > 0.0).map(|m| match better {
            Better::Lower => flux_088 / m,
            Better::Higher => m / flux_088,
        });
        // Four decimals (0.1 ms, 0.1 kB) are plenty and keep the committed JSON small and diffable.
        let r4 = |x: f64| (x * 1e4).round() / 1e4;
        let samples = samples.into_iter().map(r4).collect();
        let (median, min, max) = (median.map(r4), min.map(r4), max.map(r4));
        let ratio = ratio.map(|x| (x * 100.0).round() / 100.0);
        Metric {
            name: name.into(),
            label: label.into(),
            unit: unit.into(),
            better,
            samples,
            median,
            min,
            max,
            flux_088,
            ratio,
            error,
        }
    }
}

/// Median, min and max of `v` (`None`s when empty).
fn summarize(v: &[f64]) -> (Option<f64>, Option<f64>, Option<f64>) {
    if v.is_empty() {
        return (None, None, None);
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    let median = if n % 2 == 1 { s[n / 2] } else { (s[n / 2 - 1] + s[n / 2]) / 2.0 };
    (Some(median), Some(s[0]), Some(s[n - 1]))
}

fn main() {
    let cli = Cli::parse();
    let report = |r: Result<i32, String>| match r {
        Ok(c) => c,
        Err(e) => {
            eprintln!("vigil-bench: {e}");
            1
        }
    };
    let code = match cli.cmd {
        Some(TopCmd::Inner(InnerCmd::Jobs(a))) => inner_jobs(a),
        Some(TopCmd::Inner(InnerCmd::Rss(a))) => inner_rss(a),
        Some(TopCmd::Inner(InnerCmd::Mpi(a))) => mpi::inner_mpi(a),
        Some(TopCmd::Inner(InnerCmd::Sched(a))) => sched::inner_sched(a),
        Some(TopCmd::Inner(InnerCmd::ProbeCost(a))) => detect::inner_cost(a),
        Some(TopCmd::Mpi(a)) => report(mpi::run(&a, cli.vigil, cli.out_dir)),
        Some(TopCmd::Sched(a)) => report(sched::run(&a, cli.vigil, cli.out_dir)),
        Some(TopCmd::MetricsCost(a)) => report(metrics_cost::run(&a, cli.vigil, cli.out_dir)),
        Some(TopCmd::Restart(a)) => report(restart::run(&a, cli.vigil, cli.out_dir)),
        Some(TopCmd::Jobcore(a)) => report(jobcore::run(&a, cli.out_dir)),
        Some(TopCmd::Depsched(a)) => report(depsched::run(&a, cli.vigil, cli.out_dir)),
        Some(TopCmd::Detect(a)) => report(detect::run(&a, cli.vigil, cli.out_dir)),
        Some(TopCmd::Ckpt(a)) => report(ckpt::run(&a, cli.vigil, cli.out_dir)),
        Some(TopCmd::Uring(a)) => report(uring::run(&a, cli.out_dir)),
        Some(TopCmd::Auth(a)) => report(auth::run(&a, cli.vigil, cli.out_dir)),
        Some(TopCmd::Sim(a)) => std::process::exit(sim::run(&a, cli.out_dir)),
        Some(TopCmd::Fwq(a)) => fwq::run(&a),
        Some(TopCmd::Tick(a)) => tick::run(&a),
        Some(TopCmd::XdpHub(a)) => xdp_hub::run(&a),
        Some(TopCmd::Netswitch(a)) => netswitch::run(&a),
        Some(TopCmd::All(a)) => {
            // Every group runs even if an earlier one failed; the exit code is the worst of the three.
            let first = report(outer(a.runs, cli.vigil.clone(), cli.out_dir.clone()));
            let m = report(mpi::run(&mpi::MpiArgs { runs: a.mpi_runs }, cli.vigil.clone(), cli.out_dir.clone()));
            let d = report(detect::run(
                &detect::DetectArgs { trials: a.trials, ..Default::default() },
                cli.vigil,
                cli.out_dir,
            ));
            first.max(m).max(d)
        }
        None => report(outer(cli.runs, cli.vigil, cli.out_dir)),
    };
    std::process::exit(code);
}

/// The results directory: `--out-dir`, or bench/results of the source tree.
fn results_dir(out_dir: Option<PathBuf>) -> PathBuf {
    out_dir.unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("results"))
}

/// Write `doc` as `<group>.json` and `md` as `<group>.md` in `out_dir`.
fn write_results(out_dir: &Path, group: &str, doc: &Value, md: &str) -> Result<(), String> {
    std::fs::create_dir_all(out_dir).map_err(|e| format!("cannot create {}: {e}", out_dir.display()))?;
    let json_path = out_dir.join(format!("{group}.json"));
    let md_path = out_dir.join(format!("{group}.md"));
    let text = serde_json::to_string_pretty(doc).map_err(|e| e.to_string())?;
    std::fs::write(&json_path, text + "\n").map_err(|e| format!("cannot write {}: {e}", json_path.display()))?;
    std::fs::write(&md_path, md).map_err(|e| format!("cannot write {}: {e}", md_path.display()))?;
    eprintln!("vigil-bench: wrote {} and {}", json_path.display(), md_path.display());
    Ok(())
}

/// Seconds since the Unix epoch, as a float (the clock rank 0 stamps its eventlogs with).
fn now_epoch_s() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

/// Round to 0.1 ms (or 0.1 kB, ...): plenty, and keeps the committed JSON small and diffable.
fn r4(x: f64) -> f64 {
    (x * 1e4).round() / 1e4
}

/// Nearest-rank 99th percentile of `v` (`None` when empty): with fewer than 100 samples it is the maximum.
fn p99(v: &[f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let rank = ((0.99 * s.len() as f64).ceil() as usize).clamp(1, s.len());
    Some(s[rank - 1])
}

/// How a timed child process with captured output ended.
enum Captured {
    /// It exited after `elapsed_s` seconds.
    Exited {
        /// Exit status.
        status: ExitStatus,
        /// Wall time from spawn to exit (and end of its output), seconds.
        elapsed_s: f64,
        /// Its standard output.
        stdout: String,
        /// Its standard error.
        stderr: String,
    },
    /// It did not exit within the timeout; its process group was killed.
    TimedOut,
}

/// Like [`run_timed`], but capture stdout and stderr; the time runs until the process has exited and both
/// pipes are closed (the command is done when its output is).
fn run_captured(cmd: Command, timeout: Duration) -> Result<Captured, String> {
    run_captured_with(cmd, timeout, |_| {})
}

/// [`run_captured`], calling `on_spawn` with the child's process group id as soon as it runs.
fn run_captured_with(mut cmd: Command, timeout: Duration, on_spawn: impl FnOnce(u32)) -> Result<Captured, String> {
    cmd.process_group(0).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let t0 = Instant::now();
    let child = cmd.spawn().map_err(|e| format!("cannot run {:?}: {e}", cmd.get_program()))?;
    let pgid = child.id();
    on_spawn(pgid);
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let out = child.wait_with_output();
        let _ = tx.send((out, t0.elapsed().as_secs_f64()));
    });
    match rx.recv_timeout(timeout) {
        Ok((out, elapsed_s)) => {
            let _ = waiter.join();
            let out = out.map_err(|e| format!("wait: {e}"))?;
            Ok(Captured::Exited {
                status: out.status,
                elapsed_s,
                stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            })
        }
        Err(_) => {
            signal_group(pgid, "TERM");
            if rx.recv_timeout(Duration::from_secs(5)).is_err() {
                signal_group(pgid, "KILL");
                let _ = rx.recv_timeout(Duration::from_secs(5));
            }
            signal_group(pgid, "KILL");
            let _ = waiter.join();
            Ok(Captured::TimedOut)
        }
    }
}

/// The last line of `s` that is not blank (for error messages quoting a command's stderr).
fn last_line(s: &str) -> &str {
    s.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("").trim()
}

// ------------------------------------------------------------------------------------------- outer harness

/// The `vigil` binary to use: `--vigil`, or `vigil` next to this binary; with `vigil-shell` beside it.
fn find_vigil(arg: Option<PathBuf>) -> Result<PathBuf, String> {
    let hint = "run `cargo build --release --workspace` first, or pass --vigil PATH";
    let path = match arg {
        Some(p) => p,
        None => {
            let exe = std::env::current_exe().map_err(|e| format!("cannot locate this binary: {e}"))?;
            exe.parent().map(|d| d.join("vigil")).ok_or("cannot locate the directory of this binary")?
        }
    };
    if !path.is_file() {
        return Err(format!("vigil binary not found at {}: {hint}", path.display()));
    }
    let path = path.canonicalize().map_err(|e| format!("{}: {e}", path.display()))?;
    let shell = path.with_file_name("vigil-shell");
    if !shell.is_file() {
        return Err(format!(
            "vigil-shell not found at {} (brokers start job shells from there): {hint}",
            shell.display()
        ));
    }
    if let (shell, "dynamic") = shell_linkage(&path) {
        eprintln!(
            "vigil-bench: the job shell {} is linked dynamically (`cargo build --release`); `cargo build-shell` \
             links it statically, as the published tables measure it",
            shell.display()
        );
    }
    Ok(path)
}

/// How a timed child process ended.
enum Ended {
    /// It exited (or was killed by a signal) after `elapsed_s` seconds.
    Exited {
        /// Exit status.
        status: ExitStatus,
        /// Wall time from spawn to exit, seconds.
        elapsed_s: f64,
    },
    /// It did not exit within the timeout; its process group was killed.
    TimedOut,
}

/// Spawn `cmd` in a process group of its own, wait at most `timeout`, and time it. On timeout, SIGTERM then
/// SIGKILL the whole group (the instance's brokers and initial program), so nothing is left behind.
fn run_timed(mut cmd: Command, timeout: Duration) -> Result<Ended, String> {
    cmd.process_group(0).stdin(Stdio::null());
    let t0 = Instant::now();
    let mut child = cmd.spawn().map_err(|e| format!("cannot run {:?}: {e}", cmd.get_program()))?;
    let pgid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let st = child.wait();
        let _ = tx.send((st, t0.elapsed().as_secs_f64()));
    });
    match rx.recv_timeout(timeout) {
        Ok((st, elapsed_s)) => {
            let _ = waiter.join();
            let status = st.map_err(|e| format!("wait: {e}"))?;
            Ok(Ended::Exited { status, elapsed_s })
        }
        Err(_) => {
            signal_group(pgid, "TERM");
            if rx.recv_timeout(Duration::from_secs(5)).is_err() {
                signal_group(pgid, "KILL");
                let _ = rx.recv_timeout(Duration::from_secs(5));
            }
            // Stragglers that left the group wait (e.g. brokers whose parent died) get the same treatment.
            signal_group(pgid, "KILL");
            let _ = waiter.join();
            Ok(Ended::TimedOut)
        }
    }
}

/// Send SIG`sig` to process group `pgid` (which this harness created) with kill(1).
fn signal_group(pgid: u32, sig: &str) {
    let _ =
        Command::new("kill").arg(format!("-{sig}")).arg("--").arg(format!("-{pgid}")).stderr(Stdio::null()).status();
}

/// A fresh scratch file name for an inner run's results.
fn scratch_file(tag: &str) -> PathBuf {
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    std::env::temp_dir().join(format!("vigil-bench-{}-{nanos}-{tag}.json", std::process::id()))
}

/// Metric 1: wall time of `vigil start --test-size=N true`, after one untimed warm-up run.
fn bench_start(vigil: &Path, size: u32, runs: usize) -> (Vec<f64>, Option<String>) {
    let mut samples = Vec::new();
    for i in 0..=runs {
        let mut cmd = Command::new(vigil);
        cmd.arg("start").arg(format!("--test-size={size}")).arg("true");
        match run_timed(cmd, Duration::from_secs(START_TIMEOUT_S)) {
            Ok(Ended::Exited { status, elapsed_s }) if status.success() => {
                if i > 0 {
                    samples.push(elapsed_s);
                }
            }
            Ok(Ended::Exited { status, .. }) => {
                return (samples, Some(format!("`vigil start --test-size={size} true` failed: {status}")))
            }
            Ok(Ended::TimedOut) => {
                return (
                    samples,
                    Some(format!("`vigil start --test-size={size} true` hung: killed after {START_TIMEOUT_S} s")),
                );
            }
            Err(e) => return (samples, Some(e)),
        }
    }
    (samples, None)
}

/// Metrics 2 and 3: start a 4-broker instance (broker attributes `attrs`, `-S NAME=VALUE` each) whose initial
/// program is `vigil-bench inner jobs`.
fn bench_jobs(vigil: &Path, runs: usize, attrs: &[&str]) -> InnerJobsResult {
    let out = scratch_file("jobs");
    let r = (|| -> Result<InnerJobsResult, String> {
        let me = std::env::current_exe().map_err(|e| format!("cannot locate this binary: {e}"))?;
        let mut cmd = Command::new(vigil);
        cmd.arg("start").arg(format!("--test-size={INSTANCE_SIZE}"));
        for a in attrs {
            cmd.arg("-S").arg(a);
        }
        cmd.arg(&me).args(["inner", "jobs"]);
        cmd.arg(format!("--runs={runs}"))
            .arg(format!("--jobs={THROUGHPUT_JOBS}"))
            .arg(format!("--nodes={INSTANCE_SIZE}"));
        cmd.arg("--vigil").arg(vigil).arg("--out").arg(&out);
        let ended = run_timed(cmd, Duration::from_secs(JOBS_INSTANCE_TIMEOUT_S))?;
        // Whatever the exit status, the inner harness may have recorded samples and the reason it stopped.
        let mut res: InnerJobsResult = match std::fs::read_to_string(&out) {
            Ok(s) => serde_json::from_str(&s).map_err(|e| format!("bad inner results in {}: {e}", out.display()))?,
            Err(_) => InnerJobsResult::default(),
        };
        match ended {
            Ended::Exited { status, .. } if !status.success() && res.error.is_none() => {
                res.error = Some(format!("instance running the inner harness failed: {status}"));
            }
            Ended::TimedOut => {
                res.error =
                    Some(format!("instance running the inner harness hung: killed after {JOBS_INSTANCE_TIMEOUT_S} s"));
            }
            _ => {}
        }
        Ok(res)
    })();
    let _ = std::fs::remove_file(&out);
    r.unwrap_or_else(|e| InnerJobsResult { error: Some(e), ..Default::default() })
}

/// [`bench_jobs`] `runs` times with one run each, alternating the default instance with one given `attrs`: the
/// default's samples, then the other's. Each stops at its first error.
fn bench_jobs_alternating(vigil: &Path, runs: usize, attrs: &[&str]) -> (InnerJobsResult, InnerJobsResult) {
    let (mut a, mut b) = (InnerJobsResult::default(), InnerJobsResult::default());
    for _ in 0..runs {
        for (res, with) in [(&mut a, &[][..]), (&mut b, attrs)] {
            if res.error.is_some() {
                continue;
            }
            let one = bench_jobs(vigil, 1, with);
            res.run_latency_s.extend(one.run_latency_s);
            res.throughput_jobs_per_s.extend(one.throughput_jobs_per_s);
            res.submit_s.extend(one.submit_s);
            res.error = one.error;
        }
    }
    (a, b)
}

/// Metric 4: `runs` idle 4-broker instances, each reading its brokers' RSS after [`RSS_SETTLE_S`].
fn bench_rss(vigil: &Path, runs: usize) -> (Vec<f64>, Option<String>) {
    let mut samples = Vec::new();
    let me = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => return (samples, Some(format!("cannot locate this binary: {e}"))),
    };
    for _ in 0..runs {
        let out = scratch_file("rss");
        let mut cmd = Command::new(vigil);
        cmd.arg("start").arg(format!("--test-size={INSTANCE_SIZE}")).arg(&me).args(["inner", "rss"]);
        cmd.arg(format!("--expect={INSTANCE_SIZE}")).arg("--out").arg(&out);
        let ended = run_timed(cmd, Duration::from_secs(RSS_INSTANCE_TIMEOUT_S));
        let res: Option<InnerRssResult> =
            std::fs::read_to_string(&out).ok().and_then(|s| serde_json::from_str(&s).ok());
        let _ = std::fs::remove_file(&out);
        let err = match (ended, res) {
            (Err(e), _) => Some(e),
            (Ok(Ended::TimedOut), _) => Some(format!("idle instance hung: killed after {RSS_INSTANCE_TIMEOUT_S} s")),
            (Ok(_), Some(r)) if r.error.is_some() => r.error,
            (Ok(Ended::Exited { status, .. }), _) if !status.success() => {
                Some(format!("idle instance failed: {status}"))
            }
            (Ok(_), None) => Some("the inner harness wrote no RSS results".into()),
            (Ok(_), Some(r)) => {
                samples.extend(r.broker_rss_mb);
                None
            }
        };
        if err.is_some() {
            return (samples, err);
        }
    }
    (samples, None)
}

/// Output of `vigil --version`, trimmed (for the record).
fn vigil_version(vigil: &Path) -> String {
    Command::new(vigil)
        .arg("--version")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// The job shell the measured brokers start (`$VIGIL_SHELL`, else `vigil-shell` beside `vigil`, as the broker
/// picks it when `exec.shell` is unset) and how it is linked: `"static"` (no program interpreter: what
/// `cargo build-shell` makes) or `"dynamic"`, read from its ELF program headers; `"unknown"` when it cannot be
/// read. A short job's cost depends on it (issue 19: ~12 % of throughput at 10,000 jobs), so results say which.
fn shell_linkage(vigil: &Path) -> (PathBuf, &'static str) {
    let shell = std::env::var_os("VIGIL_SHELL").map_or_else(|| vigil.with_file_name("vigil-shell"), PathBuf::from);
    let linkage = std::fs::read(&shell).ok().and_then(|b| elf_has_interpreter(&b));
    (shell, linkage.map_or("unknown", |dynamic| if dynamic { "dynamic" } else { "static" }))
}

/// Whether a little-endian ELF64 image has a `PT_INTERP` program header (a dynamically linked program); `None`
/// if it is not one or is truncated.
fn elf_has_interpreter(b: &[u8]) -> Option<bool> {
    const PT_INTERP: u32 = 3;
    if b.get(..6)? != b"\x7fELF\x02\x01" {
        return None;
    }
    let u16_at = |o: usize| Some(u16::from_le_bytes(b.get(o..o + 2)?.try_into().ok()?));
    let phoff = usize::try_from(u64::from_le_bytes(b.get(0x20..0x28)?.try_into().ok()?)).ok()?;
    let (size, count) = (usize::from(u16_at(0x36)?), usize::from(u16_at(0x38)?));
    let mut found = false;
    for i in 0..count {
        let at = phoff.checked_add(i.checked_mul(size)?)?;
        found |= u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?) == PT_INTERP;
    }
    Some(found)
}

/// One sentence for a results header saying how the job shell was linked ([`shell_linkage`]'s word).
fn shell_sentence_for(linkage: &str) -> String {
    match linkage {
        "static" => "Job shell linked statically (`cargo build-shell`).".into(),
        "dynamic" => "Job shell linked dynamically (`cargo build --release`; `cargo build-shell` links it statically, \
                      which is faster)."
            .into(),
        _ => "Job shell's linkage unknown (unreadable).".into(),
    }
}

/// Run every benchmark, print and write the results; returns the exit code.
fn outer(runs: usize, vigil: Option<PathBuf>, out_dir: Option<PathBuf>) -> Result<i32, String> {
    if runs == 0 {
        return Err("--runs must be at least 1".into());
    }
    if runs < 5 {
        eprintln!("vigil-bench: warning: --runs {runs} is below the 5 runs the published table uses");
    }
    let vigil = find_vigil(vigil)?;
    let out_dir = results_dir(out_dir);
    let mut metrics = Vec::new();

    for (size, reference) in [(1, REF_START_N1_S), (4, REF_START_N4_S), (16, REF_START_N16_S)] {
        eprintln!("vigil-bench: vigil start --test-size={size} true ({runs} runs + 1 warm-up)");
        let (samples, err) = bench_start(&vigil, size, runs);
        let label = format!("`vigil start --test-size={size} true` wall time (s)");
        metrics.push(Metric::new(
            &format!("start_n{size}_wall_s"),
            &label,
            "s",
            Better::Lower,
            reference,
            samples,
            err,
        ));
    }

    eprintln!(
        "vigil-bench: vigil run -N{INSTANCE_SIZE} true latency and {THROUGHPUT_JOBS}-job throughput ({runs} runs each)"
    );
    // Alternating instances with cgroups on (the default) and off (issue 18's cost), so that a change in the
    // machine's load over the run falls on both alike.
    let (jobs, pgroup) = bench_jobs_alternating(&vigil, runs, &["exec.containment=pgroup"]);
    // Attribute the inner error to the measurement that was under way when it happened.
    let latency_done = jobs.run_latency_s.len() >= runs;
    let (lat_err, tput_err) = match &jobs.error {
        Some(e) if !latency_done => (Some(e.clone()), Some(format!("not measured: {e}"))),
        Some(e) => (None, Some(e.clone())),
        None => (None, None),
    };
    metrics.push(Metric::new(
        "run_n4_latency_s",
        &format!("`vigil run -N{INSTANCE_SIZE} true` latency (s)"),
        "s",
        Better::Lower,
        REF_RUN_N4_LATENCY_S,
        jobs.run_latency_s.clone(),
        lat_err,
    ));
    metrics.push(Metric::new(
        "throughput_200_true_jobs_per_s",
        &format!("throughput, {THROUGHPUT_JOBS} `true` jobs at once (jobs/s)"),
        "jobs/s",
        Better::Higher,
        REF_THROUGHPUT_JOBS_PER_S,
        jobs.throughput_jobs_per_s.clone(),
        tput_err,
    ));

    // The cost of containment (issue 18): the same two measurements with jobs kept by process groups only.
    let contained = containment_of(&vigil);
    let cgroup_cost = cgroup_cost_table(&jobs, &pgroup, &contained);

    eprintln!("vigil-bench: idle broker RSS ({runs} idle instances of {INSTANCE_SIZE} brokers)");
    let (rss, rss_err) = bench_rss(&vigil, runs);
    metrics.push(Metric::new(
        "idle_broker_rss_mb",
        &format!("idle broker RSS, {INSTANCE_SIZE}-broker instance (MB)"),
        "MB",
        Better::Lower,
        REF_IDLE_BROKER_RSS_MB,
        rss,
        rss_err,
    ));

    let version = vigil_version(&vigil);
    let ncpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let now_s = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let table = markdown_table(&metrics);
    let failed: Vec<&Metric> = metrics.iter().filter(|m| m.error.is_some()).collect();

    println!("{table}");
    println!("{cgroup_cost}");
    for m in &failed {
        eprintln!("vigil-bench: FAILED {}: {}", m.name, m.error.as_deref().unwrap_or(""));
    }

    let doc = json!({
        "benchmark": "vigil-bench first-light",
        "vigil_version": version,
        "runs": runs,
        "unix_time_s": now_s,
        "cpus": ncpus,
        "throughput_submit_s": summary_json(&jobs.submit_s),
        "metrics": metrics,
        "containment": {
            "default": contained,
            "run_latency_s": {"default": summary_json(&jobs.run_latency_s), "pgroup": summary_json(&pgroup.run_latency_s)},
            "throughput_jobs_per_s": {
                "default": summary_json(&jobs.throughput_jobs_per_s),
                "pgroup": summary_json(&pgroup.throughput_jobs_per_s),
            },
            "pgroup_error": pgroup.error,
        },
    });
    std::fs::create_dir_all(&out_dir).map_err(|e| format!("cannot create {}: {e}", out_dir.display()))?;
    let json_path = out_dir.join("first-light.json");
    let md_path = out_dir.join("first-light.md");
    let text = serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?;
    std::fs::write(&json_path, text + "\n").map_err(|e| format!("cannot write {}: {e}", json_path.display()))?;
    let mut md = format!(
        "# Vigil first light vs flux-core 0.88\n\n`cargo run --release -p vigil-bench -- --runs {runs}` ({version}, {ncpus} CPUs, \
         unix time {now_s}). Medians, min and max over {runs} runs; flux-core figures measured on the same machine. \
         Ratio: improvement factor, >1 means Vigil is better (reference/vigil for times and memory, vigil/reference \
         for throughput).\n\n{table}\n{cgroup_cost}"
    );
    if !failed.is_empty() {
        md.push_str("\nFailures:\n\n");
        for m in &failed {
            md.push_str(&format!("- `{}`: {}\n", m.name, m.error.as_deref().unwrap_or("")));
        }
    }
    std::fs::write(&md_path, md).map_err(|e| format!("cannot write {}: {e}", md_path.display()))?;
    eprintln!("vigil-bench: wrote {} and {}", json_path.display(), md_path.display());
    Ok(if failed.is_empty() { 0 } else { 1 })
}

/// How a default 4-broker instance keeps its jobs here (`vigil uptime`'s `jobs contained by:` line).
fn containment_of(vigil: &Path) -> String {
    let out = Command::new(vigil)
        .args(["start", &format!("--test-size={INSTANCE_SIZE}"), "vigil", "uptime"])
        .env("PATH", vigil.parent().map(|d| d.as_os_str().to_owned()).unwrap_or_default())
        .stderr(Stdio::null())
        .output();
    out.ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .find_map(|l| l.trim().strip_prefix("jobs contained by: ").map(str::to_string))
        })
        .unwrap_or_else(|| "unknown".into())
}

/// The "cgroups on vs off" section: latency and throughput medians of the default instance (`on`, contained as
/// `how`) and of one with `exec.containment=pgroup` (`off`), measured in the same run, and what containment costs.
fn cgroup_cost_table(on: &InnerJobsResult, off: &InnerJobsResult, how: &str) -> String {
    let (lat_on, lat_off) = (summarize(&on.run_latency_s).0, summarize(&off.run_latency_s).0);
    let (tp_on, tp_off) = (summarize(&on.throughput_jobs_per_s).0, summarize(&off.throughput_jobs_per_s).0);
    let cost = |a: Option<f64>, b: Option<f64>, higher_better: bool| match (a, b) {
        (Some(a), Some(b)) if a > 0.0 && b > 0.0 => {
            let slower = if higher_better { b / a - 1.0 } else { a / b - 1.0 };
            format!("{:+.1} %", slower * 100.0)
        }
        _ => "-".into(),
    };
    let mut t = format!(
        "\n## Containment: cgroups on vs off\n\nSame run, same {INSTANCE_SIZE}-broker instance size. On: jobs contained by \
         {how}. Off: `-S exec.containment=pgroup`. Cost: how much slower with cgroups (target: at most +10 %).\n\n\
         | metric | cgroups on (median) | off (median) | cost |\n|---|---:|---:|---:|\n"
    );
    t.push_str(&format!(
        "| `vigil run -N{INSTANCE_SIZE} true` latency (s) | {} | {} | {} |\n",
        fmt_value(lat_on, "s"),
        fmt_value(lat_off, "s"),
        cost(lat_on, lat_off, false)
    ));
    t.push_str(&format!(
        "| throughput, {THROUGHPUT_JOBS} `true` jobs at once (jobs/s) | {} | {} | {} |\n",
        fmt_value(tp_on, "jobs/s"),
        fmt_value(tp_off, "jobs/s"),
        cost(tp_on, tp_off, true)
    ));
    if let Some(e) = &off.error {
        t.push_str(&format!("\nThe cgroups-off run failed: {e}\n"));
    }
    t
}

/// `{"median", "min", "max"}` of `v` (seconds) as JSON, rounded to 0.1 ms.
fn summary_json(v: &[f64]) -> Value {
    let r4 = |x: Option<f64>| x.map(|x| (x * 1e4).round() / 1e4);
    let (median, min, max) = summarize(v);
    json!({"median": r4(median), "min": r4(min), "max": r4(max)})
}

/// Format a value of `unit` for the table.
fn fmt_value(v: Option<f64>, unit: &str) -> String {
    match v {
        None => "-".into(),
        Some(x) if unit == "s" => format!("{x:.3}"),
        Some(x) => format!("{x:.1}"),
    }
}

/// The markdown table of `metrics`.
fn markdown_table(metrics: &[Metric]) -> String {
    let mut t = String::from(
        "| metric | vigil median | min | max | flux-core 0.88 | ratio |\n|---|---:|---:|---:|---:|---:|\n",
    );
    for m in metrics {
        let median = match (&m.error, m.median) {
            (Some(_), None) => "FAILED".to_string(),
            (Some(_), med) => format!("{} (FAILED)", fmt_value(med, &m.unit)),
            (None, med) => fmt_value(med, &m.unit),
        };
        let ratio = m.ratio.map(|r| format!("{r:.1}x")).unwrap_or_else(|| "-".into());
        let reference = if m.unit == "s" { format!("{:.2}", m.flux_088) } else { format!("{:.0}", m.flux_088) };
        t.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} |\n",
            m.label,
            median,
            fmt_value(m.min, &m.unit),
            fmt_value(m.max, &m.unit),
            reference,
            ratio
        ));
    }
    t
}

// ------------------------------------------------------------------------------------------- inner: jobs

/// Write an inner measurement's JSON result to `out`; the exit code: 0 if it was written and `ok`, else 1.
pub(crate) fn write_inner_result(out: &Path, res: &impl serde::Serialize, ok: bool) -> i32 {
    if let Err(e) = std::fs::write(out, serde_json::to_string(res).unwrap_or_default()) {
        eprintln!("vigil-bench inner: cannot write {}: {e}", out.display());
        return 1;
    }
    if ok {
        0
    } else {
        1
    }
}

/// `vigil-bench inner jobs`: measure, write the JSON results, exit 0 only if everything was measured.
fn inner_jobs(a: InnerJobsArgs) -> i32 {
    let mut res = InnerJobsResult::default();
    let r = inner_jobs_measure(&a, &mut res);
    if let Err(e) = r {
        eprintln!("vigil-bench inner: {e}");
        res.error = Some(e);
    }
    write_inner_result(&a.out, &res, res.error.is_none())
}

/// Run the latency then the throughput measurement, appending samples to `res` as they come.
fn inner_jobs_measure(a: &InnerJobsArgs, res: &mut InnerJobsResult) -> Result<(), String> {
    let uri = std::env::var(vigil::client::URI_ENV)
        .map_err(|_| "VIGIL_URI is not set: run me inside `vigil start`".to_string())?;
    // Latency: `vigil run -N4 true` as a user would type it; the first run is an untimed warm-up.
    for i in 0..=a.runs {
        let lat_s = time_vigil_run(&a.vigil, a.nodes)?;
        if i > 0 {
            res.run_latency_s.push(lat_s);
        }
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start tokio: {e}"))?;
    rt.block_on(async {
        let client = vigil::client::Client::connect(&uri).await.map_err(|e| format!("cannot connect to {uri}: {e}"))?;
        let spec =
            vigil::jobspec::JobspecBuilder::new(vec!["true"]).build().map_err(|e| format!("jobspec: {e}"))?.to_json();
        let spec: Value = serde_json::from_str(&spec).map_err(|e| format!("jobspec JSON: {e}"))?;
        let payload = json!({"jobspec": spec});
        // One untimed warm-up burst of a few jobs, then the timed bursts.
        throughput_burst(&client, &payload, 8).await?;
        for _ in 0..a.runs {
            let (submit_s, total_s) = throughput_burst(&client, &payload, a.jobs).await?;
            res.submit_s.push(submit_s);
            res.throughput_jobs_per_s.push(a.jobs as f64 / total_s);
        }
        Ok::<(), String>(())
    })
}

/// Spawn `vigil run -N<nodes> true` and return its wall time; error unless it exits 0 within [`RUN_TIMEOUT_S`].
fn time_vigil_run(vigil: &Path, nodes: u32) -> Result<f64, String> {
    let mut cmd = Command::new(vigil);
    cmd.arg("run").arg(format!("-N{nodes}")).arg("true");
    match run_timed(cmd, Duration::from_secs(RUN_TIMEOUT_S))? {
        Ended::Exited { status, elapsed_s } if status.success() => Ok(elapsed_s),
        Ended::Exited { status, .. } => Err(format!("`vigil run -N{nodes} true` failed: {status}")),
        Ended::TimedOut => Err(format!("`vigil run -N{nodes} true` hung: killed after {RUN_TIMEOUT_S} s")),
    }
}

/// Outcome of one job, read from its eventlog.
struct JobOutcome {
    /// Exit code from the `finish` event (None if the job never finished).
    exit_code: Option<i32>,
    /// Note of the first fatal exception, if any.
    fatal: Option<String>,
}

/// Follow job `id`'s eventlog until it ends (the job is INACTIVE) and report how the job ended.
async fn wait_inactive(client: &vigil::client::Client, id: u64) -> Result<JobOutcome, String> {
    let mut s = client
        .rpc_stream("job-manager.eventlog", 0, &json!({"id": id, "follow": true}))
        .map_err(|e| format!("eventlog {id}: {e}"))?;
    let mut out = JobOutcome { exit_code: None, fatal: None };
    while let Some(item) = s.next().await {
        let v = item.map_err(|e| format!("eventlog {id}: {e}"))?;
        let e = &v["event"];
        match e["name"].as_str() {
            Some("finish") => {
                out.exit_code = Some(vigil::shellproto::exit_code(e["context"]["status"].as_i64().unwrap_or(-1) as i32))
            }
            Some("exception") if e["context"]["severity"].as_u64() == Some(0) && out.fatal.is_none() => {
                out.fatal = Some(format!(
                    "{}: {}",
                    e["context"]["type"].as_str().unwrap_or("?"),
                    e["context"]["note"].as_str().unwrap_or("")
                ));
            }
            _ => {}
        }
    }
    Ok(out)
}

/// Submit `n` jobs of `payload` (a `job-manager.submit` request) at once and return their ids, in submission
/// order. All requests go out before the first answer is awaited: the client pipelines them on one connection.
pub(crate) async fn submit_all(client: &vigil::client::Client, payload: &Value, n: usize) -> Result<Vec<u64>, String> {
    submit_all_marked(client, payload, n, n).await.map(|(ids, _)| ids)
}

/// [`submit_all`], and when the `mark`-th answer came (in the order they came; the last one's if fewer).
pub(crate) async fn submit_all_marked(
    client: &vigil::client::Client,
    payload: &Value,
    n: usize,
    mark: usize,
) -> Result<(Vec<u64>, Instant), String> {
    let mut submits = tokio::task::JoinSet::new();
    for i in 0..n {
        let c = client.clone();
        let p = payload.clone();
        submits.spawn(async move { (i, c.rpc("job-manager.submit", 0, &p).await) });
    }
    let (mut ids, mut answered, mut marked) = (vec![0u64; n], 0, Instant::now());
    while let Some(r) = submits.join_next().await {
        let (i, r) = r.map_err(|e| format!("submit task: {e}"))?;
        let v = r.map_err(|e| format!("submit {i}: {e}"))?;
        ids[i] = v["id"].as_u64().ok_or_else(|| format!("malformed submit response: {v}"))?;
        answered += 1;
        if answered <= mark {
            marked = Instant::now();
        }
    }
    Ok((ids, marked))
}

/// Submit `n` jobs at once, wait until all are INACTIVE, and check each completed with exit code 0.
/// Returns (seconds until every submit was answered, seconds from first submit to last INACTIVE).
async fn throughput_burst(client: &vigil::client::Client, payload: &Value, n: usize) -> Result<(f64, f64), String> {
    let t0 = Instant::now();
    let ids = submit_all(client, payload, n).await?;
    let submit_s = t0.elapsed().as_secs_f64();
    let mut waits = tokio::task::JoinSet::new();
    for &id in &ids {
        let c = client.clone();
        waits.spawn(async move { (id, wait_inactive(&c, id).await) });
    }
    let mut bad = Vec::new();
    while let Some(r) = waits.join_next().await {
        let (id, r) = r.map_err(|e| format!("wait task: {e}"))?;
        match r? {
            JobOutcome { exit_code: Some(0), fatal: None } => {}
            JobOutcome { exit_code, fatal } => {
                bad.push(format!("job {id}: exit code {exit_code:?}, exception {fatal:?}"))
            }
        }
    }
    let total_s = t0.elapsed().as_secs_f64();
    // Cross-check with the job manager's own view: every job INACTIVE, COMPLETED, exit code 0.
    let list =
        client.rpc("job-manager.list", 0, &json!({"all": true})).await.map_err(|e| format!("job-manager.list: {e}"))?;
    let jobs = list["jobs"].as_array().cloned().unwrap_or_default();
    for &id in &ids {
        match jobs.iter().find(|j| j["id"].as_u64() == Some(id)) {
            None => bad.push(format!("job {id}: missing from job-manager.list")),
            Some(j) if j["state"] != "INACTIVE" || j["result"] != "COMPLETED" || j["exit_code"] != 0 => {
                bad.push(format!("job {id}: state {} result {} exit code {}", j["state"], j["result"], j["exit_code"]));
            }
            Some(_) => {}
        }
    }
    if !bad.is_empty() {
        let shown: Vec<&str> = bad.iter().take(5).map(String::as_str).collect();
        return Err(format!(
            "{} of {n} throughput jobs did not complete with exit code 0: {}",
            bad.len(),
            shown.join("; ")
        ));
    }
    Ok((submit_s, total_s))
}

// ------------------------------------------------------------------------------------------- inner: rss

/// `vigil-bench inner rss`: wait, read the VmRSS of this instance's brokers, write the JSON results.
fn inner_rss(a: InnerRssArgs) -> i32 {
    std::thread::sleep(Duration::from_secs_f64(a.settle_s.max(0.0)));
    let res = match broker_rss_mb(a.expect) {
        Ok(v) => InnerRssResult { broker_rss_mb: v, error: None },
        Err(e) => {
            eprintln!("vigil-bench inner: {e}");
            InnerRssResult { broker_rss_mb: vec![], error: Some(e) }
        }
    };
    write_inner_result(&a.out, &res, res.error.is_none())
}

/// VmRSS (MB) of every `vigil broker` process whose `--rundir` is this instance's (taken from `VIGIL_URI`,
/// `local://RUNDIR/local-0`); error unless exactly `expect` are found.
fn broker_rss_mb(expect: usize) -> Result<Vec<f64>, String> {
    let uri = std::env::var(vigil::client::URI_ENV)
        .map_err(|_| "VIGIL_URI is not set: run me inside `vigil start`".to_string())?;
    let sock = PathBuf::from(vigil::client::uri_to_path(&uri).map_err(|e| e.to_string())?);
    let rundir = sock.parent().ok_or_else(|| format!("no run directory in {uri}"))?;
    // Brokers started by `vigil start` carry `--rundir=RUNDIR` (and `--config=RUNDIR/config.toml`) in argv.
    let want = format!("--rundir={}", rundir.display());
    let want_cfg = format!("--config={}", rundir.join("config.toml").display());
    let mut rss = Vec::new();
    let procs = std::fs::read_dir("/proc").map_err(|e| format!("/proc: {e}"))?;
    for ent in procs.flatten() {
        let name = ent.file_name();
        let Some(pid) = name.to_str().filter(|s| s.bytes().all(|b| b.is_ascii_digit())) else { continue };
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else { continue };
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let is_broker = args.get(1) == Some(&b"broker".as_slice())
            && args.iter().any(|a| *a == want.as_bytes() || *a == want_cfg.as_bytes());
        if !is_broker {
            continue;
        }
        let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else { continue };
        let kb = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .ok_or_else(|| format!("no VmRSS in /proc/{pid}/status"))?;
        rss.push(kb / 1024.0);
    }
    if rss.len() != expect {
        return Err(format!("found {} broker processes with {want}, expected {expect}", rss.len()));
    }
    Ok(rss)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dynamic_program_has_an_interpreter_and_a_static_one_none() {
        // This test program is linked dynamically (cargo's default).
        let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        assert_eq!(elf_has_interpreter(&me), Some(true));
        // The same image with its PT_INTERP header renamed PT_NULL reads as static.
        let mut b = me.clone();
        let phoff = u64::from_le_bytes(b[0x20..0x28].try_into().unwrap()) as usize;
        let (size, count) = (u16::from_le_bytes([b[0x36], b[0x37]]) as usize, u16::from_le_bytes([b[0x38], b[0x39]]));
        for i in 0..usize::from(count) {
            let at = phoff + i * size;
            if b[at..at + 4] == 3u32.to_le_bytes() {
                b[at..at + 4].copy_from_slice(&0u32.to_le_bytes());
            }
        }
        assert_eq!(elf_has_interpreter(&b), Some(false));
        assert_eq!(elf_has_interpreter(b"#!/bin/sh\n"), None, "not ELF");
        assert_eq!(elf_has_interpreter(&me[..0x30]), None, "truncated");
        assert!(shell_sentence_for("static").contains("statically"));
    }
}
