//! The part of Vigil's fast overlay transports that needs no device: how a message is cut into fragments, how
//! fragments are put back together without letting a peer make us hold unbounded memory, how fragments that
//! may complete out of order are put back in sequence, and how receive-buffer credits are counted. No I/O, no
//! clock, no `unsafe`: the verbs transport (`vigil-rdma`, RC queue pairs) and the libfabric transport
//! (`vigil-ofi`, reliable-datagram endpoints) each keep their own wire encoding and their own buffers, and
//! call into this crate for the rules, which are tested here with unit tests and proptests.
//!
//! | piece | verbs (`vigil-rdma`) | libfabric (`vigil-ofi`) |
//! |---|---|---|
//! | [`OutQueue`]: messages waiting to go, cut into fragments of the link's fragment size as they leave | yes | yes (one per peer) |
//! | [`Reassembler`]: fragments in order back into messages, bounded by the largest message accepted | yes (an oversized message is a protocol error: the connection ends) | yes, under [`Sequenced`] (an oversized message is discarded and reported) |
//! | [`Sequenced`]: the 5-byte fragment header, sequence numbers per peer, a bounded reorder window | no: an RC queue pair delivers in order | yes: providers order matching, not completions |
//! | [`Credits`]: fragments the peer's receive buffers still allow, and credits owed back to it | yes | no: the provider's resource management (`FI_RM_ENABLED`) retries a message that finds no buffer; the layer bounds its own queue in bytes ([`OutQueue::bytes`]) |
//!
//! [`config`] holds the settings of a verbs (RC queue pair) connection and their validation: plain data that the
//! broker's attribute table (`vigil-core`) parses and `vigil-rdma` applies.
//!
//! The wire formats are those of `docs/wire-format.md` and of each crate's docs: on verbs, the flags and
//! returned credits ride in the 32-bit immediate value of each SEND; on libfabric, the header of
//! [`Sequenced`] precedes each fragment. This crate does not change either.

#![forbid(unsafe_code)]

pub mod config;

use std::collections::{BTreeMap, VecDeque};
use std::fmt;

/// The next fragment of a message of `len` bytes whose first `off` bytes were sent: `(payload bytes, more)`,
/// with at most `max` payload bytes (`max` > 0). An empty message is one empty fragment.
pub fn next_fragment(len: usize, off: usize, max: usize) -> (usize, bool) {
    let n = len.saturating_sub(off).min(max);
    (n, off + n < len)
}

/// Messages waiting to be sent, each with the offset of its next fragment; fragments are cut at the size the
/// caller gives (the link's fragment size), so a message is never copied to be split.
#[derive(Debug, Default)]
pub struct OutQueue {
    msgs: VecDeque<(Vec<u8>, usize)>,
    bytes: usize,
}

impl OutQueue {
    /// An empty queue.
    pub fn new() -> OutQueue {
        OutQueue::default()
    }

    /// Queue a whole message behind the others.
    pub fn push(&mut self, msg: Vec<u8>) {
        self.bytes += msg.len();
        self.msgs.push_back((msg, 0));
    }

    /// The next fragment to send, of at most `max` payload bytes: `(payload, more)`, where `more` says that
    /// further fragments of the same message follow. None when nothing is queued.
    pub fn front(&self, max: usize) -> Option<(&[u8], bool)> {
        let (m, off) = self.msgs.front()?;
        let (n, more) = next_fragment(m.len(), *off, max);
        Some((&m[*off..*off + n], more))
    }

    /// The fragment [`front`](Self::front) gave for the same `max` has been sent: move past it (and past its
    /// message when it was the last one). Returns the payload bytes it had.
    pub fn advance(&mut self, max: usize) -> usize {
        let Some((m, off)) = self.msgs.front_mut() else { return 0 };
        let (n, more) = next_fragment(m.len(), *off, max);
        *off += n;
        self.bytes -= n;
        if !more {
            self.msgs.pop_front();
        }
        n
    }

    /// No message is waiting.
    pub fn is_empty(&self) -> bool {
        self.msgs.is_empty()
    }

    /// Messages waiting (a partly sent one counts).
    pub fn len(&self) -> usize {
        self.msgs.len()
    }

    /// Payload bytes not yet sent.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Drop everything queued; returns the payload bytes dropped.
    pub fn clear(&mut self) -> usize {
        self.msgs.clear();
        std::mem::take(&mut self.bytes)
    }
}

/// What a fragment completed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Assembled {
    /// A whole message.
    Complete(Vec<u8>),
    /// The message being assembled would exceed the limit, with this many bytes: what was held is freed and
    /// the message's remaining fragments are discarded (reported once per message).
    Oversized(usize),
}

/// Puts fragments that arrive in order back into messages, holding at most `max_message` bytes: a peer that
/// sends an endless message costs one refusal, not memory.
#[derive(Debug)]
pub struct Reassembler {
    partial: Vec<u8>,
    discarding: bool,
    max_message: usize,
}

impl Reassembler {
    /// A reassembler accepting messages of at most `max_message` bytes.
    pub fn new(max_message: usize) -> Reassembler {
        Reassembler { partial: Vec::new(), discarding: false, max_message }
    }

    /// Take the next fragment (`more`: further fragments of its message follow).
    pub fn push(&mut self, more: bool, payload: &[u8]) -> Option<Assembled> {
        if self.discarding {
            self.discarding = more;
            return None;
        }
        let len = self.partial.len() + payload.len();
        if len > self.max_message {
            self.partial = Vec::new();
            self.discarding = more;
            return Some(Assembled::Oversized(len));
        }
        if !more && self.partial.is_empty() {
            // A message in one fragment is copied once, into a buffer of its exact size.
            return Some(Assembled::Complete(payload.to_vec()));
        }
        self.partial.extend_from_slice(payload);
        (!more).then(|| Assembled::Complete(std::mem::take(&mut self.partial)))
    }

    /// Bytes held for the message being assembled.
    pub fn pending(&self) -> usize {
        self.partial.len()
    }

    /// The largest message accepted.
    pub fn max_message(&self) -> usize {
        self.max_message
    }
}

/// Bytes of header in front of every fragment of the libfabric path: flags, then the sequence number.
pub const HEADER: usize = 5;
/// Header flag: more fragments of this message follow.
pub const MORE: u8 = 1;
/// How far ahead of the next expected fragment a received one may be; further (or behind) is a protocol
/// error. Bounds what one source can make the receiver hold to this many fragments.
pub const REORDER_WINDOW: u32 = 1024;

/// Write a fragment header (`more`, sequence number `seq`) into the first [`HEADER`] bytes of `buf`.
///
/// # Panics
/// When `buf` is shorter than [`HEADER`].
pub fn write_header(buf: &mut [u8], more: bool, seq: u32) {
    buf[0] = if more { MORE } else { 0 };
    buf[1..HEADER].copy_from_slice(&seq.to_le_bytes());
}

/// A fragment's header, or None when `frag` is not a fragment of this protocol (shorter than the header, or
/// unknown flag bits).
pub fn parse_header(frag: &[u8]) -> Option<(bool, u32, &[u8])> {
    if frag.len() < HEADER || frag[0] & !MORE != 0 {
        return None;
    }
    let seq = u32::from_le_bytes([frag[1], frag[2], frag[3], frag[4]]);
    Some((frag[0] & MORE != 0, seq, &frag[HEADER..]))
}

/// What received fragments of the libfabric path produced.
#[derive(Debug, PartialEq, Eq)]
pub enum Push {
    /// A whole message.
    Complete(Vec<u8>),
    /// The message being assembled exceeded the limit: it is discarded up to its last fragment. Reported once
    /// per message, with the length seen so far.
    Oversized(usize),
    /// Not a fragment of this protocol: too short, unknown flag bits, a payload longer than a fragment may
    /// be, a sequence number outside the window or one already held.
    Malformed,
}

/// Sequencing and reassembly for one source of the libfabric path.
///
/// Fragments carry a header ([`write_header`]): a flags byte ([`MORE`]) and a 32-bit little-endian sequence
/// number, counted per (sender, receiver) pair from 0 and wrapping. Providers order how messages are
/// *matched* to receive buffers (`FI_ORDER_SAS`) but not necessarily the order their completions are
/// *reported* in (`tcp;ofi_rxm` reports `FI_ORDER_NONE`, and a short message sent after a long one was seen
/// completing before the long one's last fragment), so early fragments (at most [`REORDER_WINDOW`] ahead of
/// the next expected) are held until the gap fills. What one source can make us hold is bounded by
/// `REORDER_WINDOW` x `max_payload` bytes of early fragments plus `max_message` bytes of a partial message.
#[derive(Debug)]
pub struct Sequenced {
    expected: u32,
    early: BTreeMap<u32, (bool, Vec<u8>)>,
    rx: Reassembler,
    max_payload: usize,
}

impl Sequenced {
    /// A source whose messages may be `max_message` bytes long and whose fragments carry at most
    /// `max_payload` bytes after the header.
    pub fn new(max_message: usize, max_payload: usize) -> Sequenced {
        Sequenced { expected: 0, early: BTreeMap::new(), rx: Reassembler::new(max_message), max_payload }
    }

    /// Take one received fragment (header included); what it completes is appended to `out`, in order.
    pub fn push(&mut self, frag: &[u8], out: &mut Vec<Push>) {
        let Some((more, seq, payload)) = parse_header(frag).filter(|(_, _, p)| p.len() <= self.max_payload) else {
            out.push(Push::Malformed);
            return;
        };
        let ahead = seq.wrapping_sub(self.expected);
        if ahead >= REORDER_WINDOW || (ahead > 0 && self.early.contains_key(&seq)) {
            out.push(Push::Malformed);
            return;
        }
        if ahead > 0 {
            self.early.insert(seq, (more, payload.to_vec()));
            return;
        }
        self.take(more, payload, out);
        while let Some((more, p)) = self.early.remove(&self.expected) {
            self.take(more, &p, out);
        }
    }

    /// Reassemble the fragment with the expected sequence number.
    fn take(&mut self, more: bool, payload: &[u8], out: &mut Vec<Push>) {
        self.expected = self.expected.wrapping_add(1);
        match self.rx.push(more, payload) {
            Some(Assembled::Complete(m)) => out.push(Push::Complete(m)),
            Some(Assembled::Oversized(n)) => out.push(Push::Oversized(n)),
            None => {}
        }
    }

    /// Bytes held for messages not complete yet (partial and early fragments).
    pub fn pending(&self) -> usize {
        self.rx.pending() + self.early.values().map(|(_, p)| p.len()).sum::<usize>()
    }

    /// Fragments held ahead of the next expected one.
    pub fn early(&self) -> usize {
        self.early.len()
    }
}

/// The peer returned more credits than it ever granted: a protocol error (the connection is dropped).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TooManyCredits {
    /// Credits we would hold.
    pub held: u32,
    /// Credits the peer granted.
    pub granted: u32,
}

impl fmt::Display for TooManyCredits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "peer returned more credits ({}) than it granted ({})", self.held, self.granted)
    }
}

impl std::error::Error for TooManyCredits {}

/// Credit accounting of one connection whose receiver grants the sender a fixed number of receive buffers
/// (the verbs path's ring `depth`).
///
/// A data fragment costs the sender one credit ([`spend`](Self::spend)); credits come back in the peer's
/// packets ([`returned`](Self::returned)). On the receiving side, a buffer whose content has been taken is
/// owed back to the peer ([`owe`](Self::owe)); owed credits ride on the next packet
/// ([`take_owed`](Self::take_owed)), and once half of our own ring is owed ([`update_due`](Self::update_due))
/// a credit-only packet is worth sending. So a sender never has more fragments in flight than the receiver
/// has buffers, and a slow receiver stalls the sender instead of being overrun.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Credits {
    available: u32,
    granted: u32,
    owed: u32,
    threshold: u32,
}

impl Credits {
    /// `granted`: receive buffers the peer posted for our data fragments (its depth); `depth`: ours for it.
    pub fn new(granted: u32, depth: u32) -> Credits {
        Credits { available: granted, granted, owed: 0, threshold: (depth / 2).max(1) }
    }

    /// Credits left: fragments we may send now.
    pub fn available(&self) -> u32 {
        self.available
    }

    /// Pay for one data fragment; false (and nothing spent) when no credit is left.
    pub fn spend(&mut self) -> bool {
        if self.available == 0 {
            return false;
        }
        self.available -= 1;
        true
    }

    /// The peer returned `n` credits. More than it granted in all is refused (and nothing changes).
    pub fn returned(&mut self, n: u32) -> Result<(), TooManyCredits> {
        let held = self.available.saturating_add(n);
        if held > self.granted {
            return Err(TooManyCredits { held, granted: self.granted });
        }
        self.available = held;
        Ok(())
    }

    /// `n` of our receive buffers are free again: their credits are owed to the peer.
    pub fn owe(&mut self, n: u32) {
        self.owed = self.owed.saturating_add(n);
    }

    /// Credits owed to the peer and not yet sent.
    pub fn owed(&self) -> u32 {
        self.owed
    }

    /// Take up to `max` owed credits to send on the next packet (`max`: what the packet's field can carry).
    pub fn take_owed(&mut self, max: u32) -> u32 {
        let n = self.owed.min(max);
        self.owed -= n;
        n
    }

    /// Enough is owed (half our ring) that a credit-only packet should go if nothing else does.
    pub fn update_due(&self) -> bool {
        self.owed >= self.threshold
    }
}

#[cfg(test)]
mod tests;
