//! Overlay security, tried as an attacker on the same network would (issue: "An overlay only the instance's own
//! brokers can join"): peers without the key, with another key, replaying a captured handshake; authenticated
//! peers that claim ranks or userids they should not; floods of connections that never authenticate; refusal
//! texts; key files a system instance must refuse.

mod common;

use common::*;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use vigil::broker::secure::{self, LinkAuth, SecureReader, SecureWriter};
use vigil::keyfile::{KeyFile as _, OverlayKey};
use vigil::message::{Message, MsgType};

/// A TCP stream that records every byte written to it (what an eavesdropper on the wire would capture).
struct Tap {
    inner: tokio::net::TcpStream,
    sent: Arc<Mutex<Vec<u8>>>,
}

impl AsyncRead for Tap {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Tap {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<std::io::Result<usize>> {
        let me = self.get_mut();
        let r = Pin::new(&mut me.inner).poll_write(cx, data);
        if let Poll::Ready(Ok(n)) = r {
            me.sent.lock().unwrap().extend_from_slice(&data[..n]);
        }
        r
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// A hand-driven overlay peer on an authenticated link (the test's own tokio runtime under the hood).
struct SecurePeer {
    rt: tokio::runtime::Runtime,
    rd: SecureReader<tokio::io::ReadHalf<Tap>>,
    wr: SecureWriter<tokio::io::WriteHalf<Tap>>,
    sent: Arc<Mutex<Vec<u8>>>,
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

impl SecurePeer {
    /// Connect to `addr` and run the initiator's handshake with `key` for `instance`.
    fn connect(addr: &str, key: &OverlayKey, instance: &str) -> Result<SecurePeer, String> {
        let rt = runtime();
        let auth = LinkAuth::new(key.clone(), instance);
        let sent = Arc::new(Mutex::new(Vec::new()));
        let r = rt.block_on(async {
            let inner = tokio::net::TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
            let mut tap = Tap { inner, sent: sent.clone() };
            let s = secure::initiate(&mut tap, &auth).await.map_err(|e| e.to_string())?;
            let (rd, wr) = tokio::io::split(tap);
            Ok::<_, String>(s.split(rd, wr))
        });
        let (rd, wr) = r?;
        Ok(SecurePeer { rt, rd, wr, sent })
    }

    fn send(&mut self, m: &Message) {
        let f = m.encode();
        let wr = &mut self.wr;
        self.rt.block_on(async {
            let _ = wr.write_all(&f).await;
            let _ = wr.flush().await;
        });
    }

    /// The next message within `t`; None on close, error or timeout.
    fn recv(&mut self, t: Duration) -> Option<Message> {
        let rd = &mut self.rd;
        self.rt.block_on(async { tokio::time::timeout(t, vigil::frame::read_frame(rd)).await.ok()?.ok().flatten() })
    }

    /// Whether the broker closes the link within `t` (messages before the close are skipped).
    fn closed_within(&mut self, t: Duration) -> bool {
        let deadline = Instant::now() + t;
        let rd = &mut self.rd;
        self.rt.block_on(async {
            loop {
                match tokio::time::timeout_at(deadline.into(), vigil::frame::read_frame(rd)).await {
                    Err(_) => return false,
                    Ok(Ok(Some(_))) => continue,
                    Ok(_) => return true,
                }
            }
        })
    }

    /// Everything this peer wrote on the wire so far.
    fn transcript(&self) -> Vec<u8> {
        self.sent.lock().unwrap().clone()
    }
}

fn hello(rank: u32, instance: &str) -> Message {
    Message::control(
        "hello",
        &serde_json::json!({"rank": rank, "instance": instance, "version": 1, "hostname": "impostor"}),
    )
}

struct Target {
    addr: String,
    instance: String,
    key: OverlayKey,
    key_hex: String,
}

/// Rank 0's overlay address, the instance id, and the key `vigil start` made (read from its 0600 file, as the
/// instance owner can).
fn target(inst: &Instance) -> Target {
    let get = |name: &str| {
        let o = inst.vigil(&["getattr", name]);
        o.ok();
        o.stdout.trim().to_string()
    };
    let ep = get("tbon.endpoint");
    let addr = ep.strip_prefix("tcp://").unwrap_or(&ep).to_string();
    let instance = get("instance-id");
    let key_file = PathBuf::from(get("rundir")).join("overlay.key");
    let mode = std::fs::metadata(&key_file).expect("the test instance's key file").permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{}", key_file.display());
    let key = OverlayKey::load(&key_file).expect("key file");
    let key_hex = key.to_hex();
    Target { addr, instance, key, key_hex }
}

fn rank_state(inst: &Instance, rank: usize) -> String {
    let v = inst.vigil(&["overlay", "status", "--json"]).json();
    v["ranks"][rank]["state"].as_str().unwrap_or("?").to_string()
}

fn jobs_all(inst: &Instance) -> usize {
    inst.vigil(&["jobs", "-a", "--json"]).json()["jobs"].as_array().map(Vec::len).unwrap_or(usize::MAX)
}

fn kill_rank(inst: &Instance, rank: u32) {
    let pid: i32 = inst.vigil(&["getattr", "-r", &rank.to_string(), "broker.pid"]).stdout.trim().parse().unwrap();
    // SAFETY: kill has no memory preconditions.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    assert!(wait_for(Duration::from_secs(20), || rank_state(inst, rank as usize) == "lost"), "rank {rank} not lost");
}

/// A submit whose job would create `marker`.
fn submit_request(userid: u32, marker: &Path) -> Message {
    let spec = serde_json::json!({"version": 1,
        "resources": [{"type": "slot", "count": 1, "label": "task", "with": [{"type": "core", "count": 1}]}],
        "tasks": [{"command": ["touch", marker.display().to_string()], "slot": "task", "count": {"per_slot": 1}}],
        "attributes": {"system": {"duration": 0}}});
    let mut m = Message::request("job-manager.submit", 0, &serde_json::json!({"jobspec": spec}));
    m.userid = userid;
    m.matchtag = 7;
    m
}

/// A flat 3-broker instance whose rank 2 was killed (a free slot for an impostor), its target, and the file an
/// impostor's job would create.
fn instance_with_a_lost_rank() -> (Instance, Target, PathBuf) {
    let inst = Instance::start(3, &["tbon.topo=kary:0"]);
    let t = target(&inst);
    let marker = inst.dir.path().join("impostor-ran");
    kill_rank(&inst, 2);
    (inst, t, marker)
}

/// The attacks of the issue against a flat 3-broker instance whose rank 2 was lost (a free slot): a plaintext
/// hello and submit with the right instance id; a handshake with another key; a replay of a handshake captured
/// on the wire. Each is closed; rank 2 stays lost; no job is submitted.
#[test]
fn peers_without_the_key_with_another_key_or_replaying_a_handshake_are_refused() {
    let (inst, t, marker) = instance_with_a_lost_rank();

    // 1. The old attack: the right instance id in a plaintext hello, then a submit.
    let mut s = std::net::TcpStream::connect(&t.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    send_all(&mut s, &hello(2, &t.instance).encode());
    send_all(&mut s, &submit_request(0, &marker).encode());
    assert!(peer_closes(&mut s, Duration::from_secs(8)), "a plaintext hello was kept");

    // 2. Another key, right instance id: the handshake fails, or the link is closed at once.
    match SecurePeer::connect(&t.addr, &OverlayKey::generate().unwrap(), &t.instance) {
        Err(_) => {}
        Ok(mut p) => {
            p.send(&hello(2, &t.instance));
            p.send(&submit_request(0, &marker));
            assert!(p.recv(Duration::from_secs(2)).is_none(), "a peer with another key got an answer");
        }
    }
    // The right key with another instance id fails the same way (the id is bound into the handshake).
    if let Ok(mut p) = SecurePeer::connect(&t.addr, &t.key, "another-instance") {
        p.send(&hello(2, "another-instance"));
        assert!(p.recv(Duration::from_secs(2)).is_none(), "a peer of another instance got an answer");
    }

    // 3. Capture a real handshake (a key holder claiming live rank 1, which is refused), then replay it.
    let mut real = SecurePeer::connect(&t.addr, &t.key, &t.instance).expect("the key holder authenticates");
    real.send(&hello(1, &t.instance));
    let refused = real.recv(Duration::from_secs(5)).expect("an answer to the key holder");
    assert_eq!(refused.topic, "refused", "{refused:?}");
    let captured = real.transcript();
    drop(real);
    let mut s = std::net::TcpStream::connect(&t.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    send_all(&mut s, &captured);
    assert!(peer_closes(&mut s, Duration::from_secs(8)), "a replayed handshake was kept");

    assert_eq!(rank_state(&inst, 2), "lost", "an impostor took rank 2's place");
    assert_eq!(jobs_all(&inst), 0, "an unauthenticated peer submitted a job");
    assert!(!marker.exists(), "an impostor's job ran");
    inst.vigil(&["run", "-N2", "-n2", "true"]).ok();
}

/// Identity comes from where it was checked: a peer that holds the key (a broker of the instance) cannot
/// raise a request's userid. In this single-owner instance a request carrying another userid is refused
/// (EPERM); the owner's goes through.
#[test]
fn an_authenticated_peer_cannot_raise_the_userid_of_its_requests() {
    let (inst, t, marker) = instance_with_a_lost_rank();
    let mut p = SecurePeer::connect(&t.addr, &t.key, &t.instance).expect("authenticates");
    p.send(&hello(2, &t.instance));
    let ack = p.recv(Duration::from_secs(5)).expect("hello answered");
    assert_eq!(ack.topic, "hello-ack", "{ack:?}");
    p.send(&submit_request(4242, &marker));
    let r = loop {
        let m = p.recv(Duration::from_secs(5)).expect("a response to the submit");
        if m.msgtype == MsgType::Response && m.matchtag == 7 {
            break m;
        }
    };
    assert_eq!(r.errnum, 1, "EPERM expected: {r:?} {:?}", r.errstr());
    assert_eq!(jobs_all(&inst), 0, "a job was submitted with a forged userid");
    std::thread::sleep(Duration::from_millis(300));
    assert!(!marker.exists(), "the forged job ran");
    // The same link, the owner's userid: the request is served (the refusal above was the userid rule).
    let mut ping = Message::request("broker.ping", 0, &serde_json::json!({}));
    ping.userid = nix::unistd::getuid().as_raw();
    ping.matchtag = 8;
    p.send(&ping);
    let r = loop {
        let m = p.recv(Duration::from_secs(5)).expect("a response to the ping");
        if m.msgtype == MsgType::Response && m.matchtag == 8 {
            break m;
        }
    };
    assert_eq!(r.errnum, 0, "{r:?} {:?}", r.errstr());
}

/// Authenticated hellos that claim a rank that is not this broker's child, or a live one, are refused with a
/// reason and disconnected; the real child is not displaced.
#[test]
fn an_authenticated_hello_from_a_rank_that_is_not_a_free_child_is_refused() {
    let inst = Instance::start(4, &["tbon.topo=kary:2"]);
    let t = target(&inst);
    // kary:2: rank 0's children are 1 and 2; 3 is rank 1's child; 0 is nobody's child, 99 not in the instance.
    for (rank, why) in
        [(3u32, "not a child"), (0, "not a child"), (99, "not in this instance"), (1, "already connected")]
    {
        let mut p = SecurePeer::connect(&t.addr, &t.key, &t.instance).expect("authenticates");
        p.send(&hello(rank, &t.instance));
        let f = p.recv(Duration::from_secs(8)).unwrap_or_else(|| panic!("rank {rank}: no answer to hello"));
        assert_eq!((f.msgtype, f.topic.as_str()), (MsgType::Control, "refused"), "rank {rank}: {f:?}");
        let errstr = f.errstr().unwrap_or_default();
        assert!(errstr.contains(why), "rank {rank}: {errstr:?}");
        assert!(!errstr.contains(&t.instance), "the refusal names the instance id: {errstr:?}");
        assert!(p.closed_within(Duration::from_secs(8)), "refused peer not disconnected");
    }
    let v = inst.vigil(&["overlay", "status", "--json"]).json();
    assert!(v["ranks"].as_array().unwrap().iter().all(|r| r["state"] == "online"), "{v}");
    inst.vigil(&["run", "-N4", "-n4", "true"]).ok();
}

fn rss_kib(pid: i32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

/// Connections that never authenticate cost rank 0 bounded memory and are closed: 64 that announce a
/// 0xFFFFFFFF-byte frame and stall are closed at once, 64 that send nothing are closed after the handshake
/// timeout, and 400 at once (more than may wait for a handshake) leave it healthy.
#[test]
fn connections_that_never_authenticate_hold_bounded_memory_and_are_closed() {
    let inst = Instance::start(2, &[]);
    let t = target(&inst);
    let pid: i32 = inst.vigil(&["getattr", "broker.pid"]).stdout.trim().parse().unwrap();
    // The eBPF detectors load in the background after start-up, and take memory doing so: measure after.
    assert!(
        wait_for(Duration::from_secs(60), || !inst.vigil(&["uptime"]).stdout.contains("loading")),
        "detectors still loading"
    );
    std::thread::sleep(Duration::from_millis(200));
    let before = rss_kib(pid);

    let mut huge: Vec<std::net::TcpStream> = (0..64)
        .map(|_| {
            let mut s = std::net::TcpStream::connect(&t.addr).unwrap();
            send_all(&mut s, &[0xff, 0xff, 0xff, 0xff, b'V', b'G', 1, 4]);
            s.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
            s
        })
        .collect();
    let silent_since = Instant::now();
    let mut silent: Vec<std::net::TcpStream> = (0..64)
        .map(|_| {
            let s = std::net::TcpStream::connect(&t.addr).unwrap();
            s.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
            s
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let during = rss_kib(pid);
    assert!(during < before + 16 * 1024, "rank 0 grew from {before} KiB to {during} KiB");
    for (i, s) in huge.iter_mut().enumerate() {
        assert!(peer_closes(s, Duration::from_secs(2)), "connection {i} with a huge length prefix kept open");
    }
    // Not closed before the timeout (they might yet authenticate), closed soon after it.
    let early = silent_since.elapsed();
    if early < secure::HANDSHAKE_TIMEOUT - Duration::from_secs(1) {
        assert!(!peer_closes(&mut silent[0], Duration::from_millis(200)), "a silent connection closed early");
    }
    for (i, s) in silent.iter_mut().enumerate() {
        assert!(
            peer_closes(s, secure::HANDSHAKE_TIMEOUT + Duration::from_secs(5)),
            "silent connection {i} still open after {:?}",
            silent_since.elapsed()
        );
    }

    // More connections than may wait for a handshake at once.
    let flood: Vec<std::net::TcpStream> = (0..400).filter_map(|_| std::net::TcpStream::connect(&t.addr).ok()).collect();
    std::thread::sleep(Duration::from_millis(500));
    let flooded = rss_kib(pid);
    assert!(flooded < before + 16 * 1024, "rank 0 grew from {before} KiB to {flooded} KiB under a flood");
    drop(flood);
    eprintln!(
        "rank 0 VmRSS: {before} KiB idle, {during} KiB with 128 unauthenticated connections, {flooded} KiB with 400"
    );
    // Rank 0 still serves its instance.
    inst.vigil(&["run", "-N2", "-n2", "true"]).ok();
}

/// What a refused peer can read, and what the log says: no instance id, no key material; and a peer refused
/// again and again is logged once.
#[test]
fn refusals_name_no_instance_id_and_no_key_and_are_logged_once_per_peer() {
    let inst = Instance::start(2, &[]);
    let t = target(&inst);
    for _ in 0..20 {
        let mut s = std::net::TcpStream::connect(&t.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
        send_all(&mut s, &hello(1, "x").encode());
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(8);
        let mut buf = [0u8; 4096];
        while Instant::now() < deadline {
            match std::io::Read::read(&mut s, &mut buf) {
                Ok(0) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => break,
            }
        }
        let text = String::from_utf8_lossy(&got);
        assert!(!text.contains(&t.instance) && !text.contains(&t.key_hex[..16]), "{text:?}");
    }
    if let Ok(mut p) = SecurePeer::connect(&t.addr, &OverlayKey::generate().unwrap(), &t.instance) {
        p.send(&hello(1, &t.instance));
        assert!(p.recv(Duration::from_secs(2)).is_none());
    }
    let (o, _) = inst.stop_with(0);
    o.code_is(0);
    let log = format!("{}{}", o.stdout, o.stderr);
    assert!(!log.contains(&t.instance), "the log names the instance id:\n{log}");
    assert!(!log.contains(&t.key_hex[..16]), "the log shows the key:\n{log}");
    let refusals = log.lines().filter(|l| l.contains("overlay peer 127.0.0.1") && l.contains("refused")).count();
    assert_eq!(refusals, 1, "21 refusals of one peer should log once:\n{log}");
}

/// A broker of a system instance refuses to start without a usable key file, naming the file and what to do.
#[test]
fn a_system_instance_refuses_a_missing_unsafe_or_malformed_key_file() {
    let dir = tempdir();
    let d = dir.path();
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    drop(l);
    let key = d.join("overlay.key");
    let config = |key_line: &str| {
        let p = d.join("vigil.toml");
        std::fs::write(
            &p,
            format!(
                "[bootstrap]\ninstance = \"sys\"\n{key_line}\nhosts = [ {{ host = \"n0\", bind = \"tcp://127.0.0.1:{port}\", connect = \"tcp://127.0.0.1:{port}\" }} ]\n"
            ),
        )
        .unwrap();
        p
    };
    let broker = |cfg: &Path| {
        let mut c = vigil_cmd(d);
        c.args(["broker", "--rank=0"])
            .arg(format!("--config={}", cfg.display()))
            .arg(format!("--rundir={}", d.join("r").display()));
        c.args(["--", "true"]);
        run(c, Duration::from_secs(30), Some(d))
    };
    // No overlay_key in [bootstrap].
    let o = broker(&config(""));
    assert_eq!(o.code, 1, "{}", o.dump());
    assert!(o.stderr.contains("overlay_key") && o.stderr.contains("vigil keygen"), "{}", o.dump());
    // A missing file.
    let cfg = config(&format!("overlay_key = \"{}\"", key.display()));
    let o = broker(&cfg);
    assert_eq!(o.code, 1, "{}", o.dump());
    assert!(o.stderr.contains(&key.display().to_string()) && o.stderr.contains("No such file"), "{}", o.dump());
    // vigil keygen writes it 0600 and will not overwrite it without --force.
    let mut c = vigil_cmd(d);
    c.arg("keygen").arg(&key);
    run(c, Duration::from_secs(10), None).ok();
    assert_eq!(std::fs::metadata(&key).unwrap().permissions().mode() & 0o777, 0o600);
    let mut c = vigil_cmd(d);
    c.arg("keygen").arg(&key);
    let o = run(c, Duration::from_secs(10), None);
    assert_eq!(o.code, 1, "{}", o.dump());
    assert!(o.stderr.contains("exists"), "{}", o.dump());
    // Group-readable.
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o640)).unwrap();
    let o = broker(&cfg);
    assert_eq!(o.code, 1, "{}", o.dump());
    assert!(o.stderr.contains(&key.display().to_string()) && o.stderr.contains("0640"), "{}", o.dump());
    // Malformed.
    std::fs::write(&key, "overlay_key = \"not hex\"\n").unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let o = broker(&cfg);
    assert_eq!(o.code, 1, "{}", o.dump());
    assert!(o.stderr.contains(&key.display().to_string()) && o.stderr.contains("hexadecimal"), "{}", o.dump());
    // A good key: the broker starts and runs its initial program.
    let mut c = vigil_cmd(d);
    c.args(["keygen", "--force"]).arg(&key);
    run(c, Duration::from_secs(10), None).ok();
    let o = broker(&cfg);
    assert_eq!(o.code, 0, "{}", o.dump());
}

/// A two-broker system instance on loopback (TOML bootstrap, `--rank`), for tests that start, stop and flood
/// its brokers one by one.
struct SystemInstance {
    dir: tempfile::TempDir,
    config: PathBuf,
    ports: [u16; 2],
}

impl SystemInstance {
    fn new() -> SystemInstance {
        let dir = tempdir();
        let d = dir.path();
        let ports = [0, 1].map(|_| {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        });
        let key = d.join("overlay.key");
        OverlayKey::generate().unwrap().write(&key, false).unwrap();
        let hosts: Vec<String> = ports
            .iter()
            .enumerate()
            .map(|(r, p)| {
                format!("{{ host = \"n{r}\", bind = \"tcp://127.0.0.1:{p}\", connect = \"tcp://127.0.0.1:{p}\" }}")
            })
            .collect();
        let config = d.join("vigil.toml");
        std::fs::write(
            &config,
            format!(
                "[bootstrap]\ninstance = \"sys\"\noverlay_key = \"{}\"\nhosts = [ {} ]\n",
                key.display(),
                hosts.join(", ")
            ),
        )
        .unwrap();
        SystemInstance { dir, config, ports }
    }

    /// `vigil broker` for `rank`, with `-S` attributes.
    fn broker(&self, rank: u32, attrs: &[&str]) -> std::process::Command {
        let d = self.dir.path();
        let mut c = vigil_cmd(d);
        c.args(["broker", &format!("--rank={rank}")])
            .arg(format!("--config={}", self.config.display()))
            .arg(format!("--rundir={}", d.join(format!("r{rank}")).display()));
        for a in attrs {
            c.arg("-S").arg(a);
        }
        c
    }

    /// A `vigil` client command talking to rank 0.
    fn client(&self, args: &[&str]) -> Output {
        let d = self.dir.path();
        let mut c = vigil_cmd(d);
        c.env("VIGIL_URI", format!("local://{}", d.join("r0").join("local-0").display())).args(args);
        run(c, Duration::from_secs(20), None)
    }
}

/// A client with no key that keeps every handshake slot of rank 0's listener busy (200 connections that never
/// authenticate, each reopened as soon as it is closed) must not keep a broker of the instance out: the oldest
/// waiting connection makes room for the newest, and a real handshake takes milliseconds.
#[test]
fn a_flood_of_connections_that_never_authenticate_does_not_keep_a_broker_out() {
    let inst = SystemInstance::new();
    let rank0 = spawn(inst.broker(0, &[]), Some(inst.dir.path()));
    assert!(wait_for(Duration::from_secs(20), || inst.client(&["uptime"]).code == 0), "rank 0 did not come up");
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let addr = format!("127.0.0.1:{}", inst.ports[0]);
    let flood = {
        let stop = stop.clone();
        let addr = addr.clone();
        std::thread::spawn(move || {
            let mut conns: Vec<Option<std::net::TcpStream>> = (0..200).map(|_| None).collect();
            let mut opened = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for c in conns.iter_mut() {
                    let closed = match c {
                        None => true,
                        Some(s) => {
                            let mut b = [0u8; 16];
                            match std::io::Read::read(s, &mut b) {
                                Ok(0) => true,
                                Ok(_) => false,
                                Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
                            }
                        }
                    };
                    if closed {
                        *c = std::net::TcpStream::connect(&addr).ok();
                        if let Some(s) = c {
                            let _ = s.set_nonblocking(true);
                            opened += 1;
                        }
                    }
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            opened
        })
    };
    std::thread::sleep(Duration::from_secs(2));
    let mut rank1 = spawn(inst.broker(1, &["tbon.connect_timeout=40s"]), Some(inst.dir.path()));
    let joined = wait_for(Duration::from_secs(40), || {
        let o = inst.client(&["overlay", "status", "--json"]);
        o.code == 0 && o.json()["ranks"][1]["state"] == "online"
    });
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let opened = flood.join().unwrap();
    let refused = inst.client(&["uptime"]).stdout;
    let _ = rank1.exited();
    // SAFETY: kill has no memory preconditions.
    unsafe { libc::kill(rank0.pid() as i32, libc::SIGTERM) };
    let out = rank0.wait(Duration::from_secs(20));
    let _ = rank1.wait(Duration::from_secs(20));
    eprintln!("flood: {opened} connections opened; {}", refused.trim());
    assert!(opened > 400, "the flood did not keep the listener busy ({opened} connections)");
    assert!(joined, "rank 1 could not join under the flood:\n{}", out.dump());
}

/// A broker still retrying its parent (it is not up, or refuses our key) stops on SIGTERM at once, not when
/// tbon.connect_timeout runs out.
#[test]
fn a_broker_waiting_for_its_parent_stops_on_sigterm() {
    let inst = SystemInstance::new();
    let rank1 = spawn(inst.broker(1, &["tbon.connect_timeout=60s"]), Some(inst.dir.path()));
    std::thread::sleep(Duration::from_secs(1));
    let t0 = Instant::now();
    // SAFETY: kill has no memory preconditions.
    unsafe { libc::kill(rank1.pid() as i32, libc::SIGTERM) };
    let out = rank1.wait(Duration::from_secs(30));
    let took = t0.elapsed();
    assert!(took < Duration::from_secs(10), "took {took:?} to stop:\n{}", out.dump());
    assert_eq!(out.code, 143, "{}", out.dump());
}

/// With every handshake slot held by connections that never authenticate, a key holder still gets through:
/// admitting it closes the oldest waiting connection (it is not refused for want of a slot).
#[test]
fn a_key_holder_gets_a_handshake_slot_when_all_are_held() {
    let inst = Instance::start(2, &[]);
    let t = target(&inst);
    let held: Vec<std::net::TcpStream> =
        (0..secure::MAX_PENDING_HANDSHAKES + 50).filter_map(|_| std::net::TcpStream::connect(&t.addr).ok()).collect();
    std::thread::sleep(Duration::from_millis(500));
    let mut p = SecurePeer::connect(&t.addr, &t.key, &t.instance).expect("a key holder is let in");
    p.send(&hello(1, &t.instance));
    let answer = p.recv(Duration::from_secs(5)).expect("an answer to the key holder's hello");
    assert_eq!(answer.topic, "refused", "{answer:?}"); // rank 1 is connected: refused, but authenticated
    drop(held);
    let uptime = inst.vigil(&["uptime"]);
    assert!(uptime.stdout.contains("unauthenticated connection(s) refused"), "{}", uptime.dump());
}
