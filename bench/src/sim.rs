//! `vigil-bench sim`: the deterministic simulator of the real sans-IO broker (`vigil::sim`) at any size, with
//! wall time, events per second and peak memory around it; `--table` runs the committed table.

use clap::Args;
use std::path::PathBuf;
use vigil::sim::{Config, Report, Scenario};
use vigil::topology::Topology;

/// The largest instance simulated: about 6 GiB of broker state at this size.
const MAX_BROKERS: u32 = 1 << 20;

/// Options of `vigil-bench sim`.
#[derive(Args, Debug)]
pub struct SimArgs {
    /// Number of brokers.
    #[arg(long, default_value_t = 1024)]
    brokers: u32,
    /// TBON shape: `kary:K`, `binomial`, or `flat` (kary:0, every rank a child of rank 0).
    #[arg(long, default_value = "kary:32")]
    topo: String,
    /// `boot`, `jobs`, `churn` or `partition`.
    #[arg(long, default_value = "churn")]
    scenario: String,
    /// Seed of every random choice.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print one JSON object (the report) instead of a summary.
    #[arg(long)]
    json: bool,
    /// Run every scenario at 16,384 brokers for kary:32 and flat, each in its own process, and write
    /// `sim.md`/`sim.json` in the results directory.
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

fn measure(brokers: u32, topo: Topology, scenario: Scenario, seed: u64) -> Measured {
    let t0 = std::time::Instant::now();
    let r: Report = vigil::sim::run(Config::new(brokers, topo, seed), scenario);
    let wall_s = t0.elapsed().as_secs_f64();
    Measured { report: serde_json::to_value(&r).unwrap_or_default(), wall_s, peak_rss_mb: peak_rss_mb() }
}

/// `vigil-bench sim`; returns the process exit code (1 when an invariant did not hold).
pub fn run(a: &SimArgs, out_dir: Option<PathBuf>) -> i32 {
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
    let m = measure(a.brokers, topo, scenario, a.seed);
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
    }
    if ok {
        0
    } else {
        1
    }
}

/// The committed table: every scenario at `--brokers` (default 16,384 for the table) for kary:32 and flat, each
/// run in a fresh process so that its peak memory is its own.
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
            eprintln!("vigil-bench sim: {brokers} brokers, {topo}, {scenario}...");
            let out = std::process::Command::new(&exe)
                .args(["sim", "--json", "--brokers", &brokers.to_string(), "--topo", topo, "--scenario", scenario])
                .args(["--seed", &a.seed.to_string()])
                .output();
            let m: Option<Measured> = out.ok().and_then(|o| serde_json::from_slice(&o.stdout).ok());
            match m {
                Some(m) => {
                    all_ok &= m.report["ok"].as_bool().unwrap_or(false);
                    rows.push(m);
                }
                None => {
                    all_ok = false;
                    eprintln!("vigil-bench sim: {topo} {scenario}: no report");
                }
            }
        }
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
        let faults = r["faults"]
            .as_object()
            .map(|o| o.iter().map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join(", "))
            .unwrap_or_default();
        let det = r["loss_detect_ms"]
            .as_array()
            .map(|a| format!("{:.0} / {:.0}", a[0].as_f64().unwrap_or(0.0), a[1].as_f64().unwrap_or(0.0)))
            .unwrap_or_else(|| "-".into());
        let ok = if r["ok"].as_bool().unwrap_or(false) {
            "held".to_string()
        } else {
            format!("{} violated", r["violations"].as_array().map_or(0, Vec::len))
        };
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
    let _ = std::fs::create_dir_all(&dir);
    let _ = std::fs::write(dir.join("sim.md"), &md);
    let _ = std::fs::write(dir.join("sim.json"), serde_json::to_string_pretty(&rows).unwrap_or_default());
    print!("{md}");
    if all_ok {
        0
    } else {
        1
    }
}
