//! The `job-manager` service, rank 0 only: submit, list, inspect, cancel, raise on and purge jobs.

use super::*;
use crate::broker::core::{Held, StateDir};
use tracing::info;

/// Topics of the `job-manager` service: who may call each ([`Access`]) and its handler.
pub(super) const TOPICS: &[Topic] = &[
    Topic { name: "job-manager.submit", access: Access::Instance, handler: submit },
    Topic { name: "job-manager.list", access: Access::Instance, handler: list },
    Topic { name: "job-manager.info", access: Access::Instance, handler: info },
    Topic { name: "job-manager.cancel", access: Access::Job, handler: cancel },
    Topic { name: "job-manager.raise", access: Access::Job, handler: raise },
    Topic { name: "job-manager.purge", access: Access::Owner, handler: purge },
    Topic { name: "job-manager.eventlog", access: Access::Instance, handler: super::job_info::attach_or_eventlog },
];

/// `job-manager.submit`.
fn submit(core: &mut Broker, msg: &Message, lazy: &Body<'_>) -> Reply {
    let body = lazy.object()?;
    let n = core.wall();
    let size = core.opts.size;
    let jc = job_core!(core);
    let spec = field(body, "jobspec")?;
    let stdin = opt_bool(body, "stdin")?.unwrap_or(false);
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
    match jc.submit_with_stdin(n, spec, msg.userid, stdin) {
        Ok(id) => {
            info!("job {id} submitted");
            // RFC 14: unknown attributes.system keys are ignored, and the submitter is told.
            let warnings = jc.jobs.get(&id).map(|j| j.req.warnings.clone()).unwrap_or_default();
            let answer = json!({"id": id.0, "id_f58": id.f58(), "warnings": warnings});
            if jc.journaling() {
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
            Err(ServiceError::einval(e.to_string()))
        }
    }
}

/// `job-manager.list`.
fn list(core: &mut Broker, _msg: &Message, lazy: &Body<'_>) -> Reply {
    let body = lazy.object()?;
    let jc = job_core!(core);
    let all = opt_bool(body, "all")?.unwrap_or(false);
    let with_reason = |j: &crate::jobs::Job| {
        let mut v = j.info();
        if let (Some(r), Some(o)) = (jc.pending_reason(j.id), v.as_object_mut()) {
            o.insert("reason_pending".into(), Value::String(r));
        }
        if let (Some(t), Some(o)) = (jc.estimate(j.id), v.as_object_mut()) {
            // Flux's shape: the scheduler's expected start of the job holding the reservation.
            o.insert("annotations".into(), json!({"sched": {"t_estimate": t}}));
        }
        v
    };
    let jobs: Vec<Value> = jc.jobs.values().rev().filter(|j| all || j.state.is_active()).map(with_reason).collect();
    Ok(Some(json!({"jobs": jobs}).into()))
}

/// `job-manager.info`.
fn info(core: &mut Broker, _msg: &Message, lazy: &Body<'_>) -> Reply {
    let body = lazy.object()?;
    let jc = job_core!(core);
    let id = parse_id(body)?;
    let j = jc.jobs.get(&id).ok_or(ServiceError::enoent(format!("unknown job id {id}")))?;
    let mut info = j.info();
    if let (Some(r), Some(o)) = (jc.pending_reason(id), info.as_object_mut()) {
        o.insert("reason_pending".into(), Value::String(r));
    }
    if let (Some(t), Some(o)) = (jc.estimate(id), info.as_object_mut()) {
        o.insert("annotations".into(), json!({"sched": {"t_estimate": t}}));
    }
    Ok(Some(json!({"info": info, "jobspec": j.jobspec(), "R": j.r}).into()))
}

/// `job-manager.cancel`.
fn cancel(core: &mut Broker, msg: &Message, lazy: &Body<'_>) -> Reply {
    let body = lazy.object()?;
    let n = core.wall();
    let owner = msg.userid == core.env.uid;
    let jc = job_core!(core);
    let id = parse_id(body)?;
    let note = opt_str(body, "note")?.unwrap_or("canceled by user").to_string();
    jc.cancel(n, id, msg.userid, owner, &note).map_err(|(errno, message)| ServiceError { errno, message })?;
    Ok(Some(json!({}).into()))
}

/// `job-manager.raise`.
fn raise(core: &mut Broker, msg: &Message, lazy: &Body<'_>) -> Reply {
    let body = lazy.object()?;
    let n = core.wall();
    let owner = msg.userid == core.env.uid;
    let jc = job_core!(core);
    let id = parse_id(body)?;
    let kind = opt_str(body, "type")?.unwrap_or("exec").to_string();
    let sev = opt_severity(body)?;
    let note = opt_str(body, "note")?.unwrap_or("").to_string();
    if !owner && jc.jobs.get(&id).is_some_and(|j| j.userid != msg.userid) {
        return Err(ServiceError::eperm("not your job"));
    }
    if jc.raise(n, id, &kind, sev, &note) {
        Ok(Some(json!({}).into()))
    } else {
        Err(ServiceError::enoent(format!("job {id} is not active")))
    }
}

/// `job-manager.purge`.
fn purge(core: &mut Broker, _msg: &Message, lazy: &Body<'_>) -> Reply {
    let body = lazy.object()?;
    let n = core.wall();
    let jc = job_core!(core);
    // Flux's `flux job purge`: the instance owner's (Access::Owner), as its limits are.
    let age_limit = match optional(body, "age_limit") {
        None => None,
        Some(f) => match f.as_f64().filter(|a| a.is_finite() && *a >= 0.0) {
            Some(a) => Some(a),
            None => return Err(wrong_type("age_limit", "a number of seconds >= 0", f)),
        },
    };
    let num_limit = opt_u64(body, "num_limit")?.map(|n| usize::try_from(n).unwrap_or(usize::MAX));
    let ids = match optional(body, "ids") {
        None => Vec::new(),
        Some(Value::Array(a)) => a.iter().map(|v| parse_id(&json!({ "id": v }))).collect::<Result<Vec<_>, _>>()?,
        Some(f) => return Err(wrong_type("ids", "an array of job ids", f)),
    };
    let force = opt_bool(body, "force")?.unwrap_or(false);
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
