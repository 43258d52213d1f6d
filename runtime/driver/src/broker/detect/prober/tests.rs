//! The prober's rules on fed-in replies (no socket, no BPF: replies go straight to [`Prober::reply`]).

use super::*;
use crate::attrs::ProbeGroup;

fn prober(group: bool) -> (Prober, mpsc::UnboundedReceiver<DetectInput>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let group = group.then(|| ProbeGroup::Auto.for_parent(0)).flatten();
    let mut pr = Prober::new(0x5eed, 9, group, tx, 0.25);
    // As if this node's kernel collected replies (no BPF in unit tests: replies are fed in directly).
    pr.collects = true;
    (pr, rx)
}

fn addr(host: u8) -> SocketAddr {
    SocketAddr::from(([10, 200, 0, host], 7000))
}

/// A reply of `kind` from child `rank` to the current round, as it comes.
fn raw_reply(pr: &mut Prober, rank: u32, kind: ProbeKind) {
    let p = Probe {
        kind,
        flags: vigil_ebpf::FLAG_ALIVE,
        seq: pr.round,
        rank: pr.targets[&rank].id,
        sent_ns: vigil_ebpf::monotonic_ns() ^ pr.key,
        hb_age_ns: 0,
        answered: 1,
    };
    let from = pr.targets[&rank].addr;
    pr.reply(&p, from);
}

/// [`raw_reply`] from a kernel that has answered for a while: its timing is known, its replies are forwarded
/// and its misses count (vigil_core::probe::ARM_REPLIES).
fn reply(pr: &mut Prober, rank: u32, kind: ProbeKind) {
    if kind == ProbeKind::ReplyKernel {
        let t = pr.targets.get_mut(&rank).expect("a target");
        while !t.timing.armed() {
            t.timing.sample(0.0);
        }
    }
    raw_reply(pr, rank, kind);
}

fn misses(rx: &mut mpsc::UnboundedReceiver<DetectInput>) -> Vec<(u32, u32)> {
    let mut v = Vec::new();
    while let Ok(d) = rx.try_recv() {
        if let DetectInput::Probe(r, Signal::ProbeMissed { misses }, ..) = d {
            v.push((r, misses));
        }
    }
    v
}
#[test]
fn a_child_whose_kernel_answered_moves_to_the_group_datagram() {
    let (mut pr, mut rx) = prober(true);
    pr.add(1, addr(2));
    pr.add(2, addr(3));
    let (group, unicast) = pr.next_round();
    assert!(!group);
    assert_eq!(unicast.len(), 2);
    reply(&mut pr, 1, ProbeKind::ReplyKernel);
    reply(&mut pr, 2, ProbeKind::ReplyUserspace);
    let (group, unicast) = pr.next_round();
    assert!(group, "rank 1's kernel answered: it is probed by the group datagram");
    assert_eq!(unicast, vec![(pr.targets[&2].id, addr(3))], "a userspace responder never sees group probes");
    assert!(misses(&mut rx).is_empty());
}

#[test]
fn without_group_or_kernel_collection_or_alone_on_its_node_probes_stay_unicast() {
    for (group, collects, same_node) in [(false, true, false), (true, false, false), (true, true, true)] {
        let (mut pr, _rx) = prober(group);
        pr.collects = collects;
        pr.add(1, addr(2));
        pr.add(2, if same_node { SocketAddr::from(([10, 200, 0, 2], 7001)) } else { addr(3) });
        pr.next_round();
        reply(&mut pr, 1, ProbeKind::ReplyKernel);
        reply(&mut pr, 2, ProbeKind::ReplyKernel);
        let (g, unicast) = pr.next_round();
        assert!(!g && unicast.len() == 2, "group {group} collects {collects} same node {same_node}");
    }
}

#[test]
fn unicast_probes_start_at_a_different_child_each_round() {
    let (mut pr, _rx) = prober(false);
    for k in 1..=5 {
        pr.add(k, addr(k as u8 + 1));
    }
    let mut firsts = std::collections::HashSet::new();
    for _ in 0..5 {
        let (_, unicast) = pr.next_round();
        let mut ids: Vec<u32> = unicast.iter().map(|(id, _)| *id).collect();
        firsts.insert(ids[0]);
        ids.sort_unstable();
        let mut all: Vec<u32> = pr.targets.values().map(|t| t.id).collect();
        all.sort_unstable();
        assert_eq!(ids, all, "every child probed once a round");
    }
    assert_eq!(firsts.len(), 5, "five rounds, five different children first (none always last)");
}

#[test]
fn a_silent_grouped_child_is_probed_by_unicast_too_and_misses_count_every_round() {
    let (mut pr, mut rx) = prober(true);
    pr.add(1, addr(2));
    pr.next_round();
    reply(&mut pr, 1, ProbeKind::ReplyKernel);
    let (group, unicast) = pr.next_round();
    assert!(group && unicast.is_empty());
    // Silent from now on.
    let (_, unicast) = pr.next_round();
    assert_eq!(unicast, vec![(pr.targets[&1].id, addr(2))], "a missed group round brings a unicast probe as well");
    pr.next_round();
    pr.next_round();
    assert_eq!(misses(&mut rx), vec![(1, 1), (1, 2), (1, 3)]);
}

/// Before a child's reply time is known its kernel replies are not forwarded (they would arm the probe rules)
/// and its silence is no miss; a new child then starts from the prober's timing of the others.
#[test]
fn a_childs_replies_count_once_its_reply_time_is_known() {
    let (mut pr, mut rx) = prober(false);
    pr.add(1, addr(2));
    let raw = |pr: &mut Prober, rank: u32| raw_reply(pr, rank, ProbeKind::ReplyKernel);
    let replies = |rx: &mut mpsc::UnboundedReceiver<DetectInput>| {
        let mut n = 0;
        while let Ok(d) = rx.try_recv() {
            n += usize::from(matches!(d, DetectInput::Probe(_, Signal::ProbeReply { kernel: true, .. }, ..)));
        }
        n
    };
    for _ in 0..vigil_core::probe::ARM_REPLIES - 1 {
        pr.next_round();
        raw(&mut pr, 1);
    }
    assert_eq!(replies(&mut rx), 0, "forwarded before its reply time is known");
    for _ in 0..5 {
        pr.next_round();
    }
    assert!(misses(&mut rx).is_empty(), "silence counted before its reply time is known");
    pr.next_round();
    raw(&mut pr, 1);
    assert_eq!(replies(&mut rx), 1);
    // A child that joins now is judged at the pace of the others at once.
    pr.add(2, addr(3));
    assert!(pr.targets[&2].timing.armed());
    pr.next_round();
    raw(&mut pr, 2);
    assert_eq!(replies(&mut rx), 1);
}

#[test]
fn a_child_the_group_does_not_reach_falls_back_to_unicast_and_is_never_counted_lost() {
    let (mut pr, mut rx) = prober(true);
    pr.add(1, addr(2));
    let mut worst = 0;
    for _ in 0..40 {
        let (_, unicast) = pr.next_round();
        // The network drops the multicast datagram: only unicast probes are answered.
        if unicast.iter().any(|(id, _)| *id == pr.targets[&1].id) {
            reply(&mut pr, 1, ProbeKind::ReplyKernel);
        }
        worst = misses(&mut rx).iter().map(|(_, m)| *m).max().unwrap_or(0).max(worst);
    }
    let t = &pr.targets[&1];
    assert!(t.no_group && !t.grouped, "probed by unicast for good");
    assert_eq!(worst, 1, "never more than one miss in a row: far from lost");
    // From then on every round is unicast and answered: no more misses.
    for _ in 0..5 {
        let (group, unicast) = pr.next_round();
        assert!(!group && unicast.len() == 1);
        reply(&mut pr, 1, ProbeKind::ReplyKernel);
    }
    assert!(misses(&mut rx).is_empty());
}

/// A prober with children 1..=n whose kernels answered once, all grouped.
fn grouped_children(n: u32) -> (Prober, mpsc::UnboundedReceiver<DetectInput>) {
    let (mut pr, mut rx) = prober(true);
    for r in 1..=n {
        pr.add(r, addr(1 + r as u8));
    }
    pr.next_round();
    for r in 1..=n {
        reply(&mut pr, r, ProbeKind::ReplyKernel);
    }
    let (group, unicast) = pr.next_round();
    assert!(group && unicast.is_empty());
    assert!(misses(&mut rx).is_empty());
    (pr, rx)
}

#[test]
fn a_round_no_child_answers_is_not_judged_but_one_silent_child_is() {
    let (mut pr, mut rx) = grouped_children(8);
    let round = pr.round;
    // This node's receive path stalls: nobody's reply arrives for 5 periods.
    for k in 0..5 {
        let (group, unicast) = pr.next_round();
        assert!(group && unicast.len() == 8, "period {k}: the round is probed again, by unicast too");
        assert_eq!(pr.round, round, "the same round number");
    }
    assert!(misses(&mut rx).is_empty(), "nobody blamed for our own stall");
    assert_eq!(pr.void_rounds, 5);
    // Replies come again (late ones count for the round re-probed); rank 4 stays silent: it alone is judged.
    for _ in 0..4 {
        for r in (1..=8).filter(|r| *r != 4) {
            reply(&mut pr, r, ProbeKind::ReplyKernel);
        }
        pr.next_round();
    }
    assert_eq!(misses(&mut rx), vec![(4, 1), (4, 2), (4, 3), (4, 4)]);
    assert_eq!(pr.void_rounds, 5);
}

/// Several children silent at once (below the void rule's threshold) are excused, for at most
/// `MAX_EXCUSED` periods: nodes that died together are still lost, about a second later than one alone.
#[test]
fn children_silent_together_are_excused_for_at_most_a_second() {
    let n = VOID_MIN_CHILDREN as u32 - 1;
    let (mut pr, mut rx) = grouped_children(n);
    for _ in 0..3 {
        pr.next_round();
    }
    assert!(misses(&mut rx).is_empty(), "{n} children silent at once: nobody blamed yet");
    assert_eq!(pr.correlated_rounds, 3);
    for _ in 0..vigil_core::probe::MAX_EXCUSED {
        pr.next_round();
    }
    let m = misses(&mut rx);
    for r in 1..=n {
        assert!(m.iter().any(|&(x, k)| x == r && k >= 3), "rank {r} never missed 3 probes: {m:?}");
    }
    assert_eq!(pr.void_rounds, 0);
}

/// Two of five children late at once are excused; the one still silent once the other answers again is
/// judged, from where its count stood.
#[test]
fn a_child_still_silent_when_the_others_answer_is_judged() {
    let (mut pr, mut rx) = grouped_children(5);
    for _ in 0..4 {
        for r in [1, 2, 3] {
            reply(&mut pr, r, ProbeKind::ReplyKernel);
        }
        pr.next_round();
    }
    assert!(misses(&mut rx).is_empty(), "ranks 4 and 5 late together: excused");
    for _ in 0..3 {
        for r in [1, 2, 3, 5] {
            reply(&mut pr, r, ProbeKind::ReplyKernel);
        }
        pr.next_round();
    }
    let m = misses(&mut rx);
    assert!(m.iter().all(|(r, _)| *r == 4), "{m:?}");
    assert!(m.iter().any(|(_, k)| *k >= 3), "rank 4, silent alone, is judged: {m:?}");
}

#[test]
fn a_group_that_reaches_no_child_is_given_up_without_blaming_anyone() {
    let (mut pr, mut rx) = grouped_children(8);
    // The network stops delivering the multicast datagram to everyone: only unicast probes are answered.
    let mut worst = 0;
    for _ in 0..40 {
        let (_, unicast) = pr.next_round();
        let ids: Vec<u32> = unicast.iter().map(|(id, _)| *id).collect();
        for r in 1..=8 {
            if ids.contains(&pr.targets[&r].id) {
                reply(&mut pr, r, ProbeKind::ReplyKernel);
            }
        }
        worst = misses(&mut rx).iter().map(|(_, m)| *m).max().unwrap_or(0).max(worst);
    }
    assert!(pr.targets.values().all(|t| t.no_group && !t.grouped), "every child probed by unicast for good");
    assert!(worst <= 1, "never more than one miss in a row, got {worst}");
    // From then on every round is answered and judged.
    let v = pr.void_rounds;
    for _ in 0..5 {
        let (group, unicast) = pr.next_round();
        assert!(!group && unicast.len() == 8);
        for r in 1..=8 {
            reply(&mut pr, r, ProbeKind::ReplyKernel);
        }
    }
    assert_eq!(pr.void_rounds, v);
    assert!(misses(&mut rx).is_empty());
}

#[test]
fn stale_forged_and_foreign_replies_are_ignored() {
    let (mut pr, mut rx) = prober(true);
    pr.add(1, addr(2));
    pr.next_round();
    pr.next_round();
    let good = Probe {
        kind: ProbeKind::ReplyKernel,
        flags: vigil_ebpf::FLAG_ALIVE,
        seq: pr.round,
        rank: pr.targets[&1].id,
        sent_ns: vigil_ebpf::monotonic_ns() ^ pr.key,
        hb_age_ns: 0,
        answered: 1,
    };
    pr.reply(&Probe { sent_ns: 12345, ..good }, addr(2)); // not keyed with our secret
    pr.reply(&good, addr(9)); // from another address
    pr.reply(&Probe { seq: pr.round + 1, ..good }, addr(2)); // a round not sent yet
    pr.reply(&Probe { rank: pr.targets[&1].id ^ 0x55, ..good }, addr(2)); // an id we never gave
    assert_eq!(pr.targets[&1].answered, 0);
    // Each is dropped and counted (vigil_probe_replies_rejected_total), none as a reply.
    assert_eq!((pr.rejected, pr.replies), (4, 0));
    pr.reply(&good, addr(2));
    assert_eq!(pr.targets[&1].answered, pr.round);
    assert_eq!((pr.rejected, pr.replies), (4, 1));
    let _ = misses(&mut rx);
}
