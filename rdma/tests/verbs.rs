//! Verbs-layer tests.
//!
//! The host-side tests run everywhere. The others need two verbs devices serving `$RXE_A0` and `$RXE_A1`
//! (10.200.0.1 and 10.200.0.2 by default), as the soft-RoCE harness creates them (`ci/rdma-tests.sh`), and run
//! only with `VIGIL_RDMA_TESTS=1`; otherwise they print why they were skipped and pass. The link-down test
//! breaks the network, so it runs only with `VIGIL_RDMA_LINKDOWN=1`, alone, last (the driver restores the
//! links afterwards).

use std::net::IpAddr;
use std::time::{Duration, Instant};
use vigil_rdma::{find_device, Config, ConnError, Connection, Device, Endpoint};

fn addr(var: &str, default: &str) -> IpAddr {
    std::env::var(var).unwrap_or_else(|_| default.into()).parse().expect("an IP address")
}

/// The two devices, or None (printing why) when the RDMA tests are not enabled or no device serves them.
fn devices() -> Option<(Device, Device)> {
    if std::env::var("VIGIL_RDMA_TESTS").as_deref() != Ok("1") {
        eprintln!("RDMA test skipped: VIGIL_RDMA_TESTS is not 1 (ci/rdma-tests.sh runs these on soft-RoCE)");
        return None;
    }
    let a = find_device(addr("RXE_A0", "10.200.0.1"));
    let b = find_device(addr("RXE_A1", "10.200.0.2"));
    match (a, b) {
        (Ok(a), Ok(b)) => Some((a, b)),
        (a, b) => panic!("VIGIL_RDMA_TESTS=1 but the devices are missing: {a:?} / {b:?}"),
    }
}

/// Connect `a` (active) to `b` (passive) the way the broker does: b accepts a's info, a connects to b's.
fn pair(da: &Device, db: &Device, ca: Config, cb: Config) -> (Connection, Connection) {
    let (pa, ia) = Endpoint::prepare(da, ca).expect("prepare a");
    let (pb, ib) = Endpoint::prepare(db, cb).expect("prepare b");
    let b = pb.accept(&ia).expect("accept");
    let a = pa.connect(&ib).expect("connect");
    (a, b)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

#[test]
fn host_discovery_reports_a_reason() {
    // Loopback is never served by a verbs device: the error must say why, clearly.
    let e = find_device("127.0.0.1".parse().unwrap()).unwrap_err();
    let s = e.to_string();
    assert!(s.contains("no verbs devices") || s.contains("no device serving 127.0.0.1"), "{s}");
    eprintln!("discovery on this machine: {s}");
}

#[test]
fn host_config_refuses_forever() {
    let bad = Config { retry_cnt: 7, ..Config::default() };
    assert!(bad.validate().is_err());
    // prepare validates before touching any device.
    let dev = Device { name: "none".into(), port: 1, gid_index: 0, gid: "::1".parse().unwrap(), mtu: 1024, lid: 0 };
    let e = Endpoint::prepare(&dev, Config { timeout: 0, ..Config::default() }).unwrap_err();
    assert!(e.to_string().contains("timeout 0"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_send_recv() {
    let Some((da, db)) = devices() else { return };
    let (a, b) = pair(&da, &db, Config::default(), Config::default());
    let (atx, mut arx) = a.split();
    let (btx, mut brx) = b.split();
    atx.send(b"hello".to_vec()).await.unwrap();
    assert_eq!(brx.recv().await.unwrap(), b"hello");
    btx.send(b"hi back".to_vec()).await.unwrap();
    assert_eq!(arx.recv().await.unwrap(), b"hi back");
    // An empty message and one exactly one fragment long.
    atx.send(Vec::new()).await.unwrap();
    atx.send(pattern(16384, 1)).await.unwrap();
    assert_eq!(brx.recv().await.unwrap(), b"");
    assert_eq!(brx.recv().await.unwrap(), pattern(16384, 1));
    // Ping-pong.
    let t = Instant::now();
    for i in 0..200u32 {
        atx.send(i.to_be_bytes().to_vec()).await.unwrap();
        let m = brx.recv().await.unwrap();
        btx.send(m).await.unwrap();
        assert_eq!(arx.recv().await.unwrap(), i.to_be_bytes());
    }
    eprintln!("200 in-process round trips: {:?} each", t.elapsed() / 200);
    // Orderly close: a's receiver sees PeerClosed after b drops both halves.
    drop(btx);
    drop(brx);
    assert_eq!(arx.recv().await, Err(ConnError::PeerClosed));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_poll_mode() {
    let Some((da, db)) = devices() else { return };
    let cfg = Config { busy_poll: true, ..Config::default() };
    let (a, b) = pair(&da, &db, cfg.clone(), cfg);
    let (atx, mut arx) = a.split();
    let (btx, mut brx) = b.split();
    let echo = tokio::spawn(async move {
        while let Ok(m) = brx.recv().await {
            if btx.send(m).await.is_err() {
                break;
            }
        }
    });
    let t = Instant::now();
    for i in 0..200u32 {
        atx.send(i.to_le_bytes().to_vec()).await.unwrap();
        assert_eq!(arx.recv().await.unwrap(), i.to_le_bytes());
    }
    eprintln!("200 busy-poll round trips: {:?} each", t.elapsed() / 200);
    drop(atx);
    drop(arx);
    let _ = tokio::time::timeout(Duration::from_secs(5), echo).await;
}

/// A busy-polling receiver on a current-thread runtime (the broker's) leaves room for the other tasks: timers
/// fire and other tasks run while it waits.
#[test]
fn busy_poll_shares_a_current_thread_runtime() {
    let Some((da, db)) = devices() else { return };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async move {
        let cfg = Config { busy_poll: true, ..Config::default() };
        let (a, b) = pair(&da, &db, cfg.clone(), cfg);
        let (atx, _arx) = a.split();
        let (_btx, mut brx) = b.split();
        let waiting = tokio::spawn(async move { brx.recv().await.map(|m| (m, brx)) });
        // The receiver spins meanwhile; this task and its timer must still make progress.
        let t = Instant::now();
        for _ in 0..5 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let dt = t.elapsed();
        assert!(dt < Duration::from_secs(2), "timers starved by a busy receiver: 5 x 10 ms took {dt:?}");
        atx.send_now_with(5, |b| b.copy_from_slice(b"spins")).unwrap();
        let (m, _brx) = tokio::time::timeout(Duration::from_secs(5), waiting).await.unwrap().unwrap().unwrap();
        assert_eq!(m, b"spins");
    });
}

/// `send_now_with` writes in place when a credit is free and queues otherwise (no credits left, or a message
/// larger than one fragment); everything arrives whole and in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_now_with_in_place_and_queued() {
    let Some((da, db)) = devices() else { return };
    let cfg = Config { depth: 4, frag_size: 1024, ..Config::default() };
    let (a, b) = pair(&da, &db, cfg.clone(), cfg);
    let (atx, _arx) = a.split();
    let (_btx, mut brx) = b.split();
    let len = |i: u32| if i.is_multiple_of(7) { 2500 + i as usize } else { 4 + (i as usize % 900) };
    // 64 messages at once: far beyond the 4 credits, so most are queued and go out as credits return.
    for i in 0..64u32 {
        atx.send_now_with(len(i), |b| {
            b.copy_from_slice(&pattern(b.len(), i as u8));
            b[..4].copy_from_slice(&i.to_be_bytes());
        })
        .unwrap();
    }
    for i in 0..64u32 {
        let m = tokio::time::timeout(Duration::from_secs(10), brx.recv()).await.expect("in time").unwrap();
        assert_eq!(m.len(), len(i), "message {i}");
        assert_eq!(&m[..4], i.to_be_bytes(), "order");
        assert_eq!(&m[4..], &pattern(len(i), i as u8)[4..], "content of {i}");
    }
    let e = atx.send_now_with((64 << 20) + 5, |_| unreachable!("too large: never filled")).unwrap_err();
    assert!(matches!(e, ConnError::TooLarge { .. }), "{e}");
}

/// Messages around the inline-send limit arrive intact, whatever each side's `max_inline`: inline sends (the
/// bytes are copied into the work request) and sends from the registered buffer mix on one connection, and a
/// send slot reused at once after an inline send never corrupts an earlier message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inline_and_buffered_sends() {
    let Some((da, db)) = devices() else { return };
    let with = Config { depth: 4, frag_size: 1024, ..Config::default() };
    let without = Config { max_inline: 0, ..with.clone() };
    let (a, b) = pair(&da, &db, with, without);
    let (atx, mut arx) = a.split();
    let (btx, mut brx) = b.split();
    let sizes = [1usize, 2, 53, 92, 235, 236, 237, 300, 1023, 1024, 1025, 3000];
    for round in 0..8u8 {
        for (k, &len) in sizes.iter().enumerate() {
            let seed = round.wrapping_mul(17).wrapping_add(k as u8);
            atx.send_now_with(len, |b| b.copy_from_slice(&pattern(len, seed))).unwrap();
            btx.send_now(pattern(len, seed ^ 0x5a)).unwrap();
        }
        for (k, &len) in sizes.iter().enumerate() {
            let seed = round.wrapping_mul(17).wrapping_add(k as u8);
            let m = tokio::time::timeout(Duration::from_secs(10), brx.recv()).await.expect("in time").unwrap();
            assert!(m == pattern(len, seed), "a -> b: message of {len} bytes corrupted");
            let m = tokio::time::timeout(Duration::from_secs(10), arx.recv()).await.expect("in time").unwrap();
            assert!(m == pattern(len, seed ^ 0x5a), "b -> a: message of {len} bytes corrupted");
        }
    }
}

#[test]
fn sync_connection() {
    let Some((da, db)) = devices() else { return };
    let (pa, ia) = Endpoint::prepare(&da, Config::default()).expect("prepare a");
    let (pb, ib) = Endpoint::prepare(&db, Config::default()).expect("prepare b");
    let mut b = pb.accept_sync(&ia).expect("accept");
    let mut a = pa.connect_sync(&ib).expect("connect");
    // Sizes: empty, one fragment, several fragments, more fragments than credits (queued, sent by polls).
    let sizes = [0usize, 2, 16384, 40_000, 600_000];
    let echo = std::thread::spawn(move || {
        for _ in 0..sizes.len() * 20 {
            let m = b.recv().expect("echo recv");
            b.send(&m).expect("echo send");
        }
        // Dropped here: an orderly close.
    });
    let t = Instant::now();
    for i in 0..20u8 {
        for (k, &len) in sizes.iter().enumerate() {
            let m = pattern(len, i.wrapping_add(k as u8));
            a.send(&m).unwrap();
            assert!(a.recv().unwrap() == m, "message of {len} bytes corrupted");
        }
    }
    eprintln!("{} synchronous round trips: {:?}", sizes.len() * 20, t.elapsed());
    echo.join().unwrap();
    assert_eq!(a.recv(), Err(ConnError::PeerClosed));
    assert_eq!(a.send(b"late"), Err(ConnError::PeerClosed));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flow_control_under_load() {
    let Some((da, db)) = devices() else { return };
    let depth = 8;
    let cfg = Config { depth, frag_size: 1024, ..Config::default() };
    let (a, b) = pair(&da, &db, cfg.clone(), cfg);
    let (atx, _arx) = a.split();
    let (_btx, mut brx) = b.split();
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let s2 = sent.clone();
    const N: u32 = 3000;
    let producer = tokio::spawn(async move {
        for i in 0..N {
            // Mixed sizes: most fit one fragment, some span several.
            let len = if i % 10 == 0 { 3000 + (i as usize % 700) } else { 8 + (i as usize % 200) };
            let mut m = pattern(len, i as u8);
            m[..4].copy_from_slice(&i.to_be_bytes());
            atx.send(m).await.unwrap();
            s2.store(i + 1, std::sync::atomic::Ordering::SeqCst);
        }
        atx
    });
    // The receiver stalls: the sender must stop after about `depth` messages.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let ahead = sent.load(std::sync::atomic::Ordering::SeqCst);
    eprintln!("sender got {ahead} messages ahead of a stalled receiver (depth {depth})");
    assert!(ahead <= depth + 3, "flow control let {ahead} messages through with depth {depth}");
    // Now drain slowly, checking order and content.
    for i in 0..N {
        let m = brx.recv().await.unwrap();
        let len = if i % 10 == 0 { 3000 + (i as usize % 700) } else { 8 + (i as usize % 200) };
        assert_eq!(m.len(), len, "message {i}");
        assert_eq!(&m[..4], i.to_be_bytes(), "order");
        assert_eq!(&m[4..], &pattern(len, i as u8)[4..], "content of {i}");
        if i % 500 == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let _atx = producer.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_messages() {
    let Some((da, db)) = devices() else { return };
    let (a, b) = pair(&da, &db, Config::default(), Config { max_message: 8 << 20, ..Config::default() });
    let (atx, _arx) = a.split();
    let (_btx, mut brx) = b.split();
    assert_eq!(atx.max_message(), 8 << 20);
    let big = pattern(4 << 20, 7);
    let odd = pattern(1_000_003, 9);
    let t = Instant::now();
    let (b1, b2) = (big.clone(), odd.clone());
    let prod = tokio::spawn(async move {
        atx.send(b1).await.unwrap();
        atx.send(b2).await.unwrap();
        let e = atx.send(vec![0; (8 << 20) + 1]).await.unwrap_err();
        assert!(matches!(e, ConnError::TooLarge { .. }), "{e}");
        atx
    });
    assert!(brx.recv().await.unwrap() == big, "4 MiB message corrupted");
    assert!(brx.recv().await.unwrap() == odd, "odd-sized message corrupted");
    let dt = t.elapsed();
    eprintln!("5 MiB in {dt:?} ({:.1} MB/s)", 5.0 / dt.as_secs_f64());
    let _atx = prod.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_qp_destroyed() {
    let Some((da, db)) = devices() else { return };
    let cfg = Config::default();
    let limit = Duration::from_secs_f64(cfg.detection_time() * 4.0 + 0.3);
    let (a, b) = pair(&da, &db, cfg.clone(), cfg);
    let (atx, mut arx) = a.split();
    let (btx, mut brx) = b.split();
    atx.send(b"x".to_vec()).await.unwrap();
    assert_eq!(brx.recv().await.unwrap(), b"x");
    // b's process "crashes": its QP is destroyed without a CLOSE.
    btx.abort();
    tokio::time::sleep(Duration::from_millis(50)).await;
    drop(brx);
    let t = Instant::now();
    // a keeps talking (the broker sends heartbeats): its next sends fail.
    let pinger = tokio::spawn(async move {
        while atx.send(b"hb".to_vec()).await.is_ok() {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    });
    let e = tokio::time::timeout(Duration::from_secs(10), arx.recv()).await.expect("no error within 10 s").unwrap_err();
    let dt = t.elapsed();
    eprintln!("peer QP destroyed: error after {dt:?}: {e}");
    assert!(matches!(e, ConnError::WorkCompletion { name: "RETRY_EXC_ERR", .. }), "{e}");
    assert!(dt <= limit, "detection took {dt:?}, configured ~{limit:?}");
    pinger.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_link_down() {
    let Some((da, db)) = devices() else { return };
    if std::env::var("VIGIL_RDMA_LINKDOWN").as_deref() != Ok("1") {
        eprintln!(
            "link-down test skipped: VIGIL_RDMA_LINKDOWN is not 1 (it cuts veth1; ci/rdma-tests.sh runs it last)"
        );
        return;
    }
    let dev = std::env::var("RXE_NETDEV1").unwrap_or_else(|_| "veth1".into());
    let cfg = Config::default();
    let limit = Duration::from_secs_f64(cfg.detection_time() * 4.0 + 0.3);
    let (a, b) = pair(&da, &db, cfg.clone(), cfg);
    let (atx, mut arx) = a.split();
    let (btx, mut brx) = b.split();
    atx.send(b"x".to_vec()).await.unwrap();
    assert_eq!(brx.recv().await.unwrap(), b"x");
    let pinger = tokio::spawn(async move {
        while atx.send(b"hb".to_vec()).await.is_ok() {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    });
    let t = Instant::now();
    let st = std::process::Command::new("ip").args(["link", "set", &dev, "down"]).status().expect("ip");
    assert!(st.success());
    let down_at = t.elapsed();
    let ea =
        tokio::time::timeout(Duration::from_secs(10), arx.recv()).await.expect("a: no error within 10 s").unwrap_err();
    let dta = t.elapsed().saturating_sub(down_at);
    // b's own link is down: its sends fail locally, or the port error arrives as an async event.
    let _ = btx.send(b"y".to_vec()).await;
    let eb = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            // Heartbeats that arrived before the cut come first.
            if let Err(e) = brx.recv().await {
                return e;
            }
        }
    })
    .await
    .expect("b: no error within 10 s");
    let dtb = t.elapsed().saturating_sub(down_at);
    eprintln!("link {dev} down: a (peer side) error after {dta:?}: {ea}; b (own side) after {dtb:?}: {eb}");
    println!("RESULT linkdown_peer_ms={:.1} linkdown_own_ms={:.1}", dta.as_secs_f64() * 1e3, dtb.as_secs_f64() * 1e3);
    assert!(matches!(ea, ConnError::WorkCompletion { .. } | ConnError::AsyncEvent { .. }), "{ea}");
    assert!(dta <= limit, "detection took {dta:?}, configured ~{limit:?}");
    pinger.await.unwrap();
}
