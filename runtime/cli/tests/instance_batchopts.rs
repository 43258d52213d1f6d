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
    assert!(inst.wait_state(&chained, "INACTIVE", Duration::from_secs(30)), "{:?}", inst.jobs());
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
