//! The hello's transport upgrade: how an overlay link moves from TCP onto a faster transport.
//!
//! Every overlay link starts as an authenticated TCP connection (`transport.rs`). Its first exchange, the
//! child's `hello` and the parent's `hello-ack`, also negotiates what the link runs on afterwards:
//! 1. the child asks each [`FastTransport`] for an [`Offer`] and puts their fields in its hello
//!    ([`Upgrades::offer`]);
//! 2. the parent asks each for an [`Answer`] to the hello, and puts their fields in its hello-ack
//!    ([`Upgrades::answer`]); an answer may refuse the child (`tbon.transport` requires a transport that cannot
//!    be had), or accept the offer, which moves the parent's end of the link ([`Answers::accept`]);
//! 3. the child finishes its offers with the hello-ack ([`Offers::finish`]): the first accepted moves its end.
//!
//! They are tried in one preference order, the order of [`Upgrades::new`]: verbs (`rdma_link.rs`), then
//! libfabric (`ofi_link.rs`), then the link stays on TCP. Each transport decides from `tbon.transport` whether
//! it is considered on a link, and is told whether an earlier one already offers (or accepted) something, so
//! that with `auto` a later one stays out of the way. A link that stays on TCP is described with the reasons of
//! those that were considered ([`tcp_reason`]), as `vigil overlay status` and `vigil uptime` show them.
//!
//! Adding a transport is one more [`FastTransport`] in that list; the driver only calls the functions here.
//! The fields each transport puts in the hello and hello-ack are described in `docs/wire-format.md`.

use super::transport::{merge, Link, LinkChoice};
use serde_json::{json, Value};
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;

/// A future a transport's negotiation step returns (boxed: the trait is used as an object).
pub(crate) type Step<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A transport an overlay link can move onto after its TCP hello (verbs, libfabric).
pub(crate) trait FastTransport: Send + Sync + std::fmt::Debug {
    /// Child side, before the hello, on the link whose TCP connection has local address `local`: what to offer
    /// (`earlier`: a transport earlier in the order offers something on this link). `Ok(None)`: not considered
    /// on this link (nothing in the hello). `Err`: `tbon.transport` requires this transport and it cannot be
    /// had; the child exits with the reason.
    fn offer(&self, local: Option<IpAddr>, earlier: bool) -> Result<Option<Box<dyn Offer>>, String>;

    /// Parent side, in the task that read the child's `hello`: the answer to it (`earlier`: a transport earlier
    /// in the order accepted this link). `None`: not considered on this link (nothing in the hello-ack).
    fn answer<'a>(
        &'a self,
        local: Option<IpAddr>,
        hello: &'a Value,
        earlier: bool,
    ) -> Step<'a, Option<Box<dyn Answer>>>;
}

/// What the child offers on one link, until the hello-ack comes.
pub(crate) trait Offer: Send {
    /// Fields to add to the hello payload.
    fn hello_fields(&self) -> Value;

    /// Whether something is offered (a queue pair, an endpoint), rather than a reason why not.
    fn offers(&self) -> bool;

    /// After the hello-ack `ack`: move `link` onto this transport, or give it back with the reason it stays
    /// (`Err`: `tbon.transport` requires this transport and the parent did not agree; the child exits).
    fn finish<'a>(self: Box<Self>, ack: &'a Value, link: Link) -> Step<'a, Result<Upgraded, String>>;
}

/// What [`Offer::finish`] made of a link.
pub(crate) enum Upgraded {
    /// The link runs on this transport now (its TCP connection kept as the side channel).
    Moved(Link, LinkChoice),
    /// The link as it was, and why it did not move.
    Stayed(Link, String),
}

/// A parent's answer to one transport's part of a hello.
pub(crate) trait Answer: Send + std::fmt::Debug {
    /// Fields to add to the hello-ack payload.
    fn ack_fields(&self) -> Value;

    /// Accept, decline (with the reason) or refuse the child (with the reason).
    fn verdict(&self) -> Verdict<'_>;

    /// Move the parent's end of an accepted link onto this transport (called only for [`Verdict::Accept`]).
    fn accept(self: Box<Self>, link: Link) -> (Link, LinkChoice);
}

/// What an [`Answer`] says.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Verdict<'a> {
    /// The link moves onto this transport.
    Accept,
    /// Not this transport, for this reason.
    Decline(&'a str),
    /// `tbon.transport` requires this transport and it cannot be had: the child is refused, for this reason.
    Refuse(&'a str),
}

/// The fast transports of a broker, in the order they are tried.
#[derive(Clone, Debug)]
pub(crate) struct Upgrades(Vec<Arc<dyn FastTransport>>);

impl Upgrades {
    /// The order of `tbon.transport`: verbs, then libfabric (then TCP). Each decides from the mode whether it
    /// is considered: `auto` tries verbs first and libfabric only where verbs has nothing, `rdma` and `ofi` only
    /// the one they name, `tcp` none (the verbs offer still says why, in the hello).
    pub(crate) fn new(c: &crate::attrs::BrokerConfig) -> Upgrades {
        let verbs: Arc<dyn FastTransport> = Arc::new(super::rdma_link::Settings::new(c));
        let ofi: Arc<dyn FastTransport> = Arc::new(super::ofi_link::Settings::new(c));
        Upgrades::of(vec![verbs, ofi])
    }

    /// These transports, in this order.
    pub(crate) fn of(order: Vec<Arc<dyn FastTransport>>) -> Upgrades {
        Upgrades(order)
    }

    /// Child side: the offers to make on a link whose local address is `local`.
    ///
    /// # Errors
    /// A transport that `tbon.transport` requires cannot be offered: the reason, for the child to exit with.
    pub(crate) fn offer(&self, local: Option<IpAddr>) -> Result<Offers, String> {
        let mut offers = Vec::new();
        let mut earlier = false;
        for t in &self.0 {
            if let Some(o) = t.offer(local, earlier)? {
                earlier |= o.offers();
                offers.push(o);
            }
        }
        Ok(Offers(offers))
    }

    /// Parent side: the answers to a child's `hello`, on a link whose local address is `local`.
    pub(crate) async fn answer(&self, local: Option<IpAddr>, hello: &Value) -> Answers {
        let mut answers = Vec::new();
        let mut earlier = false;
        for t in &self.0 {
            if let Some(a) = t.answer(local, hello, earlier).await {
                earlier |= a.verdict() == Verdict::Accept;
                answers.push(a);
            }
        }
        Answers(answers)
    }
}

/// A child's offers on one link ([`Upgrades::offer`]).
pub(crate) struct Offers(Vec<Box<dyn Offer>>);

impl Offers {
    /// Fields to add to the hello payload.
    pub(crate) fn hello_fields(&self) -> Value {
        self.0.iter().fold(json!({}), |f, o| merge(f, o.hello_fields()))
    }

    /// After the hello-ack: the link on the first transport that moves it, or on TCP with the reasons.
    ///
    /// # Errors
    /// A transport that `tbon.transport` requires did not move the link: the reason, for the child to exit with.
    pub(crate) async fn finish(self, ack: &Value, link: Link) -> Result<(Link, LinkChoice), String> {
        let mut link = link;
        let mut reasons = Vec::new();
        for o in self.0 {
            match o.finish(ack, link).await? {
                Upgraded::Moved(l, choice) => return Ok((l, choice)),
                Upgraded::Stayed(l, why) => {
                    link = l;
                    reasons.push(why);
                }
            }
        }
        Ok((link, LinkChoice::tcp(tcp_reason(reasons))))
    }
}

/// A parent's answers to one child's hello ([`Upgrades::answer`]).
#[derive(Debug)]
pub(crate) struct Answers(Vec<Box<dyn Answer>>);

impl Answers {
    /// Why the child is refused, if a transport that `tbon.transport` requires cannot be had (the first one in
    /// the order that says so).
    pub(crate) fn refusal(&self) -> Option<String> {
        self.0.iter().find_map(|a| match a.verdict() {
            Verdict::Refuse(why) => Some(why.to_string()),
            _ => None,
        })
    }

    /// Fields to add to the hello-ack payload.
    pub(crate) fn ack_fields(&self) -> Value {
        self.0.iter().fold(json!({}), |f, a| merge(f, a.ack_fields()))
    }

    /// The parent's end of the link, once the hello-ack is sent: on the transport that accepted it, or on TCP
    /// with the reasons. None when the child is refused ([`Answers::refusal`]).
    pub(crate) fn accept(self, link: Link) -> Option<(Link, LinkChoice)> {
        if self.refusal().is_some() {
            return None;
        }
        let mut reasons = Vec::new();
        for a in self.0 {
            match a.verdict() {
                Verdict::Accept => return Some(a.accept(link)),
                Verdict::Decline(why) => reasons.push(why.to_string()),
                Verdict::Refuse(_) => unreachable!("refusals returned above"),
            }
        }
        Some((link, LinkChoice::tcp(tcp_reason(reasons))))
    }
}

/// Why a link stays on TCP, from the reasons of the transports considered, in order: all of them, joined with
/// "; ", except a reason that only says `tbon.transport` excludes its transport when a later one was
/// considered (with `tbon.transport=ofi`, only libfabric's reason is worth showing).
pub(crate) fn tcp_reason(reasons: Vec<String>) -> String {
    let n = reasons.len();
    if n == 0 {
        return "no other transport considered".into();
    }
    let kept: Vec<String> = reasons
        .into_iter()
        .enumerate()
        .filter(|(i, r)| *i + 1 == n || !r.contains("tbon.transport="))
        .map(|(_, r)| r)
        .collect();
    kept.join("; ")
}

#[cfg(test)]
mod tests {
    //! The negotiation of two brokers' ends over an in-memory link, with the real transports' settings on a
    //! machine without a device (verbs falls back with its reason; libfabric with a provider that is not there).
    use super::*;
    use crate::attrs::{BrokerConfig, Transport};
    use crate::broker::transport::{mem_pair, LinkEvent};
    use crate::message::Message;

    fn config(mode: Transport, busy: bool) -> BrokerConfig {
        let mut c = BrokerConfig { transport: mode, ofi_provider: "no-such-provider".into(), ..Default::default() };
        c.rdma.busy_poll = busy;
        c
    }

    /// Run the hello between a child configured `child` and a parent configured `parent` over an in-memory
    /// link: the child's result (its choice, or why it exits), the parent's refusal or choice, and the ends.
    async fn negotiate(
        child: &BrokerConfig,
        parent: &BrokerConfig,
    ) -> (Result<LinkChoice, String>, Result<LinkChoice, String>, Option<(Link, Link)>) {
        let (c_end, mut p_end) = mem_pair("child", "parent");
        let offers = match Upgrades::new(child).offer(None) {
            Ok(o) => o,
            Err(e) => return (Err(e), Err("no hello".into()), None),
        };
        c_end.tx.send(Message::control("hello", &offers.hello_fields())).unwrap();
        let Some(LinkEvent::Message(hello)) = p_end.rx.recv().await else { panic!("no hello") };
        let answers = Upgrades::new(parent).answer(None, &hello.json()).await;
        p_end.tx.send(Message::control("hello-ack", &answers.ack_fields())).unwrap();
        let parent_side = match answers.refusal() {
            Some(why) => Err(why),
            None => Ok(answers.accept(p_end).expect("not refused")),
        };
        let mut c_end = c_end;
        let Some(LinkEvent::Message(ack)) = c_end.rx.recv().await else { panic!("no hello-ack") };
        let child_side = offers.finish(&ack.json(), c_end).await;
        match (child_side, parent_side) {
            (Ok((c, cc)), Ok((p, pc))) => (Ok(cc), Ok(pc), Some((c, p))),
            (c, p) => (c.map(|x| x.1), p.map(|x| x.1), None),
        }
    }

    #[tokio::test]
    async fn auto_without_devices_stays_on_tcp_with_both_reasons_and_the_link_works() {
        let c = config(Transport::Auto, false);
        let (child, parent, ends) = negotiate(&c, &c).await;
        let child = child.unwrap();
        assert_eq!(child.transport, "tcp");
        // Verbs' reason (no device serves an unknown local address), then libfabric's.
        let verbs = "this side: local address of the overlay connection unknown; ";
        assert!(child.detail.starts_with(verbs) && child.detail.len() > verbs.len(), "{}", child.detail);
        let parent = parent.unwrap();
        assert_eq!(parent.transport, "tcp");
        assert!(parent.detail.starts_with("child: "), "{}", parent.detail);
        let (mut c, mut p) = ends.unwrap();
        c.tx.send(Message::request("t.x", 0, &json!({}))).unwrap();
        assert!(matches!(p.rx.recv().await, Some(LinkEvent::Message(m)) if m.topic == "t.x"));
        p.tx.send(Message::request("t.y", 1, &json!({}))).unwrap();
        assert!(matches!(c.rx.recv().await, Some(LinkEvent::Message(m)) if m.topic == "t.y"));
    }

    #[tokio::test]
    async fn the_hello_fields_are_those_of_the_wire_format() {
        // auto: the verbs fields always (here: why not), libfabric's where verbs offers nothing.
        let offers = Upgrades::new(&config(Transport::Auto, false)).offer(None).unwrap();
        let f = offers.hello_fields();
        assert!(f["rdma_unavailable"].is_string() && f["ofi_unavailable"].is_string(), "{f}");
        let answers = Upgrades::new(&config(Transport::Auto, false)).answer(None, &f).await;
        let a = answers.ack_fields();
        assert!(a["rdma_refused"].is_string() && a["ofi_refused"].is_string(), "{a}");
        // tcp: the verbs field says so; libfabric says nothing.
        let f = Upgrades::new(&config(Transport::Tcp, false)).offer(None).unwrap().hello_fields();
        assert_eq!(f, json!({"rdma_unavailable": "tbon.transport=tcp"}));
        let a = Upgrades::new(&config(Transport::Tcp, false)).answer(None, &f).await.ack_fields();
        assert_eq!(a, json!({"rdma_refused": "tbon.transport=tcp"}));
    }

    #[tokio::test]
    async fn tcp_mode_reasons_and_busy_polling_said_where_it_shows() {
        let (child, parent, _) = negotiate(&config(Transport::Tcp, false), &config(Transport::Tcp, false)).await;
        assert_eq!(child.unwrap().detail, "this side: tbon.transport=tcp");
        assert_eq!(parent.unwrap().detail, "tbon.transport=tcp");
        // A child in tcp mode under an auto parent: the parent shows libfabric's reason only.
        let (_, parent, _) = negotiate(&config(Transport::Tcp, false), &config(Transport::Auto, false)).await;
        assert_eq!(parent.unwrap().detail, "child made no ofi offer");
        let (child, _, _) = negotiate(&config(Transport::Tcp, true), &config(Transport::Tcp, false)).await;
        assert_eq!(child.unwrap().detail, "this side: tbon.transport=tcp; tbon.rdma_poll=busy has no effect on TCP");
    }

    #[tokio::test]
    async fn a_required_transport_that_cannot_be_had_fails_the_link() {
        let (child, _, _) = negotiate(&config(Transport::Rdma, false), &config(Transport::Auto, false)).await;
        assert!(child.unwrap_err().starts_with("tbon.transport=rdma but"));
        let (child, _, _) = negotiate(&config(Transport::Ofi, false), &config(Transport::Auto, false)).await;
        assert!(child.unwrap_err().starts_with("tbon.transport=ofi but"));
        // The parent requires what the child cannot offer: it refuses the child, naming the mode.
        let (_, parent, _) = negotiate(&config(Transport::Auto, false), &config(Transport::Rdma, false)).await;
        assert!(parent.unwrap_err().starts_with("tbon.transport=rdma but"));
        let (_, parent, _) = negotiate(&config(Transport::Auto, false), &config(Transport::Ofi, false)).await;
        assert!(parent.unwrap_err().starts_with("tbon.transport=ofi but"));
    }

    #[test]
    fn tcp_reasons_drop_a_mode_exclusion_before_another_reason() {
        assert_eq!(tcp_reason(vec!["a".into(), "b".into()]), "a; b");
        assert_eq!(tcp_reason(vec!["this side: tbon.transport=tcp".into(), "b".into()]), "b");
        assert_eq!(tcp_reason(vec!["tbon.transport=tcp".into()]), "tbon.transport=tcp");
        assert_eq!(tcp_reason(vec![]), "no other transport considered");
    }
}
