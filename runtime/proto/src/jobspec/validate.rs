//! The RFC 25 Jobspec V1 rules ([`Jobspec::validate`]): one node or slot vertex, one task, counts that fit in 32
//! bits, a duration; the result is a [`JobRequest`] (`request.rs`). Structural parsing before it is in `parse.rs`.

use serde_json::Value;

use super::request::kill_timeout_secs;
use super::{
    invalid, Count, JobRequest, Jobspec, JobspecError, Resource, TaskCount, DEPENDENCY_SCHEMES, INSTANCE_KEY,
    KILL_TIMEOUT_KEY, MAX_TASKS_PER_CORE, RECOGNIZED_SYSTEM_KEYS, REQUEUE_KEY,
};

/// Check a V1 count: integer or `{min}` with `least <= value <= u32::MAX` (`least` is 1, or 0 for a `gpu`).
fn v1_count(count: &Count, path: &str, least: u64) -> Result<u32, JobspecError> {
    let (value, p) = match count {
        Count::Fixed(n) => (*n, path.to_string()),
        Count::Range(r) => {
            if let Some(max) = r.max {
                if max < r.min {
                    return Err(invalid(format!("{path}.max"), "must be >= min"));
                }
            }
            (r.min, format!("{path}.min"))
        }
        Count::Text(_) => {
            return Err(invalid(path, "a count string is not allowed in a version 1 jobspec (RFC 25): give an integer"))
        }
    };
    if value < least {
        return Err(invalid(p, format!("must be an integer >= {least}")));
    }
    u32::try_from(value).map_err(|_| invalid(p, format!("must be at most {}", u32::MAX)))
}

/// Refuse the RFC 14 vertex keys a V1 jobspec does not have (`id`); `unit` is allowed (RFC 25) and ignored.
fn v1_keys(r: &Resource, path: &str) -> Result<(), JobspecError> {
    if r.id.is_some() {
        return Err(invalid(format!("{path}.id"), "not allowed in a version 1 jobspec (RFC 25)"));
    }
    Ok(())
}

/// The most nodes of a node count that is a range (`{min, max}`, RFC 14), given its minimum `min` (already
/// checked): `None` for a fixed count, a range without `max`, or `max == min`. Only ranges of every count between
/// the two are supported (operator `+`, operand 1, RFC 14's defaults).
fn node_range_max(count: &Count, min: u32) -> Result<Option<u32>, JobspecError> {
    let Count::Range(r) = count else { return Ok(None) };
    if r.operator.as_deref().is_some_and(|o| o != "+") {
        return Err(invalid("resources[0].count.operator", "only + is supported for a node count"));
    }
    if r.operand.is_some_and(|o| o != 1) {
        return Err(invalid("resources[0].count.operand", "only 1 is supported for a node count"));
    }
    match r.max {
        None => Ok(None),
        Some(max) => {
            let max = u32::try_from(max)
                .map_err(|_| invalid("resources[0].count.max", format!("must be at most {}", u32::MAX)))?;
            Ok((max > min).then_some(max))
        }
    }
}

/// Check a leaf (`core`/`gpu`) vertex inside a slot. A `gpu` count may be 0 (no GPU), as flux-core's V1
/// validator allows (RFC 25's schema says `>= 1`; its text only "a single integer").
fn v1_leaf(r: &Resource, path: &str) -> Result<u32, JobspecError> {
    v1_keys(r, path)?;
    if !r.with.is_empty() {
        return Err(invalid(format!("{path}.with"), format!("{} may not contain other resources", r.kind)));
    }
    if r.label.is_some() {
        return Err(invalid(format!("{path}.label"), "only allowed on slot"));
    }
    if r.exclusive.is_some() {
        return Err(invalid(format!("{path}.exclusive"), "only allowed on node"));
    }
    v1_count(&r.count, &format!("{path}.count"), if r.kind == "gpu" { 0 } else { 1 })
}

impl Jobspec {
    /// Apply the RFC 25 Jobspec V1 rules and summarise the request.
    ///
    /// Rules: `version` is 1; `resources` has exactly one vertex, either
    /// `node` (count, optional `exclusive`) containing exactly one `slot`, or
    /// a `slot`; the slot has a non-empty `label`, a count, and contains one
    /// `core` (count `>= 1`) and at most one `gpu` (count `>= 0`; 0 asks for
    /// none), neither with children; a vertex may carry `unit` (ignored) but not
    /// `id`; `exclusive` is allowed on the node, and on the slot only as `true`
    /// (RFC 14's default for slots); counts are
    /// integers or `{min: N}` (min is used), except that a node count `{min, max}` is a range (Slurm's
    /// `--nodes=min-max`: [`JobRequest::nnodes_max`]); count strings are refused; `tasks` has exactly one task
    /// with a non-empty `command`, `slot` equal to the slot label, and count
    /// `{per_slot: 1}` or `{total: N >= 1}` (not `per_resource`); `attributes.system.duration`
    /// is present (seconds, 0 = unlimited); `attributes.system.dependencies`
    /// (RFC 26) name schemes of [`DEPENDENCY_SCHEMES`] (the jobs they name are the job manager's to check).
    ///
    /// Unknown `attributes.system` keys (other than
    /// [`RECOGNIZED_SYSTEM_KEYS`]), unknown `attributes.system.shell` keys and a task's `distribution`
    /// become [`JobRequest::warnings`].
    ///
    /// # Errors
    /// [`JobspecError::Invalid`] naming the field, e.g.
    /// `version: must be 1, got 2`,
    /// `resources[0].with[0].count: must be an integer >= 1`,
    /// `tasks[0].command: must be a non-empty array of strings`.
    pub fn validate(&self) -> Result<JobRequest, JobspecError> {
        if self.version != 1 {
            return Err(invalid("version", format!("must be 1, got {}", self.version)));
        }
        let [top] = self.resources.as_slice() else {
            return Err(invalid(
                "resources",
                format!("must contain exactly one resource (node or slot), got {}", self.resources.len()),
            ));
        };
        let mut nnodes_max = None;
        let (nnodes, slot, slot_path, exclusive) = match top.kind.as_str() {
            "node" => {
                v1_keys(top, "resources[0]")?;
                let n = v1_count(&top.count, "resources[0].count", 1)?;
                nnodes_max = node_range_max(&top.count, n)?;
                if top.label.is_some() {
                    return Err(invalid("resources[0].label", "only allowed on slot"));
                }
                let [slot] = top.with.as_slice() else {
                    return Err(invalid("resources[0].with", "node must contain exactly one slot"));
                };
                if slot.kind != "slot" {
                    return Err(invalid("resources[0].with[0].type", format!("must be slot, got {}", slot.kind)));
                }
                (Some(n), slot, "resources[0].with[0]", top.exclusive.unwrap_or(false))
            }
            "slot" => (None, top, "resources[0]", false),
            other => return Err(invalid("resources[0].type", format!("must be node or slot, got {other}"))),
        };
        v1_keys(slot, slot_path)?;
        if slot.exclusive == Some(false) {
            return Err(invalid(
                format!("{slot_path}.exclusive"),
                "a slot's resources are always its own: false (shared) is not supported",
            ));
        }
        let label = match &slot.label {
            Some(l) if !l.is_empty() => l.as_str(),
            _ => return Err(invalid(format!("{slot_path}.label"), "required non-empty string")),
        };
        let slots = v1_count(&slot.count, &format!("{slot_path}.count"), 1)?;
        let mut cores = None;
        let mut gpus = None;
        for (i, child) in slot.with.iter().enumerate() {
            let p = format!("{slot_path}.with[{i}]");
            let target = match child.kind.as_str() {
                "core" => &mut cores,
                "gpu" => &mut gpus,
                other => return Err(invalid(format!("{p}.type"), format!("must be core or gpu, got {other}"))),
            };
            if target.is_some() {
                return Err(invalid(&p, format!("duplicate {} in slot", child.kind)));
            }
            *target = Some(v1_leaf(child, &p)?);
        }
        let Some(cores_per_slot) = cores else {
            return Err(invalid(format!("{slot_path}.with"), "slot must contain a core"));
        };
        // The request's totals (slots, cores, GPUs) must each fit in 32 bits like every count: products are
        // computed in 64 bits, and the error names the count that makes one too large.
        let nslots = match nnodes {
            Some(n) => n.checked_mul(slots).ok_or_else(|| {
                invalid(
                    format!("{slot_path}.count"),
                    format!(
                        "{slots} slots on each of {n} nodes make {}, more than {}",
                        u64::from(slots) * u64::from(n),
                        u32::MAX
                    ),
                )
            })?,
            None => slots,
        };
        let leaf_index = |kind: &str| slot.with.iter().position(|c| c.kind == kind).unwrap_or(0);
        for (kind, per_slot) in [("core", cores_per_slot), ("gpu", gpus.unwrap_or(0))] {
            let total = u64::from(per_slot) * u64::from(nslots);
            if total > u64::from(u32::MAX) {
                return Err(invalid(
                    format!("{slot_path}.with[{}].count", leaf_index(kind)),
                    format!("{per_slot} {kind}s in each of {nslots} slots make {total}, more than {}", u32::MAX),
                ));
            }
        }

        let [task] = self.tasks.as_slice() else {
            return Err(invalid("tasks", format!("must contain exactly one task, got {}", self.tasks.len())));
        };
        if task.command.is_empty() {
            return Err(invalid("tasks[0].command", "must be a non-empty array of strings"));
        }
        if task.slot != label {
            return Err(invalid("tasks[0].slot", format!("must equal the slot label {label:?}, got {:?}", task.slot)));
        }
        let ntasks = match task.count {
            TaskCount::PerSlot(1) => nslots,
            TaskCount::PerSlot(_) => return Err(invalid("tasks[0].count.per_slot", "must be 1")),
            // N tasks distributed over the slots; fewer tasks than slots is
            // normal (`flux run -N2 -n3` gives 4 slots, 3 tasks).
            TaskCount::Total(n) => v1_count(&Count::Fixed(n), "tasks[0].count.total", 1)?,
            TaskCount::PerResource { .. } => {
                return Err(invalid(
                    "tasks[0].count.per_resource",
                    "not allowed in a version 1 jobspec (RFC 25): use per_slot or total",
                ))
            }
        };
        let ncores = u64::from(nslots) * u64::from(cores_per_slot);
        if u64::from(ntasks) > ncores * u64::from(MAX_TASKS_PER_CORE) {
            return Err(invalid(
                "tasks[0].count.total",
                format!(
                    "{ntasks} tasks on the {ncores} core(s) requested is more than {MAX_TASKS_PER_CORE} per core \
                     (ask for more slots instead)"
                ),
            ));
        }

        let sys = &self.attributes.system;
        let duration = match sys.duration {
            None => return Err(invalid("attributes.system.duration", "required (seconds, 0 = unlimited)")),
            Some(d) if !(d.is_finite() && d >= 0.0) => {
                return Err(invalid("attributes.system.duration", "must be a number of seconds >= 0"))
            }
            Some(d) => (d > 0.0).then_some(d),
        };
        let shell_options = sys.shell.as_ref().map(|s| s.options.clone()).unwrap_or_default();
        if let Some(v) = shell_options.get(KILL_TIMEOUT_KEY) {
            kill_timeout_secs(v).map_err(|e| invalid("attributes.system.shell.options.kill-timeout", e))?;
        }
        let signal = match shell_options.get(super::SIGNAL_KEY) {
            None | Some(Value::Null) | Some(Value::Bool(false)) => None,
            Some(v) => Some(
                super::WarnSignal::from_value(v).map_err(|e| invalid("attributes.system.shell.options.signal", e))?,
            ),
        };
        let on_node_loss = match shell_options.get(super::request::ON_NODE_LOSS_KEY) {
            None | Some(Value::Null) => super::OnNodeLoss::Kill,
            Some(v) => {
                super::OnNodeLoss::parse(v).map_err(|e| invalid("attributes.system.shell.options.on-node-loss", e))?
            }
        };
        let requeue = match sys.other.get(REQUEUE_KEY) {
            None => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err(invalid("attributes.system.requeue", "must be a boolean")),
        } || match shell_options.get(REQUEUE_KEY) {
            None => false,
            Some(Value::Bool(b)) => *b,
            Some(Value::String(s)) if matches!(s.as_str(), "1" | "true" | "yes" | "on") => true,
            Some(Value::String(s)) if matches!(s.as_str(), "0" | "false" | "no" | "off") => false,
            Some(Value::Number(n)) => n.as_u64().is_some_and(|n| n != 0),
            Some(_) => {
                return Err(invalid(
                    "attributes.system.shell.options.requeue",
                    "must be a boolean (or 1|0, true|false, yes|no, on|off)",
                ))
            }
        };
        let constraint = match sys.other.get("constraints") {
            None | Some(Value::Null) => None,
            Some(v) => Some(
                crate::constraint::Constraint::parse(v, "attributes.system.constraints")
                    .map_err(|e| invalid(e.path, e.message))?,
            ),
        };
        // A node range with a task total takes no more nodes than it has tasks (each node runs one at least).
        if let (TaskCount::Total(_), Some(min)) = (&task.count, nnodes) {
            nnodes_max = nnodes_max.map(|m| m.min(ntasks)).filter(|m| *m > min);
        }
        let taskmap = match shell_options.get("taskmap") {
            None | Some(Value::Null) => crate::taskmap::Scheme::Block,
            Some(v) => crate::taskmap::Scheme::from_value(v)
                .map_err(|e| invalid("attributes.system.shell.options.taskmap", e.to_string()))?,
        };
        // Checked with the node count only when it is fixed: a range or a slot request learns it at allocation.
        let fixed_nodes = if nnodes_max.is_some() { None } else { nnodes };
        taskmap.check(fixed_nodes, ntasks).map_err(|e| invalid("attributes.system.shell.options.taskmap", e.0))?;
        let mut constraint = constraint;
        if let crate::taskmap::Scheme::Hostfile { .. } = &taskmap {
            let hosts = crate::constraint::Constraint::Hosts(taskmap.hosts().into_iter().collect());
            constraint = Some(match constraint {
                None => hosts,
                Some(c) => crate::constraint::Constraint::And(vec![c, hosts]),
            });
        }
        // RFC 14 lets any scheme be named (use case 2.8's `fluid`); a job manager runs only the ones it knows.
        for (i, dep) in sys.other.get("dependencies").and_then(Value::as_array).into_iter().flatten().enumerate() {
            let scheme = dep.get("scheme").and_then(Value::as_str).unwrap_or_default();
            if !DEPENDENCY_SCHEMES.contains(&scheme) {
                return Err(invalid(
                    format!("attributes.system.dependencies[{i}].scheme"),
                    format!("unknown dependency scheme {scheme:?} (known: {})", DEPENDENCY_SCHEMES.join(", ")),
                ));
            }
        }
        let instance = sys.other.get(INSTANCE_KEY).map(super::NestedInstance::from_value).transpose()?;
        let mut warnings = Vec::new();
        if task.distribution.is_some() {
            warnings.push("tasks[0].distribution: ignored (the shell's taskmap option places tasks)".to_string());
        }
        for key in sys.other.keys() {
            if key != REQUEUE_KEY && key != INSTANCE_KEY && !RECOGNIZED_SYSTEM_KEYS.contains(&key.as_str()) {
                warnings.push(format!("attributes.system.{key}: unknown key, ignored"));
            }
        }
        if let Some(shell) = &sys.shell {
            for key in shell.other.keys() {
                warnings.push(format!("attributes.system.shell.{key}: unknown key, ignored"));
            }
        }
        Ok(JobRequest {
            nnodes,
            nslots,
            slots_per_node: nnodes.map(|_| slots),
            cores_per_slot,
            gpus_per_slot: gpus.unwrap_or(0),
            ntasks,
            command: task.command.clone(),
            duration,
            cwd: sys.cwd.clone(),
            environment: sys.environment.clone(),
            shell_options,
            exclusive,
            requeue,
            constraint,
            nnodes_max,
            tasks_per_slot: matches!(task.count, TaskCount::PerSlot(_)),
            taskmap,
            instance,
            signal,
            on_node_loss,
            warnings,
        })
    }
}
