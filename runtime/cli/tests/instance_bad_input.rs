//! Bad input to every service (issue 14): each topic a broker offers gets payloads that are not JSON, JSON of
//! the wrong type, objects whose fields have the wrong type, `rexec.spawn` inputs that are not a shell input,
//! and ranks and idsets far outside the instance. Every request is answered with an error (not silence, not a
//! broker that panicked), nothing it asked for happens, and the instance then runs a job on every rank.

mod common;

use common::*;
use serde_json::{json, Value};
use std::os::unix::net::UnixStream;
use std::time::Duration;

const EPROTO: u32 = 71;

/// How long a broker may take to answer one request before the test calls it silence.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// A raw connection to rank 0's local socket: frames are written by hand, so a payload can be anything.
struct Raw {
    s: UnixStream,
    tag: u32,
}

impl Raw {
    fn connect(inst: &Instance) -> Raw {
        let mut s = UnixStream::connect(inst.socket_path()).expect("connect local socket");
        s.set_read_timeout(Some(ANSWER_TIMEOUT)).expect("timeout");
        let w = read_frame(&mut s).expect("welcome").expect("welcome frame");
        assert_eq!((w.msgtype, w.topic.as_str()), (T_CONTROL, "welcome"), "{w:?}");
        Raw { s, tag: 100 }
    }

    /// Send a request with this raw payload to `rank` and return its response.
    #[track_caller]
    fn ask(&mut self, topic: &str, rank: u32, payload: &[u8]) -> Frame {
        self.tag += 1;
        let tag = self.tag;
        send_all(&mut self.s, &encode_frame(1, T_REQUEST, 0, topic, tag, rank, &[], payload));
        loop {
            let what = format!("{topic} on rank {rank} with payload {:?}", String::from_utf8_lossy(payload));
            let f = match read_frame(&mut self.s) {
                Ok(Some(f)) => f,
                Ok(None) => panic!("the broker closed the connection after {what}"),
                Err(e) => panic!("no answer to {what} within {ANSWER_TIMEOUT:?} ({e}): silence, or a broker died"),
            };
            if f.msgtype == T_RESPONSE && f.matchtag == tag {
                return f;
            }
        }
    }

    /// The request must be refused; with `want` the errno too.
    #[track_caller]
    fn refused(&mut self, topic: &str, rank: u32, payload: &[u8], want: Option<u32>) {
        let f = self.ask(topic, rank, payload);
        let what = format!("{topic} on rank {rank} with {:?}", String::from_utf8_lossy(payload));
        assert_ne!(f.errnum, 0, "{what} was accepted: {f:?}");
        if let Some(e) = want {
            assert_eq!(f.errnum, e, "{what}: {f:?}");
        }
    }
}

/// Payloads that are no request of any service: not JSON, empty, and JSON that is not an object.
const NOT_AN_OBJECT: &[&[u8]] =
    &[b"\xff\xfe not json", b"{\"unterminated\": ", b"", b"null", b"[1, 2, 3]", b"42", b"-1.5e300", b"\"id\"", b"true"];

/// Services of every rank that read a payload (`broker.ping`, `broker.lsattr` and `broker.info` read none).
const EVERY_RANK_TOPICS: &[&str] = &[
    "broker.getattr",
    "broker.rtt",
    "broker.sub",
    "broker.unsub",
    "broker.pub",
    "broker.shutdown",
    "detect.watch",
    "rexec.spawn",
    "rexec.kill",
    "rexec.notify",
];

/// Services of rank 0.
const RANK0_TOPICS: &[&str] = &[
    "resource.register",
    "resource.status",
    "resource.list",
    "resource.drain",
    "resource.undrain",
    "resource.eventlog",
    "resource.R",
    "overlay.torpid",
    "overlay.lively",
    "overlay.lost",
    "overlay.offline",
    "overlay.status",
    "overlay.transport",
    "job-manager.submit",
    "job-manager.list",
    "job-manager.info",
    "job-manager.cancel",
    "job-manager.raise",
    "job-manager.eventlog",
    "job-info.attach",
    "job-info.stdin",
    "job-info.disconnect",
    "job-exec.stdin",
    "job-exec.output",
    "job-exec.task-exit",
    "job-exec.exception",
    "job-exec.nested",
    "job-exec.pmi-barrier",
    "job-exec.shell-exit",
];

/// A shell input as the job core writes one, for job `id` (never sent as is: each case breaks it).
fn shell_input(id: u64) -> Value {
    json!({"id": id, "id_f58": "f1", "shell_rank": 0, "broker_rank": 1, "nshells": 1, "ntasks": 1,
        "first_task": 0, "local_tasks": 1, "cores": [0], "gpus": [], "cores_per_task": 1, "gpus_per_task": 0,
        "command": ["true"], "environment": {}, "cwd": null, "options": {}, "taskmap": {}, "r": {},
        "topology": "live", "declared_gpus": null, "uri": ""})
}

/// Objects with fields of the wrong type or out of range, per topic: each must be refused before it changes
/// anything (no job submitted, rank drained, lost or re-registered, shell started or signalled, shutdown).
fn wrong_fields(job: u64) -> Vec<(&'static str, Value)> {
    let mut spawn = Vec::new();
    for input in [json!("x"), json!([1]), json!(5), json!(true), json!(null), json!({})] {
        spawn.push(json!({"id": 1, "input": input}));
    }
    for (k, x) in [
        ("id", json!(2)),
        ("first_task", json!(u32::MAX)),
        ("local_tasks", json!(2)),
        ("shell_rank", json!(1)),
        ("ntasks", json!(-1)),
        ("cores", json!("0-3")),
    ] {
        let mut i = shell_input(1);
        i[k] = x;
        spawn.push(json!({"id": 1, "input": i}));
    }
    let res = json!({"cores": 2, "pus": 2, "numa": 1, "packages": 1, "gpus": 0, "gpu_names": [], "source": "live"});
    let huge_res = json!({"cores": u32::MAX, "pus": 2, "numa": 1, "packages": 1, "gpus": 0, "gpu_names": [],
        "source": "live"});
    let slots = |n: u64| {
        json!({"version": 1, "resources": [{"type": "node", "count": 1, "with": [
            {"type": "slot", "count": n, "label": "task", "with": [{"type": "core", "count": 2}]}]}],
            "tasks": [{"command": ["true"], "slot": "task", "count": {"per_slot": 1}}],
            "attributes": {"system": {"duration": 0}}})
    };
    let mut cases: Vec<(&'static str, Value)> = spawn.into_iter().map(|p| ("rexec.spawn", p)).collect();
    cases.extend([
        ("rexec.spawn", json!({"id": "not-an-id", "input": shell_input(1)})),
        ("rexec.kill", json!({"id": 1, "signal": "KILL"})),
        ("rexec.kill", json!({"id": 1, "signal": 4_294_967_305u64})),
        ("rexec.kill", json!({"id": 1, "signal": 0})),
        ("rexec.kill", json!({"id": 1, "signal": 100_000})),
        ("rexec.kill", json!({"id": 1})),
        ("rexec.notify", json!({"id": [1]})),
        ("rexec.notify", json!({"id": -1})),
        ("broker.getattr", json!({"name": 5})),
        ("broker.getattr", json!({"name": null})),
        ("broker.rtt", json!({"rank": "1"})),
        ("broker.rtt", json!({"rank": 1, "count": "many"})),
        ("broker.rtt", json!({"rank": 1, "window": -1})),
        ("broker.rtt", json!({"rank": 4_294_967_297u64})),
        ("broker.rtt", json!({"rank": 1, "count": u64::MAX})),
        ("broker.sub", json!({"topic": 5})),
        ("broker.unsub", json!({"topic": ["a"]})),
        ("broker.pub", json!({"topic": 5})),
        ("broker.pub", json!({"topic": ""})),
        ("broker.shutdown", json!({"exit_code": "0"})),
        ("broker.shutdown", json!({"exit_code": 4_294_967_296u64})),
        ("broker.shutdown", json!({"exit_code": [0]})),
        ("detect.watch", json!({"pid": "1"})),
        ("detect.watch", json!({"pid": 4_294_967_297u64})),
        ("resource.register", json!({"rank": 4_294_967_296u64, "resources": res})),
        ("resource.register", json!({"rank": "1", "resources": res})),
        ("resource.register", json!({"rank": 99, "resources": res})),
        ("resource.register", json!({"rank": 1, "resources": "lots"})),
        ("resource.register", json!({"rank": 1, "resources": huge_res})),
        ("resource.register", json!({"rank": 1, "resources": res, "cores": 5})),
        ("resource.register", json!({"rank": 1, "resources": res, "cores": "0-4294967295"})),
        ("resource.register", json!({"rank": 1, "resources": res, "hostname": ["x"]})),
        ("resource.register", json!({"rank": 1, "resources": res, "declared_gpus": -1})),
        ("resource.drain", json!({"ranks": 1})),
        ("resource.drain", json!({"ranks": "0-4294967295"})),
        ("resource.drain", json!({"ranks": "4294967295"})),
        ("resource.drain", json!({"ranks": "1", "reason": 5})),
        // RFC 22: ids unique and ascending.
        ("resource.drain", json!({"ranks": "2,1"})),
        ("resource.drain", json!({"ranks": "1,1"})),
        ("resource.undrain", json!({"ranks": "1-2,2"})),
        ("resource.undrain", json!({"ranks": ["1"]})),
        ("overlay.transport", json!({"rank": 4_294_967_297u64, "transport": "tcp"})),
        ("overlay.transport", json!({"rank": 99, "transport": "tcp"})),
        ("overlay.transport", json!({"rank": 1, "transport": 5})),
        ("job-manager.submit", json!({"jobspec": 5})),
        ("job-manager.submit", json!({"jobspec": slots(1 << 31)})),
        ("job-manager.submit", json!({"jobspec": slots(u64::MAX)})),
        ("job-manager.submit", json!({"jobspec": slots(1), "stdin": "yes"})),
        ("job-manager.list", json!({"all": "yes"})),
        ("job-manager.info", json!({"id": [job]})),
        ("job-manager.info", json!({"id": "no-such-id"})),
        ("job-manager.cancel", json!({"id": job, "note": 5})),
        ("job-manager.raise", json!({"id": job, "severity": 8})),
        ("job-manager.raise", json!({"id": job, "severity": "0"})),
        ("job-manager.raise", json!({"id": job, "type": 5})),
        ("job-manager.eventlog", json!({"id": job, "follow": "yes"})),
        ("job-info.attach", json!({"id": job, "output": 1})),
        ("job-info.stdin", json!({"id": {}})),
        ("job-exec.stdin", json!({"id": job, "data": 5})),
        ("job-exec.stdin", json!({"id": job, "eof": "yes"})),
        ("job-exec.output", json!({"id": job})),
        ("job-exec.output", json!({"id": job, "lines": "x"})),
        ("job-exec.output", json!({"id": job, "lines": [{"rank": -1}]})),
        ("job-exec.task-exit", json!({"id": job, "rank": -1})),
        ("job-exec.task-exit", json!({"id": job, "status": 4_294_967_296u64})),
        ("job-exec.exception", json!({"id": job, "severity": 99})),
        ("job-exec.exception", json!({"id": job, "rank": 4_294_967_296u64})),
        ("job-exec.exception", json!({"id": job, "type": ["exec"]})),
        ("job-exec.nested", json!({"id": job, "uri": 5})),
        ("job-exec.nested", json!({"id": job})),
        ("job-exec.nested", json!({"id": job, "uri": "local:///x", "critical_ranks": "0-4294967295"})),
        ("job-exec.nested", json!({"id": job, "uri": "local:///x", "size": -1})),
        ("job-exec.pmi-barrier", json!({"id": job, "kvs": "k=v"})),
        ("job-exec.pmi-barrier", json!({"id": job, "kvs": {"k": 5}})),
        ("job-exec.pmi-barrier", json!({"id": job, "kvs": {"k": "a b"}})),
        ("job-exec.shell-exit", json!({"id": job})),
        ("job-exec.shell-exit", json!({"id": job, "rank": 4_294_967_296u64, "shell_status": 0})),
    ]);
    for t in ["overlay.torpid", "overlay.lively", "overlay.lost", "overlay.offline"] {
        for ranks in [json!(1), json!("x"), json!("99"), json!("4294967295"), json!("0-4294967295")] {
            cases.push((t, json!({"ranks": ranks})));
        }
        cases.push((t, json!({"ranks": "1", "reason": 5})));
    }
    cases.push(("overlay.lost", json!({"ranks": "1", "root": "1"})));
    cases
}

#[test]
fn every_service_refuses_malformed_payloads_and_the_broker_lives_on() {
    let inst = Instance::start(4, &["tbon.topo=kary:2"]);
    // An inactive job, so that requests about a job name a real one.
    let o = inst.vigil(&["submit", "true"]);
    o.ok();
    let job_f58 = o.stdout.trim().to_string();
    assert!(inst.wait_state(&job_f58, "INACTIVE", Duration::from_secs(20)), "job {job_f58} did not finish");
    let job = inst.job(&job_f58)["id"].as_u64().expect("numeric job id");
    let events_before = inst.job_info(&job_f58);

    let mut c = Raw::connect(&inst);
    // A shell input that is not an object was indexed into (`input["uri"] = ...`): the panic took the broker
    // down. First, on rank 1 (a leaf's parent, reached through the overlay) and on rank 0.
    for rank in [1, 0] {
        for input in ["\"x\"", "[]", "7"] {
            let p = format!("{{\"id\": 1, \"input\": {input}}}");
            c.refused("rexec.spawn", rank, p.as_bytes(), Some(EPROTO));
        }
    }
    for (topic, ranks) in
        EVERY_RANK_TOPICS.iter().map(|t| (*t, &[0u32, 1, 3][..])).chain(RANK0_TOPICS.iter().map(|t| (*t, &[0u32][..])))
    {
        for &rank in ranks {
            for p in NOT_AN_OBJECT {
                c.refused(topic, rank, p, Some(EPROTO));
            }
        }
    }
    for (topic, p) in wrong_fields(job) {
        let ranks: &[u32] = if RANK0_TOPICS.contains(&topic) { &[0] } else { &[0, 1] };
        for &rank in ranks {
            c.refused(topic, rank, p.to_string().as_bytes(), None);
        }
    }
    // A rank far outside the instance as the destination.
    c.refused("broker.ping", 4_294_967_290, b"{}", Some(113));
    // Still answering on the same connection, on every rank.
    for rank in 0..4 {
        let f = c.ask("broker.ping", rank, b"{}");
        assert_eq!((f.errnum, f.payload["rank"].as_u64()), (0, Some(u64::from(rank))), "{f:?}");
    }
    drop(c);

    // Nothing the refused requests asked for happened.
    let n = inst.size.to_string();
    inst.vigil(&["run", "-N", &n, "-n", &n, "true"]).ok();
    let v = inst.vigil(&["overlay", "status", "--json"]).json();
    let ranks = v["ranks"].as_array().expect("ranks");
    assert_eq!(ranks.len(), inst.size as usize, "{v}");
    assert!(ranks.iter().all(|r| r["state"] == "online"), "{v}");
    let v = inst.vigil(&["resource", "status", "--json"]).json();
    assert!(v["ranks"].as_array().expect("ranks").iter().all(|r| r["state"] == "avail"), "{v}");
    let v = inst.vigil(&["resource", "list", "--json"]).json();
    let cores: Vec<u64> = v["ranks"].as_array().expect("ranks").iter().filter_map(|r| r["ncores"].as_u64()).collect();
    assert_eq!(cores.len(), inst.size as usize, "{v}");
    assert!(cores.iter().all(|c| *c == cores[0] && *c < 1 << 20), "a rank was re-registered: {v}");
    let jobs = inst.jobs();
    assert_eq!(jobs.len(), 2, "only the two real jobs exist: {jobs:?}");
    assert_eq!(inst.job_info(&job_f58), events_before, "the inactive job was changed");
    let (o, left) = inst.stop_with(0);
    o.code_is(0);
    assert!(!o.stderr.contains("panicked"), "{}", o.dump());
    assert!(left.is_empty(), "{left:?}");
}

/// A PMI barrier ends when every shell of the job has arrived, counted by shell rank: a shell (or anyone on
/// the socket) asking twice, or naming a shell the job does not have, is refused and cannot end it early.
#[test]
fn a_pmi_barrier_counts_shells_not_requests() {
    let inst = Instance::start(2, &[]);
    let o = inst.vigil(&["submit", "-N2", "-n2", "sleep", "30"]);
    o.ok();
    let f58 = o.stdout.trim().to_string();
    assert!(inst.wait_state(&f58, "RUN", Duration::from_secs(20)), "job {f58} did not start");
    let job = inst.job(&f58)["id"].as_u64().expect("numeric job id");
    let mut c = Raw::connect(&inst);
    let first = json!({"id": job, "shell_rank": 0, "kvs": {"a": "1"}}).to_string();
    send_all(&mut c.s, &encode_frame(1, T_REQUEST, 0, "job-exec.pmi-barrier", 7, 0, &[], first.as_bytes()));
    let again = json!({"id": job, "shell_rank": 0, "kvs": {"x": "2"}}).to_string();
    c.refused("job-exec.pmi-barrier", 0, again.as_bytes(), Some(22));
    let outside = json!({"id": job, "shell_rank": 2}).to_string();
    c.refused("job-exec.pmi-barrier", 0, outside.as_bytes(), Some(22));
    c.refused("job-exec.pmi-barrier", 0, json!({"id": job}).to_string().as_bytes(), Some(EPROTO));
    // The second shell ends it: both get the union of the two shells' puts, not the refused ones'.
    let second = json!({"id": job, "shell_rank": 1, "kvs": {"b": "2"}}).to_string();
    send_all(&mut c.s, &encode_frame(1, T_REQUEST, 0, "job-exec.pmi-barrier", 8, 0, &[], second.as_bytes()));
    let mut answered = Vec::new();
    while answered.len() < 2 {
        let f = read_frame(&mut c.s).expect("both shells answered").expect("a frame");
        if f.msgtype == T_RESPONSE && (f.matchtag == 7 || f.matchtag == 8) {
            assert_eq!((f.errnum, &f.payload["kvs"]), (0, &json!({"a": "1", "b": "2"})), "{f:?}");
            answered.push(f.matchtag);
        }
    }
    answered.sort_unstable();
    assert_eq!(answered, vec![7, 8]);
    inst.vigil(&["cancel", &f58]).ok();
}
