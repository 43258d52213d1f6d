//! Broker attributes: every one in [`ATTRS`], parsed and checked once into a [`BrokerConfig`].
//!
//! An attribute is a `name=value` pair of the broker's configuration, in Flux's vocabulary (`tbon.topo`,
//! `tbon.fanout`, `rank`, `size`, `local-uri`...). Where they come from:
//! - `-S NAME=VALUE` on `vigil start`, `vigil broker`, and for the child brokers of `vigil batch` / `vigil alloc`
//!   ([`Access::CommandLine`]);
//! - `[tbon] topo`, `[bootstrap] statedir`, `[exec] alloc-tmpdir-base`, `[access] allow-guest-users` and `[health]
//!   program`, `interval`, `timeout` of the TOML bootstrap file for `tbon.topo`, `statedir`,
//!   `exec.alloc-tmpdir-base`, `access.allow-guest-users` and `health.*`
//!   ([`Access::CommandLineOrToml`]; `-S` wins);
//! - a nested instance's PMI bootstrap, from the enclosing instance ([`Access::Bootstrap`]; `-S` wins);
//! - the broker itself, for what it learns as it runs: rank, size, endpoints, pid... ([`Access::Broker`]:
//!   refused on the command line, shown by `vigil lsattr` / `vigil getattr`).
//!
//! [`BrokerConfig::parse`] turns the raw pairs into typed fields, once, at start-up: an unknown or read-only
//! name, a bad value or two attributes that contradict each other is one [`AttrError`] naming the attribute and
//! what was expected, before any broker runs. The broker reads only the typed fields. `vigil lsattr` and
//! `vigil getattr` list [`ATTRS`] with the values in effect ([`values`]), and `vigil lsattr --doc` prints the table.
//!
//! Checks that need the machine (`broker.detectors=ebpf` needs root; a synthetic or XML hwloc topology must load)
//! stay with the command that starts the broker; this module does no I/O and reads no environment.
//!
//! The module's files: this one holds the table ([`ATTRS`]) and what reads it; `config.rs` the typed
//! [`BrokerConfig`] (its defaults, [`BrokerConfig::parse`], [`BrokerConfig::value`]) and [`AttrError`]; `parse.rs`
//! how each group of attributes (`tbon.*`, `broker.*`, `resource.*`, jobs, the rest) is parsed and checked;
//! `words.rs` the attributes that take a word ([`Transport`], [`DetectorChoice`]...) and [`ProbeGroup`].

mod config;
mod parse;
mod words;

pub(crate) use config::fmt_duration;
pub use config::{AttrError, BrokerConfig, DEFAULT_CC_LIMIT, DEFAULT_PARENT_GRACE};
pub use words::{
    DetectorChoice, Discovery, ProbeGroup, RdmaFrame, RdmaPoll, SchedPolicy, Transport, XdpMode, PROBE_GROUP_PORT,
};

use std::collections::BTreeMap;

/// What kind of value an attribute takes (for checks, errors and `vigil lsattr --doc`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A Flux Standard Duration (RFC 23): `N[ms|s|m|h|d]` (seconds without a unit) or `inf`.
    Duration,
    /// A non-negative decimal integer.
    Count,
    /// One of these words.
    Enum(&'static [&'static str]),
    /// A TBON shape: `kary:K` (`kary:0` = flat), `binomial`, or a bare `K`.
    Topology,
    /// `auto`, `off`, or an IPv4 multicast `ADDR:PORT`.
    ProbeGroup,
    /// `error`, `warn`, `info`, `debug`, `trace`, `off`, or `tracing` filter directives (`vigil=debug,warn`).
    LogLevel,
    /// A file system path.
    Path,
    /// A URI (`local:///run/vigil/local-0`).
    Uri,
    /// Free text.
    Text,
}

impl Kind {
    /// Short form for listings: `duration`, `count`, `auto|rdma|tcp`, ...
    pub fn describe(self) -> String {
        match self {
            Kind::Duration => "duration".into(),
            Kind::Count => "count".into(),
            Kind::Enum(v) => v.join("|"),
            Kind::Topology => "kary:K|binomial".into(),
            Kind::ProbeGroup => "auto|off|ADDR:PORT".into(),
            Kind::LogLevel => "log level".into(),
            Kind::Path => "path".into(),
            Kind::Uri => "uri".into(),
            Kind::Text => "text".into(),
        }
    }
}

/// Who may set an attribute.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// `-S NAME=VALUE` on `vigil start` / `vigil broker` (and `vigil batch` / `alloc` for the child brokers).
    CommandLine,
    /// As [`Access::CommandLine`], or the TOML bootstrap file (`[tbon] topo`, `[bootstrap] statedir`, `[exec]
    /// alloc-tmpdir-base`, `[access] allow-guest-users`, `[health]`); the command line wins.
    CommandLineOrToml,
    /// Set by a nested instance's PMI bootstrap from the enclosing instance; `-S` overrides it.
    Bootstrap,
    /// Set by the broker itself: read-only, refused on the command line.
    Broker,
}

impl Access {
    /// Whether `-S` may set it.
    pub fn settable(self) -> bool {
        self != Access::Broker
    }

    /// Short form for listings.
    pub fn describe(self) -> &'static str {
        match self {
            Access::CommandLine => "-S",
            Access::CommandLineOrToml => "-S or the TOML bootstrap file",
            Access::Bootstrap => "nested-instance bootstrap (or -S)",
            Access::Broker => "read-only: set by the broker",
        }
    }
}

/// An attribute's value when nobody sets it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DefaultValue {
    /// This value (it parses to the [`BrokerConfig::default`] field: a unit test checks it).
    Value(&'static str),
    /// No value, or one computed at start-up: `means` says what applies; `example` is a valid value.
    Otherwise {
        /// What applies when unset, e.g. "the live machine".
        means: &'static str,
        /// A valid value, for documentation and tests.
        example: &'static str,
    },
}

/// One broker attribute.
#[derive(Clone, Copy, Debug)]
pub struct Attr {
    /// Name, as in `-S NAME=VALUE` and `vigil getattr NAME`.
    pub name: &'static str,
    /// What values it takes.
    pub kind: Kind,
    /// Its value when nobody sets it.
    pub default: DefaultValue,
    /// Who may set it.
    pub access: Access,
    /// One line of documentation.
    pub doc: &'static str,
}

const fn attr(name: &'static str, kind: Kind, default: DefaultValue, access: Access, doc: &'static str) -> Attr {
    Attr { name, kind, default, access, doc }
}

const fn is(v: &'static str) -> DefaultValue {
    DefaultValue::Value(v)
}

const fn otherwise(means: &'static str, example: &'static str) -> DefaultValue {
    DefaultValue::Otherwise { means, example }
}

const BROKER_SET: DefaultValue = otherwise("set by the broker", "");

use Access::{Bootstrap, Broker, CommandLine, CommandLineOrToml};

/// Every broker attribute: name, kind, default, who sets it, what it does. Grouped by what they are about.
#[rustfmt::skip]
pub static ATTRS: &[Attr] = &[
    // The tree.
    attr("tbon.topo", Kind::Topology, is("kary:32"), CommandLineOrToml,
        "TBON shape (flux-core's default; a batch/alloc instance defaults to kary:32, or with tbon.reparent=off to kary:0 up to 257 brokers, else kary:256)"),
    attr("tbon.fanout", Kind::Count, otherwise("from tbon.topo", "2"), CommandLine,
        "shorthand: tbon.fanout=K is tbon.topo=kary:K (set one of the two)"),
    attr("tbon.connect_timeout", Kind::Duration, is("60s"), CommandLine,
        "how long a broker retries connecting to its parent before it exits"),
    attr("tbon.reparent", Kind::Enum(&["on", "off"]), is("on"), CommandLine,
        "on: a broker whose parent is lost re-parents (docs/failure-detection.md); off: it exits, and its subtree is lost"),
    attr("tbon.parent_grace", Kind::Duration, otherwise("60s with a statedir, else 0", "30s"), CommandLine,
        "how long brokers and their jobs outlive rank 0, reconnecting, before they exit (docs/statedir.md); 0: at once"),
    // Liveness (docs/failure-detection.md).
    attr("tbon.heartbeat_period", Kind::Duration, is("50ms"), CommandLine,
        "heartbeat interval between parent and child; also the TCP_INFO sampling interval (< tbon.torpid_max)"),
    attr("tbon.torpid_max", Kind::Duration, is("500ms"), CommandLine,
        "silence after which a peer is torpid: given no new work, not given up"),
    attr("tbon.stall_max", Kind::Duration, is("75ms"), CommandLine,
        "a broker whose node's kernel reports its heartbeat older than this is torpid (it beats 4 times as often)"),
    attr("tbon.lost_timeout", Kind::Duration, is("120ms"), CommandLine,
        "how long a peer's kernel may leave our data unacknowledged before the peer is lost"),
    attr("tbon.probe_period", Kind::Duration, is("10ms"), CommandLine,
        "how often a parent probes each child node's heartbeat responder (at least 5ms)"),
    attr("tbon.probe_misses", Kind::Count, is("3"), CommandLine,
        "consecutive unanswered probes after which a node whose kernel answered before is lost (at least 1)"),
    attr("tbon.probe_group", Kind::ProbeGroup, is("auto"), CommandLine,
        "where a parent sends its one-per-period group probe: auto (239.255.R1.R0:22087), off (unicast), ADDR:PORT"),
    attr("tbon.job_network", Kind::Text, otherwise("none: the job network is not probed", "hsn0"), CommandLineOrToml,
        "network interface of this node's job network (a high-speed fabric): the parent probes it too, and a node \
        whose job network stops answering while its management network answers is drained as fabric-down \
        (job_network in its [bootstrap] hosts entry of the TOML file)"),
    attr("tbon.job_network_undrain_after", Kind::Duration, is("inf"), CommandLine,
        "a node drained as fabric-down is undrained once its job network has answered this long without a miss \
        (inf: only an admin undrains it, vigil resource undrain)"),
    attr("broker.detectors", Kind::Enum(DetectorChoice::NAMES), is("auto"), CommandLine,
        "failure detectors: auto (eBPF, else userspace, per detector), ebpf (needs root, no fallback), userspace"),
    attr("broker.detector-rank", Kind::Count, otherwise("this broker", "0"), CommandLine,
        "rank that loads this machine's eBPF detectors for the others (vigil start sets 0)"),
    attr("broker.xdp_mode", Kind::Enum(XdpMode::NAMES), is("auto"), CommandLine,
        "how the XDP responder attaches: auto (native on a NIC, generic on lo and veth), native, generic"),
    // Transport (docs/rdma.md).
    attr("tbon.transport", Kind::Enum(Transport::NAMES), is("auto"), CommandLine,
        "overlay links: auto (RDMA verbs where both ends have a device, else libfabric's tbon.ofi_provider where \
         both ends have it, else TCP), rdma (or fail), ofi (or fail), tcp"),
    attr("tbon.ofi_provider", Kind::Text, is("cxi"), CommandLine,
        "libfabric provider of ofi links (docs/slingshot.md): cxi (Slingshot), or e.g. 'tcp;ofi_rxm', 'verbs;ofi_rxm'"),
    attr("tbon.rdma_timeout", Kind::Count, is("12"), CommandLine,
        "RC QP local ACK timeout exponent, 1..31 (4.096 us x 2^N per try)"),
    attr("tbon.rdma_retry_cnt", Kind::Count, is("1"), CommandLine,
        "RC QP retries before a dead peer is reported, 1..6 (12 / 1: ~40 ms)"),
    attr("tbon.rdma_poll", Kind::Enum(RdmaPoll::NAMES), is("event"), CommandLine,
        "RDMA completions: event (completion channel) or busy (one core spinning per link)"),
    attr("tbon.rdma_max_inline", Kind::Count, is("236"), CommandLine,
        "bytes up to which an RDMA send is inline, 0..1024 (0 disables)"),
    attr("tbon.rdma_frame", Kind::Enum(RdmaFrame::NAMES), is("packed"), CommandLine,
        "framing offered on RDMA links: packed (compact, when both ends offer it) or full"),
    // Resources.
    attr("resource.synthetic", Kind::Text, otherwise("the live machine", "pack:4 numa:1 core:24 pu:2"), CommandLine,
        "an hwloc synthetic topology to report and place on instead of the live machine"),
    attr("resource.xml", Kind::Path, otherwise("the live machine", "/etc/vigil/node.xml"), CommandLine,
        "an hwloc XML topology (lstopo node.xml) instead of the live machine"),
    attr("resource.gpus", Kind::Count, otherwise("as discovered", "4"), CommandLine,
        "GPUs this node declares, overriding discovery"),
    attr("resource.discovery", Kind::Enum(Discovery::NAMES), is("hwloc"), CommandLine,
        "hwloc, or cpu-count to skip hwloc and report the CPU count"),
    // Jobs.
    attr("exec.kill-timeout", Kind::Duration, is("5s"), CommandLine,
        "after SIGTERM to a job's shells (cancel, exception), SIGKILL this much later, unless the job set its own; \
         processes still in a job's cgroup this long after SIGKILL are unkillable: the job ends, the node is drained"),
    attr("exec.kill-timeout-max", Kind::Duration, is("60s"), CommandLine,
        "the longest kill timeout a job may ask for (-o kill-timeout; at least exec.kill-timeout): longer is refused"),
    attr("sched.policy", Kind::Enum(SchedPolicy::NAMES), is("easy"), CommandLine,
        "easy: EASY backfill on time limits (Slurm's default); fcfs: strict first come, first served"),
    attr("sched.default-duration", Kind::Duration, is("inf"), CommandLine,
        "time limit of a job submitted without one (enforced, as Slurm's DefaultTime); inf: none"),
    attr("sched.max-requeue", Kind::Count, is("3"), CommandLine,
        "times a --requeue job goes back to the queue after losing a node before its next loss ends it"),
    attr("sched.backfill-depth", Kind::Count, is("1024"), CommandLine,
        "most pending jobs one scheduling pass looks at (Slurm's bf_max_job_test); deeper jobs wait their turn"),
    attr("job-manager.inactive-age-limit", Kind::Duration, is("inf"), CommandLine,
        "an INACTIVE job is purged (its record and eventlog gone, from the state directory too) this long after it \
        ended (Flux's job-manager.inactive-age-limit); inf: never"),
    attr("job-manager.inactive-num-limit", Kind::Count, is("0"), CommandLine,
        "most INACTIVE jobs kept, the oldest purged first (Flux's job-manager.inactive-num-limit); 0: no limit"),
    attr("job-manager.cc-limit", Kind::Count, is("10001"), CommandLine,
        "most copies one `vigil submit --cc` / `vigil batch --cc` makes (as Slurm's MaxArraySize bounds a job \
        array); checked by the command before it submits any; 0: no limit"),
    attr("job-manager.history-age-limit", Kind::Duration, is("inf"), CommandLine,
        "a job's history record (vigil history; kept after the job is purged) goes this long after the job ended; \
        inf: never"),
    attr("job-manager.history-num-limit", Kind::Count, is("0"), CommandLine,
        "most job history records kept, the oldest removed first; 0: no limit"),
    attr("exec.shell", Kind::Path, otherwise("$VIGIL_SHELL, else vigil-shell beside vigil", "/usr/libexec/vigil-shell"),
        CommandLine, "job shell program"),
    attr("exec.imp", Kind::Path, otherwise("vigil-imp beside vigil", "/usr/libexec/vigil/vigil-imp"), CommandLineOrToml,
        "the privileged launcher a broker that is not root starts guests' job shells with, in a multi-user instance \
        ([exec] imp in the TOML file; docs/security.md): such an instance refuses to start without it"),
    attr("exec.containment", Kind::Enum(&["auto", "cgroup", "pgroup"]), is("auto"), CommandLine,
        "how a job's processes are kept: auto (a cgroup v2 per job, else process groups), cgroup (no fallback), pgroup"),
    attr("exec.cgroup-spawn", Kind::Enum(&["auto", "move"]), is("auto"), CommandLine,
        "how a shell gets into its cgroup: auto (created there, clone3 CLONE_INTO_CGROUP, where the kernel can), \
        move (moved in after start: milliseconds per shell)"),
    attr("exec.alloc-tmpdir-base", Kind::Path, otherwise("the job's own temporary directory", "/dev/shm"),
        CommandLineOrToml, "where each job's node-local VIGIL_ALLOC_TMPDIR is made, e.g. a fast local disk or /dev/shm \
        ([exec] alloc-tmpdir-base in the TOML file); ignored in a batch or alloc job, whose jobs share the \
        enclosing allocation's"),
    // Node health (docs/system-instance.md, "Health checks").
    attr("health.program", Kind::Path, otherwise("none: no health check", "/etc/vigil/health-check.sh"),
        CommandLineOrToml, "program each broker runs at start and every health.interval (Slurm's HealthCheckProgram, \
        [health] program in the TOML file): a non-zero exit drains the node with its first output line as the reason, \
        a pass undrains it if a health check drained it"),
    attr("health.interval", Kind::Duration, is("5m"), CommandLineOrToml,
        "time from one health check run's start to the next ([health] interval in the TOML file)"),
    attr("health.timeout", Kind::Duration, is("1m"), CommandLineOrToml,
        "a health check run still going this long after it started is killed with its process group and fails \
        ([health] timeout in the TOML file)"),
    // Who may use the instance (docs/security.md).
    attr("access.allow-guest-users", Kind::Enum(&["false", "true"]), is("false"), CommandLineOrToml,
        "true: users other than the instance owner (guests) may connect and submit jobs, each to their own jobs \
        (Flux's access.allow-guest-user; [access] allow-guest-users in the TOML file); a system instance only, \
        refused by vigil start"),
    // The broker.
    attr("log-level", Kind::LogLevel, otherwise("$VIGIL_LOG, else warn (error in a nested instance)", "info"),
        CommandLine, "broker log level on standard error"),
    attr("rundir", Kind::Path, otherwise("a new temporary directory", "/run/vigil"), CommandLine,
        "directory of the local connector sockets (vigil broker --rundir wins)"),
    attr("statedir", Kind::Path, otherwise("none: rank 0 keeps no job across its restart", "/var/lib/vigil"),
        CommandLineOrToml, "rank 0 keeps every job and the resource eventlog here, durable before a submit is answered \
        (docs/statedir.md; [bootstrap] statedir in the TOML file); a test instance has none unless given"),
    attr("instance-level", Kind::Count, is("0"), Bootstrap,
        "nesting depth: 0 for a system or test instance, the enclosing instance's + 1 for a batch/alloc job"),
    attr("jobid", Kind::Text, otherwise("none: not a nested instance", "f3Yq9b"), Bootstrap,
        "id of the enclosing instance's job this instance runs as"),
    attr("alloc-tmpdir", Kind::Path, otherwise("none: not a nested instance", "/run/vigil/jfB.0/alloc"), Bootstrap,
        "the enclosing allocation's directory on this node (its VIGIL_ALLOC_TMPDIR), every job's VIGIL_ALLOC_TMPDIR"),
    attr("parent-uri", Kind::Uri, otherwise("none: not a nested instance", "local:///run/vigil/local-0"), Bootstrap,
        "URI of the enclosing instance's broker on this node"),
    attr("broker.tolerate-lost", Kind::Count, is("0"), CommandLine,
        "a nested instance starts when all but at most this many of its brokers joined, the others' nodes lost or \
        their brokers failed before they joined (vigil batch|alloc --tolerate-lost=K); more fail the job at once"),
    // Metrics (docs/metrics.md).
    attr("metrics.listen", Kind::Text, otherwise("off: no metrics endpoint", "127.0.0.1:9250"), CommandLine,
        "ADDR:PORT where each broker serves OpenMetrics (GET /metrics) and /livez, /readyz over HTTP; port 0: any \
        free port (vigil uptime shows it); off by default"),
    attr("metrics.ranks", Kind::Text, otherwise("every broker", "0"), CommandLine,
        "the ranks (an idset) that serve metrics.listen: e.g. 0 when every broker of a test instance shares one \
        machine and so one port"),
    // Set by the broker.
    attr("rank", Kind::Count, BROKER_SET, Broker, "this broker's rank, 0..size-1"),
    attr("size", Kind::Count, BROKER_SET, Broker, "number of brokers in the instance"),
    attr("hostname", Kind::Text, BROKER_SET, Broker, "this broker's host name"),
    attr("tbon.level", Kind::Count, BROKER_SET, Broker, "this broker's depth in the tree (rank 0: 0)"),
    attr("tbon.maxlevel", Kind::Count, BROKER_SET, Broker, "depth of the deepest broker"),
    attr("tbon.transport-active", Kind::Text, BROKER_SET, Broker,
        "what the overlay links run on: tcp, rdma, tcp (fallback: why), mixed (...)"),
    attr("tbon.endpoint", Kind::Uri, BROKER_SET, Broker, "this broker's overlay endpoint, tcp://ADDR:PORT"),
    attr("tbon.parent-endpoint", Kind::Uri, BROKER_SET, Broker, "the parent's overlay endpoint (not on rank 0)"),
    attr("local-uri", Kind::Uri, BROKER_SET, Broker, "this broker's local connector, for VIGIL_URI"),
    attr("instance-id", Kind::Text, BROKER_SET, Broker, "the instance's id: peers with another are refused"),
    attr("broker.pid", Kind::Count, BROKER_SET, Broker, "the broker's process id"),
    attr("broker.starttime", Kind::Text, BROKER_SET, Broker, "when the broker started, seconds since the epoch"),
    attr("resource.source", Kind::Text, BROKER_SET, Broker,
        "where this node's resources came from: live, synthetic:..., xml:..., cpu-count"),
];

/// The attribute called `name`, if there is one.
pub fn lookup(name: &str) -> Option<&'static Attr> {
    ATTRS.iter().find(|a| a.name == name)
}

/// Every attribute of [`ATTRS`] with its value in effect (`None`: unset), for `broker.lsattr` and
/// `broker.getattr`: `broker(name)` first (what the broker knows: its read-only attributes, and settable ones
/// it resolved itself such as `rundir`), else [`BrokerConfig::value`].
pub fn values(cfg: &BrokerConfig, broker: impl Fn(&str) -> Option<String>) -> BTreeMap<&'static str, Option<String>> {
    ATTRS.iter().map(|a| (a.name, broker(a.name).or_else(|| cfg.value(a.name)))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::Topology;
    use vigil_proto::node::TopologySource;

    fn parse(kv: &[(&str, &str)]) -> Result<BrokerConfig, AttrError> {
        BrokerConfig::parse(&kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect())
    }

    fn err(kv: &[(&str, &str)]) -> String {
        parse(kv).unwrap_err().to_string()
    }

    /// A valid value of a settable attribute: its default, else its example.
    fn sample(a: &Attr) -> &'static str {
        match a.default {
            DefaultValue::Value(v) => v,
            DefaultValue::Otherwise { example, .. } => example,
        }
    }

    #[test]
    fn the_table_has_each_name_once_and_documents_it() {
        let mut names: Vec<_> = ATTRS.iter().map(|a| a.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), ATTRS.len(), "a name is listed twice");
        for a in ATTRS {
            assert!(!a.doc.is_empty(), "{}", a.name);
            assert_eq!(a.access == Access::Broker, a.default == BROKER_SET, "{}", a.name);
        }
    }

    #[test]
    fn every_default_parses_to_the_built_in_default() {
        for a in ATTRS.iter().filter(|a| a.access.settable()) {
            if let DefaultValue::Value(v) = a.default {
                assert_eq!(parse(&[(a.name, v)]), Ok(BrokerConfig::default()), "{}={v}", a.name);
            }
        }
        assert_eq!(parse(&[]), Ok(BrokerConfig::default()));
        // The code defaults the table documents.
        let d = BrokerConfig::default();
        assert_eq!(d.membership, crate::membership::Config::default());
        assert_eq!(d.rdma, vigil_flow::config::Config::default());
        assert_eq!(d.kill_timeout, crate::jobs::DEFAULT_KILL_TIMEOUT);
        assert_eq!(d.topo, Topology::default());
    }

    #[test]
    fn every_settable_attribute_parses_a_sample_and_reads_it_back() {
        for a in ATTRS.iter().filter(|a| a.access.settable()) {
            let v = sample(a);
            let c = parse(&[(a.name, v)]).unwrap_or_else(|e| panic!("{}={v}: {e}", a.name));
            let shown = c.value(a.name).unwrap_or_else(|| panic!("{} has no value after -S {}={v}", a.name, a.name));
            assert_eq!(parse(&[(a.name, shown.as_str())]).as_ref(), Ok(&c), "{}: {v} reads back as {shown}", a.name);
            if let DefaultValue::Value(d) = a.default {
                assert_eq!(
                    BrokerConfig::default().value(a.name).and_then(|s| parse(&[(a.name, s.as_str())]).ok()),
                    Some(BrokerConfig::default()),
                    "{}={d}",
                    a.name
                );
            }
        }
        // Read-only ones have no value here: the broker fills them.
        for a in ATTRS.iter().filter(|a| !a.access.settable()) {
            assert_eq!(BrokerConfig::default().value(a.name), None, "{}", a.name);
        }
    }

    #[test]
    fn defaults_read_as_documented() {
        let d = BrokerConfig::default();
        for (name, want) in [
            ("tbon.heartbeat_period", "50ms"),
            ("tbon.torpid_max", "500ms"),
            ("tbon.stall_max", "75ms"),
            ("exec.kill-timeout", "5s"),
            ("sched.policy", "easy"),
            ("sched.default-duration", "inf"),
            ("sched.max-requeue", "3"),
            ("sched.backfill-depth", "1024"),
            ("tbon.topo", "kary:32"),
            ("tbon.fanout", "32"),
            ("tbon.rdma_max_inline", "236"),
            ("tbon.probe_group", "auto"),
            ("tbon.job_network_undrain_after", "inf"),
        ] {
            assert_eq!(d.value(name).as_deref(), Some(want), "{name}");
        }
        assert_eq!(d.value("exec.shell"), None);
        assert_eq!(d.value("resource.xml"), None);
        assert_eq!(d.value("tbon.job_network"), None, "no job network unless one is named");
    }

    #[test]
    fn unknown_and_read_only_are_refused() {
        let e = err(&[("no.such.attr", "1")]);
        assert!(e.starts_with("unknown attribute 'no.such.attr' (known: tbon.topo, "), "{e}");
        assert!(!e.contains("broker.pid"), "read-only names are not offered: {e}");
        for a in ATTRS.iter().filter(|a| !a.access.settable()) {
            let e = err(&[(a.name, "5")]);
            assert_eq!(e, format!("attribute '{}' is read-only: the broker sets it (see `vigil lsattr`)", a.name));
        }
        // A typo gets the name it most likely meant, not the list.
        let e = err(&[("tbon.fanuot", "2")]);
        assert_eq!(e, "unknown attribute 'tbon.fanuot' (did you mean tbon.fanout? `vigil lsattr` lists them all)");
        assert!(err(&[("tbon.top", "kary:2")]).contains("did you mean tbon.topo?"));
        // Names are checked before values.
        assert!(err(&[("tbon.torpid_max", "x"), ("zzz", "1")]).contains("unknown attribute 'zzz'"));
    }

    #[test]
    fn bad_values_are_refused_naming_the_attribute_and_what_it_takes() {
        let cases: &[(&str, &str, &str)] = &[
            ("tbon.topo", "mesh", "expected kary:K"),
            ("tbon.fanout", "x", "expected a number"),
            ("tbon.heartbeat_period", "x", "invalid number"),
            ("tbon.torpid_max", "0", "greater than 0"),
            ("tbon.lost_timeout", "inf", "finite"),
            ("tbon.connect_timeout", "2h", "longer than an hour: a broker would wait"),
            ("tbon.heartbeat_period", "0.5ms", "at least 1ms"),
            ("tbon.probe_period", "1ms", "at least 5ms"),
            ("tbon.probe_misses", "0", "expected a positive integer"),
            ("tbon.probe_misses", "-1", "expected a positive integer"),
            ("tbon.probe_group", "10.0.0.1:5", "multicast"),
            ("tbon.probe_group", "239.1.2.3:0", "multicast"),
            ("tbon.probe_group", "239.1.2.3", "multicast"),
            ("tbon.probe_group", "yes", "multicast"),
            ("tbon.probe_group", "224.0.0.1:5000", "link-local"),
            ("tbon.job_network", "eth0:1", "network interface name"),
            ("tbon.job_network", "a/b", "network interface name"),
            ("tbon.job_network", "sixteen_chars_xx", "at most 15 characters"),
            ("tbon.job_network_undrain_after", "0", "positive duration"),
            ("tbon.job_network_undrain_after", "x", "invalid number"),
            ("broker.detectors", "bpf", "expected auto, ebpf or userspace"),
            ("broker.detector-rank", "-1", "expected a rank"),
            ("broker.xdp_mode", "driver", "expected auto, native or generic"),
            ("broker.xdp_mode", "skb", "expected auto, native or generic"),
            ("broker.xdp_mode", "", "expected auto, native or generic"),
            ("broker.xdp_mode", "Native", "expected auto, native or generic"),
            ("tbon.transport", "ib", "expected auto, rdma, ofi or tcp"),
            ("tbon.rdma_timeout", "0", "use 1..=31"),
            ("tbon.rdma_timeout", "x", "expected a number 1..31"),
            ("tbon.rdma_retry_cnt", "7", "forever"),
            ("tbon.rdma_retry_cnt", "0", "use 1..=6"),
            ("tbon.rdma_max_inline", "4096", "use 0..=1024"),
            ("tbon.rdma_max_inline", "-1", "expected a number of bytes"),
            ("tbon.rdma_poll", "spin", "expected event or busy"),
            ("tbon.rdma_frame", "zip", "expected packed or full"),
            ("resource.synthetic", " ", "synthetic description"),
            ("resource.xml", "", "expected a path"),
            ("resource.gpus", "four", "expected a count"),
            ("resource.discovery", "lstopo", "expected hwloc or cpu-count"),
            ("exec.kill-timeout", "soon", "invalid number"),
            ("sched.policy", "sjf", "expected easy or fcfs"),
            ("sched.default-duration", "0", "expected a duration greater than 0"),
            ("sched.max-requeue", "-1", "expected a count"),
            ("log-level", "loud", "expected error, warn, info, debug, trace or off"),
            ("log-level", "vigil=loud", "expected error"),
            ("instance-level", "one", "expected a count"),
        ];
        for (name, v, why) in cases {
            let e = err(&[(name, v)]);
            assert!(e.starts_with(&format!("invalid {name} '{v}': ")), "{name}={v}: {e}");
            assert!(e.contains(why), "{name}={v}: {e} (should say {why:?})");
        }
    }

    #[test]
    fn good_values_are_typed() {
        let c = parse(&[
            ("tbon.transport", "rdma"),
            ("tbon.rdma_timeout", "14"),
            ("tbon.rdma_retry_cnt", "2"),
            ("tbon.rdma_max_inline", "0"),
            ("tbon.rdma_poll", "busy"),
            ("tbon.rdma_frame", "full"),
        ])
        .unwrap();
        assert_eq!(c.transport, Transport::Rdma);
        assert_eq!((c.rdma.timeout, c.rdma.retry_cnt, c.rdma.max_inline, c.rdma.busy_poll), (14, 2, 0, true));
        assert_eq!(c.rdma_frame, RdmaFrame::Full);
        let c = parse(&[("tbon.probe_group", "239.1.2.3:999"), ("broker.xdp_mode", "native")]).unwrap();
        assert_eq!(c.probe_group.for_parent(7), Some("239.1.2.3:999".parse().unwrap()));
        assert_eq!(c.xdp_mode, XdpMode::Native);
        assert_eq!(parse(&[("tbon.probe_group", "off")]).unwrap().probe_group, ProbeGroup::Off);
        assert_eq!(ProbeGroup::Auto.for_parent(258), Some("239.255.1.2:22087".parse().unwrap()));
        let c = parse(&[("tbon.heartbeat_period", "0.1s"), ("tbon.torpid_max", "2s"), ("tbon.probe_misses", "10")])
            .unwrap();
        assert_eq!((c.membership.heartbeat_period, c.membership.torpid_max, c.membership.probe_misses), (0.1, 2.0, 10));
        assert_eq!(c.value("tbon.heartbeat_period").as_deref(), Some("100ms"));
        let c = parse(&[("resource.synthetic", "pack:1 core:2 pu:1"), ("resource.gpus", "4")]).unwrap();
        assert_eq!(c.topology, TopologySource::Synthetic("pack:1 core:2 pu:1".into()));
        assert_eq!(c.gpus, Some(4));
        assert_eq!(parse(&[("exec.kill-timeout", "inf")]).unwrap().value("exec.kill-timeout").as_deref(), Some("inf"));
        assert_eq!(parse(&[("log-level", "vigil=debug,warn")]).unwrap().log_level.as_deref(), Some("vigil=debug,warn"));
        assert_eq!(parse(&[("tbon.topo", "binomial")]).unwrap().value("tbon.fanout"), None);
    }

    #[test]
    fn topo_and_fanout_must_agree() {
        let e = err(&[("tbon.topo", "kary:2"), ("tbon.fanout", "3")]);
        assert_eq!(
            e,
            "tbon.topo=kary:2 and tbon.fanout=3 disagree: set one of them (tbon.fanout=K is tbon.topo=kary:K)"
        );
        assert!(err(&[("tbon.topo", "binomial"), ("tbon.fanout", "2")]).contains("disagree"));
        assert_eq!(parse(&[("tbon.topo", "kary:3"), ("tbon.fanout", "3")]).unwrap().topo, Topology::Kary(3));
        assert_eq!(parse(&[("tbon.fanout", "0")]).unwrap().topo, Topology::Kary(0));
    }

    #[test]
    fn metrics_listen_takes_an_address_and_metrics_ranks_picks_the_brokers() {
        assert!(err(&[("metrics.listen", "localhost")]).contains("expected ADDR:PORT"));
        assert!(err(&[("metrics.ranks", "x")]).contains("expected an idset of ranks"));
        let c = parse(&[("metrics.listen", "127.0.0.1:0"), ("metrics.ranks", "0,2")]).expect("valid");
        assert_eq!(c.metrics_address(0), Some("127.0.0.1:0".parse().expect("addr")));
        assert_eq!(c.metrics_address(1), None);
        let c = parse(&[("metrics.listen", "[::1]:9250")]).expect("valid");
        assert!(c.metrics_address(7).is_some(), "every rank by default");
        assert_eq!(BrokerConfig::default().metrics_address(0), None, "off by default");
    }

    #[test]
    fn metrics_ranks_beyond_the_instance_are_refused() {
        let c = parse(&[("metrics.listen", "127.0.0.1:0"), ("metrics.ranks", "0,2,7-9")]).unwrap();
        assert_eq!(
            c.check_metrics_ranks(4).unwrap_err(),
            "metrics.ranks=0,2,7-9 names ranks 7-9, but this instance has 4 brokers (ranks 0-3)"
        );
        assert!(c.check_metrics_ranks(10).is_ok());
        let one = parse(&[("metrics.ranks", "1")]).unwrap();
        assert!(one.check_metrics_ranks(1).unwrap_err().contains("names rank 1, but this instance has 1 broker"));
        assert!(BrokerConfig::default().check_metrics_ranks(1).is_ok(), "every broker by default");
    }

    #[test]
    fn stall_max_is_bounded_and_follows_a_shorter_torpid_max() {
        assert!(err(&[("tbon.stall_max", "1ms")]).contains("at least 20ms"));
        let e = err(&[("tbon.stall_max", "10s")]);
        assert!(e.starts_with("tbon.stall_max (10000 ms) must not be longer than tbon.torpid_max (500 ms)"), "{e}");
        let c = parse(&[("tbon.heartbeat_period", "10ms"), ("tbon.torpid_max", "50ms")]).unwrap();
        assert_eq!(c.membership.stall_max, 0.05, "the default follows a shorter torpid_max");
        assert_eq!(parse(&[]).unwrap().membership.stall_max, 0.075);
    }

    #[test]
    fn heartbeat_must_be_shorter_than_torpid_max() {
        let e = err(&[("tbon.heartbeat_period", "500ms")]);
        assert_eq!(
            e,
            "tbon.heartbeat_period (500 ms) must be shorter than tbon.torpid_max (500 ms), or every peer looks torpid"
        );
        assert!(err(&[("tbon.heartbeat_period", "1s"), ("tbon.torpid_max", "600ms")]).contains("must be shorter"));
        assert!(parse(&[("tbon.heartbeat_period", "1s"), ("tbon.torpid_max", "1.5s")]).is_ok());
    }

    #[test]
    fn one_topology_source() {
        let e = err(&[("resource.synthetic", "pack:1 core:2 pu:1"), ("resource.xml", "/tmp/t.xml")]);
        assert_eq!(e, "set only one of resource.synthetic and resource.xml");
    }

    #[test]
    fn values_ask_the_broker_first() {
        let c = parse(&[("rundir", "/asked"), ("tbon.torpid_max", "1s")]).unwrap();
        let v = values(&c, |n| (n == "rank" || n == "rundir").then(|| "from broker".to_string()));
        assert_eq!(v.len(), ATTRS.len());
        assert_eq!(v["rank"].as_deref(), Some("from broker"));
        assert_eq!(v["rundir"].as_deref(), Some("from broker"));
        assert_eq!(v["tbon.torpid_max"].as_deref(), Some("1s"));
        assert_eq!(v["size"], None);
        assert_eq!(v["exec.shell"], None);
    }
}
