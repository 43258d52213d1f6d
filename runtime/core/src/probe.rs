//! The prober's miss rule: when a period without news from a child's kernel counts as missed.
//!
//! A parent probes each child's node every `tbon.probe_period` (10 ms), and `tbon.probe_misses` (3) misses in a
//! row make the node lost ([`crate::membership`]). On a quiet network a node's kernel answers in microseconds, so
//! news from it (a reply to a newer probe than any before) comes every period, and a period without news is a
//! miss: a silent node is lost 30-40 ms after it died. On a congested or long link (queues, a 50 ms ± 50 ms path,
//! lost datagrams) replies arrive late and out of order, and news comes at irregular intervals, up to the longest
//! round trip apart; counting every period without news as a miss would declare live nodes lost. So the prober
//! times every reply it reads, as TCP times its round trips (Jacobson's estimator, RFC 6298), and a period counts
//! as missed only once the silence since the last news is longer than that child's reply time: `srtt + 4 ×
//! rttvar`, or 1.5 times its longest recent reply ([`ReplyTiming::patience`] periods), and only once the child has
//! answered [`ARM_REPLIES`] times. (Every reply is timed, not only those that bring news: on a link that reorders,
//! those are the fast ones.) A dead node is then lost after `probe_misses` misses past its patience: 30-40 ms on a
//! quiet link as before, about 1.5 times the link's longest recent round trip more on a jittery one. When links
//! slow down faster than that is learned, several children fall silent at once: such periods of **correlated
//! silence** blame nobody ([`correlated_silence`]). Both the driver's prober (`vigil-driver`,
//! `broker/detect/prober.rs`) and the simulator's use these rules.

use serde::{Deserialize, Serialize};

/// The most periods a probe may wait before it counts as missed (a child whose replies take longer is judged
/// as if they took this long): 100 periods, 1 s at the default period.
pub const MAX_PATIENCE: u32 = 100;

/// Replies a child must have given before its misses count ([`ReplyTiming::armed`]): a few say little of how long
/// the next may take on a congested link (TCP starts with a 1 s timeout for the same reason). 8 take 80 ms on a
/// quiet link; a node that dies before is judged by the other rules. (Every reply is timed, not only those that
/// bring news, and the longest recent one counts: a few replies do not underestimate a jittery link much.)
pub const ARM_REPLIES: u32 = 8;

/// How long a child's kernel takes to answer a probe, from every reply the prober reads (seconds).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ReplyTiming {
    /// Smoothed round trip; `None` until the first reply.
    srtt: Option<f64>,
    /// Its mean deviation.
    rttvar: f64,
    /// Replies timed (saturating).
    replies: u32,
    /// The longest recent reply (seconds), decaying by [`MAX_DECAY`] per reply: the smoothed estimate alone
    /// follows the common case and misses the tail, which is what bounds the silence between two news.
    max_recent: f64,
}

/// Per reply, the longest recent one decays by this factor (half-life about 70 replies, 0.7 s on a quiet link).
pub const MAX_DECAY: f64 = 0.99;

impl ReplyTiming {
    /// A reply was read `rtt` seconds after its probe was sent (a prober that reads replies once a period sees
    /// about one period on a quiet link). Negative or non-finite samples are ignored.
    pub fn sample(&mut self, rtt: f64) {
        if !rtt.is_finite() || rtt < 0.0 {
            return;
        }
        self.replies = self.replies.saturating_add(1);
        self.max_recent = (self.max_recent * MAX_DECAY).max(rtt);
        match self.srtt {
            None => {
                self.srtt = Some(rtt);
                self.rttvar = rtt / 2.0;
            }
            Some(s) => {
                self.rttvar = 0.75 * self.rttvar + 0.25 * (s - rtt).abs();
                self.srtt = Some(0.875 * s + 0.125 * rtt);
            }
        }
    }

    /// Whether the child has answered [`ARM_REPLIES`] times: only then do its misses count.
    pub fn armed(&self) -> bool {
        self.replies >= ARM_REPLIES
    }

    /// How long a reply may take, seconds: `srtt + 4 × rttvar`, or 1.5 times the longest recent reply if more
    /// (0 before any reply).
    pub fn reply_time(&self) -> f64 {
        self.srtt.map_or(0.0, |s| (s + 4.0 * self.rttvar).max(1.5 * self.max_recent))
    }

    /// How many periods of `period` seconds without news are not yet a miss: [`ReplyTiming::reply_time`] in
    /// whole periods (rounded down: replies read once a period take about one), at least 1 and at most
    /// [`MAX_PATIENCE`].
    pub fn patience(&self, period: f64) -> u32 {
        if period <= 0.0 || !period.is_finite() {
            return 1;
        }
        let p = (self.reply_time() / period).floor();
        if p.is_finite() {
            (p as u32).clamp(1, MAX_PATIENCE)
        } else {
            MAX_PATIENCE
        }
    }
}

/// The timing a target is judged by: its own once armed, else its prober's timing of every target (`all`),
/// so that a child that joins or a new parent after a re-parent is judged at once at this network's pace.
pub fn judged_by<'a>(own: &'a ReplyTiming, all: &'a ReplyTiming) -> &'a ReplyTiming {
    if own.armed() {
        own
    } else {
        all
    }
}

/// How many periods without news a target is allowed ([`ReplyTiming::patience`]): the longer of its own and of
/// its prober's timing of every target (`all`) once its own is armed, else the prober's. Links that start to
/// queue do so for many children at once; the prober's timing of all of them learns the new pace from the first
/// late replies of any, several times faster than one child's timing does from its own, so a child is not judged
/// by the quiet past of its own link while the others' replies already show the wait. The price: on a parent
/// with one slow child, the others wait as long as that child's replies take.
pub fn patience_of(own: &ReplyTiming, all: &ReplyTiming, period: f64) -> u32 {
    if own.armed() {
        own.patience(period).max(all.patience(period))
    } else {
        all.patience(period)
    }
}

/// Periods missed when `silent` periods in a row brought no news and `patience` periods without news are not
/// yet a miss: `silent - patience + 1`, or 0.
pub fn missed(outstanding: u32, patience: u32) -> u32 {
    (outstanding + 1).saturating_sub(patience.max(1))
}

/// Fewest children past their reply time in one period that make it a period of correlated silence
/// ([`correlated_silence`]).
pub const CORRELATED_MIN: usize = 2;

/// Most periods of one child's silence excused as correlated ([`correlated_silence`]): [`MAX_PATIENCE`], 1 s at
/// the default period. A silence longer than that counts in full, whatever the other children do, so nodes that
/// really died together are still lost, about a second later than one alone.
pub const MAX_EXCUSED: u32 = MAX_PATIENCE;

/// Whether a period is one of **correlated silence**: `silent` of the `judged` children (those whose misses
/// count) are past their reply time at once, at least [`CORRELATED_MIN`] of them and at least an eighth.
///
/// A reply time is learned from the replies of the recent past; when a link's queues start to fill (an
/// application's all-to-all phase, a congested switch, this node's receive path falling behind) every child
/// behind it answers later than it ever did, at once, and a silence that the old reply time calls a miss is only a
/// late reply (seen on the test bed: 50 ms ± 50 ms links switched on under a running instance made rank 0 declare
/// all five children lost within 30 ms). Nodes rarely die in the same few periods; links and parents often slow
/// down together. So no child is blamed for such a period: each child past its reply time is excused it (its
/// count of misses does not grow, [`missed_excused`]), while the late replies come in and teach the prober the
/// links' new pace. A child alone in its silence is judged as before. Excused periods are counted in
/// `vigil overlay status`. Both the driver's prober and the simulator's apply this rule.
pub fn correlated_silence(silent: usize, judged: usize) -> bool {
    silent >= CORRELATED_MIN && silent * 8 >= judged
}

/// [`missed`], less the `excused` periods of this silence ([`correlated_silence`]).
pub fn missed_excused(outstanding: u32, excused: u32, patience: u32) -> u32 {
    missed(outstanding.saturating_sub(excused), patience)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn children_silent_together_are_excused_and_one_alone_is_not() {
        // One of five past its reply time: judged. Two of five, or 4 of 32: correlated. 3 of 32: judged.
        assert!(!correlated_silence(1, 5));
        assert!(correlated_silence(2, 5));
        assert!(correlated_silence(4, 32));
        assert!(!correlated_silence(3, 32));
        assert!(!correlated_silence(1, 1), "a lone child is always judged");
        // A child 5 periods silent with patience 2 has missed 4; with 3 of those periods excused, 1.
        assert_eq!(missed_excused(5, 0, 2), 4);
        assert_eq!(missed_excused(5, 3, 2), 1);
        assert_eq!(missed_excused(5, 9, 2), 0, "never below zero");
    }

    const P: f64 = 0.01;

    #[test]
    fn on_a_quiet_link_a_probe_unanswered_for_a_period_is_missed() {
        let mut t = ReplyTiming::default();
        assert_eq!(t.patience(P), 1, "before any reply: as before this rule");
        for k in 0..50 {
            assert_eq!(t.armed(), k >= ARM_REPLIES, "after {k} replies");
            t.sample(P); // replies read at the next period's start
        }
        assert_eq!(t.patience(P), 1);
        assert_eq!((missed(0, 1), missed(1, 1), missed(3, 1)), (0, 1, 3));
    }

    #[test]
    fn on_a_jittery_link_probes_wait_for_the_usual_reply_time() {
        // 50 ms ± 50 ms each way: round trips of 100 ms ± 100 ms, seeded.
        let mut t = ReplyTiming::default();
        let mut seed = 11u64;
        let mut worst: f64 = 0.0;
        for _ in 0..10_000 {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let u = |s: u64| (s >> 11) as f64 / (1u64 << 53) as f64;
            let rtt = 0.1 * u(seed) + 0.1 * u(seed.rotate_left(17));
            worst = worst.max(rtt);
            t.sample(rtt);
        }
        let patience = t.patience(P);
        // Long enough that no delayed reply is a miss (and a 3-probe verdict waits for more than the worst reply).
        assert!(f64::from(patience) * P >= 0.15, "patience {patience} periods");
        assert!(patience < MAX_PATIENCE);
        assert_eq!(missed(patience - 1, patience), 0);
        assert_eq!(missed(patience + 2, patience), 3);
    }

    #[test]
    fn bad_samples_and_periods_are_harmless() {
        let mut t = ReplyTiming::default();
        t.sample(f64::NAN);
        t.sample(-1.0);
        assert_eq!(t.reply_time(), 0.0);
        t.sample(1e300);
        assert_eq!(t.patience(P), MAX_PATIENCE);
        assert_eq!(t.patience(0.0), 1);
        assert_eq!(t.patience(f64::NAN), 1);
        assert_eq!(missed(0, 0), 0);
    }
}
