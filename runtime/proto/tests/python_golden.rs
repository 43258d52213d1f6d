//! Golden frames for the Python client's codec (`python/vigil/_wire.py`): the frames this crate's codec makes,
//! and malformed frames with the check each one fails, written to `python/tests/golden/frames.json`, which the
//! Python tests decode and encode again (`python/tests/test_wire.py`). This test fails when the Rust codec and
//! the committed file disagree; `VIGIL_BLESS=1 cargo test -p vigil-proto --test python_golden` rewrites the file
//! after a deliberate change of the wire format (then the Python codec must follow).

use serde_json::{json, Value};
use vigil_proto::message::{errno, Message, FLAG_STREAMING, NODEID_ANY, ROUTE_LOCAL};

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A message's fields as the fixture states them (the payload as hex: it is bytes on the wire).
fn fields(m: &Message) -> Value {
    json!({
        "msgtype": m.msgtype as u8, "flags": m.flags, "topic": m.topic, "matchtag": m.matchtag,
        "nodeid": m.nodeid, "userid": m.userid, "errnum": m.errnum, "seq": m.seq, "route": m.route,
        "payload": hex(&m.payload),
    })
}

fn good() -> Vec<(&'static str, Message)> {
    let mut submit = Message::request(
        "job-manager.submit",
        0,
        &json!({"jobspec": {"version": 1, "tasks": [{"command": ["true"]}]}, "stdin": false, "submit_key": "00ff"}),
    );
    submit.matchtag = 7;
    let mut follow = Message::request("job-manager.eventlog", NODEID_ANY, &json!({"id": 1u64 << 40, "follow": true}));
    follow.matchtag = u32::MAX;
    follow.flags = FLAG_STREAMING;
    let mut answered = submit.clone();
    answered.route = vec![ROUTE_LOCAL | 3, 1, 2];
    answered.userid = 1000;
    let reply = Message::response_to(&answered, &json!({"id": 12_345_678u64}));
    let ended = Message::error_to(&follow, errno::ENODATA, "");
    let refused = Message::error_to(&answered, errno::ENOSPC, "the job asks for 9 nodes; the instance has 4");
    let mut ev = Message::event("job-state.finish", &json!({"id": 3, "status": 256}));
    ev.seq = 42;
    let welcome = Message::control("welcome", &json!({"rank": 0, "size": 4, "instance": "ï", "uid": 0}));
    let utf8 = Message::request("résumé.ünï", 5, &json!(null));
    let mut empty = Message::request("broker.ping", 0, &json!({}));
    empty.payload.clear();
    vec![
        ("submit request", submit),
        ("streaming request", follow),
        ("response with a route stack", reply),
        ("end of stream", ended),
        ("error response", refused),
        ("event", ev),
        ("control", welcome),
        ("utf-8 topic", utf8),
        ("empty payload", empty),
    ]
}

/// Malformed frames (length prefix included) and the `DecodeError` variant each one must give.
fn bad() -> Vec<(&'static str, Vec<u8>)> {
    let frame = Message::request("t", 0, &json!({})).encode();
    let with = |at: usize, v: u8| {
        let mut f = frame.clone();
        f[at] = v;
        f
    };
    // A header that promises a topic of 1 byte, in a frame that ends at the header.
    let mut cut = frame.clone();
    cut.truncate(4 + 28);
    let n = u32::try_from(cut.len() - 4).unwrap();
    cut[..4].copy_from_slice(&n.to_be_bytes());
    let mut bad_utf8 = frame.clone();
    bad_utf8[4 + 28] = 0xff;
    vec![
        ("BadMagic", with(4, b'X')),
        ("Version", with(6, 2)),
        ("BadType", with(7, 9)),
        ("RouteTooDeep", with(9, 65)),
        ("Truncated", cut),
        ("BadTopic", bad_utf8),
        ("TooLarge", vec![0xff, 0xff, 0xff, 0xff, b'V', b'G', 1, 1]),
    ]
}

fn fixture() -> String {
    let good: Vec<Value> = good()
        .into_iter()
        .map(|(name, m)| json!({"name": name, "frame": hex(&m.encode()), "message": fields(&m)}))
        .collect();
    let bad: Vec<Value> = bad()
        .into_iter()
        .map(|(kind, f)| {
            let e = Message::decode_frame(&f).expect_err(kind);
            assert!(format!("{e:?}").starts_with(kind), "{kind}: the Rust decoder said {e:?}");
            json!({"error": kind, "frame": hex(&f)})
        })
        .collect();
    let about = "written by runtime/proto/tests/python_golden.rs (VIGIL_BLESS=1 rewrites it); read by python/tests/test_wire.py";
    let mut s = serde_json::to_string_pretty(&json!({"about": about, "good": good, "bad": bad})).unwrap();
    s.push('\n');
    s
}

#[test]
fn golden_frames_for_the_python_codec_match_this_codec() {
    for (name, m) in good() {
        assert_eq!(Message::decode_frame(&m.encode()).as_ref(), Ok(&m), "{name}");
    }
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../python/tests/golden/frames.json");
    let want = fixture();
    if std::env::var_os("VIGIL_BLESS").is_some() {
        std::fs::write(&path, &want).unwrap();
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "{} differs from the frames the Rust codec makes: if the wire format changed on purpose, rewrite it with \
         VIGIL_BLESS=1 and make python/vigil/_wire.py follow",
        path.display()
    );
}
