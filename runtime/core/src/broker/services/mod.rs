//! The broker's services, one file each, in the manner of flux-core's modules: a request's topic is
//! `SERVICE.METHOD`, and the service's file holds the table of its methods (`TOPICS`: topic, handler) and their
//! handlers.
//!
//! | service | file | offered on |
//! |---|---|---|
//! | `broker` (ping, getattr, lsattr, info, rtt, sub, unsub, pub, shutdown) | `broker.rs` | every rank |
//! | `detect` (watch: a process's exit) | `detect.rs` | every rank |
//! | `rexec` (spawn, kill, notify: job shells; pmi-answer: a PMI exchange's answer down the tree) | `rexec.rs` | every rank |
//! | `overlay` (torpid, lively, lost, offline, reparent, transport, status) | `overlay.rs` | rank 0 |
//! | `resource` (register, status, list, drain, undrain, eventlog, R) | `resource.rs` | rank 0 |
//! | `job-manager` (submit, list, info, cancel, raise, purge, eventlog) | `job_manager.rs` | rank 0 |
//! | `job-info` (attach, stdin, disconnect) | `job_info.rs` | rank 0 |
//! | `job-exec` (stdin, output, task-exit, exception, nested, pmi-barrier, shell-exit) | `job_exec.rs` | rank 0 |
//!
//! A handler that reads a payload decodes it into a `#[derive(Deserialize)]` struct declared beside it and named
//! after its topic (`CancelRequest` for `job-manager.cancel`), whose docstrings say what each field is: a payload
//! comes from a peer or a client and is trusted in nothing, so `Body::decode` refuses one that is not a JSON
//! object, or misses a field, or has one of the wrong type, with EPROTO naming the field (`decode.rs`). Fields a
//! struct does not name are ignored, as in Flux. What decoding cannot say (a rank inside the instance, a
//! severity 0..=7, a job id's f58 text) is checked by the handler after, and refused with a [`ServiceError`].
//!
//! Who may call a topic is not here but in one table for every service, `broker/access.rs`, checked by
//! [`dispatch`] before the handler runs; a unit test checks that every topic of these tables has its rule there.

use crate::broker::core::Broker;
use crate::idset::IdSet;
use crate::jobs::JobId;
use crate::json_kind;
use crate::message::{errno, Message, ROUTE_LOCAL};
use serde::Deserialize;
use serde_json::{json, Value};

/// Which failure detectors this broker runs, as `{process_exit, tcp, responder, probes}` (the driver's
/// `broker/detect/status.rs`), and on a parent `probing` (children by group datagram / unicast, where replies are
/// read).
fn detectors(core: &Broker) -> Value {
    let mut d = core.status.detectors.clone();
    if let Value::Object(m) = &mut d {
        // The judge's own lateness and its confirmations of suspects (confirm.rs).
        let j = core.confirm.status();
        m.insert("judge".into(), j["state"].clone());
        m.insert(
            "suspicions".into(),
            json!({"cleared": j["suspicions_cleared"], "confirmed": j["suspicions_confirmed"]}),
        );
    }
    d
}

/// A service's refusal of a request: the errno and the message its error response carries
/// (`Message::error_to`). The message says what was wrong and, for a field of the payload, names it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message} (errno {errno})")]
pub struct ServiceError {
    /// The response's errno ([`errno`]).
    pub errno: u32,
    /// The response's error string.
    pub message: String,
}

impl ServiceError {
    /// A refusal with `errno` and `message`.
    pub fn new(errno: u32, message: impl Into<String>) -> ServiceError {
        ServiceError { errno, message: message.into() }
    }

    /// EPERM: the caller may not do this.
    pub fn eperm(message: impl Into<String>) -> ServiceError {
        ServiceError::new(errno::EPERM, message)
    }

    /// ENOENT: no such job, attribute, shell...
    pub fn enoent(message: impl Into<String>) -> ServiceError {
        ServiceError::new(errno::ENOENT, message)
    }

    /// EINVAL: a well-formed request asking for something that cannot be (a rank outside the instance...).
    pub fn einval(message: impl Into<String>) -> ServiceError {
        ServiceError::new(errno::EINVAL, message)
    }

    /// ENOSYS: no such method, or not on this rank.
    pub fn enosys(message: impl Into<String>) -> ServiceError {
        ServiceError::new(errno::ENOSYS, message)
    }

    /// EPROTO: a malformed request (not JSON, a field missing or of the wrong type).
    pub fn eproto(message: impl Into<String>) -> ServiceError {
        ServiceError::new(errno::EPROTO, message)
    }

    /// EAGAIN: not now, try again later.
    pub fn eagain(message: impl Into<String>) -> ServiceError {
        ServiceError::new(errno::EAGAIN, message)
    }

    /// EEXIST: already there.
    pub fn eexist(message: impl Into<String>) -> ServiceError {
        ServiceError::new(errno::EEXIST, message)
    }

    /// ENOSPC: a bound reached (subscriptions, waiting requests, a job's standard input).
    pub fn enospc(message: impl Into<String>) -> ServiceError {
        ServiceError::new(errno::ENOSPC, message)
    }

    /// EROFS: rank 0's state directory cannot be written.
    pub fn erofs(message: impl Into<String>) -> ServiceError {
        ServiceError::new(errno::EROFS, message)
    }
}

/// Event subscriptions (`broker.sub` topic prefixes) one local client may hold; past it `broker.sub` is answered
/// ENOSPC.
pub const MAX_SUBS_PER_CLIENT: usize = 256;
/// Longest `broker.sub` topic prefix, in bytes (an event's topic is at most 65535 bytes on the wire; those that
/// clients subscribe to are tens of bytes). A longer one is refused with EINVAL.
pub const MAX_SUB_TOPIC: usize = 1024;
/// Requests that wait that one client (one route: a local connection, or a client of another broker) may hold
/// open at once on a broker: job watchers (`job-manager.eventlog`, `job-info.attach`, `job-info.stdin`) and
/// process-exit watches (`detect.watch`), each. Past it the request is answered ENOSPC and nothing is held.
pub const MAX_WAITING_PER_CLIENT: usize = 1024;
/// `broker.rtt` runs in progress at once: per client, and on a broker (each holds a payload of up to 1 MiB and its
/// samples). Past either the request is answered EAGAIN.
pub const MAX_RTT_RUNS_PER_CLIENT: usize = 2;
pub const MAX_RTT_RUNS: usize = 16;

/// ENOSPC if the client of `msg` already holds [`MAX_WAITING_PER_CLIENT`] requests of kind `what`, of which it
/// holds `held`.
fn check_waiting(held: usize, what: &str) -> Result<(), ServiceError> {
    if held >= MAX_WAITING_PER_CLIENT {
        return Err(ServiceError::enospc(format!(
            "this client already holds {held} {what}, the most one may (close some, or reconnect)"
        )));
    }
    Ok(())
}

/// Rank 0's job core, for the `job-*` handlers (ENOSYS elsewhere). A macro, not a function: the handler keeps
/// using the broker's other fields while it holds the job core.
macro_rules! job_core {
    ($core:expr) => {
        $core.jobcore.as_mut().ok_or(ServiceError::enosys(String::from("job services run on rank 0")))?
    };
}

mod broker;
mod decode;
mod detect;
pub(super) mod job_exec;
pub(super) mod job_info;
mod job_manager;
pub mod overlay;
mod resource;
mod rexec;

/// A request handler: answers with a payload (`Ok(Some)`), later (`Ok(None)`: the request is held, e.g. until an
/// event or a durable write), or with a [`ServiceError`].
type Handler = fn(&mut Broker, &Message, &Body<'_>) -> Reply;

/// One row of a service's table: its topic and its handler (who may call it: [`crate::broker::access`]).
pub(super) struct Topic {
    /// `SERVICE.METHOD`.
    name: &'static str,
    /// What answers it.
    handler: Handler,
}

/// A service: its name (a topic's first part), whether only rank 0 offers it, and its table.
struct Service {
    name: &'static str,
    rank0_only: bool,
    topics: &'static [Topic],
}

/// Every service of a broker.
const SERVICES: &[Service] = &[
    Service { name: "broker", rank0_only: false, topics: broker::TOPICS },
    Service { name: "detect", rank0_only: false, topics: detect::TOPICS },
    Service { name: "rexec", rank0_only: false, topics: rexec::TOPICS },
    Service { name: "overlay", rank0_only: true, topics: overlay::TOPICS },
    Service { name: "resource", rank0_only: true, topics: resource::TOPICS },
    Service { name: "job-manager", rank0_only: true, topics: job_manager::TOPICS },
    Service { name: "job-info", rank0_only: true, topics: job_info::TOPICS },
    Service { name: "job-exec", rank0_only: true, topics: job_exec::TOPICS },
];

/// True if a broker of `rank` offers `service`.
pub fn offers(rank: u32, service: &str) -> bool {
    SERVICES.iter().any(|s| s.name == service && (rank == 0 || !s.rank0_only))
}

/// Whether the caller of `msg` may use its topic, by the one table of `broker/access.rs`: EPERM or EPROTO
/// saying who may. The payload is parsed only for a guest's job request (`body`, parsed once for the handler too).
fn permitted(core: &Broker, msg: &Message, body: &Body<'_>) -> Result<(), ServiceError> {
    use crate::broker::access::{self, Rule};
    let owner = core.env.uid;
    let job_rule = matches!(access::rule(&msg.topic), Rule::JobOwner | Rule::JobsOwner);
    let req = access::Request {
        topic: &msg.topic,
        uid: msg.userid,
        local: msg.route.len() == 1 && msg.route[0] & ROUTE_LOCAL != 0,
        payload: if job_rule && msg.userid != owner { body.json().ok() } else { None },
    };
    let job_owner = |id: JobId| core.jobcore.as_ref().and_then(|jc| jc.jobs.get(&id)).map(|j| j.userid);
    access::check(&req, owner, job_owner).map_err(|d| ServiceError::new(d.errno, d.message))
}

/// The row of `topic`, if any service has one.
fn lookup(topic: &str) -> Option<&'static Topic> {
    let service = topic.split('.').next().unwrap_or("");
    SERVICES.iter().find(|s| s.name == service)?.topics.iter().find(|t| t.name == topic)
}

/// A request's `ranks`, an idset ("0-3,7"); EINVAL when it is not one.
fn parse_ranks(s: &str) -> Result<IdSet, ServiceError> {
    IdSet::parse(s).map_err(|e| ServiceError::einval(format!("invalid ranks '{s}': {e}")))
}

/// [`parse_ranks`] for ranks of this instance: every one below `size` (EINVAL names those that are not).
fn parse_instance_ranks(s: &str, size: u32) -> Result<IdSet, ServiceError> {
    let ranks = parse_ranks(s)?;
    match ranks.last() {
        Some(last) if last >= size => {
            let bad: IdSet = ranks.iter().filter(|r| *r >= size).collect();
            let mut shown = bad.to_string();
            if shown.len() > 64 {
                shown.truncate(64);
                shown.push_str("...");
            }
            Err(ServiceError::einval(format!("ranks {shown} are not in this instance of size {size}")))
        }
        _ => Ok(ranks),
    }
}

/// A job id as a request carries it (`id`, as in Flux): an integer, or a string (f58 `ƒ...`/`f...`, or
/// decimal) that [`JobRef::id`] parses after decoding.
#[derive(Debug, Clone, PartialEq, Eq)]
enum JobRef {
    /// The id itself.
    Number(u64),
    /// The id as text, not yet parsed.
    Text(String),
}

impl JobRef {
    /// The job id, or EINVAL saying why the text is not one.
    fn id(&self) -> Result<JobId, ServiceError> {
        match self {
            JobRef::Number(n) => Ok(JobId(*n)),
            JobRef::Text(s) => JobId::parse(s).map_err(|e| ServiceError::einval(e.to_string())),
        }
    }
}

impl<'de> Deserialize<'de> for JobRef {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<JobRef, D::Error> {
        struct JobRefVisitor;
        impl serde::de::Visitor<'_> for JobRefVisitor {
            type Value = JobRef;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a job id (an integer or an f58 string)")
            }
            fn visit_u64<E>(self, n: u64) -> Result<JobRef, E> {
                Ok(JobRef::Number(n))
            }
            fn visit_str<E>(self, s: &str) -> Result<JobRef, E> {
                Ok(JobRef::Text(s.to_string()))
            }
        }
        d.deserialize_any(JobRefVisitor)
    }
}

/// An exception's severity (RFC 21: 0 is fatal, 1..=7 informational), 0 when absent; EINVAL past 7.
fn severity(s: Option<u64>) -> Result<u32, ServiceError> {
    match s {
        None => Ok(0),
        Some(s) if s <= 7 => Ok(s as u32),
        Some(s) => Err(ServiceError::einval(format!("'severity' must be 0..=7 (RFC 21), got {s}"))),
    }
}

/// Handle a request addressed to this broker.
pub fn dispatch(core: &mut Broker, msg: Message) {
    let r = match lookup(&msg.topic) {
        Some(t) => {
            let body = Body::new(&msg);
            match permitted(core, &msg, &body) {
                Ok(()) => (t.handler)(core, &msg, &body),
                Err(e) => Err(e),
            }
        }
        None => Err(ServiceError::enosys(format!("unknown service method '{}'", msg.topic))),
    };
    match r {
        // The request moves into its response (topic and route stack reused, not copied).
        Ok(Some(Out(payload))) => core.respond_with(msg, payload),
        Ok(None) => {}
        Err(e) => core.respond_error(&msg, e.errno, &e.message),
    }
}

/// A request's JSON payload, parsed when a handler first asks for it: a handler that reads no payload
/// (`broker.ping`, `broker.info`...) does not pay for parsing one (the size of a ping's padding, for instance).
struct Body<'a> {
    msg: &'a Message,
    parsed: std::cell::OnceCell<Result<Value, String>>,
}

impl<'a> Body<'a> {
    fn new(msg: &'a Message) -> Body<'a> {
        Body { msg, parsed: std::cell::OnceCell::new() }
    }

    /// The payload as JSON (`null` when empty), or `EPROTO` when it is not JSON.
    fn json(&self) -> Result<&Value, ServiceError> {
        let r = self.parsed.get_or_init(|| self.msg.decode::<Value>().map_err(|e| format!("payload is not JSON: {e}")));
        r.as_ref().map_err(|e| ServiceError::eproto(e.clone()))
    }

    /// The payload as a JSON object (every service request that carries fields is one), or `EPROTO` saying
    /// what it is instead (not JSON, empty, an array...).
    fn object(&self) -> Result<&Value, ServiceError> {
        let v = self.json()?;
        if v.is_object() {
            Ok(v)
        } else {
            Err(ServiceError::eproto(format!("payload must be a JSON object, got {}", json_kind(v))))
        }
    }

    /// The payload decoded into `T`, a handler's request struct: EPROTO when it is not a JSON object, or when a
    /// field is missing or of the wrong type, naming the field ([`decode::decode`]).
    fn decode<'s, T: Deserialize<'s>>(&'s self) -> Result<T, ServiceError> {
        decode::decode(self.object()?)
    }
}

/// A handler's answer: the response payload, JSON-encoded. From a [`Value`], or directly from a typed
/// `Serialize` value with [`Out::json`] (no intermediate `Value` tree).
struct Out(Vec<u8>);

impl Out {
    fn json(v: &impl serde::Serialize) -> Out {
        Out(crate::message::to_json(v))
    }
}

impl From<Value> for Out {
    fn from(v: Value) -> Out {
        Out::json(&v)
    }
}

type Reply = Result<Option<Out>, ServiceError>;

/// Every topic of every service's table (the fuzz tests check they send each one).
#[cfg(test)]
pub(super) fn all_topics() -> impl Iterator<Item = &'static str> {
    SERVICES.iter().flat_map(|s| s.topics.iter().map(|t| t.name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::core::{Effect, Input, Peer, Time};
    use crate::message::MsgType;
    use crate::topology::Topology;

    /// Each row sits in its service's table, once; the services offered on a rank are those of the tables.
    #[test]
    fn every_topic_is_in_its_own_services_table_once() {
        let mut seen = std::collections::BTreeSet::new();
        for s in SERVICES {
            for t in s.topics {
                assert_eq!(t.name.split('.').next(), Some(s.name), "{} in the table of {}", t.name, s.name);
                assert!(seen.insert(t.name), "{} twice", t.name);
                assert_eq!(lookup(t.name).map(|r| r.name), Some(t.name));
                assert!(offers(0, s.name) && offers(1, s.name) != s.rank0_only);
            }
        }
        assert!(lookup("job-manager.nosuch").is_none() && lookup("nosuch").is_none() && lookup("").is_none());
    }

    /// Every topic a service registers has its row in the one access table, and every row of it names a
    /// registered topic (a topic added without a rule would be the instance owner's only: deny by default).
    #[test]
    fn every_registered_topic_has_an_access_rule() {
        let registered: std::collections::BTreeSet<&str> = all_topics().collect();
        let ruled: std::collections::BTreeSet<&str> = crate::broker::access::RULES.iter().map(|(t, _)| *t).collect();
        let unruled: Vec<_> = registered.difference(&ruled).collect();
        assert!(unruled.is_empty(), "topics without a rule in broker/access.rs: {unruled:?}");
        let stale: Vec<_> = ruled.difference(&registered).collect();
        assert!(stale.is_empty(), "rules for topics no service registers: {stale:?}");
        assert_eq!(ruled.len(), crate::broker::access::RULES.len(), "a topic ruled twice");
    }

    /// The access table is what dispatch enforces: an instance-owner topic refuses another user before its handler
    /// runs (nothing happens: no shutdown, no drain), a job topic refuses a guest's request that names no job
    /// (`access.rs` tests the rest of each rule), a local-client topic refuses a request that came over the overlay.
    #[test]
    fn the_access_table_is_enforced() {
        use crate::broker::access::{rule, Rule};
        let mut b = crate::broker::testing::new_broker(0, 3, Topology::Kary(2), 4, Default::default(), Time::ZERO);
        b.handle(Time::ZERO, Input::Start);
        let hello = Message::control("hello", &json!({"rank": 1, "instance": "sim"}));
        b.handle(Time::ZERO, Input::Hello { conn: 7, msg: hello, addr: "peer".into(), refusal: None });
        b.handle(Time::ZERO, Input::LocalNew { id: 6, uid: crate::broker::testing::UID + 1 });
        let mut rows = 0;
        for t in SERVICES.iter().flat_map(|s| s.topics) {
            let (from, want) = match rule(t.name) {
                Rule::InstanceOwner => (Peer::Local(6), errno::EPERM),
                Rule::LocalClient => (Peer::Child(1), errno::EPROTO),
                // A job topic without a job id from a guest: refused before the handler.
                Rule::JobOwner | Rule::JobsOwner => (Peer::Local(6), errno::EPROTO),
                Rule::Anyone => continue,
            };
            let mut m = Message::request(t.name, 0, &json!({"ranks": "1", "topic": "x"}));
            m.matchtag = 9;
            if from == Peer::Child(1) {
                m.userid = crate::broker::testing::UID;
            }
            std::iter::from_fn(|| b.poll_effect()).for_each(drop);
            b.handle(Time::from_secs_f64(0.1), Input::Message(from, 7, m));
            let out: Vec<Effect> = std::iter::from_fn(|| b.poll_effect()).collect();
            let resp = out.iter().find_map(|e| match e {
                Effect::Send(_, m) if m.msgtype == MsgType::Response => Some(m),
                _ => None,
            });
            let resp = resp.unwrap_or_else(|| panic!("{}: no response in {out:?}", t.name));
            assert_eq!(resp.errnum, want, "{}: {:?}", t.name, resp.errstr());
            assert!(resp.errstr().unwrap_or_default().contains(t.name), "{}: {:?}", t.name, resp.errstr());
            rows += 1;
        }
        assert!(rows >= 5, "owner and local rows: {rows}");
        assert!(b.shutting_down.is_none(), "a refused shutdown shuts nothing down");
    }

    /// What the hand-written getters refused, the request structs refuse: EPROTO naming the field, whatever JSON
    /// it holds; `null` is an absent optional field; a field no struct names is ignored.
    #[test]
    fn fields_of_the_wrong_type_are_refused_naming_the_field() {
        /// One optional field of each kind the request structs have.
        #[derive(Debug, Deserialize)]
        struct Fields {
            s: Option<String>,
            b: Option<bool>,
            n: Option<u32>,
            u: Option<u64>,
            neg: Option<i32>,
            id: Option<JobRef>,
        }
        let body = json!({"s": "x", "b": true, "n": 5, "neg": -1, "big": 1u64 << 32, "null": null, "f": 1.5});
        let f: Fields = decode::decode(&body).expect("fields no struct names are ignored");
        assert_eq!(
            (f.s.as_deref(), f.b, f.n, f.u, f.neg, f.id),
            (Some("x"), Some(true), Some(5), None, Some(-1), None)
        );
        let f: Fields = decode::decode(&json!({"s": null, "id": "f1"})).expect("decoded");
        assert_eq!((f.s, f.id), (None, Some(JobRef::Text("f1".into()))), "null is an absent optional field");
        for (field, value, want) in [
            ("s", json!(5), "'s': invalid type: integer `5`, expected a string"),
            ("b", json!("x"), "'b': invalid type: string \"x\", expected a boolean"),
            ("u", json!(-1), "'u': invalid value: integer `-1`, expected u64"),
            ("n", json!(1u64 << 32), "'n': invalid value: integer `4294967296`, expected u32"),
            ("n", json!(1.5), "'n': invalid type: floating point `1.5`, expected u32"),
            ("neg", json!(1u64 << 32), "'neg': invalid value: integer `4294967296`, expected i32"),
            ("id", json!([1]), "'id': invalid type: sequence, expected a job id (an integer or an f58 string)"),
            ("id", json!(-1), "'id': invalid type: integer `-1`, expected a job id (an integer or an f58 string)"),
        ] {
            let e = decode::decode::<Fields>(&json!({ field: value })).expect_err(field);
            assert_eq!((e.errno, e.message.as_str()), (errno::EPROTO, want));
        }
        /// Required fields.
        #[derive(Debug, Deserialize)]
        #[allow(dead_code)]
        struct Required {
            s: String,
            n: u32,
        }
        for (body, want) in [
            (json!({"n": 1}), "missing 's' in request"),
            (json!({"s": null, "n": 1}), "'s': invalid type: null, expected a string"),
            (json!({"s": "x", "n": "1"}), "'n': invalid type: string \"1\", expected u32"),
        ] {
            let e = decode::decode::<Required>(&body).expect_err(want);
            assert_eq!((e.errno, e.message.as_str()), (errno::EPROTO, want));
        }
        // What decoding cannot say is checked after it, as before.
        assert_eq!(severity(Some(8)).map_err(|e| e.errno), Err(errno::EINVAL));
        assert_eq!(severity(None), Ok(0));
        assert_eq!(JobRef::Text("nonsense".into()).id().map_err(|e| e.errno), Err(errno::EINVAL));
        assert_eq!(JobRef::Number(7).id(), Ok(JobId(7)));
    }

    #[test]
    fn ranks_outside_the_instance_are_refused() {
        assert_eq!(parse_instance_ranks("0-3", 4).map(|r| r.len()), Ok(4));
        for ranks in ["4", "2-9", "4294967295"] {
            let ServiceError { errno: e, message: msg } = parse_instance_ranks(ranks, 4).expect_err(ranks);
            assert_eq!(e, errno::EINVAL);
            assert!(msg.contains("not in this instance of size 4"), "{msg}");
        }
        // An idset that would expand to four billion ranks is refused by the parser itself.
        assert_eq!(parse_instance_ranks("0-4294967295", 4).map_err(|e| e.errno), Err(errno::EINVAL), "huge");
        assert_eq!(parse_instance_ranks("x", 4).map_err(|e| e.errno), Err(errno::EINVAL), "not an idset");
    }
}
