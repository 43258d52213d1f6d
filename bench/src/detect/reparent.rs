//! (g) re-parenting: a router's node silently lost, until its children are reachable from rank 0 again.
//!
//! Each trial brings up a fresh 7-node cluster with `tbon.topo=kary:2` (rank 1 routes for ranks 3 and 4; its
//! sibling is rank 2), takes t0, starts `netns-cluster.sh kill NAME 1` (link cut, then every process of the node
//! killed) and, while it runs, pings each orphan from rank 0 (`broker.ping`, one in flight per orphan, each given
//! [`PING_TIMEOUT_S`]) and polls rank 0's resource eventlog. Times, all on the same wall clock:
//!
//! - rank 0's lost verdict on rank 1: its `offline` event;
//! - each orphan's re-parent, recorded by rank 0: its `reparent` event; the event's `ms` (the orphan's own time
//!   from its verdict on rank 1 to its adoption) gives the orphan's own lost verdict, `reparent` − `ms` (early by
//!   the one hop from the adopter to rank 0);
//! - each orphan reachable again: the reply to the first ping that succeeds at or after its `reparent` event
//!   (rank 0 routes through the adopter from then on).
//!
//! The trial's figures are the later of the two orphans: reachable − t0 ("from the loss"), reachable − rank 0's
//! verdict, and, per orphan, reachable − its own verdict (the larger).

use super::{Cluster, Ctx, Mode, Series};
use crate::{now_epoch_s, r4};
use serde_json::{json, Value};
use std::cell::RefCell;
use std::time::{Duration, Instant};

/// The router whose node is lost, its children (the orphans) and their adopter under the rule (`reparent.rs`).
const ROUTER: u32 = 1;
const ORPHANS: [u32; 2] = [3, 4];
const ADOPTER: u32 = 2;
/// Nodes of each trial's cluster.
const NODES: usize = 7;
/// A ping to an orphan that has no answer by then is given up and sent again (one stuck in the dead router's
/// link would otherwise hide the orphan's return until rank 0 drops that link).
pub(super) const PING_TIMEOUT_S: f64 = 0.02;
/// Pause between two pings to one orphan.
const PING_GAP_S: f64 = 0.002;
/// How long a trial may take from the kill to both orphans reachable.
const TRIAL_TIMEOUT_S: f64 = 30.0;
/// Let a fresh cluster's probes settle (each child's kernel answered, group probes learned) before the kill.
const SETTLE_S: f64 = 0.5;

/// What the eventlog told so far: rank 0's lost verdict on the router, and each orphan's `reparent` (its time,
/// and the orphan's own time from its verdict to its adoption, s).
type Found = (Option<f64>, [Option<(f64, f64)>; 2]);

/// One mode's trials, and the series derived from them.
pub(super) struct Trials {
    /// Per-trial records (JSON).
    records: Vec<Value>,
    /// Why the measurement stopped early, if it did.
    error: Option<String>,
    /// Every rank's detectors in the first cluster, and whether every cluster ran the mode asked for.
    detectors: Value,
    mode_in_force: Option<bool>,
}

impl Trials {
    /// The series called `key` (`reparent_*` of the detect table): one sample per trial, seconds.
    pub(super) fn series(&self, key: &str) -> Series {
        let field = match key {
            "reparent_orphan_verdict_s" => "orphan_verdict_s",
            "reparent_reachable_s" => "reachable_s",
            "reparent_after_lost_verdict_s" => "reachable_after_lost_verdict_s",
            _ => "reachable_after_orphan_verdict_s",
        };
        Series {
            samples: self.records.iter().filter_map(|r| r[field].as_f64()).collect(),
            trials: if key == "reparent_reachable_s" { self.records.clone() } else { Vec::new() },
            error: self.error.clone(),
            detectors: self.detectors.clone(),
            mode_in_force: self.mode_in_force,
            ..Default::default()
        }
    }
}

/// Ping `rank` from rank 0 until told to stop; every successful reply's time goes into `replies`.
async fn pinger(c: &vigil::client::Client, rank: u32, replies: &RefCell<Vec<f64>>, stop: &RefCell<bool>) {
    let empty = json!({});
    while !*stop.borrow() {
        let ping = c.rpc("broker.ping", rank, &empty);
        if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs_f64(PING_TIMEOUT_S), ping).await {
            replies.borrow_mut().push(now_epoch_s());
        }
        tokio::time::sleep(Duration::from_secs_f64(PING_GAP_S)).await;
    }
}

/// One trial in a fresh cluster: the record with every time and the derived figures.
fn trial(ctx: &Ctx<'_>, mode: &Mode, s: &mut Trials) -> Result<Value, String> {
    let cl = Cluster::up(ctx, NODES, mode)?;
    if s.detectors.is_null() {
        s.detectors = cl.detectors.clone();
    }
    s.mode_in_force = Some(s.mode_in_force.unwrap_or(true) && cl.mode_in_force);
    std::thread::sleep(Duration::from_secs_f64(SETTLE_S));
    let t0 = now_epoch_s();
    // Started, not waited for: the orphans re-parent while the script still runs (it takes 0.1-0.2 s).
    let mut kill = std::process::Command::new(&cl.script)
        .args(["kill", &cl.name, &ROUTER.to_string()])
        .env("VIGIL", &cl.vigil)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("netns-cluster.sh kill: {e}"))?;
    let replies: [RefCell<Vec<f64>>; 2] = Default::default();
    let stop = RefCell::new(false);
    let found: RefCell<Found> = RefCell::new((None, [None, None]));
    let injected: RefCell<Option<f64>> = RefCell::new(None);
    let failure: RefCell<Option<String>> = RefCell::new(None);
    let client = cl.client();
    let deadline = Instant::now() + Duration::from_secs_f64(TRIAL_TIMEOUT_S);
    let watch = async {
        loop {
            if injected.borrow().is_none() && matches!(kill.try_wait(), Ok(Some(_))) {
                *injected.borrow_mut() = Some(now_epoch_s());
            }
            match client.rpc("resource.eventlog", 0, &json!({})).await {
                Ok(r) => {
                    let mut f = found.borrow_mut();
                    for e in r["eventlog"].as_array().into_iter().flatten() {
                        let ts = e["timestamp"].as_f64().unwrap_or(0.0);
                        let ids = e["context"]["idset"].as_str().unwrap_or("");
                        if ts < t0 {
                            continue;
                        }
                        if e["name"] == "offline" && ids == ROUTER.to_string() && f.0.is_none() {
                            f.0 = Some(ts);
                        }
                        for (i, o) in ORPHANS.iter().enumerate() {
                            if e["name"] == "reparent" && ids == o.to_string() && f.1[i].is_none() {
                                if e["context"]["parent"] != ADOPTER {
                                    *failure.borrow_mut() =
                                        Some(format!("rank {o} re-parented under {}, not {ADOPTER}", e["context"]));
                                }
                                f.1[i] = Some((ts, e["context"]["ms"].as_f64().unwrap_or(f64::NAN) / 1e3));
                            }
                        }
                    }
                }
                Err(e) => *failure.borrow_mut() = Some(format!("resource.eventlog: {e}")),
            }
            let done = {
                let f = found.borrow();
                let reached =
                    (0..2).all(|i| f.1[i].is_some_and(|(ts, _)| replies[i].borrow().iter().any(|r| *r >= ts)));
                (f.0.is_some() && reached && injected.borrow().is_some())
                    || failure.borrow().is_some()
                    || Instant::now() >= deadline
            };
            if done {
                *stop.borrow_mut() = true;
                return;
            }
            tokio::time::sleep(Duration::from_secs_f64(super::POLL_S)).await;
        }
    };
    ctx.rt.block_on(async {
        tokio::join!(
            watch,
            pinger(client, ORPHANS[0], &replies[0], &stop),
            pinger(client, ORPHANS[1], &replies[1], &stop)
        )
    });
    let status = kill.wait().map_err(|e| format!("netns-cluster.sh kill: {e}"))?;
    if !status.success() {
        return Err(format!("`netns-cluster.sh kill {} {ROUTER}` failed: {status}", cl.name));
    }
    if let Some(e) = failure.into_inner() {
        return Err(format!("cluster {}: {e}", cl.name));
    }
    let (offline, rp) = found.into_inner();
    let offline = offline.ok_or_else(|| format!("cluster {}: no offline verdict on rank {ROUTER}", cl.name))?;
    let mut orphans = Vec::new();
    for (i, o) in ORPHANS.iter().enumerate() {
        let (ts, took) = rp[i].ok_or_else(|| format!("cluster {}: rank {o} did not re-parent", cl.name))?;
        let reach = replies[i].borrow().iter().copied().find(|r| *r >= ts);
        let reach = reach.ok_or_else(|| format!("cluster {}: rank {o} re-parented but never answered", cl.name))?;
        orphans.push((*o, ts, took, reach));
    }
    let reachable = orphans.iter().map(|o| o.3).fold(f64::MIN, f64::max);
    let verdict = orphans.iter().map(|o| o.1 - o.2).fold(f64::MIN, f64::max);
    let after_own = orphans.iter().map(|o| o.3 - (o.1 - o.2)).fold(f64::MIN, f64::max);
    // Why rank 0 found the router lost (which rule: kernel probes or TCP), for the record.
    let reason = ctx
        .rt
        .block_on(client.rpc("resource.status", 0, &json!({})))
        .ok()
        .and_then(|v| v["ranks"].as_array().and_then(|a| a.get(ROUTER as usize)).map(|r| r["reason"].clone()))
        .unwrap_or(Value::Null);
    Ok(json!({
        "cluster": cl.name, "t0": t0, "inject_s": injected.into_inner().map(|t| r4(t - t0)),
        "offline_ts": offline, "lost_verdict_s": r4(offline - t0), "lost_reason": reason,
        "orphans": orphans.iter().map(|(o, ts, took, reach)| json!({
            "rank": o, "reparent_ts": ts, "reparent_ms": r4(took * 1e3), "reachable_ts": reach,
            "own_verdict_s": r4(ts - took - t0), "reachable_s": r4(reach - t0),
        })).collect::<Vec<_>>(),
        "orphan_verdict_s": r4(verdict - t0),
        "reattached_s": r4(orphans.iter().map(|o| o.1).fold(f64::MIN, f64::max) - t0),
        "reachable_s": r4(reachable - t0),
        "reachable_after_lost_verdict_s": r4(reachable - offline),
        "reachable_after_orphan_verdict_s": r4(after_own),
    }))
}

/// `trials` trials of (g) in `mode` (each in a fresh cluster of [`NODES`] nodes shaped `kary:2`).
pub(super) fn measure(ctx: &Ctx<'_>, mode: &Mode, trials: usize) -> Trials {
    let mut kary = mode.clone();
    kary.broker_args.push("--setattr=tbon.topo=kary:2".into());
    let mut s = Trials { records: Vec::new(), error: None, detectors: Value::Null, mode_in_force: None };
    while s.records.len() < trials && s.error.is_none() {
        match trial(ctx, &kary, &mut s) {
            Ok(r) => s.records.push(r),
            Err(e) => s.error = Some(e),
        }
    }
    s
}
