//! `vigil jobs`: the queue, filtered and formatted (`jobsfmt`).

use crate::cli::connect;
use clap::Args;
use serde_json::{json, Value};

/// Options of `vigil jobs`.
#[derive(Args, Debug)]
pub struct JobsArgs {
    /// Include inactive jobs.
    #[arg(short = 'a', long)]
    pub all: bool,
    /// Every user's jobs, not only yours (as `flux jobs -A`, `--user=all`). Each shows its user; the command and
    /// environment of a job are only for its owner and the instance owner (`vigil job info`).
    #[arg(short = 'A', long = "all-users", conflicts_with = "user")]
    pub all_users: bool,
    /// Only the jobs of USER, a login name or uid, or `all` (as `-A`); yours by default.
    #[arg(short = 'u', long, value_name = "USER")]
    pub user: Option<String>,
    /// Print JSON (one object with a "jobs" array), after the filters.
    #[arg(long, conflicts_with = "format")]
    pub json: bool,
    /// Only jobs of this name (`--job-name`, or the command's basename when none was given), as `flux jobs
    /// --name` and `squeue --name`; with `-a`, inactive ones too.
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// Only jobs in these states, a comma-separated LIST of RFC 21 states (new, depend, priority, sched, run,
    /// cleanup, inactive), Flux's groups (pending, running, active) or results of inactive jobs (completed,
    /// failed, canceled, timeout), as `flux jobs --filter`. Inactive states imply `-a`.
    #[arg(long, value_name = "LIST", visible_alias = "filter")]
    pub states: Option<String>,
    /// Inactive jobs only if they ended after TIME: -DURATION ago (-1h, -30m), @EPOCH, or a UTC time
    /// (2026-12-07T05:00:00Z, "2026-12-07 05:00"), as `flux jobs --since`. Implies `-a`.
    #[arg(long, value_name = "TIME")]
    pub since: Option<String>,
    /// At most COUNT jobs (the newest first), after the other filters; 0: no limit (as `flux jobs -c 0`).
    #[arg(short = 'c', long, value_name = "COUNT")]
    pub count: Option<usize>,
    /// Lines in Flux's style: named fields in braces, each with an optional [<|>|^][WIDTH][.MAX] spec, e.g.
    /// `{id.f58:>12} {name:<16.16} {state} {runtime}`. Fields: id, id.f58, id.dec, id.hex, name, user, userid,
    /// state, state_single, result, status, urgency, nnodes, ntasks, nodelist, ranks, runtime, duration,
    /// t_submit, t_run, t_inactive, returncode, exception.type, exception.note, reason, requeues, cputime,
    /// maxmem, info (see docs/queue.md).
    #[arg(long, value_name = "FORMAT")]
    pub format: Option<String>,
    /// No header line.
    #[arg(short = 'n', long)]
    pub no_header: bool,
}

/// The login name of user id `uid`, or its number if it has none.
pub(crate) fn user_name(uid: u32) -> String {
    nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
        .ok()
        .flatten()
        .map(|u| u.name)
        .unwrap_or_else(|| uid.to_string())
}

/// `--user`: a uid, a login name, or `all` (`None`: every user's).
pub(crate) fn user_id(u: &str) -> Result<Option<u32>, String> {
    if u == "all" {
        return Ok(None);
    }
    if let Ok(n) = u.parse::<u32>() {
        return Ok(Some(n));
    }
    match nix::unistd::User::from_name(u) {
        Ok(Some(user)) => Ok(Some(user.uid.as_raw())),
        _ => Err(format!("--user={u}: no such user (a login name, a uid, or all)")),
    }
}

/// `vigil jobs`.
pub(crate) async fn jobs(a: JobsArgs) -> Result<i32, String> {
    use crate::cli::jobsfmt::{Format, States, DEFAULT_FORMAT};
    let now = crate::broker_now();
    // Every option is checked before the instance is asked anything.
    let format = Format::parse(a.format.as_deref().unwrap_or(DEFAULT_FORMAT)).map_err(|e| format!("--format: {e}"))?;
    let states = a
        .states
        .as_deref()
        .map(States::parse)
        .transpose()
        .map_err(|e| format!("--states={}: {e}", a.states.as_deref().unwrap_or("")))?;
    let since = a.since.as_deref().map(|s| crate::cli::jobsfmt::parse_since(s, now)).transpose()?;
    let user = match (&a.user, a.all_users) {
        (Some(u), _) => user_id(u)?,
        (None, true) => None,
        (None, false) => Some(nix::unistd::getuid().as_raw()),
    };
    let all = a.all || since.is_some() || states.as_ref().is_some_and(States::wants_inactive);
    let wanted = |j: &Value| {
        a.name.as_deref().is_none_or(|n| j["name"].as_str() == Some(n))
            && states.as_ref().is_none_or(|s| s.matches(j))
            && since.is_none_or(|t| j["state"] != "INACTIVE" || j["t_inactive"].as_f64().is_some_and(|e| e > t))
    };
    let filtered = a.name.is_some() || states.is_some() || since.is_some();
    let c = connect().await?;
    // 0 is no limit, as Flux's `flux jobs -c 0`.
    let mut left = a.count.filter(|n| *n > 0).unwrap_or(usize::MAX);
    let mut out = JobsOut::new(&format, now, a.json, a.no_header);
    // Page by page, newest first (`job-manager.list`'s `before` and `next`), each printed as it comes: rank 0
    // builds one page at a time (no answer too large for a message, its loop free between pages), and stops
    // building at `-c` jobs when no filter of ours may drop some of them.
    let mut before: Option<u64> = None;
    loop {
        let mut req = json!({"all": all, "count": if filtered { LIST_PAGE } else { left.min(LIST_PAGE) }});
        if let Some(u) = user {
            req["userid"] = u.into();
        }
        if let Some(b) = before {
            req["before"] = b.into();
        }
        let answer = crate::cli::rpc_to_rank0_bytes(&c, "job-manager.list", &req).await?;
        let rest = crate::cli::history::each_record(&answer, |j| {
            if left > 0 && wanted(&j) {
                out.push(&j);
                left -= 1;
            }
        })
        .map_err(|e| format!("job-manager.list: bad answer: {e}"))?;
        before = rest.get("next").and_then(Value::as_u64);
        if before.is_none() || left == 0 {
            break;
        }
    }
    out.end();
    Ok(0)
}

/// Most jobs `vigil jobs` asks rank 0 for at once (a page of `job-manager.list`): about 1 MB of JSON.
const LIST_PAGE: usize = 1000;

/// Where `vigil jobs` writes the jobs as they come: lines in a format ([`JobLines`]), or one JSON object with a
/// "jobs" array (`--json`), written job by job.
enum JobsOut<'a> {
    Lines(JobLines<'a>),
    Json { out: std::io::BufWriter<std::io::StdoutLock<'static>>, first: bool },
}

impl<'a> JobsOut<'a> {
    fn new(format: &'a crate::cli::jobsfmt::Format, now: f64, json: bool, no_header: bool) -> JobsOut<'a> {
        if !json {
            return JobsOut::Lines(JobLines::new(format, now, no_header));
        }
        let mut out = std::io::BufWriter::with_capacity(1 << 16, std::io::stdout().lock());
        let _ = std::io::Write::write_all(&mut out, b"{\"jobs\":[");
        JobsOut::Json { out, first: true }
    }

    fn push(&mut self, j: &Value) {
        match self {
            JobsOut::Lines(l) => l.push(j),
            JobsOut::Json { out, first } => {
                // A closed standard output (`| head`) ends the output, not the command.
                if !std::mem::take(first) {
                    let _ = std::io::Write::write_all(out, b",");
                }
                let _ = serde_json::to_writer(&mut *out, j);
            }
        }
    }

    fn end(self) {
        if let JobsOut::Json { mut out, .. } = self {
            let _ = std::io::Write::write_all(&mut out, b"]}\n");
        }
    }
}

/// One job per line in a `--format`, written to standard output as the jobs come (a header first unless asked
/// not): `vigil history` and `vigil jobs` feed it one record at a time from the answers they parse as they go, so that 100,000
/// records are never held as values at once. Each user's name is looked up once.
pub(crate) struct JobLines<'a> {
    format: &'a crate::cli::jobsfmt::Format,
    now: f64,
    names: std::cell::RefCell<std::collections::HashMap<u32, String>>,
    out: std::io::BufWriter<std::io::StdoutLock<'static>>,
}

impl<'a> JobLines<'a> {
    /// Lines in `format`, `now` being the broker's clock (seconds since the epoch); the header line written now
    /// unless `no_header`.
    pub(crate) fn new(format: &'a crate::cli::jobsfmt::Format, now: f64, no_header: bool) -> JobLines<'a> {
        let mut l = JobLines {
            format,
            now,
            names: Default::default(),
            out: std::io::BufWriter::with_capacity(1 << 16, std::io::stdout().lock()),
        };
        if !no_header {
            l.write(&format.header());
        }
        l
    }

    /// The line of job `j` (an object of `vigil jobs --json`'s fields).
    pub(crate) fn push(&mut self, j: &Value) {
        let user = |uid: u32| self.names.borrow_mut().entry(uid).or_insert_with(|| user_name(uid)).clone();
        let ctx = crate::cli::jobsfmt::Ctx { now: self.now, user: &user };
        let line = self.format.line(j, &ctx);
        self.write(&line);
    }

    fn write(&mut self, line: &str) {
        use std::io::Write;
        // A closed standard output (`| head`) ends the output, not the command.
        let _ = writeln!(self.out, "{line}");
    }
}
