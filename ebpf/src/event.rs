//! Exit events as seen by users of the detectors.

/// How a process ended, decoded from a wait(2)-style status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitStatus {
    /// Normal exit with this code (0..=255).
    Exited(i32),
    /// Killed by a signal.
    Signaled {
        /// Signal number (e.g. 9 for SIGKILL, 11 for SIGSEGV).
        signal: i32,
        /// A core dump was written.
        core_dumped: bool,
    },
    /// Exit observed but status not available (userspace backend watching a
    /// process that is not our child, or that someone else already reaped).
    Unknown,
}

impl ExitStatus {
    /// Decodes a raw wait status (`exit_code` as kept by the kernel:
    /// `(code & 0xff) << 8` for exits, `signo | 0x80 (core)` for signals).
    pub fn from_wait_status(raw: u32) -> Self {
        let sig = (raw & 0x7f) as i32;
        if sig == 0 {
            ExitStatus::Exited(((raw >> 8) & 0xff) as i32)
        } else {
            ExitStatus::Signaled { signal: sig, core_dumped: raw & 0x80 != 0 }
        }
    }

    /// Exit code, if the process exited normally.
    pub fn code(&self) -> Option<i32> {
        match *self {
            ExitStatus::Exited(c) => Some(c),
            _ => None,
        }
    }

    /// Terminating signal number, if the process was killed by a signal.
    pub fn signal(&self) -> Option<i32> {
        match *self {
            ExitStatus::Signaled { signal, .. } => Some(signal),
            _ => None,
        }
    }
}

/// Which mechanism produced an [`ExitEvent`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventSource {
    /// The `sched_process_exit` BPF program (timestamp taken in the exiting
    /// task, before its memory is torn down).
    Ebpf,
    /// The process had already exited when `watch()` was called; detected via
    /// its pidfd by the eBPF watcher.
    WatchRace,
    /// The pidfd userspace fallback (timestamp taken when userspace woke up).
    Pidfd,
}

/// One exited process (thread group).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExitEvent {
    /// Process id (tgid) in the initial pid namespace.
    pub pid: u32,
    /// Exit code or terminating signal.
    pub status: ExitStatus,
    /// Process (tgid) that generated the terminating signal, when known
    /// (eBPF only). For kernel-generated signals (`si_code > 0`, e.g. a
    /// SIGSEGV from a page fault) this is the task in whose context the
    /// kernel raised it, usually the victim itself.
    pub sender_pid: Option<u32>,
    /// `si_code` of the terminating signal (0 = `SI_USER`/kill(2),
    /// -6 = `SI_TKILL`, > 0 = kernel), when `sender_pid` is known.
    pub si_code: Option<i32>,
    /// The process was selected by the OOM killer (eBPF only).
    pub oom_killed: bool,
    /// Detection time, `CLOCK_MONOTONIC` ns (see [`EventSource`] for which
    /// instant it is).
    pub ktime_ns: u64,
    /// Command name (`comm`, max 15 bytes) of the exiting thread, eBPF only.
    pub comm: Option<String>,
    /// Mechanism that produced this event.
    pub source: EventSource,
}

/// Wire format of `struct vigil_exit_event` (bpf/events.h).
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct RawExitEvent {
    pub ktime_ns: u64,
    pub pid: u32,
    pub tid: u32,
    pub wait_status: u32,
    pub flags: u32,
    pub sender_pid: u32,
    pub si_code: i32,
    pub comm: [u8; 16],
}

const _: () = assert!(size_of::<RawExitEvent>() == 48);

pub(crate) const FLAG_OOM: u32 = 1 << 0;
pub(crate) const FLAG_HAS_SENDER: u32 = 1 << 1;

/// Reads a `#[repr(C)]` plain-old-data record from the start of `bytes`.
pub(crate) fn read_pod<T: Copy>(bytes: &[u8]) -> Option<T> {
    if bytes.len() < size_of::<T>() {
        return None;
    }
    // SAFETY: the length check above guarantees `size_of::<T>()` readable
    // bytes; `read_unaligned` has no alignment requirement, and the only `T`s
    // used are `#[repr(C)]` structs of integers/byte arrays for which every
    // bit pattern is valid.
    Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) })
}

pub(crate) fn comm_to_string(comm: &[u8]) -> String {
    let end = comm.iter().position(|&b| b == 0).unwrap_or(comm.len());
    String::from_utf8_lossy(&comm[..end]).into_owned()
}

impl From<RawExitEvent> for ExitEvent {
    fn from(r: RawExitEvent) -> Self {
        let has_sender = r.flags & FLAG_HAS_SENDER != 0;
        ExitEvent {
            pid: r.pid,
            status: ExitStatus::from_wait_status(r.wait_status),
            sender_pid: has_sender.then_some(r.sender_pid),
            si_code: has_sender.then_some(r.si_code),
            oom_killed: r.flags & FLAG_OOM != 0,
            ktime_ns: r.ktime_ns,
            comm: Some(comm_to_string(&r.comm)),
            source: EventSource::Ebpf,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_status() {
        assert_eq!(ExitStatus::from_wait_status(3 << 8), ExitStatus::Exited(3));
        assert_eq!(ExitStatus::from_wait_status(0), ExitStatus::Exited(0));
        assert_eq!(ExitStatus::from_wait_status(9), ExitStatus::Signaled { signal: 9, core_dumped: false });
        assert_eq!(ExitStatus::from_wait_status(11 | 0x80), ExitStatus::Signaled { signal: 11, core_dumped: true });
    }
}
