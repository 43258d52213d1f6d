//! Overlay transports: the seam between the broker's driver and whatever carries a link's messages.
//!
//! The driver sees every link, whatever it runs on, as two halves:
//! - a sending half, [`LinkTx`] (any [`LinkSend`]): queue a message for the peer without waiting, or get it
//!   back once the link has closed;
//! - a receiving half, [`LinkRx`] (any [`LinkRecv`]): poll for the peer's messages, then one
//!   [`LinkEvent::Closed`] saying why the link ended.
//!
//! Dropping both halves (and aborting a [`Link`]'s tasks) closes the link; what it runs on is described by a
//! `LinkChoice` ("tcp (why not the others)", "rdma on DEVICE ...", "ofi (provider ...)"), which the driver
//! logs and the broker shows in `vigil overlay status` and `vigil uptime`.
//!
//! Implementations:
//! - byte-stream links (here): a reader and a writer task around any byte stream: the authenticated TCP
//!   links of the overlay ([`secure_link`], made by [`TcpTransport`]), and the local connector's Unix sockets
//!   ([`link_from_stream`]);
//! - in-memory links (here, [`mem_pair`], [`MemTransport`]): messages handed over as they are, no encoding;
//!   for tests of the driver's link handling without sockets;
//! - verbs (`rdma_link.rs`, on `vigil-rdma`) and libfabric (`ofi_link.rs`, on `vigil-ofi`): a link moves onto
//!   one of them after its TCP hello, through the upgrade seam of `upgrade.rs`, and keeps its TCP connection as
//!   a side channel. The verbs link's busy polling (`tbon.rdma_poll=busy`) lives in its receiving half.
//!
//! The driver polls every overlay link's receiving half from its own loop (`link_set.rs`), so a message goes
//! from the transport to the broker with no task in between.
//!
//! Reading stops at the first malformed frame: the link reports [`LinkEvent::Closed`] with the decode error as
//! the reason, and the broker drops that peer only.

use crate::frame::read_frame;
use crate::message::Message;
use serde_json::Value;
use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::mpsc;

/// What every link's sending half does: queue a message for the peer, never waiting.
pub trait LinkSend: Send + Sync + std::fmt::Debug {
    /// Queue `m` for the peer (unbounded, like a socket's send queue); gives it back when the link has closed.
    fn send(&self, m: Message) -> Result<(), Message>;
}

/// What every link's receiving half does: give the peer's messages in order, then one [`LinkEvent::Closed`].
pub trait LinkRecv: Send + std::fmt::Debug {
    /// Poll for the next event: `Ready(Some(..))` with a message or the link's end (then `Ready(None)` from
    /// then on), or `Pending` after arranging for `cx` to be woken when there is more. An implementation may
    /// wake `cx` at once to be polled again after the runtime's other ready tasks (the verbs link's busy
    /// polling does, see `rdma_link.rs`).
    fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<LinkEvent>>;
}

/// Sending half of a link, whatever it runs on ([`LinkSend`]); clones send on the same link.
#[derive(Clone, Debug)]
pub struct LinkTx(Arc<dyn LinkSend>);

impl LinkTx {
    /// A sending half of any implementation.
    pub fn new(tx: impl LinkSend + 'static) -> LinkTx {
        LinkTx(Arc::new(tx))
    }

    /// Queue `m` for the peer; gives it back when the link has closed.
    pub fn send(&self, m: Message) -> Result<(), Message> {
        self.0.send(m)
    }
}

/// A byte-stream link's writer task (or a local client's) reads its messages from this channel.
impl LinkSend for mpsc::UnboundedSender<Message> {
    fn send(&self, m: Message) -> Result<(), Message> {
        mpsc::UnboundedSender::send(self, m).map_err(|e| e.0)
    }
}

impl From<mpsc::UnboundedSender<Message>> for LinkTx {
    fn from(tx: mpsc::UnboundedSender<Message>) -> LinkTx {
        LinkTx::new(tx)
    }
}

/// Receiving half of a link, whatever it runs on ([`LinkRecv`]): its messages, then one [`LinkEvent::Closed`].
#[derive(Debug)]
pub struct LinkRx(Box<dyn LinkRecv>);

impl LinkRx {
    /// A receiving half of any implementation.
    pub fn new(rx: impl LinkRecv + 'static) -> LinkRx {
        LinkRx(Box::new(rx))
    }

    /// The next event; None once the link is gone (after its `Closed`).
    pub async fn recv(&mut self) -> Option<LinkEvent> {
        std::future::poll_fn(|cx| self.0.poll_recv(cx)).await
    }

    /// Poll for the next event (see [`LinkRecv::poll_recv`]).
    pub fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<LinkEvent>> {
        self.0.poll_recv(cx)
    }
}

/// A byte-stream link's reader task sends its events into this channel.
impl LinkRecv for mpsc::UnboundedReceiver<LinkEvent> {
    fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<LinkEvent>> {
        mpsc::UnboundedReceiver::poll_recv(self, cx)
    }
}

impl From<mpsc::UnboundedReceiver<LinkEvent>> for LinkRx {
    fn from(rx: mpsc::UnboundedReceiver<LinkEvent>) -> LinkRx {
        LinkRx::new(rx)
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
#[derive(Debug)]
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

impl Link {
    /// Close the link at once: its tasks end, and so does the peer's side.
    pub fn close(self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

// What a link runs on is the broker's to record and report (`overlay.status`, `vigil uptime`): plain data in
// the core; the driver only makes the choice.
pub(crate) use vigil_core::broker::links::LinkChoice;

/// Local IP address of a socket (the overlay's own end of a connection).
pub(crate) fn local_ip(fd: &std::os::fd::OwnedFd) -> Option<IpAddr> {
    // A duplicate of the descriptor, closed again when the temporary stream drops.
    let s = std::net::TcpStream::from(fd.try_clone().ok()?);
    s.local_addr().ok().map(|a| a.ip())
}

/// The IP address of the other end of the TCP socket `fd`.
pub(crate) fn peer_ip(fd: &std::os::fd::OwnedFd) -> Option<IpAddr> {
    let s = std::net::TcpStream::from(fd.try_clone().ok()?);
    s.peer_addr().ok().map(|a| a.ip())
}

/// Merge the fields of `extra` (an object) into `base` (an object).
pub(crate) fn merge(mut base: Value, extra: Value) -> Value {
    if let (Some(b), Value::Object(e)) = (base.as_object_mut(), extra) {
        b.extend(e);
    }
    base
}

/// Kernel TCP state of a socket (`TCP_INFO`): segments sent and not yet acknowledged, milliseconds since the
/// last ACK was received, and the connection's round trip bound `srtt + 4 × rttvar` in microseconds (0 before
/// any round trip was measured). `None` if the descriptor is not a TCP socket.
pub fn tcp_ack_state(fd: &std::os::fd::OwnedFd) -> Option<(u32, u32, u32)> {
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
        let bound = info.tcpi_rtt.saturating_add(info.tcpi_rttvar.saturating_mul(4));
        Some((info.tcpi_unacked, info.tcpi_last_ack_recv, bound))
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

/// A way to reach an overlay peer: how a link is made. Implementations: [`TcpTransport`] (the overlay's),
/// [`MemTransport`] (in-memory, for tests). The faster transports (verbs, libfabric) do not make links: they
/// take over a TCP link after its hello (`upgrade.rs`).
pub trait Transport: Send + Sync {
    /// Name of the links it makes ("tcp", "mem").
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

/// In-memory links: a pair of [`Link`]s whose messages are handed from one to the other as they are, with no
/// encoding and no task. What one end sends, the other receives in order; once every sending half of one end
/// is dropped (or its [`Link::close`]), the other end receives its queued messages and then
/// `Closed("connection closed")`, as from a TCP peer's end of stream, and its own sends fail.
pub fn mem_pair(a: &str, b: &str) -> (Link, Link) {
    let (a_tx, b_rx) = mpsc::unbounded_channel();
    let (b_tx, a_rx) = mpsc::unbounded_channel();
    let end = |tx, rx, peer: &str| Link {
        tx: LinkTx::new(MemTx(tx)),
        rx: LinkRx::new(MemRx { rx, done: false }),
        peer: peer.to_string(),
        sock: None,
        tasks: Vec::new(),
    };
    (end(a_tx, a_rx, b), end(b_tx, b_rx, a))
}

/// Sending half of an in-memory link.
#[derive(Debug)]
struct MemTx(mpsc::UnboundedSender<Message>);

impl LinkSend for MemTx {
    fn send(&self, m: Message) -> Result<(), Message> {
        self.0.send(m).map_err(|e| e.0)
    }
}

/// Receiving half of an in-memory link.
#[derive(Debug)]
struct MemRx {
    rx: mpsc::UnboundedReceiver<Message>,
    /// `Closed` has been reported.
    done: bool,
}

impl LinkRecv for MemRx {
    fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<LinkEvent>> {
        if self.done {
            return Poll::Ready(None);
        }
        match self.rx.poll_recv(cx) {
            Poll::Ready(Some(m)) => Poll::Ready(Some(LinkEvent::Message(m))),
            Poll::Ready(None) => {
                self.done = true;
                Poll::Ready(Some(LinkEvent::Closed("connection closed".into())))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

/// Where in-memory links are made: named listeners, like addresses on a network that exists only in this
/// process. Clones share the same listeners.
#[derive(Clone, Debug, Default)]
pub struct MemNetwork(Arc<Mutex<HashMap<String, mpsc::UnboundedSender<Link>>>>);

impl MemNetwork {
    /// Listen at `mem://NAME` (replacing an earlier listener of that name).
    pub fn listen(&self, name: &str) -> MemListener {
        let (tx, rx) = mpsc::unbounded_channel();
        self.0.lock().unwrap_or_else(|p| p.into_inner()).insert(name.to_string(), tx);
        MemListener(rx)
    }
}

/// The accepting end of `mem://NAME` ([`MemNetwork::listen`]).
#[derive(Debug)]
pub struct MemListener(mpsc::UnboundedReceiver<Link>);

impl MemListener {
    /// The next link made to this name; None once the network forgot it.
    pub async fn accept(&mut self) -> Option<Link> {
        self.0.recv().await
    }
}

/// Connects to `mem://NAME` listeners of a [`MemNetwork`]: in-memory links ([`mem_pair`]).
#[derive(Clone, Debug)]
pub struct MemTransport {
    /// The network whose listeners it reaches.
    pub net: MemNetwork,
    /// This end's name, the peer's [`Link::peer`].
    pub name: String,
}

impl Transport for MemTransport {
    fn name(&self) -> &'static str {
        "mem"
    }

    /// A link to the listener at `endpoint` (`mem://NAME`); `ConnectionRefused` when nothing listens there.
    fn connect(&self, endpoint: String) -> Pin<Box<dyn Future<Output = std::io::Result<Link>> + Send>> {
        let name = endpoint.strip_prefix("mem://").unwrap_or(&endpoint).to_string();
        let listener = self.net.0.lock().unwrap_or_else(|p| p.into_inner()).get(&name).cloned();
        let ours = self.name.clone();
        Box::pin(async move {
            let refused =
                || std::io::Error::new(std::io::ErrorKind::ConnectionRefused, format!("nothing at mem://{name}"));
            let listener = listener.ok_or_else(refused)?;
            let (mine, theirs) = mem_pair(&ours, &name);
            listener.send(theirs).map_err(|_| refused())?;
            Ok(mine)
        })
    }
}

#[cfg(test)]
mod tests {
    //! The same tests for every link that needs no device: in-memory, and the authenticated TCP links on
    //! loopback. The verbs and libfabric links run them through the instance tests (the RDMA VM suite,
    //! `instance_ofi`).
    use super::*;
    use crate::keyfile::KeyFile as _;
    use serde_json::json;
    use std::time::Duration;

    /// Two ends of a link of each kind that needs no device.
    async fn pairs() -> Vec<(&'static str, Link, Link)> {
        let (a, b) = mem_pair("a", "b");
        let mut v = vec![("mem", a, b)];
        let net = MemNetwork::default();
        let mut l = net.listen("parent");
        let a = MemTransport { net: net.clone(), name: "child".into() }.connect("mem://parent".into()).await.unwrap();
        let b = l.accept().await.unwrap();
        v.push(("mem transport", a, b));
        // TCP: the overlay's own authenticated links.
        let auth =
            Arc::new(super::super::secure::LinkAuth::new(crate::keyfile::OverlayKey::generate().unwrap(), "test"));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let responder = {
            let auth = auth.clone();
            tokio::spawn(async move {
                let (mut s, peer) = listener.accept().await.unwrap();
                let session = super::super::secure::respond(&mut s, &auth).await.unwrap();
                secure_link(s, session, peer.to_string(), None)
            })
        };
        let a = TcpTransport { auth }.connect(format!("tcp://{addr}")).await.unwrap();
        // The responder's handshake ends with the initiator's first record, the hello.
        a.tx.send(Message::control("hello", &json!({}))).unwrap();
        let b = responder.await.unwrap();
        v.push(("tcp", a, b));
        for (kind, a, b) in v.iter_mut() {
            if *kind != "tcp" {
                a.tx.send(Message::control("hello", &json!({}))).unwrap();
            }
            let LinkEvent::Message(m) = next(&mut b.rx).await else { panic!("{kind}: no hello") };
            assert_eq!(m.topic, "hello", "{kind}");
        }
        v
    }

    async fn next(rx: &mut LinkRx) -> LinkEvent {
        tokio::time::timeout(Duration::from_secs(5), rx.recv()).await.expect("an event in time").expect("an event")
    }

    #[tokio::test]
    async fn messages_arrive_in_order_both_ways() {
        for (kind, mut a, mut b) in pairs().await {
            for i in 0..100u32 {
                a.tx.send(Message::request("t.ping", 1, &json!({"i": i}))).unwrap();
            }
            b.tx.send(Message::control("hb", &json!({}))).unwrap();
            for i in 0..100u32 {
                let LinkEvent::Message(m) = next(&mut b.rx).await else { panic!("{kind}: closed") };
                assert_eq!((m.topic.as_str(), m.json()["i"].as_u64()), ("t.ping", Some(u64::from(i))), "{kind}");
            }
            let LinkEvent::Message(m) = next(&mut a.rx).await else { panic!("{kind}: closed") };
            assert_eq!(m.topic, "hb", "{kind}");
        }
    }

    #[tokio::test]
    async fn a_closed_end_is_seen_once_after_what_it_sent_and_sends_come_back() {
        for (kind, mut a, b) in pairs().await {
            // A goodbye, then the end drops its halves: the goodbye arrives, then the end, once.
            b.tx.send(Message::control("goodbye", &json!({}))).unwrap();
            drop(b);
            let LinkEvent::Message(m) = next(&mut a.rx).await else { panic!("{kind}: closed before goodbye") };
            assert_eq!(m.topic, "goodbye", "{kind}");
            let LinkEvent::Closed(why) = next(&mut a.rx).await else { panic!("{kind}: a message after close") };
            assert!(!why.is_empty(), "{kind}");
            assert!(a.rx.recv().await.is_none(), "{kind}: one Closed, then nothing");
            // Sends to a closed peer come back (at once in memory, once the writer has failed on TCP).
            let mut back = false;
            for _ in 0..200 {
                if a.tx.send(Message::control("hb", &json!({}))).is_err() {
                    back = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            assert!(back, "{kind}: sends to a closed link keep being taken");
        }
    }

    #[tokio::test]
    async fn close_ends_the_peer_at_once() {
        for (kind, mut a, b) in pairs().await {
            b.close();
            let LinkEvent::Closed(_) = next(&mut a.rx).await else { panic!("{kind}: a message after close") };
        }
    }

    #[tokio::test]
    async fn nothing_listens_is_refused() {
        let t = MemTransport { net: MemNetwork::default(), name: "child".into() };
        let e = t.connect("mem://nobody".into()).await.unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused);
    }

    #[test]
    fn links_describe_what_they_run_on() {
        assert_eq!(LinkChoice::tcp("no verbs devices").describe(), "tcp (no verbs devices)");
        let r = LinkChoice { transport: "rdma", detail: "rxe0 port 1 gid 1 (::1)".into() };
        assert_eq!(r.describe(), "rdma on rxe0 port 1 gid 1 (::1)");
        let o = LinkChoice { transport: "ofi", detail: "provider tcp;ofi_rxm, fabric x".into() };
        assert_eq!(o.describe(), "ofi (provider tcp;ofi_rxm, fabric x)");
    }
}
