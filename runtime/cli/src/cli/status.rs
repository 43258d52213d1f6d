//! Status commands: `resource`, `overlay status`, `uptime`, `getattr`, `lsattr`, `ping`.

use super::{connect, fmt_secs};
use crate::hostlist::Hostlist;
use crate::idset::IdSet;
use clap::{Args, Subcommand};
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// `vigil resource` subcommands.
#[derive(Subcommand, Debug)]
pub enum ResourceCmd {
    /// Show which ranks are avail, torpid, drained, lost or down, with hostlists, one row per state that holds nodes
    /// (drained* is drained and also lost or down; the JSON has each rank's "liveness": online, lost or down).
    Status {
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// Only these states, comma-separated: avail, torpid, drained, lost, down (a drained node that is lost or
        /// down is in both). A state with no node has no row, with or without this option.
        #[arg(short = 's', long, value_name = "STATES", value_delimiter = ',')]
        states: Vec<String>,
        /// Print each group with this format: `{state}`, `{nnodes}`, `{ranks}`, `{nodelist}`, `{reason}` (e.g.
        /// `-no {nodelist}` for the host list alone).
        #[arg(short = 'o', long, value_name = "FORMAT")]
        format: Option<String>,
        /// No header line.
        #[arg(short = 'n', long)]
        no_header: bool,
    },
    /// Show free, allocated and down cores and GPUs.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Drain ranks (no new work is placed on them): RANKS is an idset ("1-3,5") or a hostlist. A rank drained
    /// already is refused, naming it and its reason, unless --force or --update.
    Drain {
        /// Ranks (idset) or hosts (hostlist).
        targets: String,
        /// Drain ranks drained already again, with this reason (it replaces theirs).
        #[arg(short, long, conflicts_with = "update")]
        force: bool,
        /// Drain only the ranks not drained yet; the others keep their reasons.
        #[arg(short, long)]
        update: bool,
        /// Reason.
        reason: Vec<String>,
    },
    /// Return drained ranks to service.
    Undrain {
        /// Ranks (idset) or hosts (hostlist).
        targets: String,
    },
    /// Print the instance's R (RFC 20).
    #[command(name = "R", alias = "r")]
    R,
    /// Print the resource eventlog (RFC 44), a line per event: timestamp, name, context.
    Eventlog {
        /// Print raw JSON lines.
        #[arg(long)]
        json: bool,
    },
}

/// `vigil overlay` subcommands.
#[derive(Subcommand, Debug)]
pub enum OverlayCmd {
    /// Draw the TBON with each broker's state and each subtree's health.
    Status {
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// Draw the subtree rooted at this rank and show that broker's own detectors and prober (a router's
        /// view of its children), as `flux overlay status --rank`.
        #[arg(short, long, default_value_t = 0)]
        rank: u32,
        /// Wait until the subtree's health is STATE before reporting, as `flux overlay status --wait`: full
        /// (every rank online), partial (some offline), degraded (some lost or torpid), lost or offline (its root).
        #[arg(long, value_name = "STATE", value_parser = ["full", "partial", "degraded", "lost", "offline"])]
        wait: Option<String>,
        /// With --wait: give up after this long (e.g. 30s, 2m, inf; exit code 1). Default: wait for ever.
        #[arg(long, value_name = "DURATION", requires = "wait", value_parser = parse_wait_timeout)]
        timeout: Option<WaitTimeout>,
    },
}

/// Options of `vigil getattr`.
#[derive(Args, Debug)]
pub struct GetattrArgs {
    /// Attribute name.
    pub name: String,
    /// Ask this rank's broker (default: the one this command is attached to).
    #[arg(short, long)]
    pub rank: Option<u32>,
}

/// Options of `vigil uptime`.
#[derive(Args, Debug)]
pub struct UptimeArgs {
    /// Ask this rank's broker for its lines (detectors, metrics endpoint, health check); default rank 0, which
    /// also holds the state directory.
    #[arg(short, long, default_value_t = 0)]
    pub rank: u32,
}

/// Options of `vigil lsattr`.
#[derive(Args, Debug)]
pub struct LsattrArgs {
    /// Show values (`-` for an attribute that is not set).
    #[arg(short = 'v', long)]
    pub values: bool,
    /// Describe every attribute: what it takes, its default, who may set it (needs no instance).
    #[arg(short = 'd', long, conflicts_with = "values")]
    pub doc: bool,
}

/// Options of `vigil ping`.
#[derive(Args, Debug)]
pub struct PingArgs {
    /// Target rank.
    pub rank: u32,
    /// Number of pings.
    #[arg(short, long, default_value_t = 1)]
    pub count: u32,
    /// Let the local broker time the round trips itself (overlay only, no client hop) and print the median,
    /// p99 and mean in µs instead of one line per ping.
    #[arg(long)]
    pub overlay_only: bool,
    /// Bytes of padding in each ping (with --overlay-only), at most 1 MiB.
    #[arg(long, default_value_t = 0)]
    pub size: u32,
    /// Pings kept in flight (with --overlay-only): above 1 it measures streaming throughput.
    #[arg(long, default_value_t = 1)]
    pub window: u32,
    /// Give up on a ping after this long (FSD duration, e.g. 10s, 500ms; 0 waits forever) and say what state
    /// the rank is in (a torpid broker answers only once it resumes).
    #[arg(long, default_value = "10s")]
    pub timeout: String,
}

/// Why rank `rank` may not answer, from rank 0's overlay view: ` (rank 3 is torpid: broker silent for ...)`.
async fn rank_state_hint(c: &crate::client::Client, rank: u32) -> String {
    let Ok(st) = c.rpc("overlay.status", 0, &json!({})).await else { return String::new() };
    let entry = st["ranks"].as_array().and_then(|a| a.iter().find(|r| r["rank"].as_u64() == Some(u64::from(rank))));
    match entry {
        Some(e) if e["state"] != "online" => {
            let why = e["reason"].as_str().filter(|w| !w.is_empty()).map(|w| format!(": {w}")).unwrap_or_default();
            format!(" (rank {rank} is {}{why})", e["state"].as_str().unwrap_or("?"))
        }
        _ => String::new(),
    }
}

/// The ranks named by `t`: an RFC 22 idset, else an RFC 29 hostlist of the instance's host names (as `flux
/// resource drain` reads its targets). Text of idset characters only (`3,2`, `2,2`) is an idset, and is refused
/// with the idset's error when RFC 22 refuses it (ids unique and ascending), never read as host names.
async fn resolve_targets(c: &crate::client::Client, t: &str) -> Result<IdSet, String> {
    match IdSet::parse(t) {
        Ok(s) => return Ok(s),
        Err(e) if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit() || b"-,[]".contains(&b)) => {
            return Err(e.to_string())
        }
        Err(_) => {}
    }
    let hl = Hostlist::parse(t).map_err(|e| format!("'{t}' is neither an idset of ranks nor a hostlist: {e}"))?;
    let st = super::rpc_to_rank0(c, "resource.status", &json!({})).await?;
    let mut out = IdSet::new();
    for h in hl.iter() {
        let r = st["ranks"]
            .as_array()
            .and_then(|a| a.iter().find(|r| r["hostname"].as_str() == Some(h)))
            .and_then(|r| r["rank"].as_u64());
        match r {
            Some(r) => {
                out.insert(r as u32);
            }
            None => return Err(format!("unknown host '{h}'")),
        }
    }
    Ok(out)
}

fn hosts_of(rows: &[&Value]) -> String {
    let hl: Hostlist = rows.iter().map(|r| r["hostname"].as_str().unwrap_or("").to_string()).collect();
    hl.to_string()
}

/// Fields of `vigil resource status -o`.
const STATUS_FIELDS: [&str; 5] = ["state", "nnodes", "ranks", "nodelist", "reason"];

/// A `-o` format names only known fields (`{name}`), with balanced braces.
fn check_format(f: &str) -> Result<(), String> {
    let mut rest = f;
    while let Some(i) = rest.find('{') {
        let end = rest[i..].find('}').ok_or_else(|| format!("--format: unclosed '{{' in '{f}'"))?;
        let name = &rest[i + 1..i + end];
        if !STATUS_FIELDS.contains(&name) {
            return Err(format!("--format: unknown field '{{{name}}}' (fields: {})", STATUS_FIELDS.join(", ")));
        }
        rest = &rest[i + end + 1..];
    }
    Ok(())
}

/// `f` with each `{name}` replaced by `field(name)` (`f` checked by [`check_format`]).
fn render_format(f: &str, field: &dyn Fn(&str) -> String) -> String {
    let mut out = String::new();
    let mut rest = f;
    while let Some(i) = rest.find('{') {
        out.push_str(&rest[..i]);
        let Some(end) = rest[i..].find('}') else { break };
        out.push_str(&field(&rest[i + 1..i + end]));
        rest = &rest[i + end + 1..];
    }
    out.push_str(rest);
    out
}

/// `vigil resource ...`.
pub(crate) async fn resource(cmd: ResourceCmd) -> Result<i32, String> {
    let c = connect().await?;
    match cmd {
        ResourceCmd::Status { json: as_json, states, format, no_header } => {
            const STATES: [&str; 5] = ["avail", "torpid", "drained", "lost", "down"];
            if let Some(bad) = states.iter().find(|s| !STATES.contains(&s.as_str())) {
                return Err(format!("--states: unknown state '{bad}' (expected {})", STATES.join(", ")));
            }
            if let Some(f) = &format {
                check_format(f)?;
            }
            let r = super::rpc_to_rank0(&c, "resource.status", &json!({})).await?;
            if as_json {
                println!("{r}");
                return Ok(0);
            }
            let rows = r["ranks"].as_array().cloned().unwrap_or_default();
            let mut groups: BTreeMap<(usize, String, String), Vec<&Value>> = BTreeMap::new();
            for row in &rows {
                let mut st = row["state"].as_str().unwrap_or("").to_string();
                let order = ["avail", "torpid", "drained", "lost", "down"].iter().position(|s| *s == st).unwrap_or(9);
                let mut reason = row["reason"].as_str().unwrap_or("").to_string();
                let liveness = row["liveness"].as_str().unwrap_or("online");
                if st == "drained" && liveness != "online" {
                    // Drained and not there: the drain must not hide that the node is lost or down.
                    st = "drained*".into();
                    let why = row["liveness_reason"].as_str().filter(|w| !w.is_empty());
                    reason = format!("{reason} ({liveness}{})", why.map(|w| format!(": {w}")).unwrap_or_default());
                }
                groups.entry((order, st, reason)).or_default().push(row);
            }

            // Only states that hold nodes are shown, with or without --states (as `flux resource status` skips
            // empty ones), so that a row always has ranks and a host list: `-s lost,down -no {nodelist}` prints
            // nothing when no node is lost.
            // A drained node that is lost or down ("drained*") answers to either state.
            let wanted = |st: &str, rs: &[&Value]| {
                states.is_empty()
                    || states.iter().any(|s| s == st.trim_end_matches('*'))
                    || (st.ends_with('*')
                        && rs.iter().any(|r| states.iter().any(|s| r["liveness"].as_str() == Some(s.as_str()))))
            };
            let lines: Vec<(&str, usize, String, String, &str)> = groups
                .iter()
                .filter(|((_, st, _), rs)| wanted(st, rs))
                .map(|((_, st, reason), rs)| {
                    let ranks: IdSet = rs.iter().filter_map(|r| r["rank"].as_u64()).map(|r| r as u32).collect();
                    (st.as_str(), rs.len(), ranks.to_string(), hosts_of(rs), reason.as_str())
                })
                .collect();
            // Columns as wide as their longest entry, so that long idsets and hostlists do not push REASON about.
            if let Some(f) = &format {
                if !no_header {
                    println!("{}", render_format(f, &|k| k.to_uppercase()));
                }
                for (st, n, ranks, hosts, reason) in &lines {
                    let field = |k: &str| match k {
                        "state" => st.to_string(),
                        "nnodes" => n.to_string(),
                        "ranks" => ranks.clone(),
                        "nodelist" => hosts.clone(),
                        _ => reason.to_string(),
                    };
                    println!("{}", render_format(f, &field));
                }
                return Ok(0);
            }
            let wr = lines.iter().map(|l| l.2.len()).max().unwrap_or(0).max(12);
            let wh = lines.iter().map(|l| l.3.len()).max().unwrap_or(0).max(24);
            if !no_header {
                println!("{:>8} {:>6} {:<wr$} {:<wh$} REASON", "STATE", "NNODES", "RANKS", "NODELIST");
            }
            for (st, n, ranks, hosts, reason) in lines {
                println!("{st:>8} {n:>6} {ranks:<wr$} {hosts:<wh$} {reason}");
            }
            Ok(0)
        }
        ResourceCmd::List { json: as_json } => {
            let r = super::rpc_to_rank0(&c, "resource.list", &json!({})).await?;
            if as_json {
                println!("{r}");
                return Ok(0);
            }
            let rows = r["ranks"].as_array().cloned().unwrap_or_default();
            let u = |v: &Value, k: &str| v[k].as_u64().unwrap_or(0);
            let mut free = (Vec::new(), 0, 0);
            let mut alloc = (Vec::new(), 0, 0);
            let mut down = (Vec::new(), 0, 0);
            for row in &rows {
                // Down: not there, or drained (as `flux resource list`); what a job still holds on a drained node
                // is also counted as allocated.
                let drained = row["drained"].as_bool().unwrap_or(false);
                if !row["up"].as_bool().unwrap_or(false) || drained {
                    down.0.push(row);
                    down.1 += u(row, "ncores") - u(row, "nalloc_cores");
                    down.2 += u(row, "ngpus") - u(row, "nalloc_gpus");
                }
                if !row["up"].as_bool().unwrap_or(false) {
                    continue;
                }
                let (fc, fg) = (u(row, "ncores") - u(row, "nalloc_cores"), u(row, "ngpus") - u(row, "nalloc_gpus"));
                if !drained && (fc > 0 || fg > 0) {
                    free.0.push(row);
                    free.1 += fc;
                    free.2 += fg;
                }
                if u(row, "nalloc_cores") > 0 || u(row, "nalloc_gpus") > 0 {
                    alloc.0.push(row);
                    alloc.1 += u(row, "nalloc_cores");
                    alloc.2 += u(row, "nalloc_gpus");
                }
            }
            println!("{:>10} {:>6} {:>8} {:>6} NODELIST", "STATE", "NNODES", "NCORES", "NGPUS");
            for (name, g) in [("free", &free), ("allocated", &alloc), ("down", &down)] {
                println!("{:>10} {:>6} {:>8} {:>6} {}", name, g.0.len(), g.1, g.2, hosts_of(&g.0));
            }
            Ok(0)
        }
        ResourceCmd::Drain { targets, reason, force, update } => {
            let ranks = resolve_targets(&c, &targets).await?;
            let mode = if force {
                "force"
            } else if update {
                "update"
            } else {
                ""
            };
            c.rpc("resource.drain", 0, &json!({"ranks": ranks.to_string(), "reason": reason.join(" "), "mode": mode}))
                .await
                .map_err(|e| e.errstr)?;
            Ok(0)
        }
        ResourceCmd::Undrain { targets } => {
            let ranks = resolve_targets(&c, &targets).await?;
            c.rpc("resource.undrain", 0, &json!({"ranks": ranks.to_string()})).await.map_err(|e| e.errstr)?;
            Ok(0)
        }
        ResourceCmd::R => {
            let r = c.rpc("resource.R", 0, &json!({})).await.map_err(|e| e.errstr)?;
            println!("{r}");
            Ok(0)
        }
        ResourceCmd::Eventlog { json: as_json } => {
            let r = c.rpc("resource.eventlog", 0, &json!({})).await.map_err(|e| e.errstr)?;
            for e in r["eventlog"].as_array().cloned().unwrap_or_default() {
                if as_json {
                    println!("{e}");
                } else {
                    println!("{}", super::jobcmd::human_event(&e));
                }
            }
            Ok(0)
        }
    }
}

/// Health of the subtree rooted at `rank`: full, partial (some offline), degraded (some lost or torpid), lost,
/// offline.
/// The health of `rank`'s subtree from an `overlay.status` answer's rows (`vigil_core`'s rule, as rank 0 applies
/// it for `--wait`).
pub(crate) fn subtree_health(ranks: &[Value], rank: usize) -> &'static str {
    let st = |r: u32| ranks.get(r as usize).and_then(|v| v["state"].as_str()).unwrap_or("offline");
    let children = |r: u32| {
        ranks
            .get(r as usize)
            .and_then(|v| v["children"].as_array())
            .map(|ch| ch.iter().filter_map(|c| c.as_u64()).filter_map(|c| u32::try_from(c).ok()).collect())
            .unwrap_or_default()
    };
    let size = u32::try_from(ranks.len()).unwrap_or(u32::MAX);
    vigil_core::broker::services::overlay::subtree_health(rank as u32, size, st, children)
}

fn draw(ranks: &[Value], rank: usize, prefix: &str, last: bool, root: bool, out: &mut String) {
    let v = &ranks[rank];
    let health = subtree_health(ranks, rank);
    let reason = v["reason"].as_str().filter(|s| !s.is_empty()).map(|s| format!(" ({s})")).unwrap_or_default();
    let branch = if root {
        ""
    } else if last {
        "└─ "
    } else {
        "├─ "
    };
    let mut own = match v["state"].as_str() {
        Some("torpid") => " [torpid]",
        _ => "",
    }
    .to_string();
    if v["adopted"].as_bool() == Some(true) {
        own.push_str(" [adopted]"); // under a new parent since its own was lost (re-parenting)
    }
    out.push_str(&format!(
        "{prefix}{branch}{} {}: {health}{own}{reason}\n",
        rank,
        v["hostname"].as_str().unwrap_or("?")
    ));
    let ch: Vec<usize> = v["children"]
        .as_array()
        .map(|a| a.iter().filter_map(|c| c.as_u64()).map(|c| c as usize).collect())
        .unwrap_or_default();
    let np = if root { String::new() } else { format!("{prefix}{}", if last { "   " } else { "│  " }) };
    for (i, c) in ch.iter().enumerate() {
        if *c < ranks.len() {
            draw(ranks, *c, &np, i + 1 == ch.len(), false, out);
        }
    }
}

/// `--timeout` of `vigil overlay status --wait`: how long to wait (`None`: for ever).
#[derive(Clone, Copy, Debug)]
pub struct WaitTimeout(Option<std::time::Duration>);

/// Parses `--timeout` of `vigil overlay status --wait`: a duration (`30s`, `2m`, `1.5h`), or `inf` for none; one
/// too long for the clock is none too. A usage error (exit 2) otherwise.
fn parse_wait_timeout(t: &str) -> Result<WaitTimeout, String> {
    if t == "inf" {
        return Ok(WaitTimeout(None));
    }
    let s = crate::duration::parse_duration_secs(t)
        .ok()
        .filter(|s| !s.is_nan() && *s >= 0.0)
        .ok_or_else(|| format!("expected a duration such as 30s, 2m or inf, not '{t}'"))?;
    Ok(WaitTimeout(std::time::Duration::try_from_secs_f64(s).ok()))
}

/// `vigil overlay status --wait=STATE [--timeout=DURATION]`: ask rank 0 for the health of `rank`'s subtree
/// (`overlay.status` with `health`) until it is `want`, every 20 ms at first and at most every 250 ms; `limit`:
/// give up after it (none: wait for ever).
async fn wait_for_health(
    c: &crate::client::Client,
    rank: u32,
    want: &str,
    limit: Option<std::time::Duration>,
) -> Result<(), String> {
    let since = std::time::Instant::now();
    let mut pause = std::time::Duration::from_millis(20);
    loop {
        let body = json!({"health": rank});
        let r = c.rpc("overlay.status", 0, &body).await.map_err(|e| format!("--rank {rank}: {}", e.errstr))?;
        let health = match r["health"].as_str() {
            Some(h) => h.to_string(),
            // An older rank 0 answers every row: the same rule on them.
            None => {
                let size = r["size"].as_u64().unwrap_or(0);
                if u64::from(rank) >= size {
                    return Err(format!("--rank {rank}: the instance has ranks 0-{}", size.saturating_sub(1)));
                }
                subtree_health(r["ranks"].as_array().map_or(&[][..], |v| v.as_slice()), rank as usize).to_string()
            }
        };
        if health == want {
            return Ok(());
        }
        if let Some(l) = limit {
            if since.elapsed() >= l {
                return Err(format!(
                    "timed out after {:.1} s waiting for rank {rank}'s subtree to be {want} (it is {health})",
                    l.as_secs_f64()
                ));
            }
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(std::time::Duration::from_millis(250));
    }
}

/// `vigil overlay status`.
pub(crate) async fn overlay(cmd: OverlayCmd) -> Result<i32, String> {
    let c = connect().await?;
    match cmd {
        OverlayCmd::Status { json: as_json, rank, wait, timeout } => {
            if let Some(want) = wait {
                wait_for_health(&c, rank, &want, timeout.and_then(|t| t.0)).await?;
            }
            let mut r = c.rpc("overlay.status", 0, &json!({})).await.map_err(|e| e.errstr)?;
            let size = r["size"].as_u64().unwrap_or(0);
            if u64::from(rank) >= size {
                return Err(format!("--rank {rank}: the instance has ranks 0-{}", size.saturating_sub(1)));
            }
            let mut unknown = None;
            if rank != 0 {
                // overlay.status is rank 0's service; a router's own detectors come from its broker.info, asked
                // for a bounded time: a stopped or lost broker does not keep the tree from being drawn.
                match rpc_within(&c, "broker.info", rank, json!({}), rank, (2.0, "2 s")).await {
                    Ok(info) => {
                        r["detectors"] = info["detectors"].clone();
                        r["security"] = info["security"].clone();
                    }
                    Err(why) => {
                        // Why it does not answer, from rank 0's view, as `vigil ping` says it.
                        let why = format!("unknown: {why}");
                        r["detectors"] = json!({"error": why});
                        r["security"] = Value::Null;
                        unknown = Some(why);
                    }
                }
            }
            if as_json {
                println!("{r}");
                return Ok(0);
            }
            let ranks = r["ranks"].as_array().cloned().unwrap_or_default();
            println!(
                "size {}, topo {}, levels {}, transport {}, critical ranks {}",
                r["size"],
                r["topo"].as_str().unwrap_or(""),
                r["depth"],
                r["transport"].as_str().unwrap_or(""),
                r["critical_ranks"].as_str().unwrap_or("")
            );
            if let Some(why) = &unknown {
                println!("detectors (rank {rank}): {why}");
            }
            for l in detector_lines(&r["detectors"]) {
                println!("detectors (rank {rank}): {l}");
            }
            let mut out = String::new();
            if (rank as usize) < ranks.len() {
                draw(&ranks, rank as usize, "", true, true, &mut out);
            }
            // Each rank's link to its parent: rdma (device) or tcp (why not rdma), within the drawn subtree.
            let mut subtree = std::collections::BTreeSet::new();
            let mut stack = vec![rank as usize];
            while let Some(x) = stack.pop() {
                if x < ranks.len() && subtree.insert(x) {
                    stack.extend(
                        ranks[x]["children"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .filter_map(|c| c.as_u64())
                            .map(|c| c as usize),
                    );
                }
            }
            for l in ranks.iter().filter(|l| {
                l["link"].is_object() && l["rank"].as_u64().is_some_and(|x| subtree.contains(&(x as usize)))
            }) {
                let state = l["state"].as_str().unwrap_or("");
                if matches!(state, "lost" | "offline") {
                    // The record of the last connection outlives it: say there is none now.
                    out.push_str(&format!(
                        "link {} -> {}: none (rank {} is {state})\n",
                        l["rank"], l["parent"], l["rank"]
                    ));
                    continue;
                }
                out.push_str(&format!(
                    "link {} -> {}: {} ({})\n",
                    l["rank"],
                    l["parent"],
                    l["link"]["transport"].as_str().unwrap_or("?"),
                    l["link"]["detail"].as_str().unwrap_or("")
                ));
            }
            print!("{out}");
            Ok(0)
        }
    }
}

/// `vigil uptime`.
/// `vigil shutdown`.
#[derive(Args, Debug)]
pub struct ShutdownArgs {
    /// The exit code rank 0's broker (and the `vigil start` around it) exits with.
    #[arg(long, default_value_t = 0)]
    pub exit_code: i32,
}

/// `vigil shutdown`: ask rank 0 to stop the instance (`broker.shutdown`; the instance owner only), then wait until
/// rank 0's broker has closed our connection, that is until it has exited (at most its 10 s shutdown grace plus a
/// margin).
pub(crate) async fn shutdown(a: ShutdownArgs) -> Result<i32, String> {
    let c = connect().await?;
    // Counted before asking: the brokers that will be told, apart from those already gone.
    let ov = c.rpc("overlay.status", 0, &json!({})).await.map_err(|e| e.errstr)?;
    c.rpc("broker.shutdown", 0, &json!({"exit_code": a.exit_code})).await.map_err(|e| e.errstr)?;
    eprintln!("vigil: shutting down the instance ({})", broker_tally(&ov));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let empty = json!({});
    while std::time::Instant::now() < deadline {
        let ping = tokio::time::timeout(std::time::Duration::from_secs(1), c.rpc("broker.ping", 0, &empty));
        match ping.await {
            Ok(Ok(_)) => tokio::time::sleep(std::time::Duration::from_millis(100)).await,
            Ok(Err(_)) => return Ok(0),
            Err(_) => {}
        }
    }
    Err("rank 0 did not stop within 20 s".into())
}

/// What `vigil shutdown` says of the brokers it stops, from an `overlay.status` answer (`{size, ranks: [{state}]}`):
/// "4 brokers", or "4 brokers: 3 running, 1 lost" when some are not there (lost or offline), so that the count
/// does not claim to stop brokers that are already gone.
fn broker_tally(ov: &Value) -> String {
    let size = ov["size"].as_u64().unwrap_or(0);
    let noun = if size == 1 { "broker" } else { "brokers" };
    let mut gone: std::collections::BTreeMap<&str, u64> = std::collections::BTreeMap::new();
    for r in ov["ranks"].as_array().into_iter().flatten() {
        if let Some(s @ ("lost" | "offline")) = r["state"].as_str() {
            *gone.entry(s).or_default() += 1;
        }
    }
    let away: u64 = gone.values().sum();
    if away == 0 {
        return format!("{size} {noun}");
    }
    let rest: Vec<String> = gone.iter().map(|(s, n)| format!("{n} {s}")).collect();
    format!("{size} {noun}: {} running, {}", size.saturating_sub(away), rest.join(", "))
}

pub(crate) async fn uptime(a: UptimeArgs) -> Result<i32, String> {
    let c = connect().await?;
    let r = c.rpc("broker.info", a.rank, &json!({})).await.map_err(|e| format!("rank {}: {}", a.rank, e.errstr))?;
    let owner = nix::unistd::User::from_uid(nix::unistd::getuid()).ok().flatten().map(|u| u.name).unwrap_or_default();
    let now = chrono_like_now();
    println!(
        " {now} {} {}, owner {owner}, depth {}, size {}, tbon {} (levels {}), transport {}, resources {}",
        r["state"].as_str().unwrap_or("?"),
        fmt_secs(r["uptime"].as_f64().unwrap_or(0.0)),
        r["instance_level"].as_str().unwrap_or("0"),
        r["size"],
        r["topo"].as_str().unwrap_or(""),
        r["depth"],
        r["transport"].as_str().unwrap_or(""),
        r["resource_source"].as_str().unwrap_or(""),
    );
    for l in detector_lines(&r["detectors"]) {
        println!(" detectors (rank {}): {l}", r["rank"].as_u64().unwrap_or(0));
    }
    println!(" {}", security_line(&r["security"]));
    println!(" jobs contained by: {}", r["containment"].as_str().unwrap_or("?"));
    // A broker older than the metrics endpoint has no such field: say nothing rather than "off".
    if let Some(m) = r["metrics"].as_str() {
        println!(" metrics (rank {}): {m}", r["rank"].as_u64().unwrap_or(0));
    }
    // Only rank 0 keeps jobs: another rank's "none" would read as a fact about the instance.
    if a.rank == 0 {
        println!(" {}", statedir_line(&r["statedir"]));
    }
    if let Some(l) = health_line(&r["health"]) {
        println!(" {l}");
    }
    Ok(0)
}

/// The node health check of the broker asked (`health.program`): `None` when it has none.
fn health_line(h: &Value) -> Option<String> {
    let program = h["program"].as_str()?;
    let every = h["interval"].as_f64().map_or_else(|| "?".into(), |s| format!("{s}s"));
    let runs = h["runs"].as_u64().unwrap_or(0);
    let mut l = format!("health check: {program} every {every}, {runs} run(s): {}", h["state"].as_str().unwrap_or("?"));
    if let Some(r) = h["reason"].as_str() {
        l.push_str(&format!(" ({r})"));
    }
    Some(l)
}

/// Rank 0's state directory: where it is, how many restarts it has seen, or why it cannot be used.
fn statedir_line(s: &Value) -> String {
    let path = s["path"].as_str().unwrap_or("?");
    let why = s["why"].as_str().unwrap_or("");
    match s["state"].as_str() {
        None => "state directory: none (jobs are not kept across a restart of rank 0)".into(),
        Some("damaged") => format!(
            "state directory: {path}: DAMAGED: {why}; scheduling stopped, submissions refused (the file is kept)"
        ),
        Some(state) => {
            let n = s["restarts"].as_u64().unwrap_or(0);
            let mut l = format!("state directory: {path}, {n} restart(s)");
            if let (Some(w), Some(f)) = (s["writes"].as_u64(), s["syncs"].as_u64()) {
                l.push_str(&format!(", {w} write(s) and {f} fsync(s) since this rank 0 started"));
            }
            if state == "failing" {
                l.push_str(&format!("; FAILING: {why}; submissions refused until it can commit again"));
            }
            if let Some(f) = s["fold_failing"].as_str() {
                l.push_str(&format!(
                    "; the redo log cannot be folded into vigil.sqlite: {f} (every record is kept in the log, which \
                     grows until a fold succeeds)"
                ));
            }
            l
        }
    }
}

/// How overlay links are secured, and how many unauthenticated connections this broker refused.
fn security_line(s: &Value) -> String {
    format!(
        "overlay links: authenticated and encrypted ({}); {} unauthenticated connection(s) refused",
        s["noise"].as_str().unwrap_or("?"),
        s["refused"].as_u64().unwrap_or(0)
    )
}

/// One line per failure detector: `process-exit ebpf`, `responder userspace (reason)`, ...
fn detector_lines(d: &Value) -> Vec<String> {
    [
        ("process-exit", "process_exit"),
        ("tcp", "tcp"),
        ("responder", "responder"),
        ("probes", "probes"),
        ("job-network", "job_network"),
        ("probing", "probing"),
        ("judge", "judge"),
    ]
    .iter()
    .filter_map(|(label, k)| d[*k].as_str().map(|v| format!("{label} {v}")))
    .collect()
}

fn chrono_like_now() -> String {
    let t = crate::broker_now() as i64;
    let mut tm: libc::tm = unsafe_zeroed_tm();
    // SAFETY: localtime_r writes into the tm we own; t is a valid time_t.
    unsafe { libc::localtime_r(&t, &mut tm) };
    format!("{:02}:{:02}:{:02}", tm.tm_hour, tm.tm_min, tm.tm_sec)
}

fn unsafe_zeroed_tm() -> libc::tm {
    // SAFETY: libc::tm is a plain C struct of integers (and a nullable pointer); all-zero is a valid value.
    unsafe { std::mem::zeroed() }
}

/// `vigil getattr`.
pub(crate) async fn getattr(a: GetattrArgs) -> Result<i32, String> {
    let c = connect().await?;
    let rank = a.rank.unwrap_or(c.welcome.rank);
    let r = c
        .rpc("broker.getattr", rank, &json!({"name": a.name}))
        .await
        .map_err(|e| format!("{}: {}", a.name, e.errstr))?;
    println!("{}", r["value"].as_str().unwrap_or(""));
    Ok(0)
}

/// `vigil lsattr`: the attributes of the broker this command is attached to, by name (`-v`: with their values);
/// `--doc`: the table of [`crate::attrs::ATTRS`].
pub(crate) async fn lsattr(a: LsattrArgs) -> Result<i32, String> {
    if a.doc {
        print!("{}", attr_doc());
        return Ok(0);
    }
    let c = connect().await?;
    let r = c.rpc("broker.lsattr", c.welcome.rank, &json!({})).await.map_err(|e| e.errstr)?;
    if let Some(m) = r["attrs"].as_object() {
        for (k, v) in m {
            if a.values {
                println!("{k:<24} {}", v.as_str().unwrap_or("-"));
            } else {
                println!("{k}");
            }
        }
    }
    Ok(0)
}

/// `vigil lsattr --doc`: two lines per attribute, `NAME  KIND  default: ...  set by: ...` and its documentation.
fn attr_doc() -> String {
    use crate::attrs::DefaultValue;
    let mut out = String::new();
    for a in crate::attrs::ATTRS {
        let default = match a.default {
            DefaultValue::Value(v) => v.to_string(),
            DefaultValue::Otherwise { means, .. } => means.to_string(),
        };
        let set = a.access.describe();
        if a.access.settable() {
            out.push_str(&format!("{:<24} {}; default: {default}; set by: {set}\n", a.name, a.kind.describe()));
        } else {
            out.push_str(&format!("{:<24} {}; {set}\n", a.name, a.kind.describe()));
        }
        out.push_str(&format!("{:<24} {}\n", "", a.doc));
    }
    out
}

/// One RPC to `nodeid` about `rank`, waiting up to `limit.0` seconds (0: forever; `limit.1` is how the user
/// wrote it); on expiry the error says what state `rank` is in.
async fn rpc_within(
    c: &crate::client::Client,
    topic: &str,
    nodeid: u32,
    body: Value,
    rank: u32,
    limit: (f64, &str),
) -> Result<Value, String> {
    let fut = c.rpc(topic, nodeid, &body);
    let r = if limit.0 == 0.0 {
        fut.await
    } else {
        match tokio::time::timeout(std::time::Duration::from_secs_f64(limit.0), fut).await {
            Ok(r) => r,
            Err(_) => {
                return Err(format!("rank {rank}: no answer within {}{}", limit.1, rank_state_hint(c, rank).await))
            }
        }
    };
    match r {
        Ok(v) => Ok(v),
        // Not connected: say what rank 0 knows of it (lost and why, or not up yet).
        Err(e) if e.errnum == crate::message::errno::EHOSTUNREACH => {
            Err(format!("rank {rank}: {}{}", e.errstr, rank_state_hint(c, rank).await))
        }
        Err(e) => Err(format!("rank {rank}: {}", e.errstr)),
    }
}

/// `vigil ping`.
pub(crate) async fn ping(a: PingArgs) -> Result<i32, String> {
    let limit =
        crate::duration::parse_duration_secs(&a.timeout).ok().filter(|t| t.is_finite() && *t >= 0.0).ok_or_else(
            || format!("invalid --timeout '{}': expected a duration such as 10s or 500ms (0: none)", a.timeout),
        )?;
    let c = connect().await?;
    if a.overlay_only {
        if a.count == 0 || a.window == 0 {
            return Err("--count and --window must be at least 1".into());
        }
        if a.size > 1 << 20 {
            return Err(format!("--size {} is too large: at most 1048576 bytes", a.size));
        }
        let body = json!({"rank": a.rank, "count": a.count.max(1), "size": a.size, "window": a.window});
        let r = rpc_within(&c, "broker.rtt", crate::message::NODEID_ANY, body, a.rank, (limit, &a.timeout)).await?;
        let mut v: Vec<f64> =
            r["samples_us"].as_array().map(|a| a.iter().filter_map(Value::as_f64).collect()).unwrap_or_default();
        v.sort_by(f64::total_cmp);
        let pick = |q: f64| v.get(((v.len() as f64 - 1.0) * q).round() as usize).copied().unwrap_or(0.0);
        let mean = v.iter().sum::<f64>() / v.len().max(1) as f64;
        let secs = r["elapsed_s"].as_f64().unwrap_or(0.0).max(1e-9);
        let n = v.len() as f64;
        println!(
            "rank {}: {} overlay round trips: median {:.1} us, p99 {:.1} us, mean {:.1} us; {:.0} msgs/s, {:.2} MB/s sent",
            a.rank,
            v.len(),
            pick(0.5),
            pick(0.99),
            mean,
            n / secs,
            n * f64::from(a.size) / secs / 1e6
        );
        return Ok(0);
    }
    for i in 0..a.count.max(1) {
        let t = std::time::Instant::now();
        let r = rpc_within(&c, "broker.ping", a.rank, json!({"seq": i}), a.rank, (limit, &a.timeout)).await?;
        println!(
            "rank {} ({}): seq={i} time={:.3} ms hops={}",
            a.rank,
            r["hostname"].as_str().unwrap_or(""),
            t.elapsed().as_secs_f64() * 1e3,
            r["route"]
        );
    }
    Ok(0)
}

/// `vigil event` subcommands.
#[derive(Subcommand, Debug)]
pub enum EventCmd {
    /// Publish an event with an optional JSON payload.
    Pub {
        /// Event topic.
        topic: String,
        /// JSON payload (default: none).
        payload: Option<String>,
    },
    /// Print events whose topic starts with PREFIX, one JSON object per line: {"topic", "seq", "payload"}.
    Sub {
        /// Exit after this many events.
        #[arg(short, long)]
        count: Option<u64>,
        /// Topic prefix.
        prefix: String,
    },
}

/// `vigil event ...`.
pub(crate) async fn event(cmd: EventCmd) -> Result<i32, String> {
    let c = connect().await?;
    match cmd {
        EventCmd::Pub { topic, payload } => {
            let p: Value = match payload {
                Some(s) => serde_json::from_str(&s).map_err(|e| format!("payload is not JSON: {e}"))?,
                None => Value::Null,
            };
            c.rpc("broker.pub", 0, &json!({"topic": topic, "payload": p})).await.map_err(|e| e.errstr)?;
            Ok(0)
        }
        EventCmd::Sub { count, prefix } => {
            c.subscribe(&prefix).await.map_err(|e| e.errstr)?;
            let mut n = 0;
            println!("{}", json!({"subscribed": prefix}));
            while let Some(m) = c.next_event().await {
                println!("{}", json!({"topic": m.topic, "seq": m.seq, "payload": m.json()}));
                n += 1;
                if count.is_some_and(|c| n >= c) {
                    break;
                }
            }
            Ok(0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{broker_tally, check_format, render_format, statedir_line};
    use serde_json::{json, Value};

    /// `-o` formats: known fields only, each replaced; a header of their names.
    #[test]
    fn status_formats_name_known_fields() {
        assert!(check_format("{nodelist} {nnodes}").is_ok());
        assert!(check_format("{nodes}").unwrap_err().contains("unknown field '{nodes}'"));
        assert!(check_format("{ranks").unwrap_err().contains("unclosed"));
        let f = |k: &str| if k == "nodelist" { "node[1-2]".to_string() } else { k.len().to_string() };
        assert_eq!(render_format("hosts={nodelist};{state}!", &f), "hosts=node[1-2];5!");
        assert_eq!(render_format("{nodelist}", &|k| k.to_uppercase()), "NODELIST");
    }

    /// The state directory's line says what an operator must know: restarts and writes, a store that fails
    /// (submissions refused), a redo log that cannot be folded (it grows), a damaged file.
    #[test]
    fn the_state_directory_line_says_what_fails() {
        let ok = json!({"path": "/var/lib/vigil", "state": "ok", "restarts": 2, "writes": 10, "syncs": 3});
        assert_eq!(
            statedir_line(&ok),
            "state directory: /var/lib/vigil, 2 restart(s), 10 write(s) and 3 fsync(s) since this rank 0 started"
        );
        let mut folding = ok.clone();
        folding["fold_failing"] = json!("database or disk is full");
        let l = statedir_line(&folding);
        assert!(l.contains("cannot be folded into vigil.sqlite: database or disk is full"), "{l}");
        assert!(l.contains("which grows"), "{l}");
        let failing = json!({"path": "/d", "state": "failing", "restarts": 0, "why": "ENOSPC"});
        assert!(statedir_line(&failing).contains("FAILING: ENOSPC; submissions refused"));
        let damaged = json!({"path": "/d", "state": "damaged", "why": "truncated"});
        assert!(statedir_line(&damaged).contains("DAMAGED: truncated; scheduling stopped"));
        assert!(statedir_line(&Value::Null).starts_with("state directory: none"));
    }

    #[test]
    fn shutdown_counts_only_the_brokers_still_there_as_running() {
        let st =
            |s: &[&str]| json!({"size": s.len(), "ranks": s.iter().map(|s| json!({"state": s})).collect::<Vec<_>>()});
        assert_eq!(broker_tally(&st(&["online", "online", "torpid", "online"])), "4 brokers");
        assert_eq!(broker_tally(&st(&["online"])), "1 broker");
        assert_eq!(
            broker_tally(&st(&["online", "lost", "online", "offline"])),
            "4 brokers: 2 running, 1 lost, 1 offline"
        );
    }
}
