//! Rank 0's state directory (`-S statedir`, docs/statedir.md): an acknowledged job is never lost when rank 0 is
//! killed, a damaged store stops scheduling and is kept, an unwritable directory is refused.

mod common;

use common::*;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A system instance on loopback ([`LoopbackSystem`]), each broker with one core, started and killed broker by
/// broker, with rank 0's state directory.
struct SystemInstance {
    sys: LoopbackSystem,
    statedir: PathBuf,
}

impl std::ops::Deref for SystemInstance {
    type Target = LoopbackSystem;
    fn deref(&self) -> &LoopbackSystem {
        &self.sys
    }
}

impl SystemInstance {
    /// `size` brokers; the state directory in `[bootstrap] statedir` when `in_toml`, else given with `-S`.
    fn new(size: u32, in_toml: bool) -> SystemInstance {
        let dir = tempdir();
        let statedir = dir.path().join("state");
        let sd = if in_toml { format!("statedir = \"{}\"\n", statedir.display()) } else { String::new() };
        let sys = LoopbackSystem::new(dir, "sys", size, 1, &sd, "");
        SystemInstance { sys, statedir }
    }

    /// Starts rank 0 again (on the same state directory) and waits until the other brokers have rejoined it
    /// (`vigil uptime` says `run`), at most 30 s.
    #[track_caller]
    fn restart_rank0(&self) -> Running {
        let r0 = self.broker(0, &[]);
        assert!(
            wait_for(Duration::from_secs(30), || {
                let o = self.client(&["uptime"]);
                o.code == 0 && o.stdout.contains(" run ")
            }),
            "the brokers did not rejoin the restarted rank 0:\n{}",
            self.client(&["uptime"]).dump()
        );
        r0
    }

    /// Every broker, and wait until the instance is up (every rank joined).
    fn start_all(&self, attrs: &[&str]) -> Vec<Running> {
        let b: Vec<Running> = (0..self.size).map(|r| self.broker(r, attrs)).collect();
        if !self.is_up() {
            // Say why: every broker's log (they log at info level).
            let uptime = self.client(&["uptime"]).dump();
            let logs: Vec<String> = b
                .into_iter()
                .enumerate()
                .map(|(r, x)| {
                    let o = x.wait(Duration::ZERO);
                    let tail: Vec<&str> = o.stderr.lines().rev().take(40).collect();
                    format!(
                        "--- rank {r} (last 40 lines) ---\n{}",
                        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                    )
                })
                .collect();
            panic!("the instance did not come up:\n{uptime}\n{}", logs.join("\n"));
        }
        b
    }

    /// Wait until the instance is up (every rank joined).
    fn wait_up(&self) {
        assert!(self.is_up(), "the instance did not come up:\n{}", self.client(&["uptime"]).dump());
    }

    /// `vigil jobs -a --json`, by id (f58).
    fn jobs(&self) -> BTreeMap<String, Value> {
        let o = self.client(&["jobs", "-a", "--json"]);
        o.ok();
        let list = o.json()["jobs"].as_array().cloned().unwrap_or_default();
        let n = list.len();
        let by_id: BTreeMap<String, Value> =
            list.into_iter().map(|j| (j["id_f58"].as_str().unwrap_or("").to_string(), j)).collect();
        assert_eq!(by_id.len(), n, "a job is listed twice");
        by_id
    }

    /// `vigil shutdown` (SIGTERM of rank 0 with a state directory stops rank 0 alone) and wait for every broker.
    fn stop(&self, brokers: Vec<Running>) -> Vec<Output> {
        self.client(&["shutdown"]).ok();
        brokers.into_iter().map(|b| b.wait(Duration::from_secs(30))).collect()
    }

    /// [`SystemInstance::stop`], and every broker stopped by it (none left running past the wait).
    #[track_caller]
    fn stop_cleanly(&self, brokers: Vec<Running>) {
        for o in self.stop(brokers) {
            assert!(!o.timed_out, "`vigil shutdown` left a broker running:\n{}", o.dump());
        }
    }
}

fn kill9(pid: u32) {
    // SAFETY: kill(2) of a process this test started.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
}

/// The scenario: jobs done, one running on every core, a flood of submissions queued behind it, and rank 0
/// killed with SIGKILL in the middle of the flood. Here without a grace (`tbon.parent_grace=0`): the other brokers
/// exit with it (or are killed), so the running job cannot be re-attached. Restarted on the same state directory:
/// every acknowledged job is there exactly once, done jobs as they were, the running one ended with a `restart`
/// exception, the queued ones run in their order, and new jobs get new ids.
#[test]
fn every_acknowledged_job_survives_kill_9_of_rank_0() {
    let inst = SystemInstance::new(4, true);
    let brokers = inst.start_all(&["tbon.parent_grace=0"]);
    let done: Vec<String> = (0..10).map(|_| inst.client(&["submit", "true"]).stdout.trim().to_string()).collect();
    assert!(
        wait_for(Duration::from_secs(60), || {
            let j = inst.jobs();
            done.iter().all(|id| j.get(id).is_some_and(|j| j["result"] == "COMPLETED"))
        }),
        "the first jobs did not complete: {:?}",
        inst.jobs()
    );
    let long = inst.client(&["submit", "-N4", "-n4", "sleep", "300"]);
    long.ok();
    let long = long.stdout.trim().to_string();
    assert!(wait_for(Duration::from_secs(30), || inst.jobs()[&long]["state"] == "RUN"), "the long job did not start");

    // The flood: 4 clients submit 50 jobs each; rank 0 is killed once 100 are acknowledged.
    let acked = Arc::new(Mutex::new(Vec::<String>::new()));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let acked = acked.clone();
            let uri = inst.uri();
            let d = inst.dir.path().to_path_buf();
            std::thread::spawn(move || {
                for _ in 0..50 {
                    let mut c = vigil_cmd(&d);
                    c.env("VIGIL_URI", &uri).args(["submit", "true"]);
                    let o = run(c, CMD_TIMEOUT, None);
                    if o.code != 0 {
                        return; // rank 0 is gone
                    }
                    acked.lock().unwrap().push(o.stdout.trim().to_string());
                }
            })
        })
        .collect();
    assert!(wait_for(Duration::from_secs(60), || acked.lock().unwrap().len() >= 100), "the flood stalled");
    kill9(brokers[0].pid());
    for t in threads {
        t.join().unwrap();
    }
    let acked: Vec<String> = acked.lock().unwrap().clone();
    assert!(acked.len() >= 100 && acked.len() < 200, "{} acknowledged", acked.len());
    // Today the other brokers exit when rank 0 is lost; whatever is left (and the long job's shells) is killed.
    let mut rest: Vec<Running> = brokers.into_iter().skip(1).collect();
    wait_for(Duration::from_secs(10), || rest.iter_mut().all(|b| b.exited()));
    for b in &rest {
        kill9(b.pid());
    }
    kill_marked(inst.dir.path());

    let brokers = inst.start_all(&["tbon.parent_grace=0"]);
    let jobs = inst.jobs();
    for id in done.iter().chain(&acked).chain([&long]) {
        assert!(jobs.contains_key(id), "acknowledged job {id} is missing after the restart");
    }
    // Submissions in flight when rank 0 died may be kept without having been answered: at most one per client.
    let extra = jobs.len() - (done.len() + 1 + acked.len());
    assert!(extra <= 4, "{extra} jobs kept that nobody submitted");
    for id in &done {
        assert_eq!(jobs[id]["result"], "COMPLETED", "{id}: {}", jobs[id]);
    }
    assert_eq!(jobs[&long]["state"], "INACTIVE", "{}", jobs[&long]);
    assert_eq!(jobs[&long]["exception"]["type"], "restart", "{}", jobs[&long]);
    let ev = inst.client(&["job", "eventlog", &long]);
    ev.ok();
    assert!(ev.stdout.contains("rank 0 restarted"), "{}", ev.dump());
    // The queued jobs run, in their order, and complete.
    assert!(
        wait_for(Duration::from_secs(180), || inst.jobs().values().all(|j| j["state"] == "INACTIVE")),
        "jobs still active after the restart: {:?}",
        inst.jobs().values().filter(|j| j["state"] != "INACTIVE").map(|j| j["id_f58"].clone()).collect::<Vec<_>>()
    );
    let jobs = inst.jobs();
    let mut flood: Vec<&Value> = acked.iter().map(|id| &jobs[id]).collect();
    flood.sort_by_key(|j| j["id"].as_u64());
    for j in &flood {
        assert_eq!(j["result"], "COMPLETED", "{j}");
    }
    let starts: Vec<f64> = flood.iter().map(|j| j["t_run"].as_f64().unwrap_or(0.0)).collect();
    assert!(starts.windows(2).all(|w| w[0] <= w[1]), "queued jobs did not start in their order: {starts:?}");
    // New ids are new.
    let max_old = jobs.values().filter_map(|j| j["id"].as_u64()).max().unwrap();
    let new = inst.client(&["submit", "true"]);
    new.ok();
    let new = new.stdout.trim().to_string();
    let jobs = inst.jobs();
    assert!(jobs[&new]["id"].as_u64().unwrap() > max_old, "new id {new} not above the kept ones");
    let up = inst.client(&["uptime"]);
    assert!(
        up.stdout.contains(&format!("state directory: {}, 1 restart(s)", inst.statedir.display())),
        "{}",
        up.dump()
    );
    inst.stop_cleanly(brokers);
}

/// The other brokers outlive rank 0 (`tbon.parent_grace`, 60 s by default with a state directory): `sleep` jobs on
/// ranks 1-3, rank 0 killed with SIGKILL and restarted on the same state directory 6 s later. The brokers never
/// exit; the job whose tasks ended during the outage completes from its shell's report, the others are
/// re-attached and finish, all with exit code 0 and a `restart` event in their eventlog; new jobs run.
#[test]
fn running_jobs_outlive_kill_9_of_rank_0_and_finish_normally() {
    let inst = SystemInstance::new(4, true);
    let mut brokers = inst.start_all(&[]);
    // Rank 0 takes no job: its own shells die with it (it is their broker), and this test is about the others.
    inst.client(&["resource", "drain", "0", "rank 0 restarts in this test"]).ok();
    let submit = |secs: &str| {
        let o = inst.client(&["submit", "-N1", "-n1", "sleep", secs]);
        o.ok();
        o.stdout.trim().to_string()
    };
    // One core per broker: one job on each of ranks 1-3. The first ends while rank 0 is away.
    let ids = [submit("3"), submit("14"), submit("14")];
    assert!(
        wait_for(Duration::from_secs(30), || {
            let j = inst.jobs();
            ids.iter().all(|id| j[id]["state"] == "RUN")
        }),
        "the jobs did not start: {:?}",
        inst.jobs()
    );
    let r0 = brokers.remove(0);
    kill9(r0.pid());
    r0.wait(Duration::from_secs(10));
    std::thread::sleep(Duration::from_secs(6));
    for b in brokers.iter_mut() {
        assert!(!b.exited(), "a broker exited while rank 0 was away");
    }
    let r0 = inst.restart_rank0();
    assert!(
        wait_for(Duration::from_secs(60), || {
            let j = inst.jobs();
            ids.iter().all(|id| j[id]["state"] == "INACTIVE")
        }),
        "the re-attached jobs did not finish: {:?}",
        inst.jobs()
    );
    let jobs = inst.jobs();
    for id in &ids {
        assert_eq!(
            (&jobs[id]["result"], &jobs[id]["exit_code"]),
            (&Value::from("COMPLETED"), &Value::from(0)),
            "{id}: {}",
            jobs[id]
        );
        let ev = inst.client(&["job", "eventlog", id]);
        ev.ok();
        assert!(ev.stdout.contains("restart"), "{}", ev.dump());
        assert!(!ev.stdout.contains("exception"), "{}", ev.dump());
    }
    // The job whose tasks ended while rank 0 was away finishes at the time they ended (its broker's clock), not at
    // the restart that brought its report.
    let ev = inst.client(&["job", "eventlog", "--json", &ids[0]]);
    ev.ok();
    let events: Vec<Value> = ev.stdout.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    let at = |name: &str| events.iter().find(|e| e["name"] == name).and_then(|e| e["timestamp"].as_f64());
    let (start, finish, restart) = (at("start"), at("finish"), at("restart"));
    assert!(
        matches!((start, finish, restart), (Some(s), Some(f), Some(r)) if f >= s + 2.5 && f < r),
        "start {start:?}, finish {finish:?}, restart {restart:?}: {}",
        ev.dump()
    );
    // And `vigil jobs` says it ran for its 3 s, not until the restart brought its report.
    assert_eq!(jobs[&ids[0]]["t_finish"].as_f64(), finish, "{}", jobs[&ids[0]]);
    let list = inst.client(&["jobs", "-a"]);
    let col = list.stdout.lines().next().and_then(|h| h.split_whitespace().position(|c| c == "TIME"));
    let row = list.stdout.lines().find(|l| l.trim_start().starts_with(ids[0].as_str())).unwrap_or_default();
    let secs = col.and_then(|c| row.split_whitespace().nth(c)).and_then(|t| t.strip_suffix('s')?.parse::<f64>().ok());
    assert!(secs.is_some_and(|t| (2.5..6.0).contains(&t)), "TIME {secs:?}, the outage was 6 s:\n{}", list.dump());
    // New jobs run, on the brokers that never left.
    let new = inst.client(&["run", "-N3", "-n3", "true"]);
    new.ok();
    for b in brokers.iter_mut() {
        assert!(!b.exited(), "a broker exited");
    }
    brokers.insert(0, r0);
    inst.stop_cleanly(brokers);
}

/// The output a running job printed before rank 0 was killed is kept: two tasks (on ranks 1 and 2) print a
/// numbered line every 0.1 s while rank 0 is killed with SIGKILL and restarted 3 s later on the same state
/// directory. Once the job has ended, `vigil job attach` shows each task's lines, those from before the kill, from
/// the outage and from after the restart, each exactly once and in order, and so it does after one more restart. A
/// `vigil job attach` that followed the job when rank 0 was killed (through rank 0, or through rank 1) waits for it
/// and goes on: it prints the same, once, and exits with the job's code, as `vigil job wait` does; one told to stop
/// waiting (Ctrl-C) exits 255, saying how to find the job.
#[test]
fn a_running_jobs_output_survives_kill_9_of_rank_0_in_order_and_once() {
    let inst = SystemInstance::new(4, true);
    let mut brokers = inst.start_all(&[]);
    inst.client(&["resource", "drain", "0", "rank 0 restarts in this test"]).ok();
    const LINES: u32 = 100;
    let script = format!("i=1; while [ $i -le {LINES} ]; do echo line $i; i=$((i+1)); sleep 0.1; done");
    let o = inst.client(&["submit", "-N2", "-n2", "sh", "-c", &script]);
    o.ok();
    let id = o.stdout.trim().to_string();
    assert!(wait_for(Duration::from_secs(30), || inst.jobs()[&id]["state"] == "RUN"), "{:?}", inst.jobs());
    // Clients follow the job meanwhile: two through rank 0, one through rank 1.
    let follow = |rank: u32, cmd: &str| {
        let mut c = vigil_cmd(inst.dir.path());
        let sock = inst.dir.path().join(format!("r{rank}")).join(format!("local-{rank}"));
        let args: &[&str] = if cmd == "wait" { &["job", "wait", &id] } else { &["job", "attach", "-l", &id] };
        c.env("VIGIL_URI", format!("local://{}", sock.display())).args(args);
        spawn(c, None)
    };
    let (follower, quitter, via_rank1) = (follow(0, "attach"), follow(0, "attach"), follow(1, "attach"));
    let waiter = follow(0, "wait");
    // Some lines are out before the kill (about 30 per task).
    std::thread::sleep(Duration::from_secs(3));
    let r0 = brokers.remove(0);
    kill9(r0.pid());
    r0.wait(Duration::from_secs(10));
    std::thread::sleep(Duration::from_secs(1));
    // One is told to stop waiting: exit code 255, not the job's, and it says how to find the job again.
    // SAFETY: kill(2) of a process this test started.
    unsafe { libc::kill(quitter.pid() as i32, libc::SIGINT) };
    let q = quitter.wait(Duration::from_secs(10));
    assert_eq!(q.code, 255, "{}", q.dump());
    assert!(q.stderr.contains("waiting for it"), "{}", q.dump());
    assert!(q.stderr.contains(&format!("`vigil job attach {id}`")), "{}", q.dump());
    assert!(q.stdout.contains("0: line 1\n"), "{}", q.dump());
    std::thread::sleep(Duration::from_secs(1));
    let r0 = inst.restart_rank0();
    assert!(
        wait_for(Duration::from_secs(60), || inst.jobs().get(&id).is_some_and(|j| j["state"] == "INACTIVE")),
        "the job did not finish: {:?}",
        inst.jobs().get(&id)
    );
    let j = &inst.jobs()[&id];
    assert_eq!((&j["result"], &j["exit_code"]), (&Value::from("COMPLETED"), &Value::from(0)), "{j}");
    let out = inst.client(&["job", "attach", "-l", &id]);
    out.ok();
    let want: Vec<String> = (1..=LINES).map(|i| format!("line {i}")).collect();
    for task in 0..2 {
        let prefix = format!("{task}: ");
        let got: Vec<&str> = out.stdout.lines().filter_map(|l| l.strip_prefix(prefix.as_str())).collect();
        assert_eq!(got, want, "task {task}'s output, whole, in order, once:\n{}", out.dump());
    }
    // The client that waited for rank 0 printed the same, each line once, and exits with the job's code.
    let f = follower.wait(Duration::from_secs(30));
    assert_eq!(f.code, 0, "{}", f.dump());
    assert!(f.stderr.contains("rank 0 is back"), "{}", f.dump());
    assert_eq!(f.stdout, out.stdout, "what the follower printed across the restart:\n{}", f.dump());
    let f = via_rank1.wait(Duration::from_secs(30));
    assert_eq!(f.code, 0, "{}", f.dump());
    assert_eq!(f.stdout, out.stdout, "what the follower through rank 1 printed across the restart:\n{}", f.dump());
    waiter.wait(Duration::from_secs(30)).code_is(0);
    assert!(!out.stderr.contains("dropped"), "{}", out.dump());
    // INACTIVE, across one more restart: the same.
    kill9(r0.pid());
    r0.wait(Duration::from_secs(10));
    let r0 = inst.broker(0, &[]);
    assert!(wait_for(Duration::from_secs(30), || inst.client(&["uptime"]).stdout.contains(" run ")));
    let again = inst.client(&["job", "attach", "-l", &id]);
    again.ok();
    assert_eq!(again.stdout, out.stdout, "the output kept of the INACTIVE job");
    brokers.insert(0, r0);
    inst.stop_cleanly(brokers);
}

/// `systemctl restart` of rank 0: SIGTERM stops rank 0 alone (exit 143, at once), the other brokers and their
/// running jobs wait for it, the restarted rank 0 re-attaches the jobs, which finish with exit code 0; then `vigil
/// shutdown` stops every broker. The state directory is given to rank 0 alone (`-S`): the others take rank 0's
/// grace.
#[test]
fn sigterm_of_rank_0_restarts_it_without_stopping_the_instance() {
    let inst = SystemInstance::new(4, false);
    let sd = format!("statedir={}", inst.statedir.display());
    let rank0 = [sd.as_str()];
    let mut brokers: Vec<Running> = (0..4).map(|r| inst.broker(r, if r == 0 { &rank0 } else { &[] })).collect();
    inst.wait_up();
    inst.client(&["resource", "drain", "0", "rank 0 restarts in this test"]).ok();
    let o = inst.client(&["submit", "-N3", "-n3", "sleep", "8"]);
    o.ok();
    let id = o.stdout.trim().to_string();
    assert!(wait_for(Duration::from_secs(30), || inst.jobs()[&id]["state"] == "RUN"), "{:?}", inst.jobs());
    let r0 = brokers.remove(0);
    // SAFETY: kill(2) of a process this test started.
    unsafe { libc::kill(r0.pid() as i32, libc::SIGTERM) };
    let out = r0.wait(Duration::from_secs(15));
    assert!(!out.timed_out, "rank 0 did not stop on SIGTERM:\n{}", out.dump());
    assert_eq!(out.code, 128 + libc::SIGTERM, "{}", out.dump());
    assert!(out.stderr.contains("stops for a restart"), "{}", out.dump());
    std::thread::sleep(Duration::from_secs(2));
    for b in brokers.iter_mut() {
        assert!(!b.exited(), "a broker exited with rank 0");
    }
    let r0 = inst.broker(0, &[&sd]);
    assert!(
        wait_for(Duration::from_secs(30), || {
            // Rank 0 may not be listening yet.
            let o = inst.client(&["jobs", "-a", "--json"]);
            o.code == 0
                && o.json()["jobs"].as_array().is_some_and(|l| {
                    l.iter().any(|j| j["id_f58"].as_str() == Some(id.as_str()) && j["state"] == "INACTIVE")
                })
        }),
        "the re-attached job did not finish: {:?}",
        inst.jobs()
    );
    let job = &inst.jobs()[&id];
    assert_eq!((&job["result"], &job["exit_code"]), (&Value::from("COMPLETED"), &Value::from(0)), "{job}");
    brokers.insert(0, r0);
    inst.stop_cleanly(brokers);
}

/// Rank 0 killed while a batch job (a nested instance on ranks 1-3) runs, and restarted 6 s later: the nested
/// instance never notices (its brokers talk to each other, not to our rank 0), its shells' brokers rejoin, and the
/// batch job completes with its script's exit code.
#[test]
fn a_batch_job_survives_kill_9_of_rank_0() {
    let inst = SystemInstance::new(4, true);
    let mut brokers = inst.start_all(&[]);
    inst.client(&["resource", "drain", "0", "rank 0 restarts in this test"]).ok();
    let script = inst.dir.path().join("job.sh");
    std::fs::write(&script, "#!/bin/sh\nsleep 10\nvigil run -N3 -n3 true && echo nested-run-ok\n").unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let o = inst.client(&["batch", "-N3", "./job.sh"]);
    o.ok();
    let id = o.stdout.trim().to_string();
    assert!(wait_for(Duration::from_secs(60), || inst.jobs()[&id]["state"] == "RUN"), "{:?}", inst.jobs());
    // Until the nested instance is up (it reports its URI: a memo), so rank 0 is killed while the script runs.
    assert!(
        wait_for(Duration::from_secs(60), || inst.client(&["job", "eventlog", &id]).stdout.contains("uri")),
        "{}",
        inst.client(&["job", "eventlog", &id]).dump()
    );
    let r0 = brokers.remove(0);
    kill9(r0.pid());
    r0.wait(Duration::from_secs(10));
    std::thread::sleep(Duration::from_secs(6));
    let r0 = inst.restart_rank0();
    assert!(
        wait_for(Duration::from_secs(60), || inst.jobs().get(&id).is_some_and(|j| j["state"] == "INACTIVE")),
        "the batch job did not finish: {:?}",
        inst.jobs().get(&id)
    );
    let j = &inst.jobs()[&id];
    assert_eq!((&j["result"], &j["exit_code"]), (&Value::from("COMPLETED"), &Value::from(0)), "{j}");
    let out = std::fs::read_to_string(inst.dir.path().join(format!("vigil-{id}.out"))).unwrap_or_default();
    assert!(out.contains("nested-run-ok"), "the script's output: {out:?}");
    for b in brokers.iter_mut() {
        assert!(!b.exited(), "a broker exited");
    }
    brokers.insert(0, r0);
    inst.stop_cleanly(brokers);
}

/// A store rank 0 cannot read (another schema version, truncated, not SQLite at all) leaves it running with
/// scheduling stopped and submissions refused, says so in `vigil uptime` and its log, and is left as it was.
#[test]
fn a_damaged_store_stops_scheduling_and_is_kept() {
    let inst = SystemInstance::new(1, false);
    let sd = format!("statedir={}", inst.statedir.display());
    let b = inst.start_all(&[&sd]);
    let id = inst.client(&["submit", "true"]).stdout.trim().to_string();
    assert!(wait_for(Duration::from_secs(30), || inst.jobs().get(&id).is_some_and(|j| j["state"] == "INACTIVE")));
    inst.stop(b);
    let file = inst.statedir.join("vigil.sqlite");
    let good = std::fs::read(&file).unwrap();
    let mut version = good.clone();
    version[60..64].copy_from_slice(&99u32.to_be_bytes()); // PRAGMA user_version
    let cases: [(&str, Vec<u8>, &str); 3] = [
        ("another schema version", version, "schema version 99"),
        ("truncated", good[..good.len() / 2].to_vec(), "vigil.sqlite"),
        ("not SQLite", b"garbage ".repeat(1000), "vigil.sqlite"),
    ];
    for (what, bytes, why) in cases {
        std::fs::write(&file, &bytes).unwrap();
        let b = inst.start_all(&[&sd]);
        let up = inst.client(&["uptime"]);
        assert!(up.stdout.contains("DAMAGED") && up.stdout.contains(why), "{what}:\n{}", up.dump());
        let s = inst.client(&["submit", "true"]);
        assert_ne!(s.code, 0, "{what}: a submission was taken:\n{}", s.dump());
        assert!(s.stderr.contains("state directory") && s.stderr.contains("scheduling"), "{what}:\n{}", s.dump());
        let out = inst.stop(b).remove(0);
        assert!(out.stderr.contains("scheduling is stopped"), "{what}: not in the log:\n{}", out.dump());
        assert_eq!(std::fs::read(&file).unwrap(), bytes, "{what}: the file was changed");
    }
    // Put back, it is read again: the job is there.
    std::fs::write(&file, &good).unwrap();
    let b = inst.start_all(&[&sd]);
    assert_eq!(inst.jobs()[&id]["result"], "COMPLETED");
    inst.stop(b);
}

/// A state directory that cannot be written is refused at start, naming it; a test instance has none.
#[test]
fn an_unwritable_state_directory_is_refused_and_a_test_instance_has_none() {
    let inst = SystemInstance::new(1, false);
    let file = inst.dir.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    let bad: &Path = &file.join("state");
    let out = inst.broker(0, &[&format!("statedir={}", bad.display())]).wait(Duration::from_secs(30));
    assert_eq!(out.code, 1, "{}", out.dump());
    assert!(out.stderr.contains(&format!("state directory {} cannot be written", bad.display())), "{}", out.dump());
    let (o, _d) = start_and_run(1, &[], &["vigil", "uptime"], Duration::from_secs(60));
    o.ok();
    assert!(o.stdout.contains("state directory: none"), "{}", o.dump());
    // `vigil start` whose rank 0 refuses it fails at once: its other brokers, which will never join, are stopped
    // with it, not killed by its 15 s deadline (found by a fresh-user trial).
    let sd = format!("statedir={}", bad.display());
    let (o, _d) = start_and_run(2, &[&sd], &["true"], Duration::from_secs(60));
    assert_eq!(o.code, 1, "{}", o.dump());
    assert!(o.elapsed < Duration::from_secs(10), "waited for the deadline: {}", o.dump());
}

/// INACTIVE jobs are purged as in Flux: automatically beyond `job-manager.inactive-num-limit`, and by
/// `vigil job purge`; a purged job is gone from the state directory too, so a restarted rank 0 does not bring it
/// back, and its id is never given again.
#[test]
fn purged_jobs_leave_the_state_directory_for_good() {
    let inst = SystemInstance::new(1, false);
    let sd = format!("statedir={}", inst.statedir.display());
    let b = inst.broker(0, &[&sd, "job-manager.inactive-num-limit=3"]);
    inst.wait_up();
    let mut ids = Vec::new();
    for _ in 0..5 {
        let o = inst.client(&["submit", "true"]);
        o.ok();
        let id = o.stdout.trim().to_string();
        inst.client(&["job", "wait", &id]).ok();
        ids.push(id);
    }
    // The two oldest went by themselves.
    assert!(wait_for(Duration::from_secs(10), || inst.jobs().len() == 3), "{:?}", inst.jobs().keys());
    let kept: Vec<String> = inst.jobs().into_keys().collect();
    assert!(ids[2..].iter().all(|id| kept.contains(id)), "kept {kept:?} of {ids:?}");
    // Counted, then purged.
    let o = inst.client(&["job", "purge", "--num-limit", "1"]);
    o.ok();
    assert!(o.stdout.contains("2 inactive job(s) would be purged (of 3)"), "{}", o.dump());
    assert_eq!(inst.jobs().len(), 3);
    let o = inst.client(&["job", "purge", "--num-limit", "1", "--force"]);
    o.ok();
    assert!(o.stdout.contains("purged 2 inactive job(s); 1 kept"), "{}", o.dump());
    assert_eq!(inst.jobs().into_keys().collect::<Vec<_>>(), vec![ids[4].clone()]);
    let o = inst.client(&["job", "info", &ids[2]]);
    assert_ne!(o.code, 0, "{}", o.dump());
    assert!(o.stderr.contains("unknown job id"), "{}", o.dump());
    let o = inst.client(&["job", "purge"]);
    assert_ne!(o.code, 0, "{}", o.dump());
    // Restarted without limits on the same state directory: only the job kept comes back; ids go on above it.
    inst.stop_cleanly(vec![b]);
    let b = inst.broker(0, &[&sd]);
    inst.wait_up();
    assert_eq!(inst.jobs().into_keys().collect::<Vec<_>>(), vec![ids[4].clone()]);
    let o = inst.client(&["submit", "true"]);
    o.ok();
    let new = o.stdout.trim().to_string();
    assert!(!ids.contains(&new), "id {new} given twice");
    inst.client(&["job", "wait", &new]).ok();
    assert_eq!(inst.jobs().len(), 2);
    inst.stop_cleanly(vec![b]);
}

/// A rank lost before rank 0's restart, and not back since, is still shown lost with its reason by the restarted
/// rank 0 (from the resource eventlog kept in the state directory), not "never joined".
#[test]
fn a_rank_lost_before_a_restart_of_rank_0_stays_lost_with_its_reason() {
    let inst = SystemInstance::new(3, true);
    let mut brokers = inst.start_all(&[]);
    let row = |rank: usize| -> Option<Value> {
        let o = inst.client(&["resource", "status", "--json"]);
        (o.code == 0).then(|| o.json()["ranks"][rank].clone())
    };
    let r2 = brokers.remove(2);
    kill9(r2.pid());
    r2.wait(Duration::from_secs(10));
    assert!(
        wait_for(Duration::from_secs(30), || row(2).is_some_and(|r| r["state"] == "lost")),
        "rank 2 was not lost: {:?}",
        row(2)
    );
    let before = row(2).unwrap();
    let r0 = brokers.remove(0);
    kill9(r0.pid());
    r0.wait(Duration::from_secs(10));
    let r0 = inst.broker(0, &[]);
    assert!(
        wait_for(Duration::from_secs(30), || row(1).is_some_and(|r| r["state"] == "avail")),
        "rank 1 did not rejoin: {:?}",
        row(1)
    );
    let after = row(2).unwrap();
    assert_eq!(after["state"], "lost", "{after}");
    assert_eq!(after["reason"], before["reason"], "{after}");
    // Named as configured, though it never registered with this rank 0.
    assert_eq!(after["hostname"], before["hostname"], "{after}");
    // `resource list` agrees: rank 2 is down (not left out), and so is drained rank 0, which is not free.
    inst.client(&["resource", "drain", "0", "maintenance"]).ok();
    let list = inst.client(&["resource", "list"]);
    let nnodes = |state: &str| -> Option<u64> {
        let l = list.stdout.lines().find(|l| l.split_whitespace().next() == Some(state))?;
        l.split_whitespace().nth(1)?.parse().ok()
    };
    assert_eq!((nnodes("free"), nnodes("down")), (Some(1), Some(2)), "{}", list.dump());
    brokers.insert(0, r0);
    inst.stop_cleanly(brokers);
}

/// A rank whose broker died while rank 0 was down (so not recorded lost) is known to the restarted rank 0 from
/// its state directory: `resource list` counts its core as down (it counted none), a 3-node submission is
/// accepted (it was refused as needing more nodes than the instance has) and waits, first for the ranks expected
/// back (`waiting for rank(s) 2`), then, past that wait, for resources; once rank 2 is back it runs and completes.
#[test]
fn a_rank_not_back_after_a_restart_of_rank_0_is_known_and_waited_for() {
    let inst = SystemInstance::new(3, true);
    let mut brokers = inst.start_all(&[]);
    let r0 = brokers.remove(0);
    kill9(r0.pid());
    r0.wait(Duration::from_secs(10));
    let r2 = brokers.remove(1);
    kill9(r2.pid());
    r2.wait(Duration::from_secs(10));
    // `vigil jobs` through rank 1 while rank 0 is away: its broker keeps the request; the command says why it
    // waits (it waited without a word), then lists the jobs once rank 0 is back.
    let mut c = vigil_cmd(inst.dir.path());
    let sock = inst.dir.path().join("r1").join("local-1");
    c.env("VIGIL_URI", format!("local://{}", sock.display())).args(["jobs", "-a"]);
    let listing = spawn(c, None);
    std::thread::sleep(Duration::from_secs(4));
    let r0 = inst.broker(0, &[]);
    let l = listing.wait(Duration::from_secs(30));
    assert_eq!(l.code, 0, "{}", l.dump());
    assert!(l.stderr.contains("no answer from rank 0 after 3 s; waiting"), "{}", l.dump());
    assert!(l.stdout.trim_start().starts_with("JOBID"), "{}", l.dump());
    assert!(
        wait_for(Duration::from_secs(30), || {
            let o = inst.client(&["resource", "status", "--json"]);
            o.code == 0 && o.json()["ranks"][1]["state"] == "avail"
        }),
        "rank 1 did not rejoin"
    );
    let list = inst.client(&["resource", "list"]);
    let down = list.stdout.lines().find(|l| l.split_whitespace().next() == Some("down")).unwrap_or("").to_string();
    assert_eq!(down.split_whitespace().take(3).collect::<Vec<_>>(), ["down", "1", "1"], "{}", list.dump());
    let o = inst.client(&["submit", "-N3", "-n3", "true"]);
    o.ok();
    let id = o.stdout.trim().to_string();
    let reason = || inst.jobs()[&id]["reason_pending"].as_str().unwrap_or("").to_string();
    let first = reason();
    assert!(first.contains("waiting for rank(s) 2 to come back"), "{first}");
    assert!(
        wait_for(Duration::from_secs(30), || !reason().contains("waiting for rank(s)")),
        "still waiting for rank 2 past the hold: {}",
        reason()
    );
    assert_eq!(inst.jobs()[&id]["state"], "SCHED", "{}", reason());
    let r2 = inst.broker(2, &[]);
    assert!(
        wait_for(Duration::from_secs(30), || inst.jobs()[&id]["state"] == "INACTIVE"),
        "the job did not run once rank 2 was back: {:?}",
        inst.jobs()[&id]
    );
    assert_eq!(inst.jobs()[&id]["result"], "COMPLETED", "{:?}", inst.jobs()[&id]);
    brokers.insert(0, r0);
    brokers.push(r2);
    inst.stop_cleanly(brokers);
}

/// `vigil shutdown` of a system instance with a state directory while a 2-node job runs: the job ends with its
/// `shutdown` exception and is kept INACTIVE, so the next start lists it so, neither re-attached nor judged to
/// have lost its nodes, and its TIME is how long it ran (found by a fresh-user trial: it was left in CLEANUP).
#[test]
fn a_job_ended_by_vigil_shutdown_is_kept_inactive_with_its_reason() {
    let inst = SystemInstance::new(4, true);
    let brokers = inst.start_all(&[]);
    inst.client(&["resource", "drain", "0", "rank 0 restarts in this test"]).ok();
    let o = inst.client(&["submit", "-N2", "-n2", "sleep", "100"]);
    o.ok();
    let id = o.stdout.trim().to_string();
    assert!(wait_for(Duration::from_secs(30), || inst.jobs()[&id]["state"] == "RUN"), "{:?}", inst.jobs());
    std::thread::sleep(Duration::from_secs(1));
    inst.stop_cleanly(brokers);
    std::thread::sleep(Duration::from_secs(2));
    let brokers = inst.start_all(&[]);
    let j = inst.jobs()[&id].clone();
    assert_eq!((j["state"].as_str(), j["exception"]["type"].as_str()), (Some("INACTIVE"), Some("shutdown")), "{j}");
    let ev = inst.client(&["job", "eventlog", &id]);
    ev.ok();
    assert!(!ev.stdout.contains("restart") && !ev.stdout.contains("lost critical"), "{}", ev.dump());
    let (run, end) = (j["t_run"].as_f64().unwrap_or(0.0), j["t_inactive"].as_f64().unwrap_or(f64::MAX));
    assert!(end - run < 2.5 + 1.0, "ended with the shutdown, not at the next start: {j}");
    inst.stop_cleanly(brokers);
}

/// `job-manager.submit` of `jobspec` with `key` over a connection to `uri`, as `vigil submit` sends it: the answer
/// (the job id, and `duplicate` when the key named a job already held) or the error.
fn submit_keyed(uri: &str, jobspec: &Value, key: &str) -> Result<Value, String> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let c = vigil::client::Client::connect(uri).await.map_err(|e| e.to_string())?;
        let payload = serde_json::json!({"jobspec": jobspec, "stdin": false, "submit_key": key});
        c.rpc("job-manager.submit", 0, &payload).await.map_err(|e| e.errstr)
    })
}

/// Idempotent submission across a restart of rank 0 (`submit_key`, docs/statedir.md). Making rank 0 die after
/// its store took a submission and before its answer went out cannot be timed from here, so the two halves of
/// that case are tried one by one:
/// - the rank 0 side: a submission made durable, rank 0 killed with SIGKILL and restarted, then the same
///   submission sent again with its key, as a client whose answer was lost does: the answer is the job the first
///   made (`"duplicate": true`), and `vigil jobs -a` lists it once; another key makes a new job;
/// - the client side: `vigil submit` through rank 1 while rank 0 is stopped, rank 0 then killed with the request
///   in flight (rank 1 answers EHOSTUNREACH) and restarted 3 s later: the command waits, sends the submission
///   again with its key, and prints the job's id, exit code 0; the job exists once and runs.
#[test]
fn a_submission_sent_again_after_a_restart_of_rank_0_is_one_job() {
    let inst = SystemInstance::new(2, true);
    let mut brokers = inst.start_all(&[]);
    inst.client(&["resource", "drain", "0", "rank 0 restarts in this test"]).ok();
    let uri0 = inst.uri();
    let dry = inst.client(&["submit", "--dry-run", "-N1", "-n1", "true"]);
    dry.ok();
    let jobspec: Value = serde_json::from_str(dry.stdout.trim()).expect("a jobspec");
    let key = "5d1c0f2a9b7e4c3d8a6f1e2b3c4d5e6f";
    let first = submit_keyed(&uri0, &jobspec, key).expect("accepted");
    assert_eq!(first.get("duplicate"), None, "{first}");
    let id = first["id_f58"].as_str().expect("an id").to_string();
    assert!(wait_for(Duration::from_secs(30), || inst.jobs()[&id]["state"] == "INACTIVE"), "{:?}", inst.jobs());
    let r0 = brokers.remove(0);
    kill9(r0.pid());
    r0.wait(Duration::from_secs(10));
    let r0 = inst.restart_rank0();
    let again = submit_keyed(&uri0, &jobspec, key).expect("accepted");
    assert_eq!((again["id_f58"].as_str(), &again["duplicate"]), (Some(id.as_str()), &Value::Bool(true)), "{again}");
    let other = submit_keyed(&uri0, &jobspec, "another-key").expect("accepted");
    assert!(other.get("duplicate").is_none() && other["id_f58"] != first["id_f58"], "{other}");
    let other = other["id_f58"].as_str().expect("an id").to_string();
    let jobs = inst.jobs();
    assert_eq!(jobs.len(), 2, "the first job once, and the other: {jobs:?}");
    assert!(wait_for(Duration::from_secs(30), || inst.jobs()[&other]["state"] == "INACTIVE"), "{:?}", inst.jobs());

    // The client side: the request in flight when rank 0 dies.
    let mut c = vigil_cmd(inst.dir.path());
    c.env("VIGIL_URI", format!("local://{}", inst.dir.path().join("r1").join("local-1").display()))
        .args(["submit", "-N1", "-n1", "true"]);
    // SAFETY: kill(2) of a process this test started.
    unsafe { libc::kill(r0.pid() as i32, libc::SIGSTOP) };
    let submit = spawn(c, Some(inst.dir.path()));
    std::thread::sleep(Duration::from_secs(1));
    kill9(r0.pid());
    r0.wait(Duration::from_secs(10));
    std::thread::sleep(Duration::from_secs(3));
    let r0 = inst.restart_rank0();
    let o = submit.wait(Duration::from_secs(60));
    o.ok();
    assert!(o.stderr.contains("sending it again once rank 0 is back"), "{}", o.dump());
    let new = o.stdout.trim().to_string();
    assert!(wait_for(Duration::from_secs(30), || inst.jobs().get(&new).is_some_and(|j| j["state"] == "INACTIVE")));
    let jobs = inst.jobs();
    assert_eq!(jobs.len(), 3, "one job of the command's submission: {jobs:?}");
    assert_eq!(jobs[&new]["result"], "COMPLETED", "{}", jobs[&new]);
    brokers.insert(0, r0);
    inst.stop_cleanly(brokers);
}

/// A chain of three jobs (`--dependency=afterok:`, issue 39) across kill -9 of rank 0 while its head runs: the
/// restarted rank 0 knows what each still waits for (its state directory kept the jobspecs and the
/// `dependency-add` events), the head is re-attached and completes, and the chain then runs in order.
#[test]
fn a_dependency_chain_survives_kill_9_of_rank_0() {
    let inst = SystemInstance::new(2, true);
    let mut brokers = inst.start_all(&[]);
    inst.client(&["resource", "drain", "0", "rank 0 restarts in this test"]).ok();
    let submit = |args: &[&str]| {
        let o = inst.client(&[&["submit"], args].concat());
        o.ok();
        o.stdout.trim().to_string()
    };
    let a = submit(&["--job-name", "first", "sleep", "8"]);
    let b = submit(&[&format!("--dependency=afterok:{a}"), "--job-name", "second", "true"]);
    let c = submit(&["--dependency", &format!("afterok:{b}"), "--job-name", "third", "true"]);
    assert!(wait_for(Duration::from_secs(30), || inst.jobs()[&a]["state"] == "RUN"), "{:?}", inst.jobs());
    let t = inst.client(&["jobs"]);
    let row = t.stdout.lines().find(|l| l.starts_with(&format!("{b:>14}"))).unwrap_or("");
    assert!(row.contains(&format!("dependency: afterok:{a}")) && row.contains(" D "), "{}", t.stdout);
    let r0 = brokers.remove(0);
    kill9(r0.pid());
    r0.wait(Duration::from_secs(10));
    std::thread::sleep(Duration::from_secs(2));
    let r0 = inst.restart_rank0();
    assert_eq!(inst.jobs()[&c]["state"], "DEPEND", "{:?}", inst.jobs());
    assert!(
        wait_for(Duration::from_secs(60), || inst.jobs().get(&c).is_some_and(|j| j["state"] == "INACTIVE")),
        "the chain did not finish: {:?}",
        inst.jobs()
    );
    let jobs = inst.jobs();
    for id in [&a, &b, &c] {
        assert_eq!(jobs[id]["result"], "COMPLETED", "{}", jobs[id]);
    }
    let t = |id: &str, k: &str| jobs[id][k].as_f64().unwrap_or(f64::NAN);
    // Rank 0's own times (a re-attached job's `finish` carries its node's clock).
    assert!(t(&b, "t_run") >= t(&a, "t_inactive") && t(&c, "t_run") >= t(&b, "t_inactive"), "in order: {jobs:?}");
    brokers.insert(0, r0);
    inst.stop_cleanly(brokers);
}
