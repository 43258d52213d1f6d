//! Requeue on node failure: a job submitted with `--requeue` (`attributes.system.requeue: true`, or the job shell
//! option `-o requeue`, as a batch script's `# vigil: -o requeue` may say) that fails because one of its nodes
//! was lost goes back to the queue instead of ending.
//!
//! Which failures count: a fatal exception raised because a rank the job needs was lost ([`JobCore::ranks_down`]:
//! any shell of an ordinary job, a critical rank of a nested instance). A job that survives a loss (a batch job
//! losing a non-critical node) keeps running and is not requeued. A job canceled, timed out or failed for any
//! other reason while it is being cleaned up is not requeued either: the first such exception wins.
//!
//! RFC 21 has no requeue state, so the job goes through it with the events it has, plus one:
//!
//! ```text
//! ... alloc, start, exception{type:node-failure, severity:0, note:"lost node ...; requeued (1 of at most 3)"},
//! finish (if a shell reported), release{final:true}, free,
//! requeue{count:1, max:3, note}      CLEANUP -> SCHED (the only event that leaves CLEANUP but `clean`)
//! alloc, start, finish, release, free, clean                           (the rerun, on live nodes)
//! ```
//!
//! The `requeue` event is posted once the lost run's resources are all released (its shells exited or were
//! lost), so a rerun never overlaps it. The job keeps its id, its output so far (a rerun's output follows) and its
//! standard input (the new shells read it from the start); everything about the lost run (R, shells, time limit
//! expiry, exit status, the nested instance's URI) is forgotten. It goes back to its place in priority order,
//! ahead of every job submitted after it (`backfill.rs`). After `sched.max-requeue` requeues the next loss ends
//! the job as usual, and its exception says why it was not requeued.

use super::{Action, JobCore, JobId, JobState};
use crate::idset::IdSet;
use serde_json::json;
use std::collections::BTreeMap;

/// Default `sched.max-requeue`: how many times one job may be requeued.
pub const DEFAULT_MAX_REQUEUE: u32 = 3;

impl JobCore {
    /// Job `id` is about to get a fatal exception because ranks it needs were lost: if it asked to be requeued and
    /// may be again, remember to requeue it once its resources are released. Returns what the exception's note
    /// should add (`requeued (1 of at most 3)`, or why it is not requeued).
    pub(super) fn arm_requeue(&mut self, id: JobId, lost: &str) -> Option<String> {
        let max = self.config.max_requeue;
        let job = self.jobs.get_mut(&id)?;
        if !job.req.requeue {
            return None;
        }
        if job.requeue_pending.is_some() {
            return Some("requeue already pending".into());
        }
        if job.requeues >= max {
            return Some(format!(
                "not requeued: it was requeued {} time{} already (sched.max-requeue={max})",
                job.requeues,
                if job.requeues == 1 { "" } else { "s" }
            ));
        }
        job.requeue_pending = Some(format!("lost {lost}"));
        Some(format!("requeued ({} of at most {max})", job.requeues + 1))
    }

    /// The lost run of job `id` has released everything (called by `maybe_finish` instead of `clean`): post
    /// `requeue`, forget the run, and put the job back in the queue at its place.
    pub(super) fn requeue(&mut self, now: f64, id: JobId, why: String) {
        let max = self.config.max_requeue;
        let Some(job) = self.jobs.get_mut(&id) else { return };
        job.requeues += 1;
        job.post(now, "requeue", json!({"count": job.requeues, "max": max, "note": why}));
        debug_assert_eq!(job.state, JobState::Sched);
        job.alloc = Vec::new();
        job.released = IdSet::new();
        job.r = None;
        job.shells = BTreeMap::new();
        job.nspawned = 0;
        job.nexited = 0;
        job.t_run = None;
        job.expiration = None;
        job.first_exit = None;
        job.exit_clock = None;
        job.term_sent = None;
        job.kill_sent = false;
        job.warned = false;
        job.fatal = None;
        job.fatal_shell = None;
        job.status = None;
        job.pmi_exchanges = 0;
        job.instance = None;
        job.taskmap = None;
        job.cut_off = BTreeMap::new();
        let urgency = job.urgency;
        self.running.remove(&id);
        self.queue.insert(id, urgency);
        self.rearm(id);
        self.actions.push_back(Action::Requeued(id));
        self.actions.push_back(Action::Updated(id));
    }
}
