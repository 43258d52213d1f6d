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
//! The rules themselves (cutting messages into fragments, bounded reassembly, counting credits) are
//! `vigil-flow`'s [`OutQueue`], [`Reassembler`] and [`Credits`], shared with the libfabric transport and
//! tested there without a device; this module holds the verbs calls and the immediate-value encoding.
//!
//! # Completions and tasks
//! The protocol state and the verbs objects of a connection live in one engine behind a mutex that is never
//! held across an `await`. [`Sender::send`] queues a message and posts what credits allow from the caller's
//! own task, and [`Receiver::recv`] takes a message and returns its credit inline: neither hops through
//! another task. A driver task per connection waits for completions: one completion queue per connection,
//! bound to its own completion channel whose descriptor is registered with tokio (`AsyncFd`). After each
//! channel event the CQ is re-armed (`ibv_req_notify_cq`) *before* it is drained to empty, so a completion
//! that arrives during the drain raises a new event: no wake-up is lost. [`Config::busy_poll`] replaces this
//! with a polling loop for latency measurements, and the receiver then polls the CQ itself. The device
//! context's async event descriptor is watched the same way: a fatal QP event or the port going down ends
//! the connection with [`ConnError::AsyncEvent`].
//!
//! [`SyncConnection`] is the same engine without tokio, driven by the caller's thread: `post_send` and
//! `poll_cq` in a loop, as perftest does (what the verbs layer costs with no runtime at all).

use crate::device::Device;
use crate::verbs::{self, Buffer, CompChannel, Context, Cq, CqEvent, Pd, Qp, QpPath};
use crate::{Config, ConfigError};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::net::Ipv6Addr;
use std::sync::{Arc, Mutex};
use tokio::io::unix::AsyncFd;
use tracing::debug;
use vigil_flow::{Assembled, Credits, OutQueue, Reassembler};

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
        let qp = Qp::new_rc(&pd, &cq, slots, slots, cfg.max_inline).map_err(verr)?;
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

    /// Passive side, without tokio: like [`Prepared::accept`], but the connection is a [`SyncConnection`]
    /// driven by the caller's own thread (busy polling; [`Config::busy_poll`] is ignored).
    pub fn accept_sync(self, remote: &RemoteInfo) -> Result<SyncConnection, SetupError> {
        self.start_sync(remote, false)
    }

    /// Active side, without tokio: like [`Prepared::connect`], but returns a [`SyncConnection`].
    pub fn connect_sync(self, remote: &RemoteInfo) -> Result<SyncConnection, SetupError> {
        self.start_sync(remote, true)
    }

    fn start_sync(self, remote: &RemoteInfo, active: bool) -> Result<SyncConnection, SetupError> {
        let (engine, local, device) = self.engine(remote, active)?;
        Ok(SyncConnection { engine, passes: 0, local, remote: remote.clone(), device })
    }

    /// Connect the QP, post every receive and build the protocol state.
    fn engine(self, remote: &RemoteInfo, active: bool) -> Result<(Engine, LocalInfo, Device), SetupError> {
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
        let send_frag = frag.min(remote.frag_size) as usize;
        let engine = Engine {
            slots,
            frag: frag as usize,
            send_frag,
            credits: Credits::new(remote.depth, cfg.depth),
            free_slots: (0..slots).rev().collect(),
            in_flight: VecDeque::new(),
            since_signal: 0,
            pending: OutQueue::new(),
            assembling: Reassembler::new(usize::try_from(cfg.max_message).unwrap_or(usize::MAX)),
            inbox: VecDeque::new(),
            rx_waker: None,
            ready: active,
            send_ready: active,
            sender_open: true,
            receiver_open: true,
            close_sent: false,
            peer_closed: false,
            peer_closed_reported: false,
            ended: None,
            port: device.port,
            device: device.name.clone(),
            // SAFETY: ibv_wc is plain old data (integers and a union of integers); zero is a valid value.
            wc: (0..POLL_BATCH).map(|_| unsafe { std::mem::zeroed::<rdma_sys::ibv_wc>() }).collect(),
            res: Some(res),
        };
        let max_inline = engine.res.as_ref().map_or(0, |r| r.qp.max_inline());
        debug!(device = %device.name, qpn = local.qpn, remote_qpn = remote.qpn, active, max_inline, "rdma connection up");
        Ok((engine, local, device))
    }

    fn start(self, remote: &RemoteInfo, active: bool) -> Result<Connection, SetupError> {
        let busy = self.cfg.busy_poll;
        let name = self.device.name.clone();
        let verr = |source: std::io::Error| SetupError::Verbs { device: name.clone(), source };
        let (engine, local, device) = self.engine(remote, active)?;
        let res = engine.res.as_ref().expect("set by engine()");
        let comp_fd = if busy {
            None
        } else {
            res.cq.req_notify().map_err(verr)?;
            Some(register_fd(res.chan.fd()).map_err(verr)?)
        };
        let async_fd = register_fd(res.ctx.async_fd()).map_err(verr)?;
        let shared = Arc::new(Shared {
            engine: Mutex::new(engine),
            busy,
            abort: false.into(),
            driver: tokio::sync::Notify::new(),
            readable: tokio::sync::Notify::new(),
            writable: tokio::sync::Notify::new(),
        });
        let driver = Driver { comp_fd, async_fd, shared: shared.clone(), idle_passes: 0 };
        tokio::spawn(driver.run());
        Ok(Connection {
            sender: Sender { shared: shared.clone(), max: remote.max_message },
            receiver: Receiver { shared },
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
        // Ended before this half drops: no pass may send a CLOSE for it.
        self.shared.lock().fail(ConnError::Closed);
        self.shared.abort.store(true, std::sync::atomic::Ordering::SeqCst);
        self.shared.driver.notify_one();
    }
}

/// Messages accepted by [`Sender::send`] beyond what credits let onto the wire; more make it wait.
const MAX_QUEUED: usize = 2;

/// State shared by a connection's [`Sender`], [`Receiver`] and driver task. The engine's lock is never held
/// across an `await`; the sender posts and the receiver takes messages (and returns credits) inline, under
/// the lock, so neither needs a hop through the driver task.
struct Shared {
    engine: Mutex<Engine>,
    /// [`Config::busy_poll`]: the receiver polls the completion queue itself instead of waiting to be woken.
    busy: bool,
    abort: std::sync::atomic::AtomicBool,
    /// Wakes the driver: abort, a half dropped, an error found inline.
    driver: tokio::sync::Notify,
    /// Wakes a waiting receiver: a message arrived or the connection ended.
    readable: tokio::sync::Notify,
    /// Wakes a waiting sender: queue space freed or the connection ended.
    writable: tokio::sync::Notify,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Engine> {
        // A panic while holding the lock cannot leave the engine half-updated in a way that matters more than
        // the panic itself; keep going with the inner value.
        self.engine.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Sending half: whole messages, fragmented and flow-controlled.
pub struct Sender {
    shared: Arc<Shared>,
    max: u64,
}

impl std::fmt::Debug for Sender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sender").field("max_message", &self.max).finish()
    }
}

impl Sender {
    /// Queue one message for the peer and post what credits allow at once (from the caller's task). Waits
    /// while the peer has no room (no credits and two messages already waiting); fails once the connection
    /// has ended, with the reason, or with [`ConnError::PeerClosed`] once the peer has closed it.
    pub async fn send(&self, msg: Vec<u8>) -> Result<(), ConnError> {
        if msg.len() as u64 > self.max {
            return Err(ConnError::TooLarge { len: msg.len() as u64, max: self.max });
        }
        let mut msg = Some(msg);
        loop {
            let notified = self.shared.writable.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut e = self.shared.lock();
                if let Some(err) = &e.ended {
                    return Err(err.clone());
                }
                if e.peer_closed {
                    return Err(ConnError::PeerClosed);
                }
                if e.pending.len() < MAX_QUEUED {
                    e.pending.push(msg.take().expect("sent once"));
                    if let Err(err) = e.progress() {
                        e.fail(err.clone());
                        drop(e);
                        self.shared.driver.notify_one();
                        return Err(err);
                    }
                    return Ok(());
                }
            }
            notified.await;
        }
    }

    /// Queue one message and post what credits allow at once, without waiting: what credits do not cover
    /// stays queued (unbounded) and goes out as the peer returns them. For callers that already bound what
    /// they queue, or that queued into an unbounded channel before (the broker's overlay links); fails once
    /// the connection has ended, or with [`ConnError::PeerClosed`] once the peer has closed it.
    pub fn send_now(&self, msg: Vec<u8>) -> Result<(), ConnError> {
        if msg.len() as u64 > self.max {
            return Err(ConnError::TooLarge { len: msg.len() as u64, max: self.max });
        }
        let mut e = self.shared.lock();
        if let Some(err) = &e.ended {
            return Err(err.clone());
        }
        if e.peer_closed {
            return Err(ConnError::PeerClosed);
        }
        e.pending.push(msg);
        if let Err(err) = e.progress() {
            e.fail(err.clone());
            drop(e);
            self.shared.driver.notify_one();
            return Err(err);
        }
        Ok(())
    }

    /// Like [`Sender::send_now`], for a message of `len` bytes that `fill` writes: when it fits one fragment
    /// and a credit is available (nothing queued ahead of it), `fill` writes straight into a registered send
    /// buffer, with no allocation and no second copy; otherwise into a queued buffer of its own.
    pub fn send_now_with(&self, len: usize, fill: impl FnOnce(&mut [u8])) -> Result<(), ConnError> {
        if len as u64 > self.max {
            return Err(ConnError::TooLarge { len: len as u64, max: self.max });
        }
        let mut e = self.shared.lock();
        if let Some(err) = &e.ended {
            return Err(err.clone());
        }
        if e.peer_closed {
            return Err(ConnError::PeerClosed);
        }
        if let Err(err) = e.send_with(len, fill) {
            e.fail(err.clone());
            drop(e);
            self.shared.driver.notify_one();
            return Err(err);
        }
        Ok(())
    }

    /// Largest message the peer accepts, bytes.
    pub fn max_message(&self) -> u64 {
        self.max
    }
}

impl Drop for Sender {
    fn drop(&mut self) {
        self.shared.lock().sender_open = false;
        self.shared.driver.notify_one();
    }
}

/// Receiving half: whole messages in order, then one error saying why the connection ended.
pub struct Receiver {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Receiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Receiver").finish()
    }
}

impl Receiver {
    /// The next message, or why the connection ended ([`ConnError::PeerClosed`] after an orderly close).
    /// Taking a message returns its credit to the peer. In busy-poll mode this polls the completion queue
    /// itself, between passes of the runtime's other ready tasks, so a message is taken in the same task pass
    /// that finds it; await it from a spawned task, not from `block_on`'s own future (whose every wake-up
    /// writes the runtime's eventfd, and which is polled only between rounds of the other tasks).
    pub async fn recv(&mut self) -> Result<Vec<u8>, ConnError> {
        if self.shared.busy {
            return self.recv_busy().await;
        }
        loop {
            let notified = self.shared.readable.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(r) = self.try_take(false) {
                return r;
            }
            notified.await;
        }
    }

    /// Busy-poll mode: poll the completion queue between passes of the other tasks, with no waker registered
    /// (the driver does not wake a busy receiver).
    async fn recv_busy(&mut self) -> Result<Vec<u8>, ConnError> {
        loop {
            if let Some(r) = self.try_take(true) {
                return r;
            }
            requeue().await;
        }
    }

    /// Poll for the next message, or why the connection ended, as [`Receiver::recv`] gives them: for a caller
    /// that polls several sources from one task (the broker's loop polls every overlay link this way).
    ///
    /// Event mode: the connection's driver task wakes `cx` when a message arrives or the connection ends.
    /// Busy-poll mode ([`Config::busy_poll`]): each call polls the completion queue once (no system call), and
    /// when nothing has arrived wakes `cx` at once and returns `Pending`, so the caller's task goes to the back
    /// of the runtime's run queue and polls again after the other ready tasks: the completion queue is polled
    /// once per pass of the runtime, by the caller's own task, and a message found is the caller's in that
    /// same pass, with no wake-up or hand-off between tasks.
    pub fn poll_recv(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<Vec<u8>, ConnError>> {
        use std::task::Poll;
        if self.shared.busy {
            return match self.try_take(true) {
                Some(r) => Poll::Ready(r),
                None => {
                    cx.waker().wake_by_ref();
                    Poll::Pending
                }
            };
        }
        let mut e = self.shared.lock();
        let r = e.take_message();
        let Some(r) = r else {
            // Registered under the lock the driver takes to add a message: none can slip in between.
            if !e.rx_waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                e.rx_waker = Some(cx.waker().clone());
            }
            return Poll::Pending;
        };
        let woke = e.ended.is_some();
        drop(e);
        if woke {
            self.shared.driver.notify_one();
        }
        Poll::Ready(r)
    }

    /// The next message if one is there, without waiting: `None` when there is none yet. In busy-poll mode
    /// ([`Config::busy_poll`]) this polls the completion queue first, so a caller's own polling loop (one that
    /// watches several connections) receives without a task of its own. Once the connection has ended,
    /// `Some(Err(..))` says why, as [`Receiver::recv`] does.
    pub fn try_recv(&mut self) -> Option<Result<Vec<u8>, ConnError>> {
        self.try_take(self.shared.busy)
    }

    /// Whether this receiver's connection busy-polls ([`Config::busy_poll`]).
    pub fn is_busy_poll(&self) -> bool {
        self.shared.busy
    }

    /// Take the next message (polling the completion queue first if `poll` and none is waiting).
    fn try_take(&self, poll: bool) -> Option<Result<Vec<u8>, ConnError>> {
        let mut e = self.shared.lock();
        let mut r = e.take_message();
        if r.is_none() && poll && e.ended.is_none() {
            if let Err(err) = e.poll_once() {
                e.fail(err);
                self.shared.driver.notify_one();
            }
            r = e.take_message();
        }
        let r = r?;
        let woke = e.ended.is_some();
        drop(e);
        if woke {
            self.shared.driver.notify_one();
        }
        Some(r)
    }
}

/// Let the runtime run its other ready tasks once, then continue: the task wakes itself and goes to the back
/// of the run queue. Unlike `tokio::task::yield_now`, which defers the wake-up until the scheduler has polled
/// its I/O driver (an `epoll_wait` system call per yield when nothing else is ready), a busy-polling loop then
/// costs no system call per pass; the runtime still polls its driver every `event_interval` (61) tasks.
fn requeue() -> impl std::future::Future<Output = ()> {
    let mut woke = false;
    std::future::poll_fn(move |cx| {
        if woke {
            return std::task::Poll::Ready(());
        }
        woke = true;
        cx.waker().wake_by_ref();
        std::task::Poll::Pending
    })
}

impl Drop for Receiver {
    fn drop(&mut self) {
        {
            let mut e = self.shared.lock();
            e.receiver_open = false;
            // Messages nobody will take: their buffers are free, return the credits.
            let n = e.inbox.len() as u32;
            e.credits.owe(n);
            e.inbox.clear();
        }
        self.shared.driver.notify_one();
    }
}

/// A connection driven synchronously by the caller's thread, without tokio: [`SyncConnection::send`] posts
/// at once, [`SyncConnection::poll`] polls the completion queue once. For latency-critical loops (and to
/// measure the verbs layer alone); the wire protocol, flow control and error reporting are those of
/// [`Connection`]. Dropping it sends CLOSE and waits for the send to complete (at most 100 ms).
pub struct SyncConnection {
    engine: Engine,
    /// Polls since the last check of the async event descriptor.
    passes: u32,
    /// This side's connection info.
    pub local: LocalInfo,
    /// The peer's connection info.
    pub remote: RemoteInfo,
    /// The device, port and GID this side uses.
    pub device: Device,
}

impl std::fmt::Debug for SyncConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SyncConnection").field("device", &self.device.name).field("local", &self.local).finish()
    }
}

impl SyncConnection {
    /// Queue one message and post what credits allow at once; fails once the connection has ended or the
    /// peer has closed it. Never blocks: what does not fit waits in the
    /// queue and goes out from later [`SyncConnection::poll`] calls as the peer returns credits.
    pub fn send(&mut self, msg: &[u8]) -> Result<(), ConnError> {
        if let Some(e) = &self.engine.ended {
            return Err(e.clone());
        }
        if self.engine.peer_closed {
            return Err(ConnError::PeerClosed);
        }
        if msg.len() as u64 > self.remote.max_message {
            return Err(ConnError::TooLarge { len: msg.len() as u64, max: self.remote.max_message });
        }
        let r = self.engine.send_now(msg);
        self.check(r)
    }

    /// Poll the completion queue once and send what became possible; returns the next whole message if one
    /// is there. Every 64th call without work also checks the device's async events (one system call).
    pub fn poll(&mut self) -> Result<Option<Vec<u8>>, ConnError> {
        if let Some(r) = self.engine.take_message() {
            return r.map(Some);
        }
        let did = self.engine.poll_once();
        let did = self.check(did)?;
        self.passes = if did > 0 { 0 } else { self.passes.wrapping_add(1) };
        if self.passes % 64 == 63 {
            let r = self.engine.take_async_events();
            self.check(r)?;
        }
        self.engine.take_message().transpose()
    }

    /// Busy-poll until the next whole message arrives, or the connection ends.
    pub fn recv(&mut self) -> Result<Vec<u8>, ConnError> {
        loop {
            if let Some(m) = self.poll()? {
                return Ok(m);
            }
            std::hint::spin_loop();
        }
    }

    fn check<T>(&mut self, r: Result<T, ConnError>) -> Result<T, ConnError> {
        if let Err(e) = &r {
            self.engine.fail(e.clone());
        }
        r
    }
}

impl Drop for SyncConnection {
    fn drop(&mut self) {
        let e = &mut self.engine;
        e.sender_open = false;
        e.receiver_open = false;
        e.credits.owe(e.inbox.len() as u32);
        e.inbox.clear();
        let t = std::time::Instant::now();
        while e.ended.is_none() && t.elapsed() < std::time::Duration::from_millis(100) {
            if let Err(err) = e.poll_once() {
                e.fail(err);
                break;
            }
            if let Step::Done = e.check_done() {
                break;
            }
        }
        if let (Some(_), Some(res)) = (&e.ended, &e.res) {
            let _ = res.qp.set_error();
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
    // the `Driver` drops only after its `AsyncFd`s (see `Driver::run`), so the descriptor stays open and
    // unchanged for the whole life of the `AsyncFd`.
    unsafe { AsyncFd::register_with_interest(Fd(fd), tokio::io::Interest::READABLE) }.map_err(|e| e.into_parts().1)
}

/// The task that waits for a connection's completion events (or busy-polls), handles what the sender and
/// receiver do not do inline (credit-only packets while idle, CLOSE, async events), and tears down.
struct Driver {
    // The AsyncFds are deregistered from the reactor before the descriptors close with the resources.
    comp_fd: Option<AsyncFd<Fd>>,
    async_fd: AsyncFd<Fd>,
    shared: Arc<Shared>,
    /// Busy-poll passes without work since the last async event check.
    idle_passes: u32,
}

/// The protocol state and verbs resources of one connection (no tokio): what [`Connection`] shares between
/// its halves and [`SyncConnection`] owns.
struct Engine {
    slots: u32,
    frag: usize,
    send_frag: usize,
    /// Data fragments we may still send, and credits to return to the peer.
    credits: Credits,
    free_slots: Vec<u32>,
    /// Messages waiting for credits, cut into fragments of `send_frag` bytes as they go.
    pending: OutQueue,
    /// The message being received, bounded by our `max_message`.
    assembling: Reassembler,
    /// Whole messages received and not yet taken (their last fragment's credit is still held).
    inbox: VecDeque<Vec<u8>>,
    /// The task that last found nothing in [`Receiver::poll_recv`] (event mode), woken with the
    /// [`Shared::readable`] waiters; kept under the engine's lock, so a message found by the driver after the
    /// receiver looked always wakes it.
    rx_waker: Option<std::task::Waker>,
    /// We may send data (the active side at once; the passive side after the peer's first packet).
    ready: bool,
    /// The READY packet still has to be sent (active side).
    send_ready: bool,
    sender_open: bool,
    receiver_open: bool,
    close_sent: bool,
    peer_closed: bool,
    /// The receiver has been told [`ConnError::PeerClosed`].
    peer_closed_reported: bool,
    /// Why the connection ended; set once.
    ended: Option<ConnError>,
    port: u8,
    device: String,
    /// Send slots posted and not yet known complete, in post order, with whether each was signaled.
    in_flight: VecDeque<(u32, bool)>,
    /// Unsignaled sends posted since the last signaled one.
    since_signal: u32,
    /// Work completions of one poll (allocated once).
    wc: Vec<rdma_sys::ibv_wc>,
    /// None once the driver has torn the connection down.
    res: Option<Resources>,
}

enum Step {
    Continue,
    Done,
}

impl Driver {
    async fn run(mut self) {
        let r = self.run_inner().await;
        let res = {
            let mut e = self.shared.lock();
            match r {
                Err(err) => {
                    debug!(device = %e.device, "rdma connection ended: {err}");
                    e.fail(err);
                    if let Some(res) = &e.res {
                        // Flush outstanding work requests before the QP is destroyed (clean teardown).
                        let _ = res.qp.set_error();
                    }
                }
                Ok(()) => {
                    e.ended.get_or_insert(ConnError::Closed);
                }
            }
            (e.res.take(), e.rx_waker.take())
        };
        let (res, rx_waker) = res;
        self.shared.readable.notify_waiters();
        if let Some(w) = rx_waker {
            w.wake();
        }
        self.shared.writable.notify_waiters();
        // Deregister the descriptors, then destroy QP, buffers, CQ, channel, PD, context (in that order).
        let Driver { comp_fd, async_fd, .. } = self;
        drop(comp_fd);
        drop(async_fd);
        drop(res);
    }

    /// One pass under the lock: what failed inline, new completions, sends; wakes the halves as needed.
    fn pass(&mut self, drain: bool) -> Result<Step, ConnError> {
        let mut e = self.shared.lock();
        if let Some(err) = &e.ended {
            return Err(err.clone());
        }
        let before = (e.inbox.len(), e.pending.len(), e.peer_closed);
        let n = if drain { e.drain_cq()? } else { 0 };
        e.progress()?;
        let step = e.check_done();
        let after = (e.inbox.len(), e.pending.len(), e.peer_closed);
        let readable = after.0 > before.0 || after.2 != before.2;
        let rx_waker = if readable { e.rx_waker.take() } else { None };
        drop(e);
        if readable {
            self.shared.readable.notify_waiters();
            if let Some(w) = rx_waker {
                w.wake();
            }
        }
        if after.1 < MAX_QUEUED && (after.1 < before.1 || n > 0) {
            self.shared.writable.notify_waiters();
        }
        self.idle_passes = if n > 0 { 0 } else { self.idle_passes.wrapping_add(1) };
        Ok(step)
    }

    async fn run_inner(&mut self) -> Result<(), ConnError> {
        // In event mode the CQ was armed in `start`; completions that came before are drained now.
        let mut drain = true;
        loop {
            if self.shared.abort.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(ConnError::Closed);
            }
            if let Step::Done = self.pass(drain)? {
                return Ok(());
            }
            drain = false;
            let Some(comp) = self.comp_fd.as_ref() else {
                // Busy-poll mode: drain every pass. While the receiver is open it polls the CQ itself as it
                // waits for a message (a second spinning task would only lengthen every scheduler round):
                // pass again when woken or after 1 ms, checking async events (a system call) each time.
                // Otherwise spin, checking async events every 64 idle passes.
                drain = true;
                let receiving = self.shared.lock().receiver_open;
                if receiving || self.idle_passes % 64 == 63 {
                    self.shared.lock().take_async_events()?;
                }
                if receiving {
                    tokio::select! {
                        biased;
                        _ = self.shared.driver.notified() => {}
                        _ = tokio::time::sleep(std::time::Duration::from_millis(1)) => {}
                    }
                } else {
                    tokio::task::yield_now().await;
                }
                continue;
            };
            tokio::select! {
                biased;
                _ = self.shared.driver.notified() => {}
                r = comp.readable() => {
                    let mut g = r.map_err(|e| ConnError::Io(e.to_string()))?;
                    let e = self.shared.lock();
                    let cq = &e.res.as_ref().ok_or(ConnError::Closed)?.cq;
                    while let CqEvent::Event = cq.take_event().map_err(|e| ConnError::Io(e.to_string()))? {}
                    g.clear_ready();
                    // Re-arm first, then drain to empty (next pass): a completion after the drain raises a
                    // new event.
                    cq.req_notify().map_err(|e| ConnError::Io(e.to_string()))?;
                    drain = true;
                }
                r = self.async_fd.readable() => {
                    let mut g = r.map_err(|e| ConnError::Io(e.to_string()))?;
                    let ev = self.shared.lock().take_async_events();
                    g.clear_ready();
                    ev?;
                }
            }
        }
    }
}

impl Engine {
    fn res(&self) -> Result<&Resources, ConnError> {
        self.res.as_ref().ok_or(ConnError::Closed)
    }

    /// Record why the connection ended (the first reason wins).
    fn fail(&mut self, e: ConnError) {
        self.ended.get_or_insert(e);
    }

    /// The next message for the receiver (returning its credit), or why the connection ended; None if
    /// neither is there yet.
    fn take_message(&mut self) -> Option<Result<Vec<u8>, ConnError>> {
        if let Some(m) = self.inbox.pop_front() {
            self.credits.owe(1);
            if self.credits.update_due() && self.ended.is_none() {
                // Nothing may be going the other way soon: return the credits now.
                if let Err(e) = self.progress() {
                    self.fail(e);
                }
            }
            return Some(Ok(m));
        }
        if self.peer_closed && !self.peer_closed_reported {
            self.peer_closed_reported = true;
            return Some(Err(ConnError::PeerClosed));
        }
        self.ended.clone().map(Err)
    }

    /// Drain the CQ once and send what became possible; returns the number of completions.
    fn poll_once(&mut self) -> Result<usize, ConnError> {
        let n = self.drain_cq()?;
        self.progress()?;
        Ok(n)
    }

    /// Queue `msg` and post it. A message that fits one fragment, with credits and nothing queued ahead of
    /// it, is copied straight into a send slot (no allocation); else it is queued.
    fn send_now(&mut self, msg: &[u8]) -> Result<(), ConnError> {
        self.send_with(msg.len(), |b| b.copy_from_slice(msg))
    }

    /// [`Engine::send_now`] for a message of `len` bytes written by `fill`: into a free send slot when it
    /// fits one fragment and may go at once, else into a queued buffer.
    fn send_with(&mut self, len: usize, fill: impl FnOnce(&mut [u8])) -> Result<(), ConnError> {
        if self.pending.is_empty()
            && self.ready
            && !self.send_ready
            && self.credits.available() > 0
            && self.free_slots.len() > 1
            && len <= self.send_frag
        {
            let slot = self.free_slots.pop().expect("checked");
            let so = slot as usize * self.frag;
            let res = self.res()?;
            // SAFETY: `slot` is free (its previous send completed), so the device does not read it; the range
            // [so, so+len) lies inside the registered send buffer (len <= send_frag <= frag), and nothing else
            // refers to it until it is posted below.
            let buf = unsafe { std::slice::from_raw_parts_mut(res.send_buf.addr().add(so), len) };
            fill(buf);
            self.post_filled(slot, len, false)?;
        } else {
            let mut v = vec![0u8; len];
            fill(&mut v);
            self.pending.push(v);
        }
        self.progress()
    }

    fn take_async_events(&self) -> Result<(), ConnError> {
        let res = self.res()?;
        loop {
            let ev = verbs::take_async_event(&res.ctx).map_err(|e| ConnError::Io(e.to_string()))?;
            let Some((ty, element)) = ev else { return Ok(()) };
            let name = verbs::event_type_str(ty);
            let ours = match ty {
                // QP events: element is the QP pointer.
                1..=3 => element == res.qp.as_ptr() as u64,
                // CQ error: element is the CQ pointer.
                0 => element == res.cq.as_ptr() as u64,
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
        // Taken out for the loop (on_completion needs `&mut self`) and put back, even on error.
        let mut wc = std::mem::take(&mut self.wc);
        let r = self.drain_into(&mut wc);
        self.wc = wc;
        r
    }

    fn drain_into(&mut self, wc: &mut [rdma_sys::ibv_wc]) -> Result<usize, ConnError> {
        let mut total = 0;
        loop {
            let n = self.res()?.cq.poll(wc).map_err(|e| ConnError::Io(e.to_string()))?;
            for w in &wc[..n] {
                self.on_completion(w)?;
            }
            total += n;
            if n < wc.len() {
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
        self.credits.returned(imm & CREDIT_MASK).map_err(|e| ConnError::Protocol(e.to_string()))?;
        // Any packet from the peer means its QP is ready: the passive side may send from now on.
        self.ready = true;
        if imm & CONTROL != 0 {
            if len != 0 || imm & F_MORE != 0 {
                return Err(ConnError::Protocol("control packet with payload".into()));
            }
            if imm & F_CLOSE != 0 {
                self.peer_closed = true;
            }
        } else {
            if self.peer_closed {
                return Err(ConnError::Protocol("data after close".into()));
            }
            let off = slot as usize * self.frag;
            let res = self.res.as_ref().ok_or(ConnError::Closed)?;
            // SAFETY: the receive for this slot completed, so the device no longer writes to
            // [off, off+len), which lies inside the registered receive buffer (len <= frag checked above).
            let data = unsafe { std::slice::from_raw_parts(res.recv_buf.addr().add(off), len) };
            match self.assembling.push(imm & F_MORE != 0, data) {
                // Copied into the message being assembled: the buffer is free again, return its credit now.
                None => self.credits.owe(1),
                Some(Assembled::Complete(m)) if self.receiver_open => self.inbox.push_back(m),
                Some(Assembled::Complete(_)) => self.credits.owe(1),
                Some(Assembled::Oversized(_)) => {
                    return Err(ConnError::Protocol(format!(
                        "message longer than the {}-byte limit",
                        self.assembling.max_message()
                    )))
                }
            }
        }
        // Every receive slot is reposted at once; credits (not slots) bound what the peer may send.
        let res = self.res()?;
        res.qp
            .post_recv(RECV_TAG | slot as u64, &res.recv_buf, slot as usize * self.frag, self.frag as u32)
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
            // The queue is taken out while its fragments are posted (posting needs `&mut self`), and put back.
            let mut q = std::mem::take(&mut self.pending);
            let mut r = Ok(());
            while self.credits.available() > 0 && self.free_slots.len() > 1 {
                let Some((frag, more)) = q.front(self.send_frag) else { break };
                let slot = self.free_slots.pop().expect("checked");
                r = self.post_data(slot, frag, more);
                if r.is_err() {
                    break;
                }
                q.advance(self.send_frag);
            }
            self.pending = q;
            r?;
        }
        if self.credits.update_due() {
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

    /// Copy one fragment into the free send `slot` and post it with the owed credits; costs a credit.
    fn post_data(&mut self, slot: u32, data: &[u8], more: bool) -> Result<(), ConnError> {
        let so = slot as usize * self.frag;
        let n = data.len().min(self.send_frag);
        let res = self.res()?;
        // SAFETY: `slot` is free (its previous send completed), so the device does not read it; the copy stays
        // inside the registered send buffer (n <= send_frag <= frag).
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), res.send_buf.addr().add(so), n);
        }
        self.post_filled(slot, n, more)
    }

    /// Post the first `n` bytes of send `slot`, already written, as a data fragment with the owed credits;
    /// costs a credit.
    fn post_filled(&mut self, slot: u32, n: usize, more: bool) -> Result<(), ConnError> {
        let credits = self.credits.owed().min(CREDIT_MASK);
        let imm = credits | if more { F_MORE } else { 0 };
        self.post(slot, slot as usize * self.frag, n as u32, imm, false)?;
        self.credits.take_owed(credits);
        let paid = self.credits.spend();
        debug_assert!(paid, "data fragments are posted only with a credit");
        Ok(())
    }

    /// Post a control packet carrying the owed credits; false when no send slot is free.
    fn post_control(&mut self, flag: u32) -> Result<bool, ConnError> {
        let Some(slot) = self.free_slots.pop() else { return Ok(false) };
        let credits = self.credits.owed().min(CREDIT_MASK);
        // READY and CLOSE are signaled: every earlier send is then known complete (teardown waits for it).
        self.post(slot, slot as usize * self.frag, 0, flag | credits, flag & (F_CLOSE | F_READY) != 0)?;
        self.credits.take_owed(credits);
        Ok(true)
    }

    /// Post a send from `slot`. Sends are signaled only every half ring, when slots run low, or when `force`d:
    /// an unsignaled send costs no completion and no wake-up (a ping-pong then wakes once per message
    /// instead of twice); its slot is freed by the next signaled completion.
    fn post(&mut self, slot: u32, off: usize, len: u32, imm: u32, force: bool) -> Result<(), ConnError> {
        let signaled = force || self.since_signal + 1 >= (self.slots / 2).max(1) || self.free_slots.len() <= 2;
        let res = self.res()?;
        res.qp
            .post_send(slot as u64, &res.send_buf, off, len, imm, signaled)
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
