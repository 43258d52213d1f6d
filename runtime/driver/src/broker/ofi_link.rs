//! libfabric (OFI) for overlay links (`tbon.transport=ofi`, or `auto` without a verbs device): Slingshot's `cxi`
//! provider on El Capitan-class machines, `tcp;ofi_rxm` or `verbs;ofi_rxm` elsewhere (docs/slingshot.md).
//!
//! The same pattern as the verbs path (`rdma_link.rs`): every link starts as an authenticated TCP connection;
//! the child puts `"ofi": {"provider", "name"}` (its endpoint's address, base64) in its `hello`, or
//! `"ofi_unavailable": why`; the parent, in the task that read the hello, inserts that name into its own
//! endpoint's address vector and answers `"ofi": {"name"}` in `hello-ack`, or `"ofi_refused": why`. From then on
//! both sides carry every overlay message over libfabric; the TCP connection stays open as the side channel
//! (control messages go on both, so its EOF, reset and kernel ACK state stay liveness signals, as on verbs).
//!
//! One endpoint serves every link of a broker ([`Hub`]), opened at the first link that asks for it, bound to
//! the local address of that link's TCP connection. A task owns it and moves bytes between it and the links:
//! messages from a peer go to that link's receiving half; a send that completes in error
//! ([`vigil_ofi::Event::PeerFailed`]), a fragment that does not parse, an oversized message or a frame that does
//! not decode closes only that link, which the membership machine turns into a lost or suspect peer like any
//! closed link. Only peers inserted from an authenticated hello are heard: the layer drops fragments from
//! sources not in the address vector.
//!
//! Choice per link: `ofi` fails a link that cannot use libfabric (the child exits with the reason, the parent
//! refuses it); `auto` offers ofi only when the verbs path has nothing (no device), so verbs stays the first
//! choice, and falls back to TCP with the reason, shown in `vigil overlay status` and `vigil uptime`.
//!
//! Like the verbs path, this is one implementation of the driver's two seams: [`Settings`] is the libfabric
//! [`FastTransport`] of the hello's upgrade (`upgrade.rs`), tried after verbs, and a link on the endpoint is a
//! [`LinkSend`] / [`LinkRecv`] pair (`transport.rs`).

use super::transport::{Link, LinkChoice, LinkEvent, LinkRecv, LinkRx, LinkSend, LinkTx};
use super::upgrade::{Answer as UpgradeAnswer, FastTransport, Offer as UpgradeOffer, Step, Upgraded, Verdict};
use crate::attrs::Transport;
use crate::message::{Message, MsgType};
use base64::Engine as _;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use tokio::sync::{mpsc, oneshot};
use tracing::{info, warn};
use vigil_ofi::{AsyncEndpoint, Endpoint, Event, PeerId};

/// The longest endpoint name taken from a peer (bytes, decoded): cxi and tcp names are tens of bytes.
const NAME_MAX: usize = 256;

/// Set by [`process_exiting`]: the endpoint is left to the process's end instead of being closed.
static EXITING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Say that the broker process is about to end (with `_exit`, which runs no library destructors): this
/// broker's libfabric endpoint, if one is open, is then not torn down (`fi_close` of the endpoint, its queues,
/// domain and fabric) when its task is dropped. The kernel releases what the provider holds (queue pairs,
/// registered memory, the device's file) when the process ends. libfabric's teardown is the part of it with a
/// history of crashes (ofiwg/libfabric#6414, #11828: connection close racing the peer's own disconnect), and a
/// broker that crashed on its way out after a clean shutdown (CI, `verbs;ofi_rxm` on soft-RoCE, exit 139 after
/// "broker exiting ... code=0") fails the job that shut it down as surely as one that crashed in service.
/// Call it only where the process ends right after; an endpoint dropped in a running process is closed.
pub fn process_exiting() {
    EXITING.store(true, std::sync::atomic::Ordering::Release);
}

/// The endpoint as its task owns it: closed on drop, unless the process is exiting ([`process_exiting`]).
struct Owned(std::mem::ManuallyDrop<AsyncEndpoint>);

impl Drop for Owned {
    fn drop(&mut self) {
        if !EXITING.load(std::sync::atomic::Ordering::Acquire) {
            // SAFETY: dropped once, here; never used afterwards.
            unsafe { std::mem::ManuallyDrop::drop(&mut self.0) }
        }
    }
}

/// `tbon.transport` and `tbon.ofi_provider`, and this broker's endpoint once opened.
#[derive(Debug)]
pub(crate) struct Settings {
    mode: Transport,
    provider: String,
    hub: Mutex<Option<Result<Arc<Hub>, String>>>,
}

impl Settings {
    /// From the broker's config.
    pub(crate) fn new(c: &crate::attrs::BrokerConfig) -> Settings {
        Settings { mode: c.transport, provider: c.ofi_provider.clone(), hub: Mutex::new(None) }
    }

    /// Whether a link may try libfabric, given what the verbs path made of it (`verbs`: it runs on verbs).
    fn wanted(&self, verbs: bool) -> bool {
        match self.mode {
            Transport::Ofi => true,
            Transport::Auto => !verbs,
            Transport::Rdma | Transport::Tcp => false,
        }
    }

    /// This broker's endpoint, opened on `local` at the first call (later calls get the same one, or the same
    /// reason it could not be opened).
    fn hub(&self, local: Option<IpAddr>) -> Result<Arc<Hub>, String> {
        let mut g = self.hub.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(r) = g.as_ref() {
            return r.clone();
        }
        let r = if self.mode == Transport::Auto && self.provider == "cxi" && !cxi_present() {
            // Loading libfabric costs ~0.2 s with some builds (their providers' constructors): not for nothing.
            Err("no Slingshot NIC here (no /sys/class/cxi, /dev/cxi0) for libfabric's cxi provider".to_string())
        } else {
            Hub::open(&self.provider, local)
        };
        match &r {
            Ok(h) => info!("libfabric endpoint open: provider {}, {}", h.provider, h.detail),
            Err(e) => info!("no libfabric links: {e}"),
        }
        *g = Some(r.clone());
        r
    }
}

/// The error a link gets when `tbon.transport=ofi` and libfabric cannot be used (`why`). When the provider is
/// missing, says how to name another: a first trial without a Slingshot NIC meets the default `cxi`.
fn required(why: &str) -> String {
    if why.contains("has no provider") {
        return format!(
            "tbon.transport=ofi but {why}; name another with -S tbon.ofi_provider=NAME (`fi_info -l` lists \
             them; 'tcp;ofi_rxm' works on any machine)"
        );
    }
    format!("tbon.transport=ofi but {why}")
}

/// The libfabric step of the hello (see the module docs), after verbs: considered with `tbon.transport=ofi`,
/// and with `auto` where verbs offers (or accepted) nothing.
impl FastTransport for Settings {
    fn offer(&self, local: Option<IpAddr>, earlier: bool) -> Result<Option<Box<dyn UpgradeOffer>>, String> {
        Ok(Offer::new(self, local, earlier)?.map(|o| Box::new(o) as Box<dyn UpgradeOffer>))
    }

    fn answer<'a>(
        &'a self,
        local: Option<IpAddr>,
        hello: &'a Value,
        earlier: bool,
    ) -> Step<'a, Option<Box<dyn UpgradeAnswer>>> {
        Box::pin(async move {
            Answer::new(self, local, hello, earlier).await.map(|a| Box::new(a) as Box<dyn UpgradeAnswer>)
        })
    }
}

/// Whether this node has a Cassini NIC for the `cxi` provider (its driver's class directory or device node).
fn cxi_present() -> bool {
    std::path::Path::new("/sys/class/cxi").exists() || std::path::Path::new("/dev/cxi0").exists()
}

/// A broker's one libfabric endpoint, owned by its task.
#[derive(Debug)]
pub(crate) struct Hub {
    cmd: mpsc::UnboundedSender<Cmd>,
    /// Our endpoint's name (`fi_getname`).
    name: Vec<u8>,
    provider: String,
    /// Fabric and domain, for status output.
    detail: String,
}

/// Set once a peer has been heard over libfabric: it has our address in its address vector, so what we send it
/// there is not dropped as from an unknown source.
type Heard = Arc<std::sync::atomic::AtomicBool>;

enum Cmd {
    Insert {
        name: Vec<u8>,
        events: mpsc::UnboundedSender<LinkEvent>,
        heard: Heard,
        reply: oneshot::Sender<Result<PeerId, String>>,
    },
    Send(PeerId, Vec<u8>),
    Remove(PeerId),
}

impl Hub {
    fn open(provider: &str, local: Option<IpAddr>) -> Result<Arc<Hub>, String> {
        let mut cfg = vigil_ofi::Config::with_provider(provider);
        cfg.source_addr = local.map(|ip| ip.to_string());
        let ep = Endpoint::open(&cfg).map_err(|e| match e {
            // Said on every link's status line in auto mode: kept short, the command to see more given.
            vigil_ofi::OpenError::NoProvider { provider, .. } => {
                format!(
                    "libfabric has no provider '{provider}' for reliable datagrams here (`fi_info -p '{provider}'`)"
                )
            }
            e => e.to_string(),
        })?;
        let name = ep.name().map_err(|e| e.to_string())?;
        let (fabric, domain) = ep.fabric_domain();
        let detail = format!("fabric {fabric} domain {domain} address {}", ep.name_to_string(&name));
        let provider = ep.provider().to_string();
        let ep = AsyncEndpoint::new(ep).map_err(|e| e.to_string())?;
        let (cmd, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(ep, rx));
        Ok(Arc::new(Hub { cmd, name, provider, detail }))
    }

    /// Insert a peer's endpoint name; its messages go to the returned receiver, and the flag is set once one came.
    async fn insert(&self, name: Vec<u8>) -> Result<(PeerId, mpsc::UnboundedReceiver<LinkEvent>, Heard), String> {
        let (events, rx) = mpsc::unbounded_channel();
        let (reply, answer) = oneshot::channel();
        let heard = Heard::default();
        self.cmd
            .send(Cmd::Insert { name, events, heard: heard.clone(), reply })
            .map_err(|_| "libfabric endpoint task ended".to_string())?;
        let peer = answer.await.map_err(|_| "libfabric endpoint task ended".to_string())??;
        Ok((peer, rx, heard))
    }

    fn choice(&self) -> LinkChoice {
        LinkChoice { transport: "ofi", detail: format!("provider {}, {}", self.provider, self.detail) }
    }
}

/// The endpoint's task: commands from the links, events to them.
async fn run(ep: AsyncEndpoint, mut rx: mpsc::UnboundedReceiver<Cmd>) {
    let mut owned = Owned(std::mem::ManuallyDrop::new(ep));
    let ep: &mut AsyncEndpoint = &mut owned.0;
    type Peers = HashMap<PeerId, (mpsc::UnboundedSender<LinkEvent>, Heard)>;
    let mut peers: Peers = HashMap::new();
    let close = |peers: &mut Peers, p: PeerId, why: String| {
        if let Some((tx, _)) = peers.remove(&p) {
            let _ = tx.send(LinkEvent::Closed(why));
        }
    };
    loop {
        tokio::select! {
            cmd = rx.recv() => match cmd {
                None => break,
                Some(Cmd::Insert { name, events, heard, reply }) => {
                    let r = ep.get_mut().insert_peer(&name).map_err(|e| e.to_string());
                    if let Ok(p) = r {
                        peers.insert(p, (events, heard));
                    }
                    let _ = reply.send(r);
                }
                Some(Cmd::Send(p, data)) => {
                    if !peers.contains_key(&p) {
                        continue;
                    }
                    if let Err(e) = ep.send(p, &data).await {
                        close(&mut peers, p, format!("ofi: {e}"));
                    }
                }
                Some(Cmd::Remove(p)) => {
                    peers.remove(&p);
                    let _ = ep.get_mut().remove_peer(p);
                }
            },
            ev = ep.next_event() => match ev {
                Ok(Event::Message { from, data }) => {
                    let ev = match Message::decode_frame_owned(data) {
                        Ok(m) => LinkEvent::Message(m),
                        Err(e) => LinkEvent::Closed(format!("ofi: {e}")),
                    };
                    let closed = matches!(ev, LinkEvent::Closed(_));
                    if let Some((tx, heard)) = peers.get(&from) {
                        heard.store(true, std::sync::atomic::Ordering::Release);
                        let _ = tx.send(ev);
                    }
                    if closed {
                        peers.remove(&from);
                    }
                }
                Ok(Event::PeerFailed { peer, error }) => close(&mut peers, peer, format!("ofi: send failed: {error}")),
                Ok(Event::Oversized { from, len }) => {
                    close(&mut peers, from, format!("ofi: message of more than {len} bytes"))
                }
                Ok(Event::Malformed { from }) => close(&mut peers, from, "ofi: malformed fragment".into()),
                Ok(Event::RecvFailed { error }) => warn!("libfabric receive failed: {error}"),
                Err(e) => {
                    warn!("libfabric endpoint failed: {e}; its links close");
                    for (_, (tx, _)) in peers.drain() {
                        let _ = tx.send(LinkEvent::Closed(format!("ofi: {e}")));
                    }
                    break;
                }
            },
        }
    }
}

/// The `ofi` field of a hello or hello-ack: the peer's endpoint name, decoded and bounded.
fn peer_name(fields: &Value) -> Result<Vec<u8>, String> {
    let s = fields.get("name").and_then(Value::as_str).ok_or("no endpoint name")?;
    if s.len() > NAME_MAX * 2 {
        return Err("endpoint name too long".into());
    }
    let name = base64::engine::general_purpose::STANDARD.decode(s).map_err(|_| "endpoint name is not base64")?;
    if name.is_empty() || name.len() > NAME_MAX {
        return Err("endpoint name of a bad length".into());
    }
    Ok(name)
}

fn encode_name(name: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(name)
}

/// Child side, before the hello: what to offer.
pub(crate) struct Offer {
    hub: Result<Arc<Hub>, String>,
    mode: Transport,
}

impl Offer {
    /// `verbs`: the verbs path has a queue pair to offer on this link. Err when `tbon.transport=ofi` and no
    /// endpoint can be had.
    pub(crate) fn new(s: &Settings, local: Option<IpAddr>, verbs: bool) -> Result<Option<Offer>, String> {
        if !s.wanted(verbs) {
            return Ok(None);
        }
        let hub = s.hub(local);
        if let (Err(e), Transport::Ofi) = (&hub, s.mode) {
            return Err(required(e));
        }
        Ok(Some(Offer { hub, mode: s.mode }))
    }

    /// After the hello-ack: the link over libfabric, or the link back to stay on TCP (with the reason), or Err
    /// when `tbon.transport=ofi` and it cannot be had.
    async fn finish_link(self, ack: &Value, link: Link) -> Result<Upgraded, String> {
        let r = match (&self.hub, ack.get("ofi")) {
            (Err(e), _) => Err(format!("this side: {e}")),
            (Ok(h), Some(f)) => match peer_name(f) {
                Ok(name) => h.insert(name).await.map(|(p, rx, heard)| (h.clone(), p, rx, heard)),
                Err(e) => Err(format!("parent's ofi answer: {e}")),
            },
            (Ok(_), None) => Err(match ack.get("ofi_refused").and_then(Value::as_str) {
                Some(why) => format!("parent: {}", why.chars().take(200).collect::<String>()),
                None => "parent did not answer the ofi offer".into(),
            }),
        };
        match r {
            Ok((hub, peer, rx, heard)) => {
                let choice = hub.choice();
                // The parent has our address (it answered after inserting it): send there at once, starting with
                // a heartbeat that tells it we have its address too.
                heard.store(true, std::sync::atomic::Ordering::Release);
                let link = bridge(hub, peer, rx, heard, link);
                let _ = link.tx.send(Message::control("hb", &json!({})));
                Ok(Upgraded::Moved(link, choice))
            }
            Err(e) if self.mode == Transport::Ofi => Err(required(&e)),
            Err(e) => Ok(Upgraded::Stayed(link, e)),
        }
    }
}

impl UpgradeOffer for Offer {
    fn hello_fields(&self) -> Value {
        match &self.hub {
            Ok(h) => json!({"ofi": {"provider": h.provider, "name": encode_name(&h.name)}}),
            Err(e) => json!({"ofi_unavailable": e}),
        }
    }

    fn offers(&self) -> bool {
        self.hub.is_ok()
    }

    fn finish<'a>(self: Box<Self>, ack: &'a Value, link: Link) -> Step<'a, Result<Upgraded, String>> {
        Box::pin((*self).finish_link(ack, link))
    }
}

/// Parent side: the answer to a child's ofi offer.
pub(crate) enum Answer {
    /// The child's endpoint is in our address vector (ours is not in its yet: `heard` says when it is).
    Ofi { hub: Arc<Hub>, peer: PeerId, rx: mpsc::UnboundedReceiver<LinkEvent>, heard: Heard },
    /// Stay on TCP, for this reason.
    Tcp(String),
    /// `tbon.transport=ofi` and libfabric cannot be used: refuse the child.
    Refuse(String),
}

impl std::fmt::Debug for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Answer::Ofi { peer, .. } => write!(f, "Ofi({peer})"),
            Answer::Tcp(why) => write!(f, "Tcp({why})"),
            Answer::Refuse(why) => write!(f, "Refuse({why})"),
        }
    }
}

impl Answer {
    /// Decide from the hello and our endpoint on `local` (`verbs`: the link runs on verbs already). None when
    /// this link does not consider libfabric at all.
    pub(crate) async fn new(s: &Settings, local: Option<IpAddr>, hello: &Value, verbs: bool) -> Option<Answer> {
        if !s.wanted(verbs) {
            return None;
        }
        let r = match hello.get("ofi") {
            Some(f) => match (peer_name(f), s.hub(local)) {
                (Err(e), _) => Err(format!("child's ofi offer: {e}")),
                (_, Err(e)) => Err(e),
                (Ok(name), Ok(h)) => {
                    h.insert(name).await.map(|(peer, rx, heard)| Answer::Ofi { hub: h.clone(), peer, rx, heard })
                }
            },
            None => Err(match hello.get("ofi_unavailable").and_then(Value::as_str) {
                Some(why) => format!("child: {}", why.chars().take(200).collect::<String>()),
                None => "child made no ofi offer".into(),
            }),
        };
        Some(match r {
            Ok(a) => a,
            Err(e) if s.mode == Transport::Ofi => Answer::Refuse(required(&e)),
            Err(e) => Answer::Tcp(e),
        })
    }
}

impl UpgradeAnswer for Answer {
    fn ack_fields(&self) -> Value {
        match self {
            Answer::Ofi { hub, .. } => json!({"ofi": {"name": encode_name(&hub.name)}}),
            Answer::Tcp(why) | Answer::Refuse(why) => json!({"ofi_refused": why}),
        }
    }

    fn verdict(&self) -> Verdict<'_> {
        match self {
            Answer::Ofi { .. } => Verdict::Accept,
            Answer::Tcp(why) => Verdict::Decline(why),
            Answer::Refuse(why) => Verdict::Refuse(why),
        }
    }

    fn accept(self: Box<Self>, link: Link) -> (Link, LinkChoice) {
        match *self {
            Answer::Ofi { hub, peer, rx, heard } => {
                let choice = hub.choice();
                (bridge(hub, peer, rx, heard, link), choice)
            }
            Answer::Tcp(why) | Answer::Refuse(why) => (link, LinkChoice::tcp(why)),
        }
    }
}

/// Carry a link's messages over libfabric to `peer`, keeping its TCP connection (the link's halves as they
/// were) as the side channel. Until the peer has been heard over libfabric (`heard`), messages go on TCP: the
/// peer may not have our address yet, and libfabric would drop what we sent as from an unknown source.
fn bridge(hub: Arc<Hub>, peer: PeerId, rx: mpsc::UnboundedReceiver<LinkEvent>, heard: Heard, link: Link) -> Link {
    let Link { tx: tcp_tx, rx: tcp_rx, peer: addr, sock, tasks } = link;
    let tx = LinkTx::new(OfiTx { hub: hub.clone(), peer, heard, tcp: tcp_tx });
    let rx = LinkRx::new(OfiRx { hub, peer, rx, tcp: tcp_rx, done: false });
    Link { tx, rx, peer: addr, sock, tasks }
}

/// Sending half of an ofi link.
#[derive(Debug)]
pub(crate) struct OfiTx {
    hub: Arc<Hub>,
    peer: PeerId,
    heard: Heard,
    tcp: LinkTx,
}

impl LinkSend for OfiTx {
    /// Encode `m` and hand it to the endpoint's task (queued there while the provider's queues are full).
    /// Control messages (heartbeats, goodbye, shutdown) also go on TCP. Gives `m` back once the endpoint's task
    /// has ended.
    fn send(&self, m: Message) -> Result<(), Message> {
        if !self.heard.load(std::sync::atomic::Ordering::Acquire) {
            return self.tcp.send(m);
        }
        if m.msgtype == MsgType::Control {
            let _ = self.tcp.send(m.clone());
        }
        self.hub.cmd.send(Cmd::Send(self.peer, m.encode())).map_err(|_| m)
    }
}

/// Receiving half of an ofi link: its libfabric messages merged with the TCP side channel's.
#[derive(Debug)]
pub(crate) struct OfiRx {
    hub: Arc<Hub>,
    peer: PeerId,
    rx: mpsc::UnboundedReceiver<LinkEvent>,
    tcp: LinkRx,
    done: bool,
}

impl LinkRecv for OfiRx {
    /// The next message from either path, or `Closed` with the first reason either gives; then None.
    fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<LinkEvent>> {
        if self.done {
            return Poll::Ready(None);
        }
        let ev = match self.rx.poll_recv(cx) {
            Poll::Ready(ev) => ev.unwrap_or_else(|| LinkEvent::Closed("ofi: endpoint task ended".into())),
            Poll::Pending => match self.tcp.poll_recv(cx) {
                Poll::Ready(Some(ev)) => ev,
                Poll::Ready(None) => LinkEvent::Closed("tcp side channel dropped".into()),
                Poll::Pending => return Poll::Pending,
            },
        };
        self.done = matches!(ev, LinkEvent::Closed(_));
        Poll::Ready(Some(ev))
    }
}

impl Drop for OfiRx {
    fn drop(&mut self) {
        // The peer leaves our address vector with its link.
        let _ = self.hub.cmd.send(Cmd::Remove(self.peer));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(mode: Transport, provider: &str) -> Settings {
        let c = crate::attrs::BrokerConfig { transport: mode, ofi_provider: provider.into(), ..Default::default() };
        Settings::new(&c)
    }

    #[test]
    fn verbs_stays_first_and_tcp_never_tries() {
        assert!(settings(Transport::Auto, "cxi").wanted(false));
        assert!(!settings(Transport::Auto, "cxi").wanted(true), "a link on verbs does not offer ofi");
        assert!(settings(Transport::Ofi, "cxi").wanted(true));
        assert!(!settings(Transport::Tcp, "cxi").wanted(false));
        assert!(!settings(Transport::Rdma, "cxi").wanted(false));
    }

    #[test]
    fn a_bad_endpoint_name_is_a_reason_not_a_panic() {
        for bad in [
            json!({}),
            json!({"name": 5}),
            json!({"name": "***"}),
            json!({"name": ""}),
            json!({"name": "A".repeat(600)}),
        ] {
            assert!(peer_name(&bad).is_err(), "{bad}");
        }
        assert_eq!(peer_name(&json!({"name": encode_name(b"abc")})), Ok(b"abc".to_vec()));
    }

    /// `auto` without the provider falls back to TCP with libfabric's reason; `ofi` fails the link with it.
    #[tokio::test]
    async fn a_provider_that_is_not_there_falls_back_or_fails() {
        let s = settings(Transport::Auto, "no-such-provider");
        let offer = Offer::new(&s, None, false).unwrap().expect("auto considers ofi");
        let f = offer.hello_fields();
        assert!(f["ofi_unavailable"].as_str().is_some(), "{f}");
        let a = Answer::new(&s, None, &f, false).await.expect("considered");
        assert!(matches!(&a, Answer::Tcp(why) if why.starts_with("child: ")), "{a:?}");
        let s = settings(Transport::Ofi, "no-such-provider");
        let e = Offer::new(&s, None, false).err().expect("ofi is required");
        assert!(e.starts_with("tbon.transport=ofi but "), "{e}");
        assert!(e.ends_with("'tcp;ofi_rxm' works on any machine)"), "the way out is named: {e}");
        let a = Answer::new(&s, None, &f, false).await.expect("considered");
        assert!(matches!(&a, Answer::Refuse(why) if why.starts_with("tbon.transport=ofi but")), "{a:?}");
    }
}
