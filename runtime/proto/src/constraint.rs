//! Job constraints: which nodes a job may run on, following Flux RFC 31 (`attributes.system.constraints`).
//!
//! A constraint is a JSON object whose keys are operators, every one of which must hold (an implicit `and`):
//!
//! - `"hostlist": ["node[1-4]", ...]`: the node's host name is in one of these host lists (RFC 29);
//! - `"ranks": ["0-3", ...]`: the broker rank is in one of these idsets (RFC 22);
//! - `"not": [C]`: `C` does not hold (RFC 31 gives `not` one operand, in an array);
//! - `"and": [C, ...]` / `"or": [C, ...]`: all / one of them hold.
//!
//! `"properties"` (node properties, e.g. `ssd`) is refused: no node of a Vigil instance has properties yet. The
//! command-line forms are Flux's and Slurm's: `--requires=host:HOSTLIST` or `rank:IDSET`, `-w/--nodelist=HOSTLIST`
//! (Slurm's; the same as `--requires=host:`), `--exclude=HOSTLIST|IDSET` (`not` of either).

use crate::hostlist::Hostlist;
use crate::idset::IdSet;
use serde_json::{json, Value};
use std::collections::BTreeSet;

/// Deepest nesting of `not`/`and`/`or` accepted: a jobspec is user input, and a constraint is walked once per
/// node at every scheduling pass.
pub const MAX_DEPTH: usize = 16;
/// Most terms (operators and operands, all levels) in one constraint.
pub const MAX_TERMS: usize = 1024;

/// A parsed constraint (see the module documentation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Constraint {
    /// The node's host name is one of these.
    Hosts(BTreeSet<String>),
    /// The broker rank is one of these.
    Ranks(IdSet),
    /// The operand does not hold.
    Not(Box<Constraint>),
    /// Every operand holds (true when empty).
    And(Vec<Constraint>),
    /// One operand holds (false when empty).
    Or(Vec<Constraint>),
}

/// A refused constraint: the jobspec path of the offending field and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConstraintError {
    /// E.g. `attributes.system.constraints.not[0].hostlist[1]`.
    pub path: String,
    /// What is wrong.
    pub message: String,
}

impl Constraint {
    /// Parse `v`, found at jobspec `path` (errors name the field under it).
    ///
    /// # Errors
    /// [`ConstraintError`] for a value that is not an object, an unknown operator, `properties`, an operand of the
    /// wrong shape, a bad host list or idset, `not` without exactly one operand, or more than [`MAX_DEPTH`]
    /// levels or [`MAX_TERMS`] terms.
    pub fn parse(v: &Value, path: &str) -> Result<Constraint, ConstraintError> {
        let mut terms = 0;
        parse_at(v, path, 0, &mut terms)
    }

    /// Whether a node (broker `rank`, host name `host`) satisfies the constraint.
    pub fn matches(&self, rank: u32, host: &str) -> bool {
        match self {
            Constraint::Hosts(h) => h.contains(host),
            Constraint::Ranks(r) => r.contains(rank),
            Constraint::Not(c) => !c.matches(rank, host),
            Constraint::And(cs) => cs.iter().all(|c| c.matches(rank, host)),
            Constraint::Or(cs) => cs.iter().any(|c| c.matches(rank, host)),
        }
    }

    /// Every host name and rank the constraint names, whatever the operator around it: a submission naming one
    /// the instance does not have is most likely a typo, which rank 0 warns of.
    pub fn named(&self) -> (BTreeSet<String>, IdSet) {
        let (mut hosts, mut ranks) = (BTreeSet::new(), IdSet::new());
        let mut stack = vec![self];
        while let Some(c) = stack.pop() {
            match c {
                Constraint::Hosts(h) => hosts.extend(h.iter().cloned()),
                Constraint::Ranks(r) => ranks = ranks.union(r),
                Constraint::Not(c) => stack.push(c),
                Constraint::And(cs) | Constraint::Or(cs) => stack.extend(cs.iter()),
            }
        }
        (hosts, ranks)
    }

    /// The RFC 31 JSON form (what [`Constraint::parse`] reads back).
    pub fn to_value(&self) -> Value {
        match self {
            Constraint::Hosts(h) => json!({"hostlist": [h.iter().cloned().collect::<Hostlist>().to_string()]}),
            Constraint::Ranks(r) => json!({"ranks": [r.to_string()]}),
            Constraint::Not(c) => json!({"not": [c.to_value()]}),
            Constraint::And(cs) => json!({"and": cs.iter().map(Constraint::to_value).collect::<Vec<_>>()}),
            Constraint::Or(cs) => json!({"or": cs.iter().map(Constraint::to_value).collect::<Vec<_>>()}),
        }
    }

    /// The constraint of the command-line options: each `--requires` (`host:HOSTLIST` or `rank:IDSET`), `-w
    /// HOSTLIST` and `--exclude HOSTLIST|IDSET` (an idset when it parses as one: `3`, `0-2,7`), all of which must
    /// hold; `None` when none is given.
    ///
    /// # Errors
    /// A message naming the option for a bad host list or idset, or a `--requires` that is not `host:` or `rank:`.
    pub fn from_options(
        requires: &[String],
        nodelist: Option<&str>,
        exclude: Option<&str>,
    ) -> Result<Option<Constraint>, String> {
        // `--exclude node[`, `--requires=host:node[`: the option as it was typed.
        let typed = |opt: &str, s: &str| if opt.ends_with(':') { format!("{opt}{s}") } else { format!("{opt} {s}") };
        let hosts = |s: &str, opt: &str| -> Result<Constraint, String> {
            let h = Hostlist::parse(s).map_err(|e| format!("{}: {e}", typed(opt, s)))?;
            if h.is_empty() {
                return Err(format!("{}: an empty host list matches no node", typed(opt, s)));
            }
            Ok(Constraint::Hosts(h.iter().map(str::to_string).collect()))
        };
        let ranks = |s: &str, opt: &str| -> Result<Constraint, String> {
            let r = IdSet::parse(s).map_err(|e| format!("{}: {e}", typed(opt, s)))?;
            if r.is_empty() {
                return Err(format!("{}: an empty idset matches no rank", typed(opt, s)));
            }
            Ok(Constraint::Ranks(r))
        };
        let mut all = Vec::new();
        for r in requires {
            match r.split_once(':') {
                Some(("host", h)) => all.push(hosts(h, "--requires=host:")?),
                Some(("rank", i)) => all.push(ranks(i, "--requires=rank:")?),
                _ => return Err(format!("--requires={r}: expected host:HOSTLIST or rank:IDSET")),
            }
        }
        if let Some(w) = nodelist {
            all.push(hosts(w, "--nodelist")?);
        }
        if let Some(x) = exclude {
            let looks_like_ranks = !x.is_empty() && x.chars().all(|c| c.is_ascii_digit() || c == ',' || c == '-');
            let c = if looks_like_ranks { ranks(x, "--exclude")? } else { hosts(x, "--exclude")? };
            all.push(Constraint::Not(Box::new(c)));
        }
        Ok(match all.len() {
            0 => None,
            1 => all.pop(),
            _ => Some(Constraint::And(all)),
        })
    }
}

fn err(path: &str, message: impl Into<String>) -> ConstraintError {
    ConstraintError { path: path.to_string(), message: message.into() }
}

fn parse_at(v: &Value, path: &str, depth: usize, terms: &mut usize) -> Result<Constraint, ConstraintError> {
    if depth > MAX_DEPTH {
        return Err(err(path, format!("nested more than {MAX_DEPTH} levels deep")));
    }
    let obj =
        v.as_object().ok_or_else(|| err(path, "must be a mapping of operators (hostlist, ranks, not, and, or)"))?;
    let mut all = Vec::new();
    for (op, operand) in obj {
        *terms += 1;
        if *terms > MAX_TERMS {
            return Err(err(path, format!("more than {MAX_TERMS} terms")));
        }
        let p = format!("{path}.{op}");
        let list = operand.as_array().ok_or_else(|| err(&p, "must be an array"))?;
        let strings = || -> Result<Vec<&str>, ConstraintError> {
            list.iter()
                .enumerate()
                .map(|(i, s)| s.as_str().ok_or_else(|| err(&format!("{p}[{i}]"), "must be a string")))
                .collect()
        };
        let sub = |terms: &mut usize| -> Result<Vec<Constraint>, ConstraintError> {
            list.iter().enumerate().map(|(i, c)| parse_at(c, &format!("{p}[{i}]"), depth + 1, terms)).collect()
        };
        all.push(match op.as_str() {
            "hostlist" => {
                let mut hosts = BTreeSet::new();
                for (i, s) in strings()?.into_iter().enumerate() {
                    let h = Hostlist::parse(s).map_err(|e| err(&format!("{p}[{i}]"), e.to_string()))?;
                    hosts.extend(h.iter().map(str::to_string));
                }
                Constraint::Hosts(hosts)
            }
            "ranks" => {
                let mut ranks = IdSet::new();
                for (i, s) in strings()?.into_iter().enumerate() {
                    let r = IdSet::parse(s).map_err(|e| err(&format!("{p}[{i}]"), e.to_string()))?;
                    ranks = ranks.union(&r);
                }
                Constraint::Ranks(ranks)
            }
            "not" => match sub(terms)?.as_mut_slice() {
                [one] => Constraint::Not(Box::new(one.clone())),
                cs => return Err(err(&p, format!("must hold exactly one constraint, got {}", cs.len()))),
            },
            "and" => Constraint::And(sub(terms)?),
            "or" => Constraint::Or(sub(terms)?),
            "properties" => return Err(err(&p, "node properties are not supported: no node of this instance has any")),
            other => {
                return Err(err(&p, format!("unknown operator '{other}' (expected hostlist, ranks, not, and, or)")))
            }
        });
    }
    Ok(if all.len() == 1 { all.remove(0) } else { Constraint::And(all) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(v: Value) -> Result<Constraint, ConstraintError> {
        Constraint::parse(&v, "attributes.system.constraints")
    }

    #[test]
    fn operators_match_as_rfc_31_says() {
        let k = c(json!({"hostlist": ["node[1-3]"], "not": [{"ranks": ["2"]}]})).unwrap();
        let m: Vec<bool> =
            [(1, "node1"), (2, "node2"), (3, "node3"), (4, "node4")].iter().map(|(r, h)| k.matches(*r, h)).collect();
        assert_eq!(m, [true, false, true, false], "hostlist and not ranks 2");
        let or = c(json!({"or": [{"ranks": ["0"]}, {"hostlist": ["login1"]}]})).unwrap();
        assert!(or.matches(0, "x") && or.matches(5, "login1") && !or.matches(5, "x"));
        assert!(c(json!({"and": []})).unwrap().matches(9, "any"));
        assert!(!c(json!({"or": []})).unwrap().matches(9, "any"));
    }

    #[test]
    fn the_json_form_reads_back() {
        let k = c(json!({"and": [{"hostlist": ["n[1-2]", "m1"]}, {"not": [{"ranks": ["0-1,5"]}]}]})).unwrap();
        assert_eq!(c(k.to_value()), Ok(k));
    }

    #[test]
    fn bad_constraints_are_refused_naming_the_field() {
        for (v, path, what) in [
            (json!("node1"), "attributes.system.constraints", "mapping"),
            (json!({"hostlist": "node1"}), "attributes.system.constraints.hostlist", "array"),
            (json!({"hostlist": [1]}), "attributes.system.constraints.hostlist[0]", "string"),
            (json!({"hostlist": ["n[1-"]}), "attributes.system.constraints.hostlist[0]", "n[1-"),
            (json!({"ranks": ["x"]}), "attributes.system.constraints.ranks[0]", ""),
            (json!({"not": [{"ranks": ["1"]}, {"ranks": ["2"]}]}), "attributes.system.constraints.not", "exactly one"),
            (json!({"or": [{"bogus": []}]}), "attributes.system.constraints.or[0].bogus", "unknown operator"),
            (json!({"properties": ["ssd"]}), "attributes.system.constraints.properties", "not supported"),
        ] {
            let e = c(v.clone()).expect_err(&v.to_string());
            assert_eq!(e.path, path, "{v}: {e:?}");
            assert!(e.message.contains(what), "{v}: {e:?}");
        }
        let mut deep = json!({"ranks": ["0"]});
        for _ in 0..=MAX_DEPTH {
            deep = json!({"not": [deep]});
        }
        assert!(c(deep).unwrap_err().message.contains("levels"));
    }

    #[test]
    fn command_line_options_make_one_constraint() {
        assert_eq!(Constraint::from_options(&[], None, None), Ok(None));
        let k = Constraint::from_options(&["host:node[1-4]".into()], None, Some("node2")).unwrap().unwrap();
        assert!(k.matches(0, "node1") && !k.matches(1, "node2") && !k.matches(2, "node5"));
        let x = Constraint::from_options(&[], Some("node[1-2]"), Some("1")).unwrap().unwrap();
        assert!(x.matches(0, "node1") && !x.matches(1, "node2"), "--exclude of an idset names ranks");
        let r = Constraint::from_options(&["rank:0-1".into()], None, None).unwrap().unwrap();
        assert!(r.matches(1, "h") && !r.matches(2, "h"));
        for bad in [&["gpu:1".to_string()][..], &["host:n[".to_string()][..]] {
            assert!(Constraint::from_options(bad, None, None).is_err(), "{bad:?}");
        }
        assert!(Constraint::from_options(&[], Some(""), None).unwrap_err().contains("empty"));
        assert!(Constraint::from_options(&["rank:".into()], None, None).unwrap_err().contains("empty idset"));
        let e = Constraint::from_options(&["host:n[".into()], None, None).unwrap_err();
        assert!(e.starts_with("--requires=host:n[: "), "{e}");
    }

    /// The host names and ranks a constraint names, to tell a user which of them the instance does not have.
    #[test]
    fn named_nodes_are_listed() {
        let k = Constraint::from_options(&["rank:3".into()], Some("a[1-2]"), Some("b")).unwrap().unwrap();
        let (h, r) = k.named();
        assert_eq!(h.into_iter().collect::<Vec<_>>(), ["a1", "a2", "b"]);
        assert_eq!(r.to_string(), "3");
    }
}
