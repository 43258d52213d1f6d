//! `vigil-bench sched`: job throughput at queue depth and job latency, Vigil and Slurm 22.05 in the same run.
//!
//! Throughput: N `true` jobs (200, 10,000, 64,000 by default) queued at once.
//! - Vigil: a fresh `vigil start --test-size=4` instance per sample, whose initial program
//!   (`vigil-bench inner sched`) submits the N jobs through the client API, every request pipelined on one
//!   connection (as `vigil submit --cc` does), then follows the jobs' eventlogs, at most [`WATCH_WINDOW`] at a
//!   time in submission order, until every one is INACTIVE; each must have exited 0. jobs/s = N / (first submit
//!   to last job inactive).
//! - Slurm: a one-node cluster started by `ci/slurm-cluster.sh` (its configuration is recorded with the figures).
//!   `sbatch --array=1-N -o /dev/null --wrap true` (how Slurm users queue many jobs), and for the smallest N also
//!   N separate `sbatch --wrap true`; timed from the first submit until `squeue -h` is empty. Slurm's runs are
//!   bounded ([`SchedArgs::slurm_bound_s`]): one still running then is cancelled and its rate over the bound
//!   (jobs that left the queue / elapsed) is reported as partial, never extrapolated to a completed figure.
//!
//! Latency: `vigil run -N1 true` and `vigil run -n4 true` in a 4-broker instance, `srun -N1 true` and
//! `srun -O -n4 true` on the Slurm node; medians over `--runs` runs after one warm-up each.
//!
//! A node killed under a running job, Slurm `--no-kill` against a Vigil batch job on network-namespace nodes:
//! see [`crate::nodekill`].
//!
//! Everything started is stopped: each Vigil instance runs under [`run_timed`] (its process group is killed on
//! timeout), and the Slurm daemons by a guard whose `Drop` runs `ci/slurm-cluster.sh down`.

use crate::{
    find_vigil, nodekill, now_epoch_s, r4, results_dir, run_captured, run_timed, scratch_file, summarize,
    vigil_version, wait_inactive, write_inner_result, write_results, Captured, Ended, JobOutcome,
};
use clap::Args;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Brokers of each Vigil instance.
const SIZE: u32 = 4;
/// Eventlog watchers the inner harness holds open at once (a client may hold 1024).
const WATCH_WINDOW: usize = 512;
/// How long one `vigil run`/`srun` may take before it counts as hung.
const LAUNCH_TIMEOUT_S: u64 = 60;
/// How long `ci/slurm-cluster.sh up` may take.
const SLURM_UP_TIMEOUT_S: u64 = 90;
/// The issue's target: 10,000-job throughput at least this, jobs/s.
const TARGET_10K_JOBS_PER_S: f64 = 430.0;
/// The issue's target: 64,000-job throughput at least this fraction of the 200-job figure.
const TARGET_DEPTH_FRACTION: f64 = 0.9;
/// SchedulerParameters of the benchmark's Slurm: the cluster script's `sched_min_interval=0`, with the main and
/// backfill schedulers every second instead of every 60 s and 30 s (tried with `defer`: under 1 job/s here).
const SLURM_SCHED_PARAMS: &str = "sched_min_interval=0,sched_interval=1,bf_interval=1";
/// Extra slurm.conf lines: room for 64,000 queued jobs and arrays that large; finished jobs purged after 2 s.
const SLURM_EXTRA_CONF: &str = "MaxJobCount=200000\nMaxArraySize=100001\nMinJobAge=2";

/// Options of `vigil-bench sched`.
#[derive(Args, Debug)]
pub(crate) struct SchedArgs {
    /// Timed runs of each latency metric.
    #[arg(long, default_value_t = 20)]
    pub(crate) runs: usize,
    /// Queue depths (jobs submitted at once), comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [200usize, 10_000, 64_000])]
    pub(crate) sizes: Vec<usize>,
    /// Vigil throughput samples per depth, comma-separated, one per entry of --sizes (the last repeats).
    #[arg(long, value_delimiter = ',', default_values_t = [5usize, 2, 1])]
    pub(crate) tput_runs: Vec<usize>,
    /// Longest one Vigil throughput burst may take before it is reported as partial, seconds.
    #[arg(long, default_value_t = 600)]
    pub(crate) vigil_bound_s: u64,
    /// Longest one Slurm throughput run may take before it is cancelled and reported as partial, seconds.
    #[arg(long, default_value_t = 120)]
    pub(crate) slurm_bound_s: u64,
    /// Skip Slurm (its figures are then "not measured").
    #[arg(long)]
    pub(crate) no_slurm: bool,
    /// Skip the node-kill comparison (it needs root: network namespaces).
    #[arg(long)]
    pub(crate) no_nodekill: bool,
    /// Run only the node-kill comparison, and replace its section of an existing sched.md (and its key of
    /// sched.json), keeping the other figures there.
    #[arg(long, conflicts_with = "no_nodekill")]
    pub(crate) only_nodekill: bool,
    /// Slurm's SlurmdTimeout for the node-kill comparison, seconds, comma-separated: one Slurm run each
    /// (300 is Slurm's default; its down verdict takes about that long).
    #[arg(long, value_delimiter = ',', default_values_t = [10u64, 300])]
    pub(crate) slurmd_timeouts: Vec<u64>,
    /// Give up relaunching on the survivors this long after the kill, seconds.
    #[arg(long, default_value_t = 900)]
    pub(crate) nodekill_bound_s: u64,
}

/// Options of the hidden `vigil-bench inner sched`.
#[derive(Args, Debug)]
pub(crate) struct InnerSchedArgs {
    /// Jobs of the throughput burst (0: none).
    #[arg(long, default_value_t = 0)]
    jobs: usize,
    /// Timed runs of each latency metric (0: none).
    #[arg(long, default_value_t = 0)]
    latency_runs: usize,
    /// Seconds after which the burst stops waiting and reports how many jobs were done (partial).
    #[arg(long, default_value_t = 3600)]
    bound_s: u64,
    /// What the burst is (`vigil-bench depsched`): `plain` (every job alike), `chains` (`afterok` chains of 10),
    /// `urgency` (random urgencies).
    #[arg(long, default_value = "plain")]
    workload: String,
    /// The `vigil` binary used for `vigil run`.
    #[arg(long)]
    vigil: PathBuf,
    /// File receiving the JSON results.
    #[arg(long)]
    out: PathBuf,
}

/// Results of `vigil-bench inner sched`.
#[derive(Serialize, Deserialize, Debug, Default)]
pub(crate) struct InnerSchedResult {
    /// Seconds until every submit was answered.
    pub(crate) submit_s: Option<f64>,
    /// Seconds from the first submit to the last job INACTIVE (or to the bound).
    pub(crate) total_s: Option<f64>,
    /// Jobs INACTIVE at `total_s` (all of them unless the bound was hit).
    pub(crate) done: Option<usize>,
    /// `vigil run -N1 true` wall times, seconds.
    run_n1_s: Vec<f64>,
    /// `vigil run -n4 true` wall times, seconds.
    run_n4_s: Vec<f64>,
    /// First error met, if any.
    pub(crate) error: Option<String>,
}

/// `vigil-bench inner sched`: measure in this instance, write the results, exit 0 only if all was measured.
pub(crate) fn inner_sched(a: InnerSchedArgs) -> i32 {
    let mut res = InnerSchedResult::default();
    if let Err(e) = inner_measure(&a, &mut res) {
        eprintln!("vigil-bench inner sched: {e}");
        res.error = Some(e);
    }
    write_inner_result(&a.out, &res, res.error.is_none())
}

fn inner_measure(a: &InnerSchedArgs, res: &mut InnerSchedResult) -> Result<(), String> {
    for (args, into) in
        [(&["run", "-N1", "true"][..], &mut res.run_n1_s), (&["run", "-n4", "true"][..], &mut res.run_n4_s)]
    {
        for i in 0..a.latency_runs.min(1) + a.latency_runs {
            let mut cmd = Command::new(&a.vigil);
            cmd.args(args).stdout(Stdio::null());
            let t = timed_ok(cmd, &format!("vigil {}", args.join(" ")))?;
            if i > 0 {
                into.push(t);
            }
        }
    }
    if a.jobs == 0 {
        return Ok(());
    }
    let uri = std::env::var(vigil::client::URI_ENV)
        .map_err(|_| "VIGIL_URI is not set: run me inside `vigil start`".to_string())?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start tokio: {e}"))?;
    rt.block_on(async {
        let client = vigil::client::Client::connect(&uri).await.map_err(|e| format!("cannot connect to {uri}: {e}"))?;
        let spec =
            vigil::jobspec::JobspecBuilder::new(vec!["true"]).build().map_err(|e| format!("jobspec: {e}"))?.to_json();
        let spec: Value = serde_json::from_str(&spec).map_err(|e| format!("jobspec JSON: {e}"))?;
        let payload = json!({"jobspec": spec.clone()});
        burst(&client, &payload, 8, Duration::from_secs(60)).await?; // untimed warm-up
        let bound = Duration::from_secs(a.bound_s);
        let (submit_s, total_s, done) = match crate::depsched::Workload::parse(&a.workload)? {
            crate::depsched::Workload::Plain => burst(&client, &payload, a.jobs, bound).await?,
            w => crate::depsched::instance_burst(&client, &spec, w, a.jobs, bound).await?,
        };
        res.submit_s = Some(submit_s);
        res.total_s = Some(total_s);
        res.done = Some(done);
        Ok(())
    })
}

/// Submit `n` jobs at once (pipelined), then follow their eventlogs, [`WATCH_WINDOW`] at a time in submission
/// order, until every one is inactive; each must exit 0 without a fatal exception.
/// Returns (seconds until every submit was answered, seconds from first submit to last INACTIVE, jobs done);
/// past `bound` it stops waiting and counts the jobs no longer active (`job-manager.list`).
pub(crate) async fn burst(
    client: &vigil::client::Client,
    payload: &Value,
    n: usize,
    bound: Duration,
) -> Result<(f64, f64, usize), String> {
    let t0 = Instant::now();
    let ids = crate::submit_all(client, payload, n).await?;
    let submit_s = t0.elapsed().as_secs_f64();
    let (total_s, done) = follow(client, &ids, t0, bound).await?;
    Ok((submit_s, total_s, done))
}

/// The waiting half of [`burst`]: follow the eventlogs of `ids` (submitted from `t0`), [`WATCH_WINDOW`] at a
/// time, until every job is inactive; each must exit 0 without a fatal exception.
/// Returns (seconds from `t0` to the last INACTIVE, jobs done); past `bound` from `t0` it stops waiting and
/// counts the jobs no longer active (`job-manager.list`).
pub(crate) async fn follow(
    client: &vigil::client::Client,
    ids: &[u64],
    t0: Instant,
    bound: Duration,
) -> Result<(f64, usize), String> {
    let n = ids.len();
    let mut waits = tokio::task::JoinSet::new();
    let mut next = 0;
    let mut bad = Vec::new();
    loop {
        while waits.len() < WATCH_WINDOW && next < n {
            let (c, id) = (client.clone(), ids[next]);
            waits.spawn(async move { (id, wait_inactive(&c, id).await) });
            next += 1;
        }
        let left = bound.saturating_sub(t0.elapsed());
        let Ok(r) = tokio::time::timeout(left, waits.join_next()).await else {
            let list =
                client.rpc("job-manager.list", 0, &json!({})).await.map_err(|e| format!("job-manager.list: {e}"))?;
            let active = list["jobs"].as_array().map(Vec::len).unwrap_or(0);
            return Ok((t0.elapsed().as_secs_f64(), n.saturating_sub(active)));
        };
        let Some(r) = r else { break };
        let (id, r) = r.map_err(|e| format!("wait task: {e}"))?;
        match r? {
            JobOutcome { exit_code: Some(0), fatal: None } => {}
            JobOutcome { exit_code, fatal } => {
                bad.push(format!("job {id}: exit code {exit_code:?}, exception {fatal:?}"))
            }
        }
    }
    let total_s = t0.elapsed().as_secs_f64();
    if !bad.is_empty() {
        return Err(format!("{} of {n} jobs did not exit 0: {}", bad.len(), bad[..bad.len().min(3)].join("; ")));
    }
    Ok((total_s, n))
}

/// Run `cmd` (its own process group, killed after [`LAUNCH_TIMEOUT_S`]); its wall time if it exited 0.
fn timed_ok(cmd: Command, what: &str) -> Result<f64, String> {
    match run_captured(cmd, Duration::from_secs(LAUNCH_TIMEOUT_S))? {
        Captured::Exited { status, elapsed_s, .. } if status.success() => Ok(elapsed_s),
        Captured::Exited { status, stderr, .. } => Err(format!("`{what}` failed ({status}): {}", stderr.trim())),
        Captured::TimedOut => Err(format!("`{what}` hung: killed after {LAUNCH_TIMEOUT_S} s")),
    }
}

// ------------------------------------------------------------------------------------------- outer: Vigil

/// One fresh 4-broker instance running `vigil-bench inner sched` with `args`.
fn vigil_instance(vigil: &Path, args: &[String], timeout_s: u64) -> InnerSchedResult {
    vigil_instance_with(vigil, &[], args, timeout_s)
}

/// [`vigil_instance`] with broker attributes `attrs` (`-S NAME=VALUE` of `vigil start`).
pub(crate) fn vigil_instance_with(vigil: &Path, attrs: &[String], args: &[String], timeout_s: u64) -> InnerSchedResult {
    let out = scratch_file("sched");
    let r = (|| -> Result<InnerSchedResult, String> {
        let me = std::env::current_exe().map_err(|e| format!("cannot locate this binary: {e}"))?;
        let mut cmd = Command::new(vigil);
        cmd.arg("start").arg(format!("--test-size={SIZE}"));
        for a in attrs {
            cmd.arg("-S").arg(a);
        }
        cmd.arg(&me).args(["inner", "sched"]).args(args);
        cmd.arg("--vigil").arg(vigil).arg("--out").arg(&out);
        let ended = run_timed(cmd, Duration::from_secs(timeout_s))?;
        let mut res: InnerSchedResult = match std::fs::read_to_string(&out) {
            Ok(s) => serde_json::from_str(&s).map_err(|e| format!("bad inner results: {e}"))?,
            Err(_) => InnerSchedResult::default(),
        };
        match ended {
            Ended::Exited { status, .. } if !status.success() && res.error.is_none() => {
                res.error = Some(format!("instance failed: {status}"))
            }
            Ended::TimedOut => res.error = Some(format!("instance hung: killed after {timeout_s} s")),
            _ => {}
        }
        Ok(res)
    })();
    let _ = std::fs::remove_file(&out);
    r.unwrap_or_else(|e| InnerSchedResult { error: Some(e), ..Default::default() })
}

// ------------------------------------------------------------------------------------------- outer: Slurm

/// A one-node Slurm cluster of the harness's own, stopped (`ci/slurm-cluster.sh down`) and removed when dropped.
struct SlurmGuard {
    /// Directory holding every file of the cluster.
    dir: PathBuf,
    /// Scratch working directory of the jobs.
    work: PathBuf,
}

impl SlurmGuard {
    /// `ci/slurm-cluster.sh`.
    fn script() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../ci/slurm-cluster.sh")
    }

    /// Start one; `Err` says why it could not (not root, no slurm-wlm, ...).
    fn up() -> Result<SlurmGuard, String> {
        let dir = std::env::temp_dir().join(format!("vigil-bench-slurm-{}", std::process::id()));
        let work = dir.join("work");
        std::fs::create_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;
        // Guard first: a half-started cluster is stopped too.
        let g = SlurmGuard { dir, work };
        let mut cmd = Command::new(Self::script());
        cmd.arg("up").arg(&g.dir);
        cmd.env("SLURM_SCHED_PARAMS", SLURM_SCHED_PARAMS).env("SLURM_EXTRA_CONF", SLURM_EXTRA_CONF);
        match run_captured(cmd, Duration::from_secs(SLURM_UP_TIMEOUT_S))? {
            Captured::Exited { status, .. } if status.success() => Ok(g),
            Captured::Exited { stderr, .. } => Err(format!("ci/slurm-cluster.sh up: {}", stderr.trim())),
            Captured::TimedOut => Err(format!("ci/slurm-cluster.sh up hung ({SLURM_UP_TIMEOUT_S} s)")),
        }
    }

    /// A Slurm client command pointed at this cluster, run in the scratch directory.
    fn cmd(&self, prog: &str) -> Command {
        let mut c = Command::new(prog);
        c.env("SLURM_CONF", self.dir.join("slurm.conf")).current_dir(&self.work);
        for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("SLURM_") && k != "SLURM_CONF") {
            c.env_remove(k);
        }
        c
    }

    /// Output of `prog args` (error unless it exits 0 within 60 s).
    fn out(&self, prog: &str, args: &[&str]) -> Result<String, String> {
        let mut c = self.cmd(prog);
        c.args(args);
        match run_captured(c, Duration::from_secs(60))? {
            Captured::Exited { status, stdout, .. } if status.success() => Ok(stdout),
            Captured::Exited { status, stderr, .. } => {
                Err(format!("{prog} {}: {status}: {}", args.join(" "), stderr.trim()))
            }
            Captured::TimedOut => Err(format!("{prog} {} hung", args.join(" "))),
        }
    }

    /// Jobs still in the queue, array tasks counted one by one.
    fn queued(&self) -> Result<usize, String> {
        Ok(self.out("squeue", &["-h", "-r", "-o", "%i"])?.lines().filter(|l| !l.trim().is_empty()).count())
    }

    /// True if `squeue -h` shows nothing.
    fn empty(&self) -> Result<bool, String> {
        Ok(self.out("squeue", &["-h", "-o", "%i"])?.trim().is_empty())
    }

    /// Cancel everything and wait (at most 120 s) for the queue to be empty.
    fn drain(&self) {
        let _ = self.out("scancel", &["-u", "root"]);
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(120) && !self.empty().unwrap_or(true) {
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// The cluster's slurm.conf lines that matter for the figures.
    fn config_summary(&self) -> Vec<String> {
        let conf = std::fs::read_to_string(self.dir.join("slurm.conf")).unwrap_or_default();
        let keys = [
            "SchedulerType",
            "SchedulerParameters",
            "SelectType",
            "SelectTypeParameters",
            "ProctrackType",
            "TaskPlugin",
            "MaxJobCount",
            "MaxArraySize",
            "MinJobAge",
            "AccountingStorageType",
            "NodeName",
        ];
        conf.lines()
            .filter(|l| keys.iter().any(|k| l.starts_with(&format!("{k}="))))
            .map(|l| {
                if l.starts_with("NodeName=") {
                    l.split_once(' ').map(|x| format!("NodeName=(this host) {}", x.1)).unwrap_or_default()
                } else {
                    l.to_string()
                }
            })
            .collect()
    }
}

impl Drop for SlurmGuard {
    fn drop(&mut self) {
        let _ = Command::new(Self::script()).arg("down").arg(&self.dir).stdout(Stdio::null()).status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One Slurm throughput run: completed (`done == jobs`) or partial after the bound.
#[derive(Serialize, Debug)]
struct SlurmRun {
    /// How the jobs were submitted.
    how: String,
    /// Jobs submitted.
    jobs: usize,
    /// Jobs that left the queue.
    done: usize,
    /// Seconds from the first submit to the queue empty (or to the bound).
    elapsed_s: f64,
    /// Seconds the submission took.
    submit_s: f64,
    /// done / elapsed.
    jobs_per_s: f64,
    /// False if the bound was hit and the rest cancelled.
    complete: bool,
    /// Error, if the run failed.
    error: Option<String>,
}

/// Time `n` jobs on Slurm: `array` one `sbatch --array=1-n`, else `n` sequential `sbatch`; bounded by `bound`.
fn slurm_throughput(s: &SlurmGuard, n: usize, array: bool, bound: Duration) -> SlurmRun {
    let how = if array {
        format!("sbatch --array=1-{n} -o /dev/null --wrap true")
    } else {
        format!("{n} x sbatch -o /dev/null --wrap true")
    };
    let mut run = SlurmRun {
        how,
        jobs: n,
        done: 0,
        elapsed_s: 0.0,
        submit_s: 0.0,
        jobs_per_s: 0.0,
        complete: false,
        error: None,
    };
    let t0 = Instant::now();
    let r = (|| -> Result<(), String> {
        if array {
            s.out("sbatch", &["-Q", &format!("--array=1-{n}"), "-o", "/dev/null", "--wrap", "true"])?;
        } else {
            for _ in 0..n {
                s.out("sbatch", &["-Q", "-o", "/dev/null", "--wrap", "true"])?;
                if t0.elapsed() > bound {
                    return Err("submission alone exceeded the bound".into());
                }
            }
        }
        run.submit_s = t0.elapsed().as_secs_f64();
        loop {
            if s.empty()? {
                run.elapsed_s = t0.elapsed().as_secs_f64();
                run.done = n;
                run.complete = true;
                return Ok(());
            }
            if t0.elapsed() > bound {
                let left = s.queued()?;
                run.elapsed_s = t0.elapsed().as_secs_f64();
                run.done = n.saturating_sub(left);
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    })();
    if let Err(e) = r {
        run.elapsed_s = t0.elapsed().as_secs_f64();
        run.error = Some(e);
    }
    if run.elapsed_s > 0.0 {
        run.jobs_per_s = run.done as f64 / run.elapsed_s;
    }
    s.drain();
    run
}

/// `srun ARGS true` latencies: one warm-up, then `runs`.
fn slurm_latency(s: &SlurmGuard, args: &[&str], runs: usize) -> (Vec<f64>, Option<String>) {
    let mut v = Vec::new();
    for i in 0..=runs {
        let mut c = s.cmd("srun");
        c.args(args).arg("true");
        match timed_ok(c, &format!("srun {} true", args.join(" "))) {
            Ok(t) if i > 0 => v.push(t),
            Ok(_) => {}
            Err(e) => return (v, Some(e)),
        }
    }
    (v, None)
}

// ------------------------------------------------------------------------------------------- outer: report

/// `{"median","min","max","n"}` of `v`.
fn stats(v: &[f64]) -> Value {
    let (m, lo, hi) = summarize(v);
    json!({"median": m.map(r4), "min": lo.map(r4), "max": hi.map(r4), "n": v.len(), "samples": v.iter().map(|x| r4(*x)).collect::<Vec<_>>()})
}

fn fmt3(x: Option<f64>, prec: usize) -> String {
    x.map(|x| format!("{x:.prec$}")).unwrap_or_else(|| "-".into())
}

/// One depth's Vigil figures: jobs, jobs/s samples, submit seconds, error, and (done, seconds) if the bound was hit.
type VigilDepth = (usize, Vec<f64>, Vec<f64>, Option<String>, Option<(usize, f64)>);

/// The 1-minute load average now: whether the machine was quiet.
pub(crate) fn load_avg() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg").ok().and_then(|l| l.split_whitespace().next()?.parse().ok())
}

/// The node-kill runs: Vigil, then Slurm once per SlurmdTimeout of `a`.
fn nodekill_runs(a: &SchedArgs, vigil: &Path) -> Vec<nodekill::NodeKill> {
    eprintln!("vigil-bench sched: node killed under a Vigil batch job");
    let mut runs = vec![nodekill::vigil(vigil, a.nodekill_bound_s)];
    if !a.no_slurm {
        for &t in &a.slurmd_timeouts {
            eprintln!("vigil-bench sched: node killed under a Slurm --no-kill job (SlurmdTimeout={t} s)");
            runs.push(nodekill::slurm(vigil, t, a.nodekill_bound_s));
        }
    }
    runs
}

/// `vigil-bench sched --only-nodekill`: measure, then replace the node-kill section of `out_dir`'s sched.md
/// (inserted before "## Slurm configuration" if it has none) and the "nodekill" key of sched.json.
fn run_only_nodekill(a: &SchedArgs, vigil: &Path, out_dir: &Path) -> Result<i32, String> {
    let load = load_avg();
    let runs = nodekill_runs(a, vigil);
    let section = nodekill::section(&runs, load);
    println!("{section}");
    let md_path = out_dir.join("sched.md");
    let md = std::fs::read_to_string(&md_path).unwrap_or_default();
    let md = replace_section(&md, "## Node killed under a running job", "## Slurm configuration", &section);
    let json_path = out_dir.join("sched.json");
    let mut doc: Value =
        std::fs::read_to_string(&json_path).ok().and_then(|s| serde_json::from_str(&s).ok()).unwrap_or(json!({}));
    doc["nodekill"] = json!(runs);
    write_results(out_dir, "sched", &doc, &md)?;
    Ok(if runs.iter().any(|r| r.error.is_some()) { 1 } else { 0 })
}

/// What a table keeps of an earlier node-kill comparison when this run skipped it.
const NOT_RERUN: &str = "Not re-run with this build (vigil-bench sched --no-nodekill): an earlier run's figures; \
                         vigil-bench sched --only-nodekill replaces them";

/// The node-kill section of `out_dir`'s sched.md (marked as not re-run, once) and the "nodekill" key of its
/// sched.json, when both are there.
fn kept_nodekill(out_dir: &Path) -> Option<(String, Value)> {
    const HEAD: &str = "## Node killed under a running job";
    let md = std::fs::read_to_string(out_dir.join("sched.md")).ok()?;
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(out_dir.join("sched.json")).ok()?).ok()?;
    let runs = doc.get("nodekill").filter(|v| v.as_array().is_some_and(|a| !a.is_empty()))?.clone();
    let i = md.find(HEAD)?;
    let rest = &md[i + HEAD.len()..];
    let body = rest.find("\n## ").map_or(rest, |j| &rest[..j]).trim();
    let body =
        body.strip_prefix("Not re-run with this build").map_or(body, |b| b.split_once("\n\n").map_or("", |x| x.1));
    Some((format!("{HEAD}\n\n{NOT_RERUN}.\n\n{}\n", body.trim()), runs))
}

/// `md` with its section headed `head` (up to the next "## " heading) replaced by `section`; without one,
/// `section` goes before the heading `before`, or at the end.
fn replace_section(md: &str, head: &str, before: &str, section: &str) -> String {
    let section = format!("{}\n\n", section.trim_end());
    if let Some(i) = md.find(head) {
        let rest = &md[i + head.len()..];
        let end = rest.find("\n## ").map_or(md.len(), |j| i + head.len() + j + 1);
        return format!("{}{section}{}", &md[..i], &md[end..]);
    }
    match md.find(before) {
        Some(i) => format!("{}{section}{}", &md[..i], &md[i..]),
        None if md.is_empty() => section,
        None => format!("{}\n\n{section}", md.trim_end()),
    }
}

/// `vigil-bench sched`.
pub(crate) fn run(a: &SchedArgs, vigil: Option<PathBuf>, out_dir: Option<PathBuf>) -> Result<i32, String> {
    let vigil = find_vigil(vigil)?;
    let out_dir = results_dir(out_dir);
    if a.only_nodekill {
        return run_only_nodekill(a, &vigil, &out_dir);
    }
    let mut failed = Vec::new();
    // The 1-minute load average before the first measurement: whether the machine was quiet.
    let load_at_start = load_avg();

    // Vigil latency.
    eprintln!("vigil-bench sched: vigil run -N1 / -n4 true latency ({} runs)", a.runs);
    let lat = vigil_instance(&vigil, &[format!("--latency-runs={}", a.runs)], 600);
    if let Some(e) = &lat.error {
        failed.push(format!("vigil latency: {e}"));
    }
    // Vigil throughput.
    // (jobs, jobs/s samples, submit seconds, error, partial (done, seconds) when the bound was hit)
    let mut vigil_tput: Vec<VigilDepth> = Vec::new();
    for (i, &n) in a.sizes.iter().enumerate() {
        let runs = *a.tput_runs.get(i).or(a.tput_runs.last()).unwrap_or(&1);
        let (mut tp, mut sub, mut err, mut partial) = (Vec::new(), Vec::new(), None, None);
        for r in 0..runs {
            eprintln!("vigil-bench sched: vigil, {n} jobs at once (sample {}/{runs})", r + 1);
            let args = [format!("--jobs={n}"), format!("--bound-s={}", a.vigil_bound_s)];
            let res = vigil_instance(&vigil, &args, a.vigil_bound_s + 300);
            match (res.error, res.total_s, res.done) {
                (None, Some(t), Some(d)) if d < n => {
                    eprintln!("vigil-bench sched: bound hit, {d} of {n} jobs done in {t:.0} s");
                    partial = Some((d, t));
                    break;
                }
                (None, Some(t), _) => {
                    tp.push(n as f64 / t);
                    sub.extend(res.submit_s);
                }
                (e, _, _) => {
                    err = Some(e.unwrap_or_else(|| "no result".into()));
                    break;
                }
            }
        }
        if let Some(e) = &err {
            failed.push(format!("vigil {n} jobs: {e}"));
        }
        vigil_tput.push((n, tp, sub, err, partial));
    }

    // Slurm.
    let mut slurm_runs: Vec<SlurmRun> = Vec::new();
    let (mut srun_n1, mut srun_n4) = ((Vec::new(), None), (Vec::new(), None));
    let mut slurm_conf = Vec::new();
    let mut slurm_error = None;
    if a.no_slurm {
        slurm_error = Some("skipped (--no-slurm)".to_string());
    } else {
        eprintln!("vigil-bench sched: starting a one-node Slurm cluster");
        match SlurmGuard::up() {
            Err(e) => slurm_error = Some(e),
            Ok(s) => {
                slurm_conf = s.config_summary();
                eprintln!("vigil-bench sched: srun -N1 / -O -n4 true latency ({} runs)", a.runs);
                srun_n1 = slurm_latency(&s, &["-N1"], a.runs);
                srun_n4 = slurm_latency(&s, &["-O", "-n4"], a.runs);
                let bound = Duration::from_secs(a.slurm_bound_s);
                if let Some(&n) = a.sizes.iter().min() {
                    eprintln!("vigil-bench sched: slurm, {n} separate sbatch");
                    slurm_runs.push(slurm_throughput(&s, n, false, bound));
                }
                for &n in &a.sizes {
                    eprintln!("vigil-bench sched: slurm, sbatch --array=1-{n} (bound {} s)", a.slurm_bound_s);
                    slurm_runs.push(slurm_throughput(&s, n, true, bound));
                }
            } // the guard stops the daemons here
        }
    }
    for r in &slurm_runs {
        if let Some(e) = &r.error {
            failed.push(format!("slurm {}: {e}", r.how));
        }
    }
    let nodekill = if a.no_nodekill { Vec::new() } else { nodekill_runs(a, &vigil) };
    for r in &nodekill {
        if let Some(e) = &r.error {
            failed.push(format!("node kill, {}: {e}", r.system));
        }
    }
    for (what, (_, e)) in [("srun -N1", &srun_n1), ("srun -O -n4", &srun_n4)] {
        if let Some(e) = e {
            failed.push(format!("{what}: {e}"));
        }
    }

    // Table.
    let med = |v: &[f64]| summarize(v).0;
    // Vigil's figure at depth n: the median, else the partial rate when the bound was hit (then marked).
    let tp_med =
        |n: usize| vigil_tput.iter().find(|t| t.0 == n).and_then(|t| med(&t.1).or(t.4.map(|(d, s)| d as f64 / s)));
    let partial_mark = |n: usize| {
        if vigil_tput.iter().any(|t| t.0 == n && t.1.is_empty() && t.4.is_some()) {
            " (Vigil partial)"
        } else {
            ""
        }
    };
    let slurm_best = |n: usize| {
        slurm_runs
            .iter()
            .filter(|r| r.jobs == n && r.error.is_none())
            .map(|r| r.jobs_per_s)
            .fold(None, |a: Option<f64>, x| Some(a.map_or(x, |a| a.max(x))))
    };
    let mut md = String::new();
    let ncpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let load = load_at_start.map_or("unknown".to_string(), |l| format!("{l:.2}"));
    md.push_str(&format!(
        "# Scheduling throughput and latency: Vigil vs Slurm 22.05, same run\n\n`vigil-bench sched` ({}, {ncpus} CPUs, \
         1-minute load average {load} at start; unix time {:.0}). Vigil: `vigil start --test-size={SIZE}` \
         (4 brokers on this one machine, 8 cores in all), a fresh instance per throughput sample; jobs submitted \
         through the client API, every `job-manager.submit` pipelined on one connection (as `vigil submit --cc` \
         does), done when the last job is INACTIVE, each checked to exit 0. Slurm: one node, 2 CPUs, started by \
         `ci/slurm-cluster.sh`, done when `squeue -h` is empty; each run bounded to {} s (then cancelled, reported \
         as partial: jobs that left the queue / elapsed). {}\n\n",
        vigil_version(&vigil),
        now_epoch_s(),
        a.slurm_bound_s,
        crate::shell_sentence_for(crate::shell_linkage(&vigil).1)
    ));
    md.push_str("## Throughput (jobs/s, first submit to last job done)\n\n| jobs queued at once | Vigil median | min | max | samples | Slurm `sbatch --array` | Slurm N x `sbatch` | Vigil / Slurm |\n|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    let slurm_cell = |n: usize, array: bool| {
        slurm_runs
            .iter()
            .find(|r| r.jobs == n && r.how.contains("--array") == array)
            .map(|r| match (&r.error, r.complete) {
                (Some(_), _) => "FAILED".to_string(),
                (None, true) => format!("{:.1}", r.jobs_per_s),
                (None, false) => {
                    format!("{:.1} (partial: {} of {} in {:.0} s)", r.jobs_per_s, r.done, r.jobs, r.elapsed_s)
                }
            })
            .unwrap_or_else(|| "not measured".into())
    };
    for (n, tp, _, err, partial) in &vigil_tput {
        let (m, lo, hi) = summarize(tp);
        if let (None, Some((d, t))) = (m, partial) {
            let rate = *d as f64 / t;
            md.push_str(&format!(
                "| {n} | {rate:.1} (partial: {d} of {n} in {t:.0} s) | - | - | 0 | {} | {} | - |\n",
                slurm_cell(*n, true),
                slurm_cell(*n, false)
            ));
            continue;
        }
        let ratio = match (m, slurm_best(*n)) {
            (Some(v), Some(s)) if s > 0.0 => format!("{:.0}x", v / s),
            _ => "-".into(),
        };
        let vm = if err.is_some() { format!("{} (FAILED)", fmt3(m, 1)) } else { fmt3(m, 1) };
        md.push_str(&format!(
            "| {n} | {vm} | {} | {} | {} | {} | {} | {ratio} |\n",
            fmt3(lo, 1),
            fmt3(hi, 1),
            tp.len(),
            slurm_cell(*n, true),
            slurm_cell(*n, false)
        ));
    }
    md.push_str("\nVigil / Slurm: Vigil's median over Slurm's better submission method; against a partial Slurm figure it compares rates over different spans.\n");
    md.push_str("\n## Latency (s)\n\n| command | median | min | max | runs |\n|---|---:|---:|---:|---:|\n");
    let lat_rows: [(&str, &[f64]); 4] = [
        ("`vigil run -N1 true`", &lat.run_n1_s),
        ("`srun -N1 true`", &srun_n1.0),
        ("`vigil run -n4 true`", &lat.run_n4_s),
        ("`srun -O -n4 true`", &srun_n4.0),
    ];
    for (label, v) in lat_rows {
        let (m, lo, hi) = summarize(v);
        md.push_str(&format!("| {label} | {} | {} | {} | {} |\n", fmt3(m, 3), fmt3(lo, 3), fmt3(hi, 3), v.len()));
    }
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if a > 0.0 => format!("{:.1}x", b / a),
        _ => "-".into(),
    };
    md.push_str(&format!(
        "\nSlurm / Vigil latency: -N1 {}, -n4 {}.\n",
        ratio(med(&lat.run_n1_s), med(&srun_n1.0)),
        ratio(med(&lat.run_n4_s), med(&srun_n4.0))
    ));
    // Targets.
    let t10k = tp_med(10_000);
    let t200 = tp_med(200);
    let t64k = tp_med(64_000);
    let yes = |b: bool| if b { "met" } else { "MISSED" };
    md.push_str("\n## Targets (issue 19)\n\n| target | measured | status |\n|---|---|---|\n");
    match (t10k, slurm_best(10_000)) {
        (Some(v), Some(s)) => md.push_str(&format!(
            "| 10,000-job throughput ahead of Slurm's | {v:.1} vs {s:.1} jobs/s ({:.0}x) | {} |\n",
            v / s,
            yes(v > s)
        )),
        _ => md.push_str("| 10,000-job throughput ahead of Slurm's | not measured | - |\n"),
    }
    match t10k {
        Some(v) => md.push_str(&format!(
            "| 10,000-job throughput >= {TARGET_10K_JOBS_PER_S:.0} jobs/s | {v:.1} jobs/s | {} |\n",
            yes(v >= TARGET_10K_JOBS_PER_S)
        )),
        None => md.push_str("| 10,000-job throughput >= 430 jobs/s | not measured | - |\n"),
    }
    match (t64k, t200) {
        (Some(d), Some(s)) => md.push_str(&format!(
            "| 64,000-job throughput >= 90 % of the 200-job figure | {d:.1} / {s:.1} = {:.0} % | {} |\n",
            100.0 * d / s,
            yes(d >= TARGET_DEPTH_FRACTION * s)
        )),
        _ => md.push_str("| 64,000-job throughput >= 90 % of the 200-job figure | not measured | - |\n"),
    }
    for n in [10_000, 64_000] {
        if !partial_mark(n).is_empty() {
            md.push_str(&format!(
                "\nAt {n} jobs the Vigil figure is a partial rate: the burst hit its bound before every job was done.\n"
            ));
        }
    }
    // Skipped (--no-nodekill): the node-kill figures already in `out_dir` stay, marked as not re-run, instead of
    // being dropped from the table.
    let kept = if a.no_nodekill { kept_nodekill(&out_dir) } else { None };
    if !nodekill.is_empty() {
        md.push('\n');
        md.push_str(&nodekill::section(&nodekill, load_avg()));
    } else if let Some((section, _)) = &kept {
        md.push('\n');
        md.push_str(section);
    }
    md.push_str("\n## Slurm configuration\n\n");
    match &slurm_error {
        Some(e) => md.push_str(&format!("Slurm not measured: {e}\n")),
        None => {
            md.push_str("```\n");
            for l in &slurm_conf {
                md.push_str(l);
                md.push('\n');
            }
            md.push_str("```\n");
        }
    }
    if !failed.is_empty() {
        md.push_str("\nFailures:\n\n");
        for f in &failed {
            md.push_str(&format!("- {f}\n"));
        }
    }
    println!("{md}");
    let doc = json!({
        "benchmark": "vigil-bench sched",
        "vigil_version": vigil_version(&vigil),
        "cpus": ncpus,
        "unix_time_s": now_epoch_s().round(),
        "vigil": {
            "instance_size": SIZE,
            "shell_linkage": crate::shell_linkage(&vigil).1,
            "latency_s": {"run_n1": stats(&lat.run_n1_s), "run_n4": stats(&lat.run_n4_s)},
            "throughput": vigil_tput.iter().map(|(n, tp, sub, e, p)| json!({"jobs": n, "jobs_per_s": stats(tp), "submit_s": stats(sub), "error": e, "partial": p.map(|(d, t)| json!({"done": d, "elapsed_s": r4(t), "jobs_per_s": r4(d as f64 / t)}))})).collect::<Vec<_>>(),
        },
        "slurm": {
            "error": slurm_error,
            "config": slurm_conf,
            "bound_s": a.slurm_bound_s,
            "latency_s": {"srun_n1": stats(&srun_n1.0), "srun_O_n4": stats(&srun_n4.0)},
            "throughput": slurm_runs,
        },
        "nodekill": nodekill,
        "failures": failed,
    });
    let mut doc = doc;
    if let Some((_, runs)) = kept {
        doc["nodekill"] = runs;
        doc["nodekill_note"] = json!(NOT_RERUN);
    }
    write_results(&out_dir, "sched", &doc, &md)?;
    Ok(if failed.is_empty() { 0 } else { 1 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_without_the_node_kill_keeps_the_earlier_figures_marked_once() {
        let dir = std::env::temp_dir().join(format!("vigil-bench-sched-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let md = "# t\n\n## Node killed under a running job\n\nNot re-run with this build (old words).\n\n| a |\n\n## Slurm configuration\n\nx\n";
        std::fs::write(dir.join("sched.md"), md).unwrap();
        std::fs::write(dir.join("sched.json"), r#"{"nodekill": [{"system": "vigil"}]}"#).unwrap();
        let (section, runs) = kept_nodekill(&dir).unwrap();
        assert_eq!(runs, json!([{"system": "vigil"}]));
        assert_eq!(section.matches("Not re-run").count(), 1, "{section}");
        assert!(section.contains("| a |") && !section.contains("old words") && !section.contains("Slurm"), "{section}");
        // Nothing kept where there was no comparison.
        std::fs::write(dir.join("sched.json"), r#"{"nodekill": []}"#).unwrap();
        assert!(kept_nodekill(&dir).is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
