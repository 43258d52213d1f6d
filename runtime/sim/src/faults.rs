//! Faults: what can strike a node, a broker or a link ([`Fault`]), injecting one now ([`Sim::inject`]) or at a
//! time ([`Sim::fault_at`]), and a stopped broker's resumption. The world they strike is in `lib.rs`; scenarios
//! that schedule them are in `scenario.rs`.

use super::*;

/// A fault to inject.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The node dies silently (power, kernel panic): nothing more from its kernel or its broker.
    NodeLoss(u32),
    /// The broker process is killed (`kill -9`): its kernel closes its connections.
    Crash(u32),
    /// The broker is stopped (`SIGSTOP`) for this long, then continued.
    Stall(u32, Duration),
    /// The link between this rank and its parent is cut both ways.
    Cut(u32),
    /// The cut link of this rank is whole again.
    Heal(u32),
    /// The broker of this rank starts again, a fresh process (its node boots again first if it died); it joins
    /// its static parent as a leaf (`reparent.rs`: its former children stay with their adopters). Ignored while
    /// the broker still runs. Rank 0 with [`Config::statedir`] is restored from its store and its client
    /// connects again.
    Restart(u32),
    /// The broker is killed (`kill -9`) in its next turn that changed the job core's journal, once it has handled
    /// that turn's input and before the commit: nothing the turn changed is kept, and none of what it asked for
    /// (answers, shell starts, messages) is carried out (rank 0 with [`Config::statedir`]; elsewhere a
    /// [`Fault::Crash`]).
    CrashInCommit(u32),
}

impl Fault {
    /// The rank the fault strikes.
    pub fn rank(self) -> u32 {
        match self {
            Fault::NodeLoss(r)
            | Fault::Crash(r)
            | Fault::Stall(r, _)
            | Fault::Cut(r)
            | Fault::Heal(r)
            | Fault::Restart(r)
            | Fault::CrashInCommit(r) => r,
        }
    }
}

/// A fault injected when an orphan asks a given candidate to adopt it (its first such attempt), `after` that.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Trigger {
    pub orphan: u32,
    pub candidate: u32,
    pub after: Duration,
    pub fault: Fault,
}

impl Sim {
    pub(crate) fn resume(&mut self, n: u32) {
        let node = &mut self.nodes[n as usize];
        // A stall that outlasts another (a SIGSTOP during a starved node's burst) resumes at its own end.
        if node.stopped_until.is_some_and(|u| u > self.now) {
            return;
        }
        node.starving = None;
        if node.stopped_until.take().is_none() || node.broker.is_none() {
            return;
        }
        let backlog = std::mem::take(&mut node.backlog);
        let missed = std::mem::take(&mut node.timer_missed);
        for i in backlog {
            if self.nodes[n as usize].broker.is_none() {
                return;
            }
            self.handle(n, i);
        }
        if missed || self.nodes[n as usize].timer.is_none() {
            self.deliver(n, Input::Timer);
        }
    }

    /// Inject a fault now.
    pub fn inject(&mut self, f: Fault) {
        self.faults.push((self.now, f));
        if watched(f.rank()) {
            eprintln!("{:.6} r{} ! {f:?}", self.now.as_secs_f64(), f.rank());
        }
        match f {
            Fault::NodeLoss(n) => {
                let node = &mut self.nodes[n as usize];
                if !node.kernel {
                    return;
                }
                node.kernel = false;
                node.died_at = Some(self.now);
                node.broker = None;
                node.shells.clear();
                node.backlog.clear();
                node.prober.clear();
                node.parent_probe = None;
                node.stopped_until = None;
            }
            Fault::Crash(n) => {
                if n == 0 && self.kept.is_some() {
                    self.rank0_crashed(false);
                }
                self.process_gone(n, 137)
            }
            Fault::CrashInCommit(n) => {
                if n == 0 && self.kept.is_some() {
                    self.crash_in_commit = self.nodes[0].broker.is_some();
                } else {
                    self.process_gone(n, 137)
                }
            }
            Fault::Stall(n, d) => {
                let node = &mut self.nodes[n as usize];
                if node.broker.is_none() || (node.stopped_until.is_some() && node.starving.is_none()) {
                    return;
                }
                // (A starved node's burst is a stop already: the SIGSTOP outlasts it, and its kernel ACKs again.)
                node.starving = None;
                let until = node.stopped_until.map_or(self.now + d, |u| u.max(self.now + d));
                node.stopped_until = Some(until);
                self.after(until.since(self.now), Ev::Resume(n));
            }
            Fault::Cut(c) => {
                self.cut.entry(c).or_insert(self.now);
            }
            Fault::Heal(c) => {
                self.cut.remove(&c);
            }
            Fault::Restart(n) => {
                if n == 0 && self.crash_in_commit {
                    // No turn of rank 0 changed its journal since the crash was asked for: it dies now.
                    self.crash_in_commit = false;
                    self.rank0_crashed(false);
                    self.process_gone(0, 137);
                }
                if self.nodes[n as usize].broker.is_some() {
                    return;
                }
                // The new process has none of the old one's sockets (its node's kernel resets what still comes
                // for them); its own link to a parent is made afresh below.
                let old: Vec<u32> = self.links.iter().filter(|(_, l)| l.parent == n).map(|(c, _)| *c).collect();
                for c in old {
                    self.shut(c, false);
                }
                self.links.remove(&n);
                if n == 0 && self.kept.is_some() {
                    self.restarts0 += 1;
                    // The fsync of the old process is not this one's.
                    self.sync0 = None;
                }
                self.nodes[n as usize] = self.fresh_node(n);
                self.connect(n);
                if n == 0 && self.kept.is_some() {
                    // Restored from its store (in `fresh_node`); its resource eventlog is what was kept.
                    self.watch.seen = self
                        .broker(0)
                        .and_then(|b| b.jobcore.as_ref())
                        .map_or(0, |jc| jc.resource_eventlog.len().saturating_sub(1).min(self.watch.seen));
                    self.client.restarts.push((self.now, None));
                    self.deliver(0, Input::LocalNew { id: CLIENT, uid: UID });
                    self.deliver(0, Input::Start);
                    self.after(REJOIN_POLL, Ev::Check(scenario::CHECK_REJOIN));
                }
            }
        }
    }

    /// Schedule a fault at `t`.
    pub fn fault_at(&mut self, t: Time, f: Fault) {
        self.at(t, Ev::Fault(f));
    }
}
