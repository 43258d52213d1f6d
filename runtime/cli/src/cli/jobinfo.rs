//! `vigil job info ID` for people: a job's record (the `info` object of a `job-manager.info` reply, as
//! `vigil jobs --json` has it) as aligned `key: value` lines, one fact each, in the manner of Slurm's
//! `scontrol show job` and Flux's `flux job info`/`flux jobs -o long`. `--json` prints the reply itself (jobspec
//! and R too), unchanged, for scripts.
//!
//! Every key is printed for every job, `-` when it does not apply yet (a pending job has no nodes), so that the
//! layout does not move. Times are wall-clock, RFC 3339 in UTC to the second; durations are RFC 23 (`10m`).
//! A lost node is named as everywhere else: its host name and its rank in this instance (`node3 (rank 3)`).

use crate::duration::format_duration;
use crate::hostlist::Hostlist;
use crate::idset::IdSet;
use serde_json::Value;
use std::time::{Duration, UNIX_EPOCH};

/// Width of the key column (the longest key, `time limit`, and its colon, plus one space).
const KEY_WIDTH: usize = 12;

/// The lines of `vigil job info` for `info` (a job's record), `now` being the wall-clock time (seconds since the
/// epoch, for a running job's run time so far) and `user` the name of a user id (its number if it has
/// none). Missing or mistyped fields print as `-`: this never fails.
pub(crate) fn human(info: &Value, now: f64, user: impl Fn(u32) -> String) -> String {
    let mut out = String::new();
    let mut line = |key: &str, value: String| {
        out.push_str(&format!("{:<KEY_WIDTH$}{value}\n", format!("{key}:")));
    };
    let s = |k: &str| info[k].as_str().filter(|v| !v.is_empty()).map(str::to_string);
    let dash = || "-".to_string();
    let state = s("state").unwrap_or_else(dash);

    line("id", format!("{} ({})", s("id_f58").unwrap_or_else(dash), info["id"]));
    line("name", s("name").unwrap_or_else(dash));
    let uid = info["userid"].as_u64().unwrap_or(0) as u32;
    line("user", format!("{} ({uid})", user(uid)));
    line(
        "state",
        match s("reason_pending") {
            Some(why) if state == "SCHED" || state == "DEPEND" => {
                format!("{state} ({})", super::jobsfmt::local_reason(&why))
            }
            _ => state.clone(),
        },
    );
    line(
        "result",
        match (s("result"), info["exit_code"].as_i64()) {
            (Some(r), Some(code)) => format!("{r}, exit code {code}"),
            _ => dash(),
        },
    );
    line(
        "exception",
        match info["exception"].as_object() {
            Some(e) => format!(
                "{} (severity {}): {}",
                e.get("type").and_then(Value::as_str).unwrap_or("?"),
                e.get("severity").and_then(Value::as_u64).unwrap_or(0),
                e.get("note").and_then(Value::as_str).unwrap_or("")
            ),
            None => dash(),
        },
    );

    // Nodes: held once allocated (ranks known), else the count asked for.
    let ranks = s("ranks").and_then(|r| IdSet::parse(&r).ok()).unwrap_or_default();
    let nnodes = info["nnodes"].as_u64();
    line(
        "nodes",
        match (nnodes, info["nnodes_current"].as_u64()) {
            (Some(n), _) if ranks.is_empty() => format!("{n} asked for"),
            (Some(n), Some(now)) if now != n => format!("{now} now, {n} at start"),
            (Some(n), _) => n.to_string(),
            (None, _) => dash(),
        },
    );
    line(
        "nodelist",
        match s("nodelist") {
            Some(n) => format!("{n} (ranks {ranks})"),
            None => dash(),
        },
    );
    line("lost", lost_nodes(info, &ranks).unwrap_or_else(dash));
    line(
        "tasks",
        match info["ntasks"].as_u64() {
            // The RFC 34 map itself (`[[nodeid, nnodes, ppn, repeat], ...]`), without its `version` wrapper.
            Some(n) => match info.get("taskmap").map(|m| m.get("map").unwrap_or(m)).filter(|m| !m.is_null()) {
                Some(map) => format!("{n}, task map {map}"),
                None => n.to_string(),
            },
            None => dash(),
        },
    );
    line("instance", s("uri").unwrap_or_else(dash));
    line(
        "requeue",
        match (info["requeue"].as_bool(), info["requeues"].as_u64().unwrap_or(0)) {
            (Some(true), n) => format!("yes, {n} so far"),
            _ => "no".to_string(),
        },
    );

    line(
        "time limit",
        match info["duration"].as_f64() {
            Some(d) if d > 0.0 => format_duration(Duration::from_secs_f64(d)),
            _ => "none".to_string(),
        },
    );
    let t = |k: &str| info[k].as_f64().filter(|t| *t > 0.0);
    line("submitted", t("t_submit").map(wall).unwrap_or_else(dash));
    line(
        "started",
        match (t("t_run"), t("t_submit")) {
            (Some(run), Some(sub)) => format!("{} ({} after submission)", wall(run), secs(run - sub)),
            (Some(run), None) => wall(run),
            _ => dash(),
        },
    );
    let end = t("t_finish").or_else(|| t("t_inactive"));
    line(
        "ended",
        match (t("t_run"), end) {
            (Some(run), Some(end)) => format!("{} (ran {})", wall(end), secs(end - run)),
            (Some(run), None) => format!("- (running for {})", secs(now - run)),
            (None, Some(end)) => wall(end),
            (None, None) => dash(),
        },
    );
    line("expires", t("expiration").filter(|_| end.is_none()).map(wall).unwrap_or_else(dash));
    line("usage", usage(&info["usage"]).unwrap_or_else(dash));
    out
}

/// `node3 (rank 3), node5 (rank 5)`: the lost ranks with their host names, taken from the job's own ranks and
/// node list (in the same order, RFC 20); the lost node list as it is if they do not match.
fn lost_nodes(info: &Value, ranks: &IdSet) -> Option<String> {
    let lost = IdSet::parse(info["lost_ranks"].as_str()?).ok().filter(|l| !l.is_empty())?;
    let nodelist = info["nodelist"].as_str().and_then(|n| Hostlist::parse(n).ok()).unwrap_or_default();
    let host = |r: u32| ranks.iter().position(|x| x == r).and_then(|i| nodelist.get(i)).map(str::to_string);
    match lost.iter().map(|r| host(r).map(|h| format!("{h} (rank {r})"))).collect::<Option<Vec<_>>>() {
        Some(named) => Some(named.join(", ")),
        None => Some(format!("{} (ranks {lost})", info["lost_nodelist"].as_str().unwrap_or("?"))),
    }
}

/// `cpu 1.2s user, 0.3s system; memory peak 64.0 MiB; 1 OOM kill` from a job's `usage` (cgroup accounting).
fn usage(u: &Value) -> Option<String> {
    let u = u.as_object()?;
    let us = |k: &str| u.get(k).and_then(Value::as_u64);
    let mut parts = Vec::new();
    match (us("cpu_user_usec"), us("cpu_system_usec"), us("cpu_usec")) {
        (Some(user), Some(sys), _) => {
            parts.push(format!("cpu {} user, {} system", secs(user as f64 / 1e6), secs(sys as f64 / 1e6)))
        }
        (_, _, Some(all)) => parts.push(format!("cpu {}", secs(all as f64 / 1e6))),
        _ => {}
    }
    if let Some(peak) = us("memory_peak") {
        parts.push(format!("memory peak {:.1} MiB", peak as f64 / (1u64 << 20) as f64));
    }
    if let Some(n) = us("oom_kills").filter(|n| *n > 0) {
        parts.push(format!("{n} OOM kill{}", if n == 1 { "" } else { "s" }));
    }
    (!parts.is_empty()).then(|| parts.join("; "))
}

/// A wall-clock time (seconds since the epoch) in RFC 3339, UTC, to the second.
fn wall(t: f64) -> String {
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_secs_f64(t.max(0.0))).to_string()
}

/// A span of seconds for people: `0.4s`, `3.2m` (as `vigil jobs` shows run times).
fn secs(s: f64) -> String {
    super::fmt_secs(s.max(0.0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn user(uid: u32) -> String {
        if uid == 0 {
            "root".into()
        } else {
            uid.to_string()
        }
    }

    /// The value printed for `key`, with every line's value starting in one column.
    fn field(out: &str, key: &str) -> String {
        let l = out.lines().find(|l| l.starts_with(&format!("{key}:"))).unwrap_or_else(|| panic!("{key}: {out}"));
        assert_eq!(l.as_bytes().get(KEY_WIDTH - 1), Some(&b' '), "aligned: {l:?}");
        l[KEY_WIDTH..].to_string()
    }

    /// Every `(key, value)` of `want` printed so.
    #[track_caller]
    fn expect(out: &str, want: &[(&str, &str)]) {
        for (key, value) in want {
            assert_eq!(field(out, key), *value, "{key}:\n{out}");
        }
    }

    #[test]
    fn a_batch_job_that_lost_a_node_says_which_and_how_many_it_holds() {
        let info = json!({
            "id": 1234, "id_f58": "fABC", "name": "batch.sh", "userid": 0, "state": "INACTIVE",
            "result": "COMPLETED", "exit_code": 0, "exception": null, "nnodes": 4, "nnodes_current": 3,
            "ranks": "1-4", "nodelist": "node[1-4]", "lost_ranks": "3", "lost_nodelist": "node3", "ntasks": 4,
            "taskmap": null, "uri": "local:///tmp/x/local-0", "requeue": false, "requeues": 0, "duration": 600.0,
            "t_submit": 1_800_000_000.0, "t_run": 1_800_000_000.5, "t_finish": 1_800_000_010.5,
            "t_inactive": 1_800_000_011.0, "expiration": 1_800_000_600.5,
            "usage": {"cpu_user_usec": 1_200_000, "cpu_system_usec": 300_000}
        });
        let out = human(&info, 1_800_000_020.0, user);
        expect(
            &out,
            &[
                ("id", "fABC (1234)"),
                ("user", "root (0)"),
                ("state", "INACTIVE"),
                ("result", "COMPLETED, exit code 0"),
                ("exception", "-"),
                ("nodes", "3 now, 4 at start"),
                ("nodelist", "node[1-4] (ranks 1-4)"),
                ("lost", "node3 (rank 3)"),
                ("instance", "local:///tmp/x/local-0"),
                ("time limit", "10m"),
                ("submitted", "2027-01-15T08:00:00Z"),
                ("started", "2027-01-15T08:00:00Z (0.5s after submission)"),
                ("ended", "2027-01-15T08:00:10Z (ran 10.0s)"),
                ("expires", "-"), // an ended job expires no more
                ("usage", "cpu 1.2s user, 0.3s system"),
            ],
        );
    }

    #[test]
    fn a_failed_job_shows_its_exception_and_its_lost_nodes_by_host_and_rank() {
        let info = json!({
            "id": 7, "id_f58": "f8", "name": "sleep", "userid": 1000, "state": "INACTIVE", "result": "FAILED",
            "exit_code": 69, "exception": {"type": "node-failure", "severity": 0,
                                           "note": "lost node node3 (rank 3), where task 3 ran"},
            "nnodes": 4, "nnodes_current": 3, "ranks": "0-1,3,5", "nodelist": "node[0-1,3,5]",
            "lost_ranks": "3,5", "lost_nodelist": "node[5,3]", "ntasks": 4,
            "taskmap": {"version": 1, "map": [[0, 4, 1, 1]]},
            "requeue": true, "requeues": 1, "duration": 0.0, "t_submit": 1_800_000_000.0
        });
        let out = human(&info, 1_800_000_020.0, user);
        expect(
            &out,
            &[
                ("user", "1000 (1000)"),
                ("result", "FAILED, exit code 69"),
                ("exception", "node-failure (severity 0): lost node node3 (rank 3), where task 3 ran"),
                ("lost", "node3 (rank 3), node5 (rank 5)"),
                ("tasks", "4, task map [[0,4,1,1]]"),
                ("requeue", "yes, 1 so far"),
                ("time limit", "none"),
                ("started", "-"),
            ],
        );
    }

    #[test]
    fn a_pending_job_shows_what_it_asked_for_and_why_it_waits() {
        let info = json!({
            "id": 9, "id_f58": "fA", "name": "app", "userid": 0, "state": "SCHED", "nnodes": 8, "ranks": "",
            "nodelist": "", "lost_ranks": "", "ntasks": 8, "reason_pending": "insufficient resources",
            "t_submit": 1_800_000_000.0, "t_run": null, "exit_code": null, "result": null
        });
        let out = human(&info, 1_800_000_020.0, user);
        expect(
            &out,
            &[
                ("state", "SCHED (insufficient resources)"),
                ("nodes", "8 asked for"),
                ("nodelist", "-"),
                ("lost", "-"),
                ("result", "-"),
                ("ended", "-"),
            ],
        );
        // Garbage never panics: every field is `-`.
        let out = human(&json!({"nnodes": "x", "ranks": 5, "usage": []}), 0.0, user);
        assert_eq!(field(&out, "nodes"), "-");
    }

    #[test]
    fn a_running_job_shows_how_long_it_has_run_and_when_it_expires() {
        let info = json!({"state": "RUN", "t_submit": 1_800_000_000.0, "t_run": 1_800_000_000.0,
                          "expiration": 1_800_000_600.0, "nnodes": 2, "nnodes_current": 2, "ranks": "0-1",
                          "nodelist": "n[0-1]", "usage": {"cpu_usec": 90_000_000, "memory_peak": 67_108_864,
                          "oom_kills": 1}});
        let out = human(&info, 1_800_000_090.0, user);
        expect(
            &out,
            &[
                ("nodes", "2"),
                ("ended", "- (running for 1.5m)"),
                ("expires", "2027-01-15T08:10:00Z"),
                ("usage", "cpu 1.5m; memory peak 64.0 MiB; 1 OOM kill"),
            ],
        );
    }
}
