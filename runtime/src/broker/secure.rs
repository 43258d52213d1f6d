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
//! At most [`MAX_PENDING_HANDSHAKES`] connections may be between accept and their first record; more are closed
//! when accepted. Each pending one holds at most about 4.3 KiB of buffers (a 64-byte handshake buffer, the first
//! record), and is closed after [`HANDSHAKE_TIMEOUT`]. So unauthenticated peers can make a broker hold at most
//! about 128 × 4.3 KiB ≈ 0.6 MiB, plus their sockets' kernel buffers.

use crate::keyfile::OverlayKey;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};

/// The Noise protocol name: NN with the pre-shared key mixed in before the first message (`psk0`), X25519,
/// AES-256-GCM, SHA-256.
pub const NOISE_PARAMS: &str = "Noise_NNpsk0_25519_AESGCM_SHA256";

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

/// An authenticated session: the transport keys, and plaintext already read (the responder's first record).
pub struct Session {
    keys: Arc<snow::StatelessTransportState>,
    rx_nonce: u64,
    read_ahead: Vec<u8>,
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
    let keys = hs.into_stateless_transport_mode().map_err(|_| HandshakeError::Unauthenticated)?;
    Ok(Session { keys: Arc::new(keys), rx_nonce: 0, read_ahead: Vec::new() })
}

/// Run the responder's side (a listener's accepted connection), through the initiator's first record, within
/// [`HANDSHAKE_TIMEOUT`]. On success the initiator is authenticated and the record's plaintext (the hello) is
/// kept in the session for the link's reader.
pub async fn respond<S: AsyncRead + AsyncWrite + Unpin>(s: &mut S, auth: &LinkAuth) -> Result<Session, HandshakeError> {
    tokio::time::timeout(HANDSHAKE_TIMEOUT, respond_inner(s, auth)).await.map_err(|_| HandshakeError::Timeout)?
}

async fn respond_inner<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    auth: &LinkAuth,
) -> Result<Session, HandshakeError> {
    let mut hs = auth.builder().build_responder().map_err(|_| HandshakeError::Unauthenticated)?;
    let mut buf = Vec::with_capacity(HANDSHAKE_MSG_MAX);
    recv_bounded(s, HANDSHAKE_MSG_MAX, &mut buf).await?;
    let mut payload = [0u8; HANDSHAKE_MSG_MAX];
    hs.read_message(&buf, &mut payload).map_err(|_| HandshakeError::Unauthenticated)?;
    let mut msg = [0u8; HANDSHAKE_MSG_MAX];
    let n = hs.write_message(&[], &mut msg).map_err(|_| HandshakeError::Unauthenticated)?;
    send_handshake(s, &msg[..n]).await?;
    let keys = hs.into_stateless_transport_mode().map_err(|_| HandshakeError::Unauthenticated)?;
    recv_bounded(s, FIRST_RECORD_MAX, &mut buf).await?;
    if buf.len() < TAG {
        return Err(HandshakeError::Unauthenticated);
    }
    let mut plain = vec![0u8; buf.len() - TAG];
    let n = keys.read_message(0, &buf, &mut plain).map_err(|_| HandshakeError::Unauthenticated)?;
    plain.truncate(n);
    Ok(Session { keys: Arc::new(keys), rx_nonce: 1, read_ahead: plain })
}

impl Session {
    /// The reading and writing ends of the secured stream.
    pub fn split<R, W>(self, rd: R, wr: W) -> (SecureReader<R>, SecureWriter<W>) {
        let reader = SecureReader {
            inner: rd,
            keys: self.keys.clone(),
            nonce: self.rx_nonce,
            head: [0; 2],
            have: 0,
            want: None,
            record: Vec::new(),
            plain: self.read_ahead,
            pos: 0,
        };
        let writer = SecureWriter { inner: wr, keys: self.keys, nonce: 0, plain: Vec::new(), out: Vec::new(), sent: 0 };
        (reader, writer)
    }
}

/// The reading end of a secured link: decrypts records, yields the plaintext byte stream.
pub struct SecureReader<R> {
    inner: R,
    keys: Arc<snow::StatelessTransportState>,
    nonce: u64,
    head: [u8; 2],
    /// Bytes of the current record's length prefix (`want` None) or body (`want` Some) read so far.
    have: usize,
    want: Option<usize>,
    record: Vec<u8>,
    plain: Vec<u8>,
    pos: usize,
}

fn bad_record(why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("overlay record {why}"))
}

impl<R: AsyncRead + Unpin> AsyncRead for SecureReader<R> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        loop {
            if me.pos < me.plain.len() {
                let n = buf.remaining().min(me.plain.len() - me.pos);
                buf.put_slice(&me.plain[me.pos..me.pos + n]);
                me.pos += n;
                return Poll::Ready(Ok(()));
            }
            match me.want {
                None => {
                    while me.have < 2 {
                        let mut rb = ReadBuf::new(&mut me.head[me.have..]);
                        ready!(Pin::new(&mut me.inner).poll_read(cx, &mut rb))?;
                        let n = rb.filled().len();
                        if n == 0 {
                            return if me.have == 0 {
                                Poll::Ready(Ok(())) // clean end between records
                            } else {
                                Poll::Ready(Err(bad_record("truncated")))
                            };
                        }
                        me.have += n;
                    }
                    let len = u16::from_be_bytes(me.head) as usize;
                    if len < TAG {
                        return Poll::Ready(Err(bad_record("shorter than its tag")));
                    }
                    me.record.resize(len, 0);
                    me.want = Some(len);
                    me.have = 0;
                }
                Some(len) => {
                    while me.have < len {
                        let mut rb = ReadBuf::new(&mut me.record[me.have..len]);
                        ready!(Pin::new(&mut me.inner).poll_read(cx, &mut rb))?;
                        let n = rb.filled().len();
                        if n == 0 {
                            return Poll::Ready(Err(bad_record("truncated")));
                        }
                        me.have += n;
                    }
                    me.plain.resize(len - TAG, 0);
                    let n = me
                        .keys
                        .read_message(me.nonce, &me.record[..len], &mut me.plain)
                        .map_err(|_| bad_record("failed authentication"))?;
                    me.plain.truncate(n);
                    me.nonce += 1;
                    me.pos = 0;
                    me.want = None;
                    me.have = 0;
                }
            }
        }
    }
}

/// The writing end of a secured link: buffers plaintext, seals it into records on flush (or when a record is
/// full) and writes them out.
pub struct SecureWriter<W> {
    inner: W,
    keys: Arc<snow::StatelessTransportState>,
    nonce: u64,
    plain: Vec<u8>,
    out: Vec<u8>,
    sent: usize,
}

/// Sealed bytes queued before `poll_write` first writes them out.
const OUT_HIGH: usize = 64 * 1024;

impl<W: AsyncWrite + Unpin> SecureWriter<W> {
    fn seal(&mut self) -> io::Result<()> {
        if self.plain.is_empty() {
            return Ok(());
        }
        let n = self.plain.len() + TAG;
        let start = self.out.len();
        self.out.resize(start + 2 + n, 0);
        self.out[start..start + 2].copy_from_slice(&(n as u16).to_be_bytes());
        self.keys
            .write_message(self.nonce, &self.plain, &mut self.out[start + 2..])
            .map_err(|e| io::Error::other(format!("cannot seal an overlay record: {e}")))?;
        self.nonce += 1;
        self.plain.clear();
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
        // The first record is read before its sender is authenticated, so it is kept within FIRST_RECORD_MAX
        // whatever is queued behind the hello.
        let cap = if me.nonce == 0 { FIRST_RECORD_MAX - TAG } else { PLAIN_MAX };
        if me.plain.len() >= cap {
            me.seal()?;
        }
        if me.out.len() - me.sent >= OUT_HIGH {
            ready!(me.poll_drain(cx))?;
        }
        let cap = if me.nonce == 0 { FIRST_RECORD_MAX - TAG } else { PLAIN_MAX };
        let n = data.len().min(cap - me.plain.len());
        me.plain.extend_from_slice(&data[..n]);
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

/// Logs each refused peer address once (later refusals of the same address go to the debug log), so a peer
/// that retries in a loop cannot flood the log. Remembers at most 4096 addresses, then starts afresh.
#[derive(Debug, Default)]
pub(crate) struct RefusalLog {
    seen: std::collections::HashSet<std::net::IpAddr>,
    /// Refusals since start, all peers.
    pub(crate) count: u64,
}

impl RefusalLog {
    /// Record a refusal of `ip`; true when it is the first from that address (log it at warn level).
    pub(crate) fn first(&mut self, ip: std::net::IpAddr) -> bool {
        self.count += 1;
        if self.seen.len() >= 4096 {
            self.seen.clear();
        }
        self.seen.insert(ip)
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
        assert_eq!(s.rx_nonce, 1);
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

    fn unreachable_keys() -> snow::StatelessTransportState {
        let a = auth("x");
        let b = auth("x");
        let mut i = a.builder().build_initiator().unwrap();
        let mut r = b.builder().build_responder().unwrap();
        let (mut m, mut p) = ([0u8; 64], [0u8; 64]);
        let n = i.write_message(&[], &mut m).unwrap();
        r.read_message(&m[..n], &mut p).unwrap();
        let n = r.write_message(&[], &mut m).unwrap();
        i.read_message(&m[..n], &mut p).unwrap();
        i.into_stateless_transport_mode().unwrap()
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
            Session { keys: Arc::new(hs.into_stateless_transport_mode().unwrap()), rx_nonce: 0, read_ahead: vec![] }
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
            w.shutdown().await.unwrap();
        });
        let mut got = Vec::new();
        r.read_to_end(&mut got).await.unwrap();
        wt.await.unwrap();
        assert_eq!(got, data);

        // A flipped bit in a record fails it.
        let keys = unreachable_keys();
        let mut rec = vec![0u8; 2 + 10 + TAG];
        rec[..2].copy_from_slice(&((10 + TAG) as u16).to_be_bytes());
        keys.write_message(0, b"0123456789", &mut rec[2..]).unwrap();
        rec[5] ^= 1;
        let mut r = SecureReader {
            inner: &rec[..],
            keys: Arc::new(keys),
            nonce: 0,
            head: [0; 2],
            have: 0,
            want: None,
            record: vec![],
            plain: vec![],
            pos: 0,
        };
        let mut out = Vec::new();
        let e = r.read_to_end(&mut out).await.unwrap_err();
        assert!(e.to_string().contains("failed authentication"), "{e}");
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
                static KEYS: std::sync::OnceLock<Arc<snow::StatelessTransportState>> = std::sync::OnceLock::new();
                let mut r = SecureReader {
                    inner: &data[..],
                    keys: KEYS.get_or_init(|| Arc::new(unreachable_keys())).clone(),
                    nonce: 0,
                    head: [0; 2],
                    have: 0,
                    want: None,
                    record: vec![],
                    plain: vec![],
                    pos: 0,
                };
                let mut out = Vec::new();
                r.read_to_end(&mut out).await.map(|_| out.len())
            });
            proptest::prop_assert!(if data.is_empty() { r.is_ok() } else { r.is_err() }, "{:?}", r);
        }
    }
}
