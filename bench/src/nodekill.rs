//! The node-kill part of `vigil-bench sched`: a node killed silently under a running 4-node job, Slurm 22.05
//! (`sbatch --no-kill`) and Vigil (`vigil batch`) in the same run, on the same shape of network-namespace cluster.
//!
//! Both clusters have 5 "nodes" made by `ci/netns-cluster.sh` (each a network namespace with its own address on
//! a private bridge): node0 is the controller/login node (Slurm: slurmctld only, started by
//! `ci/slurm-cluster.sh netns`, one slurmd on each of node1-4; Vigil: rank 0, drained, one broker per node).
//! The job takes node1-4 (`sbatch --no-kill -N4 --exclusive`, `vigil batch -N4`); its script runs [`SCRIPT`]:
//! a step of one task per node on all 4 nodes (`srun --overlap -N4 -n4 sleep`, `vigil submit -N4 -n4 sleep`),
//! then, once the harness has killed node2 (`netns-cluster.sh kill`: link cut, then every process of the node
//! SIGKILLed, so nothing tells the peers), it launches `-N3 -n3 true` again and again (each try bounded to 60 s)
//! until one succeeds on the survivors, says what became of the 4-node step, and exits 0.
//!
//! Measured, in seconds after the kill:
//! - the scheduler's verdict: Slurm's node state `*` (not responding) and `down`, polled with `sinfo` every
//!   [`POLL_S`]; Vigil's `offline` (lost) resource event of rank 2, from its timestamp;
//! - the job told: Slurm removes the node from the job (`NumNodes` 4 -> 3, polled); Vigil's `node-failure`
//!   exception in the job's eventlog (timestamp);
//! - a new 3-node job step / job on the survivors: end of the first successful launch, and how many tries;
//! - the job's final state and exit code, and the 4-node step's fate.
//!
//! Slurm runs once per `SlurmdTimeout` asked for (the default 300 s and a short one): its down verdict follows
//! from that setting, and both are reported with the setting next to them. Everything started is removed by
//! guards (`slurm-cluster.sh down`, then `netns-cluster.sh down`), whatever happens.

use crate::{run_captured, Captured};
use serde::Serialize;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Nodes of each cluster: node0 (controller, login) and the job's 4.
const NODES: u32 = 5;
/// The node killed: the job's second node (Slurm's node2, Vigil's child rank 1), so that a 3-node launch
/// before the verdict would try it.
const KILLED: u32 = 2;
/// Polling period of Slurm's node and job state, seconds.
const POLL_S: f64 = 0.25;
/// Longest wait for the job's step to be running before the kill, seconds.
const START_TIMEOUT_S: u64 = 120;

/// The job script, for both systems: `SYS` (slurm|vigil), `GATE` (a directory shared with the harness),
/// `BOUND_S` (give up relaunching after this many seconds) and, for Vigil, `VIGIL` (the binary) in its
/// environment.
const SCRIPT: &str = r#"#!/bin/sh
# vigil-bench sched (node kill): a step on all 4 nodes; after the kill, 3-node launches until one runs.
now() { date +%s.%N; }
case "$SYS" in
slurm)
    srun --overlap -N4 -n4 sleep 3600 &
    step=$!
    until squeue -h -s -j "$SLURM_JOB_ID" -o %i | grep -q '\.0$'; do sleep 0.1; done
    launch3() { timeout 60 srun --overlap -N3 -n3 true; }
    ;;
vigil)
    step=$("$VIGIL" submit -N4 -n4 sleep 3600) || exit 1
    until "$VIGIL" jobs --json | grep -q '"RUN"'; do sleep 0.1; done
    launch3() { timeout 60 "$VIGIL" run -N3 -n3 true; }
    ;;
esac
sleep 1
echo started > "$GATE/started"
while [ ! -e "$GATE/killed" ]; do sleep 0.05; done
t0=$(date +%s)
n=0
while :; do
    n=$((n + 1))
    t=$(now)
    if launch3; then echo "ok $n $t $(now)"; break; fi
    echo "fail $n $t $(now)"
    [ $(($(date +%s) - t0)) -ge "$BOUND_S" ] && { echo "gave-up $n"; break; }
    sleep 0.1
done
case "$SYS" in
slurm)
    if kill -0 "$step" 2>/dev/null; then echo "step4 still running (cancelled now)"; kill "$step"; else echo "step4 ended"; fi
    wait "$step"
    echo "step4 exit $?"
    ;;
vigil)
    if "$VIGIL" jobs --json | grep -q '"RUN"'; then
        echo "step4 still running (cancelled now)"
        "$VIGIL" cancel "$step" 2>/dev/null
    else
        echo "step4 ended"
    fi
    "$VIGIL" job wait "$step" >/dev/null 2>&1
    echo "step4 exit $?"
    ;;
esac
exit 0
"#;

/// One system's run.
#[derive(Serialize, Debug, Default, Clone)]
pub(crate) struct NodeKill {
    /// "slurm" or "vigil".
    pub(crate) system: String,
    /// Slurm's SlurmdTimeout, seconds (Vigil: none).
    pub(crate) slurmd_timeout_s: Option<u64>,
    /// Seconds after the kill: first seen not responding (Slurm `*`) / torpid (Vigil).
    pub(crate) unresponsive_s: Option<f64>,
    /// Seconds after the kill: node down (Slurm) / lost (Vigil).
    pub(crate) down_s: Option<f64>,
    /// Seconds after the kill: the job told (Slurm: node removed from the job; Vigil: node-failure exception).
    pub(crate) job_told_s: Option<f64>,
    /// Seconds after the kill: end of the first 3-node launch that succeeded.
    pub(crate) new_job_s: Option<f64>,
    /// Launches tried until one succeeded.
    pub(crate) tries: Option<u32>,
    /// Whether the job stayed running through the loss (it was not ended by it).
    pub(crate) survived: Option<bool>,
    /// The job's final state.
    pub(crate) final_state: Option<String>,
    /// The job's exit code as its system shows it.
    pub(crate) exit_code: Option<String>,
    /// What became of the 4-node step that ran on the killed node.
    pub(crate) step4: Option<String>,
    /// Error, if the run failed.
    pub(crate) error: Option<String>,
}

/// A netns cluster of the harness's own, removed (`netns-cluster.sh down`) when dropped.
pub(crate) struct Netns {
    pub(crate) name: String,
    pub(crate) vigil: PathBuf,
}

impl Netns {
    fn script() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../ci/netns-cluster.sh")
    }

    /// Run `netns-cluster.sh args` (bounded to `timeout_s`).
    pub(crate) fn run(vigil: &Path, args: &[&str], timeout_s: u64) -> Result<String, String> {
        let mut c = Command::new(Self::script());
        c.args(args).env("VIGIL", vigil);
        out_of(c, &format!("netns-cluster.sh {}", args.join(" ")), timeout_s)
    }

    pub(crate) fn dir(&self) -> PathBuf {
        std::env::var_os("VIGIL_NETNS_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/tmp"))
            .join(format!("vigil-netns-{}", self.name))
    }

    /// Silent death of node `k`; the wall time (s since the epoch) just before.
    pub(crate) fn kill(&self, k: u32) -> Result<f64, String> {
        let t = crate::now_epoch_s();
        Self::run(&self.vigil, &["kill", &self.name, &k.to_string()], 30)?;
        Ok(t)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if let Err(e) = Self::run(&self.vigil, &["down", &self.name], 120) {
            eprintln!("vigil-bench: removing netns cluster {}: {e}", self.name);
        }
    }
}

/// A Slurm cluster on a [`Netns`], stopped (`slurm-cluster.sh down`) when dropped.
pub(crate) struct Slurm {
    pub(crate) dir: PathBuf,
    /// Node 0's namespace, where clients run.
    pub(crate) ns0: String,
}

impl Slurm {
    pub(crate) fn script() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../ci/slurm-cluster.sh")
    }

    /// A Slurm client command run in node 0's namespace, pointed at this cluster.
    pub(crate) fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns0]).args(args).env("SLURM_CONF", self.dir.join("slurm.conf"));
        for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("SLURM_") && k != "SLURM_CONF") {
            c.env_remove(k);
        }
        c
    }

    pub(crate) fn out(&self, args: &[&str]) -> Result<String, String> {
        out_of(self.cmd(args), &args.join(" "), 60)
    }
}

impl Drop for Slurm {
    fn drop(&mut self) {
        let mut c = Command::new(Self::script());
        c.arg("down").arg(&self.dir);
        if let Err(e) = out_of(c, "slurm-cluster.sh down", 120) {
            eprintln!("vigil-bench: stopping Slurm in {}: {e}", self.dir.display());
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Stdout of `c` if it exits 0 within `timeout_s`, else an error quoting its stderr.
pub(crate) fn out_of(c: Command, what: &str, timeout_s: u64) -> Result<String, String> {
    match run_captured(c, Duration::from_secs(timeout_s))? {
        Captured::Exited { status, stdout, .. } if status.success() => Ok(stdout),
        Captured::Exited { status, stderr, stdout, .. } => {
            Err(format!("`{what}` failed ({status}): {}{}", stdout.trim(), stderr.trim()))
        }
        Captured::TimedOut => Err(format!("`{what}` hung: killed after {timeout_s} s")),
    }
}

/// A short cluster name of this process (netns-cluster.sh takes at most 6 characters).
pub(crate) fn name(tag: char) -> String {
    format!("nk{tag}{:03}", std::process::id() % 1000)
}

/// Write the job script into `work` and make the gate directory; (script, gate).
fn prepare(work: &Path) -> Result<(PathBuf, PathBuf), String> {
    let gate = work.join("gate");
    std::fs::create_dir_all(&gate).map_err(|e| format!("{}: {e}", gate.display()))?;
    let script = work.join("job.sh");
    std::fs::write(&script, SCRIPT).map_err(|e| format!("{}: {e}", script.display()))?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| format!("{}: {e}", script.display()))?;
    Ok((script, gate))
}

/// Wait (at most [`START_TIMEOUT_S`]) until the job script says its 4-node step runs.
fn wait_started(gate: &Path, output: impl Fn() -> String) -> Result<(), String> {
    let t0 = Instant::now();
    while !gate.join("started").exists() {
        if t0.elapsed() > Duration::from_secs(START_TIMEOUT_S) {
            return Err(format!("the job's step did not start within {START_TIMEOUT_S} s; its output: {}", output()));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// Fill the new-job figures and the step's fate from the job script's output, times relative to `t_kill`.
fn parse_output(out: &str, t_kill: f64, r: &mut NodeKill) {
    for l in out.lines() {
        let w: Vec<&str> = l.split_whitespace().collect();
        match w.as_slice() {
            ["ok", n, _, end] => {
                r.tries = n.parse().ok();
                r.new_job_s = end.parse::<f64>().ok().map(|e| e - t_kill);
            }
            ["gave-up", n] => r.tries = n.parse().ok(),
            ["step4", rest @ ..] => {
                let s = rest.join(" ");
                r.step4 = Some(match &r.step4 {
                    Some(prev) => format!("{prev}; {s}"),
                    None => s,
                });
            }
            _ => {}
        }
    }
}

/// The Slurm run with `SlurmdTimeout=timeout_s`, bounded to `bound_s` after the kill.
pub(crate) fn slurm(vigil: &Path, timeout_s: u64, bound_s: u64) -> NodeKill {
    let mut r = NodeKill { system: "slurm".into(), slurmd_timeout_s: Some(timeout_s), ..Default::default() };
    if let Err(e) = slurm_measure(vigil, timeout_s, bound_s, &mut r) {
        r.error = Some(e);
    }
    r
}

fn slurm_measure(vigil: &Path, timeout_s: u64, bound_s: u64, r: &mut NodeKill) -> Result<(), String> {
    let name = name('s');
    Netns::run(vigil, &["nodes", &name, &NODES.to_string()], 60)?;
    let net = Netns { name: name.clone(), vigil: vigil.to_path_buf() };
    let dir = std::env::temp_dir().join(format!("vigil-bench-slurm-nk-{}", std::process::id()));
    let work = dir.join("work");
    std::fs::create_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;
    let s = Slurm { dir: dir.clone(), ns0: format!("vn-{name}-n0") };
    let mut up = Command::new(Slurm::script());
    up.arg("netns").arg(&dir).arg(&name).arg(NODES.to_string());
    up.env("SLURM_EXTRA_CONF", format!("SlurmdTimeout={timeout_s}"));
    out_of(up, "slurm-cluster.sh netns", 120)?;
    let (script, gate) = prepare(&work)?;
    let mut c = s.cmd(&["sbatch", "--parsable", "--no-kill", "-N4", "--exclusive", "-o"]);
    c.arg(work.join("slurm-%j.out")).arg(&script).current_dir(&work);
    c.env("SYS", "slurm").env("GATE", &gate).env("BOUND_S", bound_s.to_string());
    let id = out_of(c, "sbatch", 60)?.trim().to_string();
    let out_path = work.join(format!("slurm-{id}.out"));
    let output = || std::fs::read_to_string(&out_path).unwrap_or_default();
    wait_started(&gate, output)?;

    let t_kill = net.kill(KILLED)?;
    std::fs::write(gate.join("killed"), "").map_err(|e| format!("gate: {e}"))?;
    let node = format!("node{KILLED}");
    let field = |show: &str, key: &str| {
        show.split_whitespace().find_map(|w| w.strip_prefix(key).map(str::to_string)).unwrap_or_default()
    };
    let t0 = Instant::now();
    let mut last = String::new();
    loop {
        let since = crate::now_epoch_s() - t_kill;
        let state = s.out(&["sinfo", "-h", "-n", &node, "-o", "%T"]).unwrap_or_default().trim().to_string();
        if state.ends_with('*') && r.unresponsive_s.is_none() {
            r.unresponsive_s = Some(since);
        }
        if state.starts_with("down") && r.down_s.is_none() {
            r.down_s = Some(since);
        }
        let job = s.out(&["scontrol", "-o", "show", "job", &id]).unwrap_or_default();
        if job.contains("NumNodes=3 ") && r.job_told_s.is_none() {
            r.job_told_s = Some(since);
        }
        let js = field(&job, "JobState=");
        if !js.is_empty() {
            last = job.clone();
        }
        if matches!(js.as_str(), "RUNNING" | "PENDING" | "COMPLETING" | "CONFIGURING") {
            if t0.elapsed() > Duration::from_secs(bound_s + 120) {
                let _ = s.out(&["scancel", &id]);
                return Err(format!("job {id} still {js} {} s after the kill: cancelled", bound_s + 120));
            }
        } else {
            break;
        }
        std::thread::sleep(Duration::from_secs_f64(POLL_S));
    }
    r.final_state = Some(field(&last, "JobState="));
    r.exit_code = Some(field(&last, "ExitCode="));
    // With --no-kill the loss must not end the job: it survived if it ended by its script's own exit.
    r.survived = Some(r.final_state.as_deref() == Some("COMPLETED"));
    parse_output(&output(), t_kill, r);
    Ok(())
}

/// The Vigil run, bounded to `bound_s` after the kill.
pub(crate) fn vigil(vigil: &Path, bound_s: u64) -> NodeKill {
    let mut r = NodeKill { system: "vigil".into(), ..Default::default() };
    if let Err(e) = vigil_measure(vigil, bound_s, &mut r) {
        r.error = Some(e);
    }
    r
}

fn vigil_measure(vigil: &Path, bound_s: u64, r: &mut NodeKill) -> Result<(), String> {
    let name = name('v');
    let net = Netns { name: name.clone(), vigil: vigil.to_path_buf() };
    // Up inside the guard: a half-started cluster is removed too.
    Netns::run(vigil, &["up", &name, &NODES.to_string()], 180)?;
    let uri = format!("local://{}", net.dir().join("node0/local-0").display());
    let work = net.dir().join("work");
    std::fs::create_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;
    let v = |args: &[&str], timeout_s: u64| {
        let mut c = Command::new(vigil);
        c.args(args).env("VIGIL_URI", &uri).current_dir(&work);
        out_of(c, &format!("vigil {}", args.join(" ")), timeout_s)
    };
    v(&["resource", "drain", "0", "login"], 30)?;
    let (script, gate) = prepare(&work)?;
    let mut c = Command::new(vigil);
    c.args(["batch", "-N4"]).arg(&script).env("VIGIL_URI", &uri).current_dir(&work);
    c.env("SYS", "vigil").env("GATE", &gate).env("BOUND_S", bound_s.to_string()).env("VIGIL", vigil);
    let id = out_of(c, "vigil batch", 60)?.trim().to_string();
    let out_path = work.join(format!("vigil-{id}.out"));
    let output = || std::fs::read_to_string(&out_path).unwrap_or_default();
    wait_started(&gate, output)?;

    let t_kill = net.kill(KILLED)?;
    std::fs::write(gate.join("killed"), "").map_err(|e| format!("gate: {e}"))?;
    // `vigil job wait` exits with the job's exit code: not an error here.
    let mut w = Command::new(vigil);
    w.args(["job", "wait", &id]).env("VIGIL_URI", &uri);
    let waited = run_captured(w, Duration::from_secs(bound_s + 120))?;
    if let Captured::TimedOut = waited {
        let _ = v(&["cancel", &id], 30);
        return Err(format!("job {id} still running {} s after the kill: cancelled", bound_s + 120));
    }
    let lines = |s: String| -> Vec<Value> { s.lines().filter_map(|l| serde_json::from_str(l).ok()).collect() };
    let idset_has = |s: &str, k: u32| vigil::idset::IdSet::parse(s).map(|i| i.contains(k)).unwrap_or(false);
    let revents = lines(v(&["resource", "eventlog", "--json"], 30)?);
    let at = |name: &str| {
        revents
            .iter()
            .find(|e| e["name"] == name && idset_has(e["context"]["idset"].as_str().unwrap_or(""), KILLED))
            .and_then(|e| e["timestamp"].as_f64())
            .map(|t| t - t_kill)
    };
    r.unresponsive_s = at("torpid");
    r.down_s = at("offline");
    let jevents = lines(v(&["job", "eventlog", "--json", &id], 30)?);
    r.job_told_s = jevents
        .iter()
        .find(|e| e["name"] == "exception" && e["context"]["type"] == "node-failure")
        .and_then(|e| e["timestamp"].as_f64())
        .map(|t| t - t_kill);
    let fatal_before_end = jevents.iter().any(|e| e["name"] == "exception" && e["context"]["severity"] == 0);
    let jobs: Value =
        serde_json::from_str(&v(&["jobs", "-a", "--json"], 30)?).map_err(|e| format!("vigil jobs: {e}"))?;
    let job = jobs["jobs"].as_array().and_then(|a| a.iter().find(|j| j["id_f58"].as_str() == Some(id.as_str())));
    if let Some(j) = job {
        r.final_state = j["result"].as_str().or(j["state"].as_str()).map(str::to_string);
        r.exit_code = j.get("exit_code").map(|c| c.to_string());
    }
    if r.exit_code.is_none() {
        if let Captured::Exited { status, .. } = waited {
            r.exit_code = status.code().map(|c| c.to_string());
        }
    }
    r.survived = Some(!fatal_before_end && r.final_state.as_deref() == Some("COMPLETED"));
    parse_output(&output(), t_kill, r);
    Ok(())
}

fn cell(x: Option<f64>) -> String {
    x.map(|x| if x < 10.0 { format!("{x:.2}") } else { format!("{x:.1}") }).unwrap_or_else(|| "-".into())
}

/// The markdown section of sched.md for these runs (`load`: the 1-minute load average before them).
pub(crate) fn section(runs: &[NodeKill], load: Option<f64>) -> String {
    let mut md = String::from("## Node killed under a running job\n\n");
    md.push_str(&format!(
        "5 network-namespace nodes (`ci/netns-cluster.sh`); node0 is the controller/login node (Slurm: slurmctld \
         alone; Vigil: rank 0, drained); a 4-node job on node1-4 (`sbatch --no-kill -N4 --exclusive`, `vigil batch \
         -N4`) runs a step of one task per node on all four, then node{KILLED} is killed silently (link cut, \
         every process SIGKILLed); the script then launches `-N3 -n3 true` (`srun --overlap`, `vigil run`) until \
         one runs. Seconds after the kill; Slurm's states polled every {POLL_S} s, Vigil's from its eventlog \
         timestamps. 1-minute load average before the runs: {}.\n\n",
        load.map_or("unknown".into(), |l| format!("{l:.2}"))
    ));
    md.push_str(
        "| system | node unresponsive | node down / lost | job told | new 3-node launch ran | tries | job survived | final state, exit code | the 4-node step |\n|---|---:|---:|---:|---:|---:|---|---|---|\n",
    );
    for r in runs {
        let sys = match r.slurmd_timeout_s {
            Some(t) => format!("Slurm, SlurmdTimeout={t} s"),
            None => "Vigil (defaults)".into(),
        };
        if let Some(e) = &r.error {
            md.push_str(&format!("| {sys} | FAILED: {} | | | | | | | |\n", e.replace('|', "/").replace('\n', " ")));
            continue;
        }
        md.push_str(&format!(
            "| {sys} | {} | {} | {} | {} | {} | {} | {} {} | {} |\n",
            cell(r.unresponsive_s),
            cell(r.down_s),
            cell(r.job_told_s),
            cell(r.new_job_s),
            r.tries.map_or("-".into(), |t| t.to_string()),
            match r.survived {
                Some(true) => "yes",
                Some(false) => "no",
                None => "-",
            },
            r.final_state.as_deref().unwrap_or("-"),
            r.exit_code.as_deref().unwrap_or("-"),
            r.step4.as_deref().unwrap_or("-")
        ));
    }
    md.push_str(
        "\nNode unresponsive: Slurm's `*` state (a ping unanswered), Vigil's `torpid` event (`-` if it went \
         straight to lost). Job told: Slurm removed the node from the job (`NumNodes` 3); Vigil raised a \
         `node-failure` exception on it. Until then, a Slurm launch that picks the dead node fails after \
         ~3 s (`Communication connection failure`), and is tried again. The 4-node step: both systems end a \
         step that loses a node (Vigil: a fatal `exec` exception, SIGTERM, as for any job that is not an \
         instance; Slurm: killed, SIGKILL, when the node is set down); the job around it goes on.\n",
    );
    md
}
