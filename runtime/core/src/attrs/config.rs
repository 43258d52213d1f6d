//! The broker's typed configuration ([`BrokerConfig`]): its fields and defaults, parsing a set of attributes into
//! it ([`BrokerConfig::parse`], [`AttrError`]) and writing each back as `-S` would ([`BrokerConfig::value`]).

use super::parse::Draft;
use super::{
    lookup, DetectorChoice, Discovery, ProbeGroup, RdmaFrame, RdmaPoll, SchedPolicy, Transport, XdpMode, ATTRS,
};
use crate::topology::Topology;
use std::collections::BTreeMap;
use std::path::PathBuf;
use vigil_proto::node::TopologySource;

/// The broker's configuration: every settable attribute of [`ATTRS`] as a typed field, checked
/// ([`BrokerConfig::parse`]). Durations are in seconds.
#[derive(Clone, Debug, PartialEq)]
pub struct BrokerConfig {
    /// `tbon.topo` / `tbon.fanout`: the TBON shape (routing, liveness, re-parenting and getattr all read it here).
    pub topo: Topology,
    /// `tbon.connect_timeout`, seconds (finite, > 0): how long a broker retries its parent at start (the driver
    /// reads it here when it connects).
    pub connect_timeout: f64,
    /// `tbon.reparent`: a broker whose parent is lost re-parents (true) or exits (false).
    pub reparent: bool,
    /// `tbon.parent_grace` as set, seconds (finite, >= 0); `None` = the default ([`BrokerConfig::parent_grace`]).
    pub parent_grace_set: Option<f64>,
    /// `tbon.heartbeat_period`, `tbon.torpid_max`, `tbon.lost_timeout`, `tbon.probe_period` (seconds) and
    /// `tbon.probe_misses`: the membership thresholds; heartbeat_period < torpid_max.
    pub membership: crate::membership::Config,
    /// `tbon.probe_group`.
    pub probe_group: ProbeGroup,
    /// `tbon.job_network`: the interface of this node's job network, probed by the parent besides the
    /// management network (`crate::membership::FabricWatch`); `None` = not probed.
    pub job_network: Option<String>,
    /// `tbon.job_network_undrain_after`, seconds (> 0; infinite = never): how long a fabric-down node's job
    /// network must answer without a miss before the parent undrains it.
    pub job_network_undrain_after: f64,
    /// `broker.detectors`.
    pub detectors: DetectorChoice,
    /// `broker.detector-rank`: the rank that loads this machine's eBPF detectors; `None` = each broker its own.
    pub detector_rank: Option<u32>,
    /// `broker.xdp_mode`.
    pub xdp_mode: XdpMode,
    /// `tbon.transport`.
    pub transport: Transport,
    /// `tbon.ofi_provider`: the libfabric provider of ofi links.
    pub ofi_provider: String,
    /// `tbon.rdma_timeout` (`timeout`), `tbon.rdma_retry_cnt` (`retry_cnt`), `tbon.rdma_max_inline` (`max_inline`,
    /// bytes) and `tbon.rdma_poll` (`busy_poll`); the other fields keep their defaults. Valid
    /// ([`vigil_flow::config::Config::validate`]).
    pub rdma: vigil_flow::config::Config,
    /// `tbon.rdma_frame`.
    pub rdma_frame: RdmaFrame,
    /// `resource.synthetic` / `resource.xml` (at most one), else the live machine. Not loaded here: the command
    /// starting the broker loads a synthetic or XML one once to check it, the driver's node discovery again.
    pub topology: TopologySource,
    /// `resource.gpus`: GPUs declared, overriding discovery (the driver's discovery uses it, and the node's
    /// registration with rank 0 carries it to its job shells).
    pub gpus: Option<u32>,
    /// `resource.discovery`.
    pub discovery: Discovery,
    /// `exec.kill-timeout`, seconds (may be infinite): SIGTERM to SIGKILL, and on each node, SIGKILL of a job's
    /// cgroup to the verdict that what is left in it is unkillable (`broker/unkillable.rs`).
    pub kill_timeout: f64,
    /// `exec.kill-timeout-max`, seconds (may be infinite): the most a job's own `kill-timeout` may be; the
    /// instance's `exec.kill-timeout` is always allowed too.
    pub kill_timeout_max: f64,
    /// `sched.policy`.
    pub sched_policy: SchedPolicy,
    /// `sched.default-duration`, seconds (> 0; infinite = no limit): the time limit of jobs submitted without one.
    pub default_duration: f64,
    /// `sched.max-requeue`: how many times one job may be requeued after losing a node.
    pub max_requeue: u32,
    /// `sched.backfill-depth`: most pending jobs one scheduling pass looks at (>= 1).
    pub backfill_depth: usize,
    /// `job-manager.inactive-age-limit`: seconds after which an INACTIVE job is purged; `inf`: never.
    pub inactive_age_limit: f64,
    /// `job-manager.inactive-num-limit`: most INACTIVE jobs kept; 0: no limit.
    pub inactive_num_limit: usize,
    /// `job-manager.cc-limit`: most copies one `--cc` makes ([`DEFAULT_CC_LIMIT`]); 0: no limit.
    pub cc_limit: usize,
    /// `job-manager.history-age-limit`: seconds after its job ended that a history record goes; `inf`: never.
    pub history_age_limit: f64,
    /// `job-manager.history-num-limit`: most history records kept; 0: no limit.
    pub history_num_limit: usize,
    /// `exec.shell`: the job shell program; `None` = `$VIGIL_SHELL`, else `vigil-shell` beside `vigil`.
    pub shell: Option<PathBuf>,
    /// `exec.imp`: the privileged launcher (`vigil-imp`) of a multi-user instance whose brokers are not root;
    /// `None` = `vigil-imp` beside `vigil`.
    pub imp: Option<PathBuf>,
    /// `exec.containment`: `auto`, `cgroup` or `pgroup` (see `broker/cgroup.rs`).
    pub containment: String,
    /// `exec.cgroup-spawn`: `auto` or `move` (see `broker/spawn.rs`).
    pub cgroup_spawn: String,
    /// `exec.alloc-tmpdir-base`: where a job of an instance that runs in no allocation gets its node-local
    /// allocation directory; `None` = in its own temporary directory
    /// ([`vigil_proto::shellproto::alloc_tmpdir`]).
    pub alloc_tmpdir_base: Option<PathBuf>,
    /// `access.allow-guest-users`: users other than the instance owner may connect (a multi-user system
    /// instance, docs/security.md); false: the owner only.
    pub allow_guest_users: bool,
    /// `health.program`: the node health check program; `None` = no health check (`crate::health`).
    pub health_program: Option<PathBuf>,
    /// `health.interval`, seconds (finite, > 0): from one run's start to the next.
    pub health_interval: f64,
    /// `health.timeout`, seconds (finite, > 0): a run going on this long fails and is killed.
    pub health_timeout: f64,
    /// `log-level`: an `EnvFilter` directive; `None` = `$VIGIL_LOG`, else `warn` (the command starting the
    /// broker resolves it before the broker runs).
    pub log_level: Option<String>,
    /// `rundir` as set (the broker's `--rundir` and built-in choice are in `BrokerOptions::rundir`).
    pub rundir: Option<PathBuf>,
    /// `statedir`: where rank 0 keeps its jobs across a restart (`broker/store.rs`); `None` = nowhere.
    pub statedir: Option<PathBuf>,
    /// `instance-level`: 0, or the enclosing instance's + 1.
    pub instance_level: u32,
    /// `jobid`: the enclosing instance's job this instance runs as (nested instances only).
    pub jobid: Option<String>,
    /// `parent-uri`: the enclosing instance's broker on this node (nested instances only), where rank 0 reports,
    /// once the instance is up, where it lives and which of its ranks are critical.
    pub parent_uri: Option<String>,
    /// `broker.tolerate-lost`: how many of a nested instance's brokers may never join (their node lost, or their
    /// broker failed, before they joined) and the instance still start, without them; more fail its job at once.
    pub tolerate_lost: u32,
    /// `alloc-tmpdir`: the enclosing allocation's directory on this node, which every job of this (nested)
    /// instance shares as its `VIGIL_ALLOC_TMPDIR`; `None` outside a batch or alloc job.
    pub alloc_tmpdir: Option<PathBuf>,
    /// `metrics.listen`: where the broker serves its metrics over HTTP (`driver/src/broker/metrics.rs`); `None` =
    /// nowhere.
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// `metrics.ranks`: the ranks that serve `metrics.listen`; `None` = every rank.
    pub metrics_ranks: Option<crate::idset::IdSet>,
}

impl Default for BrokerConfig {
    /// Every attribute at its default (the [`DefaultValue::Value`](super::DefaultValue::Value)s of [`ATTRS`]).
    fn default() -> BrokerConfig {
        BrokerConfig {
            topo: Topology::default(),
            connect_timeout: 60.0,
            reparent: true,
            parent_grace_set: None,
            membership: crate::membership::Config::default(),
            probe_group: ProbeGroup::Auto,
            job_network: None,
            job_network_undrain_after: f64::INFINITY,
            detectors: DetectorChoice::Auto,
            detector_rank: None,
            tolerate_lost: 0,
            xdp_mode: XdpMode::Auto,
            transport: Transport::Auto,
            ofi_provider: "cxi".into(),
            rdma: vigil_flow::config::Config::default(),
            rdma_frame: RdmaFrame::Packed,
            topology: TopologySource::Live,
            gpus: None,
            discovery: Discovery::Hwloc,
            kill_timeout: crate::jobs::DEFAULT_KILL_TIMEOUT,
            kill_timeout_max: crate::jobs::DEFAULT_KILL_TIMEOUT_MAX,
            sched_policy: SchedPolicy::Easy,
            default_duration: f64::INFINITY,
            max_requeue: crate::jobs::DEFAULT_MAX_REQUEUE,
            backfill_depth: crate::jobs::BACKFILL_DEPTH,
            inactive_age_limit: f64::INFINITY,
            inactive_num_limit: 0,
            history_age_limit: f64::INFINITY,
            history_num_limit: 0,
            cc_limit: DEFAULT_CC_LIMIT,
            shell: None,
            imp: None,
            containment: "auto".into(),
            cgroup_spawn: "auto".into(),
            alloc_tmpdir_base: None,
            allow_guest_users: false,
            health_program: None,
            health_interval: crate::health::DEFAULT_INTERVAL,
            health_timeout: crate::health::DEFAULT_TIMEOUT,
            log_level: None,
            rundir: None,
            statedir: None,
            instance_level: 0,
            jobid: None,
            parent_uri: None,
            alloc_tmpdir: None,
            metrics_listen: None,
            metrics_ranks: None,
        }
    }
}

/// Why a set of attributes was refused ([`BrokerConfig::parse`]). Each names the attribute and what is expected.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum AttrError {
    /// A name not in [`ATTRS`]: the settable name nearest to it is offered when one is close (a typo such as
    /// `tbon.fanuot`), else every settable name.
    #[error("unknown attribute '{0}' ({hint})", hint = unknown_hint(.0))]
    Unknown(String),
    /// A name the broker sets itself ([`Access::Broker`](super::Access::Broker)).
    #[error("attribute '{0}' is read-only: the broker sets it (see `vigil lsattr`)")]
    ReadOnly(String),
    /// A value this attribute does not take.
    #[error("invalid {name} '{value}': {expected}")]
    Invalid {
        /// The attribute.
        name: &'static str,
        /// The value given.
        value: String,
        /// What it takes, or why this value is refused.
        expected: String,
    },
    /// `tbon.topo` and `tbon.fanout` both set, to different shapes.
    #[error("tbon.topo={topo} and tbon.fanout={fanout} disagree: set one of them (tbon.fanout=K is tbon.topo=kary:K)")]
    TopoFanout {
        /// `tbon.topo` as given.
        topo: String,
        /// `tbon.fanout` as given.
        fanout: String,
    },
    /// `resource.synthetic` and `resource.xml` both set.
    #[error("set only one of resource.synthetic and resource.xml")]
    TwoTopologies,
    /// `tbon.heartbeat_period` not shorter than `tbon.torpid_max`.
    #[error(
        "tbon.heartbeat_period ({} ms) must be shorter than tbon.torpid_max ({} ms), or every peer looks torpid",
        (.heartbeat * 1e4).round() / 10.0, (.torpid * 1e4).round() / 10.0
    )]
    HeartbeatNotShorter {
        /// `tbon.heartbeat_period`, seconds.
        heartbeat: f64,
        /// `tbon.torpid_max`, seconds.
        torpid: f64,
    },
    /// `tbon.stall_max` longer than `tbon.torpid_max`.
    #[error(
        "tbon.stall_max ({} ms) must not be longer than tbon.torpid_max ({} ms): a stalled broker would be torpid \
         by the silence rule first, and tbon.stall_max would do nothing",
        (.stall * 1e4).round() / 10.0, (.torpid * 1e4).round() / 10.0
    )]
    StallLongerThanTorpid {
        /// `tbon.stall_max`, seconds.
        stall: f64,
        /// `tbon.torpid_max`, seconds.
        torpid: f64,
    },
}

/// The names `-S` accepts, comma-separated.
fn settable_names() -> String {
    ATTRS.iter().filter(|a| a.access.settable()).map(|a| a.name).collect::<Vec<_>>().join(", ")
}

/// The settable attribute nearest to `name` by edit distance (Levenshtein, over characters), if within two edits or
/// a quarter of its length, whichever is more: what a typo of one most likely meant.
fn nearest_settable(name: &str) -> Option<&'static str> {
    ATTRS
        .iter()
        .filter(|a| a.access.settable())
        .map(|a| (strsim::levenshtein(name, a.name), a.name))
        .min()
        .filter(|(d, a)| *d <= 2.max(a.len() / 4))
        .map(|(_, a)| a)
}

/// What [`AttrError::Unknown`] adds after the name: `did you mean X?`, or the settable names.
fn unknown_hint(name: &str) -> String {
    match nearest_settable(name) {
        Some(a) => format!("did you mean {a}? `vigil lsattr` lists them all"),
        None => format!("known: {}", settable_names()),
    }
}

/// `job-manager.cc-limit`'s default: most copies one `--cc` makes, Slurm's MaxArraySize shape (its default is
/// 1,001 array indices; ours is ten times that, for the thousands of short jobs a test of the queue submits).
pub const DEFAULT_CC_LIMIT: usize = 10_001;

/// Seconds as an RFC 23 duration (`50ms`, `5s`, `1m`, `inf`).
pub(crate) fn fmt_duration(s: f64) -> String {
    if s.is_infinite() {
        return "inf".into();
    }
    match std::time::Duration::try_from_secs_f64(s) {
        Ok(d) => crate::duration::format_duration(d),
        Err(_) => format!("{s}s"),
    }
}

/// The default `tbon.parent_grace` with a state directory (seconds): long enough for a supervisor to restart rank 0
/// (systemd's `Restart=on-failure` waits 100 ms) and for rank 0 to read a store of 100,000 jobs and start
/// listening, with room for a rank 0 that is slow to be rescheduled on a busy node; the same as
/// `tbon.connect_timeout`, the time a broker waits for its parent at start. What it costs when rank 0 never comes
/// back: the other brokers, their job shells and their tasks go on for this long before they exit as they would
/// at once without it.
pub const DEFAULT_PARENT_GRACE: f64 = 60.0;

impl BrokerConfig {
    /// Where broker `rank` serves its metrics (`metrics.listen`, if `metrics.ranks` includes it); `None`: it
    /// serves none.
    pub fn metrics_address(&self, rank: u32) -> Option<std::net::SocketAddr> {
        self.metrics_listen.filter(|_| self.metrics_ranks.as_ref().is_none_or(|r| r.contains(rank)))
    }

    /// Checks `metrics.ranks` against the instance's `size`: a rank it names that no broker has would serve
    /// nothing, and an admin scraping it would see only a refused connection, so it is refused at start-up.
    ///
    /// # Errors
    /// The ranks past `size - 1`, the size, and what would fit.
    pub fn check_metrics_ranks(&self, size: u32) -> Result<(), String> {
        let Some(ranks) = &self.metrics_ranks else { return Ok(()) };
        let mut beyond = crate::idset::IdSet::new();
        for r in ranks.iter().rev().take_while(|&r| r >= size) {
            beyond.insert(r);
        }
        if beyond.is_empty() {
            return Ok(());
        }
        Err(format!(
            "metrics.ranks={ranks} names rank{} {beyond}, but this instance has {size} broker{}",
            if beyond.len() == 1 { "" } else { "s" },
            if size == 1 { " (rank 0)".to_string() } else { format!("s (ranks 0-{})", size - 1) },
        ))
    }

    /// `tbon.parent_grace` in effect, seconds: as set, else [`DEFAULT_PARENT_GRACE`] when the instance has a
    /// state directory (`statedir`, given to this broker or in the TOML bootstrap), else 0: without one a
    /// restarted rank 0 knows no job, so there is nothing to keep running for.
    pub fn parent_grace(&self) -> f64 {
        self.parent_grace_set.unwrap_or(if self.statedir.is_some() { DEFAULT_PARENT_GRACE } else { 0.0 })
    }

    /// Parses and checks `-S` attributes (`name → value`, as given; a caller adds the values of the TOML
    /// `[tbon]` table or of a nested instance's bootstrap for names the command line leaves unset). Attributes
    /// not given keep their defaults ([`BrokerConfig::default`]).
    ///
    /// # Errors
    /// The first of: a name not in [`ATTRS`] ([`AttrError::Unknown`]) or one the broker sets
    /// ([`AttrError::ReadOnly`]); a value the attribute does not take ([`AttrError::Invalid`], in name order);
    /// `tbon.topo` and `tbon.fanout` disagreeing; both `resource.synthetic` and `resource.xml`;
    /// `tbon.heartbeat_period` not shorter than `tbon.torpid_max`; `tbon.stall_max` set longer than
    /// `tbon.torpid_max` (unset, it is `tbon.torpid_max` when that is shorter than its default).
    pub fn parse(attrs: &BTreeMap<String, String>) -> Result<BrokerConfig, AttrError> {
        let mut known = Vec::with_capacity(attrs.len());
        for (name, value) in attrs {
            match lookup(name) {
                None => return Err(AttrError::Unknown(name.clone())),
                Some(a) if !a.access.settable() => return Err(AttrError::ReadOnly(name.clone())),
                Some(a) => known.push((a.name, value)),
            }
        }
        let mut d = Draft { stall_set: known.iter().any(|(n, _)| *n == "tbon.stall_max"), ..Draft::default() };
        for (name, value) in known {
            d.set(name, value).map_err(|expected| AttrError::Invalid { name, value: value.clone(), expected })?;
        }
        d.finish()
    }

    /// The value in effect of settable attribute `name`, as `-S` would write it (durations in RFC 23 form);
    /// `None` when it is unset ([`DefaultValue::Otherwise`](super::DefaultValue::Otherwise)) or not a settable
    /// attribute.
    pub fn value(&self, name: &str) -> Option<String> {
        let m = &self.membership;
        Some(match name {
            "tbon.topo" => self.topo.to_string(),
            "tbon.fanout" => match self.topo {
                Topology::Kary(k) => k.to_string(),
                Topology::Binomial => return None,
            },
            "tbon.connect_timeout" => fmt_duration(self.connect_timeout),
            "tbon.heartbeat_period" => fmt_duration(m.heartbeat_period),
            "tbon.torpid_max" => fmt_duration(m.torpid_max),
            "tbon.stall_max" => fmt_duration(m.stall_max),
            "tbon.lost_timeout" => fmt_duration(m.lost_timeout),
            "tbon.probe_period" => fmt_duration(m.probe_period),
            "tbon.probe_misses" => m.probe_misses.to_string(),
            "tbon.reparent" => (if self.reparent { "on" } else { "off" }).into(),
            "tbon.parent_grace" => fmt_duration(self.parent_grace()),
            "tbon.probe_group" => self.probe_group.to_string(),
            "tbon.job_network" => self.job_network.clone()?,
            "tbon.job_network_undrain_after" => fmt_duration(self.job_network_undrain_after),
            "broker.detectors" => self.detectors.name().into(),
            "broker.detector-rank" => self.detector_rank?.to_string(),
            "broker.xdp_mode" => self.xdp_mode.name().into(),
            "tbon.transport" => self.transport.name().into(),
            "tbon.ofi_provider" => self.ofi_provider.clone(),
            "tbon.rdma_timeout" => self.rdma.timeout.to_string(),
            "tbon.rdma_retry_cnt" => self.rdma.retry_cnt.to_string(),
            "tbon.rdma_poll" => if self.rdma.busy_poll { RdmaPoll::Busy } else { RdmaPoll::Event }.name().into(),
            "tbon.rdma_max_inline" => self.rdma.max_inline.to_string(),
            "tbon.rdma_frame" => self.rdma_frame.name().into(),
            "resource.synthetic" => match &self.topology {
                TopologySource::Synthetic(s) => s.clone(),
                _ => return None,
            },
            "resource.xml" => match &self.topology {
                TopologySource::XmlFile(p) => p.display().to_string(),
                _ => return None,
            },
            "resource.gpus" => self.gpus?.to_string(),
            "resource.discovery" => self.discovery.name().into(),
            "exec.kill-timeout" => fmt_duration(self.kill_timeout),
            "exec.kill-timeout-max" => fmt_duration(self.kill_timeout_max),
            "sched.policy" => self.sched_policy.name().into(),
            "sched.default-duration" => fmt_duration(self.default_duration),
            "sched.max-requeue" => self.max_requeue.to_string(),
            "sched.backfill-depth" => self.backfill_depth.to_string(),
            "job-manager.inactive-age-limit" => fmt_duration(self.inactive_age_limit),
            "job-manager.inactive-num-limit" => self.inactive_num_limit.to_string(),
            "job-manager.history-age-limit" => fmt_duration(self.history_age_limit),
            "job-manager.history-num-limit" => self.history_num_limit.to_string(),
            "job-manager.cc-limit" => self.cc_limit.to_string(),
            "exec.shell" => self.shell.as_ref()?.display().to_string(),
            "exec.imp" => self.imp.as_ref()?.display().to_string(),
            "exec.containment" => self.containment.clone(),
            "exec.cgroup-spawn" => self.cgroup_spawn.clone(),
            "exec.alloc-tmpdir-base" => self.alloc_tmpdir_base.as_ref()?.display().to_string(),
            "alloc-tmpdir" => self.alloc_tmpdir.as_ref()?.display().to_string(),
            "access.allow-guest-users" => self.allow_guest_users.to_string(),
            "health.program" => self.health_program.as_ref()?.display().to_string(),
            "health.interval" => fmt_duration(self.health_interval),
            "health.timeout" => fmt_duration(self.health_timeout),
            "metrics.listen" => self.metrics_listen?.to_string(),
            "metrics.ranks" => self.metrics_ranks.as_ref()?.to_string(),
            "log-level" => self.log_level.clone()?,
            "rundir" => self.rundir.as_ref()?.display().to_string(),
            "statedir" => self.statedir.as_ref()?.display().to_string(),
            "instance-level" => self.instance_level.to_string(),
            "jobid" => self.jobid.clone()?,
            "parent-uri" => self.parent_uri.clone()?,
            "broker.tolerate-lost" => self.tolerate_lost.to_string(),
            _ => return None,
        })
    }
}
