//! Integer id sets, following Flux RFC 22 ("Idset String Representation").
//!
//! An idset is a set of non-negative integers (here `u32`, e.g. broker ranks,
//! core or GPU ids) written as a comma-separated list of single ids and
//! inclusive ranges, e.g. `"0-3,5,42"`, optionally enclosed in brackets
//! (`"[0-3]"`). The empty string (or `"[]"`) is the empty set.
//!
//! RFC 22 requires the ids of an idset string to be unique and in ascending
//! order, and [`IdSet::parse`] refuses a string whose ids are not (`"3,2"`,
//! `"2,2"`, `"1-3,2"`: [`IdSetError::OutOfOrder`]), as flux-core's
//! `idset_decode` does. No command normalises such input either: `vigil
//! resource drain 3,2` is refused with that error, as `flux resource drain 3,2`
//! is (write `2-3`).
//!
//! [`IdSet`] always prints in the canonical RFC 22 form: ascending, with runs
//! of two or more consecutive ids compressed into `lo-hi` ranges and no
//! brackets, e.g. `"0-3,5"`.
//!
//! Where this parser and flux-core differ, both within RFC 22 (see
//! `docs/conformance.md`): a one-id range such as `"5-5"` is accepted here
//! (RFC 22 does not forbid it; flux-core refuses it), and an empty element
//! (`"1,,2"`, `",1"`) is refused here (it is not an id; flux-core skips it).

use std::collections::BTreeSet;
use std::fmt;

use thiserror::Error;

/// Largest number of ids [`IdSet::parse`] will expand from one string
/// (2^20 = 1,048,576), so that input such as `"0-4294967295"` is rejected
/// with [`IdSetError::TooLarge`] instead of exhausting memory.
pub const MAX_IDS: u64 = 1 << 20;

/// Errors returned by [`IdSet::parse`] (RFC 22).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum IdSetError {
    /// A comma-separated element was empty (e.g. `"1,,2"` or a trailing comma).
    #[error("idset {input:?}: empty element")]
    EmptyElement {
        /// The full input string.
        input: String,
    },
    /// An element was not a decimal integer or `lo-hi` range.
    #[error("idset {input:?}: invalid element {element:?}")]
    Invalid {
        /// The full input string.
        input: String,
        /// The offending element.
        element: String,
    },
    /// An integer had a leading zero (RFC 22 forbids e.g. `"01"`).
    #[error("idset {input:?}: leading zero in {element:?}")]
    LeadingZero {
        /// The full input string.
        input: String,
        /// The offending integer.
        element: String,
    },
    /// An integer did not fit in `u32`.
    #[error("idset {input:?}: id {element:?} exceeds {max}", max = u32::MAX)]
    Overflow {
        /// The full input string.
        input: String,
        /// The offending integer.
        element: String,
    },
    /// An element did not ascend from the ones before it (RFC 22: ids are
    /// unique and in ascending order), e.g. `"3,2"`, `"2,2"` or `"1-3,2"`.
    #[error("idset {input:?}: {element:?} is out of order (ids must be unique and ascending, e.g. \"1-3,5\")")]
    OutOfOrder {
        /// The full input string.
        input: String,
        /// The first element that does not ascend.
        element: String,
    },
    /// A range had its high bound below its low bound (e.g. `"5-3"`).
    #[error("idset {input:?}: reversed range {element:?}")]
    ReversedRange {
        /// The full input string.
        input: String,
        /// The offending range.
        element: String,
    },
    /// Brackets were unbalanced or appeared other than around the whole set.
    #[error("idset {input:?}: unbalanced or misplaced brackets")]
    Brackets {
        /// The full input string.
        input: String,
    },
    /// The string would expand to more than [`MAX_IDS`] ids.
    #[error("idset {input:?}: more than {max} ids", max = MAX_IDS)]
    TooLarge {
        /// The full input string (possibly truncated to 64 characters).
        input: String,
    },
}

/// A set of `u32` ids with RFC 22 string encoding.
///
/// Iteration is always ascending. `Display` gives the canonical compressed
/// form without brackets (`"0-3,5"`); serde (de)serializes it as that string.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct IdSet(BTreeSet<u32>);

/// Truncate long inputs embedded in error messages.
fn clip(s: &str) -> String {
    if s.chars().count() > 64 {
        let mut out: String = s.chars().take(64).collect();
        out.push_str("...");
        out
    } else {
        s.to_string()
    }
}

impl IdSet {
    /// Create an empty set.
    pub fn new() -> Self {
        IdSet(BTreeSet::new())
    }

    /// Parse an RFC 22 idset string such as `"1-3,5,42"` or `"[0-7]"`.
    ///
    /// The empty string and `"[]"` give the empty set. Each element must
    /// start above the end of the one before it (RFC 22: unique ids in
    /// ascending order); consecutive elements such as `"1,2"` or `"1-2,3"` are
    /// accepted (they print back as `"1-2"` and `"1-3"`).
    ///
    /// # Errors
    /// [`IdSetError`] for empty elements, non-digit characters, leading zeros
    /// (`"01"`), ids above `u32::MAX`, reversed ranges (`"5-3"`), elements out
    /// of order or repeated (`"3,2"`, `"2,2"`), misplaced brackets, or more than
    /// [`MAX_IDS`] ids.
    pub fn parse(s: &str) -> Result<IdSet, IdSetError> {
        let body = match (s.strip_prefix('['), s.ends_with(']')) {
            (Some(rest), true) => rest.strip_suffix(']').unwrap_or(rest),
            (None, false) => s,
            _ => return Err(IdSetError::Brackets { input: clip(s) }),
        };
        if body.contains('[') || body.contains(']') {
            return Err(IdSetError::Brackets { input: clip(s) });
        }
        let mut set = BTreeSet::new();
        if body.is_empty() {
            return Ok(IdSet(set));
        }
        let mut total: u64 = 0;
        let mut last: Option<u32> = None;
        for element in body.split(',') {
            if element.is_empty() {
                return Err(IdSetError::EmptyElement { input: clip(s) });
            }
            let (lo, hi) = match element.split_once('-') {
                Some((a, b)) => (parse_id(s, element, a)?, parse_id(s, element, b)?),
                None => {
                    let v = parse_id(s, element, element)?;
                    (v, v)
                }
            };
            if hi < lo {
                return Err(IdSetError::ReversedRange { input: clip(s), element: clip(element) });
            }
            if last.is_some_and(|last| lo <= last) {
                return Err(IdSetError::OutOfOrder { input: clip(s), element: clip(element) });
            }
            last = Some(hi);
            total += u64::from(hi - lo) + 1;
            if total > MAX_IDS {
                return Err(IdSetError::TooLarge { input: clip(s) });
            }
            set.extend(lo..=hi);
        }
        Ok(IdSet(set))
    }

    /// Insert `id`; returns `true` if it was not already present.
    pub fn insert(&mut self, id: u32) -> bool {
        self.0.insert(id)
    }

    /// Remove `id`; returns `true` if it was present.
    pub fn remove(&mut self, id: u32) -> bool {
        self.0.remove(&id)
    }

    /// Whether `id` is in the set.
    pub fn contains(&self, id: u32) -> bool {
        self.0.contains(&id)
    }

    /// Number of ids in the set.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Iterate over the ids in ascending order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = u32> + '_ {
        self.0.iter().copied()
    }

    /// Smallest id, or `None` if empty.
    pub fn first(&self) -> Option<u32> {
        self.0.first().copied()
    }

    /// Largest id, or `None` if empty.
    pub fn last(&self) -> Option<u32> {
        self.0.last().copied()
    }

    /// Ids in `self` or `other`.
    pub fn union(&self, other: &IdSet) -> IdSet {
        IdSet(self.0.union(&other.0).copied().collect())
    }

    /// Ids in both `self` and `other`.
    pub fn intersection(&self, other: &IdSet) -> IdSet {
        IdSet(self.0.intersection(&other.0).copied().collect())
    }

    /// Ids in `self` but not in `other`.
    pub fn difference(&self, other: &IdSet) -> IdSet {
        IdSet(self.0.difference(&other.0).copied().collect())
    }

    /// Whether every id of `self` is also in `other`.
    pub fn is_subset(&self, other: &IdSet) -> bool {
        self.0.is_subset(&other.0)
    }

    /// Maximal runs of consecutive ids as inclusive `(lo, hi)` pairs, ascending.
    pub fn ranges(&self) -> Vec<(u32, u32)> {
        let mut out: Vec<(u32, u32)> = Vec::new();
        for id in self.iter() {
            match out.last_mut() {
                Some((_, hi)) if hi.checked_add(1) == Some(id) => *hi = id,
                _ => out.push((id, id)),
            }
        }
        out
    }
}

/// Parse one RFC 22 integer: ASCII digits only, no leading zero, fits `u32`.
fn parse_id(input: &str, element: &str, digits: &str) -> Result<u32, IdSetError> {
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(IdSetError::Invalid { input: clip(input), element: clip(element) });
    }
    if digits.len() > 1 && digits.starts_with('0') {
        return Err(IdSetError::LeadingZero { input: clip(input), element: clip(digits) });
    }
    digits.parse::<u32>().map_err(|_| IdSetError::Overflow { input: clip(input), element: clip(digits) })
}

impl FromIterator<u32> for IdSet {
    fn from_iter<I: IntoIterator<Item = u32>>(iter: I) -> Self {
        IdSet(iter.into_iter().collect())
    }
}

impl Extend<u32> for IdSet {
    fn extend<I: IntoIterator<Item = u32>>(&mut self, iter: I) {
        self.0.extend(iter)
    }
}

impl<'a> IntoIterator for &'a IdSet {
    type Item = u32;
    type IntoIter = std::iter::Copied<std::collections::btree_set::Iter<'a, u32>>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter().copied()
    }
}

impl fmt::Display for IdSet {
    /// Canonical RFC 22 form without brackets, e.g. `"0-3,5"`; empty set is `""`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (lo, hi)) in self.ranges().into_iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            if lo == hi {
                write!(f, "{lo}")?;
            } else {
                write!(f, "{lo}-{hi}")?;
            }
        }
        Ok(())
    }
}

string_form!(IdSet, IdSetError);

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ids(s: &str) -> Vec<u32> {
        IdSet::parse(s).expect("valid idset").iter().collect()
    }

    #[test]
    fn parses_rfc22_examples() {
        assert_eq!(ids("1-3,5,42"), vec![1, 2, 3, 5, 42]);
        // The three spellings RFC 22 gives of one set.
        for input in ["1,2,3,5,6,42", "1-3,5-6,42", "[1-3,5-6,42]"] {
            assert_eq!(ids(input), vec![1, 2, 3, 5, 6, 42], "{input}");
            assert_eq!(IdSet::parse(input).map(|s| s.to_string()).as_deref(), Ok("1-3,5-6,42"));
        }
        assert_eq!(ids("[1-3]"), vec![1, 2, 3]);
        assert_eq!(ids("0"), vec![0]);
        assert_eq!(ids(""), Vec::<u32>::new());
        assert_eq!(ids("[]"), Vec::<u32>::new());
        assert_eq!(ids("4294967295"), vec![u32::MAX]);
    }

    #[test]
    fn refuses_unsorted_duplicates_and_overlaps() {
        // RFC 22: "An idset SHALL consist of unique ... ids" in "ascending numerical order".
        for input in ["3,2", "2,2", "3,1-4,2,4", "1-3,2", "1-3,3-5", "0-5,5", "[4,1]", "7,7-8"] {
            let err = IdSet::parse(input).expect_err(input);
            assert!(matches!(err, IdSetError::OutOfOrder { .. }), "{input:?}: {err}");
            assert!(err.to_string().contains("out of order"), "{input:?}: {err}");
        }
        // Adjacent elements ascend: accepted, and printed compressed.
        assert_eq!(ids("1,2,3"), vec![1, 2, 3]);
        assert_eq!(IdSet::parse("1-2,3,5-5").map(|s| s.to_string()), Ok("1-3,5".to_string()));
    }

    #[test]
    fn rejects_bad_input() {
        let cases = [
            ("01", "leading zero"),
            ("1-05", "leading zero"),
            ("5-3", "reversed"),
            ("1,,2", "empty element"),
            ("1,", "empty element"),
            ("a", "invalid"),
            ("1-", "invalid"),
            ("-1", "invalid"),
            ("1-2-3", "invalid"),
            ("+1", "invalid"),
            (" 1", "invalid"),
            ("4294967296", "exceeds"),
            ("[1-3", "brackets"),
            ("1-3]", "brackets"),
            ("[1,[2]]", "brackets"),
            ("0-4294967295", "more than"),
        ];
        for (input, want) in cases {
            let err = IdSet::parse(input).expect_err(input).to_string();
            assert!(err.contains(want), "{input:?}: {err}");
        }
    }

    #[test]
    fn display_is_canonical() {
        assert_eq!(IdSet::parse("[0-3,5]").unwrap_or_default().to_string(), "0-3,5");
        assert_eq!(IdSet::from_iter([1, 2, 4, 5, 6, 9]).to_string(), "1-2,4-6,9");
        assert_eq!(IdSet::new().to_string(), "");
        assert_eq!(IdSet::from_iter([u32::MAX - 1, u32::MAX]).to_string(), "4294967294-4294967295");
    }

    #[test]
    fn set_operations() {
        let a: IdSet = "0-5".parse().unwrap_or_default();
        let b: IdSet = "4-8".parse().unwrap_or_default();
        assert_eq!(a.union(&b).to_string(), "0-8");
        assert_eq!(a.intersection(&b).to_string(), "4-5");
        assert_eq!(a.difference(&b).to_string(), "0-3");
        assert!(a.intersection(&b).is_subset(&a));
        assert!(!a.is_subset(&b));
        let mut c = IdSet::new();
        assert!(c.is_empty());
        assert!(c.insert(7));
        assert!(!c.insert(7));
        assert!(c.contains(7));
        assert_eq!(c.first(), Some(7));
        assert_eq!(c.len(), 1);
        assert!(c.remove(7));
        assert!(!c.remove(7));
        assert_eq!(c.first(), None);
    }

    #[test]
    fn serde_as_string() {
        let s: IdSet = "0-2,7".parse().unwrap_or_default();
        assert_eq!(serde_json::to_string(&s).ok(), Some("\"0-2,7\"".to_string()));
        let back: IdSet = serde_json::from_str("\"[0-2,7]\"").unwrap_or_default();
        assert_eq!(back, s);
        assert!(serde_json::from_str::<IdSet>("\"01\"").is_err());
        assert!(serde_json::from_str::<IdSet>("3").is_err());
    }

    proptest! {
        #[test]
        fn parse_never_panics(s in "\\PC*") {
            let _ = IdSet::parse(&s);
        }

        #[test]
        fn parse_never_panics_idset_alphabet(s in "[\\[\\]0-9,-]{0,24}") {
            let _ = IdSet::parse(&s);
        }

        #[test]
        fn decode_then_encode_is_canonical(s in "[\\[\\]0-9,-]{0,24}") {
            // Whatever is accepted prints in one canonical form, which reads back as the same set and prints the
            // same again: encode(decode(x)) is a fixed point.
            if let Ok(set) = IdSet::parse(&s) {
                let text = set.to_string();
                prop_assert_eq!(IdSet::parse(&text), Ok(set.clone()));
                prop_assert_eq!(IdSet::parse(&text).map(|s| s.to_string()), Ok(text.clone()));
                prop_assert!(!text.contains('['), "{}", text);
            }
        }

        #[test]
        fn accepts_exactly_the_ascending_lists(elements in proptest::collection::vec((0u32..40, 0u32..3), 0..8)) {
            // Elements lo or lo-hi, in the order drawn: accepted iff each starts above the end of the one before.
            let text = elements
                .iter()
                .map(|&(lo, len)| if len == 0 { lo.to_string() } else { format!("{lo}-{}", lo + len) })
                .collect::<Vec<_>>()
                .join(",");
            let ascending = elements.windows(2).all(|w| w[1].0 > w[0].0 + w[0].1);
            let parsed = IdSet::parse(&text);
            prop_assert_eq!(parsed.is_ok(), ascending, "{}: {:?}", text, parsed);
            if let Ok(set) = parsed {
                let want: IdSet = elements.iter().flat_map(|&(lo, len)| lo..=lo + len).collect();
                prop_assert_eq!(set, want);
            }
        }

        #[test]
        fn display_round_trips(v in proptest::collection::vec(0u32..200, 0..60)) {
            let set: IdSet = v.iter().copied().collect();
            let text = set.to_string();
            let back = IdSet::parse(&text);
            prop_assert_eq!(back, Ok(set.clone()));
            let bracketed = IdSet::parse(&format!("[{text}]"));
            prop_assert_eq!(bracketed, Ok(set));
        }
    }
}
