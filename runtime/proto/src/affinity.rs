//! Task binding options and CPU lists as plain data: the `cpu-affinity` / `gpu-affinity` shell options
//! ([`CpuAffinity`], [`GpuAffinity`]) and Linux-style cpu lists (`"0-3,8,10-11"`: [`format_cpulist`],
//! [`parse_cpulist`]).
//!
//! The broker reads the options to place a shell's tasks with hwloc (`vigil-hwloc`), the CLI checks them at
//! submission and the job shell reads them and exports its tasks' CPUs as cpu lists (`VIGIL_TASK_CPUS`); none of
//! them needs hwloc or a syscall for it.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// An affinity option's value is not `off`, `on` or `per-task`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {option} value '{value}' (expected 'off', 'on' or 'per-task')")]
pub struct InvalidAffinity {
    /// Name of the option being parsed (`cpu-affinity` / `gpu-affinity`).
    pub option: &'static str,
    /// The rejected value, verbatim.
    pub value: String,
}

/// A cpu list string such as `"0-3,8"` could not be parsed by [`parse_cpulist`]; carries the offending text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid cpu list '{0}'")]
pub struct InvalidCpuList(pub String);

/// CPU binding policy (Flux shell option `cpu-affinity`).
///
/// Parses from / displays as `"off"`, `"on"`, `"per-task"` (also the serde
/// representation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CpuAffinity {
    /// Do not bind: [`TaskPlacement::cpus`](crate::shellproto::TaskPlacement::cpus) is `None`.
    Off,
    /// Bind every task to the union of the PUs of all allocated cores.
    On,
    /// Bind each task to its own share of the allocated cores (default);
    /// see `vigil-hwloc`'s `PlacementRequest`.
    #[default]
    PerTask,
}

/// GPU binding policy (Flux shell option `gpu-affinity`).
///
/// Parses from / displays as `"off"`, `"on"`, `"per-task"` (also the serde
/// representation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GpuAffinity {
    /// Set no GPU visibility: [`TaskPlacement::gpus`](crate::shellproto::TaskPlacement::gpus) is `None`.
    Off,
    /// Every task sees all allocated GPUs.
    On,
    /// Each task gets its own slice of the allocated GPUs (default); see
    /// `vigil-hwloc`'s `PlacementRequest`.
    #[default]
    PerTask,
}

fn affinity_name(off: bool, on: bool) -> &'static str {
    if off {
        "off"
    } else if on {
        "on"
    } else {
        "per-task"
    }
}

/// Parse `"off" | "on" | "per-task"` into (off, on) flags.
fn parse_affinity(option: &'static str, s: &str) -> Result<(bool, bool), InvalidAffinity> {
    match s {
        "off" => Ok((true, false)),
        "on" => Ok((false, true)),
        "per-task" => Ok((false, false)),
        _ => Err(InvalidAffinity { option, value: s.to_string() }),
    }
}

impl FromStr for CpuAffinity {
    type Err = InvalidAffinity;
    /// Accepts exactly `"off"`, `"on"` or `"per-task"`; anything else gives
    /// [`InvalidAffinity`] naming the bad value.
    fn from_str(s: &str) -> Result<Self, InvalidAffinity> {
        Ok(match parse_affinity("cpu-affinity", s)? {
            (true, _) => CpuAffinity::Off,
            (_, true) => CpuAffinity::On,
            _ => CpuAffinity::PerTask,
        })
    }
}

impl FromStr for GpuAffinity {
    type Err = InvalidAffinity;
    /// Accepts exactly `"off"`, `"on"` or `"per-task"`; anything else gives
    /// [`InvalidAffinity`] naming the bad value.
    fn from_str(s: &str) -> Result<Self, InvalidAffinity> {
        Ok(match parse_affinity("gpu-affinity", s)? {
            (true, _) => GpuAffinity::Off,
            (_, true) => GpuAffinity::On,
            _ => GpuAffinity::PerTask,
        })
    }
}

impl fmt::Display for CpuAffinity {
    /// `"off"`, `"on"` or `"per-task"`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(affinity_name(*self == CpuAffinity::Off, *self == CpuAffinity::On))
    }
}

impl fmt::Display for GpuAffinity {
    /// `"off"`, `"on"` or `"per-task"`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(affinity_name(*self == GpuAffinity::Off, *self == GpuAffinity::On))
    }
}

/// Format a list of ids as a compact list `"0-3,8,10-11"` (like Linux cpu
/// lists). Input order and duplicates do not matter; the output is sorted.
/// An empty slice gives `""`.
pub fn format_cpulist(ids: &[u32]) -> String {
    let mut v = ids.to_vec();
    v.sort_unstable();
    v.dedup();
    let mut out = String::new();
    let mut i = 0;
    while i < v.len() {
        let start = v[i];
        let mut end = start;
        while i + 1 < v.len() && end.checked_add(1) == Some(v[i + 1]) {
            i += 1;
            end = v[i];
        }
        if !out.is_empty() {
            out.push(',');
        }
        if start == end {
            out.push_str(&start.to_string());
        } else {
            out.push_str(&format!("{start}-{end}"));
        }
        i += 1;
    }
    out
}

/// Largest number of ids [`parse_cpulist`] will expand (guards memory).
const MAX_CPULIST_LEN: u64 = 1 << 20;

/// Parse a Linux-style cpu list (`"0-3,8,10-11"`, whitespace around items
/// allowed, empty string = empty list) into sorted, de-duplicated ids.
///
/// # Errors
/// [`InvalidCpuList`] on syntax errors, reversed ranges, or lists
/// expanding to more than 2^20 ids.
pub fn parse_cpulist(s: &str) -> Result<Vec<u32>, InvalidCpuList> {
    let bad = || InvalidCpuList(s.to_string());
    let mut out = Vec::new();
    let mut total: u64 = 0;
    if s.trim().is_empty() {
        return Ok(out);
    }
    for item in s.split(',') {
        let item = item.trim();
        let (a, b) = match item.split_once('-') {
            Some((a, b)) => (a.trim(), b.trim()),
            None => (item, item),
        };
        let a: u32 = a.parse().map_err(|_| bad())?;
        let b: u32 = b.parse().map_err(|_| bad())?;
        if a > b {
            return Err(bad());
        }
        total += u64::from(b - a) + 1;
        if total > MAX_CPULIST_LEN {
            return Err(bad());
        }
        out.extend(a..=b);
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn cpulist_roundtrip() {
        assert_eq!(format_cpulist(&[]), "");
        assert_eq!(format_cpulist(&[3, 0, 1, 2, 8, 11, 10, 10]), "0-3,8,10-11");
        assert_eq!(format_cpulist(&[u32::MAX, u32::MAX - 1]), format!("{}-{}", u32::MAX - 1, u32::MAX));
        assert_eq!(parse_cpulist("0-3,8,10-11").unwrap(), vec![0, 1, 2, 3, 8, 10, 11]);
        assert_eq!(parse_cpulist(" 5 ").unwrap(), vec![5]);
        assert_eq!(parse_cpulist("").unwrap(), Vec::<u32>::new());
        assert!(parse_cpulist("3-1").is_err());
        assert!(parse_cpulist("a").is_err());
        assert!(parse_cpulist("0-4294967295").is_err());
        assert_eq!(parse_cpulist("0-x").unwrap_err().to_string(), "invalid cpu list '0-x'");
    }

    #[test]
    fn affinity_parse_display() {
        for s in ["off", "on", "per-task"] {
            assert_eq!(s.parse::<CpuAffinity>().unwrap().to_string(), s);
            assert_eq!(s.parse::<GpuAffinity>().unwrap().to_string(), s);
        }
        let e = "pertask".parse::<CpuAffinity>().unwrap_err();
        assert!(e.to_string().contains("'pertask'"), "{e}");
        assert!(e.to_string().contains("cpu-affinity"), "{e}");
        assert_eq!(e.to_string(), "invalid cpu-affinity value 'pertask' (expected 'off', 'on' or 'per-task')");
        let e = "ON".parse::<GpuAffinity>().unwrap_err();
        assert!(e.to_string().contains("gpu-affinity") && e.to_string().contains("'ON'"));
        assert_eq!(CpuAffinity::default(), CpuAffinity::PerTask);
        assert_eq!(serde_json::to_string(&CpuAffinity::PerTask).unwrap(), "\"per-task\"");
        assert_eq!(serde_json::from_str::<GpuAffinity>("\"off\"").unwrap(), GpuAffinity::Off);
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn cpulist_roundtrip_prop(ids in prop::collection::vec(0u32..300, 0..50)) {
            let s = format_cpulist(&ids);
            let mut want = ids.clone();
            want.sort_unstable();
            want.dedup();
            prop_assert_eq!(parse_cpulist(&s).unwrap(), want);
        }

        #[test]
        fn affinity_parse_never_panics(s in ".{0,10}") {
            let _ = s.parse::<CpuAffinity>();
            let _ = s.parse::<GpuAffinity>();
            let _ = parse_cpulist(&s);
        }
    }
}
