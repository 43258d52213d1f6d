//! Options shared by `run` and `submit` ([`SubmitArgs`]), and the node options `batch` and `alloc` take too
//! ([`NodeSelection`], [`NodeCount`]).

use clap::Args;

/// Options shared by `run` and `submit` (flux run / flux submit shapes).
#[derive(Args, Debug, Clone)]
#[command(trailing_var_arg = true)]
pub struct SubmitArgs {
    /// Number of nodes: N, or MIN-MAX (Slurm's --nodes=min-max: as many free nodes as there are, up to MAX, at
    /// least MIN; the job starts as soon as MIN are free).
    #[arg(short = 'N', long = "nodes", value_name = "N|MIN-MAX")]
    pub nodes: Option<NodeCount>,
    /// Number of tasks (default: 1, or one per node with -N).
    #[arg(short = 'n', long = "ntasks")]
    pub ntasks: Option<u32>,
    /// Cores per task.
    #[arg(short = 'c', long = "cores-per-task", default_value_t = 1)]
    pub cores_per_task: u32,
    /// GPUs per task.
    #[arg(short = 'g', long = "gpus-per-task", default_value_t = 0)]
    pub gpus_per_task: u32,
    /// Time limit: minutes, or a duration with a unit (30s, 10m, 2h, 1d); 0 or inf = none.
    #[arg(short = 't', long = "time-limit")]
    pub time_limit: Option<String>,
    /// Allocate whole nodes.
    #[arg(long)]
    pub exclusive: bool,
    /// Which nodes the job may run on.
    #[command(flatten)]
    pub select: NodeSelection,
    /// Its name, and when and in which order it leaves the queue.
    #[command(flatten)]
    pub queue: crate::cli::queue::QueueOpts,
    /// Which node runs which task rank (Flux's --taskmap, RFC 34): block (the default: consecutive ranks on each
    /// node), cyclic[:N] (dealt round-robin over the nodes, N at a time), manual:TASKMAP (an RFC 34 map, e.g.
    /// `manual:[[0,2,1,2]]`; needs -N), hostfile:FILE (task i on the host of line i of FILE, lines reused from
    /// the top, blank lines and # comments skipped, one task per line without -n; read now, and the job runs on
    /// exactly those hosts).
    #[arg(long, value_name = "SCHEME")]
    pub taskmap: Option<String>,
    /// If the job fails because one of its nodes is lost, put it back in the queue ahead of later jobs and run it
    /// again on live nodes (same id), at most `sched.max-requeue` times (`-o requeue` is the same).
    #[arg(long)]
    pub requeue: bool,
    /// Environment edits (repeatable): VAR=VAL sets, -PATTERN removes (a trailing * matches a prefix).
    /// The submitter's whole environment is passed by default.
    #[arg(long = "env", value_name = "RULE", allow_hyphen_values = true)]
    pub env: Vec<String>,
    /// Working directory of the tasks (default: the current directory; a relative one is taken from it).
    #[arg(long)]
    pub cwd: Option<String>,
    /// Shell option NAME[=VALUE] (repeatable): cpu-affinity=off|on|per-task, gpu-affinity=..., exit-timeout=DURATION|none
    /// (0 is none),
    /// kill-timeout=DURATION (SIGKILL this long after SIGTERM instead of exec.kill-timeout; at most
    /// exec.kill-timeout-max, 60s by default),
    /// exit-on-error (a task that exits non-zero or by a signal fails the whole job at once), memory=SIZE (per
    /// node, e.g. 4G; MiB without a unit, as Slurm's --mem; where the memory controller is enabled).
    #[arg(short = 'o', long = "setopt", value_name = "OPT")]
    pub setopt: Vec<String>,
    /// Prefix output lines with the task rank (`run` only).
    #[arg(short = 'l', long = "label-io")]
    pub label_io: bool,
    /// Print the jobspec instead of submitting it.
    #[arg(long)]
    pub dry_run: bool,
    /// Write the job's stdout (and stderr, unless --error) to this file (`{{id}}` = job id), on each node.
    #[arg(long)]
    pub output: Option<String>,
    /// Write the job's stderr to this file.
    #[arg(long)]
    pub error: Option<String>,
    /// Submit one copy of the job per id in IDSET (`1-100`, `0,4-7`), as `flux submit --cc`: in each, `{cc}` (or
    /// `{{cc}}`) in the command, its arguments and --output/--error becomes the id (not in --env), and VIGIL_JOB_CC
    /// is set to it. One job id is
    /// printed per line, in IDSET order (`submit` only).
    #[arg(long, value_name = "IDSET")]
    pub cc: Option<String>,
    /// Command and arguments.
    #[arg(value_name = "COMMAND", required = true)]
    pub command: Vec<String>,
}

/// Which nodes a job may run on (`run`, `submit`, `batch`, `alloc`): Flux's `--requires` and `--exclude`, with
/// `-w/--nodelist` (only these nodes, not Slurm's "all of these") and `-x`; all must hold (`attributes.system.constraints`, RFC 31). A request that
/// too few nodes satisfy is refused at submit, saying so.
#[derive(Args, Debug, Clone, Default)]
pub struct NodeSelection {
    /// Only nodes that meet SPEC (repeatable): `host:HOSTLIST` (`host:node[1-4]`) or `rank:IDSET`.
    #[arg(long = "requires", value_name = "SPEC")]
    pub requires: Vec<String>,
    /// Only these nodes (a host list, `node[1-4,7]`): the same as --requires=host:HOSTLIST. Unlike Slurm's -w, the job
    /// need not take every one of them (ask -N for that many).
    #[arg(short = 'w', long = "nodelist", value_name = "HOSTLIST")]
    pub nodelist: Option<String>,
    /// Not these nodes: a host list (`node3`), or broker ranks (`3`, `0-2`).
    #[arg(short = 'x', long = "exclude", value_name = "HOSTLIST|IDSET")]
    pub exclude: Option<String>,
}

impl NodeSelection {
    /// The options as typed, for messages: `-x node2 -w node[1,4] --requires=host:node1`.
    pub(crate) fn as_typed(&self) -> String {
        let mut v = Vec::new();
        if let Some(w) = &self.nodelist {
            v.push(format!("-w {w}"));
        }
        if let Some(x) = &self.exclude {
            v.push(format!("-x {x}"));
        }
        v.extend(self.requires.iter().map(|r| format!("--requires={r}")));
        v.join(" ")
    }

    /// The constraint these options make, if any.
    pub(crate) fn constraint(&self) -> Result<Option<vigil_proto::constraint::Constraint>, String> {
        vigil_proto::constraint::Constraint::from_options(
            &self.requires,
            self.nodelist.as_deref(),
            self.exclude.as_deref(),
        )
    }
}

/// A `-N` value: a node count `N` (`min == max`), or a range `MIN-MAX` (Slurm's `--nodes=min-max`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeCount {
    /// Fewest nodes the job runs on.
    pub min: u32,
    /// Most nodes it takes (equal to `min` for a plain count).
    pub max: u32,
}

impl std::str::FromStr for NodeCount {
    type Err = String;
    /// `N` or `MIN-MAX`, each at least 1, MIN no more than MAX.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let num = |t: &str, what: &str| -> Result<u32, String> {
            match t.trim().parse::<u32>() {
                Ok(0) => Err(format!("{what} must be at least 1")),
                Ok(n) => Ok(n),
                Err(_) => Err(format!("'{s}': expected a node count N or a range MIN-MAX (e.g. 4, 2-4)")),
            }
        };
        match s.split_once('-') {
            None => num(s, "the node count").map(|n| NodeCount { min: n, max: n }),
            Some((a, b)) => {
                let (min, max) = (num(a, "MIN")?, num(b, "MAX")?);
                if min > max {
                    return Err(format!("{s}: MIN ({min}) is more than MAX ({max})"));
                }
                Ok(NodeCount { min, max })
            }
        }
    }
}

impl std::fmt::Display for NodeCount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.min == self.max {
            write!(f, "{}", self.min)
        } else {
            write!(f, "{}-{}", self.min, self.max)
        }
    }
}
