//! The metrics endpoint (`-S metrics.listen`, docs/metrics.md) as an operator meets it: `/metrics` in the
//! OpenMetrics text format, `/livez` and `/readyz`, clear answers to anything else, and a real Prometheus
//! (Debian's `prometheus`, started here on loopback with a configuration of its own) scraping rank 0 and seeing a
//! killed broker counted as lost; the overlay's links by transport, the scheduler's passes and ended jobs.

mod common;

use common::*;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A port nothing listens on now (the kernel's choice, released at once).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port()
}

/// One HTTP/1.0 request; the status code and the body.
fn http(addr: SocketAddr, method: &str, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    write!(s, "{method} {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").expect("request");
    let mut text = String::new();
    s.read_to_string(&mut text).expect("response");
    let code = text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    (code, body)
}

/// The value of the series `name` (with its labels, exactly as written) in an OpenMetrics text.
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')).and_then(|v| v.parse().ok()))
}

#[test]
fn rank_0_serves_openmetrics_livez_and_readyz_and_refuses_the_rest() {
    let port = free_port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
    let listen = format!("metrics.listen={addr}");
    let inst = Instance::start(4, &[&listen, "metrics.ranks=0"]);
    // `vigil uptime` says where the metrics are.
    let up = inst.vigil(&["uptime"]);
    up.ok();
    assert!(up.stdout.contains(&format!("metrics (rank 0): http://{addr}/metrics")), "{}", up.dump());
    assert!(wait_for(Duration::from_secs(20), || {
        let (code, text) = http(addr, "GET", "/metrics");
        code == 200 && value(&text, "vigil_ranks{state=\"online\"}") == Some(4.0)
    }));
    let (_, text) = http(addr, "GET", "/metrics");
    assert!(text.ends_with("# EOF\n"), "{text}");
    for series in ["vigil_size 4", "vigil_ready 1", "vigil_peers{state=\"online\"} 3", "vigil_jobs_submitted_total 0"] {
        assert!(text.contains(series), "no {series:?} in:\n{text}");
    }
    assert!(text.contains("vigil_verdicts_total{state=\"online\",rule=\"connected\"} 3"), "{text}");
    assert!(text.contains("vigil_process_cpu_seconds_total"), "{text}");
    // A job moves the job figures.
    let id = inst.submit(&["-N2", "true"]);
    assert!(inst.wait_state(&id, "INACTIVE", Duration::from_secs(30)));
    let (_, text) = http(addr, "GET", "/metrics");
    assert_eq!(value(&text, "vigil_jobs_submitted_total"), Some(1.0), "{text}");
    assert_eq!(value(&text, "vigil_jobs_inactive{result=\"COMPLETED\"}"), Some(1.0), "{text}");
    // Rank 0 probes its children's node (this machine): the loop timed the reports it took.
    assert!(value(&text, "vigil_probe_replies_total").is_some_and(|n| n > 0.0), "{text}");
    assert!(value(&text, "vigil_detect_report_delay_seconds_count").is_some_and(|n| n > 0.0), "{text}");
    assert_eq!(http(addr, "GET", "/livez"), (200, "ok\n".into()));
    assert_eq!(http(addr, "GET", "/readyz"), (200, "ok\n".into()));
    assert_eq!(http(addr, "POST", "/metrics").0, 405);
    assert_eq!(http(addr, "GET", "/jobs").0, 404);
    // A client that connects and says nothing holds one connection only for the header timeout; others are
    // served meanwhile.
    let idle: Vec<TcpStream> = (0..4).map(|_| TcpStream::connect(addr).expect("connect")).collect();
    assert_eq!(http(addr, "GET", "/livez").0, 200);
    drop(idle);
    // The attributes say what was asked for.
    let got = inst.vigil(&["getattr", "metrics.ranks"]);
    got.ok();
    assert_eq!(got.stdout.trim(), "0");
}

/// Where rank `r` serves its metrics, as `vigil uptime -r R` says (`metrics.listen` with port 0).
fn metrics_addr(inst: &Instance, r: u32) -> SocketAddr {
    let up = inst.vigil(&["uptime", "-r", &r.to_string()]);
    up.ok();
    let after = format!("metrics (rank {r}): http://");
    let rest = up.stdout.split(&after).nth(1).unwrap_or_else(|| panic!("no metrics address: {}", up.dump()));
    rest.split("/metrics").next().and_then(|a| a.parse().ok()).unwrap_or_else(|| panic!("{}", up.dump()))
}

/// The overlay's links by transport (rank 0: the instance's, every transport listed; a child: its own parent
/// link), the scheduler's passes with their time, the probe datagrams dropped, and jobs ended by result.
#[test]
fn links_by_transport_sched_passes_and_ended_jobs_are_series() {
    let inst = Instance::start(4, &["metrics.listen=127.0.0.1:0"]);
    let (a0, a1) = (metrics_addr(&inst, 0), metrics_addr(&inst, 1));
    // Each child reports its parent link to rank 0 once it is up: 3 TCP links on loopback.
    assert!(wait_for(Duration::from_secs(20), || {
        value(&http(a0, "GET", "/metrics").1, "vigil_links{transport=\"tcp\"}") == Some(3.0)
    }));
    let (_, text) = http(a0, "GET", "/metrics");
    assert_eq!(value(&text, "vigil_links{transport=\"rdma\"}"), Some(0.0), "{text}");
    assert_eq!(value(&text, "vigil_links{transport=\"ofi\"}"), Some(0.0), "{text}");
    assert_eq!(value(&text, "vigil_probe_replies_rejected_total"), Some(0.0), "{text}");
    assert!(!text.contains("vigil_parent_link"), "rank 0 has no parent: {text}");
    let (code, text) = http(a1, "GET", "/metrics");
    assert_eq!(code, 200, "{text}");
    assert_eq!(value(&text, "vigil_parent_link{transport=\"tcp\"}"), Some(1.0), "{text}");
    assert_eq!(value(&text, "vigil_parent_link{transport=\"rdma\"}"), Some(0.0), "{text}");
    assert!(!text.contains("vigil_sched_pass"), "only rank 0 schedules: {text}");
    // A job on one core, a second one waiting behind it for every core; cancelling the first lets a pass start the
    // second.
    let first = inst.submit(&["-N1", "-c1", "sleep", "60"]);
    assert!(inst.wait_state(&first, "RUN", Duration::from_secs(30)));
    let second = inst.submit(&["-N4", "-c2", "true"]);
    assert!(inst.wait_state(&second, "SCHED", Duration::from_secs(10)));
    let before = value(&http(a0, "GET", "/metrics").1, "vigil_sched_passes_total").expect("a pass count");
    inst.vigil(&["cancel", &first]).ok();
    assert!(inst.wait_state(&second, "INACTIVE", Duration::from_secs(30)));
    let (_, text) = http(a0, "GET", "/metrics");
    assert_eq!(value(&text, "vigil_jobs_ended_total{result=\"CANCELED\"}"), Some(1.0), "{text}");
    assert_eq!(value(&text, "vigil_jobs_ended_total{result=\"COMPLETED\"}"), Some(1.0), "{text}");
    assert_eq!(value(&text, "vigil_jobs_ended_total{result=\"FAILED\"}"), Some(0.0), "{text}");
    let passes = value(&text, "vigil_sched_passes_total").expect("passes");
    assert!(passes > before, "{before} -> {passes}: {text}");
    // Each input that ran a pass is timed: at least one since then, and within the histogram's buckets.
    let count = value(&text, "vigil_sched_pass_seconds_count").expect("a histogram");
    let sum = value(&text, "vigil_sched_pass_seconds_sum").expect("a histogram");
    assert!(count >= 1.0 && count <= passes, "count {count}, passes {passes}: {text}");
    assert!(sum > 0.0, "{text}");
}

#[test]
fn a_port_taken_by_another_program_is_reported_and_the_broker_runs_on() {
    let taken = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("addr");
    let listen = format!("metrics.listen={addr}");
    let inst = Instance::start(2, &[&listen, "metrics.ranks=0"]);
    let up = inst.vigil(&["uptime"]);
    up.ok();
    assert!(up.stdout.contains(&format!("metrics (rank 0): off: cannot listen on {addr}")), "{}", up.dump());
    // The instance works.
    let run = inst.vigil(&["run", "-N2", "true"]);
    run.ok();
    // Another rank says what it serves (nothing here) and leaves rank 0's state directory out.
    let up1 = inst.vigil(&["uptime", "-r", "1"]);
    up1.ok();
    assert!(up1.stdout.contains("metrics (rank 1): off"), "{}", up1.dump());
    assert!(!up1.stdout.contains("state directory"), "{}", up1.dump());
    let none = inst.vigil(&["uptime", "--rank", "7"]);
    assert_ne!(none.code, 0, "{}", none.dump());
    assert!(none.stderr.contains("rank 7"), "{}", none.dump());
}

#[test]
fn metrics_ranks_naming_no_broker_stop_the_start_with_the_reason() {
    let (out, _dir) =
        start_and_run(2, &["metrics.listen=127.0.0.1:0", "metrics.ranks=0,5"], &["true"], Duration::from_secs(60));
    assert_ne!(out.code, 0, "{}", out.dump());
    assert!(
        out.stderr.contains("metrics.ranks=0,5 names rank 5, but this instance has 2 brokers (ranks 0-1)"),
        "{}",
        out.dump()
    );
}

#[test]
fn prometheus_scrapes_rank_0_and_sees_a_killed_broker_lost() {
    let Some(prometheus) =
        ["/usr/bin/prometheus", "/usr/local/bin/prometheus"].into_iter().find(|p| std::path::Path::new(p).exists())
    else {
        // ci/setup.sh installs it; a machine set up otherwise says why this is not tried.
        eprintln!("SKIP: no prometheus binary (apt-get install prometheus)");
        return;
    };
    let port = free_port();
    let target = format!("127.0.0.1:{port}");
    let listen = format!("metrics.listen={target}");
    let inst = Instance::start(4, &[&listen, "metrics.ranks=0"]);
    let dir = inst.dir.path().join("prometheus");
    std::fs::create_dir_all(&dir).expect("dir");
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: vigil\n    \
             static_configs:\n      - targets: ['{target}']\n"
        ),
    )
    .expect("config");
    let web = format!("127.0.0.1:{}", free_port());
    let mut prom = Command::new(prometheus)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
        .arg(format!("--web.listen-address={web}"))
        .stdout(Stdio::null())
        .stderr(Stdio::from(std::fs::File::create(dir.join("log")).expect("log")))
        .spawn()
        .expect("prometheus");
    let web_addr: SocketAddr = web.parse().expect("addr");
    // Prometheus's HTTP API: the instant value of `query`, if it has one.
    let query = |q: &str| -> Option<f64> {
        let path = format!("/api/v1/query?query={}", q.replace('{', "%7B").replace('}', "%7D").replace('"', "%22"));
        let Ok(mut s) = TcpStream::connect_timeout(&web_addr, Duration::from_secs(2)) else { return None };
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").ok()?;
        let mut text = String::new();
        s.read_to_string(&mut text).ok()?;
        let body: serde_json::Value = serde_json::from_str(text.split_once("\r\n\r\n")?.1).ok()?;
        body["data"]["result"][0]["value"][1].as_str()?.parse().ok()
    };
    let seen = wait_for(Duration::from_secs(60), || query("vigil_ranks{state=\"online\"}") == Some(4.0));
    let log = || std::fs::read_to_string(dir.join("log")).unwrap_or_default();
    if !seen {
        let _ = prom.kill();
        panic!("Prometheus never saw 4 ranks online; its log:\n{}", log());
    }
    assert_eq!(query("up{job=\"vigil\"}"), Some(1.0), "the scrape target is up");
    // Kill rank 3's broker: rank 0 counts it lost, and Prometheus sees it on a later scrape.
    let pid = inst.vigil(&["getattr", "-r", "3", "broker.pid"]);
    pid.ok();
    let pid: i32 = pid.stdout.trim().parse().expect("pid");
    let t0 = Instant::now();
    // SAFETY: kill(2) of a process this test's instance started.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let lost = wait_for(Duration::from_secs(30), || query("vigil_ranks{state=\"lost\"}") == Some(1.0));
    let _ = prom.kill();
    let _ = prom.wait();
    assert!(lost, "Prometheus never saw the killed broker lost; its log:\n{}", log());
    eprintln!(
        "kill -9 of rank 3 -> vigil_ranks{{state=\"lost\"}} 1 in Prometheus: {:.1} s",
        t0.elapsed().as_secs_f64()
    );
}

#[test]
fn a_killed_brokers_lost_verdict_is_timed_from_the_event_its_detector_saw() {
    let port = free_port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
    let listen = format!("metrics.listen={addr}");
    let inst = Instance::start(4, &[&listen, "metrics.ranks=0"]);
    assert!(wait_for(Duration::from_secs(20), || {
        let (code, text) = http(addr, "GET", "/metrics");
        code == 200 && value(&text, "vigil_peers{state=\"online\"}") == Some(3.0)
    }));
    // The kernel's TCP events time a verdict made on a link's end of file: wait for the eBPF detectors to load.
    let ebpf =
        wait_for(Duration::from_secs(20), || inst.vigil(&["uptime"]).stdout.contains("detectors (rank 0): tcp ebpf"));
    if !ebpf {
        eprintln!("SKIP: no eBPF TCP detector on this machine: {}", inst.vigil(&["uptime"]).stdout);
        return;
    }
    // No family until a verdict is timed.
    let (_, text) = http(addr, "GET", "/metrics");
    assert!(!text.contains("vigil_verdict_latency_seconds"), "{text}");
    // Rank 2 is one of rank 0's children in every topology of 4 brokers: rank 0's judge makes its verdict.
    let pid = inst.vigil(&["getattr", "-r", "2", "broker.pid"]);
    pid.ok();
    let pid: i32 = pid.stdout.trim().parse().expect("pid");
    let t0 = Instant::now();
    // SAFETY: kill(2) of a process this test's instance started.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let lost = |text: &str| {
        text.lines()
            .filter(|l| l.starts_with("vigil_verdicts_total{state=\"lost\""))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
    };
    assert!(wait_for(Duration::from_secs(30), || lost(&http(addr, "GET", "/metrics").1) == 1.0));
    let waited = t0.elapsed().as_secs_f64();
    let (_, text) = http(addr, "GET", "/metrics");
    // The one lost verdict, by whichever detector saw the death first: timed if that detector knew when it
    // happened (the kernel's exit report, its TCP close, the responder's reply that the broker is dead).
    let rule = text
        .lines()
        .find(|l| l.starts_with("vigil_verdicts_total{state=\"lost\"") && l.ends_with(" 1"))
        .and_then(|l| l.split("rule=\"").nth(1)?.split('"').next())
        .expect("the lost verdict's rule")
        .to_string();
    let series =
        |s: &str| value(&text, &format!("vigil_verdict_latency_seconds_{s}{{state=\"lost\",rule=\"{rule}\"}}"));
    let (Some(count), Some(sum)) = (series("count"), series("sum")) else {
        panic!("the lost verdict (rule {rule}) was not timed:\n{text}");
    };
    assert_eq!(count, 1.0, "{text}");
    // From the event to the verdict: after the kill, within the wait for it (and never negative).
    assert!((0.0..=waited).contains(&sum), "latency {sum} s, verdict seen {waited:.3} s after the kill:\n{text}");
    let inf =
        value(&text, &format!("vigil_verdict_latency_seconds_bucket{{le=\"+Inf\",state=\"lost\",rule=\"{rule}\"}}"));
    assert_eq!(inf, Some(1.0), "{text}");
    eprintln!("kill -9 of rank 2: lost by rule {rule}, {:.2} ms after the event", sum * 1e3);
}
