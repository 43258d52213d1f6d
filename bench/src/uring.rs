//! `vigil-bench uring`: does `io_uring` beat tokio's epoll path for the overlay's TCP links?
//!
//! Two "brokers" run in this process, each on its own thread with its own current-thread tokio runtime (as
//! `vigil broker` runs), connected over loopback TCP with `TCP_NODELAY` (`transport::tune_tcp`). Both ends of
//! a connection use the same link implementation, one of:
//! - `epoll`: `vigil::broker::transport::link_from_stream` on a tokio `TcpStream`, i.e. the broker's own code
//!   (reader task on `read_frame`, writer task with `BufWriter` batching);
//! - `epoll+buffered`: the same function on the stream wrapped in a 256 KiB `BufReader` and a 256 KiB
//!   `BufWriter`, the buffer sizes of the io_uring link, to tell the gain of moving bytes in large chunks
//!   apart from the gain of `io_uring` itself (`read_frame` on a bare stream makes three `read` calls per
//!   frame, and the link's 8 KiB `BufWriter` writes every frame above 8 KiB on its own);
//! - `io_uring`: [`crate::uring_link`], one ring thread per link bridged to the same `Link` channels.
//!
//! Every message is a real overlay frame encoded and decoded by `vigil::message`. Measurements, each repeated
//! over `--runs` rounds with the order of the paths rotated every round (a/b/c, b/c/a, ...) so drift of the
//! machine's load hits all of them:
//! - RPC round trip: a routed `job-info.lookup` request, answered by the other broker with a small response;
//!   one in flight at a time, `--round-trips` timed after 1000 untimed; median and p99 (nearest rank) of all
//!   samples of all rounds, plus the spread of the per-round medians;
//! - streaming: events with 64-byte and 64 KiB payloads sent one way as fast as a credit window allows (the
//!   receiver returns a credit every `window/4` messages, so memory stays bounded as in a real overlay);
//!   messages/s and MB/s (MB = 10^6 bytes of whole frames on the wire), median over rounds.
//!
//! Results: `bench/results/uring.{json,md}`. If `io_uring` cannot be used (`io_uring_setup` refused, opcodes
//! missing), the group is reported as skipped with the reason and exits 0.

use crate::uring_link::{probe, uring_link, RECV_BUF};
use crate::{now_epoch_s, p99, results_dir, summarize, write_results};
use clap::Args;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::Instant;
use tokio::io::{BufReader, BufWriter};
use vigil::broker::transport::{link_from_stream, tune_tcp, Link, LinkEvent, TCP_USER_TIMEOUT_MS};
use vigil::message::{Message, MsgType, ROUTE_LOCAL};

/// Default rounds (each runs every path once per measurement).
pub(crate) const DEFAULT_RUNS: usize = 7;
/// Untimed round trips before the timed ones, per run.
const WARMUP_ROUND_TRIPS: usize = 1000;
/// Payload of the small streaming messages, bytes.
pub(crate) const SMALL_PAYLOAD: usize = 64;
/// Payload of the large streaming messages, bytes.
pub(crate) const LARGE_PAYLOAD: usize = 64 << 10;
/// Credit window (messages in flight) for 64-byte messages.
pub(crate) const SMALL_WINDOW: usize = 4096;
/// Credit window (messages in flight) for 64 KiB messages (4 MiB).
pub(crate) const LARGE_WINDOW: usize = 64;
/// io_uring must be at least this much faster on the median RPC round trip (ratio io_uring/best epoll at most
/// this) to be called a clear win worth a second transport implementation.
const CLEAR_WIN_RATIO: f64 = 0.90;

/// Options of `vigil-bench uring`.
#[derive(Args, Debug)]
pub(crate) struct UringArgs {
    /// Rounds; each runs every path once per measurement, in rotated order.
    #[arg(long, default_value_t = DEFAULT_RUNS)]
    pub(crate) runs: usize,
    /// Timed RPC round trips per path per round (at least 10000 for the published table).
    #[arg(long, default_value_t = 10_000)]
    pub(crate) round_trips: usize,
    /// 64-byte messages streamed per path per round.
    #[arg(long, default_value_t = 400_000)]
    pub(crate) small_messages: usize,
    /// 64 KiB messages streamed per path per round.
    #[arg(long, default_value_t = 10_000)]
    pub(crate) large_messages: usize,
}

/// A link implementation under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Path {
    /// `transport::link_from_stream` on a tokio `TcpStream` (the broker's plain path, before links were
    /// authenticated).
    Epoll,
    /// The broker's authenticated path: the Noise handshake, then `transport::secure_link` (records sealed
    /// with AES-256-GCM). Not in [`Path::ALL`]: `vigil-bench auth` compares it with [`Path::Epoll`].
    Noise,
    /// The same on a stream wrapped in a `BufReader` and a `BufWriter` as large as the io_uring link's buffer.
    EpollBuffered,
    /// [`crate::uring_link::uring_link`].
    Uring,
}

impl Path {
    /// Every path, in the order of the table.
    const ALL: [Path; 3] = [Path::Epoll, Path::EpollBuffered, Path::Uring];

    /// Short name used in the JSON and the table.
    fn name(self) -> &'static str {
        match self {
            Path::Epoll => "epoll",
            Path::Noise => "epoll+noise",
            Path::EpollBuffered => "epoll+buffered",
            Path::Uring => "io_uring",
        }
    }
}

/// One end of a connection: its link, and the ring thread behind it (io_uring only).
pub(crate) struct End {
    /// The broker-facing link.
    link: Link,
    /// The io_uring link thread, joined after the link is dropped.
    thread: Option<std::thread::JoinHandle<()>>,
}

/// The overlay key and instance both ends of a [`Path::Noise`] link use.
pub(crate) fn bench_auth() -> &'static vigil::broker::secure::LinkAuth {
    static AUTH: std::sync::OnceLock<vigil::broker::secure::LinkAuth> = std::sync::OnceLock::new();
    AUTH.get_or_init(|| {
        let key = vigil::keyfile::OverlayKey::from_hex(&"5a".repeat(32)).expect("a 64-digit key");
        vigil::broker::secure::LinkAuth::new(key, "bench")
    })
}

/// Wrap a freshly connected socket into a link of `path`; `initiator` is the connecting end (it runs the
/// initiator's side of a handshake and sends a `hello` first, as a child broker does). Must run inside a tokio
/// runtime.
pub(crate) async fn open(path: Path, s: tokio::net::TcpStream, peer: &str, initiator: bool) -> Result<End, String> {
    use vigil::broker::secure;
    tune_tcp(&s, TCP_USER_TIMEOUT_MS);
    Ok(match path {
        Path::Epoll => End { link: link_from_stream(s, peer.into()), thread: None },
        Path::Noise => {
            let mut s = s;
            let session = if initiator {
                secure::initiate(&mut s, bench_auth()).await
            } else {
                secure::respond(&mut s, bench_auth()).await
            }
            .map_err(|e| format!("handshake: {e}"))?;
            let link = vigil::broker::transport::secure_link(s, session, peer.into(), None);
            if initiator {
                // The responder's first record must be small (it is a broker's hello).
                link.tx.send(Message::control("hello", &json!({"rank": 1}))).map_err(|_| "link closed")?;
            }
            End { link, thread: None }
        }
        Path::EpollBuffered => {
            let s = BufWriter::with_capacity(RECV_BUF, BufReader::with_capacity(RECV_BUF, s));
            End { link: link_from_stream(s, peer.into()), thread: None }
        }
        Path::Uring => {
            let std = s.into_std().map_err(|e| format!("into_std: {e}"))?;
            let u = uring_link(std, peer.into()).map_err(|e| format!("io_uring link: {e}"))?;
            End { link: u.link, thread: Some(u.thread) }
        }
    })
}

/// What the server broker does with what it receives.
#[derive(Debug, Clone, Copy)]
enum Serve {
    /// Answer every request with a small response.
    Echo,
    /// Count messages; every `credit_every` messages, send back a credit (an event whose `seq` is the count).
    Sink {
        /// Messages between credits.
        credit_every: usize,
    },
}

/// The response the server sends: what `Message::response_to` builds, with a fixed JSON payload prepared once
/// so that only transport work differs between paths.
fn reply(req: &Message, payload: &[u8]) -> Message {
    Message {
        msgtype: MsgType::Response,
        flags: 0,
        topic: req.topic.clone(),
        matchtag: req.matchtag,
        nodeid: req.nodeid,
        userid: req.userid,
        errnum: 0,
        seq: 0,
        route: req.route.clone(),
        payload: payload.to_vec(),
    }
}

/// The server broker's loop, until the client closes.
async fn serve(link: &mut Link, mode: Serve) {
    let payload =
        serde_json::to_vec(&json!({"id": 123456789u64, "state": "RUN", "t_submit": 1796034149.25})).unwrap_or_default();
    let mut n = 0usize;
    while let Some(ev) = link.rx.recv().await {
        let LinkEvent::Message(m) = ev else { break };
        if m.msgtype == MsgType::Control {
            continue; // a hello
        }
        let out = match mode {
            Serve::Echo => reply(&m, &payload),
            Serve::Sink { credit_every } => {
                n += 1;
                if !n.is_multiple_of(credit_every) {
                    continue;
                }
                let mut c = Message::event("bench.credit", &());
                c.seq = n as u32;
                c
            }
        };
        if link.tx.send(out).is_err() {
            break;
        }
    }
}

/// Connect two brokers (threads with their own current-thread runtimes) with links of `path`, run `mode` on
/// the server and `client` on the client, then close both ends and join every thread.
fn run_pair<T>(path: Path, mode: Serve, client: impl AsyncFnOnce(&mut Link) -> Result<T, String>) -> Result<T, String> {
    let rt = || tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string());
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| format!("bind: {e}"))?;
    listener.set_nonblocking(true).map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let server_rt = rt()?;
    let server = std::thread::Builder::new()
        .name("bench-server".into())
        .spawn(move || -> Result<(), String> {
            let end = server_rt.block_on(async move {
                let l = tokio::net::TcpListener::from_std(listener).map_err(|e| e.to_string())?;
                let (s, _) = l.accept().await.map_err(|e| format!("accept: {e}"))?;
                let mut end = open(path, s, "client", false).await?;
                serve(&mut end.link, mode).await;
                Ok::<_, String>(end)
            })?;
            let thread = end.thread;
            drop(end.link);
            drop(server_rt);
            if let Some(t) = thread {
                t.join().map_err(|_| "server io_uring thread panicked".to_string())?;
            }
            Ok(())
        })
        .map_err(|e| e.to_string())?;
    let client_rt = rt()?;
    let r = client_rt.block_on(async move {
        let s = tokio::net::TcpStream::connect(addr).await.map_err(|e| format!("connect: {e}"))?;
        let mut end = open(path, s, "server", true).await?;
        let r = client(&mut end.link).await;
        Ok::<_, String>((r, end))
    });
    let (r, end) = r?;
    let thread = end.thread;
    drop(end.link);
    drop(client_rt);
    if let Some(t) = thread {
        t.join().map_err(|_| "client io_uring thread panicked".to_string())?;
    }
    server.join().map_err(|_| "server thread panicked".to_string())??;
    r
}

/// The RPC request: a routed `job-info.lookup` from a local client to rank 3, as the overlay forwards it.
fn rpc_request() -> Message {
    let mut m = Message::request("job-info.lookup", 3, &json!({"ids": [123456789u64], "keys": ["jobspec"]}));
    m.route = vec![ROUTE_LOCAL | 4, 0];
    m.userid = 1000;
    m
}

/// One run of `n` timed round trips (after the warm-up); latencies in microseconds.
pub(crate) fn rpc_run(path: Path, n: usize) -> Result<Vec<f64>, String> {
    run_pair(path, Serve::Echo, async |link: &mut Link| {
        let base = rpc_request();
        let mut lat = Vec::with_capacity(n);
        for i in 0..WARMUP_ROUND_TRIPS + n {
            let mut req = base.clone();
            req.matchtag = i as u32;
            let t0 = Instant::now();
            link.tx.send(req).map_err(|_| "link closed while sending".to_string())?;
            match link.rx.recv().await {
                Some(LinkEvent::Message(m)) if m.matchtag == i as u32 && m.msgtype == MsgType::Response => {}
                other => return Err(format!("round trip {i}: unexpected {other:?}")),
            }
            if i >= WARMUP_ROUND_TRIPS {
                lat.push(t0.elapsed().as_secs_f64() * 1e6);
            }
        }
        Ok(lat)
    })
}

/// Throughput of one streaming run.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rate {
    /// Messages per second.
    pub(crate) msgs_per_s: f64,
    /// Megabytes (10^6 bytes of whole frames) per second.
    pub(crate) mb_per_s: f64,
}

/// Stream `count` events with `payload` bytes of payload under a credit window of `window` messages; the
/// clock starts at the first credit (after one window's worth of warm-up) and stops at the last.
pub(crate) fn stream_run(path: Path, payload: usize, count: usize, window: usize) -> Result<Rate, String> {
    let credit_every = (window / 4).max(1);
    // Whole windows: the warm-up, then `count` rounded up to a multiple of the credit period.
    let warm = credit_every;
    let total = warm + count.div_ceil(credit_every) * credit_every;
    let mut msg = Message::event("bench.stream", &());
    msg.payload = vec![b'7'; payload];
    let frame_len = msg.encode().len();
    run_pair(path, Serve::Sink { credit_every }, async move |link: &mut Link| {
        let (mut sent, mut acked) = (0usize, 0usize);
        let mut start: Option<(Instant, usize)> = None;
        while acked < total {
            while sent < total && sent - acked < window {
                let mut m = msg.clone();
                m.seq = sent as u32;
                link.tx.send(m).map_err(|_| "link closed while sending".to_string())?;
                sent += 1;
            }
            match link.rx.recv().await {
                Some(LinkEvent::Message(m)) => acked = m.seq as usize,
                other => return Err(format!("stream: unexpected {other:?} after {acked} credits")),
            }
            if start.is_none() && acked >= warm {
                start = Some((Instant::now(), acked));
            }
        }
        let (t0, from) = start.ok_or("no credit came back")?;
        let secs = t0.elapsed().as_secs_f64();
        let msgs = (total - from) as f64;
        if secs <= 0.0 || msgs <= 0.0 {
            return Err("streaming run too short to time".into());
        }
        Ok(Rate { msgs_per_s: msgs / secs, mb_per_s: msgs * frame_len as f64 / secs / 1e6 })
    })
}

/// Samples of one path.
#[derive(Debug, Default)]
struct Series {
    /// RPC round trips of all runs, microseconds.
    rtt_us: Vec<f64>,
    /// Median round trip of each run, microseconds.
    rtt_run_median_us: Vec<f64>,
    /// 64-byte streaming rate of each run.
    small: Vec<Rate>,
    /// 64 KiB streaming rate of each run.
    large: Vec<Rate>,
}

/// Median of `v`, or NaN when empty.
fn median(v: &[f64]) -> f64 {
    summarize(v).0.unwrap_or(f64::NAN)
}

/// Round to `d` decimals, for compact JSON.
fn round(x: f64, d: i32) -> f64 {
    let f = 10f64.powi(d);
    (x * f).round() / f
}

/// `vigil-bench uring`: measure, print the table, write bench/results/uring.{json,md}.
pub(crate) fn run(a: &UringArgs, out_dir: Option<PathBuf>) -> Result<i32, String> {
    if a.runs == 0 || a.round_trips == 0 || a.small_messages == 0 || a.large_messages == 0 {
        return Err("--runs, --round-trips and the message counts must be at least 1".into());
    }
    if a.round_trips < 10_000 {
        eprintln!("vigil-bench: warning: --round-trips {} is below the 10000 of the published table", a.round_trips);
    }
    let out_dir = results_dir(out_dir);
    let ncpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let kernel =
        std::fs::read_to_string("/proc/sys/kernel/osrelease").map(|s| s.trim().to_string()).unwrap_or_default();
    let now_s = now_epoch_s().floor();
    let setup = match probe() {
        Ok(s) => s,
        Err(why) => {
            let doc = json!({"benchmark": "vigil-bench uring", "skipped": why, "kernel": kernel, "unix_time_s": now_s});
            let md = format!(
                "# io_uring vs epoll for the overlay TCP transport\n\nSkipped on this machine (kernel {kernel}, unix time \
                 {now_s}): {why}. Nothing was measured; the broker keeps its tokio (epoll) transport.\n"
            );
            println!("skipped: {why}");
            write_results(&out_dir, "uring", &doc, &md)?;
            return Ok(0);
        }
    };

    let mut series: Vec<Series> = Path::ALL.iter().map(|_| Series::default()).collect();
    for round in 0..a.runs {
        let order: Vec<usize> = (0..Path::ALL.len()).map(|k| (k + round) % Path::ALL.len()).collect();
        for &k in &order {
            let lat = rpc_run(Path::ALL[k], a.round_trips)?;
            series[k].rtt_run_median_us.push(median(&lat));
            series[k].rtt_us.extend(lat);
        }
        for &k in &order {
            series[k].small.push(stream_run(Path::ALL[k], SMALL_PAYLOAD, a.small_messages, SMALL_WINDOW)?);
        }
        for &k in &order {
            series[k].large.push(stream_run(Path::ALL[k], LARGE_PAYLOAD, a.large_messages, LARGE_WINDOW)?);
        }
        let s = |k: usize| {
            format!(
                "{} rtt {:.1} us, 64 B {:.0} msg/s, 64 KiB {:.0} MB/s",
                Path::ALL[k].name(),
                series[k].rtt_run_median_us[round],
                series[k].small[round].msgs_per_s,
                series[k].large[round].mb_per_s
            )
        };
        eprintln!("vigil-bench uring: round {}/{}: {}; {}; {}", round + 1, a.runs, s(0), s(1), s(2));
    }

    // Rows: (label, unit, higher is better, value per path, spread per path).
    struct Row {
        label: &'static str,
        key: &'static str,
        higher_better: bool,
        values: Vec<f64>,
        runs: Vec<Vec<f64>>,
    }
    let rate = |f: &dyn Fn(&Series) -> Vec<f64>| series.iter().map(f).collect::<Vec<_>>();
    let mk = |label, key, higher_better, runs: Vec<Vec<f64>>, values: Option<Vec<f64>>| Row {
        label,
        key,
        higher_better,
        values: values.unwrap_or_else(|| runs.iter().map(|r| median(r)).collect()),
        runs,
    };
    let rows = vec![
        mk(
            "RPC round trip, median (µs)",
            "rtt_median_us",
            false,
            rate(&|s| s.rtt_run_median_us.clone()),
            Some(series.iter().map(|s| median(&s.rtt_us)).collect()),
        ),
        mk(
            "RPC round trip, p99 (µs)",
            "rtt_p99_us",
            false,
            Path::ALL.iter().map(|_| Vec::new()).collect(),
            Some(series.iter().map(|s| p99(&s.rtt_us).unwrap_or(f64::NAN)).collect()),
        ),
        mk(
            "stream 64 B payloads (msg/s)",
            "small_msgs_per_s",
            true,
            rate(&|s| s.small.iter().map(|r| r.msgs_per_s).collect()),
            None,
        ),
        mk(
            "stream 64 B payloads (MB/s)",
            "small_mb_per_s",
            true,
            rate(&|s| s.small.iter().map(|r| r.mb_per_s).collect()),
            None,
        ),
        mk(
            "stream 64 KiB payloads (msg/s)",
            "large_msgs_per_s",
            true,
            rate(&|s| s.large.iter().map(|r| r.msgs_per_s).collect()),
            None,
        ),
        mk(
            "stream 64 KiB payloads (MB/s)",
            "large_mb_per_s",
            true,
            rate(&|s| s.large.iter().map(|r| r.mb_per_s).collect()),
            None,
        ),
    ];
    let fmt = |x: f64| {
        if x.is_nan() {
            "-".to_string()
        } else if x >= 1000.0 {
            format!("{x:.0}")
        } else {
            format!("{x:.1}")
        }
    };
    let cell = |row: &Row, k: usize| {
        let (_, lo, hi) = summarize(&row.runs[k]);
        match (lo, hi) {
            (Some(lo), Some(hi)) => format!("{} ({}–{})", fmt(row.values[k]), fmt(lo), fmt(hi)),
            _ => fmt(row.values[k]),
        }
    };
    let (e, b, u) = (0, 1, 2);
    let mut table = String::from(
        "| measurement | epoll (transport.rs) | epoll + buffered | io_uring | io_uring / epoll | io_uring / epoll+buffered |\n\
         |---|---:|---:|---:|---:|---:|\n",
    );
    for row in &rows {
        table.push_str(&format!(
            "| {} | {} | {} | {} | {:.2} | {:.2} |\n",
            row.label,
            cell(row, e),
            cell(row, b),
            cell(row, u),
            row.values[u] / row.values[e],
            row.values[u] / row.values[b]
        ));
    }

    // The verdict: the overlay's latency-bound traffic is RPCs, so the median round trip decides.
    let rtt = &rows[0].values;
    let best_epoll = rtt[e].min(rtt[b]);
    let rtt_ratio = rtt[u] / best_epoll;
    let clear_win = rtt_ratio <= CLEAR_WIN_RATIO;
    // Best path of a row: lowest time or highest rate.
    let best = |row: &Row| {
        let better = |x: f64, y: f64| if row.higher_better { x > y } else { x < y };
        let mut k = 0;
        for j in 1..row.values.len() {
            if better(row.values[j], row.values[k]) {
                k = j;
            }
        }
        Path::ALL[k].name()
    };
    let mut verdict = format!(
        "Median RPC round trip: io_uring {} µs, epoll {} µs, epoll + buffered {} µs; io_uring / best epoll = {:.2} \
         (io_uring {}).",
        fmt(rtt[u]),
        fmt(rtt[e]),
        fmt(rtt[b]),
        rtt_ratio,
        if rtt_ratio < 1.0 { "faster" } else { "slower" },
    );
    for row in &rows[1..] {
        verdict.push_str(&format!(
            " {}: best {}, io_uring / epoll {:.2}, io_uring / epoll+buffered {:.2}.",
            row.label,
            best(row),
            row.values[u] / row.values[e],
            row.values[u] / row.values[b]
        ));
    }
    let recommendation = if clear_win {
        format!("io_uring wins the round trip clearly (at least {:.0}% faster than the best epoll path): worth a follow-up to carry it into the broker.", (1.0 - CLEAR_WIN_RATIO) * 100.0)
    } else {
        format!("io_uring does not win the round trip clearly (the bar is {:.0}% faster than the best epoll path): keep the tokio (epoll) transport.", (1.0 - CLEAR_WIN_RATIO) * 100.0)
    };
    println!("{table}\n{verdict}\n{recommendation}");

    let path_doc = |k: usize| {
        let s = &series[k];
        json!({
            "rtt_median_us": round(median(&s.rtt_us), 2),
            "rtt_p99_us": p99(&s.rtt_us).map(|x| round(x, 2)),
            "rtt_samples": s.rtt_us.len(),
            "rtt_run_medians_us": s.rtt_run_median_us.iter().map(|x| round(*x, 2)).collect::<Vec<_>>(),
            "small_msgs_per_s": s.small.iter().map(|r| round(r.msgs_per_s, 0)).collect::<Vec<_>>(),
            "small_mb_per_s": s.small.iter().map(|r| round(r.mb_per_s, 2)).collect::<Vec<_>>(),
            "large_msgs_per_s": s.large.iter().map(|r| round(r.msgs_per_s, 0)).collect::<Vec<_>>(),
            "large_mb_per_s": s.large.iter().map(|r| round(r.mb_per_s, 2)).collect::<Vec<_>>(),
        })
    };
    let ratios: Value = rows
        .iter()
        .map(|r| (r.key.to_string(), json!(round(r.values[u] / r.values[e], 3))))
        .collect::<serde_json::Map<String, Value>>()
        .into();
    let doc = json!({
        "benchmark": "vigil-bench uring",
        "unix_time_s": now_s,
        "cpus": ncpus,
        "kernel": kernel,
        "io_uring_setup": setup,
        "runs": a.runs,
        "round_trips_per_run": a.round_trips,
        "small_messages_per_run": a.small_messages,
        "large_messages_per_run": a.large_messages,
        "paths": {"epoll": path_doc(e), "epoll+buffered": path_doc(b), "io_uring": path_doc(u)},
        "ratio_io_uring_over_epoll": ratios,
        "rtt_ratio_io_uring_over_best_epoll": round(rtt_ratio, 3),
        "io_uring_clear_win": clear_win,
    });
    let md = format!(
        "# io_uring vs epoll for the overlay TCP transport\n\n\
         `vigil-bench uring --runs {runs} --round-trips {rt} --small-messages {sm} --large-messages {lm}` \
         ({ncpus} CPUs, kernel {kernel}, ring {setup}, unix time {now_s}).\n\n\
         Two in-process brokers (one thread and one current-thread tokio runtime each), loopback TCP with \
         `TCP_NODELAY`, real overlay frames (`vigil::message`). {runs} rounds, the order of the three paths rotated \
         each round. Each cell: the median, then in parentheses the lowest and highest per-round value \
         (round-trip rows: median and p99 of all {n} samples per path). MB = 10^6 bytes of whole frames. \
         Ratios are io_uring / epoll: below 1 is better for round trips, above 1 for throughput.\n\n\
         {table}\n{verdict}\n\n**Recommendation:** {recommendation}\n\n\
         See bench/README.md (`uring`) for what each path is.\n",
        runs = a.runs,
        rt = a.round_trips,
        sm = a.small_messages,
        lm = a.large_messages,
        n = a.runs * a.round_trips,
    );
    write_results(&out_dir, "uring", &doc, &md)?;
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every path carries round trips and both streams correctly (no timing is checked).
    #[test]
    fn every_path_works_end_to_end() {
        for path in Path::ALL.into_iter().chain([Path::Noise]) {
            if path == Path::Uring {
                if let Err(why) = probe() {
                    eprintln!("io_uring skipped: {why}");
                    continue;
                }
            }
            let lat = rpc_run(path, 50).unwrap();
            assert_eq!(lat.len(), 50, "{path:?}");
            let r = stream_run(path, SMALL_PAYLOAD, 2000, 256).unwrap();
            assert!(r.msgs_per_s > 0.0 && r.mb_per_s > 0.0, "{path:?}");
            let r = stream_run(path, LARGE_PAYLOAD, 40, 8).unwrap();
            assert!(r.msgs_per_s > 0.0, "{path:?}");
        }
    }
}
