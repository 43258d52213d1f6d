//! The `vigil` command line: `start`, `broker`, job commands (`run`, `submit`, `jobs`, `cancel`, `job ...`),
//! resource and overlay status, attributes. Command shapes follow flux(1) so Flux and Slurm habits carry over.
//!
//! Exit codes: 0 success; 1 error (one line on stderr naming what is wrong); 2 usage error (from clap);
//! `vigil run` / `vigil job wait` / `vigil start` exit with the job's or initial program's exit code, and `vigil
//! run` / `vigil job attach` / `vigil job wait` with 255 when they lost rank 0 while following the job (its exit
//! code is not known then: see `jobcmd/attach.rs`, `EXIT_RANK0_LOST`).

pub(crate) mod history;
mod hostlist;
mod jobcmd;
mod jobinfo;
mod jobsfmt;
mod nested;
mod queue;
mod start;
mod status;
mod submit;
pub mod top;

use crate::keyfile::KeyFile as _;
use clap::{Parser, Subcommand};

/// Top-level options and subcommand.
#[derive(Parser, Debug)]
#[command(
    name = "vigil",
    version,
    about = "Vigil: a failure-aware resource manager for HPC clusters",
    propagate_version = true
)]
pub struct Cli {
    /// Subcommand.
    #[command(subcommand)]
    pub cmd: Cmd,
}

/// `vigil` subcommands.
#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// Start an instance of brokers on this machine and run COMMAND (default: your shell) inside it.
    Start(start::StartArgs),
    /// Run one broker of a system instance from a TOML bootstrap file.
    Broker(start::BrokerArgs),
    /// Submit a job and attach to it: stream its output, exit with its exit code.
    Run(jobcmd::SubmitArgs),
    /// Submit a job and print its id.
    Submit(jobcmd::SubmitArgs),
    /// Submit a batch script to run as the initial program of a new instance on the allocated nodes.
    Batch(nested::BatchArgs),
    /// Allocate nodes as a new instance and run COMMAND (default: your shell) inside it.
    Alloc(nested::AllocArgs),
    /// Run COMMAND (default: your shell) inside a running batch or alloc job's instance.
    Proxy(nested::ProxyArgs),
    /// List jobs.
    Jobs(jobcmd::JobsArgs),
    /// List ended jobs' records, purged ones too: times, nodes, exit code, CPU time, peak memory (as `sacct`).
    History(history::HistoryArgs),
    /// Cancel jobs.
    Cancel(jobcmd::CancelArgs),
    /// Change a job: `vigil update ID duration=30m name=x urgency=20` (Flux's `flux update`). A pending job may
    /// change its time limit, name and urgency; a running job only its time limit, and only down.
    Update(jobcmd::UpdateArgs),
    /// Job subcommands: submit a jobspec file, eventlog, attach, wait, cancel, info.
    #[command(subcommand)]
    Job(jobcmd::JobCmd),
    /// Resource subcommands: status, list, drain, undrain, R, eventlog.
    #[command(subcommand)]
    Resource(status::ResourceCmd),
    /// Overlay subcommands: status.
    #[command(subcommand)]
    Overlay(status::OverlayCmd),
    /// Show the instance's state, size, depth, uptime and transport, and one broker's detectors, metrics
    /// endpoint and health check (rank 0's unless `-r`).
    Uptime(status::UptimeArgs),
    /// A full-screen live view: the tree's health, nodes by state, the queue with pending reasons, recent
    /// verdicts (the `vigil-top` program, as `flux top`; Enter descends into a batch or alloc job's instance).
    Top(top::TopArgs),
    /// Stop the whole instance: every broker, every job shell (rank 0's jobs stay in its state directory, if any).
    Shutdown(status::ShutdownArgs),
    /// Print the value of a broker attribute.
    Getattr(status::GetattrArgs),
    /// List broker attributes.
    Lsattr(status::LsattrArgs),
    /// Send a ping to a rank and print the round-trip time.
    Ping(status::PingArgs),
    /// Publish or subscribe to events (sequenced by rank 0, delivered to every broker).
    #[command(subcommand)]
    Event(status::EventCmd),
    /// Write a new overlay key file (mode 0600) for a system instance (see docs/system-instance.md).
    Keygen(KeygenArgs),
    /// Expand, compress, count, pick from and combine host lists (`node[1-4,7]`, RFC 29), as `flux hostlist`.
    Hostlist(hostlist::HostlistArgs),
    /// Internal: discover this node with hwloc for a starting broker and print it as JSON.
    #[command(hide = true)]
    DiscoverNode(DiscoverNodeArgs),
}

/// `vigil discover-node` (internal: a starting broker runs it, so that hwloc's memory is not the broker's).
#[derive(clap::Args, Debug)]
pub struct DiscoverNodeArgs {
    /// Topology source: `live`, `synthetic:DESC` or `xml:PATH`.
    #[arg(long)]
    pub source: String,
    /// Where to write a live topology as hwloc XML, for the node's job shells.
    #[arg(long)]
    pub xml: std::path::PathBuf,
    /// Declared GPU count, overriding discovery.
    #[arg(long)]
    pub gpus: Option<u32>,
}

/// `vigil keygen`.
#[derive(clap::Args, Debug)]
pub struct KeygenArgs {
    /// The key file to write, e.g. /etc/vigil/overlay.key; name it as `overlay_key` in the `[bootstrap]` table
    /// and copy it to every node.
    pub file: std::path::PathBuf,
    /// Replace an existing file (every broker of the instance then needs the new key).
    #[arg(long)]
    pub force: bool,
}

/// `vigil keygen FILE`: a fresh key, written mode 0600; refuses to replace a file without `--force`.
fn keygen(a: KeygenArgs) -> i32 {
    let r = crate::keyfile::OverlayKey::generate().and_then(|k| k.write(&a.file, a.force));
    match r {
        Ok(()) => {
            eprintln!(
                "vigil: wrote overlay key {} (mode 0600): copy it to every node of the instance",
                a.file.display()
            );
            0
        }
        Err(e) => fail(e.to_string()),
    }
}

/// Entry point of the `vigil` binary; returns the process exit code.
pub fn main() -> i32 {
    let cli = Cli::parse();
    if !matches!(
        cli.cmd,
        Cmd::Run(_) | Cmd::Job(jobcmd::JobCmd::Attach { .. }) | Cmd::Start(_) | Cmd::Broker(_) | Cmd::Alloc(_)
    ) {
        // Listing commands behave like Unix filters: `vigil jobs | head` ends quietly on a closed pipe.
        // SAFETY: restoring the default disposition of SIGPIPE before any thread starts.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    match cli.cmd {
        Cmd::Start(a) => start::start(a),
        Cmd::Broker(a) => start::broker(a),
        Cmd::Keygen(a) => keygen(a),
        Cmd::Hostlist(a) => hostlist::hostlist(a),
        Cmd::Top(a) => top::exec_top(&a),
        Cmd::DiscoverNode(a) => {
            // SAFETY: no thread has started yet.
            unsafe { crate::hwloc::skip_unused_plugins() };
            crate::broker::discover_node_main(&a.source, a.gpus, &a.xml)
        }
        cmd => {
            let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => return fail(format!("cannot start runtime: {e}")),
            };
            let code = rt.block_on(async move {
                let bare = queue::signal_bare(std::env::args().skip(1));
                let spaced = |q: &mut queue::QueueOpts, c: &mut Vec<String>| {
                    let note = queue::spaced_signal(q, c, bare)?;
                    if let Some(n) = note {
                        eprintln!("{n}");
                    }
                    Ok::<(), String>(())
                };
                let r = match cmd {
                    Cmd::Run(mut a) => match spaced(&mut a.queue, &mut a.command) {
                        Ok(()) => jobcmd::run(a, true).await,
                        Err(e) => Err(e),
                    },
                    Cmd::Submit(mut a) => match spaced(&mut a.queue, &mut a.command) {
                        Ok(()) => jobcmd::run(a, false).await,
                        Err(e) => Err(e),
                    },
                    Cmd::Batch(mut a) => match spaced(&mut a.opts.queue, &mut a.script) {
                        Ok(()) => nested::batch(a).await,
                        Err(e) => Err(e),
                    },
                    Cmd::Alloc(mut a) => match spaced(&mut a.opts.queue, &mut a.command) {
                        Ok(()) => nested::alloc(a).await,
                        Err(e) => Err(e),
                    },
                    Cmd::Proxy(a) => nested::proxy(a).await,
                    Cmd::Jobs(a) => jobcmd::jobs(a).await,
                    Cmd::History(a) => history::history(a).await,
                    Cmd::Cancel(a) => jobcmd::cancel(a).await,
                    Cmd::Update(a) => jobcmd::update(a).await,
                    Cmd::Job(c) => jobcmd::job(c).await,
                    Cmd::Resource(c) => status::resource(c).await,
                    Cmd::Overlay(c) => status::overlay(c).await,
                    Cmd::Uptime(a) => status::uptime(a).await,
                    Cmd::Shutdown(a) => status::shutdown(a).await,
                    Cmd::Getattr(a) => status::getattr(a).await,
                    Cmd::Lsattr(a) => status::lsattr(a).await,
                    Cmd::Ping(a) => status::ping(a).await,
                    Cmd::Event(c) => status::event(c).await,
                    Cmd::Start(_)
                    | Cmd::Broker(_)
                    | Cmd::Keygen(_)
                    | Cmd::Hostlist(_)
                    | Cmd::Top(_)
                    | Cmd::DiscoverNode(_) => Ok(0),
                };
                r.unwrap_or_else(fail)
            });
            // Not the runtime's drop, which waits for its blocking threads: one may sit in a read of a terminal's
            // standard input (`vigil run` forwards it) until the user presses a key, long after the job ended.
            rt.shutdown_background();
            code
        }
    }
}

/// Print `vigil: msg` to stderr and return exit code 1.
pub(crate) fn fail(msg: String) -> i32 {
    eprintln!("vigil: {msg}");
    1
}

/// Connect to `$VIGIL_URI`, mapping errors to one line.
pub(crate) async fn connect() -> Result<crate::client::Client, String> {
    crate::client::Client::connect_env().await.map_err(|e| connect_error(&e))
}

/// What a command says when it cannot reach its broker: the error, and when nothing listens on the socket
/// (refused, or no such file) what that usually means, rather than a bare `os error 111`.
pub(crate) fn connect_error(e: &crate::client::ConnectError) -> String {
    use std::io::ErrorKind;
    match e {
        crate::client::ConnectError::Io { err, .. }
            if matches!(err.kind(), ErrorKind::ConnectionRefused | ErrorKind::NotFound) =>
        {
            format!(
                "{e} (no broker listens there: the instance has ended, or this node's broker is down or \
                 restarting; with a state directory, rank 0 keeps the jobs across its restart)"
            )
        }
        // Accepted, then dropped before its welcome: the broker was going away (a rank 0 killed or stopping).
        crate::client::ConnectError::Protocol(why)
            if ["Connection reset", "end of file", "closed", "Broken pipe"].iter().any(|w| why.contains(w)) =>
        {
            format!(
                "{e} (the broker dropped the connection before welcoming it: it is stopping or restarting; with a \
                 state directory, rank 0 keeps the jobs across its restart)"
            )
        }
        _ => e.to_string(),
    }
}

/// How long a command waits for rank 0's answer before it says why it may be slow ([`rpc_to_rank0`]).
pub(crate) const SLOW_RANK0_NOTICE: std::time::Duration = std::time::Duration::from_secs(3);

/// `c.rpc(topic, 0, payload)` for a command that lists what rank 0 knows (`vigil jobs`, `vigil resource ...`) or
/// submits to it (`vigil submit`, `batch`, `run`), saying once on standard error (once per command), if no answer
/// came within [`SLOW_RANK0_NOTICE`], that it goes on waiting and why the answer may be late: while rank 0
/// restarts, the broker the command is connected to keeps requests for it (`tbon.parent_grace`) and sends them
/// once it is back, so the command otherwise waits without a word.
///
/// # Errors
/// The request's error string.
pub(crate) async fn rpc_to_rank0(
    c: &crate::client::Client,
    topic: &str,
    payload: &serde_json::Value,
) -> Result<serde_json::Value, String> {
    rpc_to_rank0_err(c, topic, payload).await.map_err(|e| e.errstr)
}

/// [`rpc_to_rank0`], with the error's errno (`submit.rs` tells a lost connection from a refusal).
///
/// # Errors
/// The request's error.
pub(crate) async fn rpc_to_rank0_err(
    c: &crate::client::Client,
    topic: &str,
    payload: &serde_json::Value,
) -> Result<serde_json::Value, crate::client::RpcError> {
    noticed_if_slow(c, c.rpc(topic, 0, payload)).await
}

/// [`rpc_to_rank0`], the answer's payload unparsed ([`crate::client::Client::rpc_bytes`]).
///
/// # Errors
/// The request's error.
pub(crate) async fn rpc_to_rank0_bytes(
    c: &crate::client::Client,
    topic: &str,
    payload: &serde_json::Value,
) -> Result<Vec<u8>, String> {
    noticed_if_slow(c, c.rpc_bytes(topic, 0, payload)).await.map_err(|e| e.errstr)
}

/// `call`'s outcome (a request on `c`); a notice on standard error ([`slow_notice`]) if rank 0 takes longer than
/// [`SLOW_RANK0_NOTICE`] to answer.
async fn noticed_if_slow<T>(c: &crate::client::Client, call: impl std::future::Future<Output = T>) -> T {
    tokio::pin!(call);
    tokio::select! {
        r = &mut call => return r,
        () = tokio::time::sleep(SLOW_RANK0_NOTICE) => {}
    }
    // Once per command: the copies of `vigil submit --cc` wait together.
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
        eprintln!("{}", slow_notice(&c.welcome));
    }
    call.await
}

/// What a command says when rank 0 is slow to answer, its connection's broker having said `w`: that it waits; and
/// that a restarting rank 0 would explain it only where rank 0 can restart and the request is kept meanwhile,
/// i.e. connected to another broker (it keeps requests for rank 0 while it waits for it), or to a rank 0 that keeps
/// its jobs across a restart (`rank0_grace` > 0: a state directory). A rank 0 without one is just busy.
fn slow_notice(w: &crate::client::Welcome) -> String {
    let secs = SLOW_RANK0_NOTICE.as_secs();
    if w.rank != 0 {
        format!(
            "vigil: no answer from rank 0 after {secs} s; waiting (rank 0 is busy, or restarting: this node's broker \
             keeps the request until it is back; Ctrl-C to stop)"
        )
    } else if w.rank0_grace > 0.0 {
        format!(
            "vigil: no answer from rank 0 after {secs} s; waiting (rank 0 is busy, or restarting: it keeps its jobs \
             across a restart; Ctrl-C to stop)"
        )
    } else {
        format!("vigil: no answer from rank 0 after {secs} s; waiting (rank 0 is busy; Ctrl-C to stop)")
    }
}

/// Parse `-S name=value` pairs.
pub(crate) fn parse_attrs(list: &[String]) -> Result<std::collections::BTreeMap<String, String>, String> {
    let mut m = std::collections::BTreeMap::new();
    for s in list {
        let (k, v) = s.split_once('=').ok_or_else(|| format!("-S {s}: expected ATTR=VALUE"))?;
        if k.is_empty() {
            return Err(format!("-S {s}: empty attribute name"));
        }
        // Set twice to different values: which one was meant is not ours to guess.
        if let Some(old) = m.insert(k.to_string(), v.to_string()) {
            if old != v {
                return Err(format!("-S {k}: set twice, to '{old}' and to '{v}'"));
            }
        }
    }
    Ok(m)
}

/// Human-readable duration for tables: `45s`, `3.2m`, `1.5h`, `2.1d`.
pub(crate) fn fmt_secs(s: f64) -> String {
    if s < 60.0 {
        format!("{s:.1}s")
    } else if s < 3600.0 {
        format!("{:.1}m", s / 60.0)
    } else if s < 86400.0 {
        format!("{:.1}h", s / 3600.0)
    } else {
        format!("{:.1}d", s / 86400.0)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_socket_nobody_listens_on_gets_a_hint() {
        use crate::client::ConnectError;
        let io = |k| ConnectError::Io { path: "/run/x/local-0".into(), err: std::io::Error::from(k) };
        let refused = super::connect_error(&io(std::io::ErrorKind::ConnectionRefused));
        assert!(refused.starts_with("cannot connect to /run/x/local-0") && refused.contains("restarting"), "{refused}");
        assert!(super::connect_error(&io(std::io::ErrorKind::NotFound)).contains("no broker listens there"));
        assert!(!super::connect_error(&io(std::io::ErrorKind::PermissionDenied)).contains("no broker"));
        // Found by a fresh-user trial: a client connecting while rank 0 was being killed got only the raw error.
        let reset = ConnectError::Protocol("i/o: Connection reset by peer (os error 104)".into());
        let said = super::connect_error(&reset);
        assert!(said.contains("Connection reset") && said.contains("stopping or restarting"), "{said}");
        let odd = ConnectError::Protocol("unexpected Event 'x'".into());
        assert!(!super::connect_error(&odd).contains("restarting"));
    }

    #[test]
    fn a_slow_rank0_is_said_to_restart_only_where_it_can() {
        let w = |rank, rank0_grace| crate::client::Welcome { rank, rank0_grace, ..Default::default() };
        // Connected to a rank 0 without a state directory: it cannot restart and keep the request.
        let plain = super::slow_notice(&w(0, 0.0));
        assert!(plain.contains("rank 0 is busy") && !plain.contains("restart"), "{plain}");
        assert!(super::slow_notice(&w(0, 30.0)).contains("restarting"));
        assert!(super::slow_notice(&w(3, 0.0)).contains("this node's broker keeps the request"));
    }

    #[test]
    fn an_attribute_set_twice_to_different_values_is_refused() {
        let a = |v: &[&str]| super::parse_attrs(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(a(&["tbon.topo=kary:2", "tbon.topo=kary:2"]).unwrap()["tbon.topo"], "kary:2");
        let e = a(&["tbon.topo=kary:2", "tbon.topo=binomial"]).unwrap_err();
        assert!(e.contains("set twice") && e.contains("kary:2") && e.contains("binomial"), "{e}");
    }
}
