//! A multi-user system instance (issue 37, first slice: identity and the access table). Run as root: the test
//! makes two users of its own (`useradd`, removed at the end, also when it fails), starts a 3-broker system
//! instance from a TOML file with `[access] allow-guest-users = true` (root brokers, loopback), and acts as each
//! user with `setpriv`:
//! - every user reaches rank 0 through `VIGIL_URI=local://RUNDIR/local-0`;
//! - a job runs as its submitter (uid, groups; its output file is the user's) on a root broker;
//! - B cannot cancel, read the eventlog or output of, look into, or purge A's job: the error names A's uid;
//!   the instance owner (root) can;
//! - `vigil jobs` lists your own jobs, `-A` everyone's, and `--json` holds no other user's command or environment;
//! - a personal instance still refuses another user with a clear error.

mod common;

use common::*;
use serde_json::Value;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// Two test users, removed (with `userdel`) when dropped, whatever happened.
struct Users {
    names: Vec<String>,
}

impl Users {
    /// `n` new users with names of their own; `None` (the test is skipped) when `useradd` cannot make them.
    fn create(n: usize) -> Option<Users> {
        let tag = unique_token();
        let mut users = Users { names: Vec::new() };
        for i in 0..n {
            // At most 32 characters, as useradd wants.
            let name: String = format!("vgt{i}{}", tag.chars().filter(char::is_ascii_alphanumeric).collect::<String>())
                .chars()
                .take(24)
                .collect::<String>()
                .to_lowercase();
            let o = Command::new("useradd").args(["-M", "-s", "/bin/sh", "-d", "/nonexistent", &name]).output();
            match o {
                Ok(o) if o.status.success() => users.names.push(name),
                Ok(o) => {
                    eprintln!("useradd {name}: {}: skipped", String::from_utf8_lossy(&o.stderr).trim());
                    return None;
                }
                Err(e) => {
                    eprintln!("useradd: {e}: skipped");
                    return None;
                }
            }
        }
        Some(users)
    }

    /// `(uid, gid)` of user `i`.
    fn ids(&self, i: usize) -> (u32, u32) {
        let u = nix::unistd::User::from_name(&self.names[i]).unwrap().expect("the user just made");
        (u.uid.as_raw(), u.gid.as_raw())
    }
}

impl Drop for Users {
    fn drop(&mut self) {
        for n in &self.names {
            let _ = Command::new("userdel").arg(n).output();
        }
    }
}

/// The multi-user system instance ([`LoopbackSystem`]: 3 root brokers of 4 cores, `kary:2`), acted on as each user.
struct System {
    sys: LoopbackSystem,
}

impl std::ops::Deref for System {
    type Target = LoopbackSystem;
    fn deref(&self) -> &LoopbackSystem {
        &self.sys
    }
}

impl System {
    fn new(size: u32, multi_user: bool) -> System {
        let access = if multi_user { "[access]\nallow-guest-users = true\n" } else { "" };
        System {
            sys: LoopbackSystem::new(tempdir(), "mu", size, 4, "", &format!("[tbon]\ntopo = \"kary:2\"\n{access}")),
        }
    }

    fn start(&self) -> Vec<Running> {
        let brokers: Vec<Running> = (0..self.size).map(|rank| self.broker(rank, &[])).collect();
        assert!(self.is_up(), "the instance did not come up:\n{}", self.as_user(None, None, &["uptime"]).dump());
        brokers
    }

    /// `vigil ARGS` as the user `who` (`(uid, gid)`, with its groups; `None`: root, the instance owner), in
    /// `cwd` (default: the test's directory).
    fn as_user(&self, who: Option<(&str, u32, u32)>, cwd: Option<&Path>, args: &[&str]) -> Output {
        let d = self.dir.path();
        let mut c = match who {
            Some((_, uid, gid)) => {
                let mut c = Command::new("setpriv");
                c.arg(format!("--reuid={uid}")).arg(format!("--regid={gid}")).arg("--init-groups").arg(vigil_bin());
                c
            }
            None => Command::new(vigil_bin()),
        };
        for (k, _) in std::env::vars() {
            if k.starts_with("VIGIL_") {
                c.env_remove(k);
            }
        }
        if let Some((name, _, _)) = who {
            c.env("USER", name).env("LOGNAME", name).env("HOME", "/nonexistent");
        }
        c.env("TMPDIR", d)
            .env("PATH", path_env())
            .env("VIGIL_URI", self.uri())
            .env("VIGIL_TEST_SECRET", "s3cr3t-env")
            .env_remove("RUST_LOG")
            .current_dir(cwd.unwrap_or(d))
            .args(args);
        run(c, CMD_TIMEOUT, None)
    }
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// The ids of `vigil jobs [-A] -a --json` as that user, and the raw output.
fn listed(out: &Output) -> Vec<String> {
    out.json()["jobs"].as_array().unwrap().iter().map(|j| j["id_f58"].as_str().unwrap().to_string()).collect()
}

#[test]
fn each_user_reaches_its_own_jobs_only_and_the_instance_owner_all() {
    if !is_root() {
        return eprintln!("not root: skipped");
    }
    let Some(users) = Users::create(2) else { return };
    let sys = System::new(3, true);
    let brokers = sys.start();
    let (ua, ga) = users.ids(0);
    let (ub, gb) = users.ids(1);
    let a = Some((users.names[0].as_str(), ua, ga));
    let b = Some((users.names[1].as_str(), ub, gb));

    // Every user reaches rank 0's socket: the rundir is searchable by all, the socket open to all.
    let rundir_mode = std::fs::metadata(sys.rundir(0)).unwrap().permissions().mode();
    assert_eq!(rundir_mode & 0o005, 0o005, "rundir mode {rundir_mode:o}");
    let sock_mode = std::fs::metadata(sys.rundir(0).join("local-0")).unwrap().permissions().mode();
    assert_eq!(sock_mode & 0o007, 0o007, "socket mode {sock_mode:o}");
    for who in [a, b] {
        sys.as_user(who, None, &["uptime"]).ok();
    }

    // A's own directory; A's job runs as A (uid and groups), and what it writes is A's.
    let home_a = sys.dir.path().join("home-a");
    std::fs::create_dir(&home_a).unwrap();
    std::os::unix::fs::chown(&home_a, Some(ua), Some(ga)).unwrap();
    std::fs::set_permissions(&home_a, std::fs::Permissions::from_mode(0o700)).unwrap();
    let o = sys.as_user(
        a,
        Some(&home_a),
        &["run", "-N1", "--output=out.txt", "sh", "-c", "id -u; id -g; touch made-by-task"],
    );
    assert_eq!(o.code, 0, "A's job:\n{}", o.dump());
    let out = std::fs::read_to_string(home_a.join("out.txt")).expect("A's output file");
    // (The shell's notes, such as a synthetic topology's placement, come first.)
    let lines: Vec<&str> = out.lines().filter(|l| !l.starts_with("vigil-shell:")).collect();
    assert_eq!(lines, [ua.to_string(), ga.to_string()], "A's task ran as:\n{out}");
    for f in ["out.txt", "made-by-task"] {
        let m = std::fs::metadata(home_a.join(f)).unwrap();
        assert_eq!((m.uid(), m.gid()), (ua, ga), "{f} is not A's");
    }

    // A long job of A's, with a secret in its command and environment.
    let o = sys.as_user(a, Some(&home_a), &["submit", "sh", "-c", "sleep 300 # s3cr3t-arg"]);
    o.ok();
    let job_a = o.stdout.trim().to_string();
    let o = sys.as_user(b, None, &["submit", "sleep", "300"]);
    o.ok();
    let job_b = o.stdout.trim().to_string();
    let running = |id: &str| {
        wait_for(Duration::from_secs(20), || {
            let o = sys.as_user(None, None, &["jobs", "-A", "--json"]);
            o.code == 0 && o.json()["jobs"].as_array().unwrap().iter().any(|j| j["id_f58"] == id && j["state"] == "RUN")
        })
    };
    assert!(running(&job_a) && running(&job_b), "{}", sys.as_user(None, None, &["jobs", "-A"]).dump());

    // B may not touch A's job; each refusal names A's uid, and the job goes on.
    let owner_named = format!("belongs to uid {ua}");
    for args in [
        vec!["cancel", job_a.as_str()],
        vec!["job", "eventlog", job_a.as_str()],
        vec!["job", "attach", job_a.as_str()],
        vec!["job", "info", job_a.as_str()],
        vec!["job", "purge", "--force", job_a.as_str()],
    ] {
        let o = sys.as_user(b, None, &args);
        assert_ne!(o.code, 0, "B ran {args:?} on A's job:\n{}", o.dump());
        assert!(
            o.stderr.contains("permission denied") && o.stderr.contains(&owner_named),
            "B's {args:?} refused unclearly:\n{}",
            o.dump()
        );
        assert!(!o.stdout.contains("s3cr3t") && !o.stderr.contains("s3cr3t"), "{args:?} leaked:\n{}", o.dump());
    }
    // Nor what is the instance owner's alone.
    let o = sys.as_user(b, None, &["resource", "drain", "1", "mine"]);
    assert!(o.code != 0 && o.stderr.contains("only the instance owner"), "{}", o.dump());
    let o = sys.as_user(b, None, &["job", "purge", "--age-limit", "0", "--force"]);
    assert!(o.code != 0 && o.stderr.contains("only the instance owner"), "{}", o.dump());
    assert_eq!(sys.as_user(None, None, &["job", "info", "--json", &job_a]).json()["info"]["state"], "RUN");

    // `vigil jobs`: your own; `-A`: everyone's, with their users, and no other user's command or environment.
    let mine = listed(&sys.as_user(b, None, &["jobs", "-a", "--json"]));
    assert!(mine.contains(&job_b) && !mine.contains(&job_a), "B's own jobs: {mine:?}");
    let all = sys.as_user(b, None, &["jobs", "-A", "-a", "--json"]);
    let ids = listed(&all);
    assert!(ids.contains(&job_a) && ids.contains(&job_b), "-A: {ids:?}");
    let ja = all.json()["jobs"].as_array().unwrap().iter().find(|j| j["id_f58"] == job_a.as_str()).cloned().unwrap();
    assert_eq!(ja["userid"], Value::from(ua), "{ja}");
    assert!(!all.stdout.contains("s3cr3t"), "A's command or environment shown to B:\n{}", all.stdout);
    let table = sys.as_user(b, None, &["jobs", "-A"]);
    assert!(table.stdout.contains(&users.names[0]), "the table names A:\n{}", table.stdout);
    // A sees its own job's details.
    let info = sys.as_user(a, None, &["job", "info", "--json", &job_a]);
    assert!(info.stdout.contains("s3cr3t-arg"), "{}", info.dump());

    // B cancels its own; A's own eventlog is A's to read; the instance owner cancels A's and purges it.
    sys.as_user(b, None, &["cancel", &job_b]).ok();
    sys.as_user(a, None, &["job", "eventlog", &job_a]).ok();
    sys.as_user(None, None, &["cancel", &job_a]).ok();
    let inactive = wait_for(Duration::from_secs(20), || {
        sys.as_user(None, None, &["job", "info", "--json", &job_a]).json()["info"]["state"] == "INACTIVE"
    });
    assert!(inactive, "the instance owner's cancel did not end A's job");
    let ev = sys.as_user(None, None, &["job", "eventlog", "--json", &job_a]);
    let submit = ev.stdout.lines().find(|l| l.contains("\"submit\"")).unwrap_or_default().to_string();
    assert!(submit.contains(&format!("\"userid\":{ua}")), "the submit event names A: {submit}");
    sys.as_user(None, None, &["job", "purge", "--force", &job_a]).ok();
    assert!(!listed(&sys.as_user(None, None, &["jobs", "-A", "-a", "--json"])).contains(&job_a), "purged");

    sys.as_user(None, None, &["shutdown"]).ok();
    for br in brokers {
        br.wait(Duration::from_secs(20));
    }
    kill_marked(sys.dir.path());
}

/// Brokers that are not root cannot run a guest's job as the guest: they refuse its submission, saying why.
/// (This instance runs as root too; its brokers stand in for a non-root one through `may_submit`'s unit test.)
/// What this test checks end to end is the personal instance: another user is refused at the socket.
#[test]
fn a_personal_instance_refuses_another_user() {
    if !is_root() {
        return eprintln!("not root: skipped");
    }
    let Some(users) = Users::create(1) else { return };
    let (u, g) = users.ids(0);
    let inst = Instance::start(2, &[]);
    let mut c = Command::new("setpriv");
    c.arg(format!("--reuid={u}")).arg(format!("--regid={g}")).arg("--init-groups").arg(vigil_bin()).arg("jobs");
    c.env("VIGIL_URI", &inst.uri).env("PATH", path_env()).current_dir(inst.dir.path());
    let o = run(c, CMD_TIMEOUT, None);
    assert_ne!(o.code, 0, "another user was let in:\n{}", o.dump());
    assert!(
        o.stderr.contains(&format!("permission denied: uid {u} is not the owner of this instance")),
        "unclear refusal:\n{}",
        o.dump()
    );
    // A personal instance cannot be made multi-user.
    let dir = tempdir();
    let mut c = vigil_cmd(dir.path());
    c.args(["start", "--test-size=1", "-S", "access.allow-guest-users=true", "true"]);
    let o = run(c, CMD_TIMEOUT, Some(dir.path()));
    assert!(o.code != 0 && o.stderr.contains("a personal instance serves its owner only"), "{}", o.dump());
}
