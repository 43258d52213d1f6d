//! A guest's munge credential authorizes one submission (docs/security.md, "Credentials that wait").
//!
//! In a multi-user instance a guest's submission carries a munge credential the guest made over the jobspec
//! ([`super::SubmitRequest::credential`]); `vigil-imp` checks it on each node before it runs the job's shell as
//! the guest. `vigil-imp` accepts a credential past munge's TTL, or one its node's munged decoded before, within
//! its own `credential-max-age`: a job may wait in the queue for hours, or be requeued onto a node that ran it
//! before. What munge's replay check gave, that a credential is used once, is kept here, where submissions
//! arrive:
//! - A submission whose credential is one a job the core holds already has is refused
//!   ([`SubmitError::CredentialReused`], naming the field and that job): `vigil submit` makes a new credential
//!   for every submission, so only a replay sends one twice.
//! - A submission sent again with its submission key (`submit_key.rs`) is that job, not a second use.
//! - The index is bounded by the jobs held: a credential is forgotten with its job's purge (`purge.rs`) and
//!   restored with the job after a restart ([`JobCore::restore`]). Past its purge, a replayed credential makes a
//!   job that `vigil-imp` still refuses once it is older than `credential-max-age`; and it is the same user's
//!   very jobspec, in this instance, that such a replay runs (the credential binds both).

use super::{JobCore, JobId, SubmitError};

/// Index of the credentials of the jobs held: credential text → job.
pub(super) type CredentialIndex = std::collections::HashMap<std::sync::Arc<str>, JobId>;

impl JobCore {
    /// Whether `credential` may make a new job.
    ///
    /// # Errors
    /// [`SubmitError::CredentialReused`]: a job the core holds has it already.
    pub(super) fn credential_unused(&self, credential: Option<&str>) -> Result<(), SubmitError> {
        match credential.and_then(|c| self.credentials.get(c)) {
            Some(&id) => Err(SubmitError::CredentialReused { id }),
            None => Ok(()),
        }
    }

    /// Job `id`'s credential, if it has one, is known from now on (at submission, or restored).
    pub(super) fn keep_credential(&mut self, id: JobId) {
        if let Some(c) = self.jobs.get(&id).and_then(|j| j.credential.as_ref()) {
            self.credentials.insert(std::sync::Arc::from(c.credential.as_str()), id);
        }
    }

    /// Job `job` goes (purged): its credential with it.
    pub(super) fn forget_credential(&mut self, job: &super::Job) {
        if let Some(c) = &job.credential {
            if self.credentials.get(c.credential.as_str()) == Some(&job.id) {
                self.credentials.remove(c.credential.as_str());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::jobs::journal::Kept;
    use crate::jobs::tests::{actions, cmd, core, spec, T0};
    use crate::jobs::{JobCore, SubmitError, SubmitKey, SubmitRequest, Submitted};
    use serde_json::json;

    const CRED: &str = "MUNGE:AwQFAAB0ZXN0Y3JlZGVudGlhbA==:";

    /// A credential makes one job: sent again with another submission, it is refused naming the field and the job
    /// that has it; a new credential makes a new job; the same submission sent again with its key is that job.
    #[test]
    fn a_credential_makes_one_job() {
        let mut c = core(2, 2, 0);
        let s = spec(cmd().ntasks(1));
        let key = || Some(SubmitKey::parse(&json!("k1")).unwrap());
        let sub = |cred: &str| SubmitRequest::new(&s, 1001).credential(Some(cred.to_string()));
        let first = c.submit(T0, sub(CRED).key(key())).expect("accepted").id;
        actions(&mut c);
        let e = c.submit(T0 + 1.0, sub(CRED)).expect_err("a replay");
        assert!(matches!(e, SubmitError::CredentialReused { id } if id == first), "{e:?}");
        let text = e.to_string();
        assert!(text.starts_with("credential:") && text.contains(&first.to_string()), "{text}");
        assert!(text.contains("replay"), "{text}");
        assert_eq!(c.jobs.len(), 1, "nothing made");
        let again = c.submit(T0 + 2.0, sub(CRED).key(key())).expect("its key: the same job");
        assert_eq!(again, Submitted { id: first, duplicate: true });
        let second = c.submit(T0 + 3.0, sub("MUNGE:another:")).expect("a new credential").id;
        assert_ne!(second, first);
        // Jobs without a credential (the owner's) are not indexed.
        c.submit(T0 + 4.0, SubmitRequest::new(&s, 0)).expect("accepted");
        c.submit(T0 + 4.0, SubmitRequest::new(&s, 0)).expect("accepted");
        assert_eq!(c.credentials.len(), 2);
    }

    /// Restored with its job after a restart, forgotten with its purge.
    #[test]
    fn a_restored_core_knows_the_credentials_kept() {
        let mut c = core(2, 2, 0);
        c.enable_journal();
        let s = spec(cmd().ntasks(1));
        let id = c.submit(T0, SubmitRequest::new(&s, 1001).credential(Some(CRED.into()))).expect("accepted").id;
        let mut kept = Kept::default();
        let b = c.journal().expect("a batch");
        kept.apply(&b).expect("applies");
        c.journal_saved(&b);
        let mut c2 = JobCore::new(T0 + 10.0);
        c2.restore(T0 + 10.0, kept);
        let e = c2.submit(T0 + 11.0, SubmitRequest::new(&s, 1001).credential(Some(CRED.into())));
        assert!(matches!(e, Err(SubmitError::CredentialReused { id: x }) if x == id), "{e:?}");
        let j = c2.jobs.remove(&id).expect("restored");
        c2.forget_credential(&j);
        assert!(c2.credentials.is_empty());
        c2.submit(T0 + 12.0, SubmitRequest::new(&s, 1001).credential(Some(CRED.into()))).expect("forgotten");
    }
}
