//! The `job-exec` service, rank 0 only: what job shells and their brokers report (output, task exits,
//! exceptions, nested instances, PMI barriers, shell exits), and `vigil run`'s standard input.

use super::*;
use crate::broker::core::{Held, StateDir};
use crate::jobs::{Batch, JobState};
use crate::shellproto::{OutputLine, ShellExit};
use std::collections::BTreeMap;
use tracing::{debug, info};

/// Topics of the `job-exec` service: and their handlers (who may call each: `broker/access.rs`).
pub(super) const TOPICS: &[Topic] = &[
    Topic { name: "job-exec.stdin", handler: stdin },
    Topic { name: "job-exec.output", handler: output },
    Topic { name: "job-exec.task-exit", handler: task_exit },
    Topic { name: "job-exec.exception", handler: exception },
    Topic { name: "job-exec.nested", handler: nested },
    Topic { name: "job-exec.pmi-barrier", handler: pmi_barrier },
    Topic { name: "job-exec.shell-exit", handler: shell_exit },
];

/// A `job-exec.stdin` request, from `vigil run`: a chunk of the job's standard input, for its shells to read
/// (`job-info.stdin`).
#[derive(Debug, Deserialize)]
struct StdinRequest {
    /// The job: the caller's own, unless the caller is the instance owner.
    id: JobRef,
    /// The chunk (UTF-8 text, as `vigil run` reads it); none when absent.
    data: Option<String>,
    /// The input ends here; false when absent.
    eof: Option<bool>,
}

/// `job-exec.stdin`.
fn stdin(core: &mut Broker, msg: &Message, lazy: &Body<'_>) -> Reply {
    let req: StdinRequest = lazy.decode()?;
    let owner = msg.userid == core.env.uid;
    let jc = job_core!(core);
    let id = req.id.id()?;
    if !owner && jc.jobs.get(&id).is_some_and(|j| j.userid != msg.userid) {
        return Err(ServiceError::eperm("not your job"));
    }
    let data = req.data;
    let eof = req.eof.unwrap_or(false);
    // Bounded per job (jobs::STDIN_KEEP): a chunk past it is refused with ENOSPC, the rest kept.
    jc.stdin(id, data, eof).map_err(|e| ServiceError::new(e.errno(), e.to_string()))?;
    Ok(Some(json!({}).into()))
}

/// A `job-exec.output` request, from a job's shell: a batch of its tasks' output lines.
#[derive(Debug, Deserialize)]
struct OutputRequest {
    /// The job.
    id: JobRef,
    /// The lines, in order.
    lines: Vec<OutputLine>,
    /// The rank of the shell's broker, which numbers its batches with `seq` (absent from older shells: taken as
    /// they come).
    broker_rank: Option<u32>,
    /// The batch's number among that shell's, from 0: a batch sent again after a router's loss is taken once,
    /// in order.
    seq: Option<u64>,
    /// The shell (with `broker_rank`) has nothing more in flight: batches held back waiting for a gap to fill
    /// are taken now.
    flush: Option<bool>,
}

/// `job-exec.output`.
fn output(core: &mut Broker, _msg: &Message, lazy: &Body<'_>) -> Reply {
    let req: OutputRequest = lazy.decode()?;
    let jc = job_core!(core);
    let id = req.id.id()?;
    let lines = req.lines;
    // A shell numbers its batches so that one sent again after a router's loss is taken once, in order.
    let batch = match (req.broker_rank, req.seq, req.flush) {
        (Some(rank), _, Some(true)) => Batch::Flush { rank },
        (Some(rank), Some(seq), _) => Batch::Numbered { rank, seq },
        _ => Batch::Unnumbered,
    };
    jc.output(id, batch, lines);
    Ok(Some(json!({}).into()))
}

/// A `job-exec.task-exit` request, from a job's shell: one of its tasks exited.
#[derive(Debug, Deserialize)]
struct TaskExitRequest {
    /// The job.
    id: JobRef,
    /// The task's rank in the job (`PMI_RANK`); 0 when absent.
    rank: Option<u32>,
    /// Its wait status (`waitpid`); 0 when absent.
    status: Option<i32>,
}

/// `job-exec.task-exit`.
fn task_exit(core: &mut Broker, _msg: &Message, lazy: &Body<'_>) -> Reply {
    let req: TaskExitRequest = lazy.decode()?;
    let n = core.wall();
    let jc = job_core!(core);
    let id = req.id.id()?;
    let task = req.rank.unwrap_or(0);
    let status = req.status.unwrap_or(0);
    jc.task_exit(n, id, task, status);
    Ok(Some(json!({}).into()))
}

/// A `job-exec.exception` request, from a job's shell: an exception on the job (RFC 21), such as a task that
/// could not start or a lost node.
#[derive(Debug, Deserialize)]
struct ExceptionRequest {
    /// The job.
    id: JobRef,
    /// The exception's type; `exec` when absent.
    #[serde(rename = "type")]
    kind: Option<String>,
    /// 0 (fatal: the job ends) to 7; 0 when absent.
    severity: Option<u64>,
    /// Free text; empty when absent.
    note: Option<String>,
    /// The reporting shell's rank in the job, remembered as the cause of a fatal one.
    rank: Option<u32>,
}

/// `job-exec.exception`.
fn exception(core: &mut Broker, _msg: &Message, lazy: &Body<'_>) -> Reply {
    let req: ExceptionRequest = lazy.decode()?;
    let n = core.wall();
    let jc = job_core!(core);
    let id = req.id.id()?;
    let kind = req.kind.unwrap_or_else(|| "exec".to_string());
    let sev = severity(req.severity)?;
    let note = req.note.unwrap_or_default();
    let rank = req.rank;
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

/// A `job-exec.nested` request, from the rank 0 of an instance run as a job (`vigil batch`, `vigil alloc`): where
/// it is and which of its ranks it cannot lose.
#[derive(Debug, Deserialize)]
struct NestedRequest {
    /// The job.
    id: JobRef,
    /// The nested instance's URI.
    uri: String,
    /// Its critical ranks, an idset in its own numbering (which follows the order of the job's allocated ranks);
    /// `0` when absent.
    critical_ranks: Option<String>,
    /// Its size, in brokers; 0 when absent.
    size: Option<u32>,
    /// The ranks of it (an idset, its own numbering) that never joined, when more than it tolerates
    /// (`tolerate_lost`): it could not start, and the job fails naming their nodes (`JobCore::nested_start_failed`).
    never_joined: Option<String>,
    /// How many of its brokers may never join (`broker.tolerate-lost`); 0 when absent.
    tolerate_lost: Option<u32>,
}

/// `job-exec.nested`.
fn nested(core: &mut Broker, _msg: &Message, lazy: &Body<'_>) -> Reply {
    let req: NestedRequest = lazy.decode()?;
    let n = core.wall();
    let jc = job_core!(core);
    // A nested instance (batch/alloc job) reports its URI and its critical ranks (its own numbering,
    // which follows the order of the job's allocated ranks).
    let id = req.id.id()?;
    let uri = req.uri;
    let crit = IdSet::parse(req.critical_ranks.as_deref().unwrap_or("0"))
        .map_err(|e| ServiceError::eproto(format!("critical_ranks: {e}")))?;
    let size = req.size.unwrap_or(0);
    if let Some(never) = &req.never_joined {
        let never = IdSet::parse(never).map_err(|e| ServiceError::eproto(format!("never_joined: {e}")))?;
        let tolerated = req.tolerate_lost.unwrap_or(0);
        if never.len() as u32 > tolerated {
            if !jc.jobs.contains_key(&id) {
                return Err(ServiceError::enoent(format!("unknown job id {id}")));
            }
            tracing::warn!("job {id}: its instance could not start: ranks {never} of it never joined");
            jc.nested_start_failed(n, id, &never, tolerated);
            return Ok(Some(json!({}).into()));
        }
    }
    let job = jc.jobs.get_mut(&id).ok_or(ServiceError::enoent(format!("unknown job id {id}")))?;
    let ranks: Vec<u32> = job.alloc.iter().map(|a| a.rank).collect();
    let parent_crit: IdSet = crit.iter().filter_map(|c| ranks.get(c as usize).copied()).collect();
    let memo = json!({"uri": uri, "size": size, "critical_ranks": crit.to_string(), "critical_broker_ranks": parent_crit.to_string()});
    job.instance = Some(memo.clone());
    jc.memo(n, id, memo);
    info!("job {id} is an instance of {size} brokers at {uri}; critical ranks {parent_crit}");
    Ok(Some(json!({}).into()))
}

/// A `job-exec.pmi-barrier` request, from a job's shell: its tasks' PMI-1 puts, held until every live shell of the
/// job has sent its own, then answered with the union (`{"kvs": {...}}`). A shell whose node is lost meanwhile (or
/// that is otherwise gone) is not waited for, and its puts are left out (`Broker::pmi_barrier_complete`).
#[derive(Debug, Deserialize)]
struct PmiBarrierRequest {
    /// The job.
    id: JobRef,
    /// The shell's rank in the job, below the job's shell count.
    shell_rank: u32,
    /// Its puts, key to value, each a PMI token ([`pmi_puts`]); none when absent.
    kvs: Option<std::collections::BTreeMap<String, String>>,
}

/// The most one PMI exchange (the puts of every shell of a job in one barrier, as JSON) may hold, in bytes:
/// 63 MiB. Every shell is answered with their union in one message (sent down the TBON once per link,
/// `broker/pmi_down.rs`), which must fit an overlay frame ([`crate::message::MAX_FRAME`], 64 MiB, the rest left
/// for the message's header, route and the list of requests it answers). A shell whose puts
/// would take the exchange past it is refused (ENOSPC) and its job gets a fatal `exec` exception saying so, so no
/// shell waits for an answer that could never be sent. (A job that large wants PMIx's direct modex, or fewer
/// puts per task.)
pub(crate) const PMI_EXCHANGE_MAX: usize = crate::message::MAX_FRAME as usize - (1 << 20);

/// `job-exec.pmi-barrier`.
fn pmi_barrier(core: &mut Broker, msg: &Message, lazy: &Body<'_>) -> Reply {
    let req: PmiBarrierRequest = lazy.decode()?;
    let n = core.wall();
    let jc = job_core!(core);
    // One exchange per barrier per shell: hold each shell's request until every live shell of the job has
    // arrived (counted by `shell_rank`, so a shell that asks twice cannot end a barrier early), then answer all
    // of them with the union of their puts.
    let id = req.id.id()?;
    let shell = req.shell_rank;
    let kvs = pmi_puts(req.kvs.unwrap_or_default())?;
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
    let bytes = serde_json::to_vec(&kvs).map_or(usize::MAX, |v| v.len());
    if b.bytes.saturating_add(bytes) > PMI_EXCHANGE_MAX {
        let note = format!(
            "PMI exchange too large: shell {shell} puts {bytes} bytes onto the {} its job's shells put already, \
             over the {} MiB one exchange may hold",
            b.bytes,
            PMI_EXCHANGE_MAX >> 20
        );
        if job.fatal.is_none() {
            jc.raise(n, id, "exec", 0, &note);
        }
        return Err(ServiceError::enospc(note));
    }
    job.pmi_exchanges += 1;
    b.bytes += bytes;
    b.waiting.insert(shell, (msg.head(), kvs));
    core.pmi_barrier_complete(id);
    Ok(None)
}

/// `job-exec.shell-exit`: a job shell exited, reported by its broker. The payload is a [`ShellExit`]
/// (`shellproto.rs`), the record that broker keeps until rank 0 acknowledges it.
fn shell_exit(core: &mut Broker, msg: &Message, lazy: &Body<'_>) -> Reply {
    let exit: ShellExit = lazy.decode()?;
    let n = core.wall();
    let jc = job_core!(core);
    if let StateDir::Damaged { dir, .. } = &core.statedir {
        // Not acknowledged: the job is in the store an operator is repairing, and its broker keeps the
        // report (an error keeps it), sending it again to the rank 0 restarted on the repaired store.
        return Err(ServiceError::erofs(format!(
            "rank 0's state directory {} is damaged: exit reports are kept by their brokers until rank 0 \
                 restarts on a store it can read",
            dir.display()
        )));
    }
    let id = crate::jobs::JobId(exit.id);
    jc.shell_exit(n, exit);
    let journaling = jc.journaling();
    // A shell gone before its job's PMI exchange ended (a nested instance's broker that died while its instance
    // started) is not waited for: the others' exchange ends without it.
    core.pmi_barrier_complete(id);
    if journaling {
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
fn pmi_puts(kvs: BTreeMap<String, String>) -> Result<serde_json::Map<String, Value>, ServiceError> {
    use crate::pmi::{KEYLEN_MAX, VALLEN_MAX};
    let clip = |k: &str| k.chars().take(64).collect::<String>();
    for (k, s) in &kvs {
        let bad = |t: &str| t.contains([' ', '\n']);
        if k.len() > KEYLEN_MAX || bad(k) || k.contains('=') {
            return Err(ServiceError::eproto(format!("kvs: '{}' is not a PMI key", clip(k))));
        }
        if s.len() > VALLEN_MAX || bad(s) {
            return Err(ServiceError::eproto(format!("kvs.{}: not a PMI value", clip(k))));
        }
    }
    Ok(kvs.into_iter().map(|(k, v)| (k, Value::String(v))).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `kvs` as `job-exec.pmi-barrier` takes it: decoded with its request, then checked.
    fn puts(kvs: Option<Value>) -> Result<serde_json::Map<String, Value>, ServiceError> {
        let mut body = json!({"id": 1, "shell_rank": 0});
        if let Some(kvs) = kvs {
            body["kvs"] = kvs;
        }
        let req: PmiBarrierRequest = decode::decode(&body)?;
        pmi_puts(req.kvs.unwrap_or_default())
    }

    #[test]
    fn pmi_puts_must_be_pmi_tokens() {
        assert_eq!(puts(None).map(|m| m.len()), Ok(0));
        assert_eq!(puts(Some(json!(null))).map(|m| m.len()), Ok(0));
        assert_eq!(puts(Some(json!({"k": "v=w", "e": ""}))).map(|m| m.len()), Ok(2));
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
            let ServiceError { errno: e, message: msg } = puts(Some(kvs)).expect_err("bad kvs");
            assert_eq!(e, errno::EPROTO, "{msg}");
            assert!(msg.contains("kvs"), "{msg}");
        }
        assert_eq!(
            puts(Some(json!({"k": 1}))).map_err(|e| e.message),
            Err("'kvs.k': invalid type: integer `1`, expected a string".into())
        );
    }
}
