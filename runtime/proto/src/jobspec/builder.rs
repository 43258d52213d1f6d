//! [`JobspecBuilder`]: a V1 jobspec built the way `flux run`/`flux submit` build one from command-line options
//! (`-N`, `-n`, `-c`, `-g`, `-t`, ...), with errors in option terms. The jobspec types are in `mod.rs`; what a
//! built jobspec must pass is in `validate.rs`.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::{
    Attributes, Count, CountRange, Jobspec, JobspecError, Resource, Shell, System, Task, TaskCount, REQUEUE_KEY,
};

/// Builds a V1 jobspec from `flux run`-style options.
///
/// - Without `nnodes` (`-N`): `slot[ntasks]>core[cores_per_task]` (plus
///   `gpu[gpus_per_task]` when > 0), tasks `{per_slot: 1}`; `ntasks` defaults
///   to 1.
/// - With `-N N` and `-n n` (`n >= N`): `node[N]>slot[ceil(n/N)]>core[c]`,
///   tasks `{total: n}`.
/// - With `-N N` alone: `node[N]>slot[1]>core[c]`, tasks `{per_slot: 1}`
///   (N tasks).
///
/// The slot label is `task`. `duration` is seconds (`None` = 0 = unlimited).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct JobspecBuilder {
    /// Command and arguments (must be non-empty).
    pub command: Vec<String>,
    /// `-N`: number of nodes.
    pub nnodes: Option<u32>,
    /// `-n`: number of tasks.
    pub ntasks: Option<u32>,
    /// `-c`: cores per task (`>= 1`; [`JobspecBuilder::new`] sets 1).
    pub cores_per_task: u32,
    /// `-g`: GPUs per task.
    pub gpus_per_task: u32,
    /// `-t`: time limit in seconds (`None` = unlimited).
    pub duration: Option<f64>,
    /// `--cwd`: working directory.
    pub cwd: Option<String>,
    /// `--env`: task environment.
    pub environment: BTreeMap<String, String>,
    /// `-o`: job shell options.
    pub shell_options: Map<String, Value>,
    /// `--exclusive`: allocate whole nodes (requires `-N`).
    pub exclusive: bool,
    /// `--requeue`: `attributes.system.requeue: true` ([`REQUEUE_KEY`]).
    pub requeue: bool,
    /// `--requires`, `--nodelist`, `--exclude`: `attributes.system.constraints` (RFC 31).
    pub constraint: Option<crate::constraint::Constraint>,
    /// `-N MIN-MAX`: the most nodes (`nnodes` is then the least); the node count becomes an RFC 14 range.
    pub nnodes_max: Option<u32>,
    /// `--taskmap`: the shell option `taskmap` (left out for the default, `block`).
    pub taskmap: Option<crate::taskmap::Scheme>,
    /// `--job-name`: `attributes.system.job.name` (as Flux keeps it); left out, the job is known by its command's
    /// basename.
    pub name: Option<String>,
    /// `--dependency`, `--begin-time`: `attributes.system.dependencies`, RFC 26 dependency objects
    /// (`{"scheme": "afterok", "value": "fXYZ"}`), in order.
    pub dependencies: Vec<Value>,
}

impl JobspecBuilder {
    /// Start a builder for `command` with 1 core per task and all else unset.
    pub fn new<I, S>(command: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        JobspecBuilder {
            command: command.into_iter().map(Into::into).collect(),
            cores_per_task: 1,
            ..Default::default()
        }
    }

    /// Set `-N` (number of nodes).
    pub fn nnodes(mut self, n: u32) -> Self {
        self.nnodes = Some(n);
        self
    }

    /// Set `-n` (number of tasks).
    pub fn ntasks(mut self, n: u32) -> Self {
        self.ntasks = Some(n);
        self
    }

    /// Set `-c` (cores per task).
    pub fn cores_per_task(mut self, c: u32) -> Self {
        self.cores_per_task = c;
        self
    }

    /// Set `-g` (GPUs per task).
    pub fn gpus_per_task(mut self, g: u32) -> Self {
        self.gpus_per_task = g;
        self
    }

    /// Set `-t` (time limit, seconds; 0 = unlimited).
    pub fn duration(mut self, secs: f64) -> Self {
        self.duration = Some(secs);
        self
    }

    /// Set `--cwd`.
    pub fn cwd(mut self, dir: impl Into<String>) -> Self {
        self.cwd = Some(dir.into());
        self
    }

    /// Add one environment variable.
    pub fn env(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.environment.insert(name.into(), value.into());
        self
    }

    /// Add one job shell option (`-o name=value`).
    pub fn shell_option(mut self, name: impl Into<String>, value: Value) -> Self {
        self.shell_options.insert(name.into(), value);
        self
    }

    /// Set `--exclusive`.
    pub fn exclusive(mut self, on: bool) -> Self {
        self.exclusive = on;
        self
    }

    /// Set `--requeue` (`attributes.system.requeue`).
    pub fn requeue(mut self, on: bool) -> Self {
        self.requeue = on;
        self
    }

    /// Set the nodes the job may run on (`attributes.system.constraints`).
    pub fn constraint(mut self, c: Option<crate::constraint::Constraint>) -> Self {
        self.constraint = c;
        self
    }

    /// Set `-N MIN-MAX`: at least `min`, at most `max` nodes.
    pub fn nnodes_range(mut self, min: u32, max: u32) -> Self {
        self.nnodes = Some(min);
        self.nnodes_max = Some(max);
        self
    }

    /// Set `--job-name` (`attributes.system.job.name`).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Add an RFC 26 dependency object (`attributes.system.dependencies`).
    pub fn dependency(mut self, dep: Value) -> Self {
        self.dependencies.push(dep);
        self
    }

    /// Set `--taskmap` (the `taskmap` shell option).
    pub fn taskmap(mut self, scheme: crate::taskmap::Scheme) -> Self {
        self.taskmap = Some(scheme);
        self
    }

    /// Produce the jobspec (which passes [`Jobspec::validate`]).
    ///
    /// # Errors
    /// [`JobspecError::Builder`] for an empty command, `-N`/`-n`/`-c` of 0,
    /// a negative or non-finite `-t`, `--exclusive` without `-N`,
    /// `-n` fewer than `-N` (its minimum, for a range), or totals (slots, cores, GPUs) beyond 4294967295.
    pub fn build(self) -> Result<Jobspec, JobspecError> {
        let err = |m: &str| Err(JobspecError::Builder(m.to_string()));
        if self.command.is_empty() {
            return err("command must not be empty");
        }
        if self.cores_per_task == 0 {
            return err("-c/--cores-per-task must be >= 1");
        }
        if self.ntasks == Some(0) {
            return err("-n/--ntasks must be >= 1");
        }
        if self.nnodes == Some(0) {
            return err("-N/--nodes must be >= 1");
        }
        let duration = self.duration.unwrap_or(0.0);
        if !duration.is_finite() {
            return err("-t/--time-limit must be a finite number of seconds");
        }
        if duration < 0.0 {
            return err("-t/--time-limit must be >= 0");
        }
        if self.exclusive && self.nnodes.is_none() {
            return err("--exclusive requires -N/--nodes");
        }
        match (self.nnodes, self.nnodes_max) {
            (None, Some(_)) => return err("-N MIN-MAX: a node range needs its minimum"),
            (Some(min), Some(max)) if max < min => {
                return Err(JobspecError::Builder(format!(
                    "-N {min}-{max}: the minimum ({min}) is more than the maximum ({max})"
                )))
            }
            _ => {}
        }
        let mut shell_options = self.shell_options;
        if let Some(t) = &self.taskmap {
            if *t != crate::taskmap::Scheme::Block {
                shell_options.insert("taskmap".into(), t.to_value());
            }
        }
        // The request's totals must fit in 32 bits (as `validate` requires): said here in option terms.
        let max = u64::from(u32::MAX);
        let slots: u64 = match (self.nnodes, self.ntasks) {
            (None, n) => u64::from(n.unwrap_or(1)),
            (Some(nodes), None) => u64::from(nodes),
            (Some(nodes), Some(n)) => u64::from(nodes) * u64::from(n.div_ceil(nodes)),
        };
        if slots > max {
            let (nodes, n) = (self.nnodes.unwrap_or(1), self.ntasks.unwrap_or(1));
            return Err(JobspecError::Builder(format!(
                "-N {nodes} -n {n}: {nodes} nodes of {} task slots make {slots} slots, more than {max} \
                 (use fewer tasks, or a node count that divides the task count)",
                n.div_ceil(nodes)
            )));
        }
        for (flag, per_task, what) in
            [("-c/--cores-per-task", self.cores_per_task, "cores"), ("-g/--gpus-per-task", self.gpus_per_task, "GPUs")]
        {
            let total = slots * u64::from(per_task);
            if total > max {
                return Err(JobspecError::Builder(format!(
                    "{flag} {per_task} for {slots} task slots makes {total} {what}, more than {max}"
                )));
            }
        }
        let mut leaves = vec![leaf("core", self.cores_per_task)];
        if self.gpus_per_task > 0 {
            leaves.push(leaf("gpu", self.gpus_per_task));
        }
        let slot = |count: u32| Resource {
            kind: "slot".into(),
            count: Count::Fixed(u64::from(count)),
            label: Some("task".into()),
            exclusive: None,
            unit: None,
            id: None,
            with: leaves.clone(),
        };
        let max = self.nnodes_max;
        let (resource, count) = match (self.nnodes, self.ntasks) {
            (None, n) => (slot(n.unwrap_or(1)), TaskCount::PerSlot(1)),
            (Some(nodes), None) => (node(nodes, max, self.exclusive, slot(1)), TaskCount::PerSlot(1)),
            (Some(nodes), Some(n)) => {
                if n < nodes {
                    let range = max.filter(|m| *m > nodes).map(|m| format!("{nodes}-{m}")).unwrap_or(nodes.to_string());
                    return Err(JobspecError::Builder(format!(
                        "-n {n} is fewer tasks than the {nodes} node(s) of -N {range}: every node of a job runs \
                         a task at least (give -n {nodes} or more, or fewer nodes)"
                    )));
                }
                // A node range sizes its slots for the most nodes it may get (fewer nodes then need more slots
                // each: `JobRequest::slots_on`), so that the largest node count that fits can be taken.
                let per_node = n.div_ceil(max.map_or(nodes, |m| m.clamp(nodes, n)));
                (node(nodes, max, self.exclusive, slot(per_node)), TaskCount::Total(u64::from(n)))
            }
        };
        Ok(Jobspec {
            version: 1,
            resources: vec![resource],
            tasks: vec![Task {
                command: self.command,
                slot: "task".into(),
                count,
                attributes: None,
                distribution: None,
            }],
            attributes: Attributes {
                system: System {
                    duration: Some(duration),
                    cwd: self.cwd,
                    environment: self.environment,
                    shell: (!shell_options.is_empty()).then(|| Shell { options: shell_options, other: Map::new() }),
                    other: {
                        let mut other = Map::new();
                        if self.requeue {
                            other.insert(REQUEUE_KEY.to_string(), Value::Bool(true));
                        }
                        if let Some(c) = &self.constraint {
                            other.insert("constraints".to_string(), c.to_value());
                        }
                        if let Some(n) = &self.name {
                            other.insert("job".to_string(), serde_json::json!({ "name": n }));
                        }
                        if !self.dependencies.is_empty() {
                            other.insert("dependencies".to_string(), Value::Array(self.dependencies.clone()));
                        }
                        other
                    },
                },
                user: Map::new(),
            },
        })
    }
}

fn leaf(kind: &str, count: u32) -> Resource {
    Resource {
        kind: kind.into(),
        count: Count::Fixed(u64::from(count)),
        label: None,
        exclusive: None,
        unit: None,
        id: None,
        with: Vec::new(),
    }
}

/// A node vertex: `count` nodes, or with `max` the RFC 14 range `{min: count, max, operator: "+", operand: 1}`.
fn node(count: u32, max: Option<u32>, exclusive: bool, slot: Resource) -> Resource {
    let count = match max {
        Some(max) if max > count => Count::Range(CountRange {
            min: u64::from(count),
            max: Some(u64::from(max)),
            operator: Some("+".into()),
            operand: Some(1),
        }),
        _ => Count::Fixed(u64::from(count)),
    };
    Resource {
        kind: "node".into(),
        count,
        label: None,
        exclusive: exclusive.then_some(true),
        unit: None,
        id: None,
        with: vec![slot],
    }
}

#[cfg(test)]
mod tests {
    use super::super::*;
    use serde_json::json;

    #[test]
    fn builder_defaults_to_one_slot() {
        let js = JobspecBuilder::new(["hostname"]).build().expect("build");
        let req = js.validate().expect("valid");
        assert_eq!((req.nnodes, req.nslots, req.ntasks, req.cores_per_slot), (None, 1, 1, 1));
        assert_eq!(req.duration, None);
        let v: Value = serde_json::from_str(&js.to_json()).expect("json");
        assert_eq!(
            v,
            json!({"version": 1,
                   "resources": [{"type": "slot", "count": 1, "label": "task",
                                  "with": [{"type": "core", "count": 1}]}],
                   "tasks": [{"command": ["hostname"], "slot": "task", "count": {"per_slot": 1}}],
                   "attributes": {"system": {"duration": 0.0}}})
        );
    }

    #[test]
    fn builder_follows_flux_run_conventions() {
        // -n4 -c2 -g1 -t 60
        let js = JobspecBuilder::new(["app", "-v"])
            .ntasks(4)
            .cores_per_task(2)
            .gpus_per_task(1)
            .duration(60.0)
            .cwd("/tmp")
            .env("A", "b")
            .shell_option("verbose", json!(2))
            .build()
            .expect("build");
        let req = js.validate().expect("valid");
        assert_eq!((req.nnodes, req.nslots, req.ntasks, req.cores_per_slot, req.gpus_per_slot), (None, 4, 4, 2, 1));
        assert_eq!(req.duration, Some(60.0));
        assert_eq!(req.cwd.as_deref(), Some("/tmp"));
        assert_eq!(req.environment.get("A").map(String::as_str), Some("b"));
        assert_eq!(req.shell_options.get("verbose"), Some(&json!(2)));

        // -N2 -n5 --exclusive
        let js = JobspecBuilder::new(["app"]).nnodes(2).ntasks(5).exclusive(true).build().expect("build");
        let req = js.validate().expect("valid");
        assert_eq!(
            (req.nnodes, req.slots_per_node, req.nslots, req.ntasks, req.exclusive),
            (Some(2), Some(3), 6, 5, true)
        );
        assert!(matches!(js.tasks[0].count, TaskCount::Total(5)));

        // -N3 alone
        let req = JobspecBuilder::new(["app"]).nnodes(3).build().and_then(|j| j.validate()).expect("valid");
        assert_eq!((req.nnodes, req.slots_per_node, req.nslots, req.ntasks), (Some(3), Some(1), 3, 3));
    }

    #[test]
    fn builder_errors() {
        let cases = [
            (JobspecBuilder::new(Vec::<String>::new()), "command must not be empty"),
            (
                JobspecBuilder::new(["a"]).nnodes(4).ntasks(2),
                "-n 2 is fewer tasks than the 4 node(s) of -N 4: every node of a job runs a task at least (give -n 4 \
                 or more, or fewer nodes)",
            ),
            (
                JobspecBuilder::new(["a"]).nnodes_range(4, 6).ntasks(2),
                "-n 2 is fewer tasks than the 4 node(s) of -N 4-6: every node of a job runs a task at least (give \
                 -n 4 or more, or fewer nodes)",
            ),
            (JobspecBuilder::new(["a"]).ntasks(0), "-n/--ntasks must be >= 1"),
            (JobspecBuilder::new(["a"]).nnodes(0), "-N/--nodes must be >= 1"),
            (JobspecBuilder::new(["a"]).cores_per_task(0), "-c/--cores-per-task must be >= 1"),
            (JobspecBuilder::new(["a"]).duration(-1.0), "-t/--time-limit must be >= 0"),
            (JobspecBuilder::new(["a"]).duration(f64::NAN), "-t/--time-limit must be a finite number of seconds"),
            (JobspecBuilder::new(["a"]).exclusive(true), "--exclusive requires -N/--nodes"),
        ];
        for (b, want) in cases {
            assert_eq!(b.build().map_err(|e| e.to_string()), Err(want.to_string()));
        }
    }

    /// `vigil run -N/-n/-c/-g` with totals past 32 bits: refused by the builder in option terms; anything it
    /// builds validates.
    #[test]
    fn builder_refuses_totals_past_32_bits_naming_the_options() {
        let n = u32::MAX;
        for (b, flag) in [
            (JobspecBuilder::new(["a"]).nnodes(2).ntasks(n), "-N 2"),
            (JobspecBuilder::new(["a"]).ntasks(n).cores_per_task(2), "-c/--cores-per-task"),
            (JobspecBuilder::new(["a"]).ntasks(1 << 30).gpus_per_task(8), "-g/--gpus-per-task"),
            (JobspecBuilder::new(["a"]).nnodes(n).cores_per_task(2), "-c/--cores-per-task"),
        ] {
            let e = b.build().expect_err(flag);
            assert!(matches!(&e, JobspecError::Builder(m) if m.contains(flag)), "{flag}: {e}");
        }
        for b in [
            JobspecBuilder::new(["a"]).ntasks(n),
            JobspecBuilder::new(["a"]).nnodes(3).ntasks(n),
            JobspecBuilder::new(["a"]).nnodes(n),
            JobspecBuilder::new(["a"]).ntasks(n / 4).cores_per_task(4).gpus_per_task(4),
        ] {
            let req = b.clone().build().and_then(|j| j.validate()).unwrap_or_else(|e| panic!("{b:?}: {e}"));
            assert!(req.ntasks <= req.nslots, "{b:?}");
        }
    }

    #[test]
    fn builder_round_trips_tricky_strings() {
        let js = JobspecBuilder::new(["sh", "-c", "echo 'hi'; exit 0", "true", "1", "null", "~", "- x", ""])
            .nnodes(2)
            .ntasks(2)
            .env("EMPTY", "")
            .env("NUM", "007")
            .env("YES", "yes")
            .cwd("#not a comment")
            .build()
            .expect("build");
        assert_eq!(Jobspec::parse(&js.to_json()), Ok(js.clone()));
        assert_eq!(js.to_yaml().and_then(|y| Jobspec::parse(&y)), Ok(js.clone()));
    }
}
