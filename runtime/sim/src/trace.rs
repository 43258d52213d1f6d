//! The simulator's trace and debugging output: every input handled is folded into one hash ([`crate::Report::trace`]:
//! the same seed gives the same trace), and ranks listed in `VIGIL_SIM_WATCH` have their inputs, effects and faults
//! written to stderr. The event loop that calls these is in `lib.rs`.

use crate::broker::core::{Effect, Input, Peer};
use crate::message::Message;

pub(crate) fn fnv(h: u64, x: u64) -> u64 {
    let mut h = h;
    for b in x.to_le_bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}

/// A small number saying what kind of input this is (for the trace).
pub(crate) fn kind(i: &Input) -> u64 {
    match i {
        Input::Start => 1,
        Input::ParentUp(_) => 2,
        Input::ParentFailed(_) => 19,
        Input::FirstParentFailed(_) => 25,
        Input::ParentRefused { full, .. } => 23 + u64::from(*full) * 256,
        Input::Message(p, _, m) => 3 + (m.msgtype as u64) * 16 + peer_code(*p) * 256 + u64::from(m.matchtag) * 4096,
        Input::Closed(p, ..) => 4 + peer_code(*p) * 256,
        Input::Bounced(..) => 5,
        Input::Hello { conn, .. } => 6 + conn * 256,
        Input::LocalNew { .. } => 7,
        Input::ShellStarted { id, .. } => 8 + id.0 * 256,
        Input::ShellDone { id, .. } => 9 + id.0 * 256,
        Input::CgroupEmptied(id) => 26 + id.0 * 256,
        Input::InitialExit(_) => 10,
        Input::Signal(_) => 11,
        Input::AckSamples(v) => 12 + v.len() as u64 * 256 + v.iter().map(|x| u64::from(x.1)).sum::<u64>(),
        Input::Probe(r, _) => 13 + u64::from(*r) * 256,
        Input::ProcessExit(..) => 14,
        Input::WatchFailed(..) => 15,
        Input::DetectorsFailed(_) => 16,
        Input::Status(_) => 17,
        Input::Timer => 18,
        Input::Stored { result, .. } => 20 + u64::from(result.is_err()) * 256,
        Input::Synced { result, .. } => 21 + u64::from(result.is_err()) * 256,
        Input::NodeChecked { token, answered } => 22 + u64::from(*answered == Some(true)) * 256 + token * 1024,
        Input::EnclosingLost { ranks, .. } => 24 + ranks.len() as u64 * 256,
    }
}

fn peer_code(p: Peer) -> u64 {
    match p {
        Peer::Parent => 0,
        Peer::Child(r) => 1 + u64::from(r),
        Peer::Local(id) => 1 << 33 | u64::from(id),
    }
}

/// Whether rank `n` is watched: listed in `VIGIL_SIM_WATCH` (comma-separated ranks), whose inputs, effects and
/// faults are then written to stderr with the virtual time (a debugging aid; the trace does not change).
pub(crate) fn watched(n: u32) -> bool {
    static WATCH: std::sync::OnceLock<Vec<u32>> = std::sync::OnceLock::new();
    WATCH
        .get_or_init(|| {
            std::env::var("VIGIL_SIM_WATCH")
                .map(|v| v.split(',').filter_map(|r| r.trim().parse().ok()).collect())
                .unwrap_or_default()
        })
        .contains(&n)
}

/// Effects not worth a line: heartbeats.
pub(crate) fn quiet(e: &Effect) -> bool {
    match e {
        Effect::Heartbeat | Effect::SampleAcks | Effect::Beat => true,
        Effect::Send(_, m) => m.topic == "hb",
        _ => false,
    }
}

/// A message in one line: its type, topic and the start of its payload.
fn describe_msg(m: &Message) -> String {
    let body: String = String::from_utf8_lossy(&m.payload).chars().take(200).collect();
    format!("{:?} {} {body}", m.msgtype, m.topic)
}

/// An input in one line (for [`watched`] ranks).
pub(crate) fn describe_input(i: &Input) -> String {
    match i {
        Input::Message(p, c, m) => format!("msg from {p:?} conn {c}: {}", describe_msg(m)),
        Input::Hello { conn, msg, .. } => format!("hello conn {conn}: {}", describe_msg(msg)),
        Input::Closed(p, c, why) => format!("closed {p:?} conn {c}: {why}"),
        Input::ParentFailed(why) => format!("parent failed: {why}"),
        Input::ParentRefused { why, full } => format!("parent refused (full: {full}): {why}"),
        Input::ParentUp(_) => "parent up".into(),
        Input::Probe(r, s) => format!("probe {r}: {s:?}"),
        Input::Timer => "timer".into(),
        other => format!("input kind {}", kind(other)),
    }
}

/// An effect in one line (for [`watched`] ranks).
pub(crate) fn describe_effect(e: &Effect) -> String {
    match e {
        Effect::Send(p, m) => format!("send to {p:?}: {}", describe_msg(m)),
        other => {
            let s = format!("{other:?}");
            s.chars().take(200).collect()
        }
    }
}
