//! The metrics endpoint (`-S metrics.listen=ADDR:PORT`, docs/metrics.md): a task beside the broker's loop serves
//! HTTP/1.1 (hyper) on that address:
//! - `GET /metrics`: the OpenMetrics text format (encoded by `prometheus-client`), every name starting `vigil_`;
//! - `GET /livez`: 200 while the broker's loop answers within [`LOOP_WAIT`], else 503;
//! - `GET /readyz`: 200 once the broker is ready for work ([`vigil_core::broker::metrics::Metrics::not_ready`]),
//!   else 503 with why.
//!
//! Each request asks the loop for a snapshot ([`Event::Metrics`]): the broker's own figures
//! ([`Broker::metrics`](vigil_core::broker::core::Broker::metrics)) and the driver's (its prober's datagrams); the
//! encoding happens here, off the loop. Other methods get 405, other paths 404. At most [`MAX_CONNECTIONS`]
//! connections are served at once (more are closed at once), a client has [`HEADER_WAIT`] to send its request
//! head and a connection lasts at most [`CONNECTION_MAX`]: slow or many clients cost bounded memory and never
//! block the loop.

use super::driver::Event;
use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, Semaphore};
use tracing::{debug, warn};
use vigil_core::broker::metrics::{Metrics, TRANSPORTS};
use vigil_core::membership::{PeerState, Rule};

/// Connections served at once; more are closed as soon as they are accepted.
pub(super) const MAX_CONNECTIONS: usize = 16;
/// How long a client may take to send its request head.
pub(super) const HEADER_WAIT: Duration = Duration::from_secs(5);
/// The longest a connection (with its keep-alive requests) is served.
pub(super) const CONNECTION_MAX: Duration = Duration::from_secs(60);
/// How long a request waits for the broker's loop to answer: past it, `/metrics` and `/livez` answer 503.
pub(super) const LOOP_WAIT: Duration = Duration::from_secs(2);

/// The OpenMetrics text format's content type.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What the broker's loop answers an [`Event::Metrics`] with.
#[derive(Debug)]
pub(crate) struct Snapshot {
    /// The broker's own figures.
    pub core: Metrics,
    /// Probe datagrams sent, replies accepted and datagrams dropped as no reply of ours by this broker's prober
    /// (`None`: no prober runs).
    pub probes: Option<(u64, u64, u64)>,
    /// Periods the prober excused: no child answered (its own receive path looked stalled), several children late
    /// at once.
    pub excused: Option<(u64, u64)>,
}

/// Figures the driver's threads observe as they happen, shared with the endpoint.
#[derive(Clone, Debug)]
pub(crate) struct Observed {
    /// Rank 0's fsyncs of its state directory's redo log, seconds.
    pub fsync: Histogram,
    /// From a prober report (a reply or a miss) to its turn in the broker's loop, seconds: how late the judge
    /// hears its detectors (a loop starved of CPU or behind on other work).
    pub report_delay: Histogram,
    /// From the event a detector reported to the verdict this broker's judge made on it, seconds, by new state and
    /// rule; only where the detector knows when the event happened ([`VerdictLatency`]).
    pub verdict_latency: VerdictLatency,
    /// Rank 0: the time the broker took to handle each input that ran one or more full scheduling passes (the
    /// passes and the rest of that input's rules, not the effects carried out after), seconds. The sans-IO core
    /// reads no clock: the driver times the input and sees the core's pass counter grow.
    pub sched_pass: Histogram,
}

/// `vigil_verdict_latency_seconds{state, rule}`: one histogram per verdict kind, 100 µs .. ~13 s, doubling. Timed
/// from the event where its detector knows it: a kernel exit report (the exit's time), a kernel TCP event (reset
/// or close; also when it follows a verdict made on the link's end of file as its reader read it), the last kernel
/// probe reply before the misses, a kernel reply saying the broker is dead (its arrival) or its stalled heartbeat
/// (the last beat). Verdicts with no such event (a goodbye, unacknowledged data, silence) are counted in
/// `vigil_verdicts_total` only.
pub(crate) type VerdictLatency = Family<VerdictLabels, Histogram, fn() -> Histogram>;

fn verdict_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1e-4, 2.0, 18))
}

impl Default for Observed {
    fn default() -> Observed {
        // 100 µs .. ~3.3 s, doubling.
        Observed {
            fsync: Histogram::new(exponential_buckets(1e-4, 2.0, 16)),
            report_delay: Histogram::new(exponential_buckets(1e-4, 2.0, 16)),
            verdict_latency: Family::new_with_constructor(verdict_histogram),
            // 10 µs .. ~1.3 s, doubling.
            sched_pass: Histogram::new(exponential_buckets(1e-5, 2.0, 18)),
        }
    }
}

impl Observed {
    /// Record that the judge made `n` verdicts to `state` by `rule`, `latency` seconds after their event.
    pub(crate) fn verdicts_timed(&self, state: PeerState, rule: Rule, n: u64, latency: f64) {
        let h =
            self.verdict_latency.get_or_create(&VerdictLabels { state: state.name().into(), rule: rule.name().into() });
        for _ in 0..n {
            h.observe(latency);
        }
    }
}

/// Bind `addr` and start serving on it: returns what `vigil uptime` shows (`http://ADDR/metrics`, or why there is
/// none). A bind that fails is reported once here (the broker runs on without metrics); `None` = not asked for.
pub(super) async fn start(
    addr: Option<SocketAddr>,
    events: mpsc::UnboundedSender<Event>,
    observed: Observed,
) -> String {
    let Some(addr) = addr else { return "off".into() };
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(l) => l,
        Err(e) => {
            let why = format!("off: cannot listen on {addr} ({e})");
            warn!("metrics.listen: {why}; this broker serves no metrics");
            return why;
        }
    };
    let bound = listener.local_addr().map_or_else(|_| addr.to_string(), |a| a.to_string());
    tokio::spawn(serve(listener, events, observed));
    format!("http://{bound}/metrics (and /livez, /readyz)")
}

/// Accept connections until the broker exits, each served by a task of its own.
async fn serve(listener: tokio::net::TcpListener, events: mpsc::UnboundedSender<Event>, observed: Observed) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let sock = match listener.accept().await {
            Ok((sock, _)) => sock,
            Err(e) => {
                // Out of descriptors, most likely: wait a little rather than spin.
                debug!("metrics: accept: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            debug!("metrics: {MAX_CONNECTIONS} connections served already; closing a new one");
            continue;
        };
        let (events, observed) = (events.clone(), observed.clone());
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let (events, observed) = (events.clone(), observed.clone());
                async move { Ok::<_, std::convert::Infallible>(answer(&req, &events, &observed).await) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_WAIT)
                .serve_connection(hyper_util::rt::TokioIo::new(sock), service);
            if let Ok(Err(e)) = tokio::time::timeout(CONNECTION_MAX, conn).await {
                debug!("metrics: connection: {e}");
            }
            drop(slot);
        });
    }
}

/// One request's answer.
async fn answer(
    req: &Request<hyper::body::Incoming>,
    events: &mpsc::UnboundedSender<Event>,
    observed: &Observed,
) -> Response<Full<Bytes>> {
    let path = req.uri().path();
    if !matches!(path, "/metrics" | "/livez" | "/readyz") {
        return text(StatusCode::NOT_FOUND, "not found: this endpoint serves /metrics, /livez and /readyz\n");
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut r = text(StatusCode::METHOD_NOT_ALLOWED, "only GET\n");
        r.headers_mut().insert(hyper::header::ALLOW, hyper::header::HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    let Some(snap) = ask(events).await else {
        return text(StatusCode::SERVICE_UNAVAILABLE, "the broker's loop did not answer in time\n");
    };
    match path {
        "/livez" => text(StatusCode::OK, "ok\n"),
        "/readyz" => match &snap.core.not_ready {
            None => text(StatusCode::OK, "ok\n"),
            Some(why) => text(StatusCode::SERVICE_UNAVAILABLE, &format!("not ready: {why}\n")),
        },
        _ => match encode(&snap, observed) {
            Ok(body) => {
                let mut r = Response::new(Full::new(Bytes::from(body)));
                r.headers_mut()
                    .insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static(OPENMETRICS));
                r
            }
            Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, &format!("encoding failed: {e}\n")),
        },
    }
}

/// Ask the broker's loop for a snapshot; `None` if it does not answer within [`LOOP_WAIT`] (or has exited).
async fn ask(events: &mpsc::UnboundedSender<Event>) -> Option<Snapshot> {
    let (tx, rx) = oneshot::channel();
    events.send(Event::Metrics(tx)).ok()?;
    tokio::time::timeout(LOOP_WAIT, rx).await.ok()?.ok()
}

fn text(status: StatusCode, body: &str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"));
    r
}

/// Labels `{state}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: String,
}

/// Labels `{state, rule}` of a verdict.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct VerdictLabels {
    state: String,
    rule: String,
}

/// Labels `{result}` of an inactive job.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: String,
}

/// Labels `{transport}` of an overlay link: tcp, rdma, ofi.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TransportLabel {
    transport: String,
}

/// Labels `{reason}` of an excused probe period: `void` (no child answered: this node's own receive path looked
/// stalled) or `correlated` (several children late at once).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ExcusedLabel {
    reason: String,
}

fn gauge(v: u64) -> Gauge {
    let g = Gauge::default();
    g.set(i64::try_from(v).unwrap_or(i64::MAX));
    g
}

fn counter(v: u64) -> Counter {
    let c = Counter::default();
    c.inc_by(v);
    c
}

/// The OpenMetrics text of `snap` (and of what the driver observed), ending with `# EOF`.
///
/// # Errors
/// Formatting failed (it writes to a `String`, so only on a bug).
pub(crate) fn encode(snap: &Snapshot, observed: &Observed) -> Result<String, std::fmt::Error> {
    let m = &snap.core;
    let mut reg = Registry::with_prefix("vigil");
    reg.register("rank", "This broker's rank", gauge(u64::from(m.rank)));
    reg.register("size", "Brokers in the instance", gauge(u64::from(m.size)));
    reg.register(
        "ready",
        "1 when this broker is ready for work (see /readyz)",
        gauge(u64::from(m.not_ready.is_none())),
    );
    let peers = Family::<StateLabel, Gauge>::default();
    for (s, n) in &m.peers {
        peers.get_or_create(&StateLabel { state: s.name().into() }).set(*n as i64);
    }
    reg.register("peers", "Peers this broker judges (its children, and its parent) by state", peers);
    let verdicts = Family::<VerdictLabels, Counter>::default();
    for (s, r, n) in &m.verdicts {
        verdicts.get_or_create(&VerdictLabels { state: s.name().into(), rule: r.name().into() }).inc_by(*n);
    }
    reg.register("verdicts", "State changes this broker's judge made, by new state and rule", verdicts);
    reg.register_with_unit(
        "verdict_latency",
        "Time from the event a detector reported (an exit, a TCP reset or close, the last probe reply) to the \
         verdict this judge made on it, by new state and rule; only where the event's time is known",
        Unit::Seconds,
        observed.verdict_latency.clone(),
    );
    let lateness = Gauge::<f64, AtomicU64>::default();
    lateness.set(m.lateness);
    reg.register("judge_lateness", "This judge's lateness factor (1: on time; its timeouts stretch by it)", lateness);
    if let Some(now) = m.parent_link {
        let f = Family::<TransportLabel, Gauge>::default();
        for t in TRANSPORTS {
            f.get_or_create(&TransportLabel { transport: t.into() }).set(i64::from(t == now));
        }
        reg.register("parent_link", "This broker's link to its parent: 1 under the transport it runs on", f);
    }
    if let Some((sent, replies, rejected)) = snap.probes {
        reg.register("probes_sent", "Heartbeat probe datagrams sent", counter(sent));
        reg.register("probe_replies", "Heartbeat probe replies accepted", counter(replies));
        reg.register(
            "probe_replies_rejected",
            "Datagrams read on the probe socket and dropped: no reply to one of this prober's requests",
            counter(rejected),
        );
        reg.register_with_unit(
            "detect_report_delay",
            "Time from a prober report (a reply or a miss) to its turn in the broker's loop",
            Unit::Seconds,
            observed.report_delay.clone(),
        );
    }
    if let Some((void, correlated)) = snap.excused {
        let f = Family::<ExcusedLabel, Counter>::default();
        f.get_or_create(&ExcusedLabel { reason: "void".into() }).inc_by(void);
        f.get_or_create(&ExcusedLabel { reason: "correlated".into() }).inc_by(correlated);
        reg.register("probe_periods_excused", "Probe periods in which no child was blamed, by why", f);
    }
    if let Some(i) = &m.instance {
        let ranks = Family::<StateLabel, Gauge>::default();
        for (s, n) in &i.ranks {
            ranks.get_or_create(&StateLabel { state: (*s).into() }).set(*n as i64);
        }
        reg.register("ranks", "The instance's ranks by state (rank 0's view)", ranks);
        reg.register("adopted_ranks", "Ranks under a parent that is not their static one", gauge(i.adopted));
        reg.register("reparents", "Re-parents recorded by rank 0", counter(i.reparents));
        let links = Family::<TransportLabel, Gauge>::default();
        for (t, n) in &i.links {
            links.get_or_create(&TransportLabel { transport: (*t).into() }).set(*n as i64);
        }
        reg.register("links", "The instance's overlay links (each rank up to its parent) by transport", links);
        let jobs = Family::<StateLabel, Gauge>::default();
        for (s, n) in &i.jobs {
            jobs.get_or_create(&StateLabel { state: (*s).into() }).set(*n as i64);
        }
        reg.register("jobs", "Jobs held by rank 0 by state (RFC 21); purged jobs leave it", jobs);
        let results = Family::<ResultLabel, Gauge>::default();
        for (r, n) in &i.results {
            results.get_or_create(&ResultLabel { result: (*r).into() }).set(*n as i64);
        }
        reg.register("jobs_inactive", "INACTIVE jobs held by rank 0 by result", results);
        let ended = Family::<ResultLabel, Counter>::default();
        for (r, n) in &i.ended {
            ended.get_or_create(&ResultLabel { result: (*r).into() }).inc_by(*n);
        }
        reg.register("jobs_ended", "Jobs that ended (became INACTIVE) since rank 0 started, by result", ended);
        let pending = i.jobs.iter().filter(|(s, _)| matches!(*s, "DEPEND" | "PRIORITY" | "SCHED")).map(|j| j.1).sum();
        reg.register("queue_depth", "Jobs waiting to run (DEPEND, PRIORITY, SCHED)", gauge(pending));
        reg.register("jobs_submitted", "Jobs submitted to this rank 0", counter(i.submits));
        reg.register("sched_examined", "Pending jobs looked at by scheduling passes", counter(i.examined));
        reg.register("sched_passes", "Full scheduling passes over a non-empty queue", counter(i.passes));
        reg.register_with_unit(
            "sched_pass",
            "Time rank 0 took to handle each input that ran a full scheduling pass (the pass with the rest of that \
             input's rules)",
            Unit::Seconds,
            observed.sched_pass.clone(),
        );
        reg.register("scheduling_stopped", "1 while scheduling is stopped", gauge(u64::from(i.scheduling_stopped)));
        if let Some(s) = &i.statedir {
            reg.register("store_writes", "Transactions written to the state directory", counter(s.writes));
            reg.register("store_syncs", "fsyncs of the state directory", counter(s.syncs));
            if let Some(r) = s.restarts {
                reg.register("restarts", "Restarts of rank 0 on its state directory", counter(r));
            }
            reg.register("store_health", "State directory: 0 ok, 1 failing, 2 damaged", gauge(u64::from(s.health)));
            reg.register_with_unit(
                "store_fsync",
                "Time of each fsync of the state directory's redo log",
                Unit::Seconds,
                observed.fsync.clone(),
            );
        }
    }
    if let Some((cpu, rss)) = own_usage() {
        let c = Counter::<f64, AtomicU64>::default();
        c.inc_by(cpu);
        reg.register_with_unit("process_cpu", "CPU time of this broker's process (user + system)", Unit::Seconds, c);
        reg.register_with_unit("process_resident_memory", "Resident memory of this broker", Unit::Bytes, gauge(rss));
    }
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &reg)?;
    Ok(out)
}

/// This process's CPU seconds (user + system) and resident bytes, from `/proc/self/stat` and `/proc/self/statm`.
fn own_usage() -> Option<(f64, u64)> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name, which may hold spaces and parentheses: utime and stime are the 12th and
    // 13th after it (proc(5): fields 14 and 15).
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok()??;
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE).ok()??;
    Some((ticks as f64 / hz as f64, pages * page as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot() -> Snapshot {
        Snapshot {
            core: Metrics {
                rank: 0,
                size: 4,
                not_ready: None,
                peers: vec![(PeerState::Online, 2), (PeerState::Lost, 1)],
                verdicts: vec![(PeerState::Lost, Rule::ProbeMisses, 1), (PeerState::Online, Rule::Connected, 3)],
                lateness: 1.5,
                parent_link: Some("rdma"),
                instance: None,
            },
            probes: Some((100, 97, 3)),
            excused: Some((1, 2)),
        }
    }

    /// The text parses as OpenMetrics would be read: `# TYPE` lines, the labelled series, `# EOF` last.
    #[test]
    fn the_text_has_every_family_with_its_labels_and_ends_with_eof() {
        let out = encode(&snapshot(), &Observed::default()).expect("encoded");
        assert!(out.ends_with("# EOF\n"), "{out}");
        for want in [
            "vigil_peers{state=\"lost\"} 1",
            "vigil_verdicts_total{state=\"lost\",rule=\"probe-misses\"} 1",
            "vigil_judge_lateness 1.5",
            "vigil_probes_sent_total 100",
            "vigil_probe_periods_excused_total{reason=\"correlated\"} 2",
            "# TYPE vigil_verdicts counter",
        ] {
            assert!(out.contains(want), "missing {want:?} in:\n{out}");
        }
        assert!(!out.contains("vigil_ranks"), "only rank 0 has instance figures");
        for want in [
            "vigil_probe_replies_rejected_total 3",
            "vigil_parent_link{transport=\"rdma\"} 1",
            "vigil_parent_link{transport=\"tcp\"} 0",
        ] {
            assert!(out.contains(want), "missing {want:?} in:\n{out}");
        }
    }

    /// Rank 0's links by transport, its scheduling passes (a count and the histogram of their inputs' times) and
    /// its ended jobs by result.
    #[test]
    fn rank_0_has_links_sched_passes_and_ended_jobs() {
        use vigil_core::broker::metrics::InstanceMetrics;
        let mut snap = snapshot();
        snap.core.parent_link = None;
        snap.core.instance = Some(InstanceMetrics {
            ranks: vec![("online", 4)],
            adopted: 0,
            reparents: 0,
            links: vec![("ofi", 0), ("rdma", 2), ("tcp", 1)],
            jobs: vec![("SCHED", 1)],
            results: vec![],
            submits: 5,
            examined: 9,
            passes: 3,
            ended: vec![("CANCELED", 1), ("COMPLETED", 3)],
            scheduling_stopped: false,
            statedir: None,
        });
        let observed = Observed::default();
        observed.sched_pass.observe(0.0003);
        let out = encode(&snap, &observed).expect("encoded");
        for want in [
            "vigil_links{transport=\"rdma\"} 2",
            "vigil_links{transport=\"tcp\"} 1",
            "vigil_sched_passes_total 3",
            "# TYPE vigil_sched_pass_seconds histogram",
            "vigil_sched_pass_seconds_count 1",
            "vigil_sched_pass_seconds_bucket{le=\"0.00032\"} 1",
            "vigil_sched_pass_seconds_bucket{le=\"0.00016\"} 0",
            "vigil_jobs_ended_total{result=\"COMPLETED\"} 3",
        ] {
            assert!(out.contains(want), "missing {want:?} in:\n{out}");
        }
        assert!(!out.contains("vigil_parent_link"), "rank 0 has no parent link");
    }

    /// A timed verdict is a histogram series of its own state and rule, in seconds.
    #[test]
    fn timed_verdicts_are_a_histogram_by_state_and_rule() {
        let observed = Observed::default();
        observed.verdicts_timed(PeerState::Lost, Rule::ProbeMisses, 2, 0.03);
        observed.verdicts_timed(PeerState::Lost, Rule::Closed, 1, 0.0005);
        let out = encode(&snapshot(), &observed).expect("encoded");
        for want in [
            "# TYPE vigil_verdict_latency_seconds histogram",
            "vigil_verdict_latency_seconds_count{state=\"lost\",rule=\"probe-misses\"} 2",
            "vigil_verdict_latency_seconds_sum{state=\"lost\",rule=\"probe-misses\"} 0.06",
            "vigil_verdict_latency_seconds_bucket{le=\"0.0512\",state=\"lost\",rule=\"probe-misses\"} 2",
            "vigil_verdict_latency_seconds_bucket{le=\"0.0256\",state=\"lost\",rule=\"probe-misses\"} 0",
            "vigil_verdict_latency_seconds_count{state=\"lost\",rule=\"closed\"} 1",
        ] {
            assert!(out.contains(want), "missing {want:?} in:\n{out}");
        }
    }
}
