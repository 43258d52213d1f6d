//! `vigil-bench fwq`: the fixed-work-quanta (FWQ) operating-system noise measurement, as HPC centres run it to
//! see what daemons steal from a compute-bound application.
//!
//! The process repeats one fixed quantum of arithmetic (calibrated to `--quantum-us`, default 100 µs, when
//! undisturbed) for `--seconds` and times every quantum. Whatever else runs on the same core (a broker's prober, the
//! kernel's interrupt and softirq work for its packets) stretches the quanta it interrupts. The result:
//! - `noise_pct`: the share of the run lost to interruptions, `100 × Σ max(0, dᵢ − d_med) / Σ dᵢ` where dᵢ is the
//!   duration of quantum i and d_med the median quantum (the undisturbed one);
//! - `work_rate`: quanta completed per second (compare between variants of one run for the throughput a
//!   compute job keeps);
//! - the quantiles of dᵢ.
//!
//! Printed as one JSON line on stdout. Pin it with `taskset` to the core under test; it runs as an ordinary
//! (`SCHED_OTHER`, nice 0) process, like an MPI rank.

use clap::Args;
use serde::Serialize;
use std::hint::black_box;
use std::time::{Duration, Instant};

/// Options of `vigil-bench fwq`.
#[derive(Args, Debug)]
pub(crate) struct FwqArgs {
    /// Length of the measurement, seconds (up to 3600).
    #[arg(long, default_value_t = 10.0, allow_negative_numbers = true)]
    pub seconds: f64,
    /// Length of one undisturbed work quantum, microseconds (1 to 1,000,000).
    #[arg(long, default_value_t = 100.0, allow_negative_numbers = true)]
    pub quantum_us: f64,
}

/// Result of one FWQ run (one JSON line).
#[derive(Serialize, Debug)]
pub(crate) struct FwqResult {
    /// Quanta completed.
    pub quanta: usize,
    /// Wall time of the measurement, seconds.
    pub elapsed_s: f64,
    /// Quanta per second.
    pub work_rate: f64,
    /// Share of the run lost to interruptions, percent of the core (see the module docs).
    pub noise_pct: f64,
    /// Minimum, median, 99th percentile and maximum quantum duration, microseconds.
    pub quantum_us: [f64; 4],
    /// Quanta that took more than twice the median.
    pub interrupted: usize,
}

/// One quantum: `iters` rounds of a dependent multiply-add chain the compiler cannot shorten.
fn work(iters: u64) -> u64 {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for i in 0..iters {
        x = black_box(x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(i | 1));
    }
    x
}

/// The shortest of `trials` timed runs of [`work`]`(iters)`: the undisturbed duration.
fn fastest(iters: u64, trials: usize) -> Duration {
    (0..trials.max(1))
        .map(|_| {
            let t = Instant::now();
            black_box(work(iters));
            t.elapsed()
        })
        .min()
        .unwrap_or(Duration::ZERO)
}

/// Iterations of [`work`] that take `quantum` undisturbed: the fastest of several trials, scaled.
fn calibrate(quantum: Duration) -> u64 {
    let mut iters: u64 = 1000;
    // Grow until a trial takes at least 1 ms, so the timer's resolution does not matter.
    loop {
        let t = Instant::now();
        black_box(work(iters));
        if t.elapsed() >= Duration::from_millis(1) {
            break;
        }
        iters *= 2;
    }
    let best = fastest(iters, 20);
    ((iters as f64) * quantum.as_secs_f64() / best.as_secs_f64().max(1e-9)).max(1.0) as u64
}

/// The quantiles and noise of a run with these quantum durations (ns) over `elapsed`.
fn summarize(mut d: Vec<u64>, elapsed: Duration) -> FwqResult {
    d.sort_unstable();
    let n = d.len();
    let q = |p: f64| if n == 0 { 0.0 } else { d[((n - 1) as f64 * p).round() as usize] as f64 / 1e3 };
    let med = if n == 0 { 0 } else { d[(n - 1) / 2] };
    let total: u64 = d.iter().sum();
    let lost: u64 = d.iter().map(|&x| x.saturating_sub(med)).sum();
    FwqResult {
        quanta: n,
        elapsed_s: elapsed.as_secs_f64(),
        work_rate: n as f64 / elapsed.as_secs_f64().max(1e-9),
        noise_pct: if total == 0 { 0.0 } else { 100.0 * lost as f64 / total as f64 },
        quantum_us: [q(0.0), q(0.5), q(0.99), q(1.0)],
        interrupted: d.iter().filter(|&&x| x > 2 * med).count(),
    }
}

/// Run the measurement and print its JSON line; exit code 0, or 1 on bad arguments.
pub(crate) fn run(a: &FwqArgs) -> i32 {
    if !(a.seconds > 0.0 && a.seconds <= 3600.0) {
        eprintln!("vigil-bench fwq: --seconds must be in (0, 3600], got {}", a.seconds);
        return 1;
    }
    if !(1.0..=1e6).contains(&a.quantum_us) {
        eprintln!("vigil-bench fwq: --quantum-us must be in [1, 1000000], got {}", a.quantum_us);
        return 1;
    }
    let iters = calibrate(Duration::from_secs_f64(a.quantum_us / 1e6));
    let end = Duration::from_secs_f64(a.seconds);
    // One duration per quantum; capped so a slow machine with tiny quanta cannot ask for gigabytes up front.
    let mut d = Vec::with_capacity(((a.seconds * 1e6 / a.quantum_us) as usize).min(1 << 24) + 16);
    let start = Instant::now();
    let mut last = start;
    while last - start < end {
        black_box(work(iters));
        let now = Instant::now();
        d.push((now - last).as_nanos() as u64);
        last = now;
    }
    let r = summarize(d, last - start);
    println!("{}", serde_json::to_string(&r).unwrap_or_default());
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn noise_counts_only_the_stretch_above_the_median() {
        // Nine undisturbed quanta of 100 µs and one stretched by 900 µs: 900 of 1900 µs lost.
        let mut d = vec![100_000u64; 9];
        d.push(1_000_000);
        let r = summarize(d, Duration::from_micros(1900));
        assert_eq!(r.quanta, 10);
        assert!((r.noise_pct - 100.0 * 900.0 / 1900.0).abs() < 1e-9, "{}", r.noise_pct);
        assert_eq!(r.interrupted, 1);
        assert_eq!(r.quantum_us, [100.0, 100.0, 1000.0, 1000.0]);
    }

    #[test]
    fn calibrated_quantum_is_near_the_asked_length() {
        let iters = calibrate(Duration::from_micros(200));
        let best = fastest(iters, 20);
        // Loose: a shared test machine may be slower than during calibration, never 10x faster.
        assert!(best > Duration::from_micros(20) && best < Duration::from_millis(20), "{best:?}");
    }
}
