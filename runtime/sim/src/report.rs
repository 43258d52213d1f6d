//! What a simulation run measured: [`Report`] (`vigil-bench sim --json` prints it) with the figures of rank 0's
//! restarts and of re-parenting. The world that fills it is in `lib.rs`; the scenarios that read it are in
//! `scenario.rs`.

use std::collections::BTreeMap;

/// The outcome of a simulation run (`vigil-bench sim --json` prints it, adding wall time and memory).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Report {
    /// Brokers simulated.
    pub brokers: u32,
    /// TBON shape.
    pub topo: String,
    /// Scenario name.
    pub scenario: String,
    /// Seed.
    pub seed: u64,
    /// Virtual time simulated, seconds.
    pub virtual_s: f64,
    /// Inputs handled by brokers.
    pub events: u64,
    /// A hash of every input handled (time, rank, kind) in order: equal for equal seeds.
    pub trace: String,
    /// True when every invariant held.
    pub ok: bool,
    /// The invariants that did not hold, one line each.
    pub violations: Vec<String>,
    /// Jobs submitted and accepted.
    pub jobs: u64,
    /// Jobs that completed with exit status 0.
    pub jobs_ok: u64,
    /// Jobs that ended with a fatal exception.
    pub jobs_failed: u64,
    /// Faults injected, by kind.
    pub faults: BTreeMap<String, u32>,
    /// Virtual time from a silent node loss to rank 0 recording the rank lost, milliseconds: median and max.
    pub loss_detect_ms: Option<(f64, f64)>,
    /// One-way latency of every overlay link, milliseconds ([`Config::latency`](crate::Config::latency)).
    pub latency_ms: f64,
    /// The most children any broker had at once during the run (its static children and any it adopted).
    pub max_children: u32,
    /// Re-parenting figures, when some orphan re-parented.
    pub reparent: Option<ReparentFigures>,
    /// Rank 0's restarts on its store ([`Config::statedir`](crate::Config::statedir)), when it restarted.
    pub restarts: Option<RestartFigures>,
}

/// Rank 0's restarts in a run ([`Config::statedir`](crate::Config::statedir)).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct RestartFigures {
    /// Times rank 0's broker was killed and started again on its store.
    pub restarts: u32,
    /// Of its deaths, those in a turn that changed the journal, before its commit (that turn's changes lost).
    pub in_commit: u32,
    /// Each outage (death to restart), virtual seconds: shortest and longest.
    pub outage_s: (f64, f64),
    /// From each restart to every running broker registered with rank 0 again, virtual milliseconds: median
    /// and max (a broker stopped meanwhile, and those below it, are not waited for). Each child of rank 0 tries
    /// it again every `rejoin::RANK0_RETRY` (1 s).
    pub rejoin_ms: Option<(f64, f64)>,
    /// Submissions answered with an id (acknowledged).
    pub acknowledged: u64,
    /// Of those answers, the ones to a submission sent again whose job rank 0 already held (its submission key,
    /// `jobs/submit_key.rs`): the job made by the first request, marked `"duplicate": true`, not a new one.
    pub duplicates: u64,
    /// Submission requests the client sent again after its connection to rank 0 was refused or reset.
    pub retried: u64,
    /// Submission requests the client sent again after an EAGAIN (a restarted rank 0 whose brokers had not all
    /// rejoined yet: the request may need them).
    pub retried_eagain: u64,
    /// Jobs running when rank 0 died.
    pub running_at_crash: u64,
    /// Of them, jobs that completed with their shells' real exit status (re-attached after the restart).
    pub reattached_ok: u64,
    /// Of them, jobs that ended with a fatal exception (a node of theirs was lost meanwhile).
    pub reattached_failed: u64,
}

/// Re-parenting figures of a run, in virtual milliseconds. Each `(median, p99, max)` is over the re-parents rank
/// 0 recorded whose lost parent had a fault (p99 by nearest rank; an orphan re-parented twice counts twice).
/// "Reachable" is when rank 0's client got the orphan's answer to a ping it sent on seeing the re-parent in
/// `resource.eventlog` (a round trip after rank 0 can route to it again).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct ReparentFigures {
    /// Re-parents rank 0 recorded.
    pub reparents: u32,
    /// Distinct losses (a rank and the time of its fault) they followed.
    pub losses: u32,
    /// From the parent's loss (the fault) to the orphan reachable from rank 0.
    pub loss_to_reachable_ms: Option<(f64, f64, f64)>,
    /// From rank 0's verdict on the lost parent (`resource.eventlog`) to the orphan reachable.
    pub verdict_to_reachable_ms: Option<(f64, f64, f64)>,
    /// From the orphan's own verdict (its first request to a candidate) to the orphan reachable.
    pub orphan_verdict_to_reachable_ms: Option<(f64, f64, f64)>,
    /// From the parent's loss to the orphan's own verdict.
    pub loss_to_orphan_verdict_ms: Option<(f64, f64, f64)>,
    /// Per loss, from the loss to the last of its orphans reachable: (median, max) over losses.
    pub loss_to_all_reachable_ms: Option<(f64, f64)>,
    /// The most candidates one orphan asked for one re-parent (the one that took it included).
    pub max_attempts: u32,
    /// The most children any broker had at once, and its rank.
    pub max_children: (u32, u32),
    /// Orphans rank 0 adopted on their last round (every live candidate was full; `reparent.rs`, "Last resort").
    pub last_resort: u32,
}
