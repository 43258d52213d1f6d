//! Fragmentation, sequencing and reassembly of messages, with no libfabric in it (tested without a provider).
//!
//! Receive buffers have a fixed size, so a message longer than one buffer travels as several fragments. Each
//! fragment starts with a [`HEADER`] of five bytes: a flags byte ([`MORE`] when more fragments of the same
//! message follow) and a 32-bit little-endian sequence number, counted per (sender, receiver) pair from 0 and
//! wrapping.
//!
//! Why sequence numbers although the layer asks for send-after-send ordering (`FI_ORDER_SAS`): that orders
//! how messages are *matched* to receive buffers, not the order their completions are *reported* in
//! (`comp_order`), and `tcp;ofi_rxm` reports `FI_ORDER_NONE` there: measured here, a short message sent after a
//! long one completed before the long one's last fragment. The receiver therefore puts fragments back in
//! sequence order, holding early ones (at most [`REORDER_WINDOW`] ahead of the next expected) before
//! reassembling.

use std::collections::BTreeMap;

/// Bytes of header in front of every fragment: flags, then the sequence number.
pub(crate) const HEADER: usize = 5;
/// Header flag: more fragments of this message follow.
pub(crate) const MORE: u8 = 1;
/// How far ahead of the next expected fragment a received one may be; further (or behind) is a protocol
/// error. Bounds the memory one source can make the receiver hold to this many fragments.
pub(crate) const REORDER_WINDOW: u32 = 1024;

/// The next fragment of a message of `len` bytes whose first `off` bytes were sent: `(payload bytes, more)`,
/// with at most `max` payload bytes. An empty message is one empty fragment.
pub(crate) fn next_fragment(len: usize, off: usize, max: usize) -> (usize, bool) {
    let n = (len - off).min(max);
    (n, off + n < len)
}

/// Write a fragment header into the first [`HEADER`] bytes of `buf`.
pub(crate) fn write_header(buf: &mut [u8], more: bool, seq: u32) {
    buf[0] = if more { MORE } else { 0 };
    buf[1..HEADER].copy_from_slice(&seq.to_le_bytes());
}

/// The `(more, payload)` fragments of `data`, as the sender produces them with [`next_fragment`].
#[cfg(test)]
pub(crate) fn fragments(data: &[u8], max: usize) -> Vec<(bool, &[u8])> {
    let mut out = Vec::new();
    let mut off = 0;
    loop {
        let (n, more) = next_fragment(data.len(), off, max);
        out.push((more, &data[off..off + n]));
        off += n;
        if !more {
            return out;
        }
    }
}

/// What received fragments produced.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Push {
    /// A whole message.
    Complete(Vec<u8>),
    /// The message being assembled exceeded the limit: it is discarded up to its last fragment. Reported once
    /// per message, with the length seen so far.
    Oversized(usize),
    /// Not a fragment of this protocol (too short, unknown flag bits, or a sequence number outside the window).
    Malformed,
}

/// Sequencing and reassembly state for one source.
#[derive(Debug, Default)]
pub(crate) struct Reassembly {
    expected: u32,
    early: BTreeMap<u32, (bool, Vec<u8>)>,
    partial: Vec<u8>,
    discarding: bool,
}

impl Reassembly {
    /// Take one received fragment (header included); what it completes is appended to `out`.
    pub(crate) fn push(&mut self, frag: &[u8], max_message: usize, out: &mut Vec<Push>) {
        if frag.len() < HEADER || frag[0] & !MORE != 0 {
            out.push(Push::Malformed);
            return;
        }
        let more = frag[0] & MORE != 0;
        let seq = u32::from_le_bytes(frag[1..HEADER].try_into().expect("4 bytes"));
        let payload = &frag[HEADER..];
        let ahead = seq.wrapping_sub(self.expected);
        if ahead >= REORDER_WINDOW || (ahead > 0 && self.early.contains_key(&seq)) {
            out.push(Push::Malformed);
            return;
        }
        if ahead > 0 {
            self.early.insert(seq, (more, payload.to_vec()));
            return;
        }
        self.take(more, payload, max_message, out);
        while let Some((more, p)) = self.early.remove(&self.expected) {
            self.take(more, &p, max_message, out);
        }
    }

    /// Reassemble the fragment with the expected sequence number.
    fn take(&mut self, more: bool, payload: &[u8], max_message: usize, out: &mut Vec<Push>) {
        self.expected = self.expected.wrapping_add(1);
        if self.discarding {
            self.discarding = more;
            return;
        }
        if self.partial.len() + payload.len() > max_message {
            out.push(Push::Oversized(self.partial.len() + payload.len()));
            self.partial = Vec::new();
            self.discarding = more;
            return;
        }
        if !more && self.partial.is_empty() {
            out.push(Push::Complete(payload.to_vec()));
            return;
        }
        self.partial.extend_from_slice(payload);
        if !more {
            out.push(Push::Complete(std::mem::take(&mut self.partial)));
        }
    }

    /// Bytes held for messages not complete yet (partial and early fragments).
    #[cfg(test)]
    pub(crate) fn pending(&self) -> usize {
        self.partial.len() + self.early.values().map(|(_, p)| p.len()).sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(more: bool, seq: u32, p: &[u8]) -> Vec<u8> {
        let mut v = vec![0; HEADER];
        write_header(&mut v, more, seq);
        v.extend_from_slice(p);
        v
    }

    fn push(r: &mut Reassembly, f: &[u8], max: usize) -> Vec<Push> {
        let mut out = Vec::new();
        r.push(f, max, &mut out);
        out
    }

    #[test]
    fn split_sizes() {
        let d: Vec<u8> = (0..10).collect();
        assert_eq!(fragments(&d, 4), vec![(true, &d[0..4]), (true, &d[4..8]), (false, &d[8..10])]);
        assert_eq!(fragments(&d, 5), vec![(true, &d[0..5]), (false, &d[5..10])]);
        assert_eq!(fragments(&[], 5), vec![(false, &[][..])]);
    }

    /// Fragments of several messages, delivered in a scrambled order within the window, come out whole and
    /// in order.
    #[test]
    fn roundtrip_any_split_any_order() {
        let msgs: Vec<Vec<u8>> = (0..5u32).map(|m| (0..(m * 300 + 1)).map(|i| (i * 7 + m) as u8).collect()).collect();
        for max in [1, 7, 64, 999, 4096] {
            let mut frames = Vec::new();
            let mut seq = u32::MAX - 20; // crosses the wrap
            for m in &msgs {
                for (more, p) in fragments(m, max) {
                    frames.push(frame(more, seq, p));
                    seq = seq.wrapping_add(1);
                }
            }
            // Reverse each run of up to 8 fragments: a deterministic scramble within the window.
            for chunk in frames.chunks_mut(8) {
                chunk.reverse();
            }
            let mut r = Reassembly { expected: u32::MAX - 20, ..Reassembly::default() };
            let mut out = Vec::new();
            for f in &frames {
                r.push(f, 1 << 20, &mut out);
            }
            let want: Vec<Push> = msgs.iter().cloned().map(Push::Complete).collect();
            assert_eq!(out, want, "max {max}");
            assert_eq!(r.pending(), 0);
        }
    }

    #[test]
    fn oversized_is_discarded_then_next_message_is_clean() {
        let mut r = Reassembly::default();
        assert_eq!(push(&mut r, &frame(true, 0, &[1; 6]), 10), vec![]);
        assert_eq!(push(&mut r, &frame(true, 1, &[2; 6]), 10), vec![Push::Oversized(12)]);
        assert_eq!(push(&mut r, &frame(true, 2, &[3; 6]), 10), vec![]);
        assert_eq!(push(&mut r, &frame(false, 3, &[4; 6]), 10), vec![]);
        assert_eq!(push(&mut r, &frame(false, 4, b"ok"), 10), vec![Push::Complete(b"ok".to_vec())]);
        // An oversized single fragment does not start discarding.
        assert_eq!(push(&mut r, &frame(false, 5, &[5; 11]), 10), vec![Push::Oversized(11)]);
        assert_eq!(push(&mut r, &frame(false, 6, b"ok"), 10), vec![Push::Complete(b"ok".to_vec())]);
    }

    #[test]
    fn malformed() {
        let mut r = Reassembly::default();
        assert_eq!(push(&mut r, &[], 10), vec![Push::Malformed]);
        assert_eq!(push(&mut r, &[0, 0, 0, 0], 10), vec![Push::Malformed]);
        let mut bad = frame(false, 0, b"x");
        bad[0] = 0x80;
        assert_eq!(push(&mut r, &bad, 10), vec![Push::Malformed]);
        // Outside the window, behind it, or a duplicate early fragment.
        assert_eq!(push(&mut r, &frame(false, REORDER_WINDOW, b"x"), 10), vec![Push::Malformed]);
        assert_eq!(push(&mut r, &frame(false, u32::MAX, b"x"), 10), vec![Push::Malformed]);
        assert_eq!(push(&mut r, &frame(false, 2, b"x"), 10), vec![]);
        assert_eq!(push(&mut r, &frame(false, 2, b"x"), 10), vec![Push::Malformed]);
        assert_eq!(push(&mut r, &frame(false, 0, b""), 10), vec![Push::Complete(Vec::new())]);
        assert_eq!(
            push(&mut r, &frame(false, 1, b"y"), 10),
            vec![Push::Complete(b"y".to_vec()), Push::Complete(b"x".to_vec())]
        );
    }
}
