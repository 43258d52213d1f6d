//! Round-trip latency between two local verbs devices (e.g. rxe0/rxe1 in the soft-RoCE VM).
//! `rtt [event|busy] [ct|mt] [N]`: completion mode, tokio runtime flavour, round trips (default 1000).
//! Prints the median and p99 in microseconds.

use std::time::Instant;
use vigil_rdma::{find_device, Config, Endpoint};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let busy = args.get(1).is_some_and(|a| a == "busy");
    let mt = args.get(2).is_some_and(|a| a == "mt");
    let n: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(1000);
    let rt = if mt {
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()
    } else {
        tokio::runtime::Builder::new_current_thread().enable_all().build()
    }
    .expect("runtime");
    rt.block_on(async move {
        let a0 = std::env::var("RXE_A0").unwrap_or_else(|_| "10.200.0.1".into());
        let a1 = std::env::var("RXE_A1").unwrap_or_else(|_| "10.200.0.2".into());
        let da = find_device(a0.parse().expect("addr")).expect("device a");
        let db = find_device(a1.parse().expect("addr")).expect("device b");
        let cfg = Config { busy_poll: busy, ..Config::default() };
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
            atx.send(vec![1, 2]).await.expect("send");
            arx.recv().await.expect("recv");
            if i >= 50 {
                v.push(t.elapsed().as_secs_f64() * 1e6);
            }
        }
        v.sort_by(|a, b| a.total_cmp(b));
        println!(
            "RESULT rtt mode={} runtime={} n={n} median_us={:.1} p99_us={:.1}",
            if busy { "busy" } else { "event" },
            if mt { "mt" } else { "ct" },
            v[n / 2],
            v[n * 99 / 100]
        );
    });
}
