//! Errors: one enum for opening an endpoint ([`OpenError`]), one for operations on an open one ([`Error`]), and
//! the two kinds of libfabric failure they carry: a failed call ([`CallError`]) and an error completion
//! ([`CompletionError`], from `fi_cq_readerr`), both with libfabric's own text (`fi_strerror`,
//! `fi_cq_strerror`).

use crate::PeerId;
use std::fmt;
use thiserror::Error;

/// Why [`Endpoint::open`](crate::Endpoint::open) failed. [`OpenError::Unavailable`] and
/// [`OpenError::NoProvider`] are the two "use another transport" answers (the broker falls back to TCP on
/// them); the others are faults worth reporting as such.
#[derive(Debug, Error)]
pub enum OpenError {
    /// This build of Vigil has no libfabric (the reason says why: not found at build time, or disabled).
    #[error("libfabric not available: {0}")]
    Unavailable(&'static str),
    /// `fi_getinfo` found no provider offering what the layer needs under that name on this node.
    #[error(
        "no libfabric provider matches {provider:?}{}: reliable datagrams (FI_EP_RDM) with FI_MSG, FI_SOURCE \
         and send-after-send ordering are required (`fi_info -p '{provider}' -t FI_EP_RDM` lists what is there)",
        .source_addr.as_ref().map(|a| format!(" on address {a}")).unwrap_or_default()
    )]
    NoProvider {
        /// The provider asked for, e.g. `tcp;ofi_rxm`.
        provider: String,
        /// The local address asked for, if any.
        source_addr: Option<String>,
    },
    /// A [`Config`](crate::Config) value the layer cannot use.
    #[error("invalid vigil-ofi configuration: {0}")]
    Config(String),
    /// A libfabric call failed while setting the endpoint up.
    #[error(transparent)]
    Call(#[from] CallError),
}

/// A libfabric call returned an error code.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
#[error("{call}: {text} (error {code})")]
pub struct CallError {
    /// The libfabric function, e.g. `fi_endpoint`.
    pub call: &'static str,
    /// The positive error number (`FI_E*`; values below 256 are POSIX errno values).
    pub code: i32,
    /// `fi_strerror(code)`.
    pub text: String,
}

/// Which kind of operation an error completion belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// A fragment sent to a peer.
    Send,
    /// A posted receive buffer.
    Recv,
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Op::Send => "send",
            Op::Recv => "receive",
        })
    }
}

/// An error completion read with `fi_cq_readerr`: the operation failed after it was posted (peer unreachable,
/// connection refused or reset, message truncated, operation canceled...).
#[derive(Clone, Debug, Error, PartialEq, Eq)]
#[error("{op} completed in error: {text} (error {code}){}", provider_part(.prov_text, *.prov_errno))]
pub struct CompletionError {
    /// The operation.
    pub op: Op,
    /// The positive error number (`FI_E*` or errno).
    pub code: i32,
    /// `fi_strerror(code)`.
    pub text: String,
    /// The provider's own error number (0 when it gave none).
    pub prov_errno: i32,
    /// `fi_cq_strerror` for `prov_errno` (empty when the provider gave none).
    pub prov_text: String,
}

fn provider_part(text: &str, errno: i32) -> String {
    if text.is_empty() && errno == 0 {
        String::new()
    } else {
        format!("; provider: {text} ({errno})")
    }
}

/// Why an operation on an open endpoint failed.
#[derive(Debug, Error)]
pub enum Error {
    /// The send queue holds [`Config::send_queue_limit`](crate::Config::send_queue_limit) bytes or more:
    /// call [`Endpoint::progress`](crate::Endpoint::progress) (or await
    /// [`AsyncEndpoint::send`](crate::AsyncEndpoint::send), which does) and try again. Nothing was queued.
    #[error("send queue full ({queued} bytes waiting): try again after progress")]
    WouldBlock {
        /// Bytes queued on the endpoint.
        queued: usize,
    },
    /// The message is longer than [`Config::max_message`](crate::Config::max_message).
    #[error("message of {len} bytes exceeds the limit of {max} bytes")]
    TooLarge {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The peer was never inserted, or was removed.
    #[error("unknown peer {0}")]
    UnknownPeer(PeerId),
    /// An earlier send to this peer failed ([`Event::PeerFailed`](crate::Event::PeerFailed) reported it): the
    /// layer sends nothing more to it until it is removed and inserted again.
    #[error("peer {peer} failed: {error}")]
    PeerFailed {
        /// The peer.
        peer: PeerId,
        /// The completion that failed it.
        error: CompletionError,
    },
    /// A libfabric call failed (reading the completion queue, inserting an address...).
    #[error(transparent)]
    Call(#[from] CallError),
    /// An error completion that names no operation of this endpoint: the endpoint is unusable.
    #[error("completion queue error: {0}")]
    Completion(CompletionError),
    /// Registering the wait descriptor with tokio failed.
    #[error("wait descriptor: {0}")]
    Io(#[from] std::io::Error),
}
