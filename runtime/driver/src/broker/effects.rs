//! The effect executor: [`Driver::execute`] carries out each [`Effect`] the broker hands back (a message to
//! send, a child to accept, a parent to connect to, a node to check, a shell to start or signal...), including
//! starting job shells (on a thread of their own: `shells.rs`) and the initial program ([`run_initial`]).
//!
//! Where the effects come from, and where the inputs they produce go back to the broker, is `driver.rs`'s
//! ([`Driver::flush`]). A shell is started by `shells.rs`, its tasks placed by `placement.rs`; a parent link is
//! made by `links_up.rs`.

use super::confirm::CheckTarget;
use super::core::{Effect, Input, Peer, PARENT};
use super::driver::{Driver, Event};
use super::links_up::{connect_parent, node_answers, Ask, ChildLink};
use super::transport::{merge, tcp_ack_state, Link, TcpTransport};
use crate::message::{errno, Message, MsgType, FLAG_NORESPONSE};

use serde_json::json;
use std::collections::VecDeque;
use std::path::PathBuf;
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
                self.note_lost_verdict(r);
                let tuple = self.children.get(&r).and_then(|c| c.tuple);
                if let Some(d) = self.detect.as_mut() {
                    d.forget_child(r);
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
                // Started off the loop (shells.rs): its outcome comes back as an event.
                self.launcher().start(id, *input, tmpdir);
            }
            Effect::SignalShell { id, signal } => self.shells.signal(id, signal),
            Effect::KillShells => self.shells.kill_all(),
            Effect::StartInitial { argv, env } => {
                let tx = self.input_tx.clone();
                let uri = self.broker.env.local_uri.clone();
                tokio::spawn(async move {
                    let code = run_initial(argv, env, uri, tx.clone()).await;
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
                if let Some(jn) = &p.job_network {
                    d.probe_child_fabric(rank, &jn.iface, jn.addr);
                }
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
        let probe = self.detect.as_ref().map_or_else(|| json!({"probe_port": null}), |d| d.hello_fields());
        let tx = self.input_tx.clone();
        tokio::spawn(async move {
            let result = match ep {
                Some(ep) => connect_parent(
                    &opts,
                    timeout.as_secs_f64(),
                    &transport,
                    &upgrades,
                    &probe,
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

    /// What a shell this broker starts needs from it ([`super::shells::Launcher`]).
    fn launcher(&self) -> super::shells::Launcher {
        let detector_rank = self.broker.opts.config.detector_rank.unwrap_or(self.broker.rank());
        super::shells::Launcher {
            program: self.shell_path(),
            env: vec![
                (crate::client::URI_ENV.into(), self.broker.env.local_uri.clone().into()),
                (crate::shellproto::DETECTOR_RANK_ENV.into(), detector_rank.to_string().into()),
            ],
            uid: self.broker.env.uid,
            imp: self.imp.clone(),
            containment: self.containment.clone(),
            moves: self.spawn_moves.clone(),
            shells: self.shells.clone(),
            events: self.input_tx.clone(),
        }
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
/// this instance's brokers, in rank order), and each severity-2 `exec` exception of a broker of it that failed on a
/// live node, as [`Event::EnclosingLost`]. Ends with the eventlog (the job ended),
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
        // A lost node (`node-failure`), or a broker of this instance that failed on a live node (`exec`, severity
        // 2: jobs/nested.rs); both name this instance's ranks in `shell_ranks`.
        let broker_failed = ctx["type"] == "exec" && ctx["severity"].as_u64().is_some_and(|s| s > 0);
        if v["event"]["name"] != "exception" || !(ctx["type"] == "node-failure" || broker_failed) {
            continue;
        }
        let Some(ranks) = ctx["shell_ranks"].as_str().and_then(|r| crate::idset::IdSet::parse(r).ok()) else {
            continue;
        };
        let hosts = ctx["hosts"].as_str().unwrap_or_default();
        // The verdict is the enclosing instance's, and the reason says so first: `vigil overlay status` inside
        // then reads `lost (reported by the enclosing instance: ...)`.
        let why = if broker_failed {
            format!("reported by the enclosing instance: its broker on {hosts} failed while the node lives (job {id})")
        } else {
            format!("reported by the enclosing instance, which lost {hosts} (job {id}'s node-failure)")
        };
        if !ranks.is_empty() && tx.send(Event::EnclosingLost { ranks, why }).is_err() {
            return;
        }
    }
}

async fn run_initial(
    argv: Vec<String>,
    env: Vec<(String, String)>,
    uri: String,
    tx: mpsc::UnboundedSender<Event>,
) -> i32 {
    let mut cmd = std::process::Command::new(&argv[0]);
    cmd.args(&argv[1..]).envs(env).env(crate::client::URI_ENV, &uri);
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
