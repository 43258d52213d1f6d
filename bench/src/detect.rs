//! `vigil-bench detect`: failure-detection latencies on network-namespace nodes (`ci/netns-cluster.sh`), for
//! each detector mode (`--modes ebpf,userspace`: the default eBPF detectors, and the userspace fallback forced
//! with `broker.detectors=userspace`) in the same run.
//!
//! Every latency is taken from rank 0's own records, not by polling: t0 is this harness's wall clock right
//! before the failure is injected, and the verdict's time is the timestamp rank 0 wrote in its RFC 44 resource
//! eventlog (`offline` = lost, `torpid`) or in the job's eventlog (`exception`). The eventlogs are polled only
//! to know when to move on. The measurements:
//!
//! (a) broker `kill -9` (sent by this harness to the pid in `nodeK/broker.pid`) → `offline`;
//! (b) silent node loss (`netns-cluster.sh kill NAME K`: link cut, then every process of the node SIGKILLed)
//!     → `offline`; t0 is taken before the script starts, so its start-up (a few ms) counts against Vigil;
//! (c) a batch job (`vigil batch -N3`, script `sleep`) whose non-critical node is silently killed → its
//!     `exception` event (expected: `node-failure`, severity 2, the job keeps running; then it is canceled);
//! (d) broker SIGSTOPped (`netns-cluster.sh stall NAME K`) for `--stall-s` → `torpid`; then `cont`, wait for
//!     `lively`, and count `offline` verdicts for that rank since t0 (false lost verdicts: must be 0);
//! (e) task kill → job exception ([`task`]): a 2-task job with `-o exit-on-error` on one node; the harness
//!     SIGKILLs task 0, a small process or one with `--big-mib` MiB resident, and times the job's `exception`;
//!     the reference is `waitpid` on the same program spawned by the harness;
//! (f) the prober's CPU cost ([`cost`]): rank 0 of a flat `vigil start` instance probing `--cost-children`
//!     children, with default probes and with probes effectively off;
//! (g) re-parenting ([`reparent`]): a router's node silently lost (7 nodes, `kary:2`, rank 1) → its children
//!     re-parented and answering pings from rank 0 again, from the loss, from rank 0's lost verdict and from
//!     the children's own verdict on their parent.
//!
//! Clusters are reused: (a) and (b) kill `--victims` different nodes (ranks 1..) of a cluster of victims+1
//! nodes, (c) needs victims+3 nodes (each trial uses 3 and loses 1), (d) cycles through the 5 non-root
//! nodes of a 6-node cluster, (e) uses one 2-node cluster per mode and task size, (g) a fresh 7-node cluster per
//! trial. Every cluster is brought
//! `down` when done, on error, on panic, and on SIGINT/SIGTERM/SIGHUP. A cluster is used only once every
//! broker reports its detectors loaded (`broker.info`); what each ran on is kept in the JSON.
//! The latency CDFs of every (measurement, mode) are drawn into `detect-cdf.png` ([`cdf`]).

mod cdf;
mod cost;
mod reparent;
mod task;

pub(crate) use cost::{inner as inner_cost, InnerCostArgs};

use crate::{
    find_vigil, last_line, now_epoch_s, p99, r4, results_dir, run_captured, run_captured_with, signal_group, summarize,
    vigil_version, write_results, Captured,
};
use clap::Args;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use vigil::client::Client;
use vigil::idset::IdSet;
use vigil::jobs::JobId;

/// Default trials per measurement (the brief asks for at least 20).
pub(crate) const DEFAULT_TRIALS: usize = 20;
/// flux-core 0.88 on this machine: broker `kill -9` → lost, median, seconds (at most one 2 s heartbeat).
const REF_KILL9_S: (f64, f64) = (1.83, 1.83);
/// flux-core 0.88: silent node loss → lost, seconds (the 20 s TCP user timeout).
const REF_SILENT_S: (f64, f64) = (20.0, 20.0);
/// flux-core 0.88: node-failure exception on a nested job when a non-critical node is lost, seconds (range).
const REF_NESTED_S: (f64, f64) = (0.37, 0.70);
/// flux-core 0.88: stalled broker → torpid, seconds (range).
const REF_TORPID_S: (f64, f64) = (28.0, 30.0);
/// Target with eBPF detectors: broker or task death → verdict, p99, seconds.
const TARGET_DEATH_S: f64 = 0.005;
/// Target with eBPF detectors: silent node loss → lost, p99, seconds.
const TARGET_SILENT_S: f64 = 0.050;
/// Target: the prober's CPU cost with 256 children, % of one core.
const TARGET_COST_PCT: f64 = 1.0;
/// How long to wait for a lost verdict before the trial counts as failed.
const LOST_TIMEOUT_S: f64 = 30.0;
/// Pause after each trial, so its aftermath (release, subtree reports) settles before the next failure.
const SETTLE_S: f64 = 0.2;
/// Eventlog polling interval (only decides when to move on; latencies come from timestamps).
const POLL_S: f64 = 0.01;
/// Nodes of the stall cluster (ranks 1..5 are stalled in turn).
const STALL_NODES: usize = 6;
/// Nodes of each nested batch job.
const BATCH_NODES: usize = 3;
/// How long a fresh cluster may take to load its detectors.
const DETECTORS_TIMEOUT_S: f64 = 60.0;
/// Every part of the benchmark, in the order they run.
const ALL_PARTS: &[&str] = &["a", "b", "c", "d", "e", "f", "g"];
/// Target with eBPF detectors: a lost router's children reachable from rank 0 again after the lost verdict, p99.
const TARGET_REPARENT_S: f64 = 0.100;

/// Options of `vigil-bench detect`.
#[derive(Args, Debug, Clone)]
pub(crate) struct DetectArgs {
    /// Trials per measurement (at least 20 for the published table), small-task kills included.
    #[arg(long, default_value_t = DEFAULT_TRIALS)]
    pub(crate) trials: usize,
    /// Trials of the big-task kill and its waitpid reference (at least 10 for the published table).
    #[arg(long, default_value_t = 10)]
    pub(crate) big_trials: usize,
    /// Resident memory of the big task, MiB (every page touched).
    #[arg(long, default_value_t = 4096)]
    pub(crate) big_mib: u64,
    /// Victims per cluster for the kill measurements (a fresh cluster is brought up for each batch of victims).
    #[arg(long, default_value_t = 10)]
    pub(crate) victims: usize,
    /// How long each broker stays SIGSTOPped in the stall measurement, seconds.
    #[arg(long, default_value_t = 3.0)]
    pub(crate) stall_s: f64,
    /// Detector modes measured, in the same run: `ebpf` (the brokers' default, auto) and/or `userspace`
    /// (`broker.detectors=userspace`).
    #[arg(long, value_delimiter = ',', default_value = "ebpf,userspace")]
    pub(crate) modes: Vec<String>,
    /// Parts run: a (kill -9), b (silent loss), c (batch job), d (stall), e (task kill), f (prober CPU),
    /// g (re-parenting). A run of only some parts writes `detect-PARTS.{json,md}` and `detect-PARTS-cdf.png`
    /// (e.g. `detect-g`), leaving the full run's results alone.
    #[arg(long, value_delimiter = ',', default_value = "a,b,c,d,e,f,g")]
    pub(crate) parts: Vec<String>,
    /// Children of rank 0 in the prober CPU measurement (a flat instance of this many + 1 brokers), one
    /// measurement per number.
    #[arg(long, value_delimiter = ',', default_value = "256,128")]
    pub(crate) cost_children: Vec<usize>,
    /// Idle seconds over which the prober's CPU time is measured.
    #[arg(long, default_value_t = 25.0)]
    pub(crate) cost_idle_s: f64,
    /// Instances per variant of the prober CPU measurement (the variants alternate).
    #[arg(long, default_value_t = 1)]
    pub(crate) cost_runs: usize,
    /// The netns cluster script (default: ci/netns-cluster.sh of the source tree).
    #[arg(long, value_name = "PATH")]
    pub(crate) netns_script: Option<PathBuf>,
}

impl Default for DetectArgs {
    fn default() -> Self {
        DetectArgs {
            trials: DEFAULT_TRIALS,
            big_trials: 10,
            big_mib: 4096,
            victims: 10,
            stall_s: 3.0,
            modes: vec!["ebpf".into(), "userspace".into()],
            parts: ALL_PARTS.iter().map(|p| p.to_string()).collect(),
            cost_children: vec![256, 128],
            cost_idle_s: 25.0,
            cost_runs: 1,
            netns_script: None,
        }
    }
}

/// A detector mode: its name and the broker arguments that select it.
#[derive(Clone, Debug)]
pub(crate) struct Mode {
    /// `ebpf` or `userspace`.
    name: &'static str,
    /// Extra `vigil broker` arguments (after `VIGIL_BENCH_BROKER_ARGS`).
    broker_args: Vec<String>,
}

impl Mode {
    /// The mode called `name`.
    fn parse(name: &str) -> Result<Mode, String> {
        // Extra broker arguments for every mode, e.g. `VIGIL_BENCH_BROKER_ARGS=--setattr=tbon.probe_misses=4`.
        let mut broker_args: Vec<String> = std::env::var("VIGIL_BENCH_BROKER_ARGS")
            .unwrap_or_default()
            .split_whitespace()
            .map(str::to_string)
            .collect();
        match name {
            "ebpf" => Ok(Mode { name: "ebpf", broker_args }),
            "userspace" => {
                broker_args.push("--setattr=broker.detectors=userspace".into());
                Ok(Mode { name: "userspace", broker_args })
            }
            m => Err(format!("unknown mode '{m}': expected ebpf or userspace")),
        }
    }

    /// Does `detectors` (one broker's `broker.info` detectors) show this mode in force?
    fn in_force(&self, d: &Value) -> bool {
        let f = |k: &str| d[k].as_str().unwrap_or("").to_string();
        match self.name {
            "ebpf" => f("process_exit") == "ebpf" && f("tcp") == "ebpf" && f("responder").starts_with("xdp"),
            _ => ["process_exit", "tcp", "responder"].iter().all(|k| f(k).starts_with("userspace")),
        }
    }
}

/// What every measurement needs.
struct Ctx<'a> {
    /// The harness's tokio runtime (client RPCs).
    rt: &'a tokio::runtime::Runtime,
    /// The netns script.
    script: &'a Path,
    /// The `vigil` binary.
    vigil: &'a Path,
    /// The options.
    a: &'a DetectArgs,
    /// Scratch directory.
    work: &'a Path,
}

// ------------------------------------------------------------------------------------------- clusters

/// Names of the clusters currently up, for the signal handler.
static LIVE: Mutex<Vec<(PathBuf, PathBuf, String)>> = Mutex::new(Vec::new());
/// Counter making cluster names unique within this process.
static NEXT_NAME: AtomicUsize = AtomicUsize::new(0);
/// Process group of the netns script now running (0: none), killed first on a signal so that a half-done
/// `up` cannot race the `down` that follows.
static SCRIPT_PGID: AtomicU32 = AtomicU32::new(0);
/// Held while a netns script is being spawned, and by the signal handler from the moment it fires: no script
/// (an `up` especially) can start after the handler has begun bringing clusters down.
static SPAWN: Mutex<()> = Mutex::new(());
/// Nested jobs submitted to our clusters, whose run directories the signal handler removes.
static JOBS: Mutex<Vec<JobId>> = Mutex::new(Vec::new());
/// The harness's scratch directory, removed by the signal handler too.
static WORK_DIR: Mutex<Option<PathBuf>> = Mutex::new(None);
/// Set by the signal handler; every later netns script fails at once.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Bring cluster `name` down with `script` (best effort, output discarded).
fn down(script: &Path, vigil: &Path, name: &str) {
    let _ = Command::new(script)
        .args(["down", name])
        .env("VIGIL", vigil)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status();
}

/// On SIGINT, SIGTERM or SIGHUP: bring every live cluster down, then exit 130.
fn install_signal_cleanup() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
            Ok(rt) => rt,
            Err(_) => return,
        };
        use tokio::signal::unix::{signal, SignalKind};
        // Register the handlers now (on this thread), so no signal slips through before the thread runs.
        let sigs = rt.block_on(async {
            (signal(SignalKind::interrupt()), signal(SignalKind::terminate()), signal(SignalKind::hangup()))
        });
        let (Ok(mut int), Ok(mut term), Ok(mut hup)) = sigs else { return };
        std::thread::spawn(move || {
            rt.block_on(async {
                tokio::select! {
                    _ = int.recv() => {}
                    _ = term.recv() => {}
                    _ = hup.recv() => {}
                }
            });
            eprintln!("vigil-bench: interrupted: bringing the netns clusters down");
            // Held until exit: the main thread cannot start another script meanwhile.
            let _spawn = SPAWN.lock().unwrap_or_else(|p| p.into_inner());
            INTERRUPTED.store(true, Ordering::SeqCst);
            let pgid = SCRIPT_PGID.load(Ordering::SeqCst);
            if pgid != 0 {
                signal_group(pgid, "KILL");
            }
            let live = LIVE.lock().map(|l| l.clone()).unwrap_or_default();
            for (script, vigil, name) in live {
                down(&script, &vigil, &name);
            }
            remove_job_rundirs(&JOBS.lock().map(|j| j.clone()).unwrap_or_default());
            if let Some(w) = WORK_DIR.lock().ok().and_then(|w| w.clone()) {
                let _ = std::fs::remove_dir_all(w);
            }
            std::process::exit(130);
        });
    });
}

/// One netns cluster; brought down when dropped.
struct Cluster {
    /// Short unique name (<= 6 characters).
    name: String,
    /// The netns script.
    script: PathBuf,
    /// The `vigil` binary the brokers run.
    vigil: PathBuf,
    /// State directory of the cluster (`nodeK/broker.pid` etc.).
    dir: PathBuf,
    /// Client connected to rank 0.
    client: Option<Client>,
    /// Every rank's detectors (`broker.info`), once loaded.
    detectors: Value,
    /// Does every rank run the detectors of the mode asked for?
    mode_in_force: bool,
}

impl Cluster {
    /// A fresh unused name: `vb` + 3 digits of our pid + a counter letter.
    fn fresh_name(netns_dir: &Path) -> String {
        let netns = Command::new("ip")
            .args(["netns", "list"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        loop {
            let i = NEXT_NAME.fetch_add(1, Ordering::SeqCst);
            let tag = char::from_digit((i % 36) as u32, 36).unwrap_or('z');
            let name = format!("vb{:03}{tag}", (std::process::id() as usize + i / 36) % 1000);
            if !netns_dir.join(format!("vigil-netns-{name}")).exists() && !netns.contains(&format!("vn-{name}-")) {
                return name;
            }
        }
    }

    /// Bring up an `n`-node cluster with `mode`'s detectors, connect to its rank 0, and wait until every
    /// broker has loaded its detectors.
    fn up(ctx: &Ctx<'_>, n: usize, mode: &Mode) -> Result<Cluster, String> {
        let (rt, script, vigil) = (ctx.rt, ctx.script, ctx.vigil);
        let netns_dir = PathBuf::from(std::env::var("VIGIL_NETNS_DIR").unwrap_or_else(|_| "/tmp".into()));
        let name = Cluster::fresh_name(&netns_dir);
        let dir = netns_dir.join(format!("vigil-netns-{name}"));
        if let Ok(mut l) = LIVE.lock() {
            l.push((script.to_path_buf(), vigil.to_path_buf(), name.clone()));
        }
        // From here on, dropping `c` (on any error) brings whatever was created down.
        let mut c = Cluster {
            name,
            script: script.to_path_buf(),
            vigil: vigil.to_path_buf(),
            dir,
            client: None,
            detectors: Value::Null,
            mode_in_force: false,
        };
        let mut args = vec!["up".to_string(), c.name.clone(), n.to_string()];
        args.extend(mode.broker_args.iter().cloned());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        c.script_cmd(&args, 120)?;
        let uri = c.script_cmd(&["uri", &c.name.clone()], 10)?.trim().to_string();
        let client = rt
            .block_on(Client::connect(&uri))
            .map_err(|e| format!("cannot connect to rank 0 of cluster {} at {uri}: {e}", c.name))?;
        c.client = Some(client);
        // Detectors load in the background once a broker is up: wait for every rank's.
        let deadline = Instant::now() + Duration::from_secs_f64(DETECTORS_TIMEOUT_S);
        let mut per_rank = vec![Value::Null; n];
        loop {
            for (k, d) in per_rank.iter_mut().enumerate() {
                if d.is_null() || d.to_string().contains("loading") {
                    let r = rt
                        .block_on(c.client().rpc("broker.info", k as u32, &json!({})))
                        .map_err(|e| format!("broker.info rank {k}: {e}"))?;
                    *d = r["detectors"].clone();
                }
            }
            if per_rank.iter().all(|d| !d.is_null() && !d.to_string().contains("loading")) {
                break;
            }
            if Instant::now() >= deadline {
                return Err(format!("cluster {}: detectors still loading after {DETECTORS_TIMEOUT_S} s", c.name));
            }
            sleep_s(0.05);
        }
        c.mode_in_force = per_rank.iter().all(|d| mode.in_force(d));
        if !c.mode_in_force {
            eprintln!(
                "vigil-bench: warning: cluster {} ({} mode) runs other detectors: {}",
                c.name, mode.name, per_rank[0]
            );
        }
        c.detectors = Value::Array(per_rank);
        Ok(c)
    }

    /// Run the netns script with `args`; its stdout, or an error quoting its stderr.
    fn script_cmd(&self, args: &[&str], timeout_s: u64) -> Result<String, String> {
        let mut cmd = Command::new(&self.script);
        cmd.args(args).env("VIGIL", &self.vigil);
        let spawning = SPAWN.lock().unwrap_or_else(|p| p.into_inner());
        if INTERRUPTED.load(Ordering::SeqCst) {
            return Err("interrupted".into());
        }
        // The spawn lock is released as soon as the script runs and its process group is known (or if the
        // spawn fails and the closure is dropped).
        let r = run_captured_with(cmd, Duration::from_secs(timeout_s), move |pgid| {
            SCRIPT_PGID.store(pgid, Ordering::SeqCst);
            drop(spawning);
        });
        SCRIPT_PGID.store(0, Ordering::SeqCst);
        match r? {
            Captured::Exited { status, stdout, .. } if status.success() => Ok(stdout),
            Captured::Exited { status, stderr, .. } => {
                Err(format!("`netns-cluster.sh {}` failed: {status}: {}", args.join(" "), last_line(&stderr)))
            }
            Captured::TimedOut => {
                Err(format!("`netns-cluster.sh {}` hung: killed after {timeout_s} s", args.join(" ")))
            }
        }
    }

    /// Client connected to rank 0.
    fn client(&self) -> &Client {
        self.client.as_ref().expect("connected in Cluster::up")
    }

    /// Pid of node `k`'s broker, checked to be a `vigil broker` of this cluster.
    fn broker_pid(&self, k: usize) -> Result<i32, String> {
        let f = self.dir.join(format!("node{k}/broker.pid"));
        let pid: i32 = std::fs::read_to_string(&f)
            .map_err(|e| format!("{}: {e}", f.display()))?
            .trim()
            .parse()
            .map_err(|e| format!("{}: {e}", f.display()))?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let want = format!("--rundir={}", self.dir.join(format!("node{k}")).display());
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        if args.get(1) != Some(&b"broker".as_slice()) || !args.contains(&want.as_bytes()) {
            return Err(format!("pid {pid} in {} is not node {k}'s broker", f.display()));
        }
        Ok(pid)
    }

    /// Run `vigil ARGS` against rank 0; its stdout.
    fn vigil_cmd(&self, args: &[&str], cwd: &Path) -> Result<String, String> {
        let uri = format!("local://{}", self.dir.join("node0/local-0").display());
        let mut cmd = Command::new(&self.vigil);
        cmd.args(args).env(vigil::client::URI_ENV, uri).current_dir(cwd);
        match run_captured(cmd, Duration::from_secs(30))? {
            Captured::Exited { status, stdout, .. } if status.success() => Ok(stdout),
            Captured::Exited { status, stderr, .. } => {
                Err(format!("`vigil {}` failed: {status}: {}", args.join(" "), last_line(&stderr)))
            }
            Captured::TimedOut => Err(format!("`vigil {}` hung", args.join(" "))),
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.client = None;
        down(&self.script, &self.vigil, &self.name);
        if let Ok(mut l) = LIVE.lock() {
            l.retain(|(_, _, n)| *n != self.name);
        }
    }
}

// ------------------------------------------------------------------------------------------- eventlogs

/// One RFC 44 resource event.
struct ResEvent {
    /// `online`, `offline`, `torpid`, `lively`, ...
    name: String,
    /// Ranks it concerns.
    ranks: IdSet,
    /// Rank 0's wall clock when it was recorded, epoch seconds.
    ts: f64,
}

/// Rank 0's resource eventlog.
fn resource_events(rt: &tokio::runtime::Runtime, c: &Client) -> Result<Vec<ResEvent>, String> {
    let r = rt.block_on(c.rpc("resource.eventlog", 0, &json!({}))).map_err(|e| format!("resource.eventlog: {e}"))?;
    let mut out = Vec::new();
    for e in r["eventlog"].as_array().cloned().unwrap_or_default() {
        let ranks = IdSet::parse(e["context"]["idset"].as_str().unwrap_or("")).unwrap_or_default();
        out.push(ResEvent {
            name: e["name"].as_str().unwrap_or("").to_string(),
            ranks,
            ts: e["timestamp"].as_f64().unwrap_or(0.0),
        });
    }
    Ok(out)
}

/// Poll the resource eventlog until an event `name` for rank `k` stamped at or after `since` appears; its timestamp.
fn wait_res_event(
    rt: &tokio::runtime::Runtime,
    c: &Client,
    name: &str,
    k: usize,
    since: f64,
    timeout_s: f64,
) -> Result<Option<f64>, String> {
    let deadline = Instant::now() + Duration::from_secs_f64(timeout_s);
    loop {
        let evs = resource_events(rt, c)?;
        if let Some(e) = evs.iter().find(|e| e.name == name && e.ranks.contains(k as u32) && e.ts >= since) {
            return Ok(Some(e.ts));
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        std::thread::sleep(Duration::from_secs_f64(POLL_S));
    }
}

/// Job `id`'s eventlog so far.
fn job_events(rt: &tokio::runtime::Runtime, c: &Client, id: JobId) -> Result<Vec<Value>, String> {
    rt.block_on(async {
        let mut s = c
            .rpc_stream("job-manager.eventlog", 0, &json!({"id": id.0, "follow": false}))
            .map_err(|e| format!("eventlog {id}: {e}"))?;
        let mut v = Vec::new();
        while let Some(item) = s.next().await {
            let item = item.map_err(|e| format!("eventlog {id}: {e}"))?;
            if let Some(e) = item.get("event") {
                v.push(e.clone());
            }
        }
        Ok(v)
    })
}

/// Job `id`'s `job-manager.info` summary.
fn job_info(rt: &tokio::runtime::Runtime, c: &Client, id: JobId) -> Result<Value, String> {
    let r = rt
        .block_on(c.rpc("job-manager.info", 0, &json!({"id": id.0})))
        .map_err(|e| format!("job-manager.info {id}: {e}"))?;
    Ok(r["info"].clone())
}

/// Poll job `id` until `pred(info)` holds; the info, or an error after `timeout_s`.
fn wait_job(
    rt: &tokio::runtime::Runtime,
    c: &Client,
    id: JobId,
    what: &str,
    timeout_s: f64,
    pred: impl Fn(&Value) -> bool,
) -> Result<Value, String> {
    let deadline = Instant::now() + Duration::from_secs_f64(timeout_s);
    loop {
        let info = job_info(rt, c, id)?;
        if pred(&info) {
            return Ok(info);
        }
        if Instant::now() >= deadline {
            return Err(format!("job {id}: not {what} after {timeout_s} s (state {})", info["state"]));
        }
        std::thread::sleep(Duration::from_secs_f64(POLL_S));
    }
}

fn sleep_s(s: f64) {
    std::thread::sleep(Duration::from_secs_f64(s.max(0.0)));
}

// ------------------------------------------------------------------------------------------- measurements

/// Samples of one measurement, with every trial's record and the first error.
#[derive(Default)]
struct Series {
    /// Latencies, seconds.
    samples: Vec<f64>,
    /// Per-trial records for the JSON.
    trials: Vec<Value>,
    /// Why the measurement stopped early, if it did.
    error: Option<String>,
    /// (d) only: offline verdicts for stalled ranks.
    false_lost: usize,
    /// (d) only: trials that reached `lively` after `cont`.
    lively: usize,
    /// (c) only: trials whose job was still running after the node-failure exception.
    survived: usize,
    /// (e) only: trials whose kill raised no exit-on-error exception (the job ended by exit-timeout instead).
    no_exception: usize,
    /// Every rank's detectors in the first cluster used (`broker.info`).
    detectors: Value,
    /// Did every cluster used run the detectors of the mode asked for?
    mode_in_force: Option<bool>,
}

impl Series {
    /// Record the detectors of a cluster this series used.
    fn note_cluster(&mut self, cl: &Cluster) {
        if self.detectors.is_null() {
            self.detectors = cl.detectors.clone();
        }
        self.mode_in_force = Some(self.mode_in_force.unwrap_or(true) && cl.mode_in_force);
    }
}

extern "C" {
    /// kill(2), from the C library std already links.
    fn kill(pid: i32, sig: i32) -> i32;
}

/// SIGKILL `pid` directly (no helper process between t0 and the signal).
fn sigkill(pid: i32) -> Result<(), String> {
    // SAFETY: kill(2) has no memory-safety preconditions; `pid` was checked to be one of our brokers.
    let rc = unsafe { kill(pid, 9) };
    if rc != 0 {
        return Err(format!("kill -9 {pid}: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

/// How (a)/(b) kill a node.
#[derive(Clone, Copy, PartialEq)]
enum Kill {
    /// `kill -9` of the broker only.
    Broker,
    /// `netns-cluster.sh kill`: the node vanishes silently.
    Silent,
}

/// (a) or (b): kill `trials` nodes, `victims` per cluster, and time each `offline` verdict.
fn measure_lost(ctx: &Ctx<'_>, mode: &Mode, how: Kill) -> Series {
    let (rt, a) = (ctx.rt, ctx.a);
    let mut s = Series::default();
    let r = (|| -> Result<(), String> {
        while s.samples.len() < a.trials {
            let n = a.victims.min(a.trials - s.samples.len());
            let cl = Cluster::up(ctx, n + 1, mode)?;
            s.note_cluster(&cl);
            for k in 1..=n {
                let pid = if how == Kill::Broker { Some(cl.broker_pid(k)?) } else { None };
                let t0 = now_epoch_s();
                match pid {
                    Some(pid) => sigkill(pid)?,
                    None => {
                        cl.script_cmd(&["kill", &cl.name, &k.to_string()], 30)?;
                    }
                }
                let t_injected = now_epoch_s();
                let ts = wait_res_event(rt, cl.client(), "offline", k, t0, LOST_TIMEOUT_S)?.ok_or_else(|| {
                    format!("cluster {} rank {k}: no offline verdict within {LOST_TIMEOUT_S} s", cl.name)
                })?;
                s.samples.push(ts - t0);
                s.trials.push(json!({"cluster": cl.name, "rank": k, "t0": t0, "inject_s": r4(t_injected - t0), "offline_ts": ts, "latency_s": r4(ts - t0)}));
                sleep_s(SETTLE_S);
            }
        }
        Ok(())
    })();
    s.error = r.err();
    s
}

/// (c): nested batch jobs of 3 nodes; silently kill one non-critical node each, time the job's exception.
fn measure_nested(ctx: &Ctx<'_>, mode: &Mode) -> Series {
    let (rt, a, work) = (ctx.rt, ctx.a, ctx.work);
    let mut s = Series::default();
    let batch = work.join("sleep.sh");
    let r = (|| -> Result<(), String> {
        std::fs::write(&batch, "#!/bin/sh\nexec sleep 600\n").map_err(|e| format!("{}: {e}", batch.display()))?;
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&batch, std::fs::Permissions::from_mode(0o755))
                .map_err(|e| format!("{}: {e}", batch.display()))?;
        }
        while s.samples.len() < a.trials {
            let n = a.victims.min(a.trials - s.samples.len());
            let cl = Cluster::up(ctx, n + BATCH_NODES, mode)?;
            s.note_cluster(&cl);
            let mut job_ids = Vec::new();
            let r = (|| -> Result<(), String> {
                for _ in 0..n {
                    let batch_s = batch.display().to_string();
                    let out =
                        cl.vigil_cmd(&["batch", &format!("-N{BATCH_NODES}"), "--output=/dev/null", &batch_s], work)?;
                    let id = JobId::parse(out.trim()).map_err(|e| format!("vigil batch printed {out:?}: {e}"))?;
                    job_ids.push(id);
                    if let Ok(mut j) = JOBS.lock() {
                        j.push(id);
                    }
                    let info = wait_job(rt, cl.client(), id, "running as an instance", 30.0, |i| {
                        i["state"] == "RUN" && i["instance"]["uri"].is_string()
                    })?;
                    // The child instance reported itself; give its brokers a moment to finish wiring up.
                    sleep_s(0.3);
                    let ranks = IdSet::parse(info["ranks"].as_str().unwrap_or(""))
                        .map_err(|e| format!("job {id} ranks: {e}"))?;
                    let crit = IdSet::parse(info["instance"]["critical_broker_ranks"].as_str().unwrap_or("0"))
                        .map_err(|e| format!("job {id} critical ranks: {e}"))?;
                    let victim = ranks.iter().rev().find(|r| *r != 0 && !crit.contains(*r)).ok_or_else(|| {
                        format!("job {id}: no non-critical node besides rank 0 (ranks {ranks}, critical {crit})")
                    })?;
                    let t0 = now_epoch_s();
                    cl.script_cmd(&["kill", &cl.name, &victim.to_string()], 30)?;
                    let t_injected = now_epoch_s();
                    let deadline = Instant::now() + Duration::from_secs_f64(LOST_TIMEOUT_S);
                    let exc = loop {
                        let evs = job_events(rt, cl.client(), id)?;
                        if let Some(e) = evs
                            .into_iter()
                            .find(|e| e["name"] == "exception" && e["timestamp"].as_f64().unwrap_or(0.0) >= t0)
                        {
                            break e;
                        }
                        if Instant::now() >= deadline {
                            return Err(format!(
                                "job {id}: no exception within {LOST_TIMEOUT_S} s of losing rank {victim}"
                            ));
                        }
                        sleep_s(POLL_S);
                    };
                    let ts = exc["timestamp"].as_f64().unwrap_or(0.0);
                    let severity = exc["context"]["severity"].as_u64();
                    let kind = exc["context"]["type"].as_str().unwrap_or("").to_string();
                    let offline = resource_events(rt, cl.client())?
                        .into_iter()
                        .find(|e| e.name == "offline" && e.ranks.contains(victim) && e.ts >= t0)
                        .map(|e| e.ts);
                    sleep_s(0.1);
                    let state = job_info(rt, cl.client(), id)?["state"].as_str().unwrap_or("").to_string();
                    s.samples.push(ts - t0);
                    s.trials.push(json!({
                        "cluster": cl.name, "job": id.to_string(), "job_ranks": ranks.to_string(), "critical": crit.to_string(),
                        "rank": victim, "t0": t0, "inject_s": r4(t_injected - t0), "exception_ts": ts, "latency_s": r4(ts - t0),
                        "type": kind, "severity": severity, "offline_ts": offline, "state_after": state,
                    }));
                    if severity == Some(0) || kind != "node-failure" {
                        return Err(format!("job {id}: losing non-critical rank {victim} raised {kind} severity {severity:?}, not a non-fatal node-failure"));
                    }
                    if state == "RUN" {
                        s.survived += 1;
                    }
                    rt.block_on(cl.client().rpc(
                        "job-manager.cancel",
                        0,
                        &json!({"id": id.0, "note": "vigil-bench detect: trial done"}),
                    ))
                    .map_err(|e| format!("cancel {id}: {e}"))?;
                    wait_job(rt, cl.client(), id, "inactive after cancel", 30.0, |i| i["state"] == "INACTIVE")?;
                    sleep_s(SETTLE_S);
                }
                Ok(())
            })();
            drop(cl);
            // A killed node cannot clean its nested broker's run directory up; do it for our jobs.
            remove_job_rundirs(&job_ids);
            r?;
        }
        Ok(())
    })();
    s.error = r.err();
    s
}

/// Remove `vigil-job-ID-*` run directories left in the temporary directory by our nested jobs.
fn remove_job_rundirs(ids: &[JobId]) {
    let tmp = std::env::temp_dir();
    let Ok(rd) = std::fs::read_dir(&tmp) else { return };
    let prefixes: Vec<String> = ids.iter().map(|id| format!("vigil-job-{id}-")).collect();
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if prefixes.iter().any(|p| name.starts_with(p.as_str())) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// (d): SIGSTOP ranks 1..5 of a 6-node cluster in turn for `stall_s`; time `torpid`, count false `offline`.
fn measure_stall(ctx: &Ctx<'_>, mode: &Mode) -> Series {
    let (rt, a) = (ctx.rt, ctx.a);
    let mut s = Series::default();
    let r = (|| -> Result<(), String> {
        let cl = Cluster::up(ctx, STALL_NODES, mode)?;
        s.note_cluster(&cl);
        let mut dead = [false; STALL_NODES];
        let mut k = 0;
        for _ in 0..a.trials {
            // Next victim among ranks 1..STALL_NODES that were never (wrongly) declared lost.
            let mut tries = 0;
            loop {
                k = k % (STALL_NODES - 1) + 1;
                tries += 1;
                if !dead[k] || tries > STALL_NODES {
                    break;
                }
            }
            if dead[k] {
                return Err("every stall victim was declared lost".into());
            }
            let t0 = now_epoch_s();
            cl.script_cmd(&["stall", &cl.name, &k.to_string()], 10)?;
            let t_injected = now_epoch_s();
            let remaining = a.stall_s - (now_epoch_s() - t0);
            let torpid = wait_res_event(rt, cl.client(), "torpid", k, t0, remaining.max(0.0))?;
            sleep_s(t0 + a.stall_s - now_epoch_s());
            let t_cont = now_epoch_s();
            let cont = cl.script_cmd(&["cont", &cl.name, &k.to_string()], 10);
            let lively = wait_res_event(rt, cl.client(), "lively", k, t0, 10.0)?;
            sleep_s(SETTLE_S);
            let offline: Vec<f64> = resource_events(rt, cl.client())?
                .into_iter()
                .filter(|e| e.name == "offline" && e.ranks.contains(k as u32) && e.ts >= t0)
                .map(|e| e.ts)
                .collect();
            s.false_lost += offline.len();
            if !offline.is_empty() {
                dead[k] = true;
            }
            if lively.is_some() {
                s.lively += 1;
            }
            s.trials.push(json!({
                "cluster": cl.name, "rank": k, "t0": t0, "inject_s": r4(t_injected - t0), "torpid_ts": torpid,
                "latency_s": torpid.map(|t| r4(t - t0)), "cont_ts": t_cont, "lively_ts": lively,
                "lively_after_cont_s": lively.map(|t| r4(t - t_cont)), "offline_ts": offline,
            }));
            cont?;
            match torpid {
                Some(t) => s.samples.push(t - t0),
                None => return Err(format!("rank {k} stalled for {} s was never declared torpid", a.stall_s)),
            }
            if lively.is_none() {
                return Err(format!("rank {k} did not become lively within 10 s of SIGCONT"));
            }
        }
        Ok(())
    })();
    s.error = r.err();
    s
}

// ------------------------------------------------------------------------------------------- report

/// Is this process root (effective uid 0)?
fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("Uid:")).and_then(|l| l.split_whitespace().nth(2)).map(|u| u == "0")
        })
        .unwrap_or(false)
}

/// A duration for the table: ms below 1 s, else s.
fn dur(v: Option<f64>) -> String {
    match v {
        None => "-".into(),
        Some(x) if x < 0.01 => format!("{:.2} ms", x * 1e3),
        Some(x) if x < 1.0 => format!("{:.1} ms", x * 1e3),
        Some(x) if x < 10.0 => format!("{x:.2} s"),
        Some(x) => format!("{x:.1} s"),
    }
}

/// A target for the table, in whole milliseconds.
fn target_cell(t: f64) -> String {
    format!("≤ {} ms", (t * 1e3).round())
}

/// A flux-core reference (a range when the two ends differ).
fn flux_cell(r: (f64, f64)) -> String {
    if r.0 == r.1 {
        format!("flux-core: {}", dur(Some(r.0)))
    } else {
        format!("flux-core: {}–{}", dur(Some(r.0)), dur(Some(r.1)))
    }
}

/// One row of the results table: what is measured and against what.
struct RowDef {
    /// Colour of its curves in the CDF plot (`None`: not plotted).
    plot: Option<usize>,
    /// Machine name, e.g. `kill9_lost_s`.
    key: &'static str,
    /// Part letter (`--parts`).
    part: &'static str,
    /// Label in the table.
    label: String,
    /// The verdict timed.
    event: &'static str,
    /// flux-core 0.88 figure (range) and how it was obtained, if there is one.
    flux: Option<((f64, f64), &'static str)>,
    /// The `waitpid` reference series (index into the reference list), for task kills.
    waitpid: Option<usize>,
    /// Target p99 with eBPF detectors, seconds.
    target_p99_s: Option<f64>,
}

/// Summary of a series as JSON: samples, median, p99, min, max, error, trials and detectors.
fn series_json(s: &Series) -> Value {
    let (median, min, max) = summarize(&s.samples);
    json!({
        "samples": s.samples.iter().copied().map(r4).collect::<Vec<_>>(),
        "median": median.map(r4), "p99": p99(&s.samples).map(r4), "min": min.map(r4), "max": max.map(r4),
        "error": s.error, "trials": s.trials, "detectors": s.detectors, "mode_in_force": s.mode_in_force,
    })
}

/// `median` / `p99` cells of a series (FAILED marks an error).
fn mode_cells(s: &Series) -> (String, String) {
    let (median, _, _) = summarize(&s.samples);
    let p = dur(p99(&s.samples));
    let m = match (&s.error, median) {
        (Some(_), None) => "FAILED".to_string(),
        (Some(_), m) => format!("{} (FAILED)", dur(m)),
        (None, m) => dur(m),
    };
    let m = if s.mode_in_force == Some(false) { format!("{m} (other detectors!)") } else { m };
    (m, p)
}

/// `vigil-bench detect`: measure (a)–(f) for every mode, print the table, write bench/results/detect.{json,md}
/// and the CDF plot detect-cdf.png.
pub(crate) fn run(a: &DetectArgs, vigil: Option<PathBuf>, out_dir: Option<PathBuf>) -> Result<i32, String> {
    if !is_root() {
        return Err("detect needs root (it creates network namespaces with ip netns)".into());
    }
    if a.trials == 0 || a.big_trials == 0 || a.victims == 0 || a.stall_s <= 0.0 || a.cost_runs == 0 {
        return Err("--trials, --big-trials, --victims and --cost-runs must be at least 1, --stall-s positive".into());
    }
    if a.trials < 20 || a.big_trials < 10 {
        eprintln!(
            "vigil-bench: warning: --trials {} / --big-trials {} are below the 20 / 10 the published table uses",
            a.trials, a.big_trials
        );
    }
    let modes = a.modes.iter().map(|m| Mode::parse(m.trim())).collect::<Result<Vec<_>, _>>()?;
    if modes.is_empty() {
        return Err("--modes: at least one of ebpf, userspace".into());
    }
    for p in &a.parts {
        if !ALL_PARTS.contains(&p.as_str()) {
            return Err(format!("--parts: unknown part '{p}' (known: {})", ALL_PARTS.join(",")));
        }
    }
    let part = |p: &str| a.parts.iter().any(|x| x == p);
    // A run of some parts only does not overwrite the full run's results.
    let group =
        if ALL_PARTS.iter().all(|p| part(p)) { "detect".to_string() } else { format!("detect-{}", a.parts.join("")) };
    let png_name = format!("{group}-cdf.png");
    let vigil = find_vigil(vigil)?;
    let script =
        a.netns_script.clone().unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../ci/netns-cluster.sh"));
    let script = script.canonicalize().map_err(|e| format!("netns script {}: {e}", script.display()))?;
    let out_dir = results_dir(out_dir);
    install_signal_cleanup();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start tokio: {e}"))?;
    let work = std::env::temp_dir().join(format!("vigil-bench-detect-{}", std::process::id()));
    std::fs::create_dir_all(&work).map_err(|e| format!("cannot create {}: {e}", work.display()))?;
    if let Ok(mut w) = WORK_DIR.lock() {
        *w = Some(work.clone());
    }
    let ctx = Ctx { rt: &rt, script: &script, vigil: &vigil, a, work: &work };
    let started = Instant::now();

    // The liveness attributes in force (the brokers' defaults), for the record.
    let attrs = (|| -> Result<Value, String> {
        let cl = Cluster::up(&ctx, 2, &modes[0])?;
        let mut m = serde_json::Map::new();
        for k in
            ["tbon.heartbeat_period", "tbon.torpid_max", "tbon.lost_timeout", "tbon.probe_period", "tbon.probe_misses"]
        {
            // Unset attributes are not reported by getattr: the broker then uses its built-in default.
            let v = match cl.vigil_cmd(&["getattr", k], &work) {
                Ok(v) => v.trim().to_string(),
                Err(e) if e.contains("no such attribute") => "default".into(),
                Err(e) => return Err(e),
            };
            m.insert(k.into(), json!(v));
        }
        Ok(Value::Object(m))
    })()
    .unwrap_or_else(|e| json!({"error": e}));

    let big_gib = a.big_mib as f64 / 1024.0;
    let rows = [
        RowDef {
            plot: Some(0),
            key: "kill9_lost_s",
            part: "a",
            label: "(a) broker `kill -9` → lost".into(),
            event: "offline",
            flux: Some((REF_KILL9_S, "median; at most one 2 s heartbeat")),
            waitpid: None,
            target_p99_s: Some(TARGET_DEATH_S),
        },
        RowDef {
            plot: Some(1),
            key: "silent_lost_s",
            part: "b",
            label: "(b) silent node loss (`netns-cluster.sh kill`) → lost".into(),
            event: "offline",
            flux: Some((REF_SILENT_S, "the 20 s TCP user timeout")),
            waitpid: None,
            target_p99_s: Some(TARGET_SILENT_S),
        },
        RowDef {
            plot: Some(2),
            key: "nested_exception_s",
            part: "c",
            label: "(c) non-critical node of a batch job silently lost → job exception".into(),
            event: "exception",
            flux: Some((REF_NESTED_S, "range")),
            waitpid: None,
            target_p99_s: None,
        },
        RowDef {
            plot: Some(3),
            key: "stall_torpid_s",
            part: "d",
            label: format!("(d) broker SIGSTOPped {} s (`netns-cluster.sh stall`) → torpid", a.stall_s),
            event: "torpid",
            flux: Some((REF_TORPID_S, "range")),
            waitpid: None,
            target_p99_s: None,
        },
        RowDef {
            plot: Some(4),
            key: "task_small_exception_s",
            part: "e",
            label: "(e) small task SIGKILLed (`-o exit-on-error`) → job exception".into(),
            event: "exception",
            flux: None,
            waitpid: Some(0),
            target_p99_s: Some(TARGET_DEATH_S),
        },
        RowDef {
            plot: Some(5),
            key: "task_big_exception_s",
            part: "e",
            label: format!("(e) task with {big_gib:.0} GiB resident SIGKILLed (`-o exit-on-error`) → job exception"),
            event: "exception",
            flux: None,
            waitpid: Some(1),
            target_p99_s: Some(TARGET_DEATH_S),
        },
        RowDef {
            plot: None,
            key: "reparent_orphan_verdict_s",
            part: "g",
            label: "(g) router's node silently lost (`kary:2`, rank 1) → its children's own lost verdict on it".into(),
            event: "reparent (its ms)",
            flux: None,
            waitpid: None,
            target_p99_s: None,
        },
        RowDef {
            plot: Some(7),
            key: "reparent_reachable_s",
            part: "g",
            label: "(g) router's node silently lost → its children re-parented and reachable from rank 0".into(),
            event: "reparent, then a ping",
            flux: None,
            waitpid: None,
            target_p99_s: None,
        },
        RowDef {
            plot: None,
            key: "reparent_after_lost_verdict_s",
            part: "g",
            label: "(g) rank 0's lost verdict on the router → its children reachable".into(),
            event: "offline → reparent, then a ping",
            flux: None,
            waitpid: None,
            target_p99_s: Some(TARGET_REPARENT_S),
        },
        RowDef {
            plot: None,
            key: "reparent_after_orphan_verdict_s",
            part: "g",
            label: "(g) the children's own lost verdict on their parent → reachable".into(),
            event: "reparent (its ms) → a ping",
            flux: None,
            waitpid: None,
            target_p99_s: Some(TARGET_REPARENT_S),
        },
    ];

    // The task program and the waitpid references (mode-independent: the harness's own children).
    let mut waitpid: Vec<(String, u64, Series)> = Vec::new();
    let mut prog: Result<PathBuf, String> = Err("not built".into());
    if part("e") {
        prog = task::build_task_program(&work);
        for (mib, n) in [(0u64, a.trials), (a.big_mib, a.big_trials)] {
            let label =
                if mib == 0 { "small task".to_string() } else { format!("task with {big_gib:.0} GiB resident") };
            eprintln!("vigil-bench: detect (e) reference: waitpid after SIGKILL, {label} ({n} trials)");
            let s = match &prog {
                Ok(p) => task::measure_waitpid(&work, p, mib, n),
                Err(e) => Series { error: Some(e.clone()), ..Default::default() },
            };
            waitpid.push((label, mib, s));
        }
    }

    let mut results: Vec<(&RowDef, Vec<(&'static str, Series)>)> = Vec::new();
    // (g) is measured once per mode and gives several rows.
    let mut reparents: Vec<(&'static str, reparent::Trials)> = Vec::new();
    for row in rows.iter().filter(|r| part(r.part)) {
        let mut per_mode = Vec::new();
        for mode in &modes {
            let n = if row.key == "task_big_exception_s" { a.big_trials } else { a.trials };
            eprintln!("vigil-bench: detect {} [{}] ({n} trials)", row.label, mode.name);
            if row.part == "g" && !reparents.iter().any(|(m, _)| *m == mode.name) {
                reparents.push((mode.name, reparent::measure(&ctx, mode, n)));
            }
            let s = match row.key {
                k if k.starts_with("reparent_") => match reparents.iter().find(|(m, _)| *m == mode.name) {
                    Some((_, t)) => t.series(k),
                    None => Series { error: Some("not measured".into()), ..Default::default() },
                },
                "kill9_lost_s" => measure_lost(&ctx, mode, Kill::Broker),
                "silent_lost_s" => measure_lost(&ctx, mode, Kill::Silent),
                "nested_exception_s" => measure_nested(&ctx, mode),
                "stall_torpid_s" => measure_stall(&ctx, mode),
                _ => match &prog {
                    Ok(p) => {
                        let mib = if row.key == "task_big_exception_s" { a.big_mib } else { 0 };
                        task::measure_task_kill(&ctx, mode, p, mib, n)
                    }
                    Err(e) => Series { error: Some(e.clone()), ..Default::default() },
                },
            };
            let (m, p) = mode_cells(&s);
            eprintln!(
                "vigil-bench:   median {m}, p99 {p}{}",
                s.error.as_ref().map(|e| format!(": {e}")).unwrap_or_default()
            );
            per_mode.push((mode.name, s));
        }
        results.push((row, per_mode));
    }
    let costs: Vec<cost::Cost> = if part("f") {
        a.cost_children.iter().map(|n| cost::measure(&vigil, *n, a.cost_idle_s, a.cost_runs)).collect()
    } else {
        Vec::new()
    };
    let _ = std::fs::remove_dir_all(&work);
    let total_s = started.elapsed().as_secs_f64();

    // ---- the table
    let mode_names: Vec<&str> = modes.iter().map(|m| m.name).collect();
    let has_ebpf = mode_names.contains(&"ebpf");
    let mut table = String::from("| event → verdict | trials |");
    for m in &mode_names {
        table.push_str(&format!(" {m} median | {m} p99 |"));
    }
    table.push_str(" reference | eBPF target (p99) |\n|---|---:|");
    for _ in &mode_names {
        table.push_str("---:|---:|");
    }
    table.push_str("---|---|\n");
    let mut metrics = Vec::new();
    let mut failed = Vec::new();
    let mut missed = Vec::new();
    for (row, per_mode) in &results {
        let trials: Vec<String> = per_mode
            .iter()
            .map(|(_, s)| match s.no_exception {
                0 => s.samples.len().to_string(),
                k => format!("{} (+{k} without exception)", s.samples.len()),
            })
            .collect();
        let mut line = format!("| {} | {} |", row.label, trials.join(" / "));
        for (_, s) in per_mode {
            let (m, p) = mode_cells(s);
            line.push_str(&format!(" {m} | {p} |"));
        }
        let reference = match (row.flux, row.waitpid) {
            (Some((r, _)), _) => flux_cell(r),
            (None, Some(i)) => match waitpid.get(i) {
                Some((_, _, w)) => format!("`waitpid`: {} / {}", dur(summarize(&w.samples).0), dur(p99(&w.samples))),
                None => "-".into(),
            },
            _ => "-".into(),
        };
        let target = match (row.target_p99_s, per_mode.iter().find(|(m, _)| *m == "ebpf")) {
            (Some(t), Some((_, s))) if has_ebpf => match p99(&s.samples) {
                Some(p) if p <= t && s.error.is_none() => format!("{}: met", target_cell(t)),
                Some(p) => {
                    missed.push(format!("{}: eBPF p99 {} > target {}", row.key, dur(Some(p)), target_cell(t)));
                    format!("{}: **missed**", target_cell(t))
                }
                None => format!("{}: not measured", target_cell(t)),
            },
            (Some(t), _) => target_cell(t),
            _ => "-".into(),
        };
        line.push_str(&format!(" {reference} | {target} |\n"));
        table.push_str(&line);
        let mut by_mode = serde_json::Map::new();
        for (m, s) in per_mode {
            if let Some(e) = &s.error {
                failed.push(format!("{} [{m}]: {e}", row.key));
            }
            let mut j = series_json(s);
            if row.key == "stall_torpid_s" {
                j["false_lost"] = json!(s.false_lost);
                j["lively_after_cont"] = json!(s.lively);
            }
            if row.key.starts_with("task_") {
                j["no_exit_on_error_exception"] = json!(s.no_exception);
                if s.no_exception > 0 {
                    failed.push(format!(
                        "{} [{m}]: {} of {} kills raised no exit-on-error exception (the job ended by its {} s exit-timeout)",
                        row.key,
                        s.no_exception,
                        s.trials.len(),
                        task::EXIT_TIMEOUT_S
                    ));
                }
            }
            if row.key == "nested_exception_s" {
                j["job_still_running_after_exception"] = json!(s.survived);
            }
            by_mode.insert(m.to_string(), j);
        }
        metrics.push(json!({
            "name": row.key, "label": row.label, "verdict_event": row.event, "unit": "s",
            "flux_088": row.flux.map(|(r, note)| json!({"low": r.0, "high": r.1, "note": note})),
            "waitpid_reference": row.waitpid.and_then(|i| waitpid.get(i)).map(|w| w.0.clone()),
            "target_ebpf_p99_s": row.target_p99_s,
            "modes": Value::Object(by_mode),
        }));
    }
    let mut false_lost_total = 0;
    if let Some((_, per_mode)) = results.iter().find(|(r, _)| r.key == "stall_torpid_s") {
        let mut line = format!("| (d) false lost verdicts during {} s stalls (count; must be 0) | - |", a.stall_s);
        for (_, s) in per_mode {
            line.push_str(&format!(" {} | - |", s.false_lost));
            false_lost_total += s.false_lost;
        }
        line.push_str(" flux-core: 0 (torpid only after 28–30 s) | 0 |\n");
        table.push_str(&line);
        if false_lost_total > 0 {
            failed.push(format!("stall_false_lost: {false_lost_total} stalled broker(s) declared lost"));
        }
    }
    let mut wp_table = String::from(
        "| `waitpid` after SIGKILL (harness's own child) | trials | median | p99 | min | max |\n|---|---:|---:|---:|---:|---:|\n",
    );
    let mut wp_json = Vec::new();
    for (label, mib, w) in &waitpid {
        let (median, min, max) = summarize(&w.samples);
        wp_table.push_str(&format!(
            "| {label} | {} | {} | {} | {} | {} |\n",
            w.samples.len(),
            dur(median),
            dur(p99(&w.samples)),
            dur(min),
            dur(max)
        ));
        if let Some(e) = &w.error {
            failed.push(format!("waitpid {label}: {e}"));
        }
        let mut j = series_json(w);
        j["label"] = json!(label);
        j["mib"] = json!(mib);
        wp_json.push(j);
    }
    let mut cost_md = String::new();
    if !costs.is_empty() {
        let (t, verdict) = cost::table(&costs, TARGET_COST_PCT);
        cost_md.push_str(&t);
        match verdict {
            Some(v) => {
                if v.contains("missed") {
                    missed.push(format!("prober_cpu: {v}"));
                }
                cost_md.push_str(&format!("\n{v}\n"));
            }
            None => cost_md.push_str("\nNo size was measured with every child staying online: no verdict.\n"),
        }
        for c in &costs {
            if let Some(e) = &c.error {
                failed.push(format!("prober_cpu ({} children): {e}", c.children));
            }
            if c.lost_children() > 0 {
                failed.push(format!(
                    "prober_cpu ({} children): {} healthy children were declared lost with default probes (false lost verdicts)",
                    c.children,
                    c.lost_children()
                ));
            }
        }
    }
    println!("{table}");
    if !waitpid.is_empty() {
        println!("{wp_table}");
    }
    if !cost_md.is_empty() {
        println!("{cost_md}");
    }
    for f in &failed {
        eprintln!("vigil-bench: FAILED {f}");
    }
    for m in &missed {
        eprintln!("vigil-bench: target missed: {m}");
    }

    // ---- the CDF plot
    let mut curves = Vec::new();
    for (row, per_mode) in &results {
        let Some(i) = row.plot else { continue };
        for (m, s) in per_mode {
            curves.push(cdf::Curve {
                label: format!("{} [{m}]", row.label.replace('`', "")),
                samples_ms: s.samples.iter().map(|x| x * 1e3).collect(),
                color: i,
                dashed: *m != "ebpf",
                reference: false,
            });
        }
        if let Some((label, _, w)) = row.waitpid.and_then(|j| waitpid.get(j)) {
            curves.push(cdf::Curve {
                label: format!("    reference: waitpid after SIGKILL, {label}"),
                samples_ms: w.samples.iter().map(|x| x * 1e3).collect(),
                color: i,
                dashed: false,
                reference: true,
            });
        }
    }
    let png = out_dir.join(&png_name);
    let plot_err = if curves.iter().any(|c| !c.samples_ms.is_empty()) {
        std::fs::create_dir_all(&out_dir).map_err(|e| format!("cannot create {}: {e}", out_dir.display()))?;
        let title = "Vigil failure detection: latency CDFs (solid: eBPF, dashed: userspace, dotted: waitpid)";
        cdf::plot(&png, title, &curves).err()
    } else {
        Some("no samples to plot".to_string())
    };
    if let Some(e) = &plot_err {
        eprintln!("vigil-bench: no CDF plot: {e}");
    }

    // ---- the results
    let version = vigil_version(&vigil);
    let ncpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let now_s = now_epoch_s().floor();
    let n = a.trials;
    let doc = json!({
        "benchmark": "vigil-bench detect",
        "vigil_version": version,
        "modes": modes.iter().map(|m| json!({"name": m.name, "broker_args": m.broker_args})).collect::<Vec<_>>(),
        "parts": a.parts,
        "trials": n,
        "big_trials": a.big_trials,
        "big_mib": a.big_mib,
        "victims_per_cluster": a.victims,
        "stall_s": a.stall_s,
        "unix_time_s": now_s,
        "cpus": ncpus,
        "total_s": r4(total_s),
        "liveness_attributes": attrs,
        "p99_method": "nearest rank: the ceil(0.99 n)-th smallest sample; with fewer than 100 trials that is the maximum",
        "metrics": metrics,
        "waitpid_reference": wp_json,
        "stall_false_lost": false_lost_total,
        "prober_cpu": costs.iter().map(cost::to_json).collect::<Vec<_>>(),
        "targets_missed": missed,
        "cdf_plot": plot_err.is_none().then_some(png_name.clone()),
    });
    let attrs_text = attrs
        .as_object()
        .map(|m| m.iter().map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("?"))).collect::<Vec<_>>().join(", "))
        .unwrap_or_default();
    let p99_note = if n < 100 { ", so with fewer than 100 trials it is the maximum" } else { "" };
    let mut md = format!(
        "# Failure detection: eBPF detectors, userspace fallback, flux-core 0.88\n\n`vigil-bench detect --trials {n} \
         --big-trials {} --big-mib {}{}` ({version}, {ncpus} CPUs, unix time {now_s}, {total_s:.0} s in all) on \
         network-namespace nodes (`ci/netns-cluster.sh`), liveness attributes ({attrs_text}). Modes, measured in the \
         same run: {}. Latency = rank 0's eventlog timestamp of the verdict − the harness's wall clock right before \
         the failure was injected. Trials are given per mode; p99 is nearest-rank{p99_note}. flux-core figures were \
         measured on this machine; for task kills the reference is how long `waitpid` takes to return after SIGKILL \
         for the same program spawned by the harness (the table below).\n\n{table}\n",
        a.big_trials,
        a.big_mib,
        if group == "detect" { String::new() } else { format!(" --parts {}", a.parts.join(",")) },
        modes
            .iter()
            .map(|m| if m.broker_args.is_empty() {
                format!("`{}` (default detectors)", m.name)
            } else {
                format!("`{}` ({})", m.name, m.broker_args.join(" "))
            })
            .collect::<Vec<_>>()
            .join(", "),
    );
    let note = |key: &str, f: &dyn Fn(&Series) -> String| -> String {
        results
            .iter()
            .find(|(r, _)| r.key == key)
            .map(|(_, pm)| pm.iter().map(|(m, s)| format!("{m}: {}", f(s))).collect::<Vec<_>>().join(", "))
            .unwrap_or_default()
    };
    // Notes on the parts that ran.
    let mut notes = Vec::new();
    if part("c") {
        notes.push(format!(
            "(c): the expected exception is a non-fatal `node-failure` (anything else fails the trial); the job was \
             still running after it ({}).",
            note("nested_exception_s", &|s| format!("{} of {}", s.survived, s.trials.len()))
        ));
    }
    if part("d") {
        notes.push(format!(
            "(d): the stalled broker became lively again after SIGCONT ({}).",
            note("stall_torpid_s", &|s| format!("{} of {}", s.lively, s.trials.len()))
        ));
    }
    if ["b", "c", "d", "g"].iter().any(|p| part(p)) {
        notes.push(
            "(b)–(d) and (g) inject the failure with `netns-cluster.sh` and t0 is taken before it starts, so its \
             start-up counts against Vigil (`kill` cuts the link first, then kills the node's processes)."
                .into(),
        );
    }
    if part("e") {
        notes.push(format!(
            "(e): a 2-task job (`vigil submit -N1 -n2 -o exit-on-error`) on one node of a 2-node cluster; task 0 is \
             a small C program or the same program after touching every page of {} MiB; the harness SIGKILLs it and \
             times the job's fatal `exec` exception.",
            a.big_mib
        ));
    }
    notes.push(format!(
        "Detectors each mode really ran on are recorded per metric in `{group}.json` (`detectors`, `mode_in_force`)."
    ));
    md.push_str(&format!("{}\n\n", notes.join(" ")));
    if !waitpid.is_empty() {
        md.push_str(&format!("{wp_table}\n"));
    }
    if part("g") {
        md.push_str(&format!(
            "(g): each trial brings up a fresh 7-node cluster (`-S tbon.topo=kary:2`: rank 1 routes for ranks 3 and 4, \
             its sibling rank 2 adopts them by the rule) and silently kills rank 1's node as in (b), while rank 0 \
             pings each child (`broker.ping`, one in flight per child, given up after {} ms). A child is reachable \
             again at the reply to the first ping that succeeds at or after rank 0 recorded its `reparent`; each row \
             takes the later of the two children. Rank 0's lost verdict is its `offline` event on rank 1; a child's \
             own verdict is its `reparent` event's time less the event's `ms` (the child's own time from its verdict \
             to its adoption; early by the one hop from the adopter to rank 0). Per-trial times, the lost verdict's \
             reason and each child's are in the JSON (`reparent_reachable_s`).\n\n",
            (reparent::PING_TIMEOUT_S * 1e3).round()
        ));
    }
    if !cost_md.is_empty() {
        md.push_str(&format!(
            "## Prober CPU cost\n\n`vigil start --test-size=N+1 -S tbon.topo=kary:0` for N = {} (rank 0 is the parent of \
             every other broker), idle; CPU time (utime+stime, `/proc/PID/stat`) over {} s after every rank is online and the \
             detectors are loaded, with default probes and with `tbon.probe_period=3600s` (probes effectively off), \
             each in a fresh instance. On one machine the children's XDP responder (on `lo`) runs in the softirq \
             raised by rank 0's own `sendto`, so the kernel's answering work may be billed to rank 0 (as system time) \
             or to softirq time, which is why the machine's softirq time is shown too.\n\n{cost_md}\n",
            a.cost_children.iter().map(|n| n.to_string()).collect::<Vec<_>>().join(", "),
            a.cost_idle_s
        ));
    }
    if plot_err.is_none() {
        md.push_str(&format!(
            "Latency CDFs: [`{png_name}`]({png_name}) (one curve per measurement and mode; log-scale x).\n"
        ));
    }
    if !missed.is_empty() {
        md.push_str("\nTargets missed:\n\n");
        for m in &missed {
            md.push_str(&format!("- {m}\n"));
        }
    }
    if !failed.is_empty() {
        md.push_str("\nFailures:\n\n");
        for f in &failed {
            md.push_str(&format!("- {f}\n"));
        }
    }
    write_results(&out_dir, &group, &doc, &md)?;
    Ok(if failed.is_empty() { 0 } else { 1 })
}
