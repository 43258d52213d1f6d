//! Unkillable tasks, on rank 0: a shell's exit report that names processes its node could not kill.
//!
//! A node's broker holds a shell's exit report while the shell's cgroup still holds processes after
//! `cgroup.kill`, for at most `exec.kill-timeout` (`broker/unkillable.rs`); after that it sends the report with
//! their pids ([`crate::shellproto::ShellExit::unkillable`]). Flux does the same thing with the same default
//! (its exec `kill-timeout`, 5 s), then drains. Here, when such a report comes:
//!
//! - the node is **drained** with the reason [`unkillable_reason`], `unkillable tasks of job ID`, replacing any
//!   reason it had (a health check's drain would be undone by its next pass; an admin's reason stays in the
//!   resource eventlog). Jobs running there go on; nothing new is placed there. An admin undrains it once the
//!   processes are gone (`vigil resource undrain`);
//! - the job's eventlog gets a **non-fatal exception** (severity [`UNKILLABLE_SEVERITY`]) of type
//!   [`UNKILLABLE_EXCEPTION`] naming the node and the pids;
//! - the shell counts as ended, as any other: once every shell has, the job ends (its user's `vigil run` or `vigil
//!   job wait` returns) and its resources are freed, the drained node's included, which the drain keeps from any
//!   other job.

use super::{DrainMode, JobCore, JobId};
use crate::idset::IdSet;

/// Exception type of a job whose processes outlived SIGKILL on a node.
pub const UNKILLABLE_EXCEPTION: &str = "unkillable";

/// Severity of that exception: informational (the job is ending anyway; its result is its tasks').
pub const UNKILLABLE_SEVERITY: u32 = 1;

/// The drain reason of a node left with job `id`'s unkillable processes.
pub fn unkillable_reason(id: JobId) -> String {
    format!("unkillable tasks of job {id}")
}

impl JobCore {
    /// Job `id`'s shell on broker `rank` (host `host`) ended with processes `pids` still in its cgroup
    /// `exec.kill-timeout` after SIGKILL: drain the node and note it in the job's eventlog (see the module doc).
    /// The caller counts the shell as ended.
    pub(super) fn unkillable(&mut self, now: f64, id: JobId, rank: u32, host: &str, pids: &[u32]) {
        let reason = unkillable_reason(id);
        if self.pool.ranks.contains_key(&rank) {
            let _ = self.drain(now, &IdSet::from_iter([rank]), &reason, DrainMode::Force);
        }
        let pids: Vec<String> = pids.iter().map(u32::to_string).collect();
        let note = format!(
            "{reason}: processes {} still in its cgroup on {host} (rank {rank}) exec.kill-timeout after SIGKILL; \
             the node is drained",
            pids.join(", ")
        );
        self.raise(now, id, UNKILLABLE_EXCEPTION, UNKILLABLE_SEVERITY, &note);
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{actions, cmd, core, spec, T0};
    use super::*;
    use crate::jobs::{JobState, SubmitRequest};
    use crate::shellproto::{ShellExit, ShellReport};
    use crate::signal::{SIGKILL, SIGTERM};

    fn exit(id: JobId, rank: u32, status: i32, unkillable: Vec<u32>) -> ShellExit {
        let report = ShellReport { status, tasks: vec![], error: None, abort_code: None, usage: None, ended: None };
        ShellExit { id: id.0, rank, report: Some(report), shell_status: 0, ended: None, unkillable }
    }

    /// A 2-node job on ranks 0-1 is cancelled; its task on rank 1 is stuck in uninterruptible sleep. The rule in
    /// virtual time: SIGTERM at 1 s, SIGKILL at 1 s + the kill timeout; rank 1's broker reports the shell's end
    /// with the pids left another kill timeout later. The job ends then, rank 1 is drained with the reason, the
    /// eventlog names the pids, and a job submitted meanwhile is not placed on rank 1 until it is undrained.
    #[test]
    fn a_shell_with_unkillable_processes_ends_its_job_and_drains_its_node() {
        let mut c = core(2, 1, 0);
        let kt = c.kill_timeout;
        let id = c.submit(T0, SubmitRequest::new(&spec(cmd().nnodes(2)), 0)).expect("submit").id;
        for r in 0..2 {
            c.shell_spawned(T0, id, r, Ok(()));
        }
        actions(&mut c);
        let sigs = |c: &mut JobCore| -> Vec<i32> {
            let f = |a| match a {
                crate::jobs::Action::SignalShells { signal, .. } => Some(signal),
                _ => None,
            };
            actions(c).into_iter().filter_map(f).collect()
        };
        c.cancel(T0 + 1.0, id, 0, true, "").expect("cancel");
        assert_eq!(sigs(&mut c), vec![SIGTERM]);
        assert_eq!(c.next_deadline(), Some(T0 + 1.0 + kt));
        c.handle_timeout(T0 + 1.0 + kt);
        assert_eq!(sigs(&mut c), vec![SIGKILL]);
        // Rank 0's shell ends on SIGKILL; a second job, for one node, waits behind the running one.
        c.shell_exit(T0 + 1.0 + kt, exit(id, 0, SIGKILL, vec![]));
        let next = c.submit(T0 + 2.0 + kt, SubmitRequest::new(&spec(cmd().nnodes(1)), 0)).expect("submit").id;
        assert_eq!(c.jobs[&id].state, JobState::Cleanup);
        // Rank 1's report comes a kill timeout after SIGKILL, naming two processes left.
        let at = T0 + 1.0 + 2.0 * kt;
        c.shell_exit(at, exit(id, 1, SIGTERM, vec![4242, 4250]));
        let job = &c.jobs[&id];
        assert_eq!(job.state, JobState::Inactive, "the job ends anyway");
        let reason = unkillable_reason(id);
        assert_eq!(c.pool.ranks[&1].drained.as_deref(), Some(reason.as_str()));
        assert_eq!(reason, format!("unkillable tasks of job {}", id.f58()));
        let exc = job
            .eventlog
            .iter()
            .find(|e| e.name == "exception" && e.context["type"] == UNKILLABLE_EXCEPTION)
            .expect("an unkillable exception");
        assert_eq!(exc.context["severity"], UNKILLABLE_SEVERITY);
        let note = exc.context["note"].as_str().unwrap_or_default();
        assert!(note.contains("processes 4242, 4250") && note.contains("(rank 1)"), "{note}");
        // The drain is in the resource eventlog, and the job that was waiting runs on rank 0 only.
        assert!(c.resource_eventlog.iter().any(|e| e.name == "drain" && e.context["reason"] == reason.as_str()));
        assert_eq!(c.jobs[&next].state, JobState::Run);
        assert_eq!(c.jobs[&next].alloc.iter().map(|a| a.rank).collect::<Vec<_>>(), vec![0]);
        // A third job waits until rank 1 is undrained (its processes gone), then runs there.
        let third = c.submit(at + 1.0, SubmitRequest::new(&spec(cmd().nnodes(1)), 0)).expect("submit").id;
        assert_eq!(c.jobs[&third].state, JobState::Sched);
        c.undrain(at + 10.0, &IdSet::from_iter([1])).expect("undrain");
        assert_eq!(c.jobs[&third].state, JobState::Run);
        assert_eq!(c.jobs[&third].alloc.iter().map(|a| a.rank).collect::<Vec<_>>(), vec![1]);
    }

    /// A report with nothing left drains nothing; a health check's drain is replaced by the unkillable one (the
    /// check's next pass must not return the node to service).
    #[test]
    fn only_a_report_naming_processes_drains_and_it_replaces_a_health_drain() {
        let mut c = core(2, 1, 0);
        let id = c.submit(T0, SubmitRequest::new(&spec(cmd().nnodes(2)), 0)).expect("submit").id;
        for r in 0..2 {
            c.shell_spawned(T0, id, r, Ok(()));
        }
        c.shell_exit(T0 + 1.0, exit(id, 0, 0, vec![]));
        assert!(c.pool.ranks[&0].drained.is_none());
        let health = format!("{}disk full", crate::health::REASON_PREFIX);
        c.health_drain(T0 + 1.5, 1, &health).expect("health drain");
        c.shell_exit(T0 + 2.0, exit(id, 1, 0, vec![77]));
        assert_eq!(c.pool.ranks[&1].drained.as_deref(), Some(unkillable_reason(id).as_str()));
        assert_eq!(c.health_undrain(T0 + 3.0, 1), Ok(false), "a passing check leaves it drained");
        assert_eq!(c.jobs[&id].state, JobState::Inactive);
    }
}
