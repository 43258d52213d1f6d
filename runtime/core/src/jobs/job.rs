//! One job: the [`Job`] record the rules keep, its shells ([`ShellState`]), and its read-only views (`vigil jobs
//! --json`'s [`Job::info`], the nodes it lost, its result and exit code).

use super::sched::RankAlloc;
use super::{journal, BatchOrder, Exception, JobId, JobState, SubmitKey, DEFAULT_EXIT_TIMEOUT};
use crate::eventlog::Event;
use crate::idset::IdSet;
use crate::jobspec::JobRequest;
use crate::r::Rv1;
use crate::shellproto::OutputLine;
use serde_json::{json, Value};
use std::collections::{BTreeMap, VecDeque};

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
    /// When its tasks ended, as its node saw it (wall-clock seconds since the Unix epoch,
    /// [`ShellExit::ended`](crate::shellproto::ShellExit::ended)).
    #[serde(skip)]
    pub ended: Option<f64>,
    /// This shell's output batches, put back in the order it numbered them.
    #[serde(skip)]
    pub batches: BatchOrder,
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
    /// A guest's munge credential and the jobspec text it covers, as submitted (not changed by `vigil update`):
    /// each shell's input carries it, for `vigil-imp` (docs/security.md). `None`: none was sent.
    pub credential: Option<std::sync::Arc<crate::shellproto::ImpCredential>>,
    /// State (RFC 21).
    pub state: JobState,
    /// The jobspec as submitted, as compact JSON text ([`Job::jobspec`] parses it): a parsed `Value` of even a
    /// small jobspec holds a few KiB of maps, for every queued job, while the scheduler reads only `req`.
    pub(super) jobspec_text: std::sync::Arc<str>,
    /// `attributes.system.job.name` of the jobspec, if it has one (`vigil jobs` shows it).
    pub(super) name: Option<Box<str>>,
    /// Validated request.
    pub req: JobRequest,
    /// RFC 18 eventlog.
    pub eventlog: Vec<std::sync::Arc<Event>>,
    /// Task output kept for watchers, in arrival order; at most [`OUTPUT_KEEP`](super::OUTPUT_KEEP) bytes, oldest
    /// dropped first.
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
    pub(super) exit_clock: Option<f64>,
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
    /// INACTIVE, at most [`STDIN_KEEP`](super::STDIN_KEEP) bytes of input.
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
    pub(super) requeue_pending: Option<String>,
    /// Ranks of the allocation already released early (RFC 32 partial release of lost nodes).
    pub(super) released: IdSet,
    /// Shells confirmed started, and shells gone (counters over `shells`, so no event scans them).
    pub(super) nspawned: usize,
    pub(super) nexited: usize,
    /// The deadline under which the job is filed in [`JobCore`]'s timer index (`timers.rs`).
    pub(super) armed: Option<f64>,
    /// Events of `eventlog` already kept in the state directory, and whether its INACTIVE output is (`journal.rs`).
    pub(super) saved_events: usize,
    pub(super) saved_output: bool,
    /// While it runs: output chunks kept in the state directory (the absolute index after the last one), and the
    /// next batch due from each shell as kept there (by broker rank; none kept is 0), so that a restarted rank 0
    /// goes on with both (`journal.rs`).
    pub(super) saved_chunks: usize,
    pub(super) saved_marks: BTreeMap<u32, u64>,
    /// Its state and exit status as its row in the state directory last had them (`journal.rs`): the row is
    /// written again only when they change (or R does, at an `alloc`).
    pub(super) saved_row: Option<(JobState, Option<i32>)>,
    /// Its RFC 21 urgency, 0 (held) to 31 (expedite); its priority is the same (`urgency.rs`).
    pub urgency: u32,
    /// The RFC 26 dependencies it still waits for, while in DEPEND (`depend.rs`).
    pub(super) deps: Vec<super::depend::Dependency>,
    /// Its warning signal before the time limit (`req.signal`, `--signal`) was sent in this run (`timers.rs`).
    pub(super) warned: bool,
}

impl Job {
    /// A job in state NEW with no events yet, submitted at `now` by `userid` (its exit-timeout from the
    /// request's shell options).
    pub(super) fn new(id: JobId, userid: u32, jobspec: &Value, req: JobRequest, now: f64) -> Job {
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
            credential: None,
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
            deps: Vec::new(),
            urgency: super::DEFAULT_URGENCY,
            warned: false,
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

    /// Its name as `vigil jobs` shows it: `attributes.system.job.name`, else its command's basename.
    pub fn display_name(&self) -> &str {
        self.name
            .as_deref()
            .or_else(|| self.req.command.first().map(|c| c.rsplit('/').next().unwrap_or(c)))
            .unwrap_or("")
    }

    /// The jobspec as submitted.
    pub fn jobspec(&self) -> Value {
        serde_json::from_str(&self.jobspec_text).unwrap_or(Value::Null)
    }

    /// `attributes.system.files` of the jobspec (files the shell writes before the tasks start), if any.
    pub(super) fn files(&self) -> serde_json::Map<String, Value> {
        // A jobspec without the key anywhere has none: no parse at each start of an ordinary job.
        if !self.jobspec_text.contains("\"files\"") {
            return serde_json::Map::new();
        }
        self.jobspec().pointer("/attributes/system/files").and_then(Value::as_object).cloned().unwrap_or_default()
    }

    /// What the job still holds: its allocation without the ranks released early.
    pub(super) fn held(&self) -> Vec<RankAlloc> {
        self.alloc.iter().filter(|a| !self.released.contains(a.rank)).cloned().collect()
    }

    /// The job was re-attached after a restart of rank 0 in its current run (a `restart` event since its last
    /// `requeue`, `reattach.rs`).
    pub(super) fn reattached(&self) -> bool {
        journal::this_run(&self.eventlog).iter().any(|e| e.name == "restart")
    }

    /// When its last shell ended (the latest [`ShellState::ended`]), no earlier than the job started; `None`
    /// when a shell did not say.
    pub(super) fn shells_ended(&self) -> Option<f64> {
        let mut last = self.t_run?;
        for s in self.shells.values() {
            last = last.max(s.ended?);
        }
        Some(last)
    }

    pub(super) fn post(&mut self, now: f64, name: &str, context: Value) {
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
            "urgency": self.urgency,
            "name": self.display_name(),
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
