//! Job manager, scheduler and exec system of an instance, as one sans-IO state machine ([`JobCore`]).
//!
//! Rank 0's broker feeds it requests and reports (submit, cancel, shell spawned, output, shell exit, rank lost)
//! with the current time in seconds since the epoch, calls [`JobCore::handle_timeout`] at
//! [`JobCore::next_deadline`], and carries out the [`Action`]s it queues (start a shell on a rank, signal
//! shells, wake watchers). No sockets, clocks or tasks live here, so every rule (RFC 21 states, time limits,
//! exit-timeout, kill escalation, lost ranks) is tested deterministically. Where each rule lives:
//!
//! | file | rule |
//! |---|---|
//! | `state.rs` | RFC 21 states and the events that drive them |
//! | `sched.rs` | the resource pool: first-fit allocation, feasibility, why a job waits |
//! | `backfill.rs` | which pending job starts when: EASY backfill or FCFS (`sched.policy`) |
//! | `requeue.rs` | a `--requeue` job that lost a node goes back to the queue (`sched.max-requeue`) |
//! | `shrink.rs` | a nested instance's lost rank leaves it for good (RFC 28) |
//! | `nested.rs` | critical-rank rules for the brokers of a nested instance |
//! | `timers.rs` | time limits, exit-timeout, SIGKILL escalation, from an ordered index of deadlines |
//! | `kills.rs` | a kill that could not reach its rank goes once the rank is reachable again |
//! | `submit_key.rs` | a submission sent again with its key makes no second job |
//! | this file | submission, allocation to shells, shell reports, lost ranks, exceptions, output and input |
//!
//! The cost of one event does not grow with the number of jobs queued or ever run: pending jobs are an ordered
//! set, running jobs are indexed by rank and by deadline, and counters replace scans over a job's shells.

mod backfill;
pub mod jobid;
pub mod journal;
mod kills;
mod nested;
pub mod purge;
mod reattach;
mod requeue;
pub mod sched;
mod shrink;
pub mod state;
pub mod submit_key;
mod timers;

use crate::eventlog::Event;
use crate::idset::IdSet;
use crate::jobspec::{JobRequest, Jobspec};
use crate::r::{RankResources, Rv1};
use crate::shellproto::{exit_code, OutputLine, ShellExit, ShellInput};
pub use jobid::JobId;
use sched::{Pool, RankAlloc};
use serde_json::{json, Value};
pub use state::JobState;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

pub use crate::attrs::SchedPolicy;
pub use backfill::{Reservation, BACKFILL_DEPTH};
pub use requeue::DEFAULT_MAX_REQUEUE;
pub use submit_key::{SubmitKey, Submitted, SUBMIT_KEY_MAX};

/// Default `exit-timeout`: after the first task exits, the others have this long (seconds).
pub const DEFAULT_EXIT_TIMEOUT: f64 = 30.0;
/// Output kept per job on rank 0 for `attach` and `run` (bytes); older chunks are dropped beyond it, and a
/// watcher that fell that far behind is told how much it missed. (Use `--output FILE` for large output.)
pub const OUTPUT_KEEP: usize = 16 << 20;
/// Output kept for each job once it is INACTIVE (its tail, bytes), for `vigil job attach` after the fact.
pub const INACTIVE_OUTPUT_KEEP: usize = 1 << 20;
/// Output kept for all INACTIVE jobs together (bytes); beyond it the oldest jobs' output is dropped.
pub const INACTIVE_OUTPUT_TOTAL: usize = 64 << 20;
/// Default time between SIGTERM and SIGKILL when a job is cancelled or fails (seconds).
pub const DEFAULT_KILL_TIMEOUT: f64 = 5.0;

/// Default of `exec.kill-timeout-max` (seconds): the longest kill timeout a job may ask for with `-o
/// kill-timeout` (Slurm's KillWait, one setting for all, defaults to 30 s).
pub const DEFAULT_KILL_TIMEOUT_MAX: f64 = 60.0;

/// The exception type of the jobs still running when their instance is shut down
/// ([`JobCore::instance_shutdown`]; severity 0).
pub const SHUTDOWN_EXCEPTION: &str = "shutdown";
/// Standard input held per job on rank 0 (bytes of input, decoded; held as base64 text, 4/3 as many bytes).
///
/// Every chunk is held until the job is INACTIVE, not only until it has been forwarded: each job shell's
/// `job-info.stdin` stream starts from the first chunk, so a shell that starts (or asks) later still gets all of
/// the input. So the bound is on everything accepted, and input past it is refused ([`StdinError::Full`]).
pub const STDIN_KEEP: usize = 4 << 20;

/// Something the broker must do for the job core.
#[derive(Clone, Debug)]
pub enum Action {
    /// Start one job shell on `rank` with this input.
    SpawnShell {
        /// Job.
        id: JobId,
        /// Broker rank.
        rank: u32,
        /// Shell input (boxed: it is large).
        input: Box<ShellInput>,
    },
    /// Send `signal` to the shells (and their tasks) of job `id` on `ranks`.
    SignalShells {
        /// Job.
        id: JobId,
        /// Broker ranks.
        ranks: Vec<u32>,
        /// Signal number.
        signal: i32,
    },
    /// The job's eventlog or output grew: wake its watchers.
    Updated(JobId),
    /// Job `id` went back to the queue (`requeue.rs`): forget what belonged to its lost run (PMI barriers).
    Requeued(JobId),
    /// Tell the job's leader shell (on broker `rank`) that shells were lost to a node failure.
    NotifyShell {
        /// Job.
        id: JobId,
        /// Broker rank of the leader shell.
        rank: u32,
        /// Shell ranks lost.
        lost_shells: Vec<u32>,
        /// The shell's message, in the terms of the job's own instance (its host names and ranks there, which
        /// are the shell ranks): `this instance lost node node3 (rank 2); it continues on the remaining nodes`.
        note: String,
    },
}

/// What the job core hands out: the [`Action`]s for the broker, in order, and (when the state directory keeps
/// its jobs, `journal.rs`) the jobs whose kept record changed. Every change to a job's eventlog or output is
/// followed by [`Action::Updated`] (its watchers must hear of it), so that action is also what marks the job for
/// the journal: no rule has to remember a second call.
#[derive(Debug, Default)]
struct Outbox {
    queue: VecDeque<Action>,
    /// Jobs changed since the journal last saved them, each with the [`Outbox::tick`] of its latest change;
    /// `None` while nothing is kept.
    dirty: Option<BTreeMap<JobId, u64>>,
    /// Counts the changes marked: a batch saved while a job changed again after it was taken leaves that job
    /// marked ([`JobCore::journal_saved`]).
    tick: u64,
}

impl Outbox {
    fn push_back(&mut self, a: Action) {
        if let Action::Updated(id) = &a {
            self.mark(*id);
        }
        self.queue.push_back(a);
    }

    /// Job `id`'s kept record changed (when a journal is kept).
    fn mark(&mut self, id: JobId) {
        if let Some(d) = self.dirty.as_mut() {
            self.tick += 1;
            d.insert(id, self.tick);
        }
    }

    fn pop_front(&mut self) -> Option<Action> {
        self.queue.pop_front()
    }
}

/// An RFC 21 exception.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Exception {
    /// Type, e.g. `cancel`, `timelimit`, `exec`, `node-failure`.
    #[serde(rename = "type")]
    pub kind: String,
    /// 0 = fatal, 1..7 informational.
    pub severity: u32,
    /// Human-readable note.
    pub note: String,
}

/// Why a submission was refused.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    /// The jobspec is malformed (the message names the field).
    #[error("{0}")]
    Jobspec(String),
    /// The request can never fit in this instance.
    #[error("unsatisfiable request: {0}")]
    Unsatisfiable(#[from] sched::Unsatisfiable),
    /// Too few nodes satisfy the job's constraints, some of which name nodes this instance does not have.
    #[error("unsatisfiable request: {err} ({unknown})")]
    UnknownNodes {
        /// What does not fit.
        err: sched::Unsatisfiable,
        /// `node9 is not a node of this instance`.
        unknown: String,
    },
    /// The request would have fit before this nested instance lost ranks for good (RFC 28 shrink, `shrink.rs`).
    #[error("unsatisfiable request: {err} (this instance lost {lost} for good: it shrank)")]
    Shrunk {
        /// What no longer fits.
        err: sched::Unsatisfiable,
        /// The ranks lost, `host (rank r)`, in the order they were lost.
        lost: String,
    },
    /// The request's submission key is malformed (`submit_key.rs`; the message names the field).
    #[error("{0}")]
    SubmitKey(String),
    /// The submission key names a job submitted with another jobspec: one key, one submission.
    #[error("submit_key: already names job {id}, submitted with another jobspec (use a new key for a new job)")]
    SubmitKeyReused {
        /// The job the key names.
        id: JobId,
    },
}

/// How an instance schedules (broker attributes `sched.*`, and whether it is nested).
#[derive(Clone, Debug, PartialEq)]
pub struct SchedConfig {
    /// `sched.policy`: EASY backfill or strict FCFS (`backfill.rs`).
    pub policy: SchedPolicy,
    /// `sched.default-duration`: time limit (seconds) of a job submitted without one; `None` = unlimited.
    pub default_duration: Option<f64>,
    /// `sched.max-requeue`: how many times one job may be requeued after losing a node (`requeue.rs`).
    pub max_requeue: u32,
    /// `sched.backfill-depth`: most pending jobs one scheduling pass looks at (`backfill.rs`, default
    /// [`BACKFILL_DEPTH`]), so that the cost of a pass does not grow with the queue.
    pub backfill_depth: usize,
    /// Lost ranks leave the instance for good (RFC 28 shrink, `shrink.rs`): true in a nested instance
    /// (`instance-level` > 0), whose lost brokers never return.
    pub shrink: bool,
    /// `job-manager.inactive-age-limit`: seconds after which an INACTIVE job is purged (`purge.rs`); `None`: never.
    pub inactive_age_limit: Option<f64>,
    /// `job-manager.inactive-num-limit`: most INACTIVE jobs kept, the oldest purged first; `None`: no limit.
    pub inactive_num_limit: Option<usize>,
}

impl Default for SchedConfig {
    /// EASY, no default time limit, [`DEFAULT_MAX_REQUEUE`], no shrink (a system instance).
    fn default() -> SchedConfig {
        SchedConfig {
            policy: SchedPolicy::Easy,
            default_duration: None,
            max_requeue: DEFAULT_MAX_REQUEUE,
            backfill_depth: BACKFILL_DEPTH,
            shrink: false,
            inactive_age_limit: None,
            inactive_num_limit: None,
        }
    }
}

/// Why standard input for a job was refused ([`JobCore::stdin`]). Nothing already accepted is lost by a refusal.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StdinError {
    /// No such job.
    #[error("unknown job id {0}")]
    UnknownJob(JobId),
    /// The job's input has ended (end of input was sent, the job was submitted without `stdin`, or it is over).
    #[error("standard input of job {0} is closed")]
    Closed(JobId),
    /// The chunk is not base64 text.
    #[error("'data' must be base64: {0}")]
    NotBase64(String),
    /// Accepting the chunk would hold more than [`STDIN_KEEP`] bytes for the job; `held` and `chunk` in bytes.
    #[error(
        "standard input of job {id} is full: {held} bytes held, a chunk of {chunk} more would pass the {} MiB \
         kept per job until it ends",
        STDIN_KEEP >> 20
    )]
    Full {
        /// The job.
        id: JobId,
        /// Bytes of input already held.
        held: usize,
        /// Bytes in the refused chunk.
        chunk: usize,
    },
}

impl StdinError {
    /// The errno a request is answered with: `ENOENT` (unknown job), `EINVAL` (input closed), `EPROTO` (not
    /// base64), `ENOSPC` when full: not `EAGAIN`, since held input is freed only when the job ends, so a retry
    /// while the job runs cannot succeed.
    pub fn errno(&self) -> u32 {
        use crate::message::errno;
        match self {
            StdinError::UnknownJob(_) => errno::ENOENT,
            StdinError::Closed(_) => errno::EINVAL,
            StdinError::NotBase64(_) => errno::EPROTO,
            StdinError::Full { .. } => errno::ENOSPC,
        }
    }
}

/// State of one job shell.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ShellState {
    /// Index among the job's shells.
    pub shell_rank: u32,
    /// Broker rank.
    pub rank: u32,
    /// Tasks on this shell.
    pub ntasks: u32,
    /// Their global ranks (empty when not known: a shell rank 0 found running after it restarted).
    pub tasks: IdSet,
    /// The broker confirmed the shell started.
    pub spawned: bool,
    /// The shell is gone (exited, failed to start or its rank was lost).
    pub exited: bool,
    /// Largest task wait status reported by this shell.
    pub status: Option<i32>,
    /// Exit code requested by a task's PMI abort on this shell.
    pub abort_code: Option<i32>,
    /// When its tasks ended, as its node saw it (wall-clock seconds since the Unix epoch, [`ShellExit::ended`]).
    #[serde(skip)]
    pub ended: Option<f64>,
    /// This shell's output batches, put back in the order it numbered them.
    #[serde(skip)]
    pub batches: BatchOrder,
}

/// Where a `job-exec.output` batch stands in its shell's numbering.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Batch {
    /// Not numbered (a shell that does not number its batches): taken as it comes.
    Unnumbered,
    /// Batch `seq` (0, 1, ...) of the shell on broker rank `rank`.
    Numbered {
        /// The shell's broker rank.
        rank: u32,
        /// The batch's number.
        seq: u64,
    },
    /// The shell on broker rank `rank` has nothing more in flight: what is held for it is released.
    Flush {
        /// The shell's broker rank.
        rank: u32,
    },
}

/// The `job-exec.output` batches of one shell, put back in the order the shell numbered them. A batch that a
/// router was lost with is sent again by the shell after later ones went up (they were queued by its re-parenting
/// broker first), and one whose acknowledgement alone was lost arrives twice: rank 0 takes each batch once, in
/// order, holding later ones while an earlier one is missing, up to [`BatchOrder::MAX_HELD`] batches or
/// [`BatchOrder::MAX_HELD_BYTES`], and releases what it holds when the shell flushes.
#[derive(Clone, Debug, Default)]
pub struct BatchOrder {
    /// The next batch due.
    next: u64,
    /// Batches that came before their turn, and their bytes.
    held: BTreeMap<u64, Vec<OutputLine>>,
    held_bytes: usize,
    /// The numbering is not known yet: the first batch taken is due, whatever its number (a shell re-attached
    /// after rank 0 restarted, `reattach.rs`).
    resume: bool,
}

impl BatchOrder {
    /// Most batches held while an earlier one is missing (a shell has at most 8 unacknowledged: this is the
    /// missing one's resends and then some); past this the missing batch is given up.
    pub const MAX_HELD: usize = 64;
    /// Most bytes held while an earlier batch is missing; past this the missing batch is given up.
    pub const MAX_HELD_BYTES: usize = 4 << 20;

    /// The order of a shell whose earlier batches went to a rank 0 that has since restarted: the first batch that
    /// comes is due, whatever its number, and the order goes on from it.
    pub fn resume() -> BatchOrder {
        BatchOrder { resume: true, ..Default::default() }
    }

    /// The order of a shell whose batches up to `next` (excluded) were taken before rank 0 restarted, as its state
    /// directory kept them (`journal.rs`): batch `next` is due, and one below it that comes again is taken no more.
    pub fn at(next: u64) -> BatchOrder {
        BatchOrder { next, ..Default::default() }
    }

    /// The next batch due, once known (not while the order waits for its first batch after [`BatchOrder::resume`]).
    pub fn due(&self) -> Option<u64> {
        (!self.resume).then_some(self.next)
    }

    /// Take batch `seq`: the lines now due, in order (none if it was taken before or must wait its turn).
    pub fn take(&mut self, seq: u64, lines: Vec<OutputLine>) -> Vec<OutputLine> {
        if std::mem::take(&mut self.resume) {
            self.next = seq;
        }
        if seq < self.next || self.held.contains_key(&seq) {
            return Vec::new();
        }
        self.held_bytes += lines.iter().map(OutputLine::size).sum::<usize>();
        self.held.insert(seq, lines);
        if self.held.len() > Self::MAX_HELD || self.held_bytes > Self::MAX_HELD_BYTES {
            // Give up on what is missing: the oldest batch held is next.
            self.next = self.held.keys().next().copied().unwrap_or(self.next);
        }
        let mut out = Vec::new();
        while let Some(l) = self.held.remove(&self.next) {
            self.held_bytes -= l.iter().map(OutputLine::size).sum::<usize>();
            out.extend(l);
            self.next += 1;
        }
        out
    }

    /// Everything held, in order, past any gap: the shell has nothing more in flight.
    pub fn flush(&mut self) -> Vec<OutputLine> {
        let held = std::mem::take(&mut self.held);
        self.held_bytes = 0;
        if let Some(last) = held.keys().next_back() {
            self.next = last + 1;
        }
        held.into_values().flatten().collect()
    }
}

/// One job.
#[derive(Clone, Debug)]
pub struct Job {
    /// Id.
    pub id: JobId,
    /// Submitting user.
    pub userid: u32,
    /// The client's key for the submission that made the job, if it sent one (`submit_key.rs`).
    pub submit_key: Option<SubmitKey>,
    /// State (RFC 21).
    pub state: JobState,
    /// The jobspec as submitted, as compact JSON text ([`Job::jobspec`] parses it): a parsed `Value` of even a
    /// small jobspec holds a few KiB of maps, for every queued job, while the scheduler reads only `req`.
    jobspec_text: std::sync::Arc<str>,
    /// `attributes.system.job.name` of the jobspec, if it has one (`vigil jobs` shows it).
    name: Option<Box<str>>,
    /// Validated request.
    pub req: JobRequest,
    /// RFC 18 eventlog.
    pub eventlog: Vec<std::sync::Arc<Event>>,
    /// Task output kept for watchers, in arrival order; at most [`OUTPUT_KEEP`] bytes, oldest dropped first.
    pub output: VecDeque<OutputLine>,
    /// Absolute index of `output[0]` (chunks dropped so far).
    pub output_base: usize,
    /// Bytes held in `output`.
    pub output_bytes: usize,
    /// Allocation, once allocated.
    pub alloc: Vec<RankAlloc>,
    /// R of the allocation (RFC 20).
    pub r: Option<Rv1>,
    /// Shells by broker rank.
    pub shells: BTreeMap<u32, ShellState>,
    /// Submission time (s since epoch).
    pub t_submit: f64,
    /// Allocation time.
    pub t_run: Option<f64>,
    /// Time it became INACTIVE.
    pub t_inactive: Option<f64>,
    /// Time limit expiry (s since epoch), if limited.
    pub expiration: Option<f64>,
    /// exit-timeout in seconds (`None` = none).
    pub exit_timeout: Option<f64>,
    /// The job's own `kill-timeout` shell option (seconds from SIGTERM to SIGKILL), if it set one, instead of the
    /// instance's `exec.kill-timeout`: shorter, so that a job that traps SIGTERM does not hold its nodes (and a
    /// restart script waiting on it) that long, or longer, to flush on SIGTERM, up to `exec.kill-timeout-max`
    /// (checked at submit).
    pub kill_timeout: Option<f64>,
    /// When the first task exited.
    pub first_exit: Option<f64>,
    /// When the exit-timeout clock started: the first task exit, or, if a shell had not started by then, the
    /// moment the last one did (the job's `start`). `None` until both happened.
    exit_clock: Option<f64>,
    /// When SIGTERM was sent to kill the job.
    pub term_sent: Option<f64>,
    /// SIGKILL was sent.
    pub kill_sent: bool,
    /// The first fatal exception.
    pub fatal: Option<Exception>,
    /// The broker rank of the job shell that raised the first fatal exception, if a shell did: its report's
    /// abort code (MPI_Abort's, or the failing task's under exit-on-error) is the job's exit code, not that of
    /// another shell whose tasks were then terminated.
    pub fatal_shell: Option<u32>,
    /// Finish status (largest task wait status).
    pub status: Option<i32>,
    /// PMI barrier requests received from this job's shells (one per shell per barrier).
    pub pmi_exchanges: u32,
    /// For a nested instance (batch/alloc): `{"uri", "size", "critical_ranks", "critical_broker_ranks"}`.
    pub instance: Option<Value>,
    /// Standard input sent by `vigil run` (base64 chunks), broadcast to every task; held until the job is
    /// INACTIVE, at most [`STDIN_KEEP`] bytes of input.
    pub stdin: Vec<String>,
    /// Bytes of input (decoded) in `stdin`.
    pub stdin_bytes: usize,
    /// No more standard input will come (always true for jobs submitted without `vigil run`).
    pub stdin_eof: bool,
    /// Brokers of a nested instance that exited cut off from its rank 0, by rank, with when: their verdict waits
    /// for the failure that caused it (`nested.rs`).
    pub cut_off: BTreeMap<u32, f64>,
    /// What the kernel accounted for the job's shells so far (their cgroups): CPU times summed, peak memory the
    /// largest of any node. `None` without cgroup containment.
    pub usage: Option<crate::shellproto::Usage>,
    /// Times the job went back to the queue after losing a node (`requeue.rs`).
    pub requeues: u32,
    /// The RFC 34 task map of its last start (which node runs which task rank), as the `start` event carries it.
    pub taskmap: Option<Value>,
    /// Set when a loss makes the job fail and it will be requeued once its resources are released: why.
    requeue_pending: Option<String>,
    /// Ranks of the allocation already released early (RFC 32 partial release of lost nodes).
    released: IdSet,
    /// Shells confirmed started, and shells gone (counters over `shells`, so no event scans them).
    nspawned: usize,
    nexited: usize,
    /// The deadline under which the job is filed in [`JobCore`]'s timer index (`timers.rs`).
    armed: Option<f64>,
    /// Events of `eventlog` already kept in the state directory, and whether its INACTIVE output is (`journal.rs`).
    saved_events: usize,
    saved_output: bool,
    /// While it runs: output chunks kept in the state directory (the absolute index after the last one), and the
    /// next batch due from each shell as kept there (by broker rank; none kept is 0), so that a restarted rank 0
    /// goes on with both (`journal.rs`).
    saved_chunks: usize,
    saved_marks: BTreeMap<u32, u64>,
    /// Its state and exit status as its row in the state directory last had them (`journal.rs`): the row is
    /// written again only when they change (or R does, at an `alloc`).
    saved_row: Option<(JobState, Option<i32>)>,
}

impl Job {
    /// A job in state NEW with no events yet, submitted at `now` by `userid` (its exit-timeout from the
    /// request's shell options).
    fn new(id: JobId, userid: u32, jobspec: &Value, req: JobRequest, now: f64) -> Job {
        let exit_timeout = match req.shell_options.get("exit-timeout") {
            // 0 is none, as `-t 0` is: a zero wait would fire before the last shell's exit report could arrive.
            Some(Value::String(s)) => {
                crate::duration::parse_duration_secs(s).ok().filter(|v| v.is_finite() && *v > 0.0)
            }
            Some(Value::Number(n)) => n.as_f64().filter(|v| *v > 0.0),
            _ => Some(DEFAULT_EXIT_TIMEOUT),
        };
        let kill_timeout = req.kill_timeout();
        Job {
            id,
            userid,
            submit_key: None,
            state: JobState::New,
            jobspec_text: jobspec.to_string().into(),
            name: jobspec.pointer("/attributes/system/job/name").and_then(Value::as_str).map(Into::into),
            req,
            eventlog: Vec::new(),
            output: VecDeque::new(),
            output_base: 0,
            output_bytes: 0,
            alloc: Vec::new(),
            r: None,
            shells: BTreeMap::new(),
            t_submit: now,
            t_run: None,
            t_inactive: None,
            expiration: None,
            exit_timeout,
            kill_timeout,
            first_exit: None,
            exit_clock: None,
            term_sent: None,
            kill_sent: false,
            fatal: None,
            fatal_shell: None,
            status: None,
            pmi_exchanges: 0,
            instance: None,
            stdin: Vec::new(),
            stdin_bytes: 0,
            stdin_eof: true,
            cut_off: BTreeMap::new(),
            usage: None,
            requeues: 0,
            taskmap: None,
            requeue_pending: None,
            released: IdSet::new(),
            nspawned: 0,
            nexited: 0,
            armed: None,
            saved_events: 0,
            saved_output: false,
            saved_chunks: 0,
            saved_marks: BTreeMap::new(),
            saved_row: None,
        }
    }

    /// The ranks and hosts of the nodes the job's last run lost: those its exceptions name in their `ranks` and
    /// `hosts` (a lost node's `node-failure`; a batch or alloc job's broker that failed while its node lived on),
    /// since its last `requeue`. The hosts are in rank order, as the ranks are.
    pub fn lost(&self) -> (IdSet, crate::hostlist::Hostlist) {
        lost_in(journal::this_run(&self.eventlog))
    }

    /// What each earlier run of a requeued job lost ([`Job::lost`] of each run before a `requeue`), oldest first:
    /// `(run, ranks, hosts)` with runs numbered from 1, only runs that lost nodes.
    pub fn lost_earlier(&self) -> Vec<(usize, IdSet, crate::hostlist::Hostlist)> {
        let mut out = Vec::new();
        let mut from = 0;
        let mut run = 1;
        for (i, e) in self.eventlog.iter().enumerate() {
            if e.name == "requeue" {
                let (ranks, hosts) = lost_in(&self.eventlog[from..i]);
                if !ranks.is_empty() || !hosts.is_empty() {
                    out.push((run, ranks, hosts));
                }
                from = i + 1;
                run += 1;
            }
        }
        out
    }

    /// The jobspec as submitted.
    pub fn jobspec(&self) -> Value {
        serde_json::from_str(&self.jobspec_text).unwrap_or(Value::Null)
    }

    /// `attributes.system.files` of the jobspec (files the shell writes before the tasks start), if any.
    fn files(&self) -> serde_json::Map<String, Value> {
        // A jobspec without the key anywhere has none: no parse at each start of an ordinary job.
        if !self.jobspec_text.contains("\"files\"") {
            return serde_json::Map::new();
        }
        self.jobspec().pointer("/attributes/system/files").and_then(Value::as_object).cloned().unwrap_or_default()
    }

    /// What the job still holds: its allocation without the ranks released early.
    fn held(&self) -> Vec<RankAlloc> {
        self.alloc.iter().filter(|a| !self.released.contains(a.rank)).cloned().collect()
    }

    /// The job was re-attached after a restart of rank 0 in its current run (a `restart` event since its last
    /// `requeue`, `reattach.rs`).
    fn reattached(&self) -> bool {
        journal::this_run(&self.eventlog).iter().any(|e| e.name == "restart")
    }

    /// When its last shell ended (the latest [`ShellState::ended`]), no earlier than the job started; `None`
    /// when a shell did not say.
    fn shells_ended(&self) -> Option<f64> {
        let mut last = self.t_run?;
        for s in self.shells.values() {
            last = last.max(s.ended?);
        }
        Some(last)
    }

    fn post(&mut self, now: f64, name: &str, context: Value) {
        let next = self.state.apply(name, &context).unwrap_or(self.state);
        self.state = next;
        // Shared, not copied, with the journal batch that writes it (journal.rs).
        self.eventlog.push(std::sync::Arc::new(Event::with_time(now, name, context)));
    }

    /// When the tasks of its (latest) run ended: its `finish` event's time, which for a job whose tasks ended
    /// while rank 0 was away is when they ended on their node, not when rank 0 heard (`reattach.rs`). Seconds
    /// since the Unix epoch; `None` before the tasks ended, or if they never ran.
    pub fn t_finish(&self) -> Option<f64> {
        self.eventlog.iter().rev().take_while(|e| e.name != "requeue").find(|e| e.name == "finish").map(|e| e.timestamp)
    }

    /// Outcome as `vigil jobs` shows it: COMPLETED, FAILED, CANCELED, TIMEOUT (INACTIVE jobs only).
    pub fn result(&self) -> Option<&'static str> {
        if self.state != JobState::Inactive {
            return None;
        }
        Some(match (&self.fatal, self.status) {
            (Some(e), _) if e.kind == "cancel" => "CANCELED",
            (Some(e), _) if e.kind == "timelimit" => "TIMEOUT",
            (Some(_), _) => "FAILED",
            (None, Some(0)) => "COMPLETED",
            _ => "FAILED",
        })
    }

    /// Exit code shown to users ([`crate::shellproto::job_exit_code`]): from the finish status (code or
    /// 128+signal), 69 if a lost node ended the job, 1 if the job never ran tasks.
    pub fn exit_code(&self) -> Option<i32> {
        if self.state != JobState::Inactive {
            return None;
        }
        Some(crate::shellproto::job_exit_code(self.status, self.fatal.as_ref().map(|e| e.kind.as_str())))
    }

    /// Summary for `vigil jobs --json`.
    pub fn info(&self) -> Value {
        let nodelist = self.r.as_ref().and_then(|r| r.execution.nodelist.first().cloned()).unwrap_or_default();
        let ranks: IdSet = self.alloc.iter().map(|a| a.rank).collect();
        let (lost_ranks, lost_hosts) = self.lost();
        json!({
            // The nodes its run lost and kept going without (a batch or alloc job) or died of, and how many it
            // holds now (`nnodes` stays the count it started with).
            "lost_ranks": lost_ranks.to_string(), "lost_nodelist": lost_hosts.to_string(),
            // What the runs before a requeue lost (the fields above are the current run's), oldest first.
            "lost_earlier": self.lost_earlier().into_iter()
                .map(|(run, r, h)| json!({"run": run, "lost_ranks": r.to_string(), "lost_nodelist": h.to_string()}))
                .collect::<Vec<_>>(),
            "nnodes_current": ranks.iter().filter(|r| !lost_ranks.contains(*r)).count(),
            "id": self.id.0, "id_f58": self.id.f58(), "userid": self.userid, "state": self.state.name(),
            "name": self.name.as_deref()
                .or_else(|| self.req.command.first().map(|c| c.rsplit('/').next().unwrap_or(c))).unwrap_or(""),
            // Nodes held once allocated; before, the number asked for (`-N`), null when the jobspec names none.
            // Tasks run once allocated (a node range's follow its nodes); before, the number asked for.
            "ntasks": if self.shells.is_empty() { self.req.ntasks } else { self.shells.values().map(|s| s.ntasks).sum() },
            "taskmap": self.taskmap.clone().or_else(|| self.eventlog.iter().rev()
                .find(|e| e.name == "start").and_then(|e| e.context.get("taskmap").cloned())),
            "nnodes": if self.alloc.is_empty() { self.req.nnodes.map(Value::from).unwrap_or(Value::Null) } else { self.alloc.len().into() },
            "ranks": ranks.to_string(), "nodelist": nodelist,
            "t_submit": self.t_submit, "t_run": self.t_run, "t_finish": self.t_finish(), "t_inactive": self.t_inactive,
            "expiration": self.expiration, "result": self.result(), "exit_code": self.exit_code(),
            "exception": self.fatal, "duration": self.req.duration, "pmi_exchanges": self.pmi_exchanges, "instance": self.instance,
            "requeue": self.req.requeue, "requeues": self.requeues, "usage": self.usage,
            "uri": self.instance.as_ref().and_then(|i| i.get("uri")).cloned(),
        })
    }
}

/// The ranks and hosts of the nodes that the exceptions among `events` name in their `ranks` and `hosts`, the
/// hosts in rank order (each exception lists its hosts in the order of its ranks), so that `lost_nodelist` reads
/// as `lost_ranks` does: `node[3,6]` beside `3,6`, whichever was lost first.
fn lost_in(events: &[std::sync::Arc<Event>]) -> (IdSet, crate::hostlist::Hostlist) {
    let mut by_rank: BTreeMap<u32, String> = BTreeMap::new();
    let mut unranked: Vec<String> = Vec::new();
    for e in events.iter().filter(|e| e.name == "exception") {
        let (Some(r), Some(h)) = (e.context.get("ranks"), e.context.get("hosts")) else { continue };
        let ranks = r.as_str().and_then(|r| IdSet::parse(r).ok()).unwrap_or_default();
        let hosts = h.as_str().and_then(|h| crate::hostlist::Hostlist::parse(h).ok()).map(|l| l.into_vec());
        let hosts = hosts.unwrap_or_default();
        if ranks.len() == hosts.len() {
            by_rank.extend(ranks.iter().zip(hosts));
        } else {
            unranked.extend(hosts);
        }
        for r in ranks.iter() {
            by_rank.entry(r).or_default();
        }
    }
    let ranks: IdSet = by_rank.keys().copied().collect();
    let mut hosts: Vec<String> = by_rank.into_values().filter(|h| !h.is_empty()).collect();
    for h in unranked {
        if !hosts.contains(&h) {
            hosts.push(h);
        }
    }
    (ranks, hosts.into_iter().collect())
}

/// The job manager, scheduler and exec system of one instance.
#[derive(Debug)]
pub struct JobCore {
    /// Resources of the instance.
    pub pool: Pool,
    /// Every job, active or inactive.
    pub jobs: BTreeMap<JobId, Job>,
    /// How this instance schedules.
    pub config: SchedConfig,
    /// SCHED jobs in priority order (submission order: ids grow with time).
    queue: BTreeSet<JobId>,
    /// RUN and CLEANUP jobs (holding resources).
    running: BTreeSet<JobId>,
    /// Jobs with a live shell on each rank (ranks_down looks up only those).
    by_rank: BTreeMap<u32, BTreeSet<JobId>>,
    /// Running jobs by their next deadline (`timers.rs`).
    timers: BTreeSet<(timers::Due, JobId)>,
    /// The reservation of the last scheduling pass, and the pool with its plan taken (`backfill.rs`).
    reservation: Option<Reservation>,
    beside: Option<Pool>,
    /// Resources changed since the last full pass (a submission then needs one, not just a look at itself).
    sched_dirty: bool,
    /// The last full pass looked at every pending job (none was deeper than `sched.backfill-depth`).
    examined_all: bool,
    /// Pending jobs looked at by scheduling passes so far (`backfill.rs`): what bounds a pass's cost.
    examined: u64,
    /// What this nested instance lost for good, in order (`shrink.rs`).
    shrunk: Vec<String>,
    actions: Outbox,
    epoch: f64,
    last_ms: u64,
    seq: u32,
    /// Seconds between SIGTERM and SIGKILL when a job is killed.
    pub kill_timeout: f64,
    /// The longest kill timeout a job may ask for (`exec.kill-timeout-max`, seconds; `kill_timeout` is always
    /// allowed too): a longer one is refused at submit.
    pub kill_timeout_max: f64,
    /// RFC 44 resource eventlog.
    pub resource_eventlog: Vec<Event>,
    /// Topology source string per rank (for shell input).
    pub topology: BTreeMap<u32, (String, Option<u32>)>,
    /// INACTIVE jobs still holding output, oldest first.
    inactive_output: VecDeque<JobId>,
    /// INACTIVE jobs in the order they became so, for the purge rules (`purge.rs`); may hold ids already purged.
    inactive: VecDeque<JobId>,
    /// How many INACTIVE jobs are kept.
    inactive_kept: usize,
    /// Jobs purged since the last batch saved (`journal.rs`).
    purged: Vec<JobId>,
    /// Bytes of output they hold together.
    inactive_output_bytes: usize,
    /// What the journal saved last, and the drains kept from before a restart (`journal.rs`).
    saved: journal::Marks,
    /// Scheduling is stopped, and why ([`JobCore::stop_scheduling`]).
    stopped: Option<String>,
    /// Seconds a restored running job waits for its shells to come back (`tbon.parent_grace`; 0: it is ended at
    /// restore with a `restart` exception). See `reattach.rs`.
    pub reattach_grace: f64,
    /// Jobs being re-attached after a restart, while any are (`reattach.rs`).
    reattach: Option<reattach::Reattach>,
    /// Signals that could not reach their shell's rank, until it is reachable again (`kills.rs`).
    unreachable_kills: kills::UnreachableKills,
    /// The submission keys of the jobs held (`submit_key.rs`).
    submit_keys: submit_key::KeyIndex,
}

impl JobCore {
    /// A job core for an instance started at `epoch` (s since the Unix epoch).
    pub fn new(epoch: f64) -> JobCore {
        JobCore {
            pool: Pool::default(),
            jobs: BTreeMap::new(),
            config: SchedConfig::default(),
            queue: BTreeSet::new(),
            running: BTreeSet::new(),
            by_rank: BTreeMap::new(),
            timers: BTreeSet::new(),
            reservation: None,
            beside: None,
            sched_dirty: false,
            examined_all: true,
            examined: 0,
            shrunk: Vec::new(),
            actions: Outbox::default(),
            epoch,
            last_ms: 0,
            seq: 0,
            kill_timeout: DEFAULT_KILL_TIMEOUT,
            kill_timeout_max: DEFAULT_KILL_TIMEOUT_MAX,
            resource_eventlog: Vec::new(),
            topology: BTreeMap::new(),
            inactive_output: VecDeque::new(),
            inactive_output_bytes: 0,
            inactive: VecDeque::new(),
            inactive_kept: 0,
            purged: Vec::new(),
            saved: journal::Marks::default(),
            stopped: None,
            reattach_grace: 0.0,
            reattach: None,
            unreachable_kills: Default::default(),
            submit_keys: Default::default(),
        }
    }

    /// Stop scheduling for good (until rank 0 restarts), saying why: no pending job is started, and
    /// [`JobCore::pending_reason`] gives `why` (rank 0 could not read its state directory, `broker/store.rs`).
    pub fn stop_scheduling(&mut self, why: &str) {
        self.stopped = Some(why.to_string());
    }

    /// Why scheduling is stopped, if it is.
    pub fn scheduling_stopped(&self) -> Option<&str> {
        self.stopped.as_deref()
    }

    /// Next queued action, if any.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    fn new_id(&mut self, now: f64) -> JobId {
        let ms = ((now - self.epoch).max(0.0) * 1000.0) as u64;
        if ms > self.last_ms {
            self.last_ms = ms;
            self.seq = 0;
        } else {
            self.seq += 1;
            if self.seq >= 1024 {
                self.last_ms += 1;
                self.seq = 0;
            }
        }
        JobId::from_parts(self.last_ms, self.seq)
    }

    // ---------------------------------------------------------------- resources

    /// A broker joined with its node's resources (RFC 44 `online`).
    pub fn rank_online(
        &mut self,
        now: f64,
        rank: u32,
        hostname: &str,
        cores: IdSet,
        gpus: IdSet,
        topology: (String, Option<u32>),
    ) {
        if self.pool.ranks.get(&rank).is_some_and(|p| p.removed) {
            return; // left the instance for good (shrink.rs)
        }
        // New: its first join since this rank 0 started (a rank known from the state directory counted too).
        let new = !self.pool.ranks.contains_key(&rank) || self.saved.ranks_restored.remove(&rank);
        self.saved.ranks_expected.remove(&rank);
        let changed =
            self.pool.ranks.get(&rank).is_none_or(|p| p.hostname != hostname || p.cores != cores || p.gpus != gpus);
        if changed && self.journaling() {
            self.saved.ranks_dirty.insert(rank);
        }
        self.pool.add_rank(rank, hostname, cores, gpus);
        // Jobs re-attached after a restart hold their resources here again before anything is placed (reattach.rs).
        self.reattach_rank(rank, new);
        if let Some((reason, at)) = self.saved.drains.remove(&rank) {
            // Drained before rank 0 restarted (journal.rs): drained again, with its reason.
            if let Some(p) = self.pool.ranks.get_mut(&rank) {
                p.drained = Some(reason);
                p.drained_at = Some(at);
            }
        }
        self.topology.insert(rank, topology);
        self.resource_eventlog.push(Event::with_time(now, "online", json!({"idset": rank.to_string()})));
        self.schedule(now);
    }

    /// `rank`, online again just now ([`JobCore::rank_online`]), registered under `parent`, which is not its
    /// static parent (it was adopted, and rank 0 restarted): its `online` event says so, so that a later restart
    /// of rank 0 knows where it is ([`journal::pending_orphans`]).
    pub fn online_under(&mut self, rank: u32, parent: u32) {
        let Some(e) = self.resource_eventlog.last_mut() else { return };
        if e.name == "online" && e.context.get("idset").and_then(Value::as_str) == Some(rank.to_string().as_str()) {
            e.context.insert("parent".into(), json!(parent));
        }
    }

    /// Drain `ranks` with `reason` (`flux resource drain`): no new work is placed on them. A rank drained already
    /// is refused, naming it, unless `mode` says otherwise ([`DrainMode`]). The resource eventlog's `drain` event
    /// names the ranks whose reason it set.
    ///
    /// # Errors
    /// Ranks not in the instance, no ranks, or ranks drained already under [`DrainMode::Refuse`] (named, with
    /// their reasons).
    pub fn drain(&mut self, now: f64, ranks: &IdSet, reason: &str, mode: DrainMode) -> Result<(), String> {
        self.check_ranks(ranks)?;
        let drained = |r: &u32| self.pool.ranks.get(r).is_some_and(|p| p.drained.is_some());
        let ranks: IdSet = match mode {
            DrainMode::Refuse => {
                let already: Vec<String> = ranks
                    .iter()
                    .filter(drained)
                    .map(|r| format!("{r} ({})", self.pool.ranks[&r].drained.as_deref().unwrap_or("")))
                    .collect();
                if !already.is_empty() {
                    return Err(format!(
                        "rank(s) already drained: {}; --force sets the new reason, --update drains only the others",
                        already.join(", ")
                    ));
                }
                ranks.clone()
            }
            DrainMode::Force => ranks.clone(),
            DrainMode::Update => ranks.iter().filter(|r| !drained(r)).collect(),
        };
        if ranks.is_empty() {
            return Ok(());
        }
        for r in ranks.iter() {
            if let Some(p) = self.pool.ranks.get_mut(&r) {
                p.drained = Some(reason.to_string());
                p.drained_at = Some(now);
            }
        }
        self.resource_eventlog.push(Event::with_time(
            now,
            "drain",
            json!({"idset": ranks.to_string(), "reason": reason}),
        ));
        self.sched_dirty = true;
        Ok(())
    }

    /// Return drained `ranks` to service.
    pub fn undrain(&mut self, now: f64, ranks: &IdSet) -> Result<(), String> {
        self.check_ranks(ranks)?;
        let not: IdSet = ranks.iter().filter(|r| self.pool.ranks.get(r).is_some_and(|p| p.drained.is_none())).collect();
        if !not.is_empty() {
            return Err(format!("rank(s) {not} not drained"));
        }
        for r in ranks.iter() {
            if let Some(p) = self.pool.ranks.get_mut(&r) {
                p.drained = None;
                p.drained_at = None;
            }
        }
        self.resource_eventlog.push(Event::with_time(now, "undrain", json!({"idset": ranks.to_string()})));
        self.schedule(now);
        Ok(())
    }

    /// A health check drains `rank` with `reason` (which starts with [`crate::health::REASON_PREFIX`]; a
    /// broker's `resource.drain` with `"by": "health"`): drained if it is not, given the new reason if a health
    /// check drained it with another, left alone if an admin drained it (the admin's reason stays, and the later
    /// undrain by the check will not undo it). Returns whether the drain or its reason changed.
    ///
    /// # Errors
    /// `rank` is not in the instance (it has not registered).
    pub fn health_drain(&mut self, now: f64, rank: u32, reason: &str) -> Result<bool, String> {
        let ranks: IdSet = [rank].into_iter().collect();
        self.check_ranks(&ranks)?;
        match self.pool.ranks[&rank].drained.as_deref() {
            Some(r) if r == reason || !r.starts_with(crate::health::REASON_PREFIX) => Ok(false),
            _ => self.drain(now, &ranks, reason, DrainMode::Force).map(|()| true),
        }
    }

    /// A health check passes on `rank`: undrained if a health check drained it (its reason starts with
    /// [`crate::health::REASON_PREFIX`]), else left as it is. Returns whether it was undrained.
    ///
    /// # Errors
    /// `rank` is not in the instance.
    pub fn health_undrain(&mut self, now: f64, rank: u32) -> Result<bool, String> {
        let ranks: IdSet = [rank].into_iter().collect();
        self.check_ranks(&ranks)?;
        match self.pool.ranks[&rank].drained.as_deref() {
            Some(r) if r.starts_with(crate::health::REASON_PREFIX) => self.undrain(now, &ranks).map(|()| true),
            _ => Ok(false),
        }
    }

    fn check_ranks(&self, ranks: &IdSet) -> Result<(), String> {
        let bad: IdSet = ranks.iter().filter(|r| !self.pool.ranks.contains_key(r)).collect();
        if ranks.is_empty() {
            return Err("no ranks given".into());
        }
        if bad.is_empty() {
            Ok(())
        } else {
            Err(format!("rank(s) {bad} not in this instance"))
        }
    }

    /// Ranks became torpid (`true`: no new work placed there) or lively again (`false`); RFC 44 events.
    pub fn ranks_torpid(&mut self, now: f64, ranks: &IdSet, torpid: bool) {
        for r in ranks.iter() {
            if let Some(p) = self.pool.ranks.get_mut(&r) {
                p.torpid = torpid;
            }
        }
        let name = if torpid { "torpid" } else { "lively" };
        self.resource_eventlog.push(Event::with_time(now, name, json!({"idset": ranks.to_string()})));
        if torpid {
            self.sched_dirty = true;
        } else {
            self.schedule(now);
        }
    }

    /// Critical broker ranks of a job: every shell of an ordinary job; for a nested instance (a batch or alloc
    /// job), the ranks it reported (its rank 0, and its routers if its brokers do not re-parent), mapped to this
    /// instance's ranks. Until it reports them (its `memo`, once every broker of it has joined or been lost), the
    /// ranks its jobspec's shape says it will report (`attributes.system.instance`,
    /// [`crate::jobspec::NestedInstance`]), so that a node lost during its start-up is judged as it would be a
    /// moment later.
    pub fn critical_ranks(job: &Job) -> IdSet {
        if let Some(c) = job
            .instance
            .as_ref()
            .and_then(|i| i.get("critical_broker_ranks"))
            .and_then(Value::as_str)
            .and_then(|s| IdSet::parse(s).ok())
        {
            return c;
        }
        match &job.req.instance {
            // The nested instance numbers its brokers in the order of the job's shells (shell_rank).
            Some(shape) if !job.shells.is_empty() => {
                let size = job.shells.len() as u32;
                let inner = crate::broker::reparent::critical_ranks(shape.topo(size), size, shape.reparent);
                job.shells.values().filter(|s| inner.contains(s.shell_rank)).map(|s| s.rank).collect()
            }
            _ => job.shells.keys().copied().collect(),
        }
    }

    /// Brokers on `ranks` were lost (a whole subtree). Their resources go down. For every running job with a
    /// shell there: losing a critical rank raises a fatal `exec` exception (severity 0; a `--requeue` job then goes
    /// back to the queue, `requeue.rs`); losing any other raises a `node-failure` exception (severity 2), releases
    /// the lost ranks' resources early (RFC 32 partial release), tells the job's leader shell, and the job keeps
    /// running on the survivors. A nested instance then shrinks (`shrink.rs`).
    pub fn ranks_lost(&mut self, now: f64, ranks: &IdSet) {
        self.ranks_down(now, ranks, "lost", "")
    }

    /// Like [`JobCore::ranks_lost`], recording why in the RFC 44 `offline` event: `state` is `lost` (failure) or
    /// `offline` (the broker left), `reason` the membership verdict.
    pub fn ranks_down(&mut self, now: f64, ranks: &IdSet, state: &str, reason: &str) {
        for r in ranks.iter() {
            if let Some(p) = self.pool.ranks.get_mut(&r) {
                p.up = false;
                p.torpid = false;
            }
        }
        let mut ctx = json!({"idset": ranks.to_string(), "state": state});
        if !reason.is_empty() {
            ctx["reason"] = json!(reason);
        }
        self.resource_eventlog.push(Event::with_time(now, "offline", ctx));
        // The jobs with a live shell on a lost rank, from the index (not a scan of every job).
        let mut hit: BTreeMap<JobId, Vec<u32>> = BTreeMap::new();
        for r in ranks.iter() {
            for id in self.by_rank.get(&r).into_iter().flatten() {
                hit.entry(*id).or_default().push(r);
            }
        }
        self.jobs_lose_ranks(now, hit);
        if self.config.shrink {
            self.shrink(now, ranks);
        }
        self.schedule(now);
    }

    /// Give `ranks` of running job `id` back to the pool while the job goes on without them (RFC 32's
    /// `release{final:false}`): a node lost under a job that survives it, a nested instance's broker that failed
    /// on a node that lives on (nested.rs). Nothing for ranks released already.
    pub(super) fn release_partly(&mut self, now: f64, id: JobId, ranks: &IdSet) {
        let Some(j) = self.jobs.get_mut(&id) else { return };
        let ranks: IdSet =
            ranks.iter().filter(|r| !j.released.contains(*r) && j.alloc.iter().any(|a| a.rank == *r)).collect();
        if ranks.is_empty() {
            return;
        }
        j.post(now, "release", json!({"ranks": ranks.to_string(), "final": false}));
        let alloc = j.held();
        j.released = j.released.union(&ranks);
        self.pool.free(&alloc, Some(&ranks));
        self.actions.push_back(Action::Updated(id));
        self.sched_dirty = true;
    }

    /// The lost-rank rules of [`JobCore::ranks_lost`] for each job and the ranks it lost (shells there).
    ///
    /// The exception's note names each node once, as its host name and its rank in this instance, and says what
    /// of the job ran there (`lost node node3 (rank 3), where task 2 ran`; of a batch or alloc job, `where rank 2
    /// of the job's instance ran`); its context also carries `ranks` (an idset) and `hosts` (a host list) of the
    /// lost nodes, which `vigil job info` gathers ([`Job::info`]).
    fn jobs_lose_ranks(&mut self, now: f64, hit: BTreeMap<JobId, Vec<u32>>) {
        for (id, lost) in hit {
            let Some(job) = self.jobs.get(&id) else { continue };
            let critical = Self::critical_ranks(job);
            let lost_set: IdSet = lost.iter().copied().collect();
            let what = self.describe_lost(job, &lost_set);
            let fatal = lost.iter().any(|r| critical.contains(*r));
            let nested = job.instance.is_some() || job.req.instance.is_some();
            let hosts: crate::hostlist::Hostlist = lost.iter().map(|r| self.hostname(*r)).collect();
            // The lost shells' ranks, which are the lost brokers' ranks in a batch or alloc job's own instance:
            // its rank 0 reads them from this exception to stop waiting for them during its start-up.
            let shell_set: IdSet = lost.iter().filter_map(|r| job.shells.get(r).map(|s| s.shell_rank)).collect();
            let ctx = |note: &str, severity: u32| {
                json!({"type": "node-failure", "severity": severity, "note": note,
                       "ranks": lost_set.to_string(), "hosts": hosts.to_string(),
                       "shell_ranks": shell_set.to_string()})
            };
            // In the job's own instance (a batch or alloc job): its ranks are the shell ranks.
            let inner: Vec<String> = lost
                .iter()
                .filter_map(|r| job.shells.get(r).map(|s| format!("{} (rank {})", self.hostname(*r), s.shell_rank)))
                .collect();
            for r in &lost {
                self.shell_gone(id, *r);
            }
            if fatal {
                let mut note = format!("lost {what}");
                if nested {
                    note.push_str("; the job's instance cannot go on without it");
                }
                if let Some(more) = self.arm_requeue(id, &what) {
                    note = format!("{note}; {more}");
                }
                self.raise_ctx(now, id, ctx(&note, 0), true);
            } else {
                let note = format!("lost {what}; the job continues on the remaining nodes");
                self.raise_ctx(now, id, ctx(&note, 2), false);
                let Some(j) = self.jobs.get(&id) else { continue };
                let leader = j.shells.values().filter(|s| !s.exited).min_by_key(|s| s.shell_rank).map(|s| s.rank);
                let shell_ranks: Vec<u32> = lost.iter().filter_map(|r| j.shells.get(r).map(|s| s.shell_rank)).collect();
                self.release_partly(now, id, &lost_set);
                if let Some(leader) = leader {
                    let nodes = if inner.len() == 1 { "node" } else { "nodes" };
                    self.actions.push_back(Action::NotifyShell {
                        id,
                        rank: leader,
                        lost_shells: shell_ranks,
                        note: format!(
                            "this instance lost {nodes} {}; it continues on the remaining nodes",
                            inner.join(", ")
                        ),
                    });
                }
            }
            self.maybe_finish(now, id);
        }
    }

    /// The host name of broker rank `rank` (`?` if it never joined).
    fn hostname(&self, rank: u32) -> String {
        self.pool.ranks.get(&rank).map_or_else(|| "?".to_string(), |p| p.hostname.clone())
    }

    /// `node node3 (rank 3), where task 2 ran` for the lost `ranks` of `job` (`nodes ..., where tasks 4-5 ran,
    /// and ...`); of a batch or alloc job, `where rank 2 of the job's instance ran`. Ranks are this instance's.
    fn describe_lost(&self, job: &Job, ranks: &IdSet) -> String {
        // Its map, or after a restart of rank 0 the one its `start` event carries.
        let map = job.taskmap.clone().or_else(|| {
            job.eventlog.iter().rev().find(|e| e.name == "start").and_then(|e| e.context.get("taskmap").cloned())
        });
        let by_node = map.and_then(|m| crate::taskmap::Taskmap::decode(&m).ok()).map(|m| {
            let n = job.shells.values().map(|s| s.shell_rank as usize + 1).max().unwrap_or(0);
            m.tasks_by_node(n)
        });
        let parts: Vec<String> = ranks
            .iter()
            .map(|r| {
                let node = format!("{} (rank {r})", self.hostname(r));
                let Some(sh) = job.shells.get(&r) else { return node };
                if job.instance.is_some() || job.req.instance.is_some() {
                    return format!("{node}, where rank {} of the job's instance ran", sh.shell_rank);
                }
                match by_node.as_ref().and_then(|b| b.get(sh.shell_rank as usize)) {
                    Some(tasks) if !tasks.is_empty() => {
                        let set: IdSet = tasks.iter().copied().collect();
                        let word = if tasks.len() == 1 { "task" } else { "tasks" };
                        format!("{node}, where {word} {set} ran")
                    }
                    _ => node,
                }
            })
            .collect();
        let nodes = if parts.len() == 1 { "node" } else { "nodes" };
        format!("{nodes} {}", parts.join("; "))
    }

    /// The shell of job `id` on `rank` is gone (exited, failed to start, or its rank was lost): false if it was
    /// already.
    fn shell_gone(&mut self, id: JobId, rank: u32) -> bool {
        let Some(job) = self.jobs.get_mut(&id) else { return false };
        let Some(sh) = job.shells.get_mut(&rank) else { return false };
        if sh.exited {
            return false;
        }
        sh.exited = true;
        job.nexited += 1;
        self.forget_unreachable_signal(id, rank);
        if let Some(set) = self.by_rank.get_mut(&rank) {
            set.remove(&id);
            if set.is_empty() {
                self.by_rank.remove(&rank);
            }
        }
        true
    }

    // ---------------------------------------------------------------- jobs

    /// Submit a jobspec (RFC 25, as JSON) for `userid`, without standard input. Refuses malformed and
    /// never-satisfiable requests without creating anything.
    pub fn submit(&mut self, now: f64, jobspec: &Value, userid: u32) -> Result<JobId, SubmitError> {
        self.submit_with_stdin(now, jobspec, userid, false)
    }

    /// [`JobCore::submit`], with `stdin` true for a job whose standard input the submitter will stream
    /// ([`JobCore::stdin`], as `vigil run` does): set before the job can be scheduled, since its shells, which
    /// may start at once, ask rank 0 for it only then.
    pub fn submit_with_stdin(
        &mut self,
        now: f64,
        jobspec: &Value,
        userid: u32,
        stdin: bool,
    ) -> Result<JobId, SubmitError> {
        let spec = Jobspec::from_value(jobspec).map_err(|e| SubmitError::Jobspec(e.to_string()))?;
        let mut req = spec.validate().map_err(|e| SubmitError::Jobspec(e.to_string()))?;
        if let Some(k) = req.kill_timeout() {
            // A job may choose any kill timeout up to the admin's bound (and the instance's own is always fine).
            let max = self.kill_timeout_max.max(self.kill_timeout);
            if k > max {
                let fmt = crate::attrs::fmt_duration;
                return Err(SubmitError::Jobspec(format!(
                    "attributes.system.shell.options.kill-timeout: {} is more than this instance allows, {} \
                     (exec.kill-timeout-max)",
                    fmt(k),
                    fmt(max)
                )));
            }
        }
        if let crate::taskmap::Scheme::Hostfile { .. } = &req.taskmap {
            // A host the instance does not have: the job could never run (its nodes are the hostfile's).
            let known: std::collections::BTreeSet<&str> =
                self.pool.ranks.values().map(|p| p.hostname.as_str()).collect();
            let unknown: crate::hostlist::Hostlist =
                req.taskmap.hosts().into_iter().filter(|h| !known.contains(h.as_str())).collect();
            if !unknown.is_empty() {
                return Err(SubmitError::Jobspec(format!(
                    "attributes.system.shell.options.taskmap: the hostfile names {unknown}, not a node of this \
                     instance"
                )));
            }
        }
        // Nodes the constraints name that this instance does not have (a typo, most likely): said either way.
        let unknown = req.constraint.as_ref().map(|c| self.unknown_nodes(c)).filter(|u| !u.is_empty());
        if let Err(err) = self.pool.feasible(&req) {
            if let Some(unknown) = unknown {
                return Err(SubmitError::UnknownNodes { err, unknown });
            }
            let mut whole = self.pool.clone();
            whole.ranks.values_mut().for_each(|p| p.removed = false);
            if !self.shrunk.is_empty() && whole.feasible(&req).is_ok() {
                return Err(SubmitError::Shrunk { err, lost: self.shrunk.join(", ") });
            }
            return Err(err.into());
        }
        if let Some(u) = unknown {
            req.warnings.push(format!("attributes.system.constraints: {u}"));
        }
        if req.duration.is_none() {
            // sched.default-duration: the time limit of a job submitted without one.
            req.duration = self.config.default_duration;
        }
        let id = self.new_id(now);
        let mut job = Job::new(id, userid, jobspec, req, now);
        job.stdin_eof = !stdin;
        job.post(now, "submit", json!({"userid": userid, "urgency": 16, "flags": 0, "version": 1}));
        job.post(now, "validate", json!({}));
        job.post(now, "depend", json!({}));
        job.post(now, "priority", json!({"priority": 16}));
        self.jobs.insert(id, job);
        self.queue.insert(id);
        self.actions.push_back(Action::Updated(id));
        self.schedule_submitted(now, id);
        Ok(id)
    }

    /// What constraint `c` names that no node of this instance is (host names none of its brokers registered,
    /// ranks none of them has), said in a few words: empty when it names only known nodes.
    fn unknown_nodes(&self, c: &crate::constraint::Constraint) -> String {
        let (hosts, ranks) = c.named();
        let known: std::collections::BTreeSet<&str> = self.pool.ranks.values().map(|p| p.hostname.as_str()).collect();
        let hosts: crate::hostlist::Hostlist = hosts.iter().filter(|h| !known.contains(h.as_str())).cloned().collect();
        let ranks: IdSet = ranks.iter().filter(|r| !self.pool.ranks.contains_key(r)).collect();
        let mut parts = Vec::new();
        if !hosts.is_empty() {
            let verb = if hosts.len() == 1 { "is not a node" } else { "are not nodes" };
            parts.push(format!("{hosts} {verb} of this instance"));
        }
        if !ranks.is_empty() {
            parts.push(format!("no broker of rank {ranks} has joined this instance"));
        }
        parts.join("; ")
    }

    fn start(&mut self, now: f64, id: JobId, alloc: Vec<RankAlloc>) {
        let ranks: Vec<RankResources> = alloc
            .iter()
            .map(|a| RankResources {
                rank: a.rank,
                hostname: self.pool.ranks.get(&a.rank).map(|p| p.hostname.clone()).unwrap_or_default(),
                cores: a.cores.clone(),
                gpus: a.gpus.clone(),
            })
            .collect();
        let Some(job) = self.jobs.get_mut(&id) else { return };
        let expiration = job.req.duration.filter(|d| *d > 0.0).map(|d| now + d);
        let r = Rv1::from_ranks(&ranks, now, expiration.unwrap_or(0.0));
        // Distribute tasks: with a node count, evenly over the nodes (the first nodes get one more), as
        // `srun -N` / `flux run -N` do; without, over the slots in allocation order.
        // One task per slot: as many as the slots allocated (a node range's grow with the nodes it got).
        let ntasks = if job.req.tasks_per_slot { alloc.iter().map(|a| a.slots).sum() } else { job.req.ntasks };
        let counts: Vec<u32> = if job.req.nnodes.is_some() {
            let n = alloc.len().max(1) as u32;
            let (base, extra) = (ntasks / n, ntasks % n);
            (0..alloc.len() as u32).map(|i| base + u32::from(i < extra)).collect()
        } else {
            let nslots: u32 = alloc.iter().map(|a| a.slots).sum::<u32>().max(1);
            let (base, extra) = (ntasks / nslots, ntasks % nslots);
            let mut slot_index = 0u32;
            alloc
                .iter()
                .map(|a| {
                    let mut n = 0;
                    for _ in 0..a.slots {
                        n += base + u32::from(slot_index < extra);
                        slot_index += 1;
                    }
                    n
                })
                .collect()
        };
        // The job's task map (RFC 34): the scheme asked for, over the block counts above. Submit checked what it
        // could; what only the nodes reveal (a manual map for a node range) fails the job here, saying why.
        let hostnames: Vec<String> = ranks.iter().map(|r| r.hostname.clone()).collect();
        let layout = job.req.taskmap.layout(&counts, &hostnames);
        let map = match layout {
            Ok(m) => m,
            Err(e) => {
                // Not expected (submit refuses what could fail here): the resources go back and the job ends.
                self.pool.free(&alloc, None);
                let note = format!("attributes.system.shell.options.taskmap: {e}");
                self.drop_pending(now, id, Exception { kind: "exec".into(), severity: 0, note });
                return;
            }
        };
        let by_node = map.tasks_by_node(alloc.len());
        let counts: Vec<u32> = by_node.iter().map(|t| t.len() as u32).collect();
        let ntasks: u32 = counts.iter().sum();
        let taskmap = map.to_value();
        self.queue.remove(&id);
        self.running.insert(id);
        for a in &alloc {
            self.by_rank.entry(a.rank).or_default().insert(id);
        }
        let Some(job) = self.jobs.get_mut(&id) else { return };
        job.alloc = alloc.clone();
        job.r = Some(r.clone());
        job.t_run = Some(now);
        job.expiration = expiration;
        job.taskmap = Some(taskmap.clone());
        let rv = serde_json::to_value(&r).unwrap_or(Value::Null);
        job.post(now, "alloc", json!({"R": rv}));
        let nshells = alloc.len() as u32;
        let files = job.files();
        for (i, a) in alloc.iter().enumerate() {
            let (topology, declared_gpus) = self.topology.get(&a.rank).cloned().unwrap_or(("live".into(), None));
            let input = ShellInput {
                id: id.0,
                id_f58: id.f58(),
                shell_rank: i as u32,
                broker_rank: a.rank,
                nshells,
                ntasks,
                first_task: by_node[i].first().copied().unwrap_or(0),
                local_tasks: counts[i],
                // Listed only when they are not one run of ranks (a cyclic, manual or hostfile map).
                tasks: by_node[i].windows(2).any(|w| w[1] != w[0] + 1).then(|| by_node[i].clone()),
                cores: a.cores.iter().collect(),
                gpus: a.gpus.iter().collect(),
                cores_per_task: job.req.cores_per_slot,
                gpus_per_task: job.req.gpus_per_slot,
                command: job.req.command.clone(),
                environment: job.req.environment.clone(),
                cwd: job.req.cwd.clone(),
                options: job.req.shell_options.clone(),
                taskmap: taskmap.clone(),
                r: rv.clone(),
                topology,
                declared_gpus,
                uri: String::new(),
                tmpdir: None,
                alloc_tmpdir: None,
                files: files.clone(),
                // Input ended with nothing held never grows again (`JobCore::stdin` refuses it): no shell asks.
                stdin: !(job.stdin_eof && job.stdin.is_empty()),
                placement: None,
            };
            job.shells.insert(
                a.rank,
                ShellState {
                    shell_rank: i as u32,
                    rank: a.rank,
                    ntasks: counts[i],
                    tasks: by_node[i].iter().copied().collect(),
                    spawned: false,
                    exited: false,
                    status: None,
                    abort_code: None,
                    ended: None,
                    batches: BatchOrder::default(),
                },
            );
            self.actions.push_back(Action::SpawnShell { id, rank: a.rank, input: Box::new(input) });
        }
        self.actions.push_back(Action::Updated(id));
        self.rearm(id);
    }

    /// The broker on `rank` started (Ok) or failed to start (Err) the job's shell.
    pub fn shell_spawned(&mut self, now: f64, id: JobId, rank: u32, result: Result<(), String>) {
        let Some(job) = self.jobs.get_mut(&id) else { return };
        let Some(sh) = job.shells.get_mut(&rank) else { return };
        match result {
            Ok(()) => {
                if sh.spawned {
                    return;
                }
                sh.spawned = true;
                job.nspawned += 1;
                if job.state == JobState::Run && job.nspawned == job.shells.len() {
                    // The task map in the start event, as Flux's `shell.start` carries it (`vigil job info`).
                    let ctx = match &job.taskmap {
                        Some(t) => json!({"taskmap": t}),
                        None => json!({}),
                    };
                    job.post(now, "start", ctx);
                    self.actions.push_back(Action::Updated(id));
                }
                if job.nspawned == job.shells.len() && job.first_exit.is_some() && job.exit_clock.is_none() {
                    // A task exited before the last shell started: the clock starts now (timers.rs).
                    job.exit_clock = Some(now);
                    self.rearm(id);
                }
            }
            Err(e) => {
                self.shell_gone(id, rank);
                let host = self.pool.ranks.get(&rank).map(|p| p.hostname.clone()).unwrap_or_default();
                self.raise(now, id, "exec", 0, &format!("failed to start job shell on {host} (rank {rank}): {e}"));
                self.maybe_finish(now, id);
            }
        }
    }

    /// A task of job `id` exited: the first one starts the exit-timeout clock, if every shell of the job has
    /// started; else the last shell to start does (a job's shells start one per node, over seconds on a loaded
    /// machine, and the tasks of the first may be done before the last is up: as under Flux's shell start
    /// barrier, the others are not late before they could run).
    pub fn task_exit(&mut self, now: f64, id: JobId, _task: u32, _status: i32) {
        if let Some(j) = self.jobs.get_mut(&id) {
            if j.first_exit.is_none() {
                j.first_exit = Some(now);
                if j.nspawned == j.shells.len() {
                    j.exit_clock = Some(now);
                }
                self.rearm(id);
            }
        }
    }

    /// Post an RFC 21 `memo` event (e.g. a nested instance's URI) on an active job.
    pub fn memo(&mut self, now: f64, id: JobId, context: Value) {
        if let Some(j) = self.jobs.get_mut(&id) {
            if j.state.is_active() {
                j.post(now, "memo", context);
                self.actions.push_back(Action::Updated(id));
            }
        }
    }

    /// A job became INACTIVE: keep only the tail of its output, and drop the output of the oldest inactive jobs
    /// beyond [`INACTIVE_OUTPUT_TOTAL`], so a long-lived instance does not grow with every job it ran.
    fn retire_output(&mut self, id: JobId) {
        if let Some(j) = self.jobs.get_mut(&id) {
            retire_stdin(j);
            trim_output(j, INACTIVE_OUTPUT_KEEP);
            self.inactive_output.push_back(id);
            self.inactive_output_bytes += j.output_bytes;
        }
        while self.inactive_output_bytes > INACTIVE_OUTPUT_TOTAL {
            let Some(old) = self.inactive_output.pop_front() else { break };
            if let Some(j) = self.jobs.get_mut(&old) {
                self.inactive_output_bytes = self.inactive_output_bytes.saturating_sub(j.output_bytes);
                trim_output(j, 0);
            }
        }
    }

    /// Standard input for job `id`: `data`, a chunk as base64 text, and/or `eof`, the end of input. Refused once
    /// the input has ended, when `data` is not base64, and when holding it would pass [`STDIN_KEEP`] bytes for
    /// the job (see [`StdinError`]); a refused chunk changes nothing, and what was accepted before is kept. End
    /// of input alone is accepted even when the input is full.
    pub fn stdin(&mut self, id: JobId, data: Option<String>, eof: bool) -> Result<(), StdinError> {
        use base64::Engine as _;
        let j = self.jobs.get_mut(&id).ok_or(StdinError::UnknownJob(id))?;
        if j.stdin_eof {
            return Err(StdinError::Closed(id));
        }
        if let Some(d) = data {
            let chunk = base64::engine::general_purpose::STANDARD
                .decode(&d)
                .map_err(|e| StdinError::NotBase64(e.to_string()))?
                .len();
            if j.stdin_bytes.saturating_add(chunk) > STDIN_KEEP {
                return Err(StdinError::Full { id, held: j.stdin_bytes, chunk });
            }
            j.stdin_bytes += chunk;
            j.stdin.push(d);
        }
        if eof || !j.state.is_active() {
            j.stdin_eof = true;
        }
        self.actions.push_back(Action::Updated(id));
        Ok(())
    }

    /// Output lines from a shell; `batch`: where they stand in the shell's numbering ([`BatchOrder`]).
    pub fn output(&mut self, id: JobId, batch: Batch, lines: Vec<OutputLine>) {
        if let Some(j) = self.jobs.get_mut(&id) {
            let shell = match batch {
                Batch::Numbered { rank, .. } | Batch::Flush { rank } => Some(rank),
                Batch::Unnumbered => None,
            };
            let due = |j: &Job| shell.and_then(|r| j.shells.get(&r)).and_then(|sh| sh.batches.due());
            let before = due(j);
            let lines = match batch {
                Batch::Unnumbered => lines,
                Batch::Numbered { rank, seq } => match j.shells.get_mut(&rank) {
                    Some(sh) => sh.batches.take(seq, lines),
                    None => lines,
                },
                Batch::Flush { rank } => {
                    let mut held = j.shells.get_mut(&rank).map(|sh| sh.batches.flush()).unwrap_or_default();
                    held.extend(lines);
                    held
                }
            };
            if lines.is_empty() {
                // A batch with nothing due still moves the shell's numbering, which the journal keeps.
                if due(j) != before {
                    self.actions.mark(id);
                }
                return;
            }
            for l in lines {
                j.output_bytes += l.size();
                j.output.push_back(l);
            }
            trim_output(j, OUTPUT_KEEP);
            self.actions.push_back(Action::Updated(id));
        }
    }

    /// A shell ended (reported by its broker).
    pub fn shell_exit(&mut self, now: f64, exit: ShellExit) {
        let id = JobId(exit.id);
        let host = self.pool.ranks.get(&exit.rank).map(|p| p.hostname.clone()).unwrap_or_default();
        self.reattach_heard(now, id, exit.rank);
        if !self.shell_gone(id, exit.rank) {
            return;
        }
        let Some(job) = self.jobs.get_mut(&id) else { return };
        if let Some(sh) = job.shells.get_mut(&exit.rank) {
            sh.ended = exit.ended;
        }
        if let Some(u) = exit.report.as_ref().and_then(|r| r.usage.as_ref()) {
            job.usage.get_or_insert_with(Default::default).add(u);
        }
        let killing = job.term_sent.is_some();
        let nested = job.instance.is_some();
        match &exit.report {
            Some(rep) if nested && !killing && rep.error.is_none() => {
                // A broker of a nested instance ended: the critical-rank rules of nested.rs.
                let Some(sh) = self.jobs.get_mut(&id).and_then(|j| j.shells.get_mut(&exit.rank)) else { return };
                sh.status = Some(rep.status);
                sh.abort_code = rep.abort_code;
                if !self.nested_broker_exit(now, id, exit.rank, &host, rep.status) {
                    // Not counted in the job's exit code: that is the instance's.
                    let Some(sh) = self.jobs.get_mut(&id).and_then(|j| j.shells.get_mut(&exit.rank)) else { return };
                    sh.status = None;
                }
            }
            Some(rep) => {
                let Some(sh) = self.jobs.get_mut(&id).and_then(|j| j.shells.get_mut(&exit.rank)) else { return };
                sh.status = Some(rep.status);
                sh.abort_code = rep.abort_code;
                if let Some(e) = &rep.error {
                    let note = format!("job shell on {host} (rank {}): {e}", exit.rank);
                    self.raise(now, id, "exec", 0, &note);
                }
            }
            None => {
                let Some(sh) = self.jobs.get_mut(&id).and_then(|j| j.shells.get_mut(&exit.rank)) else { return };
                sh.status = Some(exit.shell_status);
                if !killing {
                    let note = format!(
                        "job shell on {host} (rank {}) {} without reporting",
                        exit.rank,
                        crate::shellproto::describe_status(exit.shell_status)
                    );
                    self.raise(now, id, "exec", 0, &note);
                }
            }
        }
        self.journal_shell_exit(now, id, exit.rank);
        self.maybe_finish(now, id);
        self.rearm(id);
    }

    fn maybe_finish(&mut self, now: f64, id: JobId) {
        let Some(job) = self.jobs.get_mut(&id) else { return };
        if !(job.state == JobState::Run || job.state == JobState::Cleanup) || job.nexited < job.shells.len() {
            return;
        }
        if !job.cut_off.is_empty() {
            self.judge_cut_offs(now, id, true); // nothing more will be reported
        }
        let Some(job) = self.jobs.get_mut(&id) else { return };
        if job.t_inactive.is_some() || job.state == JobState::Sched {
            return; // finished (or requeued) by a verdict just given
        }
        let reported: Vec<i32> = job.shells.values().filter_map(|s| s.status).collect();
        if !reported.is_empty() {
            let mut status = reported.iter().copied().max_by_key(|s| exit_code(*s)).unwrap_or(0);
            let first = job.fatal_shell.and_then(|r| job.shells.get(&r)).and_then(|s| s.abort_code);
            if let Some(code) = first.or_else(|| job.shells.values().find_map(|s| s.abort_code)) {
                // MPI_Abort(code): the job exits with the code the application asked for.
                status = crate::shellproto::status_exited(code);
            }
            job.status = Some(status);
            let mut ctx = json!({"status": status});
            if let Some(u) = &job.usage {
                ctx["usage"] = json!(u); // cgroup accounting of every shell (jobs/mod.rs, Job::usage)
            }
            // A job re-attached after a restart of rank 0 may have ended during the outage: its `finish` carries
            // the time its last tasks ended, as their node saw it (reattach.rs), not that of the report's coming.
            let at = if job.reattached() { job.shells_ended().map_or(now, |t| t.min(now)) } else { now };
            job.post(at, "finish", ctx);
        } else if job.state == JobState::Run {
            job.post(now, "exception", json!({"type": "exec", "severity": 0, "note": "no job shell reported"}));
        }
        let ranks: IdSet = job.alloc.iter().map(|a| a.rank).collect();
        job.post(now, "release", json!({"ranks": ranks.to_string(), "final": true}));
        let held = job.held();
        job.post(now, "free", json!({}));
        self.pool.free(&held, None);
        let Some(job) = self.jobs.get_mut(&id) else { return };
        if let Some(why) = job.requeue_pending.take() {
            self.requeue(now, id, why);
            self.schedule(now);
            return;
        }
        job.post(now, "clean", json!({}));
        job.t_inactive = Some(now);
        self.running.remove(&id);
        self.rearm(id);
        self.became_inactive(id);
        self.actions.push_back(Action::Updated(id));
        self.retire_output(id);
        self.schedule(now);
    }

    /// The instance is being shut down (`vigil shutdown`, its initial program ended, a signal; `why` says which):
    /// every running job gets a fatal exception of type [`SHUTDOWN_EXCEPTION`] saying so, before its shells and
    /// brokers go. Otherwise its verdict would be what their going looks like (a lost critical rank, a shell
    /// killed without reporting), and a user would look for a failed node. Pending jobs are left as they are:
    /// with a state directory they are queued again at the next start. Scheduling stops: what the ending jobs free
    /// is not given to a pending job that the stopping brokers would never start.
    pub fn instance_shutdown(&mut self, now: f64, why: &str) {
        if self.stopped.is_none() {
            self.stopped = Some(format!("the instance is shutting down ({why})"));
        }
        let running: Vec<JobId> = self.jobs.values().filter(|j| j.state == JobState::Run).map(|j| j.id).collect();
        let note = format!("the instance was shut down ({why})");
        for id in running {
            self.raise(now, id, SHUTDOWN_EXCEPTION, 0, &note);
        }
    }

    /// The instance has stopped for good after [`JobCore::instance_shutdown`]: jobs it ended whose shells did not
    /// all report before the brokers went (killed with the instance) are finished now, with what was reported, so
    /// they are INACTIVE (their `shutdown` exception the reason) in the state directory, not left in CLEANUP for a
    /// later start to re-attach and then fail as if their nodes had been lost.
    pub fn instance_stopped(&mut self, now: f64) {
        let ended: Vec<JobId> = self
            .running
            .iter()
            .copied()
            .filter(|id| self.jobs[id].fatal.as_ref().is_some_and(|e| e.kind == SHUTDOWN_EXCEPTION))
            .collect();
        for id in ended {
            let ranks: Vec<u32> = self.jobs[&id].shells.values().filter(|s| !s.exited).map(|s| s.rank).collect();
            for r in ranks {
                self.shell_gone(id, r);
            }
            self.maybe_finish(now, id);
        }
    }

    /// Raise an exception on job `id`. Severity 0 is fatal: a pending job is removed at once, a running one is
    /// killed (SIGTERM, then SIGKILL after `kill_timeout`). Returns false if the job is not active.
    pub fn raise(&mut self, now: f64, id: JobId, kind: &str, severity: u32, note: &str) -> bool {
        self.raise_inner(now, id, kind, severity, note, false)
    }

    /// [`JobCore::raise`]; a fatal exception cancels a pending requeue (`requeue.rs`) unless `keep_requeue` (the
    /// loss that armed it).
    fn raise_inner(&mut self, now: f64, id: JobId, kind: &str, severity: u32, note: &str, keep_requeue: bool) -> bool {
        self.raise_ctx(now, id, json!({"type": kind, "severity": severity, "note": note}), keep_requeue)
    }

    /// [`JobCore::raise_inner`] with the exception's whole context: `type`, `severity` and `note`, and any keys
    /// beside them (`ranks` and `hosts` of the nodes a job lost).
    pub(super) fn raise_ctx(&mut self, now: f64, id: JobId, ctx: Value, keep_requeue: bool) -> bool {
        let kind = ctx["type"].as_str().unwrap_or("").to_string();
        let severity = ctx["severity"].as_u64().unwrap_or(0) as u32;
        let note = ctx["note"].as_str().unwrap_or("").to_string();
        let Some(job) = self.jobs.get_mut(&id) else { return false };
        if !job.state.is_active() {
            return false;
        }
        let exc = Exception { kind: kind.clone(), severity, note };
        if severity != 0 {
            job.post(now, "exception", ctx);
            self.actions.push_back(Action::Updated(id));
            return true;
        }
        if job.t_run.is_none() {
            // Never allocated: straight to INACTIVE. A pass is needed only if it held the reservation: a pending
            // job holds no resources, and the pass's verdict on every other job does not depend on it (so a storm
            // of cancels does not cost a pass each).
            if self.drop_pending(now, id, exc) {
                self.schedule(now);
            }
            return true;
        }
        job.post(now, "exception", ctx);
        self.actions.push_back(Action::Updated(id));
        if !keep_requeue {
            job.requeue_pending = None;
        }
        if job.fatal.is_none() {
            job.fatal = Some(exc);
        }
        if job.term_sent.is_none() {
            job.term_sent = Some(now);
            self.sched_dirty = true; // it is expected to end sooner (backfill.rs)
            let ranks: Vec<u32> = job.shells.values().filter(|s| !s.exited).map(|s| s.rank).collect();
            if !ranks.is_empty() {
                self.actions.push_back(Action::SignalShells { id, ranks, signal: crate::signal::SIGTERM });
            }
        }
        self.maybe_finish(now, id);
        self.rearm(id);
        true
    }

    /// A pending job (never allocated, or requeued) gets fatal exception `exc` and ends at once. True when it held
    /// the reservation (`backfill.rs`): then the caller runs a scheduling pass. Another pending job's removal
    /// changes no verdict of the last pass (a job deeper than `sched.backfill-depth` that it lets into the window
    /// is looked at by the next pass).
    fn drop_pending(&mut self, now: f64, id: JobId, exc: Exception) -> bool {
        let Some(job) = self.jobs.get_mut(&id) else { return false };
        job.post(now, "exception", json!({"type": exc.kind, "severity": exc.severity, "note": exc.note}));
        if job.fatal.is_none() {
            job.fatal = Some(exc);
        }
        job.post(now, "clean", json!({}));
        job.t_inactive = Some(now);
        retire_stdin(job);
        self.queue.remove(&id);
        self.became_inactive(id);
        self.actions.push_back(Action::Updated(id));
        let held = self.reservation.as_ref().is_some_and(|r| r.id == id);
        if held {
            self.sched_dirty = true;
        }
        held
    }

    /// Cancel job `id` on behalf of `userid` (`owner` = the instance owner may cancel any job).
    pub fn cancel(&mut self, now: f64, id: JobId, userid: u32, owner: bool, note: &str) -> Result<(), (u32, String)> {
        use crate::message::errno;
        let job = self.jobs.get(&id).ok_or((errno::ENOENT, format!("unknown job id {id}")))?;
        if !owner && job.userid != userid {
            return Err((errno::EPERM, format!("job {id} belongs to uid {}", job.userid)));
        }
        if !job.state.is_active() {
            return Err((errno::EINVAL, format!("job {id} is inactive")));
        }
        self.raise(now, id, "cancel", 0, note);
        Ok(())
    }

    /// Jobs pending (SCHED), running (holding resources) and held in all (INACTIVE ones too), without a scan.
    pub fn counts(&self) -> (usize, usize, usize) {
        (self.queue.len(), self.running.len(), self.jobs.len())
    }

    /// Pending jobs looked at by every scheduling pass so far (a counter: tests bound the work of one pass).
    pub fn examined(&self) -> u64 {
        self.examined
    }

    /// Jobs not yet INACTIVE, in id order.
    pub fn active(&self) -> impl Iterator<Item = &Job> {
        self.jobs.values().filter(|j| j.state.is_active())
    }
}

fn fmt_limit(secs: f64) -> String {
    std::time::Duration::try_from_secs_f64(secs)
        .map(crate::duration::format_duration)
        .unwrap_or_else(|_| format!("{secs}s"))
}

/// A job became INACTIVE: no task will read its standard input any more, so it is dropped (and closed).
fn retire_stdin(j: &mut Job) {
    j.stdin = Vec::new();
    j.stdin_bytes = 0;
    j.stdin_eof = true;
}

/// Drop a job's oldest output until at most `keep` bytes remain.
fn trim_output(j: &mut Job, keep: usize) {
    let before = j.output.len();
    while j.output_bytes > keep {
        match j.output.pop_front() {
            Some(l) => {
                j.output_bytes -= l.size();
                j.output_base += 1;
            }
            None => break,
        }
    }
    if j.output.len() < before {
        j.output.shrink_to_fit();
    }
}

/// RFC 34 task map for per-node task counts, block-wise ([`crate::taskmap::Taskmap::block`]).
pub fn taskmap(counts: &[u32]) -> Value {
    crate::taskmap::Taskmap::block(counts).to_value()
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_sched;

/// What [`JobCore::drain`] does with a rank that is drained already (`flux resource drain` and its `--force`,
/// `--update`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DrainMode {
    /// Refuse the whole request, naming the ranks drained already and their reasons (the default).
    #[default]
    Refuse,
    /// Drain them again: the new reason and time replace theirs.
    Force,
    /// Drain only the ranks not drained yet; the others keep their reasons.
    Update,
}
