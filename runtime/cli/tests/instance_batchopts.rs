//! What every batch user types (issue 39): job names (`--job-name`, `vigil jobs --name`), dependencies
//! (`--dependency=afterok:ID`), holds, urgency and begin times, as a user would run them.

mod common;

use common::*;
use std::time::Duration;

/// The row of job `id` in `vigil jobs` output.
fn row<'a>(table: &'a str, id: &str) -> &'a str {
    table.lines().find(|l| l.split_whitespace().next() == Some(id)).unwrap_or("")
}

/// `--job-name` (and `-J`, `--name`) names a job; `vigil jobs` shows it and `--name` picks it; without one, the job
/// is known by its command's basename; a name that is not one line of text is refused naming the option.
#[test]
fn a_job_is_known_by_its_name() {
    let inst = Instance::start(1, &[]);
    let first = inst.submit(&["--job-name", "first", "sleep", "30"]);
    let second = inst.submit(&["-J", "second", "true"]);
    let plain = inst.submit(&["/bin/sleep", "30"]);
    assert_eq!(inst.job_info(&first)["info"]["name"].as_str(), Some("first"), "{}", inst.job_info(&first));
    let jobspec = &inst.job_info(&first)["jobspec"];
    assert_eq!(jobspec.pointer("/attributes/system/job/name").and_then(|v| v.as_str()), Some("first"), "{jobspec}");
    assert_eq!(inst.job(&plain)["name"].as_str(), Some("sleep"), "the basename of the command");
    let t = inst.vigil(&["jobs"]);
    t.ok();
    assert!(row(&t.stdout, &first).contains(" first "), "{}", t.stdout);
    let named = inst.vigil(&["jobs", "-a", "--name", "second"]);
    named.ok();
    let ids: Vec<&str> = named.stdout.lines().skip(1).filter_map(|l| l.split_whitespace().next()).collect();
    assert_eq!(ids, vec![second.as_str()], "{}", named.stdout);
    let js = inst.vigil(&["jobs", "--name", "first", "--json"]);
    js.ok();
    assert_eq!(js.json()["jobs"].as_array().map(Vec::len), Some(1), "{}", js.stdout);
    let bad = inst.vigil(&["submit", "--name", "", "true"]);
    bad.code_is(1);
    assert!(bad.stderr.contains("--job-name"), "{}", bad.dump());
    inst.vigil(&["cancel", &first, &plain]).ok();
}

/// The example: `a=$(vigil submit --job-name first sleep 1); vigil submit --dependency=afterok:$a true`. The
/// second waits (`D`, `dependency: afterok:ID` in `vigil jobs`), then runs; one after a job that fails never runs
/// and ends with a `dependency` exception; bad dependencies are refused naming the option.
#[test]
fn a_job_waits_for_the_job_it_depends_on() {
    let inst = Instance::start(1, &[]);
    let a = inst.submit(&["--job-name", "first", "sleep", "2"]);
    let b = inst.submit(&[&format!("--dependency=afterok:{a}"), "true"]);
    let never = inst.submit(&["-d", &format!("afternotok:{a}"), "true"]);
    let fails = inst.submit(&["--dependency", &format!("afterany:{a}"), "false"]);
    let chained = inst.submit(&[&format!("--dependency=afterok:{fails}"), "true"]);
    assert_eq!(inst.state(&b), "DEPEND");
    let t = inst.vigil(&["jobs"]);
    let r = row(&t.stdout, &b);
    assert!(r.contains(" D ") && r.contains(&format!("dependency: afterok:{a}")), "{}", t.stdout);
    let events = inst.vigil(&["job", "eventlog", &b]);
    assert!(events.stdout.contains(&format!("dependency-add description=afterok:{a}")), "{}", events.stdout);
    // b does not depend on `chained`: under load it may still be running when `chained` has ended.
    for id in [&chained, &b] {
        assert!(inst.wait_state(id, "INACTIVE", Duration::from_secs(30)), "{:?}", inst.jobs());
    }
    let info = |id: &str| inst.job(id);
    assert_eq!(info(&b)["result"], "COMPLETED", "{}", info(&b));
    // Eventlog timestamps are kept to the microsecond: b may start at the very instant a's `finish` was posted.
    let (ran, ended) = (info(&b)["t_run"].as_f64().unwrap_or(0.0), info(&a)["t_finish"].as_f64().unwrap_or(f64::MAX));
    assert!(ran >= ended - 1e-6, "b ran after a ended: {} {}", info(&a), info(&b));
    for (id, why) in [(&never, "completed"), (&chained, "FAILED")] {
        let e = &info(id)["exception"];
        assert_eq!((e["type"].as_str(), e["severity"].as_u64()), (Some("dependency"), Some(0)), "{}", info(id));
        assert!(e["note"].as_str().unwrap_or("").contains(why), "{e}");
        assert!(info(id)["t_run"].is_null(), "it never ran");
    }
    let e = inst.vigil(&["job", "eventlog", &b]);
    assert!(e.stdout.contains("dependency-remove") && e.stdout.contains(" depend"), "{}", e.stdout);
    for (args, says) in [
        (vec!["--dependency=afterfoo:f2", "true"], "--dependency=afterfoo:f2: unknown dependency scheme"),
        (vec!["--dependency=afterok:f0O", "true"], "is not a job id"),
        (vec!["--dependency=afterok:fZZZZ", "true"], "attributes.system.dependencies[0].value: no job fZZZZ"),
    ] {
        let o = inst.vigil(&[&["submit"], args.as_slice()].concat());
        o.code_is(1);
        assert!(o.stderr.contains(says), "{says}:\n{}", o.dump());
    }
}

/// Holds, urgency and begin times on a 1-node instance kept busy by a `sleep`: a `--hold` job (and one held with
/// `vigil job hold`) stays pending with reason `held` until `vigil job release`; pending jobs start in order of
/// urgency (`--urgency`, `vigil job urgency`), not of submission; `--begin-time=+3s` waits (`begin-time`), then
/// runs; an urgency above 31 and a begin time that cannot be read are refused naming the option.
#[test]
fn holds_urgency_and_begin_time_order_the_queue() {
    let inst = Instance::start(1, &[]);
    let hog = inst.submit(&["-N1", "--exclusive", "sleep", "300"]);
    assert!(inst.wait_state(&hog, "RUN", Duration::from_secs(20)), "{:?}", inst.jobs());
    let one = ["-N1", "--exclusive", "true"];
    let held = inst.submit(&[&["--hold"], one.as_slice()].concat());
    let plain = inst.submit(&one);
    let low = inst.submit(&[&["--urgency=4"], one.as_slice()].concat());
    let high = inst.submit(&[&["--urgency", "31"], one.as_slice()].concat());
    let later = inst.submit(&one);
    // `vigil job urgency` prints the urgency the job had; `plain` now goes after `low`.
    let u = inst.vigil(&["job", "urgency", &plain, "2"]);
    u.ok();
    assert_eq!(u.stdout.trim(), "16", "{}", u.dump());
    inst.vigil(&["job", "hold", &later]).ok();
    assert_eq!((inst.job(&held)["urgency"].as_u64(), inst.job(&high)["urgency"].as_u64()), (Some(0), Some(31)));
    let t = inst.vigil(&["jobs"]);
    t.ok();
    for id in [&held, &later] {
        assert_eq!(inst.state(id), "SCHED");
        assert!(row(&t.stdout, id).contains("held"), "{id}:\n{}", t.stdout);
        assert!(inst.job(id)["reason_pending"].as_str().unwrap_or("").starts_with("held"), "{}", inst.job(id));
    }
    let not_held = inst.vigil(&["job", "release", &high]);
    not_held.code_is(1);
    assert!(not_held.stderr.contains("is not held"), "{}", not_held.dump());
    inst.vigil(&["cancel", &hog]).ok();
    assert!(inst.wait_state(&plain, "INACTIVE", Duration::from_secs(60)), "{:?}", inst.jobs());
    let run = |id: &str| inst.job(id)["t_run"].as_f64().unwrap_or_else(|| panic!("{id} never ran"));
    assert!(run(&high) < run(&low) && run(&low) < run(&plain), "urgency 31, then 4, then 2: {:?}", inst.jobs());
    // The held ones are still pending, with the node free; released, they run.
    for id in [&held, &later] {
        assert_eq!(inst.state(id), "SCHED", "{}", inst.job(id));
    }
    inst.vigil(&["job", "release", &held, &later]).ok();
    for id in [&held, &later] {
        assert!(inst.wait_state(id, "INACTIVE", Duration::from_secs(30)), "{}", inst.job(id));
        assert_eq!(inst.job(id)["result"].as_str(), Some("COMPLETED"), "{}", inst.job(id));
    }
    // Not before 3 s from now: DEPEND with a `begin-time` reason, then it runs.
    let begin = inst.submit(&["--begin-time=+3s", "true"]);
    let j = inst.job(&begin);
    let t_submit = j["t_submit"].as_f64().expect("t_submit");
    if j["t_run"].is_null() {
        assert_eq!(j["state"].as_str(), Some("DEPEND"), "{j}");
        assert!(j["reason_pending"].as_str().unwrap_or("").starts_with("begin-time: not before"), "{j}");
        let t = inst.vigil(&["jobs"]);
        assert!(row(&t.stdout, &begin).contains("begin-time"), "{}", t.stdout);
    }
    assert!(inst.wait_state(&begin, "INACTIVE", Duration::from_secs(30)), "{}", inst.job(&begin));
    let j = inst.job(&begin);
    assert_eq!(j["result"].as_str(), Some("COMPLETED"), "{j}");
    let spec = inst.job_info(&begin)["jobspec"].clone();
    let at = spec.pointer("/attributes/system/dependencies/0/value").and_then(|v| v.as_f64()).expect("begin-time");
    assert!(at <= t_submit + 3.0 && at > t_submit - 60.0, "3 s from the submitting command's now: {at} {t_submit}");
    assert!(j["t_run"].as_f64().unwrap_or(0.0) >= at, "not before its begin time: {j}");
    // Bad input, refused naming the option.
    let o = inst.vigil(&["submit", "--urgency=32", "true"]);
    assert_ne!(o.code, 0, "{}", o.dump());
    assert!(o.stderr.contains("--urgency"), "{}", o.dump());
    for (args, says) in [
        (vec!["submit", "--begin-time=whenever", "true"], "--begin-time=whenever: expected"),
        (vec!["submit", "--begin-time=2020-01-01T00:00:00Z", "true"], "that time has passed"),
        (vec!["job", "urgency", &held, "32"], "urgency 32: expected 0 to 31"),
    ] {
        let o = inst.vigil(&args);
        o.code_is(1);
        assert!(o.stderr.contains(says), "{says}:\n{}", o.dump());
    }
}

/// `--signal=SIG@TIME` (Flux's and Slurm's): SIG reaches the tasks TIME before the time limit, once, and the
/// eventlog says so; `--signal` alone is SIGUSR1@60 on every submitting command; a TIME not below the time limit
/// or an unknown signal is refused naming the option.
#[test]
fn a_job_is_warned_before_its_time_limit() {
    let inst = Instance::start(1, &[]);
    let script = "trap 'echo warned; exit 0' USR2; sleep 30 & wait";
    let o = inst.vigil_t(&["run", "-t", "6s", "--signal=USR2@4", "sh", "-c", script], Duration::from_secs(60));
    o.ok();
    assert!(o.stdout.contains("warned"), "{}", o.dump());
    let all = inst.vigil(&["jobs", "-a", "--json"]).json();
    let id = all["jobs"][0]["id_f58"].as_str().expect("the job, newest first").to_string();
    let ev = inst.vigil(&["job", "eventlog", &id]);
    ev.ok();
    let line = ev.stdout.lines().find(|l| l.contains(" signal ")).unwrap_or("");
    assert!(line.contains("signum=12") && line.contains("SIGUSR2") && line.contains("timeleft=4"), "{}", ev.stdout);
    assert_eq!(inst.job(&id)["result"].as_str(), Some("COMPLETED"), "it ended on the warning: {}", inst.job(&id));
    // `--signal` alone, before the command (it takes no separate word), on submit and batch.
    let plain = inst.submit(&["-t", "5m", "--signal", "sleep", "300"]);
    let opt = |id: &str| inst.job_info(id)["jobspec"].pointer("/attributes/system/shell/options/signal").cloned();
    assert_eq!(opt(&plain), Some(serde_json::json!({"signum": 10, "timeleft": 60.0})));
    let dir = tempdir();
    let path = dir.path().join("job.sh");
    std::fs::write(&path, "#!/bin/sh\n# vigil: --signal=TERM@2m\nsleep 300\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    let b = inst.vigil(&[
        "batch",
        "-t",
        "1h",
        "--output",
        &dir.path().join("o").display().to_string(),
        &path.display().to_string(),
    ]);
    b.ok();
    let batch = b.stdout.trim().to_string();
    assert_eq!(opt(&batch), Some(serde_json::json!({"signum": 15, "timeleft": 120.0})), "{}", b.dump());
    inst.vigil(&["cancel", &plain, &batch]).ok();
    for (args, says) in [
        (
            vec!["submit", "-t", "30s", "--signal", "true"],
            "--signal=SIGUSR1@60: 60 s before the time limit is not less",
        ),
        (vec!["submit", "-t", "5m", "--signal=FOO@10", "true"], "--signal=FOO@10: unknown signal \"FOO\""),
        (vec!["submit", "-t", "5m", "--signal=USR1@soon", "true"], "--signal=USR1@soon: TIME \"soon\""),
    ] {
        let o = inst.vigil(&args);
        o.code_is(1);
        assert!(o.stderr.contains(says), "{says}:\n{}", o.dump());
    }
}

/// `vigil jobs --states`, `--user`, `--since`, `-c` and `--format` (Flux's `{field}` style), as a user types them;
/// an unknown field or state is refused naming it.
#[test]
fn jobs_are_found_by_state_user_time_and_shown_as_asked() {
    let inst = Instance::start(1, &[]);
    let done = inst.submit(&["--job-name", "done", "true"]);
    assert!(inst.wait_state(&done, "INACTIVE", Duration::from_secs(30)), "{:?}", inst.jobs());
    let hog = inst.submit(&["-N1", "--exclusive", "--job-name", "hog", "sleep", "300"]);
    assert!(inst.wait_state(&hog, "RUN", Duration::from_secs(20)), "{:?}", inst.jobs());
    let waits = inst.submit(&["-N1", "--exclusive", "--job-name", "waits", "true"]);
    let ids = |args: &[&str]| -> Vec<String> {
        let o = inst.vigil(&[&["jobs", "--no-header", "--format={id}"], args].concat());
        o.ok();
        o.stdout.lines().map(str::to_string).collect()
    };
    assert_eq!(ids(&["--states=pending"]), vec![waits.clone()]);
    assert_eq!(ids(&["--states=run"]), vec![hog.clone()]);
    assert_eq!(ids(&["--states=active"]), vec![waits.clone(), hog.clone()], "newest first");
    assert_eq!(ids(&["--states=inactive"]), vec![done.clone()], "inactive states imply -a");
    assert_eq!(ids(&["--states=completed,sched"]), vec![waits.clone(), done.clone()]);
    assert_eq!(ids(&["-a", "-c", "2"]), vec![waits.clone(), hog.clone()]);
    assert_eq!(ids(&["--since=-1h"]), vec![waits.clone(), hog.clone(), done.clone()], "active ones, and done");
    assert_eq!(ids(&["--since=@9999999999"]), vec![waits.clone(), hog.clone()], "no job ended after then");
    let me = nix_uid();
    assert_eq!(ids(&["--user", &me, "--states=run"]), vec![hog.clone()]);
    assert_eq!(ids(&["--user=all", "--states=run"]), vec![hog.clone()]);
    assert!(ids(&["--user=0", "-a"]).is_empty() || me == "0", "no job of root's");
    // Named fields, widths, the header.
    let o = inst.vigil(&[
        "jobs",
        "-a",
        "--format={id.f58:>12} {id.dec} {name:<6} {user} {state} {nnodes} {ntasks} {runtime} {nodelist}",
    ]);
    o.ok();
    let header: Vec<&str> = o.stdout.lines().next().unwrap_or("").split_whitespace().collect();
    assert_eq!(
        header,
        ["JOBID", "JOBID", "NAME", "USER", "STATE", "NNODES", "NTASKS", "TIME", "NODELIST"],
        "{}",
        o.stdout
    );
    let line = o.stdout.lines().find(|l| l.contains(&hog)).unwrap_or("");
    let dec = inst.job(&hog)["id"].as_u64().unwrap().to_string();
    let f: Vec<&str> = line.split_whitespace().collect();
    assert_eq!((f[0], f[1], f[2], f[4], f[5], f[6]), (hog.as_str(), dec.as_str(), "hog", "RUN", "1", "1"), "{line}");
    assert!(line.starts_with(&format!("{hog:>12}")), "right-aligned in 12: {line:?}");
    // --json keeps working, filtered.
    let js = inst.vigil(&["jobs", "--states=pending", "--json"]);
    assert_eq!(js.json()["jobs"].as_array().map(Vec::len), Some(1), "{}", js.stdout);
    for (args, says) in [
        (vec!["jobs", "--format={id} {bogus}"], "--format: unknown field {bogus} (known: id,"),
        (vec!["jobs", "--format={id"], "--format: '{' at character 0 is never closed"),
        (vec!["jobs", "--states=runing"], "--states=runing: unknown state \"runing\""),
        (vec!["jobs", "--since=yesterday"], "--since=yesterday: expected"),
        (vec!["jobs", "--user=no-such-user-here"], "--user=no-such-user-here: no such user"),
    ] {
        let o = inst.vigil(&args);
        o.code_is(1);
        assert!(o.stderr.contains(says), "{says}:\n{}", o.dump());
    }
    inst.vigil(&["cancel", &hog, &waits]).ok();
}

/// This user's uid, as `id -u` prints it.
fn nix_uid() -> String {
    std::process::Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// `vigil update ID KEY=VALUE...`: a pending job's time limit, name and urgency change, the eventlog says so; a
/// running job may only shorten its limit; bad keys and values are refused naming them.
#[test]
fn a_pending_job_is_updated_and_a_running_one_only_shortened() {
    let inst = Instance::start(1, &[]);
    let hog = inst.submit(&["-N1", "--exclusive", "-t", "1h", "sleep", "300"]);
    assert!(inst.wait_state(&hog, "RUN", Duration::from_secs(20)), "{:?}", inst.jobs());
    let p = inst.submit(&["-N1", "--exclusive", "-t", "10m", "--job-name", "before", "sleep", "300"]);
    inst.vigil(&["update", &p, "duration=+5m", "name=after", "urgency=hold"]).ok();
    let j = inst.job(&p);
    assert_eq!(
        (j["duration"].as_f64(), j["name"].as_str(), j["urgency"].as_u64()),
        (Some(900.0), Some("after"), Some(0)),
        "{j}"
    );
    let ev = inst.vigil(&["job", "eventlog", &p]);
    assert!(
        ev.stdout.contains("jobspec-update") && ev.stdout.contains("attributes.system.duration=900"),
        "{}",
        ev.stdout
    );
    let dec = inst.job(&p)["id"].as_u64().unwrap().to_string();
    inst.vigil(&["update", &dec, "duration=20m"]).ok();
    assert_eq!(inst.job(&p)["duration"].as_f64(), Some(1200.0), "a decimal id works too");
    // Running: shorter only.
    let longer = inst.vigil(&["update", &hog, "duration=2h"]);
    longer.code_is(1);
    assert!(longer.stderr.contains("may only be reduced"), "{}", longer.dump());
    let named = inst.vigil(&["update", &hog, "name=x"]);
    named.code_is(1);
    assert!(named.stderr.contains("only its time limit may change"), "{}", named.dump());
    inst.vigil(&["update", &hog, "duration=3s"]).ok();
    assert!(inst.wait_state(&hog, "INACTIVE", Duration::from_secs(30)), "{}", inst.job(&hog));
    assert_eq!(inst.job(&hog)["result"].as_str(), Some("TIMEOUT"), "{}", inst.job(&hog));
    for (args, says) in [
        (vec!["update", &p, "nodes=2"], "nodes: unknown key (known: duration, name, urgency)"),
        (vec!["update", &p, "duration=soon"], "duration:"),
        (vec!["update", &p, "urgency=40"], "urgency: must be 0 (hold) to 31"),
        (vec!["update", &p, "name"], "name: expected KEY=VALUE"),
        (vec!["update", &hog, "duration=1m"], "may no longer change"),
        (vec!["update", "fZZZZZZ", "name=x"], "unknown job id"),
    ] {
        let o = inst.vigil(&args);
        o.code_is(1);
        assert!(o.stderr.contains(says), "{says}:\n{}", o.dump());
    }
    inst.vigil(&["cancel", &p]).ok();
}

/// `vigil history` (item 7 of issue 39): every ended job's record stays after the job is purged and across a
/// `kill -9` and restart of rank 0 (state directory), with how it ended, its nodes and times; it is found by
/// result, name, time and count, as a table (with CPU time and peak memory columns), a `--format` or JSON; the
/// history's own count limit removes the oldest records.
#[test]
fn ended_jobs_stay_in_the_history_after_their_purge_and_a_restart() {
    let dir = tempdir();
    let statedir = dir.path().join("state");
    let sys = LoopbackSystem::new(dir, "hist", 1, 1, &format!("statedir = \"{}\"\n", statedir.display()), "");
    // Rank 0 keeps only the newest inactive job whole; the history keeps 3 records.
    let attrs = ["job-manager.inactive-num-limit=1", "job-manager.history-num-limit=3"];
    let r0 = sys.broker(0, &attrs);
    assert!(sys.is_up(), "rank 0 did not come up");
    let run = |args: &[&str]| -> String {
        let o = sys.client(&[&["submit"], args].concat());
        o.ok();
        let id = o.stdout.trim().to_string();
        sys.client(&["job", "wait", &id]);
        id
    };
    let gone = run(&["true"]);
    let ok = run(&["--job-name", "keep", "true"]);
    let failed = run(&["--job-name", "keep", "sh", "-c", "exit 3"]);
    let canceled = {
        let o = sys.client(&["submit", "--job-name", "long", "sleep", "300"]);
        o.ok();
        let id = o.stdout.trim().to_string();
        assert!(
            wait_for(Duration::from_secs(20), || sys
                .client(&["jobs", "--states=run", "--no-header", "--format={id}"])
                .stdout
                .contains(&id)),
            "{id} never ran"
        );
        sys.client(&["cancel", &id]).ok();
        sys.client(&["job", "wait", &id]);
        id
    };
    let ids = |args: &[&str]| -> Vec<String> {
        let o = sys.client(&[&["history", "--no-header", "--format={id}"], args].concat());
        o.ok();
        o.stdout.lines().map(str::to_string).collect()
    };
    // Purged from `vigil jobs -a` (all but the newest), listed by `vigil history`; the oldest record went.
    let listed = sys.client(&["jobs", "-a", "--no-header", "--format={id}"]);
    assert!(
        wait_for(Duration::from_secs(10), || sys
            .client(&["jobs", "-a", "--no-header", "--format={id}"])
            .stdout
            .lines()
            .count()
            == 1),
        "{}",
        listed.dump()
    );
    let all = vec![canceled.clone(), failed.clone(), ok.clone()];
    assert_eq!(ids(&[]), all, "newest first, the oldest ({gone}) beyond history-num-limit=3");
    // Rank 0 killed and started again on the same state directory: the records are back.
    kill9(r0.pid());
    r0.wait(Duration::from_secs(10));
    let r0 = sys.broker(0, &attrs);
    assert!(sys.is_up(), "rank 0 did not come back");
    assert_eq!(ids(&[]), all, "after a kill -9 and restart of rank 0");
    let js = sys.client(&["history", "--json"]);
    js.ok();
    let rec = |id: &str| js.json()["jobs"].as_array().unwrap().iter().find(|j| j["id_f58"] == id).cloned().unwrap();
    let f = rec(&failed);
    assert_eq!(
        (f["result"].as_str(), f["exit_code"].as_i64(), f["name"].as_str()),
        (Some("FAILED"), Some(3), Some("keep")),
        "{f}"
    );
    assert_eq!(
        (f["nnodes"].as_u64(), f["ranks"].as_str(), f["state"].as_str()),
        (Some(1), Some("0"), Some("INACTIVE")),
        "{f}"
    );
    assert!(!f["nodelist"].as_str().unwrap_or("").is_empty(), "{f}");
    assert!(f["t_run"].as_f64().is_some() && f["t_inactive"].as_f64() >= f["t_run"].as_f64(), "{f}");
    let c = rec(&canceled);
    assert_eq!(
        (c["result"].as_str(), c.pointer("/exception/type").and_then(|v| v.as_str())),
        (Some("CANCELED"), Some("cancel")),
        "{c}"
    );
    // Filters, as a user types them.
    assert_eq!(ids(&["--states=failed"]), vec![failed.clone()]);
    assert_eq!(ids(&["--states=completed,canceled"]), vec![canceled.clone(), ok.clone()]);
    assert_eq!(ids(&["--name", "keep", "-c", "1"]), vec![failed.clone()]);
    assert_eq!(ids(&["-c", "0"]).len(), 3, "0: no limit");
    assert_eq!(ids(&["--since=-1h", "-A"]).len(), 3);
    assert!(ids(&["--until=-1h"]).is_empty(), "nothing ended more than an hour ago");
    assert!(ids(&["--user=0"]).is_empty() || nix_uid() == "0");
    let table = sys.client(&["history"]);
    table.ok();
    let head: Vec<&str> = table.stdout.lines().next().unwrap_or("").split_whitespace().collect();
    assert_eq!(
        head,
        ["JOBID", "USER", "NAME", "ST", "NNODES", "ENDED", "TIME", "CPUTIME", "MAXMEM", "INFO"],
        "{}",
        table.stdout
    );
    let line = table.stdout.lines().find(|l| l.contains(&failed)).unwrap_or("");
    assert!(line.contains(" F ") && line.contains("exit 3"), "{}", table.stdout);
    for (args, says) in [
        (vec!["history", "--states=running"], "\"running\" is not how a job ends"),
        (vec!["history", "--until=tomorrow"], "--until=tomorrow: expected"),
        (vec!["history", "--format={bogus}"], "--format: unknown field {bogus}"),
    ] {
        let o = sys.client(&args);
        o.code_is(1);
        assert!(o.stderr.contains(says), "{says}:\n{}", o.dump());
    }
    drop(r0);
}

/// SIGKILL of process `pid` (a broker this test started).
fn kill9(pid: u32) {
    // SAFETY: kill(2) of a process this test started.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
}

/// Fresh-user findings: `--signal USR1@60 COMMAND` (a space, as Slurm and Flux users also type it) is taken, a
/// signal name alone after a space is taken and said, and one with no command after it is refused; a begin time
/// waits with its time in local ISO 8601 and the time left; `vigil jobs -c 0` is no limit.
#[test]
fn a_signal_after_a_space_a_local_begin_time_and_count_zero() {
    let inst = Instance::start(1, &[]);
    let opt = |id: &str| inst.job_info(id)["jobspec"].pointer("/attributes/system/shell/options/signal").cloned();
    let spaced = inst.submit(&["-t", "5m", "--signal", "USR2@30", "sleep", "300"]);
    assert_eq!(opt(&spaced), Some(serde_json::json!({"signum": 12, "timeleft": 30.0})));
    assert_eq!(inst.job(&spaced)["name"].as_str(), Some("sleep"), "the command is sleep, not USR2@30");
    let o = inst.vigil(&["submit", "-t", "5m", "--signal", "USR1", "sleep", "300"]);
    o.ok();
    let named = o.stdout.trim().to_string();
    assert!(
        o.stderr.contains("--signal USR1: taken as --signal=USR1") && o.stderr.contains("\"sleep\""),
        "{}",
        o.dump()
    );
    assert_eq!(opt(&named), Some(serde_json::json!({"signum": 10, "timeleft": 60.0})));
    let o = inst.vigil(&["batch", "-t", "5m", "--signal", "USR1"]);
    o.code_is(1);
    assert!(o.stderr.contains("--signal USR1: nothing follows \"USR1\""), "{}", o.dump());
    inst.vigil(&["cancel", &spaced, &named]).ok();
    // A begin time: the reason in local time with its offset (the job manager says UTC), and the time left.
    let later = inst.submit(&["--begin-time=+2h", "true"]);
    let js = inst.job(&later);
    let why = js["reason_pending"].as_str().unwrap_or("").to_string();
    let soon = |r: &str| r.contains("(in 1h59m)") || r.contains("(in 2h00m)");
    assert!(why.starts_with("begin-time: not before 20") && why.contains("Z (in ") && soon(&why), "{js}");
    let t = inst.vigil(&["jobs"]);
    let r = row(&t.stdout, &later);
    let at = r.find("not before ").map(|i| i + "not before ".len()).expect("the reason");
    let stamp = &r[at..at + 25];
    assert!(matches!(stamp.as_bytes()[19], b'+' | b'-') && stamp.as_bytes()[22] == b':', "ISO 8601 local time: {r}");
    assert!(soon(r), "{r}");
    let c0 = inst.vigil(&["jobs", "-a", "-c", "0", "--no-header", "--format={id}"]);
    c0.ok();
    assert_eq!(c0.stdout.lines().count(), 3, "-c 0 is no limit: {}", c0.stdout);
    inst.vigil(&["cancel", &later]).ok();
}

/// Slurm's `B:` prefix of `--signal` on a batch job: the warning reaches the script (which ends on it, COMPLETED)
/// and the job's broker lives on; `B:` on a job without a script and Slurm's `R:` (reservations) are refused naming
/// the prefix. The same job's output goes where `--output=DIR/{{name}}-{{id}}.out` says, and `{{name}}`,
/// `{{id.dec}}` fill in a plain job's output path; a `{{cc}}` without `--cc` is refused.
#[test]
fn a_batch_script_is_warned_with_b_prefix_and_output_paths_take_name_and_id() {
    let inst = Instance::start(1, &[]);
    let dir = tempdir();
    let d = dir.path().display().to_string();
    let path = dir.path().join("warned.sh");
    std::fs::write(&path, "#!/bin/sh\ntrap 'echo script-warned; exit 0' USR1\necho started\nsleep 120 & wait\n")
        .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out_tpl = format!("--output={d}/{{{{name}}}}-{{{{id}}}}.out");
    let b = inst.vigil(&["batch", "-t", "60s", "--signal=B:USR1@45", &out_tpl, &path.display().to_string()]);
    b.ok();
    let id = b.stdout.trim().to_string();
    assert!(inst.wait_state(&id, "INACTIVE", Duration::from_secs(120)), "{:?}", inst.jobs());
    assert_eq!(inst.job(&id)["result"].as_str(), Some("COMPLETED"), "ended on the warning: {}", inst.job(&id));
    let out = std::fs::read_to_string(dir.path().join(format!("warned.sh-{id}.out"))).unwrap_or_default();
    assert!(out.contains("script-warned"), "the script got USR1: {out:?}");
    let ev = inst.vigil(&["job", "eventlog", &id]);
    assert!(ev.stdout.contains("signum=10"), "{}", ev.stdout);
    // A plain job: {{name}} and {{id.dec}}.
    let plain =
        inst.submit(&["--job-name", "sim", &format!("--output={d}/{{{{name}}}}.{{{{id.dec}}}}.txt"), "echo", "hi"]);
    assert!(inst.wait_state(&plain, "INACTIVE", Duration::from_secs(30)), "{:?}", inst.jobs());
    let dec = inst.job(&plain)["id"].as_u64().expect("decimal id");
    let text = std::fs::read_to_string(dir.path().join(format!("sim.{dec}.txt"))).unwrap_or_default();
    assert_eq!(text.trim(), "hi", "{:?}", std::fs::read_dir(dir.path()).map(|r| r.count()));
    let script = path.display().to_string();
    for (args, says) in [
        (vec!["submit", "-t", "5m", "--signal=B:USR1", "true"], "--signal=B:USR1: B: signals only a batch script"),
        (vec!["run", "-t", "5m", "--signal=R:USR1@10", "true"], "R: (Slurm's"),
        (vec!["batch", "-t", "5m", "--signal=RB:USR1", &script], "no reservations"),
        (vec!["submit", "--output=o-{{cc}}.txt", "true"], "{{cc}} is the copy's id of --cc, and no --cc is given"),
        (vec!["submit", "--error=e-{{jobid}}", "true"], "unknown template {{jobid}}"),
    ] {
        let o = inst.vigil(&args);
        o.code_is(1);
        assert!(o.stderr.contains(says), "{says}:\n{}", o.dump());
    }
}

/// Fresh-user findings: a job id typed in decimal is echoed as typed in a refusal (not in f58), and a refused `-x`
/// names `-x` (Vigil's, as Slurm's, is `--exclude`; Flux users reach for it as `--exclusive`, which it says).
#[test]
fn a_refusal_echoes_the_id_as_typed_and_names_x() {
    let inst = Instance::start(1, &[]);
    for args in [vec!["job", "info", "12345"], vec!["job", "eventlog", "12345"], vec!["update", "12345", "name=x"]] {
        let o = inst.vigil(&args);
        o.code_is(1);
        assert!(o.stderr.contains("unknown job id 12345"), "{}", o.dump());
    }
    let o = inst.vigil(&["job", "hold", "12345"]);
    o.code_is(1);
    assert!(o.stderr.contains("hold 12345: unknown job id 12345"), "{}", o.dump());
    let o = inst.vigil(&["submit", "-N1", "-x", "sleep", "10"]);
    o.code_is(1);
    assert!(o.stderr.contains("-x/--exclude sleep: not a node") && o.stderr.contains("--exclusive"), "{}", o.dump());
}
