//! Resources: task placement on the live machine and on a synthetic node, GPUs, drain/undrain, FCFS
//! scheduling, and requests refused at submit.

mod common;

use common::*;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

fn parse_cpulist(s: &str) -> BTreeSet<u32> {
    let mut out = BTreeSet::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => out.extend(a.trim().parse::<u32>().unwrap()..=b.trim().parse::<u32>().unwrap()),
            None => {
                out.insert(part.trim().parse::<u32>().unwrap());
            }
        }
    }
    out
}

/// CPUs this test process may run on (the brokers inherit the same mask).
fn my_cpus() -> BTreeSet<u32> {
    let st = std::fs::read_to_string("/proc/self/status").unwrap();
    let l = st.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")).unwrap();
    parse_cpulist(l)
}

/// Run `-N4 -n8 -l` printing "BROKER_RANK LOCAL_RANK ALLOWED_CPUS" with extra options; returns task -> row.
fn placements(inst: &Instance, opts: &[&str]) -> BTreeMap<u32, (u32, u32, BTreeSet<u32>)> {
    let mut args = vec!["run", "-N4", "-n8", "-l"];
    args.extend_from_slice(opts);
    args.extend_from_slice(&[
        "sh",
        "-c",
        "echo $VIGIL_BROKER_RANK $VIGIL_TASK_LOCAL_RANK $(grep Cpus_allowed_list /proc/self/status | cut -f2)",
    ]);
    let o = inst.vigil(&args);
    o.ok();
    let mut m = BTreeMap::new();
    for l in o.lines() {
        let (task, rest) = l.split_once(": ").unwrap_or_else(|| panic!("bad line {l:?}"));
        let f: Vec<&str> = rest.split_whitespace().collect();
        assert_eq!(f.len(), 3, "bad line {l:?}");
        m.insert(task.parse().unwrap(), (f[0].parse().unwrap(), f[1].parse().unwrap(), parse_cpulist(f[2])));
    }
    assert_eq!(m.len(), 8, "{}", o.dump());
    m
}

#[test]
fn live_placement_per_task_on_off() {
    let all = my_cpus();
    assert!(all.len() >= 2, "this test needs at least 2 cpus, have {all:?}");
    let inst = Instance::start(4, &[]);

    // Default (per-task): tasks 2k, 2k+1 on broker k, each bound to its own cpu(s).
    let p = placements(&inst, &[]);
    for (task, (broker, local, cpus)) in &p {
        assert_eq!(*broker, task / 2, "task {task} on broker {broker}: {p:?}");
        assert_eq!(*local, task % 2, "task {task}: {p:?}");
        assert!(!cpus.is_empty() && cpus.is_subset(&all), "task {task} cpus {cpus:?} not within {all:?}");
        assert!(cpus.len() < all.len(), "task {task} is not restricted: {cpus:?}");
    }
    for k in 0..4u32 {
        let (a, b) = (&p[&(2 * k)].2, &p[&(2 * k + 1)].2);
        assert!(a.is_disjoint(b), "broker {k}: tasks share cpus {a:?} {b:?}");
    }
    if all.len() == 2 {
        // This machine: 2 cores, one PU each: local task 0 on the first cpu, task 1 on the second.
        let v: Vec<u32> = all.iter().copied().collect();
        for (task, (_, local, cpus)) in &p {
            assert_eq!(cpus, &BTreeSet::from([v[*local as usize]]), "task {task}");
        }
    }

    // cpu-affinity=off: not restricted at all.
    let p = placements(&inst, &["-o", "cpu-affinity=off"]);
    for (task, (broker, _, cpus)) in &p {
        assert_eq!(*broker, task / 2);
        assert_eq!(cpus, &all, "task {task} should not be bound");
    }

    // cpu-affinity=on: both tasks of a node share the node's allocated cores (here: all of them).
    let p = placements(&inst, &["-o", "cpu-affinity=on"]);
    for k in 0..4u32 {
        let (a, b) = (&p[&(2 * k)].2, &p[&(2 * k + 1)].2);
        assert_eq!(a, b, "broker {k}");
        if all.len() == 2 {
            assert_eq!(a, &all, "broker {k}");
        }
    }

    // A bad value is refused before submission.
    let o = inst.vigil(&["run", "-o", "cpu-affinity=sideways", "true"]);
    assert_eq!(o.code, 1, "{}", o.dump());
    assert!(o.stderr.contains("cpu-affinity") && o.stderr.contains("sideways"), "{}", o.dump());
}

/// "free" row of `vigil resource list`: (nnodes, ncores, ngpus).
fn free_row(inst: &Instance) -> (u64, u64, u64) {
    let o = inst.vigil(&["resource", "list"]);
    o.ok();
    let row = o
        .stdout
        .lines()
        .find(|l| l.split_whitespace().next() == Some("free"))
        .unwrap_or_else(|| panic!("{}", o.dump()));
    let f: Vec<u64> = row.split_whitespace().skip(1).take(3).map(|x| x.parse().unwrap()).collect();
    (f[0], f[1], f[2])
}

const SYNTH: &str = "resource.synthetic=pack:4 numa:1 core:24 pu:2";

#[test]
fn synthetic_96_core_nodes() {
    let inst = Instance::start(2, &[SYNTH]);
    assert_eq!(free_row(&inst), (2, 192, 0));
    let g = inst.vigil(&["getattr", "resource.source"]);
    assert!(g.stdout.starts_with("synthetic:"), "{}", g.dump());

    let o = inst.vigil(&[
        "run",
        "-N2",
        "-n8",
        "-c12",
        "-l",
        "sh",
        "-c",
        "echo $VIGIL_BROKER_RANK $VIGIL_TASK_CORES $VIGIL_TASK_CPUS",
    ]);
    o.ok();
    type CoresCpus = (BTreeSet<u32>, BTreeSet<u32>);
    let mut per_node: BTreeMap<u32, Vec<CoresCpus>> = BTreeMap::new();
    for l in o.lines() {
        let (_, rest) = l.split_once(": ").unwrap();
        let f: Vec<&str> = rest.split_whitespace().collect();
        assert_eq!(f.len(), 3, "missing VIGIL_TASK_CORES or VIGIL_TASK_CPUS in {l:?}");
        per_node.entry(f[0].parse().unwrap()).or_default().push((parse_cpulist(f[1]), parse_cpulist(f[2])));
    }
    assert_eq!(per_node.len(), 2, "{}", o.dump());
    for (node, tasks) in &per_node {
        assert_eq!(tasks.len(), 4, "node {node}: {tasks:?}");
        let mut union = BTreeSet::new();
        let mut cpu_union = BTreeSet::new();
        for (cores, cpus) in tasks {
            assert_eq!(cores.len(), 12, "node {node}: {cores:?}");
            // A contiguous block.
            assert_eq!(cores.last().unwrap() - cores.first().unwrap(), 11, "node {node}: {cores:?}");
            assert!(union.is_disjoint(cores), "node {node}: overlapping core blocks {tasks:?}");
            union.extend(cores.iter().copied());
            // Two PUs per core.
            assert_eq!(cpus.len(), 24, "node {node}: cpus {cpus:?}");
            assert!(cpu_union.is_disjoint(cpus), "node {node}: overlapping cpus");
            cpu_union.extend(cpus.iter().copied());
        }
        assert_eq!(union, (0..48).collect::<BTreeSet<u32>>(), "node {node}");
    }
    // Placement is computed but not applied on a synthetic topology: said once per job, on stderr.
    let notes = o.stderr.lines().filter(|l| l.contains("not bound")).count();
    assert_eq!(notes, 1, "{}", o.dump());
    assert!(!o.stdout.contains("not bound"), "{}", o.dump());
    // While nothing runs, everything is free again.
    assert_eq!(free_row(&inst), (2, 192, 0));
}

#[test]
fn synthetic_gpus_per_task() {
    let inst = Instance::start(2, &[SYNTH, "resource.gpus=4"]);
    assert_eq!(free_row(&inst), (2, 192, 8));
    let o = inst.vigil(&[
        "run",
        "-N2",
        "-n8",
        "-g1",
        "-l",
        "sh",
        "-c",
        "echo $VIGIL_BROKER_RANK $CUDA_VISIBLE_DEVICES $ROCR_VISIBLE_DEVICES",
    ]);
    o.ok();
    let mut per_node: BTreeMap<u32, Vec<String>> = BTreeMap::new();
    for l in o.lines() {
        let f: Vec<&str> = l.split_once(": ").unwrap().1.split_whitespace().collect();
        assert_eq!(f.len(), 3, "missing CUDA/ROCR_VISIBLE_DEVICES in {l:?}");
        assert_eq!(f[1], f[2], "CUDA and ROCR differ in {l:?}");
        assert!(!f[1].contains(','), "one GPU per task expected: {l:?}");
        per_node.entry(f[0].parse().unwrap()).or_default().push(f[1].to_string());
    }
    assert_eq!(per_node.len(), 2, "{}", o.dump());
    for (node, gpus) in &per_node {
        let set: BTreeSet<&String> = gpus.iter().collect();
        assert_eq!(set.len(), 4, "node {node}: GPUs not distinct: {gpus:?}");
    }
    // 9 GPUs of 1 per task do not fit 2x4 GPUs: refused at submit, naming the slots.
    let o = inst.vigil(&["run", "-n9", "-g1", "true"]);
    assert_eq!(o.code, 1, "{}", o.dump());
    assert!(o.stderr.contains("GPUs"), "{}", o.dump());
}

#[test]
fn drain_blocks_scheduling_until_undrain() {
    let inst = Instance::start(2, &[]);
    // RFC 22: the ids of an idset are unique and ascending; as `flux resource drain` does, a list that is not is
    // refused (with the idset's error, not read as host names), and nothing is drained.
    for bad in ["1,0", "1,1", "0-1,1"] {
        let o = inst.vigil(&["resource", "drain", bad, "maintenance"]);
        assert_eq!(o.code, 1, "{}", o.dump());
        assert!(o.stderr.contains("out of order") && o.stderr.contains("unique and ascending"), "{}", o.dump());
    }
    let v = inst.vigil(&["resource", "status", "--json"]).json();
    assert!(v["ranks"].as_array().expect("ranks").iter().all(|r| r["state"] == "avail"), "{v}");
    inst.vigil(&["resource", "drain", "1", "maintenance"]).ok();
    let s = inst.vigil(&["resource", "status"]);
    s.ok();
    let row =
        s.stdout.lines().find(|l| l.trim_start().starts_with("drained")).unwrap_or_else(|| panic!("{}", s.dump()));
    let f: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(f[1], "1", "nnodes: {row}");
    assert_eq!(f[2], "1", "ranks: {row}");
    assert!(row.ends_with("maintenance"), "reason: {row}");
    let j = inst.vigil(&["resource", "status", "--json"]);
    let v = j.json();
    assert_eq!(v["ranks"][1]["state"].as_str(), Some("drained"), "{v}");
    assert_eq!(v["ranks"][1]["reason"].as_str(), Some("maintenance"), "{v}");
    assert_eq!(v["ranks"][0]["state"].as_str(), Some("avail"), "{v}");
    // Drained again: refused, naming the rank and its reason, unless --force (new reason) or --update (the others).
    let o = inst.vigil(&["resource", "drain", "0-1", "other"]);
    assert_eq!(o.code, 1, "{}", o.dump());
    assert!(o.stderr.contains("1 (maintenance)") && o.stderr.contains("--force"), "{}", o.dump());
    let reason = |r: usize| inst.vigil(&["resource", "status", "--json"]).json()["ranks"][r]["reason"].clone();
    assert_eq!(reason(1), "maintenance", "the refusal changed nothing");
    inst.vigil(&["resource", "drain", "--force", "1", "maintenance,", "fan"]).ok();
    assert_eq!(reason(1), "maintenance, fan");
    inst.vigil(&["resource", "drain", "-u", "0-1", "login"]).ok();
    assert_eq!((reason(0), reason(1)), ("login".into(), "maintenance, fan".into()));
    inst.vigil(&["resource", "undrain", "0"]).ok();

    // 1-node work still runs, on rank 0 only.
    let o = inst.vigil(&["run", "-n2", "printenv", "VIGIL_BROKER_RANK"]);
    o.ok();
    assert_eq!(o.lines(), vec!["0", "0"], "{}", o.dump());
    // A 2-node job must wait.
    let id = inst.submit(&["-N2", "true"]);
    for _ in 0..10 {
        assert_eq!(inst.state(&id), "SCHED", "job ran on a drained node");
        std::thread::sleep(Duration::from_millis(100));
    }
    inst.vigil(&["resource", "undrain", "1"]).ok();
    inst.vigil(&["job", "wait", &id]).code_is(0);
    let v = inst.vigil(&["resource", "status", "--json"]).json();
    assert_eq!(v["ranks"][1]["state"].as_str(), Some("avail"), "{v}");

    // Errors: a rank outside the instance, undraining a rank that is not drained.
    let o = inst.vigil(&["resource", "drain", "7", "x"]);
    assert_eq!(o.code, 1, "{}", o.dump());
    assert!(o.stderr.contains('7') && o.stderr.contains("not in this instance"), "{}", o.dump());
    let o = inst.vigil(&["resource", "undrain", "0"]);
    assert_eq!(o.code, 1, "{}", o.dump());
    assert!(o.stderr.contains("not drained"), "{}", o.dump());
    // The failed drain changed nothing.
    let v = inst.vigil(&["resource", "status", "--json"]).json();
    assert!(v["ranks"].as_array().unwrap().iter().all(|r| r["state"] == "avail"), "{v}");
    // The resource eventlog records drain and undrain.
    let e = inst.vigil(&["resource", "eventlog", "--json"]);
    let names: Vec<String> = e
        .stdout
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap_or_else(|err| panic!("{err}: {l}")))
        .map(|v| v["name"].as_str().unwrap_or("").to_string())
        .collect();
    assert!(names.iter().any(|n| n == "drain") && names.iter().any(|n| n == "undrain"), "{}", e.dump());
    // For people: a line per event, "TIMESTAMP NAME key=value ...".
    let e = inst.vigil(&["resource", "eventlog"]);
    let drain = e.stdout.lines().find(|l| l.split_whitespace().nth(1) == Some("drain")).unwrap_or_default();
    assert!(drain.split_whitespace().next().is_some_and(|t| t.parse::<f64>().is_ok()), "{}", e.dump());
    assert!(drain.contains("idset=1"), "{}", e.dump());
}

#[test]
fn fcfs_on_one_two_core_broker() {
    // Rank 0 has 2 cores. A holds one core; B needs both and waits; C needs one (and would fit) but must not
    // pass B under strict FCFS. Releasing A runs B, then C.
    let inst = Instance::start(1, &[]);
    let d = inst.dir.path().display().to_string();
    let hold = |name: &str| format!("while [ ! -e '{d}/{name}' ]; do sleep 0.05; done");
    let a = inst.submit(&["-n1", "-c1", "sh", "-c", &hold("release-a")]);
    assert!(inst.wait_state(&a, "RUN", Duration::from_secs(10)));
    let b = inst.submit(&["-n1", "-c2", "sh", "-c", &hold("release-b")]);
    let c = inst.submit(&["-n1", "-c1", "true"]);
    for _ in 0..8 {
        assert_eq!(inst.state(&b), "SCHED");
        assert_eq!(inst.state(&c), "SCHED", "C passed B (not FCFS)");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::fs::write(inst.dir.path().join("release-a"), "").unwrap();
    assert!(inst.wait_state(&b, "RUN", Duration::from_secs(10)), "B never ran");
    assert_eq!(inst.state(&c), "SCHED", "C runs beside B, which holds both cores");
    std::fs::write(inst.dir.path().join("release-b"), "").unwrap();
    inst.vigil(&["job", "wait", &c]).code_is(0);
    inst.vigil(&["job", "wait", &b]).code_is(0);
    let (jb, jc) = (inst.job(&b), inst.job(&c));
    assert!(jb["t_inactive"].as_f64().unwrap() <= jc["t_run"].as_f64().unwrap(), "C started before B ended: {jb} {jc}");
}

#[test]
fn unsatisfiable_requests_are_refused_at_submit() {
    let inst = Instance::start(4, &[]);
    inst.vigil(&["run", "true"]).ok();
    let before = inst.jobs().len();
    for (args, word) in [
        (vec!["run", "-N", "5", "true"], "nodes"),
        (vec!["submit", "-N", "5", "true"], "nodes"),
        (vec!["run", "-c", "3", "true"], "cores"),
        (vec!["run", "-N2", "-n2", "-c", "3", "true"], "cores"),
        (vec!["run", "-g", "1", "true"], "GPUs"),
        (vec!["run", "-n", "9", "true"], "slots"),
    ] {
        let o = inst.vigil(&args);
        assert_eq!(o.code, 1, "{}", o.dump());
        let lines: Vec<&str> = o.stderr.lines().collect();
        assert_eq!(lines.len(), 1, "one line expected:\n{}", o.dump());
        assert!(lines[0].contains(word), "message should name {word}:\n{}", o.dump());
        assert!(o.stdout.is_empty(), "{}", o.dump());
    }
    assert_eq!(inst.jobs().len(), before, "refused requests left jobs behind");
}

#[test]
fn malformed_jobspecs_name_the_field() {
    let inst = Instance::start(2, &[]);
    let good = "version: 1\nresources:\n  - type: slot\n    count: 1\n    label: s\n    with:\n      - type: core\n        count: 1\ntasks:\n  - command: [\"true\"]\n    slot: s\n    count: {per_slot: 1}\nattributes:\n  system:\n    duration: 0\n";
    let cases = [
        (good.replace("version: 1", "version: 2"), "version"),
        (good.replace("    duration: 0\n", "    cwd: /\n"), "attributes.system.duration"),
        (good.replace("count: 1\n    label", "count: 0\n    label"), "resources[0].count"),
        (good.replace("slot: s", "slot: other"), "tasks[0].slot"),
        (good.replace("command: [\"true\"]", "command: []"), "tasks[0].command"),
        (good.replace("type: core", "type: banana"), "resources[0].with[0].type"),
        ("{ not json".to_string(), "syntax"),
    ];
    let before = inst.jobs().len();
    for (i, (text, field)) in cases.iter().enumerate() {
        let f = format!("bad{i}.yaml");
        std::fs::write(inst.dir.path().join(&f), text).unwrap();
        let o = inst.vigil(&["job", "submit", &f]);
        assert_eq!(o.code, 1, "case {i}:\n{}", o.dump());
        assert!(o.stderr.contains(field), "case {i} should name {field}:\n{}", o.dump());
        assert!(o.stderr.starts_with(&format!("vigil: {f}: ")), "case {i} should name the file:\n{}", o.dump());
        assert_eq!(o.stderr.lines().count(), 1, "case {i}: one line expected:\n{}", o.dump());
    }
    assert_eq!(inst.jobs().len(), before);
    // The good one runs.
    std::fs::write(inst.dir.path().join("good.yaml"), good).unwrap();
    let o = inst.vigil(&["job", "submit", "good.yaml"]);
    o.ok();
    inst.vigil(&["job", "wait", o.stdout.trim()]).code_is(0);
    // A missing file names the file.
    let o = inst.vigil(&["job", "submit", "nope.yaml"]);
    assert_eq!(o.code, 1);
    assert!(o.stderr.contains("nope.yaml"), "{}", o.dump());
}

#[test]
fn cli_usage_errors() {
    let inst = Instance::start(2, &[]);
    let o = inst.vigil(&["run", "--bogus-option", "true"]);
    assert_eq!(o.code, 2, "{}", o.dump());
    let errs: Vec<&str> = o.stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errs.len(), 1, "{}", o.dump());
    assert!(errs[0].contains("--bogus-option"), "{}", o.dump());
    for args in [
        vec!["run", "-n", "0", "true"],
        vec!["run", "-N", "3", "-n", "2", "true"],
        vec!["run", "--time-limit=-5", "true"],
        vec!["run", "-o", "exit-timeout=soon", "true"],
    ] {
        let o = inst.vigil(&args);
        assert_eq!(o.code, 1, "{}", o.dump());
        assert_eq!(o.stderr.lines().count(), 1, "{}", o.dump());
        assert!(o.stderr.starts_with("vigil: "), "{}", o.dump());
    }
    // Outside an instance: a clear message about VIGIL_URI.
    let mut c = vigil_cmd(inst.dir.path());
    c.args(["jobs"]);
    let o = run(c, CMD_TIMEOUT, None);
    assert_eq!(o.code, 1, "{}", o.dump());
    assert!(o.stderr.contains("VIGIL_URI"), "{}", o.dump());
}

/// Draining a lost rank does not hide that it is lost: `drained*` with both reasons, and `liveness` in the JSON.
#[test]
fn a_drained_lost_rank_still_shows_lost() {
    let inst = Instance::start(3, &[]);
    let broker: i32 = inst.vigil(&["getattr", "-r", "2", "broker.pid"]).stdout.trim().parse().expect("broker.pid");
    // SAFETY: kill has no memory preconditions.
    assert_eq!(unsafe { libc::kill(broker, libc::SIGKILL) }, 0);
    let row2 = || inst.vigil(&["resource", "status", "--json"]).json()["ranks"][2].clone();
    assert!(wait_for(Duration::from_secs(10), || row2()["state"] == "lost"), "{}", row2());
    inst.vigil(&["resource", "drain", "2", "dead", "node"]).ok();
    let r = row2();
    assert_eq!((r["state"].as_str(), r["liveness"].as_str()), (Some("drained"), Some("lost")), "{r}");
    let o = inst.vigil(&["resource", "status"]);
    let line = o.stdout.lines().find(|l| l.trim_start().starts_with("drained*")).unwrap_or_default();
    assert!(line.contains("dead node (lost: "), "{}", o.dump());
    assert!(!o.stdout.lines().any(|l| l.trim_start().starts_with("drained ")), "{}", o.dump());
}
