//! Backend selection: eBPF when possible, pidfd otherwise.

use std::{
    pin::Pin,
    sync::Once,
    task::{Context, Poll},
};

use crate::{EventChannel, ExitEvent, ExitWatcher, PidfdWatcher, error::EbpfError, sys};

/// Common interface of the exit detectors.
pub trait ExitDetector: Send {
    /// Starts watching a process (tgid).
    fn watch(&self, pid: u32) -> Result<(), EbpfError>;
    /// Stops watching a process; not an error if it is not watched.
    fn unwatch(&self, pid: u32) -> Result<(), EbpfError>;
    /// Polls for the next exit event.
    fn poll_next_event(&mut self, cx: &mut Context<'_>) -> Poll<Option<ExitEvent>>;
    /// Which backend this is.
    fn backend(&self) -> Backend;
}

impl ExitDetector for ExitWatcher {
    fn watch(&self, pid: u32) -> Result<(), EbpfError> {
        ExitWatcher::watch(self, pid)
    }
    fn unwatch(&self, pid: u32) -> Result<(), EbpfError> {
        ExitWatcher::unwatch(self, pid)
    }
    fn poll_next_event(&mut self, cx: &mut Context<'_>) -> Poll<Option<ExitEvent>> {
        ExitWatcher::poll_next_event(self, cx)
    }
    fn backend(&self) -> Backend {
        Backend::Ebpf
    }
}

impl ExitDetector for PidfdWatcher {
    fn watch(&self, pid: u32) -> Result<(), EbpfError> {
        PidfdWatcher::watch(self, pid)
    }
    fn unwatch(&self, pid: u32) -> Result<(), EbpfError> {
        PidfdWatcher::unwatch(self, pid)
    }
    fn poll_next_event(&mut self, cx: &mut Context<'_>) -> Poll<Option<ExitEvent>> {
        PidfdWatcher::poll_next_event(self, cx)
    }
    fn backend(&self) -> Backend {
        Backend::Userspace
    }
}

/// Kind of backend in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// [`ExitWatcher`] (BPF tracepoints).
    Ebpf,
    /// [`PidfdWatcher`] (pidfd + waitid).
    Userspace,
}

/// How [`Detector::with_mode`] chooses its backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DetectorMode {
    /// eBPF if root and the programs load, otherwise userspace.
    #[default]
    Auto,
    /// Always the userspace fallback (testing, or distrust of BPF).
    ForceUserspace,
    /// eBPF or an error (no fallback).
    RequireEbpf,
}

/// Environment variable read by [`DetectorMode::from_env`]:
/// `userspace` | `ebpf` | `auto` (default).
pub const DETECTOR_ENV: &str = "VIGIL_EXIT_DETECTOR";

impl DetectorMode {
    /// Mode from `$VIGIL_EXIT_DETECTOR` (`userspace`, `ebpf`, anything else = auto).
    pub fn from_env() -> DetectorMode {
        match std::env::var(DETECTOR_ENV).as_deref() {
            Ok("userspace") | Ok("pidfd") => DetectorMode::ForceUserspace,
            Ok("ebpf") => DetectorMode::RequireEbpf,
            _ => DetectorMode::Auto,
        }
    }
}

/// Exit detector with automatic backend choice.
#[derive(Debug)]
pub enum Detector {
    /// eBPF backend.
    Ebpf(Box<ExitWatcher>),
    /// Userspace fallback and the reason it was chosen.
    Userspace {
        /// The watcher.
        watcher: PidfdWatcher,
        /// e.g. `userspace (no root)`, `userspace (BPF load failed: ...)`.
        reason: String,
    },
}

static REPORT_ONCE: Once = Once::new();

impl Detector {
    /// Detector in the mode given by `$VIGIL_EXIT_DETECTOR` (default auto).
    pub fn new() -> Result<Detector, EbpfError> {
        Self::with_mode(DetectorMode::from_env())
    }

    /// Detector in an explicit mode. Errors only for
    /// [`DetectorMode::RequireEbpf`] or when called outside a tokio runtime.
    /// The choice (and fallback reason) is logged at most once per process.
    pub fn with_mode(mode: DetectorMode) -> Result<Detector, EbpfError> {
        let det = Self::choose(mode)?;
        let desc = det.description().to_owned();
        REPORT_ONCE.call_once(|| match &det {
            Detector::Ebpf(_) => log::info!("vigil exit detector: {desc}"),
            Detector::Userspace { .. } => log::warn!("vigil exit detector: {desc}"),
        });
        Ok(det)
    }

    /// Like [`with_mode`](Self::with_mode) without logging the choice (for callers that report it themselves).
    pub fn choose(mode: DetectorMode) -> Result<Detector, EbpfError> {
        Self::choose_with(mode, EventChannel::RingBuffer)
    }

    /// Like [`choose`](Self::choose), loading the eBPF variant that hands events over through `channel` (the
    /// choice of [`plan`](crate::plan) for the running kernel).
    pub fn choose_with(mode: DetectorMode, channel: EventChannel) -> Result<Detector, EbpfError> {
        let det = match mode {
            DetectorMode::RequireEbpf => Detector::Ebpf(Box::new(ExitWatcher::with_channel(channel)?)),
            DetectorMode::ForceUserspace => {
                Detector::Userspace { watcher: PidfdWatcher::new()?, reason: "userspace (forced)".to_owned() }
            }
            DetectorMode::Auto => {
                let euid = sys::euid();
                if euid != 0 {
                    Detector::Userspace { watcher: PidfdWatcher::new()?, reason: "userspace (no root)".to_owned() }
                } else {
                    match ExitWatcher::with_channel(channel) {
                        Ok(w) => Detector::Ebpf(Box::new(w)),
                        Err(EbpfError::NoRuntime) => return Err(EbpfError::NoRuntime),
                        Err(e) => {
                            log::debug!("vigil exit detector: {e}");
                            Detector::Userspace {
                                watcher: PidfdWatcher::new()?,
                                reason: format!("userspace (BPF load failed: {})", e.summary()),
                            }
                        }
                    }
                }
            }
        };
        Ok(det)
    }

    /// Human-readable backend description: `ebpf` or the userspace reason.
    pub fn description(&self) -> &str {
        match self {
            Detector::Ebpf(_) => "ebpf",
            Detector::Userspace { reason, .. } => reason,
        }
    }

    /// Backend kind.
    pub fn backend(&self) -> Backend {
        match self {
            Detector::Ebpf(_) => Backend::Ebpf,
            Detector::Userspace { .. } => Backend::Userspace,
        }
    }

    /// Starts watching a process (tgid). See [`ExitWatcher::watch`].
    pub fn watch(&self, pid: u32) -> Result<(), EbpfError> {
        match self {
            Detector::Ebpf(w) => w.watch(pid),
            Detector::Userspace { watcher, .. } => watcher.watch(pid),
        }
    }

    /// Stops watching a process.
    pub fn unwatch(&self, pid: u32) -> Result<(), EbpfError> {
        match self {
            Detector::Ebpf(w) => w.unwatch(pid),
            Detector::Userspace { watcher, .. } => watcher.unwatch(pid),
        }
    }

    /// Waits for the next exit event.
    pub async fn next_event(&mut self) -> Option<ExitEvent> {
        std::future::poll_fn(|cx| self.poll_next_event(cx)).await
    }

    /// Poll form of [`next_event`](Self::next_event).
    pub fn poll_next_event(&mut self, cx: &mut Context<'_>) -> Poll<Option<ExitEvent>> {
        match self {
            Detector::Ebpf(w) => w.poll_next_event(cx),
            Detector::Userspace { watcher, .. } => watcher.poll_next_event(cx),
        }
    }
}

impl ExitDetector for Detector {
    fn watch(&self, pid: u32) -> Result<(), EbpfError> {
        Detector::watch(self, pid)
    }
    fn unwatch(&self, pid: u32) -> Result<(), EbpfError> {
        Detector::unwatch(self, pid)
    }
    fn poll_next_event(&mut self, cx: &mut Context<'_>) -> Poll<Option<ExitEvent>> {
        Detector::poll_next_event(self, cx)
    }
    fn backend(&self) -> Backend {
        Detector::backend(self)
    }
}

impl futures_core::Stream for Detector {
    type Item = ExitEvent;
    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<ExitEvent>> {
        self.get_mut().poll_next_event(cx)
    }
}
