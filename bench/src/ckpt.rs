//! `vigil-bench ckpt`: the N+1 checkpoint/restart example (`examples/ckpt/`) under a silent node kill, timed from
//! the kill until every rank has resumed from its checkpoint on N good nodes; Vigil and Slurm 22.05 in the same run.
//!
//! Each trial has a fresh cluster of 7 network-namespace nodes (`ci/netns-cluster.sh`); node0 is the
//! login/controller node (Vigil: rank 0, drained; Slurm: slurmctld alone, `ci/slurm-cluster.sh netns`, one slurmd on
//! each of node1-6). The batch job takes node1-6 (`vigil batch -N6`, `sbatch --no-kill -N6 --exclusive`): its script
//! runs on node1, the application's 4 ranks on node2-5, node6 is the spare. Once every rank has a complete checkpoint
//! at step [`MIN_STEP`], the node of rank `trial mod 4` is killed silently (`netns-cluster.sh kill`: link cut, then
//! every process of the node SIGKILLed), and the script has to find out, rebuild the lost rank's checkpoint on the
//! spare from its partner copy and relaunch with every rank where its checkpoint is.
//!
//! Both run `examples/ckpt/batch.sh` itself (one script, read from the source tree at run time): Vigil as it is,
//! Slurm with `CKPT_SCHED=slurm`, which picks the script's Slurm commands (`scontrol show hostnames`, `sinfo -t
//! down`, `srun --exclude=LOST --distribution=arbitrary` with `SLURM_HOSTFILE` as the placement) around the same
//! `examples/ckpt/app.sh`, given Vigil's variables from Slurm's and a `vigil` shim that answers `getattr hostname`;
//! each node's storage is a directory of `CKPT_ROOT` there (no per-allocation node-local directory is configured in
//! that cluster).
//!
//! Measured, from the lines both scripts and the application stamp with `date -u +%FT%T.%6NZ` (ISO 8601 UTC; one
//! clock, one machine), in seconds after the kill: the script gets control (its first launch ended), and every rank resumed (the last
//! "resuming" line of the relaunch). A trial counts only if the job exited 0, every rank of the relaunch resumed from
//! the same step, the newest checkpoint complete on every rank (app.sh refuses to run without it), and the lost rank
//! was rebuilt on the spare.
//! Slurm runs once per `SlurmdTimeout` asked for, with its own number of trials: its verdict on a silent node
//! follows that setting (about 3x it, see `results/sched.md`), so the default 300 s costs 6-7 minutes a trial.

use crate::nodekill::{name, out_of, Netns, Slurm};
use crate::{find_vigil, now_epoch_s, p99, r4, results_dir, run_captured, summarize, write_results, Captured};
use clap::Args;
use serde::Serialize;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Nodes of each cluster: node0 (login/controller), the script's node1, 4 ranks' and the spare.
const NODES: u32 = 7;
/// Application ranks (on node2-5).
const RANKS: u32 = 4;
/// Every rank has a complete checkpoint at this step before the kill.
const MIN_STEP: u32 = 3;
/// Seconds per application step (app.sh's `STEP_S`).
const STEP_S: &str = "0.25";
/// Longest wait for the job to reach [`MIN_STEP`], seconds.
const START_TIMEOUT_S: u64 = 120;

/// Options of `vigil-bench ckpt`.
#[derive(Args, Debug)]
pub(crate) struct CkptArgs {
    /// Vigil trials.
    #[arg(long, default_value_t = 20)]
    pub(crate) trials: usize,
    /// Slurm's `SlurmdTimeout` values, seconds: one series each.
    #[arg(long, value_delimiter = ',', default_value = "10,300")]
    pub(crate) slurmd_timeouts: Vec<u64>,
    /// Trials of each Slurm series, in the order of --slurmd-timeouts (the last value repeats).
    #[arg(long, value_delimiter = ',', default_value = "20,2")]
    pub(crate) slurm_trials: Vec<usize>,
    /// Steps of the application (one every 0.25 s).
    #[arg(long, default_value_t = 16)]
    pub(crate) steps: u32,
    /// Vigil only.
    #[arg(long)]
    pub(crate) no_slurm: bool,
}

/// One trial.
#[derive(Serialize, Debug, Default, Clone)]
struct Trial {
    /// The node killed (node2-5) and the rank that ran there.
    node: u32,
    rank: u32,
    /// Seconds after the kill: the script's first launch ended (it got control).
    control_s: Option<f64>,
    /// Seconds after the kill: the last rank of the relaunch resumed.
    resumed_s: Option<f64>,
    /// Each rank of the relaunch: (step it resumed from, its last complete checkpoint).
    resumed_steps: Vec<(u32, u32)>,
    /// The batch job's exit code.
    exit_code: Option<i32>,
    /// Why the trial does not count, if so.
    error: Option<String>,
}

/// One system's series.
#[derive(Serialize, Debug)]
struct Series {
    system: String,
    /// Slurm's SlurmdTimeout, seconds (Vigil: none).
    slurmd_timeout_s: Option<u64>,
    trials: Vec<Trial>,
}

impl Series {
    fn ok(&self) -> impl Iterator<Item = &Trial> {
        self.trials.iter().filter(|t| t.error.is_none())
    }
}

/// What app.sh calls of `vigil` (`getattr hostname`), for its Slurm runs.
const VIGIL_SHIM: &str =
    "#!/bin/sh\n[ \"$*\" = \"getattr hostname\" ] && exec hostname\necho \"vigil shim: $*\" >&2\nexit 1\n";

/// `examples/` of the source tree.
fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/ckpt")
}

/// The last complete checkpoint of each rank that has one (app.sh's `CKPT_ROOT/complete.RANK`).
fn complete(root: &Path) -> Vec<u32> {
    (0..RANKS)
        .filter_map(|r| std::fs::read_to_string(root.join(format!("complete.{r}"))).ok()?.trim().parse().ok())
        .collect()
}

/// Wait until every rank has a complete checkpoint at [`MIN_STEP`] or later.
fn wait_ready(root: &Path, output: impl Fn() -> String) -> Result<(), String> {
    let t0 = Instant::now();
    while complete(root).iter().filter(|s| **s >= MIN_STEP).count() < RANKS as usize {
        if t0.elapsed() > Duration::from_secs(START_TIMEOUT_S) {
            return Err(format!(
                "the ranks did not reach step {MIN_STEP} in {START_TIMEOUT_S} s; output: {}",
                output()
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// Seconds since the Unix epoch of an RFC 3339 UTC time with a fraction (`2026-12-06T21:55:43.123456Z`, the stamp
/// of every line batch.sh and app.sh print); `None` for anything else.
fn iso_secs(s: &str) -> Option<f64> {
    let t = humantime::parse_rfc3339(s).ok()?;
    Some(t.duration_since(std::time::UNIX_EPOCH).ok()?.as_secs_f64())
}

/// Fill `t` from the script's output (times relative to `t_kill`); an error if the trial does not count.
fn parse(out: &str, t_kill: f64, t: &mut Trial) -> Result<(), String> {
    let stamped = |l: &str| l.split_once(' ').and_then(|(s, rest)| Some((iso_secs(s)?, rest.to_string())));
    let lines: Vec<(f64, String)> = out.lines().filter_map(stamped).collect();
    let mut launch = 0;
    let mut resumed = Vec::new();
    for (ts, l) in &lines {
        if l.starts_with("launch ") && l.contains(": ranks ") {
            launch += 1;
        } else if launch == 1 && l.starts_with("launch 1 ended with exit code ") {
            t.control_s = Some(r4(ts - t_kill));
        } else if launch == 2 && l.contains(": resuming from step ") {
            // "rank R on NODE: resuming from step S (last complete checkpoint: step C)"
            let w: Vec<&str> = l.split_whitespace().collect();
            let num = |i: usize| w.get(i).and_then(|s| s.trim_end_matches(')').parse::<u32>().ok());
            resumed.push((*ts, num(1), num(7), num(12)));
        }
    }
    let out_tail = || out.lines().rev().take(12).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join(" / ");
    if resumed.len() != RANKS as usize {
        return Err(format!("{} ranks resumed in a second launch, not {RANKS}: {}", resumed.len(), out_tail()));
    }
    t.resumed_s = resumed.iter().map(|r| r.0).max_by(f64::total_cmp).map(|x| r4(x - t_kill));
    // Every rank resumes from the newest checkpoint complete on every rank: the smallest of their last ones.
    let common = resumed.iter().filter_map(|r| r.3).min().unwrap_or(0);
    for (_, rank, step, last) in &resumed {
        let (Some(rank), Some(step), Some(last)) = (rank, step, last) else {
            return Err(format!("unreadable resume line: {}", out_tail()));
        };
        t.resumed_steps.push((*step, *last));
        if *step != common || common < MIN_STEP {
            return Err(format!(
                "rank {rank} resumed from step {step} (its last complete checkpoint: {last}), not from step {common}, \
                 the newest complete on every rank"
            ));
        }
    }
    let rebuilt = format!("rebuilt rank {}'s checkpoint", t.rank);
    if !lines.iter().any(|(_, l)| l.contains(&rebuilt) && l.contains(" on node6 from its partner copy")) {
        return Err(format!("rank {} was not rebuilt on the spare: {}", t.rank, out_tail()));
    }
    Ok(())
}

/// Vigil trial `i`.
fn vigil_trial(vigil: &Path, steps: u32, i: usize) -> Trial {
    let node = 2 + (i as u32 % RANKS);
    let mut t = Trial { node, rank: node - 2, ..Default::default() };
    if let Err(e) = vigil_measure(vigil, steps, &mut t) {
        t.error = Some(e);
    }
    t
}

fn vigil_measure(vigil: &Path, steps: u32, t: &mut Trial) -> Result<(), String> {
    let net = Netns { name: name('c'), vigil: vigil.to_path_buf() };
    Netns::run(vigil, &["up", &net.name, &NODES.to_string()], 180)?;
    let uri = format!("local://{}", net.dir().join("node0/local-0").display());
    let (work, root) = (net.dir().join("work"), net.dir().join("ckpt"));
    for d in [&work, &root] {
        std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
    }
    let path = format!(
        "{}:{}",
        vigil.parent().map(|d| d.display().to_string()).unwrap_or_default(),
        std::env::var("PATH").unwrap_or_default()
    );
    let v = |args: &[&str]| {
        let mut c = Command::new(vigil);
        c.args(args).env("VIGIL_URI", &uri).env("PATH", &path).current_dir(&work);
        c
    };
    out_of(v(&["resource", "drain", "0", "login"]), "vigil resource drain", 30)?;
    let (batch, app) = (examples().join("batch.sh"), examples().join("app.sh"));
    let mut c = v(&["batch", "-N6"]);
    c.arg(&batch).arg(&app).arg(steps.to_string()).env("CKPT_ROOT", &root).env("STEP_S", STEP_S);
    let id = out_of(c, "vigil batch", 60)?.trim().to_string();
    let out_path = work.join(format!("vigil-{id}.out"));
    let output = || std::fs::read_to_string(&out_path).unwrap_or_default();
    wait_ready(&root, output)?;
    let t_kill = net.kill(t.node)?;
    let waited = run_captured(v(&["job", "wait", &id]), Duration::from_secs(120))?;
    let Captured::Exited { status, .. } = waited else {
        return Err(format!("job {id} still running 120 s after the kill"));
    };
    t.exit_code = status.code();
    if t.exit_code != Some(0) {
        return Err(format!("the batch job exited {status}: {}", output()));
    }
    parse(&output(), t_kill, t)
}

/// Slurm trial `i` with `SlurmdTimeout=timeout_s`.
fn slurm_trial(vigil: &Path, timeout_s: u64, steps: u32, i: usize) -> Trial {
    let node = 2 + (i as u32 % RANKS);
    let mut t = Trial { node, rank: node - 2, ..Default::default() };
    if let Err(e) = slurm_measure(vigil, timeout_s, steps, &mut t) {
        t.error = Some(e);
    }
    t
}

fn slurm_measure(vigil: &Path, timeout_s: u64, steps: u32, t: &mut Trial) -> Result<(), String> {
    let net = Netns { name: name('k'), vigil: vigil.to_path_buf() };
    Netns::run(vigil, &["nodes", &net.name, &NODES.to_string()], 60)?;
    let dir = std::env::temp_dir().join(format!("vigil-bench-slurm-ckpt-{}", std::process::id()));
    let (work, root, shim) = (dir.join("work"), dir.join("ckpt"), dir.join("bin"));
    for d in [&work, &root, &shim] {
        std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
    }
    let s = Slurm { dir: dir.clone(), ns0: format!("vn-{}-n0", net.name) };
    let mut up = Command::new(Slurm::script());
    up.arg("netns").arg(&dir).arg(&net.name).arg(NODES.to_string());
    up.env("SLURM_EXTRA_CONF", format!("SlurmdTimeout={timeout_s}"));
    out_of(up, "slurm-cluster.sh netns", 120)?;
    let vigil_shim = shim.join("vigil");
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(&vigil_shim, VIGIL_SHIM).map_err(|e| format!("{}: {e}", vigil_shim.display()))?;
    std::fs::set_permissions(&vigil_shim, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| format!("{}: {e}", vigil_shim.display()))?;
    let mut c = s.cmd(&["sbatch", "--parsable", "--no-kill", "-N6", "--exclusive", "-o"]);
    c.arg(work.join("slurm-%j.out")).arg(examples().join("batch.sh")).arg(examples().join("app.sh"));
    c.arg(steps.to_string()).current_dir(&work).env("CKPT_SCHED", "slurm").env("CKPT_ROOT", &root);
    c.env("STEP_S", STEP_S).env("PATH", format!("{}:{}", shim.display(), std::env::var("PATH").unwrap_or_default()));
    let id = out_of(c, "sbatch", 60)?.trim().to_string();
    let out_path = work.join(format!("slurm-{id}.out"));
    let output = || std::fs::read_to_string(&out_path).unwrap_or_default();
    wait_ready(&root, output)?;
    let t_kill = net.kill(t.node)?;
    let bound = Duration::from_secs(3 * timeout_s + 180);
    let t0 = Instant::now();
    let field = |show: &str, key: &str| {
        show.split_whitespace().find_map(|w| w.strip_prefix(key).map(str::to_string)).unwrap_or_default()
    };
    let job = loop {
        let job = s.out(&["scontrol", "-o", "show", "job", &id]).unwrap_or_default();
        let state = field(&job, "JobState=");
        if !state.is_empty() && !matches!(state.as_str(), "RUNNING" | "PENDING" | "COMPLETING" | "CONFIGURING") {
            break job;
        }
        if t0.elapsed() > bound {
            let _ = s.out(&["scancel", &id]);
            return Err(format!("job {id} still {state} {} s after the kill: cancelled", bound.as_secs()));
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    // ExitCode=CODE:SIGNAL
    t.exit_code = field(&job, "ExitCode=").split(':').next().and_then(|c| c.parse().ok());
    if t.exit_code != Some(0) {
        return Err(format!("the job ended {}: {}", field(&job, "ExitCode="), output()));
    }
    parse(&output(), t_kill, t)
}

/// `vigil-bench ckpt`.
pub(crate) fn run(a: &CkptArgs, vigil: Option<PathBuf>, out_dir: Option<PathBuf>) -> Result<i32, String> {
    let vigil = find_vigil(vigil)?;
    let out_dir = results_dir(out_dir);
    let load = std::fs::read_to_string("/proc/loadavg").ok().and_then(|l| l.split_whitespace().next()?.parse().ok());
    let t_start = now_epoch_s();
    let mut series = vec![Series { system: "vigil".into(), slurmd_timeout_s: None, trials: Vec::new() }];
    for i in 0..a.trials {
        let t = vigil_trial(&vigil, a.steps, i);
        eprintln!("vigil-bench ckpt: vigil trial {}/{}: {t:?}", i + 1, a.trials);
        series[0].trials.push(t);
    }
    if !a.no_slurm {
        for (k, &timeout) in a.slurmd_timeouts.iter().enumerate() {
            let n = *a.slurm_trials.get(k).or(a.slurm_trials.last()).unwrap_or(&1);
            let mut s = Series { system: "slurm".into(), slurmd_timeout_s: Some(timeout), trials: Vec::new() };
            for i in 0..n {
                let t = slurm_trial(&vigil, timeout, a.steps, i);
                eprintln!("vigil-bench ckpt: slurm (SlurmdTimeout={timeout}) trial {}/{n}: {t:?}", i + 1);
                s.trials.push(t);
            }
            series.push(s);
        }
    }
    let md = markdown(&series, a, load, now_epoch_s() - t_start);
    let doc = json!({"steps": a.steps, "step_s": STEP_S, "min_step": MIN_STEP, "load_avg_1m": load, "series": series});
    write_results(&out_dir, "ckpt", &doc, &md)?;
    print!("{md}");
    Ok(if series.iter().all(|s| s.trials.iter().all(|t| t.error.is_none())) { 0 } else { 1 })
}

fn cell(x: Option<f64>) -> String {
    x.map(|x| if x < 10.0 { format!("{x:.3}") } else { format!("{x:.1}") }).unwrap_or_else(|| "-".into())
}

/// The results table and its notes.
fn markdown(series: &[Series], a: &CkptArgs, load: Option<f64>, took_s: f64) -> String {
    let mut md = String::from("# N+1 checkpoint/restart under a silent node kill (`vigil-bench ckpt`)\n\n");
    md.push_str(&format!(
        "7 network-namespace nodes per trial (`ci/netns-cluster.sh`); node0 is the login/controller node; the batch \
         job takes node1-6 (`vigil batch -N6`, `sbatch --no-kill -N6 --exclusive`): the script on node1, the 4 ranks \
         of `examples/ckpt/app.sh` ({} steps of {STEP_S} s) on node2-5, node6 the spare. Once every rank has a \
         complete checkpoint at step {MIN_STEP}, the node of rank `trial mod 4` is killed silently (link cut, every \
         process SIGKILLed). Seconds after the kill, from the time stamps of the script's and the application's \
         lines. A trial counts if the job exited 0, every rank resumed from the newest checkpoint complete on every \
         rank and the lost rank was rebuilt on the spare. 1-minute load average before the run: {}; the run took {:.0} \
         minutes.\n\n",
        a.steps,
        load.map_or("unknown".into(), |l: f64| format!("{l:.2}")),
        took_s / 60.0
    ));
    md.push_str(
        "| system | trials counted | script got control, p50 | p99 | every rank resumed, p50 | p99 | min | max |\n",
    );
    md.push_str("|---|---:|---:|---:|---:|---:|---:|---:|\n");
    for s in series {
        let sys = match s.slurmd_timeout_s {
            Some(t) => format!("Slurm 22.05, SlurmdTimeout={t} s"),
            None => "Vigil (defaults), examples/ckpt".into(),
        };
        let control: Vec<f64> = s.ok().filter_map(|t| t.control_s).collect();
        let resumed: Vec<f64> = s.ok().filter_map(|t| t.resumed_s).collect();
        let (c50, r50) = (summarize(&control).0, summarize(&resumed));
        md.push_str(&format!(
            "| {sys} | {} of {} | {} | {} | {} | {} | {} | {} |\n",
            s.ok().count(),
            s.trials.len(),
            cell(c50),
            cell(p99(&control)),
            cell(r50.0),
            cell(p99(&resumed)),
            cell(r50.1),
            cell(r50.2)
        ));
    }
    let vigil_p99 = series.first().and_then(|s| p99(&s.ok().filter_map(|t| t.resumed_s).collect::<Vec<_>>()));
    md.push_str(&format!(
        "\nTarget (issue 36): every rank resumed within 0.5 s of the kill at p99 for Vigil: {}.\n",
        match vigil_p99 {
            Some(p) if p <= 0.5 => format!("met ({p:.3} s)"),
            Some(p) => format!("MISSED ({p:.3} s)"),
            None => "not measured".into(),
        }
    ));
    md.push_str(
        "\np99 is nearest-rank: with fewer than 100 trials it is the maximum. Slurm runs the same \
         `examples/ckpt/batch.sh` with `CKPT_SCHED=slurm`, its Slurm commands (`sinfo -t down` to learn the lost \
         node, `srun --exclude=LOST --distribution=arbitrary` with `SLURM_HOSTFILE` to put each rank with its \
         checkpoint) around the same `app.sh`; its first launch ends only when slurmctld sets the silent node down, which \
         follows `SlurmdTimeout`. The SlurmdTimeout=300 s series has 2 trials by default (`--slurm-trials 20,2`): \
         each takes 6-7 minutes, so 20 would take over two hours.\n",
    );
    for s in series {
        for (i, t) in s.trials.iter().enumerate() {
            if let Some(e) = &t.error {
                let sys = s.slurmd_timeout_s.map_or("Vigil".to_string(), |x| format!("Slurm {x} s"));
                let e: String = e.chars().take(400).collect();
                md.push_str(&format!(
                    "\n- {sys}, trial {} (node{} killed): not counted: {}",
                    i + 1,
                    t.node,
                    e.replace('\n', " ")
                ));
            }
        }
    }
    md.push('\n');
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scripts_iso_stamps_are_read_to_the_microsecond() {
        let t = iso_secs("2026-12-06T21:55:43.123456Z").unwrap();
        assert!((t - 1_796_594_143.123_456).abs() < 1e-6, "{t}");
        assert_eq!(iso_secs("1796594143.123456"), None, "the old epoch stamps are not ISO times");
        assert_eq!(iso_secs("launch"), None);
    }

    #[test]
    fn a_trial_is_read_from_stamped_lines() {
        let out = "2026-12-06T21:55:40.000000Z launch 1: ranks 0-3 on node[2-5], spare: node6\n\
                   2026-12-06T21:55:41.500000Z launch 1 ended with exit code 1\n\
                   2026-12-06T21:55:41.550000Z rebuilt rank 0's checkpoint (step 3) on node6 from its partner copy on \
                   node3\n\
                   2026-12-06T21:55:41.600000Z launch 2: ranks 0-3 on node[2,4-6], spare: none\n"
            .to_string()
            + &(0..RANKS)
                .map(|r| {
                    format!(
                        "2026-12-06T21:55:42.{}00000Z rank {r} on node{}: resuming from step {MIN_STEP} (last complete \
                         checkpoint: step {MIN_STEP})\n",
                        r,
                        r + 2
                    )
                })
                .collect::<String>();
        let t_kill = iso_secs("2026-12-06T21:55:41.000000Z").unwrap();
        let mut t = Trial::default();
        parse(&out, t_kill, &mut t).unwrap();
        assert_eq!(t.control_s, Some(0.5));
        assert_eq!(t.resumed_s, Some(1.3), "the last rank resumed 1.3 s after the kill");
    }
}
