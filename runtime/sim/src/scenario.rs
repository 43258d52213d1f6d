//! Scenarios of the simulator and the invariants checked after each (see `vigil-bench sim`).
//!
//! - `boot`: every broker joins, then one job runs on all N nodes;
//! - `jobs`: 1000 jobs of random shapes run to completion;
//! - `churn`: while jobs run, silent node losses, 10 s broker stalls and broker crashes at random times (200, 50
//!   and 20 of them when the instance is large enough; fewer on small ones);
//! - `partition`: the link above a level-1 router (a leaf on a flat tree) is cut and healed (that router, a child
//!   of rank 0, has nowhere to re-parent and exits; its children re-parent); later the link above a level-2
//!   router is cut for 1 s and healed, so that a whole subtree is isolated and must come back once the cut heals
//!   (the router itself, declared lost meanwhile, is refused by its candidates and exits; its children
//!   re-parent).
//!
//! Router loss and re-parenting (docs/failure-detection.md, "Re-parenting"), while small jobs run and rank 0's
//! client pings random ranks:
//! - `router-each`: every router (a rank other than 0 with children in `tbon.topo`) lost in turn, silently, level
//!   by level, at most [`EACH_PER_LEVEL`] per level (all of them at 1,024 brokers), each rebooted
//!   [`REBOOT_AFTER`] later (it returns as a leaf); siblings are lost [`EACH_SPACING`] apart;
//! - `routers-1pct`, `routers-5pct`: 1 % or 5 % of the routers (at least one) lost silently at random times over
//!   10 s, never rebooted;
//! - `router-adopter`: a router and the sibling its first orphan would be adopted by lost together;
//! - `reparent-loss`: a router lost, then three of its orphans' adopters lost while each orphan joins it: with
//!   the hello in flight, once accepted (the orphan's `overlay.reparent` on its way), once rank 0 recorded it;
//! - `router-flap`: a level-1 router's broker killed and restarted [`FLAPS`] times, 1 s down and 1 s up (every
//!   other time its whole node is lost silently and reboots).
//!
//! Rank 0's restarts (docs/statedir.md), with a state directory ([`Config::statedir`]):
//! - `restart`: `churn` (its faults kept [`QUIET_AROUND`] away from rank 0's outages), rank 0 drained, and rank
//!   0's broker killed [`RESTARTS`] times at seeded moments, alternately in a turn that changed its journal
//!   (before the commit: [`Fault::CrashInCommit`]) and between turns, each time started again on its store after
//!   a seeded [`OUTAGE`]. It is a scenario of its own rather than part of `churn` so that `churn`'s faults and
//!   figures stay those measured before (its fault times, job count and invariants are unchanged).
//!
//! Load (docs/failure-detection.md, "Confirmation"):
//! - `overload`: `churn`'s faults on a machine and network under [`OVERLOAD`]: congested links, starved nodes
//!   whose brokers and timers run late, half the nodes without a kernel responder. The same invariants: no live
//!   broker is ever declared lost, every dead one is.
//!
//! Invariants: every job ends; each fault gets the verdict the rules give it (a dead node or crashed broker is
//! lost, a stalled broker is never lost); critical-rank rules hold for every job (a job that lost a node has a
//! fatal exception, no other job has one: with re-parenting, only a job whose shell's start went through a
//! router lost meanwhile may fail for a node it does not run on); every client request gets a response, those to
//! lost ranks an error; jobs start in submission order (FCFS); once quiet, no broker believes a lost peer is
//! there, and rank 0's view of every rank matches what runs; no broker on a live node exits; with re-parenting,
//! no rank is ever declared lost unless it died or its own link was cut; no broker adopts past
//! `reparent::adopt_limit` (twice the fanout) nor ever holds more children than its static ones plus that limit
//! (a restarted static child is never refused), except rank 0's last resort: an orphan every live candidate
//! refused for capacity (`reparent.rs`, "Last resort"; counted as `last_resort`); every orphan that re-parents answers a ping from rank 0 within
//! [`REATTACH_BASE`] of its parent's loss, plus the candidate timeout for each candidate that never answered it;
//! and at the end every running broker answers a ping from rank 0. With a state directory, rank 0's restarts
//! lose, duplicate and hang no acknowledged job (see `restart_invariants`).

use super::{Config, Ev, Fault, ReparentFigures, Report, RestartFigures, Sim};
use crate::broker::core::{MemberState, Time};
use crate::broker::reparent::{adopt_limit, candidates};
use crate::idset::IdSet;
use crate::jobs::{Job, JobCore, JobId, JobState};
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
    /// Every router lost in turn, each rebooted once its orphans re-parented.
    RouterEach,
    /// 1 % of the routers lost silently at random times.
    Routers1Pct,
    /// 5 % of the routers lost silently at random times.
    Routers5Pct,
    /// A router and its first orphan's adoptive parent lost together.
    RouterAdopter,
    /// Adopters lost while orphans join them.
    ReparentLoss,
    /// A router's broker killed and restarted again and again.
    RouterFlap,
    /// `churn`, and rank 0's broker killed and restarted on its state directory [`RESTARTS`] times.
    Restart,
    /// `churn` on an overloaded machine and network ([`OVERLOAD`]).
    Overload,
}

/// Every scenario, by name: `(name, scenario)`.
pub const SCENARIOS: [(&str, Scenario); 12] = [
    ("boot", Scenario::Boot),
    ("jobs", Scenario::Jobs),
    ("churn", Scenario::Churn),
    ("partition", Scenario::Partition),
    ("router-each", Scenario::RouterEach),
    ("routers-1pct", Scenario::Routers1Pct),
    ("routers-5pct", Scenario::Routers5Pct),
    ("router-adopter", Scenario::RouterAdopter),
    ("reparent-loss", Scenario::ReparentLoss),
    ("router-flap", Scenario::RouterFlap),
    ("restart", Scenario::Restart),
    ("overload", Scenario::Overload),
];

/// The load of `overload`: every link queues up to 200 ms each way and loses 5 % of probes, replies and checks
/// (an overlay segment lost is resent 10-50 ms later); a fifth of the nodes (rank 0 among them if drawn) are
/// starved, their broker stopped up to 300 ms at a time (their kernel holding TCP ACKs meanwhile, their timers and
/// verdicts late); half the nodes answer probes from userspace, so their links are judged on TCP and confirmed.
pub const OVERLOAD: crate::Load = crate::Load {
    jitter: Duration::from_millis(200),
    loss: 0.05,
    starve: Duration::from_millis(300),
    starved_share: 0.2,
    userspace_share: 0.5,
};

impl Scenario {
    /// The router-loss scenarios (`vigil-bench sim --table` runs them with 1 ms links).
    pub const ROUTERS: [Scenario; 6] = [
        Scenario::RouterEach,
        Scenario::Routers1Pct,
        Scenario::Routers5Pct,
        Scenario::RouterAdopter,
        Scenario::ReparentLoss,
        Scenario::RouterFlap,
    ];
}

impl std::str::FromStr for Scenario {
    type Err = String;
    /// A name of [`SCENARIOS`].
    fn from_str(s: &str) -> Result<Scenario, String> {
        SCENARIOS.iter().find(|(n, _)| *n == s).map(|(_, x)| *x).ok_or_else(|| {
            let names: Vec<&str> = SCENARIOS.iter().map(|(n, _)| *n).collect();
            format!("unknown scenario '{s}': expected one of {}", names.join(", "))
        })
    }
}

impl std::fmt::Display for Scenario {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(SCENARIOS.iter().find(|(_, x)| x == self).map_or("?", |(n, _)| n))
    }
}

fn secs(s: f64) -> Time {
    Time::from_secs_f64(s)
}

/// When the instance must be up (every broker registered with rank 0), virtual seconds.
const BOOT_BY: f64 = 2.0;
/// Checkpoint: the instance is up.
const CHECK_BOOT: u32 = 1;
/// Checkpoint (again every `REJOIN_POLL` until it holds): every running broker registered with rank 0 again
/// after its restart.
pub(super) const CHECK_REJOIN: u32 = 2;

/// `restart`: how many times rank 0's broker is killed (and started again on its store).
pub const RESTARTS: u32 = 3;
/// `restart`: each outage of rank 0 lasts a seeded time in this range, virtual seconds.
pub const OUTAGE: (f64, f64) = (1.0, 5.0);
/// `restart`: no node is lost, no broker crashes and no broker is stopped from this long before rank 0 dies to
/// this long after it is back (seconds): a broker whose parent dies while rank 0 is away finds no adopter and
/// exits (docs/statedir.md, "Not covered"), and the orphans of a loss just before would be asking rank 0 to
/// adopt them. A broker stopped across a restart is kept out too: it registers again only when it runs, and if
/// its parent is lost before that its registration is lost with it (not resent after its re-parent: not
/// covered either, see docs/statedir.md).
pub const QUIET_AROUND: (f64, f64) = (1.0, 3.0);

/// How far an eventlog time may be from the instant it stands for, seconds: [`vigil_core::eventlog::Event::with_time`]
/// rounds to the microsecond, while a job's own times (`t_run`, `t_inactive`) are not rounded. A job that a rank's
/// loss ended at once has its `t_inactive` up to half a microsecond before the loss's `offline` event.
const STAMP: f64 = 1e-6;

/// Run `scenario` on the instance `cfg` describes, check its invariants, and report.
pub fn run(cfg: Config, scenario: Scenario) -> Report {
    run_with(cfg, scenario, |_| {})
}

/// [`run`], with `before_check` given the world once the run is over, just before its invariants are checked
/// (tests tamper with it to see that the checks fail).
pub(crate) fn run_with(cfg: Config, scenario: Scenario, before_check: impl FnOnce(&mut Sim)) -> Report {
    let mut cfg = cfg;
    if scenario == Scenario::Restart {
        cfg.statedir = true;
    }
    if scenario == Scenario::Overload {
        cfg.load = OVERLOAD;
    }
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
        Scenario::Churn | Scenario::Restart | Scenario::Overload => {
            let (losses, stalls, crashes) = fault_counts(n);
            let mut span = (BOOT_BY + 1.0, BOOT_BY + 31.0);
            // Rank 0's deaths (`restart`): seeded times, each outage seeded, alternately in a commit and between
            // turns; the windows around them get no node loss nor crash.
            let mut quiet: Vec<(f64, f64)> = Vec::new();
            if scenario == Scenario::Restart {
                // Jobs must be on nodes that outlive rank 0: its own shells die with it (docs/statedir.md).
                let drain = serde_json::json!({"ranks": "0", "reason": "rank 0 restarts"});
                sim.request_at(secs(BOOT_BY), "resource.drain", 0, &drain);
                let mut t = BOOT_BY + 2.0;
                for k in 0..RESTARTS {
                    let at = t + sim.rng.secs(0.0, 6.0);
                    let down = sim.rng.secs(OUTAGE.0, OUTAGE.1);
                    sim.fault_at(secs(at), if k % 2 == 0 { Fault::CrashInCommit(0) } else { Fault::Crash(0) });
                    sim.fault_at(secs(at + down), Fault::Restart(0));
                    quiet.push((at - QUIET_AROUND.0, at + down + QUIET_AROUND.1));
                    t = at + down + 2.0;
                }
                // Room after the last outage for faults (and whole stalls) too.
                span.1 = span.1.max(t + QUIET_AROUND.1 + 20.0);
            }
            // A fault at a time outside the quiet windows (lasting `len`: a stall must not overlap one either).
            let pick_time = |sim: &mut Sim, quiet: &[(f64, f64)], len: f64| {
                let mut t = sim.rng.secs(span.0, span.1);
                for _ in 0..10_000 {
                    if !quiet.iter().any(|&(a, b)| t <= b && t + len >= a) {
                        break;
                    }
                    t = sim.rng.secs(span.0, span.1);
                }
                t
            };
            // Distinct targets, never rank 0 (its loss ends the instance: the restart issue's business).
            let mut targets: Vec<u32> = (1..n).collect();
            debug_assert!((losses + stalls + crashes) as usize <= targets.len());
            let mut pick = |sim: &mut Sim| {
                let i = sim.rng.below(targets.len() as u64) as usize;
                targets.swap_remove(i)
            };
            for _ in 0..losses {
                let (r, t) = (pick(&mut sim), pick_time(&mut sim, &quiet, 0.0));
                sim.fault_at(secs(t), Fault::NodeLoss(r));
            }
            for _ in 0..stalls {
                let (r, t) = (pick(&mut sim), pick_time(&mut sim, &quiet, 10.0));
                sim.fault_at(secs(t), Fault::Stall(r, Duration::from_secs(10)));
            }
            for _ in 0..crashes {
                let (r, t) = (pick(&mut sim), pick_time(&mut sim, &quiet, 0.0));
                sim.fault_at(secs(t), Fault::Crash(r));
            }
            // Small jobs all along, so that the survivors can always run them; pings, some to ranks lost meanwhile.
            // (`restart`: for as long as its faults last.)
            let count = if quiet.is_empty() { 600 } else { ((span.1 - BOOT_BY) / 0.05).round().max(600.0) as u32 };
            submits = jobs_along(&mut sim, count, job_nodes(n, 4), 0.05);
            pings = pings_along(&mut sim, count / 2);
            BOOT_BY + 3600.0
        }
        Scenario::Partition => {
            // The first router below rank 0 (a leaf when the tree is flat), cut for 5 s.
            let r = if n > 1 { 1 } else { 0 };
            if r != 0 {
                sim.fault_at(secs(BOOT_BY + 1.0), Fault::Cut(r));
                sim.fault_at(secs(BOOT_BY + 6.0), Fault::Heal(r));
            }
            // Then a level-2 router (the first below rank 2 with children of its own), cut for 1 s: its subtree is
            // isolated; rank 0 declares the router lost, so once the cut heals its candidates refuse it (it must
            // restart to rejoin), it gives up, and its children re-parent.
            let deep = cfg.topo.children(n, 2).into_iter().find(|&q| !cfg.topo.children(n, q).is_empty());
            if let Some(q) = deep.filter(|_| n > 2) {
                sim.fault_at(secs(BOOT_BY + PARTITION2.0), Fault::Cut(q));
                sim.fault_at(secs(BOOT_BY + PARTITION2.1), Fault::Heal(q));
            }
            submits = jobs_along(&mut sim, 700, job_nodes(n, 8), 0.02);
            pings = pings_along(&mut sim, 160);
            BOOT_BY + 3600.0
        }
        Scenario::RouterEach => {
            let plan = router_each_plan(&cfg);
            for &(t, r) in &plan {
                sim.fault_at(secs(BOOT_BY + 1.0 + t), Fault::NodeLoss(r));
                sim.fault_at(secs(BOOT_BY + 1.0 + t + REBOOT_AFTER), Fault::Restart(r));
            }
            let span = 2.0 + plan.last().map_or(0.0, |p| p.0);
            submits = jobs_along(&mut sim, (span / 0.05) as u32, job_nodes(n, 4), 0.05);
            pings = pings_along(&mut sim, (span / 0.1) as u32);
            BOOT_BY + 3600.0 + span
        }
        Scenario::Routers1Pct | Scenario::Routers5Pct => {
            let mut routers = routers(&cfg);
            let frac = if scenario == Scenario::Routers1Pct { 0.01 } else { 0.05 };
            let count = ((routers.len() as f64 * frac).round() as usize).clamp(1, routers.len().max(1));
            for _ in 0..count.min(routers.len()) {
                let i = sim.rng.below(routers.len() as u64) as usize;
                let r = routers.swap_remove(i);
                let t = sim.rng.secs(BOOT_BY + 1.0, BOOT_BY + 11.0);
                sim.fault_at(secs(t), Fault::NodeLoss(r));
            }
            submits = jobs_along(&mut sim, 300, job_nodes(n, 4), 0.05);
            pings = pings_along(&mut sim, 150);
            BOOT_BY + 3600.0
        }
        Scenario::RouterAdopter => {
            // Rank 1 (a level-1 router) and the sibling its first orphan tries first, lost at the same moment.
            if let Some((r, o)) = first_router(&cfg) {
                let s = candidates(cfg.topo, n, o, r)[0];
                sim.fault_at(secs(BOOT_BY + 1.0), Fault::NodeLoss(r));
                sim.fault_at(secs(BOOT_BY + 1.0), Fault::NodeLoss(s));
            }
            submits = jobs_along(&mut sim, 100, job_nodes(n, 4), 0.05);
            pings = pings_along(&mut sim, 60);
            BOOT_BY + 3600.0
        }
        Scenario::ReparentLoss => {
            // Rank 1 lost; the adopters of its first three orphans die as each joins: 0.5, 2.5 and 10 link
            // latencies after the orphan asks (hello in flight; accepted, its report to rank 0 in flight; recorded).
            if let Some((r, _)) = first_router(&cfg) {
                sim.fault_at(secs(BOOT_BY + 1.0), Fault::NodeLoss(r));
                let lat = cfg.latency.as_secs_f64();
                let mut used = BTreeSet::from([r]);
                for (o, k) in cfg.topo.children(n, r).into_iter().zip([0.5, 2.5, 10.0]) {
                    let s = candidates(cfg.topo, n, o, r)[0];
                    if used.insert(s) && s != 0 {
                        let after = Duration::from_secs_f64(lat * k);
                        sim.triggers.push(super::Trigger { orphan: o, candidate: s, after, fault: Fault::NodeLoss(s) });
                    }
                }
            }
            submits = jobs_along(&mut sim, 100, job_nodes(n, 4), 0.05);
            pings = pings_along(&mut sim, 60);
            BOOT_BY + 3600.0
        }
        Scenario::RouterFlap => {
            if let Some((r, _)) = first_router(&cfg) {
                for k in 0..FLAPS {
                    let t = BOOT_BY + 1.0 + 2.0 * f64::from(k);
                    let down = if k % 2 == 0 { Fault::Crash(r) } else { Fault::NodeLoss(r) };
                    sim.fault_at(secs(t), down);
                    sim.fault_at(secs(t + 1.0), Fault::Restart(r));
                }
            }
            let span = 1.0 + 2.0 * f64::from(FLAPS);
            submits = jobs_along(&mut sim, (span / 0.05) as u32, job_nodes(n, 4), 0.05);
            pings = pings_along(&mut sim, (span / 0.1) as u32);
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
        // Rank 0 still expecting orphans to re-parent (it declares them lost after 30 s) is not quiet either.
        let settled = settled && sim.broker(0).is_none_or(|b| b.orphans.is_empty());
        if faults_done && submitted && all_jobs_done(&sim) && sim.pending.is_empty() && settled {
            let q = *quiet_since.get_or_insert(t);
            if t - q >= 5.0 {
                break;
            }
        } else {
            quiet_since = None;
        }
    }
    // Finally every running broker must answer a ping from rank 0.
    let t0 = sim.now();
    let running: Vec<u32> = (0..n).filter(|&r| sim.broker(r).is_some()).collect();
    let sweep: Vec<(u32, u32)> =
        running.into_iter().map(|r| (r, sim.request_at(t0, "broker.ping", r, &serde_json::json!({})))).collect();
    // (On a loaded machine the ping crosses the tree's queued links and starved brokers: allowed that much more.)
    sim.run_until(t0 + Duration::from_secs(2) + Duration::from_secs_f64(load_allowance(&sim.cfg)));
    before_check(&mut sim);
    check(&mut sim, scenario, &submits, &pings, &sweep)
}

/// How long an orphan may take to answer a ping from rank 0 again after its parent's loss, plus the candidate
/// timeout (500 ms, `reparent::CANDIDATE_TIMEOUT`) for each candidate it asked that never answered (dead, or cut
/// off). An orphan of a silently lost router notices on its own: its parent link's unacknowledged data reaches
/// `tbon.lost_timeout` (120 ms), sampled each 50 ms heartbeat, so 120-220 ms after the loss (a crash: at once);
/// a live candidate takes it in two link latencies, rank 0 hears in a few more, and the ping is one round trip.
/// A partitioned subtree is judged from the heal of the cut (plus one candidate timeout: its router may be
/// waiting out an attempt), an orphan or adopter stopped meanwhile from the end of its stall.
pub const REATTACH_BASE: Duration = Duration::from_millis(500);

/// `router-each`: two routers with the same parent are lost at least this many virtual seconds apart, and one
/// level starts this long after the last loss of the level above. An orphan notices its parent's loss within
/// about 220 ms and re-parents a few link latencies later, and the lost router is back by [`REBOOT_AFTER`]: each
/// loss is over before any loss its orphans' candidates (the router's siblings) or the rebooted router (its
/// parent) depend on.
pub const EACH_SPACING: f64 = 0.5;
/// `router-each`: the least time between two successive losses (routers with different parents).
pub const EACH_MIN_GAP: f64 = 0.02;
/// `router-each`: at most this many routers per level, evenly spread over the level's routers in rank order
/// (every one of them when the level has no more). All of them at 16,384 brokers would hold the whole instance
/// adopted: every simulated broker keeps rank 0's map of adoptions (as the real ones do), 16,384 entries each,
/// some GiB for the one process, and the run would last many virtual minutes.
pub const EACH_PER_LEVEL: usize = 64;
/// `router-each`: a lost router's node reboots this many virtual seconds after it died.
pub const REBOOT_AFTER: f64 = 0.3;
/// `router-flap`: how many times the router goes down (and comes back).
pub const FLAPS: u32 = 10;
/// `partition`: when the level-2 router's link is cut and healed, virtual seconds after boot. 1 s: the router
/// is still asking its candidates when the cut heals (each attempt waits out the candidate timeout meanwhile).
const PARTITION2: (f64, f64) = (8.0, 9.0);

/// The routers of the instance: every rank but 0 with children in the static tree, in rank order.
fn routers(cfg: &Config) -> Vec<u32> {
    (1..cfg.brokers).filter(|&r| !cfg.topo.children(cfg.brokers, r).is_empty()).collect()
}

/// `router-each`: when (seconds from the first loss) each router is lost. Level by level, at most
/// [`EACH_PER_LEVEL`] routers of each; within a level, round-robin over their parents so that siblings are
/// [`EACH_SPACING`] apart while routers of different parents follow each other closely.
fn router_each_plan(cfg: &Config) -> Vec<(f64, u32)> {
    let (topo, n) = (cfg.topo, cfg.brokers);
    let mut by_level: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for r in routers(cfg) {
        by_level.entry(topo.level(n, r)).or_default().push(r);
    }
    let mut plan = Vec::new();
    let mut t = 0.0;
    for (_, level) in by_level {
        let k = level.len().min(EACH_PER_LEVEL);
        let picked: Vec<u32> = (0..k).map(|i| level[i * level.len() / k]).collect();
        // Round-robin over parents: the i-th child of each parent, then the (i+1)-th...
        let mut kids: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
        for &r in &picked {
            kids.entry(topo.parent(n, r).unwrap_or(0)).or_default().push(r);
        }
        // One slot per parent and round: siblings are exactly a round (at least EACH_SPACING) apart.
        let gap = (EACH_SPACING / kids.len() as f64).max(EACH_MIN_GAP);
        let rounds = kids.values().map(Vec::len).max().unwrap_or(0);
        let mut last = t;
        for i in 0..rounds {
            for (j, v) in kids.values().enumerate() {
                if let Some(&r) = v.get(i) {
                    last = t + (i * kids.len() + j) as f64 * gap;
                    plan.push((last, r));
                }
            }
        }
        t = last + EACH_SPACING;
    }
    plan
}

/// The first router that is a child of rank 0, and its first child (`None` on a flat or tiny tree).
fn first_router(cfg: &Config) -> Option<(u32, u32)> {
    let r = cfg.topo.children(cfg.brokers, 0).into_iter().find(|&r| !cfg.topo.children(cfg.brokers, r).is_empty())?;
    Some((r, cfg.topo.children(cfg.brokers, r)[0]))
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
    sim.submit_at(t, v)
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
        if k == CHECK_REJOIN {
            let Some(b0) = self.broker(0) else { return };
            if self.client.restarts.last().is_none_or(|r| r.1.is_some()) {
                return;
            }
            let online =
                |r: u32| b0.members.get(&r).is_some_and(|m| matches!(m.0, MemberState::Online | MemberState::Torpid));
            // A stopped broker registers once it runs again, and so do those below it: not waited for.
            let stopped = |r: u32| {
                let mut x = Some(r);
                for _ in 0..64 {
                    let Some(q) = x.filter(|&q| q != 0) else { return false };
                    if self.nodes[q as usize].stopped_until.is_some() {
                        return true;
                    }
                    x = self.links.get(&q).map(|l| l.parent);
                }
                false
            };
            let all =
                (1..self.cfg.brokers).filter(|&r| self.nodes[r as usize].broker.is_some() && !stopped(r)).all(online);
            if all {
                let now = self.now;
                if let Some(r) = self.client.restarts.last_mut() {
                    r.1 = Some(now);
                }
            } else {
                self.after(super::REJOIN_POLL, Ev::Check(CHECK_REJOIN));
            }
        }
    }
}

/// Check every invariant at the end of a run; the report. `sweep`: the final pings from rank 0 to every running
/// broker, as (rank, matchtag).
fn check(sim: &mut Sim, scenario: Scenario, submits: &[u32], pings: &[u32], sweep: &[(u32, u32)]) -> Report {
    let mut v = std::mem::take(&mut sim.violations);
    let wall0 = super::WALL_ORIGIN;
    let Some(b0) = sim.broker(0) else {
        v.push("rank 0's broker is gone".into());
        return report(sim, scenario, v, (0, 0, 0), None, None);
    };
    let jc = b0.jobcore.as_ref().expect("rank 0 has the job core");
    // Faults: which ranks each took down, and when.
    let mut dead: BTreeMap<u32, Time> = BTreeMap::new(); // first node loss or crash of each rank
    let mut deaths: Vec<(u32, Time, bool)> = Vec::new(); // every one: (rank, when, silent node loss)
    let mut restarts: BTreeMap<u32, Vec<Time>> = BTreeMap::new();
    let mut stalled: BTreeSet<u32> = BTreeSet::new();
    let mut stalled_at: BTreeMap<u32, Time> = BTreeMap::new();
    // Ranks whose link to their parent was cut (a child of rank 0 has nowhere to re-parent), and when.
    let mut cut_at: BTreeMap<u32, Time> = BTreeMap::new();
    let mut heal_at: BTreeMap<u32, Time> = BTreeMap::new();
    for &(t, f) in &sim.faults {
        match f {
            // Rank 0's own deaths and restarts (with a state directory) are judged by the restart invariants.
            Fault::Crash(0) | Fault::CrashInCommit(0) | Fault::Restart(0) if sim.cfg.statedir => {}
            Fault::NodeLoss(r) | Fault::Crash(r) | Fault::CrashInCommit(r) => {
                dead.entry(r).or_insert(t);
                deaths.push((r, t, matches!(f, Fault::NodeLoss(_))));
            }
            Fault::Stall(r, _) => {
                stalled.insert(r);
                stalled_at.entry(r).or_insert(t);
            }
            Fault::Cut(r) => {
                cut_at.entry(r).or_insert(t);
            }
            Fault::Heal(r) => {
                heal_at.insert(r, t);
            }
            Fault::Restart(r) => restarts.entry(r).or_default().push(t),
        }
    }
    let cut: BTreeSet<u32> = cut_at.keys().copied().collect();
    // The first restart of `r` after `t`.
    let restart_after = |r: u32, t: Time| restarts.get(&r).and_then(|v| v.iter().copied().find(|x| *x > t));
    // Rank 0's verdicts, from resource.eventlog: rank → [(virtual s, reason)] of each time it was recorded lost.
    let mut lost_log: BTreeMap<u32, Vec<(f64, String)>> = BTreeMap::new();
    for e in &jc.resource_eventlog {
        if e.name != "offline" || e.context.get("state").and_then(|s| s.as_str()) != Some("lost") {
            continue;
        }
        let Some(ids) = e.context.get("idset").and_then(|s| s.as_str()).and_then(|s| s.parse::<IdSet>().ok()) else {
            continue;
        };
        let why = e.context.get("reason").and_then(|s| s.as_str()).unwrap_or("").to_string();
        for r in ids.iter() {
            lost_log.entry(r).or_default().push((e.timestamp - wall0, why.clone()));
        }
    }
    // Whether rank 0 recorded `r` lost within [a, b] (virtual seconds).
    // (Within a stamp's rounding: a job a loss ended at once has `t_inactive` just before the loss's stamp.)
    let lost_in = |r: u32, a: f64, b: f64| {
        lost_log.get(&r).is_some_and(|l| l.iter().any(|(t, _)| *t >= a - STAMP && *t <= b + STAMP))
    };
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
    // (1) A dead node or crashed broker is lost (on its own account unless an ancestor went first); one that was
    // restarted must have been recorded lost before it came back.
    let mut detect = Vec::new();
    for &(r, t, silent) in &deaths {
        if let Some(back) = restart_after(r, t) {
            let (a, b) = (t.as_secs_f64(), back.as_secs_f64());
            match lost_log.get(&r).and_then(|l| l.iter().find(|(x, _)| *x >= a && *x <= b)) {
                Some((x, why)) => {
                    if silent && !why.starts_with("cut off") {
                        detect.push((x - a) * 1e3);
                    }
                }
                None => v.push(format!(
                    "rank {r} died at {a:.3} s but was not recorded lost before its restart at {b:.3} s"
                )),
            }
            continue;
        }
        if deaths.iter().any(|&(x, u, _)| x == r && u > t) {
            continue; // it died again later: judged there
        }
        match member(r) {
            Some((MemberState::Lost, why, since)) => {
                let verdict = Time::from_secs_f64(since - wall0);
                if !ancestor_faulted(r, verdict) && why.starts_with("cut off") {
                    v.push(format!("rank {r} was lost for an ancestor's loss ({why}) but died itself first"));
                }
                if silent && !why.starts_with("cut off") {
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
    // (2b) No live broker is ever lost: a rank that never died, crashed nor had its link cut is never recorded lost
    // on its own account (a "cut off" verdict follows an ancestor's real loss, judged by (1)).
    for (r, log) in &lost_log {
        if dead.contains_key(r) || cut.contains(r) || stalled.contains(r) {
            continue; // judged by (1) and (2)
        }
        if let Some((t, why)) = log.iter().find(|(_, why)| !why.starts_with("cut off")) {
            v.push(format!("live rank {r} was lost at {t:.3} s: {why}"));
        }
    }
    // (3) Every job ended; critical-rank rules: a job lost a node iff it has a fatal exception of that kind.
    let (mut jobs, mut ok, mut failed) = (0, 0, 0);
    for j in jc.jobs.values() {
        jobs += 1;
        if j.state != JobState::Inactive {
            let why = jc.pending_reason(j.id).map(|r| format!(" ({r})")).unwrap_or_default();
            v.push(format!("job {} never ended: {:?}{why} ", j.id, j.state));
            continue;
        }
        // A node of the job was lost while it ran (its shell there may have finished just before: then the job
        // completes normally). With re-parenting, a router lost on the way to one of its nodes counts only if the
        // exception names it: a shell being started through it cannot be known to have started. A job whose
        // nodes all live gets no exception for a router lost above them: the orphans re-parent, and their
        // shells' reports wait in them.
        let via = j.fatal.as_ref().and_then(|e| {
            let tail = e.note.split("through rank ").nth(1)?;
            tail.split(|c: char| !c.is_ascii_digit()).next()?.parse::<u32>().ok()
        });
        let touched = match (j.t_run, j.t_inactive) {
            (Some(a), Some(b)) => {
                let (a, b) = (a - wall0, b - wall0);
                j.alloc.iter().any(|x| lost_in(x.rank, a, b))
                    || (sim.cfg.reparent && via.is_some_and(|x| lost_in(x, a - 1.0, b)))
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
    for &tag in submits {
        // A submission whose connection failed was sent again: its last attempt counts.
        let mut last = tag;
        while let Some(&again) = sim.client.retried.get(&last) {
            last = again;
        }
        if let Some((e, p)) = sim.responses.get(&last) {
            if *e != 0 {
                v.push(format!("submission {tag} refused: errno {e} {p}"));
            }
        }
    }
    for tag in pings {
        if let Some((e, _)) = sim.responses.get(tag) {
            if *e != 0 && *e != crate::message::errno::EHOSTUNREACH && !sim.client.conn_failed.contains_key(tag) {
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
    // (8) With re-parenting, only a rank that died or whose own link was cut is ever recorded lost: a router lost
    // above a rank costs it nothing (without re-parenting, its subtree is cut off with it).
    for (&r, verdicts) in &lost_log {
        for (t, why) in verdicts {
            let at = Time::from_secs_f64(*t);
            let died = deaths.iter().any(|&(x, u, _)| x == r && u <= at && restart_after(r, u).is_none_or(|b| b > at));
            let was_cut = cut_at.get(&r).is_some_and(|c| *c <= at);
            if died || was_cut || (!sim.cfg.reparent && ancestor_faulted(r, at)) {
                continue;
            }
            if !sim.cfg.reparent && cut.iter().any(|c| topo.subtree(size, *c).contains(&r)) {
                continue;
            }
            v.push(format!("rank {r} was recorded lost at {t:.3} s though it neither died nor was cut off: {why}"));
        }
    }
    // (9) No broker adopted past its limit (twice the fanout), and none ever had more children than its static
    // ones plus that limit (static children coming back after a restart are never refused), rank 0's last-resort
    // adoptees apart.
    for (r, c) in &sim.watch.over_limit {
        v.push(format!("rank {r} adopted a child with {c} children, past its limit {}", adopt_limit(topo, size, *r)));
    }
    for (r, c) in &sim.watch.over_bound {
        let bound = adopt_limit(topo, size, *r) + topo.children(size, *r).len();
        v.push(format!("rank {r} had {c} children, more than its bound {bound}"));
    }
    // (10) At the end every running broker answers a ping from rank 0.
    for &(r, tag) in sweep {
        match sim.responses.get(&tag) {
            Some((0, _)) => {}
            Some((e, body)) => {
                v.push(format!("rank {r} runs but a ping from rank 0 at the end failed: errno {e} {body}"))
            }
            None => v.push(format!("rank {r} runs but never answered a ping from rank 0 at the end")),
        }
    }
    // (11) Every orphan answers rank 0 again within REATTACH_BASE of its parent's loss, plus a candidate timeout
    // for each candidate that never answered it (from the heal of a cut, the end of a stall); figures.
    let fig = reparent_figures(sim, &deaths, &cut_at, &heal_at, &lost_log, &mut v);
    // (12) With a state directory: rank 0's restarts lost, duplicated, hung no acknowledged job.
    let restarts = restart_invariants(sim, jc, &lost_log, &mut v);
    detect.sort_by(f64::total_cmp);
    let d = (!detect.is_empty()).then(|| (detect[detect.len() / 2], detect[detect.len() - 1]));
    let mut r = report(sim, scenario, v, (jobs, ok, failed), d, fig);
    r.restarts = restarts;
    r
}

/// The submission a job is (`key=K` in its command, [`Sim::submit_at`]).
fn submission_key(j: &Job) -> Option<u32> {
    let spec = j.jobspec();
    let cmd = spec.pointer("/tasks/0/command")?.as_array()?;
    cmd.iter().find_map(|a| a.as_str()?.strip_prefix("key=")?.parse().ok())
}

/// Invariant (12), with a state directory (`restart`), and its figures. Acknowledged means answered with an id:
/// - every acknowledged job is in rank 0's final job core, under its own submission (lost: absent; an id given
///   to two submissions: another's), and INACTIVE (none hung);
/// - no submission is in the core twice (duplicated), none acknowledged twice, and every one is acknowledged in
///   the end (the client sends a submission again, with its submission key, when its connection failed: refused
///   while rank 0 was down, or reset with the request in flight; rank 0 answers one whose job it made already
///   with that job, `"duplicate": true`);
/// - job ids acknowledged only go up (an id is never given again, across restarts), a duplicate's apart (its
///   id is its job's, given when the first request made it);
/// - a job running when rank 0 died, whose outage `tbon.parent_grace` covered, completes with its real exit
///   status (0 here) unless one of its nodes was lost meanwhile: no `restart` exception, no other;
/// - a job that completed without an exception has a `start` before its `finish`.
fn restart_invariants(
    sim: &Sim,
    jc: &JobCore,
    lost_log: &BTreeMap<u32, Vec<(f64, String)>>,
    v: &mut Vec<String>,
) -> Option<RestartFigures> {
    if !sim.cfg.statedir {
        return None;
    }
    let (c, wall0) = (&sim.client, super::WALL_ORIGIN);
    let mut by_key: BTreeMap<u32, Vec<JobId>> = BTreeMap::new();
    for j in jc.jobs.values() {
        match submission_key(j) {
            Some(k) => by_key.entry(k).or_default().push(j.id),
            None => v.push(format!("job {} in rank 0's job core is no submission of the client's", j.id)),
        }
    }
    for (k, ids) in &by_key {
        if ids.len() > 1 {
            let ids: Vec<String> = ids.iter().map(ToString::to_string).collect();
            v.push(format!("submission {k} is in rank 0's job core {} times: {}", ids.len(), ids.join(", ")));
        }
    }
    let mut acked = BTreeSet::new();
    let mut highest: Option<JobId> = None;
    for &(key, id, t, duplicate) in &c.acked {
        let t = t.as_secs_f64();
        if !acked.insert(key) {
            v.push(format!("submission {key} acknowledged twice (again as job {id} at {t:.3} s)"));
        }
        // A duplicate's id is its job's, given when the first request made it (that answer was lost): not new.
        if let Some(h) = highest.filter(|h| id <= *h && !duplicate) {
            v.push(format!("job id {id} acknowledged at {t:.3} s is not above {h}, acknowledged before it"));
        }
        if !duplicate {
            highest = highest.max(Some(id));
        }
        match jc.jobs.get(&id) {
            None => v.push(format!(
                "acknowledged job {id} (submission {key}, at {t:.3} s) is lost: not in rank 0's job core"
            )),
            Some(j) if submission_key(j) != Some(key) => v.push(format!(
                "acknowledged job {id} of submission {key} is submission {:?}'s in rank 0's job core",
                submission_key(j)
            )),
            Some(j) if j.state != JobState::Inactive => {
                v.push(format!("acknowledged job {id} (submission {key}) hung: {:?} at the end", j.state))
            }
            // Its tasks ran and it ended without an exception: its eventlog says it started, before it finished
            // (a `start` rank 0 read but had not written when it died is rebuilt at re-attach).
            Some(j) if j.fatal.is_none() && j.status.is_some() => {
                let names: Vec<&str> = j.eventlog.iter().map(|e| e.name.as_str()).collect();
                let at = |n: &str| names.iter().rposition(|x| *x == n);
                if !matches!((at("start"), at("finish")), (Some(s), Some(f)) if s < f) {
                    v.push(format!(
                        "job {id} (submission {key}) completed without a start before its finish: {names:?}"
                    ));
                }
            }
            Some(_) => {}
        }
    }
    let acked_ids: BTreeSet<JobId> = c.acked.iter().map(|a| a.1).collect();
    let keys: BTreeSet<u32> = c.submits.values().map(|(k, _)| *k).collect();
    for k in keys.difference(&acked) {
        v.push(format!("submission {k} was never acknowledged"));
    }
    // Jobs running when rank 0 died; the i-th restart follows the i-th death.
    let (mut running, mut ok, mut failed) = (BTreeSet::new(), 0, 0);
    for (i, (t, _, ids)) in c.crashes.iter().enumerate() {
        let back = c.restarts.get(i).map(|r| r.0);
        let covered = back.is_some_and(|b| b.since(*t).as_secs_f64() < super::PARENT_GRACE);
        for &id in ids {
            // A job started in the turn a death in a commit cut short was never acknowledged: not kept.
            if !acked_ids.contains(&id) || !running.insert(id) {
                continue; // (or judged at the first death it lived through)
            }
            let Some(j) = jc.jobs.get(&id) else { continue }; // reported above if it was acknowledged
            let (a, b) = (j.t_run.map_or(0.0, |x| x - wall0), j.t_inactive.map_or(f64::MAX, |x| x - wall0));
            let lost =
                |r: u32| lost_log.get(&r).is_some_and(|l| l.iter().any(|(u, _)| *u >= a - STAMP && *u <= b + STAMP));
            let touched = j.alloc.iter().any(|x| lost(x.rank));
            match (&j.fatal, j.status) {
                (None, Some(0)) => ok += 1,
                (Some(_), _) if touched || !covered => failed += 1,
                (e, status) => v.push(format!(
                    "job {id}, running when rank 0 died at {:.3} s, ended with status {status:?} and exception {} \
                     though none of its nodes was lost",
                    t.as_secs_f64(),
                    e.as_ref().map_or("none".to_string(), |e| format!("{} ({})", e.kind, e.note))
                )),
            }
        }
    }
    let outages: Vec<f64> =
        c.crashes.iter().zip(&c.restarts).map(|((t, ..), (b, _))| b.since(*t).as_secs_f64()).collect();
    let mut rejoin: Vec<f64> =
        c.restarts.iter().filter_map(|(t, done)| done.map(|d| d.since(*t).as_secs_f64() * 1e3)).collect();
    if rejoin.len() < c.restarts.len() {
        v.push(format!(
            "only {} of rank 0's {} restarts saw every running broker register again",
            rejoin.len(),
            c.restarts.len()
        ));
    }
    rejoin.sort_by(f64::total_cmp);
    Some(RestartFigures {
        restarts: c.restarts.len() as u32,
        in_commit: c.crashes.iter().filter(|x| x.1).count() as u32,
        outage_s: (outages.iter().copied().fold(f64::INFINITY, f64::min), outages.iter().copied().fold(0.0, f64::max)),
        rejoin_ms: (!rejoin.is_empty()).then(|| (quantile(&rejoin, 0.5), rejoin[rejoin.len() - 1])),
        acknowledged: c.acked.len() as u64,
        duplicates: c.acked.iter().filter(|a| a.3).count() as u64,
        retried: c.retried.keys().filter(|t| c.conn_failed.contains_key(t)).count() as u64,
        retried_eagain: c.retried.keys().filter(|t| !c.conn_failed.contains_key(t)).count() as u64,
        running_at_crash: running.len() as u64,
        reattached_ok: ok,
        reattached_failed: failed,
    })
}

/// The `q` quantile of sorted `x` (nearest rank).
fn quantile(x: &[f64], q: f64) -> f64 {
    if x.is_empty() {
        return f64::NAN;
    }
    let i = ((q * x.len() as f64).ceil() as usize).clamp(1, x.len()) - 1;
    x[i]
}

/// (median, p99, max) of `x` (sorted here).
fn spread(x: &mut [f64]) -> Option<(f64, f64, f64)> {
    x.sort_by(f64::total_cmp);
    (!x.is_empty()).then(|| (quantile(x, 0.5), quantile(x, 0.99), x[x.len() - 1]))
}

/// Under [`crate::Load`], what invariant (11)'s bound allows more (seconds): the orphan's verdict waits for its
/// parent's probe patience (1.5 times the longest round trip, `vigil_core::probe`), or, where its parent answers
/// probes from userspace, for the TCP rule and its check, each the link's round trip bound at least and longer
/// while the orphan runs late (twice that, `broker/confirm.rs`); then its re-parent and rank 0's ping cross the
/// tree's depth twice on queued links, each hop through a broker that may be starved. 0 on a quiet machine. It
/// catches an orphan that does not come back, not a slow one: the figures say how long they took.
fn load_allowance(cfg: &crate::Config) -> f64 {
    if !cfg.load.any() {
        return 0.0;
    }
    let one_way = (cfg.latency + cfg.load.jitter).as_secs_f64();
    let rtt_bound = 2.0 * cfg.latency.as_secs_f64() + 2.5 * cfg.load.jitter.as_secs_f64();
    let verdict = (1.5 * 2.0 * one_way).max(2.0 * 2.0 * rtt_bound);
    let hops = f64::from(2 * cfg.topo.depth(cfg.brokers) + 2);
    verdict + hops * (one_way + cfg.load.starve.as_secs_f64())
}

/// Invariant (11) and the re-parenting figures: for each re-parent rank 0 recorded, the fault that made the
/// orphan look for a parent, and when the orphan next answered a ping from rank 0.
fn reparent_figures(
    sim: &Sim,
    deaths: &[(u32, Time, bool)],
    cut_at: &BTreeMap<u32, Time>,
    heal_at: &BTreeMap<u32, Time>,
    lost_log: &BTreeMap<u32, Vec<(f64, String)>>,
    v: &mut Vec<String>,
) -> Option<ReparentFigures> {
    let done = &sim.watch.done;
    let timeout = crate::broker::reparent::CANDIDATE_TIMEOUT.as_secs_f64();
    let (topo, size, b0) = (sim.cfg.topo, sim.cfg.brokers, sim.broker(0));
    let (mut from_loss, mut from_verdict, mut from_orphan, mut to_orphan) = (vec![], vec![], vec![], vec![]);
    // Per fault (lost rank, when): the last of its orphans' answers.
    let mut per_loss: BTreeMap<(u32, Time), f64> = BTreeMap::new();
    let mut max_attempts = 0;
    for (i, rec) in done.iter().enumerate() {
        if sim.cfg.statedir && rec.lost == 0 {
            continue; // a broker rank 0 had adopted, back with it after its restart: the restart invariants'
        }
        max_attempts = max_attempts.max(rec.attempts);
        let asked = rec.asked.unwrap_or(rec.recorded);
        // Its next successful answer to rank 0, from this re-parent on (a later re-parent's, if its new parent
        // was lost too before the ping came back), and the candidates that never answered it until then.
        let mut timeouts = 0;
        let mut answered = None;
        for x in done[i..].iter().filter(|x| x.rank == rec.rank) {
            timeouts += x.timeouts;
            if x.answered.is_some() {
                answered = x.answered;
                break;
            }
        }
        let Some(answered) = answered else {
            // The orphan died itself before it could answer (on queued links rank 0's ping may take a while).
            if deaths.iter().any(|&(r, t, _)| r == rec.rank && t >= asked) {
                continue;
            }
            v.push(format!(
                "rank {} re-parented under rank {} at {:.3} s but never answered rank 0 after",
                rec.rank,
                rec.parent,
                rec.recorded.as_secs_f64()
            ));
            continue;
        };
        let bound = REATTACH_BASE.as_secs_f64() + f64::from(timeouts) * timeout + load_allowance(&sim.cfg);
        let late = |from: Time, bound: f64| {
            let took = answered.since(from).as_secs_f64();
            (took > bound).then_some(took * 1e3)
        };
        let fault = deaths
            .iter()
            .filter(|&&(r, t, _)| r == rec.lost && t <= asked)
            .map(|&(_, t, _)| t)
            .chain(cut_at.get(&rec.lost).copied().filter(|t| *t <= asked))
            .max();
        let Some(fault) = fault else {
            // Its own link was cut: it can re-attach once the cut heals (its attempt then may still be waiting
            // for a candidate timeout).
            if cut_at.get(&rec.rank).is_some_and(|c| *c <= asked) {
                let healed = heal_at.get(&rec.rank).copied().unwrap_or(Time::ZERO);
                if let Some(ms) = late(healed, bound + timeout) {
                    v.push(format!("rank {} answered rank 0 {ms:.0} ms after its cut link healed", rec.rank));
                }
            } else {
                v.push(format!(
                    "rank {} re-parented (lost rank {}) though rank {} neither died nor was cut off",
                    rec.rank, rec.lost, rec.lost
                ));
            }
            continue;
        };
        // A stopped orphan re-parents only once it runs again, and for as long again after it does, it judges no
        // peer lost on unacknowledged TCP data alone (`Membership::grace`: how it notices a silent parent); a
        // stopped adopter answers once it runs. Those are the stall rules' business (never lost), not
        // re-parenting's: such re-parents are judged from the end of the stall (and its grace), and left out of
        // the figures.
        // So does a stopped broker above the adopter (its report and rank 0's ping wait in it): the adopter's
        // ancestors, in rank 0's last view and in the static tree.
        let mut above = BTreeSet::new();
        for static_tree in [false, true] {
            let mut x = Some(rec.parent);
            while let Some(a) = x.filter(|&a| a != 0 && above.len() < 64) {
                above.insert(a);
                x = if static_tree { topo.parent(size, a) } else { b0.and_then(|b| b.parent_of(a)) };
            }
        }
        let stall_end = sim
            .faults
            .iter()
            .filter_map(|&(t, f)| match f {
                Fault::Stall(r, d) if r == rec.rank && t <= answered && t + d * 2 >= fault => Some(t + d * 2),
                Fault::Stall(r, d) if above.contains(&r) && t <= answered && t + d >= fault => Some(t + d),
                _ => None,
            })
            .max();
        if let Some(end) = stall_end {
            if let Some(ms) = late(end.max(fault), bound) {
                v.push(format!("rank {} answered rank 0 {ms:.0} ms after a stall (and its grace) ended", rec.rank));
            }
            continue;
        }
        let took = answered.since(fault).as_secs_f64();
        // A parent that was cut off, not dead, lets its children go only once it gives up (its candidates time
        // out while the cut lasts, and refuse it once it has healed: rank 0 declared it lost).
        let healed =
            heal_at.get(&rec.lost).filter(|h| cut_at.get(&rec.lost).is_some_and(|c| *c == fault && *h > &fault));
        let in_time = late(fault, bound).is_none() || healed.is_some_and(|h| late(*h, bound + timeout).is_none());
        if !in_time {
            v.push(format!(
                "rank {} answered rank 0 {:.0} ms after its parent rank {} was lost (bound {:.0} ms: {} candidate(s) \
                 asked, {timeouts} timed out)",
                rec.rank,
                took * 1e3,
                rec.lost,
                bound * 1e3,
                rec.attempts
            ));
        }
        from_loss.push(took * 1e3);
        let worst = per_loss.entry((rec.lost, fault)).or_insert(0.0);
        *worst = worst.max(took * 1e3);
        let verdict =
            lost_log.get(&rec.lost).and_then(|l| l.iter().map(|(t, _)| *t).find(|t| *t >= fault.as_secs_f64()));
        if let Some(t) = verdict {
            from_verdict.push((answered.as_secs_f64() - t) * 1e3);
        }
        if let Some(a) = rec.asked {
            from_orphan.push(answered.since(a).as_secs_f64() * 1e3);
            to_orphan.push(a.since(fault).as_secs_f64() * 1e3);
        }
    }
    let (mc, mr) = sim.watch.max_children;
    if done.is_empty() {
        return None;
    }
    let mut all: Vec<f64> = per_loss.values().copied().collect();
    all.sort_by(f64::total_cmp);
    Some(ReparentFigures {
        reparents: done.len() as u32,
        losses: per_loss.len() as u32,
        loss_to_reachable_ms: spread(&mut from_loss),
        verdict_to_reachable_ms: spread(&mut from_verdict),
        orphan_verdict_to_reachable_ms: spread(&mut from_orphan),
        loss_to_orphan_verdict_ms: spread(&mut to_orphan),
        loss_to_all_reachable_ms: (!all.is_empty()).then(|| (quantile(&all, 0.5), all[all.len() - 1])),
        max_attempts,
        max_children: (mc as u32, mr),
        last_resort: sim.watch.last_resort,
    })
}

fn report(
    sim: &Sim,
    scenario: Scenario,
    violations: Vec<String>,
    jobs: (u64, u64, u64),
    d: Option<(f64, f64)>,
    reparent: Option<ReparentFigures>,
) -> Report {
    let mut faults = BTreeMap::new();
    for (_, f) in &sim.faults {
        let k = match f {
            Fault::NodeLoss(_) => "node_loss",
            Fault::Crash(_) => "crash",
            Fault::Stall(..) => "stall",
            Fault::Cut(_) => "cut",
            Fault::Heal(_) => "heal",
            Fault::Restart(_) => "restart",
            Fault::CrashInCommit(_) => "crash_in_commit",
        };
        *faults.entry(k.to_string()).or_insert(0) += 1;
    }
    Report {
        brokers: sim.cfg.brokers,
        topo: sim.cfg.topo.to_string(),
        scenario: scenario.to_string(),
        seed: sim.cfg.seed,
        latency_ms: sim.cfg.latency.as_secs_f64() * 1e3,
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
        max_children: sim.watch.max_children.0 as u32,
        reparent,
        restarts: None,
    }
}
