//! The prober's state and rounds: for each child (and the parent's node) its request id, what its replies
//! said and how long they take, and at the start of each period which probes were missed and what to send next
//! ([`Prober::next_round`]). Replies come in through [`Prober::reply`] (read from the socket) and
//! [`Prober::read_collected`] (collected by this node's kernel, XDP); verdict material goes to the driver's loop
//! as [`Signal::ProbeReply`] / [`Signal::ProbeMissed`], and the membership machine (`vigil_core::membership`)
//! decides. No socket and no thread here (`prober_thread.rs` runs it, `probe_socket.rs` sends and reads); the
//! clock is read where a reply is timed.
//!
//! The rules it applies live in `vigil_core::probe` (a child's reply time, the patience before a probe counts as
//! missed, the excuse of a correlated silence) and are described in docs/failure-detection.md; what is here is
//! their bookkeeping per child: group or unicast probing, reply slots, forwarding only what changes a verdict.

use super::DetectInput;
use crate::broker::core::PARENT;
use crate::membership::Signal;
use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;
use tokio::sync::mpsc;
use tracing::warn;
use vigil_core::probe::{self, ReplyTiming};
use vigil_ebpf::{Probe, ProbeKind};

/// One child (or the parent's node, [`PARENT`]) the prober probes: where, under which id, and what its replies
/// have said so far.
pub(super) struct ProbeTarget {
    pub(super) addr: SocketAddr,
    /// What requests carry in their `rank` field and replies echo: a slot of this node's reply array where the
    /// kernel collects the child's replies, or [`NO_SLOT`] | rank.
    pub(super) id: u32,
    /// Last round this child answered.
    answered: u32,
    /// Last reply's kind and whether its heartbeat age was over the torpid threshold (to report changes only).
    kernel: Option<bool>,
    stalled: bool,
    missed_reported: u32,
    /// When a reply was last forwarded to the core (`CLOCK_MONOTONIC` ns).
    forwarded_ns: u64,
    /// Probed by the group datagram (its kernel answered a unicast probe and learned us), not by unicast.
    grouped: bool,
    /// Round of the last unicast probe sent to it.
    pub(super) last_unicast: u32,
    /// Rounds in a row, probed by the group datagram alone, that it did not answer.
    group_only_misses: u32,
    /// Group probes do not reach it (multicast filtered on the way): unicast only from now on.
    no_group: bool,
    /// How long its kernel's replies take: a period without news counts as missed only past that
    /// (`vigil_core::probe`).
    timing: ReplyTiming,
    /// The round during which its last news came (a reply to a newer probe than any before).
    news_round: u32,
    /// When its last news came (`CLOCK_MONOTONIC` ns; None: no reply yet): the misses after it are timed from it
    /// (`vigil_verdict_latency_seconds`).
    news_ns: Option<u64>,
    /// Periods of its current silence excused as correlated (`vigil_core::probe::correlated_silence`).
    excused: u32,
    /// The round of the last reply timed: a reply collected by the kernel stays in its slot and is read again
    /// each period until another replaces it, and is timed once.
    timed_seq: u32,
    /// Its last news said its broker's heartbeat was half way to stalled or more, or its broker dead
    /// ([`Prober::answers`]).
    hb_stale: bool,
}

/// Group-only rounds in a row a child may miss while it still answers unicast probes before it is probed by
/// unicast for good (the network does not deliver the group to it).
const GROUP_MISSES_MAX: u32 = 3;

/// Children whose kernel answers from which a period with no reply at all is not judged ([`Prober::next_round`]).
/// Below it, all children silent at once (a rack's power, its switch) is as likely as a stalled parent, and is
/// judged in 30-40 ms; from it on, a parent's own stall is the likelier cause, and declaring that many nodes lost
/// by mistake the costlier error.
const VOID_MIN_CHILDREN: usize = 8;

/// Marks an id that is not a reply-array slot (slots are below [`vigil_ebpf::SLOTS`]).
const NO_SLOT: u32 = 0x8000_0000;

/// The prober's state: its children and the current round.
pub(super) struct Prober {
    pub(super) targets: HashMap<u32, ProbeTarget>,
    /// Current round (sequence number of the last probes sent); a child that answered round `r` has
    /// `round - r` probes outstanding.
    pub(super) round: u32,
    /// Key mixed into every request's timestamp: replies must echo it, so a forged reply (anyone can send UDP)
    /// cannot make a child look dead or alive without having seen our request.
    pub(super) key: u64,
    /// This node's reply array, where the kernel collects our children's replies.
    pub(super) area: Option<Arc<vigil_ebpf::ReplyArea>>,
    /// Our UDP port (replies in the array are checked against it).
    port: u16,
    /// Slot blocks we claimed in the array, and their slots not in use.
    blocks: Vec<u32>,
    free: Vec<u32>,
    /// Child rank by request id.
    ids: HashMap<u32, u32>,
    /// Where group probes go (IP multicast), when this prober may use them.
    pub(super) group: Option<SocketAddrV4>,
    /// Children per IPv4 address: only a child alone on its node can be group-probed (a node's kernel
    /// answers one broker per parent).
    per_ip: HashMap<Ipv4Addr, u32>,
    tx: mpsc::UnboundedSender<DetectInput>,
    /// A child that group probes do not reach was reported (once per prober).
    no_group_logged: bool,
    /// The kernel collects replies (`area` is set): group replies, which never reach the socket, are seen.
    collects: bool,
    /// Heartbeat age (s) from which every reply is forwarded to the core: half of `tbon.stall_max`.
    stall_note: f64,
    /// After the last round: children probed by the group datagram, and those the group does not reach.
    pub(super) counts: (u32, u32),
    /// Reused by every period's read of the reply array: (rank, slot, address) of the children with a slot.
    scratch: Vec<(u32, u32, SocketAddr)>,
    /// Newest round any child answered.
    newest: u32,
    /// Rounds left unjudged because no child answered (see [`Prober::next_round`]), and whether that was logged.
    pub(super) void_rounds: u64,
    stall_logged: bool,
    /// Periods of correlated silence (see [`Prober::next_round`]), and whether that was logged.
    pub(super) correlated_rounds: u64,
    /// Replies accepted (an echo of one of our requests from the address probed), news or not: for metrics.
    pub(super) replies: u64,
    /// Probe datagrams sent (unicast requests and group datagrams): for metrics.
    pub(super) sent: u64,
    /// Datagrams read on the probe socket and dropped: not a reply to one of our requests (undecodable, an id we
    /// did not give, a stale, future or forged echo, from another address than the one probed): for metrics.
    pub(super) rejected: u64,
    correlated_logged: bool,
    /// Unjudged rounds in a row just now.
    void_streak: u32,
    /// Unjudged rounds in a row after which grouped children answered the unicast re-probe.
    group_suspect: u32,
    /// `tbon.probe_period`, seconds (misses are counted past each child's reply time in periods).
    pub(super) period: f64,
    /// Every kernel reply of every target timed together: a new target (a child that joins, the parent after a
    /// re-parent) starts from it, so that it is judged at once at this network's pace (`vigil_core::probe`).
    all: ReplyTiming,
}

impl Drop for Prober {
    fn drop(&mut self) {
        if let Some(a) = &self.area {
            for b in self.blocks.drain(..) {
                a.release_block(b);
            }
        }
    }
}

impl Prober {
    /// A prober on UDP `port` with no children yet; `stall_note` in seconds.
    pub(super) fn new(
        key: u64,
        port: u16,
        group: Option<SocketAddrV4>,
        tx: mpsc::UnboundedSender<DetectInput>,
        stall_note: f64,
    ) -> Prober {
        Prober {
            targets: HashMap::new(),
            round: 0,
            key,
            area: None,
            port,
            blocks: Vec::new(),
            free: Vec::new(),
            ids: HashMap::new(),
            group,
            per_ip: HashMap::new(),
            tx,
            no_group_logged: false,
            collects: false,
            stall_note,
            counts: (0, 0),
            scratch: Vec::new(),
            newest: 0,
            void_rounds: 0,
            stall_logged: false,
            correlated_rounds: 0,
            replies: 0,
            sent: 0,
            rejected: 0,
            correlated_logged: false,
            void_streak: 0,
            group_suspect: 0,
            period: 0.01,
            all: ReplyTiming::default(),
        }
    }

    /// A request id for child `rank`: a free slot of the reply array (claiming a block when none is left), else
    /// [`NO_SLOT`] | rank (replies then come to the socket).
    fn new_id(&mut self, rank: u32) -> u32 {
        let Some(area) = &self.area else { return NO_SLOT | rank };
        if self.free.is_empty() {
            match area.claim_block(self.port) {
                Ok(first) => {
                    self.blocks.push(first);
                    self.free.extend((first..first + vigil_ebpf::SLOT_BLOCK).rev());
                }
                Err(e) => {
                    tracing::debug!("no reply slot for child rank {rank} ({e}); its replies come to the socket");
                    return NO_SLOT | rank;
                }
            }
        }
        self.free.pop().unwrap_or(NO_SLOT | rank)
    }

    fn drop_id(&mut self, id: u32) {
        self.ids.remove(&id);
        if id & NO_SLOT == 0 {
            if let Some(a) = &self.area {
                a.forget(id);
            }
            self.free.push(id);
        }
    }

    /// Gives child `rank` an id, and has the kernel collect its replies when the id is a slot.
    fn assign(&mut self, rank: u32, addr: SocketAddr) -> u32 {
        let id = self.new_id(rank);
        if let (Some(area), SocketAddr::V4(a), true) = (&self.area, addr, id & NO_SLOT == 0) {
            area.expect(id, self.port, a);
        }
        self.ids.insert(id, rank);
        id
    }

    pub(super) fn add(&mut self, rank: u32, addr: SocketAddr) {
        self.remove(rank);
        if let (SocketAddr::V4(a), false) = (addr, rank == PARENT) {
            *self.per_ip.entry(*a.ip()).or_default() += 1;
        }
        let id = self.assign(rank, addr);
        let t = ProbeTarget {
            addr,
            id,
            answered: self.round,
            kernel: None,
            stalled: false,
            missed_reported: 0,
            forwarded_ns: 0,
            grouped: false,
            last_unicast: 0,
            group_only_misses: 0,
            no_group: false,
            timing: self.all,
            news_round: self.round,
            news_ns: None,
            excused: 0,
            timed_seq: 0,
            hb_stale: false,
        };
        self.targets.insert(rank, t);
    }

    pub(super) fn remove(&mut self, rank: u32) {
        let Some(t) = self.targets.remove(&rank) else { return };
        self.drop_id(t.id);
        if let (SocketAddr::V4(a), false) = (t.addr, rank == PARENT) {
            if let Some(n) = self.per_ip.get_mut(a.ip()) {
                *n -= 1;
                if *n == 0 {
                    self.per_ip.remove(a.ip());
                }
            }
        }
    }

    /// The kernel collects our replies from now on: every child gets a slot (and is re-taught by unicast).
    pub(super) fn set_area(&mut self, area: Arc<vigil_ebpf::ReplyArea>) {
        self.area = Some(area);
        self.collects = true;
        let children: Vec<(u32, u32, SocketAddr)> = self.targets.iter().map(|(r, t)| (*r, t.id, t.addr)).collect();
        for (rank, old, addr) in children {
            self.drop_id(old);
            let id = self.assign(rank, addr);
            if let Some(t) = self.targets.get_mut(&rank) {
                t.id = id;
                t.grouped = false;
            }
        }
    }

    /// A reply (read from the socket, `from` its sender; or collected by the kernel, which checked the sender).
    /// One it does not accept is counted in [`Prober::rejected`].
    pub(super) fn reply(&mut self, p: &Probe, from: SocketAddr) {
        let before = self.replies;
        if let Some(&rank) = self.ids.get(&p.rank) {
            self.accept(rank, p, from, vigil_ebpf::monotonic_ns());
        }
        if self.replies == before {
            self.rejected += 1;
        }
    }

    /// A reply for child `rank` (its id already matched), at `now` (CLOCK_MONOTONIC, ns).
    fn accept(&mut self, rank: u32, p: &Probe, from: SocketAddr, now: u64) {
        if p.kind == ProbeKind::Request || p.kind == ProbeKind::Group || p.seq > self.round {
            return;
        }
        let kernel = p.kind == ProbeKind::ReplyKernel;
        let sent = p.sent_ns ^ self.key;
        if sent > now || now - sent > 60_000_000_000 {
            return; // not an echo of one of our requests
        }
        // Fields borrowed apart from the target, so one lookup serves the whole reply.
        let (group, collects, per_ip, round) = (self.group, self.collects, &self.per_ip, self.round);
        let Some(t) = self.targets.get_mut(&rank) else { return };
        if from != t.addr {
            return;
        }
        self.replies += 1;
        // Every kernel reply times the node, news or not (vigil_core::probe); a userspace responder's replies never
        // arm the miss rule.
        if kernel && p.seq != t.timed_seq {
            t.timed_seq = p.seq;
            let rtt = now.saturating_sub(sent) as f64 / 1e9;
            t.timing.sample(rtt);
            self.all.sample(rtt);
        }
        if p.seq <= t.answered {
            return;
        }
        // Its kernel answered: it knows us now, and answers the group datagram from the next round. (Looked up
        // only for a child not grouped yet: this runs for every child every period.)
        // The parent's node is not one of our group's: probed by unicast only.
        let grouped =
            kernel && rank != PARENT && (t.grouped || (!t.no_group && groupable(group, collects, per_ip, from)));
        t.answered = p.seq;
        // News: the silence counted by the miss rule starts again.
        t.news_round = round;
        t.news_ns = Some(now);
        t.excused = 0;
        self.newest = self.newest.max(p.seq);
        let recovered = t.missed_reported > 0;
        t.missed_reported = 0;
        t.grouped = grouped;
        let age = p.hb_age_ns as f64 / 1e9;
        // Forwarded every time once the child's heartbeat is half way to torpid (the membership machine applies
        // the real threshold; this only limits how often replies reach the core).
        let stalled = age >= self.stall_note;
        t.hb_stale = stalled || !p.alive();
        // Forward what changes a verdict, and once a second that replies still come. A kernel reply arms the probe
        // rules in the core (and vouches for the node's TCP), so none is forwarded before the node's reply time is
        // known (but one saying its broker is dead): meanwhile the node is judged on TCP, confirmed
        // (`vigil_core::probe::ARM_REPLIES`).
        let refresh = now.saturating_sub(t.forwarded_ns) >= 1_000_000_000;
        let known = !kernel || probe::judged_by(&t.timing, &self.all).armed() || !p.alive();
        if known && (t.kernel != Some(kernel) || stalled || t.stalled != stalled || !p.alive() || recovered || refresh)
        {
            t.kernel = Some(kernel);
            t.stalled = stalled;
            t.forwarded_ns = now;
            // The event behind a verdict on this reply: the reply itself if it says the broker is dead, else the
            // broker's last heartbeat (a stall's start).
            let event_ns = if p.alive() { now.saturating_sub(p.hb_age_ns) } else { now };
            let _ = self.tx.send(DetectInput::Probe(
                rank,
                Signal::ProbeReply { kernel, alive: p.alive(), hb_age: age },
                std::time::Instant::now(),
                Some(event_ns),
            ));
        }
    }

    /// Replies the kernel collected since the last read (a read of shared memory per child, no system call; one
    /// clock read per period).
    pub(super) fn read_collected(&mut self) {
        let Some(area) = self.area.clone() else { return };
        let now = vigil_ebpf::monotonic_ns();
        let mut slots = std::mem::take(&mut self.scratch);
        slots.clear();
        slots.extend(self.targets.iter().filter(|(_, t)| t.id & NO_SLOT == 0).map(|(r, t)| (*r, t.id, t.addr)));
        for &(rank, slot, addr) in &slots {
            if let Some((p, _)) = area.read(slot) {
                self.accept(rank, &p, addr, now);
            }
        }
        self.scratch = slots;
    }

    /// Whether child `rank`'s management network answers, as the fabric-down rule needs it
    /// (`vigil_core::membership::FabricWatch`): its node has answered, no probe of it is
    /// missed past its reply time, and its last news said its broker beats (a stalled broker stops its
    /// job-network responder too, which must not read as a dead fabric).
    pub(super) fn answers(&self, rank: u32) -> bool {
        let Some(t) = self.targets.get(&rank) else { return false };
        let patience = probe::patience_of(&t.timing, &self.all, self.period);
        t.kernel.is_some() && !t.hb_stale && probe::missed_excused(self.round - t.news_round, t.excused, patience) == 0
    }

    /// Start of a period: count misses, then the next round's probes: (group datagram wanted, unicast list).
    ///
    /// A period in which no child at all answered, while at least [`VOID_MIN_CHILDREN`] children's kernels have
    /// been answering, is not judged: nobody is blamed and the round is probed again under the same number.
    /// Many nodes going silent in the same 10 ms is far more often this node's own receive path falling behind
    /// (its CPU starved, a receive queue backed up, its own link down) than that many deaths at once; a reply
    /// processed late still arrives, and replies are read in the order they came, so once any child answers the
    /// newest round the others' missing replies are not stuck behind it. Nodes really gone all at once are
    /// judged on TCP (`tbon.lost_timeout`) once their replies are older than the probe rule's vouching window.
    pub(super) fn next_round(&mut self) -> (bool, Vec<(u32, SocketAddr)>) {
        // Children whose kernel answers: counted only in a period nobody answered (not on every period's path).
        let nobody = self.round > 0 && self.newest < self.round;
        let answering = if nobody { self.targets.values().filter(|t| t.kernel == Some(true)).count() } else { 0 };
        let void = nobody && answering >= VOID_MIN_CHILDREN;
        if void {
            self.void_rounds += 1;
            self.void_streak += 1;
            if !self.stall_logged {
                self.stall_logged = true;
                warn!(
                    "no child answered the last probe ({answering} children's kernels answer): this node's own \
                     receive path looks stalled; nobody is blamed until replies come again (counted in \
                     `vigil overlay status`; later ones at debug level)"
                );
            } else {
                tracing::debug!("no child answered probe round {}: not judged", self.round);
            }
        } else if self.void_streak > 0 {
            // Answered again after a round nobody answered, re-probed by unicast. If grouped children answered,
            // it was perhaps the group datagram, not us, that failed: after GROUP_MISSES_MAX such rounds in a
            // row the group is given up for every child.
            self.void_streak = 0;
            if self.targets.values().any(|t| t.grouped && t.answered == self.round) {
                self.group_suspect += 1;
            }
            if self.group_suspect >= GROUP_MISSES_MAX {
                self.group_suspect = 0;
                let g = self.group.map(|g| g.to_string()).unwrap_or_default();
                warn!(
                    "group probes to {g} reach none of the children (they answer unicast probes only); they are \
                     probed by unicast from now on"
                );
                for t in self.targets.values_mut().filter(|t| t.grouped) {
                    t.grouped = false;
                    t.no_group = true;
                }
            }
        }
        // Children past their reply time this period, of those whose misses count: several at once blame nobody
        // (vigil_core::probe::correlated_silence).
        let correlated = !void && {
            let (mut judged, mut silent) = (0, 0);
            for t in self.targets.values() {
                let timing = probe::judged_by(&t.timing, &self.all);
                if t.kernel.is_some() && timing.armed() {
                    judged += 1;
                    let outstanding = self.round - t.news_round;
                    if probe::missed_excused(
                        outstanding,
                        t.excused,
                        probe::patience_of(&t.timing, &self.all, self.period),
                    ) >= 1
                    {
                        silent += 1;
                    }
                }
            }
            let c = probe::correlated_silence(silent, judged);
            if c {
                self.correlated_rounds += 1;
                if !self.correlated_logged {
                    self.correlated_logged = true;
                    warn!(
                        "{silent} of {judged} children answer later than they did, at once: the links or this node \
                         slowed down; none is blamed for such periods while the prober learns their new pace \
                         (counted in `vigil overlay status`; later ones at debug level)"
                    );
                } else {
                    tracing::debug!("{silent} of {judged} children late at once in round {}: excused", self.round);
                }
            }
            c
        };
        let mut unicast = Vec::new();
        let mut group = false;
        let (mut grouped, mut unreached) = (0, 0);
        // The round the next probes carry: a round nobody answered is probed again under its own number.
        let next = if void { self.round } else { self.round + 1 };
        for (r, t) in self.targets.iter_mut() {
            let outstanding = self.round - t.answered;
            if !void && t.grouped && t.last_unicast != self.round {
                // The last round reached it by the group datagram alone.
                t.group_only_misses = if outstanding >= 1 { t.group_only_misses + 1 } else { 0 };
                if outstanding == 0 {
                    self.group_suspect = 0; // the group datagram reaches children
                }
                if t.group_only_misses >= GROUP_MISSES_MAX {
                    t.grouped = false;
                    t.no_group = true;
                    let g = self.group.map(|g| g.to_string()).unwrap_or_default();
                    if !self.no_group_logged {
                        self.no_group_logged = true;
                        warn!(
                            "group probes to {g} do not reach child rank {r} (it answers unicast probes only); it is \
                             probed by unicast from now on (others like it are logged at debug level)"
                        );
                    } else {
                        tracing::debug!("group probes to {g} do not reach child rank {r}; probed by unicast");
                    }
                }
            }
            // Every new miss is reported: the first one already stops vouching for the node's TCP. A probe is
            // missed once it has waited longer than this child's usual reply time (vigil_core::probe).
            let timing = probe::judged_by(&t.timing, &self.all);
            let patience = probe::patience_of(&t.timing, &self.all, self.period);
            let outstanding_news = self.round - t.news_round;
            if correlated
                && t.excused < probe::MAX_EXCUSED
                && probe::missed_excused(outstanding_news, t.excused, patience) >= 1
            {
                t.excused += 1;
            }
            let missed = probe::missed_excused(outstanding_news, t.excused, patience);
            if !void && missed >= 1 && missed > t.missed_reported && t.kernel.is_some() && timing.armed() {
                t.missed_reported = missed;
                tracing::debug!(
                    "child rank {r}: {missed} probes missed: {outstanding_news} periods without news, {} allowed \
                     (reply time {:.0} ms), {} excused",
                    patience,
                    probe::judged_by(&t.timing, &self.all).reply_time().max(self.all.reply_time()) * 1e3,
                    t.excused
                );
                let _ = self.tx.send(DetectInput::Probe(
                    *r,
                    Signal::ProbeMissed { misses: missed },
                    std::time::Instant::now(),
                    t.news_ns,
                ));
            }
            // A grouped child that missed a round also gets a unicast probe: it double-checks over another path
            // and teaches a node that forgot us (LRU, reboot) who we are.
            if t.grouped {
                group = true;
                grouped += 1;
            }
            if t.no_group {
                unreached += 1;
            }
            if !t.grouped || outstanding >= 1 {
                unicast.push((t.id, t.addr));
                t.last_unicast = next;
            }
        }
        // Replies come back in about the order the probes went out, and a burst of them that overflows a queue on
        // the way (a switch port's buffer, this NIC's receive ring) loses its tail: start each round's unicast
        // probes at a different child so that the tail is never the same children round after round.
        if !unicast.is_empty() {
            let k = next as usize % unicast.len();
            unicast.rotate_left(k);
        }
        self.round = next;
        self.counts = (grouped, unreached);
        (group, unicast)
    }
}

/// Whether a child at `addr` may be probed by the group datagram: the prober has a group, the kernel collects
/// replies (group replies never reach the socket), and the child is alone on its node (`per_ip` counts children
/// per address: a node's kernel answers one broker per parent).
fn groupable(group: Option<SocketAddrV4>, collects: bool, per_ip: &HashMap<Ipv4Addr, u32>, addr: SocketAddr) -> bool {
    match addr {
        SocketAddr::V4(a) => group.is_some() && collects && per_ip.get(a.ip()).copied() == Some(1),
        SocketAddr::V6(_) => false,
    }
}

#[cfg(test)]
mod tests;
