//! `vigil-bench tick`: the floor of a periodic prober. It does only what any prober must do each period (wake on a
//! timer, send one datagram) and reports its own CPU time, so the cost of Vigil's prober can be read against the
//! cost of the act itself on the same machine and network path.
//!
//! Each period it sleeps to an absolute deadline (`clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME)`, the cheapest
//! periodic wake-up Linux offers a process) and sends one `--bytes`-byte UDP datagram to `--to` (for example a
//! parent's probe group, `239.255.0.0:22087`). Multicast goes out with TTL 1 and no loopback, as the prober's
//! does. Printed as one JSON line on stdout: periods done and the process's run time (`/proc/thread-self/schedstat`,
//! the scheduler's exact figure) in ns and in percent of a core.

use clap::Args;
use serde::Serialize;
use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

/// Options of `vigil-bench tick`.
#[derive(Args, Debug)]
pub(crate) struct TickArgs {
    /// Where to send one datagram per period (`ADDR:PORT`; IPv4 multicast or unicast).
    #[arg(long)]
    pub to: SocketAddr,
    /// Period, milliseconds (1 to 10,000).
    #[arg(long, default_value_t = 10.0)]
    pub period_ms: f64,
    /// Length of the run, seconds (up to 3600).
    #[arg(long, default_value_t = 10.0, allow_negative_numbers = true)]
    pub seconds: f64,
    /// Datagram size, bytes (1 to 1472; the prober's is 48).
    #[arg(long, default_value_t = 48)]
    pub bytes: usize,
    /// Local IPv4 address to send from (and, for multicast, the interface to send on, as the prober does).
    #[arg(long)]
    pub from: Option<std::net::Ipv4Addr>,
}

/// Result of one run (one JSON line).
#[derive(Serialize, Debug)]
pub(crate) struct TickResult {
    /// Periods completed (one wake-up and one datagram each).
    pub periods: u64,
    /// Datagrams the kernel refused (counted, not retried).
    pub send_errors: u64,
    /// Wall time, seconds.
    pub elapsed_s: f64,
    /// This thread's run time over the run, ns.
    pub run_ns: u64,
    /// Run time per period, ns.
    pub ns_per_period: f64,
    /// Run time, percent of one core.
    pub cpu_pct: f64,
}

/// This thread's run time so far, ns (first field of `/proc/thread-self/schedstat`).
fn run_ns() -> std::io::Result<u64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat")?;
    s.split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("unexpected schedstat line '{}'", s.trim())))
}

fn now_ts() -> libc::timespec {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts
}

fn add_ns(ts: &mut libc::timespec, ns: u64) {
    let t = ts.tv_nsec as u64 + ns;
    ts.tv_sec += (t / 1_000_000_000) as libc::time_t;
    ts.tv_nsec = (t % 1_000_000_000) as libc::c_long;
}

/// Runs `vigil-bench tick`; exit code 0, or 1 with a message on stderr.
pub(crate) fn run(a: &TickArgs) -> i32 {
    if !(a.seconds > 0.0 && a.seconds <= 3600.0) {
        eprintln!("vigil-bench tick: --seconds must be in (0, 3600], got {}", a.seconds);
        return 1;
    }
    if !(1.0..=10_000.0).contains(&a.period_ms) {
        eprintln!("vigil-bench tick: --period-ms must be in [1, 10000], got {}", a.period_ms);
        return 1;
    }
    if !(1..=1472).contains(&a.bytes) {
        eprintln!("vigil-bench tick: --bytes must be in [1, 1472], got {}", a.bytes);
        return 1;
    }
    match tick(a) {
        Ok(r) => {
            println!("{}", serde_json::to_string(&r).unwrap_or_default());
            0
        }
        Err(e) => {
            eprintln!("vigil-bench tick: {e}");
            1
        }
    }
}

fn tick(a: &TickArgs) -> std::io::Result<TickResult> {
    let bind: SocketAddr = match (a.to, a.from) {
        (SocketAddr::V4(_), Some(ip)) => SocketAddr::from((ip, 0)),
        (SocketAddr::V4(_), None) => SocketAddr::from(([0, 0, 0, 0], 0)),
        (SocketAddr::V6(_), Some(_)) => return Err(std::io::Error::other("--from is IPv4, --to is IPv6")),
        (SocketAddr::V6(_), None) => "[::]:0".parse().expect("literal address"),
    };
    let sock = UdpSocket::bind(bind)?;
    if let SocketAddr::V4(v4) = a.to {
        if v4.ip().is_multicast() {
            if let Some(ip) = a.from {
                socket2::SockRef::from(&sock).set_multicast_if_v4(&ip)?;
            }
            sock.set_multicast_ttl_v4(1)?;
            sock.set_multicast_loop_v4(false)?;
        }
    }
    // The first send says whether the path works at all (no route, no interface): fail rather than time nothing.
    sock.send_to(&vec![0u8; a.bytes], a.to).map_err(|e| std::io::Error::other(format!("sending to {}: {e}", a.to)))?;
    let buf = vec![0u8; a.bytes];
    let period_ns = (a.period_ms * 1e6) as u64;
    let (mut periods, mut send_errors) = (0u64, 0u64);
    let start = Instant::now();
    let r0 = run_ns()?;
    let mut next = now_ts();
    let end = Duration::from_secs_f64(a.seconds);
    while start.elapsed() < end {
        add_ns(&mut next, period_ns);
        // SAFETY: `next` is a valid timespec; a null remainder is allowed with TIMER_ABSTIME.
        let rc =
            unsafe { libc::clock_nanosleep(libc::CLOCK_MONOTONIC, libc::TIMER_ABSTIME, &next, std::ptr::null_mut()) };
        if rc != 0 && rc != libc::EINTR {
            return Err(std::io::Error::from_raw_os_error(rc));
        }
        if sock.send_to(&buf, a.to).is_err() {
            send_errors += 1;
        }
        periods += 1;
    }
    let run = run_ns()? - r0;
    let elapsed = start.elapsed().as_secs_f64();
    Ok(TickResult {
        periods,
        send_errors,
        elapsed_s: elapsed,
        run_ns: run,
        ns_per_period: run as f64 / periods.max(1) as f64,
        cpu_pct: 100.0 * run as f64 / 1e9 / elapsed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sends_one_datagram_per_period_and_counts_its_time() {
        let rx = UdpSocket::bind("127.0.0.1:0").expect("bind");
        rx.set_read_timeout(Some(Duration::from_secs(2))).expect("timeout");
        let to = rx.local_addr().expect("addr");
        let r = tick(&TickArgs { to, period_ms: 5.0, seconds: 0.1, bytes: 48, from: None }).expect("tick");
        assert!((5..=25).contains(&r.periods), "0.1 s at 5 ms: {} periods", r.periods);
        assert_eq!(r.send_errors, 0);
        assert!(r.run_ns > 0 && r.cpu_pct > 0.0 && r.cpu_pct < 100.0, "{r:?}");
        // One datagram per period, after the one that checks the path.
        let mut b = [0u8; 64];
        let mut got = 0;
        while let Ok(n) = rx.recv(&mut b) {
            assert_eq!(n, 48);
            got += 1;
            if got == r.periods + 1 {
                break;
            }
        }
        assert_eq!(got, r.periods + 1, "one datagram per period");
    }

    #[test]
    fn refuses_bad_arguments() {
        let to: SocketAddr = "127.0.0.1:9".parse().expect("addr");
        for a in [
            TickArgs { to, period_ms: 0.0, seconds: 1.0, bytes: 48, from: None },
            TickArgs { to, period_ms: 10.0, seconds: -1.0, bytes: 48, from: None },
            TickArgs { to, period_ms: 10.0, seconds: 1.0, bytes: 0, from: None },
            TickArgs { to, period_ms: 10.0, seconds: 1.0, bytes: 9000, from: None },
        ] {
            assert_eq!(run(&a), 1, "{a:?}");
        }
    }
}
