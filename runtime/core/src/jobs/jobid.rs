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

/// Error parsing a job id: the text given and why it is not one.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid job id '{0}': {1}")]
pub struct JobIdError(pub String, pub &'static str);

/// Why a text is no job id, when it is in none of the forms read.
const FORMS: &str = "expected f58 (f3Yq9b), decimal, hex (0x1a2b) or dotted hex (0000.0001.a2b0.0000)";

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

    /// Parse a job id in any RFC 19 form this instance reads, chosen as RFC 19 says (in this order): containing
    /// `.`, dotted hex (`0017.e9fb.8df1.6c2e`, four groups of 1-4 hex digits); containing `-`, mnemonic words (not
    /// read: refused saying so); starting with `ƒ` or `f`, f58 (`ƒuZZybuNNy`); starting with an emoji (not read);
    /// starting with `0x`, hex (`0x17e9fb8df16c2e`); else decimal. Leading and trailing whitespace is ignored.
    ///
    /// # Errors
    /// [`JobIdError`] with the text and why: not in any form read, a form not read (words, emoji), or over 64 bits.
    pub fn parse(s: &str) -> Result<JobId, JobIdError> {
        let t = s.trim();
        let bad = |why| JobIdError(s.into(), why);
        let hex = |h: &str, most: usize| {
            if h.is_empty() || h.len() > most || !h.bytes().all(|c| c.is_ascii_hexdigit()) {
                return Err(bad(FORMS));
            }
            u64::from_str_radix(h, 16).map_err(|_| bad(FORMS))
        };
        if t.contains('.') {
            let groups: Vec<&str> = t.split('.').collect();
            if groups.len() != 4 {
                return Err(bad("dotted hex has four groups of hex digits (0000.0001.a2b0.0000)"));
            }
            return groups.iter().try_fold(0u64, |n, g| Ok((n << 16) | hex(g, 4)?)).map(JobId);
        }
        if t.contains('-') {
            return Err(bad("mnemonic (words) job ids are not read here: give the f58, decimal or hex form"));
        }
        if let Some(b) = t.strip_prefix('f').or_else(|| t.strip_prefix('ƒ')) {
            if b.is_empty() {
                return Err(bad(FORMS));
            }
            let mut n: u64 = 0;
            for c in b.bytes() {
                let d = F58.iter().position(|&x| x == c).ok_or_else(|| bad(FORMS))? as u64;
                n = n.checked_mul(58).and_then(|n| n.checked_add(d)).ok_or_else(|| bad("more than 64 bits"))?;
            }
            return Ok(JobId(n));
        }
        if t.as_bytes().starts_with(&[0xf0, 0x9f]) {
            return Err(bad("emoji job ids are not read here: give the f58, decimal or hex form"));
        }
        if let Some(h) = t.strip_prefix("0x") {
            return hex(h, 16).map(JobId);
        }
        if t.is_empty() || !t.bytes().all(|c| c.is_ascii_digit()) {
            return Err(bad(FORMS));
        }
        t.parse::<u64>().map(JobId).map_err(|_| bad("more than 64 bits"))
    }

    /// The hex form (RFC 19): `0x17e9fb8df16c2e`.
    pub fn hex(&self) -> String {
        format!("{:#x}", self.0)
    }

    /// The dotted hex form (RFC 19), four groups of four hex digits: `0017.e9fb.8df1.6c2e`.
    pub fn dothex(&self) -> String {
        let n = self.0;
        format!("{:04x}.{:04x}.{:04x}.{:04x}", n >> 48, (n >> 32) & 0xffff, (n >> 16) & 0xffff, n & 0xffff)
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

    /// RFC 19, "Representation" and "Decoding Alternate FLUID Representations": each rule, on the RFC's own
    /// example FLUID (6731191091817518, `ƒuZZybuNNy`, `0x17e9fb8df16c2e`, `0017.e9fb.8df1.6c2e`).
    #[test]
    fn rfc19_forms() {
        let id = JobId(6_731_191_091_817_518);
        let p = |s: &str| JobId::parse(s);
        // F58: the alphabet, the `ƒ` prefix (U+0192), and the ASCII `f` fallback.
        assert_eq!(p("ƒuZZybuNNy"), Ok(id));
        assert_eq!(p("fuZZybuNNy"), Ok(id));
        assert_eq!(id.f58(), "fuZZybuNNy");
        // Hex, with its `0x` prefix; dotted hex, four groups of four digits.
        assert_eq!(p("0x17e9fb8df16c2e"), Ok(id));
        assert_eq!(p("0x17E9FB8DF16C2E"), Ok(id));
        assert_eq!(id.hex(), "0x17e9fb8df16c2e");
        assert_eq!(p("0017.e9fb.8df1.6c2e"), Ok(id));
        assert_eq!(id.dothex(), "0017.e9fb.8df1.6c2e");
        assert_eq!(p("000e.daf9.7d00.0000"), p("0xedaf97d000000"));
        assert_eq!(p("0.0.0.1"), Ok(JobId(1)), "groups of fewer digits, as flux-core's decoder reads them");
        // Decimal, and whitespace around any form ignored.
        assert_eq!(p("6731191091817518"), Ok(id));
        assert_eq!(p("  0x17e9fb8df16c2e\n"), Ok(id));
        // The order of the rules: `.` before `-` before `f` before `0x`.
        assert!(p("f1.2").unwrap_err().1.starts_with("dotted hex"), "a `.` means dotted hex, whatever else");
        assert!(p("reform-remote-galileo--heart-package-academy").unwrap_err().1.starts_with("mnemonic"));
        assert!(p("f-1").unwrap_err().1.starts_with("mnemonic"), "a `-` means words before an `f` means f58");
        assert!(p("🚹💂🙌😳💱🏃").unwrap_err().1.starts_with("emoji"));
        // Malformed forms are refused, naming the text.
        for bad in
            ["0x", "0xg1", "0x1_0", "0x10000000000000000", "0017.e9fb.8df1", "00170.e9fb.8df1.6c2e", "1e3", "+5", ""]
        {
            let e = p(bad).unwrap_err();
            assert_eq!(e.0, bad, "{e}");
        }
        assert_eq!(p("18446744073709551616").unwrap_err().1, "more than 64 bits");
        assert_eq!(
            p("x").unwrap_err().to_string(),
            "invalid job id 'x': expected f58 (f3Yq9b), decimal, hex (0x1a2b) or dotted hex (0000.0001.a2b0.0000)"
        );
    }
    proptest! {
        #[test]
        fn round_trip(n in any::<u64>()) {
            let id = JobId(n);
            for form in [id.f58(), id.0.to_string(), id.hex(), id.dothex()] {
                prop_assert_eq!(JobId::parse(&form), Ok(id));
            }
        }
        #[test]
        fn parse_never_panics(s in "\\PC{0,24}") { let _ = JobId::parse(&s); }
        #[test]
        fn ordered(a in 0u64..1<<40, b in 0u64..1<<40) {
            prop_assert_eq!(a.cmp(&b), JobId::from_parts(a, 5).cmp(&JobId::from_parts(b, 5)));
        }
    }
}
