//! Liveness rules of the overlay: who may join as a child (the hello), heartbeats, the verdicts of the link
//! membership machine ([`crate::membership`]) and what they mean: a lost child's whole subtree is reported lost
//! to rank 0, a torpid one gets no new work, a lost parent makes this broker re-parent (`reparent.rs`), wait for
//! rank 0 (`rejoin.rs`) or end, a child that said goodbye is offline, not lost.

use super::core::{Broker, Effect, Peer, PARENT, SELF};
use super::reparent::Refusal;
use crate::idset::IdSet;
use crate::membership::{PeerState, Signal, Transition};
use crate::message::{Message, FLAG_NORESPONSE, WIRE_VERSION};
use crate::topology::Topology;
use serde_json::{json, Value};
use std::time::Duration;
use tracing::{debug, error, info, warn};

/// The payload of the `hello` a broker of rank `rank` sends its parent (docs/wire-format.md): who it is and the
/// tree it believes it is in (`size` brokers shaped by `topo`), so that a parent refuses a child configured for
/// another tree rather than route for it by a different map. A driver adds its link's own fields (`probe_port`,
/// the RDMA offer).
pub fn hello_payload(rank: u32, instance: &str, size: u32, topo: &Topology, hostname: &str) -> Value {
    json!({"rank": rank, "instance": instance, "version": WIRE_VERSION, "size": size, "topo": topo.to_string(),
        "hostname": hostname})
}

/// At most this many characters of a string a peer sent are quoted in a refusal or a log line.
const QUOTE_MAX: usize = 32;

/// `s`, cut to [`QUOTE_MAX`] characters (marked with "..." when cut), for quoting what a peer sent.
fn quote(s: &str) -> String {
    let mut q: String = s.chars().take(QUOTE_MAX).collect();
    if q.len() < s.len() {
        q.push_str("...");
    }
    q
}

impl Broker {
    /// A would-be child's hello on authenticated link `conn` from `addr` (see `docs/wire-format.md`): accepted
    /// ([`Effect::AcceptChild`]) or refused with the reason ([`Effect::RefuseChild`]), never anything else.
    pub fn on_hello(&mut self, conn: u64, msg: Message, addr: &str, refusal: Option<String>) {
        match self.judge_hello(conn, &msg).and_then(|rank| refusal.map_or(Ok(rank), |why| Err(why.into()))) {
            Ok(rank) => {
                if self.adopts_past_limit(rank) {
                    // Rank 0's last resort (reparent.rs): once per adoption, since it costs rank 0 load.
                    let (topo, size) = self.tree();
                    warn!(
                        "adopting rank {rank} past this broker's limit of {} children (it has {}): every live \
                         candidate refused it for capacity, and a live node cut off would lose its jobs (last resort)",
                        super::reparent::adopt_limit(topo, size, self.rank()),
                        self.children.len()
                    );
                }
                self.effect(Effect::AcceptChild { conn, rank });
                self.children.insert(rank, conn);
                let hello = msg.json();
                self.note_child_address(rank, addr, &hello);
                // Back (restarted): a verdict of ours on it not yet announced is stale.
                self.lost_reports.remove(&rank);
                let (topo, size) = self.tree();
                if topo.parent(size, rank) != Some(self.rank()) {
                    info!("adopted rank {rank} (its parent was lost)");
                    self.learn_parent(rank, self.rank());
                } else if self.adopted.contains_key(&rank) {
                    self.learn_parent(rank, self.rank());
                }
                let now = self.clock();
                self.membership.signal(now, rank, Signal::Connected);
                if hello.get("adopt").is_some() {
                    // An orphan re-parenting: a replacement link, judged at once (membership::LINK_SETTLE).
                    self.membership.settled(rank);
                }
                debug!("child rank {rank} connected from {addr}");
                // A broker that joins late (a router that returns, an orphan) learns the re-parents it missed,
                // so that it routes by the current tree: its static children may have parents of their own now.
                if !self.adopted.is_empty() {
                    let pairs: Vec<[u32; 2]> = self.adopted.iter().map(|(r, p)| [*r, *p]).collect();
                    self.effect(Effect::Send(Peer::Child(rank), Message::control("adopted", &json!(pairs))));
                }
                // And the losses announced while it had no parent, so that it asks those ranks last if it must
                // re-parent (again): each dead candidate would cost it a whole candidate timeout.
                if !self.known_lost.is_empty() {
                    let ranks = IdSet::from_iter(self.known_lost.iter().copied()).to_string();
                    self.effect(Effect::Send(Peer::Child(rank), Message::control("lost", &json!({"ranks": ranks}))));
                }
                // Rank 0 tells its children how long to wait for it should it go (rejoin.rs).
                if self.rank() == 0 {
                    let grace = json!({"parent_grace": self.parent_grace()});
                    self.effect(Effect::Send(Peer::Child(rank), Message::control("grace", &grace)));
                }
            }
            Err(Refusal { why, full }) => {
                warn!("refusing overlay peer {addr}: {why}");
                self.effect(Effect::RefuseChild { conn, why, full });
            }
        }
    }

    /// The rank a hello on link `conn` may join as, or why not. Every field is checked for its type and range
    /// before it is used, and a refusal quotes at most [`QUOTE_MAX`] characters of what the peer sent, so a
    /// hello cannot make this broker panic or hold more than the fixed state of one child:
    /// - `rank` (required): a `u32` below the instance size, a child of this broker (or an orphan it may adopt:
    ///   `adopt`, see `reparent.rs`), not already connected;
    /// - `instance` (required): this instance's id (the handshake's prologue already binds it; never echoed);
    /// - `version` (optional, as the frames carry it too): [`WIRE_VERSION`];
    /// - `size`, `topo` (optional, for older children): this instance's, else the child computes another tree;
    /// - `adopt` (optional): present in an orphan's hello (`reparent.rs`); `last_resort` (optional, `false` when
    ///   absent): `true` or `false`, honoured by rank 0 alone ([`super::reparent::LAST_RESORT`]);
    /// - `hostname`, `probe_port` and the RDMA offer are not read here (the driver reads the last two, each
    ///   checked by type and range there).
    ///
    /// A refusal for capacity alone is marked [`Refusal::full`].
    ///
    /// A link is judged once: a second hello on a link already accepted is refused (the driver only hands in a
    /// link's first message as a hello, but a broker does not rely on that to keep one rank per link).
    fn judge_hello(&self, conn: u64, msg: &Message) -> Result<u32, Refusal> {
        let (rank, v) = self.check_hello(conn, msg)?;
        // An orphan, even one of our own static children coming back after its adopter was lost, joins within
        // the adoption bound (reparent.rs).
        if let Some(why) = self.adoption_refusal(rank, &v) {
            return Err(why);
        }
        if self.shutting_down.is_some() {
            return Err("broker is shutting down".into());
        }
        if self.children.contains_key(&rank) {
            return Err(format!("rank {rank} is already connected").into());
        }
        Ok(rank)
    }

    /// The fields of a hello on link `conn` ([`Broker::judge_hello`]): its rank and its payload, or why not.
    fn check_hello(&self, conn: u64, msg: &Message) -> Result<(u32, Value), String> {
        if let Some((r, _)) = self.children.iter().find(|(_, c)| **c == conn) {
            return Err(format!("this link already joined as rank {r}"));
        }
        let v: Value = msg.decode().map_err(|_| "hello payload is not JSON".to_string())?;
        if !v.is_object() {
            return Err("hello payload is not a JSON object".into());
        }
        let (topo, size) = self.tree();
        let rank = match v.get("rank") {
            None | Some(Value::Null) => return Err("hello without a rank".into()),
            Some(r) => r
                .as_u64()
                .and_then(|r| u32::try_from(r).ok())
                .ok_or("hello's 'rank' must be an integer 0..=4294967295")?,
        };
        match v.get("instance").and_then(Value::as_str) {
            None => return Err(format!("hello of rank {rank} without an instance id")),
            // Unreachable with the handshake's prologue, which binds the instance id; never echo ids.
            Some(inst) if inst != self.opts.instance => return Err(format!("rank {rank} belongs to another instance")),
            Some(_) => {}
        }
        if let Some(ver) = v.get("version") {
            if ver.as_u64() != Some(u64::from(WIRE_VERSION)) {
                let shown = quote(&ver.to_string());
                return Err(format!("rank {rank} speaks wire version {shown}; this broker speaks {WIRE_VERSION}"));
            }
        }
        if let Some(s) = v.get("size") {
            if s.as_u64() != Some(u64::from(size)) {
                return Err(format!(
                    "rank {rank} counts {} brokers in this instance; this broker counts {size} \
                     (their configurations differ)",
                    quote(&s.to_string())
                ));
            }
        }
        if let Some(t) = v.get("topo") {
            let ours = topo.to_string();
            match t.as_str() {
                Some(theirs) if theirs == ours => {}
                Some(theirs) => {
                    return Err(format!(
                        "rank {rank} has tbon.topo={}; this broker has {ours} (their configurations differ)",
                        quote(theirs)
                    ))
                }
                None => return Err(format!("hello of rank {rank}: 'topo' must be a string")),
            }
        }
        if rank >= size {
            return Err(format!("rank {rank} is not in this instance of {size} brokers"));
        }
        if v.get(super::reparent::LAST_RESORT).is_some_and(|l| !l.is_boolean()) {
            return Err(format!("hello of rank {rank}: '{}' must be true or false", super::reparent::LAST_RESORT));
        }
        if topo.parent(size, rank) != Some(self.rank()) && v.get("adopt").is_none() {
            // Not ours in the tree: only an orphan asking to be adopted may join (reparent.rs).
            return Err(format!("rank {rank} is not a child of rank {}", self.rank()));
        }
        Ok((rank, v))
    }

    /// Control messages: `shutdown` and `adopted` (the re-parents it knows of) from the parent, `goodbye` from a
    /// child, heartbeats.
    pub fn on_control(&mut self, from: Peer, msg: Message) {
        match (from, msg.topic.as_str()) {
            (Peer::Parent, "shutdown") => {
                let body = msg.json();
                let orphan = body.get("orphan").and_then(Value::as_bool).unwrap_or(false);
                let restart = body.get("restart").and_then(Value::as_bool).unwrap_or(false);
                if restart && self.parent == Some(0) && self.shutting_down.is_none() {
                    // Rank 0 stops to be restarted on its state directory: wait for it as for a lost rank 0.
                    self.parent_up = false;
                    self.effect(Effect::DropLink(Peer::Parent, 0));
                    self.fail_sent_up(0);
                    if self.wait_for_rank0("it stopped for a restart") {
                        return;
                    }
                }
                if orphan && self.shutting_down.is_none() {
                    // It exits because it lost its own parent: we re-parent (reparent.rs) rather than go with it.
                    self.parent_up = false;
                    self.effect(Effect::DropLink(Peer::Parent, 0));
                    let reason = body.get("reason").and_then(Value::as_str).unwrap_or("?").chars().take(80);
                    let why = format!("it stops ({})", reason.collect::<String>());
                    if self.start_reparent(&why) {
                        return;
                    }
                }
                self.begin_shutdown("parent is shutting down")
            }
            (_, "hb") => {}
            // Rank 0 restarted and our parent rejoined it (rejoin.rs).
            (Peer::Parent, "rejoin") => self.on_rejoin(),
            // {"ranks": idset}: ranks rank 0 announced lost (bad input is ignored, as for the event).
            (Peer::Parent, "lost") => self.on_lost_event(&msg.json()),
            // {"parent_grace": seconds}: rank 0's grace (bad input is ignored: our own setting stands).
            (Peer::Parent, "grace") if self.parent == Some(0) => {
                let g = msg.json().get("parent_grace").and_then(Value::as_f64).filter(|g| g.is_finite());
                if let Some(g) = g.map(|g| g.clamp(0.0, 1e7)) {
                    if self.rank0_grace != Some(g) && self.opts.config.parent_grace_set.is_none() {
                        info!("rank 0's tbon.parent_grace is {g:.0} s: this broker waits that long for it");
                    }
                    self.rank0_grace = Some(g);
                }
            }
            (Peer::Parent, "adopted") => {
                // [[rank, parent], ...]; entries that are not two ranks of this instance are skipped.
                let size = self.opts.size;
                let pairs = msg.json().as_array().cloned().unwrap_or_default();
                let mut bad = 0;
                for p in pairs {
                    let pair = p.as_array().filter(|a| a.len() == 2);
                    let r = |i: usize| pair?.get(i)?.as_u64().and_then(|v| u32::try_from(v).ok());
                    match (r(0), r(1)) {
                        (Some(rank), Some(parent)) if rank < size && parent < size && rank != parent => {
                            self.learn_parent(rank, parent)
                        }
                        _ => bad += 1,
                    }
                }
                if bad > 0 {
                    warn!("parent's list of re-parented ranks: {bad} entries skipped (not two ranks of this instance)");
                }
            }
            // Check a sibling's node for our parent, which suspects it (confirm.rs).
            (Peer::Parent, "confirm") => self.on_confirm_request(&msg.json()),
            (Peer::Child(r), "confirmed") => self.on_confirm_answer(r, &msg.json()),
            (Peer::Child(r), "goodbye") => {
                self.goodbye.insert(r);
                // It is leaving: its responder stops answering before its connection closes.
                self.effect(Effect::ForgetChild(r));
            }
            (_, t) => debug!("ignoring control '{t}' from {from:?}"),
        }
    }

    /// Send heartbeats to every peer, after sampling each link's kernel ACK state.
    fn heartbeat(&mut self) {
        // Sampled before sending: what is outstanding then was sent at least a moment ago, not just now.
        self.effect(Effect::Heartbeat);
        let hb = Message::control("hb", &json!({}));
        if self.parent_up {
            self.effect(Effect::Send(Peer::Parent, hb.clone()));
        }
        let children: Vec<u32> = self.children.keys().copied().collect();
        for r in children {
            self.effect(Effect::Send(Peer::Child(r), hb.clone()));
        }
        let period = Duration::from_secs_f64(self.membership.config().heartbeat_period);
        self.next_heartbeat = self.now + period;
    }

    /// The deadline passed: time limits and kill escalation, heartbeats, liveness verdicts.
    pub fn on_timer(&mut self) {
        let wall = self.wall();
        if let Some(jc) = self.jobcore.as_mut() {
            jc.handle_timeout(wall);
        }
        // Running this late means we were stopped or starved: our peers' traffic is queued, unread. Restart the
        // silence clocks rather than declare everyone torpid (or lost) for our own stall.
        let late = self.now.since(self.next_heartbeat).as_secs_f64();
        if self.shutting_down.is_none()
            && self.now >= self.next_heartbeat
            && (self.parent_up || !self.children.is_empty())
        {
            self.judge_lateness(self.now.since(self.next_heartbeat));
        }
        if late > self.membership.config().torpid_max {
            info!("this broker ran {:.0} ms late (stopped or starved); not judging peers on that gap", late * 1e3);
            self.membership.grace(self.clock(), late);
        }
        let mut sampled = false;
        if self.orphan_deadline().is_some_and(|d| d <= self.now) {
            self.expire_orphans();
        }
        if self.rank0_deadline().is_some_and(|d| d <= self.now) {
            self.rank0_timer();
        }
        if self.confirm.next_deadline().is_some_and(|d| d <= self.now) {
            self.expire_confirmations();
        }
        if self.lingering.next_deadline().is_some_and(|d| d <= self.now) {
            self.expire_lingering();
        }
        if self.shutting_down.is_none() && self.now >= self.next_heartbeat {
            self.heartbeat();
            sampled = true;
        }
        if self.shutting_down.is_none() && self.now >= self.next_beat {
            // A heartbeat beats too: no second beat in the same pass.
            if !sampled {
                self.effect(Effect::Beat);
            }
            let c = self.membership.config();
            let every = c.stall_max / crate::membership::BEATS_PER_STALL;
            self.next_beat = self.now + Duration::from_secs_f64(every.max(0.001));
        }
        // Data left unacknowledged for tbon.lost_timeout is judged on a sample taken now, never on the last one
        // (which may predate a stall of ours): the heartbeat just took one, or we ask for one.
        if self.membership.take_ack_check(self.clock()) && !sampled {
            self.effect(Effect::SampleAcks);
        }
        let t = self.membership.tick(self.clock());
        self.apply_transitions(t);
    }

    /// Act on liveness verdicts: lost children (and their subtrees) are reported to rank 0 and dropped; torpid
    /// and lively ones are reported so rank 0 stops (or resumes) placing work there; a lost parent ends us.
    pub fn apply_transitions(&mut self, ts: Vec<Transition>) {
        for t in ts {
            if t.rank == PARENT {
                match t.to {
                    PeerState::Lost if self.shutting_down.is_none() => {
                        self.parent_up = false;
                        self.effect(Effect::DropLink(Peer::Parent, 0));
                        if self.start_reparent(&t.reason) {
                            continue;
                        }
                        error!("lost parent: {}; exiting", t.reason);
                        self.exit_code = crate::shellproto::BROKER_EXIT_CUT_OFF;
                        self.begin_shutdown("lost parent");
                    }
                    PeerState::Torpid => info!("parent is torpid: {}", t.reason),
                    PeerState::Online if t.from == PeerState::Torpid => info!("parent is lively again"),
                    _ => {}
                }
                continue;
            }
            let r = t.rank;
            match t.to {
                PeerState::Lost => {
                    self.effect(Effect::ForgetChild(r));
                    self.forget_child_address(r);
                    if let Some(conn) = self.children.remove(&r) {
                        self.effect(Effect::DropLink(Peer::Child(r), conn));
                        self.child_lost(r, &t.reason);
                        self.fail_inflight(r);
                    }
                    self.membership.remove(r);
                }
                PeerState::Torpid | PeerState::Online if self.shutting_down.is_none() => {
                    let (topic, what) = if t.to == PeerState::Torpid {
                        ("overlay.torpid", "torpid")
                    } else {
                        ("overlay.lively", "lively")
                    };
                    if t.to == PeerState::Online && t.from != PeerState::Torpid {
                        continue;
                    }
                    info!("child rank {r} is {what}: {}", t.reason);
                    let mut m = Message::request(topic, 0, &json!({"ranks": r.to_string(), "reason": t.reason}));
                    m.flags = FLAG_NORESPONSE;
                    self.route_request(SELF, m);
                }
                _ => {}
            }
        }
        // Verdicts that rest on one signal are confirmed first (confirm.rs).
        self.start_confirmations();
    }

    /// Child `r` is lost: so is its whole subtree (cut off), reported to rank 0 once.
    fn child_lost(&mut self, r: u32, why: &str) {
        let (topo, size) = self.tree();
        let subtree: IdSet = if self.opts.config.reparent {
            // Its children re-parent on their own; rank 0 expects them (reparent.rs).
            if self.children_of(r).is_empty() {
                warn!("lost child rank {r} ({why})");
            } else {
                warn!("lost child rank {r} ({why}); its children re-parent");
            }
            std::iter::once(r).collect()
        } else {
            let s: IdSet = topo.subtree(size, r).into_iter().collect();
            warn!("lost child rank {r} ({why}); subtree {s} is lost");
            s
        };
        // `parent`: the judge, so that rank 0 can tell a notice sent again after a re-parent about a rank that
        // has moved on (or come back) since from a current one (reparent.rs).
        let body = json!({"ranks": subtree.to_string(), "reason": why, "root": r, "parent": self.rank()});
        let mut m = Message::request("overlay.lost", 0, &body);
        m.flags = FLAG_NORESPONSE;
        self.lost_reports.insert(r, body);
        self.route_request(SELF, m);
    }

    /// A link closed (or the kernel reset it).
    pub fn on_closed(&mut self, peer: Peer, conn: u64, why: &str) {
        match peer {
            Peer::Parent => {
                if !self.parent_up {
                    return;
                }
                if self.shutting_down.is_none() {
                    self.parent_up = false;
                    self.effect(Effect::DropLink(Peer::Parent, 0));
                    let why =
                        if why.starts_with("connection") { why.to_string() } else { format!("connection: {why}") };
                    if self.start_reparent(&why) {
                        return;
                    }
                    error!("lost connection to parent: {why}; exiting");
                    self.exit_code = crate::shellproto::BROKER_EXIT_CUT_OFF;
                    self.begin_shutdown("lost parent");
                }
                self.parent_up = false;
                self.effect(Effect::DropLink(Peer::Parent, 0));
                // No parent: nothing more to wait for beyond our own children.
            }
            Peer::Child(r) => {
                if self.children.get(&r) != Some(&conn) {
                    return;
                }
                if self.shutting_down.is_some() || self.goodbye.remove(&r) {
                    self.effect(Effect::ForgetChild(r));
                    self.forget_child_address(r);
                    self.children.remove(&r);
                    self.effect(Effect::DropLink(Peer::Child(r), conn));
                    self.membership.remove(r);
                    self.fail_inflight(r);
                    debug!("child rank {r} left");
                    if self.shutting_down.is_none() {
                        let (topo, size) = self.tree();
                        let subtree: IdSet = topo.subtree(size, r).into_iter().collect();
                        let mut m = Message::request(
                            "overlay.offline",
                            0,
                            &json!({"ranks": subtree.to_string(), "reason": "left"}),
                        );
                        m.flags = FLAG_NORESPONSE;
                        self.route_request(SELF, m);
                    }
                    return;
                }
                let t = self.membership.signal(self.clock(), r, Signal::Closed(why.to_string()));
                self.apply_transitions(t);
                self.effect(Effect::ForgetChild(r));
                self.forget_child_address(r);
                if let Some(conn) = self.children.remove(&r) {
                    // Membership already had it as lost or unknown: still report the loss once.
                    self.effect(Effect::DropLink(Peer::Child(r), conn));
                    self.child_lost(r, why);
                    self.membership.remove(r);
                }
                self.fail_inflight(r);
            }
            Peer::Local(id) => {
                if self.locals.get(&id).is_some_and(|c| c.streaming) {
                    // Let rank 0 drop watchers this client left behind: routed as the client's own last request
                    // (its route stamp and userid), which asks for no response.
                    let mut m = Message::request("job-info.disconnect", 0, &json!({}));
                    m.flags = FLAG_NORESPONSE;
                    self.route_request(Peer::Local(id), m);
                }
                // What it waited for here is dropped with it: nobody is left to answer.
                let route = [id | crate::message::ROUTE_LOCAL];
                self.exit_waiters.retain(|_, w| {
                    w.retain(|m| m.route != route);
                    !w.is_empty()
                });
                self.rtt_runs.retain(|_, r| r.req.route != route);
                self.locals.remove(&id);
            }
        }
    }
}
