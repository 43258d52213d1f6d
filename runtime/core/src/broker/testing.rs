//! A broker of a simulated instance, for the unit tests here and the simulator (`vigil-sim`): every node
//! `node<rank>` with `cores` cores, the instance owner [`UID`], eventlog times counted from [`WALL_ORIGIN`].

use super::core::{Broker, Environment, Time};
use super::BrokerOptions;
use crate::topology::Topology;
use vigil_proto::node::NodeResources;

/// The simulated instance owner.
pub const UID: u32 = 1000;
/// Wall-clock time at the simulation's start (eventlog timestamps), seconds since the epoch.
pub const WALL_ORIGIN: f64 = 1_800_000_000.0;

/// A broker of a simulated instance (also for the sans-IO broker's unit tests): rank `rank` of `size` in shape
/// `topo`, `cores` cores, on the simulated node `node<rank>`, created at `now`.
pub fn new_broker(
    rank: u32,
    size: u32,
    topo: Topology,
    cores: u32,
    membership: crate::membership::Config,
    now: Time,
) -> Broker {
    let opts = BrokerOptions {
        rank,
        size,
        hostname: format!("node{rank}"),
        instance: "sim".into(),
        endpoints: Vec::new(),
        hosts: Vec::new(),
        rundir: std::path::PathBuf::from("/nonexistent/vigil-sim"),
        // FCFS, so that the scenarios' order check (scenario.rs, invariant 5) holds; the simulated jobs have no
        // time limits, and EASY backfill is property-tested on the job core (jobs/tests_sched.rs).
        config: crate::attrs::BrokerConfig {
            topo,
            membership,
            sched_policy: crate::attrs::SchedPolicy::Fcfs,
            ..Default::default()
        },
        initial_program: None,
        resources_override: None,
    };
    let env = Environment {
        uid: UID,
        pid: 100_000 + rank,
        wall_origin: WALL_ORIGIN,
        local_uri: format!("local://sim/{rank}"),
        resources: NodeResources {
            cores,
            pus: cores,
            numa: 1,
            packages: 1,
            gpus: 0,
            gpu_names: vec![],
            source: "simulated".into(),
        },
        topology: "simulated".into(),
        containment: "simulated".into(),
        metrics: "off".into(),
    };
    Broker::new(opts, env, now)
}
