use super::*;
use proptest::prelude::*;

/// All fragments of the queue's messages, as a sender cutting at `max` produces them.
fn drain(q: &mut OutQueue, max: usize) -> Vec<(bool, Vec<u8>)> {
    let mut out = Vec::new();
    while let Some((p, more)) = q.front(max) {
        let (more, p) = (more, p.to_vec());
        assert_eq!(q.advance(max), p.len());
        out.push((more, p));
    }
    out
}

fn frame(more: bool, seq: u32, p: &[u8]) -> Vec<u8> {
    let mut v = vec![0; HEADER];
    write_header(&mut v, more, seq);
    v.extend_from_slice(p);
    v
}

fn push(r: &mut Sequenced, f: &[u8]) -> Vec<Push> {
    let mut out = Vec::new();
    r.push(f, &mut out);
    out
}

#[test]
fn split_sizes() {
    let d: Vec<u8> = (0..10).collect();
    let mut q = OutQueue::new();
    q.push(d.clone());
    q.push(Vec::new());
    assert_eq!((q.len(), q.bytes()), (2, 10));
    let f = drain(&mut q, 4);
    assert_eq!(
        f,
        vec![(true, d[0..4].to_vec()), (true, d[4..8].to_vec()), (false, d[8..10].to_vec()), (false, vec![])]
    );
    assert!(q.is_empty());
    assert_eq!(q.bytes(), 0);
    assert_eq!(next_fragment(10, 5, 5), (5, false));
    assert_eq!(next_fragment(0, 0, 5), (0, false));
    q.push(vec![1; 7]);
    assert_eq!(q.clear(), 7);
    assert!(q.front(4).is_none());
}

#[test]
fn oversized_is_discarded_then_next_message_is_clean() {
    let mut r = Reassembler::new(10);
    assert_eq!(r.push(true, &[1; 6]), None);
    assert_eq!(r.push(true, &[2; 6]), Some(Assembled::Oversized(12)));
    assert_eq!(r.pending(), 0, "what was held is freed at once");
    assert_eq!(r.push(true, &[3; 6]), None);
    assert_eq!(r.push(false, &[4; 6]), None);
    assert_eq!(r.push(false, b"ok"), Some(Assembled::Complete(b"ok".to_vec())));
    // An oversized single fragment does not start discarding.
    assert_eq!(r.push(false, &[5; 11]), Some(Assembled::Oversized(11)));
    assert_eq!(r.push(false, b"ok"), Some(Assembled::Complete(b"ok".to_vec())));
    // Exactly the limit is accepted.
    assert_eq!(r.push(true, &[6; 5]), None);
    assert_eq!(r.push(false, &[6; 5]), Some(Assembled::Complete(vec![6; 10])));
}

/// Fragments of several messages, delivered in a scrambled order within the window, come out whole and in
/// order, across the sequence number's wrap.
#[test]
fn sequenced_roundtrip_any_split_any_order() {
    let msgs: Vec<Vec<u8>> = (0..5u32).map(|m| (0..(m * 300 + 1)).map(|i| (i * 7 + m) as u8).collect()).collect();
    for max in [1, 7, 64, 999, 4096] {
        let mut frames = Vec::new();
        let mut seq = u32::MAX - 20;
        let mut q = OutQueue::new();
        msgs.iter().for_each(|m| q.push(m.clone()));
        for (more, p) in drain(&mut q, max) {
            frames.push(frame(more, seq, &p));
            seq = seq.wrapping_add(1);
        }
        for chunk in frames.chunks_mut(8) {
            chunk.reverse();
        }
        let mut r = Sequenced::new(1 << 20, max);
        r.expected = u32::MAX - 20;
        let mut out = Vec::new();
        for f in &frames {
            r.push(f, &mut out);
        }
        let want: Vec<Push> = msgs.iter().cloned().map(Push::Complete).collect();
        assert_eq!(out, want, "max {max}");
        assert_eq!(r.pending(), 0);
    }
}

#[test]
fn malformed_fragments_are_refused() {
    let mut r = Sequenced::new(10, 4);
    assert_eq!(push(&mut r, &[]), vec![Push::Malformed]);
    assert_eq!(push(&mut r, &[0, 0, 0, 0]), vec![Push::Malformed]);
    let mut bad = frame(false, 0, b"x");
    bad[0] = 0x80;
    assert_eq!(push(&mut r, &bad), vec![Push::Malformed]);
    // A payload longer than a fragment may be.
    assert_eq!(push(&mut r, &frame(false, 0, b"12345")), vec![Push::Malformed]);
    // Outside the window, behind it, or a duplicate early fragment.
    assert_eq!(push(&mut r, &frame(false, REORDER_WINDOW, b"x")), vec![Push::Malformed]);
    assert_eq!(push(&mut r, &frame(false, u32::MAX, b"x")), vec![Push::Malformed]);
    assert_eq!(push(&mut r, &frame(false, 2, b"x")), vec![]);
    assert_eq!(push(&mut r, &frame(false, 2, b"x")), vec![Push::Malformed]);
    assert_eq!(r.early(), 1);
    assert_eq!(push(&mut r, &frame(false, 0, b"")), vec![Push::Complete(Vec::new())]);
    assert_eq!(
        push(&mut r, &frame(false, 1, b"y")),
        vec![Push::Complete(b"y".to_vec()), Push::Complete(b"x".to_vec())]
    );
    assert_eq!(r.pending(), 0);
}

#[test]
fn credits_bound_what_is_in_flight() {
    let mut c = Credits::new(2, 8);
    assert!(c.spend() && c.spend());
    assert!(!c.spend(), "no credit, no fragment");
    assert_eq!(c.available(), 0);
    c.returned(1).unwrap();
    assert_eq!(c.available(), 1);
    let e = c.returned(2).unwrap_err();
    assert_eq!(e, TooManyCredits { held: 3, granted: 2 });
    assert_eq!(e.to_string(), "peer returned more credits (3) than it granted (2)");
    assert_eq!(c.available(), 1, "a refused return changes nothing");
    assert!(c.returned(u32::MAX).is_err(), "no overflow");
    c.owe(3);
    assert!(!c.update_due(), "threshold is half our depth (4)");
    c.owe(1);
    assert!(c.update_due());
    assert_eq!(c.take_owed(3), 3);
    assert_eq!((c.owed(), c.take_owed(10), c.owed()), (1, 1, 0));
    assert_eq!(Credits::new(4, 1).threshold, 1, "a ring of one still returns its credit");
}

proptest! {
    /// Any messages, any fragment size: what the queue cuts, the reassembler puts back, exactly.
    #[test]
    fn out_queue_and_reassembler_round_trip(
        msgs in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 0..12),
        max in 1usize..64,
    ) {
        let mut q = OutQueue::new();
        for m in &msgs {
            q.push(m.clone());
        }
        prop_assert_eq!(q.bytes(), msgs.iter().map(Vec::len).sum::<usize>());
        let mut r = Reassembler::new(300);
        let mut got = Vec::new();
        for (more, p) in drain(&mut q, max) {
            prop_assert!(p.len() <= max);
            if let Some(a) = r.push(more, &p) {
                got.push(a);
            }
        }
        prop_assert_eq!(got, msgs.into_iter().map(Assembled::Complete).collect::<Vec<_>>());
        prop_assert_eq!(r.pending(), 0);
        prop_assert_eq!(q.bytes(), 0);
    }

    /// Arbitrary fragment sequences from a hostile peer: the reassembler never holds more than the limit,
    /// never returns a longer message, and a refusal is followed by a clean start after the message's end.
    #[test]
    fn reassembler_is_bounded_for_any_fragments(
        frags in proptest::collection::vec((any::<bool>(), 0usize..40), 0..200),
        max in 0usize..100,
    ) {
        let mut r = Reassembler::new(max);
        for (more, len) in frags {
            match r.push(more, &vec![7; len]) {
                Some(Assembled::Complete(m)) => prop_assert!(m.len() <= max),
                Some(Assembled::Oversized(n)) => prop_assert!(n > max),
                None => {}
            }
            prop_assert!(r.pending() <= max);
            if !more {
                prop_assert_eq!(r.pending(), 0, "a message's last fragment leaves nothing held");
            }
        }
    }

    /// Messages cut into fragments and delivered in any order within the window come back whole and in order.
    #[test]
    fn sequenced_reassembles_any_permutation_within_the_window(
        msgs in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..200), 1..8),
        max in 1usize..50,
        start in any::<u32>(),
        swaps in proptest::collection::vec((any::<prop::sample::Index>(), any::<prop::sample::Index>()), 0..50),
    ) {
        let mut q = OutQueue::new();
        msgs.iter().for_each(|m| q.push(m.clone()));
        let mut frames: Vec<Vec<u8>> = drain(&mut q, max)
            .into_iter()
            .enumerate()
            .map(|(i, (more, p))| frame(more, start.wrapping_add(i as u32), &p))
            .collect();
        prop_assume!(frames.len() <= REORDER_WINDOW as usize);
        let n = frames.len();
        for (a, b) in swaps {
            frames.swap(a.index(n), b.index(n));
        }
        let mut r = Sequenced::new(200, max);
        r.expected = start;
        let mut out = Vec::new();
        for f in &frames {
            r.push(f, &mut out);
        }
        prop_assert_eq!(out, msgs.into_iter().map(Push::Complete).collect::<Vec<_>>());
        prop_assert_eq!(r.pending(), 0);
        prop_assert_eq!(r.early(), 0);
    }

    /// Arbitrary bytes as fragments: never a panic; what is held stays within the window and the limits;
    /// anything shorter than the header, with unknown flags or an oversized payload is refused.
    #[test]
    fn sequenced_is_bounded_and_refuses_garbage(
        frags in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..24), 0..300),
        near in proptest::collection::vec((0u32..8, any::<bool>(), 0usize..24), 0..300),
    ) {
        let (max_message, max_payload) = (64, 16);
        let mut r = Sequenced::new(max_message, max_payload);
        // Raw garbage, then fragments near the expected sequence number (so the window is really used).
        let near = near.into_iter().enumerate().map(|(i, (d, more, len))| frame(more, i as u32 / 2 + d, &vec![1; len]));
        for f in frags.into_iter().chain(near) {
            let mut out = Vec::new();
            r.push(&f, &mut out);
            let refused = f.len() < HEADER || f[0] & !MORE != 0 || f.len() - HEADER > max_payload;
            if refused {
                prop_assert_eq!(&out, &vec![Push::Malformed]);
            }
            for p in &out {
                if let Push::Complete(m) = p {
                    prop_assert!(m.len() <= max_message);
                }
            }
            prop_assert!(r.early() < REORDER_WINDOW as usize);
            prop_assert!(r.pending() <= max_message + REORDER_WINDOW as usize * max_payload);
        }
    }

    /// Any interleaving of spending and returning: the sender never holds more credits than were granted,
    /// never goes below zero, and every refused return is one that would have exceeded the grant.
    #[test]
    fn credits_never_exceed_the_grant(
        granted in 1u32..64,
        ops in proptest::collection::vec((any::<bool>(), 0u32..8), 0..200),
    ) {
        let mut c = Credits::new(granted, granted);
        let mut in_flight = 0u32;
        for (send, n) in ops {
            if send {
                if c.spend() {
                    in_flight += 1;
                } else {
                    prop_assert_eq!(c.available(), 0);
                }
            } else {
                let before = c.available();
                match c.returned(n) {
                    Ok(()) => in_flight = in_flight.saturating_sub(n),
                    Err(e) => {
                        prop_assert!(before + n > granted);
                        prop_assert_eq!(c.available(), before);
                        prop_assert_eq!(e.granted, granted);
                    }
                }
            }
            prop_assert!(c.available() <= granted);
        }
    }
}
