//! The line protocol between the job shell and `vigil-pmix`: one JSON object per line, each way.
//!
//! Every message is an object with one key naming it (serde's external tagging: `{"fence": {...}}`). Binary data
//! (fence blobs) is standard base64. The shell's side is written with `serde_json::json!` in `vigil-shell`
//! (`shell/src/pmix.rs`), which does not link this crate; keep both in step.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Write as _;

/// The job as this node's PMIx server registers it; the first line the shell sends.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Setup {
    /// The PMIx namespace of the job (`vigil.<jobid>`), at most 255 bytes.
    pub(crate) nspace: String,
    /// The job's id as users see it (`PMIX_JOBID`).
    pub(crate) jobid: String,
    /// This node's index among the job's nodes (the shell rank: `PMIX_NODEID`, the server's rank).
    pub(crate) nodeid: u32,
    /// The job's task count (`PMIX_JOB_SIZE`, `PMIX_UNIV_SIZE`).
    pub(crate) size: u32,
    /// The global ranks of each node's tasks, by node index; this node's are `ranks[nodeid]`.
    pub(crate) ranks: Vec<Vec<u32>>,
    /// The host name of each node, by node index (`PMIX_NODE_MAP`, `PMIX_HOSTNAME`).
    pub(crate) hosts: Vec<String>,
    /// The job's temporary directory on this node (`PMIX_TMPDIR`, `PMIX_NSDIR`, and where the server puts its
    /// rendezvous files).
    pub(crate) tmpdir: String,
}

/// What the helper sends to the shell.
#[derive(Debug, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum FromHelper {
    /// The server is up: the environment to add to each local task, by global rank.
    Ready {
        /// `PMIx_server_setup_fork`'s variables for each local task.
        env: BTreeMap<u32, BTreeMap<String, String>>,
        /// The OpenPMIx version serving them.
        version: String,
    },
    /// The setup failed (the helper then exits 1).
    Error {
        /// Why, in one sentence.
        error: String,
    },
    /// The local tasks entered fence `seq` (numbered from 0 in the order they were entered): exchange `data` with
    /// every node's and answer [`ToHelper::FenceDone`] or [`ToHelper::FenceFailed`].
    Fence {
        /// The fence's number on this node.
        seq: u64,
        /// This node's blob for the fence, base64.
        data: String,
    },
    /// A task called `PMIx_Abort` (`MPI_Abort`).
    Abort {
        /// The task's global rank.
        rank: u32,
        /// The status it asked the job to exit with.
        status: i32,
        /// Its message, if any.
        msg: String,
    },
    /// A task connected to the server (`PMIx_Init`).
    Connected {
        /// The task's global rank.
        rank: u32,
    },
    /// A task finalized (`PMIx_Finalize`).
    Finalized {
        /// The task's global rank.
        rank: u32,
    },
}

/// What the shell sends to the helper after the [`Setup`].
#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ToHelper {
    /// Fence `seq` completed: every node's blob, base64, in node order.
    FenceDone {
        /// The fence's number.
        seq: u64,
        /// The blobs.
        data: Vec<String>,
    },
    /// Fence `seq` failed (the job is failing).
    FenceFailed {
        /// The fence's number.
        seq: u64,
        /// Why.
        error: String,
    },
}

/// Write one message on stdout, whole, as one line (a lock makes lines from several threads whole).
pub(crate) fn send(m: &FromHelper) {
    let Ok(mut line) = serde_json::to_string(m) else { return };
    line.push('\n');
    let mut out = std::io::stdout().lock();
    // The shell gone: nothing to tell; the helper ends when its input closes.
    let _ = out.write_all(line.as_bytes()).and_then(|()| out.flush());
}
