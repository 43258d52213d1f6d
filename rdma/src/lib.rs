//! Vigil's RDMA verbs transport (over `rdma-sys`, i.e. libibverbs).
//!
//! - [`find_device`]: which verbs device, port and GID index serve a local IP address (RoCE: the IPv4-mapped
//!   GID), or a sentence saying why none does ("no verbs devices", "libibverbs found no device serving ...").
//! - [`Endpoint::prepare`] → [`LocalInfo`] (serde) → [`Prepared::accept`] / [`Prepared::connect`] →
//!   [`Connection`]: a reliable-connected QP pair set up over an existing channel, carrying whole messages with
//!   credit-based flow control and fragmentation; completions reach tokio through the completion channel's
//!   descriptor (or a busy-polling loop, [`Config::busy_poll`]). [`Prepared::accept_sync`] /
//!   [`Prepared::connect_sync`] give a [`SyncConnection`] instead: no tokio, polled by the caller's thread.
//! - Errors end a connection with a reason ([`ConnError`]): an error work completion (e.g.
//!   `IBV_WC_RETRY_EXC_ERR` when the peer stopped acknowledging), or an async event (`IBV_EVENT_QP_FATAL`,
//!   `IBV_EVENT_PORT_ERR`). The broker turns that into a lost peer.
//!
//! Failure detection time is set by [`Config::timeout`] and [`Config::retry_cnt`]; the defaults (12, 1) report a
//! dead peer in about 40 ms on soft-RoCE. `retry_cnt` 7 and `timeout` 0 are refused: rdma_rxe treats them as
//! "retry forever" / "no timer" and would never report a dead peer.
//!
//! Memory registration counts against `RLIMIT_MEMLOCK`: a connection registers
//! 2 × (depth + 8) × frag_size bytes (1.3 MiB with the defaults).
//!
//! Tested on soft-RoCE (rdma_rxe) only; InfiniBand ports (LID addressing with a GRH) are expected to work but
//! have not been tried.

mod conn;
mod device;
mod ibverbs;
mod verbs;

// The settings of a connection are plain data (the broker's attribute table names them): `vigil-flow` has them.
pub use conn::{
    wc_status_name, ConnError, Connection, Endpoint, LocalInfo, Prepared, Receiver, RemoteInfo, Sender, SetupError,
    SyncConnection, PROTOCOL_VERSION,
};
pub use device::{find_device, gid_for, Device, NoDevice};
pub use verbs::{device_names, event_type_str, wc_status_str};
pub use vigil_flow::config::{Config, ConfigError};
