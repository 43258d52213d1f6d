//! Scale on one machine: hundreds of brokers starting at once starve each other of CPU, and no live broker may be
//! declared lost for it (docs/failure-detection.md, "Confirmation").
//!
//! Ignored by default: it wants optimised brokers (a debug build of 257 brokers is a different machine). `ci/test.sh`
//! runs it with the `ci` profile: `cargo test --profile ci -p vigil --test instance_scale -- --ignored`.

mod common;
use common::*;
use std::time::{Duration, Instant};

/// Times in a row the 257-broker instance must come up and run its job.
const TRIES: u32 = 10;

/// What in a broker's log means a live broker was given up: none of it may appear.
const GIVEN_UP: [&str; 5] = ["lost child", "lost connection to parent", "lost parent", "exit-timeout", "cut off"];

/// `vigil start --test-size=257 -S tbon.fanout=256`, then `vigil run -N257 true`: ten times in a row, each
/// exits 0 and no broker is declared lost.
#[test]
#[ignore = "257 optimised brokers: run by ci/test.sh with --profile ci"]
fn a_257_broker_instance_starts_and_runs_a_job_on_every_node_every_time() {
    let mut took = Vec::new();
    for i in 0..TRIES {
        let t0 = Instant::now();
        let (o, _dir) = start_and_run(
            257,
            &["tbon.fanout=256"],
            &["sh", "-c", "vigil run -N257 true && vigil overlay status | grep judge"],
            Duration::from_secs(180),
        );
        let secs = t0.elapsed().as_secs_f64();
        eprintln!("try {}: exit {} in {secs:.1} s; {}", i + 1, o.code, o.stdout.trim());
        assert!(!o.timed_out && o.code == 0, "try {}:\n{}", i + 1, o.dump());
        for bad in GIVEN_UP {
            assert!(!o.stderr.contains(bad), "try {}: a broker said '{bad}':\n{}", i + 1, o.dump());
        }
        took.push(secs);
    }
    took.sort_by(f64::total_cmp);
    eprintln!("{TRIES} of {TRIES}: start, run -N257 true and stop took {:.1} s at the median", took[took.len() / 2]);
}
