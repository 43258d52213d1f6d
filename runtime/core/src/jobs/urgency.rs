//! RFC 21 urgency: the order pending jobs leave the queue in, holds and releases.
//!
//! Every job has an urgency from 0 to 31, 16 unless it is submitted with another (`--urgency`, Flux's; `--hold`
//! is 0) or given another while pending ([`JobCore::set_urgency`]: `vigil job urgency`, `hold`, `release`, as
//! Flux's `flux job urgency` and Slurm's `scontrol hold/release`). Its priority is its urgency (Flux's default
//! priority plugin): the queue is in order of priority, then of submission (job ids grow with time), so a job of
//! urgency 31 goes ahead of every other. Urgency 0 **holds** the job: it stays pending (SCHED, priority 0, `held`
//! in `vigil jobs`) and is not looked at by the scheduler until released. Only the instance owner may give a job
//! more than the default (16), as in Flux. Each change is in the eventlog: `urgency` (`userid`, `urgency`) and,
//! for a job already in SCHED, `priority`.

use super::{Action, JobCore, JobId, JobState};
use serde_json::json;
use std::collections::{BTreeSet, HashMap};

/// The urgency of a job submitted without one (RFC 21).
pub const DEFAULT_URGENCY: u32 = 16;
/// The highest urgency (RFC 21 "expedite"): ahead of every other job.
pub const MAX_URGENCY: u32 = 31;

/// The pending jobs in SCHED: those the scheduler looks at, in priority order, and those held (urgency 0).
#[derive(Debug, Default)]
pub(super) struct Queue {
    /// (`MAX_URGENCY - priority`, id): the first is the highest priority, the earliest submitted.
    order: BTreeSet<(u32, JobId)>,
    /// Each queued job's key in `order`.
    key: HashMap<JobId, u32>,
    /// Held jobs (urgency 0).
    held: BTreeSet<JobId>,
}

/// A job's place in the queue: lower comes first.
pub(super) type Key = (u32, JobId);

impl Queue {
    /// Queue job `id` with `priority` (0: held); wherever it was before, it is there no more.
    pub(super) fn insert(&mut self, id: JobId, priority: u32) {
        self.remove(&id);
        if priority == 0 {
            self.held.insert(id);
        } else {
            let k = MAX_URGENCY - priority.min(MAX_URGENCY);
            self.order.insert((k, id));
            self.key.insert(id, k);
        }
    }

    /// Take job `id` out (queued or held); true if it was in.
    pub(super) fn remove(&mut self, id: &JobId) -> bool {
        let held = self.held.remove(id);
        let queued = self.key.remove(id).is_some_and(|k| self.order.remove(&(k, *id)));
        held || queued
    }

    /// The first job the scheduler looks at.
    pub(super) fn first(&self) -> Option<Key> {
        self.order.first().copied()
    }

    /// The job after `k`.
    pub(super) fn after(&self, k: Key) -> Option<Key> {
        use std::ops::Bound::{Excluded, Unbounded};
        self.order.range((Excluded(k), Unbounded)).next().copied()
    }

    /// Job `id`'s place, if it is queued (not held).
    pub(super) fn key(&self, id: JobId) -> Option<Key> {
        self.key.get(&id).map(|k| (*k, id))
    }

    /// Whether job `id` is the last one looked at.
    pub(super) fn is_last(&self, id: JobId) -> bool {
        self.order.last().is_some_and(|k| k.1 == id)
    }

    /// Jobs the scheduler looks at (held ones not counted).
    pub(super) fn len(&self) -> usize {
        self.order.len()
    }

    /// Whether the scheduler has nothing to look at.
    pub(super) fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// Jobs in SCHED, held ones too.
    pub(super) fn pending(&self) -> usize {
        self.order.len() + self.held.len()
    }

    /// Every job in SCHED, in queue order, then the held ones.
    pub(super) fn ids(&self) -> impl Iterator<Item = JobId> + '_ {
        self.order.iter().map(|k| k.1).chain(self.held.iter().copied())
    }
}

impl JobCore {
    /// Give pending job `id` urgency `urgency` (0 holds it, 31 expedites it) on behalf of `userid` (`owner`: the
    /// instance owner, who may change any job's and give more than [`DEFAULT_URGENCY`]). With `release`, only a
    /// held job is changed (`vigil job release`). Returns the urgency it had.
    ///
    /// # Errors
    /// `(errno, message)`: ENOENT unknown job; EPERM another user's job, or more than 16 asked by a user; EINVAL
    /// an urgency above 31, a job no longer pending, or (with `release`) a job not held.
    pub fn set_urgency(
        &mut self,
        now: f64,
        id: JobId,
        userid: u32,
        owner: bool,
        urgency: u32,
        release: bool,
    ) -> Result<u32, (u32, String)> {
        use crate::message::errno;
        let job = self.jobs.get(&id).ok_or((errno::ENOENT, format!("unknown job id {id}")))?;
        if !owner && job.userid != userid {
            return Err((errno::EPERM, format!("job {id} belongs to uid {}", job.userid)));
        }
        if urgency > MAX_URGENCY {
            return Err((errno::EINVAL, format!("urgency {urgency}: must be 0 (hold) to {MAX_URGENCY} (expedite)")));
        }
        if !owner && urgency > DEFAULT_URGENCY {
            return Err((
                errno::EPERM,
                format!("urgency {urgency}: only the instance owner may give more than {DEFAULT_URGENCY}"),
            ));
        }
        if !matches!(job.state, JobState::New | JobState::Depend | JobState::Priority | JobState::Sched) {
            return Err((
                errno::EINVAL,
                format!(
                    "job {id} is {}: urgency orders pending jobs only",
                    match job.state {
                        JobState::Run => "running",
                        JobState::Cleanup => "ending",
                        _ => "inactive",
                    }
                ),
            ));
        }
        let old = job.urgency;
        if release && old != 0 {
            return Err((errno::EINVAL, format!("job {id} is not held (urgency {old})")));
        }
        let Some(job) = self.jobs.get_mut(&id) else { return Ok(old) };
        job.urgency = urgency;
        job.post(now, "urgency", json!({"userid": userid, "urgency": urgency}));
        if job.state == JobState::Sched {
            job.post(now, "priority", json!({"priority": urgency}));
            self.queue.insert(id, urgency);
            self.sched_dirty = true;
            self.actions.push_back(Action::Updated(id));
            self.schedule(now);
        } else {
            self.actions.push_back(Action::Updated(id));
        }
        Ok(old)
    }
}
