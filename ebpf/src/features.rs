//! What the running kernel offers the detectors' BPF programs: [`KernelFeatures`], probed once at load
//! ([`KernelFeatures::probe`]) and judged by the pure rule in `choice.rs` ([`plan`](crate::plan)).
//!
//! A feature set also has a text form, one fact a line ([`KernelFeatures::to_text`] /
//! [`KernelFeatures::from_text`]): the tests judge the sets recorded on real kernels (`tests/kernels/*.txt`,
//! recorded with `cargo run --example kernel_features`), and a broker judges a recorded set instead of its own
//! kernel when `$VIGIL_KERNEL_FEATURES` names one ([`FEATURES_ENV`]), which is how the fallbacks of older
//! kernels are exercised on a new one.

use std::{collections::BTreeMap, fmt::Write as _, path::Path};

/// Environment variable: path of a recorded feature set (the text form) that the detectors judge instead of
/// probing the running kernel. For tests of the fallbacks; the programs still load on the real kernel.
pub const FEATURES_ENV: &str = "VIGIL_KERNEL_FEATURES";

/// The tracepoints the detectors attach to, as `category/name` (their record fields are probed from tracefs).
pub const TRACEPOINTS: &[&str] = &[
    "sched/sched_process_exit",
    "signal/signal_generate",
    "oom/mark_victim",
    "sock/inet_sock_set_state",
    "tcp/tcp_retransmit_skb",
    "tcp/tcp_receive_reset",
];

/// The kernel features the detectors depend on: plain data, filled by [`probe`](Self::probe) or read from a
/// recorded text ([`from_text`](Self::from_text)).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KernelFeatures {
    /// `uname -r`, e.g. `6.1.0-27-amd64` (shown in the detectors' lines; the rule decides on the features,
    /// not on this number, so a distribution kernel with backports is judged by what it has).
    pub release: String,
    /// The kernel's own BTF is readable at `/sys/kernel/btf/vmlinux` (Linux 5.4 with `CONFIG_DEBUG_INFO_BTF`):
    /// CO-RE relocations of the tracing programs resolve against it.
    pub btf: bool,
    /// A `BPF_MAP_TYPE_RINGBUF` map can be created (Linux 5.8).
    pub ringbuf: bool,
    /// A `BPF_MAP_TYPE_PERF_EVENT_ARRAY` map can be created (Linux 4.3).
    pub perf_event_array: bool,
    /// A `BPF_MAP_TYPE_LRU_HASH` map can be created (Linux 4.10).
    pub lru_hash: bool,
    /// An array map with `BPF_F_MMAPABLE` can be created (Linux 5.5): the XDP reply collector.
    pub mmapable_array: bool,
    /// `BPF_PROG_TYPE_TRACEPOINT` programs load (Linux 4.7).
    pub prog_tracepoint: bool,
    /// `BPF_PROG_TYPE_XDP` programs load (Linux 4.8; generic XDP on any interface since 4.12).
    pub prog_xdp: bool,
    /// The helper `bpf_probe_read_kernel` is offered to tracepoint programs (Linux 5.5); CO-RE reads use it.
    pub probe_read_kernel: bool,
    /// Kernel lockdown mode (`none`, `integrity`, `confidentiality`) from `/sys/kernel/security/lockdown`;
    /// `None` where the file is missing (no lockdown LSM).
    pub lockdown: Option<String>,
    /// Record field names (without the `common_` ones) of each of [`TRACEPOINTS`] present, from tracefs
    /// `events/<category>/<name>/format`; a missing key is a missing tracepoint.
    pub tracepoints: BTreeMap<String, Vec<String>>,
}

impl KernelFeatures {
    /// Whether tracepoint `tp` (`category/name`) exists.
    pub fn has_tracepoint(&self, tp: &str) -> bool {
        self.tracepoints.contains_key(tp)
    }

    /// Whether tracepoint `tp` exists and its record has field `field`.
    pub fn has_field(&self, tp: &str, field: &str) -> bool {
        self.tracepoints.get(tp).is_some_and(|f| f.iter().any(|x| x == field))
    }

    /// Probes the running kernel. Needs root (or `CAP_BPF`) for the map and program probes, which otherwise
    /// read as absent; mounts tracefs if needed. Never fails: what cannot be probed is absent.
    pub fn probe() -> KernelFeatures {
        use aya::{
            maps::MapType,
            programs::ProgramType,
            sys::{BpfHelper, is_helper_supported, is_map_supported, is_program_supported},
        };
        let map = |t| is_map_supported(t).unwrap_or(false);
        let prog = |t| is_program_supported(t).unwrap_or(false);
        let _ = crate::sys::ensure_tracefs();
        let tracefs = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"]
            .into_iter()
            .map(Path::new)
            .find(|p| p.join("events").is_dir());
        let mut tracepoints = BTreeMap::new();
        if let Some(root) = tracefs {
            for tp in TRACEPOINTS {
                if let Ok(text) = std::fs::read_to_string(root.join("events").join(tp).join("format")) {
                    tracepoints.insert(tp.to_string(), format_fields(&text));
                }
            }
        }
        KernelFeatures {
            release: crate::sys::kernel_release(),
            btf: Path::new("/sys/kernel/btf/vmlinux").exists(),
            ringbuf: map(MapType::RingBuf),
            perf_event_array: map(MapType::PerfEventArray),
            lru_hash: map(MapType::LruHash),
            mmapable_array: crate::sys::mmapable_array_supported(),
            prog_tracepoint: prog(ProgramType::TracePoint),
            prog_xdp: prog(ProgramType::Xdp),
            probe_read_kernel: is_helper_supported(ProgramType::TracePoint, BpfHelper::BPF_FUNC_probe_read_kernel)
                .unwrap_or(false),
            lockdown: std::fs::read_to_string("/sys/kernel/security/lockdown").ok().and_then(|s| lockdown_mode(&s)),
            tracepoints,
        }
    }

    /// The features to judge: the set recorded in `$VIGIL_KERNEL_FEATURES` if it names one, else
    /// [`probe`](Self::probe). A file that cannot be read or parsed is an error naming it.
    pub fn from_env_or_probe() -> Result<KernelFeatures, String> {
        match std::env::var_os(FEATURES_ENV) {
            Some(p) if !p.is_empty() => {
                let text = std::fs::read_to_string(&p)
                    .map_err(|e| format!("{FEATURES_ENV}={}: {e}", Path::new(&p).display()))?;
                KernelFeatures::from_text(&text).map_err(|e| format!("{FEATURES_ENV}={}: {e}", Path::new(&p).display()))
            }
            _ => Ok(KernelFeatures::probe()),
        }
    }

    /// The text form: `key value` lines (`yes`/`no` for flags), one `tracepoint category/name field...` line per
    /// present tracepoint, `#` comments. Round-trips through [`from_text`](Self::from_text).
    pub fn to_text(&self) -> String {
        let yn = |b: bool| if b { "yes" } else { "no" };
        let mut s = String::new();
        let _ = writeln!(s, "release {}", self.release);
        let _ = writeln!(s, "btf {}", yn(self.btf));
        let _ = writeln!(s, "map.ringbuf {}", yn(self.ringbuf));
        let _ = writeln!(s, "map.perf_event_array {}", yn(self.perf_event_array));
        let _ = writeln!(s, "map.lru_hash {}", yn(self.lru_hash));
        let _ = writeln!(s, "map.mmapable_array {}", yn(self.mmapable_array));
        let _ = writeln!(s, "prog.tracepoint {}", yn(self.prog_tracepoint));
        let _ = writeln!(s, "prog.xdp {}", yn(self.prog_xdp));
        let _ = writeln!(s, "helper.probe_read_kernel {}", yn(self.probe_read_kernel));
        let _ = writeln!(s, "lockdown {}", self.lockdown.as_deref().unwrap_or("-"));
        for (tp, fields) in &self.tracepoints {
            let _ = writeln!(s, "tracepoint {tp} {}", fields.join(" "));
        }
        s
    }

    /// Parses the text form ([`to_text`](Self::to_text)). Every key must appear once except `tracepoint`;
    /// errors name the line and the key.
    pub fn from_text(text: &str) -> Result<KernelFeatures, String> {
        let mut f = KernelFeatures::default();
        let mut seen = std::collections::BTreeSet::new();
        for (n, line) in text.lines().enumerate().map(|(i, l)| (i + 1, l.trim())) {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (key, value) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
            let value = value.trim();
            let flag = || match value {
                "yes" => Ok(true),
                "no" => Ok(false),
                v => Err(format!("line {n}: {key}: expected yes or no, got {v:?}")),
            };
            if key != "tracepoint" && !seen.insert(key.to_string()) {
                return Err(format!("line {n}: {key} given twice"));
            }
            match key {
                "release" => f.release = value.to_string(),
                "btf" => f.btf = flag()?,
                "map.ringbuf" => f.ringbuf = flag()?,
                "map.perf_event_array" => f.perf_event_array = flag()?,
                "map.lru_hash" => f.lru_hash = flag()?,
                "map.mmapable_array" => f.mmapable_array = flag()?,
                "prog.tracepoint" => f.prog_tracepoint = flag()?,
                "prog.xdp" => f.prog_xdp = flag()?,
                "helper.probe_read_kernel" => f.probe_read_kernel = flag()?,
                "lockdown" => f.lockdown = (value != "-" && !value.is_empty()).then(|| value.to_string()),
                "tracepoint" => {
                    let mut words = value.split_whitespace();
                    let tp = words.next().filter(|t| t.contains('/')).ok_or_else(|| {
                        format!("line {n}: tracepoint: expected category/name then field names, got {value:?}")
                    })?;
                    if f.tracepoints.insert(tp.to_string(), words.map(str::to_string).collect()).is_some() {
                        return Err(format!("line {n}: tracepoint {tp} given twice"));
                    }
                }
                k => return Err(format!("line {n}: unknown key {k:?}")),
            }
        }
        for key in [
            "release",
            "btf",
            "map.ringbuf",
            "map.perf_event_array",
            "map.lru_hash",
            "map.mmapable_array",
            "prog.tracepoint",
            "prog.xdp",
            "helper.probe_read_kernel",
        ] {
            if !seen.contains(key) {
                return Err(format!("{key} missing"));
            }
        }
        Ok(f)
    }
}

/// Field names of a tracefs `format` file, without the `common_*` header fields and array suffixes:
/// `\tfield:__u8 saddr[4];\toffset:34;...` gives `saddr`.
pub(crate) fn format_fields(format: &str) -> Vec<String> {
    format
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("field:"))
        .filter_map(|l| l.split(';').next())
        .filter_map(|decl| decl.split_whitespace().last())
        .map(|name| name.split('[').next().unwrap_or(name).trim_start_matches('*').to_string())
        .filter(|name| !name.is_empty() && !name.starts_with("common_"))
        .collect()
}

/// The selected mode of `/sys/kernel/security/lockdown` (`none [integrity] confidentiality` gives `integrity`).
pub(crate) fn lockdown_mode(s: &str) -> Option<String> {
    let start = s.find('[')?;
    let end = s[start..].find(']')? + start;
    Some(s[start + 1..end].to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_come_from_a_tracefs_format_without_the_common_ones() {
        let format = "name: tcp_retransmit_skb\nID: 2281\nformat:\n\
            \tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
            \tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n\
            \tfield:const void * skbaddr;\toffset:8;\tsize:8;\tsigned:0;\n\
            \tfield:int state;\toffset:24;\tsize:4;\tsigned:1;\n\
            \tfield:__u8 saddr[4];\toffset:34;\tsize:4;\tsigned:0;\n\nprint fmt: \"x\"\n";
        assert_eq!(format_fields(format), ["skbaddr", "state", "saddr"]);
    }

    #[test]
    fn lockdown_mode_is_the_bracketed_word() {
        assert_eq!(lockdown_mode("[none] integrity confidentiality\n").as_deref(), Some("none"));
        assert_eq!(lockdown_mode("none integrity [confidentiality]").as_deref(), Some("confidentiality"));
        assert_eq!(lockdown_mode("none"), None);
    }

    #[test]
    fn text_form_round_trips_and_bad_lines_are_named() {
        let mut f = KernelFeatures { release: "6.1.0-27-amd64".into(), btf: true, ringbuf: true, ..Default::default() };
        f.tracepoints.insert("oom/mark_victim".into(), vec!["pid".into()]);
        assert_eq!(KernelFeatures::from_text(&f.to_text()).unwrap(), f);
        let bad = f.to_text().replace("btf yes", "btf maybe");
        assert!(KernelFeatures::from_text(&bad).unwrap_err().contains("btf: expected yes or no"));
        let missing = f.to_text().replace("map.ringbuf yes\n", "");
        assert_eq!(KernelFeatures::from_text(&missing).unwrap_err(), "map.ringbuf missing");
        let twice = format!("{}btf no\n", f.to_text());
        assert!(KernelFeatures::from_text(&twice).unwrap_err().contains("btf given twice"));
    }
}
