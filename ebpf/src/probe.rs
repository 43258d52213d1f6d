//! Heartbeat probes: the packet a parent sends to a child node's responder, and the userspace responder used
//! when the XDP one cannot run.
//!
//! Layout (`bpf/probe.h`, 48 bytes, network byte order), one UDP datagram each way:
//! `magic "VGHB" | version 1 | type | flags | seq | rank | sent_ns | hb_age_ns | answered`.
//! A request carries `seq`, `rank` (the prober's id for the child) and `sent_ns` (the prober's clock); the reply
//! echoes them and fills `flags` (alive), `hb_age_ns` (time since the broker's last userspace heartbeat) and
//! `answered` (probes answered so far for that broker).

use std::{
    net::UdpSocket,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
};

use crate::sys::monotonic_ns;

/// `magic` of every probe ("VGHB").
pub(crate) const PROBE_MAGIC: u32 = 0x5647_4842;
/// Current probe layout version.
pub(crate) const PROBE_VERSION: u8 = 1;
/// Size of a probe datagram, bytes.
pub const PROBE_LEN: usize = 48;
/// Reply flag: the broker process is alive.
pub const FLAG_ALIVE: u16 = 1;
/// Reply flag: nothing is registered on the probed port.
pub const FLAG_UNKNOWN: u16 = 2;

/// Who produced a probe datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeKind {
    /// A parent's request.
    Request,
    /// Answered in the child node's kernel (XDP): proves the node is up even if its broker is stalled.
    ReplyKernel,
    /// Answered by the child broker's userspace thread: proves the broker process runs.
    ReplyUserspace,
    /// A parent's request to all its children at once, sent to an IP multicast group: answered (with a unicast
    /// [`ReplyKernel`](Self::ReplyKernel)) by the kernel of every node that learned this parent from an earlier
    /// unicast [`Request`](Self::Request); others ignore it.
    Group,
}

impl ProbeKind {
    fn code(self) -> u8 {
        match self {
            ProbeKind::Request => 1,
            ProbeKind::ReplyKernel => 2,
            ProbeKind::ReplyUserspace => 3,
            ProbeKind::Group => 4,
        }
    }
    fn from_code(c: u8) -> Option<ProbeKind> {
        Some(match c {
            1 => ProbeKind::Request,
            2 => ProbeKind::ReplyKernel,
            3 => ProbeKind::ReplyUserspace,
            4 => ProbeKind::Group,
            _ => return None,
        })
    }
}

/// A decoded probe datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Probe {
    /// Request or reply, and by whom.
    pub kind: ProbeKind,
    /// Reply flags ([`FLAG_ALIVE`], [`FLAG_UNKNOWN`]).
    pub flags: u16,
    /// Sequence number chosen by the prober, echoed.
    pub seq: u32,
    /// The prober's id for the child (its rank), echoed.
    pub rank: u32,
    /// The prober's `CLOCK_MONOTONIC` ns when it sent the request, echoed.
    pub sent_ns: u64,
    /// Reply: nanoseconds since the child broker's last userspace heartbeat.
    pub hb_age_ns: u64,
    /// Reply: probes answered so far for that broker.
    pub answered: u64,
}

impl Probe {
    /// A request for child `rank`.
    pub fn request(seq: u32, rank: u32, sent_ns: u64) -> Probe {
        Probe { kind: ProbeKind::Request, flags: 0, seq, rank, sent_ns, hb_age_ns: 0, answered: 0 }
    }

    /// A group request (to every child that learned this parent), sequence `seq`.
    pub fn group(seq: u32, sent_ns: u64) -> Probe {
        Probe { kind: ProbeKind::Group, flags: 0, seq, rank: 0, sent_ns, hb_age_ns: 0, answered: 0 }
    }

    /// Whether the reply says the broker process is alive.
    pub fn alive(&self) -> bool {
        self.flags & FLAG_ALIVE != 0
    }

    /// Wire form (48 bytes, network byte order).
    pub fn encode(&self) -> [u8; PROBE_LEN] {
        let mut b = [0u8; PROBE_LEN];
        b[0..4].copy_from_slice(&PROBE_MAGIC.to_be_bytes());
        b[4] = PROBE_VERSION;
        b[5] = self.kind.code();
        b[6..8].copy_from_slice(&self.flags.to_be_bytes());
        b[8..12].copy_from_slice(&self.seq.to_be_bytes());
        b[12..16].copy_from_slice(&self.rank.to_be_bytes());
        b[16..24].copy_from_slice(&self.sent_ns.to_be_bytes());
        b[24..32].copy_from_slice(&self.hb_age_ns.to_be_bytes());
        b[32..40].copy_from_slice(&self.answered.to_be_bytes());
        b
    }

    /// Parses a datagram; `None` if it is not a probe of this version (anyone can send us UDP).
    pub fn decode(b: &[u8]) -> Option<Probe> {
        if b.len() < PROBE_LEN {
            return None;
        }
        let u32_at = |i: usize| u32::from_be_bytes(b[i..i + 4].try_into().unwrap_or([0; 4]));
        let u64_at = |i: usize| u64::from_be_bytes(b[i..i + 8].try_into().unwrap_or([0; 8]));
        if u32_at(0) != PROBE_MAGIC || b[4] != PROBE_VERSION {
            return None;
        }
        Some(Probe {
            kind: ProbeKind::from_code(b[5])?,
            flags: u16::from_be_bytes([b[6], b[7]]),
            seq: u32_at(8),
            rank: u32_at(12),
            sent_ns: u64_at(16),
            hb_age_ns: u64_at(24),
            answered: u64_at(32),
        })
    }
}

/// The broker's userspace heartbeat clock: the broker's main loop calls [`beat`](Self::beat) every tick; a
/// responder reports the age of the last beat. Shared with the userspace responder thread.
#[derive(Debug, Default)]
pub struct HeartbeatClock(AtomicU64);

impl HeartbeatClock {
    /// Records a heartbeat now (`CLOCK_MONOTONIC`).
    pub fn beat(&self) {
        self.0.store(monotonic_ns(), Ordering::Relaxed);
    }
    /// `CLOCK_MONOTONIC` ns of the last beat (0 = never).
    pub fn last_ns(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Userspace fallback responder: a thread answering probes on a UDP socket with the age of the broker's last
/// heartbeat. Unlike the XDP responder it stops answering when the whole broker process is stopped, so a prober
/// must not treat its silence as a dead node. Stops when dropped.
#[derive(Debug)]
pub struct UserspaceResponder {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    port: u16,
    /// The same socket, to wake the thread's blocking receive when dropped.
    waker: UdpSocket,
}

impl UserspaceResponder {
    /// Answers probes arriving on `socket` (already bound) using `clock`. Errors if the socket cannot be
    /// configured or the thread cannot start.
    pub fn spawn(socket: UdpSocket, clock: Arc<HeartbeatClock>) -> std::io::Result<UserspaceResponder> {
        let port = socket.local_addr()?.port();
        // No read timeout: `drop` wakes the thread by shutting the socket down (a timeout made every broker's
        // exit wait for it, up to its length).
        socket.set_read_timeout(None)?;
        let waker = socket.try_clone()?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::Builder::new().name("vigil-responder".into()).spawn(move || {
            let mut buf = [0u8; 128];
            let mut answered = 0u64;
            while !stop2.load(Ordering::Relaxed) {
                let Some((n, from)) = recv_from_v4(&socket, &mut buf) else { continue };
                let Some(p) = Probe::decode(&buf[..n]) else { continue };
                if p.kind != ProbeKind::Request {
                    continue;
                }
                answered += 1;
                let last = clock.last_ns();
                let reply = Probe {
                    kind: ProbeKind::ReplyUserspace,
                    flags: FLAG_ALIVE,
                    hb_age_ns: monotonic_ns().saturating_sub(last),
                    answered,
                    ..p
                };
                let _ = socket.send_to(&reply.encode(), from);
            }
        })?;
        Ok(UserspaceResponder { stop, thread: Some(thread), port, waker })
    }

    /// UDP port it answers on.
    pub fn port(&self) -> u16 {
        self.port
    }
}

/// One datagram from an IPv4 sender: (length, sender). `None` on an error, and after `shutdown`, when the receive
/// returns with no sender address (on which std's `recv_from` asserts).
fn recv_from_v4(socket: &UdpSocket, buf: &mut [u8]) -> Option<(usize, std::net::SocketAddrV4)> {
    use std::os::fd::AsRawFd;
    // SAFETY: sockaddr_in is plain old data; all-zero is valid (the kernel fills it).
    let mut sa: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: `buf` and `sa` are valid for writes of the lengths passed, for the duration of the call.
    let n = unsafe {
        libc::recvfrom(
            socket.as_raw_fd(),
            buf.as_mut_ptr() as *mut libc::c_void,
            buf.len(),
            0,
            &mut sa as *mut libc::sockaddr_in as *mut libc::sockaddr,
            &mut len,
        )
    };
    if n < 0 || (len as usize) < std::mem::size_of::<libc::sockaddr_in>() || sa.sin_family as i32 != libc::AF_INET {
        return None;
    }
    let ip = std::net::Ipv4Addr::from(u32::from_be(sa.sin_addr.s_addr));
    Some((n as usize, std::net::SocketAddrV4::new(ip, u16::from_be(sa.sin_port))))
}

impl Drop for UserspaceResponder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // shutdown(2) on a UDP socket, even unconnected, wakes a blocked receive (which then returns at once);
        // Linux reports ENOTCONN for an unconnected one but performs it.
        // SAFETY: shutdown on a descriptor we own; no memory is passed.
        unsafe { libc::shutdown(std::os::fd::AsRawFd::as_raw_fd(&self.waker), libc::SHUT_RDWR) };
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_garbage() {
        let p = Probe {
            kind: ProbeKind::ReplyKernel,
            flags: FLAG_ALIVE,
            seq: 7,
            rank: 3,
            sent_ns: 1 << 40,
            hb_age_ns: 5,
            answered: 9,
        };
        assert_eq!(Probe::decode(&p.encode()), Some(p));
        assert!(p.alive());
        assert_eq!(Probe::decode(&p.encode()[..47]), None);
        let mut bad = p.encode();
        bad[0] = 0;
        assert_eq!(Probe::decode(&bad), None);
        let mut bad = p.encode();
        bad[5] = 9;
        assert_eq!(Probe::decode(&bad), None);
    }

    #[test]
    fn userspace_responder_reports_heartbeat_age() {
        let clock = Arc::new(HeartbeatClock::default());
        clock.beat();
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        let r = UserspaceResponder::spawn(s, clock.clone()).unwrap();
        let c = UdpSocket::bind("127.0.0.1:0").unwrap();
        c.set_read_timeout(Some(std::time::Duration::from_secs(2))).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(30));
        c.send_to(&Probe::request(1, 4, 99).encode(), ("127.0.0.1", r.port())).unwrap();
        let mut buf = [0u8; 64];
        let n = c.recv(&mut buf).unwrap();
        let rep = Probe::decode(&buf[..n]).unwrap();
        assert_eq!((rep.kind, rep.seq, rep.rank, rep.sent_ns), (ProbeKind::ReplyUserspace, 1, 4, 99));
        assert!(rep.hb_age_ns >= 30_000_000, "age {} ns", rep.hb_age_ns);
        assert!(rep.alive());
    }

    /// Dropping the responder (a broker leaving) must not wait for a probe or a receive timeout: the thread is
    /// blocked in a receive with no timeout, and only the shutdown in `drop` wakes it (else this hangs).
    #[test]
    fn dropping_the_userspace_responder_wakes_its_thread_at_once() {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        let r = UserspaceResponder::spawn(s, Arc::new(HeartbeatClock::default())).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50)); // the thread is in its receive now
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            drop(r);
            let _ = tx.send(());
        });
        assert!(
            rx.recv_timeout(std::time::Duration::from_secs(10)).is_ok(),
            "dropping the responder waited for its thread, which nothing woke"
        );
    }
}
