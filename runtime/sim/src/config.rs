//! What to simulate: [`Config`] (brokers, tree shape, seed, latency, the attributes of every broker) and [`Load`]
//! (a loaded network and starved nodes). The world they configure is in `lib.rs`; what a run reports is in
//! `report.rs`.

use std::time::Duration;

use crate::topology::Topology;

/// What to simulate.
#[derive(Clone, Debug)]
pub struct Config {
    /// Number of brokers (ranks 0..brokers).
    pub brokers: u32,
    /// TBON shape.
    pub topo: Topology,
    /// Seed of every random choice (fault times and targets, job shapes, start-up jitter).
    pub seed: u64,
    /// One-way latency of an overlay link.
    pub latency: Duration,
    /// Cores per node.
    pub cores: u32,
    /// `tbon.reparent`: orphans of a lost router re-parent (true, the default) or exit.
    pub reparent: bool,
    /// Every broker probes its parent's node by unicast, as a parent probes its children (`true`, the default, as
    /// the product does where it has a prober: the parent's probe port comes in `hello-ack`). `false` plays a
    /// broker without a prober, judging its parent link on TCP alone (see docs/failure-detection.md, "Re-parenting").
    pub probe_parent: bool,
    /// `sched.policy` of rank 0: FCFS (the default here, so that the scenarios' order check, invariant 5 of
    /// `scenario.rs`, holds) or EASY (`depth.rs`).
    pub sched_policy: crate::attrs::SchedPolicy,
    /// Rank 0 has a state directory: it journals every turn into an in-memory store
    /// ([`Kept`](crate::jobs::journal::Kept), the same contract as the SQLite one) that outlives its broker,
    /// commits before carrying out the turn's effects (as the real driver does), and is restored from it when it
    /// restarts ([`Fault::Restart`](crate::Fault::Restart) of rank 0); every broker runs with `tbon.parent_grace`
    /// [`PARENT_GRACE`] (the real default with a state directory), so that the others outlive rank 0 and rejoin
    /// it. The client retries a submission its connection failed for.
    pub statedir: bool,
    /// Load on the machine and its network ([`Load`]); none by default (the other scenarios' traces are those of a
    /// quiet machine).
    pub load: Load,
}

/// Load injected into the simulated machine and network (the `overload` scenario): a congested network, starved
/// nodes whose brokers run late, and nodes without a kernel responder. All zero by default: nothing is drawn from
/// the seed for it then, so the traces of the other scenarios do not change.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Load {
    /// Queueing delay on every link: each overlay message, probe and reply waits up to this long more (uniform),
    /// overlay messages in order on each link (a TCP stream).
    pub jitter: Duration,
    /// Probability that a probe, a reply or a check's SYN is lost, and that an overlay segment is resent
    /// (delivered one retransmission timeout later, 10-50 ms).
    pub loss: f64,
    /// Starved nodes run their broker in bursts: stopped for up to this long (uniform), then running for up to as
    /// long, again and again; their kernel holds the ACKs of the broker's sockets meanwhile (a process preempted
    /// while it holds its socket's lock), while kernel probe replies and the SYN of a check are answered on time
    /// (softirq). Its timers fire late: the judge on such a node is late too.
    pub starve: Duration,
    /// Share of the nodes (rank 0 included) that are starved, 0 to 1.
    pub starved_share: f64,
    /// Share of the nodes whose probe responder runs in userspace (no XDP): their replies come from the broker,
    /// late when it is, and never arm the probe miss rule, so their links are judged on TCP and confirmed.
    pub userspace_share: f64,
}

impl Load {
    /// Whether any load is set.
    pub fn any(&self) -> bool {
        !self.jitter.is_zero()
            || self.loss > 0.0
            || (self.starved_share > 0.0 && !self.starve.is_zero())
            || self.userspace_share > 0.0
    }
}

/// `tbon.parent_grace` of every broker with [`Config::statedir`], seconds: the real default with a state
/// directory (`attrs::DEFAULT_PARENT_GRACE`).
pub const PARENT_GRACE: f64 = crate::attrs::DEFAULT_PARENT_GRACE;

/// With [`Config::statedir`], a submission that failed for the client's connection to rank 0 (refused: rank 0
/// is down; reset: rank 0 died with it in flight) is sent again this long after, as a client would.
pub const CLIENT_RETRY: Duration = Duration::from_secs(1);

impl Config {
    /// `brokers` brokers in shape `topo`, seed `seed`, 50 µs links, 4 cores per node.
    pub fn new(brokers: u32, topo: Topology, seed: u64) -> Config {
        Config {
            brokers,
            topo,
            seed,
            latency: Duration::from_micros(50),
            cores: 4,
            reparent: true,
            probe_parent: true,
            sched_policy: crate::attrs::SchedPolicy::Fcfs,
            statedir: false,
            load: Load::default(),
        }
    }
}
