//! RDMA verbs for overlay links, chosen per link (`tbon.transport=auto|rdma|ofi|tcp`, default auto; ofi is `ofi_link.rs`).
//!
//! Every overlay link starts as TCP. The child puts an offer in its `hello` when a verbs device serves the local
//! address of its TCP connection: `"rdma": LocalInfo` (QP number, GID, PSN, ring depth...; see
//! [`vigil_rdma::LocalInfo`]), or `"rdma_unavailable": reason`. The parent, in the task that read the hello,
//! looks for a device serving its own end of the connection; if it has one it connects a QP to the offer and
//! answers in `hello-ack` with `"rdma": LocalInfo`, else with `"rdma_refused": reason`. From then on both sides
//! carry every overlay message over the QP; the TCP connection stays open as a side channel: control messages
//! (heartbeats, goodbye, shutdown) are sent on it too, so its EOF, reset or `TCP_USER_TIMEOUT` and the kernel
//! ACK state keep working as liveness signals, and a goodbye is never lost behind a QP that the exiting process
//! destroys. A QP error (`IBV_WC_RETRY_EXC_ERR` ~40 ms after the peer stops answering with the default
//! `tbon.rdma_timeout` 12 / `tbon.rdma_retry_cnt` 1) or a fatal async event closes the link, which the
//! membership machine turns into a lost peer.
//!
//! `tbon.transport=rdma` fails a link that cannot use RDMA (the child exits with the reason, the parent refuses
//! the child); `tcp` never tries. The choice of each link and the reason for a TCP fallback are logged once and
//! shown by `vigil overlay status` and `vigil uptime` (each child reports its parent link to rank 0 with
//! `overlay.transport`).
//!
//! This is one implementation of the driver's two seams: [`Settings`] is the verbs [`FastTransport`] of the
//! hello's upgrade (`upgrade.rs`), and a link on a QP is a [`LinkSend`] / [`LinkRecv`] pair (`transport.rs`).
//! Busy polling (`tbon.rdma_poll=busy`) lives in the receiving half ([`RdmaRx`]): the driver polls every link's
//! receiving half from its own loop, and a busy-polling one polls its completion queue there, once per pass of
//! the runtime, asking to be polled again after the other ready tasks (see [`RdmaRx`]).

use super::transport::{Link, LinkChoice, LinkEvent, LinkRecv, LinkRx, LinkSend, LinkTx};
use super::upgrade::{Answer as UpgradeAnswer, FastTransport, Offer as UpgradeOffer, Step, Upgraded, Verdict};
use crate::message::{packed, Message, MsgType};
use serde_json::{json, Value};
use std::net::IpAddr;
use std::task::{Context, Poll};
use vigil_rdma::{Config, Connection, Endpoint, LocalInfo, Prepared};

/// `tbon.transport`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// RDMA where both ends have a device serving the link's addresses, else TCP.
    Auto,
    /// RDMA or fail the link.
    Rdma,
    /// Never try RDMA.
    Tcp,
}

/// How overlay messages are encoded on an RDMA link (`tbon.rdma_frame`), agreed per link in the hello.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Framing {
    /// The full frame of every link (length prefix, 28-byte header: `Message::encode`).
    Full,
    /// [`crate::message::packed`]: no length prefix (the QP delimits messages), only the header fields that
    /// differ from their defaults, as varints. Used when both ends offer it (the default).
    Packed,
}

/// Hello / hello-ack field naming the framing a side offers or accepts.
const FRAME_FIELD: &str = "rdma_frame";

impl Framing {
    /// The framing both ends agree on: packed when `ours` is and the peer's payload `fields` says so too.
    fn agree(ours: Framing, fields: &Value) -> Framing {
        match (ours, fields.get(FRAME_FIELD).and_then(Value::as_str)) {
            (Framing::Packed, Some("packed")) => Framing::Packed,
            _ => Framing::Full,
        }
    }

    fn field(self) -> Value {
        match self {
            Framing::Packed => json!("packed"),
            Framing::Full => json!("full"),
        }
    }

    fn encoded_len(self, m: &Message) -> usize {
        match self {
            Framing::Packed => packed::encoded_len(m),
            Framing::Full => m.encoded_len(),
        }
    }

    fn encode_into(self, m: &Message, out: &mut [u8]) {
        match self {
            Framing::Packed => packed::encode_into(m, out),
            Framing::Full => m.encode_into(out),
        }
    }

    fn decode(self, b: Vec<u8>) -> Result<Message, crate::message::DecodeError> {
        match self {
            Framing::Packed => packed::decode_owned(b),
            Framing::Full => Message::decode_frame_owned(b),
        }
    }
}

/// Transport settings from the attributes.
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    pub mode: Mode,
    pub cfg: Config,
    /// `tbon.rdma_frame`: the framing this broker offers or accepts.
    pub framing: Framing,
}

impl Settings {
    /// The transport settings of a broker's config: `tbon.transport`, the QP settings `tbon.rdma_timeout`,
    /// `tbon.rdma_retry_cnt`, `tbon.rdma_poll` and `tbon.rdma_max_inline` (checked by
    /// [`crate::attrs::BrokerConfig::parse`]), and `tbon.rdma_frame`.
    pub(crate) fn new(c: &crate::attrs::BrokerConfig) -> Settings {
        use crate::attrs::{RdmaFrame, Transport};
        let mode = match c.transport {
            Transport::Auto => Mode::Auto,
            Transport::Rdma => Mode::Rdma,
            Transport::Tcp | Transport::Ofi => Mode::Tcp,
        };
        let framing = match c.rdma_frame {
            RdmaFrame::Packed => Framing::Packed,
            RdmaFrame::Full => Framing::Full,
        };
        Settings { mode, cfg: c.rdma.clone(), framing }
    }
}

fn rdma_choice(c: &Connection) -> LinkChoice {
    LinkChoice {
        transport: "rdma",
        detail: format!("{} port {} gid {} ({})", c.device.name, c.device.port, c.device.gid_index, c.device.gid),
    }
}

/// The verbs step of the hello (see the module docs): always considered first, and always in the hello and
/// hello-ack (with `tbon.transport=tcp` or `ofi`, as the reason it is not used).
impl FastTransport for Settings {
    fn offer(&self, local: Option<IpAddr>, _earlier: bool) -> Result<Option<Box<dyn UpgradeOffer>>, String> {
        Ok(Some(Box::new(Offer::new(self, local)?)))
    }

    fn answer<'a>(
        &'a self,
        local: Option<IpAddr>,
        hello: &'a Value,
        _earlier: bool,
    ) -> Step<'a, Option<Box<dyn UpgradeAnswer>>> {
        // Opening a device and connecting a QP takes milliseconds: done here, in the task that read the hello.
        let a = Answer::new(self, local, hello);
        Box::pin(std::future::ready(Some(Box::new(a) as Box<dyn UpgradeAnswer>)))
    }
}

/// Child side, before the hello: what to offer.
#[derive(Debug)]
pub(crate) struct Offer {
    prepared: Option<Prepared>,
    why_not: String,
    framing: Framing,
    mode: Mode,
    /// `tbon.rdma_poll=busy`.
    busy: bool,
}

impl Offer {
    /// Prepare a QP if a device serves `local`. Err when `tbon.transport=rdma` and none can be used.
    pub(crate) fn new(s: &Settings, local: Option<IpAddr>) -> Result<Offer, String> {
        let offer =
            |prepared, why_not| Offer { prepared, why_not, framing: s.framing, mode: s.mode, busy: s.cfg.busy_poll };
        if s.mode == Mode::Tcp {
            return Ok(offer(None, "tbon.transport=tcp".into()));
        }
        let r = local
            .ok_or_else(|| "local address of the overlay connection unknown".to_string())
            .and_then(|ip| vigil_rdma::find_device(ip).map_err(|e| e.to_string()))
            .and_then(|d| Endpoint::prepare(&d, s.cfg.clone()).map_err(|e| e.to_string()));
        match r {
            Ok((p, _)) => Ok(offer(Some(p), String::new())),
            Err(e) if s.mode == Mode::Rdma => Err(format!("tbon.transport=rdma but {e}")),
            Err(e) => Ok(offer(None, e)),
        }
    }

    /// After the hello-ack: connect the QP to the parent's answer (with the framing the answer agreed to), or
    /// fall back to TCP with the reason.
    fn connect(self, ack: &Value) -> Result<(Option<(Connection, Framing)>, LinkChoice), String> {
        let res = match (self.prepared, ack.get("rdma")) {
            (None, _) => Err(format!("this side: {}", self.why_not)),
            (Some(p), Some(info)) => serde_json::from_value::<LocalInfo>(info.clone())
                .map_err(|e| format!("parent's rdma answer is malformed: {e}"))
                .and_then(|info| p.connect(&info).map_err(|e| e.to_string())),
            (Some(_), None) => Err(match ack.get("rdma_refused").and_then(Value::as_str) {
                Some(why) => format!("parent: {why}"),
                None => "parent did not answer the rdma offer".into(),
            }),
        };
        match res {
            Ok(c) => {
                let choice = rdma_choice(&c);
                Ok((Some((c, Framing::agree(self.framing, ack))), choice))
            }
            Err(e) if self.mode == Mode::Rdma => Err(format!("tbon.transport=rdma but {e}")),
            // Said where it shows (logs, overlay status, uptime): the busy polling asked for does not happen.
            Err(e) if self.busy => {
                Ok((None, LinkChoice::tcp(format!("{e}; tbon.rdma_poll=busy has no effect on TCP"))))
            }
            Err(e) => Ok((None, LinkChoice::tcp(e))),
        }
    }
}

impl UpgradeOffer for Offer {
    fn hello_fields(&self) -> Value {
        match &self.prepared {
            Some(p) => json!({"rdma": p.local_info(), FRAME_FIELD: self.framing.field()}),
            None => json!({"rdma_unavailable": self.why_not}),
        }
    }

    fn offers(&self) -> bool {
        self.prepared.is_some()
    }

    fn finish<'a>(self: Box<Self>, ack: &'a Value, link: Link) -> Step<'a, Result<Upgraded, String>> {
        let r = (*self).connect(ack).map(|(conn, choice)| match conn {
            Some((conn, framing)) => Upgraded::Moved(bridge(link, conn, framing), choice),
            None => Upgraded::Stayed(link, choice.detail),
        });
        Box::pin(std::future::ready(r))
    }
}

/// Parent side: the answer to a child's hello.
pub(crate) enum Answer {
    /// A connected QP (passive side: it sends once the child's first packet arrives), and the framing agreed.
    Rdma(Box<Connection>, Framing, LinkChoice),
    /// Stay on TCP, for this reason.
    Tcp(LinkChoice),
    /// `tbon.transport=rdma` and RDMA is impossible: refuse the child.
    Refuse(String),
}

impl Answer {
    /// Decide from the hello's offer and a device serving `local` (our end of the connection).
    pub(crate) fn new(s: &Settings, local: Option<IpAddr>, hello: &Value) -> Answer {
        let res: Result<Connection, String> = if s.mode == Mode::Tcp {
            Err("tbon.transport=tcp".into())
        } else if let Some(offer) = hello.get("rdma") {
            serde_json::from_value::<LocalInfo>(offer.clone())
                .map_err(|e| format!("child's rdma offer is malformed: {e}"))
                .and_then(|info| {
                    let ip = local.ok_or_else(|| "local address of the overlay connection unknown".to_string())?;
                    let dev = vigil_rdma::find_device(ip).map_err(|e| e.to_string())?;
                    let (p, _) = Endpoint::prepare(&dev, s.cfg.clone()).map_err(|e| e.to_string())?;
                    p.accept(&info).map_err(|e| e.to_string())
                })
        } else {
            Err(match hello.get("rdma_unavailable").and_then(Value::as_str) {
                // The child's own words, kept to a line: they are logged and shown in status output.
                Some(why) => format!("child: {}", why.chars().take(200).collect::<String>()),
                None => "child made no rdma offer".into(),
            })
        };
        match res {
            Ok(c) => {
                let choice = rdma_choice(&c);
                Answer::Rdma(Box::new(c), Framing::agree(s.framing, hello), choice)
            }
            Err(e) if s.mode == Mode::Rdma => Answer::Refuse(format!("tbon.transport=rdma but {e}")),
            Err(e) => Answer::Tcp(LinkChoice::tcp(e)),
        }
    }
}

impl std::fmt::Debug for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Answer::Rdma(_, framing, c) => write!(f, "Rdma({}, {framing:?})", c.detail),
            Answer::Tcp(c) => write!(f, "Tcp({})", c.detail),
            Answer::Refuse(why) => write!(f, "Refuse({why})"),
        }
    }
}

impl UpgradeAnswer for Answer {
    fn ack_fields(&self) -> Value {
        match self {
            Answer::Rdma(c, f, _) => json!({"rdma": c.local, FRAME_FIELD: f.field()}),
            Answer::Tcp(c) => json!({"rdma_refused": c.detail}),
            Answer::Refuse(why) => json!({"rdma_refused": why}),
        }
    }

    fn verdict(&self) -> Verdict<'_> {
        match self {
            Answer::Rdma(..) => Verdict::Accept,
            Answer::Tcp(c) => Verdict::Decline(&c.detail),
            Answer::Refuse(why) => Verdict::Refuse(why),
        }
    }

    fn accept(self: Box<Self>, link: Link) -> (Link, LinkChoice) {
        match *self {
            Answer::Rdma(c, framing, choice) => (bridge(link, *c, framing), choice),
            Answer::Tcp(c) => (link, c),
            Answer::Refuse(why) => (link, LinkChoice::tcp(why)),
        }
    }
}

/// Carry a link's messages over `conn`, keeping its TCP connection (the link's halves as they were) as the
/// side channel; the link's socket and tasks stay those of its TCP connection. No task is involved: the sender
/// encodes and posts from the caller's task, and the receiver takes and decodes messages in the task that polls
/// the link (the broker's loop).
pub(crate) fn bridge(link: Link, conn: Connection, framing: Framing) -> Link {
    let Link { tx: tcp_tx, rx: tcp_rx, peer, sock, tasks } = link;
    let (sender, receiver) = conn.split();
    let tx = LinkTx::new(RdmaTx { sender, tcp: tcp_tx, framing });
    let rx = LinkRx::new(RdmaRx { receiver, tcp: tcp_rx, done: false, framing });
    Link { tx, rx, peer, sock, tasks }
}

/// Sending half of an RDMA link.
#[derive(Debug)]
pub(crate) struct RdmaTx {
    sender: vigil_rdma::Sender,
    tcp: LinkTx,
    framing: Framing,
}

impl LinkSend for RdmaTx {
    /// Encode and post `m` (queued while the peer has no credits: unbounded, like a TCP link's queue).
    /// Control messages (heartbeats, goodbye, shutdown) also go on TCP: liveness signals and ordered
    /// goodbyes. Gives `m` back once the connection has ended (the receiving half reports why).
    fn send(&self, m: Message) -> Result<(), Message> {
        if m.msgtype == MsgType::Control {
            let _ = self.tcp.send(m.clone());
        }
        // Encoded straight into a registered send buffer when it can go at once.
        let f = self.framing;
        match self.sender.send_now_with(f.encoded_len(&m), |b| f.encode_into(&m, b)) {
            Ok(()) => Ok(()),
            Err(_) => Err(m),
        }
    }
}

/// Receiving half of an RDMA link: QP messages merged with the TCP side channel's.
///
/// With `tbon.rdma_poll=busy` this is where the busy polling happens. The broker's loop polls every link's
/// receiving half itself (`link_set.rs`); each time it polls this one, [`vigil_rdma::Receiver::poll_recv`]
/// polls the completion queue once (no system call) and, finding nothing, wakes the loop's task at once, so the
/// loop comes back after the runtime's other ready tasks and polls again. The budget is one completion-queue
/// poll per pass of the runtime: the loop never spins without letting the link readers, local clients and
/// timers run, and a message that arrives is the loop's in the next pass, without a wake-up (no eventfd, no
/// completion channel) and without a hand-off between tasks. While the loop has other inputs it handles them
/// between passes; the cost is one core kept busy while a busy link is open, as `tbon.rdma_poll` says.
#[derive(Debug)]
pub(crate) struct RdmaRx {
    receiver: vigil_rdma::Receiver,
    tcp: LinkRx,
    /// `Closed` has been reported.
    done: bool,
    framing: Framing,
}

impl LinkRecv for RdmaRx {
    /// The next message from either path, or `Closed` with the first reason either path gives (a QP error,
    /// a frame that does not decode, the TCP connection's end); then None.
    fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<LinkEvent>> {
        if self.done {
            return Poll::Ready(None);
        }
        let ev = match self.receiver.poll_recv(cx) {
            Poll::Ready(Ok(frame)) => match self.framing.decode(frame) {
                Ok(m) => LinkEvent::Message(m),
                Err(e) => LinkEvent::Closed(format!("rdma: {e}")),
            },
            Poll::Ready(Err(e)) => LinkEvent::Closed(e.to_string()),
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn attrs(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    /// The settings of a broker started with these `-S` attributes, or the attribute error.
    fn settings(attrs: &BTreeMap<String, String>) -> Result<Settings, String> {
        crate::attrs::BrokerConfig::parse(attrs).map(|c| Settings::new(&c)).map_err(|e| e.to_string())
    }

    #[test]
    fn settings_parse_and_refuse_forever() {
        let s = settings(&attrs(&[])).unwrap();
        assert_eq!(s.mode, Mode::Auto);
        assert_eq!((s.cfg.timeout, s.cfg.retry_cnt), (12, 1));
        assert_eq!(settings(&attrs(&[("tbon.transport", "rdma")])).unwrap().mode, Mode::Rdma);
        assert!(settings(&attrs(&[("tbon.transport", "ib")])).unwrap_err().contains("auto, rdma, ofi or tcp"));
        assert!(settings(&attrs(&[("tbon.rdma_retry_cnt", "7")])).unwrap_err().contains("forever"));
        assert!(settings(&attrs(&[("tbon.rdma_timeout", "0")]))
            .unwrap_err()
            .starts_with("invalid tbon.rdma_timeout '0': "));
        assert!(settings(&attrs(&[("tbon.rdma_retry_cnt", "0")]))
            .unwrap_err()
            .starts_with("invalid tbon.rdma_retry_cnt '0': "));
        assert!(settings(&attrs(&[("tbon.rdma_timeout", "x")])).is_err());
        let s = settings(&attrs(&[("tbon.rdma_timeout", "14"), ("tbon.rdma_retry_cnt", "2")])).unwrap();
        assert_eq!((s.cfg.timeout, s.cfg.retry_cnt), (14, 2));
        assert_eq!(settings(&attrs(&[])).unwrap().cfg.max_inline, 236);
        assert_eq!(settings(&attrs(&[("tbon.rdma_max_inline", "0")])).unwrap().cfg.max_inline, 0);
        let e = settings(&attrs(&[("tbon.rdma_max_inline", "4096")])).unwrap_err();
        assert!(e.starts_with("invalid tbon.rdma_max_inline '4096': "), "{e}");
        assert!(settings(&attrs(&[("tbon.rdma_max_inline", "-1")])).is_err());
    }

    #[test]
    fn auto_falls_back_with_a_reason_on_loopback() {
        let s = settings(&attrs(&[])).unwrap();
        let offer = Offer::new(&s, Some("127.0.0.1".parse().unwrap())).unwrap();
        let f = offer.hello_fields();
        let why = f["rdma_unavailable"].as_str().unwrap().to_string();
        assert!(why.contains("no verbs devices") || why.contains("127.0.0.1"), "{why}");
        // The parent sees no offer and answers with a refusal that names the child's reason.
        let a = Answer::new(&s, Some("127.0.0.1".parse().unwrap()), &f);
        let Answer::Tcp(c) = &a else { panic!("expected tcp") };
        assert!(c.detail.starts_with("child: "), "{}", c.detail);
        let (conn, choice) = offer.connect(&a.ack_fields()).unwrap();
        assert!(conn.is_none());
        assert_eq!(choice.transport, "tcp");
        assert!(choice.detail.contains("this side"), "{}", choice.detail);
        assert!(!choice.detail.contains("rdma_poll"), "{}", choice.detail);
        // Busy polling asked for on a link that fell back: said in the link's reason.
        let busy = settings(&attrs(&[("tbon.rdma_poll", "busy")])).unwrap();
        let offer = Offer::new(&busy, Some("127.0.0.1".parse().unwrap())).unwrap();
        let a = Answer::new(&busy, Some("127.0.0.1".parse().unwrap()), &offer.hello_fields());
        let (_, choice) = offer.connect(&a.ack_fields()).unwrap();
        assert!(choice.detail.ends_with("tbon.rdma_poll=busy has no effect on TCP"), "{}", choice.detail);
    }

    #[test]
    fn framing_is_packed_only_when_both_ends_say_so() {
        let s = settings(&attrs(&[])).unwrap();
        assert_eq!(s.framing, Framing::Packed);
        assert_eq!(settings(&attrs(&[("tbon.rdma_frame", "full")])).unwrap().framing, Framing::Full);
        assert!(settings(&attrs(&[("tbon.rdma_frame", "zip")])).unwrap_err().contains("packed or full"));
        let packed = json!({FRAME_FIELD: Framing::Packed.field()});
        assert_eq!(Framing::agree(Framing::Packed, &packed), Framing::Packed);
        // A peer that does not know the field (an older build), or asked for full frames.
        assert_eq!(Framing::agree(Framing::Packed, &json!({"rank": 1})), Framing::Full);
        assert_eq!(Framing::agree(Framing::Packed, &json!({FRAME_FIELD: "full"})), Framing::Full);
        assert_eq!(Framing::agree(Framing::Full, &packed), Framing::Full);
        let m = Message::request("broker.ping", 1, &json!({"pad": ""}));
        for f in [Framing::Packed, Framing::Full] {
            let mut b = vec![0u8; f.encoded_len(&m)];
            f.encode_into(&m, &mut b);
            assert_eq!(f.decode(b).unwrap(), m);
        }
    }

    #[test]
    fn rdma_mode_fails_without_device() {
        let s = settings(&attrs(&[("tbon.transport", "rdma")])).unwrap();
        let e = Offer::new(&s, Some("127.0.0.1".parse().unwrap())).unwrap_err();
        assert!(e.starts_with("tbon.transport=rdma but"), "{e}");
        let a = Answer::new(&s, Some("127.0.0.1".parse().unwrap()), &json!({"rank": 1}));
        assert!(matches!(a, Answer::Refuse(_)));
    }

    #[test]
    fn malformed_offer_is_a_reason_not_a_panic() {
        let s = settings(&attrs(&[])).unwrap();
        let a = Answer::new(&s, Some("127.0.0.1".parse().unwrap()), &json!({"rdma": {"qpn": "x"}}));
        let Answer::Tcp(c) = a else { panic!() };
        assert!(c.detail.contains("malformed"), "{}", c.detail);
    }
}
