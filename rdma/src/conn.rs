//! Reliable-connected message connections: set-up over an existing channel, credit-based flow control,
//! fragmentation, completions into tokio.
//!
//! # Set-up
//! [`Endpoint::prepare`] creates the QP and buffers and returns a [`LocalInfo`] to send to the peer over any
//! existing channel (Vigil uses the overlay's TCP connection). The side that receives the first `LocalInfo`
//! calls [`Prepared::accept`] with it (its QP is then ready to receive) and answers with its own `LocalInfo`;
//! the other side calls [`Prepared::connect`] with the answer. The accepting side sends nothing until the first
//! packet of the connecting side arrives (a READY marker the connecting side sends at once), so no packet
//! reaches a QP that is not ready to receive it (which would cost a retry and, with `retry_cnt` 1, could fail
//! the connection).
//!
//! # Wire protocol over the QP
//! Every packet is one SEND_WITH_IMM of at most the smaller of both sides' fragment sizes. The 32-bit immediate
//! value carries:
//! - bits 0-23: credits returned to the receiver of this packet (receive buffers freed on the sender's side);
//! - bit 24 `MORE`: a fragment of a message that continues in the next packet;
//! - bit 25 `CREDIT`, bit 26 `READY`, bit 27 `CLOSE`: control packets without payload (credit update,
//!   connection ready, orderly close).
//!
//! # Flow control
//! Each side keeps `depth + CTRL_SLOTS` receives posted and grants the peer `depth` credits. A data fragment
//! costs the sender one credit. The receiver returns a credit when the fragment's buffer is free again: at
//! once for a fragment in the middle of a message (it was copied into the message being assembled), and for
//! the last fragment of a message only when the application has taken the message ([`Receiver::recv`]). So a
//! slow receiver holds at most `depth` unconsumed messages and the sender waits ([`Sender::send`] blocks).
//! Credits travel in every packet's immediate value; when half the ring is owed and nothing is going the
//! other way, a credit-only packet is sent (these use the control receive slots, never a data credit).
//!
//! # Completions
//! One completion queue per connection, bound to its own completion channel whose descriptor is registered
//! with tokio (`AsyncFd`). After each channel event the CQ is re-armed (`ibv_req_notify_cq`) *before* it is
//! drained to empty, so a completion that arrives during the drain raises a new event: no wake-up is lost.
//! [`Config::busy_poll`] replaces this with a polling loop for latency measurements. The device context's
//! async event descriptor is watched the same way: a fatal QP event or the port going down ends the
//! connection with [`ConnError::AsyncEvent`].

use crate::config::{Config, ConfigError};
use crate::device::Device;
use crate::verbs::{self, Buffer, CompChannel, Context, Cq, CqEvent, Pd, Qp, QpPath};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::net::Ipv6Addr;
use std::sync::{Arc, Mutex};
use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc;
use tracing::debug;

/// Version of the QP wire protocol described in the module docs; peers with another version are refused.
pub const PROTOCOL_VERSION: u32 = 1;

/// Receive slots kept beyond `depth` for control packets (credit updates, READY, CLOSE).
const CTRL_SLOTS: u32 = 8;
const CREDIT_MASK: u32 = 0x00FF_FFFF;
const F_MORE: u32 = 1 << 24;
const F_CREDIT: u32 = 1 << 25;
const F_READY: u32 = 1 << 26;
const F_CLOSE: u32 = 1 << 27;
const CONTROL: u32 = F_CREDIT | F_READY | F_CLOSE;
/// `wr_id` tag of receive work requests (send work requests carry the bare slot index).
const RECV_TAG: u64 = 1 << 32;
/// Completions polled per `ibv_poll_cq` call.
const POLL_BATCH: usize = 32;

/// What one side tells the other to connect an RC QP pair (serialised as JSON over the existing channel).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocalInfo {
    /// [`PROTOCOL_VERSION`] of the sender.
    pub version: u32,
    /// QP number (24 bits).
    pub qpn: u32,
    /// Initial packet sequence number of the sender's send queue (24 bits).
    pub psn: u32,
    /// GID of the sender's port (for RoCE over IPv4: `::ffff:a.b.c.d`).
    pub gid: Ipv6Addr,
    /// LID of the sender's port (0 on RoCE).
    pub lid: u16,
    /// Active MTU of the sender's port, bytes.
    pub mtu: u32,
    /// Credits granted to the peer: receive buffers for data fragments.
    pub depth: u32,
    /// Size of each receive buffer, bytes: the peer's fragments are at most this long.
    pub frag_size: u32,
    /// Largest message the sender accepts, bytes.
    pub max_message: u64,
}

/// The peer's [`LocalInfo`].
pub type RemoteInfo = LocalInfo;

/// Why a connection could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A verbs call failed (the message names it).
    #[error("rdma set-up on {device}: {source}")]
    Verbs {
        /// Device name.
        device: String,
        /// The failed call and its errno.
        source: std::io::Error,
    },
    /// The peer's [`RemoteInfo`] is unusable.
    #[error("peer's rdma connection info is invalid: {0}")]
    BadRemote(String),
}

/// Why a connection ended. Every variant is a reason to consider the peer lost (except [`ConnError::Closed`],
/// the local side's own doing, and [`ConnError::PeerClosed`], an orderly close).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConnError {
    /// A work request completed in error: the QP is in the error state. `RETRY_EXC_ERR` means the peer stopped
    /// acknowledging (dead node, cut link, destroyed QP); `LOC_QP_OP_ERR` often means the local link went down.
    #[error("rdma {op} failed: {status_str} (IBV_WC_{name}, status {status}, vendor error {vendor_err:#x})")]
    WorkCompletion {
        /// "send" or "receive".
        op: &'static str,
        /// `ibv_wc_status` value.
        status: u32,
        /// Its symbolic name without the `IBV_WC_` prefix.
        name: &'static str,
        /// `ibv_wc_status_str`.
        status_str: String,
        /// Vendor error code.
        vendor_err: u32,
    },
    /// An asynchronous device event hit this connection's QP, CQ, port or device.
    #[error("rdma async event {event} on {device}")]
    AsyncEvent {
        /// `IBV_EVENT_*` name.
        event: &'static str,
        /// Device name.
        device: String,
    },
    /// The peer closed the connection in order.
    #[error("peer closed the rdma connection")]
    PeerClosed,
    /// The peer broke the wire protocol (the connection is dropped, never the process).
    #[error("rdma protocol error: {0}")]
    Protocol(String),
    /// A verbs call failed while the connection ran.
    #[error("rdma i/o error: {0}")]
    Io(String),
    /// A message larger than the peer accepts.
    #[error("message of {len} bytes exceeds the peer's limit of {max} bytes")]
    TooLarge {
        /// Message length, bytes.
        len: u64,
        /// The peer's `max_message`, bytes.
        max: u64,
    },
    /// This side closed the connection.
    #[error("rdma connection closed")]
    Closed,
}

/// Entry point of connection set-up.
#[derive(Debug, Clone, Copy)]
pub struct Endpoint;

impl Endpoint {
    /// Create the verbs resources for one connection on `device` (open context, protection domain, completion
    /// channel and queue, RC QP in the RESET state, registered send and receive rings) and return them with
    /// the [`LocalInfo`] to send to the peer.
    pub fn prepare(device: &Device, cfg: Config) -> Result<(Prepared, LocalInfo), SetupError> {
        cfg.validate()?;
        let verr = |source: std::io::Error| SetupError::Verbs { device: device.name.clone(), source };
        let ctx = Context::open(&device.name).map_err(verr)?;
        let pd = Pd::new(&ctx).map_err(verr)?;
        let chan = CompChannel::new(&ctx).map_err(verr)?;
        let slots = cfg.depth + CTRL_SLOTS;
        let cq = Cq::new(&ctx, &chan, (2 * slots + 4) as i32).map_err(verr)?;
        let qp = Qp::new_rc(&pd, &cq, slots, slots).map_err(verr)?;
        let frag = cfg.frag_size as usize;
        let send_buf = Buffer::new(&pd, frag * slots as usize).map_err(verr)?;
        let recv_buf = Buffer::new(&pd, frag * slots as usize).map_err(verr)?;
        verbs::set_nonblocking(ctx.async_fd()).map_err(verr)?;
        let info = LocalInfo {
            version: PROTOCOL_VERSION,
            qpn: qp.qpn(),
            psn: random_u32() & CREDIT_MASK,
            gid: device.gid,
            lid: device.lid,
            mtu: device.mtu,
            depth: cfg.depth,
            frag_size: cfg.frag_size,
            max_message: cfg.max_message,
        };
        let res = Resources { qp, send_buf, recv_buf, cq, chan, _pd: pd, ctx };
        Ok((Prepared { res, cfg, device: device.clone(), local: info.clone() }, info))
    }
}

fn random_u32() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0));
    h.finish() as u32
}

/// The verbs objects of one connection. Fields drop in declaration order: the QP first (ending every work
/// request), then the registered buffers those requests pointed into, then the CQ, channel, PD and context.
struct Resources {
    qp: Qp,
    send_buf: Buffer,
    recv_buf: Buffer,
    cq: Arc<Cq>,
    chan: Arc<CompChannel>,
    _pd: Arc<Pd>,
    ctx: Arc<Context>,
}

/// Verbs resources waiting for the peer's [`RemoteInfo`].
pub struct Prepared {
    res: Resources,
    cfg: Config,
    device: Device,
    local: LocalInfo,
}

impl std::fmt::Debug for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prepared").field("device", &self.device.name).field("local", &self.local).finish()
    }
}

/// Check what a peer sent before using it.
fn check_remote(r: &RemoteInfo) -> Result<(), SetupError> {
    let bad = |s: String| Err(SetupError::BadRemote(s));
    if r.version != PROTOCOL_VERSION {
        return bad(format!("protocol version {} (this side speaks {PROTOCOL_VERSION})", r.version));
    }
    if r.qpn == 0 || r.qpn > CREDIT_MASK {
        return bad(format!("QP number {}", r.qpn));
    }
    if r.psn > CREDIT_MASK {
        return bad(format!("PSN {}", r.psn));
    }
    if !(2..=4096).contains(&r.depth) {
        return bad(format!("ring depth {}", r.depth));
    }
    if !(256..=1 << 20).contains(&r.frag_size) {
        return bad(format!("fragment size {}", r.frag_size));
    }
    if !(256..=4096).contains(&r.mtu) {
        return bad(format!("MTU {}", r.mtu));
    }
    if r.max_message == 0 {
        return bad("max_message 0".into());
    }
    Ok(())
}

impl Prepared {
    /// The info that was returned by [`Endpoint::prepare`].
    pub fn local_info(&self) -> &LocalInfo {
        &self.local
    }

    /// Passive side: connect to `remote` (the first info exchanged) and return the connection; then send our
    /// [`LocalInfo`] to the peer. Nothing is sent on the QP until the peer's first packet arrives.
    /// Must be called inside a tokio runtime.
    pub fn accept(self, remote: &RemoteInfo) -> Result<Connection, SetupError> {
        self.start(remote, false)
    }

    /// Active side: connect to `remote` (the peer's answer, sent after it called [`Prepared::accept`]); sends a
    /// READY packet at once. Must be called inside a tokio runtime.
    pub fn connect(self, remote: &RemoteInfo) -> Result<Connection, SetupError> {
        self.start(remote, true)
    }

    fn start(self, remote: &RemoteInfo, active: bool) -> Result<Connection, SetupError> {
        check_remote(remote)?;
        let Prepared { res, cfg, device, local } = self;
        let verr = |source: std::io::Error| SetupError::Verbs { device: device.name.clone(), source };
        let path = QpPath {
            port: device.port,
            sgid_index: device.gid_index,
            dgid: remote.gid.octets(),
            dlid: remote.lid,
            dest_qpn: remote.qpn,
            rq_psn: remote.psn,
            sq_psn: local.psn,
            mtu: verbs::mtu_code(remote.mtu.min(device.mtu)),
        };
        res.qp.connect(&path, &cfg).map_err(verr)?;
        let frag = cfg.frag_size;
        let slots = cfg.depth + CTRL_SLOTS;
        for i in 0..slots {
            res.qp.post_recv(RECV_TAG | i as u64, &res.recv_buf, i as usize * frag as usize, frag).map_err(verr)?;
        }
        let comp_fd = if cfg.busy_poll {
            None
        } else {
            res.cq.req_notify().map_err(verr)?;
            Some(register_fd(res.chan.fd()).map_err(verr)?)
        };
        let async_fd = register_fd(res.ctx.async_fd()).map_err(verr)?;

        let shared =
            Arc::new(Shared { error: Mutex::new(None), abort: false.into(), abort_notify: tokio::sync::Notify::new() });
        let (cmd_tx, cmd_rx) = mpsc::channel::<Vec<u8>>(1);
        let (credit_tx, credit_rx) = mpsc::unbounded_channel::<u32>();
        let (deliver_tx, deliver_rx) = mpsc::unbounded_channel::<Result<Vec<u8>, ConnError>>();
        let send_frag = frag.min(remote.frag_size) as usize;
        let driver = Driver {
            comp_fd,
            async_fd,
            slots,
            frag: frag as usize,
            send_frag,
            send_credits: remote.depth,
            max_credits: remote.depth,
            owed: 0,
            credit_threshold: (cfg.depth / 2).max(1),
            free_slots: (0..slots).rev().collect(),
            in_flight: VecDeque::new(),
            since_signal: 0,
            pending: VecDeque::new(),
            assembling: Vec::new(),
            max_message: cfg.max_message,
            ready: active,
            send_ready: active,
            sender_open: true,
            receiver_open: true,
            close_sent: false,
            peer_closed: false,
            deliver: deliver_tx,
            cmd_rx,
            credit_rx,
            shared: shared.clone(),
            port: device.port,
            device: device.name.clone(),
            idle_passes: 0,
            res,
        };
        debug!(device = %device.name, qpn = local.qpn, remote_qpn = remote.qpn, active, "rdma connection up");
        tokio::spawn(driver.run());
        Ok(Connection {
            sender: Sender { tx: cmd_tx, shared: shared.clone(), max: remote.max_message },
            receiver: Receiver { rx: deliver_rx, credit_tx, shared },
            local,
            remote: remote.clone(),
            device,
        })
    }
}

/// A connected RC QP pair, split into its two directions with [`Connection::split`].
#[derive(Debug)]
pub struct Connection {
    sender: Sender,
    receiver: Receiver,
    /// This side's connection info.
    pub local: LocalInfo,
    /// The peer's connection info.
    pub remote: RemoteInfo,
    /// The device, port and GID this side uses.
    pub device: Device,
}

impl Connection {
    /// Split into a sender and a receiver. The connection closes (a CLOSE packet, then the QP is destroyed)
    /// once both are dropped; it ends at once on an error.
    pub fn split(self) -> (Sender, Receiver) {
        (self.sender, self.receiver)
    }
}

impl Sender {
    /// Destroy the QP at once, without a CLOSE packet: to the peer this looks like a crashed process (its next
    /// send fails with `IBV_WC_RETRY_EXC_ERR`). The receiver then reports [`ConnError::Closed`].
    pub fn abort(self) {
        self.shared.abort.store(true, std::sync::atomic::Ordering::SeqCst);
        self.shared.abort_notify.notify_one();
    }
}

struct Shared {
    error: Mutex<Option<ConnError>>,
    abort: std::sync::atomic::AtomicBool,
    abort_notify: tokio::sync::Notify,
}

impl Shared {
    fn error(&self) -> ConnError {
        self.error.lock().ok().and_then(|e| e.clone()).unwrap_or(ConnError::Closed)
    }
}

/// Sending half: whole messages, fragmented and flow-controlled.
pub struct Sender {
    tx: mpsc::Sender<Vec<u8>>,
    shared: Arc<Shared>,
    max: u64,
}

impl std::fmt::Debug for Sender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sender").field("max_message", &self.max).finish()
    }
}

impl Sender {
    /// Queue one message for the peer. Waits while the peer has no room (no credits); fails once the
    /// connection has ended, with the reason.
    pub async fn send(&self, msg: Vec<u8>) -> Result<(), ConnError> {
        if msg.len() as u64 > self.max {
            return Err(ConnError::TooLarge { len: msg.len() as u64, max: self.max });
        }
        self.tx.send(msg).await.map_err(|_| self.shared.error())
    }

    /// Largest message the peer accepts, bytes.
    pub fn max_message(&self) -> u64 {
        self.max
    }
}

/// Receiving half: whole messages in order, then one error saying why the connection ended.
pub struct Receiver {
    rx: mpsc::UnboundedReceiver<Result<Vec<u8>, ConnError>>,
    credit_tx: mpsc::UnboundedSender<u32>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Receiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Receiver").finish()
    }
}

impl Receiver {
    /// The next message, or why the connection ended ([`ConnError::PeerClosed`] after an orderly close).
    /// Taking a message returns its credit to the peer.
    pub async fn recv(&mut self) -> Result<Vec<u8>, ConnError> {
        match self.rx.recv().await {
            Some(Ok(m)) => {
                let _ = self.credit_tx.send(1);
                Ok(m)
            }
            Some(Err(e)) => Err(e),
            None => Err(self.shared.error()),
        }
    }
}

/// A descriptor owned by a verbs object, registered with tokio.
struct Fd(i32);
impl std::os::fd::AsRawFd for Fd {
    fn as_raw_fd(&self) -> i32 {
        self.0
    }
}

/// Register a verbs object's descriptor with tokio for readability.
fn register_fd(fd: i32) -> std::io::Result<AsyncFd<Fd>> {
    // SAFETY: `fd` belongs to the completion channel or device context in the connection's `Resources`, which
    // the `Driver` owns and drops only after its `AsyncFd`s (field order), so the descriptor stays open and
    // unchanged for the whole life of the `AsyncFd`.
    unsafe { AsyncFd::register_with_interest(Fd(fd), tokio::io::Interest::READABLE) }.map_err(|e| e.into_parts().1)
}

/// The task that owns a connection's QP and CQ.
struct Driver {
    // The AsyncFds are deregistered from the reactor before the descriptors close with `res`.
    comp_fd: Option<AsyncFd<Fd>>,
    async_fd: AsyncFd<Fd>,
    slots: u32,
    frag: usize,
    send_frag: usize,
    /// Data fragments we may still send.
    send_credits: u32,
    max_credits: u32,
    /// Credits to return to the peer.
    owed: u32,
    credit_threshold: u32,
    free_slots: Vec<u32>,
    /// Messages waiting for credits, with the offset of their next fragment.
    pending: VecDeque<(Vec<u8>, usize)>,
    assembling: Vec<u8>,
    max_message: u64,
    /// We may send data (the active side at once; the passive side after the peer's first packet).
    ready: bool,
    /// The READY packet still has to be sent (active side).
    send_ready: bool,
    sender_open: bool,
    receiver_open: bool,
    close_sent: bool,
    peer_closed: bool,
    deliver: mpsc::UnboundedSender<Result<Vec<u8>, ConnError>>,
    cmd_rx: mpsc::Receiver<Vec<u8>>,
    credit_rx: mpsc::UnboundedReceiver<u32>,
    shared: Arc<Shared>,
    port: u8,
    device: String,
    /// Busy-poll passes without work since the last async event check.
    idle_passes: u32,
    /// Send slots posted and not yet known complete, in post order, with whether each was signaled.
    in_flight: VecDeque<(u32, bool)>,
    /// Unsignaled sends posted since the last signaled one.
    since_signal: u32,
    res: Resources,
}

enum Step {
    Continue,
    Done,
}

impl Driver {
    async fn run(mut self) {
        let r = self.run_inner().await;
        if let Err(e) = r {
            debug!(device = %self.device, "rdma connection ended: {e}");
            if let Ok(mut g) = self.shared.error.lock() {
                g.get_or_insert(e.clone());
            }
            let _ = self.deliver.send(Err(e));
            // Flush outstanding work requests before the QP is destroyed (clean teardown after an error).
            let _ = self.res.qp.set_error();
        }
        // `self` drops here: AsyncFds, then QP, buffers, CQ, channel, PD, context.
    }

    async fn run_inner(&mut self) -> Result<(), ConnError> {
        if self.comp_fd.is_some() {
            // Armed in `start`; completions that came before are drained now.
            self.drain_cq()?;
        }
        loop {
            if self.shared.abort.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(ConnError::Closed);
            }
            self.progress()?;
            if let Step::Done = self.check_done() {
                return Ok(());
            }
            if self.comp_fd.is_none() {
                self.busy_step().await?;
                continue;
            }
            let accept_cmd = self.sender_open && self.pending.is_empty();
            let comp = self.comp_fd.as_ref().expect("event mode");
            tokio::select! {
                biased;
                _ = self.shared.abort_notify.notified() => {}
                r = comp.readable() => {
                    let mut g = r.map_err(|e| ConnError::Io(e.to_string()))?;
                    while let CqEvent::Event = self.res.cq.take_event().map_err(|e| ConnError::Io(e.to_string()))? {}
                    g.clear_ready();
                    // Re-arm first, then drain to empty: a completion after the drain raises a new event.
                    self.res.cq.req_notify().map_err(|e| ConnError::Io(e.to_string()))?;
                    self.drain_cq()?;
                }
                r = self.async_fd.readable() => {
                    let mut g = r.map_err(|e| ConnError::Io(e.to_string()))?;
                    let ev = self.take_async_events();
                    g.clear_ready();
                    ev?;
                }
                c = self.credit_rx.recv(), if self.receiver_open => match c {
                    Some(n) => self.owed += n,
                    None => self.receiver_open = false,
                },
                m = self.cmd_rx.recv(), if accept_cmd => match m {
                    Some(m) => self.pending.push_back((m, 0)),
                    None => self.sender_open = false,
                },
            }
        }
    }

    /// Busy-poll mode: one pass over every source, yielding to tokio when idle.
    async fn busy_step(&mut self) -> Result<(), ConnError> {
        let mut did = self.drain_cq()? > 0;
        while self.receiver_open {
            match self.credit_rx.try_recv() {
                Ok(n) => {
                    self.owed += n;
                    did = true;
                }
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => self.receiver_open = false,
            }
        }
        if self.sender_open && self.pending.is_empty() {
            match self.cmd_rx.try_recv() {
                Ok(m) => {
                    self.pending.push_back((m, 0));
                    did = true;
                }
                Err(mpsc::error::TryRecvError::Empty) => {}
                Err(mpsc::error::TryRecvError::Disconnected) => self.sender_open = false,
            }
        }
        // Checking the async event descriptor costs a system call: do it every 64 idle passes only.
        self.idle_passes = if did { 0 } else { self.idle_passes.wrapping_add(1) };
        if self.idle_passes % 64 == 63 {
            self.take_async_events()?;
        }
        if !did {
            tokio::task::yield_now().await;
        }
        Ok(())
    }

    fn take_async_events(&self) -> Result<(), ConnError> {
        loop {
            let ev = verbs::take_async_event(&self.res.ctx).map_err(|e| ConnError::Io(e.to_string()))?;
            let Some((ty, element)) = ev else { return Ok(()) };
            let name = verbs::event_type_str(ty);
            let ours = match ty {
                // QP events: element is the QP pointer.
                1..=3 => element == self.res.qp.as_ptr() as u64,
                // CQ error: element is the CQ pointer.
                0 => element == self.res.cq.as_ptr() as u64,
                // Port down: element is the port number.
                10 => element as u32 == self.port as u32,
                8 => true,
                _ => false,
            };
            if ours {
                return Err(ConnError::AsyncEvent { event: name, device: self.device.clone() });
            }
            debug!(device = %self.device, "rdma async event {name} (not fatal here)");
        }
    }

    /// Poll the CQ to empty; returns the number of completions handled.
    fn drain_cq(&mut self) -> Result<usize, ConnError> {
        // SAFETY: ibv_wc is plain old data (integers and a union of integers); zero is a valid value.
        let mut wc: [rdma_sys::ibv_wc; POLL_BATCH] = unsafe { std::mem::zeroed() };
        let mut total = 0;
        loop {
            let n = self.res.cq.poll(&mut wc).map_err(|e| ConnError::Io(e.to_string()))?;
            for w in &wc[..n] {
                self.on_completion(w)?;
            }
            total += n;
            if n < POLL_BATCH {
                return Ok(total);
            }
        }
    }

    fn on_completion(&mut self, w: &rdma_sys::ibv_wc) -> Result<(), ConnError> {
        let is_recv = w.wr_id & RECV_TAG != 0;
        if w.status != rdma_sys::ibv_wc_status::IBV_WC_SUCCESS {
            return Err(ConnError::WorkCompletion {
                op: if is_recv { "receive" } else { "send" },
                status: w.status,
                name: wc_status_name(w.status),
                status_str: verbs::wc_status_str(w.status),
                vendor_err: w.vendor_err,
            });
        }
        let slot = (w.wr_id & 0xFFFF_FFFF) as u32;
        if slot >= self.slots {
            return Err(ConnError::Io(format!("completion for unknown slot {slot}")));
        }
        if !is_recv {
            // Only signaled sends complete; everything posted before this one is done too.
            while let Some((s, _)) = self.in_flight.pop_front() {
                self.free_slots.push(s);
                if s == slot {
                    break;
                }
            }
            return Ok(());
        }
        if w.wc_flags & rdma_sys::ibv_wc_flags::IBV_WC_WITH_IMM.0 == 0 {
            return Err(ConnError::Protocol("packet without immediate data".into()));
        }
        // SAFETY: IBV_WC_WITH_IMM is set, so the union holds the immediate value.
        let imm = u32::from_be(unsafe { w.imm_data_invalidated_rkey_union.imm_data });
        let len = w.byte_len as usize;
        if len > self.frag {
            return Err(ConnError::Protocol(format!("packet of {len} bytes exceeds the {}-byte fragment", self.frag)));
        }
        let credits = imm & CREDIT_MASK;
        self.send_credits = self.send_credits.saturating_add(credits);
        if self.send_credits > self.max_credits {
            return Err(ConnError::Protocol(format!(
                "peer returned more credits ({}) than it granted ({})",
                self.send_credits, self.max_credits
            )));
        }
        // Any packet from the peer means its QP is ready: the passive side may send from now on.
        self.ready = true;
        if imm & CONTROL != 0 {
            if len != 0 || imm & F_MORE != 0 {
                return Err(ConnError::Protocol("control packet with payload".into()));
            }
            if imm & F_CLOSE != 0 {
                self.peer_closed = true;
                let _ = self.deliver.send(Err(ConnError::PeerClosed));
            }
        } else {
            if self.peer_closed {
                return Err(ConnError::Protocol("data after close".into()));
            }
            if (self.assembling.len() + len) as u64 > self.max_message {
                return Err(ConnError::Protocol(format!("message longer than the {}-byte limit", self.max_message)));
            }
            let off = slot as usize * self.frag;
            // SAFETY: the receive for this slot completed, so the device no longer writes to
            // [off, off+len), which lies inside the registered receive buffer (len <= frag checked above).
            let data = unsafe { std::slice::from_raw_parts(self.res.recv_buf.addr().add(off), len) };
            self.assembling.extend_from_slice(data);
            if imm & F_MORE != 0 {
                // Copied: the buffer is free again, return its credit now.
                self.owed += 1;
            } else {
                let m = std::mem::take(&mut self.assembling);
                if !self.receiver_open || self.deliver.send(Ok(m)).is_err() {
                    self.receiver_open = false;
                    self.owed += 1;
                }
            }
        }
        // Every receive slot is reposted at once; credits (not slots) bound what the peer may send.
        self.res
            .qp
            .post_recv(RECV_TAG | slot as u64, &self.res.recv_buf, slot as usize * self.frag, self.frag as u32)
            .map_err(|e| ConnError::Io(e.to_string()))
    }

    /// Send what credits and slots allow: READY, data fragments, a credit update, CLOSE.
    fn progress(&mut self) -> Result<(), ConnError> {
        if self.send_ready {
            if self.post_control(F_READY)? {
                self.send_ready = false;
            } else {
                return Ok(());
            }
        }
        if self.ready {
            // Keep one slot for a control packet.
            while self.send_credits > 0 && self.free_slots.len() > 1 {
                let Some((msg, off)) = self.pending.front_mut() else { break };
                let end = (*off + self.send_frag).min(msg.len());
                let more = end < msg.len();
                let slot = self.free_slots.pop().expect("checked");
                let so = slot as usize * self.frag;
                let n = end - *off;
                // SAFETY: `slot` is free (its previous send completed), so the device does not read it; the
                // copy stays inside the registered send buffer (n <= send_frag <= frag).
                unsafe {
                    std::ptr::copy_nonoverlapping(msg.as_ptr().add(*off), self.res.send_buf.addr().add(so), n);
                }
                *off = end;
                if !more {
                    self.pending.pop_front();
                }
                let credits = self.owed.min(CREDIT_MASK);
                let imm = credits | if more { F_MORE } else { 0 };
                self.post(slot, so, n as u32, imm, false)?;
                self.owed -= credits;
                self.send_credits -= 1;
            }
        }
        if self.owed >= self.credit_threshold {
            self.post_control(F_CREDIT)?;
        }
        if !self.sender_open
            && self.pending.is_empty()
            && !self.close_sent
            && self.ready
            && !self.peer_closed
            && self.post_control(F_CLOSE)?
        {
            self.close_sent = true;
        }
        Ok(())
    }

    /// Post a control packet carrying the owed credits; false when no send slot is free.
    fn post_control(&mut self, flag: u32) -> Result<bool, ConnError> {
        let Some(slot) = self.free_slots.pop() else { return Ok(false) };
        let credits = self.owed.min(CREDIT_MASK);
        // READY and CLOSE are signaled: every earlier send is then known complete (teardown waits for it).
        self.post(slot, slot as usize * self.frag, 0, flag | credits, flag & (F_CLOSE | F_READY) != 0)?;
        self.owed -= credits;
        Ok(true)
    }

    /// Post a send from `slot`. Sends are signaled only every half ring, when slots run low, or when `force`d:
    /// an unsignaled send costs no completion and no wake-up (a ping-pong then wakes once per message
    /// instead of twice); its slot is freed by the next signaled completion.
    fn post(&mut self, slot: u32, off: usize, len: u32, imm: u32, force: bool) -> Result<(), ConnError> {
        let signaled = force || self.since_signal + 1 >= (self.slots / 2).max(1) || self.free_slots.len() <= 2;
        self.res
            .qp
            .post_send(slot as u64, &self.res.send_buf, off, len, imm, signaled)
            .map_err(|e| ConnError::Io(e.to_string()))?;
        self.in_flight.push_back((slot, signaled));
        self.since_signal = if signaled { 0 } else { self.since_signal + 1 };
        Ok(())
    }

    fn check_done(&self) -> Step {
        // Unsignaled sends are known complete only through a later signaled one (our CLOSE); once the peer has
        // closed, nothing will follow them, and destroying the QP flushes them.
        let sends_done = self.in_flight.is_empty() || (self.peer_closed && self.in_flight.iter().all(|x| !x.1));
        let sending_done = !self.sender_open && self.pending.is_empty() && (self.close_sent || self.peer_closed);
        if sending_done && sends_done && (!self.receiver_open || self.peer_closed) {
            return Step::Done;
        }
        // Both halves gone before the peer was ready: nothing more can happen.
        if !self.sender_open && !self.receiver_open && !self.ready && sends_done {
            return Step::Done;
        }
        Step::Continue
    }
}

/// Symbolic name of an `ibv_wc_status` (without the `IBV_WC_` prefix).
pub fn wc_status_name(status: u32) -> &'static str {
    const NAMES: [&str; 22] = [
        "SUCCESS",
        "LOC_LEN_ERR",
        "LOC_QP_OP_ERR",
        "LOC_EEC_OP_ERR",
        "LOC_PROT_ERR",
        "WR_FLUSH_ERR",
        "MW_BIND_ERR",
        "BAD_RESP_ERR",
        "LOC_ACCESS_ERR",
        "REM_INV_REQ_ERR",
        "REM_ACCESS_ERR",
        "REM_OP_ERR",
        "RETRY_EXC_ERR",
        "RNR_RETRY_EXC_ERR",
        "LOC_RDD_VIOL_ERR",
        "REM_INV_RD_REQ_ERR",
        "REM_ABORT_ERR",
        "INV_EECN_ERR",
        "INV_EEC_STATE_ERR",
        "FATAL_ERR",
        "RESP_TIMEOUT_ERR",
        "GENERAL_ERR",
    ];
    NAMES.get(status as usize).copied().unwrap_or("UNKNOWN")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info() -> LocalInfo {
        LocalInfo {
            version: PROTOCOL_VERSION,
            qpn: 17,
            psn: 5,
            gid: "::ffff:10.200.0.1".parse().unwrap(),
            lid: 0,
            mtu: 1024,
            depth: 32,
            frag_size: 16384,
            max_message: 1 << 20,
        }
    }

    #[test]
    fn info_round_trips_as_json() {
        let s = serde_json::to_string(&info()).unwrap();
        assert!(s.contains("\"gid\":\"::ffff:10.200.0.1\""), "{s}");
        let back: LocalInfo = serde_json::from_str(&s).unwrap();
        assert_eq!(back, info());
    }

    #[test]
    fn remote_info_is_checked() {
        check_remote(&info()).unwrap();
        for bad in [
            LocalInfo { version: 9, ..info() },
            LocalInfo { qpn: 0, ..info() },
            LocalInfo { qpn: 1 << 24, ..info() },
            LocalInfo { psn: 1 << 24, ..info() },
            LocalInfo { depth: 0, ..info() },
            LocalInfo { depth: 1 << 20, ..info() },
            LocalInfo { frag_size: 1, ..info() },
            LocalInfo { mtu: 0, ..info() },
            LocalInfo { max_message: 0, ..info() },
        ] {
            assert!(matches!(check_remote(&bad), Err(SetupError::BadRemote(_))), "{bad:?}");
        }
    }

    #[test]
    fn status_names() {
        assert_eq!(wc_status_name(12), "RETRY_EXC_ERR");
        assert_eq!(wc_status_name(2), "LOC_QP_OP_ERR");
        assert_eq!(wc_status_name(99), "UNKNOWN");
    }
}
