//! `vigil start` (a test instance on this machine) and `vigil broker` (one broker of a configured instance).

use super::{fail, parse_attrs};
use crate::attrs::{BrokerConfig, DetectorChoice, Transport};
use crate::broker::config::ConfigFile;
use crate::broker::{BrokerOptions, DriverOptions, ListenSpec};
use crate::hwloc::TopologySource;
use crate::keyfile::KeyFile as _;
use clap::Args;
use std::collections::BTreeMap;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Options of `vigil start`.
#[derive(Args, Debug)]
#[command(trailing_var_arg = true)]
pub struct StartArgs {
    /// Number of brokers to start on this machine.
    #[arg(long = "test-size", value_name = "N", default_value_t = 1)]
    pub test_size: u32,
    /// Set a broker attribute (repeatable), e.g. `-S tbon.topo=kary:2`, `-S resource.synthetic="pack:4 numa:1 core:24 pu:2"`.
    #[arg(short = 'S', long = "setattr", value_name = "ATTR=VAL")]
    pub setattr: Vec<String>,
    /// Initial program and its arguments (default: $SHELL).
    #[arg(value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// Options of `vigil broker`.
#[derive(Args, Debug)]
#[command(trailing_var_arg = true)]
pub struct BrokerArgs {
    /// TOML bootstrap file listing the instance's hosts (see docs/system-instance.md). Without it the broker
    /// bootstraps through PMI-1 (`PMI_FD`, `PMI_RANK`, `PMI_SIZE`), as the brokers of a batch or alloc job do.
    #[arg(long, value_name = "FILE")]
    pub config: Option<String>,
    /// Batch mode (PMI bootstrap): rank 0 runs `$VIGIL_JOB_TMPDIR/NAME` with the arguments after `--`.
    #[arg(long, value_name = "NAME")]
    pub job_script: Option<String>,
    /// Host name to look up in the config (default: this machine's).
    #[arg(long)]
    pub hostname: Option<String>,
    /// Rank to use, bypassing the host name lookup.
    #[arg(long)]
    pub rank: Option<u32>,
    /// Inherited, already bound overlay listener (used by `vigil start`).
    #[arg(long, value_name = "FD")]
    pub listen_fd: Option<i32>,
    /// Run directory for the local socket (default: /run/vigil or a temporary directory).
    #[arg(long)]
    pub rundir: Option<PathBuf>,
    /// Instance id shared by all brokers of the instance.
    #[arg(long)]
    pub instance: Option<String>,
    /// Set a broker attribute (repeatable).
    #[arg(short = 'S', long = "setattr", value_name = "ATTR=VAL")]
    pub setattr: Vec<String>,
    /// This node as `vigil discover-node` found it (used by `vigil start`, which discovers the machine once for
    /// all its brokers).
    #[arg(long, value_name = "FILE", hide = true)]
    pub discovered: Option<PathBuf>,
    /// Initial program (rank 0 only); without one, the instance runs until SIGTERM.
    #[arg(value_name = "COMMAND")]
    pub command: Vec<String>,
}

struct BrokerFormat {
    rank: u32,
}

impl<S, N> tracing_subscriber::fmt::FormatEvent<S, N> for BrokerFormat
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
        mut w: tracing_subscriber::fmt::format::Writer<'_>,
        ev: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        write!(w, "vigil-broker[{}]: {}: ", self.rank, ev.metadata().level().as_str().to_lowercase())?;
        ctx.field_format().format_fields(w.by_ref(), ev)?;
        writeln!(w)
    }
}

/// The broker's log destination: standard error, where a failed write (a closed pipe: `vigil start ... | head`,
/// a log collector gone) is dropped, never fatal. Logging must not take a broker, and with it an instance, down.
struct LossyStderr;

impl std::io::Write for LossyStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let _ = std::io::stderr().write_all(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        let _ = std::io::stderr().flush();
        Ok(())
    }
}

/// Sets up the broker's log and resolves `log-level` in `config`: as set, else `$VIGIL_LOG`, else `warn` (`error`
/// in a nested instance: see [`default_log_level`]) (an `EnvFilter` directive string), so that `vigil getattr
/// log-level` shows the level in effect.
fn init_logging(config: &mut BrokerConfig, rank: u32) {
    let level = config
        .log_level
        .clone()
        .or_else(|| std::env::var("VIGIL_LOG").ok())
        .unwrap_or_else(|| default_log_level(config.instance_level).into());
    config.log_level = Some(level.clone());
    let filter =
        tracing_subscriber::EnvFilter::try_new(&level).unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(|| LossyStderr)
        .log_internal_errors(false)
        .with_ansi(false)
        .event_format(BrokerFormat { rank })
        .try_init();
    tracing::debug!(rank, "logging at {level}");
}

/// The broker's log level when neither `log-level` nor `$VIGIL_LOG` says: `warn`, but `error` in a nested instance
/// (`instance-level` above 0). A nested broker's standard error is its job's, so its warnings would land in the
/// batch script's output file among the user's lines; what they say (a degraded detector, no cgroup) the
/// enclosing instance has already said on the same nodes, and `vigil uptime` inside the instance still shows it
/// (as Flux's brokers log only errors to standard error by default).
fn default_log_level(instance_level: u32) -> &'static str {
    if instance_level > 0 {
        "error"
    } else {
        "warn"
    }
}

fn hostname() -> String {
    nix::unistd::gethostname().ok().and_then(|h| h.into_string().ok()).unwrap_or_else(|| "localhost".into())
}

/// Loads a synthetic or XML node topology (`resource.synthetic` / `resource.xml`) once, so that a bad description
/// is one clear error here, not a failure of every broker.
fn check_topology(config: &BrokerConfig) -> Result<(), String> {
    if config.topology != TopologySource::Live {
        crate::hwloc::NodeTopology::load(&config.topology).map_err(|e| format!("resource topology: {e}"))?;
    }
    Ok(())
}

/// Parses and checks broker attributes ([`BrokerConfig::parse`]), plus what needs this machine:
/// `broker.detectors=ebpf` needs root.
pub(crate) fn check_attrs(attrs: &BTreeMap<String, String>) -> Result<BrokerConfig, String> {
    let config = BrokerConfig::parse(attrs).map_err(|e| e.to_string())?;
    if config.detectors == DetectorChoice::Ebpf && !nix::unistd::geteuid().is_root() {
        return Err("broker.detectors=ebpf needs root to load eBPF programs (use auto to fall back)".into());
    }
    Ok(config)
}

/// Brokers of a test instance per CPU of this machine up to which each runs its probes and heartbeats as on a
/// node of its own ([`packed_periods`]).
pub(super) const BROKERS_PER_CPU: u32 = 32;

/// The periodic detection work of `size` brokers packed onto this machine's `cpus` CPUs, where on a cluster each
/// would have a node of its own: every broker probes its parent's and children's nodes each `tbon.probe_period`
/// and heartbeats each `tbon.heartbeat_period`, and 257 idle brokers doing so at the node rates keep 2 CPUs busy
/// (measured: 98%, against 5% for 16), so that a job on them crawls and its verdicts wait on starved timers.
/// Beyond [`BROKERS_PER_CPU`] per CPU, the periods are multiplied by `k = ceil(size / (BROKERS_PER_CPU * cpus))`:
/// `tbon.probe_period`, `tbon.heartbeat_period` with `tbon.torpid_max` (together, so the heartbeat stays the
/// same fraction of the torpid window), and `tbon.stall_max` (the broker beats 4 times per window), each only where the user set none of them with `-S` (`set`; `m`: the
/// values in force). Returns `k` and the `ATTR=VALUE` settings to add (none when `k` is 1).
fn packed_periods(
    size: u32,
    cpus: u32,
    set: &BTreeMap<String, String>,
    m: &crate::membership::Config,
) -> (u32, Vec<String>) {
    let k = size.div_ceil(BROKERS_PER_CPU.saturating_mul(cpus.max(1))).max(1);
    if k == 1 {
        return (1, Vec::new());
    }
    // As `vigil getattr` prints durations: whole milliseconds below a second, else seconds.
    let ms = |s: f64| {
        let ms = (s * 1e3 * f64::from(k)).round();
        if ms < 1000.0 {
            format!("{ms}ms")
        } else {
            format!("{}s", ms / 1e3)
        }
    };
    let mut out = Vec::new();
    if !set.contains_key("tbon.probe_period") {
        out.push(format!("tbon.probe_period={}", ms(m.probe_period)));
    }
    // The torpid window in force afterwards (unscaled), which the stall window may not exceed.
    let mut torpid = m.torpid_max;
    if !set.contains_key("tbon.heartbeat_period") && !set.contains_key("tbon.torpid_max") {
        out.push(format!("tbon.heartbeat_period={}", ms(m.heartbeat_period)));
        out.push(format!("tbon.torpid_max={}", ms(m.torpid_max)));
        torpid *= f64::from(k);
    }
    if !set.contains_key("tbon.stall_max") {
        out.push(format!("tbon.stall_max={}", ms(m.stall_max.min(torpid / f64::from(k)))));
    }
    (if out.is_empty() { 1 } else { k }, out)
}

/// `vigil start`.
pub(super) fn start(a: StartArgs) -> i32 {
    match start_inner(a) {
        Ok(c) => c,
        Err(e) => fail(e),
    }
}

fn start_inner(a: StartArgs) -> Result<i32, String> {
    let mut config = check_attrs(&parse_attrs(&a.setattr)?)?;
    if config.allow_guest_users {
        return Err("access.allow-guest-users is for a system instance (vigil broker --config, [access] in its TOML \
             file): a personal instance serves its owner only (docs/security.md)"
            .into());
    }
    init_logging(&mut config, 0);
    if a.test_size == 0 {
        return Err("--test-size must be at least 1".into());
    }
    if a.test_size > 4096 {
        return Err("--test-size is limited to 4096 brokers on one machine".into());
    }
    let topo = config.topo;
    check_topology(&config)?;
    topo.check_depth(a.test_size)?;
    if a.test_size > 1 && config.transport == Transport::Rdma {
        return Err("tbon.transport=rdma: a test instance's overlay runs on loopback, which no verbs device serves; \
                    use auto or tcp (RDMA needs brokers bound to addresses of RDMA-capable interfaces, see docs/rdma.md)"
            .into());
    }
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
    let user_set = parse_attrs(&a.setattr)?;
    let (slower, packed) = packed_periods(a.test_size, cpus, &user_set, &config.membership);
    if slower > 1 {
        eprintln!(
            "vigil start: {} brokers share {cpus} CPUs: {} stretched {slower}x from the node defaults \
             (what -S sets is kept as set)",
            a.test_size,
            packed.join(", ")
        );
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the vigil binary: {e}"))?;
    let rundir = match &config.rundir {
        Some(d) => d.clone(),
        None => {
            let base = std::env::var("TMPDIR").unwrap_or_else(|_| "/tmp".into());
            PathBuf::from(base).join(format!(
                "vigil-{}-{}",
                std::process::id(),
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.subsec_nanos())
                    .unwrap_or(0)
            ))
        }
    };
    std::fs::create_dir_all(&rundir).map_err(|e| format!("cannot create {}: {e}", rundir.display()))?;
    // Removed however this function returns: an instance that fails to start leaves no empty run directory.
    let _rundir_guard = RemoveOnDrop(rundir.clone());
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(&rundir, std::fs::Permissions::from_mode(0o755));
    }
    // Bind every broker's overlay listener here, so no port can be taken between choosing and binding it.
    let mut listeners = Vec::new();
    let mut endpoints = Vec::new();
    for _ in 0..a.test_size {
        let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| format!("cannot bind a loopback port: {e}"))?;
        let port = l.local_addr().map_err(|e| e.to_string())?.port();
        endpoints.push(format!("tcp://127.0.0.1:{port}"));
        listeners.push(l);
    }
    let host = hostname();
    // The instance id: random, so that two test instances never take each other's brokers for their own.
    let mut rnd = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut rnd))
        .map_err(|e| format!("/dev/urandom: {e}"))?;
    let instance: String = rnd.iter().map(|b| format!("{b:02x}")).collect();
    // A fresh overlay key for this instance only, mode 0600 in the run directory (removed with it).
    let key_path = rundir.join("overlay.key");
    crate::keyfile::OverlayKey::generate().and_then(|k| k.write(&key_path, true)).map_err(|e| e.to_string())?;
    // JSON, not TOML: each broker reads the whole host list (`ConfigFile::load`).
    let hosts: Vec<serde_json::Value> =
        endpoints.iter().map(|ep| serde_json::json!({"host": host, "bind": ep, "connect": ep})).collect();
    let cfg = serde_json::json!({
        "bootstrap": {"instance": instance, "overlay_key": key_path.display().to_string(), "hosts": hosts},
        "tbon": {"topo": topo.to_string()},
    })
    .to_string();
    let cfg_path = rundir.join("config.json");
    {
        use std::io::Write as _;
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .mode(0o600)
            .open(&cfg_path)
            .map_err(|e| format!("cannot write {}: {e}", cfg_path.display()))?;
        f.write_all(cfg.as_bytes()).map_err(|e| format!("cannot write {}: {e}", cfg_path.display()))?;
    }

    let command = if a.command.is_empty() {
        vec![std::env::var("SHELL").unwrap_or_else(|_| "/bin/sh".into())]
    } else {
        a.command.clone()
    };
    // Every broker of a test instance runs on this machine: discover it once for all of them (hwloc costs each
    // ~20 ms of CPU), in a child process as a broker would.
    let discovered = rundir.join("node.json");
    let discovered = (config.discovery == crate::attrs::Discovery::Hwloc)
        .then(|| {
            crate::broker::discover_in_child_to(
                &exe,
                &config.topology,
                config.gpus,
                &rundir.join("topology.xml"),
                &discovered,
            )
            .map_err(|e| tracing::debug!("no shared node discovery ({e}); each broker discovers the node"))
            .ok()
        })
        .flatten()
        .map(|()| discovered);
    let mut children = Vec::new();
    for (rank, l) in listeners.into_iter().enumerate() {
        let mut cmd = std::process::Command::new(&exe);
        cmd.arg("broker")
            .arg(format!("--config={}", cfg_path.display()))
            .arg(format!("--rank={rank}"))
            .arg("--listen-fd=3")
            .arg(format!("--rundir={}", rundir.display()));
        for s in a.setattr.iter().chain(&packed) {
            cmd.arg(format!("--setattr={s}"));
        }
        if let Some(d) = &discovered {
            cmd.arg(format!("--discovered={}", d.display()));
        }
        // All brokers of a test instance share this machine: rank 0 loads the eBPF detectors once for all.
        if config.detector_rank.is_none() {
            cmd.arg("--setattr=broker.detector-rank=0");
        }
        if rank == 0 {
            cmd.arg("--").args(&command);
        } else {
            cmd.stdin(std::process::Stdio::null());
        }
        let fd = l.as_raw_fd();
        // SAFETY: between fork and exec we only call prctl, fcntl and dup2 (async-signal-safe) to tie the broker's
        // life to ours and place the listener at fd 3; dup2 clears FD_CLOEXEC on the new descriptor.
        unsafe {
            cmd.pre_exec(move || {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM as libc::c_ulong);
                if fd == 3 {
                    let flags = libc::fcntl(3, libc::F_GETFD);
                    libc::fcntl(3, libc::F_SETFD, flags & !libc::FD_CLOEXEC);
                } else if libc::dup2(fd, 3) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(|e| format!("cannot start broker {rank}: {e}"))?;
        drop(l);
        children.push(child);
    }
    // A Ctrl-C from the terminal reaches the initial program by itself (same foreground process group); one sent
    // with kill(2) to `vigil start` alone is handed to rank 0, which passes it on to the initial program.
    // SAFETY: setting signal dispositions; the handlers only store to atomics.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_int as *const () as libc::sighandler_t;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGINT, &sa, std::ptr::null_mut());
        libc::signal(libc::SIGQUIT, libc::SIG_IGN);
        libc::signal(libc::SIGTERM, on_term as *const () as libc::sighandler_t);
        libc::signal(libc::SIGHUP, on_term as *const () as libc::sighandler_t);
    }
    let code = wait_instance(&mut children, &rundir.join("up"));
    // A rank 0 killed outright (SIGKILL, OOM) could not end the initial program: do it here.
    if let Some(pg) =
        std::fs::read_to_string(rundir.join("initial.pgid")).ok().and_then(|s| s.trim().parse::<i32>().ok())
    {
        let pg = nix::unistd::Pid::from_raw(pg);
        if pg.as_raw() > 1 && nix::sys::signal::killpg(pg, None).is_ok() {
            let _ = nix::sys::signal::killpg(pg, nix::sys::signal::Signal::SIGTERM);
            std::thread::sleep(Duration::from_millis(100));
            let _ = nix::sys::signal::killpg(pg, nix::sys::signal::Signal::SIGKILL);
        }
    }
    Ok(code)
}

/// Removes a directory tree when dropped (the test instance's run directory).
struct RemoveOnDrop(PathBuf);

/// The name of a run directory a broker started by a foreign launcher makes in the temporary directory:
/// `vigil-pmi-INSTANCE-RANK-PID`.
const PMI_DIR_PREFIX: &str = "vigil-pmi-";

/// Remove the run directories of brokers started by a foreign launcher (`vigil-pmi-*-PID` in `tmp`) that are ours
/// and whose broker is gone (no `/proc/PID`): killed before they could remove their own.
fn remove_stale_pmi_dirs(tmp: &Path) {
    use std::os::unix::fs::MetadataExt;
    let uid = nix::unistd::getuid().as_raw();
    let Ok(rd) = std::fs::read_dir(tmp) else { return };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix(PMI_DIR_PREFIX).and_then(|r| r.rsplit('-').next()) else { continue };
        let Ok(pid) = pid.parse::<u32>() else { continue };
        let mine = e.metadata().is_ok_and(|m| m.is_dir() && m.uid() == uid);
        if mine && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

static TERMINATE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn on_term(_sig: libc::c_int) {
    TERMINATE.store(true, std::sync::atomic::Ordering::SeqCst);
}

static INTERRUPT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// SIGINT: hand it on only when a process sent it (`si_code` <= 0: kill, sigqueue, tkill); one from the
/// terminal (`SI_KERNEL`) has reached the initial program already.
extern "C" fn on_int(_sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
    let code = unsafe { info.as_ref().map_or(0, |i| i.si_code) };
    if code <= 0 {
        INTERRUPT.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Wait for rank 0; if another broker dies first with an error, tear the instance down.
/// SIGTERM or SIGHUP to `vigil start` is passed to rank 0, which shuts the instance down.
fn wait_instance(children: &mut [std::process::Child], up: &std::path::Path) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    let code_of = |s: std::process::ExitStatus| s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0));
    let mut rank0: Option<i32> = None;
    let mut failed: Option<(usize, i32)> = None;
    loop {
        for (r, c) in children.iter_mut().enumerate() {
            if let Ok(Some(st)) = c.try_wait() {
                if r == 0 && rank0.is_none() {
                    rank0 = Some(code_of(st));
                } else if r != 0 && failed.is_none() && rank0.is_none() && !st.success() && !up.exists() {
                    // Before the instance is up a dead broker means rank 0 would wait forever: give up.
                    // Afterwards rank 0 sees the lost rank itself and the instance carries on.
                    failed = Some((r, code_of(st)));
                }
            }
        }
        if rank0.is_some() || failed.is_some() {
            break;
        }
        if INTERRUPT.swap(false, std::sync::atomic::Ordering::SeqCst) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(children[0].id() as i32),
                nix::sys::signal::Signal::SIGINT,
            );
        }
        if TERMINATE.swap(false, std::sync::atomic::Ordering::SeqCst) {
            eprintln!("vigil: terminating the instance");
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(children[0].id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if let Some((r, c)) = failed {
        eprintln!("vigil: broker {r} exited with code {c}; shutting the instance down");
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(children[0].id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
    if rank0.is_some() {
        // Rank 0 is gone and nothing here restarts it: the brokers still running (those that never joined, when
        // rank 0 failed at start; those waiting out tbon.parent_grace with a state directory) stop now, not
        // after the deadline below.
        for c in children.iter_mut().skip(1) {
            if matches!(c.try_wait(), Ok(None)) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(c.id() as i32),
                    nix::sys::signal::Signal::SIGTERM,
                );
            }
        }
    }
    // Give the rest of the tree time to leave, then make sure nothing is left behind.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let mut all = true;
        for (r, c) in children.iter_mut().enumerate() {
            match c.try_wait() {
                Ok(Some(st)) => {
                    if r == 0 && rank0.is_none() {
                        rank0 = Some(code_of(st));
                    }
                }
                _ => all = false,
            }
        }
        if all {
            break;
        }
        if Instant::now() >= deadline {
            for c in children.iter_mut() {
                let _ = c.kill();
                let _ = c.wait();
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    match failed {
        // Rank 0 was terminated by us: report the broker that failed, not the SIGTERM.
        Some((_, c)) => c.max(1),
        None => rank0.unwrap_or(1),
    }
}

/// `vigil broker`.
pub(super) fn broker(a: BrokerArgs) -> i32 {
    let attrs = match parse_attrs(&a.setattr) {
        Ok(m) => m,
        Err(e) => return fail(e),
    };
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => return fail(format!("cannot start runtime: {e}")),
    };
    // A broker started by a foreign launcher makes its own run directory, removed when it ends.
    let mut own_rundir = None;
    let opts = match &a.config {
        Some(path) => config_bootstrap(&a, path, attrs.clone()),
        None => rt.block_on(pmi_bootstrap(&a, attrs.clone())).map(|(o, io, dir)| {
            own_rundir = dir;
            (o, io)
        }),
    };
    let (mut opts, io) = match opts {
        Ok(o) => o,
        Err(e) => return fail(e),
    };
    init_logging(&mut opts.config, opts.rank);
    // hwloc's libxml2 plugin would leave libstdc++ mapped for the life of the process that discovers the node
    // (the broker's `vigil discover-node` child, which inherits this, or the broker itself when that cannot run).
    // SAFETY: no thread has started yet (the runtime is a current-thread one and has spawned nothing).
    unsafe { crate::hwloc::skip_unused_plugins() };
    // One malloc arena for the whole broker. The detector loader thread parses the kernel's BTF (~10 MB of
    // short-lived heap); in a thread arena of its own that memory stayed resident for the broker's life, as
    // malloc_trim does not shrink the top of a thread arena. In the main arena the trim after loading returns it.
    // The broker's threads (core loop, responder, loader) hardly contend for the allocator.
    // SAFETY: mallopt only tunes the allocator; called before the runtime starts any thread.
    unsafe { libc::mallopt(libc::M_ARENA_MAX, 1) };
    // The broker's loop runs as a task, not as the `block_on` future itself: waking `block_on`'s future costs a
    // write to the runtime's eventfd (and an epoll event) every time, while waking a task from the same thread
    // is a queue push. The pumps wake the loop for every overlay message.
    let code = rt.block_on(async move {
        match tokio::spawn(crate::broker::run(opts, io)).await {
            Ok(code) => code,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => 1,
        }
    });
    drop(own_rundir);
    end_broker_process(rt, code)
}

/// The end of a broker process: its tasks dropped (links closed, except a libfabric endpoint, which is left to
/// the process's end: [`crate::broker::process_exiting`]), standard output and error flushed, then `_exit`.
///
/// Not `exit`: that runs the C libraries' destructors (libfabric's `fi_fini`, libibverbs', librdmacm's) while
/// threads the broker does not join may still run (the eBPF detector loader, which takes seconds on a slow
/// machine, and tokio's blocking pool); a destructor racing them, or tearing down a provider whose endpoint is
/// still open, crashes a broker that had shut down cleanly. Everything the broker must finish is finished by
/// now: the store's threads were stopped and joined, shells told, the run directory removed.
fn end_broker_process(rt: tokio::runtime::Runtime, code: i32) -> ! {
    use std::io::Write as _;
    crate::broker::process_exiting();
    // Not the runtime's drop, which waits for its blocking threads (a DNS lookup or file read under way).
    rt.shutdown_timeout(std::time::Duration::from_millis(100));
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // SAFETY: _exit ends the process at once; nothing after it runs.
    unsafe { libc::_exit(code) }
}

fn config_bootstrap(
    a: &BrokerArgs,
    path: &str,
    mut attrs: BTreeMap<String, String>,
) -> Result<(BrokerOptions, DriverOptions), String> {
    let cfg = ConfigFile::load(path).map_err(|e| e.to_string())?;
    let key_file = cfg.bootstrap.overlay_key.as_deref().ok_or_else(|| {
        format!(
            "{path}: bootstrap.overlay_key is not set: every overlay link is authenticated with a key file; make one \
             with `vigil keygen /etc/vigil/overlay.key`, copy it to every node (mode 0600) and name it as \
             overlay_key in [bootstrap] (see docs/system-instance.md)"
        )
    })?;
    let key = crate::keyfile::OverlayKey::load(std::path::Path::new(key_file)).map_err(|e| e.to_string())?;
    if let (Some(t), false) = (&cfg.tbon.topo, attrs.contains_key("tbon.topo") || attrs.contains_key("tbon.fanout")) {
        attrs.insert("tbon.topo".into(), t.clone());
    }
    if let Some(d) = &cfg.bootstrap.statedir {
        attrs.entry("statedir".into()).or_insert_with(|| d.clone());
    }
    if let Some(d) = &cfg.exec.alloc_tmpdir_base {
        attrs.entry("exec.alloc-tmpdir-base".into()).or_insert_with(|| d.clone());
    }
    if let Some(p) = &cfg.exec.imp {
        attrs.entry("exec.imp".into()).or_insert_with(|| p.clone());
    }
    if let Some(g) = cfg.access.allow_guest_users {
        attrs.entry("access.allow-guest-users".into()).or_insert_with(|| g.to_string());
    }
    for (k, v) in cfg.health.attrs() {
        attrs.entry(k.into()).or_insert(v);
    }
    let mut config = check_attrs(&attrs)?;
    let ranks = cfg.ranks().map_err(|e| e.to_string())?;
    let host = a.hostname.clone().unwrap_or_else(hostname);
    let rank = match a.rank {
        Some(r) if (r as usize) < ranks.len() => r,
        Some(r) => return Err(format!("--rank {r} is out of range: the config lists {} hosts", ranks.len())),
        None => cfg.rank_of(&host).map_err(|e| e.to_string())?,
    };
    check_topology(&config)?;
    // This host's `job_network` in its hosts entry, unless `-S tbon.job_network` set it; checked as `-S` is.
    if let (Some(jn), false) = (&ranks[rank as usize].job_network, attrs.contains_key("tbon.job_network")) {
        let one = BTreeMap::from([("tbon.job_network".to_string(), jn.clone())]);
        let checked = check_attrs(&one).map_err(|e| format!("{path}: bootstrap.hosts: job_network: {e}"))?;
        config.job_network = checked.job_network;
    }
    let listen = match a.listen_fd {
        Some(fd) => ListenSpec::Fd(fd),
        None => ListenSpec::Endpoint(ranks[rank as usize].bind.clone()),
    };
    let rundir = a
        .rundir
        .clone()
        .or_else(|| config.rundir.clone())
        .unwrap_or_else(|| PathBuf::from("/tmp").join(format!("vigil-broker-{rank}-{}", std::process::id())));
    let opts = BrokerOptions {
        rank,
        size: ranks.len() as u32,
        hostname: if a.rank.is_some() && a.hostname.is_none() { ranks[rank as usize].host.clone() } else { host },
        instance: a.instance.clone().or_else(|| cfg.bootstrap.instance.clone()).unwrap_or_else(|| "vigil".into()),
        endpoints: ranks.iter().map(|r| r.connect.clone()).collect(),
        hosts: ranks.iter().map(|r| r.host.clone()).collect(),
        rundir,
        initial_program: if rank == 0 && !a.command.is_empty() { Some(a.command.clone()) } else { None },
        resources_override: None,
        config,
    };
    Ok((opts, DriverOptions { listen, key, discovered: a.discovered.clone(), endpoints_exchanged: false }))
}

/// Bootstrap an instance through PMI (PMI-1 or PMI-2, see [`crate::pmi`]): every broker binds a port, puts its endpoint, and after the barrier
/// fetches those it may connect to (its parent's and its adoptive parents'). Two kinds of launcher:
/// - **A Vigil job** (batch/alloc: `$VIGIL_JOB_TMPDIR` is set): resources come from the enclosing job's R
///   (`$VIGIL_JOB_TMPDIR/R.json`), ranks renumbered from 0; the node's topology source from
///   `$VIGIL_NODE_TOPOLOGY`; the run directory is in the job's directory; the allocation's node-local
///   directory (`$VIGIL_ALLOC_TMPDIR`) becomes the `alloc-tmpdir` attribute, every job's `VIGIL_ALLOC_TMPDIR`.
/// - **Any other PMI launcher** (MPICH's hydra, Flux, Slurm's `srun --mpi=pmi2`...): each broker owns the whole
///   node it runs on (discovered as `vigil start` does), binds the address its host name resolves to (127.0.0.1
///   if that is a loopback address), and makes a private run directory under `$TMPDIR`, returned so that it is
///   removed when the broker ends. Rank 0 runs the command after `--`; its exit code is the broker's.
async fn pmi_bootstrap(
    a: &BrokerArgs,
    mut attrs: BTreeMap<String, String>,
) -> Result<(BrokerOptions, DriverOptions, Option<RemoveOnDrop>), String> {
    let parent_uri = std::env::var(crate::client::URI_ENV).ok();
    // Level 1 under a foreign launcher too (where Flux says 0): the instance lives in another system's allocation,
    // whose lost nodes do not come back, so it shrinks on a node loss as a Vigil batch job does.
    let mut level = 1u32;
    let mut bind_ip = "127.0.0.1".to_string();
    if let Some(uri) = &parent_uri {
        if let Ok(c) = crate::client::Client::connect(uri).await {
            let get = |name: &'static str| {
                let c = c.clone();
                async move {
                    c.rpc("broker.getattr", crate::message::NODEID_ANY, &serde_json::json!({"name": name}))
                        .await
                        .ok()
                        .and_then(|v| v["value"].as_str().map(str::to_string))
                }
            };
            if let Some(l) = get("instance-level").await.and_then(|l| l.parse::<u32>().ok()) {
                level = l + 1;
            }
            if let Some(ep) = get("tbon.endpoint").await {
                let hostport = ep.strip_prefix("tcp://").unwrap_or(&ep);
                if let Some((h, _)) = hostport.rsplit_once(':') {
                    if h != "0.0.0.0" && !h.is_empty() {
                        bind_ip = h.trim_matches(['[', ']']).to_string();
                    }
                }
            }
        }
    }
    attrs.entry("instance-level".into()).or_insert_with(|| level.to_string());
    if let Ok(id) = std::env::var("VIGIL_JOB_ID") {
        attrs.entry("jobid".into()).or_insert(id);
    }
    if let Some(u) = &parent_uri {
        attrs.entry("parent-uri".into()).or_insert_with(|| u.clone());
    }
    if std::env::var("PMI_FD").is_err() {
        return Err("no --config FILE given, and not started by a PMI launcher (PMI_FD is not set): see docs/system-instance.md".into());
    }
    let job_tmpdir = std::env::var("VIGIL_JOB_TMPDIR").ok().map(PathBuf::from);
    // A Vigil batch or alloc job: its shell on this node gave its tasks (this broker) the allocation's directory,
    // which every job of this instance shares.
    if let (Some(_), Ok(d)) = (&job_tmpdir, std::env::var(crate::shellproto::ALLOC_TMPDIR_ENV)) {
        if !d.is_empty() {
            attrs.insert("alloc-tmpdir".into(), d);
        }
    }
    if job_tmpdir.is_none() {
        if a.job_script.is_some() {
            return Err("--job-script names a script of a Vigil batch job, but VIGIL_JOB_TMPDIR is not set".into());
        }
        if parent_uri.is_none() {
            bind_ip = node_address();
        }
    }
    let mut pmi = crate::pmi::Client::from_env().map_err(|e| format!("no --config given and {e}"))?;
    tracing::debug!("bootstrap through {} (rank {} of {})", pmi.wire, pmi.rank, pmi.size);
    let (rank, size) = (pmi.rank, pmi.size);
    let listener =
        std::net::TcpListener::bind((bind_ip.as_str(), 0)).map_err(|e| format!("cannot bind {bind_ip}: {e}"))?;
    let port = listener.local_addr().map_err(|e| e.to_string())?.port();
    let me = format!("tcp://{bind_ip}:{port}");
    pmi.put(&format!("vigil.ep.{rank}"), &me).map_err(|e| e.to_string())?;
    if rank == 0 {
        let mut rnd = [0u8; 16];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut rnd))
            .map_err(|e| format!("/dev/urandom: {e}"))?;
        pmi.put("vigil.instance", &rnd.iter().map(|b| format!("{b:02x}")).collect::<String>())
            .map_err(|e| e.to_string())?;
        // The overlay key of this instance: made here, given to the other brokers through the launcher's KVS
        // (held in memory by the job shells and carried over the enclosing instance's encrypted overlay).
        let key = crate::keyfile::OverlayKey::generate().map_err(|e| e.to_string())?;
        pmi.put("vigil.key", &key.to_hex()).map_err(|e| e.to_string())?;
    }
    pmi.barrier().map_err(|e| e.to_string())?;
    let instance =
        pmi.get("vigil.instance").map_err(|e| e.to_string())?.ok_or("PMI: vigil.instance missing after barrier")?;
    let key = pmi.get("vigil.key").map_err(|e| e.to_string())?.ok_or("PMI: vigil.key missing after barrier")?;
    let key = crate::keyfile::OverlayKey::from_hex(&key).map_err(|e| format!("PMI: vigil.key: {e}"))?;
    // A nested instance's tree (Topology::nested_default): kary:32 with re-parenting, else the fewest routers. The
    // enclosing exec system judges a loss during start-up by the same rule (jobspec::NestedInstance).
    if !attrs.contains_key("tbon.topo") && !attrs.contains_key("tbon.fanout") {
        let reparent = attrs.get("tbon.reparent").map(String::as_str) != Some("off");
        attrs.insert("tbon.topo".into(), vigil_proto::topology::Topology::nested_default(size, reparent).to_string());
    }
    // The node's topology source, as the enclosing instance's broker on this node has it.
    if !attrs.contains_key("resource.synthetic") && !attrs.contains_key("resource.xml") {
        if let Ok(t) = std::env::var("VIGIL_NODE_TOPOLOGY") {
            if let Some(d) = t.strip_prefix("synthetic:") {
                attrs.insert("resource.synthetic".into(), d.into());
            } else if let Some(x) = t.strip_prefix("xml:") {
                attrs.insert("resource.xml".into(), x.into());
            } else if t == "cpu-count" {
                attrs.entry("resource.discovery".into()).or_insert_with(|| "cpu-count".into());
            }
        }
    }
    if let Ok(g) = std::env::var("VIGIL_NODE_GPUS") {
        attrs.entry("resource.gpus".into()).or_insert(g);
    }
    let config = check_attrs(&attrs)?;
    let topo = config.topo;
    let mut endpoints = vec![String::new(); size as usize];
    endpoints[rank as usize] = me;
    // The parent's endpoint, and those of every adoptive parent this broker may have to re-parent to: the
    // KVS is gone once the launcher's PMI is finalized. One that is absent belongs to a broker whose node was lost
    // before the exchange ended (a Vigil job's shells exchange without a lost shell's puts): left empty, it is
    // never asked to adopt this broker.
    for p in vigil_core::broker::reparent::parent_endpoints(topo, size, rank) {
        match pmi.get(&format!("vigil.ep.{p}")).map_err(|e| e.to_string())? {
            Some(ep) => endpoints[p as usize] = ep,
            None => tracing::info!("PMI: no endpoint for rank {p}: its node was lost during start-up"),
        }
    }
    pmi.finalize().map_err(|e| e.to_string())?;
    drop(pmi);

    let (tmpdir, own, mine) = match job_tmpdir {
        Some(tmpdir) => {
            // Resources: this rank's share of the enclosing job's R, renumbered from 0.
            let rtext =
                std::fs::read_to_string(tmpdir.join("R.json")).map_err(|e| format!("cannot read the job's R: {e}"))?;
            let r = crate::r::Rv1::parse(&rtext).map_err(|e| format!("the job's R: {e}"))?.renumber();
            let mine = r
                .to_ranks()
                .map_err(|e| e.to_string())?
                .into_iter()
                .find(|x| x.rank == rank)
                .ok_or_else(|| format!("rank {rank} is not in the job's R"))?;
            (tmpdir, None, Some(mine))
        }
        None => {
            // A foreign launcher: a private directory of this broker's, new (never one another user made first)
            // and mode 0700. Its name carries our pid, so that the next broker started here removes it if we are
            // killed (a launcher's SIGKILL) before we could.
            remove_stale_pmi_dirs(&std::env::temp_dir());
            let dir = std::env::temp_dir().join(format!(
                "{PMI_DIR_PREFIX}{}-{rank}-{}",
                &instance[..instance.len().min(12)],
                std::process::id()
            ));
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(&dir)
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
            (dir.clone(), Some(RemoveOnDrop(dir)), None)
        }
    };
    check_topology(&config)?;
    let initial_program = match (&a.job_script, rank) {
        (Some(name), 0) => {
            let mut v = vec![tmpdir.join(name).display().to_string()];
            v.extend(a.command.iter().cloned());
            Some(v)
        }
        (None, 0) if !a.command.is_empty() => Some(a.command.clone()),
        _ => None,
    };
    let hostname = match &mine {
        Some(m) if !m.hostname.is_empty() => m.hostname.clone(),
        _ => hostname(),
    };
    let opts = BrokerOptions {
        rank,
        size,
        hostname,
        instance,
        endpoints,
        hosts: Vec::new(),
        rundir: tmpdir.join("r"),
        initial_program,
        resources_override: mine.map(|m| (m.cores, m.gpus)),
        config,
    };
    // Every endpoint listed was bound before its broker put it, and the exchange has ended.
    let io = DriverOptions {
        listen: ListenSpec::Fd(std::os::fd::IntoRawFd::into_raw_fd(listener)),
        key,
        discovered: None,
        endpoints_exchanged: true,
    };
    Ok((opts, io, own))
}

/// The address a broker started by a foreign launcher binds and advertises: the first IPv4 address this host's
/// name resolves to that is not a loopback one, else 127.0.0.1 (every broker on this machine).
fn node_address() -> String {
    use std::net::ToSocketAddrs;
    (hostname().as_str(), 0)
        .to_socket_addrs()
        .ok()
        .and_then(|mut it| it.find(|a| a.is_ipv4() && !a.ip().is_loopback()))
        .map(|a| a.ip().to_string())
        .unwrap_or_else(|| "127.0.0.1".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    /// Up to 32 brokers per CPU nothing changes; beyond, the periods stretch by the packing factor, except what
    /// the user set, and heartbeat and torpid window move together.
    #[test]
    fn packed_test_instances_probe_and_heartbeat_less_often_unless_told() {
        let m = crate::membership::Config::default();
        let none = attrs(&[]);
        assert_eq!(packed_periods(64, 2, &none, &m), (1, vec![]));
        assert_eq!(packed_periods(1, 1, &none, &m), (1, vec![]));
        let (k, set) = packed_periods(257, 2, &none, &m);
        assert_eq!(k, 5);
        assert_eq!(
            set,
            ["tbon.probe_period=50ms", "tbon.heartbeat_period=250ms", "tbon.torpid_max=2.5s", "tbon.stall_max=375ms"]
        );
        // Each added setting is one the brokers accept, and keeps the heartbeat inside the torpid window.
        let parsed = BrokerConfig::parse(&attrs(&set.iter().map(|s| s.split_once('=').unwrap()).collect::<Vec<_>>()));
        assert!(parsed.is_ok(), "{parsed:?}");
        let (_, set) = packed_periods(257, 2, &attrs(&[("tbon.probe_period", "10ms")]), &m);
        assert_eq!(set, ["tbon.heartbeat_period=250ms", "tbon.torpid_max=2.5s", "tbon.stall_max=375ms"]);
        let (_, set) = packed_periods(257, 2, &attrs(&[("tbon.torpid_max", "1s")]), &m);
        assert_eq!(set, ["tbon.probe_period=50ms", "tbon.stall_max=375ms"]);
        // Never past a torpid window the user set shorter.
        let short = crate::membership::Config { torpid_max: 0.2, ..m };
        let (_, set) = packed_periods(257, 2, &attrs(&[("tbon.torpid_max", "200ms")]), &short);
        assert_eq!(set, ["tbon.probe_period=50ms", "tbon.stall_max=200ms"]);
        let all =
            attrs(&[("tbon.probe_period", "10ms"), ("tbon.heartbeat_period", "50ms"), ("tbon.stall_max", "75ms")]);
        assert_eq!(packed_periods(4096, 2, &all, &m), (1, vec![]), "everything set by the user: nothing added");
    }

    /// A nested instance's brokers keep warnings out of their job's output (its standard error) by default.
    #[test]
    fn nested_brokers_log_only_errors_by_default() {
        assert_eq!(default_log_level(0), "warn");
        assert_eq!(default_log_level(1), "error");
        assert_eq!(default_log_level(2), "error");
    }

    /// Only our own launcher run directories whose broker is gone are removed.
    #[test]
    fn stale_pmi_run_directories_of_dead_brokers_are_removed() {
        let tmp = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let me = std::process::id();
        let names = [format!("vigil-pmi-abc-1-{dead}"), format!("vigil-pmi-abc-2-{me}"), "vigil-pmi-x".into()];
        for n in &names {
            std::fs::create_dir(tmp.path().join(n)).unwrap();
            std::fs::write(tmp.path().join(n).join("local-1"), b"").unwrap();
        }
        remove_stale_pmi_dirs(tmp.path());
        let left: Vec<bool> = names.iter().map(|n| tmp.path().join(n).exists()).collect();
        assert_eq!(left, [false, true, true], "{names:?}");
    }

    #[test]
    fn check_attrs_refuses_bad_xdp_mode_read_only_and_conflicting_topology() {
        for bad in ["driver", "skb", "", "Native"] {
            assert!(check_attrs(&attrs(&[("broker.xdp_mode", bad)])).is_err(), "{bad}");
        }
        let e = check_attrs(&attrs(&[("tbon.topo", "kary:2"), ("tbon.fanout", "3")])).unwrap_err();
        assert!(e.contains("disagree"), "{e}");
        assert!(check_attrs(&attrs(&[("tbon.topo", "kary:3"), ("tbon.fanout", "3")])).is_ok());
        assert!(check_attrs(&attrs(&[("rank", "5")])).unwrap_err().contains("'rank' is read-only"));
    }
}
