//! Resource set R, version 1, following Flux RFC 20 ("Resource Set
//! Specification Version 1").
//!
//! R describes the resources allocated to a job (or owned by an instance):
//!
//! ```json
//! {"version": 1,
//!  "execution": {
//!    "R_lite": [{"rank": "0-3", "children": {"core": "0-95", "gpu": "0-3"}}],
//!    "nodelist": ["node[0-3]"],
//!    "starttime": 0, "expiration": 0}}
//! ```
//!
//! - `R_lite` entries map an RFC 22 idset of broker ranks to the RFC 22
//!   idsets of `core` and (optionally) `gpu` ids present on *each* of them.
//! - `nodelist` is a list of RFC 29 hostlists; concatenated, they give one
//!   hostname per rank in ascending rank order.
//! - `properties` (optional) maps a property name to the idset of ranks
//!   carrying it.
//! - `starttime`/`expiration` are seconds since the Unix epoch (0 = unset).
//! - The optional top-level `scheduling` and `attributes` objects are kept
//!   opaque.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};
use thiserror::Error;

use crate::hostlist::Hostlist;
use crate::idset::IdSet;

/// Upper bound on the total number of core+GPU ids [`Rv1::to_ranks`] will
/// materialise (2^26), guarding against memory exhaustion on hostile input.
pub const MAX_EXPANDED_IDS: u64 = 1 << 26;

/// Upper bound on the sum of the sizes of all idsets in one R document
/// accepted by [`Rv1::parse`]/[`Rv1::from_value`] (2^24), so a small but
/// hostile document cannot make the parser allocate gigabytes.
pub const MAX_R_IDS: u64 = 1 << 24;

/// Errors from parsing, validating or expanding R (RFC 20).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RError {
    /// The text was not valid JSON.
    #[error("invalid JSON: {0}")]
    Json(String),
    /// A field was missing, of the wrong type, or had an invalid value.
    /// `path` names it, e.g. `execution.R_lite[0].children.core`.
    #[error("{path}: {message}")]
    Invalid {
        /// Dotted/indexed path of the offending field (`(root)` for the document).
        path: String,
        /// What is wrong with it.
        message: String,
    },
    /// `nodelist` expands to a different number of hosts than there are ranks.
    #[error("execution.nodelist: {nhosts} hosts for {nranks} ranks")]
    NodelistMismatch {
        /// Number of hostnames in the expanded nodelist.
        nhosts: usize,
        /// Number of ranks in `R_lite`.
        nranks: usize,
    },
    /// A rank appears in more than one `R_lite` entry.
    #[error("execution.R_lite: rank {0} appears in more than one entry")]
    DuplicateRank(u32),
    /// Expansion would exceed [`MAX_EXPANDED_IDS`] core/GPU ids, or the
    /// document holds more than [`MAX_R_IDS`] ids in total.
    #[error("R too large (resource id limit exceeded)")]
    TooLarge,
}

fn invalid(path: impl Into<String>, message: impl Into<String>) -> RError {
    RError::Invalid { path: path.into(), message: message.into() }
}

/// An RFC 20 R version 1 document.
///
/// Serializes to the RFC 20 JSON shape; deserializes (and [`Rv1::parse`]s)
/// with full validation.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Rv1 {
    /// Format version; must be 1.
    pub version: u32,
    /// The `execution` section.
    pub execution: Execution,
    /// Opaque scheduler-specific data (`scheduling`), omitted when `None`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scheduling: Option<Value>,
    /// Opaque `attributes` object, omitted when `None`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attributes: Option<Value>,
}

/// The RFC 20 `execution` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Execution {
    /// `R_lite`: rank idsets and the resources on each of those ranks.
    #[serde(rename = "R_lite")]
    pub r_lite: Vec<RLiteEntry>,
    /// RFC 29 hostlists; concatenated, one hostname per rank in rank order.
    /// May be empty when hostnames are unknown.
    #[serde(default)]
    pub nodelist: Vec<String>,
    /// Property name to idset of ranks having it; omitted when empty.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub properties: BTreeMap<String, IdSet>,
    /// Start time, seconds since the Unix epoch (0 = unset).
    #[serde(default)]
    pub starttime: f64,
    /// Expiration time, seconds since the Unix epoch (0 = unset).
    #[serde(default)]
    pub expiration: f64,
}

/// One `R_lite` entry: every rank in `rank` has exactly `children`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RLiteEntry {
    /// RFC 22 idset of broker ranks.
    pub rank: IdSet,
    /// Resources present on each of those ranks.
    pub children: Children,
}

/// Per-rank resources of an `R_lite` entry (RFC 20 `children`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub struct Children {
    /// RFC 22 idset of core ids (logical, per node).
    pub core: IdSet,
    /// RFC 22 idset of GPU ids; omitted from JSON when `None` or empty.
    #[serde(default, skip_serializing_if = "gpu_absent")]
    pub gpu: Option<IdSet>,
}

fn gpu_absent(g: &Option<IdSet>) -> bool {
    !matches!(g, Some(s) if !s.is_empty())
}

impl Children {
    fn gpus(&self) -> IdSet {
        self.gpu.clone().unwrap_or_default()
    }
}

/// Resources of a single rank: the expanded form of R.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RankResources {
    /// Broker rank.
    pub rank: u32,
    /// Hostname of the rank (empty when R has no nodelist).
    pub hostname: String,
    /// Core ids on this rank.
    pub cores: IdSet,
    /// GPU ids on this rank (may be empty).
    pub gpus: IdSet,
}

// ---------------------------------------------------------------------------
// Validating parser (serde_json::Value -> Rv1) with field paths.

/// Parse an idset field, charging its size to `budget` (see [`MAX_R_IDS`]).
fn get_idset(v: &Value, path: &str, budget: &mut u64) -> Result<IdSet, RError> {
    let set = match v {
        Value::String(s) => IdSet::parse(s).map_err(|e| invalid(path, format!("invalid idset: {e}")))?,
        _ => return Err(invalid(path, "must be an idset string")),
    };
    *budget = budget.saturating_add(set.len() as u64);
    if *budget > MAX_R_IDS {
        return Err(RError::TooLarge);
    }
    Ok(set)
}

fn get_time(obj: &Map<String, Value>, key: &str) -> Result<f64, RError> {
    match obj.get(key) {
        None => Ok(0.0),
        Some(Value::Number(n)) => match n.as_f64() {
            Some(t) if t.is_finite() && t >= 0.0 => Ok(t),
            _ => Err(invalid(format!("execution.{key}"), "must be a number >= 0")),
        },
        Some(_) => Err(invalid(format!("execution.{key}"), "must be a number >= 0")),
    }
}

fn check_keys(obj: &Map<String, Value>, allowed: &[&str], path: &str) -> Result<(), RError> {
    for key in obj.keys() {
        if !allowed.contains(&key.as_str()) {
            let p = if path.is_empty() { key.clone() } else { format!("{path}.{key}") };
            return Err(invalid(p, "unknown key"));
        }
    }
    Ok(())
}

fn parse_entry(v: &Value, i: usize, budget: &mut u64) -> Result<RLiteEntry, RError> {
    let path = format!("execution.R_lite[{i}]");
    let Value::Object(obj) = v else {
        return Err(invalid(path, "must be an object"));
    };
    check_keys(obj, &["rank", "children"], &path)?;
    let rank_path = format!("{path}.rank");
    let rank = get_idset(obj.get("rank").ok_or_else(|| invalid(&rank_path, "required"))?, &rank_path, budget)?;
    if rank.is_empty() {
        return Err(invalid(rank_path, "must be a non-empty idset"));
    }
    let cpath = format!("{path}.children");
    let Some(Value::Object(children)) = obj.get("children") else {
        return Err(invalid(cpath, "required object"));
    };
    for key in children.keys() {
        if key != "core" && key != "gpu" {
            return Err(invalid(format!("{cpath}.{key}"), "unsupported resource type (expected core or gpu)"));
        }
    }
    let core_path = format!("{cpath}.core");
    let core = get_idset(children.get("core").ok_or_else(|| invalid(&core_path, "required"))?, &core_path, budget)?;
    let gpu = match children.get("gpu") {
        None => None,
        Some(g) => Some(get_idset(g, &format!("{cpath}.gpu"), budget)?).filter(|s| !s.is_empty()),
    };
    Ok(RLiteEntry { rank, children: Children { core, gpu } })
}

/// Concatenated expansion of nodelist hostlists; errors name the element.
fn expand_nodelist(nodelist: &[String]) -> Result<Vec<String>, RError> {
    let mut hosts = Vec::new();
    for (i, s) in nodelist.iter().enumerate() {
        let hl = Hostlist::parse(s)
            .map_err(|e| invalid(format!("execution.nodelist[{i}]"), format!("invalid hostlist: {e}")))?;
        hosts.extend(hl.into_vec());
        if hosts.len() as u64 > crate::hostlist::MAX_HOSTS {
            return Err(invalid("execution.nodelist", "too many hosts"));
        }
    }
    Ok(hosts)
}

impl Rv1 {
    /// Parse and validate R version 1 JSON text.
    ///
    /// # Errors
    /// [`RError::Json`] for malformed JSON; otherwise as [`Rv1::from_value`].
    pub fn parse(text: &str) -> Result<Rv1, RError> {
        let v: Value = serde_json::from_str(text).map_err(|e| RError::Json(e.to_string()))?;
        Rv1::from_value(&v)
    }

    /// Validate a JSON value as R version 1.
    ///
    /// Checks: document is an object with only `version`, `execution`,
    /// `scheduling`, `attributes`; `version` is 1; `execution.R_lite` is an
    /// array of `{rank, children: {core, gpu?}}` with valid non-empty,
    /// non-overlapping rank idsets; `nodelist` is an array of valid
    /// hostlists whose total length equals the rank count (when non-empty);
    /// `properties` maps names to idsets of existing ranks; `starttime` and
    /// `expiration` are numbers `>= 0` (default 0).
    ///
    /// # Errors
    /// [`RError::Invalid`] naming the field (e.g. `version: must be 1, got 2`,
    /// `execution.R_lite[0].children.core: invalid idset: ...`),
    /// [`RError::DuplicateRank`], or [`RError::NodelistMismatch`].
    pub fn from_value(v: &Value) -> Result<Rv1, RError> {
        let Value::Object(root) = v else {
            return Err(invalid("(root)", "R must be a JSON object"));
        };
        check_keys(root, &["version", "execution", "scheduling", "attributes"], "")?;
        match root.get("version") {
            None => return Err(invalid("version", "required")),
            Some(Value::Number(n)) if n.as_u64() == Some(1) => {}
            Some(other) => return Err(invalid("version", format!("must be 1, got {other}"))),
        }
        let Some(Value::Object(exec)) = root.get("execution") else {
            return Err(invalid("execution", "required object"));
        };
        check_keys(exec, &["R_lite", "nodelist", "properties", "starttime", "expiration"], "execution")?;
        let Some(Value::Array(entries)) = exec.get("R_lite") else {
            return Err(invalid("execution.R_lite", "required array"));
        };
        let mut budget = 0u64;
        let r_lite =
            entries.iter().enumerate().map(|(i, e)| parse_entry(e, i, &mut budget)).collect::<Result<Vec<_>, _>>()?;
        let mut all = IdSet::new();
        for (i, entry) in r_lite.iter().enumerate() {
            for r in entry.rank.iter() {
                if !all.insert(r) {
                    return Err(invalid(
                        format!("execution.R_lite[{i}].rank"),
                        format!("rank {r} appears in an earlier entry"),
                    ));
                }
            }
        }
        let nranks = all.len();
        let nodelist = match exec.get("nodelist") {
            None => Vec::new(),
            Some(Value::Array(items)) => items
                .iter()
                .enumerate()
                .map(|(i, item)| match item {
                    Value::String(s) => Ok(s.clone()),
                    _ => Err(invalid(format!("execution.nodelist[{i}]"), "must be a hostlist string")),
                })
                .collect::<Result<Vec<_>, _>>()?,
            Some(_) => return Err(invalid("execution.nodelist", "must be an array of hostlist strings")),
        };
        let nhosts = expand_nodelist(&nodelist)?.len();
        if nhosts != 0 && nhosts != nranks {
            return Err(RError::NodelistMismatch { nhosts, nranks });
        }
        let mut properties = BTreeMap::new();
        match exec.get("properties") {
            None => {}
            Some(Value::Object(props)) => {
                for (name, value) in props {
                    let path = format!("execution.properties.{name}");
                    let set = get_idset(value, &path, &mut budget)?;
                    if !set.is_subset(&all) {
                        return Err(invalid(path, "names ranks not present in R_lite"));
                    }
                    properties.insert(name.clone(), set);
                }
            }
            Some(_) => return Err(invalid("execution.properties", "must be an object")),
        }
        Ok(Rv1 {
            version: 1,
            execution: Execution {
                r_lite,
                nodelist,
                properties,
                starttime: get_time(exec, "starttime")?,
                expiration: get_time(exec, "expiration")?,
            },
            scheduling: root.get("scheduling").cloned(),
            attributes: root.get("attributes").cloned(),
        })
    }

    /// The hosts of `nodelist`, concatenated in rank order (one per rank; empty when R has no nodelist): what
    /// `VIGIL_JOB_NODELIST` prints compressed.
    ///
    /// # Errors
    /// [`RError::Invalid`] naming the `nodelist` element that is not a host list.
    pub fn hosts(&self) -> Result<Hostlist, RError> {
        expand_nodelist(&self.execution.nodelist).map(Hostlist::from_iter)
    }

    /// Encode as compact RFC 20 JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_value(self).map(|v| v.to_string()).unwrap_or_default()
    }

    /// Build R from per-rank resources.
    ///
    /// Entries are sorted by rank (for a rank listed twice, the first entry
    /// wins). Ranks with identical core/GPU sets are merged into one
    /// `R_lite` entry whose `rank` idset lists them; entries are ordered by
    /// lowest rank. `nodelist` is a single compressed RFC 29 hostlist of the
    /// hostnames in rank order, or empty if every hostname is empty.
    /// `starttime`/`expiration` are seconds since the epoch.
    pub fn from_ranks(ranks: &[RankResources], starttime: f64, expiration: f64) -> Rv1 {
        let mut sorted: Vec<&RankResources> = ranks.iter().collect();
        sorted.sort_by_key(|r| r.rank);
        sorted.dedup_by_key(|r| r.rank);
        let mut r_lite: Vec<RLiteEntry> = Vec::new();
        let mut index: HashMap<Children, usize> = HashMap::new();
        for r in &sorted {
            let children = Children { core: r.cores.clone(), gpu: Some(r.gpus.clone()).filter(|g| !g.is_empty()) };
            match index.get(&children) {
                Some(&i) => {
                    r_lite[i].rank.insert(r.rank);
                }
                None => {
                    index.insert(children.clone(), r_lite.len());
                    r_lite.push(RLiteEntry { rank: IdSet::from_iter([r.rank]), children });
                }
            }
        }
        let nodelist = if sorted.iter().all(|r| r.hostname.is_empty()) {
            Vec::new()
        } else {
            vec![sorted.iter().map(|r| r.hostname.as_str()).collect::<Hostlist>().to_string()]
        };
        Rv1 {
            version: 1,
            execution: Execution { r_lite, nodelist, properties: BTreeMap::new(), starttime, expiration },
            scheduling: None,
            attributes: None,
        }
    }

    /// Expand to one [`RankResources`] per rank, in ascending rank order.
    ///
    /// Hostnames come from `nodelist` (empty strings if it is empty).
    ///
    /// # Errors
    /// [`RError::Invalid`] if `version != 1` or a nodelist entry is not a valid
    /// hostlist; [`RError::DuplicateRank`] if ranks overlap;
    /// [`RError::NodelistMismatch`] if the nodelist length differs from the
    /// number of ranks; [`RError::TooLarge`] beyond [`MAX_EXPANDED_IDS`].
    pub fn to_ranks(&self) -> Result<Vec<RankResources>, RError> {
        if self.version != 1 {
            return Err(invalid("version", format!("must be 1, got {}", self.version)));
        }
        let mut total: u64 = 0;
        for e in &self.execution.r_lite {
            let per_rank = (e.children.core.len() + e.children.gpus().len()) as u64;
            total = total.saturating_add(per_rank.saturating_mul(e.rank.len() as u64));
        }
        if total > MAX_EXPANDED_IDS {
            return Err(RError::TooLarge);
        }
        let mut pairs: Vec<(u32, &Children)> =
            self.execution.r_lite.iter().flat_map(|e| e.rank.iter().map(move |r| (r, &e.children))).collect();
        pairs.sort_by_key(|p| p.0);
        if let Some(w) = pairs.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(RError::DuplicateRank(w[0].0));
        }
        let hosts = expand_nodelist(&self.execution.nodelist)?;
        if !hosts.is_empty() && hosts.len() != pairs.len() {
            return Err(RError::NodelistMismatch { nhosts: hosts.len(), nranks: pairs.len() });
        }
        Ok(pairs
            .into_iter()
            .enumerate()
            .map(|(i, (rank, children))| RankResources {
                rank,
                hostname: hosts.get(i).cloned().unwrap_or_default(),
                cores: children.core.clone(),
                gpus: children.gpus(),
            })
            .collect())
    }

    /// All ranks named in `R_lite`.
    pub fn ranks(&self) -> IdSet {
        let mut all = IdSet::new();
        for e in &self.execution.r_lite {
            all.extend(e.rank.iter());
        }
        all
    }

    /// Hostnames in rank order if the nodelist is valid and matches the rank
    /// count, else `None`.
    fn hosts_by_rank(&self) -> Option<Vec<String>> {
        let hosts = expand_nodelist(&self.execution.nodelist).ok()?;
        (hosts.len() == self.ranks().len()).then_some(hosts)
    }

    /// The subset of R on the ranks in `keep` (ranks keep their numbers).
    ///
    /// `R_lite` entries are intersected with `keep` (empty ones dropped),
    /// the nodelist is filtered accordingly (dropped if it was inconsistent
    /// with the rank count), and properties are intersected. Times and
    /// opaque sections are preserved.
    pub fn restrict(&self, keep: &IdSet) -> Rv1 {
        let ranks = self.ranks();
        let kept = ranks.intersection(keep);
        let nodelist = match self.hosts_by_rank() {
            Some(hosts) if !kept.is_empty() => {
                let hl: Hostlist = ranks.iter().zip(hosts).filter(|(r, _)| kept.contains(*r)).map(|(_, h)| h).collect();
                vec![hl.to_string()]
            }
            _ => Vec::new(),
        };
        let r_lite = self
            .execution
            .r_lite
            .iter()
            .filter_map(|e| {
                let rank = e.rank.intersection(keep);
                (!rank.is_empty()).then(|| RLiteEntry { rank, children: e.children.clone() })
            })
            .collect();
        let properties = self
            .execution
            .properties
            .iter()
            .map(|(k, v)| (k.clone(), v.intersection(&kept)))
            .filter(|(_, v)| !v.is_empty())
            .collect();
        Rv1 {
            version: self.version,
            execution: Execution {
                r_lite,
                nodelist,
                properties,
                starttime: self.execution.starttime,
                expiration: self.execution.expiration,
            },
            scheduling: self.scheduling.clone(),
            attributes: self.attributes.clone(),
        }
    }

    /// Renumber ranks densely from 0 in ascending order (as a nested
    /// instance sees its allocation). Resource sets, nodelist order, times
    /// and properties are carried over.
    pub fn renumber(&self) -> Rv1 {
        let map: HashMap<u32, u32> = self.ranks().iter().zip(0u32..).collect();
        let remap = |s: &IdSet| -> IdSet { s.iter().filter_map(|r| map.get(&r).copied()).collect() };
        let mut out = self.clone();
        for e in &mut out.execution.r_lite {
            e.rank = remap(&e.rank);
        }
        for v in out.execution.properties.values_mut() {
            *v = remap(v);
        }
        out
    }

    /// Total number of cores (sum over entries of ranks x cores per rank).
    pub fn ncores(&self) -> u64 {
        self.execution.r_lite.iter().map(|e| e.rank.len() as u64 * e.children.core.len() as u64).sum()
    }

    /// Total number of GPUs (sum over entries of ranks x GPUs per rank).
    pub fn ngpus(&self) -> u64 {
        self.execution
            .r_lite
            .iter()
            .map(|e| e.rank.len() as u64 * e.children.gpu.as_ref().map_or(0, |g| g.len()) as u64)
            .sum()
    }
}

impl<'de> Deserialize<'de> for Rv1 {
    /// Deserialize with the same validation as [`Rv1::from_value`].
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let v = Value::deserialize(deserializer)?;
        Rv1::from_value(&v).map_err(serde::de::Error::custom)
    }
}

impl std::str::FromStr for Rv1 {
    type Err = RError;
    /// Same as [`Rv1::parse`].
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Rv1::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    const RFC20_EXAMPLE: &str = r#"{"version":1,"execution":{"R_lite":[{"rank":"0-3","children":{"core":"0-95","gpu":"0-3"}}],"nodelist":["node[0-3]"],"starttime":0,"expiration":0}}"#;

    fn ids(s: &str) -> IdSet {
        IdSet::parse(s).expect("valid idset")
    }

    fn rr(rank: u32, host: &str, cores: &str, gpus: &str) -> RankResources {
        RankResources { rank, hostname: host.into(), cores: ids(cores), gpus: ids(gpus) }
    }

    #[test]
    fn parses_rfc20_example() {
        let r = Rv1::parse(RFC20_EXAMPLE).expect("valid R");
        assert_eq!(r.version, 1);
        assert_eq!(r.ranks(), ids("0-3"));
        assert_eq!(r.ncores(), 4 * 96);
        assert_eq!(r.ngpus(), 16);
        assert_eq!(r.hosts().map(|h| h.to_string()), Ok("node[0-3]".to_string()));
        let ranks = r.to_ranks().expect("expandable");
        assert_eq!(ranks.len(), 4);
        assert_eq!(ranks[2], rr(2, "node2", "0-95", "0-3"));
        // Round trip through from_ranks and JSON.
        let back = Rv1::from_ranks(&ranks, 0.0, 0.0);
        assert_eq!(back, r);
        assert_eq!(Rv1::parse(&back.to_json()), Ok(r.clone()));
        let v: Value = serde_json::from_str(&r.to_json()).expect("json");
        assert_eq!(v["execution"]["R_lite"][0]["children"], json!({"core": "0-95", "gpu": "0-3"}));
        assert_eq!(v["execution"]["nodelist"], json!(["node[0-3]"]));
        // serde Deserialize validates too.
        let via_serde: Result<Rv1, _> = serde_json::from_str(RFC20_EXAMPLE);
        assert_eq!(via_serde.ok(), Some(r));
    }

    #[test]
    fn from_ranks_merges_identical_children() {
        let ranks = vec![
            rr(3, "fluke3", "0-3", ""),
            rr(0, "fluke0", "0-3", ""),
            rr(1, "fluke1", "0-7", "0-1"),
            rr(2, "fluke2", "0-3", ""),
        ];
        let r = Rv1::from_ranks(&ranks, 10.0, 20.0);
        let v: Value = serde_json::from_str(&r.to_json()).expect("json");
        assert_eq!(
            v,
            json!({"version": 1, "execution": {
                "R_lite": [
                    {"rank": "0,2-3", "children": {"core": "0-3"}},
                    {"rank": "1", "children": {"core": "0-7", "gpu": "0-1"}}
                ],
                "nodelist": ["fluke[0-3]"],
                "starttime": 10.0, "expiration": 20.0}})
        );
        assert_eq!(r.ncores(), 3 * 4 + 8);
        assert_eq!(r.ngpus(), 2);
        let expanded = r.to_ranks().expect("expand");
        assert_eq!(expanded[1], rr(1, "fluke1", "0-7", "0-1"));
        assert_eq!(expanded[3], rr(3, "fluke3", "0-3", ""));
    }

    #[test]
    fn restrict_and_renumber() {
        let ranks: Vec<_> = (0..6).map(|i| rr(i, &format!("n{i}"), "0-1", "")).collect();
        let mut r = Rv1::from_ranks(&ranks, 0.0, 0.0);
        r.execution.properties.insert("big".into(), ids("1,4"));
        let sub = r.restrict(&ids("2,4-5,9"));
        assert_eq!(sub.ranks(), ids("2,4-5"));
        assert_eq!(sub.execution.nodelist, vec!["n[2,4-5]".to_string()]);
        assert_eq!(sub.execution.properties.get("big"), Some(&ids("4")));
        assert_eq!(sub.ncores(), 6);
        let renum = sub.renumber();
        assert_eq!(renum.ranks(), ids("0-2"));
        assert_eq!(renum.execution.properties.get("big"), Some(&ids("1")));
        let ex = renum.to_ranks().expect("expand");
        assert_eq!(ex[1].rank, 1);
        assert_eq!(ex[1].hostname, "n4");
        assert_eq!(Rv1::parse(&renum.to_json()), Ok(renum.clone()));
        let empty = r.restrict(&IdSet::new());
        assert!(empty.execution.r_lite.is_empty() && empty.execution.nodelist.is_empty());
    }

    #[test]
    fn no_nodelist_gives_empty_hostnames() {
        let r = Rv1::parse(r#"{"version":1,"execution":{"R_lite":[{"rank":"0","children":{"core":"0"}}]}}"#)
            .expect("valid");
        let ex = r.to_ranks().expect("expand");
        assert_eq!(ex, vec![rr(0, "", "0", "")]);
        assert_eq!(Rv1::from_ranks(&ex, 0.0, 0.0), r);
    }

    #[test]
    fn rejections_name_the_field() {
        let base = json!({"version":1,"execution":{"R_lite":[{"rank":"0-3","children":{"core":"0-95"}}],"nodelist":["node[0-3]"],"starttime":0,"expiration":0}});
        type Edit = Box<dyn Fn(&mut Value)>;
        let cases: Vec<(Edit, &str)> = vec![
            (Box::new(|v| v["version"] = json!(2)), "version: must be 1, got 2"),
            (
                Box::new(|v| {
                    v.as_object_mut().map(|o| o.remove("version"));
                }),
                "version: required",
            ),
            (Box::new(|v| v["bogus"] = json!(1)), "bogus: unknown key"),
            (Box::new(|v| v["execution"] = json!([])), "execution: required object"),
            (Box::new(|v| v["execution"]["R_lite"] = json!({})), "execution.R_lite: required array"),
            (Box::new(|v| v["execution"]["extra"] = json!(1)), "execution.extra: unknown key"),
            (
                Box::new(|v| v["execution"]["R_lite"][0]["rank"] = json!(0)),
                "execution.R_lite[0].rank: must be an idset string",
            ),
            (
                Box::new(|v| v["execution"]["R_lite"][0]["rank"] = json!("")),
                "execution.R_lite[0].rank: must be a non-empty idset",
            ),
            (
                Box::new(|v| v["execution"]["R_lite"][0]["rank"] = json!("3-0")),
                "execution.R_lite[0].rank: invalid idset",
            ),
            (
                Box::new(|v| v["execution"]["R_lite"][0]["children"]["core"] = json!("01")),
                "execution.R_lite[0].children.core: invalid idset",
            ),
            (
                Box::new(|v| v["execution"]["R_lite"][0]["children"]["gpu"] = json!(["0"])),
                "execution.R_lite[0].children.gpu: must be an idset string",
            ),
            (
                Box::new(|v| v["execution"]["R_lite"][0]["children"]["fpga"] = json!("0")),
                "execution.R_lite[0].children.fpga: unsupported resource type",
            ),
            (
                Box::new(|v| {
                    v["execution"]["R_lite"][0]["children"].as_object_mut().map(|o| o.remove("core"));
                }),
                "execution.R_lite[0].children.core: required",
            ),
            (
                Box::new(|v| {
                    v["execution"]["R_lite"][0].as_object_mut().map(|o| o.remove("children"));
                }),
                "execution.R_lite[0].children: required object",
            ),
            (Box::new(|v| v["execution"]["R_lite"][0]["x"] = json!(1)), "execution.R_lite[0].x: unknown key"),
            (
                Box::new(|v| {
                    v["execution"]["R_lite"] =
                        json!([{"rank":"0-3","children":{"core":"0"}},{"rank":"3","children":{"core":"0"}}])
                }),
                "execution.R_lite[1].rank: rank 3 appears in an earlier entry",
            ),
            (
                Box::new(|v| v["execution"]["nodelist"] = json!(["node[0-2]"])),
                "execution.nodelist: 3 hosts for 4 ranks",
            ),
            (Box::new(|v| v["execution"]["nodelist"] = json!(["node[0-"])), "execution.nodelist[0]: invalid hostlist"),
            (Box::new(|v| v["execution"]["nodelist"] = json!([1])), "execution.nodelist[0]: must be a hostlist string"),
            (Box::new(|v| v["execution"]["nodelist"] = json!("node[0-3]")), "execution.nodelist: must be an array"),
            (Box::new(|v| v["execution"]["starttime"] = json!(-1)), "execution.starttime: must be a number >= 0"),
            (Box::new(|v| v["execution"]["expiration"] = json!("x")), "execution.expiration: must be a number >= 0"),
            (
                Box::new(|v| v["execution"]["properties"] = json!({"foo": "7"})),
                "execution.properties.foo: names ranks not present",
            ),
            (Box::new(|v| v["execution"]["properties"] = json!([])), "execution.properties: must be an object"),
        ];
        for (mutate, want) in cases {
            let mut v = base.clone();
            mutate(&mut v);
            let err = Rv1::from_value(&v).expect_err(want).to_string();
            assert!(err.starts_with(want), "want {want:?}, got {err:?}");
        }
        assert!(matches!(Rv1::parse("{"), Err(RError::Json(_))));
        assert_eq!(Rv1::parse("[]").map_err(|e| e.to_string()), Err("(root): R must be a JSON object".to_string()));
    }

    #[test]
    fn to_ranks_checks_consistency() {
        let mut r = Rv1::parse(RFC20_EXAMPLE).expect("valid");
        r.execution.nodelist = vec!["node[0-4]".into()];
        assert_eq!(r.to_ranks(), Err(RError::NodelistMismatch { nhosts: 5, nranks: 4 }));
        r.execution.nodelist = vec!["node[0-1]".into(), "x,y".into()];
        assert_eq!(r.to_ranks().map(|v| v[3].hostname.clone()), Ok("y".to_string()));
        r.version = 2;
        assert!(r.to_ranks().is_err());
        let mut d = Rv1::parse(RFC20_EXAMPLE).expect("valid");
        d.execution.nodelist.clear();
        d.execution.r_lite.push(d.execution.r_lite[0].clone());
        assert_eq!(d.to_ranks(), Err(RError::DuplicateRank(0)));
    }

    proptest! {
        #[test]
        fn parse_never_panics(s in "\\PC*") {
            let _ = Rv1::parse(&s);
        }

        #[test]
        fn parse_never_panics_on_mutated_r(i in 0usize..RFC20_EXAMPLE.len(), c in "[\\[\\]{}\",:0-9a-z-]") {
            let mut s = RFC20_EXAMPLE.to_string();
            if s.is_char_boundary(i) {
                s.insert_str(i, &c);
            }
            if let Ok(r) = Rv1::parse(&s) {
                let _ = r.to_ranks();
                let _ = r.renumber().restrict(&IdSet::from_iter([0, 2]));
            }
        }

        #[test]
        fn from_ranks_round_trips(spec in proptest::collection::btree_map(0u32..64, (0u32..3, 0u32..2), 0..20)) {
            let ranks: Vec<RankResources> = spec
                .iter()
                .map(|(&rank, &(c, g))| RankResources {
                    rank,
                    hostname: format!("node{rank}"),
                    cores: (0..=c).collect(),
                    gpus: (0..g).collect(),
                })
                .collect();
            let r = Rv1::from_ranks(&ranks, 1.5, 2.5);
            prop_assert_eq!(r.to_ranks(), Ok(ranks.clone()));
            prop_assert_eq!(Rv1::parse(&r.to_json()), Ok(r.clone()));
            let renum = r.renumber().to_ranks();
            prop_assert!(renum.is_ok());
            let renum = renum.unwrap_or_default();
            let want: Vec<u32> = (0..ranks.len() as u32).collect();
            prop_assert_eq!(renum.iter().map(|x| x.rank).collect::<Vec<_>>(), want);
        }
    }
}
