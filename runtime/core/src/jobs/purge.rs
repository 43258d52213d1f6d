//! Purging INACTIVE jobs, as Flux's job manager does (`job-manager.inactive-age-limit`,
//! `job-manager.inactive-num-limit`, `flux job purge`).
//!
//! An INACTIVE job is kept whole (record, eventlog, R, the tail of its output) until it is purged: rank 0's
//! memory (a few KiB per job) and its state directory grow with every job a system instance ever ran, and
//! `vigil jobs -a` lists them all. A purged job is gone from the job core and from the store (`broker/store.rs`)
//! in the same batch; `vigil job info ID` then answers "unknown job id".
//!
//! The rules:
//! - **Automatic**, by [`SchedConfig`](super::SchedConfig)'s `inactive_age_limit` (seconds; a job inactive for
//!   longer goes) and `inactive_num_limit` (the oldest inactive jobs beyond that many go). Both are off by default,
//!   as in Flux. Checked from [`JobCore::handle_timeout`], through [`JobCore::next_deadline`], never in the turn a
//!   job became inactive: its watchers (`vigil run`, `job attach`) get its last events first.
//! - **By request** ([`JobCore::purge`], `vigil job purge`, the instance owner only): the inactive jobs older than
//!   an age limit, or the oldest beyond a count, or the given ids; without `force` only counted.
//!
//! "Oldest" is the order jobs became inactive ([`JobCore`]'s `inactive` queue, filled in that order), so each rule
//! looks only at the jobs it purges, whatever the number kept.

use super::{JobCore, JobId, JobState};

/// The least time between a job becoming inactive and its automatic purge (s): it is never purged in the turn
/// it ended, so that its watchers get its last events.
pub const PURGE_AFTER: f64 = 0.001;

/// Why a purge request was refused ([`JobCore::purge`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PurgeError {
    /// A given id is not a job.
    #[error("unknown job id {0}")]
    Unknown(JobId),
    /// A given job is still active.
    #[error("job {0} is not inactive")]
    Active(JobId),
    /// Neither a limit nor an id was given.
    #[error("give an age limit, a count limit or job ids")]
    Nothing,
}

/// What [`JobCore::purge`] is asked to purge.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PurgeRequest {
    /// Inactive jobs that became inactive more than this many seconds ago.
    pub age_limit: Option<f64>,
    /// The oldest inactive jobs beyond this many.
    pub num_limit: Option<usize>,
    /// These jobs, which must be inactive.
    pub ids: Vec<JobId>,
    /// Purge them; without, only count them.
    pub force: bool,
}

impl JobCore {
    /// Note that job `id` has just become INACTIVE (for the purge rules, in that order).
    pub(super) fn became_inactive(&mut self, id: JobId) {
        self.inactive.push_back(id);
        self.inactive_kept += 1;
        self.record_history(id);
    }

    /// The inactive jobs oldest first, as the queue says, skipping entries of jobs purged by id.
    fn oldest_inactive(&self) -> impl Iterator<Item = (JobId, f64)> + '_ {
        self.inactive.iter().filter_map(|id| {
            let j = self.jobs.get(id).filter(|j| j.state == JobState::Inactive)?;
            Some((*id, j.t_inactive.unwrap_or(0.0)))
        })
    }

    /// How many inactive jobs are kept.
    pub fn inactive_count(&self) -> usize {
        self.inactive_kept
    }

    /// When the automatic rules next purge a job, if ever (s since the epoch).
    pub(super) fn purge_deadline(&self) -> Option<f64> {
        let (_, t) = self.oldest_inactive().next()?;
        let over = self.config.inactive_num_limit.is_some_and(|n| self.inactive_kept > n);
        let by_count = over.then_some(t + PURGE_AFTER);
        let by_age = self.config.inactive_age_limit.map(|a| t + a.max(PURGE_AFTER));
        [by_count, by_age].into_iter().flatten().min_by(f64::total_cmp)
    }

    /// Apply the automatic rules at `now`.
    pub(super) fn purge_due(&mut self, now: f64) {
        let (age, num) = (self.config.inactive_age_limit, self.config.inactive_num_limit);
        if age.is_none() && num.is_none() {
            return;
        }
        loop {
            let Some((id, t)) = self.oldest_inactive().next() else { break };
            if t + PURGE_AFTER > now {
                break;
            }
            let old = age.is_some_and(|a| t + a <= now);
            let over = num.is_some_and(|n| self.inactive_kept > n);
            if !(old || over) {
                break;
            }
            self.remove_inactive(id);
        }
    }

    /// Purge or count the inactive jobs `req` names (see the module docs) at `now`. Returns how many were (or,
    /// without `force`, would be) purged.
    ///
    /// Errors: [`PurgeError::Nothing`] without a limit or an id; a given id that is not a job or not inactive (then
    /// nothing is purged).
    pub fn purge(&mut self, now: f64, req: &PurgeRequest) -> Result<usize, PurgeError> {
        if req.age_limit.is_none() && req.num_limit.is_none() && req.ids.is_empty() {
            return Err(PurgeError::Nothing);
        }
        let mut chosen = Vec::new();
        for id in &req.ids {
            match self.jobs.get(id) {
                None => return Err(PurgeError::Unknown(*id)),
                Some(j) if j.state != JobState::Inactive => return Err(PurgeError::Active(*id)),
                Some(_) => chosen.push(*id),
            }
        }
        let mut left = self.inactive_kept;
        for (id, t) in self.oldest_inactive() {
            let old = req.age_limit.is_some_and(|a| t + a <= now);
            let over = req.num_limit.is_some_and(|n| left > n);
            if !(old || over) {
                break;
            }
            left -= 1;
            if !chosen.contains(&id) {
                chosen.push(id);
            }
        }
        if req.force {
            for id in &chosen {
                self.remove_inactive(*id);
            }
        }
        Ok(chosen.len())
    }

    /// Remove inactive job `id` from the core, and from the store with the next batch.
    fn remove_inactive(&mut self, id: JobId) {
        let Some(j) = self.jobs.remove(&id) else { return };
        self.forget_submit_key(&j);
        self.forget_credential(&j);
        self.inactive_kept = self.inactive_kept.saturating_sub(1);
        if !j.output.is_empty() {
            self.inactive_output_bytes = self.inactive_output_bytes.saturating_sub(j.output_bytes);
        }
        // Its entries in the queues are skipped from now on; drop those at the front at once.
        while self.inactive.front().is_some_and(|f| !self.jobs.contains_key(f)) {
            self.inactive.pop_front();
        }
        if let Some(d) = self.actions.dirty.as_mut() {
            d.remove(&id);
            self.purged.push(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jobs::tests::{actions, cmd, core, exit_shell, spec, T0};
    use crate::jobs::SubmitRequest;

    /// A `true` job on one node submitted at `t`, run to INACTIVE at `t + 0.5`.
    fn submit_true(c: &mut JobCore, t: f64) -> JobId {
        let id = submit_sleep(c, t);
        exit_shell(c, t + 0.5, id, 0, 0);
        assert_eq!(c.jobs[&id].state, JobState::Inactive);
        id
    }

    /// A one-node job submitted at `t` and left running.
    fn submit_sleep(c: &mut JobCore, t: f64) -> JobId {
        let id = c.submit(t, SubmitRequest::new(&spec(cmd().nnodes(1)), 1000)).unwrap().id;
        let _ = actions(c);
        c.shell_spawned(t, id, 0, Ok(()));
        id
    }

    /// A core with `n` jobs run to INACTIVE, one per second from T0.
    fn ended(n: usize, age: Option<f64>, num: Option<usize>) -> (JobCore, Vec<JobId>) {
        let mut c = core(1, 1, 0);
        c.config.inactive_age_limit = age;
        c.config.inactive_num_limit = num;
        let mut ids = Vec::new();
        for i in 0..n {
            ids.push(submit_true(&mut c, T0 + i as f64));
        }
        (c, ids)
    }

    #[test]
    fn without_limits_nothing_is_ever_purged() {
        let (mut c, ids) = ended(5, None, None);
        assert_eq!(c.purge_deadline(), None);
        c.handle_timeout(T0 + 1e6);
        assert!(ids.iter().all(|id| c.jobs.contains_key(id)));
        assert_eq!(c.inactive_count(), 5);
    }

    #[test]
    fn the_oldest_beyond_the_count_limit_go_but_not_in_the_turn_they_ended() {
        let (mut c, ids) = ended(5, None, Some(2));
        // Each job ended in its own turn; none has been purged by the turn itself.
        assert_eq!(c.inactive_count(), 5);
        let due = c.next_deadline().expect("a purge is due");
        assert!(due > T0 && due < T0 + 5.0, "{due}");
        c.handle_timeout(T0 + 10.0);
        assert_eq!(c.inactive_count(), 2);
        assert!(!c.jobs.contains_key(&ids[0]) && !c.jobs.contains_key(&ids[2]));
        assert!(c.jobs.contains_key(&ids[3]) && c.jobs.contains_key(&ids[4]));
        assert_eq!(c.purge_deadline(), None);
    }

    #[test]
    fn jobs_older_than_the_age_limit_go_when_they_reach_it() {
        let (mut c, ids) = ended(3, Some(100.0), None);
        let t_first = c.jobs[&ids[0]].t_inactive.unwrap();
        assert_eq!(c.next_deadline(), Some(t_first + 100.0));
        c.handle_timeout(t_first + 99.0);
        assert_eq!(c.inactive_count(), 3);
        c.handle_timeout(t_first + 100.5);
        assert_eq!(c.inactive_count(), 2);
        assert!(!c.jobs.contains_key(&ids[0]));
    }

    #[test]
    fn a_request_counts_without_force_and_purges_with_it() {
        let (mut c, ids) = ended(4, None, None);
        let now = T0 + 100.0;
        let req = PurgeRequest { num_limit: Some(1), ..Default::default() };
        assert_eq!(c.purge(now, &req), Ok(3));
        assert_eq!(c.inactive_count(), 4, "counted only");
        assert_eq!(c.purge(now, &PurgeRequest { force: true, ..req }), Ok(3));
        assert_eq!(c.inactive_count(), 1);
        assert!(c.jobs.contains_key(&ids[3]));
        assert_eq!(c.purge(now, &PurgeRequest::default()), Err(PurgeError::Nothing));
    }

    #[test]
    fn a_request_by_id_refuses_an_active_or_unknown_job_and_purges_nothing() {
        let (mut c, ids) = ended(2, None, None);
        let running = submit_sleep(&mut c, T0 + 10.0);
        let req = PurgeRequest { ids: vec![ids[0], running], force: true, ..Default::default() };
        assert_eq!(c.purge(T0 + 20.0, &req), Err(PurgeError::Active(running)));
        assert_eq!(c.inactive_count(), 2);
        let req = PurgeRequest { ids: vec![ids[1]], force: true, ..Default::default() };
        assert_eq!(c.purge(T0 + 20.0, &req), Ok(1));
        assert!(!c.jobs.contains_key(&ids[1]) && c.jobs.contains_key(&ids[0]));
        assert_eq!(c.purge(T0 + 20.0, &req), Err(PurgeError::Unknown(ids[1])));
    }

    #[test]
    fn a_purged_job_leaves_the_store_with_the_next_batch() {
        let (mut c, ids) = ended(0, None, None);
        assert!(ids.is_empty());
        c.enable_journal();
        let a = submit_true(&mut c, T0);
        let mut kept = crate::jobs::journal::Kept::default();
        let b = c.journal().unwrap();
        kept.apply(&b).unwrap();
        c.journal_saved(&b);
        assert!(kept.jobs.contains_key(&a));
        let req = PurgeRequest { ids: vec![a], force: true, ..Default::default() };
        assert_eq!(c.purge(T0 + 5.0, &req), Ok(1));
        let b = c.journal().expect("the purge is a change");
        assert_eq!(b.purged, vec![a]);
        kept.apply(&b).unwrap();
        c.journal_saved(&b);
        assert!(!kept.jobs.contains_key(&a));
        assert_eq!(c.journal(), None, "saved");
    }
}
