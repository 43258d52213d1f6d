//! Robustness: foreign users on the local socket, garbage on the overlay and local sockets. After each abuse
//! the instance must still run a job on every rank.

mod common;

use common::*;
use std::io::Write;
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::time::Duration;

const NOBODY: u32 = 65534;

/// The instance still works: a task on every rank, and every rank online.
#[track_caller]
fn assert_healthy(inst: &Instance) {
    let n = inst.size.to_string();
    let o = inst.vigil(&["run", "-N", &n, "-n", &n, "true"]);
    o.ok();
    let v = inst.vigil(&["overlay", "status", "--json"]).json();
    let ranks = v["ranks"].as_array().expect("ranks");
    assert_eq!(ranks.len(), inst.size as usize);
    assert!(ranks.iter().all(|r| r["state"] == "online"), "{v}");
}

#[test]
fn foreign_uid_is_refused() {
    let inst = Instance::start(2, &[]);
    let id = inst.submit(&["true"]);
    for args in [vec!["jobs"], vec!["run", "true"], vec!["cancel", id.as_str()], vec!["resource", "drain", "1", "x"]] {
        let mut c = inst.cmd();
        c.args(&args).uid(NOBODY).gid(NOBODY);
        let o = run(c, CMD_TIMEOUT, None);
        assert!(!o.timed_out && o.code != 0, "uid {NOBODY} was let in:\n{}", o.dump());
        let e = o.stderr.to_lowercase();
        assert!(e.contains("permission denied") && e.contains("not the owner"), "unclear refusal:\n{}", o.dump());
        assert_eq!(o.stderr.lines().count(), 1, "{}", o.dump());
        assert!(o.stdout.is_empty(), "{}", o.dump());
    }
    // Nothing changed, and the owner still gets in.
    inst.vigil(&["jobs"]).ok();
    assert_eq!(inst.jobs().len(), 1, "the foreign run created a job");
    let v = inst.vigil(&["resource", "status", "--json"]).json();
    assert!(v["ranks"].as_array().unwrap().iter().all(|r| r["state"] == "avail"), "{v}");
    assert_healthy(&inst);
}

fn overlay_endpoint(inst: &Instance) -> String {
    let o = inst.vigil(&["getattr", "tbon.endpoint"]);
    o.ok();
    let ep = o.stdout.trim().to_string();
    let addr = ep.strip_prefix("tcp://").unwrap_or_else(|| panic!("endpoint {ep:?}")).to_string();
    assert!(addr.starts_with("127.0.0.1:"), "{addr}");
    addr
}

fn connect_overlay(addr: &str) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    s
}

fn instance_id(inst: &Instance) -> String {
    let o = inst.vigil(&["getattr", "instance-id"]);
    o.ok();
    o.stdout.trim().to_string()
}

#[test]
fn overlay_random_bytes() {
    let inst = Instance::start(4, &["tbon.topo=kary:2"]);
    let addr = overlay_endpoint(&inst);
    for seed in [1u64, 7, 0xdead_beef] {
        let mut s = connect_overlay(&addr);
        send_all(&mut s, &junk(512, seed));
        assert!(
            peer_closes(&mut s, Duration::from_secs(8)),
            "broker kept a connection that sent garbage (seed {seed})"
        );
    }
    // HTTP on the overlay port.
    let mut s = connect_overlay(&addr);
    send_all(&mut s, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(peer_closes(&mut s, Duration::from_secs(8)));
    assert_healthy(&inst);
}

#[test]
fn overlay_huge_length_prefix() {
    let inst = Instance::start(4, &["tbon.topo=kary:2"]);
    let addr = overlay_endpoint(&inst);
    for len in [u32::MAX, (64 << 20) + 1] {
        let mut s = connect_overlay(&addr);
        let mut f = len.to_be_bytes().to_vec();
        f.extend_from_slice(b"VG\x01\x04");
        send_all(&mut s, &f);
        assert!(peer_closes(&mut s, Duration::from_secs(8)), "length {len} not refused");
    }
    // A length below the header size.
    let mut s = connect_overlay(&addr);
    send_all(&mut s, &[0, 0, 0, 3, b'V', b'G', 1]);
    assert!(peer_closes(&mut s, Duration::from_secs(8)));
    assert_healthy(&inst);
}

#[test]
fn overlay_wrong_wire_version() {
    let inst = Instance::start(4, &["tbon.topo=kary:2"]);
    let addr = overlay_endpoint(&inst);
    let iid = instance_id(&inst);
    let hello = serde_json::json!({"rank": 1, "instance": iid, "version": 2, "hostname": "x"}).to_string();
    let mut s = connect_overlay(&addr);
    send_all(&mut s, &encode_frame(2, T_CONTROL, 0, "hello", 0, u32::MAX, &[], hello.as_bytes()));
    assert!(peer_closes(&mut s, Duration::from_secs(8)), "version-2 frame not refused");
    // Also an unknown message type with the right version.
    let mut s = connect_overlay(&addr);
    send_all(&mut s, &encode_frame(1, 9, 0, "hello", 0, u32::MAX, &[], hello.as_bytes()));
    assert!(peer_closes(&mut s, Duration::from_secs(8)), "type-9 frame not refused");
    // The real rank 1 was not displaced by any of this.
    assert_healthy(&inst);
}

#[test]
fn overlay_truncated_frames() {
    let inst = Instance::start(4, &["tbon.topo=kary:2"]);
    let addr = overlay_endpoint(&inst);
    let iid = instance_id(&inst);
    let hello = serde_json::json!({"rank": 3, "instance": iid, "version": 1, "hostname": "x"}).to_string();
    let full = encode_frame(1, T_CONTROL, 0, "hello", 0, u32::MAX, &[], hello.as_bytes());
    for cut in [1, 3, 4, 6, 20, full.len() - 1] {
        let mut s = connect_overlay(&addr);
        send_all(&mut s, &full[..cut]);
        drop(s);
    }
    // Half a frame and then silence: the broker does not wait forever for the rest of a hello.
    let mut s = connect_overlay(&addr);
    send_all(&mut s, &full[..full.len() / 2]);
    assert_healthy(&inst);
    drop(s);
    // A first message that is not a hello.
    let mut s = connect_overlay(&addr);
    let req = encode_frame(1, T_REQUEST, 0, "broker.ping", 1, 0, &[], b"{}");
    send_all(&mut s, &req);
    assert!(peer_closes(&mut s, Duration::from_secs(8)), "a request before hello was accepted");
    assert_healthy(&inst);
}

fn connect_local(inst: &Instance) -> UnixStream {
    let mut s = UnixStream::connect(inst.socket_path()).expect("connect local socket");
    s.set_read_timeout(Some(Duration::from_secs(8))).unwrap();
    let w = read_frame(&mut s).expect("welcome").expect("welcome frame");
    assert_eq!((w.msgtype, w.topic.as_str()), (T_CONTROL, "welcome"), "{w:?}");
    assert_eq!(w.payload["size"].as_u64(), Some(inst.size as u64), "{w:?}");
    s.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    s
}

#[test]
fn local_socket_garbage() {
    let inst = Instance::start(4, &["tbon.topo=kary:2"]);
    // Random bytes, huge length, wrong version: the broker drops that client only.
    for (i, bad) in [
        junk(300, 42),
        vec![0xff, 0xff, 0xff, 0xff, b'V', b'G', 1, 1],
        encode_frame(2, T_REQUEST, 0, "broker.ping", 1, 0, &[], b"{}"),
    ]
    .iter()
    .enumerate()
    {
        let mut s = connect_local(&inst);
        send_all(&mut s, bad);
        assert!(peer_closes(&mut s, Duration::from_secs(8)), "case {i}: client not dropped");
    }
    // Truncated frames, then close.
    let full = encode_frame(1, T_REQUEST, 0, "job-manager.list", 1, 0, &[], b"{\"all\": true}");
    for cut in [2, 5, 30, full.len() - 1] {
        let mut s = connect_local(&inst);
        send_all(&mut s, &full[..cut]);
    }
    // Connect and vanish without reading the welcome.
    for _ in 0..5 {
        drop(UnixStream::connect(inst.socket_path()).unwrap());
    }
    assert_healthy(&inst);
}

#[test]
fn local_socket_odd_but_well_formed_messages() {
    let inst = Instance::start(4, &["tbon.topo=kary:2"]);
    let mut s = connect_local(&inst);
    s.set_read_timeout(Some(Duration::from_secs(8))).unwrap();
    // A request to a rank that does not exist: an error response, the connection stays up.
    send_all(&mut s, &encode_frame(1, T_REQUEST, 0, "broker.ping", 11, 999, &[], b"{}"));
    let f = read_frame(&mut s).unwrap().expect("response");
    assert_eq!((f.msgtype, f.matchtag), (T_RESPONSE, 11), "{f:?}");
    assert_eq!(f.errnum, 113, "EHOSTUNREACH expected: {f:?}");
    // Non-JSON payload to a service: an error, not a crash.
    send_all(&mut s, &encode_frame(1, T_REQUEST, 0, "job-manager.submit", 12, 0, &[], b"\xff\xfe not json"));
    let f = read_frame(&mut s).unwrap().expect("response");
    assert_eq!(f.matchtag, 12);
    assert_ne!(f.errnum, 0, "{f:?}");
    // A jobspec of the wrong shape.
    send_all(&mut s, &encode_frame(1, T_REQUEST, 0, "job-manager.submit", 13, 0, &[], b"{\"jobspec\": [1,2,3]}"));
    let f = read_frame(&mut s).unwrap().expect("response");
    assert_eq!(f.matchtag, 13);
    assert_eq!(f.errnum, 22, "EINVAL expected: {f:?}");
    // A forged route stack (at the size limit): the answer still comes back to us, and if the request is
    // served, the forged hops were not kept (the broker saw a one-hop route).
    let route = vec![1u32; 64];
    send_all(&mut s, &encode_frame(1, T_REQUEST, 0, "broker.ping", 14, 0, &route, b"{}"));
    let f = read_frame(&mut s).unwrap().expect("response");
    assert_eq!((f.msgtype, f.matchtag), (T_RESPONSE, 14), "{f:?}");
    if f.errnum == 0 {
        assert_eq!(f.payload["route"].as_u64(), Some(1), "forged route kept: {f:?}");
    }
    // Unknown service.
    send_all(&mut s, &encode_frame(1, T_REQUEST, 0, "nosuch.method", 15, u32::MAX, &[], b"{}"));
    let f = read_frame(&mut s).unwrap().expect("response");
    assert_eq!((f.matchtag, f.errnum), (15, 38), "ENOSYS expected: {f:?}");
    // Things a client may not do, silently ignored: publish an event, send a control "shutdown", send a stray
    // response.
    send_all(&mut s, &encode_frame(1, T_EVENT, 0, "overlay.lost", 0, 0, &[], b"{\"ranks\": \"1-3\"}"));
    send_all(&mut s, &encode_frame(1, T_CONTROL, 0, "shutdown", 0, 0, &[], b"{\"reason\": \"impostor\"}"));
    send_all(&mut s, &encode_frame(1, T_RESPONSE, 0, "broker.ping", 77, 0, &[], b"{}"));
    // Ping rank 3 through the tree: the connection and the overlay are intact.
    send_all(&mut s, &encode_frame(1, T_REQUEST, 0, "broker.ping", 16, 3, &[], b"{}"));
    let f = read_frame(&mut s).unwrap().expect("response");
    assert_eq!((f.matchtag, f.errnum), (16, 0), "{f:?}");
    assert_eq!(f.payload["rank"].as_u64(), Some(3), "{f:?}");
    s.flush().unwrap();
    drop(s);
    assert_healthy(&inst);
    let (o, left) = inst.stop_with(0);
    o.code_is(0);
    assert!(left.is_empty(), "{left:?}");
}

#[test]

fn overlay_hello_claiming_a_live_child_does_not_displace_it() {
    let inst = Instance::start(4, &["tbon.topo=kary:2"]);
    let addr = overlay_endpoint(&inst);
    let iid = instance_id(&inst);
    let mut s = connect_overlay(&addr);
    let hello = serde_json::json!({"rank": 1, "instance": iid, "version": 1, "hostname": "impostor"}).to_string();
    send_all(&mut s, &encode_frame(1, T_CONTROL, 0, "hello", 0, u32::MAX, &[], hello.as_bytes()));
    std::thread::sleep(Duration::from_millis(500));
    drop(s);
    assert_healthy(&inst);
}

/// A closed standard error (`vigil start ... 2>&1 | head`, a log collector gone) loses the log, not the instance:
/// rank 2's broker is killed, the others log it (info level: several lines each), and the instance goes on.
#[test]
fn a_closed_stderr_does_not_take_the_instance_down() {
    let dir = tempdir();
    let done = dir.path().join("done");
    let script = format!(
        "kill -9 $(vigil getattr -r 2 broker.pid); sleep 1; vigil overlay status > /dev/null && touch {}",
        done.display()
    );
    let mut cmd = vigil_cmd(dir.path());
    cmd.args(["start", "--test-size=3", "-S", "log-level=info", "sh", "-c", &script])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().expect("vigil start");
    drop(child.stderr.take()); // the reading end is closed: every write to stderr fails with EPIPE
    let ok = wait_for(Duration::from_secs(60), || child.try_wait().ok().flatten().is_some());
    if !ok {
        let _ = child.kill();
    }
    let st = child.wait().expect("wait");
    assert!(ok, "vigil start did not finish");
    assert_eq!(st.code(), Some(0), "{st:?}");
    assert!(done.exists(), "the initial program ran to its end");
}

/// A broker killed outright while a job runs on it: its job shell kills the tasks and whatever they started in
/// the background (nobody else is left on that node to kill the job's process group).
#[test]
fn a_killed_broker_leaves_no_task_process_behind() {
    let inst = Instance::start(3, &[]);
    let d = inst.dir.path().display().to_string();
    let script = format!("sleep 300 & echo $! > {d}/bg.$VIGIL_TASK_RANK; wait");
    let id = inst.submit(&["-N", "3", "-n", "3", "sh", "-c", &script]);
    let bg = inst.dir.path().join("bg.2");
    assert!(wait_for(Duration::from_secs(20), || std::fs::read_to_string(&bg).is_ok_and(|s| s.ends_with('\n'))));
    let pid: i32 = std::fs::read_to_string(&bg).unwrap().trim().parse().expect("pid");
    let broker: i32 = inst.vigil(&["getattr", "-r", "2", "broker.pid"]).stdout.trim().parse().expect("broker.pid");
    // SAFETY: kill has no memory preconditions.
    assert_eq!(unsafe { libc::kill(broker, libc::SIGKILL) }, 0);
    // SAFETY: as above; signal 0 only checks that the process exists.
    let gone = wait_for(Duration::from_secs(10), || unsafe { libc::kill(pid, 0) } != 0);
    if !gone {
        // SAFETY: as above.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    assert!(gone, "task 2's background process {pid} outlived its broker");
    // Rank 2 is critical here (the job's nodes are all critical by default): the job ends, with an exception.
    let o = inst.vigil(&["job", "wait", &id]);
    assert_ne!(o.code, 0, "{}", o.dump());
}

/// Odd requests from the command line are refused with the reason: an empty event topic, an output file
/// template other than `{{id}}`.
#[test]
fn empty_event_topics_and_unknown_output_templates_are_refused() {
    let inst = Instance::start(1, &[]);
    let o = inst.vigil(&["event", "pub", ""]);
    assert_eq!(o.code, 1, "{}", o.dump());
    assert!(o.stderr.contains("topic must be a non-empty string"), "{}", o.dump());
    let o = inst.vigil(&["run", "--output", "o-{{id}}-{{bogus}}.txt", "true"]);
    assert_eq!(o.code, 1, "{}", o.dump());
    assert!(o.stderr.contains("unknown template {{bogus}}"), "{}", o.dump());
    assert!(!std::fs::read_dir(inst.dir.path())
        .unwrap()
        .flatten()
        .any(|e| e.file_name().to_string_lossy().contains("bogus")));
    assert_healthy(&inst);
}

/// The overlay's listening socket stays in the broker: `vigil start` hands each broker its listener across exec,
/// and neither the initial program nor a job's tasks may inherit it (they would hold the port after rank 0 dies,
/// and a restarted rank 0 could not bind it).
#[test]
fn the_overlay_listener_is_not_inherited_by_the_initial_program_or_tasks() {
    // Every descriptor of the calling shell that is a TCP socket in LISTEN state (0A in /proc/net/tcp*).
    let script = r#"for f in /proc/$$/fd/*; do l=$(readlink "$f") || continue; case "$l" in socket:*) i=${l#socket:[}; i=${i%]}; awk -v i="$i" '$4 == "0A" && $10 == i {print "LISTENER " FILENAME}' /proc/net/tcp /proc/net/tcp6;; esac; done; echo checked"#;
    let (out, _dir) = start_and_run(
        2,
        &[],
        &["sh", "-c", &format!("{script}; vigil run -N1 -n1 -o pmi=off sh -c '{}'", script.replace('\'', "'\\''"))],
        Duration::from_secs(60),
    );
    out.ok();
    let stdout = &out.stdout;
    assert_eq!(stdout.matches("checked").count(), 2, "both the initial program and the task ran the check: {stdout}");
    assert!(!stdout.contains("LISTENER"), "a listening socket was inherited: {stdout}");
}
