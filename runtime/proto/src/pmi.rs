//! PMI-1 "simple" wire protocol (Flux RFC 13; what MPICH's simple PMI client speaks): the line codec.
//!
//! A line is `key=value` tokens separated by single spaces and ended by `\n`, at most [`MAX_LINE`] bytes; each
//! token is split at its first `=` (values may contain `=`). The first token is `cmd=NAME` (or `mcmd=spawn`,
//! which Vigil does not support). The server side lives in `vigil-shell`; the blocking client a broker uses to
//! bootstrap a nested instance under any PMI-1 launcher is `vigil::pmi::Client`: both speak through this codec.

use std::collections::BTreeMap;

/// Longest PMI line, newline included (MPICH's `PMIU_MAXLINE`).
pub const MAX_LINE: usize = 1024;
/// `kvsname_max` served by `get_maxes`.
pub const KVSNAME_MAX: usize = 256;
/// `keylen_max` served by `get_maxes`.
pub const KEYLEN_MAX: usize = 256;
/// `vallen_max` served by `get_maxes`; longer values are split by MPICH into `key-seg-i/N` keys.
pub const VALLEN_MAX: usize = 1024 - 64;

/// A decoded PMI line: its command and its other tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    /// Value of the leading `cmd=` token.
    pub cmd: String,
    /// Every other `key=value` token, in order of appearance (last one wins for duplicates).
    pub args: BTreeMap<String, String>,
}

/// Why a PMI line was rejected.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum LineError {
    /// Longer than [`MAX_LINE`].
    #[error("PMI line exceeds {MAX_LINE} bytes")]
    TooLong,
    /// Empty line.
    #[error("empty PMI line")]
    Empty,
    /// A token without `=`.
    #[error("malformed PMI token '{0}' (expected key=value)")]
    BadToken(String),
    /// First token is not `cmd=` (or is `mcmd=`, multi-line commands being unsupported).
    #[error("PMI line does not start with cmd= ('{0}')")]
    NoCmd(String),
    /// Not UTF-8.
    #[error("PMI line is not valid UTF-8")]
    NotUtf8,
    /// A newline before the end: two lines in one, or a token that would split a reply echoing it.
    #[error("PMI line has a newline before its end")]
    Newline,
}

impl Line {
    /// Parse one line (without or with its trailing newline).
    pub fn parse(raw: &[u8]) -> Result<Line, LineError> {
        if raw.len() > MAX_LINE {
            return Err(LineError::TooLong);
        }
        let s = std::str::from_utf8(raw).map_err(|_| LineError::NotUtf8)?;
        let s = s.strip_suffix('\n').unwrap_or(s);
        if s.contains('\n') {
            return Err(LineError::Newline);
        }
        let s = s.trim_matches(' ');
        if s.is_empty() {
            return Err(LineError::Empty);
        }
        let mut cmd = None;
        let mut args = BTreeMap::new();
        for (i, tok) in s.split(' ').filter(|t| !t.is_empty()).enumerate() {
            let (k, v) = tok.split_once('=').ok_or_else(|| LineError::BadToken(tok.chars().take(64).collect()))?;
            if i == 0 {
                if k != "cmd" {
                    return Err(LineError::NoCmd(tok.chars().take(64).collect()));
                }
                cmd = Some(v.to_string());
            } else {
                args.insert(k.to_string(), v.to_string());
            }
        }
        Ok(Line { cmd: cmd.unwrap_or_default(), args })
    }

    /// A line `cmd=NAME k=v ...` with the given tokens.
    pub fn new(cmd: &str, args: &[(&str, &str)]) -> Line {
        Line { cmd: cmd.to_string(), args: args.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect() }
    }

    /// Encode with a trailing newline. Token order: `cmd` first, then the others sorted by key.
    pub fn encode(&self) -> String {
        let mut s = format!("cmd={}", self.cmd);
        for (k, v) in &self.args {
            s.push(' ');
            s.push_str(k);
            s.push('=');
            s.push_str(v);
        }
        s.push('\n');
        s
    }

    /// The value of token `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.args.get(key).map(String::as_str)
    }
}

/// PMI_process_mapping value for an RFC 34 task map (`[[nodeid, nnodes, ppn, repeat], ...]`):
/// `(vector,(nodeid,nnodes,ppn),...)`, each block repeated `repeat` times.
///
/// A mapping that does not fit in one PMI value ([`VALLEN_MAX`]) cannot be served to a task: it is then the empty
/// string (no mapping known), and the expansion stops there, whatever the `repeat` counts of the task map say.
pub fn process_mapping(taskmap: &serde_json::Value) -> String {
    let mut s = String::from("(vector");
    if let Some(blocks) = taskmap.get("map").and_then(|m| m.as_array()) {
        for b in blocks {
            let f = |i: usize| b.get(i).and_then(|v| v.as_u64()).unwrap_or(0);
            for _ in 0..f(3).max(1) {
                s.push_str(&format!(",({},{},{})", f(0), f(1), f(2)));
                if s.len() >= VALLEN_MAX {
                    return String::new();
                }
            }
        }
    }
    s.push(')');
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parse_and_encode() {
        let l = Line::parse(b"cmd=put kvsname=k key=a value=x=y==z\n").unwrap();
        assert_eq!(l.cmd, "put");
        assert_eq!(l.get("value"), Some("x=y==z"));
        assert_eq!(Line::parse(l.encode().as_bytes()).unwrap(), l);
        assert_eq!(Line::parse(b"cmd=barrier_in\n").unwrap().cmd, "barrier_in");
        assert!(matches!(Line::parse(b"mcmd=spawn\n"), Err(LineError::NoCmd(_))));
        assert!(matches!(Line::parse(b"cmd=put junk\n"), Err(LineError::BadToken(_))));
        assert_eq!(Line::parse(b"\n"), Err(LineError::Empty));
        assert_eq!(Line::parse(&[b'a'; 1025]), Err(LineError::TooLong));
        assert_eq!(Line::parse(&[0xff, b'\n']), Err(LineError::NotUtf8));
        assert_eq!(Line::parse(b"cmd=init\n "), Err(LineError::Newline), "a newline inside the line");
        assert_eq!(Line::parse(b"cmd=put key=a value=x\ny\n"), Err(LineError::Newline));
    }

    #[test]
    fn mapping() {
        let tm = serde_json::json!({"version": 1, "map": [[0, 4, 2, 1]]});
        assert_eq!(process_mapping(&tm), "(vector,(0,4,2))");
        let tm = serde_json::json!({"version": 1, "map": [[0, 2, 3, 1], [2, 1, 2, 1]]});
        assert_eq!(process_mapping(&tm), "(vector,(0,2,3),(2,1,2))");
    }

    #[test]
    fn mapping_that_does_not_fit_in_a_value_is_empty() {
        // A repeat count from the task map is not a loop bound: u64::MAX blocks would never end.
        let tm = serde_json::json!({"version": 1, "map": [[0, 1, 1, u64::MAX]]});
        assert_eq!(process_mapping(&tm), "");
        let tm = serde_json::json!({"version": 1, "map": [[0, 1, 1, 3]]});
        assert_eq!(process_mapping(&tm), "(vector,(0,1,1),(0,1,1),(0,1,1))");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1000))]

        #[test]
        fn never_panics(b in proptest::collection::vec(any::<u8>(), 0..1100)) {
            let _ = Line::parse(&b);
        }

        /// PMI-shaped text (tokens, `=`, spaces, newlines in odd places) is parsed or refused, and what parses
        /// encodes to one line that parses back to the same.
        #[test]
        fn pmi_shaped_lines_parse_or_are_refused(s in "(cmd=|mcmd=)?[a-z_=]{0,12}( {1,2}[a-z_]{0,6}=?[a-z0-9=]{0,8}){0,4}[ \n]{0,3}") {
            if let Ok(l) = Line::parse(s.as_bytes()) {
                let text = l.encode();
                prop_assert_eq!(text.find('\n'), Some(text.len() - 1), "{:?}", text);
                prop_assert_eq!(Line::parse(text.as_bytes()), Ok(l));
            }
        }

        /// Any task map (repeat counts up to u64::MAX included) gives a mapping that fits in a PMI value.
        #[test]
        fn process_mapping_is_bounded(blocks in proptest::collection::vec(
            proptest::collection::vec(prop_oneof![0u64..5, Just(u64::MAX), any::<u64>()], 0..5), 0..8)
        ) {
            let m = process_mapping(&serde_json::json!({"version": 1, "map": blocks}));
            prop_assert!(m.len() < VALLEN_MAX, "{} bytes", m.len());
        }
    }
}
