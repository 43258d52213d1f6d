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

use crate::topology::Topology;
use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::PathBuf;
use vigil_proto::node::TopologySource;

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

/// Declares an enum whose values are attribute words, with `NAMES`, `name()` and `from_name()`.
macro_rules! attr_enum {
    ($(#[$m:meta])* $ty:ident { $($(#[$vm:meta])* $var:ident = $s:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum $ty {
            $($(#[$vm])* $var),+
        }

        impl $ty {
            /// The words this attribute takes.
            pub const NAMES: &'static [&'static str] = &[$($s),+];

            /// The word for this value.
            pub fn name(self) -> &'static str {
                match self {
                    $($ty::$var => $s),+
                }
            }

            /// The value for `word`, `None` if it is not one of [`Self::NAMES`].
            pub fn from_name(word: &str) -> Option<$ty> {
                match word {
                    $($s => Some($ty::$var),)+
                    _ => None,
                }
            }
        }
    };
}

attr_enum! {
    /// `broker.detectors`: how the failure detectors are chosen.
    DetectorChoice {
        /// eBPF where it loads, else the userspace equivalent, per detector (`$VIGIL_EXIT_DETECTOR` may force one).
        Auto = "auto",
        /// eBPF or fail (needs root).
        Ebpf = "ebpf",
        /// The userspace detectors only.
        Userspace = "userspace",
    }
}

attr_enum! {
    /// `broker.xdp_mode`: how the XDP heartbeat responder is attached.
    XdpMode {
        /// Native on an interface with a device behind it, generic on `lo` and veth.
        Auto = "auto",
        /// Native (driver) mode only.
        Native = "native",
        /// Generic (SKB) mode only.
        Generic = "generic",
    }
}

attr_enum! {
    /// `tbon.transport`: what overlay links run on.
    Transport {
        /// RDMA where both ends have a verbs device serving the link's addresses, else TCP.
        Auto = "auto",
        /// RDMA or fail the link.
        Rdma = "rdma",
        /// libfabric (`tbon.ofi_provider`) or fail the link.
        Ofi = "ofi",
        /// Never try RDMA or libfabric.
        Tcp = "tcp",
    }
}

attr_enum! {
    /// `tbon.rdma_poll`: how RDMA completions are waited for.
    RdmaPoll {
        /// Sleep on the completion channel.
        Event = "event",
        /// Poll the completion queue in a loop (one core per link: latency benchmarks).
        Busy = "busy",
    }
}

attr_enum! {
    /// `tbon.rdma_frame`: the framing a broker offers on RDMA links.
    RdmaFrame {
        /// Compact framing, used when both ends offer it.
        Packed = "packed",
        /// The full frame of every link.
        Full = "full",
    }
}

attr_enum! {
    /// `sched.policy`: how the scheduler orders pending jobs (`jobs/backfill.rs`).
    SchedPolicy {
        /// EASY backfill: the first job that cannot start gets a reservation; later jobs run early only when they
        /// end before it starts (by their time limits) or use resources it does not need.
        Easy = "easy",
        /// Strict first come, first served: the first job that cannot start holds back every later one.
        Fcfs = "fcfs",
    }
}

attr_enum! {
    /// `resource.discovery`: how a node's resources are found.
    Discovery {
        /// hwloc (the live machine, or `resource.synthetic` / `resource.xml`).
        Hwloc = "hwloc",
        /// The CPU count only, skipping hwloc.
        CpuCount = "cpu-count",
    }
}

/// UDP port of group probes in `tbon.probe_group=auto`.
pub const PROBE_GROUP_PORT: u16 = 22087;

/// `tbon.probe_group`: where a parent sends its one-per-period group probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeGroup {
    /// Every child probed by unicast.
    Off,
    /// Each parent its own IPv4 multicast group, `239.255.R1.R0:22087` for parent rank `R` (`R1.R0` its low 16
    /// bits; 239.255.0.0/16 is the IPv4 local scope, RFC 2365), so a multicast-aware switch (IGMP snooping)
    /// delivers a parent's probes to its children only.
    Auto,
    /// One group for every parent (an admin's choice).
    Fixed(SocketAddrV4),
}

impl ProbeGroup {
    /// The group parent `rank` probes its children on.
    pub fn for_parent(self, rank: u32) -> Option<SocketAddrV4> {
        match self {
            ProbeGroup::Off => None,
            ProbeGroup::Auto => {
                Some(SocketAddrV4::new(Ipv4Addr::new(239, 255, (rank >> 8) as u8, rank as u8), PROBE_GROUP_PORT))
            }
            ProbeGroup::Fixed(a) => Some(a),
        }
    }

    /// Parses `auto`, `off`, or an IPv4 multicast `ADDR:PORT` outside the link-local control block; the error
    /// says what is expected.
    fn parse(v: &str) -> Result<ProbeGroup, String> {
        match v {
            "auto" => return Ok(ProbeGroup::Auto),
            "off" => return Ok(ProbeGroup::Off),
            _ => {}
        }
        let bad = || "expected auto, off or an IPv4 multicast ADDR:PORT".to_string();
        let a: SocketAddrV4 = v.parse().map_err(|_| bad())?;
        if !a.ip().is_multicast() || a.port() == 0 {
            return Err(bad());
        }
        if a.ip().octets()[..3] == [224, 0, 0] {
            return Err("224.0.0.0/24 is the link-local control block (every host on the subnet listens); use a \
                        group of 239.0.0.0/8"
                .into());
        }
        Ok(ProbeGroup::Fixed(a))
    }
}

impl std::fmt::Display for ProbeGroup {
    /// `auto`, `off` or `ADDR:PORT`, as the attribute is written.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProbeGroup::Off => f.write_str("off"),
            ProbeGroup::Auto => f.write_str("auto"),
            ProbeGroup::Fixed(a) => write!(f, "{a}"),
        }
    }
}

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
    /// Every attribute at its default (the [`DefaultValue::Value`]s of [`ATTRS`]).
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
    /// A name the broker sets itself ([`Access::Broker`]).
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

/// `a, b or c`.
fn one_of(words: &[&str]) -> String {
    match words {
        [] => String::new(),
        [one] => one.to_string(),
        [rest @ .., last] => format!("{} or {last}", rest.join(", ")),
    }
}

/// `job-manager.cc-limit`'s default: most copies one `--cc` makes, Slurm's MaxArraySize shape (its default is
/// 1,001 array indices; ours is ten times that, for the thousands of short jobs a test of the queue submits).
pub const DEFAULT_CC_LIMIT: usize = 10_001;

/// Shortest `tbon.heartbeat_period` accepted (seconds).
const MIN_HEARTBEAT: f64 = 0.001;

/// Shortest `tbon.stall_max` accepted, seconds.
const MIN_STALL: f64 = 0.02;

/// Longest liveness duration accepted (seconds): beyond it liveness would effectively be off.
const MAX_LIVENESS: f64 = 3600.0;

/// An RFC 23 duration.
fn duration(v: &str) -> Result<f64, String> {
    crate::duration::parse_duration_secs(v).map_err(|e| e.to_string())
}

/// A liveness duration: finite, > 0, at most an hour.
fn liveness(v: &str) -> Result<f64, String> {
    let s = duration(v)?;
    if !s.is_finite() || s <= 0.0 {
        return Err("expected a finite duration greater than 0".into());
    }
    if s > MAX_LIVENESS {
        return Err("longer than an hour; liveness would effectively be off".into());
    }
    Ok(s)
}

/// A `health.interval` or `health.timeout`: finite, at least [`MIN_HEALTH`], at most a day.
fn health_duration(v: &str, what: &str) -> Result<f64, String> {
    let s = duration(v)?;
    if !s.is_finite() || !(MIN_HEALTH..=86400.0).contains(&s) {
        return Err(format!("expected a duration from 100ms to a day {what}"));
    }
    Ok(s)
}

/// Shortest `health.interval` and `health.timeout` accepted, seconds.
const MIN_HEALTH: f64 = 0.1;

/// A count that fits `T`.
fn count<T: std::str::FromStr>(v: &str) -> Result<T, String> {
    v.parse().map_err(|_| "expected a count".to_string())
}

/// A word of an [`attr_enum!`] type.
fn word<T>(v: &str, from: fn(&str) -> Option<T>, names: &[&str]) -> Result<T, String> {
    from(v).ok_or_else(|| format!("expected {}", one_of(names)))
}

/// A `vigil_flow::config::Config` field: the default config with this field changed must validate.
fn rdma_field<T: std::str::FromStr>(
    v: &str,
    range: &str,
    set: fn(&mut vigil_flow::config::Config, T),
    cfg: &vigil_flow::config::Config,
) -> Result<vigil_flow::config::Config, String> {
    let n: T = v.parse().map_err(|_| format!("expected a number {range}"))?;
    let mut c = cfg.clone();
    set(&mut c, n);
    c.validate().map_err(|e| e.to_string())?;
    Ok(c)
}

/// Levels `log-level` takes as a single word.
const LOG_LEVELS: &[&str] = &["error", "warn", "info", "debug", "trace", "off"];

/// Attributes being parsed: the config, plus what the cross-attribute checks need.
#[derive(Default)]
struct Draft {
    cfg: BrokerConfig,
    topo: Option<(Topology, String)>,
    fanout: Option<(u32, String)>,
    synthetic: Option<String>,
    xml: Option<PathBuf>,
    /// `tbon.stall_max` was given (else its default follows a shorter `tbon.torpid_max`).
    stall_set: bool,
}

impl Draft {
    /// Sets attribute `name` (settable, in [`ATTRS`]) to `v`; the error says what `name` takes.
    fn set(&mut self, name: &str, v: &str) -> Result<(), String> {
        let c = &mut self.cfg;
        let m = &mut c.membership;
        match name {
            "tbon.topo" => self.topo = Some((v.parse().map_err(|_| "expected kary:K (K >= 0) or binomial")?, v.into())),
            "tbon.fanout" => {
                self.fanout = Some((v.parse().map_err(|_| "expected a number (tbon.fanout=K is kary:K)")?, v.into()))
            }
            "tbon.connect_timeout" => {
                c.connect_timeout = liveness(v).map_err(|e| {
                    if e.starts_with("longer than an hour") {
                        "longer than an hour: a broker would wait that long for its parent".to_string()
                    } else {
                        e
                    }
                })?
            }
            "tbon.heartbeat_period" => {
                let s = liveness(v)?;
                if s < MIN_HEARTBEAT {
                    return Err(format!(
                        "at least {:.0}ms: every broker sends one per period on each of its links",
                        MIN_HEARTBEAT * 1e3
                    ));
                }
                m.heartbeat_period = s
            }
            "tbon.torpid_max" => m.torpid_max = liveness(v)?,
            "tbon.stall_max" => {
                let s = liveness(v)?;
                if s < MIN_STALL {
                    return Err(format!(
                        "too short: at least {:.0}ms (the broker beats every quarter of it, and a busy node delays a \
                         beat by milliseconds: below that, live brokers flap between torpid and lively)",
                        MIN_STALL * 1e3
                    ));
                }
                m.stall_max = s
            }
            "tbon.lost_timeout" => m.lost_timeout = liveness(v)?,
            "tbon.probe_period" => {
                let s = liveness(v)?;
                if s < crate::membership::MIN_PROBE_PERIOD {
                    return Err(format!(
                        "too short: at least {:.0}ms (a busy node may delay a reply by a few ms)",
                        crate::membership::MIN_PROBE_PERIOD * 1e3
                    ));
                }
                m.probe_period = s;
            }
            "tbon.parent_grace" => {
                let s = duration(v)?;
                if !s.is_finite() || s > 86400.0 {
                    return Err("expected a duration up to a day: brokers and their jobs would wait that long".into());
                }
                c.parent_grace_set = Some(s);
            }
            "tbon.reparent" => {
                c.reparent = match v {
                    "on" => true,
                    "off" => false,
                    _ => return Err("expected on or off".into()),
                }
            }
            "tbon.probe_misses" => {
                m.probe_misses = v.parse().ok().filter(|n| *n > 0).ok_or("expected a positive integer")?;
            }
            "tbon.probe_group" => c.probe_group = ProbeGroup::parse(v)?,
            "tbon.job_network" => c.job_network = job_network(v)?,
            "tbon.job_network_undrain_after" => {
                c.job_network_undrain_after =
                    Some(duration(v)?).filter(|d| *d > 0.0).ok_or("expected a positive duration or inf")?
            }
            "broker.detectors" => c.detectors = word(v, DetectorChoice::from_name, DetectorChoice::NAMES)?,
            "broker.detector-rank" => c.detector_rank = Some(v.parse().map_err(|_| "expected a rank")?),
            "broker.xdp_mode" => c.xdp_mode = word(v, XdpMode::from_name, XdpMode::NAMES)?,
            "tbon.transport" => c.transport = word(v, Transport::from_name, Transport::NAMES)?,
            "tbon.ofi_provider" => {
                if v.trim().is_empty() || v.len() > 128 || v.chars().any(|ch| ch.is_whitespace() || ch.is_control()) {
                    return Err("expected a libfabric provider name such as cxi or 'tcp;ofi_rxm'".into());
                }
                c.ofi_provider = v.to_string();
            }
            "tbon.rdma_timeout" => c.rdma = rdma_field(v, "1..31", |c, n| c.timeout = n, &c.rdma)?,
            "tbon.rdma_retry_cnt" => c.rdma = rdma_field(v, "1..6", |c, n| c.retry_cnt = n, &c.rdma)?,
            "tbon.rdma_max_inline" => c.rdma = rdma_field(v, "of bytes 0..1024", |c, n| c.max_inline = n, &c.rdma)?,
            "tbon.rdma_poll" => c.rdma.busy_poll = word(v, RdmaPoll::from_name, RdmaPoll::NAMES)? == RdmaPoll::Busy,
            "tbon.rdma_frame" => c.rdma_frame = word(v, RdmaFrame::from_name, RdmaFrame::NAMES)?,
            "resource.synthetic" => {
                if v.trim().is_empty() {
                    return Err("expected an hwloc synthetic description, e.g. \"pack:1 core:8 pu:1\"".into());
                }
                self.synthetic = Some(v.into());
            }
            "resource.xml" => self.xml = Some(path(v)?),
            "resource.gpus" => c.gpus = Some(count(v)?),
            "resource.discovery" => c.discovery = word(v, Discovery::from_name, Discovery::NAMES)?,
            "exec.kill-timeout" => c.kill_timeout = duration(v)?,
            "exec.kill-timeout-max" => c.kill_timeout_max = duration(v)?,
            "sched.policy" => c.sched_policy = word(v, SchedPolicy::from_name, SchedPolicy::NAMES)?,
            "sched.default-duration" => {
                c.default_duration = duration(v)?;
                if c.default_duration <= 0.0 {
                    return Err("expected a duration greater than 0 (inf: no limit)".into());
                }
            }
            "sched.max-requeue" => c.max_requeue = count(v)?,
            "sched.backfill-depth" => {
                c.backfill_depth = count(v)?;
                if c.backfill_depth == 0 {
                    return Err("expected a count of at least 1".into());
                }
            }
            "job-manager.inactive-age-limit" => c.inactive_age_limit = duration(v)?,
            "job-manager.inactive-num-limit" => c.inactive_num_limit = count(v)?,
            "job-manager.history-age-limit" => c.history_age_limit = duration(v)?,
            "job-manager.history-num-limit" => c.history_num_limit = count(v)?,
            "job-manager.cc-limit" => c.cc_limit = count(v)?,
            "exec.shell" => c.shell = Some(path(v)?),
            "exec.imp" => {
                if !v.starts_with('/') {
                    return Err("expected an absolute path (it is run as a setuid program)".into());
                }
                c.imp = Some(path(v)?)
            }
            "exec.containment" => {
                c.containment = match v {
                    "auto" | "cgroup" | "pgroup" => v.to_string(),
                    _ => return Err("expected auto, cgroup or pgroup".into()),
                }
            }
            "exec.cgroup-spawn" => {
                c.cgroup_spawn = match v {
                    "auto" | "move" => v.to_string(),
                    _ => return Err("expected auto or move".into()),
                }
            }
            "exec.alloc-tmpdir-base" => {
                if !v.starts_with('/') {
                    return Err("expected an absolute path (each node's shell makes the directories there)".into());
                }
                c.alloc_tmpdir_base = Some(path(v)?)
            }
            "alloc-tmpdir" => c.alloc_tmpdir = Some(path(v)?),
            "access.allow-guest-users" => {
                c.allow_guest_users = match v {
                    "true" => true,
                    "false" => false,
                    _ => return Err("expected true or false".into()),
                }
            }
            "health.program" => {
                c.health_program = match v {
                    // As `vigil lsattr --doc` shows its default.
                    "none" | "" => None,
                    _ if !v.starts_with('/') => {
                        return Err("expected an absolute path (as Slurm's HealthCheckProgram), or none".into())
                    }
                    _ => Some(path(v)?),
                }
            }
            "health.interval" => c.health_interval = health_duration(v, "between two runs")?,
            "health.timeout" => c.health_timeout = health_duration(v, "for a run")?,
            "metrics.listen" => {
                c.metrics_listen = Some(v.parse().map_err(|_| "expected ADDR:PORT, e.g. 127.0.0.1:9250 or [::1]:0")?)
            }
            "metrics.ranks" => {
                c.metrics_ranks = Some(
                    crate::idset::IdSet::parse(v)
                        .map_err(|e| format!("expected an idset of ranks, e.g. 0 or 0-3 ({e})"))?,
                )
            }
            "log-level" => {
                let word = LOG_LEVELS.contains(&v);
                if !word && (!v.contains('=') || tracing_subscriber::EnvFilter::try_new(v).is_err()) {
                    return Err(format!("expected {}, or filter directives such as vigil=debug", one_of(LOG_LEVELS)));
                }
                c.log_level = Some(v.into());
            }
            "rundir" => c.rundir = Some(path(v)?),
            "statedir" => c.statedir = Some(path(v)?),
            "instance-level" => c.instance_level = count(v)?,
            "jobid" => c.jobid = Some(v.into()),
            "parent-uri" => c.parent_uri = Some(v.into()),
            "broker.tolerate-lost" => c.tolerate_lost = count(v)?,
            // ATTRS lists an attribute this function does not know: a unit test catches it.
            _ => return Err("this build cannot set it".into()),
        }
        Ok(())
    }

    /// The cross-attribute checks, and the config.
    fn finish(mut self) -> Result<BrokerConfig, AttrError> {
        let c = &mut self.cfg;
        c.topo = match (self.topo, self.fanout) {
            (Some((t, _)), Some((k, _))) if Topology::Kary(k) == t => t,
            (Some((_, topo)), Some((_, fanout))) => return Err(AttrError::TopoFanout { topo, fanout }),
            (Some((t, _)), None) => t,
            (None, Some((k, _))) => Topology::Kary(k),
            (None, None) => Topology::default(),
        };
        c.topology = match (self.synthetic, self.xml) {
            (Some(_), Some(_)) => return Err(AttrError::TwoTopologies),
            (Some(s), None) => TopologySource::Synthetic(s),
            (None, Some(x)) => TopologySource::XmlFile(x),
            (None, None) => TopologySource::Live,
        };
        let m = &c.membership;
        if m.heartbeat_period >= m.torpid_max {
            return Err(AttrError::HeartbeatNotShorter { heartbeat: m.heartbeat_period, torpid: m.torpid_max });
        }
        if m.stall_max > m.torpid_max {
            // The default follows a shorter tbon.torpid_max; a tbon.stall_max set longer is refused.
            if !self.stall_set {
                c.membership.stall_max = c.membership.torpid_max;
            } else {
                return Err(AttrError::StallLongerThanTorpid { stall: m.stall_max, torpid: m.torpid_max });
            }
        }
        Ok(self.cfg)
    }
}

/// A non-empty path.
/// `tbon.job_network`: an interface name as Linux allows one (1 to 15 bytes, no `/`, whitespace or `:`), or
/// `none`. Whether this node has it is found at start (a missing one turns the probe off, said once).
fn job_network(v: &str) -> Result<Option<String>, String> {
    if v == "none" || v.is_empty() {
        return Ok(None);
    }
    let ok = v.len() <= 15
        && v != "."
        && v != ".."
        && !v.bytes().any(|b| b == b'/' || b == b':' || b.is_ascii_whitespace() || b < 0x20);
    if ok {
        Ok(Some(v.to_string()))
    } else {
        Err("expected a network interface name (at most 15 characters, no '/', ':' or spaces), or none".into())
    }
}

fn path(v: &str) -> Result<PathBuf, String> {
    if v.is_empty() {
        return Err("expected a path".into());
    }
    Ok(v.into())
}

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
    /// `None` when it is unset ([`DefaultValue::Otherwise`]) or not a settable attribute.
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

/// Every attribute of [`ATTRS`] with its value in effect (`None`: unset), for `broker.lsattr` and
/// `broker.getattr`: `broker(name)` first (what the broker knows: its read-only attributes, and settable ones
/// it resolved itself such as `rundir`), else [`BrokerConfig::value`].
pub fn values(cfg: &BrokerConfig, broker: impl Fn(&str) -> Option<String>) -> BTreeMap<&'static str, Option<String>> {
    ATTRS.iter().map(|a| (a.name, broker(a.name).or_else(|| cfg.value(a.name)))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

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
