//! TCP watcher on a loopback pair, and across two network namespaces this test creates (a veth pair in
//! 10.200.251.0/24, and 10.200.252.0/24 for the perf buffer variant) for retransmits, which loopback never needs. Run as root.

use std::{
    io::Write,
    net::{TcpListener, TcpStream},
    os::fd::AsRawFd,
    process::Command,
    time::Duration,
};

use vigil_ebpf::{EventChannel, TcpEvent, TcpEventKind, TcpTuple, TcpWatcher};

mod netns;
use netns::{Netns, in_ns, ip};

const TCP_ESTABLISHED: i32 = 1;
const TCP_CLOSE: i32 = 7;
const TCP_CLOSE_WAIT: i32 = 8;

fn pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (s, _) = l.accept().unwrap();
    (c, s)
}

fn tuple(s: &TcpStream) -> TcpTuple {
    TcpTuple::of(s.local_addr().unwrap(), s.peer_addr().unwrap()).unwrap()
}

async fn next(w: &mut TcpWatcher, ms: u64) -> Option<TcpEvent> {
    tokio::time::timeout(Duration::from_millis(ms), w.next_event()).await.ok().flatten()
}

async fn orderly_close_reports_close_wait_then_close(channel: EventChannel) {
    let mut w = TcpWatcher::with_channel(channel).unwrap();
    let (client, server) = pair();
    let t = tuple(&client);
    w.watch(t).unwrap();
    drop(server); // FIN to the client
    let ev = next(&mut w, 2000).await.expect("close-wait event");
    eprintln!("{ev:?}");
    assert_eq!(ev.tuple, t);
    assert_eq!(ev.kind, TcpEventKind::Close { old_state: TCP_ESTABLISHED, new_state: TCP_CLOSE_WAIT });
    drop(client); // LAST_ACK -> CLOSE once the server's stack ACKs
    let ev = next(&mut w, 2000).await.expect("close event");
    eprintln!("{ev:?}");
    assert_eq!(ev.tuple, t);
    assert!(matches!(ev.kind, TcpEventKind::Close { new_state: TCP_CLOSE, .. }), "{ev:?}");
    assert!(next(&mut w, 200).await.is_none());
}

async fn abortive_close_reports_reset(channel: EventChannel) {
    let mut w = TcpWatcher::with_channel(channel).unwrap();
    let (client, server) = pair();
    let t = tuple(&client);
    w.watch(t).unwrap();
    let linger = libc::linger { l_onoff: 1, l_linger: 0 };
    // SAFETY: valid socket fd, pointer/length describe a live `linger` struct.
    let rc = unsafe {
        libc::setsockopt(
            server.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&raw const linger).cast(),
            size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0);
    drop(server); // linger 0 => RST
    let ev = next(&mut w, 2000).await.expect("reset event");
    eprintln!("{ev:?}");
    assert_eq!(ev.tuple, t);
    assert_eq!(ev.kind, TcpEventKind::Reset);
    let ev = next(&mut w, 2000).await.expect("close event");
    eprintln!("{ev:?}");
    assert_eq!(ev.kind, TcpEventKind::Close { old_state: TCP_ESTABLISHED, new_state: TCP_CLOSE });
    drop(client);
}

async fn unwatched_connection_is_silent(channel: EventChannel) {
    let mut w = TcpWatcher::with_channel(channel).unwrap();
    let (client, server) = pair();
    let (c2, s2) = pair();
    w.watch(tuple(&c2)).unwrap();
    w.unwatch(tuple(&c2)).unwrap();
    drop(server);
    drop(client);
    drop(s2);
    drop(c2);
    assert!(next(&mut w, 300).await.is_none());
}

/// A peer whose kernel stops taking the connection's segments (its address removed: they are dropped on
/// arrival) makes the sender retransmit, and the watcher reports it (`tcp/tcp_retransmit_skb`, whose record
/// changed type in Linux 6.17: this runs on both shapes).
async fn unanswered_data_reports_a_retransmit(channel: EventChannel) {
    // Names and subnet of their own per variant: the two run at the same time.
    let (a, b, dev_a, dev_b, net) = match channel {
        EventChannel::RingBuffer => ("vgtcp-a", "vgtcp-b", "vgtcpa0", "vgtcpb0", "10.200.251"),
        EventChannel::PerfBuffer => ("vgtcpp-a", "vgtcpp-b", "vgtcppa0", "vgtcppb0", "10.200.252"),
    };
    let _ns = Netns(vec![a.to_string(), b.to_string()]);
    for n in [a, b] {
        let _ = Command::new("ip").args(["netns", "del", n]).status();
        ip(&format!("netns add {n}"));
    }
    ip(&format!("link add {dev_a} netns {a} type veth peer name {dev_b} netns {b}"));
    ip(&format!("-n {a} addr add {net}.1/24 dev {dev_a}"));
    ip(&format!("-n {b} addr add {net}.2/24 dev {dev_b}"));
    ip(&format!("-n {a} link set {dev_a} up"));
    ip(&format!("-n {b} link set {dev_b} up"));
    let listener = in_ns(b, move || TcpListener::bind(format!("{net}.2:0")).unwrap());
    let to = listener.local_addr().unwrap();
    let mut client = in_ns(a, move || TcpStream::connect(to).unwrap());
    let (server, _) = listener.accept().unwrap();
    let t = tuple(&client);
    let mut w = TcpWatcher::with_channel(channel).unwrap();
    w.watch(t).unwrap();
    ip(&format!("-n {b} addr del {net}.2/24 dev {dev_b}"));
    client.write_all(b"unanswered").unwrap();
    // The first retransmission comes after the minimum RTO (200 ms); allow for a slow (emulated) machine.
    let ev = next(&mut w, 10_000).await.expect("retransmit event");
    eprintln!("{ev:?}");
    assert_eq!(ev.tuple, t);
    assert_eq!(ev.kind, TcpEventKind::Retransmit { state: TCP_ESTABLISHED });
    drop(server);
}

/// Each test with the ring buffer (the default objects) and with the perf buffer variant of kernels before 5.8.
macro_rules! both_channels {
    ($($name:ident),*) => {
        $(mod $name {
            use super::EventChannel;
            #[tokio::test]
            async fn ring_buffer() {
                super::$name(EventChannel::RingBuffer).await
            }
            #[tokio::test]
            async fn perf_buffer() {
                super::$name(EventChannel::PerfBuffer).await
            }
        })*
    };
}
both_channels!(
    orderly_close_reports_close_wait_then_close,
    abortive_close_reports_reset,
    unwatched_connection_is_silent,
    unanswered_data_reports_a_retransmit
);
