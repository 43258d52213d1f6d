//! Compressed host lists, following Flux RFC 29 ("Hostlist Format").
//!
//! A hostlist is a comma-separated list of hostnames in which a run of
//! hostnames differing only in one number may be written with a bracketed
//! RFC 22-style range list: `"fluke[6-13],node[01-03,7],foo"`. Text may follow
//! the bracket (`"rack[1-2]-a"` gives `rack1-a,rack2-a`).
//!
//! Zero padding: every range element takes its width from its own low bound.
//! When the low bound has a leading zero (`"01"`), all numbers of that range
//! are zero-padded to that many digits (`node[08-10]` gives `node08,node09,
//! node10`); otherwise numbers are printed without padding (`node[7-10]`
//! gives `node7 .. node10`). This is what flux-core's decoder does. RFC 29's
//! text says instead that the leading zeros of the *first* element apply to
//! the whole bracket (`[005,4]` would be `005,004`); the two readings agree on
//! everything [`Hostlist`] prints, because the encoder puts in one bracket only
//! numbers written with the first one's padding (`foo08,foo9` stays as it is;
//! `docs/conformance.md`).
//!
//! Empty hostlist expressions are empty lists (RFC 29), so empty terms add no
//! host: `",1,2,3"`, `"a,,b"` and `"a,"` are `1,2,3`, `a,b` and `a`, as in
//! flux-core. Host names are printable ASCII other than whitespace, `,`, `[`
//! and `]` (RFC 29).
//!
//! [`Hostlist`] keeps the hosts in the given order (duplicates included).

use std::fmt;

use thiserror::Error;

/// Largest number of hostnames [`Hostlist::parse`] will expand from one
/// string (2^20), so that e.g. `"n[0-99999999999]"` fails with
/// [`HostlistError::TooLarge`] instead of exhausting memory.
pub const MAX_HOSTS: u64 = 1 << 20;

/// Largest total size in bytes of the hostnames [`Hostlist::parse`] will
/// expand from one string (64 MiB), which bounds inputs such as
/// `"n[000...0-999999]"` with very wide zero padding.
pub const MAX_EXPANDED_BYTES: u64 = 64 << 20;

/// Errors returned by [`Hostlist::parse`] (RFC 29).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum HostlistError {
    /// A `[` without matching `]`, a `]` without `[`, nested brackets, or
    /// more than one bracket expression in one hostname.
    #[error("hostlist {input:?}: unbalanced, nested or repeated brackets")]
    Brackets {
        /// The full input string.
        input: String,
    },
    /// A bracket expression contained something other than non-negative
    /// decimal integers and `lo-hi` ranges (or was empty).
    #[error("hostlist {input:?}: invalid range {range:?}")]
    InvalidRange {
        /// The full input string.
        input: String,
        /// The offending range element.
        range: String,
    },
    /// A range had its high bound below its low bound (e.g. `"[5-3]"`).
    #[error("hostlist {input:?}: reversed range {range:?}")]
    ReversedRange {
        /// The full input string.
        input: String,
        /// The offending range element.
        range: String,
    },
    /// A number in a range did not fit in `u64`.
    #[error("hostlist {input:?}: number too large in {range:?}")]
    Overflow {
        /// The full input string.
        input: String,
        /// The offending range element.
        range: String,
    },
    /// A hostname contained whitespace, a control character or a character
    /// outside ASCII (RFC 29: printable, non-whitespace ASCII).
    #[error("hostlist {input:?}: invalid character {ch:?} in hostname")]
    InvalidChar {
        /// The full input string.
        input: String,
        /// The offending character.
        ch: char,
    },
    /// The list would expand to more than [`MAX_HOSTS`] hostnames or more
    /// than [`MAX_EXPANDED_BYTES`] bytes of hostnames.
    #[error("hostlist {input:?}: too large (more than {max} hosts or {bytes} bytes)", max = MAX_HOSTS, bytes = MAX_EXPANDED_BYTES)]
    TooLarge {
        /// The full input string.
        input: String,
    },
}

/// An ordered list of hostnames with RFC 29 compressed string encoding.
///
/// `Display` (and serde serialization) produce the compressed form, e.g.
/// `["node0","node1","node2","node4"]` prints as `"node[0-2,4]"`; parsing that
/// string gives back the same list. Hostnames containing `,`, `[`, `]`,
/// whitespace or characters outside ASCII, or empty hostnames, cannot be
/// represented and will not round-trip.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Hostlist(Vec<String>);

fn clip(s: &str) -> String {
    if s.chars().count() > 64 {
        let mut out: String = s.chars().take(64).collect();
        out.push_str("...");
        out
    } else {
        s.to_string()
    }
}

/// Zero-padding width implied by a number's digit string: its length if it
/// has a leading zero (and more than one digit), else 0 (no padding).
fn pad_width(digits: &str) -> usize {
    if digits.len() > 1 && digits.starts_with('0') {
        digits.len()
    } else {
        0
    }
}

fn format_num(n: u64, width: usize) -> String {
    format!("{n:0width$}")
}

impl Hostlist {
    /// Create an empty hostlist.
    pub fn new() -> Self {
        Hostlist(Vec::new())
    }

    /// Expand an RFC 29 hostlist string, e.g. `"fluke[6-13],node[01-03,7],foo"`.
    ///
    /// The empty string is the empty list. Each comma-separated term is a
    /// literal hostname or `prefix[ranges]suffix` with one bracket expression;
    /// an empty term is an empty list (RFC 29), so `",a,,b,"` is `a,b`.
    ///
    /// # Errors
    /// [`HostlistError`] for bad brackets, malformed/reversed/overflowing
    /// ranges, whitespace, control or non-ASCII characters, or more than
    /// [`MAX_HOSTS`] hosts.
    pub fn parse(s: &str) -> Result<Hostlist, HostlistError> {
        let mut hosts = Vec::new();
        if s.is_empty() {
            return Ok(Hostlist(hosts));
        }
        if let Some(ch) = s.chars().find(|c| !c.is_ascii_graphic()) {
            return Err(HostlistError::InvalidChar { input: clip(s), ch });
        }
        let mut total = Budget::default();
        for term in split_terms(s).ok_or_else(|| HostlistError::Brackets { input: clip(s) })? {
            expand_term(s, term, &mut hosts, &mut total)?;
        }
        Ok(Hostlist(hosts))
    }

    /// Number of hostnames.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the list is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Hostname at index `i` (0-based), or `None` if out of range.
    pub fn get(&self, i: usize) -> Option<&str> {
        self.0.get(i).map(String::as_str)
    }

    /// Iterate over the hostnames in order.
    pub fn iter(&self) -> impl Iterator<Item = &str> + '_ {
        self.0.iter().map(String::as_str)
    }

    /// Index of the first occurrence of `host`, or `None`.
    pub fn position(&self, host: &str) -> Option<usize> {
        self.0.iter().position(|h| h == host)
    }

    /// Append a hostname (not validated; see the type-level note).
    pub fn push(&mut self, host: impl Into<String>) {
        self.0.push(host.into())
    }

    /// The expanded hostnames as a slice.
    pub fn as_slice(&self) -> &[String] {
        &self.0
    }

    /// Consume the list, returning the expanded hostnames.
    pub fn into_vec(self) -> Vec<String> {
        self.0
    }
}

/// Split on commas that are outside brackets; `None` if brackets are
/// unbalanced or nested.
fn split_terms(s: &str) -> Option<Vec<&str>> {
    let mut terms = Vec::new();
    let mut depth = 0u32;
    let mut start = 0usize;
    for (i, c) in s.char_indices() {
        match c {
            '[' => {
                if depth > 0 {
                    return None;
                }
                depth = 1;
            }
            ']' => {
                if depth == 0 {
                    return None;
                }
                depth = 0;
            }
            ',' if depth == 0 => {
                terms.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return None;
    }
    terms.push(&s[start..]);
    Some(terms)
}

/// Running totals checked against [`MAX_HOSTS`] and [`MAX_EXPANDED_BYTES`].
#[derive(Default)]
struct Budget {
    hosts: u64,
    bytes: u64,
}

impl Budget {
    /// Charge `count` hosts of up to `len` bytes each; `false` if over budget.
    fn charge(&mut self, count: u64, len: usize) -> bool {
        self.hosts = self.hosts.saturating_add(count);
        self.bytes = self.bytes.saturating_add(count.saturating_mul(len as u64));
        self.hosts <= MAX_HOSTS && self.bytes <= MAX_EXPANDED_BYTES
    }
}

fn expand_term(input: &str, term: &str, hosts: &mut Vec<String>, total: &mut Budget) -> Result<(), HostlistError> {
    if term.is_empty() {
        // RFC 29: an empty hostlist expression is an empty list.
        return Ok(());
    }
    let Some(open) = term.find('[') else {
        if !total.charge(1, term.len()) {
            return Err(HostlistError::TooLarge { input: clip(input) });
        }
        hosts.push(term.to_string());
        return Ok(());
    };
    let prefix = &term[..open];
    let rest = &term[open + 1..];
    let Some(close) = rest.find(']') else {
        return Err(HostlistError::Brackets { input: clip(input) });
    };
    let ranges = &rest[..close];
    let suffix = &rest[close + 1..];
    if suffix.contains('[') || suffix.contains(']') {
        return Err(HostlistError::Brackets { input: clip(input) });
    }
    if ranges.is_empty() {
        return Err(HostlistError::InvalidRange { input: clip(input), range: String::new() });
    }
    for element in ranges.split(',') {
        let bad = || HostlistError::InvalidRange { input: clip(input), range: clip(element) };
        let (lo_s, hi_s) = element.split_once('-').unwrap_or((element, element));
        for part in [lo_s, hi_s] {
            if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
        }
        let num = |d: &str| {
            d.parse::<u64>().map_err(|_| HostlistError::Overflow { input: clip(input), range: clip(element) })
        };
        let (lo, hi) = (num(lo_s)?, num(hi_s)?);
        if hi < lo {
            return Err(HostlistError::ReversedRange { input: clip(input), range: clip(element) });
        }
        let count = (hi - lo).saturating_add(1);
        let width = pad_width(lo_s);
        let len = prefix.len() + suffix.len() + width.max(hi_s.len());
        if !total.charge(count, len) {
            return Err(HostlistError::TooLarge { input: clip(input) });
        }
        for n in lo..=hi {
            hosts.push(format!("{prefix}{}{suffix}", format_num(n, width)));
        }
    }
    Ok(())
}

/// A hostname split around its last run of ASCII digits.
struct Split<'a> {
    prefix: &'a str,
    digits: &'a str,
    value: u64,
    suffix: &'a str,
}

fn split_host(host: &str) -> Option<Split<'_>> {
    let bytes = host.as_bytes();
    let end = bytes.iter().rposition(|b| b.is_ascii_digit())? + 1;
    let start = bytes[..end].iter().rposition(|b| !b.is_ascii_digit()).map_or(0, |i| i + 1);
    let digits = &host[start..end];
    let value = digits.parse::<u64>().ok()?;
    Some(Split { prefix: &host[..start], digits, value, suffix: &host[end..] })
}

/// One range element inside a bracket while compressing.
struct Run<'a> {
    lo_digits: &'a str,
    hi: u64,
    width: usize,
}

impl fmt::Display for Hostlist {
    /// RFC 29 compressed form. Consecutive hosts sharing prefix and suffix, and
    /// whose numbers are written with the first one's zero padding, are
    /// bracketed; within a bracket, ascending consecutive numbers with
    /// compatible padding become `lo-hi` ranges. A single host is printed as-is.
    /// (Keeping one padding per bracket makes the output read the same under
    /// flux-core's per-element padding and RFC 29's first-element rule.)
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        let mut i = 0;
        while i < self.0.len() {
            if !first {
                f.write_str(",")?;
            }
            first = false;
            let host = &self.0[i];
            let Some(head) = split_host(host) else {
                f.write_str(host)?;
                i += 1;
                continue;
            };
            let head_width = pad_width(head.digits);
            let mut runs = vec![Run { lo_digits: head.digits, hi: head.value, width: head_width }];
            let mut j = i + 1;
            while let Some(next) = self.0.get(j).and_then(|h| split_host(h)) {
                if next.prefix != head.prefix
                    || next.suffix != head.suffix
                    || format_num(next.value, head_width) != next.digits
                {
                    break;
                }
                let extends = runs.last().is_some_and(|run| {
                    run.hi.checked_add(1) == Some(next.value) && format_num(next.value, run.width) == next.digits
                });
                match runs.last_mut() {
                    Some(run) if extends => run.hi = next.value,
                    _ => runs.push(Run { lo_digits: next.digits, hi: next.value, width: pad_width(next.digits) }),
                }
                j += 1;
            }
            if j == i + 1 {
                f.write_str(host)?;
            } else {
                write!(f, "{}[", head.prefix)?;
                for (k, run) in runs.iter().enumerate() {
                    if k > 0 {
                        f.write_str(",")?;
                    }
                    f.write_str(run.lo_digits)?;
                    if format_num(run.hi, run.width) != run.lo_digits {
                        write!(f, "-{}", format_num(run.hi, run.width))?;
                    }
                }
                write!(f, "]{}", head.suffix)?;
            }
            i = j;
        }
        Ok(())
    }
}

impl<S: Into<String>> FromIterator<S> for Hostlist {
    fn from_iter<I: IntoIterator<Item = S>>(iter: I) -> Self {
        Hostlist(iter.into_iter().map(Into::into).collect())
    }
}

string_form!(Hostlist, HostlistError);

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn expand(s: &str) -> Vec<String> {
        Hostlist::parse(s).expect("valid hostlist").into_vec()
    }

    fn hl(hosts: &[&str]) -> Hostlist {
        hosts.iter().copied().collect()
    }

    #[test]
    fn expands_rfc29_examples() {
        assert_eq!(
            expand("fluke[6-13],node[01-03,7],foo"),
            [
                "fluke6", "fluke7", "fluke8", "fluke9", "fluke10", "fluke11", "fluke12", "fluke13", "node01", "node02",
                "node03", "node7", "foo"
            ]
        );
        assert_eq!(expand("foo[1-3]"), ["foo1", "foo2", "foo3"]);
        assert_eq!(expand("foo[08-10]"), ["foo08", "foo09", "foo10"]);
        assert_eq!(expand("foo[7-10]"), ["foo7", "foo8", "foo9", "foo10"]);
        assert_eq!(expand("foo[001-002]"), ["foo001", "foo002"]);
        assert_eq!(expand("rack[1-2]-a"), ["rack1-a", "rack2-a"]);
        assert_eq!(expand("[1-2]"), ["1", "2"]);
        assert_eq!(expand("foo"), ["foo"]);
        assert_eq!(expand(""), Vec::<String>::new());
        assert_eq!(expand("a,a"), ["a", "a"]);
        assert_eq!(expand("n[3,1]"), ["n3", "n1"]);
    }

    #[test]
    fn rfc29_test_vectors() {
        // The test vectors of RFC 29, written out: input, then the expanded list.
        let vectors: [(&str, &[&str]); 9] = [
            ("", &[]),
            ("foox,fooy,fooz", &["foox", "fooy", "fooz"]),
            ("[1-3,5-6]", &["1", "2", "3", "5", "6"]),
            ("foo[1-5]", &["foo1", "foo2", "foo3", "foo4", "foo5"]),
            ("foo[0-4]-eth2", &["foo0-eth2", "foo1-eth2", "foo2-eth2", "foo3-eth2", "foo4-eth2"]),
            ("foo1,foo1,foo1", &["foo1", "foo1", "foo1"]),
            ("[00-02]", &["00", "01", "02"]),
            ("[00-2]", &["00", "01", "02"]),
            ("foo[1,1,2,1]", &["foo1", "foo1", "foo2", "foo1"]),
        ];
        for (input, want) in vectors {
            assert_eq!(expand(input), want, "{input:?}");
            // What we print for it reads back as the same list.
            let list = Hostlist::parse(input).expect(input);
            assert_eq!(Hostlist::parse(&list.to_string()), Ok(list), "{input:?}");
        }
    }

    #[test]
    fn empty_terms_are_empty_lists() {
        // RFC 29: an empty hostlist expression represents an empty list (flux-core skips them alike).
        assert_eq!(expand(",1,2,3"), ["1", "2", "3"]);
        assert_eq!(expand(",1,2,3,"), ["1", "2", "3"]);
        assert_eq!(expand("a,,b"), ["a", "b"]);
        assert_eq!(expand(",n[1-2],,"), ["n1", "n2"]);
        assert_eq!(expand(","), Vec::<String>::new());
        assert_eq!(expand(",,,"), Vec::<String>::new());
        // Inside brackets an empty element is not an id.
        assert!(Hostlist::parse("n[1,,2]").is_err());
    }

    #[test]
    fn compresses() {
        assert_eq!(hl(&["node0", "node1", "node2", "node4"]).to_string(), "node[0-2,4]");
        assert_eq!(hl(&["node01", "node02", "node03", "node7"]).to_string(), "node[01-03],node7");
        assert_eq!(hl(&["foo08", "foo09", "foo10"]).to_string(), "foo[08-10]");
        assert_eq!(hl(&["foo9", "foo10"]).to_string(), "foo[9-10]");
        // One padding per bracket: `foo[08,9]` would be foo08,foo09 under RFC 29's first-element rule.
        assert_eq!(hl(&["foo08", "foo9"]).to_string(), "foo08,foo9");
        assert_eq!(hl(&["foo08", "foo09", "foo5", "foo6"]).to_string(), "foo[08-09],foo[5-6]");
        assert_eq!(hl(&["foo08", "foo10", "foo11"]).to_string(), "foo[08,10-11]");
        assert_eq!(hl(&["rack1-a", "rack2-a", "rack3-b"]).to_string(), "rack[1-2]-a,rack3-b");
        assert_eq!(hl(&["foo", "bar1"]).to_string(), "foo,bar1");
        assert_eq!(hl(&["n1", "x", "n2"]).to_string(), "n1,x,n2");
        assert_eq!(hl(&["n01"]).to_string(), "n01");
        assert_eq!(hl(&[]).to_string(), "");
    }

    #[test]
    fn accessors() {
        let h = Hostlist::parse("node[0-3]").expect("valid");
        assert_eq!(h.len(), 4);
        assert!(!h.is_empty());
        assert_eq!(h.get(2), Some("node2"));
        assert_eq!(h.get(4), None);
        assert_eq!(h.position("node3"), Some(3));
        assert_eq!(h.position("node9"), None);
        assert_eq!(h.iter().last(), Some("node3"));
    }

    #[test]
    fn rejects_bad_input() {
        let cases = [
            ("n[1-3", "brackets"),
            ("n1-3]", "brackets"),
            ("n[[1]]", "brackets"),
            ("n[1]x[2]", "brackets"),
            ("n[]", "invalid range"),
            ("n[a-b]", "invalid range"),
            ("n[1-]", "invalid range"),
            ("n[1,,2]", "invalid range"),
            ("n[5-3]", "reversed"),
            ("n[99999999999999999999]", "too large"),
            ("n[0-99999999999]", "too large"),
            (&format!("n[{}0-999999]", "0".repeat(200)), "too large"),
            ("a b", "invalid character"),
            ("nöde1", "invalid character"),
            ("a\u{7f}", "invalid character"),
        ];
        for (input, want) in cases {
            let err = Hostlist::parse(input).expect_err(input).to_string();
            assert!(err.contains(want), "{input:?}: {err}");
        }
    }

    #[test]
    fn serde_as_string() {
        let h = hl(&["n1", "n2"]);
        assert_eq!(serde_json::to_string(&h).ok().as_deref(), Some("\"n[1-2]\""));
        let back: Result<Hostlist, _> = serde_json::from_str("\"n[1-2]\"");
        assert_eq!(back.ok(), Some(h));
        assert!(serde_json::from_str::<Hostlist>("\"n[\"").is_err());
    }

    fn host_strategy() -> impl Strategy<Value = String> {
        let prefix = prop_oneof![Just(""), Just("node"), Just("n"), Just("rack-"), Just("a1b")];
        let suffix = prop_oneof![Just(""), Just(""), Just("-a"), Just(".x")];
        let number = prop_oneof![
            (0u64..40).prop_map(|n| n.to_string()),
            (0u64..40, 1usize..4).prop_map(|(n, w)| format!("{n:0w$}")),
            Just(String::new()),
        ];
        (prefix, number, suffix).prop_filter_map("non-empty", |(p, n, s)| {
            let h = format!("{p}{n}{s}");
            (!h.is_empty()).then_some(h)
        })
    }

    /// RFC 29's own reading of a bracket (the first element's leading zeros apply to every number in it), for
    /// well-formed input only: the encoder's output must expand the same under it.
    fn expand_first_element_padding(s: &str) -> Vec<String> {
        let mut out = Vec::new();
        for term in split_terms(s).unwrap_or_default().into_iter().filter(|t| !t.is_empty()) {
            let Some((prefix, rest)) = term.split_once('[') else {
                out.push(term.to_string());
                continue;
            };
            let (ranges, suffix) = rest.split_once(']').unwrap_or((rest, ""));
            let first = ranges.split([',', '-']).next().unwrap_or("");
            let width = pad_width(first);
            for element in ranges.split(',') {
                let (lo, hi) = element.split_once('-').unwrap_or((element, element));
                let (lo, hi) = (lo.parse::<u64>().unwrap_or(0), hi.parse::<u64>().unwrap_or(0));
                out.extend((lo..=hi).map(|n| format!("{prefix}{}{suffix}", format_num(n, width))));
            }
        }
        out
    }

    proptest! {
        #[test]
        fn parse_never_panics(s in "\\PC*") {
            let _ = Hostlist::parse(&s);
        }

        #[test]
        fn decode_then_encode_is_canonical(s in "[a-c0-9\\[\\],-]{0,24}") {
            // Whatever is accepted prints in a form that reads back as the same list and prints the same again.
            if let Ok(list) = Hostlist::parse(&s) {
                let text = list.to_string();
                prop_assert_eq!(Hostlist::parse(&text), Ok(list.clone()), "printed as {}", text);
                prop_assert_eq!(Hostlist::parse(&text).map(|l| l.to_string()), Ok(text.clone()));
            }
        }

        #[test]
        fn encoding_reads_the_same_under_rfc29_padding(hosts in proptest::collection::vec(host_strategy(), 0..40)) {
            let list: Hostlist = hosts.iter().cloned().collect();
            let text = list.to_string();
            prop_assert_eq!(expand_first_element_padding(&text), hosts, "printed as {}", text);
        }

        #[test]
        fn parse_never_panics_hostlist_alphabet(s in "[a-c0-9\\[\\],-]{0,24}") {
            let _ = Hostlist::parse(&s);
        }

        #[test]
        fn compress_round_trips(hosts in proptest::collection::vec(host_strategy(), 0..40)) {
            let list: Hostlist = hosts.iter().cloned().collect();
            let text = list.to_string();
            prop_assert_eq!(Hostlist::parse(&text), Ok(list), "compressed: {}", text);
        }

        #[test]
        fn expand_compress_expand(hosts in proptest::collection::vec(host_strategy(), 1..20)) {
            // Build a valid hostlist string, expand, compress, expand again.
            let text = hosts.join(",");
            let first = Hostlist::parse(&text);
            prop_assert!(first.is_ok());
            let first = first.unwrap_or_default();
            let again = Hostlist::parse(&first.to_string());
            prop_assert_eq!(again, Ok(first));
        }
    }
}
