//! What rank 0 keeps across its own restart, as data: the journal of the job core (`-S statedir=DIR`).
//!
//! With a state directory the job core keeps a journal. After the broker has handed it inputs,
//! [`JobCore::journal`] gives a [`Journal`]: what changed since the last batch that was saved. The broker's driver
//! writes it in one transaction (`broker/store.rs`) and only then carries out what the core asked for, answering
//! the submissions it holds; [`JobCore::journal_saved`] then moves the watermarks. At start-up
//! [`JobCore::restore`] rebuilds the core from what was kept ([`Kept`]). No I/O here: [`Kept::apply`] is an
//! in-memory store with the same contract, for tests and the simulator.
//!
//! Kept per job: the jobspec as submitted, the submitting uid, the client's submission key if it sent one
//! (`submit_key.rs`: a submission sent again after a restart finds its job), the RFC 18 eventlog (the state, R, the exit status
//! and the first fatal exception are replayed from it), and its output: while it runs, every chunk as it comes,
//! up to what rank 0 holds in memory ([`super::OUTPUT_KEEP`] bytes, the oldest dropped first), with the number of
//! the next output batch due from each of its shells; once INACTIVE, the tail of it (at most
//! [`super::INACTIVE_OUTPUT_KEEP`] bytes). Kept for the instance: the RFC 44 resource eventlog (drains and their
//! reasons are replayed from it), the time its job ids count from, and the highest id given.
//!
//! What a restore makes of each job:
//! - INACTIVE: listed as before, with its output.
//! - Pending (NEW..SCHED): back in the queue, in id order, which is submission order.
//! - Holding resources (RUN, CLEANUP) and not finished: with [`JobCore::reattach_grace`] (`tbon.parent_grace`)
//!   its shells may have outlived rank 0, so it waits for them to come back (`reattach.rs`), with the output it
//!   printed so far; each shell's output goes on from the batch number kept for it, so that a batch taken before
//!   the restart and sent again (its acknowledgement was lost with rank 0) is not taken twice, and one sent but
//!   not kept (rank 0 died before writing it, and so before acknowledging it) is taken once. Without, it gets a
//!   fatal exception of type `restart`, its resources are released and it becomes INACTIVE. One that already
//!   has its `finish` event keeps its exit status and gets no exception: only its cleanup was cut short.
//!
//! Job ids go on from the highest id kept, counted from the epoch kept: an id is never given twice, even if the
//! clock went back meanwhile. Ranks that were drained are drained again, with the same reason, when they join.

mod restore;

pub use restore::{down_ranks, pending_orphans, Restored, REJOIN_HOLD};

use super::history::HistoryRecord;
use super::{BatchOrder, Job, JobCore, JobId, JobState, INACTIVE_OUTPUT_KEEP, OUTPUT_KEEP};
use crate::eventlog::Event;
use crate::idset::IdSet;
use crate::shellproto::OutputLine;
use serde_json::Value;
use std::collections::BTreeMap;

/// The exception type a job that held resources gets when rank 0 restarts (severity 0).
pub const RESTART_EXCEPTION: &str = "restart";

/// Its note.
pub const RESTART_NOTE: &str = "rank 0 restarted; the job's shells were lost with it";

/// One batch of changes for the store ([`JobCore::journal`]), saved whole or not at all.
#[derive(Clone, Debug, PartialEq)]
pub struct Journal {
    /// Jobs whose record changed, in id order.
    pub jobs: Vec<JobRecord>,
    /// Index in the resource eventlog of `resource_events[0]`.
    pub resource_first: usize,
    /// Resource eventlog events (RFC 44) appended since the last saved batch.
    pub resource_events: Vec<Event>,
    /// The highest job id given so far: ids after a restart are above it.
    pub last_id: JobId,
    /// Seconds since the Unix epoch that job ids count from (the instance's first start on this state directory).
    pub epoch: f64,
    /// INACTIVE jobs purged (`purge.rs`): their records go, after the upserts of this batch.
    pub purged: Vec<JobId>,
    /// Ranks whose node (hostname, cores, GPUs) joined for the first time or changed since the last saved batch.
    pub ranks: Vec<(u32, KeptRank)>,
    /// History records of jobs that ended since the last saved batch (`history.rs`), in the order they ended.
    pub history: Vec<std::sync::Arc<HistoryRecord>>,
    /// History records removed by the retention rules since the last saved batch: they go, after `history`.
    pub history_expired: Vec<JobId>,
    /// The job core's change count when the batch was taken: a job changed after that stays in the journal
    /// when this batch is saved ([`JobCore::journal_saved`]).
    pub tick: u64,
}

/// What changed in one job's record.
#[derive(Clone, Debug, PartialEq)]
pub struct JobRecord {
    /// The job.
    pub id: JobId,
    /// Submitting user.
    pub userid: u32,
    /// Its state after this batch (RFC 21).
    pub state: JobState,
    /// The jobspec as submitted (JSON text, shared with the job: not parsed or copied to be written): in the
    /// job's first batch only.
    pub jobspec: Option<std::sync::Arc<str>>,
    /// The client's submission key (`submit_key.rs`), if it sent one: in the job's first batch only, with the
    /// jobspec.
    pub submit_key: Option<std::sync::Arc<str>>,
    /// A guest's munge credential and the jobspec text it covers ([`Job::credential`](super::Job)), if it sent
    /// one: in the job's first batch only, with the jobspec.
    pub credential: Option<std::sync::Arc<crate::shellproto::ImpCredential>>,
    /// Index in the job's eventlog of `events[0]`.
    pub first_event: usize,
    /// Eventlog entries appended since the job's last saved batch.
    pub events: Vec<std::sync::Arc<Event>>,
    /// Whether its state, R and status are written (its first record, or they changed since the last saved
    /// one: R changes only at an `alloc` event, or with the state); without, `r` is `None` and the three are
    /// left as kept.
    pub row: bool,
    /// R (RFC 20) of its current allocation, if it has one (with `row`).
    pub r: Option<Value>,
    /// Its finish status (the largest task wait status), once known.
    pub status: Option<i32>,
    /// Its whole output kept at once (its tail, at most [`INACTIVE_OUTPUT_KEEP`] bytes, once INACTIVE), in place
    /// of what was kept of it before: the job core writes [`JobRecord::rows`] instead; a store written before
    /// those were kept had this.
    pub output: Option<Vec<OutputLine>>,
    /// What changed in its output kept.
    pub rows: OutputRows,
}

/// What changed in the output kept of a job ([`JobRecord::rows`]): its new chunks as they come, and what may go.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OutputRows {
    /// The output chunks the job got since its last saved batch, in order, to be kept after those kept before
    /// ([`KeptJob::put_output`]).
    pub new: Vec<OutputLine>,
    /// The absolute index of `new[0]` (chunks are counted from the job's first, dropped ones included).
    pub first: usize,
    /// The absolute index of the oldest chunk rank 0 still holds ([`super::OUTPUT_KEEP`] bytes while the job is
    /// not INACTIVE, [`INACTIVE_OUTPUT_KEEP`] once it is): those before it need not be kept any more.
    pub base: usize,
    /// Each shell's next output batch due (broker rank, batch number), for those that moved since the last saved
    /// batch ([`BatchOrder`]); for every shell when `new` is not empty and `base` is above 0 (the store may drop
    /// the older rows that carried them).
    pub batches: Vec<(u32, u64)>,
    /// Chunks before `base` go now (rank 0 dropped some since the last saved batch, or the job became INACTIVE).
    pub trim: bool,
}

/// A rank's node as it last joined: what a restarted rank 0 knows of it until it joins again (its resources
/// count in the instance, down; a submission that needs them is not refused meanwhile).
#[derive(Clone, Debug, PartialEq)]
pub struct KeptRank {
    /// The hostname its broker reported.
    pub hostname: String,
    /// Its cores (hwloc logical indexes).
    pub cores: IdSet,
    /// Its GPUs.
    pub gpus: IdSet,
}

/// Everything a state directory kept, read back at start-up for [`JobCore::restore`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Kept {
    /// Seconds since the Unix epoch that job ids count from.
    pub epoch: f64,
    /// The highest job id given.
    pub last_id: JobId,
    /// Every job kept, by id.
    pub jobs: BTreeMap<JobId, KeptJob>,
    /// The RFC 44 resource eventlog.
    pub resource_eventlog: Vec<Event>,
    /// Every rank that ever joined, as it last joined.
    pub ranks: BTreeMap<u32, KeptRank>,
    /// The job history's records (`history.rs`), in the order they were added.
    pub history: Vec<HistoryRecord>,
}

/// One job as kept.
#[derive(Clone, Debug, PartialEq)]
pub struct KeptJob {
    /// Submitting user.
    pub userid: u32,
    /// The jobspec as submitted.
    pub jobspec: Value,
    /// The client's submission key, if it sent one (`submit_key.rs`).
    pub submit_key: Option<String>,
    /// A guest's munge credential and the jobspec text it covers, if it sent one.
    pub credential: Option<crate::shellproto::ImpCredential>,
    /// Its RFC 18 eventlog.
    pub eventlog: Vec<Event>,
    /// R of its last allocation.
    pub r: Option<Value>,
    /// Its finish status.
    pub status: Option<i32>,
    /// Its state as last saved.
    pub state: JobState,
    /// Its output: once INACTIVE its tail; before, what was kept as it ran (at most [`OUTPUT_KEEP`] bytes).
    pub output: Vec<OutputLine>,
    /// The absolute index of `output[0]` before the job is INACTIVE (0 once it is).
    pub output_base: usize,
    /// Before the job is INACTIVE: each shell's next output batch due, by broker rank (none kept: not known).
    pub batches: BTreeMap<u32, u64>,
}

impl KeptJob {
    /// A job kept with no events and no output yet (its first batch).
    pub fn new(userid: u32, jobspec: Value, state: JobState) -> KeptJob {
        KeptJob {
            userid,
            jobspec,
            submit_key: None,
            credential: None,
            eventlog: Vec::new(),
            r: None,
            status: None,
            state,
            output: Vec::new(),
            output_base: 0,
            batches: BTreeMap::new(),
        }
    }

    /// Keep output chunks `lines`, the first at absolute index `first`, after those kept: any kept from `first` on
    /// are replaced (a batch saved again), and when `first` is past the last chunk kept (the chunks between were
    /// dropped before they could be kept) or before the oldest, those kept go. Bounded by
    /// [`KeptJob::bound_output`].
    pub fn put_output(&mut self, first: usize, lines: impl IntoIterator<Item = OutputLine>) {
        if first < self.output_base || first > self.output_base + self.output.len() {
            self.output.clear();
            self.output_base = first;
        } else {
            self.output.truncate(first - self.output_base);
        }
        self.output.extend(lines);
    }

    /// Drop the oldest chunks until at most [`OUTPUT_KEEP`] bytes remain ([`OutputLine::size`]), or
    /// [`INACTIVE_OUTPUT_KEEP`] once the job is INACTIVE: the chunks rank 0 held in memory, whatever the batches
    /// they were kept in.
    pub fn bound_output(&mut self) {
        let keep = if self.state == JobState::Inactive { INACTIVE_OUTPUT_KEEP } else { OUTPUT_KEEP };
        let mut bytes: usize = self.output.iter().map(OutputLine::size).sum();
        let mut drop = 0;
        while bytes > keep && drop < self.output.len() {
            bytes -= self.output[drop].size();
            drop += 1;
        }
        self.output.drain(..drop);
        self.output_base += drop;
    }
}

/// Why a batch does not apply to what is kept ([`Kept::apply`]): a bug in whoever produced it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApplyError {
    /// The first batch of a job must carry its jobspec.
    #[error("job {0}: first record without a jobspec")]
    NoJobspec(JobId),
    /// Events must follow on from those kept.
    #[error("job {id}: events from {first}, but {kept} are kept")]
    EventGap {
        /// The job.
        id: JobId,
        /// Index of the batch's first event.
        first: usize,
        /// Events kept.
        kept: usize,
    },
    /// Resource events must follow on from those kept.
    #[error("resource events from {first}, but {kept} are kept")]
    ResourceGap {
        /// Index of the batch's first event.
        first: usize,
        /// Events kept.
        kept: usize,
    },
}

impl Kept {
    /// Apply one batch, as a store does in one transaction (an in-memory store: tests, the simulator). Events
    /// already kept (a batch applied twice) are skipped; a gap is an error and changes nothing.
    pub fn apply(&mut self, b: &Journal) -> Result<(), ApplyError> {
        for r in &b.jobs {
            match self.jobs.get(&r.id) {
                None if r.jobspec.is_none() => return Err(ApplyError::NoJobspec(r.id)),
                Some(k) if r.first_event > k.eventlog.len() => {
                    return Err(ApplyError::EventGap { id: r.id, first: r.first_event, kept: k.eventlog.len() })
                }
                None if r.first_event > 0 => {
                    return Err(ApplyError::EventGap { id: r.id, first: r.first_event, kept: 0 })
                }
                _ => {}
            }
        }
        if b.resource_first > self.resource_eventlog.len() {
            return Err(ApplyError::ResourceGap { first: b.resource_first, kept: self.resource_eventlog.len() });
        }
        if self.epoch == 0.0 {
            self.epoch = b.epoch;
        }
        for r in &b.jobs {
            let k = self
                .jobs
                .entry(r.id)
                .or_insert_with(|| KeptJob::new(r.userid, parse_jobspec(r.jobspec.as_deref()), r.state));
            if let Some(key) = &r.submit_key {
                k.submit_key = Some(key.to_string());
            }
            if let Some(c) = &r.credential {
                k.credential = Some(crate::shellproto::ImpCredential::clone(c));
            }
            k.eventlog.truncate(r.first_event);
            k.eventlog.extend(r.events.iter().map(|e| Event::clone(e)));
            if r.row {
                k.state = r.state;
                k.r = r.r.clone();
                k.status = r.status;
            }
            if let Some(o) = &r.output {
                k.output = o.clone();
                k.output_base = 0;
                k.batches.clear();
            } else {
                if !r.rows.new.is_empty() {
                    k.put_output(r.rows.first, r.rows.new.iter().cloned());
                }
                k.bound_output();
                if r.state == JobState::Inactive {
                    k.batches.clear();
                } else {
                    k.batches.extend(r.rows.batches.iter().copied());
                }
            }
        }
        self.resource_eventlog.truncate(b.resource_first);
        self.resource_eventlog.extend(b.resource_events.iter().cloned());
        self.last_id = self.last_id.max(b.last_id);
        self.ranks.extend(b.ranks.iter().cloned());
        for id in &b.purged {
            self.jobs.remove(id);
        }
        for r in &b.history {
            // A batch applied twice adds nothing twice.
            if !self.history.iter().any(|k| k.id == r.id) {
                self.history.push(HistoryRecord::clone(r));
            }
        }
        self.history.retain(|k| !b.history_expired.contains(&k.id));
        Ok(())
    }
}

/// What the journal saved last: the watermarks of [`JobCore::journal`] beside those of each job.
#[derive(Clone, Debug, Default)]
pub(super) struct Marks {
    /// Resource eventlog entries saved.
    resource: usize,
    /// The last id saved.
    last_id: JobId,
    /// Ranks drained when rank 0 last stopped, with the reason and when: drained again as they join.
    pub(super) drains: BTreeMap<u32, (String, f64)>,
    /// Ranks whose node is to be written ([`Journal::ranks`]).
    pub(super) ranks_dirty: std::collections::BTreeSet<u32>,
    /// Ranks known from the store that have not joined since this rank 0 started: their first join is a new
    /// one for the jobs re-attached there (`reattach.rs`).
    pub(super) ranks_restored: std::collections::BTreeSet<u32>,
    /// Of those, the ranks that were up when rank 0 stopped (not recorded down): nothing is scheduled until they
    /// are back, or until [`Marks::rejoin_until`] ([`REJOIN_HOLD`]).
    pub(super) ranks_expected: std::collections::BTreeSet<u32>,
    /// When scheduling goes on without the ranks still expected (s since the epoch).
    pub(super) rejoin_until: f64,
}

/// A rank's node as the journal keeps it.
fn kept_rank(p: &super::sched::RankPool) -> KeptRank {
    KeptRank { hostname: p.hostname.clone(), cores: p.cores.clone(), gpus: p.gpus.clone() }
}

/// A jobspec's JSON text as kept, parsed (`Null` if absent or not JSON: the restore then refuses it by name).
fn parse_jobspec(text: Option<&str>) -> Value {
    text.and_then(|t| serde_json::from_str(t).ok()).unwrap_or(Value::Null)
}

impl JobCore {
    /// Keep a journal from now on (the instance has a state directory): every job changed from now on is in the
    /// next [`JobCore::journal`] batch, and so is every job the core already holds.
    pub fn enable_journal(&mut self) {
        let ids: Vec<JobId> = self.jobs.keys().copied().collect();
        self.actions.dirty.get_or_insert_with(BTreeMap::new);
        for id in ids {
            self.actions.mark(id);
        }
        self.saved.ranks_dirty.extend(self.pool.ranks.keys().copied());
    }

    /// Whether a journal is kept.
    pub fn journaling(&self) -> bool {
        self.actions.dirty.is_some()
    }

    /// What changed since the last batch saved ([`JobCore::journal_saved`]); `None` when nothing did or no
    /// journal is kept. Taking it changes nothing: a batch that could not be saved is in the next one again.
    pub fn journal(&self) -> Option<Journal> {
        if !self.journal_pending() {
            return None;
        }
        let dirty = self.actions.dirty.as_ref()?;
        let last_id = self.last_id();
        let jobs = dirty
            .keys()
            .filter_map(|id| self.jobs.get(id))
            .map(|j| {
                let running = j.state != JobState::Inactive;
                // Once INACTIVE, its batch writes what was not written yet and trims the rows to its tail.
                let ending = !running && !j.saved_output;
                let first = j.saved_chunks.max(j.output_base);
                let new: Vec<OutputLine> = if running || ending {
                    j.output.iter().skip(first - j.output_base).cloned().collect()
                } else {
                    Vec::new()
                };
                // Once rank 0 drops chunks, the store drops the rows before them, with the batch numbers they
                // carried: a write of new chunks then carries every shell's.
                let all = running && j.output_base > 0 && !new.is_empty();
                let trim = j.output_base > 0 && (!new.is_empty() || ending);
                let events = &j.eventlog[j.saved_events.min(j.eventlog.len())..];
                let row = j.saved_row != Some((j.state, j.status)) || events.iter().any(|e| e.name == "alloc");
                JobRecord {
                    id: j.id,
                    userid: j.userid,
                    state: j.state,
                    jobspec: (j.saved_events == 0).then(|| j.jobspec_text.clone()),
                    submit_key: (j.saved_events == 0)
                        .then(|| j.submit_key.as_ref().map(super::SubmitKey::shared))
                        .flatten(),
                    credential: (j.saved_events == 0).then(|| j.credential.clone()).flatten(),
                    first_event: j.saved_events,
                    events: events.to_vec(),
                    row,
                    r: if row { j.r.as_ref().and_then(|r| serde_json::to_value(r).ok()) } else { None },
                    status: j.status,
                    output: None,
                    rows: OutputRows {
                        batches: if running { moved_batches(j, all) } else { Vec::new() },
                        new,
                        first,
                        base: j.output_base,
                        trim,
                    },
                }
            })
            .collect();
        Some(Journal {
            jobs,
            resource_first: self.saved.resource,
            resource_events: self.resource_eventlog[self.saved.resource.min(self.resource_eventlog.len())..].to_vec(),
            last_id,
            epoch: self.epoch,
            purged: self.purged.clone(),
            ranks: self
                .saved
                .ranks_dirty
                .iter()
                .filter_map(|r| self.pool.ranks.get(r).map(|p| (*r, kept_rank(p))))
                .collect(),
            history: self.history.added.clone(),
            history_expired: self.history.expired.clone(),
            tick: self.actions.tick,
        })
    }

    /// A mark of what the journal covers now: equal marks, nothing changed between them (what a batch taken at
    /// the first holds is all there is to write).
    pub fn change_mark(&self) -> [u64; 4] {
        // Purges and expired history records only ever grow between saves: their sum moves with either.
        let gone = self.purged.len() + self.history.expired.len();
        [self.actions.tick, self.resource_eventlog.len() as u64, self.last_id().0, gone as u64]
    }

    /// Whether [`JobCore::journal`] has a batch to give, without making it.
    pub fn journal_pending(&self) -> bool {
        self.actions.dirty.as_ref().is_some_and(|d| {
            !d.is_empty()
                || !self.purged.is_empty()
                || self.saved.resource != self.resource_eventlog.len()
                || self.saved.last_id != self.last_id()
                || !self.saved.ranks_dirty.is_empty()
                || !self.history.added.is_empty()
                || !self.history.expired.is_empty()
        })
    }

    /// Batch `b` (from [`JobCore::journal`]) is written: move the watermarks. The core may have gone on since
    /// it was taken (the driver writes on another thread, one batch at a time): what changed since is in the next
    /// batch.
    pub fn journal_saved(&mut self, b: &Journal) {
        for r in &b.jobs {
            if let Some(j) = self.jobs.get_mut(&r.id) {
                j.saved_events = r.first_event + r.events.len();
                if r.row {
                    j.saved_row = Some((r.state, r.status));
                }
                j.saved_output |= r.state == JobState::Inactive;
                j.saved_chunks = j.saved_chunks.max(r.rows.first + r.rows.new.len());
                j.saved_marks.extend(r.rows.batches.iter().copied());
            }
            if let Some(d) = self.actions.dirty.as_mut() {
                // Changed again since the batch was taken (the write ran while the core went on): kept marked.
                if d.get(&r.id).is_some_and(|t| *t <= b.tick) {
                    d.remove(&r.id);
                }
            }
        }
        self.saved.resource = b.resource_first + b.resource_events.len();
        self.saved.last_id = b.last_id;
        for (r, k) in &b.ranks {
            // Changed again since the batch was taken: kept for the next one.
            if self.pool.ranks.get(r).is_none_or(|p| kept_rank(p) == *k) {
                self.saved.ranks_dirty.remove(r);
            }
        }
        // Purges are only ever appended: the batch held the first ones.
        self.purged.drain(..b.purged.len().min(self.purged.len()));
        // History records too are only ever appended (one added and expired before a save is in neither).
        let saved: std::collections::HashSet<JobId> = b.history.iter().map(|r| r.id).collect();
        self.history.added.retain(|r| !saved.contains(&r.id));
        self.history.expired.retain(|id| !b.history_expired.contains(id));
    }

    /// The highest id given so far (or the floor below the next one).
    pub(super) fn last_id(&self) -> JobId {
        JobId::from_parts(self.last_ms, self.seq)
    }
}

/// The shells of running job `j` whose next output batch due moved since the last saved batch (none saved counts
/// as 0, so that a job whose shells sent nothing yet writes nothing), or with `all` every shell whose is known:
/// broker rank and batch number.
fn moved_batches(j: &Job, all: bool) -> Vec<(u32, u64)> {
    j.shells
        .values()
        .filter_map(|sh| {
            let due = sh.batches.due()?;
            (all || due != j.saved_marks.get(&sh.rank).copied().unwrap_or(0)).then_some((sh.rank, due))
        })
        .collect()
}

/// The order of the output batches of the shell on broker `rank` of a job re-attached after a restart: from the
/// number kept for it, else from the first batch that comes ([`BatchOrder::resume`]).
pub(super) fn kept_order(j: &Job, rank: u32) -> BatchOrder {
    j.saved_marks.get(&rank).map_or_else(BatchOrder::resume, |n| BatchOrder::at(*n))
}

/// The events of a job's current run: those after its last `requeue` (a requeued job's earlier run ended with its
/// own `release` and `free`, which say nothing of the run that holds resources now).
pub(super) fn this_run(eventlog: &[std::sync::Arc<Event>]) -> &[std::sync::Arc<Event>] {
    let from = eventlog.iter().rposition(|e| e.name == "requeue").map_or(0, |i| i + 1);
    &eventlog[from..]
}

#[cfg(test)]
mod tests {
    use super::super::tests::{actions, cmd, core, exit_shell, spawns, spec, T0};
    use super::*;
    use crate::jobs::SubmitRequest;

    /// A job's eventlog as the store keeps it.
    fn plain(log: &[std::sync::Arc<Event>]) -> Vec<Event> {
        log.iter().map(|e| Event::clone(e)).collect()
    }

    /// Save every batch the core has into `kept`.
    fn save(c: &mut JobCore, kept: &mut Kept) {
        if let Some(b) = c.journal() {
            kept.apply(&b).expect("applies");
            c.journal_saved(&b);
        }
        assert_eq!(c.journal(), None, "nothing left after a save");
    }

    /// A fresh core (as after a restart: no rank joined yet) restored from `kept`, and its ranks joined.
    fn restart(kept: &Kept, t: f64) -> (JobCore, Restored) {
        let mut c = JobCore::new(t);
        let r = c.restore(t, kept.clone());
        for rank in 0..2 {
            c.rank_online(t, rank, &format!("node{rank}"), (0..2).collect(), IdSet::new(), ("live".into(), None));
        }
        (c, r)
    }

    /// A restarted rank 0 knows every rank that ever joined, down until it joins again: a submission that needs
    /// them is accepted and waits (it was refused as needing more nodes than the instance has), and the job runs
    /// once they are back. A rank that comes back as it was is not written again; one with another node is.
    #[test]
    fn ranks_that_joined_before_a_restart_count_down_until_they_are_back() {
        let mut c = core(3, 2, 0);
        c.enable_journal();
        let mut kept = Kept::default();
        save(&mut c, &mut kept);
        assert_eq!(kept.ranks.keys().copied().collect::<Vec<_>>(), [0, 1, 2]);
        assert_eq!(kept.ranks[&2], KeptRank { hostname: "node2".into(), cores: (0..2).collect(), gpus: IdSet::new() });
        let mut c2 = JobCore::new(T0 + 10.0);
        c2.restore(T0 + 10.0, kept.clone());
        assert!(c2.pool.ranks.len() == 3 && c2.pool.ranks.values().all(|p| !p.up), "known, down");
        let id = c2
            .submit(T0 + 11.0, SubmitRequest::new(&spec(cmd().nnodes(3).ntasks(3)), 1000))
            .expect("accepted while its ranks are away")
            .id;
        assert!(spawns(&actions(&mut c2)).is_empty(), "nothing runs on ranks not back");
        for rank in 0..3 {
            c2.rank_online(
                T0 + 12.0,
                rank,
                &format!("node{rank}"),
                (0..2).collect(),
                IdSet::new(),
                ("live".into(), None),
            );
        }
        let started: Vec<(JobId, u32)> = spawns(&actions(&mut c2)).into_iter().map(|s| (s.0, s.1)).collect();
        assert_eq!(started, [(id, 0), (id, 1), (id, 2)], "one shell on each rank, once they are back");
        assert!(c2.journal().expect("the job's events").ranks.is_empty(), "ranks back as they were: not written");
        save(&mut c2, &mut kept);
        c2.rank_online(T0 + 13.0, 1, "node1", (0..4).collect(), IdSet::new(), ("live".into(), None));
        let b = c2.journal().expect("a batch");
        assert_eq!(b.ranks.iter().map(|(r, k)| (*r, k.cores.len())).collect::<Vec<_>>(), [(1, 4)]);
    }

    /// After a restart the queue waits for the ranks that were up (not for those recorded down): a later 1-node
    /// job does not start on the first rank back ahead of an earlier 3-node one; once they are all back the
    /// queue goes in order. A rank that does not come back holds it up for [`REJOIN_HOLD`] at most.
    #[test]
    fn the_queue_waits_for_the_ranks_expected_back_after_a_restart() {
        let mut c = core(4, 2, 0);
        c.enable_journal();
        c.ranks_down(T0 + 1.0, &IdSet::parse("3").unwrap(), "lost", "3 probes missed");
        let mut kept = Kept::default();
        save(&mut c, &mut kept);
        let online = |c: &mut JobCore, t: f64, rank: u32| {
            c.rank_online(t, rank, &format!("node{rank}"), (0..2).collect(), IdSet::new(), ("live".into(), None))
        };
        for back_at in [Some(T0 + 12.0), None] {
            let mut c2 = JobCore::new(T0 + 10.0);
            c2.restore(T0 + 10.0, kept.clone());
            let big = c2.submit(T0 + 10.5, SubmitRequest::new(&spec(cmd().nnodes(3).ntasks(3)), 1000)).unwrap().id;
            let small = c2.submit(T0 + 10.6, SubmitRequest::new(&spec(cmd().nnodes(1).ntasks(1)), 1000)).unwrap().id;
            online(&mut c2, T0 + 11.0, 0);
            online(&mut c2, T0 + 11.0, 1);
            assert!(spawns(&actions(&mut c2)).is_empty(), "started on the first ranks back");
            let why = c2.pending_reason(small).unwrap_or_default();
            assert!(why.contains("waiting for rank(s) 2 to come back"), "{why}");
            match back_at {
                Some(t) => {
                    online(&mut c2, t, 2);
                    let order: Vec<JobId> = spawns(&actions(&mut c2)).into_iter().map(|s| s.0).collect();
                    assert_eq!(order.first(), Some(&big), "in order: {order:?}");
                    assert!(order.contains(&small));
                }
                None => {
                    // Rank 3 was lost before the restart: not waited for. Rank 2 never comes back.
                    let due = c2.next_deadline().expect("the hold's end");
                    assert!((due - (T0 + 10.0 + REJOIN_HOLD)).abs() < 1e-6, "{due}");
                    c2.handle_timeout(due);
                    let started: Vec<JobId> = spawns(&actions(&mut c2)).into_iter().map(|s| s.0).collect();
                    assert_eq!(started, [small], "the 3-node job cannot fit the 2 ranks back; the other runs");
                }
            }
        }
    }

    /// A job re-attached after a restart holds its resources on a rank known from the store once that rank is
    /// back, as on a rank that had not joined at all: nothing else is placed on them meanwhile.
    #[test]
    fn a_reattached_jobs_resources_are_held_on_a_rank_known_from_the_store() {
        let mut c = core(2, 1, 0);
        c.enable_journal();
        let mut kept = Kept::default();
        let long = c.submit(T0 + 1.0, SubmitRequest::new(&spec(cmd().nnodes(1).ntasks(1)), 1000)).unwrap().id;
        let (_, rank, _) = spawns(&actions(&mut c))[0];
        c.shell_spawned(T0 + 1.5, long, rank, Ok(()));
        save(&mut c, &mut kept);
        let mut c2 = JobCore::new(T0 + 10.0);
        c2.reattach_grace = 60.0;
        let r = c2.restore(T0 + 10.0, kept.clone());
        assert_eq!(r.reattached, [long]);
        for rr in 0..2 {
            c2.rank_online(T0 + 11.0, rr, &format!("node{rr}"), (0..1).collect(), IdSet::new(), ("live".into(), None));
        }
        assert_eq!(c2.pool.ranks[&rank].alloc_cores.len(), 1, "its core is held again");
        let other = c2.submit(T0 + 12.0, SubmitRequest::new(&spec(cmd().nnodes(1).ntasks(1)), 1000)).unwrap().id;
        let placed: Vec<(JobId, u32)> = spawns(&actions(&mut c2)).into_iter().map(|s| (s.0, s.1)).collect();
        assert_eq!(placed, [(other, 1 - rank)], "placed on the other rank, not on the held core");
    }

    #[test]
    fn a_restart_lists_inactive_jobs_requeues_pending_ones_ends_running_ones_and_never_reuses_an_id() {
        let mut c = core(2, 2, 0);
        c.enable_journal();
        let mut kept = Kept::default();
        // One job completes, one fails, one runs on every core, two wait behind it.
        let done = c.submit(T0 + 1.0, SubmitRequest::new(&spec(cmd().ntasks(1)), 1000)).unwrap().id;
        let failed = c.submit(T0 + 1.0, SubmitRequest::new(&spec(cmd().ntasks(1)), 1000)).unwrap().id;
        for (id, rank, _) in spawns(&actions(&mut c)) {
            c.shell_spawned(T0 + 1.5, id, rank, Ok(()));
            exit_shell(&mut c, T0 + 2.0, id, rank, if id == done { 0 } else { 256 * 3 });
        }
        save(&mut c, &mut kept);
        let long = c.submit(T0 + 3.0, SubmitRequest::new(&spec(cmd().nnodes(2).ntasks(4)), 1000)).unwrap().id;
        let p1 = c.submit(T0 + 4.0, SubmitRequest::new(&spec(cmd().ntasks(1)), 1001)).unwrap().id;
        let p2 = c.submit(T0 + 4.0, SubmitRequest::new(&spec(cmd().ntasks(1)), 1001)).unwrap().id;
        c.drain(T0 + 4.5, &IdSet::parse("1").unwrap(), "bad fan", crate::jobs::DrainMode::Refuse).unwrap();
        save(&mut c, &mut kept);
        // Not saved: lost with rank 0, like a submit that was never answered.
        let unsaved = c.submit(T0 + 5.0, SubmitRequest::new(&spec(cmd().ntasks(1)), 1000)).unwrap().id;
        assert_eq!(c.jobs[&long].state, JobState::Run);
        assert_eq!(c.jobs[&p2].state, JobState::Sched);

        let (mut c2, r) = restart(&kept, T0 + 100.0);
        assert_eq!((r.inactive, r.pending, r.ended.clone(), r.invalid.clone()), (2, 2, vec![long], vec![]));
        assert!(!c2.jobs.contains_key(&unsaved));
        assert_eq!(c2.jobs[&done].result(), Some("COMPLETED"));
        assert_eq!((c2.jobs[&failed].result(), c2.jobs[&failed].exit_code()), (Some("FAILED"), Some(3)));
        assert_eq!(c2.jobs[&done].eventlog, c.jobs[&done].eventlog, "an inactive job's eventlog as it was");
        let l = &c2.jobs[&long];
        assert_eq!((l.state, l.result()), (JobState::Inactive, Some("FAILED")));
        assert_eq!(l.fatal.as_ref().map(|e| e.kind.as_str()), Some(RESTART_EXCEPTION));
        let tail: Vec<&str> = l.eventlog.iter().rev().take(4).map(|e| e.name.as_str()).collect();
        assert_eq!(tail, ["clean", "free", "release", "exception"]);
        assert_eq!(l.r, c.jobs[&long].r, "R replayed from the alloc event");
        // Rank 1 is drained again, with its reason: p1 runs on rank 0, p2 waits for it.
        assert_eq!(c2.pool.ranks[&1].drained.as_deref(), Some("bad fan"));
        let started: Vec<JobId> = spawns(&actions(&mut c2)).into_iter().map(|s| s.0).collect();
        assert_eq!(started, vec![p1, p2], "pending jobs start in their order");
        assert!(c2.jobs[&p1].alloc.iter().all(|a| a.rank == 0));
        // New ids are above every kept one, even with a clock that went back.
        let (mut c3, _) = restart(&kept, T0 - 50.0);
        let new = c3.submit(T0 - 49.0, SubmitRequest::new(&spec(cmd().ntasks(1)), 1000)).unwrap().id;
        assert!(new > p2 && new > long, "{new:?} after {p2:?}");
        let new2 = c2.submit(T0 + 101.0, SubmitRequest::new(&spec(cmd().ntasks(1)), 1000)).unwrap().id;
        assert!(new2 > p2);
        // The restore's own events are journaled, and a second restart sees them.
        save(&mut c2, &mut kept);
        let (c4, r4) = restart(&kept, T0 + 200.0);
        assert_eq!(c4.jobs[&long].eventlog, c2.jobs[&long].eventlog);
        // p1 and p2 were running this time; `long` is not ended twice; new2 was pending and now runs.
        assert_eq!((r4.inactive, r4.pending, r4.ended.clone()), (3, 1, vec![p1, p2]));
        assert_eq!(c4.jobs[&new2].state, JobState::Run);
        assert_eq!(c4.resource_eventlog.iter().filter(|e| e.name == "restart").count(), 2);
    }

    #[test]
    fn a_batch_that_was_not_saved_is_in_the_next_one() {
        let mut c = core(1, 2, 0);
        c.enable_journal();
        let a = c.submit(T0 + 1.0, SubmitRequest::new(&spec(cmd().ntasks(1)), 1000)).unwrap().id;
        let first = c.journal().expect("a batch");
        assert_eq!(first.jobs.len(), 1);
        assert!(first.jobs[0].jobspec.is_some());
        // Not saved (the store failed): the next batch still carries the job from its first event.
        let b = c.submit(T0 + 2.0, SubmitRequest::new(&spec(cmd().ntasks(1)), 1000)).unwrap().id;
        let second = c.journal().expect("a batch");
        assert_eq!(second.jobs.iter().map(|r| (r.id, r.first_event)).collect::<Vec<_>>(), vec![(a, 0), (b, 0)]);
        let mut kept = Kept::default();
        kept.apply(&second).unwrap();
        c.journal_saved(&second);
        // After a save only what changed is in a batch, from where it stopped.
        for (id, rank, _) in spawns(&actions(&mut c)) {
            c.shell_spawned(T0 + 3.0, id, rank, Ok(()));
        }
        let third = c.journal().expect("a batch");
        assert!(third.jobs.iter().all(|r| r.jobspec.is_none() && r.first_event > 0));
        kept.apply(&third).unwrap();
        assert_eq!(kept.apply(&third), Ok(()), "a batch applied twice changes nothing");
        assert_eq!(kept.jobs[&a].eventlog, plain(&c.jobs[&a].eventlog));
        assert_eq!(
            kept.apply(&Journal { jobs: vec![], resource_first: 99, ..third.clone() }),
            Err(ApplyError::ResourceGap { first: 99, kept: kept.resource_eventlog.len() })
        );
    }

    /// The driver writes a batch on another thread while the core goes on: what changed meanwhile, in a job of
    /// the batch or another, is in the next batch once that one is saved, and nothing is written twice.
    #[test]
    fn what_changed_while_a_batch_was_written_is_in_the_next_one() {
        let mut c = core(1, 2, 0);
        c.enable_journal();
        let a = c.submit(T0 + 1.0, SubmitRequest::new(&spec(cmd().ntasks(1)), 1000)).unwrap().id;
        let taken = c.journal().expect("a batch");
        assert!(c.journal_pending());
        // While it is written: `a` starts (new events) and `b` is submitted.
        for (id, rank, _) in spawns(&actions(&mut c)) {
            c.shell_spawned(T0 + 2.0, id, rank, Ok(()));
        }
        let b = c.submit(T0 + 2.5, SubmitRequest::new(&spec(cmd().ntasks(1)), 1000)).unwrap().id;
        let mut kept = Kept::default();
        kept.apply(&taken).unwrap();
        c.journal_saved(&taken);
        assert!(c.journal_pending(), "a and b changed after the batch was taken");
        let next = c.journal().expect("the changes made during the write");
        let firsts: Vec<(JobId, usize)> = next.jobs.iter().map(|r| (r.id, r.first_event)).collect();
        assert_eq!(firsts, vec![(a, taken.jobs[0].events.len()), (b, 0)], "from where the written batch stopped");
        kept.apply(&next).unwrap();
        c.journal_saved(&next);
        assert!(!c.journal_pending() && c.journal().is_none());
        assert_eq!(kept.jobs[&a].eventlog, plain(&c.jobs[&a].eventlog));
        assert_eq!(kept.jobs[&b].eventlog, plain(&c.jobs[&b].eventlog));
    }

    /// Output kept as a job runs: batches follow on by their absolute index, one saved again replaces itself, a
    /// gap (chunks dropped before they could be kept) starts afresh, and the whole is bounded as rank 0 holds it.
    #[test]
    fn output_kept_as_a_job_runs_follows_on_and_is_bounded_as_in_memory() {
        let chunk = |i: usize| OutputLine::text(0, "stdout", format!("{i:06}"));
        let chunks = |r: std::ops::Range<usize>| r.map(chunk).collect::<Vec<_>>();
        let mut k = KeptJob::new(1000, Value::Null, JobState::Run);
        k.put_output(0, chunks(0..3));
        k.put_output(3, chunks(3..5));
        k.put_output(3, chunks(3..6)); // the last batch again, with more: not twice
        assert_eq!((k.output_base, k.output.clone()), (0, chunks(0..6)));
        k.put_output(9, chunks(9..10)); // 6-8 never kept
        assert_eq!((k.output_base, k.output.clone()), (9, chunks(9..10)));
        // Bounded by bytes, the oldest dropped first, as `trim_output` does as chunks come.
        let per = chunk(0).size();
        let n = OUTPUT_KEEP / per + 10;
        k.put_output(10, chunks(10..10 + n));
        k.bound_output();
        let bytes: usize = k.output.iter().map(OutputLine::size).sum();
        assert!(bytes <= OUTPUT_KEEP && bytes + per > OUTPUT_KEEP, "{bytes}");
        assert_eq!(k.output_base + k.output.len(), 10 + n, "the newest kept");
        assert_eq!(k.output[0], chunk(k.output_base), "indexes still absolute");
    }

    proptest::proptest! {
        /// Whatever happens, saving every batch and restoring gives back every saved job with the same
        /// eventlog (plus what the restore adds to jobs that held resources), and ids stay unique.
        #[test]
        fn every_saved_job_comes_back_once(steps in proptest::collection::vec(0u8..5, 1..40)) {
            let mut c = core(2, 2, 0);
            c.enable_journal();
            let mut kept = Kept::default();
            let mut t = T0;
            for s in steps {
                t += 1.0;
                match s {
                    0 | 1 => { let _ = c.submit(t, SubmitRequest::new(&spec(cmd().ntasks(1 + u32::from(s))), 1000)); }
                    2 => for (id, rank, _) in spawns(&actions(&mut c)) { c.shell_spawned(t, id, rank, Ok(())); }
                    3 => {
                        let running: Vec<(JobId, u32)> = c.jobs.values().filter(|j| j.state == JobState::Run)
                            .flat_map(|j| j.shells.keys().map(move |r| (j.id, *r))).collect();
                        for (id, rank) in running { exit_shell(&mut c, t, id, rank, 0); }
                    }
                    _ => save(&mut c, &mut kept),
                }
            }
            save(&mut c, &mut kept);
            let (c2, _) = restart(&kept, t + 10.0);
            proptest::prop_assert_eq!(c2.jobs.len(), c.jobs.len());
            for (id, j) in &c.jobs {
                let j2 = &c2.jobs[id];
                proptest::prop_assert_eq!(&j2.eventlog[..j.eventlog.len()], &j.eventlog[..]);
                if j.state == JobState::Inactive {
                    proptest::prop_assert_eq!(j2.eventlog.len(), j.eventlog.len());
                    proptest::prop_assert_eq!(j2.result(), j.result());
                }
            }
        }
    }
}
