//! The types shared by the libfabric build and the stub: configuration, peer ids, events, counters.

use crate::error::{CompletionError, OpenError};
use std::fmt;
use std::time::Duration;

/// How to open an [`Endpoint`](crate::Endpoint). [`Config::default`] asks for `tcp;ofi_rxm`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// libfabric provider name, as `fi_info -p` takes it: `tcp;ofi_rxm`, `udp;ofi_rxd`, `verbs;ofi_rxm`,
    /// `cxi`...
    pub provider: String,
    /// Local address to bind (`fi_getinfo` node with `FI_SOURCE`), e.g. the local IP of the overlay's TCP
    /// connection; `None` lets the provider choose.
    pub source_addr: Option<String>,
    /// Domain (NIC) name, e.g. `cxi0` or `lo`; `None` lets the provider choose.
    pub domain: Option<String>,
    /// Payload bytes per fragment, i.e. per receive buffer (each buffer is `vigil_flow::HEADER`, 5 bytes, larger,
    /// for the fragment header).
    pub frag_size: usize,
    /// Receive buffers posted at all times.
    pub rx_depth: usize,
    /// Send slots: fragments handed to the provider and not completed yet, at most.
    pub tx_depth: usize,
    /// Completion queue entries (0: `rx_depth + tx_depth`).
    pub cq_size: usize,
    /// Largest message accepted to send or reassembled from a peer (a longer incoming one is discarded and
    /// reported as [`Event::Oversized`]).
    pub max_message: usize,
    /// Bytes of accepted but not yet posted messages above which [`Endpoint::try_send`](crate::Endpoint::try_send)
    /// refuses more ([`Error::WouldBlock`](crate::Error::WouldBlock)); a message is always accepted whole
    /// when the queue is below this.
    pub send_queue_limit: usize,
    /// [`AsyncEndpoint`](crate::AsyncEndpoint): how often to call progress while waiting, for providers with
    /// manual data progress, or with work outstanding (queued or in-flight sends). `None`: only on wake-ups.
    pub progress_interval: Option<Duration>,
    /// [`AsyncEndpoint`](crate::AsyncEndpoint): polling period when the provider offers no wait descriptor.
    pub poll_interval: Duration,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            provider: "tcp;ofi_rxm".into(),
            source_addr: None,
            domain: None,
            frag_size: 64 * 1024,
            rx_depth: 32,
            tx_depth: 32,
            cq_size: 0,
            max_message: 64 << 20,
            send_queue_limit: 8 << 20,
            progress_interval: Some(Duration::from_millis(10)),
            poll_interval: Duration::from_millis(1),
        }
    }
}

impl Config {
    /// The default configuration for `provider`.
    pub fn with_provider(provider: &str) -> Config {
        Config { provider: provider.into(), ..Config::default() }
    }

    /// Check the values the layer cannot work with.
    pub fn validate(&self) -> Result<(), OpenError> {
        let bad = |m: &str| Err(OpenError::Config(m.into()));
        if self.provider.is_empty() {
            return bad("provider is empty");
        }
        if self.frag_size == 0 || self.rx_depth == 0 || self.tx_depth == 0 {
            return bad("frag_size, rx_depth and tx_depth must be positive");
        }
        if self.poll_interval.is_zero() || self.progress_interval.is_some_and(|d| d.is_zero()) {
            return bad("poll_interval and progress_interval must be positive");
        }
        Ok(())
    }
}

/// A peer inserted into an endpoint's address vector (its `fi_addr_t`); valid for that endpoint only.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PeerId(pub(crate) u64);

impl fmt::Display for PeerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "fi_addr {}", self.0)
    }
}

/// What an endpoint reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A whole message from a peer.
    Message {
        /// The sender.
        from: PeerId,
        /// The message.
        data: Vec<u8>,
    },
    /// A send to this peer completed in error (unreachable, connection refused or reset...): the peer is to be
    /// treated as lost or suspect. Its queued messages were dropped and later sends to it are refused
    /// ([`Error::PeerFailed`](crate::Error::PeerFailed)). Reported once per peer.
    PeerFailed {
        /// The peer.
        peer: PeerId,
        /// The error completion.
        error: CompletionError,
    },
    /// A posted receive completed in error (e.g. truncation); the buffer was posted again.
    RecvFailed {
        /// The error completion.
        error: CompletionError,
    },
    /// A peer sent a message longer than [`Config::max_message`]; it was discarded.
    Oversized {
        /// The sender.
        from: PeerId,
        /// Bytes seen when the limit was crossed.
        len: usize,
    },
    /// A peer sent a fragment that is not of this protocol (a fault or a hostile peer: disconnect it).
    Malformed {
        /// The sender.
        from: PeerId,
    },
}

/// Counters of one endpoint.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Messages accepted by `try_send`.
    pub messages_sent: u64,
    /// Whole messages received.
    pub messages_received: u64,
    /// Fragments posted.
    pub fragments_sent: u64,
    /// Fragments received.
    pub fragments_received: u64,
    /// Error completions read.
    pub error_completions: u64,
    /// Fragments from sources not in the address vector (dropped).
    pub unknown_source: u64,
    /// Malformed fragments.
    pub malformed: u64,
}
