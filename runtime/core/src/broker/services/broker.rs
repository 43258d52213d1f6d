//! The `broker` service, on every rank: ping, attributes, information, overlay round trips, event
//! subscriptions and publication, shutdown.

use super::*;
use crate::broker::core::{RttRun, StateDir};

/// Topics of the `broker` service: and their handlers (who may call each: `broker/access.rs`).
pub(super) const TOPICS: &[Topic] = &[
    Topic { name: "broker.ping", handler: ping },
    Topic { name: "broker.getattr", handler: getattr },
    Topic { name: "broker.lsattr", handler: lsattr },
    Topic { name: "broker.info", handler: info },
    Topic { name: "broker.rtt", handler: rtt },
    Topic { name: "broker.sub", handler: sub_or_unsub },
    Topic { name: "broker.unsub", handler: sub_or_unsub },
    Topic { name: "broker.pub", handler: publish },
    Topic { name: "broker.shutdown", handler: shutdown },
];

/// `broker.ping`.
fn ping(core: &mut Broker, msg: &Message, _lazy: &Body<'_>) -> Reply {
    let rank = core.rank();
    Ok(Some(Out::json(&Pong { rank, hostname: &core.opts.hostname, pid: core.env.pid, route: msg.route.len() })))
}

/// A `broker.getattr` request (Flux's `attr.get`).
#[derive(Debug, Deserialize)]
struct GetattrRequest {
    /// The attribute, by the name `vigil lsattr` lists ([`crate::attrs::ATTRS`]).
    name: String,
}

/// `broker.getattr`.
fn getattr(core: &mut Broker, _msg: &Message, lazy: &Body<'_>) -> Reply {
    let req: GetattrRequest = lazy.decode()?;
    let name = req.name.as_str();
    match attrs(core).remove(name) {
        Some(Some(v)) => Ok(Some(json!({"value": v}).into())),
        Some(None) => Err(ServiceError::enoent(format!("attribute '{name}' is not set"))),
        None => Err(ServiceError::enoent(format!("no such attribute '{name}' (see `vigil lsattr`)"))),
    }
}

/// `broker.lsattr`.
fn lsattr(core: &mut Broker, _msg: &Message, _lazy: &Body<'_>) -> Reply {
    Ok(Some(json!({"attrs": attrs(core)}).into()))
}

/// `broker.info`.
fn info(core: &mut Broker, _msg: &Message, _lazy: &Body<'_>) -> Reply {
    Ok(Some(broker_info(core).into()))
}

/// A `broker.rtt` request (`vigil ping`): time round trips over the overlay from this broker to another and
/// back. Answered once they are done, with their times.
#[derive(Debug, Deserialize)]
struct RttRequest {
    /// The broker to reach: a rank of this instance, not this broker's own.
    rank: u64,
    /// Round trips to time, 1..=1000000; 1 when absent.
    count: Option<u64>,
    /// Bytes of padding each request carries, at most 1 MiB; 0 when absent.
    size: Option<u64>,
    /// Round trips in flight at once, 1..=1024; 1 when absent.
    window: Option<u64>,
}

/// `broker.rtt`.
fn rtt(core: &mut Broker, msg: &Message, lazy: &Body<'_>) -> Reply {
    let req: RttRequest = lazy.decode()?;
    // Overlay round trips timed by this broker: the client's own hop is not in the samples.
    let target = u32::try_from(req.rank)
        .ok()
        .filter(|r| *r < core.opts.size)
        .ok_or(ServiceError::einval(format!("rank must be below the instance size {}", core.opts.size)))?;
    if target == core.rank() {
        return Err(ServiceError::einval("a round trip to this broker itself does not cross the overlay"));
    }
    let count = req.count.unwrap_or(1);
    let size = req.size.unwrap_or(0);
    if count == 0 || count > 1_000_000 || size > 1 << 20 {
        return Err(ServiceError::einval("count must be 1..1000000 and size at most 1 MiB"));
    }
    let (count, size) = (count as u32, size as usize);
    let window = req.window.unwrap_or(1);
    if window == 0 || window > 1024 {
        return Err(ServiceError::einval("window must be 1..1024"));
    }
    let window = window as u32;
    let mine = core.rtt_runs.values().filter(|r| r.req.route == msg.route).count();
    if mine >= MAX_RTT_RUNS_PER_CLIENT || core.rtt_runs.len() >= MAX_RTT_RUNS {
        return Err(ServiceError::eagain(format!(
            "{} round-trip runs in progress here ({mine} of them this client's; at most \
                 {MAX_RTT_RUNS_PER_CLIENT} per client and {MAX_RTT_RUNS} in all): try again when they end",
            core.rtt_runs.len()
        )));
    }
    let run = RttRun {
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

/// A `broker.sub` or `broker.unsub` request (Flux's `event.subscribe`, `event.unsubscribe`).
#[derive(Debug, Deserialize)]
struct SubRequest {
    /// The prefix of the event topics to receive (or no longer), at most [`MAX_SUB_TOPIC`] bytes.
    topic: String,
}

/// `broker.sub` and `broker.unsub`.
fn sub_or_unsub(core: &mut Broker, msg: &Message, lazy: &Body<'_>) -> Reply {
    let topic = lazy.decode::<SubRequest>()?.topic;
    // A local client's (access::Rule::LocalClient): its route is its connection.
    let Some(&last) = msg.route.first() else { return Err(ServiceError::eproto("not a local client")) };
    if let Some(c) = core.locals.get_mut(&(last & !ROUTE_LOCAL)) {
        if msg.topic == "broker.unsub" {
            c.subs.remove(&topic);
        } else if !c.subs.contains(&topic) {
            // A set: subscribing again to a prefix is a no-op. Bounded in count and length, so what one
            // client holds here is at most MAX_SUBS_PER_CLIENT * MAX_SUB_TOPIC bytes.
            if topic.len() > MAX_SUB_TOPIC {
                return Err(ServiceError::einval(format!(
                    "'topic' is {} bytes, more than the {MAX_SUB_TOPIC} a prefix may have",
                    topic.len()
                )));
            }
            if c.subs.len() >= MAX_SUBS_PER_CLIENT {
                return Err(ServiceError::enospc(format!(
                    "this client already holds {MAX_SUBS_PER_CLIENT} subscriptions, the most one may \
                         (unsubscribe from some, or subscribe to a shorter prefix that covers them)"
                )));
            }
            c.subs.insert(topic);
        }
    }
    Ok(Some(json!({}).into()))
}

/// A `broker.pub` request (Flux's `event.pub`), served on rank 0.
#[derive(Debug, Deserialize)]
struct PubRequest {
    /// The event's topic, not empty.
    topic: String,
    /// The event's payload, any JSON; `null` when absent.
    #[serde(default)]
    payload: Value,
}

/// `broker.pub`.
fn publish(core: &mut Broker, _msg: &Message, lazy: &Body<'_>) -> Reply {
    let req: PubRequest = lazy.decode()?;
    if core.rank() != 0 {
        return Err(ServiceError::eproto("events are published on rank 0"));
    }
    if req.topic.is_empty() {
        return Err(ServiceError::einval("topic must be a non-empty string"));
    }
    core.publish(&req.topic, &req.payload);
    Ok(Some(json!({}).into()))
}

/// A `broker.shutdown` request (`vigil shutdown`), served on rank 0: the instance stops.
#[derive(Debug, Deserialize)]
struct ShutdownRequest {
    /// The exit code of the instance (rank 0's broker process); 0 when absent. A second request while shutting
    /// down does not change it.
    exit_code: Option<i32>,
}

/// `broker.shutdown`.
fn shutdown(core: &mut Broker, _msg: &Message, lazy: &Body<'_>) -> Reply {
    // Checked before anything happens: a malformed request shuts nothing down (and is refused as such anywhere).
    let code = lazy.decode::<ShutdownRequest>()?.exit_code.unwrap_or(0);
    if core.rank() != 0 {
        return Err(ServiceError::einval("shutdown is requested from rank 0"));
    }
    if core.shutting_down.is_none() {
        core.exit_code = code;
    }
    core.begin_shutdown("shutdown requested");
    Ok(Some(json!({}).into()))
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

/// Every attribute of [`crate::attrs::ATTRS`] with its value in effect (`None`: unset): the read-only ones and
/// those resolved at start-up from this broker's state, the rest from its typed config.
fn attrs(core: &Broker) -> std::collections::BTreeMap<&'static str, Option<String>> {
    let o = &core.opts;
    crate::attrs::values(&o.config, |name| {
        Some(match name {
            "rank" => o.rank.to_string(),
            "size" => o.size.to_string(),
            "hostname" => o.hostname.clone(),
            "tbon.level" => o.config.topo.level(o.size, o.rank).to_string(),
            "tbon.maxlevel" => o.config.topo.depth(o.size).saturating_sub(1).to_string(),
            "tbon.transport-active" => core.links.summary(),
            "tbon.endpoint" => o.endpoints.get(o.rank as usize).cloned().unwrap_or_default(),
            "tbon.parent-endpoint" => {
                o.endpoints.get(o.config.topo.parent(o.size, o.rank)? as usize).cloned().unwrap_or_default()
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

fn broker_info(core: &Broker) -> Value {
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
        "uptime": core.clock(), "topo": o.config.topo.to_string(),
        "depth": o.config.topo.depth(o.size), "level": o.config.topo.level(o.size, o.rank),
        "transport": core.links.summary(), "instance_level": o.config.instance_level.to_string(),
        "detectors": detectors(core),
        "resource_source": core.env.resources.source,
        "containment": core.env.containment,
        "metrics": core.env.metrics,
        "security": security(core),
        "statedir": statedir(core),
        "health": core.status.health,
    })
}

/// Rank 0's state directory for `broker.info`: `null` without one, else `{path, state: ok|failing|damaged,
/// restarts, why, writes, syncs}` (`writes`: transactions written since this rank 0 started, `syncs`: fsyncs;
/// each covers every write before it).
fn statedir(core: &Broker) -> Value {
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
pub(super) fn security(core: &Broker) -> Value {
    json!({"noise": crate::message::NOISE_PARAMS, "refused": core.status.refused})
}
