//! Two instances on one machine: the XDP program on the loopback interface is shared. This test has its own
//! binary because cargo runs the tests of one binary in parallel, and an instance of another test that owned the
//! program and ended meanwhile would leave this one's second instance owning it (so nothing to say).

mod common;

use common::*;
use std::time::Duration;

/// Two instances on one machine share the loopback XDP program: the second one's `broker.xdp_mode` cannot apply,
/// and its status says so rather than ignoring the attribute in silence.
#[test]
fn a_shared_xdp_program_says_the_asked_mode_is_not_applied() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: XDP needs root");
        return;
    }
    let first = Instance::start(1, &[]);
    // The first instance's detectors are loaded once its status no longer says "loading".
    assert!(wait_for(Duration::from_secs(20), || !first.vigil(&["uptime"]).stdout.contains("loading")));
    let script = "for i in $(seq 100); do vigil uptime | grep -q loading || break; sleep 0.1; done; vigil uptime";
    let (o, _d) = start_and_run(1, &["broker.xdp_mode=generic"], &["sh", "-c", script], Duration::from_secs(30));
    o.ok();
    let line = o.stdout.lines().find(|l| l.contains("responder")).unwrap_or_default();
    if line.contains("userspace") {
        eprintln!("skipped: no XDP on this machine ({line})");
        return;
    }
    assert!(line.contains("broker.xdp_mode=generic not applied"), "{}", o.dump());
    drop(first);
}
