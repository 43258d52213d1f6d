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
//!
//! Where each part is, one job a file:
//! - here: [`Detectors`], what the driver holds. It starts the detectors ([`Detectors::start`]: the probe
//!   socket, the userspace responder, the background loader), feeds the responder the broker's heartbeat, hands
//!   the watchers the pids and overlay sockets to watch, starts the prober with the first child, and cleans up
//!   on exit; and [`DetectInput`], what the detectors send the driver's loop.
//! - `load.rs`: loading and attaching the eBPF programs in the background (once per machine, sharing the XDP
//!   responder through pinned maps), and taking them into use with the one report of what degraded.
//! - `watch.rs`: the tasks that watch process exits and the overlay's TCP connections.
//! - `status.rs`: what runs and what the prober does, as `vigil uptime` / `vigil overlay status` show it.
//! - `prober.rs`: the prober's state, child by child, and its rounds: what a reply or a silence means.
//! - `prober_thread.rs`: the prober's own thread, its period and its loop; `probe_socket.rs`: its UDP socket.
//! - `fabric_prober.rs`: the prober's probes of its children's job networks (`tbon.job_network`), whose
//!   silence while the management network answers makes a node fabric-down
//!   (`vigil_core::membership::FabricWatch`, applied here by [`Detectors::on_fabric`]).
//!
//! The rules these carry out live in the core: `vigil_core::membership` decides online / torpid / lost from the
//! signals sent here (docs/failure-detection.md), and `vigil_core::probe` holds the prober's rules on reply times,
//! patience and correlated silence, which `prober.rs` applies child by child.

mod fabric_prober;
mod load;
mod probe_socket;
mod prober;
mod prober_thread;
mod status;
mod watch;

pub(crate) use self::load::Loaded;
use self::load::{load, mode, sweep_pins, table_pin_path, xdp_attach};
use self::probe_socket::{grow_receive_buffer, multicast_sender};
pub(crate) use self::prober_thread::ProbeCmd;
use self::prober_thread::{prober_thread, PROBER_STACK};
pub(crate) use self::status::{DetectorStatus, ProberStats};
pub(crate) use self::watch::unread_bytes;
use self::watch::{socket_tuple, ExitCmd, TcpCmd};
use crate::attrs::BrokerConfig;
use crate::membership::Signal;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tracing::{info, warn};
use vigil_ebpf::{
    DetectorMode, ExitEvent, HbTable, HeartbeatClock, TcpEvent, TcpTuple, UserspaceResponder, XdpAttach, XdpResponder,
};

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
    /// A liveness signal about child `rank` from the prober, when the prober sent it (the loop measures how
    /// late it hears its detectors: `vigil_detect_report_delay_seconds`), and when the event behind it happened
    /// (`CLOCK_MONOTONIC` ns, if known: the last reply before misses, a reply saying the broker is dead, the
    /// last heartbeat a reply reports), which a verdict on it is timed from (`vigil_verdict_latency_seconds`).
    Probe(u32, Signal, std::time::Instant, Option<u64>),
    /// What the prober sees of child `rank`'s job network (sent when it changes, and once a second): `missed`
    /// probes in a row unanswered there, and whether its management network answers
    /// (`vigil_core::membership::FabricWatch::observe`).
    Fabric {
        /// Child rank.
        rank: u32,
        /// Job-network probes missed in a row (0: it answers).
        missed: u32,
        /// Its management network answers and its broker beats.
        mgmt_ok: bool,
    },
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
    /// This node's job network (`tbon.job_network`) as told to the parent: interface, and where its responder
    /// answers. `None`: none set, or not found (said once in [`DetectorStatus::job_network`]).
    job_network: Option<(String, SocketAddrV4)>,
    /// The responder on the job network (a userspace thread; the XDP responder is on the management
    /// interface only).
    _fabric_responder: Option<UserspaceResponder>,
    /// The XDP responder on the job network's interface, once the background load attached it (the kernel
    /// answers there as on the management interface, so a busy node does not look fabric-down).
    fabric_xdp: Arc<std::sync::Mutex<Option<XdpResponder>>>,
    fabric_xdp_wanted: bool,
    fabric_xdp_said: bool,
    /// The fabric-down rule over this broker's children, with its clock's origin.
    fabric: vigil_core::membership::FabricWatch,
    origin: std::time::Instant,
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
            job_network: String::new(),
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
        let (job_network, fabric_responder, jn_status) = job_network(config, probe_port, &clock);
        let status = DetectorStatus { job_network: jn_status, ..status };
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
            job_network,
            _fabric_responder: fabric_responder,
            fabric_xdp: Default::default(),
            fabric_xdp_wanted: config.detector_rank.is_none() && mode != DetectorMode::ForceUserspace,
            fabric_xdp_said: false,
            fabric: vigil_core::membership::FabricWatch::new(cfg.probe_misses, config.job_network_undrain_after),
            origin: std::time::Instant::now(),
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
        // The job network's XDP responder too: one broker per node only (the brokers of a test instance share
        // the machine's interfaces), and not when userspace detectors were asked for.
        let fabric = self
            .job_network
            .as_ref()
            .filter(|_| self.fabric_xdp_wanted)
            .map(|(iface, addr)| (iface.clone(), addr.port(), self.fabric_xdp.clone(), self.xdp_how));
        // A plain thread, not spawn_blocking: a short-lived broker must not wait for the load to finish on exit.
        let rt = tokio::runtime::Handle::current();
        let spawned = std::thread::Builder::new().name("vigil-detectors".into()).spawn(move || {
            let _g = rt.enter();
            let loaded = f();
            let _ = input_tx.send(DetectInput::Loaded(Box::new(loaded)));
            if let Some((iface, port, slot, how)) = fabric {
                attach_fabric(&iface, port, how, &slot);
            }
        });
        if let Err(e) = spawned {
            warn!("cannot start the detector loader thread ({e}); detectors stay userspace");
        }
    }

    /// Called every `tbon.stall_max / 4` from the core (`Effect::Beat`):
    /// the userspace heartbeat the responder reports (its table in the kernel, or the userspace responder's clock).
    pub(crate) fn beat_clock(&mut self) {
        self.clock.beat();
        if let Some((_, addr)) = &self.job_network {
            if let Ok(x) = self.fabric_xdp.lock() {
                if let Some(x) = x.as_ref() {
                    let _ = x.table().heartbeat(addr.port());
                    if !self.fabric_xdp_said {
                        self.fabric_xdp_said = true;
                        self.status.job_network = self.status.job_network.replace(
                            "answered by userspace",
                            &format!("answered by xdp ({} on {})", x.mode(), x.interface()),
                        );
                    }
                }
            }
        }
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

    /// The probe fields of this broker's hello to a parent: `probe_port`, and `job_network` (`{"iface": IFACE,
    /// "addr": "IP:PORT"}`, where its job-network responder answers) when it has one. An older parent ignores the
    /// field; a parent without it in a child's hello probes the management network only.
    pub(crate) fn hello_fields(&self) -> serde_json::Value {
        let mut v = serde_json::json!({"probe_port": self.probe_port});
        if let Some((iface, addr)) = &self.job_network {
            v["job_network"] = serde_json::json!({"iface": iface, "addr": addr.to_string()});
        }
        v
    }

    /// Probe child `rank`'s job network (interface `iface` there) at `addr` too, and judge it by the fabric-down
    /// rule. After [`Detectors::probe_child`] (which starts the prober).
    pub(crate) fn probe_child_fabric(&mut self, rank: u32, iface: &str, addr: SocketAddr) {
        if let Some(p) = &self.prober {
            self.fabric.watch(rank, iface);
            let _ = p.send(ProbeCmd::AddFabric(rank, addr));
        }
    }

    /// Child `rank` is no longer probed here.
    pub(crate) fn forget_child(&mut self, rank: u32) {
        self.fabric.forget(rank);
        self.prober_cmd(ProbeCmd::Remove(rank));
    }

    /// [`DetectInput::Fabric`]: the fabric-down rule's verdict on it, if any.
    pub(crate) fn on_fabric(
        &mut self,
        rank: u32,
        missed: u32,
        mgmt_ok: bool,
    ) -> Option<vigil_core::membership::FabricVerdict> {
        self.fabric.observe(self.origin.elapsed().as_secs_f64(), rank, missed, mgmt_ok)
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

/// Attach the XDP responder to the job network's interface `iface` in `how` mode and have it answer for our
/// job-network responder's `port` (in the background loader's thread); said once in the log either way. On success
/// it is put in `slot` (dropped, so detached, with the broker's detectors).
fn attach_fabric(iface: &str, port: u16, how: XdpAttach, slot: &std::sync::Mutex<Option<XdpResponder>>) {
    match XdpResponder::attach_with(iface, how) {
        Ok(x) => match x.table().register(port, std::process::id()) {
            Ok(()) => {
                info!("job network {iface}: probes answered by xdp ({})", x.mode());
                if let Ok(mut s) = slot.lock() {
                    *s = Some(x);
                }
            }
            Err(e) => info!("job network {iface}: probes answered by userspace (xdp table: {e})"),
        },
        Err(e) => info!("job network {iface}: probes answered by userspace (xdp: {e})"),
    }
}

/// This node's job network (`tbon.job_network`): its interface's IPv4 address, and a userspace responder there on
/// the management probe port if it is free (else on any port), answering with `clock`. Returns what the hello
/// tells the parent, the responder, and the status line. A missing interface (or one without IPv4, or a socket
/// refused) is said once and turns the job-network probes of this node off; the broker runs on.
fn job_network(
    config: &BrokerConfig,
    probe_port: u16,
    clock: &Arc<HeartbeatClock>,
) -> (Option<(String, SocketAddrV4)>, Option<UserspaceResponder>, String) {
    let Some(iface) = config.job_network.clone() else { return (None, None, "off (tbon.job_network unset)".into()) };
    let off = |why: String| {
        warn!("tbon.job_network={iface}: {why}; this node's job network is not probed (no fabric-down detection)");
        (None, None, format!("{iface}: not probed ({why})"))
    };
    let ip = match vigil_ebpf::interface_ipv4(&iface) {
        Ok(ip) => ip,
        Err(e) => return off(e),
    };
    let sock = match std::net::UdpSocket::bind((ip, probe_port)).or_else(|_| std::net::UdpSocket::bind((ip, 0))) {
        Ok(s) => s,
        Err(e) => return off(format!("no responder socket on {ip}: {e}")),
    };
    let addr = match sock.local_addr() {
        Ok(SocketAddr::V4(a)) => a,
        Ok(a) => return off(format!("responder socket on {a} is not IPv4")),
        Err(e) => return off(format!("responder socket: {e}")),
    };
    match UserspaceResponder::spawn(sock, clock.clone()) {
        Ok(r) => {
            info!("job network {iface}: probes answered at {addr}");
            let line = format!("{iface} ({addr}): probed by the parent, answered by userspace; fabric-down after {}                                 unanswered in a row while the management network answers",
                config.membership.probe_misses);
            (Some((iface, addr)), Some(r), line)
        }
        Err(e) => off(format!("responder thread: {e}")),
    }
}

#[cfg(test)]
/// The attributes that choose how the detectors run.
mod tests {
    use super::*;
    use crate::attrs::ProbeGroup;

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
}
