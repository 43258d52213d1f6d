//! RFC 21 job states and the events that drive them.
//!
//! A job's state is a pure function of its eventlog: [`JobState::apply`] folds one event; replaying a whole
//! eventlog with [`replay`] reproduces the state the job manager holds.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Job states of RFC 21.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum JobState {
    /// Submitted, not yet validated.
    New,
    /// Waiting for dependencies.
    Depend,
    /// Waiting for a priority.
    Priority,
    /// Waiting for resources.
    Sched,
    /// Resources allocated; shells running.
    Run,
    /// Finished or failed; resources being released.
    Cleanup,
    /// Done; the eventlog is final.
    Inactive,
}

impl JobState {
    /// Short name as `vigil jobs` prints it (`S`, `R`, `CD`... are Slurm's; Flux prints these words).
    pub fn name(&self) -> &'static str {
        match self {
            JobState::New => "NEW",
            JobState::Depend => "DEPEND",
            JobState::Priority => "PRIORITY",
            JobState::Sched => "SCHED",
            JobState::Run => "RUN",
            JobState::Cleanup => "CLEANUP",
            JobState::Inactive => "INACTIVE",
        }
    }

    /// True while the job has not reached INACTIVE.
    pub fn is_active(&self) -> bool {
        *self != JobState::Inactive
    }

    /// The state after `event` (an RFC 21 event name with its context), or an error if the event is not
    /// allowed in this state. `exception` with `severity` 0 moves DEPEND..RUN to CLEANUP; other severities
    /// leave the state alone.
    pub fn apply(self, name: &str, context: &serde_json::Value) -> Result<JobState, TransitionError> {
        use JobState::*;
        let next = match (self, name) {
            (New, "validate") => Depend,
            (New, "invalidate") => Inactive,
            (Depend, "depend") => Priority,
            // RFC 21: a dependency waited for, and met (`depend.rs`).
            (Depend, "dependency-add" | "dependency-remove") => Depend,
            // RFC 21: a pending job's urgency changed (`urgency.rs`); a job in SCHED gets its priority again.
            (Depend | Priority | Sched, "urgency") => self,
            (Priority, "priority") => Sched,
            (Sched, "alloc") => Run,
            (Run, "finish") => Cleanup,
            (Depend | Priority | Sched | Run, "exception") => {
                let sev = context.get("severity").and_then(|v| v.as_u64()).unwrap_or(0);
                if sev == 0 {
                    Cleanup
                } else {
                    self
                }
            }
            (Cleanup, "exception") => Cleanup,
            (Cleanup, "clean") => Inactive,
            // Not RFC 21: a job that lost a node goes back to the queue once its resources are released
            // (`requeue.rs`).
            (Cleanup, "requeue") => Sched,
            (_, "submit") if self == New => New,
            (Sched, "priority") => Sched,
            (Run | Cleanup, "start" | "release" | "free" | "finish" | "shell-exit") => self,
            (Run, "exec") => Run,
            (_, "debug" | "annotations" | "memo") => self,
            _ => return Err(TransitionError { state: self, event: name.to_string() }),
        };
        Ok(next)
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An event not allowed in the current state.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("event '{event}' is not valid in state {state}")]
pub struct TransitionError {
    /// State the job was in.
    pub state: JobState,
    /// Offending event name.
    pub event: String,
}

/// Replay `(name, context)` pairs from NEW; the eventlog must start with `submit`.
pub fn replay<'a>(
    events: impl IntoIterator<Item = (&'a str, &'a serde_json::Value)>,
) -> Result<JobState, TransitionError> {
    let mut s = JobState::New;
    for (n, c) in events {
        s = s.apply(n, c)?;
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn happy_path() {
        let e = json!({});
        let names =
            ["submit", "validate", "depend", "priority", "alloc", "start", "finish", "release", "free", "clean"];
        assert_eq!(replay(names.iter().map(|n| (*n, &e))).unwrap(), JobState::Inactive);
    }

    #[test]
    fn exceptions() {
        let fatal = json!({"type": "cancel", "severity": 0});
        let warn = json!({"type": "node-failure", "severity": 2});
        assert_eq!(JobState::Run.apply("exception", &warn).unwrap(), JobState::Run);
        assert_eq!(JobState::Run.apply("exception", &fatal).unwrap(), JobState::Cleanup);
        assert_eq!(JobState::Sched.apply("exception", &fatal).unwrap(), JobState::Cleanup);
        assert!(JobState::Inactive.apply("exception", &fatal).is_err());
        assert!(JobState::Sched.apply("finish", &json!({})).is_err());
        assert!(JobState::New.apply("alloc", &json!({})).is_err());
    }

    #[test]
    fn requeue_goes_from_cleanup_back_to_sched() {
        let e = json!({});
        let fatal = json!({"type": "exec", "severity": 0});
        let mut events: Vec<(&str, &serde_json::Value)> =
            ["submit", "validate", "depend", "priority", "alloc", "start"].iter().map(|n| (*n, &e)).collect();
        events.extend([("exception", &fatal), ("release", &e), ("free", &e), ("requeue", &e)]);
        assert_eq!(replay(events.iter().copied()).unwrap(), JobState::Sched);
        events.extend(["alloc", "start", "finish", "release", "free", "clean"].iter().map(|n| (*n, &e)));
        assert_eq!(replay(events).unwrap(), JobState::Inactive);
        assert!(JobState::Run.apply("requeue", &e).is_err(), "only once the run is cleaned up");
    }
}
