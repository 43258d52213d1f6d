//! The `job-exec` service, rank 0 only: what job shells and their brokers report (output, task exits,
//! exceptions, nested instances, PMI barriers, shell exits), and `vigil run`'s standard input.

use super::*;
use crate::broker::core::{Held, StateDir};
use crate::jobs::{Batch, JobState};
use crate::shellproto::{OutputLine, ShellExit};
use tracing::{debug, info};

/// Topics of the `job-exec` service: who may call each ([`Access`]) and its handler.
pub(super) const TOPICS: &[Topic] = &[
    Topic { name: "job-exec.stdin", access: Access::Job, handler: stdin },
    Topic { name: "job-exec.output", access: Access::Instance, handler: output },
    Topic { name: "job-exec.task-exit", access: Access::Instance, handler: task_exit },
    Topic { name: "job-exec.exception", access: Access::Instance, handler: exception },
    Topic { name: "job-exec.nested", access: Access::Instance, handler: nested },
    Topic { name: "job-exec.pmi-barrier", access: Access::Instance, handler: pmi_barrier },
    Topic { name: "job-exec.shell-exit", access: Access::Instance, handler: shell_exit },
];

/// `job-exec.stdin`.
fn stdin(core: &mut Broker, msg: &Message, lazy: &Body<'_>) -> Reply {
    let body = lazy.object()?;
    let owner = msg.userid == core.env.uid;
    let jc = job_core!(core);
    let id = parse_id(body)?;
    if !owner && jc.jobs.get(&id).is_some_and(|j| j.userid != msg.userid) {
        return Err(ServiceError::eperm("not your job"));
    }
    let data = opt_str(body, "data")?.map(str::to_string);
    let eof = opt_bool(body, "eof")?.unwrap_or(false);
    // Bounded per job (jobs::STDIN_KEEP): a chunk past it is refused with ENOSPC, the rest kept.
    jc.stdin(id, data, eof).map_err(|e| ServiceError::new(e.errno(), e.to_string()))?;
    Ok(Some(json!({}).into()))
}

/// `job-exec.output`.
fn output(core: &mut Broker, _msg: &Message, lazy: &Body<'_>) -> Reply {
    let body = lazy.object()?;
    let jc = job_core!(core);
    let id = parse_id(body)?;
    let lines: Vec<OutputLine> =
        serde_json::from_value(field(body, "lines")?.clone()).map_err(|e| ServiceError::eproto(e.to_string()))?;
    // A shell numbers its batches so that one sent again after a router's loss is taken once, in order.
    let batch = match (opt_u32(body, "broker_rank")?, opt_u64(body, "seq")?, opt_bool(body, "flush")?) {
        (Some(rank), _, Some(true)) => Batch::Flush { rank },
        (Some(rank), Some(seq), _) => Batch::Numbered { rank, seq },
        _ => Batch::Unnumbered,
    };
    jc.output(id, batch, lines);
    Ok(Some(json!({}).into()))
}

/// `job-exec.task-exit`.
fn task_exit(core: &mut Broker, _msg: &Message, lazy: &Body<'_>) -> Reply {
    let body = lazy.object()?;
    let n = core.wall();
    let jc = job_core!(core);
    let id = parse_id(body)?;
    let task = opt_u32(body, "rank")?.unwrap_or(0);
    let status = opt_i32(body, "status")?.unwrap_or(0);
    jc.task_exit(n, id, task, status);
    Ok(Some(json!({}).into()))
}

/// `job-exec.exception`.
fn exception(core: &mut Broker, _msg: &Message, lazy: &Body<'_>) -> Reply {
    let body = lazy.object()?;
    let n = core.wall();
    let jc = job_core!(core);
    let id = parse_id(body)?;
    let kind = opt_str(body, "type")?.unwrap_or("exec").to_string();
    let sev = opt_severity(body)?;
    let note = opt_str(body, "note")?.unwrap_or("").to_string();
    let rank = opt_u32(body, "rank")?;
    if sev == 0 && jc.jobs.get(&id).is_some_and(|j| j.fatal.is_some()) {
        // Already going down: later shell reports are consequences of the first cause.
        debug!("job {id}: not posting follow-up exception: {note}");
    } else if jc.raise(n, id, &kind, sev, &note) && sev == 0 {
        if let Some(j) = jc.jobs.get_mut(&id) {
            j.fatal_shell = rank;
        }
    }
    Ok(Some(json!({}).into()))
}

/// `job-exec.nested`.
fn nested(core: &mut Broker, _msg: &Message, lazy: &Body<'_>) -> Reply {
    let body = lazy.object()?;
    let n = core.wall();
    let jc = job_core!(core);
    // A nested instance (batch/alloc job) reports its URI and its critical ranks (its own numbering,
    // which follows the order of the job's allocated ranks).
    let id = parse_id(body)?;
    let uri = str_field(body, "uri")?.to_string();
    let crit = IdSet::parse(opt_str(body, "critical_ranks")?.unwrap_or("0"))
        .map_err(|e| ServiceError::eproto(format!("critical_ranks: {e}")))?;
    let size = opt_u32(body, "size")?.unwrap_or(0);
    let job = jc.jobs.get_mut(&id).ok_or(ServiceError::enoent(format!("unknown job id {id}")))?;
    let ranks: Vec<u32> = job.alloc.iter().map(|a| a.rank).collect();
    let parent_crit: IdSet = crit.iter().filter_map(|c| ranks.get(c as usize).copied()).collect();
    let memo = json!({"uri": uri, "size": size, "critical_ranks": crit.to_string(), "critical_broker_ranks": parent_crit.to_string()});
    job.instance = Some(memo.clone());
    jc.memo(n, id, memo);
    info!("job {id} is an instance of {size} brokers at {uri}; critical ranks {parent_crit}");
    Ok(Some(json!({}).into()))
}

/// `job-exec.pmi-barrier`.
fn pmi_barrier(core: &mut Broker, msg: &Message, lazy: &Body<'_>) -> Reply {
    let body = lazy.object()?;
    let jc = job_core!(core);
    // One exchange per barrier per shell: hold each shell's request until every one of the job's shells
    // has arrived (counted by `shell_rank`, so a shell that asks twice cannot end a barrier early), then
    // answer all of them with the union of their puts.
    let id = parse_id(body)?;
    let shell = u32_field(body, "shell_rank")?;
    let kvs = pmi_puts(body)?;
    let job = jc
        .jobs
        .get_mut(&id)
        .filter(|j| j.state == JobState::Run)
        .ok_or(ServiceError::enoent(format!("job {id} is not running")))?;
    let nshells = job.shells.len();
    if shell as usize >= nshells {
        return Err(ServiceError::einval(format!("shell_rank {shell}: job {id} has {nshells} shell(s)")));
    }
    let b = core.pmi_barriers.entry(id).or_default();
    if b.waiting.contains_key(&shell) {
        return Err(ServiceError::einval(format!("shell {shell} of job {id} is already in this PMI barrier")));
    }
    job.pmi_exchanges += 1;
    b.waiting.insert(shell, msg.clone());
    b.kvs.extend(kvs);
    if b.waiting.len() >= nshells {
        let b = core.pmi_barriers.remove(&id).unwrap_or_default();
        let payload = json!({"kvs": b.kvs});
        for r in b.waiting.values() {
            core.respond(r, &payload);
        }
    }
    Ok(None)
}

/// `job-exec.shell-exit`.
fn shell_exit(core: &mut Broker, msg: &Message, lazy: &Body<'_>) -> Reply {
    let body = lazy.object()?;
    let n = core.wall();
    let jc = job_core!(core);
    let exit: ShellExit = serde_json::from_value(body.clone()).map_err(|e| ServiceError::eproto(e.to_string()))?;
    if let StateDir::Damaged { dir, .. } = &core.statedir {
        // Not acknowledged: the job is in the store an operator is repairing, and its broker keeps the
        // report (an error keeps it), sending it again to the rank 0 restarted on the repaired store.
        return Err(ServiceError::erofs(format!(
            "rank 0's state directory {} is damaged: exit reports are kept by their brokers until rank 0 \
                 restarts on a store it can read",
            dir.display()
        )));
    }
    jc.shell_exit(n, exit);
    if jc.journaling() {
        // Acknowledged once the exit status is durable (Input::Stored, then Input::Synced): the reporting
        // broker drops its report then (core.rs, Held::ExitReport).
        core.awaiting_durable.push((msg.head(), Held::ExitReport));
        return Ok(None);
    }
    Ok(Some(json!({}).into()))
}

/// The `kvs` of a `job-exec.pmi-barrier` request: a shell's PMI-1 puts, which every shell of the job hands back to
/// its tasks verbatim in PMI lines. So each key and value must be a token such a line can carry (no space or
/// newline, no `=` in a key) within the sizes served by `get_maxes`; absent means no puts.
fn pmi_puts(body: &Value) -> Result<serde_json::Map<String, Value>, ServiceError> {
    use crate::pmi::{KEYLEN_MAX, VALLEN_MAX};
    let Some(kvs) = optional(body, "kvs") else { return Ok(serde_json::Map::new()) };
    let kvs = kvs.as_object().ok_or_else(|| wrong_type("kvs", "an object of PMI keys and values", kvs))?;
    let clip = |k: &str| k.chars().take(64).collect::<String>();
    for (k, v) in kvs {
        let Some(s) = v.as_str() else { return Err(wrong_type(&format!("kvs.{}", clip(k)), "a string", v)) };
        let bad = |t: &str| t.contains([' ', '\n']);
        if k.len() > KEYLEN_MAX || bad(k) || k.contains('=') {
            return Err(ServiceError::eproto(format!("kvs: '{}' is not a PMI key", clip(k))));
        }
        if s.len() > VALLEN_MAX || bad(s) {
            return Err(ServiceError::eproto(format!("kvs.{}: not a PMI value", clip(k))));
        }
    }
    Ok(kvs.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pmi_puts_must_be_pmi_tokens() {
        assert_eq!(pmi_puts(&json!({})).map(|m| m.len()), Ok(0));
        assert_eq!(pmi_puts(&json!({"kvs": {"k": "v=w", "e": ""}})).map(|m| m.len()), Ok(2));
        let long = "x".repeat(crate::pmi::VALLEN_MAX + 1);
        for kvs in [
            json!("k=v"),
            json!({"k": 1}),
            json!({"k": ["v"]}),
            json!({"k": "a b"}),
            json!({"k": "a\nb"}),
            json!({"a=b": "v"}),
            json!({"a b": "v"}),
            json!({"k": long}),
        ] {
            let ServiceError { errno: e, message: msg } = pmi_puts(&json!({ "kvs": kvs })).expect_err("bad kvs");
            assert_eq!(e, errno::EPROTO, "{msg}");
            assert!(msg.contains("kvs"), "{msg}");
        }
    }
}
