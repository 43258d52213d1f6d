//! `vigil job ...`: submit a jobspec file, eventlog, attach, wait, cancel, urgency, hold, release, info, purge.

use super::attach::{attach, await_rank0, followed, Follower};
use super::cancel::{cancel, CancelArgs};
use super::jobs::user_name;
use super::run::submit;
use crate::cli::connect;
use crate::jobs::JobId;
use crate::jobspec::Jobspec;
use clap::{Args, Subcommand};
use serde_json::{json, Value};

/// `vigil job` subcommands.
#[derive(Subcommand, Debug)]
pub enum JobCmd {
    /// Submit a jobspec file (YAML or JSON; `-` for stdin) and print the job id.
    Submit {
        /// Jobspec file.
        file: String,
    },
    /// Print a job's eventlog (RFC 18).
    Eventlog {
        /// Job id.
        id: String,
        /// Print raw JSON lines.
        #[arg(long)]
        json: bool,
        /// Keep printing new events until the job is inactive.
        #[arg(short = 'f', long)]
        follow: bool,
    },
    /// Attach to a job: stream its output, exit with its exit code.
    Attach {
        /// Job id.
        id: String,
        /// Prefix output lines with the task rank.
        #[arg(short = 'l', long = "label-io")]
        label_io: bool,
    },
    /// Wait for a job to finish and exit with its exit code; the exception that ended it, if one did, is printed on
    /// stderr as `vigil run` prints it (Flux's `flux job wait` says why a job failed too).
    Wait {
        /// Job id.
        id: String,
    },
    /// Cancel a job.
    Cancel(CancelArgs),
    /// Set a pending job's urgency (RFC 21, Flux's `flux job urgency`): 0 to 31, or `hold` (0), `default` (16),
    /// `expedite` (31). Pending jobs start in order of urgency, then of submission. Prints the urgency it had.
    Urgency {
        /// Job id.
        id: String,
        /// The new urgency.
        urgency: String,
    },
    /// Hold pending jobs (urgency 0), as Slurm's `scontrol hold`: they stay pending until released.
    Hold {
        /// Job ids.
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Release held jobs (back to urgency 16), as Slurm's `scontrol release`; a job not held is refused.
    Release {
        /// Job ids.
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Print a job's summary, jobspec and R as JSON (as `flux job info`). The summary's `lost_nodelist` and
    /// `lost_ranks` are the nodes its run lost (a batch or alloc job goes on without them), `nnodes_current` how
    /// many it holds now (`nnodes`: how many it started with).
    Info {
        /// Job id.
        id: String,
        /// Print the reply as JSON (the job's record under "info", its "jobspec" and "R"), for scripts; without
        /// it, the record as aligned `key: value` lines for people.
        #[arg(long)]
        json: bool,
    },
    /// Purge INACTIVE jobs (their records and eventlogs, from the state directory too), as `flux job purge`:
    /// those older than --age-limit, the oldest beyond --num-limit, or the given ids. Without --force, only
    /// says how many would go. A user names its own jobs by id; --age-limit and --num-limit are the instance owner's.
    Purge(PurgeArgs),
}

/// Options of `vigil job purge`.
#[derive(Args, Debug)]
pub struct PurgeArgs {
    /// Purge jobs inactive for longer than this (RFC 23 duration: 30s, 2h, 7d).
    #[arg(long, value_name = "FSD")]
    pub age_limit: Option<String>,
    /// Keep at most this many inactive jobs, purging the oldest.
    #[arg(long, value_name = "N")]
    pub num_limit: Option<u64>,
    /// Purge them (else only count them).
    #[arg(short = 'f', long)]
    pub force: bool,
    /// Job ids to purge (each must be inactive).
    pub ids: Vec<String>,
}

/// `vigil job purge`.
async fn purge(a: PurgeArgs) -> Result<i32, String> {
    let mut body = json!({"force": a.force});
    if let Some(s) = &a.age_limit {
        let v = crate::duration::parse_duration_secs(s)
            .ok()
            .filter(|v| v.is_finite() && *v >= 0.0)
            .ok_or_else(|| format!("--age-limit {s}: expected a finite duration such as 30s, 2h or 7d"))?;
        body["age_limit"] = json!(v);
    }
    if let Some(n) = a.num_limit {
        body["num_limit"] = json!(n);
    }
    if !a.ids.is_empty() {
        let ids = a.ids.iter().map(|s| parse_id(s).map(|id| id.0)).collect::<Result<Vec<_>, _>>()?;
        body["ids"] = json!(ids);
    }
    if a.age_limit.is_none() && a.num_limit.is_none() && a.ids.is_empty() {
        return Err("give --age-limit, --num-limit or job ids".into());
    }
    let c = connect().await?;
    let r = c.rpc("job-manager.purge", 0, &body).await.map_err(|e| e.errstr)?;
    let count = r["count"].as_u64().unwrap_or(0);
    let left = r["inactive"].as_u64().unwrap_or(0);
    if a.force {
        println!("purged {count} inactive job(s); {left} kept");
    } else {
        println!("{count} inactive job(s) would be purged (of {left}); use --force to purge them");
    }
    Ok(0)
}

/// `vigil job hold` and `vigil job release`: each job's urgency set (with `release`, only if it is held); a
/// refusal is said on standard error and the others go on (exit code 1 if any was refused).
async fn urgency_all(ids: &[String], urgency: u32, release: bool) -> Result<i32, String> {
    let parsed = ids.iter().map(|s| parse_id(s)).collect::<Result<Vec<_>, _>>()?;
    let c = connect().await?;
    let mut rc = 0;
    for (typed, id) in ids.iter().zip(parsed) {
        let body = json!({"id": id.0, "urgency": urgency, "release": release});
        if let Err(e) = c.rpc("job-manager.urgency", 0, &body).await {
            let what = if release { "release" } else { "hold" };
            eprintln!("vigil: {what} {typed}: {}", super::as_typed(e.errstr, typed));
            rc = 1;
        }
    }
    Ok(rc)
}

fn parse_id(s: &str) -> Result<JobId, String> {
    JobId::parse(s).map_err(|e| e.to_string())
}

/// `vigil job ...`: an error about the one job named is said with the id as the user typed it.
pub(crate) async fn job(cmd: JobCmd) -> Result<i32, String> {
    let typed = match &cmd {
        JobCmd::Eventlog { id, .. }
        | JobCmd::Attach { id, .. }
        | JobCmd::Wait { id }
        | JobCmd::Urgency { id, .. }
        | JobCmd::Info { id, .. } => Some(id.clone()),
        _ => None,
    };
    let r = job_cmd(cmd).await;
    match typed {
        Some(t) => r.map_err(|e| super::as_typed(e, &t)),
        None => r,
    }
}

async fn job_cmd(cmd: JobCmd) -> Result<i32, String> {
    match cmd {
        JobCmd::Submit { file } => {
            let text = if file == "-" {
                let mut s = String::new();
                std::io::Read::read_to_string(&mut std::io::stdin(), &mut s).map_err(|e| format!("stdin: {e}"))?;
                s
            } else {
                std::fs::read_to_string(&file).map_err(|e| format!("{file}: {e}"))?
            };
            let spec = Jobspec::parse(&text).map_err(|e| format!("{file}: {e}"))?;
            // The checks the instance makes at submission, here too, so that every error names the file.
            spec.validate().map_err(|e| format!("{file}: {e}"))?;
            let mut c = connect().await?;
            let id = submit(&mut c, &spec).await?;
            println!("{id}");
            Ok(0)
        }
        JobCmd::Eventlog { id, json, follow } => {
            let id = parse_id(&id)?;
            let c = connect().await?;
            let mut s = if follow {
                c.rpc_stream("job-manager.eventlog", 0, &json!({"id": id.0, "follow": true}))
            } else {
                c.rpc_stream("job-manager.eventlog", 0, &json!({"id": id.0, "follow": false}))
            }
            .map_err(|e| e.errstr)?;
            while let Some(item) = s.next().await {
                let v = item.map_err(|e| e.errstr)?;
                let Some(e) = v.get("event") else { continue };
                if json {
                    println!("{e}");
                } else {
                    println!("{}", human_event(e));
                }
            }
            Ok(0)
        }
        JobCmd::Attach { id, label_io } => {
            let id = parse_id(&id)?;
            let c = connect().await?;
            followed(attach(&c, id, label_io, Follower::Attach).await, id)
        }
        JobCmd::Wait { id } => {
            let id = parse_id(&id)?;
            let c = connect().await?;
            let payload = json!({"id": id.0, "follow": true});
            let mut s = c.rpc_stream("job-manager.eventlog", 0, &payload).map_err(|e| e.errstr)?;
            let (mut status, mut fatal): (Option<i32>, Option<String>) = (None, None);
            let mut replayed = None;
            // The fatal exceptions already printed: an eventlog replayed after a restart of rank 0 repeats them.
            let mut told = std::collections::BTreeSet::new();
            loop {
                let item = match replayed.take() {
                    Some(v) => Ok(v),
                    None => match s.next().await {
                        Some(item) => item,
                        None => break,
                    },
                };
                let v = match item {
                    Ok(v) => v,
                    // Rank 0 lost: wait for it if the instance keeps its jobs; the eventlog then comes again
                    // from its start, and the verdict is made again from it.
                    Err(e) if e.errnum == crate::message::errno::EHOSTUNREACH => {
                        match await_rank0(&c, id, "job-manager.eventlog", &payload, &mut None).await {
                            Some((_, ns, first)) => {
                                (s, replayed, status, fatal) = (ns, Some(first), None, None);
                                continue;
                            }
                            None => return followed(Err(e), id),
                        }
                    }
                    Err(e) => return followed(Err(e), id),
                };
                let e = &v["event"];
                match e["name"].as_str() {
                    Some("finish") => status = Some(e["context"]["status"].as_i64().unwrap_or(0) as i32),
                    Some("exception") if e["context"]["severity"].as_u64() == Some(0) && fatal.is_none() => {
                        let kind = e["context"]["type"].as_str().unwrap_or("").to_string();
                        if told.insert(e["timestamp"].to_string()) {
                            eprintln!(
                                "vigil: job {id}: exception type={kind} severity=0: {}",
                                e["context"]["note"].as_str().unwrap_or("")
                            );
                        }
                        fatal = Some(kind);
                    }
                    Some("requeue") => (status, fatal) = (None, None),
                    _ => {}
                }
            }
            Ok(crate::shellproto::job_exit_code(status, fatal.as_deref()))
        }
        JobCmd::Cancel(a) => cancel(a).await,
        JobCmd::Urgency { id, urgency } => {
            let id = parse_id(&id)?;
            let u = match urgency.as_str() {
                "hold" => 0,
                "default" => crate::jobs::DEFAULT_URGENCY,
                "expedite" => crate::jobs::MAX_URGENCY,
                s => s
                    .parse::<u32>()
                    .ok()
                    .filter(|u| *u <= crate::jobs::MAX_URGENCY)
                    .ok_or_else(|| format!("urgency {s}: expected 0 to 31, hold, default or expedite"))?,
            };
            let c = connect().await?;
            let r = c.rpc("job-manager.urgency", 0, &json!({"id": id.0, "urgency": u})).await.map_err(|e| e.errstr)?;
            println!("{}", r["old"]);
            Ok(0)
        }
        JobCmd::Hold { ids } => urgency_all(&ids, 0, false).await,
        JobCmd::Release { ids } => urgency_all(&ids, crate::jobs::DEFAULT_URGENCY, true).await,
        JobCmd::Purge(a) => purge(a).await,
        JobCmd::Info { id, json } => {
            let id = parse_id(&id)?;
            let c = connect().await?;
            let r = c.rpc("job-manager.info", 0, &json!({"id": id.0})).await.map_err(|e| e.errstr)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&r).unwrap_or_default());
            } else {
                print!("{}", crate::cli::jobinfo::human(&r["info"], crate::broker_now(), user_name));
            }
            Ok(0)
        }
    }
}

/// One eventlog entry (RFC 18: `timestamp`, `name`, optional `context` object) as a line for people:
/// `TIMESTAMP NAME key=value ...`, the timestamp in seconds with 6 decimals, string values unquoted.
pub(crate) fn human_event(e: &Value) -> String {
    let ctx = e.get("context").and_then(Value::as_object).map(|m| {
        m.iter()
            .map(|(k, v)| format!("{k}={}", v.as_str().map(str::to_string).unwrap_or_else(|| v.to_string())))
            .collect::<Vec<_>>()
            .join(" ")
    });
    format!(
        "{:.6} {} {}",
        e["timestamp"].as_f64().unwrap_or(0.0),
        e["name"].as_str().unwrap_or(""),
        ctx.unwrap_or_default()
    )
    .trim_end()
    .to_string()
}
