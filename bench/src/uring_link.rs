//! An overlay [`Link`] whose socket I/O is driven by `io_uring` instead of tokio's epoll reactor, for the
//! `vigil-bench uring` comparison only (the broker does not use it).
//!
//! Each link gets a dedicated thread owning one ring. The thread keeps at most one `RECV`, one `SEND` and one
//! `READ` of an eventfd in flight:
//! - inbound bytes land in a [`FrameBuf`]; every complete frame is decoded with
//!   [`Message::decode_body`] (the same decoder `read_frame` ends in) and handed to the broker side through
//!   the same unbounded tokio channel a tokio link uses;
//! - outbound messages are taken from the link's [`LinkTx`](vigil::broker::transport::LinkTx) channel, polled
//!   with a waker that writes the eventfd, so a `tx.send` from the broker wakes the ring thread through the
//!   ring itself. Everything already queued is encoded into one buffer and sent with one `SEND` (the tokio
//!   writer task's batch-then-flush);
//! - when every sender is gone and the buffer is flushed, the write side is shut down, as the tokio writer
//!   task does; end of stream or a bad frame ends the reader with one [`LinkEvent::Closed`].
//!
//! So the broker-facing surface is exactly a [`Link`]; the cost of the thread handoff (eventfd write one way,
//! a cross-thread channel wake the other way) is part of what the benchmark measures.

use io_uring::{opcode, types, IoUring};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::JoinHandle;
use tokio::sync::mpsc;
use vigil::broker::transport::{Link, LinkEvent};
use vigil::message::{DecodeError, FrameError, Message, HEADER_LEN, MAGIC, MAX_FRAME, WIRE_VERSION};

/// Submission queue entries of a link's ring (at most three operations are ever in flight).
const RING_ENTRIES: u32 = 8;
/// Initial size of the receive buffer; it grows to hold a larger frame.
pub(crate) const RECV_BUF: usize = 256 << 10;
/// Below this much free space at the end of the receive buffer, it is compacted before the next `RECV`.
const MIN_RECV_SPACE: usize = 64 << 10;
/// `user_data` of the socket `RECV`.
const UD_RECV: u64 = 1;
/// `user_data` of the socket `SEND`.
const UD_SEND: u64 = 2;
/// `user_data` of the eventfd `READ` that wakes the thread for outbound messages.
const UD_WAKE: u64 = 3;

/// A [`Link`] driven by an `io_uring` thread, and that thread.
pub(crate) struct UringLink {
    /// The broker-facing link: the same channels a tokio link has (`tasks` is empty: there is no tokio task).
    pub(crate) link: Link,
    /// The ring thread; it ends once the link's senders are dropped and the peer has closed its side.
    pub(crate) thread: JoinHandle<()>,
}

/// Can this process use `io_uring` for socket I/O? `Ok` describes the ring set-up used; `Err` says why not
/// (for example `io_uring_setup` refused by `kernel.io_uring_disabled` or a seccomp filter).
pub(crate) fn probe() -> Result<String, String> {
    let (ring, setup) = new_ring().map_err(|e| {
        let sysctl = std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled")
            .map(|s| format!(" (kernel.io_uring_disabled = {})", s.trim()))
            .unwrap_or_default();
        format!("io_uring_setup failed: {e}{sysctl}")
    })?;
    let mut p = io_uring::Probe::new();
    ring.submitter().register_probe(&mut p).map_err(|e| format!("IORING_REGISTER_PROBE failed: {e}"))?;
    for (name, code) in [("RECV", opcode::Recv::CODE), ("SEND", opcode::Send::CODE), ("READ", opcode::Read::CODE)] {
        if !p.is_supported(code) {
            return Err(format!("this kernel's io_uring lacks IORING_OP_{name}"));
        }
    }
    Ok(setup.to_string())
}

/// A ring for one link thread: `SINGLE_ISSUER | DEFER_TASKRUN` (completion work runs only when the thread
/// waits, Linux 6.1+) if the kernel takes it, else a default ring. Returns the ring and which set-up it got.
fn new_ring() -> io::Result<(IoUring, &'static str)> {
    match IoUring::builder().setup_single_issuer().setup_defer_taskrun().build(RING_ENTRIES) {
        Ok(r) => Ok((r, "SINGLE_ISSUER|DEFER_TASKRUN")),
        Err(_) => Ok((IoUring::new(RING_ENTRIES)?, "default")),
    }
}

/// Wrap a connected TCP socket into a [`Link`] driven by a new `io_uring` thread. The socket should already
/// be tuned (`TCP_NODELAY`); blocking or not does not matter to the ring.
pub(crate) fn uring_link(stream: std::net::TcpStream, peer: String) -> io::Result<UringLink> {
    // SAFETY: eventfd has no memory arguments; the result is checked before use.
    let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if efd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `efd` is a fresh descriptor that nothing else owns.
    let efd = Arc::new(EventFdWaker(unsafe { OwnedFd::from_raw_fd(efd) }));
    let (tx, out_rx) = mpsc::unbounded_channel::<Message>();
    let (in_tx, rx) = mpsc::unbounded_channel::<LinkEvent>();
    // The ring is created on its own thread (a SINGLE_ISSUER ring must be driven by its creator).
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<io::Result<()>>();
    let thread = std::thread::Builder::new().name("uring-link".into()).spawn(move || {
        let ring = match new_ring() {
            Ok((r, _)) => {
                let _ = ready_tx.send(Ok(()));
                r
            }
            Err(e) => {
                let _ = ready_tx.send(Err(e));
                return;
            }
        };
        drive(ring, stream, efd, out_rx, in_tx);
    })?;
    match ready_rx.recv() {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(e),
        Err(_) => return Err(io::Error::other("the io_uring link thread died before starting")),
    }
    Ok(UringLink { link: Link { tx: tx.into(), rx: rx.into(), peer, sock: None, tasks: Vec::new() }, thread })
}

/// Waker of the ring thread: a write to its eventfd completes the pending eventfd `READ`.
struct EventFdWaker(OwnedFd);

impl Wake for EventFdWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        let one: u64 = 1;
        // SAFETY: writes the 8 bytes of a live u64 to an eventfd this waker owns.
        unsafe { libc::write(self.0.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }
}

/// Receive buffer that reassembles frames from arbitrary chunks of the byte stream.
pub(crate) struct FrameBuf {
    /// Storage; bytes `start..end` are received and not yet decoded.
    buf: Vec<u8>,
    /// First byte not yet decoded.
    start: usize,
    /// End of the received bytes.
    end: usize,
}

impl FrameBuf {
    /// An empty buffer of `cap` bytes.
    pub(crate) fn new(cap: usize) -> FrameBuf {
        FrameBuf { buf: vec![0; cap], start: 0, end: 0 }
    }

    /// Bytes received and not yet decoded (a partial frame).
    pub(crate) fn pending(&self) -> usize {
        self.end - self.start
    }

    /// Size of the frame at the front, once its header has been checked (0 if not known yet). Like
    /// `read_frame`, the magic and version are checked before a large length is trusted to grow the buffer.
    fn wanted(&self) -> usize {
        let b = &self.buf[self.start..self.end];
        if b.len() < 8 || b[4..6] != MAGIC || b[6] != WIRE_VERSION {
            return 0;
        }
        4 + u32::from_be_bytes([b[0], b[1], b[2], b[3]]).min(MAX_FRAME) as usize
    }

    /// The free space where the next chunk is to be received: compacts the buffer when the tail is short or
    /// the frame at the front would not fit, and grows it to hold that frame.
    pub(crate) fn spare(&mut self) -> &mut [u8] {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        let want = self.wanted();
        if self.start > 0 && (self.buf.len() - self.end < MIN_RECV_SPACE || self.start + want > self.buf.len()) {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if want > self.buf.len() {
            self.buf.resize(want, 0);
        }
        &mut self.buf[self.end..]
    }

    /// Record that `n` bytes were received into [`spare`](Self::spare).
    pub(crate) fn filled(&mut self, n: usize) {
        self.end = (self.end + n).min(self.buf.len());
    }

    /// Decode the next complete frame, if one is buffered; the same checks as `read_frame`, in its order.
    pub(crate) fn next_frame(&mut self) -> Option<Result<Message, DecodeError>> {
        let b = &self.buf[self.start..self.end];
        if b.len() < 4 {
            return None;
        }
        let len = u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
        if len > MAX_FRAME {
            return Some(Err(DecodeError::TooLarge(len)));
        }
        if (len as usize) < HEADER_LEN {
            return Some(Err(DecodeError::Truncated(len as usize)));
        }
        if b.len() >= 8 {
            if b[4..6] != MAGIC {
                return Some(Err(DecodeError::BadMagic([b[4], b[5]])));
            }
            if b[6] != WIRE_VERSION {
                return Some(Err(DecodeError::Version(b[6])));
            }
        }
        let total = 4 + len as usize;
        if b.len() < total {
            return None;
        }
        let m = Message::decode_body(&b[4..total]);
        self.start += total;
        Some(m)
    }
}

/// The ring thread: runs until the write side is done (senders gone and flushed, or a send failed) and the
/// read side is done (end of stream, an error, or the broker side dropped its receiver).
fn drive(
    mut ring: IoUring,
    stream: std::net::TcpStream,
    efd: Arc<EventFdWaker>,
    out_rx: mpsc::UnboundedReceiver<Message>,
    in_tx: mpsc::UnboundedSender<LinkEvent>,
) {
    let fd = types::Fd(stream.as_raw_fd());
    let wake_fd = types::Fd(efd.0.as_raw_fd());
    let waker = Waker::from(efd.clone());
    let mut cx = Context::from_waker(&waker);
    let mut out_rx = Some(out_rx);
    let mut rbuf = FrameBuf::new(RECV_BUF);
    // Target of the eventfd READ; boxed so its address is stable while the kernel may write it.
    let mut wake_word = Box::new(0u64);
    // `sending[sent..]` is in flight or about to be; `queued` collects what arrives meanwhile.
    let (mut sending, mut sent, mut queued) = (Vec::<u8>::new(), 0usize, Vec::<u8>::new());
    let (mut recv_armed, mut send_armed, mut wake_armed) = (false, false, false);
    let (mut reading, mut write_done) = (true, false);
    let closed = |in_tx: &mpsc::UnboundedSender<LinkEvent>, why: String| {
        let _ = in_tx.send(LinkEvent::Closed(why));
    };
    loop {
        // Outbound: take everything already queued, as the tokio writer task does before flushing.
        if let Some(rx) = out_rx.as_mut() {
            let mut gone = false;
            loop {
                match rx.poll_recv(&mut cx) {
                    Poll::Ready(Some(m)) => {
                        let frame = m.encode();
                        if queued.is_empty() {
                            queued = frame;
                        } else {
                            queued.extend_from_slice(&frame);
                        }
                    }
                    Poll::Ready(None) => {
                        gone = true;
                        break;
                    }
                    Poll::Pending => break,
                }
            }
            if gone {
                out_rx = None;
            }
        }
        if !send_armed && !write_done {
            if sent == sending.len() && !queued.is_empty() {
                sending.clear();
                std::mem::swap(&mut sending, &mut queued);
                sent = 0;
            }
            if sent < sending.len() {
                let rest = &sending[sent..];
                let sqe = opcode::Send::new(fd, rest.as_ptr(), rest.len().min(u32::MAX as usize) as u32)
                    .flags(libc::MSG_NOSIGNAL)
                    .build()
                    .user_data(UD_SEND);
                // SAFETY: `sending` is neither touched nor freed until this SEND completes (`send_armed`).
                send_armed = unsafe { ring.submission().push(&sqe) }.is_ok();
            } else if out_rx.is_none() {
                // Every sender is gone and everything is flushed: shut the write side, like `w.shutdown()`.
                // SAFETY: shutdown(2) on the socket this thread owns.
                unsafe { libc::shutdown(stream.as_raw_fd(), libc::SHUT_WR) };
                write_done = true;
            }
        }
        if reading && !recv_armed {
            let spare = rbuf.spare();
            let sqe = opcode::Recv::new(fd, spare.as_mut_ptr(), spare.len().min(u32::MAX as usize) as u32)
                .build()
                .user_data(UD_RECV);
            // SAFETY: `rbuf` is not touched until this RECV completes (`recv_armed`).
            recv_armed = unsafe { ring.submission().push(&sqe) }.is_ok();
        }
        if out_rx.is_some() && !wake_armed {
            let sqe = opcode::Read::new(wake_fd, (&mut *wake_word as *mut u64).cast(), 8).build().user_data(UD_WAKE);
            // SAFETY: `wake_word` is boxed and outlives the READ: the thread waits for it before returning.
            wake_armed = unsafe { ring.submission().push(&sqe) }.is_ok();
        }
        if write_done && !reading && !send_armed && !recv_armed {
            break;
        }
        if let Err(e) = ring.submit_and_wait(1) {
            if e.raw_os_error() == Some(libc::EINTR) || e.raw_os_error() == Some(libc::EBUSY) {
                continue;
            }
            // The ring itself failed: nothing more can be done on this link.
            if reading {
                closed(&in_tx, format!("io_uring_enter: {e}"));
            }
            return;
        }
        for cqe in ring.completion() {
            let res = cqe.result();
            match cqe.user_data() {
                UD_RECV => {
                    recv_armed = false;
                    if res < 0 {
                        closed(&in_tx, FrameError::from(io::Error::from_raw_os_error(-res)).to_string());
                        reading = false;
                    } else if res == 0 {
                        let why = match rbuf.pending() {
                            0 => "connection closed".to_string(),
                            n => FrameError::from(DecodeError::Truncated(n)).to_string(),
                        };
                        closed(&in_tx, why);
                        reading = false;
                    } else {
                        rbuf.filled(res as usize);
                        while let Some(r) = rbuf.next_frame() {
                            match r {
                                Ok(m) => {
                                    if in_tx.send(LinkEvent::Message(m)).is_err() {
                                        reading = false;
                                        break;
                                    }
                                }
                                Err(e) => {
                                    closed(&in_tx, FrameError::from(e).to_string());
                                    reading = false;
                                    break;
                                }
                            }
                        }
                    }
                }
                UD_SEND => {
                    send_armed = false;
                    if res < 0 {
                        // The tokio writer task returns on a write error: stop taking messages.
                        write_done = true;
                        out_rx = None;
                        sending.clear();
                        queued.clear();
                        sent = 0;
                    } else {
                        sent += res as usize;
                    }
                }
                _ => wake_armed = false,
            }
        }
    }
    // Retire the eventfd READ before its buffer and the ring go away.
    while wake_armed {
        waker.wake_by_ref();
        if ring.submit_and_wait(1).is_err() {
            break;
        }
        for cqe in ring.completion() {
            if cqe.user_data() == UD_WAKE {
                wake_armed = false;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vigil::broker::transport::link_from_stream;
    use vigil::message::MsgType;

    /// A request like the overlay carries: routed, with a small JSON payload.
    fn sample(i: u32, payload_len: usize) -> Message {
        let mut m = Message::request("job-info.lookup", 3, &serde_json::json!({"id": i}));
        m.matchtag = i;
        m.route = vec![vigil::message::ROUTE_LOCAL | 4, 1];
        if payload_len > 0 {
            m.payload = vec![b'x'; payload_len];
        }
        m
    }

    #[test]
    fn frames_split_anywhere_decode_the_same() {
        let msgs: Vec<Message> = (0..5).map(|i| sample(i, if i == 2 { 300_000 } else { 0 })).collect();
        let wire: Vec<u8> = msgs.iter().flat_map(|m| m.encode()).collect();
        for chunk in [1, 3, 7, 4096, 70_000, wire.len()] {
            let mut fb = FrameBuf::new(1024);
            let mut got = Vec::new();
            for piece in wire.chunks(chunk) {
                let mut off = 0;
                while off < piece.len() {
                    let spare = fb.spare();
                    let n = spare.len().min(piece.len() - off);
                    spare[..n].copy_from_slice(&piece[off..off + n]);
                    fb.filled(n);
                    off += n;
                    while let Some(r) = fb.next_frame() {
                        got.push(r.unwrap());
                    }
                }
            }
            assert_eq!(got, msgs, "chunk size {chunk}");
            assert_eq!(fb.pending(), 0);
        }
    }

    #[test]
    fn bad_frames_are_rejected_before_growing() {
        let mut fb = FrameBuf::new(64);
        let mut f = sample(1, 0).encode();
        f[4] = b'X';
        fb.spare()[..f.len().min(64)].copy_from_slice(&f[..f.len().min(64)]);
        fb.filled(f.len().min(64));
        assert!(matches!(fb.next_frame(), Some(Err(DecodeError::BadMagic(_)))));

        let mut fb = FrameBuf::new(64);
        fb.spare()[..8].copy_from_slice(&[0xff, 0xff, 0xff, 0xff, b'V', b'G', 1, 1]);
        fb.filled(8);
        assert!(matches!(fb.next_frame(), Some(Err(DecodeError::TooLarge(_)))));
    }

    /// A connected loopback TCP pair (tokio streams, `TCP_NODELAY`).
    async fn pair() -> (tokio::net::TcpStream, tokio::net::TcpStream) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let (c, s) = tokio::join!(tokio::net::TcpStream::connect(addr), l.accept());
        let (c, s) = (c.unwrap(), s.unwrap().0);
        c.set_nodelay(true).unwrap();
        s.set_nodelay(true).unwrap();
        (c, s)
    }

    #[test]
    fn uring_link_talks_to_a_tokio_link() {
        if let Err(why) = probe() {
            eprintln!("skipped: {why}");
            return;
        }
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let th = rt.block_on(async {
            let (c, s) = pair().await;
            let UringLink { link: mut u, thread } = uring_link(c.into_std().unwrap(), "server".into()).unwrap();
            let mut t = link_from_stream(s, "client".into());
            // Both directions, small and large frames, several queued at once (one batched SEND).
            let msgs: Vec<Message> = (0..50).map(|i| sample(i, if i % 10 == 9 { 200_000 } else { 0 })).collect();
            for m in &msgs {
                u.tx.send(m.clone()).unwrap();
            }
            for m in &msgs {
                match t.rx.recv().await {
                    Some(LinkEvent::Message(got)) => assert_eq!(&got, m),
                    other => panic!("tokio side got {other:?}"),
                }
                let mut r = m.clone();
                r.msgtype = MsgType::Response;
                t.tx.send(r).unwrap();
            }
            for m in &msgs {
                match u.rx.recv().await {
                    Some(LinkEvent::Message(got)) => {
                        assert_eq!(got.matchtag, m.matchtag);
                        assert_eq!(got.msgtype, MsgType::Response);
                        assert_eq!(got.payload, m.payload);
                    }
                    other => panic!("io_uring side got {other:?}"),
                }
            }
            // Closing the tokio side is reported once, as a tokio link reports it.
            drop(t);
            match u.rx.recv().await {
                Some(LinkEvent::Closed(why)) => assert_eq!(why, "connection closed"),
                other => panic!("expected Closed, got {other:?}"),
            }
            drop(u);
            thread
        });
        th.join().unwrap();
    }

    #[test]
    fn a_bad_frame_closes_the_uring_link() {
        if let Err(why) = probe() {
            eprintln!("skipped: {why}");
            return;
        }
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let th = rt.block_on(async {
            use tokio::io::AsyncWriteExt;
            let (c, mut s) = pair().await;
            let UringLink { link: mut u, thread } = uring_link(c.into_std().unwrap(), "peer".into()).unwrap();
            let mut f = sample(7, 0).encode();
            f[6] = 9; // wire version
            s.write_all(&f).await.unwrap();
            match u.rx.recv().await {
                Some(LinkEvent::Closed(why)) => assert!(why.contains("version"), "{why}"),
                other => panic!("expected Closed, got {other:?}"),
            }
            drop(u);
            drop(s);
            thread
        });
        th.join().unwrap();
    }
}
