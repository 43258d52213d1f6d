//! `vigil history`: ended jobs' records, purged ones too (`jobs/history.rs`, `job-manager.history`), as Slurm's
//! `sacct` lists them: by time range, user, name and result, in a table, a `--format` or JSON.

use super::jobcmd::{user_id, JobLines};
use super::jobsfmt::{parse_since, Format};
use clap::Args;
use serde_json::json;

/// The table `vigil history` prints without `--format`.
pub(crate) const HISTORY_FORMAT: &str = "{id:>14} {user:>8} {name:<12.12} {state_single:>2} {nnodes:>6} \
     {t_inactive:<20} {runtime:>8} {cputime:>8} {maxmem:>9} {info}";

/// Options of `vigil history`.
#[derive(Args, Debug)]
pub struct HistoryArgs {
    /// Jobs that ended at or after TIME: -DURATION ago (-1h, -2d), @EPOCH, or a UTC time (2026-12-07T05:00:00Z,
    /// "2026-12-07 05:00"), as `sacct --starttime`.
    #[arg(short = 'S', long, value_name = "TIME")]
    pub since: Option<String>,
    /// Jobs that ended before TIME (the same forms), as `sacct --endtime`.
    #[arg(short = 'E', long, value_name = "TIME")]
    pub until: Option<String>,
    /// Every user's jobs, not only yours.
    #[arg(short = 'A', long = "all-users", conflicts_with = "user")]
    pub all_users: bool,
    /// Only the jobs of USER, a login name or uid, or `all` (as `-A`); yours by default.
    #[arg(short = 'u', long, value_name = "USER")]
    pub user: Option<String>,
    /// Only jobs of this name.
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// Only jobs that ended so, a comma-separated LIST of completed, failed, canceled, timeout (any case);
    /// `inactive` is any of them.
    #[arg(long, value_name = "LIST", visible_alias = "filter")]
    pub states: Option<String>,
    /// At most COUNT jobs, the newest; 0: no limit (as `flux jobs -c 0`).
    #[arg(short = 'c', long, value_name = "COUNT")]
    pub count: Option<usize>,
    /// Print JSON: one object with a "jobs" array of records, newest first.
    #[arg(long, conflicts_with = "format")]
    pub json: bool,
    /// Lines in `vigil jobs --format`'s style and with its fields (see docs/queue.md).
    #[arg(long, value_name = "FORMAT")]
    pub format: Option<String>,
    /// No header line.
    #[arg(short = 'n', long)]
    pub no_header: bool,
}

/// `--states` of `vigil history`: the results it names (empty: any).
///
/// # Errors
/// A word that is not a result of an ended job, naming it.
pub(crate) fn results(list: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for w in list.split(',').map(str::trim).filter(|w| !w.is_empty()) {
        match w.to_ascii_lowercase().as_str() {
            "inactive" => return Ok(Vec::new()),
            r @ ("completed" | "failed" | "canceled" | "timeout") => out.push(r.to_ascii_uppercase()),
            _ => {
                return Err(format!(
                    "--states={list}: \"{w}\" is not how a job ends (known: completed, failed, canceled, timeout, \
                     inactive; the history holds ended jobs only: `vigil jobs` lists the others)"
                ))
            }
        }
    }
    Ok(out)
}

/// `vigil history`.
pub(crate) async fn history(a: HistoryArgs) -> Result<i32, String> {
    let now = crate::broker_now();
    let format = Format::parse(a.format.as_deref().unwrap_or(HISTORY_FORMAT)).map_err(|e| format!("--format: {e}"))?;
    let since = a.since.as_deref().map(|s| parse_since(s, now)).transpose()?;
    let until =
        a.until.as_deref().map(|s| parse_since(s, now).map_err(|e| e.replacen("--since", "--until", 1))).transpose()?;
    let results = a.states.as_deref().map(results).transpose()?.unwrap_or_default();
    let user = match (&a.user, a.all_users) {
        (Some(u), _) => user_id(u)?,
        (None, true) => None,
        (None, false) => Some(nix::unistd::getuid().as_raw()),
    };
    let mut req = json!({});
    if let Some(t) = since {
        req["since"] = t.into();
    }
    if let Some(t) = until {
        req["until"] = t.into();
    }
    if let Some(u) = user {
        req["userid"] = u.into();
    }
    if let Some(n) = &a.name {
        req["name"] = n.clone().into();
    }
    if !results.is_empty() {
        req["results"] = results.into();
    }
    if let Some(n) = a.count.filter(|n| *n > 0) {
        req["count"] = n.into();
    }
    let c = super::connect().await?;
    // Unparsed: 100,000 records are 40 MB of JSON. `--json` passes it on as it came; a table is written record by
    // record as the answer is parsed, none held as a value longer than its line takes (bench/README.md, history).
    let answer = super::rpc_to_rank0_bytes(&c, "job-manager.history", &req).await?;
    let truncated = if a.json {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(&answer).and_then(|()| out.write_all(b"\n"));
        answer_truncated(&answer)
    } else {
        let mut lines = JobLines::new(&format, now, a.no_header);
        let rest =
            each_record(&answer, |j| lines.push(&j)).map_err(|e| format!("job-manager.history: bad answer: {e}"))?;
        rest.get("truncated").and_then(serde_json::Value::as_bool).unwrap_or(false)
    };
    if truncated {
        eprintln!(
            "vigil: the answer was cut at rank 0's bound; narrow it (--since, --until, -c) for the older records"
        );
    }
    Ok(0)
}

/// Whether a `job-manager.history` answer says it was cut (`"truncated":true`, written last by rank 0).
fn answer_truncated(answer: &[u8]) -> bool {
    let tail = &answer[answer.len().saturating_sub(64)..];
    let needle: &[u8] = b"\"truncated\":true";
    tail.windows(needle.len()).any(|w| w == needle)
}

/// Parse an answer that holds a `jobs` array (`job-manager.history`: `{"jobs": [...], "kept": N, "truncated": B}`,
/// `job-manager.list`: `{"jobs": [...], "next": ID}`) as it goes, handing each record to `each` as soon as it is
/// read; returns the answer's other fields.
///
/// # Errors
/// The answer is not such JSON.
pub(crate) fn each_record(
    answer: &[u8],
    each: impl FnMut(serde_json::Value),
) -> Result<serde_json::Map<String, serde_json::Value>, serde_json::Error> {
    use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
    use std::fmt;

    struct Answer<F>(F);
    impl<'de, F: FnMut(serde_json::Value)> Visitor<'de> for Answer<F> {
        type Value = serde_json::Map<String, serde_json::Value>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("an object with a jobs array")
        }
        fn visit_map<A: MapAccess<'de>>(mut self, mut m: A) -> Result<Self::Value, A::Error> {
            let mut rest = serde_json::Map::new();
            while let Some(k) = m.next_key::<String>()? {
                if k == "jobs" {
                    m.next_value_seed(Records(&mut self.0))?;
                } else {
                    rest.insert(k, m.next_value()?);
                }
            }
            Ok(rest)
        }
    }
    struct Records<'f, F>(&'f mut F);
    impl<'de, F: FnMut(serde_json::Value)> DeserializeSeed<'de> for Records<'_, F> {
        type Value = ();
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            d.deserialize_seq(self)
        }
    }
    impl<'de, F: FnMut(serde_json::Value)> Visitor<'de> for Records<'_, F> {
        type Value = ();
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("an array of job records")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
            while let Some(j) = seq.next_element()? {
                (self.0)(j);
            }
            Ok(())
        }
    }
    let mut d = serde_json::Deserializer::from_slice(answer);
    let t = d.deserialize_map(Answer(each))?;
    d.end()?;
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_are_results_of_ended_jobs() {
        assert_eq!(results("completed,Failed"), Ok(vec!["COMPLETED".to_string(), "FAILED".to_string()]));
        assert_eq!(results("timeout,inactive"), Ok(vec![]));
        let e = results("completed,running").unwrap_err();
        assert!(e.contains("\"running\" is not how a job ends") && e.contains("vigil jobs"), "{e}");
    }

    #[test]
    fn an_answer_is_read_record_by_record() {
        let answer = br#"{"jobs":[{"id":1,"name":"a"},{"id":2,"name":"b"}],"kept":7,"truncated":true}"#;
        let mut names = Vec::new();
        let rest = each_record(answer, |j| names.push(j["name"].as_str().unwrap_or("").to_string())).unwrap();
        assert_eq!(names, vec!["a".to_string(), "b".to_string()]);
        assert_eq!((rest["truncated"].as_bool(), rest["kept"].as_u64()), (Some(true), Some(7)));
        assert!(answer_truncated(answer));
        let plain = br#"{"jobs":[],"kept":0,"truncated":false}"#;
        assert_eq!(each_record(plain, |_| panic!("no record")).unwrap()["truncated"], false);
        assert!(!answer_truncated(plain));
        assert!(each_record(b"{\"jobs\":[{}", |_| {}).is_err());
        assert!(each_record(b"[1]", |_| {}).is_err());
    }

    #[test]
    fn the_default_table_parses() {
        let f = Format::parse(HISTORY_FORMAT).unwrap();
        assert!(f.header().contains("CPUTIME") && f.header().contains("MAXMEM") && f.header().contains("ENDED"));
    }
}
