//! Submitting a job (`job-manager.submit`) exactly once, across a restart of rank 0.
//!
//! Every submission carries a key of its own (`submit_key`, 128 random bits in hex; the job core's rules are in
//! `jobs/submit_key.rs`). When the connection to rank 0 fails with the submission in flight (the connection to
//! our broker ended, or our broker answered EHOSTUNREACH: rank 0 or a router on the way was lost), rank 0 may
//! have made the job durable before it died: the command cannot know. So it waits for rank 0 to come back and
//! sends the same submission again, with the same key: a rank 0 that holds the job answers with its id
//! (`"duplicate": true`), one that does not makes it. Either way the job exists once, and a batch script gets
//! its job id rather than an error.
//!
//! How long it waits (the reconnection rules of `vigil job attach`, `jobcmd/attach.rs` `await_rank0`):
//! - connected to rank 0: only if the instance keeps its jobs while rank 0 restarts (`rank0_grace` > 0 in rank
//!   0's welcome: a state directory), and at most that long plus [`super::jobcmd::RANK0_WAIT_MARGIN`],
//!   reconnecting to `$VIGIL_URI` every [`RESEND_EVERY`];
//! - connected to another broker: as long as that broker stays up (it keeps requests for rank 0 while it waits
//!   for it, and stops past its own grace), at most [`RESEND_WAIT_MAX`].
//!
//! Past that the command says that rank 0 did not come back and that the job may exist all the same.

use super::rpc_to_rank0_err;
use crate::client::{Client, RpcError};
use crate::jobs::JobId;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// How often a submission whose connection failed is tried again while rank 0 is away.
pub(crate) const RESEND_EVERY: Duration = Duration::from_millis(500);

/// The longest a command connected to a broker other than rank 0 keeps sending a submission again (that broker
/// stops sooner if rank 0 does not come back within its `tbon.parent_grace`): 5 min.
pub(crate) const RESEND_WAIT_MAX: Duration = Duration::from_secs(300);

/// A new submission key: 128 random bits in hex, from the system's generator.
///
/// # Errors
/// The system's random generator failed.
pub(crate) fn new_submit_key() -> Result<String, String> {
    use ring::rand::SecureRandom;
    let mut bits = [0u8; 16];
    ring::rand::SystemRandom::new()
        .fill(&mut bits)
        .map_err(|_| "cannot draw a submission key: the system's random generator failed".to_string())?;
    Ok(bits.iter().map(|b| format!("{b:02x}")).collect())
}

/// Whether a submission failed with its outcome unknown: its connection to rank 0 was lost with it in flight.
fn outcome_unknown(e: &RpcError) -> bool {
    e.errnum == crate::message::errno::EHOSTUNREACH
}

/// Submit a jobspec already in JSON form (`job-manager.submit`), with a submission key of its own, sending it
/// again with the same key when the connection to rank 0 fails with it in flight (module doc); `c` becomes the
/// new connection if it had to connect again. Returns the job's id.
///
/// # Errors
/// Rank 0's refusal; or rank 0 lost with the submission in flight and not back in time (the job may exist:
/// said so).
pub(crate) async fn submit_value(
    c: &mut Client,
    v: &Value,
    stdin: bool,
    urgency: Option<u32>,
) -> Result<JobId, String> {
    let key = new_submit_key()?;
    let mut payload = json!({"jobspec": v, "stdin": stdin, "submit_key": key});
    if let Some(u) = urgency {
        payload["urgency"] = json!(u); // RFC 21, as Flux's submit request carries it
    }
    if let Some(cred) = guest_credential(c, v) {
        payload["credential"] = json!(cred);
    }
    let mut deadline: Option<tokio::time::Instant> = None;
    let r = loop {
        let e = match rpc_to_rank0_err(c, "job-manager.submit", &payload).await {
            Ok(r) => break r,
            Err(e) if outcome_unknown(&e) => e,
            Err(e) => return Err(e.errstr),
        };
        let on_rank0 = c.welcome.rank == 0;
        let limit = match deadline {
            Some(d) => d,
            None => {
                let Some(limit) = wait_limit(c) else { return Err(gave_up(&e.errstr, None)) };
                // Once per command: the copies of `vigil submit --cc` wait together.
                static SAID: AtomicBool = AtomicBool::new(false);
                if !SAID.swap(true, Ordering::Relaxed) {
                    eprintln!(
                        "vigil: {}; the submission may have reached rank 0: sending it again once rank 0 is back (up \
                         to {:.0} s; it carries its own key, so it makes one job)",
                        e.errstr,
                        limit.as_secs_f64()
                    );
                }
                *deadline.insert(tokio::time::Instant::now() + limit)
            }
        };
        if tokio::time::Instant::now() + RESEND_EVERY > limit {
            return Err(gave_up(&e.errstr, Some(limit)));
        }
        tokio::time::sleep(RESEND_EVERY).await;
        if e.errstr == RpcError::disconnected_text() {
            // Our broker's connection ended: rank 0's own restarting (we were connected to it), or our broker
            // stopped. Connect again when it listens; until then, try again next turn.
            let uri = std::env::var(crate::client::URI_ENV).map_err(|_| gave_up(&e.errstr, None))?;
            match Client::connect(&uri).await {
                Ok(nc) => *c = nc,
                Err(_) if on_rank0 => {}
                // Our own broker is gone: it stopped past its grace without rank 0.
                Err(_) => return Err(gave_up(&e.errstr, deadline)),
            }
        }
    };
    for w in r.get("warnings").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str) {
        eprintln!("vigil: warning: jobspec {w}");
    }
    r.get("id").and_then(Value::as_u64).map(JobId).ok_or_else(|| "malformed submit response".into())
}

/// The munge credential of a guest's submission to a multi-user instance (`vigil_client::munge`: what
/// `vigil-imp` checks before it runs the job as its submitter), over the jobspec's JSON text as sent; `None` for
/// the instance owner, in an instance that is not multi-user, and where munge is not available: the field is
/// optional, and brokers do not require it yet (docs/security.md, "Not yet").
fn guest_credential(c: &Client, jobspec: &Value) -> Option<String> {
    // SAFETY: getuid cannot fail.
    if !c.welcome.guests || unsafe { libc::getuid() } == c.welcome.uid {
        return None;
    }
    let text = serde_json::to_string(jobspec).ok()?;
    crate::client::munge::credential(&c.welcome.instance, text.as_bytes(), None).ok()
}

/// How long to wait for rank 0 before sending a submission again (module doc); `None`: not at all (connected to
/// rank 0 of an instance that does not keep its jobs across a restart).
fn wait_limit(c: &Client) -> Option<Duration> {
    if c.welcome.rank != 0 {
        return Some(RESEND_WAIT_MAX);
    }
    let grace = c.welcome.rank0_grace;
    (grace > 0.0 && grace.is_finite()).then(|| Duration::from_secs_f64(grace + super::jobcmd::RANK0_WAIT_MARGIN))
}

/// What a command says when a submission's outcome stays unknown: `e`, and that the job may exist.
fn gave_up(e: &str, waited: Option<tokio::time::Instant>) -> String {
    let back = if waited.is_some() { "; rank 0 did not come back in time" } else { "" };
    format!(
        "{e}{back}: the job may have been accepted all the same (rank 0 may have made it durable before it was \
         lost); look for it with `vigil jobs -a` before submitting it again"
    )
}
