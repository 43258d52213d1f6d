//! `vigil hostlist`: host lists (Flux RFC 29, `node[1-4,7]`) for scripts, in the manner of `flux hostlist`:
//! expand, compress, count, pick by index, and combine several lists (union, intersection, difference, symmetric
//! difference), without jq or hand-written brace expansion. Runs without an instance.

use crate::hostlist::Hostlist;
use crate::idset::IdSet;
use std::collections::BTreeSet;

/// Options of `vigil hostlist`.
#[derive(clap::Args, Debug, Default)]
pub struct HostlistArgs {
    /// Host lists (`node[1-4,7],login1`); `-`, or none, reads them from standard input (one or more per line,
    /// separated by white space). Several lists are appended in order, unless an operation below combines them.
    #[arg(value_name = "HOSTLIST")]
    pub sources: Vec<String>,
    /// Print the hosts one by one, separated by the delimiter, instead of compressed.
    #[arg(short = 'e', long)]
    pub expand: bool,
    /// Separator of expanded hosts (default: a space).
    #[arg(short = 'd', long, value_name = "STRING", default_value = " ")]
    pub delimiter: String,
    /// Print the number of hosts only.
    #[arg(short = 'c', long)]
    pub count: bool,
    /// Only the hosts at these 0-based indices (an idset: `0`, `2-3,7`); -1 is the last host.
    #[arg(short = 'n', long, value_name = "IDS", allow_hyphen_values = true)]
    pub nth: Option<String>,
    /// Only the first N hosts (with a negative N, the last -N).
    #[arg(short = 'L', long, value_name = "N", allow_hyphen_values = true)]
    pub limit: Option<i64>,
    /// Sort the hosts in natural order (`node2` before `node10`).
    #[arg(short = 'S', long)]
    pub sort: bool,
    /// Union of the lists: every host once, sorted.
    #[arg(short = 'u', long, conflicts_with_all = ["intersect", "minus", "xor"])]
    pub union: bool,
    /// Intersection of the lists: the hosts in every one, sorted.
    #[arg(short = 'i', long, conflicts_with_all = ["minus", "xor"])]
    pub intersect: bool,
    /// The first list without the hosts of the others, in its order.
    #[arg(short = 'm', long, conflicts_with = "xor")]
    pub minus: bool,
    /// The hosts in exactly one of the lists, sorted.
    #[arg(short = 'X', long)]
    pub xor: bool,
    /// Leave out these hosts (a host list) from the result, or, given an idset (`0`, `2-3`), the hosts at those
    /// 0-based indices (as `flux hostlist -x`).
    #[arg(short = 'x', long, value_name = "HOSTS|IDS")]
    pub exclude: Option<String>,
    /// Print nothing; exit 1 if the result is empty, 0 otherwise.
    #[arg(short = 'q', long)]
    pub quiet: bool,
}

/// `vigil hostlist`: prints the result; exit code 0, 1 on an error (or, with `--quiet`, an empty result).
pub(super) fn hostlist(a: HostlistArgs) -> i32 {
    let reads_stdin = a.sources.is_empty() || a.sources.iter().any(|s| s == "-");
    let stdin = if reads_stdin {
        let mut text = String::new();
        if let Err(e) = std::io::Read::read_to_string(&mut std::io::stdin(), &mut text) {
            return super::fail(format!("hostlist: cannot read standard input: {e}"));
        }
        text
    } else {
        String::new()
    };
    match evaluate(&a, &stdin) {
        Ok(hosts) if a.quiet => i32::from(hosts.is_empty()),
        Ok(hosts) => {
            println!("{}", render(&a, &hosts));
            0
        }
        Err(e) => super::fail(format!("hostlist: {e}")),
    }
}

/// The lists of `a.sources` (standard input's text for `-` or none), combined and filtered as `a` says.
fn evaluate(a: &HostlistArgs, stdin: &str) -> Result<Hostlist, String> {
    let mut lists = Vec::new();
    // Each list is bounded by the parser; so is their sum, checked as they come (memory follows the hosts held).
    let add = |lists: &mut Vec<Hostlist>, l: Hostlist| -> Result<(), String> {
        let total = lists.iter().map(Hostlist::len).sum::<usize>() + l.len();
        if total as u64 > crate::hostlist::MAX_HOSTS {
            return Err(format!("the lists hold more than the {} hosts allowed", crate::hostlist::MAX_HOSTS));
        }
        lists.push(l);
        Ok(())
    };
    let from_stdin = |lists: &mut Vec<Hostlist>| -> Result<(), String> {
        for word in stdin.split_whitespace() {
            add(lists, Hostlist::parse(word).map_err(|e| format!("standard input: {e}"))?)?;
        }
        Ok(())
    };
    if a.sources.is_empty() {
        from_stdin(&mut lists)?;
    }
    for s in &a.sources {
        if s == "-" {
            from_stdin(&mut lists)?;
        } else {
            add(&mut lists, Hostlist::parse(s).map_err(|e| e.to_string())?)?;
        }
    }
    let sets: Vec<BTreeSet<&str>> = lists.iter().map(|l| l.iter().collect()).collect();
    let mut hosts: Vec<String> = if a.union {
        sorted(sets.iter().flatten().copied().collect::<BTreeSet<_>>())
    } else if a.intersect {
        let mut it = sets.iter();
        let first = it.next().cloned().unwrap_or_default();
        sorted(it.fold(first, |acc, s| acc.intersection(s).copied().collect()))
    } else if a.minus {
        let rest: BTreeSet<&str> = sets.iter().skip(1).flatten().copied().collect();
        lists.first().map(|l| l.iter().filter(|h| !rest.contains(h)).map(str::to_string).collect()).unwrap_or_default()
    } else if a.xor {
        let mut seen = std::collections::BTreeMap::<&str, usize>::new();
        for s in &sets {
            for h in s {
                *seen.entry(h).or_default() += 1;
            }
        }
        sorted(seen.into_iter().filter(|(_, n)| *n == 1).map(|(h, _)| h).collect())
    } else {
        lists.iter().flat_map(|l| l.iter().map(str::to_string)).collect()
    };
    if let Some(x) = &a.exclude {
        if !x.is_empty() && x.chars().all(|c| c.is_ascii_digit() || c == ',' || c == '-') {
            let ids = IdSet::parse(x).map_err(|e| format!("--exclude: {e}"))?;
            hosts = hosts.into_iter().enumerate().filter(|(i, _)| !ids.contains(*i as u32)).map(|(_, h)| h).collect();
        } else {
            let x = Hostlist::parse(x).map_err(|e| format!("--exclude: {e}"))?;
            let x: BTreeSet<&str> = x.iter().collect();
            hosts.retain(|h| !x.contains(h.as_str()));
        }
    }
    if a.sort {
        hosts.sort_by_cached_key(|h| natural(h));
    }
    if let Some(n) = a.limit {
        let k = usize::try_from(n.unsigned_abs()).unwrap_or(usize::MAX).min(hosts.len());
        hosts = if n >= 0 { hosts[..k].to_vec() } else { hosts[hosts.len() - k..].to_vec() };
    }
    if let Some(ids) = &a.nth {
        hosts = nth(&hosts, ids)?;
    }
    Ok(hosts.into_iter().collect())
}

/// Hosts of a set in natural order.
fn sorted(set: BTreeSet<&str>) -> Vec<String> {
    let mut v: Vec<String> = set.into_iter().map(str::to_string).collect();
    v.sort_by_cached_key(|h| natural(h));
    v
}

/// The hosts at the indices `ids` (an idset, or `-1`, `-2`... from the end), in index order.
fn nth(hosts: &[String], ids: &str) -> Result<Vec<String>, String> {
    let idx: Vec<usize> = match ids.strip_prefix('-') {
        Some(back) => {
            let k: usize = back.parse().map_err(|_| format!("--nth: '{ids}' is not an idset or -N"))?;
            vec![hosts
                .len()
                .checked_sub(k)
                .filter(|_| k > 0)
                .ok_or_else(|| format!("--nth: -{k} is out of range: the list has {} host(s)", hosts.len()))?]
        }
        None => IdSet::parse(ids).map_err(|e| format!("--nth: {e}"))?.iter().map(|i| i as usize).collect(),
    };
    if idx.is_empty() {
        return Err("--nth: no index given".into());
    }
    idx.into_iter()
        .map(|i| {
            hosts
                .get(i)
                .cloned()
                .ok_or_else(|| format!("--nth: index {i} is out of range: the list has {} host(s)", hosts.len()))
        })
        .collect()
}

/// A host name as text and numbers, so that `node2` sorts before `node10` (`node02` and `node2` by their text).
fn natural(s: &str) -> Vec<(String, u128)> {
    let mut out = Vec::new();
    let mut rest = s;
    while !rest.is_empty() {
        let text_end = rest.find(|c: char| c.is_ascii_digit()).unwrap_or(rest.len());
        let (text, tail) = rest.split_at(text_end);
        let num_end = tail.find(|c: char| !c.is_ascii_digit()).unwrap_or(tail.len());
        let (digits, tail) = tail.split_at(num_end);
        out.push((text.to_string(), digits.parse().unwrap_or(u128::MAX)));
        out.push((digits.to_string(), 0));
        rest = tail;
    }
    out
}

/// The result as `a` asks: a count, the expanded hosts, or the compressed list.
fn render(a: &HostlistArgs, hosts: &Hostlist) -> String {
    if a.count {
        hosts.len().to_string()
    } else if a.expand {
        hosts.iter().collect::<Vec<_>>().join(&a.delimiter)
    } else {
        hosts.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        a: HostlistArgs,
    }

    /// `vigil hostlist ARGS...` with `stdin`: what it prints.
    fn hl(args: &[&str], stdin: &str) -> Result<String, String> {
        let a =
            Cli::try_parse_from(std::iter::once("hostlist").chain(args.iter().copied())).map_err(|e| e.to_string())?.a;
        evaluate(&a, stdin).map(|h| render(&a, &h))
    }

    #[test]
    fn expands_compresses_and_counts() {
        assert_eq!(hl(&["node[1-3,7]", "login1"], ""), Ok("node[1-3,7],login1".into()));
        assert_eq!(hl(&["-e", "node[1-3]"], ""), Ok("node1 node2 node3".into()));
        assert_eq!(hl(&["-e", "-d", ",", "node[08-10]"], ""), Ok("node08,node09,node10".into()));
        assert_eq!(hl(&["-c", "node[1-3]", "node[2-5]"], ""), Ok("7".into()), "appended, duplicates kept");
        assert_eq!(hl(&[], "node1 node2\nnode3\n"), Ok("node[1-3]".into()), "standard input");
        assert_eq!(hl(&["node[1-2]", "-"], "node3"), Ok("node[1-3]".into()));
    }

    #[test]
    fn combines_lists_as_sets() {
        assert_eq!(hl(&["-u", "node[3-5]", "node[1-4]"], ""), Ok("node[1-5]".into()));
        assert_eq!(hl(&["-i", "node[1-5]", "node[3-9]", "node[4-6]"], ""), Ok("node[4-5]".into()));
        assert_eq!(hl(&["-m", "node[1-8]", "node3", "node[6-7]"], ""), Ok("node[1-2,4-5,8]".into()));
        assert_eq!(hl(&["-X", "node[1-4]", "node[3-6]"], ""), Ok("node[1-2,5-6]".into()));
        assert_eq!(hl(&["-x", "node[2,4]", "node[1-5]"], ""), Ok("node[1,3,5]".into()));
        assert_eq!(hl(&["-x", "0,2", "node[1-5]"], ""), Ok("node[2,4-5]".into()), "an idset: indices");
        assert!(hl(&["-u", "-i", "a", "b"], "").is_err(), "one set operation at a time");
    }

    #[test]
    fn picks_by_index_and_sorts_naturally() {
        assert_eq!(hl(&["-n", "0", "node[4-7]"], ""), Ok("node4".into()));
        assert_eq!(hl(&["-n", "1-2", "node[4-7]"], ""), Ok("node[5-6]".into()));
        assert_eq!(hl(&["-n", "-1", "node[4-7]"], ""), Ok("node7".into()));
        assert_eq!(hl(&["-L", "2", "node[4-7]"], ""), Ok("node[4-5]".into()));
        assert_eq!(hl(&["-L", "-2", "node[4-7]"], ""), Ok("node[6-7]".into()));
        assert_eq!(hl(&["-S", "-e", "node10,node9,login2,node1"], ""), Ok("login2 node1 node9 node10".into()));
        let e = hl(&["-n", "9", "node[4-7]"], "").unwrap_err();
        assert!(e.contains("out of range") && e.contains("4 host"), "{e}");
        assert!(hl(&["-n", "-0", "a"], "").is_err());
        assert!(hl(&["-n", "", "a"], "").unwrap_err().contains("no index"));
    }

    #[test]
    fn bad_lists_are_refused_saying_where() {
        let e = hl(&["-c", "a[1-600000]", "b[1-600000]"], "").unwrap_err();
        assert!(e.contains("more than the 1048576 hosts allowed"), "{e}");
        let e = hl(&["node[1-"], "").unwrap_err();
        assert!(e.contains("node[1-"), "{e}");
        let e = hl(&["-x", "n[", "a"], "").unwrap_err();
        assert!(e.starts_with("--exclude"), "{e}");
        let e = hl(&[], "ok bad[").unwrap_err();
        assert!(e.starts_with("standard input"), "{e}");
    }
}
