//! Routing rules: requests go up or down the TBON by their `nodeid` (RFC 3 style route stacks), responses
//! retrace their request's route, events flow down from rank 0, and the broker's own requests come back to it.
//! Every request to a rank that cannot be reached gets an error response, never silence: one in flight through a
//! child that is lost gets EHOSTUNREACH from this broker, and so does one this broker sent up to a parent that is
//! lost (its new parent, if it re-parents, never saw it: `reparent.rs`).

use super::core::{Broker, Effect, Internal, Peer, PARENT, SELF};
use crate::message::{
    errno, Message, MsgType, FLAG_NORESPONSE, FLAG_STREAMING, NODEID_ANY, NODEID_UPSTREAM, ROUTE_LOCAL,
};
use crate::topology::Hop;
use serde_json::{json, Value};
use tracing::{debug, warn};

impl Broker {
    /// Whether the link to `peer` is up, as far as this broker knows.
    pub fn connected(&self, peer: Peer) -> bool {
        match peer {
            Peer::Parent => self.parent_up,
            Peer::Child(r) => self.children.contains_key(&r),
            Peer::Local(id) => self.locals.contains_key(&id),
        }
    }

    /// Send `msg` to `peer` if it is connected; gives it back otherwise.
    pub fn try_send(&mut self, peer: Peer, msg: Message) -> Result<(), Message> {
        if self.connected(peer) {
            self.effect(Effect::Send(peer, msg));
            Ok(())
        } else {
            Err(msg)
        }
    }

    /// A message from a link or a local client.
    pub fn on_message(&mut self, from: Peer, mut msg: Message) {
        if let Peer::Local(_) = from {
            // Clients only send requests, and never choose their own route: a forged route stack could
            // otherwise steer responses to other peers.
            if msg.msgtype != MsgType::Request {
                debug!("dropping {:?} '{}' from local client", msg.msgtype, msg.topic);
                return;
            }
            msg.route.clear();
        }
        match msg.msgtype {
            MsgType::Request => self.route_request(from, msg),
            MsgType::Response => {
                match from {
                    Peer::Child(c) => self.answered(c, &msg),
                    Peer::Parent => self.answered(PARENT, &msg),
                    Peer::Local(_) => {}
                }
                self.route_response(msg)
            }
            MsgType::Event => {
                if from == Peer::Parent {
                    self.deliver_event(msg);
                } else {
                    warn!("dropping event '{}' from {from:?}: events flow down from rank 0 only", msg.topic);
                }
            }
            MsgType::Control => self.on_control(from, msg),
        }
    }

    /// A request the driver could not send: the link closed before this broker heard of it.
    pub fn on_bounced(&mut self, peer: Peer, msg: Message) {
        if msg.msgtype != MsgType::Request {
            return;
        }
        let towards = match peer {
            Peer::Child(c) => Some(c),
            Peer::Parent => Some(PARENT),
            Peer::Local(_) => None,
        };
        if let Some(m) = towards.and_then(|c| self.inflight.get_mut(&c)) {
            // Answered here: no longer in flight.
            m.remove(&(msg.matchtag, route_key(&msg.route)));
        }
        let why = match peer {
            Peer::Child(c) if msg.nodeid == c => format!("rank {c} is not connected"),
            Peer::Child(c) => {
                format!("rank {} is unreachable: its route goes through rank {c}, which is not connected", msg.nodeid)
            }
            Peer::Parent => "parent not connected".into(),
            Peer::Local(_) => return,
        };
        self.respond_error(&msg, errno::EHOSTUNREACH, &why);
    }

    /// Route a request: stamp the route, deliver locally or forward towards `nodeid`.
    pub fn route_request(&mut self, from: Peer, mut msg: Message) {
        let size = self.opts.size;
        match from {
            Peer::Local(id) => {
                if id != u32::MAX {
                    msg.userid = self.locals.get(&id).map(|c| c.uid).unwrap_or(u32::MAX);
                    msg.route.push(ROUTE_LOCAL | id);
                } else {
                    msg.userid = self.env.uid;
                }
                if msg.nodeid == NODEID_UPSTREAM {
                    match self.parent {
                        Some(p) => msg.nodeid = p,
                        None if self.rank() != 0 => {
                            return self.respond_error(&msg, errno::EHOSTUNREACH, "parent lost; re-parenting")
                        }
                        None => return self.respond_error(&msg, errno::EHOSTUNREACH, "rank 0 has no upstream"),
                    }
                }
            }
            Peer::Child(r) => {
                msg.route.push(r);
                if msg.topic == "overlay.reparent" {
                    // On its way to rank 0: learn the new shape now, before rank 0's event comes down.
                    let body = msg.json();
                    self.on_reparent_request(&body);
                }
            }
            Peer::Parent => msg.route.push(self.parent.unwrap_or(0)),
        }
        // The userid was set by the broker whose local connector checked the caller (SO_PEERCRED). A personal
        // instance admits only the owner there: a request from a peer carrying any other userid did not come from
        // a checked caller. A multi-user instance admits every user, and trusts the userid a peer broker stamped
        // as far as it trusts the peer, an overlay member holding the key (docs/security.md: what a compromised
        // broker can do).
        if !matches!(from, Peer::Local(_)) && msg.userid != self.env.uid && !self.opts.config.allow_guest_users {
            warn!("refusing '{}' from {from:?}: userid {} is not the instance owner's", msg.topic, msg.userid);
            return self.respond_error(
                &msg,
                errno::EPERM,
                &format!("userid {} may not use this instance: it has a single owner", msg.userid),
            );
        }
        if msg.route.len() > crate::message::MAX_ROUTE {
            return self.respond_error(&msg, errno::EPROTO, "route too deep");
        }
        let local = super::services::offers(self.rank(), msg.topic.split('.').next().unwrap_or(""));
        let hop = if msg.nodeid == NODEID_ANY {
            if local {
                Hop::Local
            } else {
                Hop::Parent
            }
        } else if msg.nodeid >= size {
            return self.respond_error(
                &msg,
                errno::EHOSTUNREACH,
                &format!("no such rank {} (size {size})", msg.nodeid),
            );
        } else {
            self.next_hop(msg.nodeid)
        };
        match hop {
            Hop::Local => super::services::dispatch(self, msg),
            Hop::Child(c) => {
                // A closed link gives the message back for the error response.
                if !self.connected(Peer::Child(c)) {
                    return self.on_bounced(Peer::Child(c), msg);
                }
                self.forwarded(c, &msg);
                self.effect(Effect::Send(Peer::Child(c), msg));
            }
            Hop::Parent => {
                if !self.parent_up {
                    let Err(msg) = self.queue_up(msg) else { return };
                    let e = if msg.nodeid == NODEID_ANY { errno::ENOSYS } else { errno::EHOSTUNREACH };
                    let why = if e == errno::ENOSYS {
                        format!("no service offers '{}'", msg.topic)
                    } else {
                        "parent not connected".into()
                    };
                    return self.respond_error(&msg, e, &why);
                }
                self.send_up(msg);
            }
        }
    }

    /// Send a request to the parent, remembered until its (last) response comes back, so that if the parent is
    /// lost first its sender gets an error, not silence ([`Broker::fail_sent_up`]).
    pub fn send_up(&mut self, msg: Message) {
        if msg.msgtype == MsgType::Request {
            self.forwarded(PARENT, &msg);
        }
        self.effect(Effect::Send(Peer::Parent, msg));
    }

    /// A request goes down to child `c` (or up, `c` = [`PARENT`]): remembered until its (last) response comes
    /// back, so that if `c` is lost first its sender gets an error, not silence.
    fn forwarded(&mut self, c: u32, msg: &Message) {
        if msg.flags & FLAG_NORESPONSE != 0 {
            return;
        }
        let stub = Message {
            msgtype: MsgType::Request,
            flags: msg.flags,
            topic: msg.topic.clone(),
            nodeid: msg.nodeid,
            matchtag: msg.matchtag,
            route: msg.route.clone(),
            ..Message::request_json("", 0, Vec::new())
        };
        self.inflight.entry(c).or_default().insert((msg.matchtag, route_key(&msg.route)), stub);
    }

    /// A response from child `c` (or the parent, `c` = [`PARENT`]): its request is no longer in flight there (a
    /// streaming one once it ends).
    fn answered(&mut self, c: u32, resp: &Message) {
        self.answered_route(c, resp.matchtag, &resp.route, resp.errnum);
    }

    /// [`Broker::answered`] for a response known by its `matchtag`, `route` (as it reaches this broker) and
    /// `errnum` (an answer that comes down the tree in another form: `pmi_down.rs`).
    pub(super) fn answered_route(&mut self, c: u32, matchtag: u32, route: &[u32], errnum: u32) {
        let Some(m) = self.inflight.get_mut(&c) else { return };
        let key = (matchtag, route_key(route));
        if m.get(&key).is_some_and(|req| req.flags & FLAG_STREAMING == 0 || errnum != 0) {
            m.remove(&key);
        }
    }

    /// The parent (rank `lost`) is gone: every request sent up through it and not answered gets EHOSTUNREACH.
    /// Whether it reached its target cannot be known, so it is not sent again on the sender's behalf: a job shell
    /// sends its output again itself; the broker's own shell exit reports are kept and sent again after a
    /// re-parent (`reparent.rs`).
    pub fn fail_sent_up(&mut self, lost: u32) {
        let Some(m) = self.inflight.remove(&PARENT) else { return };
        let mut reqs: Vec<Message> = m.into_values().collect();
        reqs.sort_by_key(|r| (r.matchtag, r.route.clone()));
        for req in reqs {
            let e = format!("rank {lost}, the parent it went up through, was lost with this request in flight");
            self.respond_error(&req, errno::EHOSTUNREACH, &e);
        }
    }

    /// Child `c` is gone: every request still in flight through it gets EHOSTUNREACH.
    pub fn fail_inflight(&mut self, c: u32) {
        let Some(m) = self.inflight.remove(&c) else { return };
        let mut reqs: Vec<Message> = m.into_values().collect();
        reqs.sort_by_key(|r| (r.matchtag, r.route.clone()));
        for req in reqs {
            // Why the rank was lost is rank 0's record (`vigil overlay status`; the CLI adds it): not repeated here.
            let e = if req.nodeid == c {
                format!("rank {c} was lost with this request in flight")
            } else {
                format!("rank {} is unreachable: its route went through rank {c}, which was lost", req.nodeid)
            };
            self.respond_error(&req, errno::EHOSTUNREACH, &e);
        }
    }

    /// Route a response back along its route stack.
    pub fn route_response(&mut self, mut msg: Message) {
        match msg.route.pop() {
            None => self.internal_response(msg),
            Some(e) if e & ROUTE_LOCAL != 0 => {
                let id = e & !ROUTE_LOCAL;
                let _ = self.try_send(Peer::Local(id), msg);
            }
            Some(r) => {
                let peer = if Some(r) == self.parent { Peer::Parent } else { Peer::Child(r) };
                // A response for a parent lost meanwhile is dropped: its request's sender was answered with
                // EHOSTUNREACH by the lost parent's own parent.
                if self.try_send(peer, msg).is_err() {
                    debug!("dropping response: {peer:?} gone");
                }
            }
        }
    }

    pub fn respond(&mut self, req: &Message, payload: &impl serde::Serialize) {
        if req.flags & FLAG_NORESPONSE != 0 {
            return;
        }
        let r = Message::response_to(req, payload);
        self.route_response(r);
    }

    /// Answer `req` with `payload` (JSON bytes), moving the request into its response.
    pub fn respond_with(&mut self, req: Message, payload: Vec<u8>) {
        if req.flags & FLAG_NORESPONSE != 0 {
            return;
        }
        let r = req.into_response(payload);
        self.route_response(r);
    }

    pub fn respond_error(&mut self, req: &Message, errnum: u32, errstr: &str) {
        if req.flags & FLAG_NORESPONSE != 0 {
            if errnum != errno::ENODATA {
                debug!("request '{}' failed: {errstr}", req.topic);
            }
            return;
        }
        let r = Message::error_to(req, errnum, errstr);
        self.route_response(r);
    }

    /// Send a request from the broker itself; its response comes back to [`Broker::internal_response`].
    pub fn internal_request(&mut self, topic: &str, nodeid: u32, payload: &Value, purpose: Internal) {
        self.internal_request_msg(Message::request(topic, nodeid, payload), purpose)
    }

    /// [`Broker::internal_request`] with a message built by the caller.
    pub fn internal_request_msg(&mut self, mut m: Message, purpose: Internal) {
        let tag = self.next_tag;
        self.next_tag = self.next_tag.wrapping_add(1).max(1);
        m.matchtag = tag;
        self.internal.insert(tag, purpose);
        self.route_request(SELF, m);
    }

    fn internal_response(&mut self, msg: Message) {
        let Some(purpose) = self.internal.remove(&msg.matchtag) else { return };
        match purpose {
            Internal::Spawn { id, rank } => {
                let r = if msg.errnum == 0 {
                    Ok(())
                } else {
                    Err(msg.errstr().unwrap_or_else(|| crate::message::errno_str(msg.errnum).into()))
                };
                let now = self.wall();
                if let Some(jc) = self.jobcore.as_mut() {
                    jc.shell_spawned(now, id, rank, r);
                }
            }
            Internal::Ignore => {}
            Internal::Kill { id, rank, signal, path } => {
                if msg.errnum == errno::EHOSTUNREACH {
                    self.kill_unreachable(id, rank, signal, &path);
                }
            }
            Internal::ShellExit => {
                // An error (no route meanwhile) keeps it for the next parent.
                if msg.errnum == 0 {
                    self.exit_reports.remove(&msg.matchtag);
                }
            }
            Internal::Rtt { run, sent } => {
                let now = self.now;
                let Some(r) = self.rtt_runs.get_mut(&run) else { return };
                r.inflight -= 1;
                if msg.errnum != 0 {
                    let e = msg.errstr().unwrap_or_else(|| crate::message::errno_str(msg.errnum).into());
                    if let Some(r) = self.rtt_runs.remove(&run) {
                        self.respond_error(&r.req, msg.errnum, &e);
                    }
                    return;
                }
                r.samples_us.push(now.since(sent).as_secs_f64() * 1e6);
                self.rtt_next(run);
            }
        }
    }

    /// Fill RTT run `id`'s window, or answer the client with the samples (µs) and the elapsed time (s) when done.
    pub fn rtt_next(&mut self, id: u64) {
        loop {
            let now = self.now;
            let Some(r) = self.rtt_runs.get_mut(&id) else { return };
            if r.left == 0 {
                if r.inflight == 0 {
                    let r = self.rtt_runs.remove(&id).expect("present");
                    let elapsed = now.since(r.started).as_secs_f64();
                    self.respond(
                        &r.req,
                        &json!({"target": r.target, "samples_us": r.samples_us, "elapsed_s": elapsed}),
                    );
                }
                return;
            }
            if r.inflight >= r.window {
                return;
            }
            r.left -= 1;
            r.inflight += 1;
            let m = Message::request_json("broker.ping", r.target, r.payload.clone());
            self.internal_request_msg(m, Internal::Rtt { run: id, sent: now });
        }
    }

    /// Publish an event (rank 0 only): sequence it and send it down the tree.
    pub fn publish(&mut self, topic: &str, payload: &Value) {
        if self.rank() != 0 {
            let mut m = Message::request("broker.pub", 0, &json!({"topic": topic, "payload": payload}));
            m.flags = FLAG_NORESPONSE;
            return self.route_request(SELF, m);
        }
        self.event_seq += 1;
        let mut m = Message::event(topic, payload);
        m.seq = self.event_seq;
        self.deliver_event(m);
    }

    /// An event: down to every child, and to the local clients subscribed to its topic.
    pub fn deliver_event(&mut self, msg: Message) {
        if msg.topic == "overlay.reparent" {
            let body = msg.json();
            self.on_reparent_event(&body);
        } else if msg.topic == "overlay.lost" {
            let body = msg.json();
            self.on_lost_event(&body);
        }
        let children: Vec<u32> = self.children.keys().copied().collect();
        for r in children {
            self.effect(Effect::Send(Peer::Child(r), msg.clone()));
        }
        self.deliver_local_event(&msg);
    }

    /// An event to the local clients subscribed to its topic (a prefix).
    pub fn deliver_local_event(&mut self, msg: &Message) {
        let mut to: Vec<u32> = self
            .locals
            .iter()
            .filter(|(_, c)| c.subs.iter().any(|s| msg.topic.starts_with(s.as_str())))
            .map(|(id, _)| *id)
            .collect();
        to.sort_unstable();
        for id in to {
            self.effect(Effect::Send(Peer::Local(id), msg.clone()));
        }
    }
}

/// A request's route stack folded into one number (with its matchtag, the key of a request in flight).
fn route_key(route: &[u32]) -> u64 {
    route.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &r| (h ^ u64::from(r)).wrapping_mul(0x100_0000_01b3))
}
