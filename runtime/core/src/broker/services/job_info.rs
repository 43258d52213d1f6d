//! The `job-info` service, rank 0 only: watch a job (eventlog, output, standard input for its shells).

use super::*;
use crate::broker::core::{Internal, Watcher};
use crate::jobs::JobState;
use crate::message::FLAG_STREAMING;

/// Topics of the `job-info` service: and their handlers (who may call each: `broker/access.rs`).
pub(super) const TOPICS: &[Topic] = &[
    Topic { name: "job-info.attach", handler: attach_or_eventlog },
    Topic { name: "job-info.stdin", handler: stdin },
    Topic { name: "job-info.disconnect", handler: disconnect },
];

/// A `job-info.attach` request (`vigil attach`, `vigil run`) or a `job-manager.eventlog` request (`vigil job
/// eventlog`): a job's eventlog entries and (attach only) output lines, streamed as responses, ENODATA at the end.
#[derive(Debug, Deserialize)]
pub(super) struct AttachRequest {
    /// The job.
    id: JobRef,
    /// Keep answering as the job goes on (when the request is a streaming one), until it is inactive; true when
    /// absent for attach, false for eventlog.
    follow: Option<bool>,
    /// Send the eventlog's entries; true when absent.
    eventlog: Option<bool>,
    /// Send the output lines (attach only); true when absent.
    output: Option<bool>,
}

/// `job-info.attach` and `job-manager.eventlog`.
pub(super) fn attach_or_eventlog(core: &mut Broker, msg: &Message, lazy: &Body<'_>) -> Reply {
    let req: AttachRequest = lazy.decode()?;
    let jc = job_core!(core);
    let id = req.id.id()?;
    if !jc.jobs.contains_key(&id) {
        return Err(ServiceError::enoent(format!("unknown job id {id}")));
    }
    let is_attach = msg.topic == "job-info.attach";
    let follow = req.follow.unwrap_or(is_attach);
    let eventlog = req.eventlog.unwrap_or(true);
    let output = req.output.unwrap_or(true);
    let w = Watcher {
        req: msg.clone(),
        id,
        ev_pos: 0,
        out_pos: 0,
        eventlog,
        output: is_attach && output,
        stdin: false,
        in_pos: 0,
        follow: follow && msg.flags & FLAG_STREAMING != 0,
    };
    if let Some(&last) = msg.route.first() {
        if last & ROUTE_LOCAL != 0 && msg.route.len() == 1 {
            if let Some(c) = core.locals.get_mut(&(last & !ROUTE_LOCAL)) {
                c.streaming = true;
            }
        }
    }
    // Mark remote clients' brokers too: they set `streaming` when forwarding (see core::on_closed).
    check_waiting(core.watchers.iter().filter(|w| w.req.route == msg.route).count(), "job watchers")?;
    core.watchers.push(w);
    wake_watchers(core, id);
    Ok(None)
}

/// A `job-info.stdin` request, from a job's shell: the job's standard input, every chunk so far then new ones,
/// streamed as responses, ENODATA at its end.
#[derive(Debug, Deserialize)]
struct StdinRequest {
    /// The job.
    id: JobRef,
}

/// `job-info.stdin`.
fn stdin(core: &mut Broker, msg: &Message, lazy: &Body<'_>) -> Reply {
    let req: StdinRequest = lazy.decode()?;
    let jc = job_core!(core);
    // A job shell reads the job's standard input: every chunk so far, then new ones, ENODATA at the end.
    let id = req.id.id()?;
    if !jc.jobs.contains_key(&id) {
        return Err(ServiceError::enoent(format!("unknown job id {id}")));
    }
    check_waiting(core.watchers.iter().filter(|w| w.req.route == msg.route).count(), "job watchers")?;
    core.watchers.push(Watcher {
        req: msg.clone(),
        id,
        ev_pos: 0,
        out_pos: 0,
        in_pos: 0,
        eventlog: false,
        output: false,
        stdin: true,
        follow: msg.flags & FLAG_STREAMING != 0,
    });
    wake_watchers(core, id);
    Ok(None)
}

/// `job-info.disconnect`.
fn disconnect(core: &mut Broker, msg: &Message, lazy: &Body<'_>) -> Reply {
    lazy.object()?;
    if core.jobcore.is_none() {
        return Err(ServiceError::enosys("job services run on rank 0"));
    }
    let route = msg.route.clone();
    core.watchers.retain(|w| w.req.route != route);
    Ok(None)
}

/// Send new eventlog entries and output lines to the watchers of job `id`; end finished streams with ENODATA.
pub(crate) fn wake_watchers(core: &mut Broker, id: JobId) {
    let Some(jc) = core.jobcore.as_ref() else { return };
    let Some(job) = jc.jobs.get(&id) else { return };
    let inactive = job.state == JobState::Inactive;
    let mut out: Vec<Message> = Vec::new();
    let mut done = Vec::new();
    for (i, w) in core.watchers.iter_mut().enumerate().filter(|(_, w)| w.id == id) {
        // Output lines carry no time, so when output and events are both waiting (a finished job attached late,
        // or a busy turn), the events from the first `exception` or `finish` on go after the output: the job reads
        // as it ran, its output, then what ended it.
        let output_waits = w.output && w.out_pos < job.output_base + job.output.len();
        let split = if output_waits {
            job.eventlog[w.ev_pos.min(job.eventlog.len())..]
                .iter()
                .position(|e| e.name == "exception" || e.name == "finish")
                .map_or(job.eventlog.len(), |k| w.ev_pos + k)
        } else {
            job.eventlog.len()
        };
        if w.eventlog {
            for e in &job.eventlog[w.ev_pos.min(split)..split] {
                out.push(Message::response_to(&w.req, &json!({"event": &**e})));
            }
            w.ev_pos = w.ev_pos.max(split);
        }
        if w.output {
            if w.out_pos < job.output_base {
                let missed = job.output_base - w.out_pos;
                // The bound that dropped them: a running job's, or the tail an INACTIVE job keeps.
                let (keep, of) = if job.state == crate::jobs::JobState::Inactive {
                    (crate::jobs::INACTIVE_OUTPUT_KEEP, "an inactive job")
                } else {
                    (crate::jobs::OUTPUT_KEEP, "a running job")
                };
                let note = crate::shellproto::OutputLine::text(
                    0,
                    "stderr",
                    format!(
                        "vigil: {missed} output chunk(s) dropped: rank 0 keeps the last {} MiB of {of}'s output, each \
                         chunk counted as its bytes plus about 100 (use --output FILE)",
                        keep >> 20
                    ),
                );
                out.push(Message::response_to(&w.req, &json!({"output": note})));
                w.out_pos = job.output_base;
            }
            for l in job.output.iter().skip(w.out_pos - job.output_base) {
                out.push(Message::response_to(&w.req, &json!({"output": l})));
            }
            w.out_pos = job.output_base + job.output.len();
        }
        if w.eventlog {
            for e in &job.eventlog[w.ev_pos..] {
                out.push(Message::response_to(&w.req, &json!({"event": &**e})));
            }
            w.ev_pos = job.eventlog.len();
        }
        if w.stdin {
            // `get`: an INACTIVE job's input is dropped (jobs::retire_stdin), under a watcher that read some.
            for d in job.stdin.get(w.in_pos..).unwrap_or_default() {
                out.push(Message::response_to(&w.req, &json!({"data": d})));
            }
            w.in_pos = job.stdin.len();
            if job.stdin_eof || inactive || !w.follow {
                out.push(Message::error_to(&w.req, errno::ENODATA, ""));
                done.push(i);
            }
            continue;
        }
        if inactive || !w.follow {
            out.push(Message::error_to(&w.req, errno::ENODATA, ""));
            done.push(i);
        }
    }
    for i in done.into_iter().rev() {
        core.watchers.remove(i);
    }
    if inactive {
        core.pmi_barriers.remove(&id);
    }
    for m in out {
        core.route_response(m);
    }
    let _ = Internal::Ignore;
}
