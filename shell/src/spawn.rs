//! Task spawning: each of this node's tasks started without a fork, bound to its CPUs as it is created, with its
//! environment (`VIGIL_*`, PMI-1's socket, PMIx's variables), its output forwarded and its exit watched.

use crate::bind::{self, CpuMask};
use crate::output::{forward, stdin_writer};
use crate::{pmix, Shell};
use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::Stdio;
use tokio::io::{AsyncBufReadExt, AsyncReadExt as _, BufReader};
use tokio::sync::mpsc;
use vigil_proto::affinity::{format_cpulist, CpuAffinity, GpuAffinity};
use vigil_proto::shellproto::{status_exited, OutputLine, ShellInput, TaskPlacement, ALLOC_TMPDIR_ENV};

/// What [`Shell::start_tasks`] leaves to serve: the tasks' pids, their output readers, their stdin writers (for
/// [`Shell::forward_stdin`]) and their PMI-1 connections by task rank.
pub(crate) struct Started {
    pub(crate) pids: Vec<i32>,
    pub(crate) readers: Vec<tokio::task::JoinHandle<()>>,
    pub(crate) stdins: Vec<mpsc::UnboundedSender<Option<Vec<u8>>>>,
    pub(crate) pmi_writers: BTreeMap<u32, mpsc::UnboundedSender<String>>,
}

/// Where the tasks [`Shell::start_tasks`] starts report to the serve loop of [`Shell::run`]: PMI-1 lines (`None`:
/// the connection closed), wait statuses, and early exit reports of the node's exit detector, each by task rank.
pub(crate) struct TaskReports<'a> {
    pub(crate) pmi: &'a mpsc::UnboundedSender<(u32, Option<Vec<u8>>)>,
    pub(crate) exit: &'a mpsc::UnboundedSender<(u32, i32)>,
    pub(crate) early: &'a mpsc::UnboundedSender<(u32, serde_json::Value)>,
}

impl Shell {
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

    /// Start this node's tasks (`ranks`: their global task ranks, in local order), each without a fork, bound to
    /// its CPUs, with its environment, PMI-1 socket and PMIx variables (`helper`); their output goes to `out_tx`,
    /// their PMI lines, exits and early exit reports (the node's exit detector) to `to`. A task that cannot be
    /// started is said on its stderr and exits 127 (not found) or 126.
    pub(crate) fn start_tasks(
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
}

/// The job's nodes as one compressed host list (`node[1-3,7]`, RFC 29), from R's `execution.nodelist` (RFC 20:
/// host lists in rank order), as Slurm's `SLURM_JOB_NODELIST`; `None` when R has none or it does not parse.
fn job_nodelist(r: &serde_json::Value) -> Option<String> {
    let hosts = vigil_proto::r::Rv1::from_value(r).ok()?.hosts().ok()?;
    (!hosts.is_empty()).then(|| hosts.to_string())
}

/// Placement without hwloc: core id `i` is the `i`-th CPU this shell may run on; tasks get consecutive blocks
/// of `cores_per_task` of the allocated cores (shared round-robin if there are too few).
pub(crate) fn cpu_count_placement(input: &ShellInput, cpu: CpuAffinity, gpu: GpuAffinity) -> Vec<TaskPlacement> {
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
