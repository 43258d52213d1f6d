//! Unkillable tasks, on the shell's node: the wait for a killed job cgroup to empty.
//!
//! When a job shell ends, its broker's driver kills whatever is left in the shell's cgroup (`cgroup.kill`:
//! SIGKILL to every process in it and below) and looks again a moment later. Processes killed that way leave
//! within milliseconds, or as long as the kernel takes to free their memory; a process in uninterruptible sleep
//! (`D` in `/proc/PID/stat`: a read from a dead NFS server or a FUSE daemon that no longer answers) does not leave
//! until the kernel call it waits in returns, which may be never. Such a process still holds its memory, and
//! perhaps a GPU: its node must not be given to another job as if it were free.
//!
//! The rule (time passed in, as everywhere in the broker):
//! - the driver reports the shell's end with the pids still in the cgroup ([`super::core::Input::ShellDone`]'s
//!   `lingering`); none: the exit report goes to rank 0 at once, as always;
//! - else the report is **held** here, and the job keeps its resources on this node meanwhile (rank 0 has not heard
//!   of the shell's end);
//! - the cgroup empties ([`super::core::Input::CgroupEmptied`]) before `exec.kill-timeout` (5 s by default, the
//!   time SIGTERM has before SIGKILL; this node's own value) has passed: the report goes then, as any other;
//! - `exec.kill-timeout` passes first: the report goes with the pids left ([`ShellExit::unkillable`]), and rank 0
//!   ends the job and drains this node with the reason `unkillable tasks of job ID` (`jobs/unkillable.rs`). An
//!   infinite `exec.kill-timeout` waits for the cgroup to empty, however long.
//!
//! A report held here counts as a job still attached to this broker (`rejoin.rs`): a restarted rank 0 waits for it.

use super::core::Time;
use crate::jobs::JobId;
use crate::shellproto::ShellExit;
use std::collections::BTreeMap;
use std::time::Duration;

/// Exit reports held while their shell's cgroup still holds processes, by job.
#[derive(Debug, Default)]
pub struct Lingering {
    held: BTreeMap<JobId, Held>,
}

#[derive(Debug)]
struct Held {
    /// When the wait ends (`None`: an infinite `exec.kill-timeout`).
    due: Option<Time>,
    /// The report, its `unkillable` empty.
    exit: ShellExit,
    /// What was left in the cgroup right after `cgroup.kill`.
    pids: Vec<u32>,
}

impl Lingering {
    /// Hold `exit` (job shell ended at `now`), whose cgroup still held `pids` after it was killed, for `timeout`
    /// seconds (`exec.kill-timeout`; infinite or NaN: until the cgroup empties). A second report for the same job
    /// replaces the first (one shell per job and node).
    pub fn hold(&mut self, now: Time, timeout: f64, exit: ShellExit, pids: Vec<u32>) {
        let due = Duration::try_from_secs_f64(timeout).ok().map(|d| now + d);
        self.held.insert(JobId(exit.id), Held { due, exit, pids });
    }

    /// Job `id`'s cgroup is empty: its report, held until now, goes as it is (`None` if none was held).
    pub fn emptied(&mut self, id: JobId) -> Option<ShellExit> {
        self.held.remove(&id).map(|h| h.exit)
    }

    /// When [`Lingering::expire`] has something to hand out, if ever.
    pub fn next_deadline(&self) -> Option<Time> {
        self.held.values().filter_map(|h| h.due).min()
    }

    /// The reports whose wait ended by `now`, in job order, each with the pids left ([`ShellExit::unkillable`]).
    pub fn expire(&mut self, now: Time) -> Vec<ShellExit> {
        let due: Vec<JobId> =
            self.held.iter().filter(|(_, h)| h.due.is_some_and(|d| d <= now)).map(|(id, _)| *id).collect();
        due.into_iter()
            .filter_map(|id| self.held.remove(&id))
            .map(|h| ShellExit { unkillable: h.pids, ..h.exit })
            .collect()
    }

    /// The jobs whose report is held.
    pub fn jobs(&self) -> impl Iterator<Item = JobId> + '_ {
        self.held.keys().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exit(id: u64) -> ShellExit {
        ShellExit { id, rank: 3, report: None, shell_status: 9, ended: Some(100.0), unkillable: vec![] }
    }

    fn t(s: f64) -> Time {
        Time::from_secs_f64(s)
    }

    #[test]
    fn a_report_is_held_until_the_cgroup_empties_or_the_kill_timeout_passes() {
        let mut l = Lingering::default();
        l.hold(t(10.0), 5.0, exit(1), vec![41, 42]);
        l.hold(t(11.0), 5.0, exit(2), vec![43]);
        assert_eq!(l.next_deadline(), Some(t(15.0)));
        assert_eq!(l.jobs().collect::<Vec<_>>(), vec![JobId(1), JobId(2)]);
        // Nothing is due before its time.
        assert!(l.expire(t(14.999)).is_empty());
        // Job 2's cgroup empties in time: its report goes as it is, and it is due no more.
        let e = l.emptied(JobId(2)).expect("held");
        assert!(e.unkillable.is_empty());
        assert!(l.emptied(JobId(2)).is_none());
        // Job 1's does not: at 15 s its report goes with the pids left.
        let due = l.expire(t(15.0));
        assert_eq!(due.len(), 1);
        assert_eq!((due[0].id, due[0].unkillable.clone(), due[0].shell_status), (1, vec![41, 42], 9));
        assert_eq!(l.next_deadline(), None);
        // Emptied later: nothing is held for it any more.
        assert!(l.emptied(JobId(1)).is_none());
    }

    #[test]
    fn an_infinite_kill_timeout_waits_for_the_cgroup_however_long() {
        let mut l = Lingering::default();
        l.hold(t(1.0), f64::INFINITY, exit(7), vec![5]);
        assert_eq!(l.next_deadline(), None);
        assert!(l.expire(t(1e9)).is_empty());
        assert_eq!(l.emptied(JobId(7)).map(|e| e.id), Some(7));
    }
}
