//! Who may do what: one table, [`RULES`], giving every service topic its access [`Rule`], checked by
//! [`check`] before the topic's handler runs (`services::dispatch`). Sans-IO: the caller's uid comes in with the
//! request, the job's owner through a lookup; nothing here reads a socket or a file.
//!
//! **Identity.** A request's `userid` (`message.rs`) is what the kernel said (`SO_PEERCRED`) on the local socket
//! of the broker the client connected to: that broker overwrites whatever the client put there
//! (`routing.rs`). A request a peer broker forwards keeps the userid that broker stamped: it is trusted as far
//! as the peer is, an overlay member holding the instance's key (docs/security.md says what a compromised
//! broker can do with that). Requests a broker makes itself carry the instance owner's uid.
//!
//! **Users.** The *instance owner* is the uid the brokers run as. A personal instance (`vigil start`, batch,
//! alloc) admits its owner only, at the local socket. A multi-user system instance
//! (`access.allow-guest-users`) admits every uid; the others are *guests*, and what a guest may do is this
//! table:
//!
//! | rule | who | topics |
//! |---|---|---|
//! | [`Rule::Anyone`] | every admitted user | ping, attributes, info, rtt; resource and overlay status; submit, list (each job shows its user; details only to their owner: `services/job_manager.rs`); process-exit watches |
//! | [`Rule::LocalClient`] | every admitted user of this broker's socket | event subscriptions |
//! | [`Rule::JobOwner`] | the owner of the job the payload's `id` names, or the instance owner | info, eventlog, attach, stdin, cancel, raise (kill, urgency), what a job's shell reports |
//! | [`Rule::JobsOwner`] | the owner of every job in `ids`, or the instance owner (who alone may purge by age or count) | purge |
//! | [`Rule::InstanceOwner`] | the instance owner | drain, undrain, shutdown, publish events, the brokers' own topics (rexec, overlay membership, node registration), and **every topic not in the table** |
//!
//! A refusal is EPERM and says who may: `permission denied: job ƒ2x belongs to uid 1001: only its owner or the
//! instance owner (uid 0) may use 'job-manager.cancel'`. A job the table cannot find (no such id) is left to
//! the handler, which says so (ENOENT): a guest learns nothing of another user's job but that it exists, as
//! `vigil jobs -A` shows anyway.

use crate::jobs::JobId;
use crate::message::errno;
use serde_json::Value;

/// Who may call a topic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    /// Every user the instance admits.
    Anyone,
    /// Every user the instance admits, from this broker's local socket only (EPROTO from elsewhere: the
    /// request is about the connection itself).
    LocalClient,
    /// The owner of the job named by the payload's `id` (a number or an f58 string), or the instance owner.
    JobOwner,
    /// The owner of every job named by the payload's `ids`, or the instance owner; only the instance owner may
    /// name jobs by `age_limit` or `num_limit` instead (Flux's `flux job purge`).
    JobsOwner,
    /// The instance owner only.
    InstanceOwner,
}

/// Every service topic and its rule. A topic not here is [`Rule::InstanceOwner`] (deny by default); a unit test
/// checks that every topic a service registers has its row, and that every row names a registered topic.
pub const RULES: &[(&str, Rule)] = &[
    // broker: every rank.
    ("broker.ping", Rule::Anyone),
    ("broker.getattr", Rule::Anyone),
    ("broker.lsattr", Rule::Anyone),
    ("broker.info", Rule::Anyone),
    ("broker.rtt", Rule::Anyone),
    ("broker.sub", Rule::LocalClient),
    ("broker.unsub", Rule::LocalClient),
    ("broker.pub", Rule::InstanceOwner),
    ("broker.shutdown", Rule::InstanceOwner),
    // detect: a job shell (as its job's user) watches its tasks' exits.
    ("detect.watch", Rule::Anyone),
    // rexec: rank 0's exec system to each broker.
    ("rexec.notify", Rule::InstanceOwner),
    ("rexec.spawn", Rule::InstanceOwner),
    ("rexec.kill", Rule::InstanceOwner),
    ("rexec.pmi-answer", Rule::InstanceOwner),
    // overlay: the brokers' own membership reports, and the status anyone may read.
    ("overlay.torpid", Rule::InstanceOwner),
    ("overlay.lively", Rule::InstanceOwner),
    ("overlay.lost", Rule::InstanceOwner),
    ("overlay.offline", Rule::InstanceOwner),
    ("overlay.reparent", Rule::InstanceOwner),
    ("overlay.status", Rule::Anyone),
    ("overlay.transport", Rule::Anyone),
    // resource.
    ("resource.register", Rule::InstanceOwner),
    ("resource.status", Rule::Anyone),
    ("resource.list", Rule::Anyone),
    ("resource.drain", Rule::InstanceOwner),
    ("resource.undrain", Rule::InstanceOwner),
    ("resource.eventlog", Rule::Anyone),
    ("resource.R", Rule::Anyone),
    // job-manager.
    ("job-manager.submit", Rule::Anyone),
    ("job-manager.list", Rule::Anyone),
    ("job-manager.history", Rule::Anyone),
    ("job-manager.info", Rule::JobOwner),
    ("job-manager.cancel", Rule::JobOwner),
    ("job-manager.urgency", Rule::JobOwner),
    ("job-manager.update", Rule::JobOwner),
    ("job-manager.raise", Rule::JobOwner),
    ("job-manager.purge", Rule::JobsOwner),
    ("job-manager.eventlog", Rule::JobOwner),
    // job-info.
    ("job-info.attach", Rule::JobOwner),
    ("job-info.stdin", Rule::JobOwner),
    // Drops the caller's own watchers (those of its route) only.
    ("job-info.disconnect", Rule::Anyone),
    // job-exec: `vigil run`'s input, and what a job's shells (running as the job's user) report.
    ("job-exec.stdin", Rule::JobOwner),
    ("job-exec.output", Rule::JobOwner),
    ("job-exec.task-exit", Rule::JobOwner),
    ("job-exec.exception", Rule::JobOwner),
    ("job-exec.nested", Rule::JobOwner),
    ("job-exec.pmi-barrier", Rule::JobOwner),
    ("job-exec.shell-exit", Rule::JobOwner),
];

/// The rule of `topic`: its row of [`RULES`], else [`Rule::InstanceOwner`].
pub fn rule(topic: &str) -> Rule {
    RULES.iter().find(|(t, _)| *t == topic).map_or(Rule::InstanceOwner, |(_, r)| *r)
}

/// Why a request was refused: the errno of its error response and a message saying who may.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message} (errno {errno})")]
pub struct Denied {
    /// EPERM (not this user) or EPROTO (not from here, or a job id that is not one).
    pub errno: u32,
    /// The error string, naming the topic and who may use it.
    pub message: String,
}

/// One request as the table sees it.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// Its topic.
    pub topic: &'a str,
    /// The caller's uid (the message's `userid`).
    pub uid: u32,
    /// It came from a client of this broker's local socket, directly.
    pub local: bool,
    /// Its payload, when it is JSON (`None`: not JSON, or not parsed: a job rule then refuses a guest).
    pub payload: Option<&'a Value>,
}

/// Whether `req` may go to its handler in an instance owned by `owner`: `Ok`, or who may instead.
/// `job_owner` gives the submitter's uid of a job, `None` for a job this broker does not know (left to the
/// handler, which answers ENOENT).
///
/// # Errors
/// [`Denied`]: EPERM when the caller is not who the topic's [`Rule`] allows; EPROTO for a [`Rule::LocalClient`]
/// topic from elsewhere, or a guest's job request whose `id` (or `ids`) is missing or not a job id.
pub fn check(req: &Request<'_>, owner: u32, job_owner: impl Fn(JobId) -> Option<u32>) -> Result<(), Denied> {
    let topic = req.topic;
    let is_owner = req.uid == owner;
    let eperm = |message: String| Denied { errno: errno::EPERM, message };
    let eproto = |message: String| Denied { errno: errno::EPROTO, message };
    match rule(topic) {
        Rule::Anyone => Ok(()),
        Rule::LocalClient if req.local => Ok(()),
        Rule::LocalClient => Err(eproto(format!("'{topic}' is for clients of this broker's local socket only"))),
        Rule::InstanceOwner if is_owner => Ok(()),
        Rule::InstanceOwner => Err(eperm(format!(
            "permission denied: only the instance owner (uid {owner}) may use '{topic}', not uid {}",
            req.uid
        ))),
        // The instance owner's request goes to the handler as it is (which refuses a malformed one).
        Rule::JobOwner | Rule::JobsOwner if is_owner => Ok(()),
        Rule::JobOwner => {
            let id = req.payload.and_then(|p| p.get("id")).and_then(job_id);
            let id = id.ok_or_else(|| eproto(format!("'{topic}' needs 'id', a job id")))?;
            own_job(id, req.uid, owner, topic, &job_owner)
        }
        Rule::JobsOwner => {
            let p = req.payload;
            for limit in ["age_limit", "num_limit"] {
                if p.and_then(|p| p.get(limit)).is_some_and(|v| !v.is_null()) {
                    return Err(eperm(format!(
                        "permission denied: only the instance owner (uid {owner}) may use '{topic}' with '{limit}'; \
                         name your own jobs by 'ids'"
                    )));
                }
            }
            let ids = p.and_then(|p| p.get("ids")).and_then(Value::as_array);
            let ids = ids.ok_or_else(|| eproto(format!("'{topic}' needs 'ids', a list of job ids")))?;
            for v in ids {
                let id = job_id(v).ok_or_else(|| eproto(format!("'{topic}': 'ids' holds {v}, not a job id")))?;
                own_job(id, req.uid, owner, topic, &job_owner)?;
            }
            Ok(())
        }
    }
}

/// Ok if job `id` is `uid`'s, or unknown; EPERM naming its owner otherwise.
fn own_job(
    id: JobId,
    uid: u32,
    owner: u32,
    topic: &str,
    job_owner: &impl Fn(JobId) -> Option<u32>,
) -> Result<(), Denied> {
    match job_owner(id) {
        Some(u) if u != uid => Err(Denied {
            errno: errno::EPERM,
            message: format!(
                "permission denied: job {} belongs to uid {u}: only its owner or the instance owner (uid {owner}) \
                 may use '{topic}'",
                id.f58()
            ),
        }),
        _ => Ok(()),
    }
}

/// A job id as a payload carries it: a number, or a string (f58 or decimal).
fn job_id(v: &Value) -> Option<JobId> {
    match v {
        Value::Number(n) => n.as_u64().map(JobId),
        Value::String(s) => JobId::parse(s).ok(),
        _ => None,
    }
}

/// Whether `uid` may submit jobs to an instance owned by `owner` whose brokers run as `owner`: the owner always;
/// a guest only where the job's shell can be started as the guest. A broker running as root starts each shell as
/// its job's submitter itself; brokers running as another user (a multi-user instance refuses to start without
/// `vigil-imp` then: `exec.imp`) hand it to `vigil-imp`, which needs the submitter's munge credential
/// (`credential`: whether the submission carries one). Without one the job could never start: refused now.
///
/// # Errors
/// EPERM saying why, for a guest without a credential of an instance whose brokers are not root.
pub fn may_submit(uid: u32, owner: u32, credential: bool) -> Result<(), Denied> {
    if uid == owner || owner == 0 || credential {
        return Ok(());
    }
    Err(Denied {
        errno: errno::EPERM,
        message: format!(
            "permission denied: this instance's brokers run as uid {owner} and start your job (uid {uid}) through \
             vigil-imp, which needs a munge credential over the jobspec, and the submission carries none: is munged \
             running on this node (or $VIGIL_MUNGE_SOCKET set to its socket)? (docs/security.md)"
        ),
    })
}

/// Whether `uid` sees the details of a job of `job_uid` (its jobspec: command, environment, working directory)
/// in an instance owned by `owner`: its owner and the instance owner do.
pub fn sees_details(uid: u32, owner: u32, job_uid: u32) -> bool {
    uid == owner || uid == job_uid
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const OWNER: u32 = 500;
    const A: u32 = 1001;
    const B: u32 = 1002;

    fn ask(topic: &str, uid: u32, payload: Value) -> Result<(), Denied> {
        let req = Request { topic, uid, local: true, payload: Some(&payload) };
        // Job 1 is A's, job 2 B's; others are unknown.
        check(&req, OWNER, |id| match id.0 {
            1 => Some(A),
            2 => Some(B),
            _ => None,
        })
    }

    #[test]
    fn a_guest_may_touch_only_its_own_jobs_and_the_refusal_names_the_owner() {
        for topic in ["job-manager.cancel", "job-manager.eventlog", "job-info.attach", "job-manager.info"] {
            assert_eq!(ask(topic, A, json!({"id": 1})), Ok(()), "{topic}");
            let e = ask(topic, B, json!({"id": 1})).expect_err(topic);
            assert_eq!(e.errno, errno::EPERM);
            assert!(e.message.contains(&format!("job {} belongs to uid {A}", JobId(1).f58())), "{}", e.message);
            assert!(e.message.contains(topic), "{}", e.message);
            // The f58 spelling of the id is the same job.
            assert!(ask(topic, B, json!({"id": JobId(1).f58()})).is_err(), "{topic} by f58");
            // The instance owner may; an unknown job is the handler's to refuse.
            assert_eq!(ask(topic, OWNER, json!({"id": 1})), Ok(()));
            assert_eq!(ask(topic, B, json!({"id": 99})), Ok(()));
            // A guest's request that names no job is refused here, not passed on.
            assert_eq!(ask(topic, B, json!({})).map_err(|e| e.errno), Err(errno::EPROTO));
            assert_eq!(ask(topic, B, json!({"id": [1]})).map_err(|e| e.errno), Err(errno::EPROTO));
        }
    }

    #[test]
    fn purge_by_ids_is_for_their_owner_by_limits_for_the_instance_owner() {
        let p = "job-manager.purge";
        assert_eq!(ask(p, A, json!({"ids": [1], "force": true})), Ok(()));
        assert!(ask(p, A, json!({"ids": [1, 2]})).expect_err("B's job").message.contains("belongs to uid 1002"));
        let e = ask(p, A, json!({"age_limit": 0})).expect_err("limits");
        assert!(e.errno == errno::EPERM && e.message.contains("'age_limit'"), "{e}");
        assert!(ask(p, A, json!({"num_limit": 0, "ids": [1]})).is_err());
        assert_eq!(ask(p, OWNER, json!({"age_limit": 0})), Ok(()));
    }

    #[test]
    fn owner_topics_and_unlisted_topics_are_the_instance_owners() {
        for topic in ["resource.drain", "broker.shutdown", "rexec.spawn", "broker.pub", "nosuch.topic", ""] {
            let e = ask(topic, A, json!({})).expect_err(topic);
            assert_eq!(e.errno, errno::EPERM);
            assert!(e.message.contains(&format!("only the instance owner (uid {OWNER})")), "{}", e.message);
            assert_eq!(ask(topic, OWNER, json!({})), Ok(()));
        }
        assert_eq!(ask("job-manager.list", A, json!({})), Ok(()));
        assert_eq!(ask("job-manager.submit", A, json!({})), Ok(()));
        let remote = Request { topic: "broker.sub", uid: OWNER, local: false, payload: None };
        assert_eq!(check(&remote, OWNER, |_| None).map_err(|e| e.errno), Err(errno::EPROTO));
    }

    #[test]
    fn guests_submit_only_where_the_broker_can_run_their_job_as_them() {
        assert_eq!(may_submit(OWNER, OWNER, false), Ok(()));
        let e = may_submit(A, OWNER, false).expect_err("a non-root broker, no credential");
        assert!(
            e.message.contains("needs a munge credential over the jobspec, and the submission carries none"),
            "{e}"
        );
        assert_eq!(may_submit(A, OWNER, true), Ok(()), "vigil-imp starts the shell as the submitter");
        assert_eq!(may_submit(A, 0, false), Ok(()), "a root broker starts the shell as the submitter");
        assert!(sees_details(A, OWNER, A) && sees_details(OWNER, OWNER, A) && !sees_details(B, OWNER, A));
    }
}
