//! What every batch user types (issue 39): job names (`--job-name`, `vigil jobs --name`), dependencies
//! (`--dependency=afterok:ID`), holds, urgency and begin times, as a user would run them.

mod common;

use common::*;

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
