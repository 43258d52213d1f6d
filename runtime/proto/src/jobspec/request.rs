//! [`JobRequest`]: the validated summary of a V1 jobspec that the scheduler and the exec system work from, and the
//! job's own kill timeout ([`KILL_TIMEOUT_KEY`]). It is produced by `validate.rs`; the jobspec types are in
//! `mod.rs`.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

/// The validated summary of a V1 jobspec, produced by [`Jobspec::validate`](super::Jobspec::validate).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct JobRequest {
    /// Number of nodes when a `node` level is present, else `None`.
    pub nnodes: Option<u32>,
    /// Total slots: `nnodes * slots_per_node` with a node level, else the slot count.
    pub nslots: u32,
    /// Slots per node when a `node` level is present.
    pub slots_per_node: Option<u32>,
    /// Cores in each slot (`>= 1`).
    pub cores_per_slot: u32,
    /// GPUs in each slot (0 if none requested).
    pub gpus_per_slot: u32,
    /// Total number of tasks.
    pub ntasks: u32,
    /// Command and arguments (non-empty).
    pub command: Vec<String>,
    /// Time limit in seconds; `None` means unlimited (`duration: 0`).
    pub duration: Option<f64>,
    /// Working directory.
    pub cwd: Option<String>,
    /// Task environment.
    pub environment: BTreeMap<String, String>,
    /// Job shell options (`attributes.system.shell.options`).
    pub shell_options: Map<String, Value>,
    /// Whether nodes are requested exclusively.
    pub exclusive: bool,
    /// Requeue the job when it fails because one of its nodes was lost: `attributes.system.requeue: true`
    /// ([`REQUEUE_KEY`](super::REQUEUE_KEY)), or the shell option `requeue` set to true, 1, yes or on.
    pub requeue: bool,
    /// Which nodes the job may run on (`attributes.system.constraints`, RFC 31); `None`: any. A `hostfile` task
    /// map adds its hosts here: the job runs on exactly those.
    pub constraint: Option<crate::constraint::Constraint>,
    /// Most nodes, when the node count is a range (`count: {min, max}` of RFC 14, `-N MIN-MAX`, Slurm's
    /// `--nodes=min-max`): the job takes as many free nodes as it can up to this, at least [`JobRequest::nnodes`]
    /// (the minimum). `None`: exactly `nnodes`.
    pub nnodes_max: Option<u32>,
    /// One task per slot (`tasks[0].count.per_slot`): with a node range the job's task count follows the nodes it
    /// gets, and [`JobRequest::ntasks`] is the count at the minimum.
    pub tasks_per_slot: bool,
    /// How tasks are mapped to the job's nodes (the shell option `taskmap`, `--taskmap`, RFC 34 schemes).
    pub taskmap: crate::taskmap::Scheme,
    /// The nested instance the job's tasks make up, for a batch or alloc job ([`INSTANCE_KEY`](super::INSTANCE_KEY)).
    pub instance: Option<NestedInstance>,
    /// The signal sent to the tasks before the time limit (the shell option `signal`, `--signal=SIG@TIME`),
    /// checked by [`Jobspec::validate`](super::Jobspec::validate); `None`: none. Whether it comes before the
    /// limit is the job manager's to check, which knows the instance's default time limit.
    pub signal: Option<super::WarnSignal>,
    /// What the loss of one of its nodes does to an ordinary job: the shell option `on-node-loss`
    /// ([`ON_NODE_LOSS_KEY`], [`OnNodeLoss`]).
    pub on_node_loss: OnNodeLoss,
    /// Non-fatal findings, e.g. `attributes.system.foo: unknown key, ignored`.
    pub warnings: Vec<String>,
}

impl JobRequest {
    /// Whether the slots each node needs depend on how many nodes the job gets: a node range with a task total
    /// (`-N MIN-MAX -n N`), whose N tasks are spread over the nodes it gets, as Slurm's `--nodes=min-max
    /// --ntasks=N` spreads them.
    pub fn slots_vary(&self) -> bool {
        self.nnodes.is_some() && self.nnodes_max.is_some() && !self.tasks_per_slot
    }

    /// The job's own kill timeout, seconds from SIGTERM to SIGKILL: the shell option `kill-timeout` (`-o
    /// kill-timeout=DURATION`, an RFC 23 duration or a number of seconds), checked by
    /// [`Jobspec::validate`](super::Jobspec::validate); `None` when the job leaves it to the instance
    /// (`exec.kill-timeout`).
    pub fn kill_timeout(&self) -> Option<f64> {
        kill_timeout_secs(self.shell_options.get(KILL_TIMEOUT_KEY)?).ok()
    }

    /// Slots each node needs when the job runs on `nodes` nodes: the jobspec's per-node slot count, or, for a
    /// node range with a task total ([`JobRequest::slots_vary`]), enough for its tasks spread over `nodes`
    /// (`ceil(ntasks / nodes)`) if that is more. So `-N 2-3 -n 6` needs 3 slots on each of 2 nodes or 2 on each
    /// of 3: the scheduler takes the largest count that fits (Slurm's rule), and it is refused only when no
    /// count of the range can ever fit.
    pub fn slots_on(&self, nodes: u32) -> u32 {
        let per = self.slots_per_node.unwrap_or(1);
        if self.slots_vary() {
            per.max(self.ntasks.div_ceil(nodes.max(1)))
        } else {
            per
        }
    }
}

/// The shell option saying what the loss of a node does to an ordinary job
/// (`attributes.system.shell.options.on-node-loss`, `-o on-node-loss=kill|notify`; [`OnNodeLoss`]).
pub const ON_NODE_LOSS_KEY: &str = "on-node-loss";

/// What the loss of one of its nodes does to an ordinary job (a batch or alloc job survives the loss of any node
/// but those its instance cannot lose, whatever this says).
///
/// The name says the trigger and the reaction, with Slurm's choice as the model: `notify` is Slurm's `--no-kill`
/// (`-k`), under which "the job will assume all responsibilities for fault-tolerance", and `kill` its default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnNodeLoss {
    /// The job fails with a fatal `node-failure` exception (severity 0): every shell of an ordinary job is
    /// critical. The default.
    #[default]
    Kill,
    /// The job survives the loss of any of its nodes while one of its shells still runs: a `node-failure`
    /// exception of severity 2, the lost nodes released, and every surviving shell told (its PMIx clients get
    /// the event for the lost processes). It fails only when no shell of it is left running.
    Notify,
}

impl OnNodeLoss {
    /// Parse the shell option's value: `kill` or `notify`.
    pub(super) fn parse(v: &Value) -> Result<OnNodeLoss, String> {
        match v.as_str() {
            Some("kill") => Ok(OnNodeLoss::Kill),
            Some("notify") => Ok(OnNodeLoss::Notify),
            _ => Err(format!("{v}: kill or notify expected")),
        }
    }
}

/// The shell option of a job's own kill timeout (`attributes.system.shell.options.kill-timeout`).
pub const KILL_TIMEOUT_KEY: &str = "kill-timeout";

/// Seconds of a `kill-timeout` shell option: an RFC 23 duration (`10s`, `1m`) or a number of seconds, finite and
/// `>= 0`.
pub(super) fn kill_timeout_secs(v: &Value) -> Result<f64, String> {
    let secs = match v {
        Value::String(s) => crate::duration::parse_duration_secs(s).map_err(|e| e.to_string())?,
        Value::Number(n) => n.as_f64().unwrap_or(f64::NAN),
        _ => return Err("must be a duration such as 10s (RFC 23) or a number of seconds".into()),
    };
    if !(secs.is_finite() && secs >= 0.0) {
        return Err(format!("must be a finite duration >= 0, got {v}"));
    }
    Ok(secs)
}

/// The shape of the nested instance a batch or alloc job runs ([`INSTANCE_KEY`](super::INSTANCE_KEY)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NestedInstance {
    /// `tbon.reparent`: its brokers re-parent when a router is lost (the default, `on`), so that only its rank 0
    /// is critical; `off`: rank 0 and every router are.
    pub reparent: bool,
    /// `tbon.topo`, when set; else the nested instance's default ([`Topology::nested_default`]).
    ///
    /// [`Topology::nested_default`]: crate::topology::Topology::nested_default
    pub topo: Option<crate::topology::Topology>,
}

impl NestedInstance {
    /// The TBON shape the nested instance has with `size` brokers.
    pub fn topo(&self, size: u32) -> crate::topology::Topology {
        self.topo.unwrap_or_else(|| crate::topology::Topology::nested_default(size, self.reparent))
    }

    /// Parse `attributes.system.instance`; errors name the field.
    pub(super) fn from_value(v: &Value) -> Result<NestedInstance, super::JobspecError> {
        let path = "attributes.system.instance";
        let obj = v.as_object().ok_or_else(|| super::invalid(path, "must be an object"))?;
        let mut out = NestedInstance { reparent: true, topo: None };
        for (k, v) in obj {
            let s = v.as_str().ok_or_else(|| super::invalid(format!("{path}.{k}"), "must be a string"))?;
            match k.as_str() {
                "tbon.reparent" => {
                    out.reparent = match s {
                        "on" => true,
                        "off" => false,
                        _ => return Err(super::invalid(format!("{path}.{k}"), format!("{s}: on or off expected"))),
                    }
                }
                "tbon.topo" => {
                    out.topo = Some(s.parse().map_err(|e| super::invalid(format!("{path}.{k}"), format!("{e}")))?)
                }
                _ => {
                    return Err(super::invalid(
                        format!("{path}.{k}"),
                        "unknown key (expected tbon.reparent, tbon.topo)",
                    ))
                }
            }
        }
        Ok(out)
    }
}
