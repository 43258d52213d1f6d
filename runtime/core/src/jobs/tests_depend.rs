//! RFC 26 dependencies in virtual time (`depend.rs`): met, never met, begin times, and a restart of rank 0 with
//! jobs still waiting.

use super::journal::Kept;
use super::tests::{actions, cmd, core, exit_shell, names, spawns, spec, T0};
use super::*;
use serde_json::{json, Value};

/// A jobspec of one task with these RFC 26 dependency objects.
fn after(deps: &[(&str, JobId)]) -> Value {
    let mut b = cmd().ntasks(1);
    for (scheme, id) in deps {
        b = b.dependency(json!({"scheme": scheme, "value": id.f58()}));
    }
    spec(b)
}

/// Start job `id`'s shells and end them with `status` at `t`.
fn run_to_end(c: &mut JobCore, t: f64, id: JobId, status: i32) {
    for (_, rank, _) in spawns(&actions(c)).into_iter().filter(|s| s.0 == id) {
        c.shell_spawned(t, id, rank, Ok(()));
        exit_shell(c, t, id, rank, status);
    }
}

#[test]
fn afterok_waits_then_runs_and_afterok_on_a_failure_never_does() {
    let mut c = core(1, 1, 0);
    let a = c.submit(T0 + 1.0, SubmitRequest::new(&spec(cmd().ntasks(1)), 1000)).unwrap().id;
    assert_eq!(c.jobs[&a].state, JobState::Run);
    let ok = c.submit(T0 + 2.0, SubmitRequest::new(&after(&[("afterok", a)]), 1000)).unwrap().id;
    let notok = c.submit(T0 + 2.0, SubmitRequest::new(&after(&[("afternotok", a)]), 1000)).unwrap().id;
    let any = c.submit(T0 + 2.0, SubmitRequest::new(&after(&[("afterany", a)]), 1000)).unwrap().id;
    for id in [ok, notok, any] {
        assert_eq!(c.jobs[&id].state, JobState::Depend);
        assert!(names(&c, id).contains(&"dependency-add".to_string()), "{:?}", names(&c, id));
    }
    let why = c.depend_reason(ok, T0 + 3.0).unwrap();
    assert_eq!(why, format!("dependency: afterok:{}", a.f58()));
    assert_eq!(c.counts().0, 0, "none of them queued");
    run_to_end(&mut c, T0 + 5.0, a, 0);
    assert_eq!(c.jobs[&a].result(), Some("COMPLETED"));
    // afterok and afterany go on (one runs, the other waits for the core); afternotok never can.
    assert_eq!(c.jobs[&ok].state, JobState::Run, "{:?}", names(&c, ok));
    assert_eq!(c.jobs[&any].state, JobState::Sched);
    assert!(names(&c, ok).windows(2).any(|w| w == ["dependency-remove", "depend"]), "{:?}", names(&c, ok));
    let nk = &c.jobs[&notok];
    assert_eq!(nk.state, JobState::Inactive);
    let e = nk.fatal.as_ref().expect("an exception");
    assert_eq!((e.kind.as_str(), e.severity), ("dependency", 0));
    assert!(e.note.contains(&format!("afternotok:{}", a.f58())) && e.note.contains("completed"), "{}", e.note);
    // A chain: afterok on a job that fails ends the job after it too, and the one after that.
    let b = c.submit(T0 + 6.0, SubmitRequest::new(&after(&[("afterany", ok)]), 1000)).unwrap().id;
    let b2 = c.submit(T0 + 6.0, SubmitRequest::new(&after(&[("afterok", b)]), 1000)).unwrap().id;
    let b3 = c.submit(T0 + 6.0, SubmitRequest::new(&after(&[("afterok", b2)]), 1000)).unwrap().id;
    run_to_end(&mut c, T0 + 7.0, ok, 0);
    run_to_end(&mut c, T0 + 8.0, any, 0);
    assert_eq!(c.jobs[&b].state, JobState::Run);
    run_to_end(&mut c, T0 + 9.0, b, crate::shellproto::status_exited(3));
    for id in [b2, b3] {
        assert_eq!(c.jobs[&id].state, JobState::Inactive, "{:?}", names(&c, id));
        assert_eq!(c.jobs[&id].fatal.as_ref().map(|e| e.kind.as_str()), Some("dependency"));
    }
    assert!(c.jobs[&b2].fatal.as_ref().unwrap().note.contains("FAILED (exit 3)"), "{:?}", c.jobs[&b2].fatal);
    assert!(c.depend.on.is_empty() && c.depend.begin.is_empty(), "nothing left in the indexes");
}

#[test]
fn an_unknown_job_is_refused_and_after_means_started() {
    let mut c = core(1, 1, 0);
    let e = c.submit(T0, SubmitRequest::new(&after(&[("afterok", JobId(12345))]), 1000)).unwrap_err().to_string();
    assert!(e.starts_with("attributes.system.dependencies[0].value: no job"), "{e}");
    assert!(c.jobs.is_empty(), "nothing made");
    let hog = c.submit(T0 + 1.0, SubmitRequest::new(&spec(cmd().ntasks(1)), 1000)).unwrap().id;
    let a = c.submit(T0 + 2.0, SubmitRequest::new(&spec(cmd().ntasks(1)), 1000)).unwrap().id;
    let s = c.submit(T0 + 2.0, SubmitRequest::new(&after(&[("after", a)]), 1000)).unwrap().id;
    let never = c.submit(T0 + 2.0, SubmitRequest::new(&after(&[("after", a)]), 1000)).unwrap().id;
    assert_eq!((c.jobs[&a].state, c.jobs[&s].state), (JobState::Sched, JobState::Depend));
    c.cancel(T0 + 2.5, never, 1000, false, "x").unwrap();
    run_to_end(&mut c, T0 + 3.0, hog, 0);
    assert_eq!(c.jobs[&a].state, JobState::Run);
    assert_eq!(c.jobs[&s].state, JobState::Sched, "a started: s goes on to the queue");
    // Canceling a pending job ends its afterok dependents and lets its afterany ones go.
    let p = c.submit(T0 + 4.0, SubmitRequest::new(&spec(cmd().ntasks(1)), 1000)).unwrap().id;
    let ok = c.submit(T0 + 4.0, SubmitRequest::new(&after(&[("afterok", p)]), 1000)).unwrap().id;
    let any = c.submit(T0 + 4.0, SubmitRequest::new(&after(&[("afterany", p)]), 1000)).unwrap().id;
    c.cancel(T0 + 5.0, p, 1000, false, "no").unwrap();
    assert_eq!(c.jobs[&ok].state, JobState::Inactive);
    assert!(c.jobs[&ok].fatal.as_ref().unwrap().note.contains("CANCELED"), "{:?}", c.jobs[&ok].fatal);
    assert_eq!(c.jobs[&any].state, JobState::Sched);
}

#[test]
fn a_begin_time_holds_a_job_until_it_comes() {
    let mut c = core(1, 1, 0);
    let at = T0 + 100.0;
    let s = spec(cmd().ntasks(1).dependency(json!({"scheme": "begin-time", "value": at})));
    let id = c.submit(T0 + 1.0, SubmitRequest::new(&s, 1000)).unwrap().id;
    assert_eq!(c.jobs[&id].state, JobState::Depend);
    assert_eq!(c.next_deadline(), Some(at));
    let when = crate::jobs::depend::utc_iso8601(at);
    assert_eq!(c.depend_reason(id, T0 + 40.0).unwrap(), format!("begin-time: not before {when} (in 1m00s)"));
    c.handle_timeout(at - 0.5);
    assert_eq!(c.jobs[&id].state, JobState::Depend, "not yet");
    c.handle_timeout(at);
    assert_eq!(c.jobs[&id].state, JobState::Run, "{:?}", names(&c, id));
    // One already past at submit does not hold it.
    let past = spec(cmd().ntasks(1).dependency(json!({"scheme": "begin-time", "value": T0})));
    let p = c.submit(T0 + 101.0, SubmitRequest::new(&past, 1000)).unwrap().id;
    assert_eq!(c.jobs[&p].state, JobState::Sched);
}

#[test]
fn singleton_waits_for_the_earlier_jobs_of_its_name() {
    let mut c = core(1, 2, 0);
    let named = |n: &str, single: bool| {
        let mut b = cmd().ntasks(1).name(n);
        if single {
            b = b.dependency(json!({"scheme": "singleton", "value": ""}));
        }
        spec(b)
    };
    let a = c.submit(T0 + 1.0, SubmitRequest::new(&named("x", false), 1000)).unwrap().id;
    let other = c.submit(T0 + 1.0, SubmitRequest::new(&named("y", true), 1000)).unwrap().id;
    let b = c.submit(T0 + 2.0, SubmitRequest::new(&named("x", true), 1000)).unwrap().id;
    let mine = c.submit(T0 + 2.0, SubmitRequest::new(&named("x", true), 2000)).unwrap().id;
    assert_eq!(c.jobs[&other].state, JobState::Run, "no other y");
    assert_eq!(c.jobs[&b].state, JobState::Depend, "a is x too");
    assert_eq!(c.jobs[&mine].state, JobState::Sched, "another user's x does not count");
    run_to_end(&mut c, T0 + 3.0, a, 0);
    assert!(c.jobs[&b].state >= JobState::Sched, "{:?}", names(&c, b));
}

/// Save every batch the core has into `kept`.
fn save(c: &mut JobCore, kept: &mut Kept) {
    if let Some(b) = c.journal() {
        kept.apply(&b).expect("applies");
        c.journal_saved(&b);
    }
}

/// Rank 0 restarts with a chain still waiting: what each waits for comes back, and the chain goes on.
#[test]
fn a_restart_keeps_the_jobs_waiting() {
    let mut c = core(1, 1, 0);
    c.enable_journal();
    let a = c.submit(T0 + 1.0, SubmitRequest::new(&spec(cmd().ntasks(1)), 1000)).unwrap().id;
    let b = c.submit(T0 + 2.0, SubmitRequest::new(&after(&[("afterok", a)]), 1000)).unwrap().id;
    let d = c.submit(T0 + 2.0, SubmitRequest::new(&after(&[("afterok", b)]), 1000)).unwrap().id;
    let begin = spec(cmd().ntasks(1).dependency(json!({"scheme": "begin-time", "value": T0 + 50.0})));
    let t = c.submit(T0 + 3.0, SubmitRequest::new(&begin, 1000)).unwrap().id;
    let mut kept = Kept::default();
    save(&mut c, &mut kept);
    let mut c2 = JobCore::new(T0 + 10.0);
    c2.rank_online(T0 + 10.0, 0, "node0", (0..1).collect(), crate::idset::IdSet::new(), ("live".into(), None));
    c2.restore(T0 + 10.0, kept);
    // a was running: ended by the restart (no reattach grace), so b and d can never run.
    assert_eq!(c2.jobs[&a].state, JobState::Inactive);
    assert_eq!(c2.jobs[&b].fatal.as_ref().map(|e| e.kind.as_str()), Some("dependency"), "{:?}", names(&c2, b));
    assert_eq!(c2.jobs[&d].state, JobState::Inactive);
    assert_eq!(c2.jobs[&t].state, JobState::Depend, "its begin time is still to come");
    assert_eq!(c2.next_deadline().map(|x| x <= T0 + 50.0), Some(true));
    c2.handle_timeout(T0 + 50.0);
    assert!(c2.jobs[&t].state >= JobState::Sched, "{:?}", names(&c2, t));
    assert_eq!(names(&c2, t).iter().filter(|n| *n == "dependency-add").count(), 1, "not added twice");
}

/// A chain kept across a restart while its head is still pending: nothing is lost, and the chain runs in order.
#[test]
fn a_restart_with_a_pending_chain_runs_it_in_order() {
    let mut c = core(1, 1, 0);
    c.enable_journal();
    let hog = c.submit(T0 + 1.0, SubmitRequest::new(&spec(cmd().ntasks(1)), 1000)).unwrap().id;
    let a = c.submit(T0 + 2.0, SubmitRequest::new(&spec(cmd().ntasks(1)), 1000)).unwrap().id;
    let b = c.submit(T0 + 2.0, SubmitRequest::new(&after(&[("afterok", a)]), 1000)).unwrap().id;
    let d = c.submit(T0 + 2.0, SubmitRequest::new(&after(&[("afterok", b)]), 1000)).unwrap().id;
    let mut kept = Kept::default();
    save(&mut c, &mut kept);
    let _ = hog;
    let mut c2 = JobCore::new(T0 + 10.0);
    c2.restore(T0 + 10.0, kept);
    c2.rank_online(T0 + 11.0, 0, "node0", (0..1).collect(), crate::idset::IdSet::new(), ("live".into(), None));
    c2.handle_timeout(T0 + 10.0 + journal::REJOIN_HOLD);
    assert_eq!(c2.jobs[&a].state, JobState::Run, "{:?}", names(&c2, a));
    assert_eq!((c2.jobs[&b].state, c2.jobs[&d].state), (JobState::Depend, JobState::Depend));
    run_to_end(&mut c2, T0 + 30.0, a, 0);
    assert_eq!(c2.jobs[&b].state, JobState::Run);
    run_to_end(&mut c2, T0 + 31.0, b, 0);
    assert_eq!(c2.jobs[&d].state, JobState::Run);
}
