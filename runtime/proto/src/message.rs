//! Vigil messages and their wire codec (version 1).
//!
//! One framing is used on every link: the TBON overlay between brokers and the local connector between a broker
//! and its clients (Unix socket); RDMA overlay links whose ends agree on it carry the same messages in the
//! [`packed`] form instead. The format is documented in `docs/wire-format.md`:
//!
//! ```text
//! u32 length (big-endian) of everything after this field, at most MAX_FRAME bytes
//! header (28 bytes, big-endian integers):
//!   magic "VG" | version u8 (=1) | type u8 | flags u8 | nroute u8 | topic_len u16
//!   matchtag u32 | nodeid u32 | userid u32 | errnum u32 | seq u32
//! route stack: nroute x u32
//! topic: topic_len bytes of UTF-8
//! payload: the rest (JSON, possibly empty)
//! ```
//!
//! Decoding never panics: every malformed frame yields a [`DecodeError`], after which the receiver drops the
//! connection of the peer that sent it.

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

/// Wire magic, "VG".
pub const MAGIC: [u8; 2] = *b"VG";
/// The only wire version this build speaks.
pub const WIRE_VERSION: u8 = 1;
/// Largest accepted frame (bytes after the length field): 64 MiB.
pub const MAX_FRAME: u32 = 64 << 20;
/// Largest route stack; deeper routes are refused (a TBON deeper than this is a bug).
pub const MAX_ROUTE: usize = 64;
/// Fixed header size after the length field, in bytes.
pub const HEADER_LEN: usize = 28;
/// `nodeid` meaning "the nearest broker that offers this service, else upstream".
pub const NODEID_ANY: u32 = u32::MAX;
/// `nodeid` meaning "the parent of the broker this client is attached to".
pub const NODEID_UPSTREAM: u32 = u32::MAX - 1;
/// Route-stack entries with this bit set name a local client connection, not an overlay peer.
pub const ROUTE_LOCAL: u32 = 1 << 31;

/// Request flag: the sender wants no response.
pub const FLAG_NORESPONSE: u8 = 1;
/// Request flag: the sender expects a stream of responses ended by `ENODATA`.
pub const FLAG_STREAMING: u8 = 2;

/// POSIX errno values used in responses: a response's `errnum`, as in Flux RFC 3 (the Linux numbers).
pub mod errno {
    /// Operation not permitted (unauthorised request).
    pub const EPERM: u32 = 1;
    /// No such entry (unknown job id, attribute...).
    pub const ENOENT: u32 = 2;
    /// No such process (a pid to watch is already gone).
    pub const ESRCH: u32 = 3;
    /// Invalid argument (bad payload).
    pub const EINVAL: u32 = 22;
    /// Function not implemented: no such service.
    pub const ENOSYS: u32 = 38;
    /// No data: the normal end of a response stream.
    pub const ENODATA: u32 = 61;
    /// Protocol error.
    pub const EPROTO: u32 = 71;
    /// Resource temporarily unavailable.
    pub const EAGAIN: u32 = 11;
    /// Already exists / in a conflicting state.
    pub const EEXIST: u32 = 17;
    /// Busy.
    pub const EBUSY: u32 = 16;
    /// No space: the request can never be satisfied in this instance.
    pub const ENOSPC: u32 = 28;
    /// Host unreachable: the rank is not connected or was lost.
    pub const EHOSTUNREACH: u32 = 113;
    /// I/O error: rank 0 could not make a request durable in its state directory.
    pub const EIO: u32 = 5;
    /// Read-only file system: rank 0's state directory cannot be read, so it takes no new job.
    pub const EROFS: u32 = 30;
    /// Connection refused: nothing listens at the peer's address (Linux's value; the simulator's clients see it).
    pub const ECONNREFUSED: u32 = 111;
    /// Connection reset by peer (Linux's value).
    pub const ECONNRESET: u32 = 104;
}

/// Short description of the errno values Vigil uses (the text of an error response without an `errstr`).
pub fn errno_str(e: u32) -> &'static str {
    match e {
        errno::EPERM => "Operation not permitted",
        errno::ENOENT => "No such file or directory",
        errno::EINVAL => "Invalid argument",
        errno::ENOSYS => "Function not implemented",
        errno::ENODATA => "No data available",
        errno::EPROTO => "Protocol error",
        errno::EHOSTUNREACH => "No route to host",
        errno::ENOSPC => "No space left on device",
        errno::EEXIST => "File exists",
        errno::EBUSY => "Device or resource busy",
        errno::EAGAIN => "Resource temporarily unavailable",
        _ => "Unknown error",
    }
}

/// The Noise protocol name of overlay link security (docs/wire-format.md, "Link security"): NN with the
/// pre-shared key mixed in before the first message (`psk0`), X25519, AES-256-GCM, SHA-256.
pub const NOISE_PARAMS: &str = "Noise_NNpsk0_25519_AESGCM_SHA256";

/// Message type (header byte 3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MsgType {
    /// A request, routed by `nodeid`; answered by zero or more responses with the same matchtag.
    Request = 1,
    /// A response, routed back along the request's route stack.
    Response = 2,
    /// An event, sequenced by rank 0 and delivered to every broker.
    Event = 3,
    /// A control message between two directly connected peers (hello, shutdown, heartbeat...).
    Control = 4,
}

impl MsgType {
    fn from_u8(v: u8) -> Option<MsgType> {
        Some(match v {
            1 => MsgType::Request,
            2 => MsgType::Response,
            3 => MsgType::Event,
            4 => MsgType::Control,
            _ => return None,
        })
    }
}

/// One Vigil message, decoded.
#[derive(Clone, Debug, PartialEq)]
pub struct Message {
    /// Request, response, event or control.
    pub msgtype: MsgType,
    /// `FLAG_*` bits.
    pub flags: u8,
    /// Service topic, e.g. `job-manager.submit`.
    pub topic: String,
    /// Matches responses to their request; chosen by the requester.
    pub matchtag: u32,
    /// Requests: destination rank, [`NODEID_ANY`] or [`NODEID_UPSTREAM`]. Unused otherwise.
    pub nodeid: u32,
    /// uid of the original sender, stamped by the first broker that receives it from a local client.
    pub userid: u32,
    /// Responses: 0 on success, else a POSIX errno; the payload may carry `{"errstr": ...}`.
    pub errnum: u32,
    /// Events: sequence number assigned by rank 0. Unused otherwise.
    pub seq: u32,
    /// Route stack: hops a request crossed, popped by its responses.
    pub route: Vec<u32>,
    /// JSON payload bytes (may be empty).
    pub payload: Vec<u8>,
}

/// Why a frame could not be decoded.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    /// The frame is shorter than its header or than its declared contents.
    #[error("truncated frame ({0} bytes)")]
    Truncated(usize),
    /// The frame length exceeds [`MAX_FRAME`].
    #[error("frame of {0} bytes exceeds the {MAX_FRAME}-byte limit")]
    TooLarge(u32),
    /// The magic bytes are not "VG": the peer does not speak this protocol.
    #[error("bad magic {0:02x?}: not a Vigil peer")]
    BadMagic([u8; 2]),
    /// The peer speaks a different wire version.
    #[error("unsupported wire version {0} (this broker speaks {WIRE_VERSION})")]
    Version(u8),
    /// Unknown message type byte.
    #[error("unknown message type {0}")]
    BadType(u8),
    /// Route stack deeper than [`MAX_ROUTE`].
    #[error("route stack of {0} entries exceeds {MAX_ROUTE}")]
    RouteTooDeep(usize),
    /// Topic is not UTF-8 (or, packed, longer than `u16::MAX` bytes).
    #[error("topic is not valid UTF-8")]
    BadTopic,
    /// A packed varint is longer than 5 bytes or does not fit 32 bits ([`packed`]).
    #[error("malformed varint in a packed header")]
    BadVarint,
}

/// Error reading a frame from a stream (what the frame reader around this codec returns).
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The stream failed or closed mid-frame.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    /// The frame was malformed.
    #[error("malformed frame: {0}")]
    Decode(#[from] DecodeError),
}

impl Message {
    fn base(msgtype: MsgType, topic: &str, payload: Vec<u8>) -> Message {
        Message {
            msgtype,
            flags: 0,
            topic: topic.to_string(),
            matchtag: 0,
            nodeid: NODEID_ANY,
            userid: 0,
            errnum: 0,
            seq: 0,
            route: Vec::new(),
            payload,
        }
    }

    /// A request for `topic` to `nodeid` with a JSON payload.
    pub fn request(topic: &str, nodeid: u32, payload: &impl Serialize) -> Message {
        let mut m = Message::base(MsgType::Request, topic, to_json(payload));
        m.nodeid = nodeid;
        m
    }

    /// A request for `topic` to `nodeid` whose payload is already JSON-encoded (`payload` is not checked).
    pub fn request_json(topic: &str, nodeid: u32, payload: Vec<u8>) -> Message {
        let mut m = Message::base(MsgType::Request, topic, payload);
        m.nodeid = nodeid;
        m
    }

    /// An event for `topic` with a JSON payload (its `seq` is assigned by rank 0).
    pub fn event(topic: &str, payload: &impl Serialize) -> Message {
        Message::base(MsgType::Event, topic, to_json(payload))
    }

    /// A control message (peer-to-peer, never routed).
    pub fn control(topic: &str, payload: &impl Serialize) -> Message {
        Message::base(MsgType::Control, topic, to_json(payload))
    }

    /// This request without its payload: what a response to it needs (topic, matchtag, route, userid, flags), for
    /// a request answered later (a submission answered once its record is durable) without a copy of its body.
    pub fn head(&self) -> Message {
        Message {
            msgtype: self.msgtype,
            flags: self.flags,
            topic: self.topic.clone(),
            matchtag: self.matchtag,
            nodeid: self.nodeid,
            userid: self.userid,
            errnum: self.errnum,
            seq: self.seq,
            route: self.route.clone(),
            payload: Vec::new(),
        }
    }

    /// A successful response to `req` carrying `payload`.
    pub fn response_to(req: &Message, payload: &impl Serialize) -> Message {
        let mut m = Message::base(MsgType::Response, &req.topic, to_json(payload));
        m.matchtag = req.matchtag;
        m.route = req.route.clone();
        m.userid = req.userid;
        m
    }

    /// A successful response to `req` carrying `payload` (JSON bytes, not checked), built from the request
    /// itself: its topic and route stack move into the response instead of being copied.
    pub fn into_response(self, payload: Vec<u8>) -> Message {
        Message { msgtype: MsgType::Response, flags: 0, nodeid: NODEID_ANY, errnum: 0, seq: 0, payload, ..self }
    }

    /// An error response to `req`: `errnum` (POSIX errno) and an optional human message as `{"errstr": ...}`.
    pub fn error_to(req: &Message, errnum: u32, errstr: &str) -> Message {
        let payload = if errstr.is_empty() { Vec::new() } else { to_json(&serde_json::json!({"errstr": errstr})) };
        let mut m = Message::base(MsgType::Response, &req.topic, payload);
        m.matchtag = req.matchtag;
        m.route = req.route.clone();
        m.errnum = errnum.max(1);
        m.userid = req.userid;
        m
    }

    /// Decode the payload as `T`.
    pub fn decode<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        if self.payload.is_empty() {
            serde_json::from_slice(b"null")
        } else {
            serde_json::from_slice(&self.payload)
        }
    }

    /// The payload as a JSON value (`Null` when empty or not JSON).
    pub fn json(&self) -> Value {
        self.decode::<Value>().unwrap_or(Value::Null)
    }

    /// For error responses, the `errstr` of the payload, if any.
    pub fn errstr(&self) -> Option<String> {
        self.json().get("errstr").and_then(|v| v.as_str()).map(str::to_string)
    }

    /// Length of the frame [`Message::encode`] produces, length prefix included, in bytes.
    pub fn encoded_len(&self) -> usize {
        4 + HEADER_LEN
            + 4 * self.route.len().min(MAX_ROUTE)
            + self.topic.len().min(u16::MAX as usize)
            + self.payload.len()
    }

    /// Encode as one frame, length prefix included.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; self.encoded_len()];
        self.encode_into(&mut b);
        b
    }

    /// Encode as one frame into `out`, which must be exactly [`Message::encoded_len`] bytes long (e.g. a
    /// transport's registered send buffer: no allocation, no second copy).
    ///
    /// # Panics
    /// If `out` has another length.
    pub fn encode_into(&self, out: &mut [u8]) {
        assert_eq!(out.len(), self.encoded_len(), "encode_into needs a buffer of encoded_len() bytes");
        let topic = &self.topic.as_bytes()[..self.topic.len().min(u16::MAX as usize)];
        let nroute = self.route.len().min(MAX_ROUTE);
        let body = out.len() - 4;
        let (head, rest) = out.split_at_mut(4 + HEADER_LEN);
        head[0..4].copy_from_slice(&(body as u32).to_be_bytes());
        head[4..6].copy_from_slice(&MAGIC);
        head[6] = WIRE_VERSION;
        head[7] = self.msgtype as u8;
        head[8] = self.flags;
        head[9] = nroute as u8;
        head[10..12].copy_from_slice(&(topic.len() as u16).to_be_bytes());
        for (i, v) in [self.matchtag, self.nodeid, self.userid, self.errnum, self.seq].into_iter().enumerate() {
            head[12 + 4 * i..16 + 4 * i].copy_from_slice(&v.to_be_bytes());
        }
        let (routes, rest) = rest.split_at_mut(4 * nroute);
        for (d, r) in routes.chunks_exact_mut(4).zip(&self.route) {
            d.copy_from_slice(&r.to_be_bytes());
        }
        let (t, p) = rest.split_at_mut(topic.len());
        t.copy_from_slice(topic);
        p.copy_from_slice(&self.payload);
    }

    /// Decode the body of one frame (the bytes after the length prefix).
    pub fn decode_body(body: &[u8]) -> Result<Message, DecodeError> {
        let (mut m, off) = Message::decode_head(body)?;
        m.payload = body[off..].to_vec();
        Ok(m)
    }

    /// [`Message::decode_body`] of a body the caller owns: the payload keeps the body's allocation (moved to
    /// its front) instead of being copied into a new one.
    pub fn decode_body_owned(body: Vec<u8>) -> Result<Message, DecodeError> {
        Message::decode_owned(body, 0)
    }

    /// Everything but the payload, and the payload's offset in `body`.
    fn decode_head(body: &[u8]) -> Result<(Message, usize), DecodeError> {
        if body.len() < HEADER_LEN {
            return Err(DecodeError::Truncated(body.len()));
        }
        let magic = [body[0], body[1]];
        if magic != MAGIC {
            return Err(DecodeError::BadMagic(magic));
        }
        if body[2] != WIRE_VERSION {
            return Err(DecodeError::Version(body[2]));
        }
        let msgtype = MsgType::from_u8(body[3]).ok_or(DecodeError::BadType(body[3]))?;
        let flags = body[4];
        let nroute = body[5] as usize;
        if nroute > MAX_ROUTE {
            return Err(DecodeError::RouteTooDeep(nroute));
        }
        let topic_len = u16::from_be_bytes([body[6], body[7]]) as usize;
        let u = |o: usize| u32::from_be_bytes([body[o], body[o + 1], body[o + 2], body[o + 3]]);
        let (matchtag, nodeid, userid, errnum, seq) = (u(8), u(12), u(16), u(20), u(24));
        let need = HEADER_LEN + 4 * nroute + topic_len;
        if body.len() < need {
            return Err(DecodeError::Truncated(body.len()));
        }
        // Room for the hop the receiving broker pushes when it routes a request on.
        let mut route = Vec::with_capacity(nroute + 1);
        route.extend((0..nroute).map(|i| u(HEADER_LEN + 4 * i)));
        let t0 = HEADER_LEN + 4 * nroute;
        let topic = std::str::from_utf8(&body[t0..t0 + topic_len]).map_err(|_| DecodeError::BadTopic)?.to_string();
        let m = Message { msgtype, flags, topic, matchtag, nodeid, userid, errnum, seq, route, payload: Vec::new() };
        Ok((m, need))
    }

    /// Decode `buf[start..]` as a body; the payload takes over `buf`.
    fn decode_owned(mut buf: Vec<u8>, start: usize) -> Result<Message, DecodeError> {
        let (mut m, off) = Message::decode_head(&buf[start..])?;
        buf.drain(..start + off);
        m.payload = buf;
        Ok(m)
    }

    /// Check the length prefix of a complete frame: it must match the frame's length exactly.
    fn check_frame(frame: &[u8]) -> Result<(), DecodeError> {
        if frame.len() < 4 {
            return Err(DecodeError::Truncated(frame.len()));
        }
        let len = u32::from_be_bytes([frame[0], frame[1], frame[2], frame[3]]);
        if len > MAX_FRAME {
            return Err(DecodeError::TooLarge(len));
        }
        if frame.len() - 4 != len as usize {
            return Err(DecodeError::Truncated(frame.len()));
        }
        Ok(())
    }

    /// Decode one complete frame (length prefix included); the length must match exactly.
    pub fn decode_frame(frame: &[u8]) -> Result<Message, DecodeError> {
        Message::check_frame(frame)?;
        Message::decode_body(&frame[4..])
    }

    /// [`Message::decode_frame`] of a frame the caller owns (e.g. as a transport received it): the payload
    /// keeps the frame's allocation instead of being copied.
    pub fn decode_frame_owned(frame: Vec<u8>) -> Result<Message, DecodeError> {
        Message::check_frame(&frame)?;
        Message::decode_owned(frame, 4)
    }
}

/// Packed encoding of a message, for links that delimit messages themselves (an RDMA link: one SEND, or one
/// run of fragments, per message) and agreed on it when they were set up: no length prefix, no magic or
/// version, and only the header fields that differ from their defaults, as LEB128 varints. The fields and
/// their meaning are those of the full frame ([`Message::encode`]); only the bytes differ. Layout:
///
/// ```text
/// presence u8: bits 0-1 type - 1 | bit 2 flags | bit 3 matchtag | bit 4 nodeid | bit 5 userid | bit 6 errnum | bit 7 seq
/// flags u8, then matchtag, nodeid, userid, errnum, seq as varints, each only when its bit is set
///   (an absent field is 0, nodeid NODEID_ANY)
/// nroute u8 (at most MAX_ROUTE), then nroute route entries as varints
/// topic_len varint (at most u16::MAX), topic bytes (UTF-8)
/// payload: the rest
/// ```
///
/// A broker round-trip ping (`broker.rtt`, no padding, a 5-digit pid) is 53 bytes out and 95 back as full
/// frames, 26 and 64 packed (27 and 65 once the matchtag passes 127).
pub mod packed {
    use super::{DecodeError, Message, MsgType, MAX_ROUTE, NODEID_ANY};

    const P_FLAGS: u8 = 1 << 2;
    /// Presence bit of matchtag; nodeid, userid, errnum and seq take the next four bits, in that order.
    const P_MATCHTAG: u8 = 1 << 3;

    /// Bytes of `v` as a LEB128 varint: 1 to 5.
    fn varint_len(v: u32) -> usize {
        match v {
            0..=0x7f => 1,
            0x80..=0x3fff => 2,
            0x4000..=0x1f_ffff => 3,
            0x20_0000..=0xfff_ffff => 4,
            _ => 5,
        }
    }

    fn put_varint(out: &mut [u8], at: &mut usize, mut v: u32) {
        while v >= 0x80 {
            out[*at] = (v as u8) | 0x80;
            *at += 1;
            v >>= 7;
        }
        out[*at] = v as u8;
        *at += 1;
    }

    /// The header fields of `m` that are encoded (value, presence bit), in wire order after `flags`.
    fn fields(m: &Message) -> [(u32, bool); 5] {
        [
            (m.matchtag, m.matchtag != 0),
            (m.nodeid, m.nodeid != NODEID_ANY),
            (m.userid, m.userid != 0),
            (m.errnum, m.errnum != 0),
            (m.seq, m.seq != 0),
        ]
    }

    fn topic(m: &Message) -> &[u8] {
        &m.topic.as_bytes()[..m.topic.len().min(u16::MAX as usize)]
    }

    /// Length of `m` packed, in bytes (what [`encode_into`] writes).
    pub fn encoded_len(m: &Message) -> usize {
        let head: usize = fields(m).iter().filter(|(_, p)| *p).map(|(v, _)| varint_len(*v)).sum();
        let t = topic(m).len();
        let route: usize = m.route.iter().take(MAX_ROUTE).map(|r| varint_len(*r)).sum();
        1 + usize::from(m.flags != 0) + head + 1 + route + varint_len(t as u32) + t + m.payload.len()
    }

    /// Pack `m` into `out`, which must be exactly [`encoded_len`] bytes long (e.g. a registered send buffer).
    /// As [`Message::encode`], a route deeper than [`MAX_ROUTE`] and a topic longer than `u16::MAX` bytes are cut.
    ///
    /// # Panics
    /// If `out` has another length.
    pub fn encode_into(m: &Message, out: &mut [u8]) {
        assert_eq!(out.len(), encoded_len(m), "packed::encode_into needs a buffer of encoded_len() bytes");
        let fs = fields(m);
        let mut presence = (m.msgtype as u8 - 1) | if m.flags != 0 { P_FLAGS } else { 0 };
        for (i, (_, p)) in fs.iter().enumerate() {
            if *p {
                presence |= P_MATCHTAG << i;
            }
        }
        out[0] = presence;
        let mut at = 1;
        if m.flags != 0 {
            out[at] = m.flags;
            at += 1;
        }
        for (v, p) in fs {
            if p {
                put_varint(out, &mut at, v);
            }
        }
        let nroute = m.route.len().min(MAX_ROUTE);
        out[at] = nroute as u8;
        at += 1;
        for r in &m.route[..nroute] {
            put_varint(out, &mut at, *r);
        }
        let t = topic(m);
        put_varint(out, &mut at, t.len() as u32);
        out[at..at + t.len()].copy_from_slice(t);
        at += t.len();
        out[at..].copy_from_slice(&m.payload);
    }

    /// Pack `m` into a new buffer.
    pub fn encode(m: &Message) -> Vec<u8> {
        let mut b = vec![0u8; encoded_len(m)];
        encode_into(m, &mut b);
        b
    }

    /// Reads a packed header from a byte slice, never past its end.
    struct Cursor<'a> {
        b: &'a [u8],
        at: usize,
    }

    impl Cursor<'_> {
        fn byte(&mut self) -> Result<u8, DecodeError> {
            let v = *self.b.get(self.at).ok_or(DecodeError::Truncated(self.b.len()))?;
            self.at += 1;
            Ok(v)
        }

        /// A LEB128 varint of at most 5 bytes whose value fits 32 bits.
        fn varint(&mut self) -> Result<u32, DecodeError> {
            let mut v: u32 = 0;
            for i in 0..5 {
                let b = self.byte()?;
                if i == 4 && b > 0x0f {
                    return Err(DecodeError::BadVarint);
                }
                v |= u32::from(b & 0x7f) << (7 * i);
                if b & 0x80 == 0 {
                    return Ok(v);
                }
            }
            Err(DecodeError::BadVarint)
        }
    }

    /// Unpack a message that the caller owns (e.g. as an RDMA receive gave it): the payload keeps the
    /// buffer's allocation. Any malformed input is an error, never a panic.
    pub fn decode_owned(mut buf: Vec<u8>) -> Result<Message, DecodeError> {
        let mut c = Cursor { b: &buf, at: 0 };
        let presence = c.byte()?;
        let msgtype = MsgType::from_u8((presence & 3) + 1).ok_or(DecodeError::BadType((presence & 3) + 1))?;
        let flags = if presence & P_FLAGS != 0 { c.byte()? } else { 0 };
        let mut v = [0u32, NODEID_ANY, 0, 0, 0];
        for (i, f) in v.iter_mut().enumerate() {
            if presence & (P_MATCHTAG << i) != 0 {
                *f = c.varint()?;
            }
        }
        let nroute = c.byte()? as usize;
        if nroute > MAX_ROUTE {
            return Err(DecodeError::RouteTooDeep(nroute));
        }
        // Room for the hop the receiving broker pushes when it routes a request on.
        let mut route = Vec::with_capacity(nroute + 1);
        for _ in 0..nroute {
            route.push(c.varint()?);
        }
        let tlen = c.varint()? as usize;
        if tlen > u16::MAX as usize {
            return Err(DecodeError::BadTopic);
        }
        let t0 = c.at;
        let tb = buf.get(t0..t0 + tlen).ok_or(DecodeError::Truncated(buf.len()))?;
        let topic = std::str::from_utf8(tb).map_err(|_| DecodeError::BadTopic)?.to_string();
        buf.drain(..t0 + tlen);
        let [matchtag, nodeid, userid, errnum, seq] = v;
        Ok(Message { msgtype, flags, topic, matchtag, nodeid, userid, errnum, seq, route, payload: buf })
    }
}

/// JSON bytes of `v`; empty for null or when `v` cannot be serialised. Serialised directly, without an
/// intermediate `Value` (which cost a deep copy of every payload).
pub fn to_json(v: &impl Serialize) -> Vec<u8> {
    match serde_json::to_vec(v) {
        Ok(b) if b != b"null" => b,
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn round_trip() {
        let mut m = Message::request("job-manager.submit", 3, &serde_json::json!({"a": 1}));
        m.matchtag = 7;
        m.route = vec![1, ROUTE_LOCAL | 4];
        m.flags = FLAG_STREAMING;
        let f = m.encode();
        assert_eq!(Message::decode_frame(&f).unwrap(), m);
        let r = Message::error_to(&m, errno::ENOSYS, "no such service");
        let d = Message::decode_frame(&r.encode()).unwrap();
        assert_eq!(d.errnum, errno::ENOSYS);
        assert_eq!(d.errstr().as_deref(), Some("no such service"));
        assert_eq!(d.route, m.route);
    }

    #[test]
    fn encode_into_and_into_response() {
        let mut m = Message::request("broker.ping", 1, &serde_json::json!({"pad": "xyz"}));
        m.matchtag = 9;
        m.userid = 1000;
        m.flags = FLAG_STREAMING;
        m.route = vec![ROUTE_LOCAL | 2, 0];
        let f = m.encode();
        assert_eq!(f.len(), m.encoded_len());
        // The header as documented: length, magic, version, type, flags, nroute, topic length, ...
        assert_eq!(&f[..12], &[0, 0, 0, (f.len() - 4) as u8, b'V', b'G', 1, 1, 2, 2, 0, 11]);
        let mut g = vec![0u8; m.encoded_len()];
        m.encode_into(&mut g);
        assert_eq!(f, g);
        assert_eq!(Message::decode_frame(&g).unwrap(), m);
        // A response built from the request itself equals the copying constructor's.
        let copy = Message::response_to(&m, &serde_json::json!({"ok": 1}));
        let moved = m.clone().into_response(to_json(&serde_json::json!({"ok": 1})));
        assert_eq!(moved, copy);
    }

    #[test]
    fn rejects_bad_frames() {
        let m = Message::event("x", &serde_json::json!({}));
        let mut f = m.encode();
        f[6] = 2;
        assert_eq!(Message::decode_frame(&f), Err(DecodeError::Version(2)));
        let mut f = m.encode();
        f[4] = b'X';
        assert!(matches!(Message::decode_frame(&f), Err(DecodeError::BadMagic(_))));
        let mut f = m.encode();
        f[7] = 9;
        assert_eq!(Message::decode_frame(&f), Err(DecodeError::BadType(9)));
        let f = m.encode();
        assert!(Message::decode_frame(&f[..f.len() - 1]).is_err());
    }

    #[test]
    fn packed_round_trip_and_sizes() {
        // A broker round-trip ping as broker 0 sends it (`broker.rtt`, no padding) and broker 1's answer.
        let mut req = Message::request_json("broker.ping", 1, br#"{"pad":""}"#.to_vec());
        req.matchtag = 42;
        let resp = {
            let mut r = req.clone();
            r.route.push(0);
            r.into_response(br#"{"rank":1,"hostname":"n1","pid":12345,"route":1}"#.to_vec())
        };
        assert_eq!((req.encoded_len(), resp.encoded_len()), (53, 95));
        assert_eq!((packed::encoded_len(&req), packed::encoded_len(&resp)), (26, 64));
        for m in [&req, &resp] {
            let b = packed::encode(m);
            assert_eq!(b.len(), packed::encoded_len(m));
            assert_eq!(packed::decode_owned(b).unwrap(), *m);
        }
        // Every field away from its default, the largest values, local-client route entries.
        let mut m = Message::event("t", &serde_json::json!({"x": 1}));
        (m.flags, m.matchtag, m.nodeid, m.userid, m.errnum, m.seq) = (FLAG_STREAMING, u32::MAX, 0, 1000, 61, 1 << 28);
        m.route = vec![ROUTE_LOCAL | 7, 0, 127, 128, u32::MAX];
        for t in [MsgType::Request, MsgType::Response, MsgType::Event, MsgType::Control] {
            m.msgtype = t;
            assert_eq!(packed::decode_owned(packed::encode(&m)).unwrap(), m);
        }
    }

    #[test]
    fn packed_rejects_bad_input() {
        assert_eq!(packed::decode_owned(vec![]), Err(DecodeError::Truncated(0)));
        // Route too deep; a varint of six bytes; a fifth varint byte beyond 32 bits; a topic past the end.
        assert_eq!(packed::decode_owned(vec![0, 65]), Err(DecodeError::RouteTooDeep(65)));
        assert_eq!(packed::decode_owned(vec![0, 1, 0x80, 0x80, 0x80, 0x80, 0x80, 0]), Err(DecodeError::BadVarint));
        assert_eq!(packed::decode_owned(vec![0, 1, 0xff, 0xff, 0xff, 0xff, 0x1f]), Err(DecodeError::BadVarint));
        assert!(matches!(packed::decode_owned(vec![0, 0, 5, b'a']), Err(DecodeError::Truncated(_))));
        assert_eq!(packed::decode_owned(vec![0, 0, 1, 0xff]), Err(DecodeError::BadTopic));
    }

    proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Message::decode_frame(&bytes);
            let _ = Message::decode_body(&bytes);
        }

        #[test]
        fn owned_decoders_agree(bytes in proptest::collection::vec(any::<u8>(), 0..200), topic in "[a-z.]{0,20}", pad in 0usize..100) {
            let _ = Message::decode_frame_owned(bytes.clone());
            prop_assert_eq!(Message::decode_body_owned(bytes.clone()), Message::decode_body(&bytes));
            let mut m = Message::request(&topic, 2, &serde_json::json!({"pad": "x".repeat(pad)}));
            m.route = vec![1, 2];
            let f = m.encode();
            prop_assert_eq!(Message::decode_frame_owned(f.clone()), Ok(m));
            prop_assert_eq!(Message::decode_frame_owned(f[..f.len() - 1].to_vec()), Message::decode_frame(&f[..f.len() - 1]));
        }

        #[test]
        fn packed_never_panics_and_round_trips(bytes in proptest::collection::vec(any::<u8>(), 0..200),
                topic in "[a-z.-]{0,30}", tag in any::<u32>(), nodeid in any::<u32>(),
                route in proptest::collection::vec(any::<u32>(), 0..5)) {
            let _ = packed::decode_owned(bytes);
            let mut m = Message::request(&topic, nodeid, &serde_json::json!({"n": 1}));
            (m.matchtag, m.route) = (tag, route);
            let b = packed::encode(&m);
            prop_assert_eq!(packed::decode_owned(b.clone()), Ok(m));
            for cut in 0..b.len() - 7 {
                // Cut inside the header or topic (the payload, 7 bytes, has no length of its own).
                prop_assert!(packed::decode_owned(b[..cut].to_vec()).is_err());
            }
        }

        /// Random bytes rarely get past the magic: flip bytes of valid frames instead (header fields, route
        /// count, topic length, topic, payload), so every check behind the magic meets garbage too. Decoding
        /// never panics, and what decodes encodes and decodes again to the same message.
        #[test]
        fn mutated_frames_never_panic(topic in "[a-z.-]{0,30}", route in proptest::collection::vec(any::<u32>(), 0..5),
                edits in proptest::collection::vec((any::<proptest::sample::Index>(), any::<u8>()), 1..6),
                cut in any::<proptest::sample::Index>()) {
            let mut m = Message::request(&topic, 1, &serde_json::json!({"n": 1}));
            m.route = route;
            for f in [m.encode(), packed::encode(&m)] {
                let mut f = f;
                for (at, b) in &edits {
                    let i = at.index(f.len());
                    f[i] = *b;
                }
                let short = f[..cut.index(f.len() + 1)].to_vec();
                for bytes in [f, short] {
                    // Whatever decodes re-encodes to itself; the rest is an error, never a panic.
                    for d in [
                        Message::decode_frame(&bytes),
                        Message::decode_frame_owned(bytes.clone()),
                        Message::decode_body(&bytes),
                        packed::decode_owned(bytes.clone()),
                    ]
                    .into_iter()
                    .flatten()
                    {
                        prop_assert_eq!(Message::decode_frame(&d.encode()), Ok(d.clone()));
                    }
                }
            }
        }

        #[test]
        fn truncations_are_errors(topic in "[a-z.-]{0,30}", n in 0usize..1000, route in proptest::collection::vec(any::<u32>(), 0..5)) {
            let mut m = Message::request(&topic, 1, &serde_json::json!({"n": n}));
            m.route = route;
            let f = m.encode();
            prop_assert_eq!(Message::decode_frame(&f).unwrap(), m);
            for cut in 0..f.len() {
                prop_assert!(Message::decode_frame(&f[..cut]).is_err());
            }
        }
    }
}
