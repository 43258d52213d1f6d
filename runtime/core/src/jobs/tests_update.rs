//! `vigil update` in virtual time (`update.rs`): what a pending and a running job may change, who may, and a
//! restart of rank 0 that keeps the change.

use super::journal::Kept;
use super::tests::{actions, cmd, core, names, spec, T0};
use super::update::{Duration, Update};
use super::*;
use serde_json::json;

fn upd(v: serde_json::Value) -> Update {
    Update::parse(v.as_object().unwrap()).unwrap()
}

/// Submit `s` for `uid` at `t`: the new job's id.
fn submit(c: &mut JobCore, t: f64, s: &serde_json::Value, uid: u32) -> Result<JobId, SubmitError> {
    c.submit(t, SubmitRequest::new(s, uid)).map(|x| x.id)
}

#[test]
fn a_pending_job_changes_limit_name_and_urgency() {
    let mut c = core(1, 1, 0);
    let hog = submit(&mut c, T0, &spec(cmd().ntasks(1)), 1000).unwrap();
    let p = submit(&mut c, T0 + 1.0, &spec(cmd().ntasks(1).duration(600.0)), 1000).unwrap();
    let r = c.update(T0 + 2.0, p, 1000, false, &upd(json!({"duration": "+5m", "name": "renamed", "urgency": "4"})));
    let r = r.unwrap();
    assert_eq!(r["attributes.system.duration"], json!(900.0), "{r}");
    assert_eq!(r["urgency"], json!({"old": 16, "new": 4}), "{r}");
    let j = &c.jobs[&p];
    assert_eq!((j.req.duration, j.display_name(), j.urgency), (Some(900.0), "renamed", 4));
    assert_eq!(j.jobspec().pointer("/attributes/system/duration"), Some(&json!(900.0)));
    assert!(
        names(&c, p).ends_with(&["jobspec-update".into(), "urgency".into(), "priority".into()]),
        "{:?}",
        names(&c, p)
    );
    // Not another user's; an unknown key, a bad value, more than 16 for a user: refused, nothing changed.
    let e = c.update(T0, p, 2000, false, &upd(json!({"name": "x"}))).unwrap_err();
    assert_eq!(e.0, crate::message::errno::EPERM, "{e:?}");
    assert!(Update::parse(json!({"nodes": "2"}).as_object().unwrap()).unwrap_err().starts_with("nodes: unknown key"));
    assert!(Update::parse(json!({"duration": "soon"}).as_object().unwrap()).unwrap_err().starts_with("duration:"));
    assert!(Update::parse(json!({"name": " "}).as_object().unwrap()).unwrap_err().starts_with("name:"));
    let e = c.update(T0, p, 1000, false, &upd(json!({"duration": "1h", "urgency": 20}))).unwrap_err();
    assert_eq!(e.0, crate::message::errno::EPERM, "{e:?}");
    assert_eq!(c.jobs[&p].req.duration, Some(900.0), "all or nothing");
    assert_eq!(upd(json!({"duration": "inf"})).duration, Some(Duration::Set(None)));
    assert_eq!(upd(json!({"duration": "-1m"})).duration, Some(Duration::Add(-60.0)));
    // It starts with its new limit.
    c.cancel(T0 + 3.0, hog, 1000, false, "x").unwrap();
    super::tests::exit_shell(&mut c, T0 + 3.5, hog, 0, 15);
    actions(&mut c);
    assert_eq!(c.jobs[&p].state, JobState::Run, "{:?}", names(&c, p));
    let t = c.jobs[&p].t_run.unwrap();
    assert_eq!(c.jobs[&p].expiration, Some(t + 900.0));
}

#[test]
fn a_running_job_may_only_shorten_its_limit() {
    let mut c = core(1, 1, 0);
    let w = json!({"timeleft": 60});
    let id = submit(&mut c, T0, &spec(cmd().ntasks(1).duration(3600.0).shell_option("signal", w)), 1000).unwrap();
    actions(&mut c);
    assert_eq!(c.jobs[&id].state, JobState::Run);
    let err = |c: &mut JobCore, v| c.update(T0 + 10.0, id, 1000, false, &upd(v)).unwrap_err().1;
    assert!(err(&mut c, json!({"duration": "2h"})).contains("may only be reduced"));
    assert!(err(&mut c, json!({"duration": 0})).contains("may only be reduced"), "unlimited is longer");
    assert!(err(&mut c, json!({"name": "x"})).contains("only its time limit may change"));
    assert!(err(&mut c, json!({"duration": "30s"})).contains("leaves no room for the job's warning SIGUSR1 1m"));
    c.update(T0 + 10.0, id, 1000, false, &upd(json!({"duration": "10m"}))).unwrap();
    assert_eq!(c.jobs[&id].expiration, Some(T0 + 600.0));
    assert_eq!(c.next_deadline(), Some(T0 + 540.0), "the warning moved with the limit");
    c.handle_timeout(T0 + 600.0);
    assert_eq!(c.jobs[&id].fatal.as_ref().map(|e| e.kind.as_str()), Some("timelimit"));
    assert!(
        err(&mut c, json!({"duration": "1m"})).contains("may no longer change") || c.jobs[&id].state == JobState::Run
    );
}

#[test]
fn an_update_survives_a_restart_of_rank_0() {
    let mut c = core(1, 1, 0);
    c.enable_journal();
    let hog = submit(&mut c, T0, &spec(cmd().ntasks(1)), 1000).unwrap();
    let p = submit(&mut c, T0 + 1.0, &spec(cmd().ntasks(1).duration(600.0)), 1000).unwrap();
    c.update(T0 + 2.0, p, 1000, false, &upd(json!({"duration": "20m", "name": "kept"}))).unwrap();
    let mut kept = Kept::default();
    if let Some(b) = c.journal() {
        kept.apply(&b).expect("applies");
        c.journal_saved(&b);
    }
    let _ = hog;
    let mut c2 = JobCore::new(T0 + 10.0);
    c2.restore(T0 + 10.0, kept);
    let j = &c2.jobs[&p];
    assert_eq!((j.req.duration, j.display_name()), (Some(1200.0), "kept"), "{:?}", names(&c2, p));
}
