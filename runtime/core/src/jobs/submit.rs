//! Submission: a jobspec is parsed, validated and checked against what the instance could ever run (refusals are
//! [`SubmitError`]s naming the field), then queued as a new job with an id that grows with time.

use super::{sched, Action, Job, JobCore, JobId, SubmitKey, Submitted};
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
    /// The munge credential is one a job held has already: a replay (`credentials.rs`).
    #[error(
        "credential: already used by job {id}, a replay (a munge credential authorizes one submission: vigil submit \
         makes a new one each time)"
    )]
    CredentialReused {
        /// The job that has it.
        id: JobId,
    },
}

/// One submission to [`JobCore::submit`]: the jobspec, who submits it, and what else the submitter asked for.
///
/// [`SubmitRequest::new`] makes the common case (no standard input, the default urgency, no key); the builder
/// methods of the same names as the fields set the rest:
/// `SubmitRequest::new(&jobspec, uid).stdin(true).urgency(20).key(Some(key))`.
#[derive(Clone, Debug)]
pub struct SubmitRequest<'a> {
    /// The jobspec (RFC 25, as JSON), as the client sent it.
    pub jobspec: &'a Value,
    /// The submitting user's uid, which the job runs as.
    pub userid: u32,
    /// True for a job whose standard input the submitter will stream ([`JobCore::stdin`], as `vigil run` does):
    /// set before the job can be scheduled, since its shells, which may start at once, ask rank 0 for it only
    /// then. Default false: the tasks' standard input is at end of file.
    pub stdin: bool,
    /// The job's RFC 21 urgency, 0 (held) to [`super::MAX_URGENCY`] (expedited); larger values are taken as
    /// [`super::MAX_URGENCY`]. The caller checked who may ask for it (`urgency.rs`). Default
    /// [`super::DEFAULT_URGENCY`].
    pub urgency: u32,
    /// The client's submission key, if it sent one (`submit_key.rs`): the job that key already names, if the core
    /// holds one, is the answer instead of a new job. Default none: every submission makes a new job.
    pub key: Option<SubmitKey>,
    /// The submitter's munge credential over the jobspec's text as sent (`vigil_client::munge`), kept with the
    /// job for `vigil-imp` ([`crate::shellproto::ImpCredential`]); never decoded here. Default none.
    pub credential: Option<String>,
}

impl<'a> SubmitRequest<'a> {
    /// `jobspec` submitted by `userid`, without standard input, at the default urgency, without a key.
    pub fn new(jobspec: &'a Value, userid: u32) -> Self {
        SubmitRequest { jobspec, userid, stdin: false, urgency: super::DEFAULT_URGENCY, key: None, credential: None }
    }

    /// This request with [`SubmitRequest::stdin`] set.
    #[must_use]
    pub fn stdin(mut self, stdin: bool) -> Self {
        self.stdin = stdin;
        self
    }

    /// This request with [`SubmitRequest::urgency`] set.
    #[must_use]
    pub fn urgency(mut self, urgency: u32) -> Self {
        self.urgency = urgency;
        self
    }

    /// This request with [`SubmitRequest::key`] set.
    #[must_use]
    pub fn key(mut self, key: Option<SubmitKey>) -> Self {
        self.key = key;
        self
    }

    /// This request with [`SubmitRequest::credential`] set.
    #[must_use]
    pub fn credential(mut self, credential: Option<String>) -> Self {
        self.credential = credential;
        self
    }
}

impl JobCore {
    /// Submit `req` at wall time `now` (seconds since the Unix epoch): the new job's id, or, when `req.key` names
    /// a job the core holds, that job's id marked a duplicate ([`Submitted`], `submit_key.rs`).
    ///
    /// # Errors
    /// Refuses malformed and never-satisfiable requests without creating anything ([`SubmitError`], naming the
    /// field); [`SubmitError::SubmitKeyReused`] when `req.key` names a job submitted with another jobspec.
    pub fn submit(&mut self, now: f64, req: SubmitRequest<'_>) -> Result<Submitted, SubmitError> {
        let Some(key) = req.key.clone() else {
            let id = self.enqueue(now, &req)?;
            self.keep_credential(id);
            return Ok(Submitted { id, duplicate: false });
        };
        if let Some(id) = self.duplicate_of(req.userid, &key, req.jobspec)? {
            return Ok(Submitted { id, duplicate: true });
        }
        let id = self.enqueue(now, &req)?;
        self.keep_credential(id);
        self.keep_submit_key(id, key);
        Ok(Submitted { id, duplicate: false })
    }

    /// Parse, validate and queue `req` as a new job (its key aside).
    fn enqueue(&mut self, now: f64, req: &SubmitRequest<'_>) -> Result<JobId, SubmitError> {
        let SubmitRequest { jobspec, userid, stdin, urgency, key: _, ref credential } = *req;
        self.credential_unused(credential.as_deref())?;
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
        check_warning(&req)?;
        let id = self.new_id(now);
        let mut job = Job::new(id, userid, jobspec, req, now);
        job.credential = credential.as_ref().map(|c| {
            std::sync::Arc::new(crate::shellproto::ImpCredential {
                credential: c.clone(),
                jobspec: job.jobspec_text.to_string(),
            })
        });
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

/// A warning signal (`--signal`, the shell option `signal`) must come before the time limit: `timeleft` below the
/// job's duration (after `sched.default-duration`). A job without a time limit is never warned, and is accepted.
///
/// # Errors
/// `attributes.system.shell.options.signal: ...` naming both times.
pub(super) fn check_warning(req: &crate::jobspec::JobRequest) -> Result<(), SubmitError> {
    if let (Some(w), Some(d)) = (req.signal, req.duration) {
        if w.timeleft >= d {
            let fmt = crate::attrs::fmt_duration;
            return Err(SubmitError::Jobspec(format!(
                "attributes.system.shell.options.signal: {} {} before the time limit must be less than the time \
                 limit itself ({})",
                crate::jobspec::signal_label(w.signum),
                fmt(w.timeleft),
                fmt(d)
            )));
        }
    }
    Ok(())
}
