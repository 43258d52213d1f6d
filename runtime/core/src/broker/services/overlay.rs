//! The `overlay` service, rank 0 only: the verdicts of the judges (torpid, lively, lost, offline), re-parents,
//! the links' transports, and `vigil overlay status`.

use super::*;
use crate::broker::core::MemberState;
use tracing::{debug, warn};

/// Topics of the `overlay` service: and their handlers (who may call each: `broker/access.rs`).
pub(super) const TOPICS: &[Topic] = &[
    Topic { name: "overlay.torpid", handler: torpid_or_lively },
    Topic { name: "overlay.lively", handler: torpid_or_lively },
    Topic { name: "overlay.lost", handler: lost_or_offline },
    Topic { name: "overlay.offline", handler: lost_or_offline },
    Topic { name: "overlay.reparent", handler: reparent },
    Topic { name: "overlay.status", handler: status },
    Topic { name: "overlay.transport", handler: transport },
];

/// An `overlay.torpid` or `overlay.lively` request: a judge's verdict (a parent's, on its children) that ranks
/// stopped answering in time, or answer again (Flux's torpid brokers, `tbon.torpid_max`).
#[derive(Debug, Deserialize)]
struct TorpidRequest {
    /// The ranks judged, an idset of ranks of this instance.
    ranks: String,
    /// Why, for `vigil overlay status` (torpid only); empty when absent.
    reason: Option<String>,
}

/// `overlay.torpid` and `overlay.lively`.
fn torpid_or_lively(core: &mut Broker, msg: &Message, lazy: &Body<'_>) -> Reply {
    let req: TorpidRequest = lazy.decode()?;
    let n = core.wall();
    let size = core.opts.size;
    let reported = parse_instance_ranks(&req.ranks, size)?;
    let reason = req.reason.unwrap_or_default();
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
        for d in core.opts.config.topo.subtree(core.opts.size, r).into_iter().filter(|d| *d != r) {
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

/// An `overlay.lost` or `overlay.offline` request: ranks lost (a judge's verdict: gone without a goodbye) or
/// offline (left, or not started). A loss notice also carries `parent` (the judge) and `again` (sent again after
/// its judge re-parented), which `Broker::stale_lost_notice` reads from the payload: a malformed one only makes
/// the notice count as fresh.
#[derive(Debug, Deserialize)]
struct LostRequest {
    /// The ranks, an idset of ranks of this instance.
    ranks: String,
    /// Why; empty when absent.
    reason: Option<String>,
    /// The rank whose loss cut off the others (the root of the lost subtree), if one of `ranks`.
    root: Option<u32>,
}

/// `overlay.lost` and `overlay.offline`.
fn lost_or_offline(core: &mut Broker, msg: &Message, lazy: &Body<'_>) -> Reply {
    let req: LostRequest = lazy.decode()?;
    let body = lazy.object()?;
    let n = core.wall();
    let size = core.opts.size;
    let ranks = parse_instance_ranks(&req.ranks, size)?;
    let reason = req.reason.unwrap_or_default();
    // The root of a lost subtree has the reason; the ranks behind it are cut off by its loss.
    let root = req.root.filter(|r| ranks.contains(*r));
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

/// `overlay.reparent`: an orphan's new parent, reported by the orphan. Its fields (`rank`, `parent`, `lost`,
/// `again`) are read by `Broker::record_reparent` (reparent.rs), which checks each rank against the instance
/// with one message for a field missing, mistyped or out of range.
fn reparent(core: &mut Broker, _msg: &Message, lazy: &Body<'_>) -> Reply {
    let body = lazy.object()?;
    core.record_reparent(body).map_err(|(errno, message)| ServiceError { errno, message })?;
    Ok(Some(json!({}).into()))
}

/// The health of rank `root`'s subtree in an instance of `size` ranks, as `flux overlay status` names it: `lost`
/// or `offline` when `root` itself is; else `degraded` when a rank below it is lost or torpid, `partial` when one
/// is offline, and `full` when every one is online. `state(r)` is rank r's state as [`MemberState`] names it
/// (`online`, `torpid`, `offline`, `lost`), `children(r)` its current children; a rank is visited once, so a
/// shape that is not a tree cannot make it loop.
pub fn subtree_health<S: AsRef<str>>(
    root: u32,
    size: u32,
    state: impl Fn(u32) -> S,
    children: impl Fn(u32) -> Vec<u32>,
) -> &'static str {
    match state(root).as_ref() {
        "lost" => return "lost",
        "offline" => return "offline",
        _ => {}
    }
    let (mut degraded, mut partial) = (false, false);
    let mut seen = std::collections::BTreeSet::new();
    let mut stack = vec![root];
    while let Some(r) = stack.pop() {
        if r >= size || !seen.insert(r) {
            continue;
        }
        match state(r).as_ref() {
            "lost" | "torpid" => degraded = true,
            "offline" => partial = true,
            _ => {}
        }
        stack.extend(children(r));
    }
    if degraded {
        "degraded"
    } else if partial {
        "partial"
    } else {
        "full"
    }
}

/// An `overlay.status` request: `{}` for every rank's row, or `{"health": R}` for only the health of rank R's
/// subtree ([`subtree_health`]; `vigil overlay status --wait` asks it again and again, so it stays small).
#[derive(Debug, Deserialize)]
struct StatusRequest {
    /// The root of the subtree whose health alone is asked, below the instance size.
    health: Option<u32>,
}

/// `overlay.status`.
fn status(core: &mut Broker, _msg: &Message, lazy: &Body<'_>) -> Reply {
    let req: StatusRequest = lazy.decode()?;
    let size = core.opts.size;
    let topo = core.opts.config.topo;
    let jc = core.jobcore.as_ref().ok_or(ServiceError::enosys("not rank 0"))?;
    if let Some(root) = req.health {
        if root >= size {
            return Err(ServiceError::einval(format!("the instance has ranks 0-{}", size - 1)));
        }
        let state = |r: u32| core.members.get(&r).map_or(MemberState::Offline.name(), |m| m.0.name());
        let health = subtree_health(root, size, state, |r| core.children_of(r));
        return Ok(Some(json!({"size": size, "rank": root, "health": health}).into()));
    }
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
        "critical_ranks": crate::broker::reparent::critical_ranks(topo, size, core.opts.config.reparent).to_string(),
        "transport": core.links.summary(), "detectors": detectors(core), "security": super::broker::security(core),
        "ranks": ranks})
        .into(),
    ))
}

/// An `overlay.transport` request: a child's report of the transport of its parent link (rdma_link), for
/// `vigil overlay status`. It also carries `transport` (`rdma`, `ofi` or `tcp`) and `detail` (free text),
/// read by [`crate::broker::links::Links::on_report`].
#[derive(Debug, Deserialize)]
struct TransportRequest {
    /// The reporting child's rank, below the instance size.
    rank: u32,
}

/// `overlay.transport`.
fn transport(core: &mut Broker, _msg: &Message, lazy: &Body<'_>) -> Reply {
    let req: TransportRequest = lazy.decode()?;
    let body = lazy.object()?;
    let size = core.opts.size;
    // A child's report of its parent link (rdma_link), about a rank of this instance.
    if req.rank >= size {
        return Err(ServiceError::eproto(format!("'rank' must be below the instance size {size}")));
    }
    core.links.on_report(body).map_err(ServiceError::eproto)?;
    Ok(Some(json!({}).into()))
}

/// The start of the reason of a rank torpid because a router above it is: "... rank R" (`overlay.torpid`).
pub(crate) const BEHIND: &str = "unreachable behind torpid router rank";

#[cfg(test)]
mod tests {
    use super::subtree_health;

    /// Rank 0 with children 1 and 2; 1 with 3 and 4.
    fn health(states: [&'static str; 5], root: u32) -> &'static str {
        let children = |r: u32| match r {
            0 => vec![1, 2],
            1 => vec![3, 4],
            _ => vec![],
        };
        subtree_health(root, 5, |r| states[r as usize], children)
    }

    #[test]
    fn a_subtree_is_as_healthy_as_its_worst_rank() {
        let on = "online";
        assert_eq!(health([on; 5], 0), "full");
        assert_eq!(health([on, on, on, "offline", on], 0), "partial");
        assert_eq!(health([on, on, "offline", "torpid", on], 0), "degraded", "lost or torpid outweighs offline");
        assert_eq!(health([on, on, "lost", on, on], 1), "full", "only the subtree counts");
        assert_eq!(health([on, "lost", on, on, on], 1), "lost", "its root's own state");
        assert_eq!(health([on, "offline", on, on, on], 0), "partial");
        // A shape that is not a tree (a rank its own child) and out-of-range children end.
        assert_eq!(subtree_health(0, 2, |_| "online", |r| vec![r, r + 1, 7]), "full");
    }
}
