//! The warning signal before the time limit (`--signal=SIG@TIME`, `timers.rs`) in virtual time.

use super::tests::{actions, cmd, core, names, spec, T0};
use super::*;
use serde_json::json;

fn signals(a: &[Action]) -> Vec<(JobId, Vec<u32>, i32)> {
    a.iter()
        .filter_map(|x| match x {
            Action::SignalShells { id, ranks, signal } => Some((*id, ranks.clone(), *signal)),
            _ => None,
        })
        .collect()
}

/// Submit `s` for `uid` at `t`: the new job's id.
fn submit(c: &mut JobCore, t: f64, s: &serde_json::Value, uid: u32) -> Result<JobId, SubmitError> {
    c.submit(t, SubmitRequest::new(s, uid)).map(|x| x.id)
}

#[test]
fn the_warning_goes_once_timeleft_before_the_limit_then_the_limit_fires() {
    let mut c = core(2, 1, 0);
    let w = json!({"signum": 12, "timeleft": 3});
    let id = submit(&mut c, T0, &spec(cmd().nnodes(2).ntasks(2).duration(10.0).shell_option("signal", w)), 0).unwrap();
    actions(&mut c);
    for r in 0..2 {
        c.shell_spawned(T0, id, r, Ok(()));
    }
    assert_eq!(c.next_deadline(), Some(T0 + 7.0), "the warning is the first deadline");
    c.handle_timeout(T0 + 6.999);
    assert!(signals(&actions(&mut c)).is_empty());
    c.handle_timeout(T0 + 7.0);
    assert_eq!(signals(&actions(&mut c)), vec![(id, vec![0, 1], 12)], "SIGUSR2 to both shells");
    let ev = c.jobs[&id].eventlog.last().unwrap().clone();
    assert_eq!(ev.name, "signal");
    assert_eq!(ev.context["signal"], json!("SIGUSR2"));
    assert_eq!(ev.context["timeleft"], json!(3.0));
    assert_eq!(c.next_deadline(), Some(T0 + 10.0), "then the time limit, and no second warning");
    c.handle_timeout(T0 + 8.0);
    assert!(signals(&actions(&mut c)).is_empty());
    c.handle_timeout(T0 + 10.0);
    assert_eq!(c.jobs[&id].fatal.as_ref().map(|e| e.kind.as_str()), Some("timelimit"));
    assert_eq!(names(&c, id).iter().filter(|n| *n == "signal").count(), 1);
}

#[test]
fn a_warning_not_before_the_limit_is_refused_naming_the_option() {
    let mut c = core(1, 1, 0);
    let late = |secs: f64| spec(cmd().duration(60.0).shell_option("signal", json!({"timeleft": secs})));
    let e = submit(&mut c, T0, &late(60.0), 0).unwrap_err().to_string();
    assert!(e.starts_with("attributes.system.shell.options.signal: SIGUSR1 1m before the time limit"), "{e}");
    assert!(submit(&mut c, T0, &late(59.0), 0).is_ok());
    // Against sched.default-duration when the job gives none.
    c.config.default_duration = Some(30.0);
    let dflt = spec(cmd().shell_option("signal", json!(true)));
    let e = submit(&mut c, T0, &dflt, 0).unwrap_err().to_string();
    assert!(e.contains("must be less than the time limit itself (30s)"), "{e}");
    // No time limit at all: accepted, never sent.
    c.config.default_duration = None;
    let id = submit(&mut c, T0 + 1.0, &dflt, 0).unwrap();
    assert_eq!(c.jobs[&id].req.signal, Some(crate::jobspec::WarnSignal::default()));
    let e = submit(&mut c, T0, &spec(cmd().shell_option("signal", json!({"signum": 0}))), 0).unwrap_err().to_string();
    assert!(e.starts_with("attributes.system.shell.options.signal: signum:"), "{e}");
}
