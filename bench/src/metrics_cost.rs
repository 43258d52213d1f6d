//! `vigil-bench metrics-cost`: what serving metrics costs the job throughput (issue 41's benchmark: "10,000-job
//! throughput with a scrape every second against none, same run; within noise, <= 2 %").
//!
//! Each sample is one fresh 4-broker instance measured as `vigil-bench sched` measures its throughput at depth
//! ([`crate::sched`]: its initial program `vigil-bench inner sched` submits N `true` jobs at once through the
//! client API, pipelined, then follows them until every one is INACTIVE and exited 0; jobs/s = N / first submit
//! to last INACTIVE). Every instance serves metrics on rank 0 (`-S metrics.listen=127.0.0.1:PORT -S
//! metrics.ranks=0`); the two modes differ only in whether something scrapes it:
//! - *not scraped*: nothing connects to the endpoint;
//! - *scraped*: a thread of this harness GETs `/metrics` every `--period-s` (1 s, Prometheus's shortest usual
//!   interval is 5-15 s) from before the instance starts until it has exited, as Prometheus would, each a new
//!   connection; the scrapes that answered 200 with a complete OpenMetrics text (`# EOF`) are counted and timed.
//!
//! The modes alternate within each round, in ABBA order (not scraped first in even rounds, scraped first in odd
//! ones), so that a drift of the machine's load over the run weighs on both alike. Results:
//! `results/metrics-cost.{json,md}`, with the target checked on the medians.

use crate::sched::{load_avg, vigil_instance_with};
use crate::{find_vigil, now_epoch_s, r4, results_dir, summarize, vigil_version, write_results};
use clap::Args;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The target: throughput while scraped at least this fraction below the unscraped figure, at most.
const TARGET_COST: f64 = 0.02;

/// Options of `vigil-bench metrics-cost`.
#[derive(Args, Debug)]
pub(crate) struct MetricsCostArgs {
    /// Samples of each mode (medians are compared).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Jobs submitted at once in each sample.
    #[arg(long, default_value_t = 10_000)]
    jobs: usize,
    /// Seconds between two scrapes in the scraped mode (0.1 to 60).
    #[arg(long, default_value_t = 1.0)]
    period_s: f64,
    /// Longest one sample's burst may take before it counts as failed, seconds.
    #[arg(long, default_value_t = 600)]
    bound_s: u64,
}

/// What the scraping thread saw.
#[derive(Debug, Default)]
struct Scrapes {
    /// Scrapes answered 200 with a complete OpenMetrics text.
    ok: usize,
    /// Scrapes that failed once the endpoint had answered one, other than refused connections (before the first
    /// answer the instance is starting; a refusal after it is rank 0 gone at the end of the sample).
    failed: usize,
    /// First failure after the endpoint was up, in words.
    first_failure: Option<String>,
    /// Wall time of each good scrape (connect to last byte), seconds.
    times_s: Vec<f64>,
    /// Size of the largest good answer, bytes.
    max_bytes: usize,
}

/// A port nothing listens on now (the kernel's choice, released at once).
fn free_port() -> Result<u16, String> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("cannot find a free port: {e}"))?;
    l.local_addr().map(|a| a.port()).map_err(|e| format!("cannot find a free port: {e}"))
}

/// Why a scrape got no metrics: nothing listens (the instance is starting or has ended), or something else.
#[derive(Debug)]
enum ScrapeError {
    Refused,
    Failed(String),
}

/// One `GET /metrics` (HTTP/1.0, a connection of its own): the body of a 200 answer, or why not.
fn scrape(addr: SocketAddr) -> Result<String, ScrapeError> {
    use ScrapeError::Failed;
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).map_err(|e| match e.kind() {
        std::io::ErrorKind::ConnectionRefused => ScrapeError::Refused,
        _ => Failed(format!("connect: {e}")),
    })?;
    s.set_read_timeout(Some(Duration::from_secs(5))).map_err(|e| Failed(e.to_string()))?;
    write!(s, "GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n").map_err(|e| Failed(format!("request: {e}")))?;
    let mut text = String::new();
    s.read_to_string(&mut text).map_err(|e| Failed(format!("response: {e}")))?;
    let status = text.split_whitespace().nth(1).unwrap_or("");
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    if status != "200" {
        return Err(Failed(format!("status {status}: {}", body.trim())));
    }
    if !body.ends_with("# EOF\n") {
        return Err(Failed(format!("incomplete OpenMetrics text ({} bytes)", body.len())));
    }
    Ok(body)
}

/// Scrape `addr` every `period` until `stop` is set.
fn scraper(addr: SocketAddr, period: Duration, stop: Arc<AtomicBool>) -> Scrapes {
    let mut sc = Scrapes::default();
    let start = Instant::now();
    let mut k: u32 = 0;
    while !stop.load(Ordering::Relaxed) {
        k += 1;
        let next = start + period * k;
        // Sleep in short steps so that the end of the sample is not held up by a long period.
        while Instant::now() < next && !stop.load(Ordering::Relaxed) {
            std::thread::sleep((next - Instant::now()).min(Duration::from_millis(50)));
        }
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let t = Instant::now();
        match scrape(addr) {
            Ok(body) => {
                sc.ok += 1;
                sc.times_s.push(t.elapsed().as_secs_f64());
                sc.max_bytes = sc.max_bytes.max(body.len());
            }
            // Refused: the instance is starting, or has ended. Anything else once it has answered is a failure.
            Err(ScrapeError::Failed(e)) if sc.ok > 0 => {
                sc.failed += 1;
                sc.first_failure.get_or_insert(e);
            }
            Err(_) => {}
        }
    }
    sc
}

/// One sample: a fresh instance serving metrics, scraped every `period` or not at all. Returns jobs/s (or why
/// not) and, if scraped, what the scraper saw.
fn sample(
    vigil: &std::path::Path,
    a: &MetricsCostArgs,
    scraped: bool,
) -> Result<(f64, Option<f64>, Option<Scrapes>), String> {
    let port = free_port()?;
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().map_err(|e| format!("address: {e}"))?;
    let attrs = [format!("metrics.listen={addr}"), "metrics.ranks=0".to_string()];
    let args = [format!("--jobs={}", a.jobs), format!("--bound-s={}", a.bound_s)];
    let stop = Arc::new(AtomicBool::new(false));
    let thread = scraped.then(|| {
        let stop = stop.clone();
        let period = Duration::from_secs_f64(a.period_s);
        std::thread::spawn(move || scraper(addr, period, stop))
    });
    let res = vigil_instance_with(vigil, &attrs, &args, a.bound_s + 300);
    stop.store(true, Ordering::Relaxed);
    let scrapes = match thread {
        Some(t) => Some(t.join().map_err(|_| "the scraping thread panicked".to_string())?),
        None => None,
    };
    match (res.error, res.total_s, res.done) {
        (None, Some(t), Some(d)) if d == a.jobs && t > 0.0 => Ok((a.jobs as f64 / t, res.submit_s, scrapes)),
        (None, Some(t), Some(d)) => Err(format!("bound hit: {d} of {} jobs done in {t:.0} s", a.jobs)),
        (e, _, _) => Err(e.unwrap_or_else(|| "no result".into())),
    }
}

fn stats(v: &[f64]) -> Value {
    let (median, min, max) = summarize(v);
    json!({"median": median.map(r4), "min": min.map(r4), "max": max.map(r4), "samples": v.iter().map(|x| r4(*x)).collect::<Vec<_>>()})
}

/// `(max - min) / median` of `v`: how far apart samples of one mode fall on this machine.
fn spread(v: &[f64]) -> Option<f64> {
    match summarize(v) {
        (Some(med), Some(min), Some(max)) if med > 0.0 => Some((max - min) / med),
        _ => None,
    }
}

/// The change of `scraped`'s median against `none`'s, as a fraction (negative: slower when scraped).
fn change(none: &[f64], scraped: &[f64]) -> Option<f64> {
    match (summarize(none).0, summarize(scraped).0) {
        (Some(n), Some(s)) if n > 0.0 => Some(s / n - 1.0),
        _ => None,
    }
}

/// The target's row: met when scraping costs at most [`TARGET_COST`] of the median throughput.
fn verdict(change: Option<f64>) -> &'static str {
    match change {
        Some(c) if c >= -TARGET_COST => "met",
        Some(_) => "MISSED",
        None => "not measured",
    }
}

/// `vigil-bench metrics-cost`.
pub(crate) fn run(a: &MetricsCostArgs, vigil: Option<PathBuf>, out_dir: Option<PathBuf>) -> Result<i32, String> {
    if !(0.1..=60.0).contains(&a.period_s) {
        return Err(format!("--period-s must be in [0.1, 60], got {}", a.period_s));
    }
    if a.runs == 0 || a.jobs == 0 {
        return Err("--runs and --jobs must be at least 1".into());
    }
    let vigil = find_vigil(vigil)?;
    let out_dir = results_dir(out_dir);
    let load_start = load_avg();
    let started = now_epoch_s();
    let (mut none, mut scraped) = (Vec::new(), Vec::new());
    let (mut submit_none, mut submit_scraped) = (Vec::new(), Vec::new());
    let mut all_scrapes = Scrapes::default();
    let mut errors = Vec::new();
    for round in 0..a.runs {
        let order = if round % 2 == 0 { [false, true] } else { [true, false] };
        for with in order {
            let what = if with { format!("scraped every {} s", a.period_s) } else { "not scraped".into() };
            eprintln!("vigil-bench metrics-cost: {} jobs, {what} (round {}/{})", a.jobs, round + 1, a.runs);
            match sample(&vigil, a, with) {
                Ok((tp, sub, sc)) => {
                    eprintln!("vigil-bench metrics-cost:   {tp:.1} jobs/s");
                    if with {
                        scraped.push(tp);
                        submit_scraped.extend(sub);
                    } else {
                        none.push(tp);
                        submit_none.extend(sub);
                    }
                    if let Some(sc) = sc {
                        all_scrapes.ok += sc.ok;
                        all_scrapes.failed += sc.failed;
                        if all_scrapes.first_failure.is_none() {
                            all_scrapes.first_failure = sc.first_failure;
                        }
                        all_scrapes.times_s.extend(sc.times_s);
                        all_scrapes.max_bytes = all_scrapes.max_bytes.max(sc.max_bytes);
                    }
                }
                Err(e) => {
                    eprintln!("vigil-bench metrics-cost:   FAILED: {e}");
                    errors.push(format!("round {}, {what}: {e}", round + 1));
                }
            }
        }
    }
    let load_end = load_avg();
    let c = change(&none, &scraped);
    let version = vigil_version(&vigil);
    let doc = json!({
        "group": "metrics-cost",
        "vigil": version,
        "started_epoch_s": r4(started),
        "jobs": a.jobs,
        "period_s": a.period_s,
        "runs": a.runs,
        "load_avg_1m": {"start": load_start, "end": load_end},
        "not_scraped_jobs_per_s": stats(&none),
        "scraped_jobs_per_s": stats(&scraped),
        "submit_s": {"not_scraped": stats(&submit_none), "scraped": stats(&submit_scraped)},
        "change": c.map(r4),
        "spread": {"not_scraped": spread(&none).map(r4), "scraped": spread(&scraped).map(r4)},
        "scrapes": {
            "ok": all_scrapes.ok,
            "failed_after_up": all_scrapes.failed,
            "first_failure": all_scrapes.first_failure,
            "time_s": stats(&all_scrapes.times_s)["median"],
            "time_max_s": stats(&all_scrapes.times_s)["max"],
            "max_bytes": all_scrapes.max_bytes,
        },
        "target": {"max_cost": TARGET_COST, "verdict": verdict(c)},
        "errors": errors,
    });
    let md = markdown(a, &version, &none, &scraped, &all_scrapes, c, (load_start, load_end), &errors);
    print!("{md}");
    write_results(&out_dir, "metrics-cost", &doc, &md)?;
    Ok(i32::from(!errors.is_empty() || none.is_empty() || scraped.is_empty()))
}

fn fmt(x: Option<f64>, prec: usize) -> String {
    x.map_or_else(|| "-".into(), |x| format!("{x:.prec$}"))
}

fn pct(x: Option<f64>) -> String {
    x.map_or_else(|| "-".into(), |x| format!("{:+.1} %", x * 100.0))
}

#[allow(clippy::too_many_arguments)]
fn markdown(
    a: &MetricsCostArgs,
    version: &str,
    none: &[f64],
    scraped: &[f64],
    sc: &Scrapes,
    c: Option<f64>,
    load: (Option<f64>, Option<f64>),
    errors: &[String],
) -> String {
    let mut md = format!(
        "# Cost of serving metrics: {} `true` jobs at once, rank 0 scraped every {} s against not scraped\n\n",
        a.jobs, a.period_s
    );
    md.push_str(&format!(
        "`vigil-bench metrics-cost --runs {} --jobs {} --period-s {}` on `{version}`; 1-minute load average {} at the \
         start, {} at the end. Each sample is a fresh 4-broker instance serving metrics on rank 0 (`-S \
         metrics.listen=127.0.0.1:PORT -S metrics.ranks=0`) whose initial program submits the jobs at once, \
         pipelined on one connection, and follows them until every one is INACTIVE and exited 0 (as `vigil-bench \
         sched`); jobs/s = jobs / (first submit to last INACTIVE). Scraped: the harness GETs `/metrics` every {} s \
         throughout, a new connection each. The two modes alternate in each round (ABBA order).\n\n",
        a.runs,
        a.jobs,
        a.period_s,
        fmt(load.0, 2),
        fmt(load.1, 2),
        a.period_s
    ));
    md.push_str(
        "| mode | samples | median jobs/s | min | max | spread (max-min)/median |\n|---|---|---|---|---|---|\n",
    );
    for (name, v) in [("not scraped", none), (&format!("scraped every {} s", a.period_s)[..], scraped)] {
        let (med, min, max) = summarize(v);
        md.push_str(&format!(
            "| {name} | {} | {} | {} | {} | {} |\n",
            v.len(),
            fmt(med, 1),
            fmt(min, 1),
            fmt(max, 1),
            spread(v).map_or_else(|| "-".into(), |s| format!("{:.1} %", s * 100.0))
        ));
    }
    let (tmed, _, tmax) = summarize(&sc.times_s);
    md.push_str(&format!(
        "\nScrapes: {} answered 200 with a complete OpenMetrics text, {} failed once the endpoint was up (refused \
         connections, before rank 0 listens and after it ends, not counted){}; a scrape took {} ms (median; max {} ms), the largest answer {} bytes.\n\n",
        sc.ok,
        sc.failed,
        sc.first_failure.as_ref().map_or_else(String::new, |f| format!(" (first: {f})")),
        fmt(tmed.map(|t| t * 1e3), 2),
        fmt(tmax.map(|t| t * 1e3), 2),
        sc.max_bytes
    ));
    md.push_str("| target (issue 41) | measured | |\n|---|---|---|\n");
    md.push_str(&format!(
        "| scraped within {:.0} % of not scraped (medians) | {} | {} |\n",
        TARGET_COST * 100.0,
        pct(c),
        verdict(c)
    ));
    if !errors.is_empty() {
        md.push_str("\nFailed samples:\n\n");
        for e in errors {
            md.push_str(&format!("- {e}\n"));
        }
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_target_is_judged_on_the_medians_and_allows_two_percent() {
        let none = [500.0, 480.0, 520.0];
        assert_eq!(verdict(change(&none, &[495.0, 470.0, 505.0])), "met"); // -1 %
        assert_eq!(verdict(change(&none, &[510.0, 530.0, 540.0])), "met"); // faster
        assert_eq!(verdict(change(&none, &[485.0, 480.0, 470.0])), "MISSED"); // -3 %
        assert_eq!(verdict(change(&none, &[])), "not measured");
        assert!((spread(&none).expect("spread") - 0.08).abs() < 1e-9);
    }

    #[test]
    fn a_scrape_of_nothing_listening_fails_and_the_scraper_stops_when_told() {
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port().expect("port")).parse().expect("addr");
        assert!(matches!(scrape(addr), Err(ScrapeError::Refused)));
        let stop = Arc::new(AtomicBool::new(false));
        let t = {
            let stop = stop.clone();
            std::thread::spawn(move || scraper(addr, Duration::from_millis(20), stop))
        };
        std::thread::sleep(Duration::from_millis(100));
        stop.store(true, Ordering::Relaxed);
        let sc = t.join().expect("scraper");
        // Never up: nothing counted as good, and refusals before the first answer are not failures.
        assert_eq!((sc.ok, sc.failed), (0, 0));
    }
}
