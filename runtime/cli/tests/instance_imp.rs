//! A multi-user system instance whose brokers are not root (issue 37, the wire-up of `vigil-imp`). Run as root:
//! the test makes a broker user and two guests of its own (`useradd`; removed after, also when it fails),
//! starts a `munged` of its own (its own key and socket; killed after), installs `vigil-imp` setuid root beside
//! `vigil` and `vigil-shell` in its directory with `/etc/vigil/imp.toml` (skipped when that file exists already:
//! it is never overwritten; removed after), gives the broker user a cgroup of the test's own under the cgroup2
//! hierarchy (delegated: owned by it), and starts a 2-broker instance from a TOML file as the broker user with
//! `[access] allow-guest-users = true` and `[exec] imp`. Then:
//! - guest A's job runs as A on both nodes (`id -u`), through the launcher;
//! - B cannot cancel A's job; A's cancel reaches A's tasks (another user's processes for the broker), which end;
//! - a submission with a forged credential, and one replaying a credential already used, fail with the
//!   launcher's reason in the job's exception; the same hand-made credential, used once, runs.
//!
//! Skipped, saying why, when not root, without munge (`munged`, `munge`), without a cgroup2 hierarchy at
//! `/sys/fs/cgroup/unified`, without `vigil-imp` built beside `vigil`, or without /usr/bin/python3 (which sends
//! the hand-made submissions as a guest).

mod common;

use common::*;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const INSTANCE: &str = "impe2e";

/// The system's Python, which a guest can run (a `python3` first on root's PATH may be in root's home).
const PYTHON: &str = "/usr/bin/python3";

fn have(program: &str) -> bool {
    Command::new("sh").args(["-c", &format!("command -v {program}")]).output().is_ok_and(|o| o.status.success())
}

/// `(name, uid, gid)` of a test user.
type Who = (String, u32, u32);

/// Users made with `useradd` (a broker user and two guests), removed when dropped.
struct Users {
    made: Vec<Who>,
}

impl Users {
    fn create(n: usize) -> Option<Users> {
        let tag: String = unique_token().chars().rev().take(10).collect();
        let mut u = Users { made: Vec::new() };
        for i in 0..n {
            let name = format!("vim{i}{tag}");
            let o = Command::new("useradd").args(["-M", "-s", "/bin/sh", "-d", "/nonexistent", &name]).output();
            if !o.as_ref().is_ok_and(|o| o.status.success()) {
                eprintln!("useradd {name} failed: {o:?}: skipped");
                return None;
            }
            let pw = nix::unistd::User::from_name(&name).unwrap().expect("the user just made");
            u.made.push((name, pw.uid.as_raw(), pw.gid.as_raw()));
        }
        Some(u)
    }
}

impl Drop for Users {
    fn drop(&mut self) {
        for (n, _, _) in &self.made {
            let _ = Command::new("userdel").arg(n).output();
        }
    }
}

/// A munged of the test's own (its key, socket, pid file in `dir`), killed when dropped.
struct Munged {
    dir: PathBuf,
}

impl Munged {
    fn start(dir: PathBuf) -> Munged {
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let key = dir.join("munge.key");
        let mut bytes = vec![0u8; 1024];
        std::fs::File::open("/dev/urandom").and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes)).unwrap();
        std::fs::write(&key, &bytes).unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        let m = Munged { dir };
        let p = |f: &str| m.dir.join(f).display().to_string();
        let o = Command::new("munged")
            .args([
                "--force".to_string(),
                format!("--socket={}", p("munge.socket")),
                format!("--key-file={}", p("munge.key")),
                format!("--pid-file={}", p("munged.pid")),
                format!("--log-file={}", p("munged.log")),
                format!("--seed-file={}", p("munged.seed")),
            ])
            .output()
            .expect("munged");
        assert!(o.status.success(), "munged: {}", String::from_utf8_lossy(&o.stderr));
        assert!(wait_for(Duration::from_secs(10), || m.socket().exists()), "munged's socket did not appear");
        m
    }

    fn socket(&self) -> PathBuf {
        self.dir.join("munge.socket")
    }

    /// A credential made by `who` over `payload` (`munge -s`).
    fn encode(&self, who: &Who, payload: &str) -> String {
        let o = Command::new("setpriv")
            .args([format!("--reuid={}", who.1), format!("--regid={}", who.2), "--init-groups".into()])
            .arg("munge")
            .arg("-S")
            .arg(self.socket())
            .args(["-s", payload])
            .output()
            .expect("munge");
        assert!(o.status.success(), "munge: {}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8(o.stdout).unwrap().trim().to_string()
    }
}

impl Drop for Munged {
    fn drop(&mut self) {
        if let Some(pid) = std::fs::read_to_string(self.dir.join("munged.pid")).ok().and_then(|p| p.trim().parse().ok())
        {
            // SAFETY: kill(2) of the munged this test started.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
    }
}

/// `/etc/vigil/imp.toml`, written by the test (never over one that exists), removed when dropped, with
/// `/etc/vigil` if the test made it.
struct ImpConfig {
    made_dir: bool,
}

const IMP_CONFIG: &str = "/etc/vigil/imp.toml";

impl ImpConfig {
    fn write(text: &str) -> Option<ImpConfig> {
        if Path::new(IMP_CONFIG).exists() {
            eprintln!("{IMP_CONFIG} exists already (not this test's to overwrite): skipped");
            return None;
        }
        let made_dir = !Path::new("/etc/vigil").exists();
        std::fs::create_dir_all("/etc/vigil").unwrap();
        std::fs::write(IMP_CONFIG, text).unwrap();
        std::fs::set_permissions(IMP_CONFIG, std::fs::Permissions::from_mode(0o644)).unwrap();
        Some(ImpConfig { made_dir })
    }
}

impl Drop for ImpConfig {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(IMP_CONFIG);
        if self.made_dir {
            let _ = std::fs::remove_dir("/etc/vigil");
        }
    }
}

/// A cgroup of the test's own under the cgroup2 hierarchy, delegated to the broker user; removed (with what
/// the brokers left in it) when dropped.
struct Cgroup {
    root: PathBuf,
}

impl Cgroup {
    fn create(owner: &Who) -> Option<Cgroup> {
        let base = Path::new("/sys/fs/cgroup/unified");
        if !base.join("cgroup.procs").exists() {
            eprintln!("no cgroup2 hierarchy at {}: skipped", base.display());
            return None;
        }
        let root = base.join(format!("vigil-impe2e-{}", unique_token()));
        std::fs::create_dir(&root).ok()?;
        for f in ["", "cgroup.procs", "cgroup.subtree_control", "cgroup.threads"] {
            let p = if f.is_empty() { root.clone() } else { root.join(f) };
            std::os::unix::fs::chown(&p, Some(owner.1), Some(owner.2)).unwrap();
        }
        Some(Cgroup { root })
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        fn remove(d: &Path) {
            if let Ok(rd) = std::fs::read_dir(d) {
                for e in rd.flatten() {
                    if e.file_type().is_ok_and(|t| t.is_dir()) {
                        remove(&e.path());
                    }
                }
            }
            let _ = std::fs::write(d.join("cgroup.kill"), "1");
            let _ = wait_for(Duration::from_secs(5), || std::fs::remove_dir(d).is_ok());
        }
        remove(&self.root);
    }
}

/// `vigil ARGS` as `who`, in `cwd`, with rank 0's URI and munged's socket.
fn vigil_as(sys: &LoopbackSystem, munge: &Path, who: &Who, args: &[&str]) -> Output {
    let mut c = Command::new("setpriv");
    c.arg(format!("--reuid={}", who.1)).arg(format!("--regid={}", who.2)).arg("--init-groups").arg(vigil_bin());
    for (k, _) in std::env::vars() {
        if k.starts_with("VIGIL_") {
            c.env_remove(k);
        }
    }
    c.env("USER", &who.0)
        .env("HOME", "/nonexistent")
        .env("TMPDIR", sys.dir.path())
        .env("PATH", path_env())
        .env("VIGIL_URI", sys.uri())
        .env("VIGIL_MUNGE_SOCKET", munge)
        .env_remove("RUST_LOG")
        .current_dir(sys.dir.path())
        .args(args);
    run(c, CMD_TIMEOUT, None)
}

/// Submit `jobspec` (its compact JSON text) with `credential` as `who`, by hand (python3 on rank 0's socket):
/// the job's id (f58), or the refusal.
fn submit_by_hand(sys: &LoopbackSystem, who: &Who, jobspec: &str, credential: &str) -> String {
    let payload = format!(r#"{{"jobspec":{jobspec},"credential":"{credential}"}}"#);
    let frame = encode_frame(1, T_REQUEST, 0, "job-manager.submit", 7, 0, &[], payload.as_bytes());
    let f = sys.dir.path().join(format!("frame-{}", unique_token()));
    std::fs::write(&f, frame).unwrap();
    let script = "import socket,sys,time\n\
        s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.settimeout(10)\n\
        s.sendall(open(sys.argv[2],'rb').read()); got=b''\n\
        end=time.time()+10\n\
        while b'id_f58' not in got and b'errstr' not in got and time.time()<end:\n    \
            d=s.recv(65536)\n    \
            if not d: break\n    \
            got+=d\n\
        sys.stdout.write(got.decode('latin-1'))\n";
    let mut c = Command::new("setpriv");
    c.arg(format!("--reuid={}", who.1)).arg(format!("--regid={}", who.2)).arg("--init-groups");
    c.args([PYTHON, "-c", script]).arg(sys.rundir(0).join("local-0")).arg(&f);
    let o = run(c, CMD_TIMEOUT, None);
    o.stdout.split("\"id_f58\":\"").nth(1).and_then(|r| r.split('"').next()).map(str::to_string).unwrap_or(o.dump())
}

/// The job's state and its first fatal exception's note, from `vigil job info --json` and its eventlog.
fn ended_with(sys: &LoopbackSystem, munge: &Path, who: &Who, id: &str) -> (String, String) {
    let mut state = String::new();
    wait_for(Duration::from_secs(30), || {
        let o = vigil_as(sys, munge, who, &["job", "info", "--json", id]);
        state = if o.code == 0 { o.json()["info"]["state"].as_str().unwrap_or("").to_string() } else { o.dump() };
        state == "INACTIVE"
    });
    let ev = vigil_as(sys, munge, who, &["job", "eventlog", id]);
    let note = ev.stdout.lines().find(|l| l.contains("exception")).unwrap_or_default().to_string();
    (state, note)
}

#[test]
fn guests_jobs_run_as_their_users_through_vigil_imp_on_brokers_that_are_not_root() {
    if !nix::unistd::geteuid().is_root() {
        return eprintln!("not root: skipped");
    }
    for p in ["munged", "munge", PYTHON, "setpriv", "useradd"] {
        if !have(p) {
            return eprintln!("no {p} here: skipped");
        }
    }
    let built_imp = bin_dir().join("vigil-imp");
    if !built_imp.exists() {
        return eprintln!("{} is not built (cargo build -p vigil-imp): skipped", built_imp.display());
    }
    let Some(users) = Users::create(3) else { return };
    let (broker, a, b) = (users.made[0].clone(), users.made[1].clone(), users.made[2].clone());
    let Some(cg) = Cgroup::create(&broker) else { return };
    let dir = tempdir();
    let d = dir.path().to_path_buf();
    let munged = Munged::start(d.join("munge"));
    // The programs, root's, in a directory of root's: vigil-imp setuid root.
    let bin = d.join("bin");
    std::fs::create_dir(&bin).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    for p in ["vigil", "vigil-shell", "vigil-imp"] {
        std::fs::copy(bin_dir().join(p), bin.join(p)).unwrap();
    }
    std::fs::set_permissions(bin.join("vigil-imp"), std::fs::Permissions::from_mode(0o4755)).unwrap();
    let shell = bin.join("vigil-shell");
    let Some(_conf) = ImpConfig::write(&format!(
        "instance = '{INSTANCE}'\nbroker-user = '{}'\nallowed-shells = ['{}']\ncgroup-root = '{}'\n\
         munge-socket = '{}'\n",
        broker.0,
        shell.display(),
        cg.root.display(),
        munged.socket().display()
    )) else {
        return;
    };
    let sys = LoopbackSystem::new(
        dir,
        INSTANCE,
        2,
        2,
        "",
        &format!("[access]\nallow-guest-users = true\n[exec]\nimp = \"{}\"\n", bin.join("vigil-imp").display()),
    );
    // The broker user's: its key, its run directories.
    std::os::unix::fs::chown(d.join("overlay.key"), Some(broker.1), Some(broker.2)).unwrap();
    let brokers: Vec<Running> = (0..2)
        .map(|rank| {
            let rundir = sys.rundir(rank);
            std::fs::create_dir(&rundir).unwrap();
            std::os::unix::fs::chown(&rundir, Some(broker.1), Some(broker.2)).unwrap();
            // Into the delegated cgroup (as root), then the broker user, then the broker.
            let mut c = Command::new("sh");
            c.arg("-c")
                .arg(format!("echo $$ > {}/cgroup.procs && exec \"$@\"", cg.root.display()))
                .arg("sh")
                .arg("setpriv")
                .arg(format!("--reuid={}", broker.1))
                .arg(format!("--regid={}", broker.2))
                .arg("--init-groups")
                .arg(bin.join("vigil"))
                .args(["broker", &format!("--rank={rank}")])
                .arg(format!("--config={}", sys.config.display()))
                .arg(format!("--rundir={}", rundir.display()))
                .args(["-S", "resource.synthetic=pack:1 core:2 pu:1", "-S", "log-level=info"])
                .arg("-S")
                .arg(format!("exec.shell={}", shell.display()))
                .env("TMPDIR", &d)
                .env("PATH", path_env())
                .env("VIGIL_MUNGE_SOCKET", munged.socket())
                .env_remove("RUST_LOG")
                .current_dir(&d);
            spawn(c, Some(&d))
        })
        .collect();
    let up = wait_for(Duration::from_secs(60), || {
        let o = vigil_as(&sys, &munged.socket(), &broker, &["uptime"]);
        o.code == 0 && o.stdout.contains(" run ")
    });
    if !up {
        let outs: Vec<String> = brokers.into_iter().map(|r| r.wait(Duration::from_millis(100)).dump()).collect();
        panic!("the instance did not come up:\n{}", outs.join("\n"));
    }
    let m = munged.socket();

    // A's job runs as A, on both nodes, started through vigil-imp.
    let o = vigil_as(&sys, &m, &a, &["run", "-N2", "-n2", "id", "-u"]);
    assert_eq!(o.code, 0, "A's job:\n{}", o.dump());
    let ids: Vec<&str> = o.stdout.lines().filter(|l| !l.starts_with("vigil-shell:")).collect();
    assert_eq!(ids, [a.1.to_string(), a.1.to_string()], "A's tasks ran as:\n{}", o.dump());

    // B cannot cancel A's job; A's cancel reaches A's tasks.
    let tag = format!("299.{}", unique_token());
    let o = vigil_as(&sys, &m, &a, &["submit", "-N2", "-n2", "sleep", &tag]);
    assert_eq!(o.code, 0, "{}", o.dump());
    let job_a = o.stdout.trim().to_string();
    let tasks = || processes_with_argv(&["sleep", &tag]);
    assert!(wait_for(Duration::from_secs(30), || tasks().len() == 2), "A's tasks did not start: {:?}", tasks());
    for (pid, _) in tasks() {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let uid = status.lines().find(|l| l.starts_with("Uid:")).unwrap_or_default().to_string();
        assert!(uid.split_whitespace().nth(1) == Some(&a.1.to_string()), "task {pid} is not A's: {uid}");
    }
    let o = vigil_as(&sys, &m, &b, &["cancel", &job_a]);
    assert!(o.code != 0 && o.stderr.contains(&format!("belongs to uid {}", a.1)), "{}", o.dump());
    assert_eq!(tasks().len(), 2, "B's refused cancel touched A's tasks");
    vigil_as(&sys, &m, &a, &["cancel", &job_a]).ok();
    assert!(
        wait_for(Duration::from_secs(30), || tasks().is_empty()),
        "A's cancel did not end its tasks: {:?}",
        tasks()
    );
    let (state, _) = ended_with(&sys, &m, &a, &job_a);
    assert_eq!(state, "INACTIVE");

    // A signal to the job's tasks (the warning before its time limit, through vigil-imp kill to A's shells,
    // which pass it on): both tasks get it.
    let script = "trap 'echo got-usr1; exit 0' USR1; while :; do sleep 0.1; done";
    let o = vigil_as(&sys, &m, &a, &["run", "-N2", "-n2", "-t", "62s", "--signal=USR1@60", "sh", "-c", script]);
    assert_eq!(o.code, 0, "the signalled job:\n{}", o.dump());
    assert_eq!(o.stdout.matches("got-usr1").count(), 2, "each task got SIGUSR1:\n{}", o.dump());

    // A credential made by hand as A over a jobspec: it runs once; replayed, and forged, the launcher refuses.
    let jobspec = vigil_proto::jobspec::JobspecBuilder::new(["true"]).cwd(d.display().to_string()).build().unwrap();
    let text = serde_json::from_str::<serde_json::Value>(&jobspec.to_json()).unwrap().to_string();
    let payload = vigil_client::munge::payload(INSTANCE, text.as_bytes());
    let cred = munged.encode(&a, &payload);
    let first = submit_by_hand(&sys, &a, &text, &cred);
    let (state, note) = ended_with(&sys, &m, &a, &first);
    assert!(state == "INACTIVE" && note.is_empty(), "the hand-made credential's job: {state} {note}");
    // Replayed with a second submission: rank 0 refuses it (vigil-imp accepts a credential its munged decoded
    // before, for requeues: docs/security.md, "Credentials that wait").
    let again = submit_by_hand(&sys, &a, &text, &cred);
    assert!(
        again.contains(&format!("credential: already used by job {first}")) && again.contains("a replay"),
        "a replay: {again}"
    );
    let forged = submit_by_hand(&sys, &a, &text, "MUNGE:AAAAforged:");
    let (_, note) = ended_with(&sys, &m, &a, &forged);
    assert!(note.contains("vigil-imp") && note.contains("credential refused"), "a forgery: {note}");
    // A credential B made, sent by A: it is not the job's user's.
    let cred_b = munged.encode(&b, &payload);
    let theirs = submit_by_hand(&sys, &a, &text, &cred_b);
    let (_, note) = ended_with(&sys, &m, &a, &theirs);
    assert!(note.contains(&format!("made by uid {}", b.1)), "another user's credential: {note}");

    vigil_as(&sys, &m, &broker, &["shutdown"]).ok();
    for br in brokers {
        br.wait(Duration::from_secs(20));
    }
    kill_marked(sys.dir.path());
}
