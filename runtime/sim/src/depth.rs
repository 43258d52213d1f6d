//! Cost per job with many jobs queued, measured in-process (dev only; `vigil-bench jobcore`, issue 19).
//!
//! Two harnesses, each keeping `depth` jobs pending while `jobs` more go through submit, alloc, start, finish and
//! INACTIVE, so that the figure is the steady cost of one job at that depth (a job is submitted each time one
//! ends):
//! - [`core_cycle`]: the sans-IO [`JobCore`] alone, driven directly (no broker, no messages);
//! - [`broker_cycle`]: rank 0's real broker code in the simulator ([`Sim`]): 4 brokers, submissions as client
//!   requests, shells started by `rexec` on each rank and reporting back over the overlay, EASY backfill.
//!
//! Both use the `vigil-bench sched` instance's shape (4 ranks of 2 cores, 1-core `true` jobs, so 8 run at once)
//! and count what the job core examined ([`JobCore::examined`]), which is what the regression test in
//! `jobs/tests_sched.rs` bounds.

use super::{Config, Sim};
use crate::jobs::{Action, JobCore, JobId, SubmitRequest};
use crate::jobspec::JobspecBuilder;
use crate::shellproto::{ShellExit, ShellReport};
use crate::topology::Topology;
use serde_json::Value;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Ranks and cores per rank of the measured instance (as `vigil start --test-size=4` on a 2-core machine).
pub const RANKS: u32 = 4;
/// Cores per rank.
pub const CORES: u32 = 2;

/// What one run measured.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Figures {
    /// Jobs kept pending.
    pub depth: usize,
    /// Jobs measured (each went from submit to INACTIVE while `depth` stayed pending).
    pub jobs: usize,
    /// Wall time per measured job, nanoseconds.
    pub ns_per_job: f64,
    /// Pending jobs the scheduler looked at per measured job.
    pub examined_per_job: f64,
    /// Jobs held by the core at the end (pending, running and INACTIVE).
    pub held: usize,
}

/// The jobspec every measured job has: `true`, one task on one core.
pub fn true_spec() -> Value {
    let s = JobspecBuilder::new(vec!["true".to_string()]).build().expect("a valid jobspec").to_json();
    serde_json::from_str(&s).expect("jobspec JSON")
}

/// A job core of [`RANKS`] ranks of [`CORES`] cores, at time `t`.
pub fn fresh_core(t: f64) -> JobCore {
    let mut c = JobCore::new(t);
    for r in 0..RANKS {
        c.rank_online(
            t,
            r,
            &format!("node{r}"),
            (0..CORES).collect(),
            crate::idset::IdSet::new(),
            ("live".into(), None),
        );
    }
    c
}

/// The job core alone: `depth` jobs pending, then `jobs` jobs through their whole life, one submitted as each
/// ends. Shells start and exit at once (in order of their start), as `true` does.
pub fn core_cycle(depth: usize, jobs: usize) -> Figures {
    let spec = true_spec();
    let mut t = 1_000_000.0;
    let mut c = fresh_core(t);
    let mut shells: VecDeque<(JobId, u32)> = VecDeque::new();
    let drain = |c: &mut JobCore, shells: &mut VecDeque<(JobId, u32)>, t: f64| {
        while let Some(a) = c.poll_action() {
            if let Action::SpawnShell { id, rank, .. } = a {
                c.shell_spawned(t, id, rank, Ok(()));
                shells.push_back((id, rank));
            }
        }
    };
    let running = (RANKS * CORES) as usize;
    for _ in 0..depth + running {
        c.submit(t, SubmitRequest::new(&spec, 1000)).expect("submit");
    }
    drain(&mut c, &mut shells, t);
    let examined0 = c.examined();
    let t0 = Instant::now();
    for _ in 0..jobs {
        t += 1e-4;
        let (id, rank) = shells.pop_front().expect("a running shell");
        let report = ShellReport { status: 0, tasks: vec![], error: None, abort_code: None, usage: None, ended: None };
        c.shell_exit(
            t,
            ShellExit { id: id.0, rank, report: Some(report), shell_status: 0, ended: None, unkillable: vec![] },
        );
        drain(&mut c, &mut shells, t);
        c.submit(t, SubmitRequest::new(&spec, 1000)).expect("submit");
        drain(&mut c, &mut shells, t);
    }
    let el = t0.elapsed();
    Figures {
        depth,
        jobs,
        ns_per_job: el.as_nanos() as f64 / jobs as f64,
        examined_per_job: (c.examined() - examined0) as f64 / jobs as f64,
        held: c.jobs.len(),
    }
}

/// Rank 0's broker in the simulator: `depth` jobs pending, then `jobs` through their whole life. Every virtual
/// millisecond the client tops the queue back up with one submission per job that ended.
pub fn broker_cycle(depth: usize, jobs: usize) -> Figures {
    let mut cfg = Config::new(RANKS, Topology::Kary(2), 1);
    cfg.cores = CORES;
    cfg.sched_policy = crate::attrs::SchedPolicy::Easy;
    let mut sim = Sim::new(cfg);
    sim.boot();
    let mut t = Duration::from_secs(2);
    sim.run_until(super::Time::ZERO + t);
    let payload = serde_json::json!({"jobspec": true_spec()});
    let running = (RANKS * CORES) as usize;
    let submit = |sim: &mut Sim, t: Duration, n: usize| {
        for _ in 0..n {
            sim.request_at(super::Time::ZERO + t, "job-manager.submit", 0, &payload);
        }
    };
    let inactive = |sim: &Sim| {
        let jc = sim.broker(0).and_then(|b| b.jobcore.as_ref()).expect("rank 0's job core");
        let (pending, running, held) = jc.counts();
        (held - pending - running, jc.examined())
    };
    // Keep depth + running jobs submitted and not yet INACTIVE: top the queue up every virtual millisecond.
    let mut submitted = 0;
    let mut top_up = |sim: &mut Sim, t: Duration, done: usize| {
        let want = (depth + running).saturating_sub(submitted - done);
        submit(sim, t, want);
        submitted += want;
    };
    top_up(&mut sim, t, 0);
    // Let the whole queue in before measuring.
    while sim.responses.len() < depth + running {
        t += Duration::from_millis(1);
        sim.run_until(super::Time::ZERO + t);
        let done = inactive(&sim).0;
        top_up(&mut sim, t, done);
    }
    let (done0, examined0) = inactive(&sim);
    let t0 = Instant::now();
    loop {
        t += Duration::from_millis(1);
        sim.run_until(super::Time::ZERO + t);
        let (done, _) = inactive(&sim);
        if done - done0 >= jobs {
            break;
        }
        top_up(&mut sim, t, done);
    }
    let el = t0.elapsed();
    let (done, examined) = inactive(&sim);
    let n = done - done0;
    Figures {
        depth,
        jobs: n,
        ns_per_job: el.as_nanos() as f64 / n as f64,
        examined_per_job: (examined - examined0) as f64 / n as f64,
        held: sim.broker(0).and_then(|b| b.jobcore.as_ref()).map_or(0, |jc| jc.jobs.len()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_harnesses_run_jobs_to_the_end() {
        let c = core_cycle(50, 100);
        assert_eq!(c.jobs, 100);
        let b = broker_cycle(50, 40);
        assert!(b.jobs >= 40, "{b:?}");
    }
}
