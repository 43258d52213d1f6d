//! Re-attaching the jobs that were running when rank 0 stopped (`-S statedir=DIR`, docs/statedir.md).
//!
//! The other brokers outlive rank 0 for `tbon.parent_grace`, their job shells with them, and reconnect when it is
//! back (`broker/rejoin.rs`). So with [`JobCore::reattach_grace`] above zero (the broker sets it from
//! `tbon.parent_grace`), [`JobCore::restore`] does not end a job that held resources and had not finished: it
//! stays in RUN (or CLEANUP), with a `restart` event in its eventlog (RFC 21's `flux-restart`, not an exception),
//! and waits for its shells for that long:
//! - **A rank of the job registers** ([`JobCore::rank_online`]): the job's resources there are taken again before
//!   anything is scheduled, so nothing else is placed on them. Its broker lists the jobs it still has a shell (or
//!   an unanswered exit report) for ([`JobCore::rank_jobs`]); a job it does not list lost its shell there (that
//!   broker restarted too): that rank is lost for the job, by the usual critical-rank rules.
//! - **Shell exit reports** (re)sent by the brokers complete the job as they would have without the restart, with
//!   its real exit code ([`JobCore::shell_exit`]): a job whose tasks ended during the outage completes from them.
//!   Output batches are taken from the number kept for each shell (`journal.rs`), or, where none was kept, from
//!   whatever number the shell has reached ([`super::BatchOrder::resume`]); the output printed before the restart was
//!   kept too, and the new output follows it.
//! - **Every shell of a job back**: a job whose `start` was lost with rank 0 (posted from the last spawn report,
//!   not yet written when rank 0 died) gets it then ([`JobCore::rank_jobs`], and at exit reports).
//! - **At the end of the grace** ([`JobCore::handle_timeout`]), a job still missing shells: if nothing at all came
//!   back from it, the fatal `restart` exception as without re-attaching; otherwise the ranks missing are lost for
//!   it ([`JobCore::ranks_lost`]'s rules: a critical one fails it, another is a `node-failure` and it goes on).
//!
//! A shell that exited while its job went on, and whose exit report the old rank 0 answered, is no longer listed
//! by its broker: its exit is in the journal (a [`SHELL_EXIT_EVENT`], kept before the report is answered), so
//! the restored job counts that shell as exited with its status instead of waiting for it. Nothing else is
//! assumed.

use super::journal::RESTART_EXCEPTION;
use super::{Job, JobCore, JobId, JobState, ShellState};
use crate::idset::IdSet;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};

/// The note of the fatal exception of a running job none of whose shells came back within the grace.
pub(super) const REATTACH_LOST_NOTE: &str =
    "rank 0 restarted, and none of the job's shells came back within tbon.parent_grace";

/// The eventlog event (with a journal) of a job shell that exited while its job goes on: `{"rank": R, "status":
/// S}` (and `abort_code`), S its wait status. Not RFC 21: a reader that does not know it skips it (RFC 18).
pub(super) const SHELL_EXIT_EVENT: &str = "shell-exit";

/// Jobs waiting to be re-attached after a restart, until a deadline.
#[derive(Clone, Debug, Default)]
pub(super) struct Reattach {
    /// When the grace ends (s since the epoch).
    pub until: f64,
    /// Each job's ranks not heard of yet.
    pub waiting: BTreeMap<JobId, BTreeSet<u32>>,
    /// Jobs that something came back from (a rank registered with its shell, or a shell's exit report).
    pub back: BTreeSet<JobId>,
}

impl JobCore {
    /// At [`JobCore::restore`]: keep running job `job`, rebuilt from its eventlog, for its shells to come back
    /// (see the module documentation). Its resources are taken as its ranks join.
    pub(super) fn reattach_job(&mut self, now: f64, mut job: Job) {
        let id = job.id;
        let mut released = IdSet::new();
        for e in super::journal::this_run(&job.eventlog) {
            let partial = e.context.get("final").and_then(Value::as_bool) == Some(false);
            if e.name == "release" && partial {
                if let Some(r) = e.context.get("ranks").and_then(Value::as_str).and_then(|s| IdSet::parse(s).ok()) {
                    released = released.union(&r);
                }
            }
        }
        // Shells whose exit was answered before the restart ([`SHELL_EXIT_EVENT`]): their status counts.
        let mut exited: BTreeMap<u32, (i32, Option<i32>, f64)> = BTreeMap::new();
        for e in job.eventlog.iter().filter(|e| e.name == SHELL_EXIT_EVENT) {
            let rank = e.context.get("rank").and_then(Value::as_u64).and_then(|r| u32::try_from(r).ok());
            let status = e.context.get("status").and_then(Value::as_i64).and_then(|s| i32::try_from(s).ok());
            let abort = e.context.get("abort_code").and_then(Value::as_i64).and_then(|s| i32::try_from(s).ok());
            if let (Some(rank), Some(status)) = (rank, status) {
                exited.insert(rank, (status, abort, e.timestamp));
            }
        }
        let mut waiting = BTreeSet::new();
        for (i, a) in job.alloc.iter().enumerate() {
            let done = exited.get(&a.rank).copied();
            let gone = released.contains(a.rank) || done.is_some();
            job.shells.insert(
                a.rank,
                ShellState {
                    shell_rank: i as u32,
                    rank: a.rank,
                    ntasks: 0,
                    tasks: crate::idset::IdSet::new(),
                    spawned: true,
                    exited: gone,
                    status: done.map(|d| d.0),
                    abort_code: done.and_then(|d| d.1),
                    ended: done.map(|d| d.2),
                    batches: super::journal::kept_order(&job, a.rank),
                },
            );
            if !gone {
                waiting.insert(a.rank);
                self.by_rank.entry(a.rank).or_default().insert(id);
            }
        }
        job.nspawned = job.shells.len();
        job.nexited = job.shells.len() - waiting.len();
        job.released = released;
        let grace = self.reattach_grace;
        job.post(
            now,
            "restart",
            json!({"note": format!("rank 0 restarted; the job is re-attached as its shells' brokers reconnect \
                (within {grace:.0} s)")}),
        );
        self.running.insert(id);
        self.jobs.insert(id, job);
        let r = self.reattach.get_or_insert_with(|| Reattach { until: now + grace, ..Default::default() });
        r.waiting.insert(id, waiting);
        self.rearm(id);
    }

    /// At [`JobCore::rank_online`], before scheduling: `rank` joins, for the first time since the restart if `new`.
    /// The jobs with a live shell there hold its resources again, and are no longer waiting for it.
    pub(super) fn reattach_rank(&mut self, rank: u32, new: bool) {
        let ids: Vec<JobId> = self.by_rank.get(&rank).into_iter().flatten().copied().collect();
        for id in ids {
            if new {
                if let Some(j) = self.jobs.get(&id) {
                    let held: Vec<_> = j.held().into_iter().filter(|a| a.rank == rank).collect();
                    self.pool.take(&held);
                }
            }
            if let Some(r) = self.reattach.as_mut() {
                if let Some(w) = r.waiting.get_mut(&id) {
                    w.remove(&rank);
                    r.back.insert(id);
                }
            }
        }
    }

    /// The broker on `rank` registered, listing the jobs it has a shell or an unanswered exit report for: a job
    /// being re-attached that it does not list lost its shell there, and that rank is lost for it (the usual
    /// critical-rank rules). Ids it lists that are not re-attaching here are ignored.
    pub fn rank_jobs(&mut self, now: f64, rank: u32, listed: &BTreeSet<JobId>) {
        let Some(r) = self.reattach.as_ref() else { return };
        // The jobs it lists that have every shell back now (this rank's was the last).
        let whole: Vec<JobId> =
            listed.iter().filter(|id| r.waiting.get(id).is_some_and(BTreeSet::is_empty)).copied().collect();
        for id in whole {
            self.reattach_started(now, id);
        }
        let Some(r) = self.reattach.as_ref() else { return };
        let gone: Vec<JobId> = self
            .by_rank
            .get(&rank)
            .into_iter()
            .flatten()
            .filter(|id| r.waiting.contains_key(id) && !listed.contains(id))
            .copied()
            .collect();
        if gone.is_empty() {
            return;
        }
        let hit: BTreeMap<JobId, Vec<u32>> = gone.into_iter().map(|id| (id, vec![rank])).collect();
        self.jobs_lose_ranks(now, hit);
        self.schedule(now);
    }

    /// At a shell's exit report: something came back from its job. Once every shell of it is accounted for, a job
    /// whose `start` was lost with rank 0 gets it now ([`JobCore::rank_jobs`] does the same for shells listed).
    pub(super) fn reattach_heard(&mut self, now: f64, id: JobId, rank: u32) {
        let Some(r) = self.reattach.as_mut() else { return };
        let Some(w) = r.waiting.get_mut(&id) else { return };
        w.remove(&rank);
        r.back.insert(id);
        if w.is_empty() {
            self.reattach_started(now, id);
        }
    }

    /// Every shell of re-attached job `id` is back (or ended): if its run has no `start` event, post one. Rank 0
    /// writes the `start` of a job once all its shells reported spawning; one that died after reading the last of
    /// those reports and before writing it lost the event, though the shells ran (a window of one turn of its
    /// loop: the report is not sent again). The event carries the time of the run's `alloc`, when the shells were
    /// asked for (they started within milliseconds of it), not `now`: the job's run time (from `start`) would
    /// otherwise lose everything before the restart (found by a fresh-user trial: a 2 s job listed as 4 ms). So
    /// it follows the `restart` event with an earlier timestamp, as a `finish` of a job that ended during the
    /// outage does.
    fn reattach_started(&mut self, now: f64, id: JobId) {
        let Some(job) = self.jobs.get_mut(&id) else { return };
        let running = job.state == JobState::Run || job.state == JobState::Cleanup;
        let run = super::journal::this_run(&job.eventlog);
        if !running || job.fatal.is_some() || run.iter().any(|e| e.name == "start") {
            return;
        }
        let at = run.iter().rev().find(|e| e.name == "alloc").map_or(now, |e| e.timestamp.min(now));
        job.post(at, "start", json!({"note": "rebuilt at re-attach: rank 0 restarted before it was kept"}));
        self.actions.push_back(super::Action::Updated(id));
    }

    /// When the grace ends, if jobs are being re-attached.
    pub(super) fn reattach_deadline(&self) -> Option<f64> {
        self.reattach.as_ref().map(|r| r.until)
    }

    /// The grace is over: every job still missing shells gets its verdict (see the module documentation).
    pub(super) fn reattach_expire(&mut self, now: f64) {
        let Some(r) = self.reattach.take() else { return };
        let mut hit: BTreeMap<JobId, Vec<u32>> = BTreeMap::new();
        for (id, missing) in r.waiting {
            let Some(job) = self.jobs.get(&id) else { continue };
            if !(job.state == JobState::Run || job.state == JobState::Cleanup) {
                continue;
            }
            let missing: Vec<u32> =
                missing.into_iter().filter(|rk| job.shells.get(rk).is_some_and(|s| !s.exited)).collect();
            if missing.is_empty() {
                continue;
            }
            if r.back.contains(&id) {
                hit.insert(id, missing);
                continue;
            }
            for rk in &missing {
                self.shell_gone(id, *rk);
            }
            self.raise(now, id, RESTART_EXCEPTION, 0, REATTACH_LOST_NOTE);
            self.maybe_finish(now, id);
        }
        self.jobs_lose_ranks(now, hit);
        self.schedule(now);
    }

    /// With a journal: the shell of `id` on `rank` exited and its job goes on (its other shells run). Its exit
    /// is recorded in the eventlog ([`SHELL_EXIT_EVENT`]), so that it is durable before its broker's exit report
    /// is answered: a restarted rank 0 then counts that shell as exited, with its status, rather than waiting
    /// for it and losing the rank for the job when its broker (which forgot an answered report) does not list it.
    pub(super) fn journal_shell_exit(&mut self, now: f64, id: JobId, rank: u32) {
        if !self.journaling() {
            return;
        }
        let Some(job) = self.jobs.get_mut(&id) else { return };
        let Some(sh) = job.shells.get(&rank) else { return };
        let running = job.state == JobState::Run || job.state == JobState::Cleanup;
        if !running || job.nexited >= job.shells.len() {
            return; // its `finish` (or the job's end) records it
        }
        let Some(status) = sh.status else { return };
        let mut ctx = json!({"rank": rank, "status": status});
        if let Some(a) = sh.abort_code {
            ctx["abort_code"] = json!(a);
        }
        job.post(now, SHELL_EXIT_EVENT, ctx);
        self.actions.push_back(super::Action::Updated(id));
    }

    /// Jobs being re-attached, for the log and status output.
    pub fn reattaching(&self) -> usize {
        self.reattach.as_ref().map_or(0, |r| r.waiting.len())
    }
}

#[cfg(test)]
mod tests {
    use super::super::journal::Kept;
    use super::super::tests::{actions, cmd, core, exit_shell, spawns, spec, T0};
    use super::super::BatchOrder;
    use super::*;
    use crate::jobs::SubmitRequest;
    use crate::shellproto::ShellExit;

    /// Three ranks of 2 cores; job `a` runs on ranks 1-2 (one shell each), job `b` on rank 0; all kept. Then rank 0
    /// restarts at `T0 + 10` with a grace of 60 s: the restored core, no rank joined yet.
    fn restarted() -> (JobCore, JobId, JobId) {
        let mut c = core(3, 2, 0);
        c.enable_journal();
        let b = c.submit(T0 + 1.0, SubmitRequest::new(&spec(cmd().nnodes(1).ntasks(2)), 1000)).unwrap().id;
        let a = c.submit(T0 + 1.0, SubmitRequest::new(&spec(cmd().nnodes(2).ntasks(4)), 1000)).unwrap().id;
        for (id, rank, _) in spawns(&actions(&mut c)) {
            c.shell_spawned(T0 + 1.5, id, rank, Ok(()));
        }
        assert_eq!(c.jobs[&a].alloc.iter().map(|x| x.rank).collect::<Vec<_>>(), [1, 2]);
        let mut kept = Kept::default();
        let batch = c.journal().expect("a batch");
        kept.apply(&batch).expect("applies");
        let mut c2 = JobCore::new(T0 + 10.0);
        c2.reattach_grace = 60.0;
        let r = c2.restore(T0 + 10.0, kept);
        assert_eq!((r.reattached.clone(), r.ended.clone()), (vec![b, a], vec![]));
        (c2, a, b)
    }

    fn join(c: &mut JobCore, t: f64, rank: u32, jobs: &[JobId]) {
        c.rank_online(t, rank, &format!("node{rank}"), (0..2).collect(), IdSet::new(), ("live".into(), None));
        c.rank_jobs(t, rank, &jobs.iter().copied().collect());
    }

    #[test]
    fn a_running_job_is_re_attached_and_finishes_with_its_real_exit_code() {
        let (mut c, a, b) = restarted();
        let l = &c.jobs[&a];
        assert_eq!(l.state, JobState::Run);
        assert_eq!(l.eventlog.last().map(|e| e.name.as_str()), Some("restart"));
        assert!(l.fatal.is_none(), "no exception");
        // Its ranks come back with its shells: their cores are its own again, so a new job does not get them.
        join(&mut c, T0 + 12.0, 1, &[a]);
        join(&mut c, T0 + 12.0, 2, &[a]);
        join(&mut c, T0 + 12.0, 0, &[b]);
        let n = c.submit(T0 + 13.0, SubmitRequest::new(&spec(cmd().nnodes(1).ntasks(1)), 1000)).unwrap().id;
        assert_eq!(c.jobs[&n].state, JobState::Sched, "every core is held by a re-attached job");
        // The shells' exit reports finish it: exit code 3 from rank 2.
        exit_shell(&mut c, T0 + 20.0, a, 1, 0);
        exit_shell(&mut c, T0 + 20.0, a, 2, 3 << 8);
        let l = &c.jobs[&a];
        assert_eq!((l.result(), l.exit_code()), (Some("FAILED"), Some(3)));
        assert!(l.fatal.is_none());
        exit_shell(&mut c, T0 + 21.0, b, 0, 0);
        assert_eq!(c.jobs[&b].result(), Some("COMPLETED"));
        // Their cores are free: the new job runs; the grace passes with nothing left to judge.
        assert_eq!(c.jobs[&n].state, JobState::Run);
        c.handle_timeout(T0 + 71.0);
        assert_eq!(c.jobs[&n].state, JobState::Run);
        assert_eq!(c.reattach_deadline(), None);
    }

    /// Found by the simulator (`restart`): a shell's exit report answered before rank 0 died (its broker then
    /// forgets it) left no trace in the journal while the job's other shells ran, so the restarted rank 0 waited
    /// for that shell, its broker rejoined without listing the job, and the job failed for a lost node
    /// that was never lost. The exit is now journaled (`shell-exit`) before the report is answered.
    #[test]
    fn a_shell_whose_exit_was_answered_before_the_restart_counts_with_its_status() {
        let mut c = core(3, 2, 0);
        c.enable_journal();
        let a = c.submit(T0 + 1.0, SubmitRequest::new(&spec(cmd().nnodes(2).ntasks(4)), 1000)).unwrap().id;
        for (id, rank, _) in spawns(&actions(&mut c)) {
            c.shell_spawned(T0 + 1.5, id, rank, Ok(()));
        }
        let ranks: Vec<u32> = c.jobs[&a].alloc.iter().map(|x| x.rank).collect();
        let mut kept = Kept::default();
        let batch = c.journal().expect("a batch");
        kept.apply(&batch).expect("applies");
        c.journal_saved(&batch);
        // The first shell exits with code 2 while the other runs: its report is answered once this is kept.
        exit_shell(&mut c, T0 + 5.0, a, ranks[0], 2 << 8);
        let batch = c.journal().expect("the shell's exit is journaled");
        kept.apply(&batch).expect("applies");
        let mut c = JobCore::new(T0 + 10.0);
        c.reattach_grace = 60.0;
        assert_eq!(c.restore(T0 + 10.0, kept).reattached, vec![a]);
        // Its broker forgot the answered report: it lists no job; the other still has its shell.
        join(&mut c, T0 + 12.0, ranks[0], &[]);
        join(&mut c, T0 + 12.0, ranks[1], &[a]);
        assert!(c.jobs[&a].fatal.is_none(), "{:?}", c.jobs[&a].fatal);
        exit_shell(&mut c, T0 + 20.0, a, ranks[1], 0);
        let l = &c.jobs[&a];
        assert_eq!((l.result(), l.exit_code()), (Some("FAILED"), Some(2)), "the real exit code, from both shells");
        assert!(l.fatal.is_none(), "{:?}", l.fatal);
        assert!(c.pool.ranks[&ranks[0]].alloc_cores.is_empty(), "nothing is held for a finished job");
    }

    /// Found by a fresh-user trial: rank 0 read the last shell's spawn report, posted the job's `start`, and was
    /// killed before writing it; the shells ran on, re-attached, and the job finished with no `start` in its
    /// eventlog. It is rebuilt once every shell is back.
    #[test]
    fn a_start_lost_with_rank_0_is_rebuilt_when_the_shells_are_back() {
        let mut c = core(3, 2, 0);
        c.enable_journal();
        let a = c.submit(T0 + 1.0, SubmitRequest::new(&spec(cmd().nnodes(2).ntasks(4)), 1000)).unwrap().id;
        let spawned = spawns(&actions(&mut c));
        // What was kept: the job allocated, its shells asked for; then the spawn reports come and are not kept.
        let mut kept = Kept::default();
        kept.apply(&c.journal().expect("a batch")).expect("applies");
        for (id, rank, _) in &spawned {
            c.shell_spawned(T0 + 1.5, *id, *rank, Ok(()));
        }
        assert!(c.jobs[&a].eventlog.iter().any(|e| e.name == "start"));
        let mut c = JobCore::new(T0 + 10.0);
        c.reattach_grace = 60.0;
        assert_eq!(c.restore(T0 + 10.0, kept).reattached, vec![a]);
        let starts = |c: &JobCore| c.jobs[&a].eventlog.iter().filter(|e| e.name == "start").count();
        let ranks: Vec<u32> = spawned.iter().map(|(_, rank, _)| *rank).collect();
        join(&mut c, T0 + 12.0, ranks[0], &[a]);
        assert_eq!(starts(&c), 0, "not before every shell is back");
        join(&mut c, T0 + 12.5, ranks[1], &[a]);
        assert_eq!(starts(&c), 1);
        // Stamped with its alloc's time (T0 + 1), not the re-attach's: its run time is not lost.
        let start = c.jobs[&a].eventlog.iter().find(|e| e.name == "start").unwrap();
        assert_eq!(start.timestamp, T0 + 1.0);
        for rank in &ranks {
            exit_shell(&mut c, T0 + 20.0, a, *rank, 0);
        }
        let l = &c.jobs[&a];
        assert_eq!(l.result(), Some("COMPLETED"));
        let names: Vec<&str> = l.eventlog.iter().map(|e| e.name.as_str()).collect();
        let at = |n: &str| names.iter().position(|x| *x == n).unwrap();
        assert!(at("restart") < at("start") && at("start") < at("finish"), "{names:?}");
        assert_eq!(starts(&c), 1);
    }

    /// A job whose shells all ended during the outage: its `start` was kept; nothing is added when they are back.
    #[test]
    fn a_kept_start_is_not_posted_again() {
        let (mut c, a, b) = restarted();
        join(&mut c, T0 + 12.0, 1, &[a]);
        join(&mut c, T0 + 12.0, 2, &[a]);
        join(&mut c, T0 + 12.0, 0, &[b]);
        for id in [a, b] {
            assert_eq!(c.jobs[&id].eventlog.iter().filter(|e| e.name == "start").count(), 1);
        }
    }

    #[test]
    fn a_job_whose_tasks_ended_during_the_outage_completes_from_the_reports_sent_at_reconnect() {
        let (mut c, a, _) = restarted();
        // Rank 1's broker reconnects: it registers listing the job (an unanswered exit report), then sends it.
        join(&mut c, T0 + 12.0, 1, &[a]);
        exit_shell(&mut c, T0 + 12.0, a, 1, 0);
        // Rank 2's report came up through rank 1's queue before rank 2 itself registered.
        exit_shell(&mut c, T0 + 12.0, a, 2, 0);
        assert_eq!(c.jobs[&a].result(), Some("COMPLETED"));
        join(&mut c, T0 + 13.0, 2, &[]);
        assert_eq!(c.jobs[&a].result(), Some("COMPLETED"), "a rank that joins after its report changes nothing");
        assert!(c.pool.ranks[&2].alloc_cores.is_empty(), "nothing is held for a finished job");
        c.handle_timeout(T0 + 80.0);
        assert_eq!(c.jobs[&a].result(), Some("COMPLETED"));
    }

    /// The `finish` of a job whose tasks ended while rank 0 was away carries the time its last tasks ended, as
    /// their node saw it ([`ShellExit::ended`]), not the time the reports came after the restart; the events of the restart itself
    /// (`release`, `free`, `clean`) are stamped when they happen. A job that was not re-attached keeps the time
    /// the report came.
    #[test]
    fn a_job_that_ended_during_the_outage_finishes_at_the_time_its_shells_ended() {
        let (mut c, a, b) = restarted();
        let exit = |rank: u32, ended: Option<f64>| ShellExit {
            id: a.0,
            rank,
            report: Some(crate::shellproto::ShellReport {
                status: 0,
                tasks: vec![],
                error: None,
                abort_code: None,
                usage: None,
                ended: None,
            }),
            shell_status: 0,
            ended,
            unkillable: vec![],
        };
        join(&mut c, T0 + 30.0, 1, &[a]);
        join(&mut c, T0 + 30.0, 2, &[a]);
        // Rank 2's shell ended at T0 + 6 (rank 0 was down from about T0 + 5), rank 1's at T0 + 8: reported at
        // T0 + 31, once their brokers were back.
        c.shell_exit(T0 + 31.0, exit(2, Some(T0 + 6.0)));
        c.shell_exit(T0 + 31.0, exit(1, Some(T0 + 8.0)));
        let l = &c.jobs[&a];
        assert_eq!(l.result(), Some("COMPLETED"));
        let at = |name: &str| l.eventlog.iter().rev().find(|e| e.name == name).map(|e| e.timestamp);
        assert_eq!(at("finish"), Some(T0 + 8.0), "the last shell's end, not the report's coming");
        assert_eq!((at("release"), at("clean")), (Some(T0 + 31.0), Some(T0 + 31.0)));
        // A time past the report's coming (a broker whose clock is ahead) is taken as the coming.
        join(&mut c, T0 + 30.0, 0, &[b]);
        c.shell_exit(T0 + 40.0, ShellExit { id: b.0, rank: 0, ended: Some(T0 + 99.0), ..exit(0, None) });
        assert_eq!(c.jobs[&b].eventlog.iter().find(|e| e.name == "finish").map(|e| e.timestamp), Some(T0 + 40.0));
        // Without a restart the report's coming stamps it, whatever its broker said.
        let n = c.submit(T0 + 41.0, SubmitRequest::new(&spec(cmd().nnodes(1).ntasks(1)), 1000)).unwrap().id;
        let rank = c.jobs[&n].alloc[0].rank;
        for (id, r, _) in spawns(&actions(&mut c)) {
            c.shell_spawned(T0 + 41.5, id, r, Ok(()));
        }
        c.shell_exit(T0 + 50.0, ShellExit { id: n.0, rank, ended: Some(T0 + 45.0), ..exit(rank, None) });
        assert_eq!(c.jobs[&n].eventlog.iter().find(|e| e.name == "finish").map(|e| e.timestamp), Some(T0 + 50.0));
    }

    #[test]
    fn past_the_grace_a_job_nobody_came_back_for_gets_the_fatal_restart_exception() {
        let (mut c, a, b) = restarted();
        join(&mut c, T0 + 12.0, 0, &[b]);
        // Rank 1 was up when rank 0 stopped: the queue waits for it first (journal.rs), then the grace runs out.
        let hold = T0 + 10.0 + super::super::journal::REJOIN_HOLD;
        assert_eq!(c.next_deadline(), Some(hold), "the queue's wait for the ranks expected back");
        c.handle_timeout(hold);
        assert_eq!(c.next_deadline(), Some(T0 + 70.0), "the grace, counted from the restart");
        c.handle_timeout(T0 + 69.0);
        assert_eq!(c.jobs[&a].state, JobState::Run, "still within the grace");
        c.handle_timeout(T0 + 70.0);
        let l = &c.jobs[&a];
        assert_eq!((l.state, l.result()), (JobState::Inactive, Some("FAILED")));
        assert_eq!(l.fatal.as_ref().map(|e| (e.kind.as_str(), e.note.as_str())), Some(("restart", REATTACH_LOST_NOTE)));
        assert_eq!(c.jobs[&b].state, JobState::Run, "the job whose rank came back goes on");
        assert!(c.pool.ranks[&0].alloc_cores.len() == 2, "and holds its cores");
    }

    #[test]
    fn a_rank_lost_during_the_outage_gets_the_critical_rank_verdict() {
        let (mut c, a, _) = restarted();
        join(&mut c, T0 + 12.0, 1, &[a]);
        c.handle_timeout(T0 + 70.0);
        let l = &c.jobs[&a];
        assert_eq!(l.fatal.as_ref().map(|e| e.kind.as_str()), Some("node-failure"));
        assert!(
            l.fatal.as_ref().is_some_and(|e| e.note.starts_with("lost node node2 (rank 2), where task")),
            "{:?}",
            l.fatal
        );
        assert_eq!(l.state, JobState::Cleanup, "rank 1's shell is told to stop");
        let sig = super::super::tests::signals(&actions(&mut c));
        assert!(sig.iter().any(|(r, s)| r == &vec![1] && *s == crate::signal::SIGTERM), "{sig:?}");
        exit_shell(&mut c, T0 + 71.0, a, 1, 15);
        assert_eq!(c.jobs[&a].state, JobState::Inactive);
    }

    #[test]
    fn a_broker_that_comes_back_without_the_shell_loses_the_job_that_rank() {
        let (mut c, a, _) = restarted();
        join(&mut c, T0 + 12.0, 1, &[a]);
        join(&mut c, T0 + 12.0, 2, &[]);
        let l = &c.jobs[&a];
        assert!(
            l.fatal.as_ref().is_some_and(|e| e.kind == "node-failure" && e.note.starts_with("lost node node")),
            "{:?}",
            l.fatal
        );
        exit_shell(&mut c, T0 + 13.0, a, 1, 15);
        assert_eq!(c.jobs[&a].state, JobState::Inactive);
        assert!(c.pool.ranks[&2].alloc_cores.is_empty(), "its cores there are free once it ends");
    }

    /// A job requeued after a node loss and running again when rank 0 restarts is re-attached like any other (its
    /// first run's `free` is not its current one's), and finishes with its real exit code.
    #[test]
    fn a_requeued_job_running_again_is_re_attached() {
        let mut c = core(3, 1, 0);
        c.enable_journal();
        let a =
            c.submit(T0 + 1.0, SubmitRequest::new(&spec(cmd().nnodes(1).ntasks(1).requeue(true)), 1000)).unwrap().id;
        for (id, rank, _) in spawns(&actions(&mut c)) {
            c.shell_spawned(T0 + 1.5, id, rank, Ok(()));
        }
        let first = c.jobs[&a].alloc[0].rank;
        c.ranks_lost(T0 + 2.0, &IdSet::from_iter([first]));
        actions(&mut c);
        exit_shell(&mut c, T0 + 2.5, a, first, 15);
        let now_on = c.jobs[&a].alloc[0].rank;
        assert_ne!(now_on, first, "requeued and running elsewhere");
        for (id, rank, _) in spawns(&actions(&mut c)) {
            c.shell_spawned(T0 + 3.0, id, rank, Ok(()));
        }
        let mut kept = Kept::default();
        kept.apply(&c.journal().expect("a batch")).expect("applies");
        let mut c2 = JobCore::new(T0 + 10.0);
        c2.reattach_grace = 60.0;
        let r = c2.restore(T0 + 10.0, kept);
        assert_eq!((r.reattached.clone(), r.ended.clone()), (vec![a], vec![]), "re-attached, not ended");
        join(&mut c2, T0 + 12.0, now_on, &[a]);
        exit_shell(&mut c2, T0 + 20.0, a, now_on, 5 << 8);
        let l = &c2.jobs[&a];
        assert_eq!((l.result(), l.exit_code(), l.requeues), (Some("FAILED"), Some(5), 1));
        assert!(l.fatal.is_none(), "{:?}", l.fatal);
    }

    /// The output a running job printed before rank 0 restarted is kept, and each shell's goes on after it: a batch
    /// taken and kept before the restart and sent again (its acknowledgement died with rank 0) is not taken twice;
    /// one taken but not kept (rank 0 died before writing it, so before acknowledging it) is taken when sent again.
    /// A job that prints nothing adds nothing of this to the store's writes.
    #[test]
    fn output_printed_before_a_restart_is_kept_and_goes_on_in_order_once() {
        use super::super::journal::OutputRows;
        use super::super::Batch;
        use crate::shellproto::OutputLine;
        let mut c = core(3, 2, 0);
        c.enable_journal();
        let a = c.submit(T0 + 1.0, SubmitRequest::new(&spec(cmd().nnodes(2).ntasks(2)), 1000)).unwrap().id;
        let quiet = c.submit(T0 + 1.0, SubmitRequest::new(&spec(cmd().nnodes(1).ntasks(1)), 1000)).unwrap().id;
        for (id, rank, _) in spawns(&actions(&mut c)) {
            c.shell_spawned(T0 + 1.5, id, rank, Ok(()));
        }
        let (r1, r2) = (c.jobs[&a].alloc[0].rank, c.jobs[&a].alloc[1].rank);
        let line = |task: u32, s: &str| vec![OutputLine::text(task, "stdout", s.into())];
        let n = |rank: u32, seq: u64| Batch::Numbered { rank, seq };
        let got = |c: &JobCore| -> Vec<String> { c.jobs[&a].output.iter().map(|l| l.data.clone()).collect() };
        let mut kept = Kept::default();
        let save = |c: &mut JobCore, kept: &mut Kept| {
            let b = c.journal().expect("a batch");
            for r in b.jobs.iter().filter(|r| r.id == quiet) {
                assert_eq!(r.rows, OutputRows::default(), "nothing to write for a job with no output");
            }
            kept.apply(&b).expect("applies");
            c.journal_saved(&b);
        };
        c.output(a, n(r1, 0), line(0, "a0"));
        c.output(a, n(r2, 0), line(1, "b0"));
        save(&mut c, &mut kept);
        c.output(a, n(r1, 1), line(0, "a1"));
        save(&mut c, &mut kept);
        let q = c.jobs[&quiet].alloc[0].rank;
        exit_shell(&mut c, T0 + 2.0, quiet, q, 0);
        let b = c.journal().expect("a batch for the quiet job's end");
        assert!(b.jobs.iter().all(|r| r.id != a), "job a: nothing new, nothing written");
        save(&mut c, &mut kept);
        // Taken, not kept: rank 0 dies before its next write.
        c.output(a, n(r2, 1), line(1, "b1"));

        let restart = |kept: &Kept, t: f64| {
            let mut c = JobCore::new(t);
            c.reattach_grace = 60.0;
            c.restore(t, kept.clone());
            for r in [r1, r2] {
                join(&mut c, t + 1.0, r, &[a]);
            }
            c
        };
        let mut c2 = restart(&kept, T0 + 10.0);
        assert_eq!(got(&c2), ["a0", "b0", "a1"], "what was kept, in the order it came");
        // Sent again after the rejoin: r1's batch 1 (kept, its acknowledgement lost) and r2's batch 1 (not kept).
        c2.output(a, n(r1, 1), line(0, "a1"));
        c2.output(a, n(r2, 1), line(1, "b1"));
        c2.output(a, n(r1, 2), line(0, "a2"));
        assert_eq!(got(&c2), ["a0", "b0", "a1", "b1", "a2"]);
        c2.enable_journal();
        save(&mut c2, &mut kept);
        // A second restart: the same again, and the numbering goes on.
        let mut c3 = restart(&kept, T0 + 20.0);
        assert_eq!(got(&c3), ["a0", "b0", "a1", "b1", "a2"]);
        c3.output(a, n(r1, 2), line(0, "a2"));
        c3.output(a, n(r2, 2), line(1, "b2"));
        assert_eq!(got(&c3), ["a0", "b0", "a1", "b1", "a2", "b2"]);
        // The job ends: what was not written yet is, and no more batch numbers; its output (all of it: under the
        // 1 MiB an INACTIVE job keeps) stays as it was kept.
        c3.enable_journal();
        for r in [r1, r2] {
            exit_shell(&mut c3, T0 + 21.0, a, r, 0);
        }
        assert_eq!(c3.jobs[&a].state, JobState::Inactive);
        let b = c3.journal().expect("a batch");
        let rec = b.jobs.iter().find(|r| r.id == a).expect("job a");
        assert!(rec.output.is_none() && rec.rows.batches.is_empty() && !rec.rows.trim, "{:?}", rec.rows);
        assert_eq!(rec.rows.new.iter().map(|l| l.data.as_str()).collect::<Vec<_>>(), ["b2"]);
        kept.apply(&b).expect("applies");
        let k = &kept.jobs[&a];
        assert_eq!(k.output.iter().map(|l| l.data.as_str()).collect::<Vec<_>>(), ["a0", "b0", "a1", "b1", "a2", "b2"]);
        assert!(k.batches.is_empty() && k.output_base == 0);
    }

    #[test]
    fn output_of_a_re_attached_shell_goes_on_from_the_number_it_reached() {
        let mut o = BatchOrder::resume();
        let line = |s: &str| crate::shellproto::OutputLine::from_bytes(0, "stdout", s.as_bytes(), true);
        assert_eq!(o.take(57, vec![line("a")]).len(), 1);
        assert_eq!(o.take(59, vec![line("c")]).len(), 0, "held for 58");
        assert_eq!(o.take(58, vec![line("b")]).len(), 2);
        assert_eq!(o.take(57, vec![line("a")]).len(), 0, "taken once");
    }
}
