//! The prober's own thread: a current-thread runtime ([`prober_thread`]) running its loop ([`prober_task`]),
//! which takes commands from the driver ([`ProbeCmd`]), reads replies as they come, and once a period
//! ([`Ticker`], a timerfd) judges the round and sends the next one's probes. Why a thread of its own, at a
//! real-time priority where it may, is said at [`prober_thread`]. The state and its rules are `prober.rs`'s, the
//! socket calls `probe_socket.rs`'s; the prober starts with a broker's first child (`Detectors::probe_child`).

use super::fabric_prober::FabricProber;
use super::probe_socket::{drain_replies, readable_now, send_batch, ProbeSocket, PROBE_GROUP};
use super::prober::Prober;
use super::status::ProberStats;
use super::DetectInput;
use crate::broker::core::PARENT;
use std::net::{SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tracing::warn;
use vigil_ebpf::{HbTable, Probe};

/// Commands to the prober task.
pub(crate) enum ProbeCmd {
    /// Probe child `rank` at this address.
    Add(u32, SocketAddr),
    /// Probe child `rank`'s job network too, at this address (its job-network responder).
    AddFabric(u32, SocketAddr),
    /// Stop probing `rank` (on both networks).
    Remove(u32),
    /// Probe `rank` now (suspect hint).
    Now(u32),
    /// This node's kernel collects probe replies (the XDP responder's table, with its reply table).
    Collector(Arc<HbTable>),
}

/// The prober's period: a periodic `CLOCK_MONOTONIC` timerfd watched by the runtime, or tokio's `Interval` if the
/// kernel refuses a timerfd. The timerfd is the cheaper of the two, and the prober wakes 100 times a second on
/// every parent: tokio re-arms an `Interval` in its timer wheel on every tick, and when that deadline becomes the
/// runtime's earliest it wakes itself through its eventfd, a write and a second pass through `epoll_wait` per
/// period (seen with `perf trace` on a parent of 16 children). The kernel re-arms a timerfd by itself.
enum Ticker {
    /// Readable once a period; a read returns the periods elapsed since the last read.
    Fd {
        /// The timerfd.
        fd: tokio::io::unix::AsyncFd<PeriodFd>,
        /// Its period.
        period: Duration,
        /// When its next expiry is due.
        due: std::time::Instant,
    },
    /// The fallback.
    Tokio(tokio::time::Interval),
}

/// A timerfd, as tokio's `AsyncFd` wants it (`AsRawFd`).
struct PeriodFd(nix::sys::timerfd::TimerFd);

impl std::os::fd::AsRawFd for PeriodFd {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsFd;
        self.0.as_fd().as_raw_fd()
    }
}

impl Ticker {
    /// Ticks every `period` (the first tick one period from now).
    fn new(period: Duration) -> Ticker {
        use nix::sys::time::TimeSpec;
        use nix::sys::timerfd::{ClockId, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags};
        let fd = TimerFd::new(ClockId::CLOCK_MONOTONIC, TimerFlags::TFD_NONBLOCK | TimerFlags::TFD_CLOEXEC)
            .and_then(|t| {
                t.set(Expiration::Interval(TimeSpec::from_duration(period)), TimerSetTimeFlags::empty())?;
                Ok(t)
            })
            .map_err(std::io::Error::from)
            .and_then(|t| {
                // SAFETY: `PeriodFd` owns the timerfd and always returns that descriptor; it is closed only when
                // the `PeriodFd` drops, which the `AsyncFd` that holds it does after deregistering it.
                unsafe { tokio::io::unix::AsyncFd::register_with_interest(PeriodFd(t), tokio::io::Interest::READABLE) }
                    .map_err(|e| e.into_parts().1)
            });
        match fd {
            Ok(fd) => Ticker::Fd { fd, period, due: std::time::Instant::now() + period },
            Err(e) => {
                warn!("prober: no timerfd ({e}); its period is kept by the runtime's timer");
                let mut t = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
                // A starved prober skips the periods it missed rather than probing in a burst to catch up.
                t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                Ticker::Tokio(t)
            }
        }
    }

    /// Waits for the next period. Cancel-safe (a `select!` branch): an expiry not yet read stays in the timerfd.
    /// A tick taken late (by more than a quarter period: the prober was starved) moves the schedule so the next
    /// one comes a full period later, as tokio's `MissedTickBehavior::Delay` does: each round's probes always
    /// get a whole period to be answered before the next round counts them missing.
    async fn tick(&mut self) {
        match self {
            Ticker::Tokio(t) => {
                t.tick().await;
            }
            Ticker::Fd { fd, period, due } => loop {
                let Ok(mut ready) = fd.readable().await else {
                    // The runtime lost the descriptor (it is shutting down): wait a period the plain way.
                    tokio::time::sleep(*period).await;
                    return;
                };
                let mut n = [0u8; 8];
                match ready.try_io(|f| {
                    nix::unistd::read(std::os::fd::AsRawFd::as_raw_fd(f.get_ref()), &mut n)
                        .map_err(std::io::Error::from)
                }) {
                    Ok(_) => {
                        // Read to zero: the next expiry is a new edge. Saves a read that would say EAGAIN.
                        ready.clear_ready();
                        let now = std::time::Instant::now();
                        if now > *due + *period / 4 {
                            use nix::sys::timerfd::{Expiration, TimerSetTimeFlags};
                            let every = Expiration::Interval(nix::sys::time::TimeSpec::from_duration(*period));
                            // Re-arming also clears an expiry that came meanwhile. If it fails the old
                            // schedule goes on, which only shortens the next period once.
                            let _ = fd.get_ref().0.set(every, TimerSetTimeFlags::empty());
                            *due = now + *period;
                        } else {
                            *due += *period;
                        }
                        return;
                    }
                    Err(_would_block) => continue,
                }
            },
        }
    }
}

/// Stack of the prober's thread (bytes): it runs one small task; the default 2 MiB would be reserved by every
/// broker of a test instance.
pub(super) const PROBER_STACK: usize = 256 * 1024;

/// The prober's own thread: a current-thread runtime that runs [`prober_task`] until the broker drops its command
/// channel. Not a task of the broker's runtime: there, every period waited behind whatever the broker's loop was
/// doing (a job's launch, a burst of messages, a store write), and a starved loop made the prober read replies late
/// and send probes late: on the overload soak, rounds came every 25 ms instead of 10 and the replies it timed took
/// up to 1.3 s on links of 200 ms, so a dead node was judged after seconds. A thread of its own is woken by its
/// timer as soon as the kernel schedules it, whatever the loop does. Verdicts still go through the loop.
///
/// And a real-time thread (`SCHED_RR`, priority 1, the lowest), as corosync runs its membership protocol: with the
/// CPUs saturated (64 more brokers and 3 busy loops on 2 cores), a normal thread still woke 20 ms late and more,
/// its rounds came every 30 ms and the replies it timed looked 800 ms long; as the lowest real-time priority it
/// runs when its timer fires, and its work, a few microseconds per period, takes nothing that matters from the rest.
/// Without the privilege (`CAP_SYS_NICE`) it runs at normal priority, said once in the log and in
/// `vigil overlay status`. Only the broker that owns its machine's detectors (one per node on a cluster) asks for
/// it: the 64 brokers of a test instance on 2 CPUs, all real-time, took so much from everything else that rank 0's
/// loop, where verdicts are made, ran seconds late.
///
/// `realtime_wanted`: this broker is its machine's detector owner.
#[allow(clippy::too_many_arguments)]
pub(super) fn prober_thread(
    sock: std::net::UdpSocket,
    rx: mpsc::UnboundedReceiver<ProbeCmd>,
    tx: mpsc::UnboundedSender<DetectInput>,
    period: Duration,
    group: Option<SocketAddrV4>,
    stats: Arc<ProberStats>,
    stall_max: f64,
    realtime_wanted: bool,
) {
    let _ = stats.priority.set(match realtime_wanted.then(realtime) {
        None => "at normal priority (real-time is for the prober of this machine's detector owner)".into(),
        Some(Ok(())) => "real-time (SCHED_RR 1)".into(),
        Some(Err(e)) => {
            warn!("the heartbeat prober runs at normal priority (real-time scheduling refused: {e}); under CPU overload its periods may run late");
            format!("at normal priority (real-time refused: {e})")
        }
    });
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            warn!("no heartbeat prober (runtime: {e}); children are judged on TCP alone");
            return;
        }
    };
    rt.block_on(async move {
        // SAFETY: the UdpSocket owns its descriptor, which stays open and the same until the AsyncFd that holds the
        // socket drops it (after deregistering it).
        match unsafe { tokio::io::unix::AsyncFd::register_with_interest(sock, tokio::io::Interest::READABLE) } {
            Ok(sock) => prober_task(sock, rx, tx, period, group, stats, stall_max).await,
            Err(e) => warn!("no heartbeat prober (UDP socket: {}); children are judged on TCP alone", e.into_parts().1),
        }
    });
}

/// The job-network probes' socket (see [`prober_task`]), nonblocking, watched by the runtime; `None` (said once)
/// if it cannot be made: the job networks are then not probed.
fn fabric_socket() -> Option<ProbeSocket> {
    let made = std::net::UdpSocket::bind((std::net::Ipv4Addr::UNSPECIFIED, 0))
        .and_then(|s| s.set_nonblocking(true).map(|_| s))
        .inspect(super::probe_socket::grow_receive_buffer)
        .and_then(|s| {
            // SAFETY: the UdpSocket owns its descriptor, which stays open and the same until the AsyncFd that
            // holds the socket drops it (after deregistering it).
            unsafe { tokio::io::unix::AsyncFd::register_with_interest(s, tokio::io::Interest::READABLE) }
                .map_err(|e| e.into_parts().1)
        });
    match made {
        Ok(s) => Some(s),
        Err(e) => {
            warn!("job networks not probed (UDP socket: {e}); fabric-down is not detected under this broker");
            None
        }
    }
}

/// Makes the calling thread `SCHED_RR` at priority 1 (see [`prober_thread`]).
fn realtime() -> std::io::Result<()> {
    if std::env::var_os("VIGIL_PROBER_NO_RT").is_some() {
        return Err(std::io::Error::other("VIGIL_PROBER_NO_RT is set"));
    }
    let p = libc::sched_param { sched_priority: 1 };
    // SAFETY: sched_setscheduler on pid 0 (the calling thread) with a valid sched_param we own.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_RR, &p) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Probes every child each period: children whose kernel has answered (and that are alone on their node) by one
/// IP multicast datagram per period, the others by unicast. Replies are collected by this node's kernel where
/// it can (no datagram reaches the socket), else read from the socket as they arrive. Misses are counted only
/// at the start of a period after every reply that has arrived was read, so a starved prober never blames its
/// children.
async fn prober_task(
    sock: ProbeSocket,
    mut rx: mpsc::UnboundedReceiver<ProbeCmd>,
    tx: mpsc::UnboundedSender<DetectInput>,
    period: Duration,
    group: Option<SocketAddrV4>,
    stats: Arc<ProberStats>,
    stall_max: f64,
) {
    let port = sock.get_ref().local_addr().map(|a| a.port()).unwrap_or(0);
    let key = {
        let mut k = [0u8; 8];
        let _ = std::fs::File::open("/dev/urandom").and_then(|mut f| std::io::Read::read_exact(&mut f, &mut k));
        u64::from_ne_bytes(k) ^ vigil_ebpf::monotonic_ns()
    };
    let mut fabric = FabricProber::new(key, period.as_secs_f64(), stall_max, tx.clone());
    let mut pr = Prober::new(key, port, group, tx, stall_max / 2.0);
    pr.period = period.as_secs_f64();
    // The job-network probes' socket, made with the first child that has a job network: bound to no address, so
    // that the kernel sends from this node's address on the route to the child's job network (its own job
    // network where it has one) and the replies come back over it.
    let mut fsock: Option<ProbeSocket> = None;
    let mut fbufs = vec![[0u8; 128]; PROBE_GROUP];
    let drain_fabric = |f: &mut FabricProber, sock: &ProbeSocket, bufs: &mut Vec<[u8; 128]>| {
        drain_replies(sock, bufs, |n, b, from| {
            if let Some(p) = Probe::decode(&b[..n]) {
                f.reply(&p, from, vigil_ebpf::monotonic_ns());
            }
        })
    };
    let mut tick = Ticker::new(period);
    let mut rbufs = vec![[0u8; 128]; PROBE_GROUP];
    let mut drain = |pr: &mut Prober, sock: &ProbeSocket| {
        drain_replies(sock, &mut rbufs, |n, b, from| match Probe::decode(&b[..n]) {
            Some(p) => pr.reply(&p, from),
            None => pr.rejected += 1,
        })
    };
    loop {
        tokio::select! {
            c = rx.recv() => match c {
                Some(ProbeCmd::Add(r, addr)) => pr.add(r, addr),
                Some(ProbeCmd::Remove(r)) => {
                    pr.remove(r);
                    fabric.remove(r);
                }
                Some(ProbeCmd::AddFabric(r, addr)) => {
                    if fsock.is_none() {
                        fsock = fabric_socket();
                    }
                    if fsock.is_some() {
                        fabric.add(r, addr);
                    }
                }
                Some(ProbeCmd::Now(r)) => {
                    let round = pr.round;
                    if let (Some(t), true) = (pr.targets.get_mut(&r), round > 0) {
                        t.last_unicast = round;
                        pr.sent += 1;
                        let _ = sock.get_ref().send_to(&Probe::request(round, t.id, vigil_ebpf::monotonic_ns() ^ pr.key).encode(), t.addr);
                    }
                }
                Some(ProbeCmd::Collector(t)) => {
                    if let (None, Some(area)) = (&pr.area, t.replies()) {
                        pr.set_area(area);
                    }
                }
                None => return,
            },
            r = async {
                match &fsock {
                    Some(f) => f.readable().await.map(|mut g| g.clear_ready()),
                    None => std::future::pending().await,
                }
            } => {
                if let (Ok(()), Some(f)) = (r, &fsock) {
                    drain_fabric(&mut fabric, f, &mut fbufs);
                }
            }
            r = sock.readable() => {
                if let Ok(mut ready) = r {
                    drain(&mut pr, &sock);
                    // Drained to EAGAIN: a datagram arriving from now on is a new edge, seen at the next wait.
                    ready.clear_ready();
                }
            }
            _ = tick.tick() => {
                // Read everything that has arrived before judging. With the kernel collecting replies the socket
                // is read only if the runtime saw a datagram come (this branch may run before the readable one).
                if pr.area.is_none() {
                    drain(&mut pr, &sock);
                } else if let Some(mut ready) = readable_now(&sock) {
                    drain(&mut pr, &sock);
                    ready.clear_ready();
                }
                pr.read_collected();
                // The job networks, judged against the management probes of the same period (before
                // `next_round` moves on), then probed again.
                if let Some(f) = &fsock {
                    drain_fabric(&mut fabric, f, &mut fbufs);
                    let pkts = fabric.next_round(&pr, vigil_ebpf::monotonic_ns());
                    if !pkts.is_empty() {
                        send_batch(f, &pkts);
                    }
                    stats.fabric.store(fabric.len() as u32, std::sync::atomic::Ordering::Relaxed);
                }
                let (group_wanted, unicast) = pr.next_round();
                {
                    use std::sync::atomic::Ordering::Relaxed;
                    let (grouped, unreached) = pr.counts;
                    stats.grouped.store(grouped, Relaxed);
                    let parent = pr.targets.contains_key(&PARENT);
                    stats.unicast.store(pr.targets.len() as u32 - grouped - u32::from(parent), Relaxed);
                    stats.parent.store(parent, Relaxed);
                    stats.unreached.store(unreached, Relaxed);
                    stats.void_rounds.store(pr.void_rounds, Relaxed);
                    stats.correlated_rounds.store(pr.correlated_rounds, Relaxed);
                    stats.replies.store(pr.replies, Relaxed);
                    stats.sent.store(pr.sent, Relaxed);
                    stats.rejected.store(pr.rejected, Relaxed);
                    stats.collected.store(pr.area.is_some(), Relaxed);
                }
                let now = vigil_ebpf::monotonic_ns() ^ pr.key;
                // Unicast probes before the group datagram: they include the re-probes of grouped children that
                // missed the last round, and a child at the tail of the group's burst of replies (the one a full
                // receive ring or switch buffer drops) must not be re-probed at the tail again.
                // Send in small groups and read the replies in between: a burst of hundreds of replies would
                // otherwise overflow the socket and make the same (last) children miss every round.
                for chunk in unicast.chunks(PROBE_GROUP) {
                    let pkts: Vec<([u8; vigil_ebpf::PROBE_LEN], SocketAddr)> =
                        chunk.iter().map(|(r, addr)| (Probe::request(pr.round, *r, now).encode(), *addr)).collect();
                    send_batch(&sock, &pkts);
                    pr.sent += pkts.len() as u64;
                    if pr.area.is_none() {
                        drain(&mut pr, &sock);
                    }
                }
                if let (true, Some(g)) = (group_wanted, pr.group) {
                    let _ = sock.get_ref().send_to(&Probe::group(pr.round, now).encode(), SocketAddr::V4(g));
                    pr.sent += 1;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn ticker_keeps_its_period_and_skips_what_a_starved_prober_missed() {
        let period = Duration::from_millis(10);
        let mut t = Ticker::new(period);
        assert!(matches!(t, Ticker::Fd { .. }), "a timerfd on Linux");
        let start = std::time::Instant::now();
        for _ in 0..5 {
            t.tick().await;
        }
        let five = start.elapsed();
        assert!(five >= Duration::from_millis(45), "5 periods of 10 ms took {five:?}");
        // Starved for 5 periods: one tick at once, then a whole period before the next (no catch-up burst, and
        // the round taken late still gets a full period for its replies).
        std::thread::sleep(period * 5);
        let late = std::time::Instant::now();
        t.tick().await;
        // (A loose bound: a loaded test machine may deschedule us for a few ms.)
        assert!(late.elapsed() < period * 4, "the missed period is reported at once, not periods later");
        let after = std::time::Instant::now();
        t.tick().await;
        let gap = after.elapsed();
        assert!(gap >= Duration::from_millis(9), "a full period after a late tick, got {gap:?}");
        // Taken 8 ms after it was due (less than a period late): still a full period to the next.
        std::thread::sleep(Duration::from_millis(18));
        t.tick().await;
        let after = std::time::Instant::now();
        t.tick().await;
        let gap = after.elapsed();
        assert!(gap >= Duration::from_millis(9), "a full period after a tick 8 ms late, got {gap:?}");
    }
}
