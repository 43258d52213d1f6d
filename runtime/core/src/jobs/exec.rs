//! The exec system: a job's start (R, its task map, one shell input per node), its shells' reports (spawned,
//! task exit, shell exit, `memo`) and its finish once every shell is gone (`finish`, `release`, `free`, `clean`).

use super::sched::RankAlloc;
use super::{Action, BatchOrder, Exception, JobCore, JobId, JobState, ShellState};
use crate::idset::IdSet;
use crate::jobspec::JobRequest;
use crate::r::{RankResources, Rv1};
use crate::shellproto::{exit_code, ShellExit, ShellInput};
use serde_json::{json, Value};

impl JobCore {
    /// Start pending job `id` on `alloc`, the scheduler's choice (`backfill.rs`): R with the time limit's
    /// expiration, the task map over the nodes, the `alloc` event, and one shell per node ([`JobCore::spawn_shells`]).
    /// A task map that only the nodes show impossible ends the job instead, and its resources go back.
    pub(super) fn start(&mut self, now: f64, id: JobId, alloc: Vec<RankAlloc>) {
        let ranks: Vec<RankResources> = alloc
            .iter()
            .map(|a| RankResources {
                rank: a.rank,
                hostname: self.pool.ranks.get(&a.rank).map(|p| p.hostname.clone()).unwrap_or_default(),
                cores: a.cores.clone(),
                gpus: a.gpus.clone(),
            })
            .collect();
        let Some(job) = self.jobs.get_mut(&id) else { return };
        let expiration = job.req.duration.filter(|d| *d > 0.0).map(|d| now + d);
        let r = Rv1::from_ranks(&ranks, now, expiration.unwrap_or(0.0));
        let counts = block_counts(&job.req, &alloc);
        // The job's task map (RFC 34): the scheme asked for, over the block counts above. Submit checked what it
        // could; what only the nodes reveal (a manual map for a node range) fails the job here, saying why.
        let hostnames: Vec<String> = ranks.iter().map(|r| r.hostname.clone()).collect();
        let layout = job.req.taskmap.layout(&counts, &hostnames);
        let map = match layout {
            Ok(m) => m,
            Err(e) => {
                // Not expected (submit refuses what could fail here): the resources go back and the job ends.
                self.pool.free(&alloc, None);
                let note = format!("attributes.system.shell.options.taskmap: {e}");
                self.drop_pending(now, id, Exception { kind: "exec".into(), severity: 0, note });
                return;
            }
        };
        let by_node = map.tasks_by_node(alloc.len());
        let taskmap = map.to_value();
        self.queue.remove(&id);
        self.running.insert(id);
        for a in &alloc {
            self.by_rank.entry(a.rank).or_default().insert(id);
        }
        let Some(job) = self.jobs.get_mut(&id) else { return };
        job.alloc = alloc.clone();
        job.r = Some(r.clone());
        job.t_run = Some(now);
        job.expiration = expiration;
        job.taskmap = Some(taskmap.clone());
        let rv = serde_json::to_value(&r).unwrap_or(Value::Null);
        job.post(now, "alloc", json!({"R": rv}));
        self.spawn_shells(id, &alloc, &by_node, &taskmap, &rv);
        self.actions.push_back(Action::Updated(id));
        // `after` dependencies on it are met (the pass under way ends with another if one went on to the queue).
        if self.depend_fired(now, id) {
            self.depend.released = true;
        }
        self.rearm(id);
    }

    /// The shells of job `id`, started just now on `alloc` with tasks `by_node` (task ranks by node, in allocation
    /// order): each node's [`ShellState`], and an [`Action::SpawnShell`] with its input (`taskmap`, the RFC 34 map;
    /// `rv`, R as JSON), in allocation order.
    fn spawn_shells(&mut self, id: JobId, alloc: &[RankAlloc], by_node: &[Vec<u32>], taskmap: &Value, rv: &Value) {
        let Some(job) = self.jobs.get_mut(&id) else { return };
        let counts: Vec<u32> = by_node.iter().map(|t| t.len() as u32).collect();
        let ntasks: u32 = counts.iter().sum();
        let nshells = alloc.len() as u32;
        let files = job.files();
        for (i, a) in alloc.iter().enumerate() {
            let (topology, declared_gpus) = self.topology.get(&a.rank).cloned().unwrap_or(("live".into(), None));
            let input = ShellInput {
                id: id.0,
                id_f58: id.f58(),
                shell_rank: i as u32,
                broker_rank: a.rank,
                nshells,
                ntasks,
                first_task: by_node[i].first().copied().unwrap_or(0),
                local_tasks: counts[i],
                // Listed only when they are not one run of ranks (a cyclic, manual or hostfile map).
                tasks: by_node[i].windows(2).any(|w| w[1] != w[0] + 1).then(|| by_node[i].clone()),
                cores: a.cores.iter().collect(),
                gpus: a.gpus.iter().collect(),
                cores_per_task: job.req.cores_per_slot,
                gpus_per_task: job.req.gpus_per_slot,
                userid: Some(job.userid),
                command: job.req.command.clone(),
                environment: job.req.environment.clone(),
                cwd: job.req.cwd.clone(),
                options: job.req.shell_options.clone(),
                taskmap: taskmap.clone(),
                r: rv.clone(),
                topology,
                declared_gpus,
                uri: String::new(),
                tmpdir: None,
                alloc_tmpdir: None,
                files: files.clone(),
                // Input ended with nothing held never grows again (`JobCore::stdin` refuses it): no shell asks.
                stdin: !(job.stdin_eof && job.stdin.is_empty()),
                name: Some(job.display_name().to_string()),
                placement: None,
                imp: job.credential.as_deref().cloned(),
            };
            job.shells.insert(
                a.rank,
                ShellState {
                    shell_rank: i as u32,
                    rank: a.rank,
                    ntasks: counts[i],
                    tasks: by_node[i].iter().copied().collect(),
                    spawned: false,
                    exited: false,
                    status: None,
                    abort_code: None,
                    ended: None,
                    batches: BatchOrder::default(),
                },
            );
            self.actions.push_back(Action::SpawnShell { id, rank: a.rank, input: Box::new(input) });
        }
    }

    /// The broker on `rank` started (Ok) or failed to start (Err) the job's shell. A failure is fatal (`exec`),
    /// unless the shell is gone already: its node was lost with the start request in flight, and the lost-rank
    /// rules judged that (`ranks.rs`: fatal `node-failure` for an ordinary job, severity 2 for a batch job).
    pub fn shell_spawned(&mut self, now: f64, id: JobId, rank: u32, result: Result<(), String>) {
        let Some(job) = self.jobs.get_mut(&id) else { return };
        let Some(sh) = job.shells.get_mut(&rank) else { return };
        match result {
            Ok(()) => {
                if sh.spawned {
                    return;
                }
                sh.spawned = true;
                job.nspawned += 1;
                if job.state == JobState::Run && job.nspawned == job.shells.len() {
                    // The task map in the start event, as Flux's `shell.start` carries it (`vigil job info`).
                    let ctx = match &job.taskmap {
                        Some(t) => json!({"taskmap": t}),
                        None => json!({}),
                    };
                    job.post(now, "start", ctx);
                    self.actions.push_back(Action::Updated(id));
                }
                if job.nspawned == job.shells.len() && job.first_exit.is_some() && job.exit_clock.is_none() {
                    // A task exited before the last shell started: the clock starts now (timers.rs).
                    job.exit_clock = Some(now);
                    self.rearm(id);
                }
            }
            Err(e) => {
                if !self.shell_gone(id, rank) {
                    // Gone already: its node was lost (the judge reports a loss before it fails the requests in
                    // flight to the node, so the verdict comes first), and this error is that loss, judged by the
                    // lost-rank rules (ranks.rs), not a second failure.
                    return;
                }
                let host = self.pool.ranks.get(&rank).map(|p| p.hostname.clone()).unwrap_or_default();
                self.raise(now, id, "exec", 0, &format!("failed to start job shell on {host} (rank {rank}): {e}"));
                self.maybe_finish(now, id);
            }
        }
    }

    /// A task of job `id` exited: the first one starts the exit-timeout clock, if every shell of the job has
    /// started; else the last shell to start does (a job's shells start one per node, over seconds on a loaded
    /// machine, and the tasks of the first may be done before the last is up: as under Flux's shell start
    /// barrier, the others are not late before they could run).
    pub fn task_exit(&mut self, now: f64, id: JobId, _task: u32, _status: i32) {
        if let Some(j) = self.jobs.get_mut(&id) {
            if j.first_exit.is_none() {
                j.first_exit = Some(now);
                if j.nspawned == j.shells.len() {
                    j.exit_clock = Some(now);
                }
                self.rearm(id);
            }
        }
    }

    /// Post an RFC 21 `memo` event (e.g. a nested instance's URI) on an active job.
    pub fn memo(&mut self, now: f64, id: JobId, context: Value) {
        if let Some(j) = self.jobs.get_mut(&id) {
            if j.state.is_active() {
                j.post(now, "memo", context);
                self.actions.push_back(Action::Updated(id));
            }
        }
    }

    /// A shell ended (reported by its broker).
    pub fn shell_exit(&mut self, now: f64, exit: ShellExit) {
        let id = JobId(exit.id);
        let host = self.pool.ranks.get(&exit.rank).map(|p| p.hostname.clone()).unwrap_or_default();
        self.reattach_heard(now, id, exit.rank);
        if !self.shell_gone(id, exit.rank) {
            return;
        }
        let Some(job) = self.jobs.get_mut(&id) else { return };
        if let Some(sh) = job.shells.get_mut(&exit.rank) {
            sh.ended = exit.ended;
        }
        if let Some(u) = exit.report.as_ref().and_then(|r| r.usage.as_ref()) {
            job.usage.get_or_insert_with(Default::default).add(u);
        }
        let killing = job.term_sent.is_some();
        // A batch or alloc job, whether or not its instance has reported itself yet: a broker that ends while the
        // instance starts is judged by the same rules (nested.rs).
        let nested = job.instance.is_some() || job.req.instance.is_some();
        match &exit.report {
            Some(rep) if nested && !killing && rep.error.is_none() => {
                // A broker of a nested instance ended: the critical-rank rules of nested.rs.
                let Some(sh) = self.jobs.get_mut(&id).and_then(|j| j.shells.get_mut(&exit.rank)) else { return };
                sh.status = Some(rep.status);
                sh.abort_code = rep.abort_code;
                if !self.nested_broker_exit(now, id, exit.rank, &host, rep.status) {
                    // Not counted in the job's exit code: that is the instance's.
                    let Some(sh) = self.jobs.get_mut(&id).and_then(|j| j.shells.get_mut(&exit.rank)) else { return };
                    sh.status = None;
                }
            }
            Some(rep) => {
                let Some(sh) = self.jobs.get_mut(&id).and_then(|j| j.shells.get_mut(&exit.rank)) else { return };
                sh.status = Some(rep.status);
                sh.abort_code = rep.abort_code;
                if let Some(e) = &rep.error {
                    let note = format!("job shell on {host} (rank {}): {e}", exit.rank);
                    self.raise(now, id, "exec", 0, &note);
                }
            }
            None => {
                let Some(sh) = self.jobs.get_mut(&id).and_then(|j| j.shells.get_mut(&exit.rank)) else { return };
                sh.status = Some(exit.shell_status);
                if !killing {
                    let note = format!(
                        "job shell on {host} (rank {}) {} without reporting",
                        exit.rank,
                        crate::shellproto::describe_status(exit.shell_status)
                    );
                    self.raise(now, id, "exec", 0, &note);
                }
            }
        }
        if !exit.unkillable.is_empty() {
            // Processes its node could not kill (unkillable.rs): the node is drained before the job frees it.
            self.unkillable(now, id, exit.rank, &host, &exit.unkillable);
        }
        self.journal_shell_exit(now, id, exit.rank);
        self.maybe_finish(now, id);
        self.rearm(id);
    }

    pub(super) fn maybe_finish(&mut self, now: f64, id: JobId) {
        let Some(job) = self.jobs.get_mut(&id) else { return };
        if !(job.state == JobState::Run || job.state == JobState::Cleanup) || job.nexited < job.shells.len() {
            return;
        }
        if !job.cut_off.is_empty() {
            self.judge_cut_offs(now, id, true); // nothing more will be reported
        }
        let Some(job) = self.jobs.get_mut(&id) else { return };
        if job.t_inactive.is_some() || job.state == JobState::Sched {
            return; // finished (or requeued) by a verdict just given
        }
        let reported: Vec<i32> = job.shells.values().filter_map(|s| s.status).collect();
        if !reported.is_empty() {
            let mut status = reported.iter().copied().max_by_key(|s| exit_code(*s)).unwrap_or(0);
            let first = job.fatal_shell.and_then(|r| job.shells.get(&r)).and_then(|s| s.abort_code);
            if let Some(code) = first.or_else(|| job.shells.values().find_map(|s| s.abort_code)) {
                // MPI_Abort(code): the job exits with the code the application asked for.
                status = crate::shellproto::status_exited(code);
            }
            job.status = Some(status);
            let mut ctx = json!({"status": status});
            if let Some(u) = &job.usage {
                ctx["usage"] = json!(u); // cgroup accounting of every shell (jobs/mod.rs, Job::usage)
            }
            // A job re-attached after a restart of rank 0 may have ended during the outage: its `finish` carries
            // the time its last tasks ended, as their node saw it (reattach.rs), not that of the report's coming.
            let at = if job.reattached() { job.shells_ended().map_or(now, |t| t.min(now)) } else { now };
            job.post(at, "finish", ctx);
        } else if job.state == JobState::Run {
            job.post(now, "exception", json!({"type": "exec", "severity": 0, "note": "no job shell reported"}));
        }
        let ranks: IdSet = job.alloc.iter().map(|a| a.rank).collect();
        job.post(now, "release", json!({"ranks": ranks.to_string(), "final": true}));
        let held = job.held();
        job.post(now, "free", json!({}));
        self.pool.free(&held, None);
        let Some(job) = self.jobs.get_mut(&id) else { return };
        if let Some(why) = job.requeue_pending.take() {
            self.requeue(now, id, why);
            self.schedule(now);
            return;
        }
        job.post(now, "clean", json!({}));
        job.t_inactive = Some(now);
        self.running.remove(&id);
        self.rearm(id);
        self.became_inactive(id);
        self.count_ended(id);
        self.actions.push_back(Action::Updated(id));
        self.retire_output(id);
        self.depend_fired(now, id); // the pass below takes the jobs it lets go on
        self.schedule(now);
    }

    /// The shell of job `id` on `rank` is gone (exited, failed to start, or its rank was lost): false if it was
    /// already.
    pub(super) fn shell_gone(&mut self, id: JobId, rank: u32) -> bool {
        let Some(job) = self.jobs.get_mut(&id) else { return false };
        let Some(sh) = job.shells.get_mut(&rank) else { return false };
        if sh.exited {
            return false;
        }
        sh.exited = true;
        job.nexited += 1;
        self.forget_unreachable_signal(id, rank);
        if let Some(set) = self.by_rank.get_mut(&rank) {
            set.remove(&id);
            if set.is_empty() {
                self.by_rank.remove(&rank);
            }
        }
        true
    }
}

/// Tasks per node of `alloc` for request `req`, in allocation order: with a node count, evenly over the nodes (the
/// first nodes get one more), as `srun -N` / `flux run -N` do; without, over the slots in allocation order. With
/// one task per slot, as many tasks as the slots allocated (a node range's grow with the nodes it got).
fn block_counts(req: &JobRequest, alloc: &[RankAlloc]) -> Vec<u32> {
    let ntasks = if req.tasks_per_slot { alloc.iter().map(|a| a.slots).sum() } else { req.ntasks };
    if req.nnodes.is_some() {
        let n = alloc.len().max(1) as u32;
        let (base, extra) = (ntasks / n, ntasks % n);
        (0..alloc.len() as u32).map(|i| base + u32::from(i < extra)).collect()
    } else {
        let nslots: u32 = alloc.iter().map(|a| a.slots).sum::<u32>().max(1);
        let (base, extra) = (ntasks / nslots, ntasks % nslots);
        let mut slot_index = 0u32;
        alloc
            .iter()
            .map(|a| {
                let mut n = 0;
                for _ in 0..a.slots {
                    n += base + u32::from(slot_index < extra);
                    slot_index += 1;
                }
                n
            })
            .collect()
    }
}

/// RFC 34 task map for per-node task counts, block-wise ([`crate::taskmap::Taskmap::block`]).
pub fn taskmap(counts: &[u32]) -> Value {
    crate::taskmap::Taskmap::block(counts).to_value()
}
