//! `vigil-bench sim`: the deterministic simulator of the real sans-IO broker (`vigil_sim`) at any size, with
//! wall time, events per second and peak memory around it; `--table` runs the committed table.

use clap::Args;
use std::path::PathBuf;
use vigil::topology::Topology;
use vigil_sim::{Config, Report, Scenario};

/// The largest instance simulated: about 6 GiB of broker state at this size.
const MAX_BROKERS: u32 = 1 << 20;

/// Options of `vigil-bench sim`.
#[derive(Args, Debug)]
pub(crate) struct SimArgs {
    /// Number of brokers.
    #[arg(long, default_value_t = 1024)]
    brokers: u32,
    /// TBON shape: `kary:K`, `binomial`, or `flat` (kary:0, every rank a child of rank 0).
    #[arg(long, default_value = "kary:32")]
    topo: String,
    /// `boot`, `jobs`, `churn`, `partition`, a router-loss scenario: `router-each`, `routers-1pct`,
    /// `routers-5pct`, `router-adopter`, `reparent-loss`, `router-flap`, or `restart` (churn and rank 0 killed
    /// and restarted on its state directory; see `vigil_sim::scenario`).
    #[arg(long, default_value = "churn")]
    scenario: String,
    /// One-way latency of every overlay link, microseconds.
    #[arg(long, default_value_t = 50)]
    latency_us: u64,
    /// Play brokers without a prober (no eBPF, no UDP probes): a parent link judged on TCP alone. By default
    /// every broker probes its parent's node, as the product does.
    #[arg(long)]
    no_parent_probe: bool,
    /// Seed of every random choice.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print one JSON object (the report) instead of a summary.
    #[arg(long)]
    json: bool,
    /// Run every scenario at 16,384 brokers for kary:32 and flat (50 µs links), and the router-loss scenarios
    /// for kary:32 and kary:8 (1 ms links), each in its own process, and write `sim.md`/`sim.json` in the
    /// results directory.
    #[arg(long)]
    table: bool,
}

/// The report with what only a process can measure about itself.
#[derive(serde::Serialize, serde::Deserialize, Clone, Debug)]
struct Measured {
    #[serde(flatten)]
    report: serde_json::Value,
    wall_s: f64,
    peak_rss_mb: f64,
}

/// Peak resident memory of this process (VmHWM), MiB.
fn peak_rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmHWM:")).map(str::to_string))
        .and_then(|l| l.split_whitespace().nth(1).and_then(|kb| kb.parse::<f64>().ok()))
        .map_or(0.0, |kb| kb / 1024.0)
}

/// One-way link latency of the router-loss rows of the table: the re-parent latency target is stated for 1 ms
/// links.
const ROUTERS_LATENCY_US: u64 = 1000;

fn measure(
    brokers: u32,
    topo: Topology,
    scenario: Scenario,
    seed: u64,
    latency_us: u64,
    probe_parent: bool,
) -> Measured {
    let t0 = std::time::Instant::now();
    let mut cfg = Config::new(brokers, topo, seed);
    cfg.latency = std::time::Duration::from_micros(latency_us);
    cfg.probe_parent = probe_parent;
    let r: Report = vigil_sim::run(cfg, scenario);
    let wall_s = t0.elapsed().as_secs_f64();
    Measured { report: serde_json::to_value(&r).unwrap_or_default(), wall_s, peak_rss_mb: peak_rss_mb() }
}

/// `vigil-bench sim`; returns the process exit code (1 when an invariant did not hold).
pub(crate) fn run(a: &SimArgs, out_dir: Option<PathBuf>) -> i32 {
    if a.table {
        return table(a, out_dir);
    }
    // `flat`: every rank a child of rank 0 (kary:0).
    let topo: Topology = match if a.topo == "flat" { Ok(Topology::Kary(0)) } else { a.topo.parse() } {
        Ok(t) => t,
        Err(e) => {
            eprintln!("vigil-bench sim: --topo: {e}");
            return 2;
        }
    };
    let scenario: Scenario = match a.scenario.parse() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("vigil-bench sim: --scenario: {e}");
            return 2;
        }
    };
    if a.brokers == 0 || a.brokers > MAX_BROKERS {
        eprintln!("vigil-bench sim: --brokers must be 1..={MAX_BROKERS} (each simulated broker takes a few KiB)");
        return 2;
    }
    if let Err(e) = topo.check_depth(a.brokers) {
        eprintln!("vigil-bench sim: {e}");
        return 2;
    }
    let m = measure(a.brokers, topo, scenario, a.seed, a.latency_us, !a.no_parent_probe);
    let ok = m.report["ok"].as_bool().unwrap_or(false);
    if a.json {
        println!("{}", serde_json::to_string(&m).unwrap_or_default());
    } else {
        let r = &m.report;
        let v = r["virtual_s"].as_f64().unwrap_or(0.0);
        let ev = r["events"].as_f64().unwrap_or(0.0);
        println!(
            "{} brokers, {}, {}, seed {}: {:.1} virtual s in {:.1} s wall ({:.2} wall s per virtual s), {:.0} events \
             ({:.0}/s), peak RSS {:.0} MiB; jobs {} ({} ok, {} failed); {}",
            r["brokers"],
            r["topo"].as_str().unwrap_or(""),
            r["scenario"].as_str().unwrap_or(""),
            r["seed"],
            v,
            m.wall_s,
            m.wall_s / v.max(1e-9),
            ev,
            ev / m.wall_s.max(1e-9),
            m.peak_rss_mb,
            r["jobs"],
            r["jobs_ok"],
            r["jobs_failed"],
            if ok { "every invariant held".to_string() } else { format!("VIOLATIONS: {}", r["violations"]) }
        );
        if let Some(f) = r.get("reparent").filter(|f| !f.is_null()) {
            println!(
                "  re-parents {} after {} losses ({} µs links): loss → reachable {} ms; rank 0's verdict → reachable \
                 {} ms; orphan's verdict → reachable {} ms; loss → orphan's verdict {} ms (median / p99 / max); \
                 per loss, all orphans reachable {} ms (median / max); max candidates asked {}; max children {}; \
                 adopted by rank 0 as a last resort {}",
                f["reparents"],
                f["losses"],
                a.latency_us,
                triple(&f["loss_to_reachable_ms"]),
                triple(&f["verdict_to_reachable_ms"]),
                triple(&f["orphan_verdict_to_reachable_ms"]),
                triple(&f["loss_to_orphan_verdict_ms"]),
                triple(&f["loss_to_all_reachable_ms"]),
                f["max_attempts"],
                r["max_children"],
                f["last_resort"],
            );
        }
        if let Some(f) = r.get("restarts").filter(|f| !f.is_null()) {
            println!(
                "  rank 0 restarts {} ({} in a commit), outages {} s; every broker back {} ms (median / max); \
                 acknowledged {} ({} as duplicates), retried {} (connection) + {} (EAGAIN); running at a death {}: \
                 {} completed, {} failed (a node lost)",
                f["restarts"],
                f["in_commit"],
                pair(&f["outage_s"], 1),
                pair(&f["rejoin_ms"], 0),
                f["acknowledged"],
                f["duplicates"],
                f["retried"],
                f["retried_eagain"],
                f["running_at_crash"],
                f["reattached_ok"],
                f["reattached_failed"],
            );
        }
    }
    if ok {
        0
    } else {
        1
    }
}

/// `a / b / c` of a JSON array of numbers, rounded to ms; `-` when absent.
fn triple(v: &serde_json::Value) -> String {
    v.as_array()
        .map(|a| a.iter().map(|x| format!("{:.0}", x.as_f64().unwrap_or(f64::NAN))).collect::<Vec<_>>().join(" / "))
        .unwrap_or_else(|| "-".into())
}

/// `a / b` of a JSON array of two numbers with `digits` decimals; `-` when absent.
fn pair(v: &serde_json::Value, digits: usize) -> String {
    match v.as_array().map(|a| a.iter().map(|x| x.as_f64().unwrap_or(f64::NAN)).collect::<Vec<_>>()).as_deref() {
        Some([a, b]) => format!("{a:.digits$} / {b:.digits$}"),
        _ => "-".into(),
    }
}

/// Run one row of the table in a fresh process (so that its peak memory is its own).
fn row(
    exe: &std::path::Path,
    brokers: u32,
    topo: &str,
    scenario: &str,
    seed: u64,
    latency_us: u64,
) -> Option<Measured> {
    eprintln!("vigil-bench sim: {brokers} brokers, {topo}, {scenario}, {latency_us} µs links...");
    let out = std::process::Command::new(exe)
        .args(["sim", "--json", "--brokers", &brokers.to_string(), "--topo", topo, "--scenario", scenario])
        .args(["--seed", &seed.to_string(), "--latency-us", &latency_us.to_string()])
        .output();
    let m: Option<Measured> = out.ok().and_then(|o| serde_json::from_slice(&o.stdout).ok());
    if m.is_none() {
        eprintln!("vigil-bench sim: {topo} {scenario}: no report");
    }
    m
}

/// The committed table: every scenario at `--brokers` (default 16,384 for the table) for kary:32 and flat, then
/// the router-loss scenarios for kary:32 and kary:8 with 1 ms links, each run in a fresh process.
fn table(a: &SimArgs, out_dir: Option<PathBuf>) -> i32 {
    let brokers = if a.brokers == 1024 { 16_384 } else { a.brokers };
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("vigil-bench sim: cannot locate this binary: {e}");
            return 1;
        }
    };
    let mut rows = Vec::new();
    let mut all_ok = true;
    for topo in ["kary:32", "flat"] {
        for scenario in ["boot", "jobs", "churn", "partition"] {
            match row(&exe, brokers, topo, scenario, a.seed, a.latency_us) {
                Some(m) => {
                    all_ok &= m.report["ok"].as_bool().unwrap_or(false);
                    rows.push(m);
                }
                None => all_ok = false,
            }
        }
    }
    let mut routers = Vec::new();
    for topo in ["kary:32", "kary:8"] {
        for scenario in Scenario::ROUTERS.iter().map(ToString::to_string).chain(["partition".to_string()]) {
            match row(&exe, brokers, topo, &scenario, a.seed, ROUTERS_LATENCY_US) {
                Some(m) => {
                    all_ok &= m.report["ok"].as_bool().unwrap_or(false);
                    routers.push(m);
                }
                None => all_ok = false,
            }
        }
    }
    let mut restarts = Vec::new();
    match row(&exe, brokers, "kary:32", "restart", a.seed, a.latency_us) {
        Some(m) => {
            all_ok &= m.report["ok"].as_bool().unwrap_or(false);
            restarts.push(m);
        }
        None => all_ok = false,
    }
    let dir = out_dir.unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("results"));
    let mut md = String::new();
    md.push_str("# Simulator: the real sans-IO broker at 16,384 brokers\n\n");
    md.push_str(&format!(
        "`vigil-bench sim --table` (seed {}; one process per row, release build, one core). Wall s per virtual s \
         below 1 means faster than real time; the target for `churn` on kary:32 is at most 1 within 4 GiB. \
         \"loss detected\": virtual time from a silent node loss to rank 0 recording the rank lost. `kary:0` is the \
         flat tree. Produced by the harness; re-run it when the broker or the simulator changes.\n\n",
        a.seed
    ));
    md.push_str("| topo | scenario | brokers | virtual s | wall s | wall s per virtual s | events | events/s | peak RSS MiB | jobs (ok/failed) | faults | loss detected (median/max ms) | invariants |\n");
    md.push_str("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for m in &rows {
        let r = &m.report;
        let v = r["virtual_s"].as_f64().unwrap_or(0.0);
        let ev = r["events"].as_f64().unwrap_or(0.0);
        let faults = faults_cell(r);
        let det = r["loss_detect_ms"]
            .as_array()
            .map(|a| format!("{:.0} / {:.0}", a[0].as_f64().unwrap_or(0.0), a[1].as_f64().unwrap_or(0.0)))
            .unwrap_or_else(|| "-".into());
        let ok = invariants_cell(r);
        md.push_str(&format!(
            "| {} | {} | {} | {v:.1} | {:.1} | {:.2} | {ev:.0} | {:.0} | {:.0} | {} ({}/{}) | {} | {det} | {ok} |\n",
            r["topo"].as_str().unwrap_or(""),
            r["scenario"].as_str().unwrap_or(""),
            r["brokers"],
            m.wall_s,
            m.wall_s / v.max(1e-9),
            ev / m.wall_s.max(1e-9),
            m.peak_rss_mb,
            r["jobs"],
            r["jobs_ok"],
            r["jobs_failed"],
            if faults.is_empty() { "-".into() } else { faults },
        ));
    }
    routers_table(&mut md, &routers);
    restart_table(&mut md, &restarts);
    let _ = std::fs::create_dir_all(&dir);
    let _ = std::fs::write(dir.join("sim.md"), &md);
    let all: Vec<&Measured> = rows.iter().chain(&routers).chain(&restarts).collect();
    let _ = std::fs::write(dir.join("sim.json"), serde_json::to_string_pretty(&all).unwrap_or_default());
    print!("{md}");
    if all_ok {
        0
    } else {
        1
    }
}

/// The rank 0 restart section of the table.
fn restart_table(md: &mut String, rows: &[Measured]) {
    md.push_str("\n## Rank 0 restarts (state directory)\n\n");
    md.push_str(
        "`restart` (`vigil_sim::scenario`): `churn`'s faults and jobs, and rank 0's broker killed 3 times at seeded \
         moments (twice in a turn that changed its journal, before the commit; once between turns), each time \
         started again on its store (an in-memory `Kept`, the SQLite store's contract) after a seeded 1-5 s \
         outage; every broker has `tbon.parent_grace` 60 s. Invariants: every acknowledged job (answered with an \
         id) in rank 0's final job core once, INACTIVE, under its own submission; no id given again; jobs running \
         across an outage complete with their real exit status unless a node of theirs was lost. \"back\": from \
         rank 0's restart until every running broker has registered with it again (children of rank 0 retry every \
         1 s). \"retried\": submissions the client sent again, its connection refused or reset / answered \
         EAGAIN.\n\n",
    );
    md.push_str("| topo | brokers | virtual s | wall s | restarts (in a commit) | outage s (min / max) | back ms (median / max) | acknowledged | retried (conn / EAGAIN) | running at a death: completed / failed | jobs (ok/failed) | faults | invariants |\n");
    md.push_str("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for m in rows {
        let r = &m.report;
        let f = &r["restarts"];
        let faults = faults_cell(r);
        let ok = invariants_cell(r);
        md.push_str(&format!(
            "| {} | {} | {:.1} | {:.1} | {} ({}) | {} | {} | {} | {} / {} | {} / {} of {} | {} ({}/{}) | {faults} | {ok} |\n",
            r["topo"].as_str().unwrap_or(""),
            r["brokers"],
            r["virtual_s"].as_f64().unwrap_or(0.0),
            m.wall_s,
            f["restarts"],
            f["in_commit"],
            pair(&f["outage_s"], 1),
            pair(&f["rejoin_ms"], 0),
            f["acknowledged"],
            f["retried"],
            f["retried_eagain"],
            f["reattached_ok"],
            f["reattached_failed"],
            f["running_at_crash"],
            r["jobs"],
            r["jobs_ok"],
            r["jobs_failed"],
        ));
    }
}

/// A report's faults, `kind count, ...`, for a table cell.
fn faults_cell(r: &serde_json::Value) -> String {
    r["faults"]
        .as_object()
        .map(|o| o.iter().map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join(", "))
        .unwrap_or_default()
}

/// A report's invariants for a table cell: `held`, or how many were violated.
fn invariants_cell(r: &serde_json::Value) -> String {
    if r["ok"].as_bool().unwrap_or(false) {
        "held".to_string()
    } else {
        format!("{} violated", r["violations"].as_array().map_or(0, Vec::len))
    }
}

/// The router-loss section of the table.
fn routers_table(md: &mut String, rows: &[Measured]) {
    md.push_str("\n## Router loss and re-parenting (1 ms links)\n\n");
    md.push_str(
        "The router-loss scenarios (`vigil_sim::scenario`: `router-each` loses every router in turn, one every \
         0.4 s, each rebooted 0.3 s later; `routers-1pct`/`-5pct` lose that share of the routers silently at \
         random times over 10 s; `router-adopter` a router and its first orphan's adopter together; \
         `reparent-loss` adopters while orphans join them; `router-flap` one router down and up 10 times; \
         `partition` cuts a level-1 and then a level-2 router's link for 5 s each). Every link has 1 ms one-way \
         latency. Times are virtual ms, median / p99 / max over the orphans' re-parents (p99 by nearest rank): \
         *loss* is the fault, *rank 0's verdict* the rank recorded lost, *orphan's verdict* the orphan's first \
         request to a candidate, *reachable* rank 0's client getting the orphan's answer to a ping sent when rank \
         0 recorded the re-parent. \"all orphans\": per loss, until the last of its orphans is reachable (median \
         / max over losses). \"max children\": the most children one broker had at once (the bound is twice the \
         fanout: 64 for kary:32, 16 for kary:8).\n\n",
    );
    md.push_str(
        "| topo | scenario | brokers | virtual s | wall s | faults | re-parents | loss → reachable | rank 0's verdict \
         → reachable | orphan's verdict → reachable | loss → orphan's verdict | all orphans (median / max) | max \
         candidates asked | max children | invariants |\n",
    );
    md.push_str("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for m in rows {
        let r = &m.report;
        let f = &r["reparent"];
        let faults = faults_cell(r);
        let ok = invariants_cell(r);
        let reparents =
            if f.is_null() { "0".to_string() } else { format!("{} ({} losses)", f["reparents"], f["losses"]) };
        md.push_str(&format!(
            "| {} | {} | {} | {:.1} | {:.1} | {} | {reparents} | {} | {} | {} | {} | {} | {} | {} | {ok} |\n",
            r["topo"].as_str().unwrap_or(""),
            r["scenario"].as_str().unwrap_or(""),
            r["brokers"],
            r["virtual_s"].as_f64().unwrap_or(0.0),
            m.wall_s,
            if faults.is_empty() { "-".into() } else { faults },
            triple(&f["loss_to_reachable_ms"]),
            triple(&f["verdict_to_reachable_ms"]),
            triple(&f["orphan_verdict_to_reachable_ms"]),
            triple(&f["loss_to_orphan_verdict_ms"]),
            triple(&f["loss_to_all_reachable_ms"]),
            if f.is_null() { "-".to_string() } else { f["max_attempts"].to_string() },
            r["max_children"],
        ));
    }
}
