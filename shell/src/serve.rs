//! The serve loop: once the tasks are started, what this shell does until every one has exited (their PMI-1 lines,
//! the PMIx helper's upcalls and the fences they start, PMI barriers, early exit reports of the node's exit
//! detector, wait statuses, signals from the broker, lost-node notices), each kind of input handled by one method
//! of [`Serve`], whose answers ([`pmi::Out`]) [`Serve::act`] carries out; then [`Shell::end`] makes the report.

use crate::output::send_output;
use crate::{pmi, pmix, procs, Shell};
use std::collections::{BTreeMap, HashSet};
use std::time::Duration;
use tokio::sync::mpsc;
use vigil_client::Client;
use vigil_proto::shellproto::{OutputLine, ShellReport, TOPIC_TASK_EXIT};

/// What a PMI barrier (PMI-1's, through `job-exec.pmi-barrier` on rank 0) ends with: every shell's puts, or why not.
type BarrierResult = Result<BTreeMap<String, String>, String>;

/// Where the serve loop's inputs come from: PMI-1 lines by task rank (`None`: the connection closed), wait statuses
/// (closed when every task's waiter has reported), early exit reports (rank, report), forwarded signals by number,
/// PMI-1 barriers and PMIx fences (the fence's number with the barrier's result) that ended.
pub(crate) struct Inbox {
    pub(crate) pmi: mpsc::UnboundedReceiver<(u32, Option<Vec<u8>>)>,
    pub(crate) exit: mpsc::UnboundedReceiver<(u32, i32)>,
    pub(crate) early: mpsc::UnboundedReceiver<(u32, serde_json::Value)>,
    pub(crate) sig: mpsc::UnboundedReceiver<i32>,
    pub(crate) barrier: mpsc::UnboundedReceiver<BarrierResult>,
    pub(crate) fence: mpsc::UnboundedReceiver<(u64, BarrierResult)>,
}

/// The serve loop's state: this node's tasks and their PMI servers, what was already said about them (PMI closed,
/// failed the job, OOM kills), and how the job ends here (`tasks`' wait statuses, `abort_code`, `broker_gone`).
pub(crate) struct Serve {
    /// The broker connection (shared with the shell's).
    pub(crate) client: Client,
    /// The job's id, this shell's rank among the job's shells, their number, our broker's rank, and the first task
    /// rank of this node (where the shell's own notes go).
    pub(crate) id: u64,
    pub(crate) shell_rank: u32,
    pub(crate) nshells: u32,
    pub(crate) broker_rank: u32,
    pub(crate) first_task: u32,
    /// The PMIx helper of this node, when the tasks have PMIx.
    pub(crate) helper: Option<pmix::Helper>,
    /// PMI-1's server for this node's tasks, whether they have PMI-1, and its reply lines' writers by task rank.
    pub(crate) pmi: pmi::PmiServer,
    pub(crate) use_pmi: bool,
    pub(crate) pmi_writers: BTreeMap<u32, mpsc::UnboundedSender<String>>,
    /// `-o exit-on-error`: a task that fails fails the job.
    pub(crate) exit_on_error: bool,
    /// The tasks' pids (signalled one by one when this shell leads no process group of its own).
    pub(crate) pids: Vec<i32>,
    /// The tasks' output, where the shell's own notes go too.
    pub(crate) out_tx: mpsc::Sender<OutputLine>,
    /// Where ended PMI-1 barriers and PMIx fences are handed back to the loop.
    pub(crate) barrier_tx: mpsc::UnboundedSender<BarrierResult>,
    pub(crate) fence_tx: mpsc::UnboundedSender<(u64, BarrierResult)>,
    /// Tasks whose PMI connection was already judged closed, and tasks that already failed the job.
    pub(crate) pmi_closed: HashSet<u32>,
    pub(crate) exit_failed: HashSet<u32>,
    /// Tasks whose OOM kill was reported (once each), this shell's cgroup's `memory.events`, and the OOM kills
    /// counted there that are accounted for.
    pub(crate) oom_reported: HashSet<u32>,
    pub(crate) memory_events: Option<std::path::PathBuf>,
    pub(crate) oom_seen: u64,
    /// A task gets SIGTERM from its shell once: when this shell already sent it (its job failed here), the exec
    /// system's SIGTERM for the same failure, which follows, is not passed on a second time (a task that takes a
    /// second SIGTERM as "quit now" would skip its clean-up). SIGKILL follows at the kill timeout.
    pub(crate) termed: bool,
    /// Each task's rank and wait status, as they exit.
    pub(crate) tasks: Vec<(u32, i32)>,
    /// The first failure's code (MPI_Abort's, or a task's under exit-on-error).
    pub(crate) abort_code: Option<i32>,
    /// Our broker is gone (its connection closed).
    pub(crate) broker_gone: bool,
}

impl Serve {
    /// Serve until `n` tasks have exited (or every task's waiter has reported).
    pub(crate) async fn run(&mut self, inbox: &mut Inbox, n: usize) {
        while self.tasks.len() < n {
            let client = &self.client;
            let helper = &mut self.helper;
            let outs = tokio::select! {
                ev = client.next_event(), if !self.broker_gone => match ev {
                    Some(ev) => self.on_notice(&ev.json()),
                    None => self.on_broker_gone(),
                },
                Some((rank, line)) = inbox.pmi.recv() => match line {
                    Some(l) => self.pmi.handle(rank, &l),
                    None => self.pmi.closed(rank),
                },
                Some(v) = async {
                    match helper.as_mut() {
                        Some(h) => h.rx.recv().await,
                        None => std::future::pending().await,
                    }
                } => self.on_pmix(&v),
                Some((seq, r)) = inbox.fence.recv() => self.on_fence(seq, r),
                Some(r) = inbox.barrier.recv() => match r {
                    Ok(all) => self.pmi.barrier_done(all),
                    Err(e) => vec![pmi::Out::Fatal { note: format!("PMI barrier failed: {e}"), exit_code: None }],
                },
                Some((rank, v)) = inbox.early.recv() => self.on_early_exit(rank, &v),
                e = inbox.exit.recv() => match e {
                    Some((rank, st)) => self.on_exit(rank, st),
                    None => break,
                },
                Some(sig) = inbox.sig.recv() => self.on_signal(sig),
            };
            self.act(outs);
        }
    }

    /// Our broker is gone (killed, or its node is being torn down): nobody will collect these tasks' output or
    /// status, nor kill what is left of the job's process group after this shell, so do not leave them, or anything
    /// they started, running.
    fn on_broker_gone(&mut self) -> Vec<pmi::Out> {
        self.broker_gone = true;
        for p in &self.pids {
            // SAFETY: plain kill(2) on a child pid we spawned.
            unsafe { libc::kill(*p, libc::SIGKILL) };
        }
        procs::kill_own_group();
        // And what left the group (`setsid`): the job's cgroup, this shell with it.
        procs::kill_own_job_cgroup();
        Vec::new()
    }

    /// A lost-shell notice (a node failure elsewhere in the job, an event on `shell.<jobid>`). The note speaks in
    /// the job's own terms (for a batch job, its instance's ranks): said as is, by the leader shell only; every
    /// shell passes the loss on to its PMIx clients.
    fn on_notice(&mut self, v: &serde_json::Value) -> Vec<pmi::Out> {
        if v.get("leader").and_then(|l| l.as_bool()) != Some(false) {
            let note = v.get("note").and_then(|n| n.as_str()).unwrap_or("a node was lost; the job continues");
            let _ = self.out_tx.try_send(OutputLine::text(self.first_task, "stderr", format!("vigil-shell: {note}")));
        }
        if let (Some(h), Some(lost)) = (&self.helper, pmix::LostNodes::from_notice(v)) {
            h.node_lost(&lost);
        }
        Vec::new()
    }

    /// An upcall of the PMIx helper: a fence (this node's alone, or exchanged through rank 0's barrier, which
    /// [`Serve::on_fence`] ends), or an abort, which fails the job.
    fn on_pmix(&mut self, v: &serde_json::Value) -> Vec<pmi::Out> {
        let mut outs = Vec::new();
        match pmix::Event::decode(v) {
            Ok(pmix::Event::Fence { seq, data }) => {
                if self.nshells <= 1 {
                    if let Some(h) = &self.helper {
                        h.fence_done(seq, vec![data]);
                    }
                } else {
                    let c = self.client.clone();
                    let tx = self.fence_tx.clone();
                    let body = serde_json::json!({"id": self.id, "shell_rank": self.shell_rank,
                        "kvs": pmix::fence_kvs(self.shell_rank, &data)});
                    tokio::spawn(async move {
                        let r = barrier(&c, &body).await;
                        let _ = tx.send((seq, r));
                    });
                }
            }
            Ok(pmix::Event::Abort { rank, status, msg }) => {
                let msg = if msg.is_empty() { String::new() } else { format!(": {msg}") };
                outs.push(pmi::Out::Fatal {
                    note: format!("task {rank}: MPI_Abort / PMIx_Abort with exit code {status}{msg}"),
                    exit_code: Some(status),
                });
            }
            Ok(pmix::Event::Other) => {}
            Err(e) => outs.push(pmi::Out::Fatal { note: format!("vigil-pmix: {e}"), exit_code: None }),
        }
        outs
    }

    /// PMIx fence `seq` came back from rank 0's barrier: every node's blob to the helper, or the fence failed (and
    /// the job with it).
    fn on_fence(&mut self, seq: u64, r: BarrierResult) -> Vec<pmi::Out> {
        let mut outs = Vec::new();
        let blobs = r.and_then(|all| pmix::fence_blobs(&all, self.nshells));
        match (blobs, &self.helper) {
            (Ok(b), Some(h)) => h.fence_done(seq, b),
            (Err(e), h) => {
                if let Some(h) = h {
                    h.fence_failed(seq, &e);
                }
                outs.push(pmi::Out::Fatal { note: format!("PMIx fence failed: {e}"), exit_code: None });
            }
            (Ok(_), None) => {}
        }
        outs
    }

    /// The node's exit detector says task `rank` died (report `v`). The task is dead (its memory may still be
    /// being freed): act on it now; its status is recorded when it is reaped. A report without a status
    /// (userspace detector watching a process that is not its child) only closes PMI; exit-on-error then waits for
    /// the reap.
    fn on_early_exit(&mut self, rank: u32, v: &serde_json::Value) -> Vec<pmi::Out> {
        let mut outs = Vec::new();
        let code = v.get("exit_code").and_then(|c| c.as_i64());
        let signal = v.get("signal").and_then(|c| c.as_i64());
        if self.use_pmi && self.pmi_closed.insert(rank) {
            outs.extend(self.pmi.closed(rank));
        }
        let failed = signal.is_some() || code.is_some_and(|c| c != 0);
        if v.get("oom_killed").and_then(|o| o.as_bool()) == Some(true) && self.oom_reported.insert(rank) {
            // (Counted, so that memory.events does not name another task for the same kill.)
            self.oom_seen += 1;
            self.report_oom(rank);
        }
        // Once the job has failed, the tasks this shell then kills are not failures of their own.
        if self.exit_on_error
            && failed
            && self.abort_code.is_none()
            && !any_fatal(&outs)
            && self.exit_failed.insert(rank)
        {
            outs.push(pmi::Out::Fatal {
                note: task_failure_note(rank, code, signal, v),
                exit_code: Some(task_code(code, signal)),
            });
        }
        outs
    }

    /// Task `rank` was reaped with wait status `st`: recorded, its OOM kill (if the cgroup counted one) and its
    /// failure under exit-on-error said, its PMI closed, and rank 0 told (`job-exec.task-exit`).
    fn on_exit(&mut self, rank: u32, st: i32) -> Vec<pmi::Out> {
        let mut outs = Vec::new();
        self.tasks.push((rank, st));
        // Killed, and the OOM killer killed in this job's cgroup since last seen: that was it (how it is known
        // without the eBPF exit detector).
        if st & 0x7f == libc::SIGKILL && !self.oom_reported.contains(&rank) {
            if let Some(n) = self.memory_events.as_deref().and_then(procs::oom_kills) {
                if n > self.oom_seen {
                    self.oom_seen += 1;
                    self.oom_reported.insert(rank);
                    self.report_oom(rank);
                }
            }
        }
        // A task that exits without PMI_Finalize fails the job even if something it started still holds its PMI
        // socket open.
        if self.use_pmi && self.pmi_closed.insert(rank) {
            outs.extend(self.pmi.closed(rank));
        }
        if self.exit_on_error
            && vigil_proto::shellproto::exit_code(st) != 0
            && self.abort_code.is_none()
            && !any_fatal(&outs)
            && self.exit_failed.insert(rank)
        {
            let (code, signal) =
                if st & 0x7f != 0 { (None, Some((st & 0x7f) as i64)) } else { (Some(((st >> 8) & 0xff) as i64), None) };
            outs.push(pmi::Out::Fatal {
                note: task_failure_note(rank, code, signal, &serde_json::Value::Null),
                exit_code: Some(task_code(code, signal)),
            });
        }
        let _ = self.client.send(TOPIC_TASK_EXIT, 0, &serde_json::json!({"id": self.id, "rank": rank, "status": st}));
        outs
    }

    /// Signal `sig` from the broker, passed on to the tasks (SIGTERM once, see [`Serve::termed`]).
    fn on_signal(&mut self, sig: i32) -> Vec<pmi::Out> {
        if sig == libc::SIGTERM && std::mem::replace(&mut self.termed, true) {
            return Vec::new();
        }
        if procs::signal_own_group(sig) == 0 {
            for p in &self.pids {
                // SAFETY: plain kill(2) on a child pid we spawned.
                unsafe { libc::kill(*p, sig) };
            }
        }
        Vec::new()
    }

    /// Carry out what the PMI servers answered: replies to tasks, a barrier (this node's alone, or through rank 0:
    /// its result comes back through the inbox), and failures of the job (an exception to rank 0, SIGTERM to the
    /// tasks once).
    fn act(&mut self, outs: Vec<pmi::Out>) {
        for o in outs {
            match o {
                pmi::Out::Reply(rank, line) => {
                    if let Some(w) = self.pmi_writers.get(&rank) {
                        let _ = w.send(line.encode());
                    }
                }
                pmi::Out::Barrier(puts) => {
                    if self.nshells <= 1 {
                        let _ = self.barrier_tx.send(Ok(puts));
                    } else {
                        let c = self.client.clone();
                        let tx = self.barrier_tx.clone();
                        let body = serde_json::json!({"id": self.id, "shell_rank": self.shell_rank, "kvs": puts});
                        tokio::spawn(async move {
                            let r = barrier(&c, &body).await;
                            let _ = tx.send(r);
                        });
                    }
                }
                pmi::Out::Fatal { note, exit_code } => {
                    // The first failure's code is the job's (MPI_Abort's, or the task's under exit-on-error).
                    if self.abort_code.is_none() {
                        self.abort_code = exit_code;
                    }
                    let _ = self.client.send(
                        vigil_proto::shellproto::TOPIC_EXCEPTION,
                        0,
                        &serde_json::json!({"id": self.id, "type": "exec", "severity": 0, "note": note,
                            "rank": self.broker_rank}),
                    );
                    if !std::mem::replace(&mut self.termed, true) && procs::signal_own_group(libc::SIGTERM) == 0 {
                        for p in &self.pids {
                            // SAFETY: plain kill(2) on a child pid we spawned.
                            unsafe { libc::kill(*p, libc::SIGTERM) };
                        }
                    }
                }
            }
        }
    }

    /// Task `rank` was killed by the OOM killer: a non-fatal exception naming it, the node and the broker rank,
    /// said exit-on-error or not (the job's other tasks go on).
    fn report_oom(&self, rank: u32) {
        let host = nix::unistd::gethostname().ok().and_then(|h| h.into_string().ok()).unwrap_or_default();
        let note = format!("task {rank} on {host} (rank {}) was killed by the OOM killer", self.broker_rank);
        let _ = self.client.send(
            vigil_proto::shellproto::TOPIC_EXCEPTION,
            0,
            &serde_json::json!({"id": self.id, "type": "oom", "severity": 1, "note": note, "rank": self.broker_rank}),
        );
    }
}

/// One PMI barrier through rank 0 (`job-exec.pmi-barrier`, request `body`): every shell's puts.
async fn barrier(c: &Client, body: &serde_json::Value) -> BarrierResult {
    c.rpc("job-exec.pmi-barrier", 0, body).await.map_err(|e| e.errstr).and_then(|v| {
        serde_json::from_value::<BTreeMap<String, String>>(v.get("kvs").cloned().unwrap_or_default())
            .map_err(|e| e.to_string())
    })
}

impl Shell {
    /// End, once every task has exited: give the output pipes a moment to drain (`readers`), end the forwarder
    /// (`out_tx`, `fwd`) and flush it to rank 0, remove the tmpdirs, and make the report (`tasks`: rank and wait
    /// status of each; `abort_code`: the first failure's code). If the broker is gone, what the tasks started since
    /// is killed.
    pub(crate) async fn end(
        &mut self,
        readers: Vec<tokio::task::JoinHandle<()>>,
        out_tx: mpsc::Sender<OutputLine>,
        fwd: tokio::task::JoinHandle<()>,
        mut tasks: Vec<(u32, i32)>,
        abort_code: Option<i32>,
        broker_gone: bool,
    ) -> ShellReport {
        let id = self.input.id;
        // Every task has exited (the time is reported: the shell itself may end much later, below).
        let ended = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).ok().map(|d| d.as_secs_f64());
        // A process the tasks left in the background may still hold their stdout open.
        // Give the pipes a moment to drain, then stop reading (the broker kills what is left of the job's
        // process group once this shell exits).
        let drain_until = tokio::time::Instant::now() + Duration::from_secs(1);
        for r in readers {
            let abort = r.abort_handle();
            if tokio::time::timeout_at(drain_until, r).await.is_err() {
                abort.abort();
            }
        }
        drop(out_tx);
        let _ = fwd.await;
        // Flush: an acknowledged request on the same path guarantees every line before it reached rank 0; it also
        // tells rank 0 that nothing more is in flight (it releases what it held back waiting for a batch sent again).
        let _ = tokio::time::timeout(
            Duration::from_secs(30),
            send_output(
                &self.client,
                &serde_json::json!({"id": id, "lines": [], "broker_rank": self.input.broker_rank, "flush": true}),
            ),
        )
        .await;
        tasks.sort_unstable();
        let status = tasks.iter().map(|t| t.1).max_by_key(|s| vigil_proto::shellproto::exit_code(*s)).unwrap_or(0);
        if let Some((a, true)) = self.alloc_tmpdir.take() {
            let _ = std::fs::remove_dir_all(a);
        }
        if let Some(t) = self.tmpdir.take() {
            self.remove_tmpdir(&t);
        }
        if broker_gone {
            procs::kill_own_group(); // what the tasks started since
        }
        ShellReport { status, tasks, error: None, abort_code, usage: None, ended }
    }
}

/// True if `outs` already fails the job.
fn any_fatal(outs: &[pmi::Out]) -> bool {
    outs.iter().any(|o| matches!(o, pmi::Out::Fatal { .. }))
}

/// Shell-style exit code of a task: its exit code, or 128 + the signal that killed it.
fn task_code(code: Option<i64>, signal: Option<i64>) -> i32 {
    match (signal, code) {
        (Some(s), _) => 128 + s as i32,
        (None, Some(c)) => c as i32,
        (None, None) => 1,
    }
}

/// Exception note for a task that failed under `-o exit-on-error` (exit code or signal, OOM, who sent it).
fn task_failure_note(rank: u32, code: Option<i64>, signal: Option<i64>, report: &serde_json::Value) -> String {
    let how = match (signal, code) {
        (Some(s), _) => format!("was killed by signal {s}"),
        (None, Some(c)) => format!("exited with code {c}"),
        (None, None) => "exited".to_string(),
    };
    let oom = if report.get("oom_killed").and_then(|o| o.as_bool()) == Some(true) { " (OOM killer)" } else { "" };
    format!("task {rank} {how}{oom} (exit-on-error)")
}
