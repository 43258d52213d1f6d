//! Round-trip latency between two local verbs devices (e.g. rxe0/rxe1 in the soft-RoCE VM).
//! `rtt [event|busy|sync] [ct|mt] [N] [BYTES] [MAX_INLINE]`: completion mode, threads, round trips (default
//! 1000), message size (default 2), and [`Config::max_inline`] (default: the default's).
//! - `event`, `busy`: [`vigil_rdma::Connection`] in a tokio runtime, `ct` = current-thread, `mt` = two workers.
//! - `sync`: [`vigil_rdma::SyncConnection`] (no tokio, busy polling), `ct` = both ends polled by one thread,
//!   `mt` = the echoing end on its own thread (like perftest's two processes).
//!
//! Prints the median and p99 in microseconds.

use std::time::Instant;
use vigil_rdma::{find_device, Config, Device, Endpoint};

fn devices() -> (Device, Device) {
    let a0 = std::env::var("RXE_A0").unwrap_or_else(|_| "10.200.0.1".into());
    let a1 = std::env::var("RXE_A1").unwrap_or_else(|_| "10.200.0.2".into());
    let da = find_device(a0.parse().expect("addr")).expect("device a");
    let db = find_device(a1.parse().expect("addr")).expect("device b");
    (da, db)
}

fn report(mode: &str, mt: bool, n: usize, mut v: Vec<f64>) {
    v.sort_by(|a, b| a.total_cmp(b));
    println!(
        "RESULT rtt mode={mode} runtime={} n={n} median_us={:.1} p99_us={:.1}",
        if mt { "mt" } else { "ct" },
        v[n / 2],
        v[n * 99 / 100]
    );
}

/// Synchronous round trips: no tokio, no task hand-off; `post_send` and `poll_cq` in a loop, as perftest does.
fn sync_rtt(mt: bool, n: usize, msg: Vec<u8>, cfg: Config) {
    let (da, db) = devices();
    let (pa, ia) = Endpoint::prepare(&da, cfg.clone()).expect("prepare");
    let (pb, ib) = Endpoint::prepare(&db, cfg).expect("prepare");
    let b = pb.accept_sync(&ia).expect("accept");
    let mut a = pa.connect_sync(&ib).expect("connect");
    let total = n + 50;
    let (echo, mut b) = if mt {
        let mut b = b;
        let h = std::thread::spawn(move || {
            for _ in 0..total {
                let m = b.recv().expect("echo recv");
                b.send(&m).expect("echo send");
            }
            b
        });
        (Some(h), None)
    } else {
        (None, Some(b))
    };
    let mut v = Vec::with_capacity(n);
    for i in 0..total {
        let t = Instant::now();
        a.send(&msg).expect("send");
        if let Some(b) = b.as_mut() {
            let m = b.recv().expect("b recv");
            b.send(&m).expect("b send");
        }
        a.recv().expect("recv");
        if i >= 50 {
            v.push(t.elapsed().as_secs_f64() * 1e6);
        }
    }
    let _b = echo.map(|h| h.join().expect("echo thread"));
    report("sync", mt, n, v);
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mode = args.get(1).cloned().unwrap_or_else(|| "event".into());
    let busy = mode == "busy";
    let mt = args.get(2).is_some_and(|a| a == "mt");
    let n: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(1000);
    let msg: Vec<u8> = (0..args.get(4).and_then(|s| s.parse().ok()).unwrap_or(2usize)).map(|i| i as u8).collect();
    let mut cfg = Config { busy_poll: busy, ..Config::default() };
    if let Some(m) = args.get(5).and_then(|s| s.parse().ok()) {
        cfg.max_inline = m;
    }
    if mode == "sync" {
        return sync_rtt(mt, n, msg, cfg);
    }
    let rt = if mt {
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()
    } else {
        tokio::runtime::Builder::new_current_thread().enable_all().build()
    }
    .expect("runtime");
    // The timed loop runs as a task, as the broker's core loop does: a busy receiver that requeues itself in
    // `block_on`'s own future would wake the runtime's driver (an eventfd write) on every pass and be polled
    // only between rounds of the other tasks.
    rt.block_on(async move {
        tokio::spawn(async move {
            let (da, db) = devices();
            let (pa, ia) = Endpoint::prepare(&da, cfg.clone()).expect("prepare");
            let (pb, ib) = Endpoint::prepare(&db, cfg).expect("prepare");
            let b = pb.accept(&ia).expect("accept");
            let a = pa.connect(&ib).expect("connect");
            let (atx, mut arx) = a.split();
            let (btx, mut brx) = b.split();
            tokio::spawn(async move {
                while let Ok(m) = brx.recv().await {
                    if btx.send(m).await.is_err() {
                        break;
                    }
                }
            });
            let mut v = Vec::with_capacity(n);
            for i in 0..n + 50 {
                let t = Instant::now();
                atx.send(msg.clone()).await.expect("send");
                arx.recv().await.expect("recv");
                if i >= 50 {
                    v.push(t.elapsed().as_secs_f64() * 1e6);
                }
            }
            report(&mode, mt, n, v);
        })
        .await
        .expect("timed loop");
    });
}
