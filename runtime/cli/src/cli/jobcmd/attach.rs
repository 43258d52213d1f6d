//! Following a job to its end: its output and exceptions as they come ([`attach`]), a note while it is pending,
//! waiting for a lost rank 0 to come back ([`await_rank0`]), and the exit code when it does not ([`followed`]).

use crate::client::Client;
use crate::jobs::JobId;
use serde_json::{json, Value};
use std::io::Write;

/// The exit code of `vigil run`, `vigil job attach` and `vigil job wait` when they lose rank 0 (stopped,
/// restarted, killed) while they follow a job: 255, as ssh(1) exits 255 when its connection fails rather than with
/// the remote command's status. The job itself may well run on (with a state directory rank 0 comes back with it),
/// so its exit code is not known. A job can exit 255 too (`exit -1`): the line on stderr says which it was.
pub(crate) const EXIT_RANK0_LOST: i32 = 255;

/// What a command that followed job `id` to its end exits with: its `Ok` code, or, when its connection to rank 0
/// was lost (the connection to our broker ended, or our broker answered EHOSTUNREACH: it lost rank 0),
/// [`EXIT_RANK0_LOST`] after saying how to find the job again; any other error as it is.
pub(super) fn followed(r: Result<i32, crate::client::RpcError>, id: JobId) -> Result<i32, String> {
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

/// Who follows a job in [`attach`]: the command that submitted it and lives for it, or a viewer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Follower {
    /// `vigil run`: the job is its, so SIGTERM or a closed stdout cancel the job (as srun's do).
    Run,
    /// `vigil job attach`: a viewer; SIGTERM or a closed stdout end the viewing only (exit 143 or 141), and the
    /// job goes on, as `flux job attach` killed by `timeout` or piped into `head` leaves it.
    Attach,
}

/// Stream a job's output and exceptions until it is INACTIVE; return its exit code.
/// Ctrl-C once cancels the job (and keeps waiting for it to end); Ctrl-C twice detaches. SIGTERM, or our stdout
/// closed (`vigil run ... | head`), cancel the job too for `vigil run`, as srun does, and only detach a viewer
/// ([`Follower::Attach`]). If rank 0 is lost meanwhile
/// and the instance keeps its jobs while it restarts (a state directory: [`await_rank0`]), this waits for it and
/// goes on where it was, printing nothing twice.
pub(crate) async fn attach(c: &Client, id: JobId, label: bool, who: Follower) -> Result<i32, crate::client::RpcError> {
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
                if who == Follower::Attach {
                    let _ = stdout.flush();
                    eprintln!("vigil: detached from job {id} (terminated); the job goes on");
                    return Ok(128 + libc::SIGTERM);
                }
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
                if who == Follower::Attach {
                    // A viewer whose reader left (`| head`): it stops viewing, the job goes on.
                    return Ok(128 + libc::SIGPIPE);
                }
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
pub(super) async fn await_rank0(
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
