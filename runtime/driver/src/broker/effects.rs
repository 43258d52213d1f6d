//! The effect executor: [`Driver::execute`] carries out each [`Effect`] the broker hands back (a message to
//! send, a child to accept, a parent to connect to, a node to check, a shell to start or signal...), including
//! starting job shells ([`Driver::spawn_shell`]) and the initial program ([`run_initial`]).
//!
//! Where the effects come from, and where the inputs they produce go back to the broker, is `driver.rs`'s
//! ([`Driver::flush`]). A shell's process is created in its cgroup by `spawn.rs`, its cgroup made by
//! `cgroup.rs`, its tasks placed by `placement.rs`; a parent link is made by `links_up.rs`.

use super::confirm::CheckTarget;
use super::core::{Effect, Input, Peer, PARENT};
use super::driver::{Driver, Event};
use super::links_up::{connect_parent, node_answers, Ask, ChildLink};
use super::transport::{merge, tcp_ack_state, Link, TcpTransport};
use crate::jobs::JobId;
use crate::message::{errno, Message, MsgType, FLAG_NORESPONSE};
use crate::shellproto::{ShellInput, ShellReport};
use serde_json::json;
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use tokio::sync::mpsc;
use tracing::{info, warn};

impl Driver {
    /// Carry out one effect; inputs it produces go on `queue`.
    pub(super) fn execute(&mut self, e: Effect, queue: &mut VecDeque<Input>) {
        match e {
            Effect::Send(peer, msg) => {
                let tx = match peer {
                    Peer::Parent => self.parent.as_ref(),
                    Peer::Child(r) => self.children.get(&r).map(|c| &c.tx),
                    Peer::Local(id) => self.locals.get(&id),
                };
                let r = match tx {
                    Some(t) => t.send(msg),
                    None => Err(msg),
                };
                if let Err(msg) = r {
                    if msg.msgtype == MsgType::Request && msg.flags & FLAG_NORESPONSE == 0 {
                        queue.push_back(Input::Bounced(peer, msg));
                    }
                }
            }
            Effect::AcceptChild { conn, rank } => self.accept_child(conn, rank),
            Effect::RefuseChild { conn, why, full } => {
                if let Some(p) = self.pending.remove(&conn) {
                    // Its writer flushes this and ends when the link is dropped here. `full` only when set: an
                    // older child reads the same message as before.
                    let mut body = json!({"errstr": why});
                    if full {
                        body["full"] = json!(true);
                    }
                    let _ = p.link.tx.send(Message::control("refused", &body));
                }
            }
            Effect::DropLink(Peer::Parent, _) => {
                self.parent = None;
                self.parent_sock = None;
                if let (Some(t), Some(d)) = (self.parent_tuple.take(), self.detect.as_ref()) {
                    d.unwatch_link(t);
                }
                self.probe_parent(None);
            }
            Effect::ConnectParent { rank, lost, timeout, last_resort } => {
                self.connect_adoptive_parent(rank, (lost, last_resort), timeout)
            }
            Effect::DropLink(Peer::Child(r), conn) => {
                if self.children.get(&r).is_some_and(|c| c.conn == conn) {
                    self.children.remove(&r);
                }
            }
            Effect::DropLink(Peer::Local(id), _) => {
                self.locals.remove(&id);
            }
            Effect::ForgetChild(r) => {
                let tuple = self.children.get(&r).and_then(|c| c.tuple);
                if let Some(d) = self.detect.as_ref() {
                    d.prober_cmd(super::detect::ProbeCmd::Remove(r));
                    if let Some(t) = tuple {
                        d.unwatch_link(t);
                    }
                }
            }
            Effect::Beat => {
                if let Some(d) = self.detect.as_mut() {
                    d.beat_clock();
                }
            }
            Effect::Heartbeat | Effect::SampleAcks => {
                if matches!(e, Effect::Heartbeat) {
                    if let Some(d) = self.detect.as_mut() {
                        d.beat();
                    }
                }
                self.sample_acks(queue);
            }
            Effect::SpawnShell { id, mut input, tmpdir } => {
                // This broker's placement, whatever the input that came over the overlay said.
                input.placement = self.placer.place(&input);
                let result = self.spawn_shell(id, &input, tmpdir.clone());
                if result.is_err() {
                    // One made for another user before the shell failed to start (empty: remove_dir takes no more).
                    let _ = std::fs::remove_dir(&tmpdir);
                }
                queue.push_back(Input::ShellStarted { id, result });
            }
            Effect::SignalShell { id, signal } => {
                if let Some(&pgid) = self.shells.get(&id) {
                    if shell_forwards(signal) {
                        // The shell leads its group (pid == pgid) and passes the signal on to each task.
                        // SAFETY: kill(2) on the shell we started, with a plain signal number.
                        unsafe { libc::kill(pgid, signal) };
                    } else {
                        // SAFETY: killpg with a pgid we created (the shell's own group) and a plain signal number.
                        unsafe { libc::killpg(pgid, signal) };
                    }
                }
            }
            Effect::KillShells => {
                for pgid in self.shells.values() {
                    let _ =
                        nix::sys::signal::killpg(nix::unistd::Pid::from_raw(*pgid), nix::sys::signal::Signal::SIGKILL);
                }
            }
            Effect::StartInitial(argv) => {
                let tx = self.input_tx.clone();
                let uri = self.broker.env.local_uri.clone();
                tokio::spawn(async move {
                    let code = run_initial(argv, uri, tx.clone()).await;
                    let _ = tx.send(Event::InitialExit(code));
                });
            }
            Effect::CheckNode { token, target, wait } => self.check_node(token, target, wait, queue),
            Effect::Store { batch } => self.store(batch),
            Effect::Sync { upto } => self.start_sync(upto, queue),
            Effect::SignalInitial(sig) => {
                if let Some(pg) = self.initial_pgid {
                    // SAFETY: killpg on the initial program's own process group with a plain signal number.
                    unsafe { libc::killpg(pg, sig) };
                }
            }
            Effect::WriteFile(path, contents) => {
                if let Err(e) = std::fs::write(&path, contents) {
                    warn!("cannot write {}: {e}", path.display());
                }
            }
            Effect::ReportNested { uri, report } => {
                tokio::spawn(async move {
                    match crate::client::Client::connect(&uri).await {
                        Ok(c) => {
                            if let Err(e) = c.rpc("job-exec.nested", 0, &report).await {
                                warn!("could not report to the enclosing instance: {e}");
                            }
                        }
                        Err(e) => warn!("could not reach the enclosing instance at {uri}: {e}"),
                    }
                });
            }
            Effect::WatchEnclosing { uri, id } => {
                tokio::spawn(watch_enclosing(uri, id, self.input_tx.clone()));
            }
            Effect::WatchPid(pid) => match self.detect.as_mut() {
                None => queue.push_back(Input::WatchFailed(
                    pid,
                    errno::ENOSYS,
                    "no failure detectors on this broker".into(),
                )),
                Some(d) if !d.watch_pid(pid) => queue.push_back(Input::WatchFailed(
                    pid,
                    errno::ENOSYS,
                    "the process-exit detector is not loaded (yet)".into(),
                )),
                Some(_) => {
                    self.watched.insert(pid);
                }
            },
        }
    }

    /// [`Effect::AcceptChild`]: acknowledge the hello of the would-be child on link `conn`, put its link in
    /// service as `rank`'s (on the transport agreed), watch it and probe its node.
    fn accept_child(&mut self, conn: u64, rank: u32) {
        let Some(p) = self.pending.remove(&conn) else { return };
        // Our probe port: the child probes our node's responder as we probe its (`probe_parent`).
        let me = json!({"rank": self.broker.rank(), "probe_port": self.detect.as_ref().map(|d| d.probe_port)});
        let ack = merge(me, p.answers.ack_fields());
        let _ = p.link.tx.send(Message::control("hello-ack", &ack));
        let Some((link, choice)) = p.answers.accept(p.link) else { return };
        info!("overlay link to child rank {rank}: {}", choice.describe());
        let Link { tx, rx, peer, sock, tasks } = link;
        let tuple = sock.as_ref().and_then(|s| self.detect.as_ref().and_then(|d| d.watch_link(rank, s)));
        if let (Some(d), Some(port)) = (self.detect.as_mut(), p.probe_port) {
            if let Ok(addr) = peer.parse::<std::net::SocketAddr>() {
                d.probe_child(rank, std::net::SocketAddr::new(addr.ip(), port));
            }
        }
        self.children.insert(rank, ChildLink { tx, conn, sock, tasks, tuple });
        self.links.insert(Peer::Child(rank), conn, rx);
    }

    /// [`Effect::ConnectParent`]: connect to `rank` as an adoptive parent in place of the lost rank of `adopt`
    /// (and as a last resort if its flag says so), within `timeout`, off the loop; the outcome comes back as
    /// [`Event::ParentLink`].
    fn connect_adoptive_parent(&mut self, rank: u32, adopt: (u32, bool), timeout: std::time::Duration) {
        self.parent_gen += 1;
        let gen = self.parent_gen;
        let opts = self.broker.opts.clone();
        let ep = opts.endpoints.get(rank as usize).cloned();
        let transport = TcpTransport { auth: self.auth.clone() };
        let upgrades = self.upgrades.clone();
        let probe_port = self.detect.as_ref().map(|d| d.probe_port);
        let tx = self.input_tx.clone();
        tokio::spawn(async move {
            let result = match ep {
                Some(ep) => connect_parent(
                    &opts,
                    timeout.as_secs_f64(),
                    &transport,
                    &upgrades,
                    probe_port,
                    &ep,
                    Ask::Adoption { lost: adopt.0, last_resort: adopt.1 },
                )
                .await
                .map_err(|e| e.context(&format!("rank {rank}"))),
                None => Err(format!("no endpoint known for rank {rank}").into()),
            };
            let _ = tx.send(Event::ParentLink { gen, result });
        });
    }

    /// Sample every link's kernel ACK state (for [`Effect::Heartbeat`] and [`Effect::SampleAcks`]): `queue`
    /// gets the samples, if any.
    fn sample_acks(&self, queue: &mut VecDeque<Input>) {
        let mut samples = Vec::with_capacity(self.children.len() + 1);
        if self.parent.is_some() {
            if let Some((unacked, age_ms, rtt_us)) = self.parent_sock.as_ref().and_then(tcp_ack_state) {
                samples.push((PARENT, unacked, f64::from(age_ms) / 1e3, f64::from(rtt_us) / 1e6));
            }
        }
        for (&r, c) in &self.children {
            if let Some((unacked, age_ms, rtt_us)) = c.sock.as_ref().and_then(tcp_ack_state) {
                samples.push((r, unacked, f64::from(age_ms) / 1e3, f64::from(rtt_us) / 1e6));
            }
        }
        if !samples.is_empty() {
            queue.push_back(Input::AckSamples(samples));
        }
    }

    /// [`Effect::CheckNode`]: whether `target`'s node answers, asked off the loop ([`node_answers`]); the answer
    /// comes back as [`Event::NodeChecked`], or on `queue` at once when there is no address to ask.
    fn check_node(&self, token: u64, target: CheckTarget, wait: std::time::Duration, queue: &mut VecDeque<Input>) {
        let addr = match target {
            CheckTarget::Parent => self.parent_check,
            CheckTarget::Node { node, port } => {
                node.parse::<std::net::SocketAddr>().ok().zip(port).map(|(a, p)| std::net::SocketAddr::new(a.ip(), p))
            }
        };
        match addr {
            None => queue.push_back(Input::NodeChecked { token, answered: None }),
            Some(addr) => {
                let tx = self.input_tx.clone();
                tokio::spawn(async move {
                    let answered = node_answers(addr, wait).await;
                    let _ = tx.send(Event::NodeChecked { token, answered: Some(answered) });
                });
            }
        }
    }

    /// Start job `id`'s shell: its input on stdin, its report read from stdout, its exit reported as
    /// [`Event::ShellDone`]. Returns its pid (also its process group).
    fn spawn_shell(&mut self, id: JobId, input: &ShellInput, tmpdir: PathBuf) -> Result<i32, String> {
        use std::ffi::OsString;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let path = self.shell_path();
        let detector_rank = self.broker.opts.config.detector_rank.unwrap_or(self.broker.rank());
        let args = [OsString::from(format!("--jobid={id}"))];
        let mut env: Vec<(OsString, OsString)> = vec![
            (crate::client::URI_ENV.into(), self.broker.env.local_uri.clone().into()),
            (crate::shellproto::DETECTOR_RANK_ENV.into(), detector_rank.to_string().into()),
        ];
        // The user it runs as: its job's submitter, where that is not this broker's user (docs/security.md).
        let run_as = self.run_as(input, &tmpdir)?;
        // Its cgroup, which the shell is created in, or moved into before it reads its input (see cgroup.rs).
        let cgroup = match self.containment.as_ref() {
            super::cgroup::Containment::Cgroup(c) => match c.job(id) {
                Ok(cg) => Some(cg),
                Err(e) => {
                    warn!("job {id}: {e}; its shell is kept by its process group only");
                    None
                }
            },
            super::cgroup::Containment::ProcessGroups(_) => None,
        };
        // Its memory limit (`-o memory=SIZE`, checked at submit): applied, or the shell tells the job why not.
        if let Some(v) = input.options.get("memory") {
            let why = match (v.as_str().map(crate::shellproto::parse_memory_size), self.containment.as_ref(), &cgroup) {
                (Some(Ok(bytes)), super::cgroup::Containment::Cgroup(c), Some(cg)) => {
                    c.memory.clone().and_then(|()| cg.limit_memory(bytes)).err()
                }
                (Some(Ok(_)), super::cgroup::Containment::ProcessGroups(why), _) => {
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
            (super::cgroup::Containment::Cgroup(c), Some(_)) => c.direct.is_ok() && !self.spawn_moves,
            _ => false,
        };
        if let (true, Some(cg)) = (direct, &cgroup) {
            env.push((crate::shellproto::CGROUP_ENV.into(), cg.dir().as_os_str().to_owned()));
        }
        let shell =
            if direct { self.spawn_into(&path, &args, &env, cgroup.as_ref(), id, run_as.as_ref())? } else { None };
        let (mut shell, in_cgroup) = match shell {
            Some(s) => (s, true),
            None => {
                let mut cmd = tokio::process::Command::new(&path);
                cmd.args(&args)
                    .stdin(std::process::Stdio::piped())
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::inherit())
                    .process_group(0)
                    // Moved into its cgroup only after it started (if at all): it finds its cgroup itself.
                    .envs(env.iter().filter(|(k, _)| k != crate::shellproto::CGROUP_ENV).map(|(k, v)| (k, v)))
                    .kill_on_drop(false);
                if let Some(u) = run_as.clone() {
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
        let pid = shell.pid;
        self.shells.insert(id, pid);
        let mut stdin = shell.stdin.take();
        let mut stdout = shell.stdout.take();
        let tx = self.input_tx.clone();
        let data = serde_json::to_vec(input).unwrap_or_default();
        // The node-local allocation directory this job's shell makes (`VIGIL_ALLOC_TMPDIR`, where not the enclosing
        // allocation's), for the case the shell is killed before it removes it.
        let alloc_dir = input.alloc_tmpdir.as_ref().filter(|a| a.owned).map(|a| PathBuf::from(&a.path));
        tokio::spawn(async move {
            // Into its cgroup before it gets its input, where it was not created there: it starts nothing before
            // it has read it all. Off the broker's loop: a write to `cgroup.procs` waits for an RCU grace period
            // (milliseconds, more under load).
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
            if let Some(mut s) = stdin.take() {
                let _ = s.write_all(&data).await;
                let _ = s.shutdown().await;
            }
            let mut out = String::new();
            if let Some(s) = stdout.as_mut() {
                let _ = s.read_to_string(&mut out).await;
            }
            let status = shell.exit.await;
            let mut report = out.lines().rev().find_map(|l| serde_json::from_str::<ShellReport>(l).ok());
            // Whatever the job left in the background dies with it (the shell's process group, and its cgroup with
            // whatever left that group), and the shell's job tmpdir goes too if the shell was killed before
            // removing it.
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
            let _ = tx.send(Event::ShellDone { id, report, status });
            // The empty cgroup goes after the job's end is reported: nothing waits for it.
            if let Some(rest) = ended {
                let _ = tokio::task::spawn_blocking(move || rest.remove()).await;
            }
        });
        Ok(pid)
    }

    /// Start a shell created in its cgroup ([`super::spawn`]). `Ok(None)`: not possible here after all (said
    /// once; from then on shells are moved in after start).
    fn spawn_into(
        &mut self,
        path: &Path,
        args: &[std::ffi::OsString],
        env: &[(std::ffi::OsString, std::ffi::OsString)],
        cgroup: Option<&super::cgroup::JobCgroup>,
        id: JobId,
        run_as: Option<&super::spawn::RunAs>,
    ) -> Result<Option<ShellProcess>, String> {
        let Some(cg) = cgroup else { return Ok(None) };
        let dir = match cg.open_dir() {
            Ok(d) => d,
            Err(e) => {
                warn!("job {id}: {e}; its shell is moved into its cgroup after start");
                return Ok(None);
            }
        };
        match super::spawn::spawn(path, args, env, &dir, run_as) {
            Ok(s) => ShellProcess::from_spawned(s).map(Some),
            Err(super::spawn::SpawnError::Unsupported(e)) => {
                warn!("shells cannot be created in their cgroup ({e}); they are moved in after start from now on");
                self.spawn_moves = true;
                Ok(None)
            }
            Err(super::spawn::SpawnError::Failed(e)) => Err(format!("cannot run {}: {e}", path.display())),
        }
    }

    /// The user job `input`'s shell runs as: `None` for this broker's own (the job's submitter is this broker's
    /// user, or an older rank 0 did not say); the submitter where this broker is root (a multi-user instance without
    /// `vigil-imp`: docs/security.md), whose job temporary directory `tmpdir` is then made here, mode 0700 and
    /// owned by the user (the shell could not make it in the broker's run directory).
    ///
    /// # Errors
    /// The submitter is another user and this broker is not root (rank 0 refuses such a submission; this is the
    /// node's own check), the user has no account on this node, or its directory cannot be made.
    fn run_as(&self, input: &ShellInput, tmpdir: &Path) -> Result<Option<super::spawn::RunAs>, String> {
        let me = self.broker.env.uid;
        let uid = match input.userid {
            Some(u) if u != me => u,
            _ => return Ok(None),
        };
        if me != 0 {
            return Err(format!(
                "running jobs as uid {uid} needs vigil-imp, not yet available: this broker runs as uid {me}"
            ));
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
        Ok(Some(user))
    }

    /// The job shell program: `exec.shell`, else `$VIGIL_SHELL`, else `vigil-shell` beside this program.
    fn shell_path(&self) -> PathBuf {
        if let Some(p) = &self.broker.opts.config.shell {
            return p.clone();
        }
        if let Ok(p) = std::env::var("VIGIL_SHELL") {
            return p.into();
        }
        std::env::current_exe()
            .ok()
            .and_then(|p| p.parent().map(|d| d.join("vigil-shell")))
            .unwrap_or_else(|| "vigil-shell".into())
    }
}

/// Run the initial program in its own process group, made the terminal's foreground group when stdin is a
/// tty (so Ctrl-C reaches it, not the brokers). Reports its pgid, then its exit code.
/// [`Effect::WatchEnclosing`]: follow job `id`'s eventlog in the enclosing instance at `uri` and hand in the
/// ranks of this instance that each of its `node-failure` exceptions names (`shell_ranks`: the job's shells are
/// this instance's brokers, in rank order) as [`Event::EnclosingLost`]. Ends with the eventlog (the job ended),
/// the link, or the broker.
async fn watch_enclosing(uri: String, id: String, tx: mpsc::UnboundedSender<Event>) {
    let c = match crate::client::Client::connect(&uri).await {
        Ok(c) => c,
        Err(e) => return warn!("cannot follow this instance's job in the enclosing instance at {uri}: {e}"),
    };
    let mut s = match c.rpc_stream("job-manager.eventlog", 0, &json!({"id": id, "follow": true})) {
        Ok(s) => s,
        Err(e) => return warn!("cannot follow this instance's job {id} in the enclosing instance: {}", e.errstr),
    };
    while let Some(Ok(v)) = s.next().await {
        let ctx = &v["event"]["context"];
        if v["event"]["name"] != "exception" || ctx["type"] != "node-failure" {
            continue;
        }
        let Some(ranks) = ctx["shell_ranks"].as_str().and_then(|r| crate::idset::IdSet::parse(r).ok()) else {
            continue;
        };
        let hosts = ctx["hosts"].as_str().unwrap_or_default();
        let why = format!("the enclosing instance lost {hosts} (job {id})");
        if !ranks.is_empty() && tx.send(Event::EnclosingLost { ranks, why }).is_err() {
            return;
        }
    }
}

async fn run_initial(argv: Vec<String>, uri: String, tx: mpsc::UnboundedSender<Event>) -> i32 {
    let mut cmd = std::process::Command::new(&argv[0]);
    cmd.args(&argv[1..]).env(crate::client::URI_ENV, &uri);
    if let Some(dir) = std::env::current_exe().ok().and_then(|p| p.parent().map(|d| d.to_path_buf())) {
        let path = std::env::var("PATH").unwrap_or_default();
        cmd.env("PATH", format!("{}:{path}", dir.display()));
    }
    let tty = crate::foreground::own_foreground_group(&mut cmd);
    let mut cmd = tokio::process::Command::from(cmd);
    cmd.kill_on_drop(true);
    let code = match cmd.spawn() {
        Ok(mut child) => {
            if let Some(pid) = child.id() {
                let _ = tx.send(Event::InitialStarted(pid as i32));
            }
            match child.wait().await {
                Ok(s) => {
                    use std::os::unix::process::ExitStatusExt;
                    s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0))
                }
                Err(_) => 1,
            }
        }
        Err(e) => {
            eprintln!("vigil: cannot run initial program '{}': {e}", argv[0]);
            if e.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            }
        }
    };
    if tty {
        // Take the terminal back for `vigil start`'s process group.
        crate::foreground::take_terminal_back();
    }
    code
}

/// A job shell's process as the driver keeps it, however it was started: its pid (also its process group), the
/// broker's ends of its stdin and stdout, and its raw wait status once it has exited.
struct ShellProcess {
    pid: i32,
    stdin: Option<Box<dyn tokio::io::AsyncWrite + Send + Unpin>>,
    stdout: Option<Box<dyn tokio::io::AsyncRead + Send + Unpin>>,
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
        Ok(ShellProcess { pid, stdin, stdout, exit })
    }

    /// One created in its cgroup by [`super::spawn::spawn`].
    fn from_spawned(s: super::spawn::Spawned) -> Result<ShellProcess, String> {
        use tokio::net::unix::pipe;
        let stdin = pipe::Sender::from_owned_fd(s.stdin).map_err(|e| format!("the job shell's stdin: {e}"))?;
        let stdout = pipe::Receiver::from_owned_fd(s.stdout).map_err(|e| format!("the job shell's stdout: {e}"))?;
        let pid = s.pid;
        let pidfd = s.pidfd;
        let exit = Box::pin(async move { super::spawn::wait(pid, pidfd).await.unwrap_or(UNKNOWN_STATUS) });
        Ok(ShellProcess { pid, stdin: Some(Box::new(stdin)), stdout: Some(Box::new(stdout)), exit })
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
    use super::shell_forwards;

    #[test]
    fn the_shell_alone_gets_what_it_passes_on_the_group_gets_the_rest() {
        for s in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGUSR1, libc::SIGUSR2] {
            assert!(shell_forwards(s), "signal {s}");
        }
        for s in [libc::SIGKILL, libc::SIGSTOP, libc::SIGCONT, libc::SIGQUIT, 0, -1, 999] {
            assert!(!shell_forwards(s), "signal {s}");
        }
    }
}
