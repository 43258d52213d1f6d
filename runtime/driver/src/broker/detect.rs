//! A broker's failure detectors (the `ebpf/` crate) and their glue to the membership machine.
//!
//! * **process exit** (`sched_process_exit` + `signal_generate` + `oom/mark_victim`, or pidfd/waitid): job shells
//!   register their tasks (`detect.watch`), and each exit reaches the shell before the kernel has torn the task's
//!   memory down; rank 0 of a test instance also watches the other brokers of its machine.
//! * **TCP** (`inet_sock_set_state`, `tcp_receive_reset`, `tcp_retransmit_skb`) on the overlay's sockets: a reset
//!   or close makes the peer lost at once; a retransmit is a hint that makes the prober probe that child now.
//! * **heartbeat responder**: the node's kernel (XDP) answers the parent's UDP probes with this broker's
//!   liveness and heartbeat age; without XDP a userspace thread answers (it stops with the broker, so its
//!   silence is never read as a dead node).
//! * **prober** (parents): every `tbon.probe_period` a probe to each child node; consecutive misses and
//!   replies go to the membership machine as [`Signal::ProbeMissed`] / [`Signal::ProbeReply`].
//!
//! eBPF loading costs ~0.1 s of CPU, so it runs in the background after the broker is up, and only once per
//! machine in a test instance (`broker.detector-rank`: the other brokers use that rank's detectors). Every
//! fallback is logged once and shown by `vigil uptime` / `vigil overlay status` ([`DetectorStatus`]).

use super::core::PARENT;
use crate::attrs::{BrokerConfig, DetectorChoice, XdpMode};
use crate::membership::Signal;
use serde::Serialize;
use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tracing::{info, warn};
use vigil_core::probe::{self, ReplyTiming};
use vigil_ebpf::{
    Detector, DetectorMode, ExitEvent, HbTable, HeartbeatClock, Probe, ProbeKind, TcpEvent, TcpEventKind, TcpTuple,
    TcpWatcher, UserspaceResponder, XdpAttach, XdpResponder,
};

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
    /// The parent's node is probed too (by unicast; not counted in `unicast`).
    pub parent: std::sync::atomic::AtomicBool,
    /// The prober thread's scheduling, once it started ([`prober_thread`]).
    pub priority: std::sync::OnceLock<String>,
}

impl ProberStats {
    /// One line: `3 children by group datagram, 1 by unicast; replies collected by the kernel (XDP)`.
    pub(crate) fn describe(&self) -> String {
        use std::sync::atomic::Ordering::Relaxed;
        let unreached = self.unreached.load(Relaxed);
        let void = self.void_rounds.load(Relaxed);
        let correlated = self.correlated_rounds.load(Relaxed);
        format!(
            "{} children by group datagram, {} by unicast{}{}; replies {}{}{}{}",
            self.grouped.load(Relaxed),
            self.unicast.load(Relaxed),
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

/// How the detectors are chosen (`broker.detectors`; with `auto`, `$VIGIL_EXIT_DETECTOR` may still force one).
fn mode(c: &BrokerConfig) -> DetectorMode {
    match c.detectors {
        DetectorChoice::Userspace => DetectorMode::ForceUserspace,
        DetectorChoice::Ebpf => DetectorMode::RequireEbpf,
        DetectorChoice::Auto => DetectorMode::from_env(),
    }
}

/// `broker.xdp_mode=auto|native|generic`: how the XDP responder is attached (default `auto`: native on an
/// interface with a device behind it, generic on `lo` and veth).
fn xdp_attach(c: &BrokerConfig) -> XdpAttach {
    match c.xdp_mode {
        XdpMode::Auto => XdpAttach::Auto,
        XdpMode::Native => XdpAttach::Native,
        XdpMode::Generic => XdpAttach::Generic,
    }
}

/// Sets a prober socket to send group probes out of the interface of `local`, one hop, not looped back.
fn multicast_sender(s: &std::net::UdpSocket, local: Ipv4Addr) -> std::io::Result<()> {
    socket2::SockRef::from(s).set_multicast_if_v4(&local)?;
    s.set_multicast_ttl_v4(1)?;
    s.set_multicast_loop_v4(false)
}

/// Directory (on bpffs) of the responder tables the brokers of a machine share.
const PIN_DIR: &str = "/sys/fs/bpf/vigil";

/// Where to pin the responder table shared by the brokers of one test instance (derived from the instance
/// id without revealing it).
pub(crate) fn table_pin_path(instance: &str) -> std::path::PathBuf {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (instance, "vigil-hb").hash(&mut h);
    std::path::PathBuf::from(format!("{PIN_DIR}/{}{:016x}", vigil_ebpf::TABLE_PREFIX, h.finish()))
}

/// Where the XDP owner of `interface` (in this network namespace) pins its responder table for the other
/// brokers of the machine.
fn interface_pin_path(interface: &str) -> std::path::PathBuf {
    interface_pin(vigil_ebpf::TABLE_PREFIX, interface)
}

/// Where the XDP owner of `interface` pins the program's link, so that the program keeps answering for the
/// other brokers of the machine after the owner is gone (see [`vigil_ebpf::sweep_stale_pins`]).
fn interface_link_path(interface: &str) -> std::path::PathBuf {
    interface_pin(vigil_ebpf::LINK_PREFIX, interface)
}

/// `PIN_DIR/<prefix>ns<netns inode>-<interface>`.
fn interface_pin(prefix: &str, interface: &str) -> std::path::PathBuf {
    use std::os::unix::fs::MetadataExt;
    let ns = std::fs::metadata("/proc/self/ns/net").map(|m| m.ino()).unwrap_or(0);
    std::path::PathBuf::from(format!("{PIN_DIR}/{prefix}ns{ns}-{interface}"))
}

/// Removes the responder pins of this machine that nothing uses any more, says so, and returns their paths.
fn sweep_pins(when: &str) -> Vec<std::path::PathBuf> {
    match vigil_ebpf::sweep_stale_pins(std::path::Path::new(PIN_DIR)) {
        Ok(gone) => {
            let links = gone
                .iter()
                .filter(|p| {
                    p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(vigil_ebpf::LINK_PREFIX))
                })
                .count();
            if !gone.is_empty() {
                let note = if links > 0 { " (an XDP program detached: no broker of this machine uses it)" } else { "" };
                tracing::info!(
                    "{when}: removed {} responder pins nothing uses any more from {PIN_DIR}{note}",
                    gone.len()
                );
            }
            gone
        }
        Err(e) => {
            tracing::debug!("stale pins in {PIN_DIR} not checked: {e}");
            Vec::new()
        }
    }
}

/// Inputs the detectors send to the core loop.
pub(crate) enum DetectInput {
    /// Background loading finished.
    Loaded(Box<Loaded>),
    /// A watched process exited.
    Exit(ExitEvent),
    /// A process could not be watched (already gone): pid, why.
    WatchFailed(u32, String),
    /// A kernel event on the overlay connection of `rank` (u32::MAX = the parent).
    Tcp(u32, TcpEvent),
    /// A liveness signal about child `rank` from the prober.
    Probe(u32, Signal),
}

/// Result of background loading.
pub(crate) struct Loaded {
    exit: Result<Detector, String>,
    tcp: Result<TcpWatcher, String>,
    xdp: Result<XdpResponder, String>,
    shared_table: Option<Arc<HbTable>>,
    /// Pins this broker made of a table it shares (for the other brokers of its test instance).
    shared_pins: Vec<std::path::PathBuf>,
    /// `broker.detectors=ebpf` and this detector could not run on eBPF.
    pub(crate) required_failed: Option<String>,
}

enum ExitCmd {
    Watch(u32),
}

enum TcpCmd {
    Watch(u32, TcpTuple),
    Unwatch(TcpTuple),
}

/// Commands to the prober task.
pub(crate) enum ProbeCmd {
    /// Probe child `rank` at this address.
    Add(u32, SocketAddr),
    /// Stop probing `rank`.
    Remove(u32),
    /// Probe `rank` now (suspect hint).
    Now(u32),
    /// This node's kernel collects probe replies (the XDP responder's table, with its reply table).
    Collector(Arc<HbTable>),
}

/// The detectors of one broker.
pub(crate) struct Detectors {
    /// What runs, for status output.
    pub status: DetectorStatus,
    /// UDP port of this broker's probe socket (told to the parent in the hello).
    pub probe_port: u16,
    clock: Arc<HeartbeatClock>,
    table: Option<Arc<HbTable>>,
    xdp: Option<XdpResponder>,
    /// Pins this broker made of a table it shares, removed when it leaves.
    shared_pins: Vec<std::path::PathBuf>,
    /// `broker.xdp_mode` as asked (a shared program keeps its owner's mode).
    xdp_how: XdpAttach,
    _user: Option<UserspaceResponder>,
    exit_tx: Option<mpsc::UnboundedSender<ExitCmd>>,
    tcp_tx: Option<mpsc::UnboundedSender<TcpCmd>>,
    prober: Option<mpsc::UnboundedSender<ProbeCmd>>,
    /// Brokers of this machine whose exits we watch (test-instance owner), by pid.
    watched_brokers: std::collections::HashSet<u32>,
    owner: bool,
    bind_ip: Ipv4Addr,
    input_tx: mpsc::UnboundedSender<DetectInput>,
    probe_period: f64,
    /// `tbon.stall_max`, seconds (probe replies with a heartbeat half that old are all forwarded).
    stall_max: f64,
    /// The group this broker probes its children on (None: `tbon.probe_group=off`, or the overlay is on
    /// loopback, where one node holds every child).
    group: Option<SocketAddrV4>,
    /// What the prober does (once this broker has children).
    pub(crate) prober_stats: Option<Arc<ProberStats>>,
    /// The background load, until [`begin_load`](Self::begin_load) starts it.
    loader: Option<Box<dyn FnOnce() -> Loaded + Send>>,
    /// Log fallbacks at info, not warn (a nested instance: its stderr is the user's job output).
    quiet: bool,
}

impl Detectors {
    /// Binds the probe socket on `bind_ip`, starts the userspace responder (replaced by XDP once loaded) and
    /// the background loader. `owner` = this broker loads the machine's detectors (else it uses
    /// `broker.detector-rank`'s through the pinned table).
    pub(crate) fn start(
        config: &BrokerConfig,
        instance: &str,
        bind_ip: Ipv4Addr,
        owner: bool,
        ranks: (u32, Option<u32>),
        cfg: &crate::membership::Config,
        input_tx: mpsc::UnboundedSender<DetectInput>,
    ) -> Result<Detectors, String> {
        let (rank, parent) = ranks;
        let sock = std::net::UdpSocket::bind((bind_ip, 0)).map_err(|e| format!("probe socket on {bind_ip}: {e}"))?;
        let probe_port = sock.local_addr().map_err(|e| e.to_string())?.port();
        let groups = config.probe_group;
        let group = groups.for_parent(rank).filter(|_| !bind_ip.is_loopback());
        if let Some(g) = parent.and_then(|p| groups.for_parent(p)).filter(|_| !bind_ip.is_loopback()) {
            // The kernel answers group probes before any socket sees them; joining only tells multicast-aware
            // switches (IGMP snooping) to deliver the group here.
            if let Err(e) = sock.join_multicast_v4(g.ip(), &bind_ip) {
                info!("not joining probe group {g} on {bind_ip} ({e}); a snooping switch may not deliver it");
            }
        }
        let clock = Arc::new(HeartbeatClock::default());
        clock.beat();
        let user = UserspaceResponder::spawn(sock, clock.clone()).map_err(|e| format!("responder thread: {e}"))?;
        let mode = mode(config);
        let xdp_how = xdp_attach(config);
        let pending = "userspace (eBPF detectors loading)".to_string();
        let status = DetectorStatus {
            process_exit: pending.clone(),
            tcp: pending.clone(),
            responder: "userspace (XDP responder loading)".into(),
            probes: format!(
                "every {:.0} ms{}; a child whose kernel (XDP) answers is lost after {} unanswered in a row",
                cfg.probe_period * 1e3,
                match (groups.for_parent(rank), bind_ip.is_loopback()) {
                    _ if mode == DetectorMode::ForceUserspace => {
                        ", by unicast (group probes need this node's XDP responder to collect the replies)".into()
                    }
                    (Some(g), false) =>
                        format!(", by one multicast datagram to {g} once a child's kernel has answered"),
                    (Some(_), true) => ", by unicast (loopback: group probes need one node per child)".into(),
                    (None, _) => ", by unicast (tbon.probe_group=off)".into(),
                },
                cfg.probe_misses
            ),
        };
        let mut d = Detectors {
            status,
            probe_port,
            clock,
            table: None,
            xdp: None,
            shared_pins: Vec::new(),
            xdp_how,
            _user: Some(user),
            exit_tx: None,
            tcp_tx: None,
            prober: None,
            watched_brokers: Default::default(),
            owner,
            bind_ip,
            input_tx: input_tx.clone(),
            probe_period: cfg.probe_period,
            stall_max: cfg.stall_max,
            group,
            prober_stats: None,
            loader: None,
            quiet: config.instance_level != 0,
        };
        let ifname = vigil_ebpf::interface_for_addr(bind_ip);
        let pin = table_pin_path(instance);
        let test_instance = config.detector_rank.is_some();
        d.loader = Some(Box::new(move || load(mode, xdp_how, owner, ifname, test_instance.then_some(pin))));
        Ok(d)
    }

    /// Start loading the eBPF detectors in the background, once the link to the parent is up (the ~0.1 s of
    /// CPU it costs then does not delay joining the overlay).
    pub(crate) fn begin_load(&mut self) {
        let Some(f) = self.loader.take() else { return };
        let input_tx = self.input_tx.clone();
        // A plain thread, not spawn_blocking: a short-lived broker must not wait for the load to finish on exit.
        let rt = tokio::runtime::Handle::current();
        let spawned = std::thread::Builder::new().name("vigil-detectors".into()).spawn(move || {
            let _g = rt.enter();
            let loaded = f();
            let _ = input_tx.send(DetectInput::Loaded(Box::new(loaded)));
        });
        if let Err(e) = spawned {
            warn!("cannot start the detector loader thread ({e}); detectors stay userspace");
        }
    }

    /// Takes the loaded detectors into use: starts their tasks, registers this broker with the responder.
    pub(crate) fn loaded(&mut self, l: Loaded) {
        let pid = std::process::id();
        match l.exit {
            Ok(det) => {
                self.status.process_exit = det.description().to_string();
                let (tx, rx) = mpsc::unbounded_channel();
                tokio::spawn(exit_task(det, rx, self.input_tx.clone()));
                self.exit_tx = Some(tx);
            }
            Err(why) => self.status.process_exit = why,
        }
        match l.tcp {
            Ok(w) => {
                self.status.tcp = "ebpf".into();
                let (tx, rx) = mpsc::unbounded_channel();
                tokio::spawn(tcp_task(w, rx, self.input_tx.clone()));
                self.tcp_tx = Some(tx);
            }
            Err(why) => self.status.tcp = why,
        }
        let table = match l.xdp {
            Ok(x) => {
                self.status.responder = format!("xdp ({} on {})", x.mode(), x.interface());
                let t = x.table();
                self.xdp = Some(x);
                Some(t)
            }
            Err(why) => match l.shared_table {
                Some(t) => {
                    self.shared_pins = l.shared_pins;
                    let asked = match self.xdp_how {
                        XdpAttach::Auto => None,
                        XdpAttach::Native => Some("native"),
                        XdpAttach::Generic => Some("generic"),
                    };
                    let mode_note = asked
                        .map(|m| format!("; broker.xdp_mode={m} not applied: the program's mode holds"))
                        .unwrap_or_default();
                    self.status.responder = if self.owner {
                        format!("xdp (shared: the program another broker of this machine attached{mode_note})")
                    } else {
                        // Same attributes as the detector rank (a test instance): its mode is the one asked.
                        "xdp (shared with this machine's detector rank)".into()
                    };
                    Some(t)
                }
                None => {
                    self.status.responder = why;
                    None
                }
            },
        };
        if let Some(t) = &table {
            let pinned = match (t.register(self.probe_port, pid), self.xdp.as_mut()) {
                (Err(e), _) => Err(format!("userspace (registering with the XDP responder failed: {e})")),
                // Registered: the program may now outlive this broker (ended or killed) for the other brokers of
                // the machine that use it; the last of them out detaches it.
                (Ok(()), Some(x)) => match x.pin_link(&interface_link_path(x.interface())) {
                    Ok(()) => {
                        // This node's kernel reports our own death to our parent's probes (the brokers sharing
                        // the program are marked by our exit watches, `Detect::on_exit`).
                        if let Err(e) = x.mark_dead_on_exit(pid, self.probe_port) {
                            self.status.responder.push_str(&format!(
                                "; this broker's exit is not reported by the kernel ({e}): a kill is seen when its \
                                 connection closes"
                            ));
                            warn!("the XDP responder will not report this broker's exit: {e}");
                        }
                        Ok(())
                    }
                    Err(e) if e.contains("detached") => {
                        let _ = t.unregister(self.probe_port);
                        self.xdp = None;
                        Err(format!("userspace (XDP responder lost: {e})"))
                    }
                    Err(e) => {
                        info!("the XDP responder on {} ends with this broker: {e}", x.interface());
                        Ok(())
                    }
                },
                (Ok(()), None) => Ok(()),
            };
            if let Err(why) = pinned {
                self.status.responder = why;
            } else {
                // The kernel answers from now on; the userspace thread would only see what XDP passes.
                self.table = table;
                if let (Some(p), Some(t)) = (&self.prober, &self.table) {
                    let _ = p.send(ProbeCmd::Collector(t.clone()));
                }
            }
        }
        let s = &self.status;
        let all_ebpf = !s.process_exit.starts_with("userspace") && s.tcp == "ebpf" && s.responder.starts_with("xdp");
        let shared = s.responder.starts_with("xdp (shared");
        let forced = s.tcp.contains("forced");
        if all_ebpf || shared || forced || self.quiet {
            info!("failure detectors: process-exit {}, tcp {}, responder {}", s.process_exit, s.tcp, s.responder);
        } else {
            warn!(
                "failure detectors degraded: process-exit {}, tcp {}, responder {}",
                s.process_exit, s.tcp, s.responder
            );
        }
    }

    /// Called every `tbon.stall_max / 4` from the core (`Effect::Beat`):
    /// the userspace heartbeat the responder reports (its table in the kernel, or the userspace responder's clock).
    pub(crate) fn beat_clock(&mut self) {
        self.clock.beat();
        if let Some(t) = &self.table {
            let _ = t.heartbeat(self.probe_port);
        }
    }

    /// Called every heartbeat period from the core loop: [`Detect::beat_clock`], and (on the machine's detector
    /// owner) exit watches on the brokers registered in its table.
    pub(crate) fn beat(&mut self) {
        self.beat_clock();
        if let Some(t) = &self.table {
            if self.owner && self.xdp.is_some() {
                if let Some(tx) = &self.exit_tx {
                    let me = std::process::id();
                    for (_, st) in t.entries() {
                        if st.pid != me && st.alive == 1 && self.watched_brokers.insert(st.pid) {
                            let _ = tx.send(ExitCmd::Watch(st.pid));
                        }
                    }
                }
            }
        }
    }

    /// A watched process exited: if it is a broker of this machine, the responder now answers "dead" for it.
    /// Returns true if the pid was a broker.
    pub(crate) fn on_exit(&mut self, pid: u32) -> bool {
        if self.watched_brokers.remove(&pid) {
            if let Some(t) = &self.table {
                t.mark_dead(pid);
            }
            return true;
        }
        false
    }

    /// Watch a process's exit (for a local client); false if no exit detector is loaded yet.
    pub(crate) fn watch_pid(&self, pid: u32) -> bool {
        self.exit_tx.as_ref().is_some_and(|tx| tx.send(ExitCmd::Watch(pid)).is_ok())
    }

    /// Watch the overlay connection of `rank` (u32::MAX = parent) given a duplicate of its socket.
    pub(crate) fn watch_link(&self, rank: u32, sock: &std::os::fd::OwnedFd) -> Option<TcpTuple> {
        let tx = self.tcp_tx.as_ref()?;
        let t = socket_tuple(sock)?;
        let _ = tx.send(TcpCmd::Watch(rank, t));
        Some(t)
    }

    /// Stop watching a connection.
    pub(crate) fn unwatch_link(&self, t: TcpTuple) {
        if let Some(tx) = &self.tcp_tx {
            let _ = tx.send(TcpCmd::Unwatch(t));
        }
    }

    /// Start probing child `rank` whose node answers at `addr` (its overlay address, its probe port).
    pub(crate) fn probe_child(&mut self, rank: u32, addr: SocketAddr) {
        if self.prober.is_none() {
            let (tx, rx) = mpsc::unbounded_channel();
            let mut group = self.group;
            let sock = match std::net::UdpSocket::bind((self.bind_ip, 0))
                .and_then(|s| s.set_nonblocking(true).map(|_| s))
                .inspect(|s| {
                    if let (Some(g), Err(e)) = (group, multicast_sender(s, self.bind_ip)) {
                        warn!(
                            "group probes to {g} off (multicast from {}: {e}); children probed by unicast",
                            self.bind_ip
                        );
                        group = None;
                    }
                })
                .inspect(grow_receive_buffer)
            {
                Ok(s) => s,
                Err(e) => {
                    warn!(
                        "no heartbeat prober (UDP socket on {}: {e}); children are judged on TCP alone",
                        self.bind_ip
                    );
                    return;
                }
            };
            let period = Duration::from_secs_f64(self.probe_period.max(crate::membership::MIN_PROBE_PERIOD));
            let stats = Arc::new(ProberStats::default());
            self.prober_stats = Some(stats.clone());
            let (input_tx, stall_max, rt) = (self.input_tx.clone(), self.stall_max, self.owner);
            if let Err(e) = std::thread::Builder::new()
                .name("vigil-prober".into())
                .stack_size(PROBER_STACK)
                .spawn(move || prober_thread(sock, rx, input_tx, period, group, stats, stall_max, rt))
            {
                warn!("no heartbeat prober (thread: {e}); children are judged on TCP alone");
                self.prober_stats = None;
                return;
            }
            if let Some(t) = &self.table {
                let _ = tx.send(ProbeCmd::Collector(t.clone()));
            }
            self.prober = Some(tx);
        }
        if let Some(p) = &self.prober {
            let _ = p.send(ProbeCmd::Add(rank, addr));
        }
    }

    /// Send a command to the prober (no-op without one).
    pub(crate) fn prober_cmd(&self, c: ProbeCmd) {
        if let Some(p) = &self.prober {
            let _ = p.send(c);
        }
    }

    /// Clean exit: remove this broker from the responder table (a killed broker stays, marked dead by the
    /// machine's detector owner).
    ///
    /// The owner of the XDP program leaves it attached while other brokers of the machine use it (a nested
    /// instance's; its pinned link keeps it attached if the owner is killed too); a broker sharing it removes the
    /// pins it made and, if it was the last live user, the program.
    pub(crate) fn shutdown(&mut self) {
        let Some(t) = self.table.take() else { return };
        let _ = t.unregister(self.probe_port);
        match self.xdp.take() {
            Some(x) => {
                let interface = x.interface().to_owned();
                match x.release() {
                    vigil_ebpf::Release::Detached => {}
                    vigil_ebpf::Release::Kept(n) => {
                        info!("leaving the XDP responder on {interface} attached for {n} other brokers of this machine")
                    }
                    vigil_ebpf::Release::NotKept(n) => warn!(
                        "the XDP responder on {interface} is detached although {n} other brokers of this machine use \
                         it (its link could not be pinned): only their userspace responders answer now"
                    ),
                }
            }
            None => {
                for p in self.shared_pins.drain(..) {
                    let _ = std::fs::remove_file(p);
                }
                sweep_pins("leaving");
            }
        }
    }
}

/// The 4-tuple of a connected IPv4 TCP socket.
fn socket_tuple(sock: &std::os::fd::OwnedFd) -> Option<TcpTuple> {
    use std::os::fd::AsFd;
    let s = socket2_addrs(sock.as_fd())?;
    TcpTuple::of(s.0, s.1)
}

fn socket2_addrs(fd: std::os::fd::BorrowedFd<'_>) -> Option<(SocketAddr, SocketAddr)> {
    use std::os::fd::AsRawFd;
    let get = |peer: bool| -> Option<SocketAddr> {
        // SAFETY: sockaddr_in is plain old data; get{sock,peer}name write at most `len` bytes into it.
        unsafe {
            let mut sa: libc::sockaddr_in = std::mem::zeroed();
            let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
            let p = &mut sa as *mut libc::sockaddr_in as *mut libc::sockaddr;
            let rc = if peer {
                libc::getpeername(fd.as_raw_fd(), p, &mut len)
            } else {
                libc::getsockname(fd.as_raw_fd(), p, &mut len)
            };
            if rc != 0 || sa.sin_family as i32 != libc::AF_INET {
                return None;
            }
            let ip = Ipv4Addr::from(u32::from_be(sa.sin_addr.s_addr));
            Some(SocketAddr::V4(SocketAddrV4::new(ip, u16::from_be(sa.sin_port))))
        }
    };
    Some((get(false)?, get(true)?))
}

/// Background loading (blocking: aya parses BTF and the verifier runs).
fn load(
    mode: DetectorMode,
    xdp_how: XdpAttach,
    owner: bool,
    ifname: Option<String>,
    pin: Option<std::path::PathBuf>,
) -> Loaded {
    if !owner {
        // Another broker of this machine owns the detectors: use its responder table once it is pinned.
        let forced = mode == DetectorMode::ForceUserspace;
        let mut shared = None;
        if let (Some(p), false) = (&pin, forced) {
            for _ in 0..50 {
                if let Ok(t) = HbTable::open_pinned(p) {
                    shared = Some(Arc::new(t));
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        let why = if forced {
            "userspace (forced by broker.detectors=userspace)".to_string()
        } else {
            "userspace (this machine's detector rank runs the eBPF detectors)".to_string()
        };
        return Loaded {
            exit: Err(why.clone()),
            tcp: Err(why.clone()),
            xdp: Err(if shared.is_some() || forced { why } else { "userspace (no shared XDP responder found)".into() }),
            shared_table: shared,
            shared_pins: Vec::new(),
            required_failed: None,
        };
    }
    let forced = mode == DetectorMode::ForceUserspace;
    let watchers = || {
        let exit = Detector::choose(mode).map_err(|e| format!("userspace (none: {e})")).map(|d| match d {
            // Say why, as the other detectors' lines do.
            Detector::Userspace { watcher, .. } if forced => Detector::Userspace {
                watcher,
                reason: "userspace (forced by broker.detectors=userspace): pidfd".into(),
            },
            d => d,
        });
        let tcp = if forced {
            Err("userspace (forced by broker.detectors=userspace): socket errors and TCP_INFO".into())
        } else {
            TcpWatcher::new().map_err(|e| format!("userspace (BPF load failed: {e}): socket errors and TCP_INFO"))
        };
        (exit, tcp)
    };
    // Both CO-RE objects relocate against one parse of the kernel's BTF.
    let (exit, tcp) = if forced { watchers() } else { vigil_ebpf::with_kernel_btf(watchers) };
    let mut shared_table = None;
    let mut shared_pins = Vec::new();
    let xdp = if forced {
        Err("userspace (forced by broker.detectors=userspace)".into())
    } else {
        match &ifname {
            None => Err("userspace (no interface carries the overlay address)".into()),
            Some(i) => match attach_after_sweep(i, xdp_how) {
                Ok(mut x) => {
                    // Other brokers of this machine (nested instances, the rest of a test instance) register
                    // their probe ports through the pinned table.
                    let pin_err = |e: vigil_ebpf::EbpfError| format!("userspace (pinning the table: {e})");
                    let mut r = x.pin_table(&interface_pin_path(i)).map_err(pin_err);
                    if let (Ok(()), Some(p)) = (&r, &pin) {
                        r = x.pin_table(p).map_err(pin_err);
                    }
                    r.map(|_| x)
                }
                Err(e) => {
                    // Busy: if the program there is another Vigil broker's, share its table, and pin it for the
                    // other brokers of this test instance too.
                    if let Ok(t) = HbTable::open_pinned(&interface_pin_path(i)) {
                        if let Some(p) = &pin {
                            match t.pin(p) {
                                Ok(done) => shared_pins = done,
                                Err(e) => tracing::info!("the shared XDP table is not pinned for this instance: {e}"),
                            }
                        }
                        shared_table = Some(Arc::new(t));
                    }
                    Err(format!("userspace (XDP on {i}: {e})"))
                }
            },
        }
    };
    // A shared XDP table is an eBPF responder too.
    let xdp_failed = xdp.as_ref().err().filter(|_| shared_table.is_none());
    let required_failed = if mode == DetectorMode::RequireEbpf {
        [exit.as_ref().err(), tcp.as_ref().err(), xdp_failed].into_iter().flatten().next().cloned()
    } else {
        None
    };
    // aya keeps parsed BTF and relocation scratch in freed heap; hand it back to the system.
    // SAFETY: malloc_trim only releases free heap memory; it is safe to call at any time.
    unsafe { libc::malloc_trim(0) };
    Loaded { exit, tcp, xdp, shared_table, shared_pins, required_failed }
}

/// Attaches the XDP responder to `interface`, after removing the pins nothing uses any more: a program kept
/// attached for brokers that have all gone since (killed, so none of them removed it) is detached first.
fn attach_after_sweep(interface: &str, how: XdpAttach) -> Result<XdpResponder, vigil_ebpf::EbpfError> {
    let detached = sweep_pins("starting").contains(&interface_link_path(interface));
    let mut tries = 0;
    loop {
        match XdpResponder::attach_with(interface, how) {
            // The kernel frees an unpinned link in the background: the program detached by the sweep may still be
            // there for a moment.
            Err(_) if detached && tries < 25 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
            r => return r,
        }
    }
}

async fn exit_task(
    mut det: Detector,
    mut rx: mpsc::UnboundedReceiver<ExitCmd>,
    tx: mpsc::UnboundedSender<DetectInput>,
) {
    loop {
        tokio::select! {
            c = rx.recv() => match c {
                Some(ExitCmd::Watch(pid)) => {
                    if let Err(e) = det.watch(pid) {
                        tracing::debug!("cannot watch pid {pid}: {e}");
                        let _ = tx.send(DetectInput::WatchFailed(pid, e.to_string()));
                    }
                }
                None => return,
            },
            ev = det.next_event() => match ev {
                Some(ev) => {
                    if tx.send(DetectInput::Exit(ev)).is_err() {
                        return;
                    }
                }
                None => return,
            },
        }
    }
}

async fn tcp_task(mut w: TcpWatcher, mut rx: mpsc::UnboundedReceiver<TcpCmd>, tx: mpsc::UnboundedSender<DetectInput>) {
    let mut ranks: HashMap<TcpTuple, u32> = HashMap::new();
    loop {
        tokio::select! {
            c = rx.recv() => match c {
                Some(TcpCmd::Watch(rank, t)) => {
                    if w.watch(t).is_ok() {
                        ranks.insert(t, rank);
                    }
                }
                Some(TcpCmd::Unwatch(t)) => {
                    let _ = w.unwatch(t);
                    ranks.remove(&t);
                }
                None => return,
            },
            ev = w.next_event() => match ev {
                Some(ev) => {
                    if let Some(&r) = ranks.get(&ev.tuple) {
                        if !matches!(ev.kind, TcpEventKind::Retransmit { .. }) {
                            ranks.remove(&ev.tuple);
                            let _ = w.unwatch(ev.tuple);
                        }
                        if tx.send(DetectInput::Tcp(r, ev)).is_err() {
                            return;
                        }
                    }
                }
                None => return,
            },
        }
    }
}

/// The prober's UDP socket, non-blocking, registered with the runtime for readability only: sends never wake the
/// runtime. (A socket registered for writability too, as `tokio::net::UdpSocket` is, reports a new writable edge
/// each time a sent datagram leaves the send buffer: one more pass through `epoll_wait` per period.)
type ProbeSocket = tokio::io::unix::AsyncFd<std::net::UdpSocket>;

/// Send probes with one `sendmmsg(2)`; errors (a child's address unreachable) are ignored: the miss counts.
fn send_batch(sock: &ProbeSocket, pkts: &[([u8; vigil_ebpf::PROBE_LEN], SocketAddr)]) {
    use std::os::fd::AsRawFd;
    let addrs: Vec<libc::sockaddr_in> = pkts
        .iter()
        .map(|(_, a)| {
            // SAFETY: sockaddr_in is plain old data; all-zero is valid before we fill it.
            let mut sa: libc::sockaddr_in = unsafe { std::mem::zeroed() };
            if let SocketAddr::V4(v4) = a {
                sa.sin_family = libc::AF_INET as libc::sa_family_t;
                sa.sin_port = v4.port().to_be();
                sa.sin_addr.s_addr = u32::from(*v4.ip()).to_be();
            }
            sa
        })
        .collect();
    let mut iovs: Vec<libc::iovec> =
        pkts.iter().map(|(b, _)| libc::iovec { iov_base: b.as_ptr() as *mut libc::c_void, iov_len: b.len() }).collect();
    let mut hdrs: Vec<libc::mmsghdr> = (0..pkts.len())
        .map(|i| {
            // SAFETY: mmsghdr is plain old data; all-zero is valid before we fill it.
            let mut h: libc::mmsghdr = unsafe { std::mem::zeroed() };
            h.msg_hdr.msg_name = &addrs[i] as *const libc::sockaddr_in as *mut libc::c_void;
            h.msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
            h.msg_hdr.msg_iov = &mut iovs[i];
            h.msg_hdr.msg_iovlen = 1;
            h
        })
        .collect();
    let mut off = 0;
    while off < hdrs.len() {
        // SAFETY: every header points at an address and an iovec that live until the call returns; the kernel
        // only reads them (and writes msg_len).
        let n = unsafe {
            libc::sendmmsg(
                sock.as_raw_fd(),
                hdrs[off..].as_mut_ptr(),
                (hdrs.len() - off) as libc::c_uint,
                libc::MSG_DONTWAIT,
            )
        };
        if n <= 0 {
            off += 1; // skip the datagram that failed (e.g. unreachable) and go on
        } else {
            off += n as usize;
        }
    }
}

/// Read every reply waiting on the socket, up to `bufs.len()` per `recvmmsg(2)`: (length, sender, data).
fn recv_batch<'a>(sock: &ProbeSocket, bufs: &'a mut [[u8; 128]]) -> Vec<(usize, SocketAddr, &'a [u8])> {
    use std::os::fd::AsRawFd;
    let mut out: Vec<(usize, SocketAddr)> = Vec::new();
    let cap = bufs.len();
    // One batch per call; `drain_replies` loops.
    let r = (|| {
        // SAFETY: sockaddr_in is plain old data; all-zero is valid (the kernel fills it).
        let zero: libc::sockaddr_in = unsafe { std::mem::zeroed() };
        let mut addrs: Vec<libc::sockaddr_in> = vec![zero; cap];
        let mut iovs: Vec<libc::iovec> = bufs
            .iter_mut()
            .map(|b| libc::iovec { iov_base: b.as_mut_ptr() as *mut libc::c_void, iov_len: b.len() })
            .collect();
        let mut hdrs: Vec<libc::mmsghdr> = (0..cap)
            .map(|i| {
                // SAFETY: mmsghdr is plain old data; all-zero is valid before we fill it.
                let mut h: libc::mmsghdr = unsafe { std::mem::zeroed() };
                h.msg_hdr.msg_name = &mut addrs[i] as *mut libc::sockaddr_in as *mut libc::c_void;
                h.msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
                h.msg_hdr.msg_iov = &mut iovs[i];
                h.msg_hdr.msg_iovlen = 1;
                h
            })
            .collect();
        // SAFETY: every header points at a buffer, an iovec and an address that outlive the call; the kernel
        // writes at most iov_len bytes and msg_namelen bytes into them.
        let n = unsafe {
            libc::recvmmsg(
                sock.as_raw_fd(),
                hdrs.as_mut_ptr(),
                cap as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        for i in 0..n as usize {
            let a = &addrs[i];
            let ip = Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr));
            out.push((hdrs[i].msg_len as usize, SocketAddr::V4(SocketAddrV4::new(ip, u16::from_be(a.sin_port)))));
        }
        Ok::<(), std::io::Error>(())
    })();
    if r.is_err() {
        return Vec::new();
    }
    out.into_iter().zip(bufs.iter()).map(|((n, a), b)| (n, a, &b[..n.min(b.len())])).collect()
}

/// Read every reply waiting on the socket, batch after batch, and hand each to `f`.
fn drain_replies(sock: &ProbeSocket, bufs: &mut [[u8; 128]], mut f: impl FnMut(usize, &[u8], SocketAddr)) {
    let cap = bufs.len();
    loop {
        let got = recv_batch(sock, bufs);
        let full = got.len() == cap;
        for (n, from, b) in got {
            f(n, b, from);
        }
        if !full {
            return;
        }
    }
}

/// Probes sent back to back before the prober reads the replies that came in.
const PROBE_GROUP: usize = 32;

/// Receive buffer of the prober's socket, bytes: room for the replies of a whole round of a wide parent.
const PROBE_RCVBUF: libc::c_int = 4 << 20;

/// Enlarge a socket's receive buffer to [`PROBE_RCVBUF`] (beyond `net.core.rmem_max` when root).
fn grow_receive_buffer(s: &std::net::UdpSocket) {
    use std::os::fd::AsRawFd;
    let v = PROBE_RCVBUF;
    for opt in [libc::SO_RCVBUFFORCE, libc::SO_RCVBUF] {
        // SAFETY: setsockopt on a socket we own with a c_int option value of the size passed.
        let rc = unsafe {
            libc::setsockopt(
                s.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                &v as *const libc::c_int as *const libc::c_void,
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc == 0 {
            return;
        }
    }
}

struct ProbeTarget {
    addr: SocketAddr,
    /// What requests carry in their `rank` field and replies echo: a slot of this node's reply array where the
    /// kernel collects the child's replies, or [`NO_SLOT`] | rank.
    id: u32,
    /// Last round this child answered.
    answered: u32,
    /// Last reply's kind and whether its heartbeat age was over the torpid threshold (to report changes only).
    kernel: Option<bool>,
    stalled: bool,
    missed_reported: u32,
    /// When a reply was last forwarded to the core (`CLOCK_MONOTONIC` ns).
    forwarded_ns: u64,
    /// Probed by the group datagram (its kernel answered a unicast probe and learned us), not by unicast.
    grouped: bool,
    /// Round of the last unicast probe sent to it.
    last_unicast: u32,
    /// Rounds in a row, probed by the group datagram alone, that it did not answer.
    group_only_misses: u32,
    /// Group probes do not reach it (multicast filtered on the way): unicast only from now on.
    no_group: bool,
    /// How long its kernel's replies take: a period without news counts as missed only past that
    /// (`vigil_core::probe`).
    timing: ReplyTiming,
    /// The round during which its last news came (a reply to a newer probe than any before).
    news_round: u32,
    /// Periods of its current silence excused as correlated (`vigil_core::probe::correlated_silence`).
    excused: u32,
    /// The round of the last reply timed: a reply collected by the kernel stays in its slot and is read again
    /// each period until another replaces it, and is timed once.
    timed_seq: u32,
}

/// Group-only rounds in a row a child may miss while it still answers unicast probes before it is probed by
/// unicast for good (the network does not deliver the group to it).
const GROUP_MISSES_MAX: u32 = 3;

/// Children whose kernel answers from which a period with no reply at all is not judged ([`Prober::next_round`]).
/// Below it, all children silent at once (a rack's power, its switch) is as likely as a stalled parent, and is
/// judged in 30-40 ms; from it on, a parent's own stall is the likelier cause, and declaring that many nodes lost
/// by mistake the costlier error.
const VOID_MIN_CHILDREN: usize = 8;

/// Marks an id that is not a reply-array slot (slots are below [`vigil_ebpf::SLOTS`]).
const NO_SLOT: u32 = 0x8000_0000;

/// The prober's state: its children and the current round.
struct Prober {
    targets: HashMap<u32, ProbeTarget>,
    /// Current round (sequence number of the last probes sent); a child that answered round `r` has
    /// `round - r` probes outstanding.
    round: u32,
    /// Key mixed into every request's timestamp: replies must echo it, so a forged reply (anyone can send UDP)
    /// cannot make a child look dead or alive without having seen our request.
    key: u64,
    /// This node's reply array, where the kernel collects our children's replies.
    area: Option<Arc<vigil_ebpf::ReplyArea>>,
    /// Our UDP port (replies in the array are checked against it).
    port: u16,
    /// Slot blocks we claimed in the array, and their slots not in use.
    blocks: Vec<u32>,
    free: Vec<u32>,
    /// Child rank by request id.
    ids: HashMap<u32, u32>,
    /// Where group probes go (IP multicast), when this prober may use them.
    group: Option<SocketAddrV4>,
    /// Children per IPv4 address: only a child alone on its node can be group-probed (a node's kernel
    /// answers one broker per parent).
    per_ip: HashMap<Ipv4Addr, u32>,
    tx: mpsc::UnboundedSender<DetectInput>,
    /// A child that group probes do not reach was reported (once per prober).
    no_group_logged: bool,
    /// The kernel collects replies (`area` is set): group replies, which never reach the socket, are seen.
    collects: bool,
    /// Heartbeat age (s) from which every reply is forwarded to the core: half of `tbon.stall_max`.
    stall_note: f64,
    /// After the last round: children probed by the group datagram, and those the group does not reach.
    counts: (u32, u32),
    /// Reused by every period's read of the reply array: (rank, slot, address) of the children with a slot.
    scratch: Vec<(u32, u32, SocketAddr)>,
    /// Newest round any child answered.
    newest: u32,
    /// Rounds left unjudged because no child answered (see [`Prober::next_round`]), and whether that was logged.
    void_rounds: u64,
    stall_logged: bool,
    /// Periods of correlated silence (see [`Prober::next_round`]), and whether that was logged.
    correlated_rounds: u64,
    correlated_logged: bool,
    /// Unjudged rounds in a row just now.
    void_streak: u32,
    /// Unjudged rounds in a row after which grouped children answered the unicast re-probe.
    group_suspect: u32,
    /// `tbon.probe_period`, seconds (misses are counted past each child's reply time in periods).
    period: f64,
    /// Every kernel reply of every target timed together: a new target (a child that joins, the parent after a
    /// re-parent) starts from it, so that it is judged at once at this network's pace (`vigil_core::probe`).
    all: ReplyTiming,
}

impl Drop for Prober {
    fn drop(&mut self) {
        if let Some(a) = &self.area {
            for b in self.blocks.drain(..) {
                a.release_block(b);
            }
        }
    }
}

impl Prober {
    /// A prober on UDP `port` with no children yet; `stall_note` in seconds.
    fn new(
        key: u64,
        port: u16,
        group: Option<SocketAddrV4>,
        tx: mpsc::UnboundedSender<DetectInput>,
        stall_note: f64,
    ) -> Prober {
        Prober {
            targets: HashMap::new(),
            round: 0,
            key,
            area: None,
            port,
            blocks: Vec::new(),
            free: Vec::new(),
            ids: HashMap::new(),
            group,
            per_ip: HashMap::new(),
            tx,
            no_group_logged: false,
            collects: false,
            stall_note,
            counts: (0, 0),
            scratch: Vec::new(),
            newest: 0,
            void_rounds: 0,
            stall_logged: false,
            correlated_rounds: 0,
            correlated_logged: false,
            void_streak: 0,
            group_suspect: 0,
            period: 0.01,
            all: ReplyTiming::default(),
        }
    }

    /// A request id for child `rank`: a free slot of the reply array (claiming a block when none is left), else
    /// [`NO_SLOT`] | rank (replies then come to the socket).
    fn new_id(&mut self, rank: u32) -> u32 {
        let Some(area) = &self.area else { return NO_SLOT | rank };
        if self.free.is_empty() {
            match area.claim_block(self.port) {
                Ok(first) => {
                    self.blocks.push(first);
                    self.free.extend((first..first + vigil_ebpf::SLOT_BLOCK).rev());
                }
                Err(e) => {
                    tracing::debug!("no reply slot for child rank {rank} ({e}); its replies come to the socket");
                    return NO_SLOT | rank;
                }
            }
        }
        self.free.pop().unwrap_or(NO_SLOT | rank)
    }

    fn drop_id(&mut self, id: u32) {
        self.ids.remove(&id);
        if id & NO_SLOT == 0 {
            if let Some(a) = &self.area {
                a.forget(id);
            }
            self.free.push(id);
        }
    }

    /// Gives child `rank` an id, and has the kernel collect its replies when the id is a slot.
    fn assign(&mut self, rank: u32, addr: SocketAddr) -> u32 {
        let id = self.new_id(rank);
        if let (Some(area), SocketAddr::V4(a), true) = (&self.area, addr, id & NO_SLOT == 0) {
            area.expect(id, self.port, a);
        }
        self.ids.insert(id, rank);
        id
    }

    fn add(&mut self, rank: u32, addr: SocketAddr) {
        self.remove(rank);
        if let (SocketAddr::V4(a), false) = (addr, rank == PARENT) {
            *self.per_ip.entry(*a.ip()).or_default() += 1;
        }
        let id = self.assign(rank, addr);
        let t = ProbeTarget {
            addr,
            id,
            answered: self.round,
            kernel: None,
            stalled: false,
            missed_reported: 0,
            forwarded_ns: 0,
            grouped: false,
            last_unicast: 0,
            group_only_misses: 0,
            no_group: false,
            timing: self.all,
            news_round: self.round,
            excused: 0,
            timed_seq: 0,
        };
        self.targets.insert(rank, t);
    }

    fn remove(&mut self, rank: u32) {
        let Some(t) = self.targets.remove(&rank) else { return };
        self.drop_id(t.id);
        if let (SocketAddr::V4(a), false) = (t.addr, rank == PARENT) {
            if let Some(n) = self.per_ip.get_mut(a.ip()) {
                *n -= 1;
                if *n == 0 {
                    self.per_ip.remove(a.ip());
                }
            }
        }
    }

    /// The kernel collects our replies from now on: every child gets a slot (and is re-taught by unicast).
    fn set_area(&mut self, area: Arc<vigil_ebpf::ReplyArea>) {
        self.area = Some(area);
        self.collects = true;
        let children: Vec<(u32, u32, SocketAddr)> = self.targets.iter().map(|(r, t)| (*r, t.id, t.addr)).collect();
        for (rank, old, addr) in children {
            self.drop_id(old);
            let id = self.assign(rank, addr);
            if let Some(t) = self.targets.get_mut(&rank) {
                t.id = id;
                t.grouped = false;
            }
        }
    }

    /// A reply (read from the socket, `from` its sender; or collected by the kernel, which checked the sender).
    fn reply(&mut self, p: &Probe, from: SocketAddr) {
        let Some(&rank) = self.ids.get(&p.rank) else { return };
        self.accept(rank, p, from, vigil_ebpf::monotonic_ns());
    }

    /// A reply for child `rank` (its id already matched), at `now` (CLOCK_MONOTONIC, ns).
    fn accept(&mut self, rank: u32, p: &Probe, from: SocketAddr, now: u64) {
        if p.kind == ProbeKind::Request || p.kind == ProbeKind::Group || p.seq > self.round {
            return;
        }
        let kernel = p.kind == ProbeKind::ReplyKernel;
        let sent = p.sent_ns ^ self.key;
        if sent > now || now - sent > 60_000_000_000 {
            return; // not an echo of one of our requests
        }
        // Fields borrowed apart from the target, so one lookup serves the whole reply.
        let (group, collects, per_ip, round) = (self.group, self.collects, &self.per_ip, self.round);
        let Some(t) = self.targets.get_mut(&rank) else { return };
        if from != t.addr {
            return;
        }
        // Every kernel reply times the node, news or not (vigil_core::probe); a userspace responder's replies never
        // arm the miss rule.
        if kernel && p.seq != t.timed_seq {
            t.timed_seq = p.seq;
            let rtt = now.saturating_sub(sent) as f64 / 1e9;
            t.timing.sample(rtt);
            self.all.sample(rtt);
        }
        if p.seq <= t.answered {
            return;
        }
        // Its kernel answered: it knows us now, and answers the group datagram from the next round. (Looked up
        // only for a child not grouped yet: this runs for every child every period.)
        // The parent's node is not one of our group's: probed by unicast only.
        let grouped =
            kernel && rank != PARENT && (t.grouped || (!t.no_group && groupable(group, collects, per_ip, from)));
        t.answered = p.seq;
        // News: the silence counted by the miss rule starts again.
        t.news_round = round;
        t.excused = 0;
        self.newest = self.newest.max(p.seq);
        let recovered = t.missed_reported > 0;
        t.missed_reported = 0;
        t.grouped = grouped;
        let age = p.hb_age_ns as f64 / 1e9;
        // Forwarded every time once the child's heartbeat is half way to torpid (the membership machine applies
        // the real threshold; this only limits how often replies reach the core).
        let stalled = age >= self.stall_note;
        // Forward what changes a verdict, and once a second that replies still come. A kernel reply arms the probe
        // rules in the core (and vouches for the node's TCP), so none is forwarded before the node's reply time is
        // known (but one saying its broker is dead): meanwhile the node is judged on TCP, confirmed
        // (`vigil_core::probe::ARM_REPLIES`).
        let refresh = now.saturating_sub(t.forwarded_ns) >= 1_000_000_000;
        let known = !kernel || probe::judged_by(&t.timing, &self.all).armed() || !p.alive();
        if known && (t.kernel != Some(kernel) || stalled || t.stalled != stalled || !p.alive() || recovered || refresh)
        {
            t.kernel = Some(kernel);
            t.stalled = stalled;
            t.forwarded_ns = now;
            let _ =
                self.tx.send(DetectInput::Probe(rank, Signal::ProbeReply { kernel, alive: p.alive(), hb_age: age }));
        }
    }

    /// Replies the kernel collected since the last read (a read of shared memory per child, no system call; one
    /// clock read per period).
    fn read_collected(&mut self) {
        let Some(area) = self.area.clone() else { return };
        let now = vigil_ebpf::monotonic_ns();
        let mut slots = std::mem::take(&mut self.scratch);
        slots.clear();
        slots.extend(self.targets.iter().filter(|(_, t)| t.id & NO_SLOT == 0).map(|(r, t)| (*r, t.id, t.addr)));
        for &(rank, slot, addr) in &slots {
            if let Some((p, _)) = area.read(slot) {
                self.accept(rank, &p, addr, now);
            }
        }
        self.scratch = slots;
    }

    /// Start of a period: count misses, then the next round's probes: (group datagram wanted, unicast list).
    ///
    /// A period in which no child at all answered, while at least [`VOID_MIN_CHILDREN`] children's kernels have
    /// been answering, is not judged: nobody is blamed and the round is probed again under the same number.
    /// Many nodes going silent in the same 10 ms is far more often this node's own receive path falling behind
    /// (its CPU starved, a receive queue backed up, its own link down) than that many deaths at once; a reply
    /// processed late still arrives, and replies are read in the order they came, so once any child answers the
    /// newest round the others' missing replies are not stuck behind it. Nodes really gone all at once are
    /// judged on TCP (`tbon.lost_timeout`) once their replies are older than the probe rule's vouching window.
    fn next_round(&mut self) -> (bool, Vec<(u32, SocketAddr)>) {
        // Children whose kernel answers: counted only in a period nobody answered (not on every period's path).
        let nobody = self.round > 0 && self.newest < self.round;
        let answering = if nobody { self.targets.values().filter(|t| t.kernel == Some(true)).count() } else { 0 };
        let void = nobody && answering >= VOID_MIN_CHILDREN;
        if void {
            self.void_rounds += 1;
            self.void_streak += 1;
            if !self.stall_logged {
                self.stall_logged = true;
                warn!(
                    "no child answered the last probe ({answering} children's kernels answer): this node's own \
                     receive path looks stalled; nobody is blamed until replies come again (counted in \
                     `vigil overlay status`; later ones at debug level)"
                );
            } else {
                tracing::debug!("no child answered probe round {}: not judged", self.round);
            }
        } else if self.void_streak > 0 {
            // Answered again after a round nobody answered, re-probed by unicast. If grouped children answered,
            // it was perhaps the group datagram, not us, that failed: after GROUP_MISSES_MAX such rounds in a
            // row the group is given up for every child.
            self.void_streak = 0;
            if self.targets.values().any(|t| t.grouped && t.answered == self.round) {
                self.group_suspect += 1;
            }
            if self.group_suspect >= GROUP_MISSES_MAX {
                self.group_suspect = 0;
                let g = self.group.map(|g| g.to_string()).unwrap_or_default();
                warn!(
                    "group probes to {g} reach none of the children (they answer unicast probes only); they are \
                     probed by unicast from now on"
                );
                for t in self.targets.values_mut().filter(|t| t.grouped) {
                    t.grouped = false;
                    t.no_group = true;
                }
            }
        }
        // Children past their reply time this period, of those whose misses count: several at once blame nobody
        // (vigil_core::probe::correlated_silence).
        let correlated = !void && {
            let (mut judged, mut silent) = (0, 0);
            for t in self.targets.values() {
                let timing = probe::judged_by(&t.timing, &self.all);
                if t.kernel.is_some() && timing.armed() {
                    judged += 1;
                    let outstanding = self.round - t.news_round;
                    if probe::missed_excused(
                        outstanding,
                        t.excused,
                        probe::patience_of(&t.timing, &self.all, self.period),
                    ) >= 1
                    {
                        silent += 1;
                    }
                }
            }
            let c = probe::correlated_silence(silent, judged);
            if c {
                self.correlated_rounds += 1;
                if !self.correlated_logged {
                    self.correlated_logged = true;
                    warn!(
                        "{silent} of {judged} children answer later than they did, at once: the links or this node \
                         slowed down; none is blamed for such periods while the prober learns their new pace \
                         (counted in `vigil overlay status`; later ones at debug level)"
                    );
                } else {
                    tracing::debug!("{silent} of {judged} children late at once in round {}: excused", self.round);
                }
            }
            c
        };
        let mut unicast = Vec::new();
        let mut group = false;
        let (mut grouped, mut unreached) = (0, 0);
        // The round the next probes carry: a round nobody answered is probed again under its own number.
        let next = if void { self.round } else { self.round + 1 };
        for (r, t) in self.targets.iter_mut() {
            let outstanding = self.round - t.answered;
            if !void && t.grouped && t.last_unicast != self.round {
                // The last round reached it by the group datagram alone.
                t.group_only_misses = if outstanding >= 1 { t.group_only_misses + 1 } else { 0 };
                if outstanding == 0 {
                    self.group_suspect = 0; // the group datagram reaches children
                }
                if t.group_only_misses >= GROUP_MISSES_MAX {
                    t.grouped = false;
                    t.no_group = true;
                    let g = self.group.map(|g| g.to_string()).unwrap_or_default();
                    if !self.no_group_logged {
                        self.no_group_logged = true;
                        warn!(
                            "group probes to {g} do not reach child rank {r} (it answers unicast probes only); it is \
                             probed by unicast from now on (others like it are logged at debug level)"
                        );
                    } else {
                        tracing::debug!("group probes to {g} do not reach child rank {r}; probed by unicast");
                    }
                }
            }
            // Every new miss is reported: the first one already stops vouching for the node's TCP. A probe is
            // missed once it has waited longer than this child's usual reply time (vigil_core::probe).
            let timing = probe::judged_by(&t.timing, &self.all);
            let patience = probe::patience_of(&t.timing, &self.all, self.period);
            let outstanding_news = self.round - t.news_round;
            if correlated
                && t.excused < probe::MAX_EXCUSED
                && probe::missed_excused(outstanding_news, t.excused, patience) >= 1
            {
                t.excused += 1;
            }
            let missed = probe::missed_excused(outstanding_news, t.excused, patience);
            if !void && missed >= 1 && missed > t.missed_reported && t.kernel.is_some() && timing.armed() {
                t.missed_reported = missed;
                tracing::debug!(
                    "child rank {r}: {missed} probes missed: {outstanding_news} periods without news, {} allowed \
                     (reply time {:.0} ms), {} excused",
                    patience,
                    probe::judged_by(&t.timing, &self.all).reply_time().max(self.all.reply_time()) * 1e3,
                    t.excused
                );
                let _ = self.tx.send(DetectInput::Probe(*r, Signal::ProbeMissed { misses: missed }));
            }
            // A grouped child that missed a round also gets a unicast probe: it double-checks over another path
            // and teaches a node that forgot us (LRU, reboot) who we are.
            if t.grouped {
                group = true;
                grouped += 1;
            }
            if t.no_group {
                unreached += 1;
            }
            if !t.grouped || outstanding >= 1 {
                unicast.push((t.id, t.addr));
                t.last_unicast = next;
            }
        }
        // Replies come back in about the order the probes went out, and a burst of them that overflows a queue on
        // the way (a switch port's buffer, this NIC's receive ring) loses its tail: start each round's unicast
        // probes at a different child so that the tail is never the same children round after round.
        if !unicast.is_empty() {
            let k = next as usize % unicast.len();
            unicast.rotate_left(k);
        }
        self.round = next;
        self.counts = (grouped, unreached);
        (group, unicast)
    }
}

/// The prober's period: a periodic `CLOCK_MONOTONIC` timerfd watched by the runtime, or tokio's `Interval` if the
/// kernel refuses a timerfd. The timerfd is the cheaper of the two, and the prober wakes 100 times a second on
/// every parent: tokio re-arms an `Interval` in its timer wheel on every tick, and when that deadline becomes the
/// runtime's earliest it wakes itself through its eventfd, a write and a second pass through `epoll_wait` per
/// period (seen with `perf trace` on a parent of 16 children). The kernel re-arms a timerfd by itself.
enum Ticker {
    /// Readable once a period; a read returns the periods elapsed since the last read.
    Fd {
        /// The timerfd.
        fd: tokio::io::unix::AsyncFd<PeriodFd>,
        /// Its period.
        period: Duration,
        /// When its next expiry is due.
        due: std::time::Instant,
    },
    /// The fallback.
    Tokio(tokio::time::Interval),
}

/// A timerfd, as tokio's `AsyncFd` wants it (`AsRawFd`).
struct PeriodFd(nix::sys::timerfd::TimerFd);

impl std::os::fd::AsRawFd for PeriodFd {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsFd;
        self.0.as_fd().as_raw_fd()
    }
}

impl Ticker {
    /// Ticks every `period` (the first tick one period from now).
    fn new(period: Duration) -> Ticker {
        use nix::sys::time::TimeSpec;
        use nix::sys::timerfd::{ClockId, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags};
        let fd = TimerFd::new(ClockId::CLOCK_MONOTONIC, TimerFlags::TFD_NONBLOCK | TimerFlags::TFD_CLOEXEC)
            .and_then(|t| {
                t.set(Expiration::Interval(TimeSpec::from_duration(period)), TimerSetTimeFlags::empty())?;
                Ok(t)
            })
            .map_err(std::io::Error::from)
            .and_then(|t| {
                // SAFETY: `PeriodFd` owns the timerfd and always returns that descriptor; it is closed only when
                // the `PeriodFd` drops, which the `AsyncFd` that holds it does after deregistering it.
                unsafe { tokio::io::unix::AsyncFd::register_with_interest(PeriodFd(t), tokio::io::Interest::READABLE) }
                    .map_err(|e| e.into_parts().1)
            });
        match fd {
            Ok(fd) => Ticker::Fd { fd, period, due: std::time::Instant::now() + period },
            Err(e) => {
                warn!("prober: no timerfd ({e}); its period is kept by the runtime's timer");
                let mut t = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
                // A starved prober skips the periods it missed rather than probing in a burst to catch up.
                t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                Ticker::Tokio(t)
            }
        }
    }

    /// Waits for the next period. Cancel-safe (a `select!` branch): an expiry not yet read stays in the timerfd.
    /// A tick taken late (by more than a quarter period: the prober was starved) moves the schedule so the next
    /// one comes a full period later, as tokio's `MissedTickBehavior::Delay` does: each round's probes always
    /// get a whole period to be answered before the next round counts them missing.
    async fn tick(&mut self) {
        match self {
            Ticker::Tokio(t) => {
                t.tick().await;
            }
            Ticker::Fd { fd, period, due } => loop {
                let Ok(mut ready) = fd.readable().await else {
                    // The runtime lost the descriptor (it is shutting down): wait a period the plain way.
                    tokio::time::sleep(*period).await;
                    return;
                };
                let mut n = [0u8; 8];
                match ready.try_io(|f| {
                    nix::unistd::read(std::os::fd::AsRawFd::as_raw_fd(f.get_ref()), &mut n)
                        .map_err(std::io::Error::from)
                }) {
                    Ok(_) => {
                        // Read to zero: the next expiry is a new edge. Saves a read that would say EAGAIN.
                        ready.clear_ready();
                        let now = std::time::Instant::now();
                        if now > *due + *period / 4 {
                            use nix::sys::timerfd::{Expiration, TimerSetTimeFlags};
                            let every = Expiration::Interval(nix::sys::time::TimeSpec::from_duration(*period));
                            // Re-arming also clears an expiry that came meanwhile. If it fails the old
                            // schedule goes on, which only shortens the next period once.
                            let _ = fd.get_ref().0.set(every, TimerSetTimeFlags::empty());
                            *due = now + *period;
                        } else {
                            *due += *period;
                        }
                        return;
                    }
                    Err(_would_block) => continue,
                }
            },
        }
    }
}

/// Whether a child at `addr` may be probed by the group datagram: the prober has a group, the kernel collects
/// replies (group replies never reach the socket), and the child is alone on its node (`per_ip` counts children
/// per address: a node's kernel answers one broker per parent).
fn groupable(group: Option<SocketAddrV4>, collects: bool, per_ip: &HashMap<Ipv4Addr, u32>, addr: SocketAddr) -> bool {
    match addr {
        SocketAddr::V4(a) => group.is_some() && collects && per_ip.get(a.ip()).copied() == Some(1),
        SocketAddr::V6(_) => false,
    }
}

/// The socket's readiness as the runtime last saw it, without waiting: `Some` if a datagram may be waiting.
fn readable_now(sock: &ProbeSocket) -> Option<tokio::io::unix::AsyncFdReadyGuard<'_, std::net::UdpSocket>> {
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match sock.poll_read_ready(&mut cx) {
        std::task::Poll::Ready(Ok(g)) => Some(g),
        _ => None,
    }
}

/// Probes every child each period: children whose kernel has answered (and that are alone on their node) by one
/// IP multicast datagram per period, the others by unicast. Replies are collected by this node's kernel where
/// it can (no datagram reaches the socket), else read from the socket as they arrive. Misses are counted only
/// at the start of a period after every reply that has arrived was read, so a starved prober never blames its
/// children.
/// Stack of the prober's thread (bytes): it runs one small task; the default 2 MiB would be reserved by every
/// broker of a test instance.
const PROBER_STACK: usize = 256 * 1024;

/// The prober's own thread: a current-thread runtime that runs [`prober_task`] until the broker drops its command
/// channel. Not a task of the broker's runtime: there, every period waited behind whatever the broker's loop was
/// doing (a job's launch, a burst of messages, a store write), and a starved loop made the prober read replies late
/// and send probes late: on the overload soak, rounds came every 25 ms instead of 10 and the replies it timed took
/// up to 1.3 s on links of 200 ms, so a dead node was judged after seconds. A thread of its own is woken by its
/// timer as soon as the kernel schedules it, whatever the loop does. Verdicts still go through the loop.
///
/// And a real-time thread (`SCHED_RR`, priority 1, the lowest), as corosync runs its membership protocol: with the
/// CPUs saturated (64 more brokers and 3 busy loops on 2 cores), a normal thread still woke 20 ms late and more,
/// its rounds came every 30 ms and the replies it timed looked 800 ms long; as the lowest real-time priority it
/// runs when its timer fires, and its work, a few microseconds per period, takes nothing that matters from the rest.
/// Without the privilege (`CAP_SYS_NICE`) it runs at normal priority, said once in the log and in
/// `vigil overlay status`. Only the broker that owns its machine's detectors (one per node on a cluster) asks for
/// it: the 64 brokers of a test instance on 2 CPUs, all real-time, took so much from everything else that rank 0's
/// loop, where verdicts are made, ran seconds late.
///
/// `realtime_wanted`: this broker is its machine's detector owner.
#[allow(clippy::too_many_arguments)]
fn prober_thread(
    sock: std::net::UdpSocket,
    rx: mpsc::UnboundedReceiver<ProbeCmd>,
    tx: mpsc::UnboundedSender<DetectInput>,
    period: Duration,
    group: Option<SocketAddrV4>,
    stats: Arc<ProberStats>,
    stall_max: f64,
    realtime_wanted: bool,
) {
    let _ = stats.priority.set(match realtime_wanted.then(realtime) {
        None => "at normal priority (real-time is for the prober of this machine's detector owner)".into(),
        Some(Ok(())) => "real-time (SCHED_RR 1)".into(),
        Some(Err(e)) => {
            warn!("the heartbeat prober runs at normal priority (real-time scheduling refused: {e}); under CPU overload its periods may run late");
            format!("at normal priority (real-time refused: {e})")
        }
    });
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            warn!("no heartbeat prober (runtime: {e}); children are judged on TCP alone");
            return;
        }
    };
    rt.block_on(async move {
        // SAFETY: the UdpSocket owns its descriptor, which stays open and the same until the AsyncFd that holds the
        // socket drops it (after deregistering it).
        match unsafe { tokio::io::unix::AsyncFd::register_with_interest(sock, tokio::io::Interest::READABLE) } {
            Ok(sock) => prober_task(sock, rx, tx, period, group, stats, stall_max).await,
            Err(e) => warn!("no heartbeat prober (UDP socket: {}); children are judged on TCP alone", e.into_parts().1),
        }
    });
}

/// Makes the calling thread `SCHED_RR` at priority 1 (see [`prober_thread`]).
fn realtime() -> std::io::Result<()> {
    if std::env::var_os("VIGIL_PROBER_NO_RT").is_some() {
        return Err(std::io::Error::other("VIGIL_PROBER_NO_RT is set"));
    }
    let p = libc::sched_param { sched_priority: 1 };
    // SAFETY: sched_setscheduler on pid 0 (the calling thread) with a valid sched_param we own.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_RR, &p) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

async fn prober_task(
    sock: ProbeSocket,
    mut rx: mpsc::UnboundedReceiver<ProbeCmd>,
    tx: mpsc::UnboundedSender<DetectInput>,
    period: Duration,
    group: Option<SocketAddrV4>,
    stats: Arc<ProberStats>,
    stall_max: f64,
) {
    let port = sock.get_ref().local_addr().map(|a| a.port()).unwrap_or(0);
    let key = {
        let mut k = [0u8; 8];
        let _ = std::fs::File::open("/dev/urandom").and_then(|mut f| std::io::Read::read_exact(&mut f, &mut k));
        u64::from_ne_bytes(k) ^ vigil_ebpf::monotonic_ns()
    };
    let mut pr = Prober::new(key, port, group, tx, stall_max / 2.0);
    pr.period = period.as_secs_f64();
    let mut tick = Ticker::new(period);
    let mut rbufs = vec![[0u8; 128]; PROBE_GROUP];
    let mut drain = |pr: &mut Prober, sock: &ProbeSocket| {
        drain_replies(sock, &mut rbufs, |n, b, from| {
            if let Some(p) = Probe::decode(&b[..n]) {
                pr.reply(&p, from);
            }
        })
    };
    loop {
        tokio::select! {
            c = rx.recv() => match c {
                Some(ProbeCmd::Add(r, addr)) => pr.add(r, addr),
                Some(ProbeCmd::Remove(r)) => pr.remove(r),
                Some(ProbeCmd::Now(r)) => {
                    let round = pr.round;
                    if let (Some(t), true) = (pr.targets.get_mut(&r), round > 0) {
                        t.last_unicast = round;
                        let _ = sock.get_ref().send_to(&Probe::request(round, t.id, vigil_ebpf::monotonic_ns() ^ pr.key).encode(), t.addr);
                    }
                }
                Some(ProbeCmd::Collector(t)) => {
                    if let (None, Some(area)) = (&pr.area, t.replies()) {
                        pr.set_area(area);
                    }
                }
                None => return,
            },
            r = sock.readable() => {
                if let Ok(mut ready) = r {
                    drain(&mut pr, &sock);
                    // Drained to EAGAIN: a datagram arriving from now on is a new edge, seen at the next wait.
                    ready.clear_ready();
                }
            }
            _ = tick.tick() => {
                // Read everything that has arrived before judging. With the kernel collecting replies the socket
                // is read only if the runtime saw a datagram come (this branch may run before the readable one).
                if pr.area.is_none() {
                    drain(&mut pr, &sock);
                } else if let Some(mut ready) = readable_now(&sock) {
                    drain(&mut pr, &sock);
                    ready.clear_ready();
                }
                pr.read_collected();
                let (group_wanted, unicast) = pr.next_round();
                {
                    use std::sync::atomic::Ordering::Relaxed;
                    let (grouped, unreached) = pr.counts;
                    stats.grouped.store(grouped, Relaxed);
                    let parent = pr.targets.contains_key(&PARENT);
                    stats.unicast.store(pr.targets.len() as u32 - grouped - u32::from(parent), Relaxed);
                    stats.parent.store(parent, Relaxed);
                    stats.unreached.store(unreached, Relaxed);
                    stats.void_rounds.store(pr.void_rounds, Relaxed);
                    stats.correlated_rounds.store(pr.correlated_rounds, Relaxed);
                    stats.collected.store(pr.area.is_some(), Relaxed);
                }
                let now = vigil_ebpf::monotonic_ns() ^ pr.key;
                // Unicast probes before the group datagram: they include the re-probes of grouped children that
                // missed the last round, and a child at the tail of the group's burst of replies (the one a full
                // receive ring or switch buffer drops) must not be re-probed at the tail again.
                // Send in small groups and read the replies in between: a burst of hundreds of replies would
                // otherwise overflow the socket and make the same (last) children miss every round.
                for chunk in unicast.chunks(PROBE_GROUP) {
                    let pkts: Vec<([u8; vigil_ebpf::PROBE_LEN], SocketAddr)> =
                        chunk.iter().map(|(r, addr)| (Probe::request(pr.round, *r, now).encode(), *addr)).collect();
                    send_batch(&sock, &pkts);
                    if pr.area.is_none() {
                        drain(&mut pr, &sock);
                    }
                }
                if let (true, Some(g)) = (group_wanted, pr.group) {
                    let _ = sock.get_ref().send_to(&Probe::group(pr.round, now).encode(), SocketAddr::V4(g));
                }
            }
        }
    }
}

/// Bytes received on a socket and not yet read (FIONREAD).
pub(crate) fn unread_bytes(fd: &std::os::fd::OwnedFd) -> bool {
    use std::os::fd::AsRawFd;
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one c_int through a valid pointer; the fd is a socket we own a duplicate of.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), libc::FIONREAD, &mut n) };
    rc == 0 && n > 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attrs::ProbeGroup;

    fn prober(group: bool) -> (Prober, mpsc::UnboundedReceiver<DetectInput>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let group = group.then(|| ProbeGroup::Auto.for_parent(0)).flatten();
        let mut pr = Prober::new(0x5eed, 9, group, tx, 0.25);
        // As if this node's kernel collected replies (no BPF in unit tests: replies are fed in directly).
        pr.collects = true;
        (pr, rx)
    }

    fn addr(host: u8) -> SocketAddr {
        SocketAddr::from(([10, 200, 0, host], 7000))
    }

    /// A reply of `kind` from child `rank` to the current round, as it comes.
    fn raw_reply(pr: &mut Prober, rank: u32, kind: ProbeKind) {
        let p = Probe {
            kind,
            flags: vigil_ebpf::FLAG_ALIVE,
            seq: pr.round,
            rank: pr.targets[&rank].id,
            sent_ns: vigil_ebpf::monotonic_ns() ^ pr.key,
            hb_age_ns: 0,
            answered: 1,
        };
        let from = pr.targets[&rank].addr;
        pr.reply(&p, from);
    }

    /// [`raw_reply`] from a kernel that has answered for a while: its timing is known, its replies are forwarded
    /// and its misses count (vigil_core::probe::ARM_REPLIES).
    fn reply(pr: &mut Prober, rank: u32, kind: ProbeKind) {
        if kind == ProbeKind::ReplyKernel {
            let t = pr.targets.get_mut(&rank).expect("a target");
            while !t.timing.armed() {
                t.timing.sample(0.0);
            }
        }
        raw_reply(pr, rank, kind);
    }

    fn misses(rx: &mut mpsc::UnboundedReceiver<DetectInput>) -> Vec<(u32, u32)> {
        let mut v = Vec::new();
        while let Ok(d) = rx.try_recv() {
            if let DetectInput::Probe(r, Signal::ProbeMissed { misses }) = d {
                v.push((r, misses));
            }
        }
        v
    }

    /// The config of a broker started with `-S name=v`, or the attribute error.
    fn config(name: &str, v: &str) -> Result<BrokerConfig, String> {
        BrokerConfig::parse(&std::collections::BTreeMap::from([(name.to_string(), v.to_string())]))
            .map_err(|e| e.to_string())
    }

    #[test]
    fn xdp_mode_attribute() {
        let a = |v: &str| config("broker.xdp_mode", v).map(|c| xdp_attach(&c));
        assert_eq!(xdp_attach(&BrokerConfig::default()), XdpAttach::Auto);
        assert_eq!(a("native"), Ok(XdpAttach::Native));
        assert_eq!(a("generic"), Ok(XdpAttach::Generic));
        for bad in ["driver", "skb", "", "Native"] {
            let e = a(bad).unwrap_err();
            assert!(e.contains("broker.xdp_mode") && e.contains("expected auto, native or generic"), "{bad}: {e}");
        }
    }

    #[test]
    fn probe_group_attribute() {
        let a = |v: &str| config("tbon.probe_group", v).map(|c| c.probe_group);
        assert_eq!(BrokerConfig::default().probe_group, ProbeGroup::Auto);
        assert_eq!(a("off"), Ok(ProbeGroup::Off));
        assert_eq!(ProbeGroup::Auto.for_parent(258), Some("239.255.1.2:22087".parse().unwrap()));
        let fixed = a("239.1.2.3:999").unwrap();
        assert_eq!(fixed.for_parent(7), Some("239.1.2.3:999".parse().unwrap()));
        for bad in ["10.0.0.1:5", "239.1.2.3:0", "239.1.2.3", "yes", "224.0.0.1:5000"] {
            assert!(a(bad).unwrap_err().contains("tbon.probe_group"), "{bad}");
        }
    }

    #[test]
    fn a_child_whose_kernel_answered_moves_to_the_group_datagram() {
        let (mut pr, mut rx) = prober(true);
        pr.add(1, addr(2));
        pr.add(2, addr(3));
        let (group, unicast) = pr.next_round();
        assert!(!group);
        assert_eq!(unicast.len(), 2);
        reply(&mut pr, 1, ProbeKind::ReplyKernel);
        reply(&mut pr, 2, ProbeKind::ReplyUserspace);
        let (group, unicast) = pr.next_round();
        assert!(group, "rank 1's kernel answered: it is probed by the group datagram");
        assert_eq!(unicast, vec![(pr.targets[&2].id, addr(3))], "a userspace responder never sees group probes");
        assert!(misses(&mut rx).is_empty());
    }

    #[test]
    fn without_group_or_kernel_collection_or_alone_on_its_node_probes_stay_unicast() {
        for (group, collects, same_node) in [(false, true, false), (true, false, false), (true, true, true)] {
            let (mut pr, _rx) = prober(group);
            pr.collects = collects;
            pr.add(1, addr(2));
            pr.add(2, if same_node { SocketAddr::from(([10, 200, 0, 2], 7001)) } else { addr(3) });
            pr.next_round();
            reply(&mut pr, 1, ProbeKind::ReplyKernel);
            reply(&mut pr, 2, ProbeKind::ReplyKernel);
            let (g, unicast) = pr.next_round();
            assert!(!g && unicast.len() == 2, "group {group} collects {collects} same node {same_node}");
        }
    }

    #[test]
    fn unicast_probes_start_at_a_different_child_each_round() {
        let (mut pr, _rx) = prober(false);
        for k in 1..=5 {
            pr.add(k, addr(k as u8 + 1));
        }
        let mut firsts = std::collections::HashSet::new();
        for _ in 0..5 {
            let (_, unicast) = pr.next_round();
            let mut ids: Vec<u32> = unicast.iter().map(|(id, _)| *id).collect();
            firsts.insert(ids[0]);
            ids.sort_unstable();
            let mut all: Vec<u32> = pr.targets.values().map(|t| t.id).collect();
            all.sort_unstable();
            assert_eq!(ids, all, "every child probed once a round");
        }
        assert_eq!(firsts.len(), 5, "five rounds, five different children first (none always last)");
    }

    #[test]
    fn a_silent_grouped_child_is_probed_by_unicast_too_and_misses_count_every_round() {
        let (mut pr, mut rx) = prober(true);
        pr.add(1, addr(2));
        pr.next_round();
        reply(&mut pr, 1, ProbeKind::ReplyKernel);
        let (group, unicast) = pr.next_round();
        assert!(group && unicast.is_empty());
        // Silent from now on.
        let (_, unicast) = pr.next_round();
        assert_eq!(unicast, vec![(pr.targets[&1].id, addr(2))], "a missed group round brings a unicast probe as well");
        pr.next_round();
        pr.next_round();
        assert_eq!(misses(&mut rx), vec![(1, 1), (1, 2), (1, 3)]);
    }

    /// Before a child's reply time is known its kernel replies are not forwarded (they would arm the probe rules)
    /// and its silence is no miss; a new child then starts from the prober's timing of the others.
    #[test]
    fn a_childs_replies_count_once_its_reply_time_is_known() {
        let (mut pr, mut rx) = prober(false);
        pr.add(1, addr(2));
        let raw = |pr: &mut Prober, rank: u32| raw_reply(pr, rank, ProbeKind::ReplyKernel);
        let replies = |rx: &mut mpsc::UnboundedReceiver<DetectInput>| {
            let mut n = 0;
            while let Ok(d) = rx.try_recv() {
                n += usize::from(matches!(d, DetectInput::Probe(_, Signal::ProbeReply { kernel: true, .. })));
            }
            n
        };
        for _ in 0..vigil_core::probe::ARM_REPLIES - 1 {
            pr.next_round();
            raw(&mut pr, 1);
        }
        assert_eq!(replies(&mut rx), 0, "forwarded before its reply time is known");
        for _ in 0..5 {
            pr.next_round();
        }
        assert!(misses(&mut rx).is_empty(), "silence counted before its reply time is known");
        pr.next_round();
        raw(&mut pr, 1);
        assert_eq!(replies(&mut rx), 1);
        // A child that joins now is judged at the pace of the others at once.
        pr.add(2, addr(3));
        assert!(pr.targets[&2].timing.armed());
        pr.next_round();
        raw(&mut pr, 2);
        assert_eq!(replies(&mut rx), 1);
    }

    #[test]
    fn a_child_the_group_does_not_reach_falls_back_to_unicast_and_is_never_counted_lost() {
        let (mut pr, mut rx) = prober(true);
        pr.add(1, addr(2));
        let mut worst = 0;
        for _ in 0..40 {
            let (_, unicast) = pr.next_round();
            // The network drops the multicast datagram: only unicast probes are answered.
            if unicast.iter().any(|(id, _)| *id == pr.targets[&1].id) {
                reply(&mut pr, 1, ProbeKind::ReplyKernel);
            }
            worst = misses(&mut rx).iter().map(|(_, m)| *m).max().unwrap_or(0).max(worst);
        }
        let t = &pr.targets[&1];
        assert!(t.no_group && !t.grouped, "probed by unicast for good");
        assert_eq!(worst, 1, "never more than one miss in a row: far from lost");
        // From then on every round is unicast and answered: no more misses.
        for _ in 0..5 {
            let (group, unicast) = pr.next_round();
            assert!(!group && unicast.len() == 1);
            reply(&mut pr, 1, ProbeKind::ReplyKernel);
        }
        assert!(misses(&mut rx).is_empty());
    }

    /// A prober with children 1..=n whose kernels answered once, all grouped.
    fn grouped_children(n: u32) -> (Prober, mpsc::UnboundedReceiver<DetectInput>) {
        let (mut pr, mut rx) = prober(true);
        for r in 1..=n {
            pr.add(r, addr(1 + r as u8));
        }
        pr.next_round();
        for r in 1..=n {
            reply(&mut pr, r, ProbeKind::ReplyKernel);
        }
        let (group, unicast) = pr.next_round();
        assert!(group && unicast.is_empty());
        assert!(misses(&mut rx).is_empty());
        (pr, rx)
    }

    #[test]
    fn a_round_no_child_answers_is_not_judged_but_one_silent_child_is() {
        let (mut pr, mut rx) = grouped_children(8);
        let round = pr.round;
        // This node's receive path stalls: nobody's reply arrives for 5 periods.
        for k in 0..5 {
            let (group, unicast) = pr.next_round();
            assert!(group && unicast.len() == 8, "period {k}: the round is probed again, by unicast too");
            assert_eq!(pr.round, round, "the same round number");
        }
        assert!(misses(&mut rx).is_empty(), "nobody blamed for our own stall");
        assert_eq!(pr.void_rounds, 5);
        // Replies come again (late ones count for the round re-probed); rank 4 stays silent: it alone is judged.
        for _ in 0..4 {
            for r in (1..=8).filter(|r| *r != 4) {
                reply(&mut pr, r, ProbeKind::ReplyKernel);
            }
            pr.next_round();
        }
        assert_eq!(misses(&mut rx), vec![(4, 1), (4, 2), (4, 3), (4, 4)]);
        assert_eq!(pr.void_rounds, 5);
    }

    /// Several children silent at once (below the void rule's threshold) are excused, for at most
    /// `MAX_EXCUSED` periods: nodes that died together are still lost, about a second later than one alone.
    #[test]
    fn children_silent_together_are_excused_for_at_most_a_second() {
        let n = VOID_MIN_CHILDREN as u32 - 1;
        let (mut pr, mut rx) = grouped_children(n);
        for _ in 0..3 {
            pr.next_round();
        }
        assert!(misses(&mut rx).is_empty(), "{n} children silent at once: nobody blamed yet");
        assert_eq!(pr.correlated_rounds, 3);
        for _ in 0..vigil_core::probe::MAX_EXCUSED {
            pr.next_round();
        }
        let m = misses(&mut rx);
        for r in 1..=n {
            assert!(m.iter().any(|&(x, k)| x == r && k >= 3), "rank {r} never missed 3 probes: {m:?}");
        }
        assert_eq!(pr.void_rounds, 0);
    }

    /// Two of five children late at once are excused; the one still silent once the other answers again is
    /// judged, from where its count stood.
    #[test]
    fn a_child_still_silent_when_the_others_answer_is_judged() {
        let (mut pr, mut rx) = grouped_children(5);
        for _ in 0..4 {
            for r in [1, 2, 3] {
                reply(&mut pr, r, ProbeKind::ReplyKernel);
            }
            pr.next_round();
        }
        assert!(misses(&mut rx).is_empty(), "ranks 4 and 5 late together: excused");
        for _ in 0..3 {
            for r in [1, 2, 3, 5] {
                reply(&mut pr, r, ProbeKind::ReplyKernel);
            }
            pr.next_round();
        }
        let m = misses(&mut rx);
        assert!(m.iter().all(|(r, _)| *r == 4), "{m:?}");
        assert!(m.iter().any(|(_, k)| *k >= 3), "rank 4, silent alone, is judged: {m:?}");
    }

    #[test]
    fn a_group_that_reaches_no_child_is_given_up_without_blaming_anyone() {
        let (mut pr, mut rx) = grouped_children(8);
        // The network stops delivering the multicast datagram to everyone: only unicast probes are answered.
        let mut worst = 0;
        for _ in 0..40 {
            let (_, unicast) = pr.next_round();
            let ids: Vec<u32> = unicast.iter().map(|(id, _)| *id).collect();
            for r in 1..=8 {
                if ids.contains(&pr.targets[&r].id) {
                    reply(&mut pr, r, ProbeKind::ReplyKernel);
                }
            }
            worst = misses(&mut rx).iter().map(|(_, m)| *m).max().unwrap_or(0).max(worst);
        }
        assert!(pr.targets.values().all(|t| t.no_group && !t.grouped), "every child probed by unicast for good");
        assert!(worst <= 1, "never more than one miss in a row, got {worst}");
        // From then on every round is answered and judged.
        let v = pr.void_rounds;
        for _ in 0..5 {
            let (group, unicast) = pr.next_round();
            assert!(!group && unicast.len() == 8);
            for r in 1..=8 {
                reply(&mut pr, r, ProbeKind::ReplyKernel);
            }
        }
        assert_eq!(pr.void_rounds, v);
        assert!(misses(&mut rx).is_empty());
    }

    #[test]
    fn stale_forged_and_foreign_replies_are_ignored() {
        let (mut pr, mut rx) = prober(true);
        pr.add(1, addr(2));
        pr.next_round();
        pr.next_round();
        let good = Probe {
            kind: ProbeKind::ReplyKernel,
            flags: vigil_ebpf::FLAG_ALIVE,
            seq: pr.round,
            rank: pr.targets[&1].id,
            sent_ns: vigil_ebpf::monotonic_ns() ^ pr.key,
            hb_age_ns: 0,
            answered: 1,
        };
        pr.reply(&Probe { sent_ns: 12345, ..good }, addr(2)); // not keyed with our secret
        pr.reply(&good, addr(9)); // from another address
        pr.reply(&Probe { seq: pr.round + 1, ..good }, addr(2)); // a round not sent yet
        assert_eq!(pr.targets[&1].answered, 0);
        pr.reply(&good, addr(2));
        assert_eq!(pr.targets[&1].answered, pr.round);
        let _ = misses(&mut rx);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn ticker_keeps_its_period_and_skips_what_a_starved_prober_missed() {
        let period = Duration::from_millis(10);
        let mut t = Ticker::new(period);
        assert!(matches!(t, Ticker::Fd { .. }), "a timerfd on Linux");
        let start = std::time::Instant::now();
        for _ in 0..5 {
            t.tick().await;
        }
        let five = start.elapsed();
        assert!(five >= Duration::from_millis(45), "5 periods of 10 ms took {five:?}");
        // Starved for 5 periods: one tick at once, then a whole period before the next (no catch-up burst, and
        // the round taken late still gets a full period for its replies).
        std::thread::sleep(period * 5);
        let late = std::time::Instant::now();
        t.tick().await;
        // (A loose bound: a loaded test machine may deschedule us for a few ms.)
        assert!(late.elapsed() < period * 4, "the missed period is reported at once, not periods later");
        let after = std::time::Instant::now();
        t.tick().await;
        let gap = after.elapsed();
        assert!(gap >= Duration::from_millis(9), "a full period after a late tick, got {gap:?}");
        // Taken 8 ms after it was due (less than a period late): still a full period to the next.
        std::thread::sleep(Duration::from_millis(18));
        t.tick().await;
        let after = std::time::Instant::now();
        t.tick().await;
        let gap = after.elapsed();
        assert!(gap >= Duration::from_millis(9), "a full period after a tick 8 ms late, got {gap:?}");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn probe_socket_readiness_is_seen_without_waiting_and_cleared_by_draining() {
        let s = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
        s.set_nonblocking(true).expect("nonblocking");
        let to = s.local_addr().expect("addr");
        // SAFETY: the UdpSocket owns its descriptor for the AsyncFd's whole life.
        let sock = unsafe { tokio::io::unix::AsyncFd::register_with_interest(s, tokio::io::Interest::READABLE) }
            .map_err(|e| e.into_parts().1)
            .expect("register");
        assert!(readable_now(&sock).is_none(), "nothing came yet");
        let probe = Probe::request(1, 7, 42).encode();
        sock.get_ref().send_to(&probe, to).expect("send");
        // The runtime sees it come (then the guard is dropped without clearing, as when the tick branch runs first).
        drop(tokio::time::timeout(Duration::from_secs(2), sock.readable()).await.expect("readable").expect("ready"));
        let mut ready = readable_now(&sock).expect("readiness seen without waiting");
        let mut bufs = vec![[0u8; 128]; 4];
        let mut got = Vec::new();
        drain_replies(&sock, &mut bufs, |n, b, from| got.push((n, b.to_vec(), from)));
        ready.clear_ready();
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].0, &got[0].1[..], got[0].2), (probe.len(), &probe[..], to));
        assert!(readable_now(&sock).is_none(), "drained and cleared");
    }
}
