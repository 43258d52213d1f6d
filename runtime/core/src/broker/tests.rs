//! Unit tests of the sans-IO broker: one broker, inputs and virtual time in, effects inspected.

use super::core::{Broker, Effect, Input, MemberState, Peer, Time, PARENT};
use crate::membership::{Config, PeerState, Signal};
use crate::message::{errno, Message, MsgType};
use crate::topology::Topology;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::time::Duration;

fn t(s: f64) -> Time {
    Time::from_secs_f64(s)
}

/// Rank `rank` of a 7-broker binary tree (children of 1: 3, 4; of 0: 1, 2).
fn broker(rank: u32) -> Broker {
    super::testing::new_broker(rank, 7, Topology::Kary(2), 4, Config::default(), Time::ZERO)
}

/// Every effect the broker hands out now, in order. An [`Effect::Store`] (rank 0 with a state directory) is
/// answered at once, as by a store that takes every batch.
fn effects(b: &mut Broker) -> Vec<Effect> {
    let mut out = Vec::new();
    while let Some(e) = b.poll_effect() {
        if matches!(e, Effect::Store { .. }) {
            b.handle(b.now, Input::Stored { result: Ok(()), durable: false });
        }
        out.push(e);
    }
    out
}

fn hello(rank: u64, instance: &str) -> Message {
    Message::control("hello", &json!({"rank": rank, "instance": instance}))
}

/// Hand `b` a hello and return its verdict.
fn judge(b: &mut Broker, now: Time, conn: u64, msg: Message, refusal: Option<String>) -> Result<u32, String> {
    b.handle(now, Input::Hello { conn, msg, addr: "peer".into(), refusal });
    let out = effects(b);
    for e in out {
        match e {
            Effect::AcceptChild { conn: c, rank } if c == conn => return Ok(rank),
            Effect::RefuseChild { conn: c, why, .. } if c == conn => return Err(why),
            _ => {}
        }
    }
    panic!("neither accepted nor refused");
}

/// Rank 0 with rank 1 joined as its child (and registered).
fn root_with_child() -> Broker {
    let mut b = broker(0);
    b.handle(t(0.0), Input::Start);
    assert_eq!(judge(&mut b, t(0.001), 7, hello(1, "sim"), None), Ok(1));
    // Rank 1 registers, as its broker does once joined (the request carries its broker's uid).
    let reg = json!({"rank": 1, "hostname": "node1", "resources": {"cores": 4, "pus": 4, "numa": 1, "packages": 1,
        "gpus": 0, "gpu_names": [], "source": "test"}, "cores": "0-3", "gpus": ""});
    let mut m = Message::request("resource.register", 0, &reg);
    m.flags = crate::message::FLAG_NORESPONSE;
    m.userid = super::testing::UID;
    b.handle(t(0.002), Input::Message(Peer::Child(1), 7, m));
    effects(&mut b);
    assert_eq!(b.members[&1].0, MemberState::Online);
    b
}

/// The checks of suspect nodes among `out` ([`Effect::CheckNode`]) all end with no answer at `now`, as for a
/// dead node: the effects that follows.
fn no_answer(b: &mut Broker, now: Time, out: &[Effect]) -> Vec<Effect> {
    let tokens: Vec<u64> = out
        .iter()
        .filter_map(|e| match e {
            Effect::CheckNode { token, .. } => Some(*token),
            _ => None,
        })
        .collect();
    assert!(!tokens.is_empty(), "no check of a suspect was asked for: {out:?}");
    let mut more = Vec::new();
    for token in tokens {
        b.handle(now, Input::NodeChecked { token, answered: Some(false) });
        more.extend(effects(b));
    }
    more
}

/// Run `b`'s timers up to `until`, as a driver does; the effects they asked for.
fn run_to(b: &mut Broker, until: Time) -> Vec<Effect> {
    let mut out = Vec::new();
    while let Some(d) = b.next_deadline().filter(|d| *d <= until) {
        b.handle(d, Input::Timer);
        out.extend(effects(b));
    }
    out
}

fn responses(out: &[Effect], to: Peer) -> Vec<&Message> {
    out.iter()
        .filter_map(|e| match e {
            Effect::Send(p, m) if *p == to && m.msgtype == MsgType::Response => Some(m),
            _ => None,
        })
        .collect()
}

#[test]
fn hello_rules() {
    let mut b = broker(1);
    b.handle(t(0.0), Input::ParentUp(super::links::LinkChoice { transport: "tcp", detail: String::new() }));
    effects(&mut b);
    assert_eq!(judge(&mut b, t(0.1), 1, hello(3, "sim"), None), Ok(3));
    assert_eq!(judge(&mut b, t(0.1), 2, hello(3, "sim"), None), Err("rank 3 is already connected".into()));
    assert_eq!(judge(&mut b, t(0.1), 3, hello(2, "sim"), None), Err("rank 2 is not a child of rank 1".into()));
    assert_eq!(judge(&mut b, t(0.1), 4, hello(4, "other"), None), Err("rank 4 belongs to another instance".into()));
    let no_rank = Message::control("hello", &json!({"instance": "sim"}));
    assert_eq!(judge(&mut b, t(0.1), 5, no_rank, None), Err("hello without a rank".into()));
    let huge = Message::control("hello", &json!({"rank": 1u64 << 32 | 4, "instance": "sim"}));
    assert!(judge(&mut b, t(0.1), 6, huge, None).is_err(), "rank 2^32 + 4 is not rank 4");
    assert_eq!(judge(&mut b, t(0.1), 7, hello(4, "sim"), Some("no RDMA".into())), Err("no RDMA".into()));
    b.handle(t(0.2), Input::Signal(crate::signal::SIGTERM));
    effects(&mut b);
    assert_eq!(judge(&mut b, t(0.3), 8, hello(4, "sim"), None), Err("broker is shutting down".into()));
}

#[test]
fn routing_errors_are_answered_never_dropped() {
    let mut b = root_with_child();
    b.handle(t(0.01), Input::LocalNew { id: 5, uid: super::testing::UID });
    let send = |b: &mut Broker, topic: &str, nodeid: u32, tag: u32| {
        let mut m = Message::request(topic, nodeid, &json!({}));
        m.matchtag = tag;
        b.handle(t(0.02), Input::Message(Peer::Local(5), 0, m));
        effects(b)
    };
    // No such rank.
    let out = send(&mut b, "broker.ping", 99, 1);
    assert_eq!(responses(&out, Peer::Local(5))[0].errnum, errno::EHOSTUNREACH);
    // Rank 2 never connected: its route is down.
    let out = send(&mut b, "broker.ping", 2, 2);
    let r = responses(&out, Peer::Local(5));
    assert_eq!(
        (r[0].errnum, r[0].errstr().unwrap_or_default()),
        (errno::EHOSTUNREACH, "rank 2 is not connected".into())
    );
    // Rank 3 is behind rank 1, which is connected: forwarded, no answer yet.
    let out = send(&mut b, "broker.ping", 3, 3);
    assert!(out.iter().any(|e| matches!(e, Effect::Send(Peer::Child(1), m) if m.matchtag == 3)));
    // The driver could not send it after all: an error, not silence.
    let m = out.into_iter().find_map(|e| match e {
        Effect::Send(Peer::Child(1), m) => Some(m),
        _ => None,
    });
    b.handle(t(0.03), Input::Bounced(Peer::Child(1), m.expect("sent")));
    let out = effects(&mut b);
    assert!(responses(&out, Peer::Local(5))[0].errstr().unwrap_or_default().contains("through rank 1"));
    // No service of that name anywhere.
    let out = send(&mut b, "nosuch.method", crate::message::NODEID_ANY, 4);
    assert_eq!(responses(&out, Peer::Local(5))[0].errnum, errno::ENOSYS);
    // A peer may not speak for another user.
    let mut m = Message::request("broker.ping", 0, &json!({}));
    m.userid = 4242;
    b.handle(t(0.04), Input::Message(Peer::Child(1), 7, m));
    let out = effects(&mut b);
    assert_eq!(responses(&out, Peer::Child(1))[0].errnum, errno::EPERM);
}

#[test]
fn requests_in_flight_to_a_lost_child_get_ehostunreach_once() {
    let mut b = root_with_child();
    b.handle(t(0.01), Input::LocalNew { id: 5, uid: super::testing::UID });
    let mut m = Message::request("broker.ping", 3, &json!({}));
    m.matchtag = 9;
    b.handle(t(0.02), Input::Message(Peer::Local(5), 0, m));
    effects(&mut b);
    b.handle(t(0.05), Input::Closed(Peer::Child(1), 7, "connection reset".into()));
    let out = effects(&mut b);
    let r = responses(&out, Peer::Local(5));
    assert_eq!(r.len(), 1);
    assert_eq!((r[0].matchtag, r[0].errnum), (9, errno::EHOSTUNREACH));
    assert!(out.iter().any(|e| matches!(e, Effect::DropLink(Peer::Child(1), 7))));
    assert_eq!(b.members[&1].0, MemberState::Lost);
    assert!(b.members.get(&3).is_none_or(|m| m.0 != MemberState::Lost), "its children re-parent (reparent.rs)");
    // A late response from the dead link changes nothing.
    let mut late = Message::response_to(&Message::request("broker.ping", 3, &json!({})), &json!({}));
    late.matchtag = 9;
    b.handle(t(0.06), Input::Message(Peer::Child(1), 7, late));
    assert!(responses(&effects(&mut b), Peer::Local(5)).is_empty());
}

#[test]
fn liveness_in_virtual_time_heartbeats_torpid_lost() {
    let mut b = root_with_child();
    let c = *b.membership.config();
    // The heartbeat is due one period after joining.
    let due = b.next_deadline().expect("a deadline");
    assert!(due <= t(c.heartbeat_period + 0.002), "{due:?}");
    b.handle(due, Input::Timer);
    let out = effects(&mut b);
    assert!(matches!(out.first(), Some(Effect::Heartbeat)), "ACK state sampled first: {out:?}");
    assert!(out.iter().any(|e| matches!(e, Effect::Send(Peer::Child(1), m) if m.topic == "hb")));
    // Silent past torpid_max, but the node's kernel answers probes: torpid, not lost.
    let quiet = t(c.torpid_max + 0.1);
    b.handle(t(0.1), Input::Probe(1, Signal::ProbeReply { kernel: true, alive: true, hb_age: 0.1 }));
    run_to(&mut b, quiet);
    b.handle(quiet, Input::Probe(1, Signal::ProbeReply { kernel: true, alive: true, hb_age: c.torpid_max + 0.1 }));
    run_to(&mut b, quiet);
    assert_eq!(b.members[&1].0, MemberState::Torpid, "{:?}", b.members[&1]);
    // Its node stops answering probes and acknowledging our data: lost.
    // Outstanding TCP data alone does not make it lost while its kernel answers probes.
    b.handle(quiet, Input::AckSamples(vec![(1, 3, 0.2, 0.0)]));
    b.handle(quiet + Duration::from_secs(1), Input::AckSamples(vec![(1, 3, 1.2, 0.0)]));
    effects(&mut b);
    assert_eq!(b.members[&1].0, MemberState::Torpid, "vouched for by its kernel");
    let later = quiet + Duration::from_secs(1);
    b.handle(later, Input::Probe(1, Signal::ProbeMissed { misses: c.probe_misses - 1 }));
    assert_eq!(b.members[&1].0, MemberState::Torpid, "fewer misses than tbon.probe_misses are tolerated");
    b.handle(later, Input::Probe(1, Signal::ProbeMissed { misses: c.probe_misses }));
    let out = effects(&mut b);
    assert_eq!(b.members[&1].0, MemberState::Lost, "{:?}", b.members[&1]);
    assert!(out.iter().any(|e| matches!(e, Effect::ForgetChild(1))));
    assert!(!b.children.contains_key(&1));
}

#[test]
fn a_broker_that_loses_its_parent_shuts_down_and_exits_nonzero() {
    let mut b = broker(1);
    b.handle(t(0.0), Input::ParentUp(super::links::LinkChoice { transport: "tcp", detail: String::new() }));
    b.handle(t(0.0), Input::Start);
    effects(&mut b);
    b.handle(t(1.0), Input::AckSamples(vec![(PARENT, 2, 1.0, 0.0)]));
    assert!(effects(&mut b).is_empty(), "outstanding data is judged once it has been for tbon.lost_timeout");
    b.handle(t(1.2), Input::AckSamples(vec![(PARENT, 2, 1.2, 0.0)]));
    let out = effects(&mut b);
    assert!(!out.iter().any(|e| matches!(e, Effect::DropLink(Peer::Parent, _))), "suspect, not lost: {out:?}");
    assert!(out.iter().any(|e| matches!(e, Effect::CheckNode { target: super::confirm::CheckTarget::Parent, .. })));
    let out = no_answer(&mut b, t(1.35), &out);
    assert!(out.iter().any(|e| matches!(e, Effect::DropLink(Peer::Parent, _))), "{out:?}");
    assert!(b.finished(), "no children to wait for");
    assert_eq!(b.exit_code(), crate::shellproto::BROKER_EXIT_CUT_OFF, "cut off: EX_UNAVAILABLE");
}

#[test]
fn rexec_spawn_is_answered_when_the_driver_has_started_the_shell() {
    let mut b = broker(0);
    b.handle(t(0.0), Input::Start);
    b.handle(t(0.0), Input::LocalNew { id: 5, uid: super::testing::UID });
    effects(&mut b);
    // A real job: submitted by the client, allocated on rank 0, its shell asked of rank 0's own rexec.
    let spec: serde_json::Value =
        serde_json::from_str(&crate::jobspec::JobspecBuilder::new(["true"]).build().expect("jobspec").to_json())
            .expect("json");
    let mut m = Message::request("job-manager.submit", 0, &json!({"jobspec": spec}));
    m.matchtag = 1;
    b.handle(t(0.1), Input::Message(Peer::Local(5), 0, m));
    let out = effects(&mut b);
    let spawn = out.iter().find_map(|e| match e {
        Effect::SpawnShell { id, input, .. } => Some((*id, input.command.clone())),
        _ => None,
    });
    let (id, cmd) = spawn.expect("a shell to spawn");
    assert_eq!(cmd, vec!["true".to_string()]);
    b.handle(t(0.11), Input::ShellStarted { id, result: Ok(4321) });
    effects(&mut b);
    assert!(b.shells.contains(&id));
    let report = crate::shellproto::ShellReport {
        status: 0,
        tasks: vec![(0, 0)],
        error: None,
        abort_code: None,
        usage: None,
        ended: None,
    };
    b.handle(t(0.2), Input::ShellDone { id, report: Some(report), status: 0, lingering: vec![] });
    effects(&mut b);
    let job = &b.jobcore.as_ref().expect("rank 0").jobs[&id];
    assert_eq!((job.state, job.status), (crate::jobs::JobState::Inactive, Some(0)));
    // A shell that cannot be started fails its job with the driver's reason.
    let mut m = Message::request("job-manager.submit", 0, &json!({"jobspec": spec}));
    m.matchtag = 2;
    b.handle(t(0.3), Input::Message(Peer::Local(5), 0, m));
    let id2 = effects(&mut b)
        .into_iter()
        .find_map(|e| match e {
            Effect::SpawnShell { id, .. } => Some(id),
            _ => None,
        })
        .expect("spawned");
    b.handle(t(0.31), Input::ShellStarted { id: id2, result: Err("cannot run vigil-shell: no such file".into()) });
    effects(&mut b);
    let job = &b.jobcore.as_ref().expect("rank 0").jobs[&id2];
    let note = job.fatal.as_ref().map(|e| e.note.clone()).unwrap_or_default();
    assert!(note.contains("cannot run vigil-shell"), "{note}");
    assert!(!b.shells.contains(&id2));
}

/// A broker that wakes late (starved for less than tbon.torpid_max) past a child's unacknowledged-data deadline
/// asks its driver for a fresh sample and judges on that, not on the sample it took before its stall.
#[test]
fn a_late_timer_asks_for_a_fresh_ack_sample_before_judging_a_child() {
    let mut b = root_with_child();
    let c = *b.membership.config();
    // Past the link's first second (crate::membership::LINK_SETTLE), timers on time.
    let t0 = t(1.2);
    run_to(&mut b, t0);
    b.handle(t0, Input::AckSamples(vec![(1, 1, 0.005, 0.0)]));
    effects(&mut b);
    // Woken between heartbeats, past the deadline: no verdict, a sample is asked for.
    let b_hb = b.next_heartbeat;
    let woke = t0 + Duration::from_secs_f64(c.lost_timeout * 1.5);
    assert!(woke < b_hb + Duration::from_secs_f64(c.torpid_max), "no stall grace in this test");
    b.handle(woke, Input::Timer);
    let out = effects(&mut b);
    assert!(out.iter().any(|e| matches!(e, Effect::SampleAcks | Effect::Heartbeat)), "{out:?}");
    assert!(!out.iter().any(|e| matches!(e, Effect::CheckNode { .. })), "suspected on the stale sample: {out:?}");
    assert_ne!(b.members[&1].0, MemberState::Lost, "judged on the stale sample");
    // The fresh sample shows the child's kernel acknowledged just after the first one: not suspect.
    let age = woke.since(t0).as_secs_f64() - 0.001;
    b.handle(woke, Input::AckSamples(vec![(1, 1, age, 0.0)]));
    assert!(!effects(&mut b).iter().any(|e| matches!(e, Effect::CheckNode { .. })));
    assert_ne!(b.members[&1].0, MemberState::Lost);
    // A fresh sample showing no acknowledgement since then: suspect, and lost when no path reaches its node. (The
    // judge woke late: lost_timeout is stretched by its lateness factor meanwhile, confirm.rs.)
    assert!(b.confirm.factor() > 1.0, "woken late: the judge knows it");
    let later = woke + Duration::from_secs_f64(c.lost_timeout * b.confirm.factor() + 0.01);
    b.handle(later, Input::AckSamples(vec![(1, 1, later.since(woke).as_secs_f64() + 0.001, 0.0)]));
    let out = effects(&mut b);
    assert_ne!(b.members[&1].0, MemberState::Lost, "lost on one signal");
    no_answer(&mut b, later, &out);
    assert_eq!(b.members[&1].0, MemberState::Lost, "{:?}", b.members[&1]);
}

/// Rank 1 of [`broker`], its parent link up: its children are ranks 3 and 4.
fn router() -> Broker {
    let mut b = broker(1);
    b.handle(t(0.0), Input::ParentUp(super::links::LinkChoice { transport: "tcp", detail: String::new() }));
    effects(&mut b);
    b
}

/// A hello of rank 3 (a child of [`router`]) with `field` set to `value` (`null`: removed).
fn hello_with(field: &str, value: serde_json::Value) -> Message {
    let (topo, size) = (Topology::Kary(2), 7);
    let mut v = super::liveness::hello_payload(3, "sim", size, &topo, "node3");
    if let Some(o) = v.as_object_mut() {
        match value {
            serde_json::Value::Null => o.remove(field),
            value => o.insert(field.into(), value),
        };
    }
    Message::control("hello", &v)
}

#[test]
fn a_hello_of_another_tree_or_wire_version_is_refused_with_a_reason() {
    let mut b = router();
    assert_eq!(judge(&mut b, t(0.1), 1, hello_with("hostname", json!("node3")), None), Ok(3), "the full hello");
    let mut b = router();
    for (field, value, says) in [
        ("size", json!(9), "counts 9 brokers"),
        ("size", json!(1u64 << 32 | 7), "brokers"),
        ("size", json!("7"), "brokers"),
        ("topo", json!("kary:4"), "tbon.topo=kary:4"),
        ("topo", json!(2), "'topo' must be a string"),
        ("version", json!(crate::message::WIRE_VERSION + 1), "wire version"),
        ("version", json!(-1), "wire version"),
        ("instance", serde_json::Value::Null, "without an instance id"),
        ("instance", json!(7), "without an instance id"),
        ("rank", json!(9), "not in this instance of 7 brokers"),
        ("rank", json!("3"), "'rank' must be an integer"),
        ("rank", json!(-3), "'rank' must be an integer"),
        ("rank", json!(3.5), "'rank' must be an integer"),
    ] {
        let why = judge(&mut b, t(0.1), 2, hello_with(field, value.clone()), None).expect_err(field);
        assert!(why.contains(says), "{field}={value}: {why}");
    }
    assert!(b.children.is_empty(), "nothing was accepted");
    // A payload that is not an object, or not JSON at all.
    for payload in [json!([3, "sim"]), json!("hello"), json!(3)] {
        let why = judge(&mut b, t(0.1), 3, Message::control("hello", &payload), None).expect_err("not an object");
        assert!(why.contains("not a JSON object"), "{why}");
    }
    let mut garbage = Message::control("hello", &json!({}));
    garbage.payload = b"{\"rank\": 3, \"instance\"".to_vec();
    assert!(judge(&mut b, t(0.1), 4, garbage, None).expect_err("truncated").contains("not JSON"));
}

#[test]
fn a_refusal_quotes_little_of_what_the_peer_sent() {
    let mut b = router();
    let long = "kary:".to_string() + &"9".repeat(4000);
    let why = judge(&mut b, t(0.1), 1, hello_with("topo", json!(long)), None).expect_err("another topo");
    assert!(why.len() < 200, "{} bytes: {why}", why.len());
    let odd = "é".repeat(100);
    let why = judge(&mut b, t(0.1), 2, hello_with("topo", json!(odd)), None).expect_err("another topo");
    assert!(why.len() < 200, "cut on a character boundary: {why}");
}

#[test]
fn one_link_joins_as_one_rank_once() {
    let mut b = router();
    assert_eq!(judge(&mut b, t(0.1), 1, hello(3, "sim"), None), Ok(3));
    // Another hello on the same link, as another child or as itself again: refused, the first stands.
    for rank in [4, 3] {
        let why = judge(&mut b, t(0.2), 1, hello(rank, "sim"), None).expect_err("a second hello");
        assert!(why.contains("already joined as rank 3"), "{why}");
    }
    assert_eq!(b.children.iter().map(|(r, c)| (*r, *c)).collect::<Vec<_>>(), vec![(3, 1)]);
    // Rank 4 on its own link is a child like any other.
    assert_eq!(judge(&mut b, t(0.3), 2, hello(4, "sim"), None), Ok(4));
}

/// Every hello, whatever its fields hold, gets one verdict, and only this broker's children are ever accepted,
/// each once.
#[test]
fn any_hello_gets_one_verdict_and_only_children_join() {
    let mut b = router();
    let values = [
        json!(null),
        json!(0),
        json!(3),
        json!(4),
        json!(7),
        json!(-1),
        json!(1.5),
        json!(u32::MAX),
        json!(1u64 << 32 | 3),
        json!(u64::MAX),
        json!("3"),
        json!("sim"),
        json!(""),
        json!([3]),
        json!({"rank": 3}),
        json!(true),
    ];
    let mut conn = 10;
    for field in ["rank", "instance", "version", "size", "topo", "hostname", "probe_port", "rdma", "rdma_frame"] {
        for v in &values {
            conn += 1;
            let _ = judge(&mut b, t(0.1), conn, hello_with(field, v.clone()), None);
        }
    }
    let kids = Topology::Kary(2).children(7, 1);
    assert!(b.children.keys().all(|r| kids.contains(r)), "{:?}", b.children);
    assert!(b.children.len() <= kids.len());
}

/// A local client of [`broker`]`(0)` (started, so its own node is registered): id 5.
fn root_with_client() -> Broker {
    let mut b = broker(0);
    b.handle(t(0.0), Input::Start);
    b.handle(t(0.0), Input::LocalNew { id: 5, uid: super::testing::UID });
    effects(&mut b);
    b
}

/// Client 5's request `topic` with `payload` (and `flags`); the responses it gets.
fn ask(b: &mut Broker, topic: &str, payload: serde_json::Value, flags: u8) -> Vec<Message> {
    let mut m = Message::request(topic, 0, &payload);
    m.matchtag = 1;
    m.flags = flags;
    b.handle(t(0.1), Input::Message(Peer::Local(5), 0, m));
    responses(&effects(b), Peer::Local(5)).into_iter().cloned().collect()
}

/// The one response to a request of client 5: `Ok(payload)` or `Err((errno, errstr))`.
fn ask1(b: &mut Broker, topic: &str, payload: serde_json::Value) -> Result<serde_json::Value, (u32, String)> {
    let r = ask(b, topic, payload, 0);
    assert_eq!(r.len(), 1, "{topic}: one response");
    match r[0].errnum {
        0 => Ok(r[0].json()),
        e => Err((e, r[0].errstr().unwrap_or_default())),
    }
}

#[test]
fn subscriptions_are_a_bounded_set_per_client() {
    let mut b = root_with_client();
    for _ in 0..1000 {
        assert_eq!(ask1(&mut b, "broker.sub", json!({"topic": "job-"})), Ok(json!({})), "a repeat is a no-op");
    }
    assert_eq!(b.locals[&5].subs.len(), 1);
    // One event, delivered once.
    b.publish("job-state", &json!({}));
    let out = effects(&mut b);
    assert_eq!(out.iter().filter(|e| matches!(e, Effect::Send(Peer::Local(5), _))).count(), 1);
    // Distinct prefixes up to the bound, then a clear error; the ones held stay.
    let mut k = 0;
    let (e, why) = loop {
        match ask1(&mut b, "broker.sub", json!({"topic": format!("t{k}.")})) {
            Ok(_) => k += 1,
            Err(e) => break e,
        }
        assert!(k <= super::services::MAX_SUBS_PER_CLIENT, "unbounded");
    };
    assert_eq!(e, errno::ENOSPC, "{why}");
    assert!(why.contains("subscriptions"), "{why}");
    assert_eq!(b.locals[&5].subs.len(), super::services::MAX_SUBS_PER_CLIENT);
    assert_eq!(ask1(&mut b, "broker.sub", json!({"topic": "t0."})), Ok(json!({})), "held already: a no-op");
    // Unsubscribing makes room.
    assert_eq!(ask1(&mut b, "broker.unsub", json!({"topic": "t0."})), Ok(json!({})));
    assert_eq!(ask1(&mut b, "broker.sub", json!({"topic": "other."})), Ok(json!({})));
    // A prefix longer than any topic could be.
    assert_eq!(ask1(&mut b, "broker.unsub", json!({"topic": "t1."})), Ok(json!({})));
    let long = "x".repeat(super::services::MAX_SUB_TOPIC + 1);
    assert_eq!(ask1(&mut b, "broker.sub", json!({ "topic": long })).map_err(|e| e.0), Err(errno::EINVAL));
}

/// A held job's reason says how to release it only to who may (its owner, the instance owner); a guest listing
/// every job sees the reason alone, as `vigil jobs -A` shows it.
#[test]
fn the_release_hint_is_for_who_may_release_the_job() {
    let mut b = root_with_client();
    b.opts.config.allow_guest_users = true;
    let spec: serde_json::Value =
        serde_json::from_str(&crate::jobspec::JobspecBuilder::new(["true"]).build().expect("jobspec").to_json())
            .expect("json");
    let id = ask1(&mut b, "job-manager.submit", json!({"jobspec": spec, "urgency": 0})).expect("submitted")["id"]
        .as_u64()
        .expect("an id");
    let f58 = crate::jobs::JobId(id).f58();
    let owner = ask1(&mut b, "job-manager.list", json!({})).expect("listed");
    assert_eq!(
        owner["jobs"][0]["reason_pending"].as_str(),
        Some(format!("held: urgency 0 (`vigil job release {f58}` lets it go)").as_str()),
        "{owner}"
    );
    b.handle(t(0.2), Input::LocalNew { id: 6, uid: 4242 });
    effects(&mut b);
    let mut m = Message::request("job-manager.list", 0, &json!({}));
    m.matchtag = 3;
    b.handle(t(0.3), Input::Message(Peer::Local(6), 0, m));
    let out = effects(&mut b);
    let r = responses(&out, Peer::Local(6));
    assert_eq!(r.len(), 1);
    let guest = r[0].json();
    assert_eq!(guest["jobs"][0]["reason_pending"].as_str(), Some(crate::jobs::HELD_REASON), "{guest}");
}

/// `job-manager.list` in pages (`vigil jobs -c N`, and any listing of more jobs than a message holds): `count`
/// bounds a page, `next` names its oldest job when more follow, and `before` asks for the jobs older than that.
#[test]
fn the_job_list_comes_in_pages_newest_first() {
    let mut b = root_with_client();
    let spec: serde_json::Value =
        serde_json::from_str(&crate::jobspec::JobspecBuilder::new(["true"]).build().expect("jobspec").to_json())
            .expect("json");
    let ids: Vec<u64> = (0..5)
        .map(|_| {
            let r = ask1(&mut b, "job-manager.submit", json!({"jobspec": spec, "urgency": 0})).expect("submitted");
            r["id"].as_u64().expect("an id")
        })
        .collect();
    let newest: Vec<u64> = ids.iter().rev().copied().collect();
    let listed = |r: &serde_json::Value| -> Vec<u64> {
        r["jobs"].as_array().expect("jobs").iter().filter_map(|j| j["id"].as_u64()).collect()
    };
    // Without count: every job, no next.
    let all = ask1(&mut b, "job-manager.list", json!({})).expect("listed");
    assert_eq!((listed(&all), all.get("next")), (newest.clone(), None), "{all}");
    // Pages of 2: walked with `before`, the last page without `next`.
    let mut got: Vec<u64> = Vec::new();
    let mut before: Option<u64> = None;
    for page in 0.. {
        assert!(page < 3, "more pages than 5 jobs make in pages of 2");
        let mut req = json!({"count": 2});
        if let Some(id) = before {
            req["before"] = id.into();
        }
        let r = ask1(&mut b, "job-manager.list", req).expect("listed");
        let l = listed(&r);
        assert!(l.len() <= 2, "{r}");
        got.extend(&l);
        match r.get("next").and_then(serde_json::Value::as_u64) {
            Some(next) => {
                assert_eq!(Some(&next), l.last(), "next is the page's oldest job: {r}");
                before = Some(next);
            }
            None => break,
        }
    }
    assert_eq!(got, newest);
    // `before` takes an f58 id too; a bad one is refused naming it.
    let r = ask1(&mut b, "job-manager.list", json!({"before": crate::jobs::JobId(ids[1]).f58()})).expect("listed");
    assert_eq!(listed(&r), vec![ids[0]]);
    assert!(ask1(&mut b, "job-manager.list", json!({"before": "nope"})).is_err());
}

#[test]
fn job_stdin_is_bounded_and_what_was_accepted_is_kept() {
    use base64::Engine as _;
    let mut b = root_with_client();
    let spec: serde_json::Value =
        serde_json::from_str(&crate::jobspec::JobspecBuilder::new(["cat"]).build().expect("jobspec").to_json())
            .expect("json");
    let id = ask1(&mut b, "job-manager.submit", json!({"jobspec": spec, "stdin": true})).expect("submitted")["id"]
        .as_u64()
        .expect("an id");
    let chunk = vec![b'x'; 100_000];
    let data = base64::engine::general_purpose::STANDARD.encode(&chunk);
    let mut accepted = 0;
    let (e, why) = loop {
        match ask1(&mut b, "job-exec.stdin", json!({"id": id, "data": data})) {
            Ok(_) => accepted += 1,
            Err(e) => break e,
        }
        assert!(accepted * chunk.len() <= crate::jobs::STDIN_KEEP, "held past the bound");
    };
    assert_eq!(e, errno::ENOSPC, "{why}");
    assert!(why.contains("full"), "{why}");
    assert!(accepted > 0);
    // A smaller chunk that still fits is taken; input that is not base64 is refused as such.
    let held = accepted * chunk.len();
    let rest = crate::jobs::STDIN_KEEP - held;
    let tail = base64::engine::general_purpose::STANDARD.encode(vec![b'y'; rest]);
    assert_eq!(ask1(&mut b, "job-exec.stdin", json!({"id": id, "data": tail})), Ok(json!({})));
    let bad = ask1(&mut b, "job-exec.stdin", json!({"id": id, "data": "not base64!"}));
    assert_eq!(bad.map_err(|e| e.0), Err(errno::EPROTO));
    // End of input is taken even when full.
    assert_eq!(ask1(&mut b, "job-exec.stdin", json!({"id": id, "eof": true})), Ok(json!({})));
    // A shell reading the input gets every accepted chunk, in order, then the end.
    let got = ask(&mut b, "job-info.stdin", json!({ "id": id }), crate::message::FLAG_STREAMING);
    let (last, chunks) = got.split_last().expect("responses");
    assert_eq!(last.errnum, errno::ENODATA);
    let bytes: Vec<u8> = chunks
        .iter()
        .flat_map(|m| {
            base64::engine::general_purpose::STANDARD.decode(m.json()["data"].as_str().expect("data")).expect("b64")
        })
        .collect();
    assert_eq!(bytes.len(), crate::jobs::STDIN_KEEP);
    assert!(bytes[..held].iter().all(|c| *c == b'x') && bytes[held..].iter().all(|c| *c == b'y'));
}

/// What a client leaves waiting on a broker is bounded per client (process-exit watches, job watchers, round-trip
/// runs) and dropped when it goes; another client is not refused for it.
#[test]
fn requests_that_wait_are_bounded_per_client_and_dropped_with_it() {
    use super::services::{MAX_RTT_RUNS_PER_CLIENT, MAX_WAITING_PER_CLIENT};
    let mut b = root_with_child();
    b.handle(t(0.01), Input::LocalNew { id: 5, uid: super::testing::UID });
    effects(&mut b);
    // Process-exit watches: held (no answer) up to the bound, then ENOSPC; a repeat of one pid counts too.
    for k in 0..MAX_WAITING_PER_CLIENT {
        assert!(ask(&mut b, "detect.watch", json!({"pid": 1000 + k % 7}), 0).is_empty(), "watch {k} held");
    }
    let e = ask1(&mut b, "detect.watch", json!({"pid": 2})).expect_err("past the bound");
    assert_eq!(e.0, errno::ENOSPC, "{e:?}");
    // Round-trip runs to rank 1 (in flight: rank 1 has not answered): two per client, then EAGAIN.
    for _ in 0..MAX_RTT_RUNS_PER_CLIENT {
        assert!(ask(&mut b, "broker.rtt", json!({"rank": 1, "count": 1_000_000}), 0).is_empty());
    }
    let e = ask1(&mut b, "broker.rtt", json!({"rank": 1})).expect_err("past the bound");
    assert_eq!(e.0, errno::EAGAIN, "{e:?}");
    // Job watchers: ENOSPC past the bound.
    let spec: serde_json::Value =
        serde_json::from_str(&crate::jobspec::JobspecBuilder::new(["true"]).build().expect("jobspec").to_json())
            .expect("json");
    let id = ask1(&mut b, "job-manager.submit", json!({ "jobspec": spec })).expect("submitted")["id"].clone();
    let stream = crate::message::FLAG_STREAMING;
    for _ in 0..MAX_WAITING_PER_CLIENT {
        ask(&mut b, "job-manager.eventlog", json!({"id": id, "follow": true}), stream);
    }
    let r = ask(&mut b, "job-manager.eventlog", json!({"id": id, "follow": true}), stream);
    assert_eq!(r.last().map(|m| m.errnum), Some(errno::ENOSPC), "{r:?}");
    // The client goes: its watches and runs go with it.
    b.handle(t(0.2), Input::Closed(Peer::Local(5), 0, "closed".into()));
    effects(&mut b);
    assert!(b.exit_waiters.is_empty(), "{:?}", b.exit_waiters.keys());
    assert!(b.rtt_runs.is_empty());
    b.handle(t(0.3), Input::LocalNew { id: 6, uid: super::testing::UID });
    effects(&mut b);
    let mut m = Message::request("detect.watch", 0, &json!({"pid": 2}));
    m.matchtag = 1;
    b.handle(t(0.3), Input::Message(Peer::Local(6), 0, m));
    assert!(responses(&effects(&mut b), Peer::Local(6)).is_empty(), "another client's watch is held");
}

/// An orphan answers what it had sent up through its lost parent with EHOSTUNREACH (its sender would otherwise
/// wait forever: a job shell's output window, a client's RPC), keeps its own shell exit report for the next
/// parent, and tracks what it sends up the new parent the same way.
#[test]
fn requests_sent_up_through_a_lost_parent_get_ehostunreach_from_the_orphan() {
    // Rank 3's parent is rank 1; its adoptive parent will be rank 2.
    let mut b = broker(3);
    b.handle(t(0.0), Input::ParentUp(super::links::LinkChoice { transport: "tcp", detail: String::new() }));
    b.handle(t(0.0), Input::Start);
    b.handle(t(0.0), Input::LocalNew { id: 5, uid: super::testing::UID });
    effects(&mut b);
    let ask = |b: &mut Broker, now: Time, tag: u32, flags: u8| {
        let mut m = Message::request("job-exec.output", 0, &json!({"id": 1, "lines": []}));
        (m.matchtag, m.flags) = (tag, flags);
        b.handle(now, Input::Message(Peer::Local(5), 0, m));
        effects(b)
    };
    let up = |out: &[Effect]| out.iter().filter(|e| matches!(e, Effect::Send(Peer::Parent, _))).count();
    assert_eq!(up(&ask(&mut b, t(0.01), 11, 0)), 1);
    assert_eq!(up(&ask(&mut b, t(0.01), 12, crate::message::FLAG_NORESPONSE)), 1);
    let report = crate::shellproto::ShellReport {
        status: 0,
        tasks: vec![(0, 0)],
        error: None,
        abort_code: None,
        usage: None,
        ended: None,
    };
    b.handle(
        t(0.02),
        Input::ShellDone { id: crate::jobs::JobId(7), report: Some(report), status: 0, lingering: vec![] },
    );
    effects(&mut b);

    b.handle(t(0.05), Input::Closed(Peer::Parent, 0, "connection reset".into()));
    let out = effects(&mut b);
    let r = responses(&out, Peer::Local(5));
    assert_eq!(r.len(), 1, "one answer, to the request that asked for one: {out:?}");
    assert_eq!((r[0].matchtag, r[0].errnum), (11, errno::EHOSTUNREACH));
    assert!(r[0].errstr().unwrap_or_default().contains("rank 1"), "{:?}", r[0].errstr());
    assert!(out.iter().any(|e| matches!(e, Effect::ConnectParent { rank: 2, lost: 1, .. })), "{out:?}");

    // Adopted by rank 2: the exit report goes up again; a request sent now is tracked, and forgotten once answered.
    b.handle(t(0.06), Input::ParentUp(super::links::LinkChoice { transport: "tcp", detail: String::new() }));
    let out = effects(&mut b);
    let exit = |out: &[Effect]| {
        out.iter().any(|e| matches!(e, Effect::Send(Peer::Parent, m) if m.topic == crate::shellproto::TOPIC_SHELL_EXIT))
    };
    assert!(exit(&out), "the shell exit report is sent again: {out:?}");
    assert_eq!(up(&ask(&mut b, t(0.07), 13, 0)), 1);
    let mut ok = Message::response_to(&Message::request("job-exec.output", 0, &json!({})), &json!({}));
    ok.matchtag = 13;
    ok.route = vec![crate::message::ROUTE_LOCAL | 5];
    b.handle(t(0.08), Input::Message(Peer::Parent, 0, ok));
    let r = effects(&mut b);
    assert_eq!(responses(&r, Peer::Local(5)).iter().map(|m| (m.matchtag, m.errnum)).collect::<Vec<_>>(), [(13, 0)]);
    let left: Vec<u32> = b.inflight.get(&PARENT).map(|m| m.keys().map(|k| k.0).collect()).unwrap_or_default();
    assert_eq!(left.len(), 1, "only the exit report waits for an answer: {left:?}");
}

/// A router that returns after its children re-parented learns those re-parents from its parent as it joins, and
/// routes requests for its former children up (through their adopters), not to links it no longer has.
#[test]
fn a_returning_router_learns_the_re_parents_it_missed() {
    use crate::topology::Hop;
    // Rank 0 knows that ranks 3 and 4 re-parented under rank 2 while rank 1 was away.
    let mut b = broker(0);
    b.handle(t(0.0), Input::Start);
    effects(&mut b);
    b.learn_parent(3, 2);
    b.learn_parent(4, 2);
    b.handle(t(0.01), Input::Hello { conn: 7, msg: hello(1, "sim"), addr: "peer".into(), refusal: None });
    let out = effects(&mut b);
    assert!(matches!(out.first(), Some(Effect::AcceptChild { conn: 7, rank: 1 })), "{out:?}");
    let sent: Vec<&Message> = out
        .iter()
        .filter_map(|e| match e {
            Effect::Send(Peer::Child(1), m) if m.topic == "adopted" => Some(m),
            _ => None,
        })
        .collect();
    assert_eq!(sent.len(), 1, "{out:?}");
    assert_eq!(sent[0].json(), json!([[3, 2], [4, 2]]));

    let mut r = router();
    assert_eq!(r.next_hop(3), Hop::Child(3), "the static tree, before it learns");
    let mut m = sent[0].clone();
    r.handle(t(0.1), Input::Message(Peer::Parent, 0, m.clone()));
    effects(&mut r);
    assert_eq!((r.next_hop(3), r.next_hop(4)), (Hop::Parent, Hop::Parent));
    assert!(r.children_of(1).is_empty(), "a leaf now");
    // Entries that are not two ranks of the instance are skipped; the others still count.
    m.payload = serde_json::to_vec(&json!([[5, 99], "x", [1, 1], [6, 1, 7], [5, 1]])).unwrap();
    r.handle(t(0.2), Input::Message(Peer::Parent, 0, m));
    effects(&mut r);
    assert_eq!((r.parent_of(5), r.parent_of(6)), (Some(1), Some(2)));
    // A broker that joins while nothing was re-parented gets no such message.
    let mut b = broker(0);
    b.handle(t(0.0), Input::Start);
    effects(&mut b);
    b.handle(t(0.01), Input::Hello { conn: 7, msg: hello(1, "sim"), addr: "peer".into(), refusal: None });
    let out = effects(&mut b);
    assert!(matches!(out.first(), Some(Effect::AcceptChild { conn: 7, rank: 1 })), "{out:?}");
    assert!(!out.iter().any(|e| matches!(e, Effect::Send(_, m) if m.topic == "adopted")), "{out:?}");
}

/// An orphan misses the `overlay.lost` events sent while it had no parent: its adopter tells it those losses
/// (the `lost` control message), so that if it must re-parent again it asks a dead candidate last rather than
/// wait a whole candidate timeout on it.
#[test]
fn an_adopted_broker_learns_the_losses_announced_while_it_had_no_parent() {
    let mut b = broker(0);
    b.handle(t(0.0), Input::Start);
    effects(&mut b);
    b.on_lost_event(&json!({"ranks": "2,5-6"}));
    b.handle(t(0.01), Input::Hello { conn: 7, msg: hello(1, "sim"), addr: "peer".into(), refusal: None });
    let out = effects(&mut b);
    assert!(matches!(out.first(), Some(Effect::AcceptChild { conn: 7, rank: 1 })), "{out:?}");
    let sent: Vec<&Message> = out
        .iter()
        .filter_map(|e| match e {
            Effect::Send(Peer::Child(1), m) if m.topic == "lost" => Some(m),
            _ => None,
        })
        .collect();
    assert_eq!(sent.len(), 1, "{out:?}");
    assert_eq!(sent[0].json(), json!({"ranks": "2,5-6"}));

    let mut r = router();
    r.handle(t(0.1), Input::Message(Peer::Parent, 0, sent[0].clone()));
    effects(&mut r);
    assert_eq!(r.known_lost, BTreeSet::from([2, 5, 6]));
    // Junk is ignored and changes nothing.
    let mut m = sent[0].clone();
    m.payload = b"{\"ranks\": 17}".to_vec();
    r.handle(t(0.2), Input::Message(Peer::Parent, 0, m));
    effects(&mut r);
    assert_eq!(r.known_lost, BTreeSet::from([2, 5, 6]));
    // Nothing lost, nothing sent.
    let mut b = broker(0);
    b.handle(t(0.0), Input::Start);
    effects(&mut b);
    b.handle(t(0.01), Input::Hello { conn: 7, msg: hello(1, "sim"), addr: "peer".into(), refusal: None });
    assert!(!effects(&mut b).iter().any(|e| matches!(e, Effect::Send(_, m) if m.topic == "lost")));
}

/// Rank `rank` of a 15-broker binary tree, its parent link up: rank 1's children are 3, 4 (theirs 7-10), rank
/// 2's 5, 6 (theirs 11-14).
fn joined15(rank: u32) -> Broker {
    let mut b = super::testing::new_broker(rank, 15, Topology::Kary(2), 4, Config::default(), Time::ZERO);
    b.handle(t(0.0), Input::ParentUp(super::links::LinkChoice { transport: "tcp", detail: String::new() }));
    b.handle(t(0.0), Input::Start);
    effects(&mut b);
    b
}

/// An orphan's hello: rank `rank`, asking to be adopted (its parent `lost` was lost).
fn adopt_hello(rank: u32, lost: u32) -> Message {
    Message::control("hello", &json!({"rank": rank, "instance": "sim", "adopt": lost}))
}

/// An event from rank 0, as it comes down from the parent.
fn event(b: &mut Broker, now: Time, topic: &str, body: serde_json::Value) -> Vec<Effect> {
    let mut m = Message::event(topic, &body);
    m.seq = 1;
    b.handle(now, Input::Message(Peer::Parent, 0, m));
    effects(b)
}

#[test]
fn a_static_child_asking_to_be_adopted_back_counts_against_the_adoption_bound() {
    // Rank 1 may hold twice the fanout: 4 children.
    let mut b = joined15(1);
    for (conn, r) in [(1, 5), (2, 6), (3, 11), (4, 12)] {
        assert_eq!(judge(&mut b, t(0.1), conn, adopt_hello(r, 2), None), Ok(r));
    }
    // Its own child 3, whose adopter was lost, asks to be adopted back: refused, it tries its next candidate.
    let why = judge(&mut b, t(0.2), 5, adopt_hello(3, 4), None).expect_err("full");
    assert!(why.contains("the most it adopts"), "{why}");
    // A restarted static child (a plain hello) has nowhere else to go: accepted whatever the count.
    assert_eq!(judge(&mut b, t(0.3), 6, hello(4, "sim"), None), Ok(4));
}

#[test]
fn a_lost_router_that_registers_again_is_routed_to_by_its_static_parent() {
    let mut b = broker(0);
    b.handle(t(0.0), Input::Start);
    assert_eq!(judge(&mut b, t(0.001), 7, hello(2, "sim"), None), Ok(2));
    effects(&mut b);
    // Rank 5 (a child of 2) had been adopted by rank 1, then lost.
    b.learn_parent(5, 1);
    b.members.insert(5, (MemberState::Lost, "test".into(), 0.0));
    assert_eq!(b.next_hop(5), crate::topology::Hop::Child(1));
    // It restarts and registers through its static parent.
    let reg = json!({"rank": 5, "hostname": "node5", "resources": {"cores": 4, "pus": 4, "numa": 1, "packages": 1,
        "gpus": 0, "gpu_names": [], "source": "test"}, "cores": "0-3", "gpus": ""});
    let mut m = Message::request("resource.register", 0, &reg);
    m.flags = crate::message::FLAG_NORESPONSE;
    m.userid = super::testing::UID;
    b.handle(t(1.0), Input::Message(Peer::Child(2), 7, m));
    let out = effects(&mut b);
    assert_eq!(b.next_hop(5), crate::topology::Hop::Child(2));
    let told = out.iter().any(|e| {
        matches!(e, Effect::Send(Peer::Child(2), m) if m.msgtype == MsgType::Event && m.topic == "overlay.reparent"
            && m.json() == json!({"rank": 5, "parent": 2}))
    });
    assert!(told, "every broker is told: {out:?}");
}

#[test]
fn an_orphan_asks_candidates_announced_lost_last_and_nobody_adopts_a_lost_rank() {
    // Rank 7's parent is 3; its candidates: 3's sibling 4, then 1, then 0.
    let mut b = joined15(7);
    event(&mut b, t(0.5), "overlay.lost", json!({"ranks": "4", "reason": "test"}));
    b.handle(t(1.0), Input::Closed(Peer::Parent, 0, "reset".into()));
    let asked: Vec<u32> = effects(&mut b)
        .iter()
        .filter_map(|e| if let Effect::ConnectParent { rank, .. } = e { Some(*rank) } else { None })
        .collect();
    assert_eq!(asked, vec![1], "rank 4 was announced lost: asked last");
    b.handle(t(1.6), Input::ParentFailed("no answer".into()));
    let asked: Vec<u32> = effects(&mut b)
        .iter()
        .filter_map(|e| if let Effect::ConnectParent { rank, .. } = e { Some(*rank) } else { None })
        .collect();
    assert_eq!(asked, vec![0]);
    // A candidate refuses a rank rank 0 declared lost (cut off, not dead): it must restart to rejoin.
    let mut c = joined15(1);
    event(&mut c, t(0.5), "overlay.lost", json!({"ranks": "5", "reason": "test"}));
    let why = judge(&mut c, t(1.0), 1, adopt_hello(5, 2), None).expect_err("declared lost");
    assert!(why.contains("must restart"), "{why}");
    // Seen alive again (it adopted someone, or rank 0 announced it back): no longer refused.
    event(&mut c, t(2.0), "overlay.reparent", json!({"rank": 5, "parent": 2}));
    assert_eq!(judge(&mut c, t(2.1), 2, adopt_hello(5, 2), None), Ok(5));
}

/// The candidates an orphan asks among `out`, with whether as a last resort.
fn asked(out: &[Effect]) -> Vec<(u32, bool)> {
    out.iter()
        .filter_map(|e| match e {
            Effect::ConnectParent { rank, last_resort, .. } => Some((*rank, *last_resort)),
            _ => None,
        })
        .collect()
}

/// An orphan's hello asking to be adopted as a last resort ([`super::reparent::ask_adoption`]).
fn last_resort_hello(rank: u32, lost: u32) -> Message {
    let mut body = json!({"rank": rank, "instance": "sim"});
    super::reparent::ask_adoption(&mut body, lost, true);
    Message::control("hello", &body)
}

/// Hand `b` a hello and return its verdict, a refusal with whether for capacity alone (`full`).
fn judge_full(b: &mut Broker, now: Time, conn: u64, msg: Message) -> Result<u32, (String, bool)> {
    b.handle(now, Input::Hello { conn, msg, addr: "peer".into(), refusal: None });
    for e in effects(b) {
        match e {
            Effect::AcceptChild { conn: c, rank } if c == conn => return Ok(rank),
            Effect::RefuseChild { conn: c, why, full } if c == conn => return Err((why, full)),
            _ => {}
        }
    }
    panic!("neither accepted nor refused");
}

/// Rank 0 of a 15-broker binary tree holding its limit of 4 children: its own 1 and 2, and ranks 3 and 4
/// adopted (their parent 1 was lost).
fn full_root() -> Broker {
    let mut b = super::testing::new_broker(0, 15, Topology::Kary(2), 4, Config::default(), Time::ZERO);
    b.handle(t(0.0), Input::Start);
    effects(&mut b);
    assert_eq!(super::reparent::adopt_limit(Topology::Kary(2), 15, 0), 4);
    assert_eq!(judge(&mut b, t(0.01), 1, hello(1, "sim"), None), Ok(1));
    assert_eq!(judge(&mut b, t(0.01), 2, hello(2, "sim"), None), Ok(2));
    assert_eq!(judge(&mut b, t(0.02), 3, adopt_hello(3, 1), None), Ok(3));
    assert_eq!(judge(&mut b, t(0.02), 4, adopt_hello(4, 1), None), Ok(4));
    b
}

/// Issue 42 (the simulator's `restart`, kary:8, 256 brokers, seed 6): an orphan whose live candidates all
/// refused it for capacity, the others being dead, asks rank 0 once more as a last resort, and rank 0 adopts it
/// past its limit; the orphan is not cut off.
#[test]
fn an_orphan_every_live_candidate_refused_for_capacity_is_adopted_by_rank_0_as_a_last_resort() {
    // Rank 7's parent is 3; its candidates: 3's sibling 4, then 1, then 0.
    let mut b = joined15(7);
    b.handle(t(1.0), Input::Closed(Peer::Parent, 0, "reset".into()));
    assert_eq!(asked(&effects(&mut b)), [(4, false)]);
    // Rank 4 is dead (no answer: does not count), rank 1 and rank 0 are full.
    b.handle(t(1.5), Input::ParentFailed("no answer".into()));
    assert_eq!(asked(&effects(&mut b)), [(1, false)]);
    let full =
        |r: u32| Input::ParentRefused { why: format!("rank {r} has 4 children, the most it adopts up to"), full: true };
    b.handle(t(1.501), full(1));
    assert_eq!(asked(&effects(&mut b)), [(0, false)]);
    b.handle(t(1.502), full(0));
    assert_eq!(asked(&effects(&mut b)), [(0, true)], "the last round asks rank 0, marked");
    assert!(b.shutting_down.is_none());

    // Rank 0, full, takes it: marked for capacity when refused, adopted past its limit with the mark.
    let mut root = full_root();
    let (why, full) = judge_full(&mut root, t(1.0), 5, adopt_hello(7, 3)).expect_err("full");
    assert!(full && why.contains("the most it adopts"), "{why}");
    assert_eq!(judge_full(&mut root, t(1.502), 6, last_resort_hello(7, 3)), Ok(7));
    assert_eq!(root.children.len(), 5);
    assert_eq!(root.parent_of(7), Some(0));

    // The orphan is up under rank 0 and says so.
    b.handle(t(1.503), Input::ParentUp(super::links::LinkChoice { transport: "tcp", detail: String::new() }));
    let out = effects(&mut b);
    assert_eq!(b.parent, Some(0));
    let told = out.iter().any(|e| {
        matches!(e, Effect::Send(Peer::Parent, m) if m.topic == "overlay.reparent" && m.json()["parent"] == json!(0))
    });
    assert!(told, "{out:?}");
    assert_eq!(b.exit_code, 0);
}

/// No last round when a candidate refused for a reason other than capacity, or when nobody answered at all.
#[test]
fn refusals_for_other_reasons_make_no_last_round() {
    let full =
        |r: u32| Input::ParentRefused { why: format!("rank {r} has 4 children, the most it adopts up to"), full: true };
    // Rank 4 full, rank 1 re-parenting itself, rank 0 full: cut off, as before.
    let mut b = joined15(7);
    b.handle(t(1.0), Input::Closed(Peer::Parent, 0, "reset".into()));
    effects(&mut b);
    b.handle(t(1.1), full(4));
    effects(&mut b);
    b.handle(t(1.2), Input::ParentRefused { why: "this broker is re-parenting itself".into(), full: false });
    assert_eq!(asked(&effects(&mut b)), [(0, false)]);
    b.handle(t(1.3), full(0));
    assert!(asked(&effects(&mut b)).is_empty(), "no last round");
    assert!(b.shutting_down.is_some());
    assert_eq!(b.exit_code, crate::shellproto::BROKER_EXIT_CUT_OFF);
    // Every candidate dead or unreachable: nobody could take it, no last round either.
    let mut b = joined15(7);
    b.handle(t(1.0), Input::Closed(Peer::Parent, 0, "reset".into()));
    effects(&mut b);
    for (i, want) in [(1, false), (0, false)].into_iter().enumerate() {
        b.handle(t(1.5 + i as f64 * 0.5), Input::ParentFailed("no answer".into()));
        assert_eq!(asked(&effects(&mut b)), [want]);
    }
    b.handle(t(2.5), Input::ParentFailed("no answer".into()));
    assert!(asked(&effects(&mut b)).is_empty(), "no last round");
    assert_eq!(b.exit_code, crate::shellproto::BROKER_EXIT_CUT_OFF);
    // The last round is made once: rank 0 refusing it again (it was declared lost meanwhile) ends the search.
    let mut b = joined15(7);
    b.handle(t(1.0), Input::Closed(Peer::Parent, 0, "reset".into()));
    effects(&mut b);
    for (i, r) in [4, 1, 0].into_iter().enumerate() {
        b.handle(t(1.1 + i as f64 * 0.1), full(r));
    }
    assert_eq!(asked(&effects(&mut b)), [(1, false), (0, false), (0, true)]);
    b.handle(t(1.5), full(0));
    assert!(asked(&effects(&mut b)).is_empty());
    assert_eq!(b.exit_code, crate::shellproto::BROKER_EXIT_CUT_OFF);
}

/// A last-resort hello is honoured by rank 0 alone, from a rank of this instance that may otherwise join; a
/// forged or repeated one adds no child.
#[test]
fn a_last_resort_hello_from_an_unknown_rank_is_refused() {
    let mut root = full_root();
    let why = judge(&mut root, t(1.0), 5, last_resort_hello(99, 3), None).expect_err("unknown rank");
    assert!(why.contains("not in this instance"), "{why}");
    let mut bad = json!({"rank": 7, "instance": "sim", "adopt": 3, "last_resort": "yes"});
    let why = judge(&mut root, t(1.0), 6, Message::control("hello", &bad), None).expect_err("not a bool");
    assert!(why.contains("'last_resort' must be true or false"), "{why}");
    // `false` is the same as absent: refused for capacity.
    bad["last_resort"] = json!(false);
    assert!(matches!(judge_full(&mut root, t(1.0), 7, Message::control("hello", &bad)), Err((_, true))));
    // A rank rank 0 declared lost must restart, last resort or not.
    root.known_lost.insert(8);
    let why = judge(&mut root, t(1.2), 8, last_resort_hello(8, 3), None).expect_err("declared lost");
    assert!(why.contains("must restart"), "{why}");
    // Once adopted, the same rank again adds nothing.
    assert_eq!(judge(&mut root, t(1.3), 9, last_resort_hello(7, 3), None), Ok(7));
    let why = judge(&mut root, t(1.4), 10, last_resort_hello(7, 3), None).expect_err("connected");
    assert!(why.contains("already connected"), "{why}");
    assert_eq!(root.children.len(), 5);
    // Any broker but rank 0 ignores the mark: full is full.
    let mut b = joined15(1);
    for (conn, r) in [(1, 5), (2, 6), (3, 11), (4, 12)] {
        assert_eq!(judge(&mut b, t(0.1), conn, adopt_hello(r, 2), None), Ok(r));
    }
    assert!(matches!(judge_full(&mut b, t(0.2), 5, last_resort_hello(13, 6)), Err((_, true))));
}

#[test]
fn brokers_below_a_re_parented_rank_send_their_unanswered_exit_reports_again() {
    let mut b = joined15(7);
    let report = crate::shellproto::ShellReport {
        status: 0,
        tasks: vec![],
        error: None,
        abort_code: None,
        usage: None,
        ended: None,
    };
    b.handle(
        t(1.0),
        Input::ShellDone { id: crate::jobs::JobId(42), report: Some(report), status: 0, lingering: vec![] },
    );
    let reports = |out: &[Effect]| {
        out.iter()
            .filter(|e| matches!(e, Effect::Send(Peer::Parent, m) if m.topic == crate::shellproto::TOPIC_SHELL_EXIT))
            .count()
    };
    assert_eq!(reports(&effects(&mut b)), 1);
    // Another rank moved: nothing of ours went through it.
    assert_eq!(reports(&event(&mut b, t(1.5), "overlay.reparent", json!({"rank": 5, "parent": 1}))), 0);
    // Our parent 3 re-parented (its parent 1 was lost): our report may have died with rank 1; again.
    assert_eq!(reports(&event(&mut b, t(2.0), "overlay.reparent", json!({"rank": 3, "parent": 4}))), 1);
    // And so on up: our grandparent's move counts too (we are below it).
    assert_eq!(reports(&event(&mut b, t(2.5), "overlay.reparent", json!({"rank": 4, "parent": 2}))), 1);
}

/// Rank 0 with client 5 and a state directory open (its journal kept), and the jobspec of `true`.
fn journaling_root() -> (Broker, serde_json::Value) {
    let spec = serde_json::from_str(&crate::jobspec::JobspecBuilder::new(["true"]).build().expect("jobspec").to_json())
        .expect("json");
    let mut b = root_with_client();
    b.restore(super::core::StateDir::Open { dir: "/state".into(), restarts: 0, failing: None }, None);
    (b, spec)
}

/// Play a journaling rank 0's driver for one turn at `now`: carry out every effect, answering each
/// [`Effect::Store`] at once (before polling again, as the effect asks) with what `store` says of its batch
/// (`durable`: the write was fsynced too). Returns the other effects ([`Effect::Sync`] among them), in order.
fn drive(
    b: &mut Broker,
    now: Time,
    durable: bool,
    mut store: impl FnMut(Option<&crate::jobs::journal::Journal>) -> Result<(), super::store::CommitError>,
) -> Vec<Effect> {
    let mut out = Vec::new();
    while let Some(e) = b.poll_effect() {
        match e {
            Effect::Store { batch } => {
                let result = store(batch.as_deref());
                assert!(b.poll_effect().is_none(), "nothing goes out before the write's outcome is in");
                b.handle(now, Input::Stored { result, durable });
            }
            e => out.push(e),
        }
    }
    out
}

/// [`drive`] with a store that takes every batch: how many batches were written, and the other effects.
fn drive_ok(b: &mut Broker, now: Time) -> (usize, Vec<Effect>) {
    let mut written = 0;
    let out = drive(b, now, false, |_| {
        written += 1;
        Ok(())
    });
    (written, out)
}

/// Nothing written, nothing to carry out (what [`drive_ok`] returns for a turn put off).
fn nothing(r: &(usize, Vec<Effect>)) -> bool {
    r.0 == 0 && r.1.is_empty()
}

/// The fsync asked for among `out`, if any: the write it must cover.
fn sync_asked(out: &[Effect]) -> Option<u64> {
    let mut syncs = out.iter().filter_map(|e| match e {
        Effect::Sync { upto } => Some(*upto),
        _ => None,
    });
    let upto = syncs.next();
    assert!(syncs.next().is_none(), "one fsync at a time");
    upto
}

/// Client 5's request `topic` with `payload` and matchtag `tag`, handed in at `now` (its effects not polled).
fn send(b: &mut Broker, now: Time, tag: u32, topic: &str, payload: Value) {
    let mut m = Message::request(topic, 0, &payload);
    m.matchtag = tag;
    b.handle(now, Input::Message(Peer::Local(5), 0, m));
}

/// The answers to client 5 among `out`: (matchtag, errno).
fn answers(out: &[Effect]) -> Vec<(u32, u32)> {
    responses(out, Peer::Local(5)).into_iter().map(|m| (m.matchtag, m.errnum)).collect()
}

/// With a state directory a submission is answered only once the driver says its batch is durable
/// ([`Input::Stored`], handed in for the [`Effect::Store`] that goes out before anything else); a batch the store
/// refused refuses its submissions and ends their jobs; a damaged store refuses submissions at once.
#[test]
fn a_submission_is_answered_once_durable_and_refused_if_it_cannot_be() {
    use super::core::StateDir;
    use super::store::CommitError;
    let (mut b, spec) = journaling_root();
    send(&mut b, t(0.1), 1, "job-manager.submit", json!({ "jobspec": spec }));
    let mut batches = Vec::new();
    let out = drive(&mut b, t(0.2), true, |j| {
        batches.push(j.map(|j| j.jobs.len()));
        Ok(())
    });
    assert_eq!(batches, [Some(1)], "the submission's job, written first");
    assert_eq!(answers(&out), [(1, 0)]);
    assert_eq!(drive_ok(&mut b, t(0.2)).0, 0, "nothing left to write");
    // The store fails: the submission is refused and its job ends.
    send(&mut b, t(0.3), 2, "job-manager.submit", json!({ "jobspec": spec }));
    let full = CommitError { why: "database or disk is full".into(), errno: errno::ENOSPC };
    let mut id = None;
    let out = drive(&mut b, t(0.3), true, |j| {
        id = id.or_else(|| j.and_then(|j| j.jobs.iter().map(|r| r.id).max()));
        Err(full.clone())
    });
    let r = responses(&out, Peer::Local(5)).into_iter().cloned().collect::<Vec<_>>();
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].errnum, errno::ENOSPC);
    assert!(r[0].errstr().unwrap_or_default().contains("could not be made durable"), "{:?}", r[0].errstr());
    let job = &b.jobcore.as_ref().expect("rank 0").jobs[&id.expect("a job written")];
    assert_eq!(job.fatal.as_ref().map(|e| e.kind.as_str()), Some("store"));
    assert!(matches!(&b.statedir, StateDir::Open { failing: Some(_), .. }));
    // A damaged store: refused at once, scheduling stopped.
    let mut b = root_with_client();
    b.restore(StateDir::Damaged { dir: "/state".into(), why: "schema version 99".into() }, None);
    let e = ask1(&mut b, "job-manager.submit", json!({ "jobspec": spec })).expect_err("refused");
    assert_eq!(e.0, errno::EROFS);
    assert!(e.1.contains("schema version 99") && e.1.contains("/state"), "{}", e.1);
    assert!(b.jobcore.as_ref().expect("rank 0").scheduling_stopped().is_some());
    // Nor is a shell's exit report acknowledged: its broker keeps it for the rank 0 restarted on the repaired
    // store, which completes the job with it (acknowledged here, the report was dropped and the job, unknown to
    // this rank 0, failed with "lost critical rank" after the repair).
    let report = json!({"id": 77, "rank": 1, "report": null, "shell_status": 0});
    let e = ask1(&mut b, "job-exec.shell-exit", report).expect_err("not acknowledged");
    assert_eq!(e.0, errno::EROFS);
    assert!(e.1.contains("kept by their brokers"), "{}", e.1);
}

/// The write goes out before what the turn asked for: an answer, a message, a shell start is carried out only
/// after the [`Effect::Store`] of the change that led to it.
#[test]
fn the_journal_batch_goes_out_before_the_effects_of_its_turn() {
    let (mut b, _) = journaling_root();
    send(&mut b, t(0.1), 1, "resource.drain", json!({"ranks": "0", "reason": "test"}));
    let out = effects(&mut b);
    assert!(matches!(out.first(), Some(Effect::Store { batch: Some(_) })), "{out:?}");
    assert_eq!(answers(&out[1..]), [(1, 0)], "the drain answered after its write");
}

/// What the journal holds may wait for a later write (while an fsync is in flight) only while submissions alone
/// changed it and the turn asked for nothing: a cancel or a drain (or a shell's start, an exit report) is written
/// with its own turn, since its sender may never say it again; what was put off is written with it, or at the
/// latest once the fsync's report came; and nothing is put off once the driver's loop has ended.
#[test]
fn only_submissions_may_wait_for_a_later_write() {
    let (mut b, spec) = journaling_root();
    // Nothing to schedule on: the submissions stay pending and ask for nothing but their held answers.
    assert!(ask1(&mut b, "resource.drain", json!({"ranks": "0", "reason": "test"})).is_ok());
    let submit = |b: &mut Broker, tag: u32| send(b, t(0.1), tag, "job-manager.submit", json!({ "jobspec": spec }));
    submit(&mut b, 1);
    let mut first_job = None;
    let out = drive(&mut b, t(0.1), false, |j| {
        first_job = j.and_then(|j| j.jobs.first()).map(|r| r.id);
        Ok(())
    });
    let first = sync_asked(&out).expect("an fsync for the submission");
    let first_job = first_job.expect("the submission's job written");
    for tag in 2..=3 {
        submit(&mut b, tag);
        let r = drive_ok(&mut b, t(0.1));
        assert!(nothing(&r), "submission {tag} put off while the fsync runs: {r:?}");
    }
    // A cancel is written with its turn, and takes the submissions put off with it.
    send(&mut b, t(0.1), 10, "job-manager.cancel", json!({"id": first_job.0}));
    let mut jobs = 0;
    let out = drive(&mut b, t(0.1), false, |j| {
        jobs += j.map_or(0, |j| j.jobs.len());
        Ok(())
    });
    assert_eq!(jobs, 3, "the cancelled job and submissions 2 and 3 in one write");
    assert_eq!(answers(&out), [(10, 0)], "the cancel answered; the submissions wait for an fsync");
    assert_eq!(sync_asked(&out), None, "one fsync at a time");
    submit(&mut b, 4);
    assert!(nothing(&drive_ok(&mut b, t(0.1))), "put off");
    // The fsync's report: submission 1 answered; submission 4 written at once, and the next fsync asked for.
    b.handle(t(0.2), Input::Synced { upto: first, result: Ok(()) });
    let (written, out) = drive_ok(&mut b, t(0.2));
    assert_eq!((written, answers(&out)), (1, vec![(1, 0)]));
    assert!(sync_asked(&out).is_some_and(|u| u > first));
    // An undrain is written with its turn too, fsync in flight or not.
    send(&mut b, t(0.3), 11, "resource.undrain", json!({"ranks": "0"}));
    let (written, out) = drive_ok(&mut b, t(0.3));
    assert_eq!(written, 1, "{out:?}");
    // Once the driver's loop has ended, nothing is put off.
    b.loop_ended();
    submit(&mut b, 5);
    assert_eq!(drive_ok(&mut b, t(0.4)).0, 1, "written at once");
}

/// Pipelined commits: a submission whose batch is written but not yet fsynced is not answered; an fsync
/// ([`Effect::Sync`], one at a time) answers exactly the submissions of the writes it covers, in order; those
/// that came while it ran are written together and answered together by the next one (group commit); a failed
/// fsync refuses exactly the submissions of the writes it covered (and ends their jobs), and only a successful
/// fsync clears the failure.
#[test]
fn submissions_are_answered_only_by_the_fsync_that_covers_their_write() {
    use super::core::StateDir;
    use super::store::CommitError;
    let (mut b, spec) = journaling_root();
    // Nothing to schedule on: the submissions ask for nothing but their held answers.
    assert!(ask1(&mut b, "resource.drain", json!({"ranks": "0", "reason": "test"})).is_ok());
    // One turn of the driver: submission `tag` arrives; how many batches were written, and what went out.
    let turn = |b: &mut Broker, tag: u32| -> (usize, Vec<Effect>) {
        send(b, t(0.1), tag, "job-manager.submit", json!({ "jobspec": spec }));
        drive_ok(b, t(0.1))
    };
    let synced = |b: &mut Broker, upto: u64, result: Result<(), CommitError>| -> (Vec<(u32, u32)>, Option<u64>) {
        b.handle(t(0.2), Input::Synced { upto, result });
        let (_, out) = drive_ok(b, t(0.2));
        (answers(&out), sync_asked(&out))
    };
    let (written, out) = turn(&mut b, 1);
    assert_eq!((written, answers(&out)), (1, vec![]), "written, not on disk: not answered");
    let first = sync_asked(&out).expect("an fsync asked for");
    // That fsync is slow: a burst arrives meanwhile, none written nor answered.
    for tag in 2..=4 {
        assert!(nothing(&turn(&mut b, tag)), "submission {tag}: put off, not answered");
    }
    // The slow fsync ends: the first submission only; the burst is written in one batch, and one fsync asked.
    let (answered, next) = synced(&mut b, first, Ok(()));
    assert_eq!(answered, [(1, 0)]);
    let group = next.expect("an fsync for the burst");
    assert_eq!(group, first + 1, "the burst in one write");
    // One fsync for the burst answers all of it, in order.
    assert_eq!(synced(&mut b, group, Ok(())), (vec![(2, 0), (3, 0), (4, 0)], None));
    // A failed fsync: 6 and 7 come while 5's fsync runs (and are written together once it ended), 8 while
    // theirs runs; it fails: 6 and 7 are refused, 8 is not.
    let (_, out) = turn(&mut b, 5);
    let upto5 = sync_asked(&out).expect("an fsync for 5");
    assert!(nothing(&turn(&mut b, 6)) && nothing(&turn(&mut b, 7)));
    let (answered, next) = synced(&mut b, upto5, Ok(()));
    assert_eq!(answered, [(5, 0)]);
    let upto = next.expect("6 and 7 written, their fsync asked for");
    assert!(nothing(&turn(&mut b, 8)), "put off while that fsync runs");
    let eio = CommitError { why: "cannot sync the write-ahead log: Input/output error".into(), errno: errno::EIO };
    let (answered, next) = synced(&mut b, upto, Err(eio));
    assert_eq!(answered, [(6, errno::EIO), (7, errno::EIO)]);
    let jc = b.jobcore.as_ref().expect("rank 0");
    let store_failed = jc.jobs.values().filter(|j| j.fatal.as_ref().is_some_and(|e| e.kind == "store")).count();
    assert_eq!(store_failed, 2, "the refused submissions' jobs end, and only theirs");
    assert!(matches!(&b.statedir, StateDir::Open { failing: Some(_), .. }), "a write alone does not clear it");
    // Submission 8 (and the ended jobs) written meanwhile; its fsync succeeds, and clears the failure.
    let upto = next.expect("8 waits");
    assert_eq!(synced(&mut b, upto, Ok(())), (vec![(8, 0)], None));
    assert!(matches!(&b.statedir, StateDir::Open { failing: None, .. }));
}

/// With a state directory a shell's exit report is acknowledged only once durable: not while the store fails
/// (its broker keeps the report, and sends it again to a restarted rank 0), not once merely written, but once
/// an fsync covers the write.
#[test]
fn a_shell_exit_report_is_acknowledged_only_once_durable() {
    use super::core::StateDir;
    use super::store::CommitError;
    let mut b = root_with_client();
    b.restore(StateDir::Open { dir: "/state".into(), restarts: 0, failing: None }, None);
    let report = json!({"id": 77, "rank": 0, "report": null, "shell_status": 0});
    send(&mut b, t(0.1), 1, "job-exec.shell-exit", report);
    let full = CommitError { why: "database or disk is full".into(), errno: errno::ENOSPC };
    let out = drive(&mut b, t(0.2), false, |_| Err(full.clone()));
    assert_eq!(answers(&out), [], "acknowledged (or refused) while failing");
    assert!(matches!(&b.statedir, StateDir::Open { failing: Some(_), .. }));
    // The disk has room again: written, then fsynced.
    let (written, out) = drive_ok(&mut b, t(0.3));
    assert_eq!((written, answers(&out)), (1, vec![]), "the report still waits for a write, then for its fsync");
    // Reports alone wait a while for their fsync, so that the reports of many jobs share one: the broker says
    // when it is due.
    assert_eq!(sync_asked(&out), None, "an fsync at once for an exit report alone");
    let due = t(0.3) + super::core::EXIT_REPORT_SYNC_DELAY;
    assert!(b.next_deadline().is_some_and(|d| d <= due), "{:?}", b.next_deadline());
    b.handle(due, Input::Timer);
    let upto = sync_asked(&drive_ok(&mut b, due).1).expect("an fsync asked for once due");
    assert!(b.next_deadline().is_none_or(|d| d > due), "the due fsync is no deadline any more");
    b.handle(t(0.4), Input::Synced { upto, result: Ok(()) });
    let (written, out) = drive_ok(&mut b, t(0.4));
    assert_eq!((written, answers(&out)), (0, vec![(1, 0)]));
    assert!(nothing(&drive_ok(&mut b, t(0.5))), "nothing left waiting");
}

/// Exit reports waiting for their (delayed) fsync do not delay a submission's: one arriving meanwhile wants an
/// fsync at once, and that one answers both.
#[test]
fn a_submission_does_not_wait_for_the_exit_reports_delay() {
    use super::core::StateDir;
    let spec: Value =
        serde_json::from_str(&crate::jobspec::JobspecBuilder::new(["true"]).build().expect("jobspec").to_json())
            .expect("json");
    let mut b = root_with_client();
    b.restore(StateDir::Open { dir: "/state".into(), restarts: 0, failing: None }, None);
    let report = json!({"id": 77, "rank": 0, "report": null, "shell_status": 0});
    send(&mut b, t(0.2), 1, "job-exec.shell-exit", report);
    let (written, out) = drive_ok(&mut b, t(0.2));
    assert_eq!((written, sync_asked(&out)), (1, None), "the report alone waits");
    send(&mut b, t(0.201), 9, "job-manager.submit", json!({ "jobspec": spec }));
    let (written, out) = drive_ok(&mut b, t(0.201));
    assert_eq!(written, 1);
    let upto = sync_asked(&out).expect("a submission wants its fsync at once");
    b.handle(t(0.203), Input::Synced { upto, result: Ok(()) });
    let r = answers(&drive_ok(&mut b, t(0.203)).1);
    assert_eq!(r.len(), 2, "the report and the submission, both answered by one fsync: {r:?}");
    assert!(r.iter().all(|(_, e)| *e == 0) && r.iter().any(|(tag, _)| *tag == 9), "{r:?}");
    assert!(b.next_deadline().is_none_or(|d| d > t(10.0)), "nothing owed");
    assert!(nothing(&drive_ok(&mut b, t(0.3))), "nothing owed");
}

/// Rank `rank` of the 7-broker tree with `tbon.parent_grace=60s`, its parent link up and joined.
fn graced(rank: u32) -> Broker {
    let mut b = broker(rank);
    b.opts.config.parent_grace_set = Some(60.0);
    b.handle(t(0.0), Input::ParentUp(super::links::LinkChoice { transport: "tcp", detail: String::new() }));
    b.handle(t(0.0), Input::Start);
    effects(&mut b);
    b
}

fn sent_up<'a>(out: &'a [Effect], topic: &str) -> Vec<&'a Message> {
    out.iter()
        .filter_map(|e| match e {
            Effect::Send(Peer::Parent, m) if m.topic == topic => Some(m),
            _ => None,
        })
        .collect()
}

fn shell_done(b: &mut Broker, now: Time, id: u64) -> Vec<Effect> {
    let report = crate::shellproto::ShellReport {
        status: 0,
        tasks: vec![(0, 0)],
        error: None,
        abort_code: None,
        usage: None,
        ended: None,
    };
    b.handle(now, Input::ShellDone { id: crate::jobs::JobId(id), report: Some(report), status: 0, lingering: vec![] });
    effects(b)
}

/// A child of rank 0 outlives it for `tbon.parent_grace`: it keeps its shells and children, queues what it must
/// report, tries rank 0 again every second, and once rank 0 is back registers again (naming the jobs it still
/// has), sends the exit reports that waited, and tells its children to rejoin.
#[test]
fn a_child_of_rank_0_waits_for_it_within_the_grace_and_rejoins_it() {
    let mut b = graced(1);
    assert_eq!(judge(&mut b, t(0.01), 9, hello(3, "sim"), None), Ok(3));
    b.shells.insert(crate::jobs::JobId(8));
    b.handle(t(1.0), Input::Closed(Peer::Parent, 0, "connection reset".into()));
    let out = effects(&mut b);
    assert!(out.iter().any(|e| matches!(e, Effect::ConnectParent { rank: 0, lost: 0, .. })), "{out:?}");
    assert!(!out.iter().any(|e| matches!(e, Effect::KillShells)), "the shells go on: {out:?}");
    assert!(b.shutting_down.is_none());
    // A shell ends meanwhile: its report waits (nothing can go up).
    assert!(sent_up(&shell_done(&mut b, t(1.1), 7), crate::shellproto::TOPIC_SHELL_EXIT).is_empty());
    // Rank 0 is not listening yet: tried again a second later, not before.
    b.handle(t(1.2), Input::ParentFailed("connection refused".into()));
    assert!(effects(&mut b).is_empty());
    let connects = |out: &[Effect]| out.iter().filter(|e| matches!(e, Effect::ConnectParent { rank: 0, .. })).count();
    assert_eq!(connects(&run_to(&mut b, t(2.1))), 0);
    assert_eq!(connects(&run_to(&mut b, t(2.3))), 1);
    // Rank 0 is back: register (first), the exit report, `rejoin` to the children.
    b.handle(t(5.0), Input::ParentUp(super::links::LinkChoice { transport: "tcp", detail: String::new() }));
    let out = effects(&mut b);
    let reg = sent_up(&out, "resource.register");
    assert_eq!(reg.len(), 1, "{out:?}");
    assert_eq!(reg[0].json()["jobs"], json!([7, 8]), "the running shell and the unanswered report");
    assert_eq!(sent_up(&out, crate::shellproto::TOPIC_SHELL_EXIT).len(), 1);
    let first = |topic: &str| out.iter().position(|e| matches!(e, Effect::Send(Peer::Parent, m) if m.topic == topic));
    assert!(first("resource.register") < first(crate::shellproto::TOPIC_SHELL_EXIT));
    assert!(out.iter().any(|e| matches!(e, Effect::Send(Peer::Child(3), m) if m.topic == "rejoin")), "{out:?}");
    assert!(b.shutting_down.is_none() && b.reparenting.is_none());
}

/// Past the grace a child of rank 0 exits as it would have at once, and its children with it (they are not asked
/// to re-parent: rank 0 is gone for all of them).
#[test]
fn past_the_grace_a_child_of_rank_0_exits_and_takes_its_subtree_along() {
    let mut b = graced(1);
    assert_eq!(judge(&mut b, t(0.01), 9, hello(3, "sim"), None), Ok(3));
    b.shells.insert(crate::jobs::JobId(8));
    b.handle(t(0.02), Input::LocalNew { id: 5, uid: super::testing::UID });
    b.handle(t(1.0), Input::AckSamples(vec![(PARENT, 2, 1.0, 0.0)]));
    b.handle(t(1.2), Input::AckSamples(vec![(PARENT, 2, 1.2, 0.0)]));
    let out = effects(&mut b);
    let out = no_answer(&mut b, t(1.35), &out);
    assert!(out.iter().any(|e| matches!(e, Effect::ConnectParent { rank: 0, .. })), "lost by its kernel: {out:?}");
    // A client's request waits for rank 0...
    let mut m = Message::request("job-manager.list", 0, &json!({}));
    m.matchtag = 11;
    b.handle(t(2.0), Input::Message(Peer::Local(5), 0, m));
    assert!(responses(&effects(&mut b), Peer::Local(5)).is_empty(), "queued for rank 0");
    let out = run_to(&mut b, t(61.0));
    assert!(b.shutting_down.is_none(), "an attempt in flight: nothing before the grace ends");
    assert!(out.iter().all(|e| !matches!(e, Effect::KillShells)));
    let out = run_to(&mut b, t(61.45));
    assert!(b.shutting_down.is_some(), "{out:?}");
    // ... and is answered when it is clear that rank 0 is not coming back.
    let r = responses(&out, Peer::Local(5));
    assert_eq!(r.iter().map(|m| (m.matchtag, m.errnum)).collect::<Vec<_>>(), [(11, errno::EHOSTUNREACH)]);
    assert_eq!(b.exit_code(), crate::shellproto::BROKER_EXIT_CUT_OFF);
    assert!(out.iter().any(|e| matches!(e, Effect::KillShells)));
    let shutdown = out.iter().find_map(|e| match e {
        Effect::Send(Peer::Child(3), m) if m.topic == "shutdown" => Some(m.json()),
        _ => None,
    });
    assert_eq!(shutdown.map(|j| j["orphan"].clone()), Some(json!(false)));
}

/// Without a grace (no state directory: the default), a child of rank 0 exits at once, as before.
#[test]
fn without_a_state_directory_a_child_of_rank_0_exits_at_once() {
    let mut b = broker(1);
    assert_eq!(b.opts.config.parent_grace(), 0.0);
    b.opts.config.statedir = Some("/var/lib/vigil".into());
    assert_eq!(b.opts.config.parent_grace(), crate::attrs::DEFAULT_PARENT_GRACE, "the default with one");
    b.opts.config.statedir = None;
    b.handle(t(0.0), Input::ParentUp(super::links::LinkChoice { transport: "tcp", detail: String::new() }));
    b.handle(t(1.0), Input::Closed(Peer::Parent, 0, "connection reset".into()));
    effects(&mut b);
    assert!(b.finished());
}

/// A broker below a child of rank 0 hears `rejoin` from its parent: it registers again, sends its unanswered
/// exit reports again (those in flight were lost with rank 0), and passes it on.
#[test]
fn rejoin_passes_down_the_tree_with_the_registrations_and_exit_reports() {
    let mut b = graced(3);
    assert_eq!(sent_up(&shell_done(&mut b, t(1.0), 42), crate::shellproto::TOPIC_SHELL_EXIT).len(), 1);
    b.handle(t(2.0), Input::Message(Peer::Parent, 0, Message::control("rejoin", &json!({}))));
    let out = effects(&mut b);
    assert_eq!(sent_up(&out, "resource.register").len(), 1, "{out:?}");
    assert_eq!(sent_up(&out, crate::shellproto::TOPIC_SHELL_EXIT).len(), 1, "{out:?}");
}

/// The `shutdown` rank 0 sends its child on SIGTERM: whether it asks the child to wait for a restart.
fn shutdown_on_sigterm(b: &mut Broker) -> (Value, bool) {
    b.handle(t(1.0), Input::Signal(crate::signal::SIGTERM));
    let out = effects(b);
    let m = out
        .iter()
        .find_map(|e| match e {
            Effect::Send(Peer::Child(1), m) if m.topic == "shutdown" => Some(m.json()),
            _ => None,
        })
        .expect("the child is told");
    (m, out.iter().any(|e| matches!(e, Effect::SignalInitial(_))))
}

/// SIGUSR1/2 (a batch job's warning before its time limit, `--signal`) never stops a broker, even a rank 0 without
/// an initial program (which stops on SIGINT and SIGHUP); a rank 0 whose initial program runs passes it on.
#[test]
fn sigusr_goes_to_the_initial_program_and_stops_nothing() {
    let mut b = root_with_child();
    b.handle(t(1.0), Input::Signal(crate::signal::SIGUSR1));
    let out = effects(&mut b);
    assert!(b.shutting_down.is_none(), "USR1 stopped rank 0");
    assert!(!out.iter().any(|e| matches!(e, Effect::SignalInitial(_))), "no initial program to signal");
    b.initial_started = true;
    b.handle(t(2.0), Input::Signal(crate::signal::SIGUSR2));
    let out = effects(&mut b);
    assert!(b.shutting_down.is_none(), "USR2 stopped rank 0");
    assert!(out.iter().any(|e| matches!(e, Effect::SignalInitial(12))), "passed to the script");
}

/// SIGTERM (`systemctl stop|restart`) of rank 0 that keeps its jobs in a state directory stops rank 0 alone: its
/// children are asked to wait for it. Without a state directory, or with an initial program (a test instance, a
/// batch job), it stops the instance as before.
#[test]
fn sigterm_of_rank_0_with_a_state_directory_stops_only_rank_0() {
    let mut b = root_with_child();
    b.opts.config.parent_grace_set = Some(60.0);
    b.jobcore.as_mut().expect("rank 0").enable_journal();
    assert!(b.stops_for_restart());
    let (m, _) = shutdown_on_sigterm(&mut b);
    assert_eq!(m["restart"], json!(true), "{m}");
    assert!(b.shutting_down.is_some());
    assert_eq!(b.exit_code(), 128 + crate::signal::SIGTERM);

    // A damaged store (rank 0 started with scheduling stopped): the operator repairs it and restarts rank 0;
    // the running jobs' shells must wait for that, not die with the instance.
    let mut b = root_with_child();
    b.opts.config.parent_grace_set = Some(60.0);
    b.restore(super::core::StateDir::Damaged { dir: "/state".into(), why: "malformed".into() }, None);
    assert!(b.stops_for_restart());
    assert_eq!(shutdown_on_sigterm(&mut b).0["restart"], json!(true));

    let mut b = root_with_child();
    b.opts.config.parent_grace_set = Some(60.0);
    assert!(!b.stops_for_restart(), "no state directory: the jobs would be lost");
    assert_eq!(shutdown_on_sigterm(&mut b).0["restart"], json!(false));

    let mut b = root_with_child();
    b.jobcore.as_mut().expect("rank 0").enable_journal();
    b.opts.config.parent_grace_set = Some(0.0);
    assert!(!b.stops_for_restart(), "tbon.parent_grace=0: nobody would wait");

    let mut b = root_with_child();
    b.opts.config.parent_grace_set = Some(60.0);
    b.jobcore.as_mut().expect("rank 0").enable_journal();
    b.opts.initial_program = Some(vec!["sleep".into(), "100".into()]);
    assert!(!b.stops_for_restart(), "an initial program ends with its instance");
}

/// A child of rank 0 told that rank 0 stops for a restart waits for it (with its shells) instead of exiting; a
/// broker deeper down, told so by a parent that is not rank 0, stops as before (only rank 0 restarts so).
#[test]
fn a_child_told_that_rank_0_restarts_waits_for_it() {
    let mut b = graced(1);
    b.shells.insert(crate::jobs::JobId(8));
    let stop = Message::control("shutdown", &json!({"reason": "signal 15", "orphan": false, "restart": true}));
    b.handle(t(1.0), Input::Message(Peer::Parent, 0, stop.clone()));
    let out = effects(&mut b);
    assert!(out.iter().any(|e| matches!(e, Effect::ConnectParent { rank: 0, lost: 0, .. })), "{out:?}");
    assert!(!out.iter().any(|e| matches!(e, Effect::KillShells)), "the shells go on: {out:?}");
    assert!(b.shutting_down.is_none() && b.reparenting.is_some());

    let mut b = graced(3);
    b.handle(t(1.0), Input::Message(Peer::Parent, 0, stop));
    effects(&mut b);
    assert!(b.shutting_down.is_some(), "rank 3's parent is rank 1, not rank 0");
}

/// Rank 0 tells each child it accepts its `tbon.parent_grace`; a child that set none of its own (a state directory
/// given to rank 0 alone) waits that long for rank 0, and one that set its own keeps it.
#[test]
fn a_child_of_rank_0_takes_rank_0s_grace_unless_it_set_its_own() {
    let mut r0 = broker(0);
    r0.opts.config.statedir = Some("/var/lib/vigil".into());
    r0.handle(t(0.0), Input::Start);
    effects(&mut r0);
    r0.handle(t(0.001), Input::Hello { conn: 7, msg: hello(1, "sim"), addr: "n1".into(), refusal: None });
    let grace = effects(&mut r0).into_iter().find_map(|e| match e {
        Effect::Send(Peer::Child(1), m) if m.topic == "grace" => Some(m),
        _ => None,
    });
    let grace = grace.expect("rank 0 sends its grace");
    assert_eq!(grace.json()["parent_grace"], json!(crate::attrs::DEFAULT_PARENT_GRACE));

    let child = |own: Option<f64>| {
        let mut b = broker(1);
        b.opts.config.parent_grace_set = own;
        b.handle(t(0.0), Input::ParentUp(super::links::LinkChoice { transport: "tcp", detail: String::new() }));
        b.handle(t(0.0), Input::Start);
        b.handle(t(0.1), Input::Message(Peer::Parent, 0, grace.clone()));
        effects(&mut b);
        b.handle(t(1.0), Input::Closed(Peer::Parent, 0, "connection reset".into()));
        effects(&mut b);
        b
    };
    let b = child(None);
    assert_eq!(b.parent_grace(), crate::attrs::DEFAULT_PARENT_GRACE);
    assert!(b.shutting_down.is_none() && b.reparenting.is_some(), "it waits for rank 0");
    let b = child(Some(0.0));
    assert!(b.shutting_down.is_some(), "its own tbon.parent_grace=0 stands");
    // Junk is ignored.
    let mut b = broker(1);
    b.handle(t(0.0), Input::ParentUp(super::links::LinkChoice { transport: "tcp", detail: String::new() }));
    for junk in [json!({"parent_grace": "60"}), json!([1]), json!({"parent_grace": -5.0})] {
        b.handle(t(0.1), Input::Message(Peer::Parent, 0, Message::control("grace", &junk)));
    }
    effects(&mut b);
    assert_eq!(b.parent_grace(), 0.0, "a negative grace is clamped to 0, strings are ignored");
}

/// A broker whose parent dies while rank 0 is away is adopted by a child of rank 0 that waits for rank 0: the
/// adopter is alive, and what the adoptee sends rank 0 waits in its queue. One that re-parents itself refuses.
#[test]
fn a_child_of_rank_0_waiting_for_it_adopts_orphans() {
    let mut b = graced(1);
    b.handle(t(1.0), Input::Closed(Peer::Parent, 0, "connection reset".into()));
    effects(&mut b);
    assert!(b.reparenting.as_ref().is_some_and(|rp| rp.grace.is_some()), "waiting for rank 0");
    // Rank 5's parent, rank 2, died meanwhile.
    assert_eq!(judge(&mut b, t(2.0), 9, adopt_hello(5, 2), None), Ok(5));

    let mut b = graced(3);
    b.handle(t(1.0), Input::Closed(Peer::Parent, 0, "connection reset".into()));
    effects(&mut b);
    assert!(b.reparenting.as_ref().is_some_and(|rp| rp.grace.is_none()), "re-parenting (its parent was rank 1)");
    assert_eq!(judge(&mut b, t(1.01), 9, adopt_hello(5, 2), None), Err("this broker is re-parenting itself".into()));
}

/// SIGTERM of a router (`systemctl stop` on its node) stops it alone: its children are asked to re-parent, not to
/// stop with it (a lost router costs only its own node, and so does a stopped one).
#[test]
fn sigterm_of_a_router_lets_its_children_re_parent() {
    let mut b = graced(1);
    assert_eq!(judge(&mut b, t(0.01), 9, hello(3, "sim"), None), Ok(3));
    b.handle(t(1.0), Input::Signal(crate::signal::SIGTERM));
    let out = effects(&mut b);
    let m = out.iter().find_map(|e| match e {
        Effect::Send(Peer::Child(3), m) if m.topic == "shutdown" => Some(m.json()),
        _ => None,
    });
    assert_eq!(m.map(|j| j["orphan"].clone()), Some(json!(true)), "{out:?}");
    assert_eq!(b.exit_code(), 128 + crate::signal::SIGTERM);
    // The child re-parents (to its parent's siblings) instead of stopping.
    let mut c = graced(3);
    let stop = Message::control("shutdown", &json!({"reason": "signal 15", "orphan": true, "restart": false}));
    c.handle(t(1.0), Input::Message(Peer::Parent, 0, stop));
    let out = effects(&mut c);
    assert!(out.iter().any(|e| matches!(e, Effect::ConnectParent { lost: 1, .. })), "{out:?}");
    assert!(c.shutting_down.is_none());
}

/// A request for more nodes than have joined so far (the instance is starting, or rank 0 restarted and its
/// brokers are rejoining) is "try again" (EAGAIN), not "never" (EINVAL): only one that the whole instance could
/// not run is refused for good. Found by the simulator's `restart` scenario: submissions just after a restart were
/// refused as unsatisfiable.
#[test]
fn a_request_for_nodes_not_joined_yet_is_eagain_and_one_past_the_instance_einval() {
    let mut b = root_with_client();
    let spec = |n: u32| -> serde_json::Value {
        let js = crate::jobspec::JobspecBuilder::new(["true"]).nnodes(n).ntasks(n).build().expect("jobspec");
        serde_json::from_str(&js.to_json()).expect("json")
    };
    // Only rank 0 of the 7 has joined.
    let e = ask1(&mut b, "job-manager.submit", json!({ "jobspec": spec(3) })).expect_err("not yet");
    assert_eq!(e.0, errno::EAGAIN, "{e:?}");
    assert!(e.1.contains("only 1 of its 7 brokers have joined so far"), "{e:?}");
    let e = ask1(&mut b, "job-manager.submit", json!({ "jobspec": spec(8) })).expect_err("never");
    assert_eq!(e.0, errno::EINVAL, "{e:?}");
    ask1(&mut b, "job-manager.submit", json!({ "jobspec": spec(1) })).expect("fits now");
}

/// Found by the simulator's `restart` scenario: a restarted rank 0 knows only the static tree, so a broker that
/// had been adopted before the restart (its static parent lost) registered again, and rank 0 routed to it through
/// the lost parent: "unreachable". It names its parent in its registration, and rank 0 routes through it.
#[test]
fn a_broker_adopted_before_rank_0_restarted_is_routed_through_its_adopter() {
    let mut b = broker(0);
    b.handle(t(0.0), Input::Start);
    assert_eq!(judge(&mut b, t(0.001), 7, hello(2, "sim"), None), Ok(2));
    effects(&mut b);
    // Rank 3 (static parent 1, lost before the restart) rejoins through rank 2, which adopted it.
    let reg = |parent: u32| {
        let body = json!({"rank": 3, "hostname": "node3", "resources": {"cores": 4, "pus": 4, "numa": 1,
            "packages": 1, "gpus": 0, "gpu_names": [], "source": "test"}, "cores": "0-3", "gpus": "", "jobs": [],
            "parent": parent});
        let mut m = Message::request("resource.register", 0, &body);
        m.flags = crate::message::FLAG_NORESPONSE;
        m.userid = super::testing::UID;
        m
    };
    b.handle(t(1.0), Input::Message(Peer::Child(2), 7, reg(2)));
    effects(&mut b);
    assert_eq!(b.members[&3].0, MemberState::Online);
    assert_eq!(b.next_hop(3), crate::topology::Hop::Child(2));
    assert_eq!(b.parent_of(3), Some(2));
    // Restarted itself, it joins its static parent as a fresh broker: routed by the static tree again.
    b.handle(t(2.0), Input::Message(Peer::Child(2), 7, reg(1)));
    effects(&mut b);
    assert_eq!(b.parent_of(3), Some(1));
}

/// Rank 0 of 15 brokers (kary:2) with ranks 1 and 2 joined as its children (links 7 and 8) and every rank online.
fn root15() -> Broker {
    let mut b = super::testing::new_broker(0, 15, Topology::Kary(2), 4, Config::default(), Time::ZERO);
    b.handle(t(0.0), Input::Start);
    assert_eq!(judge(&mut b, t(0.001), 7, hello(1, "sim"), None), Ok(1));
    assert_eq!(judge(&mut b, t(0.001), 8, hello(2, "sim"), None), Ok(2));
    effects(&mut b);
    for r in 1..15 {
        b.members.insert(r, (MemberState::Online, String::new(), 0.0));
    }
    b
}

/// A notice to rank 0 (asking for no answer) that came up from its child `via` (link `conn`).
fn notice(b: &mut Broker, now: Time, via: u32, conn: u64, topic: &str, body: Value) -> Vec<Effect> {
    let mut m = Message::request(topic, 0, &body);
    m.flags = crate::message::FLAG_NORESPONSE;
    m.userid = super::testing::UID;
    b.handle(now, Input::Message(Peer::Child(via), conn, m));
    effects(b)
}

/// Rank 0 restarted on its state directory waits again for the orphans of a rank lost before it stopped (in
/// memory only until then): one that registers again or re-parents is there, one that never comes back is cut
/// off when its time is up, as without the restart. Found by the simulator's `restart` scenario (kary:32, seed
/// 1): an orphan that died before re-parenting, while rank 0 was away, was never accounted for.
#[test]
fn a_restarted_rank_0_waits_again_for_the_orphans_of_a_rank_lost_before() {
    use super::core::StateDir;
    use crate::eventlog::Event;
    let t0 = 1.8e9;
    let lost = json!({"idset": "1", "state": "lost", "reason": "3 probes missed"});
    let kept = crate::jobs::journal::Kept {
        epoch: t0,
        resource_eventlog: vec![
            Event::with_time(t0, "online", json!({"idset": "1-14"})),
            Event::with_time(t0 + 1.0, "offline", lost),
        ],
        ..Default::default()
    };
    let mut b = super::testing::new_broker(0, 15, Topology::Kary(2), 4, Config::default(), Time::ZERO);
    b.restore(StateDir::Open { dir: "/state".into(), restarts: 1, failing: None }, Some(kept));
    b.handle(t(0.0), Input::Start);
    effects(&mut b);
    assert_eq!(b.orphans.keys().copied().collect::<Vec<_>>(), [3, 4], "rank 1's children");
    let due = b.orphan_deadline().expect("a deadline");
    assert_eq!(due, Time::ZERO + super::reparent::REPARENT_TIMEOUT);
    // Rank 3 registers again under the broker that adopted it, before or during the outage.
    let reg = json!({"rank": 3, "hostname": "node3", "resources": {"cores": 4, "pus": 4, "numa": 1, "packages": 1,
        "gpus": 0, "gpu_names": [], "source": "test"}, "cores": "0-3", "gpus": "", "parent": 2});
    assert_eq!(judge(&mut b, t(0.5), 8, hello(2, "sim"), None), Ok(2));
    notice(&mut b, t(1.0), 2, 8, "resource.register", reg);
    assert_eq!(b.orphans.keys().copied().collect::<Vec<_>>(), [4]);
    let online = b.jobcore.as_ref().unwrap().resource_eventlog.last().cloned().expect("an event");
    assert_eq!((online.name.as_str(), online.context.get("parent")), ("online", Some(&json!(2))), "{online:?}");
    // Rank 4 never comes back: cut off at the deadline.
    b.handle(due, Input::Timer);
    let out = effects(&mut b);
    let cut = out.iter().any(|e| {
        matches!(e, Effect::Send(_, m) if m.topic == "overlay.lost"
            && m.json()["ranks"] == json!("4")
            && m.json()["reason"].as_str().is_some_and(|r| r.starts_with("cut off: rank 1")))
    });
    assert!(cut, "rank 4 cut off: {out:?}");
    assert_eq!(b.members[&4].0, MemberState::Lost);
    assert!(b.orphans.is_empty());
}

/// A rank its parent judged torpid, whose parent is then lost, is lively again once it re-parents: the judge that
/// could say so is gone, and its new parent judges it afresh. So are the ranks that were unreachable behind it.
#[test]
fn a_torpid_rank_whose_parent_is_lost_is_lively_once_it_re_parents() {
    let mut b = root15();
    // Rank 1 judges its child 3 torpid: 3 and the ranks behind it (7, 8) get no new work.
    notice(&mut b, t(1.0), 1, 7, "overlay.torpid", json!({"ranks": "3", "reason": "no heartbeat for 5 s"}));
    assert_eq!(b.members[&3].0, MemberState::Torpid);
    assert_eq!(b.members[&7].1, "unreachable behind torpid router rank 3");
    // Rank 1 is lost; rank 8 is also torpid on its own account (its parent 3 said so).
    notice(&mut b, t(2.0), 1, 7, "overlay.torpid", json!({"ranks": "8", "reason": "own stall"}));
    notice(&mut b, t(2.5), 2, 8, "overlay.lost", json!({"ranks": "1", "reason": "test", "root": 1}));
    assert_eq!(b.members[&4].0, MemberState::Torpid, "re-parenting");
    // Rank 3 comes back and re-parents under rank 2 (and rank 4 under rank 2 too).
    notice(&mut b, t(3.0), 2, 8, "overlay.reparent", json!({"rank": 3, "parent": 2, "lost": 1}));
    notice(&mut b, t(3.0), 2, 8, "overlay.reparent", json!({"rank": 4, "parent": 2, "lost": 1}));
    for r in [3, 4, 7] {
        assert_eq!(b.members[&r].0, MemberState::Online, "rank {r}: {:?}", b.members[&r]);
    }
    assert_eq!(b.members[&8], (MemberState::Torpid, "own stall".to_string(), b.members[&8].2), "its own verdict");
}

/// A verdict on a lost child that may have died on the way up with the judge's parent goes again once the judge
/// re-parents, until rank 0 announces the loss.
#[test]
fn an_orphan_sends_its_unannounced_lost_verdicts_again_once_adopted() {
    // Rank 3 (parent 1) with its child 7.
    let mut b = joined15(3);
    assert_eq!(judge(&mut b, t(0.1), 9, hello(7, "sim"), None), Ok(7));
    effects(&mut b);
    let lost7 = |out: &[Effect]| {
        out.iter()
            .filter_map(|e| match e {
                Effect::Send(Peer::Parent, m) if m.topic == "overlay.lost" => Some(m.json()),
                _ => None,
            })
            .collect::<Vec<Value>>()
    };
    b.handle(t(1.0), Input::Closed(Peer::Child(7), 9, "connection reset".into()));
    let sent = lost7(&effects(&mut b));
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!((sent[0]["ranks"].as_str(), sent[0]["parent"].as_u64()), (Some("7"), Some(3)));
    // The parent dies with the notice in flight; rank 3 is adopted by rank 4.
    b.handle(t(1.1), Input::Closed(Peer::Parent, 0, "connection reset".into()));
    effects(&mut b);
    b.handle(t(1.2), Input::ParentUp(super::links::LinkChoice { transport: "tcp", detail: String::new() }));
    let again = lost7(&effects(&mut b));
    assert_eq!(again.len(), 1, "sent again: {again:?}");
    assert_eq!((again[0]["ranks"].as_str(), again[0]["again"].as_bool()), (Some("7"), Some(true)));
    // Announced: not again at the next re-parent.
    event(&mut b, t(1.3), "overlay.lost", json!({"ranks": "7", "reason": "test"}));
    b.handle(t(1.4), Input::Closed(Peer::Parent, 0, "connection reset".into()));
    effects(&mut b);
    b.handle(t(1.5), Input::ParentUp(super::links::LinkChoice { transport: "tcp", detail: String::new() }));
    assert!(lost7(&effects(&mut b)).is_empty());
}

/// An orphan's re-parent notice that died with a router on its way up goes again when a rank above the orphan
/// moves (the router's own orphan re-parented), until rank 0's event for the orphan comes down; rank 0 records
/// it once. Found by the 16,384-broker overload simulation: 14 live orphans were cut off after 30 s.
#[test]
fn an_orphans_re_parent_notice_goes_again_until_rank_0_announces_it() {
    let notices = |out: &[Effect]| {
        out.iter()
            .filter_map(|e| match e {
                Effect::Send(Peer::Parent, m) if m.topic == "overlay.reparent" => Some(m.json()),
                _ => None,
            })
            .collect::<Vec<Value>>()
    };
    // Rank 7 (parent 3) loses its parent and is adopted.
    let mut b = joined15(7);
    b.handle(t(1.0), Input::Closed(Peer::Parent, 0, "connection reset".into()));
    effects(&mut b);
    b.handle(t(1.1), Input::ParentUp(super::links::LinkChoice { transport: "tcp", detail: String::new() }));
    let sent = notices(&effects(&mut b));
    assert_eq!(sent.len(), 1, "{sent:?}");
    let adopter = b.parent.expect("adopted");
    assert_eq!((sent[0]["rank"].as_u64(), sent[0]["parent"].as_u64()), (Some(7), Some(u64::from(adopter))));
    // The adopter's own parent died with the notice in flight; the adopter re-parented: rank 0's event about it.
    let again = notices(&event(&mut b, t(1.2), "overlay.reparent", json!({"rank": adopter, "parent": 0})));
    assert_eq!(again.len(), 1, "sent again: {again:?}");
    assert_eq!((again[0]["rank"].as_u64(), again[0]["again"].as_bool()), (Some(7), Some(true)));
    // Announced: not again when the adopter moves once more.
    event(&mut b, t(1.3), "overlay.reparent", json!({"rank": 7, "parent": adopter}));
    assert!(notices(&event(&mut b, t(1.4), "overlay.reparent", json!({"rank": adopter, "parent": 2}))).is_empty());

    // Rank 0: the first notice is recorded; one sent again after it is only announced again.
    let mut r0 = root15();
    let reparents =
        |b: &Broker| b.jobcore.as_ref().unwrap().resource_eventlog.iter().filter(|e| e.name == "reparent").count();
    let body = json!({"rank": 7, "parent": 8, "lost": 3});
    r0.expect_orphans(3);
    assert!(r0.orphans.contains_key(&7));
    let first = notice(&mut r0, t(1.0), 2, 8, "overlay.reparent", body.clone());
    assert!(!r0.orphans.contains_key(&7) && reparents(&r0) == 1);
    let mut again = body;
    again["again"] = json!(true);
    let second = notice(&mut r0, t(1.1), 2, 8, "overlay.reparent", again);
    assert_eq!(reparents(&r0), 1, "recorded once");
    let events = |out: &[Effect]| {
        out.iter().filter(|e| matches!(e, Effect::Send(_, m) if m.topic == "overlay.reparent")).count()
    };
    assert_eq!((events(&first), events(&second)), (2, 2), "announced to both children each time");
}

/// Rank 0 takes a verdict sent again once, and none about a rank that has another parent by now.
#[test]
fn rank_0_drops_stale_lost_verdicts() {
    let mut b = root15();
    let events =
        |out: &[Effect]| out.iter().filter(|e| matches!(e, Effect::Send(_, m) if m.topic == "overlay.lost")).count();
    let body = json!({"ranks": "7", "reason": "test", "root": 7, "parent": 3});
    assert_eq!(events(&notice(&mut b, t(1.0), 1, 7, "overlay.lost", body.clone())), 2, "to both children");
    assert_eq!(b.members[&7].0, MemberState::Lost);
    let mut again = body.clone();
    again["again"] = json!(true);
    assert_eq!(events(&notice(&mut b, t(1.1), 1, 7, "overlay.lost", again)), 0);
    // Rank 8 re-parented under rank 4: its old parent's verdict on it is stale.
    notice(&mut b, t(1.2), 2, 8, "overlay.reparent", json!({"rank": 8, "parent": 4, "lost": 3}));
    let old = json!({"ranks": "8", "reason": "test", "root": 8, "parent": 3});
    notice(&mut b, t(1.3), 1, 7, "overlay.lost", old);
    assert_eq!(b.members[&8].0, MemberState::Online);
}

/// Rank 0 with children 1 and 2 connected (at 1 ms), timers run to `at` (past the links' first second).
fn root_with_two(at: Time) -> Broker {
    let mut b = broker(0);
    b.handle(t(0.0), Input::Start);
    assert_eq!(judge(&mut b, t(0.001), 7, hello(1, "sim"), None), Ok(1));
    assert_eq!(judge(&mut b, t(0.001), 8, hello(2, "sim"), None), Ok(2));
    effects(&mut b);
    run_to(&mut b, at);
    // Both talk (heartbeats): online.
    for (r, conn) in [(1, 7), (2, 8)] {
        b.handle(at, Input::Message(Peer::Child(r), conn, Message::control("hb", &json!({}))));
    }
    effects(&mut b);
    b
}

/// Child 1's data stays unacknowledged past tbon.lost_timeout at `from`: the effects of its suspicion.
fn suspect_child_1(b: &mut Broker, from: Time) -> (Vec<Effect>, Time) {
    let c = *b.membership.config();
    b.handle(from, Input::AckSamples(vec![(1, 1, 0.0, 0.0), (2, 0, 0.0, 0.0)]));
    effects(b);
    let at = from + Duration::from_secs_f64(c.lost_timeout + 0.001);
    b.handle(at, Input::AckSamples(vec![(1, 1, c.lost_timeout + 0.001, 0.0), (2, 0, 0.0, 0.0)]));
    (effects(b), at)
}

fn confirm_asks(out: &[Effect]) -> Vec<(u32, u64)> {
    out.iter()
        .filter_map(|e| match e {
            Effect::Send(Peer::Child(r), m) if m.topic == "confirm" => Some((*r, m.json()["id"].as_u64().unwrap())),
            _ => None,
        })
        .collect()
}

/// One signal never makes a verdict: a child whose TCP data waits is checked by this broker and by a sibling,
/// and any path that reaches its node's kernel keeps it from being lost (issue "never wrong under load").
#[test]
fn a_suspect_child_is_checked_by_its_siblings_and_kept_when_one_reaches_it() {
    let mut b = root_with_two(t(1.5));
    let (out, at) = suspect_child_1(&mut b, t(1.5));
    assert_ne!(b.membership.state(1), PeerState::Lost, "lost on the TCP signal alone");
    let own: Vec<u64> = out
        .iter()
        .filter_map(|e| match e {
            Effect::CheckNode { token, target: super::confirm::CheckTarget::Node { node, .. }, .. } => {
                assert_eq!(node, "peer");
                Some(*token)
            }
            _ => None,
        })
        .collect();
    assert_eq!(own.len(), 1, "{out:?}");
    let asks = confirm_asks(&out);
    assert_eq!(asks.iter().map(|a| a.0).collect::<Vec<_>>(), [2], "the sibling is asked: {out:?}");
    // Our own path gets no answer (our side of the network, or we are starved); the sibling's reaches the node.
    b.handle(at, Input::NodeChecked { token: own[0], answered: Some(false) });
    assert_ne!(b.membership.state(1), PeerState::Lost, "decided before the sibling answered");
    let reply = Message::control("confirmed", &json!({"id": asks[0].1, "answered": true}));
    b.handle(at + Duration::from_millis(2), Input::Message(Peer::Child(2), 8, reply));
    effects(&mut b);
    assert_ne!(b.membership.state(1), PeerState::Lost);
    assert!(b.next_deadline().is_some());
    // A late or forged answer about a finished confirmation changes nothing.
    let reply = Message::control("confirmed", &json!({"id": asks[0].1, "answered": false}));
    b.handle(at + Duration::from_millis(3), Input::Message(Peer::Child(2), 8, reply));
    assert_ne!(b.membership.state(1), PeerState::Lost);
    assert_eq!(b.confirm.status()["suspicions_cleared"], 1);
}

/// Every path silent: lost, and the reason says which paths were tried. Paths that never report are given up
/// at the bound.
#[test]
fn a_suspect_child_no_path_reaches_is_lost_and_the_reason_says_how() {
    let mut b = root_with_two(t(1.5));
    let (out, at) = suspect_child_1(&mut b, t(1.5));
    let asks = confirm_asks(&out);
    assert_eq!(asks.len(), 1);
    let own = out.iter().find_map(|e| match e {
        Effect::CheckNode { token, .. } => Some(*token),
        _ => None,
    });
    b.handle(at + Duration::from_millis(120), Input::NodeChecked { token: own.unwrap(), answered: Some(false) });
    effects(&mut b);
    assert_ne!(b.membership.state(1), PeerState::Lost, "the sibling has not reported yet");
    // The sibling never reports (lost with its answer, or starved): decided at the bound.
    let out_lost = run_to(&mut b, at + Duration::from_secs(1));
    assert!(!b.children.contains_key(&1), "lost and dropped");
    let why = lost_reason(&out_lost);
    assert!(why.contains("no TCP acknowledgement") && why.contains("rank 2's: no report in time"), "{why}");
    assert!(why.contains("this broker's check: no answer"), "{why}");
    assert_ne!(b.membership.state(2), PeerState::Lost, "the silent helper is not blamed for it");
}

/// A broker asked by its parent runs the check and answers; a request it cannot read is ignored, and past
/// MAX_HELPING checks at once it answers "cannot check" without holding more.
#[test]
fn a_child_checks_a_siblings_node_for_its_parent_within_a_bound() {
    let mut b = router();
    let ask = |id: u64| {
        Message::control("confirm", &json!({"id": id, "node": "10.0.0.9:41000", "port": 4100, "wait_ms": 100}))
    };
    b.handle(t(0.1), Input::Message(Peer::Parent, 0, ask(7)));
    let out = effects(&mut b);
    let token = match out.as_slice() {
        [Effect::CheckNode { token, target: super::confirm::CheckTarget::Node { node, port: Some(4100) }, wait }] => {
            assert_eq!(node, "10.0.0.9:41000");
            assert_eq!(*wait, Duration::from_millis(100));
            *token
        }
        other => panic!("{other:?}"),
    };
    b.handle(t(0.2), Input::NodeChecked { token, answered: Some(true) });
    let out = effects(&mut b);
    let sent: Vec<Value> = out
        .iter()
        .filter_map(|e| match e {
            Effect::Send(Peer::Parent, m) if m.topic == "confirmed" => Some(m.json()),
            _ => None,
        })
        .collect();
    assert_eq!(sent, [json!({"id": 7, "answered": true})]);
    // Unreadable requests: nothing.
    for bad in [
        json!({}),
        json!({"id": "x", "node": "a"}),
        json!({"id": 1}),
        json!([1, 2]),
        json!({"id": 1, "node": "a".repeat(300)}),
    ] {
        b.handle(t(0.3), Input::Message(Peer::Parent, 0, Message::control("confirm", &bad)));
        assert!(effects(&mut b).is_empty(), "{bad}");
    }
    // A flood: at most MAX_HELPING checks held; the rest answered at once.
    for id in 0..(super::confirm::MAX_HELPING as u64 + 10) {
        b.handle(t(0.4), Input::Message(Peer::Parent, 0, ask(100 + id)));
    }
    let out = effects(&mut b);
    let checks = out.iter().filter(|e| matches!(e, Effect::CheckNode { .. })).count();
    let refused = out.iter().filter(|e| matches!(e, Effect::Send(Peer::Parent, m) if m.topic == "confirmed")).count();
    assert_eq!((checks, refused), (super::confirm::MAX_HELPING, 10));
}

/// A broker whose timers run late knows it: its TCP verdicts wait longer, `judge` says so, and it recovers.
#[test]
fn a_late_judge_says_so_and_recovers() {
    let mut b = root_with_two(t(1.5));
    assert_eq!(b.confirm.status()["state"], "on time");
    // Starved: three heartbeat timers in a row run 100 ms late (less than torpid_max: no stall grace).
    let mut now = t(1.5);
    for _ in 0..3 {
        now = b.next_heartbeat + Duration::from_millis(100);
        b.handle(now, Input::Timer);
        effects(&mut b);
    }
    assert_eq!(b.confirm.factor(), 4.0);
    let state = b.confirm.status()["state"].as_str().unwrap().to_string();
    assert!(state.starts_with("degraded") && state.contains("100 ms late"), "{state}");
    // On time again: the score falls one per heartbeat.
    run_to(&mut b, now + Duration::from_secs(1));
    assert_eq!(b.confirm.factor(), 1.0);
    assert_eq!(b.confirm.status()["state"], "on time");
}

/// The reason of the `overlay.lost` notice among `out`.
fn lost_reason(out: &[Effect]) -> String {
    out.iter()
        .find_map(|e| match e {
            Effect::Send(_, m) if m.topic == "overlay.lost" => {
                Some(m.json()["reason"].as_str().unwrap_or("").to_string())
            }
            _ => None,
        })
        .unwrap_or_else(|| panic!("no overlay.lost notice: {out:?}"))
}

/// The `rexec.kill` requests among `out`, as (the peer sent to, the target rank, the signal).
fn kills(out: &[Effect]) -> Vec<(Peer, u32, i64)> {
    out.iter()
        .filter_map(|e| match e {
            Effect::Send(p, m) if m.msgtype == MsgType::Request && m.topic == "rexec.kill" => {
                Some((*p, m.nodeid, m.json()["signal"].as_i64().unwrap_or(0)))
            }
            _ => None,
        })
        .collect()
}

/// Rank 0 of a 7-broker binary tree loses router rank 1 under a job running on ranks 1-4: the SIGTERM for the
/// shells of ranks 3 and 4 behind it cannot be routed and comes back EHOSTUNREACH; each goes, once, through the
/// adopter when rank 0 records its re-parent (jobs/kills.rs).
#[test]
fn a_kill_behind_a_lost_router_goes_once_the_orphan_re_parents() {
    let mut b = broker(0);
    b.handle(t(0.0), Input::Start);
    assert_eq!(judge(&mut b, t(0.001), 7, hello(1, "sim"), None), Ok(1));
    assert_eq!(judge(&mut b, t(0.001), 8, hello(2, "sim"), None), Ok(2));
    for (r, via, conn) in [(1, 1, 7), (2, 2, 8), (3, 1, 7), (4, 1, 7), (5, 2, 8), (6, 2, 8)] {
        let reg = json!({"rank": r, "hostname": format!("node{r}"), "resources": {"cores": 4, "pus": 4, "numa": 1,
            "packages": 1, "gpus": 0, "gpu_names": [], "source": "test"}, "cores": "0-3", "gpus": ""});
        let mut m = Message::request("resource.register", 0, &reg);
        m.flags = crate::message::FLAG_NORESPONSE;
        m.userid = super::testing::UID;
        m.route = vec![r];
        b.handle(t(0.002), Input::Message(Peer::Child(via), conn, m));
    }
    effects(&mut b);
    let jc = b.jobcore.as_mut().expect("rank 0");
    for r in [0, 5, 6] {
        jc.drain(0.0, &crate::idset::IdSet::from_iter([r]), "test", crate::jobs::DrainMode::Refuse).expect("drain");
    }
    let spec = crate::jobspec::JobspecBuilder::new(["sleep", "60"]).nnodes(4).build().expect("jobspec");
    let spec: Value = serde_json::from_str(&spec.to_json()).expect("json");
    let id = jc
        .submit(super::testing::WALL_ORIGIN, crate::jobs::SubmitRequest::new(&spec, super::testing::UID))
        .expect("submit")
        .id;
    // Its shells started (their spawn requests are not the point here: taken from the job core unsent).
    while jc.poll_action().is_some() {}
    for r in 1..=4 {
        jc.shell_spawned(super::testing::WALL_ORIGIN, id, r, Ok(()));
    }
    while jc.poll_action().is_some() {}

    // Router rank 1's link resets: it is lost, and its job with it; SIGTERM to the shells left.
    b.handle(t(1.0), Input::Closed(Peer::Child(1), 7, "connection reset".into()));
    let out = effects(&mut b);
    assert_eq!(kills(&out), vec![(Peer::Child(2), 2, 15)], "only rank 2 is reachable now: {out:?}");
    let jc = b.jobcore.as_ref().expect("rank 0");
    assert_eq!(jc.unreachable_signals(), vec![(id, 3, 15), (id, 4, 15)]);

    // Rank 3 re-parents under rank 2: its SIGTERM goes there now; rank 4's waits for its own re-parent.
    let reparent = |rank: u32| {
        let mut m = Message::request("overlay.reparent", 0, &json!({"rank": rank, "parent": 2, "lost": 1}));
        m.flags = crate::message::FLAG_NORESPONSE;
        m.userid = super::testing::UID;
        m.route = vec![rank];
        m
    };
    b.handle(t(1.3), Input::Message(Peer::Child(2), 8, reparent(3)));
    assert_eq!(kills(&effects(&mut b)), vec![(Peer::Child(2), 3, 15)]);
    b.handle(t(1.31), Input::Message(Peer::Child(2), 8, reparent(4)));
    assert_eq!(kills(&effects(&mut b)), vec![(Peer::Child(2), 4, 15)]);
    // Once: a re-parent notice sent again changes nothing.
    let mut again = reparent(3);
    again.payload = serde_json::to_vec(&json!({"rank": 3, "parent": 2, "lost": 1, "again": true})).expect("json");
    b.handle(t(1.4), Input::Message(Peer::Child(2), 8, again));
    assert!(kills(&effects(&mut b)).is_empty());
    assert!(b.jobcore.as_ref().expect("rank 0").unreachable_signals().is_empty());
}

/// `job-manager.submit` with a `submit_key` (jobs/submit_key.rs): sent again, the same job, `"duplicate": true`;
/// a bad key is refused naming the field (EINVAL); the same key with another jobspec, EEXIST.
#[test]
fn a_submission_sent_again_with_its_key_answers_the_same_job() {
    let mut b = root_with_client();
    let spec = |n: u32| -> serde_json::Value {
        let b = crate::jobspec::JobspecBuilder::new(["true"]).ntasks(n);
        serde_json::from_str(&b.build().expect("jobspec").to_json()).expect("json")
    };
    let first = ask1(&mut b, "job-manager.submit", json!({"jobspec": spec(1), "submit_key": "a1b2"})).expect("ok");
    assert_eq!(first.get("duplicate"), None, "{first}");
    let again = ask1(&mut b, "job-manager.submit", json!({"jobspec": spec(1), "submit_key": "a1b2"})).expect("ok");
    assert_eq!((again["id"].clone(), again["duplicate"].clone()), (first["id"].clone(), json!(true)), "{again}");
    assert_eq!(b.jobcore.as_ref().expect("rank 0").jobs.len(), 1);
    let e = ask1(&mut b, "job-manager.submit", json!({"jobspec": spec(1), "submit_key": 12})).expect_err("bad");
    assert!(e.0 == errno::EINVAL && e.1.starts_with("submit_key: must be a string"), "{e:?}");
    let e = ask1(&mut b, "job-manager.submit", json!({"jobspec": spec(2), "submit_key": "a1b2"})).expect_err("reused");
    assert!(e.0 == errno::EEXIST && e.1.contains("submit_key"), "{e:?}");
    let other = ask1(&mut b, "job-manager.submit", json!({"jobspec": spec(1)})).expect("ok");
    assert_ne!(other["id"], first["id"], "no key: a new job");
}

/// Rank `rank` joins `b` (rank 0) as a child on link `conn` and registers, as its broker does.
fn join_and_register(b: &mut Broker, now: Time, rank: u32, conn: u64) {
    assert_eq!(judge(b, now, conn, hello(u64::from(rank), "sim"), None), Ok(rank));
    let reg = json!({"rank": rank, "hostname": format!("node{rank}"), "resources": {"cores": 4, "pus": 4, "numa": 1,
        "packages": 1, "gpus": 0, "gpu_names": [], "source": "test"}, "cores": "0-3", "gpus": ""});
    let mut m = Message::request("resource.register", 0, &reg);
    m.flags = crate::message::FLAG_NORESPONSE;
    m.userid = super::testing::UID;
    b.handle(now, Input::Message(Peer::Child(rank), conn, m));
    effects(b);
}

/// Rank 0 of [`broker`] with ranks 1 and 2 registered, client 5, and a running 3-node batch-like job (its
/// jobspec says its tasks are a nested instance, `attributes.system.instance`, whose only critical rank is its
/// rank 0, on broker rank 0) with every shell started: its id.
fn root_running_a_nested_job() -> (Broker, u64) {
    let mut b = root_with_client();
    join_and_register(&mut b, t(0.01), 1, 7);
    join_and_register(&mut b, t(0.01), 2, 8);
    let mut spec: serde_json::Value = serde_json::from_str(
        &crate::jobspec::JobspecBuilder::new(["vigil", "broker"]).nnodes(3).exclusive(true).build().unwrap().to_json(),
    )
    .unwrap();
    spec["attributes"]["system"]["instance"] = json!({"tbon.reparent": "on"});
    let id = ask1(&mut b, "job-manager.submit", json!({"jobspec": spec})).expect("submitted")["id"].as_u64().unwrap();
    let jc = b.jobcore.as_mut().unwrap();
    for r in 0..3 {
        jc.shell_spawned(super::testing::WALL_ORIGIN + 0.1, crate::jobs::JobId(id), r, Ok(()));
    }
    effects(&mut b);
    (b, id)
}

/// Shell `shell` of job `id` enters the PMI barrier with one put, `k<shell>=v<shell>` (request `matchtag`
/// `10 + shell`): the responses client 5 gets now.
fn pmi_enter(b: &mut Broker, id: u64, shell: u32) -> Vec<Message> {
    let mut m = Message::request(
        "job-exec.pmi-barrier",
        0,
        &json!({"id": id, "shell_rank": shell, "kvs": {format!("k{shell}"): format!("v{shell}")}}),
    );
    m.matchtag = 10 + shell;
    b.handle(t(0.2), Input::Message(Peer::Local(5), 0, m));
    responses(&effects(b), Peer::Local(5)).into_iter().cloned().collect()
}

/// Broker rank `rank`'s node is lost (its judge's verdict reaches rank 0): the responses client 5 gets.
fn lose(b: &mut Broker, rank: u32) -> Vec<Message> {
    let mut m = Message::request("overlay.lost", 0, &json!({"ranks": rank.to_string(), "reason": "test"}));
    m.flags = crate::message::FLAG_NORESPONSE;
    b.handle(t(0.3), Input::Message(Peer::Local(5), 0, m));
    responses(&effects(b), Peer::Local(5)).into_iter().cloned().collect()
}

/// The PMI exchange of a job's shells (how a batch job's nested brokers swap endpoints) ends over the live
/// shells when a shell's node is lost, without what the lost shell put, whether the loss comes before the last
/// live shell arrives or after (issue 36: a node lost while a batch job's instance starts).
#[test]
fn a_pmi_barrier_ends_without_a_shell_whose_node_was_lost() {
    // Shell 1 arrives, then is lost; the barrier ends when the last live shell arrives.
    let (mut b, id) = root_running_a_nested_job();
    assert!(pmi_enter(&mut b, id, 1).is_empty());
    assert!(pmi_enter(&mut b, id, 0).is_empty());
    assert!(lose(&mut b, 1).is_empty(), "shell 2 has yet to arrive");
    let out = pmi_enter(&mut b, id, 2);
    assert_eq!(out.iter().map(|m| m.matchtag).collect::<BTreeSet<_>>(), BTreeSet::from([10, 12]), "{out:?}");
    for m in &out {
        assert_eq!(m.json(), json!({"kvs": {"k0": "v0", "k2": "v2"}}), "the lost shell's puts are left out");
    }
    let job = &b.jobcore.as_ref().unwrap().jobs[&crate::jobs::JobId(id)];
    assert_eq!(job.state, crate::jobs::JobState::Run, "a severity-2 loss: {:?}", job.eventlog);
    // The next barrier counts the two live shells only.
    assert!(pmi_enter(&mut b, id, 0).is_empty());
    assert_eq!(pmi_enter(&mut b, id, 2).len(), 2);

    // The live shells are all in when the loss comes: it ends the barrier.
    let (mut b, id) = root_running_a_nested_job();
    assert!(pmi_enter(&mut b, id, 0).is_empty());
    assert!(pmi_enter(&mut b, id, 2).is_empty());
    let out = lose(&mut b, 1);
    assert_eq!(out.len(), 2, "{out:?}");
    assert!(out.iter().all(|m| m.json() == json!({"kvs": {"k0": "v0", "k2": "v2"}})), "{out:?}");
}

/// A PMI exchange whose union could not be answered in one overlay message is refused to the shell that would
/// take it past [`super::services::job_exec::PMI_EXCHANGE_MAX`], with ENOSPC, and ends its job with a fatal
/// exception saying why, so the shells already in the barrier are not left waiting for an answer that cannot be
/// sent (issue 38: a fence larger than a bound).
#[test]
fn a_pmi_exchange_too_large_for_one_message_ends_its_job() {
    let (mut b, id) = root_running_a_nested_job();
    let max = super::services::job_exec::PMI_EXCHANGE_MAX;
    // Shells 0 and 1 put just under half the bound each; shell 2's few more bytes are too many.
    let value = "v".repeat(crate::pmi::VALLEN_MAX);
    let puts = |shell: u32, n: usize| -> serde_json::Map<String, serde_json::Value> {
        (0..n).map(|i| (format!("s{shell}k{i:08}"), json!(value))).collect()
    };
    let per_entry = serde_json::to_vec(&puts(0, 2)).unwrap().len() - serde_json::to_vec(&puts(0, 1)).unwrap().len();
    let half = max / 2 / per_entry;
    for shell in 0..2 {
        let mut m = Message::request(
            "job-exec.pmi-barrier",
            0,
            &json!({"id": id, "shell_rank": shell, "kvs": puts(shell, half)}),
        );
        m.matchtag = 10 + shell;
        b.handle(t(0.2), Input::Message(Peer::Local(5), 0, m));
        assert!(responses(&effects(&mut b), Peer::Local(5)).is_empty(), "shell {shell} waits");
    }
    let mut m = Message::request("job-exec.pmi-barrier", 0, &json!({"id": id, "shell_rank": 2, "kvs": puts(2, 64)}));
    m.matchtag = 12;
    b.handle(t(0.2), Input::Message(Peer::Local(5), 0, m));
    let out: Vec<Message> = responses(&effects(&mut b), Peer::Local(5)).into_iter().cloned().collect();
    assert_eq!(out.len(), 1, "only shell 2 is answered: {out:?}");
    assert_eq!((out[0].matchtag, out[0].errnum), (12, crate::message::errno::ENOSPC), "{:?}", out[0]);
    let job = &b.jobcore.as_ref().unwrap().jobs[&crate::jobs::JobId(id)];
    let fatal = job.fatal.as_ref().expect("a fatal exception");
    assert!(format!("{fatal:?}").contains("PMI exchange too large"), "{fatal:?}");
    // Shells 0 and 1 are released by no one (their job is being killed), even when shell 2 comes back with less.
    let out = pmi_enter(&mut b, id, 2);
    assert!(out.iter().all(|m| m.matchtag == 12 && m.errnum != 0), "{out:?}");
}

/// The brokers of a 3-level PMI exchange in virtual time, on [`broker`]'s tree (0 → 1, 2; 1 → 3, 4; 2 → 5, 6):
/// rank 0 with every rank registered and a running 7-node batch-like job (every shell started), router rank 1 with
/// its children 3 and 4 joined, and leaf rank 3; ranks 1 and 3 each have a shell connected as client 9.
struct Tree {
    root: Broker,
    router: Broker,
    leaf: Broker,
    id: u64,
}

/// Client 9 of a broker other than rank 0: its job shell.
const SHELL: u32 = crate::message::ROUTE_LOCAL | 9;

fn tree() -> Tree {
    let mut root = root_with_client();
    join_and_register(&mut root, t(0.01), 1, 7);
    join_and_register(&mut root, t(0.01), 2, 8);
    for r in 3..7 {
        let reg = json!({"rank": r, "hostname": format!("node{r}"), "resources": {"cores": 4, "pus": 4, "numa": 1,
            "packages": 1, "gpus": 0, "gpu_names": [], "source": "test"}, "cores": "0-3", "gpus": ""});
        let mut m = Message::request("resource.register", 0, &reg);
        (m.flags, m.userid) = (crate::message::FLAG_NORESPONSE, super::testing::UID);
        let via = if r < 5 { 1 } else { 2 };
        root.handle(t(0.01), Input::Message(Peer::Child(via), 6 + u64::from(via), m));
        effects(&mut root);
    }
    let mut spec: serde_json::Value = serde_json::from_str(
        &crate::jobspec::JobspecBuilder::new(["vigil", "broker"]).nnodes(7).exclusive(true).build().unwrap().to_json(),
    )
    .unwrap();
    spec["attributes"]["system"]["instance"] = json!({"tbon.reparent": "on"});
    let id =
        ask1(&mut root, "job-manager.submit", json!({"jobspec": spec})).expect("submitted")["id"].as_u64().unwrap();
    // Every shell starts: rank 0's at once, the others as their brokers answer rank 0's `rexec.spawn`.
    let jc = root.jobcore.as_mut().unwrap();
    jc.shell_spawned(super::testing::WALL_ORIGIN + 0.1, crate::jobs::JobId(id), 0, Ok(()));
    effects(&mut root);
    for (c, reqs) in root.inflight.clone() {
        for req in reqs.values() {
            let m = Message::response_to(req, &json!({}));
            root.handle(t(0.1), Input::Message(Peer::Child(c), 6 + u64::from(c), m));
        }
    }
    effects(&mut root);
    assert!(root.inflight.values().all(|m| m.is_empty()), "{:?}", root.inflight);
    let shells = &root.jobcore.as_ref().unwrap().jobs[&crate::jobs::JobId(id)].shells;
    assert!(shells.iter().all(|(rank, s)| s.shell_rank == *rank), "shell i on rank i: {shells:?}");
    let mut router = router();
    assert_eq!(judge(&mut router, t(0.01), 3, hello(3, "sim"), None), Ok(3));
    assert_eq!(judge(&mut router, t(0.01), 4, hello(4, "sim"), None), Ok(4));
    let mut leaf = broker(3);
    leaf.handle(t(0.0), Input::ParentUp(super::links::LinkChoice { transport: "tcp", detail: String::new() }));
    for b in [&mut router, &mut leaf] {
        b.handle(t(0.0), Input::LocalNew { id: 9, uid: super::testing::UID });
        effects(b);
    }
    Tree { root, router, leaf, id }
}

/// Shell `shell`'s `job-exec.pmi-barrier` request of job `id` (matchtag `10 + shell`, one put `k<shell>`).
fn pmi_request(id: u64, shell: u32) -> Message {
    let kvs = json!({format!("k{shell}"): format!("v{shell}")});
    let mut m = Message::request("job-exec.pmi-barrier", 0, &json!({"id": id, "shell_rank": shell, "kvs": kvs}));
    m.matchtag = 10 + shell;
    m
}

/// What `b` sends its parent among `out`.
fn up(out: &[Effect]) -> Vec<Message> {
    out.iter()
        .filter_map(|e| match e {
            Effect::Send(Peer::Parent, m) => Some(m.clone()),
            _ => None,
        })
        .collect()
}

/// One `rexec.pmi-answer` hop: the child it goes to, the requests it names (matchtag, route) and its answer.
type AnswerHop = (u32, Vec<(u32, Vec<u32>)>, Value);

/// The `rexec.pmi-answer` hops among `out`, by child.
fn answer_hops(out: &[Effect]) -> Vec<AnswerHop> {
    out.iter()
        .filter_map(|e| match e {
            Effect::Send(Peer::Child(c), m) if m.topic == super::pmi_down::TOPIC => {
                let (to, answer) = super::pmi_down::decode(&m.payload).expect("a well-formed hop");
                let to = to.into_iter().map(|r| (r.0, r.2)).collect();
                Some((*c, to, serde_json::from_slice(answer).expect("JSON answer")))
            }
            _ => None,
        })
        .collect()
}

/// Every response among `out`, to whom: (peer, matchtag, errno).
fn all_responses(out: &[Effect]) -> Vec<(Peer, u32, u32)> {
    out.iter()
        .filter_map(|e| match e {
            Effect::Send(p, m) if m.msgtype == MsgType::Response => Some((*p, m.matchtag, m.errnum)),
            _ => None,
        })
        .collect()
}

/// Shells 0..7 enter the exchange, each through its own broker: shell 3 through the leaf and the router, shell 1
/// through the router, shell 4 as the router's child sends it; the others straight into rank 0 with the routes
/// their brokers would stamp. Returns rank 0's effects after the last (`except` is left out).
fn enter_all(tr: &mut Tree, except: Option<u32>) -> Vec<Effect> {
    let mut last = Vec::new();
    for shell in (0..7).filter(|s| Some(*s) != except) {
        let at_root = match shell {
            0 => {
                tr.root.handle(t(0.2), Input::Message(Peer::Local(5), 0, pmi_request(tr.id, 0)));
                last = effects(&mut tr.root);
                continue;
            }
            1 | 3 | 4 => {
                let from_router = if shell == 1 {
                    tr.router.handle(t(0.2), Input::Message(Peer::Local(9), 0, pmi_request(tr.id, 1)));
                    up(&effects(&mut tr.router))
                } else {
                    let m = if shell == 3 {
                        tr.leaf.handle(t(0.2), Input::Message(Peer::Local(9), 0, pmi_request(tr.id, 3)));
                        up(&effects(&mut tr.leaf)).pop().expect("the leaf sends it up")
                    } else {
                        let mut m = pmi_request(tr.id, 4);
                        (m.route, m.userid) = (vec![SHELL], super::testing::UID);
                        m
                    };
                    tr.router.handle(t(0.2), Input::Message(Peer::Child(shell), u64::from(shell), m));
                    up(&effects(&mut tr.router))
                };
                assert_eq!(from_router.len(), 1, "the router sends shell {shell}'s request up");
                (1, from_router[0].clone())
            }
            _ => {
                let mut m = pmi_request(tr.id, shell);
                let route = if shell == 2 { vec![SHELL] } else { vec![SHELL, shell] };
                (m.route, m.userid) = (route, super::testing::UID);
                (2, m)
            }
        };
        let (via, m) = at_root;
        tr.root.handle(t(0.2), Input::Message(Peer::Child(via), 6 + u64::from(via), m));
        last = effects(&mut tr.root);
    }
    last
}

/// Issue 38: rank 0 answers a PMI exchange with one message per child link, not one per shell: the union goes
/// to each child once, naming the requests answered below it; rank 0's own shell is answered directly. The router
/// answers its own shell, passes one message to each child with shells below it, and forgets the requests it had
/// sent up (no stale error when its parent is lost later); the leaf answers its shell with the same union.
#[test]
fn a_pmi_exchange_is_answered_down_the_tree_once_per_link() {
    let mut tr = tree();
    let out = enter_all(&mut tr, None);
    let union: serde_json::Map<String, Value> = (0..7).map(|s| (format!("k{s}"), json!(format!("v{s}")))).collect();
    let union = json!({"kvs": union});
    assert_eq!(all_responses(&out), [(Peer::Local(5), 10, 0)], "rank 0 answers only its own shell: {out:?}");
    assert_eq!(responses(&out, Peer::Local(5))[0].json(), union);
    let hops = answer_hops(&out);
    let hop = |c: u32, to: &[(u32, &[u32])]| {
        (c, to.iter().map(|(tag, r)| (*tag, r.to_vec())).collect::<Vec<_>>(), union.clone())
    };
    assert_eq!(
        hops,
        [
            hop(1, &[(11, &[SHELL]), (13, &[SHELL, 3]), (14, &[SHELL, 4])]),
            hop(2, &[(12, &[SHELL]), (15, &[SHELL, 5]), (16, &[SHELL, 6])]),
        ],
        "one message per child link"
    );
    let sent = out.iter().filter(|e| matches!(e, Effect::Send(Peer::Child(_), _))).count();
    assert_eq!(sent, 2, "nothing else goes down: {out:?}");

    // The router: its own shell answered, one hop to each child, nothing left in flight to its parent.
    assert_eq!(tr.router.inflight.get(&PARENT).map_or(0, |m| m.len()), 3, "shells 1, 3 and 4 went up through it");
    let to_router = out
        .iter()
        .find_map(|e| match e {
            Effect::Send(Peer::Child(1), m) => Some(m.clone()),
            _ => None,
        })
        .expect("a hop to rank 1");
    tr.router.handle(t(0.3), Input::Message(Peer::Parent, 0, to_router));
    let out = effects(&mut tr.router);
    assert_eq!(all_responses(&out), [(Peer::Local(9), 11, 0)], "{out:?}");
    assert_eq!(responses(&out, Peer::Local(9))[0].json(), union);
    assert_eq!(answer_hops(&out), [hop(3, &[(13, &[SHELL])]), hop(4, &[(14, &[SHELL])])]);
    assert!(up(&out).is_empty(), "nothing goes back up: {out:?}");
    assert_eq!(tr.router.inflight.get(&PARENT).map_or(0, |m| m.len()), 0, "answered: no longer in flight");
    tr.router.handle(t(0.4), Input::Closed(Peer::Parent, 0, "connection reset".into()));
    assert!(responses(&effects(&mut tr.router), Peer::Local(9)).is_empty(), "no stale EHOSTUNREACH");

    // The leaf: its shell gets the union as the response to its request.
    let to_leaf = out
        .iter()
        .find_map(|e| match e {
            Effect::Send(Peer::Child(3), m) => Some(m.clone()),
            _ => None,
        })
        .expect("a hop to rank 3");
    tr.leaf.handle(t(0.3), Input::Message(Peer::Parent, 0, to_leaf));
    let out = effects(&mut tr.leaf);
    assert_eq!(all_responses(&out), [(Peer::Local(9), 13, 0)], "{out:?}");
    let r = responses(&out, Peer::Local(9))[0];
    assert_eq!((r.topic.as_str(), r.json()), ("job-exec.pmi-barrier", union));
    assert!(answer_hops(&out).is_empty() && up(&out).is_empty(), "{out:?}");
}

/// A router lost during a PMI exchange: its node's shell is left out (a batch-like job survives the loss), rank 0
/// answers the others down the links it still has, and drops the answer of the shell whose request came up through
/// the lost router; that shell's broker, orphaned, answers it EHOSTUNREACH, so its shell fails the exchange (a job
/// exception) rather than wait. A shell that re-parented under rank 2 and enters after the loss is answered
/// through rank 2.
#[test]
fn a_router_lost_during_a_pmi_exchange_leaves_no_shell_waiting() {
    let mut tr = tree();
    assert!(all_responses(&enter_all(&mut tr, Some(4))).is_empty(), "shell 4 has yet to arrive");
    tr.root.handle(t(0.3), Input::Closed(Peer::Child(1), 7, "connection reset".into()));
    let out = effects(&mut tr.root);
    assert!(all_responses(&out).is_empty() && answer_hops(&out).is_empty(), "shell 4 is alive: {out:?}");
    let job = &tr.root.jobcore.as_ref().unwrap().jobs[&crate::jobs::JobId(tr.id)];
    assert_eq!(job.state, crate::jobs::JobState::Run, "a severity-2 loss: {:?}", job.eventlog);
    // Rank 4, adopted by rank 2, sends its shell's request up through it.
    let mut m = pmi_request(tr.id, 4);
    (m.route, m.userid) = (vec![SHELL, 4], super::testing::UID);
    tr.root.handle(t(0.4), Input::Message(Peer::Child(2), 8, m));
    let out = effects(&mut tr.root);
    assert_eq!(all_responses(&out), [(Peer::Local(5), 10, 0)], "{out:?}");
    let union: serde_json::Map<String, Value> =
        [0, 2, 3, 4, 5, 6].iter().map(|s| (format!("k{s}"), json!(format!("v{s}")))).collect();
    let to = |v: &[(u32, &[u32])]| v.iter().map(|(tag, r)| (*tag, r.to_vec())).collect::<Vec<_>>();
    assert_eq!(
        answer_hops(&out),
        [(2, to(&[(12, &[SHELL]), (14, &[SHELL, 4]), (15, &[SHELL, 5]), (16, &[SHELL, 6])]), json!({"kvs": union}))],
        "nothing down the lost link, the lost node's puts left out"
    );
    assert!(!out.iter().any(|e| matches!(e, Effect::Send(Peer::Child(1), _))), "{out:?}");
    // Shell 3's request went up through the lost router: its broker answers it when it loses its parent.
    tr.leaf.handle(t(0.3), Input::Closed(Peer::Parent, 0, "connection reset".into()));
    let out = effects(&mut tr.leaf);
    let r = responses(&out, Peer::Local(9));
    assert_eq!(r.iter().map(|m| (m.matchtag, m.errnum)).collect::<Vec<_>>(), [(13, errno::EHOSTUNREACH)], "{out:?}");
}

/// `rexec.pmi-answer` is taken from the broker's parent only, and a malformed one is refused naming what is
/// wrong, never relayed: a local client cannot forge the answers of other clients.
#[test]
fn a_pmi_answer_comes_from_the_parent_only_and_is_checked() {
    let mut tr = tree();
    let m_payload = super::pmi_down::encode(&[super::pmi_down::Recipient(77, 0, vec![SHELL])], b"{\"kvs\":{}}");
    let mut m = Message::request_json(super::pmi_down::TOPIC, 1, m_payload.clone());
    m.matchtag = 3;
    tr.router.handle(t(0.2), Input::Message(Peer::Local(9), 0, m));
    let out = effects(&mut tr.router);
    assert_eq!(all_responses(&out), [(Peer::Local(9), 3, errno::EPERM)], "{out:?}");
    // Nor from a child.
    let mut m = Message::request_json(super::pmi_down::TOPIC, 1, m_payload.clone());
    (m.matchtag, m.userid) = (4, super::testing::UID);
    tr.router.handle(t(0.2), Input::Message(Peer::Child(3), 3, m));
    let out = effects(&mut tr.router);
    assert_eq!(all_responses(&out), [(Peer::Child(3), 4, errno::EPERM)], "{out:?}");
    let mut m = Message::request_json(super::pmi_down::TOPIC, 1, b"{\"to\": [[1, 2, []]]}\n{}".to_vec());
    m.userid = super::testing::UID;
    tr.router.handle(t(0.2), Input::Message(Peer::Parent, 0, m));
    let out = effects(&mut tr.router);
    assert_eq!(all_responses(&out), [(Peer::Parent, 0, errno::EPROTO)], "refused, not relayed: {out:?}");
    let why = responses(&out, Peer::Parent)[0].errstr().unwrap_or_default();
    assert!(why.contains("matchtag 1: a route of 0 entries"), "{why}");
    assert_eq!(out.iter().filter(|e| matches!(e, Effect::Send(..))).count(), 1, "{out:?}");
}

/// Rank 0 of a nested instance (a batch job's) follows its job in the enclosing instance, and a broker whose
/// node the enclosing instance declared lost before it joined is not waited for: it is lost here too, and the
/// instance comes up (its initial program, the batch script, starts; it tells the enclosing instance where it
/// is) with the others. A rank declared lost again, or one that is not a rank of the instance, changes nothing
/// (issue 36).
#[test]
fn a_nested_rank_0_stops_waiting_for_a_broker_the_enclosing_instance_lost() {
    let mut b = super::testing::new_broker(0, 4, Topology::Kary(32), 4, Config::default(), Time::ZERO);
    b.opts.config.tolerate_lost = 1;
    b.opts.config.parent_uri = Some("local:///enclosing".into());
    b.opts.config.jobid = Some("f2x".into());
    b.opts.initial_program = Some(vec!["batch.sh".into()]);
    b.handle(t(0.0), Input::Start);
    let out = effects(&mut b);
    assert!(
        out.iter()
            .any(|e| matches!(e, Effect::WatchEnclosing { uri, id } if uri == "local:///enclosing" && id == "f2x")),
        "{out:?}"
    );
    join_and_register(&mut b, t(0.1), 1, 7);
    join_and_register(&mut b, t(0.1), 3, 9);
    assert!(!b.initial_started, "rank 2 has not joined");
    b.handle(t(0.4), Input::EnclosingLost { ranks: [2, 9].into_iter().collect(), why: "node3".into() });
    let out = effects(&mut b);
    let env = out.iter().find_map(|e| match e {
        Effect::StartInitial { env, .. } => Some(env.clone()),
        _ => None,
    });
    let want: Vec<(String, String)> =
        vec![("VIGIL_JOB_NNODES".into(), "3".into()), ("VIGIL_JOB_NODELIST".into(), "node[0-1,3]".into())];
    assert_eq!(env, Some(want), "started with the three that joined, and says so: {out:?}");
    assert!(out.iter().any(|e| matches!(e, Effect::ReportNested { .. })), "{out:?}");
    assert_eq!(b.members[&2].0, MemberState::Lost);
    assert!(b.members[&2].1.contains("node3"), "{:?}", b.members[&2]);
    assert!(!b.members.contains_key(&9));
    let pool = &b.jobcore.as_ref().unwrap().pool;
    assert_eq!(pool.ranks.keys().copied().collect::<Vec<_>>(), vec![0, 1, 3], "jobs go to the three others");
    b.handle(t(0.5), Input::EnclosingLost { ranks: [2].into_iter().collect(), why: "again".into() });
    assert!(effects(&mut b).is_empty(), "said once");
    assert!(b.members[&2].1.contains("node3"));

    // Without `broker.tolerate-lost` (`vigil batch --tolerate-lost`), a broker that never joined keeps the instance
    // from starting: the initial program does not run, and the enclosing instance is told which (issue 40).
    let mut b = super::testing::new_broker(0, 4, Topology::Kary(32), 4, Config::default(), Time::ZERO);
    b.opts.config.parent_uri = Some("local:///enclosing".into());
    b.opts.config.jobid = Some("f2x".into());
    b.opts.initial_program = Some(vec!["batch.sh".into()]);
    b.handle(t(0.0), Input::Start);
    effects(&mut b);
    join_and_register(&mut b, t(0.1), 1, 7);
    join_and_register(&mut b, t(0.1), 3, 9);
    b.handle(t(0.4), Input::EnclosingLost { ranks: [2].into_iter().collect(), why: "node2".into() });
    let out = effects(&mut b);
    assert!(!out.iter().any(|e| matches!(e, Effect::StartInitial { .. })), "{out:?}");
    let report = out.iter().find_map(|e| match e {
        Effect::ReportNested { report, .. } => Some(report.clone()),
        _ => None,
    });
    let report = report.expect("the enclosing instance is told");
    assert_eq!((report["never_joined"].clone(), report["tolerate_lost"].clone()), (json!("2"), json!(0)), "{report}");

    // An ordinary instance (no enclosing job) follows nothing.
    let mut b = super::testing::new_broker(0, 4, Topology::Kary(32), 4, Config::default(), Time::ZERO);
    b.handle(t(0.0), Input::Start);
    assert!(!effects(&mut b).iter().any(|e| matches!(e, Effect::WatchEnclosing { .. })));
}

/// A broker whose static parent cannot be had at start (a nested broker whose parent's node was lost while the
/// instance started, its endpoint left out of the launcher's exchange) re-parents as from a parent lost later:
/// it asks the parent's sibling to adopt it, holds its registration until adopted, then registers and tells
/// rank 0 where it is. With re-parenting off it exits, as before (issue 36).
#[test]
fn a_broker_whose_parent_was_lost_during_start_up_is_adopted() {
    let mut b = broker(3);
    b.handle(t(0.0), Input::FirstParentFailed("its node was lost during start-up (rank 1)".into()));
    let out = effects(&mut b);
    assert!(out.iter().any(|e| matches!(e, Effect::ConnectParent { rank: 2, lost: 1, .. })), "{out:?}");
    b.handle(t(0.0), Input::Start);
    let out = effects(&mut b);
    assert!(!out.iter().any(|e| matches!(e, Effect::Send(Peer::Parent, _))), "nothing goes up yet: {out:?}");
    b.handle(t(0.1), Input::ParentUp(super::links::LinkChoice { transport: "tcp", detail: String::new() }));
    let out = effects(&mut b);
    let up: Vec<&str> = out
        .iter()
        .filter_map(|e| match e {
            Effect::Send(Peer::Parent, m) => Some(m.topic.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(up[..2], ["overlay.reparent", "resource.register"], "{up:?}");
    let reg = out.iter().find_map(|e| match e {
        Effect::Send(Peer::Parent, m) if m.topic == "resource.register" => Some(m.json()),
        _ => None,
    });
    assert_eq!(reg.unwrap()["parent"], json!(2), "registered under its adopter, not its lost static parent");
    assert_eq!(b.parent, Some(2));
    assert!(b.shutting_down.is_none());

    let mut b = broker(3);
    b.opts.config.reparent = false;
    b.handle(t(0.0), Input::FirstParentFailed("its node was lost during start-up (rank 1)".into()));
    effects(&mut b);
    assert!(b.shutting_down.is_some() && b.exit_code != 0, "exits");
}

/// Rank 0's metrics snapshot: ranks by state (every state listed), its judge's peers and verdicts by rule, jobs
/// by state and submissions; a child lost by the probe rule counts as a lost rank and a `probe-misses` verdict.
#[test]
fn the_metrics_snapshot_counts_ranks_verdicts_and_jobs() {
    use crate::membership::Rule;
    let mut b = root_with_child();
    let m = b.metrics();
    assert!(m.not_ready.is_none(), "{:?}", m.not_ready);
    let inst = m.instance.as_ref().expect("rank 0 speaks for the instance");
    assert_eq!(inst.ranks, vec![("lost", 0), ("offline", 5), ("online", 2), ("torpid", 0)]);
    assert!(m.peers.contains(&(PeerState::Online, 1)), "{:?}", m.peers);
    assert_eq!(m.verdicts, vec![(PeerState::Online, Rule::Connected, 1)]);
    assert!(broker(1).metrics().instance.is_none(), "only rank 0 has instance figures");
    assert_eq!(broker(1).metrics().not_ready.as_deref(), Some("not joined: no parent link"));
    // A job: counted as submitted, and by its state.
    b.handle(t(0.01), Input::LocalNew { id: 5, uid: super::testing::UID });
    let spec: serde_json::Value =
        serde_json::from_str(&crate::jobspec::JobspecBuilder::new(["true"]).build().expect("jobspec").to_json())
            .expect("json");
    let mut req = Message::request("job-manager.submit", 0, &json!({"jobspec": spec}));
    req.matchtag = 1;
    b.handle(t(0.02), Input::Message(Peer::Local(5), 0, req));
    effects(&mut b);
    let inst = b.metrics().instance.expect("instance");
    assert_eq!(inst.submits, 1);
    assert_eq!(inst.jobs.iter().map(|j| j.1).sum::<u64>(), 1, "{:?}", inst.jobs);
    assert_eq!(inst.jobs.len(), 7, "every RFC 21 state listed: {:?}", inst.jobs);
    // Rank 1's node stops answering probes: lost, by the probe rule.
    let c = *b.membership.config();
    b.handle(t(0.1), Input::Probe(1, Signal::ProbeReply { kernel: true, alive: true, hb_age: 0.0 }));
    b.handle(t(0.2), Input::Probe(1, Signal::ProbeMissed { misses: c.probe_misses }));
    effects(&mut b);
    let m = b.metrics();
    assert!(m.instance.expect("instance").ranks.contains(&("lost", 1)));
    assert!(m.verdicts.contains(&(PeerState::Lost, Rule::ProbeMisses, 1)), "{:?}", m.verdicts);
}

/// Rank 0's metrics snapshot: the instance's overlay links by transport (ranks up only, every transport listed),
/// its full scheduling passes, and the jobs that ended by result; a child's own parent link.
#[test]
fn the_metrics_snapshot_counts_links_passes_and_ended_jobs() {
    let mut b = root_with_child();
    b.handle(t(0.01), Input::LocalNew { id: 5, uid: super::testing::UID });
    b.links.on_report(&json!({"rank": 1, "transport": "rdma", "detail": "rxe0"})).expect("a report");
    // Rank 3 never joined: its (stale or early) report does not make it a link.
    b.links.on_report(&json!({"rank": 3, "transport": "tcp", "detail": "no verbs devices"})).expect("a report");
    let m = b.metrics();
    assert_eq!(m.parent_link, None, "rank 0 has no parent");
    let inst = m.instance.expect("instance");
    assert_eq!(inst.links, vec![("ofi", 0), ("rdma", 1), ("tcp", 0)]);
    assert_eq!((inst.passes, inst.ended.iter().map(|e| e.1).sum::<u64>()), (0, 0));
    assert_eq!(inst.ended.len(), 4, "every result listed: {:?}", inst.ended);
    // Nothing can start while every rank is drained: two jobs wait; cancelling one ends it as CANCELED.
    assert!(ask1(&mut b, "resource.drain", json!({"ranks": "0-1", "reason": "test"})).is_ok());
    let spec: serde_json::Value =
        serde_json::from_str(&crate::jobspec::JobspecBuilder::new(["true"]).build().expect("jobspec").to_json())
            .expect("json");
    let mut ids = Vec::new();
    for _ in 0..2 {
        let r = ask1(&mut b, "job-manager.submit", json!({"jobspec": spec})).expect("submitted");
        ids.push(r["id"].as_u64().expect("an id"));
    }
    assert!(ask1(&mut b, "job-manager.cancel", json!({"id": ids[0]})).is_ok());
    let inst = b.metrics().instance.expect("instance");
    assert!(inst.ended.contains(&("CANCELED", 1)) && inst.ended.contains(&("COMPLETED", 0)), "{:?}", inst.ended);
    let before = inst.passes;
    // Resources come back: a full pass over the queue (the other job) runs.
    assert!(ask1(&mut b, "resource.undrain", json!({"ranks": "0-1"})).is_ok());
    assert!(b.metrics().instance.expect("instance").passes > before);
    // A child reports the transport of its parent link once it is up, and none before.
    let mut c = broker(1);
    assert_eq!(c.metrics().parent_link, None);
    c.handle(t(0.0), Input::ParentUp(super::links::LinkChoice { transport: "ofi", detail: "cxi".into() }));
    assert_eq!(c.metrics().parent_link, Some("ofi"));
}

/// Unkillable tasks on a shell's node (`unkillable.rs`), in virtual time: the exit report of a shell whose cgroup
/// still holds processes after `cgroup.kill` is held (the job keeps its resources) and goes when the cgroup
/// empties; one whose cgroup never empties goes `exec.kill-timeout` after the shell's end, naming the pids left.
#[test]
fn a_shell_exit_report_waits_for_its_cgroup_to_empty_up_to_the_kill_timeout() {
    use crate::shellproto::TOPIC_SHELL_EXIT;
    let mut b = graced(3);
    b.opts.config.kill_timeout = 2.0;
    let done = |b: &mut Broker, now: Time, id: u64, lingering: Vec<u32>| {
        b.handle(now, Input::ShellDone { id: crate::jobs::JobId(id), report: None, status: 9, lingering });
        effects(b)
    };
    // Job 5's cgroup empties half a second after its shell's end: the report goes then, as it is.
    assert!(sent_up(&done(&mut b, t(1.0), 5, vec![100]), TOPIC_SHELL_EXIT).is_empty());
    assert_eq!(b.attached_jobs(), vec![5], "a held report keeps its job attached");
    b.handle(t(1.5), Input::CgroupEmptied(crate::jobs::JobId(5)));
    let out = effects(&mut b);
    let sent = sent_up(&out, TOPIC_SHELL_EXIT);
    assert_eq!(sent.len(), 1, "{out:?}");
    assert_eq!((sent[0].json()["id"].clone(), sent[0].json().get("unkillable").cloned()), (json!(5), None));
    // Job 6's never does: nothing until 2 s after its shell's end, then the report with the pids left.
    assert!(sent_up(&done(&mut b, t(2.0), 6, vec![200, 201]), TOPIC_SHELL_EXIT).is_empty());
    assert!(sent_up(&run_to(&mut b, t(3.999)), TOPIC_SHELL_EXIT).is_empty());
    let out = run_to(&mut b, t(4.0));
    let sent = sent_up(&out, TOPIC_SHELL_EXIT);
    assert_eq!(sent.len(), 1, "{out:?}");
    assert_eq!((sent[0].json()["id"].clone(), sent[0].json()["unkillable"].clone()), (json!(6), json!([200, 201])));
    // Its cgroup empties at last: nothing more goes up. A shell whose cgroup emptied at once reports at once.
    b.handle(t(9.0), Input::CgroupEmptied(crate::jobs::JobId(6)));
    assert!(sent_up(&effects(&mut b), TOPIC_SHELL_EXIT).is_empty());
    assert_eq!(sent_up(&done(&mut b, t(10.0), 7, vec![]), TOPIC_SHELL_EXIT).len(), 1);
}
