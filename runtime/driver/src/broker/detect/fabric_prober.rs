//! The prober's probes of its children's job networks (`tbon.job_network`): each period a unicast probe to each
//! child's job-network address, answered there by the broker's job-network responder, and what that says next to
//! what the management probes say (`Prober`), sent to the driver's loop as [`DetectInput::Fabric`]. The driver
//! applies the fabric-down rule (`vigil_core::membership::FabricWatch`). No socket here (`prober_thread.rs` sends
//! and reads); misses are counted as the management probes count theirs (`vigil_core::probe`: a period without
//! news past the child's reply time, once it answered [`probe::ARM_REPLIES`] times).

use super::prober::Prober;
use super::DetectInput;
use std::collections::HashMap;
use std::net::SocketAddr;
use tokio::sync::mpsc;
use vigil_core::probe::{self, ReplyTiming};
use vigil_ebpf::{Probe, ProbeKind};

/// An observation is sent again after this long even if nothing changed (ns): the undrain timer of the rule
/// (`tbon.job_network_undrain_after`) is judged then.
const REFRESH_NS: u64 = 1_000_000_000;

/// One child's job network.
struct FabricTarget {
    addr: SocketAddr,
    /// Last round it answered, and the round during which its last news came.
    answered: u32,
    news_round: u32,
    timing: ReplyTiming,
    timed_seq: u32,
    /// Last observation sent (misses, management ok) and when (`CLOCK_MONOTONIC` ns).
    reported: Option<(u32, bool)>,
    reported_ns: u64,
    /// Whether its last reply came from its node's kernel (XDP on the job network), not the broker's thread.
    kernel: bool,
}

/// The job-network probes of one prober.
pub(super) struct FabricProber {
    targets: HashMap<u32, FabricTarget>,
    round: u32,
    key: u64,
    all: ReplyTiming,
    period: f64,
    /// Periods of silence from a child answered by its broker's thread, not its kernel, that do not count as
    /// misses ([`FabricProber::new`]).
    userspace_grace: u32,
    tx: mpsc::UnboundedSender<DetectInput>,
    /// Replies accepted, probes sent (for `vigil overlay status`).
    pub(super) replies: u64,
    pub(super) sent: u64,
}

impl FabricProber {
    /// Probes keyed with `key` (as the management ones: a forged reply must echo it), every `period` seconds.
    /// `stall_max` (seconds, `tbon.stall_max`): a child whose job network is answered by its broker's thread (no
    /// XDP responder there) and not its kernel is silent that long before a miss counts, since such silence is
    /// also what a starved broker shows while its heartbeat is still fresh (at load 177 every such child of a
    /// parent was drained within the 3 misses of a kernel-answered one); a kernel answer is never starved.
    pub(super) fn new(key: u64, period: f64, stall_max: f64, tx: mpsc::UnboundedSender<DetectInput>) -> FabricProber {
        let userspace_grace = if period > 0.0 { (stall_max / period).ceil().clamp(0.0, 1e6) as u32 } else { 0 };
        FabricProber {
            targets: HashMap::new(),
            round: 0,
            key,
            all: ReplyTiming::default(),
            period,
            userspace_grace,
            tx,
            replies: 0,
            sent: 0,
        }
    }

    /// Probe child `rank`'s job network at `addr` (its job-network responder).
    pub(super) fn add(&mut self, rank: u32, addr: SocketAddr) {
        let t = FabricTarget {
            addr,
            answered: self.round,
            news_round: self.round,
            timing: ReplyTiming::default(),
            timed_seq: 0,
            reported: None,
            reported_ns: 0,
            kernel: false,
        };
        self.targets.insert(rank, t);
    }

    pub(super) fn remove(&mut self, rank: u32) {
        self.targets.remove(&rank);
    }

    /// Children probed.
    pub(super) fn len(&self) -> usize {
        self.targets.len()
    }

    /// A reply read from the job-network socket at `now` (`CLOCK_MONOTONIC` ns), `from` its sender.
    pub(super) fn reply(&mut self, p: &Probe, from: SocketAddr, now: u64) {
        if !matches!(p.kind, ProbeKind::ReplyKernel | ProbeKind::ReplyUserspace) || p.seq > self.round {
            return;
        }
        let sent = p.sent_ns ^ self.key;
        if sent > now || now - sent > 60_000_000_000 {
            return; // not an echo of one of our requests
        }
        let round = self.round;
        let Some(t) = self.targets.get_mut(&p.rank) else { return };
        if from != t.addr {
            return;
        }
        self.replies += 1;
        t.kernel = p.kind == ProbeKind::ReplyKernel;
        if p.seq != t.timed_seq {
            t.timed_seq = p.seq;
            let rtt = now.saturating_sub(sent) as f64 / 1e9;
            t.timing.sample(rtt);
            self.all.sample(rtt);
        }
        if p.seq > t.answered {
            t.answered = p.seq;
            t.news_round = round;
        }
    }

    /// Start of a period, every reply read: send the driver what changed (each armed child's misses in a row on
    /// its job network, and whether `mgmt` says its management network answers), then the next round's probes.
    pub(super) fn next_round(&mut self, mgmt: &Prober, now: u64) -> Vec<([u8; vigil_ebpf::PROBE_LEN], SocketAddr)> {
        for (rank, t) in self.targets.iter_mut() {
            if !probe::judged_by(&t.timing, &self.all).armed() {
                continue;
            }
            let patience = probe::patience_of(&t.timing, &self.all, self.period);
            let mut missed = probe::missed(self.round - t.news_round, patience);
            if !t.kernel {
                missed = missed.saturating_sub(self.userspace_grace);
            }
            let seen = (missed, mgmt.answers(*rank));
            if t.reported != Some(seen) || now.saturating_sub(t.reported_ns) >= REFRESH_NS {
                t.reported = Some(seen);
                t.reported_ns = now;
                let _ = self.tx.send(DetectInput::Fabric { rank: *rank, missed: seen.0, mgmt_ok: seen.1 });
            }
        }
        self.round += 1;
        let stamp = now ^ self.key;
        let out: Vec<_> =
            self.targets.iter().map(|(rank, t)| (Probe::request(self.round, *rank, stamp).encode(), t.addr)).collect();
        self.sent += out.len() as u64;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply_to(req: &[u8]) -> Probe {
        let p = Probe::decode(req).expect("a request");
        Probe { kind: ProbeKind::ReplyKernel, flags: 1, ..p }
    }

    /// A fabric prober (10 ms periods, `tbon.stall_max` 50 ms) whose child 3 answered 20 rounds within 1 ms with
    /// replies of `kind` (each also sent again from another address, which counts for nothing): the prober, the
    /// management prober (which has no such child: "not ok"), the receiver of observations, and the time now.
    fn armed(kind: ProbeKind) -> (FabricProber, Prober, mpsc::UnboundedReceiver<DetectInput>, u64) {
        let (tx, rx) = mpsc::unbounded_channel();
        let mgmt = Prober::new(7, 1, None, tx.clone(), 0.05);
        let mut f = FabricProber::new(7, 0.01, 0.05, tx);
        let addr: SocketAddr = "10.201.0.3:5000".parse().unwrap();
        f.add(3, addr);
        let mut now = 1_000_000_000u64;
        for _ in 0..20 {
            let out = f.next_round(&mgmt, now);
            now += 1_000_000; // answered within 1 ms
            let p = Probe { kind, ..reply_to(&out[0].0) };
            f.reply(&p, addr, now);
            f.reply(&p, "10.201.0.9:5000".parse().unwrap(), now);
            now += 9_000_000;
        }
        (f, mgmt, rx, now)
    }

    /// `rounds` periods of silence after [`armed`]: the misses each observation sent said.
    fn silent(
        f: &mut FabricProber,
        mgmt: &Prober,
        rx: &mut mpsc::UnboundedReceiver<DetectInput>,
        mut now: u64,
        rounds: usize,
    ) -> Vec<u32> {
        while rx.try_recv().is_ok() {}
        for _ in 0..rounds {
            f.next_round(mgmt, now);
            now += 10_000_000;
        }
        let mut seen = Vec::new();
        while let Ok(DetectInput::Fabric { missed, .. }) = rx.try_recv() {
            seen.push(missed);
        }
        seen
    }

    /// A child whose job network answers, then stops: once armed, its misses grow by one a period and are sent
    /// (only when they change); replies from elsewhere or not echoing our key count for nothing.
    #[test]
    fn misses_are_counted_once_armed_and_sent_when_they_change() {
        let (mut f, mgmt, mut rx, now) = armed(ProbeKind::ReplyKernel);
        let mut seen = Vec::new();
        while let Ok(DetectInput::Fabric { rank, missed, mgmt_ok }) = rx.try_recv() {
            seen.push((rank, missed, mgmt_ok));
        }
        // Armed after 8 replies: one observation, no miss (the management prober has no such child: not ok).
        assert_eq!(seen, vec![(3, 0, false)]);
        assert_eq!(f.replies, 20);
        // Silent from now on: the period of the last reply is judged clean, then 1, 2, 3 misses, one observation
        // each.
        assert_eq!(silent(&mut f, &mgmt, &mut rx, now, 4), vec![1, 2, 3]);
    }

    /// A child answered by its broker's thread (no XDP responder on its job network) is silent for
    /// `tbon.stall_max` before its misses count: a starved broker whose heartbeat is still fresh looks the same.
    #[test]
    fn a_userspace_answer_is_given_the_stall_window_before_misses_count() {
        let (mut f, mgmt, mut rx, now) = armed(ProbeKind::ReplyUserspace);
        // 8 periods judged silent: the first 5 (50 ms of 10 ms periods) are the grace, then 1, 2, 3.
        assert_eq!(silent(&mut f, &mgmt, &mut rx, now, 9), vec![1, 2, 3]);
    }
}
