//! The `job-manager` service, rank 0 only: submit, list, inspect, cancel, raise on and purge jobs.

use super::*;
use crate::broker::core::{Held, StateDir};
use tracing::info;

/// Topics of the `job-manager` service: and their handlers (who may call each: `broker/access.rs`).
pub(super) const TOPICS: &[Topic] = &[
    Topic { name: "job-manager.submit", handler: submit },
    Topic { name: "job-manager.list", handler: list },
    Topic { name: "job-manager.info", handler: info },
    Topic { name: "job-manager.cancel", handler: cancel },
    Topic { name: "job-manager.urgency", handler: urgency },
    Topic { name: "job-manager.update", handler: update },
    Topic { name: "job-manager.raise", handler: raise },
    Topic { name: "job-manager.purge", handler: purge },
    Topic { name: "job-manager.history", handler: history },
    Topic { name: "job-manager.eventlog", handler: super::job_info::attach_or_eventlog },
];

/// A `job-manager.submit` request (`vigil submit`, `vigil run`; Flux's `job-ingest.submit`).
#[derive(Debug, Deserialize)]
struct SubmitRequest {
    /// The job's jobspec (RFC 14 / RFC 25), as JSON; checked by the job core.
    jobspec: Value,
    /// Whether the submitter streams the job's standard input (`job-exec.stdin`, as `vigil run` does); false when
    /// absent.
    stdin: Option<bool>,
    /// The client's key for this submission (`jobs/submit_key.rs`): a string of 1 to 128 printable ASCII
    /// characters, e.g. a random 128-bit number in hex. A submission sent again with the same key (by the same
    /// user) gets the job the first made, `"duplicate": true` in the answer. Absent: a new job every time.
    /// Checked by the job core (a `Value` here, so that a wrong type is refused naming the field).
    submit_key: Option<Value>,
    /// The job's RFC 21 urgency, an integer from 0 (held) to 31 (expedite); 16 when absent. More than 16 is the
    /// instance owner's only (`jobs/urgency.rs`).
    urgency: Option<Value>,
    /// A guest's munge credential over the jobspec's JSON text as sent (`vigil_client::munge`), a string of at
    /// most [`MAX_CREDENTIAL`] bytes: kept with the job, never decoded here, handed to `vigil-imp` on each node
    /// (docs/security.md). Required of a guest when the brokers are not root.
    credential: Option<Value>,
}

/// The longest credential a submission may carry (munge's own are a few hundred bytes over a small payload).
const MAX_CREDENTIAL: usize = 16 << 10;

/// A submission's `credential`, checked: a string of printable ASCII of at most [`MAX_CREDENTIAL`] bytes.
fn credential_of(v: Option<&Value>) -> Result<Option<String>, ServiceError> {
    let Some(v) = v.filter(|v| !v.is_null()) else { return Ok(None) };
    match v.as_str() {
        Some(s) if !s.is_empty() && s.len() <= MAX_CREDENTIAL && s.bytes().all(|b| b.is_ascii_graphic()) => {
            Ok(Some(s.to_string()))
        }
        _ => Err(ServiceError::einval(format!(
            "credential: must be a munge credential, a string of printable ASCII of at most {MAX_CREDENTIAL} bytes"
        ))),
    }
}

/// An urgency as a request gives it (`urgency` of `job-manager.submit` and `job-manager.urgency`), checked.
fn urgency_of(v: Option<&Value>, owner: bool) -> Result<u32, ServiceError> {
    let Some(v) = v.filter(|v| !v.is_null()) else { return Ok(crate::jobs::DEFAULT_URGENCY) };
    let u = v.as_u64().filter(|u| *u <= u64::from(crate::jobs::MAX_URGENCY)).ok_or_else(|| {
        ServiceError::einval(format!("urgency: must be an integer from 0 (hold) to 31 (expedite), got {v}"))
    })?;
    if !owner && u > u64::from(crate::jobs::DEFAULT_URGENCY) {
        return Err(ServiceError::eperm(format!(
            "urgency {u}: only the instance owner may give more than {}",
            crate::jobs::DEFAULT_URGENCY
        )));
    }
    Ok(u as u32)
}

/// `job-manager.submit`.
fn submit(core: &mut Broker, msg: &Message, lazy: &Body<'_>) -> Reply {
    let req: SubmitRequest = lazy.decode()?;
    let credential = credential_of(req.credential.as_ref())?;
    // A guest's job runs as the guest, or not at all (never as the brokers' user).
    crate::broker::access::may_submit(msg.userid, core.env.uid, credential.is_some())
        .map_err(|d| ServiceError::new(d.errno, d.message))?;
    let n = core.wall();
    let size = core.opts.size;
    let urgency = urgency_of(req.urgency.as_ref(), msg.userid == core.env.uid)?;
    let jc = job_core!(core);
    let spec = &req.jobspec;
    let stdin = req.stdin.unwrap_or(false);
    let key = match &req.submit_key {
        None | Some(Value::Null) => None,
        Some(v) => Some(crate::jobs::SubmitKey::parse(v).map_err(|e| ServiceError::einval(e.to_string()))?),
    };
    match &core.statedir {
        StateDir::Damaged { dir, why } => {
            return Err(ServiceError::erofs(format!(
                "no new job is taken: rank 0 could not read its state directory {} ({why}); scheduling \
                     is stopped until an operator repairs or moves the store and restarts rank 0",
                dir.display()
            )))
        }
        StateDir::Open { .. } | StateDir::None => {}
    }
    // `vigil run` streams its standard input to the tasks (job-exec.stdin).
    let sub = crate::jobs::SubmitRequest::new(spec, msg.userid).stdin(stdin).key(key).urgency(urgency);
    match jc.submit(n, sub.credential(credential)) {
        Ok(crate::jobs::Submitted { id, duplicate }) => {
            // RFC 14: unknown attributes.system keys are ignored, and the submitter is told.
            let warnings = jc.jobs.get(&id).map(|j| j.req.warnings.clone()).unwrap_or_default();
            let mut answer = json!({"id": id.0, "id_f58": id.f58(), "warnings": warnings});
            if duplicate {
                // Sent again with its key (its first answer was lost): the job it made, not a new one.
                info!("job {id} submitted again with its submit_key: no new job");
                answer["duplicate"] = Value::Bool(true);
            } else {
                info!("job {id} submitted");
                core.counters.submits += 1;
            }
            if jc.journaling() {
                // A duplicate too: the job it names may not be durable yet (its first answer is held as well).
                // Answered once the job's record is durable (Input::Stored, then Input::Synced), not before.
                core.awaiting_durable.push((msg.head(), Held::Submission(answer)));
                return Ok(None);
            }
            Ok(Some(answer.into()))
        }
        Err(e) => {
            // Brokers still to join (the instance is starting, or rank 0 restarted and they are
            // rejoining it) may be what the request needs: try again, rather than never.
            let joined = jc.ranks_joined();
            let waiting = joined < size as usize
                && match &e {
                    crate::jobs::SubmitError::Unsatisfiable(crate::jobs::sched::Unsatisfiable::Nodes {
                        want, ..
                    }) => *want <= size,
                    crate::jobs::SubmitError::Unsatisfiable(crate::jobs::sched::Unsatisfiable::Constrained {
                        ..
                    })
                    | crate::jobs::SubmitError::UnknownNodes { .. } => true,
                    crate::jobs::SubmitError::Unsatisfiable(crate::jobs::sched::Unsatisfiable::NodeTooSmall {
                        ..
                    }) => true,
                    _ => false,
                };
            if waiting {
                return Err(ServiceError::eagain(format!(
                    "{e}, as only {joined} of its {size} brokers have joined so far: try again"
                )));
            }
            if let crate::jobs::SubmitError::SubmitKeyReused { .. }
            | crate::jobs::SubmitError::CredentialReused { .. } = e
            {
                return Err(ServiceError::eexist(e.to_string()));
            }
            Err(ServiceError::einval(e.to_string()))
        }
    }
}

/// A `job-manager.list` request (`vigil jobs`): one page of the jobs, newest first. The answer is `{"jobs":
/// [...], "next": ID}`: `next`, present when more jobs follow, is the id of the page's last (oldest) job, to ask
/// for the next page with (`before`).
/// A page ends at `count` jobs, or at [`LIST_ANSWER_BYTES`] of JSON; without `count`, only the latter, so a page is
/// never too large for a message however many jobs rank 0 holds.
#[derive(Debug, Deserialize)]
struct ListRequest {
    /// Inactive jobs too (`vigil jobs -a`); false when absent: active jobs only.
    all: Option<bool>,
    /// Only this user's jobs (`vigil jobs`, Flux's `userid` of `job-list.list`); absent: every user's (`vigil jobs
    /// -A`). Each job shows its user; none shows its command or environment (those are in `job-manager.info`, for
    /// the job's owner and the instance owner).
    userid: Option<u32>,
    /// At most this many jobs in the page (`vigil jobs -c`: rank 0 builds no more than asked for); absent or 0: up
    /// to [`LIST_ANSWER_BYTES`].
    count: Option<u64>,
    /// Only jobs older than this one (a job id, its number or f58 text): the `next` of the previous page.
    before: Option<JobRef>,
}

/// The most bytes of jobs one `job-manager.list` answer holds (JSON): well within a message's `MAX_FRAME`
/// (64 MiB); 100,000 jobs are about 70 MB of it, so such a listing comes in pages (`next`).
const LIST_ANSWER_BYTES: usize = 16 << 20;

/// Why pending job `j` waits, as caller `uid` is told: a held job's reason says how to release it only to who may
/// (its owner, the instance owner `owner`), as the other hints of `vigil` are for who may act on them.
fn reason_for(jc: &crate::jobs::JobCore, j: &crate::jobs::Job, now: f64, uid: u32, owner: u32) -> Option<String> {
    let r = jc.pending_reason(j.id).or_else(|| jc.depend_reason(j.id, now))?;
    if r == crate::jobs::HELD_REASON && (uid == owner || uid == j.userid) {
        return Some(format!("{r} (`vigil job release {}` lets it go)", j.id.f58()));
    }
    Some(r)
}

/// `job-manager.list`.
fn list(core: &mut Broker, msg: &Message, lazy: &Body<'_>) -> Reply {
    let req: ListRequest = lazy.decode()?;
    let n = core.wall();
    let (uid, owner) = (msg.userid, core.env.uid);
    let jc: &crate::jobs::JobCore = job_core!(core);
    let all = req.all.unwrap_or(false);
    let with_reason = |j: &crate::jobs::Job| {
        let mut v = j.info();
        if let (Some(r), Some(o)) = (reason_for(jc, j, n, uid, owner), v.as_object_mut()) {
            o.insert("reason_pending".into(), Value::String(r));
        }
        if let (Some(t), Some(o)) = (jc.estimate(j.id), v.as_object_mut()) {
            // Flux's shape: the scheduler's expected start of the job holding the reservation.
            o.insert("annotations".into(), json!({"sched": {"t_estimate": t}}));
        }
        v
    };
    let user = req.userid;
    let count = req.count.filter(|n| *n > 0).map_or(usize::MAX, |n| usize::try_from(n).unwrap_or(usize::MAX));
    let before = req.before.as_ref().map(JobRef::id).transpose()?;
    let older = match before {
        Some(b) => jc.jobs.range(..b),
        None => jc.jobs.range(..),
    };
    // The answer's JSON written job by job (one value at a time, not one per job held at once).
    let mut buf = Vec::from(&b"{\"jobs\":["[..]);
    let (mut n, mut last, mut next) = (0usize, None, None);
    for j in older.rev().map(|(_, j)| j).filter(|j| (all || j.state.is_active()) && user.is_none_or(|u| j.userid == u))
    {
        if n == count || buf.len() > LIST_ANSWER_BYTES {
            next = last; // the next page starts with this job, older than the last one listed
            break;
        }
        if n > 0 {
            buf.push(b',');
        }
        serde_json::to_writer(&mut buf, &with_reason(j)).map_err(|e| ServiceError::eproto(e.to_string()))?;
        (n, last) = (n + 1, Some(j.id.0));
    }
    buf.push(b']');
    if let Some(id) = next {
        buf.extend_from_slice(format!(",\"next\":{id}").as_bytes());
    }
    buf.push(b'}');
    Ok(Some(Out(buf)))
}

/// A `job-manager.history` request (`vigil history`): ended jobs' records (`jobs/history.rs`), purged ones too,
/// newest first. Every field is optional.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HistoryRequest {
    /// Jobs that ended at or after this time (seconds since the Unix epoch).
    since: Option<f64>,
    /// Jobs that ended before this time.
    until: Option<f64>,
    /// Only this user's jobs; absent: every user's (as `job-manager.list`, no record holds a command or an
    /// environment).
    userid: Option<u32>,
    /// Only jobs of this name.
    name: Option<String>,
    /// Only jobs with one of these results: COMPLETED, FAILED, CANCELED, TIMEOUT (any case).
    results: Option<Vec<String>>,
    /// At most this many, the newest.
    count: Option<u64>,
}

/// The most bytes of records one `job-manager.history` answer holds (JSON): well within a message's
/// `MAX_FRAME` (64 MiB). Past it the answer says `"truncated": true` (ask with `until`
/// set to the oldest end time given for the rest).
const HISTORY_ANSWER_BYTES: usize = 48 << 20;

/// `job-manager.history`.
fn history(core: &mut Broker, _msg: &Message, lazy: &Body<'_>) -> Reply {
    let req: HistoryRequest = lazy.decode()?;
    for (field, t) in [("since", req.since), ("until", req.until)] {
        if t.is_some_and(|t| !t.is_finite()) {
            return Err(ServiceError::eproto(format!("'{field}' must be a finite number of seconds")));
        }
    }
    let results = req.results.unwrap_or_default();
    for r in &results {
        if !["COMPLETED", "FAILED", "CANCELED", "TIMEOUT"].iter().any(|k| k.eq_ignore_ascii_case(r)) {
            return Err(ServiceError::einval(format!(
                "results: unknown result '{r}' (known: COMPLETED, FAILED, CANCELED, TIMEOUT)"
            )));
        }
    }
    let jc = job_core!(core);
    let q = crate::jobs::history::HistoryQuery {
        since: req.since,
        until: req.until,
        userid: req.userid,
        name: req.name,
        results,
        count: req.count.map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
    };
    // The answer's JSON written as it goes (no value per record): `{"jobs": [...], "kept": N, "truncated": B}`.
    let mut buf = Vec::from(&b"{\"jobs\":["[..]);
    let mut truncated = false;
    for (i, r) in jc.history(&q).iter().enumerate() {
        let mark = buf.len();
        if i > 0 {
            buf.push(b',');
        }
        r.write_json(&mut buf);
        if buf.len() > HISTORY_ANSWER_BYTES {
            buf.truncate(mark);
            truncated = true;
            break;
        }
    }
    buf.extend_from_slice(format!("],\"kept\":{},\"truncated\":{truncated}}}", jc.history_len()).as_bytes());
    Ok(Some(Out(buf)))
}

/// A `job-manager.info` request (`vigil job info`): a job's state, jobspec and R.
#[derive(Debug, Deserialize)]
struct InfoRequest {
    /// The job.
    id: JobRef,
}

/// `job-manager.info`.
fn info(core: &mut Broker, msg: &Message, lazy: &Body<'_>) -> Reply {
    let req: InfoRequest = lazy.decode()?;
    let n = core.wall();
    let (uid, owner) = (msg.userid, core.env.uid);
    let jc: &crate::jobs::JobCore = job_core!(core);
    let id = req.id.id()?;
    let j = jc.jobs.get(&id).ok_or(ServiceError::enoent(format!("unknown job id {id}")))?;
    let mut info = j.info();
    if let (Some(r), Some(o)) = (reason_for(jc, j, n, uid, owner), info.as_object_mut()) {
        o.insert("reason_pending".into(), Value::String(r));
    }
    if let (Some(t), Some(o)) = (jc.estimate(id), info.as_object_mut()) {
        o.insert("annotations".into(), json!({"sched": {"t_estimate": t}}));
    }
    Ok(Some(json!({"info": info, "jobspec": j.jobspec(), "R": j.r}).into()))
}

/// A `job-manager.cancel` request (`vigil cancel`; Flux's `flux cancel`, a `cancel` exception of severity 0).
#[derive(Debug, Deserialize)]
struct CancelRequest {
    /// The job: the caller's own, unless the caller is the instance owner.
    id: JobRef,
    /// The exception's note; "canceled by user" when absent.
    note: Option<String>,
}

/// `job-manager.cancel`.
fn cancel(core: &mut Broker, msg: &Message, lazy: &Body<'_>) -> Reply {
    let req: CancelRequest = lazy.decode()?;
    let n = core.wall();
    let owner = msg.userid == core.env.uid;
    let jc = job_core!(core);
    let id = req.id.id()?;
    let note = req.note.unwrap_or_else(|| "canceled by user".to_string());
    jc.cancel(n, id, msg.userid, owner, &note).map_err(|(errno, message)| ServiceError { errno, message })?;
    Ok(Some(json!({}).into()))
}

/// A `job-manager.urgency` request (`vigil job urgency`, `hold`, `release`; Flux's `job-manager.urgency`).
#[derive(Debug, Deserialize)]
struct UrgencyRequest {
    /// The job: the caller's own, unless the caller is the instance owner. It must be pending.
    id: JobRef,
    /// The new urgency, 0 (hold) to 31 (expedite); more than 16 is the instance owner's only.
    urgency: Value,
    /// Change it only if the job is held (urgency 0), else refuse (`vigil job release`); false when absent.
    release: Option<bool>,
}

/// `job-manager.urgency`: answers the urgency the job had, `{"old": 16}`.
fn urgency(core: &mut Broker, msg: &Message, lazy: &Body<'_>) -> Reply {
    let req: UrgencyRequest = lazy.decode()?;
    let n = core.wall();
    let owner = msg.userid == core.env.uid;
    let u = urgency_of(Some(&req.urgency), owner)?;
    let jc = job_core!(core);
    let id = req.id.id()?;
    let old = jc
        .set_urgency(n, id, msg.userid, owner, u, req.release.unwrap_or(false))
        .map_err(|(errno, message)| ServiceError { errno, message })?;
    info!("job {id}: urgency {old} -> {u}");
    Ok(Some(json!({"old": old}).into()))
}

/// A `job-manager.update` request (`vigil update`; Flux's `job-manager.update`): change a job's time limit,
/// name or urgency (`jobs/update.rs` says which state allows what).
#[derive(Debug, Deserialize)]
struct UpdateRequest {
    /// The job: the caller's own, unless the caller is the instance owner.
    id: JobRef,
    /// What to change: `{"duration": "30m" | SECONDS | "+10m", "name": "x", "urgency": N}`.
    updates: serde_json::Map<String, Value>,
}

/// `job-manager.update`: answers what changed, the `jobspec-update` context (`{"attributes.system.duration":
/// 1800}`), with `urgency: {old, new}` when it changed.
fn update(core: &mut Broker, msg: &Message, lazy: &Body<'_>) -> Reply {
    let req: UpdateRequest = lazy.decode()?;
    let n = core.wall();
    let owner = msg.userid == core.env.uid;
    let u = crate::jobs::update::Update::parse(&req.updates).map_err(ServiceError::einval)?;
    let jc = job_core!(core);
    let id = req.id.id()?;
    let answer = jc.update(n, id, msg.userid, owner, &u).map_err(|(errno, message)| ServiceError { errno, message })?;
    info!("job {id} updated: {answer}");
    Ok(Some(answer.into()))
}

/// A `job-manager.raise` request (`vigil job raise`; Flux's `job-manager.raise`): an exception on a job (RFC 21).
#[derive(Debug, Deserialize)]
struct RaiseRequest {
    /// The job: the caller's own, unless the caller is the instance owner.
    id: JobRef,
    /// The exception's type (`cancel`, `timeout`...); `exec` when absent.
    #[serde(rename = "type")]
    kind: Option<String>,
    /// 0 (fatal: the job ends) to 7; 0 when absent.
    severity: Option<u64>,
    /// Free text; empty when absent.
    note: Option<String>,
}

/// `job-manager.raise`.
fn raise(core: &mut Broker, msg: &Message, lazy: &Body<'_>) -> Reply {
    let req: RaiseRequest = lazy.decode()?;
    let n = core.wall();
    let owner = msg.userid == core.env.uid;
    let jc = job_core!(core);
    let id = req.id.id()?;
    let kind = req.kind.unwrap_or_else(|| "exec".to_string());
    let sev = severity(req.severity)?;
    let note = req.note.unwrap_or_default();
    if !owner && jc.jobs.get(&id).is_some_and(|j| j.userid != msg.userid) {
        return Err(ServiceError::eperm("not your job"));
    }
    if jc.raise(n, id, &kind, sev, &note) {
        Ok(Some(json!({}).into()))
    } else {
        Err(ServiceError::enoent(format!("job {id} is not active")))
    }
}

/// A `job-manager.purge` request (`vigil job purge`; Flux's `flux job purge`): forget inactive jobs by age, by
/// count or by id (one at least; [`crate::jobs::purge`]). Without `force`, only counts what would be purged.
#[derive(Debug, Deserialize)]
struct PurgeRequest {
    /// Inactive jobs that became inactive more than this many seconds ago (a number >= 0).
    age_limit: Option<f64>,
    /// The oldest inactive jobs beyond this many.
    num_limit: Option<u64>,
    /// These jobs, which must be inactive.
    ids: Option<Vec<JobRef>>,
    /// Purge, rather than count; false when absent.
    force: Option<bool>,
}

/// `job-manager.purge`.
fn purge(core: &mut Broker, _msg: &Message, lazy: &Body<'_>) -> Reply {
    let req: PurgeRequest = lazy.decode()?;
    let n = core.wall();
    let jc = job_core!(core);
    // Flux's `flux job purge`: a guest names its own jobs by id; limits are the instance owner's (access.rs).
    let age_limit = match req.age_limit {
        Some(a) if !(a.is_finite() && a >= 0.0) => {
            return Err(ServiceError::eproto("'age_limit' must be a number of seconds >= 0, got a number"))
        }
        a => a,
    };
    let num_limit = req.num_limit.map(|n| usize::try_from(n).unwrap_or(usize::MAX));
    let ids = req.ids.unwrap_or_default().iter().map(JobRef::id).collect::<Result<Vec<_>, _>>()?;
    let force = req.force.unwrap_or(false);
    let req = crate::jobs::purge::PurgeRequest { age_limit, num_limit, ids, force };
    match jc.purge(n, &req) {
        Ok(count) => {
            if force && count > 0 {
                info!("{count} inactive job(s) purged");
            }
            Ok(Some(json!({"count": count, "purged": force, "inactive": jc.inactive_count()}).into()))
        }
        Err(e @ crate::jobs::purge::PurgeError::Unknown(_)) => Err(ServiceError::enoent(e.to_string())),
        Err(e) => Err(ServiceError::einval(e.to_string())),
    }
}
