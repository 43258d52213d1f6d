//! Fabric-down nodes, on rank 0: a node whose job network stopped answering while its broker lives on.
//!
//! A parent's prober probes each child on its job network (`tbon.job_network`) as well as on the management
//! network, and its fabric-down rule (`crate::membership::FabricWatch`) asks rank 0 to act when the job network
//! alone goes silent (`resource.drain` with `"by": "fabric"`). Here, [`JobCore::fabric_down`]:
//!
//! - the node is **drained** with the reason `fabric-down: IFACE` ([`crate::membership::fabric_reason`]),
//!   replacing any reason it had; it stays up (not lost: its broker still answers on the management network), so
//!   `vigil resource status` lists it as drained with that reason;
//! - every job with a live shell there gets what it would get had the node been lost
//!   ([`JobCore::jobs_lose_ranks`], whose rules say which shells are critical): a fatal `node-failure`
//!   exception (severity 0) for an ordinary job, a severity-2 `node-failure` for a batch or alloc job whose
//!   instance can lose that node or a job that asked to survive (`-o on-node-loss=notify`), whose resources on
//!   the node are released and whose leader is told. The note says `fabric-down: IFACE on node ...`. A job's
//!   tasks there are useless without the fabric (an MPI collective would hang until the time limit), so the
//!   job's shell on that node is killed (SIGKILL), which its broker can still be told to do.
//!
//! The admin undrains the node once the fabric is repaired (`vigil resource undrain`); with
//! `tbon.job_network_undrain_after` the parent asks for it once the job network has answered that long
//! ([`JobCore::fabric_undrain`], which undoes only a fabric-down drain).

use super::{Action, DrainMode, JobCore, JobId};
use crate::idset::IdSet;
use crate::membership::FABRIC_REASON_PREFIX;
use std::collections::BTreeMap;

impl JobCore {
    /// Broker `rank`'s job network is down while its broker lives (`reason` is `fabric-down: IFACE`): drain the
    /// node and fail or notify the jobs with shells there (see the module doc). Returns whether anything changed
    /// (a second report of the same fault, the node drained for it already and no job left there, changes
    /// nothing).
    ///
    /// # Errors
    /// `rank` is not in the instance, or `reason` does not start with `fabric-down: `.
    pub fn fabric_down(&mut self, now: f64, rank: u32, reason: &str) -> Result<bool, String> {
        if !reason.starts_with(FABRIC_REASON_PREFIX) {
            return Err(format!("reason: a fabric-down drain's reason starts with '{FABRIC_REASON_PREFIX}'"));
        }
        let ranks = IdSet::from_iter([rank]);
        if !self.pool.ranks.contains_key(&rank) {
            return Err(format!("rank(s) {rank} not in this instance"));
        }
        let mut changed = false;
        if self.pool.ranks[&rank].drained.as_deref() != Some(reason) {
            self.drain(now, &ranks, reason, DrainMode::Force)?;
            changed = true;
        }
        let jobs: Vec<JobId> = self.by_rank.get(&rank).into_iter().flatten().copied().collect();
        let mut hit = BTreeMap::new();
        for id in jobs {
            self.actions.push_back(Action::SignalShells { id, ranks: vec![rank], signal: crate::signal::SIGKILL });
            hit.insert(id, vec![rank]);
            changed = true;
        }
        self.jobs_lose_ranks_as(now, hit, &format!("{reason} on"));
        self.schedule(now);
        Ok(changed)
    }

    /// `tbon.job_network_undrain_after` passed with broker `rank`'s job network answering: undrained if the
    /// fabric-down rule drained it (its reason starts with `fabric-down: `), else left as it is (an admin's or
    /// another rule's drain). Returns whether it was undrained.
    ///
    /// # Errors
    /// `rank` is not in the instance.
    pub fn fabric_undrain(&mut self, now: f64, rank: u32) -> Result<bool, String> {
        let Some(p) = self.pool.ranks.get(&rank) else { return Err(format!("rank(s) {rank} not in this instance")) };
        match p.drained.as_deref() {
            Some(r) if r.starts_with(FABRIC_REASON_PREFIX) => {
                self.undrain(now, &IdSet::from_iter([rank])).map(|()| true)
            }
            _ => Ok(false),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{actions, cmd, core, spec, T0};
    use super::*;
    use crate::jobs::{JobState, SubmitRequest};
    use crate::jobspec::OnNodeLoss;
    use crate::signal::SIGKILL;

    fn running(c: &mut JobCore, nnodes: u32, notify: bool) -> JobId {
        let mut b = cmd().nnodes(nnodes);
        if notify {
            b = b.shell_option("on-node-loss", serde_json::json!("notify"));
        }
        let id = c.submit(T0, SubmitRequest::new(&spec(b), 0)).expect("submit").id;
        for r in 0..nnodes {
            c.shell_spawned(T0, id, r, Ok(()));
        }
        actions(c);
        id
    }

    fn exception(c: &JobCore, id: JobId) -> serde_json::Value {
        let e = c.jobs[&id].eventlog.iter().rev().find(|e| e.name == "exception").expect("an exception");
        serde_json::Value::Object(e.context.clone())
    }

    /// An ordinary 3-node job; rank 2's fabric goes down: a fatal node-failure exception naming the fault, the
    /// shell there killed, the node drained with the reason and still up; a second report changes nothing; the
    /// admin's undrain returns it to service.
    #[test]
    fn a_fabric_down_node_fails_an_ordinary_job_and_is_drained_not_lost() {
        let mut c = core(3, 1, 0);
        let id = running(&mut c, 3, false);
        let reason = crate::membership::fabric_reason("hsn0");
        assert_eq!(c.fabric_down(T0 + 1.0, 2, &reason), Ok(true));
        let acts = actions(&mut c);
        assert!(
            acts.iter().any(|a| matches!(a, Action::SignalShells { id: j, ranks, signal }
                if *j == id && ranks == &vec![2] && *signal == SIGKILL)),
            "the shell on the fabric-down node is killed: {acts:?}"
        );
        let e = exception(&c, id);
        assert_eq!((e["type"].as_str(), e["severity"].as_u64()), (Some("node-failure"), Some(0)));
        assert!(e["note"].as_str().unwrap_or("").starts_with("fabric-down: hsn0 on node"), "{e}");
        assert_eq!(c.jobs[&id].fatal.as_ref().map(|f| f.kind.as_str()), Some("node-failure"));
        let p = &c.pool.ranks[&2];
        assert_eq!(p.drained.as_deref(), Some("fabric-down: hsn0"));
        assert!(p.up, "not lost");
        assert_eq!(c.fabric_down(T0 + 2.0, 2, &reason), Ok(false), "said again: nothing changes");
        assert!(c.fabric_down(T0 + 2.0, 2, "link down").is_err(), "not a fabric-down reason");
        assert!(c.fabric_down(T0 + 2.0, 9, &reason).is_err(), "not a rank of the instance");
        c.undrain(T0 + 3.0, &IdSet::from_iter([2])).expect("the admin undrains");
        assert!(c.pool.ranks[&2].drained.is_none());
    }

    /// A job that asked to survive gets a severity-2 exception and goes on with the other nodes; a node with no
    /// job is drained all the same; the automatic undrain undoes only a fabric-down drain.
    #[test]
    fn a_job_that_survives_is_notified_and_only_a_fabric_drain_is_undone_by_the_rule() {
        let mut c = core(3, 1, 0);
        let id = running(&mut c, 2, true);
        assert_eq!(c.jobs[&id].req.on_node_loss, OnNodeLoss::Notify);
        let reason = crate::membership::fabric_reason("ib0");
        assert_eq!(c.fabric_down(T0 + 1.0, 1, &reason), Ok(true));
        let e = exception(&c, id);
        assert_eq!(e["severity"].as_u64(), Some(2), "{e}");
        assert_eq!(c.jobs[&id].state, JobState::Run, "goes on on rank 0");
        assert!(c.jobs[&id].fatal.is_none());
        // Rank 2 has no job: drained, nothing else.
        assert_eq!(c.fabric_down(T0 + 1.0, 2, &reason), Ok(true));
        assert_eq!(c.fabric_undrain(T0 + 5.0, 2), Ok(true));
        assert!(c.pool.ranks[&2].drained.is_none());
        // An admin's drain is not undone by the rule.
        c.drain(T0 + 6.0, &IdSet::from_iter([2]), "maintenance", DrainMode::Refuse).expect("drain");
        assert_eq!(c.fabric_undrain(T0 + 7.0, 2), Ok(false));
        assert_eq!(c.pool.ranks[&2].drained.as_deref(), Some("maintenance"));
    }
}
