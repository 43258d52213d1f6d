//! The `rexec` service, on every rank: start, signal and notify the job shells of this node, and pass a PMI
//! exchange's answer to them and down the tree.

use super::*;
use crate::broker::core::Effect;
use crate::shellproto::ShellInput;
use tracing::debug;

/// Topics of the `rexec` service: and their handlers (who may call each: `broker/access.rs`).
pub(super) const TOPICS: &[Topic] = &[
    Topic { name: "rexec.notify", handler: notify },
    Topic { name: "rexec.spawn", handler: spawn },
    Topic { name: "rexec.kill", handler: kill },
    Topic { name: "rexec.pmi-answer", handler: pmi_answer },
];

/// `rexec.pmi-answer`: a PMI exchange's answer on its way down the TBON, from this broker's parent only (its
/// payload: `broker/pmi_down.rs`). This broker answers its own shell's request and passes the rest to its
/// children, one message per child. Not answered (a hop of a one-way relay).
fn pmi_answer(core: &mut Broker, msg: &Message, _lazy: &Body<'_>) -> Reply {
    // Its route is the one hop from the parent: not a local client's, nor a child's.
    if msg.route.len() != 1 || msg.route[0] & ROUTE_LOCAL != 0 || core.parent != Some(msg.route[0]) {
        return Err(ServiceError::eperm("rexec.pmi-answer: only from this broker's parent"));
    }
    let (to, answer) = crate::broker::pmi_down::decode(&msg.payload).map_err(ServiceError::eproto)?;
    core.pmi_answer_down(to, answer);
    Ok(None)
}

/// A `rexec.notify` request: a lost-shell notice for the leader shell of a job on this node. The whole payload
/// is handed to the shell as the event's.
#[derive(Debug, Deserialize)]
struct NotifyRequest {
    /// The job.
    id: JobRef,
}

/// `rexec.notify`.
fn notify(core: &mut Broker, _msg: &Message, lazy: &Body<'_>) -> Reply {
    // A lost-shell notice for the job's leader shell: delivered as a local event `shell.<jobid>.lost`
    // to the shell, which subscribed to `shell.<jobid>`.
    let id = lazy.decode::<NotifyRequest>()?.id.id()?;
    let ev = Message::event(&format!("shell.{id}.lost"), lazy.object()?);
    core.deliver_local_event(&ev);
    Ok(Some(json!({}).into()))
}

/// A `rexec.spawn` request, from rank 0's exec system to the broker of each node of a job.
#[derive(Debug, Deserialize)]
struct SpawnRequest {
    /// The job.
    id: JobRef,
    /// What its shell on this node is to run; its `id` must be the job's.
    input: ShellInput,
}

/// `rexec.spawn`.
fn spawn(core: &mut Broker, msg: &Message, lazy: &Body<'_>) -> Reply {
    spawn_shell(core, msg, lazy.decode()?)
}

/// A `rexec.kill` request: signal the shell of a job on this node (which signals its tasks).
#[derive(Debug, Deserialize)]
struct KillRequest {
    /// The job.
    id: JobRef,
    /// The signal number, 1..=SIGRTMAX. The field must be there; `null` is SIGTERM.
    #[serde(deserialize_with = "Option::deserialize")]
    signal: Option<i32>,
}

/// `rexec.kill`.
fn kill(core: &mut Broker, _msg: &Message, lazy: &Body<'_>) -> Reply {
    let rank = core.rank();
    let req: KillRequest = lazy.decode()?;
    let id = req.id.id()?;
    let sig = req.signal.unwrap_or(crate::signal::SIGTERM);
    if !(1..=crate::signal::SIGRTMAX).contains(&sig) {
        return Err(ServiceError::einval(format!(
            "'signal' must be a signal number 1..={}, got {sig}",
            crate::signal::SIGRTMAX
        )));
    }
    if core.shells.contains(&id) {
        debug!("signal {sig} to shell of job {id}");
        core.effect(Effect::SignalShell { id, signal: sig });
        Ok(Some(json!({}).into()))
    } else {
        Err(ServiceError::enoent(format!("no shell of job {id} on rank {rank}")))
    }
}

/// `rexec.spawn`: start the job shell of job `id` with `input` (a [`ShellInput`], checked here: a payload that is
/// not one is refused with EPROTO rather than handed to a shell, or indexed into). Answered with the shell's pid
/// once the driver has started it ([`crate::broker::core::Input::ShellStarted`]).
fn spawn_shell(core: &mut Broker, msg: &Message, req: SpawnRequest) -> Reply {
    let id = req.id.id()?;
    let mut input = req.input;
    if input.id != id.0 {
        return Err(ServiceError::eproto(format!("input: job id {} is not the request's job {id}", input.id)));
    }
    input.check().map_err(|e| ServiceError::eproto(format!("input: {e}")))?;
    if core.shutting_down.is_some() {
        return Err(ServiceError::eagain("broker is shutting down"));
    }
    if core.shells.contains(&id) {
        return Err(ServiceError::eexist(format!("job {id} already has a shell on rank {}", core.rank())));
    }
    input.uri = core.env.local_uri.clone();
    // Short names: a nested instance's socket lives below this directory and Unix socket paths are limited
    // to 108 bytes.
    let tmpdir = core.opts.rundir.join(format!("j{id}.{}", input.shell_rank));
    input.tmpdir = Some(tmpdir.display().to_string());
    // Node-local storage for the allocation: the enclosing batch/alloc job's where this instance is one, else the
    // job's own (under the admin's base, or in its tmpdir).
    let cfg = &core.opts.config;
    input.alloc_tmpdir = Some(crate::shellproto::alloc_tmpdir(
        cfg.alloc_tmpdir.as_deref().and_then(|p| p.to_str()),
        cfg.alloc_tmpdir_base.as_deref().and_then(|p| p.to_str()),
        &tmpdir.display().to_string(),
        &core.opts.instance,
        &input.id_f58,
        input.shell_rank,
    ));
    core.shells.insert(id);
    core.spawning.insert(id, msg.clone());
    core.effect(Effect::SpawnShell { id, input: Box::new(input), tmpdir });
    Ok(None)
}
