//! Request handlers of the broker's services (dispatch by topic).

use super::core::{Broker, Effect, Internal, MemberState, Watcher};
use crate::idset::IdSet;
use crate::jobs::{Batch, JobId, JobState};
use crate::message::{errno, Message, FLAG_STREAMING, ROUTE_LOCAL};
use crate::shellproto::{OutputLine, ShellExit, ShellInput};
use serde::Deserialize;
use serde_json::{json, Value};
use tracing::{debug, info, warn};
use vigil_proto::node::NodeResources;

/// Which failure detectors this broker runs, as `{process_exit, tcp, responder, probes}` (detect.rs), and on a
/// parent `probing` (children by group datagram / unicast, where replies are read).
fn detectors(core: &Broker) -> Value {
    let mut d = core.status.detectors.clone();
    if let Value::Object(m) = &mut d {
        // The judge's own lateness and its confirmations of suspects (confirm.rs).
        let j = core.confirm.status();
        m.insert("judge".into(), j["state"].clone());
        m.insert(
            "suspicions".into(),
            json!({"cleared": j["suspicions_cleared"], "confirmed": j["suspicions_confirmed"]}),
        );
    }
    d
}

/// Event subscriptions (`broker.sub` topic prefixes) one local client may hold; past it `broker.sub` is answered
/// ENOSPC.
pub const MAX_SUBS_PER_CLIENT: usize = 256;
/// Longest `broker.sub` topic prefix, in bytes (an event's topic is at most 65535 bytes on the wire; those that
/// clients subscribe to are tens of bytes). A longer one is refused with EINVAL.
pub const MAX_SUB_TOPIC: usize = 1024;
/// Requests that wait that one client (one route: a local connection, or a client of another broker) may hold
/// open at once on a broker: job watchers (`job-manager.eventlog`, `job-info.attach`, `job-info.stdin`) and
/// process-exit watches (`detect.watch`), each. Past it the request is answered ENOSPC and nothing is held.
pub const MAX_WAITING_PER_CLIENT: usize = 1024;
/// `broker.rtt` runs in progress at once: per client, and on a broker (each holds a payload of up to 1 MiB and its
/// samples). Past either the request is answered EAGAIN.
pub const MAX_RTT_RUNS_PER_CLIENT: usize = 2;
pub const MAX_RTT_RUNS: usize = 16;

/// ENOSPC if the client of `msg` already holds [`MAX_WAITING_PER_CLIENT`] requests of kind `what`, of which it
/// holds `held`.
fn check_waiting(held: usize, what: &str) -> Result<(), (u32, String)> {
    if held >= MAX_WAITING_PER_CLIENT {
        return Err((
            errno::ENOSPC,
            format!("this client already holds {held} {what}, the most one may (close some, or reconnect)"),
        ));
    }
    Ok(())
}

/// Services offered by every broker.
const EVERY_RANK: &[&str] = &["broker", "rexec", "detect"];
/// Services offered by rank 0 only.
const RANK0: &[&str] = &["job-manager", "job-info", "job-exec", "resource", "overlay"];

/// True if a broker of `rank` offers `service`.
pub fn offers(rank: u32, service: &str) -> bool {
    EVERY_RANK.contains(&service) || (rank == 0 && RANK0.contains(&service))
}

// Reading a request's fields. A payload comes from a peer or a client and is trusted in nothing: every handler
// that reads one takes it through `Body::object` and these helpers, which answer EPROTO naming the field (missing,
// or of the wrong JSON type) instead of falling back to a default or panicking. An optional field may be absent
// or `null`; present, it must have its type.

fn field<'a>(v: &'a Value, name: &str) -> Result<&'a Value, (u32, String)> {
    v.get(name).ok_or((errno::EPROTO, format!("missing '{name}' in request")))
}

/// What a JSON value is, for error messages ("an array").
fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The EPROTO answer for field `name` that is not `want` ("a string", "an integer 0..=4294967295").
fn wrong_type(name: &str, want: &str, got: &Value) -> (u32, String) {
    (errno::EPROTO, format!("'{name}' must be {want}, got {}", json_kind(got)))
}

/// Optional field `name`: `None` when absent or `null`.
fn optional<'a>(v: &'a Value, name: &str) -> Option<&'a Value> {
    v.get(name).filter(|f| !f.is_null())
}

/// Required string field `name`.
fn str_field<'a>(v: &'a Value, name: &str) -> Result<&'a str, (u32, String)> {
    let f = field(v, name)?;
    f.as_str().ok_or_else(|| wrong_type(name, "a string", f))
}

/// Optional string field `name`.
fn opt_str<'a>(v: &'a Value, name: &str) -> Result<Option<&'a str>, (u32, String)> {
    optional(v, name).map(|f| f.as_str().ok_or_else(|| wrong_type(name, "a string", f))).transpose()
}

/// Optional boolean field `name`.
fn opt_bool(v: &Value, name: &str) -> Result<Option<bool>, (u32, String)> {
    optional(v, name).map(|f| f.as_bool().ok_or_else(|| wrong_type(name, "a boolean", f))).transpose()
}

/// Optional non-negative integer field `name`.
fn opt_u64(v: &Value, name: &str) -> Result<Option<u64>, (u32, String)> {
    optional(v, name).map(|f| f.as_u64().ok_or_else(|| wrong_type(name, "a non-negative integer", f))).transpose()
}

/// Field `name`'s value `f` as a `u32` (a rank, a count): an integer in `0..=4294967295`, never truncated.
fn as_u32(f: &Value, name: &str) -> Result<u32, (u32, String)> {
    f.as_u64().and_then(|n| u32::try_from(n).ok()).ok_or_else(|| wrong_type(name, "an integer 0..=4294967295", f))
}

/// Required `u32` field `name`.
fn u32_field(v: &Value, name: &str) -> Result<u32, (u32, String)> {
    as_u32(field(v, name)?, name)
}

/// Optional `u32` field `name`.
fn opt_u32(v: &Value, name: &str) -> Result<Option<u32>, (u32, String)> {
    optional(v, name).map(|f| as_u32(f, name)).transpose()
}

/// Optional field `name` holding an `i32` (a wait status, an exit code, a signal number).
fn opt_i32(v: &Value, name: &str) -> Result<Option<i32>, (u32, String)> {
    optional(v, name)
        .map(|f| {
            f.as_i64()
                .and_then(|n| i32::try_from(n).ok())
                .ok_or_else(|| wrong_type(name, "an integer that fits in 32 bits", f))
        })
        .transpose()
}

/// Optional exception severity (RFC 21: 0 is fatal, 1..=7 informational); 0 when absent.
fn opt_severity(v: &Value) -> Result<u32, (u32, String)> {
    match opt_u64(v, "severity")? {
        None => Ok(0),
        Some(s) if s <= 7 => Ok(s as u32),
        Some(s) => Err((errno::EINVAL, format!("'severity' must be 0..=7 (RFC 21), got {s}"))),
    }
}

fn parse_id(v: &Value) -> Result<JobId, (u32, String)> {
    match field(v, "id")? {
        Value::Number(n) => n.as_u64().map(JobId).ok_or((errno::EPROTO, "bad job id".into())),
        Value::String(s) => JobId::parse(s).map_err(|e| (errno::EINVAL, e.to_string())),
        other => Err(wrong_type("id", "a job id (an integer or an f58 string)", other)),
    }
}

fn parse_ranks(v: &Value) -> Result<IdSet, (u32, String)> {
    let s = field(v, "ranks")?.as_str().ok_or((errno::EPROTO, "ranks must be an idset string".into()))?;
    IdSet::parse(s).map_err(|e| (errno::EINVAL, format!("invalid ranks '{s}': {e}")))
}

/// [`parse_ranks`] for ranks of this instance: every one below `size` (EINVAL names those that are not).
fn parse_instance_ranks(v: &Value, size: u32) -> Result<IdSet, (u32, String)> {
    let ranks = parse_ranks(v)?;
    match ranks.last() {
        Some(last) if last >= size => {
            let bad: IdSet = ranks.iter().filter(|r| *r >= size).collect();
            let mut shown = bad.to_string();
            if shown.len() > 64 {
                shown.truncate(64);
                shown.push_str("...");
            }
            Err((errno::EINVAL, format!("ranks {shown} are not in this instance of size {size}")))
        }
        _ => Ok(ranks),
    }
}

/// Handle a request addressed to this broker.
pub fn dispatch(core: &mut Broker, msg: Message) {
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

    /// The payload as a JSON object (every service request that carries fields is one), or `EPROTO` saying
    /// what it is instead (not JSON, empty, an array...).
    fn object(&self) -> Result<&Value, (u32, String)> {
        let v = self.json()?;
        if v.is_object() {
            Ok(v)
        } else {
            Err((errno::EPROTO, format!("payload must be a JSON object, got {}", json_kind(v))))
        }
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

fn handle(core: &mut Broker, msg: &Message, lazy: &Body<'_>) -> Reply {
    let rank = core.rank();
    match msg.topic.as_str() {
        "broker.ping" => Ok(Some(Out::json(&Pong {
            rank,
            hostname: &core.opts.hostname,
            pid: core.env.pid,
            route: msg.route.len(),
        }))),
        "broker.getattr" => {
            let body = lazy.object()?;
            let name = str_field(body, "name")?;
            match attrs(core).remove(name) {
                Some(Some(v)) => Ok(Some(json!({"value": v}).into())),
                Some(None) => Err((errno::ENOENT, format!("attribute '{name}' is not set"))),
                None => Err((errno::ENOENT, format!("no such attribute '{name}' (see `vigil lsattr`)"))),
            }
        }
        "broker.lsattr" => Ok(Some(json!({"attrs": attrs(core)}).into())),
        "broker.info" => Ok(Some(info(core).into())),
        "broker.rtt" => {
            let body = lazy.object()?;
            // Overlay round trips timed by this broker: the client's own hop is not in the samples.
            let target = field(body, "rank")?;
            let target = target
                .as_u64()
                .ok_or_else(|| wrong_type("rank", "a rank (a non-negative integer)", target))?
                .try_into()
                .ok()
                .filter(|r| *r < core.opts.size)
                .ok_or((errno::EINVAL, format!("rank must be below the instance size {}", core.opts.size)))?;
            if target == core.rank() {
                return Err((errno::EINVAL, "a round trip to this broker itself does not cross the overlay".into()));
            }
            let count = opt_u64(body, "count")?.unwrap_or(1);
            let size = opt_u64(body, "size")?.unwrap_or(0);
            if count == 0 || count > 1_000_000 || size > 1 << 20 {
                return Err((errno::EINVAL, "count must be 1..1000000 and size at most 1 MiB".into()));
            }
            let (count, size) = (count as u32, size as usize);
            let window = opt_u64(body, "window")?.unwrap_or(1);
            if window == 0 || window > 1024 {
                return Err((errno::EINVAL, "window must be 1..1024".into()));
            }
            let window = window as u32;
            let mine = core.rtt_runs.values().filter(|r| r.req.route == msg.route).count();
            if mine >= MAX_RTT_RUNS_PER_CLIENT || core.rtt_runs.len() >= MAX_RTT_RUNS {
                return Err((
                    errno::EAGAIN,
                    format!(
                        "{} round-trip runs in progress here ({mine} of them this client's; at most \
                         {MAX_RTT_RUNS_PER_CLIENT} per client and {MAX_RTT_RUNS} in all): try again when they end",
                        core.rtt_runs.len()
                    ),
                ));
            }
            let run = super::core::RttRun {
                req: msg.clone(),
                target,
                left: count,
                window,
                inflight: 0,
                payload: serde_json::to_vec(&json!({"pad": "x".repeat(size)})).unwrap_or_default(),
                started: core.now,
                samples_us: Vec::with_capacity((count as usize).min(1 << 16)),
            };
            let id = u64::from(core.next_tag) << 32 | core.rtt_runs.len() as u64;
            core.rtt_runs.insert(id, run);
            core.rtt_next(id);
            Ok(None)
        }
        "detect.watch" => {
            let body = lazy.object()?;
            // Answered once, when the process exits (before its memory is torn down with eBPF).
            let pid = field(body, "pid")?
                .as_u64()
                .and_then(|p| u32::try_from(p).ok())
                .filter(|p| *p > 1)
                .ok_or((errno::EINVAL, "pid must be a process id".into()))?;
            let held = core.exit_waiters.values().flatten().filter(|m| m.route == msg.route).count();
            check_waiting(held, "process-exit watches")?;
            // Everyone waiting for the same process hears of its exit.
            let fresh = !core.exit_waiters.contains_key(&pid);
            core.exit_waiters.entry(pid).or_default().push(msg.clone());
            if fresh {
                core.effect(Effect::WatchPid(pid));
            }
            Ok(None)
        }
        "broker.sub" | "broker.unsub" => {
            let body = lazy.object()?;
            let topic = str_field(body, "topic")?.to_string();
            let Some(&last) = msg.route.last() else { return Err((errno::EPROTO, "not a local client".into())) };
            if last & ROUTE_LOCAL == 0 || msg.route.len() != 1 {
                return Err((errno::EPROTO, "subscriptions are for local clients only".into()));
            }
            if let Some(c) = core.locals.get_mut(&(last & !ROUTE_LOCAL)) {
                if msg.topic == "broker.unsub" {
                    c.subs.remove(&topic);
                } else if !c.subs.contains(&topic) {
                    // A set: subscribing again to a prefix is a no-op. Bounded in count and length, so what one
                    // client holds here is at most MAX_SUBS_PER_CLIENT * MAX_SUB_TOPIC bytes.
                    if topic.len() > MAX_SUB_TOPIC {
                        return Err((
                            errno::EINVAL,
                            format!(
                                "'topic' is {} bytes, more than the {MAX_SUB_TOPIC} a prefix may have",
                                topic.len()
                            ),
                        ));
                    }
                    if c.subs.len() >= MAX_SUBS_PER_CLIENT {
                        return Err((
                            errno::ENOSPC,
                            format!(
                                "this client already holds {MAX_SUBS_PER_CLIENT} subscriptions, the most one may \
                                 (unsubscribe from some, or subscribe to a shorter prefix that covers them)"
                            ),
                        ));
                    }
                    c.subs.insert(topic);
                }
            }
            Ok(Some(json!({}).into()))
        }
        "broker.pub" => {
            let body = lazy.object()?;
            if rank != 0 {
                return Err((errno::EPROTO, "events are published on rank 0".into()));
            }
            let topic = str_field(body, "topic")?.to_string();
            if topic.is_empty() {
                return Err((errno::EINVAL, "topic must be a non-empty string".into()));
            }
            let payload = body.get("payload").cloned().unwrap_or(Value::Null);
            core.publish(&topic, &payload);
            Ok(Some(json!({}).into()))
        }
        "broker.shutdown" => {
            let body = lazy.object()?;
            if rank != 0 {
                return Err((errno::EINVAL, "shutdown is requested from rank 0".into()));
            }
            if msg.userid != core.env.uid {
                return Err((errno::EPERM, "only the instance owner may shut it down".into()));
            }
            // Checked before anything happens: a malformed request shuts nothing down.
            let code = opt_i32(body, "exit_code")?.unwrap_or(0);
            if core.shutting_down.is_none() {
                core.exit_code = code;
            }
            core.begin_shutdown("shutdown requested");
            Ok(Some(json!({}).into()))
        }
        "rexec.notify" => {
            let body = lazy.object()?;
            // A lost-shell notice for the job's leader shell: delivered as a local event `shell.<jobid>.lost`
            // to the shell, which subscribed to `shell.<jobid>`.
            let id = parse_id(body)?;
            let ev = Message::event(&format!("shell.{id}.lost"), body);
            core.deliver_local_event(&ev);
            Ok(Some(json!({}).into()))
        }
        "rexec.spawn" => spawn_shell(core, msg, lazy.object()?),
        "rexec.kill" => {
            let body = lazy.object()?;
            let id = parse_id(body)?;
            field(body, "signal")?;
            let sig = opt_i32(body, "signal")?.unwrap_or(crate::signal::SIGTERM);
            if !(1..=crate::signal::SIGRTMAX).contains(&sig) {
                return Err((
                    errno::EINVAL,
                    format!("'signal' must be a signal number 1..={}, got {sig}", crate::signal::SIGRTMAX),
                ));
            }
            if core.shells.contains(&id) {
                debug!("signal {sig} to shell of job {id}");
                core.effect(Effect::SignalShell { id, signal: sig });
                Ok(Some(json!({}).into()))
            } else {
                Err((errno::ENOENT, format!("no shell of job {id} on rank {rank}")))
            }
        }
        t if t.starts_with("resource.") || t.starts_with("overlay.") => resource(core, msg, lazy),
        t if t.starts_with("job-manager.") || t.starts_with("job-info.") || t.starts_with("job-exec.") => {
            jobs(core, msg, lazy)
        }
        t => Err((errno::ENOSYS, format!("unknown service method '{t}'"))),
    }
}

/// Every attribute of [`crate::attrs::ATTRS`] with its value in effect (`None`: unset): the read-only ones and
/// those resolved at start-up from this broker's state, the rest from its typed config.
fn attrs(core: &Broker) -> std::collections::BTreeMap<&'static str, Option<String>> {
    let o = &core.opts;
    crate::attrs::values(&o.config, |name| {
        Some(match name {
            "rank" => o.rank.to_string(),
            "size" => o.size.to_string(),
            "hostname" => o.hostname.clone(),
            "tbon.topo" => o.topo.to_string(),
            "tbon.fanout" => match o.topo {
                crate::topology::Topology::Kary(k) => k.to_string(),
                crate::topology::Topology::Binomial => return None,
            },
            "tbon.level" => o.topo.level(o.size, o.rank).to_string(),
            "tbon.maxlevel" => o.topo.depth(o.size).saturating_sub(1).to_string(),
            "tbon.transport-active" => core.links.summary(),
            "tbon.endpoint" => o.endpoints.get(o.rank as usize).cloned().unwrap_or_default(),
            "tbon.parent-endpoint" => {
                o.endpoints.get(o.topo.parent(o.size, o.rank)? as usize).cloned().unwrap_or_default()
            }
            "rundir" => o.rundir.display().to_string(),
            "local-uri" => core.env.local_uri.clone(),
            "instance-id" => o.instance.clone(),
            "broker.pid" => core.env.pid.to_string(),
            "broker.starttime" => format!("{:.3}", core.env.wall_origin),
            "resource.source" => core.env.resources.source.clone(),
            // In effect here: set, else rank 0's (a child of rank 0 takes it), else the default.
            "tbon.parent_grace" => crate::attrs::fmt_duration(core.parent_grace()),
            _ => return None,
        })
    })
}

fn info(core: &Broker) -> Value {
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
        "uptime": core.clock(), "topo": o.topo.to_string(),
        "depth": o.topo.depth(o.size), "level": o.topo.level(o.size, o.rank),
        "transport": core.links.summary(), "instance_level": o.config.instance_level.to_string(),
        "detectors": detectors(core),
        "resource_source": core.env.resources.source,
        "containment": core.env.containment,
        "security": security(core),
        "statedir": statedir(core),
    })
}

/// Rank 0's state directory for `broker.info`: `null` without one, else `{path, state: ok|failing|damaged,
/// restarts, why, writes, syncs}` (`writes`: transactions written since this rank 0 started, `syncs`: fsyncs;
/// each covers every write before it).
fn statedir(core: &Broker) -> Value {
    use super::core::StateDir;
    match &core.statedir {
        StateDir::None => Value::Null,
        StateDir::Open { dir, restarts, failing } => json!({"path": dir.display().to_string(),
            "state": if failing.is_some() { "failing" } else { "ok" }, "restarts": restarts, "why": failing,
            "writes": core.writes, "syncs": core.syncs, "fold_failing": core.status.fold_failing}),
        StateDir::Damaged { dir, why } => json!({"path": dir.display().to_string(), "state": "damaged",
            "restarts": Value::Null, "why": why}),
    }
}

/// How this broker's overlay links are secured, and how many unauthenticated connections it refused.
fn security(core: &Broker) -> Value {
    json!({"noise": crate::message::NOISE_PARAMS, "refused": core.status.refused})
}

// ------------------------------------------------------------------------------------------- rexec

/// `rexec.spawn`: start the job shell of job `id` with `input` (a [`ShellInput`], checked here: a payload that is
/// not one is refused with EPROTO rather than handed to a shell, or indexed into). Answered with the shell's pid
/// once the driver has started it ([`super::core::Input::ShellStarted`]).
fn spawn_shell(core: &mut Broker, msg: &Message, body: &Value) -> Reply {
    let id = parse_id(body)?;
    let input = field(body, "input")?;
    if !input.is_object() {
        return Err(wrong_type("input", "an object (the job shell's input)", input));
    }
    let mut input = ShellInput::deserialize(input).map_err(|e| (errno::EPROTO, format!("input: {e}")))?;
    if input.id != id.0 {
        return Err((errno::EPROTO, format!("input: job id {} is not the request's job {id}", input.id)));
    }
    input.check().map_err(|e| (errno::EPROTO, format!("input: {e}")))?;
    if core.shutting_down.is_some() {
        return Err((errno::EAGAIN, "broker is shutting down".into()));
    }
    if core.shells.contains(&id) {
        return Err((errno::EEXIST, format!("job {id} already has a shell on rank {}", core.rank())));
    }
    input.uri = core.env.local_uri.clone();
    // Short names: a nested instance's socket lives below this directory and Unix socket paths are limited
    // to 108 bytes.
    let tmpdir = core.opts.rundir.join(format!("j{id}.{}", input.shell_rank));
    input.tmpdir = Some(tmpdir.display().to_string());
    core.shells.insert(id);
    core.spawning.insert(id, msg.clone());
    core.effect(Effect::SpawnShell { id, input: Box::new(input), tmpdir });
    Ok(None)
}

// ------------------------------------------------------------------------------------------- resource

/// The start of the reason of a rank torpid because a router above it is: "... rank R" (`overlay.torpid`).
pub const BEHIND: &str = "unreachable behind torpid router rank";

fn resource(core: &mut Broker, msg: &Message, lazy: &Body<'_>) -> Reply {
    let body = lazy.object()?;
    let n = core.wall();
    let size = core.opts.size;
    let topo = core.opts.topo;
    match msg.topic.as_str() {
        "resource.register" => {
            let rank = field(body, "rank")?;
            // Range-checked before narrowing: rank 2^32 is not rank 0.
            let rank = rank.as_u64().ok_or_else(|| wrong_type("rank", "a rank (a non-negative integer)", rank))?;
            let rank = u32::try_from(rank)
                .ok()
                .filter(|r| *r < size)
                .ok_or((errno::EPROTO, format!("rank {rank} out of range")))?;
            let hostname = opt_str(body, "hostname")?.unwrap_or("").to_string();
            let res: NodeResources = serde_json::from_value(field(body, "resources")?.clone())
                .map_err(|e| (errno::EPROTO, format!("resources: {e}")))?;
            let topology = opt_str(body, "topology")?.unwrap_or("live").to_string();
            let dg = opt_u32(body, "declared_gpus")?;
            let ids = |k: &str, n: u32| -> Result<IdSet, (u32, String)> {
                match opt_str(body, k)? {
                    Some(s) => IdSet::parse(s).map_err(|e| (errno::EPROTO, format!("{k}: {e}"))),
                    // As many ids as the node has, within the bound of an idset string (a count such as
                    // 4294967295 would otherwise be expanded id by id).
                    None if u64::from(n) <= crate::idset::MAX_IDS => Ok((0..n).collect()),
                    None => Err((
                        errno::EPROTO,
                        format!("resources.{k}: {n} is more than the {} ids a node may have", crate::idset::MAX_IDS),
                    )),
                }
            };
            let cores = ids("cores", res.cores)?;
            let gpus = ids("gpus", res.gpus)?;
            // The jobs its broker still has (rejoin.rs): absent from older brokers, bounded by the message size.
            let jobs: Option<std::collections::BTreeSet<JobId>> = match body.get("jobs") {
                None | Some(Value::Null) => None,
                Some(Value::Array(a)) => Some(
                    a.iter()
                        .map(|v| v.as_u64().map(JobId))
                        .collect::<Option<_>>()
                        .ok_or((errno::EPROTO, "jobs: expected an array of job ids".to_string()))?,
                ),
                Some(v) => return Err(wrong_type("jobs", "an array of job ids", v)),
            };
            // Its parent now (absent from older brokers; rank 0 itself has none).
            let parent = opt_u32(body, "parent")?;
            core.on_register(rank, parent);
            core.members.insert(rank, (MemberState::Online, String::new(), n));
            if let Some(jc) = core.jobcore.as_mut() {
                jc.rank_online(n, rank, &hostname, cores, gpus, (topology, dg));
                if let Some(jobs) = jobs {
                    jc.rank_jobs(n, rank, &jobs);
                }
            }
            debug!("rank {rank} ({hostname}) joined with cores {} and GPUs {}", body["cores"], body["gpus"]);
            Ok(Some(json!({}).into()))
        }
        "overlay.torpid" | "overlay.lively" => {
            let reported = parse_instance_ranks(body, size)?;
            let reason = opt_str(body, "reason")?.unwrap_or("").to_string();
            let torpid = msg.topic == "overlay.torpid";
            // A torpid router forwards nothing: the ranks below it are unreachable too, so they get no new work
            // either (and come back with it, unless they were torpid on their own account).
            let mut ranks = reported.clone();
            // Rank below a reported router → that router.
            let mut behind = std::collections::BTreeMap::<u32, u32>::new();
            for r in reported.iter() {
                if behind.contains_key(&r) {
                    // Already walked as part of a reported router above it (ranks ascend from the root): its
                    // subtree adds nothing, and walking every reported rank's subtree would be quadratic.
                    continue;
                }
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
            let ranks = parse_instance_ranks(body, size)?;
            let reason = opt_str(body, "reason")?.unwrap_or("").to_string();
            // The root of a lost subtree has the reason; the ranks behind it are cut off by its loss.
            let root = opt_u32(body, "root")?.filter(|r| ranks.contains(*r));
            let state = if msg.topic == "overlay.lost" { MemberState::Lost } else { MemberState::Offline };
            if state == MemberState::Lost && core.stale_lost_notice(body, root) {
                // Sent again after its judge re-parented, about a rank taken already or gone elsewhere since.
                debug!("ignoring a stale loss notice about ranks {ranks}: {reason}");
                return Ok(Some(json!({}).into()));
            }
            let noun = if ranks.len() == 1 { "rank" } else { "ranks" };
            warn!("{noun} {ranks} {}: {reason}", if state == MemberState::Lost { "lost" } else { "offline" });
            for r in ranks.iter() {
                // A rank already lost keeps its own verdict and time: a router lost later does not rewrite why.
                if core.members.get(&r).is_some_and(|m| m.0 == MemberState::Lost) {
                    continue;
                }
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
            if state == MemberState::Lost {
                for r in ranks.iter() {
                    core.orphans.remove(&r);
                    core.expect_orphans(r);
                }
            }
            Ok(Some(json!({}).into()))
        }
        "overlay.reparent" => {
            core.record_reparent(body)?;
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
                           "parent": core.parent_of(r), "children": core.children_of(r),
                           "adopted": core.adopted.contains_key(&r),
                           "link": core.links.of_rank(r)})
                })
                .collect();
            Ok(Some(
                json!({"size": size, "topo": topo.to_string(), "depth": topo.depth(size),
                "critical_ranks": super::reparent::critical_ranks(topo, size, core.opts.config.reparent).to_string(),
                "transport": core.links.summary(), "detectors": detectors(core), "security": security(core),
                "ranks": ranks})
                .into(),
            ))
        }
        "overlay.transport" => {
            // A child's report of its parent link (rdma_link), about a rank of this instance.
            if u32_field(body, "rank")? >= size {
                return Err((errno::EPROTO, format!("'rank' must be below the instance size {size}")));
            }
            core.links.on_report(body).map_err(|e| (errno::EPROTO, e))?;
            Ok(Some(json!({}).into()))
        }
        "resource.status" => {
            let jc = core.jobcore.as_ref().ok_or((errno::ENOSYS, "not rank 0".into()))?;
            let restarted = matches!(core.statedir, super::core::StateDir::Open { restarts, .. } if restarts > 0);
            let not_joined = if restarted { "not back since rank 0 restarted" } else { "never joined" };
            let mut rows = Vec::new();
            for r in 0..size {
                let p = jc.pool.ranks.get(&r);
                // Whether the rank's broker is there, apart from the admin's drain: "lost", "down" or "online".
                let liveness = match p {
                    Some(p) if p.up => ("online", String::new()),
                    _ => match core.members.get(&r) {
                        Some(m) if m.0 == MemberState::Lost => ("lost", m.1.clone()),
                        Some(m) => ("down", m.1.clone()),
                        None => ("down", not_joined.to_string()),
                    },
                };
                let (state, reason, at) = match p {
                    // Not joined since rank 0 started: a verdict from before its restart stands (statedir.md).
                    None => match core.members.get(&r) {
                        Some(m) if m.0 == MemberState::Lost => ("lost", m.1.clone(), Some(m.2)),
                        Some(m) => ("down", m.1.clone(), Some(m.2)),
                        None => ("down", not_joined.to_string(), None),
                    },
                    Some(p) if p.drained.is_some() => ("drained", p.drained.clone().unwrap_or_default(), p.drained_at),
                    Some(p) if !p.up => {
                        let m = core.members.get(&r).cloned();
                        let st = if m.as_ref().is_some_and(|m| m.0 == MemberState::Lost) { "lost" } else { "down" };
                        // Known from the state directory, not joined since: as one never seen since the restart.
                        let why = m.as_ref().map_or_else(|| not_joined.to_string(), |m| m.1.clone());
                        (st, why, m.map(|m| m.2))
                    }
                    Some(p) if p.torpid => (
                        "torpid",
                        core.members.get(&r).map(|m| m.1.clone()).unwrap_or_default(),
                        core.members.get(&r).map(|m| m.2),
                    ),
                    Some(_) => ("avail", String::new(), None),
                };
                rows.push(json!({"rank": r, "hostname": host_of(core, r), "state": state,
                    "reason": reason, "since": at, "up": p.is_some_and(|p| p.up),
                    "liveness": liveness.0, "liveness_reason": liveness.1}));
            }
            Ok(Some(json!({"ranks": rows}).into()))
        }
        "resource.list" => {
            let jc = core.jobcore.as_ref().ok_or((errno::ENOSYS, "not rank 0".into()))?;
            // Every rank, as `resource.status` lists them: one that has not joined (yet) is down, resources unknown.
            let rows: Vec<Value> = (0..size).map(|r| match jc.pool.ranks.get(&r) {
                Some(p) => json!({
                    "rank": p.rank, "hostname": p.hostname, "up": p.up, "drained": p.drained.is_some(), "torpid": p.torpid,
                    "cores": p.cores.to_string(), "gpus": p.gpus.to_string(),
                    "alloc_cores": p.alloc_cores.to_string(), "alloc_gpus": p.alloc_gpus.to_string(),
                    "ncores": p.cores.len(), "ngpus": p.gpus.len(), "nalloc_cores": p.alloc_cores.len(), "nalloc_gpus": p.alloc_gpus.len(),
                }),
                None => json!({
                    "rank": r, "hostname": host_of(core, r), "up": false, "drained": false, "torpid": false,
                    "cores": "", "gpus": "", "alloc_cores": "", "alloc_gpus": "",
                    "ncores": 0, "ngpus": 0, "nalloc_cores": 0, "nalloc_gpus": 0,
                }),
            }).collect();
            Ok(Some(json!({"ranks": rows}).into()))
        }
        "resource.drain" | "resource.undrain" => {
            if msg.userid != core.env.uid {
                return Err((errno::EPERM, "only the instance owner may drain or undrain".into()));
            }
            let ranks = parse_ranks(body)?;
            let reason = opt_str(body, "reason")?.unwrap_or("");
            let mode = match opt_str(body, "mode")? {
                None | Some("") => crate::jobs::DrainMode::Refuse,
                Some("force") => crate::jobs::DrainMode::Force,
                Some("update") => crate::jobs::DrainMode::Update,
                Some(m) => return Err((errno::EINVAL, format!("mode: '{m}' is not 'force' or 'update'"))),
            };
            let jc = core.jobcore.as_mut().ok_or((errno::ENOSYS, "not rank 0".into()))?;
            let r =
                if msg.topic == "resource.drain" { jc.drain(n, &ranks, reason, mode) } else { jc.undrain(n, &ranks) };
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
            Ok(Some(Out::json(&crate::r::Rv1::from_ranks(&ranks, core.env.wall_origin, 0.0))))
        }
        t => Err((errno::ENOSYS, format!("unknown service method '{t}'"))),
    }
}

/// Rank `r`'s host name: as it registered, else as configured (`bootstrap.hosts`: a rank not joined since rank
/// 0 started), else empty.
fn host_of(core: &Broker, r: u32) -> String {
    match core.jobcore.as_ref().and_then(|jc| jc.pool.ranks.get(&r)) {
        Some(p) => p.hostname.clone(),
        None => core.opts.hosts.get(r as usize).cloned().unwrap_or_default(),
    }
}

// ------------------------------------------------------------------------------------------- jobs

fn jobs(core: &mut Broker, msg: &Message, lazy: &Body<'_>) -> Reply {
    let body = lazy.object()?;
    let n = core.wall();
    let owner = msg.userid == core.env.uid;
    let size = core.opts.size;
    let Some(jc) = core.jobcore.as_mut() else { return Err((errno::ENOSYS, "job services run on rank 0".into())) };
    match msg.topic.as_str() {
        "job-manager.submit" => {
            let spec = field(body, "jobspec")?;
            let stdin = opt_bool(body, "stdin")?.unwrap_or(false);
            match &core.statedir {
                super::core::StateDir::Damaged { dir, why } => {
                    return Err((
                        errno::EROFS,
                        format!(
                            "no new job is taken: rank 0 could not read its state directory {} ({why}); scheduling \
                             is stopped until an operator repairs or moves the store and restarts rank 0",
                            dir.display()
                        ),
                    ))
                }
                super::core::StateDir::Open { .. } | super::core::StateDir::None => {}
            }
            // `vigil run` streams its standard input to the tasks (job-exec.stdin).
            match jc.submit_with_stdin(n, spec, msg.userid, stdin) {
                Ok(id) => {
                    info!("job {id} submitted");
                    // RFC 14: unknown attributes.system keys are ignored, and the submitter is told.
                    let warnings = jc.jobs.get(&id).map(|j| j.req.warnings.clone()).unwrap_or_default();
                    let answer = json!({"id": id.0, "id_f58": id.f58(), "warnings": warnings});
                    if jc.journaling() {
                        // Answered once the job's record is durable (Input::Stored, then Input::Synced), not before.
                        core.awaiting_durable.push((msg.head(), super::core::Held::Submission(answer)));
                        return Ok(None);
                    }
                    Ok(Some(answer.into()))
                }
                Err(e) => {
                    // Brokers still to join (the instance is starting, or rank 0 restarted and they are
                    // rejoining it) may be what the request needs: try again, rather than never.
                    let joined = jc.ranks_joined();
                    let waiting = joined < size as usize
                        && match &e {
                            crate::jobs::SubmitError::Unsatisfiable(crate::jobs::sched::Unsatisfiable::Nodes {
                                want,
                                ..
                            }) => *want <= size,
                            crate::jobs::SubmitError::Unsatisfiable(
                                crate::jobs::sched::Unsatisfiable::NodeTooSmall { .. },
                            ) => true,
                            _ => false,
                        };
                    if waiting {
                        return Err((
                            errno::EAGAIN,
                            format!("{e}, as only {joined} of its {size} brokers have joined so far: try again"),
                        ));
                    }
                    Err((errno::EINVAL, e.to_string()))
                }
            }
        }
        "job-manager.list" => {
            let all = opt_bool(body, "all")?.unwrap_or(false);
            let with_reason = |j: &crate::jobs::Job| {
                let mut v = j.info();
                if let (Some(r), Some(o)) = (jc.pending_reason(j.id), v.as_object_mut()) {
                    o.insert("reason_pending".into(), Value::String(r));
                }
                if let (Some(t), Some(o)) = (jc.estimate(j.id), v.as_object_mut()) {
                    // Flux's shape: the scheduler's expected start of the job holding the reservation.
                    o.insert("annotations".into(), json!({"sched": {"t_estimate": t}}));
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
            if let (Some(r), Some(o)) = (jc.pending_reason(id), info.as_object_mut()) {
                o.insert("reason_pending".into(), Value::String(r));
            }
            if let (Some(t), Some(o)) = (jc.estimate(id), info.as_object_mut()) {
                o.insert("annotations".into(), json!({"sched": {"t_estimate": t}}));
            }
            Ok(Some(json!({"info": info, "jobspec": j.jobspec(), "R": j.r}).into()))
        }
        "job-manager.cancel" => {
            let id = parse_id(body)?;
            let note = opt_str(body, "note")?.unwrap_or("canceled by user").to_string();
            jc.cancel(n, id, msg.userid, owner, &note).map(|_| Some(json!({}).into()))
        }
        "job-manager.raise" => {
            let id = parse_id(body)?;
            let kind = opt_str(body, "type")?.unwrap_or("exec").to_string();
            let sev = opt_severity(body)?;
            let note = opt_str(body, "note")?.unwrap_or("").to_string();
            if !owner && jc.jobs.get(&id).is_some_and(|j| j.userid != msg.userid) {
                return Err((errno::EPERM, "not your job".into()));
            }
            if jc.raise(n, id, &kind, sev, &note) {
                Ok(Some(json!({}).into()))
            } else {
                Err((errno::ENOENT, format!("job {id} is not active")))
            }
        }
        "job-manager.purge" => {
            // Flux's `flux job purge`: the instance owner's, as its limits are.
            if !owner {
                return Err((errno::EPERM, "only the instance owner may purge jobs".into()));
            }
            let age_limit = match optional(body, "age_limit") {
                None => None,
                Some(f) => match f.as_f64().filter(|a| a.is_finite() && *a >= 0.0) {
                    Some(a) => Some(a),
                    None => return Err(wrong_type("age_limit", "a number of seconds >= 0", f)),
                },
            };
            let num_limit = opt_u64(body, "num_limit")?.map(|n| usize::try_from(n).unwrap_or(usize::MAX));
            let ids = match optional(body, "ids") {
                None => Vec::new(),
                Some(Value::Array(a)) => {
                    a.iter().map(|v| parse_id(&json!({ "id": v }))).collect::<Result<Vec<_>, _>>()?
                }
                Some(f) => return Err(wrong_type("ids", "an array of job ids", f)),
            };
            let force = opt_bool(body, "force")?.unwrap_or(false);
            let req = crate::jobs::purge::PurgeRequest { age_limit, num_limit, ids, force };
            match jc.purge(n, &req) {
                Ok(count) => {
                    if force && count > 0 {
                        info!("{count} inactive job(s) purged");
                    }
                    Ok(Some(json!({"count": count, "purged": force, "inactive": jc.inactive_count()}).into()))
                }
                Err(e @ crate::jobs::purge::PurgeError::Unknown(_)) => Err((errno::ENOENT, e.to_string())),
                Err(e) => Err((errno::EINVAL, e.to_string())),
            }
        }
        "job-info.attach" | "job-manager.eventlog" => {
            let id = parse_id(body)?;
            if !jc.jobs.contains_key(&id) {
                return Err((errno::ENOENT, format!("unknown job id {id}")));
            }
            let is_attach = msg.topic == "job-info.attach";
            let follow = opt_bool(body, "follow")?.unwrap_or(is_attach);
            let eventlog = opt_bool(body, "eventlog")?.unwrap_or(true);
            let output = opt_bool(body, "output")?.unwrap_or(true);
            let w = Watcher {
                req: msg.clone(),
                id,
                ev_pos: 0,
                out_pos: 0,
                eventlog,
                output: is_attach && output,
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
            check_waiting(core.watchers.iter().filter(|w| w.req.route == msg.route).count(), "job watchers")?;
            core.watchers.push(w);
            wake_watchers(core, id);
            Ok(None)
        }
        "job-exec.stdin" => {
            let id = parse_id(body)?;
            if !owner && jc.jobs.get(&id).is_some_and(|j| j.userid != msg.userid) {
                return Err((errno::EPERM, "not your job".into()));
            }
            let data = opt_str(body, "data")?.map(str::to_string);
            let eof = opt_bool(body, "eof")?.unwrap_or(false);
            // Bounded per job (jobs::STDIN_KEEP): a chunk past it is refused with ENOSPC, the rest kept.
            jc.stdin(id, data, eof).map_err(|e| (e.errno(), e.to_string()))?;
            Ok(Some(json!({}).into()))
        }
        "job-info.stdin" => {
            // A job shell reads the job's standard input: every chunk so far, then new ones, ENODATA at the end.
            let id = parse_id(body)?;
            if !jc.jobs.contains_key(&id) {
                return Err((errno::ENOENT, format!("unknown job id {id}")));
            }
            check_waiting(core.watchers.iter().filter(|w| w.req.route == msg.route).count(), "job watchers")?;
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
            // A shell numbers its batches so that one sent again after a router's loss is taken once, in order.
            let batch = match (opt_u32(body, "broker_rank")?, opt_u64(body, "seq")?, opt_bool(body, "flush")?) {
                (Some(rank), _, Some(true)) => Batch::Flush { rank },
                (Some(rank), Some(seq), _) => Batch::Numbered { rank, seq },
                _ => Batch::Unnumbered,
            };
            jc.output(id, batch, lines);
            Ok(Some(json!({}).into()))
        }
        "job-exec.task-exit" => {
            let id = parse_id(body)?;
            let task = opt_u32(body, "rank")?.unwrap_or(0);
            let status = opt_i32(body, "status")?.unwrap_or(0);
            jc.task_exit(n, id, task, status);
            Ok(Some(json!({}).into()))
        }
        "job-exec.exception" => {
            let id = parse_id(body)?;
            let kind = opt_str(body, "type")?.unwrap_or("exec").to_string();
            let sev = opt_severity(body)?;
            let note = opt_str(body, "note")?.unwrap_or("").to_string();
            let rank = opt_u32(body, "rank")?;
            if sev == 0 && jc.jobs.get(&id).is_some_and(|j| j.fatal.is_some()) {
                // Already going down: later shell reports are consequences of the first cause.
                debug!("job {id}: not posting follow-up exception: {note}");
            } else if jc.raise(n, id, &kind, sev, &note) && sev == 0 {
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
            let uri = str_field(body, "uri")?.to_string();
            let crit = IdSet::parse(opt_str(body, "critical_ranks")?.unwrap_or("0"))
                .map_err(|e| (errno::EPROTO, format!("critical_ranks: {e}")))?;
            let size = opt_u32(body, "size")?.unwrap_or(0);
            let job = jc.jobs.get_mut(&id).ok_or((errno::ENOENT, format!("unknown job id {id}")))?;
            let ranks: Vec<u32> = job.alloc.iter().map(|a| a.rank).collect();
            let parent_crit: IdSet = crit.iter().filter_map(|c| ranks.get(c as usize).copied()).collect();
            let memo = json!({"uri": uri, "size": size, "critical_ranks": crit.to_string(), "critical_broker_ranks": parent_crit.to_string()});
            job.instance = Some(memo.clone());
            jc.memo(n, id, memo);
            info!("job {id} is an instance of {size} brokers at {uri}; critical ranks {parent_crit}");
            Ok(Some(json!({}).into()))
        }
        "job-exec.pmi-barrier" => {
            // One exchange per barrier per shell: hold each shell's request until every one of the job's shells
            // has arrived (counted by `shell_rank`, so a shell that asks twice cannot end a barrier early), then
            // answer all of them with the union of their puts.
            let id = parse_id(body)?;
            let shell = u32_field(body, "shell_rank")?;
            let kvs = pmi_puts(body)?;
            let job = jc
                .jobs
                .get_mut(&id)
                .filter(|j| j.state == JobState::Run)
                .ok_or((errno::ENOENT, format!("job {id} is not running")))?;
            let nshells = job.shells.len();
            if shell as usize >= nshells {
                return Err((errno::EINVAL, format!("shell_rank {shell}: job {id} has {nshells} shell(s)")));
            }
            let b = core.pmi_barriers.entry(id).or_default();
            if b.waiting.contains_key(&shell) {
                return Err((errno::EINVAL, format!("shell {shell} of job {id} is already in this PMI barrier")));
            }
            job.pmi_exchanges += 1;
            b.waiting.insert(shell, msg.clone());
            b.kvs.extend(kvs);
            if b.waiting.len() >= nshells {
                let b = core.pmi_barriers.remove(&id).unwrap_or_default();
                let payload = json!({"kvs": b.kvs});
                for r in b.waiting.values() {
                    core.respond(r, &payload);
                }
            }
            Ok(None)
        }
        "job-exec.shell-exit" => {
            let exit: ShellExit = serde_json::from_value(body.clone()).map_err(|e| (errno::EPROTO, e.to_string()))?;
            if let super::core::StateDir::Damaged { dir, .. } = &core.statedir {
                // Not acknowledged: the job is in the store an operator is repairing, and its broker keeps the
                // report (an error keeps it), sending it again to the rank 0 restarted on the repaired store.
                return Err((
                    errno::EROFS,
                    format!(
                        "rank 0's state directory {} is damaged: exit reports are kept by their brokers until rank 0 \
                         restarts on a store it can read",
                        dir.display()
                    ),
                ));
            }
            jc.shell_exit(n, exit);
            if jc.journaling() {
                // Acknowledged once the exit status is durable (Input::Stored, then Input::Synced): the reporting
                // broker drops its report then (core.rs, Held::ExitReport).
                core.awaiting_durable.push((msg.head(), super::core::Held::ExitReport));
                return Ok(None);
            }
            Ok(Some(json!({}).into()))
        }
        t => Err((errno::ENOSYS, format!("unknown service method '{t}'"))),
    }
}

/// The `kvs` of a `job-exec.pmi-barrier` request: a shell's PMI-1 puts, which every shell of the job hands back to
/// its tasks verbatim in PMI lines. So each key and value must be a token such a line can carry (no space or
/// newline, no `=` in a key) within the sizes served by `get_maxes`; absent means no puts.
fn pmi_puts(body: &Value) -> Result<serde_json::Map<String, Value>, (u32, String)> {
    use crate::pmi::{KEYLEN_MAX, VALLEN_MAX};
    let Some(kvs) = optional(body, "kvs") else { return Ok(serde_json::Map::new()) };
    let kvs = kvs.as_object().ok_or_else(|| wrong_type("kvs", "an object of PMI keys and values", kvs))?;
    let clip = |k: &str| k.chars().take(64).collect::<String>();
    for (k, v) in kvs {
        let Some(s) = v.as_str() else { return Err(wrong_type(&format!("kvs.{}", clip(k)), "a string", v)) };
        let bad = |t: &str| t.contains([' ', '\n']);
        if k.len() > KEYLEN_MAX || bad(k) || k.contains('=') {
            return Err((errno::EPROTO, format!("kvs: '{}' is not a PMI key", clip(k))));
        }
        if s.len() > VALLEN_MAX || bad(s) {
            return Err((errno::EPROTO, format!("kvs.{}: not a PMI value", clip(k))));
        }
    }
    Ok(kvs.clone())
}

/// Send new eventlog entries and output lines to the watchers of job `id`; end finished streams with ENODATA.
pub fn wake_watchers(core: &mut Broker, id: JobId) {
    let Some(jc) = core.jobcore.as_ref() else { return };
    let Some(job) = jc.jobs.get(&id) else { return };
    let inactive = job.state == JobState::Inactive;
    let mut out: Vec<Message> = Vec::new();
    let mut done = Vec::new();
    for (i, w) in core.watchers.iter_mut().enumerate().filter(|(_, w)| w.id == id) {
        // Output lines carry no time, so when output and events are both waiting (a finished job attached late,
        // or a busy turn), the events from the first `exception` or `finish` on go after the output: the job reads
        // as it ran, its output, then what ended it.
        let output_waits = w.output && w.out_pos < job.output_base + job.output.len();
        let split = if output_waits {
            job.eventlog[w.ev_pos.min(job.eventlog.len())..]
                .iter()
                .position(|e| e.name == "exception" || e.name == "finish")
                .map_or(job.eventlog.len(), |k| w.ev_pos + k)
        } else {
            job.eventlog.len()
        };
        if w.eventlog {
            for e in &job.eventlog[w.ev_pos.min(split)..split] {
                out.push(Message::response_to(&w.req, &json!({"event": &**e})));
            }
            w.ev_pos = w.ev_pos.max(split);
        }
        if w.output {
            if w.out_pos < job.output_base {
                let missed = job.output_base - w.out_pos;
                // The bound that dropped them: a running job's, or the tail an INACTIVE job keeps.
                let (keep, of) = if job.state == crate::jobs::JobState::Inactive {
                    (crate::jobs::INACTIVE_OUTPUT_KEEP, "an inactive job")
                } else {
                    (crate::jobs::OUTPUT_KEEP, "a running job")
                };
                let note = crate::shellproto::OutputLine::text(
                    0,
                    "stderr",
                    format!(
                        "vigil: {missed} output chunk(s) dropped: rank 0 keeps the last {} MiB of {of}'s output, each \
                         chunk counted as its bytes plus about 100 (use --output FILE)",
                        keep >> 20
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
        if w.eventlog {
            for e in &job.eventlog[w.ev_pos..] {
                out.push(Message::response_to(&w.req, &json!({"event": &**e})));
            }
            w.ev_pos = job.eventlog.len();
        }
        if w.stdin {
            // `get`: an INACTIVE job's input is dropped (jobs::retire_stdin), under a watcher that read some.
            for d in job.stdin.get(w.in_pos..).unwrap_or_default() {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_of_the_wrong_type_are_refused_naming_the_field() {
        let body = json!({"s": "x", "b": true, "n": 5, "neg": -1, "big": 1u64 << 32, "null": null, "f": 1.5});
        assert_eq!(opt_str(&body, "s"), Ok(Some("x")));
        assert_eq!(opt_str(&body, "absent"), Ok(None));
        assert_eq!(opt_str(&body, "null"), Ok(None), "null is an absent optional field");
        assert_eq!(opt_bool(&body, "b"), Ok(Some(true)));
        assert_eq!(opt_u32(&body, "n"), Ok(Some(5)));
        assert_eq!(opt_i32(&body, "neg"), Ok(Some(-1)));
        for (r, field) in [
            (opt_str(&body, "n").map(|_| ()), "'n'"),
            (opt_bool(&body, "s").map(|_| ()), "'s'"),
            (opt_u64(&body, "neg").map(|_| ()), "'neg'"),
            (opt_u32(&body, "big").map(|_| ()), "'big'"),
            (opt_u32(&body, "f").map(|_| ()), "'f'"),
            (opt_i32(&body, "big").map(|_| ()), "'big'"),
            (str_field(&body, "null").map(|_| ()), "'null'"),
            (u32_field(&body, "s").map(|_| ()), "'s'"),
        ] {
            let (e, msg) = r.expect_err(field);
            assert_eq!(e, errno::EPROTO, "{msg}");
            assert!(msg.contains(field), "{msg}");
        }
        assert_eq!(u32_field(&body, "absent").map_err(|e| e.0), Err(errno::EPROTO));
        assert_eq!(opt_severity(&json!({"severity": 8})).map_err(|e| e.0), Err(errno::EINVAL));
        assert_eq!(opt_severity(&json!({})), Ok(0));
        assert_eq!(parse_id(&json!({"id": [1]})).map_err(|e| e.0), Err(errno::EPROTO));
    }

    #[test]
    fn ranks_outside_the_instance_are_refused() {
        assert_eq!(parse_instance_ranks(&json!({"ranks": "0-3"}), 4).map(|r| r.len()), Ok(4));
        for ranks in ["4", "2-9", "4294967295"] {
            let (e, msg) = parse_instance_ranks(&json!({"ranks": ranks}), 4).expect_err(ranks);
            assert_eq!(e, errno::EINVAL);
            assert!(msg.contains("not in this instance of size 4"), "{msg}");
        }
        // An idset that would expand to four billion ranks is refused by the parser itself.
        let (e, _) = parse_instance_ranks(&json!({"ranks": "0-4294967295"}), 4).expect_err("huge");
        assert_eq!(e, errno::EINVAL);
        let (e, _) = parse_instance_ranks(&json!({"ranks": 3}), 4).expect_err("a number");
        assert_eq!(e, errno::EPROTO);
    }

    #[test]
    fn pmi_puts_must_be_pmi_tokens() {
        assert_eq!(pmi_puts(&json!({})).map(|m| m.len()), Ok(0));
        assert_eq!(pmi_puts(&json!({"kvs": {"k": "v=w", "e": ""}})).map(|m| m.len()), Ok(2));
        let long = "x".repeat(crate::pmi::VALLEN_MAX + 1);
        for kvs in [
            json!("k=v"),
            json!({"k": 1}),
            json!({"k": ["v"]}),
            json!({"k": "a b"}),
            json!({"k": "a\nb"}),
            json!({"a=b": "v"}),
            json!({"a b": "v"}),
            json!({"k": long}),
        ] {
            let (e, msg) = pmi_puts(&json!({ "kvs": kvs })).expect_err("bad kvs");
            assert_eq!(e, errno::EPROTO, "{msg}");
            assert!(msg.contains("kvs"), "{msg}");
        }
    }
}
