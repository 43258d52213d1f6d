//! Shrink (RFC 28): in a nested instance (a batch or alloc job, `instance-level` > 0) a lost broker never comes
//! back (its job shell in the enclosing instance is gone), so its rank leaves the instance's resources for good.
//!
//! - The resource eventlog records `shrink {idset}` after the `offline` event of the loss.
//! - The rank no longer counts for what the instance can ever run ([`Pool::feasible`](super::sched::Pool::feasible)):
//!   a submission that cannot fit on what is left is refused at once, saying what was lost
//!   ([`SubmitError::Shrunk`](super::SubmitError::Shrunk)).
//! - A pending job that can no longer fit gets a fatal exception of type `alloc` naming what was lost, and ends.
//! - A re-registration of the rank (a broker thought lost that was only cut off) is ignored.
//!
//! A system instance (`instance-level` 0) does not shrink: a lost node may return, so a job that cannot fit on
//! the present ranks stays pending with its reason, without holding back the queue (`backfill.rs`).

use super::{Exception, JobCore, JobId};
use crate::idset::IdSet;
use serde_json::json;

impl JobCore {
    /// Ranks of a nested instance went down: remove them for good and fail the pending jobs that can no longer
    /// fit. Called by [`JobCore::ranks_down`] when [`SchedConfig::shrink`](super::SchedConfig::shrink) is set.
    pub(super) fn shrink(&mut self, now: f64, ranks: &IdSet) {
        let gone: IdSet = ranks.iter().filter(|r| self.pool.ranks.get(r).is_some_and(|p| !p.removed)).collect();
        if gone.is_empty() {
            return;
        }
        for r in gone.iter() {
            if let Some(p) = self.pool.ranks.get_mut(&r) {
                p.removed = true;
            }
        }
        self.resource_eventlog.push(crate::eventlog::Event::with_time(
            now,
            "shrink",
            json!({"idset": gone.to_string()}),
        ));
        let what = self.describe_ranks(&gone);
        self.shrunk.push(what.clone());
        // Once per loss, over the queue: a node loss is not a per-job event.
        let pending: Vec<JobId> = self.queue.ids().collect();
        for id in pending {
            let Some(job) = self.jobs.get(&id) else { continue };
            if let Err(e) = self.pool.feasible(&job.req) {
                let note = format!("unsatisfiable: the instance lost {what} for good (shrink): {e}");
                self.drop_pending(now, id, Exception { kind: "alloc".into(), severity: 0, note });
            }
        }
        self.sched_dirty = true;
    }

    /// `host (rank r), ...` for `ranks`.
    pub(super) fn describe_ranks(&self, ranks: &IdSet) -> String {
        ranks
            .iter()
            .map(|r| format!("{} (rank {r})", self.pool.ranks.get(&r).map(|p| p.hostname.as_str()).unwrap_or("?")))
            .collect::<Vec<_>>()
            .join(", ")
    }
}
