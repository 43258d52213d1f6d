//! Job specifications, following Flux RFC 14 ("Canonical Job Specification")
//! restricted to the Jobspec V1 subset of Flux RFC 25.
//!
//! A jobspec is a YAML or JSON document:
//!
//! ```yaml
//! version: 1
//! resources:
//!   - type: node
//!     count: 2
//!     with:
//!       - type: slot
//!         label: task
//!         count: 2
//!         with:
//!           - type: core
//!             count: 4
//!           - type: gpu
//!             count: 1
//! tasks:
//!   - command: ["app", "--input", "x"]
//!     slot: task
//!     count: {per_slot: 1}
//! attributes:
//!   system:
//!     duration: 3600      # seconds; 0 = unlimited
//!     cwd: /home/user
//!     environment: {HOME: /home/user}
//!     shell: {options: {verbose: 1}}
//!   user: {}
//! ```
//!
//! [`Jobspec::parse`] checks the RFC 14 structure (types and allowed keys);
//! [`Jobspec::validate`] applies the RFC 25 V1 rules and summarises the
//! request as a [`JobRequest`]. [`JobspecBuilder`] builds V1 jobspecs the way
//! `flux run`/`flux submit` do from command-line options. Every error names
//! the offending field, e.g. `resources[0].with[0].count: must be an integer >= 1`.
//!
//! This file holds the document's types ([`Jobspec`] and its parts) and [`JobspecError`]; its neighbours hold one
//! step each:
//!
//! | file | holds |
//! |------|-------|
//! | `parse.rs` | text or JSON to [`Jobspec`], checking the RFC 14 structure ([`Jobspec::parse`]) |
//! | `validate.rs` | the RFC 25 V1 rules ([`Jobspec::validate`]) |
//! | `request.rs` | what validation yields: [`JobRequest`] |
//! | `warning.rs` | [`WarnSignal`]: the signal sent before the time limit (`--signal=SIG@TIME`) |
//! | `builder.rs` | [`JobspecBuilder`]: a V1 jobspec from `flux run`-style options |
//! | `tests.rs` | parse and validate tests, proptests on hostile input |
//! | `conformance.rs` | the examples of RFC 14 and RFC 25, rewritten, each with its verdict (`docs/conformance.md`) |

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{Map, Value};
use thiserror::Error;

mod builder;
#[cfg(test)]
mod conformance;
mod parse;
mod request;
#[cfg(test)]
mod tests;
mod validate;
mod warning;

pub use builder::JobspecBuilder;
pub use parse::DEPENDENCY_SCHEMES;
pub use request::{JobRequest, NestedInstance, OnNodeLoss, KILL_TIMEOUT_KEY, ON_NODE_LOSS_KEY};
pub use warning::{signal_label, signal_number, WarnSignal, DEFAULT_WARN_SIGNUM, DEFAULT_WARN_TIMELEFT, SIGNAL_KEY};

/// Most tasks a request may place on each core it asks for: `tasks[0].count.total` may exceed the slot count
/// (tasks then share their slots' cores), but at most this many times the cores requested. A job shell starts,
/// places and tracks each of its tasks, so a count beyond what the job's cores could ever run (say 2^32 - 1 tasks
/// on one core) is refused here, naming the field, rather than handed to a shell to try.
pub const MAX_TASKS_PER_CORE: u32 = 64;

/// Keys of `attributes.system` that are recognised (RFC 14/25 and common Flux
/// usage) but not interpreted by [`Jobspec::validate`]; they do not produce
/// warnings. Any other key besides `duration`, `cwd`, `environment`,
/// `shell` and `requeue` yields a warning in [`JobRequest::warnings`].
pub const RECOGNIZED_SYSTEM_KEYS: &[&str] =
    &["queue", "bank", "project", "constraints", "dependencies", "files", "job", "preemptible-after"];

/// `attributes.system.requeue` (a boolean; `vigil submit --requeue`, Slurm's `sbatch --requeue`): a job that fails
/// because one of its nodes was lost goes back to the queue instead of ending. Not in RFC 14, which leaves
/// `attributes.system` open to the resource manager's own keys. The job shell option of the same name (`-o requeue`)
/// asks for the same thing.
pub const REQUEUE_KEY: &str = "requeue";

/// `attributes.system.instance`: the job's tasks are the brokers of a nested Vigil instance (a batch or alloc job),
/// and this object says the shape it will have, with the brokers' own attribute names: `{"tbon.reparent": "on" |
/// "off", "tbon.topo": "kary:K" | "binomial"}` (both optional; `vigil batch` and `vigil alloc` write it from their
/// `-S` options). The enclosing instance's exec system learns the nested instance's critical ranks from it at once
/// ([`NestedInstance`]), before the instance reports them itself (its `memo`), so that a node lost in the first
/// moments of the job (the nested instance's start-up) is judged as it will be later. Not in RFC 14, which leaves
/// `attributes.system` open.
pub const INSTANCE_KEY: &str = "instance";

/// Errors from parsing, validating or building a jobspec (RFC 14/25).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum JobspecError {
    /// The text was neither valid JSON (when it starts with `{`) nor YAML.
    #[error("jobspec syntax error: {0}")]
    Syntax(String),
    /// A field was missing, of the wrong type, unknown, or violates RFC 25.
    /// `path` names it, e.g. `tasks[0].command`.
    #[error("{path}: {message}")]
    Invalid {
        /// Path of the offending field, e.g. `resources[0].with[0].count`;
        /// `(root)` for the document itself.
        path: String,
        /// What is wrong with it.
        message: String,
    },
    /// A [`JobspecBuilder`] option was invalid (message uses CLI option names,
    /// e.g. `-n 2 is fewer tasks than the 4 node(s) of -N 4: ...`).
    #[error("{0}")]
    Builder(String),
    /// Serialization failed (only from [`Jobspec::to_yaml`]).
    #[error("jobspec serialization failed: {0}")]
    Serialize(String),
}

fn invalid(path: impl Into<String>, message: impl Into<String>) -> JobspecError {
    JobspecError::Invalid { path: path.into(), message: message.into() }
}

/// A jobspec document in RFC 14 structure (not yet checked against RFC 25).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Jobspec {
    /// Jobspec version (`version`); RFC 25 requires 1.
    pub version: u64,
    /// Resource request graph (`resources`).
    pub resources: Vec<Resource>,
    /// Tasks to run (`tasks`).
    pub tasks: Vec<Task>,
    /// Job attributes (`attributes`).
    pub attributes: Attributes,
}

/// A resource vertex (RFC 14 `resources` entry), e.g. `node`, `slot`, `core`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Resource {
    /// Resource type (`type`): `node`, `slot`, `core`, `gpu`, ...
    #[serde(rename = "type")]
    pub kind: String,
    /// How many (`count`).
    pub count: Count,
    /// Slot label (`label`), referenced by `tasks[].slot`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// Exclusive allocation (`exclusive`), meaningful on `node`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exclusive: Option<bool>,
    /// Units of `count` (`unit`, RFC 14), e.g. `GB` for memory; kept, not interpreted (the V1 types `node`,
    /// `slot`, `core` and `gpu` are counted in units of themselves).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unit: Option<String>,
    /// Identifiers of the resources to match (`id`, RFC 14); refused by [`Jobspec::validate`] (not in V1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Child vertices (`with`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub with: Vec<Resource>,
}

/// A resource `count`: an integer, an RFC 14 range object, or an RFC 14 count string.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum Count {
    /// A fixed count, e.g. `count: 4`.
    Fixed(u64),
    /// A range, e.g. `count: {min: 2}`; V1 uses `min`.
    Range(CountRange),
    /// A count string (RFC 14): an RFC 22 idset of acceptable counts (`"4,9,16"`) or an RFC 45 range
    /// (`"2-8:2:*"`). Kept as written; refused by [`Jobspec::validate`] (V1 counts are integers).
    Text(String),
}

/// RFC 14 range count: `{min, max?, operator?, operand?}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CountRange {
    /// Minimum count.
    pub min: u64,
    /// Maximum count.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max: Option<u64>,
    /// Progression operator: `+`, `*` or `^`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub operator: Option<String>,
    /// Progression operand.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub operand: Option<u64>,
}

/// A task entry (RFC 14 `tasks` element).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Task {
    /// Command and arguments (`command`).
    pub command: Vec<String>,
    /// Label of the slot the task runs in (`slot`).
    pub slot: String,
    /// Task count (`count`).
    pub count: TaskCount,
    /// Per-task attributes (`attributes`), kept opaque.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attributes: Option<Map<String, Value>>,
    /// Task placement hint for the launcher (`distribution`, RFC 14); kept, not interpreted (Vigil's shell
    /// places tasks by its `taskmap` option), so [`Jobspec::validate`] warns when it is given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub distribution: Option<String>,
}

/// Task `count`: `{per_slot: N}`, `{total: N}` or `{per_resource: {type, count}}` (serialized as a
/// one-entry mapping in both JSON and YAML).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskCount {
    /// `{per_slot: N}`: N tasks in each slot (V1 requires 1).
    PerSlot(u64),
    /// `{total: N}`: N tasks distributed over all slots.
    Total(u64),
    /// `{per_resource: {type: T, count: N}}` (RFC 14): N tasks on each resource of type T in the slot; refused
    /// by [`Jobspec::validate`] (not in V1).
    PerResource {
        /// The resource type (`type`), e.g. `node`.
        kind: String,
        /// Tasks on each such resource (`count`).
        count: u64,
    },
}

impl Serialize for TaskCount {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(1))?;
        match self {
            TaskCount::PerSlot(n) => map.serialize_entry("per_slot", n)?,
            TaskCount::Total(n) => map.serialize_entry("total", n)?,
            TaskCount::PerResource { kind, count } => {
                map.serialize_entry("per_resource", &serde_json::json!({"type": kind, "count": count}))?
            }
        }
        map.end()
    }
}

/// The `attributes` section.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct Attributes {
    /// `attributes.system`: attributes interpreted by the resource manager.
    pub system: System,
    /// `attributes.user`: free-form user attributes; omitted when empty.
    #[serde(skip_serializing_if = "Map::is_empty")]
    pub user: Map<String, Value>,
}

/// `attributes.system`.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct System {
    /// Time limit in seconds, `>= 0`; 0 means unlimited (RFC 25 requires it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration: Option<f64>,
    /// Working directory of the tasks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Environment of the tasks; omitted when empty.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub environment: BTreeMap<String, String>,
    /// Job shell settings.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shell: Option<Shell>,
    /// Any other keys, kept verbatim.
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// `attributes.system.shell`.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct Shell {
    /// `options`: job shell options (e.g. `{"verbose": 1}`).
    pub options: Map<String, Value>,
    /// Any other keys, kept verbatim.
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

impl Jobspec {
    /// Encode as compact JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_value(self).map(|v| v.to_string()).unwrap_or_default()
    }

    /// Encode as YAML.
    ///
    /// # Errors
    /// [`JobspecError::Serialize`] if the YAML emitter fails.
    pub fn to_yaml(&self) -> Result<String, JobspecError> {
        serde_yaml::to_string(self).map_err(|e| JobspecError::Serialize(e.to_string()))
    }
}
