//! The node health check's I/O (`health.program`): runs the program when the rule says
//! ([`vigil_core::health::HealthCheck`]), reads a bounded first line of its output, kills it with its process
//! group at its timeout, and asks rank 0 to drain or undrain this node through this broker's local connector,
//! as `vigil resource drain` does (`resource.drain` / `resource.undrain` with `"by": "health"`).
//!
//! The program runs in its own process group with standard input from `/dev/null`, standard output and error
//! into one pipe, and `VIGIL_BROKER_RANK` and `VIGIL_URI` (this broker's local connector) in its environment.
//! Only the first line of its output is kept ([`LINE_MAX`] bytes at most); the rest is read and thrown away as
//! it comes, so a program that writes megabytes never blocks on a full pipe and costs no memory. When it exits,
//! what is left of its process group is killed (a check leaves nothing behind).

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::AsyncReadExt;
use tokio::sync::mpsc;
use tracing::{info, warn};
use vigil_core::health::{Action, Config, HealthCheck, Level, Outcome, Status, LINE_MAX};

/// How long, after the program exited and its process group was killed, its first line may still take to arrive.
const LINE_GRACE: Duration = Duration::from_secs(1);

/// The health check's state as status output shows it, shared with the driver ([`Status`], and when it changed).
pub(super) type Shared = Arc<Mutex<(Status, u64)>>;

/// What the task's helpers report.
enum Done {
    /// Run `run` ended.
    Run(u64, Outcome),
    /// Rank 0 answered a request.
    Answer(Result<(), String>),
}

/// Start the health check of broker `rank` (whose local connector is `uri`) when `health.program` is set; its
/// state goes to `shared`.
pub(super) fn start(cfg: &vigil_core::attrs::BrokerConfig, rank: u32, uri: &str, shared: &Shared) {
    let Some(program) = cfg.health_program.clone() else { return };
    let rule =
        Config { program: program.display().to_string(), interval: cfg.health_interval, timeout: cfg.health_timeout };
    info!(program = %rule.program, interval = rule.interval, timeout = rule.timeout, "health check on");
    tokio::spawn(run(rule, program, rank, uri.to_string(), shared.clone()));
}

/// The process group of the run under way (its leader's pid; 0: none), for [`stop`] when the broker exits: the
/// loop's task is dropped then, and dropping the child kills only the program itself, not what it started.
static RUNNING_GROUP: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// The broker is exiting: kill the process group of the run under way, if any (a check leaves nothing behind).
pub(super) fn stop() {
    let pgid = RUNNING_GROUP.swap(0, std::sync::atomic::Ordering::SeqCst);
    if pgid > 0 {
        kill_group(pgid);
    }
}

/// The health check's loop: never ends while the broker runs, never panics on what the program does.
async fn run(cfg: Config, program: PathBuf, rank: u32, uri: String, shared: Shared) {
    let origin = Instant::now();
    let now = move || origin.elapsed().as_secs_f64();
    let mut rule = HealthCheck::new(cfg, now());
    let (tx, mut rx) = mpsc::unbounded_channel::<Done>();
    // The running program's process group (its pid), for a kill at its timeout.
    let mut running: Option<(u64, i32)> = None;
    loop {
        while let Some(a) = rule.poll_action() {
            match a {
                Action::Run { run } => match spawn(&program, rank, &uri) {
                    Ok((child, out)) => {
                        running = child.id().map(|pid| (run, pid as i32));
                        if let Some((_, pgid)) = running {
                            RUNNING_GROUP.store(pgid, std::sync::atomic::Ordering::SeqCst);
                        }
                        tokio::spawn(wait(run, child, out, tx.clone()));
                    }
                    Err(e) => rule.finished(now(), run, Outcome::NotRun(e)),
                },
                Action::Kill { run } => {
                    if let Some((r, pgid)) = running.take() {
                        if r == run {
                            kill_group(pgid);
                        }
                    }
                }
                Action::Drain { reason } => {
                    let body = serde_json::json!({"ranks": rank.to_string(), "reason": reason, "by": "health"});
                    tokio::spawn(ask(uri.clone(), "resource.drain", body, tx.clone()));
                }
                Action::Undrain => {
                    let body = serde_json::json!({"ranks": rank.to_string(), "by": "health"});
                    tokio::spawn(ask(uri.clone(), "resource.undrain", body, tx.clone()));
                }
                Action::Report { level: Level::Warn, text } => warn!("{text}"),
                Action::Report { level: Level::Info, text } => info!("{text}"),
            }
        }
        if let Ok(mut s) = shared.lock() {
            let st = rule.status();
            if s.0 != st {
                *s = (st, s.1 + 1);
            }
        }
        let wait = Duration::from_secs_f64((rule.next_deadline() - now()).clamp(0.0, 86400.0));
        tokio::select! {
            _ = tokio::time::sleep(wait) => rule.tick(now()),
            d = rx.recv() => match d {
                Some(Done::Run(run, outcome)) => {
                    if running.is_some_and(|(r, _)| r == run) {
                        running = None;
                    }
                    rule.finished(now(), run, outcome);
                }
                Some(Done::Answer(a)) => rule.answered(now(), a),
                None => return,
            },
        }
    }
}

/// Start the program; its child and the read end of its output pipe.
///
/// # Errors
/// It cannot be started: why (`No such file or directory`, `Permission denied`...).
fn spawn(program: &PathBuf, rank: u32, uri: &str) -> Result<(tokio::process::Child, std::io::PipeReader), String> {
    let (r, w) = std::io::pipe().map_err(|e| format!("no pipe for its output: {e}"))?;
    let w2 = w.try_clone().map_err(|e| format!("no pipe for its output: {e}"))?;
    let mut cmd = std::process::Command::new(program);
    cmd.env("VIGIL_BROKER_RANK", rank.to_string())
        .env("VIGIL_URI", uri)
        .stdin(std::process::Stdio::null())
        .stdout(w)
        .stderr(w2)
        .process_group(0);
    let mut cmd = tokio::process::Command::from(cmd);
    cmd.kill_on_drop(true);
    // The command (and its copies of the write end) is dropped here: the pipe ends when the program's group does.
    let child = cmd.spawn().map_err(|e| e.to_string())?;
    Ok((child, r))
}

/// Wait for run `run`'s end and report it with its first output line.
async fn wait(run: u64, mut child: tokio::process::Child, out: std::io::PipeReader, tx: mpsc::UnboundedSender<Done>) {
    let (line_tx, line_rx) = tokio::sync::oneshot::channel();
    let reader = tokio::spawn(read_first_line(out, line_tx));
    // Its process group: taken before the wait, which forgets the pid.
    let pgid = child.id();
    let status = child.wait().await;
    // What is left of its group goes too (a check leaves nothing behind), so the pipe ends soon after.
    if let Some(pgid) = pgid {
        kill_group(pgid as i32);
        let _ = RUNNING_GROUP.compare_exchange(
            pgid as i32,
            0,
            std::sync::atomic::Ordering::SeqCst,
            std::sync::atomic::Ordering::SeqCst,
        );
    }
    let outcome = match status {
        Err(e) => Outcome::NotRun(format!("cannot wait for it: {e}")),
        Ok(st) => {
            let line = tokio::time::timeout(LINE_GRACE, line_rx).await.ok().and_then(Result::ok).unwrap_or_default();
            use std::os::unix::process::ExitStatusExt;
            match (st.code(), st.signal()) {
                (Some(code), _) => Outcome::Exited { code, line },
                (None, Some(signal)) => Outcome::Signaled { signal, line },
                (None, None) => Outcome::Exited { code: -1, line },
            }
        }
    };
    reader.abort();
    let _ = tx.send(Done::Run(run, outcome));
}

/// Read the first line of the program's output (at most [`LINE_MAX`] bytes) and send it; then read and discard
/// the rest until the pipe ends, so the program never blocks on it.
async fn read_first_line(out: std::io::PipeReader, line_tx: tokio::sync::oneshot::Sender<String>) {
    let Ok(mut rx) = tokio::net::unix::pipe::Receiver::from_owned_fd(out.into()) else {
        let _ = line_tx.send(String::new());
        return;
    };
    let mut line = Vec::with_capacity(LINE_MAX);
    let mut buf = vec![0u8; 64 << 10];
    let mut line_tx = Some(line_tx);
    loop {
        let n = match rx.read(&mut buf).await {
            Ok(0) | Err(_) => 0,
            Ok(n) => n,
        };
        if line_tx.is_some() {
            let chunk = &buf[..n];
            let end = chunk.iter().position(|b| *b == b'\n');
            let take = end.unwrap_or(n).min(LINE_MAX - line.len());
            line.extend_from_slice(&chunk[..take]);
            if n == 0 || end.is_some() || line.len() >= LINE_MAX {
                if let Some(tx) = line_tx.take() {
                    let _ = tx.send(String::from_utf8_lossy(&line).into_owned());
                }
            }
        }
        if n == 0 {
            return;
        }
    }
}

/// SIGKILL process group `pgid` (the program's: it leads its own); gone already is fine.
fn kill_group(pgid: i32) {
    use nix::sys::signal::{killpg, Signal};
    let _ = killpg(nix::unistd::Pid::from_raw(pgid), Signal::SIGKILL);
}

/// Send `topic` to rank 0 through the local connector at `uri`; report the answer.
async fn ask(uri: String, topic: &'static str, body: serde_json::Value, tx: mpsc::UnboundedSender<Done>) {
    let answer = match vigil_client::Client::connect(&uri).await {
        Err(e) => Err(e.to_string()),
        Ok(c) => c.rpc(topic, 0, &body).await.map(|_| ()).map_err(|e| e.errstr),
    };
    let _ = tx.send(Done::Answer(answer));
}
