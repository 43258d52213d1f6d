//! Job commands: `run`, `submit`, `jobs`, `cancel`, `job submit|eventlog|attach|wait|cancel|info`.

use super::connect;
use crate::client::Client;
use crate::jobs::JobId;
use crate::jobspec::{Jobspec, JobspecBuilder};
use clap::{Args, Subcommand};
use serde_json::{json, Value};
use std::io::Write;

/// Options shared by `run` and `submit` (flux run / flux submit shapes).
#[derive(Args, Debug, Clone)]
#[command(trailing_var_arg = true)]
pub struct SubmitArgs {
    /// Number of nodes: N, or MIN-MAX (Slurm's --nodes=min-max: as many free nodes as there are, up to MAX, at
    /// least MIN; the job starts as soon as MIN are free).
    #[arg(short = 'N', long = "nodes", value_name = "N|MIN-MAX")]
    pub nodes: Option<NodeCount>,
    /// Number of tasks (default: 1, or one per node with -N).
    #[arg(short = 'n', long = "ntasks")]
    pub ntasks: Option<u32>,
    /// Cores per task.
    #[arg(short = 'c', long = "cores-per-task", default_value_t = 1)]
    pub cores_per_task: u32,
    /// GPUs per task.
    #[arg(short = 'g', long = "gpus-per-task", default_value_t = 0)]
    pub gpus_per_task: u32,
    /// Time limit: minutes, or a duration with a unit (30s, 10m, 2h, 1d); 0 or inf = none.
    #[arg(short = 't', long = "time-limit")]
    pub time_limit: Option<String>,
    /// Allocate whole nodes.
    #[arg(long)]
    pub exclusive: bool,
    /// Which nodes the job may run on.
    #[command(flatten)]
    pub select: NodeSelection,
    /// Its name, and when and in which order it leaves the queue.
    #[command(flatten)]
    pub queue: super::queue::QueueOpts,
    /// Which node runs which task rank (Flux's --taskmap, RFC 34): block (the default: consecutive ranks on each
    /// node), cyclic[:N] (dealt round-robin over the nodes, N at a time), manual:TASKMAP (an RFC 34 map, e.g.
    /// `manual:[[0,2,1,2]]`; needs -N), hostfile:FILE (task i on the host of line i of FILE, lines reused from
    /// the top, blank lines and # comments skipped, one task per line without -n; read now, and the job runs on
    /// exactly those hosts).
    #[arg(long, value_name = "SCHEME")]
    pub taskmap: Option<String>,
    /// If the job fails because one of its nodes is lost, put it back in the queue ahead of later jobs and run it
    /// again on live nodes (same id), at most `sched.max-requeue` times (`-o requeue` is the same).
    #[arg(long)]
    pub requeue: bool,
    /// Environment edits (repeatable): VAR=VAL sets, -PATTERN removes (a trailing * matches a prefix).
    /// The submitter's whole environment is passed by default.
    #[arg(long = "env", value_name = "RULE", allow_hyphen_values = true)]
    pub env: Vec<String>,
    /// Working directory of the tasks (default: the current directory; a relative one is taken from it).
    #[arg(long)]
    pub cwd: Option<String>,
    /// Shell option NAME[=VALUE] (repeatable): cpu-affinity=off|on|per-task, gpu-affinity=..., exit-timeout=DURATION|none
    /// (0 is none),
    /// kill-timeout=DURATION (SIGKILL this long after SIGTERM instead of exec.kill-timeout; at most
    /// exec.kill-timeout-max, 60s by default),
    /// exit-on-error (a task that exits non-zero or by a signal fails the whole job at once), memory=SIZE (per
    /// node, e.g. 4G; MiB without a unit, as Slurm's --mem; where the memory controller is enabled).
    #[arg(short = 'o', long = "setopt", value_name = "OPT")]
    pub setopt: Vec<String>,
    /// Prefix output lines with the task rank (`run` only).
    #[arg(short = 'l', long = "label-io")]
    pub label_io: bool,
    /// Print the jobspec instead of submitting it.
    #[arg(long)]
    pub dry_run: bool,
    /// Write the job's stdout (and stderr, unless --error) to this file (`{{id}}` = job id), on each node.
    #[arg(long)]
    pub output: Option<String>,
    /// Write the job's stderr to this file.
    #[arg(long)]
    pub error: Option<String>,
    /// Submit one copy of the job per id in IDSET (`1-100`, `0,4-7`), as `flux submit --cc`: in each, `{cc}` (or
    /// `{{cc}}`) in the command, its arguments and --output/--error becomes the id (not in --env), and VIGIL_JOB_CC
    /// is set to it. One job id is
    /// printed per line, in IDSET order (`submit` only).
    #[arg(long, value_name = "IDSET")]
    pub cc: Option<String>,
    /// Command and arguments.
    #[arg(value_name = "COMMAND", required = true)]
    pub command: Vec<String>,
}

/// Which nodes a job may run on (`run`, `submit`, `batch`, `alloc`): Flux's `--requires` and `--exclude`, with
/// `-w/--nodelist` (only these nodes, not Slurm's "all of these") and `-x`; all must hold (`attributes.system.constraints`, RFC 31). A request that
/// too few nodes satisfy is refused at submit, saying so.
#[derive(Args, Debug, Clone, Default)]
pub struct NodeSelection {
    /// Only nodes that meet SPEC (repeatable): `host:HOSTLIST` (`host:node[1-4]`) or `rank:IDSET`.
    #[arg(long = "requires", value_name = "SPEC")]
    pub requires: Vec<String>,
    /// Only these nodes (a host list, `node[1-4,7]`): the same as --requires=host:HOSTLIST. Unlike Slurm's -w, the job
    /// need not take every one of them (ask -N for that many).
    #[arg(short = 'w', long = "nodelist", value_name = "HOSTLIST")]
    pub nodelist: Option<String>,
    /// Not these nodes: a host list (`node3`), or broker ranks (`3`, `0-2`).
    #[arg(short = 'x', long = "exclude", value_name = "HOSTLIST|IDSET")]
    pub exclude: Option<String>,
}

impl NodeSelection {
    /// The options as typed, for messages: `-x node2 -w node[1,4] --requires=host:node1`.
    pub(crate) fn as_typed(&self) -> String {
        let mut v = Vec::new();
        if let Some(w) = &self.nodelist {
            v.push(format!("-w {w}"));
        }
        if let Some(x) = &self.exclude {
            v.push(format!("-x {x}"));
        }
        v.extend(self.requires.iter().map(|r| format!("--requires={r}")));
        v.join(" ")
    }

    /// The constraint these options make, if any.
    pub(crate) fn constraint(&self) -> Result<Option<vigil_proto::constraint::Constraint>, String> {
        vigil_proto::constraint::Constraint::from_options(
            &self.requires,
            self.nodelist.as_deref(),
            self.exclude.as_deref(),
        )
    }
}

/// A `-N` value: a node count `N` (`min == max`), or a range `MIN-MAX` (Slurm's `--nodes=min-max`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeCount {
    /// Fewest nodes the job runs on.
    pub min: u32,
    /// Most nodes it takes (equal to `min` for a plain count).
    pub max: u32,
}

impl std::str::FromStr for NodeCount {
    type Err = String;
    /// `N` or `MIN-MAX`, each at least 1, MIN no more than MAX.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let num = |t: &str, what: &str| -> Result<u32, String> {
            match t.trim().parse::<u32>() {
                Ok(0) => Err(format!("{what} must be at least 1")),
                Ok(n) => Ok(n),
                Err(_) => Err(format!("'{s}': expected a node count N or a range MIN-MAX (e.g. 4, 2-4)")),
            }
        };
        match s.split_once('-') {
            None => num(s, "the node count").map(|n| NodeCount { min: n, max: n }),
            Some((a, b)) => {
                let (min, max) = (num(a, "MIN")?, num(b, "MAX")?);
                if min > max {
                    return Err(format!("{s}: MIN ({min}) is more than MAX ({max})"));
                }
                Ok(NodeCount { min, max })
            }
        }
    }
}

impl std::fmt::Display for NodeCount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.min == self.max {
            write!(f, "{}", self.min)
        } else {
            write!(f, "{}-{}", self.min, self.max)
        }
    }
}

/// Parse `--taskmap` (reading a `hostfile:` now, relative to the current directory). Errors name the option once
/// (`--taskmap=hostfile:F: line 4: ...`, where the scheme's own message starts with `hostfile:F: ` too).
pub(crate) fn parse_taskmap(s: &str) -> Result<crate::taskmap::Scheme, String> {
    crate::taskmap::Scheme::parse(s, |path| std::fs::read_to_string(path).map_err(|e| e.to_string())).map_err(|e| {
        let e = e.to_string();
        let scheme = s.split(':').next().unwrap_or(s);
        let why = e.strip_prefix(&format!("{s}: ")).or_else(|| e.strip_prefix(&format!("{scheme}: "))).unwrap_or(&e);
        format!("--taskmap={s}: {why}")
    })
}

/// `e` (a refusal of the jobspec, by [`Jobspec::validate`] here or by rank 0) with each jobspec path of a shell
/// option the command line set said as the user typed it: `-o kill-timeout=100s: ...` or `--taskmap=...: ...`
/// instead of `attributes.system.shell.options.kill-timeout: ...`. A jobspec file keeps its paths.
pub(crate) fn said_as_typed(setopt: &[String], taskmap: Option<&str>, e: String) -> String {
    let mut out = e;
    let typed = setopt
        .iter()
        .map(|o| (o.split_once('=').map_or(o.as_str(), |(k, _)| k), format!("-o {o}")))
        .chain(taskmap.map(|t| ("taskmap", format!("--taskmap={t}"))));
    for (key, typed) in typed {
        out = out.replace(&format!("attributes.system.shell.options.{key}"), &typed);
    }
    // The job manager's check of a warning against the instance's default time limit.
    out.replace("attributes.system.shell.options.signal", "--signal")
}

/// A `hostfile:FILE` task map as the command line gave it: the option's text (`--taskmap=hostfile:FILE` or
/// `-o taskmap=hostfile:FILE`) and the file's hosts with their lines, so that errors name the option and the line.
struct Hostfile {
    option: String,
    entries: Vec<(usize, String)>,
}

impl Hostfile {
    /// The hostfile of `a`'s `--taskmap` or `-o taskmap=`, if it names one (read now).
    fn of(a: &SubmitArgs) -> Result<Option<Hostfile>, String> {
        let given = a
            .taskmap
            .as_deref()
            .map(|t| (format!("--taskmap={t}"), t))
            .into_iter()
            .chain(a.setopt.iter().filter_map(|o| o.strip_prefix("taskmap=").map(|t| (format!("-o {o}"), t))));
        for (option, t) in given {
            let Some(path) = t.strip_prefix("hostfile:").filter(|p| !p.is_empty()) else { continue };
            let text = std::fs::read_to_string(path).map_err(|e| format!("{option}: {e}"))?;
            let entries = crate::taskmap::hostfile_entries(&text).map_err(|e| format!("{option}: {e}"))?;
            return Ok(Some(Hostfile { option, entries }));
        }
        Ok(None)
    }

    /// Its distinct hosts, in the order they first appear, each with the line that first names it and the index
    /// of that entry (tasks 0, 1, ... take the entries in order).
    fn hosts(&self) -> Vec<(usize, usize, &str)> {
        let mut seen = std::collections::HashSet::new();
        self.entries
            .iter()
            .enumerate()
            .filter(|(_, (_, h))| seen.insert(h.as_str()))
            .map(|(i, (line, h))| (*line, i, h.as_str()))
            .collect()
    }

    /// Check it against `-N` and `-n` as given: its hosts are the job's nodes, one each, and each must run a
    /// task. Returns the task count: `-n`, or one task per entry (line) of the file without it.
    fn check(&self, nodes: Option<NodeCount>, ntasks: Option<u32>) -> Result<u32, String> {
        let hosts = self.hosts();
        let list: crate::hostlist::Hostlist = hosts.iter().map(|(_, _, h)| h.to_string()).collect();
        if let Some(n) = nodes {
            if n.min != n.max || n.min as usize != hosts.len() {
                return Err(format!(
                    "{}: the file names {} host(s) ({list}) and they are the job's nodes, one each, but -N {n} asks \
                     for other counts (leave -N out, or give -N {})",
                    self.option,
                    hosts.len(),
                    hosts.len()
                ));
            }
        }
        let n = ntasks.unwrap_or(self.entries.len().min(u32::MAX as usize) as u32);
        if let Some((line, i, h)) = hosts.iter().find(|(_, i, _)| *i >= n as usize) {
            return Err(format!(
                "{}: line {line}: host {h} would run no task: task i runs on the host of the file's entry i, and -n \
                 {n} stops before it; every host of the file is a node of the job and must run a task (give -n {} \
                 or more, or drop the host from the file)",
                self.option,
                i + 1
            ));
        }
        Ok(n)
    }

    /// Refuse, naming their lines, hosts on which the job could never run: not nodes of the instance `c` leads to
    /// (`resource.status`), left out by the job's own node selection (`select`: -x, -w, --requires), or lost in an
    /// instance that never gets a lost node back (a batch or alloc job's: `instance-level` above 0). Hosts that
    /// are lost, down or drained in a system instance are only warned about: the job waits for them. Said by rank 0
    /// too, without the lines; nothing if rank 0 does not answer.
    async fn check_nodes(&self, c: &Client, select: &NodeSelection) -> Result<(), String> {
        let Some(st) = super::rpc_to_rank0(c, "resource.status", &json!({})).await.ok() else { return Ok(()) };
        let rows: Vec<&Value> = st["ranks"].as_array().map(|a| a.iter().collect()).unwrap_or_default();
        let by_host: std::collections::HashMap<&str, &Value> =
            rows.iter().filter_map(|r| Some((r["hostname"].as_str()?, *r))).collect();
        let hosts = self.hosts();
        let unknown: Vec<String> = hosts
            .iter()
            .filter(|(_, _, h)| !by_host.contains_key(h))
            .map(|(line, _, h)| format!("line {line}: {h}"))
            .collect();
        if !unknown.is_empty() {
            let mut nodes: Vec<(u32, String)> = rows
                .iter()
                .filter_map(|r| Some((u32::try_from(r["rank"].as_u64()?).ok()?, r["hostname"].as_str()?.to_string())))
                .collect();
            nodes.sort();
            return Err(format!(
                "{}: not a node of this instance: {} (its nodes: {})",
                self.option,
                unknown.join(", "),
                in_rank_order(&nodes)
            ));
        }
        if let Some(cons) = select.constraint()? {
            let left_out: Vec<String> = hosts
                .iter()
                .filter(|(_, _, h)| {
                    let rank = by_host[h]["rank"].as_u64().and_then(|r| u32::try_from(r).ok()).unwrap_or(u32::MAX);
                    !cons.matches(rank, h)
                })
                .map(|(line, _, h)| format!("line {line}: {h}"))
                .collect();
            if !left_out.is_empty() {
                return Err(format!(
                    "{}: {}: the job's node selection ({}) leaves {} out, and every host of the file is a node of \
                     the job",
                    self.option,
                    left_out.join(", "),
                    select.as_typed(),
                    if left_out.len() == 1 { "it" } else { "them" }
                ));
            }
        }
        let nested = c
            .rpc("broker.getattr", crate::message::NODEID_ANY, &json!({"name": "instance-level"}))
            .await
            .ok()
            .and_then(|v| v["value"].as_str()?.parse::<u32>().ok())
            .is_some_and(|l| l > 0);
        let mut lost = Vec::new();
        for (line, _, h) in &hosts {
            let row = by_host[h];
            let state = row["state"].as_str().unwrap_or("");
            if matches!(state, "avail" | "torpid") {
                continue;
            }
            let reason = row["reason"].as_str().filter(|r| !r.is_empty()).map(|r| format!(": {r}")).unwrap_or_default();
            if state == "lost" && nested {
                lost.push(format!("line {line}: {h} ({state}{reason})"));
            } else {
                eprintln!(
                    "vigil: warning: {}: line {line}: {h} is {state}{reason}; the job waits until it is back",
                    self.option
                );
            }
        }
        if !lost.is_empty() {
            return Err(format!(
                "{}: {}: this instance is a job's (a batch or alloc job) and never gets a lost node back; `vigil \
                 resource status -s lost,down` lists the nodes to leave out",
                self.option,
                lost.join(", ")
            ));
        }
        Ok(())
    }
}

/// The nodes of the instance `c` leads to, `(rank, host name)` in rank order (`resource.status`); `None` if rank
/// 0 does not answer.
async fn instance_nodes(c: &Client) -> Option<Vec<(u32, String)>> {
    let st = super::rpc_to_rank0(c, "resource.status", &json!({})).await.ok()?;
    let mut nodes: Vec<(u32, String)> = st["ranks"]
        .as_array()?
        .iter()
        .filter_map(|r| Some((u32::try_from(r["rank"].as_u64()?).ok()?, r["hostname"].as_str()?.to_string())))
        .collect();
    nodes.sort();
    Some(nodes)
}

/// Host names in rank order, as one RFC 29 host list (`node[0-6]`, not `node[0,4,3,5,1,6,2]`).
fn in_rank_order(nodes: &[(u32, String)]) -> crate::hostlist::Hostlist {
    nodes.iter().map(|(_, h)| h.clone()).collect()
}

/// Refuse a `-x/--exclude` that names a node the instance `c` leads to does not have (a host name, or a rank
/// beyond its size), as Slurm's `--exclude` refuses an invalid node name: a typo would otherwise leave the node
/// meant to be avoided in the job's choice. (`-w` and `--requires=host:` name a set to choose from, which may hold
/// more than the instance's nodes: a host there that is not a node is only warned about by rank 0.) Nothing if
/// rank 0 does not answer.
pub(crate) async fn check_exclude(c: &Client, select: &NodeSelection) -> Result<(), String> {
    let Some(x) = select.exclude.as_deref() else { return Ok(()) };
    let Some(nodes) = instance_nodes(c).await else { return Ok(()) };
    let (unknown, theirs): (Vec<String>, String) = match crate::idset::IdSet::parse(x) {
        Ok(ranks) => (
            ranks.iter().filter(|r| !nodes.iter().any(|(n, _)| n == r)).map(|r| format!("rank {r}")).collect(),
            format!("its ranks: {}", nodes.iter().map(|(r, _)| *r).collect::<crate::idset::IdSet>()),
        ),
        Err(_) => (
            crate::hostlist::Hostlist::parse(x)
                .map_err(|e| format!("--exclude {x}: {e}"))?
                .iter()
                .filter(|h| !nodes.iter().any(|(_, n)| n == h))
                .map(str::to_string)
                .collect(),
            format!("its nodes: {}", in_rank_order(&nodes)),
        ),
    };
    if unknown.is_empty() {
        return Ok(());
    }
    Err(format!("--exclude {x}: not a node of this instance: {} ({theirs})", unknown.join(", ")))
}

/// Most `--cc` submissions in flight on the connection at once: enough to keep rank 0's loop busy, few enough
/// that an error is reported while the rest still go.
const CC_WINDOW: usize = 256;

/// `vigil submit --cc IDSET`: one job per id, submitted pipelined on one connection; prints their ids in IDSET
/// order. Returns 1 if any copy was refused (each refusal is said, naming its id), else 0.
async fn submit_copies(a: &SubmitArgs, cc: &str) -> Result<i32, String> {
    let set = crate::idset::IdSet::parse(cc).map_err(|e| format!("--cc {cc}: {e}"))?;
    if set.is_empty() {
        return Err(format!("--cc {cc}: no id"));
    }
    let copy = |i: u32| -> Result<Value, String> {
        // `{{cc}}` too, as `{{id}}` is written in --output (Flux's mustache form).
        let sub = |t: &str| t.replace("{{cc}}", &i.to_string()).replace("{cc}", &i.to_string());
        let mut b = a.clone();
        b.command = a.command.iter().map(|c| sub(c)).collect();
        b.output = a.output.as_deref().map(sub);
        b.error = a.error.as_deref().map(sub);
        b.env.push(format!("VIGIL_JOB_CC={i}"));
        let spec = build_jobspec(&b)?;
        serde_json::from_str(&spec.to_json()).map_err(|e| e.to_string())
    };
    // Every jobspec is checked before the first is submitted: a bad option refuses them all.
    let specs = set.iter().map(|i| copy(i).map(|v| (i, v))).collect::<Result<Vec<_>, _>>()?;
    if a.dry_run {
        for (_, v) in &specs {
            println!("{v}");
        }
        return Ok(0);
    }
    submit_all(specs, a.queue.urgency()).await
}

/// Submits jobspecs `(copy id, jobspec)` (already checked) over one connection, [`CC_WINDOW`] at a time, and
/// prints each job id on its own line in copy order; a refused copy is said on standard error (exit code 1) and
/// the others go on. Consecutive copies refused for the same reason are said once, as a range (`copies 12-300:
/// ...`): a connection lost in a flood fails every copy after it the same way. For `--cc` of `vigil submit` and
/// `vigil batch`.
pub(crate) async fn submit_all(specs: Vec<(u32, Value)>, urgency: Option<u32>) -> Result<i32, String> {
    let c = connect().await?;
    let mut rc = 0;
    let mut inflight = std::collections::VecDeque::new();
    let mut out = std::io::stdout().lock();
    let mut specs = specs.into_iter();
    let mut refused = Refusals::default();
    loop {
        while inflight.len() < CC_WINDOW {
            let Some((i, v)) = specs.next() else { break };
            let mut c = c.clone();
            inflight.push_back((i, tokio::spawn(async move { submit_value(&mut c, &v, false, urgency).await })));
        }
        let Some((i, h)) = inflight.pop_front() else { break };
        match h.await.map_err(|e| e.to_string()).and_then(|r| r) {
            Ok(id) => {
                refused.say();
                let _ = writeln!(out, "{id}");
            }
            Err(e) => {
                refused.add(i, e);
                rc = 1;
            }
        }
    }
    refused.say();
    Ok(rc)
}

/// The run of consecutive copies refused for the same reason that [`submit_all`] has not said yet.
#[derive(Default)]
struct Refusals(Option<(u32, u32, String)>);

impl Refusals {
    /// Copy `i` was refused with `why`: it extends the run, or the run is said and a new one starts.
    fn add(&mut self, i: u32, why: String) {
        if let Some(line) = self.push(i, why) {
            eprintln!("{line}");
        }
    }

    /// [`Refusals::add`], returning the line of the run it ended, if it ended one.
    fn push(&mut self, i: u32, why: String) -> Option<String> {
        if let Some((_, last, w)) = &mut self.0 {
            if *w == why && i == *last + 1 {
                *last = i;
                return None;
            }
        }
        let ended = self.line();
        self.0 = Some((i, i, why));
        ended
    }

    /// The run's line, if any (`vigil: copy N: WHY` or `vigil: copies N-M (K of them): WHY`); the run is said.
    fn line(&mut self) -> Option<String> {
        self.0.take().map(|(a, b, why)| match b - a {
            0 => format!("vigil: copy {a}: {why}"),
            n => format!("vigil: copies {a}-{b} ({} of them): {why}", n + 1),
        })
    }

    /// Say the run, if any, on standard error.
    fn say(&mut self) {
        if let Some(line) = self.line() {
            eprintln!("{line}");
        }
    }
}

/// An `--output`/`--error` path may hold `{{id}}` (the job id) and no other `{{...}}` template.
pub(crate) fn check_output_template(opt: &str, path: &str) -> Result<(), String> {
    let mut rest = path;
    while let Some(i) = rest.find("{{") {
        let after = &rest[i + 2..];
        let Some(j) = after.find("}}") else { break };
        let name = &after[..j];
        if name != "id" {
            return Err(format!(
                "{opt} {path}: unknown template {{{{{name}}}}} (only {{{{id}}}}, the job id, is known)"
            ));
        }
        rest = &after[j + 2..];
    }
    Ok(())
}

fn parse_time_limit(s: &str) -> Result<f64, String> {
    let t = s.trim();
    if t == "inf" || t == "infinity" || t == "none" {
        return Ok(0.0);
    }
    if let Ok(m) = t.parse::<f64>() {
        if !m.is_finite() {
            return Err(format!("-t {s}: must be a finite number of minutes (or inf, or FSD such as 90s, 2h)"));
        }
        if m < 0.0 {
            return Err(format!("-t {s}: must be >= 0"));
        }
        return Ok(m * 60.0);
    }
    let v = crate::duration::parse_duration_secs(t).map_err(|e| format!("-t {s}: {e}"))?;
    Ok(if v.is_finite() { v } else { 0.0 })
}

fn glob_match(pat: &str, name: &str) -> bool {
    match pat.strip_suffix('*') {
        Some(p) => name.starts_with(p),
        None => pat == name,
    }
}

/// Build the jobspec for `run`/`submit`.
pub(crate) fn build_jobspec(a: &SubmitArgs) -> Result<Jobspec, String> {
    let mut b = JobspecBuilder::new(a.command.clone())
        .cores_per_task(a.cores_per_task)
        .gpus_per_task(a.gpus_per_task)
        .exclusive(a.exclusive)
        .requeue(a.requeue)
        .constraint(a.select.constraint()?);
    if let Some(n) = a.queue.name()? {
        b = b.name(n);
    }
    for d in a.queue.dependencies(crate::broker_now())? {
        b = b.dependency(d);
    }
    let taskmap = a.taskmap.as_deref().map(parse_taskmap).transpose()?;
    let mut nodes = a.nodes;
    let mut ntasks = a.ntasks;
    if let Some(hf) = Hostfile::of(a)? {
        // A hostfile names the job's nodes: their number is the node count when -N is left out, and without -n
        // each of its entries (lines) is a task.
        if a.ntasks != Some(0) {
            ntasks = Some(hf.check(a.nodes, a.ntasks)?);
        }
        let hosts = hf.hosts().len() as u32;
        nodes = Some(NodeCount { min: hosts, max: hosts });
    }
    if let Some(t) = &taskmap {
        b = b.taskmap(t.clone());
    }
    if let Some(n) = nodes {
        if n.min == 0 {
            return Err("-N must be at least 1".into());
        }
        b = if n.max > n.min { b.nnodes_range(n.min, n.max) } else { b.nnodes(n.min) };
    }
    if let Some(n) = ntasks {
        if n == 0 {
            return Err("-n must be at least 1".into());
        }
        b = b.ntasks(n);
    }
    if a.cores_per_task == 0 {
        return Err("-c must be at least 1".into());
    }
    let limit = a.time_limit.as_deref().map(parse_time_limit).transpose()?;
    if let Some(l) = limit {
        b = b.duration(l);
    }
    if let Some(w) = a.queue.warning(limit)? {
        b = b.shell_option(crate::jobspec::SIGNAL_KEY, w.to_value());
    }
    // Relative to where the command runs, as Slurm's --chdir.
    let here = || std::env::current_dir().map_err(|e| format!("cannot read the current directory: {e}"));
    let cwd = match &a.cwd {
        Some(c) if std::path::Path::new(c).is_absolute() => c.clone(),
        Some(c) => here()?.join(c).display().to_string(),
        None => here()?.display().to_string(),
    };
    b = b.cwd(cwd);
    let mut env: std::collections::BTreeMap<String, String> =
        std::env::vars().filter(|(k, _)| !k.starts_with("VIGIL_")).collect();
    for rule in &a.env {
        if let Some(p) = rule.strip_prefix('-') {
            env.retain(|k, _| !glob_match(p, k));
        } else if let Some((k, v)) = rule.split_once('=') {
            if k.is_empty() {
                return Err(format!("--env {rule}: empty variable name"));
            }
            env.insert(k.into(), v.into());
        } else if let Ok(v) = std::env::var(rule) {
            env.insert(rule.clone(), v);
        }
    }
    for (k, v) in env {
        b = b.env(k, v);
    }
    for o in &a.setopt {
        let (k, v) = match o.split_once('=') {
            Some((k, v)) => (k, Value::String(v.into())),
            None => (o.as_str(), Value::Bool(true)),
        };
        match (k, &v) {
            ("cpu-affinity", Value::String(s)) => {
                s.parse::<crate::hwloc::CpuAffinity>().map_err(|e| format!("-o {o}: {e}"))?;
            }
            ("gpu-affinity", Value::String(s)) => {
                s.parse::<crate::hwloc::GpuAffinity>().map_err(|e| format!("-o {o}: {e}"))?;
            }
            ("exit-on-error", Value::String(s))
                if !matches!(s.as_str(), "1" | "true" | "yes" | "on" | "0" | "false" | "no" | "off") =>
            {
                return Err(format!("-o {o}: expected exit-on-error[=1|0|true|false|yes|no|on|off]"));
            }
            ("memory", Value::String(s)) => {
                crate::shellproto::parse_memory_size(s).map_err(|e| format!("-o {o}: {e}"))?;
            }
            ("memory", _) => return Err(format!("-o {o}: expected memory=SIZE (per node, e.g. 4G)")),
            // The job shell's `PmiChoice` (shell/src/pmix.rs) reads the same grammar.
            ("pmi", Value::String(s))
                if !matches!(s.as_str(), "on" | "off" | "none")
                    && !s.split(',').all(|n| matches!(n.trim(), "simple" | "pmi1" | "pmix")) =>
            {
                return Err(format!(
                    "-o {o}: expected pmi=LIST of simple (PMI-1, MPICH) and pmix (PMIx, Open MPI), pmi=on \
                     (both) or pmi=off (default: simple)"
                ));
            }
            ("exit-timeout", Value::String(s)) if s != "none" => {
                crate::duration::parse_duration_secs(s).map_err(|e| format!("-o {o}: {e}"))?;
            }
            ("kill-timeout", Value::String(s)) => {
                let t = crate::duration::parse_duration_secs(s).map_err(|e| format!("-o {o}: {e}"))?;
                if !t.is_finite() {
                    return Err(format!("-o {o}: a kill timeout must be finite (at most the instance's exec.kill-timeout-max)"));
                }
            }
            ("kill-timeout" | "exit-timeout", Value::Bool(_)) => {
                return Err(format!("-o {o}: expected {o}=DURATION (e.g. 2s, an RFC 23 duration)"));
            }
            ("requeue", Value::String(s))
                if !matches!(s.as_str(), "1" | "true" | "yes" | "on" | "0" | "false" | "no" | "off") =>
            {
                return Err(format!("-o {o}: expected requeue[=1|0|true|false|yes|no|on|off]"));
            }
            ("taskmap", Value::String(s)) => {
                // Its JSON form: a hostfile is read now, as for --taskmap.
                let t = parse_taskmap(s).map_err(|e| format!("-o {o}: {e}"))?;
                b = b.shell_option(k, t.to_value());
                continue;
            }
            (
                "cpu-affinity" | "gpu-affinity" | "exit-timeout" | "kill-timeout" | "pmi" | "output" | "exit-on-error"
                | "requeue" | "on-node-loss",
                _,
            ) => {}
            _ => eprintln!(
                "vigil: warning: unknown shell option '{k}' (known: cpu-affinity, gpu-affinity, exit-timeout, kill-timeout, pmi, exit-on-error, requeue, on-node-loss, memory, taskmap)"
            ),
        }
        b = b.shell_option(k, v);
    }
    let mut out = serde_json::Map::new();
    if let Some(p) = &a.output {
        check_output_template("--output", p)?;
        out.insert("stdout".into(), json!({"type": "file", "path": p}));
    }
    if let Some(p) = &a.error {
        check_output_template("--error", p)?;
        out.insert("stderr".into(), json!({"type": "file", "path": p}));
    }
    if !out.is_empty() {
        b = b.shell_option("output", Value::Object(out));
    }
    b.build().map_err(|e| said_as_typed(&a.setopt, a.taskmap.as_deref(), e.to_string()))
}

/// `vigil run` (attach = true) and `vigil submit`.
pub(crate) async fn run(a: SubmitArgs, attach_after: bool) -> Result<i32, String> {
    if let Some(cc) = &a.cc {
        if attach_after {
            return Err(
                "--cc is for `vigil submit` (each copy is a job of its own; `vigil job wait ID` waits for one)".into(),
            );
        }
        return submit_copies(&a, cc).await;
    }
    let spec = build_jobspec(&a)?;
    if a.dry_run {
        println!("{}", spec.to_json());
        return Ok(0);
    }
    let mut c = connect().await?;
    if let Some(hf) = Hostfile::of(&a)? {
        hf.check_nodes(&c, &a.select).await?;
    }
    check_exclude(&c, &a.select).await?;
    let id = submit_with(&mut c, &spec, attach_after, a.queue.urgency())
        .await
        .map_err(|e| said_as_typed(&a.setopt, a.taskmap.as_deref(), e))?;
    if !attach_after {
        println!("{id}");
        return Ok(0);
    }
    // Standard input goes to every task (as srun does by default), paced by rank 0's acknowledgements.
    let c2 = c.clone();
    let feeder = tokio::spawn(async move {
        use base64::Engine as _;
        use tokio::io::AsyncReadExt;
        let mut input = tokio::io::stdin();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match input.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let data = base64::engine::general_purpose::STANDARD.encode(&buf[..n]);
                    match c2.rpc("job-exec.stdin", 0, &json!({"id": id.0, "data": data})).await {
                        Ok(_) => {}
                        // Rank 0 holds a job's input until it ends, up to a bound: past it, say so and end the
                        // tasks' input where it was cut rather than leave them waiting for the rest.
                        Err(e) if e.errnum == crate::message::errno::ENOSPC => {
                            eprintln!("vigil: standard input cut short: {}", e.errstr);
                            break;
                        }
                        // The job's input is closed (it ended) or the instance is gone: nothing to tell.
                        Err(_) => return,
                    }
                }
            }
        }
        let _ = c2.rpc("job-exec.stdin", 0, &json!({"id": id.0, "eof": true})).await;
    });
    let r = followed(attach(&c, id, a.label_io).await, id);
    feeder.abort();
    r
}

/// The exit code of `vigil run`, `vigil job attach` and `vigil job wait` when they lose rank 0 (stopped,
/// restarted, killed) while they follow a job: 255, as ssh(1) exits 255 when its connection fails rather than with
/// the remote command's status. The job itself may well run on (with a state directory rank 0 comes back with it),
/// so its exit code is not known. A job can exit 255 too (`exit -1`): the line on stderr says which it was.
pub(crate) const EXIT_RANK0_LOST: i32 = 255;

/// What a command that followed job `id` to its end exits with: its `Ok` code, or, when its connection to rank 0
/// was lost (the connection to our broker ended, or our broker answered EHOSTUNREACH: it lost rank 0),
/// [`EXIT_RANK0_LOST`] after saying how to find the job again; any other error as it is.
fn followed(r: Result<i32, crate::client::RpcError>, id: JobId) -> Result<i32, String> {
    match r {
        Ok(code) => Ok(code),
        Err(e) if e.errnum == crate::message::errno::EHOSTUNREACH => {
            eprintln!("vigil: {}", lost_note(&e.errstr, id));
            Ok(EXIT_RANK0_LOST)
        }
        Err(e) => Err(e.errstr),
    }
}

/// The hint of a client that lost rank 0 while it followed job `id`.
fn lost_note(e: &str, id: JobId) -> String {
    format!(
        "{e} (rank 0 stopped or restarted): job {id} may still be running. If rank 0 keeps a state directory, once \
         it is back `vigil job attach {id}` shows the job's whole output and exits with its exit code (`vigil job \
         wait {id}`: the exit code alone); without one, the job ended with rank 0"
    )
}

async fn submit(c: &mut Client, spec: &Jobspec) -> Result<JobId, String> {
    submit_with(c, spec, false, None).await
}

/// Submit ([`submit_value`]: `c` is the new connection if rank 0 restarted meanwhile); with `stdin` the job's
/// tasks read what this process then sends as `job-exec.stdin`.
async fn submit_with(c: &mut Client, spec: &Jobspec, stdin: bool, urgency: Option<u32>) -> Result<JobId, String> {
    let v: Value = serde_json::from_str(&spec.to_json()).map_err(|e| e.to_string())?;
    submit_value(c, &v, stdin, urgency).await
}

pub(crate) use super::submit::submit_value;

/// Says on standard error that job `id` is pending, with the scheduler's reason, if it is (SCHED); nothing
/// otherwise, or if rank 0 does not answer. For `vigil run` and `vigil alloc` after [`PENDING_NOTE_AFTER`].
pub(crate) async fn say_if_pending(c: &Client, id: JobId) {
    if let Ok(info) = c.rpc("job-manager.info", 0, &json!({"id": id.0})).await {
        if info.pointer("/info/state").and_then(Value::as_str) == Some("SCHED") {
            let why = info.pointer("/info/reason_pending").and_then(Value::as_str).unwrap_or("resources");
            eprintln!("vigil: job {id}: pending ({why})");
        }
    }
}

/// How long `vigil run` (and `vigil alloc`) waits for a job's allocation before saying that it is pending and why.
pub(crate) const PENDING_NOTE_AFTER: std::time::Duration = std::time::Duration::from_secs(2);

/// Stream a job's output and exceptions until it is INACTIVE; return its exit code.
/// Ctrl-C or SIGTERM once cancels the job (and keeps waiting for it to end); Ctrl-C twice detaches. If our
/// stdout is closed (`vigil run ... | head`), the job is canceled too, as srun does. If rank 0 is lost meanwhile
/// and the instance keeps its jobs while it restarts (a state directory: [`await_rank0`]), this waits for it and
/// goes on where it was, printing nothing twice.
pub(crate) async fn attach(c: &Client, id: JobId, label: bool) -> Result<i32, crate::client::RpcError> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut c = c.clone();
    let mut s = c.rpc_stream("job-info.attach", 0, &json!({"id": id.0}))?;
    // Items taken so far, of each kind, and how many of each a new stream (after rank 0 came back) replays that
    // were taken already: a new attach starts from the job's first event and first output line again.
    let (mut events, mut lines) = (0usize, 0usize);
    let (mut skip_events, mut skip_lines) = (0usize, 0usize);
    let mut replayed: Option<Value> = None;
    // The finish status, and the type of the first fatal exception: the exit code (shellproto::job_exit_code).
    let mut status: Option<i32> = None;
    let mut fatal: Option<String> = None;
    let mut ctrlc = 0;
    let mut sigint = signal(SignalKind::interrupt()).ok();
    let mut sigterm = signal(SignalKind::terminate()).ok();
    let mut stdout = std::io::stdout();
    let mut stderr = std::io::stderr();
    let mut at_line_start: std::collections::HashMap<(u64, bool), bool> = std::collections::HashMap::new();
    let mut open_line: [Option<u32>; 2] = [None, None];
    let mut closed = false;
    // A job still pending after a moment is said to be so, with the scheduler's reason (as srun says "queued
    // and waiting for resources"), so that `vigil run` never waits in silence.
    let pending_note = tokio::time::sleep(PENDING_NOTE_AFTER);
    tokio::pin!(pending_note);
    let mut started = false;
    async fn recv(s: &mut Option<tokio::signal::unix::Signal>) {
        match s.as_mut() {
            Some(s) => {
                s.recv().await;
            }
            None => std::future::pending::<()>().await,
        }
    }
    loop {
        let next = tokio::select! {
            n = async { match replayed.take() { Some(v) => Some(Ok(v)), None => s.next().await } } => n,
            _ = &mut pending_note, if !started => {
                started = true; // said once
                say_if_pending(&c, id).await;
                continue;
            }
            _ = recv(&mut sigint) => {
                ctrlc += 1;
                if ctrlc == 1 {
                    eprintln!("vigil: canceling job {id} (Ctrl-C again to detach)");
                    let _ = c.rpc("job-manager.cancel", 0, &json!({"id": id.0, "note": "interrupted by user (Ctrl-C)"})).await;
                    continue;
                }
                eprintln!("vigil: detached from job {id}");
                return Ok(130);
            }
            _ = recv(&mut sigterm) => {
                let _ = c.rpc("job-manager.cancel", 0, &json!({"id": id.0, "note": "vigil run was terminated"})).await;
                continue;
            }
        };
        let Some(item) = next else { break };
        let v = match item {
            Ok(v) => v,
            Err(e) if e.errnum == crate::message::errno::EHOSTUNREACH => {
                match await_rank0(&c, id, "job-info.attach", &json!({"id": id.0}), &mut sigint).await {
                    Some((nc, ns, first)) => {
                        (c, s, replayed) = (nc, ns, Some(first));
                        (skip_events, skip_lines) = (events, lines);
                        continue;
                    }
                    None => return Err(e),
                }
            }
            Err(e) => return Err(e),
        };
        if v.get("output").is_some() {
            if skip_lines > 0 {
                skip_lines -= 1;
                continue;
            }
            lines += 1;
        } else if v.get("event").is_some() {
            if skip_events > 0 {
                skip_events -= 1;
                continue;
            }
            events += 1;
        }
        if v.get("output").is_some() || v.pointer("/event/name").and_then(Value::as_str) == Some("alloc") {
            started = true;
        }
        if let Some(o) = v.get("output") {
            if closed {
                continue;
            }
            let Ok(line) = serde_json::from_value::<crate::shellproto::OutputLine>(o.clone()) else { continue };
            let is_err = line.stream == "stderr";
            let bytes = line.bytes();
            let mut buf = Vec::with_capacity(bytes.len() + 8);
            if label {
                // Labels only at line starts: another task's unfinished line is ended first.
                let open = &mut open_line[usize::from(is_err)];
                if let Some(o) = *open {
                    if o != line.rank {
                        buf.push(b'\n');
                        at_line_start.insert((o as u64, is_err), true);
                    }
                }
                let start = at_line_start.entry((line.rank as u64, is_err)).or_insert(true);
                if *start {
                    buf.extend_from_slice(format!("{}: ", line.rank).as_bytes());
                }
                *start = line.eol;
                *open = if line.eol { None } else { Some(line.rank) };
            }
            buf.extend_from_slice(&bytes);
            let r = if is_err { stderr.write_all(&buf) } else { stdout.write_all(&buf).and_then(|_| stdout.flush()) };
            if r.is_err() && !is_err {
                closed = true;
                let _ = c
                    .rpc("job-manager.cancel", 0, &json!({"id": id.0, "note": "output of vigil run was closed"}))
                    .await;
            }
        } else if let Some(e) = v.get("event") {
            let name = e.get("name").and_then(Value::as_str).unwrap_or("");
            let ctx = e.get("context").cloned().unwrap_or(Value::Null);
            match name {
                "exception" => {
                    let sev = ctx.get("severity").and_then(Value::as_u64).unwrap_or(0);
                    if sev == 0 && fatal.is_none() {
                        fatal = Some(ctx.get("type").and_then(Value::as_str).unwrap_or("").to_string());
                    }
                    if !closed {
                        eprintln!(
                            "vigil: job {id}: exception type={} severity={sev}: {}",
                            ctx.get("type").and_then(Value::as_str).unwrap_or("?"),
                            ctx.get("note").and_then(Value::as_str).unwrap_or("")
                        );
                    }
                }
                "finish" => {
                    status = Some(ctx.get("status").and_then(Value::as_i64).unwrap_or(0) as i32);
                }
                "requeue" => {
                    // The lost run does not count: the job runs again (jobs/requeue.rs).
                    (status, fatal) = (None, None);
                    if !closed {
                        eprintln!("vigil: job {id}: {}", requeue_note(&ctx));
                    }
                }
                _ => {}
            }
        }
    }
    if label {
        if open_line[0].is_some() {
            let _ = stdout.write_all(b"\n");
        }
        if open_line[1].is_some() {
            let _ = stderr.write_all(b"\n");
        }
    }
    let _ = stdout.flush();
    if closed {
        return Ok(128 + libc::SIGPIPE);
    }
    Ok(crate::shellproto::job_exit_code(status, fatal.as_deref()))
}

/// How long past the instance's grace for rank 0 ([`crate::client::Welcome::rank0_grace`]) a client that lost it
/// keeps trying: the other brokers retry rank 0 every second, and a restarted rank 0 first reads its store.
pub(crate) const RANK0_WAIT_MARGIN: f64 = 5.0;

/// After the stream of `topic` (`job-info.attach`, `job-manager.eventlog`) for job `id` ended with "rank 0 lost"
/// (the connection to rank 0 closed, or our broker answered EHOSTUNREACH): wait for rank 0 to come back and ask
/// again (`payload`). Connected to rank 0, a client
/// waits only if the instance keeps its jobs while rank 0 restarts (`rank0_grace` > 0 in rank 0's welcome: a
/// state directory), and at most that long plus [`RANK0_WAIT_MARGIN`], reconnecting every half second to
/// `$VIGIL_URI`; connected to another broker, as long as that broker stays up (it stops past its grace). Says
/// once that it waits, and when rank 0 is back. Returns the new client, its stream and the stream's first item;
/// `None` to give up: no grace, the time is up, our broker is gone, a restarted rank 0 that does not know the
/// job (no state directory), or Ctrl-C.
async fn await_rank0(
    c: &Client,
    id: JobId,
    topic: &str,
    payload: &Value,
    sigint: &mut Option<tokio::signal::unix::Signal>,
) -> Option<(Client, crate::client::RpcStream, Value)> {
    use crate::client::RpcError;
    let on_rank0 = c.welcome.rank == 0;
    let grace = c.welcome.rank0_grace;
    if on_rank0 && !(grace > 0.0 && grace.is_finite()) {
        return None;
    }
    let uri = std::env::var(crate::client::URI_ENV).ok()?;
    let limit = if on_rank0 { grace + RANK0_WAIT_MARGIN } else { f64::from(u32::MAX) };
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs_f64(limit);
    eprintln!(
        "vigil: lost rank 0; job {id} is kept while it restarts: waiting for it{} (Ctrl-C to stop waiting)",
        if on_rank0 { format!(" up to {limit:.0} s") } else { String::new() }
    );
    let mut client = c.clone();
    let attempt = async {
        loop {
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            let s = match client.rpc_stream(topic, 0, payload) {
                Ok(s) => Some(s),
                Err(e) if e.errstr == RpcError::disconnected_text() => None,
                Err(_) => return None,
            };
            let mut s = match s {
                Some(s) => s,
                None => match Client::connect(&uri).await {
                    // Rank 0 (or our broker) listens again: attach there next turn.
                    Ok(nc) => {
                        client = nc;
                        continue;
                    }
                    Err(_) if on_rank0 => continue,
                    // Our own broker is gone: it stopped past its grace.
                    Err(_) => return None,
                },
            };
            match s.next().await {
                Some(Ok(v)) => return Some((client.clone(), s, v)),
                Some(Err(e)) if e.errnum == crate::message::errno::EHOSTUNREACH => {
                    if e.errstr == RpcError::disconnected_text() && !on_rank0 {
                        if let Ok(nc) = Client::connect(&uri).await {
                            client = nc;
                        } else {
                            return None;
                        }
                    }
                }
                // Rank 0 is back but does not know the job (it kept no state directory), or refuses.
                _ => return None,
            }
        }
    };
    let back = tokio::select! {
        r = attempt => r,
        _ = tokio::time::sleep_until(deadline) => None,
        _ = async { match sigint.as_mut() { Some(s) => { s.recv().await; } None => std::future::pending::<()>().await } } => None,
    };
    if back.is_some() {
        eprintln!("vigil: rank 0 is back; following job {id} again");
    }
    back
}

/// `requeued (1 of at most 3): lost node2 (rank 2)`, from a `requeue` event's context.
fn requeue_note(ctx: &Value) -> String {
    format!(
        "requeued ({} of at most {}): {}",
        ctx["count"].as_u64().unwrap_or(0),
        ctx["max"].as_u64().unwrap_or(0),
        ctx["note"].as_str().unwrap_or("")
    )
}

/// Options of `vigil jobs`.
#[derive(Args, Debug)]
pub struct JobsArgs {
    /// Include inactive jobs.
    #[arg(short = 'a', long)]
    pub all: bool,
    /// Every user's jobs, not only yours (as `flux jobs -A`, `--user=all`). Each shows its user; the command and
    /// environment of a job are only for its owner and the instance owner (`vigil job info`).
    #[arg(short = 'A', long = "all-users", conflicts_with = "user")]
    pub all_users: bool,
    /// Only the jobs of USER, a login name or uid, or `all` (as `-A`); yours by default.
    #[arg(short = 'u', long, value_name = "USER")]
    pub user: Option<String>,
    /// Print JSON (one object with a "jobs" array), after the filters.
    #[arg(long, conflicts_with = "format")]
    pub json: bool,
    /// Only jobs of this name (`--job-name`, or the command's basename when none was given), as `flux jobs
    /// --name` and `squeue --name`; with `-a`, inactive ones too.
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// Only jobs in these states, a comma-separated LIST of RFC 21 states (new, depend, priority, sched, run,
    /// cleanup, inactive), Flux's groups (pending, running, active) or results of inactive jobs (completed,
    /// failed, canceled, timeout), as `flux jobs --filter`. Inactive states imply `-a`.
    #[arg(long, value_name = "LIST", visible_alias = "filter")]
    pub states: Option<String>,
    /// Inactive jobs only if they ended after TIME: -DURATION ago (-1h, -30m), @EPOCH, or a UTC time
    /// (2026-12-07T05:00:00Z, "2026-12-07 05:00"), as `flux jobs --since`. Implies `-a`.
    #[arg(long, value_name = "TIME")]
    pub since: Option<String>,
    /// At most COUNT jobs (the newest first), after the other filters.
    #[arg(short = 'c', long, value_name = "COUNT")]
    pub count: Option<usize>,
    /// Lines in Flux's style: named fields in braces, each with an optional [<|>|^][WIDTH][.MAX] spec, e.g.
    /// `{id.f58:>12} {name:<16.16} {state} {runtime}`. Fields: id, id.f58, id.dec, id.hex, name, user, userid,
    /// state, state_single, result, status, urgency, nnodes, ntasks, nodelist, ranks, runtime, duration,
    /// t_submit, t_run, t_inactive, returncode, exception.type, exception.note, reason, requeues, info (see
    /// docs/queue.md).
    #[arg(long, value_name = "FORMAT")]
    pub format: Option<String>,
    /// No header line.
    #[arg(short = 'n', long)]
    pub no_header: bool,
}

/// The login name of user id `uid`, or its number if it has none.
pub(crate) fn user_name(uid: u32) -> String {
    nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
        .ok()
        .flatten()
        .map(|u| u.name)
        .unwrap_or_else(|| uid.to_string())
}

/// `--user`: a uid, a login name, or `all` (`None`: every user's).
fn user_id(u: &str) -> Result<Option<u32>, String> {
    if u == "all" {
        return Ok(None);
    }
    if let Ok(n) = u.parse::<u32>() {
        return Ok(Some(n));
    }
    match nix::unistd::User::from_name(u) {
        Ok(Some(user)) => Ok(Some(user.uid.as_raw())),
        _ => Err(format!("--user={u}: no such user (a login name, a uid, or all)")),
    }
}

/// `vigil jobs`.
pub(crate) async fn jobs(a: JobsArgs) -> Result<i32, String> {
    use super::jobsfmt::{Ctx, Format, States, DEFAULT_FORMAT};
    let now = crate::broker_now();
    // Every option is checked before the instance is asked anything.
    let format = Format::parse(a.format.as_deref().unwrap_or(DEFAULT_FORMAT)).map_err(|e| format!("--format: {e}"))?;
    let states = a
        .states
        .as_deref()
        .map(States::parse)
        .transpose()
        .map_err(|e| format!("--states={}: {e}", a.states.as_deref().unwrap_or("")))?;
    let since = a.since.as_deref().map(|s| super::jobsfmt::parse_since(s, now)).transpose()?;
    let user = match (&a.user, a.all_users) {
        (Some(u), _) => user_id(u)?,
        (None, true) => None,
        (None, false) => Some(nix::unistd::getuid().as_raw()),
    };
    let all = a.all || since.is_some() || states.as_ref().is_some_and(States::wants_inactive);
    let c = connect().await?;
    let mut req = json!({"all": all});
    if let Some(u) = user {
        req["userid"] = u.into();
    }
    let mut r = super::rpc_to_rank0(&c, "job-manager.list", &req).await?;
    if let Some(list) = r.get_mut("jobs").and_then(Value::as_array_mut) {
        list.retain(|j| {
            a.name.as_deref().is_none_or(|n| j["name"].as_str() == Some(n))
                && states.as_ref().is_none_or(|s| s.matches(j))
                && since.is_none_or(|t| j["state"] != "INACTIVE" || j["t_inactive"].as_f64().is_some_and(|e| e > t))
        });
        if let Some(n) = a.count {
            list.truncate(n);
        }
    }
    if a.json {
        println!("{r}");
        return Ok(0);
    }
    if !a.no_header {
        println!("{}", format.header());
    }
    let names = std::cell::RefCell::new(std::collections::HashMap::new());
    let user = |uid: u32| names.borrow_mut().entry(uid).or_insert_with(|| user_name(uid)).clone();
    let ctx = Ctx { now, user: &user };
    for j in r["jobs"].as_array().cloned().unwrap_or_default() {
        println!("{}", format.line(&j, &ctx));
    }
    Ok(0)
}

/// Options of `vigil update`.
#[derive(Args, Debug)]
pub struct UpdateArgs {
    /// Job id (f58 or decimal).
    pub id: String,
    /// What to change, KEY=VALUE: `duration` (an RFC 23 duration such as 30m, or seconds; `+10m` and `-10m` change
    /// the current limit; 0 or inf for none), `name`, `urgency` (0 to 31, hold, default, expedite).
    #[arg(required = true, value_name = "KEY=VALUE")]
    pub updates: Vec<String>,
}

/// `vigil update`: every change checked by the job manager at once (all or nothing); silent when it is done.
pub(crate) async fn update(a: UpdateArgs) -> Result<i32, String> {
    let id = JobId::parse(&a.id).map_err(|e| e.to_string())?;
    let mut updates = serde_json::Map::new();
    for kv in &a.updates {
        let (k, v) = kv.split_once('=').ok_or_else(|| format!("{kv}: expected KEY=VALUE (e.g. duration=30m)"))?;
        if updates.insert(k.to_string(), Value::String(v.to_string())).is_some() {
            return Err(format!("{kv}: {k} is given twice"));
        }
    }
    let c = connect().await?;
    c.rpc("job-manager.update", 0, &json!({"id": id.0, "updates": updates}))
        .await
        .map_err(|e| format!("update {}: {}", a.id, e.errstr))?;
    Ok(0)
}

/// Options of `vigil cancel`.
#[derive(Args, Debug)]
pub struct CancelArgs {
    /// Reason recorded in the cancel exception.
    #[arg(short = 'm', long = "message")]
    pub message: Option<String>,
    /// Cancel all your active jobs (pending and running; see --states) instead of the ids given (as `flux
    /// cancel --all`, `scancel -u $USER`).
    #[arg(long, conflicts_with = "ids")]
    pub all: bool,
    /// With --all: only jobs in these states, a comma-separated list of `pending` (not yet running) and
    /// `running` (running or cleaning up).
    #[arg(long, value_delimiter = ',', value_parser = ["pending", "running"])]
    pub states: Vec<String>,
    /// Job ids.
    #[arg(required_unless_present_any = ["all", "states"])]
    pub ids: Vec<String>,
}

/// Whether `--all --states S` takes a job in state `state` (an RFC 21 state name): all active jobs when `states`
/// is empty.
fn cancel_takes(states: &[String], state: &str) -> bool {
    let running = matches!(state, "RUN" | "CLEANUP");
    let pending = matches!(state, "NEW" | "DEPEND" | "PRIORITY" | "SCHED");
    (running || pending)
        && (states.is_empty()
            || (running && states.iter().any(|s| s == "running"))
            || (pending && states.iter().any(|s| s == "pending")))
}

/// `vigil cancel`: the ids given, or with `--all` every active job of the caller's (filtered by `--states`),
/// then a count ("canceled 3 jobs"). Exit code 1 if any cancel was refused (each said on standard error).
pub(crate) async fn cancel(a: CancelArgs) -> Result<i32, String> {
    if !a.states.is_empty() && !a.all {
        return Err(
            "--states picks among your active jobs: use it with --all (vigil cancel --all --states pending)".into()
        );
    }
    let mut ids = a.ids.iter().map(|s| JobId::parse(s).map_err(|e| e.to_string())).collect::<Result<Vec<_>, _>>()?;
    let c = connect().await?;
    if a.all {
        let me = u64::from(nix::unistd::getuid().as_raw());
        let r = c.rpc("job-manager.list", 0, &json!({"all": false, "userid": me})).await.map_err(|e| e.errstr)?;
        ids = r["jobs"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|j| j["userid"].as_u64() == Some(me))
            .filter(|j| cancel_takes(&a.states, j["state"].as_str().unwrap_or("")))
            .filter_map(|j| j["id"].as_u64().map(JobId))
            .collect();
    }
    let mut rc = 0;
    let mut done = 0usize;
    for id in &ids {
        let note = a.message.clone().unwrap_or_else(|| "canceled by user".into());
        match c.rpc("job-manager.cancel", 0, &json!({"id": id.0, "note": note})).await {
            Ok(_) => done += 1,
            Err(e) => {
                eprintln!("vigil: cancel {id}: {}", e.errstr);
                rc = 1;
            }
        }
    }
    if a.all {
        eprintln!("vigil: canceled {done} job{}", if done == 1 { "" } else { "s" });
    }
    Ok(rc)
}

/// `vigil job` subcommands.
#[derive(Subcommand, Debug)]
pub enum JobCmd {
    /// Submit a jobspec file (YAML or JSON; `-` for stdin) and print the job id.
    Submit {
        /// Jobspec file.
        file: String,
    },
    /// Print a job's eventlog (RFC 18).
    Eventlog {
        /// Job id.
        id: String,
        /// Print raw JSON lines.
        #[arg(long)]
        json: bool,
        /// Keep printing new events until the job is inactive.
        #[arg(short = 'f', long)]
        follow: bool,
    },
    /// Attach to a job: stream its output, exit with its exit code.
    Attach {
        /// Job id.
        id: String,
        /// Prefix output lines with the task rank.
        #[arg(short = 'l', long = "label-io")]
        label_io: bool,
    },
    /// Wait for a job to finish and exit with its exit code; the exception that ended it, if one did, is printed on
    /// stderr as `vigil run` prints it (Flux's `flux job wait` says why a job failed too).
    Wait {
        /// Job id.
        id: String,
    },
    /// Cancel a job.
    Cancel(CancelArgs),
    /// Set a pending job's urgency (RFC 21, Flux's `flux job urgency`): 0 to 31, or `hold` (0), `default` (16),
    /// `expedite` (31). Pending jobs start in order of urgency, then of submission. Prints the urgency it had.
    Urgency {
        /// Job id.
        id: String,
        /// The new urgency.
        urgency: String,
    },
    /// Hold pending jobs (urgency 0), as Slurm's `scontrol hold`: they stay pending until released.
    Hold {
        /// Job ids.
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Release held jobs (back to urgency 16), as Slurm's `scontrol release`; a job not held is refused.
    Release {
        /// Job ids.
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Print a job's summary, jobspec and R as JSON (as `flux job info`). The summary's `lost_nodelist` and
    /// `lost_ranks` are the nodes its run lost (a batch or alloc job goes on without them), `nnodes_current` how
    /// many it holds now (`nnodes`: how many it started with).
    Info {
        /// Job id.
        id: String,
        /// Print the reply as JSON (the job's record under "info", its "jobspec" and "R"), for scripts; without
        /// it, the record as aligned `key: value` lines for people.
        #[arg(long)]
        json: bool,
    },
    /// Purge INACTIVE jobs (their records and eventlogs, from the state directory too), as `flux job purge`:
    /// those older than --age-limit, the oldest beyond --num-limit, or the given ids. Without --force, only
    /// says how many would go. A user names its own jobs by id; --age-limit and --num-limit are the instance owner's.
    Purge(PurgeArgs),
}

/// Options of `vigil job purge`.
#[derive(Args, Debug)]
pub struct PurgeArgs {
    /// Purge jobs inactive for longer than this (RFC 23 duration: 30s, 2h, 7d).
    #[arg(long, value_name = "FSD")]
    pub age_limit: Option<String>,
    /// Keep at most this many inactive jobs, purging the oldest.
    #[arg(long, value_name = "N")]
    pub num_limit: Option<u64>,
    /// Purge them (else only count them).
    #[arg(short = 'f', long)]
    pub force: bool,
    /// Job ids to purge (each must be inactive).
    pub ids: Vec<String>,
}

/// `vigil job purge`.
async fn purge(a: PurgeArgs) -> Result<i32, String> {
    let mut body = json!({"force": a.force});
    if let Some(s) = &a.age_limit {
        let v = crate::duration::parse_duration_secs(s)
            .ok()
            .filter(|v| v.is_finite() && *v >= 0.0)
            .ok_or_else(|| format!("--age-limit {s}: expected a finite duration such as 30s, 2h or 7d"))?;
        body["age_limit"] = json!(v);
    }
    if let Some(n) = a.num_limit {
        body["num_limit"] = json!(n);
    }
    if !a.ids.is_empty() {
        let ids = a.ids.iter().map(|s| parse_id(s).map(|id| id.0)).collect::<Result<Vec<_>, _>>()?;
        body["ids"] = json!(ids);
    }
    if a.age_limit.is_none() && a.num_limit.is_none() && a.ids.is_empty() {
        return Err("give --age-limit, --num-limit or job ids".into());
    }
    let c = connect().await?;
    let r = c.rpc("job-manager.purge", 0, &body).await.map_err(|e| e.errstr)?;
    let count = r["count"].as_u64().unwrap_or(0);
    let left = r["inactive"].as_u64().unwrap_or(0);
    if a.force {
        println!("purged {count} inactive job(s); {left} kept");
    } else {
        println!("{count} inactive job(s) would be purged (of {left}); use --force to purge them");
    }
    Ok(0)
}

/// `vigil job hold` and `vigil job release`: each job's urgency set (with `release`, only if it is held); a
/// refusal is said on standard error and the others go on (exit code 1 if any was refused).
async fn urgency_all(ids: &[String], urgency: u32, release: bool) -> Result<i32, String> {
    let ids = ids.iter().map(|s| parse_id(s)).collect::<Result<Vec<_>, _>>()?;
    let c = connect().await?;
    let mut rc = 0;
    for id in ids {
        let body = json!({"id": id.0, "urgency": urgency, "release": release});
        if let Err(e) = c.rpc("job-manager.urgency", 0, &body).await {
            eprintln!("vigil: {} {id}: {}", if release { "release" } else { "hold" }, e.errstr);
            rc = 1;
        }
    }
    Ok(rc)
}

fn parse_id(s: &str) -> Result<JobId, String> {
    JobId::parse(s).map_err(|e| e.to_string())
}

/// `vigil job ...`.
pub(crate) async fn job(cmd: JobCmd) -> Result<i32, String> {
    match cmd {
        JobCmd::Submit { file } => {
            let text = if file == "-" {
                let mut s = String::new();
                std::io::Read::read_to_string(&mut std::io::stdin(), &mut s).map_err(|e| format!("stdin: {e}"))?;
                s
            } else {
                std::fs::read_to_string(&file).map_err(|e| format!("{file}: {e}"))?
            };
            let spec = Jobspec::parse(&text).map_err(|e| format!("{file}: {e}"))?;
            // The checks the instance makes at submission, here too, so that every error names the file.
            spec.validate().map_err(|e| format!("{file}: {e}"))?;
            let mut c = connect().await?;
            let id = submit(&mut c, &spec).await?;
            println!("{id}");
            Ok(0)
        }
        JobCmd::Eventlog { id, json, follow } => {
            let id = parse_id(&id)?;
            let c = connect().await?;
            let mut s = if follow {
                c.rpc_stream("job-manager.eventlog", 0, &json!({"id": id.0, "follow": true}))
            } else {
                c.rpc_stream("job-manager.eventlog", 0, &json!({"id": id.0, "follow": false}))
            }
            .map_err(|e| e.errstr)?;
            while let Some(item) = s.next().await {
                let v = item.map_err(|e| e.errstr)?;
                let Some(e) = v.get("event") else { continue };
                if json {
                    println!("{e}");
                } else {
                    println!("{}", human_event(e));
                }
            }
            Ok(0)
        }
        JobCmd::Attach { id, label_io } => {
            let id = parse_id(&id)?;
            let c = connect().await?;
            followed(attach(&c, id, label_io).await, id)
        }
        JobCmd::Wait { id } => {
            let id = parse_id(&id)?;
            let c = connect().await?;
            let payload = json!({"id": id.0, "follow": true});
            let mut s = c.rpc_stream("job-manager.eventlog", 0, &payload).map_err(|e| e.errstr)?;
            let (mut status, mut fatal): (Option<i32>, Option<String>) = (None, None);
            let mut replayed = None;
            // The fatal exceptions already printed: an eventlog replayed after a restart of rank 0 repeats them.
            let mut told = std::collections::BTreeSet::new();
            loop {
                let item = match replayed.take() {
                    Some(v) => Ok(v),
                    None => match s.next().await {
                        Some(item) => item,
                        None => break,
                    },
                };
                let v = match item {
                    Ok(v) => v,
                    // Rank 0 lost: wait for it if the instance keeps its jobs; the eventlog then comes again
                    // from its start, and the verdict is made again from it.
                    Err(e) if e.errnum == crate::message::errno::EHOSTUNREACH => {
                        match await_rank0(&c, id, "job-manager.eventlog", &payload, &mut None).await {
                            Some((_, ns, first)) => {
                                (s, replayed, status, fatal) = (ns, Some(first), None, None);
                                continue;
                            }
                            None => return followed(Err(e), id),
                        }
                    }
                    Err(e) => return followed(Err(e), id),
                };
                let e = &v["event"];
                match e["name"].as_str() {
                    Some("finish") => status = Some(e["context"]["status"].as_i64().unwrap_or(0) as i32),
                    Some("exception") if e["context"]["severity"].as_u64() == Some(0) && fatal.is_none() => {
                        let kind = e["context"]["type"].as_str().unwrap_or("").to_string();
                        if told.insert(e["timestamp"].to_string()) {
                            eprintln!(
                                "vigil: job {id}: exception type={kind} severity=0: {}",
                                e["context"]["note"].as_str().unwrap_or("")
                            );
                        }
                        fatal = Some(kind);
                    }
                    Some("requeue") => (status, fatal) = (None, None),
                    _ => {}
                }
            }
            Ok(crate::shellproto::job_exit_code(status, fatal.as_deref()))
        }
        JobCmd::Cancel(a) => cancel(a).await,
        JobCmd::Urgency { id, urgency } => {
            let id = parse_id(&id)?;
            let u = match urgency.as_str() {
                "hold" => 0,
                "default" => crate::jobs::DEFAULT_URGENCY,
                "expedite" => crate::jobs::MAX_URGENCY,
                s => s
                    .parse::<u32>()
                    .ok()
                    .filter(|u| *u <= crate::jobs::MAX_URGENCY)
                    .ok_or_else(|| format!("urgency {s}: expected 0 to 31, hold, default or expedite"))?,
            };
            let c = connect().await?;
            let r = c.rpc("job-manager.urgency", 0, &json!({"id": id.0, "urgency": u})).await.map_err(|e| e.errstr)?;
            println!("{}", r["old"]);
            Ok(0)
        }
        JobCmd::Hold { ids } => urgency_all(&ids, 0, false).await,
        JobCmd::Release { ids } => urgency_all(&ids, crate::jobs::DEFAULT_URGENCY, true).await,
        JobCmd::Purge(a) => purge(a).await,
        JobCmd::Info { id, json } => {
            let id = parse_id(&id)?;
            let c = connect().await?;
            let r = c.rpc("job-manager.info", 0, &json!({"id": id.0})).await.map_err(|e| e.errstr)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&r).unwrap_or_default());
            } else {
                print!("{}", super::jobinfo::human(&r["info"], crate::broker_now(), user_name));
            }
            Ok(0)
        }
    }
}

/// One eventlog entry (RFC 18: `timestamp`, `name`, optional `context` object) as a line for people:
/// `TIMESTAMP NAME key=value ...`, the timestamp in seconds with 6 decimals, string values unquoted.
pub(crate) fn human_event(e: &Value) -> String {
    let ctx = e.get("context").and_then(Value::as_object).map(|m| {
        m.iter()
            .map(|(k, v)| format!("{k}={}", v.as_str().map(str::to_string).unwrap_or_else(|| v.to_string())))
            .collect::<Vec<_>>()
            .join(" ")
    });
    format!(
        "{:.6} {} {}",
        e["timestamp"].as_f64().unwrap_or(0.0),
        e["name"].as_str().unwrap_or(""),
        ctx.unwrap_or_default()
    )
    .trim_end()
    .to_string()
}

#[cfg(test)]
mod tests {
    /// Found by a fresh-user trial: a connection lost in a `--cc 1-300` flood printed a line per copy.
    #[test]
    fn copies_refused_alike_in_a_row_are_said_once() {
        let mut r = super::Refusals::default();
        let lost = || "lost connection to broker".to_string();
        assert_eq!(r.push(3, "bad".into()), None);
        assert_eq!(r.push(4, lost()).as_deref(), Some("vigil: copy 3: bad"));
        for i in 5..=300 {
            assert_eq!(r.push(i, lost()), None);
        }
        assert_eq!(r.line().as_deref(), Some("vigil: copies 4-300 (297 of them): lost connection to broker"));
        assert_eq!(r.line(), None);
        // Not consecutive: said apart.
        assert_eq!(r.push(1, lost()), None);
        assert_eq!(r.push(3, lost()).as_deref(), Some("vigil: copy 1: lost connection to broker"));
    }

    #[test]
    fn cancel_all_takes_active_jobs_by_state() {
        let st = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        for s in ["SCHED", "PRIORITY", "RUN", "CLEANUP"] {
            assert!(super::cancel_takes(&[], s), "{s}");
        }
        assert!(!super::cancel_takes(&[], "INACTIVE"));
        assert!(super::cancel_takes(&st(&["pending"]), "SCHED"));
        assert!(!super::cancel_takes(&st(&["pending"]), "RUN"));
        assert!(super::cancel_takes(&st(&["running"]), "CLEANUP"));
        assert!(!super::cancel_takes(&st(&["running"]), "SCHED"));
        assert!(super::cancel_takes(&st(&["pending", "running"]), "RUN"));
    }

    use super::{check_output_template, parse_time_limit};

    #[test]
    fn output_templates_other_than_id_are_refused() {
        assert!(check_output_template("--output", "/tmp/o-{{id}}.txt").is_ok());
        assert!(check_output_template("--output", "plain.txt").is_ok());
        let e = check_output_template("--output", "/tmp/o-{{id}}-{{bogus}}.txt").unwrap_err();
        assert!(e.contains("unknown template {{bogus}}"), "{e}");
    }

    #[test]
    fn time_limits_in_minutes_or_fsd_and_bad_ones_say_why() {
        assert_eq!(parse_time_limit("2"), Ok(120.0));
        assert_eq!(parse_time_limit("90s"), Ok(90.0));
        assert_eq!(parse_time_limit("inf"), Ok(0.0));
        for bad in ["1e400", "nan", "-inf"] {
            let e = parse_time_limit(bad).unwrap_err();
            assert!(e.contains("must be a finite number of minutes"), "{bad}: {e}");
        }
        assert!(parse_time_limit("-1").unwrap_err().contains("must be >= 0"));
    }
}
