//! The simulated driver's effect executor: what the world does with each [`Effect`] a broker asks for (send on a
//! link, connect, start or signal a shell, store and fsync rank 0's journal, exit). Inputs are handed to brokers by
//! the event loop in `lib.rs`.

use super::*;

impl Sim {
    pub(crate) fn execute(&mut self, n: u32, e: Effect, queue: &mut VecDeque<Input>) {
        let lat = self.cfg.latency;
        match e {
            Effect::Store { batch } => self.commit0(batch.as_deref()),
            Effect::Sync { upto } => self.sync0(upto),
            Effect::Send(Peer::Local(id), m) => {
                if n == 0 && id == CLIENT {
                    self.client_got(m);
                }
            }
            Effect::Send(peer, m) => {
                let (to, child, seen_as) = match peer {
                    Peer::Parent => match self.links.get(&n) {
                        Some(l) => (l.parent, n, Peer::Child(n)),
                        None if n != 0 => {
                            if m.msgtype == MsgType::Request {
                                queue.push_back(Input::Bounced(peer, m));
                            }
                            return;
                        }
                        None => return,
                    },
                    Peer::Child(r) => (r, r, Peer::Parent),
                    Peer::Local(_) => unreachable!("handled above"),
                };
                if let Peer::Child(r) = peer {
                    if let Some(conn) = self.stale_child(n, r) {
                        // Its socket here is one the child no longer holds: a reset comes back from a live node;
                        // to a dead one the data stays unacknowledged (the ack samples say so).
                        if self.nodes[r as usize].kernel && self.reachable(n, r) {
                            let why = "connection reset by peer".to_string();
                            self.after(lat * 2, Ev::Input(n, Input::Closed(peer, conn, why)));
                        }
                        return;
                    }
                }
                let Some(link) = self.links.get(&child).copied() else {
                    if m.msgtype == MsgType::Request {
                        queue.push_back(Input::Bounced(peer, m));
                    }
                    return;
                };
                let open_here = if peer == Peer::Parent { link.at_child } else { link.at_parent };
                if !open_here {
                    if m.msgtype == MsgType::Request {
                        queue.push_back(Input::Bounced(peer, m));
                    }
                    return;
                }
                if !self.reachable(n, to) {
                    return; // lost on the wire; the sender's liveness rules notice
                }
                let open_there = if peer == Peer::Parent { link.at_parent } else { link.at_child };
                let conn = if seen_as == Peer::Parent { 0 } else { link.conn };
                if !open_there || self.nodes[to as usize].broker.is_none() {
                    // The far kernel has no socket for it: a reset comes back, and this end closes.
                    let mine = if peer == Peer::Parent { 0 } else { link.conn };
                    self.shut(child, peer == Peer::Parent);
                    let rtt = lat * 2;
                    self.after(rtt, Ev::Input(n, Input::Closed(peer, mine, "connection reset by peer".into())));
                    return;
                }
                let at = self.wire_arrival(child, peer == Peer::Parent);
                self.at(at, Ev::Input(to, Input::Message(seen_as, conn, m)));
            }
            Effect::AcceptChild { conn, rank } => {
                let (adopt, last_resort) = match self.links.get_mut(&rank) {
                    Some(l) if l.conn == conn => {
                        l.at_parent = true;
                        (l.adopt, l.last_resort)
                    }
                    _ => {
                        // A hello read late (this broker was stopped) from a child that gave up on this link or
                        // died since: its EOF follows if it closed the link while this node could hear it; else
                        // what this broker sends it is reset by its live node, or stays unacknowledged by its dead
                        // one (`stale_child`), and the TCP rule judges it lost (the prober, which probes every
                        // child accepted, reports no miss for a node that never answered, as the real one).
                        let t = ProbeTarget { timing: self.nodes[n as usize].probe_all, ..Default::default() };
                        self.nodes[n as usize].prober.insert(rank, t);
                        if !self.nodes[n as usize].probing {
                            self.nodes[n as usize].probing = true;
                            let p = Duration::from_secs_f64(self.membership.probe_period);
                            self.after(p, Ev::ProbeRound(n));
                        }
                        return;
                    }
                };
                let children = self.broker(n).map_or(0, |b| b.children.len());
                let limit = crate::broker::reparent::adopt_limit(self.cfg.topo, self.cfg.brokers, n);
                if adopt && n == 0 && last_resort {
                    // Rank 0's last resort (reparent.rs): past its limit if it is still full.
                    self.watch.last_resort += 1;
                } else if adopt && children > limit {
                    let worst = self.watch.over_limit.entry(n).or_insert(0);
                    *worst = (*worst).max(children);
                }
                let choice = crate::broker::links::LinkChoice { transport: "tcp", detail: "simulated".into() };
                self.after(lat, Ev::Input(rank, Input::ParentUp(choice)));
                if !adopt {
                    self.after(lat, Ev::Input(rank, Input::Start));
                }
                let t = ProbeTarget { timing: self.nodes[n as usize].probe_all, ..Default::default() };
                self.nodes[n as usize].prober.insert(rank, t);
                let mut probers = vec![n];
                if self.cfg.probe_parent {
                    let t = ProbeTarget { timing: self.nodes[rank as usize].probe_all, ..Default::default() };
                    self.nodes[rank as usize].parent_probe = Some((n, t));
                    probers.push(rank);
                }
                for x in probers {
                    if !self.nodes[x as usize].probing {
                        self.nodes[x as usize].probing = true;
                        let p = Duration::from_secs_f64(self.membership.probe_period);
                        self.after(p, Ev::ProbeRound(x));
                    }
                }
            }
            Effect::RefuseChild { conn, why, full } => {
                if let Some((&child, l)) = self.links.iter().find(|(_, l)| l.conn == conn) {
                    if l.adopt {
                        self.links.remove(&child);
                        self.after(lat, Ev::Input(child, Input::ParentRefused { why, full }));
                        return;
                    }
                    self.links.remove(&child);
                    self.violations.push(format!("rank {child} was refused by its parent: {why}"));
                    self.process_gone(child, 1);
                }
            }
            Effect::DropLink(Peer::Parent, _) => self.close_end(n, n, "EOF"),
            Effect::ConnectParent { rank: p, lost, timeout, last_resort } => {
                let now = self.now;
                let open = self.watch.open.entry(n).or_insert((lost, now, 0, 0));
                if open.0 != lost {
                    *open = (lost, now, 0, 0);
                }
                open.2 += 1;
                if let Some(i) = self.triggers.iter().position(|t| t.orphan == n && t.candidate == p) {
                    let t = self.triggers.swap_remove(i);
                    self.after(t.after, Ev::Fault(t.fault));
                }
                let (pn, nn) = (&self.nodes[p as usize], &self.nodes[n as usize]);
                if !pn.kernel || !nn.kernel || self.cut.contains_key(&n) {
                    // No SYN-ACK: the attempt times out.
                    if let Some(o) = self.watch.open.get_mut(&n) {
                        o.3 += 1;
                    }
                    self.after(timeout, Ev::Input(n, Input::ParentFailed("no answer".into())));
                } else if pn.broker.is_none() {
                    self.after(lat * 2, Ev::Input(n, Input::ParentFailed("connection refused".into())));
                } else {
                    let conn = self.next_conn;
                    self.connect_to(n, p, Some(lost), last_resort);
                    self.after(timeout, Ev::ConnectDeadline(n, conn));
                }
            }
            Effect::DropLink(Peer::Child(r), conn) => {
                if self.links.get(&r).is_some_and(|l| l.conn == conn) {
                    self.close_end(n, r, "EOF");
                }
            }
            Effect::DropLink(Peer::Local(_), _) => {}
            Effect::ForgetChild(r) => {
                self.nodes[n as usize].prober.remove(&r);
            }
            Effect::Beat => self.nodes[n as usize].last_beat = self.now,
            Effect::Heartbeat | Effect::SampleAcks => {
                if matches!(e, Effect::Heartbeat) {
                    self.nodes[n as usize].last_beat = self.now;
                }
                // The links sampled: (membership key, the link's child rank, the node at the far end).
                let mut links = Vec::new();
                if let Some(l) = self.links.get(&n).copied() {
                    if l.at_child {
                        links.push((PARENT, n, l.parent));
                    }
                }
                let children =
                    self.nodes[n as usize].broker.as_ref().map(|b| b.children.keys().copied().collect::<Vec<_>>());
                for c in children.unwrap_or_default() {
                    if self.stale_child(n, c).is_some() {
                        // A dead child's kernel acknowledges nothing sent on the socket it left here.
                        if !self.nodes[c as usize].kernel {
                            links.push((c, c, c));
                        }
                    } else if self.links.get(&c).is_some_and(|l| l.at_parent) {
                        links.push((c, c, c));
                    }
                }
                // The kernel's round trip bound (srtt + 4 rttvar) of a link: round trips of 2 × latency plus two
                // queueing delays of up to `jitter` each (mean `jitter`, mean deviation about a third of it).
                let rtt_bound = if self.cfg.load.any() {
                    (self.cfg.latency * 2).as_secs_f64() + 2.5 * self.cfg.load.jitter.as_secs_f64()
                } else {
                    0.0
                };
                let mut samples = Vec::with_capacity(links.len());
                for (key, child, far) in links {
                    let (unacked, age) = match self.silent_since(child, far) {
                        Some(t) => (1, self.now.since(t).as_secs_f64()),
                        None => self.loaded_ack(far),
                    };
                    samples.push((key, unacked, age, rtt_bound));
                }
                if !samples.is_empty() {
                    queue.push_back(Input::AckSamples(samples));
                }
            }
            Effect::SpawnShell { id, input, .. } => {
                let secs = match input.command.as_slice() {
                    [s, t, ..] if s == "sleep" => t.parse::<f64>().unwrap_or(0.0),
                    _ => 0.0,
                };
                if input.shell_rank == 0 && self.spawned.insert(id) {
                    self.spawn_order.push(id);
                }
                self.nodes[n as usize].shells.insert(id, self.now);
                self.after(Duration::from_secs_f64(secs.max(0.0)), Ev::ShellEnd(n, id, 0));
                queue.push_back(Input::ShellStarted { id, result: Ok(200_000 + n as i32) });
            }
            Effect::SignalShell { id, signal } => {
                if self.nodes[n as usize].shells.contains_key(&id) && signal != vigil_core::signal::SIGCONT {
                    self.after(Duration::from_millis(1), Ev::ShellEnd(n, id, signal));
                }
            }
            Effect::KillShells => {
                let ids: Vec<JobId> = self.nodes[n as usize].shells.keys().copied().collect();
                for id in ids {
                    self.after(Duration::from_millis(1), Ev::ShellEnd(n, id, vigil_core::signal::SIGKILL));
                }
            }
            Effect::WatchPid(pid) => {
                queue.push_back(Input::WatchFailed(pid, crate::message::errno::ENOSYS, "simulated".into()))
            }
            Effect::CheckNode { token, target, wait } => {
                // The kernel of the node checked answers a SYN unless the node died or its link is cut: a cut link
                // is the node's own port, which the checks of its siblings cross too (`confirm.rs`).
                let (node, link) = match target {
                    CheckTarget::Parent => match self.links.get(&n) {
                        Some(l) => (Some(l.parent), n),
                        None => (None, n),
                    },
                    CheckTarget::Node { node, .. } => {
                        let c = node.strip_prefix("node").and_then(|c| c.parse::<u32>().ok());
                        (c.filter(|c| (*c as usize) < self.nodes.len()), c.unwrap_or(n))
                    }
                };
                let input = |answered| Input::NodeChecked { token, answered };
                // Under load the SYN or its answer may be lost (the next SYN would go 1 s later: past the wait),
                // and it queues on the way.
                let (lost, queued) = if self.cfg.load.any() {
                    let lost = self.load_chance(self.cfg.load.loss * 2.0);
                    (lost, self.load_draw(self.cfg.load.jitter) + self.load_draw(self.cfg.load.jitter))
                } else {
                    (false, Duration::ZERO)
                };
                let rtt = lat * 2 + queued;
                match node {
                    None => queue.push_back(input(None)),
                    Some(c)
                        if self.nodes[c as usize].kernel && !self.cut.contains_key(&link) && !lost && rtt < wait =>
                    {
                        self.after(rtt, Ev::Input(n, input(Some(true))))
                    }
                    Some(_) => self.after(wait, Ev::Input(n, input(Some(false)))),
                }
            }
            Effect::StartInitial { .. }
            | Effect::SignalInitial(_)
            | Effect::WriteFile(..)
            | Effect::ReportNested { .. }
            | Effect::WatchEnclosing { .. } => {}
        }
    }
}
