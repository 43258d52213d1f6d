//! What `vigil jobs` shows and picks: `--format` with named fields in Flux's `{field}` style ([`Format`]), and
//! the filters `--states` ([`States`]) and `--since` ([`parse_since`]). Pure functions over the rows
//! `job-manager.list` answers (the JSON of the job manager's `Job::info`), so they are tested without an instance.
//!
//! A format is text with fields in braces: `{id} {name:<16.16} {state}`. Each field may carry Python's (and
//! Flux's) alignment spec after a colon: `<` left, `>` right, `^` centred, then a width, then `.N` to cut the
//! value to N characters. `{{` and `}}` are literal braces. The header line gives each field its heading in the
//! same width (`--no-header` leaves it out). The fields are [`FIELDS`].

use serde_json::Value;

/// One field a format may name: its name, its heading, and what it says about a job (docs/queue.md's table
/// says it in words; a test holds the two together).
struct Field {
    name: &'static str,
    header: &'static str,
    get: fn(&Value, &Ctx<'_>) -> String,
}

/// What a field needs besides the job: the time now (seconds since the epoch) and a uid's login name.
pub(crate) struct Ctx<'a> {
    /// Now, seconds since the epoch (a running job's run time counts to it).
    pub(crate) now: f64,
    /// The login name of a uid (its number when it has none).
    pub(crate) user: &'a dyn Fn(u32) -> String,
}

fn s(j: &Value, k: &str) -> String {
    match &j[k] {
        Value::String(v) => v.clone(),
        Value::Null => String::new(),
        v => v.to_string(),
    }
}

fn time(t: Option<f64>) -> String {
    t.and_then(|t| std::time::Duration::try_from_secs_f64(t).ok())
        .map(|d| humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + d).to_string())
        .unwrap_or_default()
}

/// How long its tasks ran: to their end (as their node saw it), else to the job's end, else now; `-` if never.
fn runtime(j: &Value, now: f64) -> String {
    let t_end = j["t_finish"].as_f64().or_else(|| j["t_inactive"].as_f64()).unwrap_or(now);
    j["t_run"].as_f64().map(|t| super::fmt_secs(t_end - t)).unwrap_or_else(|| "-".into())
}

/// Seconds since the epoch as an ISO 8601 local time with its offset, `2026-12-07T06:00:00+01:00` (`None` if the
/// C library cannot say).
pub(crate) fn local_iso8601(secs: i64) -> Option<String> {
    let t = libc::time_t::try_from(secs).ok()?;
    // SAFETY: `tm` is plain old data (integers and a pointer that may be null): all zeroes is a valid value.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: localtime_r reads `t` and writes only into `tm`, both live for the call; it is thread-safe.
    if unsafe { libc::localtime_r(&t, &mut tm) }.is_null() {
        return None;
    }
    let off = tm.tm_gmtoff;
    let (sign, a) = (if off < 0 { '-' } else { '+' }, off.abs());
    Some(format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}{sign}{:02}:{:02}",
        i64::from(tm.tm_year) + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec,
        a / 3600,
        a / 60 % 60
    ))
}

/// A pending reason as `vigil` shows it: the begin time the job manager gives in UTC (`begin-time: not before
/// 2026-12-07T05:00:00Z (in 4m05s)`) in local time with its offset (`... not before 2026-12-07T06:00:00+01:00
/// (in 4m05s)`); any other reason as it is.
pub(crate) fn local_reason(r: &str) -> String {
    const MARK: &str = "not before ";
    let Some(at) = r.find(MARK).map(|i| i + MARK.len()) else { return r.to_string() };
    let end = r[at..].find(' ').map_or(r.len(), |i| at + i);
    let local = humantime::parse_rfc3339(&r[at..end])
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .and_then(|d| local_iso8601(i64::try_from(d.as_secs()).ok()?));
    match local {
        Some(l) => format!("{}{l}{}", &r[..at], &r[end..]),
        None => r.to_string(),
    }
}

/// A byte count in MiB, as `vigil job info` shows peak memory (`64.0M`).
fn mib(b: u64) -> String {
    format!("{:.1}M", b as f64 / f64::from(1u32 << 20))
}

/// Every letter [`short_state`] prints, with the state or result it stands for (the README's ST legend says each).
#[cfg(test)]
const SHORT_STATES: &[(&str, &str)] = &[
    ("N", "new"),
    ("D", "depend"),
    ("P", "priority"),
    ("S", "sched"),
    ("R", "run"),
    ("C", "cleanup"),
    ("CD", "completed"),
    ("F", "failed"),
    ("CA", "canceled"),
    ("TO", "timeout"),
];

/// Flux's single-letter states, a result's two letters once inactive.
fn short_state(j: &Value) -> &'static str {
    match (j["state"].as_str().unwrap_or(""), j["result"].as_str()) {
        ("NEW", _) => "N",
        ("DEPEND", _) => "D",
        ("PRIORITY", _) => "P",
        ("SCHED", _) => "S",
        ("RUN", _) => "R",
        ("CLEANUP", _) => "C",
        (_, Some("COMPLETED")) => "CD",
        (_, Some("CANCELED")) => "CA",
        (_, Some("TIMEOUT")) => "TO",
        _ => "F",
    }
}

/// What a job that went on without some of its nodes lost (`, lost node3`), as Flux's listing notes a job's
/// non-fatal exceptions; empty when it lost none.
fn lost_nodes_note(j: &Value) -> String {
    match j["lost_nodelist"].as_str().filter(|l| !l.is_empty()) {
        Some(l) => format!(", lost {l}"),
        None => String::new(),
    }
}

/// The INFO column: how an inactive job ended, a running instance's nodes and URI, why a pending job waits.
fn info(j: &Value, now: f64) -> String {
    match j["state"].as_str() {
        Some("INACTIVE") => match j["exception"].as_object() {
            Some(e) => format!(
                "{}: {}",
                e.get("type").and_then(Value::as_str).unwrap_or(""),
                e.get("note").and_then(Value::as_str).unwrap_or("")
            ),
            None => format!("exit {}{}", j["exit_code"].as_i64().unwrap_or(0), lost_nodes_note(j)),
        },
        Some("RUN") if j["uri"].is_string() => {
            let (nodes, uri) = (j["nodelist"].as_str().unwrap_or(""), j["uri"].as_str().unwrap_or(""));
            format!("{nodes} {uri}{}", lost_nodes_note(j))
        }
        Some("SCHED" | "DEPEND") => {
            let why = local_reason(j["reason_pending"].as_str().unwrap_or(""));
            // The job holding the reservation: when it is expected to start (Flux's `eta:`).
            match j.pointer("/annotations/sched/t_estimate").and_then(Value::as_f64) {
                Some(t) => format!("eta:{} {why}", super::fmt_secs((t - now).max(0.0))),
                None => why.to_string(),
            }
        }
        _ => j["nodelist"].as_str().unwrap_or("").to_string(),
    }
}

/// Every field `--format` knows, in the order `vigil jobs --help` lists them.
const FIELDS: &[Field] = &[
    Field { name: "id", header: "JOBID", get: |j, _| s(j, "id_f58") },
    Field { name: "id.f58", header: "JOBID", get: |j, _| s(j, "id_f58") },
    Field { name: "id.dec", header: "JOBID", get: |j, _| s(j, "id") },
    Field {
        name: "id.hex",
        header: "JOBID",
        get: |j, _| j["id"].as_u64().map(|i| format!("{i:#018x}")).unwrap_or_default(),
    },
    Field { name: "name", header: "NAME", get: |j, _| s(j, "name") },
    Field {
        name: "user",
        header: "USER",
        get: |j, c| j["userid"].as_u64().map(|u| (c.user)(u as u32)).unwrap_or_default(),
    },
    Field { name: "userid", header: "UID", get: |j, _| s(j, "userid") },
    Field { name: "state", header: "STATE", get: |j, _| s(j, "state") },
    Field { name: "state_single", header: "ST", get: |j, _| short_state(j).into() },
    Field { name: "result", header: "RESULT", get: |j, _| s(j, "result") },
    Field {
        name: "status",
        header: "STATUS",
        get: |j, _| j["result"].as_str().or_else(|| j["state"].as_str()).unwrap_or("").into(),
    },
    Field { name: "urgency", header: "URG", get: |j, _| s(j, "urgency") },
    Field {
        name: "nnodes",
        header: "NNODES",
        get: |j, _| j["nnodes"].as_u64().map_or_else(|| "-".into(), |n| n.to_string()),
    },
    Field { name: "ntasks", header: "NTASKS", get: |j, _| s(j, "ntasks") },
    Field { name: "nodelist", header: "NODELIST", get: |j, _| s(j, "nodelist") },
    Field { name: "ranks", header: "RANKS", get: |j, _| s(j, "ranks") },
    Field { name: "runtime", header: "TIME", get: |j, c| runtime(j, c.now) },
    Field {
        name: "duration",
        header: "LIMIT",
        get: |j, _| j["duration"].as_f64().map_or_else(|| "-".into(), super::fmt_secs),
    },
    Field { name: "t_submit", header: "SUBMITTED", get: |j, _| time(j["t_submit"].as_f64()) },
    Field { name: "t_run", header: "STARTED", get: |j, _| time(j["t_run"].as_f64()) },
    Field { name: "t_inactive", header: "ENDED", get: |j, _| time(j["t_inactive"].as_f64()) },
    Field { name: "returncode", header: "RC", get: |j, _| s(j, "exit_code") },
    Field {
        name: "exception.type",
        header: "EXCEPTION",
        get: |j, _| j.pointer("/exception/type").and_then(Value::as_str).unwrap_or("").into(),
    },
    Field {
        name: "exception.note",
        header: "NOTE",
        get: |j, _| j.pointer("/exception/note").and_then(Value::as_str).unwrap_or("").into(),
    },
    Field { name: "reason", header: "REASON", get: |j, _| local_reason(&s(j, "reason_pending")) },
    Field { name: "requeues", header: "REQ", get: |j, _| s(j, "requeues") },
    Field {
        name: "cputime",
        header: "CPUTIME",
        get: |j, _| {
            j.pointer("/usage/cpu_usec")
                .and_then(Value::as_u64)
                .map_or_else(|| "-".into(), |u| super::fmt_secs(u as f64 / 1e6))
        },
    },
    Field {
        name: "maxmem",
        header: "MAXMEM",
        get: |j, _| j.pointer("/usage/memory_peak").and_then(Value::as_u64).map_or_else(|| "-".into(), mib),
    },
    Field { name: "info", header: "INFO", get: |j, c| info(j, c.now) },
];

/// The table `vigil jobs` prints without `--format`.
pub(crate) const DEFAULT_FORMAT: &str =
    "{id:>14} {user:>8} {name:<12.12} {state_single:>2} {ntasks:>6} {nnodes:>6} {runtime:>8} {info}";

#[derive(Debug, Clone, PartialEq)]
enum Part {
    Text(String),
    Field { field: usize, align: Option<char>, width: usize, cut: Option<usize> },
}

/// A parsed `--format`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Format(Vec<Part>);

impl Format {
    /// Parse `text` (see the module doc).
    ///
    /// # Errors
    /// `unknown field {foo}` (with the known ones), an unclosed `{`, a lone `}`, a bad spec.
    pub(crate) fn parse(text: &str) -> Result<Format, String> {
        let mut parts = Vec::new();
        let mut lit = String::new();
        let mut chars = text.char_indices().peekable();
        while let Some((i, c)) = chars.next() {
            match c {
                '{' if chars.peek().is_some_and(|(_, n)| *n == '{') => {
                    chars.next();
                    lit.push('{');
                }
                '}' if chars.peek().is_some_and(|(_, n)| *n == '}') => {
                    chars.next();
                    lit.push('}');
                }
                '}' => return Err(format!("a lone '}}' at character {i} (write '}}}}' for a brace)")),
                '{' => {
                    let rest = &text[i + 1..];
                    let end = rest.find('}').ok_or_else(|| format!("'{{' at character {i} is never closed"))?;
                    let inner = &rest[..end];
                    for _ in 0..inner.chars().count() + 1 {
                        chars.next();
                    }
                    if !lit.is_empty() {
                        parts.push(Part::Text(std::mem::take(&mut lit)));
                    }
                    parts.push(parse_field(inner)?);
                }
                c => lit.push(c),
            }
        }
        if !lit.is_empty() {
            parts.push(Part::Text(lit));
        }
        Ok(Format(parts))
    }

    fn render_with(&self, value: impl Fn(&Field) -> String) -> String {
        let mut out = String::new();
        for p in &self.0 {
            match p {
                Part::Text(t) => out.push_str(t),
                Part::Field { field, align, width, cut } => {
                    let mut v = value(&FIELDS[*field]);
                    if let Some(n) = cut {
                        v = v.chars().take(*n).collect();
                    }
                    let pad = width.saturating_sub(v.chars().count());
                    let (l, r) = match align {
                        Some('>') => (pad, 0),
                        Some('^') => (pad / 2, pad - pad / 2),
                        _ => (0, pad),
                    };
                    out.extend(std::iter::repeat_n(' ', l));
                    out.push_str(&v);
                    out.extend(std::iter::repeat_n(' ', r));
                }
            }
        }
        out.trim_end().to_string()
    }

    /// The header line: each field's heading, in its field's width.
    pub(crate) fn header(&self) -> String {
        self.render_with(|f| f.header.to_string())
    }

    /// Job `j`'s line (trailing spaces cut).
    pub(crate) fn line(&self, j: &Value, ctx: &Ctx<'_>) -> String {
        self.render_with(|f| (f.get)(j, ctx))
    }
}

/// `name[:[align]width[.cut]]`.
fn parse_field(inner: &str) -> Result<Part, String> {
    let (name, spec) = inner.split_once(':').unwrap_or((inner, ""));
    let name = name.trim();
    let field = FIELDS.iter().position(|f| f.name == name).ok_or_else(|| {
        format!("unknown field {{{name}}} (known: {})", FIELDS.iter().map(|f| f.name).collect::<Vec<_>>().join(", "))
    })?;
    let bad = || format!("{{{inner}}}: a spec is [<|>|^][WIDTH][.MAX], e.g. {{{name}:<12.12}}");
    let mut spec = spec;
    let align = match spec.chars().next() {
        Some(c @ ('<' | '>' | '^')) => {
            spec = &spec[1..];
            Some(c)
        }
        _ => None,
    };
    let (w, cut) = match spec.split_once('.') {
        Some((w, c)) => (w, Some(c.parse::<usize>().map_err(|_| bad())?)),
        None => (spec, None),
    };
    let width = if w.is_empty() { 0 } else { w.parse::<usize>().map_err(|_| bad())? };
    if width > 1000 || cut.is_some_and(|c| c > 100_000) {
        return Err(bad());
    }
    Ok(Part::Field { field, align, width, cut })
}

/// The RFC 21 states, and what `--states` takes besides them.
const STATES: [&str; 7] = ["NEW", "DEPEND", "PRIORITY", "SCHED", "RUN", "CLEANUP", "INACTIVE"];
const RESULTS: [&str; 4] = ["COMPLETED", "FAILED", "CANCELED", "TIMEOUT"];

/// What `--states` picks: RFC 21 states, and results of inactive jobs.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct States {
    states: Vec<&'static str>,
    results: Vec<&'static str>,
}

impl States {
    /// A comma-separated list of state names (`sched`, `run`, any case), Flux's groups (`pending`: new, depend,
    /// priority, sched; `running`: run, cleanup; `active`: both; `inactive`) and results of inactive jobs
    /// (`completed`, `failed`, `canceled`, `timeout`).
    ///
    /// # Errors
    /// `unknown state "foo" (known: ...)`.
    pub(crate) fn parse(list: &str) -> Result<States, String> {
        let mut out = States::default();
        for word in list.split(',').map(str::trim) {
            let up = word.to_ascii_uppercase();
            let group: &[&'static str] = match up.as_str() {
                "PENDING" => &STATES[..4],
                "RUNNING" => &STATES[4..6],
                "ACTIVE" => &STATES[..6],
                s => match STATES.iter().find(|n| **n == s) {
                    Some(n) => std::slice::from_ref(n),
                    None => match RESULTS.iter().find(|n| **n == s) {
                        Some(r) => {
                            if !out.results.contains(r) {
                                out.results.push(r);
                            }
                            continue;
                        }
                        None => {
                            return Err(format!(
                                "unknown state {word:?} (known: pending, running, active, inactive, {}, {})",
                                STATES[..6].join(", ").to_lowercase(),
                                RESULTS.join(", ").to_lowercase()
                            ))
                        }
                    },
                },
            };
            for s in group {
                if !out.states.contains(s) {
                    out.states.push(s);
                }
            }
        }
        Ok(out)
    }

    /// Whether it may pick inactive jobs (then they must be listed).
    pub(crate) fn wants_inactive(&self) -> bool {
        self.states.contains(&"INACTIVE") || !self.results.is_empty()
    }

    /// Whether job `j` is picked.
    pub(crate) fn matches(&self, j: &Value) -> bool {
        let state = j["state"].as_str().unwrap_or("");
        self.states.contains(&state)
            || (state == "INACTIVE" && j["result"].as_str().is_some_and(|r| self.results.contains(&r)))
    }
}

/// `--since TIME` as seconds since the epoch: `-DURATION` ago (`-1h`, `-30m`; RFC 23), `@EPOCH`, or a UTC date
/// and time (`2026-12-07T05:00:00Z`, `2026-12-07 05:00`).
///
/// # Errors
/// `--since=...: ...` naming what is wrong.
pub(crate) fn parse_since(s: &str, now: f64) -> Result<f64, String> {
    let t = s.trim();
    if let Some(d) = t.strip_prefix('-') {
        let secs = crate::duration::parse_duration_secs(d).map_err(|e| format!("--since={s}: {e}"))?;
        if !secs.is_finite() {
            return Err(format!("--since={s}: must be finite"));
        }
        return Ok(now - secs);
    }
    super::queue::parse_time(t).ok_or_else(|| {
        format!("--since={s}: expected -DURATION (-1h, -30m), @EPOCH, or a UTC time such as 2026-12-07T05:00:00Z")
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn the_readme_legend_names_every_state_letter() {
        let states = ["NEW", "DEPEND", "PRIORITY", "SCHED", "RUN", "CLEANUP"].map(|s| json!({"state": s}));
        let results = ["COMPLETED", "FAILED", "CANCELED", "TIMEOUT"].map(|r| json!({"state": "INACTIVE", "result": r}));
        let printed: Vec<&str> = states.iter().chain(&results).map(short_state).collect();
        let known: Vec<&str> = SHORT_STATES.iter().map(|(l, _)| *l).collect();
        assert_eq!(printed, known);
        let readme = include_str!("../../../../README.md");
        let legend =
            readme.split("(ST: ").nth(1).and_then(|r| r.split(';').next()).expect("the README has an ST legend");
        for (letter, name) in SHORT_STATES {
            assert!(
                legend.split(", ").any(|w| w == format!("{letter} {name}")),
                "ST legend lacks '{letter} {name}': {legend}"
            );
        }
    }

    fn ctx() -> Ctx<'static> {
        Ctx { now: 1000.0, user: &|u| format!("u{u}") }
    }

    fn job() -> Value {
        json!({"id": 1234567, "id_f58": "fABC", "userid": 7, "name": "sim", "state": "RUN", "ntasks": 4,
               "nnodes": 2, "nodelist": "node[1-2]", "t_run": 940.0, "urgency": 16, "duration": 3600.0})
    }

    #[test]
    fn flux_style_fields_with_widths() {
        let f = Format::parse("{id.f58:>6}|{id.dec}|{name:<5}|{user}|{state}|{nnodes}|{ntasks}|{runtime}|{nodelist}")
            .unwrap();
        assert_eq!(f.line(&job(), &ctx()), "  fABC|1234567|sim  |u7|RUN|2|4|1.0m|node[1-2]");
        assert_eq!(f.header(), " JOBID|JOBID|NAME |USER|STATE|NNODES|NTASKS|TIME|NODELIST");
        let f = Format::parse("{{{name:^7.2}}}").unwrap();
        assert_eq!(f.line(&job(), &ctx()), "{  si   }");
        assert_eq!(Format::parse("{duration} {t_run}").unwrap().line(&job(), &ctx()), "1.0h 1970-01-01T00:15:40Z");
    }

    #[test]
    fn bad_formats_name_what_is_wrong() {
        let e = Format::parse("{id} {nmae}").unwrap_err();
        assert!(e.starts_with("unknown field {nmae} (known: id, id.f58"), "{e}");
        assert!(Format::parse("{id").unwrap_err().contains("never closed"));
        assert!(Format::parse("id}").unwrap_err().contains("lone '}'"));
        assert!(Format::parse("{id:x}").unwrap_err().contains("a spec is"));
        assert!(Format::parse("{id:<5.y}").unwrap_err().contains("a spec is"));
    }

    #[test]
    fn the_default_table_is_a_format() {
        let f = Format::parse(DEFAULT_FORMAT).unwrap();
        assert_eq!(f.header(), "         JOBID     USER NAME         ST NTASKS NNODES     TIME INFO");
        let line = f.line(&job(), &ctx());
        assert_eq!(line, "          fABC       u7 sim           R      4      2     1.0m node[1-2]");
    }

    #[test]
    fn a_begin_time_reads_in_local_time_with_its_offset() {
        let r = local_reason("begin-time: not before 2026-12-07T05:00:00Z (in 4m05s)");
        let local = local_iso8601(1_796_619_600).unwrap();
        assert_eq!(r, format!("begin-time: not before {local} (in 4m05s)"));
        // The same instant: the local time less its offset is the UTC time.
        let (wall, off) = local.split_at(19);
        let sign = if off.starts_with('-') { -1 } else { 1 };
        let secs = humantime::parse_rfc3339(&format!("{wall}Z"))
            .unwrap()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        let off_secs = sign * (off[1..3].parse::<i64>().unwrap() * 3600 + off[4..6].parse::<i64>().unwrap() * 60);
        assert_eq!(secs - off_secs, 1_796_619_600);
        assert_eq!(local_reason("held: urgency 0"), "held: urgency 0");
    }

    #[test]
    fn usage_fields_from_the_cgroups_or_a_dash() {
        let f = Format::parse("{cputime}|{maxmem}").unwrap();
        assert_eq!(f.line(&job(), &ctx()), "-|-");
        let mut j = job();
        j["usage"] = json!({"cpu_usec": 90_000_000u64, "memory_peak": 67_108_864u64});
        assert_eq!(f.line(&j, &ctx()), "1.5m|64.0M");
        assert_eq!(f.header(), "CPUTIME|MAXMEM");
    }

    #[test]
    fn states_groups_and_results() {
        let p = |s: &str| States::parse(s).unwrap();
        let j = |state: &str, result: Option<&str>| json!({"state": state, "result": result});
        assert!(p("pending").matches(&j("SCHED", None)) && !p("pending").matches(&j("RUN", None)));
        assert!(p("running").matches(&j("CLEANUP", None)));
        assert!(p("Sched,run").matches(&j("RUN", None)));
        assert!(p("active").matches(&j("DEPEND", None)) && !p("active").wants_inactive());
        assert!(p("inactive").matches(&j("INACTIVE", Some("FAILED"))) && p("inactive").wants_inactive());
        assert!(p("failed").matches(&j("INACTIVE", Some("FAILED"))));
        assert!(!p("completed").matches(&j("INACTIVE", Some("FAILED"))) && p("completed").wants_inactive());
        let e = States::parse("run,bogus").unwrap_err();
        assert!(e.starts_with("unknown state \"bogus\" (known: pending, running"), "{e}");
    }

    #[test]
    fn since_relative_and_absolute() {
        assert_eq!(parse_since("-1h", 10_000.0), Ok(6400.0));
        assert_eq!(parse_since("@5000", 10_000.0), Ok(5000.0));
        assert_eq!(parse_since("2027-01-15T08:00:00Z", 0.0), Ok(1_800_000_000.0));
        assert!(parse_since("yesterday", 0.0).unwrap_err().starts_with("--since=yesterday: expected"));
        assert!(parse_since("-1x", 0.0).unwrap_err().starts_with("--since=-1x:"));
    }

    /// Every field is in docs/queue.md's table, and in `--format`'s help, with its heading.
    #[test]
    fn every_field_is_documented() {
        let doc = include_str!("../../../../docs/queue.md");
        let help = include_str!("jobcmd/jobs.rs");
        for f in FIELDS {
            assert!(doc.contains(&format!("`{}`", f.name)), "docs/queue.md lacks {}", f.name);
            assert!(doc.contains(f.header), "docs/queue.md lacks {}'s heading {}", f.name, f.header);
            assert!(
                help.contains(&format!(" {},", f.name)) || help.contains(&format!(" {} (", f.name)),
                "--format's help lacks {}",
                f.name
            );
        }
    }

    proptest! {
        #[test]
        fn format_parse_never_panics(s in "[{}a-z_.:<>^0-9 |]{0,40}") {
            if let Ok(f) = Format::parse(&s) {
                let _ = f.line(&job(), &ctx());
                let _ = f.header();
            }
        }

        #[test]
        fn literal_text_comes_back_and_widths_hold(text in "[a-zA-Z ,;|-]{0,20}", w in 0usize..30, i in 0..FIELDS.len()) {
            let f = Format::parse(&format!("{text}{{{}:>{w}}}", FIELDS[i].name)).unwrap();
            let line = f.header();
            prop_assert!(line.starts_with(text.trim_end()) || text.trim().is_empty());
            let full = Format::parse(&format!("{{{}:>{w}}}", FIELDS[i].name)).unwrap().line(&job(), &ctx());
            prop_assert!(full.chars().count() >= w.min(full.trim_start().chars().count()));
            if !full.trim().is_empty() {
                prop_assert!(full.chars().count() >= w);
            }
        }
    }
}
