//! The `detect` service, on every rank: process-exit watches answered by the detectors (eBPF exit tracepoint
//! or pidfd).

use super::*;
use crate::broker::core::Effect;

/// Topics of the `detect` service: and their handlers (who may call each: `broker/access.rs`).
pub(super) const TOPICS: &[Topic] = &[Topic { name: "detect.watch", handler: watch }];

/// A `detect.watch` request: answer when a process of this node exits.
#[derive(Debug, Deserialize)]
struct WatchRequest {
    /// The process id, above 1. Any JSON here: anything but a process id is refused with EINVAL, as a process
    /// that cannot be watched (not EPROTO, as a malformed request).
    pid: Value,
}

/// `detect.watch`.
fn watch(core: &mut Broker, msg: &Message, lazy: &Body<'_>) -> Reply {
    let req: WatchRequest = lazy.decode()?;
    // Answered once, when the process exits (before its memory is torn down with eBPF).
    let pid = req
        .pid
        .as_u64()
        .and_then(|p| u32::try_from(p).ok())
        .filter(|p| *p > 1)
        .ok_or(ServiceError::einval("pid must be a process id"))?;
    let held = core.exit_waiters.values().flatten().filter(|m| m.route == msg.route).count();
    check_waiting(held, "process-exit watches")?;
    // Everyone waiting for the same process hears of its exit.
    let fresh = !core.exit_waiters.contains_key(&pid);
    core.exit_waiters.entry(pid).or_default().push(msg.clone());
    if fresh {
        core.effect(Effect::WatchPid(pid));
    }
    Ok(None)
}
