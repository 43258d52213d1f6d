//! Userspace fallback: one pidfd per watched process.

use std::{
    collections::HashMap,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
};

use tokio::{io::unix::AsyncFd, sync::mpsc, task::AbortHandle};

use crate::{
    error::EbpfError,
    event::{EventSource, ExitEvent},
    sys,
};

type Tasks = Arc<Mutex<HashMap<u32, AbortHandle>>>;

/// Userspace process-exit detector (no privileges needed).
///
/// `watch(pid)` opens a pidfd and spawns a small tokio task that waits for it
/// to become readable (the kernel signals this in `exit_notify()`, i.e. when
/// the process is a zombie, the same moment `waitpid()` could return). For
/// our own children the status is read with `waitid(P_PIDFD, WNOWAIT)`, which
/// does **not** reap: the owner can still `wait()`. Other processes get
/// [`ExitStatus::Unknown`](crate::ExitStatus::Unknown). Sender pid and OOM
/// flag are never available.
#[derive(Debug)]
pub struct PidfdWatcher {
    tasks: Tasks,
    tx: mpsc::UnboundedSender<ExitEvent>,
    rx: mpsc::UnboundedReceiver<ExitEvent>,
    handle: tokio::runtime::Handle,
}

impl PidfdWatcher {
    /// Creates the watcher; must be called within a tokio runtime.
    pub fn new() -> Result<PidfdWatcher, EbpfError> {
        let handle = tokio::runtime::Handle::try_current().map_err(|_| EbpfError::NoRuntime)?;
        let (tx, rx) = mpsc::unbounded_channel();
        Ok(PidfdWatcher { tasks: Arc::default(), tx, rx, handle })
    }

    /// Starts watching `pid` (a thread-group leader). Watching an already
    /// exited but unreaped process reports it immediately; an already reaped
    /// one fails with [`EbpfError::NoSuchProcess`]. Re-watching replaces the
    /// previous watch.
    pub fn watch(&self, pid: u32) -> Result<(), EbpfError> {
        let pidfd = sys::pidfd_open(pid).map_err(|source| EbpfError::NoSuchProcess { pid, source })?;
        let _enter = self.handle.enter();
        // SAFETY: `pidfd` is an `OwnedFd` moved into the `AsyncFd`, so the
        // descriptor stays open and unchanged until the `AsyncFd` drops it.
        let afd = unsafe { AsyncFd::register_with_interest(pidfd, tokio::io::Interest::READABLE) }
            .map_err(std::io::Error::from)?;
        let tx = self.tx.clone();
        let tasks = Arc::clone(&self.tasks);
        let mut map = self.tasks.lock().unwrap_or_else(|e| e.into_inner());
        let join = self.handle.spawn(async move {
            if afd.readable().await.is_err() {
                return;
            }
            let ktime_ns = sys::monotonic_ns();
            let status = sys::waitid_nowait(std::os::fd::AsFd::as_fd(afd.get_ref()));
            tasks.lock().unwrap_or_else(|e| e.into_inner()).remove(&pid);
            let _ = tx.send(ExitEvent {
                pid,
                status,
                sender_pid: None,
                si_code: None,
                oom_killed: false,
                ktime_ns,
                comm: None,
                source: EventSource::Pidfd,
            });
        });
        // The task cannot remove itself before we insert: it needs `tasks`,
        // whose lock we hold.
        if let Some(old) = map.insert(pid, join.abort_handle()) {
            old.abort();
        }
        Ok(())
    }

    /// Stops watching `pid`; not an error if it is not watched.
    pub fn unwatch(&self, pid: u32) -> Result<(), EbpfError> {
        if let Some(h) = self.tasks.lock().unwrap_or_else(|e| e.into_inner()).remove(&pid) {
            h.abort();
        }
        Ok(())
    }

    /// Number of pids currently watched.
    pub fn watched_count(&self) -> usize {
        self.tasks.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Waits for the next exit event (never `None` while `self` is alive).
    pub async fn next_event(&mut self) -> Option<ExitEvent> {
        self.rx.recv().await
    }

    /// Poll form of [`next_event`](Self::next_event).
    pub fn poll_next_event(&mut self, cx: &mut Context<'_>) -> Poll<Option<ExitEvent>> {
        self.rx.poll_recv(cx)
    }
}

impl Drop for PidfdWatcher {
    fn drop(&mut self) {
        for (_, h) in self.tasks.lock().unwrap_or_else(|e| e.into_inner()).drain() {
            h.abort();
        }
    }
}

impl futures_core::Stream for PidfdWatcher {
    type Item = ExitEvent;
    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<ExitEvent>> {
        self.get_mut().poll_next_event(cx)
    }
}
