//! Brokers outlive rank 0 for `tbon.parent_grace` and rejoin it when it restarts (docs/statedir.md).
//!
//! Rank 0 has nothing above it to adopt its orphans (`reparent.rs`). With a state directory it comes back with
//! every job (`jobs/journal.rs`) and re-attaches those that were running (`jobs/reattach.rs`), so its children do
//! not exit with it:
//! - **Waiting.** A broker whose parent, rank 0, is lost (any verdict of the membership machine, its link closed)
//!   keeps running, and so do its job shells and everything below it, for `tbon.parent_grace`
//!   ([`crate::attrs::BrokerConfig::parent_grace`]: by default 60 s with a state directory, else 0, which is the
//!   old rule: exit at once). It tries rank 0's endpoint (the same: rank 0 restarts on the same node and
//!   configuration) every [`RANK0_RETRY`] ([`Effect::ConnectParent`], as an orphan tries a candidate).
//! - **Buffering.** What it and the brokers below it send rank 0 meanwhile (shell exit reports, task exits,
//!   output batches, exceptions, liveness reports) waits in the re-parenting queue, up to
//!   [`super::reparent::UP_QUEUE_MAX`] messages and [`super::reparent::UP_QUEUE_BYTES`]: past either bound a
//!   request gets EHOSTUNREACH (a shell sends that output batch again later, `shell/`) and anything else is
//!   dropped, counted in the log. Shell exit reports are never lost to the bound: each is kept until rank 0
//!   answers it ([`Broker::exit_reports`]) and sent again below.
//! - **Rejoining.** Once connected it registers again (`resource.register`, listing the jobs it has a shell or an
//!   unanswered exit report for, so that rank 0 knows which shells are still there, and its parent, so that one
//!   adopted before the restart is routed through its adopter), sends what was queued and
//!   every unanswered exit report, and tells its children (a `rejoin` control message), which do the same
//!   and pass it on down: a restarted rank 0 knows none of them.
//! - **Giving up.** Past the grace it answers the requests still queued with EHOSTUNREACH and exits as it would
//!   have at once (exit code
//!   [`crate::shellproto::BROKER_EXIT_CUT_OFF`], its shells killed), and tells its children to exit too (a
//!   `shutdown` that does not ask them to re-parent: rank 0 is gone for all of them).
//!
//! Brokers below a child of rank 0 do nothing special while it waits: their parent is alive. One of them whose
//! own parent dies meanwhile re-parents as usual: a child of rank 0 waiting for rank 0 adopts it (the adoptee's
//! `overlay.reparent` waits in the adopter's queue for rank 0, and the `rejoin` reaches it with the rest of the
//! adopter's subtree).

use super::core::{Broker, Effect, Peer, Time};
use super::reparent::{Reparent, CANDIDATE_TIMEOUT};
use crate::message::Message;
use serde_json::{json, Value};
use std::time::Duration;
use tracing::{error, info, warn};

/// How often a broker waiting for rank 0 tries to connect to it again.
pub const RANK0_RETRY: Duration = Duration::from_secs(1);

impl Broker {
    /// Rank 0, our parent, is lost (`why`): wait for it for `tbon.parent_grace`, or say no (grace 0) so that the
    /// caller ends this broker as before.
    pub fn wait_for_rank0(&mut self, why: &str) -> bool {
        let grace = self.parent_grace();
        if grace <= 0.0 || self.shutting_down.is_some() {
            return false;
        }
        let until = self.now + Duration::from_secs_f64(grace);
        warn!("lost rank 0, our parent ({why}); waiting up to {grace:.0} s for it to come back (tbon.parent_grace)");
        self.parent = None;
        self.parent_up = false;
        self.membership.remove(super::core::PARENT);
        self.reparenting = Some(Reparent::new(0, vec![0], self.now, Some((until, None))));
        self.effect(Effect::ConnectParent { rank: 0, lost: 0, timeout: CANDIDATE_TIMEOUT, last_resort: false });
        true
    }

    /// An attempt to reach rank 0 failed (`why`): again in [`RANK0_RETRY`], unless the grace is over.
    pub fn rank0_failed(&mut self, why: &str) {
        let now = self.now;
        let Some(rp) = self.reparenting.as_mut() else { return };
        let Some((until, retry)) = rp.grace.as_mut() else { return };
        if now >= *until {
            return self.rank0_gone();
        }
        tracing::debug!("rank 0 is not back yet: {why}");
        *retry = Some(now + RANK0_RETRY);
    }

    /// At a timer: try rank 0 again, or give up once the grace is over.
    pub fn rank0_timer(&mut self) {
        let now = self.now;
        let Some((until, retry)) = self.reparenting.as_mut().and_then(|rp| rp.grace.as_mut()) else { return };
        if now >= *until {
            return self.rank0_gone();
        }
        if retry.is_some_and(|t| t <= now) {
            *retry = None;
            self.effect(Effect::ConnectParent { rank: 0, lost: 0, timeout: CANDIDATE_TIMEOUT, last_resort: false });
        }
    }

    /// When this broker next has something to do while it waits for rank 0.
    pub fn rank0_deadline(&self) -> Option<Time> {
        let (until, retry) = self.reparenting.as_ref()?.grace?;
        Some(retry.map_or(until, |r| r.min(until)))
    }

    /// The grace is over and rank 0 is not back: exit as without a grace, and take the brokers below along.
    fn rank0_gone(&mut self) {
        let Some(rp) = self.reparenting.take() else { return };
        error!(
            "rank 0 did not come back within tbon.parent_grace ({:.0} s); exiting ({} message(s) for it dropped)",
            self.now.since(rp.since).as_secs_f64(),
            rp.queue.len() as u64 + rp.dropped
        );
        // What waited for it gets an answer, not silence.
        for m in rp.queue.iter().filter(|m| m.msgtype == crate::message::MsgType::Request) {
            self.respond_error(m, crate::message::errno::EHOSTUNREACH, "rank 0 is lost and did not come back");
        }
        self.exit_code = crate::shellproto::BROKER_EXIT_CUT_OFF;
        self.begin_shutdown("rank 0 did not come back");
    }

    /// Rank 0 took us back (`rp`: what waited for it): register again, send what waited, tell our children.
    pub fn rank0_back(&mut self, rp: Reparent) {
        self.parent = Some(0);
        // At the level of the "lost rank 0" line, so that a log that says it was lost also says it came back.
        warn!(
            "rank 0 is back after {:.1} s; rejoining ({} queued message(s) to send)",
            self.now.since(rp.since).as_secs_f64(),
            rp.queue.len()
        );
        if rp.dropped > 0 {
            warn!("while rank 0 was away, {} message(s) for it were dropped (queue full)", rp.dropped);
        }
        let (topo, size) = self.tree();
        if topo.parent(size, self.rank()) != Some(0) {
            // Adopted by rank 0 before it stopped: the restarted rank 0 must learn where we are.
            let mut m = Message::request(
                "overlay.reparent",
                0,
                &json!({"rank": self.rank(), "parent": 0, "lost": rp.lost, "ms": 0.0}),
            );
            m.flags = crate::message::FLAG_NORESPONSE;
            self.route_request(super::core::SELF, m);
        }
        // Registered first, so that rank 0 has the node before what its shells report; the exit reports last,
        // after the output that went before them.
        self.join();
        for m in rp.queue {
            self.send_up(m);
        }
        self.resend_exit_reports(&rp.queue_tags);
        self.rejoin_below();
    }

    /// Our parent's `rejoin`: rank 0 restarted and our parent is back with it. Register again, send every
    /// unanswered exit report (those in flight when rank 0 died were lost with it), and tell our children.
    pub fn on_rejoin(&mut self) {
        info!("rank 0 restarted; rejoining it");
        self.join();
        self.resend_exit_reports(&Default::default());
        self.rejoin_below();
    }

    /// Tell our children that rank 0 is back and knows none of them (a `rejoin` control message).
    fn rejoin_below(&mut self) {
        let m = Message::control("rejoin", &json!({}));
        let children: Vec<u32> = self.children.keys().copied().collect();
        for r in children {
            self.effect(Effect::Send(Peer::Child(r), m.clone()));
        }
    }

    /// The jobs this broker has a shell or an unanswered (or held, `unkillable.rs`) exit report for, ascending (in
    /// `resource.register`).
    pub fn attached_jobs(&self) -> Vec<u64> {
        let mut ids: std::collections::BTreeSet<u64> = self.shells.iter().map(|j| j.0).collect();
        ids.extend(self.lingering.jobs().map(|j| j.0));
        for m in self.exit_reports.values() {
            if let Some(id) = m.json().get("id").and_then(Value::as_u64) {
                ids.insert(id);
            }
        }
        ids.into_iter().collect()
    }
}
