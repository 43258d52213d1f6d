//! Critical-rank rules for the brokers of a nested instance (a batch or alloc job), as the enclosing instance's
//! exec system applies them when one of those brokers ends while its node lives on (a crash, the OOM killer,
//! `kill -9`). A lost *node* is judged by [`JobCore::ranks_down`]; this file judges a lost *broker* the same way.
//!
//! Each job shell of a nested instance runs one broker of it; the instance reported which of its ranks are
//! critical (`critical_broker_ranks` in the job's `memo`: rank 0 alone when its brokers re-parent, else rank 0
//! and every router). The shell's report carries the broker's wait status, which says what happened:
//!
//! - **Killed by a signal**, or a rank other than 0 **exited non-zero** (other than below): the broker failed.
//!   A critical one ends the job (exception `exec`, severity 0: "the job's broker on node3 (rank 3), where rank 0
//!   of the job's instance ran, ended (killed by SIGKILL); the job's instance cannot go on without it"; the notes
//!   name each node once and leave "critical" out, issue 36); any other raises severity 2
//!   ("the job's instance continues without it", with the node's `ranks` and `hosts` in its context, as a lost node's
//!   `node-failure` has them) and its status does not count in the job's exit code, which is the
//!   instance's (that of its rank 0, which runs the script).
//! - A rank other than 0 **exited with [`BROKER_EXIT_CUT_OFF`]**: it did not fail; it lost its way to its rank 0
//!   because something above it did. The failure that caused it is reported on its own, but later: a killed
//!   broker's shell first gives its tasks' output a second to drain. So the verdict waits [`CUT_OFF_GRACE`]: if
//!   no fatal exception came meanwhile, a critical cut-off broker ends the job (severity 0) and any other raises
//!   severity 2. Otherwise it is dropped, so that one failure gives one exception, not one per survivor.
//! - Rank 0 exiting, with any code: the instance ended (the code is its initial program's).
//!
//! While the job is being killed (after a fatal exception, a cancel or a time limit), broker exits are only
//! recorded.
//!
//! The rules hold from the job's start, before the instance has reported itself (its critical ranks are then
//! those its jobspec's shape gives, `JobCore::critical_ranks`): a broker that dies while its instance starts, before
//! it joined, is reported at once by the enclosing instance. A severity-2 exception carries the broker's rank in
//! the job's instance (`shell_ranks`), which that instance's rank 0 reads, as it reads a lost node's, to stop
//! waiting for the broker (`Broker::enclosing_lost`).

use super::{JobCore, JobId};
use crate::idset::IdSet;
use crate::shellproto::{describe_status, exit_code, BROKER_EXIT_CUT_OFF};

/// How long the verdict on a cut-off broker of a nested instance waits for the failure that caused it to be
/// reported (seconds): more than the second a job shell drains its tasks' output before it reports.
pub(super) const CUT_OFF_GRACE: f64 = 3.0;

/// The end of the note when the ended broker was one the nested instance cannot lose (it reported it critical:
/// its rank 0, and its routers if its brokers do not re-parent); said without that jargon (issue 36).
const CANNOT_GO_ON: &str = "the job's instance cannot go on without it";

/// The end of the note when the nested instance goes on without the ended broker.
const GOES_ON: &str = "the job's instance continues without it";

/// The broker of a nested instance as the notes name it, once: the host name and rank of its node in this
/// instance, and what ran there (`the job's broker on node3 (rank 3), where rank 2 of the job's instance ran`), as
/// a lost node's `node-failure` note names it (`JobCore::describe_lost`).
fn broker_on(host: &str, rank: u32, child: u32) -> String {
    format!("the job's broker on {host} (rank {rank}), where rank {child} of the job's instance ran")
}

/// What a nested broker's wait status says.
#[derive(Debug, PartialEq)]
enum BrokerEnd {
    /// It ended as an instance ends (rank 0: with its initial program's code; others: 0).
    Normal,
    /// It failed (how, as [`describe_status`] says it).
    Failed(String),
    /// It exited with [`BROKER_EXIT_CUT_OFF`]: cut off by a failure above it.
    CutOff,
}

/// What the wait status `status` of the broker of rank `child` (in the nested instance's own numbering) says.
fn classify(child: u32, status: i32) -> BrokerEnd {
    if status & 0x7f != 0 {
        return BrokerEnd::Failed(describe_status(status));
    }
    match exit_code(status) {
        _ if child == 0 => BrokerEnd::Normal,
        0 => BrokerEnd::Normal,
        BROKER_EXIT_CUT_OFF => BrokerEnd::CutOff,
        _ => BrokerEnd::Failed(describe_status(status)),
    }
}

impl JobCore {
    /// The broker of nested instance `id` on `rank` (on `host`) ended with `status` while the job was not being
    /// killed; apply the rules of this file. Returns whether the status counts in the job's exit code.
    pub(super) fn nested_broker_exit(&mut self, now: f64, id: JobId, rank: u32, host: &str, status: i32) -> bool {
        let Some(job) = self.jobs.get_mut(&id) else { return false };
        let critical = Self::critical_ranks(job);
        // The nested instance numbers its brokers in the order of the job's ranks (its R, renumbered), which is
        // the shells' order.
        let child = job.shells.get(&rank).map_or(0, |s| s.shell_rank);
        let what = broker_on(host, rank, child);
        match classify(child, status) {
            BrokerEnd::Normal => true,
            BrokerEnd::Failed(how) if critical.contains(rank) => {
                job.cut_off.clear(); // their cause is this one
                let note = format!("{what}, ended ({how}); {CANNOT_GO_ON}");
                self.raise(now, id, "exec", 0, &note);
                true
            }
            BrokerEnd::Failed(how) => {
                let critical_ended =
                    || critical.iter().any(|r| r != rank && job.shells.get(&r).is_some_and(|s| s.exited));
                if job.fatal.is_some() || critical_ended() {
                    return true; // the instance is ending anyway
                }
                let note = format!("{what}, ended ({how}); {GOES_ON}");
                let ctx = serde_json::json!({"type": "exec", "severity": 2, "note": note, "ranks": rank.to_string(),
                                             "hosts": host, "shell_ranks": child.to_string()});
                self.raise_ctx(now, id, ctx, false);
                // The instance has lost that rank for good (it shrinks): its node goes back to this one.
                self.release_partly(now, id, &IdSet::from_iter([rank]));
                self.schedule(now);
                false
            }
            BrokerEnd::CutOff => {
                if job.fatal.is_none() {
                    job.cut_off.insert(rank, now);
                }
                false
            }
        }
    }

    /// The instance of batch or alloc job `id` could not start: its brokers of ranks `never` (its own numbering)
    /// never joined it (their nodes lost, or their brokers failed, during its start-up), more than the `tolerated`
    /// it allows (`vigil batch --tolerate-lost`, `broker.tolerate-lost`). A fatal `node-failure` exception names
    /// their nodes (`the job's instance could not start without node5 (rank 5), where rank 4 of the job's instance
    /// was to run: its broker never joined, and --tolerate-lost=0 allows none`), so the job's exit code is the
    /// lost-node one and a `--requeue` job goes back to the queue; the job is killed at once.
    pub fn nested_start_failed(&mut self, now: f64, id: JobId, never: &IdSet, tolerated: u32) {
        let Some(job) = self.jobs.get(&id) else { return };
        let by_shell: std::collections::BTreeMap<u32, u32> =
            job.shells.values().map(|s| (s.shell_rank, s.rank)).collect();
        let ranks: Vec<(u32, u32)> = never.iter().filter_map(|c| by_shell.get(&c).map(|r| (*r, c))).collect();
        let parts: Vec<String> = ranks
            .iter()
            .map(|(r, c)| format!("{} (rank {r}), where rank {c} of the job's instance was to run", self.hostname(*r)))
            .collect();
        let (nodes, brokers) = if parts.len() == 1 { ("node", "its broker") } else { ("nodes", "their brokers") };
        let allows = if tolerated == 0 { "none".to_string() } else { format!("at most {tolerated}") };
        let what = format!("{nodes} {}", parts.join("; "));
        let mut note = format!(
            "the job's instance could not start without {what}: {brokers} never joined, and --tolerate-lost={tolerated} \
             allows {allows}"
        );
        if let Some(more) = self.arm_requeue(id, &what) {
            note = format!("{note}; {more}");
        }
        let lost: IdSet = ranks.iter().map(|(r, _)| *r).collect();
        let hosts: crate::hostlist::Hostlist = ranks.iter().map(|(r, _)| self.hostname(*r)).collect();
        let ctx = serde_json::json!({"type": "node-failure", "severity": 0, "note": note, "ranks": lost.to_string(),
                                     "hosts": hosts.to_string(), "shell_ranks": never.to_string()});
        self.raise_ctx(now, id, ctx, true);
    }

    /// When the next cut-off verdict of job `id` is due (see [`CUT_OFF_GRACE`]).
    pub(super) fn cut_off_deadline(&self, id: JobId) -> Option<f64> {
        self.jobs.get(&id)?.cut_off.values().map(|t| t + CUT_OFF_GRACE).min_by(f64::total_cmp)
    }

    /// Judge the cut-off brokers of job `id` whose grace is over at `now` (every one if `all`: the job's shells
    /// have all ended, so nothing more will be reported).
    pub(super) fn judge_cut_offs(&mut self, now: f64, id: JobId, all: bool) {
        let Some(job) = self.jobs.get_mut(&id) else { return };
        let due: Vec<u32> =
            job.cut_off.iter().filter(|(_, t)| all || now >= **t + CUT_OFF_GRACE).map(|(r, _)| *r).collect();
        for rank in due {
            let Some(job) = self.jobs.get_mut(&id) else { return };
            job.cut_off.remove(&rank);
            if job.fatal.is_some() || job.term_sent.is_some() {
                job.cut_off.clear();
                return;
            }
            let critical = Self::critical_ranks(job);
            let child = job.shells.get(&rank).map_or(0, |s| s.shell_rank);
            let host = self.pool.ranks.get(&rank).map(|p| p.hostname.clone()).unwrap_or_default();
            let what = format!(
                "{}, lost its way to the instance's rank 0 (exit code {BROKER_EXIT_CUT_OFF})",
                broker_on(&host, rank, child)
            );
            if critical.contains(rank) {
                let note = format!("{what}; {CANNOT_GO_ON}");
                self.raise(now, id, "exec", 0, &note);
            } else {
                let note = format!("{what}; {GOES_ON}");
                let ctx = serde_json::json!({"type": "exec", "severity": 2, "note": note, "ranks": rank.to_string(),
                                             "hosts": host, "shell_ranks": child.to_string()});
                self.raise_ctx(now, id, ctx, false);
                self.release_partly(now, id, &IdSet::from_iter([rank]));
                self.schedule(now);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shellproto::status_exited;

    #[test]
    fn a_brokers_wait_status_says_whether_it_failed_or_was_cut_off() {
        assert_eq!(classify(1, 9), BrokerEnd::Failed("killed by SIGKILL".into()));
        assert_eq!(classify(0, 9), BrokerEnd::Failed("killed by SIGKILL".into()));
        assert_eq!(classify(1, status_exited(BROKER_EXIT_CUT_OFF)), BrokerEnd::CutOff);
        assert_eq!(classify(1, status_exited(1)), BrokerEnd::Failed("exited with exit code 1".into()));
        assert_eq!(classify(2, 0), BrokerEnd::Normal);
        // Rank 0 exits with its initial program's code, whatever it is.
        assert_eq!(classify(0, status_exited(BROKER_EXIT_CUT_OFF)), BrokerEnd::Normal);
        assert_eq!(classify(0, status_exited(5)), BrokerEnd::Normal);
    }
}
