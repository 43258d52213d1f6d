//! # Vigil's broker driver
//!
//! The tokio loop that does a broker's I/O around the sans-IO rules of `vigil-core`: it owns every socket,
//! process, detector and clock, feeds the broker's state machine its inputs (a message on a link, a link up or
//! down, a timer, a detector signal, a shell's exit...) with the time, and carries out the effects it hands back
//! (send, spawn or signal a shell, write the store, exit). See `docs/architecture.md`, "Crates".
//!
//! What is here: [`broker`] (the loop in `driver.rs`, its effects in `effects.rs`; the overlay links behind one
//! seam, [`broker::transport`], with TCP, in-memory, verbs and libfabric implementations; the local connector; job
//! shell processes and their cgroups; the eBPF and userspace detectors; rank 0's SQLite store; a system instance's
//! TOML bootstrap, [`broker::config`]), [`keyfile`] (making, reading and writing the overlay key) and
//! [`foreground`] (the initial program and the terminal). The `vigil` crate's CLI starts brokers with [`broker::run`].

/// Shadows std's `eprintln!` in this crate: same output, but a failed write (standard error a closed pipe, as with
/// `vigil start ... 2>&1 | head`, or a log collector gone) is ignored. std's version panics then, and a broker
/// must not die, taking its instance down, for want of somewhere to print.
macro_rules! eprintln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

pub mod broker;
pub mod foreground;
pub mod keyfile;

// The crates below this one, under the paths the driver's modules name them by (`crate::jobs`, `crate::message`...).
pub use vigil_client::{self as client, frame};
pub use vigil_core::{attrs, jobs, membership};
pub use vigil_hwloc as hwloc;
pub use vigil_proto::{duration, eventlog, hostlist, idset, jobspec, message, r, shellproto, topology};

/// Wall-clock time in seconds since the Unix epoch.
pub fn broker_now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}
