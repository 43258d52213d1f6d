//! What the detectors run on and what the prober does, as `vigil uptime` and `vigil overlay status` show them:
//! [`DetectorStatus`] (one line per detector: `ebpf`, `xdp (...)` or `userspace (why)`, set as the detectors
//! start and load, `load.rs`) and [`ProberStats`] (the prober's counts, updated every period by its thread,
//! `prober_thread.rs`). Plain data and its wording; nothing here decides anything.

use serde::Serialize;

/// What each detector runs on: `ebpf`/`xdp ...` or `userspace (reason)`. Shown by `vigil uptime` and
/// `vigil overlay status`.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub(crate) struct DetectorStatus {
    /// Process-exit detection of tasks, shells and brokers.
    pub process_exit: String,
    /// Overlay TCP connection watching.
    pub tcp: String,
    /// Who answers the parent's heartbeat probes for this broker.
    pub responder: String,
    /// Probing of children: period and misses that make a kernel-answering node lost.
    pub probes: String,
    /// This node's job network (`tbon.job_network`): `off (tbon.job_network unset)`, `IFACE (ADDR), answered by
    /// ...`, or why it is not probed (said once, here and in the log).
    pub job_network: String,
}

/// What the prober does right now (parents only), for `vigil overlay status`: updated every period.
#[derive(Debug, Default)]
pub(crate) struct ProberStats {
    /// Children probed by the group datagram.
    pub grouped: std::sync::atomic::AtomicU32,
    /// Children probed by unicast.
    pub unicast: std::sync::atomic::AtomicU32,
    /// Of the unicast ones, those the group datagram does not reach.
    pub unreached: std::sync::atomic::AtomicU32,
    /// Replies are collected by this node's kernel (XDP), not received on the prober's socket.
    pub collected: std::sync::atomic::AtomicBool,
    /// Periods in which no child answered and none was blamed (this node's own receive path looked stalled).
    pub void_rounds: std::sync::atomic::AtomicU64,
    /// Periods in which several children were past their reply time at once and none was blamed
    /// (`vigil_core::probe::correlated_silence`).
    pub correlated_rounds: std::sync::atomic::AtomicU64,
    /// Probe replies accepted so far (`Prober::replies`).
    pub replies: std::sync::atomic::AtomicU64,
    /// Probe datagrams sent so far (`Prober::sent`).
    pub sent: std::sync::atomic::AtomicU64,
    /// Datagrams read on the probe socket and dropped as no reply of ours (`Prober::rejected`).
    pub rejected: std::sync::atomic::AtomicU64,
    /// Children whose job network is probed too (`fabric_prober.rs`).
    pub fabric: std::sync::atomic::AtomicU32,
    /// The parent's node is probed too (by unicast; not counted in `unicast`).
    pub parent: std::sync::atomic::AtomicBool,
    /// The prober thread's scheduling, once it started (`prober_thread.rs`).
    pub priority: std::sync::OnceLock<String>,
}

impl ProberStats {
    /// One line: `3 children by group datagram, 1 by unicast; replies collected by the kernel (XDP)`.
    pub(crate) fn describe(&self) -> String {
        use std::sync::atomic::Ordering::Relaxed;
        let unreached = self.unreached.load(Relaxed);
        let void = self.void_rounds.load(Relaxed);
        let correlated = self.correlated_rounds.load(Relaxed);
        let fabric = self.fabric.load(Relaxed);
        format!(
            "{} children by group datagram, {} by unicast{}{}{}; replies {}{}{}{}",
            self.grouped.load(Relaxed),
            self.unicast.load(Relaxed),
            if fabric > 0 { format!(", {fabric} also on their job network") } else { String::new() },
            if unreached > 0 { format!(" ({unreached} not reached by the group)") } else { String::new() },
            if self.parent.load(Relaxed) { ", and the parent's node by unicast" } else { "" },
            if self.collected.load(Relaxed) {
                "collected by the kernel (XDP)"
            } else {
                "received on the prober's socket"
            },
            if void > 0 {
                format!("; {void} periods not judged (no child answered: this node's receive path was behind)")
            } else {
                String::new()
            },
            if correlated > 0 {
                format!("; {correlated} periods excused (several children late at once: links or this node slowed)")
            } else {
                String::new()
            },
            self.priority.get().map(|p| format!("; prober thread {p}")).unwrap_or_default()
        )
    }
}
