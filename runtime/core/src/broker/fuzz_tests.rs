//! Bad input, driven through the sans-IO broker (issue 14, "Bad input"): whatever a local client or a peer sends,
//! every service and control handler answers or ignores it and the broker goes on; it never panics. Property tests
//! generate the payloads (arbitrary JSON of every shape, and raw bytes); the seed corpus in
//! `runtime/core/tests/corpus/broker/*.json` replays inputs that once mattered, first, on every run.

use super::core::{Broker, Effect, Input, Peer, Time};
use crate::membership::Config;
use crate::message::{errno, Message, MsgType, NODEID_ANY};
use crate::topology::Topology;
use proptest::prelude::*;
use serde_json::{json, Value};

/// Every topic a broker serves (broker/services/, checked by `every_served_topic_is_fuzzed`), and a few it does
/// not.
const TOPICS: &[&str] = &[
    "broker.ping",
    "broker.sub",
    "broker.unsub",
    "broker.shutdown",
    "overlay.torpid",
    "overlay.lively",
    "overlay.lost",
    "overlay.offline",
    "resource.R",
    "job-info.attach",
    "broker.getattr",
    "broker.lsattr",
    "broker.info",
    "broker.rtt",
    "detect.watch",
    "broker.pub",
    "rexec.notify",
    "rexec.spawn",
    "rexec.kill",
    "rexec.pmi-answer",
    "resource.register",
    "overlay.reparent",
    "overlay.status",
    "overlay.transport",
    "resource.status",
    "resource.list",
    "resource.eventlog",
    "resource.drain",
    "resource.undrain",
    "job-manager.submit",
    "job-manager.list",
    "job-manager.history",
    "job-manager.info",
    "job-manager.cancel",
    "job-manager.raise",
    "job-manager.purge",
    "job-manager.eventlog",
    "job-manager.urgency",
    "job-manager.update",
    "job-exec.stdin",
    "job-info.stdin",
    "job-info.disconnect",
    "job-exec.output",
    "job-exec.task-exit",
    "job-exec.exception",
    "job-exec.nested",
    "job-exec.pmi-barrier",
    "job-exec.shell-exit",
    "job-info.output",
    "nosuch.method",
    "",
];

/// Control messages a parent or child may send (liveness.rs), and one that does not exist.
const CONTROLS: &[&str] =
    &["hello", "hello-ack", "refused", "shutdown", "goodbye", "hb", "adopted", "lost", "grace", "nosuch"];

/// The fuzzed topics cover every topic a service serves.
#[test]
fn every_served_topic_is_fuzzed() {
    for t in super::services::all_topics() {
        assert!(TOPICS.contains(&t), "{t} is served but not fuzzed");
    }
}

fn t(s: f64) -> Time {
    Time::from_secs_f64(s)
}

fn effects(b: &mut Broker) -> Vec<Effect> {
    std::iter::from_fn(|| b.poll_effect()).collect()
}

/// Rank 0 of a 7-broker binary tree, started, with local client 5 (the instance owner) and child rank 1 joined.
fn rank0() -> Broker {
    let mut b = super::testing::new_broker(0, 7, Topology::Kary(2), 4, Config::default(), Time::ZERO);
    b.handle(t(0.0), Input::Start);
    let hello = Message::control("hello", &json!({"rank": 1, "instance": "sim"}));
    b.handle(t(0.001), Input::Hello { conn: 7, msg: hello, addr: "peer".into(), refusal: None });
    b.handle(t(0.002), Input::LocalNew { id: 5, uid: super::testing::UID });
    effects(&mut b);
    b
}

/// Rank 1 of the same tree (children 3, 4), its parent link up, child 3 joined.
fn router() -> Broker {
    let mut b = super::testing::new_broker(1, 7, Topology::Kary(2), 4, Config::default(), Time::ZERO);
    b.handle(t(0.0), Input::ParentUp(super::links::LinkChoice { transport: "tcp", detail: String::new() }));
    b.handle(t(0.0), Input::Start);
    let hello = Message::control("hello", &json!({"rank": 3, "instance": "sim"}));
    b.handle(t(0.001), Input::Hello { conn: 9, msg: hello, addr: "peer".into(), refusal: None });
    b.handle(t(0.002), Input::LocalNew { id: 5, uid: super::testing::UID });
    effects(&mut b);
    b
}

/// The broker still works: a ping from local client 5 is answered with success.
fn still_answers(b: &mut Broker, now: Time) -> Result<(), String> {
    let mut m = Message::request("broker.ping", NODEID_ANY, &json!({}));
    m.matchtag = 0xfeed;
    b.handle(now, Input::Message(Peer::Local(5), 0, m));
    let out = effects(b);
    let ok = out.iter().any(|e| {
        matches!(e, Effect::Send(Peer::Local(5), r)
            if r.msgtype == MsgType::Response && r.matchtag == 0xfeed && r.errnum == 0)
    });
    if ok {
        Ok(())
    } else {
        Err(format!("ping not answered after the input: {out:?}"))
    }
}

/// Arbitrary JSON, of every shape, a few levels deep.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<u64>().prop_map(|n| json!(n)),
        (-1e300f64..1e300).prop_map(|f| json!(f)),
        "[a-z0-9 ._/-]{0,12}".prop_map(Value::String),
        // Values services look for.
        prop_oneof![Just(json!("0")), Just(json!("0-3")), Just(json!("f1")), Just(json!(-1)), Just(json!(1u64 << 40))],
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        let keys = prop_oneof![
            Just("id".to_string()),
            Just("rank".to_string()),
            Just("ranks".to_string()),
            Just("name".to_string()),
            Just("jobspec".to_string()),
            Just("input".to_string()),
            Just("pid".to_string()),
            Just("topic".to_string()),
            Just("data".to_string()),
            Just("kvs".to_string()),
            Just("shell_rank".to_string()),
            Just("report".to_string()),
            Just("parent".to_string()),
            Just("count".to_string()),
            Just("follow".to_string()),
            "[a-z_]{1,8}",
        ];
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::btree_map(keys, inner, 0..5).prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A valid submission with one of its fields replaced by arbitrary JSON: reaches the jobspec's own checks, not
/// only the first "is it an object" one.
fn mutated_submit() -> impl Strategy<Value = Message> {
    const PATHS: &[&str] = &[
        "/resources",
        "/resources/0/count",
        "/resources/0/type",
        "/resources/0/with",
        "/tasks",
        "/tasks/0/command",
        "/tasks/0/count",
        "/attributes/system/duration",
        "/attributes/system/shell/options",
        "/attributes/system/environment",
        "/attributes/system/cwd",
        "/version",
    ];
    (proptest::sample::select(PATHS), any_json()).prop_map(|(path, v)| {
        let spec = crate::jobspec::JobspecBuilder::new(vec!["true"]).build().expect("a jobspec").to_json();
        let mut spec: Value = serde_json::from_str(&spec).expect("JSON");
        if let Some(slot) = spec.pointer_mut(path) {
            *slot = v;
        }
        Message::request("job-manager.submit", NODEID_ANY, &json!({"jobspec": spec}))
    })
}

/// A payload: JSON, or bytes that are not.
fn any_payload() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => any_json().prop_map(|v| serde_json::to_vec(&v).unwrap_or_default()),
        1 => proptest::collection::vec(any::<u8>(), 0..64),
    ]
}

fn any_topic() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => proptest::sample::select(TOPICS).prop_map(str::to_string),
        1 => "[a-z.-]{0,20}",
    ]
}

/// One message as it might arrive: any type, any topic, any payload, a short route, any flags.
fn any_message(controls: bool) -> impl Strategy<Value = Message> {
    let kinds: Vec<MsgType> = if controls {
        vec![MsgType::Request, MsgType::Response, MsgType::Event, MsgType::Control]
    } else {
        vec![MsgType::Request]
    };
    (
        proptest::sample::select(kinds),
        prop_oneof![any_topic(), proptest::sample::select(CONTROLS).prop_map(str::to_string)],
        any_payload(),
        prop_oneof![Just(NODEID_ANY), Just(0u32), 0u32..10],
        any::<u32>(),
        proptest::collection::vec(0u32..10, 0..3),
        any::<u8>(),
        any::<u32>(),
    )
        .prop_map(|(msgtype, topic, payload, nodeid, matchtag, route, flags, errnum)| {
            let mut m = Message::request_json(&topic, nodeid, payload);
            m.msgtype = msgtype;
            m.matchtag = matchtag;
            m.route = route;
            m.flags = flags;
            m.errnum = if msgtype == MsgType::Response { errnum % 200 } else { 0 };
            m
        })
}

/// A request from local client 5 is answered or held (watchers, barriers) and the broker goes on; it is never
/// answered twice.
fn local_request(b: &mut Broker, mut m: Message) -> Result<(), String> {
    if m.topic == "broker.shutdown" {
        return Ok(());
    }
    m.matchtag = 77;
    b.handle(t(0.1), Input::Message(Peer::Local(5), 0, m.clone()));
    let out = effects(b);
    let answers = out
        .iter()
        .filter(|e| matches!(e, Effect::Send(Peer::Local(5), r) if r.msgtype == MsgType::Response && r.matchtag == 77))
        .count();
    if answers > 1 && !matches!(m.topic.as_str(), "job-manager.eventlog" | "job-info.output" | "resource.eventlog") {
        return Err(format!("{}: answered {answers} times: {out:?}", m.topic));
    }
    // Time passes: timers of whatever it started run too.
    b.handle(t(5.0), Input::Timer);
    effects(b);
    still_answers(b, t(5.1))
}

/// The replayed corpus: `{"topic", "payload"}` requests from a local client of rank 0, and `{"from": "child",
/// "type", "topic", "payload"}` messages from child rank 3 of a router.
#[test]
fn the_seed_corpus_is_refused_or_served_and_the_broker_goes_on() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus/broker");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).expect("corpus directory").flatten() {
        let text = std::fs::read_to_string(e.path()).expect("corpus file");
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|err| panic!("{}: {err}", e.path().display()));
        let topic = v["topic"].as_str().unwrap_or_default();
        let payload = match &v["payload"] {
            Value::String(s) if v["raw"] == true => s.as_bytes().to_vec(),
            p => serde_json::to_vec(p).unwrap_or_default(),
        };
        let mut m = Message::request_json(topic, NODEID_ANY, payload);
        let r = if v["from"] == "child" {
            m.msgtype = match v["type"].as_str() {
                Some("event") => MsgType::Event,
                Some("control") => MsgType::Control,
                Some("response") => MsgType::Response,
                _ => MsgType::Request,
            };
            let mut b = router();
            b.handle(t(0.1), Input::Message(Peer::Child(3), 9, m));
            effects(&mut b);
            still_answers(&mut b, t(0.2))
        } else {
            local_request(&mut rank0(), m)
        };
        r.unwrap_or_else(|err| panic!("{}: {err}", e.path().display()));
        n += 1;
    }
    assert!(n >= 5, "corpus too small: {n} files in {}", dir.display());
}

/// `rexec.spawn` with an `input` that is not an object (issue 14 names it: it once panicked the broker) is
/// refused with EPROTO.
#[test]
fn a_spawn_request_with_a_malformed_input_is_refused() {
    let mut b = rank0();
    for input in [json!(null), json!(3), json!("x"), json!([1, 2])] {
        let mut m = Message::request("rexec.spawn", NODEID_ANY, &json!({"id": 42, "input": input}));
        m.matchtag = 9;
        b.handle(t(0.1), Input::Message(Peer::Local(5), 0, m));
        let out = effects(&mut b);
        let r = out.iter().find_map(|e| match e {
            Effect::Send(Peer::Local(5), r) if r.matchtag == 9 => Some(r),
            _ => None,
        });
        assert!(r.is_some_and(|r| r.errnum == errno::EPROTO), "input {input}: {out:?}");
        assert!(!out.iter().any(|e| matches!(e, Effect::SpawnShell { .. })), "input {input}: {out:?}");
    }
    still_answers(&mut b, t(0.2)).unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Any request a local client sends to rank 0.
    #[test]
    fn any_request_from_a_client_is_answered_or_held_and_never_panics(m in any_message(false)) {
        let mut b = rank0();
        prop_assert_eq!(local_request(&mut b, m), Ok(()));
    }

    /// A valid submission with one field of its jobspec replaced by anything.
    #[test]
    fn any_mutated_submission_is_refused_or_queued(m in mutated_submit()) {
        let mut b = rank0();
        prop_assert_eq!(local_request(&mut b, m), Ok(()));
    }

    /// A run of requests from one client: state left by one (a job submitted, a watcher) meets the next.
    #[test]
    fn a_run_of_requests_never_panics(
        ms in proptest::collection::vec(prop_oneof![3 => any_message(false), 1 => mutated_submit()], 1..8),
    ) {
        let mut b = rank0();
        for m in ms {
            prop_assert_eq!(local_request(&mut b, m), Ok(()));
        }
    }

    /// Any message of any type from a child link of a router (an authenticated peer can still be buggy), and
    /// from its parent.
    #[test]
    fn any_message_from_a_peer_never_panics(m in any_message(true), from_parent in any::<bool>()) {
        let mut b = router();
        let (peer, conn) = if from_parent { (Peer::Parent, 0) } else { (Peer::Child(3), 9) };
        // A `shutdown` from the parent, or a refusal, legitimately ends the broker: nothing to ask it then.
        let ends = m.msgtype == MsgType::Control && from_parent && matches!(m.topic.as_str(), "shutdown" | "refused");
        b.handle(t(0.1), Input::Message(peer, conn, m));
        effects(&mut b);
        b.handle(t(5.0), Input::Timer);
        effects(&mut b);
        if !ends {
            prop_assert_eq!(still_answers(&mut b, t(5.1)), Ok(()));
        }
    }

    /// Any hello from a would-be child: accepted or refused with a reason, never anything else.
    #[test]
    fn any_hello_is_accepted_or_refused(payload in any_payload()) {
        let mut b = rank0();
        let mut m = Message::control("hello", &json!({}));
        m.payload = payload;
        b.handle(t(0.1), Input::Hello { conn: 11, msg: m, addr: "peer".into(), refusal: None });
        let out = effects(&mut b);
        let verdicts = out
            .iter()
            .filter(|e| matches!(e, Effect::AcceptChild { conn: 11, .. } | Effect::RefuseChild { conn: 11, .. }))
            .count();
        prop_assert_eq!(verdicts, 1, "{:?}", out);
        prop_assert_eq!(still_answers(&mut b, t(0.2)), Ok(()));
    }
}
