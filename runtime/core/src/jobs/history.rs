//! Job history (`vigil history`): every job's final record, kept after the job itself is purged, as Slurm's
//! accounting (`sacct`) and flux-accounting's job archive keep one.
//!
//! When a job becomes INACTIVE the job core writes its [`HistoryRecord`]: id, user, name, times, nodes, exit code or
//! fatal exception, and its usage from the cgroups of its shells (CPU time, peak memory). The record is small (a
//! few hundred bytes, no jobspec, eventlog or output) and lives on when the job is purged (`purge.rs`): the purge
//! rules bound what rank 0 keeps of whole jobs, the history's own retention bounds the records:
//! - `job-manager.history-age-limit` ([`SchedConfig::history_age_limit`](super::SchedConfig), seconds): a record
//!   whose job ended longer ago goes; `inf` (the default) keeps them.
//! - `job-manager.history-num-limit` ([`SchedConfig::history_num_limit`](super::SchedConfig)): the oldest records
//!   beyond that many go; 0 (the default) is no limit.
//!
//! With a state directory the records are journaled like the rest (`journal.rs`: [`Journal::history`] adds,
//! [`Journal::history_expired`] removes) into the store's `history` table and read back at a restart; a store
//! written before the table existed gets a record for each INACTIVE job it kept. Without one they live as long as
//! rank 0 does.
//!
//! Records are held in the order their jobs ended, so a query by time range ([`JobCore::history`]) and the
//! retention rules look only at the records they take: a query of the newest N does not scan the rest.
//!
//! [`Journal::history`]: super::journal::Journal::history
//! [`Journal::history_expired`]: super::journal::Journal::history_expired

use super::{Exception, Job, JobCore, JobId, JobState};
use crate::idset::IdSet;
use crate::shellproto::Usage;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

/// One ended job, as the history keeps it. Its JSON ([`HistoryRecord::to_json`]) has the field names of `vigil jobs
/// --json` (`Job::info`), so `vigil history --format` takes the fields `vigil jobs --format` does.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HistoryRecord {
    /// The job.
    pub id: JobId,
    /// Submitting user.
    pub userid: u32,
    /// Its name (`attributes.system.job.name`, else its command's basename).
    pub name: String,
    /// Submission (s since the Unix epoch).
    pub t_submit: f64,
    /// Allocation of its last run; `None` if it never ran.
    #[serde(default)]
    pub t_run: Option<f64>,
    /// When its tasks ended (its `finish` event); `None` if they never ran.
    #[serde(default)]
    pub t_finish: Option<f64>,
    /// When it became INACTIVE.
    pub t_inactive: f64,
    /// Its time limit (s); `None`: none.
    #[serde(default)]
    pub duration: Option<f64>,
    /// Nodes of its last run (0 if it never ran).
    pub nnodes: u32,
    /// Tasks of its last run, or asked for if it never ran.
    pub ntasks: u32,
    /// Broker ranks of its last run, an RFC 22 idset.
    pub ranks: String,
    /// Its nodes, an RFC 29 hostlist.
    pub nodelist: String,
    /// COMPLETED, FAILED, CANCELED or TIMEOUT.
    pub result: String,
    /// Exit code as `vigil jobs` shows it.
    pub exit_code: i32,
    /// The fatal exception that ended it, if one did.
    #[serde(default)]
    pub exception: Option<Exception>,
    /// Its shells' cgroup accounting together (CPU time summed, peak memory the largest per node), where the
    /// kernel gave it.
    #[serde(default)]
    pub usage: Option<Usage>,
    /// Times it was requeued after losing a node.
    #[serde(default)]
    pub requeues: u32,
    /// Nodes its last run lost and went on without or died of, a hostlist (empty: none).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub lost_nodelist: String,
}

impl HistoryRecord {
    /// The record of INACTIVE job `j`.
    pub fn of(j: &Job) -> HistoryRecord {
        let ranks: IdSet = j.alloc.iter().map(|a| a.rank).collect();
        let ntasks = if j.shells.is_empty() { j.req.ntasks } else { j.shells.values().map(|s| s.ntasks).sum::<u32>() };
        HistoryRecord {
            id: j.id,
            userid: j.userid,
            name: j.display_name().to_string(),
            t_submit: j.t_submit,
            t_run: j.t_run,
            t_finish: j.t_finish(),
            t_inactive: j.t_inactive.unwrap_or(j.t_submit),
            duration: j.req.duration,
            nnodes: u32::try_from(j.alloc.len()).unwrap_or(u32::MAX),
            ntasks,
            ranks: ranks.to_string(),
            nodelist: j.r.as_ref().and_then(|r| r.execution.nodelist.first().cloned()).unwrap_or_default(),
            result: j.result().unwrap_or("FAILED").to_string(),
            exit_code: j.exit_code().unwrap_or(1),
            exception: j.fatal.clone(),
            usage: j.usage.clone(),
            requeues: j.requeues,
            lost_nodelist: j.lost().1.to_string(),
        }
    }

    /// Append its JSON for `vigil history --json` to `buf`: the record's fields with `id_f58` and `state`
    /// (`INACTIVE`) beside, named as `vigil jobs --json` names them. Written in place, in one pass: an answer of
    /// 100,000 records is 40 MB of it.
    pub fn write_json(&self, buf: &mut Vec<u8>) {
        let start = buf.len();
        // Writing into a Vec cannot fail: every field serializes (no map with non-string keys).
        if serde_json::to_writer(&mut *buf, self).is_err() || buf.last() != Some(&b'}') {
            buf.truncate(start);
            buf.extend_from_slice(b"{}");
        }
        buf.pop();
        if buf.len() > start + 1 {
            buf.push(b',');
        }
        buf.extend_from_slice(b"\"id_f58\":\"");
        buf.extend_from_slice(self.id.f58().as_bytes());
        buf.extend_from_slice(b"\",\"state\":\"");
        buf.extend_from_slice(JobState::Inactive.name().as_bytes());
        buf.extend_from_slice(b"\"}");
    }

    /// Its JSON for `vigil history --json` as a value ([`HistoryRecord::write_json`]).
    pub fn to_json(&self) -> Value {
        let mut buf = Vec::new();
        self.write_json(&mut buf);
        serde_json::from_slice(&buf).unwrap_or_else(|_| json!({}))
    }
}

/// What [`JobCore::history`] is asked for (`job-manager.history`). Every filter is optional.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HistoryQuery {
    /// Only jobs that ended at or after this time (s since the Unix epoch).
    pub since: Option<f64>,
    /// Only jobs that ended before this time.
    pub until: Option<f64>,
    /// Only this user's jobs.
    pub userid: Option<u32>,
    /// Only jobs of this name.
    pub name: Option<String>,
    /// Only jobs with one of these results (COMPLETED, FAILED, CANCELED, TIMEOUT); empty: any.
    pub results: Vec<String>,
    /// At most this many, the newest.
    pub count: Option<usize>,
}

/// The records kept, oldest first (the order their jobs ended), and what the journal has yet to write.
#[derive(Debug, Default)]
pub(super) struct History {
    /// Every record kept, in the order the jobs ended.
    records: VecDeque<Arc<HistoryRecord>>,
    /// The ids of `records`.
    ids: HashSet<JobId>,
    /// Records added since the last batch saved (only while a journal is kept).
    pub(super) added: Vec<Arc<HistoryRecord>>,
    /// Records removed by the retention rules since the last batch saved (only while a journal is kept).
    pub(super) expired: Vec<JobId>,
}

impl History {
    /// How many records are kept.
    pub(super) fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether job `id` has a record.
    pub(super) fn contains(&self, id: JobId) -> bool {
        self.ids.contains(&id)
    }

    /// Keep `r` (a job that just ended: after every record kept, in time), journaled if `journal`.
    fn push(&mut self, r: HistoryRecord, journal: bool) {
        if !self.ids.insert(r.id) {
            return;
        }
        let r = Arc::new(r);
        if journal {
            self.added.push(r.clone());
        }
        self.records.push_back(r);
    }

    /// Records read back from a state directory, in any order.
    pub(super) fn restore(&mut self, mut kept: Vec<HistoryRecord>) {
        kept.sort_by(|a, b| a.t_inactive.total_cmp(&b.t_inactive).then(a.id.cmp(&b.id)));
        for r in kept {
            if self.ids.insert(r.id) {
                self.records.push_back(Arc::new(r));
            }
        }
    }

    /// The oldest record's end time.
    fn oldest(&self) -> Option<f64> {
        self.records.front().map(|r| r.t_inactive)
    }
}

impl JobCore {
    /// Write the history record of job `id`, which just became INACTIVE (a job not held is skipped).
    pub(super) fn record_history(&mut self, id: JobId) {
        let Some(j) = self.jobs.get(&id).filter(|j| j.state == JobState::Inactive) else { return };
        let r = HistoryRecord::of(j);
        let journal = self.journaling();
        self.history.push(r, journal);
        if self.config.history_num_limit.is_some() {
            // The count limit applies at once; the age limit at its deadline.
            self.history_due(f64::NEG_INFINITY);
        }
    }

    /// How many history records are kept.
    pub fn history_len(&self) -> usize {
        self.history.len()
    }

    /// When the retention rules next remove a record, if ever (s since the epoch).
    pub(super) fn history_deadline(&self) -> Option<f64> {
        let age = self.config.history_age_limit?;
        Some(self.history.oldest()? + age)
    }

    /// Apply the retention rules at `now` (the count limit only, at `-inf`).
    pub(super) fn history_due(&mut self, now: f64) {
        let (age, num) = (self.config.history_age_limit, self.config.history_num_limit);
        let journal = self.journaling();
        let h = &mut self.history;
        while let Some(front) = h.records.front() {
            let old = age.is_some_and(|a| front.t_inactive + a <= now);
            let over = num.is_some_and(|n| h.records.len() > n);
            if !(old || over) {
                break;
            }
            let id = front.id;
            h.records.pop_front();
            h.ids.remove(&id);
            if journal {
                // Not written yet: it need not be. A batch being written may hold it, so it is removed from the
                // store all the same (a removal of a record never written changes nothing).
                if let Some(i) = h.added.iter().position(|r| r.id == id) {
                    h.added.remove(i);
                }
                h.expired.push(id);
            }
        }
    }

    /// The records `q` asks for, newest first.
    pub fn history(&self, q: &HistoryQuery) -> Vec<Arc<HistoryRecord>> {
        let mut out = Vec::new();
        for r in self.history.records.iter().rev() {
            if q.count.is_some_and(|n| out.len() >= n) {
                break;
            }
            if q.since.is_some_and(|t| r.t_inactive < t) {
                // Older records ended earlier still (they are in end order).
                break;
            }
            let keep = q.until.is_none_or(|t| r.t_inactive < t)
                && q.userid.is_none_or(|u| r.userid == u)
                && q.name.as_deref().is_none_or(|n| r.name == n)
                && (q.results.is_empty() || q.results.iter().any(|x| x.eq_ignore_ascii_case(&r.result)));
            if keep {
                out.push(r.clone());
            }
        }
        out
    }

    /// After a restore: a record for every INACTIVE job that has none (one ended by the restore itself, or kept
    /// by a store written before the history was).
    pub(super) fn history_backfill(&mut self) {
        let mut missing: Vec<(f64, JobId)> = self
            .inactive
            .iter()
            .filter(|id| !self.history.contains(**id))
            .filter_map(|id| self.jobs.get(id).map(|j| (j.t_inactive.unwrap_or(0.0), *id)))
            .collect();
        missing.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        for (_, id) in missing {
            let Some(j) = self.jobs.get(&id) else { continue };
            let r = HistoryRecord::of(j);
            let journal = self.journaling();
            // A record older than those kept (a store from before the history) goes in its place.
            let h = &mut self.history;
            if h.ids.insert(r.id) {
                let r = Arc::new(r);
                if journal {
                    h.added.push(r.clone());
                }
                let at = h.records.partition_point(|x| x.t_inactive <= r.t_inactive);
                h.records.insert(at, r);
            }
        }
        self.history_due(f64::NEG_INFINITY);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jobs::tests::{actions, cmd, core, exit_shell, spec, T0};
    use crate::jobs::SubmitRequest;

    /// A one-node job of user `uid` submitted at `t` and run to INACTIVE at `t + 0.5` with wait status `status`.
    fn run(c: &mut JobCore, t: f64, uid: u32, status: i32) -> JobId {
        let id = c.submit(t, SubmitRequest::new(&spec(cmd().nnodes(1)), uid)).unwrap().id;
        let _ = actions(c);
        c.shell_spawned(t, id, 0, Ok(()));
        exit_shell(c, t + 0.5, id, 0, status);
        assert_eq!(c.jobs[&id].state, JobState::Inactive);
        id
    }

    #[test]
    fn a_record_outlives_its_jobs_purge_and_says_how_it_ended() {
        let mut c = core(1, 1, 0);
        let ok = run(&mut c, T0, 1000, 0);
        let bad = run(&mut c, T0 + 1.0, 1001, 3 << 8);
        let req = crate::jobs::purge::PurgeRequest { ids: vec![ok, bad], force: true, ..Default::default() };
        assert_eq!(c.purge(T0 + 5.0, &req), Ok(2));
        assert!(c.jobs.is_empty(), "purged");
        let all = c.history(&HistoryQuery::default());
        assert_eq!(all.iter().map(|r| r.id).collect::<Vec<_>>(), [bad, ok], "newest first");
        assert_eq!((all[0].result.as_str(), all[0].exit_code, all[0].userid), ("FAILED", 3, 1001));
        assert_eq!((all[1].result.as_str(), all[1].exit_code, all[1].nnodes), ("COMPLETED", 0, 1));
        assert_eq!(all[1].t_run, Some(T0));
        assert_eq!(all[1].t_inactive, T0 + 0.5);
        let j = all[1].to_json();
        assert_eq!((j["id_f58"].as_str(), j["state"].as_str()), (Some(ok.f58().as_str()), Some("INACTIVE")));
    }

    #[test]
    fn queries_filter_by_time_user_name_and_result_and_count_the_newest() {
        let mut c = core(1, 1, 0);
        let ids: Vec<JobId> =
            (0..6).map(|i| run(&mut c, T0 + 10.0 * f64::from(i), 1000 + (i % 2), i as i32 % 3)).collect();
        let q = |q: HistoryQuery| c.history(&q).iter().map(|r| r.id).collect::<Vec<_>>();
        assert_eq!(q(HistoryQuery { since: Some(T0 + 30.0), ..Default::default() }), [ids[5], ids[4], ids[3]]);
        assert_eq!(q(HistoryQuery { until: Some(T0 + 20.0), ..Default::default() }), [ids[1], ids[0]]);
        assert_eq!(q(HistoryQuery { userid: Some(1001), ..Default::default() }), [ids[5], ids[3], ids[1]]);
        assert_eq!(q(HistoryQuery { count: Some(2), userid: Some(1000), ..Default::default() }), [ids[4], ids[2]]);
        assert_eq!(q(HistoryQuery { results: vec!["completed".into()], ..Default::default() }), [ids[3], ids[0]]);
        assert_eq!(q(HistoryQuery { name: Some("nope".into()), ..Default::default() }), Vec::<JobId>::new());
        assert_eq!(q(HistoryQuery { name: Some("true".into()), ..Default::default() }).len(), 6);
    }

    #[test]
    fn retention_by_count_at_once_and_by_age_at_its_deadline() {
        let mut c = core(1, 1, 0);
        c.config.history_num_limit = Some(2);
        let ids: Vec<JobId> = (0..4).map(|i| run(&mut c, T0 + f64::from(i), 1000, 0)).collect();
        assert_eq!(c.history_len(), 2);
        assert_eq!(c.history(&HistoryQuery::default()).iter().map(|r| r.id).collect::<Vec<_>>(), [ids[3], ids[2]]);
        c.config.history_num_limit = None;
        c.config.history_age_limit = Some(100.0);
        let due = c.next_deadline().expect("the oldest record's expiry");
        assert!((due - (T0 + 2.5 + 100.0)).abs() < 1e-6, "{due}");
        c.handle_timeout(due);
        assert_eq!(c.history(&HistoryQuery::default()).iter().map(|r| r.id).collect::<Vec<_>>(), [ids[3]]);
    }

    #[test]
    fn records_are_journaled_expired_and_restored_and_a_store_without_them_gets_them() {
        let mut c = core(1, 1, 0);
        c.enable_journal();
        c.config.history_num_limit = Some(2);
        let ids: Vec<JobId> = (0..3).map(|i| run(&mut c, T0 + f64::from(i), 1000, 0)).collect();
        let mut kept = crate::jobs::journal::Kept::default();
        let b = c.journal().expect("a batch");
        assert_eq!(b.history.iter().map(|r| r.id).collect::<Vec<_>>(), [ids[1], ids[2]], "the first went unsaved");
        assert_eq!(b.history_expired, [ids[0]]);
        kept.apply(&b).unwrap();
        c.journal_saved(&b);
        assert!(c.journal().is_none());
        let four = run(&mut c, T0 + 10.0, 1000, 0);
        let b = c.journal().expect("a batch");
        assert_eq!((b.history.len(), b.history_expired.clone()), (1, vec![ids[1]]));
        kept.apply(&b).unwrap();
        c.journal_saved(&b);
        assert_eq!(kept.history.iter().map(|r| r.id).collect::<Vec<_>>(), [ids[2], four]);
        // Restored: the records as kept, nothing written again.
        let mut c2 = JobCore::new(T0 + 20.0);
        c2.config.history_num_limit = Some(2);
        c2.restore(T0 + 20.0, kept.clone());
        assert_eq!(c2.history(&HistoryQuery::default()).iter().map(|r| r.id).collect::<Vec<_>>(), [four, ids[2]]);
        assert!(c2.journal().is_none_or(|b| b.history.is_empty()));
        // A store from before the history: its inactive jobs get records at the restore.
        let mut old = kept.clone();
        old.history.clear();
        let mut c3 = JobCore::new(T0 + 20.0);
        c3.restore(T0 + 20.0, old);
        let got: Vec<JobId> = c3.history(&HistoryQuery::default()).iter().map(|r| r.id).collect();
        assert!(got.contains(&four) && got.contains(&ids[2]), "{got:?}");
        assert_eq!(c3.journal().expect("the records").history.len(), got.len());
    }
}
