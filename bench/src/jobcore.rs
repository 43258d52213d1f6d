//! `vigil-bench jobcore`: cost per job of the job manager and scheduler at queue depth, in-process (issue 19).
//!
//! For each depth D, `depth` jobs stay pending while `--jobs` more go through submit, alloc, start, finish and
//! INACTIVE (one submitted as each ends), timed twice: the sans-IO job core alone, and rank 0's real broker code in
//! the simulator (4 brokers of 2 cores, EASY; `vigil_sim::depth`). All depths run in this one process, so their
//! ratios are comparable even on a loaded machine. Also the heap held per pending and per INACTIVE job (this
//! binary's allocator counts live bytes) and the cost of `job-manager.list`'s per-job summary.

use clap::Args;
use serde_json::json;
use std::path::PathBuf;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Instant;
use vigil_sim::depth;

/// Live heap bytes of this process (allocated minus freed), counted by [`Counting`].
static LIVE: AtomicI64 = AtomicI64::new(0);

/// The system allocator, counting live bytes in [`LIVE`] (one relaxed add per call).
pub(crate) struct Counting;

// SAFETY: every call is forwarded unchanged to the system allocator; the counter does not touch the memory.
unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: std::alloc::Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as i64, Ordering::Relaxed);
        // SAFETY: the caller's contract is passed on.
        unsafe { std::alloc::System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: std::alloc::Layout) {
        LIVE.fetch_sub(l.size() as i64, Ordering::Relaxed);
        // SAFETY: the caller's contract is passed on.
        unsafe { std::alloc::System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: std::alloc::Layout, new: usize) -> *mut u8 {
        LIVE.fetch_add(new as i64 - l.size() as i64, Ordering::Relaxed);
        // SAFETY: the caller's contract is passed on.
        unsafe { std::alloc::System.realloc(p, l, new) }
    }
}

/// Options of `vigil-bench jobcore`.
#[derive(Args, Debug)]
pub(crate) struct JobcoreArgs {
    /// Queue depths (jobs kept pending), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "200,10000,64000")]
    depths: Vec<usize>,
    /// Jobs timed at each depth (the job core alone).
    #[arg(long, default_value_t = 20_000)]
    jobs: usize,
    /// Jobs timed at each depth in the simulated broker.
    #[arg(long, default_value_t = 4_000)]
    broker_jobs: usize,
    /// Skip the simulated broker.
    #[arg(long)]
    no_broker: bool,
    /// Also write `jobcore.{json,md}` to the results directory.
    #[arg(long)]
    write: bool,
}

/// Heap bytes per job: (pending, INACTIVE) for `n` jobs on a fresh job core.
fn bytes_per_job(n: usize) -> (f64, f64) {
    let spec = depth::true_spec();
    let t = 1_000_000.0;
    let mut c = depth::fresh_core(t);
    while c.poll_action().is_some() {}
    let before = LIVE.load(Ordering::Relaxed);
    // Nothing can run: every rank is drained, so all n stay pending.
    let all: vigil::idset::IdSet = (0..depth::RANKS).collect();
    c.drain(t, &all, "bench", vigil::jobs::DrainMode::Refuse).expect("drain");
    for _ in 0..n {
        c.submit(t, vigil::jobs::SubmitRequest::new(&spec, 1000)).expect("submit");
    }
    while c.poll_action().is_some() {}
    let pending = (LIVE.load(Ordering::Relaxed) - before) as f64 / n as f64;
    let ids: Vec<_> = c.jobs.keys().copied().collect();
    for id in ids {
        let _ = c.cancel(t, id, 1000, true, "bench");
    }
    while c.poll_action().is_some() {}
    let inactive = (LIVE.load(Ordering::Relaxed) - before) as f64 / n as f64;
    (pending, inactive)
}

/// Nanoseconds per job of `job-manager.list`'s summary (`Job::info`), over `n` pending jobs.
fn list_ns_per_job(n: usize) -> f64 {
    let spec = depth::true_spec();
    let t = 1_000_000.0;
    let mut c = depth::fresh_core(t);
    for _ in 0..n {
        c.submit(t, vigil::jobs::SubmitRequest::new(&spec, 1000)).expect("submit");
    }
    while c.poll_action().is_some() {}
    let t0 = Instant::now();
    let mut k = 0usize;
    for j in c.jobs.values() {
        let v = j.info();
        k += usize::from(v.is_object() && c.pending_reason(j.id).is_some());
    }
    std::hint::black_box(k);
    t0.elapsed().as_nanos() as f64 / n as f64
}

/// Run it; print a markdown table (and write it with `--write`).
pub(crate) fn run(a: &JobcoreArgs, out_dir: Option<PathBuf>) -> Result<i32, String> {
    let mut rows = Vec::new();
    let mut md = String::from(
        "| depth | job core ns/job | examined/job | broker (sim) ns/job | examined/job | heap B/pending job | \
         heap B/INACTIVE job | list ns/job |\n|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    // A warm-up at the smallest depth, untimed.
    let _ = depth::core_cycle(a.depths.iter().copied().min().unwrap_or(200), a.jobs / 10 + 1);
    for &d in &a.depths {
        let core = depth::core_cycle(d, a.jobs);
        let broker = (!a.no_broker).then(|| depth::broker_cycle(d, a.broker_jobs));
        let (bp, bi) = bytes_per_job(d.max(1000));
        let list = list_ns_per_job(d.max(1000));
        eprintln!("vigil-bench jobcore: depth {d}: core {:.0} ns/job, broker {:?}", core.ns_per_job, broker);
        md.push_str(&format!(
            "| {d} | {:.0} | {:.1} | {} | {} | {bp:.0} | {bi:.0} | {list:.0} |\n",
            core.ns_per_job,
            core.examined_per_job,
            broker.as_ref().map_or("-".into(), |b| format!("{:.0}", b.ns_per_job)),
            broker.as_ref().map_or("-".into(), |b| format!("{:.1}", b.examined_per_job)),
        ));
        rows.push(json!({"depth": d, "core": core, "broker": broker, "heap_bytes_per_pending_job": bp,
            "heap_bytes_per_inactive_job": bi, "list_ns_per_job": list}));
    }
    if let (Some(first), Some(last)) = (rows.first(), rows.last()) {
        let ratio = |k: &str| {
            let f = first[k]["ns_per_job"].as_f64()?;
            let l = last[k]["ns_per_job"].as_f64()?;
            Some(f / l)
        };
        md.push_str(&format!(
            "\nThroughput at depth {} over depth {} (same run): job core {}, broker {}.\n",
            last["depth"],
            first["depth"],
            ratio("core").map_or("-".into(), |r| format!("{:.0} %", r * 100.0)),
            ratio("broker").map_or("-".into(), |r| format!("{:.0} %", r * 100.0)),
        ));
    }
    print!("{md}");
    if a.write {
        let doc = json!({"group": "jobcore", "jobs": a.jobs, "broker_jobs": a.broker_jobs, "rows": rows});
        crate::write_results(&crate::results_dir(out_dir), "jobcore", &doc, &md)?;
    }
    Ok(0)
}
