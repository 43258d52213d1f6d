//! What a broker counts for operators: [`Broker::metrics`] takes a [`Metrics`] snapshot of this broker's judge
//! (its peers by state, its verdicts by rule, its lateness) and, on rank 0, of the instance (ranks by state,
//! re-parents, jobs by state, the queue, the state directory). The driver serves it as OpenMetrics text on
//! `-S metrics.listen` (`driver/src/broker/metrics.rs`, docs/metrics.md); the snapshot itself does no I/O.
//!
//! Counters only grow for as long as the broker runs (a restart starts them at 0, which Prometheus's `rate()`
//! handles); gauges are the state at the snapshot. No job data beyond counts leaves the broker this way.

use super::core::{Broker, MemberState, StateDir};
use crate::jobs::state::JobState;
use crate::membership::{PeerState, Rule};
use std::collections::BTreeMap;

/// Counters the broker keeps for [`Metrics`] beside its state: events that leave no trace in the state itself.
#[derive(Clone, Debug, Default)]
pub struct Counters {
    /// Rank 0: jobs submitted and taken (a submission sent again with its key counts once).
    pub submits: u64,
    /// Rank 0: re-parents recorded (`overlay.reparent`: an orphan adopted by a new parent).
    pub reparents: u64,
}

/// A snapshot of one broker's figures (see the module documentation).
#[derive(Clone, Debug)]
pub struct Metrics {
    /// This broker's rank.
    pub rank: u32,
    /// Brokers in the instance.
    pub size: u32,
    /// `None` when the broker is ready for work (`/readyz`): joined the overlay and, on rank 0, its state directory
    /// usable and scheduling on; else why not, in words.
    pub not_ready: Option<String>,
    /// Peers this broker judges (its children, and its parent under rank 0 of the membership) by state: every
    /// state, 0 included.
    pub peers: Vec<(PeerState, u64)>,
    /// State changes this broker's judge made, by new state and rule (every pair seen so far).
    pub verdicts: Vec<(PeerState, Rule, u64)>,
    /// The judge's lateness factor (>= 1; 1 = on time): its timeouts are stretched by it.
    pub lateness: f64,
    /// What this broker's link to its parent runs on now ([`TRANSPORTS`]); `None` on rank 0 and while it has no
    /// parent link (before it joined, while it re-parents).
    pub parent_link: Option<&'static str>,
    /// Rank 0 only: the instance's figures.
    pub instance: Option<InstanceMetrics>,
}

/// Rank 0's figures for the whole instance.
#[derive(Clone, Debug)]
pub struct InstanceMetrics {
    /// Every rank by state (`online`, `torpid`, `offline`, `lost`), every state listed.
    pub ranks: Vec<(&'static str, u64)>,
    /// Ranks under a parent that is not their static one now.
    pub adopted: u64,
    /// Re-parents recorded since this rank 0 started.
    pub reparents: u64,
    /// The instance's overlay links by transport, every one of [`TRANSPORTS`] listed: each rank up now (online or
    /// torpid) that has reported its parent link (`overlay.transport`) counts once, under that link's transport.
    pub links: Vec<(&'static str, u64)>,
    /// Jobs held in memory by state (RFC 21 names: `SCHED`, `RUN`, `INACTIVE`...), every state listed.
    pub jobs: Vec<(&'static str, u64)>,
    /// INACTIVE jobs held in memory by result (`COMPLETED`, `FAILED`, `CANCELED`, `TIMEOUT`).
    pub results: Vec<(&'static str, u64)>,
    /// Jobs submitted since this rank 0 started.
    pub submits: u64,
    /// Pending jobs looked at by scheduling passes since this rank 0 started.
    pub examined: u64,
    /// Full scheduling passes over a non-empty queue since this rank 0 started.
    pub passes: u64,
    /// Jobs that ended since this rank 0 started, by result (`COMPLETED`, `FAILED`, `CANCELED`, `TIMEOUT`), every
    /// result listed.
    pub ended: Vec<(&'static str, u64)>,
    /// Scheduling is stopped (why is in `not_ready`).
    pub scheduling_stopped: bool,
    /// The state directory, if rank 0 keeps one.
    pub statedir: Option<StoreMetrics>,
}

/// Rank 0's state directory figures.
#[derive(Clone, Copy, Debug)]
pub struct StoreMetrics {
    /// Transactions written since this rank 0 started.
    pub writes: u64,
    /// fsyncs since this rank 0 started.
    pub syncs: u64,
    /// Restarts of rank 0 on this state directory (`None`: unknown, the store is damaged).
    pub restarts: Option<u64>,
    /// 0 ok, 1 failing (writes fail, submissions refused), 2 damaged (unreadable at start).
    pub health: u8,
}

/// The transports an overlay link may run on ([`super::links::LinkChoice::transport`]): TCP, RDMA verbs,
/// libfabric.
pub const TRANSPORTS: [&str; 3] = ["tcp", "rdma", "ofi"];

/// A job's results once INACTIVE (`Job::result`).
const RESULTS: [&str; 4] = ["COMPLETED", "FAILED", "CANCELED", "TIMEOUT"];

const PEER_STATES: [PeerState; 4] = [PeerState::Online, PeerState::Torpid, PeerState::Lost, PeerState::Offline];

const JOB_STATES: [JobState; 7] = [
    JobState::New,
    JobState::Depend,
    JobState::Priority,
    JobState::Sched,
    JobState::Run,
    JobState::Cleanup,
    JobState::Inactive,
];

impl Broker {
    /// This broker's figures now (see the module documentation).
    pub fn metrics(&self) -> Metrics {
        let mut peers: BTreeMap<PeerState, u64> = PEER_STATES.iter().map(|s| (*s, 0)).collect();
        for (_, s) in self.membership.states() {
            *peers.entry(s).or_default() += 1;
        }
        Metrics {
            rank: self.opts.rank,
            size: self.opts.size,
            not_ready: self.not_ready(),
            peers: peers.into_iter().collect(),
            verdicts: self.membership.verdicts().collect(),
            lateness: self.membership.lateness(),
            parent_link: self.links.parent.as_ref().filter(|_| self.parent_up).map(|c| c.transport),
            instance: self.jobcore.as_ref().map(|jc| {
                let mut ranks: BTreeMap<&'static str, u64> =
                    ["online", "torpid", "offline", "lost"].iter().map(|s| (*s, 0)).collect();
                for r in 0..self.opts.size {
                    // A rank never heard of has not joined: offline, as `vigil overlay status` shows it.
                    let s = self.members.get(&r).map_or(MemberState::Offline.name(), |m| m.0.name());
                    *ranks.entry(s).or_default() += 1;
                }
                let mut jobs: BTreeMap<&'static str, u64> = JOB_STATES.iter().map(|s| (s.name(), 0)).collect();
                let mut results: BTreeMap<&'static str, u64> = BTreeMap::new();
                for j in jc.jobs.values() {
                    *jobs.entry(j.state.name()).or_default() += 1;
                    if let Some(r) = j.result().filter(|_| j.state == JobState::Inactive) {
                        *results.entry(r).or_default() += 1;
                    }
                }
                let mut links: BTreeMap<&'static str, u64> = TRANSPORTS.iter().map(|t| (*t, 0)).collect();
                for (r, c) in &self.links.by_rank {
                    if matches!(self.members.get(r), Some((MemberState::Online | MemberState::Torpid, ..))) {
                        *links.entry(c.transport).or_default() += 1;
                    }
                }
                let mut ended: BTreeMap<&'static str, u64> = RESULTS.iter().map(|r| (*r, 0)).collect();
                ended.extend(jc.ended());
                InstanceMetrics {
                    ranks: ranks.into_iter().collect(),
                    adopted: self.adopted.len() as u64,
                    reparents: self.counters.reparents,
                    links: links.into_iter().collect(),
                    jobs: jobs.into_iter().collect(),
                    results: results.into_iter().collect(),
                    submits: self.counters.submits,
                    examined: jc.examined(),
                    passes: jc.passes(),
                    ended: ended.into_iter().collect(),
                    scheduling_stopped: jc.scheduling_stopped().is_some(),
                    statedir: match &self.statedir {
                        StateDir::None => None,
                        StateDir::Open { restarts, failing, .. } => Some(StoreMetrics {
                            writes: self.writes,
                            syncs: self.syncs,
                            restarts: Some(*restarts),
                            health: u8::from(failing.is_some()),
                        }),
                        StateDir::Damaged { .. } => {
                            Some(StoreMetrics { writes: self.writes, syncs: self.syncs, restarts: None, health: 2 })
                        }
                    },
                }
            }),
        }
    }

    /// Why this broker is not ready for work, `None` when it is: it has joined (rank 0: it has started the
    /// instance's initial program or has none to start; others: their parent link is up) and is not shutting
    /// down; rank 0's state directory is usable and scheduling is on.
    fn not_ready(&self) -> Option<String> {
        if self.shutting_down.is_some() {
            return Some("shutting down".into());
        }
        if self.opts.rank != 0 && !self.parent_up {
            return Some("not joined: no parent link".into());
        }
        if let StateDir::Damaged { why, .. } = &self.statedir {
            return Some(format!("state directory damaged: {why}"));
        }
        if let StateDir::Open { failing: Some(why), .. } = &self.statedir {
            return Some(format!("state directory failing: {why}"));
        }
        self.jobcore.as_ref().and_then(|jc| jc.scheduling_stopped()).map(|why| format!("scheduling stopped: {why}"))
    }
}
