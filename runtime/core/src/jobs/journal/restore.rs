//! The restore: what a restarted rank 0 makes of what its state directory kept ([`JobCore::restore`], see the
//! documentation of `journal.rs` for what becomes of each job), and what it reads again from the RFC 44 resource
//! eventlog (the ranks down, [`down_ranks`], and the orphans still waiting for a parent, [`pending_orphans`]).

use super::super::output::{retire_stdin, trim_output};
use super::super::sched::RankAlloc;
use super::super::{
    Action, Exception, Job, JobCore, JobId, JobState, SubmitKey, INACTIVE_OUTPUT_KEEP, INACTIVE_OUTPUT_TOTAL,
};
use super::{this_run, Kept, KeptJob, KeptRank, RESTART_EXCEPTION, RESTART_NOTE};
use crate::eventlog::Event;
use crate::idset::IdSet;
use crate::jobspec::{JobRequest, Jobspec};
use crate::r::Rv1;
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// How long a restarted rank 0 waits for the ranks that were up when it stopped before it schedules without
/// them: 10 s. They reconnect within a second or two (every second, `RANK0_RETRY`); scheduling meanwhile
/// would place the queue on whichever ranks came back first, out of order (a later 1-node job before an
/// earlier 3-node one) and on a partial instance. A rank lost meanwhile holds it up no longer than this.
pub const REJOIN_HOLD: f64 = 10.0;

/// Ranks the resource eventlog `log` last recorded down (an `offline` event after their last `online`, RFC
/// 44): rank → (`"lost"` or `"offline"`, the reason, when). After a restart, rank 0 knows them so again until
/// they rejoin (`vigil resource status` still says lost, and why).
pub fn down_ranks(log: &[Event]) -> BTreeMap<u32, (String, String, f64)> {
    let mut down = BTreeMap::new();
    for e in log {
        let Some(ranks) = e.context.get("idset").and_then(Value::as_str).and_then(|s| IdSet::parse(s).ok()) else {
            continue;
        };
        match e.name.as_str() {
            "online" => ranks.iter().for_each(|r| {
                down.remove(&r);
            }),
            "offline" => {
                let state = e.context.get("state").and_then(Value::as_str).unwrap_or("offline").to_string();
                let reason = e.context.get("reason").and_then(Value::as_str).unwrap_or("").to_string();
                for r in ranks.iter() {
                    down.insert(r, (state.clone(), reason.clone(), e.timestamp));
                }
            }
            _ => {}
        }
    }
    down
}

/// The orphans a restarted rank 0 still waits for, from the resource eventlog `log`: orphan → the lost rank
/// that was its parent. A rank lost while its children had not re-parented yet leaves them waiting for a new
/// parent (`broker/reparent.rs`); rank 0 keeps that list in memory only, so after a restart it rebuilds it from
/// the log: each rank's parent is its static parent (`static_parent`), or the one of its last `reparent`
/// event (`rank`, `parent`), or the one its last `online` event names (`parent`: it registered again after a
/// restart while adopted); an orphan is a rank not down whose parent so found is down as `lost`. Each of them
/// either registers again (it is there: `resource.register`), re-parents (`overlay.reparent`), or is cut off
/// as before the restart. Events from older logs without those fields count as static.
pub fn pending_orphans(log: &[Event], static_parent: impl Fn(u32) -> Option<u32>) -> BTreeMap<u32, u32> {
    let rank_of = |v: Option<&Value>| v.and_then(Value::as_u64).and_then(|r| u32::try_from(r).ok());
    let mut parent: BTreeMap<u32, Option<u32>> = BTreeMap::new();
    for e in log {
        match e.name.as_str() {
            "reparent" => {
                if let (Some(r), Some(p)) = (rank_of(e.context.get("rank")), rank_of(e.context.get("parent"))) {
                    parent.insert(r, Some(p));
                }
            }
            "online" => {
                let Some(ranks) = e.context.get("idset").and_then(Value::as_str).and_then(|s| IdSet::parse(s).ok())
                else {
                    continue;
                };
                let under = rank_of(e.context.get("parent"));
                for r in ranks.iter() {
                    parent.insert(r, under);
                }
            }
            _ => {}
        }
    }
    let down = down_ranks(log);
    let lost = |r: u32| down.get(&r).is_some_and(|d| d.0 == "lost");
    parent
        .into_iter()
        .filter(|(r, _)| !down.contains_key(r))
        .filter_map(|(r, p)| p.or_else(|| static_parent(r)).filter(|p| lost(*p)).map(|p| (r, p)))
        .collect()
}

/// What [`JobCore::restore`] did, for the log.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Restored {
    /// INACTIVE jobs listed again.
    pub inactive: usize,
    /// Pending jobs back in the queue.
    pub pending: usize,
    /// Jobs that held resources and were ended with a `restart` exception (or their cleanup completed).
    pub ended: Vec<JobId>,
    /// Jobs that were running and wait for their shells to come back (`reattach.rs`).
    pub reattached: Vec<JobId>,
    /// Jobs whose jobspec no longer validates (kept and listed, but not run): id and why.
    pub invalid: Vec<(JobId, String)>,
}

impl JobCore {
    /// Rebuild the core from what a state directory kept, before any rank has joined (see the module
    /// documentation for what becomes of each job). The journal is kept from now on: what the restore itself
    /// posts is in the next batch. `now`: seconds since the Unix epoch.
    pub fn restore(&mut self, now: f64, kept: Kept) -> Restored {
        self.enable_journal();
        let mut out = Restored::default();
        // Job ids: from the kept epoch, above every id kept.
        let floor = kept.jobs.keys().next_back().copied().unwrap_or_default().max(kept.last_id);
        if kept.epoch > 0.0 {
            self.epoch = kept.epoch;
        }
        self.last_ms = floor.0 >> 24;
        self.seq = (floor.0 & 0x3ff) as u32;
        self.saved.last_id = self.last_id();
        self.restore_resources(now, kept.resource_eventlog, kept.ranks);
        self.history.restore(kept.history);
        for (id, k) in kept.jobs {
            self.restore_job(now, id, k, &mut out);
        }
        self.restore_inactive_order();
        self.history_backfill();
        self.sched_dirty = true;
        self.schedule(now);
        out
    }

    /// The resources a state directory kept (`log`, the RFC 44 resource eventlog, and every rank that ever
    /// joined): the eventlog goes on after a `restart` event, ranks count again (down until they join), drains
    /// come back as their ranks join, and the ranks that were up are expected back ([`REJOIN_HOLD`]).
    fn restore_resources(&mut self, now: f64, log: Vec<Event>, ranks: BTreeMap<u32, KeptRank>) {
        // Resources: the eventlog goes on; drains come back as their ranks join.
        for e in &log {
            let ranks = e.context.get("idset").and_then(Value::as_str).and_then(|s| IdSet::parse(s).ok());
            match (e.name.as_str(), ranks) {
                ("drain", Some(ranks)) => {
                    let reason = e.context.get("reason").and_then(Value::as_str).unwrap_or("").to_string();
                    for r in ranks.iter() {
                        self.saved.drains.insert(r, (reason.clone(), e.timestamp));
                    }
                }
                ("undrain", Some(ranks)) => ranks.iter().for_each(|r| {
                    self.saved.drains.remove(&r);
                }),
                _ => {}
            }
        }
        // Every rank that ever joined counts again, down until it joins (with the drain it had, if any): a
        // submission that needs it is not refused meanwhile, and `vigil resource list` counts its cores. Those
        // that were up are expected back: the queue waits for them (REJOIN_HOLD).
        let down = down_ranks(&log);
        for (rank, k) in ranks {
            if self.pool.ranks.contains_key(&rank) {
                continue;
            }
            self.pool.add_rank(rank, &k.hostname, k.cores, k.gpus);
            if let Some(p) = self.pool.ranks.get_mut(&rank) {
                p.up = false;
                if let Some((reason, at)) = self.saved.drains.remove(&rank) {
                    (p.drained, p.drained_at) = (Some(reason), Some(at));
                }
            }
            self.saved.ranks_restored.insert(rank);
            if !down.contains_key(&rank) {
                self.saved.ranks_expected.insert(rank);
            }
        }
        self.saved.rejoin_until = now + REJOIN_HOLD;
        self.resource_eventlog = log;
        self.saved.resource = self.resource_eventlog.len();
        self.resource_eventlog.push(Event::with_time(now, "restart", json!({"online": ""})));
    }

    /// Job `id` as kept (`k`), restored as the module documentation of `journal.rs` says, and counted in `out`.
    fn restore_job(&mut self, now: f64, id: JobId, k: KeptJob, out: &mut Restored) {
        let (output, output_base, batches) = (k.output, k.output_base, k.batches);
        let kept_row = (k.state, k.status);
        // A key kept that does not read as one (a store edited by hand) is dropped: the job is kept.
        let key = k.submit_key.as_deref().and_then(|s| SubmitKey::parse_str(s).ok());
        let credential = k.credential.map(std::sync::Arc::new);
        let mut job = self.replay(id, k.userid, k.jobspec, k.eventlog, out);
        job.saved_row = Some(kept_row);
        job.credential = credential;
        if let Some(c) = &job.credential {
            self.credentials.insert(std::sync::Arc::from(c.credential.as_str()), id);
        }
        if let Some(key) = key {
            self.submit_keys.insert((job.userid, key.clone()), id);
            job.submit_key = Some(key);
        }
        if job.state != JobState::Inactive {
            // The output kept while it ran (a requeued job's earlier runs too): it goes on after it.
            for l in output.iter().cloned() {
                job.output_bytes += l.size();
                job.output.push_back(l);
            }
            job.output_base = output_base;
            job.saved_chunks = output_base + job.output.len();
            job.saved_marks = batches;
        }
        match job.state {
            JobState::Inactive => {
                job.saved_output = true;
                job.output_base = output_base;
                for l in output {
                    job.output_bytes += l.size();
                    job.output.push_back(l);
                }
                self.inactive_output_bytes += job.output_bytes;
                self.inactive_output.push_back(id);
                self.became_inactive(id);
                self.jobs.insert(id, job);
                out.inactive += 1;
            }
            JobState::New | JobState::Depend
                if !crate::jobs::depend::Dependency::all_of(&job.jobspec()).unwrap_or_default().is_empty() =>
            {
                // Waiting for its dependencies (depend.rs): what it still waits for is looked at again.
                if job.state == JobState::New {
                    job.post(now, "validate", json!({}));
                }
                if job.req.duration.is_none() {
                    job.req.duration = self.config.default_duration;
                }
                self.jobs.insert(id, job);
                self.depend_resume(now, id);
                out.pending += 1;
            }
            JobState::New | JobState::Depend | JobState::Priority | JobState::Sched => {
                // Submission posts these four at once; a record cut between them is completed here.
                for (from, name, ctx) in [
                    (JobState::New, "validate", json!({})),
                    (JobState::Depend, "depend", json!({})),
                    (JobState::Priority, "priority", json!({"priority": job.urgency})),
                ] {
                    if job.state == from {
                        job.post(now, name, ctx);
                    }
                }
                if job.req.duration.is_none() {
                    job.req.duration = self.config.default_duration;
                }
                let urgency = job.urgency;
                self.jobs.insert(id, job);
                self.queue.insert(id, urgency);
                out.pending += 1;
            }
            JobState::Run | JobState::Cleanup
                if self.reattach_grace > 0.0
                    && job.status.is_none()
                    && !job.alloc.is_empty()
                    && !this_run(&job.eventlog).iter().any(|e| e.name == "free") =>
            {
                self.reattach_job(now, job);
                out.reattached.push(id);
            }
            JobState::Run | JobState::Cleanup => {
                if job.status.is_none() {
                    let exc = Exception { kind: RESTART_EXCEPTION.into(), severity: 0, note: RESTART_NOTE.into() };
                    job.post(now, "exception", json!({"type": exc.kind, "severity": 0, "note": exc.note}));
                    job.fatal.get_or_insert(exc);
                }
                if !this_run(&job.eventlog).iter().any(|e| e.name == "free") {
                    let ranks: IdSet = job.alloc.iter().map(|a| a.rank).collect();
                    job.post(now, "release", json!({"ranks": ranks.to_string(), "final": true}));
                    job.post(now, "free", json!({}));
                }
                job.post(now, "clean", json!({}));
                job.t_inactive = Some(now);
                retire_stdin(&mut job);
                trim_output(&mut job, INACTIVE_OUTPUT_KEEP);
                self.inactive_output.push_back(id);
                self.became_inactive(id);
                self.jobs.insert(id, job);
                out.ended.push(id);
            }
        }
        if self.jobs.get(&id).is_some_and(|j| j.eventlog.len() > j.saved_events) {
            self.actions.push_back(Action::Updated(id));
        }
    }

    /// The INACTIVE jobs restored, in the order they ended (the purge rules take the oldest first), their output
    /// within [`INACTIVE_OUTPUT_TOTAL`] together.
    fn restore_inactive_order(&mut self) {
        // The purge rules take the oldest first: kept jobs come in id order, not in the order they ended.
        let mut order: Vec<(f64, JobId)> =
            self.inactive.iter().map(|id| (self.jobs.get(id).and_then(|j| j.t_inactive).unwrap_or(0.0), *id)).collect();
        order.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        self.inactive = order.into_iter().map(|(_, id)| id).collect();
        while self.inactive_output_bytes > INACTIVE_OUTPUT_TOTAL {
            let Some(old) = self.inactive_output.pop_front() else { break };
            if let Some(j) = self.jobs.get_mut(&old) {
                self.inactive_output_bytes = self.inactive_output_bytes.saturating_sub(j.output_bytes);
                trim_output(j, 0);
            }
        }
    }

    /// A job as its kept eventlog leaves it: state, times, R, exit status, first fatal exception, requeues.
    fn replay(&self, id: JobId, userid: u32, mut jobspec: Value, eventlog: Vec<Event>, out: &mut Restored) -> Job {
        // As changed since submission (`vigil update`, update.rs).
        super::super::update::apply_updates(&mut jobspec, &eventlog);
        let req = match Jobspec::from_value(&jobspec)
            .map_err(|e| e.to_string())
            .and_then(|s| s.validate().map_err(|e| e.to_string()))
        {
            Ok(req) => req,
            Err(e) => {
                out.invalid.push((id, e));
                JobRequest::default()
            }
        };
        let t_submit = eventlog.first().map_or(0.0, |e| e.timestamp);
        let mut job = Job::new(id, userid, &jobspec, req, t_submit);
        for e in &eventlog {
            let ctx = Value::Object(e.context.clone());
            job.state = job.state.apply(&e.name, &ctx).unwrap_or(job.state);
            match e.name.as_str() {
                "alloc" => {
                    job.t_run = Some(e.timestamp);
                    job.r = ctx.get("R").and_then(|r| Rv1::from_value(r).ok());
                    job.alloc = job
                        .r
                        .as_ref()
                        .and_then(|r| r.to_ranks().ok())
                        .unwrap_or_default()
                        .into_iter()
                        .map(|x| RankAlloc { rank: x.rank, cores: x.cores, gpus: x.gpus, slots: 0 })
                        .collect();
                    job.expiration = job.r.as_ref().map(|r| r.execution.expiration).filter(|x| *x > 0.0);
                }
                "exception" if ctx.get("severity").and_then(Value::as_u64).unwrap_or(0) == 0 => {
                    job.fatal.get_or_insert(Exception {
                        kind: ctx.get("type").and_then(Value::as_str).unwrap_or("").into(),
                        severity: 0,
                        note: ctx.get("note").and_then(Value::as_str).unwrap_or("").into(),
                    });
                }
                "finish" => {
                    job.status = ctx.get("status").and_then(Value::as_i64).and_then(|s| i32::try_from(s).ok());
                    job.usage = ctx.get("usage").and_then(|u| serde_json::from_value(u.clone()).ok());
                }
                "memo" if ctx.get("uri").is_some() => job.instance = Some(ctx),
                // Its urgency (urgency.rs): as submitted, then as changed.
                "submit" | "urgency" => {
                    if let Some(u) = ctx.get("urgency").and_then(Value::as_u64) {
                        job.urgency =
                            u32::try_from(u).unwrap_or(crate::jobs::MAX_URGENCY).min(crate::jobs::MAX_URGENCY);
                    }
                }
                // A running job's limit reduced (update.rs): it ends that long after its start.
                "jobspec-update" if job.t_run.is_some() => {
                    if let Some(d) = ctx.get(super::super::update::DURATION_KEY).and_then(Value::as_f64) {
                        job.expiration = job.t_run.filter(|_| d > 0.0).map(|t| t + d);
                    }
                }
                // Its warning before the time limit went out in this run (timers.rs).
                "signal" => job.warned = true,
                "requeue" => {
                    // The lost run is forgotten (requeue.rs).
                    job.requeues += 1;
                    job.warned = false;
                    job.alloc = Vec::new();
                    job.r = None;
                    job.t_run = None;
                    job.expiration = None;
                    job.fatal = None;
                    job.status = None;
                    job.instance = None;
                    job.usage = None;
                }
                "clean" => job.t_inactive = Some(e.timestamp),
                _ => {}
            }
        }
        job.saved_events = eventlog.len();
        job.eventlog = eventlog.into_iter().map(std::sync::Arc::new).collect();
        job
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::tests::T0;
    use super::*;

    #[test]
    fn ranks_recorded_down_are_known_down_after_a_restart_until_they_are_back() {
        let ev = |t: f64, name: &str, ctx: Value| Event::with_time(t, name, ctx);
        let log = [
            ev(T0, "online", json!({"idset": "1-3"})),
            ev(T0 + 1.0, "offline", json!({"idset": "2-3", "state": "lost", "reason": "3 probes missed"})),
            ev(T0 + 2.0, "offline", json!({"idset": "1", "state": "offline"})),
            ev(T0 + 3.0, "online", json!({"idset": "3"})),
            ev(T0 + 4.0, "restart", json!({"online": ""})),
        ];
        let down = down_ranks(&log);
        assert_eq!(down.keys().copied().collect::<Vec<_>>(), [1, 2]);
        assert_eq!(down[&2], ("lost".to_string(), "3 probes missed".to_string(), T0 + 1.0));
        assert_eq!(down[&1].0, "offline");
    }

    /// The orphans a restarted rank 0 waits for: children (static, or adopted as the log says) of a rank lost,
    /// which neither re-parented nor registered since, nor went down themselves.
    #[test]
    fn orphans_still_waiting_for_a_parent_are_found_again_in_the_log() {
        let ev = |t: f64, name: &str, ctx: Value| Event::with_time(t, name, ctx);
        // Binary tree of 15: 1 -> 3, 4; 2 -> 5, 6; 3 -> 7, 8; 4 -> 9, 10.
        let topo = crate::topology::Topology::Kary(2);
        let lost = |idset: &str| json!({"idset": idset, "state": "lost", "reason": "3 probes missed"});
        let log = [
            ev(T0, "online", json!({"idset": "1-14"})),
            // Rank 9 was adopted by rank 5 long ago; rank 0 restarted since and it registered there.
            ev(T0 + 1.0, "reparent", json!({"idset": "9", "rank": 9, "parent": 5})),
            ev(T0 + 2.0, "online", json!({"idset": "9", "parent": 5})),
            // Rank 3 lost: rank 7 re-parented, rank 8 not yet.
            ev(T0 + 3.0, "offline", lost("3")),
            ev(T0 + 3.1, "reparent", json!({"idset": "7", "rank": 7, "parent": 4})),
            // Rank 5 lost: its adoptee 9 and its child 11 wait; 12 went down too.
            ev(T0 + 4.0, "offline", lost("5")),
            ev(T0 + 4.0, "offline", json!({"idset": "12", "state": "offline"})),
            // Rank 6 lost, then back: its children are not orphans.
            ev(T0 + 5.0, "offline", lost("6")),
            ev(T0 + 6.0, "online", json!({"idset": "6"})),
            // An event of an older broker without `rank` changes nothing.
            ev(T0 + 7.0, "reparent", json!({"idset": "10", "parent": 3})),
        ];
        let orphans = pending_orphans(&log, |r| topo.parent(15, r));
        assert_eq!(orphans, BTreeMap::from([(8, 3), (9, 5), (11, 5)]));
        assert!(pending_orphans(&log[..2], |r| topo.parent(15, r)).is_empty(), "nobody lost: no orphan");
    }
}
