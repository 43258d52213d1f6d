//! What `vigil top` shows, gathered from rank 0's services and kept apart from drawing: [`Model::from_replies`]
//! turns the answers of `overlay.status`, `resource.status`, `resource.list`, `job-manager.list` and
//! `resource.eventlog` (RFC 44) into plain rows, and [`gather`] asks for them. Nothing here touches the terminal.

use crate::hostlist::Hostlist;
use crate::idset::IdSet;
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// How many verdicts (the newest) the model keeps.
pub(crate) const VERDICTS_KEPT: usize = 200;

/// One broker of the TBON as drawn: its place in the tree, its subtree's health and its own marks.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TreeRow {
    /// The tree's drawing before the rank (`│  ├─ `).
    pub(crate) prefix: String,
    /// The broker's rank.
    pub(crate) rank: u32,
    /// Its host name.
    pub(crate) host: String,
    /// Its subtree's health: full, partial, degraded, lost or offline.
    pub(crate) health: &'static str,
    /// Its own state (online, torpid, lost, offline).
    pub(crate) state: String,
    /// Under a parent that is not its static one (re-parented).
    pub(crate) adopted: bool,
    /// Why it is not online, if rank 0 knows.
    pub(crate) reason: String,
}

/// Nodes in one resource state (as `vigil resource status` groups them).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct NodeGroup {
    /// avail, torpid, drained, drained* (drained and lost or down), lost or down.
    pub(crate) state: String,
    /// Their ranks, an RFC 22 idset.
    pub(crate) ranks: String,
    /// Their hosts, an RFC 29 hostlist.
    pub(crate) hosts: String,
    /// How many.
    pub(crate) count: usize,
    /// The drain reason or the liveness verdict's.
    pub(crate) reason: String,
}

/// One active job.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct JobRow {
    /// Its id in F58.
    pub(crate) id: String,
    /// Its owner's login name (or uid).
    pub(crate) user: String,
    /// Its name.
    pub(crate) name: String,
    /// Its RFC 21 state.
    pub(crate) state: String,
    /// Nodes (requested or held).
    pub(crate) nnodes: String,
    /// Tasks.
    pub(crate) ntasks: u64,
    /// Seconds running (a running job) or waiting (a pending one).
    pub(crate) secs: f64,
    /// A pending job's reason (`reason_pending`), a running job's nodes.
    pub(crate) info: String,
    /// A running batch or alloc job's instance (`local://...`): `vigil top` can descend into it.
    pub(crate) uri: Option<String>,
}

impl JobRow {
    /// Running or cleaning up (else pending).
    pub(crate) fn running(&self) -> bool {
        matches!(self.state.as_str(), "RUN" | "CLEANUP")
    }
}

/// One liveness verdict from the resource eventlog (RFC 44 `offline` with state lost, `torpid`, `lively`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Verdict {
    /// When rank 0 recorded it (s since the epoch).
    pub(crate) time: f64,
    /// lost, offline, torpid or lively.
    pub(crate) state: String,
    /// The ranks, an idset.
    pub(crate) ranks: String,
    /// The rule or signal that made it, as the judge said it (`connection closed`, `probe-misses ...`); empty when
    /// the event carries none (torpid and lively events do not).
    pub(crate) rule: String,
    /// Seconds from the failure to the verdict, when the event carries it (`latency`).
    pub(crate) latency: Option<f64>,
}

/// Everything one screen of `vigil top` shows, for one instance.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Model {
    /// Brokers in the instance.
    pub(crate) size: u64,
    /// `tbon.topo`.
    pub(crate) topo: String,
    /// Critical ranks (idset).
    pub(crate) critical: String,
    /// The TBON, depth first from rank 0.
    pub(crate) tree: Vec<TreeRow>,
    /// Ranks by own state: online, torpid, lost, offline.
    pub(crate) rank_states: BTreeMap<String, usize>,
    /// Ranks under a parent not their static one.
    pub(crate) adopted: usize,
    /// Nodes by resource state.
    pub(crate) nodes: Vec<NodeGroup>,
    /// Cores allocated / on nodes up.
    pub(crate) cores: (u64, u64),
    /// GPUs allocated / on nodes up.
    pub(crate) gpus: (u64, u64),
    /// Active jobs: running first, then pending, each in submit order.
    pub(crate) jobs: Vec<JobRow>,
    /// Verdicts, newest first.
    pub(crate) verdicts: Vec<Verdict>,
    /// Wall time of the gathering (s since the epoch).
    pub(crate) now: f64,
}

impl Model {
    /// The model from the answers of rank 0's services (each as its command's `--json` prints it) at wall time
    /// `now`. Fields missing from an answer leave their rows empty rather than failing.
    pub(crate) fn from_replies(
        overlay: &Value,
        rstatus: &Value,
        rlist: &Value,
        jobs: &Value,
        eventlog: &Value,
        now: f64,
    ) -> Model {
        let ranks = overlay["ranks"].as_array().map_or(&[][..], |v| v.as_slice());
        let mut tree = Vec::new();
        if !ranks.is_empty() {
            walk(ranks, 0, "", true, true, &mut tree, &mut vec![false; ranks.len()]);
        }
        let mut rank_states = BTreeMap::new();
        for r in ranks {
            *rank_states.entry(r["state"].as_str().unwrap_or("?").to_string()).or_default() += 1;
        }
        Model {
            size: overlay["size"].as_u64().unwrap_or(0),
            topo: overlay["topo"].as_str().unwrap_or("").to_string(),
            critical: overlay["critical_ranks"].as_str().unwrap_or("").to_string(),
            tree,
            rank_states,
            adopted: ranks.iter().filter(|r| r["adopted"].as_bool() == Some(true)).count(),
            nodes: node_groups(rstatus),
            cores: in_use(rlist, "nalloc_cores", "ncores"),
            gpus: in_use(rlist, "nalloc_gpus", "ngpus"),
            jobs: job_rows(jobs, now),
            verdicts: verdicts(eventlog),
            now,
        }
    }
}

/// Depth first from `rank`, as `vigil overlay status` draws it; `seen` keeps a shape that is not a tree from looping.
fn walk(ranks: &[Value], rank: usize, prefix: &str, last: bool, root: bool, out: &mut Vec<TreeRow>, seen: &mut [bool]) {
    if seen[rank] {
        return;
    }
    seen[rank] = true;
    let v = &ranks[rank];
    let branch = match (root, last) {
        (true, _) => "",
        (false, true) => "└─ ",
        (false, false) => "├─ ",
    };
    out.push(TreeRow {
        prefix: format!("{prefix}{branch}"),
        rank: rank as u32,
        host: v["hostname"].as_str().unwrap_or("?").to_string(),
        health: super::super::status::subtree_health(ranks, rank),
        state: v["state"].as_str().unwrap_or("?").to_string(),
        adopted: v["adopted"].as_bool() == Some(true),
        reason: v["reason"].as_str().unwrap_or("").to_string(),
    });
    let ch: Vec<usize> = v["children"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_u64).map(|c| c as usize).filter(|c| *c < ranks.len()).collect())
        .unwrap_or_default();
    let np = if root { String::new() } else { format!("{prefix}{}", if last { "   " } else { "│  " }) };
    for (i, c) in ch.iter().enumerate() {
        walk(ranks, *c, &np, i + 1 == ch.len(), false, out, seen);
    }
}

/// `resource.status` rows grouped by state and reason, in the order avail, torpid, drained, lost, down.
fn node_groups(rstatus: &Value) -> Vec<NodeGroup> {
    const ORDER: [&str; 6] = ["avail", "torpid", "drained", "drained*", "lost", "down"];
    let mut groups: BTreeMap<(usize, String, String), Vec<&Value>> = BTreeMap::new();
    for row in rstatus["ranks"].as_array().into_iter().flatten() {
        let mut st = row["state"].as_str().unwrap_or("?").to_string();
        let mut reason = row["reason"].as_str().unwrap_or("").to_string();
        let liveness = row["liveness"].as_str().unwrap_or("online");
        if st == "drained" && liveness != "online" {
            // Drained and not there: the drain must not hide that the node is lost or down.
            st = "drained*".into();
            reason = format!("{reason} ({liveness})");
        } else if matches!(st.as_str(), "lost" | "down" | "torpid") && reason.is_empty() {
            reason = row["liveness_reason"].as_str().unwrap_or("").to_string();
        }
        let order = ORDER.iter().position(|s| *s == st).unwrap_or(ORDER.len());
        groups.entry((order, st, reason)).or_default().push(row);
    }
    groups
        .into_iter()
        .map(|((_, state, reason), rows)| {
            let ranks: IdSet = rows.iter().filter_map(|r| r["rank"].as_u64()).map(|r| r as u32).collect();
            let hosts: Hostlist = rows.iter().map(|r| r["hostname"].as_str().unwrap_or("").to_string()).collect();
            NodeGroup { state, ranks: ranks.to_string(), hosts: hosts.to_string(), count: rows.len(), reason }
        })
        .collect()
}

/// (allocated, total) of `alloc` / `total` over the nodes that are up in a `resource.list` answer.
fn in_use(rlist: &Value, alloc: &str, total: &str) -> (u64, u64) {
    let up = rlist["ranks"].as_array().into_iter().flatten().filter(|r| r["up"].as_bool().unwrap_or(false));
    up.fold((0, 0), |(a, t), r| (a + r[alloc].as_u64().unwrap_or(0), t + r[total].as_u64().unwrap_or(0)))
}

/// Active jobs of a `job-manager.list` answer: running first, then pending, each in the order listed.
fn job_rows(jobs: &Value, now: f64) -> Vec<JobRow> {
    let mut rows: Vec<JobRow> = jobs["jobs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|j| j["state"].as_str() != Some("INACTIVE"))
        .map(|j| {
            let state = j["state"].as_str().unwrap_or("?").to_string();
            let running = matches!(state.as_str(), "RUN" | "CLEANUP");
            let since = if running { j["t_run"].as_f64() } else { j["t_submit"].as_f64() };
            let info = if running {
                let lost = j["lost_nodelist"].as_str().filter(|l| !l.is_empty());
                format!(
                    "{}{}",
                    j["nodelist"].as_str().unwrap_or(""),
                    lost.map(|l| format!(", lost {l}")).unwrap_or_default()
                )
            } else {
                j["reason_pending"].as_str().map_or_else(|| state.to_lowercase(), str::to_string)
            };
            JobRow {
                id: j["id_f58"].as_str().unwrap_or("?").to_string(),
                user: super::super::jobcmd::user_name(j["userid"].as_u64().unwrap_or(0) as u32),
                name: j["name"].as_str().unwrap_or("").to_string(),
                nnodes: j["nnodes"].as_u64().map_or_else(|| "-".into(), |n| n.to_string()),
                ntasks: j["ntasks"].as_u64().unwrap_or(0),
                secs: since.map_or(0.0, |t| (now - t).max(0.0)),
                info,
                uri: j["uri"].as_str().filter(|_| state == "RUN").map(str::to_string),
                state,
            }
        })
        .collect();
    rows.sort_by_key(|r| !r.running());
    rows
}

/// Liveness verdicts of a `resource.eventlog` answer, newest first, at most [`VERDICTS_KEPT`].
fn verdicts(eventlog: &Value) -> Vec<Verdict> {
    let evs = eventlog["eventlog"].as_array().map_or(&[][..], |v| v.as_slice());
    evs.iter()
        .rev()
        .filter_map(|e| {
            let ctx = &e["context"];
            let state = match e["name"].as_str()? {
                "offline" => ctx["state"].as_str().unwrap_or("offline"),
                s @ ("torpid" | "lively") => s,
                _ => return None,
            };
            Some(Verdict {
                time: e["timestamp"].as_f64().unwrap_or(0.0),
                state: state.to_string(),
                ranks: ctx["idset"].as_str().unwrap_or("").to_string(),
                rule: ctx["reason"].as_str().unwrap_or("").to_string(),
                latency: ctx["latency"].as_f64(),
            })
        })
        .take(VERDICTS_KEPT)
        .collect()
}

/// Why a gathering failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum GatherError {
    /// The connection to the broker ended.
    Disconnected,
    /// No answer within the time given.
    Slow,
    /// A service refused (its topic and error).
    Refused(String),
}

/// Ask rank 0 (through `c`) for everything the model holds, waiting at most `limit` for the answers.
///
/// # Errors
/// [`GatherError`]: the connection ended, the answers were late, or a service refused.
pub(crate) async fn gather(c: &crate::client::Client, limit: std::time::Duration) -> Result<Model, GatherError> {
    let empty = json!({});
    let ask = |topic: &'static str, body: Value| async move {
        c.rpc(topic, 0, &body).await.map_err(|e| {
            if e.errstr == crate::client::RpcError::disconnected_text() {
                GatherError::Disconnected
            } else {
                GatherError::Refused(format!("{topic}: {}", e.errstr))
            }
        })
    };
    let all = async {
        tokio::try_join!(
            ask("overlay.status", empty.clone()),
            ask("resource.status", empty.clone()),
            ask("resource.list", empty.clone()),
            ask("job-manager.list", json!({"all": false})),
            ask("resource.eventlog", empty.clone()),
        )
    };
    let (ov, rs, rl, jobs, ev) = tokio::time::timeout(limit, all).await.map_err(|_| GatherError::Slow)??;
    Ok(Model::from_replies(&ov, &rs, &rl, &jobs, &ev, crate::broker_now()))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::Model;
    use serde_json::json;

    /// Four brokers under rank 0, rank 3 lost (connection closed), rank 2 torpid; one job running on a nested
    /// instance, one pending for resources.
    pub(crate) fn sample() -> Model {
        let rank = |r: u32, st: &str, children: &[u32], reason: &str| {
            json!({"rank": r, "hostname": format!("node{r}"), "state": st, "children": children,
                   "adopted": false, "reason": reason})
        };
        let overlay = json!({"size": 4, "topo": "kary:32", "critical_ranks": "0", "ranks": [
            rank(0, "online", &[1, 2, 3], ""), rank(1, "online", &[], ""), rank(2, "torpid", &[], "silent 3 s"),
            rank(3, "lost", &[], "connection closed")]});
        let node = |r: u32, st: &str, live: &str, why: &str| {
            json!({"rank": r, "hostname": format!("node{r}"), "state": st, "liveness": live, "reason": "",
                   "liveness_reason": why})
        };
        let rstatus = json!({"ranks": [node(0, "avail", "online", ""), node(1, "avail", "online", ""),
            node(2, "torpid", "online", ""), node(3, "lost", "lost", "connection closed")]});
        let list = |r: u32, up: bool, alloc: u64| json!({"rank": r, "up": up, "ncores": 2, "nalloc_cores": alloc, "ngpus": 1, "nalloc_gpus": alloc.min(1)});
        let rlist = json!({"ranks": [list(0, true, 2), list(1, true, 1), list(2, true, 0), list(3, false, 0)]});
        let jobs = json!({"jobs": [
            {"id_f58": "fPEND1", "userid": 0, "name": "big", "state": "SCHED", "nnodes": 4, "ntasks": 4,
             "t_submit": 990.0, "reason_pending": "resources: needs 4 nodes, 2 can take it now"},
            {"id_f58": "fRUN1", "userid": 0, "name": "batch", "state": "RUN", "nnodes": 2, "ntasks": 2,
             "t_submit": 900.0, "t_run": 940.0, "nodelist": "node[0-1]", "uri": "local:///tmp/x/local-0"},
            {"id_f58": "fDONE", "userid": 0, "name": "old", "state": "INACTIVE"}]});
        let eventlog = json!({"eventlog": [
            {"timestamp": 900.0, "name": "online", "context": {"idset": "0-3"}},
            {"timestamp": 995.0, "name": "torpid", "context": {"idset": "2"}},
            {"timestamp": 998.5, "name": "offline", "context": {"idset": "3", "state": "lost",
             "reason": "connection closed", "latency": 0.012}}]});
        Model::from_replies(&overlay, &rstatus, &rlist, &jobs, &eventlog, 1000.0)
    }

    #[test]
    fn replies_become_rows() {
        let m = sample();
        assert_eq!(m.size, 4);
        let tree: Vec<String> = m.tree.iter().map(|t| format!("{}{} {}", t.prefix, t.rank, t.health)).collect();
        // A torpid rank's own subtree is degraded (vigil_core's rule, as `vigil overlay status` says it).
        assert_eq!(tree, ["0 degraded", "├─ 1 full", "├─ 2 degraded", "└─ 3 lost"]);
        assert_eq!(m.rank_states.get("lost"), Some(&1));
        let nodes: Vec<(&str, &str, &str)> =
            m.nodes.iter().map(|n| (n.state.as_str(), n.ranks.as_str(), n.reason.as_str())).collect();
        assert_eq!(nodes, [("avail", "0-1", ""), ("torpid", "2", ""), ("lost", "3", "connection closed")]);
        assert_eq!(m.nodes[0].hosts, "node[0-1]");
        assert_eq!((m.cores, m.gpus), ((3, 6), (2, 3)));
        // Running first; the inactive job is not in the queue.
        let jobs: Vec<(&str, bool)> = m.jobs.iter().map(|j| (j.id.as_str(), j.running())).collect();
        assert_eq!(jobs, [("fRUN1", true), ("fPEND1", false)]);
        assert_eq!(m.jobs[0].uri.as_deref(), Some("local:///tmp/x/local-0"));
        assert_eq!(m.jobs[0].secs, 60.0);
        assert!(m.jobs[1].info.starts_with("resources: needs 4 nodes"));
        // Newest first; `online` is not a verdict.
        let v: Vec<(&str, &str, Option<f64>)> =
            m.verdicts.iter().map(|v| (v.state.as_str(), v.rule.as_str(), v.latency)).collect();
        assert_eq!(v, [("lost", "connection closed", Some(0.012)), ("torpid", "", None)]);
    }

    #[test]
    fn a_shape_that_is_not_a_tree_does_not_loop_and_missing_fields_leave_rows_empty() {
        let overlay = json!({"size": 2, "ranks": [
            {"rank": 0, "state": "online", "children": [1, 7]}, {"rank": 1, "state": "online", "children": [0]}]});
        let m = Model::from_replies(&overlay, &json!({}), &json!(null), &json!({"jobs": 3}), &json!({}), 0.0);
        assert_eq!(m.tree.len(), 2);
        assert!(m.nodes.is_empty() && m.jobs.is_empty() && m.verdicts.is_empty());
        assert_eq!(m.cores, (0, 0));
    }
}
