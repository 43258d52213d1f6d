//! Failure detectors for the Vigil resource manager.
//!
//! * [`ExitWatcher`]: eBPF process-exit detector (tracepoints
//!   `sched/sched_process_exit`, `signal/signal_generate`, `oom/mark_victim`)
//!   reporting one [`ExitEvent`] per exiting watched process through a BPF
//!   ring buffer polled with tokio's [`AsyncFd`](tokio::io::unix::AsyncFd).
//! * [`PidfdWatcher`]: userspace fallback built on `pidfd_open(2)` +
//!   `waitid(P_PIDFD, WNOWAIT)`, same API, less information (no sender, no
//!   OOM flag, no status for non-children).
//! * [`Detector`]: picks the eBPF backend when possible and falls back to the
//!   userspace one with a human-readable reason, logged once per process.
//! * [`TcpWatcher`]: eBPF TCP connection watcher (reset / close / retransmit)
//!   for a set of IPv4 4-tuples.
//! * [`XdpResponder`]: XDP heartbeat responder answering a parent's [`Probe`]s
//!   in the kernel with each registered broker's liveness and heartbeat age;
//!   [`UserspaceResponder`] is its fallback.
//!
//! * [`KernelFeatures`] and [`plan`]: what the running kernel offers (probed at load, or a recording named by
//!   `$VIGIL_KERNEL_FEATURES`) and the pure rule that picks each detector's variant from it, `ebpf (variant)`
//!   or `userspace (needs kernel >= X: why)`, so a program the kernel cannot load is not tried (`choice.rs`
//!   lists what each BPF object needs; docs/failure-detection.md has the table per kernel).
//!
//! All timestamps are `CLOCK_MONOTONIC` nanoseconds (the clock of
//! `bpf_ktime_get_ns()`); compare them with [`monotonic_ns`].
//!
//! Every type here must be created from inside a tokio runtime (they register
//! file descriptors with its reactor). The eBPF backends need root (or
//! `CAP_BPF` + `CAP_PERFMON`) and mount tracefs on `/sys/kernel/tracing` if it
//! is not mounted.

#![warn(missing_docs)]

mod choice;
mod detector;
mod ebpf_exit;
mod error;
mod event;
mod features;
mod hub;
mod pidfd;
mod probe;
mod replies;
mod ring;
mod sys;
mod tcp;
mod xdp;

pub use choice::{Choice, DetectorPlan, EventChannel, plan, process_exit_choice, responder_choice, tcp_choice};
pub use detector::{Backend, DETECTOR_ENV, Detector, DetectorMode, ExitDetector};
pub use ebpf_exit::ExitWatcher;
pub use error::{EbpfError, verifier_error_line};
pub use event::{EventSource, ExitEvent, ExitStatus};
pub use features::{FEATURES_ENV, KernelFeatures, TRACEPOINTS};
pub use hub::HubRedirect;
pub use pidfd::PidfdWatcher;
pub use probe::{FLAG_ALIVE, FLAG_UNKNOWN, HeartbeatClock, PROBE_LEN, Probe, ProbeKind, UserspaceResponder};
pub use replies::{ReplyArea, SLOT_BLOCK, SLOTS};
pub use ring::with_kernel_btf;
pub use sys::{interface_for_addr, interface_ipv4, monotonic_ns};
pub use tcp::{TcpEvent, TcpEventKind, TcpTuple, TcpWatcher};
pub use xdp::{HbState, HbTable, LINK_PREFIX, Release, TABLE_PREFIX, XdpAttach, XdpResponder, sweep_stale_pins};
