//! Vigil's own safe layer over libfabric (OFI): reliable-datagram endpoints for overlay links on networks
//! that have no verbs device, above all HPE Slingshot (libfabric's `cxi` provider), and on `tcp;ofi_rxm` /
//! `udp;ofi_rxd` / `verbs;ofi_rxm` elsewhere.
//!
//! (Crate guide: see the bottom of this page once written.)

mod aio;
mod error;
#[cfg_attr(not(vigil_ofi), allow(dead_code))]
mod frag;
mod types;

#[cfg(vigil_ofi)]
mod endpoint;
#[cfg(vigil_ofi)]
mod raw;
#[cfg(not(vigil_ofi))]
mod stub;

#[cfg(vigil_ofi)]
#[allow(unsafe_op_in_unsafe_fn, missing_docs, non_camel_case_types, non_upper_case_globals, non_snake_case)]
#[allow(dead_code, unreachable_pub, clippy::all, clippy::undocumented_unsafe_blocks)]
mod sys {
    include!(concat!(env!("OUT_DIR"), "/bindings.rs"));
}

pub use aio::AsyncEndpoint;
#[cfg(vigil_ofi)]
pub use endpoint::Endpoint;
pub use error::{CallError, CompletionError, Error, Op, OpenError};
#[cfg(not(vigil_ofi))]
pub use stub::Endpoint;
pub use types::{Config, Event, PeerId, Stats};

/// The libfabric this build uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Library {
    /// The version pkg-config reported at build time (the headers the binding was generated from).
    pub built_against: &'static str,
    /// The version of the library loaded at run time (`fi_version`), as (major, minor).
    pub runtime: (u32, u32),
}

/// The libfabric this build uses, or why it has none (a sentence, e.g. "pkg-config found no libfabric ...").
/// Report it once at start-up; [`Endpoint::open`] gives the same reason as [`OpenError::Unavailable`].
pub fn library() -> Result<Library, &'static str> {
    #[cfg(vigil_ofi)]
    {
        // SAFETY: fi_version takes no arguments and only returns the library's version number.
        let v = unsafe { sys::fi_version() };
        Ok(Library { built_against: env!("VIGIL_OFI_BUILT_AGAINST"), runtime: (v >> 16, v & 0xffff) })
    }
    #[cfg(not(vigil_ofi))]
    {
        Err(stub::UNAVAILABLE)
    }
}
