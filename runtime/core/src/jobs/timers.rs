//! Time limits, exit-timeout and SIGKILL escalation, fired from an ordered index of deadlines.
//!
//! Each RUN or CLEANUP job is filed in [`JobCore`]'s timer index under its next deadline ([`JobCore::rearm`]
//! after anything that moves it), so [`JobCore::next_deadline`] is the first entry and
//! [`JobCore::handle_timeout`] visits only the jobs whose deadline has come, however many jobs there are. A job's
//! next deadline is the earliest of:
//!
//! - its warning before the time limit (`--signal=SIG@TIME`, the shell option `signal`, Flux's and Slurm's): at
//!   `expiration - timeleft`, once per run, SIG goes to the tasks of every shell still running (a `signal` event
//!   in the eventlog: `signum`, `timeleft`); submit refused a `timeleft` not below the time limit;
//! - its time limit expiry (R's `expiration`): fatal `timelimit` exception;
//! - the first task's exit plus its `exit-timeout`, counted from when every shell had started if one had not
//!   yet (`JobCore::task_exit`): fatal `exec` exception naming the ranks whose shells are still running;
//! - a cut-off nested broker's verdict (`nested.rs`);
//! - once SIGTERM was sent (any fatal exception), SIGTERM plus the job's kill timeout (`-o kill-timeout`, else
//!   `exec.kill-timeout`): SIGKILL to what is left.

use super::{Action, JobCore, JobId, JobState};
use std::cmp::Ordering;

/// Hosts an exit-timeout exception names at most (its ranks are all named, as an idset).
const HOSTS_NAMED: usize = 8;

/// A deadline, seconds since the epoch, ordered by [`f64::total_cmp`] (deadlines are finite or `inf`).
#[derive(Clone, Copy, Debug)]
pub(super) struct Due(pub(super) f64);

impl PartialEq for Due {
    fn eq(&self, o: &Due) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Due {}
impl PartialOrd for Due {
    fn partial_cmp(&self, o: &Due) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Due {
    fn cmp(&self, o: &Due) -> Ordering {
        self.0.total_cmp(&o.0)
    }
}

impl JobCore {
    /// The next deadline of job `id` (see the module doc), `None` when nothing is due for it.
    fn deadline_of(&self, id: JobId) -> Option<f64> {
        let j = self.jobs.get(&id)?;
        if !(j.state == JobState::Run || j.state == JobState::Cleanup) {
            return None;
        }
        if j.term_sent.is_some() {
            return (!j.kill_sent).then(|| j.term_sent.unwrap_or(0.0) + self.kill_timeout_of(j));
        }
        let exit = match (j.exit_clock, j.exit_timeout) {
            (Some(f), Some(t)) => Some(f + t),
            _ => None,
        };
        let warn = match (j.req.signal, j.expiration) {
            (Some(w), Some(e)) if !j.warned && j.state == JobState::Run => Some(e - w.timeleft),
            _ => None,
        };
        [warn, j.expiration, exit, self.cut_off_deadline(id)].into_iter().flatten().min_by(f64::total_cmp)
    }

    /// Seconds from SIGTERM to SIGKILL for job `j`: its own `kill-timeout` if it set one (submit held it to
    /// `exec.kill-timeout-max`), else the instance's `exec.kill-timeout`.
    pub(super) fn kill_timeout_of(&self, j: &super::Job) -> f64 {
        j.kill_timeout.unwrap_or(self.kill_timeout)
    }

    /// File job `id` under its current next deadline (after anything that may have moved it).
    pub(super) fn rearm(&mut self, id: JobId) {
        let due = self.deadline_of(id).filter(|t| !t.is_nan());
        let Some(job) = self.jobs.get_mut(&id) else { return };
        if job.armed == due {
            return;
        }
        if let Some(old) = job.armed.take() {
            self.timers.remove(&(Due(old), id));
        }
        if let Some(t) = due {
            job.armed = Some(t);
            self.timers.insert((Due(t), id));
        }
    }

    /// The earliest time [`JobCore::handle_timeout`] must run, if any.
    pub fn next_deadline(&self) -> Option<f64> {
        let first = self.timers.first().map(|(d, _)| d.0).filter(|t| t.is_finite());
        let rejoin = self.awaiting_ranks().then_some(self.saved.rejoin_until);
        [
            first,
            self.reattach_deadline(),
            self.purge_deadline(),
            rejoin,
            self.depend_deadline(),
            self.history_deadline(),
        ]
        .into_iter()
        .flatten()
        .min_by(f64::total_cmp)
    }

    /// Fire every rule whose time has come: time limits, exit-timeout, SIGKILL escalation, purges of INACTIVE
    /// jobs (`purge.rs`).
    pub fn handle_timeout(&mut self, now: f64) {
        self.purge_due(now);
        self.history_due(now);
        if self.awaiting_ranks() && self.saved.rejoin_until <= now {
            // Ranks that were up when rank 0 stopped and are not back yet: scheduled without (journal.rs).
            self.saved.ranks_expected.clear();
            self.schedule(now);
        }
        if self.reattach_deadline().is_some_and(|t| t <= now) {
            self.reattach_expire(now);
        }
        if self.depend_timeout(now) {
            self.schedule(now); // begin times came (depend.rs)
        }
        while let Some(&(Due(t), id)) = self.timers.first() {
            if t > now {
                break;
            }
            self.timers.remove(&(Due(t), id));
            if let Some(j) = self.jobs.get_mut(&id) {
                j.armed = None;
            }
            self.fire(now, id);
            self.rearm(id);
        }
    }

    /// The rules of the module doc for job `id`, whose deadline has come.
    fn fire(&mut self, now: f64, id: JobId) {
        if self.cut_off_deadline(id).is_some_and(|t| now >= t) {
            self.judge_cut_offs(now, id, false);
        }
        let Some(j) = self.jobs.get(&id) else { return };
        if !(j.state == JobState::Run || j.state == JobState::Cleanup) {
            return;
        }
        if j.term_sent.is_none() {
            self.warn_due(now, id);
            let Some(j) = self.jobs.get(&id) else { return };
            if j.expiration.is_some_and(|e| now >= e) {
                let lim = fmt_limit(j.req.duration.unwrap_or(0.0));
                self.raise(now, id, "timelimit", 0, &format!("job exceeded its time limit of {lim}"));
            } else if let (Some(f), Some(t)) = (j.exit_clock, j.exit_timeout) {
                if now >= f + t {
                    let lim = fmt_limit(t);
                    // Each shell's task ranks are those the job's task map gave it; a shell reports its end only
                    // when all of its tasks have ended, so of a shell with several, one or more still run.
                    let mut shells: Vec<_> = j.shells.values().collect();
                    shells.sort_by_key(|s| s.shell_rank);
                    let mut named = Vec::new();
                    let mut running = 0;
                    for s in shells {
                        if s.exited {
                            continue;
                        }
                        running += 1;
                        if named.len() < HOSTS_NAMED {
                            let host = self.pool.ranks.get(&s.rank).map_or("?", |p| p.hostname.as_str());
                            let t = match s.tasks.len() {
                                0 => String::new(),
                                1 => format!(", task {}", s.tasks),
                                _ => format!(", one or more of tasks {}", s.tasks),
                            };
                            named.push(format!("{host} (broker rank {}{t})", s.rank));
                        }
                    }
                    let more = if running > named.len() { ", ..." } else { "" };
                    let note = format!(
                        "exit-timeout ({lim}) expired: tasks still running on {running} of {} nodes after the first \
                         task exited: {}{more}",
                        j.shells.len(),
                        named.join(", "),
                    );
                    self.raise(now, id, "exec", 0, &note);
                }
            }
        } else if !j.kill_sent && now >= j.term_sent.unwrap_or(0.0) + self.kill_timeout_of(j) {
            let ranks: Vec<u32> = j.shells.values().filter(|s| !s.exited).map(|s| s.rank).collect();
            if let Some(j) = self.jobs.get_mut(&id) {
                j.kill_sent = true;
            }
            if !ranks.is_empty() {
                self.actions.push_back(Action::SignalShells { id, ranks, signal: crate::signal::SIGKILL });
            }
        }
    }
}

impl JobCore {
    /// Job `id`'s warning signal, if it has one, its time has come and it was not sent in this run: to the
    /// shells still running, recorded as a `signal` event.
    fn warn_due(&mut self, now: f64, id: JobId) {
        let Some(j) = self.jobs.get_mut(&id) else { return };
        let (Some(w), Some(e)) = (j.req.signal, j.expiration) else { return };
        if j.warned || j.state != JobState::Run || now < e - w.timeleft {
            return;
        }
        j.warned = true;
        let ranks: Vec<u32> = j.shells.values().filter(|s| !s.exited).map(|s| s.rank).collect();
        let name = crate::jobspec::signal_label(w.signum);
        j.post(now, "signal", serde_json::json!({"signum": w.signum, "signal": name, "timeleft": w.timeleft}));
        if !ranks.is_empty() {
            self.actions.push_back(Action::SignalShells { id, ranks, signal: w.signum });
        }
        self.actions.push_back(Action::Updated(id));
    }
}

/// A time limit in RFC 23 form (`10m`, `2h`, `1.5s`), or as seconds if it is no duration (too large, negative).
fn fmt_limit(secs: f64) -> String {
    std::time::Duration::try_from_secs_f64(secs)
        .map(crate::duration::format_duration)
        .unwrap_or_else(|_| format!("{secs}s"))
}
