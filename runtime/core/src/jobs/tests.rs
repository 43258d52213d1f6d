//! Deterministic tests of the job core: time is a plain number, actions are inspected directly.

use super::*;
use crate::idset::IdSet;
use crate::jobspec::JobspecBuilder;
use crate::shellproto::{status_exited, OutputLine, ShellExit, ShellReport};
use proptest::prelude::*;
use serde_json::{json, Value};

pub(super) const T0: f64 = 1_000_000.0;

pub(super) fn core(nranks: u32, cores: u32, gpus: u32) -> JobCore {
    let mut c = JobCore::new(T0);
    for r in 0..nranks {
        c.rank_online(T0, r, &format!("node{r}"), (0..cores).collect(), (0..gpus).collect(), ("live".into(), None));
    }
    c
}

pub(super) fn spec(b: JobspecBuilder) -> Value {
    serde_json::from_str(&b.build().expect("valid jobspec").to_json()).expect("json")
}

pub(super) fn cmd() -> JobspecBuilder {
    JobspecBuilder::new(vec!["true".to_string()])
}

pub(super) fn actions(c: &mut JobCore) -> Vec<Action> {
    std::iter::from_fn(|| c.poll_action()).collect()
}

pub(super) fn spawns(a: &[Action]) -> Vec<(JobId, u32, ShellInput)> {
    a.iter()
        .filter_map(|x| match x {
            Action::SpawnShell { id, rank, input } => Some((*id, *rank, (**input).clone())),
            _ => None,
        })
        .collect()
}

pub(super) fn signals(a: &[Action]) -> Vec<(Vec<u32>, i32)> {
    a.iter()
        .filter_map(|x| match x {
            Action::SignalShells { ranks, signal, .. } => Some((ranks.clone(), *signal)),
            _ => None,
        })
        .collect()
}

pub(super) fn exit_shell(c: &mut JobCore, t: f64, id: JobId, rank: u32, status: i32) {
    c.shell_exit(
        t,
        ShellExit {
            id: id.0,
            rank,
            report: Some(ShellReport {
                status,
                tasks: vec![],
                error: None,
                abort_code: None,
                usage: None,
                ended: None,
            }),
            shell_status: 0,
            ended: None,
            unkillable: vec![],
        },
    );
}

pub(super) fn names(c: &JobCore, id: JobId) -> Vec<String> {
    c.jobs[&id].eventlog.iter().map(|e| e.name.clone()).collect()
}

#[test]
fn job_runs_through_every_state() {
    let mut c = core(4, 2, 0);
    let id = c.submit(T0 + 1.0, SubmitRequest::new(&spec(cmd().nnodes(4).ntasks(8)), 1000)).unwrap().id;
    let a = actions(&mut c);
    let s = spawns(&a);
    assert_eq!(s.len(), 4);
    assert_eq!(
        s.iter().map(|x| (x.1, x.2.first_task, x.2.local_tasks)).collect::<Vec<_>>(),
        vec![(0, 0, 2), (1, 2, 2), (2, 4, 2), (3, 6, 2)]
    );
    assert_eq!(s[0].2.taskmap, json!({"version": 1, "map": [[0, 4, 2, 1]]}));
    assert_eq!(c.jobs[&id].state, JobState::Run);
    for r in 0..4 {
        c.shell_spawned(T0 + 2.0, id, r, Ok(()));
    }
    assert!(names(&c, id).contains(&"start".to_string()));
    for r in 0..4 {
        exit_shell(&mut c, T0 + 3.0, id, r, 0);
    }
    let j = &c.jobs[&id];
    assert_eq!(j.state, JobState::Inactive);
    assert_eq!(j.result(), Some("COMPLETED"));
    assert_eq!(j.exit_code(), Some(0));
    assert_eq!(
        names(&c, id),
        ["submit", "validate", "depend", "priority", "alloc", "start", "finish", "release", "free", "clean"]
    );
    let ctx: Vec<Value> = j.eventlog.iter().map(|e| Value::Object(e.context.clone())).collect();
    let replayed = state::replay(j.eventlog.iter().zip(&ctx).map(|(e, c)| (e.name.as_str(), c))).unwrap();
    assert_eq!(replayed, JobState::Inactive);
    assert!(c.pool.ranks.values().all(|p| p.alloc_cores.is_empty()), "resources returned");
}

#[test]
fn exit_code_is_the_largest_task_code() {
    let mut c = core(2, 2, 0);
    let id = c.submit(T0, SubmitRequest::new(&spec(cmd().nnodes(2).ntasks(2)), 0)).unwrap().id;
    actions(&mut c);
    exit_shell(&mut c, T0 + 1.0, id, 0, status_exited(3));
    assert_eq!(c.jobs[&id].state, JobState::Run, "waits for every shell");
    exit_shell(&mut c, T0 + 1.0, id, 1, 9); // killed by SIGKILL
    assert_eq!(c.jobs[&id].exit_code(), Some(137));
    assert_eq!(c.jobs[&id].result(), Some("FAILED"));
}

#[test]
fn fcfs_waits_and_never_backfills() {
    let mut c = core(1, 2, 0);
    c.config.policy = SchedPolicy::Fcfs;
    let a = c.submit(T0, SubmitRequest::new(&spec(cmd().ntasks(1)), 0)).unwrap().id;
    let b = c.submit(T0, SubmitRequest::new(&spec(cmd().ntasks(2)), 0)).unwrap().id;
    let d = c.submit(T0, SubmitRequest::new(&spec(cmd().ntasks(1)), 0)).unwrap().id;
    assert_eq!(c.jobs[&a].state, JobState::Run);
    assert_eq!(c.jobs[&b].state, JobState::Sched, "does not fit yet");
    assert_eq!(c.jobs[&d].state, JobState::Sched, "strict FCFS: no backfill past the blocked head");
    actions(&mut c);
    exit_shell(&mut c, T0 + 1.0, a, 0, 0);
    assert_eq!(c.jobs[&b].state, JobState::Run);
    assert_eq!(c.jobs[&d].state, JobState::Sched);
    exit_shell(&mut c, T0 + 2.0, b, 0, 0);
    assert_eq!(c.jobs[&d].state, JobState::Run);
}

#[test]
fn refused_requests_create_nothing() {
    let mut c = core(4, 2, 0);
    let e = c.submit(T0, SubmitRequest::new(&spec(cmd().nnodes(5)), 0)).unwrap_err().to_string();
    assert!(e.contains("5 nodes"), "{e}");
    let e = c.submit(T0, SubmitRequest::new(&spec(cmd().cores_per_task(3)), 0)).unwrap_err().to_string();
    assert!(e.contains("cores"), "{e}");
    let e = c.submit(T0, SubmitRequest::new(&spec(cmd().gpus_per_task(1)), 0)).unwrap_err().to_string();
    assert!(e.contains("GPUs"), "{e}");
    let mut bad = spec(cmd());
    bad["version"] = json!(2);
    let e = c.submit(T0, SubmitRequest::new(&bad, 0)).unwrap_err().to_string();
    assert!(e.contains("version"), "{e}");
    assert!(c.jobs.is_empty());
    assert!(actions(&mut c).is_empty());
}

#[test]
fn cancel_pending_and_running() {
    let mut c = core(1, 1, 0);
    let run = c.submit(T0, SubmitRequest::new(&spec(cmd()), 7)).unwrap().id;
    let pend = c.submit(T0, SubmitRequest::new(&spec(cmd()), 7)).unwrap().id;
    actions(&mut c);
    assert_eq!(c.cancel(T0 + 1.0, pend, 8, false, "x").unwrap_err().0, crate::message::errno::EPERM);
    c.cancel(T0 + 1.0, pend, 7, false, "user").unwrap();
    assert_eq!(c.jobs[&pend].state, JobState::Inactive);
    assert_eq!(c.jobs[&pend].result(), Some("CANCELED"));
    assert!(spawns(&actions(&mut c)).is_empty(), "a canceled pending job never starts");

    c.cancel(T0 + 2.0, run, 0, true, "owner").unwrap();
    assert_eq!(signals(&actions(&mut c)), vec![(vec![0], crate::signal::SIGTERM)]);
    assert_eq!(c.next_deadline(), Some(T0 + 2.0 + DEFAULT_KILL_TIMEOUT));
    c.handle_timeout(T0 + 2.0 + DEFAULT_KILL_TIMEOUT);
    assert_eq!(signals(&actions(&mut c)), vec![(vec![0], crate::signal::SIGKILL)]);
    exit_shell(&mut c, T0 + 8.0, run, 0, 9);
    assert_eq!(c.jobs[&run].result(), Some("CANCELED"));
    assert_eq!(c.jobs[&run].exit_code(), Some(137));
    assert!(c.cancel(T0 + 9.0, run, 0, true, "again").is_err(), "inactive jobs cannot be canceled");
}

/// `-o kill-timeout=1s` brings SIGKILL sooner after SIGTERM, `30s` later (up to `exec.kill-timeout-max`, 60 s by
/// default); a longer one, or one that is not a duration, is refused at submit naming the option and the bound.
#[test]
fn a_job_chooses_its_kill_timeout_up_to_the_admins_bound() {
    let mut c = core(2, 1, 0);
    let short = c.submit(T0, SubmitRequest::new(&spec(cmd().shell_option("kill-timeout", json!("1s"))), 0)).unwrap().id;
    let long = c.submit(T0, SubmitRequest::new(&spec(cmd().shell_option("kill-timeout", json!("30s"))), 0)).unwrap().id;
    actions(&mut c);
    c.cancel(T0 + 1.0, short, 0, true, "test").unwrap();
    assert_eq!(c.next_deadline(), Some(T0 + 2.0));
    c.handle_timeout(T0 + 2.0);
    assert_eq!(signals(&actions(&mut c)), vec![(vec![0], crate::signal::SIGTERM), (vec![0], crate::signal::SIGKILL)]);
    c.cancel(T0 + 3.0, long, 0, true, "test").unwrap();
    assert_eq!(c.next_deadline(), Some(T0 + 3.0 + 30.0));
    let e = c
        .submit(T0, SubmitRequest::new(&spec(cmd().shell_option("kill-timeout", json!("10m"))), 0))
        .unwrap_err()
        .to_string();
    assert_eq!(e, "attributes.system.shell.options.kill-timeout: 10m is more than this instance allows, 1m (exec.kill-timeout-max)");
    let e = c
        .submit(T0, SubmitRequest::new(&spec(cmd().shell_option("kill-timeout", json!("soon"))), 0))
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("attributes.system.shell.options.kill-timeout: "), "{e}");
    // The instance's own is always allowed, even above the bound.
    c.kill_timeout = 120.0;
    assert!(c.submit(T0, SubmitRequest::new(&spec(cmd().shell_option("kill-timeout", json!("2m"))), 0)).is_ok());
}

#[test]
fn time_limit_and_exit_timeout() {
    let mut c = core(2, 2, 0);
    let id = c.submit(T0, SubmitRequest::new(&spec(cmd().duration(10.0)), 0)).unwrap().id;
    actions(&mut c);
    assert_eq!(c.next_deadline(), Some(T0 + 10.0));
    c.handle_timeout(T0 + 9.999);
    assert!(c.jobs[&id].fatal.is_none());
    c.handle_timeout(T0 + 10.0);
    assert_eq!(c.jobs[&id].fatal.as_ref().map(|e| e.kind.as_str()), Some("timelimit"));
    assert_eq!(signals(&actions(&mut c)).len(), 1);

    let id2 = c
        .submit(T0, SubmitRequest::new(&spec(cmd().nnodes(1).ntasks(2).shell_option("exit-timeout", json!("2s"))), 0))
        .unwrap()
        .id;
    actions(&mut c);
    let rank = c.jobs[&id2].shells.keys().next().copied().expect("allocated");
    c.shell_spawned(T0, id2, rank, Ok(()));
    c.task_exit(T0 + 1.0, id2, 0, 0);
    assert_eq!(c.next_deadline().map(|d| (d * 1000.0).round() / 1000.0), Some(T0 + 3.0));
    c.handle_timeout(T0 + 3.0);
    let e = c.jobs[&id2].fatal.clone().unwrap();
    assert!(e.note.contains("exit-timeout"), "{e:?}");

    let zero = c.submit(T0, SubmitRequest::new(&spec(cmd().shell_option("exit-timeout", json!("0"))), 0)).unwrap().id;
    assert_eq!(c.jobs[&zero].exit_timeout, None, "0 is none, as -t 0 is");
    let id3 = c.submit(T0, SubmitRequest::new(&spec(cmd().shell_option("exit-timeout", json!("none"))), 0)).unwrap().id;
    actions(&mut c);
    c.task_exit(T0 + 1.0, id3, 0, 0);
    c.handle_timeout(T0 + 1000.0);
    assert!(c.jobs[&id3].fatal.is_none(), "exit-timeout=none never fires");
}

/// 257 shells start over seconds on a loaded machine; the first node's tasks may be done before the last shell is
/// up. The exit-timeout counts from when every shell has started, and its exception names the ranks still running.
#[test]
fn exit_timeout_waits_for_every_shell_to_start_and_names_the_late_ranks() {
    let mut c = core(3, 1, 0);
    let id = c
        .submit(T0, SubmitRequest::new(&spec(cmd().nnodes(3).ntasks(3).shell_option("exit-timeout", json!("2s"))), 0))
        .unwrap()
        .id;
    actions(&mut c);
    c.shell_spawned(T0 + 0.1, id, 0, Ok(()));
    c.task_exit(T0 + 0.2, id, 0, 0);
    assert_eq!(c.next_deadline(), None, "no clock while two shells have not started");
    c.shell_spawned(T0 + 20.0, id, 1, Ok(()));
    c.handle_timeout(T0 + 30.0);
    assert!(c.jobs[&id].fatal.is_none(), "not late before every shell started");
    c.shell_spawned(T0 + 40.0, id, 2, Ok(()));
    assert_eq!(c.next_deadline(), Some(T0 + 42.0), "the clock starts at the last shell's start");
    exit_shell(&mut c, T0 + 40.5, id, 0, 0);
    exit_shell(&mut c, T0 + 41.0, id, 2, 0);
    c.handle_timeout(T0 + 41.999);
    assert!(c.jobs[&id].fatal.is_none());
    c.handle_timeout(T0 + 42.0);
    let e = c.jobs[&id].fatal.clone().expect("exit-timeout");
    assert!(e.note.contains("on 1 of 3 nodes after the first task exited: node1 (broker rank 1, task 1)"), "{e:?}");

    // Every shell up before the first exit: the clock starts at that exit, as before.
    let id2 = c.submit(
        T0 + 50.0,
        SubmitRequest::new(&spec(cmd().nnodes(1).ntasks(1).shell_option("exit-timeout", json!("2s"))), 0),
    );
    let id2 = id2.unwrap().id;
    exit_shell(&mut c, T0 + 50.0, id, 1, 0);
    actions(&mut c);
    let rank = c.jobs[&id2].shells.keys().next().copied().expect("allocated");
    c.shell_spawned(T0 + 51.0, id2, rank, Ok(()));
    c.task_exit(T0 + 52.0, id2, 0, 0);
    assert_eq!(c.next_deadline(), Some(T0 + 54.0));
}

#[test]
fn shell_failures_are_fatal_and_never_hang() {
    let mut c = core(2, 1, 0);
    let id = c.submit(T0, SubmitRequest::new(&spec(cmd().nnodes(2)), 0)).unwrap().id;
    actions(&mut c);
    c.shell_spawned(T0, id, 0, Ok(()));
    c.shell_spawned(T0, id, 1, Err("no such file".into()));
    assert_eq!(c.jobs[&id].fatal.as_ref().map(|e| e.kind.as_str()), Some("exec"));
    assert_eq!(signals(&actions(&mut c)), vec![(vec![0], crate::signal::SIGTERM)], "the surviving shell is killed");
    exit_shell(&mut c, T0 + 1.0, id, 0, 15);
    assert_eq!(c.jobs[&id].state, JobState::Inactive);

    // A shell that dies without writing its report.
    let id = c.submit(T0, SubmitRequest::new(&spec(cmd().nnodes(2)), 0)).unwrap().id;
    actions(&mut c);
    c.shell_exit(
        T0 + 1.0,
        ShellExit { id: id.0, rank: 1, report: None, shell_status: 11, ended: None, unkillable: vec![] },
    );
    let e = c.jobs[&id].fatal.clone().unwrap();
    assert!(e.note.contains("rank 1") && e.note.contains("without reporting"), "{e:?}");
    exit_shell(&mut c, T0 + 2.0, id, 0, 15);
    assert_eq!(c.jobs[&id].state, JobState::Inactive);
}

#[test]
fn lost_rank_fails_its_jobs_and_leaves_the_pool() {
    let mut c = core(3, 1, 0);
    let id = c.submit(T0, SubmitRequest::new(&spec(cmd().nnodes(2)), 0)).unwrap().id;
    let other = c.submit(T0, SubmitRequest::new(&spec(cmd().nnodes(1)), 0)).unwrap().id;
    actions(&mut c);
    c.ranks_lost(T0 + 1.0, &IdSet::from_iter([1]));
    assert_eq!(c.jobs[&id].fatal.as_ref().map(|e| e.kind.as_str()), Some("node-failure"));
    assert!(c.jobs[&other].fatal.is_none(), "jobs elsewhere are untouched");
    exit_shell(&mut c, T0 + 2.0, id, 0, 15);
    assert_eq!(c.jobs[&id].state, JobState::Inactive, "no hang waiting for the lost shell");
    // Its exit code says a node was lost, not the 143 of the survivors its tasks were killed on.
    assert_eq!(c.jobs[&id].exit_code(), Some(crate::shellproto::JOB_EXIT_NODE_LOST));
    assert!(!c.pool.ranks[&1].up);
    let id3 = c.submit(T0 + 3.0, SubmitRequest::new(&spec(cmd().nnodes(1)), 0)).unwrap().id;
    let s = spawns(&actions(&mut c));
    assert_eq!(s.iter().map(|x| x.1).collect::<Vec<_>>(), vec![0], "lost rank 1 gets no new work");
    let _ = id3;
}

/// Jobs still running when the instance is shut down say so; the loss of their brokers and shells that follows
/// does not change that verdict; pending jobs are left queued.
#[test]
fn an_instance_shutdown_ends_running_jobs_saying_so() {
    let mut c = core(2, 1, 0);
    let running = c.submit(T0, SubmitRequest::new(&spec(cmd().nnodes(2)), 0)).unwrap().id;
    let pending = c.submit(T0, SubmitRequest::new(&spec(cmd().nnodes(2)), 0)).unwrap().id;
    actions(&mut c);
    assert_eq!(c.jobs[&running].state, JobState::Run);
    c.instance_shutdown(T0 + 1.0, "shutdown requested");
    c.ranks_lost(T0 + 2.0, &IdSet::from_iter([1]));
    exit_shell(&mut c, T0 + 2.0, running, 0, 9);
    let j = &c.jobs[&running];
    let e = j.fatal.as_ref().expect("a fatal exception");
    assert_eq!((e.kind.as_str(), e.severity), (SHUTDOWN_EXCEPTION, 0));
    assert_eq!(e.note, "the instance was shut down (shutdown requested)");
    assert_eq!(j.state, JobState::Inactive);
    assert!(c.jobs[&pending].fatal.is_none() && c.jobs[&pending].state.is_active(), "pending: left queued");
}

/// Shells that did not report before the instance stopped (killed with it) leave their job INACTIVE with its
/// `shutdown` exception, not in CLEANUP for a later start to re-attach and fail as if its nodes were lost; a job
/// that ended on its own, and a pending one, are left as they are.
#[test]
fn jobs_whose_shells_never_reported_are_finished_when_the_instance_stops() {
    let mut c = core(3, 1, 0);
    let silent = c.submit(T0, SubmitRequest::new(&spec(cmd().nnodes(2)), 0)).unwrap().id;
    let pending = c.submit(T0, SubmitRequest::new(&spec(cmd().nnodes(3)), 0)).unwrap().id;
    actions(&mut c);
    c.instance_shutdown(T0 + 1.0, "shutdown requested");
    exit_shell(&mut c, T0 + 1.5, silent, 0, 15);
    assert_eq!(c.jobs[&silent].state, JobState::Cleanup, "one shell of two reported");
    c.instance_stopped(T0 + 2.0);
    let j = &c.jobs[&silent];
    assert_eq!(j.state, JobState::Inactive);
    assert_eq!(j.fatal.as_ref().map(|e| e.kind.as_str()), Some(SHUTDOWN_EXCEPTION));
    let names: Vec<&str> = j.eventlog.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names.iter().filter(|n| **n == "exception").count(), 1, "no second exception: {names:?}");
    assert!(names.ends_with(&["finish", "release", "free", "clean"]), "{names:?}");
    assert!(c.jobs[&pending].state == JobState::Sched && c.jobs[&pending].fatal.is_none(), "pending: left queued");
    assert!(spawns(&actions(&mut c)).is_empty(), "nothing started on brokers that are stopping");
    assert_eq!(c.pool.free_cores_now(), 3, "the silent job's cores are free again");
}

#[test]
fn drain_blocks_new_work_until_undrain() {
    let mut c = core(2, 1, 0);
    c.drain(T0, &IdSet::from_iter([1]), "maintenance", DrainMode::Refuse).unwrap();
    assert!(c.drain(T0, &IdSet::from_iter([5]), "x", DrainMode::Refuse).is_err());
    let id = c.submit(T0, SubmitRequest::new(&spec(cmd().nnodes(2)), 0)).unwrap().id;
    assert_eq!(c.jobs[&id].state, JobState::Sched);
    assert!(c.undrain(T0, &IdSet::from_iter([0])).is_err(), "rank 0 is not drained");
    c.undrain(T0 + 1.0, &IdSet::from_iter([1])).unwrap();
    assert_eq!(c.jobs[&id].state, JobState::Run);
    let names: Vec<_> = c.resource_eventlog.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names.iter().filter(|n| **n == "online").count(), 2);
    assert!(names.contains(&"drain") && names.contains(&"undrain"));
}

#[test]
fn a_rank_drained_already_is_refused_unless_forced_or_updated() {
    let mut c = core(3, 1, 0);
    c.drain(T0, &IdSet::from_iter([1]), "bad fan", DrainMode::Refuse).unwrap();
    let e = c.drain(T0 + 1.0, &IdSet::from_iter([1, 2]), "psu", DrainMode::Refuse).unwrap_err();
    assert!(e.contains("1 (bad fan)") && e.contains("--force"), "{e}");
    let reason = |c: &JobCore, r: u32| c.pool.ranks[&r].drained.clone();
    assert_eq!((reason(&c, 1), reason(&c, 2)), (Some("bad fan".into()), None), "a refusal changes nothing");
    c.drain(T0 + 2.0, &IdSet::from_iter([1, 2]), "psu", DrainMode::Update).unwrap();
    assert_eq!((reason(&c, 1), reason(&c, 2)), (Some("bad fan".into()), Some("psu".into())));
    assert_eq!(c.resource_eventlog.last().unwrap().context["idset"], "2", "the event names what it drained");
    c.drain(T0 + 3.0, &IdSet::from_iter([1]), "fan replaced, psu now", DrainMode::Force).unwrap();
    assert_eq!(reason(&c, 1), Some("fan replaced, psu now".into()));
    let n = c.resource_eventlog.len();
    c.drain(T0 + 4.0, &IdSet::from_iter([1, 2]), "x", DrainMode::Update).unwrap();
    assert_eq!(c.resource_eventlog.len(), n, "nothing new to drain: no event");
}

/// A health check drains a node and undrains only its own drain: an admin's drain keeps its reason through the
/// check's failures and passes, and a drain by the check survives as a reason the admin sees.
#[test]
fn a_health_check_undoes_only_its_own_drain() {
    let mut c = core(3, 1, 0);
    let reason = |c: &JobCore, r: u32| c.pool.ranks[&r].drained.clone();
    let hc = |s: &str| format!("{}{s}", crate::health::REASON_PREFIX);
    assert_eq!(c.health_drain(T0, 1, &hc("/tmp full")), Ok(true));
    assert_eq!(reason(&c, 1), Some(hc("/tmp full")));
    assert_eq!(c.health_drain(T0 + 1.0, 1, &hc("/tmp full")), Ok(false), "same reason: no new event");
    assert_eq!(c.health_drain(T0 + 2.0, 1, &hc("no /scratch")), Ok(true), "its own drain gets the new reason");
    assert_eq!(reason(&c, 1), Some(hc("no /scratch")));
    assert_eq!(c.health_undrain(T0 + 3.0, 1), Ok(true));
    assert_eq!(reason(&c, 1), None);
    assert_eq!(c.health_undrain(T0 + 3.0, 1), Ok(false), "not drained: nothing to do");
    // The admin's drain: the check neither replaces its reason nor undoes it.
    c.drain(T0 + 4.0, &IdSet::from_iter([2]), "bad fan", DrainMode::Refuse).unwrap();
    assert_eq!(c.health_drain(T0 + 5.0, 2, &hc("/tmp full")), Ok(false));
    assert_eq!(c.health_undrain(T0 + 6.0, 2), Ok(false));
    assert_eq!(reason(&c, 2), Some("bad fan".into()));
    // The admin's drain over the check's (forced) is the admin's from then on.
    c.health_drain(T0 + 7.0, 0, &hc("/tmp full")).unwrap();
    c.drain(T0 + 8.0, &IdSet::from_iter([0]), "replace disk", DrainMode::Force).unwrap();
    assert_eq!(c.health_undrain(T0 + 9.0, 0), Ok(false));
    assert_eq!(reason(&c, 0), Some("replace disk".into()));
    assert!(c.health_drain(T0, 7, &hc("x")).unwrap_err().contains("not in this instance"));
}

#[test]
fn tasks_spread_evenly_over_requested_nodes() {
    let mut c = core(4, 2, 0);
    c.submit(T0, SubmitRequest::new(&spec(cmd().nnodes(3).ntasks(4)), 0)).unwrap();
    let s = spawns(&actions(&mut c));
    assert_eq!(
        s.iter().map(|x| (x.1, x.2.first_task, x.2.local_tasks)).collect::<Vec<_>>(),
        vec![(0, 0, 2), (1, 2, 1), (2, 3, 1)]
    );
    assert_eq!(s[0].2.taskmap, json!({"version": 1, "map": [[0, 1, 2, 1], [1, 2, 1, 1]]}));
}

/// `--taskmap=cyclic`: each shell learns its task ranks (listed, not a run), the start event and `info` carry the
/// map, the per-node counts stay the scheduler's.
#[test]
fn cyclic_taskmap_lists_each_nodes_ranks() {
    use crate::taskmap::Scheme;
    let mut c = core(2, 4, 0);
    let id =
        c.submit(T0, SubmitRequest::new(&spec(cmd().nnodes(2).ntasks(5).taskmap(Scheme::Cyclic(1))), 0)).unwrap().id;
    let s = spawns(&actions(&mut c));
    let got: Vec<_> = s.iter().map(|x| (x.1, x.2.ntasks, x.2.local_tasks, x.2.task_ranks())).collect();
    assert_eq!(got, vec![(0, 5, 3, vec![0, 2, 4]), (1, 5, 2, vec![1, 3])]);
    assert!(s.iter().all(|x| x.2.check().is_ok() && x.2.tasks.is_some()));
    let map = json!({"version": 1, "map": [[0, 2, 1, 2], [0, 1, 1, 1]]});
    assert_eq!(s[0].2.taskmap, map);
    for r in 0..2 {
        c.shell_spawned(T0 + 1.0, id, r, Ok(()));
    }
    let start = c.jobs[&id].eventlog.iter().find(|e| e.name == "start").expect("start").clone();
    assert_eq!(start.context.get("taskmap"), Some(&map));
    assert_eq!(c.jobs[&id].info()["taskmap"], map);
    // Block jobs keep the plain run of ranks (no list).
    c.submit(T0, SubmitRequest::new(&spec(cmd().nnodes(1).ntasks(2)), 0)).unwrap();
    let s = spawns(&actions(&mut c));
    assert!(s.iter().all(|x| x.2.tasks.is_none()), "{:?}", s[0].2.tasks);
}

/// A hostfile naming a host the instance lacks, and a manual map of the wrong size, are refused at submit naming
/// the option; a valid hostfile runs on its hosts, task i on line i's.
#[test]
fn impossible_taskmaps_are_refused_at_submit() {
    use crate::taskmap::{Scheme, Taskmap};
    let mut c = core(3, 2, 0);
    let hf = |h: &[&str]| Scheme::Hostfile { path: "f".into(), hosts: h.iter().map(|s| s.to_string()).collect() };
    let e = c
        .submit(T0, SubmitRequest::new(&spec(cmd().nnodes(2).ntasks(2).taskmap(hf(&["node1", "node9"]))), 0))
        .unwrap_err();
    assert!(e.to_string().contains("taskmap: the hostfile names node9, not a node of this instance"), "{e}");
    let m = Scheme::Manual(Taskmap::decode(&json!([[0, 3, 1, 1]])).unwrap());
    let e = c.submit(T0, SubmitRequest::new(&spec(cmd().nnodes(2).ntasks(3).taskmap(m)), 0)).unwrap_err();
    assert!(e.to_string().contains("taskmap: got 3 nodes, expected 2"), "{e}");
    let id = c
        .submit(T0, SubmitRequest::new(&spec(cmd().nnodes(2).ntasks(3).taskmap(hf(&["node2", "node1"]))), 0))
        .unwrap()
        .id;
    let s = spawns(&actions(&mut c));
    let got: Vec<_> = s.iter().map(|x| (x.1, x.2.task_ranks())).collect();
    assert_eq!(got, vec![(1, vec![1]), (2, vec![0, 2])], "job {id}: on node1 and node2 only");
}

/// `-N MIN-MAX`: the job takes what is free up to MAX, starting as soon as MIN are; its tasks (one per node) follow.
#[test]
fn node_range_takes_what_is_free() {
    let mut c = core(3, 1, 0);
    let all = c.submit(T0, SubmitRequest::new(&spec(cmd().nnodes_range(2, 3)), 0)).unwrap().id;
    let s = spawns(&actions(&mut c));
    assert_eq!(
        s.iter().map(|x| (x.1, x.2.ntasks, x.2.local_tasks)).collect::<Vec<_>>(),
        vec![(0, 3, 1), (1, 3, 1), (2, 3, 1)]
    );
    for r in 0..3 {
        exit_shell(&mut c, T0, all, r, 0);
    }
    let _ = actions(&mut c);
    let busy = c.submit(T0, SubmitRequest::new(&spec(cmd().nnodes(1)), 0)).unwrap().id;
    let _ = actions(&mut c);
    let id = c.submit(T0, SubmitRequest::new(&spec(cmd().nnodes_range(2, 3)), 0)).unwrap().id;
    let s = spawns(&actions(&mut c));
    assert_eq!(s.iter().map(|x| (x.1, x.2.ntasks)).collect::<Vec<_>>(), vec![(1, 2), (2, 2)]);
    assert_eq!((c.jobs[&id].info()["nnodes"].clone(), c.jobs[&id].info()["ntasks"].clone()), (json!(2), json!(2)));
    assert_eq!(c.jobs[&busy].state, JobState::Run);
    let e = c.submit(T0, SubmitRequest::new(&spec(cmd().nnodes_range(4, 5)), 0)).unwrap_err().to_string();
    assert!(e.contains("requested 4 nodes but this instance has 3"), "{e}");
}

/// `-N 2-3 -n 6` on nodes of 2 cores: 2 nodes cannot hold 3 tasks each, 3 nodes hold 2 each, so it takes 3
/// (Slurm's rule: the largest count of the range that fits), and fewer nodes when fewer are free and large enough.
#[test]
fn node_range_with_a_task_total_takes_the_largest_count_that_fits() {
    let mut c = core(3, 2, 0);
    let id = c
        .submit(T0, SubmitRequest::new(&spec(cmd().nnodes_range(2, 3).ntasks(6)), 0))
        .expect("3 nodes of 2 cores hold it")
        .id;
    let s = spawns(&actions(&mut c));
    assert_eq!(
        s.iter().map(|x| (x.1, x.2.ntasks, x.2.local_tasks)).collect::<Vec<_>>(),
        vec![(0, 6, 2), (1, 6, 2), (2, 6, 2)]
    );
    assert_eq!(c.jobs[&id].alloc.iter().map(|a| a.slots).collect::<Vec<_>>(), vec![2, 2, 2]);
    for r in 0..3 {
        exit_shell(&mut c, T0, id, r, 0);
    }
    let _ = actions(&mut c);
    // Nodes of 4 cores, one busy: 2 nodes of 3 tasks each now rather than waiting for the third.
    let mut c = core(3, 4, 0);
    let busy = c.submit(T0, SubmitRequest::new(&spec(cmd().nnodes(1).ntasks(4)), 0)).unwrap().id;
    let _ = actions(&mut c);
    let id = c.submit(T0, SubmitRequest::new(&spec(cmd().nnodes_range(2, 3).ntasks(6)), 0)).unwrap().id;
    let s = spawns(&actions(&mut c));
    assert_eq!(s.iter().map(|x| (x.1, x.2.local_tasks)).collect::<Vec<_>>(), vec![(1, 3), (2, 3)]);
    assert_eq!(c.jobs[&busy].state, JobState::Run);
    assert_eq!(c.jobs[&id].info()["nnodes"], json!(2));
    // Never: neither 2 nodes of 4 tasks nor 3 of 3 fit nodes of 2 cores; said for both ends of the range.
    let mut c = core(3, 2, 0);
    let e = c.submit(T0, SubmitRequest::new(&spec(cmd().nnodes_range(2, 3).ntasks(8)), 0)).unwrap_err().to_string();
    assert_eq!(
        e,
        "unsatisfiable request: requested 8 tasks on 2-3 nodes but no node count in that range fits this instance: 3 nodes would need \
         3 cores each (none has that); 2 nodes would need 4 cores each (none has that)"
    );
    // It waits while only 2 nodes of 2 cores are free, saying what each end of the range needs.
    let busy = c.submit(T0, SubmitRequest::new(&spec(cmd().nnodes(1).ntasks(1)), 0)).unwrap().id;
    let _ = actions(&mut c);
    let id = c.submit(T0, SubmitRequest::new(&spec(cmd().nnodes_range(2, 3).ntasks(6)), 0)).unwrap().id;
    assert_eq!(c.jobs[&id].state, JobState::Sched);
    let why = c.pending_reason(id).unwrap();
    assert!(
        why.starts_with("resources: needs 2-3 nodes for 6 tasks: 3 with 2 cores free each, or 2 with 3 cores free each; 2 can take 2 cores now (1 busy)"),
        "{why}"
    );
    exit_shell(&mut c, T0 + 1.0, busy, 0, 0);
    assert_eq!(c.jobs[&id].state, JobState::Run);
    assert_eq!(c.jobs[&id].alloc.len(), 3);
}

/// A job that waits for the node it names (`-w`) does not hold back a job of the same shape that may run
/// elsewhere: jobs of one shape but other constraints are not alike to the scheduling pass.
#[test]
fn a_constrained_job_waiting_does_not_hold_back_an_unconstrained_one() {
    let mut c = core(2, 1, 0);
    let busy0 = c.submit(T0, SubmitRequest::new(&spec(cmd().nnodes(1)), 0)).unwrap().id;
    let busy1 = c.submit(T0, SubmitRequest::new(&spec(cmd().nnodes(1)), 0)).unwrap().id;
    let _ = actions(&mut c);
    assert_eq!((c.jobs[&busy0].alloc[0].rank, c.jobs[&busy1].alloc[0].rank), (0, 1));
    let on0 = crate::constraint::Constraint::Ranks(IdSet::from_iter([0]));
    let waits = c.submit(T0, SubmitRequest::new(&spec(cmd().nnodes(1).constraint(Some(on0))), 0)).unwrap().id;
    let free = c.submit(T0, SubmitRequest::new(&spec(cmd().nnodes(1)), 0)).unwrap().id;
    // Rank 1 comes free: one pass looks at both jobs, the constrained one first.
    exit_shell(&mut c, T0 + 1.0, busy1, 1, 0);
    assert_eq!(c.jobs[&waits].state, JobState::Sched);
    assert_eq!(c.jobs[&free].state, JobState::Run, "rank 1 is free and the job may run there");
}

/// The pending reason of a job limited to some nodes counts those nodes, not the whole instance.
#[test]
fn a_pending_reason_counts_the_nodes_the_job_may_use() {
    let mut c = core(4, 1, 0);
    c.ranks_lost(T0, &IdSet::from_iter([2, 3]));
    let busy = c.submit(T0, SubmitRequest::new(&spec(cmd().nnodes(1)), 0)).unwrap().id;
    let _ = actions(&mut c);
    assert_eq!(c.jobs[&busy].alloc[0].rank, 0);
    let on01 = crate::constraint::Constraint::Ranks(IdSet::from_iter([0, 1]));
    let id = c.submit(T0, SubmitRequest::new(&spec(cmd().nnodes(2).constraint(Some(on01))), 0)).unwrap().id;
    let why = c.pending_reason(id).unwrap();
    assert_eq!(
        why, "resources: needs 2 nodes with 1 core free, 1 can take it now (1 busy, 2 outside its node selection)",
        "ranks 2-3 are not its, and said so (issue 36, trial item 4f)"
    );
}

#[test]
fn taskmap_blocks() {
    assert_eq!(taskmap(&[2, 2, 2, 2]), json!({"version": 1, "map": [[0, 4, 2, 1]]}));
    assert_eq!(taskmap(&[3, 3, 2]), json!({"version": 1, "map": [[0, 2, 3, 1], [2, 1, 2, 1]]}));
    assert_eq!(taskmap(&[]), json!({"version": 1, "map": []}));
}

/// 4096 ranks, 1000 jobs of random shapes in virtual time: every job ends, nothing leaks, FCFS order holds.
#[test]
fn many_jobs_on_thousands_of_ranks() {
    let mut c = core(4096, 4, 0);
    c.config.policy = SchedPolicy::Fcfs;
    let mut rng: u64 = 0x9e3779b97f4a7c15;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut t = T0;
    let mut ids = Vec::new();
    for _ in 0..1000 {
        let n = (next() % 256 + 1) as u32;
        ids.push(c.submit(t, SubmitRequest::new(&spec(cmd().nnodes(n).ntasks(n * 2)), 0)).unwrap().id);
    }
    let mut running: Vec<(JobId, Vec<u32>)> = Vec::new();
    let mut started_order = Vec::new();
    for _ in 0..100_000 {
        for a in actions(&mut c) {
            if let Action::SpawnShell { id, rank, .. } = a {
                match running.iter_mut().find(|x| x.0 == id) {
                    Some(x) => x.1.push(rank),
                    None => {
                        started_order.push(id);
                        running.push((id, vec![rank]));
                    }
                }
            }
        }
        if running.is_empty() {
            break;
        }
        t += 1.0;
        let (id, ranks) = running.remove((next() % running.len() as u64) as usize);
        for r in ranks {
            exit_shell(&mut c, t, id, r, 0);
        }
    }
    assert!(c.jobs.values().all(|j| j.state == JobState::Inactive && j.result() == Some("COMPLETED")));
    assert_eq!(started_order, ids, "FCFS: jobs start in submission order");
    assert!(c.pool.ranks.values().all(|p| p.alloc_cores.is_empty()));
}

pub(super) fn make_instance(c: &mut JobCore, id: JobId, critical_broker_ranks: &str) {
    let j = c.jobs.get_mut(&id).unwrap();
    j.instance =
        Some(json!({"uri": "local:///x", "critical_ranks": "0", "critical_broker_ranks": critical_broker_ranks}));
}

/// A nested instance job on all `nranks` nodes (2 cores each), its shells started, `critical_broker_ranks`
/// reported.
fn running_instance(nranks: u32, critical_broker_ranks: &str) -> (JobCore, JobId) {
    let mut c = core(nranks, 2, 0);
    let id = c.submit(T0, SubmitRequest::new(&spec(cmd().nnodes(nranks).exclusive(true)), 0)).unwrap().id;
    actions(&mut c);
    for r in 0..nranks {
        c.shell_spawned(T0, id, r, Ok(()));
    }
    make_instance(&mut c, id, critical_broker_ranks);
    (c, id)
}

#[test]
fn nested_instance_survives_a_non_critical_node() {
    let (mut c, id) = running_instance(5, "0");
    c.ranks_lost(T0 + 1.0, &IdSet::from_iter([3]));
    let j = &c.jobs[&id];
    assert_eq!(j.state, JobState::Run, "non-critical loss keeps the job running");
    assert!(j.fatal.is_none());
    let exc: Vec<_> = j.eventlog.iter().filter(|e| e.name == "exception").collect();
    assert_eq!(exc.len(), 1);
    assert_eq!(exc[0].context["type"], json!("node-failure"));
    assert_eq!(exc[0].context["severity"], json!(2));
    assert!(j
        .eventlog
        .iter()
        .any(|e| e.name == "release" && e.context["final"] == json!(false) && e.context["ranks"] == json!("3")));
    assert!(c.pool.ranks[&3].alloc_cores.is_empty(), "the lost node's resources are released early");
    let a = actions(&mut c);
    assert!(
        a.iter().any(|x| matches!(x, Action::NotifyShell { rank: 0, lost_shells, .. } if lost_shells == &vec![3])),
        "{a:?}"
    );
    assert!(signals(&a).is_empty(), "nothing is killed");
    for r in [0, 1, 2, 4] {
        exit_shell(&mut c, T0 + 2.0, id, r, 0);
    }
    let j = &c.jobs[&id];
    assert_eq!(j.state, JobState::Inactive, "completes without the lost shell");
    assert_eq!(j.result(), Some("COMPLETED"));
    assert_eq!(j.exit_code(), Some(0));
}

/// A nested instance's broker on a non-critical rank killed while its node lives (the shell reports the task
/// killed): a non-fatal exception, and the job's exit code is the instance's, not 137.
#[test]
fn nested_instance_survives_a_non_critical_broker_killed() {
    let (mut c, id) = running_instance(3, "0");
    let killed = 9; // wait status of a process killed by SIGKILL
    exit_shell(&mut c, T0 + 1.0, id, 1, killed);
    let j = &c.jobs[&id];
    assert_eq!(j.state, JobState::Run, "the instance goes on");
    assert!(j.fatal.is_none());
    let exc: Vec<_> = j.eventlog.iter().filter(|e| e.name == "exception").collect();
    assert_eq!(exc.len(), 1);
    assert_eq!((exc[0].context["type"].as_str(), exc[0].context["severity"].as_u64()), (Some("exec"), Some(2)));
    let note = exc[0].context["note"].as_str().unwrap_or_default();
    assert!(note.contains("(rank 1)") && note.contains("SIGKILL") && note.contains("continues"), "{note}");
    // The instance lost that rank for good: its node goes back to this instance's pool, and a job waiting for a
    // node runs there at once (found by a fresh-user trial: the node stayed allocated to the batch job).
    assert!(j
        .eventlog
        .iter()
        .any(|e| e.name == "release" && e.context["final"] == json!(false) && e.context["ranks"] == "1"));
    assert!(c.pool.ranks[&1].alloc_cores.is_empty(), "rank 1's cores are free again");
    let waiting = c.submit(T0 + 1.5, SubmitRequest::new(&spec(cmd().nnodes(1)), 0)).unwrap().id;
    assert_eq!(c.jobs[&waiting].state, JobState::Run, "runs on the node the instance gave back");
    assert!(signals(&actions(&mut c)).is_empty(), "nothing is killed");
    exit_shell(&mut c, T0 + 1.8, waiting, 1, 0);
    for r in [0, 2] {
        exit_shell(&mut c, T0 + 2.0, id, r, 0);
    }
    let j = &c.jobs[&id];
    assert_eq!(j.state, JobState::Inactive);
    assert_eq!(j.exit_code(), Some(0), "the instance's exit code");

    // The same on a critical rank is the job's failure; so is any broker's exit once the critical ones ended.
    let (mut c, id) = running_instance(3, "0");
    exit_shell(&mut c, T0 + 1.0, id, 0, status_exited(3));
    exit_shell(&mut c, T0 + 1.0, id, 1, killed);
    exit_shell(&mut c, T0 + 1.0, id, 2, 0);
    let j = &c.jobs[&id];
    assert!(j.eventlog.iter().all(|e| e.name != "exception"), "an instance ending is not an exception");
    assert_eq!(j.exit_code(), Some(137));
}

/// A critical broker of a nested instance killed on a live node ends the job, as the loss of its node would; the
/// brokers it cut off (exit code 69, reported before it: its shell drains output first) add no exception.
#[test]
fn nested_instance_ends_when_a_critical_broker_is_killed() {
    use crate::shellproto::BROKER_EXIT_CUT_OFF;
    let (mut c, id) = running_instance(4, "0");
    for r in 1..4 {
        exit_shell(&mut c, T0 + 1.0, id, r, status_exited(BROKER_EXIT_CUT_OFF));
    }
    let j = &c.jobs[&id];
    assert!(j.eventlog.iter().all(|e| e.name != "exception"), "a cut-off broker's verdict waits for its cause");
    assert_eq!(c.next_deadline(), Some(T0 + 1.0 + super::nested::CUT_OFF_GRACE));
    exit_shell(&mut c, T0 + 2.0, id, 0, 9);
    let j = &c.jobs[&id];
    let exc: Vec<_> = j.eventlog.iter().filter(|e| e.name == "exception").collect();
    assert_eq!(exc.len(), 1, "one failure, one exception: {exc:?}");
    assert_eq!(exc[0].context["severity"], json!(0));
    let note = exc[0].context["note"].as_str().unwrap_or_default();
    assert_eq!(
        note,
        "the job's broker on node0 (rank 0), where rank 0 of the job's instance ran, ended (killed by SIGKILL); \
         the job's instance cannot go on without it"
    );
    assert_eq!(j.state, JobState::Inactive);
    assert_eq!(j.exit_code(), Some(137));

    // A router of an instance that does not re-parent is critical: killed, the job is killed at once.
    let (mut c, id) = running_instance(4, "0-1");
    actions(&mut c);
    exit_shell(&mut c, T0 + 1.0, id, 1, 9);
    let e = c.jobs[&id].fatal.clone().expect("fatal");
    assert!(e.note.contains("on node1 (rank 1), where rank 1 of the job's instance ran"), "{e:?}");
    assert!(!e.note.contains("critical"), "{e:?}");
    assert_eq!(signals(&actions(&mut c)), vec![(vec![0, 2, 3], crate::signal::SIGTERM)]);
}

/// A broker cut off while nothing above it is reported failed (its rank 0 declared it lost): past the grace, a
/// non-critical one is a severity-2 exception and the job runs on; a critical one ends the job.
#[test]
fn a_cut_off_broker_is_judged_after_its_grace() {
    use crate::shellproto::BROKER_EXIT_CUT_OFF;
    let (mut c, id) = running_instance(4, "0");
    exit_shell(&mut c, T0 + 1.0, id, 2, status_exited(BROKER_EXIT_CUT_OFF));
    c.handle_timeout(T0 + 2.0);
    assert!(c.jobs[&id].eventlog.iter().all(|e| e.name != "exception"), "not yet");
    c.handle_timeout(T0 + 1.0 + super::nested::CUT_OFF_GRACE);
    let j = &c.jobs[&id];
    let exc: Vec<_> = j.eventlog.iter().filter(|e| e.name == "exception").collect();
    assert_eq!(exc.len(), 1, "{exc:?}");
    assert_eq!(exc[0].context["severity"], json!(2));
    assert_eq!(
        exc[0].context["note"],
        json!(
            "the job's broker on node2 (rank 2), where rank 2 of the job's instance ran, lost its way to the \
             instance's rank 0 (exit code 69); the job's instance continues without it"
        )
    );
    assert_eq!(j.state, JobState::Run);
    assert_eq!(c.next_deadline(), None, "judged once");
    for r in [0, 1, 3] {
        exit_shell(&mut c, T0 + 9.0, id, r, 0);
    }
    assert_eq!(c.jobs[&id].exit_code(), Some(0), "a cut-off broker's code is not the job's");

    let (mut c, id) = running_instance(4, "0-1");
    exit_shell(&mut c, T0 + 1.0, id, 1, status_exited(BROKER_EXIT_CUT_OFF));
    c.handle_timeout(T0 + 1.0 + super::nested::CUT_OFF_GRACE);
    let e = c.jobs[&id].fatal.clone().expect("a critical cut-off broker is fatal");
    assert!(e.note.contains("(rank 1)") && e.note.ends_with("cannot go on without it"), "{e:?}");
}

#[test]
fn losing_a_critical_rank_is_fatal() {
    let mut c = core(5, 2, 0);
    let id = c.submit(T0, SubmitRequest::new(&spec(cmd().nnodes(4).exclusive(true)), 0)).unwrap().id;
    actions(&mut c);
    make_instance(&mut c, id, "0,2");
    c.ranks_lost(T0 + 1.0, &IdSet::from_iter([2]));
    let j = &c.jobs[&id];
    let e = j.fatal.clone().expect("fatal");
    assert_eq!((e.kind.as_str(), e.severity), ("node-failure", 0));
    assert_eq!(
        e.note,
        "lost node node2 (rank 2), where rank 2 of the job's instance ran; the job's instance cannot go on without it"
    );
    assert_eq!(signals(&actions(&mut c)), vec![(vec![0, 1, 3], crate::signal::SIGTERM)], "survivors are killed");
}

/// Every message names a lost node one way, its host name and its rank in the instance that speaks, and says
/// what ran there, without "critical" (issue 36, item 4): an ordinary job's tasks; a batch job's instance rank,
/// which the notice to its leader shell speaks in (that instance's ranks). `vigil job info` lists what the job
/// lost and how many nodes it holds now; the exception's context carries `ranks` and `hosts` beside its note.
#[test]
fn lost_nodes_are_named_once_with_what_ran_there() {
    let mut c = core(6, 2, 0);
    let first = c.submit(T0, SubmitRequest::new(&spec(cmd().nnodes(1)), 0)).unwrap().id;
    let job = c
        .submit(T0, SubmitRequest::new(&spec(cmd().nnodes(2).ntasks(4).taskmap(crate::taskmap::Scheme::Cyclic(1))), 0))
        .unwrap()
        .id;
    actions(&mut c);
    assert_eq!(c.jobs[&job].alloc.iter().map(|a| a.rank).collect::<Vec<_>>(), vec![1, 2]);
    c.ranks_lost(T0 + 1.0, &IdSet::from_iter([2]));
    let e = c.jobs[&job].fatal.clone().expect("fatal");
    assert_eq!((e.kind.as_str(), e.note.as_str()), ("node-failure", "lost node node2 (rank 2), where tasks 1,3 ran"));
    let info = c.jobs[&job].info();
    assert_eq!((info["lost_ranks"].clone(), info["lost_nodelist"].clone()), (json!("2"), json!("node2")));
    assert_eq!((info["nnodes"].clone(), info["nnodes_current"].clone()), (json!(2), json!(1)));
    let exc = c.jobs[&job].eventlog.iter().rev().find(|e| e.name == "exception").unwrap().context.clone();
    assert_eq!(
        (exc["ranks"].clone(), exc["hosts"].clone(), exc["severity"].clone()),
        (json!("2"), json!("node2"), json!(0))
    );
    assert!(c.jobs[&first].info()["lost_ranks"] == json!(""), "{}", c.jobs[&first].info());

    // A batch job on ranks 3-5 (its instance's ranks 0-2) loses rank 5, its instance's rank 2.
    let batch = c.submit(T0 + 2.0, SubmitRequest::new(&spec(cmd().nnodes(3).exclusive(true)), 0)).unwrap().id;
    actions(&mut c);
    assert_eq!(c.jobs[&batch].alloc.iter().map(|a| a.rank).collect::<Vec<_>>(), vec![3, 4, 5]);
    for r in 3..6 {
        c.shell_spawned(T0 + 2.0, batch, r, Ok(()));
    }
    make_instance(&mut c, batch, "3");
    c.ranks_lost(T0 + 3.0, &IdSet::from_iter([5]));
    let j = &c.jobs[&batch];
    assert_eq!(j.state, JobState::Run);
    let exc = j.eventlog.iter().rev().find(|e| e.name == "exception").unwrap();
    assert_eq!(
        exc.context["note"],
        json!("lost node node5 (rank 5), where rank 2 of the job's instance ran; the job continues on the remaining nodes")
    );
    let note = actions(&mut c).into_iter().find_map(|a| match a {
        Action::NotifyShell { rank: 3, note, .. } => Some(note),
        _ => None,
    });
    assert_eq!(note.as_deref(), Some("this instance lost node node5 (rank 2); it continues on the remaining nodes"));
    let j = &c.jobs[&batch];
    let info = j.info();
    assert_eq!(
        (info["lost_nodelist"].clone(), info["nnodes"].clone(), info["nnodes_current"].clone()),
        (json!("node5"), json!(3), json!(2))
    );
    assert!(j.eventlog.iter().all(|e| !e
        .context
        .get("note")
        .and_then(Value::as_str)
        .unwrap_or("")
        .contains("critical")));
}

#[test]
fn torpid_ranks_get_no_new_work_until_lively() {
    let mut c = core(2, 1, 0);
    c.ranks_torpid(T0, &IdSet::from_iter([1]), true);
    let id = c.submit(T0, SubmitRequest::new(&spec(cmd().nnodes(2)), 0)).unwrap().id;
    assert_eq!(c.jobs[&id].state, JobState::Sched);
    c.ranks_torpid(T0 + 1.0, &IdSet::from_iter([1]), false);
    assert_eq!(c.jobs[&id].state, JobState::Run);
    let names: Vec<_> = c.resource_eventlog.iter().map(|e| e.name.as_str()).collect();
    assert!(names.ends_with(&["torpid", "lively"]));
}

/// A 2048-node nested instance on 4096 ranks loses 200 non-critical nodes one by one in virtual time: it keeps
/// running, every loss is one severity-2 exception and one partial release; then its rank 0 dies: fatal.
#[test]
fn large_instance_loses_many_nodes() {
    let mut c = core(4096, 4, 0);
    let id = c.submit(T0, SubmitRequest::new(&spec(cmd().nnodes(2048).exclusive(true)), 0)).unwrap().id;
    actions(&mut c);
    make_instance(&mut c, id, "0");
    let mut t = T0;
    for k in 0..200u32 {
        t += 0.01;
        c.ranks_lost(t, &IdSet::from_iter([1 + k * 7]));
        assert_eq!(c.jobs[&id].state, JobState::Run);
    }
    let j = &c.jobs[&id];
    assert_eq!(j.eventlog.iter().filter(|e| e.name == "exception").count(), 200);
    assert_eq!(j.eventlog.iter().filter(|e| e.name == "release").count(), 200);
    assert!(j.fatal.is_none());
    c.ranks_lost(t + 1.0, &IdSet::from_iter([0]));
    assert_eq!(c.jobs[&id].fatal.as_ref().map(|e| e.severity), Some(0));
}

/// Output held on rank 0 is bounded: per running job, per inactive job, and for all inactive jobs together.
#[test]
fn output_retention_is_bounded() {
    let mut c = core(1, 1, 0);
    let chunk = "x".repeat(64 * 1024);
    let mut ids = Vec::new();
    for k in 0..80 {
        let id = c.submit(T0 + k as f64, SubmitRequest::new(&spec(cmd()), 0)).unwrap().id;
        actions(&mut c);
        // 20 MiB of output: more than the 16 MiB kept while running.
        let lines: Vec<OutputLine> = (0..320).map(|_| OutputLine::text(0, "stdout", chunk.clone())).collect();
        c.output(id, Batch::Unnumbered, lines);
        assert!(c.jobs[&id].output_bytes <= OUTPUT_KEEP);
        assert!(c.jobs[&id].output_base > 0, "the oldest chunks were dropped");
        exit_shell(&mut c, T0 + k as f64 + 0.5, id, 0, 0);
        assert!(c.jobs[&id].output_bytes <= INACTIVE_OUTPUT_KEEP, "an inactive job keeps only its tail");
        ids.push(id);
    }
    let total: usize = c.jobs.values().map(|j| j.output_bytes).sum();
    assert!(total <= INACTIVE_OUTPUT_TOTAL, "{total}");
    assert_eq!(c.jobs[&ids[0]].output_bytes, 0, "the oldest job's output went first");
    assert!(c.jobs[&ids[79]].output_bytes > 0, "the newest job keeps its tail");
}

#[test]
fn pending_jobs_say_why_they_wait() {
    let mut c = core(2, 1, 0);
    c.config.policy = SchedPolicy::Fcfs;
    let run = c.submit(T0, SubmitRequest::new(&spec(cmd().nnodes(2).ntasks(2)), 7)).unwrap().id;
    let head = c.submit(T0, SubmitRequest::new(&spec(cmd()), 7)).unwrap().id;
    let behind = c.submit(T0, SubmitRequest::new(&spec(cmd()), 7)).unwrap().id;
    actions(&mut c);
    assert_eq!(c.pending_reason(run), None, "a running job waits for nothing");
    assert_eq!(
        c.pending_reason(head).as_deref(),
        Some("resources: needs 1 slot of 1 core, 0 free now"),
        "the head of the queue names what it needs"
    );
    assert_eq!(
        c.pending_reason(behind),
        Some(format!("priority: queued behind job {} (first come, first served)", head.f58()))
    );
    // The head canceled: the next one is the head now.
    c.cancel(T0 + 1.0, head, 7, false, "user").unwrap();
    assert_eq!(c.pending_reason(head), None);
    assert!(c.pending_reason(behind).unwrap().starts_with("resources: "));
}

// ------------------------------------------------------------------------------------------- hostile input

/// A jobspec of one slot level (optionally under a node level) with counts chosen by the caller, which may be
/// anything a client sends: 0, 2^31, u64::MAX.
fn counted_jobspec(nodes: Option<u64>, slots: u64, cores: u64, gpus: Option<u64>, total: Option<u64>) -> Value {
    let mut with = vec![json!({"type": "core", "count": cores})];
    if let Some(g) = gpus {
        with.push(json!({"type": "gpu", "count": g}));
    }
    let slot = json!({"type": "slot", "count": slots, "label": "task", "with": with});
    let top = match nodes {
        Some(n) => json!({"type": "node", "count": n, "with": [slot]}),
        None => slot,
    };
    let count = match total {
        Some(t) => json!({"total": t}),
        None => json!({"per_slot": 1}),
    };
    json!({"version": 1, "resources": [top],
           "tasks": [{"command": ["true"], "slot": "task", "count": count}],
           "attributes": {"system": {"duration": 0}}})
}

/// A count a client might send: small ones that fit, and the edges of every integer width.
fn hostile_count() -> impl Strategy<Value = u64> {
    prop_oneof![
        12 => 0u64..4,
        1 => Just(1 << 31),
        1 => Just(u64::from(u32::MAX)),
        1 => Just(u64::from(u32::MAX) + 1),
        1 => Just(u64::MAX),
        1 => any::<u64>(),
    ]
}

/// One input to the job core, as the broker's services would hand it over from a request.
#[derive(Debug, Clone)]
enum Input {
    /// `resource.register`: a rank (re)joins with these core and GPU counts.
    Online(u32, u32, u32),
    /// `job-manager.submit` of a jobspec with these counts.
    Submit(Option<u64>, u64, u64, Option<u64>, Option<u64>),
    /// `overlay.lost` of one rank.
    Lost(u32),
    /// `resource.drain` / `resource.undrain` of one rank.
    Drain(u32, bool),
    /// The broker started the shell of the n-th job on a rank, or failed to.
    Spawned(usize, u32, bool),
    /// `job-exec.shell-exit` for the n-th job, with a wait status.
    ShellExit(usize, u32, i32),
    /// `job-manager.cancel` / `job-manager.raise` of the n-th job with a severity.
    Raise(usize, u32),
    /// Time passes (seconds).
    Wait(u32),
}

fn input() -> impl Strategy<Value = Input> {
    prop_oneof![
        3 => (0u32..4, 0u32..5, 0u32..3).prop_map(|(r, c, g)| Input::Online(r, c, g)),
        // Requests that fit, so that jobs run and hold resources while the rest happens.
        3 => (proptest::option::of(1u64..3), 1u64..4, 1u64..3)
            .prop_map(|(n, s, c)| Input::Submit(n, s.max(n.unwrap_or(1)), c, None, None)),
        2 => (
            proptest::option::of(hostile_count()),
            hostile_count(),
            hostile_count(),
            proptest::option::of(hostile_count()),
            proptest::option::of(hostile_count())
        )
            .prop_map(|(n, s, c, g, t)| Input::Submit(n, s, c, g, t)),
        1 => (0u32..5).prop_map(Input::Lost),
        1 => (0u32..5, any::<bool>()).prop_map(|(r, d)| Input::Drain(r, d)),
        1 => (0usize..4, 0u32..5, any::<bool>()).prop_map(|(j, r, ok)| Input::Spawned(j, r, ok)),
        1 => (0usize..4, 0u32..5, any::<i32>()).prop_map(|(j, r, s)| Input::ShellExit(j, r, s)),
        1 => (0usize..4, 0u32..8).prop_map(|(j, s)| Input::Raise(j, s)),
        1 => (0u32..100).prop_map(Input::Wait),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Whatever the requests say (counts at every integer edge, ranks that re-register with fewer cores while
    /// their jobs hold more, reports about jobs and ranks that do not exist), the job core answers or refuses
    /// and never panics, and every shell it starts gets cores its rank has.
    #[test]
    fn hostile_requests_never_panic_the_job_core(inputs in proptest::collection::vec(input(), 1..40)) {
        let mut c = core(2, 4, 1);
        let mut ids: Vec<JobId> = Vec::new();
        let mut t = T0;
        for i in inputs {
            t += 0.5;
            let job = |n: usize| ids.get(n).copied().unwrap_or(JobId(n as u64));
            match i {
                Input::Online(r, cores, gpus) => {
                    c.rank_online(t, r, "node", (0..cores).collect(), (0..gpus).collect(), ("live".into(), None))
                }
                Input::Submit(n, s, cores, g, total) => {
                    if let Ok(sub) = c.submit(t, SubmitRequest::new(&counted_jobspec(n, s, cores, g, total), 1000)) {
                        ids.push(sub.id);
                    }
                }
                Input::Lost(r) => c.ranks_lost(t, &IdSet::from_iter([r])),
                Input::Drain(r, true) => { let _ = c.drain(t, &IdSet::from_iter([r]), "test", DrainMode::Force); }
                Input::Drain(r, false) => { let _ = c.undrain(t, &IdSet::from_iter([r])); }
                Input::Spawned(j, r, ok) => {
                    c.shell_spawned(t, job(j), r, if ok { Ok(()) } else { Err("no".into()) })
                }
                Input::ShellExit(j, r, status) => exit_shell(&mut c, t, job(j), r, status),
                Input::Raise(j, sev) => { c.raise(t, job(j), "test", sev, "note"); }
                Input::Wait(s) => {
                    t += f64::from(s);
                    c.handle_timeout(t);
                }
            }
            for id in &ids {
                let _ = c.pending_reason(*id);
                let _ = c.jobs[id].info();
            }
            for (_, rank, input) in spawns(&actions(&mut c)) {
                let have = &c.pool.ranks[&rank].cores;
                prop_assert!(input.cores.iter().all(|i| have.contains(*i)), "{:?} not in {have}", input.cores);
                prop_assert_eq!(input.check(), Ok(()), "the broker would refuse this shell input");
            }
            let _ = c.next_deadline();
        }
    }
}

/// A rank that re-registers with fewer cores than its running jobs hold (a broker restarted under a smaller
/// cgroup, or a hostile `resource.register`) leaves nothing free there, and scheduling goes on around it.
#[test]
fn rank_rejoining_with_fewer_cores_than_allocated() {
    let mut c = core(2, 4, 0);
    let a = c.submit(T0 + 1.0, SubmitRequest::new(&spec(cmd().nnodes(1).ntasks(4)), 1000)).unwrap().id;
    assert_eq!(c.jobs[&a].state, JobState::Run);
    let on = c.jobs[&a].alloc[0].rank;
    c.rank_online(T0 + 2.0, on, "node", (0..1).collect(), IdSet::new(), ("live".into(), None));
    let b = c.submit(T0 + 3.0, SubmitRequest::new(&spec(cmd().nnodes(1).ntasks(2)), 1000)).unwrap().id;
    assert_eq!(c.jobs[&b].state, JobState::Run);
    assert_ne!(c.jobs[&b].alloc[0].rank, on, "nothing is free on the shrunken rank");
    let _ = actions(&mut c);
}

/// The shell input a broker refuses (`rexec.spawn` checks it): tasks past the job's end, or a shell rank
/// outside the job's shells; what the job core hands out passes.
#[test]
fn shell_inputs_are_checked() {
    let mut c = core(2, 2, 0);
    c.submit(T0, SubmitRequest::new(&spec(cmd().nnodes(2).ntasks(4)), 1000)).unwrap();
    let s = spawns(&actions(&mut c));
    assert_eq!(s.len(), 2);
    for (_, _, input) in &s {
        assert_eq!(input.check(), Ok(()));
    }
    let mut bad = s[1].2.clone();
    bad.first_task = u32::MAX;
    assert!(bad.check().unwrap_err().contains("ntasks"));
    let mut bad = s[1].2.clone();
    bad.local_tasks = 3;
    assert!(bad.check().is_err(), "tasks 2+3 exceed ntasks 4");
    let mut bad = s[1].2.clone();
    bad.shell_rank = 2;
    assert!(bad.check().unwrap_err().contains("nshells"));
}

/// Standard input is held while the job may still read it, up to [`STDIN_KEEP`] bytes; a refused chunk changes
/// nothing; once the job is INACTIVE its input is dropped.
#[test]
fn stdin_is_bounded_per_job_and_dropped_when_the_job_ends() {
    use base64::Engine as _;
    let b64 = |n: usize| base64::engine::general_purpose::STANDARD.encode(vec![b'x'; n]);
    let mut c = core(1, 1, 0);
    let id = c.submit(T0, SubmitRequest::new(&spec(cmd()), 0)).unwrap().id;
    actions(&mut c);
    c.jobs.get_mut(&id).unwrap().stdin_eof = false; // submitted with `stdin`, as `vigil run` does
    assert_eq!(c.stdin(id, Some(b64(STDIN_KEEP - 10)), false), Ok(()));
    let before = (c.jobs[&id].stdin.clone(), c.jobs[&id].stdin_bytes);
    let e = c.stdin(id, Some(b64(11)), false).expect_err("past the bound");
    assert!(matches!(e, StdinError::Full { .. }), "{e}");
    assert_eq!(e.errno(), crate::message::errno::ENOSPC);
    assert_eq!((c.jobs[&id].stdin.clone(), c.jobs[&id].stdin_bytes), before, "a refused chunk changes nothing");
    assert_eq!(c.stdin(id, Some(b64(10)), false), Ok(()), "up to the bound exactly");
    assert!(matches!(c.stdin(id, Some("%%%".into()), false), Err(StdinError::NotBase64(_))));
    assert_eq!(c.stdin(JobId(id.0 + 1), None, true).map_err(|e| e.errno()), Err(crate::message::errno::ENOENT));
    exit_shell(&mut c, T0 + 1.0, id, 0, 0);
    assert_eq!(c.jobs[&id].state, JobState::Inactive);
    assert!(c.jobs[&id].stdin.is_empty() && c.jobs[&id].stdin_bytes == 0, "dropped with the job");
    assert!(matches!(c.stdin(id, Some(b64(1)), false), Err(StdinError::Closed(_))));
}

/// A job's shells ask rank 0 for standard input only when the job has some: one submitted with it is told so
/// even when it starts inside its submission, one without is not (its input is over before it starts).
#[test]
fn shells_ask_for_stdin_only_when_the_job_has_some() {
    for stdin in [true, false] {
        let mut c = core(1, 1, 0);
        c.submit(T0, SubmitRequest::new(&spec(cmd()), 0).stdin(stdin)).unwrap();
        let asks: Vec<bool> = actions(&mut c)
            .into_iter()
            .filter_map(|a| match a {
                Action::SpawnShell { input, .. } => Some(input.stdin),
                _ => None,
            })
            .collect();
        assert_eq!(asks, vec![stdin], "submitted with stdin: {stdin}");
    }
}

#[test]
fn output_batches_are_taken_once_and_in_order() {
    let mut c = core(1, 1, 0);
    let id = c.submit(T0, SubmitRequest::new(&spec(cmd()), 0)).unwrap().id;
    actions(&mut c);
    let line = |s: &str| vec![OutputLine::text(0, "stdout", s.to_string())];
    let n = |seq: u64| Batch::Numbered { rank: 0, seq };
    let got = |c: &JobCore| -> Vec<String> {
        c.jobs[&id].output.iter().map(|l| String::from_utf8_lossy(&l.bytes()).trim_end().to_string()).collect()
    };
    c.output(id, n(0), line("a"));
    // Batch 1 was lost with a router and is sent again after batch 2 went up: held until 1 comes, then both.
    c.output(id, n(2), line("c"));
    assert_eq!(got(&c), ["a"]);
    c.output(id, n(1), line("b"));
    c.output(id, n(0), line("a"));
    c.output(id, n(2), line("c"));
    assert_eq!(got(&c), ["a", "b", "c"], "each batch once, in order");
    // Not numbered (an older shell), or from a rank that runs no shell of the job: taken as it comes.
    c.output(id, Batch::Unnumbered, line("d"));
    c.output(id, Batch::Numbered { rank: 9, seq: 0 }, line("e"));
    // Batch 3 never comes: 4 waits until the shell flushes.
    c.output(id, n(4), line("g"));
    assert_eq!(got(&c), ["a", "b", "c", "d", "e"]);
    c.output(id, Batch::Flush { rank: 0 }, vec![]);
    assert_eq!(got(&c), ["a", "b", "c", "d", "e", "g"]);
    c.output(id, n(3), line("f"));
    assert_eq!(got(&c).len(), 6, "a batch that comes after its gap was given up is dropped");
}

/// What a job lost reads in rank order, as `lost_ranks` does, whichever node went first (issue 36, trial item
/// 4b: `lost_nodelist: "node[6,3]"` beside `lost_ranks: "3,6"`).
#[test]
fn lost_nodes_are_listed_in_rank_order() {
    let (mut c, id) = running_instance(6, "0");
    for r in [4, 2, 5] {
        c.ranks_lost(T0 + f64::from(r), &IdSet::from_iter([r]));
    }
    let info = c.jobs[&id].info();
    assert_eq!((info["lost_ranks"].clone(), info["lost_nodelist"].clone()), (json!("2,4-5"), json!("node[2,4-5]")));
    assert_eq!(info["nnodes_current"], json!(3));
}

/// A batch or alloc job's critical ranks are known from its jobspec (`attributes.system.instance`) before its
/// instance reports them (issue 36): a node lost while the instance starts is judged as it will be later, by the
/// instance's shape (rank 0 alone when it re-parents; rank 0 and its routers without), in the nested instance's
/// own numbering (the job's shells in rank order, here broker ranks 1-5), and the exception names the lost ranks
/// of that instance (`shell_ranks`), which its rank 0 reads to stop waiting for them.
#[test]
fn a_nested_instance_is_judged_by_its_shape_before_it_reports_its_critical_ranks() {
    let start = |shape: Value| {
        let mut c = core(6, 2, 0);
        c.drain(T0, &IdSet::from_iter([0]), "batch host elsewhere", DrainMode::Refuse).unwrap();
        let mut v = spec(cmd().nnodes(5).exclusive(true));
        v["attributes"]["system"]["instance"] = shape;
        let id = c.submit(T0, SubmitRequest::new(&v, 0)).unwrap().id;
        actions(&mut c);
        for r in 1..6 {
            c.shell_spawned(T0, id, r, Ok(()));
        }
        assert!(c.jobs[&id].instance.is_none(), "no memo yet");
        (c, id)
    };
    let last = |c: &JobCore, id: JobId| {
        c.jobs[&id].eventlog.iter().rev().find(|e| e.name == "exception").map(|e| e.context.clone())
    };
    let severity = |c: &JobCore, id: JobId| last(c, id).map(|e| e["severity"].clone());
    // Re-parenting on (the default): only the instance's rank 0 (broker rank 1) is critical.
    for lost in [2, 3, 5] {
        let (mut c, id) = start(json!({"tbon.reparent": "on"}));
        c.ranks_lost(T0 + 0.1, &IdSet::from_iter([lost]));
        assert_eq!((c.jobs[&id].state, severity(&c, id)), (JobState::Run, Some(json!(2))), "lost {lost}");
        let e = last(&c, id).unwrap();
        assert_eq!(e["shell_ranks"], json!((lost - 1).to_string()), "its rank in the job's instance");
        let note = format!(
            "lost node node{lost} (rank {lost}), where rank {} of the job's instance ran; the job continues on the \
             remaining nodes",
            lost - 1
        );
        assert_eq!(e["note"], json!(note));
    }
    let (mut c, id) = start(json!({}));
    c.ranks_lost(T0 + 0.1, &IdSet::from_iter([1]));
    assert_eq!(severity(&c, id), Some(json!(0)), "its rank 0");
    assert_eq!(
        last(&c, id).unwrap()["note"],
        json!(
            "lost node node1 (rank 1), where rank 0 of the job's instance ran; the job's instance cannot go on \
             without it"
        )
    );
    // Re-parenting off on kary:2: the instance's ranks 0 and 1 route (1's children: 3, 4), 2 does not.
    let off = json!({"tbon.reparent": "off", "tbon.topo": "kary:2"});
    let (mut c, id) = start(off.clone());
    c.ranks_lost(T0 + 0.1, &IdSet::from_iter([3]));
    assert_eq!(severity(&c, id), Some(json!(2)), "instance rank 2, a leaf");
    let (mut c, id) = start(off);
    c.ranks_lost(T0 + 0.1, &IdSet::from_iter([2]));
    assert_eq!(severity(&c, id), Some(json!(0)), "instance rank 1, a router");
    // Off with no shape given: flat (Topology::nested_default), rank 0 alone.
    let (mut c, id) = start(json!({"tbon.reparent": "off"}));
    c.ranks_lost(T0 + 0.1, &IdSet::from_iter([2]));
    assert_eq!(severity(&c, id), Some(json!(2)), "flat: no router");
    // The memo, once it comes, is what counts.
    let (mut c, id) = start(json!({}));
    make_instance(&mut c, id, "1-2");
    c.ranks_lost(T0 + 0.1, &IdSet::from_iter([2]));
    assert_eq!(severity(&c, id), Some(json!(0)), "as reported");
    // An ordinary job loses its all.
    let mut c = core(3, 2, 0);
    let id = c.submit(T0, SubmitRequest::new(&spec(cmd().nnodes(3)), 0)).unwrap().id;
    actions(&mut c);
    c.ranks_lost(T0 + 0.1, &IdSet::from_iter([2]));
    assert_eq!(severity(&c, id), Some(json!(0)));
    // A bad shape is refused at submit, naming the field.
    for (bad, field) in [
        (json!({"tbon.reparent": "maybe"}), "attributes.system.instance.tbon.reparent"),
        (json!({"tbon.topo": "ring"}), "attributes.system.instance.tbon.topo"),
        (json!({"tbon.fanout": "2"}), "attributes.system.instance.tbon.fanout"),
        (json!("on"), "attributes.system.instance"),
    ] {
        let mut v = spec(cmd().nnodes(1));
        v["attributes"]["system"]["instance"] = bad;
        let e = core(1, 2, 0).submit(T0, SubmitRequest::new(&v, 0)).unwrap_err();
        assert!(e.to_string().contains(field), "{e}");
    }
}

/// `-o on-node-loss=notify` (Slurm's `--no-kill`): an ordinary job on 4 nodes survives the loss of node2 (tasks 2
/// and 6 under a cyclic map), even of its first node; the exception (severity 2) names the lost task ranks and
/// hosts; every surviving shell is told (the leader says it), the lost node is released, and the job completes with
/// the survivors' code. Losing the last nodes it runs on fails it.
#[test]
fn a_job_asking_to_be_notified_survives_its_nodes_until_none_is_left() {
    let mut c = core(4, 2, 0);
    let b = cmd()
        .nnodes(4)
        .ntasks(8)
        .taskmap(crate::taskmap::Scheme::Cyclic(1))
        .shell_option("on-node-loss", json!("notify"));
    let id = c.submit(T0, SubmitRequest::new(&spec(b), 0)).unwrap().id;
    actions(&mut c);
    for r in 0..4 {
        c.shell_spawned(T0, id, r, Ok(()));
    }
    actions(&mut c);
    c.ranks_lost(T0 + 1.0, &IdSet::from_iter([2]));
    let j = &c.jobs[&id];
    assert_eq!(j.state, JobState::Run, "the job goes on");
    assert!(j.fatal.is_none());
    let exc = j.eventlog.iter().rev().find(|e| e.name == "exception").unwrap().context.clone();
    assert_eq!(
        (exc["severity"].clone(), exc["tasks"].clone(), exc["hosts"].clone(), exc["shell_ranks"].clone()),
        (json!(2), json!("2,6"), json!("node2"), json!("2"))
    );
    type Told = (u32, bool, Vec<u32>, Vec<u32>, Vec<String>);
    let told: Vec<Told> = actions(&mut c)
        .into_iter()
        .filter_map(|a| match a {
            Action::NotifyShell { rank, leader, lost_shells, tasks, hosts, .. } => {
                Some((rank, leader, lost_shells, tasks, hosts))
            }
            _ => None,
        })
        .collect();
    let want = |r: u32| (r, r == 0, vec![2], vec![2, 6], vec!["node2".to_string()]);
    assert_eq!(told, vec![want(0), want(1), want(3)], "every survivor, the leader once");
    assert!(c.pool.ranks[&2].alloc_cores.is_empty(), "the lost node is released");

    // Its first node too: shell 1 leads now.
    c.ranks_lost(T0 + 2.0, &IdSet::from_iter([0]));
    assert!(c.jobs[&id].fatal.is_none(), "no shell is critical");
    let leaders: Vec<u32> = actions(&mut c)
        .into_iter()
        .filter_map(|a| match a {
            Action::NotifyShell { rank, leader: true, .. } => Some(rank),
            _ => None,
        })
        .collect();
    assert_eq!(leaders, vec![1]);
    exit_shell(&mut c, T0 + 3.0, id, 1, 0);
    exit_shell(&mut c, T0 + 3.0, id, 3, 0);
    let j = &c.jobs[&id];
    assert_eq!((j.state, j.exit_code()), (JobState::Inactive, Some(0)), "completes with the survivors' code");

    // Without a shell left, the loss is fatal.
    let id =
        c.submit(T0 + 4.0, SubmitRequest::new(&spec(cmd().nnodes(2).shell_option("on-node-loss", json!("notify"))), 0));
    let id = id.unwrap().id;
    actions(&mut c);
    let ranks: Vec<u32> = c.jobs[&id].alloc.iter().map(|a| a.rank).collect();
    for r in &ranks {
        c.shell_spawned(T0 + 4.0, id, *r, Ok(()));
    }
    c.ranks_lost(T0 + 5.0, &ranks.iter().copied().collect());
    let e = c.jobs[&id].fatal.clone().expect("fatal without a shell left");
    assert!(e.note.ends_with("; no node of the job is left"), "{e:?}");
}

/// A node lost after its job was allocated, before its shell started there: the lost verdict comes first (the
/// judge reports it before it fails the requests in flight to the node), then the shell's start request comes back
/// with an error (EHOSTUNREACH). That error is the loss already judged, not a second failure: one exception, the
/// node-failure (fatal for an ordinary job, severity 2 for a batch job, which goes on), and a `--requeue` job still
/// goes back to the queue.
#[test]
fn a_start_that_fails_because_its_node_was_lost_is_that_loss_only() {
    let unreachable = || Err("rank 2 was lost with this request in flight".to_string());
    // Ordinary job: shells on 1 and 3 started, 2 never answered.
    let mut c = core(4, 1, 0);
    let id = c.submit(T0, SubmitRequest::new(&spec(cmd().nnodes(3)), 0)).unwrap().id;
    actions(&mut c);
    assert_eq!(c.jobs[&id].alloc.iter().map(|a| a.rank).collect::<Vec<_>>(), vec![0, 1, 2]);
    c.shell_spawned(T0, id, 0, Ok(()));
    c.shell_spawned(T0, id, 1, Ok(()));
    c.ranks_lost(T0 + 1.0, &IdSet::from_iter([2]));
    c.shell_spawned(T0 + 1.0, id, 2, unreachable());
    let ex: Vec<_> = c.jobs[&id].eventlog.iter().filter(|e| e.name == "exception").collect();
    assert_eq!(ex.len(), 1, "{ex:?}");
    assert_eq!((ex[0].context["type"].clone(), ex[0].context["severity"].clone()), (json!("node-failure"), json!(0)));
    assert_eq!(ex[0].context["note"], json!("lost node node2 (rank 2), where task 2 ran"));
    for r in [0, 1] {
        exit_shell(&mut c, T0 + 2.0, id, r, 15);
    }
    assert_eq!(c.jobs[&id].state, JobState::Inactive);
    assert_eq!(c.jobs[&id].exit_code(), Some(crate::shellproto::JOB_EXIT_NODE_LOST));
    // Not given again while lost.
    let next = c.submit(T0 + 3.0, SubmitRequest::new(&spec(cmd().nnodes(3)), 0)).unwrap().id;
    let s = spawns(&actions(&mut c));
    assert_eq!(s.iter().map(|x| x.1).collect::<Vec<_>>(), vec![0, 1, 3], "{next:?}");

    // A --requeue job goes back to the queue: the late error does not cancel its requeue.
    let mut c = core(4, 1, 0);
    let id = c.submit(T0, SubmitRequest::new(&spec(cmd().nnodes(3).requeue(true)), 0)).unwrap().id;
    actions(&mut c);
    c.shell_spawned(T0, id, 0, Ok(()));
    c.ranks_lost(T0 + 1.0, &IdSet::from_iter([2]));
    c.shell_spawned(T0 + 1.0, id, 2, unreachable());
    c.shell_spawned(T0 + 1.0, id, 1, Ok(()));
    for r in [0, 1] {
        exit_shell(&mut c, T0 + 2.0, id, r, 15);
    }
    assert!(c.jobs[&id].state.is_active(), "requeued: {:?}", names(&c, id));

    // A batch job (its instance's rank 0 on broker rank 1) goes on without the node, its resources released.
    let mut c = core(4, 1, 0);
    c.drain(T0, &IdSet::from_iter([0]), "login", DrainMode::Refuse).unwrap();
    let mut v = spec(cmd().nnodes(3).exclusive(true));
    v["attributes"]["system"]["instance"] = json!({});
    let id = c.submit(T0, SubmitRequest::new(&v, 0)).unwrap().id;
    actions(&mut c);
    c.shell_spawned(T0, id, 1, Ok(()));
    c.shell_spawned(T0, id, 3, Ok(()));
    c.ranks_lost(T0 + 1.0, &IdSet::from_iter([2]));
    c.shell_spawned(T0 + 1.0, id, 2, unreachable());
    let j = &c.jobs[&id];
    assert_eq!(j.state, JobState::Run, "{:?}", names(&c, id));
    let ex: Vec<_> = j.eventlog.iter().filter(|e| e.name == "exception").collect();
    assert_eq!(ex.len(), 1, "{ex:?}");
    assert_eq!((ex[0].context["severity"].clone(), ex[0].context["shell_ranks"].clone()), (json!(2), json!("1")));
    assert!(j.fatal.is_none());
    assert!(j.eventlog.iter().any(|e| e.name == "release" && e.context["ranks"] == json!("2")), "released early");
}

/// A batch job's broker that dies on a live node while its instance starts, before the instance reported itself
/// (no memo): judged at once by the nested-broker rules, as later (a severity-2 `exec` exception naming the node
/// and how the broker ended, with its rank in the job's instance for that instance's rank 0), and its node released;
/// its instance's rank 0 dying then is fatal.
#[test]
fn a_nested_broker_that_dies_while_its_instance_starts_is_reported_at_once() {
    let mut c = core(5, 1, 0);
    c.drain(T0, &IdSet::from_iter([0]), "login", DrainMode::Refuse).unwrap();
    let mut v = spec(cmd().nnodes(4).exclusive(true));
    v["attributes"]["system"]["instance"] = json!({});
    let id = c.submit(T0, SubmitRequest::new(&v, 0)).unwrap().id;
    actions(&mut c);
    for r in 1..5 {
        c.shell_spawned(T0, id, r, Ok(()));
    }
    assert!(c.jobs[&id].instance.is_none());
    exit_shell(&mut c, T0 + 1.0, id, 3, 9);
    let j = &c.jobs[&id];
    assert_eq!(j.state, JobState::Run);
    let e = j.eventlog.iter().rev().find(|e| e.name == "exception").expect("an exception").context.clone();
    assert_eq!(
        e["note"],
        json!(
            "the job's broker on node3 (rank 3), where rank 2 of the job's instance ran, ended (killed by SIGKILL); \
             the job's instance continues without it"
        )
    );
    assert_eq!(
        (e["severity"].clone(), e["shell_ranks"].clone(), e["hosts"].clone()),
        (json!(2), json!("2"), json!("node3"))
    );
    assert!(j.eventlog.iter().any(|e| e.name == "release" && e.context["ranks"] == json!("3")), "released");
    exit_shell(&mut c, T0 + 2.0, id, 1, 9);
    assert!(c.jobs[&id].fatal.is_some(), "its rank 0: fatal");
}

/// A batch job whose instance could not start because more of its brokers never joined than it tolerates
/// (`--tolerate-lost`, issue 40) fails at once, naming their nodes, with the lost-node exit code.
#[test]
fn a_nested_instance_that_cannot_start_fails_its_job_naming_the_nodes() {
    let mut c = core(6, 1, 0);
    c.drain(T0, &IdSet::from_iter([0]), "login", DrainMode::Refuse).unwrap();
    let mut v = spec(cmd().nnodes(5).exclusive(true));
    v["attributes"]["system"]["instance"] = json!({});
    let id = c.submit(T0, SubmitRequest::new(&v, 0)).unwrap().id;
    actions(&mut c);
    for r in 1..6 {
        c.shell_spawned(T0, id, r, Ok(()));
    }
    c.ranks_lost(T0 + 1.0, &IdSet::from_iter([5]));
    assert!(c.jobs[&id].fatal.is_none(), "the loss alone: severity 2");
    c.nested_start_failed(T0 + 1.1, id, &IdSet::from_iter([4]), 0);
    let e = c.jobs[&id].fatal.clone().expect("fatal");
    assert_eq!(e.kind, "node-failure");
    assert_eq!(
        e.note,
        "the job's instance could not start without node node5 (rank 5), where rank 4 of the job's instance was to \
         run: its broker never joined, and --tolerate-lost=0 allows none"
    );
    assert_eq!(signals(&actions(&mut c)).len(), 1, "its shells are killed at once");
    for r in 1..5 {
        exit_shell(&mut c, T0 + 2.0, id, r, 15);
    }
    assert_eq!(c.jobs[&id].state, JobState::Inactive);
    assert_eq!(c.jobs[&id].exit_code(), Some(crate::shellproto::JOB_EXIT_NODE_LOST));
}

/// A guest's munge credential (docs/security.md) stays with its job as submitted, through `vigil update` and a
/// restart of rank 0, and each shell's input carries it with the jobspec text it covers, for `vigil-imp`.
#[test]
fn a_guests_credential_goes_with_its_job_to_every_shell_through_an_update_and_a_restart() {
    let mut c = core(2, 1, 0);
    c.enable_journal();
    let busy = c.submit(T0, SubmitRequest::new(&spec(cmd().nnodes(2).ntasks(2)), 1000)).unwrap().id;
    assert_eq!(c.jobs[&busy].state, JobState::Run);
    let guest_spec = spec(cmd().nnodes(2).ntasks(2));
    let signed = guest_spec.to_string();
    let g = c.submit(T0 + 1.0, SubmitRequest::new(&guest_spec, 1001).credential(Some("MUNGE:abc:".into()))).unwrap().id;
    let u = update::Update { name: Some("renamed".into()), duration: None, urgency: None };
    c.update(T0 + 2.0, g, 1001, false, &u).expect("renamed");
    assert_ne!(*c.jobs[&g].jobspec_text, *signed, "the update changed the jobspec");
    let mut kept = journal::Kept::default();
    let b = c.journal().expect("a batch");
    kept.apply(&b).expect("applies");
    assert_eq!(kept.jobs[&g].credential.as_ref().map(|k| k.credential.as_str()), Some("MUNGE:abc:"));
    let mut c2 = JobCore::new(T0 + 10.0);
    for r in 0..2 {
        c2.rank_online(T0 + 10.0, r, &format!("node{r}"), (0..1).collect(), IdSet::new(), ("live".into(), None));
    }
    c2.restore(T0 + 10.0, kept);
    // The busy job ended with the restart (no reattach grace): the guest's starts, on both nodes.
    c2.schedule(T0 + 11.0);
    let s = spawns(&actions(&mut c2));
    assert_eq!(s.len(), 2, "{:?}", names(&c2, g));
    for (id, _, input) in s {
        assert_eq!(id, g);
        let imp = input.imp.clone().expect("the credential goes with the input");
        assert_eq!((imp.credential.as_str(), imp.jobspec.as_str()), ("MUNGE:abc:", signed.as_str()));
        input.check_signed().expect("the input runs what was signed");
    }
    // A job submitted without one carries none.
    let mut c = core(1, 1, 0);
    c.submit(T0, SubmitRequest::new(&spec(cmd()), 1000)).unwrap();
    assert!(spawns(&actions(&mut c)).iter().all(|(_, _, i)| i.imp.is_none()));
}
