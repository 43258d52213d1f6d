//! Nested instances end to end: `vigil batch` (directives, output files, exit codes, two levels), `vigil alloc`,
//! `vigil proxy`, the critical ranks a child reports to its parent, the resources a child sees, and bad input.

mod common;

use common::*;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

/// Timeout of a command that waits for a whole nested instance.
const NESTED_TIMEOUT: Duration = Duration::from_secs(30);

/// Write an executable script `name` into the instance's directory; returns "./name".
fn script(inst: &Instance, name: &str, body: &str) -> String {
    use std::os::unix::fs::PermissionsExt;
    let p = inst.dir.path().join(name);
    std::fs::write(&p, body).expect("write script");
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).expect("chmod script");
    format!("./{name}")
}

/// `vigil batch ARGS...`, returning the job id it prints.
#[track_caller]
fn batch(inst: &Instance, args: &[&str]) -> String {
    let mut a = vec!["batch"];
    a.extend_from_slice(args);
    let o = inst.vigil(&a);
    o.ok();
    let id = o.stdout.trim().to_string();
    assert!(id.starts_with('f') && !id.contains(char::is_whitespace), "bad job id:\n{}", o.dump());
    id
}

/// Read a file of the instance's directory.
#[track_caller]
fn read(inst: &Instance, name: &str) -> String {
    std::fs::read_to_string(inst.dir.path().join(name)).unwrap_or_else(|e| panic!("cannot read {name}: {e}"))
}

/// Cores per node of the instance (from rank 0).
#[track_caller]
fn cores_per_node(inst: &Instance) -> u64 {
    let o = inst.vigil(&["resource", "list", "--json"]);
    o.ok();
    o.json()["ranks"][0]["ncores"].as_u64().unwrap_or_else(|| panic!("{}", o.dump()))
}

/// The (NNODES, NCORES) of the `free` row of a `vigil resource list` table found in `text`.
fn free_row(text: &str) -> Option<(u64, u64)> {
    text.lines().find_map(|l| {
        let w: Vec<&str> = l.split_whitespace().collect();
        (w.first() == Some(&"free") && w.len() >= 4)
            .then(|| (w[1].parse().ok(), w[2].parse().ok()))
            .and_then(|(a, b)| Some((a?, b?)))
    })
}

/// Expand an idset / cpulist ("0-2,5").
fn expand(s: &str) -> Vec<u32> {
    let mut v = Vec::new();
    for part in s.split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => v.extend(a.parse::<u32>().unwrap()..=b.parse::<u32>().unwrap()),
            None => v.push(part.parse().unwrap()),
        }
    }
    v
}

/// Format ranks as an idset ("0,2-3").
fn idset(ranks: &[u32]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ranks.len() {
        let mut j = i;
        while j + 1 < ranks.len() && ranks[j + 1] == ranks[j] + 1 {
            j += 1;
        }
        out.push(if i == j { ranks[i].to_string() } else { format!("{}-{}", ranks[i], ranks[j]) });
        i = j + 1;
    }
    out.join(",")
}

/// A batch script that waits until the file `go` exists in `dir`, then prints "done".
fn waiter(dir: &Path, go: &str) -> String {
    format!("#!/bin/sh\nwhile [ ! -e '{}' ]; do sleep 0.1; done\necho done\n", dir.join(go).display())
}

/// Wait until job `id` reports its nested instance (info.uri); returns `info`.
#[track_caller]
fn wait_for_uri(inst: &Instance, id: &str) -> serde_json::Value {
    let mut info = serde_json::Value::Null;
    let ok = wait_for(NESTED_TIMEOUT, || {
        info = inst.job_info(id)["info"].clone();
        info["uri"].is_string() || info["state"].as_str() == Some("INACTIVE")
    });
    assert!(ok && info["uri"].is_string(), "job {id} never reported its instance: {info}");
    info
}

const BATCH_SCRIPT: &str = r#"#!/bin/sh
# vigil: -N 2
echo "size $(vigil getattr size)"
echo "level $(vigil getattr instance-level)"
echo "args $*"
vigil resource list
vigil run -N2 -n2 printenv VIGIL_BROKER_RANK | sort | sed 's/^/broker-rank /'
exit 5
"#;

#[track_caller]
fn check_batch_output(text: &str, per_node: u64) {
    let lines: Vec<&str> = text.lines().collect();
    for want in ["size 2", "level 1", "args one two words", "broker-rank 0", "broker-rank 1"] {
        assert!(lines.contains(&want), "missing {want:?} in the batch output:\n{text}");
    }
    assert_eq!(free_row(text), Some((2, 2 * per_node)), "the child owns 2 nodes, {} cores:\n{text}", 2 * per_node);
}

#[test]
fn batch_runs_the_script_in_a_child_instance() {
    let inst = Instance::start(3, &[]);
    let per_node = cores_per_node(&inst);
    let s = script(&inst, "job.sh", BATCH_SCRIPT);
    let id = batch(&inst, &[&s, "one", "two words"]);
    inst.vigil_t(&["job", "wait", &id], NESTED_TIMEOUT).code_is(5);
    let text = read(&inst, &format!("vigil-{id}.out"));
    check_batch_output(&text, per_node);
    let j = inst.job(&id);
    assert_eq!(
        (j["state"].as_str(), j["exit_code"].as_i64(), j["nnodes"].as_u64()),
        (Some("INACTIVE"), Some(5), Some(2)),
        "{j}"
    );
    assert_eq!(j["name"].as_str(), Some("job.sh"), "{j}");

    // --output instead of the default file.
    let id2 = batch(&inst, &["--output=custom.out", &s, "one", "two words"]);
    inst.vigil_t(&["job", "wait", &id2], NESTED_TIMEOUT).code_is(5);
    check_batch_output(&read(&inst, "custom.out"), per_node);
    assert!(!inst.dir.path().join(format!("vigil-{id2}.out")).exists(), "--output replaces the default file");
    // Everything is free again in the parent.
    let l = inst.vigil(&["resource", "list"]);
    assert_eq!(free_row(&l.stdout), Some((3, 3 * per_node)), "{}", l.dump());
}

/// `vigil batch --cc IDSET`: one batch job per id, in order, each with `{cc}` replaced in its arguments and
/// output path and `VIGIL_JOB_CC` set; the output of each is its script's lines alone (no broker log lines).
#[test]
fn batch_cc_submits_one_instance_per_id() {
    let inst = Instance::start(2, &[]);
    let s = script(&inst, "cc.sh", "#!/bin/sh\necho \"copy $VIGIL_JOB_CC arg $1\"\n");
    let o = inst.vigil(&["batch", "--cc", "1-3", "--output", "cc-{cc}.out", &s, "a{cc}"]);
    o.ok();
    let ids: Vec<&str> = o.stdout.lines().collect();
    assert_eq!(ids.len(), 3, "{}", o.dump());
    for (i, id) in ids.iter().enumerate() {
        inst.vigil_t(&["job", "wait", id], NESTED_TIMEOUT).code_is(0);
        let n = i + 1;
        assert_eq!(read(&inst, &format!("cc-{n}.out")), format!("copy {n} arg a{n}\n"));
    }
    let bad = inst.vigil(&["batch", "--cc", "5-2", &s]);
    assert_ne!(bad.code, 0, "{}", bad.dump());
    assert!(bad.stderr.contains("--cc"), "{}", bad.dump());
}

/// The nested instance's own broker on a non-critical rank killed (its node lives on): the instance goes on
/// without it, the job gets a non-fatal exception saying so, and the job's exit code is the script's.
#[test]
fn batch_survives_its_non_critical_broker_killed() {
    let inst = Instance::start(3, &[]);
    let body = "#!/bin/sh\nkill -9 $(vigil getattr -r 1 broker.pid)\nsleep 1\nvigil run -N1 true && echo survived\n";
    let s = script(&inst, "kill1.sh", body);
    let id = batch(&inst, &["-N2", &s]);
    inst.vigil_t(&["job", "wait", &id], NESTED_TIMEOUT).code_is(0);
    assert!(read(&inst, &format!("vigil-{id}.out")).contains("survived"));
    let e = inst.vigil(&["job", "eventlog", "--json", &id]);
    let exc: Vec<serde_json::Value> = e
        .stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["name"] == "exception")
        .collect();
    assert_eq!(exc.len(), 1, "{}", e.dump());
    let c = &exc[0]["context"];
    assert_eq!((c["type"].as_str(), c["severity"].as_u64()), (Some("exec"), Some(2)), "{}", e.dump());
    assert!(c["note"].as_str().unwrap_or_default().contains("the job's instance continues without it"), "{}", e.dump());
    // Its node went back to this instance while the job ran on (release{final:false}), then the rest at the end.
    let releases: Vec<serde_json::Value> = e
        .stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["name"] == "release")
        .map(|v| v["context"]["final"].clone())
        .collect();
    assert_eq!(releases, vec![serde_json::json!(false), serde_json::json!(true)], "{}", e.dump());
    // The exception names the node in its context too, and `vigil job info` lists what the job lost and how many
    // nodes it holds now beside the count it started with.
    assert!(c["ranks"].is_string() && c["hosts"].is_string(), "{}", e.dump());
    let o = inst.vigil(&["job", "info", "--json", &id]);
    o.ok();
    let info: serde_json::Value = serde_json::from_str(&o.stdout).unwrap_or_else(|_| panic!("{}", o.dump()));
    let i = &info["info"];
    assert_eq!((i["nnodes"].as_u64(), i["nnodes_current"].as_u64()), (Some(2), Some(1)), "{info}");
    assert_eq!(i["lost_ranks"], c["ranks"], "{info}");
    assert_eq!(i["lost_nodelist"], c["hosts"], "{info}");
    // For people: the node counts now and at start, the lost node by host and rank.
    let h = inst.vigil(&["job", "info", &id]);
    h.ok();
    let lost = format!("lost:       {} (rank {})", c["hosts"].as_str().unwrap(), c["ranks"].as_str().unwrap());
    for w in ["nodes:      1 now, 2 at start", lost.as_str(), "result:     COMPLETED, exit code 0"] {
        assert!(h.stdout.lines().any(|l| l == w), "{w:?} expected:\n{}", h.dump());
    }
    let uri = i["instance"]["uri"].as_str().unwrap_or("?");
    assert!(h.stdout.lines().any(|l| l == format!("instance:   {uri}")), "{}", h.dump());
}

/// The exceptions in job `id`'s eventlog, as (severity, note).
#[track_caller]
fn exceptions(inst: &Instance, id: &str) -> Vec<(u64, String)> {
    let e = inst.vigil(&["job", "eventlog", "--json", id]);
    e.stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["name"] == "exception")
        .map(|v| {
            let c = &v["context"];
            (c["severity"].as_u64().unwrap_or(99), c["note"].as_str().unwrap_or_default().to_string())
        })
        .collect()
}

/// A batch job whose child keeps a tree (`kary:2`: rank 1 routes for rank 3): the child's router broker is
/// killed on its live node. Rank 3 re-parents under rank 2, the job gets one severity-2 exception, runs a job
/// on the three survivors, and ends with its script's exit code.
#[test]
fn batch_with_a_tree_survives_its_router_broker_killed() {
    let inst = Instance::start(4, &[]);
    let body = "#!/bin/sh
        kill -9 $(vigil getattr -r 1 broker.pid)
        i=0; until vigil overlay status --json | grep -q '\"adopted\":true'; do
          i=$((i+1)); [ $i -gt 100 ] && { echo never re-parented; vigil overlay status; exit 3; }; sleep 0.1; done
        vigil overlay status
        vigil run -N3 -n3 printenv VIGIL_BROKER_RANK | sort | tr '\n' ' ' | sed 's/^/ran on /'; echo
";
    let s = script(&inst, "router.sh", body);
    let id = batch(&inst, &["-N4", "-S", "tbon.topo=kary:2", &s]);
    let w = inst.vigil_t(&["job", "wait", &id], NESTED_TIMEOUT);
    let out = read(&inst, &format!("vigil-{id}.out"));
    assert_eq!(
        w.code,
        0,
        "{}
{out}",
        w.dump()
    );
    assert!(out.contains("ran on 0 2 3"), "{out}");
    assert!(out.lines().any(|l| l.contains("─ 3 ") && l.contains("[adopted]")), "{out}");
    let exc = exceptions(&inst, &id);
    assert_eq!(
        exc.len(),
        1,
        "{exc:?}
{out}"
    );
    assert_eq!(exc[0].0, 2, "{exc:?}");
    assert!(exc[0].1.contains("SIGKILL") && exc[0].1.contains("continues without it"), "{exc:?}");
}

/// The broker of a nested instance's rank 0 (its only critical rank) killed on a live node: the job fails at
/// once with one fatal exception naming it, not one "continues without it" per broker it cut off.
#[test]
fn batch_whose_rank_0_broker_is_killed_fails_with_one_exception() {
    let inst = Instance::start(4, &[]);
    let s = script(
        &inst,
        "kill0.sh",
        "#!/bin/sh
kill -9 $(vigil getattr broker.pid)
sleep 60
",
    );
    let id = batch(&inst, &["-N4", &s]);
    let w = inst.vigil_t(&["job", "wait", &id], NESTED_TIMEOUT);
    assert_ne!(w.code, 0, "{}", w.dump());
    assert!(w.elapsed < Duration::from_secs(25), "the job ends at once, not with its script: {}", w.dump());
    let exc = exceptions(&inst, &id);
    assert_eq!(exc.len(), 1, "{exc:?}");
    assert_eq!(exc[0].0, 0, "{exc:?}");
    // Named once (host and rank here, and what ran there), in plain words (issue 36).
    assert!(exc[0].1.contains("where rank 0 of the job's instance ran, ended (killed by SIGKILL)"), "{exc:?}");
    assert!(exc[0].1.ends_with("the job's instance cannot go on without it"), "{exc:?}");
    assert!(!exc[0].1.contains("critical"), "{exc:?}");
    assert_eq!(inst.job(&id)["result"].as_str(), Some("FAILED"), "{}", inst.job(&id));
}

/// Without re-parenting a nested instance's routers are critical: its router's broker killed ends the job.
#[test]
fn batch_without_re_parenting_fails_when_its_router_broker_is_killed() {
    let inst = Instance::start(4, &[]);
    let s = script(
        &inst,
        "kill1.sh",
        "#!/bin/sh
kill -9 $(vigil getattr -r 1 broker.pid)
sleep 60
",
    );
    let id = batch(&inst, &["-N4", "-S", "tbon.topo=kary:2", "-S", "tbon.reparent=off", &s]);
    let w = inst.vigil_t(&["job", "wait", &id], NESTED_TIMEOUT);
    assert_ne!(w.code, 0, "{}", w.dump());
    let exc = exceptions(&inst, &id);
    assert_eq!(exc.len(), 1, "{exc:?}");
    assert_eq!(exc[0].0, 0, "{exc:?}");
    assert!(exc[0].1.contains("where rank 1 of the job's instance ran, ended (killed by SIGKILL)"), "{exc:?}");
    assert!(exc[0].1.ends_with("cannot go on without it") && !exc[0].1.contains("critical"), "{exc:?}");
}

#[test]
fn batch_in_a_batch_is_level_two() {
    let inst = Instance::start(3, &[]);
    script(&inst, "inner.sh", "#!/bin/sh\n# vigil: -N 2\necho \"inner level $(vigil getattr instance-level) size $(vigil getattr size)\"\nvigil uptime\n");
    let outer = script(
        &inst,
        "outer.sh",
        "#!/bin/sh\n# vigil: -N 3\necho \"outer level $(vigil getattr instance-level) size $(vigil getattr size)\"\n\
         id=$(vigil batch --output=inner.out ./inner.sh) || exit 90\nvigil job wait $id\necho \"inner exit $?\"\nvigil jobs -a\n",
    );
    let id = batch(&inst, &["--output=outer.out", &outer]);
    inst.vigil_t(&["job", "wait", &id], NESTED_TIMEOUT).code_is(0);
    let o = read(&inst, "outer.out");
    assert!(o.lines().any(|l| l == "outer level 1 size 3"), "{o}");
    assert!(o.lines().any(|l| l == "inner exit 0"), "{o}");
    assert!(
        o.lines().any(|l| l.contains("inner.sh") && l.split_whitespace().nth(3) == Some("CD")),
        "the outer instance ran the inner batch:\n{o}"
    );
    let i = read(&inst, "inner.out");
    assert!(i.lines().any(|l| l == "inner level 2 size 2"), "{i}");
    let up = i.lines().find(|l| l.contains("owner")).unwrap_or_else(|| panic!("no uptime line:\n{i}"));
    assert!(up.contains("depth 2,") && up.contains("size 2,"), "{up}");
    // The parent only knows the outer job.
    let jobs = inst.jobs();
    assert_eq!(jobs.len(), 1, "{jobs:#?}");
    // Nothing of either child instance outlives the parent.
    let (out, left) = inst.stop_with(0);
    out.code_is(0);
    assert!(left.is_empty(), "left behind: {left:#?}");
}

/// The allocation canceled from outside while its command runs: `vigil alloc` says why, ends the command and
/// what it started, and exits as `vigil run` would (143: the job's shells were terminated), not 0.
#[test]
fn alloc_whose_job_is_canceled_ends_its_command_and_says_so() {
    let inst = Instance::start(2, &[]);
    let d = inst.dir.path().display().to_string();
    let script = format!(
        "vigil getattr jobid > {d}/jobid.tmp && mv {d}/jobid.tmp {d}/jobid; sleep 300 & echo $! > {d}/bg; wait"
    );
    let alloc = inst.vigil_spawn(&["alloc", "-N1", "sh", "-c", &script]);
    let jobid = inst.dir.path().join("jobid");
    assert!(wait_for(NESTED_TIMEOUT, || jobid.exists() && inst.dir.path().join("bg").exists()));
    let id = std::fs::read_to_string(&jobid).unwrap().trim().to_string();
    let bg: i32 = std::fs::read_to_string(inst.dir.path().join("bg")).unwrap().trim().parse().expect("pid");
    inst.vigil(&["cancel", &id]).ok();
    let o = alloc.wait(NESTED_TIMEOUT);
    assert!(!o.timed_out, "{}", o.dump());
    o.code_is(143);
    assert!(o.stderr.contains("exception type=cancel severity=0"), "{}", o.dump());
    // SAFETY: signal 0 only checks that the process exists.
    let gone = wait_for(Duration::from_secs(5), || unsafe { libc::kill(bg, 0) } != 0);
    if !gone {
        // SAFETY: as above, with SIGKILL.
        unsafe { libc::kill(bg, libc::SIGKILL) };
    }
    assert!(gone, "the command's background process {bg} outlived the allocation");
}

#[test]
fn alloc_runs_a_command_and_gives_everything_back() {
    let inst = Instance::start(3, &[]);
    let per_node = cores_per_node(&inst);
    let o = inst.vigil_t(
        &[
            "alloc",
            "-N2",
            "sh",
            "-c",
            "vigil getattr size; echo $VIGIL_JOB_NNODES $VIGIL_JOB_NODELIST; vigil run -N2 -n2 true || exit 9; exit 3",
        ],
        NESTED_TIMEOUT,
    );
    o.code_is(3);
    // The command is told its allocation, as salloc's (SLURM_JOB_NODELIST): a test instance's nodes share a name.
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap().trim().to_string();
    assert_eq!(o.lines(), vec!["2".to_string(), format!("2 {host},{host}")], "{}", o.dump());
    let id = o
        .stderr
        .lines()
        .find_map(|l| l.strip_prefix("vigil: job ").and_then(|r| r.split(':').next()))
        .unwrap_or_else(|| panic!("no job id on stderr:\n{}", o.dump()))
        .to_string();
    let j = inst.job(&id);
    assert_eq!(j["state"].as_str(), Some("INACTIVE"), "{j}");
    assert_eq!(j["exit_code"].as_i64(), Some(3), "{j}");
    assert_eq!(j["nnodes"].as_u64(), Some(2), "{j}");
    let l = inst.vigil(&["resource", "list"]);
    l.ok();
    assert_eq!(free_row(&l.stdout), Some((3, 3 * per_node)), "everything free again:\n{}", l.dump());
    let (out, left) = inst.stop_with(0);
    out.code_is(0);
    assert!(left.is_empty(), "left behind: {left:#?}");
}

#[test]
fn proxy_reaches_a_running_batch_instance() {
    let inst = Instance::start(3, &[]);
    let s = script(&inst, "wait.sh", &waiter(inst.dir.path(), "go"));
    let id = batch(&inst, &["-N2", &s]);
    let info = wait_for_uri(&inst, &id);
    assert_eq!(info["state"].as_str(), Some("RUN"), "{info}");
    let p = inst.vigil(&["proxy", &id, "vigil", "getattr", "size"]);
    p.ok();
    assert_eq!(p.stdout.trim(), "2", "{}", p.dump());
    let p = inst.vigil(&["proxy", &id, "sh", "-c", "exit 6"]);
    p.code_is(6);
    std::fs::write(inst.dir.path().join("go"), "").unwrap();
    inst.vigil_t(&["job", "wait", &id], NESTED_TIMEOUT).code_is(0);
    assert_eq!(read(&inst, &format!("vigil-{id}.out")).trim(), "done");
    // A finished instance and an ordinary job cannot be proxied.
    let p = inst.vigil(&["proxy", &id, "true"]);
    assert_eq!(p.code, 1, "{}", p.dump());
    assert!(p.stderr.contains("not running"), "{}", p.dump());
    let plain = inst.submit(&["true"]);
    inst.vigil(&["job", "wait", &plain]).ok();
    let p = inst.vigil(&["proxy", &plain, "true"]);
    assert_eq!(p.code, 1, "{}", p.dump());
    assert!(p.stderr.contains("not a running instance"), "{}", p.dump());
}

/// Run a -N3 waiter batch with `extra` options; returns (job ranks in the parent, info.instance).
#[track_caller]
fn critical(inst: &Instance, extra: &[&str], go: &str) -> (Vec<u32>, serde_json::Value) {
    let s = script(inst, &format!("{go}.sh"), &waiter(inst.dir.path(), go));
    let mut args: Vec<&str> = vec!["-N3"];
    args.extend_from_slice(extra);
    args.push(&s);
    let id = batch(inst, &args);
    let info = wait_for_uri(inst, &id);
    let ranks = expand(info["ranks"].as_str().unwrap_or(""));
    let p = inst.vigil(&["proxy", &id, "vigil", "overlay", "status"]);
    p.ok();
    std::fs::write(inst.dir.path().join(go), "").unwrap();
    inst.vigil_t(&["job", "wait", &id], NESTED_TIMEOUT).code_is(0);
    let inner = info["instance"]["critical_ranks"].as_str().unwrap_or("?").to_string();
    assert!(
        p.stdout.lines().next().unwrap_or("").contains(&format!("critical ranks {inner}")),
        "the child's own view agrees:\n{}",
        p.dump()
    );
    (ranks, info["instance"].clone())
}

#[test]
fn critical_ranks_are_recorded_in_the_parent() {
    let inst = Instance::start(4, &[]);
    // Flat (kary:32, the default of a nested instance, is flat up to 33 brokers): only rank 0 is critical. Rank 0
    // of the parent is drained, so the child's rank 0 is some other parent rank.
    inst.vigil(&["resource", "drain", "0", "test"]).ok();
    let (ranks, i) = critical(&inst, &[], "go1");
    assert_eq!(ranks, vec![1, 2, 3], "{i}");
    assert_eq!(i["size"].as_u64(), Some(3), "{i}");
    assert_eq!(i["critical_ranks"].as_str(), Some("0"), "{i}");
    assert_eq!(i["critical_broker_ranks"].as_str(), Some(idset(&ranks[..1]).as_str()), "{i}");
    inst.vigil(&["resource", "undrain", "0"]).ok();

    // A chain whose brokers re-parent (the default): rank 2 would re-parent under rank 0, so rank 0 alone is
    // critical still.
    let (_, i) = critical(&inst, &["-S", "tbon.topo=kary:1"], "go2");
    assert_eq!(i["critical_ranks"].as_str(), Some("0"), "{i}");

    // A chain that does not re-parent: ranks 0 and 1 are critical; with parent rank 1 drained they are parent
    // ranks 0 and 2.
    inst.vigil(&["resource", "drain", "1", "test"]).ok();
    let (ranks, i) = critical(&inst, &["-S", "tbon.topo=kary:1", "-S", "tbon.reparent=off"], "go3");
    assert_eq!(ranks, vec![0, 2, 3], "{i}");
    assert_eq!(i["critical_ranks"].as_str(), Some("0-1"), "{i}");
    assert_eq!(i["critical_broker_ranks"].as_str(), Some(idset(&ranks[..2]).as_str()), "{i}");
}

#[test]
fn child_sees_synthetic_resources_and_places_tasks() {
    let inst = Instance::start(2, &["resource.synthetic=pack:4 numa:1 core:24 pu:2"]);
    let s = script(
        &inst,
        "syn.sh",
        "#!/bin/sh\nvigil resource list\nvigil run -N2 -n8 -c12 sh -c 'echo \"cores $VIGIL_BROKER_RANK $VIGIL_TASK_RANK $VIGIL_TASK_CORES\"'\n",
    );
    let id = batch(&inst, &["-N2", &s]);
    inst.vigil_t(&["job", "wait", &id], NESTED_TIMEOUT).code_is(0);
    let text = read(&inst, &format!("vigil-{id}.out"));
    assert_eq!(free_row(&text), Some((2, 192)), "{text}");
    let mut per_node: BTreeMap<u32, Vec<Vec<u32>>> = BTreeMap::new();
    let mut tasks = BTreeSet::new();
    for l in text.lines().filter_map(|l| l.strip_prefix("cores ")) {
        let w: Vec<&str> = l.split_whitespace().collect();
        assert_eq!(w.len(), 3, "{l:?} in:\n{text}");
        tasks.insert(w[1].parse::<u32>().unwrap());
        per_node.entry(w[0].parse().unwrap()).or_default().push(expand(w[2]));
    }
    assert_eq!(tasks, (0..8).collect::<BTreeSet<u32>>(), "{text}");
    assert_eq!(per_node.keys().copied().collect::<Vec<_>>(), vec![0, 1], "{text}");
    for (node, blocks) in &per_node {
        assert_eq!(blocks.len(), 4, "node {node}:\n{text}");
        let mut all = BTreeSet::new();
        for b in blocks {
            assert_eq!(b.len(), 12, "12 cores per task on node {node}:\n{text}");
            assert!(
                b.iter().all(|c| *c < 96 && all.insert(*c)),
                "overlapping or out-of-range cores on node {node}:\n{text}"
            );
        }
    }
}

#[test]
fn bad_batch_and_alloc_input_is_refused() {
    let inst = Instance::start(3, &[]);
    let d = inst.dir.path();
    std::fs::write(d.join("noexec.sh"), "#!/bin/sh\necho hi\n").unwrap();
    script(&inst, "noshebang.sh", "echo hi\n");
    script(&inst, "n4.sh", "#!/bin/sh\n# vigil: -N 4\necho hi\n");
    script(&inst, "ok.sh", "#!/bin/sh\necho hi\n");
    let before = inst.jobs().len();
    let cases: &[(&[&str], &[&str])] = &[
        (&["batch", "./missing.sh"], &["missing.sh", "No such file"]),
        (&["batch", "./noexec.sh"], &["noexec.sh", "not executable"]),
        (&["batch", "./noshebang.sh"], &["noshebang.sh", "#!"]),
        (&["batch", "-N", "5", "./ok.sh"], &["5 nodes", "3"]),
        (&["batch", "./n4.sh"], &["4 nodes", "3"]),
        (&["batch", "-n", "4", "./ok.sh"], &["-n", "use -N"]),
        (&["batch", "-S", "no.such.attr=1", "./ok.sh"], &["no.such.attr"]),
        (&["alloc", "-N", "5", "true"], &["5 nodes", "3"]),
        (&["alloc", "-n", "2", "true"], &["-n", "use -N"]),
    ];
    for (args, words) in cases {
        let o = inst.vigil(args);
        assert_eq!(o.code, 1, "{}", o.dump());
        assert!(o.stdout.trim().is_empty(), "no job id expected:\n{}", o.dump());
        let err = o.stderr.trim();
        assert!(err.lines().count() == 1 && err.starts_with("vigil: "), "one clear error line expected:\n{}", o.dump());
        for w in *words {
            assert!(err.contains(w), "error should mention {w:?}:\n{}", o.dump());
        }
    }
    assert_eq!(inst.jobs().len(), before, "no job may be left in the parent: {:#?}", inst.jobs());
    // The command line wins over the script's directive, as sbatch's options over #SBATCH lines: -N 2 against the
    // script's -N 4 (more nodes than the instance has) is a 2-node job.
    let id = batch(&inst, &["-N", "2", "./n4.sh"]);
    inst.vigil_t(&["job", "wait", &id], NESTED_TIMEOUT).ok();
    assert_eq!(inst.job(&id)["nnodes"].as_u64(), Some(2), "{}", inst.job(&id));
}

#[test]
fn bad_child_topology_is_refused_at_submit() {
    let inst = Instance::start(3, &[]);
    script(&inst, "ok.sh", "#!/bin/sh\necho hi\n");
    for args in [&["batch", "-S", "tbon.topo=mesh", "./ok.sh"][..], &["alloc", "-S", "tbon.topo=mesh", "true"][..]] {
        let o = inst.vigil(args);
        assert_eq!(o.code, 1, "{}", o.dump());
        assert!(o.stdout.trim().is_empty(), "no job id expected:\n{}", o.dump());
        assert!(
            o.stderr.contains("mesh") && !o.stderr.contains("PMI"),
            "the error should name the bad topology:\n{}",
            o.dump()
        );
    }
    assert!(inst.jobs().is_empty(), "no job may be left in the parent: {:#?}", inst.jobs());
}

#[test]
fn batch_exit_codes() {
    let inst = Instance::start(2, &[]);
    let ok = script(&inst, "ok.sh", "#!/bin/sh\necho fine\nexit 0\n");
    let k9 = script(&inst, "k9.sh", "#!/bin/sh\necho before\nkill -9 $$\necho after\n");
    let a = batch(&inst, &[&ok]);
    let b = batch(&inst, &[&k9]);
    inst.vigil_t(&["job", "wait", &a], NESTED_TIMEOUT).code_is(0);
    let w = inst.vigil_t(&["job", "wait", &b], NESTED_TIMEOUT);
    assert!(!w.timed_out && w.code != 0, "{}", w.dump());
    let ja = inst.job(&a);
    assert_eq!((ja["result"].as_str(), ja["exit_code"].as_i64()), (Some("COMPLETED"), Some(0)), "{ja}");
    let jb = inst.job(&b);
    assert_eq!(jb["result"].as_str(), Some("FAILED"), "{jb}");
    assert_ne!(jb["exit_code"].as_i64(), Some(0), "{jb}");
    assert_eq!(read(&inst, &format!("vigil-{a}.out")).trim(), "fine");
    assert_eq!(read(&inst, &format!("vigil-{b}.out")).trim(), "before");
}

/// The `KEY VALUE...` lines of `text` starting with `key`, by their first word after it (a broker rank).
fn rows<'a>(text: &'a str, key: &str) -> BTreeMap<u32, Vec<&'a str>> {
    text.lines()
        .filter_map(|l| l.strip_prefix(key)?.strip_prefix(' '))
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter_map(|w| Some((w.first()?.parse().ok()?, w[1..].to_vec())))
        .collect()
}

/// A batch job on 2 nodes whose first job writes a file in `$VIGIL_ALLOC_TMPDIR` on each node and whose second
/// reads it back there: `wrote RANK DIR MODE OWNER ME JOBDIR` and `read RANK DIR JOB CONTENT...` lines.
const ALLOC_SCRIPT: &str = r#"#!/bin/sh
# vigil: -N 2
echo "script $VIGIL_ALLOC_TMPDIR"
vigil run -N2 -n2 sh -c 'echo "rank $VIGIL_BROKER_RANK of job $VIGIL_JOB_ID" > "$VIGIL_ALLOC_TMPDIR/mark" &&
    echo "wrote $VIGIL_BROKER_RANK $VIGIL_ALLOC_TMPDIR $(stat -c "%a %u" "$VIGIL_ALLOC_TMPDIR") $(id -u) $VIGIL_JOB_TMPDIR"' || exit 11
vigil run -N2 -n2 sh -c 'echo "read $VIGIL_BROKER_RANK $VIGIL_ALLOC_TMPDIR $VIGIL_JOB_ID $(cat "$VIGIL_ALLOC_TMPDIR/mark")"' || exit 12
"#;

/// Node-local storage for an allocation (`VIGIL_ALLOC_TMPDIR`): each node of a batch job has one directory, mode
/// 0700 and the job's user's, that every job inside sees; it outlives those jobs (the second reads on each node
/// what the first wrote there; the first's own `VIGIL_JOB_TMPDIR` is gone) and goes when the batch job ends. An
/// ordinary job of the system instance is its own allocation: its directory lasts as long as it does.
/// Run `ALLOC_SCRIPT` as a batch job of `inst` and wait for it (it must succeed): its id, its output, and the
/// output with the wait's dump for assertion messages.
#[track_caller]
fn run_alloc_script(inst: &Instance) -> (String, String, String) {
    let s = script(inst, "alloc.sh", ALLOC_SCRIPT);
    let id = batch(inst, &[&s]);
    let w = inst.vigil_t(&["job", "wait", &id], NESTED_TIMEOUT);
    let text = read(inst, &format!("vigil-{id}.out"));
    let ctx = format!("{}\n--- vigil-{id}.out ---\n{text}", w.dump());
    assert_eq!(w.code, 0, "{ctx}");
    (id, text, ctx)
}

#[test]
fn alloc_tmpdir_outlives_the_inner_jobs_and_goes_with_the_allocation() {
    let inst = Instance::start(3, &[]);
    let (_, text, ctx) = run_alloc_script(&inst);
    let (wrote, readback) = (rows(&text, "wrote"), rows(&text, "read"));
    assert_eq!(wrote.keys().copied().collect::<Vec<_>>(), vec![0, 1], "{ctx}");
    assert_eq!(readback.keys().copied().collect::<Vec<_>>(), vec![0, 1], "{ctx}");
    assert_ne!(wrote[&0][0], wrote[&1][0], "one directory per node:\n{ctx}");
    for r in [0u32, 1] {
        let (w, rd) = (&wrote[&r], &readback[&r]);
        assert_eq!(w.len(), 5, "{ctx}");
        let dir = Path::new(w[0]);
        assert!(dir.is_absolute(), "{ctx}");
        assert_eq!(w[1], "700", "mode of {}:\n{ctx}", w[0]);
        assert_eq!(w[2], w[3], "owned by the job's user:\n{ctx}");
        assert!(!Path::new(w[4]).exists(), "the first job's VIGIL_JOB_TMPDIR {} should be gone:\n{ctx}", w[4]);
        assert!(!dir.starts_with(w[4]), "an inner job's tmpdir holds the allocation's:\n{ctx}");
        // The second job, on the same node, finds the same directory and what the first job wrote there.
        assert_eq!(rd[0], w[0], "rank {r}: another directory for the second job:\n{ctx}");
        let want = ["rank".to_string(), r.to_string(), "of".into(), "job".into()];
        assert_eq!(rd[2..6], want, "rank {r} read back:\n{ctx}");
        assert_ne!(rd[6], rd[1], "the mark was written by the first job, not the second:\n{ctx}");
        assert!(!dir.exists(), "{} outlived the batch job:\n{ctx}", dir.display());
    }
    // The batch script itself has its node's.
    assert!(text.lines().any(|l| l == format!("script {}", wrote[&0][0])), "{ctx}");

    // In the system instance a job is its own allocation.
    let o = inst.vigil(&[
        "run",
        "-N2",
        "-n2",
        "sh",
        "-c",
        "test -d \"$VIGIL_ALLOC_TMPDIR\" && echo \"own $VIGIL_BROKER_RANK $VIGIL_ALLOC_TMPDIR $VIGIL_JOB_TMPDIR\"",
    ]);
    o.ok();
    let own = rows(&o.stdout, "own");
    assert_eq!(own.len(), 2, "{}", o.dump());
    for w in own.values() {
        assert_eq!(Path::new(w[0]), Path::new(w[1]).join("alloc"), "{}", o.dump());
        assert!(!Path::new(w[0]).exists(), "{} outlived its job", w[0]);
    }
}

/// `exec.alloc-tmpdir-base`: the admin's place for allocation directories (a fast local disk, /dev/shm); a batch
/// job's inner jobs share the batch job's there, and neither `vigil batch` nor `vigil alloc` lets a user choose
/// another for the jobs inside.
#[test]
fn alloc_tmpdir_base_holds_the_allocations_directories() {
    let base = tempdir();
    let b = base.path().display().to_string();
    let inst = Instance::start(3, &[&format!("exec.alloc-tmpdir-base={b}")]);
    let g = inst.vigil(&["getattr", "exec.alloc-tmpdir-base"]);
    assert_eq!(g.ok().stdout.trim(), b, "{}", g.dump());
    let (id, text, ctx) = run_alloc_script(&inst);
    let (wrote, readback) = (rows(&text, "wrote"), rows(&text, "read"));
    assert_eq!(wrote.len(), 2, "{ctx}");
    for (r, w) in &wrote {
        let name = Path::new(w[0]).strip_prefix(&b).unwrap_or_else(|_| panic!("{} is not under {b}:\n{ctx}", w[0]));
        // vigil-INSTANCE-JOBID.SHELLRANK: a test instance's name is random hex.
        let name = name.to_string_lossy();
        assert!(name.starts_with("vigil-") && name.ends_with(&format!("-{id}.{r}")), "{name}:\n{ctx}");
        assert_eq!(readback[r][0], w[0], "{ctx}");
        assert_eq!(readback[r][2..4], ["rank", &r.to_string()], "{ctx}");
    }
    let left: Vec<_> = std::fs::read_dir(base.path()).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(left.is_empty(), "left in the base: {left:?}");
    let set_base = format!("exec.alloc-tmpdir-base={b}");
    for args in [&["batch", "-S", &set_base, "./alloc.sh"][..], &["alloc", "-S", "alloc-tmpdir=/x", "true"]] {
        let o = inst.vigil(args);
        assert_ne!(o.code, 0, "{}", o.dump());
        assert!(o.stderr.contains("VIGIL_ALLOC_TMPDIR"), "{}", o.dump());
    }
}
