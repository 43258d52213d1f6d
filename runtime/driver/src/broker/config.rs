//! System-instance bootstrap from a TOML file (the shape of flux-core's `[bootstrap]` table).
//!
//! ```toml
//! [bootstrap]
//! instance = "cluster"                 # optional name; brokers of different instances refuse each other
//! overlay_key = "/etc/vigil/overlay.key" # required: the key file (vigil keygen) every broker authenticates with
//! default_port = 8050
//! default_bind = "tcp://0.0.0.0:%p"    # %h = the host's name, %p = port
//! default_connect = "tcp://%h:%p"
//! hosts = [
//!   { host = "node0", bind = "tcp://10.200.0.1:8050", connect = "tcp://10.200.0.1:8050" },
//!   { host = "node[1-3]", job_network = "hsn0" }, # RFC 29 hostlist; ranks follow the order of the expanded
//!                                      # list; job_network: these nodes' job network (`tbon.job_network`)
//! ]
//! statedir = "/var/lib/vigil"          # optional: rank 0 keeps its jobs here (docs/statedir.md)
//! [tbon]
//! topo = "kary:2"                      # optional
//! [exec]
//! alloc-tmpdir-base = "/dev/shm"       # optional: where jobs' VIGIL_ALLOC_TMPDIR is made (default: job tmpdir)
//! [access]                             # optional: who may use the instance (docs/security.md)
//! allow-guest-users = true             # users other than the brokers' own may connect (default false)
//! [health]                             # optional: the node health check (docs/system-instance.md)
//! program = "/etc/vigil/health-check.sh"
//! interval = "5m"                      # RFC 23 durations
//! timeout = "1m"
//! ```

use crate::hostlist::Hostlist;
use serde::Deserialize;

/// One `hosts` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostEntry {
    /// RFC 29 hostlist.
    pub host: String,
    /// Endpoint to bind, overriding `default_bind`.
    pub bind: Option<String>,
    /// Endpoint peers connect to, overriding `default_connect`.
    pub connect: Option<String>,
    /// The interface of these hosts' job network (`tbon.job_network`, which `-S` overrides): the parent probes
    /// it too, and drains a node whose job network alone stops answering as fabric-down.
    pub job_network: Option<String>,
}

/// The `[bootstrap]` table.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Bootstrap {
    /// Instance name.
    #[serde(default)]
    pub instance: Option<String>,
    /// Path of the overlay key file (`vigil keygen`), the same on every node; required by `vigil broker`.
    #[serde(default)]
    pub overlay_key: Option<String>,
    /// Port substituted for `%p`.
    #[serde(default)]
    pub default_port: Option<u16>,
    /// Default bind endpoint.
    #[serde(default)]
    pub default_bind: Option<String>,
    /// Default connect endpoint.
    #[serde(default)]
    pub default_connect: Option<String>,
    /// Hosts, in rank order.
    pub hosts: Vec<HostEntry>,
    /// The `statedir` attribute (`-S statedir` wins): where rank 0 keeps its jobs across a restart.
    #[serde(default)]
    pub statedir: Option<String>,
}

/// The `[tbon]` table.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TbonTable {
    /// `tbon.topo`.
    pub topo: Option<String>,
}

/// The `[exec]` table.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecTable {
    /// `exec.alloc-tmpdir-base` (`-S` wins): where each job's node-local `VIGIL_ALLOC_TMPDIR` is made.
    #[serde(rename = "alloc-tmpdir-base")]
    pub alloc_tmpdir_base: Option<String>,
    /// `exec.imp` (`-S` wins): the privileged launcher of a multi-user instance whose brokers are not root.
    pub imp: Option<String>,
}

/// The `[access]` table: who may use the instance (docs/security.md).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccessTable {
    /// `access.allow-guest-users` (`-S` wins): users other than the instance owner may connect (Flux's
    /// `access.allow-guest-user`).
    #[serde(rename = "allow-guest-users")]
    pub allow_guest_users: Option<bool>,
}

/// The `[health]` table: the `health.*` attributes (`-S` wins), checked as they are.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HealthTable {
    /// `health.program`.
    pub program: Option<String>,
    /// `health.interval`, an RFC 23 duration.
    pub interval: Option<String>,
    /// `health.timeout`, an RFC 23 duration.
    pub timeout: Option<String>,
}

impl HealthTable {
    /// `(attribute, value)` of each key set.
    pub fn attrs(&self) -> Vec<(&'static str, String)> {
        [("health.program", &self.program), ("health.interval", &self.interval), ("health.timeout", &self.timeout)]
            .into_iter()
            .filter_map(|(k, v)| v.clone().map(|v| (k, v)))
            .collect()
    }
}

/// A whole config file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    /// Bootstrap table.
    pub bootstrap: Bootstrap,
    /// Optional TBON table.
    #[serde(default)]
    pub tbon: TbonTable,
    /// Optional exec table.
    #[serde(default)]
    pub exec: ExecTable,
    /// Optional health check table.
    #[serde(default)]
    pub health: HealthTable,
    /// Optional access table.
    #[serde(default)]
    pub access: AccessTable,
}

/// One rank of the instance, resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankEndpoint {
    /// Host name.
    pub host: String,
    /// Endpoint to bind.
    pub bind: String,
    /// Endpoint to connect to.
    pub connect: String,
    /// Its `job_network`, if its hosts entry names one.
    pub job_network: Option<String>,
}

/// Error in a config file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// File unreadable.
    #[error("{path}: {err}")]
    Read {
        /// Path.
        path: String,
        /// Error.
        err: std::io::Error,
    },
    /// Not valid TOML or wrong shape.
    #[error("{path}: {err}")]
    Parse {
        /// Path.
        path: String,
        /// Error.
        err: String,
    },
    /// Host not found.
    #[error("host '{0}' is not listed in bootstrap.hosts (use --hostname or --rank to override)")]
    UnknownHost(String),
    /// Missing endpoint.
    #[error("bootstrap.hosts: no {what} endpoint for host '{host}' and no default_{what}")]
    NoEndpoint {
        /// bind or connect.
        what: &'static str,
        /// Host.
        host: String,
    },
}

impl ConfigFile {
    /// Read and parse a config file: TOML, or JSON with the same keys when its name ends in `.json`.
    ///
    /// `vigil start` writes its test instance's file as JSON: every broker of the instance reads the whole host
    /// list, one entry per broker, and the TOML parser takes about 3.4 ms for 1,024 entries where JSON takes a
    /// tenth of a millisecond; 1,024 brokers on one machine paid 1,024 × 3.4 ms of CPU for it.
    pub fn load(path: &str) -> Result<ConfigFile, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|err| ConfigError::Read { path: path.into(), err })?;
        let parsed = if path.ends_with(".json") { ConfigFile::parse_json(&text) } else { ConfigFile::parse(&text) };
        parsed.map_err(|err| ConfigError::Parse { path: path.into(), err })
    }

    /// Parse config text (TOML).
    pub fn parse(text: &str) -> Result<ConfigFile, String> {
        let c: ConfigFile = toml::from_str(text).map_err(|e| e.to_string())?;
        c.checked()
    }

    /// Parse config text in JSON, with the keys of the TOML form.
    pub fn parse_json(text: &str) -> Result<ConfigFile, String> {
        let c: ConfigFile = serde_json::from_str(text).map_err(|e| e.to_string())?;
        c.checked()
    }

    /// What every form must hold: at least one host.
    fn checked(self) -> Result<ConfigFile, String> {
        let c = self;
        if c.bootstrap.hosts.is_empty() {
            return Err("bootstrap.hosts: must list at least one host".into());
        }
        Ok(c)
    }

    /// Every rank's host and endpoints, in rank order.
    pub fn ranks(&self) -> Result<Vec<RankEndpoint>, ConfigError> {
        let b = &self.bootstrap;
        let port = b.default_port.map(|p| p.to_string()).unwrap_or_default();
        let mut out = Vec::new();
        for (i, e) in b.hosts.iter().enumerate() {
            let hl = Hostlist::parse(&e.host).map_err(|err| ConfigError::Parse {
                path: format!("bootstrap.hosts[{i}].host"),
                err: err.to_string(),
            })?;
            for h in hl.iter() {
                let sub = |t: &str| t.replace("%h", h).replace("%p", &port);
                let bind = e
                    .bind
                    .as_deref()
                    .or(b.default_bind.as_deref())
                    .map(sub)
                    .ok_or(ConfigError::NoEndpoint { what: "bind", host: h.to_string() })?;
                let connect = e
                    .connect
                    .as_deref()
                    .or(b.default_connect.as_deref())
                    .map(sub)
                    .ok_or(ConfigError::NoEndpoint { what: "connect", host: h.to_string() })?;
                out.push(RankEndpoint { host: h.to_string(), bind, connect, job_network: e.job_network.clone() });
            }
        }
        Ok(out)
    }

    /// Rank of `hostname`.
    pub fn rank_of(&self, hostname: &str) -> Result<u32, ConfigError> {
        self.ranks()?
            .iter()
            .position(|r| r.host == hostname)
            .map(|p| p as u32)
            .ok_or_else(|| ConfigError::UnknownHost(hostname.into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hosts_entry_names_its_job_network() {
        let c = ConfigFile::parse(
            "[bootstrap]\ndefault_bind = 'tcp://%h:1'\ndefault_connect = 'tcp://%h:1'\n\
             hosts = [{ host = 'n0' }, { host = 'n[1-2]', job_network = 'hsn0' }]\n",
        )
        .expect("parses");
        let r = c.ranks().expect("ranks");
        let jn: Vec<Option<&str>> = r.iter().map(|e| e.job_network.as_deref()).collect();
        assert_eq!(jn, vec![None, Some("hsn0"), Some("hsn0")]);
    }

    #[test]
    fn expands_hosts_and_defaults() {
        let c = ConfigFile::parse(
            r#"
[bootstrap]
default_port = 8050
default_bind = "tcp://0.0.0.0:%p"
default_connect = "tcp://%h:%p"
hosts = [ { host = "node0", bind = "tcp://10.200.0.1:9000", connect = "tcp://10.200.0.1:9000" }, { host = "node[1-3]" } ]
statedir = "/var/lib/vigil"
[tbon]
topo = "kary:2"
[exec]
alloc-tmpdir-base = "/dev/shm"
"#,
        )
        .unwrap();
        let r = c.ranks().unwrap();
        assert_eq!(r.len(), 4);
        assert_eq!(r[0].connect, "tcp://10.200.0.1:9000");
        assert_eq!(r[2].connect, "tcp://node2:8050");
        assert_eq!(c.rank_of("node3").unwrap(), 3);
        assert!(matches!(c.rank_of("nope"), Err(ConfigError::UnknownHost(_))));
        assert_eq!(c.tbon.topo.as_deref(), Some("kary:2"));
        assert_eq!(c.bootstrap.statedir.as_deref(), Some("/var/lib/vigil"));
        assert_eq!(c.exec.alloc_tmpdir_base.as_deref(), Some("/dev/shm"));
        assert!(c.health.attrs().is_empty(), "no [health]: no health check");
    }

    /// `[health]` gives the `health.*` attributes; an unknown key in it is refused, naming it.
    #[test]
    fn health_table_gives_the_health_attributes() {
        let hosts = "[bootstrap]\nhosts = [{host='a', bind='tcp://1.2.3.4:1', connect='tcp://1.2.3.4:1'}]\n";
        let c = ConfigFile::parse(&format!("{hosts}[health]\nprogram = '/etc/vigil/hc.sh'\ninterval = '10m'\n"))
            .expect("parse");
        assert_eq!(
            c.health.attrs(),
            [("health.program", "/etc/vigil/hc.sh".to_string()), ("health.interval", "10m".to_string())]
        );
        let e = ConfigFile::parse(&format!("{hosts}[health]\nprogramme = 'x'\n")).unwrap_err().to_string();
        assert!(e.contains("programme"), "{e}");
    }

    /// The JSON form (`vigil start`'s) reads as the TOML form with the same keys, and is refused as it is.
    #[test]
    fn json_has_the_keys_of_toml() {
        let toml = ConfigFile::parse(
            "[bootstrap]\ndefault_port = 8050\ndefault_bind = 'tcp://0.0.0.0:%p'\ndefault_connect = 'tcp://%h:%p'\n\
             hosts = [{ host = 'node[0-2]' }]\n[tbon]\ntopo = 'kary:2'\n",
        )
        .expect("toml");
        let json = ConfigFile::parse_json(
            r#"{"bootstrap": {"default_port": 8050, "default_bind": "tcp://0.0.0.0:%p",
                "default_connect": "tcp://%h:%p", "hosts": [{"host": "node[0-2]"}]}, "tbon": {"topo": "kary:2"}}"#,
        )
        .expect("json");
        let eps = |c: &ConfigFile| c.ranks().expect("ranks").iter().map(|r| r.connect.clone()).collect::<Vec<_>>();
        assert_eq!(eps(&json), eps(&toml));
        assert_eq!(json.tbon.topo, toml.tbon.topo);
        assert!(ConfigFile::parse_json(r#"{"bootstrap": {"hosts": []}}"#).is_err());
        let e = ConfigFile::parse_json(r#"{"bootstrap": {"hosts": [{"host": "a"}], "bogus": 1}}"#).unwrap_err();
        assert!(e.contains("bogus"), "{e}");
    }

    #[test]
    fn rejects_bad_configs() {
        assert!(ConfigFile::parse("[bootstrap]\nhosts = []").is_err());
        assert!(ConfigFile::parse("[bootstrap]\nhosts = [{host='a'}]\nbogus = 1").is_err());
        assert!(ConfigFile::parse("[bootstrap]\nhosts = [{host='a'}]\n[exec]\nalloc_tmpdir_base = '/x'").is_err());
        let c = ConfigFile::parse("[bootstrap]\nhosts = [{host='a'}]").unwrap();
        assert!(matches!(c.ranks(), Err(ConfigError::NoEndpoint { .. })));
    }

    /// `[access] allow-guest-users` is a boolean; absent, the instance is its owner's only.
    #[test]
    fn the_access_table_says_whether_guests_may_connect() {
        let base = "[bootstrap]\nhosts = [{host='a'}]\n";
        assert_eq!(ConfigFile::parse(base).unwrap().access.allow_guest_users, None);
        let c = ConfigFile::parse(&format!("{base}[access]\nallow-guest-users = true")).unwrap();
        assert_eq!(c.access.allow_guest_users, Some(true));
        assert!(ConfigFile::parse(&format!("{base}[access]\nallow-guest-users = 'yes'")).is_err());
        assert!(ConfigFile::parse(&format!("{base}[access]\nallow_guest_users = true")).is_err());
    }
}
