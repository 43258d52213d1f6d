//! `vigil-imp` run directly, as root, as a broker would run it (issue 37): the test makes users of its own
//! (`useradd`, `groupadd`; removed after, also when it fails), starts a `munged` of its own (its own key, socket,
//! pid and log files in a temporary directory; killed after), makes a cgroup under the cgroup2 hierarchy, and
//! checks:
//! - a good credential of user A runs the shell as A, with A's groups, in the job's cgroup, with the rest of
//!   standard input and only the environment it should have;
//! - a credential for another jobspec, another user or another instance, a replayed one, an expired one and one
//!   made with another munge key are refused, each with munge's or our reason, and run nothing;
//! - root, a shell outside `allowed-shells` and a cgroup outside `cgroup-root` are refused before the credential
//!   is decoded (it stays usable);
//! - run by a user other than the configured broker user it refuses and changes nothing (the credential is still
//!   good after, nothing joined the cgroup);
//! - a configuration that is missing, world- or group-writable, not root's, a symbolic link, or in a directory
//!   another user owns is refused; set up setuid root, `$VIGIL_IMP_CONFIG` is ignored.
//!
//! Skipped, saying why, when not root, or without munge (`munged`, `munge`: Debian's `munge`) for the
//! credential checks.

use sha2::{Digest, Sha256};
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const IMP: &str = env!("CARGO_BIN_EXE_vigil-imp");
const INSTANCE: &str = "imptest";

fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

fn have(program: &str) -> bool {
    Command::new("sh").args(["-c", &format!("command -v {program}")]).output().is_ok_and(|o| o.status.success())
}

fn sha256_hex(b: &[u8]) -> String {
    Sha256::digest(b).iter().map(|b| format!("{b:02x}")).collect()
}

/// A short name of our own for users, groups and cgroups.
fn token() -> String {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
    format!("{:x}{:x}", std::process::id(), t % 0xfffff)
}

fn run(cmd: &mut Command) -> Output {
    cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"))
}

/// Users `a` and `b`, `a` also in a group of its own making; removed when dropped.
struct Users {
    a: String,
    b: String,
    group: String,
}

impl Users {
    fn create() -> Option<Users> {
        let t = token();
        let u = Users { a: format!("vimpa{t}"), b: format!("vimpb{t}"), group: format!("vimpg{t}") };
        let ok = |c: &mut Command| match c.output() {
            Ok(o) if o.status.success() => true,
            Ok(o) => {
                eprintln!("{c:?}: {}: skipped", String::from_utf8_lossy(&o.stderr).trim());
                false
            }
            Err(e) => {
                eprintln!("{c:?}: {e}: skipped");
                false
            }
        };
        let add = |name: &str, extra: &[&str]| {
            ok(Command::new("useradd").args(["-M", "-s", "/bin/sh", "-d", "/nonexistent"]).args(extra).arg(name))
        };
        if !ok(Command::new("groupadd").arg(&u.group)) || !add(&u.a, &["-G", &u.group]) || !add(&u.b, &[]) {
            return None;
        }
        Some(u)
    }

    fn uid(name: &str) -> u32 {
        let o = run(Command::new("id").args(["-u", name]));
        String::from_utf8_lossy(&o.stdout).trim().parse().expect("a uid")
    }
}

impl Drop for Users {
    fn drop(&mut self) {
        for n in [&self.a, &self.b] {
            let _ = Command::new("userdel").arg(n).output();
        }
        let _ = Command::new("groupdel").arg(&self.group).output();
    }
}

/// A munged of the test's own, killed when dropped.
struct Munged {
    dir: tempfile::TempDir,
}

impl Munged {
    fn start() -> Munged {
        let dir = tempfile::Builder::new().prefix("vigil-imp-munge").tempdir().expect("tempdir");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let key = dir.path().join("munge.key");
        let mut bytes = vec![0u8; 1024];
        std::fs::File::open("/dev/urandom").and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes)).unwrap();
        std::fs::write(&key, &bytes).unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        let m = Munged { dir };
        let p = |f: &str| format!("{}", m.dir.path().join(f).display());
        let o = run(Command::new("munged").args([
            "--force",
            &format!("--socket={}", p("munge.socket")),
            &format!("--key-file={}", p("munge.key")),
            &format!("--pid-file={}", p("munged.pid")),
            &format!("--log-file={}", p("munged.log")),
            &format!("--seed-file={}", p("munged.seed")),
        ]));
        assert!(o.status.success(), "munged: {}", String::from_utf8_lossy(&o.stderr));
        let t0 = Instant::now();
        while !m.socket().exists() {
            assert!(t0.elapsed() < Duration::from_secs(10), "munged's socket did not appear");
            std::thread::sleep(Duration::from_millis(20));
        }
        m
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("munge.socket")
    }

    /// A credential made by `user` (`munge -s`), with time-to-live `ttl` seconds.
    fn encode(&self, user: &str, payload: &str, ttl: u32) -> String {
        let o = run(Command::new("setpriv")
            .args([&format!("--reuid={user}"), &format!("--regid={}", gid_of(user)), "--init-groups", "munge"])
            .arg("-S")
            .arg(self.socket())
            .args(["-s", payload, "-t", &ttl.to_string()]));
        assert!(o.status.success(), "munge as {user}: {}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8(o.stdout).unwrap().trim().to_string()
    }
}

impl Drop for Munged {
    fn drop(&mut self) {
        if let Ok(pid) = std::fs::read_to_string(self.dir.path().join("munged.pid")) {
            if let Ok(pid) = pid.trim().parse::<i32>() {
                // SAFETY: kill(2) on the munged this test started.
                unsafe { libc::kill(pid, libc::SIGTERM) };
            }
        }
    }
}

fn gid_of(user: &str) -> String {
    String::from_utf8(run(Command::new("id").args(["-g", user])).stdout).unwrap().trim().to_string()
}

/// The payload `vigil submit` makes (the client crate's `munge` module).
fn payload(instance: &str, jobspec: &[u8]) -> String {
    format!("vigil-imp-credential 1\ninstance={instance}\njobspec-sha256={}\n", sha256_hex(jobspec))
}

/// A cgroup of the test's own under the cgroup2 hierarchy, with a `job` cgroup in it; removed when dropped.
struct Cgroup {
    root: PathBuf,
}

impl Cgroup {
    fn create() -> Option<Cgroup> {
        let base = Path::new("/sys/fs/cgroup/unified");
        let base = if base.join("cgroup.procs").exists() { base } else { Path::new("/sys/fs/cgroup") };
        let root = base.join(format!("vigil-imp-test-{}", token()));
        match std::fs::create_dir(&root).and_then(|()| std::fs::create_dir(root.join("job"))) {
            Ok(()) => Some(Cgroup { root }),
            Err(e) => {
                eprintln!("cannot make a cgroup under {}: {e}: the cgroup is left out", base.display());
                let _ = std::fs::remove_dir(&root);
                None
            }
        }
    }

    fn job(&self) -> PathBuf {
        self.root.join("job")
    }

    fn procs(&self) -> String {
        std::fs::read_to_string(self.job().join("cgroup.procs")).unwrap()
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let t0 = Instant::now();
        // The shell's processes may take a moment to be gone from it.
        while std::fs::remove_dir(self.job()).is_err() && t0.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = std::fs::remove_dir(&self.root);
    }
}

/// A directory for configurations (mode 0755, so that other users can reach what is in it).
fn confdir() -> tempfile::TempDir {
    let d = tempfile::Builder::new().prefix("vigil-imp-conf").tempdir().expect("tempdir");
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    d
}

/// Write configuration `text` at `dir/name`, mode 0644.
fn write_config(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
    p
}

/// Run `vigil-imp exec SHELL ARGS...` (as `user` if given, else root) with config `conf` and `stdin`.
fn imp(user: Option<&str>, conf: &Path, shell_and_args: &[&str], stdin: &[u8]) -> Output {
    imp_at(IMP, user, conf, shell_and_args, stdin)
}

fn imp_at(program: &str, user: Option<&str>, conf: &Path, shell_and_args: &[&str], stdin: &[u8]) -> Output {
    let mut c = match user {
        Some(u) => {
            let mut c = Command::new("setpriv");
            c.args([&format!("--reuid={u}"), &format!("--regid={}", gid_of(u)), "--init-groups", program]);
            c
        }
        None => Command::new(program),
    };
    c.arg("exec")
        .args(shell_and_args)
        .env("VIGIL_IMP_CONFIG", conf)
        .env("VIGIL_TEST_KEEP", "kept")
        .env("NOT_VIGIL", "dropped")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap_or_else(|e| panic!("{c:?}: {e}"));
    // A refusal may come before all is read.
    let _ = child.stdin.take().unwrap().write_all(stdin);
    child.wait_with_output().unwrap()
}

/// A request for `uid`'s job `jobspec` with `credential`, in cgroup `cgroup`, followed by `rest` (the shell's).
fn request(uid: u32, cgroup: Option<&Path>, credential: &str, jobspec: &[u8], rest: &[u8]) -> Vec<u8> {
    let mut r = format!("vigil-imp 1\nuid={uid}\n");
    if let Some(c) = cgroup {
        r += &format!("cgroup={}\n", c.display());
    }
    r += &format!("credential={credential}\njobspec-bytes={}\n\n", jobspec.len());
    let mut r = r.into_bytes();
    r.extend_from_slice(jobspec);
    r.extend_from_slice(rest);
    r
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Assert `o` is a refusal with exit code `code` whose message holds `want`, and that nothing ran.
#[track_caller]
fn refused(o: &Output, code: i32, want: &str) {
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(code), "stderr: {err} stdout: {}", text(&o.stdout));
    assert!(err.contains(want), "wanted '{want}' in: {err}");
    assert!(o.stdout.is_empty(), "the shell ran: {}", text(&o.stdout));
}

const SHELL_SCRIPT: &str =
    "id -u; id -G; grep '^0::' /proc/self/cgroup; echo \"$VIGIL_IMP_JOBSPEC_SHA256\"; env | sort; cat";

#[test]
fn credentials_are_checked_before_the_shell_runs_as_its_user() {
    if !is_root() {
        eprintln!("skipped: vigil-imp's tests run as root");
        return;
    }
    if !have("munged") || !have("munge") {
        eprintln!("skipped: munge is not installed (apt-get install munge)");
        return;
    }
    let Some(users) = Users::create() else { return };
    let munged = Munged::start();
    let other_key = Munged::start();
    let cg = Cgroup::create();
    let (ua, ub) = (Users::uid(&users.a), Users::uid(&users.b));
    let dir = confdir();
    let mut conf = format!(
        "instance = '{INSTANCE}'\nbroker-user = 'root'\nallowed-shells = ['/bin/sh']\nmunge-socket = '{}'\n",
        munged.socket().display()
    );
    if let Some(c) = &cg {
        conf += &format!("cgroup-root = '{}'\n", c.root.display());
    }
    let conf = write_config(dir.path(), "imp.toml", &conf);
    let job = cg.as_ref().map(Cgroup::job);
    let jobspec = br#"{"version":1,"tasks":[{"command":["id"]}]}"#;
    let sh = ["/bin/sh", "-c", SHELL_SCRIPT];

    // Run by someone other than the broker user: refused before anything, and nothing changes.
    let good = munged.encode(&users.a, &payload(INSTANCE, jobspec), 300);
    let o = imp(Some(&users.b), &conf, &sh, &request(ua, job.as_deref(), &good, jobspec, b""));
    refused(&o, 66, &format!("run by uid {ub}, but only the broker user root (uid 0) may run it"));
    // Refused before the credential is decoded: a root job, a shell outside allowed-shells, a cgroup elsewhere.
    let root_cred = munged.encode("root", &payload(INSTANCE, jobspec), 300);
    refused(&imp(None, &conf, &sh, &request(0, None, &root_cred, jobspec, b"")), 67, "may not run as root");
    let bash = ["/bin/bash", "-c", "id -u"];
    refused(&imp(None, &conf, &bash, &request(ua, None, &good, jobspec, b"")), 67, "not one of allowed-shells");
    if cg.is_some() {
        let elsewhere = Path::new("/sys/fs/cgroup/unified");
        let o = imp(None, &conf, &sh, &request(ua, Some(elsewhere), &good, jobspec, b""));
        refused(&o, 67, "is not under cgroup-root");
    }
    if let Some(c) = &cg {
        assert_eq!(c.procs(), "", "nothing joined the job's cgroup");
    }

    // The good credential still works after all that: A's shell, as A, in the job's cgroup.
    let o = imp(None, &conf, &sh, &request(ua, job.as_deref(), &good, jobspec, b"the shell's input\n"));
    let out = text(&o.stdout);
    assert!(o.status.success(), "stderr: {} stdout: {out}", text(&o.stderr));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], ua.to_string(), "{out}");
    let want_groups = text(&run(Command::new("id").args(["-G", &users.a])).stdout);
    assert_eq!(lines[1], want_groups.trim(), "A's groups: {out}");
    assert!(want_groups.split_whitespace().count() >= 2, "A is in a group of its own too: {want_groups}");
    if let Some(c) = &cg {
        let rel = c.job().strip_prefix("/sys/fs/cgroup/unified").unwrap_or(&c.job()).display().to_string();
        assert!(lines[2].ends_with(&rel), "in the job's cgroup {rel}: {out}");
    }
    assert!(out.contains(&sha256_hex(jobspec)), "the checked jobspec's SHA-256: {out}");
    assert!(out.contains("VIGIL_TEST_KEEP=kept") && !out.contains("NOT_VIGIL"), "the environment: {out}");
    assert!(out.contains(&format!("USER={}", users.a)) && out.contains("PATH=/usr/local/bin:/usr/bin:/bin"));
    assert!(out.ends_with("the shell's input\n"), "the rest of standard input is the shell's: {out}");

    // Decoded before on this node (a job requeued here, or another of its nodes sharing this munged): good
    // within credential-max-age, as A again (rank 0 refuses a credential sent with a second submission).
    let o = imp(None, &conf, &sh, &request(ua, job.as_deref(), &good, jobspec, b""));
    assert!(o.status.success(), "a requeue: {}", text(&o.stderr));
    assert_eq!(text(&o.stdout).lines().next(), Some(ua.to_string().as_str()));
    // Another jobspec.
    let other = munged.encode(&users.a, &payload(INSTANCE, b"{\"other\":1}"), 300);
    refused(&imp(None, &conf, &sh, &request(ua, None, &other, jobspec, b"")), 68, "covers another jobspec");
    // Another user's credential for A's job.
    let bs = munged.encode(&users.b, &payload(INSTANCE, jobspec), 300);
    let o = imp(None, &conf, &sh, &request(ua, None, &bs, jobspec, b""));
    refused(&o, 68, &format!("made by uid {ub}, but the job's user is uid {ua}"));
    // Another instance.
    let inst = munged.encode(&users.a, &payload("elsewhere", jobspec), 300);
    refused(&imp(None, &conf, &sh, &request(ua, None, &inst, jobspec, b"")), 68, "for instance 'elsewhere'");
    // Another munge key.
    let foreign = other_key.encode(&users.a, &payload(INSTANCE, jobspec), 300);
    refused(&imp(None, &conf, &sh, &request(ua, None, &foreign, jobspec, b"")), 68, "EMUNGE_CRED_INVALID");
    // Forged: not a credential at all.
    let o = imp(None, &conf, &sh, &request(ua, None, "MUNGE:AAAAforged:", jobspec, b""));
    refused(&o, 68, "credential refused");
    // Past its TTL of 1 s (a job that waited in the queue): good within credential-max-age (default 7 days);
    // past a credential-max-age of 1 s, refused, saying how old it is and the limit.
    let short = munged.encode(&users.a, &payload(INSTANCE, jobspec), 1);
    let short2 = munged.encode(&users.a, &payload(INSTANCE, jobspec), 1);
    std::thread::sleep(Duration::from_millis(2500));
    let o = imp(None, &conf, &sh, &request(ua, None, &short, jobspec, b""));
    assert!(o.status.success(), "past munge's TTL: {}", text(&o.stderr));
    let strict = write_config(dir.path(), "strict.toml", &format!("{}credential-max-age = 1\n", fs_text(&conf)));
    let o = imp(None, &strict, &sh, &request(ua, None, &short2, jobspec, b""));
    refused(&o, 68, "more than credential-max-age (1 s) allows (EMUNGE_CRED_EXPIRED)");
    if let Some(c) = &cg {
        assert_eq!(c.procs(), "", "no refused run joined the job's cgroup");
    }
}

#[test]
fn unsafe_or_missing_configurations_are_refused() {
    if !is_root() {
        eprintln!("skipped: vigil-imp's tests run as root");
        return;
    }
    let Some(users) = Users::create() else { return };
    let dir = confdir();
    let good = "instance = 'x'\nbroker-user = 'root'\nallowed-shells = ['/bin/sh']\n";
    let sh = ["/bin/sh", "-c", "id -u"];
    let req = request(0, None, "MUNGE:x:", b"{}", b"");
    let conf = |name: &str, mode: u32| {
        let p = write_config(dir.path(), name, good);
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p
    };
    refused(&imp(None, &conf("world", 0o646), &sh, &req), 65, "writable by root only");
    refused(&imp(None, &conf("group", 0o664), &sh, &req), 65, "writable by root only");
    let theirs = conf("theirs", 0o644);
    run(Command::new("chown").arg(&users.a).arg(&theirs));
    refused(&imp(None, &theirs, &sh, &req), 65, "must be owned by root");
    refused(&imp(None, &dir.path().join("missing.toml"), &sh, &req), 65, "cannot open its configuration");
    let link = dir.path().join("link.toml");
    std::os::unix::fs::symlink(conf("target", 0o644), &link).unwrap();
    refused(&imp(None, &link, &sh, &req), 65, "cannot open its configuration");
    let sub = dir.path().join("sub");
    std::fs::create_dir(&sub).unwrap();
    let inside = write_config(&sub, "imp.toml", good);
    run(Command::new("chown").arg(&users.a).arg(&sub));
    refused(&imp(None, &inside, &sh, &req), 65, "which is not root's or which others may write to");
    refused(&imp(None, &conf("bad", 0o644), &["/bin/sh"], b"not a request\nuid=0\n"), 67, "does not start with");
    std::fs::write(dir.path().join("bad"), "instance = 'x'\n").unwrap();
    refused(&imp(None, &dir.path().join("bad"), &sh, &req), 65, "broker-user");
    // Run by another user than the broker user: refused, before its standard input is read.
    refused(&imp(Some(&users.b), &conf("ok", 0o644), &sh, &req), 66, "only the broker user root");

    // Installed setuid root, it ignores $VIGIL_IMP_CONFIG: B, named the broker user there, is still refused.
    let setuid = dir.path().join("vigil-imp");
    std::fs::copy(IMP, &setuid).unwrap();
    std::fs::set_permissions(&setuid, std::fs::Permissions::from_mode(0o4755)).unwrap();
    let b_conf = write_config(dir.path(), "b.toml", &good.replace("'root'", &format!("'{}'", users.b)));
    let o = imp_at(setuid.to_str().unwrap(), Some(&users.b), &b_conf, &sh, &req);
    let err = text(&o.stderr);
    assert_ne!(o.status.code(), Some(0), "{err}");
    assert!(o.stdout.is_empty(), "{}", text(&o.stdout));
    assert!(!err.contains(&b_conf.display().to_string()), "setuid, it read $VIGIL_IMP_CONFIG: {err}");
    if !Path::new("/etc/vigil/imp.toml").exists() {
        assert!(err.contains("/etc/vigil/imp.toml") && o.status.code() == Some(65), "{err}");
    }
}

/// Run `vigil-imp kill ARGS...` (as `user` if given, else root) with config `conf`.
fn imp_kill(user: Option<&str>, conf: &Path, args: &[&str]) -> Output {
    let mut c = match user {
        Some(u) => {
            let mut c = Command::new("setpriv");
            c.args([&format!("--reuid={u}"), &format!("--regid={}", gid_of(u)), "--init-groups", IMP]);
            c
        }
        None => Command::new(IMP),
    };
    c.arg("kill").args(args).env("VIGIL_IMP_CONFIG", conf).stdin(Stdio::null());
    c.output().unwrap_or_else(|e| panic!("{c:?}: {e}"))
}

/// `vigil-imp kill` signals the processes of a job's cgroup under `cgroup-root` (or one of them), for the broker
/// user only, and nothing elsewhere.
#[test]
fn kill_signals_a_jobs_cgroup_under_cgroup_root_only() {
    if !is_root() {
        eprintln!("skipped: vigil-imp's tests run as root");
        return;
    }
    let Some(users) = Users::create() else { return };
    let Some(cg) = Cgroup::create() else { return };
    let dir = confdir();
    let conf = format!(
        "instance = '{INSTANCE}'\nbroker-user = 'root'\nallowed-shells = ['/bin/sh']\ncgroup-root = '{}'\n",
        cg.root.display()
    );
    let conf = write_config(dir.path(), "imp.toml", &conf);
    // Two processes in the job's cgroup, one outside it.
    let start_in = |cgroup: Option<&Path>| {
        let join = cgroup.map(|d| format!("echo $$ > {}/cgroup.procs && ", d.display())).unwrap_or_default();
        Command::new("sh").arg("-c").arg(format!("{join}exec sleep 60")).spawn().expect("sleep")
    };
    let job = cg.job();
    let (mut t1, mut t2, mut outside) = (start_in(Some(&job)), start_in(Some(&job)), start_in(None));
    let t0 = Instant::now();
    while cg.procs().lines().count() < 2 {
        assert!(t0.elapsed() < Duration::from_secs(10), "the sleeps did not join the job's cgroup");
        std::thread::sleep(Duration::from_millis(10));
    }
    let job_s = job.display().to_string();
    // Not the broker user: refused, nothing signalled.
    let b_conf = write_config(dir.path(), "b.toml", &fs_text(&conf).replace("'root'", "'nobody-here-at-all'"));
    refused(&imp_kill(None, &b_conf, &[&job_s, "15"]), 65, "broker-user");
    refused(&imp_kill(Some(&users.b), &conf, &[&job_s, "15"]), 66, "only the broker user root");
    // Outside cgroup-root, a pid not in the job's cgroup, a bad signal: refused.
    refused(&imp_kill(None, &conf, &[&cg.root.display().to_string(), "15"]), 67, "is not under cgroup-root");
    refused(&imp_kill(None, &conf, &[&job_s, "15", &outside.id().to_string()]), 67, "is not in the job's cgroup");
    refused(&imp_kill(None, &conf, &[&job_s, "99"]), 64, "is not a number from 1 to 64");
    for c in [&mut t1, &mut t2, &mut outside] {
        assert!(c.try_wait().unwrap().is_none(), "a refusal signalled a process");
    }
    // One of them, then all of the cgroup's; the process outside it lives on.
    let o = imp_kill(None, &conf, &[&job_s, "15", &t1.id().to_string()]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(t1.wait().unwrap().signal(), Some(15));
    assert!(t2.try_wait().unwrap().is_none(), "only the pid named");
    let o = imp_kill(None, &conf, &[&job_s, "9"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(t2.wait().unwrap().signal(), Some(9));
    assert!(outside.try_wait().unwrap().is_none(), "a process outside the cgroup was signalled");
    let _ = outside.kill();
    let _ = outside.wait();
}

fn fs_text(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap()
}
