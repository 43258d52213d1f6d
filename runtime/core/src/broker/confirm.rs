//! Before a verdict of "lost" that rests on one signal: confirmation through independent paths, and a judge that
//! knows when it is late.
//!
//! A false "lost" kills every job on a healthy node, so the one verdict that rests on a single weak signal, our
//! TCP data left unacknowledged by the peer's kernel for `tbon.lost_timeout` while no kernel probe reply vouches
//! for its node ([`crate::membership`]), is never final by itself. That signal lies under load: a live peer that
//! is preempted while it holds its socket's lock has its kernel queue our segments, and ACK them, only when it
//! runs again, and a delayed ACK may legally wait 200 ms. The membership machine makes such a peer **suspect**;
//! this module confirms it, in the manner of SWIM's indirect probes:
//!
//! 1. **This broker's own check** ([`Effect::CheckNode`]): the driver opens a TCP connection to the suspect's
//!    node at its probe port. The *kernel* answers a SYN (a SYN-ACK, or a reset where nothing listens on TCP
//!    there) in its receive path, however starved the broker above it is; a dead node, or a cut link, answers
//!    nothing. The check waits as long as the suspect's data may wait for an ACK: `tbon.lost_timeout`, or the
//!    link's round trip bound (the kernel's `srtt + 4 × rttvar`) if longer, times the lateness factor below.
//! 2. **Checks by [`HELPERS`] other children** (the suspect's siblings in the tree), asked with a `confirm`
//!    control message: the next online children after the suspect in rank order, wrapping around, so that the
//!    work of a burst of suspicions spreads over the children. Each runs the same check from its own node and
//!    answers `confirmed`. A broker that judges its *parent* has no sibling it can reach except through that
//!    parent: its own check is the only path, and the verdict says so.
//!
//! Any path on which the node's kernel answered clears the suspicion (the unacknowledged-data clock restarts: the
//! peer is alive, and is torpid if it stays silent). The peer is lost only when every path failed to reach its
//! kernel, or the paths still silent did not report within the bound (twice the check's wait plus two heartbeat
//! periods), and its data is still unacknowledged. When no path can be tried at all (no address known for the
//! node, no other child), the verdict stands on the TCP signal alone, as before this rule, and its reason says so.
//!
//! A broker asked to help (`confirm` from its parent) holds at most [`MAX_HELPING`] checks at once; it answers
//! the rest "cannot check" at once, and ignores a request it cannot read, so a parent cannot make it hold more.
//!
//! **The judge's own lateness** (Lifeguard's local health multiplier): each time this broker's heartbeat timer
//! fires more than half a heartbeat period late, its lateness score rises by one (at most [`LATE_MAX`]); each
//! timer on time lowers it by one. While the score is above zero, the unacknowledged-data rule and the checks
//! wait `1 + score` times longer, and `vigil overlay status` / `vigil uptime` show `judge degraded` with the
//! largest lateness seen; the first episode of half of `tbon.torpid_max` or more is logged at warn level, every
//! other one at info (tens of milliseconds are common while all the brokers of a machine start).

use super::core::{Broker, Effect, Peer, Time, PARENT};
use crate::membership::PeerState;
use crate::message::Message;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::Duration;
use tracing::{info, warn};

/// Other children asked to check a suspect's node.
pub const HELPERS: usize = 2;

/// Checks a broker runs at once for its parent; more are answered "cannot check" at once.
pub const MAX_HELPING: usize = 64;

/// Highest lateness score: `tbon.lost_timeout` waits at most `1 + LATE_MAX` times longer (as Lifeguard's).
pub const LATE_MAX: u32 = 8;

/// Shortest and longest wait of one check that a parent may ask of a helper (seconds).
const CHECK_WAIT_MIN: f64 = 0.01;
const CHECK_WAIT_MAX: f64 = 5.0;

/// Where a check ([`Effect::CheckNode`]) goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CheckTarget {
    /// This broker's parent's node (the driver knows where it is: the link's peer address and the probe port of
    /// its `hello-ack`).
    Parent,
    /// A node as a hello names it: `node` is the address the driver gave for the child's link (`IP:port`, of
    /// which the IP counts), `port` the probe port the child announced.
    Node {
        /// The child's link address as the driver reported it ([`super::core::Input::Hello`]).
        node: String,
        /// The child's probe port (its hello's `probe_port`), if it gave one.
        port: Option<u16>,
    },
}

/// What one path said.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    /// The node's kernel answered.
    Answered,
    /// Nothing answered within the wait.
    Silent,
    /// The path could not be tried (no address; the helper was busy).
    Untried,
}

/// A confirmation under way.
#[derive(Debug)]
struct Pending {
    /// Our own check's token; also the id helpers echo.
    id: u64,
    deadline: Time,
    own: Option<Outcome>,
    /// Helpers asked, and what each said.
    helpers: Vec<(u32, Option<Outcome>)>,
    /// The wait of one check, for the reason.
    wait: Duration,
}

/// The confirmation state of one broker: as a judge, as a helper, and its own lateness.
#[derive(Debug, Default)]
pub struct Confirmations {
    next_id: u64,
    /// Judge: suspect (a child's rank, or [`PARENT`]) → its confirmation.
    pending: BTreeMap<u32, Pending>,
    /// Helper: our check's token → the id our parent asked under.
    helping: BTreeMap<u64, u64>,
    /// Where each child's node is checked: its link address and probe port (from its hello).
    addrs: BTreeMap<u32, (String, Option<u16>)>,
    /// Lateness score (0: on time) and the largest lateness seen while above zero (seconds).
    score: u32,
    worst: f64,
    /// A degraded episode was logged at warn level already.
    warned: bool,
    /// Suspicions confirmed lost and cleared, since start (for status output).
    cleared: u64,
    confirmed_lost: u64,
}

impl Confirmations {
    /// The lateness factor, >= 1.
    pub fn factor(&self) -> f64 {
        1.0 + f64::from(self.score)
    }

    /// For status output: `{"state": "on time" | "degraded: ...", "cleared": n, "lost": n}`.
    pub fn status(&self) -> Value {
        let state = if self.score == 0 {
            "on time".to_string()
        } else {
            format!(
                "degraded: timers ran up to {:.0} ms late; TCP verdicts wait {}x longer and are confirmed",
                self.worst * 1e3,
                self.score + 1
            )
        };
        json!({"state": state, "suspicions_cleared": self.cleared, "suspicions_confirmed": self.confirmed_lost})
    }

    /// Earliest confirmation deadline.
    pub fn next_deadline(&self) -> Option<Time> {
        self.pending.values().map(|p| p.deadline).min()
    }
}

impl Broker {
    /// Remember where child `rank`'s node is checked: `addr` as the driver gave it for the link, and the probe
    /// port of its hello (if any, and valid).
    pub(crate) fn note_child_address(&mut self, rank: u32, addr: &str, hello: &Value) {
        let port = hello.get("probe_port").and_then(Value::as_u64).and_then(|p| u16::try_from(p).ok());
        self.confirm.addrs.insert(rank, (addr.to_string(), port));
    }

    /// Forget child `rank`'s address (it left or was lost).
    pub(crate) fn forget_child_address(&mut self, rank: u32) {
        self.confirm.addrs.remove(&rank);
    }

    /// The heartbeat timer fired `late` after it was due: update the lateness score and the membership's factor.
    pub(crate) fn judge_lateness(&mut self, late: Duration) {
        let (period, torpid_max) = (self.membership.config().heartbeat_period, self.membership.config().torpid_max);
        let late = late.as_secs_f64();
        let c = &mut self.confirm;
        if late > period / 2.0 {
            if c.score == 0 {
                c.worst = 0.0;
                let msg = format!(
                    "judge degraded: this broker's heartbeat timer ran {:.0} ms late (starved or stopped); verdicts \
                     on unacknowledged TCP data wait longer until it runs on time",
                    late * 1e3
                );
                // Tens of milliseconds are common while an instance starts (every broker of a machine loading at
                // once): said at info level. A stall of half of tbon.torpid_max or more is worth a warning, once.
                if c.warned || late < torpid_max / 2.0 {
                    info!("{msg}");
                } else {
                    c.warned = true;
                    warn!("{msg} (later episodes are logged at info level)");
                }
            }
            c.score = (c.score + 1).min(LATE_MAX);
            c.worst = c.worst.max(late);
        } else if c.score > 0 {
            c.score -= 1;
            if c.score == 0 {
                info!("judge on time again (it ran up to {:.0} ms late)", c.worst * 1e3);
            }
        }
        let f = c.factor();
        self.membership.set_lateness(f);
    }

    /// The wait of one check of `key`'s node now: what its data may wait for an ACK (`tbon.lost_timeout`, or
    /// the link's round trip bound if longer), times the lateness factor.
    fn check_wait(&self, key: u32) -> Duration {
        let w = self.membership.ack_wait(key);
        Duration::from_secs_f64(w.clamp(CHECK_WAIT_MIN, CHECK_WAIT_MAX))
    }

    /// Start confirming every peer the membership machine made suspect.
    pub(crate) fn start_confirmations(&mut self) {
        for key in self.membership.take_suspects() {
            self.start_confirmation(key);
        }
    }

    fn start_confirmation(&mut self, key: u32) {
        if self.confirm.pending.contains_key(&key) {
            return;
        }
        self.confirm.next_id += 1;
        let id = self.confirm.next_id;
        let wait = self.check_wait(key);
        let hb = Duration::from_secs_f64(self.membership.config().heartbeat_period);
        let deadline = self.now + wait * 2 + hb * 2;
        // Our own path.
        let target = if key == PARENT {
            Some(CheckTarget::Parent)
        } else {
            self.confirm.addrs.get(&key).map(|(node, port)| CheckTarget::Node { node: node.clone(), port: *port })
        };
        let own = match target {
            Some(target) => {
                self.effect(Effect::CheckNode { token: id, target, wait });
                None
            }
            None => Some(Outcome::Untried),
        };
        // Other paths: the next online children after the suspect (none for our parent).
        let mut helpers = Vec::new();
        if key != PARENT {
            if let Some((node, port)) = self.confirm.addrs.get(&key).cloned() {
                let body = json!({"id": id, "node": node, "port": port, "wait_ms": wait.as_millis() as u64});
                let after = self.children.range(key + 1..).map(|(r, _)| *r);
                let before = self.children.range(..key).map(|(r, _)| *r);
                let pick: Vec<u32> = after
                    .chain(before)
                    .filter(|r| self.membership.state(*r) == PeerState::Online && !self.membership.confirming(*r))
                    .take(HELPERS)
                    .collect();
                for r in pick {
                    self.effect(Effect::Send(Peer::Child(r), Message::control("confirm", &body)));
                    helpers.push((r, None));
                }
            }
        }
        self.confirm.pending.insert(key, Pending { id, deadline, own, helpers, wait });
        self.settle_confirmation(key, false);
    }

    /// A check's result from the driver: ours as a judge, or one we run for our parent.
    pub(crate) fn on_node_checked(&mut self, token: u64, answered: Option<bool>) {
        let outcome = match answered {
            Some(true) => Outcome::Answered,
            Some(false) => Outcome::Silent,
            None => Outcome::Untried,
        };
        if let Some(id) = self.confirm.helping.remove(&token) {
            let body = json!({"id": id, "answered": answered});
            if self.parent_up {
                self.effect(Effect::Send(Peer::Parent, Message::control("confirmed", &body)));
            }
            return;
        }
        let Some(key) = self.confirm.pending.iter().find(|(_, p)| p.id == token).map(|(k, _)| *k) else { return };
        if let Some(p) = self.confirm.pending.get_mut(&key) {
            p.own = Some(outcome);
        }
        self.settle_confirmation(key, false);
    }

    /// `confirm` from our parent: `{"id", "node", "port", "wait_ms"}`. Bad input is ignored.
    pub(crate) fn on_confirm_request(&mut self, body: &Value) {
        let Some(id) = body.get("id").and_then(Value::as_u64) else { return };
        let Some(node) = body.get("node").and_then(Value::as_str).filter(|n| n.len() <= 256) else { return };
        let port = body.get("port").and_then(Value::as_u64).and_then(|p| u16::try_from(p).ok());
        let wait = body.get("wait_ms").and_then(Value::as_u64).unwrap_or(0) as f64 / 1e3;
        let wait = Duration::from_secs_f64(wait.clamp(CHECK_WAIT_MIN, CHECK_WAIT_MAX));
        if self.confirm.helping.len() >= MAX_HELPING {
            let body = json!({"id": id, "answered": Value::Null});
            self.effect(Effect::Send(Peer::Parent, Message::control("confirmed", &body)));
            return;
        }
        self.confirm.next_id += 1;
        let token = self.confirm.next_id;
        self.confirm.helping.insert(token, id);
        let target = CheckTarget::Node { node: node.to_string(), port };
        self.effect(Effect::CheckNode { token, target, wait });
    }

    /// `confirmed` from child `from`: `{"id", "answered": true | false | null}`. Bad input is ignored.
    pub(crate) fn on_confirm_answer(&mut self, from: u32, body: &Value) {
        let Some(id) = body.get("id").and_then(Value::as_u64) else { return };
        let outcome = match body.get("answered") {
            Some(Value::Bool(true)) => Outcome::Answered,
            Some(Value::Bool(false)) => Outcome::Silent,
            _ => Outcome::Untried,
        };
        let Some(key) = self.confirm.pending.iter().find(|(_, p)| p.id == id).map(|(k, _)| *k) else { return };
        if let Some(p) = self.confirm.pending.get_mut(&key) {
            if let Some(slot) = p.helpers.iter_mut().find(|(r, o)| *r == from && o.is_none()) {
                slot.1 = Some(outcome);
            }
        }
        self.settle_confirmation(key, false);
    }

    /// Confirmations whose bound passed are decided with what came.
    pub(crate) fn expire_confirmations(&mut self) {
        let due: Vec<u32> =
            self.confirm.pending.iter().filter(|(_, p)| p.deadline <= self.now).map(|(k, _)| *k).collect();
        for key in due {
            self.settle_confirmation(key, true);
        }
    }

    /// Decide suspect `key`'s confirmation if its paths allow (or `expired`): any answer clears it; no path left
    /// that could answer (or the bound passed) makes it lost.
    fn settle_confirmation(&mut self, key: u32, expired: bool) {
        let Some(p) = self.confirm.pending.get(&key) else { return };
        let outcomes = std::iter::once(p.own).chain(p.helpers.iter().map(|(_, o)| *o));
        let answered = outcomes.clone().any(|o| o == Some(Outcome::Answered));
        let done = outcomes.clone().all(|o| o.is_some());
        if !answered && !done && !expired {
            return;
        }
        let Some(p) = self.confirm.pending.remove(&key) else { return };
        let now = self.clock();
        let who = if key == PARENT { "parent".to_string() } else { format!("child rank {key}") };
        if answered {
            self.confirm.cleared += 1;
            let by = match p.own {
                Some(Outcome::Answered) => "this broker's check".to_string(),
                _ => {
                    let r = p.helpers.iter().find(|(_, o)| *o == Some(Outcome::Answered)).map_or(0, |(r, _)| *r);
                    format!("rank {r}'s check")
                }
            };
            info!("{who}: its data waited for TCP acknowledgement, but its node's kernel answered {by}: not lost");
            let t = self.membership.confirmed(now, key, true, "");
            self.apply_transitions(t);
            return;
        }
        let say = |o: Option<Outcome>| match o {
            Some(Outcome::Silent) => "no answer",
            Some(Outcome::Untried) => "could not check",
            Some(Outcome::Answered) => "answered",
            None => "no report in time",
        };
        let mut parts = vec![format!("this broker's check: {}", say(p.own))];
        parts.extend(p.helpers.iter().map(|(r, o)| format!("rank {r}'s: {}", say(*o))));
        let tried =
            std::iter::once(p.own).chain(p.helpers.iter().map(|(_, o)| *o)).any(|o| o != Some(Outcome::Untried));
        let rule = if !tried {
            "no path could confirm it (no address known for its node, no other child to ask)".to_string()
        } else if key == PARENT {
            format!(
                "its node's kernel did not answer within {} ms ({}; a parent is confirmed by its child's own check \
                 alone)",
                p.wait.as_millis(),
                parts.join(", ")
            )
        } else if p.helpers.is_empty() {
            format!(
                "its node's kernel did not answer within {} ms ({}; no other child to ask)",
                p.wait.as_millis(),
                parts.join(", ")
            )
        } else {
            format!("its node's kernel answered no path within {} ms ({})", p.wait.as_millis(), parts.join(", "))
        };
        let t = self.membership.confirmed(now, key, false, &rule);
        if t.iter().any(|t| t.to == PeerState::Lost) {
            self.confirm.confirmed_lost += 1;
        }
        self.apply_transitions(t);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lateness_factor_grows_and_decays() {
        let mut c = Confirmations::default();
        assert_eq!(c.factor(), 1.0);
        c.score = 3;
        assert_eq!(c.factor(), 4.0);
        assert!(c.status()["state"].as_str().unwrap().starts_with("degraded"));
        c.score = 0;
        assert_eq!(c.status()["state"], "on time");
    }
}
