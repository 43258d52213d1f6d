//! Overlay link security: every overlay link is mutually authenticated and encrypted with the Noise protocol
//! framework (`snow`), pattern [`NOISE_PARAMS`], keyed by the instance's [`OverlayKey`] as the pre-shared key and
//! bound to the instance id through the Noise prologue. docs/wire-format.md ("Link security") is the
//! specification; this module is its implementation.
//!
//! # Wire
//! - **Handshake** (before authentication): two Noise messages, each as `u16 length (big-endian) | message`.
//!   Either message is 48 bytes; one announced longer than [`HANDSHAKE_MSG_MAX`] closes the connection at once.
//!   `-> psk, e` then `<- e, ee`: a peer that lacks the key (or has another one, or belongs to another instance)
//!   fails the first message's tag, and a replayed first message gives the replayer a session whose keys depend
//!   on an ephemeral secret it does not have.
//! - **Records** (after it): the byte stream of overlay frames (see `message`) cut into records of
//!   `u16 length | AES-256-GCM ciphertext of at most 65519 bytes | 16-byte tag`, nonces counting from 0 in each
//!   direction. A record that fails its tag (tampered, replayed, reordered, truncated) closes the link.
//!   Records do not follow frame boundaries: one record carries many small frames, a large frame spans many.
//! - The responder learns that the initiator holds the key only from its first record, which must arrive within
//!   [`HANDSHAKE_TIMEOUT`] of the connection and be at most [`FIRST_RECORD_MAX`] bytes: it carries the `hello`.
//!
//! # Bounds before authentication (the responder, i.e. any broker's listener)
//! At most [`MAX_PENDING_HANDSHAKES`] connections may be between accept and their first record; admitting one
//! more closes the oldest (so connections that never authenticate cannot keep out a broker whose handshake takes
//! milliseconds), and at most [`MAX_PENDING_PER_ADDRESS`] may come from one address other than loopback. Each
//! pending one holds at most about 4.3 KiB of buffers (a 64-byte handshake buffer, the first record), and is
//! closed after [`HANDSHAKE_TIMEOUT`]. So unauthenticated peers can make a broker hold at most
//! about 128 × 4.3 KiB ≈ 0.6 MiB, plus their sockets' kernel buffers.

use crate::keyfile::OverlayKey;
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};

/// The Noise protocol name (defined with the wire format in `vigil-proto`, where `broker.info` reads it too).
pub use vigil_proto::message::NOISE_PARAMS;

/// Prologue prefix: both ends hash it, followed by the instance id, into the handshake; a mismatch fails it.
const PROLOGUE: &[u8] = b"vigil overlay 1\0";

/// Largest handshake message accepted (bytes after the length prefix). Both of NNpsk0's messages are 48.
pub const HANDSHAKE_MSG_MAX: usize = 64;

/// Largest first record a responder reads before the initiator is authenticated (bytes after the length
/// prefix). It carries the `hello`, a few hundred bytes.
pub const FIRST_RECORD_MAX: usize = 4096;

/// Time from accept to an authenticated first record (the hello); slower connections are closed.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// Connections a listener lets wait for their handshake at once; more are closed when accepted.
pub const MAX_PENDING_HANDSHAKES: usize = 128;

/// Bytes of a record's authentication tag.
const TAG: usize = 16;
/// Largest record (a Noise message).
const RECORD_MAX: usize = 65535;
/// Largest plaintext of one record.
const PLAIN_MAX: usize = RECORD_MAX - TAG;

/// What a broker needs to secure its links: the key and the instance it belongs to.
#[derive(Clone)]
pub struct LinkAuth {
    key: OverlayKey,
    prologue: Vec<u8>,
}

impl std::fmt::Debug for LinkAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LinkAuth(..)")
    }
}

impl LinkAuth {
    /// Links of `instance` keyed by `key`.
    pub fn new(key: OverlayKey, instance: &str) -> LinkAuth {
        let mut prologue = PROLOGUE.to_vec();
        prologue.extend_from_slice(instance.as_bytes());
        LinkAuth { key, prologue }
    }

    fn builder(&self) -> snow::Builder<'_> {
        // NOISE_PARAMS is a constant this crate's tests parse.
        let params: snow::params::NoiseParams = NOISE_PARAMS.parse().expect("NOISE_PARAMS is a valid Noise name");
        snow::Builder::new(params)
            .psk(0, self.key.bytes())
            .and_then(|b| b.prologue(&self.prologue))
            .expect("a 32-byte psk at position 0 and a prologue are valid for NNpsk0")
    }
}

/// Why a handshake failed. None of the texts carries key material or an instance id.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    /// The socket failed or closed.
    #[error("connection failed during the handshake: {0}")]
    Io(#[from] io::Error),
    /// A pre-authentication message was longer than allowed.
    #[error("handshake message of {0} bytes is over the limit")]
    TooLarge(usize),
    /// The peer does not hold this instance's key (or replayed a handshake).
    #[error("peer failed authentication (no or another overlay key, another instance, or a replay)")]
    Unauthenticated,
    /// The handshake did not finish in time.
    #[error("no authenticated hello within {}s", HANDSHAKE_TIMEOUT.as_secs())]
    Timeout,
}

/// One direction's cipher: Noise's CipherState for AES-256-GCM, run in place on our own buffers (the bytes are
/// exactly what `snow`'s transport messages would be: nonce = 4 zero bytes then the counter big-endian, empty
/// associated data), so a record costs no copy beyond the one the plain link makes.
struct Cipher {
    key: ring::aead::LessSafeKey,
    nonce: u64,
}

/// The key is never printed: only how many records it has sealed or opened.
impl std::fmt::Debug for Cipher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cipher").field("nonce", &self.nonce).finish_non_exhaustive()
    }
}

impl Cipher {
    fn new(k: &[u8; 32]) -> Cipher {
        let key = ring::aead::UnboundKey::new(&ring::aead::AES_256_GCM, k).expect("AES-256-GCM takes a 32-byte key");
        Cipher { key: ring::aead::LessSafeKey::new(key), nonce: 0 }
    }

    fn next_nonce(&mut self) -> ring::aead::Nonce {
        let mut n = [0u8; 12];
        n[4..].copy_from_slice(&self.nonce.to_be_bytes());
        self.nonce += 1;
        ring::aead::Nonce::assume_unique_for_key(n)
    }

    /// Seal `buf` in place and return its tag.
    fn seal(&mut self, buf: &mut [u8]) -> io::Result<ring::aead::Tag> {
        let nonce = self.next_nonce();
        self.key
            .seal_in_place_separate_tag(nonce, ring::aead::Aad::empty(), buf)
            .map_err(|_| io::Error::other("cannot seal an overlay record"))
    }

    /// Open `record` (ciphertext then tag) in place; the plaintext's length.
    fn open(&mut self, record: &mut [u8]) -> Result<usize, ()> {
        let nonce = self.next_nonce();
        self.key.open_in_place(nonce, ring::aead::Aad::empty(), record).map(|p| p.len()).map_err(|_| ())
    }
}

/// An authenticated session: each direction's cipher, and plaintext already read (the responder's first
/// record).
#[derive(Debug)]
pub struct Session {
    send: Cipher,
    recv: Cipher,
    read_ahead: Vec<u8>,
}

/// The two ciphers of a finished handshake, from the initiator's or the responder's side.
fn ciphers(mut hs: snow::HandshakeState) -> Result<(Cipher, Cipher), HandshakeError> {
    if !hs.is_handshake_finished() {
        return Err(HandshakeError::Unauthenticated);
    }
    let (i2r, r2i) = hs.dangerously_get_raw_split();
    let (i2r, r2i) = (Cipher::new(&i2r), Cipher::new(&r2i));
    Ok(if hs.is_initiator() { (i2r, r2i) } else { (r2i, i2r) })
}

async fn send_handshake<S: AsyncWrite + Unpin>(s: &mut S, msg: &[u8]) -> io::Result<()> {
    let mut b = Vec::with_capacity(2 + msg.len());
    b.extend_from_slice(&(msg.len() as u16).to_be_bytes());
    b.extend_from_slice(msg);
    s.write_all(&b).await?;
    s.flush().await
}

/// Read `u16 length | bytes` with the length at most `max`, into `buf` (resized).
async fn recv_bounded<S: AsyncRead + Unpin>(s: &mut S, max: usize, buf: &mut Vec<u8>) -> Result<(), HandshakeError> {
    let mut len = [0u8; 2];
    s.read_exact(&mut len).await?;
    let n = u16::from_be_bytes(len) as usize;
    if n > max {
        return Err(HandshakeError::TooLarge(n));
    }
    buf.resize(n, 0);
    s.read_exact(buf).await?;
    Ok(())
}

/// Run the initiator's side (the child connecting to its parent) on a fresh connection.
pub async fn initiate<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    auth: &LinkAuth,
) -> Result<Session, HandshakeError> {
    let mut hs = auth.builder().build_initiator().map_err(|_| HandshakeError::Unauthenticated)?;
    let mut msg = [0u8; HANDSHAKE_MSG_MAX];
    let n = hs.write_message(&[], &mut msg).map_err(|_| HandshakeError::Unauthenticated)?;
    send_handshake(s, &msg[..n]).await?;
    let mut reply = Vec::with_capacity(HANDSHAKE_MSG_MAX);
    recv_bounded(s, HANDSHAKE_MSG_MAX, &mut reply).await?;
    let mut payload = [0u8; HANDSHAKE_MSG_MAX];
    hs.read_message(&reply, &mut payload).map_err(|_| HandshakeError::Unauthenticated)?;
    let (send, recv) = ciphers(hs)?;
    Ok(Session { send, recv, read_ahead: Vec::new() })
}

/// Run the responder's side (a listener's accepted connection), through the initiator's first record, within
/// [`HANDSHAKE_TIMEOUT`]. On success the initiator is authenticated and the record's plaintext (the hello) is
/// kept in the session for the link's reader.
pub async fn respond<S: AsyncRead + AsyncWrite + Unpin>(s: &mut S, auth: &LinkAuth) -> Result<Session, HandshakeError> {
    respond_keyed(s, auth, || {}).await
}

/// [`respond`], calling `keyed` once the initiator's first message has passed its authentication: its sender
/// holds the overlay key (or replays a message of one, and cannot go further), which the listener uses to keep
/// such a connection's slot from a flood of connections that do not (`HandshakeSlots::keyed`).
pub async fn respond_keyed<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    auth: &LinkAuth,
    keyed: impl FnOnce(),
) -> Result<Session, HandshakeError> {
    tokio::time::timeout(HANDSHAKE_TIMEOUT, respond_inner(s, auth, keyed)).await.map_err(|_| HandshakeError::Timeout)?
}

async fn respond_inner<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    auth: &LinkAuth,
    keyed: impl FnOnce(),
) -> Result<Session, HandshakeError> {
    let mut hs = auth.builder().build_responder().map_err(|_| HandshakeError::Unauthenticated)?;
    let mut buf = Vec::with_capacity(HANDSHAKE_MSG_MAX);
    recv_bounded(s, HANDSHAKE_MSG_MAX, &mut buf).await?;
    let mut payload = [0u8; HANDSHAKE_MSG_MAX];
    hs.read_message(&buf, &mut payload).map_err(|_| HandshakeError::Unauthenticated)?;
    keyed();
    let mut msg = [0u8; HANDSHAKE_MSG_MAX];
    let n = hs.write_message(&[], &mut msg).map_err(|_| HandshakeError::Unauthenticated)?;
    send_handshake(s, &msg[..n]).await?;
    let (send, mut recv) = ciphers(hs)?;
    recv_bounded(s, FIRST_RECORD_MAX, &mut buf).await?;
    let n = recv.open(&mut buf).map_err(|_| HandshakeError::Unauthenticated)?;
    buf.truncate(n);
    Ok(Session { send, recv, read_ahead: buf })
}

impl Session {
    /// The reading and writing ends of the secured stream.
    pub fn split<R, W>(self, rd: R, wr: W) -> (SecureReader<R>, SecureWriter<W>) {
        let mut reader = SecureReader::new(rd, self.recv);
        reader.end = self.read_ahead.len();
        reader.start = reader.end;
        reader.plain = (0, reader.end);
        reader.input = self.read_ahead;
        let writer = SecureWriter { inner: wr, cipher: self.send, out: Vec::new(), open: None, sent: 0 };
        (reader, writer)
    }
}

/// The reading end of a secured link: decrypts records in its own input buffer and yields the plaintext byte
/// stream. It buffers what it reads from the socket itself (one `read` brings many small records), so it wants
/// an unbuffered reader.
#[derive(Debug)]
pub struct SecureReader<R> {
    inner: R,
    cipher: Cipher,
    /// Bytes read from `inner`. `input[plain.0..plain.1]` is plaintext not yet handed out (an opened record);
    /// records not yet opened follow, up to `end`.
    input: Vec<u8>,
    plain: (usize, usize),
    /// Start of the first unopened record.
    start: usize,
    end: usize,
}

/// Size of a reader's input buffer: two of the largest records, so one read can bring a whole one behind a
/// partial one.
const INPUT_BUF: usize = 2 * (2 + RECORD_MAX);

fn bad_record(why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("overlay record {why}"))
}

impl<R> SecureReader<R> {
    fn new(inner: R, cipher: Cipher) -> SecureReader<R> {
        SecureReader { inner, cipher, input: Vec::new(), plain: (0, 0), start: 0, end: 0 }
    }

    /// Open the next record if the input holds all of it: true when `plain` then holds its plaintext.
    fn open_next(&mut self) -> io::Result<bool> {
        let have = self.end - self.start;
        if have < 2 {
            return Ok(false);
        }
        let len = u16::from_be_bytes([self.input[self.start], self.input[self.start + 1]]) as usize;
        if len < TAG {
            return Err(bad_record("shorter than its tag"));
        }
        if have < 2 + len {
            return Ok(false);
        }
        let body = self.start + 2;
        let n = self.cipher.open(&mut self.input[body..body + len]).map_err(|_| bad_record("failed authentication"))?;
        self.plain = (body, body + n);
        self.start = body + len;
        Ok(true)
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for SecureReader<R> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        loop {
            let (p, q) = me.plain;
            if p < q {
                let n = buf.remaining().min(q - p);
                buf.put_slice(&me.input[p..p + n]);
                me.plain.0 += n;
                return Poll::Ready(Ok(()));
            }
            if me.open_next()? {
                continue;
            }
            // Need more input: drop what was consumed, make room at the end, then read.
            if me.start == me.end {
                (me.start, me.end) = (0, 0);
            }
            if me.input.len() < INPUT_BUF {
                me.input.resize(INPUT_BUF, 0);
            }
            if me.start > 0 && me.input.len() - me.end < 2 + RECORD_MAX {
                me.input.copy_within(me.start..me.end, 0);
                me.end -= me.start;
                me.start = 0;
            }
            me.plain = (me.start, me.start);
            let mut rb = ReadBuf::new(&mut me.input[me.end..]);
            ready!(Pin::new(&mut me.inner).poll_read(cx, &mut rb))?;
            let n = rb.filled().len();
            if n == 0 {
                return if me.start == me.end {
                    Poll::Ready(Ok(())) // clean end between records
                } else {
                    Poll::Ready(Err(bad_record("truncated")))
                };
            }
            me.end += n;
        }
    }
}

/// The writing end of a secured link: writes plaintext straight into the record being built in its output
/// buffer, seals it in place on flush (or when it is full) and writes the sealed records out.
#[derive(Debug)]
pub struct SecureWriter<W> {
    inner: W,
    cipher: Cipher,
    /// Sealed records, then the open one (if any): its length prefix at `open`, its plaintext after it.
    out: Vec<u8>,
    open: Option<usize>,
    /// Bytes of `out` already written.
    sent: usize,
}

/// Sealed bytes queued before `poll_write` first writes them out.
const OUT_HIGH: usize = 64 * 1024;

impl<W: AsyncWrite + Unpin> SecureWriter<W> {
    /// Largest plaintext of the next record: the first is read before its sender is authenticated, so it is
    /// kept within [`FIRST_RECORD_MAX`] whatever is queued behind the hello.
    fn cap(&self) -> usize {
        if self.cipher.nonce == 0 {
            FIRST_RECORD_MAX - TAG
        } else {
            PLAIN_MAX
        }
    }

    /// Seal the open record, if any.
    fn seal(&mut self) -> io::Result<()> {
        let Some(at) = self.open.take() else { return Ok(()) };
        let n = self.out.len() - at - 2;
        let tag = self.cipher.seal(&mut self.out[at + 2..])?;
        self.out.extend_from_slice(tag.as_ref());
        self.out[at..at + 2].copy_from_slice(&((n + TAG) as u16).to_be_bytes());
        Ok(())
    }

    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.sent < self.out.len() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.out[self.sent..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.sent += n;
        }
        self.out.clear();
        self.sent = 0;
        Poll::Ready(Ok(()))
    }
}

impl<W: AsyncWrite + Unpin> AsyncWrite for SecureWriter<W> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        let me = self.get_mut();
        if me.open.is_none() && me.out.len() - me.sent >= OUT_HIGH {
            ready!(me.poll_drain(cx))?;
        }
        let at = match me.open {
            Some(at) => at,
            None => {
                let at = me.out.len();
                me.out.extend_from_slice(&[0, 0]);
                me.open = Some(at);
                at
            }
        };
        let room = me.cap() - (me.out.len() - at - 2);
        let n = data.len().min(room);
        me.out.extend_from_slice(&data[..n]);
        if n == room {
            me.seal()?;
        }
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        me.seal()?;
        ready!(me.poll_drain(cx))?;
        Pin::new(&mut me.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.as_mut().poll_flush(cx))?;
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// Connections a listener lets wait for their handshake from one address at once (loopback excepted: a test
/// instance starts all its brokers on one address). Another one from that address is closed when accepted.
pub const MAX_PENDING_PER_ADDRESS: usize = 16;

/// The connections of a listener that wait for their handshake (between accept and their authenticated first
/// record). At most [`MAX_PENDING_HANDSHAKES`]: when full, admitting one more closes the **oldest** waiting
/// connection that has not shown the key ([`HandshakeSlots::keyed`]; else the oldest), so a flood of connections that never authenticate cannot keep a slot from a broker whose
/// handshake takes milliseconds; at most [`MAX_PENDING_PER_ADDRESS`] from one non-loopback address.
#[derive(Debug, Default)]
pub(crate) struct HandshakeSlots {
    inner: std::sync::Mutex<SlotsInner>,
}

#[derive(Debug, Default)]
struct SlotsInner {
    next: u64,
    /// Admission order (ids of closed ones are skipped when met).
    order: std::collections::VecDeque<u64>,
    live: std::collections::HashMap<u64, (std::net::IpAddr, Option<tokio::task::AbortHandle>)>,
    per_address: std::collections::HashMap<std::net::IpAddr, usize>,
    /// Waiting connections whose first handshake message passed authentication ([`HandshakeSlots::keyed`]).
    keyed: std::collections::HashSet<u64>,
}

/// Why [`HandshakeSlots::admit`] turned a connection away, or what it did to make room.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Admission {
    /// Admitted with this id.
    Admitted(u64),
    /// Admitted with this id; the oldest waiting connection was closed to make room.
    Evicted(u64),
    /// Refused: its address already has [`MAX_PENDING_PER_ADDRESS`] waiting.
    AddressFull,
}

impl SlotsInner {
    fn remove(&mut self, id: u64) -> Option<Option<tokio::task::AbortHandle>> {
        let (ip, h) = self.live.remove(&id)?;
        self.keyed.remove(&id);
        if let Some(n) = self.per_address.get_mut(&ip) {
            *n -= 1;
            if *n == 0 {
                self.per_address.remove(&ip);
            }
        }
        Some(h)
    }
}

impl HandshakeSlots {
    /// Admit a connection from `ip`.
    pub(crate) fn admit(&self, ip: std::net::IpAddr) -> Admission {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if !ip.is_loopback() && g.per_address.get(&ip).copied().unwrap_or(0) >= MAX_PENDING_PER_ADDRESS {
            return Admission::AddressFull;
        }
        let mut evicted = false;
        while g.live.len() >= MAX_PENDING_HANDSHAKES {
            // The oldest connection that has not shown the key, else the oldest.
            let SlotsInner { order, live, keyed, .. } = &mut *g;
            let pick = order.iter().position(|i| live.contains_key(i) && !keyed.contains(i)).unwrap_or(0);
            let Some(old) = order.remove(pick) else { break };
            if let Some(h) = g.remove(old) {
                if let Some(h) = h {
                    h.abort();
                }
                evicted = true;
            }
        }
        g.next += 1;
        let id = g.next;
        g.order.push_back(id);
        g.live.insert(id, (ip, None));
        *g.per_address.entry(ip).or_insert(0) += 1;
        if evicted {
            Admission::Evicted(id)
        } else {
            Admission::Admitted(id)
        }
    }

    /// The task running connection `id`'s handshake, to abort if it must make room.
    pub(crate) fn attach(&self, id: u64, h: tokio::task::AbortHandle) {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = g.live.get_mut(&id) {
            e.1 = Some(h);
        }
    }

    /// Connection `id`'s first handshake message passed authentication: admitting others closes it only when
    /// every waiting connection has (a flood of connections that never authenticate cannot close a key holder's
    /// handshake however fast it comes, even while that handshake waits for a CPU).
    pub(crate) fn keyed(&self, id: u64) {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if g.live.contains_key(&id) {
            g.keyed.insert(id);
        }
    }

    /// Connection `id` authenticated or failed: its slot is free.
    pub(crate) fn release(&self, id: u64) {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        g.remove(id);
        // Keep the order queue from growing with ids long gone.
        if g.order.len() > 4 * MAX_PENDING_HANDSHAKES {
            let SlotsInner { order, live, .. } = &mut *g;
            order.retain(|i| live.contains_key(i));
        }
    }

    /// Connections waiting now.
    #[cfg(test)]
    fn waiting(&self) -> usize {
        self.inner.lock().unwrap().live.len()
    }
}

/// Warn lines a listener writes about refused connections per [`REFUSAL_WINDOW`]; the rest are counted and
/// summed up in one line when the next window starts.
const REFUSAL_WARN_BUDGET: u32 = 20;
/// The window of [`REFUSAL_WARN_BUDGET`].
const REFUSAL_WINDOW: Duration = Duration::from_secs(60);

/// Logs each refused peer address once, at most [`REFUSAL_WARN_BUDGET`] lines a minute, so that neither a peer
/// retrying in a loop nor one cycling through addresses can flood the log; what it does not log it counts, and
/// says how many in one line. Remembers at most 4096 addresses, then starts afresh.
#[derive(Debug, Default)]
pub(crate) struct RefusalLog {
    seen: std::collections::HashSet<std::net::IpAddr>,
    /// Refusals since start, all peers (shown by `vigil uptime`).
    pub(crate) count: u64,
    window: Option<std::time::Instant>,
    warned: u32,
    unlogged: u64,
}

impl RefusalLog {
    /// Record a refusal of `ip` at `now`: whether to log this one at warn level (the first from that address,
    /// within the budget), and, when a new window starts, how many the last one did not log.
    pub(crate) fn refused(&mut self, ip: std::net::IpAddr, now: std::time::Instant) -> (bool, Option<u64>) {
        self.count += 1;
        let mut summary = None;
        if self.window.is_none_or(|w| now.duration_since(w) >= REFUSAL_WINDOW) {
            if self.unlogged > 0 {
                summary = Some(self.unlogged);
            }
            (self.window, self.warned, self.unlogged) = (Some(now), 0, 0);
        }
        if self.seen.len() >= 4096 {
            self.seen.clear();
        }
        let warn = self.seen.insert(ip) && self.warned < REFUSAL_WARN_BUDGET;
        if warn {
            self.warned += 1;
        } else {
            self.unlogged += 1;
        }
        (warn, summary)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::duplex;

    fn auth(instance: &str) -> LinkAuth {
        LinkAuth::new(OverlayKey::from_hex(&"ab".repeat(32)).unwrap(), instance)
    }

    /// A handshake between an initiator holding `a` and a responder holding `b`; the initiator sends "hello".
    async fn pair(a: LinkAuth, b: LinkAuth) -> (Result<(), HandshakeError>, Result<Session, HandshakeError>) {
        let (mut c, mut s) = duplex(1 << 20);
        let client = async move {
            let sess = initiate(&mut c, &a).await?;
            let (_, mut w) = sess.split(tokio::io::empty(), &mut c);
            w.write_all(b"hello").await?;
            w.flush().await?;
            Ok(())
        };
        let server = async move { respond(&mut s, &b).await };
        tokio::join!(client, server)
    }

    /// Our records are Noise transport messages to the byte: the same handshake (fixed ephemeral keys), once
    /// through snow's own transport state and once through `ciphers`, seals the same plaintext identically.
    #[test]
    fn records_are_noise_transport_messages() {
        let a = auth("i");
        let run = || {
            let (e1, e2) = ([1u8; 32], [2u8; 32]);
            let mut i = a.builder().fixed_ephemeral_key_for_testing_only(&e1).build_initiator().unwrap();
            let mut r = a.builder().fixed_ephemeral_key_for_testing_only(&e2).build_responder().unwrap();
            let (mut m, mut p) = ([0u8; 64], [0u8; 64]);
            let n = i.write_message(&[], &mut m).unwrap();
            r.read_message(&m[..n], &mut p).unwrap();
            let n = r.write_message(&[], &mut m).unwrap();
            i.read_message(&m[..n], &mut p).unwrap();
            (i, r)
        };
        let plain = b"a record of the overlay".to_vec();
        let (i, _) = run();
        let snow_side = i.into_stateless_transport_mode().unwrap();
        let mut theirs = vec![0u8; plain.len() + TAG];
        snow_side.write_message(5, &plain, &mut theirs).unwrap();
        let (i, r) = run();
        let (mut send, _) = ciphers(i).unwrap();
        send.nonce = 5;
        let mut ours = plain.clone();
        let tag = send.seal(&mut ours).unwrap();
        ours.extend_from_slice(tag.as_ref());
        assert_eq!(ours, theirs);
        // And the responder's side opens it, with its own ciphers.
        let (_, mut recv) = ciphers(r).unwrap();
        recv.nonce = 5;
        let n = recv.open(&mut ours).unwrap();
        assert_eq!(&ours[..n], &plain[..]);
    }

    #[test]
    fn noise_params_parse() {
        assert!(NOISE_PARAMS.parse::<snow::params::NoiseParams>().is_ok());
    }

    #[tokio::test]
    async fn same_key_and_instance_authenticate_and_the_hello_arrives() {
        let (c, s) = pair(auth("i1"), auth("i1")).await;
        assert!(c.is_ok());
        let s = s.unwrap();
        assert_eq!(s.read_ahead, b"hello");
        assert_eq!(s.recv.nonce, 1);
    }

    #[tokio::test]
    async fn a_first_record_stays_small_whatever_is_queued_behind_the_hello() {
        let (mut c, mut s) = duplex(1 << 20);
        let (a, b) = (auth("i"), auth("i"));
        let big = vec![9u8; 100_000];
        let client = async {
            let sess = initiate(&mut c, &a).await.unwrap();
            let (_, mut w) = sess.split(tokio::io::empty(), &mut c);
            w.write_all(&big).await.unwrap();
            w.flush().await.unwrap();
        };
        let ((), r) = tokio::join!(client, respond(&mut s, &b));
        let sess = r.expect("the first record fits the pre-authentication bound");
        assert_eq!(sess.read_ahead.len(), FIRST_RECORD_MAX - TAG);
        // The rest follows in later records.
        let (mut rd, _) = sess.split(s, tokio::io::sink());
        let mut got = vec![0u8; big.len()];
        rd.read_exact(&mut got).await.unwrap();
        assert_eq!(got, big);
    }

    #[tokio::test]
    async fn another_key_or_instance_is_refused() {
        let other = LinkAuth::new(OverlayKey::from_hex(&"cd".repeat(32)).unwrap(), "i1");
        let (_, s) = pair(other, auth("i1")).await;
        assert!(matches!(s, Err(HandshakeError::Unauthenticated)), "{:?}", s.err());
        let (_, s) = pair(auth("i2"), auth("i1")).await;
        assert!(matches!(s, Err(HandshakeError::Unauthenticated)), "{:?}", s.err());
    }

    #[tokio::test]
    async fn a_replayed_handshake_gets_no_session() {
        // Capture everything a real initiator sends (its handshake message and its hello record) while a real
        // responder answers it, then replay those bytes to a fresh responder.
        let (a, b) = (auth("i1"), auth("i1"));
        let (mut c, mut tap) = duplex(1 << 20);
        let initiator = async {
            let sess = initiate(&mut c, &a).await.unwrap();
            let (_, mut w) = sess.split(tokio::io::empty(), &mut c);
            w.write_all(b"hello").await.unwrap();
            w.flush().await.unwrap();
        };
        let recorder = async {
            let mut first = vec![0u8; 2 + 48];
            tap.read_exact(&mut first).await.unwrap();
            let mut hs = b.builder().build_responder().unwrap();
            let mut p = [0u8; 64];
            hs.read_message(&first[2..], &mut p).unwrap();
            let mut m = [0u8; 64];
            let n = hs.write_message(&[], &mut m).unwrap();
            send_handshake(&mut tap, &m[..n]).await.unwrap();
            let mut hello = vec![0u8; 2 + 5 + TAG];
            tap.read_exact(&mut hello).await.unwrap();
            first.extend_from_slice(&hello);
            first
        };
        let ((), transcript) = tokio::join!(initiator, recorder);
        let (mut r, mut victim) = duplex(1 << 20);
        let replay = async {
            r.write_all(&transcript).await.unwrap();
            r
        };
        let (_r, res) = tokio::join!(replay, respond(&mut victim, &b));
        assert!(matches!(res, Err(HandshakeError::Unauthenticated)), "{:?}", res.err());
    }

    /// A cipher with a key nobody else has.
    fn stray_cipher() -> Cipher {
        Cipher::new(&[0x33; 32])
    }

    #[tokio::test]
    async fn an_oversized_length_prefix_is_refused_before_any_allocation() {
        let (mut c, mut s) = duplex(1024);
        c.write_all(&[0xff, 0xff, 0xff, 0xff]).await.unwrap();
        let r = respond(&mut s, &auth("i")).await;
        assert!(matches!(r, Err(HandshakeError::TooLarge(0xffff))), "{:?}", r.err());
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_peer_times_out() {
        let (_c, mut s) = duplex(1024);
        let r = respond(&mut s, &auth("i")).await;
        assert!(matches!(r, Err(HandshakeError::Timeout)), "{:?}", r.err());
    }

    #[tokio::test]
    async fn records_carry_a_stream_of_any_size_and_tampering_is_detected() {
        let a = auth("i");
        let b = auth("i");
        let (mut c, mut s) = duplex(1 << 16);
        let (ci, si) = tokio::join!(initiate(&mut c, &a), async {
            // Responder without the first-record step, to exercise the reader from nonce 0.
            let mut hs = b.builder().build_responder().unwrap();
            let mut buf = Vec::new();
            recv_bounded(&mut s, HANDSHAKE_MSG_MAX, &mut buf).await.unwrap();
            let mut p = [0u8; 64];
            hs.read_message(&buf, &mut p).unwrap();
            let mut m = [0u8; 64];
            let n = hs.write_message(&[], &mut m).unwrap();
            send_handshake(&mut s, &m[..n]).await.unwrap();
            let (send, recv) = ciphers(hs).unwrap();
            Session { send, recv, read_ahead: vec![] }
        });
        let ci = ci.unwrap();
        let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 + i / 256) as u8).collect();
        let (cr, cw) = tokio::io::split(c);
        let (sr, sw) = tokio::io::split(s);
        let (_, mut w) = ci.split(cr, cw);
        let (mut r, _) = si.split(sr, sw);
        let d2 = data.clone();
        let wt = tokio::spawn(async move {
            for chunk in d2.chunks(7777) {
                w.write_all(chunk).await.unwrap();
                if chunk[0] % 3 == 0 {
                    w.flush().await.unwrap();
                }
            }
            // Then all of it in one write: whole records sealed straight from the caller's buffer.
            w.write_all(&d2).await.unwrap();
            w.shutdown().await.unwrap();
        });
        // Read the first copy in pieces smaller than a record, the second in one read_exact (records opened
        // straight into the caller's buffer).
        let mut got = vec![0u8; data.len()];
        for piece in got.chunks_mut(1000) {
            r.read_exact(piece).await.unwrap();
        }
        assert_eq!(got, data);
        r.read_exact(&mut got).await.unwrap();
        assert_eq!(got, data);
        let mut rest = Vec::new();
        r.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty());
        wt.await.unwrap();

        // A flipped bit in a record fails it.
        let mut sealer = Cipher::new(&[0x44; 32]);
        let mut rec = vec![0u8; 2 + 10];
        rec[..2].copy_from_slice(&((10 + TAG) as u16).to_be_bytes());
        rec[2..].copy_from_slice(b"0123456789");
        let tag = sealer.seal(&mut rec[2..]).unwrap();
        rec.extend_from_slice(tag.as_ref());
        let mut good = SecureReader::new(&rec[..], Cipher::new(&[0x44; 32]));
        let mut out = Vec::new();
        good.read_to_end(&mut out).await.unwrap();
        assert_eq!(out, b"0123456789");
        rec[5] ^= 1;
        let mut r = SecureReader::new(&rec[..], Cipher::new(&[0x44; 32]));
        let mut out = Vec::new();
        let e = r.read_to_end(&mut out).await.unwrap_err();
        assert!(e.to_string().contains("failed authentication"), "{e}");
    }

    #[tokio::test]
    async fn a_full_set_of_waiting_connections_makes_room_by_closing_the_oldest() {
        let slots = HandshakeSlots::default();
        let ip: std::net::IpAddr = "127.0.0.1".parse().unwrap();
        let mut tasks = Vec::new();
        for k in 0..MAX_PENDING_HANDSHAKES {
            let Admission::Admitted(id) = slots.admit(ip) else { panic!("slot {k} refused") };
            let t = tokio::spawn(std::future::pending::<()>());
            slots.attach(id, t.abort_handle());
            tasks.push(t);
        }
        assert_eq!(slots.waiting(), MAX_PENDING_HANDSHAKES);
        assert!(matches!(slots.admit(ip), Admission::Evicted(_)));
        assert_eq!(slots.waiting(), MAX_PENDING_HANDSHAKES);
        // The oldest was aborted, the others were not.
        let first = tasks.remove(0);
        assert!(first.await.unwrap_err().is_cancelled());
        assert!(tasks.iter().all(|t| !t.is_finished()));
        // A released slot is reused without closing anyone.
        slots.release(2);
        assert!(matches!(slots.admit(ip), Admission::Admitted(_)));
    }

    /// A connection whose first handshake message showed the key keeps its slot while a flood that never
    /// authenticates comes in; it is closed only once every waiting connection has shown the key.
    #[tokio::test]
    async fn a_key_holders_handshake_is_not_closed_to_admit_a_flood() {
        let slots = HandshakeSlots::default();
        let ip: std::net::IpAddr = "127.0.0.1".parse().unwrap();
        let Admission::Admitted(holder) = slots.admit(ip) else { panic!("refused") };
        let t = tokio::spawn(std::future::pending::<()>());
        slots.attach(holder, t.abort_handle());
        slots.keyed(holder);
        for _ in 0..10 * MAX_PENDING_HANDSHAKES {
            let (Admission::Admitted(id) | Admission::Evicted(id)) = slots.admit(ip) else { panic!("refused") };
            slots.attach(id, tokio::spawn(std::future::pending::<()>()).abort_handle());
        }
        assert!(!t.is_finished(), "the key holder's handshake was closed");
        assert_eq!(slots.waiting(), MAX_PENDING_HANDSHAKES);
        let waiting: Vec<u64> = slots.inner.lock().unwrap().live.keys().copied().collect();
        for id in waiting {
            slots.keyed(id);
        }
        assert!(matches!(slots.admit(ip), Admission::Evicted(_)));
        assert!(t.await.unwrap_err().is_cancelled(), "all keyed: the oldest goes");
    }

    #[test]
    fn one_remote_address_gets_a_bounded_share_of_the_slots_and_loopback_is_exempt() {
        let slots = HandshakeSlots::default();
        let remote: std::net::IpAddr = "10.200.0.7".parse().unwrap();
        for _ in 0..MAX_PENDING_PER_ADDRESS {
            assert!(matches!(slots.admit(remote), Admission::Admitted(_)));
        }
        assert_eq!(slots.admit(remote), Admission::AddressFull);
        assert!(matches!(slots.admit("10.200.0.8".parse().unwrap()), Admission::Admitted(_)));
        for _ in 0..2 * MAX_PENDING_PER_ADDRESS {
            assert!(!matches!(slots.admit("127.0.0.1".parse().unwrap()), Admission::AddressFull));
        }
    }

    #[test]
    fn refusals_are_logged_once_per_address_and_at_most_a_budget_a_minute() {
        let mut log = RefusalLog::default();
        let t0 = std::time::Instant::now();
        let a: std::net::IpAddr = "10.0.0.1".parse().unwrap();
        assert_eq!(log.refused(a, t0), (true, None));
        assert_eq!(log.refused(a, t0), (false, None));
        // Many addresses: only the budget is logged.
        let warned = (0..1000u32)
            .filter(|i| log.refused(std::net::IpAddr::from(std::net::Ipv4Addr::from(0x0b00_0000 + i)), t0).0)
            .count();
        assert_eq!(warned as u32, REFUSAL_WARN_BUDGET - 1);
        // The next window says how many were not logged.
        let (_, summary) = log.refused("10.0.0.2".parse().unwrap(), t0 + REFUSAL_WINDOW);
        assert_eq!(summary, Some(1 + 1000 - (REFUSAL_WARN_BUDGET as u64 - 1)));
        assert_eq!(log.count, 1003);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 512, ..Default::default() })]

        /// Fuzz target, the pre-authentication path: whatever bytes an unauthenticated peer sends (then closes),
        /// the responder ends with an error, never a panic and never a session.
        #[test]
        fn respond_refuses_any_bytes(data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300)) {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build().unwrap();
            let r = rt.block_on(async {
                let (mut c, mut s) = duplex(4096);
                c.write_all(&data).await.unwrap();
                drop(c);
                respond(&mut s, &auth("i")).await
            });
            proptest::prop_assert!(r.is_err());
        }

        /// Fuzz target, the record layer: any bytes after a handshake end the stream with an error (or a clean
        /// end when there are none), never a panic.
        #[test]
        fn records_refuse_any_bytes(data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..3000)) {
            let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let r = rt.block_on(async {
                let mut r = SecureReader::new(&data[..], stray_cipher());
                let mut out = Vec::new();
                r.read_to_end(&mut out).await.map(|_| out.len())
            });
            proptest::prop_assert!(if data.is_empty() { r.is_ok() } else { r.is_err() }, "{:?}", r);
        }
    }
}
