//! Overlay transports. The overlay sees a link as a pair of message channels; a transport turns a byte stream
//! (TCP today, RDMA verbs later, in-memory in simulations) into such a pair.
//!
//! Reading stops at the first malformed frame: the link reports [`LinkEvent::Closed`] with the decode error as
//! the reason, and the broker drops that peer only.

use crate::frame::read_frame;
use crate::message::Message;
use std::future::Future;
use std::pin::Pin;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::mpsc;

/// Sending half of a link: queue a message for the peer, never waiting. A TCP link (or a local client) queues
/// into its writer task's channel; an RDMA link encodes and posts from the caller's task (see `rdma_link`).
#[derive(Clone, Debug)]
pub struct LinkTx(TxPath);

#[derive(Clone, Debug)]
enum TxPath {
    Chan(mpsc::UnboundedSender<Message>),
    Rdma(std::sync::Arc<super::rdma_link::RdmaTx>),
    Ofi(std::sync::Arc<super::ofi_link::OfiTx>),
}

impl LinkTx {
    /// Queue `m` for the peer; gives it back when the link has closed.
    pub fn send(&self, m: Message) -> Result<(), Message> {
        match &self.0 {
            TxPath::Chan(tx) => tx.send(m).map_err(|e| e.0),
            TxPath::Rdma(tx) => tx.send(m),
            TxPath::Ofi(tx) => tx.send(m),
        }
    }

    pub(crate) fn rdma(tx: super::rdma_link::RdmaTx) -> LinkTx {
        LinkTx(TxPath::Rdma(std::sync::Arc::new(tx)))
    }

    pub(crate) fn ofi(tx: super::ofi_link::OfiTx) -> LinkTx {
        LinkTx(TxPath::Ofi(std::sync::Arc::new(tx)))
    }
}

impl From<mpsc::UnboundedSender<Message>> for LinkTx {
    fn from(tx: mpsc::UnboundedSender<Message>) -> LinkTx {
        LinkTx(TxPath::Chan(tx))
    }
}

/// Receiving half of a link: its messages, then one [`LinkEvent::Closed`]. A TCP link reads from its reader
/// task's channel; an RDMA link takes and decodes messages from the QP in the caller's task, merged with its
/// TCP side channel (see `rdma_link`).
#[derive(Debug)]
pub struct LinkRx(RxPath);

#[derive(Debug)]
enum RxPath {
    Chan(mpsc::UnboundedReceiver<LinkEvent>),
    Rdma(Box<super::rdma_link::RdmaRx>),
    Ofi(Box<super::ofi_link::OfiRx>),
}

impl LinkRx {
    /// The next event; None once the link is gone (after its `Closed`).
    pub async fn recv(&mut self) -> Option<LinkEvent> {
        match &mut self.0 {
            RxPath::Chan(rx) => rx.recv().await,
            RxPath::Rdma(rx) => rx.recv().await,
            RxPath::Ofi(rx) => rx.recv().await,
        }
    }

    /// Poll a channel-backed link (a TCP link: the side channel of an RDMA link) for its next event, with no
    /// future to allocate; `Ready(None)` (gone) for an RDMA link, which is never a side channel.
    pub(crate) fn poll_chan(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Option<LinkEvent>> {
        match &mut self.0 {
            RxPath::Chan(rx) => rx.poll_recv(cx),
            RxPath::Rdma(_) | RxPath::Ofi(_) => std::task::Poll::Ready(None),
        }
    }

    pub(crate) fn rdma(rx: super::rdma_link::RdmaRx) -> LinkRx {
        LinkRx(RxPath::Rdma(Box::new(rx)))
    }

    pub(crate) fn ofi(rx: super::ofi_link::OfiRx) -> LinkRx {
        LinkRx(RxPath::Ofi(Box::new(rx)))
    }
}

impl From<mpsc::UnboundedReceiver<LinkEvent>> for LinkRx {
    fn from(rx: mpsc::UnboundedReceiver<LinkEvent>) -> LinkRx {
        LinkRx(RxPath::Chan(rx))
    }
}

/// What a link's reader reports.
#[derive(Debug)]
pub enum LinkEvent {
    /// A decoded message.
    Message(Message),
    /// The link closed; the string says why ("eof", an i/o error, a decode error).
    Closed(String),
}

/// A connected link.
pub struct Link {
    /// Send messages to the peer.
    pub tx: LinkTx,
    /// Receive messages from the peer, then one `Closed`.
    pub rx: LinkRx,
    /// Peer address, for logs.
    pub peer: String,
    /// A duplicate of the socket's descriptor, for `TCP_INFO` (None for non-TCP links).
    pub sock: Option<std::os::fd::OwnedFd>,
    /// Abort handles of the link's reader and writer tasks (to drop a lost peer's link at once).
    pub tasks: Vec<tokio::task::AbortHandle>,
}

/// Kernel TCP state of a socket (`TCP_INFO`): segments sent and not yet acknowledged, and milliseconds since
/// the last ACK was received. `None` if the descriptor is not a TCP socket.
pub fn tcp_ack_state(fd: &std::os::fd::OwnedFd) -> Option<(u32, u32)> {
    use std::os::fd::AsRawFd;
    // SAFETY: tcp_info is plain old data; getsockopt writes at most `len` bytes into it.
    unsafe {
        let mut info: libc::tcp_info = std::mem::zeroed();
        let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
        let r = libc::getsockopt(
            fd.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            &mut info as *mut _ as *mut libc::c_void,
            &mut len,
        );
        if r != 0 {
            return None;
        }
        Some((info.tcpi_unacked, info.tcpi_last_ack_recv))
    }
}

/// `TCP_RTO_MIN_US` (Linux 6.15+): the overlay's minimum retransmission timeout, microseconds. Linux's default
/// minimum (200 ms) is longer than `tbon.lost_timeout`, so one segment dropped by a link blip would leave data
/// unacknowledged long enough to declare a healthy node lost; at 10 ms the lost segment is resent at once.
pub const OVERLAY_RTO_MIN_US: u32 = 10_000;

/// Configure an overlay TCP socket: no Nagle delay, a short minimum retransmission timeout where the kernel
/// allows it ([`OVERLAY_RTO_MIN_US`]), and `TCP_USER_TIMEOUT` (milliseconds) as a kernel backstop so data
/// unacknowledged that long fails the connection even if userspace is starved.
pub fn tune_tcp(s: &tokio::net::TcpStream, user_timeout_ms: u32) {
    use std::os::fd::AsRawFd;
    let _ = s.set_nodelay(true);
    let v: libc::c_uint = user_timeout_ms;
    // SAFETY: setsockopt with a valid fd and option values of the sizes passed.
    unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_USER_TIMEOUT,
            &v as *const _ as *const libc::c_void,
            std::mem::size_of::<libc::c_uint>() as libc::socklen_t,
        );
        // TCP_RTO_MIN_US (45): older kernels refuse it with ENOPROTOOPT and keep their 200 ms minimum.
        const TCP_RTO_MIN_US: libc::c_int = 45;
        let rto: libc::c_int = OVERLAY_RTO_MIN_US as libc::c_int;
        libc::setsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            TCP_RTO_MIN_US,
            &rto as *const _ as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

/// A way to reach overlay peers. Implementations: [`TcpTransport`]; RDMA comes later.
pub trait Transport: Send + Sync {
    /// Name shown in `vigil uptime` / `vigil overlay status` (e.g. "tcp").
    fn name(&self) -> &'static str;
    /// Connect to a peer's endpoint.
    fn connect(&self, endpoint: String) -> Pin<Box<dyn Future<Output = std::io::Result<Link>> + Send>>;
}

/// Wrap any byte stream into a [`Link`], spawning a reader and a writer task.
pub fn link_from_stream<S>(stream: S, peer: String) -> Link
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    link_from_stream_fd(stream, peer, None)
}

/// Like [`link_from_stream`], keeping `sock` (a duplicate descriptor) for `TCP_INFO`.
pub fn link_from_stream_fd<S>(stream: S, peer: String, sock: Option<std::os::fd::OwnedFd>) -> Link
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (rd, wr) = tokio::io::split(stream);
    // Buffered: one read(2) brings many small frames instead of three reads per frame (header, body, ...).
    let rd = tokio::io::BufReader::with_capacity(64 * 1024, rd);
    link_from_parts(rd, BufWriter::new(wr), peer, sock)
}

/// An authenticated, encrypted overlay link on a TCP connection whose handshake is done (see [`super::secure`]).
pub fn secure_link(
    stream: tokio::net::TcpStream,
    session: super::secure::Session,
    peer: String,
    sock: Option<std::os::fd::OwnedFd>,
) -> Link {
    let (rd, wr) = stream.into_split();
    // The secure reader buffers the socket itself: one read(2) brings many records, as for plain links.
    let (rd, wr) = session.split(rd, wr);
    link_from_parts(rd, wr, peer, sock)
}

/// A [`Link`] on a reading and a writing end that carry overlay frames, with a reader and a writer task. The
/// writer writes each queued frame to `wr` and flushes once the queue is empty, so `wr` should buffer.
pub fn link_from_parts<R, W>(mut rd: R, wr: W, peer: String, sock: Option<std::os::fd::OwnedFd>) -> Link
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (tx, mut out_rx) = mpsc::unbounded_channel::<Message>();
    let (in_tx, rx) = mpsc::unbounded_channel::<LinkEvent>();
    let wt = tokio::spawn(async move {
        let mut w = wr;
        // One frame buffer for the link's life: encoding allocates nothing per message.
        let mut frame = Vec::new();
        while let Some(m) = out_rx.recv().await {
            encode_reusing(&m, &mut frame);
            if w.write_all(&frame).await.is_err() {
                return;
            }
            // Batch what is already queued, then flush once.
            while let Ok(m) = out_rx.try_recv() {
                encode_reusing(&m, &mut frame);
                if w.write_all(&frame).await.is_err() {
                    return;
                }
            }
            if w.flush().await.is_err() {
                return;
            }
        }
        let _ = w.shutdown().await;
    });
    let rt = tokio::spawn(async move {
        loop {
            match read_frame(&mut rd).await {
                Ok(Some(m)) => {
                    if in_tx.send(LinkEvent::Message(m)).is_err() {
                        return;
                    }
                }
                Ok(None) => {
                    let _ = in_tx.send(LinkEvent::Closed("connection closed".into()));
                    return;
                }
                Err(e) => {
                    let _ = in_tx.send(LinkEvent::Closed(e.to_string()));
                    return;
                }
            }
        }
    });
    Link { tx: tx.into(), rx: rx.into(), peer, sock, tasks: vec![wt.abort_handle(), rt.abort_handle()] }
}

/// Encode `m` into `frame`, replacing what it held (its allocation is reused, unless a rare large message left
/// it above 1 MiB).
fn encode_reusing(m: &Message, frame: &mut Vec<u8>) {
    let len = m.encoded_len();
    if frame.capacity() > 1 << 20 && len <= 1 << 20 {
        *frame = Vec::new();
    }
    frame.clear();
    frame.resize(len, 0);
    m.encode_into(frame);
}

/// `TCP_USER_TIMEOUT` of overlay sockets (ms): the kernel's backstop behind the membership rules.
pub const TCP_USER_TIMEOUT_MS: u32 = 2000;

/// TCP overlay transport (tokio, `TCP_NODELAY`): every link it makes is authenticated and encrypted with the
/// instance's key ([`super::secure`]).
#[derive(Debug, Clone)]
pub struct TcpTransport {
    /// The instance's key and id.
    pub auth: std::sync::Arc<super::secure::LinkAuth>,
}

/// Lowest descriptor number given to overlay sockets ([`raise_socket`]).
pub const OVERLAY_FD_FLOOR: i32 = 1000;

/// Move an overlay socket to a descriptor at or above [`OVERLAY_FD_FLOOR`] and return it with a duplicate (for
/// `TCP_INFO`), also high. Why: when a broker is killed, the kernel releases its files in reverse order of
/// their numbers, and releasing the eBPF detectors' links waits for RCU grace periods (tens of ms). With the
/// sockets numbered highest, they are released first, so the peer sees the connection close (the broker is
/// dead) at once rather than missing heartbeat probes (which would look like a dead node). On failure (descriptor
/// limit), the socket is returned as it was.
pub fn raise_socket(s: tokio::net::TcpStream) -> (tokio::net::TcpStream, Option<std::os::fd::OwnedFd>) {
    use std::os::fd::{AsRawFd, FromRawFd};
    let dup_high = |fd: i32| -> Option<std::os::fd::OwnedFd> {
        // SAFETY: F_DUPFD_CLOEXEC on a valid descriptor returns a new descriptor we then own exclusively.
        let n = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, OVERLAY_FD_FLOOR) };
        // SAFETY: `n` is a fresh descriptor returned by fcntl and owned by nobody else.
        (n >= 0).then(|| unsafe { std::os::fd::OwnedFd::from_raw_fd(n) })
    };
    let Some(high) = dup_high(s.as_raw_fd()) else {
        let dup = std::os::fd::AsFd::as_fd(&s).try_clone_to_owned().ok();
        return (s, dup);
    };
    let std_s = std::net::TcpStream::from(high);
    let moved = std_s.set_nonblocking(true).and_then(|_| tokio::net::TcpStream::from_std(std_s));
    match moved {
        Ok(t) => {
            drop(s); // the low-numbered original
            let dup = dup_high(t.as_raw_fd());
            (t, dup)
        }
        Err(_) => {
            let dup = std::os::fd::AsFd::as_fd(&s).try_clone_to_owned().ok();
            (s, dup)
        }
    }
}

impl Transport for TcpTransport {
    fn name(&self) -> &'static str {
        "tcp"
    }
    /// Connect and run the initiator's handshake (within [`super::secure::HANDSHAKE_TIMEOUT`]). A peer that
    /// fails authentication gives `PermissionDenied`.
    fn connect(&self, endpoint: String) -> Pin<Box<dyn Future<Output = std::io::Result<Link>> + Send>> {
        let auth = self.auth.clone();
        Box::pin(async move {
            use super::secure::{initiate, HandshakeError, HANDSHAKE_TIMEOUT};
            let addr = endpoint.strip_prefix("tcp://").unwrap_or(&endpoint).to_string();
            let s = tokio::net::TcpStream::connect(&addr).await?;
            tune_tcp(&s, TCP_USER_TIMEOUT_MS);
            let (mut s, dup) = raise_socket(s);
            let session = match tokio::time::timeout(HANDSHAKE_TIMEOUT, initiate(&mut s, &auth)).await {
                Ok(Ok(x)) => x,
                Ok(Err(HandshakeError::Io(e))) => return Err(e),
                Ok(Err(e)) => return Err(std::io::Error::new(std::io::ErrorKind::PermissionDenied, e.to_string())),
                Err(_) => return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "overlay handshake timed out")),
            };
            Ok(secure_link(s, session, addr, dup))
        })
    }
}
