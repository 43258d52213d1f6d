//! eBPF TCP connection watcher (IPv4).

use std::{
    net::{Ipv4Addr, SocketAddr, SocketAddrV4},
    pin::Pin,
    sync::Mutex,
    task::{Context, Poll},
};

use aya::{
    Ebpf, Pod,
    maps::{HashMap, MapData, MapError},
};

use crate::{
    EventChannel,
    error::{EbpfError, map_err},
    ring,
};

static TCP_OBJ: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/tcp.bpf.o"));
/// The same programs with a perf buffer instead of the ring buffer (`bpf/output.h`).
static TCP_PERFBUF_OBJ: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/tcp-perfbuf.bpf.o"));

/// A TCP connection seen from one local socket: (local addr:port,
/// remote addr:port). IPv4 only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TcpTuple {
    /// Local address and port.
    pub local: SocketAddrV4,
    /// Remote address and port.
    pub remote: SocketAddrV4,
}

impl TcpTuple {
    /// Tuple of a connected socket (`local_addr`, `peer_addr`); `None` for IPv6.
    pub fn of(local: SocketAddr, remote: SocketAddr) -> Option<TcpTuple> {
        match (local, remote) {
            (SocketAddr::V4(local), SocketAddr::V4(remote)) => Some(TcpTuple { local, remote }),
            _ => None,
        }
    }

    fn key(&self) -> RawTcpKey {
        RawTcpKey {
            saddr: u32::from_ne_bytes(self.local.ip().octets()),
            daddr: u32::from_ne_bytes(self.remote.ip().octets()),
            sport: self.local.port(),
            dport: self.remote.port(),
        }
    }

    fn from_key(k: &RawTcpKey) -> TcpTuple {
        TcpTuple {
            local: SocketAddrV4::new(Ipv4Addr::from(k.saddr.to_ne_bytes()), k.sport),
            remote: SocketAddrV4::new(Ipv4Addr::from(k.daddr.to_ne_bytes()), k.dport),
        }
    }
}

/// What happened to a watched connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TcpEventKind {
    /// An RST was received (`tcp/tcp_receive_reset`).
    Reset,
    /// State change towards closing (`sock/inet_sock_set_state` into
    /// FIN_WAIT1 = 4 (we closed), CLOSE_WAIT = 8 (peer closed) or
    /// CLOSE = 7 (gone; the watch is then dropped by the BPF program)).
    /// States are the kernel's `TCP_*` numbers.
    Close {
        /// State before.
        old_state: i32,
        /// State after.
        new_state: i32,
    },
    /// A segment was retransmitted (`tcp/tcp_retransmit_skb`), with the
    /// socket state at that time.
    Retransmit {
        /// Kernel `TCP_*` state.
        state: i32,
    },
}

/// One TCP event for a watched tuple.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpEvent {
    /// The watched tuple.
    pub tuple: TcpTuple,
    /// What happened.
    pub kind: TcpEventKind,
    /// `CLOCK_MONOTONIC` ns when the tracepoint fired.
    pub ktime_ns: u64,
    /// tgid current when it fired (0 / unrelated when run from softirq).
    pub pid: u32,
}

/// `struct vigil_tcp_key` (bpf/events.h): addresses network order, ports host order.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct RawTcpKey {
    saddr: u32,
    daddr: u32,
    sport: u16,
    dport: u16,
}

// SAFETY: `RawTcpKey` is `#[repr(C)]`, made only of integers, and has no
// padding (4+4+2+2 = 12 bytes, align 4), so every byte pattern is valid and
// it can be copied to/from the kernel as the BPF map key.
unsafe impl Pod for RawTcpKey {}

/// `struct vigil_tcp_event` (bpf/events.h).
#[repr(C)]
#[derive(Clone, Copy)]
struct RawTcpEvent {
    ktime_ns: u64,
    key: RawTcpKey,
    kind: u32,
    oldstate: i32,
    newstate: i32,
    pid: u32,
}

const _: () = assert!(size_of::<RawTcpKey>() == 12);
const _: () = assert!(size_of::<RawTcpEvent>() == 40);

const KIND_RESET: u32 = 1;
const KIND_CLOSE: u32 = 2;
const KIND_RETRANSMIT: u32 = 3;

/// eBPF TCP watcher: reports resets, close transitions and retransmits of
/// watched IPv4 connections. Needs root and a tokio runtime.
pub struct TcpWatcher {
    watched: Mutex<HashMap<MapData, RawTcpKey, u8>>,
    events: ring::Events,
    // The tracepoint links, pinned: dropping removes the pins, and the kernel detaches in the background.
    _links: ring::LinkPins,
    // Owns the programs (and their links where they could not be pinned; dropping detaches those).
    _bpf: Ebpf,
}

impl std::fmt::Debug for TcpWatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpWatcher").finish_non_exhaustive()
    }
}

impl TcpWatcher {
    /// Loads and attaches `bpf/tcp.bpf.c` to `sock/inet_sock_set_state`,
    /// `tcp/tcp_retransmit_skb` and `tcp/tcp_receive_reset` (the ring buffer variant).
    pub fn new() -> Result<TcpWatcher, EbpfError> {
        Self::with_channel(EventChannel::RingBuffer)
    }

    /// Like [`new`](Self::new), with the variant of the programs that hands events over through `channel`
    /// (the perf buffer one for kernels without the BPF ring buffer, see [`plan`](crate::plan)).
    pub fn with_channel(channel: EventChannel) -> Result<TcpWatcher, EbpfError> {
        let object = match channel {
            EventChannel::RingBuffer => TCP_OBJ,
            EventChannel::PerfBuffer => TCP_PERFBUF_OBJ,
        };
        let mut bpf = ring::load(object)?;
        let mut pins = ring::LinkPins::default();
        ring::attach_tracepoint(&mut bpf, &mut pins, "vigil_inet_sock_set_state", "sock", "inet_sock_set_state")?;
        ring::attach_tracepoint(&mut bpf, &mut pins, "vigil_tcp_retransmit_skb", "tcp", "tcp_retransmit_skb")?;
        ring::attach_tracepoint(&mut bpf, &mut pins, "vigil_tcp_receive_reset", "tcp", "tcp_receive_reset")?;
        let map = bpf.take_map("WATCHED_TCP").ok_or(EbpfError::Missing("WATCHED_TCP"))?;
        let watched = HashMap::try_from(map).map_err(map_err("WATCHED_TCP"))?;
        let events = ring::take_events(&mut bpf, "TCP_EVENTS", channel)?;
        Ok(TcpWatcher { watched: Mutex::new(watched), events, _links: pins, _bpf: bpf })
    }

    /// Starts watching a connection (from the local socket's point of view).
    pub fn watch(&self, tuple: TcpTuple) -> Result<(), EbpfError> {
        self.map().insert(tuple.key(), 1, 0).map_err(map_err("WATCHED_TCP"))
    }

    /// Stops watching; not an error if not watched (or already closed).
    pub fn unwatch(&self, tuple: TcpTuple) -> Result<(), EbpfError> {
        match self.map().remove(&tuple.key()) {
            Ok(()) | Err(MapError::KeyNotFound) => Ok(()),
            Err(e) => Err(map_err("WATCHED_TCP")(e)),
        }
    }

    /// Waits for the next event.
    pub async fn next_event(&mut self) -> Option<TcpEvent> {
        std::future::poll_fn(|cx| self.poll_next_event(cx)).await
    }

    /// Poll form of [`next_event`](Self::next_event).
    pub fn poll_next_event(&mut self, cx: &mut Context<'_>) -> Poll<Option<TcpEvent>> {
        loop {
            let raw = match ring::poll_events::<RawTcpEvent>(&mut self.events, cx) {
                Poll::Ready(Some(r)) => r,
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Pending => return Poll::Pending,
            };
            let kind = match raw.kind {
                KIND_RESET => TcpEventKind::Reset,
                KIND_CLOSE => TcpEventKind::Close { old_state: raw.oldstate, new_state: raw.newstate },
                KIND_RETRANSMIT => TcpEventKind::Retransmit { state: raw.newstate },
                _ => continue,
            };
            return Poll::Ready(Some(TcpEvent {
                tuple: TcpTuple::from_key(&raw.key),
                kind,
                ktime_ns: raw.ktime_ns,
                pid: raw.pid,
            }));
        }
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<MapData, RawTcpKey, u8>> {
        self.watched.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl futures_core::Stream for TcpWatcher {
    type Item = TcpEvent;
    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<TcpEvent>> {
        self.get_mut().poll_next_event(cx)
    }
}
