//! A deterministic simulator of a whole instance: N brokers of the real sans-IO broker code (`vigil-core`:
//! `broker/core.rs` and its rules) in one process, on virtual time (dev and test only; `vigil-bench sim`).
//!
//! The simulator plays every broker's driver and the world around it:
//! - **the network**: every overlay link delivers in order after [`Config::latency`]; a partition cuts a link
//!   both ways (nothing is delivered, nothing acknowledged); a link to a node whose broker process is gone but
//!   whose kernel runs is closed by that kernel (EOF/RST), as after `kill -9`;
//! - **each node's kernel**: it keeps acknowledging TCP data and answering probes while its broker is stopped
//!   (`SIGSTOP`: inputs queue up and are handled on resume), and stops doing either when the node dies;
//! - **each parent's prober**: probes every child node each `tbon.probe_period` and forwards what the real prober
//!   forwards (`broker/detect/prober.rs`): a reply when it changes a verdict or once a second, every new miss;
//! - **job shells**: a shell "runs" its tasks for the seconds its command says (`sleep S`; anything else ends at
//!   once) and reports like a real one; a signal ends it; it dies with its node or its broker;
//! - **a client** on rank 0 that submits jobs and pings ranks.
//!
//! Everything is driven by one event queue ordered by (virtual time, sequence number) and one seeded random
//! generator: the same seed gives the same event trace ([`Report::trace`]).
//!
//! This file holds the world ([`Sim`]: nodes, links, the event queue) and its event loop, the network, the
//! client and rank 0's store; its neighbours:
//!
//! | file | holds |
//! |------|-------|
//! | `trace.rs` | the trace hash of every input (same seed, same trace) and `VIGIL_SIM_WATCH` debugging output |
//! | `rng.rs` | [`Rng`], the seeded generator of every draw |
//! | `config.rs` | [`Config`] and [`Load`]: what to simulate |
//! | `report.rs` | [`Report`] and its figures: what a run measured |
//! | `faults.rs` | [`Fault`]s, injected now or at a time, and a stopped broker's resumption |
//! | `probe.rs` | each parent's prober: probe rounds, replies, misses, what the real prober forwards |
//! | `effects.rs` | `Sim::execute`: what the simulated driver does with each broker effect |
//! | `scenario.rs` | the named scenarios and their invariants |
//! | `depth.rs` | the depth experiment |
//! | `tests.rs` | unit tests |

pub mod depth;
pub mod scenario;

// The rules simulated and the formats they use (`vigil-core`), under the paths the simulator has always named.
use vigil_core::{attrs, broker, idset, jobs, jobspec, membership, message, shellproto, topology};

use crate::broker::confirm::CheckTarget;
use crate::broker::core::StateDir;
use crate::broker::core::{Broker, Effect, Input, Peer, Time, PARENT};
use crate::jobs::journal::Kept;
use crate::jobs::{JobId, JobState};
use crate::membership::Signal;
use crate::message::{Message, MsgType};
use crate::shellproto::ShellReport;
use crate::topology::Topology;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};
use std::time::Duration;

pub use scenario::{run, Scenario, SCENARIOS};

mod config;
mod effects;
mod faults;
mod probe;
mod report;
mod rng;
mod trace;

pub use config::{Config, Load, CLIENT_RETRY, PARENT_GRACE};
pub use faults::Fault;
use faults::Trigger;
pub use report::{ReparentFigures, Report, RestartFigures};
pub use rng::Rng;
use trace::{describe_effect, describe_input, fnv, kind, quiet, watched};

/// Events in the queue.
enum Ev {
    /// Hand a node's broker an input (queued while it is stopped, dropped if it is gone).
    Input(u32, Input),
    /// A node's deadline, valid while it is still the armed one.
    Timer(u32, Time),
    /// A broker starts connecting to its parent.
    Connect(u32),
    /// A parent's prober round.
    ProbeRound(u32),
    /// A job shell ends with this wait status.
    ShellEnd(u32, JobId, i32),
    /// A stopped broker continues.
    Resume(u32),
    /// A starved node's broker is stopped for its next burst ([`Load::starve`]).
    Starve(u32),
    /// A starved node's broker runs again after a burst's stall (not a fault's end: a run may be quiet with these
    /// pending, as starvation goes on for ever).
    StarveEnd(u32),
    /// Inject a fault.
    Fault(Fault),
    /// The client sends this request from rank 0.
    Client(Message),
    /// A scenario checkpoint (see `scenario.rs`).
    Check(u32),
    /// The deadline of an orphan's attempt to join a candidate parent ([`Effect::ConnectParent`]'s timeout) on
    /// link `conn`: if that link is not up by then, the attempt failed (the real driver's connect timeout).
    ConnectDeadline(u32, u64),
    /// Rank 0's store thread ends the fsync asked for by its broker of life `.1` (the count of rank 0's restarts
    /// then), covering write `.0` (see [`SYNC_DELAY`]).
    Synced0(u64, u64),
}

/// How long rank 0's fsync of its store takes with [`Config::statedir`] (the real driver's store thread,
/// `broker/statedir_io.rs`): submissions written meanwhile wait for the next one, as with a real disk.
const SYNC_DELAY: Duration = Duration::from_millis(2);

/// What a parent's prober knows of one child (the fields of the real prober's target that shape what it
/// forwards).
#[derive(Default)]
struct ProbeTarget {
    /// Whether the child's node has answered yet.
    answered_once: bool,
    /// Rounds unanswered in a row.
    outstanding: u32,
    /// Misses already forwarded.
    missed_reported: u32,
    stalled: bool,
    forwarded: Option<Time>,
    /// Its kernel's reply time (`vigil_core::probe`).
    timing: vigil_core::probe::ReplyTiming,
    /// Under [`Load`]: probes sent to it, the newest answered, and replies on their way (arrival, probe, sent,
    /// what the reply says: broker alive, its heartbeat's age in seconds, as when the node answered).
    round: u32,
    answered: u32,
    inflight: VecDeque<(Time, u32, Time, bool, f64)>,
    /// Under [`Load`]: the round during which its last news came.
    news_round: u32,
    /// Under [`Load`]: periods of its current silence excused as correlated (`vigil_core::probe`).
    excused: u32,
    /// Under [`Load`]: this round's read brought news (or a reply withheld before arming).
    got: bool,
}

/// One re-parent as rank 0 recorded it (`overlay.reparent` → a `reparent` event in `resource.eventlog`), with
/// what the simulator saw around it.
#[derive(Clone, Debug)]
pub(crate) struct Reattach {
    /// The orphan.
    pub rank: u32,
    /// Its new parent.
    pub parent: u32,
    /// The parent it lost.
    pub lost: u32,
    /// When the orphan first asked a candidate to adopt it after losing `lost` (its own verdict on its parent).
    pub asked: Option<Time>,
    /// Candidates it asked (the one that took it included).
    pub attempts: u32,
    /// Of those, how many never answered (dead, or cut off): each cost it the candidate timeout.
    pub timeouts: u32,
    /// When rank 0 recorded the re-parent.
    pub recorded: Time,
    /// When rank 0's client got a successful answer to the ping it sent the orphan on seeing the record; `None`
    /// if that ping failed (the orphan lost its new parent meanwhile, say).
    pub answered: Option<Time>,
    /// Pings sent again after a failed one while the orphan runs (a router above its new parent died with the
    /// ping in flight, and re-parented itself): at most [`PING_RETRIES`], [`PING_RETRY_AFTER`] apart.
    pub ping_retries: u32,
}

/// Most times the client pings a re-parented orphan again after a failed ping ([`Reattach::ping_retries`]).
const PING_RETRIES: u32 = 20;
/// Between two of those pings.
const PING_RETRY_AFTER: Duration = Duration::from_millis(500);

/// What the simulator watches of re-parenting while it runs (the `routers` scenarios turn it into figures).
#[derive(Default)]
pub(crate) struct ReparentWatch {
    /// Orphans looking for a parent: rank → (the parent lost, when it first asked a candidate, candidates asked,
    /// attempts timed out).
    open: BTreeMap<u32, (u32, Time, u32, u32)>,
    /// Every re-parent rank 0 recorded, in order.
    pub done: Vec<Reattach>,
    /// Pings to re-parented orphans awaiting their answer: matchtag → index in `done`.
    pings: BTreeMap<u32, usize>,
    /// How many of rank 0's `resource.eventlog` entries have been looked at.
    seen: usize,
    /// The most children any broker had at once, and which rank.
    pub max_children: (usize, u32),
    /// Ranks that accepted an adoptee with more children than `reparent::adopt_limit` (twice the fanout) allows,
    /// with how many.
    pub over_limit: BTreeMap<u32, usize>,
    /// Ranks that had more children than their static ones plus the adoption limit (a returning static child
    /// is accepted whatever the count: its static parent is its only way back), with how many; rank 0's
    /// last-resort adoptees do not count.
    pub over_bound: BTreeMap<u32, usize>,
    /// Orphans rank 0 adopted on their last round (`last_resort`), each time: past its limit if it was still full.
    pub last_resort: u32,
}

/// One simulated node.
struct Node {
    broker: Option<Box<Broker>>,
    /// The node's kernel runs (false once the node died).
    kernel: bool,
    died_at: Option<Time>,
    stopped_until: Option<Time>,
    backlog: VecDeque<Input>,
    /// The deadline armed for this node's broker.
    timer: Option<Time>,
    /// A timer fired while the broker was stopped.
    timer_missed: bool,
    /// When the broker last beat its heartbeat clock (what its node's kernel reports in probe replies).
    last_beat: Time,
    /// Job shells running here: job → started.
    shells: BTreeMap<JobId, Time>,
    /// The prober's children (parent side).
    prober: BTreeMap<u32, ProbeTarget>,
    /// With [`Config::probe_parent`] (the default): the parent this node's prober probes too.
    parent_probe: Option<(u32, ProbeTarget)>,
    /// Every kernel reply its prober read, timed together: a new target starts from it (`vigil_core::probe`).
    probe_all: vigil_core::probe::ReplyTiming,
    probing: bool,
    /// Exit code once the broker process ended.
    exit: Option<i32>,
    /// Not joined yet: like the real driver, the broker handles nothing but its parent link coming up and its
    /// registration before its loop runs; everything else waits.
    joining: bool,
    /// Under [`Load`]: the node is starved; since when its current burst's stall began (its kernel holds ACKs).
    starved: bool,
    starving: Option<Time>,
    /// Under [`Load`]: its probe responder runs in userspace.
    userspace: bool,
}

/// One overlay link (between a child rank and its parent), as the sockets at its two ends know it.
#[derive(Clone, Copy)]
struct LinkState {
    conn: u64,
    /// The parent end's rank (the child's static parent, or the one that adopted it).
    parent: u32,
    /// Opened by a hello asking to be adopted: a refusal sends the child on to its next candidate.
    adopt: bool,
    /// That hello was the orphan's last round (`last_resort`): rank 0 may adopt it past its limit.
    last_resort: bool,
    /// The parent's socket is open.
    at_parent: bool,
    /// The child's socket is open.
    at_child: bool,
}

impl std::fmt::Debug for Sim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sim")
            .field("cfg", &self.cfg)
            .field("now", &self.now)
            .field("brokers", &self.nodes.len())
            .field("events_due", &self.queue.len())
            .finish_non_exhaustive()
    }
}

/// The simulated world (see the module documentation).
pub struct Sim {
    cfg: Config,
    now: Time,
    seq: u64,
    /// Due events by (time, sequence number): their slots in `slab`. Events stay put in the slab while the heap
    /// moves 24-byte entries.
    queue: BinaryHeap<Reverse<(Time, u64, u32)>>,
    slab: Vec<Option<Ev>>,
    free: Vec<u32>,
    /// The inputs one [`Sim::handle`] leads to (kept to reuse its buffer).
    scratch: VecDeque<Input>,
    nodes: Vec<Node>,
    links: BTreeMap<u32, LinkState>,
    /// Cut links (by child rank) and since when.
    cut: BTreeMap<u32, Time>,
    /// Under [`Load`]: when the last overlay message on each link and direction (child rank, upward) arrives, so
    /// that delayed messages stay in order.
    fifo: BTreeMap<(u32, bool), Time>,
    /// Under [`Load`]: each rank's (starved, userspace responder), drawn once, and the generator of every draw the
    /// load makes (its own, so that the scenario's faults and jobs are drawn as without load).
    loaded: Vec<(bool, bool)>,
    load_rng: Rng,
    next_conn: u64,
    rng: Rng,
    membership: crate::membership::Config,
    /// Inputs handled.
    events: u64,
    trace: u64,
    /// The client's requests waiting for their response: matchtag → (topic, nodeid, sent).
    pending: BTreeMap<u32, (String, u32, Time)>,
    next_tag: u32,
    /// Responses the client got: matchtag → (errnum, payload JSON).
    responses: BTreeMap<u32, (u32, serde_json::Value)>,
    /// First shell spawn of each job, in order (the FCFS check).
    spawn_order: Vec<JobId>,
    /// The jobs in `spawn_order` (a lookup, not a scan of every job ever run, at each spawn).
    spawned: std::collections::HashSet<JobId>,
    /// Faults injected: (time, fault).
    faults: Vec<(Time, Fault)>,
    /// Invariant violations noticed while running.
    violations: Vec<String>,
    /// Re-parenting as it happens.
    pub(crate) watch: ReparentWatch,
    /// Faults still to inject when an orphan asks a candidate (each fires once).
    pub(crate) triggers: Vec<Trigger>,
    /// The most children a broker has in the static tree (above it, a broker holds adopted children).
    static_fanout: usize,
    /// With [`Config::statedir`]: rank 0's store, which outlives its broker (only batches applied are in it).
    kept: Option<Kept>,
    /// Rank 0 with [`Config::statedir`]: a [`Fault::CrashInCommit`] waits for its turn.
    crash_in_commit: bool,
    /// Rank 0's restarts on its store so far.
    restarts0: u64,
    /// Rank 0 with [`Config::statedir`]: the life (`restarts0`) of the broker whose fsync is under way.
    sync0: Option<u64>,
    /// What the client did and saw, for the restart invariants.
    pub(crate) client: ClientLog,
}

/// The client's side of rank 0's restarts ([`Config::statedir`]).
#[derive(Debug, Default)]
pub(crate) struct ClientLog {
    /// Each submission request (every retry included) → the key of the submission it carries (its first
    /// request's matchtag: the jobspec's command names it, `key=K`) and its payload (to send it again).
    pub submits: BTreeMap<u32, (u32, serde_json::Value)>,
    /// Submissions answered with an id (acknowledged): (key, id, when, whether the answer said it was a
    /// duplicate: a request sent again whose job rank 0 already held).
    pub acked: Vec<(u32, JobId, Time, bool)>,
    /// Requests that failed on the client's side: refused (rank 0 down) or reset (rank 0 died with them in
    /// flight): matchtag → errno.
    pub conn_failed: BTreeMap<u32, u32>,
    /// Submission requests sent again after a connection failure or an EAGAIN: the failed matchtag → the
    /// retry's.
    pub retried: BTreeMap<u32, u32>,
    /// Rank 0's crashes: when, whether in a commit (the turn's batch lost), and the jobs running then.
    pub crashes: Vec<(Time, bool, Vec<JobId>)>,
    /// Rank 0's restarts: when, and when every broker still running had registered with it again.
    pub restarts: Vec<(Time, Option<Time>)>,
}

// The simulated broker (options, environment), the instance owner and the wall-clock origin are the core's, which
// its unit tests share.
pub use vigil_core::broker::testing::{new_broker, UID, WALL_ORIGIN};

/// How often the simulator looks whether every running broker registered again with a restarted rank 0.
const REJOIN_POLL: Duration = Duration::from_millis(10);

/// The local client's connection id on rank 0.
const CLIENT: u32 = 1;

impl Sim {
    /// A world of `cfg.brokers` brokers, none started yet; [`Sim::boot`] starts them.
    pub fn new(cfg: Config) -> Sim {
        let membership = crate::membership::Config::default();
        let mut sim = Sim {
            now: Time::ZERO,
            seq: 0,
            queue: BinaryHeap::new(),
            slab: Vec::new(),
            free: Vec::new(),
            scratch: VecDeque::new(),
            nodes: Vec::with_capacity(cfg.brokers as usize),
            links: BTreeMap::new(),
            cut: BTreeMap::new(),
            fifo: BTreeMap::new(),
            loaded: Vec::new(),
            load_rng: Rng(cfg.seed ^ 0x10ad_10ad_10ad_10ad),
            next_conn: 1,
            rng: Rng(cfg.seed),
            membership,
            events: 0,
            trace: 0xcbf2_9ce4_8422_2325,
            pending: BTreeMap::new(),
            next_tag: 1,
            responses: BTreeMap::new(),
            spawn_order: Vec::new(),
            spawned: std::collections::HashSet::new(),
            faults: Vec::new(),
            violations: Vec::new(),
            watch: ReparentWatch::default(),
            triggers: Vec::new(),
            kept: cfg.statedir.then(Kept::default),
            crash_in_commit: false,
            restarts0: 0,
            sync0: None,
            client: ClientLog::default(),
            static_fanout: match cfg.topo {
                Topology::Kary(k) if k > 0 => k as usize,
                t => t.children(cfg.brokers, 0).len(),
            },
            cfg,
        };
        if sim.cfg.load.any() {
            let l = sim.cfg.load;
            let draw = |rng: &mut Rng, share: f64| share > 0.0 && rng.secs(0.0, 1.0) < share;
            sim.loaded = (0..sim.cfg.brokers)
                .map(|_| (draw(&mut sim.load_rng, l.starved_share), draw(&mut sim.load_rng, l.userspace_share)))
                .collect();
        }
        for rank in 0..sim.cfg.brokers {
            let node = sim.fresh_node(rank);
            sim.nodes.push(node);
        }
        sim
    }

    /// Node `rank` with its broker just started (not joined yet, unless it is rank 0).
    fn fresh_node(&self, rank: u32) -> Node {
        Node {
            broker: Some(Box::new(self.make_broker(rank))),
            kernel: true,
            died_at: None,
            stopped_until: None,
            backlog: VecDeque::new(),
            timer: None,
            timer_missed: false,
            last_beat: self.now,
            shells: BTreeMap::new(),
            prober: BTreeMap::new(),
            parent_probe: None,
            probe_all: Default::default(),
            probing: false,
            exit: None,
            joining: rank != 0,
            starved: self.loaded.get(rank as usize).is_some_and(|l| l.0),
            starving: None,
            userspace: self.loaded.get(rank as usize).is_some_and(|l| l.1),
        }
    }

    fn make_broker(&self, rank: u32) -> Broker {
        let mut b = new_broker(rank, self.cfg.brokers, self.cfg.topo, self.cfg.cores, self.membership, self.now);
        b.opts.config.reparent = self.cfg.reparent;
        if let Some(kept) = &self.kept {
            b.opts.config.parent_grace_set = Some(PARENT_GRACE);
            if rank == 0 {
                // Before any input, as the driver does: a new store until a first batch was applied.
                b.jobcore.as_mut().expect("rank 0 has the job core").reattach_grace = PARENT_GRACE;
                let dir = StateDir::Open { dir: "/sim/statedir".into(), restarts: self.restarts0, failing: None };
                b.restore(dir, Some(kept.clone()).filter(|k| k.epoch > 0.0));
            }
        }
        b.opts.config.sched_policy = self.cfg.sched_policy;
        if let Some(jc) = b.jobcore.as_mut() {
            jc.config.policy = self.cfg.sched_policy;
        }
        b
    }

    /// The current virtual time.
    pub fn now(&self) -> Time {
        self.now
    }

    fn at(&mut self, t: Time, ev: Ev) {
        self.seq += 1;
        let slot = match self.free.pop() {
            Some(i) => {
                self.slab[i as usize] = Some(ev);
                i
            }
            None => {
                self.slab.push(Some(ev));
                (self.slab.len() - 1) as u32
            }
        };
        self.queue.push(Reverse((t.max(self.now), self.seq, slot)));
    }

    /// Whether an event matching `f` is still to come.
    fn pending_event(&self, f: impl Fn(&Ev) -> bool) -> bool {
        self.slab.iter().flatten().any(f)
    }

    fn after(&mut self, d: Duration, ev: Ev) {
        let t = self.now + d;
        self.at(t, ev);
    }

    /// Start every broker: rank 0 at once with the client connected, the others connecting to their parent
    /// within the first 10 ms (seeded jitter).
    pub fn boot(&mut self) {
        self.at(Time::ZERO, Ev::Input(0, Input::LocalNew { id: CLIENT, uid: UID }));
        self.at(Time::ZERO, Ev::Input(0, Input::Start));
        for r in 1..self.cfg.brokers {
            let jitter = Duration::from_micros(self.rng.below(10_000));
            self.at(Time::ZERO + jitter, Ev::Connect(r));
        }
        for r in 0..self.cfg.brokers {
            if self.nodes[r as usize].starved {
                let first = self.load_draw(self.cfg.load.starve);
                self.at(Time::ZERO + first, Ev::Starve(r));
            }
        }
    }

    /// Under [`Load`]: uniform in `[0, max)`.
    fn load_draw(&mut self, max: Duration) -> Duration {
        if max.is_zero() {
            return Duration::ZERO;
        }
        Duration::from_secs_f64(self.load_rng.secs(0.0, max.as_secs_f64()))
    }

    /// Under [`Load`]: true with probability `p`.
    fn load_chance(&mut self, p: f64) -> bool {
        p > 0.0 && self.load_rng.secs(0.0, 1.0) < p
    }

    /// When an overlay message sent now on the link of `child` (`up`: to the parent) arrives: after the link's
    /// latency, plus under [`Load`] its queueing delay and a retransmission if its segment is lost, and never
    /// before the one sent before it on that link and direction.
    fn wire_arrival(&mut self, child: u32, up: bool) -> Time {
        let lat = self.cfg.latency;
        if !self.cfg.load.any() {
            return self.now + lat;
        }
        let mut d = lat + self.load_draw(self.cfg.load.jitter);
        if self.load_chance(self.cfg.load.loss) {
            d += Duration::from_millis(10) + self.load_draw(Duration::from_millis(40));
        }
        let at = (self.now + d).max(self.fifo.get(&(child, up)).copied().unwrap_or(Time::ZERO));
        self.fifo.insert((child, up), at);
        at
    }

    /// Under [`Load`], the ACK state of a live link to node `far`: a starved node's kernel holds the ACKs of its
    /// broker's sockets during its burst's stall; on a jittery link the last heartbeat may still be on its way
    /// (its ACK a round trip of queueing later). `(0, 0)` without load.
    fn loaded_ack(&mut self, far: u32) -> (u32, f64) {
        if !self.cfg.load.any() {
            return (0, 0.0);
        }
        if let Some(t) = self.nodes[far as usize].starving {
            return (1, self.now.since(t).as_secs_f64());
        }
        let rtt = (self.load_draw(self.cfg.load.jitter) + self.load_draw(self.cfg.load.jitter)).as_secs_f64();
        let hb = self.membership.heartbeat_period;
        if rtt > hb {
            (1, rtt - hb)
        } else {
            (0, 0.0)
        }
    }

    /// A starved node's next burst: its broker stops for a while (its kernel holding ACKs meanwhile), then runs.
    fn starve(&mut self, n: u32) {
        let max = self.cfg.load.starve;
        let (stall, gap) = (self.load_draw(max), self.load_draw(max));
        let now = self.now;
        let node = &mut self.nodes[n as usize];
        let stops = node.kernel && node.broker.is_some() && node.stopped_until.is_none() && !stall.is_zero();
        if stops {
            node.stopped_until = Some(now + stall);
            node.starving = Some(now);
        }
        let again = node.kernel;
        if stops {
            self.after(stall, Ev::StarveEnd(n));
        }
        if again {
            self.after(stall + gap, Ev::Starve(n));
        }
    }

    /// Run events until virtual time `end` (or the queue is empty).
    pub fn run_until(&mut self, end: Time) {
        while let Some(&Reverse((at, _, slot))) = self.queue.peek() {
            if at > end {
                break;
            }
            self.queue.pop();
            let ev = self.slab[slot as usize].take().expect("a scheduled event");
            self.free.push(slot);
            self.now = at;
            self.dispatch(ev);
        }
        self.now = self.now.max(end);
    }

    fn dispatch(&mut self, ev: Ev) {
        match ev {
            Ev::Input(n, i) => self.deliver(n, i),
            Ev::Timer(n, t) => {
                let node = &mut self.nodes[n as usize];
                if node.timer != Some(t) || node.broker.is_none() {
                    return;
                }
                node.timer = None;
                if node.stopped_until.is_some() {
                    node.timer_missed = true;
                    return;
                }
                self.handle(n, Input::Timer);
            }
            Ev::Connect(n) => self.connect(n),
            Ev::ProbeRound(n) => self.probe_round(n),
            Ev::ShellEnd(n, id, status) => {
                if self.nodes[n as usize].shells.remove(&id).is_some() {
                    let report =
                        ShellReport { status, tasks: vec![], error: None, abort_code: None, usage: None, ended: None };
                    self.deliver(n, Input::ShellDone { id, report: Some(report), status: 0, lingering: vec![] });
                }
            }
            Ev::Resume(n) => self.resume(n),
            Ev::Starve(n) => self.starve(n),
            Ev::StarveEnd(n) => self.resume(n),
            Ev::Fault(f) => self.inject(f),
            Ev::Client(m) => {
                if self.cfg.statedir && self.nodes[0].broker.is_none() {
                    return self.client_conn_failed(m.matchtag, crate::message::errno::ECONNREFUSED);
                }
                self.pending.insert(m.matchtag, (m.topic.clone(), m.nodeid, self.now));
                self.deliver(0, Input::Message(Peer::Local(CLIENT), 0, m));
            }
            Ev::Check(k) => self.check(k),
            Ev::Synced0(upto, life) => {
                if self.sync0 == Some(life) {
                    self.sync0 = None;
                    if self.nodes[0].broker.is_some() {
                        self.deliver(0, Input::Synced { upto, result: Ok(()) });
                    }
                }
            }
            Ev::ConnectDeadline(n, conn) => {
                let Some(l) = self.links.get(&n).copied() else { return };
                if l.conn != conn || !l.adopt || l.at_parent {
                    return; // accepted, refused, or replaced meanwhile
                }
                // The candidate never answered the hello (it died, or is stopped, with it in flight): the attempt
                // times out and the orphan closes its socket, as the real driver drops its attempt. A candidate
                // that is only stopped reads the hello and then the EOF once it runs again.
                self.links.remove(&n);
                if self.reachable(n, l.parent) {
                    let lat = self.cfg.latency;
                    self.after(lat, Ev::Input(l.parent, Input::Closed(Peer::Child(n), conn, "EOF".into())));
                }
                if let Some(o) = self.watch.open.get_mut(&n) {
                    o.3 += 1;
                }
                self.deliver(n, Input::ParentFailed("timed out".into()));
            }
        }
    }

    /// A child starts connecting: its hello reaches the parent after the link's latency.
    fn connect(&mut self, n: u32) {
        let Some(p) = self.cfg.topo.parent(self.cfg.brokers, n) else { return };
        self.connect_to(n, p, None, false);
    }

    /// Rank `n` connects to rank `p` as its parent (asking to be adopted when its parent `adopt` was lost).
    fn connect_to(&mut self, n: u32, p: u32, adopt: Option<u32>, last_resort: bool) {
        if self.nodes[n as usize].broker.is_none() {
            return;
        }
        let conn = self.next_conn;
        self.next_conn += 1;
        let link = LinkState { conn, parent: p, adopt: adopt.is_some(), last_resort, at_parent: false, at_child: true };
        self.links.insert(n, link);
        let mut body =
            crate::broker::liveness::hello_payload(n, "sim", self.cfg.brokers, &self.cfg.topo, &format!("node{n}"));
        if let Some(l) = adopt {
            crate::broker::reparent::ask_adoption(&mut body, l, last_resort);
        }
        let hello = Message::control("hello", &body);
        let lat = self.cfg.latency;
        self.after(lat, Ev::Input(p, Input::Hello { conn, msg: hello, addr: format!("node{n}"), refusal: None }));
    }

    /// Hand node `n`'s broker an input now, or queue it while the broker is stopped.
    fn deliver(&mut self, n: u32, i: Input) {
        let node = &mut self.nodes[n as usize];
        if node.broker.is_none() {
            return;
        }
        if node.stopped_until.is_some() {
            node.backlog.push_back(i);
            return;
        }
        if node.joining {
            match i {
                Input::ParentUp(_) => {}
                Input::Start => {
                    node.joining = false;
                    self.handle(n, i);
                    let backlog = std::mem::take(&mut self.nodes[n as usize].backlog);
                    for i in backlog {
                        self.deliver(n, i);
                    }
                    return;
                }
                _ => {
                    node.backlog.push_back(i);
                    return;
                }
            }
        }
        self.handle(n, i);
    }

    /// Handle one input and everything it leads to at once (as the tokio driver does), then re-arm the timer.
    fn handle(&mut self, n: u32, first: Input) {
        let mut queue = std::mem::take(&mut self.scratch);
        queue.push_back(first);
        while let Some(i) = queue.pop_front() {
            let now = self.now;
            let Some(b) = self.nodes[n as usize].broker.as_mut() else { return };
            self.events += 1;
            self.trace = fnv(fnv(fnv(self.trace, now.as_nanos()), u64::from(n)), kind(&i));
            let watched = watched(n);
            if watched && !matches!(i, Input::Timer | Input::AckSamples(_)) {
                eprintln!("{:.6} r{n} < {}", now.as_secs_f64(), describe_input(&i));
            }
            b.handle(now, i);
            // As the real driver: rank 0's journal batch (Effect::Store) comes first, its fsync (Effect::Sync)
            // next, then what the input asked for.
            while let Some(e) = self.nodes[n as usize].broker.as_mut().and_then(|b| b.poll_effect()) {
                if watched && !quiet(&e) {
                    eprintln!("{:.6} r{n} > {}", now.as_secs_f64(), describe_effect(&e));
                }
                if self.crash_in_commit && matches!(e, Effect::Store { batch: Some(_) }) {
                    // Killed before its batch is written: nothing of the turn is kept, nothing it asked for done.
                    self.crash_in_commit = false;
                    self.rank0_crashed(true);
                    self.process_gone(0, 137);
                    self.scratch = queue;
                    return;
                }
                self.execute(n, e, &mut queue);
            }
        }
        self.scratch = queue;
        let Some(b) = self.nodes[n as usize].broker.as_ref() else { return };
        if b.children.len() > self.watch.max_children.0.min(self.static_fanout) {
            self.children_grew(n);
        }
        if n == 0 {
            self.rank0_handled();
        }
        let Some(b) = self.nodes[n as usize].broker.as_ref() else { return };
        if b.finished() {
            let code = b.exit_code();
            return self.process_gone(n, code);
        }
        let d = b.next_deadline();
        let node = &mut self.nodes[n as usize];
        if d != node.timer {
            node.timer = d;
            if let Some(t) = d {
                // A deadline already due fires after this input, never in a loop at the same instant.
                let t = if t <= self.now { self.now + Duration::from_micros(1) } else { t };
                self.nodes[n as usize].timer = Some(t);
                self.at(t, Ev::Timer(n, t));
            }
        }
    }

    /// Rank 0 with [`Config::statedir`] ([`Effect::Store`]): apply its journal batch to the store and tell it
    /// ([`Input::Stored`]), as the real driver's commit does (`broker/statedir_io.rs`).
    fn commit0(&mut self, batch: Option<&crate::jobs::journal::Journal>) {
        let now = self.now;
        let Some(b) = self.nodes[0].broker.as_mut() else { return };
        let Some(kept) = self.kept.as_mut() else { return };
        let result = match batch {
            Some(j) => kept.apply(j).map_err(|e| vigil_core::broker::store::CommitError {
                why: e.to_string(),
                errno: crate::message::errno::EIO,
            }),
            None => Ok(()),
        };
        if let Err(e) = &result {
            self.violations.push(format!("rank 0's journal batch does not apply to its store: {e}"));
        }
        let input = Input::Stored { result, durable: false };
        self.events += 1;
        self.trace = fnv(fnv(fnv(self.trace, now.as_nanos()), 0), kind(&input));
        b.handle(now, input);
    }

    /// Rank 0 with [`Config::statedir`] ([`Effect::Sync`]): start an fsync covering write `upto`, reported
    /// ([`Ev::Synced0`]) after [`SYNC_DELAY`], as the real driver's store thread does. Its store is in memory:
    /// what was written stays whatever happens to the broker (`kill -9` loses nothing written; a power cut is
    /// not simulated).
    fn sync0(&mut self, upto: u64) {
        self.sync0 = Some(self.restarts0);
        self.after(SYNC_DELAY, Ev::Synced0(upto, self.restarts0));
    }

    /// Rank 0's broker dies (with [`Config::statedir`]): noted with the jobs running then; the client's requests
    /// in flight fail (its connection is reset), and submissions among them are sent again later.
    fn rank0_crashed(&mut self, in_commit: bool) {
        let Some(b) = self.broker(0) else { return };
        let running = b.jobcore.as_ref().map_or_else(Vec::new, |jc| {
            jc.jobs.values().filter(|j| matches!(j.state, JobState::Run | JobState::Cleanup)).map(|j| j.id).collect()
        });
        self.client.crashes.push((self.now, in_commit, running));
        let inflight: Vec<u32> = std::mem::take(&mut self.pending).into_keys().collect();
        for tag in inflight {
            self.watch.pings.remove(&tag);
            self.client_conn_failed(tag, crate::message::errno::ECONNRESET);
        }
    }

    /// A request of the client's failed on its side (`errno`: its connection to rank 0 was refused or reset):
    /// a submission is sent again after [`CLIENT_RETRY`] (as one answered EAGAIN is).
    fn client_conn_failed(&mut self, tag: u32, errno: u32) {
        self.client.conn_failed.insert(tag, errno);
        let why = if errno == crate::message::errno::ECONNREFUSED { "connection refused" } else { "connection reset" };
        self.responses.insert(tag, (errno, serde_json::json!({"errstr": why})));
        self.resubmit(tag);
    }

    /// Send the submission of request `tag` again after [`CLIENT_RETRY`] (with [`Config::statedir`]).
    fn resubmit(&mut self, tag: u32) {
        if let Some((key, payload)) = self.client.submits.get(&tag).cloned() {
            let t = self.now + CLIENT_RETRY;
            let again = self.request_at(t, "job-manager.submit", 0, &payload);
            self.client.submits.insert(again, (key, payload));
            self.client.retried.insert(tag, again);
        }
    }

    /// The client submits `jobspec` from rank 0 at `t` (its matchtag returned). With [`Config::statedir`] the
    /// command names the submission (`key=K`, K its first matchtag), so that a job can be told from another
    /// submission's, and a submission whose connection fails is sent again, with the same submission key
    /// (`submit_key`, `jobs/submit_key.rs`, as `vigil submit` does): rank 0 answers a request sent again for a
    /// job it already made with that job.
    pub fn submit_at(&mut self, t: Time, mut jobspec: serde_json::Value) -> u32 {
        let key = self.next_tag;
        if self.cfg.statedir {
            if let Some(cmd) = jobspec.pointer_mut("/tasks/0/command").and_then(|c| c.as_array_mut()) {
                cmd.push(serde_json::json!(format!("key={key}")));
            }
        }
        let payload = if self.cfg.statedir {
            serde_json::json!({ "jobspec": jobspec, "submit_key": format!("sim-{key:08x}") })
        } else {
            serde_json::json!({ "jobspec": jobspec })
        };
        let tag = self.request_at(t, "job-manager.submit", 0, &payload);
        if self.cfg.statedir {
            self.client.submits.insert(tag, (key, payload));
        }
        tag
    }

    /// Rank `n` may have more children than ever seen, or than it may adopt up to: note it.
    fn children_grew(&mut self, n: u32) {
        let Some(b) = self.broker(n) else { return };
        let c = b.children.len();
        // Rank 0's last resort (reparent.rs): past its limit, one child per orphan that every live candidate
        // refused for capacity.
        let last_resort = if n == 0 {
            self.links.iter().filter(|(r, l)| l.parent == 0 && l.last_resort && b.children.contains_key(*r)).count()
        } else {
            0
        };
        if c > self.watch.max_children.0 {
            self.watch.max_children = (c, n);
        }
        let (topo, size) = (self.cfg.topo, self.cfg.brokers);
        let bound = crate::broker::reparent::adopt_limit(topo, size, n) + topo.children(size, n).len() + last_resort;
        if c > bound {
            let worst = self.watch.over_bound.entry(n).or_insert(0);
            *worst = (*worst).max(c);
        }
    }

    /// Rank 0 handled an input: a re-parent it recorded meanwhile is noted, and its orphan pinged from the client
    /// (reachable from rank 0 again once the answer comes back).
    fn rank0_handled(&mut self) {
        let Some(jc) = self.broker(0).and_then(|b| b.jobcore.as_ref()) else { return };
        let log = &jc.resource_eventlog;
        if log.len() <= self.watch.seen {
            return;
        }
        let fresh: Vec<(u32, u32, u32)> = log[self.watch.seen..]
            .iter()
            .filter(|e| e.name == "reparent")
            .filter_map(|e| {
                let ids: crate::idset::IdSet = e.context.get("idset")?.as_str()?.parse().ok()?;
                let rank = ids.iter().next()?;
                let parent = u32::try_from(e.context.get("parent")?.as_u64()?).ok()?;
                let lost = u32::try_from(e.context.get("lost")?.as_u64()?).ok()?;
                Some((rank, parent, lost))
            })
            .collect();
        self.watch.seen = log.len();
        for (rank, parent, lost) in fresh {
            let (asked, attempts, timeouts) = match self.watch.open.remove(&rank) {
                Some((l, t, k, d)) if l == lost => (Some(t), k, d),
                _ => (None, 0, 0),
            };
            let i = self.watch.done.len();
            let now = self.now;
            let rec = Reattach {
                rank,
                parent,
                lost,
                asked,
                attempts,
                timeouts,
                recorded: now,
                answered: None,
                ping_retries: 0,
            };
            self.watch.done.push(rec);
            let tag = self.request_at(self.now, "broker.ping", rank, &serde_json::json!({}));
            self.watch.pings.insert(tag, i);
        }
    }

    /// Whether data sent from rank `a` reaches rank `b`'s kernel now (`a` and `b` neighbours in the tree).
    fn reachable(&self, a: u32, b: u32) -> bool {
        let child = if self.links.get(&a).is_some_and(|l| l.parent == b) { a } else { b };
        self.nodes[b as usize].kernel && self.nodes[a as usize].kernel && !self.cut.contains_key(&child)
    }

    /// Since when the link of `child` has carried nothing (its far end dead or the link cut).
    fn silent_since(&self, child: u32, far: u32) -> Option<Time> {
        let mut t = self.cut.get(&child).copied();
        if let Some(d) = self.nodes[far as usize].died_at {
            t = Some(t.map_or(d, |x| x.min(d)));
        }
        t
    }

    /// Whether broker `n` holds child `r` on a socket `r` no longer holds (its connection number there): a hello
    /// it read late, after the orphan gave up on it (timed out while `n` was stopped) and closed the link, died,
    /// or joined another parent. The child's side is gone, so the link of `r` in the world, if any, is another.
    fn stale_child(&self, n: u32, r: u32) -> Option<u64> {
        let conn = *self.broker(n)?.children.get(&r)?;
        self.links.get(&r).is_none_or(|l| l.parent != n || l.conn != conn).then_some(conn)
    }

    /// Node `n` closes its end of the link of `child`; the other end hears of it (EOF) if its kernel can.
    fn close_end(&mut self, n: u32, child: u32, why: &str) {
        let at_child_end = n == child;
        let Some(l) = self.links.get(&child).copied() else { return };
        // The child closes: the parent reads the EOF if it accepted the link, and also if the child's hello is
        // still unread there (in flight, or queued at a stopped parent: the handshake is done), after the hello.
        // A parent that refused or closed the link already ignores it (no child on that link).
        let (conn, other_open) = (l.conn, if at_child_end { l.at_parent || l.at_child } else { l.at_child });
        self.shut(child, at_child_end);
        let parent = l.parent;
        let far = if at_child_end { parent } else { child };
        if other_open && self.reachable(n, far) {
            let lat = self.cfg.latency;
            let input = if at_child_end {
                Input::Closed(Peer::Child(child), conn, why.into())
            } else {
                Input::Closed(Peer::Parent, 0, why.into())
            };
            self.after(lat, Ev::Input(far, input));
            // The far socket is closed too once it has read the EOF.
            self.shut(child, !at_child_end);
        }
    }

    /// Close one socket of the link of `child`: its own end (`child_end`) or its parent's; a link closed at both
    /// ends is gone.
    fn shut(&mut self, child: u32, child_end: bool) {
        let Some(l) = self.links.get_mut(&child) else { return };
        if child_end {
            l.at_child = false;
        } else {
            l.at_parent = false;
        }
        if !l.at_child && !l.at_parent {
            self.links.remove(&child);
        }
    }

    /// Node `n`'s broker process ended (exited, crashed, refused): its kernel closes every socket it had.
    fn process_gone(&mut self, n: u32, code: i32) {
        let node = &mut self.nodes[n as usize];
        if node.broker.is_none() {
            return;
        }
        node.broker = None;
        node.exit = Some(code);
        node.timer = None;
        node.backlog.clear();
        node.stopped_until = None;
        node.prober.clear();
        node.parent_probe = None;
        // Its shells die with it (the real driver kills their process groups on the way out).
        node.shells.clear();
        // Its children's links (static or adopted) and its own.
        let mut mine: Vec<u32> = self.links.iter().filter(|(_, l)| l.parent == n).map(|(c, _)| *c).collect();
        if self.links.contains_key(&n) {
            mine.push(n);
        }
        for c in mine {
            self.close_end(n, c, "EOF");
        }
    }

    /// The client sends a request from rank 0 at `t`; its response is kept by matchtag (returned).
    pub fn request_at(&mut self, t: Time, topic: &str, nodeid: u32, payload: &serde_json::Value) -> u32 {
        let mut m = Message::request(topic, nodeid, payload);
        m.matchtag = self.next_tag;
        self.next_tag += 1;
        let tag = m.matchtag;
        self.at(t, Ev::Client(m));
        tag
    }

    fn client_got(&mut self, m: Message) {
        if m.msgtype != MsgType::Response {
            return;
        }
        if self.pending.remove(&m.matchtag).is_some() {
            if let Some((key, _)) = self.client.submits.get(&m.matchtag) {
                let answer = m.json();
                let id = answer.get("id").and_then(serde_json::Value::as_u64);
                let duplicate = answer.get("duplicate").and_then(serde_json::Value::as_bool).unwrap_or(false);
                if let (0, Some(id)) = (m.errnum, id) {
                    self.client.acked.push((*key, JobId(id), self.now, duplicate));
                }
                if m.errnum == crate::message::errno::EAGAIN {
                    // "Try again": a restarted rank 0 whose brokers have not all rejoined yet.
                    self.resubmit(m.matchtag);
                }
            }
            if let Some(i) = self.watch.pings.remove(&m.matchtag) {
                let (rank, retries) = (self.watch.done[i].rank, self.watch.done[i].ping_retries);
                if m.errnum == 0 {
                    self.watch.done[i].answered = Some(self.now);
                } else if retries < PING_RETRIES && self.broker(rank).is_some() {
                    // Unreachable for now: a router above its new parent may have died with the ping in flight
                    // and be re-parenting itself. Again, later; the invariant is that it answers at all.
                    self.watch.done[i].ping_retries += 1;
                    let tag = self.request_at(self.now + PING_RETRY_AFTER, "broker.ping", rank, &serde_json::json!({}));
                    self.watch.pings.insert(tag, i);
                }
            }
            self.responses.insert(m.matchtag, (m.errnum, m.json()));
        }
    }

    /// Rank `r`'s broker, if its process runs.
    fn broker(&self, r: u32) -> Option<&Broker> {
        self.nodes.get(r as usize).and_then(|n| n.broker.as_deref())
    }
}

#[cfg(test)]
mod tests;
