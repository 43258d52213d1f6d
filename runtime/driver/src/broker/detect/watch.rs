//! Watching process exits and the overlay's TCP connections, once the eBPF programs are loaded (`load.rs`).
//!
//! Two tasks on the broker's runtime, each fed by a command channel and sending what it sees to the driver's
//! loop as [`DetectInput`]s: [`exit_task`] (job shells' tasks, local clients, and on a test instance's detector
//! rank the other brokers of the machine; `sched_process_exit` or pidfd) and [`tcp_task`] (every overlay
//! connection by its 4-tuple: a reset or a close reported once, a retransmit as a hint each time). What an exit
//! or a TCP event means for a peer is the membership machine's rule (`vigil_core::membership`), applied by the
//! driver. Also the socket helpers they need: a connection's 4-tuple, and whether a socket has unread bytes.

use super::DetectInput;
use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use tokio::sync::mpsc;
use vigil_ebpf::{Detector, TcpEventKind, TcpTuple, TcpWatcher};

/// Commands to [`exit_task`].
pub(super) enum ExitCmd {
    Watch(u32),
}

/// Commands to [`tcp_task`].
pub(super) enum TcpCmd {
    Watch(u32, TcpTuple),
    Unwatch(TcpTuple),
}

/// The 4-tuple of a connected IPv4 TCP socket.
pub(super) fn socket_tuple(sock: &std::os::fd::OwnedFd) -> Option<TcpTuple> {
    use std::os::fd::AsFd;
    let s = socket2_addrs(sock.as_fd())?;
    TcpTuple::of(s.0, s.1)
}

fn socket2_addrs(fd: std::os::fd::BorrowedFd<'_>) -> Option<(SocketAddr, SocketAddr)> {
    use std::os::fd::AsRawFd;
    let get = |peer: bool| -> Option<SocketAddr> {
        // SAFETY: sockaddr_in is plain old data; get{sock,peer}name write at most `len` bytes into it.
        unsafe {
            let mut sa: libc::sockaddr_in = std::mem::zeroed();
            let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
            let p = &mut sa as *mut libc::sockaddr_in as *mut libc::sockaddr;
            let rc = if peer {
                libc::getpeername(fd.as_raw_fd(), p, &mut len)
            } else {
                libc::getsockname(fd.as_raw_fd(), p, &mut len)
            };
            if rc != 0 || sa.sin_family as i32 != libc::AF_INET {
                return None;
            }
            let ip = Ipv4Addr::from(u32::from_be(sa.sin_addr.s_addr));
            Some(SocketAddr::V4(SocketAddrV4::new(ip, u16::from_be(sa.sin_port))))
        }
    };
    Some((get(false)?, get(true)?))
}

/// Watches the exits of the pids it is told, and reports each (or a pid that could not be watched).
pub(super) async fn exit_task(
    mut det: Detector,
    mut rx: mpsc::UnboundedReceiver<ExitCmd>,
    tx: mpsc::UnboundedSender<DetectInput>,
) {
    loop {
        tokio::select! {
            c = rx.recv() => match c {
                Some(ExitCmd::Watch(pid)) => {
                    if let Err(e) = det.watch(pid) {
                        tracing::debug!("cannot watch pid {pid}: {e}");
                        let _ = tx.send(DetectInput::WatchFailed(pid, e.to_string()));
                    }
                }
                None => return,
            },
            ev = det.next_event() => match ev {
                Some(ev) => {
                    if tx.send(DetectInput::Exit(ev)).is_err() {
                        return;
                    }
                }
                None => return,
            },
        }
    }
}

/// Watches the overlay connections it is told, and reports the kernel's events on them by rank (a reset or
/// close ends the watch of that connection).
pub(super) async fn tcp_task(
    mut w: TcpWatcher,
    mut rx: mpsc::UnboundedReceiver<TcpCmd>,
    tx: mpsc::UnboundedSender<DetectInput>,
) {
    let mut ranks: HashMap<TcpTuple, u32> = HashMap::new();
    loop {
        tokio::select! {
            // Events first: the close of a link the loop has already judged (on its reader's end of file) is
            // still reported, and times that verdict (`vigil_verdict_latency_seconds`), though the loop's
            // unwatch may be waiting beside it.
            biased;
            ev = w.next_event() => match ev {
                Some(ev) => {
                    if let Some(&r) = ranks.get(&ev.tuple) {
                        if !matches!(ev.kind, TcpEventKind::Retransmit { .. }) {
                            ranks.remove(&ev.tuple);
                            let _ = w.unwatch(ev.tuple);
                        }
                        if tx.send(DetectInput::Tcp(r, ev)).is_err() {
                            return;
                        }
                    }
                }
                None => return,
            },
            c = rx.recv() => match c {
                Some(TcpCmd::Watch(rank, t)) => {
                    if w.watch(t).is_ok() {
                        ranks.insert(t, rank);
                    }
                }
                Some(TcpCmd::Unwatch(t)) => {
                    let _ = w.unwatch(t);
                    ranks.remove(&t);
                }
                None => return,
            },
        }
    }
}

/// Bytes received on a socket and not yet read (FIONREAD).
pub(crate) fn unread_bytes(fd: &std::os::fd::OwnedFd) -> bool {
    use std::os::fd::AsRawFd;
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one c_int through a valid pointer; the fd is a socket we own a duplicate of.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), libc::FIONREAD, &mut n) };
    rc == 0 && n > 0
}
