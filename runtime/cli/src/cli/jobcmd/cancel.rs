//! `vigil cancel` (and `vigil job cancel`): the ids given, or all the caller's active jobs.

use crate::cli::connect;
use crate::jobs::JobId;
use clap::Args;
use serde_json::json;

/// Options of `vigil cancel`.
#[derive(Args, Debug)]
pub struct CancelArgs {
    /// Reason recorded in the cancel exception.
    #[arg(short = 'm', long = "message")]
    pub message: Option<String>,
    /// Cancel all your active jobs (pending and running; see --states) instead of the ids given (as `flux
    /// cancel --all`, `scancel -u $USER`).
    #[arg(long, conflicts_with = "ids")]
    pub all: bool,
    /// With --all: only jobs in these states, a comma-separated list of `pending` (not yet running) and
    /// `running` (running or cleaning up).
    #[arg(long, value_delimiter = ',', value_parser = ["pending", "running"])]
    pub states: Vec<String>,
    /// Job ids.
    #[arg(required_unless_present_any = ["all", "states"])]
    pub ids: Vec<String>,
}

/// Whether `--all --states S` takes a job in state `state` (an RFC 21 state name): all active jobs when `states`
/// is empty.
fn cancel_takes(states: &[String], state: &str) -> bool {
    let running = matches!(state, "RUN" | "CLEANUP");
    let pending = matches!(state, "NEW" | "DEPEND" | "PRIORITY" | "SCHED");
    (running || pending)
        && (states.is_empty()
            || (running && states.iter().any(|s| s == "running"))
            || (pending && states.iter().any(|s| s == "pending")))
}

/// `vigil cancel`: the ids given, or with `--all` every active job of the caller's (filtered by `--states`),
/// then a count ("canceled 3 jobs"). Exit code 1 if any cancel was refused (each said on standard error).
pub(crate) async fn cancel(a: CancelArgs) -> Result<i32, String> {
    if !a.states.is_empty() && !a.all {
        return Err(
            "--states picks among your active jobs: use it with --all (vigil cancel --all --states pending)".into()
        );
    }
    let mut ids = a.ids.iter().map(|s| JobId::parse(s).map_err(|e| e.to_string())).collect::<Result<Vec<_>, _>>()?;
    let c = connect().await?;
    if a.all {
        let me = u64::from(nix::unistd::getuid().as_raw());
        // Every page of the list (`job-manager.list`'s `next`): rank 0 answers at most a page at once.
        ids.clear();
        let mut before: Option<u64> = None;
        loop {
            let mut req = json!({"all": false, "userid": me});
            if let Some(b) = before {
                req["before"] = b.into();
            }
            let r = c.rpc("job-manager.list", 0, &req).await.map_err(|e| e.errstr)?;
            ids.extend(
                r["jobs"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|j| j["userid"].as_u64() == Some(me))
                    .filter(|j| cancel_takes(&a.states, j["state"].as_str().unwrap_or("")))
                    .filter_map(|j| j["id"].as_u64().map(JobId)),
            );
            before = r.get("next").and_then(serde_json::Value::as_u64);
            if before.is_none() {
                break;
            }
        }
    }
    let mut rc = 0;
    let mut done = 0usize;
    let mut ended = 0usize;
    for (i, id) in ids.iter().enumerate() {
        let note = a.message.clone().unwrap_or_else(|| "canceled by user".into());
        match c.rpc("job-manager.cancel", 0, &json!({"id": id.0, "note": note})).await {
            Ok(_) => done += 1,
            // With --all, a job listed active that ended before its cancel came is not an error (flux cancel --all).
            Err(e) if a.all && e.errnum == crate::message::errno::EINVAL && e.errstr.ends_with(" is inactive") => {
                ended += 1;
            }
            Err(e) => {
                // Said with the id as typed (`vigil cancel 12345`), rank 0's f58 form for those --all found.
                let typed = if a.all { None } else { a.ids.get(i) };
                match typed {
                    Some(t) => eprintln!("vigil: cancel {t}: {}", super::as_typed(e.errstr, t)),
                    None => eprintln!("vigil: cancel {id}: {}", e.errstr),
                }
                rc = 1;
            }
        }
    }
    if a.all {
        let also = if ended > 0 { format!(" ({ended} ended by themselves meanwhile)") } else { String::new() };
        eprintln!("vigil: canceled {done} job{}{also}", if done == 1 { "" } else { "s" });
    }
    Ok(rc)
}

#[cfg(test)]
mod tests {
    #[test]
    fn cancel_all_takes_active_jobs_by_state() {
        let st = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        for s in ["SCHED", "PRIORITY", "RUN", "CLEANUP"] {
            assert!(super::cancel_takes(&[], s), "{s}");
        }
        assert!(!super::cancel_takes(&[], "INACTIVE"));
        assert!(super::cancel_takes(&st(&["pending"]), "SCHED"));
        assert!(!super::cancel_takes(&st(&["pending"]), "RUN"));
        assert!(super::cancel_takes(&st(&["running"]), "CLEANUP"));
        assert!(!super::cancel_takes(&st(&["running"]), "SCHED"));
        assert!(super::cancel_takes(&st(&["pending", "running"]), "RUN"));
    }
}
