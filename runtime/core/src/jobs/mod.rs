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
//! | `depend.rs` | RFC 26 dependencies (`after`, `afterok`... , `begin-time`, `singleton`): DEPEND until met |
//! | `urgency.rs` | RFC 21 urgency: queue order (urgency, then submission), holds (0) and releases |
//! | `requeue.rs` | a `--requeue` job that lost a node goes back to the queue (`sched.max-requeue`) |
//! | `shrink.rs` | a nested instance's lost rank leaves it for good (RFC 28) |
//! | `nested.rs` | critical-rank rules for the brokers of a nested instance |
//! | `timers.rs` | time limits and the warning before them (`--signal`), exit-timeout, SIGKILL escalation, from an ordered index of deadlines |
//! | `kills.rs` | a kill that could not reach its rank goes once the rank is reachable again |
//! | `unkillable.rs` | a shell whose node could not kill its processes: the node drained, the job ended anyway |
//! | `update.rs` | a job changed after submission (`vigil update`): time limit, name, urgency |
//! | `submit_key.rs` | a submission sent again with its key makes no second job |
//! | `credentials.rs` | a guest's munge credential makes one job (a replay is refused) |
//! | `submit.rs` | submission: validation, the refusals of [`SubmitError`], job ids |
//! | `exec.rs` | a job's start on its shells, their reports (spawned, task exit, shell exit), its finish |
//! | `ranks.rs` | resources: ranks online, drained, torpid, down; the critical-rank rules for a lost rank |
//! | `exceptions.rs` | RFC 21 exceptions: raise, cancel, instance shutdown |
//! | `output.rs` | task output (batches put back in order, bounds) and standard input |
//! | `job.rs` | the [`Job`] record and its read-only views (`vigil jobs`, lost nodes, result) |
//! | `journal.rs` | what rank 0 keeps in its state directory, and the restore at start-up |
//! | `reattach.rs` | a restored running job waits for its shells to come back |
//! | `purge.rs` | INACTIVE jobs purged by age or count |
//! | `history.rs` | every ended job's record, kept after its purge (`vigil history`), with its own retention |
//! | this file | the [`JobCore`] itself, the [`Action`]s it hands out, scheduling configuration |
//!
//! The cost of one event does not grow with the number of jobs queued or ever run: pending jobs are an ordered
//! set, running jobs are indexed by rank and by deadline, and counters replace scans over a job's shells.

mod backfill;
mod credentials;
pub mod depend;
mod exceptions;
mod exec;
mod fabric;
pub mod history;
mod job;
pub mod jobid;
pub mod journal;
mod kills;
mod nested;
mod output;
pub mod purge;
mod ranks;
mod reattach;
mod requeue;
pub mod sched;
mod shrink;
pub mod state;
mod submit;
pub mod submit_key;
mod timers;
mod unkillable;
pub mod update;
mod urgency;

use crate::eventlog::Event;
use crate::shellproto::ShellInput;
use sched::Pool;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

pub use crate::attrs::SchedPolicy;
pub use backfill::{Reservation, BACKFILL_DEPTH, HELD_REASON};
pub use exceptions::{Exception, SHUTDOWN_EXCEPTION};
pub use exec::taskmap;
pub use job::{Job, ShellState};
pub use jobid::JobId;
pub use output::{Batch, BatchOrder, StdinError, INACTIVE_OUTPUT_KEEP, INACTIVE_OUTPUT_TOTAL, OUTPUT_KEEP, STDIN_KEEP};
pub use ranks::DrainMode;
pub use requeue::DEFAULT_MAX_REQUEUE;
pub use state::JobState;
pub use submit::{SubmitError, SubmitRequest};
pub use submit_key::{SubmitKey, Submitted, SUBMIT_KEY_MAX};
pub use unkillable::{unkillable_reason, UNKILLABLE_EXCEPTION, UNKILLABLE_SEVERITY};
pub use urgency::{DEFAULT_URGENCY, MAX_URGENCY};

/// Default `exit-timeout`: after the first task exits, the others have this long (seconds).
pub const DEFAULT_EXIT_TIMEOUT: f64 = 30.0;
/// Default time between SIGTERM and SIGKILL when a job is cancelled or fails (seconds).
pub const DEFAULT_KILL_TIMEOUT: f64 = 5.0;

/// Default of `exec.kill-timeout-max` (seconds): the longest kill timeout a job may ask for with `-o
/// kill-timeout` (Slurm's KillWait, one setting for all, defaults to 30 s).
pub const DEFAULT_KILL_TIMEOUT_MAX: f64 = 60.0;

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
    /// Tell a surviving shell of job `id` (on broker `rank`) that shells were lost to a node failure: the job's
    /// leader shell always; every surviving shell of a job that asked for it (`-o on-node-loss=notify`), which
    /// raises the PMIx event for the lost processes to its tasks.
    NotifyShell {
        /// Job.
        id: JobId,
        /// Broker rank of the shell.
        rank: u32,
        /// Whether it is the leader shell (the lowest shell rank still running), which says the note on the job's
        /// standard error; the others only pass the loss on to their tasks.
        leader: bool,
        /// Shell ranks lost.
        lost_shells: Vec<u32>,
        /// The job's task ranks that ran on the lost nodes (empty for a batch or alloc job).
        tasks: Vec<u32>,
        /// The lost nodes' host names, one per lost shell, in the order of `lost_shells`.
        hosts: Vec<String>,
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
    /// `job-manager.history-age-limit`: seconds after its job ended that a history record goes (`history.rs`);
    /// `None`: never.
    pub history_age_limit: Option<f64>,
    /// `job-manager.history-num-limit`: most history records kept, the oldest removed first; `None`: no limit.
    pub history_num_limit: Option<usize>,
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
            history_age_limit: None,
            history_num_limit: None,
        }
    }
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
    /// SCHED jobs in priority order (urgency, then submission: ids grow with time), and those held (`urgency.rs`).
    queue: urgency::Queue,
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
    /// Full scheduling passes that walked the queue so far (`backfill.rs`; a look at a new job alone is not one).
    passes: u64,
    /// Jobs that ended (became INACTIVE) since this rank 0 started, by result (`Job::result`); jobs restored
    /// already ended are not counted.
    ended: BTreeMap<&'static str, u64>,
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
    /// Every ended job's record, purged ones too (`history.rs`).
    history: history::History,
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
    /// The munge credentials of the guests' jobs held (`credentials.rs`).
    credentials: credentials::CredentialIndex,
    /// Jobs in DEPEND, by the jobs and times they wait for (`depend.rs`).
    depend: depend::Waits,
}

impl JobCore {
    /// A job core for an instance started at `epoch` (s since the Unix epoch).
    pub fn new(epoch: f64) -> JobCore {
        JobCore {
            pool: Pool::default(),
            jobs: BTreeMap::new(),
            config: SchedConfig::default(),
            queue: Default::default(),
            running: BTreeSet::new(),
            by_rank: BTreeMap::new(),
            timers: BTreeSet::new(),
            reservation: None,
            beside: None,
            sched_dirty: false,
            examined_all: true,
            examined: 0,
            passes: 0,
            ended: BTreeMap::new(),
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
            history: Default::default(),
            saved: journal::Marks::default(),
            stopped: None,
            reattach_grace: 0.0,
            reattach: None,
            unreachable_kills: Default::default(),
            submit_keys: Default::default(),
            credentials: Default::default(),
            depend: Default::default(),
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

    /// Jobs pending (SCHED, held ones too), running (holding resources) and held in all (INACTIVE ones too),
    /// without a scan.
    pub fn counts(&self) -> (usize, usize, usize) {
        (self.queue.pending(), self.running.len(), self.jobs.len())
    }

    /// Pending jobs looked at by every scheduling pass so far (a counter: tests bound the work of one pass).
    pub fn examined(&self) -> u64 {
        self.examined
    }

    /// Full scheduling passes that walked a non-empty queue so far (a counter). The driver times the input that
    /// ran one by seeing this grow (`vigil_sched_pass_seconds`): the core itself reads no clock.
    pub fn passes(&self) -> u64 {
        self.passes
    }

    /// Jobs that ended since this rank 0 started, by result (`COMPLETED`, `FAILED`, `CANCELED`, `TIMEOUT`; a
    /// result not seen yet is absent): counters, unlike the INACTIVE jobs held, which purges lower.
    pub fn ended(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        self.ended.iter().map(|(r, n)| (*r, *n))
    }

    /// Job `id` just became INACTIVE: count it by its result.
    fn count_ended(&mut self, id: JobId) {
        if let Some(r) = self.jobs.get(&id).and_then(|j| j.result()) {
            *self.ended.entry(r).or_default() += 1;
        }
    }

    /// Jobs not yet INACTIVE, in id order.
    pub fn active(&self) -> impl Iterator<Item = &Job> {
        self.jobs.values().filter(|j| j.state.is_active())
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_depend;
#[cfg(test)]
mod tests_sched;
#[cfg(test)]
mod tests_signal;
#[cfg(test)]
mod tests_update;
#[cfg(test)]
mod tests_urgency;
