//! # Vigil runtime
//!
//! The `vigil` command: its CLI, and the brokers it starts with the tokio driver of `vigil-driver` around the
//! sans-IO rules of `vigil-core`. Vigil is a resource-manager runtime for HPC clusters in the family of Flux and
//! Slurm.
//!
//! Layout (see `docs/architecture.md`, "Crates"):
//! - pure formats and codecs, from the `vigil-proto` crate and re-exported here: [`topology`] (TBON math),
//!   [`message`] (wire codec), the Flux RFC formats [`idset`] (RFC 22), [`hostlist`] (RFC 29), [`duration`]
//!   (RFC 23), [`eventlog`] (RFC 18), [`r`] (RFC 20), [`jobspec`] (RFC 14/25), and the broker ↔ job shell
//!   contract [`shellproto`]; [`pmi`] adds the blocking PMI-1 client to the codec;
//! - the sans-IO rules, from the `vigil-core` crate and re-exported here: [`jobs`] (job manager, scheduler and
//!   exec rules as state machines with time passed in), [`membership`], the broker attributes [`attrs`] (every one
//!   in one table, parsed once into a typed [`attrs::BrokerConfig`]), and the broker's state machine (inputs and
//!   time in, effects out). The simulator (`vigil-sim`) and the core's unit tests drive them without I/O;
//! - the I/O around them, from the `vigil-driver` crate and re-exported here: [`broker`] (the tokio driver:
//!   overlay transport, local connector, job shells, detectors, the state directory's store, the clock),
//!   [`keyfile`]; [`client`] and [`frame`] (the `vigil-client` crate); node discovery and placement with hwloc,
//!   [`hwloc`] (the `vigil-hwloc` crate);
//! - in this crate: [`cli`] (every `vigil` command) and [`pmi`].

/// Shadows std's `eprintln!` in this crate: same output, but a failed write (standard error a closed pipe, as with
/// `vigil start ... 2>&1 | head`, or a log collector gone) is ignored. std's version panics then, and a broker
/// must not die, taking its instance down, for want of somewhere to print.
macro_rules! eprintln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

pub mod cli;
pub mod pmi;

// The tokio driver that does a broker's I/O lives in `vigil-driver`; re-exported under its old paths, so
// `crate::broker`, `vigil::broker::transport`, `vigil::keyfile` and the rest name the same modules as before.
pub use vigil_driver::{broker, broker_now, foreground, keyfile};

// The sans-IO rules live in `vigil-core` (the simulator and the unit tests drive them without I/O); re-exported
// under their old paths, so `crate::jobs`, `vigil::attrs` and the rest name the same modules as before.
pub use vigil_core::{attrs, jobs, membership};
// The pure formats and codecs live in `vigil-proto` (shared with the job shell); re-exported under their old
// paths, so `crate::idset`, `vigil::message` and the rest name the same modules as before.
pub use vigil_proto::{duration, eventlog, hostlist, idset, jobspec, message, r, shellproto, taskmap, topology};
// The local-connector client and the frame reader/writer live in `vigil-client` (the job shell uses them too).
pub use vigil_client::{self as client, frame};
// Node discovery and placement live in `vigil-hwloc` (the job shell uses them too).
pub use vigil_hwloc as hwloc;
