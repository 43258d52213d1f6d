//! The attributes that take a word (`broker.detectors`, `tbon.transport`, `sched.policy`...), each an enum with
//! its words, and `tbon.probe_group` ([`ProbeGroup`]).

use std::net::{Ipv4Addr, SocketAddrV4};

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
    pub(super) fn parse(v: &str) -> Result<ProbeGroup, String> {
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
