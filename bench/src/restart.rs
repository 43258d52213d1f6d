//! `vigil-bench restart`: rank 0 killed with SIGKILL and restarted on its state directory (issue 17).
//!
//! The instance is a 4-broker system instance on loopback: a TOML bootstrap (`[bootstrap] statedir`), each broker
//! started with `vigil broker --rank=R` and one core, as `runtime/cli/tests/instance_statedir.rs` starts them, with
//! `tbon.parent_grace` long enough that ranks 1-3 wait for rank 0 through every restart.
//!
//! **Restart to ready**, for each store size (0, 10,000 and 100,000 INACTIVE jobs by default): rank 0 is killed
//! (`kill -9`), a supervisor's delay later (`--restart-delay-ms`, systemd's `RestartSec` default 100 ms) a new rank 0
//! is exec'd on the same state directory, and the harness times from that exec to
//! (a) `accepted`: the first `job-manager.submit` answered with an id (a client that retries every 2 ms);
//! (b) `reconnected`: `broker.info` of rank 0 says `run` (every broker registered) and `overlay.status` lists
//!     ranks 1-3 online (polled every 5 ms).
//! Rank 0's log gives the store's share: `store read in` (open, `quick_check`, read back) and `jobs restored in`
//! (the job core rebuilt), lines the driver logs at `info`. The probe job of (a) runs and is waited for, so the
//! store holds INACTIVE jobs only at the next kill: each restart adds one job to the store.
//!
//! **Filling the store.** Real jobs run at some tens per second here, too slow for 100,000. So: `--real-jobs` real
//! `true` jobs are submitted and run first (their end-to-end rate is recorded), then rank 0 is killed and the
//! store is filled up to each size with copies of the last real COMPLETED job, written with the broker's own
//! `Store::commit` (the same `Journal` records the job core hands the driver: the job's row with its jobspec, R
//! and status, and its whole eventlog, 1,000 jobs per transaction), each under a new id above every id kept
//! (`last_id` moved with them) and its event times shifted by the id's time. The restarted rank 0 must then list
//! every job (`vigil jobs -a` and `job-manager.list`).
//!
//! **Submit throughput, store on and off**: alternating runs (off, on, then on, off, ...) of a fresh instance
//! each, without and with a state directory, started once every broker's failure detectors are loaded; then
//! `--tput-jobs` `true` jobs submitted at once (pipelined on one connection), timed until every submission is
//! answered (`submit`; the first [`FIRST_ANSWERS`] also on their own) and until the last job is INACTIVE
//! (`end to end`); each job must exit 0. Rank 0's CPU per job, by thread (its loop, the store's writer and
//! syncer), is read from /proc while the submissions are answered and over the whole run.

use crate::{find_vigil, now_epoch_s, r4, results_dir, summarize, vigil_version, write_results};
use clap::Args;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use vigil::jobs::journal::{JobRecord, Journal};
use vigil::jobs::{JobId, JobState};

/// Brokers of the instance.
const SIZE: u32 = 4;
/// Grace of ranks 1-3 while rank 0 is down: long enough for the store to be filled meanwhile.
const GRACE: &str = "tbon.parent_grace=600s";
/// The target: ready within this with 10,000 jobs, seconds.
const TARGET_READY_10K_S: f64 = 1.0;
/// The target: throughput with the store at least this fraction of that without.
const TARGET_STORE_FRACTION: f64 = 0.9;
/// How long one restart may take to get ready before it counts as failed.
const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// Jobs per transaction of the store filler.
const FILL_BATCH: usize = 1000;

/// The submissions whose answers are also timed on their own in each throughput run: a burst this short (~40 ms
/// here) is answered at a rate the last fsync's wait weighs on (the last answers wait for the fsync under way
/// and the next, ~1 ms each), which a longer run spreads out.
const FIRST_ANSWERS: usize = 1000;

/// Options of `vigil-bench restart`.
#[derive(Args, Debug)]
pub(crate) struct RestartArgs {
    /// INACTIVE jobs in the store, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [0usize, 10_000, 100_000])]
    sizes: Vec<usize>,
    /// Restarts measured per size.
    #[arg(long, default_value_t = 5)]
    restarts: usize,
    /// Real `true` jobs run before the store is filled (the template, and the real-submission rate).
    #[arg(long, default_value_t = 500)]
    real_jobs: usize,
    /// Delay between rank 0's death and the exec of the new one, ms (a supervisor's restart delay).
    #[arg(long, default_value_t = 100)]
    restart_delay_ms: u64,
    /// Throughput runs with the store on, and as many with it off, alternating (0: none).
    #[arg(long, default_value_t = 15)]
    tput_runs: usize,
    /// Jobs per throughput run: 5,000, about 0.2 s of answers and 10 s end to end here. The rate of the first
    /// [`FIRST_ANSWERS`] answers is reported too.
    #[arg(long, default_value_t = 5000)]
    tput_jobs: usize,
}

// ------------------------------------------------------------------------------------------- the instance

/// A 4-broker system instance in a scratch directory, started broker by broker; everything it started is
/// killed and the directory removed on drop.
struct System {
    dir: PathBuf,
    vigil: PathBuf,
    config: PathBuf,
    statedir: Option<PathBuf>,
    brokers: Vec<Option<Child>>,
    spawned: usize,
}

impl System {
    /// Keys, ports and the TOML bootstrap; the state directory in `[bootstrap] statedir` when `store`.
    fn new(vigil: &Path, store: bool) -> Result<System, String> {
        let nanos =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
        let dir = std::env::temp_dir().join(format!("vigil-bench-restart-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut sys = System {
            config: dir.join("vigil.toml"),
            statedir: store.then(|| dir.join("state")),
            dir,
            vigil: vigil.to_path_buf(),
            brokers: Vec::new(),
            spawned: 0,
        };
        let key = sys.dir.join("overlay.key");
        let st = sys.cmd().arg("keygen").arg(&key).stdout(Stdio::null()).stderr(Stdio::null()).status();
        if !st.is_ok_and(|s| s.success()) {
            return Err("vigil keygen failed".into());
        }
        let hosts: Vec<String> = (0..SIZE)
            .map(|r| {
                let p = std::net::TcpListener::bind("127.0.0.1:0")
                    .and_then(|l| l.local_addr())
                    .map_err(|e| format!("no loopback port: {e}"))?
                    .port();
                Ok(format!("{{ host = \"n{r}\", bind = \"tcp://127.0.0.1:{p}\", connect = \"tcp://127.0.0.1:{p}\" }}"))
            })
            .collect::<Result<_, String>>()?;
        let sd = sys.statedir.as_ref().map(|s| format!("statedir = \"{}\"\n", s.display())).unwrap_or_default();
        std::fs::write(
            &sys.config,
            format!(
                "[bootstrap]\ninstance = \"sys\"\noverlay_key = \"{}\"\n{sd}hosts = [ {} ]\n",
                key.display(),
                hosts.join(", ")
            ),
        )
        .map_err(|e| format!("{}: {e}", sys.config.display()))?;
        sys.brokers = (0..SIZE).map(|_| None).collect();
        Ok(sys)
    }

    /// A `vigil` command marked with this instance's directory (`TMPDIR`), without the caller's `VIGIL_*`.
    fn cmd(&self) -> Command {
        let mut c = Command::new(&self.vigil);
        for (k, _) in std::env::vars() {
            if k.starts_with("VIGIL_") {
                c.env_remove(k);
            }
        }
        c.env("TMPDIR", &self.dir).env_remove("RUST_LOG").current_dir(&self.dir).stdin(Stdio::null());
        c
    }

    /// Start broker `rank` (one core, log level info, `attrs` as `-S`); its log goes to a file of its own,
    /// returned.
    fn spawn(&mut self, rank: u32, attrs: &[&str]) -> Result<PathBuf, String> {
        self.spawned += 1;
        let log = self.dir.join(format!("r{rank}-{}.log", self.spawned));
        let f = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
        let mut c = self.cmd();
        c.args(["broker", &format!("--rank={rank}")])
            .arg(format!("--config={}", self.config.display()))
            .arg(format!("--rundir={}", self.dir.join(format!("r{rank}")).display()))
            .args(["-S", "resource.synthetic=pack:1 core:1 pu:1", "-S", "log-level=info"])
            .stdout(Stdio::null())
            .stderr(f);
        for a in attrs {
            c.arg("-S").arg(a);
        }
        let child = c.spawn().map_err(|e| format!("cannot start broker {rank}: {e}"))?;
        self.brokers[rank as usize] = Some(child);
        Ok(log)
    }

    /// Every broker; the instance up (every rank registered with rank 0).
    fn start_all(&mut self, rt: &tokio::runtime::Runtime, attrs: &[&str]) -> Result<(), String> {
        for r in 0..SIZE {
            self.spawn(r, attrs)?;
        }
        rt.block_on(reconnected(&self.uri(), Instant::now(), Duration::from_secs(60))).map(|_| ())
    }

    /// Rank 0's local URI.
    fn uri(&self) -> String {
        format!("local://{}", self.dir.join("r0").join("local-0").display())
    }

    /// SIGKILL rank 0 and reap it.
    fn kill9_rank0(&mut self) {
        if let Some(mut c) = self.brokers[0].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM rank 0 (the instance shuts down) and wait for every broker, at most 30 s.
    fn stop(&mut self) {
        if let Some(c) = &self.brokers[0] {
            // SAFETY: kill(2) of a child this harness started and has not reaped.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        }
        let t0 = Instant::now();
        for b in self.brokers.iter_mut() {
            let Some(c) = b.as_mut() else { continue };
            while t0.elapsed() < Duration::from_secs(30) && c.try_wait().ok().flatten().is_none() {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

impl Drop for System {
    fn drop(&mut self) {
        for c in self.brokers.iter_mut().flatten() {
            let _ = c.kill();
            let _ = c.wait();
        }
        // Job shells and tasks: every process carrying this directory in its environment (TMPDIR) or argv.
        for _ in 0..3 {
            let pids = marked(&self.dir);
            if pids.is_empty() {
                break;
            }
            for pid in pids {
                // SAFETY: kill(2) of a process this instance started (found by its marker); it may be gone.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Processes other than this one whose command line or environment contains `marker`.
fn marked(marker: &Path) -> Vec<i32> {
    let needle = marker.as_os_str().as_encoded_bytes().to_vec();
    let me = std::process::id() as i32;
    let hit = |hay: &[u8]| hay.windows(needle.len()).any(|w| w == needle.as_slice());
    let Ok(rd) = std::fs::read_dir("/proc") else { return Vec::new() };
    rd.flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()))
        .filter(|&pid| pid != me)
        .filter(|pid| {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            !cmd.is_empty() && (hit(&cmd) || hit(&std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default()))
        })
        .collect()
}

// ------------------------------------------------------------------------------------------- readiness

/// Until `broker.info` of rank 0 says `run` and `overlay.status` lists every other rank online: seconds since `t0`.
async fn reconnected(uri: &str, t0: Instant, timeout: Duration) -> Result<f64, String> {
    let mut last = String::from("never connected");
    let mut client = None;
    while t0.elapsed() < timeout {
        if client.is_none() {
            client = vigil::client::Client::connect(uri).await.map_err(|e| last = e.to_string()).ok();
        }
        if let Some(c) = &client {
            match (c.rpc("broker.info", 0, &json!({})).await, c.rpc("overlay.status", 0, &json!({})).await) {
                (Ok(i), Ok(o)) => {
                    let ranks = o["ranks"].as_array().cloned().unwrap_or_default();
                    let online = ranks.iter().filter(|r| r["rank"] != 0 && r["state"] == "online").count();
                    if i["state"] == "run" && online == SIZE as usize - 1 {
                        return Ok(t0.elapsed().as_secs_f64());
                    }
                    last = format!("state {}, {online} other rank(s) online", i["state"]);
                }
                (Err(e), _) | (_, Err(e)) => {
                    last = e.to_string();
                    client = None;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Err(format!("the brokers did not all reconnect within {timeout:?}: {last}"))
}

/// Until every broker's failure detectors are loaded (`broker.info` of each rank no longer says `loading`): each
/// broker of a system instance loads its eBPF programs in the background once it has joined, ~0.1 s of CPU each,
/// which would otherwise fall inside the timed bursts of a fresh instance and weigh on both sides of the store
/// comparison at random. Seconds waited.
async fn detectors_loaded(c: &vigil::client::Client, timeout: Duration) -> Result<f64, String> {
    let t0 = Instant::now();
    let mut last = String::new();
    while t0.elapsed() < timeout {
        let mut loading = Vec::new();
        for r in 0..SIZE {
            let i = c.rpc("broker.info", r, &json!({})).await.map_err(|e| format!("broker.info of rank {r}: {e}"))?;
            let d = &i["detectors"];
            if ["process_exit", "tcp", "responder"].iter().any(|k| d[k].as_str().unwrap_or("").contains("loading")) {
                loading.push(r);
            }
        }
        if loading.is_empty() {
            return Ok(t0.elapsed().as_secs_f64());
        }
        last = format!("ranks {loading:?} still loading");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Err(format!("the failure detectors were not loaded within {timeout:?}: {last}"))
}

/// Until a submission is answered with an id (a fresh connection and a retry every 2 ms until then): seconds
/// since `t0`, and the id.
async fn accepted(uri: &str, t0: Instant, payload: &Value, timeout: Duration) -> Result<(f64, u64), String> {
    let mut last = String::from("never connected");
    while t0.elapsed() < timeout {
        match vigil::client::Client::connect(uri).await {
            Ok(c) => match c.rpc("job-manager.submit", 0, payload).await {
                Ok(v) => match v["id"].as_u64() {
                    Some(id) => return Ok((t0.elapsed().as_secs_f64(), id)),
                    None => return Err(format!("malformed submit response: {v}")),
                },
                Err(e) => last = e.to_string(),
            },
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Err(format!("no submission accepted within {timeout:?}: {last}"))
}

/// A `job-manager.submit` request for one `true` task.
fn true_payload() -> Result<Value, String> {
    let spec = vigil::jobspec::JobspecBuilder::new(vec!["true"]).build().map_err(|e| format!("jobspec: {e}"))?;
    let spec: Value = serde_json::from_str(&spec.to_json()).map_err(|e| format!("jobspec JSON: {e}"))?;
    Ok(json!({"jobspec": spec}))
}

/// One restart's figures.
#[derive(Debug, Default, Clone)]
struct Restart {
    accepted_s: f64,
    reconnected_s: f64,
    /// From rank 0's log.
    store_read_s: Option<f64>,
    restore_s: Option<f64>,
    jobs_in_store: Option<usize>,
    store_bytes: u64,
    wal_bytes: u64,
}

/// A float after `key` in `log` (up to the next `s`).
fn log_secs(log: &str, key: &str) -> Option<f64> {
    let at = log.find(key)? + key.len();
    log[at..].split('s').next()?.trim().parse().ok()
}

/// Kill rank 0, wait the supervisor's delay, exec a new one and time it to ready; then wait for the probe job.
fn one_restart(sys: &mut System, rt: &tokio::runtime::Runtime, delay: Duration) -> Result<Restart, String> {
    sys.kill9_rank0();
    let sd = sys.statedir.clone().ok_or("no state directory")?;
    let size = |f: &str| std::fs::metadata(sd.join(f)).map_or(0, |m| m.len());
    // The logs: SQLite's, and the redo log's segments (what the writer thread had not folded yet).
    let redo: u64 = std::fs::read_dir(&sd)
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with(vigil::broker::redo::PREFIX))
                .map(|e| e.metadata().map_or(0, |m| m.len()))
                .sum()
        })
        .unwrap_or(0);
    let (store_bytes, wal_bytes) = (size("vigil.sqlite"), size("vigil.sqlite-wal") + redo);
    std::thread::sleep(delay);
    let payload = true_payload()?;
    let uri = sys.uri();
    let t0 = Instant::now();
    let log = sys.spawn(0, &[GRACE])?;
    let (acc, rec) = rt.block_on(async {
        tokio::join!(accepted(&uri, t0, &payload, READY_TIMEOUT), reconnected(&uri, t0, READY_TIMEOUT))
    });
    let ((accepted_s, probe), reconnected_s) = (acc?, rec?);
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let jobs_in_store = text
        .find("store read in")
        .and_then(|i| text[i..].split('(').nth(1))
        .and_then(|s| s.split(' ').next())
        .and_then(|n| n.parse().ok());
    let r = Restart {
        accepted_s,
        reconnected_s,
        store_read_s: log_secs(&text, "store read in "),
        restore_s: log_secs(&text, "jobs restored in "),
        jobs_in_store,
        store_bytes,
        wal_bytes,
    };
    rt.block_on(async {
        let c = vigil::client::Client::connect(&uri).await.map_err(|e| e.to_string())?;
        match crate::wait_inactive(&c, probe).await? {
            crate::JobOutcome { exit_code: Some(0), fatal: None } => Ok(()),
            crate::JobOutcome { exit_code, fatal } => {
                Err(format!("probe job {probe}: exit code {exit_code:?}, exception {fatal:?}"))
            }
        }
    })?;
    Ok(r)
}

// ------------------------------------------------------------------------------------------- the filler

/// Fill the (closed) store of `statedir` up to `target` jobs with copies of its newest real COMPLETED job, through
/// the broker's own `Store::commit`. Returns (jobs added, seconds taken).
fn fill_store(statedir: &Path, target: usize) -> Result<(usize, f64), String> {
    use vigil::broker::store::Store;
    let t0 = Instant::now();
    let (mut store, kept) = Store::open(statedir).map_err(|e| e.to_string())?;
    let kept = kept.ok_or("the store has never been written")?;
    let have = kept.jobs.len();
    if have >= target {
        return Ok((0, 0.0));
    }
    let (&tid, template) = kept
        .jobs
        .iter()
        .rev()
        .find(|(_, j)| {
            j.state == JobState::Inactive && j.status == Some(0) && j.eventlog.iter().any(|e| e.name == "finish")
        })
        .ok_or("no COMPLETED job in the store to copy")?;
    let top = kept.jobs.keys().next_back().copied().unwrap_or_default().max(kept.last_id);
    let (tms, mut ms, mut seq) = (tid.0 >> 24, (top.0 >> 24) + 1, 0u32);
    let mut added = 0;
    while have + added < target {
        let n = FILL_BATCH.min(target - have - added);
        let mut jobs = Vec::with_capacity(n);
        for _ in 0..n {
            let id = JobId::from_parts(ms, seq);
            let shift = (ms - tms) as f64 / 1000.0;
            let events = template
                .eventlog
                .iter()
                .map(|e| {
                    let mut e = e.clone();
                    e.timestamp += shift;
                    std::sync::Arc::new(e)
                })
                .collect();
            jobs.push(JobRecord {
                id,
                userid: template.userid,
                state: JobState::Inactive,
                jobspec: Some(template.jobspec.to_string().into()),
                submit_key: None,
                credential: None,
                first_event: 0,
                events,
                row: true,
                r: template.r.clone(),
                status: template.status,
                output: Some(template.output.clone()),
                rows: Default::default(),
            });
            seq += 1;
            if seq == 1024 {
                (ms, seq) = (ms + 1, 0);
            }
        }
        let last_id = jobs.last().map_or(top, |j: &JobRecord| j.id);
        let b = Journal {
            jobs,
            resource_first: kept.resource_eventlog.len(),
            resource_events: Vec::new(),
            last_id,
            epoch: kept.epoch,
            purged: Vec::new(),
            ranks: Vec::new(),
            history: Vec::new(),
            history_expired: Vec::new(),
            tick: 0,
        };
        store.commit(&b).map_err(|e| format!("commit: {e}"))?;
        added += n;
    }
    Ok((added, t0.elapsed().as_secs_f64()))
}

/// Jobs rank 0 lists: (`vigil jobs -a` lines, `job-manager.list` entries).
fn listed(sys: &System, rt: &tokio::runtime::Runtime) -> Result<(usize, usize), String> {
    let out = sys
        .cmd()
        .env("VIGIL_URI", sys.uri())
        .args(["jobs", "-a", "--json"])
        .output()
        .map_err(|e| format!("vigil jobs: {e}"))?;
    if !out.status.success() {
        return Err(format!("vigil jobs -a: {}", String::from_utf8_lossy(&out.stderr).trim()));
    }
    let v: Value = serde_json::from_slice(&out.stdout).map_err(|e| format!("vigil jobs -a --json: {e}"))?;
    let cli = v["jobs"].as_array().map_or(0, Vec::len);
    let rpc = rt.block_on(async {
        let c = vigil::client::Client::connect(&sys.uri()).await.map_err(|e| e.to_string())?;
        let l = c.rpc("job-manager.list", 0, &json!({"all": true})).await.map_err(|e| e.to_string())?;
        Ok::<_, String>(l["jobs"].as_array().map_or(0, Vec::len))
    })?;
    Ok((cli, rpc))
}

// ------------------------------------------------------------------------------------------- the run

/// Restart to ready at every size; returns (per-size JSON rows, real-submission JSON).
fn bench_restarts(a: &RestartArgs, vigil: &Path, rt: &tokio::runtime::Runtime) -> Result<(Vec<Value>, Value), String> {
    let mut sys = System::new(vigil, true)?;
    sys.start_all(rt, &[GRACE])?;
    let sd = sys.statedir.clone().ok_or("no state directory")?;
    let delay = Duration::from_millis(a.restart_delay_ms);
    let mut rows = Vec::new();
    let mut real = Value::Null;
    let mut sizes = a.sizes.clone();
    sizes.sort_unstable();
    for &size in &sizes {
        let mut fill = json!(null);
        if size > 0 {
            if real.is_null() {
                // Real jobs first: the template, and how fast real submission fills a store here.
                let payload = true_payload()?;
                let n = a.real_jobs.min(size).max(1);
                let (submit_s, total_s, done) = rt.block_on(async {
                    let c = vigil::client::Client::connect(&sys.uri()).await.map_err(|e| e.to_string())?;
                    crate::sched::burst(&c, &payload, n, Duration::from_secs(1800)).await
                })?;
                if done != n {
                    return Err(format!("only {done} of {n} real jobs finished"));
                }
                real = json!({"jobs": n, "submit_s": r4(submit_s), "total_s": r4(total_s),
                    "jobs_per_s": r4(n as f64 / total_s)});
                eprintln!("vigil-bench restart: {n} real jobs in {total_s:.1} s ({:.0} jobs/s)", n as f64 / total_s);
            }
            sys.kill9_rank0();
            let (added, fill_s) = fill_store(&sd, size)?;
            eprintln!("vigil-bench restart: store filled to {size} jobs (+{added} in {fill_s:.1} s)");
            fill = json!({"added": added, "s": r4(fill_s)});
        }
        let mut samples = Vec::new();
        for i in 0..a.restarts {
            let r = one_restart(&mut sys, rt, delay)?;
            eprintln!(
                "vigil-bench restart: {size} jobs, restart {}: accepted {:.3} s, reconnected {:.3} s, store read {:?} s, \
                 restored {:?} s ({:?} jobs, {} + {} bytes)",
                i + 1,
                r.accepted_s,
                r.reconnected_s,
                r.store_read_s,
                r.restore_s,
                r.jobs_in_store,
                r.store_bytes,
                r.wal_bytes
            );
            samples.push(r);
        }
        let (cli, rpc) = listed(&sys, rt)?;
        let expect = samples.last().and_then(|r| r.jobs_in_store).unwrap_or(0) + 1;
        if cli != expect || rpc != expect {
            return Err(format!(
                "{size} jobs: rank 0 lists {cli} (vigil jobs -a) / {rpc} (job-manager.list), not {expect}"
            ));
        }
        let col = |f: fn(&Restart) -> Option<f64>| -> Vec<f64> { samples.iter().filter_map(f).collect() };
        let summary = |v: Vec<f64>| {
            let (m, lo, hi) = summarize(&v);
            json!({"median": m.map(r4), "min": lo.map(r4), "max": hi.map(r4), "samples": v.into_iter().map(r4).collect::<Vec<_>>()})
        };
        rows.push(json!({
            "size": size,
            "fill": fill,
            "jobs_in_store": samples.iter().map(|r| r.jobs_in_store).collect::<Vec<_>>(),
            "listed_after": {"vigil_jobs_a": cli, "job_manager_list": rpc},
            "store_bytes": samples.last().map_or(0, |r| r.store_bytes),
            "wal_bytes": samples.last().map_or(0, |r| r.wal_bytes),
            "accepted_s": summary(col(|r| Some(r.accepted_s))),
            "reconnected_s": summary(col(|r| Some(r.reconnected_s))),
            "store_read_s": summary(col(|r| r.store_read_s)),
            "restore_s": summary(col(|r| r.restore_s)),
            "ready_s": summary(col(|r| Some(r.accepted_s.max(r.reconnected_s)))),
        }));
    }
    sys.stop();
    Ok((rows, real))
}

/// One throughput run's figures.
#[derive(Debug, Clone)]
struct Tput {
    /// Submissions answered per second.
    submit_per_s: f64,
    /// The first [`FIRST_ANSWERS`] answers (in the order they came) per second.
    first_per_s: f64,
    /// Jobs done end to end per second (first submit to last INACTIVE).
    end_to_end_per_s: f64,
    /// Rank 0's CPU per job while the submissions were answered (us), by thread ([`rank0_threads`]).
    submit_cpu_us: std::collections::BTreeMap<&'static str, f64>,
    /// Rank 0's CPU per job over the whole run (us), by thread.
    run_cpu_us: std::collections::BTreeMap<&'static str, f64>,
    /// Share of the machine's CPUs busy while the submissions were answered (0-1, /proc/stat).
    submit_busy: f64,
}

/// Rank 0's threads as reported: the event loop (the process's main thread), the store's writer (the fold into
/// SQLite) and syncer (fdatasync of the redo log), and everything else (detectors, responder, blocking pool).
fn thread_group(comm: &str) -> &'static str {
    match comm {
        "vigil" => "loop",
        "vigil-store-wri" => "store writer",
        "vigil-store-syn" => "store syncer",
        _ => "other",
    }
}

/// CPU time (us) of `pid`'s threads, summed by [`thread_group`] (/proc/PID/task/*/schedstat: ns on CPU).
fn rank0_threads(pid: Option<u32>) -> std::collections::BTreeMap<&'static str, f64> {
    let mut m = std::collections::BTreeMap::new();
    let Some(rd) = pid.and_then(|p| std::fs::read_dir(format!("/proc/{p}/task")).ok()) else { return m };
    for t in rd.flatten() {
        let p = t.path();
        let comm = std::fs::read_to_string(p.join("comm")).unwrap_or_default();
        let ns = std::fs::read_to_string(p.join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next().and_then(|x| x.parse::<f64>().ok()))
            .unwrap_or(0.0);
        *m.entry(thread_group(comm.trim())).or_insert(0.0) += ns / 1e3;
    }
    m
}

/// Per job: (`after` - `before`) / `n`, by group (a thread gone since counts 0, so the share it ran is lost: only
/// the loader of the detectors ends, and it is done before the timed bursts).
fn per_job(
    before: &std::collections::BTreeMap<&'static str, f64>,
    after: &std::collections::BTreeMap<&'static str, f64>,
    n: usize,
) -> std::collections::BTreeMap<&'static str, f64> {
    after.iter().map(|(k, v)| (*k, ((v - before.get(k).copied().unwrap_or(0.0)) / n as f64).max(0.0))).collect()
}

/// (busy, total) jiffies of all the machine's CPUs since boot (/proc/stat; idle and iowait count as not busy).
fn machine_jiffies() -> (f64, f64) {
    let s = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let v: Vec<f64> =
        s.lines().next().unwrap_or("").split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect();
    let total: f64 = v.iter().take(8).sum();
    let idle = v.get(3).copied().unwrap_or(0.0) + v.get(4).copied().unwrap_or(0.0);
    (total - idle, total)
}

/// One throughput run in a fresh instance, `n` jobs after every broker's detectors are loaded
/// ([`detectors_loaded`]) and a warm-up of 8 jobs.
fn tput_run(vigil: &Path, store: bool, n: usize, rt: &tokio::runtime::Runtime) -> Result<Tput, String> {
    let mut sys = System::new(vigil, store)?;
    sys.start_all(rt, &[])?;
    let payload = true_payload()?;
    let pid = sys.brokers.first().and_then(Option::as_ref).map(Child::id);
    let r = rt.block_on(async {
        let c = vigil::client::Client::connect(&sys.uri()).await.map_err(|e| e.to_string())?;
        detectors_loaded(&c, Duration::from_secs(30)).await?;
        crate::sched::burst(&c, &payload, 8, Duration::from_secs(60)).await?;
        let (cpu0, busy0) = (rank0_threads(pid), machine_jiffies());
        let t0 = Instant::now();
        let (ids, first) = crate::submit_all_marked(&c, &payload, n, FIRST_ANSWERS).await?;
        let first_s = first.duration_since(t0).as_secs_f64();
        let submit_s = t0.elapsed().as_secs_f64();
        let (cpu1, busy1) = (rank0_threads(pid), machine_jiffies());
        let (total_s, done) = crate::sched::follow(&c, &ids, t0, Duration::from_secs(900)).await?;
        if done != n {
            return Err(format!("only {done} of {n} jobs finished in 900 s"));
        }
        Ok(Tput {
            submit_per_s: n as f64 / submit_s,
            first_per_s: n.min(FIRST_ANSWERS) as f64 / first_s,
            end_to_end_per_s: n as f64 / total_s,
            submit_cpu_us: per_job(&cpu0, &cpu1, n),
            run_cpu_us: per_job(&cpu0, &rank0_threads(pid), n),
            submit_busy: if busy1.1 > busy0.1 { (busy1.0 - busy0.0) / (busy1.1 - busy0.1) } else { 0.0 },
        })
    });
    sys.stop();
    r
}

/// Alternating throughput runs, store off and on: (off samples, on samples).
fn bench_tput(a: &RestartArgs, vigil: &Path, rt: &tokio::runtime::Runtime) -> Result<(Vec<Tput>, Vec<Tput>), String> {
    let (mut off, mut on) = (Vec::new(), Vec::new());
    for i in 0..a.tput_runs {
        let order = if i % 2 == 0 { [false, true] } else { [true, false] };
        for store in order {
            let t = tput_run(vigil, store, a.tput_jobs, rt)?;
            let cpu = |m: &std::collections::BTreeMap<&str, f64>| {
                m.iter().map(|(k, v)| format!("{k} {v:.1}")).collect::<Vec<_>>().join(", ")
            };
            eprintln!(
                "vigil-bench restart: throughput run {}, store {}: submit {:.0} jobs/s (first {FIRST_ANSWERS}: {:.0}; \
                 machine {:.0} % busy; rank 0 us per job: {}), end to end {:.1} jobs/s (rank 0 us per job: {})",
                i + 1,
                if store { "on" } else { "off" },
                t.submit_per_s,
                t.first_per_s,
                t.submit_busy * 100.0,
                cpu(&t.submit_cpu_us),
                t.end_to_end_per_s,
                cpu(&t.run_cpu_us)
            );
            if store { &mut on } else { &mut off }.push(t);
        }
    }
    Ok((off, on))
}

/// `vigil-bench restart`: measure, print and write `results/restart.{json,md}`.
pub(crate) fn run(a: &RestartArgs, vigil: Option<PathBuf>, out_dir: Option<PathBuf>) -> Result<i32, String> {
    let vigil = find_vigil(vigil)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start tokio: {e}"))?;
    let started = now_epoch_s();
    // The 1-minute load average before the first measurement: whether the machine was quiet.
    let load = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().and_then(|x| x.parse::<f64>().ok()));
    let (rows, real) = if a.sizes.is_empty() { (Vec::new(), Value::Null) } else { bench_restarts(a, &vigil, &rt)? };
    let (off, on) = bench_tput(a, &vigil, &rt)?;
    let stat = |v: Vec<f64>| {
        let (m, lo, hi) = summarize(&v);
        json!({"median": m.map(r4), "min": lo.map(r4), "max": hi.map(r4),
               "samples": v.into_iter().map(r4).collect::<Vec<_>>()})
    };
    let cpu = |v: &[Tput], f: fn(&Tput) -> &std::collections::BTreeMap<&'static str, f64>| {
        let groups: std::collections::BTreeSet<&str> = v.iter().flat_map(|t| f(t).keys().copied()).collect();
        groups
            .into_iter()
            .map(|g| (g.to_string(), stat(v.iter().map(|t| f(t).get(g).copied().unwrap_or(0.0)).collect())))
            .collect::<serde_json::Map<String, Value>>()
    };
    let tput = |v: &[Tput]| {
        json!({"submit_jobs_per_s": stat(v.iter().map(|t| t.submit_per_s).collect()),
               "first_answers_per_s": stat(v.iter().map(|t| t.first_per_s).collect()),
               "end_to_end_jobs_per_s": stat(v.iter().map(|t| t.end_to_end_per_s).collect()),
               "submit_machine_busy": stat(v.iter().map(|t| t.submit_busy).collect()),
               "rank0_cpu_us_per_job_submit": cpu(v, |t| &t.submit_cpu_us),
               "rank0_cpu_us_per_job_run": cpu(v, |t| &t.run_cpu_us)})
    };
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let doc = json!({
        "group": "restart",
        "vigil": vigil_version(&vigil),
        "cpus": cpus,
        "unix_time": started.round(),
        "load_average_at_start": load,
        "shell_linkage": crate::shell_linkage(&vigil).1,
        "instance": "4-broker system instance on loopback, TOML bootstrap, one core per broker",
        "restart_delay_ms": a.restart_delay_ms,
        "fill_method": "real jobs first, then copies of the newest real COMPLETED job written with Store::commit",
        "real_jobs": real,
        "restart": rows,
        "throughput": {"jobs_per_run": a.tput_jobs, "first_answers": a.tput_jobs.min(FIRST_ANSWERS), "store_off": tput(&off), "store_on": tput(&on)},
    });
    let md = markdown(&doc, a);
    print!("{md}");
    write_results(&results_dir(out_dir), "restart", &doc, &md)?;
    Ok(0)
}

/// `x` (seconds) as "0.123", or "-".
fn secs(v: &Value) -> String {
    v.as_f64().map_or("-".into(), |x| format!("{x:.3}"))
}

fn markdown(doc: &Value, a: &RestartArgs) -> String {
    let mut md = format!(
        "# Rank 0 restart to ready, and submit throughput with the store on and off\n\n\
         `vigil-bench restart` ({}, {} CPUs, 1-minute load average {} at start; unix time {}). A 4-broker system instance on loopback (TOML bootstrap, `vigil broker --rank`, one core each, \
         `tbon.parent_grace=600s`). Rank 0 is killed with SIGKILL and a new one exec'd on the same state directory \
         {} ms later (a supervisor's delay); times are from that exec. {}\n\n",
        doc["vigil"].as_str().unwrap_or("?"),
        doc["cpus"],
        doc["load_average_at_start"].as_f64().map_or("unknown".into(), |l| format!("{l:.2}")),
        doc["unix_time"],
        a.restart_delay_ms,
        crate::shell_sentence_for(doc["shell_linkage"].as_str().unwrap_or("unknown"))
    );
    let real = &doc["real_jobs"];
    md += &format!(
        "**How the store was filled.** {} real `true` jobs were submitted (pipelined on one connection) and run first: \
         {} jobs/s end to end, too slow for 100,000. Then, rank 0 down, the store was filled up to each size with \
         copies of the newest real COMPLETED job (its jobspec, R, status and whole eventlog, as the job core's \
         journal records it), under new ids above every kept id, written by the broker's own `Store::commit`, 1,000 \
         jobs per transaction. Each restart's probe submission adds one job, run to INACTIVE before the next kill. \
         After the last restart of each size rank 0 listed every job (`vigil jobs -a` and `job-manager.list`).\n\n",
        real["jobs"],
        real["jobs_per_s"].as_f64().map_or("-".into(), |x| format!("{x:.0}"))
    );
    md += "## Restart to ready (s, from exec of the new rank 0; median of the restarts, [min-max])\n\n\
           | jobs in store | restarts | store file | submission accepted | all 3 brokers reconnected | store read (log) | jobs restored (log) |\n\
           |---:|---:|---:|---:|---:|---:|---:|\n";
    let cell = |v: &Value| format!("{} [{}-{}]", secs(&v["median"]), secs(&v["min"]), secs(&v["max"]));
    let mut ready_10k = None;
    for r in doc["restart"].as_array().cloned().unwrap_or_default() {
        let mib = (r["store_bytes"].as_f64().unwrap_or(0.0) + r["wal_bytes"].as_f64().unwrap_or(0.0)) / 1048576.0;
        let jobs: Vec<String> =
            r["jobs_in_store"].as_array().cloned().unwrap_or_default().iter().map(|j| j.to_string()).collect();
        md += &format!(
            "| {} | {} | {mib:.1} MiB | {} | {} | {} | {} |\n",
            jobs.first().cloned().unwrap_or_default(),
            r["accepted_s"]["samples"].as_array().map_or(0, Vec::len),
            cell(&r["accepted_s"]),
            cell(&r["reconnected_s"]),
            cell(&r["store_read_s"]),
            cell(&r["restore_s"]),
        );
        if r["size"] == 10_000 {
            ready_10k = r["ready_s"]["median"].as_f64();
        }
    }
    md += "\n`jobs in store`: at the first restart of the size (each restart adds its probe job). `store file`: \
           `vigil.sqlite` plus its WAL and the redo log at the kill. `store read`: opening the file, `quick_check` and reading every \
           row back; `jobs restored`: the job core rebuilt from them (both from rank 0's log). Ranks 1-3 retry \
           rank 0 every second (`RANK0_RETRY`), counted from their loss of it, so `reconnected` waits for the next \
           retry after rank 0 is listening.\n\n";
    let t = &doc["throughput"];
    let m = |k: &str, w: &str| t[k][w]["median"].as_f64();
    let ratio = |w: &str| match (m("store_on", w), m("store_off", w)) {
        (Some(on), Some(off)) if off > 0.0 => Some(on / off),
        _ => None,
    };
    md += &format!(
        "## Submit throughput, store on and off ({} runs each, alternating, {} `true` jobs per run, a fresh instance each)\n\n\
         | jobs/s | store off median [min-max] | store on median [min-max] | on / off |\n|---|---:|---:|---:|\n",
        t["store_on"]["submit_jobs_per_s"]["samples"].as_array().map_or(0, Vec::len),
        t["jobs_per_run"]
    );
    let first = format!("first {} answers (of the same runs)", t["first_answers"]);
    for (w, what) in [
        ("submit_jobs_per_s", "submissions answered"),
        ("first_answers_per_s", first.as_str()),
        ("end_to_end_jobs_per_s", "end to end (last job INACTIVE)"),
    ] {
        let c = |k: &str| {
            let v = &t[k][w];
            let f = |x: &Value| x.as_f64().map_or("-".into(), |x| format!("{x:.1}"));
            format!("{} [{}-{}]", f(&v["median"]), f(&v["min"]), f(&v["max"]))
        };
        md += &format!(
            "| {what} | {} | {} | {} |\n",
            c("store_off"),
            c("store_on"),
            ratio(w).map_or("-".into(), |r| format!("{:.0} %", r * 100.0))
        );
    }
    let f1 = |x: Option<f64>| x.map_or("-".into(), |x| format!("{x:.1}"));
    md += &format!(
        "\nEach run starts once every broker's failure detectors are loaded (each broker loads its eBPF programs in \
         the background after joining, ~0.1 s of CPU: inside the timed burst of a fresh instance it would weigh on \
         either side at random), then runs 8 jobs untimed. While the submissions were answered the machine's CPUs \
         were {} % (store off) and {} % (store on) busy (medians).\n\n\
         **Rank 0's CPU per job** (us, median over the runs; /proc schedstat of its threads): `loop` is the \
         broker's event loop (the job core, the overlay, and with the store the redo log's records), `store writer` \
         the fold of the redo log into SQLite, `store syncer` the fdatasync of the log for the submissions' \
         answers, `other` the detectors, the responder and tokio's blocking pool.\n\n\
         | rank 0 thread | while answering, off | while answering, on | whole run, off | whole run, on |\n\
         |---|---:|---:|---:|---:|\n",
        f1(t["store_off"]["submit_machine_busy"]["median"].as_f64().map(|x| x * 100.0)),
        f1(t["store_on"]["submit_machine_busy"]["median"].as_f64().map(|x| x * 100.0)),
    );
    for g in ["loop", "store writer", "store syncer", "other"] {
        let c = |k: &str, w: &str| f1(t[k][w][g]["median"].as_f64());
        md += &format!(
            "| {g} | {} | {} | {} | {} |\n",
            c("store_off", "rank0_cpu_us_per_job_submit"),
            c("store_on", "rank0_cpu_us_per_job_submit"),
            c("store_off", "rank0_cpu_us_per_job_run"),
            c("store_on", "rank0_cpu_us_per_job_run")
        );
    }
    let verdict = |ok: bool| if ok { "met" } else { "MISSED" };
    md += "\n## Targets (issue 17)\n\n| target | measured | status |\n|---|---|---|\n";
    if let Some(r) = ready_10k {
        md += &format!(
            "| ready within {TARGET_READY_10K_S} s with 10,000 jobs (accepted and reconnected) | {r:.3} s (median over the restarts of the later of the two) | {} |\n",
            verdict(r <= TARGET_READY_10K_S)
        );
    }
    for (w, what) in [("submit_jobs_per_s", "submit"), ("end_to_end_jobs_per_s", "end-to-end")] {
        if let Some(r) = ratio(w) {
            md += &format!(
                "| {what} throughput with the store >= {:.0} % of without | {:.0} % | {} |\n",
                TARGET_STORE_FRACTION * 100.0,
                r * 100.0,
                verdict(r >= TARGET_STORE_FRACTION)
            );
        }
    }
    md
}
