//! The instance's resources as the job core sees them (RFC 44 resource eventlog): ranks online, drained (by an
//! admin, [`DrainMode`], or by a health check), torpid, down or lost. A lost rank under a running job applies the
//! critical-rank rules: fatal for a critical rank, a `node-failure` exception and a partial release (RFC 32)
//! otherwise.

use super::{Action, Job, JobCore, JobId};
use crate::eventlog::Event;
use crate::idset::IdSet;
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// What [`JobCore::drain`] does with a rank that is drained already (`flux resource drain` and its `--force`,
/// `--update`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DrainMode {
    /// Refuse the whole request, naming the ranks drained already and their reasons (the default).
    #[default]
    Refuse,
    /// Drain them again: the new reason and time replace theirs.
    Force,
    /// Drain only the ranks not drained yet; the others keep their reasons.
    Update,
}

impl JobCore {
    /// A broker joined with its node's resources (RFC 44 `online`).
    pub fn rank_online(
        &mut self,
        now: f64,
        rank: u32,
        hostname: &str,
        cores: IdSet,
        gpus: IdSet,
        topology: (String, Option<u32>),
    ) {
        if self.pool.ranks.get(&rank).is_some_and(|p| p.removed) {
            return; // left the instance for good (shrink.rs)
        }
        // New: its first join since this rank 0 started (a rank known from the state directory counted too).
        let new = !self.pool.ranks.contains_key(&rank) || self.saved.ranks_restored.remove(&rank);
        self.saved.ranks_expected.remove(&rank);
        let changed =
            self.pool.ranks.get(&rank).is_none_or(|p| p.hostname != hostname || p.cores != cores || p.gpus != gpus);
        if changed && self.journaling() {
            self.saved.ranks_dirty.insert(rank);
        }
        self.pool.add_rank(rank, hostname, cores, gpus);
        // Jobs re-attached after a restart hold their resources here again before anything is placed (reattach.rs).
        self.reattach_rank(rank, new);
        if let Some((reason, at)) = self.saved.drains.remove(&rank) {
            // Drained before rank 0 restarted (journal.rs): drained again, with its reason.
            if let Some(p) = self.pool.ranks.get_mut(&rank) {
                p.drained = Some(reason);
                p.drained_at = Some(at);
            }
        }
        self.topology.insert(rank, topology);
        self.resource_eventlog.push(Event::with_time(now, "online", json!({"idset": rank.to_string()})));
        self.schedule(now);
    }

    /// `rank`, online again just now ([`JobCore::rank_online`]), registered under `parent`, which is not its
    /// static parent (it was adopted, and rank 0 restarted): its `online` event says so, so that a later restart
    /// of rank 0 knows where it is ([`super::journal::pending_orphans`]).
    pub fn online_under(&mut self, rank: u32, parent: u32) {
        let Some(e) = self.resource_eventlog.last_mut() else { return };
        if e.name == "online" && e.context.get("idset").and_then(Value::as_str) == Some(rank.to_string().as_str()) {
            e.context.insert("parent".into(), json!(parent));
        }
    }

    /// Drain `ranks` with `reason` (`flux resource drain`): no new work is placed on them. A rank drained already
    /// is refused, naming it, unless `mode` says otherwise ([`DrainMode`]). The resource eventlog's `drain` event
    /// names the ranks whose reason it set.
    ///
    /// # Errors
    /// Ranks not in the instance, no ranks, or ranks drained already under [`DrainMode::Refuse`] (named, with
    /// their reasons).
    pub fn drain(&mut self, now: f64, ranks: &IdSet, reason: &str, mode: DrainMode) -> Result<(), String> {
        self.check_ranks(ranks)?;
        let drained = |r: &u32| self.pool.ranks.get(r).is_some_and(|p| p.drained.is_some());
        let ranks: IdSet = match mode {
            DrainMode::Refuse => {
                let already: Vec<String> = ranks
                    .iter()
                    .filter(drained)
                    .map(|r| format!("{r} ({})", self.pool.ranks[&r].drained.as_deref().unwrap_or("")))
                    .collect();
                if !already.is_empty() {
                    return Err(format!(
                        "rank(s) already drained: {}; --force sets the new reason, --update drains only the others",
                        already.join(", ")
                    ));
                }
                ranks.clone()
            }
            DrainMode::Force => ranks.clone(),
            DrainMode::Update => ranks.iter().filter(|r| !drained(r)).collect(),
        };
        if ranks.is_empty() {
            return Ok(());
        }
        for r in ranks.iter() {
            if let Some(p) = self.pool.ranks.get_mut(&r) {
                p.drained = Some(reason.to_string());
                p.drained_at = Some(now);
            }
        }
        self.resource_eventlog.push(Event::with_time(
            now,
            "drain",
            json!({"idset": ranks.to_string(), "reason": reason}),
        ));
        self.sched_dirty = true;
        Ok(())
    }

    /// Return drained `ranks` to service.
    pub fn undrain(&mut self, now: f64, ranks: &IdSet) -> Result<(), String> {
        self.check_ranks(ranks)?;
        let not: IdSet = ranks.iter().filter(|r| self.pool.ranks.get(r).is_some_and(|p| p.drained.is_none())).collect();
        if !not.is_empty() {
            return Err(format!("rank(s) {not} not drained"));
        }
        for r in ranks.iter() {
            if let Some(p) = self.pool.ranks.get_mut(&r) {
                p.drained = None;
                p.drained_at = None;
            }
        }
        self.resource_eventlog.push(Event::with_time(now, "undrain", json!({"idset": ranks.to_string()})));
        self.schedule(now);
        Ok(())
    }

    /// A health check drains `rank` with `reason` (which starts with [`crate::health::REASON_PREFIX`]; a
    /// broker's `resource.drain` with `"by": "health"`): drained if it is not, given the new reason if a health
    /// check drained it with another, left alone if an admin drained it (the admin's reason stays, and the later
    /// undrain by the check will not undo it). Returns whether the drain or its reason changed.
    ///
    /// # Errors
    /// `rank` is not in the instance (it has not registered).
    pub fn health_drain(&mut self, now: f64, rank: u32, reason: &str) -> Result<bool, String> {
        let ranks: IdSet = [rank].into_iter().collect();
        self.check_ranks(&ranks)?;
        match self.pool.ranks[&rank].drained.as_deref() {
            Some(r) if r == reason || !r.starts_with(crate::health::REASON_PREFIX) => Ok(false),
            _ => self.drain(now, &ranks, reason, DrainMode::Force).map(|()| true),
        }
    }

    /// A health check passes on `rank`: undrained if a health check drained it (its reason starts with
    /// [`crate::health::REASON_PREFIX`]), else left as it is. Returns whether it was undrained.
    ///
    /// # Errors
    /// `rank` is not in the instance.
    pub fn health_undrain(&mut self, now: f64, rank: u32) -> Result<bool, String> {
        let ranks: IdSet = [rank].into_iter().collect();
        self.check_ranks(&ranks)?;
        match self.pool.ranks[&rank].drained.as_deref() {
            Some(r) if r.starts_with(crate::health::REASON_PREFIX) => self.undrain(now, &ranks).map(|()| true),
            _ => Ok(false),
        }
    }

    fn check_ranks(&self, ranks: &IdSet) -> Result<(), String> {
        let bad: IdSet = ranks.iter().filter(|r| !self.pool.ranks.contains_key(r)).collect();
        if ranks.is_empty() {
            return Err("no ranks given".into());
        }
        if bad.is_empty() {
            Ok(())
        } else {
            Err(format!("rank(s) {bad} not in this instance"))
        }
    }

    /// Ranks became torpid (`true`: no new work placed there) or lively again (`false`); RFC 44 events.
    pub fn ranks_torpid(&mut self, now: f64, ranks: &IdSet, torpid: bool) {
        for r in ranks.iter() {
            if let Some(p) = self.pool.ranks.get_mut(&r) {
                p.torpid = torpid;
            }
        }
        let name = if torpid { "torpid" } else { "lively" };
        self.resource_eventlog.push(Event::with_time(now, name, json!({"idset": ranks.to_string()})));
        if torpid {
            self.sched_dirty = true;
        } else {
            self.schedule(now);
        }
    }

    /// Critical broker ranks of a job: every shell of an ordinary job; for a nested instance (a batch or alloc
    /// job), the ranks it reported (its rank 0, and its routers if its brokers do not re-parent), mapped to this
    /// instance's ranks. Until it reports them (its `memo`, once every broker of it has joined or been lost), the
    /// ranks its jobspec's shape says it will report (`attributes.system.instance`,
    /// [`crate::jobspec::NestedInstance`]), so that a node lost during its start-up is judged as it would be a
    /// moment later.
    pub fn critical_ranks(job: &Job) -> IdSet {
        if let Some(c) = job
            .instance
            .as_ref()
            .and_then(|i| i.get("critical_broker_ranks"))
            .and_then(Value::as_str)
            .and_then(|s| IdSet::parse(s).ok())
        {
            return c;
        }
        match &job.req.instance {
            // The nested instance numbers its brokers in the order of the job's shells (shell_rank).
            Some(shape) if !job.shells.is_empty() => {
                let size = job.shells.len() as u32;
                let inner = crate::broker::reparent::critical_ranks(shape.topo(size), size, shape.reparent);
                job.shells.values().filter(|s| inner.contains(s.shell_rank)).map(|s| s.rank).collect()
            }
            // `-o on-node-loss=notify`: none (the job fails only when no shell of it is left, jobs_lose_ranks).
            _ if job.req.on_node_loss == crate::jobspec::OnNodeLoss::Notify => IdSet::new(),
            _ => job.shells.keys().copied().collect(),
        }
    }

    /// Brokers on `ranks` were lost (a whole subtree). Their resources go down. For every running job with a
    /// shell there: losing a critical rank raises a fatal `exec` exception (severity 0; a `--requeue` job then goes
    /// back to the queue, `requeue.rs`); losing any other raises a `node-failure` exception (severity 2), releases
    /// the lost ranks' resources early (RFC 32 partial release), tells the job's leader shell, and the job keeps
    /// running on the survivors. A nested instance then shrinks (`shrink.rs`).
    ///
    /// An ordinary job's shells are all critical unless it asked to survive (`-o on-node-loss=notify`,
    /// [`crate::jobspec::OnNodeLoss`]): then none is, the job fails only when no shell of it is left running, and
    /// every surviving shell (not only the leader) is told, with the lost task ranks and host names, so that it can
    /// raise the PMIx event to its tasks.
    pub fn ranks_lost(&mut self, now: f64, ranks: &IdSet) {
        self.ranks_down(now, ranks, "lost", "")
    }

    /// Like [`JobCore::ranks_lost`], recording why in the RFC 44 `offline` event: `state` is `lost` (failure) or
    /// `offline` (the broker left), `reason` the membership verdict.
    pub fn ranks_down(&mut self, now: f64, ranks: &IdSet, state: &str, reason: &str) {
        for r in ranks.iter() {
            if let Some(p) = self.pool.ranks.get_mut(&r) {
                p.up = false;
                p.torpid = false;
            }
        }
        let mut ctx = json!({"idset": ranks.to_string(), "state": state});
        if !reason.is_empty() {
            ctx["reason"] = json!(reason);
        }
        self.resource_eventlog.push(Event::with_time(now, "offline", ctx));
        // The jobs with a live shell on a lost rank, from the index (not a scan of every job).
        let mut hit: BTreeMap<JobId, Vec<u32>> = BTreeMap::new();
        for r in ranks.iter() {
            for id in self.by_rank.get(&r).into_iter().flatten() {
                hit.entry(*id).or_default().push(r);
            }
        }
        self.jobs_lose_ranks(now, hit);
        if self.config.shrink {
            self.shrink(now, ranks);
        }
        self.schedule(now);
    }

    /// The lost-rank rules of [`JobCore::ranks_lost`] for each job and the ranks it lost (shells there).
    ///
    /// The exception's note names each node once, as its host name and its rank in this instance, and says what
    /// of the job ran there (`lost node node3 (rank 3), where task 2 ran`; of a batch or alloc job, `where rank 2
    /// of the job's instance ran`); its context also carries `ranks` (an idset) and `hosts` (a host list) of the
    /// lost nodes, which `vigil job info` gathers ([`Job::info`]).
    pub(super) fn jobs_lose_ranks(&mut self, now: f64, hit: BTreeMap<JobId, Vec<u32>>) {
        self.jobs_lose_ranks_as(now, hit, "lost")
    }

    /// [`JobCore::jobs_lose_ranks`], the notes saying `cause` where a loss says `lost` (`fabric-down on`: the
    /// node lives, its job network does not, `fabric.rs`).
    pub(super) fn jobs_lose_ranks_as(&mut self, now: f64, hit: BTreeMap<JobId, Vec<u32>>, cause: &str) {
        for (id, lost) in hit {
            let Some(job) = self.jobs.get(&id) else { continue };
            let critical = Self::critical_ranks(job);
            let lost_set: IdSet = lost.iter().copied().collect();
            let what = self.describe_lost(job, &lost_set);
            let notify = job.req.on_node_loss == crate::jobspec::OnNodeLoss::Notify;
            // Under `on-node-loss=notify` no shell is critical, but a job with no shell left running has failed.
            let none_left = job.shells.iter().all(|(r, s)| s.exited || lost_set.contains(*r));
            let fatal = lost.iter().any(|r| critical.contains(*r)) || (notify && none_left);
            let nested = job.instance.is_some() || job.req.instance.is_some();
            let hosts: crate::hostlist::Hostlist = lost.iter().map(|r| self.hostname(*r)).collect();
            // The lost shells' ranks, which are the lost brokers' ranks in a batch or alloc job's own instance:
            // its rank 0 reads them from this exception to stop waiting for them during its start-up.
            let shell_set: IdSet = lost.iter().filter_map(|r| job.shells.get(r).map(|s| s.shell_rank)).collect();
            // The job's tasks that ran there (none for a batch or alloc job, whose tasks are its brokers).
            let tasks: Vec<u32> = if nested { Vec::new() } else { Self::tasks_on(job, &lost_set) };
            let task_set: IdSet = tasks.iter().copied().collect();
            let ctx = |note: &str, severity: u32| {
                let mut c = json!({"type": "node-failure", "severity": severity, "note": note,
                       "ranks": lost_set.to_string(), "hosts": hosts.to_string(),
                       "shell_ranks": shell_set.to_string()});
                if !nested {
                    c["tasks"] = json!(task_set.to_string());
                }
                c
            };
            // In the job's own instance (a batch or alloc job): its ranks are the shell ranks.
            let inner: Vec<String> = lost
                .iter()
                .filter_map(|r| job.shells.get(r).map(|s| format!("{} (rank {})", self.hostname(*r), s.shell_rank)))
                .collect();
            for r in &lost {
                self.shell_gone(id, *r);
            }
            if fatal {
                let mut note = format!("{cause} {what}");
                if notify && none_left && !nested {
                    note.push_str("; no node of the job is left");
                }
                if nested {
                    note.push_str("; the job's instance cannot go on without it");
                }
                if let Some(more) = self.arm_requeue(id, &what) {
                    note = format!("{note}; {more}");
                }
                self.raise_ctx(now, id, ctx(&note, 0), true);
            } else {
                let note = format!("{cause} {what}; the job continues on the remaining nodes");
                self.raise_ctx(now, id, ctx(&note, 2), false);
                let Some(j) = self.jobs.get(&id) else { continue };
                let running: Vec<(u32, u32)> =
                    j.shells.values().filter(|s| !s.exited).map(|s| (s.shell_rank, s.rank)).collect();
                let leader = running.iter().min().map(|(_, r)| *r);
                let lost_shells: Vec<(u32, String)> =
                    lost.iter().filter_map(|r| j.shells.get(r).map(|s| (s.shell_rank, self.hostname(*r)))).collect();
                self.release_partly(now, id, &lost_set);
                // The leader says it on the job's stderr; under `notify` every survivor passes it to its tasks.
                let told: Vec<u32> =
                    if notify { running.iter().map(|(_, r)| *r).collect() } else { Vec::from_iter(leader) };
                let nodes = if inner.len() == 1 { "node" } else { "nodes" };
                // A batch or alloc job's leader speaks in its instance's terms; an ordinary job's as the exception.
                let note = if nested {
                    format!("this instance lost {nodes} {}; it continues on the remaining nodes", inner.join(", "))
                } else {
                    note
                };
                for rank in told {
                    self.actions.push_back(Action::NotifyShell {
                        id,
                        rank,
                        leader: Some(rank) == leader,
                        lost_shells: lost_shells.iter().map(|(s, _)| *s).collect(),
                        tasks: tasks.clone(),
                        hosts: lost_shells.iter().map(|(_, h)| h.clone()).collect(),
                        note: note.clone(),
                    });
                }
            }
            self.maybe_finish(now, id);
        }
    }

    /// Give `ranks` of running job `id` back to the pool while the job goes on without them (RFC 32's
    /// `release{final:false}`): a node lost under a job that survives it, a nested instance's broker that failed
    /// on a node that lives on (nested.rs). Nothing for ranks released already.
    pub(super) fn release_partly(&mut self, now: f64, id: JobId, ranks: &IdSet) {
        let Some(j) = self.jobs.get_mut(&id) else { return };
        let ranks: IdSet =
            ranks.iter().filter(|r| !j.released.contains(*r) && j.alloc.iter().any(|a| a.rank == *r)).collect();
        if ranks.is_empty() {
            return;
        }
        j.post(now, "release", json!({"ranks": ranks.to_string(), "final": false}));
        let alloc = j.held();
        j.released = j.released.union(&ranks);
        self.pool.free(&alloc, Some(&ranks));
        self.actions.push_back(Action::Updated(id));
        self.sched_dirty = true;
    }

    /// The host name of broker rank `rank` (`?` if it never joined).
    pub(super) fn hostname(&self, rank: u32) -> String {
        self.pool.ranks.get(&rank).map_or_else(|| "?".to_string(), |p| p.hostname.clone())
    }

    /// The task ranks of each of `job`'s shells, by shell rank, from its task map (or, after a restart of rank 0,
    /// the one its `start` event carries); `None` when it has none.
    fn tasks_by_shell(job: &Job) -> Option<Vec<Vec<u32>>> {
        let map = job.taskmap.clone().or_else(|| {
            job.eventlog.iter().rev().find(|e| e.name == "start").and_then(|e| e.context.get("taskmap").cloned())
        });
        map.and_then(|m| crate::taskmap::Taskmap::decode(&m).ok()).map(|m| {
            let n = job.shells.values().map(|s| s.shell_rank as usize + 1).max().unwrap_or(0);
            m.tasks_by_node(n)
        })
    }

    /// The task ranks of `job` that ran on broker `ranks` (its shells there), in order.
    fn tasks_on(job: &Job, ranks: &IdSet) -> Vec<u32> {
        let Some(by_shell) = Self::tasks_by_shell(job) else { return Vec::new() };
        let mut out: Vec<u32> = ranks
            .iter()
            .filter_map(|r| job.shells.get(&r))
            .filter_map(|s| by_shell.get(s.shell_rank as usize))
            .flatten()
            .copied()
            .collect();
        out.sort_unstable();
        out
    }

    /// `node node3 (rank 3), where task 2 ran` for the lost `ranks` of `job` (`nodes ..., where tasks 4-5 ran,
    /// and ...`); of a batch or alloc job, `where rank 2 of the job's instance ran`. Ranks are this instance's.
    fn describe_lost(&self, job: &Job, ranks: &IdSet) -> String {
        let by_node = Self::tasks_by_shell(job);
        let parts: Vec<String> = ranks
            .iter()
            .map(|r| {
                let node = format!("{} (rank {r})", self.hostname(r));
                let Some(sh) = job.shells.get(&r) else { return node };
                if job.instance.is_some() || job.req.instance.is_some() {
                    return format!("{node}, where rank {} of the job's instance ran", sh.shell_rank);
                }
                match by_node.as_ref().and_then(|b| b.get(sh.shell_rank as usize)) {
                    Some(tasks) if !tasks.is_empty() => {
                        let set: IdSet = tasks.iter().copied().collect();
                        let word = if tasks.len() == 1 { "task" } else { "tasks" };
                        format!("{node}, where {word} {set} ran")
                    }
                    _ => node,
                }
            })
            .collect();
        let nodes = if parts.len() == 1 { "node" } else { "nodes" };
        format!("{nodes} {}", parts.join("; "))
    }
}
