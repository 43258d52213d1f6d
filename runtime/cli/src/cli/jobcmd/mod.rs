//! Job commands: `run`, `submit`, `jobs`, `cancel`, `update`, `job submit|eventlog|attach|wait|cancel|info|...`.
//!
//! | file | what it does |
//! |---|---|
//! | `args.rs` | the options of `run` and `submit`; the node options `batch` and `alloc` share |
//! | `spec.rs` | the jobspec built from those options, and the checks of each |
//! | `nodes.rs` | a `hostfile:` task map and `-x` checked against the instance's nodes |
//! | `copies.rs` | `--cc`: one job per id, submitted pipelined |
//! | `run.rs` | `vigil run` and `vigil submit` |
//! | `attach.rs` | following a job to its end, through a restart of rank 0 |
//! | `jobs.rs` | `vigil jobs` |
//! | `cancel.rs` | `vigil cancel` |
//! | `update.rs` | `vigil update` |
//! | `job.rs` | `vigil job ...` |

mod args;
mod attach;
mod cancel;
mod copies;
mod job;
mod jobs;
mod nodes;
mod run;
mod spec;
mod update;

pub(crate) use crate::cli::submit::submit_value;
pub(crate) use args::{NodeCount, NodeSelection, SubmitArgs};
pub(crate) use attach::{say_if_pending, PENDING_NOTE_AFTER, RANK0_WAIT_MARGIN};
pub(crate) use cancel::cancel;
pub(crate) use cancel::CancelArgs;
pub(crate) use copies::{cc_set, submit_all};
pub(crate) use job::JobCmd;
pub(crate) use job::{human_event, job};
pub(crate) use jobs::JobsArgs;
pub(crate) use jobs::{jobs, user_id, user_name, JobLines};
pub(crate) use nodes::check_exclude;
pub(crate) use run::run;
pub(crate) use spec::{build_jobspec, check_output_template, said_as_typed};
pub(crate) use update::update;
pub(crate) use update::UpdateArgs;

/// Error text `e` about the job the user wrote as `typed` (f58, decimal, any accepted form), with rank 0's name for
/// it (its f58 form) put back as the user wrote it: `vigil job info 12345` says `unknown job id 12345`, not the f58
/// form the user never typed (issue 39).
pub(crate) fn as_typed(e: String, typed: &str) -> String {
    let typed = typed.trim();
    match crate::jobs::JobId::parse(typed) {
        Ok(id) if id.f58() != typed => e.replace(&id.f58(), typed),
        _ => e,
    }
}
