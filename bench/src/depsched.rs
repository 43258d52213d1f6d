//! `vigil-bench depsched`: the scheduler with dependencies and urgencies at depth (issue 39's benchmark: "10,000
//! queued jobs in 1,000 chains of 10 (`afterok`), and 10,000 with random urgencies: throughput against the same
//! count without, same run. Target: at least 90 % of the plain figure").
//!
//! Three workloads of `--jobs` one-core `true` jobs, all submitted before the first one ends:
//! - *plain*: every job at the default urgency (16), no dependency;
//! - *chains*: `--jobs / 10` chains of 10, each job `afterok` the one before it in its chain, submitted a level at
//!   a time (every chain's first job, then every chain's second, ...), as a script that keeps the ids does;
//! - *urgency*: every job at a random urgency from 1 to 31 (seeded; 0 would hold it), submitted by the instance
//!   owner (only the owner may give more than 16).
//!
//! Measured two ways, in one run, the workloads rotating their order from round to round:
//! - **job core** (in-process, [`vigil_sim::depth`]'s instance shape: 4 ranks of 2 cores): the sans-IO job core
//!   driven directly, shells ending at once in the order they started. Timed: only the job core's own calls
//!   (submits, shell exits and the actions they hand out), not the building of the jobspecs. jobs/s, the submit
//!   rate, and the cost of one shell exit (the end of a job, the scheduling pass it causes and the start of the
//!   next job): median and p99. Each run checks its result: every job COMPLETED; for *urgency*, once the first
//!   8 jobs run, jobs start in urgency order; for *chains*, no job starts before the one it waits on ends.
//! - **instance** (`vigil start --test-size=4`, a fresh instance per sample, as `vigil-bench sched`): its initial
//!   program (`vigil-bench inner sched --workload W`) submits through the client API, each level's requests
//!   pipelined on one connection, then follows every job, in the order they are expected to end, until it is
//!   INACTIVE and exited 0. jobs/s = jobs / (first submit to last INACTIVE).
//!
//! Results `results/depsched.{json,md}`, with the target checked on the medians of each.

use crate::sched::{load_avg, vigil_instance_with};
use crate::{find_vigil, now_epoch_s, p99, r4, results_dir, summarize, vigil_version, write_results};
use clap::Args;
use serde_json::{json, Value};
use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use vigil::jobs::{Action, JobCore, JobId, SubmitRequest};
use vigil::shellproto::{ShellExit, ShellReport};
use vigil_sim::depth;

/// The target: each workload's throughput at least this fraction of the plain one.
const TARGET: f64 = 0.9;
/// Jobs per chain.
const CHAIN: usize = 10;
/// Seed of the urgencies.
const SEED: u64 = 39;

/// One workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Workload {
    Plain,
    Chains,
    Urgency,
}

impl Workload {
    const ALL: [Workload; 3] = [Workload::Plain, Workload::Chains, Workload::Urgency];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Workload::Plain => "plain",
            Workload::Chains => "chains",
            Workload::Urgency => "urgency",
        }
    }

    pub(crate) fn parse(s: &str) -> Result<Workload, String> {
        Workload::ALL.into_iter().find(|w| w.name() == s).ok_or_else(|| format!("unknown workload {s:?}"))
    }
}

/// `n` urgencies from 1 to 31, drawn with `seed`.
fn urgencies(n: usize, seed: u64) -> Vec<u32> {
    let mut rng = vigil_sim::Rng::new(seed);
    (0..n).map(|_| 1 + (rng.next_u64() % 31) as u32).collect()
}

/// `spec` waiting `afterok` on job `on` (an f58 id).
fn afterok(spec: &Value, on: &str) -> Value {
    let mut s = spec.clone();
    s["attributes"]["system"]["dependencies"] = json!([{"scheme": "afterok", "value": on}]);
    s
}

/// Options of `vigil-bench depsched`.
#[derive(Args, Debug)]
pub(crate) struct DepschedArgs {
    /// Jobs of each workload (a multiple of 10).
    #[arg(long, default_value_t = 10_000)]
    jobs: usize,
    /// Rounds of the in-process job core (each runs the three workloads).
    #[arg(long, default_value_t = 7)]
    core_runs: usize,
    /// Rounds of real instances (each runs the three workloads; 0: none).
    #[arg(long, default_value_t = 3)]
    instance_runs: usize,
    /// Only these workloads (for profiling one; the table's ratios need `plain`).
    #[arg(long, value_delimiter = ',', default_value = "plain,chains,urgency")]
    workloads: Vec<String>,
    /// Longest one instance sample may take, seconds.
    #[arg(long, default_value_t = 600)]
    bound_s: u64,
}

/// What one in-process run measured.
#[derive(Debug, Default, serde::Serialize)]
pub(crate) struct CoreRun {
    /// Jobs through to INACTIVE.
    jobs: usize,
    /// Seconds in the job core's calls, submits to the last INACTIVE.
    total_s: f64,
    /// Of which the submits (and what they started at once).
    submit_s: f64,
    /// Each shell exit's cost (the job's end, the pass, the next start), microseconds: median and p99.
    exit_us_median: f64,
    exit_us_p99: f64,
    /// Pending jobs the scheduler looked at, per job.
    examined_per_job: f64,
}

/// Run workload `w` of `n` jobs through a fresh job core; checks what the workload promises.
pub(crate) fn core_run(w: Workload, n: usize) -> Result<CoreRun, String> {
    let spec = depth::true_spec();
    let t = 1_000_000.0;
    let mut c = depth::fresh_core(t);
    let mut shells: VecDeque<(JobId, u32)> = VecDeque::new();
    let mut started: Vec<JobId> = Vec::with_capacity(n);
    let drain = |c: &mut JobCore, shells: &mut VecDeque<(JobId, u32)>, started: &mut Vec<JobId>, t: f64| {
        while let Some(a) = c.poll_action() {
            if let Action::SpawnShell { id, rank, .. } = a {
                c.shell_spawned(t, id, rank, Ok(()));
                shells.push_back((id, rank));
                started.push(id);
            }
        }
    };
    drain(&mut c, &mut shells, &mut started, t);
    let examined0 = c.examined();
    let mut busy = Duration::ZERO;
    let urg = urgencies(n, SEED);
    let mut urgency_of: HashMap<JobId, u32> = HashMap::new();
    let mut waits_on: HashMap<JobId, JobId> = HashMap::new();
    match w {
        Workload::Plain | Workload::Urgency => {
            for (i, &u) in urg.iter().enumerate() {
                let u = if w == Workload::Urgency { u } else { vigil::jobs::DEFAULT_URGENCY };
                let t0 = Instant::now();
                let id =
                    c.submit(t, SubmitRequest::new(&spec, 1000).urgency(u)).map_err(|e| format!("submit {i}: {e}"))?.id;
                drain(&mut c, &mut shells, &mut started, t);
                busy += t0.elapsed();
                urgency_of.insert(id, u);
            }
        }
        Workload::Chains => {
            let mut prev: Vec<JobId> = Vec::new();
            for level in 0..CHAIN {
                let specs: Vec<Value> = if level == 0 {
                    vec![spec.clone(); n / CHAIN]
                } else {
                    prev.iter().map(|p| afterok(&spec, &p.f58())).collect()
                };
                let mut ids = Vec::with_capacity(specs.len());
                for (i, s) in specs.iter().enumerate() {
                    let t0 = Instant::now();
                    let id =
                        c.submit(t, SubmitRequest::new(s, 1000)).map_err(|e| format!("submit {level}/{i}: {e}"))?.id;
                    drain(&mut c, &mut shells, &mut started, t);
                    busy += t0.elapsed();
                    if level > 0 {
                        waits_on.insert(id, prev[i]);
                    }
                    ids.push(id);
                }
                prev = ids;
            }
        }
    }
    let submit_s = busy.as_secs_f64();
    let mut t = t;
    let mut exits = Vec::with_capacity(n);
    let mut ended: HashMap<JobId, usize> = HashMap::new();
    let mut start_at: HashMap<JobId, usize> = HashMap::new();
    let mut k = 0usize;
    while let Some((id, rank)) = shells.pop_front() {
        t += 1e-4;
        k += 1;
        let before = started.len();
        let report = ShellReport { status: 0, tasks: vec![], error: None, abort_code: None, usage: None, ended: None };
        let t0 = Instant::now();
        c.shell_exit(
            t,
            ShellExit { id: id.0, rank, report: Some(report), shell_status: 0, ended: None, unkillable: vec![] },
        );
        drain(&mut c, &mut shells, &mut started, t);
        let el = t0.elapsed();
        busy += el;
        exits.push(el.as_secs_f64() * 1e6);
        ended.insert(id, k);
        for s in &started[before..] {
            start_at.insert(*s, k);
        }
    }
    let (pending, running, held) = c.counts();
    let done = c.jobs.values().filter(|j| j.result() == Some("COMPLETED")).count();
    if pending + running != 0 || done != n || held != n {
        return Err(format!("{}: {done} of {n} jobs COMPLETED, {pending} pending, {running} running", w.name()));
    }
    match w {
        Workload::Urgency => {
            // Once the first 8 have started (at submit, in submission order), each start takes the most urgent.
            let later: Vec<u32> =
                started.iter().skip((depth::RANKS * depth::CORES) as usize).map(|i| urgency_of[i]).collect();
            if let Some(p) = later.windows(2).position(|p| p[1] > p[0]) {
                return Err(format!("urgency: start {} had urgency {} after one of {}", p + 9, later[p + 1], later[p]));
            }
        }
        Workload::Chains => {
            for (job, on) in &waits_on {
                let (s, e) = (start_at.get(job).copied().unwrap_or(0), ended[on]);
                if s < e {
                    return Err(format!("chains: job {job} started (exit {s}) before job {on} ended (exit {e})"));
                }
            }
        }
        Workload::Plain => {}
    }
    let (med, _, _) = summarize(&exits);
    Ok(CoreRun {
        jobs: n,
        total_s: busy.as_secs_f64(),
        submit_s,
        exit_us_median: r4(med.unwrap_or(0.0)),
        exit_us_p99: r4(p99(&exits).unwrap_or(0.0)),
        examined_per_job: (c.examined() - examined0) as f64 / n as f64,
    })
}

/// The instance half: submit workload `w` of `n` jobs through `client` and follow them to INACTIVE (inside
/// `vigil-bench inner sched --workload W`). Returns (seconds until every submit was answered, seconds from the
/// first submit to the last INACTIVE, jobs done).
pub(crate) async fn instance_burst(
    client: &vigil::client::Client,
    spec: &Value,
    w: Workload,
    n: usize,
    bound: Duration,
) -> Result<(f64, f64, usize), String> {
    let t0 = Instant::now();
    let (ids, follow_order) = match w {
        Workload::Plain => {
            let ids = submit_each(client, vec![json!({"jobspec": spec}); n]).await?;
            (ids.clone(), ids)
        }
        Workload::Urgency => {
            let urg = urgencies(n, SEED);
            let ids = submit_each(client, urg.iter().map(|u| json!({"jobspec": spec, "urgency": u})).collect()).await?;
            // They end most urgent first, then in submission order.
            let mut order: Vec<(u32, usize, u64)> =
                urg.iter().zip(&ids).enumerate().map(|(i, (u, id))| (31 - u, i, *id)).collect();
            order.sort_unstable();
            (ids, order.into_iter().map(|o| o.2).collect())
        }
        Workload::Chains => {
            let mut all = Vec::with_capacity(n);
            let mut prev: Vec<u64> = Vec::new();
            for level in 0..CHAIN {
                let payloads: Vec<Value> = if level == 0 {
                    vec![json!({"jobspec": spec}); n / CHAIN]
                } else {
                    prev.iter().map(|p| json!({"jobspec": afterok(spec, &JobId(*p).f58())})).collect()
                };
                prev = submit_each(client, payloads).await?;
                all.extend_from_slice(&prev);
            }
            (all.clone(), all)
        }
    };
    let submit_s = t0.elapsed().as_secs_f64();
    debug_assert_eq!(ids.len(), follow_order.len());
    let (total_s, done) = crate::sched::follow(client, &follow_order, t0, bound).await?;
    Ok((submit_s, total_s, done))
}

/// Submit each payload (a `job-manager.submit` request), all pipelined on one connection; the ids in order.
async fn submit_each(client: &vigil::client::Client, payloads: Vec<Value>) -> Result<Vec<u64>, String> {
    let n = payloads.len();
    let mut submits = tokio::task::JoinSet::new();
    for (i, p) in payloads.into_iter().enumerate() {
        let c = client.clone();
        submits.spawn(async move { (i, c.rpc("job-manager.submit", 0, &p).await) });
    }
    let mut ids = vec![0u64; n];
    while let Some(r) = submits.join_next().await {
        let (i, r) = r.map_err(|e| format!("submit task: {e}"))?;
        let v = r.map_err(|e| format!("submit {i}: {e}"))?;
        ids[i] = v["id"].as_u64().ok_or_else(|| format!("malformed submit response: {v}"))?;
    }
    Ok(ids)
}

/// Median of `v`, 0 when empty.
fn med(v: &[f64]) -> f64 {
    summarize(v).0.unwrap_or(0.0)
}

/// Run it; print the markdown and write `results/depsched.{json,md}`.
pub(crate) fn run(a: &DepschedArgs, vigil: Option<PathBuf>, out_dir: Option<PathBuf>) -> Result<i32, String> {
    if a.jobs == 0 || !a.jobs.is_multiple_of(CHAIN) {
        return Err(format!("--jobs {}: must be a positive multiple of {CHAIN}", a.jobs));
    }
    let ws: Vec<Workload> = a.workloads.iter().map(String::as_str).map(Workload::parse).collect::<Result<_, _>>()?;
    if !ws.contains(&Workload::Plain) {
        for r in 0..a.core_runs {
            for &w in &ws {
                let run = core_run(w, a.jobs)?;
                eprintln!(
                    "vigil-bench depsched: core round {r} {}: {:.0} jobs/s",
                    w.name(),
                    run.jobs as f64 / run.total_s
                );
            }
        }
        return Ok(0);
    }
    let load0 = load_avg();
    let started_at = now_epoch_s();
    let mut failed = Vec::new();
    // In-process: a warm-up of each, then the rounds.
    for w in Workload::ALL {
        core_run(w, a.jobs / 10)?;
    }
    let mut core: HashMap<&str, Vec<CoreRun>> = HashMap::new();
    for r in 0..a.core_runs {
        for i in 0..3 {
            let w = Workload::ALL[(r + i) % 3];
            let run = core_run(w, a.jobs)?;
            eprintln!("vigil-bench depsched: core round {r} {}: {:.0} jobs/s", w.name(), run.jobs as f64 / run.total_s);
            core.entry(w.name()).or_default().push(run);
        }
    }
    // Instances.
    let mut inst: HashMap<&str, Vec<(f64, f64)>> = HashMap::new();
    let mut inst_err: Option<String> = None;
    if a.instance_runs > 0 {
        let vigil = find_vigil(vigil.clone())?;
        'rounds: for r in 0..a.instance_runs {
            for i in 0..3 {
                let w = Workload::ALL[(r + i) % 3];
                let args: Vec<String> =
                    ["--jobs", &a.jobs.to_string(), "--workload", w.name(), "--bound-s", &a.bound_s.to_string()]
                        .iter()
                        .map(|s| s.to_string())
                        .collect();
                let res = vigil_instance_with(&vigil, &[], &args, a.bound_s + 120);
                match (res.error, res.total_s, res.done, res.submit_s) {
                    (None, Some(t), Some(d), Some(s)) if d == a.jobs => {
                        eprintln!("vigil-bench depsched: instance round {r} {}: {:.1} jobs/s", w.name(), d as f64 / t);
                        inst.entry(w.name()).or_default().push((d as f64 / t, a.jobs as f64 / s));
                    }
                    (e, t, d, _) => {
                        let e = e.unwrap_or_else(|| format!("{d:?} of {} jobs done in {t:?} s", a.jobs));
                        eprintln!("vigil-bench depsched: instance round {r} {}: {e}", w.name());
                        inst_err = Some(format!("{} (round {r}): {e}", w.name()));
                        break 'rounds;
                    }
                }
            }
        }
        if let Some(e) = &inst_err {
            failed.push(e.clone());
        }
    }
    // The tables.
    let version = find_vigil(vigil).map(|v| vigil_version(&v)).unwrap_or_else(|_| "-".into());
    let mut md = format!(
        "# Dependencies and urgencies at depth (`vigil-bench depsched`, issue 39)\n\n`vigil-bench depsched --jobs {} \
         --core-runs {} --instance-runs {}` ({version}, 2 CPUs, 1-minute load average {} at start; unix time {:.0}). \
         Workloads of {} one-core `true` jobs, all submitted before the first ends: *plain* (urgency 16, no \
         dependency), *chains* ({} chains of {CHAIN}, each job `afterok` the one before it, submitted a level at a \
         time), *urgency* (random urgencies 1-31, seeded). The order of the workloads rotates from round to round. \
         Target: each at least {:.0} % of the plain throughput (medians).\n\n",
        a.jobs,
        a.core_runs,
        a.instance_runs,
        load0.map_or("-".into(), |l| format!("{l:.2}")),
        started_at,
        a.jobs,
        a.jobs / CHAIN,
        TARGET * 100.0
    );
    md.push_str(
        "## Job core, in-process (4 ranks x 2 cores, shells ending at once; only the job core's calls timed)\n\n\
         | workload | jobs/s median | min | max | submits/s median | shell exit -> next start, median µs | p99 µs | \
         examined/job | of plain |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    let tput = |v: &[CoreRun]| v.iter().map(|r| r.jobs as f64 / r.total_s).collect::<Vec<_>>();
    let plain_core = med(&tput(&core["plain"]));
    let mut targets = Vec::new();
    for w in Workload::ALL {
        let v = &core[w.name()];
        let t = tput(v);
        let (m, lo, hi) = summarize(&t);
        let sub: Vec<f64> = v.iter().map(|r| r.jobs as f64 / r.submit_s).collect();
        let ex: Vec<f64> = v.iter().map(|r| r.exit_us_median).collect();
        let ex99: Vec<f64> = v.iter().map(|r| r.exit_us_p99).collect();
        let ratio = m.unwrap_or(0.0) / plain_core;
        md.push_str(&format!(
            "| {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.1} | {:.1} | {:.1} | {} |\n",
            w.name(),
            m.unwrap_or(0.0),
            lo.unwrap_or(0.0),
            hi.unwrap_or(0.0),
            med(&sub),
            med(&ex),
            med(&ex99),
            v.iter().map(|r| r.examined_per_job).sum::<f64>() / v.len() as f64,
            if w == Workload::Plain { "-".into() } else { format!("{:.0} %", ratio * 100.0) }
        ));
        if w != Workload::Plain {
            targets.push((format!("job core, {}", w.name()), ratio));
        }
    }
    if a.instance_runs > 0 {
        md.push_str(
            "\n## Instance (`vigil start --test-size=4`, a fresh instance per sample, client API)\n\n\
             | workload | jobs/s median | min | max | samples | submits/s median | of plain |\n\
             |---|---:|---:|---:|---:|---:|---:|\n",
        );
        let plain = inst.get("plain").map(|v| med(&v.iter().map(|s| s.0).collect::<Vec<_>>()));
        for w in Workload::ALL {
            let v = inst.get(w.name()).cloned().unwrap_or_default();
            let t: Vec<f64> = v.iter().map(|s| s.0).collect();
            let (m, lo, hi) = summarize(&t);
            let ratio = match (m, plain) {
                (Some(m), Some(p)) if p > 0.0 => Some(m / p),
                _ => None,
            };
            md.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} | {} |\n",
                w.name(),
                m.map_or("-".into(), |x| format!("{x:.1}")),
                lo.map_or("-".into(), |x| format!("{x:.1}")),
                hi.map_or("-".into(), |x| format!("{x:.1}")),
                t.len(),
                if v.is_empty() {
                    "-".into()
                } else {
                    format!("{:.0}", med(&v.iter().map(|s| s.1).collect::<Vec<_>>()))
                },
                match (w, ratio) {
                    (Workload::Plain, _) => "-".into(),
                    (_, Some(r)) => format!("{:.0} %", r * 100.0),
                    (_, None) => "not measured".into(),
                }
            ));
            if w != Workload::Plain {
                if let Some(r) = ratio {
                    targets.push((format!("instance, {}", w.name()), r));
                }
            }
        }
        if let Some(e) = &inst_err {
            md.push_str(&format!("\nFAILED: {e}\n"));
        }
    }
    md.push_str("\n## Target (issue 39): at least 90 % of the plain throughput\n\n| measure | of plain | status |\n|---|---:|---|\n");
    for (what, r) in &targets {
        md.push_str(&format!("| {what} | {:.0} % | {} |\n", r * 100.0, if *r >= TARGET { "met" } else { "MISSED" }));
    }
    print!("{md}");
    let doc = json!({
        "group": "depsched", "jobs": a.jobs, "chain": CHAIN, "seed": SEED, "load_avg": load0, "started_at": r4(started_at),
        "core": core, "instance": inst.iter().map(|(k, v)| (k.to_string(), v.iter().map(|s| json!({"jobs_per_s": r4(s.0), "submits_per_s": r4(s.1)})).collect::<Vec<_>>())).collect::<HashMap<_, _>>(),
        "targets": targets.iter().map(|(w, r)| json!({"measure": w, "ratio": r4(*r)})).collect::<Vec<_>>(),
        "errors": failed,
    });
    write_results(&results_dir(out_dir), "depsched", &doc, &md)?;
    Ok(i32::from(!failed.is_empty()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_workload_runs_to_the_end_and_keeps_its_rules() {
        for w in Workload::ALL {
            let r = core_run(w, 200).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(r.jobs, 200);
            assert!(r.total_s >= r.submit_s);
        }
    }

    #[test]
    fn urgencies_are_seeded_and_never_hold() {
        let u = urgencies(1000, SEED);
        assert_eq!(u, urgencies(1000, SEED));
        assert!(u.iter().all(|&x| (1..=31).contains(&x)));
        assert!(u.contains(&1) && u.contains(&31));
    }
}
