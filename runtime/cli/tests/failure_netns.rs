//! Failure injection on clusters of network-namespace "nodes" (`ci/netns-cluster.sh`): one broker per namespace on
//! a private bridge, killed (`kill -9`), silently removed (link cut, then every process killed), or stalled
//! (SIGSTOP). Needs root.
//!
//! Every test owns a cluster with a unique short name; a guard runs `ci/netns-cluster.sh down NAME` whatever
//! happens (panics included). Measured latencies are printed (`cargo test -- --nocapture`), never asserted: this
//! machine is shared and noisy. Assertions are about outcomes and orderings; deadlines only prevent hangs.

mod common;

use common::*;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Deadline for one cluster-script command (`up` of 6 nodes takes well under a second when idle).
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(60);
/// Deadline for a verdict (lost, torpid, online) that normally takes well under a second.
const VERDICT: Duration = Duration::from_secs(10);
/// Deadline for a job to end.
const JOB_END: Duration = Duration::from_secs(60);

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("workspace root")
}

fn cluster_script() -> PathBuf {
    repo_root().join("ci/netns-cluster.sh")
}

/// Wall-clock time in seconds since the epoch (the brokers' event timestamps use the same clock).
fn now_s() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

fn ms(secs: f64) -> String {
    format!("{:.0} ms", secs * 1e3)
}

/// A fresh cluster name "f" + 4 hex digits that no other cluster uses, claimed by creating its state directory.
fn claim_name() -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    for attempt in 0..1000u64 {
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
        let mut x = nanos
            ^ ((std::process::id() as u64) << 32)
            ^ ((COUNTER.fetch_add(1, Ordering::Relaxed) as u64) << 48)
            ^ attempt;
        x ^= x >> 33;
        x = x.wrapping_mul(0xff51afd7ed558ccd);
        x ^= x >> 29;
        let name = format!("f{:04x}", x & 0xffff);
        if Path::new(&format!("/run/netns/vn-{name}-hub")).exists() {
            continue;
        }
        // The script does `mkdir -p` of this directory: creating it first is an atomic claim of the name.
        if std::fs::create_dir(format!("/tmp/vigil-netns-{name}")).is_ok() {
            return name;
        }
    }
    panic!("no free cluster name");
}

/// A `vigil` command against `uri`, with `dir` as TMPDIR and cwd.
fn vigil_at(dir: &Path, uri: &str, args: &[&str], timeout: Duration) -> Output {
    let mut c = vigil_cmd(dir);
    c.env("VIGIL_URI", uri).args(args);
    run(c, timeout, None)
}

/// The entry of `rank` in `vigil overlay status --json` or `vigil resource status --json`.
fn rank_entry(v: &Value, rank: u32) -> Value {
    v["ranks"]
        .as_array()
        .and_then(|a| a.iter().find(|r| r["rank"].as_u64() == Some(rank as u64)))
        .cloned()
        .unwrap_or(Value::Null)
}

/// Parse JSON lines (eventlogs).
fn json_lines(s: &str) -> Vec<Value> {
    s.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad eventlog line {l:?}: {e}")))
        .collect()
}

/// An idset string containing `rank` (plain forms only: "2", "1-3", "0,2").
fn idset_has(s: &str, rank: u32) -> bool {
    s.split(',').any(|part| match part.split_once('-') {
        Some((a, b)) => {
            matches!((a.trim().parse::<u32>(), b.trim().parse::<u32>()), (Ok(a), Ok(b)) if a <= rank && rank <= b)
        }
        None => part.trim().parse::<u32>() == Ok(rank),
    })
}

/// One cluster of namespace nodes; dropping it tears everything down.
struct Cluster {
    name: String,
    uri: String,
    /// TMPDIR of the brokers and of every command (so job directories never collide between clusters), and the
    /// marker for a last-resort kill of anything left.
    dir: tempfile::TempDir,
}

impl Cluster {
    #[track_caller]
    fn up(size: u32) -> Cluster {
        Cluster::up_with(size, &[])
    }

    /// A cluster whose brokers get `extra` arguments (e.g. `--setattr=...`).
    #[track_caller]
    fn up_with(size: u32, extra: &[&str]) -> Cluster {
        let name = claim_name();
        let dir = tempdir();
        // The guard exists before `up` runs: a half-made cluster is torn down too.
        let mut c = Cluster { name, uri: String::new(), dir };
        let t = Instant::now();
        let (n, sz) = (c.name.clone(), size.to_string());
        let mut args = vec!["up", &n, &sz];
        args.extend_from_slice(extra);
        c.script(&args).ok();
        let uri = c.script(&["uri", &c.name.clone()]);
        uri.ok();
        c.uri = uri.stdout.trim().to_string();
        eprintln!("[{}] cluster of {size} nodes up in {:.2}s", c.name, t.elapsed().as_secs_f64());
        c
    }

    /// A cluster whose links are impaired from the start (`VIGIL_NETNS_IMPAIR`: "DELAY JITTER LOSS SEED").
    #[track_caller]
    fn up_impaired(size: u32, impair: &str) -> Cluster {
        let name = claim_name();
        let dir = tempdir();
        let mut c = Cluster { name, uri: String::new(), dir };
        let (n, sz) = (c.name.clone(), size.to_string());
        let mut cmd = c.command(&["up", &n, &sz]);
        cmd.env("VIGIL_NETNS_IMPAIR", impair);
        run(cmd, SCRIPT_TIMEOUT, None).ok();
        let uri = c.script(&["uri", &n]);
        uri.ok();
        c.uri = uri.stdout.trim().to_string();
        c
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(cluster_script());
        c.args(args)
            .env("VIGIL", vigil_bin())
            .env("TMPDIR", self.dir.path())
            .env("PATH", path_env())
            .env_remove("VIGIL_URI")
            .env_remove("VIGIL_NETNS_DIR")
            .current_dir(self.dir.path());
        c
    }

    fn script(&self, args: &[&str]) -> Output {
        let c = self.command(args);
        run(c, SCRIPT_TIMEOUT, None)
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// `vigil ARGS...` against rank 0.
    fn vigil(&self, args: &[&str]) -> Output {
        vigil_at(self.path(), &self.uri, args, CMD_TIMEOUT)
    }

    /// `vigil ARGS...` with extra environment, in `cwd`.
    fn vigil_in(&self, cwd: &Path, env: &[(&str, &str)], args: &[&str], timeout: Duration) -> Output {
        let mut c = vigil_cmd(self.path());
        c.env("VIGIL_URI", &self.uri).current_dir(cwd).args(args);
        for (k, v) in env {
            c.env(k, v);
        }
        run(c, timeout, None)
    }

    #[track_caller]
    fn json(&self, args: &[&str]) -> Value {
        let o = self.vigil(args);
        o.ok();
        o.json()
    }

    /// (state, reason) of `rank` in `vigil overlay status --json`.
    fn overlay_rank(&self, rank: u32) -> (String, String) {
        let o = self.vigil(&["overlay", "status", "--json"]);
        if o.code != 0 {
            return (String::new(), o.dump());
        }
        let e = rank_entry(&o.json(), rank);
        (e["state"].as_str().unwrap_or("").to_string(), e["reason"].as_str().unwrap_or("").to_string())
    }

    /// Poll the overlay every `every` until `rank` is in `state`; returns (seconds since `since`, reason).
    #[track_caller]
    fn wait_overlay_state(&self, rank: u32, state: &str, since: Instant, every: Duration) -> (f64, String) {
        loop {
            let (s, reason) = self.overlay_rank(rank);
            if s == state {
                return (since.elapsed().as_secs_f64(), reason);
            }
            assert!(
                since.elapsed() < VERDICT,
                "[{}] rank {rank} not {state} within {VERDICT:?}: {s} ({reason})",
                self.name
            );
            std::thread::sleep(every);
        }
    }

    fn resource_eventlog(&self) -> Vec<Value> {
        let o = self.vigil(&["resource", "eventlog", "--json"]);
        o.ok();
        json_lines(&o.stdout)
    }

    /// Timestamp of the first resource event `name` for `rank`.
    fn resource_event_time(&self, name: &str, rank: u32) -> Option<f64> {
        self.resource_eventlog()
            .iter()
            .find(|e| e["name"] == name && idset_has(e["context"]["idset"].as_str().unwrap_or(""), rank))
            .and_then(|e| e["timestamp"].as_f64())
    }

    fn job_eventlog(&self, id: &str) -> Vec<Value> {
        let o = self.vigil(&["job", "eventlog", "--json", id]);
        o.ok();
        json_lines(&o.stdout)
    }

    #[track_caller]
    fn job(&self, id: &str) -> Value {
        let v = self.json(&["jobs", "-a", "--json"]);
        v["jobs"]
            .as_array()
            .and_then(|a| a.iter().find(|j| j["id_f58"].as_str() == Some(id)))
            .cloned()
            .unwrap_or_else(|| panic!("job {id} not listed: {v}"))
    }

    #[track_caller]
    fn submit(&self, args: &[&str]) -> String {
        let mut a = vec!["submit"];
        a.extend_from_slice(args);
        let o = self.vigil(&a);
        o.ok();
        let id = o.stdout.trim().to_string();
        assert!(id.starts_with('f') && !id.contains(char::is_whitespace), "bad job id:\n{}", o.dump());
        id
    }

    /// Silent node death of node `k`; returns the wall time just before the link was cut.
    #[track_caller]
    fn kill_node(&self, k: u32) -> f64 {
        let t = now_s();
        self.script(&["kill", &self.name, &k.to_string()]).ok();
        eprintln!("[{}] node{k} silently killed at {t:.3} (script took {})", self.name, ms(now_s() - t));
        t
    }

    fn broker_pid(&self, k: u32) -> i32 {
        let p = format!("/tmp/vigil-netns-{}/node{k}/broker.pid", self.name);
        std::fs::read_to_string(&p)
            .unwrap_or_else(|e| panic!("{p}: {e}"))
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("{p}: {e}"))
    }

    /// Processes of node `k` (pid, command line).
    fn node_processes(&self, k: u32) -> Vec<(i32, String)> {
        let o = self.script(&["pids", &self.name, &k.to_string()]);
        o.stdout
            .split_whitespace()
            .filter_map(|p| p.parse::<i32>().ok())
            .filter_map(|pid| {
                let cl = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
                let cl = cl
                    .split(|b| *b == 0)
                    .map(|p| String::from_utf8_lossy(p).into_owned())
                    .collect::<Vec<_>>()
                    .join(" ");
                Some((pid, cl.trim().to_string()))
            })
            .collect()
    }

    /// Processes of node `k` other than its own broker.
    fn node_leftovers(&self, k: u32) -> Vec<(i32, String)> {
        let broker = self.broker_pid(k);
        self.node_processes(k).into_iter().filter(|(p, _)| *p != broker).collect()
    }

    /// A new broker on node `k` (after [`Cluster::kill_node`]), started with the cluster's arguments.
    #[track_caller]
    fn restart_node(&self, k: u32) {
        self.script(&["restart", &self.name, &k.to_string()]).ok();
        eprintln!("[{}] node{k}: broker restarted", self.name);
    }

    /// `VIGIL_URI` of node `k`'s own broker.
    fn node_uri(&self, k: u32) -> String {
        format!("local:///tmp/vigil-netns-{}/node{k}/local-{k}", self.name)
    }

    /// `vigil overlay status --json` (the shape as rank 0 knows it: each rank's state, parent, children, adopted).
    #[track_caller]
    fn overlay(&self) -> Value {
        self.json(&["overlay", "status", "--json"])
    }

    /// Ranks in state "lost" in `vigil resource status --json`.
    #[track_caller]
    fn lost_ranks(&self) -> BTreeSet<u32> {
        let rs = self.json(&["resource", "status", "--json"]);
        rs["ranks"]
            .as_array()
            .map(|a| {
                a.iter().filter(|r| r["state"] == "lost").filter_map(|r| r["rank"].as_u64()).map(|r| r as u32).collect()
            })
            .unwrap_or_default()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // The brokers' logs explain most failures: print them before they are removed.
            for k in 0.. {
                let Ok(log) = std::fs::read_to_string(format!("/tmp/vigil-netns-{}/node{k}/broker.log", self.name))
                else {
                    break;
                };
                let lines: Vec<&str> = log.lines().collect();
                eprintln!(
                    "[{}] --- node{k}/broker.log (last 30 lines) ---\n{}",
                    self.name,
                    lines[lines.len().saturating_sub(30)..].join("\n")
                );
            }
        }
        let o = self.script(&["down", &self.name]);
        if o.code != 0 {
            eprintln!("[{}] down failed:\n{}", self.name, o.dump());
        }
        kill_marked(self.dir.path());
        let _ = std::fs::remove_dir_all(format!("/tmp/vigil-netns-{}", self.name));
    }
}

// ------------------------------------------------------------------------------------------- liveness

#[test]
fn broker_kill_is_lost() {
    let c = Cluster::up(3);
    let pid = c.broker_pid(2);
    let t0 = now_s();
    let since = Instant::now();
    // SAFETY: kill(2) of the broker this test's cluster started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0, "kill -9 {pid}");
    let (took, reason) = c.wait_overlay_state(2, "lost", since, Duration::from_millis(10));
    let ev = c.resource_event_time("offline", 2).map(|t| ms(t - t0)).unwrap_or_else(|| "none".into());
    eprintln!(
        "[{}] kill -9 broker -> lost: seen by polling after {}, offline event after {ev}; reason: {reason}",
        c.name,
        ms(took)
    );
    // Two detectors race for a killed broker: its TCP connection closed by its kernel, and its node's kernel
    // answering probes with "broker dead" (the XDP responder's owner-exit tracepoint, earlier in `do_exit` than
    // the closing of its files). On this machine the connection wins by microseconds; on a slower kernel (the
    // 6.1 VM, emulated) a probe can come first. Either is a right verdict.
    assert!(
        reason.to_lowercase().contains("connection") || reason.contains("broker process exited"),
        "reason should mention the connection or the broker's exit: {reason:?}"
    );

    let rs = c.json(&["resource", "status", "--json"]);
    assert_eq!(rank_entry(&rs, 2)["state"], "lost", "{rs}");
    for r in [0, 1] {
        assert_eq!(rank_entry(&rs, r)["state"], "avail", "{rs}");
    }
    c.vigil(&["run", "-N2", "true"]).ok();
    // Nothing else changed: ranks 0 and 1 still online.
    for r in [0, 1] {
        assert_eq!(c.overlay_rank(r).0, "online");
    }
}

/// `vigil overlay status --json` detectors of rank 0, once background loading is done.
fn detectors(c: &Cluster) -> Value {
    let t = Instant::now();
    loop {
        let d = c.json(&["overlay", "status", "--json"])["detectors"].clone();
        if !d["responder"].as_str().unwrap_or("").contains("loading") || t.elapsed() > VERDICT {
            return d;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn silent_node_loss_is_lost() {
    let c = Cluster::up(3);
    let d = detectors(&c);
    let kernel = d["responder"].as_str().unwrap_or("").starts_with("xdp");
    eprintln!("[{}] detectors: {d}", c.name);
    // As root (CI) the nodes' kernels answer the probes; the verdict must then come from the probe rule.
    if nix_is_root() {
        assert!(kernel, "the XDP responder should run as root: {d}");
        assert!(d["process_exit"].as_str().unwrap_or_default().starts_with("ebpf ("), "{d}");
        assert!(d["tcp"].as_str().unwrap_or_default().starts_with("ebpf ("), "{d}");
    }
    // Let the prober see a few kernel replies from the children.
    std::thread::sleep(Duration::from_millis(300));
    if kernel {
        // Each child's kernel answered a unicast probe, learned its parent, and is now probed by the one
        // multicast datagram per period; the parent's kernel collects the replies.
        let want = "2 children by group datagram, 0 by unicast; replies collected by the kernel (XDP)";
        let t = Instant::now();
        let mut probing = String::new();
        while t.elapsed() < VERDICT {
            probing =
                c.json(&["overlay", "status", "--json"])["detectors"]["probing"].as_str().unwrap_or("").to_string();
            if probing.starts_with(want) {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(probing.starts_with(want), "{probing}");
        // Each node's broker owns its node's detectors: its prober runs real-time, its loop at nice -10, and, as the
        // leader of its session (netns-cluster.sh starts it with setsid), its autogroup too where the kernel has
        // autogroups on (priority.rs).
        let autogroup =
            std::fs::read_to_string("/proc/sys/kernel/sched_autogroup_enabled").is_ok_and(|s| s.trim() == "1");
        let end = if autogroup { "loop at nice -10, autogroup nice -10" } else { "loop at nice -10" };
        assert!(probing.ends_with(&format!("; prober thread real-time (SCHED_RR 1); {end}")), "{probing}");
    }
    let since = Instant::now();
    let t0 = c.kill_node(2);
    let (took, reason) = c.wait_overlay_state(2, "lost", since, Duration::from_millis(10));
    let ev = c.resource_event_time("offline", 2).map(|t| ms(t - t0)).unwrap_or_else(|| "none".into());
    eprintln!(
        "[{}] silent node loss -> lost: seen by polling after {}, offline event after {ev}; reason: {reason}",
        c.name,
        ms(took)
    );
    if kernel {
        assert!(reason.contains("unanswered by its kernel"), "reason should name the missed probes: {reason:?}");
    } else {
        assert!(reason.contains("TCP acknowledgement"), "reason should mention the missing TCP ACK: {reason:?}");
    }
    let rs = c.json(&["resource", "status", "--json"]);
    assert_eq!(rank_entry(&rs, 2)["state"], "lost", "{rs}");
    c.vigil(&["run", "-N2", "true"]).ok();
}

fn nix_is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// The userspace fallback, forced: shown as such, and a silent loss is still found, by the TCP rule.
#[test]
fn forced_userspace_detectors_fall_back_and_still_detect() {
    let c = Cluster::up_with(3, &["--setattr=broker.detectors=userspace"]);
    let d = detectors(&c);
    eprintln!("[{}] detectors: {d}", c.name);
    for k in ["process_exit", "tcp", "responder"] {
        let v = d[k].as_str().unwrap_or("");
        assert!(v.starts_with("userspace (forced by broker.detectors=userspace)"), "{k}: {d}");
    }
    let probes = d["probes"].as_str().unwrap_or("");
    assert!(probes.contains("by unicast") && !probes.contains("multicast"), "no group probes without XDP: {d}");
    let up = c.vigil(&["uptime"]);
    up.ok();
    assert!(up.stdout.contains("responder userspace (forced"), "{}", up.dump());
    std::thread::sleep(Duration::from_millis(300));
    // No kernel answers or collects: every child is probed by unicast, replies come to the prober's socket.
    let probing = c.json(&["overlay", "status", "--json"])["detectors"]["probing"].as_str().unwrap_or("").to_string();
    let want = "0 children by group datagram, 2 by unicast; replies received on the prober's socket; prober thread ";
    assert!(probing.starts_with(want), "{probing}");
    let since = Instant::now();
    c.kill_node(2);
    let (took, reason) = c.wait_overlay_state(2, "lost", since, Duration::from_millis(10));
    eprintln!("[{}] userspace: silent node loss -> lost after {}; reason: {reason}", c.name, ms(took));
    assert!(reason.contains("TCP acknowledgement"), "{reason:?}");
}

#[test]
fn stalled_broker_is_torpid_never_lost() {
    let c = Cluster::up(3);
    // As on a cluster, the detectors are loaded (they load in the background after start-up) and the parent's
    // prober has heard the child's kernel: the stall is then seen from the heartbeat age the node reports.
    let kernel = detectors(&c)["responder"].as_str().unwrap_or("").starts_with("xdp");
    std::thread::sleep(Duration::from_millis(300));
    let t_stall = now_s();
    let since = Instant::now();
    c.script(&["stall", &c.name, "2"]).ok();

    // One thread watches rank 2 every 50 ms for 4 s while the main thread checks scheduling.
    let (seen, n_polls, id3) = std::thread::scope(|s| {
        let watcher = s.spawn(|| {
            let mut seen: Vec<(f64, String, String)> = Vec::new();
            let mut n = 0;
            while since.elapsed() < Duration::from_secs(4) {
                let (st, reason) = c.overlay_rank(2);
                n += 1;
                if seen.last().map(|l| l.1 != st).unwrap_or(true) {
                    seen.push((since.elapsed().as_secs_f64(), st, reason));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            (seen, n)
        });

        let (took, reason) = c.wait_overlay_state(2, "torpid", since, Duration::from_millis(20));
        eprintln!("[{}] stall -> torpid seen by polling after {}; reason: {reason}", c.name, ms(took));
        // The node's kernel reports the stall (the heartbeat age its probe replies carry, tbon.stall_max); a
        // parent that itself runs late (a loaded machine: every test beside this one) may reach the silence rule
        // (tbon.torpid_max) first. Either is torpid, and torpid only.
        let rule = if reason.contains("tbon.stall_max") { "stall_max" } else { "torpid_max" };
        assert!(reason.contains("tbon.stall_max") || reason.contains("tbon.torpid_max"), "a torpid reason: {reason}");
        eprintln!("[{}] torpid by the {rule} rule (kernel responder: {kernel})", c.name);
        let rs = c.json(&["resource", "status", "--json"]);
        assert_eq!(rank_entry(&rs, 2)["state"], "torpid", "{rs}");
        let text = c.vigil(&["resource", "status"]);
        text.ok();
        assert!(
            text.stdout.lines().any(|l| l.trim_start().starts_with("torpid") && l.contains("node2")),
            "{}",
            text.dump()
        );

        // The survivors still run work, and nothing new goes to the torpid rank.
        c.vigil(&["run", "-N2", "true"]).ok();
        let jobs = c.json(&["jobs", "-a", "--json"]);
        let n2 = jobs["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|j| j["nnodes"] == 2)
            .cloned()
            .unwrap_or_else(|| panic!("{jobs}"));
        assert_eq!(n2["ranks"], "0-1", "the -N2 job used the torpid rank: {n2}");
        // Strict FCFS (docs/architecture.md): a blocked -N3 at the head of the queue would hold back the -N2,
        // so the -N3 is submitted after the -N2 ran.
        let id3 = c.submit(&["-N3", "true"]);
        for _ in 0..10 {
            std::thread::sleep(Duration::from_millis(100));
            assert_eq!(c.job(&id3)["state"], "SCHED", "a -N3 job started while rank 2 is torpid");
        }
        assert_eq!(c.overlay_rank(2).0, "torpid", "rank 2 stopped being torpid while still stopped");
        let (seen, n) = watcher.join().expect("watcher");
        (seen, n, id3)
    });
    eprintln!("[{}] rank 2 over {n_polls} polls in 4 s of SIGSTOP: {seen:?}", c.name);
    assert!(seen.iter().any(|s| s.1 == "torpid"), "never torpid: {seen:?}");
    assert!(seen.iter().all(|s| s.1 != "lost"), "a stalled broker was declared lost: {seen:?}");
    assert_eq!(c.job(&id3)["state"], "SCHED");

    let t_cont = now_s();
    let since = Instant::now();
    c.script(&["cont", &c.name, "2"]).ok();
    let (took, _) = c.wait_overlay_state(2, "online", since, Duration::from_millis(20));
    eprintln!("[{}] cont -> online seen by polling after {}", c.name, ms(took));
    let text = c.vigil(&["overlay", "status"]);
    text.ok();
    assert!(text.stdout.lines().any(|l| l.contains("2 node2: full")), "{}", text.dump());
    let w = c.vigil(&["job", "wait", &id3]);
    w.ok();
    assert_eq!(c.job(&id3)["ranks"], "0-2");

    let log = c.resource_eventlog();
    let for2 = |name: &str| {
        log.iter().position(|e| e["name"] == name && idset_has(e["context"]["idset"].as_str().unwrap_or(""), 2))
    };
    let (torpid, lively) =
        (for2("torpid").expect("torpid event for rank 2"), for2("lively").expect("lively event for rank 2"));
    assert!(torpid < lively, "torpid must precede lively: {log:?}");
    assert!(for2("offline").is_none(), "rank 2 went offline: {log:?}");
    let ts = |i: usize| log[i]["timestamp"].as_f64().unwrap_or(0.0);
    eprintln!(
        "[{}] eventlog: stall -> torpid event {}, cont -> lively event {}",
        c.name,
        ms(ts(torpid) - t_stall),
        ms(ts(lively) - t_cont)
    );
}

// ------------------------------------------------------------------------------------------- exec rules

/// What a failed assertion about a batch job shows: `vigil job wait`'s output, the script's output, the eventlog.
fn job_context(w: &Output, out: &str, log: &[Value]) -> String {
    let events = log.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("\n");
    format!("{}\n--- out ---\n{out}\n--- eventlog ---\n{events}", w.dump())
}

/// The exception events of a job eventlog.
fn exceptions(log: &[Value]) -> Vec<&Value> {
    log.iter().filter(|e| e["name"] == "exception").collect()
}

/// An ordinary job, followed by `vigil run` and `vigil job wait`, loses node3: both exit with the lost-node code
/// and print the exception that ended it, which names the node once, as its host name and rank in this instance,
/// with the task that ran there, and without "critical" (issue 36).
#[test]
fn ordinary_job_loses_a_node() {
    let c = Cluster::up(4);
    let (run, w, id, t0) = std::thread::scope(|s| {
        let run = s.spawn(|| c.vigil_in(c.path(), &[], &["run", "-N4", "-n4", "sleep", "60"], JOB_END));
        let has_sleep = |k: u32| c.node_processes(k).iter().any(|(_, cl)| cl == "sleep 60");
        let started = wait_for(Duration::from_secs(20), || (0..4).all(has_sleep));
        let jobs = c.json(&["jobs", "--json"]);
        let id = jobs["jobs"][0]["id_f58"].as_str().unwrap_or_default().to_string();
        if !started || id.is_empty() {
            c.vigil(&["cancel", &id]);
            panic!("the job's tasks did not start on every node: {jobs}\n{}", run.join().unwrap().dump());
        }
        let t0 = c.kill_node(3);
        let w = c.vigil_in(c.path(), &[], &["job", "wait", &id], JOB_END);
        (run.join().unwrap(), w, id, t0)
    });
    let has_sleep = |k: u32| c.node_processes(k).iter().any(|(_, cl)| cl == "sleep 60");
    assert!(!w.timed_out && !run.timed_out, "job wait or run hung:\n{}\n{}", w.dump(), run.dump());
    assert_eq!(w.code, 69, "job wait after losing a node: the lost-node exit code\n{}", w.dump());
    assert_eq!(run.code, 69, "vigil run after losing a node: the lost-node exit code\n{}", run.dump());
    let told = format!(
        "vigil: job {id}: exception type=node-failure severity=0: lost node node3 (rank 3), where task 3 ran\n"
    );
    for o in [&run, &w] {
        assert!(o.stderr.contains(&told), "{told:?} expected:\n{}", o.dump());
        assert!(!o.stderr.contains("critical"), "{}", o.dump());
    }
    let j = c.job(&id);
    assert_eq!(j["state"], "INACTIVE", "{j}");
    eprintln!(
        "[{}] job inactive {} after the kill (job wait exit {})",
        c.name,
        ms(j["t_inactive"].as_f64().unwrap_or(0.0) - t0),
        w.code
    );

    let log = c.job_eventlog(&id);
    let ex = exceptions(&log);
    assert!(!ex.is_empty(), "no exception: {log:?}");
    let ctx = &ex[0]["context"];
    assert_eq!(ctx["type"], "node-failure", "{log:?}");
    assert_eq!(ctx["severity"], 0, "{log:?}");
    assert!(ctx["note"].as_str().unwrap_or("").contains("node3"), "{log:?}");
    eprintln!(
        "[{}] exec exception {} after the kill: {}",
        c.name,
        ms(ex[0]["timestamp"].as_f64().unwrap_or(0.0) - t0),
        ctx["note"]
    );

    let clean = || (0..3).all(|k| !has_sleep(k));
    assert!(
        wait_for(Duration::from_secs(5), clean),
        "tasks left on the survivors: {:?}",
        (0..3).map(|k| c.node_leftovers(k)).collect::<Vec<_>>()
    );
    for k in 0..3 {
        assert!(c.node_leftovers(k).is_empty(), "node{k} still runs: {:?}", c.node_leftovers(k));
    }
}

// ----------------------------------------------------------------- N+1 checkpoint/restart (examples/ckpt)

/// Steps of `examples/ckpt/app.sh` in these tests, one every [`STEP_S`] seconds.
const STEPS: u32 = 16;
const STEP_S: &str = "0.25";
/// Application ranks. The batch job takes node1-6 of a 7-node cluster (node0 is drained, a login node): node1 runs
/// `batch.sh` (it is the batch instance's rank 0), application rank r runs on node r+2, and node6 is the spare.
const RANKS: u32 = 4;
const SPARE: u32 = 6;
/// Every rank has a complete checkpoint at this step or later before a node is killed.
const MIN_STEP: u32 = 3;

/// A running `examples/ckpt` batch job.
struct Ckpt {
    c: Cluster,
    id: String,
    /// `CKPT_ROOT`: the links to each node's storage and each rank's `complete.RANK` record.
    root: PathBuf,
    /// Where the batch job was submitted (its output file).
    work: PathBuf,
}

impl Ckpt {
    /// `vigil batch -N6 BATCH_ARGS batch.sh app.sh STEPS` on a fresh 7-node cluster, returned once every rank has a
    /// complete checkpoint at step [`MIN_STEP`] or later.
    #[track_caller]
    fn start(batch_args: &[&str]) -> Ckpt {
        Ckpt::start_steps(batch_args, STEPS)
    }

    /// [`Ckpt::start`] with `steps` steps of app.sh instead of [`STEPS`].
    #[track_caller]
    fn start_steps(batch_args: &[&str], steps: u32) -> Ckpt {
        let k = Ckpt::submit(batch_args, steps);
        let since = Instant::now();
        // Generous: a loaded machine (CI running other netns clusters beside this one) has taken 25 s for 2 steps.
        let ready = wait_for(Duration::from_secs(180), || {
            k.complete().values().filter(|s| **s >= MIN_STEP).count() == RANKS as usize
        });
        assert!(ready, "the {RANKS} ranks did not reach step {MIN_STEP}: {:?}\n{}", k.complete(), k.output());
        eprintln!(
            "[{}] batch job {}: every rank at step >= {MIN_STEP} after {:.2}s",
            k.c.name,
            k.id,
            since.elapsed().as_secs_f64()
        );
        k
    }

    /// The batch job of [`Ckpt::start_steps`], returned as soon as it is submitted.
    #[track_caller]
    fn submit(batch_args: &[&str], steps: u32) -> Ckpt {
        let c = Cluster::up(7);
        c.vigil(&["resource", "drain", "0", "login"]).ok();
        let (root, work) = (c.path().join("ckpt"), c.path().join("work"));
        for d in [&root, &work] {
            std::fs::create_dir_all(d).unwrap();
        }
        let ex = repo_root().join("examples/ckpt");
        let (batch, app, steps) = (ex.join("batch.sh"), ex.join("app.sh"), steps.to_string());
        let script = [batch.to_str().unwrap(), app.to_str().unwrap(), &steps];
        let args = [&["batch", "-N6"], batch_args, &script].concat();
        let o = c.vigil_in(&work, &[("CKPT_ROOT", root.to_str().unwrap()), ("STEP_S", STEP_S)], &args, CMD_TIMEOUT);
        o.ok();
        let id = o.stdout.trim().to_string();
        assert!(id.starts_with('f'), "{}", o.dump());
        Ckpt { c, id, root, work }
    }

    fn output(&self) -> String {
        std::fs::read_to_string(self.work.join(format!("vigil-{}.out", self.id))).unwrap_or_default()
    }

    /// Each rank's last complete checkpoint, as app.sh records it (`CKPT_ROOT/complete.RANK`).
    fn complete(&self) -> BTreeMap<u32, u32> {
        let step = |r: u32| std::fs::read_to_string(self.root.join(format!("complete.{r}"))).ok()?.trim().parse().ok();
        (0..RANKS).filter_map(|r| Some((r, step(r)?))).collect()
    }
}

/// One launch of the application by `batch.sh`, from the job's output.
#[derive(Default, Debug)]
struct Launch {
    /// Rank -> (node, step it resumed from, its last complete checkpoint then, time of the line).
    resumed: BTreeMap<u32, (String, u32, u32, f64)>,
    /// Ranks that completed every step.
    completed: BTreeSet<u32>,
    /// Time of its end and exit code.
    ended: Option<(f64, i32)>,
}

/// Seconds since the Unix epoch of the RFC 3339 UTC time that starts each line of batch.sh and app.sh
/// (`2026-12-06T21:55:43.123456Z`).
fn iso_secs(s: &str) -> Option<f64> {
    let t = humantime::parse_rfc3339(s).ok()?;
    Some(t.duration_since(std::time::UNIX_EPOCH).ok()?.as_secs_f64())
}

/// The launches in `batch.sh`'s output, in order (lines "TIME launch K: ...", "TIME rank R on NODE: resuming from
/// step S (last complete checkpoint: step C)", "TIME rank R on NODE: completed N steps", "TIME launch K ended with
/// exit code X").
fn launches(out: &str) -> Vec<Launch> {
    let mut v: Vec<Launch> = Vec::new();
    for l in out.lines() {
        let Some((t, rest)) = l.split_once(' ').and_then(|(t, r)| Some((iso_secs(t)?, r))) else { continue };
        if rest.starts_with("launch ") && rest.contains(": ranks ") {
            v.push(Launch::default());
        }
        let Some(cur) = v.last_mut() else { continue };
        if let Some((_, code)) = rest.split_once(" ended with exit code ") {
            cur.ended = code.trim().parse().ok().map(|c| (t, c));
        } else if let Some(r) = rest.strip_prefix("rank ") {
            let w: Vec<&str> = r.split_whitespace().collect();
            let (Some(rank), Some(node)) = (w.first().and_then(|s| s.parse().ok()), w.get(2)) else { continue };
            let node = node.trim_end_matches(':').to_string();
            let num = |i: usize| w.get(i).and_then(|s| s.trim_end_matches(')').parse().ok()).unwrap_or(u32::MAX);
            if r.contains(": resuming from step ") {
                cur.resumed.insert(rank, (node, num(6), num(11), t));
            } else if r.ends_with(&format!(": completed {STEPS} steps")) {
                cur.completed.insert(rank);
            }
        }
    }
    v
}

/// How one N+1 case ended.
struct Ended {
    /// The job and its cluster, torn down when this is dropped, after the case's own assertions.
    _k: Ckpt,
    /// `vigil job wait`'s exit code: the batch job's.
    code: i32,
    /// The job in `vigil jobs -a --json`.
    job: Value,
    launches: Vec<Launch>,
    out: String,
    /// What to print on a failed assertion.
    ctx: String,
}

/// The N+1 example (`vigil batch` arguments `batch_args`) with nodes `kills` silently killed in turn, the first
/// once every rank has a complete checkpoint at step [`MIN_STEP`], each next once the parent raised the previous
/// one's exception; then waited for. Checks what holds in every case:
/// - the parent raised one non-fatal (severity 2) `node-failure` exception per killed node, naming it;
/// - the first launch put rank r on node r+2, from step 0;
/// - if a killed node ran a rank, the script got control: the first launch ended after the kill, with a non-zero
///   exit code;
/// - every rank of every relaunch resumed from the same step, the newest checkpoint complete on every rank (the
///   smallest of their last complete checkpoints), at step [`MIN_STEP`] or later; no rank was more than one step
///   ahead of it (app.sh's barrier);
/// - the job is INACTIVE, and if it exited 0, its result is COMPLETED and every rank of its last launch completed.
#[track_caller]
fn n_plus_one(batch_args: &[&str], kills: &[u32]) -> Ended {
    let k = Ckpt::start(batch_args);
    let c = &k.c;
    let mut t_kill = 0.0;
    for (i, node) in kills.iter().enumerate() {
        if i > 0 {
            let told = wait_for(VERDICT, || exceptions(&c.job_eventlog(&k.id)).len() >= i);
            assert!(told, "no exception for node{} within {VERDICT:?}: {:?}", kills[i - 1], c.job_eventlog(&k.id));
        }
        t_kill = c.kill_node(*node);
    }
    let w = c.vigil_in(c.path(), &[], &["job", "wait", &k.id], 4 * JOB_END);
    let out = k.output();
    let log = c.job_eventlog(&k.id);
    let ctx = format!(
        "{}\n--- vigil-{}.out ---\n{out}\n--- eventlog ---\n{}",
        w.dump(),
        k.id,
        log.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("\n")
    );
    assert!(!w.timed_out, "the batch job did not end:\n{ctx}");
    let job = c.job(&k.id);
    assert_eq!(job["state"], "INACTIVE", "{ctx}");
    let ex = exceptions(&log);
    assert_eq!(ex.len(), kills.len(), "one exception per lost node:\n{ctx}");
    for (e, node) in ex.iter().zip(kills) {
        let e = &e["context"];
        assert!(e["type"] == "node-failure" && e["severity"] == 2, "a non-fatal node-failure expected: {e}\n{ctx}");
        assert!(e["note"].as_str().unwrap_or("").contains(&format!("node{node}")), "{e}\n{ctx}");
    }

    let launches = launches(&out);
    let first: BTreeMap<u32, (String, u32)> =
        launches.first().map(|l| l.resumed.iter().map(|(r, v)| (*r, (v.0.clone(), v.1))).collect()).unwrap_or_default();
    let want: BTreeMap<u32, (String, u32)> = (0..RANKS).map(|r| (r, (format!("node{}", r + 2), 0))).collect();
    assert_eq!(first, want, "launch 1: (node, step) of each rank:\n{ctx}");
    if kills.iter().any(|n| (2..2 + RANKS).contains(n)) {
        let (t_end, rc) = launches[0].ended.unwrap_or_else(|| panic!("launch 1 did not end:\n{ctx}"));
        assert!(
            rc != 0 && t_end > t_kill,
            "no control after the kill at {t_kill:.3}: launch 1 ended at {t_end:.3} with exit code {rc}\n{ctx}"
        );
    }
    for (i, l) in launches.iter().enumerate().skip(1) {
        assert_eq!(l.resumed.len(), RANKS as usize, "launch {}: not every rank started:\n{ctx}", i + 1);
        let common = l.resumed.values().map(|v| v.2).min().unwrap_or(0);
        for (r, (node, step, last, _)) in &l.resumed {
            assert!(
                common >= MIN_STEP && *step == common && *last <= common + 1,
                "launch {}: rank {r} on {node} resumed from step {step} (its last complete checkpoint: step {last}), \
                 not from step {common}, the newest checkpoint complete on every rank\n{ctx}",
                i + 1
            );
        }
    }
    if w.code == 0 {
        assert_eq!(job["result"], "COMPLETED", "{ctx}");
        let last = launches.last().map(|l| l.completed.clone()).unwrap_or_default();
        assert_eq!(last, (0..RANKS).collect(), "ranks that completed every step in the last launch:\n{ctx}");
    }
    if let (Some(l1), Some(l2)) = (launches.first(), launches.get(1)) {
        let resumed = l2.resumed.values().map(|v| v.3).fold(0.0, f64::max);
        eprintln!(
            "[{}] node{} killed: launch 1 ended +{}, every rank resumed +{} after the kill",
            c.name,
            kills.last().unwrap_or(&0),
            l1.ended.map_or("never".into(), |(t, _)| ms(t - t_kill)),
            ms(resumed - t_kill)
        );
    }
    let code = w.code;
    Ended { _k: k, code, job, launches, out, ctx }
}

/// The node of application rank `rank` dies: the script rebuilds the rank's checkpoint on the spare from its
/// partner copy (on the node of rank+1 mod N), relaunches every other rank on its own node, and the job completes.
#[track_caller]
fn n_plus_one_loses_rank(batch_args: &[&str], rank: u32) {
    let e = n_plus_one(batch_args, &[rank + 2]);
    let ctx = &e.ctx;
    assert_eq!((e.code, e.launches.len()), (0, 2), "exit code 0 after one relaunch expected:\n{ctx}");
    let partner = (rank + 1) % RANKS + 2;
    let rebuilt = e.out.lines().find(|l| l.contains(&format!("rebuilt rank {rank}'s checkpoint")));
    let want = format!("on node{SPARE} from its partner copy on node{partner}");
    assert!(rebuilt.is_some_and(|l| l.ends_with(&want)), "rank {rank} not rebuilt {want}:\n{ctx}");
    let placed: BTreeMap<u32, String> = e.launches[1].resumed.iter().map(|(r, v)| (*r, v.0.clone())).collect();
    let want: BTreeMap<u32, String> =
        (0..RANKS).map(|r| (r, format!("node{}", if r == rank { SPARE } else { r + 2 }))).collect();
    assert_eq!(placed, want, "launch 2: each rank with its checkpoint:\n{ctx}");
}

#[test]
fn n_plus_one_loses_the_first_rank() {
    n_plus_one_loses_rank(&[], 0);
}

#[test]
fn n_plus_one_loses_a_middle_rank() {
    n_plus_one_loses_rank(&[], 1);
}

#[test]
fn n_plus_one_loses_the_last_rank() {
    n_plus_one_loses_rank(&[], RANKS - 1);
}

/// With `kary:2` the batch instance's rank 1 (node2, application rank 0) routes for its ranks 3 and 4 (node4 and
/// node5, application ranks 2 and 3): they re-parent and keep their checkpoints while rank 0 moves to the spare.
#[test]
fn n_plus_one_loses_a_router_of_the_batch_instance() {
    n_plus_one_loses_rank(&["-S", "tbon.topo=kary:2"], 0);
}

/// The batch instance's router (rank 1, node2) dies under a launch whose tasks would run for a minute more, with
/// `exec.kill-timeout=30s` in the batch instance: the fatal exception's SIGTERM to the shells behind the router
/// (ranks 3 and 4) cannot go through it, and goes once they have re-parented (jobs/kills.rs). So the launch ends
/// before the kill timeout: by the tasks' own end or by SIGKILL it would have taken a minute or 30 s.
#[test]
fn n_plus_one_launch_behind_a_lost_router_ends_before_the_kill_timeout() {
    const KILL_TIMEOUT: f64 = 30.0;
    // 300 steps of 0.25 s: launch 1 would run for more than a minute after the kill.
    let k = Ckpt::start_steps(&["-S", "tbon.topo=kary:2", "-S", "exec.kill-timeout=30s"], 300);
    let c = &k.c;
    let t_kill = c.kill_node(2);
    let ended = || launches(&k.output()).first().and_then(|l| l.ended);
    wait_for(Duration::from_secs_f64(2.0 * KILL_TIMEOUT), || ended().is_some());
    let log = c.job_eventlog(&k.id);
    let ctx = || format!("--- output ---\n{}\n--- eventlog ---\n{log:?}", k.output());
    let (t_end, rc) = ended().unwrap_or_else(|| panic!("launch 1 did not end:\n{}", ctx()));
    eprintln!(
        "[{}] node2 (router) killed: launch 1 ended +{} after the kill, exit code {rc}",
        c.name,
        ms(t_end - t_kill)
    );
    assert!(rc != 0, "launch 1 lost a node, yet exited 0:\n{}", ctx());
    assert!(
        t_end - t_kill < KILL_TIMEOUT,
        "launch 1 ended {:.1} s after the kill: not before the kill timeout of {KILL_TIMEOUT} s\n{}",
        t_end - t_kill,
        ctx()
    );
    // The relaunch is not waited for (a minute more): the job is cancelled.
    c.vigil(&["cancel", &k.id]).ok();
}

/// The spare dies: the application never ran there, so launch 1 goes on to the end, with no relaunch.
#[test]
fn n_plus_one_losing_the_spare_changes_nothing() {
    let e = n_plus_one(&[], &[SPARE]);
    let ended = e.launches.iter().map(|l| l.ended.map(|(_, c)| c)).collect::<Vec<_>>();
    assert_eq!((e.code, ended), (0, vec![Some(0)]), "one launch, exit code 0, expected:\n{}", e.ctx);
}

/// The spare dies, then the node of rank 1: no spare is left, and the script gives up with its own exit code, 75.
#[test]
fn n_plus_one_gives_up_without_a_spare() {
    let e = n_plus_one(&[], &[SPARE, 3]);
    assert_eq!((e.code, e.launches.len()), (75, 1), "batch.sh's exit code 75 after one launch expected:\n{}", e.ctx);
    assert_eq!(e.job["result"], "FAILED", "{}", e.ctx);
    assert!(e.out.contains("rank 1 lost its node node3 and no spare is left: giving up"), "{}", e.ctx);
}

/// A node dies while batch.sh sets up the nodes' storage (its first step, a `vigil run` on every node but its own):
/// the script leaves the node out, sets the storage up again on the rest, and runs the ranks there (the spare takes
/// the place of the lost node, in node order); the job completes with one non-fatal exception.
#[test]
fn n_plus_one_loses_a_node_while_setting_up_storage() {
    let k = Ckpt::submit(&[], STEPS);
    let c = &k.c;
    let setting_up = wait_for(Duration::from_secs(60), || k.output().contains(" setting up storage on "));
    assert!(setting_up, "batch.sh did not start setting up storage:\n{}", k.output());
    let t_kill = c.kill_node(3);
    let w = c.vigil_in(c.path(), &[], &["job", "wait", &k.id], 4 * JOB_END);
    let out = k.output();
    let log = c.job_eventlog(&k.id);
    let ctx = format!("{}\n--- output ---\n{out}\n--- eventlog ---\n{log:?}", w.dump());
    let set_up = out.lines().filter(|l| l.contains(" setting up storage on ")).count();
    eprintln!("[{}] node3 killed at {t_kill:.3}: storage set up {set_up} times", c.name);
    assert!(out.contains(" lost while setting up storage: node3"), "the loss missed the set-up step:\n{ctx}");
    assert_eq!(w.code, 0, "{ctx}");
    let ex = exceptions(&log);
    assert!(
        ex.len() == 1 && ex[0]["context"]["severity"] == 2 && ex[0]["context"]["type"] == "node-failure",
        "one non-fatal node-failure expected:\n{ctx}"
    );
    let l = launches(&out);
    let placed: BTreeMap<u32, String> = l[0].resumed.iter().map(|(r, v)| (*r, v.0.clone())).collect();
    let want: BTreeMap<u32, String> =
        [2, 4, 5, 6].iter().enumerate().map(|(r, n)| (r as u32, format!("node{n}"))).collect();
    assert_eq!((l.len(), placed), (1, want), "one launch on the nodes left:\n{ctx}");
    assert_eq!(l[0].completed, (0..RANKS).collect(), "{ctx}");
}

/// A host-file task map (`--taskmap=hostfile:FILE`, what batch.sh relaunches with) that names a node the job could
/// never run on is refused naming the file's line: a node its own -x/-w leave out; inside a batch job, a node the
/// batch instance lost (it never gets it back: before, the job waited for it forever). In the system instance a
/// lost node may come back: the job is accepted, with a warning naming the node.
#[test]
fn a_hostfile_naming_a_lost_or_excluded_node_is_refused_with_its_line() {
    let c = Cluster::up(5);
    c.vigil(&["resource", "drain", "0", "login"]).ok();
    let dir = c.path();
    let file = |name: &str, hosts: &[&str]| {
        let p = dir.join(name);
        std::fs::write(&p, hosts.iter().map(|h| format!("{h}\n")).collect::<String>()).unwrap();
        format!("--taskmap=hostfile:{}", p.display())
    };
    let (h23, h24) = (file("h23", &["node2", "node3"]), file("h24", &["node2", "node4"]));
    let o = c.vigil(&["run", "-N2", "-n2", "-x", "node3", &h23, "true"]);
    assert!(
        o.code == 1
            && o.stderr.contains(&format!(
                "{h23}: line 2: node3: the job's node selection (-x node3) leaves it out, and every host of the file \
                 is a node of the job"
            )),
        "{}",
        o.dump()
    );
    let o = c.vigil(&["run", "-N2", "-n2", "-w", "node[1-2]", &h23, "true"]);
    assert!(o.code == 1 && o.stderr.contains("line 2: node3: the job's node selection (-w node[1-2])"), "{}", o.dump());

    // A batch job on node1-4 whose script, once told and once its instance too has node4 lost, relaunches on node2
    // and node4.
    let go = dir.join("go");
    let script = dir.join("relaunch.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\necho ready\nwhile [ ! -e {go} ]; do sleep 0.05; done\nuntil vigil resource status -s lost -no \
             '{{nodelist}}' | grep -q node4; do sleep 0.05; done\nvigil run -N2 -n2 {h24} hostname\necho rc=$?\n",
            go = go.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let out = dir.join("relaunch.out");
    let o = c.vigil(&["batch", "-N4", &format!("--output={}", out.display()), script.to_str().unwrap()]);
    let id = o.ok().stdout.trim().to_string();
    let text = || std::fs::read_to_string(&out).unwrap_or_default();
    assert!(wait_for(Duration::from_secs(60), || text().contains("ready")), "{}", text());
    c.kill_node(4);
    let told = wait_for(VERDICT, || !exceptions(&c.job_eventlog(&id)).is_empty());
    assert!(told, "no exception for node4: {:?}", c.job_eventlog(&id));
    std::fs::write(&go, "").unwrap();
    let w = c.vigil_in(dir, &[], &["job", "wait", &id], JOB_END);
    let ctx = format!("{}\n--- output ---\n{}\n--- eventlog ---\n{:?}", w.dump(), text(), c.job_eventlog(&id));
    assert!(text().contains("rc=1"), "the relaunch naming a lost node was not refused:\n{ctx}");
    assert!(
        text().contains(&format!("{h24}: line 2: node4 (lost: "))
            && text().contains("this instance is a job's (a batch or alloc job) and never gets a lost node back"),
        "{ctx}"
    );

    // The system instance lost node4 too: a job naming it is accepted (it may come back), with a warning.
    let o = c.vigil(&["submit", "-N2", "-n2", &h24, "true"]);
    assert!(
        o.code == 0
            && o.stderr.contains(&format!("{h24}: line 2: node4 is lost: "))
            && o.stderr.contains("the job waits until it is back"),
        "{}",
        o.dump()
    );
    c.vigil(&["cancel", o.stdout.trim()]).ok();
}

/// app.sh's own check: a rank whose node does not hold the checkpoint every rank resumes from fails (exit 3), as when
/// a relaunch puts it away from its data. Here the second job has an allocation directory of its own, so no
/// checkpoint. (tests/example_ckpt.rs tries app.sh's rules without an instance.)
#[test]
fn n_plus_one_app_refuses_to_resume_without_its_checkpoint() {
    let c = Cluster::up(2);
    let root = c.path().join("ckpt");
    for node in ["node0", "node1"] {
        std::fs::create_dir_all(root.join(format!("node.{node}"))).unwrap();
    }
    let app = repo_root().join("examples/ckpt/app.sh");
    let env = [("CKPT_ROOT", root.to_str().unwrap()), ("CKPT_HOSTS", "node0 node1"), ("STEP_S", "0.05")];
    let run = |steps: &str| c.vigil_in(c.path(), &env, &["run", "-N2", "-n2", app.to_str().unwrap(), steps], JOB_END);
    let o = run("2");
    assert!(o.code == 0 && o.stdout.contains("rank 1 on node1: completed 2 steps"), "{}", o.dump());
    let o = run("4");
    assert_eq!(o.code, 3, "{}", o.dump());
    assert!(
        o.stderr
            .contains("rank 0 on node0: ERROR: no checkpoint of step 2 on this node, the newest checkpoint complete"),
        "{}",
        o.dump()
    );
}

/// The batch host dies (node1, the batch instance's rank 0, where `batch.sh` runs): that is fatal to the job, and
/// nothing of it remains on the other nodes.
#[test]
fn critical_rank_loss_is_fatal() {
    let k = Ckpt::start(&[]);
    let c = &k.c;
    let t_kill = c.kill_node(1);
    let w = c.vigil_in(c.path(), &[], &["job", "wait", &k.id], JOB_END);
    let log = c.job_eventlog(&k.id);
    let ctx = format!(
        "{}\n--- vigil-{}.out ---\n{}\n--- eventlog ---\n{}",
        w.dump(),
        k.id,
        k.output(),
        log.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("\n")
    );
    assert!(!w.timed_out, "job wait hung:\n{ctx}");
    assert_eq!(w.code, 69, "the lost-node exit code: {ctx}");
    let j = c.job(&k.id);
    assert_eq!(j["state"], "INACTIVE", "{ctx}");
    let ex = exceptions(&log);
    assert!(!ex.is_empty(), "{ctx}");
    assert_eq!(ex[0]["context"]["type"], "node-failure", "{ctx}");
    assert_eq!(ex[0]["context"]["severity"], 0, "{ctx}");
    // Named once, with what ran there, in plain words, by `vigil job wait` too (issue 36).
    let note = "lost node node1 (rank 1), where rank 0 of the job's instance ran; the job's instance cannot go on \
                without it";
    assert_eq!(ex[0]["context"]["note"], note, "{ctx}");
    assert!(w.stderr.contains(&format!("exception type=node-failure severity=0: {note}\n")), "{ctx}");
    eprintln!(
        "[{}] the batch host lost: node-failure exception +{}, job inactive +{} after the kill (job wait exit {})",
        c.name,
        ms(ex[0]["timestamp"].as_f64().unwrap_or(0.0) - t_kill),
        ms(j["t_inactive"].as_f64().unwrap_or(0.0) - t_kill),
        w.code
    );

    // Nothing of the job (child brokers, shells, app, its sleeps) remains on the other nodes.
    let others = [0u32, 2, 3, 4, 5, 6];
    let since = Instant::now();
    let clean = wait_for(Duration::from_secs(10), || others.iter().all(|k| c.node_leftovers(*k).is_empty()));
    let left: Vec<_> = others.iter().map(|k| (*k, c.node_leftovers(*k))).filter(|(_, l)| !l.is_empty()).collect();
    assert!(clean, "processes left after the job ended: {left:?}\n{ctx}");
    eprintln!("[{}] survivors clean {} after the job ended", c.name, ms(since.elapsed().as_secs_f64()));
    // The parent keeps working on the survivors.
    c.vigil(&["run", "-N4", "true"]).ok();
}

#[test]
fn nested_instance_keeps_scheduling_on_survivors() {
    // Flat child (kary:32 on 4 brokers): node4 holds its leaf rank 3.
    batch_loses_a_node(&[], 4, 3);
}

/// A batch job whose child keeps a tree (`kary:2`: child rank 1, on node2, routes for child rank 3 on node4)
/// loses the router's node: only child rank 1 is lost, rank 3 re-parents under rank 2, the job gets one
/// severity-2 exception and runs a new job on every survivor.
#[test]
fn nested_instance_with_a_tree_survives_its_router_node_lost() {
    batch_loses_a_node(&["-S", "tbon.topo=kary:2"], 2, 1);
}

/// How much later than the enclosing instance's verdict a nested instance may judge the same node lost when it
/// learns it from the enclosing instance (measured: a few milliseconds; a loaded 2-core machine delays a turn by
/// tens). Its own detectors are slowed to about 10 s in the test, so this bounds the source, not the speed.
const FROM_ENCLOSING: f64 = 1.0;

/// Issue 38, item 4: a batch job's instance learns a lost node from the enclosing instance in the same notice, not
/// only from its own detectors. Its brokers' own detectors are slowed down (`tbon.lost_timeout=10s`,
/// `tbon.probe_misses=1000`: about 10 s to judge a silent node), so only the enclosing instance's verdict can be
/// quick. First the enclosing broker on node4 is stopped: torpid there, which must change nothing inside (the
/// node's broker of the nested instance lives, and only a lost verdict counts). Then node4 dies silently: the
/// nested instance's rank 0 (following its job's eventlog in the enclosing instance) judges its rank 3 lost within
/// [`FROM_ENCLOSING`] of the enclosing instance's `node-failure`, its overlay naming the source, no other rank
/// lost; the batch script's `vigil run -N3` then runs on the three survivors.
#[test]
fn a_nested_instance_learns_a_lost_node_from_the_enclosing_instance() {
    if !nix_is_root() {
        eprintln!("SKIPPED: network-namespace nodes need root");
        return;
    }
    let c = Cluster::up(5);
    let slow = ["-S", "tbon.lost_timeout=10s", "-S", "tbon.probe_misses=1000"];
    let GatedBatch { id, gate, out_path, child_uri } = gated_batch(&c, &slow, "exit $rc\n");
    // Child rank 3 (flat kary:32 over nodes 1-4) is on node4, the enclosing instance's rank 4.
    let child = |rank: u32| {
        let o = vigil_at(c.path(), &child_uri, &["overlay", "status", "--json"], CMD_TIMEOUT);
        o.ok();
        let v = o.json();
        (rank_entry(&v, rank), v)
    };
    assert_eq!(child(3).0["hostname"], "node4", "{}", child(3).1);

    // Torpid in the enclosing instance is not lost: the nested instance keeps its rank 3.
    let since = Instant::now();
    c.script(&["stall", &c.name, "4"]).ok();
    let (took, reason) = c.wait_overlay_state(4, "torpid", since, Duration::from_millis(20));
    eprintln!("[{}] enclosing broker on node4 stopped: torpid after {} ({reason})", c.name, ms(took));
    std::thread::sleep(Duration::from_millis(1000));
    let (e3, all) = child(3);
    c.script(&["cont", &c.name, "4"]).ok();
    assert_eq!(e3["state"], "online", "the enclosing instance's torpid verdict changed the nested one: {all}");
    assert!(exceptions(&c.job_eventlog(&id)).is_empty(), "{:?}", c.job_eventlog(&id));
    c.wait_overlay_state(4, "online", Instant::now(), Duration::from_millis(20));

    // Lost in the enclosing instance: lost in the nested one, at once, naming the source.
    let t_kill = c.kill_node(4);
    let failure = || {
        let log = c.job_eventlog(&id);
        exceptions(&log).iter().find(|e| e["context"]["type"] == "node-failure").map(|e| (*e).clone())
    };
    assert!(wait_for(VERDICT, || failure().is_some()), "no node-failure exception: {:?}", c.job_eventlog(&id));
    let enclosing = failure().unwrap_or_default()["timestamp"].as_f64().unwrap_or(0.0);
    assert!(wait_for(VERDICT, || child(3).0["state"] == "lost"), "the child never saw rank 3 lost: {}", child(3).1);
    let (e3, all) = child(3);
    let (nested, reason) = (e3["since"].as_f64().unwrap_or(0.0), e3["reason"].as_str().unwrap_or(""));
    eprintln!(
        "[{}] kill -> enclosing verdict {}, -> nested verdict {} (enclosing -> nested {}): {reason}",
        c.name,
        ms(enclosing - t_kill),
        ms(nested - t_kill),
        ms(nested - enclosing)
    );
    assert!(reason.starts_with("reported by the enclosing instance, which lost node4"), "{all}");
    assert!(
        nested - enclosing <= FROM_ENCLOSING,
        "nested verdict {} after the enclosing one: {all}",
        ms(nested - enclosing)
    );
    for r in [0, 1, 2] {
        assert_eq!(rank_entry(&all, r)["state"], "online", "rank {r}: {all}");
    }

    std::fs::write(gate.join("go"), "").unwrap();
    let w = c.vigil_in(c.path(), &[], &["job", "wait", &id], JOB_END);
    let out = std::fs::read_to_string(&out_path).unwrap_or_default();
    let log = c.job_eventlog(&id);
    let ctx = job_context(&w, &out, &log);
    assert_eq!((w.timed_out, w.code), (false, 0), "{ctx}");
    let hosts: BTreeSet<&str> = out.lines().filter_map(|l| l.strip_prefix("host: ")).map(str::trim).collect();
    assert_eq!(hosts, BTreeSet::from(["node1", "node2", "node3"]), "{ctx}");
    assert_eq!(exceptions(&log).len(), 1, "{ctx}");
}

/// A gated batch job ([`gated_batch`]): its id, the directory of its gate files, its output file, and its nested
/// instance's URI.
struct GatedBatch {
    id: String,
    gate: PathBuf,
    out_path: PathBuf,
    child_uri: String,
}

/// `vigil batch -N4 BATCH_ARGS job.sh` on nodes 1-4 of `c` (node0 drained), returned once the script has started and
/// the nested instance's URI is known. The script writes `$GATE/started`, waits for `$GATE/go`, runs `vigil run -N3
/// -n3` printing each host (`host: NODE`), prints `inner run exit code RC`, then runs `tail` (shell lines; `$rc` is
/// the inner run's exit code).
#[track_caller]
fn gated_batch(c: &Cluster, batch_args: &[&str], tail: &str) -> GatedBatch {
    c.vigil(&["resource", "drain", "0", "login"]).ok();
    let work = c.path().join("work");
    let gate = c.path().join("gate");
    std::fs::create_dir_all(&work).unwrap();
    std::fs::create_dir_all(&gate).unwrap();
    let script = work.join("job.sh");
    let head = r#"#!/bin/sh
echo started > "$GATE/started"
while [ ! -e "$GATE/go" ]; do sleep 0.05; done
vigil run -N3 -n3 sh -c 'echo "host: $(vigil getattr hostname)"'
rc=$?
echo "inner run exit code $rc"
"#;
    std::fs::write(&script, format!("{head}{tail}")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let o = c.vigil_in(
        &work,
        &[("GATE", gate.to_str().unwrap())],
        &[&["batch", "-N4"], batch_args, &[script.to_str().unwrap()]].concat(),
        CMD_TIMEOUT,
    );
    o.ok();
    let id = o.stdout.trim().to_string();
    let out_path = work.join(format!("vigil-{id}.out"));
    assert!(
        wait_for(Duration::from_secs(30), || gate.join("started").exists()),
        "batch script did not start:\n{}",
        std::fs::read_to_string(&out_path).unwrap_or_default()
    );
    // The child reports its URI in a memo event, which may land just after its initial program started.
    let uri = || c.json(&["job", "info", "--json", &id])["info"]["instance"]["uri"].as_str().map(str::to_string);
    assert!(wait_for(VERDICT, || uri().is_some()), "no child uri: {}", c.json(&["job", "info", "--json", &id]));
    let child_uri = uri().unwrap_or_default();
    GatedBatch { id, gate, out_path, child_uri }
}

/// A 4-node batch job (child brokers `batch_args`) on nodes 1-4 of a 5-node cluster loses node `kill`, which
/// holds its child rank `lost`: the parent raises a severity-2 node-failure, the child sees only that rank lost,
/// and the script's `vigil run -N3` runs on the three other nodes.
#[track_caller]
fn batch_loses_a_node(batch_args: &[&str], kill: u32, lost: u32) {
    let c = Cluster::up(5);
    let tail = "echo \"status-json: $(vigil resource status --json)\"\n\
                echo \"overlay-json: $(vigil overlay status --json)\"\n\
                vigil resource status\nexit $rc\n";
    let GatedBatch { id, gate, out_path, child_uri } = gated_batch(&c, batch_args, tail);
    let t_kill = c.kill_node(kill);
    // Wait until both the parent and the child know.
    assert!(
        wait_for(VERDICT, || exceptions(&c.job_eventlog(&id)).iter().any(|e| e["context"]["type"] == "node-failure")),
        "no node-failure exception: {:?}",
        c.job_eventlog(&id)
    );
    let child_lost = || {
        let o = vigil_at(c.path(), &child_uri, &["resource", "status", "--json"], CMD_TIMEOUT);
        o.code == 0 && rank_entry(&o.json(), lost)["state"] == "lost"
    };
    assert!(wait_for(VERDICT, child_lost), "the child never saw its rank {lost} lost");
    eprintln!("[{}] child and parent saw node{kill} lost {} after the kill", c.name, ms(now_s() - t_kill));
    std::fs::write(gate.join("go"), "").unwrap();

    let w = c.vigil_in(c.path(), &[], &["job", "wait", &id], JOB_END);
    let out = std::fs::read_to_string(&out_path).unwrap_or_default();
    let log = c.job_eventlog(&id);
    let ctx = job_context(&w, &out, &log);
    assert_eq!((w.timed_out, w.code), (false, 0), "{ctx}");
    assert!(out.contains("inner run exit code 0"), "{ctx}");
    let hosts: BTreeSet<&str> = out.lines().filter_map(|l| l.strip_prefix("host: ")).map(str::trim).collect();
    assert_eq!(hosts.len(), 3, "3 distinct nodes expected: {hosts:?}\n{ctx}");
    assert!(!hosts.contains(format!("node{kill}").as_str()), "ran on the lost node: {hosts:?}\n{ctx}");
    let status: Value = out
        .lines()
        .find_map(|l| l.strip_prefix("status-json: "))
        .and_then(|s| serde_json::from_str(s).ok())
        .unwrap_or_else(|| panic!("no child resource status:\n{ctx}"));
    let states: Vec<&str> =
        status["ranks"].as_array().unwrap().iter().map(|r| r["state"].as_str().unwrap_or("")).collect();
    assert_eq!(states.iter().filter(|s| **s == "lost").count(), 1, "{status}\n{ctx}");
    assert_eq!(rank_entry(&status, lost)["hostname"], format!("node{kill}").as_str(), "{status}");
    assert_eq!(rank_entry(&status, lost)["state"], "lost", "{status}");
    // Every other rank of the child is under a live parent: rank 3 adopted if its parent was the lost rank.
    let overlay: Value = out
        .lines()
        .find_map(|l| l.strip_prefix("overlay-json: "))
        .and_then(|s| serde_json::from_str(s).ok())
        .unwrap_or_else(|| panic!("no child overlay status:\n{ctx}"));
    for r in (1..4).filter(|r| *r != lost) {
        let e = rank_entry(&overlay, r);
        assert_ne!(e["parent"], lost, "rank {r} still under the lost rank: {overlay}\n{ctx}");
        assert_eq!(e["adopted"], Value::Bool(lost == 1 && r == 3), "rank {r}: {overlay}\n{ctx}");
    }
    let ex = exceptions(&log);
    assert_eq!(ex.len(), 1, "{ctx}");
    assert_eq!(ex[0]["context"]["type"], "node-failure", "{ctx}");
    assert_eq!(ex[0]["context"]["severity"], 2, "{ctx}");
    // `vigil jobs -a` shows that the job went on without the node, beside its exit code (trial item 6).
    let jobs = c.vigil(&["jobs", "-a"]);
    jobs.ok();
    let row = jobs.stdout.lines().find(|l| l.contains(id.as_str())).unwrap_or_default();
    assert!(row.ends_with(&format!("exit 0, lost node{kill}")), "{}", jobs.dump());
}

/// A 4-node batch job (child brokers `batch_args`) on nodes 1-4 of a 5-node cluster whose node `kill` is silently killed as soon as the job
/// starts: while its instance's brokers start (their PMI exchange, rank 0 waiting for every broker to join), before
/// the instance reports its critical ranks. Returns the cluster, the job id, `vigil job wait`'s output, the job's
/// eventlog, the script's output, and the kill's wall time.
fn batch_loses_a_node_at_start(batch_args: &[&str], kill: u32) -> (Cluster, String, Output, Vec<Value>, String, f64) {
    let c = Cluster::up(5);
    c.vigil(&["resource", "drain", "0", "login"]).ok();
    let work = c.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let script = work.join("job.sh");
    std::fs::write(
        &script,
        r#"#!/bin/sh
vigil run -N3 -n3 sh -c 'echo "host: $(vigil getattr hostname)"'
rc=$?
echo "inner run exit code $rc"
echo "status-json: $(vigil resource status --json)"
exit $rc
"#,
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let o = c.vigil_in(&work, &[], &[&["batch", "-N4"], batch_args, &[script.to_str().unwrap()]].concat(), CMD_TIMEOUT);
    o.ok();
    let id = o.stdout.trim().to_string();
    let started = || c.job_eventlog(&id).iter().any(|e| e["name"] == "start");
    assert!(wait_for(VERDICT, started), "never started: {:?}", c.job_eventlog(&id));
    let t_kill = c.kill_node(kill);
    let w = c.vigil_in(c.path(), &[], &["job", "wait", &id], JOB_END);
    let out = std::fs::read_to_string(work.join(format!("vigil-{id}.out"))).unwrap_or_default();
    let log = c.job_eventlog(&id);
    (c, id, w, log, out, t_kill)
}

/// A batch job loses a node other than its batch host while its instance starts (killed as soon as the job
/// starts, before the instance is up): the PMI exchange of its shells ends without the lost shell, the instance's
/// rank 0 stops waiting for the lost broker (the enclosing job's `node-failure` says which it is) and comes up with
/// the other three, showing that rank lost, and the script's `vigil run -N3` runs on the survivors; the job gets
/// one severity-2 node-failure and ends with exit 0 (issue 36).
#[test]
fn a_batch_job_survives_a_node_lost_while_its_instance_starts() {
    batch_survives_a_node_lost_at_start(&["--tolerate-lost=1"], 3, 2);
}

/// [`batch_loses_a_node_at_start`] of node `kill`, which holds child rank `lost`: the job goes on without it.
#[track_caller]
fn batch_survives_a_node_lost_at_start(batch_args: &[&str], kill: u32, lost: u32) {
    // The scenario is a loss while the instance starts: the kill follows the job's start at once, but on a loaded
    // machine the kill itself can take longer than the instance's start (seen: 807 ms). A run where the instance
    // was up first tested the later case (which has tests of its own), not this one: it is run again, up to 3
    // times, and the last one must have the loss first.
    const TRIES: u32 = 3;
    for attempt in 1..=TRIES {
        let (c, _id, w, log, out, t_kill) = batch_loses_a_node_at_start(batch_args, kill);
        let memo = log.iter().position(|e| e["name"] == "memo" && e["context"]["critical_ranks"].is_string());
        let first = log.iter().position(|e| e["name"] == "exception");
        let loss_first = first < memo || memo.is_none();
        if !loss_first && attempt < TRIES {
            eprintln!("[{}] the instance was up before node{kill}'s loss (try {attempt}): again", c.name);
            continue;
        }
        check_batch_survived(&c, (&w, &log, &out, t_kill), (kill, lost), loss_first);
        return;
    }
}

/// The checks of [`batch_survives_a_node_lost_at_start`] on one run: `loss_first`, the loss came before the
/// instance reported itself (its memo).
#[track_caller]
fn check_batch_survived(c: &Cluster, run: (&Output, &[Value], &str, f64), node: (u32, u32), loss_first: bool) {
    let (w, log, out, t_kill) = run;
    let (kill, lost) = node;
    let ctx = job_context(w, out, log);
    let ex = exceptions(log);
    assert_eq!(ex.len(), 1, "{ctx}");
    let ex = ex[0];
    assert_eq!((ex["context"]["type"].as_str(), ex["context"]["severity"].as_u64()), (Some("node-failure"), Some(2)));
    assert_eq!(ex["context"]["shell_ranks"], lost.to_string().as_str(), "node{kill} holds child rank {lost}: {ctx}");
    assert!(loss_first, "the loss came after the instance was up: {ctx}");
    assert_eq!((w.timed_out, w.code), (false, 0), "{ctx}");
    assert!(out.contains("inner run exit code 0"), "{ctx}");
    let hosts: BTreeSet<String> =
        out.lines().filter_map(|l| l.strip_prefix("host: ")).map(|h| h.trim().to_string()).collect();
    let want: BTreeSet<String> = (1..5).filter(|k| *k != kill).map(|k| format!("node{k}")).collect();
    assert_eq!(hosts, want, "{ctx}");
    let status: Value = out
        .lines()
        .find_map(|l| l.strip_prefix("status-json: "))
        .and_then(|s| serde_json::from_str(s).ok())
        .unwrap_or_else(|| panic!("no child resource status:\n{ctx}"));
    for r in 0..4 {
        let want = if r == lost { "lost" } else { "avail" };
        assert_eq!(rank_entry(&status, r)["state"], want, "rank {r}: {status}\n{ctx}");
    }
    eprintln!(
        "[{}] node{kill} lost at start: exception +{}, job ended exit 0 +{}",
        c.name,
        ms(ex["timestamp"].as_f64().unwrap_or(0.0) - t_kill),
        ms(log.last().and_then(|e| e["timestamp"].as_f64()).unwrap_or(0.0) - t_kill)
    );
}

/// The batch host (the instance's rank 0, node1) lost while the instance starts is fatal, as it is later: the
/// job's critical ranks are known from its jobspec before the instance reports them (issue 36).
#[test]
fn a_batch_job_fails_when_its_host_is_lost_while_its_instance_starts() {
    let (_c, _id, w, log, out, _) = batch_loses_a_node_at_start(&[], 1);
    let ctx = job_context(&w, &out, &log);
    assert_eq!((w.timed_out, w.code), (false, 69), "the lost-node exit code: {ctx}");
    let ex = exceptions(&log);
    assert!(!ex.is_empty(), "{ctx}");
    assert_eq!(
        (ex[0]["context"]["type"].as_str(), ex[0]["context"]["severity"].as_u64()),
        (Some("node-failure"), Some(0))
    );
    let note = "lost node node1 (rank 1), where rank 0 of the job's instance ran; the job's instance cannot go on \
                without it";
    assert_eq!(ex[0]["context"]["note"], note, "{ctx}");
    assert!(!out.contains("inner run exit code"), "the script never ran: {ctx}");
}

// ------------------------------------------------------------ a node lost between allocation and start

/// How the node is lost in [`lost_before_its_shell_starts`].
#[derive(Clone, Copy, Debug)]
enum Loss {
    /// `kill -9` of its broker: the kernel closes its links.
    Broker,
    /// Silent node death (`ci/netns-cluster.sh kill`): the link is cut first, nothing reaches the peers.
    Silent,
}

/// A 4-node job (ordinary with `-n4`, or a batch job running a 3-node `vigil run`) on nodes 1-4 of a 5-node cluster
/// (node0 drained), whose node3 is lost after the job was allocated, before its shell started there: node3's
/// broker is stopped first (`tbon.torpid_max` and `tbon.stall_max` are long, so that it still gets work), the job
/// is submitted and allocated, its shell's start on node3 waits unanswered, and only then is node3 lost (`loss`).
/// Returns the cluster, the job id, `vigil job wait`'s output, the job's eventlog, the script's output (batch) and
/// the loss's wall time.
fn lost_before_its_shell_starts(batch: bool, loss: Loss) -> (Cluster, String, Output, Vec<Value>, String, f64) {
    let c = Cluster::up_with(5, &["-S", "tbon.torpid_max=60s", "-S", "tbon.stall_max=60s"]);
    c.vigil(&["resource", "drain", "0", "login"]).ok();
    let work = c.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    c.script(&["stall", &c.name, "3"]).ok();
    let id = if batch {
        let script = work.join("job.sh");
        std::fs::write(
            &script,
            r#"#!/bin/sh
vigil run -N3 -n3 sh -c 'echo "host: $(vigil getattr hostname)"'
rc=$?
echo "inner run exit code $rc"
echo "status-json: $(vigil resource status --json)"
exit $rc
"#,
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let o = c.vigil_in(&work, &[], &["batch", "-N4", "--tolerate-lost=1", script.to_str().unwrap()], CMD_TIMEOUT);
        o.ok();
        o.stdout.trim().to_string()
    } else {
        c.submit(&["-N4", "-n4", "sleep", "30"])
    };
    let allocated = || c.job_eventlog(&id).iter().any(|e| e["name"] == "alloc");
    assert!(wait_for(VERDICT, allocated), "never allocated: {:?}", c.job_eventlog(&id));
    // The other shells start; the one on the stopped node cannot.
    std::thread::sleep(Duration::from_millis(500));
    let log = c.job_eventlog(&id);
    assert!(!log.iter().any(|e| e["name"] == "start"), "every shell started, node3's too: {log:?}");
    let t_kill = match loss {
        Loss::Broker => {
            let t = now_s();
            let pid = c.broker_pid(3);
            let k = Command::new("kill").args(["-9", &pid.to_string()]).status().expect("kill");
            assert!(k.success(), "kill -9 {pid}");
            t
        }
        Loss::Silent => c.kill_node(3),
    };
    let w = c.vigil_in(c.path(), &[], &["job", "wait", &id], JOB_END);
    let out = std::fs::read_to_string(work.join(format!("vigil-{id}.out"))).unwrap_or_default();
    let log = c.job_eventlog(&id);
    (c, id, w, log, out, t_kill)
}

/// An ordinary job whose node3 is lost before its shell started there ([`lost_before_its_shell_starts`]) gets
/// one fatal node-failure exception naming the node at once, ends with the lost-node exit code, and node3 is not
/// given to the next job.
#[track_caller]
fn ordinary_job_lost_before_its_shell_starts(loss: Loss) {
    let (c, _id, w, log, _, t_kill) = lost_before_its_shell_starts(false, loss);
    let ctx =
        format!("{}\n--- eventlog ---\n{}", w.dump(), log.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("\n"));
    assert!(!w.timed_out, "job wait hung: {ctx}");
    assert_eq!(w.code, 69, "the lost-node exit code: {ctx}");
    let ex = exceptions(&log);
    assert_eq!(ex.len(), 1, "one exception, the node's loss: {ctx}");
    assert_eq!(
        (ex[0]["context"]["type"].as_str(), ex[0]["context"]["severity"].as_u64()),
        (Some("node-failure"), Some(0)),
        "{ctx}"
    );
    assert_eq!(ex[0]["context"]["note"], "lost node node3 (rank 3), where task 2 ran", "{ctx}");
    assert!(w.stderr.contains("exception type=node-failure severity=0: lost node node3 (rank 3)"), "{ctx}");
    assert_eq!(c.lost_ranks(), BTreeSet::from([3]), "{ctx}");
    // node3's resources are not given again while it is lost: first fit would take ranks 1-3.
    let r = c.vigil(&["run", "-N3", "-n3", "vigil", "getattr", "hostname"]);
    r.ok();
    let hosts: BTreeSet<&str> = r.stdout.lines().map(str::trim).collect();
    assert_eq!(hosts, BTreeSet::from(["node1", "node2", "node4"]), "{}", r.dump());
    eprintln!(
        "[{}] {loss:?} loss before the shell started: exception +{}, job inactive +{}",
        c.name,
        ms(ex[0]["timestamp"].as_f64().unwrap_or(0.0) - t_kill),
        ms(log.last().and_then(|e| e["timestamp"].as_f64()).unwrap_or(0.0) - t_kill)
    );
}

#[test]
fn an_ordinary_job_whose_broker_is_killed_before_its_shell_starts_fails_at_once() {
    ordinary_job_lost_before_its_shell_starts(Loss::Broker);
}

#[test]
fn an_ordinary_job_whose_node_dies_before_its_shell_starts_fails_at_once() {
    ordinary_job_lost_before_its_shell_starts(Loss::Silent);
}

/// A batch job (`--tolerate-lost=1`) whose node3 (its instance's rank 2) is lost before its shell started there
/// gets one severity-2 node-failure naming it; its instance comes up on the other three, the script runs on them,
/// exit 0; node3 is released and not given again.
#[track_caller]
fn batch_job_lost_before_its_shell_starts(loss: Loss) {
    let (c, id, w, log, out, t_kill) = lost_before_its_shell_starts(true, loss);
    let ctx = job_context(&w, &out, &log);
    assert!(!w.timed_out, "job wait hung: {ctx}");
    let ex = exceptions(&log);
    assert_eq!(ex.len(), 1, "one exception, the node's loss: {ctx}");
    assert_eq!(
        (ex[0]["context"]["type"].as_str(), ex[0]["context"]["severity"].as_u64()),
        (Some("node-failure"), Some(2)),
        "{ctx}"
    );
    assert_eq!(ex[0]["context"]["shell_ranks"], "2", "{ctx}");
    assert!(ex[0]["context"]["note"].as_str().unwrap_or("").starts_with("lost node node3 (rank 3)"), "{ctx}");
    assert_eq!(w.code, 0, "{ctx}");
    assert!(out.contains("inner run exit code 0"), "{ctx}");
    let hosts: BTreeSet<String> =
        out.lines().filter_map(|l| l.strip_prefix("host: ")).map(|h| h.trim().to_string()).collect();
    assert_eq!(hosts, BTreeSet::from(["node1".to_string(), "node2".into(), "node4".into()]), "{ctx}");
    let released =
        log.iter().any(|e| e["name"] == "release" && e["context"]["ranks"] == "3" && e["context"]["final"] == false);
    assert!(released, "node3 released early: {ctx}");
    let r = c.vigil(&["run", "-N3", "-n3", "vigil", "getattr", "hostname"]);
    r.ok();
    let hosts: BTreeSet<&str> = r.stdout.lines().map(str::trim).collect();
    assert_eq!(hosts, BTreeSet::from(["node1", "node2", "node4"]), "{}", r.dump());
    eprintln!(
        "[{}] batch, {loss:?} loss before the shell started: exception +{}, job ended +{}",
        c.name,
        ms(ex[0]["timestamp"].as_f64().unwrap_or(0.0) - t_kill),
        ms(log.last().and_then(|e| e["timestamp"].as_f64()).unwrap_or(0.0) - t_kill)
    );
    let _ = id;
}

#[test]
fn a_batch_job_whose_broker_is_killed_before_its_shell_starts_goes_on_without_it() {
    batch_job_lost_before_its_shell_starts(Loss::Broker);
}

#[test]
fn a_batch_job_whose_node_dies_before_its_shell_starts_goes_on_without_it() {
    batch_job_lost_before_its_shell_starts(Loss::Silent);
}

/// A cluster of `size` nodes (node0 drained) whose node `cut` cannot reach node1 (a blackhole route to it), and a
/// batch job `-N{size-1}` (`batch_args` added) on nodes 1 to `size - 1`: its script says the nodes it got and runs
/// one task on each of all but one of them. Node `cut`'s broker of the job's instance retries its parent there.
/// Returns the cluster, the script's working directory (its output file) and the job's id.
fn batch_with_a_node_cut_off(size: u32, cut: u32, batch_args: &[&str]) -> (Cluster, std::path::PathBuf, String) {
    let c = Cluster::up(size);
    c.vigil(&["resource", "drain", "0", "login"]).ok();
    c.script(&["run", &c.name, &cut.to_string(), "ip", "route", "add", "blackhole", "10.200.0.2/32"]).ok();
    let work = c.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let script = work.join("job.sh");
    let inner = size - 2;
    std::fs::write(
        &script,
        format!(
            r#"#!/bin/sh
echo "nodes: $VIGIL_JOB_NNODES $VIGIL_JOB_NODELIST"
vigil run -N{inner} -n{inner} sh -c 'echo "host: $(vigil getattr hostname)"'
rc=$?
echo "inner run exit code $rc"
exit $rc
"#
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let nnodes = format!("-N{}", size - 1);
    let o =
        c.vigil_in(&work, &[], &[&["batch", &nnodes], batch_args, &[script.to_str().unwrap()]].concat(), CMD_TIMEOUT);
    o.ok();
    let id = o.stdout.trim().to_string();
    (c, work, id)
}

/// A 4-node batch job (`batch_args`) on nodes 1-4 of a 5-node cluster whose instance's broker on node3 (its rank
/// 2) dies on a live node before it joined: node3 cannot reach node1 (the instance's rank 0, its parent) through
/// a blackhole route, so its broker retries its connection; it is killed there (`kill -9`). Returns the cluster,
/// `vigil job wait`'s output, the job's eventlog, the script's output and the kill's wall time.
fn nested_broker_dies_at_start(batch_args: &[&str]) -> (Cluster, Output, Vec<Value>, String, f64) {
    let (c, work, id) = batch_with_a_node_cut_off(5, 3, batch_args);
    let nested = || -> Vec<i32> {
        c.node_processes(3).into_iter().filter(|(_, cl)| cl.contains(" broker --job-script=")).map(|(p, _)| p).collect()
    };
    assert!(wait_for(VERDICT, || nested().len() == 1), "no nested broker on node3: {:?}", c.node_processes(3));
    // Most likely past its PMI exchange, retrying its parent; killed well before it could give up (it finds its
    // parent's node silent within about 1.5 s), so that it is its death the enclosing instance reports.
    std::thread::sleep(Duration::from_millis(200));
    let t_kill = now_s();
    let pid = nested().first().copied().unwrap_or_else(|| {
        panic!(
            "node3's nested broker ended by itself: {ctx_log}",
            ctx_log = std::fs::read_to_string(work.join(format!("vigil-{id}.out"))).unwrap_or_default()
        )
    });
    assert!(Command::new("kill").args(["-9", &pid.to_string()]).status().is_ok_and(|s| s.success()), "kill {pid}");
    let w = c.vigil_in(c.path(), &[], &["job", "wait", &id], JOB_END);
    let out = std::fs::read_to_string(work.join(format!("vigil-{id}.out"))).unwrap_or_default();
    let log = c.job_eventlog(&id);
    c.script(&["run", &c.name, "3", "ip", "route", "del", "blackhole", "10.200.0.2/32"]).ok();
    (c, w, log, out, t_kill)
}

/// A batch job's broker that dies on a live node before it joined its instance (slice 2 of the start-up
/// failures): the enclosing instance reports it at once, naming the node and what the shell saw, releases the
/// node, and tells the instance, which comes up on the other three (`--tolerate-lost=1`); the script runs there.
#[test]
fn a_batch_jobs_broker_that_dies_before_it_joins_is_reported_at_once() {
    let (c, w, log, out, t_kill) = nested_broker_dies_at_start(&["--tolerate-lost=1"]);
    let ctx = job_context(&w, &out, &log);
    assert!(!w.timed_out, "job wait hung: {ctx}");
    let ex = exceptions(&log);
    assert_eq!(ex.len(), 1, "{ctx}");
    let note =
        "the job's broker on node3 (rank 3), where rank 2 of the job's instance ran, ended (killed by SIGKILL); \
                the job's instance continues without it";
    assert_eq!(ex[0]["context"]["note"], note, "{ctx}");
    assert_eq!((ex[0]["context"]["severity"].as_u64(), ex[0]["context"]["shell_ranks"].as_str()), (Some(2), Some("2")));
    assert!(log.iter().any(|e| e["name"] == "release" && e["context"]["ranks"] == "3"), "released: {ctx}");
    assert_eq!(w.code, 0, "{ctx}");
    let hosts: BTreeSet<String> =
        out.lines().filter_map(|l| l.strip_prefix("host: ")).map(|h| h.trim().to_string()).collect();
    assert_eq!(hosts, BTreeSet::from(["node1".to_string(), "node2".into(), "node4".into()]), "{ctx}");
    assert!(out.contains("nodes: 3 node[1-2,4]"), "the script is told the nodes it has: {ctx}");
    eprintln!(
        "[{}] nested broker killed at start: exception +{}, job ended +{}",
        c.name,
        ms(ex[0]["timestamp"].as_f64().unwrap_or(0.0) - t_kill),
        ms(log.last().and_then(|e| e["timestamp"].as_f64()).unwrap_or(0.0) - t_kill)
    );
}

/// Without `--tolerate-lost`, a batch job's broker that dies before it joined fails the job at once: the enclosing
/// instance reports the broker's end (severity 2), then its instance, which cannot start without it, has the job
/// failed naming the node (issue 40).
#[test]
fn a_batch_jobs_broker_that_dies_before_it_joins_fails_the_job_at_once_without_tolerate_lost() {
    let (c, w, log, out, t_kill) = nested_broker_dies_at_start(&[]);
    let ctx = job_context(&w, &out, &log);
    assert!(!w.timed_out, "job wait hung: {ctx}");
    assert_eq!(w.code, 69, "the lost-node exit code: {ctx}");
    let ex = exceptions(&log);
    assert_eq!(ex.len(), 2, "{ctx}");
    assert_eq!((ex[0]["context"]["type"].as_str(), ex[0]["context"]["severity"].as_u64()), (Some("exec"), Some(2)));
    let note = "the job's instance could not start without node node3 (rank 3), where rank 2 of the job's instance \
                was to run: its broker never joined, and --tolerate-lost=0 allows none";
    assert_eq!(ex[1]["context"]["note"], note, "{ctx}");
    assert!(w.stderr.contains(note), "{ctx}");
    assert!(!out.contains("inner run exit code"), "the script never ran: {ctx}");
    eprintln!(
        "[{}] nested broker killed at start, no --tolerate-lost: fatal exception +{}, job ended +{}",
        c.name,
        ms(ex[1]["timestamp"].as_f64().unwrap_or(0.0) - t_kill),
        ms(log.last().and_then(|e| e["timestamp"].as_f64()).unwrap_or(0.0) - t_kill)
    );
}

/// A 5-node batch job (`batch_args`) on nodes 1-5 of a 6-node cluster whose fifth node dies before its broker
/// joined the instance: node5 cannot reach node1 (the instance's rank 0) through a blackhole route, so its broker,
/// past its PMI exchange, retries; then node5 is silently killed. Returns the cluster, `vigil job wait`'s output,
/// the job's eventlog, the script's output and the kill's wall time.
fn fifth_node_dies_before_its_broker_joins(batch_args: &[&str]) -> (Cluster, Output, Vec<Value>, String, f64) {
    let (c, work, id) = batch_with_a_node_cut_off(6, 5, batch_args);
    let nested = || c.node_processes(5).iter().any(|(_, cl)| cl.contains(" broker --job-script="));
    assert!(wait_for(VERDICT, nested), "no nested broker on node5: {:?}", c.node_processes(5));
    std::thread::sleep(Duration::from_millis(200));
    let t_kill = c.kill_node(5);
    let w = c.vigil_in(c.path(), &[], &["job", "wait", &id], JOB_END);
    let out = std::fs::read_to_string(work.join(format!("vigil-{id}.out"))).unwrap_or_default();
    let log = c.job_eventlog(&id);
    (c, w, log, out, t_kill)
}

/// `vigil batch -N5 --tolerate-lost=1` whose fifth node is killed before its broker joins starts on the other four
/// and runs (issue 40): one severity-2 node-failure naming node5, its node released, the script told the four
/// nodes it has, and its `vigil run -N4` runs on them; exit 0.
#[test]
fn a_batch_job_with_tolerate_lost_starts_without_a_node_that_never_joined() {
    let (c, w, log, out, t_kill) = fifth_node_dies_before_its_broker_joins(&["--tolerate-lost=1"]);
    let ctx = job_context(&w, &out, &log);
    assert_eq!((w.timed_out, w.code), (false, 0), "{ctx}");
    let ex = exceptions(&log);
    assert_eq!(ex.len(), 1, "{ctx}");
    assert_eq!(
        (ex[0]["context"]["type"].as_str(), ex[0]["context"]["severity"].as_u64(), ex[0]["context"]["hosts"].as_str()),
        (Some("node-failure"), Some(2), Some("node5")),
        "{ctx}"
    );
    assert!(log.iter().any(|e| e["name"] == "release" && e["context"]["ranks"] == "5"), "node5 released: {ctx}");
    assert!(out.contains("nodes: 4 node[1-4]"), "{ctx}");
    assert!(out.contains("inner run exit code 0"), "{ctx}");
    let hosts: BTreeSet<String> =
        out.lines().filter_map(|l| l.strip_prefix("host: ")).map(|h| h.trim().to_string()).collect();
    assert_eq!(hosts, (1..5).map(|k| format!("node{k}")).collect::<BTreeSet<_>>(), "{ctx}");
    eprintln!(
        "[{}] fifth node lost before joining, --tolerate-lost=1: exception +{}, job ended +{}",
        c.name,
        ms(ex[0]["timestamp"].as_f64().unwrap_or(0.0) - t_kill),
        ms(log.last().and_then(|e| e["timestamp"].as_f64()).unwrap_or(0.0) - t_kill)
    );
}

/// The same without `--tolerate-lost`: the job fails at once with the reason, naming node5, exit 69 (issue 40).
#[test]
fn a_batch_job_whose_node_never_joined_fails_at_once_without_tolerate_lost() {
    let (c, w, log, out, t_kill) = fifth_node_dies_before_its_broker_joins(&[]);
    let ctx = job_context(&w, &out, &log);
    assert_eq!((w.timed_out, w.code), (false, 69), "{ctx}");
    let ex = exceptions(&log);
    let fatal: Vec<&&Value> = ex.iter().filter(|e| e["context"]["severity"] == 0).collect();
    assert_eq!(fatal.len(), 1, "{ctx}");
    let note = "the job's instance could not start without node node5 (rank 5), where rank 4 of the job's instance \
                was to run: its broker never joined, and --tolerate-lost=0 allows none";
    assert_eq!(fatal[0]["context"]["note"], note, "{ctx}");
    assert!(w.stderr.contains(note), "{ctx}");
    assert!(!out.contains("inner run exit code"), "the script never ran: {ctx}");
    eprintln!(
        "[{}] fifth node lost before joining, no --tolerate-lost: fatal exception +{}, job ended +{}",
        c.name,
        ms(fatal[0]["timestamp"].as_f64().unwrap_or(0.0) - t_kill),
        ms(log.last().and_then(|e| e["timestamp"].as_f64()).unwrap_or(0.0) - t_kill)
    );
}

/// The first file under `root` whose path ends with `suffix`, if any (a walk of the whole tree).
fn find_file(root: &Path, suffix: &str) -> Option<PathBuf> {
    let mut todo = vec![root.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for e in entries.flatten() {
            let p = e.path();
            if p.to_string_lossy().ends_with(suffix) {
                return Some(p);
            }
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                todo.push(p);
            }
        }
    }
    None
}

/// A 5-node batch job (`-S tbon.topo=kary:2`) on nodes 1-5 of a 6-node cluster, whose instance's rank `r` runs
/// on node `r + 1`: rank 1 (node2) is the router of ranks 3 (node4) and 4 (node5). Those two cannot reach node2
/// (a blackhole route in their namespaces) until `router_down` has run, which is called as soon as the router's
/// broker is past the endpoint exchange (its local socket exists): after the exchange, before its children could
/// connect to it. Returns the cluster, `vigil job wait`'s output, the job's eventlog, the script's output (its
/// inner `vigil run -N run_nodes` lines, then the instance's resource and overlay status) and when
/// `router_down` returned.
fn batch_router_out_of_reach_at_start(
    run_nodes: u32,
    router_down: impl FnOnce(&Cluster, &Path),
) -> (Cluster, Output, Vec<Value>, String, f64) {
    let c = Cluster::up(6);
    c.vigil(&["resource", "drain", "0", "login"]).ok();
    let router_ip = "10.200.0.3/32";
    for k in ["4", "5"] {
        c.script(&["run", &c.name, k, "ip", "route", "add", "blackhole", router_ip]).ok();
    }
    let work = c.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let script = work.join("job.sh");
    std::fs::write(
        &script,
        format!(
            r#"#!/bin/sh
vigil run -N{run_nodes} -n{run_nodes} sh -c 'echo "host: $(vigil getattr hostname)"'
rc=$?
echo "inner run exit code $rc"
echo "status-json: $(vigil resource status --json)"
echo "overlay-json: $(vigil overlay status --json)"
exit $rc
"#
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let o = c.vigil_in(
        &work,
        &[],
        &[
            "batch",
            "-N5",
            "--tolerate-lost=1",
            "-S",
            "tbon.topo=kary:2",
            "-S",
            "log-level=info",
            script.to_str().unwrap(),
        ],
        CMD_TIMEOUT,
    );
    o.ok();
    let id = o.stdout.trim().to_string();
    // The router's broker made its local socket (`r/local-1` in its job directory): the exchange is over.
    let roots = [c.path().to_path_buf(), PathBuf::from(format!("/tmp/vigil-netns-{}", c.name))];
    let past = || roots.iter().any(|r| find_file(r, "/r/local-1").is_some());
    assert!(wait_for(VERDICT, past), "the router never got past the exchange: {:?}", c.job_eventlog(&id));
    let out_path = work.join(format!("vigil-{id}.out"));
    router_down(&c, &out_path);
    let t_down = now_s();
    eprintln!("[{}] router's node down (or stalled) at {t_down:.3}", c.name);
    for k in ["4", "5"] {
        c.script(&["run", &c.name, k, "ip", "route", "del", "blackhole", router_ip]).ok();
    }
    let w = c.vigil_in(c.path(), &[], &["job", "wait", &id], JOB_END);
    let out = std::fs::read_to_string(&out_path).unwrap_or_default();
    let log = c.job_eventlog(&id);
    (c, w, log, out, t_down)
}

/// The instance's resource and overlay status as the script printed them.
fn script_status(out: &str, ctx: &str) -> (Value, Value) {
    let get = |key: &str| -> Value {
        out.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|s| serde_json::from_str(s).ok())
            .unwrap_or_else(|| panic!("no {key} in the script's output:\n{ctx}"))
    };
    (get("status-json: "), get("overlay-json: "))
}

/// A router of a batch job's instance (rank 1 of kary:2, node2) whose node dies after the endpoint exchange,
/// before its children (ranks 3, 4) connected to it: they find its node silent and re-parent onto a live ancestor
/// rather than retrying it for `tbon.connect_timeout` and exiting; the instance learns from the enclosing one that
/// rank 1's node was lost, comes up without it, and the script's `vigil run -N4` runs on the four survivors; one
/// severity-2 node-failure, exit 0 (issue 36).
#[test]
fn a_batch_job_survives_its_router_lost_before_its_children_connect() {
    let (c, w, log, out, t_down) = batch_router_out_of_reach_at_start(4, |c, _| {
        c.kill_node(2);
    });
    let ctx = job_context(&w, &out, &log);
    assert_eq!((w.timed_out, w.code), (false, 0), "{ctx}");
    let ex = exceptions(&log);
    assert_eq!(ex.len(), 1, "{ctx}");
    assert_eq!(
        (ex[0]["context"]["type"].as_str(), ex[0]["context"]["severity"].as_u64()),
        (Some("node-failure"), Some(2)),
        "{ctx}"
    );
    assert_eq!(ex[0]["context"]["shell_ranks"], "1", "node2 holds the instance's rank 1: {ctx}");
    assert!(out.contains("inner run exit code 0"), "{ctx}");
    let hosts: BTreeSet<String> =
        out.lines().filter_map(|l| l.strip_prefix("host: ")).map(|h| h.trim().to_string()).collect();
    let want: BTreeSet<String> = [1, 3, 4, 5].iter().map(|k| format!("node{k}")).collect();
    assert_eq!(hosts, want, "{ctx}");
    let (status, overlay) = script_status(&out, &ctx);
    for r in 0..5 {
        let want = if r == 1 { "lost" } else { "avail" };
        assert_eq!(rank_entry(&status, r)["state"], want, "rank {r}: {status}\n{ctx}");
    }
    for r in [3, 4] {
        let e = rank_entry(&overlay, r);
        assert_eq!(e["adopted"], true, "rank {r} re-parented: {overlay}\n{ctx}");
        assert_ne!(e["parent"], 1, "rank {r} still under the lost router: {overlay}\n{ctx}");
    }
    eprintln!(
        "[{}] router's node lost before its children connected: job ended exit 0 +{} after the kill",
        c.name,
        ms(log.last().and_then(|e| e["timestamp"].as_f64()).unwrap_or(0.0) - t_down)
    );
}

/// A router of a batch job's instance (rank 1 of kary:2, node2) that is alive but slow (its broker stopped as
/// soon as it is past the endpoint exchange) and out of its children's reach: they find its node silent and
/// re-parent onto a live ancestor, no verdict on it; once it runs again it joins as a leaf, finding them adopted.
/// Nothing is lost: the instance comes up with all five brokers, ranks 3 and 4 under their adopters, and the
/// script's `vigil run -N5` runs on every node; no exception, exit 0 (issue 36).
#[test]
fn a_slow_router_whose_children_were_adopted_at_start_joins_as_a_leaf() {
    let (c, w, log, out, _) = batch_router_out_of_reach_at_start(5, |c, out_path| {
        // The router's broker (the job's task on node2: `vigil broker --job-script=...`, bootstrapped through PMI).
        let pids: Vec<i32> = c
            .node_processes(2)
            .into_iter()
            .filter(|(_, cl)| cl.contains(" broker --job-script="))
            .map(|(p, _)| p)
            .collect();
        assert_eq!(pids.len(), 1, "one nested broker on node2: {:?}", c.node_processes(2));
        let signal = |sig: &str| {
            let ok = Command::new("kill").args([sig, &pids[0].to_string()]).status().is_ok_and(|s| s.success());
            assert!(ok, "kill {sig} {}", pids[0]);
        };
        signal("-STOP");
        let adopted = || {
            let out = std::fs::read_to_string(out_path).unwrap_or_default();
            ["3", "4"].iter().all(|r| out.contains(&format!("vigil-broker[{r}]: info: re-parented under rank")))
        };
        let both = wait_for(VERDICT, adopted);
        signal("-CONT");
        assert!(both, "ranks 3 and 4 did not re-parent:\n{}", std::fs::read_to_string(out_path).unwrap_or_default());
    });
    let ctx = job_context(&w, &out, &log);
    assert_eq!((w.timed_out, w.code), (false, 0), "{ctx}");
    assert!(exceptions(&log).is_empty(), "{ctx}");
    assert!(out.contains("inner run exit code 0"), "{ctx}");
    let hosts: BTreeSet<String> =
        out.lines().filter_map(|l| l.strip_prefix("host: ")).map(|h| h.trim().to_string()).collect();
    let want: BTreeSet<String> = (1..6).map(|k| format!("node{k}")).collect();
    assert_eq!(hosts, want, "{ctx}");
    let (status, overlay) = script_status(&out, &ctx);
    for r in 0..5 {
        assert_eq!(rank_entry(&status, r)["state"], "avail", "rank {r}: {status}\n{ctx}");
    }
    for r in [3, 4] {
        let e = rank_entry(&overlay, r);
        assert_eq!(e["adopted"], true, "rank {r} re-parented: {overlay}\n{ctx}");
        assert_ne!(e["parent"], 1, "rank {r}: {overlay}\n{ctx}");
    }
    let router = rank_entry(&overlay, 1);
    assert_eq!(router["state"], "online", "{overlay}\n{ctx}");
    eprintln!("[{}] slow router joined as a leaf; its children stayed with their adopters", c.name);
}

/// A nested instance on the nodes of its parent shares the parent brokers' XDP responder (one XDP program per
/// interface) instead of falling back, and leaves without any false "lost" verdict.
#[test]
fn nested_instance_shares_the_xdp_responder() {
    if !nix_is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let c = Cluster::up(3);
    let _ = detectors(&c);
    let work = tempdir();
    let script = work.path().join("nested.sh");
    std::fs::write(&script, "#!/bin/sh\nfor i in $(seq 1 100); do vigil uptime | grep -q loading || break; sleep 0.05; done\nvigil uptime\n")
        .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let o = c.vigil_in(work.path(), &[], &["batch", "-N2", script.to_str().unwrap()], CMD_TIMEOUT);
    o.ok();
    let id = o.stdout.trim().to_string();
    let w = c.vigil_in(work.path(), &[], &["job", "wait", &id], CMD_TIMEOUT);
    let out = std::fs::read_to_string(work.path().join(format!("vigil-{id}.out"))).unwrap_or_default();
    if w.timed_out || w.code != 0 {
        let ev = c.vigil_in(work.path(), &[], &["job", "eventlog", &id], CMD_TIMEOUT);
        let jobs = c.vigil_in(work.path(), &[], &["jobs", "-a"], CMD_TIMEOUT);
        panic!(
            "[{}] the batch job did not end well:\n{}\n--- eventlog ---\n{}\n--- jobs ---\n{}\n--- output ---\n{out}",
            c.name,
            w.dump(),
            ev.stdout,
            jobs.stdout
        );
    }
    eprintln!("[{}] nested uptime:\n{out}", c.name);
    assert!(out.contains("responder xdp (shared"), "{out}");
    assert!(out.contains("process-exit ebpf"), "{out}");
    assert!(!out.contains("lost child"), "{out}");
    // No detector fell back. The judge may say it is degraded: that reports how late this loaded machine ran
    // its timers (verdicts then wait longer), which is not a detector fallback.
    let fell_back = out
        .lines()
        .filter(|l| l.contains("detectors (rank") && !l.contains("): judge "))
        .any(|l| l.contains("userspace") || l.contains("none"));
    assert!(!fell_back, "{out}");
}

/// A stalled router forwards nothing: the ranks below it get no new work while it is torpid (shown with why),
/// and take work again once it resumes.
#[test]
fn ranks_behind_a_torpid_router_get_no_new_work() {
    // kary:2 on 7 nodes: rank 2 is the parent of ranks 5 and 6.
    let c = Cluster::up_with(7, &["--setattr=tbon.topo=kary:2"]);
    c.script(&["stall", &c.name, "2"]).ok();
    let since = Instant::now();
    c.wait_overlay_state(2, "torpid", since, Duration::from_millis(20));
    let (took, reason) = c.wait_overlay_state(5, "torpid", since, Duration::from_millis(20));
    eprintln!("[{}] rank 5 torpid after {}: {reason}", c.name, ms(took));
    assert!(reason.contains("behind torpid router rank 2"), "{reason:?}");
    assert_eq!(c.overlay_rank(6).0, "torpid");
    assert_eq!(c.overlay_rank(1).0, "online", "rank 1's subtree is not behind rank 2");
    // A ping to the stalled router gives up and says why.
    let p = c.vigil(&["ping", "--timeout", "1s", "2"]);
    assert!(p.code == 1 && p.stderr.contains("rank 2 is torpid"), "{}", p.dump());
    // With every other rank drained, a 2-node job could only go to ranks 5 and 6: it must wait.
    c.vigil(&["resource", "drain", "0-1,3-4", "test"]).ok();
    let o = c.vigil(&["submit", "-N2", "true"]);
    o.ok();
    let id = o.stdout.trim().to_string();
    std::thread::sleep(Duration::from_millis(1500));
    let jobs = c.vigil(&["jobs", "-a"]);
    let line = jobs.stdout.lines().find(|l| l.contains(&id)).unwrap_or("").to_string();
    assert!(line.split_whitespace().any(|w| w == "S"), "job should still wait for nodes: {line:?}\n{}", jobs.dump());
    c.script(&["cont", &c.name, "2"]).ok();
    let since = Instant::now();
    c.wait_overlay_state(2, "online", since, Duration::from_millis(20));
    let (took, _) = c.wait_overlay_state(5, "online", since, Duration::from_millis(20));
    eprintln!("[{}] rank 5 back online {} after rank 2 resumed", c.name, ms(took));
    assert_eq!(c.overlay_rank(6).0, "online");
    // Behind a lively router again: the job runs there.
    c.vigil(&["job", "wait", &id]).ok();
}

// ------------------------------------------------------------------------------------------- re-parenting

/// Wait (up to `limit`) until router rank 1 is lost and its children 3 and 4 are online under rank 2; the shape.
#[track_caller]
fn wait_healed(c: &Cluster, limit: Duration) -> Value {
    let healed = |v: &Value| {
        rank_entry(v, 1)["state"] == "lost"
            && [3, 4].iter().all(|&r| rank_entry(v, r)["state"] == "online" && rank_entry(v, r)["parent"] == 2)
    };
    let mut v = Value::Null;
    let ok = wait_for(limit, || {
        v = c.overlay();
        healed(&v)
    });
    assert!(ok, "[{}] ranks 3 and 4 did not re-parent under rank 2 within {limit:?}: {v}", c.name);
    v
}

/// The shape after rank 1's loss: 3 and 4 adopted by rank 2, every other rank online where it was.
#[track_caller]
fn assert_re_parented(c: &Cluster, v: &Value) {
    for r in [3, 4] {
        assert_eq!(rank_entry(v, r)["parent"], 2, "[{}] {v}", c.name);
        assert_eq!(rank_entry(v, r)["adopted"], true, "[{}] {v}", c.name);
    }
    assert_eq!(rank_entry(v, 2)["children"], serde_json::json!([3, 4, 5, 6]), "[{}] {v}", c.name);
    for r in [0, 2, 5, 6] {
        assert_eq!(rank_entry(v, r)["state"], "online", "[{}] {v}", c.name);
        assert_eq!(rank_entry(v, r)["adopted"], false, "[{}] {v}", c.name);
    }
}

/// Lines of task output "line RANK I TIME" by broker rank: (I, TIME) in the order printed.
fn job_lines(out: &str) -> BTreeMap<u32, Vec<(u32, f64)>> {
    let mut m: BTreeMap<u32, Vec<(u32, f64)>> = BTreeMap::new();
    for l in out.lines() {
        let w: Vec<&str> = l.split_whitespace().collect();
        if let ["line", r, i, ts] = w[..] {
            if let (Ok(r), Ok(i), Ok(ts)) = (r.parse(), i.parse(), ts.parse()) {
                m.entry(r).or_default().push((i, ts));
            }
        }
    }
    m
}

/// A router's node silently lost under a running job (re-parenting on, the default): its children, ranks 3 and 4,
/// both running the job, re-parent under its sibling rank 2; the job's output keeps flowing through them, none of
/// it lost or doubled (what was in flight through the router is sent again), and the job completes with exit code
/// 0. Only the router is lost, and `resource.eventlog` records each re-parent.
#[test]
fn a_lost_routers_children_re_parent_and_their_job_completes() {
    const LINES: u32 = 100;
    // kary:2 on 7 nodes: rank 1 routes for ranks 3 and 4; its sibling is rank 2.
    let c = Cluster::up_with(7, &["--setattr=tbon.topo=kary:2"]);
    eprintln!("[{}] detectors: {}", c.name, detectors(&c));
    // Ranks 0, 1 and 6 drained: the 4-node job runs on ranks 2-5, the router's children and two others.
    c.vigil(&["resource", "drain", "0-1,6", "test"]).ok();
    let progress = c.path().join("progress");
    std::fs::create_dir_all(&progress).unwrap();
    let script = format!(
        "for i in $(seq 1 {LINES}); do echo \"line $VIGIL_BROKER_RANK $i $(date +%s.%N)\"; \
         echo $i > {}/$VIGIL_BROKER_RANK; sleep 0.05; done",
        progress.display()
    );
    let mut cmd = vigil_cmd(c.path());
    cmd.env("VIGIL_URI", &c.uri).args(["run", "-N4", "-n4", "sh", "-c", &script]);
    let job = spawn(cmd, None);
    let step = |r: u32| -> u32 {
        std::fs::read_to_string(progress.join(r.to_string())).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0)
    };
    assert!(
        wait_for(Duration::from_secs(30), || (2..=5).all(|r| step(r) >= 15)),
        "[{}] the job's tasks did not all start on ranks 2-5: {:?}",
        c.name,
        (2..=5).map(step).collect::<Vec<_>>()
    );
    c.vigil(&["resource", "undrain", "0-1,6"]).ok();
    let at_kill: Vec<u32> = (2..=5).map(step).collect();
    let t_kill = c.kill_node(1);
    let v = wait_healed(&c, VERDICT);
    let t_healed = now_s();
    let out = job.wait(JOB_END);
    let ctx = || format!("{}\n--- overlay ---\n{v}", out.dump());
    assert!(!out.timed_out, "[{}] the job hung after the router's loss:\n{}", c.name, ctx());
    assert_eq!(out.code, 0, "[{}] the job did not complete with exit code 0:\n{}", c.name, ctx());

    // Every line of every task, once each and in order; the router's children went on writing after the loss.
    let lines = job_lines(&out.stdout);
    for r in 2..=5 {
        let got: Vec<u32> = lines.get(&r).map(|v| v.iter().map(|l| l.0).collect()).unwrap_or_default();
        assert_eq!(got, (1..=LINES).collect::<Vec<_>>(), "[{}] output of rank {r}:\n{}", c.name, ctx());
    }
    for r in [3, 4] {
        let after = lines[&r].iter().filter(|l| l.1 > t_kill).count();
        let after_healed = lines[&r].iter().filter(|l| l.1 > t_healed).count();
        assert!(after_healed > 0, "[{}] rank {r} wrote nothing after it re-parented:\n{}", c.name, ctx());
        eprintln!(
            "[{}] rank {r}: {after} lines written after the loss, {after_healed} after the re-parent was seen",
            c.name
        );
    }

    // The new shape; only the router lost; the record of the re-parents.
    assert_re_parented(&c, &c.overlay());
    assert_eq!(c.lost_ranks(), BTreeSet::from([1]), "[{}] only the router is lost", c.name);
    let log = c.resource_eventlog();
    let t_off = c.resource_event_time("offline", 1).unwrap_or_else(|| panic!("no offline event for rank 1: {log:?}"));
    for r in [3, 4] {
        let e = log
            .iter()
            .find(|e| e["name"] == "reparent" && e["context"]["idset"].as_str() == Some(r.to_string().as_str()))
            .unwrap_or_else(|| panic!("[{}] no reparent event for rank {r}: {log:?}", c.name));
        assert_eq!((&e["context"]["parent"], &e["context"]["lost"]), (&serde_json::json!(2), &serde_json::json!(1)));
        let took = e["context"]["ms"].as_f64().unwrap_or(-1.0);
        assert!(took >= 0.0, "[{}] the orphan's own re-parenting time is recorded: {e}", c.name);
        eprintln!(
            "[{}] rank {r} re-parented: recorded {} after the loss, {} after rank 0's lost verdict, {took:.0} ms \
             after its own",
            c.name,
            ms(e["timestamp"].as_f64().unwrap_or(0.0) - t_kill),
            ms(e["timestamp"].as_f64().unwrap_or(0.0) - t_off)
        );
    }
    for r in [0, 2, 3, 4, 5, 6] {
        assert!(c.resource_event_time("offline", r).is_none(), "[{}] rank {r} went offline: {log:?}", c.name);
    }
    eprintln!(
        "[{}] progress at the kill {at_kill:?}; lost verdict {} after it; job exit {} after {:.1}s",
        c.name,
        ms(t_off - t_kill),
        out.code,
        out.elapsed.as_secs_f64()
    );
}

/// A router that returns (a new broker on its node after a silent loss) joins its static parent again as a leaf:
/// its former children stay with their adopter, it learns their new parents (requests from its node reach them),
/// and it takes work again.
#[test]
fn a_returning_router_rejoins_as_a_leaf() {
    let c = Cluster::up_with(7, &["--setattr=tbon.topo=kary:2"]);
    let _ = detectors(&c);
    c.kill_node(1);
    wait_healed(&c, VERDICT);
    c.restart_node(1);
    let since = Instant::now();
    // A fresh broker: its start-up and its eBPF detectors take a few seconds on a busy machine.
    let mut v = Value::Null;
    let back = wait_for(Duration::from_secs(30), || {
        v = c.overlay();
        rank_entry(&v, 1)["state"] == "online"
    });
    assert!(back, "[{}] rank 1 did not come back online: {v}", c.name);
    eprintln!("[{}] rank 1 online again {} after its restart", c.name, ms(since.elapsed().as_secs_f64()));
    let leaf = |v: &Value| {
        assert_eq!(rank_entry(v, 1)["parent"], 0, "[{}] {v}", c.name);
        assert_eq!(rank_entry(v, 1)["children"], serde_json::json!([]), "[{}] a leaf: {v}", c.name);
        assert_eq!(rank_entry(v, 1)["adopted"], false, "[{}] {v}", c.name);
        assert_re_parented(&c, v);
    };
    leaf(&v);
    assert_eq!(c.lost_ranks(), BTreeSet::new(), "[{}] nothing is lost any more", c.name);
    let log = c.resource_eventlog();
    let (off, on) = (
        log.iter().position(|e| e["name"] == "offline" && e["context"]["idset"] == "1"),
        log.iter().rposition(|e| e["name"] == "online" && e["context"]["idset"] == "1"),
    );
    assert!(off.is_some() && on > off, "[{}] rank 1 should be offline, then online: {log:?}", c.name);
    // From the returned router's own node, its former children are reached through their adopter.
    for r in ["3", "4"] {
        let p = vigil_at(c.path(), &c.node_uri(1), &["ping", "--timeout", "5s", r], CMD_TIMEOUT);
        assert_eq!(p.code, 0, "[{}] ping {r} from rank 1:\n{}", c.name, p.dump());
        assert!(p.stdout.contains("hops=4"), "[{}] via rank 0 and rank 2:\n{}", c.name, p.dump());
    }
    // Work goes everywhere again, the returned router included.
    let run = c.vigil(&["run", "-N7", "-n7", "sh", "-c", "echo rank $VIGIL_BROKER_RANK"]);
    run.ok();
    let ranks: BTreeSet<&str> = run.stdout.lines().filter_map(|l| l.strip_prefix("rank ")).collect();
    assert_eq!(ranks, BTreeSet::from(["0", "1", "2", "3", "4", "5", "6"]), "{}", run.dump());
    // And it stays a leaf.
    std::thread::sleep(Duration::from_secs(1));
    leaf(&c.overlay());
}

// ------------------------------------------------------------------------------------------- overload

/// Busy loops at normal priority, killed when dropped.
struct Hogs(Vec<std::process::Child>);

impl Hogs {
    fn start(n: usize) -> Hogs {
        Hogs(
            (0..n)
                .map(|_| Command::new("sh").args(["-c", "while :; do :; done"]).spawn().expect("spawn a CPU hog"))
                .collect(),
        )
    }
}

impl Drop for Hogs {
    fn drop(&mut self) {
        for h in &mut self.0 {
            let _ = h.kill();
            let _ = h.wait();
        }
    }
}

/// Ranks whose overlay state is `state`, from one `vigil overlay status --json`.
fn ranks_in(c: &Cluster, state: &str) -> BTreeSet<u32> {
    let o = c.vigil(&["overlay", "status", "--json"]);
    if o.code != 0 {
        return BTreeSet::new();
    }
    o.json()["ranks"]
        .as_array()
        .map(|a| {
            a.iter().filter(|r| r["state"] == state).filter_map(|r| r["rank"].as_u64()).map(|r| r as u32).collect()
        })
        .unwrap_or_default()
}

/// Under overload, two CPU hogs per core and every frame between nodes delayed 50 ms ± 50 ms and 2 % of them
/// lost (`ci/netns-cluster.sh impair`: this kernel has no netem, so the test bed's bridge is replaced by
/// `vigil-bench netswitch`), no live node is ever declared lost, jobs still run, and a silently killed node is
/// still lost, and no other. Here the links are impaired before the brokers start: every judge learns the
/// links' pace as it arms. Ignored by default (it loads the whole machine, which would slow every test beside
/// it): `ci/test.sh` runs it alone.
#[test]
#[ignore]
fn under_overload_a_silent_loss_is_lost_and_no_live_node_is() {
    if !nix_is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    overloaded(Cluster::up_impaired(6, "50 50 2 42"), false);
}

/// The same, with the links slowed down all at once under a running instance, with the CPU hogs already
/// running: every judge's past says the links are fast. A parent sees its children silent together
/// (`probe::correlated_silence`); a child, which probes its parent's node alone, does not judge it on missed
/// probes but by the TCP rule, confirmed (`membership.rs`).
#[test]
#[ignore]
fn under_overload_at_its_onset_a_silent_loss_is_lost_and_no_live_node_is() {
    if !nix_is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    overloaded(Cluster::up(6), true);
}

/// The body of the two overload tests: `c` has 6 nodes; `onset`: impair its links once the hogs run.
fn overloaded(c: Cluster, onset: bool) {
    let d = detectors(&c);
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let _hogs = Hogs::start(2 * cores);
    if onset {
        std::thread::sleep(Duration::from_secs(1));
        c.script(&["impair", &c.name, "50", "50", "2", "42"]).ok();
    }
    eprintln!("[{}] {} hogs, links 50 ms ± 50 ms, 2 % loss; detectors {d}", c.name, 2 * cores);
    // 10 s of overload with jobs flowing: nobody lost.
    let since = Instant::now();
    let mut torpid_seen = BTreeSet::new();
    let mut runs = 0;
    while since.elapsed() < Duration::from_secs(10) {
        let r = c.vigil_in(c.path(), &[], &["run", "-N6", "true"], JOB_END);
        assert_eq!(r.code, 0, "a job across the live nodes failed under overload:\n{}", r.dump());
        runs += 1;
        torpid_seen.extend(ranks_in(&c, "torpid"));
        assert_eq!(c.lost_ranks(), BTreeSet::new(), "a live node was declared lost under overload");
    }
    eprintln!("[{}] {runs} jobs of 6 nodes ran in 10 s; ranks seen torpid: {torpid_seen:?}", c.name);
    let since = Instant::now();
    let t0 = c.kill_node(4);
    let (took, reason) = c.wait_overlay_state(4, "lost", since, Duration::from_millis(20));
    let ev = c.resource_event_time("offline", 4).map(|t| ms(t - t0)).unwrap_or_else(|| "none".into());
    eprintln!(
        "[{}] under overload, silent node loss -> lost: seen by polling after {}, offline event after {ev}; \
         reason: {reason}",
        c.name,
        ms(took)
    );
    // A few more seconds: the loss changed nothing for the others, and jobs run on the survivors.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(c.lost_ranks(), BTreeSet::from([4]), "{}", c.vigil(&["overlay", "status"]).stdout);
    let r = c.vigil_in(c.path(), &[], &["run", "-N5", "true"], JOB_END);
    assert_eq!(r.code, 0, "{}", r.dump());
    let log = c.resource_eventlog();
    let offline: Vec<&Value> = log.iter().filter(|e| e["name"] == "offline").collect();
    assert_eq!(offline.len(), 1, "only rank 4 may go offline: {offline:?}");
}

// ------------------------------------------------- failure events to the survivors (issue 38, item 3)

/// A PMIx client that registers one handler for `PMIX_EVENT_NODE_DOWN` and `PMIX_ERR_PROC_ABORTED` (the code Open
/// MPI's ULFM registers for), says it is ready (a file `ready.RANK` in `$READY_DIR`), and prints each event when it
/// comes: `node-down` or `proc-aborted`, the lost processes (for node-down, `PMIX_EVENT_AFFECTED_PROCS`; for
/// proc-aborted, the `PMIX_EVENT_AFFECTED_PROC` entries, one process each, as ULFM reads them), the lost hosts
/// (`vigil.lost.hosts`) and the wall time of its arrival. It exits 0 a second after both events, 4 without them in
/// 60 s.
const NODE_DOWN_C: &str = r#"
#include <pmix.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static volatile int got; /* 1: node-down, 2: proc-aborted */
static pmix_proc_t me;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static void handler(size_t id, pmix_status_t status, const pmix_proc_t *source, pmix_info_t info[], size_t ninfo,
                    pmix_info_t results[], size_t nresults, pmix_event_notification_cbfunc_fn_t cbfunc,
                    void *cbdata) {
    double t = now();
    char lost[4096] = "", hosts[1024] = "";
    int down = status == PMIX_EVENT_NODE_DOWN;
    for (size_t i = 0; i < ninfo; i++) {
        if (down && PMIX_CHECK_KEY(&info[i], PMIX_EVENT_AFFECTED_PROCS) && info[i].value.type == PMIX_DATA_ARRAY) {
            pmix_data_array_t *a = info[i].value.data.darray;
            pmix_proc_t *p = (pmix_proc_t *)a->array;
            for (size_t k = 0; k < a->size && strlen(lost) < sizeof lost - 16; k++)
                sprintf(lost + strlen(lost), "%s%u", k ? "," : "", p[k].rank);
        } else if (!down && info[i].value.type == PMIX_PROC && strlen(lost) < sizeof lost - 16) {
            sprintf(lost + strlen(lost), "%s%u", lost[0] ? "," : "", info[i].value.data.proc->rank);
        } else if (PMIX_CHECK_KEY(&info[i], "vigil.lost.hosts") && info[i].value.type == PMIX_STRING) {
            snprintf(hosts, sizeof hosts, "%s", info[i].value.data.string);
        }
    }
    printf("event %s rank %u lost %s hosts %s at %.6f\n", down ? "node-down" : "proc-aborted", me.rank, lost, hosts,
           t);
    fflush(stdout);
    got |= down ? 1 : 2;
    if (cbfunc)
        cbfunc(PMIX_EVENT_ACTION_COMPLETE, NULL, 0, NULL, NULL, cbdata);
}

int main(void) {
    if (PMIx_Init(&me, NULL, 0) != PMIX_SUCCESS) {
        fprintf(stderr, "PMIx_Init failed\n");
        return 2;
    }
    pmix_status_t codes[2] = {PMIX_EVENT_NODE_DOWN, PMIX_ERR_PROC_ABORTED};
    pmix_status_t rc = PMIx_Register_event_handler(codes, 2, NULL, 0, handler, NULL, NULL);
    if (rc < 0) {
        fprintf(stderr, "rank %u: PMIx_Register_event_handler: %s\n", me.rank, PMIx_Error_string(rc));
        return 3;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/ready.%u", getenv("READY_DIR"), me.rank);
    FILE *f = fopen(path, "w");
    if (f)
        fclose(f);
    for (int i = 0; i < 60000 && got != 3; i++)
        usleep(1000);
    if (got != 3) {
        fprintf(stderr, "rank %u: not both events within 60 s (%d)\n", me.rank, got);
        return 4;
    }
    sleep(1);
    PMIx_Finalize(NULL, 0);
    return 0;
}
"#;

/// Task 0 also follows the job's eventlog from inside the job, as a script that does not speak PMIx would (the
/// documented answer to "which node died?"): the first `node-failure` exception is printed with its arrival time.
const EVENTLOG_SH: &str = r#"#!/bin/sh
# $1: the vigil command, $2: the PMIx program.
if [ "$VIGIL_TASK_RANK" = 0 ]; then
    "$1" job eventlog -f --json "$VIGIL_JOB_ID" | grep -m1 '"node-failure"' | while read -r l; do
        echo "eventlog at $(date +%s.%N) $l"
    done &
fi
exec "$2"
"#;

/// The node-down program compiled against OpenPMIx into `dir`, and the wrapper script; `None` (saying why) where
/// libpmix, a C compiler or the `vigil-pmix` helper is missing.
fn node_down_prog(dir: &Path) -> Option<(PathBuf, PathBuf)> {
    if !bin_dir().join("vigil-pmix").exists() {
        eprintln!("SKIPPED: vigil-pmix is not built beside vigil (cargo build -p vigil-pmix; needs libpmix-dev)");
        return None;
    }
    let flags = |what: &str| {
        Command::new("pkg-config")
            .args([what, "pmix"])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).split_whitespace().map(String::from).collect::<Vec<_>>())
    };
    let (Some(cflags), Some(libs)) = (flags("--cflags"), flags("--libs")) else {
        eprintln!("SKIPPED: pkg-config finds no pmix (apt-get install libpmix-dev)");
        return None;
    };
    let (src, prog) = (dir.join("node_down.c"), dir.join("node_down"));
    std::fs::write(&src, NODE_DOWN_C).unwrap();
    let out = match Command::new("cc").args(&cflags).arg("-o").arg(&prog).arg(&src).args(&libs).output() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("SKIPPED: cannot run cc: {e}");
            return None;
        }
    };
    assert!(out.status.success(), "cc failed:\n{}", String::from_utf8_lossy(&out.stderr));
    let script = dir.join("eventlog.sh");
    std::fs::write(&script, EVENTLOG_SH).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    Some((prog, script))
}

/// Latencies of one trial of [`survivors_are_told_which_node_died`], seconds.
struct NotifyTrial {
    /// Kill → the `node-failure` exception (the verdict).
    verdict: f64,
    /// Kill → the PMIx node-down event in each survivor (tasks 0-2).
    events: Vec<f64>,
    /// Kill → the PMIx proc-aborted event (ULFM's) in each survivor (tasks 0-2).
    aborted: Vec<f64>,
    /// Kill → the exception read by `vigil job eventlog -f` inside the job.
    eventlog: f64,
}

/// `vigil run -N4 -n4 -o pmi=pmix -o on-node-loss=notify` of the node-down program on 4 netns nodes; node3 is
/// killed silently once every task has registered its handler. Checked: the job exits 0; each survivor got one
/// `PMIX_ERR_PROC_ABORTED` (ULFM's code) and one `PMIX_EVENT_NODE_DOWN`, each naming task 3 and node3; task 0's `vigil job eventlog -f` saw the severity-2 exception
/// with the lost host, task and shell ranks; the leader shell said it once on stderr.
fn notify_trial(prog: &Path, script: &Path) -> NotifyTrial {
    let c = Cluster::up(4);
    let ready = c.path().join("ready");
    std::fs::create_dir_all(&ready).unwrap();
    let ready_env = format!("--env=READY_DIR={}", ready.display());
    let args = [
        "run",
        "-N4",
        "-n4",
        "-l",
        "-o",
        "pmi=pmix",
        "-o",
        "on-node-loss=notify",
        &ready_env,
        script.to_str().unwrap(),
        vigil_bin(),
        prog.to_str().unwrap(),
    ];
    let (run, t0) = std::thread::scope(|s| {
        let run = s.spawn(|| c.vigil_in(c.path(), &[], &args, JOB_END));
        let all_ready = wait_for(Duration::from_secs(60), || (0..4).all(|r| ready.join(format!("ready.{r}")).exists()));
        if !all_ready {
            let jobs = c.json(&["jobs", "--json"]);
            c.vigil(&["cancel", jobs["jobs"][0]["id_f58"].as_str().unwrap_or_default()]);
            panic!("the tasks did not all register their handler: {jobs}\n{}", run.join().unwrap().dump());
        }
        let t0 = c.kill_node(3);
        (run.join().unwrap(), t0)
    });
    run.ok();
    let id = c.json(&["jobs", "-a", "--json"])["jobs"][0]["id_f58"].as_str().unwrap_or_default().to_string();
    let log = c.job_eventlog(&id);
    let ex = exceptions(&log);
    assert_eq!(ex.len(), 1, "one exception expected: {log:?}");
    let ctx = &ex[0]["context"];
    // What the exception says was lost: type, severity, hosts, task ranks, shell ranks.
    let want = serde_json::json!(["node-failure", 2, "node3", "3", "3"]);
    let got = |c: &Value| Value::from_iter(["type", "severity", "hosts", "tasks", "shell_ranks"].map(|k| c[k].clone()));
    assert_eq!(got(ctx), want, "{ctx}");
    let verdict = ex[0]["timestamp"].as_f64().unwrap_or(0.0) - t0;

    let mut events = BTreeMap::new();
    let mut aborted = BTreeMap::new();
    let mut eventlog = None;
    for l in run.lines() {
        let (task, rest) = l.split_once(": ").unwrap_or_else(|| panic!("unlabelled line {l:?}:\n{}", run.dump()));
        let task: u32 = task.parse().unwrap_or_else(|_| panic!("bad label in {l:?}"));
        if let Some(rest) = rest.strip_prefix("event ") {
            let w: Vec<&str> = rest.split_whitespace().collect();
            // node-down|proc-aborted rank R lost 3 hosts node3 at T
            assert_eq!(w.len(), 9, "{l:?}");
            assert_eq!(
                (w[1], w[2], w[3], w[4], w[5], w[6]),
                ("rank", &*task.to_string(), "lost", "3", "hosts", "node3"),
                "{l:?}"
            );
            let at: f64 = w[8].parse().unwrap_or_else(|_| panic!("bad time in {l:?}"));
            let seen = match w[0] {
                "node-down" => &mut events,
                "proc-aborted" => &mut aborted,
                k => panic!("unexpected event {k:?} in {l:?}"),
            };
            assert!(seen.insert(task, at - t0).is_none(), "task {task} got {} twice:\n{}", w[0], run.dump());
        } else if let Some(rest) = rest.strip_prefix("eventlog at ") {
            let (at, json) = rest.split_once(' ').unwrap_or_else(|| panic!("{l:?}"));
            let e: Value = serde_json::from_str(json).unwrap_or_else(|e| panic!("{l:?}: {e}"));
            assert_eq!(got(&e["context"]), want, "{l:?}");
            eventlog = Some(at.parse::<f64>().unwrap_or_else(|_| panic!("{l:?}")) - t0);
        } else {
            panic!("unexpected line {l:?}:\n{}", run.dump());
        }
    }
    assert_eq!(events.keys().copied().collect::<Vec<_>>(), vec![0, 1, 2], "each survivor once:\n{}", run.dump());
    assert_eq!(aborted.keys().copied().collect::<Vec<_>>(), vec![0, 1, 2], "each survivor once:\n{}", run.dump());
    let said = "vigil-shell: lost node node3 (rank 3), where task 3 ran; the job continues on the remaining nodes";
    assert_eq!(run.stderr.matches(said).count(), 1, "the leader shell says it once:\n{}", run.dump());
    let eventlog = eventlog.unwrap_or_else(|| panic!("task 0's eventlog follower saw nothing:\n{}", run.dump()));
    let t = NotifyTrial {
        verdict,
        events: events.into_values().collect(),
        aborted: aborted.into_values().collect(),
        eventlog,
    };
    eprintln!(
        "[{}] kill -> exception {}, -> PMIx node-down in the survivors {} (proc-aborted {}), -> eventlog -f in the \
         job {}",
        c.name,
        ms(t.verdict),
        t.events.iter().map(|e| ms(*e)).collect::<Vec<_>>().join(", "),
        t.aborted.iter().map(|e| ms(*e)).collect::<Vec<_>>().join(", "),
        ms(t.eventlog)
    );
    t
}

/// The median of `v` (not empty).
fn p50(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Issue 38, item 3: a job that asks for it (`-o on-node-loss=notify`) survives a silent node loss, and each of its
/// surviving tasks learns which processes and node were lost: through PMIx (`PMIX_EVENT_NODE_DOWN` from each
/// node's `vigil-pmix`), and without PMIx through `vigil job eventlog -f` inside the job. `VIGIL_NOTIFY_TRIALS`
/// (default 1) runs more trials for the latency figures (printed, never asserted); `VIGIL_NOTIFY_JSON=FILE` writes
/// every trial's figures there after each trial (`bench/node-down.sh`).
#[test]
fn survivors_are_told_which_node_died() {
    if !nix_is_root() {
        eprintln!("SKIPPED: network-namespace nodes need root");
        return;
    }
    let dir = tempdir();
    let Some((prog, script)) = node_down_prog(dir.path()) else { return };
    let trials: usize = std::env::var("VIGIL_NOTIFY_TRIALS").ok().and_then(|v| v.parse().ok()).unwrap_or(1).max(1);
    let json_out = std::env::var_os("VIGIL_NOTIFY_JSON").map(PathBuf::from);
    let mut all: Vec<NotifyTrial> = Vec::new();
    for _ in 0..trials {
        all.push(notify_trial(&prog, &script));
        if let Some(path) = &json_out {
            // Seconds after the kill, per trial: the verdict, each survivor's PMIx event, the eventlog follower.
            let v: Vec<Value> = all
                .iter()
                .map(|t| {
                    serde_json::json!({"verdict": t.verdict, "events": t.events, "aborted": t.aborted,
                                       "eventlog": t.eventlog})
                })
                .collect();
            std::fs::write(path, serde_json::to_string_pretty(&serde_json::json!({"trials": v})).unwrap()).unwrap();
        }
    }
    let events: Vec<f64> = all.iter().flat_map(|t| t.events.iter().copied()).collect();
    let after: Vec<f64> = all.iter().flat_map(|t| t.events.iter().map(move |e| e - t.verdict)).collect();
    eprintln!(
        "{trials} trial(s), {} events: kill -> PMIx event p50 {} (max {}); exception -> event p50 {}; \
         kill -> exception p50 {}; kill -> eventlog -f p50 {}",
        events.len(),
        ms(p50(events.clone())),
        ms(events.iter().copied().fold(0.0, f64::max)),
        ms(p50(after)),
        ms(p50(all.iter().map(|t| t.verdict).collect())),
        ms(p50(all.iter().map(|t| t.eventlog).collect())),
    );
}

// ------------------------------------------------------------------ fabric-down (issue 40, item 1)

impl Cluster {
    /// A cluster whose nodes also have a fabric (`VIGIL_NETNS_FABRIC=1`: `fab0` on a second bridge, 10.201.0.0/16,
    /// named as every host's `job_network`, so each parent probes its children on it too).
    #[track_caller]
    fn up_fabric(size: u32, extra: &[&str]) -> Cluster {
        let name = claim_name();
        let dir = tempdir();
        let mut c = Cluster { name, uri: String::new(), dir };
        let (n, sz) = (c.name.clone(), size.to_string());
        let mut args = vec!["up", n.as_str(), sz.as_str()];
        args.extend_from_slice(extra);
        let mut cmd = c.command(&args);
        cmd.env("VIGIL_NETNS_FABRIC", "1");
        run(cmd, SCRIPT_TIMEOUT, None).ok();
        let uri = c.script(&["uri", &n]);
        uri.ok();
        c.uri = uri.stdout.trim().to_string();
        c
    }

    /// The entry of `rank` in `vigil resource status --json` (state, reason, liveness).
    #[track_caller]
    fn resource_rank(&self, rank: u32) -> Value {
        rank_entry(&self.json(&["resource", "status", "--json"]), rank)
    }
}

/// `examples/mpi/allreduce_loop.c` compiled into `dir` with `mpicc` (MPICH), or `None` (said) without it.
fn allreduce_loop(dir: &Path) -> Option<PathBuf> {
    let src = repo_root().join("examples/mpi/allreduce_loop.c");
    let bin = dir.join("allreduce_loop");
    match Command::new("mpicc").arg("-O1").arg("-o").arg(&bin).arg(&src).output() {
        Ok(o) if o.status.success() => Some(bin),
        Ok(o) => panic!("mpicc failed:\n{}", String::from_utf8_lossy(&o.stderr)),
        Err(e) => {
            eprintln!("no mpicc ({e}): the fabric-down test runs a sleep job instead of an MPICH allreduce loop");
            None
        }
    }
}

/// A job on 4 nodes whose traffic crosses the fabric (an MPICH allreduce loop, its UCX TCP transport on `fab0`);
/// node3's fabric link is cut, its management link left alone: the job gets a fatal `node-failure` exception
/// naming the fault, node3 is drained `fabric-down: fab0` and stays online (not lost), no other node is touched.
/// After the link is healed and the admin undrains node3, a 4-node job runs again.
///
/// `VIGIL_FABRIC_TRIALS=N` repeats cut, verdict, heal and undrain N times on the same cluster, and
/// `VIGIL_FABRIC_JSON=PATH` writes each trial's figures there (`bench/fabric-down.sh`).
#[test]
fn fabric_down_fails_the_job_and_drains_the_node_not_lost() {
    let c = Cluster::up_fabric(4, &[]);
    // Each broker says where its job network is answered, and the parent probes its 3 children there too.
    let st = c.vigil(&["overlay", "status"]);
    assert!(st.stdout.contains("job-network fab0 (10.201.0.1:"), "rank 0's job network:\n{}", st.dump());
    assert!(st.stdout.contains("3 also on their job network"), "rank 0's prober:\n{}", st.dump());
    let prog = allreduce_loop(c.path());
    let trials: usize = std::env::var("VIGIL_FABRIC_TRIALS").ok().and_then(|v| v.parse().ok()).unwrap_or(1).max(1);
    let mut figures = Vec::new();
    for trial in 0..trials {
        figures.push(fabric_trial(&c, prog.as_deref(), trial));
    }
    if let Some(path) = std::env::var_os("VIGIL_FABRIC_JSON") {
        let v = serde_json::json!({"job": if prog.is_some() { "mpich-allreduce-loop" } else { "sleep" },
            "trials": figures});
        std::fs::write(&path, format!("{v}\n")).expect("write VIGIL_FABRIC_JSON");
    }
    // After the last heal and undrain: a 4-node job runs again. (A plain one: an MPICH allreduce loop run here
    // does its steps over the healed fabric, but was seen to hang in MPI_Finalize afterwards, in UCX's teardown.)
    let r = c.vigil_in(c.path(), &[], &["run", "-N4", "-n4", "true"], JOB_END);
    assert_eq!(r.code, 0, "a job after the heal and undrain:\n{}", r.dump());
    assert_eq!(c.resource_rank(3)["state"], "avail");
}

/// MPICH (ch4:ucx) over TCP on the fabric interface only.
const FABRIC_UCX: [(&str, &str); 2] = [("UCX_TLS", "tcp"), ("UCX_NET_DEVICES", "fab0")];

/// One trial of [`fabric_down_fails_the_job_and_drains_the_node_not_lost`]: a job on the 4 nodes, node3's fabric
/// cut, the checks, then heal and undrain. Returns the trial's figures (seconds after the cut).
fn fabric_trial(c: &Cluster, prog: Option<&Path>, trial: usize) -> Value {
    let cmd: Vec<String> = match prog {
        Some(p) => vec![p.display().to_string(), "120".into()],
        None => vec!["sleep".into(), "120".into()],
    };
    let mut args = vec!["submit", "-N4", "-n4"];
    args.extend(cmd.iter().map(String::as_str));
    let o = c.vigil_in(c.path(), &FABRIC_UCX, &args, CMD_TIMEOUT);
    o.ok();
    let id = o.stdout.trim().to_string();
    let is_task = |cl: &str| cl.starts_with(&cmd.join(" "));
    let started =
        wait_for(Duration::from_secs(30), || (0..4).all(|k| c.node_processes(k).iter().any(|(_, cl)| is_task(cl))));
    assert!(started, "the job's tasks did not start on every node: {}", c.json(&["jobs", "-a", "--json"]));
    // The allreduce loop is under way (its ranks connected over the fabric), or the sleep job runs.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(c.job(&id)["state"], "RUN", "{}", c.job(&id));

    let before = now_s();
    let cut = c.script(&["fcut", &c.name, "3"]);
    cut.ok();
    let t0 = cut.stdout.trim().parse::<f64>().unwrap_or(before);
    let w = c.vigil_in(c.path(), &[], &["job", "wait", &id], JOB_END);
    assert!(!w.timed_out, "job wait hung:\n{}", w.dump());
    assert_ne!(w.code, 0, "the job failed:\n{}", w.dump());
    let log = c.job_eventlog(&id);
    let ex = exceptions(&log);
    let ctx = &ex.first().unwrap_or_else(|| panic!("no exception: {log:?}"))["context"];
    assert_eq!((ctx["type"].as_str(), ctx["severity"].as_u64()), (Some("node-failure"), Some(0)), "{log:?}");
    let note = ctx["note"].as_str().unwrap_or("");
    assert!(note.starts_with("fabric-down: fab0 on node node3 (rank 3)"), "{note}");
    let exception = ex[0]["timestamp"].as_f64().unwrap_or(0.0) - t0;
    // This trial's drain: the last one of rank 3.
    let drained = c
        .resource_eventlog()
        .iter()
        .rev()
        .find(|e| e["name"] == "drain" && idset_has(e["context"]["idset"].as_str().unwrap_or(""), 3))
        .and_then(|e| e["timestamp"].as_f64())
        .map(|t| t - t0);
    eprintln!(
        "[{}] trial {trial}: fabric cut -> job exception {}, drain {} ({}): {note}",
        c.name,
        ms(exception),
        drained.map(ms).unwrap_or_default(),
        if prog.is_some() { "MPICH allreduce loop on the fabric" } else { "sleep job" }
    );

    // Drained with the reason, online, not lost; the others untouched.
    let r3 = c.resource_rank(3);
    assert_eq!((r3["state"].as_str(), r3["reason"].as_str()), (Some("drained"), Some("fabric-down: fab0")), "{r3}");
    assert_eq!(c.overlay_rank(3).0, "online");
    assert!(c.lost_ranks().is_empty(), "{:?}", c.lost_ranks());
    for k in 0..3 {
        let r = c.resource_rank(k);
        assert_eq!(r["state"], "avail", "rank {k}: {r}");
        assert_eq!(c.overlay_rank(k).0, "online", "rank {k}");
    }
    let text = c.vigil(&["resource", "status"]);
    assert!(text.stdout.contains("fabric-down: fab0"), "{}", text.dump());
    // Its tasks there are gone too (killed with the job; its broker was told over the management network).
    assert!(
        wait_for(Duration::from_secs(10), || !c.node_processes(3).iter().any(|(_, cl)| is_task(cl))),
        "tasks left on node3: {:?}",
        c.node_leftovers(3)
    );

    // Healed, and undrained by the admin.
    c.script(&["fheal", &c.name, "3"]).ok();
    c.vigil(&["resource", "undrain", "3"]).ok();
    // The parent learns the job network's pace again before the next cut (8 answers).
    std::thread::sleep(Duration::from_millis(500));
    serde_json::json!({"exception": exception, "drain": drained})
}
