//! Which pending job starts when: EASY backfill (Slurm's default scheduler, `sched.policy=easy`) or strict first
//! come, first served (`sched.policy=fcfs`).
//!
//! Pending (SCHED) jobs are kept in priority order: urgency first (`urgency.rs`; 16 unless set, held jobs, of
//! urgency 0, are not looked at), then submission order, as a job id grows with its submission time, so a
//! requeued job (`requeue.rs`) goes back ahead of every job of its urgency submitted after it. A pass walks them
//! in that order:
//!
//! 1. A job that fits now starts now, as long as no earlier job holds the reservation.
//! 2. A job that could not run on the ranks schedulable now even once every job on them has ended waits with its
//!    reason, but holds back nobody ([`Pool::feasible_now`]): in a system instance a lost, drained or torpid node
//!    may return. (In a nested instance a lost node never returns, and such a job has already failed: `shrink.rs`.)
//! 3. The first job that could run on the present ranks but cannot now gets the **reservation**: the earliest time
//!    it fits once running jobs end at their expected ends, with the resources it would get then (the plan first
//!    fit makes on the pool with those jobs freed). A running job is expected to end at its time limit (R's
//!    `expiration`); one being killed, at its SIGTERM plus `exec.kill-timeout` if that is sooner; one without a time
//!    limit (`sched.default-duration=inf`), never: a reservation that waits for such a job starts "never" (`inf`),
//!    which still keeps its planned resources. `vigil jobs` shows a finite start as `eta:` (Flux's `t_estimate`).
//! 4. With `fcfs`, nothing after the reservation starts. With `easy`, a later job starts now if it fits now and
//!    either its time limit ends no later than the reservation's start, or it fits **beside** the reservation, on
//!    resources the reservation's plan does not use. So no job started past the reservation delays it: at the
//!    reserved start every job it waited for has ended, every job started early has ended too or never touched
//!    the planned resources, and first fit, being complete, finds a placement. Recomputed later, the start can
//!    only come sooner (property-tested at 4,096 ranks in `tests.rs`).
//!
//! As in Slurm, a job's time limit is taken as its run time, and the few seconds a killed job's shells take to
//! exit are not planned for.
//!
//! Cost, independent of queue depth: a pass looks at no more than `sched.backfill-depth` pending jobs (default
//! [`BACKFILL_DEPTH`], as Slurm's `bf_max_job_test`; `JobCore::examined` counts them, and `tests_sched.rs` bounds
//! it), borrows each job's request rather than copying it, skips a request whose shape already failed in the pass (resources only shrink during a
//! pass), stops looking for backfill once no core is free, and finds the reservation by a binary search over the
//! running jobs' ends. A submission looks at the new job alone when nothing changed since the last pass.

use super::sched::{Pool, RankAlloc};
use super::{JobCore, JobId, JobState};
use crate::attrs::SchedPolicy;
use crate::jobspec::JobRequest;
use std::collections::HashSet;

/// Default of `sched.backfill-depth`: most pending jobs one scheduling pass looks at (Slurm's `bf_max_job_test`
/// is 500 by default): jobs deeper in the queue wait until those ahead of them have started.
pub const BACKFILL_DEPTH: usize = 1024;

/// Why a held job (urgency 0) waits ([`JobCore::pending_reason`]). The command that releases it is added by the
/// service that answers, only for a caller who may release it (its owner, the instance owner).
pub const HELD_REASON: &str = "held: urgency 0";

/// The reservation of the first job that must wait (rule 3 of the module doc).
#[derive(Clone, Debug, PartialEq)]
pub struct Reservation {
    /// The job it is for.
    pub id: JobId,
    /// Its expected start, seconds since the epoch; infinite when it waits for a job without a time limit.
    pub start: f64,
    /// What it would get at `start`: no job started after it may use these unless it ends by then.
    pub plan: Vec<RankAlloc>,
}

/// What makes two requests place alike (their durations aside): their counts, and the nodes they may use (a
/// job that waits for the node it names says nothing of one that may run elsewhere).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Shape {
    nnodes: Option<u32>,
    nnodes_max: Option<u32>,
    nslots: u32,
    per_node: Option<u32>,
    /// The task total of a node range whose slots per node follow its node count (`JobRequest::slots_vary`).
    spread: Option<u32>,
    cores: u32,
    gpus: u32,
    exclusive: bool,
    /// A hash of its constraints (RFC 31) as JSON; 0 without.
    constraint: u64,
}

impl Shape {
    fn of(r: &JobRequest) -> Shape {
        let constraint = r.constraint.as_ref().map_or(0, |c| {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            c.to_value().to_string().hash(&mut h);
            h.finish() | 1
        });
        Shape {
            nnodes: r.nnodes,
            nnodes_max: r.nnodes_max,
            nslots: r.nslots,
            per_node: r.slots_per_node,
            spread: r.slots_vary().then_some(r.ntasks),
            cores: r.cores_per_slot,
            gpus: r.gpus_per_slot,
            exclusive: r.exclusive,
            constraint,
        }
    }
}

/// What one pass learned so far. Within a pass resources are only taken, never freed, so a shape that did not
/// fit stays unfit for the rest of it.
struct Pass {
    /// Shapes [`Pool::allocate`] could not place now.
    no_room: HashSet<Shape>,
    /// Shapes that could not be placed beside the reservation.
    no_room_beside: HashSet<Shape>,
    /// Shapes that cannot run on the present ranks at all (rule 2).
    unfit: HashSet<Shape>,
    /// Free cores on schedulable ranks (an upper bound on what may still start), counted once backfill begins.
    free_cores: Option<u64>,
}

impl Pass {
    fn new(free_cores: Option<u64>) -> Pass {
        Pass { no_room: HashSet::new(), no_room_beside: HashSet::new(), unfit: HashSet::new(), free_cores }
    }
}

/// What became of a job a pass looked at.
#[derive(Debug, PartialEq)]
enum Verdict {
    /// It started.
    Started,
    /// It waits.
    Waits,
    /// Nothing after it can start in this pass.
    Stop,
}

impl JobCore {
    /// A full pass over the pending jobs (the rules of this file's doc): called whenever resources were freed or
    /// changed.
    pub(super) fn schedule(&mut self, now: f64) {
        if self.awaiting_ranks() {
            // After a restart, until the ranks that were up are back (journal.rs, REJOIN_HOLD).
            self.sched_dirty = true;
            return;
        }
        self.reservation = None;
        self.beside = None;
        self.sched_dirty = false;
        self.examined_all = true;
        if self.queue.is_empty() || self.stopped.is_some() {
            return;
        }
        self.passes += 1;
        let mut pass = Pass::new(None);
        let mut cursor = None;
        for seen in 1.. {
            let next = match cursor {
                None => self.queue.first(),
                Some(c) => self.queue.after(c),
            };
            let Some(key) = next else { break };
            cursor = Some(key);
            let id = key.1;
            if seen > self.config.backfill_depth {
                self.examined_all = false;
                break;
            }
            if self.consider(now, id, &mut pass) == Verdict::Stop {
                break;
            }
        }
        if std::mem::take(&mut self.depend.released) {
            // A job it started let others go on to the queue (`after`, depend.rs): they may start too.
            self.schedule(now);
        }
    }

    /// Job `id` was just submitted: when it is last in the queue, nothing changed since the last full pass and
    /// that pass saw every pending job, the new job alone needs a look; otherwise (a higher urgency puts it ahead
    /// of others, `urgency.rs`) a full pass. A held job needs none.
    pub(super) fn schedule_submitted(&mut self, now: f64, id: JobId) {
        if self.stopped.is_some() || self.awaiting_ranks() {
            self.sched_dirty = true;
            return;
        }
        if self.queue.key(id).is_none() {
            return;
        }
        if self.sched_dirty || !self.queue.is_last(id) {
            self.schedule(now);
        } else if self.examined_all && self.queue.len() <= self.config.backfill_depth {
            self.consider(now, id, &mut Pass::new(Some(u64::MAX)));
        }
        // Else the new job is deeper than a pass looks: it waits for the jobs ahead of it.
    }

    /// Apply the rules to pending job `id`.
    fn consider(&mut self, now: f64, id: JobId, pass: &mut Pass) -> Verdict {
        self.examined += 1;
        let Some(job) = self.jobs.get(&id).filter(|j| j.state == JobState::Sched) else {
            self.queue.remove(&id);
            return Verdict::Waits;
        };
        // The request is borrowed, not copied (its command and environment may be large): a job whose shape
        // already failed in this pass costs a lookup.
        let req = &job.req;
        let shape = Shape::of(req);
        let need = u64::from(req.nslots) * u64::from(req.cores_per_slot);
        if pass.unfit.contains(&shape) {
            return Verdict::Waits;
        }
        let Some(res) = &self.reservation else {
            // No job waits ahead of this one (rules 1 to 3).
            if !pass.no_room.contains(&shape) {
                if let Some(plan) = self.pool.allocate(req) {
                    self.started(now, id, plan, pass);
                    return Verdict::Started;
                }
                pass.no_room.insert(shape);
            }
            if !self.pool.feasible_now(req) {
                pass.unfit.insert(shape);
                return Verdict::Waits;
            }
            let Some(res) = self.reserve(now, id, req) else {
                pass.unfit.insert(shape);
                return Verdict::Waits;
            };
            self.beside = None; // made when a job first asks to fit beside it
            self.reservation = Some(res);
            return if self.config.policy == SchedPolicy::Fcfs { Verdict::Stop } else { Verdict::Waits };
        };
        // Backfill (rule 4).
        if self.config.policy == SchedPolicy::Fcfs {
            return Verdict::Stop;
        }
        let free = *pass.free_cores.get_or_insert_with(|| self.pool.free_cores_now());
        if free == 0 {
            return Verdict::Stop;
        }
        if need > free || pass.no_room.contains(&shape) {
            return Verdict::Waits;
        }
        let end = now + req.duration.unwrap_or(f64::INFINITY);
        if end.is_finite() && end <= res.start {
            match self.pool.allocate(req) {
                Some(plan) => {
                    if let Some(b) = self.beside.as_mut() {
                        b.take(&plan);
                    }
                    self.started(now, id, plan, pass);
                    return Verdict::Started;
                }
                None => {
                    pass.no_room.insert(shape);
                    return Verdict::Waits;
                }
            }
        }
        if pass.no_room_beside.contains(&shape) {
            return Verdict::Waits;
        }
        if self.beside.is_none() {
            let mut beside = self.pool.clone();
            beside.take(&res.plan);
            self.beside = Some(beside);
        }
        match self.beside.as_mut().and_then(|b| b.allocate(req)) {
            Some(plan) => {
                self.pool.take(&plan);
                self.started(now, id, plan, pass);
                Verdict::Started
            }
            None => {
                pass.no_room_beside.insert(shape);
                Verdict::Waits
            }
        }
    }

    fn started(&mut self, now: f64, id: JobId, plan: Vec<RankAlloc>, pass: &mut Pass) {
        let cores: u64 = plan.iter().map(|a| a.cores.len() as u64).sum();
        if let Some(f) = pass.free_cores.as_mut() {
            *f = f.saturating_sub(cores);
        }
        self.start(now, id, plan);
    }

    /// When a running job is expected to give its resources back (rule 3), at the earliest `now`.
    fn expected_end(&self, id: JobId, now: f64) -> f64 {
        let Some(j) = self.jobs.get(&id) else { return now };
        let limit = j.expiration.unwrap_or(f64::INFINITY);
        let end = match j.term_sent {
            Some(t) => limit.min(t + self.kill_timeout_of(j)),
            None => limit,
        };
        end.max(now)
    }

    /// The reservation of job `id` (rule 3): the fewest running jobs, in order of expected end, whose ending lets
    /// `req` fit (a binary search on [`Counts`](super::sched::Counts): freeing more never makes a request fit
    /// less); `None` if it cannot fit even when all have ended. With EASY, also the plan: what first fit gives it
    /// then (one copy of the pool).
    fn reserve(&self, now: f64, id: JobId, req: &JobRequest) -> Option<Reservation> {
        let mut ends: Vec<(f64, JobId)> = self.running.iter().map(|j| (self.expected_end(*j, now), *j)).collect();
        ends.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let held = |j: &JobId| {
            self.jobs.get(j).into_iter().flat_map(|j| j.alloc.iter().filter(|a| !j.released.contains(a.rank)))
        };
        let base = self.pool.counts(req);
        let fits_after = |k: usize| {
            let mut c = base.clone();
            for (_, j) in &ends[..k] {
                c.free(held(j));
            }
            c.fits(req)
        };
        if !fits_after(ends.len()) {
            return None;
        }
        let (mut lo, mut hi) = (0usize, ends.len());
        // Invariant: freeing ends[..hi] fits; freeing fewer than lo does not.
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if fits_after(mid) {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        let start = if hi == 0 { now } else { ends[hi - 1].0.max(now) };
        let plan = if self.config.policy == SchedPolicy::Easy {
            let mut p: Pool = self.pool.clone();
            for (_, j) in &ends[..hi] {
                let freed: Vec<RankAlloc> = held(j).cloned().collect();
                p.free(&freed, None);
            }
            p.allocate(req).unwrap_or_default()
        } else {
            Vec::new()
        };
        Some(Reservation { id, start, plan })
    }

    /// Ranks that joined since this rank 0 started (the pool also holds, down, those known from the state
    /// directory that have not joined again: `journal.rs`).
    pub fn ranks_joined(&self) -> usize {
        self.pool.ranks.len() - self.saved.ranks_restored.len()
    }

    /// Whether scheduling waits for ranks expected back after a restart of rank 0 (`journal.rs`,
    /// [`super::journal::REJOIN_HOLD`]).
    pub fn awaiting_ranks(&self) -> bool {
        !self.saved.ranks_expected.is_empty()
    }

    /// The reservation the last pass made, if a job waits for one.
    pub fn reservation(&self) -> Option<&Reservation> {
        self.reservation.as_ref()
    }

    /// Expected start of pending job `id` (seconds since the epoch) when it holds the reservation and the start is
    /// known (Flux's `t_estimate`).
    pub fn estimate(&self, id: JobId) -> Option<f64> {
        self.reservation.as_ref().filter(|r| r.id == id && r.start.is_finite()).map(|r| r.start)
    }

    /// Why job `id` is still waiting for resources (`None` unless it is SCHED); [`HELD_REASON`] for a held job: what the pool lacks
    /// ([`Pool::pending_reason`]), or, behind the reservation, the job it waits behind.
    pub fn pending_reason(&self, id: JobId) -> Option<String> {
        let job = self.jobs.get(&id).filter(|j| j.state == JobState::Sched)?;
        if job.urgency == 0 {
            // The hint that says how to release it is added by who answers, for those who may (`job-manager.list`).
            return Some(HELD_REASON.into());
        }
        if let Some(why) = &self.stopped {
            return Some(format!("scheduling stopped: {why}"));
        }
        if self.awaiting_ranks() {
            let ranks: crate::idset::IdSet = self.saved.ranks_expected.iter().copied().collect();
            return Some(format!(
                "waiting for rank(s) {ranks} to come back after rank 0 restarted (at most {} s)",
                super::journal::REJOIN_HOLD
            ));
        }
        Some(match &self.reservation {
            Some(r) if self.queue.key(id) > self.queue.key(r.id) => match self.config.policy {
                SchedPolicy::Fcfs => format!("priority: queued behind job {} (first come, first served)", r.id.f58()),
                SchedPolicy::Easy => format!(
                    "priority: queued behind job {}, which holds the reservation (backfill: a job runs before it \
                     only if it fits now and its time limit ends before that job's expected start, or it fits beside it)",
                    r.id.f58()
                ),
            },
            _ => self.pool.pending_reason(&job.req),
        })
    }
}
