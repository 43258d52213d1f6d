//! Open MPI end to end, through the PMIx server Vigil gives every node of a job that asks for it with
//! `-o pmi=pmix` (`vigil-pmix`, started by the job shell): programs written here and compiled with Debian's
//! `mpicc.openmpi` run unmodified under `vigil run -o pmi=pmix` on several brokers (the fence carried by the job's PMI barrier), `MPI_Abort` ends the job with its code and an
//! exception, `-o pmi=LIST` picks the services, and MPICH still runs through PMI-1 in the same instance.
//!
//! Skipped, saying so, where `mpicc.openmpi` is not installed (`ci/setup.sh` installs `openmpi-bin
//! libopenmpi-dev libpmix-dev`), and the mpi4py test where Debian's `python3-mpi4py` is not.

mod common;

use common::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Timeout of one MPI job on the 2 shared cores.
const MPI_TIMEOUT: Duration = Duration::from_secs(60);

/// Every rank prints its rank, the size and the sum of all ranks (an allreduce across every node).
const HELLO: &str = r#"
#include <mpi.h>
#include <stdio.h>
int main(int argc, char **argv) {
    int rank, size, sum = 0;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Allreduce(&rank, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    printf("rank %d of %d sum %d\n", rank, size, sum);
    MPI_Finalize();
    return 0;
}
"#;

/// Rank 5 aborts with code 7; the others would wait a minute.
const ABORT: &str = r#"
#include <mpi.h>
#include <unistd.h>
int main(int argc, char **argv) {
    int rank;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 5)
        MPI_Abort(MPI_COMM_WORLD, 7);
    sleep(60);
    MPI_Finalize();
    return 0;
}
"#;

/// Open MPI refuses to start as root without these (the tests run as root in CI).
const ROOT_ENV: [&str; 2] = ["--env=OMPI_ALLOW_RUN_AS_ROOT=1", "--env=OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"];

/// Compile `src` with `compiler` into `dir/name`; `None` (after saying why on stderr) when the compiler is missing.
#[track_caller]
fn compile(compiler: &str, dir: &Path, name: &str, src: &str) -> Option<PathBuf> {
    let c_file = dir.join(format!("{name}.c"));
    std::fs::write(&c_file, src).expect("write the C source");
    let bin = dir.join(name);
    let out = match Command::new(compiler).arg("-O1").arg("-o").arg(&bin).arg(&c_file).output() {
        Ok(o) => o,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            eprintln!("SKIPPED: {compiler} not found (apt-get install openmpi-bin libopenmpi-dev libpmix-dev)");
            return None;
        }
        Err(e) => panic!("cannot run {compiler}: {e}"),
    };
    assert!(out.status.success(), "{compiler} failed:\n{}", String::from_utf8_lossy(&out.stderr));
    Some(bin)
}

/// `vigil run ARGS... PROG` with Open MPI's root switches.
fn run_args<'a>(args: &[&'a str], prog: &'a Path) -> Vec<&'a str> {
    let mut v = vec!["run"];
    v.extend(ROOT_ENV);
    v.extend_from_slice(args);
    v.push(prog.to_str().expect("a UTF-8 path"));
    v
}

/// Check the `-l` output of HELLO at `size` ranks: each task's rank is its MPI rank, exactly once, with the right
/// size and sum.
#[track_caller]
fn check_hello(o: &Output, size: u32) {
    let mut seen: BTreeMap<u32, u32> = BTreeMap::new();
    for l in o.lines() {
        let (task, rest) = l.split_once(": ").unwrap_or_else(|| panic!("unlabelled line {l:?}:\n{}", o.dump()));
        let task: u32 = task.parse().unwrap_or_else(|_| panic!("bad label in {l:?}:\n{}", o.dump()));
        let want = format!("rank {task} of {size} sum {}", size * (size - 1) / 2);
        assert_eq!(rest, want, "task {task}:\n{}", o.dump());
        *seen.entry(task).or_default() += 1;
    }
    let want: BTreeMap<u32, u32> = (0..size).map(|r| (r, 1)).collect();
    assert_eq!(seen, want, "every rank exactly once:\n{}", o.dump());
}

#[test]
fn openmpi_hello_and_allreduce_on_four_brokers() {
    let inst = Instance::start(4, &[]);
    let Some(prog) = compile("mpicc.openmpi", inst.dir.path(), "hello", HELLO) else { return };
    // 4 brokers x 2 tasks: the fence of MPI_Init crosses every node.
    let o = inst.vigil_t(&run_args(&["-N4", "-n8", "-l", "-o", "pmi=pmix"], &prog), MPI_TIMEOUT);
    o.ok();
    check_hello(&o, 8);
    // One node, 2 ranks: the fence stays on the node; shared memory between the tasks.
    let o = inst.vigil_t(&run_args(&["-N1", "-n2", "-l", "-o", "pmi=pmix"], &prog), MPI_TIMEOUT);
    o.ok();
    check_hello(&o, 2);
}

#[test]
fn openmpi_abort_ends_the_job_with_its_code() {
    let inst = Instance::start(4, &[]);
    let Some(prog) = compile("mpicc.openmpi", inst.dir.path(), "abort", ABORT) else { return };
    let o = inst.vigil_t(&run_args(&["-N4", "-n8", "-o", "pmi=pmix"], &prog), MPI_TIMEOUT);
    o.code_is(7);
    assert!(
        o.stderr.contains("exception type=exec severity=0: task 5: MPI_Abort / PMIx_Abort with exit code 7"),
        "the exception names the task and its code:\n{}",
        o.dump()
    );
}

#[test]
fn pmi_option_picks_the_services_and_mpich_still_runs() {
    let inst = Instance::start(2, &[]);
    let Some(ompi) = compile("mpicc.openmpi", inst.dir.path(), "ohello", HELLO) else { return };
    let mpich = compile("mpicc.mpich", inst.dir.path(), "mhello", HELLO).expect("mpicc.mpich (install mpich)");
    // By default PMI-1 alone: MPICH runs.
    let o = inst.vigil_t(&run_args(&["-N2", "-n4", "-l"], &mpich), MPI_TIMEOUT);
    o.ok();
    check_hello(&o, 4);
    // Both services in one job (`pmi=on` is the same): MPICH through PMI-1, Open MPI through PMIx.
    for (prog, list) in [(&mpich, "pmi=simple,pmix"), (&ompi, "pmi=simple,pmix"), (&ompi, "pmi=on")] {
        let o = inst.vigil_t(&run_args(&["-N2", "-n4", "-l", "-o", list], prog), MPI_TIMEOUT);
        o.ok();
        check_hello(&o, 4);
    }
    // Each on its own service.
    let o = inst.vigil_t(&run_args(&["-N2", "-n4", "-l", "-o", "pmi=simple"], &mpich), MPI_TIMEOUT);
    o.ok();
    check_hello(&o, 4);
    let o = inst.vigil_t(&run_args(&["-N2", "-n4", "-l", "-o", "pmi=pmix"], &ompi), MPI_TIMEOUT);
    o.ok();
    check_hello(&o, 4);
    // Without PMIx (the default), each Open MPI task starts alone (a singleton of size 1): the service is what made
    // the job. Each in a TMPDIR of its own: Open MPI 4.1's singletons started at once on one host race to create their
    // shared session directory (`ompi.HOST.UID`) and the loser fails with "File exists" (seen in CI).
    let alone = format!(
        "TMPDIR=${{TMPDIR:-/tmp}}/task$VIGIL_TASK_RANK; mkdir -p $TMPDIR; export TMPDIR; exec {}",
        ompi.display()
    );
    let o =
        inst.vigil_t(&[&run_args(&["-N2", "-n2", "-l"], Path::new("sh"))[..], &["-c", &alone]].concat(), MPI_TIMEOUT);
    o.ok();
    let lines = o.lines();
    assert_eq!(lines.len(), 2, "{}", o.dump());
    assert!(lines.iter().all(|l| l.ends_with("rank 0 of 1 sum 0")), "singletons:\n{}", o.dump());
    // A name the shell does not serve is refused before the job is submitted.
    let o = inst.vigil(&["run", "-o", "pmi=simple,pmi3", "true"]);
    assert_ne!(o.code, 0, "{}", o.dump());
    assert!(o.stderr.contains("-o pmi=simple,pmi3: expected pmi=LIST"), "{}", o.dump());
}

/// HELLO in Python: Debian's mpi4py (`python3-mpi4py`, built against Open MPI 4.1).
const HELLO_PY: &str = r#"
from mpi4py import MPI
comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
total = comm.allreduce(rank, op=MPI.SUM)
print(f"rank {rank} of {size} sum {total}", flush=True)
"#;

/// Debian's Python, which has Debian's mpi4py (another `python3` first on PATH may not).
const DEBIAN_PYTHON: &str = "/usr/bin/python3";

/// mpi4py's allreduce across 4 brokers, 8 ranks, under `-o pmi=pmix`: Open MPI's Python binding starts through
/// the same PMIx server as a C program (issue 38).
#[test]
fn mpi4py_allreduce_on_four_brokers() {
    let has = Command::new(DEBIAN_PYTHON).args(["-c", "import mpi4py"]).output();
    if !has.is_ok_and(|o| o.status.success()) {
        eprintln!("SKIPPED: {DEBIAN_PYTHON} has no mpi4py (apt-get install python3-mpi4py)");
        return;
    }
    let inst = Instance::start(4, &[]);
    let script = inst.dir.path().join("hello.py");
    std::fs::write(&script, HELLO_PY).expect("write the Python script");
    let mut args = vec!["run"];
    args.extend(ROOT_ENV);
    args.extend(["-N4", "-n8", "-l", "-o", "pmi=pmix", DEBIAN_PYTHON, script.to_str().expect("a UTF-8 path")]);
    let o = inst.vigil_t(&args, MPI_TIMEOUT);
    o.ok();
    check_hello(&o, 8);
}
