//! A warning signal before the time limit ([`WarnSignal`]): `--signal=SIG@TIME` on the command line, the shell
//! option `signal` (`attributes.system.shell.options.signal`, `{"signum": N, "timeleft": SECONDS}`) in the
//! jobspec, as Flux keeps it. Both keys may be left out: SIGUSR1 and 60 s, Flux's and Slurm's defaults.
//!
//! The rule that sends it (when, to which shells, the eventlog's `signal` event) is the job manager's
//! (`vigil-core`, `jobs/timers.rs`); this file only reads and checks the spelling.

use serde_json::{json, Value};

/// The shell option that holds a job's warning signal.
pub const SIGNAL_KEY: &str = "signal";

/// Signal sent when `--signal` names none: SIGUSR1 (10 on Linux).
pub const DEFAULT_WARN_SIGNUM: i32 = 10;
/// Seconds before the time limit when `--signal` names no time: 60.
pub const DEFAULT_WARN_TIMELEFT: f64 = 60.0;

/// Linux's signal names, numbered from 1 (`SIGHUP`) to 31 (`SIGSYS`), as `kill -l` lists them.
const NAMES: [&str; 31] = [
    "HUP", "INT", "QUIT", "ILL", "TRAP", "ABRT", "BUS", "FPE", "KILL", "USR1", "SEGV", "USR2", "PIPE", "ALRM", "TERM",
    "STKFLT", "CHLD", "CONT", "STOP", "TSTP", "TTIN", "TTOU", "URG", "XCPU", "XFSZ", "VTALRM", "PROF", "WINCH", "IO",
    "PWR", "SYS",
];

/// The highest signal number (`SIGRTMAX` on Linux).
const MAX_SIGNUM: i32 = 64;

/// A signal given by name (`USR1`, `SIGUSR1`, any case) or number (1 to 64), as its Linux number.
///
/// # Errors
/// `unknown signal "FOO" (a name such as USR1 or SIGTERM, or a number from 1 to 64)`.
pub fn signal_number(s: &str) -> Result<i32, String> {
    let t = s.trim();
    if let Ok(n) = t.parse::<i32>() {
        return if (1..=MAX_SIGNUM).contains(&n) { Ok(n) } else { Err(unknown_signal(s)) };
    }
    let up = t.to_ascii_uppercase();
    let bare = up.strip_prefix("SIG").unwrap_or(&up);
    match NAMES.iter().position(|n| *n == bare) {
        Some(i) => Ok(i as i32 + 1),
        None => Err(unknown_signal(s)),
    }
}

fn unknown_signal(s: &str) -> String {
    format!("unknown signal {s:?} (a name such as USR1 or SIGTERM, or a number from 1 to {MAX_SIGNUM})")
}

/// `SIGUSR1` for 10; `signal 40` for a number without a name (real-time signals).
pub fn signal_label(signum: i32) -> String {
    match usize::try_from(signum).ok().and_then(|n| n.checked_sub(1)).and_then(|i| NAMES.get(i)) {
        Some(n) => format!("SIG{n}"),
        None => format!("signal {signum}"),
    }
}

/// Send `signum` to the job's tasks `timeleft` seconds before its time limit.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WarnSignal {
    /// Signal number (1 to 64).
    pub signum: i32,
    /// Seconds before the time limit, finite and > 0.
    pub timeleft: f64,
}

impl Default for WarnSignal {
    /// SIGUSR1, 60 s before the limit.
    fn default() -> WarnSignal {
        WarnSignal { signum: DEFAULT_WARN_SIGNUM, timeleft: DEFAULT_WARN_TIMELEFT }
    }
}

impl WarnSignal {
    /// The command line's `SIG@TIME` (Flux's and Slurm's `--signal`): `SIG` a name or number, `TIME` an RFC 23
    /// duration (`90s`, `2m`; a bare number is seconds); either may be left out (`USR2`, `@5m`, and the empty
    /// string are [`WarnSignal::default`]'s parts for what is missing). Slurm's `R:` and `B:` prefixes are not
    /// taken.
    ///
    /// # Errors
    /// Saying which part is wrong (`unknown signal ...`, `TIME "x": ...`).
    pub fn parse(s: &str) -> Result<WarnSignal, String> {
        let (sig, time) = match s.split_once('@') {
            Some((a, b)) => (a.trim(), Some(b.trim())),
            None => (s.trim(), None),
        };
        let mut w = WarnSignal::default();
        if !sig.is_empty() {
            w.signum = signal_number(sig)?;
        }
        if let Some(t) = time {
            w.timeleft = crate::duration::parse_duration_secs(t).map_err(|e| format!("TIME {t:?}: {e}"))?;
            if !(w.timeleft.is_finite() && w.timeleft > 0.0) {
                return Err(format!("TIME {t:?}: must be a finite time > 0 before the time limit"));
            }
        }
        Ok(w)
    }

    /// The shell option's value (`{"signum": N, "timeleft": SECONDS}`).
    pub fn to_value(&self) -> Value {
        json!({"signum": self.signum, "timeleft": self.timeleft})
    }

    /// The shell option's value read back: `{"signum"?: N, "timeleft"?: SECONDS}` (each key optional), or
    /// `true` / `1` for both defaults (`-o signal`), as Flux's shell takes it.
    ///
    /// # Errors
    /// Naming the key: `signum: ...`, `timeleft: ...`, or the shape expected.
    pub fn from_value(v: &Value) -> Result<WarnSignal, String> {
        let mut w = WarnSignal::default();
        match v {
            Value::Bool(true) => Ok(w),
            Value::Number(n) if n.as_u64() == Some(1) => Ok(w),
            Value::String(s) => WarnSignal::parse(s),
            Value::Object(m) => {
                for k in m.keys() {
                    if k != "signum" && k != "timeleft" {
                        return Err(format!("{k}: unknown key (known: signum, timeleft)"));
                    }
                }
                if let Some(s) = m.get("signum") {
                    w.signum = match s {
                        Value::Number(n) => n
                            .as_i64()
                            .and_then(|n| i32::try_from(n).ok())
                            .filter(|n| (1..=MAX_SIGNUM).contains(n))
                            .ok_or_else(|| format!("signum: must be a signal number from 1 to {MAX_SIGNUM}"))?,
                        Value::String(s) => signal_number(s).map_err(|e| format!("signum: {e}"))?,
                        _ => return Err(format!("signum: must be a signal number from 1 to {MAX_SIGNUM}")),
                    };
                }
                if let Some(t) = m.get("timeleft") {
                    w.timeleft = match t {
                        Value::Number(n) => n.as_f64().unwrap_or(f64::NAN),
                        Value::String(s) => {
                            crate::duration::parse_duration_secs(s).map_err(|e| format!("timeleft: {e}"))?
                        }
                        _ => f64::NAN,
                    };
                    if !(w.timeleft.is_finite() && w.timeleft > 0.0) {
                        return Err("timeleft: must be a finite number of seconds > 0".into());
                    }
                }
                Ok(w)
            }
            _ => Err("must be {signum, timeleft} (a signal number, seconds before the time limit)".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn flux_and_slurm_spellings() {
        let p = |s: &str| WarnSignal::parse(s);
        assert_eq!(p("USR1@60").unwrap(), WarnSignal { signum: 10, timeleft: 60.0 });
        assert_eq!(p("SIGTERM@2m").unwrap(), WarnSignal { signum: 15, timeleft: 120.0 });
        assert_eq!(p("usr2").unwrap(), WarnSignal { signum: 12, timeleft: 60.0 });
        assert_eq!(p("@5m").unwrap(), WarnSignal { signum: 10, timeleft: 300.0 });
        assert_eq!(p("").unwrap(), WarnSignal::default());
        assert_eq!(p("40@1s").unwrap(), WarnSignal { signum: 40, timeleft: 1.0 });
        assert!(p("FOO@60").unwrap_err().starts_with("unknown signal \"FOO\""));
        assert!(p("0@60").unwrap_err().starts_with("unknown signal"));
        assert!(p("65").unwrap_err().starts_with("unknown signal"));
        assert!(p("USR1@soon").unwrap_err().starts_with("TIME \"soon\""));
        assert!(p("USR1@0").unwrap_err().contains("> 0"));
        assert!(p("USR1@inf").unwrap_err().contains("finite"));
    }

    #[test]
    fn shell_option_forms() {
        let f = WarnSignal::from_value;
        assert_eq!(f(&json!(true)).unwrap(), WarnSignal::default());
        assert_eq!(f(&json!({"signum": 12})).unwrap(), WarnSignal { signum: 12, timeleft: 60.0 });
        assert_eq!(f(&json!({"timeleft": 5})).unwrap(), WarnSignal { signum: 10, timeleft: 5.0 });
        assert_eq!(f(&json!("TERM@10s")).unwrap(), WarnSignal { signum: 15, timeleft: 10.0 });
        assert!(f(&json!({"signum": 99})).unwrap_err().starts_with("signum:"));
        assert!(f(&json!({"timeleft": -1})).unwrap_err().starts_with("timeleft:"));
        assert!(f(&json!({"sig": 1})).unwrap_err().starts_with("sig: unknown key"));
        assert!(f(&json!([1])).is_err());
        assert_eq!(signal_label(10), "SIGUSR1");
        assert_eq!(signal_label(40), "signal 40");
    }

    proptest! {
        #[test]
        fn parse_never_panics_and_round_trips(s in "\\PC{0,24}") {
            if let Ok(w) = WarnSignal::parse(&s) {
                prop_assert!((1..=64).contains(&w.signum));
                prop_assert!(w.timeleft.is_finite() && w.timeleft > 0.0);
                prop_assert_eq!(WarnSignal::from_value(&w.to_value()).unwrap(), w);
            }
        }

        #[test]
        fn every_name_and_number_reads_back(n in 1i32..=64, sig in proptest::bool::ANY, secs in 1u32..100_000) {
            let label = signal_label(n);
            let name = if n <= 31 && sig { label.clone() } else { n.to_string() };
            let w = WarnSignal::parse(&format!("{name}@{secs}s")).unwrap();
            prop_assert_eq!(w, WarnSignal { signum: n, timeleft: f64::from(secs) });
        }
    }
}
