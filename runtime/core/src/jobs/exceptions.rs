//! RFC 21 exceptions: [`JobCore::raise`] and what a fatal one does to a pending or running job, `vigil cancel`
//! ([`JobCore::cancel`]), and the exceptions of an instance shutting down ([`JobCore::instance_shutdown`]).

use super::output::retire_stdin;
use super::{Action, JobCore, JobId, JobState};
use serde_json::{json, Value};

/// The exception type of the jobs still running when their instance is shut down
/// ([`JobCore::instance_shutdown`]; severity 0).
pub const SHUTDOWN_EXCEPTION: &str = "shutdown";

/// An RFC 21 exception.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Exception {
    /// Type, e.g. `cancel`, `timelimit`, `exec`, `node-failure`.
    #[serde(rename = "type")]
    pub kind: String,
    /// 0 = fatal, 1..7 informational.
    pub severity: u32,
    /// Human-readable note.
    pub note: String,
}

impl JobCore {
    /// Raise an exception on job `id`. Severity 0 is fatal: a pending job is removed at once, a running one is
    /// killed (SIGTERM, then SIGKILL after `kill_timeout`). Returns false if the job is not active.
    pub fn raise(&mut self, now: f64, id: JobId, kind: &str, severity: u32, note: &str) -> bool {
        self.raise_inner(now, id, kind, severity, note, false)
    }

    /// [`JobCore::raise`]; a fatal exception cancels a pending requeue (`requeue.rs`) unless `keep_requeue` (the
    /// loss that armed it).
    fn raise_inner(&mut self, now: f64, id: JobId, kind: &str, severity: u32, note: &str, keep_requeue: bool) -> bool {
        self.raise_ctx(now, id, json!({"type": kind, "severity": severity, "note": note}), keep_requeue)
    }

    /// [`JobCore::raise_inner`] with the exception's whole context: `type`, `severity` and `note`, and any keys
    /// beside them (`ranks` and `hosts` of the nodes a job lost).
    pub(super) fn raise_ctx(&mut self, now: f64, id: JobId, ctx: Value, keep_requeue: bool) -> bool {
        let kind = ctx["type"].as_str().unwrap_or("").to_string();
        let severity = ctx["severity"].as_u64().unwrap_or(0) as u32;
        let note = ctx["note"].as_str().unwrap_or("").to_string();
        let Some(job) = self.jobs.get_mut(&id) else { return false };
        if !job.state.is_active() {
            return false;
        }
        let exc = Exception { kind: kind.clone(), severity, note };
        if severity != 0 {
            job.post(now, "exception", ctx);
            self.actions.push_back(Action::Updated(id));
            return true;
        }
        if job.t_run.is_none() {
            // Never allocated: straight to INACTIVE. A pass is needed only if it held the reservation: a pending
            // job holds no resources, and the pass's verdict on every other job does not depend on it (so a storm
            // of cancels does not cost a pass each).
            if self.drop_pending(now, id, exc) {
                self.schedule(now);
            }
            return true;
        }
        job.post(now, "exception", ctx);
        self.actions.push_back(Action::Updated(id));
        if !keep_requeue {
            job.requeue_pending = None;
        }
        if job.fatal.is_none() {
            job.fatal = Some(exc);
        }
        if job.term_sent.is_none() {
            job.term_sent = Some(now);
            self.sched_dirty = true; // it is expected to end sooner (backfill.rs)
            let ranks: Vec<u32> = job.shells.values().filter(|s| !s.exited).map(|s| s.rank).collect();
            if !ranks.is_empty() {
                self.actions.push_back(Action::SignalShells { id, ranks, signal: crate::signal::SIGTERM });
            }
        }
        self.maybe_finish(now, id);
        self.rearm(id);
        true
    }

    /// A pending job (never allocated, or requeued) gets fatal exception `exc` and ends at once. True when it held
    /// the reservation (`backfill.rs`), or its end let a job waiting on it go on to the queue (`depend.rs`): then
    /// the caller runs a scheduling pass. Another pending job's removal
    /// changes no verdict of the last pass (a job deeper than `sched.backfill-depth` that it lets into the window
    /// is looked at by the next pass).
    pub(super) fn drop_pending(&mut self, now: f64, id: JobId, exc: Exception) -> bool {
        let Some(job) = self.jobs.get_mut(&id) else { return false };
        job.post(now, "exception", json!({"type": exc.kind, "severity": exc.severity, "note": exc.note}));
        if job.fatal.is_none() {
            job.fatal = Some(exc);
        }
        job.post(now, "clean", json!({}));
        job.t_inactive = Some(now);
        retire_stdin(job);
        self.queue.remove(&id);
        self.depend_forget(id);
        self.became_inactive(id);
        self.count_ended(id);
        self.actions.push_back(Action::Updated(id));
        let held = self.reservation.as_ref().is_some_and(|r| r.id == id);
        if held {
            self.sched_dirty = true;
        }
        // The jobs waiting on it: some may go on to the queue (afterany, afternotok), some end with it.
        let released = self.depend_fired(now, id);
        held || released
    }

    /// Cancel job `id` on behalf of `userid` (`owner` = the instance owner may cancel any job).
    pub fn cancel(&mut self, now: f64, id: JobId, userid: u32, owner: bool, note: &str) -> Result<(), (u32, String)> {
        use crate::message::errno;
        let job = self.jobs.get(&id).ok_or((errno::ENOENT, format!("unknown job id {id}")))?;
        if !owner && job.userid != userid {
            return Err((errno::EPERM, format!("job {id} belongs to uid {}", job.userid)));
        }
        if !job.state.is_active() {
            return Err((errno::EINVAL, format!("job {id} is inactive")));
        }
        self.raise(now, id, "cancel", 0, note);
        Ok(())
    }

    /// The instance is being shut down (`vigil shutdown`, its initial program ended, a signal; `why` says which):
    /// every running job gets a fatal exception of type [`SHUTDOWN_EXCEPTION`] saying so, before its shells and
    /// brokers go. Otherwise its verdict would be what their going looks like (a lost critical rank, a shell
    /// killed without reporting), and a user would look for a failed node. Pending jobs are left as they are:
    /// with a state directory they are queued again at the next start. Scheduling stops: what the ending jobs free
    /// is not given to a pending job that the stopping brokers would never start.
    pub fn instance_shutdown(&mut self, now: f64, why: &str) {
        if self.stopped.is_none() {
            self.stopped = Some(format!("the instance is shutting down ({why})"));
        }
        let running: Vec<JobId> = self.jobs.values().filter(|j| j.state == JobState::Run).map(|j| j.id).collect();
        let note = format!("the instance was shut down ({why})");
        for id in running {
            self.raise(now, id, SHUTDOWN_EXCEPTION, 0, &note);
        }
    }

    /// The instance has stopped for good after [`JobCore::instance_shutdown`]: jobs it ended whose shells did not
    /// all report before the brokers went (killed with the instance) are finished now, with what was reported, so
    /// they are INACTIVE (their `shutdown` exception the reason) in the state directory, not left in CLEANUP for a
    /// later start to re-attach and then fail as if their nodes had been lost.
    pub fn instance_stopped(&mut self, now: f64) {
        let ended: Vec<JobId> = self
            .running
            .iter()
            .copied()
            .filter(|id| self.jobs[id].fatal.as_ref().is_some_and(|e| e.kind == SHUTDOWN_EXCEPTION))
            .collect();
        for id in ended {
            let ranks: Vec<u32> = self.jobs[&id].shells.values().filter(|s| !s.exited).map(|s| s.rank).collect();
            for r in ranks {
                self.shell_gone(id, r);
            }
            self.maybe_finish(now, id);
        }
    }
}
