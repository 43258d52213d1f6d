//! How a broker's overlay links come up: accepting its children ([`accept_children`]: the handshake, then the
//! hello, each off the loop) and connecting to its parent ([`connect_parent`]: the first one at start, an
//! adoptive one after a loss), and whether a peer's node answers at all ([`node_answers`]).
//!
//! What the links are is `transport.rs`'s (with `secure.rs` for the handshake and `upgrade.rs` for moving a link
//! onto another transport after its hello); the loop that polls them is `link_set.rs`'s; what the broker makes
//! of a hello is `driver.rs`'s, and carrying out the effects that accept or refuse a child or ask for a parent is
//! `effects.rs`'s.

use super::driver::Event;
use super::secure;
use super::transport::{
    local_ip, merge, peer_ip, tune_tcp, Link, LinkChoice, LinkEvent, LinkTx, Transport, TCP_USER_TIMEOUT_MS,
};
use super::upgrade::{Answers, Upgrades};
use super::BrokerOptions;
use crate::message::{Message, MsgType};
use serde_json::Value;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

/// A parent link just made ([`connect_parent`]).
pub(crate) struct ParentLink {
    pub(super) link: Link,
    pub(super) choice: LinkChoice,
    /// The parent node's heartbeat responder: its overlay address and the parent broker's probe port (from its
    /// `hello-ack`; none from a parent without detectors).
    pub(super) probe: Option<std::net::SocketAddr>,
}

/// Why [`connect_parent`] made no link.
#[derive(Debug)]
pub(crate) enum ParentError {
    /// No parent there: nothing listens, no answer or no handshake within `tbon.connect_timeout`.
    Unreachable(String),
    /// The parent answered our hello with `refused`: why, and whether for capacity alone (its `full` field,
    /// absent from older brokers: `false`; `reparent.rs`, "Last resort").
    Refused { why: String, full: bool },
}

impl ParentError {
    /// The same error, its reason prefixed with `what` (e.g. `rank 5`).
    pub(super) fn context(self, what: &str) -> ParentError {
        match self {
            ParentError::Unreachable(why) => ParentError::Unreachable(format!("{what}: {why}")),
            ParentError::Refused { why, full } => ParentError::Refused { why: format!("{what}: {why}"), full },
        }
    }
}

impl std::fmt::Display for ParentError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ParentError::Unreachable(why) | ParentError::Refused { why, .. } => f.write_str(why),
        }
    }
}

impl From<String> for ParentError {
    fn from(why: String) -> ParentError {
        ParentError::Unreachable(why)
    }
}

/// A child's overlay link.
pub(super) struct ChildLink {
    pub(super) tx: LinkTx,
    pub(super) conn: u64,
    pub(super) sock: Option<std::os::fd::OwnedFd>,
    pub(super) tasks: Vec<tokio::task::AbortHandle>,
    /// The connection's 4-tuple as registered with the TCP watcher.
    pub(super) tuple: Option<vigil_ebpf::TcpTuple>,
}

impl Drop for ChildLink {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// A would-be child's link while the broker judges its hello.
pub(super) struct PendingChild {
    pub(super) link: Link,
    pub(super) answers: Answers,
    pub(super) probe_port: Option<u16>,
    /// Its job network, if its hello named one (`tbon.job_network`).
    pub(super) job_network: Option<JobNetwork>,
}

/// A child's job network as its hello tells it (`"job_network": {"iface": "hsn0", "addr": "10.201.0.3:4711"}`,
/// optional: an older child does not send it).
pub(super) struct JobNetwork {
    /// Interface name on the child's node (for the drain reason).
    pub(super) iface: String,
    /// Where its job-network responder answers.
    pub(super) addr: std::net::SocketAddr,
}

impl JobNetwork {
    /// From a hello; a field that is not what it should be is logged with the field's name and ignored (the child
    /// is probed on its management network only).
    pub(super) fn from_hello(hello: &Value) -> Option<JobNetwork> {
        let jn = hello.get("job_network").filter(|v| !v.is_null())?;
        let iface = jn.get("iface").and_then(Value::as_str).filter(|s| !s.is_empty() && s.len() <= 15);
        let addr = jn.get("addr").and_then(Value::as_str).and_then(|a| a.parse::<std::net::SocketAddr>().ok());
        match (iface, addr) {
            (Some(i), Some(a)) if a.is_ipv4() && a.port() != 0 => Some(JobNetwork { iface: i.to_string(), addr: a }),
            (None, _) => {
                warn!("a child's hello: job_network.iface is not an interface name; its job network is not probed");
                None
            }
            _ => {
                warn!("a child's hello: job_network.addr is not an IPv4 ADDR:PORT; its job network is not probed");
                None
            }
        }
    }
}

/// Accept child connections: each runs the responder's handshake ([`secure::respond`]) under the bounds stated
/// in `secure` (pending connections, message sizes, time), then must send a `hello` as its first message.
pub(super) async fn accept_children(
    l: tokio::net::TcpListener,
    tx: mpsc::UnboundedSender<Event>,
    auth: std::sync::Arc<secure::LinkAuth>,
    upgrades: std::sync::Arc<Upgrades>,
    refusals: std::sync::Arc<std::sync::Mutex<secure::RefusalLog>>,
) {
    let slots = std::sync::Arc::new(secure::HandshakeSlots::default());
    // One place decides what to log about refused peers (see `secure::RefusalLog`).
    let note = {
        let refusals = refusals.clone();
        move |addr: std::net::SocketAddr, why: &dyn std::fmt::Display| {
            let (warn, unlogged) =
                refusals.lock().map(|mut r| r.refused(addr.ip(), Instant::now())).unwrap_or((false, None));
            if let Some(n) = unlogged {
                warn!("overlay listener: {n} more refused connection(s) in the last minute were not logged (vigil uptime counts them all)");
            }
            if warn {
                warn!("overlay peer {addr}: {why}");
            } else {
                debug!("overlay peer {addr}: {why}");
            }
        }
    };
    let note = std::sync::Arc::new(note);
    let mut conn: u64 = 0;
    loop {
        let (s, addr) = match l.accept().await {
            Ok(x) => x,
            Err(e) => {
                warn!("overlay accept: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let id = match slots.admit(addr.ip()) {
            secure::Admission::Admitted(id) => id,
            secure::Admission::Evicted(id) => {
                note(
                    addr,
                    &format_args!(
                        "{} connections already wait for their handshake: the oldest was closed to admit this one",
                        secure::MAX_PENDING_HANDSHAKES
                    ),
                );
                id
            }
            secure::Admission::AddressFull => {
                note(
                    addr,
                    &format_args!(
                        "closed: {} connections from this address already wait for their handshake",
                        secure::MAX_PENDING_PER_ADDRESS
                    ),
                );
                continue;
            }
        };
        tune_tcp(&s, TCP_USER_TIMEOUT_MS);
        let (mut s, dup) = super::transport::raise_socket(s);
        conn += 1;
        let c = conn;
        let tx = tx.clone();
        let upgrades = upgrades.clone();
        let auth = auth.clone();
        let note = note.clone();
        let slot_guard = SlotGuard(slots.clone(), id);
        let keyed_slots = slots.clone();
        let task = tokio::spawn(async move {
            let session = match secure::respond_keyed(&mut s, &auth, || keyed_slots.keyed(id)).await {
                Ok(x) => x,
                Err(e) => {
                    note(addr, &format_args!("refused: {e}"));
                    return;
                }
            };
            drop(slot_guard);
            let mut link = super::transport::secure_link(s, session, addr.to_string(), dup);
            // The first message must be a hello; the handshake's record already holds it.
            let first = tokio::time::timeout(secure::HANDSHAKE_TIMEOUT, link.rx.recv()).await;
            match first {
                Ok(Some(LinkEvent::Message(m))) if m.msgtype == MsgType::Control && m.topic == "hello" => {
                    // Answer the child's transport offers here, off the loop (opening a device takes
                    // milliseconds).
                    let local = link.sock.as_ref().and_then(local_ip);
                    let answers = upgrades.answer(local, &m.json()).await;
                    let _ = tx.send(Event::ChildHello { conn: c, msg: m, link, answers });
                }
                Ok(Some(LinkEvent::Message(m))) => {
                    warn!("overlay peer {addr}: expected hello, got {:?} '{}'; disconnecting", m.msgtype, m.topic);
                }
                Ok(Some(LinkEvent::Closed(why))) => warn!("overlay peer {addr} disconnected before hello: {why}"),
                Ok(None) => {}
                Err(_) => warn!(
                    "overlay peer {addr}: no hello within {}s; disconnecting",
                    secure::HANDSHAKE_TIMEOUT.as_secs()
                ),
            }
        });
        slots.attach(id, task.abort_handle());
    }
}

/// Frees a connection's handshake slot however its task ends (done, failed, or aborted to make room).
struct SlotGuard(std::sync::Arc<secure::HandshakeSlots>, u64);

impl Drop for SlotGuard {
    fn drop(&mut self) {
        self.0.release(self.1);
    }
}

/// Connection attempts of one [`node_answers`] check, started a third of its wait apart.
const CHECK_ATTEMPTS: u32 = 3;

/// Whether the node at `addr` (an IP and a port no TCP listener is expected on: a broker's UDP probe port) answers
/// a TCP connection attempt within `wait`: its kernel sends a SYN-ACK, or a reset where nothing listens, from its
/// receive path, whatever its processes do; a dead node or a cut link sends nothing (`confirm.rs` in the core).
///
/// A lost SYN is sent again by the kernel only after a second, far past any wait a judge gives a check, so one
/// attempt on a lossy link (2 % loss each way fails about 4 checks in 100) would make a live node look dead:
/// [`CHECK_ATTEMPTS`] attempts, each on its own socket and started a third of `wait` apart, and any answer counts.
pub(super) async fn node_answers(addr: std::net::SocketAddr, wait: Duration) -> bool {
    let attempt = |delay: Duration| async move {
        tokio::time::sleep(delay).await;
        match tokio::net::TcpStream::connect(addr).await {
            Ok(_) => true,
            Err(e) => e.kind() == std::io::ErrorKind::ConnectionRefused,
        }
    };
    let mut attempts = tokio::task::JoinSet::new();
    for i in 0..CHECK_ATTEMPTS {
        attempts.spawn(attempt(wait * i / CHECK_ATTEMPTS));
    }
    let any = async {
        while let Some(answered) = attempts.join_next().await {
            if answered.unwrap_or(false) {
                return true;
            }
        }
        false
    };
    // Dropping the set aborts the attempts still waiting.
    tokio::time::timeout(wait, any).await.unwrap_or(false)
}

/// How long a first parent whose endpoint was exchanged ([`Ask::First`]) may go without a link before its node is
/// checked ([`first_parent_gone`]): a live one makes it in milliseconds, since its listener was bound before the
/// exchange ended.
pub(super) const FIRST_PARENT_CHECK_AFTER: Duration = Duration::from_millis(500);

/// How long after a check that its node answered that node is checked again, while no link is made yet.
pub(super) const FIRST_PARENT_RECHECK: Duration = Duration::from_secs(2);

/// How long one check of a first parent's node waits for an answer ([`node_answers`]).
pub(super) const FIRST_PARENT_CHECK_WAIT: Duration = Duration::from_secs(1);

/// Resolves, saying why, once the node of the first parent at `addr` (its overlay endpoint, exchanged) does not
/// answer: checked ([`node_answers`], within [`FIRST_PARENT_CHECK_WAIT`]) [`FIRST_PARENT_CHECK_AFTER`] after the
/// start and then every [`FIRST_PARENT_RECHECK`], for as long as the caller waits for the link. A node that
/// answers holds a parent that is slow (stopped, loaded, still starting), not gone: it is waited for, as always.
/// One that does not answer is dead, or cut off from this broker: its children go to an adoptive parent, which
/// is tree repair and no verdict on it (the instance learns a lost node from the enclosing instance, or judges a
/// broker that joined); should it come up after all, it finds them adopted and joins as a leaf (`reparent.rs`).
pub(super) async fn first_parent_gone(addr: std::net::SocketAddr) -> String {
    let mut wait = FIRST_PARENT_CHECK_AFTER;
    loop {
        tokio::time::sleep(wait).await;
        if !node_answers(addr, FIRST_PARENT_CHECK_WAIT).await {
            return format!(
                "its node does not answer at {addr} (neither a SYN-ACK nor a reset within {} ms)",
                FIRST_PARENT_CHECK_WAIT.as_millis()
            );
        }
        wait = FIRST_PARENT_RECHECK;
    }
}

/// What a broker asks of the parent it connects to ([`connect_parent`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ask {
    /// To be its child: its static parent, at start. `exchanged`: the parent's endpoint came from an exchange that
    /// ended after it bound its listener ([`DriverOptions::endpoints_exchanged`](super::DriverOptions)), so a
    /// refused connection means it is gone; otherwise it may still be starting, and is retried.
    First { exchanged: bool },
    /// To adopt it in place of its lost parent `lost`, and whether as a last resort (see
    /// [`reparent::ask_adoption`](super::reparent::ask_adoption)). A refused connection ends the attempt: a
    /// candidate is up or it is not.
    Adoption { lost: u32, last_resort: bool },
}

/// Connect to the parent at `ep` (retrying for up to `timeout` seconds: `tbon.connect_timeout` for the first
/// parent), say hello (asking what `ask` says) and move the link onto the transport the hello agrees.
///
/// A connection refused (nothing listens at `ep`) ends the attempt at once, [`ParentError::Unreachable`], for an
/// adoption and for a first parent whose endpoint was exchanged ([`Ask`]).
pub(super) async fn connect_parent(
    opts: &BrokerOptions,
    timeout: f64,
    transport: &dyn Transport,
    upgrades: &Upgrades,
    probe: &Value,
    ep: &str,
    ask: Ask,
) -> Result<ParentLink, ParentError> {
    let deadline = Instant::now() + Duration::from_secs_f64(timeout.clamp(0.0, 1e7));
    let mut delay = Duration::from_millis(5);
    let mut last_error = String::from("no answer");
    let mut warned = false;
    loop {
        match transport.connect(ep.to_string()).await {
            Ok(mut link) => {
                // Offer the transports tbon.transport allows on our end of this connection (upgrade.rs).
                let local = link.sock.as_ref().and_then(local_ip);
                let offers = upgrades.offer(local)?;
                let mut fields = merge(
                    super::liveness::hello_payload(
                        opts.rank,
                        &opts.instance,
                        opts.size,
                        &opts.config.topo,
                        &opts.hostname,
                    ),
                    probe.clone(),
                );
                if let Ask::Adoption { lost, last_resort } = ask {
                    // Asking to be adopted: our parent `lost` was lost (see reparent.rs).
                    super::reparent::ask_adoption(&mut fields, lost, last_resort);
                }
                let fields = merge(fields, offers.hello_fields());
                let hello = Message::control("hello", &fields);
                let _ = link.tx.send(hello);
                match tokio::time::timeout(Duration::from_secs(10), link.rx.recv()).await {
                    Ok(Some(LinkEvent::Message(m))) if m.topic == "hello-ack" => {
                        let ack = m.json();
                        let (link, choice) = offers.finish(&ack, link).await?;
                        info!("overlay link to parent: {}", choice.describe());
                        // Its node's responder, which our prober asks too (see `Broker::probe_parent`).
                        let port = ack.get("probe_port").and_then(Value::as_u64).and_then(|p| u16::try_from(p).ok());
                        let ip = link.sock.as_ref().and_then(peer_ip);
                        let probe = ip.zip(port).map(|(ip, port)| std::net::SocketAddr::new(ip, port));
                        return Ok(ParentLink { link, choice, probe });
                    }
                    Ok(Some(LinkEvent::Message(m))) if m.topic == "refused" => {
                        let why = format!("parent at {ep} refused us: {}", m.errstr().unwrap_or_default());
                        let full = m.json().get("full").and_then(Value::as_bool).unwrap_or(false);
                        return Err(ParentError::Refused { why, full });
                    }
                    other => {
                        // A parent that stops (a restart of rank 0) closes the connections of its handshakes.
                        let what = match other {
                            Ok(Some(LinkEvent::Message(m))) => format!("it answered '{}' to our hello", m.topic),
                            Ok(Some(LinkEvent::Closed(why))) => format!("it closed the connection ({why})"),
                            Ok(None) => "it closed the connection".to_string(),
                            Err(_) => "no answer to our hello in 10 s".to_string(),
                        };
                        warn!("parent at {ep}: no handshake: {what}; retrying");
                    }
                }
            }
            Err(e) => {
                debug!("connect {ep}: {e}");
                if ask != (Ask::First { exchanged: false }) && e.kind() == std::io::ErrorKind::ConnectionRefused {
                    // A candidate adoptive parent is up or it is not: nothing listens there, try the next one now
                    // (so for a first parent whose listener was bound before the exchange that named it; one
                    // from a bootstrap file, by contrast, may still be starting: retried until
                    // tbon.connect_timeout).
                    return Err(format!("nothing listens at {ep} ({e})").into());
                }
                last_error = match e.kind() {
                    // The parent closes a connection whose handshake fails: the keys (or instance ids) differ, or
                    // its listener is flooded. Its own log says which.
                    std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::PermissionDenied => {
                        let why = format!(
                            "the parent closed our authentication handshake ({e}): it holds another overlay key or \
                             instance id, or its listener is flooded with connections (its log says which)"
                        );
                        if !warned {
                            warn!("parent at {ep}: {why}; retrying for up to {timeout}s (tbon.connect_timeout)");
                            warned = true;
                        }
                        why
                    }
                    _ => e.to_string(),
                };
            }
        }
        if Instant::now() >= deadline {
            let why = format!("could not connect to parent at {ep} within {timeout}s: {last_error}");
            return Err(why.into());
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_millis(200));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::core::Peer;
    use crate::broker::link_set::LinkSet;
    use crate::broker::transport::{MemNetwork, MemTransport};
    use crate::topology::Topology;
    use serde_json::json;
    use std::path::PathBuf;

    /// A node's kernel answers a check with a SYN-ACK where something listens and with a reset where nothing
    /// does; either is an answer, at once (loopback only here: what a dead node sends is nothing).
    #[tokio::test]
    async fn a_node_answers_with_a_syn_ack_or_a_reset() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let open = l.local_addr().expect("addr");
        let closed = {
            let c = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            c.local_addr().expect("addr")
        };
        let since = std::time::Instant::now();
        assert!(node_answers(open, Duration::from_secs(60)).await, "a listener answers");
        assert!(node_answers(closed, Duration::from_secs(60)).await, "a reset is an answer");
        assert!(since.elapsed() < Duration::from_secs(60), "the first answer ends the check, not its wait");
    }

    /// Rank `rank` of a 2-broker instance whose parent listens at `mem://rank0`, in shape kary:2.
    fn options(rank: u32, config: crate::attrs::BrokerConfig) -> BrokerOptions {
        let topo: Topology = "kary:2".parse().expect("a topology");
        BrokerOptions {
            rank,
            size: 2,
            hostname: format!("node{rank}"),
            instance: "mem".into(),
            endpoints: vec!["mem://rank0".into(), "mem://rank1".into()],
            hosts: Vec::new(),
            rundir: PathBuf::from("/nonexistent/vigil-mem"),
            config: crate::attrs::BrokerConfig { topo, ..config },
            initial_program: None,
            resources_override: None,
        }
    }

    /// How long the tests' brokers retry their parent, seconds.
    const CONNECT_TIMEOUT: f64 = 5.0;

    /// The parent's side of a hello, as the driver does it (answers from `upgrades`, then the hello-ack): the
    /// hello it got, and its end of the link with what it runs on.
    async fn answer_one(
        listener: &mut crate::broker::transport::MemListener,
        upgrades: &Upgrades,
    ) -> (Value, Link, LinkChoice) {
        let mut link = listener.accept().await.expect("a connection");
        let Some(LinkEvent::Message(hello)) = link.rx.recv().await else { panic!("no hello") };
        let answers = upgrades.answer(None, &hello.json()).await;
        assert!(answers.refusal().is_none());
        let ack = merge(json!({"rank": 0, "probe_port": null}), answers.ack_fields());
        link.tx.send(Message::control("hello-ack", &ack)).expect("sent");
        let (link, choice) = answers.accept(link).expect("accepted");
        (hello.json(), link, choice)
    }

    /// Two brokers' ends of a parent link over in-memory pipes: the child's hello (with its transports' offers and
    /// an adoption request), the parent's answers, the reasons the link stays on TCP, then messages both ways
    /// through the loop's link set.
    #[tokio::test]
    async fn a_parent_link_over_in_memory_pipes() {
        let config = crate::attrs::BrokerConfig { ofi_provider: "no-such-provider".into(), ..Default::default() };
        let net = MemNetwork::default();
        let mut listener = net.listen("rank0");
        let parent_upgrades = Upgrades::new(&config);
        let parent = tokio::spawn(async move { answer_one(&mut listener, &parent_upgrades).await });
        let child = options(1, config.clone());
        let transport = MemTransport { net, name: "rank1".into() };
        let ParentLink { link, choice, probe } = connect_parent(
            &child,
            CONNECT_TIMEOUT,
            &transport,
            &Upgrades::new(&config),
            &json!({"probe_port": 4242}),
            "mem://rank0",
            Ask::Adoption { lost: 3, last_resort: false },
        )
        .await
        .expect("connected");
        let (hello, p_link, p_choice) = parent.await.expect("parent side");
        assert_eq!(
            (hello["rank"].as_u64(), hello["probe_port"].as_u64(), hello["adopt"].as_u64()),
            (Some(1), Some(4242), Some(3))
        );
        assert!(hello["rdma_unavailable"].is_string() && hello["ofi_unavailable"].is_string(), "{hello}");
        assert_eq!((choice.transport, p_choice.transport), ("tcp", "tcp"));
        assert!(
            choice.detail.starts_with("this side: local address of the overlay connection unknown; "),
            "{}",
            choice.detail
        );
        assert!(p_choice.detail.starts_with("child: "), "{}", p_choice.detail);
        assert!(probe.is_none(), "no socket, no parent address to probe");
        // Messages both ways, each end's receiving half polled by a link set as the driver's loop does.
        let mut child_links = LinkSet::default();
        child_links.insert(Peer::Parent, 0, link.rx);
        let mut parent_links = LinkSet::default();
        parent_links.insert(Peer::Child(1), 7, p_link.rx);
        link.tx.send(Message::request("broker.ping", 0, &json!({}))).expect("sent");
        let ev = std::future::poll_fn(|cx| parent_links.poll_next(cx)).await;
        assert!(matches!(ev, Event::Peer(Peer::Child(1), 7, m) if m.topic == "broker.ping"));
        p_link.tx.send(Message::control("hb", &json!({}))).expect("sent");
        let ev = std::future::poll_fn(|cx| child_links.poll_next(cx)).await;
        assert!(matches!(ev, Event::Peer(Peer::Parent, 0, m) if m.topic == "hb"));
        // The parent goes away: the child's loop sees its link close.
        drop(p_link.tx);
        let ev = std::future::poll_fn(|cx| child_links.poll_next(cx)).await;
        assert!(matches!(ev, Event::PeerClosed(Peer::Parent, 0, _)));
    }

    /// A parent that refuses the child (here: it requires libfabric, which the child cannot offer): the child
    /// gets the parent's reason.
    #[tokio::test]
    async fn a_refused_child_is_told_why() {
        let net = MemNetwork::default();
        let mut listener = net.listen("rank0");
        let strict = crate::attrs::BrokerConfig {
            transport: crate::attrs::Transport::Ofi,
            ofi_provider: "no-such-provider".into(),
            ..Default::default()
        };
        let parent = tokio::spawn(async move {
            let mut link = listener.accept().await.expect("a connection");
            let Some(LinkEvent::Message(hello)) = link.rx.recv().await else { panic!("no hello") };
            let why = Upgrades::new(&strict).answer(None, &hello.json()).await.refusal().expect("refused");
            link.tx.send(Message::control("refused", &json!({"errstr": why}))).expect("sent");
            link
        });
        let config = crate::attrs::BrokerConfig { ofi_provider: "no-such-provider".into(), ..Default::default() };
        let transport = MemTransport { net, name: "rank1".into() };
        let r = connect_parent(
            &options(1, config.clone()),
            CONNECT_TIMEOUT,
            &transport,
            &Upgrades::new(&config),
            &json!({"probe_port": null}),
            "mem://rank0",
            Ask::First { exchanged: false },
        )
        .await;
        let e = r.err().expect("refused");
        assert!(matches!(e, ParentError::Refused { full: false, .. }), "{e:?}");
        assert!(e.to_string().starts_with("parent at mem://rank0 refused us: tbon.transport=ofi but "), "{e}");
        drop(parent.await);
    }
}
