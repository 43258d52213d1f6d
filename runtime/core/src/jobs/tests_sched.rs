//! Deterministic tests of the scheduling rules: EASY backfill and FCFS (`backfill.rs`), shrink (`shrink.rs`),
//! requeue (`requeue.rs`), the deadline index (`timers.rs`), and the cost of an event at queue depth.

use super::tests::{actions, cmd, core, exit_shell, names, spawns, spec, T0};
use super::*;
use crate::idset::IdSet;
use proptest::prelude::*;
use serde_json::{json, Value};

/// Submit `b` with time limit `limit` seconds (0 = none) at `t`.
fn submit(c: &mut JobCore, t: f64, b: crate::jobspec::JobspecBuilder, limit: f64) -> JobId {
    c.submit(t, SubmitRequest::new(&spec(b.duration(limit)), 0)).expect("submitted").id
}

/// End every shell of running job `id` at `t` with status 0.
fn finish(c: &mut JobCore, t: f64, id: JobId) {
    let ranks: Vec<u32> = c.jobs[&id].shells.keys().copied().collect();
    for r in ranks {
        exit_shell(c, t, id, r, 0);
    }
}

fn state(c: &JobCore, id: JobId) -> JobState {
    c.jobs[&id].state
}

// ------------------------------------------------------------------------------------------- backfill

#[test]
fn easy_backfills_a_short_job_but_not_a_long_one() {
    let mut c = core(1, 4, 0);
    let running = submit(&mut c, T0, cmd().ntasks(2), 100.0);
    let head = submit(&mut c, T0 + 1.0, cmd().ntasks(4), 10.0);
    let short = submit(&mut c, T0 + 2.0, cmd().ntasks(1), 50.0);
    let long = submit(&mut c, T0 + 3.0, cmd().ntasks(1), 200.0);
    let unlimited = submit(&mut c, T0 + 4.0, cmd().ntasks(1), 0.0);
    assert_eq!(state(&c, running), JobState::Run);
    assert_eq!(state(&c, head), JobState::Sched);
    let r = c.reservation().expect("the head holds the reservation").clone();
    assert_eq!((r.id, r.start), (head, T0 + 100.0), "when the running job's time limit expires");
    assert_eq!(c.estimate(head), Some(T0 + 100.0));
    assert_eq!(c.estimate(long), None);
    assert_eq!(state(&c, short), JobState::Run, "ends (T0+52) before the reservation starts: backfilled");
    assert_eq!(state(&c, long), JobState::Sched, "would end after T0+100: it waits");
    assert_eq!(state(&c, unlimited), JobState::Sched, "no time limit: never ends before a reservation");
    let why = c.pending_reason(long).unwrap();
    assert!(why.contains(&format!("queued behind job {}, which holds the reservation", head.f58())), "{why}");
    assert!(c.pending_reason(head).unwrap().starts_with("resources: needs 4 slots"), "{:?}", c.pending_reason(head));
    // The running job ends early: the head starts at once (the short one is done by then).
    actions(&mut c);
    finish(&mut c, T0 + 30.0, short);
    finish(&mut c, T0 + 60.0, running);
    assert_eq!(state(&c, head), JobState::Run);
    assert_eq!(c.jobs[&head].t_run, Some(T0 + 60.0));
    assert_eq!(state(&c, long), JobState::Sched);
    // Then the rest, in order.
    finish(&mut c, T0 + 65.0, head);
    assert_eq!((state(&c, long), state(&c, unlimited)), (JobState::Run, JobState::Run));
}

#[test]
fn a_job_fits_beside_the_reservation_whatever_its_time_limit() {
    // 4 nodes of 2 cores. Rank 0 is held by a job without a time limit, rank 1 by one of 100 s.
    let mut c = core(4, 2, 0);
    let forever = submit(&mut c, T0, cmd().nnodes(1).ntasks(2), 0.0);
    let hundred = submit(&mut c, T0, cmd().nnodes(1).ntasks(2), 100.0);
    // 3 nodes with 1 core each: only ranks 2 and 3 can take it now; after T0+100, ranks 1-3.
    let head = submit(&mut c, T0 + 1.0, cmd().nnodes(3).ntasks(3), 10.0);
    let r = c.reservation().expect("reserved").clone();
    assert_eq!((r.id, r.start), (head, T0 + 100.0));
    assert_eq!(r.plan.iter().map(|a| a.rank).collect::<Vec<_>>(), vec![1, 2, 3]);
    // One core free beside the plan on ranks 2 and 3: an unlimited 1-core job fits there, a 2-core one does not.
    let beside = submit(&mut c, T0 + 2.0, cmd().ntasks(1), 0.0);
    let wide = submit(&mut c, T0 + 3.0, cmd().ntasks(1).cores_per_task(2), 0.0);
    assert_eq!(state(&c, beside), JobState::Run);
    assert_eq!(state(&c, wide), JobState::Sched);
    let plan_cores: Vec<(u32, IdSet)> = r.plan.iter().map(|a| (a.rank, a.cores.clone())).collect();
    for a in &c.jobs[&beside].alloc {
        let planned = plan_cores.iter().find(|(r, _)| *r == a.rank).map(|(_, c)| c.clone()).unwrap_or_default();
        assert!(a.cores.intersection(&planned).is_empty(), "beside means off the plan: {a:?} vs {planned}");
    }
    // The reservation holds: at T0+100 the head starts although `beside` still runs.
    actions(&mut c);
    c.handle_timeout(T0 + 100.0);
    let term: Vec<u32> = c.jobs[&hundred].shells.keys().copied().collect();
    for r in term {
        exit_shell(&mut c, T0 + 100.0, hundred, r, 15);
    }
    assert_eq!(state(&c, head), JobState::Run);
    assert_eq!(state(&c, beside), JobState::Run);
    assert_eq!(state(&c, forever), JobState::Run);
}

#[test]
fn fcfs_policy_holds_everything_behind_the_first_waiting_job() {
    let mut c = core(1, 4, 0);
    c.config.policy = SchedPolicy::Fcfs;
    let running = submit(&mut c, T0, cmd().ntasks(2), 100.0);
    let head = submit(&mut c, T0, cmd().ntasks(4), 10.0);
    let short = submit(&mut c, T0, cmd().ntasks(1), 5.0);
    assert_eq!(
        (state(&c, running), state(&c, head), state(&c, short)),
        (JobState::Run, JobState::Sched, JobState::Sched)
    );
    assert_eq!(
        c.pending_reason(short),
        Some(format!("priority: queued behind job {} (first come, first served)", head.f58()))
    );
    assert_eq!(c.estimate(head), Some(T0 + 100.0), "FCFS shows the expected start too");
}

#[test]
fn a_job_that_cannot_fit_the_present_ranks_waits_without_blocking() {
    // A system instance: rank 3 is lost but may return.
    let mut c = core(4, 1, 0);
    c.ranks_lost(T0, &IdSet::parse("3").unwrap());
    let four = submit(&mut c, T0 + 1.0, cmd().nnodes(4), 0.0);
    let three = submit(&mut c, T0 + 2.0, cmd().nnodes(3), 0.0);
    assert_eq!(state(&c, four), JobState::Sched, "accepted: the node may come back");
    assert_eq!(state(&c, three), JobState::Run, "not held back by the job that cannot fit now");
    let why = c.pending_reason(four).unwrap();
    assert!(why.contains("needs 4 nodes") && why.contains("(3 busy, 1 down)"), "{why}");
    assert!(c.reservation().is_none(), "no reservation for a job that cannot fit the present ranks");
    // One node is "node", not "nodes": a 1-node job behind the two running ones waits for one of them.
    let one = submit(&mut c, T0 + 3.0, cmd().nnodes(1).exclusive(true), 0.0);
    let why = c.pending_reason(one).unwrap();
    assert!(why.contains("needs 1 whole node with"), "{why}");
    // FCFS too: a job that cannot fit the present ranks holds back nobody.
    let mut f = core(4, 1, 0);
    f.config.policy = SchedPolicy::Fcfs;
    f.ranks_lost(T0, &IdSet::parse("3").unwrap());
    let four = submit(&mut f, T0 + 1.0, cmd().nnodes(4), 0.0);
    let one = submit(&mut f, T0 + 2.0, cmd().nnodes(1), 0.0);
    assert_eq!((state(&f, four), state(&f, one)), (JobState::Sched, JobState::Run));
    // The node returns: the 4-node job is first in line again.
    actions(&mut c);
    c.rank_online(T0 + 3.0, 3, "node3", (0..1).collect(), IdSet::new(), ("live".into(), None));
    assert_eq!(c.reservation().map(|r| r.id), Some(four));
    finish(&mut c, T0 + 4.0, three);
    assert_eq!(state(&c, four), JobState::Run);
}

#[test]
fn a_submission_behind_an_unchanged_queue_looks_at_itself_only() {
    let mut c = core(2, 1, 0);
    let a = submit(&mut c, T0, cmd().nnodes(2), 100.0);
    let head = submit(&mut c, T0, cmd().nnodes(1), 10.0);
    let r = c.reservation().cloned();
    let mut later = Vec::new();
    for i in 0..50 {
        later.push(submit(&mut c, T0 + f64::from(i), cmd().nnodes(1), 10.0));
    }
    assert_eq!(c.reservation().cloned(), r, "submissions leave the reservation alone");
    assert!(later.iter().all(|id| state(&c, *id) == JobState::Sched));
    actions(&mut c);
    finish(&mut c, T0 + 60.0, a);
    assert_eq!(state(&c, head), JobState::Run);
    assert_eq!(state(&c, later[0]), JobState::Run, "then the next in order");
}

#[test]
fn jobs_without_a_limit_get_the_default_duration() {
    let mut c = core(1, 1, 0);
    c.config.default_duration = Some(60.0);
    let id = submit(&mut c, T0, cmd(), 0.0);
    let limited = submit(&mut c, T0, cmd(), 5.0);
    assert_eq!(c.jobs[&id].expiration, Some(T0 + 60.0), "the default is enforced, as Slurm's DefaultTime");
    assert_eq!(c.jobs[&limited].req.duration, Some(5.0), "a job's own limit wins");
    assert_eq!(c.next_deadline(), Some(T0 + 60.0));
    c.handle_timeout(T0 + 60.0);
    assert!(c.jobs[&id].fatal.as_ref().is_some_and(|e| e.kind == "timelimit"));
}

// ------------------------------------------------------------------------------------------- shrink

#[test]
fn a_nested_instance_shrinks_and_fails_what_can_no_longer_fit() {
    let mut c = core(4, 1, 0);
    c.config.shrink = true;
    let two = submit(&mut c, T0, cmd().nnodes(2), 0.0);
    let four = submit(&mut c, T0 + 1.0, cmd().nnodes(4), 0.0);
    let three = submit(&mut c, T0 + 2.0, cmd().nnodes(3), 0.0);
    assert_eq!((state(&c, two), state(&c, four), state(&c, three)), (JobState::Run, JobState::Sched, JobState::Sched));
    actions(&mut c);
    c.ranks_lost(T0 + 3.0, &IdSet::parse("3").unwrap());
    // The 4-node job can never run now: fatal `alloc` exception naming the loss.
    let j = &c.jobs[&four];
    assert_eq!(j.state, JobState::Inactive);
    let e = j.fatal.as_ref().expect("fatal exception");
    assert_eq!((e.kind.as_str(), e.severity), ("alloc", 0));
    assert!(e.note.contains("lost node3 (rank 3) for good (shrink)") && e.note.contains("has 3"), "{}", e.note);
    assert_eq!(j.result(), Some("FAILED"));
    assert!(c.resource_eventlog.iter().any(|e| e.name == "shrink" && e.context["idset"] == "3"));
    // A new submission that cannot fit is refused at once, saying why.
    let err = c.submit(T0 + 4.0, SubmitRequest::new(&spec(cmd().nnodes(4)), 0)).unwrap_err();
    assert!(matches!(err, SubmitError::Shrunk { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("requested 4 nodes but this instance has 3") && msg.contains("node3 (rank 3) for good"),
        "{msg}"
    );
    // Never feasible even before the shrink: the plain error.
    let e5 = c.submit(T0 + 4.0, SubmitRequest::new(&spec(cmd().nnodes(5)), 0)).unwrap_err();
    assert!(matches!(e5, SubmitError::Unsatisfiable(_)), "{e5}");
    // The 3-node job fits what is left: it runs once the 2-node job ends.
    finish(&mut c, T0 + 5.0, two);
    assert_eq!(state(&c, three), JobState::Run);
    // A lost broker that re-registers stays out.
    c.rank_online(T0 + 6.0, 3, "node3", (0..1).collect(), IdSet::new(), ("live".into(), None));
    assert!(c.pool.ranks[&3].removed && !c.pool.ranks[&3].schedulable());
}

#[test]
fn a_system_instance_does_not_shrink() {
    let mut c = core(4, 1, 0);
    c.ranks_lost(T0, &IdSet::parse("3").unwrap());
    assert!(c.submit(T0, SubmitRequest::new(&spec(cmd().nnodes(4)), 0)).is_ok(), "accepted: the node may return");
    assert!(!c.resource_eventlog.iter().any(|e| e.name == "shrink"));
}

// ------------------------------------------------------------------------------------------- requeue

#[test]
fn a_requeue_job_that_loses_a_node_reruns_ahead_of_later_jobs() {
    let mut c = core(4, 1, 0);
    let job = submit(&mut c, T0, cmd().nnodes(2).requeue(true), 0.0);
    let later = submit(&mut c, T0 + 1.0, cmd().nnodes(3), 0.0);
    assert_eq!(c.jobs[&job].alloc.iter().map(|a| a.rank).collect::<Vec<_>>(), vec![0, 1]);
    assert_eq!(state(&c, later), JobState::Sched);
    actions(&mut c);
    c.ranks_lost(T0 + 2.0, &IdSet::parse("1").unwrap());
    let e = c.jobs[&job].fatal.clone().expect("fatal");
    assert_eq!(e.note, "lost node node1 (rank 1), where task 1 ran; requeued (1 of at most 3)");
    let a = actions(&mut c);
    assert!(a.iter().any(|x| matches!(x, Action::SignalShells { ranks, .. } if ranks == &vec![0])), "{a:?}");
    assert_eq!(state(&c, job), JobState::Cleanup, "waits for the surviving shell");
    exit_shell(&mut c, T0 + 3.0, job, 0, 15);
    // Back to the queue ahead of `later`, then allocated again on live nodes.
    let j = &c.jobs[&job];
    assert_eq!(j.state, JobState::Run);
    assert_eq!(j.requeues, 1);
    assert_eq!(j.alloc.iter().map(|a| a.rank).collect::<Vec<_>>(), vec![0, 2]);
    assert!(j.fatal.is_none() && j.status.is_none() && j.t_run == Some(T0 + 3.0));
    let n = names(&c, job);
    let tail: Vec<&str> = n.iter().map(String::as_str).skip_while(|e| *e != "exception").collect();
    assert_eq!(tail, ["exception", "finish", "release", "free", "requeue", "alloc"], "{n:?}");
    let rq = c.jobs[&job].eventlog.iter().find(|e| e.name == "requeue").unwrap();
    assert_eq!((rq.context["count"].as_u64(), rq.context["max"].as_u64()), (Some(1), Some(3)));
    assert!(rq.context["note"].as_str().unwrap().contains("lost node node1 (rank 1), where task 1 ran"));
    let a = actions(&mut c);
    assert!(a.iter().any(|x| matches!(x, Action::Requeued(id) if *id == job)));
    assert_eq!(spawns(&a).iter().map(|s| s.1).collect::<Vec<_>>(), vec![0, 2]);
    assert_eq!(state(&c, later), JobState::Sched, "needs 3 of the 3 live nodes");
    // The record of what was lost survives the requeue, per run: the current run lost nothing yet.
    let info = c.jobs[&job].info();
    assert_eq!((info["lost_ranks"].clone(), info["lost_nodelist"].clone()), (json!(""), json!("")));
    assert_eq!(info["lost_earlier"], json!([{"run": 1, "lost_ranks": "1", "lost_nodelist": "node1"}]));
    finish(&mut c, T0 + 4.0, job);
    let j = &c.jobs[&job];
    assert_eq!((j.state, j.result()), (JobState::Inactive, Some("COMPLETED")));
    let ctx: Vec<Value> = j.eventlog.iter().map(|e| Value::Object(e.context.clone())).collect();
    let replayed = state::replay(j.eventlog.iter().zip(&ctx).map(|(e, c)| (e.name.as_str(), c))).unwrap();
    assert_eq!(replayed, JobState::Inactive, "the eventlog replays through the requeue");
    assert_eq!(state(&c, later), JobState::Run);
}

#[test]
fn the_requeue_bound_ends_a_loop() {
    let mut c = core(8, 1, 0);
    c.config.max_requeue = 2;
    let job = submit(&mut c, T0, cmd().nnodes(1).requeue(true), 0.0);
    for (i, t) in [(1u32, T0 + 1.0), (2, T0 + 2.0)] {
        let rank = c.jobs[&job].alloc[0].rank;
        c.ranks_lost(t, &[rank].into_iter().collect());
        assert_eq!((state(&c, job), c.jobs[&job].requeues), (JobState::Run, i), "requeue {i}");
    }
    let rank = c.jobs[&job].alloc[0].rank;
    c.ranks_lost(T0 + 3.0, &[rank].into_iter().collect());
    let j = &c.jobs[&job];
    assert_eq!((j.state, j.requeues, j.result()), (JobState::Inactive, 2, Some("FAILED")));
    let note = &j.fatal.as_ref().unwrap().note;
    assert!(note.contains("not requeued: it was requeued 2 times already (sched.max-requeue=2)"), "{note}");
}

#[test]
fn only_node_loss_requeues_and_a_cancel_wins() {
    let mut c = core(4, 1, 0);
    // Without --requeue: the loss ends the job.
    let plain = submit(&mut c, T0, cmd().nnodes(1), 0.0);
    // A cancel during the cleanup of a loss: not requeued.
    let canceled = submit(&mut c, T0, cmd().nnodes(2).requeue(true), 0.0);
    // A time limit is not a node loss.
    let timed = submit(&mut c, T0, cmd().nnodes(1).requeue(true), 10.0);
    actions(&mut c);
    c.ranks_lost(T0 + 1.0, &IdSet::parse("0-1").unwrap()); // plain on 0, canceled on 1-2
    assert_eq!(c.jobs[&plain].result(), Some("FAILED"));
    assert_eq!(state(&c, canceled), JobState::Cleanup);
    c.cancel(T0 + 2.0, canceled, 0, true, "user").unwrap();
    exit_shell(&mut c, T0 + 3.0, canceled, 2, 15);
    assert_eq!((state(&c, canceled), c.jobs[&canceled].requeues), (JobState::Inactive, 0));
    c.handle_timeout(T0 + 10.0);
    finish(&mut c, T0 + 11.0, timed);
    assert_eq!((c.jobs[&timed].result(), c.jobs[&timed].requeues), (Some("TIMEOUT"), 0));
}

#[test]
fn a_batch_job_requeues_on_its_critical_rank_only() {
    let mut c = core(5, 1, 0);
    let job =
        c.submit(T0, SubmitRequest::new(&spec(cmd().nnodes(3).shell_option("requeue", json!(true))), 0)).unwrap().id;
    super::tests::make_instance(&mut c, job, "0");
    actions(&mut c);
    c.ranks_lost(T0 + 1.0, &IdSet::parse("2").unwrap());
    assert_eq!((state(&c, job), c.jobs[&job].requeues), (JobState::Run, 0), "a non-critical node: it goes on");
    c.ranks_lost(T0 + 2.0, &IdSet::parse("0").unwrap());
    finish(&mut c, T0 + 3.0, job);
    let j = &c.jobs[&job];
    assert_eq!((j.state, j.requeues), (JobState::Run, 1), "its rank 0: rerun on the live nodes");
    assert_eq!(j.alloc.iter().map(|a| a.rank).collect::<Vec<_>>(), vec![1, 3, 4]);
    assert!(j.instance.is_none(), "the new instance reports itself again");
}

// ------------------------------------------------------------------------------------------- timers and cost

#[test]
fn deadlines_come_from_the_index() {
    let mut c = core(64, 1, 0);
    let ids: Vec<JobId> = (0..64).map(|i| submit(&mut c, T0, cmd(), f64::from(100 - i))).collect();
    assert_eq!(c.next_deadline(), Some(T0 + 37.0));
    c.handle_timeout(T0 + 40.0);
    let fired: Vec<usize> = (0..64).filter(|i| c.jobs[&ids[*i]].fatal.is_some()).collect();
    assert_eq!(fired, (60..64).collect::<Vec<_>>(), "only the four whose limit passed");
    assert_eq!(c.next_deadline(), Some(T0 + 41.0), "the next limit comes before their SIGKILL");
    for &i in &fired {
        finish(&mut c, T0 + 40.5, ids[i]);
    }
    c.handle_timeout(T0 + 45.0);
    let fired: Vec<usize> = (0..64).filter(|i| c.jobs[&ids[*i]].fatal.is_some()).collect();
    assert_eq!(fired, (55..64).collect::<Vec<_>>());
    assert_eq!(c.next_deadline(), Some(T0 + 46.0), "the next limit, before the SIGKILL at T0+50");
}

/// Jobs queued behind a blocked head cost the same however many there are: 64 job ends are timed behind 200 and
/// behind 20,000 queued jobs, in the same run, and compared with a wide margin (ten times, plus 50 ms): a scan of
/// the queue per event would be about a hundred times slower at that depth. A ratio, never an absolute speed.
#[test]
fn a_deep_queue_does_not_slow_an_event() {
    fn drive(depth: u32) -> std::time::Duration {
        let mut c = core(16, 4, 0);
        let mut t = T0;
        // Fill the instance, then queue `depth` jobs behind it.
        let fill: Vec<JobId> = (0..64).map(|_| submit(&mut c, t, cmd(), 0.0)).collect();
        for _ in 0..depth {
            t += 0.001;
            submit(&mut c, t, cmd(), 0.0);
        }
        actions(&mut c);
        let t0 = std::time::Instant::now();
        let mut done = 0;
        for id in fill {
            t += 0.001;
            finish(&mut c, t, id);
            done += 1;
            let _ = c.next_deadline();
            actions(&mut c);
        }
        assert_eq!(done, 64);
        t0.elapsed()
    }
    let shallow = drive(200);
    let deep = drive(20_000);
    // Generous: a per-event scan of the queue would be ~100 times slower at this depth.
    assert!(deep < shallow * 10 + std::time::Duration::from_millis(50), "200: {shallow:?}, 20,000: {deep:?}");
}

/// Counted, not timed: the pending jobs a scheduling pass looks at ([`JobCore::examined`]) do not grow with the
/// queue, for a job's whole life (submit, start, finish), a cancel of a pending job, and a pass that can start
/// nothing; and `sched.backfill-depth` bounds a pass.
#[test]
fn a_pass_looks_at_a_bounded_number_of_jobs_whatever_the_depth() {
    // (per job cycle, per cancel, in a pass that starts nothing) examined at `depth` pending.
    fn examined(depth: u32, bound: usize) -> (u64, u64, u64) {
        let mut c = core(4, 2, 0);
        c.config.backfill_depth = bound;
        let mut t = T0;
        let running: Vec<JobId> = (0..8).map(|_| submit(&mut c, t, cmd(), 0.0)).collect();
        let pending: Vec<JobId> = (0..depth).map(|_| submit(&mut c, t, cmd(), 0.0)).collect();
        actions(&mut c);
        let e0 = c.examined();
        for id in &running {
            t += 0.001;
            finish(&mut c, t, *id);
            submit(&mut c, t, cmd(), 0.0);
            actions(&mut c);
        }
        let cycle = (c.examined() - e0) / running.len() as u64;
        // Cancel the deepest pending jobs (none holds the reservation).
        let e1 = c.examined();
        for id in pending.iter().rev().take(50) {
            c.cancel(t, *id, 0, true, "test").expect("cancel");
        }
        let cancel = (c.examined() - e1) / 50;
        // A core comes free, but every pending job needs two on one node: the pass starts nothing.
        let mut c = core(4, 2, 0);
        c.config.backfill_depth = bound;
        let fill: Vec<JobId> = (0..8).map(|_| submit(&mut c, t, cmd(), 0.0)).collect();
        for _ in 0..depth {
            submit(&mut c, t, cmd().nnodes(1).ntasks(2), 0.0);
        }
        actions(&mut c);
        let e2 = c.examined();
        finish(&mut c, t + 1.0, fill[0]);
        actions(&mut c);
        (cycle, cancel, c.examined() - e2)
    }
    for depth in [200, 20_000] {
        let (cycle, cancel, stuck) = examined(depth, BACKFILL_DEPTH);
        // The finish's pass: the job started, the reservation, no core left; and the submission's look at itself.
        assert!(cycle <= 4, "{depth} pending: a job's life looked at {cycle} pending jobs");
        assert_eq!(cancel, 0, "{depth} pending: a cancel behind the reservation needs no pass");
        assert_eq!(stuck, depth.min(BACKFILL_DEPTH as u32) as u64, "{depth} pending: a pass that starts nothing");
    }
    // The attribute bounds a pass that starts nothing.
    assert_eq!(examined(5_000, 16).2, 16);
}

// ------------------------------------------------------------------------------------------- properties

/// One job of the backfill property: nodes (or slots), cores per task, time limit, run time as a fraction of it.
#[derive(Clone, Debug)]
struct Spec {
    nodes: Option<u32>,
    tasks: u32,
    cores: u32,
    limit: f64,
    frac: f64,
    gap: f64,
}

fn job_spec() -> impl Strategy<Value = Spec> {
    (
        prop_oneof![Just(None), (1u32..3000).prop_map(Some)],
        1u32..6000,
        1u32..3,
        prop_oneof![1 => Just(0.0), 6 => (1u32..200).prop_map(f64::from)],
        0.1f64..=1.0,
        0.0f64..20.0,
    )
        .prop_map(|(nodes, tasks, cores, limit, frac, gap)| Spec {
            nodes,
            tasks: nodes.map_or(tasks, |n| tasks.max(n)),
            cores,
            limit,
            frac,
            gap,
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 10, ..ProptestConfig::default() })]

    /// 4,096 ranks of 4 cores, jobs of random shapes, limits and run times arriving over time: a job that got
    /// a reservation starts no later than the reservation's first promised start, whatever was backfilled, and a
    /// reservation never moves later. Jobs run no longer than their limit; a killed shell exits at once.
    #[test]
    fn backfill_never_delays_a_reservation(jobs in proptest::collection::vec(job_spec(), 4..40)) {
        let mut c = core(4096, 4, 0);
        let mut arrivals: Vec<(f64, Spec)> = Vec::new();
        let mut t = T0;
        for j in jobs {
            t += j.gap;
            arrivals.push((t, j));
        }
        arrivals.reverse();
        let mut now = T0;
        let mut promised: BTreeMap<JobId, f64> = BTreeMap::new();
        let mut ends: BTreeMap<JobId, f64> = BTreeMap::new();
        let mut runtime: BTreeMap<JobId, f64> = BTreeMap::new();
        for _ in 0..10_000 {
            // What happens at `now`: arrivals, deadlines, ends.
            while arrivals.last().is_some_and(|(at, _)| *at <= now) {
                let (_, s) = arrivals.pop().unwrap();
                let mut b = cmd().ntasks(s.tasks).cores_per_task(s.cores).duration(s.limit);
                if let Some(n) = s.nodes {
                    b = b.nnodes(n);
                }
                if let Ok(sub) = c.submit(now, SubmitRequest::new(&spec(b), 0)) {
                    runtime.insert(sub.id, if s.limit > 0.0 { s.limit * s.frac } else { 150.0 * s.frac });
                }
            }
            c.handle_timeout(now);
            let due: Vec<JobId> = ends.iter().filter(|(_, e)| **e <= now).map(|(id, _)| *id).collect();
            for id in due {
                ends.remove(&id);
                finish(&mut c, now, id);
            }
            // Drain: killed shells exit now; started jobs get their end.
            loop {
                let a = actions(&mut c);
                if a.is_empty() { break; }
                for x in a {
                    match x {
                        Action::SignalShells { id, ranks, .. } => {
                            for r in ranks { exit_shell(&mut c, now, id, r, 15); }
                            ends.remove(&id);
                        }
                        Action::SpawnShell { id, .. } if !ends.contains_key(&id) && c.jobs[&id].state == JobState::Run => {
                            ends.insert(id, now + runtime[&id]);
                        }
                        _ => {}
                    }
                }
            }
            // The promise.
            if let Some(r) = c.reservation() {
                let first = *promised.entry(r.id).or_insert(r.start);
                prop_assert!(r.start <= first + 1e-9, "reservation of {} moved later: {} > {first}", r.id, r.start);
            }
            for (id, p) in &promised {
                if let Some(started) = c.jobs[id].t_run {
                    prop_assert!(started <= *p + 1e-9, "job {id} reserved for {p} started at {started}");
                }
            }
            for rp in c.pool.ranks.values() {
                prop_assert!(rp.alloc_cores.is_subset(&rp.cores));
            }
            // Next event.
            let next = [arrivals.last().map(|a| a.0), c.next_deadline(), ends.values().copied().min_by(f64::total_cmp)]
                .into_iter().flatten().min_by(f64::total_cmp);
            match next {
                Some(n) => now = n.max(now),
                None => break,
            }
        }
        prop_assert!(c.jobs.values().all(|j| j.state == JobState::Inactive), "every job ends");
        prop_assert!(c.pool.ranks.values().all(|p| p.alloc_cores.is_empty()), "nothing leaks");
    }
}

/// Measurement, not a check (`cargo test -p vigil --lib throughput_at_depth -- --ignored --nocapture`): `n`
/// one-core `true` jobs submitted at once to 4 ranks of 2 cores, each run to the end as rank 0's broker would
/// (shell spawned, shell exit, `next_deadline` after every input); prints jobs/s of the job core alone.
#[test]
#[ignore]
fn throughput_at_depth() {
    for n in [200u32, 10_000, 64_000] {
        let mut c = core(4, 2, 0);
        let t0 = std::time::Instant::now();
        let mut t = T0;
        let mut live: VecDeque<(JobId, u32)> = VecDeque::new();
        for _ in 0..n {
            t += 1e-6;
            c.submit(t, SubmitRequest::new(&spec(cmd()), 0)).unwrap();
            let _ = c.next_deadline();
        }
        let submitted = t0.elapsed();
        let mut done = 0;
        loop {
            for a in actions(&mut c) {
                if let Action::SpawnShell { id, rank, .. } = a {
                    live.push_back((id, rank));
                }
            }
            let Some((id, rank)) = live.pop_front() else { break };
            t += 1e-6;
            c.shell_spawned(t, id, rank, Ok(()));
            let _ = c.next_deadline();
            exit_shell(&mut c, t, id, rank, 0);
            let _ = c.next_deadline();
            done += 1;
        }
        assert_eq!(done, n);
        let all = t0.elapsed();
        println!(
            "{n:>6} jobs: submit {:.0} jobs/s, submit-to-last-inactive {:.0} jobs/s",
            f64::from(n) / submitted.as_secs_f64(),
            f64::from(n) / all.as_secs_f64()
        );
    }
}
