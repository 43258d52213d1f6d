//! eBPF process-exit watcher.

use std::{
    os::fd::AsFd,
    pin::Pin,
    sync::Mutex,
    task::{Context, Poll},
};

use aya::{
    Ebpf,
    maps::{HashMap, MapData, MapError},
};
use tokio::sync::mpsc;

use crate::{
    EventChannel,
    error::{EbpfError, map_err},
    event::{EventSource, ExitEvent, RawExitEvent},
    ring, sys,
};

static EXIT_OBJ: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/exit.bpf.o"));
/// The same programs with a perf buffer instead of the ring buffer (`bpf/output.h`).
static EXIT_PERFBUF_OBJ: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/exit-perfbuf.bpf.o"));

/// eBPF process-exit detector.
///
/// Loads `bpf/exit.bpf.c` and attaches it to `sched/sched_process_exit`,
/// `signal/signal_generate` and `oom/mark_victim`. Only processes passed to
/// [`watch`](Self::watch) are reported, each exactly once per `watch` (the
/// BPF program drops the pid from the watch map when it reports it, so a
/// recycled pid is never reported by accident).
///
/// The event timestamp is taken in the exiting task inside `do_exit()`,
/// before its address space is torn down, so it precedes the instant
/// `waitpid()` can return by the time needed to free the process memory.
///
/// Events are consumed with [`next_event`](Self::next_event) or via the
/// [`futures_core::Stream`] impl.
pub struct ExitWatcher {
    watched: Mutex<HashMap<MapData, u32, u8>>,
    events: ring::Events,
    raced_tx: mpsc::UnboundedSender<ExitEvent>,
    raced_rx: mpsc::UnboundedReceiver<ExitEvent>,
    // The tracepoint links, pinned: dropping removes the pins, and the kernel detaches in the background.
    _links: ring::LinkPins,
    // Owns the programs (and their links where they could not be pinned; dropping detaches those).
    _bpf: Ebpf,
}

impl std::fmt::Debug for ExitWatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExitWatcher").finish_non_exhaustive()
    }
}

impl ExitWatcher {
    /// Loads and attaches the BPF programs (the ring buffer variant). Needs root and a tokio runtime;
    /// mounts tracefs on `/sys/kernel/tracing` if needed.
    pub fn new() -> Result<ExitWatcher, EbpfError> {
        Self::with_channel(EventChannel::RingBuffer)
    }

    /// Like [`new`](Self::new), with the variant of the programs that hands events over through `channel`
    /// (the perf buffer one for kernels without the BPF ring buffer, see [`plan`](crate::plan)).
    pub fn with_channel(channel: EventChannel) -> Result<ExitWatcher, EbpfError> {
        let object = match channel {
            EventChannel::RingBuffer => EXIT_OBJ,
            EventChannel::PerfBuffer => EXIT_PERFBUF_OBJ,
        };
        let mut bpf = ring::load(object)?;
        let mut pins = ring::LinkPins::default();
        // Attach signal/OOM first so no fatal signal is missed between attaches.
        ring::attach_tracepoint(&mut bpf, &mut pins, "vigil_signal_generate", "signal", "signal_generate")?;
        ring::attach_tracepoint(&mut bpf, &mut pins, "vigil_mark_victim", "oom", "mark_victim")?;
        ring::attach_tracepoint(&mut bpf, &mut pins, "vigil_process_exit", "sched", "sched_process_exit")?;
        let watched_map = bpf.take_map("WATCHED").ok_or(EbpfError::Missing("WATCHED"))?;
        let watched = HashMap::try_from(watched_map).map_err(map_err("WATCHED"))?;
        let events = ring::take_events(&mut bpf, "EXIT_EVENTS", channel)?;
        let (raced_tx, raced_rx) = mpsc::unbounded_channel();
        Ok(ExitWatcher { watched: Mutex::new(watched), events, raced_tx, raced_rx, _links: pins, _bpf: bpf })
    }

    /// Starts watching process `pid` (a tgid, initial pid namespace).
    ///
    /// If the process already exited (zombie) before this call, an event with
    /// [`EventSource::WatchRace`] is queued instead (status known only for
    /// our own children). Fails with [`EbpfError::NoSuchProcess`] if the pid
    /// is gone (already reaped) or is not a thread-group leader.
    pub fn watch(&self, pid: u32) -> Result<(), EbpfError> {
        let pidfd = sys::pidfd_open(pid).map_err(|source| EbpfError::NoSuchProcess { pid, source })?;
        self.map().insert(pid, 1, 0).map_err(map_err("WATCHED"))?;
        if sys::pidfd_exited(pidfd.as_fd())? {
            // It may have exited before the insert (BPF never saw it) or after
            // (BPF reported it and deleted the key). Deleting the key is the
            // same atomic claim the BPF program makes: whoever deletes reports.
            if self.map().remove(&pid).is_ok() {
                let ev = ExitEvent {
                    pid,
                    status: sys::waitid_nowait(pidfd.as_fd()),
                    sender_pid: None,
                    si_code: None,
                    oom_killed: false,
                    ktime_ns: sys::monotonic_ns(),
                    comm: None,
                    source: EventSource::WatchRace,
                };
                let _ = self.raced_tx.send(ev);
            }
        }
        Ok(())
    }

    /// Stops watching `pid`. Not an error if it is not watched (or already
    /// reported).
    pub fn unwatch(&self, pid: u32) -> Result<(), EbpfError> {
        match self.map().remove(&pid) {
            Ok(()) | Err(MapError::KeyNotFound) => Ok(()),
            Err(e) => Err(map_err("WATCHED")(e)),
        }
    }

    /// Number of pids currently watched (walks the BPF map).
    pub fn watched_count(&self) -> usize {
        self.map().keys().filter(Result::is_ok).count()
    }

    /// Waits for the next exit event. `None` only if the ring buffer fd
    /// could not be polled any more.
    pub async fn next_event(&mut self) -> Option<ExitEvent> {
        std::future::poll_fn(|cx| self.poll_next_event(cx)).await
    }

    /// Poll form of [`next_event`](Self::next_event).
    pub fn poll_next_event(&mut self, cx: &mut Context<'_>) -> Poll<Option<ExitEvent>> {
        if let Poll::Ready(Some(ev)) = self.raced_rx.poll_recv(cx) {
            return Poll::Ready(Some(ev));
        }
        ring::poll_events::<RawExitEvent>(&mut self.events, cx).map(|r| r.map(ExitEvent::from))
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<MapData, u32, u8>> {
        self.watched.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl futures_core::Stream for ExitWatcher {
    type Item = ExitEvent;
    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<ExitEvent>> {
        self.get_mut().poll_next_event(cx)
    }
}
