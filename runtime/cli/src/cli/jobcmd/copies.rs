//! `--cc`: one copy of a job per id, submitted pipelined on one connection (`vigil submit`, `vigil batch`).

use super::args::SubmitArgs;
use super::spec::build_jobspec;
use crate::cli::connect;
use crate::cli::submit::submit_value;
use serde_json::Value;
use std::io::Write;

/// Most `--cc` submissions in flight on the connection at once: enough to keep rank 0's loop busy, few enough
/// that an error is reported while the rest still go.
const CC_WINDOW: usize = 256;

/// `vigil submit --cc IDSET`: one job per id, submitted pipelined on one connection; prints their ids in IDSET
/// order. Returns 1 if any copy was refused (each refusal is said, naming its id), else 0.
pub(super) async fn submit_copies(a: &SubmitArgs, cc: &str) -> Result<i32, String> {
    let set = cc_set(cc).await?;
    let copy = |i: u32| -> Result<Value, String> {
        // `{{cc}}` too, as `{{id}}` is written in --output (Flux's mustache form).
        let sub = |t: &str| t.replace("{{cc}}", &i.to_string()).replace("{cc}", &i.to_string());
        let mut b = a.clone();
        b.command = a.command.iter().map(|c| sub(c)).collect();
        b.output = a.output.as_deref().map(sub);
        b.error = a.error.as_deref().map(sub);
        b.env.push(format!("VIGIL_JOB_CC={i}"));
        let spec = build_jobspec(&b)?;
        serde_json::from_str(&spec.to_json()).map_err(|e| e.to_string())
    };
    // Every jobspec is checked before the first is submitted: a bad option refuses them all.
    let specs = set.iter().map(|i| copy(i).map(|v| (i, v))).collect::<Result<Vec<_>, _>>()?;
    if a.dry_run {
        for (_, v) in &specs {
            println!("{v}");
        }
        return Ok(0);
    }
    submit_all(specs, a.queue.urgency()).await
}

/// `--cc IDSET` parsed and bounded: not empty, and at most `job-manager.cc-limit` ids (as Slurm's MaxArraySize
/// bounds an array), that limit asked of this node's broker (its default, [`DEFAULT_CC_LIMIT`], when there is no
/// broker to ask, as for `--dry-run` outside an instance), before any copy is built.
///
/// # Errors
/// A bad IDSET, an empty one, or one of more ids than the limit, each naming `--cc`.
///
/// [`DEFAULT_CC_LIMIT`]: crate::attrs::DEFAULT_CC_LIMIT
pub(crate) async fn cc_set(cc: &str) -> Result<crate::idset::IdSet, String> {
    let set = crate::idset::IdSet::parse(cc).map_err(|e| format!("--cc {cc}: {e}"))?;
    if set.is_empty() {
        return Err(format!("--cc {cc}: no id"));
    }
    let limit = match crate::client::Client::connect_env().await {
        Ok(c) => c
            .rpc("broker.getattr", crate::message::NODEID_ANY, &serde_json::json!({"name": "job-manager.cc-limit"}))
            .await
            .ok()
            .and_then(|v| v["value"].as_str().and_then(|n| n.parse().ok())),
        Err(_) => None,
    };
    within_cc_limit(cc, set.len(), limit.unwrap_or(crate::attrs::DEFAULT_CC_LIMIT))?;
    Ok(set)
}

/// Refuses `--cc cc` of `n` ids past `limit` (0: none), naming the option, the limit and how to raise it.
fn within_cc_limit(cc: &str, n: usize, limit: usize) -> Result<(), String> {
    if limit == 0 || n <= limit {
        return Ok(());
    }
    Err(format!(
        "--cc {cc}: {n} copies, more than the {limit} this instance allows (job-manager.cc-limit, as Slurm's \
         MaxArraySize): submit them in parts, or start the instance with -S job-manager.cc-limit=N (0: no limit)"
    ))
}

/// Submits jobspecs `(copy id, jobspec)` (already checked) over one connection, [`CC_WINDOW`] at a time, and
/// prints each job id on its own line in copy order; a refused copy is said on standard error (exit code 1) and
/// the others go on. Consecutive copies refused for the same reason are said once, as a range (`copies 12-300:
/// ...`): a connection lost in a flood fails every copy after it the same way. For `--cc` of `vigil submit` and
/// `vigil batch`.
pub(crate) async fn submit_all(specs: Vec<(u32, Value)>, urgency: Option<u32>) -> Result<i32, String> {
    let c = connect().await?;
    let mut rc = 0;
    let mut inflight = std::collections::VecDeque::new();
    let mut out = std::io::stdout().lock();
    let mut specs = specs.into_iter();
    let mut refused = Refusals::default();
    loop {
        while inflight.len() < CC_WINDOW {
            let Some((i, v)) = specs.next() else { break };
            let mut c = c.clone();
            inflight.push_back((i, tokio::spawn(async move { submit_value(&mut c, &v, false, urgency).await })));
        }
        let Some((i, h)) = inflight.pop_front() else { break };
        match h.await.map_err(|e| e.to_string()).and_then(|r| r) {
            Ok(id) => {
                refused.say();
                let _ = writeln!(out, "{id}");
            }
            Err(e) => {
                refused.add(i, e);
                rc = 1;
            }
        }
    }
    refused.say();
    Ok(rc)
}

/// The run of consecutive copies refused for the same reason that [`submit_all`] has not said yet.
#[derive(Default)]
struct Refusals(Option<(u32, u32, String)>);

impl Refusals {
    /// Copy `i` was refused with `why`: it extends the run, or the run is said and a new one starts.
    fn add(&mut self, i: u32, why: String) {
        if let Some(line) = self.push(i, why) {
            eprintln!("{line}");
        }
    }

    /// [`Refusals::add`], returning the line of the run it ended, if it ended one.
    fn push(&mut self, i: u32, why: String) -> Option<String> {
        if let Some((_, last, w)) = &mut self.0 {
            if *w == why && i == *last + 1 {
                *last = i;
                return None;
            }
        }
        let ended = self.line();
        self.0 = Some((i, i, why));
        ended
    }

    /// The run's line, if any (`vigil: copy N: WHY` or `vigil: copies N-M (K of them): WHY`); the run is said.
    fn line(&mut self) -> Option<String> {
        self.0.take().map(|(a, b, why)| match b - a {
            0 => format!("vigil: copy {a}: {why}"),
            n => format!("vigil: copies {a}-{b} ({} of them): {why}", n + 1),
        })
    }

    /// Say the run, if any, on standard error.
    fn say(&mut self) {
        if let Some(line) = self.line() {
            eprintln!("{line}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::within_cc_limit;

    #[test]
    fn copies_past_the_limit_are_refused_naming_the_option_and_the_limit() {
        assert_eq!(within_cc_limit("1-10001", 10_001, 10_001), Ok(()));
        let e = within_cc_limit("1-100000", 100_000, 10_001).unwrap_err();
        assert!(
            e.starts_with("--cc 1-100000: 100000 copies, more than the 10001") && e.contains("job-manager.cc-limit"),
            "{e}"
        );
        assert_eq!(within_cc_limit("1-100000", 100_000, 0), Ok(()));
    }

    /// Found by a fresh-user trial: a connection lost in a `--cc 1-300` flood printed a line per copy.
    #[test]
    fn copies_refused_alike_in_a_row_are_said_once() {
        let mut r = super::Refusals::default();
        let lost = || "lost connection to broker".to_string();
        assert_eq!(r.push(3, "bad".into()), None);
        assert_eq!(r.push(4, lost()).as_deref(), Some("vigil: copy 3: bad"));
        for i in 5..=300 {
            assert_eq!(r.push(i, lost()), None);
        }
        assert_eq!(r.line().as_deref(), Some("vigil: copies 4-300 (297 of them): lost connection to broker"));
        assert_eq!(r.line(), None);
        // Not consecutive: said apart.
        assert_eq!(r.push(1, lost()), None);
        assert_eq!(r.push(3, lost()).as_deref(), Some("vigil: copy 1: lost connection to broker"));
    }
}
