//! Two endpoints in one process over loopback, on `tcp;ofi_rxm` (and `udp;ofi_rxd`): messages both ways, more
//! messages than posted receives, large messages, a peer that vanishes, and the "no provider" answer. In a
//! build without libfabric (`VIGIL_OFI=off`, or no libfabric-dev), every test checks the "not available"
//! answer instead.

use std::time::{Duration, Instant};
use vigil_ofi::{AsyncEndpoint, Config, Endpoint, Error, Event, OpenError, PeerId};

const TCP: &str = "tcp;ofi_rxm";
const UDP: &str = "udp;ofi_rxd";
/// Longest any exchange in these tests may take before it counts as a hang.
const HANG: Duration = Duration::from_secs(20);

/// Environment: a provider to run the exchange tests on as well (e.g. `cxi` or `verbs;ofi_rxm` on a machine that
/// has one), and the local address or domain for it (`VIGIL_OFI_TEST_SOURCE`, e.g. `cxi0`; unset: the
/// provider's choice); `VIGIL_OFI_TEST_SOURCE2`, when set, is the second endpoint's (e.g. the other soft-RoCE
/// device's address, so the exchange crosses a wire).
const SITE_PROVIDER: &str = "VIGIL_OFI_TEST_PROVIDER";

fn cfg(provider: &str) -> Config {
    site_cfg(provider, "VIGIL_OFI_TEST_SOURCE")
}

/// The second endpoint of a pair: like [`cfg`], on `VIGIL_OFI_TEST_SOURCE2` when that is set.
fn cfg2(provider: &str) -> Config {
    if std::env::var_os("VIGIL_OFI_TEST_SOURCE2").is_some() {
        site_cfg(provider, "VIGIL_OFI_TEST_SOURCE2")
    } else {
        cfg(provider)
    }
}

fn site_cfg(provider: &str, source_var: &str) -> Config {
    let site = std::env::var(SITE_PROVIDER).ok().filter(|p| p == provider);
    let source_addr = if site.is_some() { std::env::var(source_var).ok() } else { Some("127.0.0.1".into()) };
    Config { source_addr, ..Config::with_provider(provider) }
}

/// Open an endpoint, or `None` in a build without libfabric (after checking that answer).
fn open(c: &Config) -> Option<Endpoint> {
    match Endpoint::open(c) {
        Ok(e) => Some(e),
        Err(OpenError::Unavailable(why)) => {
            assert!(vigil_ofi::library().is_err(), "Unavailable from a build with libfabric: {why}");
            eprintln!("libfabric not available in this build: {why}");
            None
        }
        Err(e) => panic!("opening {}: {e}", c.provider),
    }
}

/// Two endpoints that know each other: (a, b, b as seen by a, a as seen by b).
fn pair(ca: &Config, cb: &Config) -> Option<(Endpoint, Endpoint, PeerId, PeerId)> {
    let mut a = open(ca)?;
    let mut b = open(cb)?;
    let (na, nb) = (a.name().unwrap(), b.name().unwrap());
    let b_at_a = a.insert_peer(&nb).unwrap();
    let a_at_b = b.insert_peer(&na).unwrap();
    eprintln!("{}: a = {}, b = {}", a.provider(), a.name_to_string(&na), a.name_to_string(&nb));
    Some((a, b, b_at_a, a_at_b))
}

/// Progress both endpoints until `want` messages arrived at `rx`; returns them (asserting no other event).
fn collect(rx: &mut Endpoint, other: &mut Endpoint, want: usize) -> Vec<(PeerId, Vec<u8>)> {
    let start = Instant::now();
    let mut got = Vec::new();
    while got.len() < want {
        assert!(start.elapsed() < HANG, "only {} of {want} messages after {HANG:?}", got.len());
        other.progress().unwrap();
        while let Some(e) = rx.poll_event().unwrap() {
            match e {
                Event::Message { from, data } => got.push((from, data)),
                e => panic!("unexpected event {e:?}"),
            }
        }
    }
    got
}

/// `try_send`, progressing both endpoints while the send queue is full.
fn send(tx: &mut Endpoint, other: &mut Endpoint, to: PeerId, data: &[u8]) {
    let start = Instant::now();
    loop {
        match tx.try_send(to, data) {
            Ok(()) => return,
            Err(Error::WouldBlock { .. }) => {
                assert!(start.elapsed() < HANG, "send queue still full after {HANG:?}");
                tx.progress().unwrap();
                other.progress().unwrap();
            }
            Err(e) => panic!("{e}"),
        }
    }
}

fn pattern(seed: u32, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2654435761).wrapping_add(1);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

fn both_ways(provider: &str) {
    let Some((mut a, mut b, pb, pa)) = pair(&cfg(provider), &cfg2(provider)) else { return };
    a.try_send(pb, b"hello from a").unwrap();
    let got = collect(&mut b, &mut a, 1);
    assert_eq!(got, vec![(pa, b"hello from a".to_vec())]);
    b.try_send(pa, b"hello from b").unwrap();
    b.try_send(pa, b"").unwrap();
    let got = collect(&mut a, &mut b, 2);
    assert_eq!(got, vec![(pb, b"hello from b".to_vec()), (pb, Vec::new())]);
    assert_eq!(a.stats().messages_received, 2);
    assert_eq!(b.stats().messages_sent, 2);
}

#[test]
fn tcp_messages_both_ways() {
    both_ways(TCP);
}

#[test]
fn udp_messages_both_ways() {
    both_ways(UDP);
}

/// Far more messages than receive buffers, sent while the receiver does not read at all, then read: nothing
/// lost, nothing reordered, and the sender is told to wait (WouldBlock) instead of piling up without bound.
fn flow_control(provider: &str) {
    let small = |c: Config| Config { rx_depth: 4, tx_depth: 4, frag_size: 1024, send_queue_limit: 16 * 1024, ..c };
    let Some((mut a, mut b, pb, pa)) = pair(&small(cfg(provider)), &small(cfg2(provider))) else { return };
    const N: u32 = 3000;
    let mut sent = 0u32;
    let mut would_block = 0u32;
    let start = Instant::now();
    // Phase 1: the receiver is never progressed while the sender pushes for a while.
    while sent < N && start.elapsed() < Duration::from_millis(500) {
        let m = pattern(sent, (sent as usize * 37) % 3000);
        match a.try_send(pb, &m) {
            Ok(()) => sent += 1,
            Err(Error::WouldBlock { .. }) => {
                would_block += 1;
                a.progress().unwrap();
            }
            Err(e) => panic!("{e}"),
        }
    }
    eprintln!("{provider}: {sent} messages accepted before the receiver read anything, {would_block} WouldBlock");
    assert!(would_block > 0, "a sender facing a receiver that never reads must be held back");
    // Phase 2: both progress; the sender finishes.
    let mut got = Vec::new();
    while got.len() < N as usize {
        assert!(start.elapsed() < HANG, "{} of {N} messages after {HANG:?}", got.len());
        if sent < N {
            let m = pattern(sent, (sent as usize * 37) % 3000);
            match a.try_send(pb, &m) {
                Ok(()) => sent += 1,
                Err(Error::WouldBlock { .. }) => {}
                Err(e) => panic!("{e}"),
            }
        }
        a.progress().unwrap();
        while let Some(e) = b.poll_event().unwrap() {
            match e {
                Event::Message { from, data } => got.push((from, data)),
                e => panic!("unexpected event {e:?}"),
            }
        }
    }
    for (i, (from, data)) in got.iter().enumerate() {
        assert_eq!(*from, pa);
        assert_eq!(*data, pattern(i as u32, (i * 37) % 3000), "message {i}");
    }
    assert_eq!(b.stats().unknown_source, 0);
}

#[test]
fn tcp_more_messages_than_posted_receives() {
    flow_control(TCP);
}

#[test]
fn udp_more_messages_than_posted_receives() {
    flow_control(UDP);
}

fn large(provider: &str) {
    let Some((mut a, mut b, pb, pa)) = pair(&cfg(provider), &cfg2(provider)) else { return };
    let big = pattern(7, 8 << 20);
    let odd = pattern(8, 3 * 64 * 1024 + 1);
    a.try_send(pb, &big).unwrap();
    send(&mut a, &mut b, pb, b"after");
    send(&mut b, &mut a, pa, &odd);
    let got = collect(&mut b, &mut a, 2);
    assert_eq!(got[0].1.len(), big.len());
    assert!(got[0].1 == big, "8 MiB message corrupted");
    assert_eq!(got[1].1, b"after");
    let got = collect(&mut a, &mut b, 1);
    assert!(got[0].1 == odd);
}

#[test]
fn tcp_large_messages() {
    large(TCP);
}

#[test]
fn udp_large_messages() {
    large(UDP);
}

#[test]
fn oversized_message_is_discarded_and_reported() {
    let limited = Config { max_message: 100_000, ..cfg(TCP) };
    let Some((mut a, mut b, pb, pa)) = pair(&cfg(TCP), &limited) else { return };
    a.try_send(pb, &pattern(1, 300_000)).unwrap();
    a.try_send(pb, b"next").unwrap();
    let start = Instant::now();
    let mut events = Vec::new();
    while events.len() < 2 {
        assert!(start.elapsed() < HANG);
        a.progress().unwrap();
        events.extend(b.poll_event().unwrap());
    }
    assert!(matches!(events[0], Event::Oversized { from, len } if from == pa && len > 100_000), "{events:?}");
    assert_eq!(events[1], Event::Message { from: pa, data: b"next".to_vec() });
    // Sending more than one's own limit is refused at once.
    assert!(matches!(b.try_send(pa, &[0; 100_001]), Err(Error::TooLarge { .. })));
}

/// A peer whose endpoint closes: sends to it end in an error completion (reported once as PeerFailed) or
/// nothing, never a hang, and closing our own endpoint afterwards returns promptly.
fn vanished(provider: &str) {
    let Some((mut a, mut b, pb, _pa)) = pair(&cfg(provider), &cfg2(provider)) else { return };
    a.try_send(pb, b"are you there").unwrap();
    collect(&mut b, &mut a, 1);
    drop(b);
    let start = Instant::now();
    let mut failed = None;
    let mut refused = 0;
    while start.elapsed() < Duration::from_secs(3) && failed.is_none() {
        match a.try_send(pb, b"still there?") {
            Ok(()) | Err(Error::WouldBlock { .. }) => {}
            Err(Error::PeerFailed { .. }) => refused += 1,
            Err(e) => panic!("{e}"),
        }
        while let Some(e) = a.poll_event().unwrap() {
            match e {
                Event::PeerFailed { peer, error } => {
                    assert_eq!(peer, pb);
                    failed = Some((start.elapsed(), error));
                }
                e => panic!("unexpected {e:?}"),
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    match &failed {
        Some((t, e)) => eprintln!("{provider}: peer failure reported after {t:?}: {e}"),
        None => eprintln!("{provider}: no error within 3 s for a vanished peer (queued {})", a.queued()),
    }
    let _ = refused;
    let t = Instant::now();
    drop(a);
    eprintln!("{provider}: closing the endpoint took {:?}", t.elapsed());
    assert!(t.elapsed() < Duration::from_secs(5), "teardown took {:?}", t.elapsed());
}

#[test]
fn tcp_vanished_peer() {
    vanished(TCP);
}

#[test]
fn udp_vanished_peer() {
    vanished(UDP);
}

#[test]
fn no_such_provider_is_a_clear_error() {
    match Endpoint::open(&Config::with_provider("nosuch;ofi_rxm")) {
        Err(OpenError::NoProvider { provider, .. }) => assert_eq!(provider, "nosuch;ofi_rxm"),
        Err(OpenError::Unavailable(why)) => assert!(vigil_ofi::library().is_err(), "{why}"),
        Ok(e) => panic!("opened provider {}", e.provider()),
        Err(e) => panic!("{e}"),
    }
    let msg = Endpoint::open(&Config::with_provider("nosuch")).err().unwrap().to_string();
    assert!(msg.contains("nosuch") || msg.contains("not available"), "{msg}");
    eprintln!("{msg}");
}

#[test]
fn availability_is_reported() {
    match vigil_ofi::library() {
        Ok(l) => {
            eprintln!("libfabric built against {}, running {:?}", l.built_against, l.runtime);
            assert!(l.runtime.0 >= 1);
        }
        Err(why) => {
            assert!(matches!(Endpoint::open(&Config::default()), Err(OpenError::Unavailable(w)) if w == why));
        }
    }
}

/// The tokio face: ping-pong between two tasks, then a burst that needs the send queue, then the peer's
/// failure surfacing from `next_event`.
fn async_pingpong(provider: &str) {
    let Some((a, b, pb, pa)) = pair(&cfg(provider), &cfg2(provider)) else { return };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let mut a = AsyncEndpoint::new(a).unwrap();
        let mut b = AsyncEndpoint::new(b).unwrap();
        let echo = tokio::spawn(async move {
            loop {
                match b.next_event().await.unwrap() {
                    Event::Message { from, data } if data == b"stop" => {
                        b.send(from, b"stopped").await.unwrap();
                        b.flush().await.unwrap();
                        return b;
                    }
                    Event::Message { from, data } => b.send(from, &data).await.unwrap(),
                    e => panic!("{e:?}"),
                }
            }
        });
        let mut rtts = Vec::new();
        for i in 0..2000u32 {
            let m = i.to_le_bytes();
            let t = Instant::now();
            a.send(pb, &m).await.unwrap();
            match tokio::time::timeout(HANG, a.next_event()).await.expect("echo hang").unwrap() {
                Event::Message { from, data } => {
                    assert_eq!(from, pb);
                    assert_eq!(data, m);
                }
                e => panic!("{e:?}"),
            }
            rtts.push(t.elapsed());
        }
        rtts.sort();
        eprintln!(
            "{provider}: async round trip (8 B) median {:?}, p90 {:?}, max {:?}",
            rtts[rtts.len() / 2],
            rtts[rtts.len() * 9 / 10],
            rtts[rtts.len() - 1]
        );
        // A burst larger than the send slots and the queue limit: send() waits, nothing is lost.
        let n = 300u32;
        for i in 0..n {
            a.send(pb, &pattern(i, 70_000)).await.unwrap();
        }
        for i in 0..n {
            match tokio::time::timeout(HANG, a.next_event()).await.expect("burst hang").unwrap() {
                Event::Message { data, .. } => assert!(data == pattern(i, 70_000), "burst message {i}"),
                e => panic!("{e:?}"),
            }
        }
        a.send(pb, b"stop").await.unwrap();
        match tokio::time::timeout(HANG, a.next_event()).await.unwrap().unwrap() {
            Event::Message { data, .. } => assert_eq!(data, b"stopped"),
            e => panic!("{e:?}"),
        }
        let b = echo.await.unwrap();
        let _ = pa;
        drop(b);
    });
}

#[test]
fn tcp_async_pingpong() {
    async_pingpong(TCP);
}

#[test]
fn udp_async_pingpong() {
    async_pingpong(UDP);
}

/// The exchange tests on the provider named by `VIGIL_OFI_TEST_PROVIDER` (nothing when unset).
#[test]
fn site_provider() {
    let Ok(p) = std::env::var(SITE_PROVIDER) else { return };
    both_ways(&p);
    flow_control(&p);
    large(&p);
    async_pingpong(&p);
    vanished(&p);
}
