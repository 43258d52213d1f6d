//! Scenarios of the simulator and the invariants checked after each (see `vigil-bench sim`).
//!
//! - `boot`: every broker joins, then one job runs on all N nodes;
//! - `jobs`: 1000 jobs of random shapes run to completion;
//! - `churn`: while jobs run, silent node losses, 10 s broker stalls and broker crashes at random times (200, 50
//!   and 20 of them when the instance is large enough; fewer on small ones);
//! - `partition`: the link above a router (a leaf on a flat tree) is cut and healed.
//!
//! Invariants: every job ends; each fault gets the verdict the rules give it (a dead node or crashed broker is
//! lost, a stalled broker is never lost); critical-rank rules hold for every job (a job that lost a node has a
//! fatal exception, no other job has one); every client request gets a response, those to lost ranks an error;
//! jobs start in submission order (FCFS); once quiet, no broker believes a lost peer is there, and rank 0's view
//! of every rank matches what runs.

use super::{Config, Ev, Fault, Report, Sim};
use crate::broker::core::{MemberState, Time};
use crate::jobs::JobState;
use crate::jobspec::JobspecBuilder;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// A scenario of the simulator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    /// Every broker joins, then one job runs on all nodes.
    Boot,
    /// 1000 jobs of random shapes.
    Jobs,
    /// Jobs under silent node losses, broker stalls and crashes.
    Churn,
    /// A subtree cut off and healed.
    Partition,
}

impl std::str::FromStr for Scenario {
    type Err = String;
    /// `boot`, `jobs`, `churn` or `partition`.
    fn from_str(s: &str) -> Result<Scenario, String> {
        match s {
            "boot" => Ok(Scenario::Boot),
            "jobs" => Ok(Scenario::Jobs),
            "churn" => Ok(Scenario::Churn),
            "partition" => Ok(Scenario::Partition),
            _ => Err(format!("unknown scenario '{s}': expected boot, jobs, churn or partition")),
        }
    }
}

impl std::fmt::Display for Scenario {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Scenario::Boot => "boot",
            Scenario::Jobs => "jobs",
            Scenario::Churn => "churn",
            Scenario::Partition => "partition",
        })
    }
}

fn secs(s: f64) -> Time {
    Time::from_secs_f64(s)
}

/// When the instance must be up (every broker registered with rank 0), virtual seconds.
const BOOT_BY: f64 = 2.0;
/// Checkpoint: the instance is up.
const CHECK_BOOT: u32 = 1;

/// Run `scenario` on the instance `cfg` describes, check its invariants, and report.
pub fn run(cfg: Config, scenario: Scenario) -> Report {
    let mut sim = Sim::new(cfg.clone());
    sim.boot();
    sim.at(secs(BOOT_BY), Ev::Check(CHECK_BOOT));
    let n = cfg.brokers;
    let mut submits: Vec<u32> = Vec::new();
    let mut pings: Vec<u32> = Vec::new();
    let end = match scenario {
        Scenario::Boot => {
            let spec = JobspecBuilder::new(["sleep", "1"]).nnodes(n).ntasks(n);
            submits.push(submit_at(&mut sim, secs(BOOT_BY + 0.01), spec));
            BOOT_BY + 30.0
        }
        Scenario::Jobs => {
            for k in 0..1000 {
                let spec = random_job(&mut sim, job_nodes(n, 64).max(n.min(8)));
                submits.push(submit_at(&mut sim, secs(BOOT_BY + 0.01 + k as f64 * 0.002), spec));
            }
            BOOT_BY + 7200.0
        }
        Scenario::Churn => {
            let (losses, stalls, crashes) = fault_counts(n);
            let span = (BOOT_BY + 1.0, BOOT_BY + 31.0);
            // Distinct targets, never rank 0 (its loss ends the instance: the restart issue's business).
            let mut targets: Vec<u32> = (1..n).collect();
            debug_assert!((losses + stalls + crashes) as usize <= targets.len());
            let mut pick = |sim: &mut Sim| {
                let i = sim.rng.below(targets.len() as u64) as usize;
                targets.swap_remove(i)
            };
            for _ in 0..losses {
                let (r, t) = (pick(&mut sim), sim.rng.secs(span.0, span.1));
                sim.fault_at(secs(t), Fault::NodeLoss(r));
            }
            for _ in 0..stalls {
                let (r, t) = (pick(&mut sim), sim.rng.secs(span.0, span.1));
                sim.fault_at(secs(t), Fault::Stall(r, Duration::from_secs(10)));
            }
            for _ in 0..crashes {
                let (r, t) = (pick(&mut sim), sim.rng.secs(span.0, span.1));
                sim.fault_at(secs(t), Fault::Crash(r));
            }
            // Small jobs all along, so that the survivors can always run them; pings, some to ranks lost meanwhile.
            submits = jobs_along(&mut sim, 600, job_nodes(n, 4), 0.05);
            pings = pings_along(&mut sim, 300);
            BOOT_BY + 3600.0
        }
        Scenario::Partition => {
            // The first router below rank 0 (a leaf when the tree is flat), cut for 5 s.
            let r = if n > 1 { 1 } else { 0 };
            if r != 0 {
                sim.fault_at(secs(BOOT_BY + 1.0), Fault::Cut(r));
                sim.fault_at(secs(BOOT_BY + 6.0), Fault::Heal(r));
            }
            submits = jobs_along(&mut sim, 200, job_nodes(n, 8), 0.02);
            pings = pings_along(&mut sim, 100);
            BOOT_BY + 3600.0
        }
    };
    // Run in slices until every job is inactive (then 5 s more for the overlay to settle), or the end.
    let mut t = BOOT_BY;
    let mut quiet_since: Option<f64> = None;
    while t < end {
        t += 1.0;
        sim.run_until(secs(t));
        // Faults still to come, or a broker still stopped, are not quiet.
        let faults_done = !sim.pending_event(|e| matches!(e, Ev::Fault(_) | Ev::Resume(_)));
        let submitted = !sim.pending_event(|e| matches!(e, Ev::Client(_)));
        // Brokers shutting down (cut off from a lost parent) finish within their grace period first.
        let settled = sim.nodes.iter().all(|n| n.broker.as_deref().is_none_or(|b| b.shutting_down.is_none()));
        if faults_done && submitted && all_jobs_done(&sim) && sim.pending.is_empty() && settled {
            let q = *quiet_since.get_or_insert(t);
            if t - q >= 5.0 {
                break;
            }
        } else {
            quiet_since = None;
        }
    }
    check(&mut sim, scenario, &submits, &pings)
}

/// Silent node losses, stalls and crashes for an instance of `n` brokers: 200, 50 and 20 when it has room for
/// them among a quarter of its ranks other than rank 0; scaled down otherwise (none below 5 brokers: every fault
/// needs a distinct target, and rank 0 is never one).
fn fault_counts(n: u32) -> (u32, u32, u32) {
    let room = n.saturating_sub(1) / 4;
    if room >= 270 {
        (200, 50, 20)
    } else {
        let s = f64::from(room) / 270.0;
        let c = |x: f64| ((x * s).round() as u32).min(room);
        let (l, st, cr) = (c(200.0), c(50.0), c(20.0));
        // At least one of each once there is room for three.
        if room >= 3 {
            (l.max(1).min(room - 2), st.max(1), cr.max(1))
        } else {
            (room, 0, 0)
        }
    }
}

/// The largest job a scenario submits on `n` brokers with at most `cap` nodes: small enough that the nodes left
/// after its faults can still run it (strict FCFS: one job that cannot fit would hold every later one).
fn job_nodes(n: u32, cap: u32) -> u32 {
    cap.min((n / 8).max(1))
}

/// A job of 1..=max_nodes nodes, 1..=4 tasks per node, running 0.05..2 s.
fn random_job(sim: &mut Sim, max_nodes: u32) -> JobspecBuilder {
    let nodes = 1 + sim.rng.below(u64::from(max_nodes.max(1))) as u32;
    let per = 1 + sim.rng.below(u64::from(sim.cfg.cores.clamp(1, 4))) as u32;
    let dur = sim.rng.secs(0.05, 2.0);
    JobspecBuilder::new(["sleep".to_string(), format!("{dur:.3}")]).nnodes(nodes).ntasks(nodes * per)
}

/// `count` random jobs of at most `max_nodes` nodes, one every `every` seconds after boot; their matchtags.
fn jobs_along(sim: &mut Sim, count: u32, max_nodes: u32, every: f64) -> Vec<u32> {
    (0..count)
        .map(|k| {
            let spec = random_job(sim, max_nodes);
            submit_at(sim, secs(BOOT_BY + 0.01 + f64::from(k) * every), spec)
        })
        .collect()
}

/// `count` pings to random ranks, one every 100 ms from boot on (each must be answered); their matchtags.
fn pings_along(sim: &mut Sim, count: u32) -> Vec<u32> {
    let n = sim.cfg.brokers;
    (0..count)
        .map(|k| {
            let r = sim.rng.below(u64::from(n)) as u32;
            sim.request_at(secs(BOOT_BY + f64::from(k) * 0.1), "broker.ping", r, &serde_json::json!({}))
        })
        .collect()
}

fn submit_at(sim: &mut Sim, t: Time, spec: JobspecBuilder) -> u32 {
    let js = spec.build().expect("scenario jobspecs are valid").to_json();
    let v: serde_json::Value = serde_json::from_str(&js).expect("jobspec JSON");
    sim.request_at(t, "job-manager.submit", 0, &serde_json::json!({"jobspec": v}))
}

fn all_jobs_done(sim: &Sim) -> bool {
    sim.broker(0)
        .and_then(|b| b.jobcore.as_ref())
        .is_none_or(|jc| jc.jobs.values().all(|j| j.state == JobState::Inactive))
}

impl Sim {
    /// A scenario checkpoint.
    pub(super) fn check(&mut self, k: u32) {
        if k == CHECK_BOOT {
            let registered = self.broker(0).and_then(|b| b.jobcore.as_ref()).map_or(0, |jc| jc.pool.ranks.len());
            if registered as u32 != self.cfg.brokers {
                self.violations
                    .push(format!("boot: {registered} of {} brokers registered after {BOOT_BY} s", self.cfg.brokers));
            }
        }
    }
}

/// Check every invariant at the end of a run; the report.
fn check(sim: &mut Sim, scenario: Scenario, submits: &[u32], pings: &[u32]) -> Report {
    let mut v = std::mem::take(&mut sim.violations);
    let wall0 = super::WALL_ORIGIN;
    let Some(b0) = sim.broker(0) else {
        v.push("rank 0's broker is gone".into());
        return report(sim, scenario, v, (0, 0, 0), None);
    };
    let jc = b0.jobcore.as_ref().expect("rank 0 has the job core");
    // Faults: which ranks each took down, and when.
    let mut dead: BTreeMap<u32, Time> = BTreeMap::new(); // node loss or crash → the rank's own verdict
    let mut stalled: BTreeSet<u32> = BTreeSet::new();
    let mut stalled_at: BTreeMap<u32, Time> = BTreeMap::new();
    let mut lost_nodes: Vec<(u32, Time)> = Vec::new();
    // Ranks whose link to their parent was cut: a child of rank 0 has nowhere to re-parent.
    let cut: BTreeSet<u32> =
        sim.faults.iter().filter_map(|(_, f)| if let Fault::Cut(r) = f { Some(*r) } else { None }).collect();
    for &(t, f) in &sim.faults {
        match f {
            Fault::NodeLoss(r) => {
                dead.entry(r).or_insert(t);
                lost_nodes.push((r, t));
            }
            Fault::Crash(r) => {
                dead.entry(r).or_insert(t);
            }
            Fault::Stall(r, _) => {
                stalled.insert(r);
                stalled_at.entry(r).or_insert(t);
            }
            Fault::Cut(_) | Fault::Heal(_) => {}
        }
    }
    let (topo, size) = (sim.cfg.topo, sim.cfg.brokers);
    // An ancestor of `r` died or was stalled before `by`: `r` may be cut off before (or instead of) being judged
    // itself (a stalled parent judges nobody until it runs again).
    let ancestor_faulted = |r: u32, by: Time| {
        let mut p = topo.parent(size, r);
        while let Some(a) = p {
            if dead.get(&a).is_some_and(|t| *t <= by) || stalled_at.get(&a).is_some_and(|t| *t <= by) {
                return true;
            }
            p = topo.parent(size, a);
        }
        false
    };
    let member = |r: u32| b0.members.get(&r).cloned();
    // (1) A dead node or crashed broker is lost (on its own account unless an ancestor went first).
    let mut detect = Vec::new();
    for (&r, &t) in &dead {
        match member(r) {
            Some((MemberState::Lost, why, since)) => {
                let verdict = Time::from_secs_f64(since - wall0);
                if !ancestor_faulted(r, verdict) && why.starts_with("cut off") {
                    v.push(format!("rank {r} was lost for an ancestor's loss ({why}) but died itself first"));
                }
                if lost_nodes.iter().any(|(x, _)| *x == r) && !why.starts_with("cut off") {
                    detect.push(((since - wall0) - t.as_secs_f64()) * 1e3);
                }
            }
            other => v.push(format!("rank {r} died (fault at {:.3} s) but rank 0 has it {:?}", t.as_secs_f64(), other)),
        }
    }
    // (2) A stalled broker is never lost on its own account.
    for &r in &stalled {
        if let Some((MemberState::Lost, why, _)) = member(r) {
            if !why.starts_with("cut off") && !dead.contains_key(&r) {
                v.push(format!("stalled rank {r} was lost: {why}"));
            }
        }
    }
    // (3) Every job ended; critical-rank rules: a job lost a node iff it has a fatal exception of that kind.
    let (mut jobs, mut ok, mut failed) = (0, 0, 0);
    let lost_at = |r: u32| match member(r) {
        Some((MemberState::Lost, _, since)) => Some(since),
        _ => None,
    };
    for j in jc.jobs.values() {
        jobs += 1;
        if j.state != JobState::Inactive {
            let why = jc.pending_reason(j.id).map(|r| format!(" ({r})")).unwrap_or_default();
            v.push(format!("job {} never ended: {:?}{why}", j.id, j.state));
            continue;
        }
        // A node of the job was lost while it ran (its shell there may have finished just before: then the job
        // completes normally).
        // With re-parenting, a router lost above one of its nodes also counts: a shell being started through it
        // then cannot be known to have started.
        let on_the_way = |r: u32, a: f64, b: f64| {
            let mut p = if sim.cfg.reparent { topo.parent(size, r) } else { None };
            while let Some(x) = p {
                if lost_at(x).is_some_and(|t| t >= a && t <= b) {
                    return true;
                }
                p = topo.parent(size, x);
            }
            false
        };
        // Or the router its shell's start went through (named in the exception), lost meanwhile.
        let via = j.fatal.as_ref().and_then(|e| {
            let tail = e.note.split("through rank ").nth(1)?;
            tail.split(|c: char| !c.is_ascii_digit()).next()?.parse::<u32>().ok()
        });
        let touched = match (j.t_run, j.t_inactive) {
            (Some(a), Some(b)) => {
                j.alloc.iter().any(|x| lost_at(x.rank).is_some_and(|t| t >= a && t <= b) || on_the_way(x.rank, a, b))
                    || (sim.cfg.reparent && via.and_then(lost_at).is_some_and(|t| t >= a - 1.0 && t <= b))
            }
            _ => false,
        };
        match (&j.fatal, touched) {
            (Some(e), true) if e.severity == 0 => failed += 1,
            (Some(e), _) => {
                failed += 1;
                v.push(format!(
                    "job {} got exception {} (severity {}, {}) though none of its nodes was lost",
                    j.id, e.kind, e.severity, e.note
                ));
            }
            (None, _) if j.status == Some(0) => ok += 1,
            (None, touched) => v.push(format!(
                "job {} ended with status {:?} and no exception{}",
                j.id,
                j.status,
                if touched { " though it lost a node" } else { "" }
            )),
        }
    }
    // (4) Every request answered; submissions accepted.
    for (tag, (topic, node, t)) in &sim.pending {
        v.push(format!("request {tag} '{topic}' to rank {node} (sent at {:.3} s) never answered", t.as_secs_f64()));
    }
    for tag in submits {
        if let Some((e, p)) = sim.responses.get(tag) {
            if *e != 0 {
                v.push(format!("submission {tag} refused: errno {e} {p}"));
            }
        }
    }
    for tag in pings {
        if let Some((e, _)) = sim.responses.get(tag) {
            if *e != 0 && *e != crate::message::errno::EHOSTUNREACH {
                v.push(format!("ping {tag} failed with errno {e}, not EHOSTUNREACH"));
            }
        }
    }
    // (5) FCFS: jobs allocated in submission order.
    let mut last: Option<(crate::jobs::JobId, f64)> = None;
    for j in jc.jobs.values() {
        if let Some(t) = j.t_run {
            if let Some((id, lt)) = last {
                if t < lt {
                    v.push(format!("job {} started at {t:.6} before earlier job {id} at {lt:.6} (FCFS)", j.id));
                }
            }
            last = Some((j.id, t));
        }
    }
    // (6) Quiet now: no broker holds a link to a rank that is gone, and rank 0's view matches what runs.
    for (r, node) in sim.nodes.iter().enumerate() {
        let r = r as u32;
        if let Some(b) = node.broker.as_deref() {
            for &c in b.children.keys() {
                if sim.nodes[c as usize].broker.is_none() {
                    v.push(format!("rank {r} still has child rank {c}, which is gone"));
                }
            }
        }
        let running = node.broker.is_some();
        match (running, member(r).map(|m| m.0)) {
            (true, Some(MemberState::Online | MemberState::Torpid)) | (false, Some(MemberState::Lost)) => {}
            (false, Some(MemberState::Offline)) if node.exit == Some(0) => {}
            (running, m) => v.push(format!(
                "rank {r}: broker {} but rank 0 has it {m:?} ({})",
                if running { "runs" } else { "is gone" },
                member(r).map(|m| m.1).unwrap_or_default()
            )),
        }
        // (7) With re-parenting, a broker whose node lives and whose process was not killed still runs: the
        // loss of a router above it cost it nothing.
        if sim.cfg.reparent && !running && node.kernel && !dead.contains_key(&r) && !cut.contains(&r) {
            v.push(format!("rank {r}: its node lives but its broker exited (code {:?})", node.exit));
        }
    }
    detect.sort_by(f64::total_cmp);
    let d = (!detect.is_empty()).then(|| (detect[detect.len() / 2], detect[detect.len() - 1]));
    report(sim, scenario, v, (jobs, ok, failed), d)
}

fn report(
    sim: &Sim,
    scenario: Scenario,
    violations: Vec<String>,
    jobs: (u64, u64, u64),
    d: Option<(f64, f64)>,
) -> Report {
    let mut faults = BTreeMap::new();
    for (_, f) in &sim.faults {
        let k = match f {
            Fault::NodeLoss(_) => "node_loss",
            Fault::Crash(_) => "crash",
            Fault::Stall(..) => "stall",
            Fault::Cut(_) => "cut",
            Fault::Heal(_) => "heal",
        };
        *faults.entry(k.to_string()).or_insert(0) += 1;
    }
    Report {
        brokers: sim.cfg.brokers,
        topo: sim.cfg.topo.to_string(),
        scenario: scenario.to_string(),
        seed: sim.cfg.seed,
        virtual_s: sim.now.as_secs_f64(),
        events: sim.events,
        trace: format!("{:016x}", sim.trace),
        ok: violations.is_empty(),
        violations,
        jobs: jobs.0,
        jobs_ok: jobs.1,
        jobs_failed: jobs.2,
        faults,
        loss_detect_ms: d,
    }
}
