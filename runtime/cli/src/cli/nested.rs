//! Nested instances: `vigil batch`, `vigil alloc` and `vigil proxy`.
//!
//! A batch or alloc job's tasks are brokers, one per node of the allocation (whole nodes), which bootstrap the
//! child instance through the job shell's PMI-1 server. The child owns exactly the job's resources (its R,
//! renumbered from 0), reports its URI and critical ranks to the parent (a `memo` event), and exits when its
//! initial program does: the batch script, or for `alloc` when the command run on the user's terminal exits.

use super::connect;
use super::jobcmd::{build_jobspec, submit_value, SubmitArgs};
use crate::client::Client;
use crate::jobs::JobId;
use clap::{Args, Parser};
use serde_json::{json, Value};

/// Options shared by `batch` and `alloc` (also accepted in `# vigil:` directives of a batch script).
#[derive(Args, Debug, Clone, Default)]
pub struct InstanceOpts {
    /// Number of nodes (whole nodes are allocated; default 1): N, or MIN-MAX (Slurm's --nodes=min-max: as many
    /// free nodes as there are up to MAX, at least MIN; the instance's size is what it got).
    #[arg(short = 'N', long = "nodes", value_name = "N|MIN-MAX")]
    pub nodes: Option<super::jobcmd::NodeCount>,
    /// Not supported: the tasks of a batch or alloc job are its instance's brokers, one per node in node order;
    /// give --taskmap to the `vigil run` inside it.
    #[arg(long, value_name = "SCHEME")]
    pub taskmap: Option<String>,
    /// Not supported: batch and alloc allocate whole nodes (-N).
    #[arg(short = 'n', long = "ntasks")]
    pub ntasks: Option<u32>,
    /// Time limit: minutes, or a duration with a unit (30s, 10m, 2h).
    #[arg(short = 't', long = "time-limit")]
    pub time_limit: Option<String>,
    /// Output file of the job (`{{id}}` = job id); batch default `vigil-{{id}}.out`.
    #[arg(long)]
    pub output: Option<String>,
    /// Separate file for the job's stderr.
    #[arg(long)]
    pub error: Option<String>,
    /// Working directory.
    #[arg(long)]
    pub cwd: Option<String>,
    /// Environment edits, as for `vigil run`.
    #[arg(long = "env", value_name = "RULE", allow_hyphen_values = true)]
    pub env: Vec<String>,
    /// Which nodes the allocation may take (`--requires`, `-w/--nodelist`, `-x/--exclude`), as for `vigil run`.
    #[command(flatten)]
    pub select: super::jobcmd::NodeSelection,
    /// Its name, and when and in which order it leaves the queue, as for `vigil run`.
    #[command(flatten)]
    pub queue: super::queue::QueueOpts,
    /// Job shell options (`-o requeue` is `--requeue`).
    #[arg(short = 'o', long = "setopt")]
    pub setopt: Vec<String>,
    /// If the job fails because one of its critical nodes is lost (its rank 0's), put it back in the queue
    /// ahead of later jobs and run the script again, at most `sched.max-requeue` times.
    #[arg(long)]
    pub requeue: bool,
    /// Start the instance when all but at most K of its brokers join (0 <= K < N; default 0): the nodes of the
    /// others (lost, or whose broker failed, before it joined) are reported in a severity-2 exception naming them
    /// and given back, and the script starts on the rest (its VIGIL_JOB_NNODES and VIGIL_JOB_NODELIST say so).
    /// With more missing, or without this option and one missing, the job fails at once naming them.
    #[arg(long = "tolerate-lost", value_name = "K", allow_hyphen_values = true)]
    pub tolerate_lost: Option<String>,
    /// Attribute of the child instance's brokers (repeatable), e.g. `-S tbon.topo=kary:2`.
    #[arg(short = 'S', long = "setattr", value_name = "ATTR=VAL")]
    pub setattr: Vec<String>,
    /// More child broker options, whitespace-separated (`--broker-opts="-S tbon.topo=binomial"`).
    #[arg(long = "broker-opts", allow_hyphen_values = true)]
    pub broker_opts: Vec<String>,
}

/// Parser for the options of `# vigil:` directives.
#[derive(Parser, Debug)]
#[command(no_binary_name = true, disable_help_flag = true)]
struct DirectiveParser {
    #[command(flatten)]
    opts: InstanceOpts,
}

/// `vigil batch` arguments.
#[derive(Args, Debug)]
#[command(trailing_var_arg = true)]
pub struct BatchArgs {
    /// Instance options.
    #[command(flatten)]
    pub opts: InstanceOpts,
    /// Submit one batch job per id of IDSET (e.g. `1-10`), as `vigil submit --cc` does: `{cc}` (or `{{cc}}`) in
    /// the script's arguments, `--output` and `--error` becomes the id, and the script sees it in
    /// `VIGIL_JOB_CC`; one job id printed per line (Flux's `flux batch --cc`, Slurm's `sbatch --array`).
    #[arg(long, value_name = "IDSET")]
    pub cc: Option<String>,
    /// Print the jobspec instead of submitting it.
    #[arg(long)]
    pub dry_run: bool,
    /// Batch script and its arguments.
    #[arg(value_name = "SCRIPT", required = true)]
    pub script: Vec<String>,
}

/// `vigil alloc` arguments.
#[derive(Args, Debug)]
#[command(trailing_var_arg = true)]
pub struct AllocArgs {
    /// Instance options.
    #[command(flatten)]
    pub opts: InstanceOpts,
    /// Command to run inside the allocation (default: your shell).
    #[arg(value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// `vigil proxy` arguments.
#[derive(Args, Debug)]
#[command(trailing_var_arg = true)]
pub struct ProxyArgs {
    /// Job id of a batch or alloc job.
    pub id: String,
    /// Command to run with VIGIL_URI set to the job's instance (default: your shell).
    #[arg(value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// Split a directive line into words, honouring single and double quotes.
pub(crate) fn split_words(s: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut have = false;
    let mut quote: Option<char> = None;
    for c in s.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => cur.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                have = true;
            }
            (None, c) if c.is_whitespace() => {
                if have || !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                    have = false;
                }
            }
            (None, c) => cur.push(c),
        }
    }
    if quote.is_some() {
        return Err(format!("unterminated quote in '{s}'"));
    }
    if have || !cur.is_empty() {
        out.push(cur);
    }
    Ok(out)
}

/// Submission directives of a batch script (like RFC 36): `# vigil: OPTIONS` lines in the leading block of
/// comments (after the `#!` line). Returns the parsed options with the line numbers they came from.
pub(crate) fn parse_directives(script: &str) -> Result<Option<InstanceOpts>, String> {
    let mut words = Vec::new();
    for (i, line) in script.lines().enumerate() {
        let t = line.trim();
        if i == 0 && t.starts_with("#!") {
            continue;
        }
        if t.is_empty() {
            continue;
        }
        if !t.starts_with('#') {
            break;
        }
        let body = t.trim_start_matches('#').trim_start();
        if let Some(rest) = body.strip_prefix("vigil:") {
            words.extend(split_words(rest).map_err(|e| format!("script line {}: {e}", i + 1))?);
        }
    }
    if words.is_empty() {
        return Ok(None);
    }
    DirectiveParser::try_parse_from(&words)
        .map(|d| Some(d.opts))
        .map_err(|e| format!("batch directive: {}", e.to_string().lines().next().unwrap_or("")))
}

/// Take directive `dir` into `cli` when the command line did not give that option: where both give it, the command
/// line wins (as sbatch's options override its `#SBATCH` lines, and flux batch's its directives).
fn merge<T: Clone>(cli: &mut Option<T>, dir: &Option<T>) {
    if cli.is_none() {
        cli.clone_from(dir);
    }
}

/// Merge directives into command-line options, the command line winning where both give an option ([`merge`]).
/// Options that batch and alloc refuse whatever their value are refused first, from either.
///
/// # Errors
/// An option batch and alloc refuse (`-n`, `--taskmap=cyclic`...), on the command line or in a directive.
pub(crate) fn merge_opts(mut cli: InstanceOpts, dir: Option<InstanceOpts>) -> Result<InstanceOpts, String> {
    refuse_task_options(&cli)?;
    let Some(d) = dir else { return Ok(cli) };
    refuse_task_options(&d).map_err(|e| format!("batch directive: {e}"))?;
    merge(&mut cli.nodes, &d.nodes);
    merge(&mut cli.ntasks, &d.ntasks);
    merge(&mut cli.time_limit, &d.time_limit);
    merge(&mut cli.taskmap, &d.taskmap);
    merge(&mut cli.output, &d.output);
    merge(&mut cli.error, &d.error);
    merge(&mut cli.cwd, &d.cwd);
    merge(&mut cli.select.nodelist, &d.select.nodelist);
    merge(&mut cli.select.exclude, &d.select.exclude);
    merge(&mut cli.tolerate_lost, &d.tolerate_lost);
    cli.requeue |= d.requeue;
    cli.queue.merge(d.queue);
    // Lists: the script's directives first, the command line's after them (a later one wins where order matters).
    prepend(&mut cli.select.requires, d.select.requires);
    prepend(&mut cli.env, d.env);
    prepend(&mut cli.setopt, d.setopt);
    prepend(&mut cli.setattr, d.setattr);
    prepend(&mut cli.broker_opts, d.broker_opts);
    Ok(cli)
}

/// `first`, then what `list` held.
fn prepend<T>(list: &mut Vec<T>, mut first: Vec<T>) {
    first.append(list);
    *list = first;
}

/// Child broker arguments from `-S` and `--broker-opts`, validated here so a typo is one clear error at submit.
fn broker_args(o: &InstanceOpts) -> Result<Vec<String>, String> {
    Ok(child_attrs(o)?.0.into_iter().map(|a| format!("--setattr={a}")).collect())
}

/// The jobspec's `attributes.system.instance` (`vigil_proto::jobspec::INSTANCE_KEY`): the shape the child
/// instance will have, from its `-S` attributes, so that the enclosing exec system knows its critical ranks from
/// the start, before the instance reports them.
fn instance_shape(o: &InstanceOpts) -> Result<Value, String> {
    let (_, map, config) = child_attrs(o)?;
    let mut v = json!({"tbon.reparent": if config.reparent { "on" } else { "off" }});
    if map.contains_key("tbon.topo") || map.contains_key("tbon.fanout") {
        v["tbon.topo"] = json!(config.topo.to_string());
    }
    Ok(v)
}

/// `--tolerate-lost=K` of `o`, checked against the job's least node count `min`: a count from 0 to `min - 1`
/// (the instance keeps at least one broker, its rank 0).
fn tolerate_lost(o: &InstanceOpts, min: u32) -> Result<Option<u32>, String> {
    let Some(k) = &o.tolerate_lost else { return Ok(None) };
    let v: i64 = k.trim().parse().map_err(|_| format!("--tolerate-lost={k}: expected a count of nodes (0 or more)"))?;
    if v < 0 {
        return Err(format!("--tolerate-lost={k}: must be 0 or more"));
    }
    if v >= i64::from(min) {
        return Err(format!(
            "--tolerate-lost={k}: must be less than the job's node count ({min}): the instance needs at least one of \
             its brokers"
        ));
    }
    Ok(Some(v as u32))
}

/// The child brokers' attributes from `-S` and `--broker-opts` (`ATTR=VAL` each), as given, as a map, and as the
/// child's brokers will take them.
type ChildAttrs = (Vec<String>, std::collections::BTreeMap<String, String>, crate::attrs::BrokerConfig);

/// [`ChildAttrs`] of `o`, validated here so a typo is one clear error at submit.
fn child_attrs(o: &InstanceOpts) -> Result<ChildAttrs, String> {
    let mut attrs = Vec::new();
    for s in &o.setattr {
        attrs.push(s.clone());
    }
    if let Some(k) = tolerate_lost(o, u32::MAX)? {
        attrs.push(format!("broker.tolerate-lost={k}"));
    }
    for b in &o.broker_opts {
        let w = split_words(b)?;
        let mut it = w.into_iter();
        while let Some(x) = it.next() {
            if x == "-S" || x == "--setattr" {
                attrs.push(it.next().ok_or("--broker-opts: -S needs ATTR=VAL")?);
            } else if let Some(v) = x.strip_prefix("--setattr=").or_else(|| x.strip_prefix("-S")) {
                attrs.push(v.to_string());
            } else {
                return Err(format!("--broker-opts: unsupported broker option '{x}' (use -S ATTR=VAL)"));
            }
        }
    }
    let map = super::parse_attrs(&attrs)?;
    let config = super::start::check_attrs(&map).map_err(|e| format!("child broker: {e}"))?;
    if config.allow_guest_users {
        return Err(
            "child broker: access.allow-guest-users cannot be set for a batch or alloc job: a nested instance \
             is its user's own (docs/security.md)"
                .into(),
        );
    }
    // The jobs of a batch or alloc job share its own node-local directory: no other is theirs to choose.
    for name in ["exec.alloc-tmpdir-base", "alloc-tmpdir"] {
        if map.contains_key(name) {
            return Err(format!(
                "child broker: {name} cannot be set for a batch or alloc job: every job inside it shares the \
                 allocation's VIGIL_ALLOC_TMPDIR (exec.alloc-tmpdir-base is the system instance's, set by the admin)"
            ));
        }
    }
    Ok((attrs, map, config))
}

/// `-n` and `--taskmap`, which batch and alloc refuse: their tasks are the instance's brokers, one per node.
fn refuse_task_options(o: &InstanceOpts) -> Result<(), String> {
    if o.ntasks.is_some() {
        return Err("-n is not supported by batch and alloc: they allocate whole nodes, use -N".into());
    }
    if let Some(t) = &o.taskmap {
        return Err(format!(
            "--taskmap={t}: batch and alloc jobs run one broker per node (the instance's ranks follow node order), \
             not tasks to map; give --taskmap to `vigil run` inside the allocation"
        ));
    }
    Ok(())
}

fn instance_jobspec(
    o: &InstanceOpts,
    name: &str,
    command: Vec<String>,
    default_output: Option<&str>,
    files: Option<Value>,
) -> Result<Value, String> {
    refuse_task_options(o)?;
    let nodes = o.nodes.unwrap_or(super::jobcmd::NodeCount { min: 1, max: 1 });
    if nodes.min == 0 {
        return Err("-N must be at least 1".into());
    }
    tolerate_lost(o, nodes.min)?;
    let mut setopt = o.setopt.clone();
    if !setopt.iter().any(|s| s.starts_with("exit-timeout")) {
        setopt.push("exit-timeout=none".into());
    }
    let a = SubmitArgs {
        nodes: Some(nodes),
        // One broker per node: a task per slot, however many nodes a range gets.
        ntasks: None,
        cores_per_task: 1,
        gpus_per_task: 0,
        time_limit: o.time_limit.clone(),
        exclusive: true,
        select: o.select.clone(),
        queue: {
            let mut q = o.queue.clone();
            q.batch_signal();
            q
        },
        taskmap: None,
        requeue: o.requeue,
        env: o.env.clone(),
        cwd: o.cwd.clone(),
        setopt,
        label_io: false,
        dry_run: false,
        output: None,
        error: None,
        cc: None,
        command,
    };
    let spec = build_jobspec(&a)?;
    let mut v: Value = serde_json::from_str(&spec.to_json()).map_err(|e| e.to_string())?;
    let output = o.output.clone().or_else(|| default_output.map(str::to_string));
    if let Some(p) = &output {
        super::jobcmd::check_output_template("--output", p)?;
    }
    if let Some(p) = &o.error {
        super::jobcmd::check_output_template("--error", p)?;
    }
    if let Some(opts) = v.pointer_mut("/attributes/system").and_then(Value::as_object_mut) {
        let shell = opts.entry("shell").or_insert_with(|| json!({}));
        if let Some(sh) = shell.as_object_mut() {
            let options = sh.entry("options").or_insert_with(|| json!({}));
            let mut out = serde_json::Map::new();
            if let Some(p) = &output {
                out.insert("stdout".into(), json!({"type": "file", "path": p}));
            }
            if let Some(p) = &o.error {
                out.insert("stderr".into(), json!({"type": "file", "path": p}));
            }
            if !out.is_empty() {
                options["output"] = Value::Object(out);
            }
        }
        if let Some(f) = files {
            opts.insert("files".into(), f);
        }
        opts.insert("job".into(), json!({"name": o.queue.name()?.unwrap_or(name)}));
        opts.insert(vigil_proto::jobspec::INSTANCE_KEY.into(), instance_shape(o)?);
    }
    Ok(v)
}

fn vigil_exe() -> Result<String, String> {
    std::env::current_exe().map(|p| p.display().to_string()).map_err(|e| format!("cannot find the vigil binary: {e}"))
}

/// `vigil batch`.
pub(crate) async fn batch(a: BatchArgs) -> Result<i32, String> {
    let path = &a.script[0];
    let meta = std::fs::metadata(path).map_err(|e| format!("batch script {path}: {e}"))?;
    if !meta.is_file() {
        return Err(format!("batch script {path}: not a regular file"));
    }
    let text = std::fs::read(path).map_err(|e| format!("batch script {path}: {e}"))?;
    let text = String::from_utf8(text).map_err(|_| format!("batch script {path}: not UTF-8 text"))?;
    if !text.starts_with("#!") {
        return Err(format!("batch script {path}: must start with a #! line naming its interpreter"));
    }
    {
        use std::os::unix::fs::PermissionsExt;
        if meta.permissions().mode() & 0o111 == 0 {
            return Err(format!("batch script {path}: not executable (chmod +x {path})"));
        }
    }
    let opts = merge_opts(a.opts.clone(), parse_directives(&text)?)?;
    let name = std::path::Path::new(path).file_name().and_then(|n| n.to_str()).unwrap_or("batch").to_string();
    let spec = |opts: &InstanceOpts, args: &[String]| -> Result<Value, String> {
        let mut cmd = vec![vigil_exe()?, "broker".into(), "--job-script=script".into()];
        cmd.extend(broker_args(opts)?);
        cmd.push("--".into());
        cmd.extend(args.iter().cloned());
        let files = json!({"script": {"data": text, "mode": 0o700}});
        instance_jobspec(opts, &name, cmd, Some("vigil-{{id}}.out"), Some(files))
    };
    if let Some(cc) = &a.cc {
        let set = super::jobcmd::cc_set(cc).await?;
        // Every copy is built (and so checked) before the first is submitted.
        let specs = set
            .iter()
            .map(|i| {
                let sub = |t: &str| t.replace("{{cc}}", &i.to_string()).replace("{cc}", &i.to_string());
                let mut o = opts.clone();
                o.output = o.output.as_deref().map(sub);
                o.error = o.error.as_deref().map(sub);
                o.env.push(format!("VIGIL_JOB_CC={i}"));
                let args: Vec<String> = a.script[1..].iter().map(|s| sub(s)).collect();
                spec(&o, &args).map(|v| (i, v))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if a.dry_run {
            for (_, v) in &specs {
                println!("{v}");
            }
            return Ok(0);
        }
        return super::jobcmd::submit_all(specs, opts.queue.urgency()).await;
    }
    let v = spec(&opts, &a.script[1..])?;
    if a.dry_run {
        println!("{v}");
        return Ok(0);
    }
    let mut c = connect().await?;
    super::jobcmd::check_exclude(&c, &opts.select).await?;
    let id = submit_value(&mut c, &v, false, opts.queue.urgency())
        .await
        .map_err(|e| super::jobcmd::said_as_typed(&opts.setopt, None, e))?;
    println!("{id}");
    Ok(0)
}

/// Follow job `id`'s eventlog until the nested instance reports its URI; `Err` with the job's exceptions if
/// the job ends first.
async fn wait_for_instance(c: &Client, id: JobId) -> Result<String, String> {
    let mut s = c.rpc_stream("job-manager.eventlog", 0, &json!({"id": id.0, "follow": true})).map_err(|e| e.errstr)?;
    let mut notes = Vec::new();
    // Silent when the nodes are there at once; a job still pending after a moment is said to be so, with the
    // scheduler's reason, as `vigil run` does.
    let pending_note = tokio::time::sleep(super::jobcmd::PENDING_NOTE_AFTER);
    tokio::pin!(pending_note);
    let mut noted = false;
    loop {
        let item = tokio::select! {
            item = s.next() => item,
            _ = &mut pending_note, if !noted => {
                noted = true;
                super::jobcmd::say_if_pending(c, id).await;
                continue;
            }
        };
        let Some(item) = item else { break };
        let v = item.map_err(|e| e.errstr)?;
        let e = &v["event"];
        match e["name"].as_str() {
            Some("memo") => {
                if let Some(u) = e["context"]["uri"].as_str() {
                    return Ok(u.to_string());
                }
            }
            Some("exception") => notes.push(format!(
                "{}: {}",
                e["context"]["type"].as_str().unwrap_or(""),
                e["context"]["note"].as_str().unwrap_or("")
            )),
            _ => {}
        }
    }
    Err(format!(
        "job {id} ended before its instance started{}",
        if notes.is_empty() { String::new() } else { format!(" ({})", notes.join("; ")) }
    ))
}

/// A command run against an instance: in a process group of its own, so that all it started can be signalled
/// together, made the terminal's foreground group when stdin is a tty (Ctrl-C and job control reach it). The
/// terminal is taken back for this process when it is dropped.
struct Command {
    child: tokio::process::Child,
    tty: bool,
}

impl Command {
    /// Starts `command` (the user's shell if empty) with `VIGIL_URI` set to `uri`, and `env` (the job's).
    fn spawn(uri: &str, command: &[String], env: &[(String, String)]) -> Result<Command, String> {
        let argv: Vec<String> = if command.is_empty() {
            vec![std::env::var("SHELL").unwrap_or_else(|_| "/bin/sh".into())]
        } else {
            command.to_vec()
        };
        let mut cmd = std::process::Command::new(&argv[0]);
        cmd.args(&argv[1..]).env(crate::client::URI_ENV, uri).envs(env.iter().map(|(k, v)| (k, v)));
        let tty = crate::foreground::own_foreground_group(&mut cmd);
        let child = tokio::process::Command::from(cmd).spawn().map_err(|e| format!("cannot run {}: {e}", argv[0]))?;
        Ok(Command { child, tty })
    }

    /// Waits for the command; its shell-style exit code. SIGINT, SIGTERM and SIGHUP sent to this process are
    /// passed on to the command's process group (from a terminal, Ctrl-C reaches that group directly).
    async fn wait(&mut self) -> Result<i32, String> {
        use tokio::signal::unix::{signal, SignalKind};
        let mut sigs = Vec::new();
        for kind in [SignalKind::interrupt(), SignalKind::terminate(), SignalKind::hangup()] {
            sigs.push((kind.as_raw_value(), signal(kind).map_err(|e| format!("signal handler: {e}"))?));
        }
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let forwarders: Vec<_> = sigs
            .into_iter()
            .map(|(num, mut s)| {
                let tx = tx.clone();
                tokio::spawn(async move {
                    while s.recv().await.is_some() {
                        let _ = tx.send(num);
                    }
                })
            })
            .collect();
        let pid = self.child.id();
        let st = loop {
            tokio::select! {
                st = self.child.wait() => break st,
                Some(sig) = rx.recv() => {
                    if let Some(pid) = pid {
                        // SAFETY: killpg(2) on the process group our child leads; it is not reaped yet.
                        unsafe { libc::killpg(pid as i32, sig) };
                    }
                }
            }
        };
        for f in forwarders {
            f.abort();
        }
        Ok(shell_code(st.map_err(|e| format!("waiting for the command: {e}"))?))
    }

    /// SIGTERM to the command's process group, SIGKILL if the command has not exited 5 s later; waits for it.
    async fn terminate(&mut self) {
        let Some(pid) = self.child.id() else { return }; // already reaped
        let group = |sig| {
            // SAFETY: killpg(2) on the process group our child leads (it is not reaped yet: wait is below); the
            // group outlives the leader, so the SIGKILL below still reaches what it started.
            unsafe { libc::killpg(pid as i32, sig) };
        };
        group(libc::SIGTERM);
        if tokio::time::timeout(std::time::Duration::from_secs(5), self.child.wait()).await.is_err() {
            group(libc::SIGKILL);
            let _ = self.child.wait().await;
        }
    }
}

impl Drop for Command {
    fn drop(&mut self) {
        if self.tty {
            crate::foreground::take_terminal_back();
        }
    }
}

/// Shell-style exit code of a finished command: its code, or 128 + the signal that killed it.
fn shell_code(st: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0))
}

async fn run_with_uri(uri: &str, command: &[String], env: &[(String, String)]) -> Result<i32, String> {
    Command::spawn(uri, command, env)?.wait().await
}

/// What a command run in job `id`'s allocation is told of it, as salloc tells `SLURM_JOB_ID` and
/// `SLURM_JOB_NODELIST`: `VIGIL_JOB_ID`, `VIGIL_JOB_NNODES` and `VIGIL_JOB_NODELIST` (from the job's R, `info`:
/// the `job-manager.info` answer).
fn job_env(id: JobId, info: &Value) -> Vec<(String, String)> {
    let mut env = vec![("VIGIL_JOB_ID".to_string(), id.f58())];
    let nodes = crate::r::Rv1::from_value(&info["R"]).and_then(|r| r.hosts()).unwrap_or_default();
    if !nodes.is_empty() {
        env.push(("VIGIL_JOB_NNODES".into(), nodes.len().to_string()));
        env.push(("VIGIL_JOB_NODELIST".into(), nodes.to_string()));
    }
    env
}

/// Runs `command` against the instance of job `id` (at `uri`) until it exits, or until the job ends under it
/// (canceled, time limit, a fatal exception): the job's exceptions are printed as `vigil run` prints them and
/// the command's process group is terminated (SIGTERM, SIGKILL 5 s later). Returns the command's exit code, or, if the job
/// ended first, the job's, as `vigil run` gives it (`shellproto::job_exit_code`: 69 for a lost node it could not
/// lose; a fatal exception with a zero status gives 1).
async fn run_in_allocation(c: &Client, id: JobId, uri: &str, command: &[String]) -> Result<i32, String> {
    let info = c.rpc("job-manager.info", 0, &json!({"id": id.0})).await.map_err(|e| e.errstr)?;
    let mut cmd = Command::spawn(uri, command, &job_env(id, &info))?;
    let mut events =
        c.rpc_stream("job-manager.eventlog", 0, &json!({"id": id.0, "follow": true})).map_err(|e| e.errstr)?;
    let mut following = true;
    let mut fatal: Option<String> = None;
    loop {
        tokio::select! {
            code = cmd.wait() => return code,
            item = events.next(), if following => {
                let Some(Ok(v)) = item else {
                    following = false; // the instance we talk to is going away: the command's exit decides
                    continue;
                };
                let e = &v["event"];
                let ctx = &e["context"];
                match e["name"].as_str() {
                    Some("exception") => {
                        let sev = ctx["severity"].as_u64().unwrap_or(0);
                        if sev == 0 && fatal.is_none() {
                            fatal = Some(ctx["type"].as_str().unwrap_or("").to_string());
                        }
                        eprintln!(
                            "vigil: job {id}: exception type={} severity={sev}: {}",
                            ctx["type"].as_str().unwrap_or("?"),
                            ctx["note"].as_str().unwrap_or("")
                        );
                    }
                    Some("finish") => {
                        let status = ctx["status"].as_i64().unwrap_or(0) as i32;
                        eprintln!("vigil: job {id}: the allocation ended under the command; terminating it");
                        cmd.terminate().await;
                        return Ok(crate::shellproto::job_exit_code(Some(status), fatal.as_deref()));
                    }
                    _ => {}
                }
            }
        }
    }
}

/// `vigil alloc`.
pub(crate) async fn alloc(a: AllocArgs) -> Result<i32, String> {
    let mut cmd = vec![vigil_exe()?, "broker".into()];
    cmd.extend(broker_args(&a.opts)?);
    let v = instance_jobspec(&a.opts, "alloc", cmd, None, None)?;
    let mut c = connect().await?;
    super::jobcmd::check_exclude(&c, &a.opts.select).await?;
    let id = submit_value(&mut c, &v, false, a.opts.queue.urgency())
        .await
        .map_err(|e| super::jobcmd::said_as_typed(&a.opts.setopt, None, e))?;
    let uri = tokio::select! {
        r = wait_for_instance(&c, id) => r?,
        _ = tokio::signal::ctrl_c() => {
            let _ = c.rpc("job-manager.cancel", 0, &json!({"id": id.0, "note": "alloc interrupted"})).await;
            return Err(format!("job {id}: canceled while waiting for resources"));
        }
    };
    // As salloc's "Granted job allocation": the job id, for `vigil jobs` and `vigil cancel` from elsewhere.
    // The nodes it got (a range -N MIN-MAX gets what was free).
    let n = match c.rpc("job-manager.info", 0, &json!({"id": id.0})).await {
        Ok(info) => info.pointer("/info/nnodes").and_then(Value::as_u64).unwrap_or(0),
        Err(_) => 0,
    };
    let n = if n > 0 { n } else { u64::from(a.opts.nodes.map_or(1, |n| n.min)) };
    eprintln!("vigil: job {id}: allocated {n} node{}", if n == 1 { "" } else { "s" });
    let code = run_in_allocation(&c, id, &uri, &a.command).await?;
    // Shut the child instance down and wait until the job is gone.
    if let Ok(child) = Client::connect(&uri).await {
        let _ = child.rpc("broker.shutdown", 0, &json!({"exit_code": code})).await;
    }
    let mut s = c.rpc_stream("job-manager.eventlog", 0, &json!({"id": id.0, "follow": true})).map_err(|e| e.errstr)?;
    while let Some(item) = s.next().await {
        if item.is_err() {
            break;
        }
    }
    Ok(code)
}

/// `vigil proxy`.
pub(crate) async fn proxy(a: ProxyArgs) -> Result<i32, String> {
    let id = JobId::parse(&a.id).map_err(|e| e.to_string())?;
    let c = connect().await?;
    let r = c
        .rpc("job-manager.info", 0, &json!({"id": id.0}))
        .await
        .map_err(|e| super::jobcmd::as_typed(e.errstr, &a.id))?;
    let uri = r["info"]["uri"]
        .as_str()
        .ok_or_else(|| format!("job {id} is not a running instance (no URI reported)"))?
        .to_string();
    if r["info"]["state"].as_str() != Some("RUN") {
        return Err(format!("job {id} is not running"));
    }
    run_with_uri(&uri, &a.command, &job_env(id, &r)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_and_directives() {
        assert_eq!(
            split_words(r#" -N 4  --output "a b.out" -S 'x=1 2'"#).unwrap(),
            vec!["-N", "4", "--output", "a b.out", "-S", "x=1 2"]
        );
        assert!(split_words("'open").is_err());
        let s = "#!/bin/sh\n# vigil: -N 4 -t 10m\n#vigil: -S tbon.topo=kary:2\n\necho hi\n# vigil: -N 9\n";
        let d = parse_directives(s).unwrap().unwrap();
        assert_eq!(d.nodes.map(|n| n.min), Some(4), "directives after the first command are ignored");
        assert_eq!(d.time_limit.as_deref(), Some("10m"));
        assert_eq!(d.setattr, vec!["tbon.topo=kary:2"]);
        assert!(parse_directives("#!/bin/sh\necho\n").unwrap().is_none());
        assert!(parse_directives("#!/bin/sh\n# vigil: --bogus\n").unwrap_err().contains("bogus"));
    }

    #[test]
    fn the_command_line_wins_over_directives() {
        let n = |n: u32| Some(super::super::jobcmd::NodeCount { min: n, max: n });
        let cli = InstanceOpts { nodes: n(2), ..Default::default() };
        let dir = InstanceOpts { nodes: n(4), time_limit: Some("5m".into()), ..Default::default() };
        // As sbatch: the command line's -N, the directive's -t where the command line gave none.
        let m = merge_opts(cli.clone(), Some(dir)).unwrap();
        assert_eq!((m.nodes, m.time_limit.as_deref()), (n(2), Some("5m")));
        let range =
            InstanceOpts { nodes: Some(super::super::jobcmd::NodeCount { min: 4, max: 5 }), ..Default::default() };
        assert_eq!(merge_opts(cli.clone(), Some(range.clone())).unwrap().nodes, n(2));
        // A refusal whatever the value comes before any conflict, from the command line or the script.
        let cyclic = InstanceOpts { taskmap: Some("cyclic".into()), ..cli.clone() };
        let e = merge_opts(cyclic, Some(range.clone())).unwrap_err();
        assert!(e.starts_with("--taskmap=cyclic: batch and alloc jobs run one broker per node"), "{e}");
        let e = merge_opts(cli.clone(), Some(InstanceOpts { ntasks: Some(3), ..range })).unwrap_err();
        assert!(e.starts_with("batch directive: -n is not supported"), "{e}");
        let same = InstanceOpts { nodes: n(2), time_limit: Some("5m".into()), ..Default::default() };
        let m = merge_opts(cli, Some(same)).unwrap();
        assert_eq!((m.nodes, m.time_limit.as_deref()), (n(2), Some("5m")));
    }

    /// `--tolerate-lost=K` (issue 40): 0 <= K < N, refused otherwise at submit naming the option; given to the
    /// child brokers as `broker.tolerate-lost`; the command line's wins over a directive's.
    #[test]
    fn tolerate_lost_is_checked_at_submit_and_given_to_the_child_brokers() {
        let n = |n: u32| Some(super::super::jobcmd::NodeCount { min: n, max: n });
        let with =
            |k: &str, nodes: u32| InstanceOpts { nodes: n(nodes), tolerate_lost: Some(k.into()), ..Default::default() };
        let spec = |o: &InstanceOpts| instance_jobspec(o, "batch", vec!["x".into()], None, None);
        for (k, nodes, want) in [
            ("-1", 5, "--tolerate-lost=-1: must be 0 or more"),
            ("5", 5, "--tolerate-lost=5: must be less than the job's node count (5)"),
            ("9", 5, "--tolerate-lost=9: must be less than the job's node count (5)"),
            ("x", 5, "--tolerate-lost=x: expected a count of nodes (0 or more)"),
            ("1", 1, "--tolerate-lost=1: must be less than the job's node count (1)"),
        ] {
            let e = spec(&with(k, nodes)).unwrap_err();
            assert!(e.starts_with(want), "{k} of {nodes}: {e}");
        }
        // A node range: the least count it may get.
        let range = InstanceOpts {
            nodes: Some(super::super::jobcmd::NodeCount { min: 2, max: 6 }),
            tolerate_lost: Some("2".into()),
            ..Default::default()
        };
        assert!(spec(&range).unwrap_err().contains("node count (2)"));
        for (k, nodes) in [("0", 1), ("1", 5), ("4", 5)] {
            assert!(spec(&with(k, nodes)).is_ok(), "{k} of {nodes}");
            assert_eq!(broker_args(&with(k, nodes)).unwrap(), vec![format!("--setattr=broker.tolerate-lost={k}")]);
        }
        assert!(broker_args(&InstanceOpts::default()).unwrap().is_empty(), "not given: the default, 0");
        let m = merge_opts(with("1", 5), Some(with("2", 5))).unwrap();
        assert_eq!(m.tolerate_lost.as_deref(), Some("1"), "the command line wins");
    }
}
