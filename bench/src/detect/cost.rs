//! (f) CPU cost of the prober: a parent probing `--cost-children` children every `tbon.probe_period`.
//!
//! The harness starts `vigil start --test-size=N+1 -S tbon.topo=kary:0` (flat: rank 0 is the parent of every
//! other broker) whose initial program is this binary (`vigil-bench inner probe-cost`). The inner program
//! waits until every rank is online and rank 0's detectors are loaded, lets the instance settle, then reads
//! the CPU time (utime + stime, `/proc/PID/stat`) of rank 0's broker (its parent process), of all the
//! instance's brokers, and the machine's softirq time (`/proc/stat`) before and after `--cost-idle-s` seconds
//! of idleness. Each variant runs in a fresh instance: default probes, and probes effectively off
//! (`-S tbon.probe_period=3600s`); the variants alternate `--cost-runs` times.
//!
//! On one machine the children's XDP responder (on `lo`) runs in the softirq that the sender's `sendto`
//! raises, so the kernel's answering work may be billed to rank 0 as system time (or to softirq time).

use crate::{last_line, now_epoch_s, r4, run_captured, scratch_file, Captured};
use clap::Args;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// One variant of the cost measurement: its name and the extra broker attributes.
const VARIANTS: &[(&str, &[&str])] = &[
    ("probes off (tbon.probe_period=3600s)", &["tbon.probe_period=3600s"]),
    ("default probes", &["tbon.probe_period=10ms"]),
];

/// Set in every variant: the node defaults, which `vigil start` would otherwise stretch for hundreds of brokers
/// packed onto this machine's CPUs (its `packed_periods`). What is measured is a parent's cost on a real node.
const NODE_PERIODS: [&str; 2] = ["tbon.heartbeat_period=50ms", "tbon.torpid_max=500ms"];

/// Options of the hidden `vigil-bench inner probe-cost`.
#[derive(Args, Debug)]
pub(crate) struct InnerCostArgs {
    /// Number of brokers expected in the instance.
    #[arg(long)]
    expect: usize,
    /// Seconds of idleness measured.
    #[arg(long)]
    idle_s: f64,
    /// Seconds to let the instance settle once every rank is online and the detectors are loaded.
    #[arg(long, default_value_t = 3.0)]
    settle_s: f64,
    /// File receiving the JSON results.
    #[arg(long)]
    out: PathBuf,
}

/// What the inner program measured.
#[derive(Serialize, Deserialize, Debug, Default, Clone)]
pub(super) struct CostSample {
    /// Wall time between the two readings, seconds.
    wall_s: f64,
    /// CPU time of rank 0's broker over that time, seconds.
    rank0_cpu_s: f64,
    /// CPU time of every broker of the instance, seconds.
    brokers_cpu_s: f64,
    /// Softirq time of the whole machine (all CPUs), seconds.
    softirq_s: f64,
    /// Rank 0's detectors, as `broker.info` reports them.
    detectors: Value,
    /// Seconds from instance start until every rank was online and the detectors loaded.
    ready_s: f64,
    /// Ranks online when the instance was deemed ready.
    online_start: usize,
    /// Brokers of the instance running when the measurement started.
    brokers_start: usize,
    /// Ranks online at the end (children wrongly declared lost meanwhile are missing here).
    online_end: usize,
    /// Ranks lost while measuring (from `overlay.status`: `lost` states at the end).
    lost_end: usize,
    /// UDP datagrams dropped because a socket's receive buffer was full (`/proc/net/snmp` RcvbufErrors),
    /// machine-wide, over the measurement.
    udp_rcvbuf_errors: u64,
    /// Why the measurement failed, if it did.
    error: Option<String>,
}

/// Clock ticks per second of `/proc` CPU times.
fn clk_tck() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// utime + stime of `pid`, seconds.
fn proc_cpu_s(pid: i32) -> Option<f64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may contain spaces) start after the last ')'.
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ut: f64 = f.get(11)?.parse().ok()?;
    let st: f64 = f.get(12)?.parse().ok()?;
    Some((ut + st) / clk_tck())
}

/// Softirq time of all CPUs (`/proc/stat`, first line, 7th value), seconds.
fn softirq_s() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/stat").ok()?;
    let l = s.lines().next()?;
    let v: f64 = l.split_whitespace().nth(7)?.parse().ok()?;
    Some(v / clk_tck())
}

/// UDP `RcvbufErrors` of this network namespace (`/proc/net/snmp`).
fn udp_rcvbuf_errors() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/net/snmp").ok()?;
    let mut udp = s.lines().filter(|l| l.starts_with("Udp:"));
    let (head, vals) = (udp.next()?, udp.next()?);
    let i = head.split_whitespace().position(|h| h == "RcvbufErrors")?;
    vals.split_whitespace().nth(i)?.parse().ok()
}

/// (online, lost) rank counts of `overlay.status`.
fn overlay_counts(
    rt: &tokio::runtime::Runtime,
    client: &vigil::client::Client,
) -> Result<(usize, usize, Value), String> {
    let st = rt.block_on(client.rpc("overlay.status", 0, &json!({}))).map_err(|e| format!("overlay.status: {e}"))?;
    // Count like ci/netns-cluster.sh does: the ranks may be nested as a tree.
    let text = st["ranks"].to_string();
    Ok((text.matches("\"state\":\"online\"").count(), text.matches("\"state\":\"lost\"").count(), st))
}

/// Pids of the brokers of the instance whose run directory is `rundir`.
fn broker_pids(rundir: &Path) -> Vec<i32> {
    let want = format!("--rundir={}", rundir.display());
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir("/proc") else { return out };
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else { continue };
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else { continue };
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        if args.get(1) == Some(&b"broker".as_slice()) && args.contains(&want.as_bytes()) {
            out.push(pid);
        }
    }
    out
}

/// `vigil-bench inner probe-cost`: measure, write the JSON results, exit 0 only if everything was measured.
pub(crate) fn inner(a: InnerCostArgs) -> i32 {
    let mut res = CostSample::default();
    if let Err(e) = inner_measure(&a, &mut res) {
        eprintln!("vigil-bench inner: {e}");
        res.error = Some(e);
    }
    crate::write_inner_result(&a.out, &res, res.error.is_none())
}

/// Wait for the instance, then take the two readings.
fn inner_measure(a: &InnerCostArgs, res: &mut CostSample) -> Result<(), String> {
    let t_start = Instant::now();
    let uri = std::env::var(vigil::client::URI_ENV)
        .map_err(|_| "VIGIL_URI is not set: run me inside `vigil start`".to_string())?;
    let sock = PathBuf::from(vigil::client::uri_to_path(&uri).map_err(|e| e.to_string())?);
    let rundir = sock.parent().ok_or_else(|| format!("no run directory in {uri}"))?.to_path_buf();
    // SAFETY: getppid has no preconditions.
    let rank0 = unsafe { libc::getppid() };
    let cmdline = std::fs::read(format!("/proc/{rank0}/cmdline")).unwrap_or_default();
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    if args.get(1) != Some(&b"broker".as_slice()) || !args.contains(&b"--rank=0".as_slice()) {
        return Err(format!("my parent {rank0} is not rank 0's broker"));
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start tokio: {e}"))?;
    let client =
        rt.block_on(vigil::client::Client::connect(&uri)).map_err(|e| format!("cannot connect to {uri}: {e}"))?;
    // Ready when every rank is online, or (children being wrongly declared lost) when the count of online
    // ranks has not changed for 5 s; with the detectors loaded either way.
    let deadline = Instant::now() + Duration::from_secs(300);
    let (mut last, mut since) = (0, Instant::now());
    loop {
        let (online, _, st) = overlay_counts(&rt, &client)?;
        let loading = st["detectors"].to_string().contains("loading");
        if online != last {
            (last, since) = (online, Instant::now());
        }
        if !loading && (online >= a.expect || (online > 1 && since.elapsed() >= Duration::from_secs(5))) {
            res.detectors = st["detectors"].clone();
            res.online_start = online;
            break;
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "instance not ready after 300 s: {online} of {} online, detectors {}",
                a.expect, st["detectors"]
            ));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    res.ready_s = r4(t_start.elapsed().as_secs_f64());
    std::thread::sleep(Duration::from_secs_f64(a.settle_s.max(0.0)));
    let pids = broker_pids(&rundir);
    // Children wrongly declared lost exit: record how many brokers were left rather than fail.
    res.brokers_start = pids.len();
    if pids.is_empty() {
        return Err(format!("found no brokers of {}", rundir.display()));
    }
    let read = || -> Result<(f64, f64, f64, u64, Instant), String> {
        let r0 = proc_cpu_s(rank0).ok_or("cannot read rank 0's CPU time")?;
        let all: f64 = pids.iter().filter_map(|p| proc_cpu_s(*p)).sum();
        let si = softirq_s().ok_or("cannot read /proc/stat")?;
        Ok((r0, all, si, udp_rcvbuf_errors().unwrap_or(0), Instant::now()))
    };
    let (r0a, alla, sia, ea, ta) = read()?;
    std::thread::sleep(Duration::from_secs_f64(a.idle_s));
    let (r0b, allb, sib, eb, tb) = read()?;
    let (online, lost, _) = overlay_counts(&rt, &client)?;
    res.online_end = online;
    res.lost_end = lost;
    res.udp_rcvbuf_errors = eb.saturating_sub(ea);
    res.wall_s = r4((tb - ta).as_secs_f64());
    res.rank0_cpu_s = r4(r0b - r0a);
    res.brokers_cpu_s = r4(allb - alla);
    res.softirq_s = r4(sib - sia);
    Ok(())
}

/// Results of the cost measurement for the report.
#[derive(Default)]
pub(super) struct Cost {
    /// Children of rank 0 (instance size - 1).
    pub(super) children: usize,
    /// Idle seconds measured per instance.
    pub(super) idle_s: f64,
    /// Samples per variant (variant name, samples).
    pub(super) variants: Vec<(String, Vec<CostSample>)>,
    /// First error, if any.
    pub(super) error: Option<String>,
}

impl CostSample {
    /// Rank 0's CPU use, % of one core.
    pub(super) fn rank0_pct(&self) -> f64 {
        if self.wall_s > 0.0 {
            100.0 * self.rank0_cpu_s / self.wall_s
        } else {
            0.0
        }
    }
    /// Every broker's CPU use, % of one core.
    pub(super) fn brokers_pct(&self) -> f64 {
        if self.wall_s > 0.0 {
            100.0 * self.brokers_cpu_s / self.wall_s
        } else {
            0.0
        }
    }
    /// Machine softirq time, % of one core.
    pub(super) fn softirq_pct(&self) -> f64 {
        if self.wall_s > 0.0 {
            100.0 * self.softirq_s / self.wall_s
        } else {
            0.0
        }
    }
}

/// Mean of `f` over `v` (0 when empty).
pub(super) fn mean(v: &[CostSample], f: impl Fn(&CostSample) -> f64) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().map(f).sum::<f64>() / v.len() as f64
    }
}

/// Run every variant `runs` times (alternating), each in a fresh flat instance of `children`+1 brokers.
pub(super) fn measure(vigil: &Path, children: usize, idle_s: f64, runs: usize) -> Cost {
    let mut c = Cost { children, idle_s, ..Default::default() };
    c.variants = VARIANTS.iter().map(|(n, _)| (n.to_string(), Vec::new())).collect();
    let me = match std::env::current_exe() {
        Ok(m) => m,
        Err(e) => {
            c.error = Some(format!("cannot locate this binary: {e}"));
            return c;
        }
    };
    let size = children + 1;
    for run in 0..runs {
        for (i, (name, attrs)) in VARIANTS.iter().enumerate() {
            eprintln!("vigil-bench: detect (f) prober CPU, {size} brokers flat, {name}, run {}", run + 1);
            let out = scratch_file("cost");
            let mut cmd = Command::new(vigil);
            cmd.arg("start").arg(format!("--test-size={size}")).arg("-S").arg("tbon.topo=kary:0");
            for a in attrs.iter().chain(&NODE_PERIODS) {
                cmd.arg("-S").arg(a);
            }
            cmd.arg(&me).args(["inner", "probe-cost"]);
            cmd.arg(format!("--expect={size}")).arg(format!("--idle-s={idle_s}")).arg("--out").arg(&out);
            let t0 = now_epoch_s();
            let ended = run_captured(cmd, Duration::from_secs(900));
            let res: Option<CostSample> =
                std::fs::read_to_string(&out).ok().and_then(|s| serde_json::from_str(&s).ok());
            let _ = std::fs::remove_file(&out);
            let err = match (ended, res) {
                (Err(e), _) => Some(e),
                (Ok(Captured::TimedOut), _) => Some(format!("{size}-broker instance hung: killed after 900 s")),
                (Ok(_), Some(r)) if r.error.is_some() => r.error,
                (Ok(Captured::Exited { status, stderr, .. }), None) => {
                    Some(format!("{size}-broker instance: {status}, no results: {}", last_line(&stderr)))
                }
                (Ok(_), Some(r)) => {
                    eprintln!(
                        "vigil-bench:   rank 0 {:.2} % of a core, all brokers {:.1} %, softirq {:.2} % ({:.0} s to ready, \
                         {:.0} s in all); {} brokers at the start, {} online, {} lost at the end, {} UDP receive-buffer drops",
                        r.rank0_pct(),
                        r.brokers_pct(),
                        r.softirq_pct(),
                        r.ready_s,
                        now_epoch_s() - t0,
                        r.brokers_start,
                        r.online_end,
                        r.lost_end,
                        r.udp_rcvbuf_errors
                    );
                    c.variants[i].1.push(r);
                    None
                }
            };
            if let Some(e) = err {
                c.error = Some(format!("{name}: {e}"));
                return c;
            }
        }
    }
    c
}

impl Cost {
    /// (probes on − probes off) for rank 0 and for machine softirq, % of one core; None unless both ran.
    fn difference(&self) -> Option<(f64, f64, f64)> {
        let [(_, off), (_, on)] = self.variants.as_slice() else { return None };
        if off.is_empty() || on.is_empty() {
            return None;
        }
        let d = |f: fn(&CostSample) -> f64| mean(on, f) - mean(off, f);
        Some((d(CostSample::rank0_pct), d(CostSample::brokers_pct), d(CostSample::softirq_pct)))
    }

    /// Children wrongly declared lost (fewest online at the end, over every run with probes).
    pub(super) fn lost_children(&self) -> usize {
        self.variants
            .iter()
            .flat_map(|(_, v)| v.iter())
            .map(|r| self.children + 1 - r.online_end.min(self.children + 1))
            .max()
            .unwrap_or(0)
    }
}

/// The markdown table of every cost measurement, and the target verdict (None when nothing usable was measured).
pub(super) fn table(costs: &[Cost], target_pct: f64) -> (String, Option<String>) {
    let mut t = String::from(
        "| children of rank 0 | probes | rank 0 broker (% of one core) | all brokers | softirq, whole machine | ranks online at the end | UDP receive-buffer drops |\n|---:|---|---:|---:|---:|---:|---:|\n",
    );
    for c in costs {
        for (name, v) in &c.variants {
            if v.is_empty() {
                let why = c.error.as_deref().filter(|e| e.starts_with(name.as_str())).unwrap_or("not measured");
                t.push_str(&format!("| {} | {name} | FAILED | | | | |\n", c.children));
                t.push_str(&format!("| | | ({}) | | | | |\n", why.replace('|', "/")));
                continue;
            }
            let online: Vec<String> = v.iter().map(|r| format!("{}/{}", r.online_end, c.children + 1)).collect();
            let drops: Vec<String> = v.iter().map(|r| r.udp_rcvbuf_errors.to_string()).collect();
            t.push_str(&format!(
                "| {} | {name} | {:.2} % | {:.1} % | {:.2} % | {} | {} |\n",
                c.children,
                mean(v, CostSample::rank0_pct),
                mean(v, CostSample::brokers_pct),
                mean(v, CostSample::softirq_pct),
                if online.is_empty() { "-".into() } else { online.join(", ") },
                if drops.is_empty() { "-".into() } else { drops.join(", ") },
            ));
        }
        if let Some((d0, dall, dsi)) = c.difference() {
            t.push_str(&format!(
                "| {} | **difference = cost of probing** | **{d0:+.2} %** | {dall:+.1} % | {dsi:+.2} % | | |\n",
                c.children
            ));
        }
    }
    // The verdict: from the largest size whose children all stayed online, scaled linearly to 256 children.
    let clean = costs
        .iter()
        .filter(|c| c.lost_children() == 0 && c.error.is_none())
        .filter_map(|c| c.difference().map(|d| (c, d)))
        .max_by_key(|(c, _)| c.children);
    let verdict = clean.map(|(c, (d0, _, dsi))| {
        let cost = d0 + dsi.max(0.0);
        let at256 = cost * 256.0 / c.children as f64;
        let met = if at256 < target_pct { "met" } else { "**missed**" };
        let scaled = if c.children == 256 { String::new() } else { format!(", scaled linearly from {} children", c.children) };
        format!("Cost of probing (rank 0's difference plus any softirq difference) for 256 children: {at256:.2} % of a core{scaled} (measured {cost:.2} % with {} children); target below {target_pct} %: {met}.", c.children)
    });
    (t, verdict)
}

/// The cost section of the JSON.
pub(super) fn to_json(c: &Cost) -> Value {
    let variants: Vec<Value> = c
        .variants
        .iter()
        .map(|(n, v)| {
            json!({
                "variant": n,
                "rank0_pct_of_core": r4(mean(v, CostSample::rank0_pct)),
                "all_brokers_pct_of_core": r4(mean(v, CostSample::brokers_pct)),
                "softirq_pct_of_core": r4(mean(v, CostSample::softirq_pct)),
                "runs": v,
            })
        })
        .collect();
    json!({"children": c.children, "idle_s": c.idle_s, "variants": variants, "error": c.error,
        "difference_pct_of_core": c.difference().map(|(a, b, d)| json!({"rank0": r4(a), "all_brokers": r4(b), "softirq": r4(d)})),
        "children_lost": c.lost_children()})
}
