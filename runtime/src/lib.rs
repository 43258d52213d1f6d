//! # Vigil runtime
//!
//! The core library of Vigil, a resource-manager runtime for HPC clusters in the family of Flux and Slurm, and
//! the home of the `vigil` command (CLI and broker).
//!
//! Layout (see `docs/architecture.md`):
//! - sans-IO core: [`topology`] (TBON math), [`message`] (wire codec), [`jobs`] (job manager, scheduler and
//!   exec rules as state machines with time passed in);
//! - formats from the Flux RFCs: [`idset`] (RFC 22), [`hostlist`] (RFC 29), [`duration`] (RFC 23),
//!   [`eventlog`] (RFC 18), [`r`] (RFC 20), [`jobspec`] (RFC 14/25);
//! - node discovery and placement with hwloc: [`hwloc`];
//! - broker attributes (`-S tbon.topo=kary:2`, `vigil lsattr`): every one in [`attrs`], parsed once into a typed
//!   [`attrs::BrokerConfig`];
//! - I/O around the core: [`broker`] (overlay transport, local connector, services), [`client`], [`cli`];
//! - the broker ↔ job shell contract: [`shellproto`].

/// Shadows std's `eprintln!` in this crate: same output, but a failed write (standard error a closed pipe, as with
/// `vigil start ... 2>&1 | head`, or a log collector gone) is ignored. std's version panics then, and a broker
/// must not die, taking its instance down, for want of somewhere to print.
macro_rules! eprintln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// Implements `FromStr`, `Serialize` and `Deserialize` for a type whose canonical form is a string: parsing with
/// `$ty::parse` and printing with its `Display` (idsets, hostlists).
macro_rules! string_form {
    ($ty:ident, $err:ident) => {
        impl std::str::FromStr for $ty {
            type Err = $err;
            /// Same as the type's `parse`.
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                $ty::parse(s)
            }
        }

        impl serde::Serialize for $ty {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_str(self)
            }
        }

        impl<'de> serde::Deserialize<'de> for $ty {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let s = <String as serde::Deserialize>::deserialize(deserializer)?;
                $ty::parse(&s).map_err(serde::de::Error::custom)
            }
        }
    };
}

pub mod attrs;
pub mod broker;
pub mod cli;
pub mod client;
pub mod duration;
pub mod eventlog;
pub mod foreground;
pub mod hostlist;
pub mod hwloc;
pub mod idset;
pub mod jobs;
pub mod jobspec;
pub mod keyfile;
pub mod membership;
pub mod message;
pub mod pmi;
pub mod r;
pub mod shellproto;
pub mod topology;

/// Wall-clock time in seconds since the Unix epoch.
pub fn broker_now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}
