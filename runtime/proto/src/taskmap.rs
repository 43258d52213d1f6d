//! Task maps (Flux RFC 34) and the task mapping schemes of `flux run --taskmap` (block, `cyclic[:N]`,
//! `manual:TASKMAP`, `hostfile:FILE`).
//!
//! A task map says which node of a job (its index among the job's nodes, in R's order: shell rank) runs which
//! global task rank. Its RFC 34 form is a list of blocks `[nodeid, nnodes, ppn, repeat]`: tasks are numbered in
//! block order; a block gives `ppn` consecutive tasks to each of the `nnodes` nodes from `nodeid` on, and is
//! repeated `repeat` times. `{"version": 1, "map": [[0, 4, 2, 1]]}` is 8 tasks over 4 nodes, 2 each, node 0 running
//! 0-1 (block); `[[0, 2, 1, 2]]` is 4 tasks over 2 nodes, node 0 running 0 and 2 (cyclic). The same blocks, each
//! repeated `repeat` times, make `PMI_process_mapping` (`(vector,(0,2,1),(0,2,1))`).
//!
//! How a [`Scheme`] lays tasks out ([`Scheme::layout`]) follows flux-core's job shell exactly:
//! - `block` (the default): the scheduler's per-node counts, consecutive ranks on each node;
//! - `cyclic[:N]`: the same per-node counts, dealt N at a time round-robin over the nodes;
//! - `manual:TASKMAP`: the given map, which must cover exactly the job's nodes and tasks;
//! - `hostfile:FILE`: task i runs on the host named on line i of FILE (a line may be an RFC 29 host list; the
//!   lines are reused from the top when there are fewer than tasks; blank lines and `#` comments are skipped). Unlike Flux, which reads FILE in the job
//!   shell, Vigil reads it at submit (`hosts`), so that the nodes need not share a file system and a bad file is
//!   refused before the job waits in the queue; the job is then placed on exactly those hosts.
//!
//! Encoding merges blocks as flux-core's `taskmap_append` does, so the maps Vigil writes are those Flux writes.

use crate::hostlist::Hostlist;
use serde_json::{json, Value};

/// A task map error: what is wrong, in words that name the offending part (e.g. `entry 2: ppn must be >= 1`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TaskmapError(pub String);

fn err<T>(msg: impl Into<String>) -> Result<T, TaskmapError> {
    Err(TaskmapError(msg.into()))
}

/// One RFC 34 block: `ppn` tasks on each of `nnodes` nodes from `nodeid`, the whole repeated `repeat` times.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    /// First node (index among the job's nodes).
    pub nodeid: u32,
    /// Number of consecutive nodes.
    pub nnodes: u32,
    /// Tasks per node.
    pub ppn: u32,
    /// How many times the block repeats.
    pub repeat: u32,
}

/// An RFC 34 task map.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Taskmap {
    blocks: Vec<Block>,
}

impl Taskmap {
    /// The empty map (RFC 34: the mapping is unknown).
    pub fn new() -> Taskmap {
        Taskmap::default()
    }

    /// The blocks, in task order.
    pub fn blocks(&self) -> &[Block] {
        &self.blocks
    }

    /// The block map of per-node task counts: node i runs the next `counts[i]` ranks. Nodes with no task are
    /// left out.
    pub fn block(counts: &[u32]) -> Taskmap {
        let mut m = Taskmap::new();
        for (i, &c) in counts.iter().enumerate() {
            m.append(i as u32, 1, c);
        }
        m
    }

    /// Give the next `ppn` tasks to each of `nnodes` nodes from `nodeid` (flux-core's `taskmap_append`: extends
    /// the last block, or repeats it, where the result is the same map). A zero count appends nothing.
    pub fn append(&mut self, nodeid: u32, nnodes: u32, ppn: u32) {
        if nnodes == 0 || ppn == 0 {
            return;
        }
        if let Some(last) = self.blocks.last_mut() {
            let end = u64::from(last.nodeid) + u64::from(last.nnodes);
            if u64::from(nodeid) == end && ppn == last.ppn && last.repeat == 1 {
                last.nnodes += nnodes;
                self.find_repeats();
                return;
            }
            if last.nodeid == nodeid && last.nnodes == 1 && nnodes == 1 {
                last.ppn += ppn;
                self.find_repeats();
                return;
            }
            if last.nodeid == nodeid && last.nnodes == nnodes && last.ppn == ppn {
                last.repeat += 1;
                return;
            }
        }
        self.blocks.push(Block { nodeid, nnodes, ppn, repeat: 1 });
    }

    /// Merge consecutive blocks that differ only in `repeat`.
    fn find_repeats(&mut self) {
        let mut out: Vec<Block> = Vec::with_capacity(self.blocks.len());
        for b in self.blocks.drain(..) {
            match out.last_mut() {
                Some(p) if p.nodeid == b.nodeid && p.nnodes == b.nnodes && p.ppn == b.ppn => p.repeat += b.repeat,
                _ => out.push(b),
            }
        }
        self.blocks = out;
    }

    /// Decode the RFC 34 JSON form: `{"version": 1, "map": [...]}` or the bare list of blocks.
    ///
    /// # Errors
    /// A value of another shape, a version other than 1, an entry that is not four integers, a count of 0
    /// (`nnodes`, `ppn`, `repeat`), or more than 2^32 - 1 tasks or nodes in all.
    pub fn decode(v: &Value) -> Result<Taskmap, TaskmapError> {
        let list = match v {
            Value::Array(a) => a,
            Value::Object(o) => {
                match o.get("version") {
                    Some(n) if n.as_u64() == Some(1) => {}
                    Some(n) => return err(format!("version: must be 1, got {n}")),
                    None => return err("version: required (1)"),
                }
                if let Some(k) = o.keys().find(|k| *k != "version" && *k != "map") {
                    return err(format!("{k}: unknown key (expected version, map)"));
                }
                match o.get("map") {
                    Some(Value::Array(a)) => a,
                    _ => return err("map: required list of [nodeid, nnodes, ppn, repeat] entries"),
                }
            }
            _ => {
                return err(
                    "must be an RFC 34 task map: {\"version\": 1, \"map\": [[nodeid, nnodes, ppn, repeat], ...]}",
                )
            }
        };
        let mut m = Taskmap::new();
        let mut tasks: u64 = 0;
        for (i, e) in list.iter().enumerate() {
            let f = e.as_array().filter(|a| a.len() == 4).and_then(|a| {
                a.iter().map(|x| x.as_u64().and_then(|n| u32::try_from(n).ok())).collect::<Option<Vec<u32>>>()
            });
            let Some(f) = f else {
                return err(format!("entry {i}: must be [nodeid, nnodes, ppn, repeat], integers >= 0, got {e}"));
            };
            let b = Block { nodeid: f[0], nnodes: f[1], ppn: f[2], repeat: f[3] };
            if b.nnodes == 0 || b.ppn == 0 || b.repeat == 0 {
                return err(format!("entry {i}: nnodes, ppn and repeat must be >= 1, got {e}"));
            }
            if u64::from(b.nodeid) + u64::from(b.nnodes) > u64::from(u32::MAX) {
                return err(format!("entry {i}: nodes beyond {}", u32::MAX));
            }
            tasks += u64::from(b.nnodes) * u64::from(b.ppn) * u64::from(b.repeat);
            if tasks > u64::from(u32::MAX) {
                return err(format!("entry {i}: more than {} tasks in all", u32::MAX));
            }
            m.blocks.push(b);
        }
        Ok(m)
    }

    /// The RFC 34 JSON form, `{"version": 1, "map": [[nodeid, nnodes, ppn, repeat], ...]}`.
    pub fn to_value(&self) -> Value {
        let map: Vec<[u32; 4]> = self.blocks.iter().map(|b| [b.nodeid, b.nnodes, b.ppn, b.repeat]).collect();
        json!({"version": 1, "map": map})
    }

    /// Number of nodes the map spans (one past the highest node id).
    pub fn nnodes(&self) -> u32 {
        self.blocks.iter().map(|b| b.nodeid.saturating_add(b.nnodes)).max().unwrap_or(0)
    }

    /// Total number of tasks.
    pub fn ntasks(&self) -> u64 {
        self.blocks.iter().map(|b| u64::from(b.nnodes) * u64::from(b.ppn) * u64::from(b.repeat)).sum()
    }

    /// The global task ranks of each of the first `nnodes` nodes, ascending. Call it on a map whose
    /// [`Taskmap::ntasks`] is known to be bounded (a job's): it lists every task. Nodes beyond `nnodes` are
    /// ignored.
    pub fn tasks_by_node(&self, nnodes: usize) -> Vec<Vec<u32>> {
        let mut out = vec![Vec::new(); nnodes];
        let mut next: u32 = 0;
        for b in &self.blocks {
            for _ in 0..b.repeat {
                for node in b.nodeid..b.nodeid.saturating_add(b.nnodes) {
                    let start = next;
                    next = next.saturating_add(b.ppn);
                    if let Some(v) = out.get_mut(node as usize) {
                        v.extend(start..next);
                    }
                }
            }
        }
        out
    }

    /// Check that the map fits a job of `nnodes` nodes and `ntasks` tasks, every node running at least one task
    /// (a job shell with nothing to run is refused, as Flux's shell refuses it).
    ///
    /// # Errors
    /// Says which: `got 3 nodes, expected 2`, `got 6 tasks, expected 4`, `node 1 gets no task`.
    pub fn check(&self, nnodes: u32, ntasks: u32) -> Result<(), TaskmapError> {
        if self.nnodes() != nnodes {
            return err(format!("got {} nodes, expected {nnodes}", self.nnodes()));
        }
        if self.ntasks() != u64::from(ntasks) {
            return err(format!("got {} tasks, expected {ntasks}", self.ntasks()));
        }
        // The nodes the blocks cover, as sorted intervals (a node count comes from user input: no table of it).
        let mut spans: Vec<(u32, u32)> = self.blocks.iter().map(|b| (b.nodeid, b.nodeid + b.nnodes)).collect();
        spans.sort_unstable();
        let mut covered = 0u32;
        for (start, end) in spans {
            if start > covered {
                return err(format!("node {covered} gets no task"));
            }
            covered = covered.max(end);
        }
        Ok(())
    }
}

/// How tasks are mapped to a job's nodes (`--taskmap`; the `taskmap` shell option, `{"scheme", "value"}` as
/// in Flux's jobspec).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Scheme {
    /// Consecutive ranks on each node (the default).
    #[default]
    Block,
    /// Ranks dealt round-robin over the nodes, this many at a time (`cyclic`, `cyclic:N`; N >= 1).
    Cyclic(u32),
    /// An explicit map (`manual:TASKMAP`).
    Manual(Taskmap),
    /// Task i on host `hosts[i % hosts.len()]` (`hostfile:FILE`).
    Hostfile {
        /// The file named (kept for the record; its lines were read at submit).
        path: String,
        /// Its host names, one per task in order, from the file's lines (host lists expanded).
        hosts: Vec<String>,
    },
}

/// Most host names a hostfile may give: a job shell of a task-per-line file runs that many tasks at most.
pub const HOSTFILE_MAX: usize = 1 << 20;

impl Scheme {
    /// Parse the command-line form: `block`, `cyclic`, `cyclic:N`, `manual:TASKMAP` (RFC 34 JSON) or
    /// `hostfile:FILE`, where `read` reads FILE (the CLI reads it at submit).
    ///
    /// # Errors
    /// An unknown scheme, a bad stride or task map, a hostfile that cannot be read, has no host or a bad host
    /// list, each said with the option's text.
    pub fn parse(s: &str, read: impl FnOnce(&str) -> Result<String, String>) -> Result<Scheme, TaskmapError> {
        let (name, value) = match s.split_once(':') {
            Some((n, v)) => (n, Some(v)),
            None => (s, None),
        };
        match (name, value) {
            ("block", None | Some("")) => Ok(Scheme::Block),
            ("cyclic", None | Some("")) => Ok(Scheme::Cyclic(1)),
            ("cyclic", Some(v)) => match v.parse::<u32>() {
                Ok(n) if n >= 1 => Ok(Scheme::Cyclic(n)),
                _ => err(format!("cyclic:{v}: the stride must be an integer >= 1")),
            },
            ("manual", Some(v)) if !v.is_empty() => {
                let j: Value = serde_json::from_str(v).map_err(|e| TaskmapError(format!("manual: not JSON: {e}")))?;
                Taskmap::decode(&j).map(Scheme::Manual).map_err(|e| TaskmapError(format!("manual: {e}")))
            }
            ("manual", _) => err("manual: needs an RFC 34 task map, e.g. manual:[[0,2,1,2]]"),
            ("hostfile", Some(path)) if !path.is_empty() => {
                let text = read(path).map_err(|e| TaskmapError(format!("hostfile:{path}: {e}")))?;
                let hosts = hostfile_hosts(&text).map_err(|e| TaskmapError(format!("hostfile:{path}: {e}")))?;
                Ok(Scheme::Hostfile { path: path.to_string(), hosts })
            }
            ("hostfile", _) => err("hostfile: needs a file name, e.g. hostfile:hosts.txt"),
            _ => err(format!("unknown scheme '{name}' (expected block, cyclic[:N], manual:TASKMAP or hostfile:FILE)")),
        }
    }

    /// The shell option's JSON form: `{"scheme": "cyclic", "value": "2"}` (Flux's), plus `"hosts"` for
    /// `hostfile`.
    pub fn to_value(&self) -> Value {
        match self {
            Scheme::Block => json!({"scheme": "block", "value": ""}),
            Scheme::Cyclic(n) => json!({"scheme": "cyclic", "value": n.to_string()}),
            Scheme::Manual(m) => json!({"scheme": "manual", "value": m.to_value().to_string()}),
            Scheme::Hostfile { path, hosts } => json!({"scheme": "hostfile", "value": path, "hosts": hosts}),
        }
    }

    /// Read the shell option (`attributes.system.shell.options.taskmap`): the object [`Scheme::to_value`] makes,
    /// or a string in the command-line form other than `hostfile:` (whose hosts must come with it).
    ///
    /// # Errors
    /// A message for a value of another shape, an unknown scheme, a bad value, or a `hostfile` without `hosts`.
    pub fn from_value(v: &Value) -> Result<Scheme, TaskmapError> {
        let no_file = |_: &str| Err::<String, _>("give the hosts in the job (vigil reads the file at submit)".into());
        match v {
            Value::String(s) => Scheme::parse(s, no_file),
            Value::Object(o) => {
                if let Some(k) = o.keys().find(|k| !matches!(k.as_str(), "scheme" | "value" | "hosts")) {
                    return err(format!("{k}: unknown key (expected scheme, value, hosts)"));
                }
                let scheme = o
                    .get("scheme")
                    .and_then(Value::as_str)
                    .ok_or(TaskmapError("scheme: required (block, cyclic, manual or hostfile)".into()))?;
                let value = match o.get("value") {
                    None | Some(Value::Null) => String::new(),
                    Some(Value::String(s)) => s.clone(),
                    Some(other) => other.to_string(),
                };
                if scheme == "hostfile" {
                    let hosts: Option<Vec<String>> = o
                        .get("hosts")
                        .and_then(Value::as_array)
                        .and_then(|a| a.iter().map(|h| h.as_str().map(str::to_string)).collect());
                    return match hosts {
                        Some(h) if !h.is_empty() && h.len() <= HOSTFILE_MAX && h.iter().all(|x| !x.is_empty()) => {
                            Ok(Scheme::Hostfile { path: value, hosts: h })
                        }
                        _ => err(format!(
                            "hosts: hostfile needs a non-empty list of host names (at most {HOSTFILE_MAX}); \
                             `vigil run --taskmap=hostfile:FILE` reads them from FILE"
                        )),
                    };
                }
                if o.contains_key("hosts") {
                    return err("hosts: only for the hostfile scheme");
                }
                let text = if value.is_empty() { scheme.to_string() } else { format!("{scheme}:{value}") };
                Scheme::parse(&text, no_file)
            }
            _ => err("must be {\"scheme\": ..., \"value\": ...} or a string such as \"cyclic:2\""),
        }
    }

    /// The distinct hosts a hostfile names, in the order they first appear (none for the other schemes).
    pub fn hosts(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        if let Scheme::Hostfile { hosts, .. } = self {
            let mut seen = std::collections::HashSet::new();
            for h in hosts {
                if seen.insert(h.as_str()) {
                    out.push(h.clone());
                }
            }
        }
        out
    }

    /// What can be checked before the job has nodes, given its node count (`None`: not fixed, a slot request or
    /// a node range) and task count.
    ///
    /// # Errors
    /// `manual` or `hostfile` without a fixed node count; a manual map that does not fit ([`Taskmap::check`]);
    /// a hostfile naming more or fewer hosts than the job's nodes, or a host that no task would run on.
    pub fn check(&self, nnodes: Option<u32>, ntasks: u32) -> Result<(), TaskmapError> {
        let fixed = |what: &str| {
            nnodes.ok_or_else(|| {
                TaskmapError(format!("{what} needs a fixed node count (-N N, not a range and not left out)"))
            })
        };
        match self {
            Scheme::Block | Scheme::Cyclic(_) => Ok(()),
            Scheme::Manual(m) => m.check(fixed("a manual task map")?, ntasks),
            Scheme::Hostfile { hosts, .. } => {
                let n = fixed("a hostfile task map")?;
                let distinct = self.hosts();
                if distinct.len() as u64 != u64::from(n) {
                    return err(format!(
                        "the hostfile names {} host(s) ({}), but the job asks for {n} node(s): each node of the \
                         job must run a task",
                        distinct.len(),
                        distinct.iter().cloned().collect::<Hostlist>()
                    ));
                }
                let used: std::collections::HashSet<&str> =
                    hosts.iter().take(ntasks as usize).map(String::as_str).collect();
                if let Some(h) = distinct.iter().find(|h| !used.contains(h.as_str())) {
                    return err(format!(
                        "host {h} gets no task: the hostfile has {} lines for {ntasks} task(s)",
                        hosts.len()
                    ));
                }
                Ok(())
            }
        }
    }

    /// Lay the tasks out on a job's nodes: `counts[i]` is the number of tasks the block layout gives node i
    /// (the scheduler's), `hostnames[i]` node i's host name.
    ///
    /// # Errors
    /// What [`Scheme::check`] finds, with the nodes now known: a manual map that does not fit, a hostfile host
    /// not among the job's nodes, a node without a task.
    pub fn layout(&self, counts: &[u32], hostnames: &[String]) -> Result<Taskmap, TaskmapError> {
        let nnodes = counts.len() as u32;
        let ntasks: u64 = counts.iter().map(|&c| u64::from(c)).sum();
        let ntasks = u32::try_from(ntasks).map_err(|_| TaskmapError("more than 2^32 - 1 tasks".into()))?;
        let map = match self {
            Scheme::Block => Taskmap::block(counts),
            Scheme::Cyclic(stride) => {
                let stride = (*stride).max(1);
                let mut given = vec![0u32; counts.len()];
                let mut left = ntasks;
                let mut m = Taskmap::new();
                while left > 0 {
                    for (i, &c) in counts.iter().enumerate() {
                        let ppn = stride.min(c - given[i]);
                        if ppn > 0 {
                            m.append(i as u32, 1, ppn);
                            given[i] += ppn;
                            left -= ppn;
                        }
                    }
                }
                m
            }
            Scheme::Manual(m) => m.clone(),
            Scheme::Hostfile { hosts, .. } => {
                if hosts.is_empty() {
                    return err("the hostfile names no host");
                }
                let index: std::collections::HashMap<&str, u32> =
                    hostnames.iter().enumerate().map(|(i, h)| (h.as_str(), i as u32)).collect();
                let mut m = Taskmap::new();
                for t in 0..ntasks as usize {
                    let h = &hosts[t % hosts.len()];
                    let Some(&node) = index.get(h.as_str()) else {
                        return err(format!("host {h} is not one of the job's nodes"));
                    };
                    m.append(node, 1, 1);
                }
                m
            }
        };
        map.check(nnodes, ntasks)?;
        Ok(map)
    }
}

/// The host names of a hostfile's text, in order ([`hostfile_entries`] without the line numbers).
///
/// # Errors
/// As [`hostfile_entries`].
pub fn hostfile_hosts(text: &str) -> Result<Vec<String>, String> {
    Ok(hostfile_entries(text)?.into_iter().map(|(_, h)| h).collect())
}

/// The host names of a hostfile's text, each with the line (from 1) that names it: one host or RFC 29 host list
/// per line; blank lines, and from a `#` to the end of its line, are skipped (comments, as in the hostfiles of
/// Open MPI and of Flux's users).
///
/// # Errors
/// A bad host list (naming its line), no host at all, or more than [`HOSTFILE_MAX`] names.
pub fn hostfile_entries(text: &str) -> Result<Vec<(usize, String)>, String> {
    let mut hosts = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let t = line.split_once('#').map_or(line, |(before, _)| before).trim();
        if t.is_empty() {
            continue;
        }
        let h = Hostlist::parse(t).map_err(|e| format!("line {}: {t:?}: {e}", i + 1))?;
        if hosts.len() + h.len() > HOSTFILE_MAX {
            return Err(format!("line {}: more than {HOSTFILE_MAX} host names", i + 1));
        }
        hosts.extend(h.into_vec().into_iter().map(|h| (i + 1, h)));
    }
    if hosts.is_empty() {
        return Err("no host name in the file (only blank lines or # comments)".into());
    }
    Ok(hosts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn hosts(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("node{i}")).collect()
    }

    fn no_file(_: &str) -> Result<String, String> {
        Err("no file".into())
    }

    #[test]
    fn block_and_cyclic_encode_as_flux_does() {
        assert_eq!(Taskmap::block(&[2, 2, 2, 2]).to_value(), json!({"version": 1, "map": [[0, 4, 2, 1]]}));
        assert_eq!(Taskmap::block(&[3, 3, 2]).to_value(), json!({"version": 1, "map": [[0, 2, 3, 1], [2, 1, 2, 1]]}));
        let c = Scheme::Cyclic(1).layout(&[2, 2], &hosts(2)).unwrap();
        assert_eq!(c.to_value(), json!({"version": 1, "map": [[0, 2, 1, 2]]}));
        assert_eq!(c.tasks_by_node(2), vec![vec![0, 2], vec![1, 3]]);
        let c2 = Scheme::Cyclic(2).layout(&[4, 4], &hosts(2)).unwrap();
        assert_eq!(c2.to_value(), json!({"version": 1, "map": [[0, 2, 2, 2]]}));
        assert_eq!(c2.tasks_by_node(2), vec![vec![0, 1, 4, 5], vec![2, 3, 6, 7]]);
        // Uneven counts: node 0 has 3, node 1 has 2; the last round only reaches node 0.
        let u = Scheme::Cyclic(1).layout(&[3, 2], &hosts(2)).unwrap();
        assert_eq!(u.tasks_by_node(2), vec![vec![0, 2, 4], vec![1, 3]]);
        assert_eq!(crate::pmi::process_mapping(&c.to_value()), "(vector,(0,2,1),(0,2,1))");
    }

    #[test]
    fn parse_the_command_line_forms() {
        assert_eq!(Scheme::parse("block", no_file), Ok(Scheme::Block));
        assert_eq!(Scheme::parse("cyclic", no_file), Ok(Scheme::Cyclic(1)));
        assert_eq!(Scheme::parse("cyclic:3", no_file), Ok(Scheme::Cyclic(3)));
        for bad in ["cyclic:0", "cyclic:x", "spiral", "manual", "manual:{", "manual:[[0,0,1,1]]", "hostfile:"] {
            assert!(Scheme::parse(bad, no_file).is_err(), "{bad}");
        }
        let e = Scheme::parse("spiral", no_file).unwrap_err().to_string();
        assert!(e.contains("unknown scheme 'spiral'"), "{e}");
        let m = Scheme::parse("manual:[[1,1,1,1],[0,1,1,1]]", no_file).unwrap();
        let Scheme::Manual(ref map) = m else { panic!("{m:?}") };
        assert_eq!(map.tasks_by_node(2), vec![vec![1], vec![0]]);
        let h = Scheme::parse("hostfile:f", |p| {
            assert_eq!(p, "f");
            Ok("# rank 0 goes back to its data\nnode1\n\n  # a comment\nnode[0-1]  # ranks 1-2\n".into())
        })
        .unwrap();
        assert_eq!(
            h,
            Scheme::Hostfile { path: "f".into(), hosts: vec!["node1".into(), "node0".into(), "node1".into()] }
        );
        let e = Scheme::parse("hostfile:f", no_file).unwrap_err().to_string();
        assert_eq!(e, "hostfile:f: no file");
        // The JSON form round-trips; a hostfile without its hosts is refused.
        for s in [Scheme::Block, Scheme::Cyclic(2), m, h] {
            assert_eq!(Scheme::from_value(&s.to_value()), Ok(s.clone()));
        }
        assert!(Scheme::from_value(&json!({"scheme": "hostfile", "value": "f"})).is_err());
        assert_eq!(Scheme::from_value(&json!("cyclic")), Ok(Scheme::Cyclic(1)));
    }

    #[test]
    fn impossible_maps_say_why() {
        let m = |v: Value| Scheme::Manual(Taskmap::decode(&v).unwrap());
        assert_eq!(m(json!([[0, 2, 1, 2]])).check(Some(2), 4), Ok(()));
        let e = m(json!([[0, 2, 1, 2]])).check(Some(2), 5).unwrap_err().to_string();
        assert_eq!(e, "got 4 tasks, expected 5");
        let e = m(json!([[0, 3, 1, 1]])).check(Some(2), 3).unwrap_err().to_string();
        assert_eq!(e, "got 3 nodes, expected 2");
        let e = m(json!([[0, 1, 2, 1], [2, 1, 2, 1]])).check(Some(3), 4).unwrap_err().to_string();
        assert_eq!(e, "node 1 gets no task");
        assert!(m(json!([[0, 2, 1, 2]])).check(None, 4).unwrap_err().to_string().contains("fixed node count"));
        let hf = |h: &[&str]| Scheme::Hostfile { path: "f".into(), hosts: h.iter().map(|s| s.to_string()).collect() };
        assert_eq!(hf(&["a", "b"]).check(Some(2), 4), Ok(()));
        assert!(hf(&["a", "b"]).check(Some(3), 4).unwrap_err().to_string().contains("names 2 host(s) (a,b)"));
        assert_eq!(
            hf(&["a", "a", "b"]).check(Some(2), 2).unwrap_err().to_string(),
            "host b gets no task: the hostfile has 3 lines for 2 task(s)"
        );
        let e = hf(&["a", "x"]).layout(&[1, 1], &["a".into(), "b".into()]).unwrap_err().to_string();
        assert_eq!(e, "host x is not one of the job's nodes");
        // Hostfile lines are reused from the top.
        let map = hf(&["b", "a"]).layout(&[2, 1], &["a".into(), "b".into()]).unwrap();
        assert_eq!(map.tasks_by_node(2), vec![vec![1], vec![0, 2]]);
        for bad in [json!({"version": 2, "map": []}), json!([[0, 1, 1]]), json!([[0, 1, 0, 1]]), json!("x")] {
            assert!(Taskmap::decode(&bad).is_err(), "{bad}");
        }
        assert!(Taskmap::decode(&json!([[0, 65536, 65536, 2]])).is_err(), "more than 2^32 - 1 tasks");
    }

    /// Hostfile lines: comments and blank lines skipped, each host with its line; errors name the line.
    #[test]
    fn hostfile_lines_are_numbered_and_comments_skipped() {
        let e = hostfile_entries("#head\n\nnode[1-2]\n node3 # spare\n").unwrap();
        assert_eq!(e, vec![(3, "node1".into()), (3, "node2".into()), (4, "node3".into())]);
        let bad = hostfile_entries("node1\nnode[2-\n").unwrap_err();
        assert!(bad.starts_with("line 2: \"node[2-\":"), "{bad}");
        assert_eq!(
            hostfile_entries("# only\n\n").unwrap_err(),
            "no host name in the file (only blank lines or # comments)"
        );
    }

    proptest! {
        /// Every scheme gives each node exactly the tasks the map says, every task once, every node at least
        /// one; block and cyclic keep the scheduler's per-node counts; the RFC 34 form decodes to the same map.
        #[test]
        fn layouts_place_every_task_once(counts in proptest::collection::vec(1u32..6, 1..8), stride in 1u32..4) {
            let n = counts.len();
            let names = hosts(n);
            let total: u32 = counts.iter().sum();
            for scheme in [Scheme::Block, Scheme::Cyclic(stride)] {
                let map = scheme.layout(&counts, &names).unwrap();
                let by = map.tasks_by_node(n);
                prop_assert_eq!(by.iter().map(|v| v.len() as u32).collect::<Vec<_>>(), counts.clone());
                let mut all: Vec<u32> = by.iter().flatten().copied().collect();
                all.sort_unstable();
                prop_assert_eq!(all, (0..total).collect::<Vec<_>>());
                prop_assert_eq!(Taskmap::decode(&map.to_value()), Ok(map.clone()));
                prop_assert!(by.iter().all(|v| v.windows(2).all(|w| w[0] < w[1])));
            }
        }

        /// A hostfile layout puts task i on line i's host (lines reused), whatever the hosts' order.
        #[test]
        fn hostfile_puts_task_i_on_line_i(lines in proptest::collection::vec(0usize..4, 1..12), extra in 0u32..8) {
            let names = hosts(4);
            let used: std::collections::BTreeSet<usize> = lines.iter().copied().collect();
            let job: Vec<String> = used.iter().map(|&i| names[i].clone()).collect();
            let ntasks = lines.len() as u32 + extra;
            let s = Scheme::Hostfile { path: "f".into(), hosts: lines.iter().map(|&i| names[i].clone()).collect() };
            prop_assert_eq!(s.check(Some(job.len() as u32), ntasks), Ok(()));
            let mut counts = vec![0u32; job.len()];
            counts[0] = ntasks; // only the total matters for a hostfile
            let map = s.layout(&counts, &job).unwrap();
            let by = map.tasks_by_node(job.len());
            for t in 0..ntasks {
                let host = &names[lines[t as usize % lines.len()]];
                let node = job.iter().position(|h| h == host).unwrap();
                prop_assert!(by[node].contains(&t));
            }
        }

        /// Decoding never panics, and what decodes spans the nodes and tasks it says.
        #[test]
        fn decode_is_total(blocks in proptest::collection::vec(proptest::collection::vec(0u64..5, 0..6), 0..6)) {
            if let Ok(m) = Taskmap::decode(&json!(blocks)) {
                let by = m.tasks_by_node(m.nnodes() as usize);
                prop_assert_eq!(by.iter().map(|v| v.len() as u64).sum::<u64>(), m.ntasks());
            }
        }
    }
}
