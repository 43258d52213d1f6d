//! Two instances on one machine: the XDP program on the loopback interface is shared. These tests have their own
//! binary because cargo runs the tests of one binary in parallel, and an instance of another test that owned the
//! program and ended meanwhile would change what these observe; within this binary they take turns ([`lo_as_root`]).

mod common;

use common::*;
use std::os::unix::fs::MetadataExt;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

/// One test at a time on the loopback interface's XDP program: the turn, or `None` (the test is skipped) when not
/// root, as XDP needs.
fn lo_as_root() -> Option<MutexGuard<'static, ()>> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: XDP needs root");
        return None;
    }
    static LO: Mutex<()> = Mutex::new(());
    Some(LO.lock().unwrap_or_else(|e| e.into_inner()))
}

/// The `responder` line of `rank`'s detectors.
fn responder(inst: &Instance, rank: u32) -> String {
    let v = inst.vigil(&["overlay", "status", "--json", "--rank", &rank.to_string()]).json();
    v["detectors"]["responder"].as_str().unwrap_or_default().to_string()
}

/// Where the owner of the loopback XDP program (in this network namespace) pins its link.
fn lo_link_pin() -> std::path::PathBuf {
    let ns = std::fs::metadata("/proc/self/ns/net").expect("netns").ino();
    format!("/sys/fs/bpf/vigil/link-ns{ns}-lo").into()
}

/// True if an XDP program is attached to `lo`.
fn lo_has_xdp() -> bool {
    let o = std::process::Command::new("ip").args(["-d", "link", "show", "dev", "lo"]).output().expect("ip link");
    String::from_utf8_lossy(&o.stdout).contains("xdp")
}

/// Two instances on one machine share the loopback XDP program: the second one's `broker.xdp_mode` cannot apply,
/// and its status says so rather than ignoring the attribute in silence.
#[test]
fn a_shared_xdp_program_says_the_asked_mode_is_not_applied() {
    let Some(_lo) = lo_as_root() else { return };
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

/// The broker that loaded the XDP program ends while a second instance's brokers are registered in its table:
/// the program stays attached for them, and the last broker out detaches it. Without the program, the second
/// instance's brokers would be answered by their userspace responders only, so that a stalled broker would be
/// declared lost within three probe periods instead of torpid.
#[test]
fn the_xdp_responder_outlives_its_owner_while_another_instance_uses_it() {
    outlives_its_owner(drop); // a clean exit
}

/// As above, the owner killed outright: its pinned link keeps the program attached.
#[test]
fn the_xdp_responder_outlives_its_killed_owner_while_another_instance_uses_it() {
    outlives_its_owner(|owner| {
        let pid: i32 = owner.vigil(&["getattr", "broker.pid"]).stdout.trim().parse().expect("broker.pid");
        // SAFETY: kill has no memory preconditions.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
        drop(owner);
    });
}

fn outlives_its_owner(end: impl FnOnce(Instance)) {
    let Some(_lo) = lo_as_root() else { return };
    let owner = Instance::start(1, &[]);
    assert!(wait_for(Duration::from_secs(20), || !responder(&owner, 0).contains("loading")));
    let r = responder(&owner, 0);
    if !r.starts_with("xdp (") {
        eprintln!("skipped: no XDP on this machine ({r})");
        return;
    }
    if r.starts_with("xdp (shared") {
        eprintln!("skipped: a Vigil broker outside this test owns the XDP program on lo ({r})");
        return;
    }
    assert!(r.contains("on lo"), "{r}");
    assert!(lo_link_pin().exists(), "the owner pins its XDP link once registered");

    let user = Instance::start(2, &[]);
    let loaded = |i: &Instance| (0..2).all(|r| !responder(i, r).contains("loading"));
    assert!(wait_for(Duration::from_secs(20), || loaded(&user)));
    for rank in 0..2 {
        let r = responder(&user, rank);
        assert!(r.starts_with("xdp (shared"), "rank {rank}: {r}");
    }
    // Rank 1's kernel answers rank 0's probes now (every 10 ms), which arms the miss rule.
    std::thread::sleep(Duration::from_millis(300));

    end(owner);
    assert!(lo_link_pin().exists(), "the link is left pinned for the second instance");
    assert!(lo_has_xdp(), "the program stays attached");
    // Still the kernel's answers: a stalled broker is torpid, not lost (a userspace responder would stall too).
    let pid: i32 = user.vigil(&["getattr", "-r", "1", "broker.pid"]).stdout.trim().parse().expect("broker.pid");
    struct Cont(i32);
    impl Drop for Cont {
        fn drop(&mut self) {
            // SAFETY: kill has no memory preconditions.
            unsafe { libc::kill(self.0, libc::SIGCONT) };
        }
    }
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    let cont = Cont(pid);
    std::thread::sleep(Duration::from_secs(1)); // 100 probe periods
    let v = user.vigil(&["overlay", "status", "--json"]).json();
    drop(cont);
    assert_ne!(v["ranks"][1]["state"], "lost", "{v}");
    let online = || {
        let v = user.vigil(&["overlay", "status", "--json"]).json();
        v["ranks"].as_array().is_some_and(|r| r.iter().all(|r| r["state"] == "online"))
    };
    assert!(wait_for(Duration::from_secs(10), online), "rank 1 is online again once it runs");
    user.vigil(&["run", "-N", "2", "-n", "2", "true"]).ok();

    drop(user);
    assert!(!lo_link_pin().exists(), "the last broker out removes the link pin");
    assert!(wait_for(Duration::from_secs(5), || !lo_has_xdp()), "the last broker out detaches the program");
}
