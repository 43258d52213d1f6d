//! The scheduler end to end: EASY backfill and FCFS (`sched.policy`), requeue after a broker is killed, and a
//! batch job's instance that shrinks when it loses a node (issue 19).

mod common;

use common::*;
use std::time::Duration;

/// Timeout of a command that waits for a whole nested instance.
const NESTED_TIMEOUT: Duration = Duration::from_secs(40);

/// Write an executable script `name` into the instance's directory; returns "./name".
fn script(inst: &Instance, name: &str, body: &str) -> String {
    use std::os::unix::fs::PermissionsExt;
    let p = inst.dir.path().join(name);
    std::fs::write(&p, body).expect("write script");
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).expect("chmod script");
    format!("./{name}")
}

/// Cores per node of the instance (from rank 0).
#[track_caller]
fn cores_per_node(inst: &Instance) -> u64 {
    let o = inst.vigil(&["resource", "list", "--json"]);
    o.ok();
    o.json()["ranks"][0]["ncores"].as_u64().unwrap_or_else(|| panic!("{}", o.dump()))
}

/// The events of job `id`, as JSON objects.
#[track_caller]
fn eventlog(inst: &Instance, id: &str) -> Vec<serde_json::Value> {
    let o = inst.vigil(&["job", "eventlog", "--json", id]);
    o.ok();
    o.stdout.lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
}

/// A long job reserved, a short job behind it runs first, a long one behind it does not; `vigil jobs` shows when
/// the reserved job is expected to start. With `sched.policy=fcfs` the short one waits too.
#[test]
fn easy_backfill_runs_a_short_job_before_a_reserved_one() {
    let inst = Instance::start(2, &[]);
    let per = cores_per_node(&inst);
    let all = (2 * per).to_string();
    let half = per.to_string();
    // Rank 0's cores held for up to 30 s; the head needs every core.
    let hog = inst.submit(&["-N1", "-n", &half, "-t", "30s", "sleep", "30"]);
    assert!(inst.wait_state(&hog, "RUN", Duration::from_secs(10)));
    let head = inst.submit(&["-n", &all, "-t", "1m", "true"]);
    let short = inst.submit(&["-n1", "-t", "5s", "true"]);
    let long = inst.submit(&["-n1", "-t", "10m", "sleep", "1"]);
    assert!(inst.wait_state(&short, "INACTIVE", Duration::from_secs(10)), "the short job is backfilled");
    assert_eq!(inst.job(&short)["result"].as_str(), Some("COMPLETED"));
    assert_eq!(inst.state(&head), "SCHED");
    assert_eq!(inst.state(&long), "SCHED", "ends after the reservation: it waits");
    let t = inst.vigil(&["jobs"]);
    let row_of = |id: &str| t.stdout.lines().find(|l| l.split_whitespace().next() == Some(id)).unwrap_or("");
    let row = row_of(&head);
    assert!(row.contains("eta:"), "the reserved job's expected start: {row}");
    let lrow = row_of(&long);
    assert!(lrow.contains("holds the reservation"), "{lrow}");
    let h = inst.job_info(&head);
    let eta = h.pointer("/info/annotations/sched/t_estimate").and_then(serde_json::Value::as_f64);
    let expiration = inst.job(&hog)["expiration"].as_f64();
    assert_eq!(eta, expiration, "the reservation starts when the running job's time limit expires: {h}");
    // The running job ends early: the head runs, then the long one.
    inst.vigil(&["cancel", &hog]).ok();
    assert!(inst.wait_state(&long, "INACTIVE", Duration::from_secs(20)));
    let (h, l) = (inst.job(&head), inst.job(&long));
    assert_eq!((h["result"].as_str(), l["result"].as_str()), (Some("COMPLETED"), Some("COMPLETED")), "{h}\n{l}");
    let t_run = |j: &serde_json::Value| j["t_run"].as_f64().unwrap_or(f64::NAN);
    assert!(t_run(&inst.job(&short)) < t_run(&h) && t_run(&h) <= t_run(&l), "short, head, long:\n{h}\n{l}");

    // FCFS: the short job waits behind the head.
    let inst = Instance::start(2, &["sched.policy=fcfs"]);
    assert_eq!(inst.vigil(&["getattr", "sched.policy"]).stdout.trim(), "fcfs");
    let hog = inst.submit(&["-N1", "-n", &half, "-t", "30s", "sleep", "30"]);
    assert!(inst.wait_state(&hog, "RUN", Duration::from_secs(10)));
    let head = inst.submit(&["-n", &all, "-t", "1m", "true"]);
    let short = inst.submit(&["-n1", "-t", "5s", "true"]);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!((inst.state(&head), inst.state(&short)), ("SCHED".to_string(), "SCHED".to_string()));
    assert!(inst.job_info(&short)["info"]["reason_pending"].as_str().unwrap_or("").contains("first come"));
    inst.vigil(&["cancel", &hog]).ok();
    assert!(inst.wait_state(&short, "INACTIVE", Duration::from_secs(20)));
}

/// A 2-node `--requeue` job whose node's broker is killed (kill -9) in a 4-broker instance reruns on two live
/// nodes and completes, with its id kept and a `requeue` event, ahead of a job submitted after it.
#[test]
fn a_requeue_job_reruns_on_live_nodes_after_a_broker_is_killed() {
    let inst = Instance::start(4, &[]);
    // Rank 0 (the instance's own) is kept out of the way: the job lands on ranks 1 and 2.
    let hog = inst.submit(&["-N1", "--exclusive", "sleep", "300"]);
    assert!(inst.wait_state(&hog, "RUN", Duration::from_secs(10)));
    let id = inst.submit(&["-N2", "--exclusive", "--requeue", "sh", "-c", "sleep 5; echo run-done"]);
    assert!(inst.wait_state(&id, "RUN", Duration::from_secs(10)));
    assert_eq!(inst.job(&id)["ranks"].as_str(), Some("1-2"), "{}", inst.job(&id));
    let later = inst.submit(&["-N3", "--exclusive", "true"]);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(inst.state(&later), "SCHED");
    let pid: i32 = inst.vigil(&["getattr", "-r", "2", "broker.pid"]).stdout.trim().parse().expect("broker.pid");
    // SAFETY: kill has no memory preconditions.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    // Requeued, rerun on ranks 1 and 3, and done.
    assert!(wait_for(Duration::from_secs(30), || inst.state(&id) == "INACTIVE"), "{}", inst.job(&id));
    let j = inst.job(&id);
    assert_eq!((j["result"].as_str(), j["requeues"].as_u64()), (Some("COMPLETED"), Some(1)), "{j}");
    assert_eq!(j["ranks"].as_str(), Some("1,3"), "rerun on two live nodes: {j}");
    let ev = eventlog(&inst, &id);
    let names: Vec<&str> = ev.iter().filter_map(|e| e["name"].as_str()).collect();
    let rq = ev.iter().find(|e| e["name"] == "requeue").unwrap_or_else(|| panic!("no requeue event: {names:?}"));
    assert_eq!(rq["context"]["count"].as_u64(), Some(1), "{rq}");
    assert!(rq["context"]["note"].as_str().unwrap_or("").contains("(rank 2)"), "{rq}");
    assert_eq!(names.iter().filter(|n| **n == "alloc").count(), 2, "{names:?}");
    assert_eq!(names.last(), Some(&"clean"), "{names:?}");
    let exc = ev.iter().find(|e| e["name"] == "exception").expect("the loss");
    assert!(exc["context"]["note"].as_str().unwrap_or("").contains("requeued (1 of at most 3)"), "{exc}");
    let out = inst.vigil(&["job", "attach", &id]);
    assert!(out.stdout.contains("run-done"), "the rerun's output: {}", out.dump());
    assert_eq!(inst.state(&later), "SCHED", "the later job did not pass it");
    inst.vigil(&["cancel", &hog]).ok();
    assert!(inst.wait_state(&later, "INACTIVE", Duration::from_secs(20)));
    assert_eq!(inst.job(&later)["ranks"].as_str(), Some("0-1,3"));
}

/// The 4-node batch case of issue 19: a batch job of 4 nodes whose instance loses a (non-critical) broker.
/// Inside, the instance shrinks: a pending `-N4` job fails with an `alloc` exception naming the lost node, a new
/// `vigil submit -N4` is refused at once with the shrink message, and `vigil run -N3` runs at once.
#[test]
fn a_batch_instance_that_loses_a_node_shrinks() {
    let inst = Instance::start(4, &[]);
    let body = r#"#!/bin/sh
hog=$(vigil submit -N1 sleep 300)
pending=$(vigil submit -N4 --exclusive true)
kill -9 $(vigil getattr -r 3 broker.pid)
i=0; until vigil resource eventlog 2>/dev/null | grep -q shrink; do
  i=$((i+1)); [ $i -gt 150 ] && { echo never shrank; vigil resource status; exit 3; }; sleep 0.1; done
vigil job eventlog $pending | grep exception | sed 's/^/pending: /'
if vigil submit -N4 true 2> submit.err; then echo "submit -N4: accepted"; else echo "submit -N4: refused: $(cat submit.err)"; fi
vigil run -N3 -n3 printenv VIGIL_BROKER_RANK | sort | tr '\n' ' ' | sed 's/^/ran on /'; echo
vigil cancel $hog
"#;
    let s = script(&inst, "shrink.sh", body);
    let o = inst.vigil(&["batch", "-N4", &s]);
    o.ok();
    let id = o.stdout.trim().to_string();
    let w = inst.vigil_t(&["job", "wait", &id], NESTED_TIMEOUT);
    let out = std::fs::read_to_string(inst.dir.path().join(format!("vigil-{id}.out"))).unwrap_or_default();
    assert_eq!(w.code, 0, "{}\n{out}", w.dump());
    let pending = out.lines().find(|l| l.starts_with("pending: ")).unwrap_or_else(|| panic!("{out}"));
    assert!(pending.contains("type=alloc") && pending.contains("severity=0"), "{out}");
    assert!(pending.contains("(rank 3) for good (shrink)"), "{out}");
    let refused = out.lines().find(|l| l.starts_with("submit -N4: ")).unwrap_or_else(|| panic!("{out}"));
    assert!(refused.contains("refused") && refused.contains("requested 4 nodes but this instance has 3"), "{out}");
    assert!(refused.contains("for good: it shrank"), "{out}");
    assert!(out.contains("ran on 0 1 2"), "{out}");
}

/// `--exclude`, `--requires`, `-w`: a job runs only where its constraints let it, and one that too few nodes can
/// satisfy is refused at submit saying so. (A test instance's brokers share one host name, so ranks choose here.)
#[test]
fn node_selection_options_choose_where_a_job_runs() {
    let inst = Instance::start(3, &[]);
    let ranks = |args: &[&str]| {
        let mut a = vec!["run"];
        a.extend_from_slice(args);
        a.extend_from_slice(&["sh", "-c", "echo $VIGIL_BROKER_RANK"]);
        let o = inst.vigil(&a);
        o.ok();
        let mut r: Vec<String> = o.lines().iter().map(|l| l.to_string()).collect();
        r.sort();
        r
    };
    assert_eq!(ranks(&["-N2", "--exclude", "1"]), ["0", "2"]);
    assert_eq!(ranks(&["-N1", "--requires=rank:2"]), ["2"]);
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap().trim().to_string();
    assert_eq!(ranks(&["-N3", "-w", &host]), ["0", "1", "2"], "every broker has this host name");
    let o = inst.vigil(&["run", "-N3", "--exclude", "0", "true"]);
    assert_ne!(o.code, 0, "{}", o.dump());
    assert!(o.stderr.contains("requested 3 node(s) but 2 of this instance's nodes satisfy"), "{}", o.dump());
    let o = inst.vigil(&["run", "-w", "no-such-host", "true"]);
    assert!(o.stderr.contains("0 of this instance's nodes satisfy"), "{}", o.dump());
    assert!(o.stderr.contains("(no-such-host is not a node of this instance)"), "{}", o.dump());
    // A typo in -x is refused (as Slurm's --exclude refuses an invalid node name), naming it, even though enough
    // nodes are left: the node meant to be avoided would otherwise stay in the job's choice.
    let o = inst.vigil(&["run", "-x", "7", "true"]);
    assert_eq!(o.code, 1, "{}", o.dump());
    assert_eq!(
        o.stderr.trim(),
        "vigil: -x/--exclude 7: not a node of this instance: rank 7 (its ranks: 0-2); -x is --exclude, as in Slurm \
         (whole nodes, Flux's -x: --exclusive)",
        "{}",
        o.dump()
    );
    let o = inst.vigil(&["run", "-N2", "-x", "no-such-host", "true"]);
    assert_eq!(o.code, 1, "{}", o.dump());
    assert_eq!(
        o.stderr.trim(),
        format!(
            "vigil: -x/--exclude no-such-host: not a node of this instance: no-such-host (its nodes: \
             {host},{host},{host}); -x is --exclude, as in Slurm (whole nodes, Flux's -x: --exclusive)"
        ),
        "{}",
        o.dump()
    );
    let o = inst.vigil(&["alloc", "-N1", "-x", "no-such-host", "true"]);
    assert!(o.code == 1 && o.stderr.contains("--exclude no-such-host: not a node"), "{}", o.dump());
    let o = inst.vigil(&["run", "--requires=gpu:1", "true"]);
    assert!(o.stderr.contains("expected host:HOSTLIST or rank:IDSET"), "{}", o.dump());
}

/// `vigil resource status --states ... -no FORMAT`: a script gets the node list of a state alone, and nothing for a
/// state no node is in.
#[test]
fn resource_status_prints_the_nodes_of_a_state_for_scripts() {
    let inst = Instance::start(3, &[]);
    inst.vigil(&["resource", "drain", "2", "maintenance"]).ok();
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap().trim().to_string();
    let o = inst.vigil(&["resource", "status", "-s", "avail", "-no", "{ranks} {nodelist}"]);
    o.ok();
    assert_eq!(o.stdout, format!("0-1 {host},{host}\n"), "{}", o.dump());
    let o = inst.vigil(&["resource", "status", "--states=drained,lost", "-o", "{state}:{nnodes}:{reason}"]);
    o.ok();
    assert_eq!(o.stdout, "STATE:NNODES:REASON\ndrained:1:maintenance\n", "{}", o.dump());
    let o = inst.vigil(&["resource", "status", "-s", "lost", "-no", "{nodelist}"]);
    assert_eq!((o.code, o.stdout.as_str()), (0, ""), "{}", o.dump());
    // Only states that hold nodes get a row, with or without --states (trial item 5: an empty `down` row was
    // always shown, an empty `lost` one never, and `-o '{state} {ranks} {nnodes}'` printed `down  0`).
    let o = inst.vigil(&["resource", "status", "-no", "{state} {ranks} {nnodes}"]);
    o.ok();
    assert_eq!(o.stdout, "avail 0-1 2\ndrained 2 1\n", "{}", o.dump());
    let o = inst.vigil(&["resource", "status", "-n"]);
    o.ok();
    let states: Vec<&str> = o.stdout.lines().filter_map(|l| l.split_whitespace().next()).collect();
    assert_eq!(states, ["avail", "drained"], "{}", o.dump());
    let o = inst.vigil(&["resource", "status", "-s", "gone"]);
    assert!(o.code != 0 && o.stderr.contains("unknown state 'gone'"), "{}", o.dump());
}
