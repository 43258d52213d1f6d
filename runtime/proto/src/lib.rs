//! # Vigil formats and codecs
//!
//! Everything Vigil's processes and the field's tools exchange, as pure code: each function takes bytes or values
//! and returns values or errors. No sockets, no clocks to wait on, no tokio, libc or nix, so the job shell, the
//! local-connector client and the broker share these types without linking each other, and every decoder can be
//! tested and fuzzed in isolation (decoders never panic: bad input is an error).
//!
//! - formats from the Flux RFCs: [`idset`] (RFC 22), [`hostlist`] (RFC 29), [`duration`] (RFC 23),
//!   [`eventlog`] (RFC 18), [`r`] (RFC 20), [`jobspec`] (RFC 14/25), [`taskmap`] (RFC 34, and `--taskmap`'s
//!   schemes);
//! - [`topology`]: TBON math (parent, children, routers, critical ranks, next hop);
//! - [`node`]: what a broker reports of its node, and where the node's topology comes from; [`key`]: the
//!   overlay key as a value (reading and writing key files is the runtime's);
//! - [`message`]: Vigil messages and their wire codec (full frames and the packed form of RDMA links); reading
//!   frames from a stream is the I/O layer's job;
//! - [`shellproto`]: the broker ↔ job shell contract (shell input, reports, output chunks, topics);
//! - [`affinity`]: the `cpu-affinity` / `gpu-affinity` options and Linux-style cpu lists (`"0-3,8"`), read by the
//!   broker's placement, the CLI and the shell (binding itself is the shell's);
//! - [`pmi`]: the PMI-1 simple wire protocol's line codec (RFC 13); the server is in `vigil-shell`, the
//!   blocking client a nested broker bootstraps with is in `vigil`;
//! - [`pmi2`]: the PMI-2 wire protocol's command codec (MPICH's `pmi-2.0.txt`, what Slurm's `srun --mpi=pmi2`
//!   serves), for the same client.
//! - [`pmix`]: the JSON-lines protocol between the job shell and its PMIx server helper (`vigil-pmix`).

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

pub mod affinity;
pub mod constraint;
pub mod duration;
pub mod eventlog;
pub mod hostlist;
pub mod idset;
pub mod jobspec;
pub mod key;
pub mod message;
pub mod node;
pub mod pmi;
pub mod pmi2;
pub mod pmix;
pub mod r;
pub mod shellproto;
pub mod taskmap;
pub mod topology;
