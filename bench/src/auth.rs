//! `vigil-bench auth`: what authenticating and encrypting the overlay's TCP links costs.
//!
//! Same harness as `vigil-bench uring` (two in-process brokers, one thread and one current-thread tokio runtime
//! each, loopback TCP, real overlay frames): the plain link (`epoll`, the broker's path before links were
//! authenticated) against the broker's path now (`epoll+noise`: the Noise handshake, then records sealed with
//! AES-256-GCM, `vigil::broker::secure`). Each round measures both, in rotated order:
//! - RPC round trip (median, p99 of all samples);
//! - streaming 64 B and 64 KiB payloads under a credit window (messages/s, MB/s of whole frames);
//! - connection set-up: `connect` alone against `connect` plus the initiator's handshake (median, µs);
//! - the cipher alone: 64 KiB records sealed per second with AES-256-GCM and with ChaCha20-Poly1305 (why the
//!   pattern uses AES-GCM);
//! - with `--before PATH` (a `vigil` binary of the plain overlay): `vigil start --test-size=16 true` wall time
//!   of that binary and of `--vigil` (default: next to this binary), alternating.
//!
//! Targets (from the issue): round trip at most 1.10x, throughput at least 0.9x, start-up at most 10 % slower.
//! Results: `bench/results/auth.{json,md}`.

use crate::uring::{
    bench_auth, rpc_run, stream_run, Path, Rate, UringArgs, LARGE_PAYLOAD, LARGE_WINDOW, SMALL_PAYLOAD, SMALL_WINDOW,
};
use crate::{now_epoch_s, p99, results_dir, summarize, write_results};
use clap::Args;
use serde_json::json;
use std::path::PathBuf;
use std::time::Instant;

/// Options of `vigil-bench auth`.
#[derive(Args, Debug)]
pub(crate) struct AuthArgs {
    /// Rounds and message counts, as for `vigil-bench uring`.
    #[command(flatten)]
    pub(crate) link: UringArgs,
    /// Connections (with and without a handshake) timed per round.
    #[arg(long, default_value_t = 200)]
    pub(crate) connects: usize,
    /// A `vigil` binary whose overlay is not authenticated, for the start-up comparison.
    #[arg(long, value_name = "PATH")]
    pub(crate) before: Option<PathBuf>,
    /// `vigil start --test-size=16 true` runs per binary.
    #[arg(long, default_value_t = 10)]
    pub(crate) start_runs: usize,
}

/// Median of `v`, NaN when empty.
fn median(v: &[f64]) -> f64 {
    summarize(v).0.unwrap_or(f64::NAN)
}

/// Microseconds of `n` loopback connections, each with (`handshake`) or without the initiator's handshake.
fn connect_run(n: usize, handshake: bool) -> Result<Vec<f64>, String> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    rt.block_on(async {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.map_err(|e| e.to_string())?;
        let addr = l.local_addr().map_err(|e| e.to_string())?;
        // The responder runs on the same runtime, as a listener's task does in a broker.
        let server = tokio::spawn(async move {
            loop {
                let Ok((mut s, _)) = l.accept().await else { return };
                if handshake {
                    tokio::spawn(async move {
                        let _ = vigil::broker::secure::respond(&mut s, bench_auth()).await;
                    });
                }
            }
        });
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let t0 = Instant::now();
            let mut s = tokio::net::TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
            if handshake {
                vigil::broker::secure::initiate(&mut s, bench_auth()).await.map_err(|e| e.to_string())?;
            }
            out.push(t0.elapsed().as_secs_f64() * 1e6);
        }
        server.abort();
        Ok(out)
    })
}

/// MB/s of sealing `n` 64 KiB records with the Noise cipher suite `params` (one core, no I/O).
fn seal_rate(params: &str, n: usize) -> Result<f64, String> {
    let psk = [7u8; 32];
    let p: snow::params::NoiseParams = params.parse().map_err(|e| format!("{params}: {e:?}"))?;
    let build = |p: snow::params::NoiseParams| snow::Builder::new(p).psk(0, &psk).map_err(|e| e.to_string());
    let mut i = build(p.clone())?.build_initiator().map_err(|e| e.to_string())?;
    let mut r = build(p)?.build_responder().map_err(|e| e.to_string())?;
    let (mut m, mut pl) = ([0u8; 128], [0u8; 128]);
    let k = i.write_message(&[], &mut m).map_err(|e| e.to_string())?;
    r.read_message(&m[..k], &mut pl).map_err(|e| e.to_string())?;
    let k = r.write_message(&[], &mut m).map_err(|e| e.to_string())?;
    i.read_message(&m[..k], &mut pl).map_err(|e| e.to_string())?;
    let t = i.into_stateless_transport_mode().map_err(|e| e.to_string())?;
    let plain = vec![0x42u8; 65519];
    let mut out = vec![0u8; 65535];
    let t0 = Instant::now();
    for nonce in 0..n as u64 {
        t.write_message(nonce, &plain, &mut out).map_err(|e| e.to_string())?;
    }
    Ok(n as f64 * plain.len() as f64 / t0.elapsed().as_secs_f64() / 1e6)
}

/// Seconds of `vigil start --test-size=16 true` with `vigil`, after one untimed run.
fn start_run(vigil: &std::path::Path) -> Result<f64, String> {
    let t0 = Instant::now();
    let st = std::process::Command::new(vigil)
        .args(["start", "--test-size=16", "true"])
        .stdin(std::process::Stdio::null())
        .status()
        .map_err(|e| format!("{}: {e}", vigil.display()))?;
    if !st.success() {
        return Err(format!("{} start --test-size=16 true: {st}", vigil.display()));
    }
    Ok(t0.elapsed().as_secs_f64())
}

/// `vigil-bench auth`: measure, print the table, write bench/results/auth.{json,md}.
pub(crate) fn run(args: &AuthArgs, vigil: Option<PathBuf>, out_dir: Option<PathBuf>) -> Result<i32, String> {
    let a = &args.link;
    if a.runs == 0 || a.round_trips == 0 || a.small_messages == 0 || a.large_messages == 0 || args.connects == 0 {
        return Err("--runs, --round-trips, the message counts and --connects must be at least 1".into());
    }
    let paths = [Path::Epoll, Path::Noise];
    #[derive(Default)]
    struct Series {
        rtt: Vec<f64>,
        small: Vec<Rate>,
        large: Vec<Rate>,
        connect: Vec<f64>,
    }
    let mut s: [Series; 2] = Default::default();
    let (mut aes, mut chacha) = (Vec::new(), Vec::new());
    for round in 0..a.runs {
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for &k in &order {
            s[k].rtt.extend(rpc_run(paths[k], a.round_trips)?);
        }
        for &k in &order {
            s[k].small.push(stream_run(paths[k], SMALL_PAYLOAD, a.small_messages, SMALL_WINDOW)?);
        }
        for &k in &order {
            s[k].large.push(stream_run(paths[k], LARGE_PAYLOAD, a.large_messages, LARGE_WINDOW)?);
        }
        for &k in &order {
            s[k].connect.extend(connect_run(args.connects, k == 1)?);
        }
        aes.push(seal_rate(vigil::broker::secure::NOISE_PARAMS, 2000)?);
        chacha.push(seal_rate("Noise_NNpsk0_25519_ChaChaPoly_SHA256", 2000)?);
        eprintln!(
            "vigil-bench auth: round {}/{}: rtt {:.1} / {:.1} us, 64 KiB {:.0} / {:.0} MB/s (plain / noise)",
            round + 1,
            a.runs,
            median(&s[0].rtt[s[0].rtt.len() - a.round_trips..]),
            median(&s[1].rtt[s[1].rtt.len() - a.round_trips..]),
            s[0].large[round].mb_per_s,
            s[1].large[round].mb_per_s
        );
    }
    // Start-up, alternating the two binaries.
    let after_bin = match vigil {
        Some(v) => v,
        None => std::env::current_exe().map_err(|e| e.to_string())?.with_file_name("vigil"),
    };
    let (mut st_before, mut st_after) = (Vec::new(), Vec::new());
    if let Some(before) = &args.before {
        start_run(before)?;
        start_run(&after_bin)?;
        for _ in 0..args.start_runs {
            st_before.push(start_run(before)?);
            st_after.push(start_run(&after_bin)?);
        }
    }

    let rate = |v: &[Rate], f: fn(&Rate) -> f64| median(&v.iter().map(f).collect::<Vec<_>>());
    struct Row {
        label: String,
        plain: f64,
        noise: f64,
        higher_better: bool,
    }
    let mut rows = vec![
        Row {
            label: "RPC round trip, median (µs)".into(),
            plain: median(&s[0].rtt),
            noise: median(&s[1].rtt),
            higher_better: false,
        },
        Row {
            label: "RPC round trip, p99 (µs)".into(),
            plain: p99(&s[0].rtt).unwrap_or(f64::NAN),
            noise: p99(&s[1].rtt).unwrap_or(f64::NAN),
            higher_better: false,
        },
        Row {
            label: "stream 64 B payloads (msg/s)".into(),
            plain: rate(&s[0].small, |r| r.msgs_per_s),
            noise: rate(&s[1].small, |r| r.msgs_per_s),
            higher_better: true,
        },
        Row {
            label: "stream 64 KiB payloads (MB/s)".into(),
            plain: rate(&s[0].large, |r| r.mb_per_s),
            noise: rate(&s[1].large, |r| r.mb_per_s),
            higher_better: true,
        },
        Row {
            label: "connect (+ handshake), median (µs)".into(),
            plain: median(&s[0].connect),
            noise: median(&s[1].connect),
            higher_better: false,
        },
    ];
    if !st_before.is_empty() {
        rows.push(Row {
            label: "`vigil start --test-size=16 true` (s)".into(),
            plain: median(&st_before),
            noise: median(&st_after),
            higher_better: false,
        });
    }
    let fmt = |x: f64| if x >= 1000.0 { format!("{x:.0}") } else { format!("{x:.1}") };
    let mut table =
        String::from("| measurement | plain TCP | Noise (AES-256-GCM) | noise / plain |\n|---|---:|---:|---:|\n");
    for r in &rows {
        table.push_str(&format!("| {} | {} | {} | {:.2} |\n", r.label, fmt(r.plain), fmt(r.noise), r.noise / r.plain));
    }
    let (aes_m, chacha_m) = (median(&aes), median(&chacha));
    table.push_str(&format!(
        "\nCipher alone, one core, 64 KiB records: AES-256-GCM {} MB/s, ChaCha20-Poly1305 {} MB/s (ratio {:.2}).\n",
        fmt(aes_m),
        fmt(chacha_m),
        aes_m / chacha_m
    ));
    let rtt_ratio = rows[0].noise / rows[0].plain;
    let small_ratio = rows[2].noise / rows[2].plain;
    let large_ratio = rows[3].noise / rows[3].plain;
    let mut verdict = format!(
        "Targets: round trip at most 1.10x ({}: {rtt_ratio:.2}x); throughput at least 0.9x (64 B {}: {small_ratio:.2}x, \
         64 KiB {}: {large_ratio:.2}x)",
        if rtt_ratio <= 1.10 { "met" } else { "missed" },
        if small_ratio >= 0.9 { "met" } else { "missed" },
        if large_ratio >= 0.9 { "met" } else { "missed" },
    );
    if let Some(r) = rows.get(5) {
        let x = r.noise / r.plain;
        verdict.push_str(&format!("; start-up at most 1.10x ({}: {x:.2}x)", if x <= 1.10 { "met" } else { "missed" }));
    }
    verdict.push('.');
    println!("{table}\n{verdict}");
    let now_s = now_epoch_s().floor();
    let ncpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let doc = json!({
        "benchmark": "vigil-bench auth",
        "unix_time_s": now_s,
        "cpus": ncpus,
        "noise_params": vigil::broker::secure::NOISE_PARAMS,
        "runs": a.runs,
        "round_trips_per_run": a.round_trips,
        "rows": rows.iter().map(|r| json!({"measurement": r.label, "plain": r.plain, "noise": r.noise,
            "ratio": r.noise / r.plain, "higher_is_better": r.higher_better})).collect::<Vec<_>>(),
        "seal_mb_per_s": {"aesgcm": aes, "chachapoly": chacha},
        "start_test_size_16_s": {"before": st_before, "after": st_after},
    });
    let md = format!(
        "# Overlay link security: cost of authentication and encryption\n\n\
         `vigil-bench auth --runs {runs} --round-trips {rt}{before}` ({ncpus} CPUs, unix time {now_s}, {params}).\n\n\
         Two in-process brokers on loopback TCP (the `vigil-bench uring` harness): the plain link the overlay used \
         before against the authenticated one it uses now, measured in the same rounds, order alternating. Medians \
         over {runs} rounds (round trips: of all {n} samples per path); connect: {c} connections per round. MB = \
         10^6 bytes of whole frames.{startup}\n\n{table}\n{verdict}\n",
        runs = a.runs,
        rt = a.round_trips,
        before = if args.before.is_some() { " --before PLAIN_VIGIL" } else { "" },
        params = vigil::broker::secure::NOISE_PARAMS,
        n = a.runs * a.round_trips,
        c = args.connects,
        startup = if st_before.is_empty() {
            String::new()
        } else {
            format!(
                " Start-up: {} runs of each binary, alternating (the plain one built from the commit before this \
                 change, both release builds).",
                args.start_runs
            )
        },
    );
    write_results(&results_dir(out_dir), "auth", &doc, &md)?;
    Ok(0)
}
