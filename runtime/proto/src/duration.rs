//! Flux Standard Duration, following Flux RFC 23.
//!
//! A duration is `N[SUFFIX]`, where `N` is a non-negative decimal floating
//! point number (`"30"`, `"1.5"`, `".5"`, `"2e3"`) and `SUFFIX` is one of
//! `ms` (milliseconds), `s` (seconds), `m` (minutes), `h` (hours) or `d`
//! (days). Without a suffix the unit is seconds. The words `inf` and
//! `infinity` (any case) denote an unlimited duration. Surrounding
//! whitespace is ignored; signs, `NaN`, and anything else are rejected.

use std::time::Duration;

use thiserror::Error;

/// Errors returned by [`parse_duration`] and [`parse_duration_secs`] (RFC 23).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DurationError {
    /// The input was empty or only whitespace.
    #[error("empty duration")]
    Empty,
    /// The input had a leading `-`: durations cannot be negative.
    #[error("duration {0:?}: must not be negative")]
    Negative(String),
    /// The numeric part was not a valid non-negative decimal number.
    #[error("duration {0:?}: invalid number (expected N[ms|s|m|h|d] or inf)")]
    InvalidNumber(String),
    /// The suffix was not one of `ms`, `s`, `m`, `h`, `d`.
    #[error("duration {input:?}: invalid unit {unit:?} (expected ms, s, m, h or d)")]
    InvalidUnit {
        /// The full input.
        input: String,
        /// The unrecognised suffix.
        unit: String,
    },
    /// The value is finite as written but too large to represent.
    #[error("duration {0:?}: too large")]
    Overflow(String),
}

fn clip(s: &str) -> String {
    if s.chars().count() > 64 {
        let mut out: String = s.chars().take(64).collect();
        out.push_str("...");
        out
    } else {
        s.to_string()
    }
}

/// Whether `s` is a plain non-negative decimal float: `D+[.D*][e[+-]D+]` or
/// `.D+[e[+-]D+]`, ASCII only.
fn is_decimal(s: &str) -> bool {
    let (mantissa, exponent) = match s.find(['e', 'E']) {
        Some(i) => (&s[..i], Some(&s[i + 1..])),
        None => (s, None),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits = |t: &str| t.bytes().all(|b| b.is_ascii_digit());
    if !digits(int) || !digits(frac) || (int.is_empty() && frac.is_empty()) {
        return false;
    }
    match exponent {
        None => true,
        Some(e) => {
            let e = e.strip_prefix(['+', '-']).unwrap_or(e);
            !e.is_empty() && digits(e)
        }
    }
}

/// Parse an RFC 23 duration into seconds as `f64`.
///
/// Returns `f64::INFINITY` for `inf`/`infinity` (case-insensitive), else a
/// finite value `>= 0` (e.g. `"1.5m"` gives `90.0`, `"250ms"` gives `0.25`).
///
/// # Errors
/// [`DurationError`] for empty input, a negative sign, a malformed number
/// (including `NaN`), an unknown unit, or a finite value that overflows `f64`.
pub fn parse_duration_secs(s: &str) -> Result<f64, DurationError> {
    let t = s.trim();
    if t.is_empty() {
        return Err(DurationError::Empty);
    }
    if t.eq_ignore_ascii_case("inf") || t.eq_ignore_ascii_case("infinity") {
        return Ok(f64::INFINITY);
    }
    if t.starts_with('-') {
        return Err(DurationError::Negative(clip(s)));
    }
    let split = t.find(|c: char| !(c.is_ascii_digit() || matches!(c, '.' | 'e' | 'E' | '+' | '-'))).unwrap_or(t.len());
    // An 'e' directly followed by nothing numeric is not an exponent; but no
    // RFC 23 unit starts with 'e', so such input is invalid either way.
    let (number, unit) = t.split_at(split);
    if !is_decimal(number) {
        return Err(DurationError::InvalidNumber(clip(s)));
    }
    // (multiplier, divisor): dividing by 1000 is exact where 1e-3 is not.
    let (multiplier, divisor) = match unit {
        "" | "s" => (1.0, 1.0),
        "ms" => (1.0, 1000.0),
        "m" => (60.0, 1.0),
        "h" => (3600.0, 1.0),
        "d" => (86400.0, 1.0),
        other => return Err(DurationError::InvalidUnit { input: clip(s), unit: clip(other) }),
    };
    let value: f64 = number.parse().map_err(|_| DurationError::InvalidNumber(clip(s)))?;
    let secs = value * multiplier / divisor;
    if !secs.is_finite() {
        return Err(DurationError::Overflow(clip(s)));
    }
    Ok(secs)
}

/// Exact conversion of an already-validated `D*[.D*][unit]` string (no
/// exponent) to a `Duration`, rounding to the nearest nanosecond. `None` when
/// the form has an exponent or the value does not fit; the caller then falls
/// back to the `f64` path.
fn exact_decimal(t: &str) -> Option<Duration> {
    const NS: u128 = 1_000_000_000;
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let unit_ns: u128 = match unit {
        "" | "s" => NS,
        "ms" => NS / 1000,
        "m" => 60 * NS,
        "h" => 3600 * NS,
        "d" => 86400 * NS,
        _ => return None,
    };
    let (int, frac) = number.split_once('.').unwrap_or((number, ""));
    if int.len() > 30 {
        return None;
    }
    let int: u128 = if int.is_empty() { 0 } else { int.parse().ok()? };
    // Digits past the 24th cannot change the result by a nanosecond.
    let frac = frac.get(..frac.len().min(24))?;
    let frac_num: u128 = if frac.is_empty() { 0 } else { frac.parse().ok()? };
    let scale = 10u128.checked_pow(u32::try_from(frac.len()).ok()?)?;
    let frac_ns = frac_num.checked_mul(unit_ns)?.checked_add(scale / 2)? / scale;
    let total = int.checked_mul(unit_ns)?.checked_add(frac_ns)?;
    let secs = u64::try_from(total / NS).ok()?;
    let nanos = u32::try_from(total % NS).ok()?;
    Some(Duration::new(secs, nanos))
}

/// Parse an RFC 23 duration into a [`Duration`].
///
/// Returns `Ok(None)` for an infinite duration (`inf`, `infinity`, any case)
/// and `Ok(Some(d))` otherwise, rounded to the nearest nanosecond. Plain
/// decimal input (no exponent) is converted exactly, without going through
/// `f64`.
///
/// # Errors
/// As [`parse_duration_secs`], plus [`DurationError::Overflow`] when the value
/// exceeds what [`Duration`] can hold (about 5.8e11 years).
pub fn parse_duration(s: &str) -> Result<Option<Duration>, DurationError> {
    let secs = parse_duration_secs(s)?;
    if secs.is_infinite() {
        return Ok(None);
    }
    if let Some(d) = exact_decimal(s.trim()) {
        return Ok(Some(d));
    }
    Duration::try_from_secs_f64(secs).map(Some).map_err(|_| DurationError::Overflow(clip(s)))
}

/// Format a [`Duration`] in compact RFC 23 form using the largest unit that
/// represents it exactly: `"0s"`, `"2d"`, `"2h"`, `"10m"`, `"30s"`,
/// `"250ms"` (whole milliseconds below one second), otherwise seconds with
/// up to nine decimals and no trailing zeros (`"1.5s"`, `"0.000001s"`).
///
/// The result always parses back with [`parse_duration`] to exactly the same
/// `Duration`.
pub fn format_duration(d: Duration) -> String {
    let secs = d.as_secs();
    let nanos = d.subsec_nanos();
    if nanos == 0 {
        return match secs {
            0 => "0s".to_string(),
            s if s.is_multiple_of(86400) => format!("{}d", s / 86400),
            s if s.is_multiple_of(3600) => format!("{}h", s / 3600),
            s if s.is_multiple_of(60) => format!("{}m", s / 60),
            s => format!("{s}s"),
        };
    }
    if secs == 0 && nanos.is_multiple_of(1_000_000) {
        return format!("{}ms", nanos / 1_000_000);
    }
    let frac = format!("{nanos:09}");
    format!("{secs}.{}s", frac.trim_end_matches('0'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn secs(s: &str) -> f64 {
        parse_duration_secs(s).expect("valid duration")
    }

    #[test]
    fn parses_units() {
        assert_eq!(secs("30"), 30.0);
        assert_eq!(secs("1.5"), 1.5);
        assert_eq!(secs(".5s"), 0.5);
        assert_eq!(secs("5."), 5.0);
        assert_eq!(secs("250ms"), 0.25);
        assert_eq!(secs("10s"), 10.0);
        assert_eq!(secs("1.5m"), 90.0);
        assert_eq!(secs("2h"), 7200.0);
        assert_eq!(secs("1d"), 86400.0);
        assert_eq!(secs("0"), 0.0);
        assert_eq!(secs("1e2s"), 100.0);
        assert_eq!(secs(" 5m "), 300.0);
        assert_eq!(parse_duration("1.5s"), Ok(Some(Duration::from_millis(1500))));
        assert_eq!(parse_duration("10m"), Ok(Some(Duration::from_secs(600))));
    }

    #[test]
    fn parses_infinity() {
        for s in ["inf", "INF", "infinity", "Infinity", "INFINITY"] {
            assert_eq!(parse_duration(s), Ok(None), "{s}");
            assert_eq!(parse_duration_secs(s), Ok(f64::INFINITY), "{s}");
        }
    }

    #[test]
    fn rejects_bad_input() {
        assert_eq!(parse_duration(""), Err(DurationError::Empty));
        assert_eq!(parse_duration("  "), Err(DurationError::Empty));
        assert!(matches!(parse_duration("-1"), Err(DurationError::Negative(_))));
        assert!(matches!(parse_duration("-inf"), Err(DurationError::Negative(_))));
        for s in ["NaN", "nan", "abc", ".", "1..2", "+1", "1e", "e5", "1.2.3s", "infs", "1 s"] {
            assert!(parse_duration(s).is_err(), "{s}");
        }
        assert!(matches!(parse_duration("5x"), Err(DurationError::InvalidUnit { .. })));
        assert!(matches!(parse_duration("5sec"), Err(DurationError::InvalidUnit { .. })));
        assert!(matches!(parse_duration("1e400"), Err(DurationError::Overflow(_))));
        assert!(matches!(parse_duration("1e300d"), Err(DurationError::Overflow(_))));
        assert!(matches!(parse_duration("1e19d"), Err(DurationError::Overflow(_))));
    }

    #[test]
    fn formats_compactly() {
        assert_eq!(format_duration(Duration::ZERO), "0s");
        assert_eq!(format_duration(Duration::from_millis(1500)), "1.5s");
        assert_eq!(format_duration(Duration::from_secs(600)), "10m");
        assert_eq!(format_duration(Duration::from_secs(7200)), "2h");
        assert_eq!(format_duration(Duration::from_secs(172800)), "2d");
        assert_eq!(format_duration(Duration::from_secs(90)), "90s");
        assert_eq!(format_duration(Duration::from_millis(250)), "250ms");
        assert_eq!(format_duration(Duration::from_micros(1)), "0.000001s");
        assert_eq!(format_duration(Duration::from_millis(60_500)), "60.5s");
    }

    proptest! {
        #[test]
        fn parse_never_panics(s in "\\PC*") {
            let _ = parse_duration(&s);
            let _ = parse_duration_secs(&s);
        }

        #[test]
        fn parse_never_panics_number_alphabet(s in "[0-9.eE+\\-msdhinf]{0,16}") {
            let _ = parse_duration(&s);
        }

        #[test]
        fn format_round_trips_nanos(secs in 0u64..u64::MAX / 2, ns in 0u32..1_000_000_000) {
            let d = Duration::new(secs, ns);
            prop_assert_eq!(parse_duration(&format_duration(d)), Ok(Some(d)));
        }

        #[test]
        fn format_round_trips(ms in 0u64..10_000_000_000u64) {
            let d = Duration::from_millis(ms);
            prop_assert_eq!(parse_duration(&format_duration(d)), Ok(Some(d)));
        }

        #[test]
        fn format_round_trips_micros(us in 0u64..1_000_000_000u64) {
            let d = Duration::from_micros(us);
            prop_assert_eq!(parse_duration(&format_duration(d)), Ok(Some(d)));
        }
    }
}
