//! Options that say when and in which order a job is taken from the queue, shared by `run`, `submit`, `batch` and
//! `alloc`: its name (`--job-name`, Slurm's `-J`, kept as Flux keeps it in `attributes.system.job.name`) and what
//! it waits for (`--dependency`, RFC 26 objects in `attributes.system.dependencies`).

use clap::Args;
use serde_json::{json, Value};

/// Queue options of `run`, `submit`, `batch` and `alloc`.
#[derive(Args, Debug, Clone, Default)]
pub struct QueueOpts {
    /// The job's name, shown by `vigil jobs` (NAME) and matched by `vigil jobs --name` (default: the command's
    /// basename; for `batch`, the script's). Kept in the jobspec as `attributes.system.job.name`, as Flux does.
    #[arg(short = 'J', long = "job-name", visible_alias = "name", value_name = "NAME")]
    pub job_name: Option<String>,
    /// Wait for other jobs (repeatable; all must hold): SCHEME:JOBID[:JOBID...][,SCHEME:JOBID...], with SCHEME
    /// `afterok` (the job completed), `afterany` (it ended), `afternotok` (it failed, or was canceled),
    /// `afterexcept` (it ended with an exception), `after` (it started); or `singleton` (every earlier job of
    /// yours with this name has ended). A dependency that can never hold ends the job (exception `dependency`).
    #[arg(short = 'd', long = "dependency", value_name = "SCHEME:JOBID")]
    pub dependency: Vec<String>,
    /// RFC 21 urgency, 0 to 31 (default 16): pending jobs start in order of urgency, then of submission; 0 holds the
    /// job (`vigil job release ID` lets it go), 31 expedites it. More than 16 is the instance owner's only.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(0..=31))]
    pub urgency: Option<u32>,
    /// Submit the job held (urgency 0), as Slurm's `--hold` and Flux's `--urgency=hold`: it stays pending until
    /// `vigil job release ID`.
    #[arg(long, conflicts_with = "urgency")]
    pub hold: bool,
    /// Not before TIME: +DURATION (+30s, +5m, +2h), @EPOCH, or a UTC time (2026-12-07T05:00:00Z, "2026-12-07
    /// 05:00"), as Flux's --begin-time (an RFC 26 `begin-time` dependency). A time already past is refused.
    #[arg(long, value_name = "TIME")]
    pub begin_time: Option<String>,
    /// Send signal SIG to the job's tasks TIME before its time limit, once (Flux's and Slurm's `--signal`): SIG a
    /// name (USR1, SIGTERM) or number, TIME an RFC 23 duration (90s, 5m; a bare number is seconds). Either may be
    /// left out; `--signal` alone is SIGUSR1@60. TIME must be less than the time limit. Recorded in the eventlog
    /// (`signal`) when sent.
    #[arg(
        long,
        value_name = "SIG@TIME",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = SIGNAL_DEFAULT
    )]
    pub signal: Option<String>,
}

/// What a bare `--signal` means (no value after `=`): Flux's and Slurm's default.
pub(crate) const SIGNAL_DEFAULT: &str = "SIGUSR1@60";

/// Whether `word` names a program or a script: a path that exists (a file here too), or a name found in `$PATH`.
fn is_program(word: &str) -> bool {
    if word.contains('/') || std::path::Path::new(word).is_file() {
        return std::path::Path::new(word).exists();
    }
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| !d.as_os_str().is_empty() && d.join(word).is_file()))
}

/// `--signal` followed by its value after a space (`--signal USR1@60 script`, as Slurm and Flux users type it):
/// clap takes a bare `--signal` (the default, [`SIGNAL_DEFAULT`]) and makes the value the first word of the
/// command. When `bare` (the command line held `--signal` alone) and the command's first word reads as a
/// `--signal` value and is no program, it is taken as the value. Returns a note to print when that word has no
/// `@` (a signal name alone, `USR1`: it could have been meant as the command).
///
/// # Errors
/// The word is all the command there is (`vigil batch --signal USR1`): naming both readings.
pub(crate) fn spaced_signal(
    q: &mut QueueOpts,
    command: &mut Vec<String>,
    bare: bool,
) -> Result<Option<String>, String> {
    if !bare || q.signal.as_deref() != Some(SIGNAL_DEFAULT) {
        return Ok(None);
    }
    let Some(word) = command.first().cloned() else { return Ok(None) };
    if crate::jobspec::WarnSignal::parse(&word).is_err() || is_program(&word) {
        return Ok(None);
    }
    if command.len() == 1 {
        return Err(format!(
            "--signal {word}: nothing follows {word:?}, which would be the command; write --signal={word} before the \
             command (or --signal -- {word} to run a program of that name after a bare --signal)"
        ));
    }
    command.remove(0);
    q.signal = Some(word.clone());
    Ok((!word.contains('@')).then(|| {
        format!(
            "vigil: --signal {word}: taken as --signal={word} (the warning signal), not as the command; \
             the command is {:?}",
            command[0]
        )
    }))
}

/// Slurm's prefix of a `--signal` value (`B:USR1@60`, `R:`, `RB:`): the letters before the `:`, if they are only
/// `R` and `B` (no signal name or time holds a `:`).
fn slurm_prefix(s: &str) -> Option<&str> {
    let (p, _) = s.trim_start().split_once(':')?;
    (!p.is_empty() && p.chars().all(|c| c == 'R' || c == 'B')).then_some(p)
}

/// Whether the command line (`args`, without the program name) gives `--signal` with no `=`, before any `--`.
pub(crate) fn signal_bare(args: impl IntoIterator<Item = String>) -> bool {
    args.into_iter().take_while(|a| a != "--").any(|a| a == "--signal")
}

/// The `after*` schemes `--dependency` takes, each with the jobs it names.
const AFTER_SCHEMES: &[&str] = &["after", "afterany", "afterok", "afternotok", "afterexcept"];

/// `--dependency` values as RFC 26 dependency objects, in order: `afterok:ID:ID,afterany:ID` (Slurm's list,
/// Flux's `afterok:ID`) and `singleton`; each job id checked to be one (any RFC 19 form [`crate::jobs::JobId::parse`]
/// reads), and sent as f58.
///
/// # Errors
/// `--dependency=afterfoo:f1: unknown dependency scheme "afterfoo" (known: ...)`, and the like.
pub(crate) fn parse_dependencies(list: &[String]) -> Result<Vec<Value>, String> {
    let mut out = Vec::new();
    for arg in list {
        let bad = |why: String| format!("--dependency={arg}: {why}");
        for part in arg.split(',') {
            // RFC 26's URI form: `scheme:value?key=val[&key=val...]` (or `;`), the pairs extra keys of the object.
            // A `?` followed by anything else is Slurm's "any one of them", which is not supported.
            let (part, extra) = match part.split_once('?') {
                None => (part, serde_json::Map::new()),
                Some((head, query)) => match uri_query(query) {
                    Some(extra) => (head, extra),
                    None if query.contains(':') || query.is_empty() => {
                        return Err(bad("`?` (any one of them) is not supported: give dependencies that must all \
                                        hold, joined by `,`"
                            .into()))
                    }
                    None => {
                        return Err(bad(format!("{query:?}: expected key=value pairs joined by `&` or `;` (RFC 26)")))
                    }
                },
            };
            let with_extra = |mut dep: Value| {
                for (k, v) in &extra {
                    dep[k] = v.clone();
                }
                dep
            };
            let mut fields = part.split(':');
            let scheme = fields.next().unwrap_or("").trim();
            let ids: Vec<&str> = fields.map(str::trim).collect();
            match scheme {
                "singleton" if ids.is_empty() => out.push(with_extra(json!({"scheme": "singleton", "value": ""}))),
                "singleton" => return Err(bad("singleton takes no job id".into())),
                s if AFTER_SCHEMES.contains(&s) => {
                    if ids.is_empty() || ids.iter().any(|i| i.is_empty()) {
                        return Err(bad(format!("{s} needs a job id: {s}:JOBID")));
                    }
                    for id in ids {
                        let parsed = crate::jobs::JobId::parse(id)
                            .map_err(|e| bad(format!("{id:?} is not a job id: {}", e.1)))?;
                        // `afterok:A:A` (or a script repeating the line) is one dependency, as Slurm takes it.
                        let dep = with_extra(json!({"scheme": s, "value": parsed.f58()}));
                        if !out.contains(&dep) {
                            out.push(dep);
                        }
                    }
                }
                "" => return Err(bad("empty dependency".into())),
                s => {
                    return Err(bad(format!(
                        "unknown dependency scheme {s:?} (known: {}, singleton)",
                        AFTER_SCHEMES.join(", ")
                    )))
                }
            }
        }
    }
    Ok(out)
}

/// An RFC 26 URI query, `key=val[&key=val...]` (`;` also delimits), as the extra keys of a dependency object:
/// `None` unless every pair has a non-empty key, other than `scheme` and `value`, and an `=`.
fn uri_query(q: &str) -> Option<serde_json::Map<String, Value>> {
    let mut m = serde_json::Map::new();
    for pair in q.split(['&', ';']) {
        let (k, v) = pair.split_once('=')?;
        if k.is_empty() || k == "scheme" || k == "value" || k.contains(':') {
            return None;
        }
        m.insert(k.to_string(), Value::String(v.to_string()));
    }
    Some(m)
}

impl QueueOpts {
    /// The urgency to submit with, if one was given (`--hold` is 0).
    pub(crate) fn urgency(&self) -> Option<u32> {
        if self.hold {
            Some(0)
        } else {
            self.urgency
        }
    }

    /// Every RFC 26 dependency object the options ask for: `--dependency`, then `--begin-time` (from `now`,
    /// seconds since the epoch).
    ///
    /// # Errors
    /// Naming the option, as [`parse_dependencies`] and [`parse_begin_time`].
    pub(crate) fn dependencies(&self, now: f64) -> Result<Vec<Value>, String> {
        let mut deps = parse_dependencies(&self.dependency)?;
        if let Some(t) = &self.begin_time {
            deps.push(json!({"scheme": "begin-time", "value": parse_begin_time(t, now)?}));
        }
        Ok(deps)
    }

    /// Take a batch script's directives (`dir`) where the command line gave nothing: where both give an option,
    /// the command line wins (as sbatch's options override its `#SBATCH` lines); lists are joined, the script's
    /// first.
    pub(crate) fn merge(&mut self, dir: QueueOpts) {
        fn one<T>(cli: &mut Option<T>, dir: Option<T>) {
            if cli.is_none() {
                *cli = dir;
            }
        }
        one(&mut self.job_name, dir.job_name);
        one(&mut self.urgency, dir.urgency);
        one(&mut self.begin_time, dir.begin_time);
        one(&mut self.signal, dir.signal);
        self.hold |= dir.hold;
        // Lists: the script's first.
        let mut deps = dir.dependency;
        deps.append(&mut self.dependency);
        self.dependency = deps;
    }

    /// The warning signal asked for (`--signal`), checked against the time limit given (`-t`, seconds; `None`:
    /// none given, the instance's default is checked by the job manager).
    ///
    /// # Errors
    /// `--signal=...: ...` naming what is wrong.
    pub(crate) fn warning(&self, limit: Option<f64>) -> Result<Option<crate::jobspec::WarnSignal>, String> {
        let Some(s) = &self.signal else { return Ok(None) };
        if let Some(p) = slurm_prefix(s) {
            return Err(if p.contains('R') {
                format!(
                    "--signal={s}: R: (Slurm's: the job may overlap a reservation with MaxStartDelay) has no meaning \
                     here: Vigil has no reservations; leave it out"
                )
            } else {
                format!(
                    "--signal={s}: B: signals only a batch script, and this job has none (B: is for vigil batch \
                     and alloc); its tasks get the signal: leave B: out"
                )
            });
        }
        let w = crate::jobspec::WarnSignal::parse(s).map_err(|e| format!("--signal={s}: {e}"))?;
        if let Some(l) = limit.filter(|l| *l > 0.0) {
            if w.timeleft >= l {
                return Err(format!(
                    "--signal={s}: {} s before the time limit is not less than the time limit itself (-t, {l} s)",
                    w.timeleft
                ));
            }
        }
        Ok(Some(w))
    }

    /// A batch or alloc job's `--signal`: Slurm's `B:` prefix (signal the batch script only) taken off, as that is
    /// where Vigil sends a batch or alloc job's warning anyway (its shell hands it to the job's brokers, rank 0 to
    /// the initial program, no job of the instance gets it). `R:` is left for [`QueueOpts::warning`] to refuse.
    pub(crate) fn batch_signal(&mut self) {
        if let Some(s) = &self.signal {
            if slurm_prefix(s) == Some("B") {
                self.signal = Some(s[2..].to_string());
            }
        }
    }

    /// The job name given, checked: not blank, one line.
    ///
    /// # Errors
    /// `--job-name ...: ...` naming what is wrong.
    pub(crate) fn name(&self) -> Result<Option<&str>, String> {
        match self.job_name.as_deref() {
            Some(n) if n.trim().is_empty() || n.chars().any(char::is_control) => Err(format!(
                "--job-name {n:?}: a job name must be non-blank, without control characters (a newline, a tab)"
            )),
            n => Ok(n),
        }
    }
}

/// `--begin-time` as seconds since the epoch: `+DURATION` from `now` (RFC 23: `+30s`, `+5m`, `+1h`; Flux's
/// `--begin-time=+FSD`), `@SECONDS` since the epoch, or a UTC date and time (`2026-12-07T05:00:00Z`, `2026-12-07
/// 05:00`, RFC 3339 in UTC). A time already past is refused.
///
/// # Errors
/// `--begin-time=...: ...` naming what is wrong.
pub(crate) fn parse_begin_time(s: &str, now: f64) -> Result<f64, String> {
    let bad = |why: String| format!("--begin-time={s}: {why}");
    let t = s.trim();
    let at = if let Some(d) = t.strip_prefix('+') {
        let secs = crate::duration::parse_duration_secs(d).map_err(|e| bad(e.to_string()))?;
        if !secs.is_finite() {
            return Err(bad("a begin time must be finite".into()));
        }
        now + secs
    } else {
        parse_time(t).ok_or_else(|| {
            bad("expected +DURATION (+30s, +5m, +2h), @EPOCH, or a UTC time such as 2026-12-07T05:00:00Z or \
                 \"2026-12-07 05:00\""
                .into())
        })?
    };
    if at < now - 1.0 {
        return Err(bad(format!("that time has passed ({:.0} s ago)", now - at)));
    }
    Ok(at)
}

/// An absolute time as seconds since the epoch: `@SECONDS`, or a UTC date and time (`2026-12-07T05:00:00Z`,
/// `2026-12-07 05:00`, RFC 3339 in UTC, from 1970). `None` if it is none of these.
pub(crate) fn parse_time(t: &str) -> Option<f64> {
    if let Some(e) = t.strip_prefix('@') {
        return e.parse::<f64>().ok().filter(|v| v.is_finite());
    }
    let iso = if t.len() == 16 && t.as_bytes().get(10).is_some_and(|c| *c == b' ' || *c == b'T') {
        format!("{t}:00") // minutes without seconds
    } else {
        t.to_string()
    };
    let parsed = humantime::parse_rfc3339_weak(&iso).or_else(|_| humantime::parse_rfc3339(&iso)).ok()?;
    parsed.duration_since(std::time::UNIX_EPOCH).ok().map(|d| d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signal_value_after_a_space_is_taken_and_a_bare_signal_keeps_its_command() {
        let words = |w: &[&str]| w.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let bare = || QueueOpts { signal: Some(SIGNAL_DEFAULT.into()), ..Default::default() };
        // `--signal USR1@60 job.sh`: unambiguous, taken silently.
        let (mut q, mut cmd) = (bare(), words(&["USR1@60", "job.sh"]));
        assert_eq!(spaced_signal(&mut q, &mut cmd, true), Ok(None));
        assert_eq!((q.signal.as_deref(), cmd), (Some("USR1@60"), words(&["job.sh"])));
        // `--signal USR1 job.sh`: taken, and said.
        let (mut q, mut cmd) = (bare(), words(&["USR1", "job.sh"]));
        let note = spaced_signal(&mut q, &mut cmd, true).unwrap().expect("a note");
        assert!(note.contains("taken as --signal=USR1") && note.contains("\"job.sh\""), "{note}");
        assert_eq!(q.signal.as_deref(), Some("USR1"));
        // `--signal sleep 10`: a program: the default signal, the command as typed.
        let (mut q, mut cmd) = (bare(), words(&["sleep", "10"]));
        assert_eq!(spaced_signal(&mut q, &mut cmd, true), Ok(None));
        assert_eq!((q.signal.as_deref(), cmd.len()), (Some(SIGNAL_DEFAULT), 2));
        // `--signal=SIGUSR1@60 USR1 x` (not bare) is left alone; `--signal USR1` alone is refused.
        let (mut q, mut cmd) = (bare(), words(&["USR1", "x"]));
        assert_eq!(spaced_signal(&mut q, &mut cmd, false), Ok(None));
        let e = spaced_signal(&mut bare(), &mut words(&["USR1"]), true).unwrap_err();
        assert!(e.starts_with("--signal USR1: nothing follows"), "{e}");
        assert!(signal_bare(words(&["run", "--signal", "USR1", "x"])));
        assert!(!signal_bare(words(&["run", "--signal=USR1", "x"])) && !signal_bare(words(&["run", "--", "--signal"])));
    }

    #[test]
    fn a_job_name_is_one_line_of_text() {
        let q = |n: &str| QueueOpts { job_name: Some(n.into()), ..Default::default() };
        assert_eq!(q("first").name().unwrap(), Some("first"));
        assert!(q("").name().unwrap_err().starts_with("--job-name"));
        assert!(q("   ").name().unwrap_err().contains("non-blank"), "spaces alone show as no name");
        assert!(q("a\nb").name().unwrap_err().contains("control characters"));
        assert_eq!(QueueOpts::default().name().unwrap(), None);
    }

    #[test]
    fn dependencies_in_flux_and_slurm_spellings() {
        let p = |v: &[&str]| parse_dependencies(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        let deps = p(&["afterok:f2:3,afterany:f4", "singleton"]).unwrap();
        let schemes: Vec<&str> = deps.iter().map(|d| d["scheme"].as_str().unwrap()).collect();
        assert_eq!(schemes, ["afterok", "afterok", "afterany", "singleton"]);
        assert_eq!(deps[1]["value"], json!(crate::jobs::JobId(3).f58()), "a decimal id is sent as f58");
        let e = p(&["afterfoo:f2"]).unwrap_err();
        assert!(e.starts_with("--dependency=afterfoo:f2: unknown dependency scheme \"afterfoo\""), "{e}");
        let e = p(&["afterok:fx0l"]).unwrap_err();
        assert!(e.contains("\"fx0l\" is not a job id"), "{e}");
        assert!(p(&["afterok"]).unwrap_err().contains("needs a job id"));
        let e = p(&["afterok:f2?afterany:f3"]).unwrap_err();
        assert!(
            e.ends_with("`?` (any one of them) is not supported: give dependencies that must all hold, joined by `,`")
        );
        // RFC 26's URI form: the query's pairs are extra keys of the object (`&` or `;` between them).
        let q = p(&["afterany:ƒ2oLkTLb?type=out", "afterok:f3?a=1&b=;c=x=y"]).unwrap();
        assert_eq!(q[0], json!({"scheme": "afterany", "value": "f2oLkTLb", "type": "out"}));
        assert_eq!(q[1], json!({"scheme": "afterok", "value": "f3", "a": "1", "b": "", "c": "x=y"}));
        assert!(p(&["afterok:f2?afterany"]).unwrap_err().contains("expected key=value pairs"));
        assert!(p(&["afterok:f2?value=f3"]).unwrap_err().contains("expected key=value pairs"), "no overriding");
        // Any RFC 19 form of a job id is one, sent as f58.
        let forms = p(&["afterok:0x3", "afterok:0000.0000.0000.0004", "afterok:ƒ6"]).unwrap();
        let values: Vec<&str> = forms.iter().map(|d| d["value"].as_str().unwrap()).collect();
        assert_eq!(values, ["f4", "f5", "f6"]);
        let once = p(&["afterok:f2:f2", "afterok:f2"]).unwrap();
        assert_eq!(once, [json!({"scheme": "afterok", "value": "f2"})], "one dependency, however often named");
    }

    #[test]
    fn warning_signal_checked_against_the_time_limit() {
        use crate::jobspec::WarnSignal;
        let q = |s: &str| QueueOpts { signal: Some(s.into()), ..Default::default() };
        assert_eq!(q("USR2@30").warning(Some(60.0)), Ok(Some(WarnSignal { signum: 12, timeleft: 30.0 })));
        assert_eq!(q("SIGUSR1@60").warning(None), Ok(Some(WarnSignal::default())));
        let e = q("USR1@2m").warning(Some(60.0)).unwrap_err();
        assert!(e.starts_with("--signal=USR1@2m: 120 s before the time limit is not less"), "{e}");
        assert!(q("BOGUS@1").warning(None).unwrap_err().starts_with("--signal=BOGUS@1: unknown signal"));
        assert_eq!(QueueOpts::default().warning(Some(1.0)), Ok(None));
        // Slurm's prefixes: B: only on batch and alloc (taken off there), R: nowhere, each refusal naming it.
        let e = q("B:USR1@30").warning(Some(60.0)).unwrap_err();
        assert!(e.starts_with("--signal=B:USR1@30: B: signals only a batch script"), "{e}");
        for r in ["R:USR1", "RB:USR2@10", "BR:1"] {
            let e = q(r).warning(None).unwrap_err();
            assert!(e.contains("R: (Slurm's") && e.contains("no reservations"), "{e}");
        }
        let mut b = q("B:USR2@30");
        b.batch_signal();
        assert_eq!(b.warning(Some(60.0)), Ok(Some(WarnSignal { signum: 12, timeleft: 30.0 })));
        let mut r = q("RB:USR2@30");
        r.batch_signal();
        assert!(r.warning(None).unwrap_err().contains("no reservations"));
        assert!(q("b:USR1").warning(None).unwrap_err().contains("unknown signal"), "prefixes are upper case");
    }

    #[test]
    fn begin_times_relative_absolute_and_past() {
        let now = 1_800_000_000.0;
        assert_eq!(parse_begin_time("+30s", now), Ok(now + 30.0));
        assert_eq!(parse_begin_time("+5m", now), Ok(now + 300.0));
        assert_eq!(parse_begin_time("@1800000100", now), Ok(1_800_000_100.0));
        let t = parse_begin_time("2027-01-15T08:00:00Z", now).unwrap();
        assert_eq!(t, 1_800_000_000.0, "2027-01-15T08:00:00Z is 1.8e9 s since the epoch");
        assert_eq!(parse_begin_time("2027-01-15 08:00", now), Ok(t), "minutes without seconds, a space for T");
        let e = parse_begin_time("2020-01-01T00:00:00Z", now).unwrap_err();
        assert!(e.starts_with("--begin-time=2020-01-01T00:00:00Z: that time has passed"), "{e}");
        let e = parse_begin_time("tomorrow", now).unwrap_err();
        assert!(e.starts_with("--begin-time=tomorrow: expected +DURATION"), "{e}");
        assert!(parse_begin_time("+soon", now).unwrap_err().starts_with("--begin-time=+soon:"));
    }
}
