//! `vigil-pmix`: the PMIx server of one node of a job, started by the job shell (`vigil-shell`).
//!
//! The job shell is linked statically and Debian ships no static `libpmix`, so the PMIx server library (OpenPMIx,
//! linked dynamically) runs in this small helper, one per node of a job that asks for PMIx (`-o pmi=pmix`, or `on` for
//! PMI-1 too). The shell talks to it over the helper's stdin and stdout, one JSON object per line ([`vigil_proto::pmix`], which the
//! shell uses too):
//!
//! 1. The shell sends [`pmix::Setup`]: the job's namespace, sizes, the ranks of every node, the hosts. The helper
//!    calls `PMIx_server_init`, registers the namespace with its job-level keys and the per-process keys of every
//!    rank, registers each local task as a client, and answers [`pmix::FromHelper::Ready`] with the environment
//!    `PMIx_server_setup_fork` gave each local task (the shell adds it to the task's environment), or
//!    [`pmix::FromHelper::Error`].
//! 2. The PMIx server's upcalls become messages to the shell: a fence ([`pmix::FromHelper::Fence`]) with this
//!    node's blob, which the shell exchanges with the job's other shells (the PMI barrier of `job-exec`) and answers
//!    with every node's blob ([`pmix::ToHelper::FenceDone`]), or an error; an abort
//!    ([`pmix::FromHelper::Abort`]), on which the shell raises the job's fatal exception; clients connecting and
//!    finalizing ([`pmix::FromHelper::Connected`], [`pmix::FromHelper::Finalized`]).
//! 3. End of the shell's input: the helper finalizes the server and exits 0.
//!
//! Spawn, connect, publish and the other optional upcalls are left out, which OpenPMIx answers to its clients as
//! not supported; a direct modex (a key of a remote process that no fence brought) is answered not found.
//!
//! Exit codes: 0 after the shell closed its input; 1 when the setup failed (after saying why in an `error` line),
//! or when the helper was built without OpenPMIx.
#![cfg_attr(not(vigil_pmix), allow(dead_code))]

#[cfg(vigil_pmix)]
mod server;

use std::io::Write as _;
use vigil_proto::pmix::{self, FromHelper};

/// Write one message on stdout, whole, as one line (a lock makes lines from several threads whole).
pub(crate) fn send(m: &FromHelper) {
    let line = pmix::line(m);
    let mut out = std::io::stdout().lock();
    // The shell gone: nothing to tell; the helper ends when its input closes.
    let _ = out.write_all(line.as_bytes()).and_then(|()| out.flush());
}

fn main() {
    #[cfg(vigil_pmix)]
    std::process::exit(server::run());
    #[cfg(not(vigil_pmix))]
    {
        let why = env!("VIGIL_PMIX_UNAVAILABLE");
        send(&FromHelper::Error { error: format!("vigil-pmix was built without OpenPMIx: {why}") });
        std::process::exit(1);
    }
}
