//! `vigil-bench netswitch`: an impaired Ethernet switch for the netns test bed, standing in for the kernel's
//! `netem`, which this machine's kernel lacks (it has no `netem`, `fq` or `tbf`; ENVIRONMENT.md). Run inside the
//! hub namespace of `ci/netns-cluster.sh` (its `impair` command does so), on the hub's ends of the nodes' veths,
//! taken off the bridge: the switch then carries every frame between nodes itself.
//!
//! Each frame a node sends is, independently: dropped with probability `--loss-pct`, else held for a delay drawn
//! uniformly from `delay ± jitter` (clamped at 0, so `--delay-ms 50 --jitter-ms 50` is 0-100 ms; frames may be
//! reordered, as netem's jitter reorders them), then forwarded by destination MAC (learned from source addresses;
//! broadcast, multicast and unknown destinations go to every other port). So every path from one node to another
//! crosses exactly one impaired hop, in each direction. Draws come from a seeded generator: a run is repeatable
//! in what it drops and how long it holds each frame, not in which frames the scheduler hands it when.
//!
//! Frames are read and written with `AF_PACKET` sockets in `PACKET_VNET_HDR` mode: a frame whose checksum the
//! sender's kernel left to offload, or a TCP segment larger than the MTU (TSO), is forwarded with its offload
//! header, exactly as the kernel would have bridged it. A port whose link is down (a node cut or killed by the
//! script) simply drops what is sent to it. Runs until killed; prints its counts every 30 s on stderr.

use clap::Args;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};
use vigil_sim::Rng;

/// `<linux/if_packet.h>`: prefix every frame with a `struct virtio_net_hdr` (offload state).
const PACKET_VNET_HDR: libc::c_int = 15;
/// `<linux/if_packet.h>`: do not deliver the frames this host sends on the interface (those the switch wrote).
const PACKET_IGNORE_OUTGOING: libc::c_int = 23;
/// Size of `struct virtio_net_hdr`, bytes.
const VNET_HDR_LEN: usize = 10;
/// `VIRTIO_NET_HDR_F_DATA_VALID`: a receive-side flag, cleared before a frame is sent on.
const VNET_F_DATA_VALID: u8 = 2;
/// Largest frame read (a TSO segment can be 64 KiB), plus its offload header.
const FRAME_MAX: usize = 65536 + VNET_HDR_LEN;

/// Options of `vigil-bench netswitch`.
#[derive(Args, Debug)]
pub(crate) struct NetswitchArgs {
    /// Mean one-way delay added to every frame, milliseconds.
    #[arg(long, default_value_t = 0.0)]
    pub delay_ms: f64,
    /// Each frame's delay is drawn uniformly from delay ± jitter (clamped at 0), milliseconds.
    #[arg(long, default_value_t = 0.0)]
    pub jitter_ms: f64,
    /// Frames dropped, percent (each frame independently, 0-100).
    #[arg(long, default_value_t = 0.0)]
    pub loss_pct: f64,
    /// Seed of the loss and delay draws.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Run at normal priority instead of real-time (see [`SWITCH_RT_PRIORITY`]): the switch then shares the CPUs
    /// with the nodes' processes, and every frame waits as long as the switch does for a CPU on top of its drawn
    /// delay.
    #[arg(long)]
    pub normal_priority: bool,
    /// The switch's ports: the hub's ends of the nodes' veths, in this network namespace, off any bridge.
    #[arg(required = true)]
    pub ports: Vec<String>,
}

/// The switch's real-time priority (`SCHED_FIFO`). A switch has silicon of its own and does not slow down when the
/// hosts' CPUs are busy; on this one machine it shares 2 CPUs with the nodes, and at normal priority, under the
/// overload soak's busy loops and brokers, it waited for a CPU often enough to add tens to hundreds of milliseconds
/// to every frame at once, beyond the delay it was told to add. Real-time, it adds what it draws. Above the probers'
/// `SCHED_RR` 1 (`vigil-prober`), so a prober never runs ahead of the network it measures; its work is a few
/// microseconds per frame.
pub(crate) const SWITCH_RT_PRIORITY: libc::c_int = 2;

/// Makes this process `SCHED_FIFO` at [`SWITCH_RT_PRIORITY`]; the error if the kernel refuses (no
/// `CAP_SYS_NICE`, or a real-time runtime limit).
fn go_real_time() -> io::Result<()> {
    let p = libc::sched_param { sched_priority: SWITCH_RT_PRIORITY };
    // SAFETY: sched_setscheduler on pid 0 (this process) with a valid sched_param we own.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &p) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// A frame held until its release time; ordered by (release time, arrival order).
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Held {
    at: Instant,
    seq: u64,
    from: usize,
    frame: Vec<u8>,
}

fn setsockopt_int(fd: &OwnedFd, level: libc::c_int, name: libc::c_int, v: libc::c_int) -> io::Result<()> {
    // SAFETY: fd is an open socket; the option value is a c_int we own, with its size.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// A non-blocking `AF_PACKET` socket bound to interface `port`, in `PACKET_VNET_HDR` mode, blind to its own sends.
fn open_port(port: &str) -> io::Result<OwnedFd> {
    let name = CString::new(port).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in port name"))?;
    // SAFETY: name is a valid C string.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    if index == 0 {
        return Err(io::Error::new(io::ErrorKind::NotFound, format!("no interface {port} in this namespace")));
    }
    let proto = (libc::ETH_P_ALL as u16).to_be();
    // SAFETY: plain socket(2); the descriptor is owned below.
    let raw = unsafe {
        libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, proto as libc::c_int)
    };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: raw is a fresh descriptor nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    setsockopt_int(&fd, libc::SOL_PACKET, PACKET_VNET_HDR, 1)?;
    setsockopt_int(&fd, libc::SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)?;
    // SAFETY: sockaddr_ll is plain data; all-zero is valid before the fields are set.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_protocol = proto;
    sll.sll_ifindex = index as libc::c_int;
    // SAFETY: sll is a valid sockaddr_ll of the size given.
    let r = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&sll as *const libc::sockaddr_ll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// The switch's state: ports, MAC table, held frames, draws and counts.
#[derive(Debug)]
struct Switch {
    ports: Vec<OwnedFd>,
    macs: HashMap<[u8; 6], usize>,
    held: BinaryHeap<Reverse<Held>>,
    rng: Rng,
    seq: u64,
    delay: f64,
    jitter: f64,
    loss: f64,
    forwarded: u64,
    dropped: u64,
}

impl Switch {
    /// Take a frame read on port `from`: count it, drop it or hold it.
    fn arrive(&mut self, from: usize, frame: &[u8], now: Instant) {
        if frame.len() < VNET_HDR_LEN + 14 {
            return;
        }
        let eth = &frame[VNET_HDR_LEN..];
        let src: [u8; 6] = eth[6..12].try_into().unwrap_or_default();
        if src[0] & 1 == 0 {
            self.macs.insert(src, from);
        }
        if self.loss > 0.0 && self.rng.unit() < self.loss {
            self.dropped += 1;
            return;
        }
        let d = (self.delay + self.jitter * (2.0 * self.rng.unit() - 1.0)).max(0.0);
        let mut f = frame.to_vec();
        f[0] &= !VNET_F_DATA_VALID;
        self.seq += 1;
        self.held.push(Reverse(Held { at: now + Duration::from_secs_f64(d), seq: self.seq, from, frame: f }));
    }

    /// Send every frame whose time has come; returns the wait until the next one.
    fn release(&mut self, now: Instant) -> Option<Duration> {
        while let Some(Reverse(h)) = self.held.peek() {
            if h.at > now {
                return Some(h.at - now);
            }
            let Some(Reverse(h)) = self.held.pop() else { break };
            let dst: [u8; 6] = h.frame[VNET_HDR_LEN..VNET_HDR_LEN + 6].try_into().unwrap_or_default();
            let to = if dst[0] & 1 == 0 { self.macs.get(&dst).copied() } else { None };
            for (i, p) in self.ports.iter().enumerate() {
                if i == h.from || to.is_some_and(|t| t != i) {
                    continue;
                }
                // SAFETY: send(2) of a buffer we own on a bound packet socket. A port whose link is down
                // refuses (ENETDOWN): the frame is lost, as on a cut cable.
                unsafe { libc::send(p.as_raw_fd(), h.frame.as_ptr().cast(), h.frame.len(), libc::MSG_DONTWAIT) };
            }
            self.forwarded += 1;
        }
        None
    }
}

/// Run the switch until killed. Exit status 1 with the reason on stderr if a port cannot be opened.
pub(crate) fn run(a: &NetswitchArgs) -> i32 {
    for (name, v, ok) in [
        ("--delay-ms", a.delay_ms, a.delay_ms >= 0.0),
        ("--jitter-ms", a.jitter_ms, a.jitter_ms >= 0.0),
        ("--loss-pct", a.loss_pct, (0.0..=100.0).contains(&a.loss_pct)),
    ] {
        if !ok || !v.is_finite() {
            eprintln!("netswitch: {name} {v}: must be {}", if name == "--loss-pct" { "0-100" } else { ">= 0" });
            return 2;
        }
    }
    let mut ports = Vec::new();
    for p in &a.ports {
        match open_port(p) {
            Ok(fd) => ports.push(fd),
            Err(e) => {
                eprintln!("netswitch: port {p}: {e}");
                return 1;
            }
        }
    }
    let mut sw = Switch {
        ports,
        macs: HashMap::new(),
        held: BinaryHeap::new(),
        rng: Rng::new(a.seed),
        seq: 0,
        delay: a.delay_ms / 1000.0,
        jitter: a.jitter_ms / 1000.0,
        loss: a.loss_pct / 100.0,
        forwarded: 0,
        dropped: 0,
    };
    let priority = if a.normal_priority {
        "normal priority (--normal-priority)".to_string()
    } else {
        match go_real_time() {
            Ok(()) => format!("real-time (SCHED_FIFO {SWITCH_RT_PRIORITY})"),
            Err(e) => format!("normal priority (real-time refused: {e})"),
        }
    };
    eprintln!(
        "netswitch: {} ports, delay {} ms ± {} ms, loss {} %, seed {}, {priority}",
        a.ports.len(),
        a.delay_ms,
        a.jitter_ms,
        a.loss_pct,
        a.seed
    );
    let mut buf = vec![0u8; FRAME_MAX];
    let mut report = Instant::now() + Duration::from_secs(30);
    loop {
        let now = Instant::now();
        let wait = sw.release(now).unwrap_or(Duration::from_secs(1)).min(report.saturating_duration_since(now));
        let mut fds: Vec<libc::pollfd> =
            sw.ports.iter().map(|p| libc::pollfd { fd: p.as_raw_fd(), events: libc::POLLIN, revents: 0 }).collect();
        let ts =
            libc::timespec { tv_sec: wait.as_secs() as libc::time_t, tv_nsec: wait.subsec_nanos() as libc::c_long };
        // SAFETY: fds is a valid array of pollfd of the length given; ts outlives the call.
        let n = unsafe { libc::ppoll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, &ts, std::ptr::null()) };
        if n > 0 {
            let now = Instant::now();
            for (i, pfd) in fds.iter().enumerate() {
                if pfd.revents == 0 {
                    continue;
                }
                // Drain the port; an error (ENETDOWN after a cut, EAGAIN when empty) ends this round.
                for _ in 0..256 {
                    // SAFETY: recv(2) into a buffer we own, of its length.
                    let got = unsafe { libc::recv(pfd.fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
                    if got <= 0 {
                        break;
                    }
                    sw.arrive(i, &buf[..got as usize], now);
                }
            }
        }
        if Instant::now() >= report {
            eprintln!("netswitch: {} frames forwarded, {} dropped, {} held", sw.forwarded, sw.dropped, sw.held.len());
            report = Instant::now() + Duration::from_secs(30);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn switch(delay: f64, jitter: f64, loss: f64) -> Switch {
        Switch {
            ports: Vec::new(),
            macs: HashMap::new(),
            held: BinaryHeap::new(),
            rng: Rng::new(7),
            seq: 0,
            delay,
            jitter,
            loss,
            forwarded: 0,
            dropped: 0,
        }
    }

    fn frame(src: u8) -> Vec<u8> {
        let mut f = vec![0u8; VNET_HDR_LEN + 60];
        f[0] = VNET_F_DATA_VALID;
        f[VNET_HDR_LEN + 6..VNET_HDR_LEN + 12].copy_from_slice(&[2, 0, 0, 0, 0, src]);
        f
    }

    #[test]
    fn loss_and_delay_follow_the_options() {
        let mut sw = switch(0.05, 0.05, 0.02);
        let t0 = Instant::now();
        for _ in 0..20_000 {
            sw.arrive(0, &frame(1), t0);
        }
        let kept = sw.held.len() as f64;
        let lost = sw.dropped as f64 / 20_000.0;
        assert!((0.01..0.03).contains(&lost), "2 % loss drew {lost}");
        let delays: Vec<f64> = sw.held.iter().map(|Reverse(h)| (h.at - t0).as_secs_f64()).collect();
        assert!(delays.iter().all(|d| (0.0..=0.1).contains(d)), "delays outside 0-100 ms");
        let mean = delays.iter().sum::<f64>() / kept;
        assert!((0.045..0.055).contains(&mean), "mean delay {mean}");
        // The receive-side checksum flag is not sent on; the source MAC was learned.
        assert!(sw.held.iter().all(|Reverse(h)| h.frame[0] & VNET_F_DATA_VALID == 0));
        assert_eq!(sw.macs.get(&[2, 0, 0, 0, 0, 1]), Some(&0));
    }

    #[test]
    fn frames_leave_in_release_order_and_runts_are_ignored() {
        let mut sw = switch(0.0, 0.0, 0.0);
        let t0 = Instant::now();
        sw.arrive(0, &[0u8; 12], t0);
        assert!(sw.held.is_empty());
        sw.arrive(0, &frame(1), t0);
        sw.arrive(1, &frame(2), t0);
        assert_eq!(sw.release(t0 + Duration::from_millis(1)), None);
        assert_eq!(sw.forwarded, 2);
    }
}
