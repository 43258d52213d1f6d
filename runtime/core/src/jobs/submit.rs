//! Submission: a jobspec is parsed, validated and checked against what the instance could ever run (refusals are
//! [`SubmitError`]s naming the field), then queued as a new job with an id that grows with time.

use super::{sched, Action, Job, JobCore, JobId};
use crate::idset::IdSet;
use crate::jobspec::Jobspec;
use serde_json::{json, Value};

/// Why a submission was refused.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    /// The jobspec is malformed (the message names the field).
    #[error("{0}")]
    Jobspec(String),
    /// The request can never fit in this instance.
    #[error("unsatisfiable request: {0}")]
    Unsatisfiable(#[from] sched::Unsatisfiable),
    /// Too few nodes satisfy the job's constraints, some of which name nodes this instance does not have.
    #[error("unsatisfiable request: {err} ({unknown})")]
    UnknownNodes {
        /// What does not fit.
        err: sched::Unsatisfiable,
        /// `node9 is not a node of this instance`.
        unknown: String,
    },
    /// The request would have fit before this nested instance lost ranks for good (RFC 28 shrink, `shrink.rs`).
    #[error("unsatisfiable request: {err} (this instance lost {lost} for good: it shrank)")]
    Shrunk {
        /// What no longer fits.
        err: sched::Unsatisfiable,
        /// The ranks lost, `host (rank r)`, in the order they were lost.
        lost: String,
    },
    /// The request's submission key is malformed (`submit_key.rs`; the message names the field).
    #[error("{0}")]
    SubmitKey(String),
    /// The submission key names a job submitted with another jobspec: one key, one submission.
    #[error("submit_key: already names job {id}, submitted with another jobspec (use a new key for a new job)")]
    SubmitKeyReused {
        /// The job the key names.
        id: JobId,
    },
}

impl JobCore {
    /// Submit a jobspec (RFC 25, as JSON) for `userid`, without standard input. Refuses malformed and
    /// never-satisfiable requests without creating anything.
    pub fn submit(&mut self, now: f64, jobspec: &Value, userid: u32) -> Result<JobId, SubmitError> {
        self.submit_with_stdin(now, jobspec, userid, false)
    }

    /// [`JobCore::submit`], with `stdin` true for a job whose standard input the submitter will stream
    /// ([`JobCore::stdin`], as `vigil run` does): set before the job can be scheduled, since its shells, which
    /// may start at once, ask rank 0 for it only then.
    pub fn submit_with_stdin(
        &mut self,
        now: f64,
        jobspec: &Value,
        userid: u32,
        stdin: bool,
    ) -> Result<JobId, SubmitError> {
        self.submit_urgent(now, jobspec, userid, stdin, super::DEFAULT_URGENCY)
    }

    /// [`JobCore::submit_with_stdin`], with the job's RFC 21 `urgency` (0 holds it, 31 expedites it; the caller
    /// checked it is at most [`super::MAX_URGENCY`] and who may ask for it, `urgency.rs`).
    pub fn submit_urgent(
        &mut self,
        now: f64,
        jobspec: &Value,
        userid: u32,
        stdin: bool,
        urgency: u32,
    ) -> Result<JobId, SubmitError> {
        let urgency = urgency.min(super::MAX_URGENCY);
        let spec = Jobspec::from_value(jobspec).map_err(|e| SubmitError::Jobspec(e.to_string()))?;
        let mut req = spec.validate().map_err(|e| SubmitError::Jobspec(e.to_string()))?;
        let deps = super::depend::Dependency::all_of(jobspec).map_err(SubmitError::Jobspec)?;
        self.depend_check(&deps).map_err(SubmitError::Jobspec)?;
        if let Some(k) = req.kill_timeout() {
            // A job may choose any kill timeout up to the admin's bound (and the instance's own is always fine).
            let max = self.kill_timeout_max.max(self.kill_timeout);
            if k > max {
                let fmt = crate::attrs::fmt_duration;
                return Err(SubmitError::Jobspec(format!(
                    "attributes.system.shell.options.kill-timeout: {} is more than this instance allows, {} \
                     (exec.kill-timeout-max)",
                    fmt(k),
                    fmt(max)
                )));
            }
        }
        if let crate::taskmap::Scheme::Hostfile { .. } = &req.taskmap {
            // A host the instance does not have: the job could never run (its nodes are the hostfile's).
            let known: std::collections::BTreeSet<&str> =
                self.pool.ranks.values().map(|p| p.hostname.as_str()).collect();
            let unknown: crate::hostlist::Hostlist =
                req.taskmap.hosts().into_iter().filter(|h| !known.contains(h.as_str())).collect();
            if !unknown.is_empty() {
                return Err(SubmitError::Jobspec(format!(
                    "attributes.system.shell.options.taskmap: the hostfile names {unknown}, not a node of this \
                     instance"
                )));
            }
        }
        // Nodes the constraints name that this instance does not have (a typo, most likely): said either way.
        let unknown = req.constraint.as_ref().map(|c| self.unknown_nodes(c)).filter(|u| !u.is_empty());
        if let Err(err) = self.pool.feasible(&req) {
            if let Some(unknown) = unknown {
                return Err(SubmitError::UnknownNodes { err, unknown });
            }
            let mut whole = self.pool.clone();
            whole.ranks.values_mut().for_each(|p| p.removed = false);
            if !self.shrunk.is_empty() && whole.feasible(&req).is_ok() {
                return Err(SubmitError::Shrunk { err, lost: self.shrunk.join(", ") });
            }
            return Err(err.into());
        }
        if let Some(u) = unknown {
            req.warnings.push(format!("attributes.system.constraints: {u}"));
        }
        if req.duration.is_none() {
            // sched.default-duration: the time limit of a job submitted without one.
            req.duration = self.config.default_duration;
        }
        let id = self.new_id(now);
        let mut job = Job::new(id, userid, jobspec, req, now);
        job.stdin_eof = !stdin;
        job.urgency = urgency;
        job.post(now, "submit", json!({"userid": userid, "urgency": urgency, "flags": 0, "version": 1}));
        job.post(now, "validate", json!({}));
        if deps.is_empty() {
            job.post(now, "depend", json!({}));
            job.post(now, "priority", json!({"priority": urgency}));
            self.jobs.insert(id, job);
            self.queue.insert(id, urgency);
            self.actions.push_back(Action::Updated(id));
            self.schedule_submitted(now, id);
            return Ok(id);
        }
        self.jobs.insert(id, job);
        self.actions.push_back(Action::Updated(id));
        // It waits in DEPEND (depend.rs), unless every dependency is met already.
        let released = self.depend.released;
        self.depend_start(now, id, deps);
        self.depend.released = released;
        if self.jobs.get(&id).is_some_and(|j| j.state == super::JobState::Sched) {
            self.schedule_submitted(now, id);
        }
        Ok(id)
    }

    /// What constraint `c` names that no node of this instance is (host names none of its brokers registered,
    /// ranks none of them has), said in a few words: empty when it names only known nodes.
    fn unknown_nodes(&self, c: &crate::constraint::Constraint) -> String {
        let (hosts, ranks) = c.named();
        let known: std::collections::BTreeSet<&str> = self.pool.ranks.values().map(|p| p.hostname.as_str()).collect();
        let hosts: crate::hostlist::Hostlist = hosts.iter().filter(|h| !known.contains(h.as_str())).cloned().collect();
        let ranks: IdSet = ranks.iter().filter(|r| !self.pool.ranks.contains_key(r)).collect();
        let mut parts = Vec::new();
        if !hosts.is_empty() {
            let verb = if hosts.len() == 1 { "is not a node" } else { "are not nodes" };
            parts.push(format!("{hosts} {verb} of this instance"));
        }
        if !ranks.is_empty() {
            parts.push(format!("no broker of rank {ranks} has joined this instance"));
        }
        parts.join("; ")
    }

    fn new_id(&mut self, now: f64) -> JobId {
        let ms = ((now - self.epoch).max(0.0) * 1000.0) as u64;
        if ms > self.last_ms {
            self.last_ms = ms;
            self.seq = 0;
        } else {
            self.seq += 1;
            if self.seq >= 1024 {
                self.last_ms += 1;
                self.seq = 0;
            }
        }
        JobId::from_parts(self.last_ms, self.seq)
    }
}
