//! What only the driver's I/O needs to start a broker ([`DriverOptions`]), beside the
//! [`BrokerOptions`](super::BrokerOptions) the sans-IO broker runs on.
//!
//! Each value lives in one place. The broker's attributes (`-S name=value`) are all in its typed config,
//! `BrokerOptions::config` (`vigil_core::attrs::BrokerConfig`), including those only the driver acts on: the
//! driver reads `tbon.connect_timeout` (how long it retries the parent), `resource.synthetic` / `resource.xml`
//! and `resource.gpus` (what it discovers), `tbon.transport`, `broker.detectors`... there, where `vigil getattr`
//! reads them too. What is here comes from no attribute: how `vigil broker` was started (its flags, the bootstrap
//! file, the PMI launcher), and nothing of it is a rule's business.

use std::path::PathBuf;
use vigil_proto::key::OverlayKey;

/// How a broker gets its overlay listening socket.
#[derive(Debug, Clone)]
pub enum ListenSpec {
    /// An already bound TCP listener inherited from the command that started the broker (file descriptor
    /// number): `vigil broker --listen-fd=FD` (`vigil start` binds every rank's), or the one a PMI bootstrap
    /// bound before it put its endpoint.
    Fd(i32),
    /// Bind this endpoint (`tcp://host:port`): this rank's `bind` in a system instance's bootstrap file.
    Endpoint(String),
}

/// What the broker's driver needs to start and that the broker's rules never read: the overlay listener, the
/// overlay key and, for a test instance, the node as already discovered. No field has a default: the command
/// starting the broker (`vigil broker`, from `vigil start`, a bootstrap file or a PMI launcher) fills each.
#[derive(Debug)]
pub struct DriverOptions {
    /// The overlay's listening socket: `--listen-fd=FD` (or the PMI bootstrap's own) as [`ListenSpec::Fd`], else
    /// this rank's `bind` address from the bootstrap file as [`ListenSpec::Endpoint`].
    pub listen: ListenSpec,
    /// The instance's overlay key, 32 bytes: every overlay link is authenticated and encrypted with it (see
    /// `secure.rs`). From the bootstrap file's `bootstrap.overlay_key` (a key file; `vigil start` writes one
    /// for its test instance), or made by rank 0 of a PMI bootstrap and shared through the launcher's KVS.
    pub key: OverlayKey,
    /// This node as already discovered, a JSON file as `vigil discover-node` prints it: `vigil broker
    /// --discovered=FILE`, which `vigil start` passes so that the machine is discovered once for all the brokers
    /// of a test instance. `None` (and a file that cannot be read): the broker discovers its node itself, from
    /// `resource.synthetic` / `resource.xml` / the live machine, with `resource.gpus` declared (`discover.rs`).
    pub discovered: Option<PathBuf>,
    /// The endpoints came from an exchange (a PMI launcher's KVS) that ended after every broker in it had bound
    /// its overlay listener and put its endpoint: a first parent that refuses a connection is gone, not still
    /// starting, and one whose node's kernel does not answer is not worth waiting for. Such a broker, when it
    /// re-parents (`tbon.reparent`, the default) and its parent is not rank 0, goes to an adoptive parent
    /// instead of retrying it for `tbon.connect_timeout` (`links_up::first_parent_gone`). `false`: a bootstrap
    /// file's endpoints, whose brokers start in any order.
    pub endpoints_exchanged: bool,
}
