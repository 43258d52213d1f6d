//! Job shells, started off the loop: a shell's launch (its user looked up, its cgroup made, its process created,
//! which waits until the child has called `execve`) runs on a blocking thread, so that the loop, which judges its
//! children, never waits for a process to be scheduled. Before this, the overload soak (`bench/soak.sh`) logged
//! 796 turns of brokers' loops over 50 ms on `rexec.spawn`: median 152 ms, p90 307 ms, at most 2.9 s, during which
//! no detector report was handled.
//!
//! [`Shells`] is the table of a broker's shells, shared by the loop (which signals them) and the threads that start
//! them: a signal for a shell still starting is kept and delivered the moment it has a process; a broker that is
//! closing kills a shell started too late. [`Launcher`] starts one; its outcome comes back to the loop as
//! [`Event::ShellStarted`], its end as [`Event::ShellDone`]. A shell's process is created in its cgroup by
//! `spawn.rs`, its cgroup made by `cgroup.rs`; its tasks were placed on the loop (`placement.rs`).

use super::cgroup::{Containment, JobCgroup};
use super::driver::Event;
use crate::jobs::JobId;
use crate::shellproto::{ShellInput, ShellReport};
use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use tokio::sync::mpsc;
use tracing::{info, warn};

/// The job shells of one broker: those started, by process group (which is also the shell's pid), and those
/// starting, with the signals that came for them before they had a process. Cloning shares the table.
#[derive(Clone, Debug, Default)]
pub(super) struct Shells(Arc<Mutex<Table>>);

#[derive(Debug, Default)]
struct Table {
    started: HashMap<JobId, Target>,
    starting: HashMap<JobId, Vec<i32>>,
    /// The broker is closing: a shell that starts now is killed at once.
    closed: bool,
}

impl Shells {
    fn lock(&self) -> MutexGuard<'_, Table> {
        // Nothing panics while holding it; were it poisoned, the table is still whole.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Send `signal` to job `id`'s shell, or keep it for the shell if it is still starting; nothing if there is
    /// none here.
    pub(super) fn signal(&self, id: JobId, signal: i32) {
        let mut t = self.lock();
        if let Some(target) = t.started.get(&id) {
            deliver(target, signal);
        } else if let Some(kept) = t.starting.get_mut(&id) {
            kept.push(signal);
        }
    }

    /// SIGKILL to every shell's process group, those still starting included.
    pub(super) fn kill_all(&self) {
        let mut t = self.lock();
        for target in t.started.values() {
            deliver(target, libc::SIGKILL);
        }
        for kept in t.starting.values_mut() {
            kept.push(libc::SIGKILL);
        }
    }

    /// Job `id`'s shell has exited.
    pub(super) fn ended(&self, id: JobId) {
        self.lock().started.remove(&id);
    }

    /// The broker is closing: SIGKILL to every shell's process group, and to any that starts from now on.
    pub(super) fn close(&self) {
        let mut t = self.lock();
        t.closed = true;
        for (_, target) in t.started.drain() {
            deliver(&target, libc::SIGKILL);
        }
    }

    fn starting(&self, id: JobId) {
        self.lock().starting.insert(id, Vec::new());
    }

    /// Job `id`'s shell has process group `pgid` (another user's, reached through `vigil-imp kill`, when `imp`
    /// is the launcher and its job's cgroup): the signals kept for it are delivered now, in order. False when the
    /// broker is closing (the shell was killed).
    fn started(&self, id: JobId, pgid: i32, imp: Option<(PathBuf, PathBuf)>) -> bool {
        let target = Target { pgid, imp };
        let mut t = self.lock();
        let kept = t.starting.remove(&id).unwrap_or_default();
        if t.closed {
            deliver(&target, libc::SIGKILL);
            return false;
        }
        for signal in kept {
            deliver(&target, signal);
        }
        t.started.insert(id, target);
        true
    }

    fn failed(&self, id: JobId) {
        self.lock().starting.remove(&id);
    }
}

/// A started shell, as its signals reach it.
#[derive(Debug)]
struct Target {
    /// Its pid, which is also its process group.
    pgid: i32,
    /// A guest's shell started through `vigil-imp` (the launcher, the job's cgroup): another user's processes,
    /// which this broker signals through `vigil-imp kill`.
    imp: Option<(PathBuf, PathBuf)>,
}

/// Signal a shell: the shell alone for a signal it passes on to its tasks, else its whole process group (a
/// guest's: every process of its job's cgroup, through `vigil-imp kill`, on a thread of its own).
fn deliver(target: &Target, signal: i32) {
    let pgid = target.pgid;
    if let Some((imp, cgroup)) = &target.imp {
        let (imp, cgroup) = (imp.clone(), cgroup.clone());
        let pid = shell_forwards(signal).then_some(pgid);
        std::thread::spawn(move || {
            if let Err(e) = super::imp::kill(&imp, &cgroup, signal, pid) {
                warn!("signal {signal} to {}: {e}", cgroup.display());
            }
        });
        return;
    }
    if shell_forwards(signal) {
        // SAFETY: kill(2) on a shell this broker started (pid == pgid), with a plain signal number.
        unsafe { libc::kill(pgid, signal) };
    } else {
        // SAFETY: killpg with a pgid this broker created (the shell's own group) and a plain signal number.
        unsafe { libc::killpg(pgid, signal) };
    }
}

/// What starting a shell needs from its broker, made on the loop and handed to the thread that starts it.
#[derive(Debug)]
pub(super) struct Launcher {
    /// The job shell program (`exec.shell`, `$VIGIL_SHELL`, or `vigil-shell` beside this program).
    pub(super) program: PathBuf,
    /// Environment every shell gets from this broker (its URI, the detector rank).
    pub(super) env: Vec<(OsString, OsString)>,
    /// This broker's uid.
    pub(super) uid: u32,
    /// The privileged launcher that starts guests' shells, where this broker needs one (`imp.rs`: a multi-user
    /// instance whose brokers are not root).
    pub(super) imp: Option<PathBuf>,
    pub(super) containment: Arc<Containment>,
    /// Shells are moved into their cgroup after start: creating them there failed once (see spawn.rs).
    pub(super) moves: Arc<AtomicBool>,
    pub(super) shells: Shells,
    pub(super) events: mpsc::UnboundedSender<Event>,
}

/// A shell just started, with what its watch needs.
struct Launched {
    shell: ShellProcess,
    cgroup: Option<JobCgroup>,
    /// Created in its cgroup (else moved in before it reads its input).
    in_cgroup: bool,
    /// What goes on its standard input before its input: `vigil-imp`'s request, for a guest's shell started
    /// through it (empty otherwise).
    preamble: Vec<u8>,
    /// Started through `vigil-imp` (the launcher, the job's cgroup): its signals go through it too.
    imp: Option<(PathBuf, PathBuf)>,
}

/// As whom a shell runs.
enum Identity {
    /// This broker's user.
    Own,
    /// Another user, whom this broker (root) becomes in the child before exec.
    User(super::spawn::RunAs),
    /// A guest, through `vigil-imp` (this broker is not root), with the submitter's credential.
    Imp { uid: u32, launcher: PathBuf, credential: crate::shellproto::ImpCredential },
}

impl Launcher {
    /// Start job `id`'s shell on a blocking thread (`input` placed already; `tmpdir` its job directory): its
    /// outcome, a pid or why not, comes back as [`Event::ShellStarted`], then its end as [`Event::ShellDone`].
    pub(super) fn start(self, id: JobId, mut input: ShellInput, tmpdir: PathBuf) {
        if self.through_imp(&input) {
            // The guest's shell cannot make its directories in this broker's run directory: it makes its job's
            // in $TMPDIR or /tmp, its own, and the allocation's there too (unless an enclosing one is shared).
            input.tmpdir = None;
            if input.alloc_tmpdir.as_ref().is_some_and(|a| a.owned) {
                input.alloc_tmpdir = None;
            }
        }
        self.shells.starting(id);
        tokio::task::spawn_blocking(move || match self.launch(id, &input, &tmpdir) {
            Ok(l) => {
                let pid = l.shell.pid;
                if !self.shells.started(id, pid, l.imp.clone()) {
                    return;
                }
                // Sent before the watch starts: the loop hears of the start before the end.
                let _ = self.events.send(Event::ShellStarted { id, result: Ok(pid) });
                tokio::spawn(watch(id, l, input, tmpdir, self.events));
            }
            Err(e) => {
                self.shells.failed(id);
                // One made for another user before the shell failed to start (empty: remove_dir takes no more).
                let _ = std::fs::remove_dir(&tmpdir);
                let _ = self.events.send(Event::ShellStarted { id, result: Err(e) });
            }
        });
    }

    /// Create job `id`'s shell process: as its submitter where that is another user, in its cgroup (or moved in
    /// later), with its memory limit.
    fn launch(&self, id: JobId, input: &ShellInput, tmpdir: &Path) -> Result<Launched, String> {
        let path = &self.program;
        let args = [OsString::from(format!("--jobid={id}"))];
        let mut env = self.env.clone();
        // The user it runs as: its job's submitter, where that is not this broker's user (docs/security.md).
        let run_as = match self.run_as(input, tmpdir)? {
            Identity::Own => None,
            Identity::User(u) => Some(u),
            Identity::Imp { uid, launcher, credential } => {
                return self.launch_imp(id, input, uid, launcher, &credential, env);
            }
        };
        // Its cgroup, which the shell is created in, or moved into before it reads its input (see cgroup.rs).
        let cgroup = match self.containment.as_ref() {
            Containment::Cgroup(c) => match c.job(id) {
                Ok(cg) => Some(cg),
                Err(e) => {
                    warn!("job {id}: {e}; its shell is kept by its process group only");
                    None
                }
            },
            Containment::ProcessGroups(_) => None,
        };
        // Its memory limit (`-o memory=SIZE`, checked at submit): applied, or the shell tells the job why not.
        if let Some(v) = input.options.get("memory") {
            let why = match (v.as_str().map(crate::shellproto::parse_memory_size), self.containment.as_ref(), &cgroup) {
                (Some(Ok(bytes)), Containment::Cgroup(c), Some(cg)) => {
                    c.memory.clone().and_then(|()| cg.limit_memory(bytes)).err()
                }
                (Some(Ok(_)), Containment::ProcessGroups(why), _) => {
                    Some(format!("jobs are not in cgroups here ({why})"))
                }
                (Some(Ok(_)), _, _) => Some("the job's cgroup could not be made".into()),
                (Some(Err(e)), _, _) => Some(e),
                (None, _, _) => Some("memory=SIZE needs a size".into()),
            };
            if let Some(why) = why {
                info!("job {id}: memory={} not applied: {why}", v.as_str().unwrap_or_default());
                env.push((crate::shellproto::MEMORY_NOTE_ENV.into(), why.into()));
            }
        }
        let direct = match (self.containment.as_ref(), &cgroup) {
            (Containment::Cgroup(c), Some(_)) => c.direct.is_ok() && !self.moves.load(Ordering::Relaxed),
            _ => false,
        };
        if let (true, Some(cg)) = (direct, &cgroup) {
            env.push((crate::shellproto::CGROUP_ENV.into(), cg.dir().as_os_str().to_owned()));
        }
        let shell = if direct {
            self.spawn_into((path, &args), &env, cgroup.as_ref(), id, run_as.as_ref(), false)?
        } else {
            None
        };
        let (shell, in_cgroup) = match shell {
            Some(s) => (s, true),
            None => {
                let mut cmd = tokio::process::Command::new(path);
                cmd.args(&args)
                    .stdin(std::process::Stdio::piped())
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::inherit())
                    // Moved into its cgroup only after it started (if at all): it finds its cgroup itself.
                    .envs(env.iter().filter(|(k, _)| k != crate::shellproto::CGROUP_ENV).map(|(k, v)| (k, v)))
                    .kill_on_drop(false);
                // A session (and process group) of its own, as spawn.rs gives the shells it starts.
                // SAFETY: setsid is async-signal-safe; it runs in the forked child before exec.
                unsafe {
                    cmd.pre_exec(|| if libc::setsid() < 0 { Err(std::io::Error::last_os_error()) } else { Ok(()) });
                }
                if let Some(u) = run_as {
                    // SAFETY: the closure runs in the forked child before exec and makes only raw system calls
                    // (`RunAs::become_user`), which are async-signal-safe.
                    unsafe {
                        cmd.pre_exec(move || u.become_user().map_err(std::io::Error::from_raw_os_error));
                    }
                }
                let child = cmd.spawn().map_err(|e| format!("cannot run {}: {e}", path.display()))?;
                (ShellProcess::from_command(child)?, false)
            }
        };
        Ok(Launched { shell, cgroup, in_cgroup, preamble: Vec::new(), imp: None })
    }

    /// Whether job `input`'s shell is started through `vigil-imp`: a guest's job, on a broker that is not root
    /// and has the launcher.
    fn through_imp(&self, input: &ShellInput) -> bool {
        self.uid != 0 && self.imp.is_some() && input.userid.is_some_and(|u| u != self.uid)
    }

    /// Start a guest's shell through `vigil-imp exec` (`launcher`), as `uid`, in its job's cgroup, which the
    /// launcher joins (the job's processes are another user's: only the cgroup reaches them all, so a guest's job
    /// runs only where jobs have cgroups); `env` this broker's variables for the shell (the launcher passes on
    /// the `VIGIL_*` ones only). The launcher's request goes before the shell's input (`watch`).
    fn launch_imp(
        &self,
        id: JobId,
        input: &ShellInput,
        uid: u32,
        launcher: PathBuf,
        credential: &crate::shellproto::ImpCredential,
        mut env: Vec<(OsString, OsString)>,
    ) -> Result<Launched, String> {
        let cgroup = match self.containment.as_ref() {
            Containment::Cgroup(c) => c.job(id)?,
            Containment::ProcessGroups(why) => {
                return Err(format!(
                    "a guest's job (uid {uid}) runs in a cgroup of its own, and jobs here have none ({why})"
                ))
            }
        };
        if let Some(v) = input.options.get("memory") {
            let why = match v.as_str().map(crate::shellproto::parse_memory_size) {
                Some(Ok(bytes)) => match self.containment.as_ref() {
                    Containment::Cgroup(c) => c.memory.clone().and_then(|()| cgroup.limit_memory(bytes)).err(),
                    Containment::ProcessGroups(why) => Some(why.clone()),
                },
                Some(Err(e)) => Some(e),
                None => Some("memory=SIZE needs a size".into()),
            };
            if let Some(why) = why {
                env.push((crate::shellproto::MEMORY_NOTE_ENV.into(), why.into()));
            }
        }
        env.push((crate::shellproto::CGROUP_ENV.into(), cgroup.dir().as_os_str().to_owned()));
        let args: [OsString; 3] = ["exec".into(), self.program.clone().into(), format!("--jobid={id}").into()];
        let preamble = super::imp::request(uid, Some(cgroup.dir()), credential);
        let imp = Some((launcher.clone(), cgroup.dir().to_path_buf()));
        // Created in the job's cgroup where this broker can (as shells are): the launcher then finds itself there
        // and writes no `cgroup.procs`, a move that waits for an RCU grace period (~15 ms here: bench/imp.sh).
        if let (Containment::Cgroup(c), false) = (self.containment.as_ref(), self.moves.load(Ordering::Relaxed)) {
            if c.direct.is_ok() {
                // Its standard error piped: read by `watch`, which says a refusal of the launcher in the exception.
                if let Some(shell) = self.spawn_into((&launcher, &args), &env, Some(&cgroup), id, None, true)? {
                    return Ok(Launched { shell, cgroup: Some(cgroup), in_cgroup: true, preamble, imp });
                }
            }
        }
        let mut cmd = tokio::process::Command::new(&launcher);
        cmd.args(&args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            // Read by `watch`: a refusal of the launcher is said in the job's exception.
            .stderr(std::process::Stdio::piped())
            .envs(env.iter().map(|(k, v)| (k, v)))
            .kill_on_drop(false);
        // SAFETY: setsid is async-signal-safe; it runs in the forked child before exec.
        unsafe {
            cmd.pre_exec(|| if libc::setsid() < 0 { Err(std::io::Error::last_os_error()) } else { Ok(()) });
        }
        let mut child = cmd.spawn().map_err(|e| format!("cannot run {}: {e}", launcher.display()))?;
        let stderr = child.stderr.take();
        let mut shell = ShellProcess::from_command(child)?;
        shell.stderr = stderr.map(|s| Box::new(s) as Box<dyn tokio::io::AsyncRead + Send + Unpin>);
        Ok(Launched { shell, cgroup: Some(cgroup), in_cgroup: true, preamble, imp })
    }

    /// Start a shell (or `vigil-imp`) created in its cgroup ([`super::spawn`]), its stderr piped when `pipe_stderr`
    /// (else the broker's); `(path, args)` as [`super::spawn::spawn`] takes them. `Ok(None)`: not possible here
    /// after all (said once; from then on shells are moved in after start).
    fn spawn_into(
        &self,
        (path, args): (&Path, &[OsString]),
        env: &[(OsString, OsString)],
        cgroup: Option<&JobCgroup>,
        id: JobId,
        run_as: Option<&super::spawn::RunAs>,
        pipe_stderr: bool,
    ) -> Result<Option<ShellProcess>, String> {
        let Some(cg) = cgroup else { return Ok(None) };
        let dir = match cg.open_dir() {
            Ok(d) => d,
            Err(e) => {
                warn!("job {id}: {e}; its shell is moved into its cgroup after start");
                return Ok(None);
            }
        };
        match super::spawn::spawn(path, args, env, &dir, run_as, pipe_stderr) {
            Ok(s) => ShellProcess::from_spawned(s).map(Some),
            Err(super::spawn::SpawnError::Unsupported(e)) => {
                if !self.moves.swap(true, Ordering::Relaxed) {
                    warn!("shells cannot be created in their cgroup ({e}); they are moved in after start from now on");
                }
                Ok(None)
            }
            Err(super::spawn::SpawnError::Failed(e)) => Err(format!("cannot run {}: {e}", path.display())),
        }
    }

    /// The user job `input`'s shell runs as: [`Identity::Own`] for this broker's own (the job's submitter is this
    /// broker's user, or an older rank 0 did not say); the submitter where this broker is root, whose job
    /// temporary directory `tmpdir` is then made here, mode 0700 and owned by the user (the shell could not make
    /// it in the broker's run directory); the submitter through `vigil-imp` where this broker is not root and has
    /// the launcher (a multi-user instance: docs/security.md), with the credential the input carries.
    ///
    /// # Errors
    /// The submitter is another user and this broker is not root and has no launcher, or the input carries no
    /// credential (rank 0 refuses such a submission; this is the node's own check), the user has no account on
    /// this node, or its directory cannot be made.
    fn run_as(&self, input: &ShellInput, tmpdir: &Path) -> Result<Identity, String> {
        let me = self.uid;
        let uid = match input.userid {
            Some(u) if u != me => u,
            _ => return Ok(Identity::Own),
        };
        if me != 0 {
            let Some(launcher) = self.imp.clone() else {
                return Err(format!(
                    "running jobs as uid {uid} needs vigil-imp: this broker runs as uid {me}, in an instance that \
                     is not multi-user"
                ));
            };
            let Some(credential) = input.imp.clone() else {
                return Err(format!(
                    "the job of uid {uid} carries no munge credential, which vigil-imp needs to run it as that user"
                ));
            };
            return Ok(Identity::Imp { uid, launcher, credential });
        }
        let user = super::spawn::RunAs::lookup(uid)?;
        {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(tmpdir)
                .map_err(|e| format!("cannot create {}: {e}", tmpdir.display()))?;
            std::os::unix::fs::chown(tmpdir, Some(user.uid), Some(user.gid))
                .map_err(|e| format!("cannot give {} to uid {uid}: {e}", tmpdir.display()))?;
        }
        Ok(Identity::User(user))
    }
}

/// Watch a started shell to its end: into its cgroup if it was not created there, its input written, its report
/// read, then whatever it left behind killed and its directories removed; its end sent as [`Event::ShellDone`].
async fn watch(id: JobId, l: Launched, input: ShellInput, tmpdir: PathBuf, tx: mpsc::UnboundedSender<Event>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Launched { mut shell, cgroup, in_cgroup, preamble, imp: _ } = l;
    let pid = shell.pid;
    let mut data = preamble;
    data.extend(serde_json::to_vec(&input).unwrap_or_default());
    // The node-local allocation directory this job's shell makes (`VIGIL_ALLOC_TMPDIR`, where not the enclosing
    // allocation's), for the case the shell is killed before it removes it.
    let alloc_dir = input.alloc_tmpdir.as_ref().filter(|a| a.owned).map(|a| PathBuf::from(&a.path));
    // Into its cgroup before it gets its input, where it was not created there: it starts nothing before it has
    // read it all. Off the broker's loop: a write to `cgroup.procs` waits for an RCU grace period (milliseconds,
    // more under load).
    let cgroup = match cgroup {
        Some(cg) if !in_cgroup => tokio::task::spawn_blocking(move || {
            if let Err(e) = cg.adopt(pid) {
                warn!("job {id}: {e}; its shell is kept by its process group only");
            }
            cg
        })
        .await
        .ok(),
        other => other,
    };
    if let Some(mut s) = shell.stdin.take() {
        let _ = s.write_all(&data).await;
        let _ = s.shutdown().await;
    }
    // A guest's shell started through vigil-imp: what is written on its standard error is passed on to this
    // broker's, and its first lines kept, which say why, if the launcher refused.
    let errors = shell.stderr.take().map(|mut s| {
        tokio::spawn(async move {
            let mut kept = String::new();
            let mut buf = [0u8; 4096];
            while let Ok(n) = s.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                let text = String::from_utf8_lossy(&buf[..n]);
                eprint!("{text}");
                if kept.len() < IMP_ERROR_KEEP {
                    kept.push_str(&text);
                }
            }
            kept
        })
    });
    let mut out = String::new();
    if let Some(s) = shell.stdout.as_mut() {
        let _ = s.read_to_string(&mut out).await;
    }
    let status = shell.exit.await;
    let mut report = out.lines().rev().find_map(|l| serde_json::from_str::<ShellReport>(l).ok());
    if let Some(e) = errors {
        let said = e.await.unwrap_or_default();
        let why = said.lines().find(|l| l.starts_with("vigil-imp: ")).map(str::to_string);
        if let (None, Some(why)) = (&report, why) {
            // The launcher refused (its exit codes 64 to 69): the job's exception says why.
            report = Some(ShellReport::failed(why));
        }
    }
    // Whatever the job left in the background dies with it (the shell's process group, and its cgroup with
    // whatever left that group), and the shell's job tmpdir goes too if the shell was killed before removing it.
    // SAFETY: killpg on the process group the shell led; no memory is touched.
    unsafe { libc::killpg(pid, libc::SIGKILL) };
    let mut ended = None;
    if let Some(cg) = cgroup {
        if let Ok((usage, rest)) = tokio::task::spawn_blocking(move || cg.finish()).await {
            if let Some(r) = report.as_mut() {
                r.usage = Some(usage);
            }
            ended = Some(rest);
        }
    }
    let _ = std::fs::remove_dir_all(&tmpdir);
    // A shell that reported removed its own (and left alone one it found made by someone else).
    if let (Some(a), None) = (alloc_dir, &report) {
        let _ = std::fs::remove_dir_all(a);
    }
    // What is still in the cgroup a moment after `cgroup.kill`: the broker's core holds the report while any is
    // left, up to exec.kill-timeout (the core's `broker/unkillable.rs`), and hears here when the cgroup empties.
    let (ended, lingering) = match ended {
        Some(rest) => tokio::task::spawn_blocking(move || {
            let left = rest.left_after(LEAVE_WAIT);
            (Some(rest), left)
        })
        .await
        .unwrap_or((None, Vec::new())),
        None => (None, Vec::new()),
    };
    let stuck = !lingering.is_empty();
    let _ = tx.send(Event::ShellDone { id, report, status, lingering });
    let Some(rest) = ended else { return };
    if stuck {
        // Looked at again and again, less often as time goes by (a process in uninterruptible sleep may never
        // leave); the cgroup goes once it is empty.
        let mut every = std::time::Duration::from_millis(10);
        let mut rest = rest;
        loop {
            tokio::time::sleep(every).await;
            every = (every * 2).min(std::time::Duration::from_secs(1));
            let Ok((populated, r)) = tokio::task::spawn_blocking(move || (rest.populated(), rest)).await else {
                return;
            };
            rest = r;
            if !populated {
                break;
            }
        }
        info!("job {id}: its cgroup is empty at last");
        let _ = tx.send(Event::CgroupEmptied { id });
        let _ = tokio::task::spawn_blocking(move || rest.remove()).await;
        return;
    }
    // The empty cgroup goes after the job's end is reported: nothing waits for it.
    let _ = tokio::task::spawn_blocking(move || rest.remove()).await;
}

/// The most of a guest's shell's standard error kept to name a refusal of `vigil-imp` (bytes).
const IMP_ERROR_KEEP: usize = 4096;

/// How long a shell's killed cgroup has to empty before its end is reported as leaving processes behind (which
/// the broker's core then waits for, up to exec.kill-timeout): killed processes leave within milliseconds.
const LEAVE_WAIT: std::time::Duration = std::time::Duration::from_millis(100);

/// A job shell's process as the driver keeps it, however it was started: its pid (also its process group), the
/// broker's ends of its stdin and stdout, and its raw wait status once it has exited.
struct ShellProcess {
    pid: i32,
    stdin: Option<Box<dyn tokio::io::AsyncWrite + Send + Unpin>>,
    stdout: Option<Box<dyn tokio::io::AsyncRead + Send + Unpin>>,
    /// Its standard error, where the broker reads it (a shell started through `vigil-imp`); else inherited.
    stderr: Option<Box<dyn tokio::io::AsyncRead + Send + Unpin>>,
    exit: std::pin::Pin<Box<dyn std::future::Future<Output = i32> + Send>>,
}

/// The wait status given for a shell whose exit could not be waited for (as if stopped: not an exit code).
const UNKNOWN_STATUS: i32 = 0x7f00;

impl ShellProcess {
    /// One started by `tokio::process::Command`.
    fn from_command(mut child: tokio::process::Child) -> Result<ShellProcess, String> {
        // The shell's pid is its process group, signalled later: never 0 (which would be the broker's own group).
        let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()).filter(|p| *p > 0) else {
            return Err("the job shell exited before it could be watched".into());
        };
        let stdin = child.stdin.take().map(|s| Box::new(s) as Box<dyn tokio::io::AsyncWrite + Send + Unpin>);
        let stdout = child.stdout.take().map(|s| Box::new(s) as Box<dyn tokio::io::AsyncRead + Send + Unpin>);
        let exit = Box::pin(async move {
            use std::os::unix::process::ExitStatusExt;
            child.wait().await.map(|st| st.into_raw()).unwrap_or(UNKNOWN_STATUS)
        });
        Ok(ShellProcess { pid, stdin, stdout, stderr: None, exit })
    }

    /// One created in its cgroup by [`super::spawn::spawn`].
    fn from_spawned(s: super::spawn::Spawned) -> Result<ShellProcess, String> {
        use tokio::net::unix::pipe;
        let stdin = pipe::Sender::from_owned_fd(s.stdin).map_err(|e| format!("the job shell's stdin: {e}"))?;
        let stdout = pipe::Receiver::from_owned_fd(s.stdout).map_err(|e| format!("the job shell's stdout: {e}"))?;
        let stderr = match s.stderr {
            Some(fd) => Some(pipe::Receiver::from_owned_fd(fd).map_err(|e| format!("the job shell's stderr: {e}"))?),
            None => None,
        };
        let pid = s.pid;
        let pidfd = s.pidfd;
        let exit = Box::pin(async move { super::spawn::wait(pid, pidfd).await.unwrap_or(UNKNOWN_STATUS) });
        Ok(ShellProcess {
            pid,
            stdin: Some(Box::new(stdin)),
            stdout: Some(Box::new(stdout)),
            stderr: stderr.map(|r| Box::new(r) as Box<dyn tokio::io::AsyncRead + Send + Unpin>),
            exit,
        })
    }
}

/// Whether a job shell relays `signal` to its tasks itself ([`vigil_proto::shellproto::SHELL_FORWARDED_SIGNALS`]):
/// then the broker signals the shell alone, else the shell's whole process group.
fn shell_forwards(signal: i32) -> bool {
    vigil_proto::shellproto::SHELL_FORWARDED_SIGNALS
        .iter()
        .any(|name| name.parse::<nix::sys::signal::Signal>().is_ok_and(|s| s as i32 == signal))
}

#[cfg(test)]
mod tests {
    use super::{shell_forwards, Shells};
    use crate::jobs::JobId;
    use std::os::unix::process::{CommandExt, ExitStatusExt};

    #[test]
    fn the_shell_alone_gets_what_it_passes_on_the_group_gets_the_rest() {
        for s in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGUSR1, libc::SIGUSR2] {
            assert!(shell_forwards(s), "signal {s}");
        }
        for s in [libc::SIGKILL, libc::SIGSTOP, libc::SIGCONT, libc::SIGQUIT, 0, -1, 999] {
            assert!(!shell_forwards(s), "signal {s}");
        }
    }

    /// A stand-in for a shell: a process leading its own group.
    fn shell() -> std::process::Child {
        std::process::Command::new("sleep").arg("60").process_group(0).spawn().expect("sleep")
    }

    #[test]
    fn a_signal_for_a_shell_still_starting_reaches_it_once_it_has_started() {
        let shells = Shells::default();
        let id = JobId(7);
        shells.starting(id);
        shells.signal(id, libc::SIGKILL);
        // Nothing for a job with no shell here.
        shells.signal(JobId(8), libc::SIGKILL);
        let mut s = shell();
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(s.try_wait().expect("wait").is_none(), "killed before it started");
        assert!(shells.started(id, s.id() as i32, None));
        assert_eq!(s.wait().expect("wait").signal(), Some(libc::SIGKILL));
        shells.ended(id);
        assert!(shells.lock().started.is_empty() && shells.lock().starting.is_empty());
    }

    #[test]
    fn kill_all_reaches_started_and_starting_shells_and_a_closed_table_kills_late_ones() {
        let shells = Shells::default();
        let (a, b, c) = (JobId(1), JobId(2), JobId(3));
        let mut sa = shell();
        shells.starting(a);
        assert!(shells.started(a, sa.id() as i32, None));
        shells.starting(b);
        shells.kill_all();
        assert_eq!(sa.wait().expect("wait").signal(), Some(libc::SIGKILL));
        let mut sb = shell();
        assert!(shells.started(b, sb.id() as i32, None));
        assert_eq!(sb.wait().expect("wait").signal(), Some(libc::SIGKILL));
        // Closing: a shell whose start was under way is killed as it starts, and not kept.
        shells.starting(c);
        shells.close();
        let mut sc = shell();
        assert!(!shells.started(c, sc.id() as i32, None));
        assert_eq!(sc.wait().expect("wait").signal(), Some(libc::SIGKILL));
        assert!(shells.lock().started.is_empty());
    }
}
