//! Re-parenting rules: a TBON that heals when a router dies (docs/failure-detection.md, "Re-parenting").
//!
//! - **Who adopts.** A broker whose parent `P` is lost (any verdict of the membership machine, or its link closed)
//!   tries, in order, the *static siblings* of `P` (the other children of `P`'s own parent in `tbon.topo`), starting
//!   at its own position among `P`'s children so that `P`'s orphans spread over `P`'s siblings one or two each;
//!   then `P`'s ancestors, nearest first, ending at rank 0 ([`candidates`]); those rank 0 has announced lost
//!   (`overlay.lost` events, [`Broker::known_lost`]) are asked last, since each dead one costs a whole
//!   [`CANDIDATE_TIMEOUT`] (an orphan misses the events sent while it had no parent). Every candidate sits higher
//!   in the static tree than the orphan (a smaller [`Topology::level`]), so an adoption can never close a cycle,
//!   however many routers die and in whatever order. Ranks never change. A broker whose parent is rank 0 has
//!   nothing above rank 0 to adopt it: it waits for rank 0 for `tbon.parent_grace` (`rejoin.rs`), else exits.
//! - **Who accepts.** A broker accepts an adoptee (a hello carrying `adopt`, its own static child coming back
//!   after its adopter was lost included) when it is higher in the static tree than the adoptee and has fewer
//!   than [`adopt_limit`] children; otherwise it refuses and the orphan tries its next candidate. A static child
//!   joining with a plain hello (a restarted broker) is never refused for the count: its static parent is its only
//!   way in, so a broker holds at most its static children plus [`adopt_limit`]. Nobody adopts a rank rank 0
//!   has announced lost: it was cut off, not dead (a partition healed), its jobs have had their exceptions and
//!   its resources are out of the pool; it rejoins by restarting. Refused by every candidate, it exits as an
//!   orphan that found no parent, and its children re-parent.
//! - **Last resort.** A refusal for capacity alone says so ([`Refusal::full`], the `refused` message's `full`).
//!   When the candidates ran out, at least one refused the orphan for capacity and none refused it for another
//!   reason (those that did not answer are dead or cut off, and do not count), the orphan makes one last round:
//!   it asks rank 0 again with `last_resort` in its hello ([`ask_adoption`]), and rank 0 adopts it past its
//!   limit. A loaded rank 0 is slower; a live node cut off loses its jobs (found by the simulator: `restart`,
//!   kary:8, 256 brokers, seed 6, where every live candidate of an orphan was full). Rank 0 says so in its log,
//!   once per adoption. Nobody else adopts past its limit, and rank 0 honours the mark only in an authenticated
//!   hello that passed every other check (a rank of this instance, below rank 0, not announced lost, not
//!   already connected): one child per rank, so however many such hellos come, rank 0 holds fewer children than
//!   the instance has brokers. An older rank 0 ignores the mark and refuses as before; an older candidate's
//!   refusal lacks `full` and counts as a refusal for another reason, so no last round is made.
//! - **Who learns.** The adopter at once, every broker on the adopter's path to rank 0 as the orphan's
//!   `overlay.reparent` request passes up through it, and then every broker from rank 0's `overlay.reparent`
//!   event: routing uses each rank's current parent ([`Broker::next_hop`]). Rank 0 records a `reparent` event in
//!   `resource.eventlog` (the subtree's `idset`, the new `parent`, the `lost` one, and `ms`, the orphan's own time
//!   from its verdict on its parent to its adoption).
//! - **Meanwhile.** What the orphan sends up while it has no parent is queued, up to [`UP_QUEUE_MAX`] messages
//!   and [`UP_QUEUE_BYTES`]; past either bound a request gets EHOSTUNREACH and anything else is dropped (counted
//!   in the log). Requests that were in flight through the dead router got EHOSTUNREACH: those going down from
//!   its parent, those going up from the orphan that sent them ([`Broker::fail_sent_up`]), since whether the
//!   router passed them on before it died cannot be known. Job shells' exit reports are kept until rank 0
//!   answers them and sent again by the orphan once it re-parents, and by every broker below it when rank 0's
//!   `overlay.reparent` event for it comes down ([`Broker::on_reparent_event`]): theirs went up through the
//!   orphan too. So are a broker's verdicts on its lost children until rank 0 announces them
//!   ([`Broker::lost_reports`]; the `overlay.lost` notice asks for no answer): rank 0 takes each once, and none
//!   about a rank that has another parent by now ([`Broker::stale_lost_notice`]). So is an orphan's own
//!   `overlay.reparent` notice until rank 0's event for it comes down ([`Broker::reparent_report`]): one that died
//!   with a router on its way up would otherwise leave rank 0 to cut the live orphan off at its deadline (found
//!   by the 16,384-broker overload simulation).
//! - **Orphans that never come.** Rank 0 expects every child of a lost rank to re-parent within
//!   [`REPARENT_TIMEOUT`] (meanwhile they and the ranks below them are torpid: no new work goes there); one that
//!   does not is lost ("cut off"), and so on below it. An orphan re-parented is lively again even if its lost
//!   parent had judged it torpid (that judge will never say otherwise; the new one judges it afresh), and so
//!   are the ranks unreachable only behind it ([`Broker::record_reparent`]).
//! - **A router that returns** joins its static parent again as a leaf: its former children stay with their
//!   adopters (moving them back would cost their links a second reconnection for nothing). Its parent tells it
//!   the re-parents it missed (the `adopted` control message, sent to every child that joins while there are
//!   any); when it registers, rank 0 publishes an `overlay.reparent` event naming its static parent if it had
//!   been lost or adopted ([`Broker::on_register`]), so every broker that learned an adoption of it routes to it
//!   by its static parent again.
//! - **Rank 0 lost.** Nothing is above it: its children exit, unless `tbon.parent_grace` keeps them waiting for
//!   it to restart (`rejoin.rs`), with the same queue and the same exit reports kept.

use super::core::{Broker, Effect, MemberState, Time, SELF};
use crate::idset::IdSet;
use crate::jobs::JobId;
use crate::message::{errno, Message, MsgType, FLAG_NORESPONSE};
use crate::topology::{Hop, Topology};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::Duration;
use tracing::{debug, error, info, warn};

/// Messages an orphan queues for its next parent while it re-parents.
pub const UP_QUEUE_MAX: usize = 16_384;

/// Bytes of message payload an orphan queues for its next parent while it re-parents (16 MiB).
pub const UP_QUEUE_BYTES: usize = 16 << 20;

/// How long rank 0 waits for each child of a lost rank to re-parent before it declares it lost too. Long, because
/// an orphan that is stopped or starved re-parents only once it runs again, and a stalled broker must not be
/// lost; what it costs is the time to find an orphan that died together with its router (a double fault).
pub const REPARENT_TIMEOUT: Duration = Duration::from_secs(30);

/// The start of the reason of a rank unreachable while it (or a rank above it) re-parents.
pub const REPARENTING: &str = "unreachable while re-parenting: below rank";

/// How long an orphan waits for one candidate to accept it before it tries the next.
pub const CANDIDATE_TIMEOUT: Duration = Duration::from_millis(500);

/// Why a broker refuses a would-be child: what it is told (the `refused` control message's `errstr`) and
/// whether for capacity alone (`full`, sent as `"full": true`: the broker has the [`adopt_limit`] children it
/// adopts up to). An orphan refused for capacity by every live candidate asks rank 0 as a last resort (module
/// rules).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The reason, said to the peer and logged.
    pub why: String,
    /// Refused for capacity alone.
    pub full: bool,
}

impl Refusal {
    /// A refusal for capacity alone.
    pub fn full(why: String) -> Refusal {
        Refusal { why, full: true }
    }
}

impl From<String> for Refusal {
    fn from(why: String) -> Refusal {
        Refusal { why, full: false }
    }
}

impl From<&str> for Refusal {
    fn from(why: &str) -> Refusal {
        Refusal { why: why.to_string(), full: false }
    }
}

/// The hello field of an orphan's last round: rank 0, adopt me past your limit (module rules, "Last resort").
pub const LAST_RESORT: &str = "last_resort";

/// Add to `hello` what an orphan asks of a candidate parent (docs/wire-format.md): `adopt`, the rank of its lost
/// parent, and `last_resort: true` on its last round ([`LAST_RESORT`]; absent otherwise, which is `false`, so
/// that older brokers read the same hello as before).
pub fn ask_adoption(hello: &mut Value, lost: u32, last_resort: bool) {
    hello["adopt"] = json!(lost);
    if last_resort {
        hello[LAST_RESORT] = json!(true);
    }
}

/// An orphan's search for an adoptive parent.
#[derive(Debug)]
pub struct Reparent {
    /// The parent that was lost.
    pub lost: u32,
    /// The candidates, in the order tried ([`candidates`]).
    pub candidates: Vec<u32>,
    /// Index of the candidate being tried.
    pub trying: usize,
    /// When the parent was lost.
    pub since: Time,
    /// Messages waiting for the new parent, and their payload bytes.
    pub queue: Vec<Message>,
    pub queued_bytes: usize,
    /// Messages dropped because the queue was full.
    pub dropped: u64,
    /// Matchtags of this broker's own requests in the queue.
    pub queue_tags: std::collections::BTreeSet<u32>,
    /// Set when the parent lost is rank 0 and `tbon.parent_grace` keeps this broker waiting for it (`rejoin.rs`):
    /// until when, and when to try rank 0 again (`None`: an attempt is in flight).
    pub grace: Option<(Time, Option<Time>)>,
    /// The candidates that refused us for capacity alone ([`Refusal::full`]), in the order asked.
    pub full: Vec<u32>,
    /// Whether a candidate refused us for another reason (then no last round is made).
    pub declined: bool,
    /// Whether the last round is under way: rank 0, appended to `candidates`, asked to adopt us past its limit.
    pub last_resort: bool,
    /// Whether the parent left was never had: the static parent at start, out of reach
    /// ([`Input::FirstParentFailed`](super::core::Input::FirstParentFailed)), on which this is no verdict.
    pub at_start: bool,
}

impl Reparent {
    /// A re-parent of a broker whose parent `lost` was lost at `since`, trying `candidates` in order, nothing
    /// queued yet; `grace` as for [`Reparent::grace`].
    pub fn new(lost: u32, candidates: Vec<u32>, since: Time, grace: Option<(Time, Option<Time>)>) -> Reparent {
        Reparent {
            lost,
            candidates,
            trying: 0,
            since,
            queue: Vec::new(),
            queued_bytes: 0,
            dropped: 0,
            queue_tags: Default::default(),
            grace,
            full: Vec::new(),
            declined: false,
            last_resort: false,
            at_start: false,
        }
    }

    /// Whether, the candidates having run out, a last round asking rank 0 is due: some candidate refused us for
    /// capacity, none for another reason, and no last round was made yet.
    pub fn last_resort_due(&self) -> bool {
        !self.full.is_empty() && !self.declined && !self.last_resort && self.grace.is_none()
    }
}

/// Adoptive parents for `me`, whose parent `lost` was lost, in the order to try them (see the module rules):
/// the static siblings of `lost`, rotated by `me`'s position among `lost`'s static children, then the static
/// ancestors of `lost`, nearest first. Empty when `lost` is rank 0 (or not above `me`).
pub fn candidates(topo: Topology, size: u32, me: u32, lost: u32) -> Vec<u32> {
    let Some(grand) = topo.parent(size, lost) else { return Vec::new() };
    let mut out: Vec<u32> = topo.children(size, grand).into_iter().filter(|&s| s != lost).collect();
    if !out.is_empty() {
        let kids = topo.children(size, lost);
        let pos = kids.iter().position(|&k| k == me).unwrap_or(me as usize);
        let k = pos % out.len();
        out.rotate_left(k);
    }
    let mut a = Some(grand);
    while let Some(r) = a {
        out.push(r);
        a = topo.parent(size, r);
    }
    let mine = topo.level(size, me);
    out.retain(|&c| topo.level(size, c) < mine);
    out
}

/// The most children a broker has once it adopts: twice its tree's fanout (`kary:K`: 2K; otherwise twice the
/// most children any rank has in the static tree), and never fewer than its own static children plus two.
pub fn adopt_limit(topo: Topology, size: u32, me: u32) -> usize {
    let fanout = match topo {
        Topology::Kary(k) if k > 0 => k as usize,
        _ => topo.children(size, 0).len().max(1),
    };
    (2 * fanout).max(topo.children(size, me).len() + 2)
}

/// Field `k` of an `overlay.reparent` body: a rank below `size`, else EPROTO naming the field.
fn rank_field(body: &Value, k: &str, size: u32) -> Result<u32, (u32, String)> {
    body.get(k)
        .and_then(Value::as_u64)
        .and_then(|v| u32::try_from(v).ok())
        .filter(|v| *v < size)
        .ok_or((errno::EPROTO, format!("'{k}' must be a rank below the instance size {size}")))
}

/// The ranks an instance cannot lose and go on: with re-parenting (`reparent` true) rank 0 alone, since the
/// children of any other lost rank find a new parent; without it, rank 0 and every router
/// ([`Topology::critical_ranks`]), whose loss cuts off a subtree. A nested instance reports them to the enclosing
/// one, whose exec system applies the critical-rank rules to them (`jobs/nested.rs`).
pub fn critical_ranks(topo: Topology, size: u32, reparent: bool) -> IdSet {
    if reparent && size > 0 {
        IdSet::from_iter([0])
    } else {
        IdSet::from_iter(topo.critical_ranks(size))
    }
}

/// The ranks whose endpoints a broker `me` may ever connect to as its parent, ascending: its static parent, and
/// every adoptive parent it could be sent to ([`candidates`]) after the loss of any rank above it, whether in the
/// static tree or an adopter. A broker that bootstraps without every endpoint (a nested instance, from the
/// launcher's PMI KVS) fetches these and no more: about `levels × (fanout + levels)` of them.
pub fn parent_endpoints(topo: Topology, size: u32, me: u32) -> Vec<u32> {
    let mut out = std::collections::BTreeSet::new();
    let mut a = topo.parent(size, me);
    if let Some(p) = a {
        out.insert(p);
    }
    while let Some(r) = a {
        out.extend(candidates(topo, size, me, r));
        a = topo.parent(size, r);
    }
    out.into_iter().collect()
}

impl Broker {
    /// The current parent of `rank` as this broker knows it: its own current parent for itself, a learned
    /// adoption, else the static tree.
    pub fn parent_of(&self, rank: u32) -> Option<u32> {
        if rank == self.rank() {
            return self.parent;
        }
        match self.adopted.get(&rank) {
            Some(&p) => Some(p),
            None => self.opts.config.topo.parent(self.opts.size, rank),
        }
    }

    /// Where a request for `target` goes from here: walk `target`'s current ancestors; the one whose parent is
    /// this broker is the child to send to; reaching the root without passing here means up.
    pub fn next_hop(&self, target: u32) -> Hop {
        let me = self.rank();
        if target == me {
            return Hop::Local;
        }
        if self.adopted.is_empty() {
            return self.opts.config.topo.next_hop(self.opts.size, me, target);
        }
        let mut x = target;
        // Every current parent is higher in the static tree than its child: the walk ends within the depth.
        for _ in 0..=crate::topology::MAX_DEPTH * 2 {
            match self.parent_of(x) {
                None => return Hop::Parent,
                Some(p) if p == me => return Hop::Child(x),
                Some(p) => x = p,
            }
        }
        Hop::Parent
    }

    /// The current children of `rank` as this broker knows them (rank 0 knows every adoption).
    pub fn children_of(&self, rank: u32) -> Vec<u32> {
        let (topo, size) = self.tree();
        let mut v: Vec<u32> =
            topo.children(size, rank).into_iter().filter(|c| self.adopted.get(c).is_none_or(|&p| p == rank)).collect();
        v.extend(
            self.adopted.iter().filter(|(c, &p)| p == rank && topo.parent(size, **c) != Some(rank)).map(|(c, _)| *c),
        );
        v.sort_unstable();
        v
    }

    /// The ranks a request from here to `target` passes through, as this broker knows the tree now (current
    /// parents): from `target` up to, not including, this broker; empty for this broker itself. What a kill went
    /// along, to tell whether its route has changed since it failed ([`Broker::kill_unreachable`]).
    pub fn path_to(&self, target: u32) -> Vec<u32> {
        let me = self.rank();
        let mut out = Vec::new();
        let mut x = Some(target);
        // Every current parent is higher in the static tree than its child: the walk ends within the depth.
        for _ in 0..=crate::topology::MAX_DEPTH * 2 {
            match x {
                Some(r) if r != me => {
                    out.push(r);
                    x = self.parent_of(r);
                }
                _ => break,
            }
        }
        out
    }

    /// Rank 0: `signal` for the shell of job `id` on `rank` came back EHOSTUNREACH, sent along `path`
    /// ([`Broker::path_to`]): the job core keeps it until `rank` is reachable again (`jobs/kills.rs`), which
    /// [`Broker::record_reparent`] and [`Broker::on_register`] say. If the route has changed since it was sent
    /// (the rank re-parented while the kill was on its way) and its first hop is up, it is reachable now. Each
    /// retry rests on a route change, a real event: a route that keeps failing cannot make kills loop.
    pub fn kill_unreachable(&mut self, id: JobId, rank: u32, signal: i32, path: &[u32]) {
        debug!("signal {signal} to the shell of job {id} on rank {rank}: unreachable; kept until it is reachable");
        let now = self.path_to(rank);
        let first_hop_up = matches!(self.next_hop(rank), Hop::Child(c) if self.connected(super::core::Peer::Child(c)));
        let Some(jc) = self.jobcore.as_mut() else { return };
        jc.signal_unreachable(id, rank, signal);
        if now != path && first_hop_up {
            jc.ranks_reachable(&IdSet::from_iter([rank]));
        }
    }

    /// Learn that `rank`'s parent is now `parent`.
    pub fn learn_parent(&mut self, rank: u32, parent: u32) {
        if rank == self.rank() {
            return;
        }
        if self.opts.config.topo.parent(self.opts.size, rank) == Some(parent) {
            self.adopted.remove(&rank);
        } else {
            self.adopted.insert(rank, parent);
        }
    }

    /// Our parent is lost (`why`): start re-parenting, or say no (re-parenting off, shutting down, the parent
    /// was rank 0, no candidate) so that the caller ends this broker as before.
    pub fn start_reparent(&mut self, why: &str) -> bool {
        self.reparent_from(why, false)
    }

    /// [`Broker::start_reparent`] from the static parent at start, out of reach (`why`): tree repair, no verdict on
    /// it ([`Input::FirstParentFailed`](super::core::Input::FirstParentFailed)).
    pub fn start_reparent_at_start(&mut self, why: &str) -> bool {
        self.reparent_from(why, true)
    }

    /// [`Broker::start_reparent`]; `at_start` as for [`Reparent::at_start`].
    fn reparent_from(&mut self, why: &str, at_start: bool) -> bool {
        let Some(lost) = self.parent else { return false };
        // Whatever comes next, what went up through the lost parent will never be answered.
        self.fail_sent_up(lost);
        if !self.opts.config.reparent || self.shutting_down.is_some() {
            return false;
        }
        let (topo, size) = self.tree();
        let mut candidates = candidates(topo, size, self.rank(), lost);
        if candidates.is_empty() {
            // Nothing above rank 0: wait for it to come back, if tbon.parent_grace says so (rejoin.rs).
            return lost == 0 && self.wait_for_rank0(why);
        }
        // Candidates rank 0 announced lost go last (in the same order): each dead one would cost a whole
        // CANDIDATE_TIMEOUT. Last, not left out: one may have come back unannounced, and the list must still end
        // at rank 0.
        candidates.sort_by_key(|c| self.known_lost.contains(c));
        if at_start {
            warn!(
                "parent rank {lost} out of reach at start ({why}); re-parenting, no verdict on it: trying rank {} \
                 first",
                candidates[0]
            );
        } else {
            warn!("lost parent rank {lost} ({why}); re-parenting: trying rank {} first", candidates[0]);
        }
        self.parent = None;
        self.parent_up = false;
        self.membership.remove(super::core::PARENT);
        let mut rp = Reparent::new(lost, candidates, self.now, None);
        rp.at_start = at_start;
        self.reparenting = Some(rp);
        self.try_candidate();
        true
    }

    /// Ask the next candidate to adopt us; when none is left, make the last round (rank 0 asked to adopt us past
    /// its limit, when [`Reparent::last_resort_due`]) or give up and exit, cut off.
    pub fn try_candidate(&mut self) {
        let Some(rp) = self.reparenting.as_mut() else { return };
        if rp.trying == rp.candidates.len() && rp.last_resort_due() {
            warn!(
                "re-parenting: every candidate that answered has the most children it adopts (ranks {}); asking \
                 rank 0 to adopt us past its limit (last resort)",
                IdSet::from_iter(rp.full.iter().copied())
            );
            rp.last_resort = true;
            rp.candidates.push(0);
        }
        match rp.candidates.get(rp.trying).copied() {
            Some(rank) => {
                let (lost, last_resort) = (rp.lost, rp.last_resort);
                self.effect(Effect::ConnectParent { rank, lost, timeout: CANDIDATE_TIMEOUT, last_resort });
            }
            None => {
                let rp = self.reparenting.take().expect("checked");
                error!(
                    "lost parent rank {}; no adoptive parent accepted us (tried {}{}); exiting",
                    rp.lost,
                    IdSet::from_iter(rp.candidates.iter().copied()),
                    if rp.last_resort { ", rank 0 again as a last resort" } else { "" }
                );
                self.exit_code = crate::shellproto::BROKER_EXIT_CUT_OFF;
                self.begin_shutdown("lost parent");
            }
        }
    }

    /// The candidate being tried did not take us (`why`): the next one.
    pub fn on_parent_failed(&mut self, why: &str) {
        let Some(rp) = self.reparenting.as_mut() else { return };
        if rp.grace.is_some() {
            return self.rank0_failed(why);
        }
        info!("re-parenting: rank {} did not adopt us: {why}", rp.candidates.get(rp.trying).copied().unwrap_or(0));
        rp.trying += 1;
        self.try_candidate();
    }

    /// The candidate being tried answered and refused us (`why`; `full`: for capacity alone): noted for the
    /// last round ([`Reparent::last_resort_due`]), then the next one.
    pub fn on_parent_refused(&mut self, why: &str, full: bool) {
        let Some(rp) = self.reparenting.as_mut() else { return };
        if rp.grace.is_some() {
            return self.rank0_failed(why);
        }
        let rank = rp.candidates.get(rp.trying).copied().unwrap_or(0);
        if full {
            rp.full.push(rank);
        } else {
            rp.declined = true;
        }
        info!("re-parenting: rank {rank} refused to adopt us: {why}");
        rp.trying += 1;
        self.try_candidate();
    }

    /// The parent link is up. After a re-parent: tell rank 0 (through the new parent) and send what waited.
    pub fn on_parent_up(&mut self) {
        let Some(rp) = self.reparenting.take() else { return };
        if rp.grace.is_some() {
            return self.rank0_back(rp);
        }
        let Some(&parent) = rp.candidates.get(rp.trying) else { return };
        self.parent = Some(parent);
        let took = self.now.since(rp.since);
        let how = if rp.last_resort { ", past its adoption limit (last resort)" } else { "" };
        let left = if rp.at_start { "out of reach at start" } else { "was lost" };
        info!(
            "re-parented under rank {parent}{how} (rank {} {left}) after {:.0} ms",
            rp.lost,
            took.as_secs_f64() * 1e3
        );
        if rp.dropped > 0 {
            warn!("re-parenting: {} message(s) to rank 0 were dropped (queue full)", rp.dropped);
        }
        let body = json!({"rank": self.rank(), "parent": parent, "lost": rp.lost, "ms": took.as_secs_f64() * 1e3});
        let mut m = Message::request("overlay.reparent", 0, &body);
        m.flags = FLAG_NORESPONSE;
        self.route_request(SELF, m);
        for m in rp.queue {
            self.send_up(m);
        }
        if std::mem::take(&mut self.join_pending) {
            self.join();
        }
        // A notice from before this re-parent is replaced (kept after the resends: this one was just sent).
        self.reparent_report = None;
        self.resend_exit_reports(&rp.queue_tags);
        self.reparent_report = Some(body);
    }

    /// Shell exit reports that got no answer may have died with a lost router on the way: again (rank 0 takes
    /// each once), but not those in `sent` (just sent from the re-parent queue).
    pub fn resend_exit_reports(&mut self, sent: &std::collections::BTreeSet<u32>) {
        let again: Vec<(u32, Message)> = self.exit_reports.iter().map(|(t, m)| (*t, m.clone())).collect();
        for (tag, mut m) in again {
            if self.internal.contains_key(&tag) && sent.contains(&tag) {
                continue;
            }
            m.matchtag = tag;
            self.internal.insert(tag, super::core::Internal::ShellExit);
            self.route_request(SELF, m);
        }
        self.resend_lost_reports();
    }

    /// Every broker, at rank 0's `overlay.reparent` event: if the rank that moved is above this broker, what
    /// this broker sent up through it may have been lost with that rank's former parent, so its unanswered shell
    /// exit reports go again (the orphan itself sent its own when it re-parented).
    pub fn on_reparent_event(&mut self, body: &Value) {
        self.on_reparent_request(body);
        let Ok(moved) = rank_field(body, "rank", self.opts.size) else { return };
        if moved == self.rank() {
            // Rank 0 recorded our re-parent (under the parent it names: a later one replaces the report).
            let parent = rank_field(body, "parent", self.opts.size).ok();
            if self.reparent_report.as_ref().and_then(|r| r.get("parent")).and_then(Value::as_u64)
                == parent.map(u64::from)
            {
                self.reparent_report = None;
            }
            return;
        }
        if self.exit_reports.is_empty() && self.lost_reports.is_empty() && self.reparent_report.is_none() {
            return;
        }
        let mut x = self.parent;
        for _ in 0..=crate::topology::MAX_DEPTH * 2 {
            match x {
                Some(a) if a == moved => return self.resend_exit_reports(&Default::default()),
                Some(a) => x = self.parent_of(a),
                None => return,
            }
        }
    }

    /// Whether a message for the parent waits for one (we are re-parenting); gives it back otherwise.
    pub fn queue_up(&mut self, msg: Message) -> Result<(), Message> {
        let Some(rp) = self.reparenting.as_mut() else { return Err(msg) };
        let bytes = msg.payload.len() + msg.topic.len();
        if rp.queue.len() < UP_QUEUE_MAX && rp.queued_bytes + bytes <= UP_QUEUE_BYTES {
            rp.queued_bytes += bytes;
            if msg.route.is_empty() {
                rp.queue_tags.insert(msg.matchtag);
            }
            rp.queue.push(msg);
            return Ok(());
        }
        rp.dropped += 1;
        if msg.msgtype == MsgType::Request {
            self.respond_error(&msg, errno::EHOSTUNREACH, "parent lost; re-parenting, and the queue is full");
        }
        Ok(())
    }

    /// Whether the would-be child `rank`, whose hello asks to be adopted, may be: `None` if so, else why not
    /// ([`Refusal::full`] when for capacity alone). Rank 0 takes one past its limit when its hello carries
    /// [`LAST_RESORT`] (module rules, "Last resort"; its type is checked by the caller).
    pub fn adoption_refusal(&self, rank: u32, hello: &Value) -> Option<Refusal> {
        let (topo, size) = self.tree();
        let me = self.rank();
        hello.get("adopt")?;
        if !self.opts.config.reparent && topo.parent(size, rank) != Some(me) {
            return Some(format!("rank {rank} asks to be adopted, but tbon.reparent=off here").into());
        }
        // One waiting for rank 0 (rejoin.rs) is alive and keeps its place in the tree: it adopts (what the
        // adoptee sends rank 0 waits in its queue, and it passes the `rejoin` down when rank 0 is back).
        if self.reparenting.as_ref().is_some_and(|rp| rp.grace.is_none()) {
            return Some("this broker is re-parenting itself".into());
        }
        if self.known_lost.contains(&rank) {
            // Cut off, not dead: its jobs were failed and its resources taken out; it rejoins by restarting
            // (and its children re-parent once it gives up).
            return Some(format!("rank 0 declared rank {rank} lost; it must restart to rejoin").into());
        }
        if topo.level(size, me) >= topo.level(size, rank) {
            return Some(format!("rank {rank} is not below rank {me} in the tree; it may not be adopted here").into());
        }
        let limit = adopt_limit(topo, size, me);
        if self.children.len() >= limit {
            // Rank 0 adopts past its limit an orphan every live candidate refused for capacity (bounded: one
            // child per rank of the instance, each rank checked by the caller).
            if me == 0 && hello.get(LAST_RESORT).and_then(Value::as_bool) == Some(true) {
                return None;
            }
            return Some(Refusal::full(format!(
                "rank {me} has {} children, the most it adopts up to",
                self.children.len()
            )));
        }
        None
    }

    /// Whether adopting `rank` now takes this broker past its [`adopt_limit`] (rank 0's last resort).
    pub fn adopts_past_limit(&self, rank: u32) -> bool {
        let (topo, size) = self.tree();
        let me = self.rank();
        topo.parent(size, rank) != Some(me) && self.children.len() >= adopt_limit(topo, size, me)
    }

    /// Rank 0 and the brokers on the way: `rank` re-parented under `parent` (both run, then).
    pub fn on_reparent_request(&mut self, body: &Value) {
        let size = self.opts.size;
        if let (Ok(rank), Ok(parent)) = (rank_field(body, "rank", size), rank_field(body, "parent", size)) {
            self.learn_parent(rank, parent);
            self.known_lost.remove(&rank);
            self.known_lost.remove(&parent);
        }
    }

    /// Every broker: rank 0's `overlay.lost` event; its ranks are asked last when this broker re-parents.
    pub fn on_lost_event(&mut self, body: &Value) {
        let Some(ranks) = body.get("ranks").and_then(Value::as_str).and_then(|s| s.parse::<IdSet>().ok()) else {
            return;
        };
        let (size, me) = (self.opts.size, self.rank());
        self.known_lost.extend(ranks.iter().filter(|r| *r < size && *r != me));
        // Announced: our own verdicts on them reached rank 0.
        self.lost_reports.retain(|r, _| !ranks.contains(*r));
    }

    /// Our verdicts on lost children that rank 0 has not announced yet may have died on the way with a lost
    /// router (an `overlay.lost` notice asks for no answer): again, marked `again` (rank 0 takes each once and
    /// drops one about a rank that has another parent by now, [`Broker::stale_lost_notice`]); and so does our
    /// own `overlay.reparent` notice ([`Broker::reparent_report`]).
    pub fn resend_lost_reports(&mut self) {
        if self.rank() == 0 {
            return;
        }
        // Our own re-parent notice, not announced yet: rank 0 records one it already has again harmlessly.
        if let Some(mut body) = self.reparent_report.clone() {
            body["again"] = json!(true);
            let mut m = Message::request("overlay.reparent", 0, &body);
            m.flags = FLAG_NORESPONSE;
            self.route_request(SELF, m);
        }
        let again: Vec<Value> = self.lost_reports.values().cloned().collect();
        for mut body in again {
            body["again"] = json!(true);
            let mut m = Message::request("overlay.lost", 0, &body);
            m.flags = FLAG_NORESPONSE;
            self.route_request(SELF, m);
        }
    }

    /// Rank 0: whether an `overlay.lost` notice (`body`) judged by a parent about its child `root` is stale:
    /// `root` has another parent now as far as rank 0 knows (it re-parented or restarted elsewhere since), or the
    /// notice is one sent again after a re-parent (`again`) about a rank already lost.
    pub fn stale_lost_notice(&self, body: &Value, root: Option<u32>) -> bool {
        let size = self.opts.size;
        let (Some(root), Ok(judge)) = (root, rank_field(body, "parent", size)) else { return false };
        if self.parent_of(root) != Some(judge) {
            return true;
        }
        body.get("again").and_then(Value::as_bool) == Some(true)
            && self.members.get(&root).is_some_and(|m| m.0 == MemberState::Lost)
    }

    /// Rank 0: `rank` registers, under `current` (the parent it names; none from an older broker). A fresh
    /// broker is joined to its static parent: if it was lost or adopted before, every broker is told where it is
    /// now (an `overlay.reparent` event naming its static parent): routes that went to its former adopter would
    /// otherwise fail, and orphans would ask it last. One that names another parent registers again after rank
    /// 0 restarted, still adopted: the route to it goes through its adopter.
    ///
    /// An orphan that registers (rank 0 restarted while it waited for a new parent) is waited for no longer: it is
    /// there, under the parent it names.
    pub fn on_register(&mut self, rank: u32, current: Option<u32>) {
        self.orphans.remove(&rank);
        let (topo, size) = self.tree();
        let Some(parent) = topo.parent(size, rank) else { return };
        if let Some(adopter) = current.filter(|p| *p != parent && *p != rank && *p < size) {
            // It registers again under the broker that adopted it (rank 0 restarted, rejoin.rs): a restarted rank 0
            // knows only the static tree, and would otherwise route to it through its lost static parent.
            self.learn_parent(rank, adopter);
            self.known_lost.remove(&rank);
            self.reachable_again(rank);
            return;
        }
        let back = self.members.get(&rank).is_some_and(|m| m.0 == MemberState::Lost || m.0 == MemberState::Offline);
        if !back && !self.adopted.contains_key(&rank) {
            return;
        }
        self.learn_parent(rank, parent);
        self.known_lost.remove(&rank);
        self.reachable_again(rank);
        info!("rank {rank} is back, under its static parent rank {parent}");
        self.publish("overlay.reparent", &json!({"rank": rank, "parent": parent}));
    }

    /// Rank 0: `rank` and the ranks below it are reachable again; kills that could not reach them go now.
    fn reachable_again(&mut self, rank: u32) {
        // The subtree's walk only when a kill waits (a re-parent at 16,384 brokers must stay cheap).
        if self.jobcore.as_ref().is_none_or(|jc| jc.unreachable_signals_kept() == 0) {
            return;
        }
        let ids: IdSet = self.subtree_of(rank).into_iter().collect();
        if let Some(jc) = self.jobcore.as_mut() {
            jc.ranks_reachable(&ids);
        }
    }

    /// Rank 0: `rank` lost; its current children must re-parent within [`REPARENT_TIMEOUT`].
    ///
    /// Meanwhile the orphans and everything below them are unreachable: they are torpid ("re-parenting"), so no
    /// new work is placed there (a job started there now would fail to start its shells), and lively again once
    /// they have re-parented. Work already running there goes on.
    pub fn expect_orphans(&mut self, lost: u32) {
        if !self.opts.config.reparent {
            return;
        }
        let due = self.now + REPARENT_TIMEOUT;
        let wall = self.wall();
        let mut behind = IdSet::new();
        for c in self.children_of(lost) {
            if !self.members.get(&c).is_some_and(|m| m.0 == MemberState::Online || m.0 == MemberState::Torpid) {
                continue;
            }
            self.orphans.insert(c, (due, lost));
            for r in self.subtree_of(c) {
                if self.members.get(&r).is_some_and(|m| m.0 == MemberState::Online) {
                    let why = format!("{REPARENTING} {c}: rank {lost} above it was lost");
                    self.members.insert(r, (MemberState::Torpid, why, wall));
                    behind.insert(r);
                }
            }
        }
        if behind.is_empty() {
            return;
        }
        info!("ranks {behind} are unreachable until they re-parent (rank {lost} was lost)");
        if let Some(jc) = self.jobcore.as_mut() {
            jc.ranks_torpid(wall, &behind, true);
        }
    }

    /// `rank` and every rank below it now, as this broker knows them (rank 0: all of them).
    pub fn subtree_of(&self, rank: u32) -> Vec<u32> {
        let size = self.opts.size as usize;
        let mut out = vec![rank];
        let mut i = 0;
        while i < out.len() && out.len() <= size {
            let c = self.children_of(out[i]);
            out.extend(c);
            i += 1;
        }
        out
    }

    /// Rank 0: the earliest orphan deadline.
    pub fn orphan_deadline(&self) -> Option<Time> {
        self.orphans.values().map(|(t, _)| *t).min()
    }

    /// Rank 0, at a timer: orphans that did not re-parent in time are lost (and their children orphans).
    pub fn expire_orphans(&mut self) {
        let now = self.now;
        let late: BTreeMap<u32, u32> =
            self.orphans.iter().filter(|(_, (t, _))| *t <= now).map(|(c, (_, lost))| (*c, *lost)).collect();
        for (c, lost) in late {
            self.orphans.remove(&c);
            let why = format!(
                "cut off: rank {lost} above it was lost and it did not re-parent within {} s",
                REPARENT_TIMEOUT.as_secs()
            );
            let mut m = Message::request("overlay.lost", 0, &json!({"ranks": c.to_string(), "reason": why}));
            m.flags = FLAG_NORESPONSE;
            self.route_request(SELF, m);
        }
    }

    /// Rank 0: record `rank`'s re-parent (`resource.eventlog`, the `overlay.reparent` event to every broker).
    pub fn record_reparent(&mut self, body: &Value) -> Result<(), (u32, String)> {
        let size = self.opts.size;
        let get = |k: &str| rank_field(body, k, size);
        let (rank, parent) = (get("rank")?, get("parent")?);
        let lost = get("lost").ok();
        self.learn_parent(rank, parent);
        self.reachable_again(rank);
        if body.get("again").and_then(Value::as_bool) == Some(true) && self.orphans.remove(&rank).is_none() {
            // Sent again by an orphan that did not see our event (it may have died on the way down): recorded
            // once already, or cut off since; it hears the event again.
            self.publish("overlay.reparent", &json!({"rank": rank, "parent": parent}));
            return Ok(());
        }
        self.orphans.remove(&rank);
        self.counters.reparents += 1;
        let wall = self.wall();
        let ids: IdSet = self.subtree_of(rank).into_iter().collect();
        info!("rank {rank} re-parented under rank {parent} (subtree {ids})");
        // Reachable again: lively, unless torpid for another reason. The orphan itself is lively whatever its
        // old parent judged of it: that judge is lost and will never say it is lively again, and its new parent
        // judges it afresh (and says so if it is torpid). So are the ranks unreachable only behind it.
        let behind = format!("{} {rank}", super::services::overlay::BEHIND);
        let mut back = IdSet::new();
        for r in ids.iter() {
            let stale = |m: &(MemberState, String, f64)| {
                m.0 == MemberState::Torpid && (r == rank || m.1.starts_with(REPARENTING) || m.1 == behind)
            };
            if self.members.get(&r).is_some_and(stale) {
                self.members.insert(r, (MemberState::Online, String::new(), wall));
                back.insert(r);
            }
        }
        if !back.is_empty() {
            if let Some(jc) = self.jobcore.as_mut() {
                jc.ranks_torpid(wall, &back, false);
            }
        }
        if let Some(jc) = self.jobcore.as_mut() {
            // `rank`: the orphan itself (the idset is its subtree), for a restarted rank 0's
            // `journal::pending_orphans`.
            let mut ctx = json!({"idset": ids.to_string(), "rank": rank, "parent": parent});
            if let Some(l) = lost {
                ctx["lost"] = json!(l);
            }
            // The orphan's own time from its verdict on the lost parent to its adoption.
            if let Some(ms) = body.get("ms").and_then(Value::as_f64).filter(|m| m.is_finite() && *m >= 0.0) {
                ctx["ms"] = json!((ms * 100.0).round() / 100.0);
            }
            jc.resource_eventlog.push(crate::eventlog::Event::with_time(wall, "reparent", ctx));
        }
        self.publish("overlay.reparent", &json!({"rank": rank, "parent": parent}));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn level_decreases(topo: Topology, size: u32) {
        for me in 1..size {
            let Some(p) = topo.parent(size, me) else { continue };
            for c in candidates(topo, size, me, p) {
                assert!(topo.level(size, c) < topo.level(size, me), "{topo} {me}: candidate {c}");
                assert_ne!(c, p);
            }
        }
    }

    #[test]
    fn candidates_are_higher_in_the_tree_and_spread_over_the_siblings() {
        for topo in [Topology::Kary(2), Topology::Kary(3), Topology::Kary(32), Topology::Binomial] {
            level_decreases(topo, 200);
        }
        // kary:2, size 15: rank 1's children 3 and 4; rank 1's sibling is 2, then rank 0.
        let t = Topology::Kary(2);
        assert_eq!(candidates(t, 15, 3, 1), vec![2, 0]);
        assert_eq!(candidates(t, 15, 4, 1), vec![2, 0]);
        // kary:4: rank 1's children 5..8 go first to siblings 2, 3, 4, 2 (rotated), then rank 0.
        let t = Topology::Kary(4);
        let first: Vec<u32> = (5..=8).map(|c| candidates(t, 100, c, 1)[0]).collect();
        assert_eq!(first, vec![2, 3, 4, 2]);
        assert_eq!(candidates(t, 100, 5, 1).last(), Some(&0));
        // The children of rank 0 have nowhere to go.
        assert!(candidates(t, 100, 1, 0).is_empty());
        // Deeper: rank 21 (child of 5, child of 1): siblings of 5 are 6, 7, 8; then 1, then 0.
        assert_eq!(candidates(t, 100, 21, 5), vec![6, 7, 8, 1, 0]);
    }

    /// Every parent an orphan can be sent to, through any chain of losses of its parents (static or adoptive),
    /// is among the endpoints it fetched at bootstrap.
    #[test]
    fn parent_endpoints_cover_every_chain_of_re_parents() {
        for (topo, size) in
            [(Topology::Kary(2), 63), (Topology::Kary(3), 121), (Topology::Kary(8), 600), (Topology::Binomial, 128)]
        {
            for me in 1..size {
                let eps = parent_endpoints(topo, size, me);
                let mut seen = std::collections::BTreeSet::new();
                let mut todo = vec![topo.parent(size, me).expect("not rank 0")];
                while let Some(p) = todo.pop() {
                    assert!(eps.contains(&p), "{topo} size {size}: rank {me} may be sent to {p}, not in {eps:?}");
                    if seen.insert(p) {
                        todo.extend(candidates(topo, size, me, p));
                    }
                }
                assert!(eps.len() <= seen.len() + 1, "{topo} {me}: fetches {eps:?}, reaches {seen:?}");
            }
        }
        // kary:32 at 16,384: a leaf fetches its parent, its parent's 31 siblings and its grandparent's, and rank 0.
        let n = parent_endpoints(Topology::Kary(32), 16384, 16000).len();
        assert!(n <= 32 + 32 + 2, "{n}");
    }

    #[test]
    fn critical_ranks_are_rank_0_alone_when_brokers_re_parent() {
        let t = Topology::Kary(2);
        assert_eq!(critical_ranks(t, 7, true).to_string(), "0");
        assert_eq!(critical_ranks(t, 7, false).to_string(), "0-2");
        assert_eq!(critical_ranks(Topology::Kary(0), 7, false).to_string(), "0");
    }

    #[test]
    fn adoption_is_bounded() {
        assert_eq!(adopt_limit(Topology::Kary(32), 16384, 5), 64);
        assert_eq!(adopt_limit(Topology::Kary(2), 7, 1), 4);
    }
}
