//! The `resource` service, rank 0 only: brokers registering their node, and the resource pool as users see it
//! (status, list, R, eventlog) and drain it.

use super::*;
use crate::broker::core::{MemberState, StateDir};
use tracing::debug;
use vigil_proto::node::NodeResources;

/// Topics of the `resource` service: and their handlers (who may call each: `broker/access.rs`).
pub(super) const TOPICS: &[Topic] = &[
    Topic { name: "resource.register", handler: register },
    Topic { name: "resource.status", handler: status },
    Topic { name: "resource.list", handler: list },
    Topic { name: "resource.drain", handler: drain_or_undrain },
    Topic { name: "resource.undrain", handler: drain_or_undrain },
    Topic { name: "resource.eventlog", handler: eventlog },
    Topic { name: "resource.R", handler: r },
];

/// A `resource.register` request: a broker joins (or joins again), with its node's resources. Sent by every
/// broker to rank 0 once its parent link is up (rank 0 registers itself).
#[derive(Debug, Deserialize)]
struct RegisterRequest {
    /// The broker's rank, below the instance size.
    rank: u64,
    /// Its node's host name; empty when absent.
    hostname: Option<String>,
    /// Its node's resources, counted by hwloc or declared.
    resources: NodeResources,
    /// Where its topology came from (`live`, `synthetic:...`, `xml:...`, as `resources.source`); `live` when
    /// absent.
    topology: Option<String>,
    /// The GPU count its configuration declares, if any (not discovered).
    declared_gpus: Option<u32>,
    /// Its cores' ids, an idset; `0..resources.cores` when absent.
    cores: Option<String>,
    /// Its GPUs' ids, an idset; `0..resources.gpus` when absent.
    gpus: Option<String>,
    /// The jobs its broker still has shells or reports of (rejoin.rs); absent from older brokers.
    jobs: Option<std::collections::BTreeSet<JobId>>,
    /// Its parent now (absent from older brokers; rank 0 itself has none).
    parent: Option<u32>,
}

/// `resource.register`.
fn register(core: &mut Broker, _msg: &Message, lazy: &Body<'_>) -> Reply {
    let req: RegisterRequest = lazy.decode()?;
    let n = core.wall();
    let size = core.opts.size;
    // Range-checked before narrowing: rank 2^32 is not rank 0.
    let rank = u32::try_from(req.rank)
        .ok()
        .filter(|r| *r < size)
        .ok_or(ServiceError::eproto(format!("rank {} out of range", req.rank)))?;
    let hostname = req.hostname.unwrap_or_default();
    let res = req.resources;
    let topology = req.topology.unwrap_or_else(|| "live".to_string());
    let dg = req.declared_gpus;
    let ids = |k: &str, given: Option<&str>, n: u32| -> Result<IdSet, ServiceError> {
        match given {
            Some(s) => IdSet::parse(s).map_err(|e| ServiceError::eproto(format!("{k}: {e}"))),
            // As many ids as the node has, within the bound of an idset string (a count such as
            // 4294967295 would otherwise be expanded id by id).
            None if u64::from(n) <= crate::idset::MAX_IDS => Ok((0..n).collect()),
            None => Err(ServiceError::eproto(format!(
                "resources.{k}: {n} is more than the {} ids a node may have",
                crate::idset::MAX_IDS
            ))),
        }
    };
    let cores = ids("cores", req.cores.as_deref(), res.cores)?;
    let gpus = ids("gpus", req.gpus.as_deref(), res.gpus)?;
    debug!("rank {rank} ({hostname}) joined with cores {cores} and GPUs {gpus}");
    core.on_register(rank, req.parent);
    core.members.insert(rank, (MemberState::Online, String::new(), n));
    if let Some(jc) = core.jobcore.as_mut() {
        jc.rank_online(n, rank, &hostname, cores, gpus, (topology, dg));
        if let Some(&p) = core.adopted.get(&rank) {
            jc.online_under(rank, p);
        }
        if let Some(jobs) = req.jobs {
            jc.rank_jobs(n, rank, &jobs);
        }
    }
    Ok(Some(json!({}).into()))
}

/// `resource.status`.
fn status(core: &mut Broker, _msg: &Message, lazy: &Body<'_>) -> Reply {
    lazy.object()?;
    let size = core.opts.size;
    let jc = core.jobcore.as_ref().ok_or(ServiceError::enosys("not rank 0"))?;
    let restarted = matches!(core.statedir, StateDir::Open { restarts, .. } if restarts > 0);
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

/// `resource.list`.
fn list(core: &mut Broker, _msg: &Message, lazy: &Body<'_>) -> Reply {
    lazy.object()?;
    let size = core.opts.size;
    let jc = core.jobcore.as_ref().ok_or(ServiceError::enosys("not rank 0"))?;
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

/// A `resource.drain` or `resource.undrain` request (`vigil resource drain`, Flux's `resource.drain`): take
/// ranks out of scheduling, or give them back.
#[derive(Debug, Deserialize)]
struct DrainRequest {
    /// The ranks, an idset.
    ranks: String,
    /// Why (drain only); empty when absent.
    reason: Option<String>,
    /// Drain only: what to do with ranks drained already. Absent or empty: refuse them; `force`: drain them again
    /// with this reason; `update`: drain only those not drained yet (Flux's `-f`, `-u`).
    mode: Option<String>,
    /// `health`: a broker's health check asks, for its own rank (`ranks` is one rank, `mode` is ignored): drain
    /// unless an admin drained it, undrain only if a health check drained it (`crate::health`). `fabric`: a
    /// parent's fabric-down rule, for its child's rank: drain it and fail or notify its jobs
    /// (`crate::jobs::JobCore::fabric_down`), undrain only a fabric-down drain. Absent: the admin.
    by: Option<String>,
}

/// `resource.drain` and `resource.undrain`.
fn drain_or_undrain(core: &mut Broker, msg: &Message, lazy: &Body<'_>) -> Reply {
    let req: DrainRequest = lazy.decode()?;
    let n = core.wall();
    let ranks = parse_ranks(&req.ranks)?;
    let reason = req.reason.as_deref().unwrap_or("");
    let mode = match req.mode.as_deref() {
        None | Some("") => crate::jobs::DrainMode::Refuse,
        Some("force") => crate::jobs::DrainMode::Force,
        Some("update") => crate::jobs::DrainMode::Update,
        Some(m) => return Err(ServiceError::einval(format!("mode: '{m}' is not 'force' or 'update'"))),
    };
    let jc = core.jobcore.as_mut().ok_or(ServiceError::enosys("not rank 0"))?;
    match req.by.as_deref() {
        None | Some("") => {}
        Some("health") => {
            let rank = match (ranks.len(), ranks.iter().next()) {
                (1, Some(r)) => r,
                _ => return Err(ServiceError::einval(format!("ranks: '{}' is not one rank (by: health)", req.ranks))),
            };
            if msg.topic == "resource.drain" && !reason.starts_with(crate::health::REASON_PREFIX) {
                let p = crate::health::REASON_PREFIX;
                return Err(ServiceError::einval(format!("reason: a health check's reason starts with '{p}'")));
            }
            let changed = if msg.topic == "resource.drain" {
                jc.health_drain(n, rank, reason)
            } else {
                jc.health_undrain(n, rank)
            };
            return changed.map(|c| Some(json!({"changed": c}).into())).map_err(ServiceError::einval);
        }
        Some("fabric") => {
            // A parent's fabric-down rule (`crate::membership::FabricWatch`), for its child's rank.
            let rank = match (ranks.len(), ranks.iter().next()) {
                (1, Some(r)) => r,
                _ => return Err(ServiceError::einval(format!("ranks: '{}' is not one rank (by: fabric)", req.ranks))),
            };
            let changed = if msg.topic == "resource.drain" {
                jc.fabric_down(n, rank, reason)
            } else {
                jc.fabric_undrain(n, rank)
            };
            return changed.map(|c| Some(json!({"changed": c}).into())).map_err(ServiceError::einval);
        }
        Some(b) => return Err(ServiceError::einval(format!("by: '{b}' is not 'health' or 'fabric'"))),
    }
    let r = if msg.topic == "resource.drain" { jc.drain(n, &ranks, reason, mode) } else { jc.undrain(n, &ranks) };
    r.map(|_| Some(json!({}).into())).map_err(ServiceError::einval)
}

/// `resource.eventlog`.
fn eventlog(core: &mut Broker, _msg: &Message, lazy: &Body<'_>) -> Reply {
    lazy.object()?;
    let jc = core.jobcore.as_ref().ok_or(ServiceError::enosys("not rank 0"))?;
    Ok(Some(json!({"eventlog": jc.resource_eventlog}).into()))
}

/// `resource.R`.
fn r(core: &mut Broker, _msg: &Message, lazy: &Body<'_>) -> Reply {
    lazy.object()?;
    let jc = core.jobcore.as_ref().ok_or(ServiceError::enosys("not rank 0"))?;
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

/// Rank `r`'s host name: as it registered, else as configured (`bootstrap.hosts`: a rank not joined since rank
/// 0 started), else empty.
fn host_of(core: &Broker, r: u32) -> String {
    match core.jobcore.as_ref().and_then(|jc| jc.pool.ranks.get(&r)) {
        Some(p) => p.hostname.clone(),
        None => core.opts.hosts.get(r as usize).cloned().unwrap_or_default(),
    }
}
