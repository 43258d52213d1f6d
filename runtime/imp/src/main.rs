//! # vigil-imp: the privileged launcher of a multi-user system instance
//!
//! A multi-user system instance (`[access] allow-guest-users = true`) runs each job's shell as the job's
//! submitter. Brokers running as an unprivileged user (`vigil`) cannot do that themselves: they ask `vigil-imp`,
//! installed setuid root (`chown root:root; chmod 4755`), or run by a broker that is root (then it need not be
//! setuid). It checks that the submitter asked for this very job, with a munge credential the submitter made over
//! the jobspec, becomes that user and executes the job shell. Its threat model is in docs/security.md.
//!
//! ## Invocation
//!
//! ```text
//! vigil-imp exec SHELL [ARGS...]      # the request on standard input, below
//! vigil-imp kill CGROUP SIGNAL [PID]  # a signal to a job's processes (below)
//! ```
//!
//! `kill` lets the broker user signal a guest's job, whose processes are another user's: `SIGNAL` (a number,
//! 1 to 64) goes to every process in the cgroup directory `CGROUP` and the cgroups below it, or to `PID` alone
//! if it is one of them. The caller must be the broker user and `CGROUP` a cgroup2 directory strictly under
//! `cgroup-root`: the brokers' delegated subtree, into which only the brokers (and this program, for the jobs it
//! starts) put processes, since moving a process into a cgroup needs write access to the cgroup above both, which
//! only root has. It exits 0 when the signal was sent to each (a process that ended meanwhile is not an error).
//!
//! The request comes on standard input, framed so that `vigil-imp` reads exactly its own bytes and leaves the
//! rest of the stream to the shell it executes (which inherits standard input, output and error): the broker
//! writes the request, then the shell's own input, on one pipe. The request is a header of `key=value` lines
//! after a first line `vigil-imp 1`, ended by an empty line, then the jobspec's bytes:
//!
//! ```text
//! vigil-imp 1
//! uid=1001                                  # the job's user (its submitter)
//! cgroup=/sys/fs/cgroup/vigil/job-f3xK      # optional: the job's cgroup, under the configured cgroup-root
//! credential=MUNGE:AwQDAAD...:              # the submitter's munge credential (below)
//! jobspec-bytes=1234                        # the length of what follows the empty line
//!
//! {"version":1,"resources":...}             # exactly jobspec-bytes bytes: the jobspec as submitted
//! ```
//!
//! The header is at most [`request::MAX_HEADER`] bytes and the jobspec at most [`request::MAX_JOBSPEC`].
//! Unknown keys are refused (so that a later version's request is not half understood).
//!
//! ## The credential
//!
//! `vigil submit` (the client crate's `munge` module) makes the credential as the submitting user with
//! `munge_encode`, over this payload (text, `\n`-terminated lines, in this order):
//!
//! ```text
//! vigil-imp-credential 1
//! instance=NAME                             # the instance's name (its bootstrap `instance`)
//! jobspec-sha256=HEX                        # lowercase SHA-256 of the jobspec's bytes, as the IMP receives them
//! ```
//!
//! The jobspec's bytes are the compact JSON text the submitter sent (`serde_json::to_string` of the jobspec); a
//! broker that hands a job to `vigil-imp` gives it that text, unchanged.
//!
//! ## What it checks, in this order (any failure: a message on standard error and an [`Exit`] code)
//!
//! 1. Its configuration, `/etc/vigil/imp.toml` ([`config`]): a regular file owned by root, neither group- nor
//!    world-writable, in directories owned by root that nobody else may write to (a world-writable directory is
//!    accepted only with its sticky bit). The path is fixed at build time (`VIGIL_IMP_CONFIG_PATH` in the
//!    environment of `cargo build`); at run time `$VIGIL_IMP_CONFIG` names another one only when `vigil-imp`
//!    gained no privilege by being executed (the kernel's `AT_SECURE` is 0: not setuid, setgid nor with file
//!    capabilities). It then runs with its caller's own privileges, so a configuration of the caller's choosing
//!    lets it do nothing the caller could not: this is what the tests use, as root.
//! 2. Its caller: its real uid must be the configured `broker-user`'s.
//! 3. The request's header and the shell: `SHELL` must be one of `allowed-shells`, exactly, and a regular file
//!    owned by root that nobody else may write to.
//! 4. The job's user: never root unless `allow-root = true`; one of `allowed-users` where that is set; known to
//!    the node's user database.
//! 5. The job's cgroup, when given: a directory of a cgroup2 file system strictly under `cgroup-root`.
//! 6. The credential, decoded by the node's munged (`munge-socket`, or munge's default): munge must have made it
//!    with its key (a forged, altered or another key's credential is refused with munge's reason, as is one made
//!    in the future); its uid must be the request's `uid`; its payload must name this instance (`instance` in the
//!    configuration) and the SHA-256 of the jobspec received; and it must be at most `credential-max-age`
//!    seconds old (below). Nothing before this step consumes the credential: a request refused earlier leaves it
//!    usable.
//!
//! ## Credentials that wait
//!
//! A job may wait in the queue longer than munge's TTL (300 s by default, at most munged's `--max-ttl`), and a
//! job requeued after a node failed starts again, perhaps on a node whose munged decoded its credential before.
//! munge's own time and replay checks would refuse both, so they are not this program's rule: a credential past
//! its TTL (`EMUNGE_CRED_EXPIRED`) or decoded before on this node (`EMUNGE_CRED_REPLAYED`) is still good when
//! munge verified it, it binds the user, instance and jobspec as above, and it was made at most
//! `credential-max-age` seconds ago (default 7 days) by munge's encode time. What munge's TTL guarded, that a
//! credential is used at once, rank 0 enforces where the submitter is: it refuses a submission whose credential
//! a job of its own already has (a replay). What the broker user can do with a credential it holds is bounded
//! by the binding: run that user's very jobspec, in this instance, within the max age (docs/security.md).
//!
//! Then it joins the job's cgroup (writes its pid to `cgroup.procs`, unless the broker created it there), sets its
//! groups (`initgroups`), its gid and
//! its uid (real, effective and saved), checks that it can no longer become root again (`setresuid(0, 0, 0)` and
//! `setresgid(0, 0, 0)` must fail, unless the job's user is root), marks every descriptor above 2
//! close-on-exec, and executes `SHELL ARGS...` with an environment of its own making: the caller's `VIGIL_*`
//! variables (the broker's URI for the shell, its rank...), `HOME`, `USER`, `LOGNAME` and `SHELL` from the
//! user's account, `PATH=/usr/local/bin:/usr/bin:/bin`, and `VIGIL_IMP_JOBSPEC_SHA256` (the jobspec it
//! checked), which the job shell must compare with the jobspec it is given before it runs anything. Nothing
//! else of the caller's environment (`LD_PRELOAD`...) reaches the shell.

mod config;
mod ids;
mod munge;
mod request;

use std::ffi::OsString;
use std::process::ExitCode;

/// `vigil-imp`'s exit codes when it refuses (once the shell is executed, the exit code is the shell's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Exit {
    /// The command line is not `vigil-imp exec SHELL [ARGS...]`.
    Usage = 64,
    /// The configuration is missing, unsafe (owner, mode) or malformed.
    Config = 65,
    /// The caller is not the configured broker user.
    Caller = 66,
    /// The request on standard input is malformed, or names a shell, user or cgroup that is not allowed.
    Request = 67,
    /// The credential is refused (by munge, or it does not cover this user, jobspec or instance).
    Credential = 68,
    /// Becoming the user failed (cgroup, groups, ids), the shell could not be executed, or a signal not sent.
    Launch = 69,
}

/// A refusal: its message and exit code.
#[derive(Debug)]
struct Refusal {
    exit: Exit,
    message: String,
}

impl Refusal {
    fn new(exit: Exit, message: impl Into<String>) -> Refusal {
        Refusal { exit, message: message.into() }
    }
}

fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let r = match args.first() {
        Some(c) if c == "kill" => kill(&args[1..]),
        _ => run(&args).map(|never| match never {}),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(r) => {
            eprintln!("vigil-imp: {}", r.message);
            ExitCode::from(r.exit as u8)
        }
    }
}

/// The usage line.
const USAGE: &str = "usage: vigil-imp exec SHELL [ARGS...] (the request on standard input: see its crate docs), or \
                     vigil-imp kill CGROUP SIGNAL [PID]";

/// The configuration, loaded and checked, and the caller checked against its broker user.
fn load_for_caller() -> Result<config::Config, Refusal> {
    let path = config::path();
    let cfg = config::Config::load(&path).map_err(|e| Refusal::new(Exit::Config, e))?;
    // SAFETY: getuid cannot fail and touches no memory.
    let caller = unsafe { libc::getuid() };
    if caller != cfg.broker_uid {
        return Err(Refusal::new(
            Exit::Caller,
            format!(
                "refused: run by uid {caller}, but only the broker user {} (uid {}) may run it ({})",
                cfg.broker_user,
                cfg.broker_uid,
                path.display()
            ),
        ));
    }
    Ok(cfg)
}

/// `vigil-imp kill CGROUP SIGNAL [PID]` (crate docs).
fn kill(args: &[OsString]) -> Result<(), Refusal> {
    let (dir, signal, pid) = match args {
        [d, s] => (d, s, None),
        [d, s, p] => (d, s, Some(p)),
        _ => return Err(Refusal::new(Exit::Usage, USAGE)),
    };
    let cfg = load_for_caller()?;
    let signal: i32 =
        signal.to_str().and_then(|s| s.parse().ok()).filter(|s| (1..=64).contains(s)).ok_or_else(|| {
            Refusal::new(Exit::Usage, format!("refused: signal {signal:?} is not a number from 1 to 64"))
        })?;
    let pid: Option<i32> = match pid {
        Some(p) => Some(
            p.to_str()
                .and_then(|s| s.parse().ok())
                .filter(|p| *p > 0)
                .ok_or_else(|| Refusal::new(Exit::Usage, format!("refused: pid {p:?} is not a process id")))?,
        ),
        None => None,
    };
    let dir = cfg.check_cgroup(std::path::Path::new(dir)).map_err(|e| Refusal::new(Exit::Request, e))?;
    let pids = ids::cgroup_pids(&dir).map_err(|e| Refusal::new(Exit::Request, e))?;
    let targets: Vec<i32> = match pid {
        Some(p) if pids.contains(&p) => vec![p],
        Some(p) => {
            return Err(Refusal::new(
                Exit::Request,
                format!("refused: pid {p} is not in the job's cgroup {}", dir.display()),
            ))
        }
        None => pids,
    };
    for p in targets {
        // SAFETY: kill(2) with a plain pid and signal number; a process gone meanwhile (ESRCH) is fine.
        if unsafe { libc::kill(p, signal) } != 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
        {
            return Err(Refusal::new(
                Exit::Launch,
                format!("signal {signal} to pid {p}: {}", std::io::Error::last_os_error()),
            ));
        }
    }
    Ok(())
}

/// Everything, to the shell's execution (which does not return) or a refusal.
fn run(args: &[OsString]) -> Result<std::convert::Infallible, Refusal> {
    let (shell, shell_args) = match args {
        [cmd, shell, rest @ ..] if cmd == "exec" => (shell, rest),
        _ => return Err(Refusal::new(Exit::Usage, USAGE)),
    };
    let cfg = load_for_caller()?;
    let shell = cfg.check_shell(shell).map_err(|e| Refusal::new(Exit::Request, e))?;
    // Standard input unbuffered (not `std::io::stdin()`, which reads ahead): what follows the request is the shell's.
    // SAFETY: fd 0 is this process's standard input; ManuallyDrop never closes it.
    let mut stdin = std::mem::ManuallyDrop::new(unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(0) });
    let req = request::Request::read(&mut *stdin).map_err(|e| Refusal::new(Exit::Request, e))?;
    let user = ids::User::by_uid(req.uid).map_err(|e| Refusal::new(Exit::Request, e))?;
    cfg.check_user(&user).map_err(|e| Refusal::new(Exit::Request, e))?;
    let cgroup = match &req.cgroup {
        Some(c) => Some(cfg.check_cgroup(c).map_err(|e| Refusal::new(Exit::Request, e))?),
        None => None,
    };
    let sha = request::sha256_hex(&req.jobspec);
    // The credential last: decoding it consumes it (munge's replay cache), and nothing above did.
    let decoded = munge::decode(&req.credential, cfg.munge_socket.as_deref())
        .map_err(|e| Refusal::new(Exit::Credential, format!("credential refused: {e}")))?;
    request::check_credential(&decoded, req.uid, &cfg.instance, &sha)
        .map_err(|e| Refusal::new(Exit::Credential, format!("credential refused: {e}")))?;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
    request::check_age(&decoded, now, cfg.credential_max_age)
        .map_err(|e| Refusal::new(Exit::Credential, format!("credential refused: {e}")))?;
    if let Some(c) = &cgroup {
        ids::join_cgroup(c).map_err(|e| Refusal::new(Exit::Launch, e))?;
    }
    ids::become_user(&user).map_err(|e| Refusal::new(Exit::Launch, e))?;
    let env = ids::shell_env(std::env::vars_os(), &user, &sha);
    Err(Refusal::new(Exit::Launch, ids::exec(&shell, shell_args, &env)))
}
