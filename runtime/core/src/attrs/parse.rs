//! Parsing and checking attribute values, one group at a time (`tbon.*`, `broker.*`, `resource.*`, the jobs'
//! `exec.*` / `sched.*` / `job-manager.*`, and the rest), into a [`Draft`] of the config, then the checks across
//! attributes ([`Draft::finish`]).

use super::{
    AttrError, BrokerConfig, DetectorChoice, Discovery, ProbeGroup, RdmaFrame, RdmaPoll, SchedPolicy, Transport,
    XdpMode,
};
use crate::topology::Topology;
use std::path::PathBuf;
use vigil_proto::node::TopologySource;

/// `a, b or c`.
fn one_of(words: &[&str]) -> String {
    match words {
        [] => String::new(),
        [one] => one.to_string(),
        [rest @ .., last] => format!("{} or {last}", rest.join(", ")),
    }
}

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
pub(super) struct Draft {
    pub(super) cfg: BrokerConfig,
    pub(super) topo: Option<(Topology, String)>,
    pub(super) fanout: Option<(u32, String)>,
    pub(super) synthetic: Option<String>,
    pub(super) xml: Option<PathBuf>,
    /// `tbon.stall_max` was given (else its default follows a shorter `tbon.torpid_max`).
    pub(super) stall_set: bool,
}

impl Draft {
    /// Sets attribute `name` (settable, in [`ATTRS`]) to `v`, by its group (the word before its first `.`); the
    /// error says what `name` takes.
    pub(super) fn set(&mut self, name: &str, v: &str) -> Result<(), String> {
        match name.split_once('.').map_or("", |(group, _)| group) {
            "tbon" => self.set_tbon(name, v),
            "broker" => self.set_broker(name, v),
            "resource" => self.set_resource(name, v),
            "exec" | "sched" | "job-manager" => self.set_jobs(name, v),
            _ => self.set_instance(name, v),
        }
    }

    /// Sets a `tbon.*` attribute: the tree's shape, liveness thresholds, probing, re-parenting, link transports.
    fn set_tbon(&mut self, name: &str, v: &str) -> Result<(), String> {
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
            // ATTRS lists an attribute this function does not know: a unit test catches it.
            _ => return Err("this build cannot set it".into()),
        }
        Ok(())
    }

    /// Sets a `broker.*` attribute: the failure detectors and their XDP responder, how many brokers may never join.
    fn set_broker(&mut self, name: &str, v: &str) -> Result<(), String> {
        let c = &mut self.cfg;
        match name {
            "broker.detectors" => c.detectors = word(v, DetectorChoice::from_name, DetectorChoice::NAMES)?,
            "broker.detector-rank" => c.detector_rank = Some(v.parse().map_err(|_| "expected a rank")?),
            "broker.xdp_mode" => c.xdp_mode = word(v, XdpMode::from_name, XdpMode::NAMES)?,
            "broker.tolerate-lost" => c.tolerate_lost = count(v)?,
            // ATTRS lists an attribute this function does not know: a unit test catches it.
            _ => return Err("this build cannot set it".into()),
        }
        Ok(())
    }

    /// Sets a `resource.*` attribute: where a node's resources come from.
    fn set_resource(&mut self, name: &str, v: &str) -> Result<(), String> {
        let c = &mut self.cfg;
        match name {
            "resource.synthetic" => {
                if v.trim().is_empty() {
                    return Err("expected an hwloc synthetic description, e.g. \"pack:1 core:8 pu:1\"".into());
                }
                self.synthetic = Some(v.into());
            }
            "resource.xml" => self.xml = Some(path(v)?),
            "resource.gpus" => c.gpus = Some(count(v)?),
            "resource.discovery" => c.discovery = word(v, Discovery::from_name, Discovery::NAMES)?,
            // ATTRS lists an attribute this function does not know: a unit test catches it.
            _ => return Err("this build cannot set it".into()),
        }
        Ok(())
    }

    /// Sets an `exec.*`, `sched.*` or `job-manager.*` attribute: how jobs are run, scheduled and kept.
    fn set_jobs(&mut self, name: &str, v: &str) -> Result<(), String> {
        let c = &mut self.cfg;
        match name {
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
            // ATTRS lists an attribute this function does not know: a unit test catches it.
            _ => return Err("this build cannot set it".into()),
        }
        Ok(())
    }

    /// Sets any other attribute: access, health checks, metrics, logging, directories, a nested instance's place.
    fn set_instance(&mut self, name: &str, v: &str) -> Result<(), String> {
        let c = &mut self.cfg;
        match name {
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
            // ATTRS lists an attribute this function does not know: a unit test catches it.
            _ => return Err("this build cannot set it".into()),
        }
        Ok(())
    }

    /// The cross-attribute checks, and the config.
    pub(super) fn finish(mut self) -> Result<BrokerConfig, AttrError> {
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

/// A non-empty path.
fn path(v: &str) -> Result<PathBuf, String> {
    if v.is_empty() {
        return Err("expected a path".into());
    }
    Ok(v.into())
}
