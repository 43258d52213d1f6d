//! Overlay links over libfabric (`tbon.transport=ofi`, docs/slingshot.md), here on Debian's `tcp;ofi_rxm`
//! provider over loopback: the same code a Slingshot machine runs with `cxi`. Skipped (with a note) in a build
//! without libfabric.

mod common;

use common::*;
use std::time::Duration;

const PROVIDER: &str = "tbon.ofi_provider=tcp;ofi_rxm";

/// Whether this build and machine have libfabric's `tcp;ofi_rxm`; says why not otherwise.
fn have_ofi() -> bool {
    if let Err(why) = vigil_ofi::library() {
        eprintln!("skipped: this build has no libfabric: {why}");
        return false;
    }
    let ok = std::process::Command::new("fi_info")
        .args(["-p", "tcp;ofi_rxm", "-t", "FI_EP_RDM"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("skipped: fi_info finds no tcp;ofi_rxm provider (package libfabric-bin)");
    }
    ok
}

/// Every link of a 4-broker instance runs on ofi and says so; jobs run across it, their output streams (also a
/// message larger than a libfabric fragment), and a broker killed with SIGKILL is lost and its job failed while
/// the others go on.
#[test]
fn an_instance_on_ofi_links_runs_jobs_and_survives_a_killed_broker() {
    if !have_ofi() {
        return;
    }
    let inst = Instance::start(4, &["tbon.transport=ofi", PROVIDER]);
    let up = inst.vigil(&["uptime"]);
    up.ok();
    assert!(up.stdout.contains("transport ofi,"), "{}", up.dump());
    let st = inst.vigil(&["overlay", "status", "--json"]);
    st.ok();
    for r in st.json()["ranks"].as_array().expect("ranks").iter().skip(1) {
        assert_eq!(r["link"]["transport"], "ofi", "{r}");
        assert!(r["link"]["detail"].as_str().unwrap_or("").contains("tcp;ofi_rxm"), "{r}");
    }
    let run = inst.vigil(&["run", "-N4", "-n8", "-l", "hostname"]);
    run.ok();
    assert_eq!(run.lines().len(), 8, "{}", run.dump());
    // 200 KiB of output from rank 3's node: several 64 KiB fragments per message up the tree.
    let big = inst.vigil(&[
        "run",
        "-N4",
        "-n4",
        "sh",
        "-c",
        "[ $VIGIL_TASK_RANK = 3 ] && head -c 204800 /dev/zero | tr '\\0' x; true",
    ]);
    big.ok();
    assert_eq!(big.stdout.len(), 204800, "{}", big.stderr);

    let id = inst.submit(&["-N4", "-n4", "sleep", "300"]);
    assert!(inst.wait_state(&id, "RUN", Duration::from_secs(20)), "{}", inst.job(&id));
    let broker: i32 = inst.vigil(&["getattr", "-r", "3", "broker.pid"]).stdout.trim().parse().expect("broker.pid");
    // SAFETY: kill has no memory preconditions.
    assert_eq!(unsafe { libc::kill(broker, libc::SIGKILL) }, 0);
    assert!(
        wait_for(Duration::from_secs(10), || inst.vigil(&["resource", "status"]).stdout.contains("lost")),
        "{}",
        inst.vigil(&["resource", "status"]).dump()
    );
    assert!(inst.wait_state(&id, "INACTIVE", Duration::from_secs(20)), "{}", inst.job(&id));
    let after = inst.vigil(&["run", "-N3", "-n3", "true"]);
    after.ok();
}

/// `auto` tries libfabric where there is no verbs device and falls back to TCP, saying why; `ofi` with a
/// provider that is not there refuses to start, naming it.
#[test]
fn a_missing_provider_falls_back_to_tcp_or_fails_with_the_reason() {
    if !have_ofi() {
        return;
    }
    let (out, _d) = start_and_run(
        2,
        &["tbon.transport=auto", "tbon.ofi_provider=no-such-provider"],
        &["vigil", "uptime"],
        Duration::from_secs(60),
    );
    out.ok();
    assert!(out.stdout.contains("transport tcp (fallback: "), "{}", out.dump());
    assert!(out.stdout.contains("no provider 'no-such-provider'"), "{}", out.dump());

    let (out, _d) = start_and_run(
        2,
        &["tbon.transport=ofi", "tbon.ofi_provider=no-such-provider"],
        &["true"],
        Duration::from_secs(60),
    );
    assert_ne!(out.code, 0, "{}", out.dump());
    assert!(out.stderr.contains("tbon.transport=ofi but"), "{}", out.dump());
    assert!(out.stderr.contains("no-such-provider"), "{}", out.dump());
}
