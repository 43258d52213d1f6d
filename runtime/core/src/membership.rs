//! Peer liveness: the membership state machine that turns every signal a broker has about a peer into one
//! verdict: online, torpid, lost or offline (the words of Flux's `flux overlay status`; docs/failure-detection.md).
//!
//! Sans-IO: the broker feeds [`Membership::signal`] with what it observes (connection closed or reset, any
//! traffic, heartbeat replies, the kernel's TCP ACK state from `TCP_INFO`, and later the eBPF detectors'
//! events) and calls [`Membership::tick`] at [`Membership::next_deadline`]. Each call returns the state changes.
//!
//! Rules, with the attributes that tune them (seconds):
//! - a connection that closes without a goodbye (EOF, reset, timeout) is **lost** at once; with a goodbye it
//!   is **offline**;
//! - no traffic at all from the peer for `tbon.torpid_max` → **torpid** (no new work is placed there); any
//!   traffic → back to **online** ("lively");
//! - data we sent that the peer's *kernel* has not acknowledged for `tbon.lost_timeout` (times the judge's own
//!   lateness factor, [`Membership::set_lateness`]) makes the peer **suspect**, never lost by itself: a live
//!   peer starved of CPU while it holds its socket's lock delays its kernel's ACKs as long as it waits to run,
//!   and a delayed ACK may legally wait 200 ms. The broker confirms a suspect through independent paths
//!   ([`Membership::take_suspects`], `broker/confirm.rs`) and reports the outcome with
//!   [`Membership::confirmed`]: lost only when no path found the node's kernel answering and the data is still
//!   unacknowledged. Judged on a `TCP_INFO` sample taken at or after that deadline (the timer asks for one:
//!   [`Membership::take_ack_check`]), never on an older one, and never within [`LINK_SETTLE`] of the link's
//!   start. A stalled broker (SIGSTOP, swapping, starved) still has its kernel ACK our heartbeats (or answer the
//!   confirmation), so it is torpid, never lost.
//! - a process-exit report for the peer's broker → **lost** at once;
//! - heartbeat probes answered by the peer node's *kernel* (the XDP responder) arm the probe rules: a reply
//!   saying the broker process is dead → **lost** at once; `tbon.probe_misses` consecutive probes (sent every
//!   `tbon.probe_period`) left unanswered → **lost** (the node or its link is gone); a reply whose broker
//!   heartbeat is older than `tbon.stall_max` (75 ms) → **torpid**. While the kernel answers, the node is never
//!   declared lost on TCP acknowledgements alone. Replies from a userspace responder prove only that the
//!   broker process runs, so they never arm the miss rule (a stopped broker would look like a dead node).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A kernel reply older than this (seconds) no longer vouches for the node (the prober refreshes it every second).
pub const KERNEL_REPLY_STALE: f64 = 2.5;

/// Shortest `tbon.probe_period` accepted (seconds): below it, a reply delayed by softirq scheduling on a busy node
/// would count as a miss.
pub const MIN_PROBE_PERIOD: f64 = 0.005;

/// A link is not judged on unacknowledged TCP data during its first half second (seconds): at start-up the peer
/// runs its handshakes, loads its detectors and registers, with every other broker of a machine doing the same,
/// and its node's kernel responder is not armed yet. A node that dies meanwhile is judged once the window is over
/// (or at once, by a reset, an exit event or its kernel's probe replies). Links that replace one that was up
/// (re-parents, rejoins) are not held back ([`Membership::settled`]).
pub const LINK_SETTLE: f64 = 0.5;

/// Liveness of a peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PeerState {
    /// Connected and heard from recently.
    Online,
    /// Connected, but silent longer than `torpid_max`: given no new work, not given up.
    Torpid,
    /// Declared dead: its connection failed or its node stopped acknowledging.
    Lost,
    /// Never joined, or left cleanly.
    Offline,
}

impl PeerState {
    /// The word for it, as serialized: `online`, `torpid`, `lost`, `offline`.
    pub fn name(self) -> &'static str {
        match self {
            PeerState::Online => "online",
            PeerState::Torpid => "torpid",
            PeerState::Lost => "lost",
            PeerState::Offline => "offline",
        }
    }
}

/// Thresholds (seconds). Defaults chosen by measurement (see docs/failure-detection.md).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Config {
    /// `tbon.heartbeat_period`: how often a parent sends a heartbeat to each child.
    pub heartbeat_period: f64,
    /// `tbon.torpid_max`: silence after which a peer is torpid.
    pub torpid_max: f64,
    /// `tbon.lost_timeout`: how long our data may stay unacknowledged by the peer's kernel before the peer is lost.
    pub lost_timeout: f64,
    /// `tbon.probe_period`: how often a parent probes each child node's responder.
    pub probe_period: f64,
    /// `tbon.probe_misses`: consecutive unanswered probes after which a kernel-answering node is lost.
    pub probe_misses: u32,
    /// `tbon.stall_max`: a probe reply from a peer's node saying its broker's userspace heartbeat is older than
    /// this makes the peer torpid. Measured by the node's own kernel at reply time, so no network delay is in it;
    /// the broker beats every quarter of it ([`BEATS_PER_STALL`]).
    #[serde(default = "default_stall_max")]
    pub stall_max: f64,
}

/// Default `tbon.stall_max`, seconds: a stall is seen 60-85 ms after it starts (the beat's age at the stall, plus
/// one probe period, plus the reading), inside the 100 ms that issue 42 asks for.
pub const STALL_MAX: f64 = 0.075;

/// A broker beats its heartbeat clock (the one its node's responder reports) this many times per
/// `tbon.stall_max`.
pub const BEATS_PER_STALL: f64 = 4.0;

fn default_stall_max() -> f64 {
    STALL_MAX
}

impl Default for Config {
    fn default() -> Config {
        Config {
            heartbeat_period: 0.05,
            torpid_max: 0.5,
            lost_timeout: 0.12,
            probe_period: 0.01,
            probe_misses: 3,
            stall_max: STALL_MAX,
        }
    }
}

/// What a broker observed about a peer.
#[derive(Clone, Debug, PartialEq)]
pub enum Signal {
    /// The peer connected (and said hello).
    Connected,
    /// The peer said goodbye and closed.
    Goodbye,
    /// The connection closed or failed without a goodbye (EOF, reset, ETIMEDOUT, malformed frame...).
    Closed(String),
    /// Any message arrived from the peer.
    Traffic,
    /// Kernel TCP state from `TCP_INFO`: `unacked` segments outstanding, `last_ack_age` seconds since the peer's
    /// kernel last acknowledged anything.
    KernelAck {
        /// Segments sent and not yet acknowledged.
        unacked: u32,
        /// Seconds since the last ACK was received.
        last_ack_age: f64,
    },
    /// The peer's broker process is known to have exited (process-exit watcher).
    ProcessExit(String),
    /// A heartbeat probe reply from the peer's node.
    ProbeReply {
        /// Answered by the node's kernel (XDP), not by the broker's userspace.
        kernel: bool,
        /// The reply says the broker process is alive.
        alive: bool,
        /// Seconds since the peer broker's last userspace heartbeat, as its node reports.
        hb_age: f64,
    },
    /// `misses` consecutive probes to the peer went unanswered (counted by the prober after reading every
    /// reply that had arrived, so a stalled prober does not count its own stall).
    ProbeMissed {
        /// Consecutive unanswered probes.
        misses: u32,
    },
}

/// A state change.
#[derive(Clone, Debug, PartialEq)]
pub struct Transition {
    /// Peer rank.
    pub rank: u32,
    /// Previous state.
    pub from: PeerState,
    /// New state.
    pub to: PeerState,
    /// Why, for logs and `vigil overlay status`.
    pub reason: String,
    /// Which rule made it (for the verdict counters: [`Membership::verdicts`]).
    pub rule: Rule,
}

/// The rule of this module that made a state change: the `rule` label of `vigil_verdicts_total`
/// (docs/metrics.md). The words are stable: dashboards select on them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Rule {
    /// The peer connected and said hello (online).
    Connected,
    /// The peer said goodbye (offline).
    Goodbye,
    /// Its connection closed or failed without a goodbye (lost).
    Closed,
    /// A process-exit report for its broker from this node's detectors (lost).
    ProcessExit,
    /// Its node's kernel replied that the broker process is dead (lost).
    ExitReply,
    /// `tbon.probe_misses` probes in a row unanswered by its node's kernel (lost).
    ProbeMisses,
    /// Data unacknowledged past `tbon.lost_timeout`, and no independent path found its node answering (lost).
    AckConfirmed,
    /// Its node's kernel reports its heartbeat older than `tbon.stall_max` (torpid).
    Stall,
    /// No traffic for `tbon.torpid_max` (torpid).
    Silence,
    /// Traffic again from a torpid peer (online).
    Lively,
}

impl Rule {
    /// Every rule, in label order.
    pub const ALL: [Rule; 10] = [
        Rule::Connected,
        Rule::Goodbye,
        Rule::Closed,
        Rule::ProcessExit,
        Rule::ExitReply,
        Rule::ProbeMisses,
        Rule::AckConfirmed,
        Rule::Stall,
        Rule::Silence,
        Rule::Lively,
    ];

    /// The label word: `connected`, `goodbye`, `closed`, `process-exit`, `exit-reply`, `probe-misses`,
    /// `ack-confirmed`, `stall`, `silence`, `lively`.
    pub fn name(self) -> &'static str {
        match self {
            Rule::Connected => "connected",
            Rule::Goodbye => "goodbye",
            Rule::Closed => "closed",
            Rule::ProcessExit => "process-exit",
            Rule::ExitReply => "exit-reply",
            Rule::ProbeMisses => "probe-misses",
            Rule::AckConfirmed => "ack-confirmed",
            Rule::Stall => "stall",
            Rule::Silence => "silence",
            Rule::Lively => "lively",
        }
    }
}

#[derive(Clone, Debug)]
struct Peer {
    state: PeerState,
    last_traffic: f64,
    /// When our oldest unacknowledged data was first seen unacknowledged (None = nothing outstanding).
    unacked_since: Option<f64>,
    /// When the peer's node kernel last answered a probe (None = never: probe rules not armed).
    kernel_reply: Option<f64>,
    /// When a fresh `TCP_INFO` sample was last taken or asked for ([`Membership::take_ack_check`]): the
    /// unacknowledged-data rule judges only on a sample taken at or after its deadline, never on an old one.
    sampled: f64,
    /// When the link started ([`Signal::Connected`]): the TCP rule waits [`LINK_SETTLE`] from it.
    connected_at: f64,
    /// A confirmation of the TCP rule's suspicion is under way (since then).
    confirming: Option<f64>,
    /// The link's round trip bound (the kernel's `srtt + 4 × rttvar`), seconds: data may wait that long for its
    /// ACK on this link whatever `tbon.lost_timeout` says.
    rtt_bound: f64,
    reason: String,
}

/// Liveness of a set of peers (a broker's children).
#[derive(Clone, Debug)]
pub struct Membership {
    cfg: Config,
    peers: BTreeMap<u32, Peer>,
    /// [`Membership::next_deadline`] as last computed; `None` when it must be computed again. Between two
    /// computations a deadline only moves later (traffic, an ACK), except where this is cleared (a new peer,
    /// newly outstanding data, a state change, a tick), so the cached value is never later than the true one:
    /// at worst a timer fires early and finds nothing. A parent of thousands of children would otherwise scan
    /// them all after every message.
    next: std::cell::Cell<Option<Option<f64>>>,
    /// Until when no peer is lost for unacknowledged TCP data (set by [`Membership::grace`]).
    ack_quiet_until: f64,
    /// The judge's lateness factor (>= 1): `tbon.lost_timeout` is stretched by it ([`Membership::set_lateness`]).
    lateness: f64,
    /// Peers the TCP rule made suspect since the last [`Membership::take_suspects`].
    suspects: Vec<u32>,
    /// State changes made so far, by new state and rule ([`Membership::verdicts`]).
    verdicts: BTreeMap<(PeerState, Rule), u64>,
}

impl Membership {
    /// A membership with these thresholds, tracking no peer yet.
    pub fn new(cfg: Config) -> Membership {
        Membership {
            cfg,
            peers: BTreeMap::new(),
            next: std::cell::Cell::new(None),
            ack_quiet_until: f64::MIN,
            lateness: 1.0,
            suspects: Vec::new(),
            verdicts: BTreeMap::new(),
        }
    }

    /// The judge's own lateness factor, >= 1 (1: on time): while this broker runs late, the unacknowledged-data
    /// rule waits `tbon.lost_timeout` times this (Lifeguard's local health multiplier). Values below 1 or not
    /// finite count as 1.
    pub fn set_lateness(&mut self, factor: f64) {
        let f = if factor.is_finite() { factor.max(1.0) } else { 1.0 };
        if f != self.lateness {
            self.lateness = f;
            self.next.set(None);
        }
    }

    /// The link to `rank` needs no settling window ([`LINK_SETTLE`]): it replaces one that was up (a re-parent, a
    /// rejoin), made by brokers past their start-up, and a dead peer must be judged as fast as on any link.
    pub fn settled(&mut self, rank: u32) {
        if let Some(p) = self.peers.get_mut(&rank) {
            p.connected_at = f64::MIN;
            self.next.set(None);
        }
    }

    /// The round trip bound of the link to `rank` (seconds; the kernel's `srtt + 4 × rttvar`): the
    /// unacknowledged-data rule waits at least that long, and so does a confirmation's check. Values that are not
    /// finite or not positive are ignored; at most 10 s is taken.
    pub fn set_rtt_bound(&mut self, rank: u32, bound: f64) {
        if !(bound.is_finite() && bound > 0.0) {
            return;
        }
        if let Some(p) = self.peers.get_mut(&rank) {
            let b = bound.min(10.0);
            if b != p.rtt_bound {
                p.rtt_bound = b;
                self.next.set(None);
            }
        }
    }

    /// How long data may wait for the peer's ACK before the peer is suspect: `tbon.lost_timeout` or the link's
    /// round trip bound, whichever is longer, times the judge's lateness factor (seconds).
    pub fn ack_wait(&self, rank: u32) -> f64 {
        ack_wait(self.cfg.lost_timeout, self.lateness, self.peers.get(&rank).map_or(0.0, |p| p.rtt_bound))
    }

    /// Peers that the unacknowledged-data rule made suspect since the last call: each needs a confirmation,
    /// answered with [`Membership::confirmed`]. A peer is listed once per suspicion.
    pub fn take_suspects(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.suspects)
    }

    /// Whether a confirmation of `rank` is under way.
    pub fn confirming(&self, rank: u32) -> bool {
        self.peers.get(&rank).is_some_and(|p| p.confirming.is_some())
    }

    /// The outcome of the confirmation of suspect `rank` at `now`: `answered` = some path found its node's kernel
    /// answering (the suspicion is dropped and the unacknowledged-data clock restarts), else lost, with `why`
    /// (which paths were tried) added to the reason, unless the data was acknowledged meanwhile or a kernel probe
    /// reply vouches for the node. Nothing for a peer not being confirmed.
    pub fn confirmed(&mut self, now: f64, rank: u32, answered: bool, why: &str) -> Vec<Transition> {
        let Some(p) = self.peers.get_mut(&rank) else { return vec![] };
        let Some(_) = p.confirming.take() else { return vec![] };
        self.next.set(None);
        if !matches!(p.state, PeerState::Online | PeerState::Torpid) {
            return vec![];
        }
        if answered {
            p.unacked_since = None;
            return vec![];
        }
        let kernel_answers = p.kernel_reply.is_some_and(|k| now < k + KERNEL_REPLY_STALE);
        let Some(since) = p.unacked_since.filter(|_| !kernel_answers) else { return vec![] };
        let why = format!("node not responding: no TCP acknowledgement for {:.0} ms; {why}", (now - since) * 1e3);
        self.set(rank, PeerState::Lost, Rule::AckConfirmed, why).into_iter().collect()
    }

    /// The thresholds.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Current state of `rank` (Offline if unknown).
    pub fn state(&self, rank: u32) -> PeerState {
        self.peers.get(&rank).map_or(PeerState::Offline, |p| p.state)
    }

    /// Reason of the current state of `rank`.
    pub fn reason(&self, rank: u32) -> &str {
        self.peers.get(&rank).map_or("", |p| p.reason.as_str())
    }

    /// Every tracked peer and its state.
    pub fn states(&self) -> impl Iterator<Item = (u32, PeerState)> + '_ {
        self.peers.iter().map(|(r, p)| (*r, p.state))
    }

    /// State changes made since this membership was created, by new state and rule (counters: they only grow).
    pub fn verdicts(&self) -> impl Iterator<Item = (PeerState, Rule, u64)> + '_ {
        self.verdicts.iter().map(|((s, r), n)| (*s, *r, *n))
    }

    /// The judge's lateness factor now (>= 1; [`Membership::set_lateness`]).
    pub fn lateness(&self) -> f64 {
        self.lateness
    }

    fn set(&mut self, rank: u32, to: PeerState, rule: Rule, reason: String) -> Option<Transition> {
        let p = self.peers.get_mut(&rank)?;
        if p.state == to {
            return None;
        }
        let from = p.state;
        p.state = to;
        p.reason = reason.clone();
        self.next.set(None);
        *self.verdicts.entry((to, rule)).or_default() += 1;
        Some(Transition { rank, from, to, reason, rule })
    }

    /// Feed one observation about `rank` at time `now` (seconds).
    pub fn signal(&mut self, now: f64, rank: u32, s: Signal) -> Vec<Transition> {
        if s == Signal::Connected {
            self.next.set(None);
            let p = self.peers.entry(rank).or_insert(Peer {
                state: PeerState::Offline,
                last_traffic: now,
                unacked_since: None,
                kernel_reply: None,
                sampled: now,
                connected_at: now,
                confirming: None,
                rtt_bound: 0.0,
                reason: String::new(),
            });
            p.last_traffic = now;
            p.unacked_since = None;
            p.kernel_reply = None;
            p.connected_at = now;
            p.confirming = None;
            return self.set(rank, PeerState::Online, Rule::Connected, "connected".into()).into_iter().collect();
        }
        let Some(p) = self.peers.get_mut(&rank) else { return vec![] };
        let state = p.state;
        if state == PeerState::Lost || state == PeerState::Offline {
            return vec![];
        }
        match s {
            Signal::Connected => vec![],
            Signal::Goodbye => self.set(rank, PeerState::Offline, Rule::Goodbye, "left".into()).into_iter().collect(),
            Signal::Closed(why) => self.set(rank, PeerState::Lost, Rule::Closed, why).into_iter().collect(),
            Signal::ProcessExit(why) => self.set(rank, PeerState::Lost, Rule::ProcessExit, why).into_iter().collect(),
            Signal::ProbeReply { kernel: false, .. } => vec![],
            Signal::ProbeReply { kernel: true, alive: false, .. } => self
                .set(rank, PeerState::Lost, Rule::ExitReply, "broker process exited (its node's kernel reports)".into())
                .into_iter()
                .collect(),
            Signal::ProbeReply { kernel: true, alive: true, hb_age } => {
                p.kernel_reply = Some(now);
                // The node answered: whatever TCP data is outstanding is not a dead node.
                p.unacked_since = None;
                // A reply saying the broker last beat `hb_age` ago is stale if the broker has talked to us since
                // (it resumed, and its node's table had not caught up when the kernel answered).
                let heard_since = p.last_traffic > now - hb_age + 1e-3;
                if state == PeerState::Online && hb_age >= self.cfg.stall_max - 1e-9 && !heard_since {
                    let why = format!(
                        "broker stalled longer than tbon.stall_max ({:.0} ms: its heartbeat is {:.0} ms old); its \
                         node's kernel answers",
                        self.cfg.stall_max * 1e3,
                        hb_age * 1e3
                    );
                    return self.set(rank, PeerState::Torpid, Rule::Stall, why).into_iter().collect();
                }
                vec![]
            }
            Signal::ProbeMissed { misses } => {
                if p.kernel_reply.is_none() || misses < self.cfg.probe_misses {
                    return vec![];
                }
                // Our parent is the one node we probe: no other child of ours can say whether the links slowed
                // down rather than the node died (`probe::correlated_silence`), and a false verdict ends this
                // broker or tears its subtree off its parent. So its missed probes only stop vouching for its
                // node: it is then judged by the TCP rule, confirmed (`broker/confirm.rs`), unless its broker has
                // also been silent for `tbon.torpid_max` (times our lateness).
                let silent = now - p.last_traffic;
                let wait = self.cfg.torpid_max * self.lateness;
                if rank == crate::broker::core::PARENT && silent < wait {
                    p.kernel_reply = None;
                    return vec![];
                }
                let why = format!(
                    "node not responding: {misses} heartbeat probes unanswered by its kernel past its reply time \
                     (every {:.0} ms){}",
                    self.cfg.probe_period * 1e3,
                    if rank == crate::broker::core::PARENT {
                        format!(", and its broker silent {:.0} ms", silent * 1e3)
                    } else {
                        String::new()
                    }
                );
                self.set(rank, PeerState::Lost, Rule::ProbeMisses, why).into_iter().collect()
            }
            Signal::Traffic => {
                p.last_traffic = now;
                p.unacked_since = None;
                if state == PeerState::Torpid {
                    return self.set(rank, PeerState::Online, Rule::Lively, "lively".into()).into_iter().collect();
                }
                vec![]
            }
            Signal::KernelAck { unacked, last_ack_age } => {
                if unacked == 0 {
                    p.unacked_since = None;
                } else {
                    // Outstanding data. Count from when we first *saw* it outstanding, not from the last ACK:
                    // after a quiet spell (a starved broker sends nothing, so nothing is ACKed) the last ACK is
                    // old even though the data was just sent. Any ACK since then is progress: the peer's kernel
                    // is alive and what is outstanding now is newer, so the count restarts.
                    let acked_at = now - last_ack_age.max(0.0);
                    if p.unacked_since.is_none() {
                        self.next.set(None);
                    }
                    p.unacked_since = Some(match p.unacked_since {
                        Some(s) if acked_at <= s => s,
                        _ => now,
                    });
                }
                p.sampled = p.sampled.max(now);
                if let Some(t) = self.judge_acks(now, rank) {
                    return vec![t];
                }
                self.tick_one(now, rank)
            }
        }
    }

    fn tick_one(&mut self, now: f64, rank: u32) -> Vec<Transition> {
        let cfg = self.cfg;
        let Some(p) = self.peers.get(&rank) else { return vec![] };
        match p.state {
            PeerState::Online | PeerState::Torpid => {
                // Never lost on TCP alone while the node's kernel answers probes (see the module rules; the prober
                // reports at least every second that replies still come). While armed, a dead node is the probe
                // rule's call (probe_misses in a row): TCP data left unacknowledged after a link blip, while
                // retransmissions back off, is not a dead node.
                if p.state == PeerState::Online && now >= p.last_traffic + cfg.torpid_max - 1e-9 {
                    // The threshold, not the silence so far: the reason is shown for as long as the peer is torpid.
                    let why = format!(
                        "broker silent longer than tbon.torpid_max ({:.0} ms); its node still acknowledges",
                        cfg.torpid_max * 1e3
                    );
                    return self.set(rank, PeerState::Torpid, Rule::Silence, why).into_iter().collect();
                }
                vec![]
            }
            _ => vec![],
        }
    }

    /// The unacknowledged-data rule for `rank`, on a `TCP_INFO` sample taken at `now`: our data has waited
    /// `tbon.lost_timeout` for the peer's kernel (and no probe reply vouches for the node) → lost.
    ///
    /// Judged only when a sample arrives, never on a timer alone: a broker that ran late (starved for less than
    /// `tbon.torpid_max`) would otherwise judge on the sample it took before its stall, taken when a heartbeat
    /// was merely in flight, and declare a live peer lost without looking again. See
    /// [`Membership::take_ack_check`].
    fn judge_acks(&mut self, now: f64, rank: u32) -> Option<Transition> {
        let p = self.peers.get(&rank)?;
        if !matches!(p.state, PeerState::Online | PeerState::Torpid) {
            return None;
        }
        // Never lost on TCP alone while the node's kernel answers probes (see the module rules; the prober
        // reports at least every second that replies still come). While armed, a dead node is the probe
        // rule's call (probe_misses in a row): TCP data left unacknowledged after a link blip, while
        // retransmissions back off, is not a dead node.
        let kernel_answers = p.kernel_reply.is_some_and(|k| now < k + KERNEL_REPLY_STALE);
        let since = p.unacked_since?;
        if kernel_answers || p.confirming.is_some() || now < self.ack_deadline_of(p, since) - 1e-9 {
            return None;
        }
        // One signal, from a judge that may itself be starved: suspect, to be confirmed (`broker/confirm.rs`).
        if let Some(p) = self.peers.get_mut(&rank) {
            p.confirming = Some(now);
        }
        self.suspects.push(rank);
        self.next.set(None);
        None
    }

    /// When data first seen unacknowledged at `since` on the link of `p` may be judged.
    fn ack_deadline_of(&self, p: &Peer, since: f64) -> f64 {
        ack_deadline(self.cfg.lost_timeout, self.lateness, self.ack_quiet_until, p, since)
    }

    /// True when some peer's unacknowledged data has reached its deadline and no `TCP_INFO` sample was taken
    /// since: the caller then samples every link now and feeds the result as [`Signal::KernelAck`], which
    /// gives the verdict. Marks those peers as asked, so that a link that gives no sample (its socket gone) is
    /// not asked for again before the next heartbeat's sample; [`Membership::next_deadline`] no longer
    /// includes them meanwhile.
    pub fn take_ack_check(&mut self, now: f64) -> bool {
        let mut due = false;
        let (lost_timeout, lateness, quiet) = (self.cfg.lost_timeout, self.lateness, self.ack_quiet_until);
        for p in self.peers.values_mut() {
            if !matches!(p.state, PeerState::Online | PeerState::Torpid) || p.confirming.is_some() {
                continue;
            }
            if let Some(s) = p.unacked_since {
                let d = ack_deadline(lost_timeout, lateness, quiet, p, s);
                if now >= d - 1e-9 && p.sampled < d - 1e-9 {
                    p.sampled = now;
                    due = true;
                }
            }
        }
        if due {
            self.next.set(None);
        }
        due
    }

    /// Apply time-based rules at `now`.
    pub fn tick(&mut self, now: f64) -> Vec<Transition> {
        self.next.set(None);
        let ranks: Vec<u32> = self.peers.keys().copied().collect();
        ranks.into_iter().flat_map(|r| self.tick_one(now, r)).collect()
    }

    /// Earliest time a time-based rule could fire.
    pub fn next_deadline(&self) -> Option<f64> {
        if let Some(cached) = self.next.get() {
            return cached;
        }
        let mut best: Option<f64> = None;
        for p in self.peers.values() {
            let mut c = |t: f64| best = Some(best.map_or(t, |b: f64| b.min(t)));
            if matches!(p.state, PeerState::Online | PeerState::Torpid) {
                if let Some(s) = p.unacked_since.filter(|_| p.confirming.is_none()) {
                    let d = self.ack_deadline_of(p, s);
                    if p.sampled < d - 1e-9 {
                        c(d);
                    }
                }
                if p.state == PeerState::Online {
                    c(p.last_traffic + self.cfg.torpid_max);
                }
            }
        }
        self.next.set(Some(best));
        best
    }

    /// We (the observer) were stalled for `late` seconds until `now`: what we did not see during the stall says
    /// nothing about the peers, so every silence and outstanding-data clock restarts now. And for as long again
    /// no peer is lost for unacknowledged TCP data alone: data sent before a stall of the whole node (a VM
    /// descheduled, a starved kernel) may wait that long for TCP's backed-off retransmission, and a parent
    /// link has no probe replies to vouch for its node meanwhile. Call before [`tick`](Self::tick) when the
    /// observer notices it ran late by more than `torpid_max`.
    pub fn grace(&mut self, now: f64, late: f64) {
        self.ack_quiet_until = now + late.max(0.0);
        self.next.set(None);
        for p in self.peers.values_mut() {
            p.last_traffic = p.last_traffic.max(now);
            p.unacked_since = None;
        }
    }

    /// Forget `rank` (e.g. after it was reported lost and its subtree handled).
    pub fn remove(&mut self, rank: u32) {
        self.next.set(None);
        self.peers.remove(&rank);
    }
}

/// How long data may wait for its ACK on a link whose round trip bound is `rtt_bound`: `lost_timeout` or that
/// bound, whichever is longer, times the judge's `lateness` (seconds).
fn ack_wait(lost_timeout: f64, lateness: f64, rtt_bound: f64) -> f64 {
    lost_timeout.max(rtt_bound) * lateness
}

/// When data first seen unacknowledged at `since` on the link of `p` may be judged: after [`ack_wait`], not before
/// the end of a stall's quiet window (`quiet`) nor of the link's settling window.
fn ack_deadline(lost_timeout: f64, lateness: f64, quiet: f64, p: &Peer, since: f64) -> f64 {
    (since + ack_wait(lost_timeout, lateness, p.rtt_bound)).max(quiet).max(p.connected_at + LINK_SETTLE)
}

/// Prefix of the drain reason of a fabric-down node ([`FabricWatch`]): `fabric-down: hsn0`. Rank 0 tells these
/// drains by it (only they are undone by `tbon.job_network_undrain_after`).
pub const FABRIC_REASON_PREFIX: &str = "fabric-down: ";

/// The drain reason of a node whose job network `iface` is down: `fabric-down: IFACE`.
pub fn fabric_reason(iface: &str) -> String {
    format!("{FABRIC_REASON_PREFIX}{iface}")
}

/// A verdict of the fabric-down rule ([`FabricWatch`]) on one child node.
#[derive(Clone, Debug, PartialEq)]
pub enum FabricVerdict {
    /// The node's job network stopped answering while its management network answers: drain it with `reason`
    /// ([`fabric_reason`]) and raise an exception on the jobs with tasks there; the node is not lost.
    Down {
        /// Child rank.
        rank: u32,
        /// `fabric-down: IFACE`.
        reason: String,
    },
    /// Its job network has answered without a miss for `tbon.job_network_undrain_after`: undrain it if the
    /// fabric-down rule drained it.
    Up {
        /// Child rank.
        rank: u32,
    },
}

/// The **fabric-down** rule: a node whose job network (`tbon.job_network`, a high-speed fabric that carries the
/// jobs' MPI traffic) stops answering while its management network (the overlay's) still answers.
///
/// A parent probes each child on both networks, each every `tbon.probe_period`, and counts the misses of each the
/// same way (`crate::probe`: a period without news past the child's reply time is a miss, once the child has
/// answered [`crate::probe::ARM_REPLIES`] times). What it observes of a child goes to [`FabricWatch::observe`]:
/// - `tbon.probe_misses` misses in a row on the job network while the management network answers (no miss
///   there, the broker's heartbeat fresh): **fabric-down**, [`FabricVerdict::Down`]. The node stays in the
///   instance (its broker is fine); rank 0 drains it with the reason `fabric-down: IFACE` and fails or notifies
///   the jobs with tasks there as node loss does (`crate::jobs::JobCore::fabric_down`). The verdict is given once
///   until the node is up again.
/// - both networks silent: no verdict here; the node-loss rules of [`Membership`] judge it (a dead node must be
///   lost, not drained).
/// - the management network silent or the broker stalled, the job network answering or not: no verdict (the
///   job-network responder is the broker's own thread, which a stalled broker stops too).
/// - a fabric-down node whose job network has answered without a miss for `tbon.job_network_undrain_after`:
///   [`FabricVerdict::Up`]. By default (infinite) only an admin undrains it (`vigil resource undrain`), and the
///   node is judged afresh as soon as its job network answers, so that a later cut drains it again.
///
/// Time passed in (seconds on any monotonic clock); the prober observes a child when what it saw changes, and
/// once a second besides (the undrain timer is judged then).
#[derive(Debug, Default)]
pub struct FabricWatch {
    misses: u32,
    undrain_after: f64,
    nodes: BTreeMap<u32, FabricNode>,
}

#[derive(Debug)]
struct FabricNode {
    iface: String,
    down: bool,
    /// While down: since when its job network has answered without a miss.
    answering_since: Option<f64>,
}

impl FabricWatch {
    /// The rule with `tbon.probe_misses` (`misses`, at least 1) and `tbon.job_network_undrain_after`
    /// (`undrain_after`, seconds; infinite or NaN: never).
    pub fn new(misses: u32, undrain_after: f64) -> FabricWatch {
        FabricWatch { misses: misses.max(1), undrain_after, nodes: BTreeMap::new() }
    }

    /// Child `rank` has a job network on interface `iface` (its hello said so): watch it (anew).
    pub fn watch(&mut self, rank: u32, iface: &str) {
        self.nodes.insert(rank, FabricNode { iface: iface.to_string(), down: false, answering_since: None });
    }

    /// Child `rank` is gone from this parent.
    pub fn forget(&mut self, rank: u32) {
        self.nodes.remove(&rank);
    }

    /// Whether child `rank` is fabric-down now.
    pub fn is_down(&self, rank: u32) -> bool {
        self.nodes.get(&rank).is_some_and(|n| n.down)
    }

    /// What the prober sees of child `rank` at `now`: `fabric_missed` job-network probes missed in a row (0: it
    /// answers), and whether its management network answers (`mgmt_ok`: no miss, its broker's heartbeat fresh).
    /// Returns the verdict, if this observation makes one.
    pub fn observe(&mut self, now: f64, rank: u32, fabric_missed: u32, mgmt_ok: bool) -> Option<FabricVerdict> {
        let n = self.nodes.get_mut(&rank)?;
        if !n.down {
            if fabric_missed >= self.misses && mgmt_ok {
                n.down = true;
                n.answering_since = None;
                return Some(FabricVerdict::Down { rank, reason: fabric_reason(&n.iface) });
            }
            return None;
        }
        if fabric_missed > 0 {
            n.answering_since = None;
            return None;
        }
        if !self.undrain_after.is_finite() {
            // Only an admin undrains it; judged afresh from now on, so that a later cut is seen again.
            n.down = false;
            return None;
        }
        let since = *n.answering_since.get_or_insert(now);
        if now - since >= self.undrain_after {
            n.down = false;
            n.answering_since = None;
            return Some(FabricVerdict::Up { rank });
        }
        None
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_stale_probe_reply_after_a_resume_does_not_make_the_broker_torpid_again() {
        let cfg = Config::default();
        let mut m = Membership::new(cfg);
        m.signal(0.0, 1, Signal::Connected);
        m.signal(0.01, 1, Signal::ProbeReply { kernel: true, alive: true, hb_age: 0.0 });
        // Stalled: the kernel reports a heartbeat 0.6 s old.
        let t = m.signal(0.6, 1, Signal::ProbeReply { kernel: true, alive: true, hb_age: 0.6 });
        assert_eq!(t.first().map(|t| t.to), Some(PeerState::Torpid));
        // Resumed: it talks to us, then a reply computed from the old heartbeat arrives.
        assert_eq!(m.signal(0.9, 1, Signal::Traffic).first().map(|t| t.to), Some(PeerState::Online));
        assert!(m.signal(0.902, 1, Signal::ProbeReply { kernel: true, alive: true, hb_age: 0.9 }).is_empty());
        assert_eq!(m.state(1), PeerState::Online);
        // A later stall (no traffic since) is still seen.
        let t = m.signal(1.6, 1, Signal::ProbeReply { kernel: true, alive: true, hb_age: 0.6 });
        assert_eq!(t.first().map(|t| t.to), Some(PeerState::Torpid));
    }

    use super::*;

    fn m() -> Membership {
        let mut m = Membership::new(Config::default());
        m.signal(0.0, 1, Signal::Connected);
        m
    }

    /// A torpid peer's reason is shown for as long as it stays torpid: it names the threshold crossed, not a
    /// silence measured once and stale a second later.
    #[test]
    fn torpid_reasons_name_the_threshold() {
        let cfg = Config::default();
        let want = format!("longer than tbon.torpid_max ({:.0} ms)", cfg.torpid_max * 1e3);
        let mut a = m();
        let t = a.tick(cfg.torpid_max * 3.0);
        assert_eq!(t[0].to, PeerState::Torpid);
        assert!(t[0].reason.starts_with("broker silent ") && t[0].reason.contains(&want), "{}", t[0].reason);
        let mut b = m();
        b.signal(0.01, 1, Signal::ProbeReply { kernel: true, alive: true, hb_age: 0.0 });
        let t = b.signal(2.0, 1, Signal::ProbeReply { kernel: true, alive: true, hb_age: 2.0 });
        assert_eq!(t[0].to, PeerState::Torpid);
        let want = format!("longer than tbon.stall_max ({:.0} ms", cfg.stall_max * 1e3);
        assert!(t[0].reason.starts_with("broker stalled ") && t[0].reason.contains(&want), "{}", t[0].reason);
    }

    #[test]
    fn close_without_goodbye_is_lost_at_once() {
        let mut m = m();
        let t = m.signal(0.001, 1, Signal::Closed("connection reset".into()));
        assert_eq!(t[0].to, PeerState::Lost);
        assert!(m.signal(0.002, 1, Signal::Traffic).is_empty(), "lost is final");
        let mut m2 = self::m();
        assert_eq!(m2.signal(0.1, 1, Signal::Goodbye)[0].to, PeerState::Offline);
    }

    #[test]
    fn stalled_broker_is_torpid_never_lost_while_its_kernel_acks() {
        let mut m = m();
        let mut t = 0.0;
        let mut saw_torpid = None;
        // 10 s of SIGSTOP: no traffic, but every heartbeat is ACKed by the kernel within a millisecond.
        while t < 10.0 {
            t += 0.05;
            for tr in m.signal(t, 1, Signal::KernelAck { unacked: 0, last_ack_age: 0.001 }) {
                assert_ne!(tr.to, PeerState::Lost, "{tr:?}");
                if tr.to == PeerState::Torpid {
                    saw_torpid.get_or_insert(t);
                }
            }
            for tr in m.tick(t) {
                assert_ne!(tr.to, PeerState::Lost);
                if tr.to == PeerState::Torpid {
                    saw_torpid.get_or_insert(t);
                }
            }
        }
        let at = saw_torpid.expect("torpid");
        assert!(at <= 1.0, "torpid within 1 s, at {at}");
        assert_eq!(m.signal(t, 1, Signal::Traffic)[0].to, PeerState::Online, "lively after SIGCONT");
    }

    const PARENT_KEY: u32 = u32::MAX;

    /// The TCP rule made `rank` suspect (and nothing else), and no path reached its node: the transitions.
    fn unconfirmed(m: &mut Membership, now: f64, rank: u32) -> Vec<Transition> {
        assert_eq!(m.take_suspects(), vec![rank], "suspect");
        assert!(m.confirming(rank));
        m.confirmed(now, rank, false, "no path answered")
    }

    #[test]
    fn observer_stall_is_not_blamed_on_peers() {
        let mut m = m();
        m.signal(0.0, 1, Signal::Traffic);
        // We were stopped from 0.0 to 4.0: the peer's heartbeats are still queued, unread.
        m.grace(4.0, 4.0);
        assert!(m.tick(4.0).is_empty());
        assert_eq!(m.state(1), PeerState::Online);
        // Real silence after the stall still counts.
        assert_eq!(m.tick(4.0 + Config::default().torpid_max).first().map(|t| t.to), Some(PeerState::Torpid));
    }

    #[test]
    fn after_a_stall_unacknowledged_data_waits_for_tcp_backoff_as_long_as_the_stall() {
        let cfg = Config::default();
        let mut m = Membership::new(cfg);
        m.signal(0.0, PARENT_KEY, Signal::Connected);
        // The whole node was stalled 2 s; data sent before it waits for a backed-off retransmission.
        m.grace(2.0, 2.0);
        m.signal(2.05, PARENT_KEY, Signal::KernelAck { unacked: 3, last_ack_age: 2.05 });
        let t =
            m.signal(2.05 + cfg.lost_timeout * 2.0, PARENT_KEY, Signal::KernelAck { unacked: 3, last_ack_age: 2.3 });
        assert!(t.iter().all(|t| t.to != PeerState::Lost), "lost during the TCP backoff after our own stall: {t:?}");
        // (The TCP verdict's deadline waits for the end of that window; the torpid one comes at 2.5 s.)
        assert_eq!(m.next_deadline(), Some(2.0 + cfg.torpid_max));
        // Still unacknowledged once the stall's length has passed again: lost.
        let t = m.signal(4.1, PARENT_KEY, Signal::KernelAck { unacked: 3, last_ack_age: 4.1 });
        assert!(t.iter().all(|t| t.to != PeerState::Lost), "suspect first, never lost on TCP alone: {t:?}");
        let t = unconfirmed(&mut m, 4.1, PARENT_KEY);
        assert_eq!(t.first().map(|t| t.to), Some(PeerState::Lost), "{t:?}");
    }

    #[test]
    fn kernel_probe_rules() {
        let cfg = Config::default();
        let mut m = m();
        // Userspace replies never arm the miss rule.
        m.signal(0.01, 1, Signal::ProbeReply { kernel: false, alive: true, hb_age: 0.0 });
        assert!(m.signal(0.05, 1, Signal::ProbeMissed { misses: 10 }).is_empty());
        // A kernel reply arms it; fewer than probe_misses misses are tolerated.
        assert!(m.signal(0.06, 1, Signal::ProbeReply { kernel: true, alive: true, hb_age: 0.01 }).is_empty());
        assert!(m.signal(0.08, 1, Signal::ProbeMissed { misses: cfg.probe_misses - 1 }).is_empty());
        let t = m.signal(0.09, 1, Signal::ProbeMissed { misses: cfg.probe_misses });
        assert_eq!(t[0].to, PeerState::Lost);
        assert!(t[0].reason.contains("unanswered by its kernel"), "{}", t[0].reason);

        // The parent's misses alone make no verdict (a child has no other child to compare with, so links that
        // slowed down look, by probes alone, like a dead parent): they stop vouching for its node, which is then
        // judged by the TCP rule, confirmed.
        let mut m = self::m();
        m.signal(0.0, PARENT_KEY, Signal::Connected);
        m.signal(0.06, PARENT_KEY, Signal::ProbeReply { kernel: true, alive: true, hb_age: 0.01 });
        m.signal(0.1, PARENT_KEY, Signal::Traffic);
        for (i, t) in [0.12, 0.2, 0.4].into_iter().enumerate() {
            let tr = m.signal(t, PARENT_KEY, Signal::ProbeMissed { misses: cfg.probe_misses + i as u32 });
            assert!(tr.is_empty(), "parent judged on probes alone: {tr:?}");
        }
        m.signal(0.45, PARENT_KEY, Signal::KernelAck { unacked: 2, last_ack_age: 0.3 });
        m.signal(0.45 + cfg.lost_timeout + 0.01, PARENT_KEY, Signal::KernelAck { unacked: 2, last_ack_age: 0.5 });
        m.tick(0.45 + cfg.lost_timeout + 0.01);
        assert_eq!(m.take_suspects(), vec![PARENT_KEY], "no longer vouched for: the TCP rule suspects it");

        // Broker dead per the kernel: lost at once.
        let mut m = self::m();
        let t = m.signal(0.1, 1, Signal::ProbeReply { kernel: true, alive: false, hb_age: 0.0 });
        assert_eq!(t[0].to, PeerState::Lost);

        // Stalled broker: torpid from its heartbeat age, never lost while the kernel answers, even with TCP data
        // outstanding for far longer than lost_timeout.
        let mut m = self::m();
        let mut t = 0.0;
        let mut torpid_at = None;
        while t < 5.0 {
            t += cfg.probe_period;
            let age = t; // the broker stopped at 0
            let mut tr = m.signal(t, 1, Signal::ProbeReply { kernel: true, alive: true, hb_age: age });
            tr.extend(m.signal(t, 1, Signal::KernelAck { unacked: 3, last_ack_age: t }));
            tr.extend(m.tick(t));
            for x in tr {
                assert_ne!(x.to, PeerState::Lost, "{x:?}");
                if x.to == PeerState::Torpid {
                    torpid_at.get_or_insert(t);
                    assert!(x.reason.contains("kernel answers"), "{}", x.reason);
                }
            }
        }
        let at = torpid_at.expect("torpid");
        assert!(at >= cfg.stall_max - 1e-9 && at <= cfg.stall_max + 0.02, "torpid at {at}");
        // Once the kernel goes quiet for good (no reply for KERNEL_REPLY_STALE), the TCP rule applies again.
        assert!(m.signal(t, 1, Signal::ProbeMissed { misses: 1 }).is_empty());
        let t1 = t + cfg.lost_timeout;
        assert!(m.signal(t1, 1, Signal::KernelAck { unacked: 3, last_ack_age: t1 }).is_empty(), "one miss");
        let t2 = t + KERNEL_REPLY_STALE + cfg.lost_timeout;
        assert!(m.signal(t2, 1, Signal::KernelAck { unacked: 3, last_ack_age: t2 }).is_empty());
        let tr = unconfirmed(&mut m, t2, 1);
        assert_eq!(tr.first().map(|x| x.to), Some(PeerState::Lost), "{tr:?}");

        // A link blip: TCP data stays unacknowledged far longer than lost_timeout while the kernel keeps answering
        // (or misses fewer than probe_misses): never lost.
        let mut m = self::m();
        m.signal(0.0, 1, Signal::ProbeReply { kernel: true, alive: true, hb_age: 0.01 });
        let mut t = 0.0;
        while t < 1.0 {
            t += 0.05;
            let mut tr = m.signal(t, 1, Signal::KernelAck { unacked: 2, last_ack_age: t });
            if (t * 100.0).round() as i64 % 20 == 0 {
                tr.extend(m.signal(t, 1, Signal::ProbeMissed { misses: cfg.probe_misses - 1 }));
                tr.extend(m.signal(t, 1, Signal::ProbeReply { kernel: true, alive: true, hb_age: 0.01 }));
            }
            tr.extend(m.tick(t));
            assert!(tr.iter().all(|x| x.to != PeerState::Lost), "at {t}: {tr:?}");
        }
        assert_ne!(m.state(1), PeerState::Lost);
    }

    #[test]
    fn silent_node_is_lost_after_lost_timeout() {
        let mut m = m();
        m.signal(1.0, 1, Signal::Traffic);
        // Heartbeat sent at 1.0 never acknowledged; first seen outstanding at the 1.05 sample.
        assert!(m.signal(1.05, 1, Signal::KernelAck { unacked: 1, last_ack_age: 0.05 }).is_empty());
        let d = m.next_deadline().unwrap();
        assert!((d - 1.17).abs() < 1e-9, "{d}");
        assert!(m.tick(1.16).is_empty());
        assert!(!m.take_ack_check(1.16), "not due yet");
        // At the deadline the timer alone judges nothing: it asks for a fresh sample, once.
        assert!(m.tick(1.17).is_empty());
        assert!(m.take_ack_check(1.17));
        assert!(!m.take_ack_check(1.17), "asked already");
        assert!(m.next_deadline().is_none_or(|d| d > 1.17), "no busy loop while the sample is awaited");
        assert!(m.signal(1.17, 1, Signal::KernelAck { unacked: 1, last_ack_age: 0.17 }).is_empty());
        // Suspect, and confirmed: no path reached its node.
        let t = unconfirmed(&mut m, 1.29, 1);
        assert_eq!(t[0].to, PeerState::Lost);
        assert!(t[0].reason.contains("no TCP acknowledgement") && t[0].reason.contains("no path answered"));
    }

    /// The regression a loaded CI machine found: a sample sees a heartbeat in flight (normal), then our broker
    /// is starved for a little less than torpid_max. Waking past the deadline, it must look again before it
    /// judges: the peer's kernel acknowledged long ago.
    #[test]
    fn a_late_observer_judges_on_a_fresh_sample_not_the_one_before_its_stall() {
        let cfg = Config::default();
        let mut m = m();
        m.signal(1.0, 1, Signal::Traffic);
        assert!(m.signal(1.0, 1, Signal::KernelAck { unacked: 1, last_ack_age: 0.04 }).is_empty());
        // Starved until 1.0 + 2.5 × lost_timeout (< torpid_max: no grace applies).
        let woke = 1.0 + 2.5 * cfg.lost_timeout;
        assert!(woke - 1.0 < cfg.torpid_max);
        assert!(m.tick(woke).iter().all(|t| t.to != PeerState::Lost), "judged on the stale sample");
        assert!(m.take_ack_check(woke), "a fresh sample is asked for");
        // The fresh sample: the heartbeat was acknowledged 1 ms after the first sample; new data in flight now.
        let t = m.signal(woke, 1, Signal::KernelAck { unacked: 1, last_ack_age: woke - 1.001 });
        assert!(t.iter().all(|t| t.to != PeerState::Lost), "{t:?}");
        assert_eq!(m.state(1), PeerState::Online);
    }

    #[test]
    fn a_starved_sender_is_not_mistaken_for_a_dead_peer() {
        // Our broker was starved for 2 s (sent nothing, so nothing was ACKed), then sends a heartbeat and samples
        // at once: the data is outstanding for microseconds, but the last ACK is 2 s old. Not lost.
        let mut m = m();
        assert!(m
            .signal(2.0, 1, Signal::KernelAck { unacked: 1, last_ack_age: 2.0 })
            .iter()
            .all(|t| t.to != PeerState::Lost));
        assert!(m.tick(2.01).iter().all(|t| t.to != PeerState::Lost));
        // ACKed by the next sample.
        assert!(m
            .signal(2.05, 1, Signal::KernelAck { unacked: 0, last_ack_age: 0.04 })
            .iter()
            .all(|t| t.to != PeerState::Lost));
        assert!(m.tick(2.5).iter().all(|t| t.to != PeerState::Lost));
    }

    #[test]
    fn progress_between_late_samples_restarts_the_count() {
        // Samples 200 ms apart (our broker starved); data outstanding at both, but the peer ACKed in between.
        let mut m = m();
        m.signal(1.0, 1, Signal::KernelAck { unacked: 1, last_ack_age: 0.3 });
        let t = m.signal(1.2, 1, Signal::KernelAck { unacked: 1, last_ack_age: 0.199 });
        assert!(t.iter().all(|t| t.to != PeerState::Lost), "{t:?}");
        assert!(m.tick(1.3).iter().all(|t| t.to != PeerState::Lost));
        // No progress at all afterwards: lost.
        m.signal(1.36, 1, Signal::KernelAck { unacked: 2, last_ack_age: 0.359 });
        let t = unconfirmed(&mut m, 1.36, 1);
        assert!(t.iter().any(|t| t.to == PeerState::Lost), "{t:?}");
    }

    /// A suspect whose node answered a check is not lost: the clock restarts, and it is suspected again only
    /// after another `tbon.lost_timeout` of unacknowledged data.
    #[test]
    fn a_suspect_whose_node_answers_is_not_lost() {
        let cfg = Config::default();
        let mut m = m();
        m.signal(2.0, 1, Signal::KernelAck { unacked: 1, last_ack_age: 0.0 });
        assert!(m.signal(2.2, 1, Signal::KernelAck { unacked: 1, last_ack_age: 0.2 }).is_empty());
        assert_eq!(m.take_suspects(), vec![1]);
        // No second suspicion while the first is being confirmed.
        assert!(m.signal(2.25, 1, Signal::KernelAck { unacked: 1, last_ack_age: 0.25 }).is_empty());
        assert!(m.take_suspects().is_empty());
        assert!(m.confirmed(2.3, 1, true, "").is_empty());
        assert_eq!(m.state(1), PeerState::Torpid, "silent since it connected: torpid, not lost");
        assert!(!m.confirming(1));
        // Still unacknowledged: counted again from the next sample.
        m.signal(2.35, 1, Signal::KernelAck { unacked: 1, last_ack_age: 0.35 });
        assert!(m.take_suspects().is_empty(), "not before lost_timeout again");
        m.signal(2.35 + cfg.lost_timeout, 1, Signal::KernelAck { unacked: 1, last_ack_age: 0.5 });
        assert_eq!(m.take_suspects(), vec![1]);
        // Acknowledged while the confirmation ran: a late "no answer" loses nothing.
        m.signal(2.5, 1, Signal::KernelAck { unacked: 0, last_ack_age: 0.0 });
        assert!(m.confirmed(2.6, 1, false, "no path answered").is_empty());
        assert_eq!(m.state(1), PeerState::Torpid);
    }

    /// No link is judged on unacknowledged data during its first LINK_SETTLE seconds.
    #[test]
    fn a_new_link_is_not_judged_before_it_settled() {
        let mut m = m();
        m.signal(0.1, 1, Signal::KernelAck { unacked: 1, last_ack_age: 0.1 });
        for t in [0.1, 0.2, 0.3, LINK_SETTLE - 0.01] {
            assert!(m
                .signal(t, 1, Signal::KernelAck { unacked: 1, last_ack_age: t })
                .iter()
                .all(|t| t.to != PeerState::Lost));
            assert!(m.take_suspects().is_empty(), "suspected at {t}");
        }
        assert!(m.next_deadline().is_some_and(|d| d >= LINK_SETTLE - 1e-9));
        m.signal(LINK_SETTLE, 1, Signal::KernelAck { unacked: 1, last_ack_age: LINK_SETTLE });
        assert_eq!(m.take_suspects(), vec![1]);
    }

    /// A late judge stretches lost_timeout by its lateness factor.
    #[test]
    fn a_late_judge_waits_longer() {
        let cfg = Config::default();
        let mut m = m();
        m.set_lateness(3.0);
        m.signal(2.0, 1, Signal::KernelAck { unacked: 1, last_ack_age: 0.0 });
        m.signal(2.0 + cfg.lost_timeout * 2.0, 1, Signal::KernelAck { unacked: 1, last_ack_age: 0.3 });
        assert!(m.take_suspects().is_empty(), "judged before 3 x lost_timeout");
        assert!((m.next_deadline().unwrap() - (2.0 + 3.0 * cfg.lost_timeout)).abs() < 1e-9);
        m.signal(2.0 + cfg.lost_timeout * 3.0, 1, Signal::KernelAck { unacked: 1, last_ack_age: 0.4 });
        assert_eq!(m.take_suspects(), vec![1]);
        // Nonsense factors count as 1.
        m.set_lateness(f64::NAN);
        m.set_lateness(-4.0);
    }

    #[test]
    fn saturated_but_alive_never_lost() {
        // CPU saturation: traffic arrives late and irregularly (up to 400 ms gaps), ACKs within 40 ms
        // (delayed ACK). Never lost; torpid allowed only for gaps longer than torpid_max.
        let mut m = m();
        let mut t = 0.0;
        let mut seed: u64 = 7;
        for _ in 0..100_000 {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let gap = (seed >> 33) as f64 / (1u64 << 31) as f64 * 0.4;
            t += 0.05;
            let ack_age = ((seed >> 20) & 0xff) as f64 / 255.0 * 0.04;
            for tr in m.signal(t, 1, Signal::KernelAck { unacked: 1, last_ack_age: ack_age }) {
                assert_ne!(tr.to, PeerState::Lost);
            }
            if gap < 0.2 {
                m.signal(t, 1, Signal::Traffic);
            }
            for tr in m.tick(t) {
                assert_ne!(tr.to, PeerState::Lost);
            }
        }
    }

    #[test]
    fn many_peers_virtual_time() {
        // 16384 peers; every 7th goes silent at t=1 (node gone), every 11th stalls; the rest stay healthy.
        let mut m = Membership::new(Config::default());
        let n = 16384u32;
        for r in 1..=n {
            m.signal(0.0, r, Signal::Connected);
        }
        let mut t = 0.0;
        while t < 3.0 {
            t += 0.05;
            for r in 1..=n {
                let gone = r % 7 == 0 && t > 1.0;
                let stalled = r % 11 == 0 && !gone && t > 1.0;
                if gone {
                    m.signal(t, r, Signal::KernelAck { unacked: 2, last_ack_age: t - 1.0 });
                } else {
                    m.signal(t, r, Signal::KernelAck { unacked: 0, last_ack_age: 0.0 });
                    if !stalled {
                        m.signal(t, r, Signal::Traffic);
                    }
                }
            }
            m.tick(t);
            // Every suspect is a node that is gone: no path reaches it.
            for r in m.take_suspects() {
                assert_eq!(r % 7, 0, "rank {r} suspected");
                m.confirmed(t, r, false, "no path answered");
            }
        }
        for r in 1..=n {
            let want = if r % 7 == 0 {
                PeerState::Lost
            } else if r % 11 == 0 {
                PeerState::Torpid
            } else {
                PeerState::Online
            };
            assert_eq!(m.state(r), want, "rank {r}");
        }
    }

    /// The fabric-down rule in virtual time, fed as the prober feeds it: one observation per 10 ms period.
    mod fabric {
        use super::super::*;

        const P: f64 = 0.01;

        /// Feeds `periods` periods from `t` of (job-network missed in a row, management ok); the verdicts.
        fn run(
            w: &mut FabricWatch,
            t: &mut f64,
            periods: u32,
            fabric_silent: bool,
            mgmt_ok: bool,
        ) -> Vec<FabricVerdict> {
            let mut out = Vec::new();
            let mut missed = 0;
            for _ in 0..periods {
                *t += P;
                missed = if fabric_silent { missed + 1 } else { 0 };
                out.extend(w.observe(*t, 3, missed, mgmt_ok));
            }
            out
        }

        #[test]
        fn a_silent_job_network_on_a_live_node_is_fabric_down_after_the_probe_misses() {
            let mut w = FabricWatch::new(3, f64::INFINITY);
            w.watch(3, "hsn0");
            let mut t = 0.0;
            assert!(run(&mut w, &mut t, 100, false, true).is_empty(), "both answer: nothing");
            // Two misses are not enough; the third is (tbon.probe_misses = 3), once, 30 ms after the cut.
            assert_eq!(w.observe(t + P, 3, 1, true), None);
            assert_eq!(w.observe(t + 2.0 * P, 3, 2, true), None);
            let v = w.observe(t + 3.0 * P, 3, 3, true);
            assert_eq!(v, Some(FabricVerdict::Down { rank: 3, reason: "fabric-down: hsn0".into() }));
            assert!(w.is_down(3));
            assert_eq!(w.observe(t + 4.0 * P, 3, 4, true), None, "said once");
            // An unwatched child (no job network) is never judged.
            assert_eq!(w.observe(t, 4, 99, true), None);
        }

        #[test]
        fn a_dead_or_stalled_node_is_not_fabric_down() {
            let mut w = FabricWatch::new(3, f64::INFINITY);
            w.watch(3, "hsn0");
            let mut t = 0.0;
            // The whole node silent (the management network misses too): the node-loss rules judge it.
            assert!(run(&mut w, &mut t, 50, true, false).is_empty());
            assert!(!w.is_down(3));
            // Its broker stalled (the management kernel answers, the heartbeat is stale: not ok): nothing either.
            let mut w = FabricWatch::new(3, f64::INFINITY);
            w.watch(3, "hsn0");
            assert!(run(&mut w, &mut t, 50, true, false).is_empty());
            // Forgotten (re-parented away): never judged again here.
            w.forget(3);
            assert!(run(&mut w, &mut t, 50, true, true).is_empty());
        }

        #[test]
        fn by_default_only_the_admin_undrains_and_a_second_cut_is_seen_again() {
            let mut w = FabricWatch::new(3, f64::INFINITY);
            w.watch(3, "ib0");
            let mut t = 0.0;
            assert_eq!(run(&mut w, &mut t, 3, true, true).len(), 1);
            // It answers again for an hour: no undrain verdict.
            assert!(run(&mut w, &mut t, 360_000, false, true).is_empty());
            // Cut again: drained again.
            assert_eq!(
                run(&mut w, &mut t, 3, true, true),
                vec![FabricVerdict::Down { rank: 3, reason: "fabric-down: ib0".into() }]
            );
        }

        #[test]
        fn with_undrain_after_a_stable_job_network_undrains_and_a_flap_restarts_the_wait() {
            let mut w = FabricWatch::new(3, 0.995);
            w.watch(3, "hsn0");
            let mut t = 0.0;
            assert_eq!(run(&mut w, &mut t, 5, true, true).len(), 1);
            // 0.5 s of answers, a miss, then answers: the second stretch is timed from its own start.
            assert!(run(&mut w, &mut t, 50, false, true).is_empty());
            assert!(run(&mut w, &mut t, 1, true, true).is_empty(), "one miss: no new verdict");
            let before = t;
            let mut up = None;
            for _ in 0..200 {
                t += P;
                if let Some(v) = w.observe(t, 3, 0, true) {
                    up = Some((t - before, v));
                    break;
                }
            }
            let (after, v) = up.expect("undrained");
            assert_eq!(v, FabricVerdict::Up { rank: 3 });
            assert!((after - 1.01).abs() < 1e-6, "1 s after the first answer of the stretch, got {after}");
            assert!(!w.is_down(3));
        }
    }
}
