//! `vigil run` and `vigil submit`: build the jobspec, check it against the instance, submit it and, for `run`,
//! feed it standard input and follow it to its end.

use super::args::SubmitArgs;
use super::attach::{attach, followed, Follower};
use super::copies::submit_copies;
use super::nodes::{check_exclude, Hostfile};
use super::spec::{build_jobspec, said_as_typed};
use crate::cli::connect;
use crate::cli::submit::submit_value;
use crate::client::Client;
use crate::jobs::JobId;
use crate::jobspec::Jobspec;
use serde_json::{json, Value};

/// `vigil run` (attach = true) and `vigil submit`.
pub(crate) async fn run(a: SubmitArgs, attach_after: bool) -> Result<i32, String> {
    if let Some(cc) = &a.cc {
        if attach_after {
            return Err(
                "--cc is for `vigil submit` (each copy is a job of its own; `vigil job wait ID` waits for one)".into(),
            );
        }
        return submit_copies(&a, cc).await;
    }
    let spec = build_jobspec(&a)?;
    if a.dry_run {
        println!("{}", spec.to_json());
        return Ok(0);
    }
    let mut c = connect().await?;
    if let Some(hf) = Hostfile::of(&a)? {
        hf.check_nodes(&c, &a.select).await?;
    }
    check_exclude(&c, &a.select).await?;
    let id = submit_with(&mut c, &spec, attach_after, a.queue.urgency())
        .await
        .map_err(|e| said_as_typed(&a.setopt, a.taskmap.as_deref(), e))?;
    if !attach_after {
        println!("{id}");
        return Ok(0);
    }
    // Standard input goes to every task (as srun does by default), paced by rank 0's acknowledgements.
    let c2 = c.clone();
    let feeder = tokio::spawn(async move {
        use base64::Engine as _;
        use tokio::io::AsyncReadExt;
        let mut input = tokio::io::stdin();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match input.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let data = base64::engine::general_purpose::STANDARD.encode(&buf[..n]);
                    match c2.rpc("job-exec.stdin", 0, &json!({"id": id.0, "data": data})).await {
                        Ok(_) => {}
                        // Rank 0 holds a job's input until it ends, up to a bound: past it, say so and end the
                        // tasks' input where it was cut rather than leave them waiting for the rest.
                        Err(e) if e.errnum == crate::message::errno::ENOSPC => {
                            eprintln!("vigil: standard input cut short: {}", e.errstr);
                            break;
                        }
                        // The job's input is closed (it ended) or the instance is gone: nothing to tell.
                        Err(_) => return,
                    }
                }
            }
        }
        let _ = c2.rpc("job-exec.stdin", 0, &json!({"id": id.0, "eof": true})).await;
    });
    let r = followed(attach(&c, id, a.label_io, Follower::Run).await, id);
    feeder.abort();
    r
}

pub(super) async fn submit(c: &mut Client, spec: &Jobspec) -> Result<JobId, String> {
    submit_with(c, spec, false, None).await
}

/// Submit ([`submit_value`]: `c` is the new connection if rank 0 restarted meanwhile); with `stdin` the job's
/// tasks read what this process then sends as `job-exec.stdin`.
async fn submit_with(c: &mut Client, spec: &Jobspec, stdin: bool, urgency: Option<u32>) -> Result<JobId, String> {
    let v: Value = serde_json::from_str(&spec.to_json()).map_err(|e| e.to_string())?;
    submit_value(c, &v, stdin, urgency).await
}
