//! Broker core: state, routing and the main loop.

use super::local;
use super::rdma_link;
use super::secure;
use super::transport::{
    tcp_ack_state, tune_tcp, Link, LinkEvent, LinkRx, LinkTx, TcpTransport, Transport, TCP_USER_TIMEOUT_MS,
};
use crate::hwloc::{NodeResources, NodeTopology, TopologySource};
use crate::idset::IdSet;
use crate::jobs::{Action, JobCore, JobId};
use crate::membership::{Membership, PeerState, Signal, Transition};
use crate::message::{errno, Message, MsgType, FLAG_NORESPONSE, NODEID_ANY, NODEID_UPSTREAM, ROUTE_LOCAL};
use crate::shellproto::{ShellExit, ShellReport};
use crate::topology::{Hop, Topology};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tracing::{debug, error, info, warn};

/// How a broker gets its overlay listening socket.
#[derive(Debug, Clone)]
pub enum ListenSpec {
    /// An already bound TCP listener inherited from `vigil start` (file descriptor number).
    Fd(i32),
    /// Bind this endpoint (`tcp://host:port`).
    Endpoint(String),
}

/// Everything a broker needs to start.
#[derive(Debug, Clone)]
pub struct BrokerOptions {
    /// This broker's rank.
    pub rank: u32,
    /// Number of brokers.
    pub size: u32,
    /// TBON shape.
    pub topo: Topology,
    /// Host name reported to rank 0.
    pub hostname: String,
    /// Instance identifier (peers with another id are refused).
    pub instance: String,
    /// Connect endpoint of every rank, by rank (only the parent's is used).
    pub endpoints: Vec<String>,
    /// Overlay listener.
    pub listen: ListenSpec,
    /// Directory for sockets and logs.
    pub rundir: PathBuf,
    /// The broker attributes, parsed and checked (`-S`, the TOML `[tbon]` table, a nested instance's bootstrap).
    pub config: crate::attrs::BrokerConfig,
    /// Initial program (rank 0 only); `None` = run none and stay up until signalled.
    pub initial_program: Option<Vec<String>>,
    /// Where this node's topology comes from.
    pub topology: TopologySource,
    /// Declared GPU count overriding discovery.
    pub declared_gpus: Option<u32>,
    /// Seconds to wait for the parent to accept our connection.
    pub connect_timeout: f64,
    /// Cores and GPUs this broker owns, when it is part of a nested instance (from the enclosing job's R);
    /// `None` = the whole node as discovered.
    pub resources_override: Option<(IdSet, IdSet)>,
    /// URI of the enclosing instance's broker on this node, for a nested instance.
    pub parent_uri: Option<String>,
    /// The instance's overlay key: every overlay link is authenticated and encrypted with it (see `secure`).
    pub key: crate::keyfile::OverlayKey,
}

/// Inputs of the core loop.
pub(crate) enum Input {
    Peer(Peer, u64, Message),
    PeerClosed(Peer, u64, String),
    ChildHello {
        conn: u64,
        msg: Message,
        link_tx: LinkTx,
        peer: String,
        rx: LinkRx,
        sock: Option<std::os::fd::OwnedFd>,
        tasks: Vec<tokio::task::AbortHandle>,
        /// The answer to the child's RDMA offer (see `rdma_link`).
        rdma: Box<rdma_link::Answer>,
    },
    LocalNew {
        id: u32,
        uid: u32,
        tx: LinkTx,
    },
    ShellDone {
        id: JobId,
        report: Option<ShellReport>,
        status: i32,
    },
    InitialStarted(i32),
    InitialExit(i32),
    Signal(i32),
    /// From the failure detectors (`detect.rs`); `requeued` marks a kernel TCP event already put back once.
    Detect(super::detect::DetectInput, bool),
}

/// Who a message came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Peer {
    Parent,
    Child(u32),
    Local(u32),
}

pub(crate) struct ChildLink {
    pub tx: LinkTx,
    /// The QP half of a busy-polling RDMA link, polled by the core loop ([`Core::poll_busy`]).
    pub busy: Option<rdma_link::BusyRx>,
    pub conn: u64,
    pub sock: Option<std::os::fd::OwnedFd>,
    pub tasks: Vec<tokio::task::AbortHandle>,
    /// The connection's 4-tuple as registered with the TCP watcher.
    pub tuple: Option<vigil_ebpf::TcpTuple>,
}

impl Drop for ChildLink {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

pub(crate) struct LocalClient {
    pub tx: LinkTx,
    pub uid: u32,
    pub subs: Vec<String>,
    pub streaming: bool,
}

/// What an internal request (sent by the core itself) was for.
pub(crate) enum Internal {
    Spawn {
        id: JobId,
        rank: u32,
    },
    Ignore,
    /// One round trip of overlay RTT measurement `run` (`broker.rtt`), sent at the given instant.
    Rtt {
        run: u64,
        sent: Instant,
    },
}

/// An overlay round-trip measurement run by this broker for a client (`broker.rtt`): `count` `broker.ping`
/// requests to `target`, at most `window` in flight, timed in the core loop (no client hop in the measurement).
pub(crate) struct RttRun {
    pub req: Message,
    pub target: u32,
    /// Requests still to send.
    pub left: u32,
    pub window: u32,
    pub inflight: u32,
    /// The requests' payload, JSON-encoded once for the whole run.
    pub payload: Vec<u8>,
    pub started: Instant,
    pub samples_us: Vec<f64>,
}

/// Liveness of a rank as rank 0 knows it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum MemberState {
    Online,
    Torpid,
    Offline,
    Lost,
}

/// A streaming request for a job's eventlog and/or output.
pub(crate) struct Watcher {
    pub req: Message,
    pub id: JobId,
    pub ev_pos: usize,
    pub out_pos: usize,
    pub eventlog: bool,
    pub output: bool,
    /// A job shell reading the job's standard input.
    pub stdin: bool,
    pub in_pos: usize,
    pub follow: bool,
}

pub(crate) struct Core {
    pub opts: BrokerOptions,
    /// Overlay connections refused before authentication (shared with the listener's tasks).
    pub refusals: std::sync::Arc<std::sync::Mutex<secure::RefusalLog>>,
    pub uid: u32,
    pub start: Instant,
    pub started_at: f64,
    pub resources: NodeResources,
    pub input_tx: mpsc::UnboundedSender<Input>,
    pub parent: Option<LinkTx>,
    pub children: HashMap<u32, ChildLink>,
    pub locals: HashMap<u32, LocalClient>,
    pub event_seq: u32,
    pub internal: HashMap<u32, Internal>,
    pub next_tag: u32,
    pub shells: HashMap<JobId, i32>,
    pub jobcore: Option<JobCore>,
    pub watchers: Vec<Watcher>,
    /// Rank 0: every rank's state, reason and since when (s since the epoch).
    pub members: BTreeMap<u32, (MemberState, String, f64)>,
    pub shutting_down: Option<Instant>,
    pub initial_started: bool,
    pub exit_code: i32,
    pub local_uri: String,
    pub initial_pgid: Option<i32>,
    pub pmi_barriers: HashMap<JobId, (Vec<Message>, serde_json::Map<String, Value>)>,
    /// Liveness of this broker's children (and, under rank u32::MAX, of its parent).
    pub membership: Membership,
    pub parent_sock: Option<std::os::fd::OwnedFd>,
    pub next_heartbeat: Instant,
    /// Children that said goodbye: their disconnect is "offline", not "lost".
    pub goodbye: std::collections::HashSet<u32>,
    /// Failure detectors (None if the overlay address is not IPv4).
    pub detect: Option<super::detect::Detectors>,
    /// The parent link's 4-tuple as registered with the TCP watcher.
    pub parent_tuple: Option<vigil_ebpf::TcpTuple>,
    /// Overlay RTT measurements in progress (`broker.rtt`), by id.
    pub rtt_runs: HashMap<u64, RttRun>,
    /// `tbon.transport` settings and the transport each overlay link uses.
    pub rdma: std::sync::Arc<rdma_link::Settings>,
    pub links: rdma_link::Links,
    /// The QP half of the parent link when it busy-polls ([`Core::poll_busy`]).
    pub parent_busy: Option<rdma_link::BusyRx>,
    /// Alternates which busy link [`Core::poll_busy`] polls first.
    pub busy_turn: bool,
}

/// Wall-clock time in seconds since the epoch (the job core's clock).
pub(crate) use crate::broker_now as now;

/// Membership key for the parent link.
const PARENT: u32 = u32::MAX;

/// How long a broker waits for its children to leave during shutdown.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Run a broker until the instance shuts down; returns the process exit code (rank 0: the initial program's).
pub async fn run(opts: BrokerOptions) -> i32 {
    let rank = opts.rank;
    match run_inner(opts).await {
        Ok(code) => code,
        Err(e) => {
            // Once, in the log's format, and even with log-level=off: this is why the broker is exiting.
            eprintln!("vigil-broker[{rank}]: error: {e}");
            1
        }
    }
}

async fn run_inner(opts: BrokerOptions) -> Result<i32, String> {
    let rank = opts.rank;
    // Discover the node with hwloc; degrade to the CPU count if hwloc is unavailable or disabled
    // (`resource.discovery=cpu-count`). The degradation is logged once and shown by `vigil uptime`.
    let forced = core_opts_discovery(&opts);
    let loaded = if forced {
        Err("disabled by resource.discovery=cpu-count".to_string())
    } else {
        NodeTopology::load(&opts.topology).map_err(|e| e.to_string())
    };
    let (resources, topology_str) = match loaded {
        Ok(t) => {
            let mut src = opts.topology.to_string();
            if t.is_live() {
                // Discovering a live machine costs shells ~20 ms of CPU each; hand them an XML snapshot instead.
                let path = opts.rundir.join(format!("topology-{rank}.xml"));
                match t.export_xml().map_err(|e| e.to_string()).and_then(|x| {
                    std::fs::create_dir_all(&opts.rundir)
                        .and_then(|_| std::fs::write(&path, x))
                        .map_err(|e| e.to_string())
                }) {
                    Ok(()) => src = format!("live-xml:{}", path.display()),
                    Err(e) => debug!("no topology snapshot for shells ({e}); they will discover the node themselves"),
                }
            }
            (t.resources(opts.declared_gpus), src)
        }
        Err(e) => {
            let n = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0))
                .map(|set| (0..nix::sched::CpuSet::count()).filter(|&i| set.is_set(i).unwrap_or(false)).count() as u32)
                .unwrap_or(1)
                .max(1);
            warn!("hwloc topology unavailable ({e}); falling back to {n} cores from the CPU count, tasks bound by CPU number");
            let r = NodeResources {
                cores: n,
                pus: n,
                numa: 1,
                packages: 1,
                gpus: opts.declared_gpus.unwrap_or(0),
                gpu_names: vec![],
                source: format!("cpu-count ({e})"),
            };
            (r, "cpu-count".to_string())
        }
    };
    info!(rank, cores = resources.cores, gpus = resources.gpus, source = %resources.source, "node discovered");

    let (input_tx, mut input_rx) = mpsc::unbounded_channel::<Input>();

    // Overlay listener.
    let listener = match &opts.listen {
        ListenSpec::Fd(fd) => {
            // SAFETY: `vigil start` bound this TCP listener and passed us its descriptor, which nothing else in
            // this process owns; we take ownership exactly once here.
            let std_l = unsafe { <std::net::TcpListener as std::os::fd::FromRawFd>::from_raw_fd(*fd) };
            std_l.set_nonblocking(true).map_err(|e| format!("listener fd {fd}: {e}"))?;
            tokio::net::TcpListener::from_std(std_l).map_err(|e| format!("listener fd {fd}: {e}"))?
        }
        ListenSpec::Endpoint(ep) => {
            let addr = ep.strip_prefix("tcp://").unwrap_or(ep);
            tokio::net::TcpListener::bind(addr).await.map_err(|e| format!("cannot bind overlay endpoint {ep}: {e}"))?
        }
    };
    // The overlay's own address (a wildcard listener uses the address peers know us by).
    let core_listen_ip = listener.local_addr().ok().map(|a| a.ip()).and_then(|ip| {
        if ip.is_unspecified() {
            opts.endpoints.get(opts.rank as usize).and_then(|ep| {
                let hp = ep.strip_prefix("tcp://").unwrap_or(ep);
                hp.parse::<std::net::SocketAddr>().ok().map(|a| a.ip())
            })
        } else {
            Some(ip)
        }
    });
    let tx2 = input_tx.clone();
    let auth = std::sync::Arc::new(secure::LinkAuth::new(opts.key.clone(), &opts.instance));
    let rdma = std::sync::Arc::new(rdma_link::Settings::new(&opts.config));
    let refusals = std::sync::Arc::new(std::sync::Mutex::new(secure::RefusalLog::default()));
    tokio::spawn(accept_children(listener, tx2, auth.clone(), rdma.clone(), refusals.clone()));

    // Local connector.
    std::fs::create_dir_all(&opts.rundir)
        .map_err(|e| format!("cannot create rundir {}: {e}", opts.rundir.display()))?;
    let sock = opts.rundir.join(format!("local-{rank}"));
    let _ = std::fs::remove_file(&sock);
    let ul = tokio::net::UnixListener::bind(&sock).map_err(|e| format!("cannot bind {}: {e}", sock.display()))?;
    {
        use std::os::unix::fs::PermissionsExt;
        // Access control is the SO_PEERCRED check, which gives a clear refusal; the file mode stays open.
        let _ = std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o777));
    }
    let uid = nix::unistd::getuid().as_raw();
    let local_uri = format!("local://{}", sock.display());
    tokio::spawn(local::accept_local(ul, input_tx.clone(), uid, rank, opts.size, opts.instance.clone()));

    // Signals.
    for (kind, num) in [
        (tokio::signal::unix::SignalKind::terminate(), libc::SIGTERM),
        (tokio::signal::unix::SignalKind::interrupt(), libc::SIGINT),
        (tokio::signal::unix::SignalKind::hangup(), libc::SIGHUP),
    ] {
        if let Ok(mut s) = tokio::signal::unix::signal(kind) {
            let tx = input_tx.clone();
            tokio::spawn(async move {
                while s.recv().await.is_some() {
                    let _ = tx.send(Input::Signal(num));
                }
            });
        }
    }

    let started_at = now();
    let mut core = Core {
        refusals,
        uid,
        start: Instant::now(),
        started_at,
        resources,
        input_tx: input_tx.clone(),
        parent: None,
        children: HashMap::new(),
        locals: HashMap::new(),
        event_seq: 0,
        internal: HashMap::new(),
        next_tag: 1,
        shells: HashMap::new(),
        jobcore: if rank == 0 { Some(JobCore::new(started_at)) } else { None },
        watchers: Vec::new(),
        members: BTreeMap::new(),
        shutting_down: None,
        initial_started: false,
        exit_code: 0,
        local_uri,
        initial_pgid: None,
        pmi_barriers: HashMap::new(),
        membership: Membership::new(opts.config.membership),
        parent_sock: None,
        next_heartbeat: Instant::now(),
        goodbye: std::collections::HashSet::new(),
        detect: None,
        parent_tuple: None,
        rtt_runs: HashMap::new(),
        rdma,
        links: rdma_link::Links::default(),
        parent_busy: None,
        busy_turn: false,
        opts,
    };
    // Failure detectors: a probe socket and responder on the overlay address, eBPF loaded in the background.
    {
        let ip = match core_listen_ip {
            Some(std::net::IpAddr::V4(ip)) => Some(ip),
            _ => None,
        };
        let owner = core.opts.config.detector_rank.is_none_or(|r| r == rank);
        match ip {
            Some(ip) => {
                let (dtx, mut drx) = mpsc::unbounded_channel();
                let itx = input_tx.clone();
                tokio::spawn(async move {
                    while let Some(d) = drx.recv().await {
                        if itx.send(Input::Detect(d, false)).is_err() {
                            return;
                        }
                    }
                });
                let mc = *core.membership.config();
                let ranks = (rank, core.opts.topo.parent(core.opts.size, rank));
                match super::detect::Detectors::start(
                    &core.opts.config,
                    &core.opts.instance,
                    ip,
                    owner,
                    ranks,
                    &mc,
                    dtx,
                ) {
                    Ok(d) => core.detect = Some(d),
                    Err(e) => warn!("failure detectors unavailable ({e}); membership relies on TCP alone"),
                }
            }
            None => warn!("overlay address is not IPv4: heartbeat probes and XDP disabled; membership relies on TCP"),
        }
    }
    if let Some(jc) = core.jobcore.as_mut() {
        jc.kill_timeout = core.opts.config.kill_timeout;
    }

    // Connect to the parent.
    if let Some(parent) = core.opts.topo.parent(core.opts.size, rank) {
        let ep = core
            .opts
            .endpoints
            .get(parent as usize)
            .cloned()
            .ok_or_else(|| format!("no endpoint for parent rank {parent}"))?;
        let probe_port = core.detect.as_ref().map(|d| d.probe_port);
        let transport = TcpTransport { auth };
        // Until the loop runs, SIGTERM and SIGINT are watched here: a broker still retrying its parent (which
        // may take tbon.connect_timeout) stops when told to.
        let stop = async {
            use tokio::signal::unix::{signal, SignalKind};
            match (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
                (Ok(mut t), Ok(mut i)) => tokio::select! {
                    _ = t.recv() => libc::SIGTERM,
                    _ = i.recv() => libc::SIGINT,
                },
                _ => std::future::pending().await,
            }
        };
        let (link, choice, busy) = tokio::select! {
            r = connect_parent(&core.opts, &transport, &core.rdma, probe_port, &ep) => r?,
            sig = stop => {
                warn!(rank, "signal {sig} while connecting to the parent at {ep}; exiting");
                return Ok(128 + sig);
            }
        };
        core.parent = Some(link.tx.clone());
        core.parent_busy = busy;
        // Tell rank 0 which transport our parent link uses (for `vigil overlay status` and `uptime`).
        core.route_request(Peer::Local(u32::MAX), rdma_link::report(rank, &choice));
        core.links.parent = Some(choice);
        core.parent_sock = link.sock;
        core.parent_tuple =
            core.parent_sock.as_ref().and_then(|s| core.detect.as_ref().and_then(|d| d.watch_link(PARENT, s)));
        let now_s = core.clock();
        core.membership.signal(now_s, PARENT, Signal::Connected);
        let tx = input_tx.clone();
        tokio::spawn(pump(link.rx, Peer::Parent, 0, tx));
        info!(rank, parent, "connected to parent at {ep}");
    }
    // The eBPF detectors load in the background now that we have joined the overlay.
    if let Some(d) = core.detect.as_mut() {
        d.begin_load();
    }
    // Register with rank 0 (locally on rank 0).
    let (cores, gpus): (IdSet, IdSet) = match &core.opts.resources_override {
        Some((c, g)) => (c.clone(), g.clone()),
        None => ((0..core.resources.cores).collect(), (0..core.resources.gpus).collect()),
    };
    let reg = json!({"rank": rank, "hostname": core.opts.hostname, "resources": core.resources,
        "cores": cores.to_string(), "gpus": gpus.to_string(),
        "topology": topology_str, "declared_gpus": core.opts.declared_gpus});
    let mut m = Message::request("resource.register", 0, &reg);
    m.flags = FLAG_NORESPONSE;
    core.route_request(Peer::Local(u32::MAX), m);

    // On a single-broker instance nothing else arrives: act on the registration right away.
    core.drain_actions();
    // One timer for the loop, moved only when the deadline changes: registering a new timer for every input
    // cost a timer-wheel insertion and removal per message.
    let timer = tokio::time::sleep(Duration::from_secs(86400));
    tokio::pin!(timer);
    let mut armed: Option<Instant> = None;
    loop {
        let deadline = core.next_deadline();
        if deadline != armed {
            if let Some(d) = deadline {
                timer.as_mut().reset(tokio::time::Instant::from_std(d));
            }
            armed = deadline;
        }
        // Busy-polling RDMA links are polled here, by this task, between its other inputs.
        let busy = core.rdma.cfg.busy_poll;
        let input = tokio::select! {
            i = input_rx.recv() => i,
            i = std::future::poll_fn(|cx| core.poll_busy(cx)), if busy => Some(i),
            _ = &mut timer, if armed.is_some() => None,
        };
        match input {
            Some(i) => core.handle(i),
            None => core.on_timer(),
        }
        core.drain_actions();
        if core.finished() {
            break;
        }
    }
    core.cleanup();
    info!(rank, code = core.exit_code, "broker exiting");
    Ok(core.exit_code)
}

fn core_opts_discovery(opts: &BrokerOptions) -> bool {
    opts.config.discovery == crate::attrs::Discovery::CpuCount
}

/// Forward a link's events into the core as inputs tagged with the peer.
pub(crate) async fn pump(mut rx: LinkRx, peer: Peer, conn: u64, tx: mpsc::UnboundedSender<Input>) {
    while let Some(ev) = rx.recv().await {
        let i = match ev {
            LinkEvent::Message(m) => Input::Peer(peer, conn, m),
            LinkEvent::Closed(why) => {
                let _ = tx.send(Input::PeerClosed(peer, conn, why));
                return;
            }
        };
        if tx.send(i).is_err() {
            return;
        }
    }
    let _ = tx.send(Input::PeerClosed(peer, conn, "link dropped".into()));
}

/// Accept child connections: each runs the responder's handshake ([`secure::respond`]) under the bounds stated
/// in `secure` (pending connections, message sizes, time), then must send a `hello` as its first message.
async fn accept_children(
    l: tokio::net::TcpListener,
    tx: mpsc::UnboundedSender<Input>,
    auth: std::sync::Arc<secure::LinkAuth>,
    rdma: std::sync::Arc<rdma_link::Settings>,
    refusals: std::sync::Arc<std::sync::Mutex<secure::RefusalLog>>,
) {
    let slots = std::sync::Arc::new(secure::HandshakeSlots::default());
    // One place decides what to log about refused peers (see `secure::RefusalLog`).
    let note = {
        let refusals = refusals.clone();
        move |addr: std::net::SocketAddr, why: &dyn std::fmt::Display| {
            let (warn, unlogged) =
                refusals.lock().map(|mut r| r.refused(addr.ip(), Instant::now())).unwrap_or((false, None));
            if let Some(n) = unlogged {
                warn!("overlay listener: {n} more refused connection(s) in the last minute were not logged (vigil uptime counts them all)");
            }
            if warn {
                warn!("overlay peer {addr}: {why}");
            } else {
                debug!("overlay peer {addr}: {why}");
            }
        }
    };
    let note = std::sync::Arc::new(note);
    let mut conn: u64 = 0;
    loop {
        let (s, addr) = match l.accept().await {
            Ok(x) => x,
            Err(e) => {
                warn!("overlay accept: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let id = match slots.admit(addr.ip()) {
            secure::Admission::Admitted(id) => id,
            secure::Admission::Evicted(id) => {
                note(
                    addr,
                    &format_args!(
                        "{} connections already wait for their handshake: the oldest was closed to admit this one",
                        secure::MAX_PENDING_HANDSHAKES
                    ),
                );
                id
            }
            secure::Admission::AddressFull => {
                note(
                    addr,
                    &format_args!(
                        "closed: {} connections from this address already wait for their handshake",
                        secure::MAX_PENDING_PER_ADDRESS
                    ),
                );
                continue;
            }
        };
        tune_tcp(&s, TCP_USER_TIMEOUT_MS);
        let (mut s, dup) = super::transport::raise_socket(s);
        conn += 1;
        let c = conn;
        let tx = tx.clone();
        let rdma = rdma.clone();
        let auth = auth.clone();
        let note = note.clone();
        let slot_guard = SlotGuard(slots.clone(), id);
        let task = tokio::spawn(async move {
            let session = match secure::respond(&mut s, &auth).await {
                Ok(x) => x,
                Err(e) => {
                    note(addr, &format_args!("refused: {e}"));
                    return;
                }
            };
            drop(slot_guard);
            let mut link = super::transport::secure_link(s, session, addr.to_string(), dup);
            // The first message must be a hello; the handshake's record already holds it.
            let first = tokio::time::timeout(secure::HANDSHAKE_TIMEOUT, link.rx.recv()).await;
            match first {
                Ok(Some(LinkEvent::Message(m))) if m.msgtype == MsgType::Control && m.topic == "hello" => {
                    // Answer the child's RDMA offer here, off the core (opening a device takes milliseconds).
                    let local = link.sock.as_ref().and_then(rdma_link::local_ip);
                    let rdma = Box::new(rdma_link::Answer::new(&rdma, local, &m.json()));
                    let _ = tx.send(Input::ChildHello {
                        conn: c,
                        msg: m,
                        link_tx: link.tx,
                        peer: link.peer,
                        rx: link.rx,
                        sock: link.sock,
                        tasks: link.tasks,
                        rdma,
                    });
                }
                Ok(Some(LinkEvent::Message(m))) => {
                    warn!("overlay peer {addr}: expected hello, got {:?} '{}'; disconnecting", m.msgtype, m.topic);
                }
                Ok(Some(LinkEvent::Closed(why))) => warn!("overlay peer {addr} disconnected before hello: {why}"),
                Ok(None) => {}
                Err(_) => warn!(
                    "overlay peer {addr}: no hello within {}s; disconnecting",
                    secure::HANDSHAKE_TIMEOUT.as_secs()
                ),
            }
        });
        slots.attach(id, task.abort_handle());
    }
}

/// Frees a connection's handshake slot however its task ends (done, failed, or aborted to make room).
struct SlotGuard(std::sync::Arc<secure::HandshakeSlots>, u64);

impl Drop for SlotGuard {
    fn drop(&mut self) {
        self.0.release(self.1);
    }
}

async fn connect_parent(
    opts: &BrokerOptions,
    transport: &TcpTransport,
    rdma: &rdma_link::Settings,
    probe_port: Option<u16>,
    ep: &str,
) -> Result<(Link, rdma_link::LinkChoice, Option<rdma_link::BusyRx>), String> {
    let deadline = Instant::now() + Duration::from_secs_f64(opts.connect_timeout.clamp(0.0, 1e7));
    let mut delay = Duration::from_millis(5);
    let mut last_error = String::from("no answer");
    let mut warned = false;
    loop {
        match transport.connect(ep.to_string()).await {
            Ok(mut link) => {
                // Offer RDMA when a verbs device serves our end of this connection (see rdma_link).
                let offer = rdma_link::Offer::new(rdma, link.sock.as_ref().and_then(rdma_link::local_ip))?;
                let hello = Message::control(
                    "hello",
                    &rdma_link::merge(
                        json!({"rank": opts.rank, "instance": opts.instance, "version": crate::message::WIRE_VERSION, "hostname": opts.hostname,
                            "probe_port": probe_port}),
                        offer.hello_fields(),
                    ),
                );
                let _ = link.tx.send(hello);
                match tokio::time::timeout(Duration::from_secs(10), link.rx.recv()).await {
                    Ok(Some(LinkEvent::Message(m))) if m.topic == "hello-ack" => {
                        let (conn, choice) = offer.finish(rdma, &m.json())?;
                        log_choice("parent", &choice);
                        let mut busy = None;
                        if let Some((conn, framing)) = conn {
                            let (tx, rx, b) = rdma_link::bridge(link.tx, link.rx, conn, framing);
                            link.tx = tx;
                            link.rx = rx;
                            busy = b;
                        }
                        return Ok((link, choice, busy));
                    }
                    Ok(Some(LinkEvent::Message(m))) if m.topic == "refused" => {
                        return Err(format!("parent at {ep} refused us: {}", m.errstr().unwrap_or_default()))
                    }
                    other => warn!(
                        "parent at {ep}: bad handshake ({:?}); retrying",
                        other.map(|o| o.map(|e| format!("{e:?}")))
                    ),
                }
            }
            Err(e) => {
                debug!("connect {ep}: {e}");
                last_error = match e.kind() {
                    // The parent closes a connection whose handshake fails: the keys (or instance ids) differ, or
                    // its listener is flooded. Its own log says which.
                    std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::PermissionDenied => {
                        let why = format!(
                            "the parent closed our authentication handshake ({e}): it holds another overlay key or \
                             instance id, or its listener is flooded with connections (its log says which)"
                        );
                        if !warned {
                            warn!(
                                "parent at {ep}: {why}; retrying for up to {}s (tbon.connect_timeout)",
                                opts.connect_timeout
                            );
                            warned = true;
                        }
                        why
                    }
                    _ => e.to_string(),
                };
            }
        }
        if Instant::now() >= deadline {
            return Err(format!("could not connect to parent at {ep} within {}s: {last_error}", opts.connect_timeout));
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_millis(200));
    }
}

/// Log once which transport an overlay link uses (and why not RDMA).
fn log_choice(peer: &str, c: &rdma_link::LinkChoice) {
    if c.transport == "rdma" {
        info!("overlay link to {peer}: rdma on {}", c.detail);
    } else {
        info!("overlay link to {peer}: tcp ({})", c.detail);
    }
}

impl Core {
    pub(crate) fn rank(&self) -> u32 {
        self.opts.rank
    }

    /// Poll every busy-polling RDMA link's completion queue once (parent and children, alternating which
    /// comes first): the first event found, as an input. A link whose QP path ends is dropped here after its
    /// `Closed`. With nothing found, the task wakes itself to poll again after the runtime's other ready tasks
    /// (no system call per pass: see `vigil_rdma`'s busy receiver); without any busy link it just waits for
    /// the loop's other inputs.
    fn poll_busy(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Input> {
        use std::task::Poll;
        self.busy_turn = !self.busy_turn;
        let mut any = false;
        for pass in 0..2 {
            if (pass == 0) == self.busy_turn {
                if let Some(b) = self.parent_busy.as_mut() {
                    any = true;
                    if let Some(ev) = b.poll() {
                        return Poll::Ready(match ev {
                            LinkEvent::Message(m) => Input::Peer(Peer::Parent, 0, m),
                            LinkEvent::Closed(why) => {
                                self.parent_busy = None;
                                Input::PeerClosed(Peer::Parent, 0, why)
                            }
                        });
                    }
                }
            } else {
                for (&r, c) in self.children.iter_mut() {
                    let Some(b) = c.busy.as_mut() else { continue };
                    any = true;
                    if let Some(ev) = b.poll() {
                        return Poll::Ready(match ev {
                            LinkEvent::Message(m) => Input::Peer(Peer::Child(r), c.conn, m),
                            LinkEvent::Closed(why) => {
                                c.busy = None;
                                Input::PeerClosed(Peer::Child(r), c.conn, why)
                            }
                        });
                    }
                }
            }
        }
        if any {
            cx.waker().wake_by_ref();
        }
        Poll::Pending
    }

    fn next_deadline(&self) -> Option<Instant> {
        let mut t: Option<Instant> = None;
        if let Some(jc) = &self.jobcore {
            if let Some(d) = jc.next_deadline() {
                // Clamp: a time limit of centuries must not overflow the clock.
                let dt = (d - now()).clamp(0.0, 86400.0 * 365.0);
                t = Some(Instant::now() + Duration::from_secs_f64(dt));
            }
        }
        if let Some(s) = self.shutting_down {
            let d = s + SHUTDOWN_GRACE;
            t = Some(t.map_or(d, |x| x.min(d)));
        }
        if self.shutting_down.is_none() && (self.parent.is_some() || !self.children.is_empty()) {
            let d = self.next_heartbeat;
            t = Some(t.map_or(d, |x| x.min(d)));
        }
        if let Some(d) = self.membership.next_deadline() {
            let d = self.start + Duration::from_secs_f64(d.max(0.0));
            t = Some(t.map_or(d, |x| x.min(d)));
        }
        t
    }

    /// Seconds since this broker started (the membership machine's clock).
    pub(crate) fn clock(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    /// Send heartbeats to every peer and sample each link's kernel ACK state.
    fn heartbeat(&mut self) {
        if let Some(d) = self.detect.as_mut() {
            d.beat();
        }
        let now = self.clock();
        let hb = Message::control("hb", &json!({}));
        let mut signals = Vec::new();
        // Sample before sending: what is outstanding then was sent at least a moment ago, not just now.
        if let Some(p) = &self.parent {
            if let Some((unacked, age_ms)) = self.parent_sock.as_ref().and_then(tcp_ack_state) {
                signals.push((PARENT, Signal::KernelAck { unacked, last_ack_age: age_ms as f64 / 1e3 }));
            }
            let _ = p.send(hb.clone());
        }
        for (r, c) in &self.children {
            if let Some((unacked, age_ms)) = c.sock.as_ref().and_then(tcp_ack_state) {
                signals.push((*r, Signal::KernelAck { unacked, last_ack_age: age_ms as f64 / 1e3 }));
            }
            let _ = c.tx.send(hb.clone());
        }
        for (r, s) in signals {
            let t = self.membership.signal(now, r, s);
            self.apply_transitions(t);
        }
        let period = Duration::from_secs_f64(self.membership.config().heartbeat_period);
        self.next_heartbeat = Instant::now() + period;
    }

    /// Act on liveness verdicts: lost children (and their subtrees) are reported to rank 0 and dropped; torpid
    /// and lively ones are reported so rank 0 stops (or resumes) placing work there; a lost parent ends us.
    pub(crate) fn apply_transitions(&mut self, ts: Vec<Transition>) {
        for t in ts {
            if t.rank == PARENT {
                match t.to {
                    PeerState::Lost if self.shutting_down.is_none() => {
                        error!("lost parent: {}; exiting", t.reason);
                        self.exit_code = 1;
                        self.parent = None;
                        self.parent_busy = None;
                        self.begin_shutdown("lost parent");
                    }
                    PeerState::Torpid => info!("parent is torpid: {}", t.reason),
                    PeerState::Online if t.from == PeerState::Torpid => info!("parent is lively again"),
                    _ => {}
                }
                continue;
            }
            let r = t.rank;
            match t.to {
                PeerState::Lost => {
                    self.forget_child_detectors(r);
                    if let Some(c) = self.children.remove(&r) {
                        self.child_lost(r, &t.reason);
                        drop(c);
                    }
                    self.membership.remove(r);
                }
                PeerState::Torpid | PeerState::Online if self.shutting_down.is_none() => {
                    let (topic, what) = if t.to == PeerState::Torpid {
                        ("overlay.torpid", "torpid")
                    } else {
                        ("overlay.lively", "lively")
                    };
                    if t.to == PeerState::Online && t.from != PeerState::Torpid {
                        continue;
                    }
                    info!("child rank {r} is {what}: {}", t.reason);
                    let mut m = Message::request(topic, 0, &json!({"ranks": r.to_string(), "reason": t.reason}));
                    m.flags = FLAG_NORESPONSE;
                    self.route_request(Peer::Local(u32::MAX), m);
                }
                _ => {}
            }
        }
    }

    fn child_lost(&mut self, r: u32, why: &str) {
        let subtree: IdSet = self.opts.topo.subtree(self.opts.size, r).into_iter().collect();
        warn!("lost child rank {r} ({why}); subtree {subtree} is lost");
        let mut m =
            Message::request("overlay.lost", 0, &json!({"ranks": subtree.to_string(), "reason": why, "root": r}));
        m.flags = FLAG_NORESPONSE;
        self.route_request(Peer::Local(u32::MAX), m);
    }

    fn on_timer(&mut self) {
        let n = now();
        if let Some(jc) = self.jobcore.as_mut() {
            jc.handle_timeout(n);
        }
        // Running this late means we were stopped or starved: our peers' traffic is queued, unread. Restart the
        // silence clocks rather than declare everyone torpid (or lost) for our own stall.
        let late = Instant::now().saturating_duration_since(self.next_heartbeat).as_secs_f64();
        if late > self.membership.config().torpid_max {
            info!("this broker ran {:.0} ms late (stopped or starved); not judging peers on that gap", late * 1e3);
            self.membership.grace(self.clock());
        }
        if self.shutting_down.is_none() && Instant::now() >= self.next_heartbeat {
            self.heartbeat();
        }
        let t = self.membership.tick(self.clock());
        self.apply_transitions(t);
    }

    fn finished(&self) -> bool {
        match self.shutting_down {
            Some(s) => self.children.is_empty() || s.elapsed() >= SHUTDOWN_GRACE,
            None => false,
        }
    }

    fn cleanup(&mut self) {
        if let Some(d) = self.detect.as_mut() {
            d.shutdown();
        }
        if let Some(pg) = self.initial_pgid.take() {
            // Whatever the initial program left behind (background jobs) ends with the instance; an empty group
            // (the usual case: the program exited and left nothing) costs no grace period.
            let pg = nix::unistd::Pid::from_raw(pg);
            if nix::sys::signal::killpg(pg, nix::sys::signal::Signal::SIGTERM).is_ok() {
                std::thread::sleep(Duration::from_millis(50));
                let _ = nix::sys::signal::killpg(pg, nix::sys::signal::Signal::SIGKILL);
            }
        }
        for (_, pgid) in self.shells.drain() {
            let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pgid), nix::sys::signal::Signal::SIGKILL);
        }
        let _ = std::fs::remove_file(self.opts.rundir.join(format!("local-{}", self.rank())));
        let _ = std::fs::remove_file(self.opts.rundir.join(format!("topology-{}.xml", self.rank())));
        // Job directories of shells that were killed with the instance.
        if let Ok(rd) = std::fs::read_dir(&self.opts.rundir) {
            for e in rd.flatten() {
                let n = e.file_name();
                let n = n.to_string_lossy();
                if n.starts_with('j') && n.contains('.') && e.path().is_dir() {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
    }

    pub(crate) fn begin_shutdown(&mut self, why: &str) {
        if self.shutting_down.is_some() {
            return;
        }
        info!(rank = self.rank(), "shutting down: {why}");
        self.shutting_down = Some(Instant::now());
        if let Some(p) = &self.parent {
            let _ = p.send(Message::control("goodbye", &json!({"reason": why})));
        }
        for c in self.children.values() {
            let _ = c.tx.send(Message::control("shutdown", &json!({"reason": why})));
        }
        for (_, pgid) in self.shells.iter() {
            let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(*pgid), nix::sys::signal::Signal::SIGKILL);
        }
    }

    fn handle(&mut self, input: Input) {
        match input {
            Input::Peer(peer, conn, msg) => {
                match peer {
                    Peer::Child(r) => {
                        if self.children.get(&r).map(|c| c.conn) != Some(conn) {
                            return; // stale link
                        }
                        let t = self.membership.signal(self.clock(), r, Signal::Traffic);
                        self.apply_transitions(t);
                    }
                    Peer::Parent => {
                        let t = self.membership.signal(self.clock(), PARENT, Signal::Traffic);
                        self.apply_transitions(t);
                    }
                    Peer::Local(_) => {}
                }
                self.on_message(peer, msg);
            }
            Input::PeerClosed(peer, conn, why) => self.on_closed(peer, conn, &why),
            Input::ChildHello { conn, msg, link_tx, peer, rx, sock, tasks, rdma } => {
                self.on_hello(conn, msg, link_tx, peer, rx, sock, tasks, *rdma)
            }
            Input::LocalNew { id, uid, tx } => {
                self.locals.insert(id, LocalClient { tx, uid, subs: Vec::new(), streaming: false });
            }
            Input::ShellDone { id, report, status } => {
                self.shells.remove(&id);
                let exit = ShellExit { id: id.0, rank: self.rank(), report, shell_status: status };
                let mut m = Message::request(crate::shellproto::TOPIC_SHELL_EXIT, 0, &exit);
                m.flags = FLAG_NORESPONSE;
                self.route_request(Peer::Local(u32::MAX), m);
            }
            Input::Detect(d, requeued) => self.on_detect(d, requeued),
            Input::InitialStarted(pgid) => {
                self.initial_pgid = Some(pgid);
                // For `vigil start`, which outlives a killed rank 0 and then ends what it started.
                let _ = std::fs::write(self.opts.rundir.join("initial.pgid"), pgid.to_string());
            }
            Input::InitialExit(code) => {
                info!("initial program exited with code {code}");
                self.exit_code = code;
                self.begin_shutdown("initial program exited");
            }
            Input::Signal(sig) => {
                if sig == libc::SIGTERM || (self.rank() == 0 && self.opts.initial_program.is_none()) {
                    if self.exit_code == 0 {
                        self.exit_code = 128 + sig;
                    }
                    if let Some(pg) = self.initial_pgid {
                        let _ =
                            nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pg), nix::sys::signal::Signal::SIGTERM);
                    }
                    self.begin_shutdown(&format!("signal {sig}"));
                } else {
                    debug!("ignoring signal {sig}; the initial program handles it");
                }
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn on_hello(
        &mut self,
        conn: u64,
        msg: Message,
        tx: LinkTx,
        peer: String,
        rx: LinkRx,
        sock: Option<std::os::fd::OwnedFd>,
        tasks: Vec<tokio::task::AbortHandle>,
        rdma: rdma_link::Answer,
    ) {
        let v = msg.json();
        let rank = v.get("rank").and_then(Value::as_u64).map(|r| r as u32);
        let inst = v.get("instance").and_then(Value::as_str).unwrap_or("");
        let refuse = |why: String| {
            warn!("refusing overlay peer {peer}: {why}");
            let _ = tx.send(Message::control("refused", &json!({"errstr": why})));
        };
        let Some(rank) = rank else { return refuse("hello without a rank".into()) };
        if inst != self.opts.instance {
            // Unreachable with the handshake's prologue, which binds the instance id; never echo ids.
            return refuse(format!("rank {rank} belongs to another instance"));
        }
        if self.opts.topo.parent(self.opts.size, rank) != Some(self.rank()) {
            return refuse(format!("rank {rank} is not a child of rank {}", self.rank()));
        }
        if self.shutting_down.is_some() {
            return refuse("broker is shutting down".into());
        }
        if self.children.contains_key(&rank) {
            return refuse(format!("rank {rank} is already connected"));
        }
        if let rdma_link::Answer::Refuse(why) = &rdma {
            return refuse(why.clone());
        }
        let ack = rdma_link::merge(json!({"rank": self.rank()}), rdma.ack_fields());
        let _ = tx.send(Message::control("hello-ack", &ack));
        let (tx, rx, busy) = match rdma {
            rdma_link::Answer::Rdma(c, framing, choice) => {
                log_choice(&format!("child rank {rank}"), &choice);
                rdma_link::bridge(tx, rx, *c, framing)
            }
            rdma_link::Answer::Tcp(choice) => {
                log_choice(&format!("child rank {rank}"), &choice);
                (tx, rx, None)
            }
            rdma_link::Answer::Refuse(_) => return,
        };
        let tuple = sock.as_ref().and_then(|s| self.detect.as_ref().and_then(|d| d.watch_link(rank, s)));
        if let (Some(d), Some(port)) =
            (self.detect.as_mut(), v.get("probe_port").and_then(Value::as_u64).and_then(|p| u16::try_from(p).ok()))
        {
            if let Ok(addr) = peer.parse::<std::net::SocketAddr>() {
                d.probe_child(rank, std::net::SocketAddr::new(addr.ip(), port));
            }
        }
        self.children.insert(rank, ChildLink { tx, busy, conn, sock, tasks, tuple });
        self.membership.signal(self.clock(), rank, Signal::Connected);
        tokio::spawn(pump(rx, Peer::Child(rank), conn, self.input_tx.clone()));
        debug!("child rank {rank} connected from {peer}");
    }

    pub(crate) fn on_closed(&mut self, peer: Peer, conn: u64, why: &str) {
        match peer {
            Peer::Parent => {
                if self.shutting_down.is_none() {
                    error!("lost connection to parent: {why}; exiting");
                    self.exit_code = 1;
                    self.begin_shutdown("lost parent");
                }
                self.parent = None;
                self.parent_busy = None;
                // No parent: nothing more to wait for beyond our own children.
            }
            Peer::Child(r) => {
                if self.children.get(&r).map(|c| c.conn) != Some(conn) {
                    return;
                }
                if self.shutting_down.is_some() || self.goodbye.remove(&r) {
                    self.forget_child_detectors(r);
                    self.children.remove(&r);
                    self.membership.remove(r);
                    debug!("child rank {r} left");
                    if self.shutting_down.is_none() {
                        let subtree: IdSet = self.opts.topo.subtree(self.opts.size, r).into_iter().collect();
                        let mut m = Message::request(
                            "overlay.offline",
                            0,
                            &json!({"ranks": subtree.to_string(), "reason": "left"}),
                        );
                        m.flags = FLAG_NORESPONSE;
                        self.route_request(Peer::Local(u32::MAX), m);
                    }
                    return;
                }
                let t = self.membership.signal(self.clock(), r, Signal::Closed(why.to_string()));
                self.apply_transitions(t);
                self.forget_child_detectors(r);
                if self.children.remove(&r).is_some() {
                    // Membership already had it as lost or unknown: still report the loss once.
                    self.child_lost(r, why);
                    self.membership.remove(r);
                }
            }
            Peer::Local(id) => {
                if let Some(c) = self.locals.remove(&id) {
                    if c.streaming {
                        // Let rank 0 drop watchers this client left behind.
                        let mut m = Message::request("job-info.disconnect", 0, &json!({}));
                        m.flags = FLAG_NORESPONSE;
                        self.route_request(Peer::Local(id), m);
                    }
                }
            }
        }
    }

    fn on_message(&mut self, from: Peer, mut msg: Message) {
        if let Peer::Local(_) = from {
            // Clients only send requests, and never choose their own route: a forged route stack could
            // otherwise steer responses to other peers.
            if msg.msgtype != MsgType::Request {
                debug!("dropping {:?} '{}' from local client", msg.msgtype, msg.topic);
                return;
            }
            msg.route.clear();
        }
        match msg.msgtype {
            MsgType::Request => self.route_request(from, msg),
            MsgType::Response => self.route_response(msg),
            MsgType::Event => {
                if from == Peer::Parent {
                    self.deliver_event(msg);
                } else {
                    warn!("dropping event '{}' from {from:?}: events flow down from rank 0 only", msg.topic);
                }
            }
            MsgType::Control => match (from, msg.topic.as_str()) {
                (Peer::Parent, "shutdown") => self.begin_shutdown("parent is shutting down"),
                (_, "hb") => {}
                (Peer::Child(r), "goodbye") => {
                    self.goodbye.insert(r);
                    // It is leaving: its responder stops answering before its connection closes.
                    self.forget_child_detectors(r);
                }
                (_, t) => debug!("ignoring control '{t}' from {from:?}"),
            },
        }
    }

    pub(crate) fn send_to(&self, peer: Peer, msg: Message) -> bool {
        self.try_send(peer, msg).is_ok()
    }

    /// Send `msg` to `peer`; gives it back when that peer is not connected or its link has closed.
    pub(crate) fn try_send(&self, peer: Peer, msg: Message) -> Result<(), Message> {
        let tx = match peer {
            Peer::Parent => self.parent.as_ref(),
            Peer::Child(r) => self.children.get(&r).map(|c| &c.tx),
            Peer::Local(id) => self.locals.get(&id).map(|c| &c.tx),
        };
        match tx {
            Some(t) => t.send(msg),
            None => Err(msg),
        }
    }

    /// Route a request: stamp the route, deliver locally or forward towards `nodeid`.
    pub(crate) fn route_request(&mut self, from: Peer, mut msg: Message) {
        match from {
            Peer::Local(id) => {
                if id != u32::MAX {
                    msg.userid = self.locals.get(&id).map(|c| c.uid).unwrap_or(u32::MAX);
                    msg.route.push(ROUTE_LOCAL | id);
                } else {
                    msg.userid = self.uid;
                }
                if msg.nodeid == NODEID_UPSTREAM {
                    match self.opts.topo.parent(self.opts.size, self.rank()) {
                        Some(p) => msg.nodeid = p,
                        None => return self.respond_error(&msg, errno::EHOSTUNREACH, "rank 0 has no upstream"),
                    }
                }
            }
            Peer::Child(r) => msg.route.push(r),
            Peer::Parent => msg.route.push(self.opts.topo.parent(self.opts.size, self.rank()).unwrap_or(0)),
        }
        // The userid was set by the broker whose local connector checked the caller (SO_PEERCRED), which admits
        // only the owner: in this single-owner instance, a request from a peer carrying any other userid did not
        // come from a checked caller.
        if !matches!(from, Peer::Local(_)) && msg.userid != self.uid {
            warn!("refusing '{}' from {from:?}: userid {} is not the instance owner's", msg.topic, msg.userid);
            return self.respond_error(
                &msg,
                errno::EPERM,
                &format!("userid {} may not use this instance: it has a single owner", msg.userid),
            );
        }
        if msg.route.len() > crate::message::MAX_ROUTE {
            return self.respond_error(&msg, errno::EPROTO, "route too deep");
        }
        let local = super::services::offers(self.rank(), msg.topic.split('.').next().unwrap_or(""));
        let hop = if msg.nodeid == NODEID_ANY {
            if local {
                Hop::Local
            } else {
                Hop::Parent
            }
        } else if msg.nodeid >= self.opts.size {
            return self.respond_error(
                &msg,
                errno::EHOSTUNREACH,
                &format!("no such rank {} (size {})", msg.nodeid, self.opts.size),
            );
        } else {
            self.opts.topo.next_hop(self.opts.size, self.rank(), msg.nodeid)
        };
        match hop {
            Hop::Local => super::services::dispatch(self, msg),
            Hop::Child(c) => {
                // A closed link gives the message back for the error response: no copy is kept meanwhile.
                if let Err(msg) = self.try_send(Peer::Child(c), msg) {
                    self.respond_error(
                        &msg,
                        errno::EHOSTUNREACH,
                        &if msg.nodeid == c {
                            format!("rank {c} is not connected")
                        } else {
                            format!(
                                "rank {} is unreachable: its route goes through rank {c}, which is not connected",
                                msg.nodeid
                            )
                        },
                    );
                }
            }
            Hop::Parent => {
                if self.parent.is_none() {
                    let e = if msg.nodeid == NODEID_ANY { errno::ENOSYS } else { errno::EHOSTUNREACH };
                    let why = if e == errno::ENOSYS {
                        format!("no service offers '{}'", msg.topic)
                    } else {
                        "parent not connected".into()
                    };
                    return self.respond_error(&msg, e, &why);
                }
                self.send_to(Peer::Parent, msg);
            }
        }
    }

    /// Route a response back along its route stack.
    pub(crate) fn route_response(&mut self, mut msg: Message) {
        match msg.route.pop() {
            None => self.internal_response(msg),
            Some(e) if e & ROUTE_LOCAL != 0 => {
                let id = e & !ROUTE_LOCAL;
                self.send_to(Peer::Local(id), msg);
            }
            Some(r) => {
                let peer = if Some(r) == self.opts.topo.parent(self.opts.size, self.rank()) {
                    Peer::Parent
                } else {
                    Peer::Child(r)
                };
                if !self.send_to(peer, msg) {
                    debug!("dropping response: {peer:?} gone");
                }
            }
        }
    }

    pub(crate) fn respond(&mut self, req: &Message, payload: &impl serde::Serialize) {
        if req.flags & FLAG_NORESPONSE != 0 {
            return;
        }
        let r = Message::response_to(req, payload);
        self.route_response(r);
    }

    /// Answer `req` with `payload` (JSON bytes), moving the request into its response.
    pub(crate) fn respond_with(&mut self, req: Message, payload: Vec<u8>) {
        if req.flags & FLAG_NORESPONSE != 0 {
            return;
        }
        let r = req.into_response(payload);
        self.route_response(r);
    }

    pub(crate) fn respond_error(&mut self, req: &Message, errnum: u32, errstr: &str) {
        if req.flags & FLAG_NORESPONSE != 0 {
            if errnum != errno::ENODATA {
                debug!("request '{}' failed: {errstr}", req.topic);
            }
            return;
        }
        let r = Message::error_to(req, errnum, errstr);
        self.route_response(r);
    }

    /// Send a request from the core itself; its response comes back to [`Core::internal_response`].
    pub(crate) fn internal_request(&mut self, topic: &str, nodeid: u32, payload: &Value, purpose: Internal) {
        self.internal_request_msg(Message::request(topic, nodeid, payload), purpose)
    }

    /// [`Core::internal_request`] with a message built by the caller.
    fn internal_request_msg(&mut self, mut m: Message, purpose: Internal) {
        let tag = self.next_tag;
        self.next_tag = self.next_tag.wrapping_add(1).max(1);
        m.matchtag = tag;
        self.internal.insert(tag, purpose);
        self.route_request(Peer::Local(u32::MAX), m);
    }

    fn internal_response(&mut self, msg: Message) {
        let Some(purpose) = self.internal.remove(&msg.matchtag) else { return };
        match purpose {
            Internal::Spawn { id, rank } => {
                let r = if msg.errnum == 0 {
                    Ok(())
                } else {
                    Err(msg.errstr().unwrap_or_else(|| crate::client::errno_str(msg.errnum).into()))
                };
                if let Some(jc) = self.jobcore.as_mut() {
                    jc.shell_spawned(now(), id, rank, r);
                }
            }
            Internal::Ignore => {}
            Internal::Rtt { run, sent } => {
                let Some(r) = self.rtt_runs.get_mut(&run) else { return };
                r.inflight -= 1;
                if msg.errnum != 0 {
                    let e = msg.errstr().unwrap_or_else(|| crate::client::errno_str(msg.errnum).into());
                    if let Some(r) = self.rtt_runs.remove(&run) {
                        self.respond_error(&r.req, msg.errnum, &e);
                    }
                    return;
                }
                r.samples_us.push(sent.elapsed().as_secs_f64() * 1e6);
                self.rtt_next(run);
            }
        }
    }

    /// Fill RTT run `id`'s window, or answer the client with the samples (µs) and the elapsed time (s) when done.
    pub(crate) fn rtt_next(&mut self, id: u64) {
        loop {
            let Some(r) = self.rtt_runs.get_mut(&id) else { return };
            if r.left == 0 {
                if r.inflight == 0 {
                    let r = self.rtt_runs.remove(&id).expect("present");
                    let elapsed = r.started.elapsed().as_secs_f64();
                    self.respond(
                        &r.req,
                        &json!({"target": r.target, "samples_us": r.samples_us, "elapsed_s": elapsed}),
                    );
                }
                return;
            }
            if r.inflight >= r.window {
                return;
            }
            r.left -= 1;
            r.inflight += 1;
            let m = Message::request_json("broker.ping", r.target, r.payload.clone());
            self.internal_request_msg(m, Internal::Rtt { run: id, sent: Instant::now() });
        }
    }

    /// Publish an event (rank 0 only): sequence it and send it down the tree.
    pub(crate) fn publish(&mut self, topic: &str, payload: &Value) {
        if self.rank() != 0 {
            let mut m = Message::request("broker.pub", 0, &json!({"topic": topic, "payload": payload}));
            m.flags = FLAG_NORESPONSE;
            return self.route_request(Peer::Local(u32::MAX), m);
        }
        self.event_seq += 1;
        let mut m = Message::event(topic, payload);
        m.seq = self.event_seq;
        self.deliver_event(m);
    }

    fn deliver_event(&mut self, msg: Message) {
        for c in self.children.values() {
            let _ = c.tx.send(msg.clone());
        }
        for c in self.locals.values() {
            if c.subs.iter().any(|s| msg.topic.starts_with(s.as_str())) {
                let _ = c.tx.send(msg.clone());
            }
        }
    }

    /// Carry out what the job core asked for, and wake watchers.
    pub(crate) fn drain_actions(&mut self) {
        while let Some(a) = self.jobcore.as_mut().and_then(|j| j.poll_action()) {
            match a {
                Action::SpawnShell { id, rank, input } => {
                    let payload = json!({"id": id.0, "input": *input});
                    self.internal_request("rexec.spawn", rank, &payload, Internal::Spawn { id, rank });
                }
                Action::SignalShells { id, ranks, signal } => {
                    for r in ranks {
                        let mut m = Message::request("rexec.kill", r, &json!({"id": id.0, "signal": signal}));
                        m.flags = FLAG_NORESPONSE;
                        self.route_request(Peer::Local(u32::MAX), m);
                    }
                }
                Action::Updated(id) => super::services::wake_watchers(self, id),
                Action::NotifyShell { id, rank, lost_shells, note } => {
                    let mut m = Message::request(
                        "rexec.notify",
                        rank,
                        &json!({"id": id.0, "lost_shells": lost_shells, "note": note}),
                    );
                    m.flags = FLAG_NORESPONSE;
                    self.route_request(Peer::Local(u32::MAX), m);
                }
            }
        }
        self.maybe_start_initial();
    }

    fn maybe_start_initial(&mut self) {
        if self.initial_started || self.rank() != 0 || self.shutting_down.is_some() {
            return;
        }
        let Some(jc) = &self.jobcore else { return };
        if (jc.pool.ranks.len() as u32) < self.opts.size {
            return;
        }
        self.initial_started = true;
        info!("instance of {} brokers is up after {:.3}s", self.opts.size, self.start.elapsed().as_secs_f64());
        // Tells `vigil start` the instance is up: from now on a broker's death is the instance's business
        // (a lost rank), not a failed start.
        let _ = std::fs::write(self.opts.rundir.join("up"), format!("{}\n", self.opts.size));
        if let (Some(puri), Some(jobid)) = (self.opts.parent_uri.clone(), self.opts.config.jobid.clone()) {
            // A nested instance tells its parent's exec system where it lives and which ranks are critical.
            let report = json!({"id": jobid, "uri": self.local_uri, "size": self.opts.size,
                "critical_ranks": IdSet::from_iter(self.opts.topo.critical_ranks(self.opts.size)).to_string()});
            tokio::spawn(async move {
                match crate::client::Client::connect(&puri).await {
                    Ok(c) => {
                        if let Err(e) = c.rpc("job-exec.nested", 0, &report).await {
                            warn!("could not report to the enclosing instance: {e}");
                        }
                    }
                    Err(e) => warn!("could not reach the enclosing instance at {puri}: {e}"),
                }
            });
        }
        let Some(argv) = self.opts.initial_program.clone() else { return };
        let tx = self.input_tx.clone();
        let uri = self.local_uri.clone();
        tokio::spawn(async move {
            let code = run_initial(argv, uri, tx.clone()).await;
            let _ = tx.send(Input::InitialExit(code));
        });
    }
}

/// Run the initial program in its own process group, made the terminal's foreground group when stdin is a
/// tty (so Ctrl-C reaches it, not the brokers). Reports its pgid, then its exit code.
async fn run_initial(argv: Vec<String>, uri: String, tx: mpsc::UnboundedSender<Input>) -> i32 {
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
                let _ = tx.send(Input::InitialStarted(pid as i32));
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
