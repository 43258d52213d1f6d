//! Shared helpers for the black-box instance tests (`instance_*.rs`).
//!
//! Every test gets its own temporary directory, which doubles as a marker: it is the `TMPDIR` of `vigil start`
//! (so the instance's rundir, every broker's command line and every job's environment contain it) and the
//! working directory of every command. On timeout or drop, every process whose command line or environment
//! contains the marker is killed, so nothing outlives a test.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Default timeout of one CLI command.
pub(crate) const CMD_TIMEOUT: Duration = Duration::from_secs(20);

/// The `vigil` binary under test.
pub(crate) fn vigil_bin() -> &'static str {
    env!("CARGO_BIN_EXE_vigil")
}

/// Directory of the `vigil` binary (where `vigil-shell` must be too).
pub(crate) fn bin_dir() -> PathBuf {
    Path::new(vigil_bin()).parent().expect("binary has a parent dir").to_path_buf()
}

/// What a finished (or killed) command left behind.
#[derive(Debug)]
pub(crate) struct Output {
    /// Exit code; 128+signal if killed by a signal; -1 if unknown.
    pub code: i32,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
    /// Wall time until the process exited (or was killed).
    pub elapsed: Duration,
    /// The watchdog killed it.
    pub timed_out: bool,
    /// Command line, for messages.
    pub what: String,
}

impl Output {
    /// One string with everything, for assertion messages.
    pub(crate) fn dump(&self) -> String {
        format!(
            "command: {}\nexit code: {} (timed out: {}, {:.2}s)\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.what,
            self.code,
            self.timed_out,
            self.elapsed.as_secs_f64(),
            self.stdout,
            self.stderr
        )
    }

    /// Assert exit code 0 and no timeout; returns self for chaining.
    #[track_caller]
    pub(crate) fn ok(&self) -> &Self {
        assert!(!self.timed_out && self.code == 0, "command failed:\n{}", self.dump());
        self
    }

    /// Assert the exit code; returns self.
    #[track_caller]
    pub(crate) fn code_is(&self, want: i32) -> &Self {
        assert!(!self.timed_out, "command timed out:\n{}", self.dump());
        assert_eq!(self.code, want, "unexpected exit code:\n{}", self.dump());
        self
    }

    /// Non-empty stdout lines.
    pub(crate) fn lines(&self) -> Vec<&str> {
        self.stdout.lines().filter(|l| !l.trim().is_empty()).collect()
    }

    /// stdout parsed as one JSON value.
    #[track_caller]
    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::from_str(self.stdout.trim())
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{}", self.dump()))
    }
}

fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

fn reader<R: Read + Send + 'static>(mut r: R) -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = r.read_to_end(&mut buf);
        let _ = tx.send(buf);
    });
    rx
}

fn exit_code(st: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    st.code().unwrap_or_else(|| st.signal().map(|s| 128 + s).unwrap_or(-1))
}

/// A spawned process in its own process group with captured output.
pub(crate) struct Running {
    child: Child,
    out: mpsc::Receiver<Vec<u8>>,
    err: mpsc::Receiver<Vec<u8>>,
    started: Instant,
    what: String,
    marker: Option<PathBuf>,
}

/// Spawn `cmd` in a new process group, stdin closed, stdout/stderr captured.
pub(crate) fn spawn(mut cmd: Command, marker: Option<&Path>) -> Running {
    let what = describe(&cmd);
    cmd.process_group(0).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("cannot spawn {what}: {e}"));
    let out = reader(child.stdout.take().expect("stdout"));
    let err = reader(child.stderr.take().expect("stderr"));
    Running { child, out, err, started: Instant::now(), what, marker: marker.map(Path::to_path_buf) }
}

impl Running {
    /// True once the process has exited.
    pub(crate) fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    /// Process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Wait up to `timeout`; on timeout kill the process group (and every marked process) and report it.
    pub(crate) fn wait(mut self, timeout: Duration) -> Output {
        let deadline = self.started + timeout;
        let mut timed_out = false;
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(st)) => break Some(st),
                Ok(None) => {}
                Err(_) => break None,
            }
            if Instant::now() >= deadline {
                timed_out = true;
                kill_group(self.child.id() as i32);
                if let Some(m) = &self.marker {
                    kill_marked(m);
                }
                break self.child.wait().ok();
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let elapsed = self.started.elapsed();
        // Output pipes may be held by stray descendants: do not wait for them forever.
        let until = Instant::now() + Duration::from_secs(if timed_out { 2 } else { 5 });
        let left = || until.saturating_duration_since(Instant::now());
        let stdout = String::from_utf8_lossy(&self.out.recv_timeout(left()).unwrap_or_default()).into_owned();
        let stderr = String::from_utf8_lossy(&self.err.recv_timeout(left()).unwrap_or_default()).into_owned();
        Output { code: status.map(exit_code).unwrap_or(-1), stdout, stderr, elapsed, timed_out, what: self.what }
    }
}

/// Run `cmd` to completion with a watchdog.
pub(crate) fn run(cmd: Command, timeout: Duration, marker: Option<&Path>) -> Output {
    spawn(cmd, marker).wait(timeout)
}

fn kill_group(pgid: i32) {
    // SAFETY: plain kill(2) of a process group we created; failure (already gone) is harmless.
    unsafe {
        libc::kill(-pgid, libc::SIGKILL);
    }
}

/// Processes (pid, command line) whose command line or environment contains `marker`, except this process.
pub(crate) fn marked_processes(marker: &Path) -> Vec<(i32, String)> {
    let needle = marker.as_os_str().as_encoded_bytes().to_vec();
    let me = std::process::id() as i32;
    let mut found = Vec::new();
    let Ok(rd) = std::fs::read_dir("/proc") else { return found };
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else { continue };
        if pid == me {
            continue;
        }
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if cmdline.is_empty() {
            continue; // kernel thread or zombie
        }
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        let hit = |hay: &[u8]| hay.windows(needle.len()).any(|w| w == needle.as_slice());
        if hit(&cmdline) || hit(&environ) {
            let cl = cmdline
                .split(|b| *b == 0)
                .map(|p| String::from_utf8_lossy(p).into_owned())
                .collect::<Vec<_>>()
                .join(" ");
            found.push((pid, cl.trim().to_string()));
        }
    }
    found
}

/// SIGKILL every process carrying `marker`.
pub(crate) fn kill_marked(marker: &Path) {
    for _ in 0..3 {
        let ps = marked_processes(marker);
        if ps.is_empty() {
            return;
        }
        for (pid, _) in ps {
            // SAFETY: kill(2) of a process found by its marker; it may already be gone.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Processes (pid, argv) whose argv is exactly `argv`.
pub(crate) fn processes_with_argv(argv: &[&str]) -> Vec<(i32, String)> {
    let want: Vec<u8> = argv.iter().flat_map(|a| a.bytes().chain(std::iter::once(0))).collect();
    let mut found = Vec::new();
    let Ok(rd) = std::fs::read_dir("/proc") else { return found };
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else { continue };
        if std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default() == want {
            found.push((pid, argv.join(" ")));
        }
    }
    found
}

/// A unique token for marker arguments (e.g. `sleep 100.<token>`).
pub(crate) fn unique_token() -> String {
    let n = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    format!("{}{:09}", std::process::id() % 100000, n)
}

/// Poll `f` every 50 ms until it returns true or `timeout` passes; returns whether it did.
pub(crate) fn wait_for(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A fresh temporary directory, world-readable (so a foreign uid can reach the sockets inside).
pub(crate) fn tempdir() -> tempfile::TempDir {
    let d = tempfile::Builder::new().prefix("vigil-it-").tempdir().expect("tempdir");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod tempdir");
    d
}

/// `PATH` with the binary directory first.
pub(crate) fn path_env() -> String {
    format!("{}:{}", bin_dir().display(), std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into()))
}

/// A `vigil` command with a clean environment for `dir` (TMPDIR and cwd = dir, no inherited VIGIL_*).
pub(crate) fn vigil_cmd(dir: &Path) -> Command {
    let mut c = Command::new(vigil_bin());
    for (k, _) in std::env::vars() {
        if k.starts_with("VIGIL_") {
            c.env_remove(k);
        }
    }
    c.env("TMPDIR", dir).env("PATH", path_env()).env_remove("RUST_LOG").current_dir(dir);
    c
}

/// Run `vigil start --test-size=N [-S a]... COMMAND...` to completion (a fresh tempdir as marker).
pub(crate) fn start_and_run(
    size: u32,
    attrs: &[&str],
    command: &[&str],
    timeout: Duration,
) -> (Output, tempfile::TempDir) {
    let dir = tempdir();
    let mut c = vigil_cmd(dir.path());
    c.arg("start").arg(format!("--test-size={size}"));
    for a in attrs {
        c.arg("-S").arg(a);
    }
    c.args(command);
    let out = run(c, timeout, Some(dir.path()));
    kill_marked(dir.path());
    (out, dir)
}

/// A running test instance whose initial program waits until it is told to stop; the test drives it from
/// outside with `VIGIL_URI`.
pub(crate) struct Instance {
    /// Temporary directory (marker, TMPDIR, cwd).
    pub dir: tempfile::TempDir,
    /// `VIGIL_URI` of rank 0.
    pub uri: String,
    /// Number of brokers.
    pub size: u32,
    running: Option<Running>,
}

impl Instance {
    /// Start `size` brokers with `-S` attributes and wait until the initial program runs.
    #[track_caller]
    pub(crate) fn start(size: u32, attrs: &[&str]) -> Instance {
        let dir = tempdir();
        let d = dir.path().display().to_string();
        let script = format!(
            "echo \"$VIGIL_URI\" > '{d}/uri.tmp' && mv '{d}/uri.tmp' '{d}/uri'; \
             while [ ! -e '{d}/stop' ]; do sleep 0.1; done; read code < '{d}/stop'; exit ${{code:-0}}"
        );
        let mut c = vigil_cmd(dir.path());
        c.arg("start").arg(format!("--test-size={size}"));
        for a in attrs {
            c.arg("-S").arg(a);
        }
        c.args(["sh", "-c", &script]);
        let mut running = spawn(c, Some(dir.path()));
        let uri_file = dir.path().join("uri");
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut poked = false;
        loop {
            if let Ok(u) = std::fs::read_to_string(&uri_file) {
                if !u.trim().is_empty() {
                    let uri = u.trim().to_string();
                    return Instance { dir, uri, size, running: Some(running) };
                }
            }
            if running.exited() || Instant::now() >= deadline {
                let out = running.wait(Duration::from_secs(1));
                kill_marked(dir.path());
                panic!("instance of {size} did not start:\n{}", out.dump());
            }
            if size == 1 && !poked {
                // Work around the size-1 start bug (see instance_topology::size1_instance_runs_initial_program):
                // rank 0 only starts the initial program after some input arrives, so connect to it once.
                poked = poke_local_socket(dir.path());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Path of rank 0's local socket.
    pub(crate) fn socket_path(&self) -> PathBuf {
        PathBuf::from(self.uri.strip_prefix("local://").unwrap_or(&self.uri))
    }

    /// A `vigil` command attached to this instance.
    pub(crate) fn cmd(&self) -> Command {
        let mut c = vigil_cmd(self.dir.path());
        c.env("VIGIL_URI", &self.uri);
        c
    }

    /// Run `vigil ARGS...` against the instance (default timeout).
    pub(crate) fn vigil(&self, args: &[&str]) -> Output {
        self.vigil_t(args, CMD_TIMEOUT)
    }

    /// Run `vigil ARGS...` against the instance with a timeout.
    pub(crate) fn vigil_t(&self, args: &[&str], timeout: Duration) -> Output {
        let mut c = self.cmd();
        c.args(args);
        run(c, timeout, None)
    }

    /// Spawn `vigil ARGS...` without waiting.
    pub(crate) fn vigil_spawn(&self, args: &[&str]) -> Running {
        let mut c = self.cmd();
        c.args(args);
        spawn(c, None)
    }

    /// `vigil job info ID` as JSON.
    #[track_caller]
    pub(crate) fn job_info(&self, id: &str) -> serde_json::Value {
        let o = self.vigil(&["job", "info", "--json", id]);
        o.ok();
        o.json()
    }

    /// `vigil submit ARGS...`, returning the job id.
    #[track_caller]
    pub(crate) fn submit(&self, args: &[&str]) -> String {
        let mut a = vec!["submit"];
        a.extend_from_slice(args);
        let o = self.vigil(&a);
        o.ok();
        let id = o.stdout.trim().to_string();
        assert!(id.starts_with('f') && !id.contains(char::is_whitespace), "bad job id:\n{}", o.dump());
        id
    }

    /// `vigil jobs -a --json` as the list of job objects.
    #[track_caller]
    pub(crate) fn jobs(&self) -> Vec<serde_json::Value> {
        let o = self.vigil(&["jobs", "-a", "--json"]);
        o.ok();
        o.json()["jobs"].as_array().cloned().unwrap_or_else(|| panic!("no jobs array:\n{}", o.dump()))
    }

    /// The job object of `id` (f58) from `vigil jobs -a --json`.
    #[track_caller]
    pub(crate) fn job(&self, id: &str) -> serde_json::Value {
        self.jobs()
            .into_iter()
            .find(|j| j["id_f58"].as_str() == Some(id))
            .unwrap_or_else(|| panic!("job {id} not listed"))
    }

    /// The job's state name (SCHED, RUN, INACTIVE...).
    pub(crate) fn state(&self, id: &str) -> String {
        self.job(id)["state"].as_str().unwrap_or("").to_string()
    }

    /// Wait until job `id` reaches `state` (up to `timeout`).
    pub(crate) fn wait_state(&self, id: &str, state: &str, timeout: Duration) -> bool {
        wait_for(timeout, || self.state(id) == state)
    }

    /// Stop the instance: the initial program exits with `code`. Returns `vigil start`'s output and the
    /// processes of the instance still alive 3 s after it exited (then kills them).
    pub(crate) fn stop_with(mut self, code: i32) -> (Output, Vec<(i32, String)>) {
        let _ = std::fs::write(self.dir.path().join("stop"), format!("{code}\n"));
        let r = self.running.take().expect("running");
        let out = r.wait(Duration::from_secs(30));
        wait_for(Duration::from_secs(3), || marked_processes(self.dir.path()).is_empty());
        let left = marked_processes(self.dir.path());
        (out, left)
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        if let Some(r) = self.running.take() {
            let _ = std::fs::write(self.dir.path().join("stop"), "0\n");
            let out = r.wait(Duration::from_secs(15));
            if std::thread::panicking() {
                // What the brokers said is what explains a failure that does not come back on a rerun.
                eprintln!("the instance's output:\n{}", out.dump());
            }
        }
        kill_marked(self.dir.path());
    }
}

/// A system instance on loopback, set up as an administrator would: an overlay key, a TOML file whose
/// `[bootstrap]` table names each broker's host and address, and brokers started one by one with
/// `vigil broker --rank=R` (run directory `DIR/rR`, a synthetic node of `cores` cores). Every broker the test
/// started is killed when it is dropped.
pub(crate) struct LoopbackSystem {
    /// Temporary directory (marker, TMPDIR, cwd), holding the key, the TOML file and the run directories.
    pub(crate) dir: tempfile::TempDir,
    /// The TOML file.
    pub(crate) config: PathBuf,
    /// Number of brokers.
    pub(crate) size: u32,
    /// Cores of each broker's synthetic node.
    cores: u32,
}

impl LoopbackSystem {
    /// Instance `name` of `size` brokers of `cores` cores each, in `dir` (from [`tempdir`]): `bootstrap` goes into
    /// the `[bootstrap]` table before `hosts` (e.g. `statedir = "..."\n`), `tables` after it (e.g.
    /// `[tbon]\ntopo = "kary:2"\n`).
    pub(crate) fn new(
        dir: tempfile::TempDir,
        name: &str,
        size: u32,
        cores: u32,
        bootstrap: &str,
        tables: &str,
    ) -> LoopbackSystem {
        let d = dir.path();
        let key = d.join("overlay.key");
        let mut c = vigil_cmd(d);
        c.arg("keygen").arg(&key);
        run(c, Duration::from_secs(10), None).ok();
        let hosts: Vec<String> = (0..size)
            .map(|r| {
                let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
                let p = l.local_addr().unwrap().port();
                format!("{{ host = \"n{r}\", bind = \"tcp://127.0.0.1:{p}\", connect = \"tcp://127.0.0.1:{p}\" }}")
            })
            .collect();
        let config = d.join("vigil.toml");
        std::fs::write(
            &config,
            format!(
                "[bootstrap]\ninstance = \"{name}\"\noverlay_key = \"{}\"\n{bootstrap}hosts = [ {} ]\n{tables}",
                key.display(),
                hosts.join(", ")
            ),
        )
        .unwrap();
        LoopbackSystem { dir, config, size, cores }
    }

    /// Rank `rank`'s run directory.
    pub(crate) fn rundir(&self, rank: u32) -> PathBuf {
        self.dir.path().join(format!("r{rank}"))
    }

    /// `VIGIL_URI` of rank 0.
    pub(crate) fn uri(&self) -> String {
        format!("local://{}", self.rundir(0).join("local-0").display())
    }

    /// Start `vigil broker --rank=RANK` (logging at info level) with `-S` attributes `attrs`.
    pub(crate) fn broker(&self, rank: u32, attrs: &[&str]) -> Running {
        let d = self.dir.path();
        let mut c = vigil_cmd(d);
        c.args(["broker", &format!("--rank={rank}")])
            .arg(format!("--config={}", self.config.display()))
            .arg(format!("--rundir={}", self.rundir(rank).display()))
            .args(["-S", &format!("resource.synthetic=pack:1 core:{} pu:1", self.cores), "-S", "log-level=info"]);
        for a in attrs {
            c.arg("-S").arg(a);
        }
        spawn(c, Some(d))
    }

    /// A `vigil` client command of rank 0, as the instance owner.
    pub(crate) fn client(&self, args: &[&str]) -> Output {
        let mut c = vigil_cmd(self.dir.path());
        c.env("VIGIL_URI", self.uri()).args(args);
        run(c, CMD_TIMEOUT, None)
    }

    /// Whether the instance comes up (every rank joined: `vigil uptime` says `run`) within 60 s.
    pub(crate) fn is_up(&self) -> bool {
        wait_for(Duration::from_secs(60), || {
            let o = self.client(&["uptime"]);
            o.code == 0 && o.stdout.contains(" run ")
        })
    }
}

impl Drop for LoopbackSystem {
    fn drop(&mut self) {
        kill_marked(self.dir.path());
    }
}

/// Connect once to a rank-0 local socket under `dir` (any `vigil-*/local-0`); true if connected.
pub(crate) fn poke_local_socket(dir: &Path) -> bool {
    let Ok(rd) = std::fs::read_dir(dir) else { return false };
    for e in rd.flatten() {
        let p = e.path().join("local-0");
        if p.exists() {
            if let Ok(mut s) = std::os::unix::net::UnixStream::connect(&p) {
                let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
                let mut b = [0u8; 64];
                let _ = s.read(&mut b);
                return true;
            }
        }
    }
    false
}

// ------------------------------------------------------------------------------------------- wire frames

/// Encode one overlay/local frame by hand (layout of runtime/proto/src/message.rs): u32 length of the rest, "VG",
/// version, type, flags, route count, u16 topic length, matchtag, nodeid, userid, errnum, seq (u32 each,
/// big-endian), route entries, topic, payload.
#[allow(clippy::too_many_arguments)]
pub(crate) fn encode_frame(
    version: u8,
    msgtype: u8,
    flags: u8,
    topic: &str,
    matchtag: u32,
    nodeid: u32,
    route: &[u32],
    payload: &[u8],
) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(b"VG");
    body.push(version);
    body.push(msgtype);
    body.push(flags);
    body.push(route.len() as u8);
    body.extend_from_slice(&(topic.len() as u16).to_be_bytes());
    for v in [matchtag, nodeid, 0, 0, 0] {
        body.extend_from_slice(&v.to_be_bytes());
    }
    for r in route {
        body.extend_from_slice(&r.to_be_bytes());
    }
    body.extend_from_slice(topic.as_bytes());
    body.extend_from_slice(payload);
    let mut f = (body.len() as u32).to_be_bytes().to_vec();
    f.extend_from_slice(&body);
    f
}

/// Message types on the wire.
pub(crate) const T_REQUEST: u8 = 1;
/// Response.
pub(crate) const T_RESPONSE: u8 = 2;
/// Event.
pub(crate) const T_EVENT: u8 = 3;
/// Control.
pub(crate) const T_CONTROL: u8 = 4;

/// A decoded frame: (type, topic, errnum, payload as JSON or Null).
#[derive(Debug)]
pub(crate) struct Frame {
    /// Message type.
    pub msgtype: u8,
    /// Topic.
    pub topic: String,
    /// Matchtag.
    pub matchtag: u32,
    /// Errnum.
    pub errnum: u32,
    /// Payload as JSON (Null if empty or not JSON).
    pub payload: serde_json::Value,
}

/// Read one frame; `Ok(None)` on EOF before a frame.
pub(crate) fn read_frame(r: &mut impl Read) -> std::io::Result<Option<Frame>> {
    let mut len = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        let n = r.read(&mut len[got..])?;
        if n == 0 {
            return if got == 0 { Ok(None) } else { Err(std::io::ErrorKind::UnexpectedEof.into()) };
        }
        got += n;
    }
    let len = u32::from_be_bytes(len) as usize;
    if !(28..=1 << 26).contains(&len) {
        return Err(std::io::Error::other(format!("bad frame length {len}")));
    }
    let mut b = vec![0u8; len];
    r.read_exact(&mut b)?;
    if &b[..2] != b"VG" {
        return Err(std::io::Error::other("bad magic"));
    }
    let nroute = b[5] as usize;
    let tlen = u16::from_be_bytes([b[6], b[7]]) as usize;
    let u = |o: usize| u32::from_be_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
    let t0 = 28 + 4 * nroute;
    let topic = String::from_utf8_lossy(&b[t0..t0 + tlen]).into_owned();
    let payload = serde_json::from_slice(&b[t0 + tlen..]).unwrap_or(serde_json::Value::Null);
    Ok(Some(Frame { msgtype: b[3], topic, matchtag: u(8), errnum: u(20), payload }))
}

/// After sending something bad: read (and ignore) frames until the peer closes the connection; true if it
/// closed (EOF or reset) within `timeout`, false if it stayed open.
pub(crate) fn peer_closes(s: &mut (impl Read + ?Sized), timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => return true, // reset
        }
        if Instant::now() >= deadline {
            return false;
        }
    }
}

/// Deterministic pseudo-random bytes (xorshift), never starting with a plausible frame.
pub(crate) fn junk(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.push((x >> 24) as u8);
    }
    if n > 5 {
        v[4] = b'X'; // never the "VG" magic
    }
    v
}

/// Write all of `data`, ignoring errors (the peer may have closed already).
pub(crate) fn send_all(w: &mut impl Write, data: &[u8]) {
    let _ = w.write_all(data);
    let _ = w.flush();
}
