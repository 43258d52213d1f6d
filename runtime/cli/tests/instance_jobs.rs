//! Jobs end to end: exit codes, output routing and ordering, cancel, time limits, exit-timeout, kill
//! escalation, jobspec files.

mod common;

use common::*;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

#[test]
fn task_exit_code_is_run_exit_code() {
    let inst = Instance::start(2, &[]);
    inst.vigil(&["run", "-n2", "sh", "-c", "exit 3"]).code_is(3);
    // The largest exit code of all tasks wins.
    inst.vigil(&["run", "-N2", "-n2", "sh", "-c", "exit $((VIGIL_TASK_RANK * 4 + 1))"]).code_is(5);
    inst.vigil(&["run", "-n2", "true"]).code_is(0);
    // A task killed by SIGKILL: 128 + 9.
    inst.vigil(&["run", "sh", "-c", "kill -9 $$"]).code_is(137);
    // jobs -a agrees.
    let jobs = inst.jobs();
    let codes: Vec<i64> = jobs.iter().map(|j| j["exit_code"].as_i64().unwrap_or(-1)).collect();
    // Listed newest first.
    assert_eq!(codes, vec![137, 0, 5, 3], "{jobs:#?}");
    assert_eq!(jobs[1]["result"].as_str(), Some("COMPLETED"));
    assert_eq!(jobs[0]["result"].as_str(), Some("FAILED"));
}

#[test]
fn stdout_and_stderr_are_routed_and_labelled() {
    let inst = Instance::start(2, &[]);
    let o = inst.vigil(&["run", "-N2", "-n3", "sh", "-c", "echo OUT-$VIGIL_TASK_RANK; echo ERR-$VIGIL_TASK_RANK >&2"]);
    o.ok();
    let mut out = o.lines();
    out.sort_unstable();
    assert_eq!(out, vec!["OUT-0", "OUT-1", "OUT-2"], "{}", o.dump());
    let mut err: Vec<&str> = o.stderr.lines().filter(|l| l.starts_with("ERR-")).collect();
    err.sort_unstable();
    assert_eq!(err, vec!["ERR-0", "ERR-1", "ERR-2"], "{}", o.dump());
    assert!(!o.stderr.contains("OUT-"), "stdout leaked to stderr:\n{}", o.dump());

    // -l: "RANK: line" on both streams.
    let o = inst.vigil(&[
        "run",
        "-N2",
        "-n3",
        "-l",
        "sh",
        "-c",
        "echo OUT-$VIGIL_TASK_RANK; echo ERR-$VIGIL_TASK_RANK >&2",
    ]);
    o.ok();
    let mut out = o.lines();
    out.sort_unstable();
    assert_eq!(out, vec!["0: OUT-0", "1: OUT-1", "2: OUT-2"], "{}", o.dump());
    let mut err: Vec<&str> = o.stderr.lines().filter(|l| l.contains("ERR-")).collect();
    err.sort_unstable();
    assert_eq!(err, vec!["0: ERR-0", "1: ERR-1", "2: ERR-2"], "{}", o.dump());
}

#[test]
fn task_environment() {
    let inst = Instance::start(2, &[]);
    let o = inst.vigil(&[
        "run",
        "-N2",
        "-n3",
        "--env",
        "EXTRA=hello",
        "sh",
        "-c",
        "echo $VIGIL_TASK_RANK $VIGIL_TASK_LOCAL_RANK $VIGIL_JOB_SIZE $VIGIL_JOB_NNODES $VIGIL_BROKER_RANK $EXTRA",
    ]);
    o.ok();
    let mut lines = o.lines();
    lines.sort_unstable();
    // -N2 -n3: two tasks on the first node, one on the second.
    assert_eq!(lines, vec!["0 0 3 2 0 hello", "1 1 3 2 0 hello", "2 0 3 2 1 hello"], "{}", o.dump());
    // The job's nodes as a host list: both brokers of a test instance have this machine's host name.
    let o = inst.vigil(&["run", "-N2", "-n2", "sh", "-c", "echo $VIGIL_JOB_NODELIST"]);
    o.ok();
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap().trim().to_string();
    assert_eq!(o.lines(), vec![format!("{host},{host}"); 2], "{}", o.dump());
}

#[test]
fn missing_command_exits_127_with_a_clear_message() {
    let inst = Instance::start(2, &[]);
    let o = inst.vigil(&["run", "-n2", "no-such-command-xyz"]);
    o.code_is(127);
    let msgs: Vec<&str> = o.stderr.lines().filter(|l| l.contains("no-such-command-xyz")).collect();
    assert_eq!(msgs.len(), 2, "one message per task expected:\n{}", o.dump());
    assert!(msgs.iter().all(|m| m.contains("No such file")), "{}", o.dump());
}

#[test]
fn thousand_lines_per_task_arrive_in_order() {
    let inst = Instance::start(2, &[]);
    let o = inst.vigil(&["run", "-N2", "-n4", "-l", "sh", "-c", "seq -f line%g 1 1000; seq -f err%g 1 300 >&2"]);
    o.ok();
    let mut per: BTreeMap<u32, Vec<String>> = BTreeMap::new();
    for l in o.stdout.lines() {
        let (r, data) = l.split_once(": ").unwrap_or_else(|| panic!("unlabelled line {l:?}"));
        per.entry(r.parse().unwrap()).or_default().push(data.to_string());
    }
    assert_eq!(per.len(), 4, "tasks seen: {:?}", per.keys().collect::<Vec<_>>());
    let want: Vec<String> = (1..=1000).map(|i| format!("line{i}")).collect();
    for (r, lines) in &per {
        assert_eq!(lines.len(), 1000, "task {r} line count");
        assert!(lines == &want, "task {r}: lines out of order or altered");
    }
    for r in 0..4 {
        let errs: Vec<&str> = o.stderr.lines().filter_map(|l| l.strip_prefix(&format!("{r}: err"))).collect();
        let want: Vec<String> = (1..=300).map(|i| i.to_string()).collect();
        assert_eq!(errs, want, "stderr of task {r}");
    }
}

#[test]
fn cancel_kills_the_job_and_records_it() {
    let inst = Instance::start(2, &[]);
    let marker = format!("100.{}", unique_token());
    let id = inst.submit(&["sleep", &marker]);
    assert!(inst.wait_state(&id, "RUN", Duration::from_secs(10)), "job never ran: {}", inst.job(&id));
    assert!(
        wait_for(Duration::from_secs(10), || !processes_with_argv(&["sleep", &marker]).is_empty()),
        "task never started"
    );
    inst.vigil(&["cancel", &id]).ok();
    let w = inst.vigil(&["job", "wait", &id]);
    assert!(!w.timed_out && w.code != 0, "job wait should fail for a canceled job:\n{}", w.dump());
    let j = inst.job(&id);
    assert_eq!(j["state"].as_str(), Some("INACTIVE"), "{j}");
    assert_eq!(j["result"].as_str(), Some("CANCELED"), "{j}");
    assert_eq!(j["exception"]["type"].as_str(), Some("cancel"), "{j}");
    let ev = inst.vigil(&["job", "eventlog", &id]);
    ev.ok();
    let exc: Vec<&str> = ev.stdout.lines().filter(|l| l.split_whitespace().nth(1) == Some("exception")).collect();
    assert_eq!(exc.len(), 1, "{}", ev.dump());
    assert!(exc[0].contains("type=cancel") && exc[0].contains("severity=0"), "{}", ev.dump());
    assert!(ev.stdout.lines().last().unwrap_or("").contains(" clean"), "eventlog must end with clean:\n{}", ev.dump());
    assert!(
        wait_for(Duration::from_secs(3), || processes_with_argv(&["sleep", &marker]).is_empty()),
        "sleep {marker} still running after cancel"
    );
    // Canceling again is an error naming the state.
    let again = inst.vigil(&["cancel", &id]);
    assert_eq!(again.code, 1, "{}", again.dump());
    assert!(again.stderr.contains("inactive"), "{}", again.dump());
    // `vigil jobs -a` shows CA.
    let t = inst.vigil(&["jobs", "-a"]);
    let row = t.stdout.lines().find(|l| l.contains(&id)).unwrap_or_else(|| panic!("{}", t.dump()));
    assert_eq!(row.split_whitespace().nth(3), Some("CA"), "{row}");
}

/// A canceled job's tasks get SIGTERM once each, and so does what they started in the background (found by a user
/// whose tasks counted their signals: the broker signaled the shell's process group, which holds the tasks, and
/// the shell passed the signal on too, so a task got it twice, microseconds apart, whenever it ran in between; a
/// task that takes a second SIGTERM as "quit now" skips its clean-up). Each task waits in bash's `wait`, which
/// runs its trap as soon as a signal comes, so a second copy is counted rather than merged with the first.
#[test]
fn a_canceled_jobs_tasks_get_sigterm_once() {
    let inst = Instance::start(2, &[]);
    let marker = format!("100.{}", unique_token());
    let dir = std::env::temp_dir().join(format!("vigil-sigterm-{}", unique_token()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = format!(
        "exec >> {}/$VIGIL_TASK_RANK 2>&1; n=0; trap 'n=$((n+1)); echo TERM $n' TERM; \
         sh -c 'trap \"echo child TERM; exit 0\" TERM; sleep {marker} & wait' & \
         echo ready; while [ $n -eq 0 ]; do sleep 5 & wait $!; done; \
         t=0; while [ $t -lt 20 ]; do sleep 0.05 & wait $!; t=$((t+1)); done; wait; echo done $n",
        dir.display()
    );
    let out = || {
        let mut all = String::new();
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            all += &std::fs::read_to_string(e.path()).unwrap_or_default();
        }
        all
    };
    let id = inst.submit(&["-N2", "-n4", "-o", "kill-timeout=10s", "bash", "-c", &script]);
    assert!(wait_for(CMD_TIMEOUT, || out().matches("ready").count() == 4), "tasks never all ready: {}", out());
    inst.vigil(&["cancel", &id]).ok();
    let w = inst.vigil_t(&["job", "wait", &id], Duration::from_secs(20));
    assert!(!w.timed_out, "{}", w.dump());
    let out = out();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(out.matches("TERM 1").count(), 4, "each task got SIGTERM: {out}");
    assert_eq!(out.matches("TERM 2").count(), 0, "a task got SIGTERM twice: {out}");
    assert_eq!(out.matches("child TERM").count(), 4, "what a task started got SIGTERM: {out}");
    assert_eq!(out.matches("done 1").count(), 4, "{out}");
}

/// Fill all 4 cores of a 2-broker instance with one running job: (its id, the marker in its `sleep` argument).
fn fill_the_cores(inst: &Instance) -> (String, String) {
    let marker = format!("100.{}", unique_token());
    let hog = inst.submit(&["-N2", "-n4", "sleep", &marker]);
    assert!(inst.wait_state(&hog, "RUN", Duration::from_secs(10)));
    (hog, marker)
}

#[test]
fn cancel_a_pending_job() {
    let inst = Instance::start(2, &[]);
    let (hog, marker) = fill_the_cores(&inst);
    let pending = inst.submit(&["true"]);
    let pending_n2 = inst.submit(&["-N2", "true"]);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(inst.state(&pending), "SCHED");
    // NNODES of a pending job: the number it asked for (-N), else "-"; of a running one, the nodes it holds.
    let t = inst.vigil(&["jobs"]);
    let nnodes = |id: &str| {
        let row = t.stdout.lines().find(|l| l.split_whitespace().next() == Some(id));
        row.and_then(|l| l.split_whitespace().nth(5))
    };
    assert_eq!(
        (nnodes(&hog), nnodes(&pending), nnodes(&pending_n2)),
        (Some("2"), Some("-"), Some("2")),
        "{}",
        t.dump()
    );
    inst.vigil(&["cancel", &pending_n2]).ok();
    inst.vigil(&["cancel", &pending]).ok();
    inst.vigil(&["job", "wait", &pending]).code_is(1);
    let j = inst.job(&pending);
    assert_eq!(j["result"].as_str(), Some("CANCELED"), "{j}");
    assert!(j["t_run"].is_null(), "a canceled pending job never ran: {j}");
    inst.vigil(&["cancel", &hog]).ok();
    assert!(inst.wait_state(&hog, "INACTIVE", Duration::from_secs(10)));
    assert!(wait_for(Duration::from_secs(3), || processes_with_argv(&["sleep", &marker]).is_empty()));
}

#[test]
fn vigil_run_says_why_its_job_is_pending() {
    let inst = Instance::start(2, &[]);
    let (hog, _marker) = fill_the_cores(&inst);
    let run = inst.vigil_spawn(&["run", "echo", "ran"]);
    // Past the 2 s after which `vigil run` reports a job still pending; then free the cores.
    std::thread::sleep(Duration::from_secs(3));
    inst.vigil(&["cancel", &hog]).ok();
    let o = run.wait(Duration::from_secs(20));
    o.ok();
    assert!(o.stdout.contains("ran"), "{}", o.dump());
    let notes: Vec<&str> = o.stderr.lines().filter(|l| l.contains("pending (resources: needs")).collect();
    assert_eq!(notes.len(), 1, "one note with the scheduler's reason: {}", o.dump());
    assert!(notes[0].contains("0 can take it now (1 busy)") || notes[0].contains("0 free now"), "{}", o.dump());
}

#[test]
fn time_limit_ends_the_job() {
    let inst = Instance::start(2, &[]);
    let t0 = Instant::now();
    let o = inst.vigil(&["run", "-t", "1s", "sleep", "30"]);
    let took = t0.elapsed();
    assert!(!o.timed_out && o.code != 0, "{}", o.dump());
    assert!(took < Duration::from_secs(10), "took {took:?}:\n{}", o.dump());
    assert!(o.stderr.contains("type=timelimit"), "{}", o.dump());
    let jobs = inst.jobs();
    assert_eq!(jobs[0]["result"].as_str(), Some("TIMEOUT"), "{jobs:#?}");
    let t = inst.vigil(&["jobs", "-a"]);
    let row = t.stdout.lines().nth(1).unwrap_or("");
    assert_eq!(row.split_whitespace().nth(3), Some("TO"), "{}", t.dump());
    let id = jobs[0]["id_f58"].as_str().unwrap();
    let ev = inst.vigil(&["job", "eventlog", id]);
    assert!(ev.stdout.lines().any(|l| l.contains(" exception ") && l.contains("type=timelimit")), "{}", ev.dump());
}

#[test]
fn time_limit_escalates_to_sigkill_after_kill_timeout() {
    // A task that ignores SIGTERM is SIGKILLed exec.kill-timeout after the limit.
    let inst = Instance::start(2, &["exec.kill-timeout=1s"]);
    let t0 = Instant::now();
    let o = inst.vigil(&["run", "-t", "1s", "sh", "-c", "trap '' TERM; while :; do sleep 0.1; done"]);
    let took = t0.elapsed();
    o.code_is(137);
    assert!(took < Duration::from_secs(10), "took {took:?}");
    assert!(o.stderr.contains("type=timelimit"), "{}", o.dump());
}

/// `-o kill-timeout=1s` (issue 36, item 6): a job that ignores SIGTERM is SIGKILLed after its own timeout, not
/// the instance's `exec.kill-timeout` (30 s here, which `vigil job wait` is not given the time to reach); one above
/// `exec.kill-timeout-max` is refused at submit, naming the option and the bound.
#[test]
fn a_job_ignoring_sigterm_is_killed_after_its_own_kill_timeout() {
    let inst = Instance::start(1, &["exec.kill-timeout=30s", "exec.kill-timeout-max=40s"]);
    let id =
        inst.submit(&["-o", "kill-timeout=1s", "sh", "-c", "trap '' TERM; echo ready; while :; do sleep 0.1; done"]);
    assert!(inst.wait_state(&id, "RUN", CMD_TIMEOUT));
    let ready = || inst.vigil(&["job", "attach", &id]).stdout.contains("ready");
    let t = Instant::now();
    while !ready() && t.elapsed() < CMD_TIMEOUT {
        std::thread::sleep(Duration::from_millis(50));
    }
    inst.vigil(&["cancel", &id]).ok();
    let w = inst.vigil_t(&["job", "wait", &id], Duration::from_secs(20));
    assert!(!w.timed_out, "still running 20 s after the cancel: {}", w.dump());
    w.code_is(137);
    let o = inst.vigil(&["run", "-o", "kill-timeout=41s", "true"]);
    assert!(
        o.code != 0
            && o.stderr
                .contains("-o kill-timeout=41s: 41s is more than this instance allows, 40s (exec.kill-timeout-max)"),
        "{}",
        o.dump()
    );
}

#[test]

fn huge_time_limit_does_not_crash_the_instance() {
    let inst = Instance::start(2, &[]);
    let o = inst.vigil_t(&["run", "-t", "1e18", "true"], Duration::from_secs(10));
    o.code_is(0);
    inst.vigil(&["run", "true"]).ok();
}

#[test]
fn exit_timeout_kills_stragglers() {
    let inst = Instance::start(2, &[]);
    let t0 = Instant::now();
    let o = inst.vigil(&["run", "-n2", "-o", "exit-timeout=1s", "sh", "-c", "[ $VIGIL_TASK_RANK = 0 ] || sleep 30"]);
    let took = t0.elapsed();
    assert!(!o.timed_out && o.code != 0, "{}", o.dump());
    assert!(took < Duration::from_secs(10), "took {took:?}:\n{}", o.dump());
    let exc: Vec<&str> = o.stderr.lines().filter(|l| l.contains("exception")).collect();
    assert!(exc.iter().any(|l| l.contains("type=exec") && l.contains("exit-timeout")), "{}", o.dump());
    // Without the option (default 30 s) the same job is not killed after 1 s: it ends normally.
    let o = inst.vigil(&["run", "-n2", "sh", "-c", "[ $VIGIL_TASK_RANK = 0 ] || sleep 2"]);
    o.code_is(0);
    // exit-timeout=none: never.
    inst.vigil(&["run", "-n2", "-o", "exit-timeout=none", "sh", "-c", "[ $VIGIL_TASK_RANK = 0 ] || sleep 1.5"])
        .code_is(0);
}

const YAML_SPEC: &str = "version: 1
resources:
  - type: slot
    count: 2
    label: default
    with:
      - type: core
        count: 1
tasks:
  - command: [ \"sh\", \"-c\", \"echo yaml-$VIGIL_TASK_RANK-of-$VIGIL_JOB_SIZE\" ]
    slot: default
    count:
      per_slot: 1
attributes:
  system:
    duration: 0
";

#[test]
fn jobspec_files_yaml_and_json() {
    let inst = Instance::start(2, &[]);
    let d = inst.dir.path();
    std::fs::write(d.join("job.yaml"), YAML_SPEC).unwrap();
    let s = inst.vigil(&["job", "submit", "job.yaml"]);
    s.ok();
    let id = s.stdout.trim().to_string();
    let a = inst.vigil(&["job", "attach", &id]);
    a.ok();
    let mut l = a.lines();
    l.sort_unstable();
    assert_eq!(l, vec!["yaml-0-of-2", "yaml-1-of-2"], "{}", a.dump());

    // An attributes.system key the instance does not know is ignored, and the submitter warned (RFC 14).
    std::fs::write(d.join("odd.yaml"), YAML_SPEC.replace("    duration: 0", "    duration: 0\n    mystery: 1"))
        .unwrap();
    let s = inst.vigil(&["job", "submit", "odd.yaml"]);
    s.ok();
    assert!(s.stderr.contains("warning: jobspec attributes.system.mystery: unknown key, ignored"), "{}", s.dump());
    inst.vigil(&["job", "wait", s.stdout.trim()]).ok();
    let plain = inst.vigil(&["job", "submit", "job.yaml"]);
    assert!(!plain.stderr.contains("warning"), "{}", plain.dump());

    // JSON: node > slot > core with a total task count, on both nodes, with a cwd.
    let json = serde_json::json!({
        "version": 1,
        "resources": [{"type": "node", "count": 2, "with": [
            {"type": "slot", "count": 1, "label": "t", "with": [{"type": "core", "count": 1}]}]}],
        "tasks": [{"command": ["sh", "-c", "echo json-$VIGIL_BROKER_RANK-$(pwd)"], "slot": "t", "count": {"total": 2}}],
        "attributes": {"system": {"duration": 0, "cwd": "/"}}
    });
    std::fs::write(d.join("job.json"), json.to_string()).unwrap();
    let s = inst.vigil(&["job", "submit", "job.json"]);
    s.ok();
    let id = s.stdout.trim().to_string();
    inst.vigil(&["job", "wait", &id]).ok();
    let a = inst.vigil(&["job", "attach", &id]);
    a.ok();
    let mut l = a.lines();
    l.sort_unstable();
    assert_eq!(l, vec!["json-0-/", "json-1-/"], "{}", a.dump());
    // The stored jobspec and R are what was asked for (`--json`: the reply as it is, for scripts).
    let info = inst.vigil(&["job", "info", "--json", &id]);
    info.ok();
    let v = info.json();
    assert_eq!(v["jobspec"]["resources"][0]["type"].as_str(), Some("node"), "{v}");
    assert_eq!(v["info"]["nnodes"].as_u64(), Some(2), "{v}");
    assert_eq!(info.stdout.trim_end(), serde_json::to_string_pretty(&v).unwrap(), "pretty-printed, as before");
    // Without it, the same record for people: aligned `key: value` lines.
    let h = inst.vigil(&["job", "info", &id]);
    h.ok();
    let i = &v["info"];
    let want = [
        format!("id:         {} ({})", i["id_f58"].as_str().unwrap(), i["id"]),
        "state:      INACTIVE".to_string(),
        "result:     COMPLETED, exit code 0".to_string(),
        "exception:  -".to_string(),
        "nodes:      2".to_string(),
        format!("nodelist:   {} (ranks 0-1)", i["nodelist"].as_str().unwrap()),
        "lost:       -".to_string(),
        "tasks:      2, task map [[0,2,1,1]]".to_string(),
        "time limit: none".to_string(),
    ];
    for w in &want {
        assert!(h.stdout.lines().any(|l| l == w), "{w:?} expected:\n{}", h.dump());
    }
    assert!(h.stdout.lines().all(|l| l.len() > 12 && l.as_bytes()[11] == b' '), "aligned:\n{}", h.dump());
    assert!(serde_json::from_str::<serde_json::Value>(&h.stdout).is_err(), "{}", h.dump());

    // From stdin.
    let mut c = inst.cmd();
    c.args(["job", "submit", "-"]);
    let f = std::fs::File::open(d.join("job.yaml")).unwrap();
    c.stdin(f);
    let child = c.stdout(std::process::Stdio::piped()).spawn().unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    inst.vigil(&["job", "wait", &id]).ok();
}

#[test]
fn job_wait_and_attach_after_the_fact() {
    let inst = Instance::start(2, &[]);
    let id = inst.submit(&["-n2", "sh", "-c", "echo late-$VIGIL_TASK_RANK; exit 4"]);
    inst.vigil(&["job", "wait", &id]).code_is(4);
    // Attaching to a finished job replays its output and exit code.
    let a = inst.vigil(&["job", "attach", "-l", &id]);
    a.code_is(4);
    let mut l = a.lines();
    l.sort_unstable();
    assert_eq!(l, vec!["0: late-0", "1: late-1"], "{}", a.dump());
    // A job that ended in an exception, attached after the end, reads as it ran: its output, then the exception
    // (stdout and stderr into one pipe, in the order written).
    let id = inst.submit(&["-t", "2s", "sh", "-c", "echo before-the-end; sleep 300"]);
    inst.vigil(&["job", "wait", &id]);
    let mut c = std::process::Command::new("sh");
    c.args(["-c", &format!("exec {} job attach {id} 2>&1", vigil_bin())]);
    c.env("VIGIL_URI", &inst.uri);
    let merged = run(c, Duration::from_secs(30), None);
    let l = merged.lines();
    let out = l.iter().position(|x| *x == "before-the-end");
    let exc = l.iter().position(|x| x.contains("type=timelimit"));
    assert!(out.is_some() && exc.is_some() && out < exc, "output, then the exception:\n{}", merged.dump());
    // Unknown ids are errors.
    let w = inst.vigil(&["job", "wait", "fNoSuchJob"]);
    assert_eq!(w.code, 1, "{}", w.dump());
    let w = inst.vigil(&["job", "wait", "not-an-id!"]);
    assert_eq!(w.code, 1, "{}", w.dump());
}

#[test]
fn long_lines_and_missing_final_newline() {
    let inst = Instance::start(2, &[]);
    // 100000 bytes in one line are forwarded in chunks; nothing is lost. A last line without '\n' arrives.
    let o = inst.vigil(&["run", "sh", "-c", "head -c 100000 /dev/zero | tr '\\0' x; echo; printf tail-no-newline"]);
    o.ok();
    let lines: Vec<&str> = o.stdout.lines().collect();
    assert_eq!(lines.last().copied(), Some("tail-no-newline"), "{:?}", &o.stdout[o.stdout.len().saturating_sub(100)..]);
    let xs: String = lines[..lines.len() - 1].concat();
    assert_eq!(xs.len(), 100000, "line lengths {:?}", lines.iter().map(|l| l.len()).collect::<Vec<_>>());
    assert!(xs.bytes().all(|b| b == b'x'));
}

#[test]
fn ctrl_c_on_run_cancels_the_job() {
    let inst = Instance::start(2, &[]);
    let marker = format!("100.{}", unique_token());
    let r = inst.vigil_spawn(&["run", "sleep", &marker]);
    assert!(
        wait_for(Duration::from_secs(10), || !processes_with_argv(&["sleep", &marker]).is_empty()),
        "task never started"
    );
    // SAFETY: kill(2) of the child we spawned (not yet reaped).
    unsafe {
        libc::kill(r.pid() as i32, libc::SIGINT);
    }
    let o = r.wait(Duration::from_secs(15));
    assert!(!o.timed_out && o.code != 0, "{}", o.dump());
    assert!(o.stderr.contains("canceling job"), "{}", o.dump());
    let jobs = inst.jobs();
    assert_eq!(jobs[0]["result"].as_str(), Some("CANCELED"), "{jobs:#?}");
    assert!(wait_for(Duration::from_secs(3), || processes_with_argv(&["sleep", &marker]).is_empty()));
}

/// `-o exit-on-error`: the first failing task fails the job at once, the job exits with that task's code (not
/// with the 143 of the tasks then terminated), and only that failure is reported.
#[test]
fn exit_on_error_exits_with_the_failing_tasks_code() {
    let inst = Instance::start(2, &[]);
    let script = "if [ $VIGIL_TASK_RANK = 1 ]; then exit 3; fi; sleep 30";
    let o = inst.vigil_t(&["run", "-N2", "-n2", "-o", "exit-on-error", "sh", "-c", script], Duration::from_secs(30));
    o.code_is(3);
    let exc: Vec<&str> = o.stderr.lines().filter(|l| l.contains("exception")).collect();
    assert_eq!(exc.len(), 1, "{}", o.dump());
    assert!(exc[0].contains("task 1 exited with code 3 (exit-on-error)"), "{}", o.dump());
}

/// `--cwd` relative to where the command runs (as Slurm's `--chdir`), and shell options checked at submit.
#[test]
fn a_relative_cwd_is_taken_from_the_current_directory_and_bad_options_are_refused() {
    let inst = Instance::start(1, &[]);
    let sub = inst.dir.path().join("sub");
    std::fs::create_dir_all(&sub).unwrap();
    let o = inst.vigil(&["run", "--cwd", "sub", "pwd"]);
    o.ok();
    assert_eq!(std::path::Path::new(o.stdout.trim()), sub.canonicalize().unwrap(), "{}", o.dump());
    let o = inst.vigil(&["run", "-o", "pmi=maybe", "true"]);
    assert_ne!(o.code, 0, "{}", o.dump());
    assert!(o.stderr.contains("-o pmi=maybe: expected pmi=LIST"), "{}", o.dump());
    inst.vigil(&["run", "-o", "pmi=off", "true"]).ok();
}

/// `vigil submit --cc IDSET` (Flux's carbon copies): one job per id, in order, `{cc}` and VIGIL_JOB_CC set to it;
/// a bad IDSET and `run --cc` are refused before anything is submitted.
#[test]
fn carbon_copies_submit_one_job_per_id() {
    let inst = Instance::start(2, &[]);
    let o = inst.vigil(&["submit", "--cc", "1-12", "sh", "-c", "echo copy {cc} $VIGIL_JOB_CC"]);
    o.ok();
    let ids: Vec<String> = o.stdout.lines().map(str::to_string).collect();
    assert_eq!(ids.len(), 12, "{}", o.dump());
    let distinct: std::collections::BTreeSet<&String> = ids.iter().collect();
    assert_eq!(distinct.len(), 12, "an id given twice: {ids:?}");
    for (i, id) in ids.iter().enumerate() {
        let a = inst.vigil(&["job", "attach", id]);
        a.ok();
        assert_eq!(a.stdout.trim(), format!("copy {n} {n}", n = i + 1), "{}", a.dump());
    }
    for bad in [&["submit", "--cc", "5-2", "true"][..], &["run", "--cc", "1-2", "true"][..]] {
        let o = inst.vigil(bad);
        assert_ne!(o.code, 0, "{}", o.dump());
        assert!(o.stderr.contains("--cc"), "{}", o.dump());
    }
    // Bounded as Slurm's MaxArraySize bounds an array: refused whole, naming the option and the limit.
    let sd = tempfile::tempdir().unwrap();
    let script = sd.path().join("job.sh");
    std::fs::write(&script, "#!/bin/sh\ntrue\n").unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    for cmd in ["submit", "batch"] {
        let what = if cmd == "submit" { "true".to_string() } else { script.display().to_string() };
        let o = inst.vigil(&[cmd, "--cc", "1-100000", &what]);
        assert_eq!(o.code, 1, "{}", o.dump());
        assert!(
            o.stderr.contains("--cc 1-100000: 100000 copies, more than the 10001 this instance allows")
                && o.stderr.contains("job-manager.cc-limit"),
            "{}",
            o.dump()
        );
    }
    assert_eq!(inst.vigil(&["jobs", "-a", "--json"]).json()["jobs"].as_array().map(Vec::len), Some(12));
    // `{{cc}}` in --output, as `{{id}}` is written there.
    let d = tempfile::tempdir().unwrap();
    let out = format!("{}/{{{{cc}}}}.out", d.path().display());
    let o = inst.vigil(&["submit", "--cc", "3", "--output", &out, "echo", "hi"]);
    o.ok();
    inst.vigil(&["job", "wait", o.stdout.trim()]).ok();
    let text = std::fs::read_to_string(d.path().join("3.out")).unwrap_or_default();
    assert_eq!(text.trim(), "hi", "{}", o.dump());
}

/// `vigil job attach` is a viewer: terminated (`timeout`), or its output closed (`| head -1`), it stops and the job
/// goes on, where `vigil run`'s own job would be canceled (a fresh user's `timeout 3 vigil job attach` canceled
/// the job it watched).
#[test]
fn a_viewer_stopped_or_piped_into_head_leaves_the_job_running() {
    use std::io::BufRead;
    let inst = Instance::start(1, &[]);
    let id = inst.submit(&["-t", "5m", "sh", "-c", "while :; do echo tick; sleep 0.2; done"]);
    assert!(inst.wait_state(&id, "RUN", CMD_TIMEOUT));
    let first_line = |child: &mut std::process::Child| {
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.as_mut().expect("stdout")).read_line(&mut line).expect("a line");
        line
    };
    // Terminated: exit 143, the job still runs.
    let mut c = inst.cmd();
    c.args(["job", "attach", &id]).stdout(std::process::Stdio::piped());
    let mut child = c.spawn().expect("vigil job attach");
    assert_eq!(first_line(&mut child), "tick\n");
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let st = child.wait().expect("wait");
    assert_eq!(st.code(), Some(143), "{st:?}");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(inst.state(&id), "RUN", "terminating a viewer canceled the job");
    // Its reader gone: exit 141, the job still runs.
    let mut c = inst.cmd();
    c.args(["job", "attach", &id]).stdout(std::process::Stdio::piped());
    let mut child = c.spawn().expect("vigil job attach");
    assert_eq!(first_line(&mut child), "tick\n");
    drop(child.stdout.take());
    let t = Instant::now();
    let st = loop {
        if let Some(st) = child.try_wait().expect("try_wait") {
            break st;
        }
        assert!(t.elapsed() < CMD_TIMEOUT, "vigil job attach did not stop when its reader left");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(st.code(), Some(141), "{st:?}");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(inst.state(&id), "RUN", "closing a viewer's output canceled the job");
    // Done with it.
    inst.vigil(&["cancel", &id]).ok();
}

/// `vigil jobs` over thousands of jobs (a fresh user's 100,000 timed out as one answer too large for a message):
/// rank 0 answers page by page (`job-manager.list`'s `count`, `before`, `next`), the command prints each as it
/// comes, newest first, none twice or missed across pages; `-c N` asks rank 0 for N only; a filter (`--name`)
/// finds a job pages down.
#[test]
fn thousands_of_jobs_are_listed_page_by_page() {
    let inst = Instance::start(1, &[]);
    // Held: pending for ever, nothing runs. The odd one first, so that it is the oldest, on the last page.
    inst.vigil(&["submit", "--hold", "--job-name", "odd", "true"]).ok();
    let n = 2500;
    let o = inst.vigil_t(&["submit", "--hold", "--cc", &format!("1-{n}"), "true"], Duration::from_secs(60));
    o.ok();
    assert_eq!(o.lines().len(), n, "{}", o.dump());
    let all = inst.vigil(&["jobs", "--json"]);
    all.ok();
    let ids: Vec<u64> = all.json()["jobs"].as_array().expect("jobs").iter().filter_map(|j| j["id"].as_u64()).collect();
    assert_eq!(ids.len(), n + 1, "every job once, across pages");
    assert!(ids.windows(2).all(|w| w[0] > w[1]), "newest first, none twice");
    // -c 7: the newest 7, as a table.
    let c = inst.vigil(&["jobs", "-c", "7", "-n", "--format", "{id.dec}"]);
    c.ok();
    let newest: Vec<String> = ids[..7].iter().map(u64::to_string).collect();
    assert_eq!(c.lines(), newest.iter().map(String::as_str).collect::<Vec<_>>(), "{}", c.dump());
    // A filter of the command's own, past the first pages.
    let odd = inst.vigil(&["jobs", "--name", "odd", "--json"]);
    odd.ok();
    let found: Vec<u64> =
        odd.json()["jobs"].as_array().expect("jobs").iter().filter_map(|j| j["id"].as_u64()).collect();
    assert_eq!(found, vec![ids[n]], "{}", odd.dump());
    // The table: a header and a line per job.
    assert_eq!(inst.vigil(&["jobs", "-c", "0"]).lines().len(), n + 2);
    // `vigil cancel --all` walks the pages too.
    let k = inst.vigil_t(&["cancel", "--all"], Duration::from_secs(60));
    k.ok();
    assert!(k.stderr.contains(&format!("canceled {} jobs", n + 1)), "{}", k.dump());
}
