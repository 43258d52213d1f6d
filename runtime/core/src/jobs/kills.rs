//! Kills the route lost: a signal for a job's shell that could not reach its rank is delivered once the rank is
//! reachable again.
//!
//! When a job is killed (a fatal exception, a cancel: SIGTERM, then SIGKILL after its kill timeout,
//! `timers.rs`), rank 0's broker sends each shell's broker a `rexec.kill`. A shell whose route goes through a
//! router that was just lost cannot be reached: the request comes back EHOSTUNREACH (routing.rs), and the broker
//! says so ([`JobCore::signal_unreachable`]). Its rank is not lost: it re-parents (broker/reparent.rs) and its
//! shell runs on, so the job would end only when its tasks do, or at the kill timeout if SIGKILL happens to find
//! the new route (docs/failure-detection.md). So the signal is kept for that job and rank, and:
//!
//! - **delivered** as soon as the rank is reachable again ([`JobCore::ranks_reachable`]: the broker calls it when
//!   rank 0 records the re-parent of the rank or of a rank above it, when the rank registers again, or at once
//!   when the route it failed on was already replaced), once: a later failure keeps it again;
//! - **dropped** when the shell is gone (it exited, its start failed, or its rank was declared lost, a cut-off
//!   orphan included: the shell went with its node) and when the job is no longer being killed (it finished, or
//!   went back to the queue with a new run whose shells are not the ones signalled).
//!
//! One signal is kept per job and rank: SIGKILL replaces SIGTERM (the stronger one is what the job's end waits
//! for), and a later signal replaces an earlier one otherwise. Only the signals of a job being killed are kept
//! (its SIGTERM was sent): those are the ones its end depends on.

use super::{Action, JobCore, JobId};
use crate::idset::IdSet;
use std::collections::BTreeMap;

/// Signals waiting for their rank's route to come back: rank → job → signal number.
#[derive(Debug, Default)]
pub(super) struct UnreachableKills {
    by_rank: BTreeMap<u32, BTreeMap<JobId, i32>>,
}

impl UnreachableKills {
    /// Forget the signal kept for job `id` on `rank`, if any.
    fn forget(&mut self, id: JobId, rank: u32) {
        if let Some(jobs) = self.by_rank.get_mut(&rank) {
            jobs.remove(&id);
            if jobs.is_empty() {
                self.by_rank.remove(&rank);
            }
        }
    }
}

impl JobCore {
    /// The broker could not deliver `signal` (a signal number) to the shell of job `id` on broker rank `rank`:
    /// its route was down (EHOSTUNREACH). Kept until [`JobCore::ranks_reachable`] names the rank, unless the job
    /// is not being killed or its shell there is gone already (then nothing is kept). See the module doc.
    pub fn signal_unreachable(&mut self, id: JobId, rank: u32, signal: i32) {
        let Some(job) = self.jobs.get(&id) else { return };
        let live = job.shells.get(&rank).is_some_and(|s| !s.exited);
        if !live || job.term_sent.is_none() || !job.state.is_active() {
            return;
        }
        let kept = self.unreachable_kills.by_rank.entry(rank).or_default().entry(id).or_insert(signal);
        if *kept != crate::signal::SIGKILL {
            *kept = signal;
        }
    }

    /// Broker ranks `ranks` are reachable again (re-parented, or back): the signals kept for shells there go now,
    /// as [`Action::SignalShells`], one per job and signal.
    pub fn ranks_reachable(&mut self, ranks: &IdSet) {
        let mut due: BTreeMap<(JobId, i32), Vec<u32>> = BTreeMap::new();
        for r in ranks.iter() {
            for (id, sig) in self.unreachable_kills.by_rank.remove(&r).unwrap_or_default() {
                due.entry((id, sig)).or_default().push(r);
            }
        }
        for ((id, signal), ranks) in due {
            self.actions.push_back(Action::SignalShells { id, ranks, signal });
        }
    }

    /// Signals kept for unreachable shells, as (job, broker rank, signal), in rank order.
    pub fn unreachable_signals(&self) -> Vec<(JobId, u32, i32)> {
        let by_rank = &self.unreachable_kills.by_rank;
        by_rank.iter().flat_map(|(r, jobs)| jobs.iter().map(move |(id, s)| (*id, *r, *s))).collect()
    }

    /// How many ranks have signals kept for them (0: nothing waits for a route).
    pub fn unreachable_signals_kept(&self) -> usize {
        self.unreachable_kills.by_rank.len()
    }

    /// The shell of job `id` on `rank` is gone: nothing kept for it is sent.
    pub(super) fn forget_unreachable_signal(&mut self, id: JobId, rank: u32) {
        if !self.unreachable_kills.by_rank.is_empty() {
            self.unreachable_kills.forget(id, rank);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{actions, cmd, core, exit_shell, spec, T0};
    use super::*;
    use crate::jobs::JobState;
    use crate::jobs::SubmitRequest;
    use crate::signal::{SIGKILL, SIGTERM};

    /// Ranks 0-3 and a 4-node job running on them, its actions drained.
    fn running() -> (JobCore, JobId) {
        let mut c = core(4, 1, 0);
        let id = c.submit(T0, SubmitRequest::new(&spec(cmd().nnodes(4)), 0)).expect("submit").id;
        for r in 0..4 {
            c.shell_spawned(T0, id, r, Ok(()));
        }
        actions(&mut c);
        (c, id)
    }

    /// The signals the core asks the broker to send, as (job, ranks, signal).
    fn signals(c: &mut JobCore) -> Vec<(JobId, Vec<u32>, i32)> {
        let f = |a| match a {
            Action::SignalShells { id, ranks, signal } => Some((id, ranks, signal)),
            _ => None,
        };
        actions(c).into_iter().filter_map(f).collect()
    }

    /// Router rank 1 is lost at T0 + 1 s (a fatal exception: SIGTERM to the other shells); ranks 2 and 3, behind
    /// it, cannot be reached: the broker says so.
    fn killed_behind_a_lost_router() -> (JobCore, JobId) {
        let (mut c, id) = running();
        c.ranks_lost(T0 + 1.0, &IdSet::from_iter([1]));
        assert_eq!(signals(&mut c), vec![(id, vec![0, 2, 3], SIGTERM)]);
        c.signal_unreachable(id, 2, SIGTERM);
        c.signal_unreachable(id, 3, SIGTERM);
        assert_eq!(c.unreachable_signals(), vec![(id, 2, SIGTERM), (id, 3, SIGTERM)]);
        (c, id)
    }

    #[test]
    fn a_kill_unreachable_is_delivered_once_its_rank_re_parents() {
        let (mut c, id) = killed_behind_a_lost_router();
        // Rank 0's shell ends on its SIGTERM; nothing goes to it again.
        exit_shell(&mut c, T0 + 1.01, id, 0, 15);
        assert!(signals(&mut c).is_empty());
        // Rank 2 re-parents 0.3 s after the loss, with rank 3 below it: the SIGTERM goes to both now.
        c.ranks_reachable(&IdSet::from_iter([2, 3]));
        assert_eq!(signals(&mut c), vec![(id, vec![2, 3], SIGTERM)]);
        assert!(c.unreachable_signals().is_empty());
        // Once: another re-parent of the same ranks sends nothing.
        c.ranks_reachable(&IdSet::from_iter([2, 3]));
        assert!(signals(&mut c).is_empty());
        // Their shells end on it, long before the kill timeout: the job is over, with no SIGKILL due.
        exit_shell(&mut c, T0 + 1.32, id, 2, 15);
        exit_shell(&mut c, T0 + 1.32, id, 3, 15);
        assert_eq!(c.jobs[&id].state, JobState::Inactive);
        assert!(c.next_deadline().is_none_or(|t| t > T0 + 1.0 + crate::jobs::DEFAULT_KILL_TIMEOUT));
    }

    #[test]
    fn a_kill_unreachable_is_dropped_when_its_rank_is_lost() {
        let (mut c, id) = killed_behind_a_lost_router();
        // Rank 3 never re-parents: cut off 30 s later, it is lost with its shell.
        c.ranks_lost(T0 + 31.0, &IdSet::from_iter([3]));
        actions(&mut c);
        assert_eq!(c.unreachable_signals(), vec![(id, 2, SIGTERM)]);
        c.ranks_reachable(&IdSet::from_iter([2, 3]));
        assert_eq!(signals(&mut c), vec![(id, vec![2], SIGTERM)]);
    }

    #[test]
    fn a_kill_unreachable_is_dropped_when_the_job_finished() {
        let (mut c, id) = killed_behind_a_lost_router();
        // The tasks behind the router end on their own, and rank 0's on its SIGTERM: the job is INACTIVE.
        for r in [0, 2, 3] {
            exit_shell(&mut c, T0 + 2.0, id, r, 0);
        }
        assert_eq!(c.jobs[&id].state, JobState::Inactive);
        assert!(c.unreachable_signals().is_empty());
        c.ranks_reachable(&IdSet::from_iter([2, 3]));
        assert!(signals(&mut c).is_empty());
        // A failure reported after the end keeps nothing either.
        c.signal_unreachable(id, 2, SIGKILL);
        assert!(c.unreachable_signals().is_empty());
    }

    #[test]
    fn sigkill_replaces_a_kept_sigterm_and_a_job_not_being_killed_keeps_nothing() {
        let (mut c, id) = killed_behind_a_lost_router();
        // The kill timeout passes with the route still down: SIGKILL fails too, and replaces the SIGTERM.
        c.handle_timeout(T0 + 1.0 + crate::jobs::DEFAULT_KILL_TIMEOUT);
        assert_eq!(signals(&mut c), vec![(id, vec![0, 2, 3], SIGKILL)]);
        c.signal_unreachable(id, 2, SIGKILL);
        c.signal_unreachable(id, 2, SIGTERM); // a late answer to the first: SIGKILL stays
        assert_eq!(c.unreachable_signals(), vec![(id, 2, SIGKILL), (id, 3, SIGTERM)]);
        c.ranks_reachable(&IdSet::from_iter([2, 3]));
        assert_eq!(signals(&mut c), vec![(id, vec![2], SIGKILL), (id, vec![3], SIGTERM)]);

        // A job that is not being killed keeps nothing: no signal its end depends on was sent.
        let (mut c, id) = running();
        c.signal_unreachable(id, 2, SIGTERM);
        assert!(c.unreachable_signals().is_empty());
    }
}
