//! Vigil's own safe layer over libfabric (OFI): reliable-datagram endpoints for overlay links on networks that
//! have no verbs device, above all HPE Slingshot (libfabric's `cxi` provider), and on `tcp;ofi_rxm`,
//! `udp;ofi_rxd` or `verbs;ofi_rxm` elsewhere. The broker's overlay links use it through
//! `runtime/driver/src/broker/ofi_link.rs`, chosen per link by `tbon.transport` and `tbon.ofi_provider`.
//!
//! # Shape
//! - [`Endpoint::open`] with a [`Config`] (provider name, optional local address and domain): `fi_getinfo`
//!   asking for `FI_EP_RDM` with `FI_MSG`, `FI_SOURCE` and send-after-send ordering, then fabric, domain,
//!   completion queue (with `FI_WAIT_FD` when the provider has it), address vector and endpoint; receive buffers
//!   are posted at once. One endpoint serves every peer of a broker.
//! - [`Endpoint::name`] gives the endpoint's address (`fi_getname`), to be sent to the peer over the
//!   authenticated TCP hello, as the verbs path sends its queue pair number; the peer passes it to
//!   [`Endpoint::insert_peer`] and gets a [`PeerId`].
//! - [`Endpoint::try_send`] / [`Endpoint::progress`] / [`Endpoint::poll_event`] form the synchronous core;
//!   [`AsyncEndpoint`] drives it from tokio: it waits on the wait descriptor with `AsyncFd` after `fi_trywait`
//!   says blocking is safe, and wakes every [`Config::progress_interval`] for providers with manual data
//!   progress (`tcp;ofi_rxm` is one) or while sends are outstanding. Without a wait descriptor (`udp;ofi_rxd`
//!   answers `FI_GETWAIT` with ENOSYS) it polls every [`Config::poll_interval`].
//! - [`Event`]s: whole messages, and [`Event::PeerFailed`] when a send to a peer completes in error
//!   (`fi_cq_readerr`, with libfabric's and the provider's error text): the broker's lost/suspect signal.
//! - Errors ([`OpenError`], [`Error`]) carry `fi_strerror` text. [`OpenError::NoProvider`] (nothing matches on
//!   this node) and [`OpenError::Unavailable`] (this build has no libfabric) are the answers the broker turns
//!   into its TCP fallback.
//!
//! # What a caller can rely on
//! - **Per peer, messages arrive whole, in order, exactly once**, or the peer fails. Reliability comes from
//!   the RDM endpoint; the layer fragments messages larger than [`Config::frag_size`] and numbers fragments per
//!   peer, because providers order message *matching* (`FI_ORDER_SAS`) but not necessarily *completions*:
//!   `tcp;ofi_rxm` reports `comp_order: FI_ORDER_NONE`, and a short message was seen here completing before the
//!   last fragment of a long one sent earlier. Incoming messages longer than [`Config::max_message`] are
//!   discarded and reported ([`Event::Oversized`]); fragments that do not parse are reported as
//!   [`Event::Malformed`] (bad input never panics).
//! - **Flow control.** More sends than the peer has posted receives neither lose data nor hang: the layer asks
//!   for `FI_RM_ENABLED`, under which, by the resource-management table of `fi_domain(3)`, a reliable endpoint
//!   answers full local queues with `FI_EAGAIN` and *retries* a message that finds no receive buffer (without
//!   it the message is dropped or fails). On top of that the layer keeps at
//!   most [`Config::tx_depth`] fragments in flight, queues the rest per peer (served round robin) up to
//!   [`Config::send_queue_limit`] bytes, and beyond that refuses with [`Error::WouldBlock`] (the async `send`
//!   waits instead). A receiver that stops reading therefore stalls its senders instead of growing their memory
//!   (tested: 3,000 messages against 4 receive buffers, a receiver that reads nothing for half a second).
//! - **A peer that vanishes**: on `tcp;ofi_rxm` and `udp;ofi_rxd` (1.17) sends to a closed endpoint neither
//!   fail nor complete within seconds: they stay in flight and the queue fills (consistent with the same table:
//!   with resource management, a message whose target endpoint is missing is retried). Peer loss must keep
//!   coming from the overlay's other detectors (the TCP side channel, heartbeats), as on the verbs path; an
//!   error completion, where a provider gives one, is an extra, faster signal (`verbs;ofi_rxm` gives one: a
//!   send flushed with `FI_ECANCELED`, 5-18 ms after the peer's endpoint closed, measured in the soft-RoCE
//!   VM). Closing an endpoint with such sends outstanding returns at once (tested).
//! - **Teardown**: dropping an [`Endpoint`] closes the endpoint first (which ends its posted operations), then
//!   completion queue, address vector, domain and fabric, and only then frees the buffers the provider was
//!   given.
//!
//! # Binding: why bindgen and a C shim, not `ofi-libfabric-sys`
//! `ofi-libfabric-sys` 0.2 (the libfabric project's crate) generates its bindings from libfabric 2.x headers:
//! its wrapper includes `fi_profile.h`, which Debian 12's libfabric 1.17 does not have, so it does not build
//! here; and its build script panics when pkg-config finds no libfabric, so it could not be an optional part of
//! the workspace either. This crate's `build.rs` instead asks pkg-config for libfabric (>= 1.10), runs bindgen
//! (the version the verbs crate's `rdma-sys` already uses) on the installed headers, so structure layouts are
//! those of the library linked, and compiles `csrc/shim.c`: libfabric's data-path calls (`fi_endpoint`,
//! `fi_cq_open`, `fi_send`, `fi_recv`, `fi_cq_readfrom`, `fi_trywait`...) are `static inline` functions that
//! jump through the object's ops table, have no symbol in `libfabric.so` and so are invisible to bindgen. A
//! shim compiled against the same headers calls them exactly as a C program would, where calling through the
//! ops structures from Rust would re-implement each inline function (and its version checks) by hand.
//!
//! # Without libfabric
//! When pkg-config finds no libfabric, bindgen cannot load libclang, or `VIGIL_OFI=off` is set at build time,
//! the crate builds a stub with the same API: [`library`] and [`Endpoint::open`] return the reason (the build
//! also prints it as a cargo warning), and nothing else can be reached. CI runs the crate's tests both ways.
//! A build with libfabric links `libfabric.so.1` dynamically, like the verbs crate links libibverbs.
//!
//! # Tested here, and not
//! Tested on Debian 12's libfabric 1.17 with `tcp;ofi_rxm` and `udp;ofi_rxd` over loopback (two endpoints in
//! one process), and with `verbs;ofi_rxm` on two soft-RoCE devices in the VM (`ci/ofi-verbs-test.sh`, which
//! also says what that provider needs there); `cxi` needs a Slingshot NIC (see `docs/slingshot.md`).

mod aio;
mod error;
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

/// Load libfabric (`dlopen` of `libfabric.so.1`, once per process), or say why it cannot be. Loading it runs its
/// providers' constructors, which cost ~0.2 s with Debian's build (its PSM providers): so it is not linked, and
/// only a process that opens an endpoint (or asks [`library`]) pays for it.
#[cfg(vigil_ofi)]
pub(crate) fn load() -> Result<(), &'static str> {
    static LOADED: std::sync::OnceLock<Result<(), &'static str>> = std::sync::OnceLock::new();
    *LOADED.get_or_init(|| {
        // SAFETY: called once (OnceLock), before any other libfabric call; it returns NULL or dlerror's text,
        // copied at once.
        let why = keep_signal_handlers(|| unsafe { sys::vigil_fi_load() });
        if why.is_null() {
            return Ok(());
        }
        // SAFETY: a NUL-terminated string from dlerror, valid until the next dl* call on this thread.
        let why = unsafe { std::ffi::CStr::from_ptr(why) }.to_string_lossy();
        Err(Box::leak(format!("cannot load libfabric.so.1 ({why}): install libfabric1").into_boxed_str()))
    })
}

/// The signals whose handlers libfabric's providers install when the library loads (their constructors, for
/// their own clean-up; some exit the process): the caller's SIGTERM and SIGINT handling (a tokio runtime chains
/// to a handler it finds) and Rust's stack-overflow report must stay as they were.
#[cfg(vigil_ofi)]
const KEPT_SIGNALS: [libc::c_int; 8] = [
    libc::SIGTERM,
    libc::SIGINT,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGABRT,
    libc::SIGILL,
    libc::SIGSEGV,
    libc::SIGBUS,
];

/// Run `f` (which loads libfabric) and put back the handlers of [`KEPT_SIGNALS`] it changed.
#[cfg(vigil_ofi)]
fn keep_signal_handlers<T>(f: impl FnOnce() -> T) -> T {
    // SAFETY: an all-zero sigaction is a valid value to be overwritten by sigaction(2).
    let mut saved: [libc::sigaction; KEPT_SIGNALS.len()] = unsafe { std::mem::zeroed() };
    for (s, old) in KEPT_SIGNALS.iter().zip(saved.iter_mut()) {
        // SAFETY: reads the current disposition of a valid signal into a struct we own.
        unsafe { libc::sigaction(*s, std::ptr::null(), old) };
    }
    let r = f();
    for (s, old) in KEPT_SIGNALS.iter().zip(saved.iter()) {
        // SAFETY: an all-zero sigaction is a valid value to be overwritten by sigaction(2).
        let mut now: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: reads the current disposition of a valid signal into a struct we own.
        unsafe { libc::sigaction(*s, std::ptr::null(), &mut now) };
        if now.sa_sigaction != old.sa_sigaction {
            tracing::debug!("libfabric changed the handler of signal {s}; put back");
            // SAFETY: reinstalls exactly the disposition read before `f` for the same signal.
            unsafe { libc::sigaction(*s, old, std::ptr::null_mut()) };
        }
    }
    r
}

/// The libfabric this build uses, or why it has none (a sentence, e.g. "pkg-config found no libfabric ...").
/// Report it once at start-up; [`Endpoint::open`] gives the same reason as [`OpenError::Unavailable`].
pub fn library() -> Result<Library, &'static str> {
    #[cfg(vigil_ofi)]
    {
        load()?;
        // SAFETY: libfabric is loaded (above); fi_version takes no arguments and only returns its version number.
        let v = unsafe { sys::fi_version() };
        Ok(Library { built_against: env!("VIGIL_OFI_BUILT_AGAINST"), runtime: (v >> 16, v & 0xffff) })
    }
    #[cfg(not(vigil_ofi))]
    {
        Err(stub::UNAVAILABLE)
    }
}
