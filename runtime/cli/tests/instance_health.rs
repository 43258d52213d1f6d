//! Node health checks (`-S health.program`, docs/system-instance.md "Health checks"): a failing check drains its
//! node with its first output line, a pass undrains only the check's own drain, a hung check times out and
//! drains, a flood of output or a program that cannot run is a clear reason and the broker goes on.

mod common;

use common::*;
use std::path::Path;
use std::time::Duration;

/// How long a drain or undrain by a check running every second may take to show (runs, then a request to
/// rank 0; generous for a loaded machine).
const SHOWS: Duration = Duration::from_secs(20);

/// Write an executable `sh` script `name` in `dir`; its path.
fn script(dir: &Path, name: &str, body: &str) -> String {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join(name);
    std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).expect("write script");
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    p.display().to_string()
}

/// Rank `r`'s `(state, reason)` in `vigil resource status --json`.
fn rank_state(inst: &Instance, r: usize) -> (String, String) {
    let v = inst.vigil(&["resource", "status", "--json"]).json();
    let row = &v["ranks"][r];
    (row["state"].as_str().unwrap_or("").to_string(), row["reason"].as_str().unwrap_or("").to_string())
}

fn health_attrs(program: &str, timeout: &str) -> Vec<String> {
    vec![format!("health.program={program}"), "health.interval=1s".into(), format!("health.timeout={timeout}")]
}

#[test]
fn a_failing_check_drains_its_node_and_a_pass_undrains_only_its_own_drain() {
    let d = tempdir();
    let dir = d.path().display().to_string();
    // Sick while `sick.RANK` exists: its content is the reason. Each run also leaves its environment behind.
    let prog = script(
        d.path(),
        "hc.sh",
        &format!(
            "echo \"$VIGIL_URI\" > '{dir}/uri.'\"$VIGIL_BROKER_RANK\"\n\
             f='{dir}/sick.'\"$VIGIL_BROKER_RANK\"\n\
             if [ -e \"$f\" ]; then cat \"$f\"; echo 'a second line'; exit 1; fi\nexit 0"
        ),
    );
    std::fs::write(d.path().join("sick.1"), "/tmp full\n").unwrap();
    let attrs = health_attrs(&prog, "5s");
    let inst = Instance::start(3, &attrs.iter().map(String::as_str).collect::<Vec<_>>());
    // Rank 1 is drained by its check at start, with the program's first line; the others are not.
    let drained = ("drained".to_string(), "health check: /tmp full".to_string());
    assert!(wait_for(SHOWS, || rank_state(&inst, 1) == drained), "rank 1: {:?}", rank_state(&inst, 1));
    assert_eq!(rank_state(&inst, 0).0, "avail");
    assert_eq!(rank_state(&inst, 2).0, "avail");
    let text = inst.vigil(&["resource", "status"]);
    assert!(text.stdout.contains("health check: /tmp full"), "{}", text.dump());
    // The program saw its broker's rank and URI.
    let uri = std::fs::read_to_string(d.path().join("uri.1")).expect("rank 1 ran the check");
    assert!(uri.trim().starts_with("local://") && uri.trim().ends_with("local-1"), "{uri}");
    // Status output shows the check (rank 0's, passing).
    let up = inst.vigil(&["uptime"]);
    assert!(up.stdout.contains(&format!("health check: {prog} every 1s")), "{}", up.dump());

    // An admin's drain: a failing check neither changes its reason, nor does a pass undo it.
    inst.vigil(&["resource", "drain", "2", "bad", "fan"]).ok();
    std::fs::write(d.path().join("sick.2"), "no /scratch\n").unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(rank_state(&inst, 2), ("drained".into(), "bad fan".into()));
    std::fs::remove_file(d.path().join("sick.2")).unwrap();

    // Healthy again: rank 1 is undrained; rank 2 keeps the admin's drain.
    std::fs::remove_file(d.path().join("sick.1")).unwrap();
    assert!(wait_for(SHOWS, || rank_state(&inst, 1).0 == "avail"), "rank 1: {:?}", rank_state(&inst, 1));
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(rank_state(&inst, 2), ("drained".into(), "bad fan".into()), "the admin's drain was undone");
    // Work runs on the undrained node.
    inst.vigil(&["run", "-N2", "-n2", "true"]).ok();
    let log = inst.vigil(&["resource", "eventlog"]);
    assert!(log.stdout.contains("health check: /tmp full"), "the drain is in the resource eventlog:\n{}", log.dump());
}

#[test]
fn a_hung_check_times_out_and_a_flood_of_output_is_one_line() {
    let d = tempdir();
    let dir = d.path().display().to_string();
    let token = unique_token();
    // Rank 1 hangs (a child of its own in the check's process group); rank 2 writes 20 MB after its first line.
    let prog = script(
        d.path(),
        "hc.sh",
        &format!(
            "case \"$VIGIL_BROKER_RANK\" in\n\
             1) sleep 1000.{token} & wait ;;\n\
             2) echo 'disk is bad'; head -c 20000000 /dev/zero; exit 3 ;;\n\
             esac\n\
             [ ! -e '{dir}/sick' ]"
        ),
    );
    let attrs = health_attrs(&prog, "1s");
    let inst = Instance::start(3, &attrs.iter().map(String::as_str).collect::<Vec<_>>());
    let hung = ("drained".to_string(), format!("health check: {prog} timed out after 1s"));
    assert!(wait_for(SHOWS, || rank_state(&inst, 1) == hung), "rank 1: {:?}", rank_state(&inst, 1));
    let flood = ("drained".to_string(), "health check: disk is bad".to_string());
    assert!(wait_for(SHOWS, || rank_state(&inst, 2) == flood), "rank 2: {:?}", rank_state(&inst, 2));
    // The hung check was killed with its process group: no sleep of it is left running for long (one may be
    // running now, started by the latest check).
    let sleeps = || processes_with_argv(&["sleep", &format!("1000.{token}")]).len();
    assert!(wait_for(Duration::from_secs(5), || sleeps() <= 1), "{} sleeps left", sleeps());
    // The brokers go on: rank 0 answers, and the healthy rank 0 runs work.
    assert_eq!(rank_state(&inst, 0).0, "avail");
    inst.vigil(&["run", "true"]).ok();
}

#[test]
fn a_check_that_cannot_run_drains_with_why_and_the_broker_goes_on() {
    let d = tempdir();
    let prog = d.path().join("not-executable.sh");
    std::fs::write(&prog, "#!/bin/sh\nexit 0\n").unwrap();
    let prog = prog.display().to_string();
    let attrs = health_attrs(&prog, "1s");
    let inst = Instance::start(2, &attrs.iter().map(String::as_str).collect::<Vec<_>>());
    let want = ("drained".to_string(), format!("health check: cannot run {prog}: Permission denied (os error 13)"));
    assert!(wait_for(SHOWS, || rank_state(&inst, 1) == want), "rank 1: {:?}", rank_state(&inst, 1));
    assert!(wait_for(SHOWS, || rank_state(&inst, 0) == want), "rank 0: {:?}", rank_state(&inst, 0));
    let up = inst.vigil(&["uptime"]);
    assert!(up.stdout.contains("failing (health check: cannot run"), "{}", up.dump());
    // Made executable: both come back.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(0o755)).unwrap();
    assert!(wait_for(SHOWS, || rank_state(&inst, 1).0 == "avail" && rank_state(&inst, 0).0 == "avail"));
}

#[test]
fn bad_health_attributes_are_refused_naming_them() {
    for (attr, says) in [
        ("health.interval=0", "health.interval"),
        ("health.timeout=inf", "health.timeout"),
        ("health.program=check.sh", "expected an absolute path"),
    ] {
        let (out, _d) = start_and_run(1, &[attr], &["true"], Duration::from_secs(30));
        assert_ne!(out.code, 0, "{attr}: {}", out.dump());
        assert!(out.stderr.contains(says), "{attr}: {}", out.dump());
    }
}

/// A check under way when the instance stops goes with its broker, with what it started (found by a new user's
/// trial: its `sleep`s outlived the instance, adopted by init); `health.program=none` is no check at all.
#[test]
fn a_check_running_when_the_instance_stops_leaves_nothing_behind() {
    let d = tempdir();
    let token = unique_token();
    let started = d.path().join("started");
    let prog =
        script(d.path(), "hc.sh", &format!("touch '{}'; sleep 1000.{token} & sleep 1001.{token}", started.display()));
    let attrs = health_attrs(&prog, "60s");
    let inst = Instance::start(2, &attrs.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(wait_for(SHOWS, || started.exists()), "the check never ran");
    let (out, left) = inst.stop_with(0);
    assert_eq!(out.code, 0, "{}", out.dump());
    let ours: Vec<_> = left.iter().filter(|(_, argv)| argv.contains(&token)).collect();
    assert!(ours.is_empty(), "the check's processes outlived the instance: {ours:?}");
    let (out, _dir) = start_and_run(1, &["health.program=none"], &["vigil", "uptime"], Duration::from_secs(30));
    assert_eq!(out.code, 0, "{}", out.dump());
    assert!(!out.stdout.contains("health check"), "{}", out.dump());
}
