//! The broker's tokio driver: sockets, processes, detectors and the clock around the sans-IO [`Broker`].
//!
//! One task owns the [`Broker`] and a [`Driver`] holding every piece of I/O: overlay links, local clients, job
//! shell and initial-program processes, the failure detectors. The loop polls the overlay links' receiving
//! halves itself (`link_set.rs`), whatever they run on (`transport.rs`); small tasks (the listeners, local
//! clients' readers, process waiters, signal handlers) feed it [`Event`]s through one channel. The driver
//! turns each into a broker [`Input`] stamped with the time, and carries out the [`Effect`]s the broker hands
//! back. It never knows which transport a link runs on: a link's hello negotiates that through the upgrade
//! seam (`upgrade.rs`), and the link's [`LinkChoice`] describes it.
//!
//! Here: the [`Driver`], its [`Event`]s, the start ([`run`] and its steps), the loop and its turn (step, flush
//! and group commit), the detectors' glue and the clean-up. Next door, each a job of its own: `effects.rs`
//! carries out the effects (and starts job shells), `links_up.rs` brings overlay links up (children accepted,
//! parent connected), `discover.rs` finds what the node has, and `statedir_io.rs` runs rank 0's state directory
//! (redo log writer, fsync thread) and carries out the broker's `Effect::Store` and `Effect::Sync`.
//!
//! [`Effect`]: super::core::Effect
//! [`LinkChoice`]: super::transport::LinkChoice

use super::core::{Broker, DriverStatus, Environment, Input, Peer, Time, PARENT};
use super::discover::discover;
use super::link_set::LinkSet;
use super::links_up::{
    accept_children, connect_parent, first_parent_gone, Ask, ChildLink, JobNetwork, ParentError, ParentLink,
    PendingChild,
};
use super::local;
use super::options::{DriverOptions, ListenSpec};
use super::secure;
use super::statedir_io::{open_statedir, start_store_threads, Syncer, Writer};
use super::transport::{Link, LinkEvent, LinkRx, LinkTx, TcpTransport};
use super::upgrade::{Answers, Upgrades};
use crate::jobs::JobId;
use crate::message::{errno, Message};
use crate::shellproto::ShellReport;
use serde_json::{json, Value};
use std::collections::{HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};
pub use vigil_core::broker::BrokerOptions;
use vigil_core::membership::PeerState;

/// What the driver's tasks report, through its one channel.
pub(crate) enum Event {
    Peer(Peer, u64, Message),
    PeerClosed(Peer, u64, String),
    ChildHello {
        conn: u64,
        msg: Message,
        /// The child's link, still on TCP.
        link: Link,
        /// The answers to the transports it offered (see `upgrade.rs`).
        answers: Answers,
    },
    LocalNew {
        id: u32,
        uid: u32,
        tx: LinkTx,
    },
    /// Job `id`'s shell started (its pid) or could not (why), from the thread that started it (`shells.rs`).
    ShellStarted {
        id: JobId,
        result: Result<i32, String>,
    },
    /// Job `id`'s shell ended: its report, its wait status, and the pids still in its cgroup after it was killed
    /// (`shells.rs`; empty once it emptied).
    ShellDone {
        id: JobId,
        report: Option<ShellReport>,
        status: i32,
        lingering: Vec<u32>,
    },
    /// Job `id`'s cgroup, which still held processes when its shell ended, is empty now (`shells.rs`).
    CgroupEmptied {
        id: JobId,
    },
    InitialStarted(i32),
    InitialExit(i32),
    /// The enclosing instance lost the nodes of these ranks of this nested instance, saying why (see
    /// [`Effect::WatchEnclosing`](super::core::Effect::WatchEnclosing)).
    EnclosingLost {
        ranks: crate::idset::IdSet,
        why: String,
    },
    /// Rank 0's store thread fsynced the redo log, asked to once write `upto` was written.
    Synced {
        upto: u64,
        result: Result<(), super::store::CommitError>,
    },
    Signal(i32),
    /// From the failure detectors (`detect/`); `requeued` marks a kernel TCP event already put back once.
    Detect(super::detect::DetectInput, bool),
    /// The outcome of an [`Effect::CheckNode`](super::core::Effect::CheckNode): whether the node's kernel
    /// answered.
    NodeChecked {
        token: u64,
        answered: Option<bool>,
    },
    /// The metrics endpoint asks for a snapshot (`metrics.rs`).
    Metrics(tokio::sync::oneshot::Sender<super::metrics::Snapshot>),
    /// The outcome of an [`Effect::ConnectParent`](super::core::Effect::ConnectParent): attempt `gen` (stale
    /// unless still the latest).
    ParentLink {
        gen: u64,
        result: Result<ParentLink, ParentError>,
    },
}

impl Event {
    /// What kind of input this is, for the log of a slow turn of the loop.
    fn label(&self) -> String {
        match self {
            Event::Peer(p, _, m) => format!("message {} from {p:?}", m.topic),
            Event::PeerClosed(p, _, _) => format!("{p:?} closed"),
            Event::ChildHello { .. } => "a child's hello".into(),
            Event::LocalNew { .. } => "a local connection".into(),
            Event::ShellStarted { id, .. } => format!("job {id}'s shell started"),
            Event::ShellDone { id, .. } => format!("job {id}'s shell ended"),
            Event::CgroupEmptied { id } => format!("job {id}'s cgroup emptied"),
            Event::InitialStarted(_) | Event::InitialExit(_) => "the initial program".into(),
            Event::EnclosingLost { .. } => "the enclosing instance's lost nodes".into(),
            Event::Synced { .. } => "an fsync".into(),
            Event::Signal(s) => format!("signal {s}"),
            Event::Detect(..) => "a detector report".into(),
            Event::NodeChecked { .. } => "a node check".into(),
            Event::Metrics(_) => "a metrics scrape".into(),
            Event::ParentLink { .. } => "a parent link attempt".into(),
        }
    }
}

/// How long a lost verdict made with no event time waits for a kernel TCP event to time it ([`Driver::time_late`]),
/// ns.
const LATE_EVENT_NS: u64 = 5_000_000_000;

/// A turn of the loop that takes this long (seconds) is logged at debug level with what it handled: the loop
/// is the judge, and a verdict waits for it.
const SLOW_TURN: f64 = 0.05;

/// Every piece of I/O of one broker, around its sans-IO [`Broker`].
///
/// Its parts are `pub(super)` for the effect executor (`effects.rs`, which carries out the broker's effects on
/// them); nothing outside `broker/` sees them.
pub(crate) struct Driver {
    pub broker: Broker,
    /// [`Time::ZERO`] on the broker's clock.
    origin: Instant,
    pub(super) input_tx: mpsc::UnboundedSender<Event>,
    /// Overlay connections refused before authentication (shared with the listener's tasks).
    refusals: std::sync::Arc<std::sync::Mutex<secure::RefusalLog>>,
    pub(super) parent: Option<LinkTx>,
    pub(super) parent_sock: Option<std::os::fd::OwnedFd>,
    /// The parent link's 4-tuple as registered with the TCP watcher.
    pub(super) parent_tuple: Option<vigil_ebpf::TcpTuple>,
    /// Where the parent's node is checked ([`Effect::CheckNode`](super::core::Effect::CheckNode)): its probe
    /// address.
    pub(super) parent_check: Option<std::net::SocketAddr>,
    pub(super) children: HashMap<u32, ChildLink>,
    /// The receiving halves of the overlay links (parent and children), polled by the loop.
    pub(super) links: LinkSet,
    pub(super) pending: HashMap<u64, PendingChild>,
    pub(super) locals: HashMap<u32, LinkTx>,
    /// Job shells, started and starting (shared with the threads that start them: `shells.rs`).
    pub(super) shells: super::shells::Shells,
    /// The privileged launcher guests' shells are started with (`imp.rs`), where this broker needs one.
    pub(super) imp: Option<std::path::PathBuf>,
    /// Shells are moved into their cgroup after start: creating them there failed once (see spawn.rs).
    pub(super) spawn_moves: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// The node's topology, for the placement of the tasks of the shells started here.
    pub(super) placer: super::placement::Placer,
    /// How job shells are contained (a cgroup v2 each, or process groups only).
    pub(super) containment: std::sync::Arc<super::cgroup::Containment>,
    pub(super) initial_pgid: Option<i32>,
    /// Failure detectors (None if the overlay address is not IPv4).
    pub detect: Option<super::detect::Detectors>,
    /// What the detectors report, read by the loop before its other inputs ([`Driver::serve`]).
    detect_rx: Option<mpsc::UnboundedReceiver<super::detect::DetectInput>>,
    /// Time from a prober report to its turn in the loop (`vigil_detect_report_delay_seconds`).
    report_delay: prometheus_client::metrics::histogram::Histogram,
    /// What the metrics endpoint shows beside the broker's snapshot; here for the time from a detected event to
    /// the verdict on it (`vigil_verdict_latency_seconds`, [`Driver::step_timed`]).
    observed: super::metrics::Observed,
    /// Lost verdicts on children made on an input that carried no event time (the link's end of file or reset, as
    /// its reader read it), by rank: when (`CLOCK_MONOTONIC` ns) and by which rule. A kernel TCP event on that link
    /// arriving after them tells when the connection ended, and times them then ([`Driver::time_late`]).
    untimed_lost: HashMap<u32, (u64, vigil_core::membership::Rule)>,
    /// Lost verdicts by rule already accounted for: timed at once, or noted in `untimed_lost`.
    lost_seen: std::collections::BTreeMap<vigil_core::membership::Rule, u64>,
    /// The loop's scheduling, on the machine's detector owner (`priority.rs`).
    loop_priority: Option<String>,
    /// Processes the broker asked to watch (`detect.watch`).
    pub(super) watched: HashSet<u32>,
    /// The transports a link may move onto after its hello, in `tbon.transport`'s order.
    pub(super) upgrades: std::sync::Arc<Upgrades>,
    /// What [`DriverStatus`] was last built from (see [`Driver::refresh_status`]).
    status_key: [u64; 8],
    /// Bumped when the detectors change (loaded).
    detect_generation: u64,
    /// The overlay key and instance id (for connecting to an adoptive parent).
    pub(super) auth: std::sync::Arc<secure::LinkAuth>,
    /// Which parent link is current: the connection number its events carry (0: the first one). Events of an
    /// older parent link are dropped.
    pub(super) parent_gen: u64,
    /// Rank 0's redo log and writer thread ([`Writer`]), when it has a state directory it could open.
    pub(super) writer: Option<Writer>,
    /// Group commit (with a store): [`Driver::step`] only hands the broker its input; what it asks for waits
    /// for [`Driver::flush`] at the end of the loop's turn, where the broker hands out one batch of the journal
    /// first (`Effect::Store`).
    grouping: bool,
    /// The store thread that fsyncs what the writer wrote (with a store): see [`Syncer`].
    pub(super) syncer: Option<Syncer>,
    /// The node health check's state, from its task (`health.rs`), for status output.
    health: super::health::Shared,
}

/// Most events one turn of the loop takes before its commit (group commit with a state directory): enough to
/// share one fsync among a flood of submissions, few enough to keep a turn to milliseconds.
const GROUP_MAX: usize = 256;

/// Run a broker until the instance shuts down; returns the process exit code (rank 0: the initial program's).
/// `opts` is what the sans-IO broker runs on, `io` what only this driver needs (listener, key, node discovered).
pub async fn run(opts: BrokerOptions, io: DriverOptions) -> i32 {
    let rank = opts.rank;
    match run_inner(opts, io).await {
        Ok(code) => code,
        Err(e) => {
            // Once, in the log's format, and even with log-level=off: this is why the broker is exiting.
            eprintln!("vigil-broker[{rank}]: error: {e}");
            1
        }
    }
}

/// Start a broker, run its loop until the instance shuts down, and end it: the node discovered, the overlay
/// listener and the local connector serving, signals watched, the state directory opened (rank 0) and the
/// broker restored from it, the detectors started, the parent connected to ([`Driver::connect_first_parent`]);
/// then the loop ([`Driver::serve`]) and the end ([`Driver::finish`]). Returns the exit code.
///
/// # Errors
/// The broker cannot start: why (a topology too deep, a listener or socket that cannot be bound, containment or
/// a state directory that cannot be had, no parent).
async fn run_inner(opts: BrokerOptions, io: DriverOptions) -> Result<i32, String> {
    let rank = opts.rank;
    opts.config.topo.check_depth(opts.size)?;
    opts.config.check_metrics_ranks(opts.size)?;
    let (resources, topology_str) = discover(&opts, io.discovered.as_deref());
    info!(rank, cores = resources.cores, gpus = resources.gpus, source = %resources.source, "node discovered");

    let (input_tx, input_rx) = mpsc::unbounded_channel::<Event>();

    // Overlay listener.
    let listener = bind_overlay(&io.listen).await?;
    let listen_ip = overlay_ip(&listener, &opts);
    let auth = std::sync::Arc::new(secure::LinkAuth::new(io.key, &opts.instance));
    let upgrades = std::sync::Arc::new(Upgrades::new(&opts.config));
    let refusals = std::sync::Arc::new(std::sync::Mutex::new(secure::RefusalLog::default()));
    tokio::spawn(accept_children(listener, input_tx.clone(), auth.clone(), upgrades.clone(), refusals.clone()));

    let uid = nix::unistd::getuid().as_raw();
    // A multi-user instance whose brokers are not root starts guests' jobs through vigil-imp: checked before
    // anyone can connect, so that such an instance never takes a job it could not start.
    let imp = super::imp::needed(opts.config.allow_guest_users, uid, opts.config.imp.as_deref())?;
    if let Some(p) = &imp {
        info!("guests' jobs start through {}", p.display());
    }
    let local_uri = serve_local(&opts, uid, &input_tx)?;
    watch_signals(&input_tx);
    let containment = choose_containment(&opts)?;
    let observed = super::metrics::Observed::default();
    let metrics = super::metrics::start(opts.config.metrics_address(rank), input_tx.clone(), observed.clone()).await;
    let env = Environment {
        uid,
        pid: std::process::id(),
        wall_origin: crate::broker_now(),
        local_uri,
        resources,
        topology: topology_str,
        containment: containment.describe(),
        metrics,
    };
    let (store, statedir, kept) = open_statedir(&opts)?;
    let (syncer, writer) = start_store_threads(store, &input_tx, observed.fsync.clone())?;
    let origin = Instant::now();
    let mut d = Driver {
        broker: Broker::new(opts, env, Time::ZERO),
        origin,
        input_tx: input_tx.clone(),
        refusals,
        parent: None,
        parent_sock: None,
        parent_tuple: None,
        parent_check: None,
        children: HashMap::new(),
        links: LinkSet::default(),
        pending: HashMap::new(),
        locals: HashMap::new(),
        shells: super::shells::Shells::default(),
        imp,
        spawn_moves: std::sync::Arc::default(),
        placer: super::placement::Placer::default(),
        containment: std::sync::Arc::new(containment),
        initial_pgid: None,
        detect: None,
        detect_rx: None,
        report_delay: observed.report_delay.clone(),
        observed: observed.clone(),
        untimed_lost: HashMap::new(),
        lost_seen: std::collections::BTreeMap::new(),
        loop_priority: None,
        watched: HashSet::new(),
        upgrades,
        status_key: [u64::MAX; 8],
        detect_generation: 0,
        auth: auth.clone(),
        parent_gen: 0,
        grouping: writer.is_some(),
        writer,
        syncer,
        health: super::health::Shared::default(),
    };
    let t = Instant::now();
    let restoring = kept.is_some();
    d.broker.restore(statedir, kept);
    if restoring {
        info!("state directory: jobs restored in {:.3}s", t.elapsed().as_secs_f64());
    }
    d.start_detectors(listen_ip);
    if let Some(sig) = d.connect_first_parent(auth, io.endpoints_exchanged).await? {
        return Ok(128 + sig);
    }
    // The eBPF detectors load in the background now that we have joined the overlay.
    if let Some(det) = d.detect.as_mut() {
        det.begin_load();
    }
    d.refresh_status();
    // Register with rank 0 (locally on rank 0); on a single-broker instance nothing else arrives.
    d.step(Input::Start);
    d.flush();
    super::health::start(&d.broker.opts.config, rank, &d.broker.env.local_uri, &d.health);
    d.serve(input_rx).await;
    let code = d.finish();
    info!(rank, code, "broker exiting");
    Ok(code)
}

/// The overlay's listening socket: the one `vigil start` bound and passed down (`ListenSpec::Fd`), or one bound
/// here.
///
/// # Errors
/// The inherited descriptor cannot be used, or the endpoint cannot be bound.
async fn bind_overlay(listen: &ListenSpec) -> Result<tokio::net::TcpListener, String> {
    match listen {
        ListenSpec::Fd(fd) => {
            // SAFETY: `vigil start` bound this TCP listener and passed us its descriptor, which nothing else in
            // this process owns; we take ownership exactly once here.
            let std_l = unsafe { <std::net::TcpListener as std::os::fd::FromRawFd>::from_raw_fd(*fd) };
            // It came without FD_CLOEXEC (it had to outlive our exec). Set it now: the initial program and the job
            // shells must not inherit the overlay's port, or they would hold it after this broker dies and a
            // restarted rank 0 could not bind it again.
            // SAFETY: F_GETFD/F_SETFD on the descriptor `std_l` owns.
            unsafe {
                let flags = libc::fcntl(*fd, libc::F_GETFD);
                if flags >= 0 {
                    libc::fcntl(*fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
                }
            }
            std_l.set_nonblocking(true).map_err(|e| format!("listener fd {fd}: {e}"))?;
            tokio::net::TcpListener::from_std(std_l).map_err(|e| format!("listener fd {fd}: {e}"))
        }
        ListenSpec::Endpoint(ep) => {
            let addr = ep.strip_prefix("tcp://").unwrap_or(ep);
            tokio::net::TcpListener::bind(addr).await.map_err(|e| format!("cannot bind overlay endpoint {ep}: {e}"))
        }
    }
}

/// The overlay's own address: the listener's, or for a wildcard listener the address peers know us by (this
/// rank's endpoint). `None`: neither is known.
fn overlay_ip(listener: &tokio::net::TcpListener, opts: &BrokerOptions) -> Option<std::net::IpAddr> {
    listener.local_addr().ok().map(|a| a.ip()).and_then(|ip| {
        if ip.is_unspecified() {
            opts.endpoints.get(opts.rank as usize).and_then(|ep| {
                let hp = ep.strip_prefix("tcp://").unwrap_or(ep);
                hp.parse::<std::net::SocketAddr>().ok().map(|a| a.ip())
            })
        } else {
            Some(ip)
        }
    })
}

/// Serve the local connector (`local.rs`) on the socket `local-RANK` in the rundir, which is created if need
/// be; clients of user `uid` are this instance's owner. Returns the socket's URI.
///
/// # Errors
/// The rundir cannot be created, or the socket bound.
fn serve_local(opts: &BrokerOptions, uid: u32, events: &mpsc::UnboundedSender<Event>) -> Result<String, String> {
    let rank = opts.rank;
    std::fs::create_dir_all(&opts.rundir)
        .map_err(|e| format!("cannot create rundir {}: {e}", opts.rundir.display()))?;
    let sock = opts.rundir.join(format!("local-{rank}"));
    let _ = std::fs::remove_file(&sock);
    let ul = tokio::net::UnixListener::bind(&sock).map_err(|e| format!("cannot bind {}: {e}", sock.display()))?;
    {
        use std::os::unix::fs::PermissionsExt;
        // Access control is the SO_PEERCRED check, which gives a clear refusal; the file mode stays open.
        let _ = std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o777));
        if opts.config.allow_guest_users {
            // Every user must reach the socket: the rundir (made 0700 when it is a new temporary directory) is
            // opened to all for search and reading, and a directory above it that others cannot search is said.
            let _ = std::fs::set_permissions(&opts.rundir, std::fs::Permissions::from_mode(0o755));
            if let Some(d) = opts
                .rundir
                .ancestors()
                .find(|d| std::fs::metadata(d).is_ok_and(|m| m.permissions().mode() & 0o001 == 0))
            {
                tracing::warn!(
                    "multi-user instance: {} is not searchable by other users, who cannot reach {} (chmod o+x it)",
                    d.display(),
                    sock.display()
                );
            }
        }
    }
    let local_uri = format!("local://{}", sock.display());
    // Rank 0 tells its clients how long the instance waits for it when it is lost (they may wait as long).
    let rank0_grace = if rank == 0 { opts.config.parent_grace() } else { 0.0 };
    let guests = opts.config.allow_guest_users;
    // What every admitted client is told first: where it is, who owns the instance, and whether it is multi-user
    // (then a guest's submission carries a munge credential: vigil_client::munge).
    let welcome = serde_json::json!({
        "rank": rank, "size": opts.size, "instance": opts.instance, "uid": uid, "rank0_grace": rank0_grace,
        "guests": guests,
    });
    tokio::spawn(local::accept_local(ul, events.clone(), uid, guests, welcome));
    Ok(local_uri)
}

/// Hand SIGTERM, SIGINT, SIGHUP, SIGUSR1 and SIGUSR2 to the loop, as [`Event::Signal`]s (SIGUSR1/2: a batch job's
/// warning before its time limit, which its shell passes to the job's brokers and which must not kill them).
fn watch_signals(events: &mpsc::UnboundedSender<Event>) {
    for (kind, num) in [
        (tokio::signal::unix::SignalKind::terminate(), libc::SIGTERM),
        (tokio::signal::unix::SignalKind::interrupt(), libc::SIGINT),
        (tokio::signal::unix::SignalKind::hangup(), libc::SIGHUP),
        (tokio::signal::unix::SignalKind::user_defined1(), libc::SIGUSR1),
        (tokio::signal::unix::SignalKind::user_defined2(), libc::SIGUSR2),
    ] {
        if let Ok(mut s) = tokio::signal::unix::signal(kind) {
            let tx = events.clone();
            tokio::spawn(async move {
                while s.recv().await.is_some() {
                    let _ = tx.send(Event::Signal(num));
                }
            });
        }
    }
}

/// How this broker keeps its job shells (`exec.containment`, `exec.cgroup-spawn`: see `cgroup.rs`), said once in
/// the log.
///
/// # Errors
/// `exec.containment=cgroup` and no cgroup can be had.
fn choose_containment(opts: &BrokerOptions) -> Result<super::cgroup::Containment, String> {
    // One broker per machine sweeps what dead brokers left (the detector rank of a test instance).
    let sweep = opts.config.detector_rank.is_none_or(|r| r == opts.rank);
    let containment =
        super::cgroup::Containment::choose(&opts.config.containment, &opts.config.cgroup_spawn, opts.rank, sweep)?;
    match &containment {
        super::cgroup::Containment::ProcessGroups(why) if opts.config.containment != "pgroup" => {
            warn!("jobs are kept by process groups only, not cgroups: {why} (a task that calls setsid escapes its job)")
        }
        c => info!("jobs contained by {}", c.describe()),
    }
    Ok(containment)
}

/// Forward a local client's link events into the driver's channel, tagged with the peer (overlay links are
/// polled by the loop itself, `link_set.rs`).
pub(crate) async fn pump(mut rx: LinkRx, peer: Peer, conn: u64, tx: mpsc::UnboundedSender<Event>) {
    while let Some(ev) = rx.recv().await {
        let i = match ev {
            LinkEvent::Message(m) => Event::Peer(peer, conn, m),
            LinkEvent::Closed(why) => {
                let _ = tx.send(Event::PeerClosed(peer, conn, why));
                return;
            }
        };
        if tx.send(i).is_err() {
            return;
        }
    }
    let _ = tx.send(Event::PeerClosed(peer, conn, "link dropped".into()));
}

impl Driver {
    /// The broker's clock now.
    pub(super) fn now(&self) -> Time {
        Time::from_nanos(u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX))
    }

    /// The instant of a time on the broker's clock.
    fn instant(&self, t: Time) -> Instant {
        self.origin + Duration::from_nanos(t.as_nanos())
    }

    /// The loop: hand the broker each event from the driver's tasks, each message on an overlay link and its
    /// timer, until it has finished. With a state directory, what else is ready joins the turn (group commit,
    /// at most [`GROUP_MAX`] events) before the turn's effects are carried out ([`Driver::flush`]).
    async fn serve(&mut self, mut input_rx: mpsc::UnboundedReceiver<Event>) {
        // One timer for the loop, moved only when the deadline changes: registering a new timer for every input
        // cost a timer-wheel insertion and removal per message.
        let timer = tokio::time::sleep(Duration::from_secs(86400));
        tokio::pin!(timer);
        let mut armed: Option<Time> = None;
        loop {
            let deadline = self.broker.next_deadline();
            if deadline != armed {
                if let Some(t) = deadline {
                    timer.as_mut().reset(tokio::time::Instant::from_std(self.instant(t)));
                }
                armed = deadline;
            }
            // The overlay links are polled here, by this task, between its other inputs (see link_set.rs). What the
            // detectors report comes first: a verdict must not wait behind a backlog of other work (a loop starved
            // of CPU falls behind on everything; measured as vigil_detect_report_delay_seconds).
            let detect_rx = &mut self.detect_rx;
            let event = tokio::select! {
                biased;
                Some(d) = async { match detect_rx.as_mut() { Some(r) => r.recv().await, None => None } } => {
                    Some(Event::Detect(d, false))
                }
                i = input_rx.recv() => i,
                i = std::future::poll_fn(|cx| self.links.poll_next(cx)) => Some(i),
                _ = &mut timer, if armed.is_some() => None,
            };
            let turn = Instant::now();
            let label = tracing::enabled!(tracing::Level::DEBUG).then(|| event.as_ref().map(Event::label));
            match event {
                Some(e) => self.on_event(e),
                None => self.step(Input::Timer),
            }
            let first = turn.elapsed().as_secs_f64();
            let mut more = 0;
            let mut flushed = 0.0;
            if self.grouping {
                // Group commit: what else is ready joins this turn, and one transaction writes it all before
                // anything it caused is carried out; submissions are answered once an fsync covers it.
                for _ in 1..GROUP_MAX {
                    let detected =
                        self.detect_rx.as_mut().and_then(|r| r.try_recv().ok()).map(|d| Event::Detect(d, false));
                    match detected.or_else(|| input_rx.try_recv().ok()).or_else(|| self.links.try_next(None)) {
                        Some(e) => {
                            self.on_event(e);
                            more += 1;
                        }
                        None => break,
                    }
                }
                let f = Instant::now();
                self.flush();
                flushed = f.elapsed().as_secs_f64();
            }
            let took = turn.elapsed().as_secs_f64();
            if took > SLOW_TURN {
                if let Some(l) = label {
                    debug!(
                        "slow turn of the loop: {:.0} ms on {} ({:.0} ms), {more} more events, flush {:.0} ms",
                        took * 1e3,
                        l.as_deref().unwrap_or("its timer"),
                        first * 1e3,
                        flushed * 1e3
                    );
                }
            }
            if self.broker.finished() {
                break;
            }
        }
    }

    /// After the loop: write what rank 0 still had to write, stop the broker, clean up ([`Driver::cleanup`]).
    /// Returns the broker's exit code.
    fn finish(&mut self) -> i32 {
        // What rank 0 still had to write, and what waited for it (answers, the last messages to its children); then
        // what stopping changes (jobs the shutdown ended, finished: `Broker::stop`), written too.
        self.broker.loop_ended();
        self.flush();
        self.broker.stop();
        self.flush();
        self.cleanup();
        self.broker.exit_code()
    }

    /// Connect to the parent at start, if this broker has one (retrying for up to `tbon.connect_timeout`), and
    /// take the link ([`Driver::parent_up`]). `Some(signal)`: SIGTERM or SIGINT came first, and the broker exits.
    ///
    /// A broker that re-parents, whose parent is not rank 0 and whose endpoints were `exchanged`
    /// ([`DriverOptions::endpoints_exchanged`]: a nested instance's) re-parents at once
    /// ([`Input::FirstParentFailed`], as from a parent lost later) when that parent's endpoint is absent, when
    /// nothing listens there, or when its node does not answer ([`first_parent_gone`]): a router whose node died
    /// after the exchange but before its children connected. It never does so while that node answers.
    ///
    /// # Errors
    /// No endpoint is known for the parent, or no link could be made to it (refused, or not within the timeout).
    async fn connect_first_parent(
        &mut self,
        auth: std::sync::Arc<secure::LinkAuth>,
        exchanged: bool,
    ) -> Result<Option<i32>, String> {
        let opts = &self.broker.opts;
        let rank = opts.rank;
        let Some(parent) = opts.config.topo.parent(opts.size, rank) else { return Ok(None) };
        let ep = opts
            .endpoints
            .get(parent as usize)
            .cloned()
            .ok_or_else(|| format!("no endpoint for parent rank {parent}"))?;
        // A parent below rank 0 whose endpoint is absent (a nested broker whose parent's node was lost before the
        // launcher's PMI exchange ended, which left it out) is re-parented from at once, as one lost later would
        // be (reparent.rs), when re-parenting is on.
        if ep.is_empty() && opts.config.reparent && parent != 0 {
            warn!(rank, parent, "no endpoint for parent rank {parent}: its node was lost during start-up");
            self.step(Input::FirstParentFailed(format!("its node was lost during start-up (rank {parent})")));
            return Ok(None);
        }
        // Tree repair at start (a nested instance): the parent's listener was bound before the exchange ended.
        let repair = exchanged && opts.config.reparent && parent != 0;
        let addr: Option<std::net::SocketAddr> = ep.strip_prefix("tcp://").unwrap_or(&ep).parse().ok();
        let gone = async {
            match addr.filter(|_| repair) {
                Some(a) => first_parent_gone(a).await,
                None => std::future::pending().await,
            }
        };
        let probe = self.detect.as_ref().map_or_else(|| json!({"probe_port": null}), |d| d.hello_fields());
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
        let ask = Ask::First { exchanged };
        let timeout = opts.config.connect_timeout;
        let outcome = tokio::select! {
            r = connect_parent(opts, timeout, &transport, &self.upgrades, &probe, &ep, ask) => match r {
                Ok(link) => Ok(link),
                // Nothing listens where it was (its broker is gone), or it never took our hello: adopted
                // elsewhere rather than exiting.
                Err(ParentError::Unreachable(why)) if repair => Err(why),
                Err(e) => return Err(e.to_string()),
            },
            why = gone => Err(why),
            sig = stop => {
                warn!(rank, "signal {sig} while connecting to the parent at {ep}; exiting");
                return Ok(Some(sig));
            }
        };
        let link = match outcome {
            Ok(link) => link,
            Err(why) => {
                warn!(rank, parent, "parent rank {parent} at {ep}: {why}; re-parenting (no verdict on it)");
                self.step(Input::FirstParentFailed(format!("rank {parent}: {why}")));
                return Ok(None);
            }
        };
        self.parent_up(0, link);
        info!(rank, parent, "connected to parent at {ep}");
        Ok(None)
    }

    /// Take a new parent link, of connection number `gen`: watch it (TCP watcher), probe the parent's node,
    /// poll it in the loop and tell the broker ([`Input::ParentUp`]).
    fn parent_up(&mut self, gen: u64, ParentLink { link, choice, probe }: ParentLink) {
        self.parent = Some(link.tx.clone());
        self.parent_sock = link.sock;
        self.parent_tuple =
            self.parent_sock.as_ref().and_then(|s| self.detect.as_ref().and_then(|det| det.watch_link(PARENT, s)));
        self.probe_parent(probe);
        self.links.insert(Peer::Parent, gen, link.rx);
        self.step(Input::ParentUp(choice));
    }

    /// Hand the broker an input, then carry out what it asks, including the inputs those effects produce at once
    /// (a spawned shell's pid, kernel ACK samples, bounced requests), in order.
    /// With a state directory ([`Driver::grouping`]) only the input is handed over here; [`Driver::flush`] does
    /// the rest at the end of the loop's turn.
    pub(crate) fn step(&mut self, input: Input) {
        let now = self.now();
        self.handle(now, input);
        if !self.grouping {
            self.flush();
        }
    }

    /// [`Driver::step`] on a detector's report of an event that happened at `event_ns` (`CLOCK_MONOTONIC` ns):
    /// each verdict the judge makes on it is timed from the event (`vigil_verdict_latency_seconds`). Only
    /// observes: the verdicts are the broker's, by the same rules as any input.
    fn step_timed(&mut self, input: Input, event_ns: Option<u64>) {
        let Some(at) = event_ns else { return self.step(input) };
        let before: Vec<_> = self.broker.membership.verdicts().collect();
        let now = self.now();
        self.handle(now, input);
        let latency = vigil_ebpf::monotonic_ns().saturating_sub(at) as f64 / 1e9;
        for (state, rule, n) in self.broker.membership.verdicts() {
            let old = before.iter().find(|b| (b.0, b.1) == (state, rule)).map_or(0, |b| b.2);
            if n > old {
                self.observed.verdicts_timed(state, rule, n - old, latency);
                if state == PeerState::Lost {
                    *self.lost_seen.entry(rule).or_default() += n - old;
                }
            }
        }
        if !self.grouping {
            self.flush();
        }
    }

    /// Hand the broker one input. On rank 0, an input that ran a full scheduling pass (the core's pass counter
    /// grew) is timed into `vigil_sched_pass_seconds`: the core reads no clock, so the pass is timed with the rest
    /// of that input's rules.
    pub(super) fn handle(&mut self, now: Time, input: Input) {
        let Some(passes) = self.broker.jobcore.as_ref().map(|jc| jc.passes()) else {
            return self.broker.handle(now, input);
        };
        let t = Instant::now();
        self.broker.handle(now, input);
        if self.broker.jobcore.as_ref().is_some_and(|jc| jc.passes() != passes) {
            self.observed.sched_pass.observe(t.elapsed().as_secs_f64());
        }
    }

    /// Carry out a verdict of the fabric-down rule on a child (`vigil_core::membership::FabricWatch`): ask rank 0
    /// to drain it and fail or notify its jobs (`resource.drain` with `"by": "fabric"`), or, after
    /// `tbon.job_network_undrain_after`, to undrain it (`resource.undrain`, which undoes only a fabric-down
    /// drain). Off the loop; an answer that is not a success is logged.
    fn fabric_verdict(&mut self, v: vigil_core::membership::FabricVerdict) {
        use vigil_core::membership::FabricVerdict;
        let (topic, body, what) = match v {
            FabricVerdict::Down { rank, reason } => {
                warn!(
                    "child rank {rank}: {reason}: its job network stopped answering while its management network \
                       answers; asking rank 0 to drain it and end or notify its jobs"
                );
                let body = json!({"ranks": rank.to_string(), "reason": reason, "by": "fabric"});
                ("resource.drain", body, format!("drain rank {rank} as fabric-down"))
            }
            FabricVerdict::Up { rank } => {
                info!("child rank {rank}: its job network has answered for tbon.job_network_undrain_after; undrained");
                ("resource.undrain", json!({"ranks": rank.to_string(), "by": "fabric"}), format!("undrain rank {rank}"))
            }
        };
        let uri = self.broker.env.local_uri.clone();
        tokio::spawn(async move {
            let r = match vigil_client::Client::connect(&uri).await {
                Err(e) => Err(e.to_string()),
                Ok(c) => c.rpc(topic, 0, &body).await.map(|_| ()).map_err(|e| e.errstr),
            };
            if let Err(e) = r {
                warn!("cannot {what}: {e}");
            }
        });
    }

    /// The broker forgets child `r` (`Effect::ForgetChild`): if a lost verdict on it is not accounted for yet, it
    /// was made on an input with no event time; note it for [`Driver::time_late`].
    pub(super) fn note_lost_verdict(&mut self, r: u32) {
        let now = vigil_ebpf::monotonic_ns();
        for (state, rule, n) in self.broker.membership.verdicts() {
            let seen = self.lost_seen.entry(rule).or_default();
            if state != PeerState::Lost || n <= *seen {
                continue;
            }
            *seen += 1;
            self.untimed_lost.retain(|_, (at, _)| now.saturating_sub(*at) < LATE_EVENT_NS);
            self.untimed_lost.insert(r, (now, rule));
            return;
        }
    }

    /// A kernel event at `event_ns` ended the link to child `rank` after the lost verdict on it was made on its
    /// reader's end of file: that verdict is timed from the event now (an event after the verdict is our own
    /// close, not the cause, and is not used).
    fn time_late(&mut self, rank: u32, event_ns: u64) {
        if let Some((at, rule)) = self.untimed_lost.remove(&rank) {
            if event_ns <= at {
                self.observed.verdicts_timed(PeerState::Lost, rule, 1, (at - event_ns) as f64 / 1e9);
            }
        }
    }

    /// Carry out what the broker asked for, then hand it the inputs those effects produced at once (all of them),
    /// and carry out what they asked for, until none is left.
    ///
    /// With a state directory, the broker hands out the journal's batch (everything the turn changed) first
    /// (`Effect::Store`), which is appended to the redo log at once ([`Writer`]), so that what it asks for next
    /// (shell starts, answers, messages) is carried out only once the changes that led to it would survive a
    /// `kill -9` of rank 0. Submissions are answered later still, once an fsync covers their record
    /// (`Effect::Sync`, [`Syncer`]). When a batch may wait for a later turn (group commit) is the broker's rule
    /// (`Effect::Store`'s documentation).
    pub(crate) fn flush(&mut self) {
        let mut queue = VecDeque::new();
        loop {
            if let Some(w) = self.writer.as_mut() {
                w.hand_over(false);
            }
            while let Some(e) = self.broker.poll_effect() {
                self.execute(e, &mut queue);
            }
            if queue.is_empty() {
                return;
            }
            let now = self.now();
            for i in queue.drain(..) {
                self.handle(now, i);
            }
        }
    }

    /// What the status of the driver's parts is built from: cheap to read, so it is checked before every event
    /// and the status rebuilt only when it changed.
    fn status_key(&self) -> [u64; 8] {
        use std::sync::atomic::Ordering::Relaxed;
        let refused = self.refusals.lock().map(|r| r.count).unwrap_or(0);
        let health = self.health.lock().map(|h| h.1).unwrap_or(0);
        let mut k = [refused, self.detect_generation, u64::from(self.detect.is_some()) | health << 1, 0, 0, 0, 0, 0];
        k[7] = u64::from(self.fold_failing().is_some());
        if let Some(s) = self.detect.as_ref().and_then(|d| d.prober_stats.as_ref()) {
            k[3] = u64::from(s.grouped.load(Relaxed));
            k[4] = u64::from(s.unicast.load(Relaxed)) | u64::from(s.unreached.load(Relaxed)) << 32;
            k[5] = u64::from(s.collected.load(Relaxed));
            k[6] = s.void_rounds.load(Relaxed) ^ s.correlated_rounds.load(Relaxed).rotate_left(32);
        }
        k
    }

    /// Probe the parent's node (`Some`: its responder's address) as the parent probes ours, or stop (`None`): a
    /// silent loss of the parent's node is then judged by the probe rule (tbon.probe_misses × tbon.probe_period,
    /// 30 ms by default) instead of the TCP acknowledgement timeout (tbon.lost_timeout after the last heartbeat),
    /// so that orphans re-parent as soon as the parent's own parent judges it lost.
    pub(super) fn probe_parent(&mut self, at: Option<std::net::SocketAddr>) {
        use super::detect::ProbeCmd;
        self.parent_check = at;
        let Some(d) = self.detect.as_mut() else { return };
        match at {
            Some(addr) => d.probe_child(PARENT, addr),
            None => d.prober_cmd(ProbeCmd::Remove(PARENT)),
        }
    }

    /// Why the writer thread cannot fold the redo log into the store, while it cannot.
    fn fold_failing(&self) -> Option<String> {
        self.writer.as_ref().and_then(Writer::fold_failing)
    }

    /// Hand the broker a fresh [`DriverStatus`] if anything in it changed.
    fn refresh_status(&mut self) {
        let key = self.status_key();
        if key == self.status_key {
            return;
        }
        self.status_key = key;
        let detectors = match &self.detect {
            Some(d) => {
                let mut v = serde_json::to_value(&d.status).unwrap_or_default();
                if let (Some(s), Some(o)) = (&d.prober_stats, v.as_object_mut()) {
                    let mut probing = s.describe();
                    if let Some(p) = &self.loop_priority {
                        probing.push_str(&format!("; {p}"));
                    }
                    o.insert("probing".into(), probing.into());
                }
                v
            }
            None => json!({"process_exit": "userspace (waitpid)", "tcp": "userspace (socket errors and TCP_INFO)",
                "responder": "none (overlay address is not IPv4)", "probes": "none"}),
        };
        let fold_failing = self.fold_failing();
        let cfg = &self.broker.opts.config;
        let health = match (&cfg.health_program, self.health.lock()) {
            (Some(p), Ok(h)) => json!({"program": p.display().to_string(), "interval": cfg.health_interval,
                "state": h.0.state, "reason": h.0.reason, "runs": h.0.runs}),
            _ => Value::Null,
        };
        self.step(Input::Status(DriverStatus { detectors, refused: key[0], fold_failing, health }));
    }

    /// One event from the driver's tasks.
    fn on_event(&mut self, e: Event) {
        self.refresh_status();
        match e {
            Event::Synced { upto, result } => self.step(Input::Synced { upto, result: result.map_err(Into::into) }),
            Event::Peer(Peer::Parent, conn, _) | Event::PeerClosed(Peer::Parent, conn, _)
                if conn != self.parent_gen =>
            {
                debug!("dropping an event of an earlier parent link");
            }
            Event::ParentLink { gen, result } => {
                if gen != self.parent_gen {
                    return;
                }
                match result {
                    Ok(link) => self.parent_up(gen, link),
                    Err(ParentError::Unreachable(why)) => self.step(Input::ParentFailed(why)),
                    Err(ParentError::Refused { why, full }) => self.step(Input::ParentRefused { why, full }),
                }
            }
            Event::Peer(peer, conn, msg) => self.step(Input::Message(peer, conn, msg)),
            Event::PeerClosed(peer, conn, why) => {
                if let Peer::Local(id) = peer {
                    self.locals.remove(&id);
                }
                self.step(Input::Closed(peer, conn, why))
            }
            Event::ChildHello { conn, msg, link, answers } => {
                let refusal = answers.refusal();
                let probe_port =
                    msg.json().get("probe_port").and_then(Value::as_u64).and_then(|p| u16::try_from(p).ok());
                let job_network = JobNetwork::from_hello(&msg.json());
                let addr = link.peer.clone();
                self.pending.insert(conn, PendingChild { link, answers, probe_port, job_network });
                self.step(Input::Hello { conn, msg, addr, refusal });
                // Judged at once (its acceptance carried out now, even in a group commit's turn): whatever the
                // broker did not accept is dropped.
                self.flush();
                self.pending.remove(&conn);
            }
            Event::LocalNew { id, uid, tx } => {
                self.locals.insert(id, tx);
                self.step(Input::LocalNew { id, uid });
            }
            Event::ShellStarted { id, result } => self.step(Input::ShellStarted { id, result }),
            Event::ShellDone { id, report, status, lingering } => {
                self.shells.ended(id);
                self.step(Input::ShellDone { id, report, status, lingering });
            }
            Event::CgroupEmptied { id } => self.step(Input::CgroupEmptied(id)),
            Event::InitialStarted(pgid) => {
                self.initial_pgid = Some(pgid);
                // For `vigil start`, which outlives a killed rank 0 and then ends what it started.
                let _ = std::fs::write(self.broker.opts.rundir.join("initial.pgid"), pgid.to_string());
            }
            Event::InitialExit(code) => self.step(Input::InitialExit(code)),
            Event::EnclosingLost { ranks, why } => self.step(Input::EnclosingLost { ranks, why }),
            Event::Signal(sig) => self.step(Input::Signal(sig)),
            Event::Detect(d, requeued) => self.on_detect(d, requeued),
            Event::NodeChecked { token, answered } => self.step(Input::NodeChecked { token, answered }),
            Event::Metrics(reply) => {
                use std::sync::atomic::Ordering::Relaxed;
                let stats = self.detect.as_ref().and_then(|d| d.prober_stats.as_ref());
                let _ = reply.send(super::metrics::Snapshot {
                    core: self.broker.metrics(),
                    probes: stats.map(|s| (s.sent.load(Relaxed), s.replies.load(Relaxed), s.rejected.load(Relaxed))),
                    excused: stats.map(|s| (s.void_rounds.load(Relaxed), s.correlated_rounds.load(Relaxed))),
                });
            }
        }
    }

    /// Failure detectors: a probe socket and responder on the overlay address, eBPF loaded in the background.
    fn start_detectors(&mut self, listen_ip: Option<std::net::IpAddr>) {
        let opts = &self.broker.opts;
        let rank = opts.rank;
        let owner = opts.config.detector_rank.is_none_or(|r| r == rank);
        let Some(std::net::IpAddr::V4(ip)) = listen_ip else {
            warn!("overlay address is not IPv4: heartbeat probes and XDP disabled; membership relies on TCP");
            return;
        };
        let (dtx, drx) = mpsc::unbounded_channel();
        self.detect_rx = Some(drx);
        let mc = opts.config.membership;
        let ranks = (rank, opts.config.topo.parent(opts.size, rank));
        match super::detect::Detectors::start(&opts.config, &opts.instance, ip, owner, ranks, &mc, dtx) {
            Ok(d) => self.detect = Some(d),
            Err(e) => warn!("failure detectors unavailable ({e}); membership relies on TCP alone"),
        }
        // The loop of the machine's detector owner is where its verdicts are made: it must run when the CPUs are
        // saturated (priority.rs). Other brokers of a test instance share the machine with it at normal priority.
        if owner {
            self.loop_priority = Some(super::priority::raise_loop());
        }
    }

    /// Act on what the detectors report: the I/O side here (watching links, re-queuing kernel TCP events behind
    /// unread data), the verdicts in the broker.
    fn on_detect(&mut self, d: super::detect::DetectInput, requeued: bool) {
        use super::detect::{DetectInput, ProbeCmd};
        use vigil_ebpf::TcpEventKind;
        match d {
            DetectInput::Loaded(l) => {
                let required = l.required_failed.clone();
                let Some(det) = self.detect.as_mut() else { return };
                det.loaded(*l);
                // Links that connected while loading.
                for (r, c) in self.children.iter_mut() {
                    c.tuple = c.sock.as_ref().and_then(|s| det.watch_link(*r, s));
                }
                self.parent_tuple = self.parent_sock.as_ref().and_then(|s| det.watch_link(PARENT, s));
                self.detect_generation += 1;
                self.refresh_status();
                if let Some(why) = required {
                    self.step(Input::DetectorsFailed(why));
                }
            }
            DetectInput::Exit(ev) => {
                let pid = ev.pid;
                if self.detect.as_mut().is_some_and(|d| d.on_exit(pid)) {
                    info!("broker process {pid} on this machine exited ({:?}); the responder now says so", ev.status);
                }
                if self.watched.remove(&pid) {
                    let (code, signal) = match ev.status {
                        vigil_ebpf::ExitStatus::Exited(c) => (Some(c), None),
                        vigil_ebpf::ExitStatus::Signaled { signal, .. } => (None, Some(signal)),
                        vigil_ebpf::ExitStatus::Unknown => (None, None),
                    };
                    let body = json!({"pid": pid, "exit_code": code, "signal": signal,
                        "oom_killed": ev.oom_killed, "sender_pid": ev.sender_pid, "ktime_ns": ev.ktime_ns,
                        "source": format!("{:?}", ev.source)});
                    self.step_timed(Input::ProcessExit(pid, body), Some(ev.ktime_ns));
                }
            }
            DetectInput::WatchFailed(pid, why) => {
                if self.watched.remove(&pid) {
                    self.step(Input::WatchFailed(pid, errno::ESRCH, why));
                }
            }
            DetectInput::Tcp(rank, ev) => {
                if let TcpEventKind::Retransmit { .. } = ev.kind {
                    // A retransmission on a link: is its node there? Probe it now (the parent too).
                    if let Some(d) = self.detect.as_ref() {
                        d.prober_cmd(ProbeCmd::Now(rank));
                    }
                    return;
                }
                // A goodbye may still be in the socket or in our input queue: let it pass first, so a clean
                // departure is never mistaken for a loss.
                if !requeued {
                    let tx = self.input_tx.clone();
                    let sock_has_data = if rank == PARENT {
                        self.parent_sock.as_ref().is_some_and(super::detect::unread_bytes)
                    } else {
                        self.children.get(&rank).and_then(|c| c.sock.as_ref()).is_some_and(super::detect::unread_bytes)
                    };
                    let again = Event::Detect(DetectInput::Tcp(rank, ev), true);
                    if sock_has_data {
                        tokio::spawn(async move {
                            tokio::time::sleep(Duration::from_millis(1)).await;
                            let _ = tx.send(again);
                        });
                    } else {
                        let _ = tx.send(again);
                    }
                    return;
                }
                // What the link's reader already has (a goodbye) goes to the broker before the kernel's verdict.
                let peer = if rank == PARENT { Peer::Parent } else { Peer::Child(rank) };
                while let Some(e) = self.links.try_next(Some(peer)) {
                    self.on_event(e);
                }
                let why = match ev.kind {
                    TcpEventKind::Reset => "connection reset (kernel TCP event)".to_string(),
                    k => format!("connection closed (kernel TCP event {k:?})"),
                };
                if rank == PARENT {
                    if self.parent.is_some() {
                        self.step_timed(Input::Closed(Peer::Parent, 0, why), Some(ev.ktime_ns));
                    }
                } else if let Some(conn) = self.children.get(&rank).map(|c| c.conn) {
                    self.step_timed(Input::Closed(Peer::Child(rank), conn, why), Some(ev.ktime_ns));
                } else {
                    self.time_late(rank, ev.ktime_ns);
                }
            }
            DetectInput::Fabric { rank, missed, mgmt_ok } => {
                let verdict = self.detect.as_mut().and_then(|d| d.on_fabric(rank, missed, mgmt_ok));
                if let Some(v) = verdict {
                    self.fabric_verdict(v);
                }
            }
            DetectInput::Probe(rank, sig, sent, event_ns) => {
                let late = sent.elapsed().as_secs_f64();
                self.report_delay.observe(late);
                if late > 0.1 && matches!(sig, vigil_core::membership::Signal::ProbeMissed { .. }) {
                    debug!(
                        "probe miss of child rank {rank} reached the loop {:.0} ms after the prober sent it",
                        late * 1e3
                    );
                }
                self.step_timed(Input::Probe(rank, sig), event_ns)
            }
        }
    }

    /// After the loop: stop the detectors, end what this broker started, remove its files.
    fn cleanup(&mut self) {
        // The store's connections closed, the writer's last (see [`Writer::stop`]).
        if let Some(s) = self.syncer.take() {
            s.stop();
        }
        if let Some(w) = self.writer.take() {
            w.stop();
        }
        if let Some(d) = self.detect.as_mut() {
            d.shutdown();
        }
        // A health check under way goes with its broker, and whatever it started.
        super::health::stop();
        if let Some(pg) = self.initial_pgid.take() {
            // Whatever the initial program left behind (background jobs) ends with the instance; an empty group
            // (the usual case: the program exited and left nothing) costs no grace period.
            let pg = nix::unistd::Pid::from_raw(pg);
            if nix::sys::signal::killpg(pg, nix::sys::signal::Signal::SIGTERM).is_ok() {
                std::thread::sleep(Duration::from_millis(50));
                let _ = nix::sys::signal::killpg(pg, nix::sys::signal::Signal::SIGKILL);
            }
        }
        self.shells.close();
        if let super::cgroup::Containment::Cgroup(c) = self.containment.as_ref() {
            c.remove();
        }
        let rank = self.broker.rank();
        let rundir = &self.broker.opts.rundir;
        let _ = std::fs::remove_file(rundir.join(format!("local-{rank}")));
        let _ = std::fs::remove_file(rundir.join(format!("topology-{rank}.xml")));
        // Job directories of shells that were killed with the instance.
        if let Ok(rd) = std::fs::read_dir(rundir) {
            for e in rd.flatten() {
                let n = e.file_name();
                let n = n.to_string_lossy();
                if n.starts_with('j') && n.contains('.') && e.path().is_dir() {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
    }
}
