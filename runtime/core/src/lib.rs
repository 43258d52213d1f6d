//! # Vigil core: the sans-IO rules
//!
//! Everything Vigil decides, as state machines with the time passed in and effects handed out: no tokio, sockets,
//! files, processes, clocks or random numbers, and no libc (the compiler and `ci/test.sh` check the dependency
//! tree). The tokio driver in `vigil` feeds the real brokers; the simulator (`vigil-sim`) runs thousands of them in
//! one process on virtual time; the unit tests here drive them input by input. Whatever a rule is, it can be tried
//! at full size, with injected failures, deterministically, before it touches a cluster.
//!
//! - [`broker`]: one broker's rules as one state machine (`Broker`: inputs and the time in, effects and its next
//!   deadline out): routing, the hello, heartbeats, liveness verdicts, rank 0's instance membership, every
//!   service, re-parenting and rejoining a restarted rank 0;
//! - [`jobs`]: the job manager, scheduler and exec rules (RFC 21 job states, EASY backfill / FCFS, shrink,
//!   requeue, time limits, kill escalation, critical-rank failure rules) and rank 0's journal;
//! - [`membership`]: one link's liveness (online, torpid, lost) from every signal; [`probe`]: when a kernel
//!   probe counts as missed (each child's reply time);
//! - [`health`]: when a node's health check runs, and when it drains and undrains the node;
//! - [`attrs`]: every broker attribute in one table, parsed once into a typed [`attrs::BrokerConfig`];
//! - [`signal`]: the signal numbers the rules hand out (Linux's values), so that no libc is linked.
//!
//! The formats and codecs they read and write are `vigil-proto`'s, re-exported here under the paths the rules
//! use ([`idset`], [`message`], [`jobspec`]...).

pub mod attrs;
pub mod broker;
pub mod health;
pub mod jobs;
pub mod membership;
pub mod probe;
pub mod signal;

// The pure formats and codecs (`vigil-proto`), under the same paths as in `vigil`.
pub use vigil_proto::{
    constraint, duration, eventlog, hostlist, idset, jobspec, message, r, shellproto, taskmap, topology,
};
// The PMI-1 limits, for the PMI barrier's checks (broker/services/job_exec.rs).
use vigil_proto::pmi;

/// What a JSON value is, for error messages that name what a peer or client sent ("an array", "null").
pub(crate) fn json_kind(v: &serde_json::Value) -> &'static str {
    use serde_json::Value;
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
