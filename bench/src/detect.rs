//! `vigil-bench detect`: failure-detection latencies on network-namespace nodes (`ci/netns-cluster.sh`).
//!
//! Every latency is taken from rank 0's own records, not by polling: t0 is this harness's wall clock right
//! before the failure is injected, and the verdict's time is the timestamp rank 0 wrote in its RFC 44 resource
//! eventlog (`offline` = lost, `torpid`) or, for a nested job, in the job's eventlog (`exception`). The
//! eventlogs are polled only to know when to move on. The measurements:
//!
//! (a) broker `kill -9` (sent by this harness to the pid in `nodeK/broker.pid`) → `offline`;
//! (b) silent node loss (`netns-cluster.sh kill NAME K`: link cut, then every process of the node SIGKILLed)
//!     → `offline`; t0 is taken before the script starts, so its start-up (a few ms) counts against Vigil;
//! (c) a batch job (`vigil batch -N3`, script `sleep`) whose non-critical node is silently killed → its
//!     `exception` event (expected: `node-failure`, severity 2, the job keeps running; then it is canceled);
//! (d) broker SIGSTOPped (`netns-cluster.sh stall NAME K`) for `--stall-s` → `torpid`; then `cont`, wait for
//!     `lively`, and count `offline` verdicts for that rank since t0 (false lost verdicts: must be 0).
//!
//! Clusters are reused: (a) and (b) kill `--victims` different nodes (ranks 1..) of a cluster of victims+1
//! nodes, (c) needs victims+3 nodes (each trial uses 3 and loses 1), (d) cycles through the 5 non-root
//! nodes of a 6-node cluster. Every cluster is brought `down` when done, on error, on panic, and on
//! SIGINT/SIGTERM/SIGHUP.

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

/// Options of `vigil-bench detect`.
#[derive(Args, Debug, Clone)]
pub(crate) struct DetectArgs {
    /// Trials per measurement (at least 20 for the published table).
    #[arg(long, default_value_t = DEFAULT_TRIALS)]
    pub(crate) trials: usize,
    /// Victims per cluster for the kill measurements (a fresh cluster is brought up for each batch of victims).
    #[arg(long, default_value_t = 10)]
    pub(crate) victims: usize,
    /// How long each broker stays SIGSTOPped in the stall measurement, seconds.
    #[arg(long, default_value_t = 3.0)]
    pub(crate) stall_s: f64,
    /// The netns cluster script (default: ci/netns-cluster.sh of the source tree).
    #[arg(long, value_name = "PATH")]
    pub(crate) netns_script: Option<PathBuf>,
}

impl Default for DetectArgs {
    fn default() -> Self {
        DetectArgs { trials: DEFAULT_TRIALS, victims: 10, stall_s: 3.0, netns_script: None }
    }
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

    /// Bring up an `n`-node cluster and connect to its rank 0.
    fn up(rt: &tokio::runtime::Runtime, script: &Path, vigil: &Path, n: usize) -> Result<Cluster, String> {
        let netns_dir = PathBuf::from(std::env::var("VIGIL_NETNS_DIR").unwrap_or_else(|_| "/tmp".into()));
        let name = Cluster::fresh_name(&netns_dir);
        let dir = netns_dir.join(format!("vigil-netns-{name}"));
        if let Ok(mut l) = LIVE.lock() {
            l.push((script.to_path_buf(), vigil.to_path_buf(), name.clone()));
        }
        // From here on, dropping `c` (on any error) brings whatever was created down.
        let mut c = Cluster { name, script: script.to_path_buf(), vigil: vigil.to_path_buf(), dir, client: None };
        // Extra broker arguments, e.g. `VIGIL_BENCH_BROKER_ARGS=--setattr=broker.detectors=userspace` to measure the
        // userspace fallback detectors.
        let extra = std::env::var("VIGIL_BENCH_BROKER_ARGS").unwrap_or_default();
        let mut args = vec!["up".to_string(), c.name.clone(), n.to_string()];
        args.extend(extra.split_whitespace().map(str::to_string));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        c.script_cmd(&args, 120)?;
        let uri = c.script_cmd(&["uri", &c.name.clone()], 10)?.trim().to_string();
        let client = rt
            .block_on(Client::connect(&uri))
            .map_err(|e| format!("cannot connect to rank 0 of cluster {} at {uri}: {e}", c.name))?;
        c.client = Some(client);
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
fn measure_lost(rt: &tokio::runtime::Runtime, script: &Path, vigil: &Path, a: &DetectArgs, how: Kill) -> Series {
    let mut s = Series::default();
    let r = (|| -> Result<(), String> {
        while s.samples.len() < a.trials {
            let n = a.victims.min(a.trials - s.samples.len());
            let cl = Cluster::up(rt, script, vigil, n + 1)?;
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
fn measure_nested(rt: &tokio::runtime::Runtime, script: &Path, vigil: &Path, a: &DetectArgs, work: &Path) -> Series {
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
            let cl = Cluster::up(rt, script, vigil, n + BATCH_NODES)?;
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
fn measure_stall(rt: &tokio::runtime::Runtime, script: &Path, vigil: &Path, a: &DetectArgs) -> Series {
    let mut s = Series::default();
    let r = (|| -> Result<(), String> {
        let cl = Cluster::up(rt, script, vigil, STALL_NODES)?;
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

/// Seconds for the table: milliseconds resolution below 10 s.
fn secs(v: Option<f64>) -> String {
    match v {
        None => "-".into(),
        Some(x) if x < 10.0 => format!("{x:.3}"),
        Some(x) => format!("{x:.1}"),
    }
}

/// A reference range for the table.
fn ref_cell(r: (f64, f64)) -> String {
    if r.0 == r.1 {
        secs(Some(r.0))
    } else {
        format!("{}–{}", secs(Some(r.0)), secs(Some(r.1)))
    }
}

/// flux/vigil improvement factor (a range when the reference is one).
fn ratio(r: (f64, f64), median: Option<f64>) -> Option<(f64, f64)> {
    median.filter(|m| *m > 0.0).map(|m| (r.0 / m, r.1 / m))
}

/// Ratio cell.
fn ratio_cell(x: Option<(f64, f64)>) -> String {
    let f = |r: f64| if r >= 100.0 { format!("{r:.0}") } else { format!("{r:.1}") };
    match x {
        None => "-".into(),
        Some((a, b)) if (a - b).abs() < 1e-9 => format!("{}x", f(a)),
        Some((a, b)) => format!("{}–{}x", f(a), f(b)),
    }
}

/// One table row: metric name, label, verdict event, samples, flux-core reference (range), reference note.
type Row<'a> = (&'a str, &'a str, &'a str, &'a Series, (f64, f64), &'a str);

/// `vigil-bench detect`: measure (a)–(d), print the table, write bench/results/detect.{json,md}.
pub(crate) fn run(a: &DetectArgs, vigil: Option<PathBuf>, out_dir: Option<PathBuf>) -> Result<i32, String> {
    if !is_root() {
        return Err("detect needs root (it creates network namespaces with ip netns)".into());
    }
    if a.trials == 0 || a.victims == 0 || a.stall_s <= 0.0 {
        return Err("--trials and --victims must be at least 1, --stall-s positive".into());
    }
    if a.trials < 20 {
        eprintln!("vigil-bench: warning: --trials {} is below the 20 trials the published table uses", a.trials);
    }
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
    let started = Instant::now();

    // The liveness attributes in force (the brokers' defaults), for the record.
    let attrs = (|| -> Result<Value, String> {
        let cl = Cluster::up(&rt, &script, &vigil, 2)?;
        let mut m = serde_json::Map::new();
        for k in ["tbon.heartbeat_period", "tbon.torpid_max", "tbon.lost_timeout"] {
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

    eprintln!("vigil-bench: detect (a) broker kill -9 → lost ({} trials)", a.trials);
    let kill9 = measure_lost(&rt, &script, &vigil, a, Kill::Broker);
    eprintln!("vigil-bench: detect (b) silent node loss → lost ({} trials)", a.trials);
    let silent = measure_lost(&rt, &script, &vigil, a, Kill::Silent);
    eprintln!("vigil-bench: detect (c) non-critical node of a batch job lost → exception ({} trials)", a.trials);
    let nested = measure_nested(&rt, &script, &vigil, a, &work);
    eprintln!("vigil-bench: detect (d) {} s stall → torpid, never lost ({} trials)", a.stall_s, a.trials);
    let stall = measure_stall(&rt, &script, &vigil, a);
    let _ = std::fs::remove_dir_all(&work);
    let total_s = started.elapsed().as_secs_f64();

    let rows: [Row<'_>; 4] = [
        (
            "kill9_lost_s",
            "(a) broker `kill -9` → lost",
            "offline",
            &kill9,
            REF_KILL9_S,
            "median; at most one 2 s heartbeat",
        ),
        (
            "silent_lost_s",
            "(b) silent node loss (`netns-cluster.sh kill`) → lost",
            "offline",
            &silent,
            REF_SILENT_S,
            "the 20 s TCP user timeout",
        ),
        (
            "nested_exception_s",
            "(c) non-critical node of a batch job silently lost → job exception",
            "exception",
            &nested,
            REF_NESTED_S,
            "range",
        ),
        (
            "stall_torpid_s",
            "(d) broker SIGSTOPped (`netns-cluster.sh stall`) → torpid",
            "torpid",
            &stall,
            REF_TORPID_S,
            "range",
        ),
    ];
    let p99_head =
        if a.trials < 100 { format!("p99 (s; = max at {} trials)", a.trials) } else { "p99 (s)".to_string() };
    let mut table = format!("| event → verdict | trials | median (s) | {p99_head} | min (s) | max (s) | flux-core 0.88 (s) | ratio flux/vigil |\n|---|---:|---:|---:|---:|---:|---:|---:|\n");
    let mut metrics = Vec::new();
    let mut failed = Vec::new();
    for (name, label, event, s, reference, ref_note) in rows {
        let (median, min, max) = summarize(&s.samples);
        let p = p99(&s.samples);
        let rt_ = ratio(reference, median);
        let med_cell = match (&s.error, median) {
            (Some(_), None) => "FAILED".to_string(),
            (Some(_), m) => format!("{} (FAILED)", secs(m)),
            (None, m) => secs(m),
        };
        table.push_str(&format!(
            "| {label} | {} | {med_cell} | {} | {} | {} | {} | {} |\n",
            s.samples.len(),
            secs(p),
            secs(min),
            secs(max),
            ref_cell(reference),
            ratio_cell(rt_)
        ));
        if let Some(e) = &s.error {
            failed.push(format!("{name}: {e}"));
        }
        metrics.push(json!({
            "name": name, "label": label, "verdict_event": event, "unit": "s",
            "samples": s.samples.iter().copied().map(r4).collect::<Vec<_>>(),
            "median": median.map(r4), "p99": p.map(r4), "min": min.map(r4), "max": max.map(r4),
            "flux_088": {"low": reference.0, "high": reference.1, "note": ref_note},
            "ratio": rt_.map(|(x, y)| json!([(x * 100.0).round() / 100.0, (y * 100.0).round() / 100.0])),
            "error": s.error,
            "trials": s.trials,
        }));
    }
    let false_lost_ok = stall.false_lost == 0 && stall.error.is_none();
    table.push_str(&format!(
        "| (d) false lost verdicts during {} s stalls (count; must be 0) | {} | {} | - | - | - | 0 (torpid only after 28–30 s) | - |\n",
        a.stall_s,
        stall.trials.len(),
        stall.false_lost
    ));
    if stall.false_lost > 0 {
        failed.push(format!("stall_false_lost: {} stalled broker(s) declared lost", stall.false_lost));
    }
    println!("{table}");
    for f in &failed {
        eprintln!("vigil-bench: FAILED {f}");
    }

    let version = vigil_version(&vigil);
    let ncpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let now_s = now_epoch_s().floor();
    let n = a.trials;
    let doc = json!({
        "benchmark": "vigil-bench detect",
        "vigil_version": version,
        "trials": n,
        "victims_per_cluster": a.victims,
        "stall_s": a.stall_s,
        "unix_time_s": now_s,
        "cpus": ncpus,
        "total_s": r4(total_s),
        "liveness_attributes": attrs,
        "p99_method": "nearest rank: the ceil(0.99 n)-th smallest sample; with fewer than 100 trials that is the maximum",
        "metrics": metrics,
        "stall_false_lost": stall.false_lost,
        "stall_lively_after_cont": stall.lively,
        "nested_job_still_running_after_exception": nested.survived,
    });
    let attrs_text = attrs
        .as_object()
        .map(|m| m.iter().map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("?"))).collect::<Vec<_>>().join(", "))
        .unwrap_or_default();
    let p99_note = if n < 100 { format!(", so with {n} trials it is the maximum") } else { String::new() };
    let mut md = format!(
        "# Failure detection vs flux-core 0.88\n\n`vigil-bench detect --trials {n}` ({version}, {ncpus} CPUs, unix time {now_s}, \
         {total_s:.0} s in all) on network-namespace nodes (`ci/netns-cluster.sh`), liveness attributes \
         ({attrs_text}). Latency = rank 0's eventlog timestamp of the verdict − the harness's wall clock right before the failure \
         was injected. Medians and p99 over {n} trials; p99 is nearest-rank{p99_note}. \
         Ratio: flux-core median (or range) / Vigil median, >1 means Vigil detects sooner. \
         flux-core figures measured on this machine.\n\n{table}\n\
         (c): the expected exception is a non-fatal `node-failure` (anything else fails the trial); the job was \
         still running after it in {} of {} trials. \
         (d): the stalled broker became lively again after SIGCONT in {} of {} trials. \
         (b)–(d) inject the failure with `netns-cluster.sh` and t0 is taken before it starts, so its start-up counts \
         against Vigil (`kill` cuts the link first, then kills the node's processes; it returned after a median of {} s).\n",
        nested.survived,
        nested.trials.len(),
        stall.lively,
        stall.trials.len(),
        secs(summarize(&silent.trials.iter().filter_map(|t| t["inject_s"].as_f64()).collect::<Vec<_>>()).0),
    );
    if !failed.is_empty() {
        md.push_str("\nFailures:\n\n");
        for f in &failed {
            md.push_str(&format!("- {f}\n"));
        }
    }
    write_results(&out_dir, "detect", &doc, &md)?;
    Ok(if failed.is_empty() && false_lost_ok { 0 } else { 1 })
}
