//! Job commands: `run`, `submit`, `jobs`, `cancel`, `job submit|eventlog|attach|wait|cancel|info`.

mod args;
mod copies;
mod nodes;
mod spec;

pub(crate) use args::{NodeCount, NodeSelection, SubmitArgs};
pub(crate) use copies::submit_all;
use copies::submit_copies;
pub(crate) use nodes::check_exclude;
use nodes::Hostfile;
pub(crate) use spec::{build_jobspec, check_output_template, said_as_typed};

use super::connect;
use crate::client::Client;
use crate::jobs::JobId;
use crate::jobspec::Jobspec;
use clap::{Args, Subcommand};
use serde_json::{json, Value};
use std::io::Write;

/// `vigil run` (attach = true) and `vigil submit`.
pub(crate) async fn run(a: SubmitArgs, attach_after: bool) -> Result<i32, String> {
    if let Some(cc) = &a.cc {
        if attach_after {
            return Err(
                "--cc is for `vigil submit` (each copy is a job of its own; `vigil job wait ID` waits for one)".into(),
            );
        }
        return submit_copies(&a, cc).await;
    }
    let spec = build_jobspec(&a)?;
    if a.dry_run {
        println!("{}", spec.to_json());
        return Ok(0);
    }
    let mut c = connect().await?;
    if let Some(hf) = Hostfile::of(&a)? {
        hf.check_nodes(&c, &a.select).await?;
    }
    check_exclude(&c, &a.select).await?;
    let id = submit_with(&mut c, &spec, attach_after, a.queue.urgency())
        .await
        .map_err(|e| said_as_typed(&a.setopt, a.taskmap.as_deref(), e))?;
    if !attach_after {
        println!("{id}");
        return Ok(0);
    }
    // Standard input goes to every task (as srun does by default), paced by rank 0's acknowledgements.
    let c2 = c.clone();
    let feeder = tokio::spawn(async move {
        use base64::Engine as _;
        use tokio::io::AsyncReadExt;
        let mut input = tokio::io::stdin();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match input.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let data = base64::engine::general_purpose::STANDARD.encode(&buf[..n]);
                    match c2.rpc("job-exec.stdin", 0, &json!({"id": id.0, "data": data})).await {
                        Ok(_) => {}
                        // Rank 0 holds a job's input until it ends, up to a bound: past it, say so and end the
                        // tasks' input where it was cut rather than leave them waiting for the rest.
                        Err(e) if e.errnum == crate::message::errno::ENOSPC => {
                            eprintln!("vigil: standard input cut short: {}", e.errstr);
                            break;
                        }
                        // The job's input is closed (it ended) or the instance is gone: nothing to tell.
                        Err(_) => return,
                    }
                }
            }
        }
        let _ = c2.rpc("job-exec.stdin", 0, &json!({"id": id.0, "eof": true})).await;
    });
    let r = followed(attach(&c, id, a.label_io).await, id);
    feeder.abort();
    r
}

/// The exit code of `vigil run`, `vigil job attach` and `vigil job wait` when they lose rank 0 (stopped,
/// restarted, killed) while they follow a job: 255, as ssh(1) exits 255 when its connection fails rather than with
/// the remote command's status. The job itself may well run on (with a state directory rank 0 comes back with it),
/// so its exit code is not known. A job can exit 255 too (`exit -1`): the line on stderr says which it was.
pub(crate) const EXIT_RANK0_LOST: i32 = 255;

/// What a command that followed job `id` to its end exits with: its `Ok` code, or, when its connection to rank 0
/// was lost (the connection to our broker ended, or our broker answered EHOSTUNREACH: it lost rank 0),
/// [`EXIT_RANK0_LOST`] after saying how to find the job again; any other error as it is.
fn followed(r: Result<i32, crate::client::RpcError>, id: JobId) -> Result<i32, String> {
    match r {
        Ok(code) => Ok(code),
        Err(e) if e.errnum == crate::message::errno::EHOSTUNREACH => {
            eprintln!("vigil: {}", lost_note(&e.errstr, id));
            Ok(EXIT_RANK0_LOST)
        }
        Err(e) => Err(e.errstr),
    }
}

/// The hint of a client that lost rank 0 while it followed job `id`.
fn lost_note(e: &str, id: JobId) -> String {
    format!(
        "{e} (rank 0 stopped or restarted): job {id} may still be running. If rank 0 keeps a state directory, once \
         it is back `vigil job attach {id}` shows the job's whole output and exits with its exit code (`vigil job \
         wait {id}`: the exit code alone); without one, the job ended with rank 0"
    )
}

async fn submit(c: &mut Client, spec: &Jobspec) -> Result<JobId, String> {
    submit_with(c, spec, false, None).await
}

/// Submit ([`submit_value`]: `c` is the new connection if rank 0 restarted meanwhile); with `stdin` the job's
/// tasks read what this process then sends as `job-exec.stdin`.
async fn submit_with(c: &mut Client, spec: &Jobspec, stdin: bool, urgency: Option<u32>) -> Result<JobId, String> {
    let v: Value = serde_json::from_str(&spec.to_json()).map_err(|e| e.to_string())?;
    submit_value(c, &v, stdin, urgency).await
}

pub(crate) use super::submit::submit_value;

/// Says on standard error that job `id` is pending, with the scheduler's reason, if it is (SCHED); nothing
/// otherwise, or if rank 0 does not answer. For `vigil run` and `vigil alloc` after [`PENDING_NOTE_AFTER`].
pub(crate) async fn say_if_pending(c: &Client, id: JobId) {
    if let Ok(info) = c.rpc("job-manager.info", 0, &json!({"id": id.0})).await {
        if info.pointer("/info/state").and_then(Value::as_str) == Some("SCHED") {
            let why = info.pointer("/info/reason_pending").and_then(Value::as_str).unwrap_or("resources");
            eprintln!("vigil: job {id}: pending ({why})");
        }
    }
}

/// How long `vigil run` (and `vigil alloc`) waits for a job's allocation before saying that it is pending and why.
pub(crate) const PENDING_NOTE_AFTER: std::time::Duration = std::time::Duration::from_secs(2);

/// Stream a job's output and exceptions until it is INACTIVE; return its exit code.
/// Ctrl-C or SIGTERM once cancels the job (and keeps waiting for it to end); Ctrl-C twice detaches. If our
/// stdout is closed (`vigil run ... | head`), the job is canceled too, as srun does. If rank 0 is lost meanwhile
/// and the instance keeps its jobs while it restarts (a state directory: [`await_rank0`]), this waits for it and
/// goes on where it was, printing nothing twice.
pub(crate) async fn attach(c: &Client, id: JobId, label: bool) -> Result<i32, crate::client::RpcError> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut c = c.clone();
    let mut s = c.rpc_stream("job-info.attach", 0, &json!({"id": id.0}))?;
    // Items taken so far, of each kind, and how many of each a new stream (after rank 0 came back) replays that
    // were taken already: a new attach starts from the job's first event and first output line again.
    let (mut events, mut lines) = (0usize, 0usize);
    let (mut skip_events, mut skip_lines) = (0usize, 0usize);
    let mut replayed: Option<Value> = None;
    // The finish status, and the type of the first fatal exception: the exit code (shellproto::job_exit_code).
    let mut status: Option<i32> = None;
    let mut fatal: Option<String> = None;
    let mut ctrlc = 0;
    let mut sigint = signal(SignalKind::interrupt()).ok();
    let mut sigterm = signal(SignalKind::terminate()).ok();
    let mut stdout = std::io::stdout();
    let mut stderr = std::io::stderr();
    let mut at_line_start: std::collections::HashMap<(u64, bool), bool> = std::collections::HashMap::new();
    let mut open_line: [Option<u32>; 2] = [None, None];
    let mut closed = false;
    // A job still pending after a moment is said to be so, with the scheduler's reason (as srun says "queued
    // and waiting for resources"), so that `vigil run` never waits in silence.
    let pending_note = tokio::time::sleep(PENDING_NOTE_AFTER);
    tokio::pin!(pending_note);
    let mut started = false;
    async fn recv(s: &mut Option<tokio::signal::unix::Signal>) {
        match s.as_mut() {
            Some(s) => {
                s.recv().await;
            }
            None => std::future::pending::<()>().await,
        }
    }
    loop {
        let next = tokio::select! {
            n = async { match replayed.take() { Some(v) => Some(Ok(v)), None => s.next().await } } => n,
            _ = &mut pending_note, if !started => {
                started = true; // said once
                say_if_pending(&c, id).await;
                continue;
            }
            _ = recv(&mut sigint) => {
                ctrlc += 1;
                if ctrlc == 1 {
                    eprintln!("vigil: canceling job {id} (Ctrl-C again to detach)");
                    let _ = c.rpc("job-manager.cancel", 0, &json!({"id": id.0, "note": "interrupted by user (Ctrl-C)"})).await;
                    continue;
                }
                eprintln!("vigil: detached from job {id}");
                return Ok(130);
            }
            _ = recv(&mut sigterm) => {
                let _ = c.rpc("job-manager.cancel", 0, &json!({"id": id.0, "note": "vigil run was terminated"})).await;
                continue;
            }
        };
        let Some(item) = next else { break };
        let v = match item {
            Ok(v) => v,
            Err(e) if e.errnum == crate::message::errno::EHOSTUNREACH => {
                match await_rank0(&c, id, "job-info.attach", &json!({"id": id.0}), &mut sigint).await {
                    Some((nc, ns, first)) => {
                        (c, s, replayed) = (nc, ns, Some(first));
                        (skip_events, skip_lines) = (events, lines);
                        continue;
                    }
                    None => return Err(e),
                }
            }
            Err(e) => return Err(e),
        };
        if v.get("output").is_some() {
            if skip_lines > 0 {
                skip_lines -= 1;
                continue;
            }
            lines += 1;
        } else if v.get("event").is_some() {
            if skip_events > 0 {
                skip_events -= 1;
                continue;
            }
            events += 1;
        }
        if v.get("output").is_some() || v.pointer("/event/name").and_then(Value::as_str) == Some("alloc") {
            started = true;
        }
        if let Some(o) = v.get("output") {
            if closed {
                continue;
            }
            let Ok(line) = serde_json::from_value::<crate::shellproto::OutputLine>(o.clone()) else { continue };
            let is_err = line.stream == "stderr";
            let bytes = line.bytes();
            let mut buf = Vec::with_capacity(bytes.len() + 8);
            if label {
                // Labels only at line starts: another task's unfinished line is ended first.
                let open = &mut open_line[usize::from(is_err)];
                if let Some(o) = *open {
                    if o != line.rank {
                        buf.push(b'\n');
                        at_line_start.insert((o as u64, is_err), true);
                    }
                }
                let start = at_line_start.entry((line.rank as u64, is_err)).or_insert(true);
                if *start {
                    buf.extend_from_slice(format!("{}: ", line.rank).as_bytes());
                }
                *start = line.eol;
                *open = if line.eol { None } else { Some(line.rank) };
            }
            buf.extend_from_slice(&bytes);
            let r = if is_err { stderr.write_all(&buf) } else { stdout.write_all(&buf).and_then(|_| stdout.flush()) };
            if r.is_err() && !is_err {
                closed = true;
                let _ = c
                    .rpc("job-manager.cancel", 0, &json!({"id": id.0, "note": "output of vigil run was closed"}))
                    .await;
            }
        } else if let Some(e) = v.get("event") {
            let name = e.get("name").and_then(Value::as_str).unwrap_or("");
            let ctx = e.get("context").cloned().unwrap_or(Value::Null);
            match name {
                "exception" => {
                    let sev = ctx.get("severity").and_then(Value::as_u64).unwrap_or(0);
                    if sev == 0 && fatal.is_none() {
                        fatal = Some(ctx.get("type").and_then(Value::as_str).unwrap_or("").to_string());
                    }
                    if !closed {
                        eprintln!(
                            "vigil: job {id}: exception type={} severity={sev}: {}",
                            ctx.get("type").and_then(Value::as_str).unwrap_or("?"),
                            ctx.get("note").and_then(Value::as_str).unwrap_or("")
                        );
                    }
                }
                "finish" => {
                    status = Some(ctx.get("status").and_then(Value::as_i64).unwrap_or(0) as i32);
                }
                "requeue" => {
                    // The lost run does not count: the job runs again (jobs/requeue.rs).
                    (status, fatal) = (None, None);
                    if !closed {
                        eprintln!("vigil: job {id}: {}", requeue_note(&ctx));
                    }
                }
                _ => {}
            }
        }
    }
    if label {
        if open_line[0].is_some() {
            let _ = stdout.write_all(b"\n");
        }
        if open_line[1].is_some() {
            let _ = stderr.write_all(b"\n");
        }
    }
    let _ = stdout.flush();
    if closed {
        return Ok(128 + libc::SIGPIPE);
    }
    Ok(crate::shellproto::job_exit_code(status, fatal.as_deref()))
}

/// How long past the instance's grace for rank 0 ([`crate::client::Welcome::rank0_grace`]) a client that lost it
/// keeps trying: the other brokers retry rank 0 every second, and a restarted rank 0 first reads its store.
pub(crate) const RANK0_WAIT_MARGIN: f64 = 5.0;

/// After the stream of `topic` (`job-info.attach`, `job-manager.eventlog`) for job `id` ended with "rank 0 lost"
/// (the connection to rank 0 closed, or our broker answered EHOSTUNREACH): wait for rank 0 to come back and ask
/// again (`payload`). Connected to rank 0, a client
/// waits only if the instance keeps its jobs while rank 0 restarts (`rank0_grace` > 0 in rank 0's welcome: a
/// state directory), and at most that long plus [`RANK0_WAIT_MARGIN`], reconnecting every half second to
/// `$VIGIL_URI`; connected to another broker, as long as that broker stays up (it stops past its grace). Says
/// once that it waits, and when rank 0 is back. Returns the new client, its stream and the stream's first item;
/// `None` to give up: no grace, the time is up, our broker is gone, a restarted rank 0 that does not know the
/// job (no state directory), or Ctrl-C.
async fn await_rank0(
    c: &Client,
    id: JobId,
    topic: &str,
    payload: &Value,
    sigint: &mut Option<tokio::signal::unix::Signal>,
) -> Option<(Client, crate::client::RpcStream, Value)> {
    use crate::client::RpcError;
    let on_rank0 = c.welcome.rank == 0;
    let grace = c.welcome.rank0_grace;
    if on_rank0 && !(grace > 0.0 && grace.is_finite()) {
        return None;
    }
    let uri = std::env::var(crate::client::URI_ENV).ok()?;
    let limit = if on_rank0 { grace + RANK0_WAIT_MARGIN } else { f64::from(u32::MAX) };
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs_f64(limit);
    eprintln!(
        "vigil: lost rank 0; job {id} is kept while it restarts: waiting for it{} (Ctrl-C to stop waiting)",
        if on_rank0 { format!(" up to {limit:.0} s") } else { String::new() }
    );
    let mut client = c.clone();
    let attempt = async {
        loop {
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            let s = match client.rpc_stream(topic, 0, payload) {
                Ok(s) => Some(s),
                Err(e) if e.errstr == RpcError::disconnected_text() => None,
                Err(_) => return None,
            };
            let mut s = match s {
                Some(s) => s,
                None => match Client::connect(&uri).await {
                    // Rank 0 (or our broker) listens again: attach there next turn.
                    Ok(nc) => {
                        client = nc;
                        continue;
                    }
                    Err(_) if on_rank0 => continue,
                    // Our own broker is gone: it stopped past its grace.
                    Err(_) => return None,
                },
            };
            match s.next().await {
                Some(Ok(v)) => return Some((client.clone(), s, v)),
                Some(Err(e)) if e.errnum == crate::message::errno::EHOSTUNREACH => {
                    if e.errstr == RpcError::disconnected_text() && !on_rank0 {
                        if let Ok(nc) = Client::connect(&uri).await {
                            client = nc;
                        } else {
                            return None;
                        }
                    }
                }
                // Rank 0 is back but does not know the job (it kept no state directory), or refuses.
                _ => return None,
            }
        }
    };
    let back = tokio::select! {
        r = attempt => r,
        _ = tokio::time::sleep_until(deadline) => None,
        _ = async { match sigint.as_mut() { Some(s) => { s.recv().await; } None => std::future::pending::<()>().await } } => None,
    };
    if back.is_some() {
        eprintln!("vigil: rank 0 is back; following job {id} again");
    }
    back
}

/// `requeued (1 of at most 3): lost node2 (rank 2)`, from a `requeue` event's context.
fn requeue_note(ctx: &Value) -> String {
    format!(
        "requeued ({} of at most {}): {}",
        ctx["count"].as_u64().unwrap_or(0),
        ctx["max"].as_u64().unwrap_or(0),
        ctx["note"].as_str().unwrap_or("")
    )
}

/// Options of `vigil jobs`.
#[derive(Args, Debug)]
pub struct JobsArgs {
    /// Include inactive jobs.
    #[arg(short = 'a', long)]
    pub all: bool,
    /// Every user's jobs, not only yours (as `flux jobs -A`, `--user=all`). Each shows its user; the command and
    /// environment of a job are only for its owner and the instance owner (`vigil job info`).
    #[arg(short = 'A', long = "all-users", conflicts_with = "user")]
    pub all_users: bool,
    /// Only the jobs of USER, a login name or uid, or `all` (as `-A`); yours by default.
    #[arg(short = 'u', long, value_name = "USER")]
    pub user: Option<String>,
    /// Print JSON (one object with a "jobs" array), after the filters.
    #[arg(long, conflicts_with = "format")]
    pub json: bool,
    /// Only jobs of this name (`--job-name`, or the command's basename when none was given), as `flux jobs
    /// --name` and `squeue --name`; with `-a`, inactive ones too.
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// Only jobs in these states, a comma-separated LIST of RFC 21 states (new, depend, priority, sched, run,
    /// cleanup, inactive), Flux's groups (pending, running, active) or results of inactive jobs (completed,
    /// failed, canceled, timeout), as `flux jobs --filter`. Inactive states imply `-a`.
    #[arg(long, value_name = "LIST", visible_alias = "filter")]
    pub states: Option<String>,
    /// Inactive jobs only if they ended after TIME: -DURATION ago (-1h, -30m), @EPOCH, or a UTC time
    /// (2026-12-07T05:00:00Z, "2026-12-07 05:00"), as `flux jobs --since`. Implies `-a`.
    #[arg(long, value_name = "TIME")]
    pub since: Option<String>,
    /// At most COUNT jobs (the newest first), after the other filters.
    #[arg(short = 'c', long, value_name = "COUNT")]
    pub count: Option<usize>,
    /// Lines in Flux's style: named fields in braces, each with an optional [<|>|^][WIDTH][.MAX] spec, e.g.
    /// `{id.f58:>12} {name:<16.16} {state} {runtime}`. Fields: id, id.f58, id.dec, id.hex, name, user, userid,
    /// state, state_single, result, status, urgency, nnodes, ntasks, nodelist, ranks, runtime, duration,
    /// t_submit, t_run, t_inactive, returncode, exception.type, exception.note, reason, requeues, info (see
    /// docs/queue.md).
    #[arg(long, value_name = "FORMAT")]
    pub format: Option<String>,
    /// No header line.
    #[arg(short = 'n', long)]
    pub no_header: bool,
}

/// The login name of user id `uid`, or its number if it has none.
pub(crate) fn user_name(uid: u32) -> String {
    nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
        .ok()
        .flatten()
        .map(|u| u.name)
        .unwrap_or_else(|| uid.to_string())
}

/// `--user`: a uid, a login name, or `all` (`None`: every user's).
fn user_id(u: &str) -> Result<Option<u32>, String> {
    if u == "all" {
        return Ok(None);
    }
    if let Ok(n) = u.parse::<u32>() {
        return Ok(Some(n));
    }
    match nix::unistd::User::from_name(u) {
        Ok(Some(user)) => Ok(Some(user.uid.as_raw())),
        _ => Err(format!("--user={u}: no such user (a login name, a uid, or all)")),
    }
}

/// `vigil jobs`.
pub(crate) async fn jobs(a: JobsArgs) -> Result<i32, String> {
    use super::jobsfmt::{Ctx, Format, States, DEFAULT_FORMAT};
    let now = crate::broker_now();
    // Every option is checked before the instance is asked anything.
    let format = Format::parse(a.format.as_deref().unwrap_or(DEFAULT_FORMAT)).map_err(|e| format!("--format: {e}"))?;
    let states = a
        .states
        .as_deref()
        .map(States::parse)
        .transpose()
        .map_err(|e| format!("--states={}: {e}", a.states.as_deref().unwrap_or("")))?;
    let since = a.since.as_deref().map(|s| super::jobsfmt::parse_since(s, now)).transpose()?;
    let user = match (&a.user, a.all_users) {
        (Some(u), _) => user_id(u)?,
        (None, true) => None,
        (None, false) => Some(nix::unistd::getuid().as_raw()),
    };
    let all = a.all || since.is_some() || states.as_ref().is_some_and(States::wants_inactive);
    let c = connect().await?;
    let mut req = json!({"all": all});
    if let Some(u) = user {
        req["userid"] = u.into();
    }
    let mut r = super::rpc_to_rank0(&c, "job-manager.list", &req).await?;
    if let Some(list) = r.get_mut("jobs").and_then(Value::as_array_mut) {
        list.retain(|j| {
            a.name.as_deref().is_none_or(|n| j["name"].as_str() == Some(n))
                && states.as_ref().is_none_or(|s| s.matches(j))
                && since.is_none_or(|t| j["state"] != "INACTIVE" || j["t_inactive"].as_f64().is_some_and(|e| e > t))
        });
        if let Some(n) = a.count {
            list.truncate(n);
        }
    }
    if a.json {
        println!("{r}");
        return Ok(0);
    }
    if !a.no_header {
        println!("{}", format.header());
    }
    let names = std::cell::RefCell::new(std::collections::HashMap::new());
    let user = |uid: u32| names.borrow_mut().entry(uid).or_insert_with(|| user_name(uid)).clone();
    let ctx = Ctx { now, user: &user };
    for j in r["jobs"].as_array().cloned().unwrap_or_default() {
        println!("{}", format.line(&j, &ctx));
    }
    Ok(0)
}

/// Options of `vigil update`.
#[derive(Args, Debug)]
pub struct UpdateArgs {
    /// Job id (f58 or decimal).
    pub id: String,
    /// What to change, KEY=VALUE: `duration` (an RFC 23 duration such as 30m, or seconds; `+10m` and `-10m` change
    /// the current limit; 0 or inf for none), `name`, `urgency` (0 to 31, hold, default, expedite).
    #[arg(required = true, value_name = "KEY=VALUE")]
    pub updates: Vec<String>,
}

/// `vigil update`: every change checked by the job manager at once (all or nothing); silent when it is done.
pub(crate) async fn update(a: UpdateArgs) -> Result<i32, String> {
    let id = JobId::parse(&a.id).map_err(|e| e.to_string())?;
    let mut updates = serde_json::Map::new();
    for kv in &a.updates {
        let (k, v) = kv.split_once('=').ok_or_else(|| format!("{kv}: expected KEY=VALUE (e.g. duration=30m)"))?;
        if updates.insert(k.to_string(), Value::String(v.to_string())).is_some() {
            return Err(format!("{kv}: {k} is given twice"));
        }
    }
    let c = connect().await?;
    c.rpc("job-manager.update", 0, &json!({"id": id.0, "updates": updates}))
        .await
        .map_err(|e| format!("update {}: {}", a.id, e.errstr))?;
    Ok(0)
}

/// Options of `vigil cancel`.
#[derive(Args, Debug)]
pub struct CancelArgs {
    /// Reason recorded in the cancel exception.
    #[arg(short = 'm', long = "message")]
    pub message: Option<String>,
    /// Cancel all your active jobs (pending and running; see --states) instead of the ids given (as `flux
    /// cancel --all`, `scancel -u $USER`).
    #[arg(long, conflicts_with = "ids")]
    pub all: bool,
    /// With --all: only jobs in these states, a comma-separated list of `pending` (not yet running) and
    /// `running` (running or cleaning up).
    #[arg(long, value_delimiter = ',', value_parser = ["pending", "running"])]
    pub states: Vec<String>,
    /// Job ids.
    #[arg(required_unless_present_any = ["all", "states"])]
    pub ids: Vec<String>,
}

/// Whether `--all --states S` takes a job in state `state` (an RFC 21 state name): all active jobs when `states`
/// is empty.
fn cancel_takes(states: &[String], state: &str) -> bool {
    let running = matches!(state, "RUN" | "CLEANUP");
    let pending = matches!(state, "NEW" | "DEPEND" | "PRIORITY" | "SCHED");
    (running || pending)
        && (states.is_empty()
            || (running && states.iter().any(|s| s == "running"))
            || (pending && states.iter().any(|s| s == "pending")))
}

/// `vigil cancel`: the ids given, or with `--all` every active job of the caller's (filtered by `--states`),
/// then a count ("canceled 3 jobs"). Exit code 1 if any cancel was refused (each said on standard error).
pub(crate) async fn cancel(a: CancelArgs) -> Result<i32, String> {
    if !a.states.is_empty() && !a.all {
        return Err(
            "--states picks among your active jobs: use it with --all (vigil cancel --all --states pending)".into()
        );
    }
    let mut ids = a.ids.iter().map(|s| JobId::parse(s).map_err(|e| e.to_string())).collect::<Result<Vec<_>, _>>()?;
    let c = connect().await?;
    if a.all {
        let me = u64::from(nix::unistd::getuid().as_raw());
        let r = c.rpc("job-manager.list", 0, &json!({"all": false, "userid": me})).await.map_err(|e| e.errstr)?;
        ids = r["jobs"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|j| j["userid"].as_u64() == Some(me))
            .filter(|j| cancel_takes(&a.states, j["state"].as_str().unwrap_or("")))
            .filter_map(|j| j["id"].as_u64().map(JobId))
            .collect();
    }
    let mut rc = 0;
    let mut done = 0usize;
    for id in &ids {
        let note = a.message.clone().unwrap_or_else(|| "canceled by user".into());
        match c.rpc("job-manager.cancel", 0, &json!({"id": id.0, "note": note})).await {
            Ok(_) => done += 1,
            Err(e) => {
                eprintln!("vigil: cancel {id}: {}", e.errstr);
                rc = 1;
            }
        }
    }
    if a.all {
        eprintln!("vigil: canceled {done} job{}", if done == 1 { "" } else { "s" });
    }
    Ok(rc)
}

/// `vigil job` subcommands.
#[derive(Subcommand, Debug)]
pub enum JobCmd {
    /// Submit a jobspec file (YAML or JSON; `-` for stdin) and print the job id.
    Submit {
        /// Jobspec file.
        file: String,
    },
    /// Print a job's eventlog (RFC 18).
    Eventlog {
        /// Job id.
        id: String,
        /// Print raw JSON lines.
        #[arg(long)]
        json: bool,
        /// Keep printing new events until the job is inactive.
        #[arg(short = 'f', long)]
        follow: bool,
    },
    /// Attach to a job: stream its output, exit with its exit code.
    Attach {
        /// Job id.
        id: String,
        /// Prefix output lines with the task rank.
        #[arg(short = 'l', long = "label-io")]
        label_io: bool,
    },
    /// Wait for a job to finish and exit with its exit code; the exception that ended it, if one did, is printed on
    /// stderr as `vigil run` prints it (Flux's `flux job wait` says why a job failed too).
    Wait {
        /// Job id.
        id: String,
    },
    /// Cancel a job.
    Cancel(CancelArgs),
    /// Set a pending job's urgency (RFC 21, Flux's `flux job urgency`): 0 to 31, or `hold` (0), `default` (16),
    /// `expedite` (31). Pending jobs start in order of urgency, then of submission. Prints the urgency it had.
    Urgency {
        /// Job id.
        id: String,
        /// The new urgency.
        urgency: String,
    },
    /// Hold pending jobs (urgency 0), as Slurm's `scontrol hold`: they stay pending until released.
    Hold {
        /// Job ids.
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Release held jobs (back to urgency 16), as Slurm's `scontrol release`; a job not held is refused.
    Release {
        /// Job ids.
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Print a job's summary, jobspec and R as JSON (as `flux job info`). The summary's `lost_nodelist` and
    /// `lost_ranks` are the nodes its run lost (a batch or alloc job goes on without them), `nnodes_current` how
    /// many it holds now (`nnodes`: how many it started with).
    Info {
        /// Job id.
        id: String,
        /// Print the reply as JSON (the job's record under "info", its "jobspec" and "R"), for scripts; without
        /// it, the record as aligned `key: value` lines for people.
        #[arg(long)]
        json: bool,
    },
    /// Purge INACTIVE jobs (their records and eventlogs, from the state directory too), as `flux job purge`:
    /// those older than --age-limit, the oldest beyond --num-limit, or the given ids. Without --force, only
    /// says how many would go. A user names its own jobs by id; --age-limit and --num-limit are the instance owner's.
    Purge(PurgeArgs),
}

/// Options of `vigil job purge`.
#[derive(Args, Debug)]
pub struct PurgeArgs {
    /// Purge jobs inactive for longer than this (RFC 23 duration: 30s, 2h, 7d).
    #[arg(long, value_name = "FSD")]
    pub age_limit: Option<String>,
    /// Keep at most this many inactive jobs, purging the oldest.
    #[arg(long, value_name = "N")]
    pub num_limit: Option<u64>,
    /// Purge them (else only count them).
    #[arg(short = 'f', long)]
    pub force: bool,
    /// Job ids to purge (each must be inactive).
    pub ids: Vec<String>,
}

/// `vigil job purge`.
async fn purge(a: PurgeArgs) -> Result<i32, String> {
    let mut body = json!({"force": a.force});
    if let Some(s) = &a.age_limit {
        let v = crate::duration::parse_duration_secs(s)
            .ok()
            .filter(|v| v.is_finite() && *v >= 0.0)
            .ok_or_else(|| format!("--age-limit {s}: expected a finite duration such as 30s, 2h or 7d"))?;
        body["age_limit"] = json!(v);
    }
    if let Some(n) = a.num_limit {
        body["num_limit"] = json!(n);
    }
    if !a.ids.is_empty() {
        let ids = a.ids.iter().map(|s| parse_id(s).map(|id| id.0)).collect::<Result<Vec<_>, _>>()?;
        body["ids"] = json!(ids);
    }
    if a.age_limit.is_none() && a.num_limit.is_none() && a.ids.is_empty() {
        return Err("give --age-limit, --num-limit or job ids".into());
    }
    let c = connect().await?;
    let r = c.rpc("job-manager.purge", 0, &body).await.map_err(|e| e.errstr)?;
    let count = r["count"].as_u64().unwrap_or(0);
    let left = r["inactive"].as_u64().unwrap_or(0);
    if a.force {
        println!("purged {count} inactive job(s); {left} kept");
    } else {
        println!("{count} inactive job(s) would be purged (of {left}); use --force to purge them");
    }
    Ok(0)
}

/// `vigil job hold` and `vigil job release`: each job's urgency set (with `release`, only if it is held); a
/// refusal is said on standard error and the others go on (exit code 1 if any was refused).
async fn urgency_all(ids: &[String], urgency: u32, release: bool) -> Result<i32, String> {
    let ids = ids.iter().map(|s| parse_id(s)).collect::<Result<Vec<_>, _>>()?;
    let c = connect().await?;
    let mut rc = 0;
    for id in ids {
        let body = json!({"id": id.0, "urgency": urgency, "release": release});
        if let Err(e) = c.rpc("job-manager.urgency", 0, &body).await {
            eprintln!("vigil: {} {id}: {}", if release { "release" } else { "hold" }, e.errstr);
            rc = 1;
        }
    }
    Ok(rc)
}

fn parse_id(s: &str) -> Result<JobId, String> {
    JobId::parse(s).map_err(|e| e.to_string())
}

/// `vigil job ...`.
pub(crate) async fn job(cmd: JobCmd) -> Result<i32, String> {
    match cmd {
        JobCmd::Submit { file } => {
            let text = if file == "-" {
                let mut s = String::new();
                std::io::Read::read_to_string(&mut std::io::stdin(), &mut s).map_err(|e| format!("stdin: {e}"))?;
                s
            } else {
                std::fs::read_to_string(&file).map_err(|e| format!("{file}: {e}"))?
            };
            let spec = Jobspec::parse(&text).map_err(|e| format!("{file}: {e}"))?;
            // The checks the instance makes at submission, here too, so that every error names the file.
            spec.validate().map_err(|e| format!("{file}: {e}"))?;
            let mut c = connect().await?;
            let id = submit(&mut c, &spec).await?;
            println!("{id}");
            Ok(0)
        }
        JobCmd::Eventlog { id, json, follow } => {
            let id = parse_id(&id)?;
            let c = connect().await?;
            let mut s = if follow {
                c.rpc_stream("job-manager.eventlog", 0, &json!({"id": id.0, "follow": true}))
            } else {
                c.rpc_stream("job-manager.eventlog", 0, &json!({"id": id.0, "follow": false}))
            }
            .map_err(|e| e.errstr)?;
            while let Some(item) = s.next().await {
                let v = item.map_err(|e| e.errstr)?;
                let Some(e) = v.get("event") else { continue };
                if json {
                    println!("{e}");
                } else {
                    println!("{}", human_event(e));
                }
            }
            Ok(0)
        }
        JobCmd::Attach { id, label_io } => {
            let id = parse_id(&id)?;
            let c = connect().await?;
            followed(attach(&c, id, label_io).await, id)
        }
        JobCmd::Wait { id } => {
            let id = parse_id(&id)?;
            let c = connect().await?;
            let payload = json!({"id": id.0, "follow": true});
            let mut s = c.rpc_stream("job-manager.eventlog", 0, &payload).map_err(|e| e.errstr)?;
            let (mut status, mut fatal): (Option<i32>, Option<String>) = (None, None);
            let mut replayed = None;
            // The fatal exceptions already printed: an eventlog replayed after a restart of rank 0 repeats them.
            let mut told = std::collections::BTreeSet::new();
            loop {
                let item = match replayed.take() {
                    Some(v) => Ok(v),
                    None => match s.next().await {
                        Some(item) => item,
                        None => break,
                    },
                };
                let v = match item {
                    Ok(v) => v,
                    // Rank 0 lost: wait for it if the instance keeps its jobs; the eventlog then comes again
                    // from its start, and the verdict is made again from it.
                    Err(e) if e.errnum == crate::message::errno::EHOSTUNREACH => {
                        match await_rank0(&c, id, "job-manager.eventlog", &payload, &mut None).await {
                            Some((_, ns, first)) => {
                                (s, replayed, status, fatal) = (ns, Some(first), None, None);
                                continue;
                            }
                            None => return followed(Err(e), id),
                        }
                    }
                    Err(e) => return followed(Err(e), id),
                };
                let e = &v["event"];
                match e["name"].as_str() {
                    Some("finish") => status = Some(e["context"]["status"].as_i64().unwrap_or(0) as i32),
                    Some("exception") if e["context"]["severity"].as_u64() == Some(0) && fatal.is_none() => {
                        let kind = e["context"]["type"].as_str().unwrap_or("").to_string();
                        if told.insert(e["timestamp"].to_string()) {
                            eprintln!(
                                "vigil: job {id}: exception type={kind} severity=0: {}",
                                e["context"]["note"].as_str().unwrap_or("")
                            );
                        }
                        fatal = Some(kind);
                    }
                    Some("requeue") => (status, fatal) = (None, None),
                    _ => {}
                }
            }
            Ok(crate::shellproto::job_exit_code(status, fatal.as_deref()))
        }
        JobCmd::Cancel(a) => cancel(a).await,
        JobCmd::Urgency { id, urgency } => {
            let id = parse_id(&id)?;
            let u = match urgency.as_str() {
                "hold" => 0,
                "default" => crate::jobs::DEFAULT_URGENCY,
                "expedite" => crate::jobs::MAX_URGENCY,
                s => s
                    .parse::<u32>()
                    .ok()
                    .filter(|u| *u <= crate::jobs::MAX_URGENCY)
                    .ok_or_else(|| format!("urgency {s}: expected 0 to 31, hold, default or expedite"))?,
            };
            let c = connect().await?;
            let r = c.rpc("job-manager.urgency", 0, &json!({"id": id.0, "urgency": u})).await.map_err(|e| e.errstr)?;
            println!("{}", r["old"]);
            Ok(0)
        }
        JobCmd::Hold { ids } => urgency_all(&ids, 0, false).await,
        JobCmd::Release { ids } => urgency_all(&ids, crate::jobs::DEFAULT_URGENCY, true).await,
        JobCmd::Purge(a) => purge(a).await,
        JobCmd::Info { id, json } => {
            let id = parse_id(&id)?;
            let c = connect().await?;
            let r = c.rpc("job-manager.info", 0, &json!({"id": id.0})).await.map_err(|e| e.errstr)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&r).unwrap_or_default());
            } else {
                print!("{}", super::jobinfo::human(&r["info"], crate::broker_now(), user_name));
            }
            Ok(0)
        }
    }
}

/// One eventlog entry (RFC 18: `timestamp`, `name`, optional `context` object) as a line for people:
/// `TIMESTAMP NAME key=value ...`, the timestamp in seconds with 6 decimals, string values unquoted.
pub(crate) fn human_event(e: &Value) -> String {
    let ctx = e.get("context").and_then(Value::as_object).map(|m| {
        m.iter()
            .map(|(k, v)| format!("{k}={}", v.as_str().map(str::to_string).unwrap_or_else(|| v.to_string())))
            .collect::<Vec<_>>()
            .join(" ")
    });
    format!(
        "{:.6} {} {}",
        e["timestamp"].as_f64().unwrap_or(0.0),
        e["name"].as_str().unwrap_or(""),
        ctx.unwrap_or_default()
    )
    .trim_end()
    .to_string()
}

#[cfg(test)]
mod tests {
    #[test]
    fn cancel_all_takes_active_jobs_by_state() {
        let st = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        for s in ["SCHED", "PRIORITY", "RUN", "CLEANUP"] {
            assert!(super::cancel_takes(&[], s), "{s}");
        }
        assert!(!super::cancel_takes(&[], "INACTIVE"));
        assert!(super::cancel_takes(&st(&["pending"]), "SCHED"));
        assert!(!super::cancel_takes(&st(&["pending"]), "RUN"));
        assert!(super::cancel_takes(&st(&["running"]), "CLEANUP"));
        assert!(!super::cancel_takes(&st(&["running"]), "SCHED"));
        assert!(super::cancel_takes(&st(&["pending", "running"]), "RUN"));
    }
}
