//! RFC 21 urgency in virtual time (`urgency.rs`): queue order, holds and releases, and a restart of rank 0.

use super::journal::Kept;
use super::tests::{actions, cmd, core, exit_shell, names, spawns, spec, T0};
use super::*;

/// End running job `id` (its one shell exits 0) at `t`.
fn end(c: &mut JobCore, t: f64, id: JobId) {
    for (_, rank, _) in spawns(&actions(c)).into_iter().filter(|s| s.0 == id) {
        c.shell_spawned(t, id, rank, Ok(()));
        exit_shell(c, t, id, rank, 0);
    }
}

#[test]
fn urgency_orders_the_queue_and_zero_holds() {
    let mut c = core(1, 1, 0);
    let hog = c.submit(T0 + 1.0, SubmitRequest::new(&spec(cmd().ntasks(1)), 1000)).unwrap().id;
    let s = spec(cmd().ntasks(1));
    let low = c.submit(T0 + 2.0, SubmitRequest::new(&s, 1000).urgency(4)).unwrap().id;
    let plain = c.submit(T0 + 3.0, SubmitRequest::new(&s, 1000)).unwrap().id;
    let held = c.submit(T0 + 4.0, SubmitRequest::new(&s, 1000).urgency(0)).unwrap().id;
    let urgent = c.submit(T0 + 5.0, SubmitRequest::new(&s, 1000).urgency(MAX_URGENCY)).unwrap().id;
    assert_eq!(c.counts().0, 4, "held jobs are pending too");
    assert!(c.pending_reason(held).unwrap().starts_with("held: urgency 0"), "{:?}", c.pending_reason(held));
    assert!(c.pending_reason(low).unwrap().contains(&urgent.f58()), "behind the expedited one");
    let mut order = Vec::new();
    let mut running = hog;
    for t in 10..14 {
        end(&mut c, T0 + t as f64, running);
        let Some(next) = c.jobs.values().find(|j| j.state == JobState::Run).map(|j| j.id) else { break };
        order.push(next);
        running = next;
    }
    assert_eq!(order, vec![urgent, plain, low], "urgency, then submission; the held one never");
    assert_eq!(c.jobs[&held].state, JobState::Sched);
    // Released: it runs.
    assert_eq!(c.set_urgency(T0 + 20.0, held, 1000, false, DEFAULT_URGENCY, true), Ok(0));
    assert_eq!(c.jobs[&held].state, JobState::Run, "{:?}", names(&c, held));
    let ev = names(&c, held);
    assert!(ev.windows(2).any(|w| w == ["urgency", "priority"]), "{ev:?}");
    // A job past pending is refused, its state said in words.
    let e = c.set_urgency(T0 + 21.0, held, 1000, false, DEFAULT_URGENCY, true).unwrap_err();
    assert!(e.1.ends_with("is running: urgency orders pending jobs only"), "{e:?}");
}

#[test]
fn urgency_changes_are_checked() {
    let mut c = core(1, 1, 0);
    let run = c.submit(T0 + 1.0, SubmitRequest::new(&spec(cmd().ntasks(1)), 1000)).unwrap().id;
    let p = c.submit(T0 + 2.0, SubmitRequest::new(&spec(cmd().ntasks(1)), 1000)).unwrap().id;
    let err = |r: Result<u32, (u32, String)>| r.unwrap_err().1;
    assert!(err(c.set_urgency(T0, run, 1000, false, 0, false)).contains("pending jobs only"));
    assert!(err(c.set_urgency(T0, p, 1000, false, 32, false)).contains("0 (hold) to 31"));
    assert!(err(c.set_urgency(T0, p, 1000, false, 20, false)).contains("instance owner"));
    assert!(err(c.set_urgency(T0, p, 2000, false, 1, false)).contains("belongs to uid 1000"));
    assert!(err(c.set_urgency(T0, p, 1000, false, 16, true)).contains("is not held"));
    assert_eq!(c.set_urgency(T0, p, 1000, false, 0, false), Ok(16), "a user may hold their own job");
    assert_eq!(c.set_urgency(T0, p, 0, true, 31, false), Ok(0), "the owner may expedite it");
    assert_eq!(c.jobs[&p].urgency, 31);
}

/// Rank 0 restarts with a held job and an expedited one pending: both keep their urgency.
#[test]
fn a_restart_keeps_urgency_and_holds() {
    let mut c = core(1, 1, 0);
    c.enable_journal();
    let hog = c.submit(T0 + 1.0, SubmitRequest::new(&spec(cmd().ntasks(1)), 1000)).unwrap().id;
    let s = spec(cmd().ntasks(1));
    let first = c.submit(T0 + 2.0, SubmitRequest::new(&s, 1000)).unwrap().id;
    let held = c.submit(T0 + 3.0, SubmitRequest::new(&s, 1000)).unwrap().id;
    c.set_urgency(T0 + 3.5, held, 1000, false, 0, false).unwrap();
    let urgent = c.submit(T0 + 4.0, SubmitRequest::new(&s, 1000).urgency(30)).unwrap().id;
    let mut kept = Kept::default();
    if let Some(b) = c.journal() {
        kept.apply(&b).expect("applies");
        c.journal_saved(&b);
    }
    let _ = hog;
    let mut c2 = JobCore::new(T0 + 10.0);
    c2.restore(T0 + 10.0, kept);
    c2.rank_online(T0 + 11.0, 0, "node0", (0..1).collect(), crate::idset::IdSet::new(), ("live".into(), None));
    c2.handle_timeout(T0 + 10.0 + journal::REJOIN_HOLD);
    assert_eq!((c2.jobs[&held].urgency, c2.jobs[&urgent].urgency), (0, 30));
    assert_eq!(c2.jobs[&urgent].state, JobState::Run, "the expedited one first");
    assert_eq!((c2.jobs[&first].state, c2.jobs[&held].state), (JobState::Sched, JobState::Sched));
    assert!(c2.pending_reason(held).unwrap().starts_with("held"));
}
