//! Idempotent submission: a key the client chooses for each submission (`submit_key` of `job-manager.submit`).
//!
//! A client that lost its connection to rank 0 with a submission in flight cannot know whether rank 0 made the
//! job durable before it died (docs/statedir.md). Sent again blindly, the submission would become a second job;
//! not sent, it may be lost. With a submission key the client may send it again, as often as it needs to: the
//! job exists once.
//!
//! The rules ([`JobCore::submit`] with a [`super::SubmitRequest::key`]):
//! - A key is a string of 1 to [`SUBMIT_KEY_MAX`] printable ASCII characters (no space or control character), e.g.
//!   a random 128-bit number in hex or a UUID; anything else is refused, naming the field ([`SubmitKey::parse`]).
//! - Keys are per submitting user: the same key from two users names two submissions.
//! - A submission whose (user, key) names a job the core holds makes no new job: the answer is that job's id,
//!   marked a duplicate ([`Submitted::duplicate`]). Its jobspec must be the one that job was submitted with, else
//!   it is refused ([`SubmitError::SubmitKeyReused`]): one key, one submission.
//! - The key is kept with the job: in the journal's first record of the job ([`super::journal::JobRecord`]), so in
//!   the state directory, and restored with it ([`JobCore::restore`]). A key lives as long as its job: once the
//!   job is purged (`purge.rs`) the key is forgotten, and the same key would make a new job. So the index is
//!   bounded by the jobs kept, and a client should not send a submission again later than the instance's purge
//!   limits (`job-manager.inactive-age-limit`, `-num-limit`), which a retry within a restart's outage never is.
//! - A submission without a key (an older client) makes a new job every time, as before.

use super::{JobCore, JobId, SubmitError};
use serde_json::Value;
use std::sync::Arc;

/// The longest submission key taken (bytes): room for a UUID (36) or a 128-bit number in hex (32) with a prefix,
/// small enough that the keys of every job kept cost little.
pub const SUBMIT_KEY_MAX: usize = 128;

/// A client's key for one submission (module doc): 1 to [`SUBMIT_KEY_MAX`] printable ASCII characters.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SubmitKey(Arc<str>);

impl SubmitKey {
    /// The `submit_key` field of a `job-manager.submit` request.
    ///
    /// # Errors
    /// [`SubmitError::SubmitKey`], naming the field: not a string, empty, longer than [`SUBMIT_KEY_MAX`], or
    /// holding a character other than printable ASCII.
    pub fn parse(v: &Value) -> Result<SubmitKey, SubmitError> {
        match v {
            Value::String(s) => SubmitKey::parse_str(s),
            other => Err(SubmitError::SubmitKey(format!(
                "submit_key: must be a string (e.g. a random 128-bit number in hex), not {}",
                crate::json_kind(other)
            ))),
        }
    }

    /// [`SubmitKey::parse`] of a string (as kept in the state directory).
    ///
    /// # Errors
    /// As [`SubmitKey::parse`].
    pub fn parse_str(s: &str) -> Result<SubmitKey, SubmitError> {
        if s.is_empty() || s.len() > SUBMIT_KEY_MAX {
            return Err(SubmitError::SubmitKey(format!(
                "submit_key: must be 1 to {SUBMIT_KEY_MAX} characters long, not {}",
                s.len()
            )));
        }
        if let Some(c) = s.chars().find(|c| !c.is_ascii_graphic()) {
            return Err(SubmitError::SubmitKey(format!(
                "submit_key: {c:?} is not allowed: printable ASCII characters only, no space"
            )));
        }
        Ok(SubmitKey(Arc::from(s)))
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The key as text, shared (the journal's record holds it without a copy).
    pub fn shared(&self) -> Arc<str> {
        self.0.clone()
    }
}

impl std::fmt::Display for SubmitKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a submission made ([`JobCore::submit`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Submitted {
    /// The job.
    pub id: JobId,
    /// The submission's key named a job already held: no new job was made, `id` is that job's.
    pub duplicate: bool,
}

/// Index of the keys of the jobs held: (submitting user, key) → job.
pub(super) type KeyIndex = std::collections::HashMap<(u32, SubmitKey), JobId>;

impl JobCore {
    /// The job `userid`'s key `key` already names, if the core holds one, submitted with `jobspec`.
    ///
    /// # Errors
    /// [`SubmitError::SubmitKeyReused`] when the job it names was submitted with another jobspec.
    pub(super) fn duplicate_of(
        &self,
        userid: u32,
        key: &SubmitKey,
        jobspec: &Value,
    ) -> Result<Option<JobId>, SubmitError> {
        let Some(&id) = self.submit_keys.get(&(userid, key.clone())) else { return Ok(None) };
        let same = self.jobs.get(&id).is_some_and(|j| *j.jobspec_text == *jobspec.to_string().as_str());
        if !same {
            return Err(SubmitError::SubmitKeyReused { id });
        }
        Ok(Some(id))
    }

    /// The job that `userid`'s submission key `key` names, if the core holds one.
    pub fn job_of_submit_key(&self, userid: u32, key: &SubmitKey) -> Option<JobId> {
        self.submit_keys.get(&(userid, key.clone())).copied()
    }

    /// Job `id` was submitted with `key` (at submission, or restored from the state directory).
    pub(super) fn keep_submit_key(&mut self, id: JobId, key: SubmitKey) {
        let Some(job) = self.jobs.get_mut(&id) else { return };
        self.submit_keys.insert((job.userid, key.clone()), id);
        job.submit_key = Some(key);
    }

    /// Job `job` goes (purged): its key with it.
    pub(super) fn forget_submit_key(&mut self, job: &super::Job) {
        if let Some(k) = &job.submit_key {
            let entry = (job.userid, k.clone());
            if self.submit_keys.get(&entry) == Some(&job.id) {
                self.submit_keys.remove(&entry);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jobs::journal::Kept;
    use crate::jobs::purge::PurgeRequest;
    use crate::jobs::tests::{actions, cmd, core, exit_shell, spec, T0};
    use crate::jobs::SubmitRequest;
    use serde_json::json;

    fn key(s: &str) -> Option<SubmitKey> {
        Some(SubmitKey::parse(&json!(s)).expect("a key"))
    }

    /// A submission sent again with its key gets the job the first made, marked a duplicate, and makes nothing
    /// new; the same key from another user, or no key at all (an older client), makes a new job.
    #[test]
    fn a_submission_sent_again_with_its_key_is_the_same_job() {
        let mut c = core(2, 2, 0);
        let s = spec(cmd().ntasks(1));
        let first = c.submit(T0 + 1.0, SubmitRequest::new(&s, 1000).key(key("0123abcd"))).expect("accepted");
        assert!(!first.duplicate);
        actions(&mut c);
        let again = c.submit(T0 + 2.0, SubmitRequest::new(&s, 1000).key(key("0123abcd"))).expect("accepted");
        assert_eq!(again, Submitted { id: first.id, duplicate: true });
        assert!(actions(&mut c).is_empty(), "nothing new to do");
        assert_eq!(c.jobs.len(), 1);
        assert_eq!(c.job_of_submit_key(1000, &SubmitKey::parse_str("0123abcd").unwrap()), Some(first.id));
        let other_user = c.submit(T0 + 3.0, SubmitRequest::new(&s, 1001).key(key("0123abcd"))).expect("accepted");
        assert!(!other_user.duplicate && other_user.id != first.id, "keys are per user");
        let keyless = [
            c.submit(T0 + 4.0, SubmitRequest::new(&s, 1000).key(None)),
            c.submit(T0 + 4.0, SubmitRequest::new(&s, 1000).key(None)),
        ];
        let keyless: Vec<Submitted> = keyless.into_iter().map(|r| r.expect("accepted")).collect();
        assert!(keyless.iter().all(|k| !k.duplicate) && keyless[0].id != keyless[1].id, "{keyless:?}");
        assert_eq!(c.jobs.len(), 4);
    }

    /// One key, one submission: the same key with another jobspec is refused, naming the field and the job.
    #[test]
    fn a_key_sent_with_another_jobspec_is_refused() {
        let mut c = core(2, 2, 0);
        let id = c.submit(T0, SubmitRequest::new(&spec(cmd().ntasks(1)), 1000).key(key("k1"))).expect("accepted").id;
        let e = c.submit(T0, SubmitRequest::new(&spec(cmd().ntasks(2)), 1000).key(key("k1"))).expect_err("refused");
        assert!(matches!(e, SubmitError::SubmitKeyReused { id: x } if x == id), "{e:?}");
        assert!(e.to_string().starts_with("submit_key:") && e.to_string().contains(&id.to_string()), "{e}");
        assert_eq!(c.jobs.len(), 1);
    }

    /// A key that is not a string, is empty or too long, or holds a space or a control character is refused,
    /// naming the field; the longest allowed is taken.
    #[test]
    fn bad_keys_are_refused_naming_the_field() {
        for bad in [json!(5), json!(null), json!(["a"]), json!(""), json!("a b"), json!("é"), json!("a\n")] {
            let e = SubmitKey::parse(&bad).expect_err("refused");
            assert!(e.to_string().starts_with("submit_key: "), "{bad}: {e}");
        }
        let e = SubmitKey::parse(&json!("x".repeat(SUBMIT_KEY_MAX + 1))).expect_err("too long");
        assert!(e.to_string().contains(&SUBMIT_KEY_MAX.to_string()), "{e}");
        SubmitKey::parse(&json!("x".repeat(SUBMIT_KEY_MAX))).expect("the longest taken");
        SubmitKey::parse(&json!("6f1c3e1e-6a40-4bb3-9d3c-5a1f0e2b7c11")).expect("a UUID");
    }

    /// Save every batch the core has into `kept`.
    fn save(c: &mut JobCore, kept: &mut Kept) {
        if let Some(b) = c.journal() {
            kept.apply(&b).expect("applies");
            c.journal_saved(&b);
        }
    }

    /// The key is kept with its job in the journal and comes back at a restore: a submission rank 0 made
    /// durable before it died, sent again after its restart, is that job. One whose batch was never saved (rank 0
    /// died before its commit) is unknown to the restarted rank 0: sent again, it makes the job, once.
    #[test]
    fn a_restored_core_knows_the_keys_kept() {
        let mut c = core(2, 2, 0);
        c.enable_journal();
        let s = spec(cmd().ntasks(1));
        let kept_id = c.submit(T0 + 1.0, SubmitRequest::new(&s, 1000).key(key("kept"))).expect("accepted").id;
        let mut kept = Kept::default();
        save(&mut c, &mut kept);
        assert_eq!(kept.jobs[&kept_id].submit_key.as_deref(), Some("kept"));
        let lost = c.submit(T0 + 2.0, SubmitRequest::new(&s, 1000).key(key("unsaved"))).expect("accepted").id;
        let later = c.journal().expect("a batch");
        let record = later.jobs.iter().find(|r| r.id == lost).expect("the job's first batch");
        assert_eq!(record.submit_key.as_deref(), Some("unsaved"));
        // Rank 0 dies before that batch is saved; it restarts on what was kept.
        let mut c2 = JobCore::new(T0 + 10.0);
        c2.restore(T0 + 10.0, kept.clone());
        let again = c2.submit(T0 + 11.0, SubmitRequest::new(&s, 1000).key(key("kept"))).expect("accepted");
        assert_eq!(again, Submitted { id: kept_id, duplicate: true });
        let unsaved = c2.submit(T0 + 11.0, SubmitRequest::new(&s, 1000).key(key("unsaved"))).expect("accepted");
        assert!(!unsaved.duplicate && unsaved.id > kept_id, "{unsaved:?}");
        let third = c2.submit(T0 + 12.0, SubmitRequest::new(&s, 1000).key(key("unsaved"))).expect("accepted");
        assert_eq!(third, Submitted { duplicate: true, ..unsaved });
        assert_eq!(c2.jobs.len(), 2);
        // The key is kept once, with the first batch of its job.
        c2.enable_journal();
        save(&mut c2, &mut kept);
        assert_eq!(kept.jobs[&unsaved.id].submit_key.as_deref(), Some("unsaved"));
        assert_eq!(kept.jobs[&kept_id].submit_key.as_deref(), Some("kept"));
    }

    /// A purged job's key goes with it: the index is bounded by the jobs kept.
    #[test]
    fn a_purged_jobs_key_is_forgotten() {
        let mut c = core(1, 2, 0);
        let s = spec(cmd().ntasks(1));
        let id = c.submit(T0, SubmitRequest::new(&s, 1000).key(key("k"))).expect("accepted").id;
        actions(&mut c);
        c.shell_spawned(T0 + 1.0, id, 0, Ok(()));
        exit_shell(&mut c, T0 + 2.0, id, 0, 0);
        c.purge(T0 + 3.0, &PurgeRequest { ids: vec![id], force: true, ..Default::default() }).expect("purged");
        assert_eq!(c.job_of_submit_key(1000, &SubmitKey::parse_str("k").unwrap()), None);
        let next = c.submit(T0 + 4.0, SubmitRequest::new(&s, 1000).key(key("k"))).expect("accepted");
        assert!(!next.duplicate && next.id != id);
    }
}
