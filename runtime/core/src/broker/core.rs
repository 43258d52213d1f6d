//! The broker's rules as one sans-IO state machine.
//!
//! A [`Broker`] is driven like quinn-proto's `Connection` and like [`crate::jobs::JobCore`]: the driver hands it
//! an [`Input`] together with the current [`Time`] ([`Broker::handle`]), collects the [`Effect`]s it asks for
//! ([`Broker::poll_effect`]), carries them out, and calls it again at [`Broker::next_deadline`] with
//! [`Input::Timer`]. Nothing in here touches a socket, a file, a process, a clock or a random number: the tokio
//! driver (`driver.rs`) does all of that, and a test or a simulator can drive many brokers in one process on
//! virtual time.
//!
//! Where the rules live:
//! - this file: the broker's state, input dispatch, shutdown, the initial program;
//! - `routing.rs`: requests, responses, events and internal requests across the TBON;
//! - `liveness.rs`: the hello, heartbeats, link liveness verdicts and what a lost child means;
//! - `reparent.rs`: what an orphan does when its parent is lost, who adopts it, routing by current parents;
//! - `rejoin.rs`: a child of rank 0 outlives it for `tbon.parent_grace` and rejoins it when it restarts;
//! - `services/`: every service method, one file per service with its table of topics (`broker.*`, `rexec.*`,
//!   `resource.*`, `overlay.*`, `job-*`);
//! - [`crate::jobs`]: the job manager, scheduler and exec rules; [`crate::membership`]: one link's liveness.

use crate::idset::IdSet;
use crate::jobs::{JobCore, JobId};
use crate::membership::{Membership, Signal};
use crate::message::Message;
use crate::shellproto::{ShellExit, ShellInput, ShellReport};
use crate::topology::Topology;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::time::Duration;
use tracing::{debug, error, info, warn};
use vigil_proto::node::NodeResources;

/// A point on the broker's monotonic clock: nanoseconds since an origin the driver chooses (the tokio driver: the
/// broker's start; a simulator: the start of its run). The one time type of the sans-IO broker.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Time(u64);

impl Time {
    /// The origin.
    pub const ZERO: Time = Time(0);

    /// `ns` nanoseconds after the origin.
    pub const fn from_nanos(ns: u64) -> Time {
        Time(ns)
    }

    /// Nanoseconds since the origin.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// `s` seconds after the origin (negative and NaN clamp to the origin; beyond ~584 years saturates).
    pub fn from_secs_f64(s: f64) -> Time {
        Time((s.max(0.0) * 1e9).min(u64::MAX as f64) as u64)
    }

    /// Seconds since the origin.
    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 / 1e9
    }

    /// How long after `earlier` this is (zero if it is not later).
    pub fn since(self, earlier: Time) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

impl std::ops::Add<Duration> for Time {
    type Output = Time;
    /// Saturating: a deadline centuries away does not wrap.
    fn add(self, d: Duration) -> Time {
        Time(self.0.saturating_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)))
    }
}

/// Who a message came from or goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Peer {
    /// The TBON parent.
    Parent,
    /// A TBON child, by rank.
    Child(u32),
    /// A local client, by connection id; `Local(u32::MAX)` is the broker itself (internal requests).
    Local(u32),
}

/// The origin of requests the broker makes itself.
pub const SELF: Peer = Peer::Local(u32::MAX);

/// Membership key for the parent link.
pub const PARENT: u32 = u32::MAX;

/// A PMI barrier in progress (`job-exec.pmi-barrier`): the waiting request of each shell that arrived (its head:
/// what an answer needs), with its puts, by shell rank.
#[derive(Debug, Default)]
pub struct PmiBarrier {
    pub waiting: BTreeMap<u32, (Message, serde_json::Map<String, Value>)>,
    /// Bytes of the waiting shells' puts as JSON, summed: the union answered to every shell is at most this
    /// large, and may not pass 63 MiB (`PMI_EXCHANGE_MAX` in `services/job_exec.rs`).
    pub bytes: usize,
}

/// How long a broker waits for its children to leave during shutdown.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// How long shells' exit reports may wait for the fsync that acknowledges them when no submission waits for one
/// (before an [`Effect::Sync`] goes out for them): 20 ms. Nothing waits on that acknowledgement (the reporting broker keeps the
/// report until then, and the job finished when rank 0 took the report), so reports are grouped: at most 50
/// fsyncs a second for them however many jobs end, instead of about one per job ending (measured: 0.9 per job
/// in a flood of `true` jobs, each fsync ~0.1 ms of CPU). A `kill -9` of rank 0 loses nothing by it (the report
/// is written before); a power cut of rank 0's node meanwhile may lose the last 20 ms of exit statuses, which
/// their brokers still hold and send again to the restarted rank 0.
pub const EXIT_REPORT_SYNC_DELAY: Duration = Duration::from_millis(20);

/// Most [`Effect::Store`]s one cut hands out: 4. The first writes what the inputs changed; handling its outcome
/// rarely changes the journal again (a refused write ends its submissions' jobs, which is written next), and a
/// store that keeps refusing is tried again at the next cut rather than in a loop.
pub const MAX_STORES_PER_CUT: u8 = 4;

/// Where [`Broker::poll_effect`] is in a cut: durability first ([`Effect::Store`], [`Effect::Sync`]), then the
/// effects asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cut {
    /// The last drain ended (or none began): the next poll begins a cut.
    Due,
    /// Writing: this many [`Effect::Store`]s handed out in this cut (at [`MAX_STORES_PER_CUT`], none more).
    Writing(u8),
    /// An [`Effect::Store`] is out (the `written`th of the cut): nothing else goes out before its
    /// [`Input::Stored`]. `last`: it wrote nothing (`None`), and the cut writes no more.
    Awaiting { written: u8, last: bool },
    /// The effects asked for go out, in order, until none is left.
    Draining,
}

/// What a broker's stop means for the brokers below it ([`Broker::begin_shutdown_for`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// They stop too (or re-parent, when this broker lost its own parent).
    Instance,
    /// This broker alone stops (SIGTERM of a broker other than rank 0: `systemctl stop` on its node): its
    /// children re-parent, as when a router is lost.
    Alone,
    /// Rank 0 stops to be restarted on its state directory: its children wait for it (`rejoin.rs`).
    Restart,
}

/// What the driver knows about its own parts, for status output (`broker.info`, `overlay.status`): handed in
/// with [`Input::Status`] whenever it changes.
#[derive(Clone, Debug, Default)]
pub struct DriverStatus {
    /// Which failure detectors run, as `{process_exit, tcp, responder, probes[, probing]}` (the driver's
    /// `broker/detect/status.rs`).
    pub detectors: Value,
    /// Overlay connections refused before authentication (see `secure::RefusalLog`).
    pub refused: u64,
    /// Why rank 0's writer thread cannot fold the redo log into its store (a full disk), while it cannot: the
    /// log keeps every record meanwhile (durable), and grows (`vigil uptime` says so).
    pub fold_failing: Option<String>,
    /// The node health check (`crate::health`): `null` when `health.program` is unset, else `{program,
    /// interval (seconds), state: starting|ok|failing, reason, runs}`.
    pub health: Value,
}

/// Facts about this broker's process and node that the driver finds out once, before the broker starts.
#[derive(Clone, Debug)]
pub struct Environment {
    /// The instance owner (this process's uid): the only user a personal instance serves, and the one who may
    /// do everything in a multi-user one (`broker/access.rs`).
    pub uid: u32,
    /// This broker's process id (`broker.ping`, `broker.pid`).
    pub pid: u32,
    /// Wall-clock time at [`Time::ZERO`], seconds since the Unix epoch (eventlog timestamps, RFC 18).
    pub wall_origin: f64,
    /// This broker's local connector URI (handed to shells and the initial program).
    pub local_uri: String,
    /// This node's resources as discovered.
    pub resources: NodeResources,
    /// Where the shells find this node's topology (`live`, `live-xml:PATH`, `synthetic:...`, `cpu-count`).
    pub topology: String,
    /// How job shells are contained, for status output: `cgroup2 (PATH)` or `process groups (why)`.
    pub containment: String,
    /// Where this broker serves its metrics, for status output: `http://ADDR/metrics ...`, `off`, or `off:
    /// cannot listen on ADDR (why)` (`-S metrics.listen`, docs/metrics.md).
    pub metrics: String,
}

/// One input to the broker, handed in with the time it happened ([`Broker::handle`]).
#[derive(Debug)]
pub enum Input {
    /// Join the instance: register this node with rank 0 (once, after the parent link is up).
    Start,
    /// The parent link is up (authenticated, hello acknowledged), using this transport.
    ParentUp(super::links::LinkChoice),
    /// The candidate parent asked for with [`Effect::ConnectParent`] could not be reached (nothing listens, no
    /// answer within the timeout, no handshake): why.
    ParentFailed(String),
    /// The candidate parent asked for with [`Effect::ConnectParent`] answered our hello with a refusal (it is
    /// alive): why, and whether for capacity alone (`full`: it has the most children it adopts up to, the
    /// `refused` message's `full` field; see `reparent.rs`, "Last resort").
    ParentRefused { why: String, full: bool },
    /// The static parent could not be had at start (before [`Input::Start`]), why: a nested broker's (its
    /// endpoints exchanged through PMI after every broker bound its listener) whose parent's endpoint is absent
    /// (its node was lost before the exchange ended), where nothing listens any more (its broker is gone), or
    /// whose node's kernel does not answer (dead or cut off after the exchange). Re-parent as from a parent lost
    /// later (`reparent.rs`): tree repair, no verdict on that parent, which joins as a leaf if it comes up after
    /// all; when that cannot be (re-parenting off, no candidate), exit.
    FirstParentFailed(String),
    /// A message on a link (`conn`: the child link's connection number; 0 for the parent and local clients).
    Message(Peer, u64, Message),
    /// A link closed, or the kernel said so (reset); `conn` as for [`Input::Message`].
    Closed(Peer, u64, String),
    /// A request the driver could not deliver: its link to `peer` had closed meanwhile.
    Bounced(Peer, Message),
    /// A would-be child's hello on a new authenticated link `conn` from `addr`; `refusal`: the link layer's own
    /// reason to refuse it (its RDMA offer cannot be met).
    Hello { conn: u64, msg: Message, addr: String, refusal: Option<String> },
    /// A local client connected with this uid (checked by SO_PEERCRED).
    LocalNew { id: u32, uid: u32 },
    /// The job shell asked for with [`Effect::SpawnShell`] runs as this pid, or could not be started.
    ShellStarted { id: JobId, result: Result<i32, String> },
    /// The job shell of `id` exited with this wait status; `report` is what it wrote on stdout. `lingering`: the
    /// pids still in its cgroup after the driver killed it (`cgroup.kill`), empty when it emptied (or there is no
    /// cgroup); then the report waits for [`Input::CgroupEmptied`] or `exec.kill-timeout` (`unkillable.rs`).
    ShellDone { id: JobId, report: Option<ShellReport>, status: i32, lingering: Vec<u32> },
    /// The cgroup of job `id`'s shell, which still held processes when the shell ended ([`Input::ShellDone`]'s
    /// `lingering`), is empty now.
    CgroupEmptied(JobId),
    /// The initial program exited with this code.
    InitialExit(i32),
    /// The broker process received this signal.
    Signal(i32),
    /// The enclosing instance declared lost the nodes of these ranks of this nested instance (its job's
    /// `node-failure` exception, whose `shell_ranks` are this instance's ranks), or their brokers failed on live
    /// nodes (a severity-2 `exec` exception with `shell_ranks`), saying `why` (the reason the ranks get here); see
    /// [`Effect::WatchEnclosing`].
    EnclosingLost { ranks: IdSet, why: String },
    /// The kernel's ACK state of each link, as `(rank, unacked segments, age of the last ACK in seconds, round
    /// trip bound in seconds)` ([`PARENT`] = the parent), sampled for one [`Effect::Heartbeat`] or
    /// [`Effect::SampleAcks`]. The bound is the kernel's `srtt + 4 × rttvar` of the connection (`TCP_INFO`), 0 when
    /// unknown: on a slow or congested link data waits that long for its ACK as a matter of course.
    AckSamples(Vec<(u32, u32, f64, f64)>),
    /// A liveness signal about child `rank` from the prober.
    Probe(u32, Signal),
    /// A process watched with [`Effect::WatchPid`] exited; `body` says how (`detect.watch`'s answer).
    ProcessExit(u32, Value),
    /// A process could not be watched: pid, errno (`ESRCH`: already gone; `ENOSYS`: no exit detector), why.
    WatchFailed(u32, u32, String),
    /// `broker.detectors=ebpf` and the eBPF detectors could not run: why. Fatal.
    DetectorsFailed(String),
    /// The driver's parts changed (status output).
    Status(DriverStatus),
    /// The deadline given by [`Broker::next_deadline`] passed (or the driver is unsure: harmless).
    Timer,
    /// The check asked for with [`Effect::CheckNode`] `token` ended: `Some(true)` the node's kernel answered
    /// (a SYN-ACK or a reset), `Some(false)` nothing answered within the wait, `None` it could not be tried (no
    /// address known for that node).
    NodeChecked { token: u64, answered: Option<bool> },
    /// The driver carried out the [`Effect::Store`] it was handed last, in one transaction: `result` whether the
    /// store took the batch, `durable` whether the write was also fsynced (with everything before it). Handed in
    /// at once, before the next [`Broker::poll_effect`]. The submissions held for this batch are answered now when
    /// `durable`; otherwise once an [`Input::Synced`] covers this write (refused at once if the write failed).
    Stored { result: Result<(), super::store::CommitError>, durable: bool },
    /// The driver's fsync of the store, asked for by [`Effect::Sync`] `upto`, ended: every write numbered up to
    /// `upto` (the count of successful [`Input::Stored`] so far) is on disk (`Ok`), or may not be (`Err`: their
    /// held submissions are refused and their jobs end, as for a failed write).
    Synced { upto: u64, result: Result<(), super::store::CommitError> },
}

/// A request whose answer waits until what it changed is durable ([`Broker::awaiting_durable`],
/// [`Broker::awaiting_sync`]).
#[derive(Clone, Debug, PartialEq)]
pub enum Held {
    /// A submission, with its answer (the job id): refused, and its job ended, if the store fails. One sent again
    /// with its key (`"duplicate": true`) is refused then too, and leaves its job to the first one's answer.
    Submission(Value),
    /// A job shell's exit report (`job-exec.shell-exit`), acknowledged with `{}`: the reporting broker drops the
    /// report then, so only once its exit status is durable. While the store fails it is not acknowledged (it
    /// waits for the next write that succeeds): its broker keeps the report, sends it again to a restarted rank
    /// 0 (`rejoin.rs`), and names the job among those it still has.
    ExitReport,
}

/// Rank 0's state directory as the driver found it at start (`store.rs`): for `broker.info` (`vigil uptime`)
/// and for the rule that a submission is answered only once it is durable.
#[derive(Clone, Debug, Default)]
pub enum StateDir {
    /// None (`statedir` unset, or not rank 0): nothing is kept across a restart of rank 0.
    #[default]
    None,
    /// Open: every change is journaled, submissions are answered once durable.
    Open {
        /// The directory.
        dir: PathBuf,
        /// Times rank 0 started on it after the first (this start counted).
        restarts: u64,
        /// The last commit failed, and why (submissions are refused until one succeeds).
        failing: Option<String>,
    },
    /// The store could not be read: scheduling is stopped, submissions are refused, the file is left alone.
    Damaged {
        /// The directory.
        dir: PathBuf,
        /// What is wrong with the store.
        why: String,
    },
}

/// What the broker asks its driver to do, in order ([`Broker::poll_effect`]).
///
/// Durability goes out here too, ahead of the rest: with a state directory (rank 0), the first poll after inputs
/// were handled (a *cut*) hands out the journal batch of everything those inputs changed ([`Effect::Store`]),
/// and an fsync ([`Effect::Sync`]) when held answers want one, before any other effect they asked for. So a
/// shell start, an answer or a message is carried out only once the change that led to it is written: a
/// `kill -9` of rank 0 loses nothing that a client, a shell or another broker has learnt of.
#[derive(Debug)]
pub enum Effect {
    /// Write this batch of the job core's journal (`jobs/journal.rs`) to the store in one transaction (`None`:
    /// nothing is left to write, only answers wait for a write: "written" at once), and hand the outcome back
    /// with [`Input::Stored`] at once, before polling again: until then nothing else goes out (a poll returns
    /// `None`). Handed out first in a cut, so that every effect after it follows the write; a few times in a row
    /// at most ([`MAX_STORES_PER_CUT`]) when handling the outcome changed the journal again (a refused write ends
    /// the jobs of its submissions). Put off to a later cut only while an fsync is in flight and the inputs
    /// since the last batch were submissions alone and asked for nothing (their answers wait for an fsync
    /// anyway, and no one outside rank 0 has learnt of them): group commit, one write per fsync in a flood of
    /// submissions; never once the driver's loop has ended ([`Broker::loop_ended`]).
    Store { batch: Option<std::sync::Arc<crate::jobs::journal::Journal>> },
    /// Fsync the store so that every write numbered up to `upto` (the count of successful [`Input::Stored`]) is
    /// on disk; answer with [`Input::Synced`] when it ends, which may be long after (the broker goes on, and the
    /// answers held for those writes wait). One at a time: the next goes out, in a later cut, once this one's
    /// [`Input::Synced`] came, covering everything written meanwhile. Handed out in a cut after its
    /// [`Effect::Store`]s, before the other effects: at once for a submission, after
    /// [`EXIT_REPORT_SYNC_DELAY`] for shells' exit reports alone ([`Broker::next_deadline`] says when).
    Sync { upto: u64 },
    /// Send a message on the link to this peer. A request that cannot be sent comes back as [`Input::Bounced`].
    Send(Peer, Message),
    /// Accept the would-be child on link `conn` as `rank`: acknowledge its hello, put the link in service
    /// (RDMA if agreed), and start probing and watching it.
    AcceptChild { conn: u64, rank: u32 },
    /// Refuse the would-be child on link `conn`, saying why (a `refused` control message, with `full: true` when
    /// `full`: refused for capacity alone, see [`super::reparent::Refusal`]), and drop the link.
    RefuseChild { conn: u64, why: String, full: bool },
    /// Drop the link to this peer (a child's only if it is still connection `conn`).
    DropLink(Peer, u64),
    /// Stop probing child `rank` and watching its connection.
    ForgetChild(u32),
    /// Connect to rank `rank` as our new parent, asking it to adopt us (our parent `lost` was lost): its
    /// endpoint, our hello with `adopt` (and `last_resort` when `last_resort`: every live candidate refused us
    /// for capacity, rank 0 is asked to adopt us past its limit; [`super::reparent::ask_adoption`]), within
    /// `timeout`. Answered with [`Input::ParentUp`], [`Input::ParentRefused`] or [`Input::ParentFailed`].
    ConnectParent { rank: u32, lost: u32, timeout: Duration, last_resort: bool },
    /// Beat this broker's heartbeat clock and sample every link's kernel ACK state ([`Input::AckSamples`]).
    Heartbeat,
    /// Beat this broker's heartbeat clock only (the age its node's responder reports to the parent's probes, in
    /// the XDP program's table or the userspace responder): every `tbon.stall_max / 4`
    /// ([`crate::membership::BEATS_PER_STALL`]), so that a stall is seen within `tbon.stall_max`.
    Beat,
    /// Sample every link's kernel ACK state now ([`Input::AckSamples`]): some link's unacknowledged data has
    /// reached `tbon.lost_timeout` between two heartbeats, and only a fresh sample may say it is lost.
    SampleAcks,
    /// Start job `id`'s shell with this input (stdin) and job directory.
    SpawnShell { id: JobId, input: Box<ShellInput>, tmpdir: PathBuf },
    /// Signal job `id`'s shell process group.
    SignalShell { id: JobId, signal: i32 },
    /// SIGKILL every job shell's process group (the broker is shutting down).
    KillShells,
    /// Run the initial program (`argv`), with `env` set in its environment besides the broker's own (a nested
    /// instance that started without some of its brokers: `VIGIL_JOB_NNODES` and `VIGIL_JOB_NODELIST` of the nodes
    /// it has).
    StartInitial {
        /// The program and its arguments.
        argv: Vec<String>,
        /// Variables to set.
        env: Vec<(String, String)>,
    },
    /// Signal the initial program's process group.
    SignalInitial(i32),
    /// Write a file (rundir markers for `vigil start`).
    WriteFile(PathBuf, String),
    /// Tell the enclosing instance (at `uri`) where this nested instance lives (`job-exec.nested`).
    ReportNested { uri: String, report: Value },
    /// Rank 0 of a nested instance (a batch or alloc job): follow its job `id` in the enclosing instance at `uri`
    /// (the job's eventlog) and hand in the brokers of this instance whose nodes the enclosing instance declares
    /// lost ([`Input::EnclosingLost`]): during start-up, before they join, nothing in this instance can judge them.
    WatchEnclosing { uri: String, id: String },
    /// Report when process `pid` exits ([`Input::ProcessExit`] or [`Input::WatchFailed`]).
    WatchPid(u32),
    /// Check whether the node of `target` answers at the kernel level: a TCP connection attempt to its probe port,
    /// given up after `wait`; answered with [`Input::NodeChecked`] `token` (see `confirm.rs`).
    CheckNode { token: u64, target: super::confirm::CheckTarget, wait: Duration },
}

/// A local client of this broker.
#[derive(Debug)]
pub struct LocalClient {
    /// Its uid (SO_PEERCRED).
    pub uid: u32,
    /// The event topic prefixes it subscribed to (`broker.sub`): a set, at most
    /// [`super::services::MAX_SUBS_PER_CLIENT`] of at most [`super::services::MAX_SUB_TOPIC`] bytes each.
    pub subs: BTreeSet<String>,
    /// It has a streaming request open on rank 0 (its watchers are dropped when it leaves).
    pub streaming: bool,
}

/// What an internal request (sent by the broker itself) was for.
#[derive(Debug)]
pub enum Internal {
    Spawn {
        id: JobId,
        rank: u32,
    },
    Ignore,
    /// A `rexec.kill` from rank 0's exec system: `signal` to the shell of job `id` on `rank`, sent along `path`
    /// ([`Broker::path_to`]). EHOSTUNREACH is told to the job core, which keeps the signal until the rank is
    /// reachable again (`jobs/kills.rs`, [`Broker::kill_unreachable`]).
    Kill {
        id: JobId,
        rank: u32,
        signal: i32,
        path: Vec<u32>,
    },
    /// A job shell's exit report (kept in [`Broker::exit_reports`] until answered).
    ShellExit,
    /// One round trip of overlay RTT measurement `run` (`broker.rtt`), sent at the given time.
    Rtt {
        run: u64,
        sent: Time,
    },
}

/// An overlay round-trip measurement run by this broker for a client (`broker.rtt`): `count` `broker.ping`
/// requests to `target`, at most `window` in flight, timed by this broker (no client hop in the measurement).
#[derive(Debug)]
pub struct RttRun {
    pub req: Message,
    pub target: u32,
    /// Requests still to send.
    pub left: u32,
    pub window: u32,
    pub inflight: u32,
    /// The requests' payload, JSON-encoded once for the whole run.
    pub payload: Vec<u8>,
    pub started: Time,
    pub samples_us: Vec<f64>,
}

/// Liveness of a rank as rank 0 knows it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MemberState {
    Online,
    Torpid,
    Offline,
    Lost,
}

impl MemberState {
    /// The word `vigil overlay status` and the metrics use: `online`, `torpid`, `offline`, `lost`.
    pub fn name(&self) -> &'static str {
        match self {
            MemberState::Online => "online",
            MemberState::Torpid => "torpid",
            MemberState::Offline => "offline",
            MemberState::Lost => "lost",
        }
    }
}

/// A streaming request for a job's eventlog and/or output.
#[derive(Debug)]
pub struct Watcher {
    pub req: Message,
    pub id: JobId,
    pub ev_pos: usize,
    pub out_pos: usize,
    pub eventlog: bool,
    pub output: bool,
    /// A job shell reading the job's standard input.
    pub stdin: bool,
    pub in_pos: usize,
    pub follow: bool,
}

/// One broker's state and rules (see the module documentation).
#[derive(Debug)]
pub struct Broker {
    pub opts: super::BrokerOptions,
    pub env: Environment,
    /// The time of the input being handled.
    pub now: Time,
    pub status: DriverStatus,
    /// Whether the parent link is up.
    pub parent_up: bool,
    /// Connected children: rank → the link's connection number.
    pub children: BTreeMap<u32, u64>,
    pub locals: HashMap<u32, LocalClient>,
    pub event_seq: u32,
    pub internal: HashMap<u32, Internal>,
    pub next_tag: u32,
    /// Jobs with a shell on this broker (being started or running).
    pub shells: BTreeSet<JobId>,
    /// `rexec.spawn` requests waiting for their shell to start.
    pub spawning: HashMap<JobId, Message>,
    pub jobcore: Option<JobCore>,
    pub watchers: Vec<Watcher>,
    /// Rank 0: every rank's state, reason and since when (s since the epoch).
    pub members: BTreeMap<u32, (MemberState, String, f64)>,
    pub shutting_down: Option<Time>,
    pub initial_started: bool,
    /// Its registration waits for the end of a re-parent begun at start ([`Input::FirstParentFailed`]): sent
    /// once adopted, naming the adopter as its parent.
    pub join_pending: bool,
    pub exit_code: i32,
    /// PMI barriers in progress, by job.
    pub pmi_barriers: HashMap<JobId, PmiBarrier>,
    /// Liveness of this broker's children (and, under [`PARENT`], of its parent).
    pub membership: Membership,
    /// Confirmations of suspect peers and this broker's own lateness (`confirm.rs`).
    pub(crate) confirm: super::confirm::Confirmations,
    pub next_heartbeat: Time,
    /// When this broker next beats its heartbeat clock ([`Effect::Beat`]): every `tbon.stall_max / 4`.
    pub next_beat: Time,
    /// Children that said goodbye: their disconnect is "offline", not "lost".
    pub goodbye: HashSet<u32>,
    /// Overlay RTT measurements in progress (`broker.rtt`), by id.
    pub rtt_runs: HashMap<u64, RttRun>,
    /// The transport each overlay link uses (rank 0 hears every child's report).
    pub links: super::links::Links,
    /// Local clients' `detect.watch` requests, by the pid they wait for.
    pub exit_waiters: HashMap<u32, Vec<Message>>,
    /// Requests forwarded to each child (and, under [`PARENT`], sent up to the parent) and not answered yet, by
    /// (matchtag, route key): answered with EHOSTUNREACH if that peer is lost first (see `routing.rs`).
    pub inflight: HashMap<u32, HashMap<(u32, u64), Message>>,
    /// The current parent's rank (`None`: rank 0, or re-parenting). See `reparent.rs`.
    pub parent: Option<u32>,
    /// Ranks whose current parent is not their static one, as this broker learned: rank → parent.
    pub adopted: BTreeMap<u32, u32>,
    /// Our search for an adoptive parent, while there is one.
    pub reparenting: Option<super::reparent::Reparent>,
    /// Rank 0: children of lost ranks expected to re-parent, by when, and the lost rank.
    pub orphans: BTreeMap<u32, (Time, u32)>,
    /// Job shells' exit reports not yet answered by rank 0, by matchtag (sent again after a re-parent).
    pub exit_reports: BTreeMap<u32, Message>,
    /// Job shells' exit reports held while their cgroup still holds processes (`unkillable.rs`).
    pub lingering: super::unkillable::Lingering,
    /// Ranks rank 0 announced lost (`overlay.lost` events) and not seen back since: an orphan asks them last.
    pub known_lost: BTreeSet<u32>,
    /// Children this broker judged lost whose loss rank 0 has not announced yet (no `overlay.lost` event naming
    /// them), with the notice's body: the notice asks for no answer and may have died with our parent, so it goes
    /// again after a re-parent or a rejoin (`reparent.rs`).
    pub lost_reports: BTreeMap<u32, serde_json::Value>,
    /// After this broker re-parented: its `overlay.reparent` notice, until rank 0's `overlay.reparent` event
    /// naming it comes down. The notice asks for no answer and may die with a router on its way up; rank 0 would
    /// then cut this live broker off when its orphan deadline passes, so it goes again as the lost reports do.
    pub reparent_report: Option<serde_json::Value>,
    /// A child of rank 0: rank 0's `tbon.parent_grace` (seconds), from its `grace` control message.
    pub rank0_grace: Option<f64>,
    /// Rank 0's state directory.
    pub statedir: StateDir,
    /// Requests taken by the job core (submissions, shell exit reports) and not answered until the driver has
    /// written what they changed ([`Input::Stored`]): each request with what it is answered.
    pub awaiting_durable: Vec<(Message, Held)>,
    /// Where [`Broker::poll_effect`] is in its cut ([`Effect::Store`], [`Effect::Sync`], then the rest).
    cut: Cut,
    /// The batch of the [`Effect::Store`] being written.
    cut_batch: Option<std::sync::Arc<crate::jobs::journal::Journal>>,
    /// The requests of [`Broker::awaiting_durable`] when the batch being written was taken
    /// ([`Broker::take_journal`]): those its [`Input::Stored`] is for. Later ones wait for the next batch.
    cut_held: Option<Vec<(Message, Held)>>,
    /// The job core's [`JobCore::change_mark`] when that batch was taken.
    cut_mark: Option<[u64; 4]>,
    /// The journal changed since the last batch taken by an input other than a submission
    /// ([`Broker::write_may_wait`]).
    unheld_changes: bool,
    /// An [`Effect::Sync`] went out and its [`Input::Synced`] has not come yet.
    sync_in_flight: bool,
    /// The driver's loop has ended ([`Broker::loop_ended`]): no batch is put off for a later cut.
    loop_ended: bool,
    /// Requests written but not yet known to be on disk: the number of the write that holds each (see
    /// [`Input::Synced`]), the request and what it is answered, in write order.
    pub awaiting_sync: VecDeque<(u64, Message, Held)>,
    /// When each write whose requests are in [`Broker::awaiting_sync`] was stored (its number, the time), in
    /// order: an exit report waits at most [`EXIT_REPORT_SYNC_DELAY`] from then.
    sync_owed_since: VecDeque<(u64, Time)>,
    /// Submissions among [`Broker::awaiting_sync`]: while there is one, an fsync is wanted at once.
    submissions_unsynced: usize,
    /// Successful writes of the journal so far ([`Input::Stored`] with `Ok`): the number of the latest.
    pub writes: u64,
    /// Successful fsyncs of the store so far ([`Input::Synced`] with `Ok`), for `vigil uptime`.
    pub syncs: u64,
    /// Events counted for the metrics snapshot ([`Broker::metrics`], `metrics.rs`).
    pub counters: super::metrics::Counters,
    /// The last failure of the store was an fsync's ([`Input::Synced`]): only a successful fsync, not a mere
    /// write, shows the store works again.
    sync_failed: bool,
    out: VecDeque<Effect>,
}

impl Broker {
    /// A broker that has not joined yet; hand it [`Input::ParentUp`] (if it has a parent) and [`Input::Start`].
    pub fn new(opts: super::BrokerOptions, env: Environment, now: Time) -> Broker {
        let jobcore = (opts.rank == 0).then(|| {
            let mut jc = JobCore::new(env.wall_origin + now.as_secs_f64());
            jc.kill_timeout = opts.config.kill_timeout;
            jc.kill_timeout_max = opts.config.kill_timeout_max;
            // Running jobs kept in the state directory wait this long for their shells (jobs/reattach.rs).
            jc.reattach_grace = opts.config.parent_grace();
            let c = &opts.config;
            jc.config = crate::jobs::SchedConfig {
                policy: c.sched_policy,
                default_duration: Some(c.default_duration).filter(|d| d.is_finite()),
                max_requeue: c.max_requeue,
                backfill_depth: c.backfill_depth,
                // A nested instance's lost brokers never return: it shrinks (jobs/shrink.rs).
                shrink: c.instance_level > 0,
                inactive_age_limit: Some(c.inactive_age_limit).filter(|d| d.is_finite()),
                inactive_num_limit: Some(c.inactive_num_limit).filter(|n| *n > 0),
                history_age_limit: Some(c.history_age_limit).filter(|d| d.is_finite()),
                history_num_limit: Some(c.history_num_limit).filter(|n| *n > 0),
            };
            jc
        });
        let opts_parent = opts.config.topo.parent(opts.size, opts.rank);
        Broker {
            membership: Membership::new(opts.config.membership),
            confirm: Default::default(),
            opts,
            env,
            now,
            status: DriverStatus::default(),
            parent_up: false,
            children: BTreeMap::new(),
            locals: HashMap::new(),
            event_seq: 0,
            internal: HashMap::new(),
            next_tag: 1,
            shells: BTreeSet::new(),
            spawning: HashMap::new(),
            jobcore,
            watchers: Vec::new(),
            members: BTreeMap::new(),
            shutting_down: None,
            initial_started: false,
            join_pending: false,
            exit_code: 0,
            pmi_barriers: HashMap::new(),
            next_heartbeat: now,
            next_beat: now,
            goodbye: HashSet::new(),
            rtt_runs: HashMap::new(),
            links: super::links::Links::default(),
            exit_waiters: HashMap::new(),
            inflight: HashMap::new(),
            parent: opts_parent,
            adopted: BTreeMap::new(),
            reparenting: None,
            orphans: BTreeMap::new(),
            exit_reports: BTreeMap::new(),
            lingering: Default::default(),
            known_lost: BTreeSet::new(),
            lost_reports: BTreeMap::new(),
            reparent_report: None,
            rank0_grace: None,
            statedir: StateDir::None,
            awaiting_durable: Vec::new(),
            awaiting_sync: VecDeque::new(),
            sync_owed_since: VecDeque::new(),
            submissions_unsynced: 0,
            cut: Cut::Due,
            cut_batch: None,
            cut_held: None,
            cut_mark: None,
            unheld_changes: false,
            sync_in_flight: false,
            loop_ended: false,
            writes: 0,
            syncs: 0,
            counters: super::metrics::Counters::default(),
            sync_failed: false,
            out: VecDeque::new(),
        }
    }

    /// Rank 0, once, before any input: the state directory as the driver opened it, and what it kept (`None`:
    /// nothing, a new store). With a store every change is journaled from now on and the job core is rebuilt
    /// from what was kept (`jobs/journal.rs`); with a damaged one scheduling stops.
    pub fn restore(&mut self, statedir: StateDir, kept: Option<crate::jobs::journal::Kept>) {
        let wall = self.wall();
        let Some(jc) = self.jobcore.as_mut() else { return };
        match &statedir {
            StateDir::None => {}
            StateDir::Open { dir, restarts, .. } => {
                jc.enable_journal();
                if let Some(kept) = kept {
                    let r = jc.restore(wall, kept);
                    // At the default log level: an operator reading the log of a restart sees what it kept. The
                    // jobs ended by it (no grace to re-attach them) only when there are some.
                    let ended = match r.ended.len() {
                        0 => String::new(),
                        n => format!(
                            "; {n} running job(s) ended with the fatal exception '{}'",
                            crate::jobs::journal::RESTART_EXCEPTION
                        ),
                    };
                    tracing::warn!(
                        "state directory {}: restart {restarts}: {} inactive job(s) listed, {} pending job(s) queued, \
                         {} running job(s) waiting to be re-attached{ended}",
                        dir.display(),
                        r.inactive,
                        r.pending,
                        r.reattached.len(),
                    );
                    for (id, why) in r.invalid {
                        tracing::warn!("job {id} kept in the state directory no longer validates: {why}");
                    }
                    // The verdicts on ranks that were down stand until they rejoin (without them a lost rank
                    // would read "never joined").
                    for (rank, (state, why, since)) in crate::jobs::journal::down_ranks(&jc.resource_eventlog) {
                        let state = if state == "lost" { MemberState::Lost } else { MemberState::Offline };
                        self.members.insert(rank, (state, why, since));
                    }
                    // The orphans of a rank lost before the restart that had not re-parented yet: waited for
                    // again, from now (`expire_orphans` cuts off those that never come back).
                    if self.opts.config.reparent {
                        let (topo, size) = (self.opts.config.topo, self.opts.size);
                        let due = self.now + super::reparent::REPARENT_TIMEOUT;
                        let orphans =
                            crate::jobs::journal::pending_orphans(&jc.resource_eventlog, |r| topo.parent(size, r));
                        if !orphans.is_empty() {
                            let ids: crate::idset::IdSet = orphans.keys().copied().collect();
                            info!("ranks {ids} had lost their parent and not re-parented yet; waiting for them again");
                        }
                        for (c, lost) in orphans {
                            self.orphans.insert(c, (due, lost));
                        }
                    }
                } else {
                    info!("state directory {}: a new store", dir.display());
                }
            }
            StateDir::Damaged { dir, why } => {
                jc.stop_scheduling(&format!("rank 0 could not read its state directory {}: {why}", dir.display()));
                tracing::error!(
                    "state directory {}: {why}; scheduling is stopped and submissions are refused; the file is kept \
                     as it is: repair or move it, then restart rank 0",
                    dir.display()
                );
            }
        }
        self.statedir = statedir;
    }

    /// What must be written before anything asked since the last batch goes out: the job core's journal batch,
    /// or `Some(None)` when only answers are held and nothing is left to write. `None` without a state directory
    /// or with nothing to do.
    fn journal(&self) -> Option<Option<crate::jobs::journal::Journal>> {
        if !matches!(self.statedir, StateDir::Open { .. }) {
            return None;
        }
        match self.jobcore.as_ref().and_then(JobCore::journal) {
            Some(b) => Some(Some(b)),
            None if !self.awaiting_durable.is_empty() => Some(None),
            None => None,
        }
    }

    /// [`Broker::journal`], taken for an [`Effect::Store`]: the requests held until now are those its
    /// [`Input::Stored`] answers; those taken later wait for the next batch.
    fn take_journal(&mut self) -> Option<Option<crate::jobs::journal::Journal>> {
        let batch = self.journal()?;
        self.unheld_changes = false;
        self.cut_held = Some(std::mem::take(&mut self.awaiting_durable));
        self.cut_mark = self.jobcore.as_ref().map(JobCore::change_mark);
        Some(batch)
    }

    /// The write an fsync must cover for held requests to be answered ([`Input::Synced`]): the latest write that
    /// holds any, `None` when none waits or none needs it yet. A submission wants one at once; shells' exit
    /// reports alone once the oldest has waited [`EXIT_REPORT_SYNC_DELAY`] (then [`Broker::next_deadline`]
    /// says when). [`Broker::poll_effect`] hands out one [`Effect::Sync`] at a time; what is written while it
    /// runs waits for the next one, which covers it all (group commit).
    fn sync_wanted(&self) -> Option<u64> {
        let last = self.awaiting_sync.back().map(|(seq, ..)| *seq)?;
        if self.submissions_unsynced > 0 || self.exit_sync_due().is_none_or(|due| due <= self.now) {
            Some(last)
        } else {
            None
        }
    }

    /// When the exit reports among the requests waiting for an fsync (if any) want one: the oldest write's time
    /// plus [`EXIT_REPORT_SYNC_DELAY`].
    fn exit_sync_due(&self) -> Option<Time> {
        self.sync_owed_since.front().map(|(_, at)| *at + EXIT_REPORT_SYNC_DELAY)
    }

    /// [`Input::Stored`]: hold the submissions of this write until it is on disk (answer them now if it is),
    /// or refuse them (and end their jobs) if the store failed.
    fn on_stored(&mut self, result: Result<(), super::store::CommitError>, durable: bool) {
        if let Cut::Awaiting { written, last } = self.cut {
            self.cut = Cut::Writing(if last { MAX_STORES_PER_CUT } else { written });
        }
        let batch = self.cut_batch.take();
        let held = self.cut_held.take().unwrap_or_else(|| std::mem::take(&mut self.awaiting_durable));
        self.cut_mark = None;
        if !matches!(self.statedir, StateDir::Open { .. }) {
            return;
        }
        match result {
            Ok(()) => {
                if let (Some(b), Some(jc)) = (&batch, self.jobcore.as_mut()) {
                    jc.journal_saved(b);
                }
                self.writes += 1;
                let seq = self.writes;
                if !held.is_empty() {
                    self.sync_owed_since.push_back((seq, self.now));
                }
                self.submissions_unsynced += held.iter().filter(|(_, h)| matches!(h, Held::Submission(_))).count();
                self.awaiting_sync.extend(held.into_iter().map(|(req, answer)| (seq, req, answer)));
                if durable {
                    // An fsync of the log covers every write before it.
                    self.on_synced(seq, Ok(()));
                } else if !self.sync_failed {
                    self.store_works();
                }
            }
            Err(e) => self.store_failed(held, &e),
        }
    }

    /// [`Input::Synced`]: answer the submissions of every write up to `upto`, or refuse them if the fsync failed.
    fn on_synced(&mut self, upto: u64, result: Result<(), super::store::CommitError>) {
        self.sync_in_flight = false;
        let n = self.awaiting_sync.iter().take_while(|(seq, ..)| *seq <= upto).count();
        let covered: Vec<(Message, Held)> = self.awaiting_sync.drain(..n).map(|(_, req, held)| (req, held)).collect();
        self.submissions_unsynced -= covered.iter().filter(|(_, h)| matches!(h, Held::Submission(_))).count();
        while self.sync_owed_since.front().is_some_and(|(seq, _)| *seq <= upto) {
            self.sync_owed_since.pop_front();
        }
        match result {
            Ok(()) => {
                self.syncs += 1;
                self.sync_failed = false;
                self.store_works();
                for (req, held) in covered {
                    match held {
                        // The held request (its head) moves into its answer.
                        Held::Submission(answer) => self.respond_with(req, crate::message::to_json(&answer)),
                        Held::ExitReport => self.respond_with(req, b"{}".to_vec()),
                    }
                }
            }
            Err(e) => {
                self.sync_failed = true;
                self.store_failed(covered, &e);
            }
        }
    }

    /// The store took a write (or an fsync): no longer failing, if it was.
    fn store_works(&mut self) {
        let StateDir::Open { dir, failing, .. } = &mut self.statedir else { return };
        if let Some(why) = failing.take() {
            tracing::warn!("state directory {}: commits succeed again (they failed: {why})", dir.display());
        }
    }

    /// The store failed a write or an fsync: failing from now on; the submissions `held` for it are refused
    /// and their jobs end (a fatal exception of type `store`); exit reports wait for the next write.
    fn store_failed(&mut self, held: Vec<(Message, Held)>, e: &super::store::CommitError) {
        let wall = self.wall();
        let StateDir::Open { dir, failing, .. } = &mut self.statedir else { return };
        let dir = dir.display().to_string();
        if failing.is_none() {
            tracing::error!("state directory {dir}: cannot commit: {e}; submissions are refused until it can");
        }
        *failing = Some(e.why.clone());
        for (req, held) in held {
            let answer = match held {
                Held::Submission(answer) => answer,
                Held::ExitReport => {
                    self.awaiting_durable.push((req, Held::ExitReport));
                    continue;
                }
            };
            let note = format!("not accepted: it could not be made durable in the state directory {dir}: {e}");
            self.respond_error(&req, e.errno, &format!("job {}", note));
            if answer.get("duplicate").is_some_and(|d| d == true) {
                continue; // a submission sent again: its job is the first one's, which that one's answer ends
            }
            let id = answer.get("id").and_then(Value::as_u64).map(JobId);
            if let (Some(id), Some(jc)) = (id, self.jobcore.as_mut()) {
                jc.raise(wall, id, "store", 0, &note);
            }
        }
    }

    pub fn rank(&self) -> u32 {
        self.opts.rank
    }

    /// Wall-clock time now, seconds since the epoch (the job core's clock and eventlog timestamps).
    pub fn wall(&self) -> f64 {
        self.env.wall_origin + self.now.as_secs_f64()
    }

    /// Seconds since the origin (the membership machine's clock).
    pub fn clock(&self) -> f64 {
        self.now.as_secs_f64()
    }

    /// Ask the driver for something.
    pub fn effect(&mut self, e: Effect) {
        self.out.push_back(e);
    }

    /// The next thing to do, in the order asked; `None` once nothing is left (or while an [`Effect::Store`]
    /// waits for its [`Input::Stored`]). Poll until `None` after handing in inputs: the first poll after that
    /// begins a cut, which hands out what must be durable first ([`Effect::Store`], then [`Effect::Sync`] if one
    /// is wanted and none is in flight) and then the effects asked for, in order.
    pub fn poll_effect(&mut self) -> Option<Effect> {
        loop {
            match self.cut {
                Cut::Due => {
                    let writes = if self.write_may_wait() { MAX_STORES_PER_CUT } else { 0 };
                    self.cut = Cut::Writing(writes);
                }
                Cut::Writing(written) => {
                    if written < MAX_STORES_PER_CUT {
                        if let Some(batch) = self.take_journal() {
                            let last = batch.is_none();
                            let batch = batch.map(std::sync::Arc::new);
                            self.cut_batch.clone_from(&batch);
                            self.cut = Cut::Awaiting { written: written + 1, last };
                            return Some(Effect::Store { batch });
                        }
                    }
                    self.cut = Cut::Draining;
                    if !self.sync_in_flight {
                        if let Some(upto) = self.sync_wanted() {
                            self.sync_in_flight = true;
                            return Some(Effect::Sync { upto });
                        }
                    }
                }
                Cut::Awaiting { .. } => return None,
                Cut::Draining => {
                    let e = self.out.pop_front();
                    if e.is_none() {
                        self.cut = Cut::Due;
                    }
                    return e;
                }
            }
        }
    }

    /// Whether what the journal holds may wait for a later cut without anyone outside rank 0 having learnt of
    /// it: an fsync is in flight (the answers of a write now would wait for the next one anyway), the driver's
    /// loop goes on, no effect waits to be carried out (a message, an answer not held, a spawn, a timer), and
    /// every change since the last batch taken came from submissions, whose answers wait for the fsync of their
    /// record (a client that gets none may look for its job or submit again). A change any other input made (a
    /// shell's start, an exit report, a drain, a timer's) is written at once: its sender may never say it again.
    /// It is written with the next cut that asks for something, at the latest the one after the fsync's
    /// [`Input::Synced`], before the next fsync goes out.
    fn write_may_wait(&self) -> bool {
        self.sync_in_flight && !self.loop_ended && self.out.is_empty() && !self.unheld_changes
    }

    /// The driver's loop has ended; its last turns follow ([`Broker::stop`] and the writes before and after it):
    /// from now on what the journal holds is written at the next cut, never put off for a later one.
    pub fn loop_ended(&mut self) {
        self.loop_ended = true;
    }

    /// The process exit code once [`Broker::finished`] (rank 0: the initial program's).
    pub fn exit_code(&self) -> i32 {
        self.exit_code
    }

    /// Handle one input at time `now` (not earlier than the last one's); then drain [`Broker::poll_effect`].
    pub fn handle(&mut self, now: Time, input: Input) {
        self.now = self.now.max(now);
        if matches!(self.cut, Cut::Draining) {
            // Handed an input in the middle of a drain: what it changes is written before anything goes out.
            self.cut = Cut::Due;
        }
        let submission = matches!(&input, Input::Message(_, _, m)
            if m.msgtype == crate::message::MsgType::Request && m.topic == "job-manager.submit");
        let mark = self.jobcore.as_ref().map(JobCore::change_mark);
        self.handle_input(input);
        if !submission && self.jobcore.as_ref().map(JobCore::change_mark) != mark {
            self.unheld_changes = true;
        }
    }

    /// [`Broker::handle`] of one input.
    fn handle_input(&mut self, input: Input) {
        match input {
            Input::Start => {
                self.join();
                self.watch_enclosing();
            }
            Input::EnclosingLost { ranks, why } => self.enclosing_lost(&ranks, &why),
            Input::ParentFailed(why) => self.on_parent_failed(&why),
            Input::FirstParentFailed(why) => {
                if !self.start_reparent_at_start(&why) {
                    error!("no parent: {why}; exiting");
                    self.exit_code = 1;
                    self.begin_shutdown("no parent");
                }
            }
            Input::ParentRefused { why, full } => self.on_parent_refused(&why, full),
            Input::ParentUp(choice) => {
                self.parent_up = true;
                // A link that replaces a lost one (re-parent, rank 0 back) is judged at once, not after LINK_SETTLE.
                let replaces = self.reparenting.is_some();
                self.on_parent_up();
                // Tell rank 0 which transport our parent link uses (for `vigil overlay status` and `uptime`).
                self.route_request(SELF, super::links::report(self.rank(), &choice));
                self.links.parent = Some(choice);
                let now = self.clock();
                self.membership.signal(now, PARENT, Signal::Connected);
                if replaces {
                    self.membership.settled(PARENT);
                }
            }
            Input::Message(peer, conn, msg) => {
                match peer {
                    Peer::Child(r) => {
                        if self.children.get(&r) != Some(&conn) {
                            return; // stale link
                        }
                        let t = self.membership.signal(self.clock(), r, Signal::Traffic);
                        self.apply_transitions(t);
                    }
                    Peer::Parent => {
                        let t = self.membership.signal(self.clock(), PARENT, Signal::Traffic);
                        self.apply_transitions(t);
                    }
                    Peer::Local(_) => {}
                }
                self.on_message(peer, msg);
            }
            Input::Closed(peer, conn, why) => self.on_closed(peer, conn, &why),
            Input::Bounced(peer, msg) => self.on_bounced(peer, msg),
            Input::Hello { conn, msg, addr, refusal } => self.on_hello(conn, msg, &addr, refusal),
            Input::LocalNew { id, uid } => {
                self.locals.insert(id, LocalClient { uid, subs: BTreeSet::new(), streaming: false });
            }
            Input::ShellStarted { id, result } => {
                let req = self.spawning.remove(&id);
                match result {
                    Ok(pid) => {
                        if let Some(req) = req {
                            self.respond(&req, &json!({"pid": pid}));
                        }
                    }
                    Err(e) => {
                        self.shells.remove(&id);
                        if let Some(req) = req {
                            self.respond_error(&req, crate::message::errno::ENOENT, &e);
                        }
                    }
                }
            }
            Input::ShellDone { id, report, status, lingering } => {
                self.shells.remove(&id);
                // When its tasks ended: the shell says (it may have waited long after them to deliver output to a
                // restarting rank 0); else now.
                let ended = Some(report.as_ref().and_then(|r| r.ended).unwrap_or_else(|| self.wall()));
                let exit =
                    ShellExit { id: id.0, rank: self.rank(), report, shell_status: status, ended, unkillable: vec![] };
                if lingering.is_empty() {
                    self.send_shell_exit(exit);
                } else {
                    // Its end is reported once they are gone, or exec.kill-timeout from now (unkillable.rs).
                    let timeout = self.opts.config.kill_timeout;
                    info!("job {id}: processes {lingering:?} still in its cgroup after SIGKILL; waiting up to {timeout} s");
                    self.lingering.hold(self.now, timeout, exit, lingering);
                }
            }
            Input::CgroupEmptied(id) => {
                if let Some(exit) = self.lingering.emptied(id) {
                    self.send_shell_exit(exit);
                }
            }
            Input::InitialExit(code) => {
                info!("initial program exited with code {code}");
                self.exit_code = code;
                self.begin_shutdown("initial program exited");
            }
            Input::Signal(sig) if sig == crate::signal::SIGUSR1 || sig == crate::signal::SIGUSR2 => {
                // A batch or alloc job's warning before its time limit (`--signal`, Slurm's `B:`): its shell hands
                // it to the brokers of the job's instance; rank 0 passes it to the initial program (the script),
                // the others have no one to pass it to. Never a reason to stop.
                if self.rank() == 0 && self.initial_started {
                    self.effect(Effect::SignalInitial(sig));
                } else {
                    debug!("signal {sig}: no initial program here to pass it to");
                }
            }
            Input::Signal(sig) => {
                if sig == crate::signal::SIGTERM && self.stops_for_restart() {
                    // `systemctl stop|restart` of rank 0 with a state directory: its jobs are kept and the other
                    // brokers wait for it (rejoin.rs); `vigil shutdown` stops the whole instance.
                    if self.exit_code == 0 {
                        self.exit_code = 128 + sig;
                    }
                    self.begin_shutdown_for(&format!("signal {sig}"), Stop::Restart);
                } else if sig == crate::signal::SIGTERM && self.rank() != 0 {
                    if self.exit_code == 0 {
                        self.exit_code = 128 + sig;
                    }
                    self.begin_shutdown_for(&format!("signal {sig}"), Stop::Alone);
                } else if sig == crate::signal::SIGTERM || (self.rank() == 0 && self.opts.initial_program.is_none()) {
                    if self.exit_code == 0 {
                        self.exit_code = 128 + sig;
                    }
                    if self.initial_started {
                        self.effect(Effect::SignalInitial(crate::signal::SIGTERM));
                    }
                    self.begin_shutdown(&format!("signal {sig}"));
                } else if sig == crate::signal::SIGINT && self.rank() == 0 && self.initial_started {
                    // Sent to the broker itself (a launcher forwarding Ctrl-C, `kill -INT`), not by a terminal to
                    // the initial program's own process group: hand it on, as Ctrl-C on the program would be.
                    self.effect(Effect::SignalInitial(crate::signal::SIGINT));
                } else {
                    debug!("ignoring signal {sig}; the initial program handles it");
                }
            }
            Input::AckSamples(samples) => {
                for (rank, unacked, age, rtt_bound) in samples {
                    self.membership.set_rtt_bound(rank, rtt_bound);
                    let t =
                        self.membership.signal(self.clock(), rank, Signal::KernelAck { unacked, last_ack_age: age });
                    self.apply_transitions(t);
                }
            }
            Input::Probe(rank, sig) => {
                if self.shutting_down.is_some() || self.goodbye.contains(&rank) {
                    return; // children leave on their own during shutdown
                }
                let t = self.membership.signal(self.clock(), rank, sig);
                self.apply_transitions(t);
            }
            Input::ProcessExit(pid, body) => {
                for req in self.exit_waiters.remove(&pid).unwrap_or_default() {
                    self.respond(&req, &body);
                }
            }
            Input::WatchFailed(pid, errnum, why) => {
                for req in self.exit_waiters.remove(&pid).unwrap_or_default() {
                    self.respond_error(&req, errnum, &format!("cannot watch process {pid}: {why}"));
                }
            }
            Input::DetectorsFailed(why) => {
                tracing::error!("broker.detectors=ebpf, but {why}; exiting");
                self.exit_code = 1;
                self.begin_shutdown("required eBPF detectors unavailable");
            }
            Input::Status(s) => self.status = s,
            Input::Timer => self.on_timer(),
            Input::NodeChecked { token, answered } => self.on_node_checked(token, answered),
            Input::Stored { result, durable } => self.on_stored(result, durable),
            Input::Synced { upto, result } => self.on_synced(upto, result),
        }
        self.drain_actions();
    }

    /// Register this node with rank 0 (locally on rank 0), and on a single-broker instance act on it at once.
    pub fn join(&mut self) {
        if self.reparenting.as_ref().is_some_and(|rp| rp.grace.is_none()) {
            // Not adopted yet (its parent was lost at start): registered once it is, under its adopter, so that
            // rank 0 routes to it through the adopter rather than the lost static parent.
            self.join_pending = true;
            return;
        }
        let (cores, gpus): (IdSet, IdSet) = match &self.opts.resources_override {
            Some((c, g)) => (c.clone(), g.clone()),
            None => ((0..self.env.resources.cores).collect(), (0..self.env.resources.gpus).collect()),
        };
        let reg = json!({"rank": self.rank(), "hostname": self.opts.hostname, "resources": self.env.resources,
            "cores": cores.to_string(), "gpus": gpus.to_string(),
            "topology": self.env.topology, "declared_gpus": self.opts.config.gpus,
            // The jobs still here: a restarted rank 0 re-attaches them (rejoin.rs, jobs/reattach.rs).
            "jobs": self.attached_jobs(),
            // Where it is: after a re-parent, a restarted rank 0 learns the route to it from this.
            "parent": self.parent});
        let mut m = Message::request("resource.register", 0, &reg);
        m.flags = crate::message::FLAG_NORESPONSE;
        self.route_request(SELF, m);
    }

    /// Send job shell exit report `exit` to rank 0. Answered by rank 0, and kept until then: a report lost in
    /// flight with a router that died is sent again once this broker has re-parented (rank 0 takes a report once).
    pub(super) fn send_shell_exit(&mut self, exit: ShellExit) {
        let m = Message::request(crate::shellproto::TOPIC_SHELL_EXIT, 0, &exit);
        let tag = self.next_tag;
        self.exit_reports.insert(tag, m.clone());
        self.internal_request_msg(m, Internal::ShellExit);
    }

    /// The exit reports whose cgroup did not empty within `exec.kill-timeout` go now, naming what is left
    /// (`unkillable.rs`).
    pub(super) fn expire_lingering(&mut self) {
        for exit in self.lingering.expire(self.now) {
            warn!(
                "job {}: processes {:?} still in its cgroup exec.kill-timeout after SIGKILL: unkillable; rank 0 \
                 drains this node",
                JobId(exit.id),
                exit.unkillable
            );
            self.send_shell_exit(exit);
        }
    }

    /// When the broker should next get [`Input::Timer`], if ever.
    pub fn next_deadline(&self) -> Option<Time> {
        let mut t: Option<Time> = None;
        let mut earliest = |d: Time| t = Some(t.map_or(d, |x: Time| x.min(d)));
        if let Some(d) = self.jobcore.as_ref().and_then(JobCore::next_deadline) {
            // Clamp: a time limit of centuries must not overflow the clock.
            earliest(Time::from_secs_f64((d - self.env.wall_origin).clamp(0.0, 86400.0 * 365.0 * 100.0)));
        }
        if let Some(s) = self.shutting_down {
            earliest(s + SHUTDOWN_GRACE);
        }
        if self.shutting_down.is_none() && (self.parent_up || !self.children.is_empty()) {
            earliest(self.next_heartbeat);
            earliest(self.next_beat);
        }
        if let Some(d) = self.membership.next_deadline() {
            earliest(Time::from_secs_f64(d));
        }
        if let Some(d) = self.confirm.next_deadline() {
            earliest(d);
        }
        if let Some(d) = self.lingering.next_deadline() {
            earliest(d);
        }
        if let Some(d) = self.orphan_deadline() {
            earliest(d);
        }
        if let Some(d) = self.rank0_deadline() {
            earliest(d);
        }
        // Exit reports' fsync, when it is still to come (once due, its Effect::Sync goes out at the next cut, or
        // at the first one after the fsync in flight).
        if let Some(d) = self.exit_sync_due().filter(|d| *d > self.now) {
            earliest(d);
        }
        t
    }

    /// True once the broker is done: shutting down and its children gone (or the grace period over).
    pub fn finished(&self) -> bool {
        match self.shutting_down {
            Some(s) => self.children.is_empty() || self.now.since(s) >= SHUTDOWN_GRACE,
            None => false,
        }
    }

    /// The driver's last call, once [`Broker::finished`] and before its last write to the store: on rank 0 of an
    /// instance that was shut down, the jobs it ended whose shells did not report in time are finished
    /// ([`crate::jobs::JobCore::instance_stopped`]).
    pub fn stop(&mut self) {
        let wall = self.wall();
        if let Some(jc) = self.jobcore.as_mut() {
            jc.instance_stopped(wall);
        }
    }

    /// Whether SIGTERM stops only this broker, for a restart, rather than the instance: rank 0 of a system
    /// instance (no initial program) that keeps its jobs in a state directory (or has one it found damaged), while
    /// the others wait for it (`tbon.parent_grace` above 0).
    pub fn stops_for_restart(&self) -> bool {
        self.rank() == 0
            && self.opts.initial_program.is_none()
            // A damaged store too: its jobs are in the file an operator is repairing, and their shells run on.
            && (self.jobcore.as_ref().is_some_and(|j| j.journaling())
                || matches!(self.statedir, StateDir::Damaged { .. }))
            && self.parent_grace() > 0.0
    }

    /// How long this broker outlives rank 0 (seconds): `tbon.parent_grace` where it was set here, else rank 0's
    /// (which keeps the jobs and waits that long for their shells: a state directory given to rank 0 alone makes
    /// the others wait too), else the default ([`crate::attrs::BrokerConfig::parent_grace`]).
    pub fn parent_grace(&self) -> f64 {
        let c = &self.opts.config;
        c.parent_grace_set.or(self.rank0_grace).unwrap_or_else(|| c.parent_grace())
    }

    /// Stop this broker and, with it, the brokers below (see [`Broker::begin_shutdown_for`]).
    pub fn begin_shutdown(&mut self, why: &str) {
        self.begin_shutdown_for(why, Stop::Instance)
    }

    /// Stop this broker: say goodbye to the parent, tell the children (`shutdown`: `orphan` when this broker lost
    /// its own parent and they may re-parent; `restart` when rank 0 stops to restart and they wait for it), kill
    /// the job shells here, and exit once the children are gone or after [`SHUTDOWN_GRACE`].
    pub fn begin_shutdown_for(&mut self, why: &str, how: Stop) {
        if self.shutting_down.is_some() {
            return;
        }
        info!(rank = self.rank(), "shutting down: {why}");
        match how {
            Stop::Restart => warn!(
                "rank 0 stops for a restart: the other brokers wait for it (tbon.parent_grace); `vigil shutdown` \
                 stops the instance"
            ),
            Stop::Alone if !self.children.is_empty() && self.opts.config.reparent => {
                warn!("stopping this broker alone: its children re-parent (`vigil shutdown` stops the instance)")
            }
            _ => {}
        }
        self.shutting_down = Some(self.now);
        if how == Stop::Instance {
            // Rank 0: the running jobs end because the instance does, and say so (not "lost critical rank").
            let wall = self.wall();
            if let Some(jc) = self.jobcore.as_mut() {
                jc.instance_shutdown(wall, why);
            }
        }
        if self.parent_up {
            self.effect(Effect::Send(Peer::Parent, Message::control("goodbye", &json!({"reason": why}))));
        }
        // A broker that ends because it lost its own parent lets its children re-parent rather than end too.
        let orphans = (why == "lost parent" || how == Stop::Alone) && self.opts.config.reparent;
        let restart = how == Stop::Restart;
        let shutdown = Message::control("shutdown", &json!({"reason": why, "orphan": orphans, "restart": restart}));
        for &r in self.children.keys() {
            self.out.push_back(Effect::Send(Peer::Child(r), shutdown.clone()));
        }
        if !self.shells.is_empty() {
            self.effect(Effect::KillShells);
        }
    }

    /// Carry out what the job core asked for, and wake watchers.
    pub fn drain_actions(&mut self) {
        use crate::jobs::Action;
        while let Some(a) = self.jobcore.as_mut().and_then(|j| j.poll_action()) {
            match a {
                Action::SpawnShell { id, rank, input } => {
                    let payload = json!({"id": id.0, "input": *input});
                    self.internal_request("rexec.spawn", rank, &payload, Internal::Spawn { id, rank });
                }
                Action::SignalShells { id, ranks, signal } => {
                    // Answered, so that one whose route is down is known and sent again (jobs/kills.rs).
                    for r in ranks {
                        let path = self.path_to(r);
                        let payload = json!({"id": id.0, "signal": signal});
                        self.internal_request("rexec.kill", r, &payload, Internal::Kill { id, rank: r, signal, path });
                    }
                }
                Action::Updated(id) => super::services::job_info::wake_watchers(self, id),
                Action::Requeued(id) => {
                    // The lost run's PMI exchange, if it was in one, is not the rerun's.
                    self.pmi_barriers.remove(&id);
                }
                Action::NotifyShell { id, rank, leader, lost_shells, tasks, hosts, note } => {
                    // The job goes on without the lost shells: a PMI exchange that waited for them ends without
                    // them (a batch job whose node was lost while its instance's brokers started).
                    self.pmi_barrier_complete(id);
                    let mut m = Message::request(
                        "rexec.notify",
                        rank,
                        &json!({"id": id.0, "leader": leader, "lost_shells": lost_shells, "tasks": tasks,
                                "hosts": hosts, "note": note}),
                    );
                    m.flags = crate::message::FLAG_NORESPONSE;
                    self.route_request(SELF, m);
                }
            }
        }
        self.maybe_start_initial();
    }

    /// Rank 0: end job `id`'s PMI barrier if every one of its live shells is in it: answer each waiting shell with
    /// the union of the puts of the shells still there, sent down the tree once per link (`pmi_down.rs`). A shell
    /// that is gone (its node lost, or it exited) is not waited for, and what it put is left out, even if it
    /// arrived before it went: its tasks are gone too (a lost nested broker's endpoint, which its would-be children
    /// then know not to wait for). Nothing while a live shell has yet to arrive, when no barrier is in progress, or
    /// once the job has a fatal exception.
    pub fn pmi_barrier_complete(&mut self, id: JobId) {
        let Some(job) = self.jobcore.as_ref().and_then(|jc| jc.jobs.get(&id)) else { return };
        let Some(b) = self.pmi_barriers.get(&id) else { return };
        // A job with a fatal exception (a task that left before PMI_Finalize, say) releases no one: its shells are
        // being killed, and a task let out of the barrier would go on as if the exchange had worked.
        if job.fatal.is_some() {
            return;
        }
        let live: BTreeSet<u32> = job.shells.values().filter(|s| !s.exited).map(|s| s.shell_rank).collect();
        if live.is_empty() || !live.iter().all(|s| b.waiting.contains_key(s)) {
            return;
        }
        let b = self.pmi_barriers.remove(&id).unwrap_or_default();
        let mut kvs = serde_json::Map::new();
        for (shell, (_, puts)) in &b.waiting {
            if live.contains(shell) {
                kvs.extend(puts.clone());
            }
        }
        // The same answer for every shell: down the tree once per link (pmi_down.rs), not once per shell.
        let answer = serde_json::to_vec(&json!({"kvs": kvs})).unwrap_or_default();
        let to = b
            .waiting
            .into_iter()
            .filter(|(shell, (r, _))| live.contains(shell) && r.flags & crate::message::FLAG_NORESPONSE == 0)
            .map(|(_, (r, _))| super::pmi_down::Recipient(r.matchtag, r.userid, r.route))
            .collect();
        self.pmi_answer_down(to, &answer);
    }

    /// Rank 0 of a nested instance: follow its job in the enclosing instance ([`Effect::WatchEnclosing`]).
    fn watch_enclosing(&mut self) {
        if self.rank() != 0 || self.opts.size < 2 {
            return;
        }
        if let (Some(uri), Some(id)) = (self.opts.config.parent_uri.clone(), self.opts.config.jobid.clone()) {
            self.effect(Effect::WatchEnclosing { uri, id });
        }
    }

    /// Rank 0 of a nested instance: the enclosing instance lost the nodes of `ranks`, or their brokers failed on
    /// live nodes ([`Input::EnclosingLost`]; `why` says which). They are lost here too, as on a judge's verdict (`overlay.lost`), unless this instance judged them lost or
    /// offline already: a broker whose node died during start-up never joins, and only the enclosing instance
    /// can tell. The instance then comes up without it ([`Broker::maybe_start_initial`]).
    fn enclosing_lost(&mut self, ranks: &IdSet, why: &str) {
        if self.rank() != 0 {
            return;
        }
        let size = self.opts.size;
        let fresh: IdSet = ranks
            .iter()
            .filter(|r| *r != 0 && *r < size)
            .filter(|r| !self.members.get(r).is_some_and(|m| m.0 == MemberState::Lost || m.0 == MemberState::Offline))
            .collect();
        if fresh.is_empty() {
            return;
        }
        let reason = why.to_string();
        let mut m = Message::request("overlay.lost", 0, &json!({"ranks": fresh.to_string(), "reason": reason}));
        m.flags = crate::message::FLAG_NORESPONSE;
        self.route_request(SELF, m);
        self.maybe_start_initial();
    }

    /// Rank 0, once every broker has registered, or been declared lost before it could (a nested
    /// broker whose node died, or whose broker failed, during start-up, [`Broker::enclosing_lost`]): the instance
    /// is up; run the initial program. A nested instance some of whose brokers never joined starts without them if
    /// they are no more than `broker.tolerate-lost` (`vigil batch --tolerate-lost=K`), its initial program told the
    /// nodes it has; with more it does not start, and tells the enclosing instance, which fails the job at once
    /// naming them (`job-exec.nested`'s `never_joined`).
    fn maybe_start_initial(&mut self) {
        if self.initial_started || self.rank() != 0 || self.shutting_down.is_some() {
            return;
        }
        let Some(jc) = &self.jobcore else { return };
        let never: IdSet = self
            .members
            .iter()
            .filter(|(r, m)| m.0 == MemberState::Lost && !jc.pool.ranks.contains_key(r))
            .map(|(r, _)| *r)
            .collect();
        if ((jc.ranks_joined() + never.len()) as u32) < self.opts.size {
            return;
        }
        let hosts: crate::hostlist::Hostlist =
            jc.pool.ranks.values().filter(|p| p.up && !p.removed).map(|p| p.hostname.clone()).collect();
        let nhosts = jc.pool.ranks.values().filter(|p| p.up && !p.removed).count();
        self.initial_started = true;
        let tolerated = self.opts.config.tolerate_lost;
        if let (Some(uri), Some(jobid)) = (self.opts.config.parent_uri.clone(), self.opts.config.jobid.clone()) {
            if never.len() as u32 > tolerated {
                error!("the instance cannot start: rank(s) {never} never joined, and broker.tolerate-lost={tolerated}");
                let report = json!({"id": jobid, "uri": self.env.local_uri, "size": self.opts.size,
                    "never_joined": never.to_string(), "tolerate_lost": tolerated});
                self.effect(Effect::ReportNested { uri, report });
                return;
            }
        }
        info!("instance of {} brokers is up after {:.3}s", self.opts.size, self.clock());
        // Tells `vigil start` the instance is up: from now on a broker's death is the instance's business
        // (a lost rank), not a failed start.
        self.effect(Effect::WriteFile(self.opts.rundir.join("up"), format!("{}\n", self.opts.size)));
        if let (Some(uri), Some(jobid)) = (self.opts.config.parent_uri.clone(), self.opts.config.jobid.clone()) {
            // A nested instance tells its parent's exec system where it lives and which ranks are critical.
            let report = json!({"id": jobid, "uri": self.env.local_uri, "size": self.opts.size,
                "critical_ranks": super::reparent::critical_ranks(self.opts.config.topo, self.opts.size,
                    self.opts.config.reparent).to_string()});
            self.effect(Effect::ReportNested { uri, report });
        }
        if let Some(argv) = self.opts.initial_program.clone() {
            // Started without some of its brokers: the initial program's node count and list are those it has.
            let env = if never.is_empty() {
                Vec::new()
            } else {
                warn!("the instance starts without rank(s) {never}, which never joined (broker.tolerate-lost={tolerated})");
                vec![
                    ("VIGIL_JOB_NNODES".to_string(), nhosts.to_string()),
                    ("VIGIL_JOB_NODELIST".into(), hosts.to_string()),
                ]
            };
            self.effect(Effect::StartInitial { argv, env });
        }
    }

    /// The TBON shape and size (routing and liveness need both).
    pub fn tree(&self) -> (Topology, u32) {
        (self.opts.config.topo, self.opts.size)
    }
}
