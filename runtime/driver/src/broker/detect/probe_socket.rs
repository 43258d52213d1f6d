//! The prober's UDP socket: set up for group probes and a large receive buffer, probes sent in one
//! `sendmmsg(2)`, replies read in batches with `recvmmsg(2)`, and its readiness checked without waiting.
//! System calls only; what is sent and what a reply means is `prober.rs`'s, when it is done `prober_thread.rs`'s.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};

/// Sets a prober socket to send group probes out of the interface of `local`, one hop, not looped back.
pub(super) fn multicast_sender(s: &std::net::UdpSocket, local: Ipv4Addr) -> std::io::Result<()> {
    socket2::SockRef::from(s).set_multicast_if_v4(&local)?;
    s.set_multicast_ttl_v4(1)?;
    s.set_multicast_loop_v4(false)
}

/// The prober's UDP socket, non-blocking, registered with the runtime for readability only: sends never wake the
/// runtime. (A socket registered for writability too, as `tokio::net::UdpSocket` is, reports a new writable edge
/// each time a sent datagram leaves the send buffer: one more pass through `epoll_wait` per period.)
pub(super) type ProbeSocket = tokio::io::unix::AsyncFd<std::net::UdpSocket>;

/// Send probes with one `sendmmsg(2)`; errors (a child's address unreachable) are ignored: the miss counts.
pub(super) fn send_batch(sock: &ProbeSocket, pkts: &[([u8; vigil_ebpf::PROBE_LEN], SocketAddr)]) {
    use std::os::fd::AsRawFd;
    let addrs: Vec<libc::sockaddr_in> = pkts
        .iter()
        .map(|(_, a)| {
            // SAFETY: sockaddr_in is plain old data; all-zero is valid before we fill it.
            let mut sa: libc::sockaddr_in = unsafe { std::mem::zeroed() };
            if let SocketAddr::V4(v4) = a {
                sa.sin_family = libc::AF_INET as libc::sa_family_t;
                sa.sin_port = v4.port().to_be();
                sa.sin_addr.s_addr = u32::from(*v4.ip()).to_be();
            }
            sa
        })
        .collect();
    let mut iovs: Vec<libc::iovec> =
        pkts.iter().map(|(b, _)| libc::iovec { iov_base: b.as_ptr() as *mut libc::c_void, iov_len: b.len() }).collect();
    let mut hdrs: Vec<libc::mmsghdr> = (0..pkts.len())
        .map(|i| {
            // SAFETY: mmsghdr is plain old data; all-zero is valid before we fill it.
            let mut h: libc::mmsghdr = unsafe { std::mem::zeroed() };
            h.msg_hdr.msg_name = &addrs[i] as *const libc::sockaddr_in as *mut libc::c_void;
            h.msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
            h.msg_hdr.msg_iov = &mut iovs[i];
            h.msg_hdr.msg_iovlen = 1;
            h
        })
        .collect();
    let mut off = 0;
    while off < hdrs.len() {
        // SAFETY: every header points at an address and an iovec that live until the call returns; the kernel
        // only reads them (and writes msg_len).
        let n = unsafe {
            libc::sendmmsg(
                sock.as_raw_fd(),
                hdrs[off..].as_mut_ptr(),
                (hdrs.len() - off) as libc::c_uint,
                libc::MSG_DONTWAIT,
            )
        };
        if n <= 0 {
            off += 1; // skip the datagram that failed (e.g. unreachable) and go on
        } else {
            off += n as usize;
        }
    }
}

/// Read every reply waiting on the socket, up to `bufs.len()` per `recvmmsg(2)`: (length, sender, data).
fn recv_batch<'a>(sock: &ProbeSocket, bufs: &'a mut [[u8; 128]]) -> Vec<(usize, SocketAddr, &'a [u8])> {
    use std::os::fd::AsRawFd;
    let mut out: Vec<(usize, SocketAddr)> = Vec::new();
    let cap = bufs.len();
    // One batch per call; `drain_replies` loops.
    let r = (|| {
        // SAFETY: sockaddr_in is plain old data; all-zero is valid (the kernel fills it).
        let zero: libc::sockaddr_in = unsafe { std::mem::zeroed() };
        let mut addrs: Vec<libc::sockaddr_in> = vec![zero; cap];
        let mut iovs: Vec<libc::iovec> = bufs
            .iter_mut()
            .map(|b| libc::iovec { iov_base: b.as_mut_ptr() as *mut libc::c_void, iov_len: b.len() })
            .collect();
        let mut hdrs: Vec<libc::mmsghdr> = (0..cap)
            .map(|i| {
                // SAFETY: mmsghdr is plain old data; all-zero is valid before we fill it.
                let mut h: libc::mmsghdr = unsafe { std::mem::zeroed() };
                h.msg_hdr.msg_name = &mut addrs[i] as *mut libc::sockaddr_in as *mut libc::c_void;
                h.msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
                h.msg_hdr.msg_iov = &mut iovs[i];
                h.msg_hdr.msg_iovlen = 1;
                h
            })
            .collect();
        // SAFETY: every header points at a buffer, an iovec and an address that outlive the call; the kernel
        // writes at most iov_len bytes and msg_namelen bytes into them.
        let n = unsafe {
            libc::recvmmsg(
                sock.as_raw_fd(),
                hdrs.as_mut_ptr(),
                cap as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        for i in 0..n as usize {
            let a = &addrs[i];
            let ip = Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr));
            out.push((hdrs[i].msg_len as usize, SocketAddr::V4(SocketAddrV4::new(ip, u16::from_be(a.sin_port)))));
        }
        Ok::<(), std::io::Error>(())
    })();
    if r.is_err() {
        return Vec::new();
    }
    out.into_iter().zip(bufs.iter()).map(|((n, a), b)| (n, a, &b[..n.min(b.len())])).collect()
}

/// Read every reply waiting on the socket, batch after batch, and hand each to `f`.
pub(super) fn drain_replies(sock: &ProbeSocket, bufs: &mut [[u8; 128]], mut f: impl FnMut(usize, &[u8], SocketAddr)) {
    let cap = bufs.len();
    loop {
        let got = recv_batch(sock, bufs);
        let full = got.len() == cap;
        for (n, from, b) in got {
            f(n, b, from);
        }
        if !full {
            return;
        }
    }
}

/// Probes sent back to back before the prober reads the replies that came in.
pub(super) const PROBE_GROUP: usize = 32;

/// Receive buffer of the prober's socket, bytes: room for the replies of a whole round of a wide parent.
const PROBE_RCVBUF: libc::c_int = 4 << 20;

/// Enlarge a socket's receive buffer to [`PROBE_RCVBUF`] (beyond `net.core.rmem_max` when root).
pub(super) fn grow_receive_buffer(s: &std::net::UdpSocket) {
    use std::os::fd::AsRawFd;
    let v = PROBE_RCVBUF;
    for opt in [libc::SO_RCVBUFFORCE, libc::SO_RCVBUF] {
        // SAFETY: setsockopt on a socket we own with a c_int option value of the size passed.
        let rc = unsafe {
            libc::setsockopt(
                s.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                &v as *const libc::c_int as *const libc::c_void,
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc == 0 {
            return;
        }
    }
}

/// The socket's readiness as the runtime last saw it, without waiting: `Some` if a datagram may be waiting.
pub(super) fn readable_now(sock: &ProbeSocket) -> Option<tokio::io::unix::AsyncFdReadyGuard<'_, std::net::UdpSocket>> {
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match sock.poll_read_ready(&mut cx) {
        std::task::Poll::Ready(Ok(g)) => Some(g),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use vigil_ebpf::Probe;

    #[tokio::test(flavor = "current_thread")]
    async fn probe_socket_readiness_is_seen_without_waiting_and_cleared_by_draining() {
        let s = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
        s.set_nonblocking(true).expect("nonblocking");
        let to = s.local_addr().expect("addr");
        // SAFETY: the UdpSocket owns its descriptor for the AsyncFd's whole life.
        let sock = unsafe { tokio::io::unix::AsyncFd::register_with_interest(s, tokio::io::Interest::READABLE) }
            .map_err(|e| e.into_parts().1)
            .expect("register");
        assert!(readable_now(&sock).is_none(), "nothing came yet");
        let probe = Probe::request(1, 7, 42).encode();
        sock.get_ref().send_to(&probe, to).expect("send");
        // The runtime sees it come (then the guard is dropped without clearing, as when the tick branch runs first).
        drop(tokio::time::timeout(Duration::from_secs(2), sock.readable()).await.expect("readable").expect("ready"));
        let mut ready = readable_now(&sock).expect("readiness seen without waiting");
        let mut bufs = vec![[0u8; 128]; 4];
        let mut got = Vec::new();
        drain_replies(&sock, &mut bufs, |n, b, from| got.push((n, b.to_vec(), from)));
        ready.clear_ready();
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].0, &got[0].1[..], got[0].2), (probe.len(), &probe[..], to));
        assert!(readable_now(&sock).is_none(), "drained and cleared");
    }
}
