//! Each parent's prober, simulated: probe rounds to every child node (and to the parent), kernel replies and
//! their timing, and what the real prober (`broker/detect/prober.rs` in the driver) forwards to its broker:
//! a reply when it changes a verdict or once a second, every new miss. The world is in `lib.rs`.

use super::*;

impl Sim {
    /// A parent's prober round: every child node probed, what the real prober forwards handed to the broker
    /// (and with [`Config::probe_parent`], the parent's node too, as [`PARENT`]).
    pub(crate) fn probe_round(&mut self, n: u32) {
        // The parent probed only while the link to it is up.
        if let Some((p, _)) = self.nodes[n as usize].parent_probe {
            if !self.links.get(&n).is_some_and(|l| l.parent == p && l.at_child) {
                self.nodes[n as usize].parent_probe = None;
            }
        }
        let node = &self.nodes[n as usize];
        if node.broker.is_none() || (node.prober.is_empty() && node.parent_probe.is_none()) {
            self.nodes[n as usize].probing = false;
            return;
        }
        let period = Duration::from_secs_f64(self.membership.probe_period);
        if node.stopped_until.is_some() {
            // The prober is a task of the stopped process: it runs again on resume.
            self.after(period, Ev::ProbeRound(n));
            return;
        }
        let stall_note = self.membership.stall_max / 2.0;
        // Targets: (the membership key, the node probed).
        let mut targets: Vec<(u32, u32)> = node.prober.keys().map(|&c| (c, c)).collect();
        let period_s = self.membership.probe_period;
        if let Some((p, _)) = node.parent_probe {
            targets.push((PARENT, p));
        }
        let mut signals = Vec::new();
        if self.cfg.load.any() {
            // As the real prober: every reply that arrived is read first, then misses are counted, with periods
            // in which several children are past their reply time at once excused (vigil_core::probe).
            for &(key, c) in &targets {
                self.probe_loaded(n, key, c, &mut signals);
            }
            let correlated = self.correlated_silence(n);
            for (key, c) in targets {
                self.judge_loaded(n, key, c, correlated, &mut signals);
            }
            targets = Vec::new();
        }
        for (key, c) in targets {
            let reach = self.reachable(n, c);
            let child = &self.nodes[c as usize];
            let (alive, age) = (child.broker.is_some(), self.now.since(child.last_beat).as_secs_f64());
            let now = self.now;
            let rtt = (self.cfg.latency * 2).as_secs_f64();
            let Node { prober, parent_probe, probe_all, .. } = &mut self.nodes[n as usize];
            let t = if key == PARENT {
                &mut parent_probe.as_mut().expect("listed").1
            } else {
                prober.get_mut(&c).expect("listed")
            };
            if reach {
                t.timing.sample(rtt);
                probe_all.sample(rtt);
                // As the real prober: no kernel reply forwarded before the node's reply time is known (but one
                // saying its broker is dead).
                if !vigil_core::probe::judged_by(&t.timing, probe_all).armed() && alive {
                    continue;
                }
                let stalled = age >= stall_note;
                let recovered = t.missed_reported > 0;
                let refresh = t.forwarded.is_none_or(|f| now.since(f) >= Duration::from_secs(1));
                let first = !t.answered_once;
                t.answered_once = true;
                t.outstanding = 0;
                t.missed_reported = 0;
                if first || stalled || t.stalled != stalled || !alive || recovered || refresh {
                    t.stalled = stalled;
                    t.forwarded = Some(now);
                    signals.push((key, Signal::ProbeReply { kernel: true, alive, hb_age: age }));
                }
            } else {
                t.outstanding += 1;
                // Past the child's reply time (vigil_core::probe; on these links, one period).
                let timing = vigil_core::probe::judged_by(&t.timing, probe_all);
                let missed = vigil_core::probe::missed(
                    t.outstanding,
                    vigil_core::probe::patience_of(&t.timing, probe_all, period_s),
                );
                if t.answered_once && timing.armed() && missed > t.missed_reported {
                    t.missed_reported = missed;
                    signals.push((key, Signal::ProbeMissed { misses: missed }));
                }
            }
        }
        for (c, s) in signals {
            self.handle(n, Input::Probe(c, s));
            if self.nodes[n as usize].broker.is_none() {
                return;
            }
        }
        self.after(period, Ev::ProbeRound(n));
    }

    /// One probe round of node `n` to target `key` (node `c`) under [`Load`], as the real prober does it: the
    /// replies that arrived since the last round are read (each times the child's replies), misses are counted
    /// past the child's reply time, and this round's probe goes out, to be answered after the link's queueing
    /// (or lost). A userspace responder answers only while its broker runs, and never arms the miss rule.
    fn probe_loaded(&mut self, n: u32, key: u32, c: u32, signals: &mut Vec<(u32, Signal)>) {
        let now = self.now;
        let stall_note = self.membership.stall_max / 2.0;
        let reach = self.reachable(n, c);
        let lost = self.load_chance(self.cfg.load.loss * 2.0);
        let queued = self.load_draw(self.cfg.load.jitter) + self.load_draw(self.cfg.load.jitter);
        let child = &self.nodes[c as usize];
        let (alive, age) = (child.broker.is_some(), now.since(child.last_beat).as_secs_f64());
        let userspace = child.userspace;
        let mut arrive = now + self.cfg.latency * 2 + queued;
        if userspace {
            match (child.broker.is_some(), child.stopped_until) {
                (false, _) => arrive = Time::from_nanos(u64::MAX),
                (true, Some(u)) => arrive = arrive.max(u),
                (true, None) => {}
            }
        }
        let Node { prober, parent_probe, probe_all, .. } = &mut self.nodes[n as usize];
        let t = if key == PARENT {
            match parent_probe.as_mut() {
                Some(p) => &mut p.1,
                None => return,
            }
        } else {
            match prober.get_mut(&c) {
                Some(t) => t,
                None => return,
            }
        };
        // Replies read now; the newest says how the broker was when its node answered.
        let mut got = false;
        let (mut alive, mut age) = (alive, age);
        while let Some(&(at, seq, sent, said_alive, said_age)) = t.inflight.front() {
            if at > now {
                break;
            }
            t.inflight.pop_front();
            // Every kernel reply times the node (vigil_core::probe), and the prober's aggregate.
            if !userspace {
                t.timing.sample(now.since(sent).as_secs_f64());
                probe_all.sample(now.since(sent).as_secs_f64());
            }
            if seq > t.answered {
                t.answered = seq;
                got = true;
                (alive, age) = (said_alive, said_age);
            }
        }
        if got {
            // News: the silence counted by the miss rule starts again.
            t.news_round = t.round;
        }
        // As the real prober: no kernel reply forwarded before the node's reply time is known (but one saying its
        // broker is dead).
        let timing = *vigil_core::probe::judged_by(&t.timing, probe_all);
        if got && !userspace && alive && !timing.armed() {
            got = false;
            t.news_round = t.round;
        }
        t.got = got || t.news_round == t.round;
        if got {
            let stalled = age >= stall_note;
            let recovered = t.missed_reported > 0;
            let refresh = t.forwarded.is_none_or(|f| now.since(f) >= Duration::from_secs(1));
            let first = !t.answered_once;
            t.answered_once = t.answered_once || !userspace;
            t.missed_reported = 0;
            t.excused = 0;
            if first || stalled || t.stalled != stalled || !alive || recovered || refresh {
                t.stalled = stalled;
                t.forwarded = Some(now);
                signals.push((key, Signal::ProbeReply { kernel: !userspace, alive, hb_age: age }));
            }
        }
        // This round's probe (its reply, or loss, drawn now; the misses are counted by judge_loaded).
        t.round += 1;
        if reach && !lost && arrive.as_nanos() != u64::MAX {
            // Replies may overtake each other on a jittery link: kept by arrival.
            let at = t.inflight.partition_point(|x| x.0 <= arrive);
            t.inflight.insert(at, (arrive, t.round, now, alive, age));
        }
    }

    /// Node `n`'s prober target `key`, if it has one.
    fn target(&mut self, n: u32, key: u32) -> Option<(&mut ProbeTarget, &vigil_core::probe::ReplyTiming)> {
        let Node { prober, parent_probe, probe_all, .. } = &mut self.nodes[n as usize];
        let t = if key == PARENT { parent_probe.as_mut().map(|p| &mut p.1) } else { prober.get_mut(&key) };
        t.map(|t| (t, &*probe_all))
    }

    /// Whether node `n`'s children are past their reply time in a correlated silence this round (the real
    /// prober's rule, `vigil_core::probe::correlated_silence`), counted after the round's replies were read.
    fn correlated_silence(&self, n: u32) -> bool {
        let node = &self.nodes[n as usize];
        let period = self.membership.probe_period;
        let (mut judged, mut silent) = (0, 0);
        for t in node.prober.values() {
            if t.answered_once && vigil_core::probe::judged_by(&t.timing, &node.probe_all).armed() {
                judged += 1;
                let patience = vigil_core::probe::patience_of(&t.timing, &node.probe_all, period);
                // Rounds are counted before this round's probe went out, as the real prober counts them.
                let outstanding = (t.round - 1).saturating_sub(t.news_round);
                if !t.got && vigil_core::probe::missed_excused(outstanding, t.excused, patience) >= 1 {
                    silent += 1;
                }
            }
        }
        vigil_core::probe::correlated_silence(silent, judged)
    }

    /// The miss count of node `n`'s target `key` after this round's read (see [`Sim::probe_loaded`]).
    fn judge_loaded(&mut self, n: u32, key: u32, _c: u32, correlated: bool, signals: &mut Vec<(u32, Signal)>) {
        let period = self.membership.probe_period;
        let Some((t, all)) = self.target(n, key) else { return };
        if t.got || !t.answered_once || !vigil_core::probe::judged_by(&t.timing, all).armed() {
            return;
        }
        let patience = vigil_core::probe::patience_of(&t.timing, all, period);
        let outstanding = (t.round - 1).saturating_sub(t.news_round);
        if correlated
            && key != PARENT
            && t.excused < vigil_core::probe::MAX_EXCUSED
            && vigil_core::probe::missed_excused(outstanding, t.excused, patience) >= 1
        {
            t.excused += 1;
        }
        let missed = vigil_core::probe::missed_excused(outstanding, t.excused, patience);
        if missed > t.missed_reported {
            t.missed_reported = missed;
            signals.push((key, Signal::ProbeMissed { misses: missed }));
        }
    }
}
