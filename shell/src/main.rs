//! `vigil-shell`: the job shell. One runs per node of a job, started by the local broker (`rexec.spawn`).
//!
//! It reads its [`ShellInput`] as JSON on stdin, with the placement of the node's tasks that its broker computed with
//! hwloc (`-o cpu-affinity=off|on|per-task`, `-o gpu-affinity=off|on|per-task`; the shell links no hwloc, whose
//! loading was a sixth of a short job's shell), binds them on a live topology, launches them with the `VIGIL_*`
//! environment, forwards their stdout/stderr line by line to the exec system on rank 0 (`job-exec.output`),
//! reports each task's exit (`job-exec.task-exit`, which starts the job-wide exit-timeout clock), forwards
//! signals, and finally writes one [`ShellReport`] JSON line on stdout.
//!
//! Exit codes: 0 when a report was written (whatever the tasks did); 1 if the input could not be read.
//!
//! The shell starts at the C `main` (its `main` below) rather than through std's runtime start-up, whose one costly
//! step here is finding the main thread's stack for its overflow guard: glibc reads and parses
//! `/proc/self/maps` for it, about 4 % of a short job's shell CPU. Without it a stack overflow is a plain
//! SIGSEGV instead of std's message; SIGPIPE is ignored here as std would (tasks still start with it at its
//! default: std resets it in every child it spawns); standard descriptors 0-2 are always open (the broker
//! gives the shell a pipe on each of 0 and 1 and its own stderr).
#![cfg_attr(not(test), no_main)]

mod bind;
mod dirs;
mod output;
mod pmi;
mod pmix;
mod procs;
mod serve;
mod spawn;

use serve::{Inbox, Serve};
use spawn::{Started, TaskReports};
use std::collections::HashSet;
use std::io::Write as _;
use std::str::FromStr;
use tokio::sync::mpsc;
use vigil_client::Client;
use vigil_proto::affinity::{CpuAffinity, GpuAffinity};
use vigil_proto::shellproto::{OutputLine, ShellInput, ShellReport, TaskPlacement};

/// Entry point, called by the C runtime with the program's arguments (unused: the input comes on stdin; the
/// `--jobid` the broker passes is for `ps`). Returns the exit code (see the crate docs).
#[cfg_attr(not(test), no_mangle)]
extern "C" fn main(_argc: libc::c_int, _argv: *const *const libc::c_char) -> libc::c_int {
    // As std's start-up would: a broker or task gone away is a write error, not a death by signal.
    // SAFETY: setting a signal's disposition to SIG_IGN installs no handler and has no other effect.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("vigil-shell: cannot start runtime: {e}");
            std::process::exit(1);
        }
    };
    std::process::exit(rt.block_on(run()));
}

async fn run() -> i32 {
    let mut text = String::new();
    if let Err(e) = std::io::Read::read_to_string(&mut std::io::stdin(), &mut text) {
        eprintln!("vigil-shell: cannot read input: {e}");
        return 1;
    }
    let input: ShellInput = match serde_json::from_str(&text) {
        Ok(i) => i,
        Err(e) => {
            eprintln!("vigil-shell: malformed shell input: {e}");
            return 1;
        }
    };
    // Started by vigil-imp as a guest (docs/security.md): run only what the submitter signed.
    if let Err(e) = check_signed(&input, std::env::var(vigil_proto::shellproto::IMP_JOBSPEC_SHA_ENV).ok().as_deref()) {
        let report = ShellReport::failed(format!("refused: {e}"));
        let _ = writeln!(std::io::stdout(), "{}", serde_json::to_string(&report).unwrap_or_default());
        return 0;
    }
    let report = match Shell::new(input).await {
        Ok(mut sh) => sh.run().await,
        Err(e) => ShellReport::failed(e),
    };
    // The broker reads this report from our stdout; if it is gone there is nobody to tell.
    let _ = writeln!(std::io::stdout(), "{}", serde_json::to_string(&report).unwrap_or_default());
    0
}

/// Where `vigil-imp` started this shell (it says so in `sha`, [`vigil_proto::shellproto::IMP_JOBSPEC_SHA_ENV`]: the
/// SHA-256 of the jobspec it checked the submitter's credential against), check that `input` is that job: its
/// signed jobspec has that SHA-256, and its command, environment, working directory, options and files are that
/// jobspec's. Nothing to check otherwise.
///
/// # Errors
/// What differs.
fn check_signed(input: &ShellInput, sha: Option<&str>) -> Result<(), String> {
    let Some(sha) = sha else { return Ok(()) };
    let Some(imp) = &input.imp else {
        return Err("started by vigil-imp, but the input carries no signed jobspec".into());
    };
    if vigil_client::munge::sha256_hex(imp.jobspec.as_bytes()) != sha {
        return Err("the input's jobspec is not the one vigil-imp checked (their SHA-256 differ)".into());
    }
    input.check_signed()
}

struct Shell {
    tmpdir: Option<std::path::PathBuf>,
    /// The tasks' `VIGIL_ALLOC_TMPDIR` on this node, and whether this shell removes it at the end (it made it).
    alloc_tmpdir: Option<(std::path::PathBuf, bool)>,
    input: ShellInput,
    client: Client,
    placement: Vec<TaskPlacement>,
    bind: bool,
    notes: Vec<String>,
}

impl Shell {
    async fn new(mut input: ShellInput) -> Result<Shell, String> {
        if let Some(cwd) = &input.cwd {
            if !std::path::Path::new(cwd).is_dir() {
                return Err(format!("working directory {cwd} does not exist on this node"));
            }
        }
        let client = Client::connect(&input.uri).await.map_err(|e| format!("cannot connect to broker: {e}"))?;
        let cpu = match input.option_str("cpu-affinity") {
            Some(v) => CpuAffinity::from_str(&v).map_err(|e| e.to_string())?,
            None => CpuAffinity::PerTask,
        };
        let gpu = match input.option_str("gpu-affinity") {
            Some(v) => GpuAffinity::from_str(&v).map_err(|e| e.to_string())?,
            None => GpuAffinity::PerTask,
        };
        let mut notes = Vec::new();
        // A memory limit the broker could not apply here: the job runs, and is told.
        if let Ok(why) = std::env::var(vigil_proto::shellproto::MEMORY_NOTE_ENV) {
            let host = nix::unistd::gethostname().ok().and_then(|h| h.into_string().ok()).unwrap_or_default();
            let v = input.option_str("memory").unwrap_or_default();
            notes.push(format!("vigil-shell: memory={v} not applied on {host} (rank {}): {why}", input.broker_rank));
        }
        // The broker placed the tasks with hwloc (it loads the node's topology once, not once per shell). On a node
        // without an hwloc topology (`cpu-count`; the broker sends no placement then), or from a broker that sent
        // none: by CPU number.
        let Some(p) = input.placement.take() else {
            if input.topology == "cpu-count" && input.shell_rank == 0 {
                notes.push("vigil-shell: no hwloc topology on this node; tasks bound by CPU number".to_string());
            }
            let placement = spawn::cpu_count_placement(&input, cpu, gpu);
            let bind = cpu != CpuAffinity::Off;
            return Ok(Shell { tmpdir: None, alloc_tmpdir: None, input, client, placement, bind, notes });
        };
        if let Some(e) = p.error {
            return Err(e);
        }
        notes.extend(p.notes);
        let (placement, bind) = (p.tasks, p.bind);
        Ok(Shell { tmpdir: None, alloc_tmpdir: None, input, client, placement, bind, notes })
    }

    /// The shell's run, in steps: set up (the tmpdirs, output files, [`Shell::spawn_forwarder`], PMI-1 and PMIx),
    /// [`Shell::start_tasks`], their standard input and signals passed on, then serve them ([`Serve`]: PMI, exits,
    /// early exit reports, lost-node notices, signals) until every one has exited, and [`Shell::end`].
    async fn run(&mut self) -> ShellReport {
        if let Err(e) = self.make_tmpdir() {
            return ShellReport::failed(e);
        }
        let (out_file, err_file) = match self.output_files() {
            Ok(f) => f,
            Err(e) => {
                // The broker removes the job's tmpdir; an allocation directory elsewhere is ours to remove.
                if let Some((a, true)) = self.alloc_tmpdir.take() {
                    let _ = std::fs::remove_dir_all(a);
                }
                return ShellReport::failed(e);
            }
        };
        // Bounded: a task that writes faster than rank 0 takes its output blocks on its pipe (backpressure)
        // instead of growing the shell's memory.
        let (out_tx, out_rx) = mpsc::channel::<OutputLine>(output::OUTPUT_QUEUE);
        for n in self.notes.drain(..) {
            let _ = out_tx.try_send(OutputLine::text(self.input.first_task, "stderr", n));
        }
        // Forwarder: batch lines, send without waiting; the final flush in `end` waits for rank 0's ack.
        let fwd = self.spawn_forwarder(out_rx, out_file, err_file);

        // PMI-1: one socketpair per task, served by this shell; PMIx: a `vigil-pmix` helper on this node
        // (`-o pmi=LIST`, both by default; `-o pmi=off` neither).
        let pmi_opt = self.input.option_str("pmi");
        let choice = match pmix::PmiChoice::parse(pmi_opt.as_deref()) {
            Ok(c) => c,
            Err(e) => return ShellReport::failed(e),
        };
        let use_pmi = choice.simple;
        // This node's global task ranks, in local order: a run of ranks (block), or those a task map lists.
        let ranks = self.input.task_ranks();
        let mut helper: Option<pmix::Helper> = None;
        if choice.pmix && !ranks.is_empty() {
            match self.start_pmix(&ranks).await {
                Ok(h) => helper = Some(h),
                // Asked for by name: the job cannot run as asked. By default: said, and the job runs on PMI-1.
                Err(e) if pmi_opt.is_some() => return ShellReport::failed(format!("PMIx: {e}")),
                Err(e) if e.contains("is not installed") => {}
                Err(e) => {
                    let _ = out_tx.try_send(OutputLine::text(
                        self.input.first_task,
                        "stderr",
                        format!("vigil-shell: PMIx not served on rank {}: {e}", self.input.broker_rank),
                    ));
                }
            }
        }
        let pmi_srv = pmi::PmiServer::new(
            format!("vigil-{}", self.input.id_f58),
            self.input.ntasks,
            ranks.iter().copied(),
            vigil_proto::pmi::process_mapping(&self.input.taskmap),
        );
        let (pmi_tx, pmi_rx) = mpsc::unbounded_channel::<(u32, Option<Vec<u8>>)>();
        let (exit_tx, exit_rx) = mpsc::unbounded_channel::<(u32, i32)>();
        // Early exit reports from the exit detector (eBPF: at the kernel's exit tracepoint): rank, report.
        let (early_tx, early_rx) = mpsc::unbounded_channel::<(u32, serde_json::Value)>();
        let exit_on_error = self.input.options.get("exit-on-error").is_some_and(|v| match v {
            serde_json::Value::Bool(b) => *b,
            serde_json::Value::String(s) => !matches!(s.as_str(), "0" | "false" | "no" | "off"),
            _ => true,
        });
        // The OOM kills of this shell's cgroup accounted for.
        let memory_events = procs::own_memory_events();
        let oom_seen = memory_events.as_deref().and_then(procs::oom_kills).unwrap_or(0);
        let Started { pids, readers, stdins, pmi_writers } = self.start_tasks(
            &ranks,
            helper.as_ref(),
            use_pmi,
            &out_tx,
            TaskReports { pmi: &pmi_tx, exit: &exit_tx, early: &early_tx },
        );
        drop(exit_tx);
        self.forward_stdin(stdins);

        let (sig_tx, sig_rx) = mpsc::unbounded_channel::<i32>();
        procs::forward_signals(&sig_tx);

        // Lost-shell notices (node failures elsewhere in the job) arrive as events on `shell.<jobid>`.
        let _ = self.client.subscribe(&format!("shell.{}", self.input.id_f58)).await;
        let (barrier_tx, barrier_rx) = mpsc::unbounded_channel();
        // PMIx fences in flight through the same barrier: the fence's number, and every shell's puts.
        let (fence_tx, fence_rx) = mpsc::unbounded_channel();
        let mut inbox =
            Inbox { pmi: pmi_rx, exit: exit_rx, early: early_rx, sig: sig_rx, barrier: barrier_rx, fence: fence_rx };
        let i = &self.input;
        let mut serve = Serve {
            client: self.client.clone(),
            id: i.id,
            shell_rank: i.shell_rank,
            nshells: i.nshells,
            broker_rank: i.broker_rank,
            first_task: i.first_task,
            helper,
            pmi: pmi_srv,
            use_pmi,
            pmi_writers,
            exit_on_error,
            pids,
            out_tx,
            barrier_tx,
            fence_tx,
            pmi_closed: HashSet::new(),
            exit_failed: HashSet::new(),
            oom_reported: HashSet::new(),
            memory_events,
            oom_seen,
            termed: false,
            tasks: Vec::new(),
            abort_code: None,
            broker_gone: false,
        };
        serve.run(&mut inbox, ranks.len()).await;
        // The forwarder ends with the last sender of the tasks' output, handed to `end`; what else the loop served
        // (the PMIx helper, PMI connections, the signal and report channels) stays until the report is made.
        let Serve { out_tx, tasks, abort_code, broker_gone, .. } = serve;
        self.end(readers, out_tx, fwd, tasks, abort_code, broker_gone).await
    }
}
