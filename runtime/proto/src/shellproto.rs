//! What the exec system hands a job shell, and what the shell reports back.
//!
//! A broker starts `vigil-shell` with a [`ShellInput`] as JSON on its standard input. While running, the shell
//! sends requests over the local connector (topics below) to the exec system on rank 0; when its tasks are done it
//! writes one [`ShellReport`] as a JSON line to its standard output and exits. The broker reads that report and
//! forwards it with the shell's own wait status as `job-exec.shell-exit`, so a shell that crashes is noticed too.

use serde::{Deserialize, Serialize};

/// Topic for a batch of output lines (`{"id", "lines": [OutputLine], "broker_rank", "seq"}`: the shell's broker
/// rank and the batch's number, 0, 1, ..., by which rank 0 takes a batch sent again once and in order), each
/// answered (the shell keeps a window of them in flight), and once more, empty, with `"flush": true`, at the end.
pub const TOPIC_OUTPUT: &str = "job-exec.output";
/// Topic for a task's exit (`{"id", "rank", "status"}`), sent without response; starts the exit-timeout clock.
pub const TOPIC_TASK_EXIT: &str = "job-exec.task-exit";
/// Topic for an exception raised by a shell (`{"id", "type", "severity", "note"}`).
pub const TOPIC_EXCEPTION: &str = "job-exec.exception";
/// Topic the broker uses to report a shell's end (`ShellExit`).
pub const TOPIC_SHELL_EXIT: &str = "job-exec.shell-exit";

/// Environment variable telling a job shell which broker rank watches its tasks' exits (`detect.watch`).
pub const DETECTOR_RANK_ENV: &str = "VIGIL_DETECTOR_RANK";

/// Environment variable set by a broker on a job shell it created inside the job's cgroup (`clone3` with
/// `CLONE_INTO_CGROUP`): that cgroup's directory, so that the shell need not find it from `/proc/self/mountinfo`
/// and `/proc/self/cgroup` (about 3 % of the CPU time of a short job). Unset where the shell is moved in after it
/// started, or runs without a cgroup of its own.
pub const CGROUP_ENV: &str = "VIGIL_SHELL_CGROUP";

/// Environment variable set by a broker on a job shell whose `memory` option it could not apply on this node:
/// why. The shell says so on the job's stderr (the job runs, unlimited, as Slurm's does without its cgroup
/// plugin).
pub const MEMORY_NOTE_ENV: &str = "VIGIL_SHELL_MEMORY_NOTE";

/// The shell option `memory=SIZE` (per node, as Slurm's `--mem`): bytes. `SIZE` is a whole number with an optional
/// binary unit `K`, `M`, `G` or `T` (case-insensitive, an optional `B` or `iB` after it: `64M`, `1GiB`, `512k`);
/// without a unit it is MiB, as for Slurm's `--mem`.
///
/// Errors: not a number, an unknown unit, zero, or over 2^63 bytes, with the reason.
pub fn parse_memory_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(digits);
    let n: u64 = num.parse().map_err(|_| format!("'{s}' is not a size (expected e.g. 512M, 4G)"))?;
    let unit = unit.trim().to_ascii_lowercase();
    let shift = match unit.trim_end_matches("ib").trim_end_matches('b') {
        "" if unit.is_empty() => 20,
        "" => 0,
        "k" => 10,
        "m" => 20,
        "g" => 30,
        "t" => 40,
        _ => return Err(format!("'{s}': unknown unit (expected K, M, G or T)")),
    };
    let bytes = n.checked_shl(shift).filter(|b| b >> shift == n && *b <= 1 << 63);
    match bytes {
        Some(0) => Err(format!("'{s}': a memory limit must be more than 0")),
        Some(b) => Ok(b),
        None => Err(format!("'{s}' is too large")),
    }
}

/// Topic a job shell uses to be told, once, when one of its task processes exits: request `{"pid": N}`,
/// response `{"pid", "exit_code" | "signal", "oom_killed", "sender_pid", "ktime_ns", "source"}`.
pub const TOPIC_DETECT_WATCH: &str = "detect.watch";

/// Placement of one task (element `i` of the result is task rank `i` on
/// this node).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct TaskPlacement {
    /// OS indices of the PUs the task is bound to, ascending (every PU of
    /// every core in `cores`); `None` = not bound (cpu affinity off).
    pub cpus: Option<Vec<u32>>,
    /// Logical indices of the cores assigned to the task, ascending.
    pub cores: Vec<u32>,
    /// Logical indices of the NUMA nodes whose cpuset intersects the PUs of
    /// `cores`, ascending.
    pub numa: Vec<u32>,
    /// GPU ids the task should see (e.g. for `CUDA_VISIBLE_DEVICES`), in
    /// allocation order; `Some(vec![])` = hide all GPUs; `None` = no GPU
    /// affinity set.
    pub gpus: Option<Vec<u32>>,
}

/// Where a node's tasks run, as the broker that starts the shell computed it with hwloc from the node's topology
/// (the shell itself links no hwloc: loading it cost a short job's shell about a sixth of its CPU).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct ShellPlacement {
    /// One entry per local task, in task order; empty when the topology could not be loaded (tasks not bound).
    pub tasks: Vec<TaskPlacement>,
    /// Whether the shell binds the tasks to [`TaskPlacement::cpus`]: false with `cpu-affinity=off`, or with a
    /// topology that is not this machine's (`synthetic:`, `xml:`), whose placement is only exported.
    pub bind: bool,
    /// Lines the shell writes to the job's standard error (shell rank 0 only), e.g. that hwloc was unavailable.
    #[serde(default)]
    pub notes: Vec<String>,
    /// Why no placement could be made (a bad `cpu-affinity` value, too many tasks): the shell fails the job
    /// with it, as it reads.
    #[serde(default)]
    pub error: Option<String>,
}

/// Input of one job shell (one per allocated rank).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ShellInput {
    /// Job id (FLUID).
    pub id: u64,
    /// Job id in f58 form, for `VIGIL_JOB_ID`.
    pub id_f58: String,
    /// Index of this shell among the job's shells (0 = leader).
    pub shell_rank: u32,
    /// Broker rank the shell runs on.
    pub broker_rank: u32,
    /// Number of shells (= nodes) of the job.
    pub nshells: u32,
    /// Total tasks of the job.
    pub ntasks: u32,
    /// Global rank of this shell's first task.
    pub first_task: u32,
    /// Number of tasks this shell runs.
    pub local_tasks: u32,
    /// The global ranks of this shell's tasks, ascending, when they are not the run
    /// `first_task..first_task + local_tasks` (a cyclic, manual or hostfile task map, RFC 34). Absent (as from
    /// an older broker): that run. Use [`ShellInput::task_ranks`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tasks: Option<Vec<u32>>,
    /// Core ids (hwloc logical indices) allocated on this node.
    pub cores: Vec<u32>,
    /// GPU ids allocated on this node.
    pub gpus: Vec<u32>,
    /// Cores per task (jobspec slot size).
    pub cores_per_task: u32,
    /// GPUs per task.
    pub gpus_per_task: u32,
    /// The uid of the job's submitter (RFC 21's `userid` of its `submit` event): the shell runs as this user
    /// where the broker is not that user (a multi-user instance whose broker is root, docs/security.md). Absent
    /// (an older broker): the broker's own user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub userid: Option<u32>,
    /// Task command line.
    pub command: Vec<String>,
    /// Task environment (the submitter's, as edited by `--env`).
    pub environment: std::collections::BTreeMap<String, String>,
    /// Working directory of the tasks.
    pub cwd: Option<String>,
    /// Shell options (`-o name=value`), e.g. `cpu-affinity`, `gpu-affinity`.
    pub options: serde_json::Map<String, serde_json::Value>,
    /// RFC 34 task map, `{"version":1,"map":[[nodeid,nnodes,ppn,repeat],...]}`.
    pub taskmap: serde_json::Value,
    /// The job's whole R (RFC 20).
    pub r: serde_json::Value,
    /// Topology source of this node: `live`, `synthetic:<desc>` or `xml:<path>`.
    pub topology: String,
    /// Declared GPU count of this node, if any (`resource.gpus`).
    pub declared_gpus: Option<u32>,
    /// URI of the local broker.
    pub uri: String,
    /// The job's temporary directory on this node (`VIGIL_JOB_TMPDIR`), inside the broker's run directory so it
    /// is unique to this instance and removed with it; set by the broker that starts the shell.
    #[serde(default)]
    pub tmpdir: Option<String>,
    /// The allocation's directory on this node (`VIGIL_ALLOC_TMPDIR`), chosen by the broker that starts the
    /// shell with [`alloc_tmpdir`]. Absent (an older broker): the tasks get none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alloc_tmpdir: Option<AllocTmpdir>,
    /// Files to create in the job's temporary directory before the tasks start (`attributes.system.files` of
    /// the jobspec: name → `{"data": "...", "mode": 493}`); a batch script travels this way.
    #[serde(default)]
    pub files: serde_json::Map<String, serde_json::Value>,
    /// Whether the job may have standard input (`vigil run` streams its own): the shell then reads it from rank 0
    /// (`job-info.stdin`) and feeds it to every task. False when none was held and none can come (a job submitted
    /// without it, as `vigil submit` and `batch` jobs are): the tasks read /dev/null, and the shell asks rank 0
    /// nothing. Absent (an older broker): true.
    #[serde(default = "yes")]
    pub stdin: bool,
    /// The job's name (`attributes.system.job.name`, else its command's basename), for `{{name}}` in its output
    /// paths ([`output_path`]). Absent (an older broker): `{{name}}` is left as written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The tasks' placement on this node, filled in by the broker that starts the shell (not by rank 0, which
    /// does not know the node's topology). Absent for a `cpu-count` node, whose shell places tasks by CPU number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<ShellPlacement>,
    /// A guest's job in a multi-user instance: the submitter's munge credential and the jobspec's text it covers
    /// ([`ImpCredential`]), which a broker that is not root hands to `vigil-imp` to start the shell as the
    /// submitter, and which the shell then checks its input against ([`ShellInput::check_signed`]). Absent: none
    /// was sent (the instance owner's job, a root broker's instance, an older rank 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub imp: Option<ImpCredential>,
}

/// A submitter's munge credential and the exact jobspec text it covers (the `vigil-imp` crate's docs, "The
/// credential"): rank 0 keeps both with the job, unchanged by `vigil update`, and sends them with each shell's
/// input; rank 0 never decodes the credential (decoding consumes it, munge's replay cache).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImpCredential {
    /// munge's text (`MUNGE:...:`), as the client made it.
    pub credential: String,
    /// The jobspec's compact JSON text as submitted, whose SHA-256 the credential's payload names.
    pub jobspec: String,
}

/// The environment variable in which `vigil-imp` gives the job shell the SHA-256 (lowercase hex) of the jobspec
/// it checked the credential against.
pub const IMP_JOBSPEC_SHA_ENV: &str = "VIGIL_IMP_JOBSPEC_SHA256";

/// The templates an output path (`--output`, `--error`, the shell option `output`) may hold, as Flux writes them:
/// `{{id}}` (`{{id.f58}}`) the job id in f58, `{{id.dec}}` in decimal, `{{name}}` the job's name. (`{{cc}}`, the
/// copy's id of `--cc`, is filled in by `vigil` before it submits.)
pub const OUTPUT_TEMPLATES: [&str; 4] = ["id", "id.f58", "id.dec", "name"];

/// Output path `template` with its [`OUTPUT_TEMPLATES`] filled in for job `id` (`id_f58`) named `name`: a `/` in
/// the name becomes `_`, so that the file stays in the directory the path names. A template not known, or
/// `{{name}}` without a name, is left as written.
pub fn output_path(template: &str, id: u64, id_f58: &str, name: Option<&str>) -> String {
    let mut p = template.replace("{{id}}", id_f58).replace("{{id.f58}}", id_f58).replace("{{id.dec}}", &id.to_string());
    if let Some(n) = name {
        p = p.replace("{{name}}", &n.replace('/', "_"));
    }
    p
}

/// Signals a job shell catches and passes on to each of its tasks (by name, as `kill -l` spells them). The broker
/// sends these to the shell process alone, so that each task gets one copy: sent to the shell's process group,
/// which holds the tasks too, every task got the signal twice (once from the group, once passed on by its shell).
/// Other signals (SIGKILL, SIGSTOP, SIGCONT, ...) go to the whole group, which the shell does not relay.
pub const SHELL_FORWARDED_SIGNALS: [&str; 5] = ["SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1", "SIGUSR2"];

/// Environment variable naming a job's allocation directory on the task's node: node-local storage that every
/// job of a batch or alloc allocation sees, and that lasts until the allocation ends (the place for checkpoints).
pub const ALLOC_TMPDIR_ENV: &str = "VIGIL_ALLOC_TMPDIR";

/// Name of the allocation directory inside the job's own temporary directory, where the admin named no base
/// (`exec.alloc-tmpdir-base`).
pub const ALLOC_SUBDIR: &str = "alloc";

/// A job's allocation directory on one node (`VIGIL_ALLOC_TMPDIR`), and who owns it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocTmpdir {
    /// Its path.
    pub path: String,
    /// Whether this job's shell creates it (mode 0700) and removes it when the job ends: true for a job of an
    /// instance that runs in no allocation (the job is its own), false inside a batch or alloc job, whose
    /// directory belongs to the enclosing job's shell on the node.
    pub owned: bool,
}

/// Where job `id_f58`'s allocation directory is on the node of its shell `shell_rank`:
/// - `enclosing`: this instance runs as a batch or alloc job (the `alloc-tmpdir` attribute, from the
///   `VIGIL_ALLOC_TMPDIR` its brokers were started with): that directory, shared by every job of the instance
///   and not theirs to remove;
/// - else `base` (`exec.alloc-tmpdir-base`, set by the admin): `BASE/vigil-INSTANCE-ID.SHELL_RANK`, owned by
///   the job (the instance name, reduced to letters, digits, `-` and `_` and at most 16 of them, keeps two
///   instances of one node apart);
/// - else `ALLOC_SUBDIR` in the job's own temporary directory `job_tmpdir`, owned by the job.
///
/// A job of the system instance is thus its own allocation: its directory lives as long as it does. Pure: no
/// file is touched.
pub fn alloc_tmpdir(
    enclosing: Option<&str>,
    base: Option<&str>,
    job_tmpdir: &str,
    instance: &str,
    id_f58: &str,
    shell_rank: u32,
) -> AllocTmpdir {
    if let Some(p) = enclosing {
        return AllocTmpdir { path: p.to_string(), owned: false };
    }
    let path = match base {
        Some(b) => {
            let inst: String = instance
                .chars()
                .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' })
                .take(16)
                .collect();
            let inst = if inst.is_empty() { "vigil".to_string() } else { inst };
            std::path::Path::new(b).join(format!("vigil-{inst}-{id_f58}.{shell_rank}"))
        }
        None => std::path::Path::new(job_tmpdir).join(ALLOC_SUBDIR),
    };
    AllocTmpdir { path: path.display().to_string(), owned: true }
}

impl ShellInput {
    /// Value of shell option `name` (`-o name=value`) as a string: `-o cpu-affinity=on` gives `"on"`, a value
    /// that is not a string its JSON text; `None` when the option is not set.
    pub fn option_str(&self, name: &str) -> Option<String> {
        self.options.get(name).map(|v| match v {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        })
    }

    /// The global ranks of this shell's tasks, in local order (local task i is `task_ranks()[i]`): `tasks`, or
    /// the run from `first_task`.
    pub fn task_ranks(&self) -> Vec<u32> {
        match &self.tasks {
            Some(t) => t.clone(),
            None => (self.first_task..self.first_task.saturating_add(self.local_tasks)).collect(),
        }
    }

    /// Check the numbers a shell does arithmetic with: its tasks `first_task..first_task + local_tasks` lie within
    /// the job's `ntasks` (and `tasks`, when listed, has `local_tasks` ascending ranks below it), and
    /// `shell_rank` is below `nshells`. A broker checks this before it starts a shell
    /// with an input that came over the overlay.
    ///
    /// # Errors
    /// A message naming the inconsistent fields.
    pub fn check(&self) -> Result<(), String> {
        match self.first_task.checked_add(self.local_tasks) {
            Some(end) if end <= self.ntasks => {}
            _ => {
                return Err(format!(
                    "tasks {}+{} exceed the job's ntasks {}",
                    self.first_task, self.local_tasks, self.ntasks
                ))
            }
        }
        if let Some(t) = &self.tasks {
            if t.len() as u64 != u64::from(self.local_tasks) {
                return Err(format!("tasks lists {} ranks but local_tasks is {}", t.len(), self.local_tasks));
            }
            if t.windows(2).any(|w| w[0] >= w[1]) {
                return Err("tasks must be ascending, each once".into());
            }
            if let Some(last) = t.last().filter(|l| **l >= self.ntasks) {
                return Err(format!("task {last} is not below the job's ntasks {}", self.ntasks));
            }
        }
        if self.shell_rank >= self.nshells {
            return Err(format!("shell_rank {} is not below nshells {}", self.shell_rank, self.nshells));
        }
        Ok(())
    }

    /// Check that this input runs what its submitter signed: its command, environment, working directory,
    /// shell options and files are those of the jobspec in [`ShellInput::imp`] (the text `vigil-imp` checked the
    /// credential against; the shell compares its SHA-256 with [`IMP_JOBSPEC_SHA_ENV`] first). A broker, or
    /// anyone holding the overlay key, can then not run another command as the user under a good credential.
    ///
    /// # Errors
    /// No signed jobspec, one that does not parse or validate, or a field that differs: the message names it.
    pub fn check_signed(&self) -> Result<(), String> {
        let Some(imp) = &self.imp else {
            return Err("the input carries no signed jobspec (imp)".into());
        };
        let v: serde_json::Value =
            serde_json::from_str(&imp.jobspec).map_err(|e| format!("the signed jobspec is not JSON: {e}"))?;
        let req = crate::jobspec::Jobspec::from_value(&v)
            .and_then(|s| s.validate())
            .map_err(|e| format!("the signed jobspec is not valid: {e}"))?;
        let files = v.pointer("/attributes/system/files").and_then(serde_json::Value::as_object).cloned();
        let differs = |field: &str| Err(format!("its {field} is not the signed jobspec's"));
        if req.command != self.command {
            return differs("command");
        }
        if req.environment != self.environment {
            return differs("environment");
        }
        if req.cwd != self.cwd {
            return differs("working directory");
        }
        if req.shell_options != self.options {
            return differs("shell options");
        }
        if files.unwrap_or_default() != self.files {
            return differs("file list");
        }
        Ok(())
    }
}

/// Exit code of a broker that ends because it lost its way to rank 0: its parent was lost and it could not
/// re-parent (its parent was rank 0, `tbon.reparent=off`, or no adoptive parent took it). `EX_UNAVAILABLE` of
/// sysexits(3). The enclosing instance reads it from a nested broker's exit status: such a broker did not fail,
/// something above it did (see `jobs/nested.rs`). A broker that runs the initial program (rank 0) exits with the
/// program's code instead, so the code is unambiguous only for other ranks.
pub const BROKER_EXIT_CUT_OFF: i32 = 69;

/// Final report of a shell, one JSON line on its stdout.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ShellReport {
    /// Largest wait status of the shell's tasks (POSIX encoding: `code << 8` or the signal number).
    pub status: i32,
    /// Per-task wait statuses, by global task rank.
    pub tasks: Vec<(u32, i32)>,
    /// Set if the shell failed before or while launching tasks.
    pub error: Option<String>,
    /// Exit code a task asked for with PMI `abort` (MPI_Abort); it becomes the job's exit code.
    #[serde(default)]
    pub abort_code: Option<i32>,
    /// What the kernel accounted for the shell and everything it started, from its cgroup (added by the broker;
    /// absent without cgroup containment).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// When the shell's last task ended: wall-clock seconds since the Unix epoch, on the node's clock. The shell
    /// exits later, once its output is delivered (which waits for a rank 0 that restarts); its broker reports
    /// this time ([`ShellExit::ended`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended: Option<f64>,
}

impl ShellReport {
    /// The report of a shell that failed before launching any task: exit status 1 and why.
    pub fn failed(error: String) -> ShellReport {
        ShellReport { status: status_exited(1), error: Some(error), ..ShellReport::default() }
    }
}

/// Resource usage of one job shell's cgroup (cgroup v2 `cpu.stat` and `memory.peak`); each field where the kernel
/// gives it.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Usage {
    /// CPU time, user and system, in microseconds (`usage_usec`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_usec: Option<u64>,
    /// User CPU time, microseconds (`user_usec`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_user_usec: Option<u64>,
    /// System CPU time, microseconds (`system_usec`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_system_usec: Option<u64>,
    /// Peak memory, bytes (`memory.peak`: needs the memory controller, Linux 5.19).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_peak: Option<u64>,
    /// Processes the OOM killer killed in the job's cgroup (`oom_kill` of `memory.events`; needs the memory
    /// controller).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oom_kills: Option<u64>,
}

impl Usage {
    /// The usage of a job's shells together: CPU times summed, peak memory the largest (per node).
    pub fn add(&mut self, o: &Usage) {
        let sum = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
        };
        self.cpu_usec = sum(self.cpu_usec, o.cpu_usec);
        self.cpu_user_usec = sum(self.cpu_user_usec, o.cpu_user_usec);
        self.cpu_system_usec = sum(self.cpu_system_usec, o.cpu_system_usec);
        self.memory_peak = self.memory_peak.max(o.memory_peak);
        self.oom_kills = sum(self.oom_kills, o.oom_kills);
    }
}

/// A broker's report of a shell's end (`job-exec.shell-exit` payload).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ShellExit {
    /// Job id.
    pub id: u64,
    /// Broker rank of the shell.
    pub rank: u32,
    /// The shell's report, if it wrote one.
    pub report: Option<ShellReport>,
    /// Wait status of the shell process itself.
    pub shell_status: i32,
    /// When the shell's tasks ended, as its node saw it: wall-clock seconds since the Unix epoch, from the shell's
    /// report ([`ShellReport::ended`]), else the time its broker saw the shell exit. Rank 0 stamps the job's
    /// `finish` with it when the report waited for rank 0's restart (absent from older brokers: then the time the
    /// report came).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended: Option<f64>,
    /// Processes still in the shell's cgroup `exec.kill-timeout` after its broker killed the cgroup
    /// (`cgroup.kill`, when the shell ended): their pids, as the broker listed them then. Empty when the cgroup
    /// emptied, or where there is none. Rank 0 drains the node (`unkillable tasks of job ID`) and notes it in the
    /// job's eventlog (docs/failure-detection.md, "Unkillable tasks"). Absent from older brokers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unkillable: Vec<u32>,
}

/// One chunk of task output: a line, or part of one. Output is carried byte for byte: a chunk that is not
/// UTF-8 travels base64-encoded, and `eol` says whether a newline ended it (a line longer than the shell's
/// chunk size, or a last line without newline, has `eol: false`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct OutputLine {
    /// Global task rank.
    pub rank: u32,
    /// `stdout` or `stderr`.
    pub stream: String,
    /// The chunk without its trailing newline: UTF-8 text, or base64 when `enc` is `"base64"`.
    pub data: String,
    /// `"base64"` when `data` is base64-encoded bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enc: Option<String>,
    /// A newline ended this chunk.
    #[serde(default = "yes")]
    pub eol: bool,
}

fn yes() -> bool {
    true
}

impl OutputLine {
    /// A chunk from raw bytes (without the newline), UTF-8 text when possible, else base64.
    pub fn from_bytes(rank: u32, stream: &str, bytes: &[u8], eol: bool) -> OutputLine {
        use base64::Engine as _;
        match std::str::from_utf8(bytes) {
            Ok(t) => OutputLine { rank, stream: stream.into(), data: t.into(), enc: None, eol },
            Err(_) => OutputLine {
                rank,
                stream: stream.into(),
                data: base64::engine::general_purpose::STANDARD.encode(bytes),
                enc: Some("base64".into()),
                eol,
            },
        }
    }

    /// A complete text line (a message from the shell itself).
    pub fn text(rank: u32, stream: &str, text: String) -> OutputLine {
        OutputLine { rank, stream: stream.into(), data: text, enc: None, eol: true }
    }

    /// The chunk's bytes, newline included when `eol`.
    pub fn bytes(&self) -> Vec<u8> {
        use base64::Engine as _;
        let mut b = match self.enc.as_deref() {
            Some("base64") => base64::engine::general_purpose::STANDARD
                .decode(&self.data)
                .unwrap_or_else(|_| self.data.as_bytes().to_vec()),
            _ => self.data.as_bytes().to_vec(),
        };
        if self.eol {
            b.push(b'\n');
        }
        b
    }

    /// Approximate memory held by this chunk, in bytes (its data plus the allocations around it).
    pub fn size(&self) -> usize {
        self.data.len() + self.stream.len() + 96
    }
}

/// Exit code as a shell shows it for a POSIX wait status: the code if exited, `128 + signal` if killed.
pub fn exit_code(status: i32) -> i32 {
    if status & 0x7f == 0 {
        (status >> 8) & 0xff
    } else {
        128 + (status & 0x7f)
    }
}

/// The exit code of a job that a fatal `node-failure` exception ended (a node it could not lose was lost),
/// whatever its tasks' codes: 69, sysexits' `EX_UNAVAILABLE`, as a cut-off broker's ([`BROKER_EXIT_CUT_OFF`]).
/// A script can tell "run again without that node" from a failure of the application (whose tasks, killed after
/// the exception, would otherwise give 143 or 137).
pub const JOB_EXIT_NODE_LOST: i32 = 69;

/// The exit code a job's user sees, the same in `vigil run`, `job wait`, `job attach` and `vigil jobs`: from the
/// job's finish status (a POSIX wait status; `None` when its tasks never ran) and the type of its first fatal
/// (severity 0) exception, RFC 21. [`JOB_EXIT_NODE_LOST`] for `node-failure`; else the tasks' code
/// ([`exit_code`]), or 1 if that is 0 but a fatal exception ended the job; 1 when no task ran.
pub fn job_exit_code(status: Option<i32>, fatal: Option<&str>) -> i32 {
    match (status, fatal) {
        (_, Some("node-failure")) => JOB_EXIT_NODE_LOST,
        (Some(s), f) => match exit_code(s) {
            0 if f.is_some() => 1,
            c => c,
        },
        (None, _) => 1,
    }
}

/// Describe a wait status, e.g. "exited with exit code 3" or "killed by SIGKILL".
pub fn describe_status(status: i32) -> String {
    if status & 0x7f == 0 {
        format!("exited with exit code {}", (status >> 8) & 0xff)
    } else {
        let sig = status & 0x7f;
        match signal_name(sig) {
            Some(name) => format!("killed by {name}"),
            None => format!("killed by signal {sig}"),
        }
    }
}

/// Name of signal `sig` in Linux's numbering (that of x86-64, aarch64, riscv64 and most others; not of alpha,
/// mips or sparc), e.g. `SIGKILL` for 9; `None` for 0 and real-time signals. A table rather than libc, so that
/// this crate stays free of system bindings.
fn signal_name(sig: i32) -> Option<&'static str> {
    const NAMES: [&str; 31] = [
        "SIGHUP",
        "SIGINT",
        "SIGQUIT",
        "SIGILL",
        "SIGTRAP",
        "SIGABRT",
        "SIGBUS",
        "SIGFPE",
        "SIGKILL",
        "SIGUSR1",
        "SIGSEGV",
        "SIGUSR2",
        "SIGPIPE",
        "SIGALRM",
        "SIGTERM",
        "SIGSTKFLT",
        "SIGCHLD",
        "SIGCONT",
        "SIGSTOP",
        "SIGTSTP",
        "SIGTTIN",
        "SIGTTOU",
        "SIGURG",
        "SIGXCPU",
        "SIGXFSZ",
        "SIGVTALRM",
        "SIGPROF",
        "SIGWINCH",
        "SIGIO",
        "SIGPWR",
        "SIGSYS",
    ];
    NAMES.get(usize::try_from(sig).ok()?.checked_sub(1)?).copied()
}

/// Encode an exit code as a wait status (`code << 8`).
pub fn status_exited(code: i32) -> i32 {
    (code & 0xff) << 8
}

#[cfg(test)]
mod tests {

    #[test]
    fn output_paths_fill_in_id_and_name() {
        let p = |t: &str, n: Option<&str>| super::output_path(t, 603979776, "fvNZ9R", n);
        assert_eq!(p("out-{{id}}.txt", None), "out-fvNZ9R.txt");
        assert_eq!(p("{{name}}-{{id.dec}}-{{id.f58}}.log", Some("sim")), "sim-603979776-fvNZ9R.log");
        assert_eq!(p("{{name}}.out", Some("a/b")), "a_b.out");
        assert_eq!(p("{{name}}.out", None), "{{name}}.out");
        assert_eq!(p("plain.out", Some("x")), "plain.out");
    }

    use super::*;

    /// A shell's input runs what its submitter signed, or the shell refuses it naming the field that differs.
    #[test]
    fn an_input_is_checked_against_the_signed_jobspec() {
        let js = crate::jobspec::JobspecBuilder::new(["app", "-v"]).cwd("/home/a").env("X", "1").build().expect("ok");
        let text = js.to_json();
        let req = js.validate().expect("valid");
        let mut input: ShellInput = serde_json::from_value(serde_json::json!({
            "id": 1, "id_f58": "f1", "shell_rank": 0, "broker_rank": 0, "nshells": 1, "ntasks": 1,
            "first_task": 0, "local_tasks": 1, "cores": [0], "gpus": [], "cores_per_task": 1,
            "gpus_per_task": 0, "command": req.command, "environment": req.environment, "cwd": req.cwd,
            "options": req.shell_options, "taskmap": null, "r": null, "topology": "live", "declared_gpus": null,
            "uri": "local:///x",
        }))
        .expect("input");
        assert!(input.check_signed().unwrap_err().contains("no signed jobspec"));
        input.imp = Some(ImpCredential { credential: "MUNGE:x:".into(), jobspec: text });
        input.check_signed().expect("the same job");
        let mut forged = input.clone();
        forged.command = vec!["rm".into(), "-rf".into(), "/home/a".into()];
        assert_eq!(forged.check_signed().unwrap_err(), "its command is not the signed jobspec's");
        let mut forged = input.clone();
        forged.environment.insert("LD_PRELOAD".into(), "/tmp/x.so".into());
        assert_eq!(forged.check_signed().unwrap_err(), "its environment is not the signed jobspec's");
        let mut forged = input.clone();
        forged.files.insert("script".into(), serde_json::json!({"data": "evil"}));
        assert_eq!(forged.check_signed().unwrap_err(), "its file list is not the signed jobspec's");
        let mut forged = input;
        forged.cwd = Some("/".into());
        assert_eq!(forged.check_signed().unwrap_err(), "its working directory is not the signed jobspec's");
    }

    /// Inside a batch or alloc job every job shares the enclosing allocation's directory and owns none of it;
    /// elsewhere a job owns its own, under the admin's base or else in its job tmpdir.
    #[test]
    fn alloc_tmpdir_is_the_enclosing_allocation_s_else_the_job_s_own() {
        let t = "/run/vigil/jf1.2";
        let shared = alloc_tmpdir(Some("/run/vigil/jfB.0/alloc"), Some("/dev/shm"), t, "vigil", "fA", 2);
        assert_eq!(shared, AllocTmpdir { path: "/run/vigil/jfB.0/alloc".into(), owned: false });
        let own = alloc_tmpdir(None, None, t, "vigil", "fA", 2);
        assert_eq!(own, AllocTmpdir { path: "/run/vigil/jf1.2/alloc".into(), owned: true });
        let based = alloc_tmpdir(None, Some("/dev/shm"), t, "cluster", "fA", 2);
        assert_eq!(based, AllocTmpdir { path: "/dev/shm/vigil-cluster-fA.2".into(), owned: true });
        // An instance name never leaves the base directory, nor makes a long name.
        let odd = alloc_tmpdir(None, Some("/scratch/"), t, "../../etc/passwd-and-then-some", "fA", 0);
        assert_eq!(odd.path, "/scratch/vigil-______etc_passwd-fA.0");
        assert_eq!(alloc_tmpdir(None, Some("/s"), t, "", "fA", 1).path, "/s/vigil-vigil-fA.1");
        // Each node of a job has its own.
        assert_ne!(alloc_tmpdir(None, Some("/s"), t, "x", "fA", 0), alloc_tmpdir(None, Some("/s"), t, "x", "fA", 1));
    }

    #[test]
    fn a_job_ended_by_a_lost_node_exits_69_whatever_its_tasks_gave() {
        let killed = 15; // wait status of a task killed by SIGTERM
        assert_eq!(job_exit_code(Some(killed), Some("node-failure")), JOB_EXIT_NODE_LOST);
        assert_eq!(job_exit_code(None, Some("node-failure")), JOB_EXIT_NODE_LOST);
        assert_eq!(job_exit_code(Some(killed), Some("timelimit")), 143);
        assert_eq!(job_exit_code(Some(0), Some("exec")), 1, "a fatal exception over tasks that all exited 0");
        assert_eq!(job_exit_code(Some(3 << 8), None), 3);
        assert_eq!(job_exit_code(None, None), 1, "no task ran");
    }

    #[test]
    fn memory_sizes_read_as_slurm_users_write_them() {
        assert_eq!(parse_memory_size("64M"), Ok(64 << 20));
        assert_eq!(parse_memory_size("64mb"), Ok(64 << 20));
        assert_eq!(parse_memory_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_memory_size("512k"), Ok(512 << 10));
        assert_eq!(parse_memory_size("2T"), Ok(2 << 40));
        assert_eq!(parse_memory_size("4096"), Ok(4096 << 20), "no unit: MiB, as for --mem");
        assert_eq!(parse_memory_size("4096B"), Ok(4096));
        for bad in ["", "M", "-1G", "1.5G", "12Q", "0", "0G", "99999999999T"] {
            assert!(parse_memory_size(bad).is_err(), "{bad}");
        }
        assert!(parse_memory_size("12Q").unwrap_err().contains("unknown unit"));
    }

    #[test]
    fn statuses_are_described_as_a_shell_shows_them() {
        assert_eq!(describe_status(status_exited(3)), "exited with exit code 3");
        assert_eq!(describe_status(9), "killed by SIGKILL");
        assert_eq!(describe_status(15), "killed by SIGTERM");
        assert_eq!(describe_status(1), "killed by SIGHUP");
        assert_eq!(describe_status(31), "killed by SIGSYS");
        assert_eq!(describe_status(34), "killed by signal 34");
        assert_eq!(exit_code(9), 137);
        assert_eq!(exit_code(status_exited(3)), 3);
    }
}
