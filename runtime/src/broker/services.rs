//! Request handlers of the broker's services (dispatch by topic).

use super::core::{now, Core, Internal, MemberState, Watcher};
use crate::hwloc::NodeResources;
use crate::idset::IdSet;
use crate::jobs::{JobId, JobState};
use crate::message::{errno, Message, FLAG_STREAMING, ROUTE_LOCAL};
use crate::shellproto::{OutputLine, ShellExit, ShellReport};
use serde_json::{json, Value};
use tracing::{debug, info, warn};

/// Which failure detectors this broker runs, as `{process_exit, tcp, responder, probes}` (detect.rs), and on a
/// parent `probing` (children by group datagram / unicast, where replies are read).
fn detectors(core: &Core) -> Value {
    match &core.detect {
        Some(d) => {
            let mut v = serde_json::to_value(&d.status).unwrap_or_default();
            if let (Some(s), Some(o)) = (&d.prober_stats, v.as_object_mut()) {
                o.insert("probing".into(), s.describe().into());
            }
            v
        }
        None => json!({"process_exit": "userspace (waitpid)", "tcp": "userspace (socket errors and TCP_INFO)",
            "responder": "none (overlay address is not IPv4)", "probes": "none"}),
    }
}

/// This process's id, asked of the kernel once (a system call per `broker.ping` otherwise).
fn pid() -> u32 {
    static PID: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *PID.get_or_init(std::process::id)
}

/// Services offered by every broker.
const EVERY_RANK: &[&str] = &["broker", "rexec", "detect"];
/// Services offered by rank 0 only.
const RANK0: &[&str] = &["job-manager", "job-info", "job-exec", "resource", "overlay"];

/// True if a broker of `rank` offers `service`.
pub(crate) fn offers(rank: u32, service: &str) -> bool {
    EVERY_RANK.contains(&service) || (rank == 0 && RANK0.contains(&service))
}

fn field<'a>(v: &'a Value, name: &str) -> Result<&'a Value, (u32, String)> {
    v.get(name).ok_or((errno::EPROTO, format!("missing '{name}' in request")))
}

fn parse_id(v: &Value) -> Result<JobId, (u32, String)> {
    match field(v, "id")? {
        Value::Number(n) => n.as_u64().map(JobId).ok_or((errno::EPROTO, "bad job id".into())),
        Value::String(s) => JobId::parse(s).map_err(|e| (errno::EINVAL, e.to_string())),
        _ => Err((errno::EPROTO, "bad job id".into())),
    }
}

fn parse_ranks(v: &Value) -> Result<IdSet, (u32, String)> {
    let s = field(v, "ranks")?.as_str().ok_or((errno::EPROTO, "ranks must be an idset string".into()))?;
    IdSet::parse(s).map_err(|e| (errno::EINVAL, format!("invalid ranks '{s}': {e}")))
}

/// Handle a request addressed to this broker.
pub(crate) fn dispatch(core: &mut Core, msg: Message) {
    let r = handle(core, &msg, &Body::new(&msg));
    match r {
        // The request moves into its response (topic and route stack reused, not copied).
        Ok(Some(Out(payload))) => core.respond_with(msg, payload),
        Ok(None) => {}
        Err((e, s)) => core.respond_error(&msg, e, &s),
    }
}

/// A request's JSON payload, parsed when a handler first asks for it: a handler that reads no payload
/// (`broker.ping`, `broker.info`...) does not pay for parsing one (the size of a ping's padding, for instance).
struct Body<'a> {
    msg: &'a Message,
    parsed: std::cell::OnceCell<Result<Value, String>>,
}

impl<'a> Body<'a> {
    fn new(msg: &'a Message) -> Body<'a> {
        Body { msg, parsed: std::cell::OnceCell::new() }
    }

    /// The payload as JSON (`null` when empty), or `EPROTO` when it is not JSON.
    fn json(&self) -> Result<&Value, (u32, String)> {
        let r = self.parsed.get_or_init(|| self.msg.decode::<Value>().map_err(|e| format!("payload is not JSON: {e}")));
        r.as_ref().map_err(|e| (errno::EPROTO, e.clone()))
    }
}

/// A handler's answer: the response payload, JSON-encoded. From a [`Value`], or directly from a typed
/// `Serialize` value with [`Out::json`] (no intermediate `Value` tree).
struct Out(Vec<u8>);

impl Out {
    fn json(v: &impl serde::Serialize) -> Out {
        Out(crate::message::to_json(v))
    }
}

impl From<Value> for Out {
    fn from(v: Value) -> Out {
        Out::json(&v)
    }
}

/// The `broker.ping` answer.
#[derive(serde::Serialize)]
struct Pong<'a> {
    rank: u32,
    hostname: &'a str,
    pid: u32,
    /// Hops the request crossed (its route stack's depth here).
    route: usize,
}

type Reply = Result<Option<Out>, (u32, String)>;

fn handle(core: &mut Core, msg: &Message, lazy: &Body<'_>) -> Reply {
    let rank = core.rank();
    match msg.topic.as_str() {
        "broker.ping" => {
            Ok(Some(Out::json(&Pong { rank, hostname: &core.opts.hostname, pid: pid(), route: msg.route.len() })))
        }
        "broker.getattr" => {
            let body = lazy.json()?;
            let name = field(body, "name")?.as_str().unwrap_or("");
            attrs(core)
                .remove(name)
                .map(|v| Some(json!({"value": v}).into()))
                .ok_or((errno::ENOENT, format!("no such attribute '{name}'")))
        }
        "broker.lsattr" => Ok(Some(json!({"attrs": attrs(core)}).into())),
        "broker.info" => Ok(Some(info(core).into())),
        "broker.rtt" => {
            let body = lazy.json()?;
            // Overlay round trips timed by this broker: the client's own hop is not in the samples.
            let target =
                field(body, "rank")?.as_u64().and_then(|r| u32::try_from(r).ok()).filter(|r| *r < core.opts.size);
            let target =
                target.ok_or((errno::EINVAL, format!("rank must be below the instance size {}", core.opts.size)))?;
            if target == core.rank() {
                return Err((errno::EINVAL, "a round trip to this broker itself does not cross the overlay".into()));
            }
            let count = body.get("count").and_then(Value::as_u64).unwrap_or(1);
            let size = body.get("size").and_then(Value::as_u64).unwrap_or(0);
            if count == 0 || count > 1_000_000 || size > 1 << 20 {
                return Err((errno::EINVAL, "count must be 1..1000000 and size at most 1 MiB".into()));
            }
            let (count, size) = (count as u32, size as usize);
            let window = body.get("window").and_then(Value::as_u64).unwrap_or(1);
            if window == 0 || window > 1024 {
                return Err((errno::EINVAL, "window must be 1..1024".into()));
            }
            let window = window as u32;
            let run = super::core::RttRun {
                req: msg.clone(),
                target,
                left: count,
                window,
                inflight: 0,
                payload: serde_json::to_vec(&json!({"pad": "x".repeat(size)})).unwrap_or_default(),
                started: std::time::Instant::now(),
                samples_us: Vec::with_capacity(count as usize),
            };
            let id = u64::from(core.next_tag) << 32 | core.rtt_runs.len() as u64;
            core.rtt_runs.insert(id, run);
            core.rtt_next(id);
            Ok(None)
        }
        "detect.watch" => {
            let body = lazy.json()?;
            // Answered once, when the process exits (before its memory is torn down with eBPF).
            let pid = field(body, "pid")?
                .as_u64()
                .and_then(|p| u32::try_from(p).ok())
                .filter(|p| *p > 1)
                .ok_or((errno::EINVAL, "pid must be a process id".into()))?;
            core.detect_watch(msg.clone(), pid).map_err(|e| (errno::ENOSYS, e))?;
            Ok(None)
        }
        "broker.sub" | "broker.unsub" => {
            let body = lazy.json()?;
            let topic = field(body, "topic")?.as_str().unwrap_or("").to_string();
            let Some(&last) = msg.route.last() else { return Err((errno::EPROTO, "not a local client".into())) };
            if last & ROUTE_LOCAL == 0 || msg.route.len() != 1 {
                return Err((errno::EPROTO, "subscriptions are for local clients only".into()));
            }
            if let Some(c) = core.locals.get_mut(&(last & !ROUTE_LOCAL)) {
                if msg.topic == "broker.sub" {
                    c.subs.push(topic);
                } else {
                    c.subs.retain(|s| *s != topic);
                }
            }
            Ok(Some(json!({}).into()))
        }
        "broker.pub" => {
            let body = lazy.json()?;
            if rank != 0 {
                return Err((errno::EPROTO, "events are published on rank 0".into()));
            }
            let topic = field(body, "topic")?.as_str().unwrap_or("").to_string();
            if topic.is_empty() {
                return Err((errno::EINVAL, "topic must be a non-empty string".into()));
            }
            let payload = body.get("payload").cloned().unwrap_or(Value::Null);
            core.publish(&topic, &payload);
            Ok(Some(json!({}).into()))
        }
        "broker.shutdown" => {
            let body = lazy.json()?;
            if rank != 0 {
                return Err((errno::EINVAL, "shutdown is requested from rank 0".into()));
            }
            if msg.userid != core.uid {
                return Err((errno::EPERM, "only the instance owner may shut it down".into()));
            }
            let code = body.get("exit_code").and_then(Value::as_i64).unwrap_or(0) as i32;
            if core.shutting_down.is_none() {
                core.exit_code = code;
            }
            core.begin_shutdown("shutdown requested");
            Ok(Some(json!({}).into()))
        }
        "rexec.notify" => {
            let body = lazy.json()?;
            // A lost-shell notice for the job's leader shell: delivered as a local event `shell.<jobid>.lost`
            // to the shell, which subscribed to `shell.<jobid>`.
            let id = parse_id(body)?;
            let ev = Message::event(&format!("shell.{id}.lost"), body);
            for c in core.locals.values() {
                if c.subs.iter().any(|s| ev.topic.starts_with(s.as_str())) {
                    let _ = c.tx.send(ev.clone());
                }
            }
            Ok(Some(json!({}).into()))
        }
        "rexec.spawn" => spawn_shell(core, msg, lazy.json()?),
        "rexec.kill" => {
            let body = lazy.json()?;
            let id = parse_id(body)?;
            let sig = field(body, "signal")?.as_i64().unwrap_or(libc::SIGTERM as i64) as i32;
            if let Some(&pgid) = core.shells.get(&id) {
                debug!("signal {sig} to shell of job {id} (pgid {pgid})");
                // SAFETY: killpg with a pgid we created (the shell's own group) and a plain signal number.
                unsafe { libc::killpg(pgid, sig) };
                Ok(Some(json!({}).into()))
            } else {
                Err((errno::ENOENT, format!("no shell of job {id} on rank {rank}")))
            }
        }
        t if t.starts_with("resource.") || t.starts_with("overlay.") => resource(core, msg, lazy.json()?),
        t if t.starts_with("job-manager.") || t.starts_with("job-info.") || t.starts_with("job-exec.") => {
            jobs(core, msg, lazy.json()?)
        }
        t => Err((errno::ENOSYS, format!("unknown service method '{t}'"))),
    }
}

fn attrs(core: &Core) -> std::collections::BTreeMap<String, String> {
    let mut a = core.opts.attrs.clone();
    let o = &core.opts;
    a.insert("rank".into(), o.rank.to_string());
    a.insert("size".into(), o.size.to_string());
    a.insert("hostname".into(), o.hostname.clone());
    let m = core.membership.config();
    let ms = |s: f64| format!("{}ms", (s * 1e3).round());
    a.entry("tbon.heartbeat_period".into()).or_insert_with(|| ms(m.heartbeat_period));
    a.entry("tbon.torpid_max".into()).or_insert_with(|| ms(m.torpid_max));
    a.entry("tbon.lost_timeout".into()).or_insert_with(|| ms(m.lost_timeout));
    a.entry("tbon.probe_period".into()).or_insert_with(|| ms(m.probe_period));
    a.entry("tbon.probe_misses".into()).or_insert_with(|| m.probe_misses.to_string());
    a.entry("tbon.probe_group".into()).or_insert_with(|| "auto".into());
    a.entry("broker.detectors".into()).or_insert_with(|| "auto".into());
    a.entry("broker.xdp_mode".into()).or_insert_with(|| "auto".into());
    let rd = vigil_rdma::Config::default();
    a.entry("tbon.rdma_timeout".into()).or_insert_with(|| rd.timeout.to_string());
    a.entry("tbon.rdma_retry_cnt".into()).or_insert_with(|| rd.retry_cnt.to_string());
    a.entry("tbon.rdma_poll".into()).or_insert_with(|| "event".into());
    a.entry("tbon.rdma_max_inline".into()).or_insert_with(|| rd.max_inline.to_string());
    a.entry("tbon.rdma_frame".into()).or_insert_with(|| "packed".into());
    a.insert("tbon.topo".into(), o.topo.to_string());
    if let crate::topology::Topology::Kary(k) = o.topo {
        a.insert("tbon.fanout".into(), k.to_string());
    }
    a.entry("exec.kill-timeout".into()).or_insert_with(|| format!("{}s", crate::jobs::DEFAULT_KILL_TIMEOUT));
    a.insert("log-level".into(), crate::cli::log_level(&o.attrs));
    a.insert("tbon.level".into(), o.topo.level(o.size, o.rank).to_string());
    a.insert("tbon.maxlevel".into(), o.topo.depth(o.size).saturating_sub(1).to_string());
    a.entry("tbon.transport".into()).or_insert_with(|| "auto".into());
    a.insert("tbon.transport-active".into(), core.links.summary());
    a.insert("tbon.endpoint".into(), o.endpoints.get(o.rank as usize).cloned().unwrap_or_default());
    if let Some(p) = o.topo.parent(o.size, o.rank) {
        a.insert("tbon.parent-endpoint".into(), o.endpoints.get(p as usize).cloned().unwrap_or_default());
    }
    a.insert("rundir".into(), o.rundir.display().to_string());
    a.insert("local-uri".into(), core.local_uri.clone());
    a.insert("instance-id".into(), o.instance.clone());
    a.insert("broker.pid".into(), std::process::id().to_string());
    a.insert("broker.starttime".into(), format!("{:.3}", core.started_at));
    a.entry("instance-level".into()).or_insert_with(|| "0".into());
    a.insert("resource.source".into(), core.resources.source.clone());
    a
}

fn info(core: &Core) -> Value {
    let o = &core.opts;
    let state = if core.shutting_down.is_some() {
        "shutdown"
    } else if o.rank == 0 && !core.initial_started {
        "join"
    } else {
        "run"
    };
    json!({
        "rank": o.rank, "size": o.size, "hostname": o.hostname, "state": state,
        "uptime": core.start.elapsed().as_secs_f64(), "topo": o.topo.to_string(),
        "depth": o.topo.depth(o.size), "level": o.topo.level(o.size, o.rank),
        "transport": core.links.summary(), "instance_level": o.attrs.get("instance-level").cloned().unwrap_or_else(|| "0".into()),
        "detectors": detectors(core),
        "resource_source": core.resources.source,
        "security": security(core),
    })
}

/// How this broker's overlay links are secured, and how many unauthenticated connections it refused.
fn security(core: &Core) -> Value {
    json!({"noise": super::secure::NOISE_PARAMS, "refused": core.refusals.lock().map(|r| r.count).unwrap_or(0)})
}

// ------------------------------------------------------------------------------------------- rexec

/// Rank whose process-exit detector watches this machine's tasks (`broker.detector-rank`, else this broker).
fn detector_rank(core: &Core) -> u32 {
    core.opts.attrs.get("broker.detector-rank").and_then(|r| r.parse().ok()).unwrap_or(core.rank())
}

fn shell_path(core: &Core) -> std::path::PathBuf {
    if let Some(p) = core.opts.attrs.get("exec.shell") {
        return p.into();
    }
    if let Ok(p) = std::env::var("VIGIL_SHELL") {
        return p.into();
    }
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join("vigil-shell")))
        .unwrap_or_else(|| "vigil-shell".into())
}

fn spawn_shell(core: &mut Core, _msg: &Message, body: &Value) -> Reply {
    use std::process::Stdio;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let id = parse_id(body)?;
    let mut input = field(body, "input")?.clone();
    if core.shutting_down.is_some() {
        return Err((errno::EAGAIN, "broker is shutting down".into()));
    }
    if core.shells.contains_key(&id) {
        return Err((errno::EEXIST, format!("job {id} already has a shell on rank {}", core.rank())));
    }
    input["uri"] = json!(core.local_uri);
    let shell_rank = input.get("shell_rank").and_then(Value::as_u64).unwrap_or(0);
    // Short names: a nested instance's socket lives below this directory and Unix socket paths are limited
    // to 108 bytes.
    let tmpdir = core.opts.rundir.join(format!("j{id}.{shell_rank}"));
    input["tmpdir"] = json!(tmpdir.display().to_string());
    let path = shell_path(core);
    let mut cmd = tokio::process::Command::new(&path);
    cmd.arg(format!("--jobid={id}"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .process_group(0)
        .env(crate::client::URI_ENV, &core.local_uri)
        .env(crate::shellproto::DETECTOR_RANK_ENV, detector_rank(core).to_string())
        .kill_on_drop(false);
    let mut child = cmd.spawn().map_err(|e| (errno::ENOENT, format!("cannot run {}: {e}", path.display())))?;
    let pid = child.id().unwrap_or(0) as i32;
    core.shells.insert(id, pid);
    let mut stdin = child.stdin.take();
    let mut stdout = child.stdout.take();
    let tx = core.input_tx.clone();
    let data = serde_json::to_vec(&input).unwrap_or_default();
    tokio::spawn(async move {
        if let Some(mut s) = stdin.take() {
            let _ = s.write_all(&data).await;
            let _ = s.shutdown().await;
        }
        let mut out = String::new();
        if let Some(s) = stdout.as_mut() {
            let _ = s.read_to_string(&mut out).await;
        }
        let status = match child.wait().await {
            Ok(st) => {
                use std::os::unix::process::ExitStatusExt;
                st.into_raw()
            }
            Err(_) => 0x7f00,
        };
        let report = out.lines().rev().find_map(|l| serde_json::from_str::<ShellReport>(l).ok());
        // Whatever the job left in the background dies with it (the shell's process group), and the shell's
        // job tmpdir goes too if the shell was killed before removing it.
        // SAFETY: killpg on the process group the shell led; no memory is touched.
        unsafe { libc::killpg(pid, libc::SIGKILL) };
        let _ = std::fs::remove_dir_all(&tmpdir);
        let _ = tx.send(super::core::Input::ShellDone { id, report, status });
    });
    Ok(Some(json!({"pid": pid}).into()))
}

// ------------------------------------------------------------------------------------------- resource

fn resource(core: &mut Core, msg: &Message, body: &Value) -> Reply {
    let n = now();
    let size = core.opts.size;
    let topo = core.opts.topo;
    match msg.topic.as_str() {
        "resource.register" => {
            let rank = field(body, "rank")?.as_u64().ok_or((errno::EPROTO, "bad rank".into()))? as u32;
            if rank >= size {
                return Err((errno::EPROTO, format!("rank {rank} out of range")));
            }
            let hostname = body.get("hostname").and_then(Value::as_str).unwrap_or("").to_string();
            let res: NodeResources = serde_json::from_value(field(body, "resources")?.clone())
                .map_err(|e| (errno::EPROTO, e.to_string()))?;
            let topology = body.get("topology").and_then(Value::as_str).unwrap_or("live").to_string();
            let dg = body.get("declared_gpus").and_then(Value::as_u64).map(|g| g as u32);
            let ids = |k: &str, n: u32| -> Result<IdSet, (u32, String)> {
                match body.get(k).and_then(Value::as_str) {
                    Some(s) => IdSet::parse(s).map_err(|e| (errno::EPROTO, format!("{k}: {e}"))),
                    None => Ok((0..n).collect()),
                }
            };
            let cores = ids("cores", res.cores)?;
            let gpus = ids("gpus", res.gpus)?;
            core.members.insert(rank, (MemberState::Online, String::new(), n));
            if let Some(jc) = core.jobcore.as_mut() {
                jc.rank_online(n, rank, &hostname, cores, gpus, (topology, dg));
            }
            debug!("rank {rank} ({hostname}) joined with cores {} and GPUs {}", body["cores"], body["gpus"]);
            Ok(Some(json!({}).into()))
        }
        "overlay.torpid" | "overlay.lively" => {
            let reported = parse_ranks(body)?;
            let reason = body.get("reason").and_then(Value::as_str).unwrap_or("").to_string();
            let torpid = msg.topic == "overlay.torpid";
            // A torpid router forwards nothing: the ranks below it are unreachable too, so they get no new work
            // either (and come back with it, unless they were torpid on their own account).
            const BEHIND: &str = "unreachable behind torpid router rank";
            let mut ranks = reported.clone();
            // Rank below a reported router → that router.
            let mut behind = std::collections::BTreeMap::<u32, u32>::new();
            for r in reported.iter() {
                for d in core.opts.topo.subtree(core.opts.size, r).into_iter().filter(|d| *d != r) {
                    let m = core.members.get(&d);
                    let ok = if torpid {
                        m.is_some_and(|m| m.0 == MemberState::Online)
                    } else {
                        m.is_some_and(|m| m.0 == MemberState::Torpid && m.1.starts_with(BEHIND))
                    };
                    if ok {
                        ranks.insert(d);
                        behind.entry(d).or_insert(r);
                    }
                }
            }
            for r in ranks.iter() {
                if core.members.get(&r).is_some_and(|m| m.0 == MemberState::Online || m.0 == MemberState::Torpid) {
                    let why = match (torpid, reported.contains(r), behind.get(&r)) {
                        (false, _, _) => String::new(),
                        (true, false, Some(via)) => format!("{BEHIND} {via}"),
                        (true, _, _) => reason.clone(),
                    };
                    core.members.insert(r, (if torpid { MemberState::Torpid } else { MemberState::Online }, why, n));
                }
            }
            if let Some(jc) = core.jobcore.as_mut() {
                jc.ranks_torpid(n, &ranks, torpid);
            }
            Ok(Some(json!({}).into()))
        }
        "overlay.lost" | "overlay.offline" => {
            let ranks = parse_ranks(body)?;
            let reason = body.get("reason").and_then(Value::as_str).unwrap_or("").to_string();
            let state = if msg.topic == "overlay.lost" { MemberState::Lost } else { MemberState::Offline };
            warn!("ranks {ranks} {}: {reason}", if state == MemberState::Lost { "lost" } else { "offline" });
            // The root of a lost subtree has the reason; the ranks behind it are cut off by its loss.
            let root = body.get("root").and_then(Value::as_u64).map(|r| r as u32).filter(|r| ranks.contains(*r));
            for r in ranks.iter() {
                let why = match root {
                    Some(root) if r != root && state == MemberState::Lost => {
                        format!("cut off: rank {root} above it was lost ({reason})")
                    }
                    _ => reason.clone(),
                };
                core.members.insert(r, (state.clone(), why, n));
            }
            if let Some(jc) = core.jobcore.as_mut() {
                jc.ranks_down(n, &ranks, if state == MemberState::Lost { "lost" } else { "offline" }, &reason);
            }
            core.publish(&msg.topic.clone(), &json!({"ranks": ranks.to_string(), "reason": reason}));
            Ok(Some(json!({}).into()))
        }
        "overlay.status" => {
            let jc = core.jobcore.as_ref().ok_or((errno::ENOSYS, "not rank 0".into()))?;
            let ranks: Vec<Value> = (0..size)
                .map(|r| {
                    let (state, why, since) =
                        core.members.get(&r).cloned().unwrap_or((MemberState::Offline, String::new(), 0.0));
                    let host = jc.pool.ranks.get(&r).map(|p| p.hostname.clone()).unwrap_or_default();
                    json!({"rank": r, "hostname": host, "state": state, "reason": why, "since": since,
                           "parent": topo.parent(size, r), "children": topo.children(size, r),
                           "link": core.links.of_rank(r)})
                })
                .collect();
            Ok(Some(
                json!({"size": size, "topo": topo.to_string(), "depth": topo.depth(size),
                "critical_ranks": IdSet::from_iter(topo.critical_ranks(size)).to_string(),
                "transport": core.links.summary(), "detectors": detectors(core), "security": security(core),
                "ranks": ranks})
                .into(),
            ))
        }
        "overlay.transport" => {
            // A child's report of its parent link (rdma_link).
            core.links.on_report(body).map_err(|e| (errno::EPROTO, e))?;
            Ok(Some(json!({}).into()))
        }
        "resource.status" => {
            let jc = core.jobcore.as_ref().ok_or((errno::ENOSYS, "not rank 0".into()))?;
            let mut rows = Vec::new();
            for r in 0..size {
                let p = jc.pool.ranks.get(&r);
                // Whether the rank's broker is there, apart from the admin's drain: "lost", "down" or "online".
                let liveness = match p {
                    Some(p) if p.up => ("online", String::new()),
                    _ => match core.members.get(&r) {
                        Some(m) if m.0 == MemberState::Lost => ("lost", m.1.clone()),
                        Some(m) => ("down", m.1.clone()),
                        None => ("down", "never joined".to_string()),
                    },
                };
                let (state, reason, at) = match p {
                    None => ("down", "never joined".to_string(), None),
                    Some(p) if p.drained.is_some() => ("drained", p.drained.clone().unwrap_or_default(), p.drained_at),
                    Some(p) if !p.up => {
                        let m = core.members.get(&r).cloned();
                        let st = if m.as_ref().is_some_and(|m| m.0 == MemberState::Lost) { "lost" } else { "down" };
                        (st, m.as_ref().map(|m| m.1.clone()).unwrap_or_default(), m.map(|m| m.2))
                    }
                    Some(p) if p.torpid => (
                        "torpid",
                        core.members.get(&r).map(|m| m.1.clone()).unwrap_or_default(),
                        core.members.get(&r).map(|m| m.2),
                    ),
                    Some(_) => ("avail", String::new(), None),
                };
                rows.push(
                    json!({"rank": r, "hostname": p.map(|p| p.hostname.clone()).unwrap_or_default(), "state": state,
                    "reason": reason, "since": at, "up": p.is_some_and(|p| p.up),
                    "liveness": liveness.0, "liveness_reason": liveness.1}),
                );
            }
            Ok(Some(json!({"ranks": rows}).into()))
        }
        "resource.list" => {
            let jc = core.jobcore.as_ref().ok_or((errno::ENOSYS, "not rank 0".into()))?;
            let rows: Vec<Value> = jc.pool.ranks.values().map(|p| json!({
                "rank": p.rank, "hostname": p.hostname, "up": p.up, "drained": p.drained.is_some(), "torpid": p.torpid,
                "cores": p.cores.to_string(), "gpus": p.gpus.to_string(),
                "alloc_cores": p.alloc_cores.to_string(), "alloc_gpus": p.alloc_gpus.to_string(),
                "ncores": p.cores.len(), "ngpus": p.gpus.len(), "nalloc_cores": p.alloc_cores.len(), "nalloc_gpus": p.alloc_gpus.len(),
            })).collect();
            Ok(Some(json!({"ranks": rows}).into()))
        }
        "resource.drain" | "resource.undrain" => {
            if msg.userid != core.uid {
                return Err((errno::EPERM, "only the instance owner may drain or undrain".into()));
            }
            let ranks = parse_ranks(body)?;
            let jc = core.jobcore.as_mut().ok_or((errno::ENOSYS, "not rank 0".into()))?;
            let r = if msg.topic == "resource.drain" {
                let reason = body.get("reason").and_then(Value::as_str).unwrap_or("");
                jc.drain(n, &ranks, reason)
            } else {
                jc.undrain(n, &ranks)
            };
            r.map(|_| Some(json!({}).into())).map_err(|e| (errno::EINVAL, e))
        }
        "resource.eventlog" => {
            let jc = core.jobcore.as_ref().ok_or((errno::ENOSYS, "not rank 0".into()))?;
            Ok(Some(json!({"eventlog": jc.resource_eventlog}).into()))
        }
        "resource.R" => {
            let jc = core.jobcore.as_ref().ok_or((errno::ENOSYS, "not rank 0".into()))?;
            let ranks: Vec<crate::r::RankResources> = jc
                .pool
                .ranks
                .values()
                .map(|p| crate::r::RankResources {
                    rank: p.rank,
                    hostname: p.hostname.clone(),
                    cores: p.cores.clone(),
                    gpus: p.gpus.clone(),
                })
                .collect();
            Ok(Some(Out::json(&crate::r::Rv1::from_ranks(&ranks, core.started_at, 0.0))))
        }
        t => Err((errno::ENOSYS, format!("unknown service method '{t}'"))),
    }
}

// ------------------------------------------------------------------------------------------- jobs

fn jobs(core: &mut Core, msg: &Message, body: &Value) -> Reply {
    let n = now();
    let owner = msg.userid == core.uid;
    let Some(jc) = core.jobcore.as_mut() else { return Err((errno::ENOSYS, "job services run on rank 0".into())) };
    match msg.topic.as_str() {
        "job-manager.submit" => {
            let spec = field(body, "jobspec")?;
            match jc.submit(n, spec, msg.userid) {
                Ok(id) => {
                    if body.get("stdin").and_then(Value::as_bool) == Some(true) {
                        // `vigil run` streams its standard input to the tasks (job-exec.stdin).
                        if let Some(j) = jc.jobs.get_mut(&id) {
                            j.stdin_eof = false;
                        }
                    }
                    info!("job {id} submitted");
                    Ok(Some(json!({"id": id.0, "id_f58": id.f58()}).into()))
                }
                Err(e) => Err((errno::EINVAL, e.to_string())),
            }
        }
        "job-manager.list" => {
            let all = body.get("all").and_then(Value::as_bool).unwrap_or(false);
            let with_reason = |j: &crate::jobs::Job| {
                let mut v = j.info();
                if let Some(r) = jc.pending_reason(j.id) {
                    v["reason_pending"] = Value::String(r);
                }
                v
            };
            let jobs: Vec<Value> =
                jc.jobs.values().rev().filter(|j| all || j.state.is_active()).map(with_reason).collect();
            Ok(Some(json!({"jobs": jobs}).into()))
        }
        "job-manager.info" => {
            let id = parse_id(body)?;
            let j = jc.jobs.get(&id).ok_or((errno::ENOENT, format!("unknown job id {id}")))?;
            let mut info = j.info();
            if let Some(r) = jc.pending_reason(id) {
                info["reason_pending"] = Value::String(r);
            }
            Ok(Some(json!({"info": info, "jobspec": j.jobspec, "R": j.r}).into()))
        }
        "job-manager.cancel" => {
            let id = parse_id(body)?;
            let note = body.get("note").and_then(Value::as_str).unwrap_or("canceled by user").to_string();
            jc.cancel(n, id, msg.userid, owner, &note).map(|_| Some(json!({}).into()))
        }
        "job-manager.raise" => {
            let id = parse_id(body)?;
            let kind = body.get("type").and_then(Value::as_str).unwrap_or("exec").to_string();
            let sev = body.get("severity").and_then(Value::as_u64).unwrap_or(0).min(7) as u32;
            let note = body.get("note").and_then(Value::as_str).unwrap_or("").to_string();
            if !owner && jc.jobs.get(&id).is_some_and(|j| j.userid != msg.userid) {
                return Err((errno::EPERM, "not your job".into()));
            }
            if jc.raise(n, id, &kind, sev, &note) {
                Ok(Some(json!({}).into()))
            } else {
                Err((errno::ENOENT, format!("job {id} is not active")))
            }
        }
        "job-info.attach" | "job-manager.eventlog" => {
            let id = parse_id(body)?;
            if !jc.jobs.contains_key(&id) {
                return Err((errno::ENOENT, format!("unknown job id {id}")));
            }
            let is_attach = msg.topic == "job-info.attach";
            let follow = body.get("follow").and_then(Value::as_bool).unwrap_or(is_attach);
            let w = Watcher {
                req: msg.clone(),
                id,
                ev_pos: 0,
                out_pos: 0,
                eventlog: body.get("eventlog").and_then(Value::as_bool).unwrap_or(true),
                output: is_attach && body.get("output").and_then(Value::as_bool).unwrap_or(true),
                stdin: false,
                in_pos: 0,
                follow: follow && msg.flags & FLAG_STREAMING != 0,
            };
            if let Some(&last) = msg.route.first() {
                if last & ROUTE_LOCAL != 0 && msg.route.len() == 1 {
                    if let Some(c) = core.locals.get_mut(&(last & !ROUTE_LOCAL)) {
                        c.streaming = true;
                    }
                }
            }
            // Mark remote clients' brokers too: they set `streaming` when forwarding (see core::on_closed).
            core.watchers.push(w);
            wake_watchers(core, id);
            Ok(None)
        }
        "job-exec.stdin" => {
            let id = parse_id(body)?;
            if !owner && jc.jobs.get(&id).is_some_and(|j| j.userid != msg.userid) {
                return Err((errno::EPERM, "not your job".into()));
            }
            let data = body.get("data").and_then(Value::as_str).map(str::to_string);
            let eof = body.get("eof").and_then(Value::as_bool).unwrap_or(false);
            jc.stdin(id, data, eof).map_err(|e| (errno::EINVAL, e))?;
            Ok(Some(json!({}).into()))
        }
        "job-info.stdin" => {
            // A job shell reads the job's standard input: every chunk so far, then new ones, ENODATA at the end.
            let id = parse_id(body)?;
            if !jc.jobs.contains_key(&id) {
                return Err((errno::ENOENT, format!("unknown job id {id}")));
            }
            core.watchers.push(Watcher {
                req: msg.clone(),
                id,
                ev_pos: 0,
                out_pos: 0,
                in_pos: 0,
                eventlog: false,
                output: false,
                stdin: true,
                follow: msg.flags & FLAG_STREAMING != 0,
            });
            wake_watchers(core, id);
            Ok(None)
        }
        "job-info.disconnect" => {
            let route = msg.route.clone();
            core.watchers.retain(|w| w.req.route != route);
            Ok(None)
        }
        "job-exec.output" => {
            let id = parse_id(body)?;
            let lines: Vec<OutputLine> =
                serde_json::from_value(field(body, "lines")?.clone()).map_err(|e| (errno::EPROTO, e.to_string()))?;
            jc.output(id, lines);
            Ok(Some(json!({}).into()))
        }
        "job-exec.task-exit" => {
            let id = parse_id(body)?;
            let task = body.get("rank").and_then(Value::as_u64).unwrap_or(0) as u32;
            let status = body.get("status").and_then(Value::as_i64).unwrap_or(0) as i32;
            jc.task_exit(n, id, task, status);
            Ok(Some(json!({}).into()))
        }
        "job-exec.exception" => {
            let id = parse_id(body)?;
            let kind = body.get("type").and_then(Value::as_str).unwrap_or("exec").to_string();
            let sev = body.get("severity").and_then(Value::as_u64).unwrap_or(0).min(7) as u32;
            let note = body.get("note").and_then(Value::as_str).unwrap_or("").to_string();
            if sev == 0 && jc.jobs.get(&id).is_some_and(|j| j.fatal.is_some()) {
                // Already going down: later shell reports are consequences of the first cause.
                debug!("job {id}: not posting follow-up exception: {note}");
            } else if jc.raise(n, id, &kind, sev, &note) && sev == 0 {
                let rank = body.get("rank").and_then(Value::as_u64).map(|r| r as u32);
                if let Some(j) = jc.jobs.get_mut(&id) {
                    j.fatal_shell = rank;
                }
            }
            Ok(Some(json!({}).into()))
        }
        "job-exec.nested" => {
            // A nested instance (batch/alloc job) reports its URI and its critical ranks (its own numbering,
            // which follows the order of the job's allocated ranks).
            let id = parse_id(body)?;
            let job = jc.jobs.get_mut(&id).ok_or((errno::ENOENT, format!("unknown job id {id}")))?;
            let uri = field(body, "uri")?.as_str().unwrap_or("").to_string();
            let crit = IdSet::parse(body.get("critical_ranks").and_then(Value::as_str).unwrap_or("0"))
                .map_err(|e| (errno::EPROTO, e.to_string()))?;
            let ranks: Vec<u32> = job.alloc.iter().map(|a| a.rank).collect();
            let parent_crit: IdSet = crit.iter().filter_map(|c| ranks.get(c as usize).copied()).collect();
            let size = body.get("size").and_then(Value::as_u64).unwrap_or(0);
            let memo = json!({"uri": uri, "size": size, "critical_ranks": crit.to_string(), "critical_broker_ranks": parent_crit.to_string()});
            job.instance = Some(memo.clone());
            jc.memo(n, id, memo);
            info!("job {id} is an instance of {size} brokers at {uri}; critical ranks {parent_crit}");
            Ok(Some(json!({}).into()))
        }
        "job-exec.pmi-barrier" => {
            // One exchange per barrier per shell: hold each shell's request until all of the job's shells have
            // arrived, then answer all of them with the union of their puts.
            let id = parse_id(body)?;
            let job = jc
                .jobs
                .get_mut(&id)
                .filter(|j| j.state == JobState::Run)
                .ok_or((errno::ENOENT, format!("job {id} is not running")))?;
            job.pmi_exchanges += 1;
            let nshells = job.shells.len();
            let kvs = body.get("kvs").and_then(Value::as_object).cloned().unwrap_or_default();
            let b = core.pmi_barriers.entry(id).or_default();
            b.0.push(msg.clone());
            b.1.extend(kvs);
            if b.0.len() >= nshells {
                let (reqs, all) = core.pmi_barriers.remove(&id).unwrap_or_default();
                let payload = json!({"kvs": all});
                for r in reqs {
                    core.respond(&r, &payload);
                }
            }
            Ok(None)
        }
        "job-exec.shell-exit" => {
            let exit: ShellExit = serde_json::from_value(body.clone()).map_err(|e| (errno::EPROTO, e.to_string()))?;
            jc.shell_exit(n, exit);
            Ok(Some(json!({}).into()))
        }
        t => Err((errno::ENOSYS, format!("unknown service method '{t}'"))),
    }
}

/// Send new eventlog entries and output lines to the watchers of job `id`; end finished streams with ENODATA.
pub(crate) fn wake_watchers(core: &mut Core, id: JobId) {
    let Some(jc) = core.jobcore.as_ref() else { return };
    let Some(job) = jc.jobs.get(&id) else { return };
    let inactive = job.state == JobState::Inactive;
    let mut out: Vec<Message> = Vec::new();
    let mut done = Vec::new();
    for (i, w) in core.watchers.iter_mut().enumerate().filter(|(_, w)| w.id == id) {
        if w.eventlog {
            for e in &job.eventlog[w.ev_pos..] {
                out.push(Message::response_to(&w.req, &json!({"event": e})));
            }
            w.ev_pos = job.eventlog.len();
        }
        if w.output {
            if w.out_pos < job.output_base {
                let missed = job.output_base - w.out_pos;
                let note = crate::shellproto::OutputLine::text(
                    0,
                    "stderr",
                    format!(
                        "vigil: {missed} output chunk(s) dropped: over the {} MiB kept per job (use --output FILE)",
                        crate::jobs::OUTPUT_KEEP >> 20
                    ),
                );
                out.push(Message::response_to(&w.req, &json!({"output": note})));
                w.out_pos = job.output_base;
            }
            for l in job.output.iter().skip(w.out_pos - job.output_base) {
                out.push(Message::response_to(&w.req, &json!({"output": l})));
            }
            w.out_pos = job.output_base + job.output.len();
        }
        if w.stdin {
            for d in &job.stdin[w.in_pos..] {
                out.push(Message::response_to(&w.req, &json!({"data": d})));
            }
            w.in_pos = job.stdin.len();
            if job.stdin_eof || inactive || !w.follow {
                out.push(Message::error_to(&w.req, errno::ENODATA, ""));
                done.push(i);
            }
            continue;
        }
        if inactive || !w.follow {
            out.push(Message::error_to(&w.req, errno::ENODATA, ""));
            done.push(i);
        }
    }
    for i in done.into_iter().rev() {
        core.watchers.remove(i);
    }
    if inactive {
        core.pmi_barriers.remove(&id);
    }
    for m in out {
        core.route_response(m);
    }
    let _ = Internal::Ignore;
}
