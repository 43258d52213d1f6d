//! Job ids: 64-bit FLUIDs printed in the compact f58 form, as Flux does (RFC 19).
//!
//! A FLUID is `timestamp_ms (40 bits) | generator (14 bits) | sequence (10 bits)`, where the timestamp counts
//! milliseconds since the instance started (with a state directory: since it first started on it, and never
//! below the highest id kept, `journal.rs`). Ids are unique within an instance, across restarts of its rank 0
//! on the same state directory, and sort by submission time.

use std::fmt;

const F58: &[u8; 58] = b"123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz";

/// A job id (FLUID). The default, 0, is below every id given.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct JobId(pub u64);

/// Error parsing a job id.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid job id '{0}': expected an f58 id like f3Yq9b or a decimal id")]
pub struct JobIdError(pub String);

impl JobId {
    /// Compose a FLUID from a millisecond timestamp and a per-millisecond sequence number.
    pub fn from_parts(ms: u64, seq: u32) -> JobId {
        JobId(((ms & ((1 << 40) - 1)) << 24) | (seq as u64 & 0x3ff))
    }

    /// The f58 form, e.g. `f2UkWB`, with an ASCII `f` prefix.
    pub fn f58(&self) -> String {
        let mut n = self.0;
        if n == 0 {
            return "f1".into();
        }
        let mut v = Vec::new();
        while n > 0 {
            v.push(F58[(n % 58) as usize]);
            n /= 58;
        }
        v.reverse();
        format!("f{}", String::from_utf8_lossy(&v))
    }

    /// Parse an f58 id (`f...` or `ƒ...`) or a decimal id.
    pub fn parse(s: &str) -> Result<JobId, JobIdError> {
        let t = s.trim();
        let body = t.strip_prefix('f').or_else(|| t.strip_prefix('ƒ'));
        match body {
            Some(b) if !b.is_empty() => {
                let mut n: u64 = 0;
                for c in b.bytes() {
                    let d = F58.iter().position(|&x| x == c).ok_or_else(|| JobIdError(s.into()))? as u64;
                    n = n.checked_mul(58).and_then(|n| n.checked_add(d)).ok_or_else(|| JobIdError(s.into()))?;
                }
                Ok(JobId(n))
            }
            _ => t.parse::<u64>().map(JobId).map_err(|_| JobIdError(s.into())),
        }
    }
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.f58())
    }
}

impl std::str::FromStr for JobId {
    type Err = JobIdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        JobId::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    #[test]
    fn known() {
        assert_eq!(JobId(0).f58(), "f1");
        assert_eq!(JobId(57).f58(), "fz");
        assert_eq!(JobId(58).f58(), "f21");
        assert_eq!(JobId::parse("ƒ21").unwrap(), JobId(58));
        assert_eq!(JobId::parse("1234").unwrap(), JobId(1234));
        assert!(JobId::parse("f0").is_err());
        assert!(JobId::parse("").is_err());
        assert!(JobId::parse("fzzzzzzzzzzzzzzzzzzzzzzz").is_err());
    }
    proptest! {
        #[test]
        fn round_trip(n in any::<u64>()) { prop_assert_eq!(JobId::parse(&JobId(n).f58()).unwrap(), JobId(n)); }
        #[test]
        fn ordered(a in 0u64..1<<40, b in 0u64..1<<40) {
            prop_assert_eq!(a.cmp(&b), JobId::from_parts(a, 5).cmp(&JobId::from_parts(b, 5)));
        }
    }
}
