//! `vigil-shell`: the job shell. One runs per node of a job, started by the local broker (`rexec.spawn`).
//!
//! It reads its [`ShellInput`] as JSON on stdin, with the placement of the node's tasks that its broker computed with
//! hwloc (`-o cpu-affinity=off|on|per-task`, `-o gpu-affinity=off|on|per-task`; the shell links no hwloc, whose
//! loading was a sixth of a short job's shell), binds them on a live topology, launches them with the `VIGIL_*`
//! environment, forwards their stdout/stderr line by line to the exec system on rank 0 (`job-exec.output`),
//! reports each task's exit (`job-exec.task-exit`, which starts the job-wide exit-timeout clock), forwards
//! signals, and finally writes one [`ShellReport`] JSON line on stdout.
//!
//! Exit codes: 0 when a report was written (whatever the tasks did); 1 if the input could not be read.
//!
//! The shell starts at the C `main` (its `main` below) rather than through std's runtime start-up, whose one costly
//! step here is finding the main thread's stack for its overflow guard: glibc reads and parses
//! `/proc/self/maps` for it, about 4 % of a short job's shell CPU. Without it a stack overflow is a plain
//! SIGSEGV instead of std's message; SIGPIPE is ignored here as std would (tasks still start with it at its
//! default: std resets it in every child it spawns); standard descriptors 0-2 are always open (the broker
//! gives the shell a pipe on each of 0 and 1 and its own stderr).
#![cfg_attr(not(test), no_main)]

mod bind;
mod pmi;
mod pmix;

use bind::CpuMask;
use std::collections::BTreeMap;
use std::io::Write as _;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::Stdio;
use std::str::FromStr;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::sync::mpsc;
use vigil_client::Client;
use vigil_proto::affinity::{format_cpulist, CpuAffinity, GpuAffinity};
use vigil_proto::message::NODEID_ANY;
use vigil_proto::shellproto::{
    status_exited, OutputLine, ShellInput, ShellReport, TaskPlacement, ALLOC_SUBDIR, ALLOC_TMPDIR_ENV, TOPIC_OUTPUT,
    TOPIC_TASK_EXIT,
};

/// Longest line forwarded as one output entry (bytes); longer lines are split.
const MAX_LINE: usize = 64 * 1024;
/// Most lines sent in one `job-exec.output` message.
const BATCH_LINES: usize = 256;
/// Output chunks buffered in the shell before tasks block on their pipes.
const OUTPUT_QUEUE: usize = 1024;
/// `job-exec.output` batches in flight to rank 0 before the shell waits for an acknowledgement.
const OUTPUT_WINDOW: usize = 8;
/// Times a `job-exec.output` batch is sent again after EHOSTUNREACH, which our broker answers when the router it
/// went up through was lost with it in flight (the broker then re-parents and holds the next try for its new
/// parent: docs/failure-detection.md, "Re-parenting").
const OUTPUT_RESENDS: usize = 3;

/// Entry point, called by the C runtime with the program's arguments (unused: the input comes on stdin; the
/// `--jobid` the broker passes is for `ps`). Returns the exit code (see the crate docs).
#[cfg_attr(not(test), no_mangle)]
extern "C" fn main(_argc: libc::c_int, _argv: *const *const libc::c_char) -> libc::c_int {
    // As std's start-up would: a broker or task gone away is a write error, not a death by signal.
    // SAFETY: setting a signal's disposition to SIG_IGN installs no handler and has no other effect.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("vigil-shell: cannot start runtime: {e}");
            std::process::exit(1);
        }
    };
    std::process::exit(rt.block_on(run()));
}

/// This shell's cgroup v2 directory: as its broker says ([`vigil_proto::shellproto::CGROUP_ENV`]), else its
/// `0::` line in `/proc/self/cgroup` under the cgroup2 mount of `/proc/self/mountinfo`.
fn own_cgroup_dir() -> Option<std::path::PathBuf> {
    // Where the broker created this shell in its job's cgroup, it says which.
    if let Some(dir) = std::env::var_os(vigil_proto::shellproto::CGROUP_ENV) {
        return Some(dir.into());
    }
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mount = info.lines().find_map(|l| {
        let (pre, post) = l.split_once(" - ")?;
        (post.split_whitespace().next()? == "cgroup2").then(|| pre.split_whitespace().nth(4).map(str::to_string))?
    })?;
    let cg = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let own = cg.lines().find_map(|l| l.strip_prefix("0::"))?.trim_start_matches('/').to_string();
    Some(std::path::Path::new(&mount).join(own))
}

/// `memory.events` of this shell's cgroup, where it has one (the memory controller enabled for it).
fn own_memory_events() -> Option<std::path::PathBuf> {
    let p = own_cgroup_dir()?.join("memory.events");
    p.exists().then_some(p)
}

/// Kill everything in this shell's job cgroup, the shell included: only a cgroup a broker made for a job
/// (`vigil-broker-*/job-*`), never one this shell merely happens to run in.
fn kill_own_job_cgroup() {
    let Some(dir) = own_cgroup_dir() else { return };
    let name = |p: &std::path::Path| p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let ours = name(&dir).starts_with("job-") && dir.parent().is_some_and(|p| name(p).starts_with("vigil-broker-"));
    if ours {
        let _ = std::fs::write(dir.join("cgroup.kill"), "1");
    }
}

/// Where `execvp(3)` would find `prog`: the first executable regular file `DIR/prog` for DIR in `path` (the
/// task's `PATH`; glibc's default `/bin:/usr/bin` when it has none; an empty entry is the working directory),
/// relative entries taken from `cwd` (the task's working directory) when given. `None` for a `prog` that names
/// a path (it is used as it is), is found nowhere (then the spawn reports the error `execvp` would), or is
/// neither an ELF file nor a `#!` script (`execvp` runs those with `/bin/sh`, posix_spawn does not: the spawn
/// then takes std's fork and `execvp` path).
fn resolve_program(prog: &str, path: Option<&str>, cwd: Option<&str>) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    if prog.is_empty() || prog.contains('/') {
        return None;
    }
    for dir in path.unwrap_or("/bin:/usr/bin").split(':') {
        let mut cand = std::path::Path::new(if dir.is_empty() { "." } else { dir }).join(prog);
        if let (true, Some(c)) = (cand.is_relative(), cwd) {
            cand = std::path::Path::new(c).join(cand);
        }
        let Ok(meta) = std::fs::metadata(&cand) else { continue };
        let executable = meta.is_file()
            && meta.permissions().mode() & 0o111 != 0
            && nix::unistd::access(&cand, nix::unistd::AccessFlags::X_OK).is_ok();
        if !executable {
            continue;
        }
        // This is the file execvp would run: resolved only if posix_spawn runs it the same way.
        let mut magic = [0u8; 4];
        let n = std::fs::File::open(&cand).and_then(|mut f| std::io::Read::read(&mut f, &mut magic)).ok()?;
        return (magic[..n].starts_with(b"\x7fELF") || magic[..n].starts_with(b"#!")).then_some(cand);
    }
    None
}

/// The calling thread bound to a task's CPUs until dropped, then given back the CPUs it had: a task spawned
/// meanwhile inherits the binding from its first instruction (as with `sched_setaffinity` between fork and exec,
/// without the fork).
struct BoundThread(libc::cpu_set_t);

impl BoundThread {
    fn bind(mask: &CpuMask) -> std::io::Result<BoundThread> {
        // SAFETY: cpu_set_t is a plain array of integers; all-zero is the empty set.
        let mut old: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: a valid pointer to a cpu_set_t of the size passed.
        if unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut old) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        mask.apply()?;
        Ok(BoundThread(old))
    }
}

impl Drop for BoundThread {
    fn drop(&mut self) {
        // SAFETY: a valid pointer to a fully initialised cpu_set_t of the size passed.
        unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &self.0) };
    }
}

/// The `oom_kill` count in the `memory.events` file at `path`.
fn oom_kills(path: &std::path::Path) -> Option<u64> {
    let s = std::fs::read_to_string(path).ok()?;
    s.lines().find_map(|l| l.strip_prefix("oom_kill ")).and_then(|n| n.trim().parse().ok())
}

async fn run() -> i32 {
    let mut text = String::new();
    if let Err(e) = std::io::Read::read_to_string(&mut std::io::stdin(), &mut text) {
        eprintln!("vigil-shell: cannot read input: {e}");
        return 1;
    }
    let input: ShellInput = match serde_json::from_str(&text) {
        Ok(i) => i,
        Err(e) => {
            eprintln!("vigil-shell: malformed shell input: {e}");
            return 1;
        }
    };
    // Started by vigil-imp as a guest (docs/security.md): run only what the submitter signed.
    if let Err(e) = check_signed(&input, std::env::var(vigil_proto::shellproto::IMP_JOBSPEC_SHA_ENV).ok().as_deref()) {
        let report = ShellReport::failed(format!("refused: {e}"));
        let _ = writeln!(std::io::stdout(), "{}", serde_json::to_string(&report).unwrap_or_default());
        return 0;
    }
    let report = match Shell::new(input).await {
        Ok(mut sh) => sh.run().await,
        Err(e) => ShellReport::failed(e),
    };
    // The broker reads this report from our stdout; if it is gone there is nobody to tell.
    let _ = writeln!(std::io::stdout(), "{}", serde_json::to_string(&report).unwrap_or_default());
    0
}

/// Where `vigil-imp` started this shell (it says so in `sha`, [`vigil_proto::shellproto::IMP_JOBSPEC_SHA_ENV`]: the
/// SHA-256 of the jobspec it checked the submitter's credential against), check that `input` is that job: its
/// signed jobspec has that SHA-256, and its command, environment, working directory, options and files are that
/// jobspec's. Nothing to check otherwise.
///
/// # Errors
/// What differs.
fn check_signed(input: &ShellInput, sha: Option<&str>) -> Result<(), String> {
    let Some(sha) = sha else { return Ok(()) };
    let Some(imp) = &input.imp else {
        return Err("started by vigil-imp, but the input carries no signed jobspec".into());
    };
    if vigil_client::munge::sha256_hex(imp.jobspec.as_bytes()) != sha {
        return Err("the input's jobspec is not the one vigil-imp checked (their SHA-256 differ)".into());
    }
    input.check_signed()
}

/// Make directory `dir`, new (not one that exists already), mode 0700, owned by this process's user.
fn make_private_dir(dir: &std::path::Path) -> Result<(), String> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new().mode(0o700).create(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    // Whatever the umask took away.
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| format!("cannot chmod {}: {e}", dir.display()))
}

/// The job's nodes as one compressed host list (`node[1-3,7]`, RFC 29), from R's `execution.nodelist` (RFC 20:
/// host lists in rank order), as Slurm's `SLURM_JOB_NODELIST`; `None` when R has none or it does not parse.
fn job_nodelist(r: &serde_json::Value) -> Option<String> {
    let hosts = vigil_proto::r::Rv1::from_value(r).ok()?.hosts().ok()?;
    (!hosts.is_empty()).then(|| hosts.to_string())
}

struct Shell {
    tmpdir: Option<std::path::PathBuf>,
    /// The tasks' `VIGIL_ALLOC_TMPDIR` on this node, and whether this shell removes it at the end (it made it).
    alloc_tmpdir: Option<(std::path::PathBuf, bool)>,
    input: ShellInput,
    client: Client,
    placement: Vec<TaskPlacement>,
    bind: bool,
    notes: Vec<String>,
}

impl Shell {
    async fn new(mut input: ShellInput) -> Result<Shell, String> {
        if let Some(cwd) = &input.cwd {
            if !std::path::Path::new(cwd).is_dir() {
                return Err(format!("working directory {cwd} does not exist on this node"));
            }
        }
        let client = Client::connect(&input.uri).await.map_err(|e| format!("cannot connect to broker: {e}"))?;
        let cpu = match input.option_str("cpu-affinity") {
            Some(v) => CpuAffinity::from_str(&v).map_err(|e| e.to_string())?,
            None => CpuAffinity::PerTask,
        };
        let gpu = match input.option_str("gpu-affinity") {
            Some(v) => GpuAffinity::from_str(&v).map_err(|e| e.to_string())?,
            None => GpuAffinity::PerTask,
        };
        let mut notes = Vec::new();
        // A memory limit the broker could not apply here: the job runs, and is told.
        if let Ok(why) = std::env::var(vigil_proto::shellproto::MEMORY_NOTE_ENV) {
            let host = nix::unistd::gethostname().ok().and_then(|h| h.into_string().ok()).unwrap_or_default();
            let v = input.option_str("memory").unwrap_or_default();
            notes.push(format!("vigil-shell: memory={v} not applied on {host} (rank {}): {why}", input.broker_rank));
        }
        // The broker placed the tasks with hwloc (it loads the node's topology once, not once per shell). On a node
        // without an hwloc topology (`cpu-count`; the broker sends no placement then), or from a broker that sent
        // none: by CPU number.
        let Some(p) = input.placement.take() else {
            if input.topology == "cpu-count" && input.shell_rank == 0 {
                notes.push("vigil-shell: no hwloc topology on this node; tasks bound by CPU number".to_string());
            }
            let placement = cpu_count_placement(&input, cpu, gpu);
            let bind = cpu != CpuAffinity::Off;
            return Ok(Shell { tmpdir: None, alloc_tmpdir: None, input, client, placement, bind, notes });
        };
        if let Some(e) = p.error {
            return Err(e);
        }
        notes.extend(p.notes);
        let (placement, bind) = (p.tasks, p.bind);
        Ok(Shell { tmpdir: None, alloc_tmpdir: None, input, client, placement, bind, notes })
    }

    /// Task `rank` was killed by the OOM killer: a non-fatal exception naming it, the node and the broker rank,
    /// said exit-on-error or not (the job's other tasks go on).
    fn report_oom(&self, id: u64, rank: u32) {
        let host = nix::unistd::gethostname().ok().and_then(|h| h.into_string().ok()).unwrap_or_default();
        let note = format!("task {rank} on {host} (rank {}) was killed by the OOM killer", self.input.broker_rank);
        let _ = self.client.send(
            vigil_proto::shellproto::TOPIC_EXCEPTION,
            0,
            &serde_json::json!({"id": id, "type": "oom", "severity": 1, "note": note, "rank": self.input.broker_rank}),
        );
    }

    /// The environment of local task `local`, global task rank `rank` (the job's task map gave it to this node).
    fn task_env(&self, local: u32, rank: u32) -> BTreeMap<String, String> {
        let i = &self.input;
        let mut env = i.environment.clone();
        env.insert("VIGIL_JOB_ID".into(), i.id_f58.clone());
        env.insert("VIGIL_TASK_RANK".into(), rank.to_string());
        env.insert("VIGIL_TASK_LOCAL_RANK".into(), local.to_string());
        env.insert("VIGIL_JOB_SIZE".into(), i.ntasks.to_string());
        env.insert("VIGIL_JOB_NNODES".into(), i.nshells.to_string());
        if let Some(nodes) = job_nodelist(&i.r) {
            env.insert("VIGIL_JOB_NODELIST".into(), nodes);
        }
        env.insert("VIGIL_SHELL_RANK".into(), i.shell_rank.to_string());
        env.insert("VIGIL_BROKER_RANK".into(), i.broker_rank.to_string());
        env.insert("VIGIL_URI".into(), i.uri.clone());
        env.insert("VIGIL_TASKMAP".into(), i.taskmap.to_string());
        env.insert("VIGIL_NODE_TOPOLOGY".into(), i.topology.clone());
        if let Some(g) = i.declared_gpus {
            env.insert("VIGIL_NODE_GPUS".into(), g.to_string());
        }
        if let Some(t) = &self.tmpdir {
            env.insert("VIGIL_JOB_TMPDIR".into(), t.display().to_string());
        }
        // This node's, never the one the submitter's environment carried from another node.
        match &self.alloc_tmpdir {
            Some((a, _)) => env.insert(ALLOC_TMPDIR_ENV.into(), a.display().to_string()),
            None => env.remove(ALLOC_TMPDIR_ENV),
        };
        if let Some(p) = self.placement.get(local as usize) {
            if let Some(cpus) = &p.cpus {
                env.insert("VIGIL_TASK_CPUS".into(), format_cpulist(cpus));
            }
            env.insert("VIGIL_TASK_CORES".into(), format_cpulist(&p.cores));
            if let Some(g) = &p.gpus {
                let list = g.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(",");
                env.insert("CUDA_VISIBLE_DEVICES".into(), list.clone());
                env.insert("ROCR_VISIBLE_DEVICES".into(), list);
            }
        }
        env
    }

    /// Start this node's PMIx server (`vigil-pmix`) for local tasks `ranks`, with the job's layout.
    async fn start_pmix(&self, ranks: &[u32]) -> Result<pmix::Helper, String> {
        let i = &self.input;
        let by_node = vigil_proto::taskmap::Taskmap::decode(&i.taskmap)
            .map_err(|e| format!("task map: {e}"))?
            .tasks_by_node(i.nshells as usize);
        if by_node.get(i.shell_rank as usize).map(Vec::as_slice) != Some(ranks) {
            return Err(format!("the task map does not give shell {} its tasks", i.shell_rank));
        }
        // R's hosts, in the order of the job's nodes; made-up names where R has none for every node.
        let hosts: Vec<String> = vigil_proto::r::Rv1::from_value(&i.r)
            .ok()
            .and_then(|r| r.hosts().ok())
            .map(|h| h.into_vec())
            .filter(|h| h.len() == i.nshells as usize)
            .unwrap_or_else(|| (0..i.nshells).map(|n| format!("vigil-node{n}")).collect());
        // Several brokers of one host (a test instance) are still different nodes to the job: Open MPI takes
        // processes of one host name for neighbours and joins them through shared memory, which fails across
        // shells. Such names get their node index.
        let distinct = hosts.iter().collect::<std::collections::BTreeSet<_>>().len() == hosts.len();
        let hosts: Vec<String> =
            if distinct { hosts } else { hosts.into_iter().enumerate().map(|(n, h)| format!("{h}-{n}")).collect() };
        let tmpdir = self.tmpdir.as_ref().ok_or("no job directory")?.display().to_string();
        // Open MPI 4.1 takes a process for direct-launched (its `ess` component `pmi`) only when a resource
        // manager it knows claims it (its `schizo` components: Slurm, Flux, LSF's jsm); else its `orte` one
        // declares it a singleton. Excluding that one lets the PMIx server be found: the equivalent of a `schizo`
        // component of Vigil's own.
        let mut defaults = BTreeMap::from([("OMPI_MCA_schizo".to_string(), "^orte".to_string())]);
        if !distinct {
            // Its shared-memory segments are named by host, job and local rank in /dev/shm: the shells of one
            // host would share them. Each node's go to its own job directory.
            defaults.insert("OMPI_MCA_btl_vader_backing_directory".into(), tmpdir.clone());
        }
        let setup = vigil_proto::pmix::Setup {
            nspace: format!("vigil.{}", i.id_f58),
            jobid: i.id_f58.clone(),
            nodeid: i.shell_rank,
            size: i.ntasks,
            ranks: by_node,
            hosts,
            tmpdir,
        };
        let mut h = pmix::Helper::start(&setup).await?;
        h.defaults = defaults;
        Ok(h)
    }

    /// Create the job's temporary directory on this node: `R.json` (the job's R, RFC 20) and the jobspec's files.
    fn make_tmpdir(&mut self) -> Result<(), String> {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        let dir = match &self.input.tmpdir {
            Some(d) => std::path::PathBuf::from(d),
            None => {
                let base = std::env::var("TMPDIR").unwrap_or_else(|_| "/tmp".into());
                std::path::PathBuf::from(base).join(format!(
                    "vigil-job-{}-{}-{}",
                    self.input.id_f58,
                    self.input.shell_rank,
                    std::process::id()
                ))
            }
        };
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        std::fs::write(dir.join("R.json"), self.input.r.to_string())
            .map_err(|e| format!("cannot write R.json: {e}"))?;
        for (name, f) in &self.input.files {
            if name.contains('/') || name == ".." || name.is_empty() {
                return Err(format!("invalid file name '{name}' in attributes.system.files"));
            }
            let data = f.get("data").and_then(|d| d.as_str()).unwrap_or("");
            let mode = f.get("mode").and_then(|m| m.as_u64()).unwrap_or(0o644) as u32 & 0o777;
            let path = dir.join(name);
            std::fs::write(&path, data).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
                .map_err(|e| format!("chmod {}: {e}", path.display()))?;
        }
        self.alloc_tmpdir = self.make_alloc_tmpdir(&dir);
        self.tmpdir = Some(dir);
        Ok(())
    }

    /// The allocation's directory on this node (`VIGIL_ALLOC_TMPDIR`, chosen by the broker). One this job owns
    /// is made here, new and mode 0700 (never one that someone made first: in a shared base such as /dev/shm
    /// that could be another user's); where it cannot be, the job gets `ALLOC_SUBDIR` of its tmpdir `job_dir`
    /// instead, and its stderr says why. One of the enclosing allocation is checked, and made again if a job of
    /// the allocation removed it. `None`: the tasks get none (said on stderr, unless the broker is too old to
    /// choose one).
    fn make_alloc_tmpdir(&mut self, job_dir: &std::path::Path) -> Option<(std::path::PathBuf, bool)> {
        let a = self.input.alloc_tmpdir.clone()?;
        let path = std::path::PathBuf::from(&a.path);
        let host = nix::unistd::gethostname().ok().and_then(|h| h.into_string().ok()).unwrap_or_default();
        let on = format!("on {host} (rank {})", self.input.broker_rank);
        let fallback = job_dir.join(ALLOC_SUBDIR);
        if !a.owned {
            if path.is_dir() {
                return Some((path, false));
            }
            // Removed by a job of the allocation (its owner, the batch job's shell, removes it only at the end):
            // made again, still the allocation's; else this job's own, as where one cannot be made.
            match make_private_dir(&path) {
                Ok(()) => {
                    self.notes.push(format!(
                        "vigil-shell: the allocation's directory {} was gone {on}: made again, empty",
                        path.display()
                    ));
                    return Some((path, false));
                }
                Err(e) => self.notes.push(format!(
                    "vigil-shell: the allocation's directory was gone and {e} {on}: VIGIL_ALLOC_TMPDIR is {} instead",
                    fallback.display()
                )),
            }
            return make_private_dir(&fallback)
                .map(|()| (fallback, true))
                .map_err(|e| {
                    self.notes.push(format!("vigil-shell: {e} {on}: VIGIL_ALLOC_TMPDIR is unset"));
                })
                .ok();
        }
        match make_private_dir(&path) {
            Ok(()) => return Some((path, true)),
            Err(e) if path == fallback => {
                self.notes.push(format!("vigil-shell: {e} {on}: VIGIL_ALLOC_TMPDIR is unset"));
                return None;
            }
            Err(e) => self.notes.push(format!(
                "vigil-shell: {e} {on} (exec.alloc-tmpdir-base): VIGIL_ALLOC_TMPDIR is {} instead",
                fallback.display()
            )),
        }
        match make_private_dir(&fallback) {
            Ok(()) => Some((fallback, true)),
            Err(e) => {
                self.notes.push(format!("vigil-shell: {e} {on}: VIGIL_ALLOC_TMPDIR is unset"));
                None
            }
        }
    }

    /// Remove the job's temporary directory `dir`: the files this shell wrote into it, then the directory, which
    /// is all it takes when the tasks left nothing there (two or three system calls where a recursive removal
    /// lists the directory first); a directory the tasks wrote into is removed recursively.
    fn remove_tmpdir(&self, dir: &std::path::Path) {
        let _ = std::fs::remove_file(dir.join("R.json"));
        for name in self.input.files.keys() {
            let _ = std::fs::remove_file(dir.join(name));
        }
        if std::fs::remove_dir(dir).is_err() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }

    /// Open the files named by the `output` shell option (`{"stdout": {"path"}, "stderr": {"path"}}`, its
    /// templates filled in: `{{id}}`, `{{name}}`, [`vigil_proto::shellproto::output_path`]), relative to the job's working directory, for appending.
    fn output_files(&self) -> Result<(Option<std::fs::File>, Option<std::fs::File>), String> {
        let open = |which: &str| -> Result<Option<std::fs::File>, String> {
            let Some(p) = self
                .input
                .options
                .get("output")
                .and_then(|o| o.get(which))
                .and_then(|o| o.get("path"))
                .and_then(|p| p.as_str())
            else {
                return Ok(None);
            };
            let i = &self.input;
            let p = vigil_proto::shellproto::output_path(p, i.id, &i.id_f58, i.name.as_deref());
            let path = match &self.input.cwd {
                Some(c) if !p.starts_with('/') => std::path::Path::new(c).join(&p),
                _ => std::path::PathBuf::from(&p),
            };
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .map(Some)
                .map_err(|e| format!("cannot open output file {}: {e}", path.display()))
        };
        Ok((open("stdout")?, open("stderr")?))
    }

    /// The shell's run, in steps: set up (the tmpdirs, output files, [`Shell::spawn_forwarder`], PMI-1 and PMIx),
    /// [`Shell::start_tasks`], their standard input and signals passed on, then serve them (PMI, exits, early exit
    /// reports, lost-node notices, signals) until every one has exited, and [`Shell::end`].
    async fn run(&mut self) -> ShellReport {
        let id = self.input.id;
        if let Err(e) = self.make_tmpdir() {
            return ShellReport::failed(e);
        }
        let (out_file, err_file) = match self.output_files() {
            Ok(f) => f,
            Err(e) => {
                // The broker removes the job's tmpdir; an allocation directory elsewhere is ours to remove.
                if let Some((a, true)) = self.alloc_tmpdir.take() {
                    let _ = std::fs::remove_dir_all(a);
                }
                return ShellReport::failed(e);
            }
        };
        // Bounded: a task that writes faster than rank 0 takes its output blocks on its pipe (backpressure)
        // instead of growing the shell's memory.
        let (out_tx, out_rx) = mpsc::channel::<OutputLine>(OUTPUT_QUEUE);
        for n in self.notes.drain(..) {
            let _ = out_tx.try_send(OutputLine::text(self.input.first_task, "stderr", n));
        }
        // Forwarder: batch lines, send without waiting; the final flush below waits for rank 0's ack.
        let fwd = self.spawn_forwarder(out_rx, out_file, err_file);

        // PMI-1: one socketpair per task, served by this shell; PMIx: a `vigil-pmix` helper on this node
        // (`-o pmi=LIST`, both by default; `-o pmi=off` neither).
        let pmi_opt = self.input.option_str("pmi");
        let choice = match pmix::PmiChoice::parse(pmi_opt.as_deref()) {
            Ok(c) => c,
            Err(e) => return ShellReport::failed(e),
        };
        let use_pmi = choice.simple;
        // This node's global task ranks, in local order: a run of ranks (block), or those a task map lists.
        let ranks = self.input.task_ranks();
        let mut helper: Option<pmix::Helper> = None;
        if choice.pmix && !ranks.is_empty() {
            match self.start_pmix(&ranks).await {
                Ok(h) => helper = Some(h),
                // Asked for by name: the job cannot run as asked. By default: said, and the job runs on PMI-1.
                Err(e) if pmi_opt.is_some() => return ShellReport::failed(format!("PMIx: {e}")),
                Err(e) if e.contains("is not installed") => {}
                Err(e) => {
                    let _ = out_tx.try_send(OutputLine::text(
                        self.input.first_task,
                        "stderr",
                        format!("vigil-shell: PMIx not served on rank {}: {e}", self.input.broker_rank),
                    ));
                }
            }
        }
        let mut pmi_srv = pmi::PmiServer::new(
            format!("vigil-{}", self.input.id_f58),
            self.input.ntasks,
            ranks.iter().copied(),
            vigil_proto::pmi::process_mapping(&self.input.taskmap),
        );
        let (pmi_tx, mut pmi_rx) = mpsc::unbounded_channel::<(u32, Option<Vec<u8>>)>();
        let (exit_tx, mut exit_rx) = mpsc::unbounded_channel::<(u32, i32)>();
        // Early exit reports from the exit detector (eBPF: at the kernel's exit tracepoint): rank, report.
        let (early_tx, mut early_rx) = mpsc::unbounded_channel::<(u32, serde_json::Value)>();
        let exit_on_error = self.input.options.get("exit-on-error").is_some_and(|v| match v {
            serde_json::Value::Bool(b) => *b,
            serde_json::Value::String(s) => !matches!(s.as_str(), "0" | "false" | "no" | "off"),
            _ => true,
        });
        // Tasks whose PMI connection was already judged closed, and tasks that already failed the job.
        let mut pmi_closed: std::collections::HashSet<u32> = std::collections::HashSet::new();
        let mut exit_failed: std::collections::HashSet<u32> = std::collections::HashSet::new();
        // Tasks whose OOM kill was reported (once each), and the OOM kills of this shell's cgroup accounted for.
        let mut oom_reported: std::collections::HashSet<u32> = std::collections::HashSet::new();
        let memory_events = own_memory_events();
        let mut oom_seen = memory_events.as_deref().and_then(oom_kills).unwrap_or(0);
        let mut tasks: Vec<(u32, i32)> = Vec::new();
        let Started { pids, readers, stdins, pmi_writers } = self.start_tasks(
            &ranks,
            helper.as_ref(),
            use_pmi,
            &out_tx,
            TaskReports { pmi: &pmi_tx, exit: &exit_tx, early: &early_tx },
        );
        drop(exit_tx);
        self.forward_stdin(stdins);

        // A task gets SIGTERM from its shell once: when this shell already sent it (its job failed here), the
        // exec system's SIGTERM for the same failure, which follows, is not passed on a second time (a task
        // that takes a second SIGTERM as "quit now" would skip its clean-up). SIGKILL follows at the kill timeout.
        let mut termed = false;
        let (sig_tx, mut sig_rx) = mpsc::unbounded_channel::<i32>();
        forward_signals(&sig_tx);

        // Lost-shell notices (node failures elsewhere in the job) arrive as events on `shell.<jobid>`.
        let _ = self.client.subscribe(&format!("shell.{}", self.input.id_f58)).await;
        let (barrier_tx, mut barrier_rx) = mpsc::unbounded_channel::<Result<BTreeMap<String, String>, String>>();
        // PMIx fences in flight through the same barrier: the fence's number, and every shell's puts.
        let (fence_tx, mut fence_rx) = mpsc::unbounded_channel::<(u64, Result<BTreeMap<String, String>, String>)>();
        let mut abort_code: Option<i32> = None;
        let mut broker_gone = false;
        let n = ranks.len();
        while tasks.len() < n {
            let mut outs = Vec::new();
            tokio::select! {
                ev = self.client.next_event(), if !broker_gone => {
                    let Some(ev) = ev else {
                        // Our broker is gone (killed, or its node is being torn down): nobody will collect these
                        // tasks' output or status, nor kill what is left of the job's process group after this
                        // shell, so do not leave them, or anything they started, running.
                        broker_gone = true;
                        for p in &pids {
                            // SAFETY: plain kill(2) on a child pid we spawned.
                            unsafe { libc::kill(*p, libc::SIGKILL) };
                        }
                        kill_own_group();
                        // And what left the group (`setsid`): the job's cgroup, this shell with it.
                        kill_own_job_cgroup();
                        continue;
                    };
                    let v = ev.json();
                    // The note speaks in the job's own terms (for a batch job, its instance's ranks): said as is,
                    // by the leader shell only; every shell passes the loss on to its PMIx clients.
                    if v.get("leader").and_then(|l| l.as_bool()) != Some(false) {
                        let note = v.get("note").and_then(|n| n.as_str()).unwrap_or("a node was lost; the job continues");
                        let _ = out_tx.try_send(OutputLine::text(self.input.first_task, "stderr", format!("vigil-shell: {note}")));
                    }
                    if let (Some(h), Some(lost)) = (&helper, pmix::LostNodes::from_notice(&v)) {
                        h.node_lost(&lost);
                    }
                }
                Some((rank, line)) = pmi_rx.recv() => {
                    outs = match line {
                        Some(l) => pmi_srv.handle(rank, &l),
                        None => pmi_srv.closed(rank),
                    };
                }
                Some(v) = async {
                    match helper.as_mut() {
                        Some(h) => h.rx.recv().await,
                        None => std::future::pending().await,
                    }
                } => match pmix::Event::decode(&v) {
                    Ok(pmix::Event::Fence { seq, data }) => {
                        if self.input.nshells <= 1 {
                            if let Some(h) = &helper {
                                h.fence_done(seq, vec![data]);
                            }
                        } else {
                            let c = self.client.clone();
                            let tx = fence_tx.clone();
                            let body = serde_json::json!({"id": id, "shell_rank": self.input.shell_rank,
                                "kvs": pmix::fence_kvs(self.input.shell_rank, &data)});
                            tokio::spawn(async move {
                                let r = c.rpc("job-exec.pmi-barrier", 0, &body).await.map_err(|e| e.errstr).and_then(|v| {
                                    serde_json::from_value::<BTreeMap<String, String>>(v.get("kvs").cloned().unwrap_or_default())
                                        .map_err(|e| e.to_string())
                                });
                                let _ = tx.send((seq, r));
                            });
                        }
                    }
                    Ok(pmix::Event::Abort { rank, status, msg }) => {
                        let msg = if msg.is_empty() { String::new() } else { format!(": {msg}") };
                        outs.push(pmi::Out::Fatal { note: format!("task {rank}: MPI_Abort / PMIx_Abort with exit code {status}{msg}"), exit_code: Some(status) });
                    }
                    Ok(pmix::Event::Other) => {}
                    Err(e) => outs.push(pmi::Out::Fatal { note: format!("vigil-pmix: {e}"), exit_code: None }),
                },
                Some((seq, r)) = fence_rx.recv() => {
                    let blobs = r.and_then(|all| pmix::fence_blobs(&all, self.input.nshells));
                    match (blobs, &helper) {
                        (Ok(b), Some(h)) => h.fence_done(seq, b),
                        (Err(e), h) => {
                            if let Some(h) = h {
                                h.fence_failed(seq, &e);
                            }
                            outs.push(pmi::Out::Fatal { note: format!("PMIx fence failed: {e}"), exit_code: None });
                        }
                        (Ok(_), None) => {}
                    }
                }
                Some(r) = barrier_rx.recv() => match r {
                    Ok(all) => outs = pmi_srv.barrier_done(all),
                    Err(e) => outs.push(pmi::Out::Fatal { note: format!("PMI barrier failed: {e}"), exit_code: None }),
                },
                Some((rank, v)) = early_rx.recv() => {
                    // The task is dead (its memory may still be being freed): act on it now; its status is
                    // recorded when it is reaped. A report without a status (userspace detector watching a
                    // process that is not its child) only closes PMI; exit-on-error then waits for the reap.
                    let code = v.get("exit_code").and_then(|c| c.as_i64());
                    let signal = v.get("signal").and_then(|c| c.as_i64());
                    if use_pmi && pmi_closed.insert(rank) {
                        outs.extend(pmi_srv.closed(rank));
                    }
                    let failed = signal.is_some() || code.is_some_and(|c| c != 0);
                    if v.get("oom_killed").and_then(|o| o.as_bool()) == Some(true) && oom_reported.insert(rank) {
                        // (Counted, so that memory.events does not name another task for the same kill.)
                        oom_seen += 1;
                        self.report_oom(id, rank);
                    }
                    // Once the job has failed, the tasks this shell then kills are not failures of their own.
                    if exit_on_error && failed && abort_code.is_none() && !any_fatal(&outs) && exit_failed.insert(rank) {
                        outs.push(pmi::Out::Fatal { note: task_failure_note(rank, code, signal, &v), exit_code: Some(task_code(code, signal)) });
                    }
                }
                e = exit_rx.recv() => match e {
                    Some((rank, st)) => {
                        tasks.push((rank, st));
                        // Killed, and the OOM killer killed in this job's cgroup since last seen: that was it
                        // (how it is known without the eBPF exit detector).
                        if st & 0x7f == libc::SIGKILL && !oom_reported.contains(&rank) {
                            if let Some(n) = memory_events.as_deref().and_then(oom_kills) {
                                if n > oom_seen {
                                    oom_seen += 1;
                                    oom_reported.insert(rank);
                                    self.report_oom(id, rank);
                                }
                            }
                        }
                        // A task that exits without PMI_Finalize fails the job even if something it started
                        // still holds its PMI socket open.
                        if use_pmi && pmi_closed.insert(rank) {
                            outs.extend(pmi_srv.closed(rank));
                        }
                        if exit_on_error && vigil_proto::shellproto::exit_code(st) != 0 && abort_code.is_none() && !any_fatal(&outs) && exit_failed.insert(rank) {
                            let (code, signal) = if st & 0x7f != 0 { (None, Some((st & 0x7f) as i64)) } else { (Some(((st >> 8) & 0xff) as i64), None) };
                            outs.push(pmi::Out::Fatal { note: task_failure_note(rank, code, signal, &serde_json::Value::Null), exit_code: Some(task_code(code, signal)) });
                        }
                        let _ = self.client.send(TOPIC_TASK_EXIT, 0, &serde_json::json!({"id": id, "rank": rank, "status": st}));
                    }
                    None => break,
                },
                Some(sig) = sig_rx.recv() => {
                    if sig == libc::SIGTERM && std::mem::replace(&mut termed, true) {
                        continue;
                    }
                    if signal_own_group(sig) == 0 {
                        for p in &pids {
                            // SAFETY: plain kill(2) on a child pid we spawned.
                            unsafe { libc::kill(*p, sig) };
                        }
                    }
                }
            }
            for o in outs {
                match o {
                    pmi::Out::Reply(rank, line) => {
                        if let Some(w) = pmi_writers.get(&rank) {
                            let _ = w.send(line.encode());
                        }
                    }
                    pmi::Out::Barrier(puts) => {
                        if self.input.nshells <= 1 {
                            let _ = barrier_tx.send(Ok(puts));
                        } else {
                            let c = self.client.clone();
                            let tx = barrier_tx.clone();
                            let body = serde_json::json!({"id": id, "shell_rank": self.input.shell_rank, "kvs": puts});
                            tokio::spawn(async move {
                                let r =
                                    c.rpc("job-exec.pmi-barrier", 0, &body).await.map_err(|e| e.errstr).and_then(|v| {
                                        serde_json::from_value::<BTreeMap<String, String>>(
                                            v.get("kvs").cloned().unwrap_or_default(),
                                        )
                                        .map_err(|e| e.to_string())
                                    });
                                let _ = tx.send(r);
                            });
                        }
                    }
                    pmi::Out::Fatal { note, exit_code } => {
                        // The first failure's code is the job's (MPI_Abort's, or the task's under exit-on-error).
                        if abort_code.is_none() {
                            abort_code = exit_code;
                        }
                        let _ = self.client.send(
                            vigil_proto::shellproto::TOPIC_EXCEPTION,
                            0,
                            &serde_json::json!({"id": id, "type": "exec", "severity": 0, "note": note,
                                "rank": self.input.broker_rank}),
                        );
                        if !std::mem::replace(&mut termed, true) && signal_own_group(libc::SIGTERM) == 0 {
                            for p in &pids {
                                // SAFETY: plain kill(2) on a child pid we spawned.
                                unsafe { libc::kill(*p, libc::SIGTERM) };
                            }
                        }
                    }
                }
            }
        }
        self.end(readers, out_tx, fwd, tasks, abort_code, broker_gone).await
    }

    /// The output forwarder: takes the tasks' lines from `out_rx` in batches, writes those of a stream with an output
    /// file (`out_file`, `err_file`: the job's `--output`, `--error`) there, and sends the rest to rank 0
    /// (`job-exec.output`) without waiting, at most [`OUTPUT_WINDOW`] batches in flight. Ends when `out_rx` does.
    fn spawn_forwarder(
        &self,
        mut out_rx: mpsc::Receiver<OutputLine>,
        mut out_file: Option<std::fs::File>,
        mut err_file: Option<std::fs::File>,
    ) -> tokio::task::JoinHandle<()> {
        let id = self.input.id;
        let client = self.client.clone();
        let broker_rank = self.input.broker_rank;
        tokio::spawn(async move {
            let mut inflight: std::collections::VecDeque<tokio::task::JoinHandle<()>> =
                std::collections::VecDeque::new();
            // Batches are numbered, so that rank 0 takes one that is sent again (see `send_output`) once, in order.
            let mut seq: u64 = 0;
            while let Some(first) = out_rx.recv().await {
                let mut batch = vec![first];
                while batch.len() < BATCH_LINES {
                    match out_rx.try_recv() {
                        Ok(l) => batch.push(l),
                        Err(_) => break,
                    }
                }
                let mut rest = Vec::new();
                for l in batch {
                    use std::io::Write as _;
                    let f =
                        if l.stream == "stderr" { err_file.as_mut().or(out_file.as_mut()) } else { out_file.as_mut() };
                    match f {
                        Some(f) => {
                            let _ = f.write_all(&l.bytes());
                        }
                        None => rest.push(l),
                    }
                }
                if rest.is_empty() {
                    continue;
                }
                // At most OUTPUT_WINDOW batches in flight: rank 0's acknowledgements pace the shell.
                if inflight.len() >= OUTPUT_WINDOW {
                    if let Some(h) = inflight.pop_front() {
                        let _ = h.await;
                    }
                }
                let c = client.clone();
                let body = serde_json::json!({"id": id, "lines": rest, "broker_rank": broker_rank, "seq": seq});
                seq += 1;
                inflight.push_back(tokio::spawn(async move {
                    let _ = send_output(&c, &body).await;
                }));
            }
            for h in inflight {
                let _ = h.await;
            }
        })
    }

    /// Start this node's tasks (`ranks`: their global task ranks, in local order), each without a fork, bound to
    /// its CPUs, with its environment, PMI-1 socket and PMIx variables (`helper`); their output goes to `out_tx`,
    /// their PMI lines, exits and early exit reports (the node's exit detector) to `to`. A task that cannot be
    /// started is said on its stderr and exits 127 (not found) or 126.
    fn start_tasks(
        &self,
        ranks: &[u32],
        helper: Option<&pmix::Helper>,
        use_pmi: bool,
        out_tx: &mpsc::Sender<OutputLine>,
        to: TaskReports<'_>,
    ) -> Started {
        let detector_rank: Option<u32> =
            std::env::var(vigil_proto::shellproto::DETECTOR_RANK_ENV).ok().and_then(|r| r.parse().ok());
        let mut pmi_writers: BTreeMap<u32, mpsc::UnboundedSender<String>> = BTreeMap::new();
        let mut pids = Vec::new();
        let mut readers = Vec::new();
        let mut stdins: Vec<mpsc::UnboundedSender<Option<Vec<u8>>>> = Vec::new();
        for (local, &rank) in ranks.iter().enumerate() {
            let local = local as u32;
            let Some(prog) = self.input.command.first() else { break };
            let mut env = self.task_env(local, rank);
            if let Some(h) = &helper {
                h.add_env(rank, &mut env);
            }
            // Spawned without a fork (posix_spawn: the kernel copies none of this shell's page tables), which
            // std does only for a program named by its path, with no code run between fork and exec: so the
            // program is looked up in the task's PATH here, the PMI socket is inherited without CLOEXEC, and the
            // task's CPU binding is inherited from the spawning thread.
            let resolved = resolve_program(prog, env.get("PATH").map(String::as_str), self.input.cwd.as_deref());
            let mut cmd = std::process::Command::new(resolved.as_deref().unwrap_or(std::path::Path::new(prog)));
            cmd.arg0(prog)
                .args(&self.input.command[1..])
                .env_clear()
                .envs(env)
                .stdin(if self.input.stdin { Stdio::piped() } else { Stdio::null() })
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            let mut pmi_parent: Option<std::os::unix::net::UnixStream> = None;
            let mut pmi_child: Option<OwnedFd> = None;
            if use_pmi {
                match std::os::unix::net::UnixStream::pair() {
                    Ok((a, b)) => {
                        let fd = b.as_raw_fd();
                        cmd.env("PMI_FD", fd.to_string())
                            .env("PMI_RANK", rank.to_string())
                            .env("PMI_SIZE", self.input.ntasks.to_string());
                        // The task inherits its own end of the socketpair: close-on-exec is cleared on it only
                        // for this spawn (this single-threaded shell spawns nothing else meanwhile, and closes
                        // that end just after); every other descriptor stays close-on-exec.
                        // SAFETY: fcntl on a descriptor we own.
                        if unsafe { libc::fcntl(fd, libc::F_SETFD, 0) } < 0 {
                            let _ = out_tx.try_send(OutputLine::text(
                                rank,
                                "stderr",
                                format!(
                                    "vigil-shell: cannot pass the PMI socket to task {rank}: {}",
                                    std::io::Error::last_os_error()
                                ),
                            ));
                        }
                        pmi_parent = Some(a);
                        pmi_child = Some(b.into());
                    }
                    Err(e) => {
                        let _ = out_tx.try_send(OutputLine::text(
                            rank,
                            "stderr",
                            format!("vigil-shell: cannot create PMI socket for task {rank}: {e}"),
                        ));
                    }
                }
            }
            if let Some(cwd) = &self.input.cwd {
                cmd.current_dir(cwd);
            }
            let mut mask = None;
            if self.bind {
                if let Some(cpus) = self.placement.get(local as usize).and_then(|p| p.cpus.clone()) {
                    match CpuMask::new(&cpus) {
                        Ok(m) => mask = Some(m),
                        Err(e) => {
                            let _ = out_tx.try_send(OutputLine::text(
                                rank,
                                "stderr",
                                format!("vigil-shell: cannot bind task {rank}: {e}"),
                            ));
                        }
                    }
                }
            }
            let mut cmd = tokio::process::Command::from(cmd);
            // The task is bound as it is created: this thread holds the task's CPUs over the spawn.
            let spawned = match mask.as_ref().map(BoundThread::bind).transpose() {
                Ok(bound) => {
                    let r = cmd.spawn();
                    drop(bound);
                    r
                }
                Err(e) => Err(e),
            };
            drop(pmi_child);
            if let (Ok(_), Some(p)) = (&spawned, pmi_parent) {
                if p.set_nonblocking(true).is_ok() {
                    if let Ok(p) = tokio::net::UnixStream::from_std(p) {
                        pmi_writers.insert(rank, pmi_conn(p, rank, to.pmi.clone()));
                    }
                }
            }
            match spawned {
                Ok(mut child) => {
                    if let Some(pid) = child.id() {
                        pids.push(pid as i32);
                        // Be told of the task's death by the node's exit detector, before its memory is freed.
                        if let Some(dr) = detector_rank {
                            let c = self.client.clone();
                            let tx = to.early.clone();
                            tokio::spawn(async move {
                                if let Ok(v) = c
                                    .rpc(
                                        vigil_proto::shellproto::TOPIC_DETECT_WATCH,
                                        dr,
                                        &serde_json::json!({"pid": pid}),
                                    )
                                    .await
                                {
                                    let _ = tx.send((rank, v));
                                }
                            });
                        }
                    }
                    if let Some(si) = child.stdin.take() {
                        stdins.push(stdin_writer(si));
                    }
                    if let Some(o) = child.stdout.take() {
                        readers.push(tokio::spawn(forward(o, rank, "stdout", out_tx.clone())));
                    }
                    if let Some(e) = child.stderr.take() {
                        readers.push(tokio::spawn(forward(e, rank, "stderr", out_tx.clone())));
                    }
                    let etx = to.exit.clone();
                    tokio::spawn(async move {
                        let st = child.wait().await.map(|s| s.into_raw()).unwrap_or(status_exited(1));
                        let _ = etx.send((rank, st));
                    });
                }
                Err(e) => {
                    let code = if e.kind() == std::io::ErrorKind::NotFound { 127 } else { 126 };
                    let _ = out_tx.try_send(OutputLine::text(
                        rank,
                        "stderr",
                        format!("vigil-shell: task {rank}: cannot execute '{prog}': {e}"),
                    ));
                    let _ = to.exit.send((rank, status_exited(code)));
                }
            }
        }
        Started { pids, readers, stdins, pmi_writers }
    }

    /// The job's standard input (from `vigil run`), broadcast to every task; EOF closes their stdin. A job
    /// without any reads /dev/null, and rank 0 is not asked.
    fn forward_stdin(&self, stdins: Vec<mpsc::UnboundedSender<Option<Vec<u8>>>>) {
        let id = self.input.id;
        if self.input.stdin {
            let c = self.client.clone();
            tokio::spawn(async move {
                use base64::Engine as _;
                if let Ok(mut s) = c.rpc_stream("job-info.stdin", 0, &serde_json::json!({"id": id})) {
                    while let Some(Ok(v)) = s.next().await {
                        let Some(d) = v.get("data").and_then(|d| d.as_str()) else { continue };
                        let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(d) else { continue };
                        for w in &stdins {
                            let _ = w.send(Some(bytes.clone()));
                        }
                    }
                }
                for w in &stdins {
                    let _ = w.send(None);
                }
            });
        }
    }

    /// End, once every task has exited: give the output pipes a moment to drain (`readers`), end the forwarder
    /// (`out_tx`, `fwd`) and flush it to rank 0, remove the tmpdirs, and make the report (`tasks`: rank and wait
    /// status of each; `abort_code`: the first failure's code). If the broker is gone, what the tasks started since
    /// is killed.
    async fn end(
        &mut self,
        readers: Vec<tokio::task::JoinHandle<()>>,
        out_tx: mpsc::Sender<OutputLine>,
        fwd: tokio::task::JoinHandle<()>,
        mut tasks: Vec<(u32, i32)>,
        abort_code: Option<i32>,
        broker_gone: bool,
    ) -> ShellReport {
        let id = self.input.id;
        // Every task has exited (the time is reported: the shell itself may end much later, below).
        let ended = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).ok().map(|d| d.as_secs_f64());
        // A process the tasks left in the background may still hold their stdout open.
        // Give the pipes a moment to drain, then stop reading (the broker kills what is left of the job's
        // process group once this shell exits).
        let drain_until = tokio::time::Instant::now() + Duration::from_secs(1);
        for r in readers {
            let abort = r.abort_handle();
            if tokio::time::timeout_at(drain_until, r).await.is_err() {
                abort.abort();
            }
        }
        drop(out_tx);
        let _ = fwd.await;
        // Flush: an acknowledged request on the same path guarantees every line before it reached rank 0; it also
        // tells rank 0 that nothing more is in flight (it releases what it held back waiting for a batch sent again).
        let _ = tokio::time::timeout(
            Duration::from_secs(30),
            send_output(
                &self.client,
                &serde_json::json!({"id": id, "lines": [], "broker_rank": self.input.broker_rank, "flush": true}),
            ),
        )
        .await;
        let _ = NODEID_ANY;
        tasks.sort_unstable();
        let status = tasks.iter().map(|t| t.1).max_by_key(|s| vigil_proto::shellproto::exit_code(*s)).unwrap_or(0);
        if let Some((a, true)) = self.alloc_tmpdir.take() {
            let _ = std::fs::remove_dir_all(a);
        }
        if let Some(t) = self.tmpdir.take() {
            self.remove_tmpdir(&t);
        }
        if broker_gone {
            kill_own_group(); // what the tasks started since
        }
        ShellReport { status, tasks, error: None, abort_code, usage: None, ended }
    }
}

/// What [`Shell::start_tasks`] leaves to serve: the tasks' pids, their output readers, their stdin writers (for
/// [`Shell::forward_stdin`]) and their PMI-1 connections by task rank.
struct Started {
    pids: Vec<i32>,
    readers: Vec<tokio::task::JoinHandle<()>>,
    stdins: Vec<mpsc::UnboundedSender<Option<Vec<u8>>>>,
    pmi_writers: BTreeMap<u32, mpsc::UnboundedSender<String>>,
}

/// Where the tasks [`Shell::start_tasks`] starts report to the serve loop of [`Shell::run`]: PMI-1 lines (`None`:
/// the connection closed), wait statuses, and early exit reports of the node's exit detector, each by task rank.
struct TaskReports<'a> {
    pmi: &'a mpsc::UnboundedSender<(u32, Option<Vec<u8>>)>,
    exit: &'a mpsc::UnboundedSender<(u32, i32)>,
    early: &'a mpsc::UnboundedSender<(u32, serde_json::Value)>,
}

/// Pass the signals the broker sends this shell for its tasks ([`vigil_proto::shellproto::SHELL_FORWARDED_SIGNALS`])
/// to `sig_tx`, by number.
fn forward_signals(sig_tx: &mpsc::UnboundedSender<i32>) {
    let mut sigs = Vec::new();
    for name in vigil_proto::shellproto::SHELL_FORWARDED_SIGNALS {
        let Ok(sig) = name.parse::<nix::sys::signal::Signal>() else { continue };
        let k = tokio::signal::unix::SignalKind::from_raw(sig as i32);
        if let Ok(s) = tokio::signal::unix::signal(k) {
            sigs.push((k.as_raw_value(), s));
        }
    }
    for (num, mut s) in sigs {
        let tx = sig_tx.clone();
        tokio::spawn(async move {
            while s.recv().await.is_some() {
                let _ = tx.send(num);
            }
        });
    }
}

/// SIGKILL to every process of this shell's process group but the shell itself ([`signal_own_group`]).
fn kill_own_group() -> usize {
    signal_own_group(libc::SIGKILL)
}

/// Signal `sig` to every process of this shell's process group but the shell itself: the job's tasks and whatever
/// they started without leaving the group (the broker started the shell as the leader of a group of its own), so
/// that each gets one copy (the broker signals the shell alone for the signals it passes on,
/// [`vigil_proto::shellproto::SHELL_FORWARDED_SIGNALS`]). Found through `/proc/PID/stat` (its fifth field is the
/// process group); returns how many were signalled: 0 when this shell does not lead a group of its own (started
/// by hand), and the caller then signals its tasks one by one.
fn signal_own_group(sig: i32) -> usize {
    // SAFETY: getpgrp and getpid have no preconditions and cannot fail.
    let (pgrp, me) = unsafe { (libc::getpgrp(), libc::getpid()) };
    if pgrp != me {
        return 0; // not the leader of a group of our own (started by hand?): the group is not the job's
    }
    let Ok(dir) = std::fs::read_dir("/proc") else { return 0 };
    let mut n = 0;
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else { continue };
        if pid == me {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else { continue };
        // "PID (COMM) STATE PPID PGRP ...": COMM may hold spaces and parentheses, so split after the last ')'.
        let group = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(2)?.parse::<i32>().ok());
        if group == Some(pgrp) {
            // SAFETY: plain kill(2) on a process of our own process group.
            if unsafe { libc::kill(pid, sig) } == 0 {
                n += 1;
            }
        }
    }
    n
}

/// True if `outs` already fails the job.
fn any_fatal(outs: &[pmi::Out]) -> bool {
    outs.iter().any(|o| matches!(o, pmi::Out::Fatal { .. }))
}

/// Shell-style exit code of a task: its exit code, or 128 + the signal that killed it.
fn task_code(code: Option<i64>, signal: Option<i64>) -> i32 {
    match (signal, code) {
        (Some(s), _) => 128 + s as i32,
        (None, Some(c)) => c as i32,
        (None, None) => 1,
    }
}

/// Exception note for a task that failed under `-o exit-on-error` (exit code or signal, OOM, who sent it).
fn task_failure_note(rank: u32, code: Option<i64>, signal: Option<i64>, report: &serde_json::Value) -> String {
    let how = match (signal, code) {
        (Some(s), _) => format!("was killed by signal {s}"),
        (None, Some(c)) => format!("exited with code {c}"),
        (None, None) => "exited".to_string(),
    };
    let oom = if report.get("oom_killed").and_then(|o| o.as_bool()) == Some(true) { " (OOM killer)" } else { "" };
    format!("task {rank} {how}{oom} (exit-on-error)")
}

/// Placement without hwloc: core id `i` is the `i`-th CPU this shell may run on; tasks get consecutive blocks
/// of `cores_per_task` of the allocated cores (shared round-robin if there are too few).
fn cpu_count_placement(input: &ShellInput, cpu: CpuAffinity, gpu: GpuAffinity) -> Vec<TaskPlacement> {
    let allowed = bind::current_affinity().unwrap_or_default();
    let cpu_of = |core: u32| -> u32 {
        if allowed.is_empty() {
            core
        } else {
            allowed[core as usize % allowed.len()]
        }
    };
    let c = input.cores_per_task.max(1) as usize;
    let cores = &input.cores;
    (0..input.local_tasks as usize)
        .map(|i| {
            let mine: Vec<u32> =
                if cores.is_empty() { vec![] } else { (0..c).map(|k| cores[(i * c + k) % cores.len()]).collect() };
            let (task_cores, cpus) = match cpu {
                CpuAffinity::Off => (cores.clone(), None),
                CpuAffinity::On => (cores.clone(), Some(cores.iter().map(|&x| cpu_of(x)).collect())),
                CpuAffinity::PerTask => (mine.clone(), Some(mine.iter().map(|&x| cpu_of(x)).collect())),
            };
            let g = input.gpus_per_task as usize;
            let gpus = match gpu {
                GpuAffinity::Off => None,
                GpuAffinity::On => Some(input.gpus.clone()),
                GpuAffinity::PerTask => Some(input.gpus.iter().skip(i * g).take(g).copied().collect()),
            };
            TaskPlacement { cpus, cores: task_cores, numa: vec![0], gpus }
        })
        .collect()
}

/// Feed a task's stdin from a queue; `None` (or a closed queue) closes it. A task that does not read only
/// costs the queued bytes.
fn stdin_writer(mut si: tokio::process::ChildStdin) -> mpsc::UnboundedSender<Option<Vec<u8>>> {
    use tokio::io::AsyncWriteExt;
    let (tx, mut rx) = mpsc::unbounded_channel::<Option<Vec<u8>>>();
    tokio::spawn(async move {
        while let Some(Some(b)) = rx.recv().await {
            if si.write_all(&b).await.is_err() {
                break;
            }
        }
        drop(si);
    });
    tx
}

/// Serve one task's PMI socket: lines in go to `tx` as `(rank, Some(line))`, then `(rank, None)` at EOF;
/// returns a sender for reply lines.
fn pmi_conn(
    s: tokio::net::UnixStream,
    rank: u32,
    tx: mpsc::UnboundedSender<(u32, Option<Vec<u8>>)>,
) -> mpsc::UnboundedSender<String> {
    use tokio::io::AsyncWriteExt;
    let (rd, mut wr) = s.into_split();
    let (wtx, mut wrx) = mpsc::unbounded_channel::<String>();
    tokio::spawn(async move {
        while let Some(l) = wrx.recv().await {
            if wr.write_all(l.as_bytes()).await.is_err() {
                break;
            }
        }
    });
    tokio::spawn(async move {
        let mut rd = BufReader::new(rd);
        loop {
            let mut buf = Vec::new();
            // Read at most one byte more than the limit, so an over-long line is seen as such.
            match (&mut rd).take(vigil_proto::pmi::MAX_LINE as u64 + 1).read_until(b'\n', &mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    if tx.send((rank, Some(buf))).is_err() {
                        return;
                    }
                }
            }
        }
        let _ = tx.send((rank, None));
    });
    wtx
}

/// Send one `job-exec.output` batch to rank 0 and wait for its acknowledgement. A batch lost in flight with a
/// router (EHOSTUNREACH) is sent again, at most [`OUTPUT_RESENDS`] times; by its `broker_rank` and `seq`, rank 0
/// puts it back in order and takes it once (if it had arrived before the router died, with only its
/// acknowledgement lost).
async fn send_output(c: &Client, body: &serde_json::Value) -> Result<serde_json::Value, vigil_client::RpcError> {
    let mut r = c.rpc(TOPIC_OUTPUT, 0, body).await;
    for _ in 0..OUTPUT_RESENDS {
        match &r {
            Err(e) if e.errnum == vigil_proto::message::errno::EHOSTUNREACH => r = c.rpc(TOPIC_OUTPUT, 0, body).await,
            _ => break,
        }
    }
    r
}

/// Read `r` and forward it as output of task `rank`: one chunk per line (newline stripped, `eol` set), lines
/// longer than `MAX_LINE` bytes in several chunks, bytes exactly as written.
async fn forward<R: AsyncRead + Unpin>(r: R, rank: u32, stream: &'static str, tx: mpsc::Sender<OutputLine>) {
    let mut rd = BufReader::new(r);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        let n = match (&mut rd).take(MAX_LINE as u64).read_until(b'\n', &mut buf).await {
            Ok(n) => n,
            Err(_) => break,
        };
        if n == 0 {
            break;
        }
        let eol = buf.last() == Some(&b'\n');
        if eol {
            buf.pop();
        }
        if tx.send(OutputLine::from_bytes(rank, stream, &buf, eol)).await.is_err() {
            break;
        }
    }
}

use tokio::io::AsyncReadExt as _;

#[cfg(test)]
mod tests {
    use super::resolve_program;
    use std::os::unix::fs::PermissionsExt;

    /// A scratch directory, removed when dropped.
    struct Dir(std::path::PathBuf);

    impl Dir {
        fn path(&self) -> &std::path::Path {
            &self.0
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn programs_are_found_in_the_tasks_path_as_execvp_would() {
        let root = std::env::temp_dir().join(format!("vigil-shell-resolve-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let d = Dir(root);
        let (bin, other) = (d.path().join("bin"), d.path().join("other"));
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::create_dir_all(&other).unwrap();
        let write = |p: &std::path::Path, mode: u32| {
            std::fs::write(p, "#!/bin/sh\n").unwrap();
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        write(&other.join("prog"), 0o644); // not executable: skipped
        write(&bin.join("prog"), 0o755);
        std::fs::create_dir_all(d.path().join("dir/prog")).unwrap(); // a directory: skipped
        let path = format!("{}:{}:{}", d.path().join("dir").display(), other.display(), bin.display());
        assert_eq!(resolve_program("prog", Some(&path), None), Some(bin.join("prog")));
        // A script without `#!` is left to execvp, which runs it with /bin/sh.
        std::fs::write(bin.join("bare"), "true\n").unwrap();
        std::fs::set_permissions(bin.join("bare"), std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(resolve_program("bare", Some(bin.to_str().unwrap()), None), None);
        assert_eq!(resolve_program("sh", Some(&format!("{}:/bin", bin.display())), None), Some("/bin/sh".into()));
        // Relative entries are taken from the task's working directory, an empty one is that directory.
        let cwd = d.path().to_str().unwrap();
        assert_eq!(resolve_program("prog", Some("other:bin"), Some(cwd)), Some(d.path().join("bin/prog")));
        assert_eq!(resolve_program("prog", Some(":x"), Some(bin.to_str().unwrap())), Some(bin.join("./prog")));
        // A name with a slash is used as it is; a name found nowhere is left to the spawn's own error.
        assert_eq!(resolve_program("./prog", Some(bin.to_str().unwrap()), None), None);
        assert_eq!(resolve_program("nosuchprog", Some(bin.to_str().unwrap()), None), None);
        assert_eq!(resolve_program("", Some(bin.to_str().unwrap()), None), None);
    }
}
