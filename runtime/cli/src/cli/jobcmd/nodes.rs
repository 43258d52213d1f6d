//! Checks of a job's node options against the nodes of the instance, before it is submitted: the hosts of a
//! `hostfile:` task map ([`Hostfile`]) and the nodes `-x/--exclude` names ([`check_exclude`]).

use super::args::{NodeCount, NodeSelection, SubmitArgs};
use crate::client::Client;
use serde_json::{json, Value};

/// A `hostfile:FILE` task map as the command line gave it: the option's text (`--taskmap=hostfile:FILE` or
/// `-o taskmap=hostfile:FILE`) and the file's hosts with their lines, so that errors name the option and the line.
pub(super) struct Hostfile {
    option: String,
    entries: Vec<(usize, String)>,
}

impl Hostfile {
    /// The hostfile of `a`'s `--taskmap` or `-o taskmap=`, if it names one (read now).
    pub(super) fn of(a: &SubmitArgs) -> Result<Option<Hostfile>, String> {
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
    pub(super) fn hosts(&self) -> Vec<(usize, usize, &str)> {
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
    pub(super) fn check(&self, nodes: Option<NodeCount>, ntasks: Option<u32>) -> Result<u32, String> {
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
    pub(super) async fn check_nodes(&self, c: &Client, select: &NodeSelection) -> Result<(), String> {
        let Some(st) = crate::cli::rpc_to_rank0(c, "resource.status", &json!({})).await.ok() else { return Ok(()) };
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
    let st = crate::cli::rpc_to_rank0(c, "resource.status", &json!({})).await.ok()?;
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
                .map_err(|e| format!("-x/--exclude {x}: {e}{}", EXCLUSIVE_HINT))?
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
    Err(format!("-x/--exclude {x}: not a node of this instance: {} ({theirs}){EXCLUSIVE_HINT}", unknown.join(", ")))
}

/// Said with a refused `-x`: Flux's `-x` is `--exclusive`, Vigil's (as Slurm's) `--exclude`.
const EXCLUSIVE_HINT: &str = "; -x is --exclude, as in Slurm (whole nodes, Flux's -x: --exclusive)";
