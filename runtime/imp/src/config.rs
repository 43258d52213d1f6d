//! The configuration, `/etc/vigil/imp.toml` (TOML, like the bootstrap file), and the checks it makes.
//!
//! ```toml
//! instance = "cluster"                 # required: the instance's name (its bootstrap `instance`)
//! broker-user = "vigil"                # required: the user the brokers run as (a name or a uid)
//! allowed-shells = ["/usr/libexec/vigil/vigil-shell"]   # required: the programs it may execute
//! allowed-users = ["alice", "1002"]    # optional: the only users jobs may run as (names or uids); absent: all
//! allow-root = false                   # optional: jobs may run as root (default false)
//! cgroup-root = "/sys/fs/cgroup/vigil" # optional: jobs' cgroups are under it (without: a request naming a
//!                                      # cgroup is refused)
//! munge-socket = "/run/munge/munge.socket.2"            # optional: munged's socket (default: munge's own)
//! credential-max-age = 604800          # optional: seconds a credential stays good from its making, past
//!                                      # munge's own TTL (default 7 days; crate docs, "Credentials that wait")
//! ```
//!
//! Unknown keys are refused. The file's safety (owner, mode, directories) is checked before it is read.

use crate::ids::{lookup_uid, User};
use serde::Deserialize;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Where the configuration is: fixed when `vigil-imp` is built (`VIGIL_IMP_CONFIG_PATH`, default
/// `/etc/vigil/imp.toml`).
pub(crate) const BUILT_PATH: &str = match option_env!("VIGIL_IMP_CONFIG_PATH") {
    Some(p) => p,
    None => "/etc/vigil/imp.toml",
};

/// The run-time override of [`BUILT_PATH`], honoured only without privilege gained at execution (crate docs).
pub(crate) const PATH_ENV: &str = "VIGIL_IMP_CONFIG";

/// The configuration's path: [`BUILT_PATH`], or `$VIGIL_IMP_CONFIG` when this process gained no privilege by
/// being executed (`AT_SECURE` is 0), so that a configuration of the caller's choosing gives it nothing.
pub(crate) fn path() -> PathBuf {
    // SAFETY: getauxval reads the process's auxiliary vector; no memory of ours is touched.
    let secure = unsafe { libc::getauxval(libc::AT_SECURE) } != 0;
    match std::env::var_os(PATH_ENV) {
        Some(p) if !secure && !p.is_empty() => PathBuf::from(p),
        _ => PathBuf::from(BUILT_PATH),
    }
}

/// The file as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct File {
    instance: String,
    broker_user: String,
    allowed_shells: Vec<String>,
    allowed_users: Option<Vec<String>>,
    #[serde(default)]
    allow_root: bool,
    cgroup_root: Option<PathBuf>,
    munge_socket: Option<PathBuf>,
    credential_max_age: Option<u64>,
}

/// [`Config::credential_max_age`]'s default: 7 days, in seconds.
pub(crate) const DEFAULT_CREDENTIAL_MAX_AGE: u64 = 7 * 24 * 3600;

/// The configuration, checked.
#[derive(Debug)]
pub(crate) struct Config {
    /// The instance's name, which every credential's payload must name.
    pub(crate) instance: String,
    /// The broker user as written (for messages).
    pub(crate) broker_user: String,
    /// Its uid: the only real uid `vigil-imp` runs for.
    pub(crate) broker_uid: u32,
    allowed_shells: Vec<PathBuf>,
    /// `None`: every user (but root, unless `allow_root`).
    allowed_users: Option<Vec<String>>,
    allow_root: bool,
    cgroup_root: Option<PathBuf>,
    /// munged's socket; `None`: libmunge's default.
    pub(crate) munge_socket: Option<PathBuf>,
    /// How long a credential stays good from its making, in seconds: a job may wait in the queue, or be requeued,
    /// longer than munge's TTL (crate docs, "Credentials that wait").
    pub(crate) credential_max_age: u64,
}

/// Whether `mode` lets others than the owner write (group or world).
fn others_write(mode: u32) -> bool {
    mode & 0o022 != 0
}

/// Check that `path`'s directories are root's and that nobody else may write to them (a world-writable one only
/// with its sticky bit, as /tmp: others cannot then replace what root put there).
fn check_dirs(path: &Path) -> Result<(), String> {
    for dir in path.ancestors().skip(1).filter(|d| !d.as_os_str().is_empty()) {
        let m = std::fs::metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let sticky = m.mode() & 0o1000 != 0;
        if m.uid() != 0 || (others_write(m.mode()) && !sticky) {
            return Err(format!(
                "refused: {} is in {}, which is not root's or which others may write to (owner uid {}, mode {:o})",
                path.display(),
                dir.display(),
                m.uid(),
                m.mode() & 0o7777
            ));
        }
    }
    Ok(())
}

impl Config {
    /// Read and check the configuration at `path`.
    ///
    /// # Errors
    /// The file is missing, not a regular file (a symbolic link is not followed), not owned by root, group- or
    /// world-writable, in a directory others may write to; it is not valid TOML of the shape above; or its
    /// broker user is unknown. Each message names the file and the reason.
    pub(crate) fn load(path: &Path) -> Result<Config, String> {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)
            .map_err(|e| format!("refused: cannot open its configuration {}: {e}", path.display()))?;
        let m = f.metadata().map_err(|e| format!("refused: {}: {e}", path.display()))?;
        if !m.is_file() {
            return Err(format!("refused: its configuration {} is not a regular file", path.display()));
        }
        if m.uid() != 0 || others_write(m.mode()) {
            return Err(format!(
                "refused: its configuration {} must be owned by root and writable by root only (owner uid {}, \
                 mode {:o})",
                path.display(),
                m.uid(),
                m.mode() & 0o7777
            ));
        }
        check_dirs(path)?;
        let text = std::io::read_to_string(f).map_err(|e| format!("refused: {}: {e}", path.display()))?;
        Config::parse(&text).map_err(|e| format!("refused: its configuration {}: {e}", path.display()))
    }

    /// Parse and check the text of a configuration (users are looked up on this node).
    fn parse(text: &str) -> Result<Config, String> {
        let f: File = toml::from_str(text).map_err(|e| e.message().to_string())?;
        if f.instance.is_empty() {
            return Err("instance: must not be empty".into());
        }
        let broker_uid = lookup_name_or_uid(&f.broker_user).map_err(|e| format!("broker-user: {e}"))?;
        if f.allowed_shells.is_empty() {
            return Err("allowed-shells: must name at least one program".into());
        }
        let mut allowed_shells = Vec::new();
        for s in &f.allowed_shells {
            if !s.starts_with('/') {
                return Err(format!("allowed-shells: '{s}' is not an absolute path"));
            }
            allowed_shells.push(PathBuf::from(s));
        }
        if let Some(r) = &f.cgroup_root {
            if !r.is_absolute() {
                return Err(format!("cgroup-root: '{}' is not an absolute path", r.display()));
            }
        }
        Ok(Config {
            instance: f.instance,
            broker_user: f.broker_user,
            broker_uid,
            allowed_shells,
            allowed_users: f.allowed_users,
            allow_root: f.allow_root,
            cgroup_root: f.cgroup_root,
            munge_socket: f.munge_socket,
            credential_max_age: match f.credential_max_age {
                Some(0) => return Err("credential-max-age: must be at least 1 (seconds)".into()),
                Some(s) => s,
                None => DEFAULT_CREDENTIAL_MAX_AGE,
            },
        })
    }

    /// `shell` as it will be executed, if it is one of `allowed-shells` (exactly) and a regular file of root's
    /// that nobody else may write to.
    ///
    /// # Errors
    /// Not allowed, missing, or unsafe: the message says which.
    pub(crate) fn check_shell(&self, shell: &OsStr) -> Result<PathBuf, String> {
        let p = Path::new(shell);
        if !self.allowed_shells.iter().any(|a| a.as_os_str() == shell) {
            return Err(format!("refused: the shell {} is not one of allowed-shells", p.display()));
        }
        let m = std::fs::metadata(p).map_err(|e| format!("refused: the shell {}: {e}", p.display()))?;
        if !m.is_file() || m.uid() != 0 || others_write(m.mode()) {
            return Err(format!(
                "refused: the shell {} must be a regular file owned by root and writable by root only",
                p.display()
            ));
        }
        Ok(p.to_path_buf())
    }

    /// Whether jobs may run as `user`.
    ///
    /// # Errors
    /// The user is root (without `allow-root`) or not in `allowed-users`.
    pub(crate) fn check_user(&self, user: &User) -> Result<(), String> {
        if user.uid == 0 && !self.allow_root {
            return Err("refused: jobs may not run as root (allow-root is not set)".into());
        }
        if let Some(list) = &self.allowed_users {
            let uid = user.uid.to_string();
            if !list.iter().any(|u| *u == user.name || *u == uid) {
                return Err(format!("refused: user {} (uid {}) is not one of allowed-users", user.name, user.uid));
            }
        }
        Ok(())
    }

    /// The job's cgroup directory `dir`, resolved, if it is a cgroup2 directory strictly under `cgroup-root`.
    ///
    /// # Errors
    /// No `cgroup-root` is configured, `dir` does not exist, is not under it, or is not on cgroup2.
    pub(crate) fn check_cgroup(&self, dir: &Path) -> Result<PathBuf, String> {
        let Some(root) = &self.cgroup_root else {
            return Err(format!("refused: cgroup {}: no cgroup-root is configured", dir.display()));
        };
        let root = root.canonicalize().map_err(|e| format!("refused: cgroup-root {}: {e}", root.display()))?;
        let real = dir.canonicalize().map_err(|e| format!("refused: cgroup {}: {e}", dir.display()))?;
        if real == root || !real.starts_with(&root) {
            return Err(format!("refused: cgroup {} is not under cgroup-root {}", dir.display(), root.display()));
        }
        let c = std::ffi::CString::new(real.as_os_str().as_bytes()).map_err(|_| "refused: cgroup: a NUL byte")?;
        // SAFETY: `st` is a plain struct statfs fills; `c` is a valid C string for the call's duration.
        let mut st: libc::statfs = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 || st.f_type != libc::CGROUP2_SUPER_MAGIC {
            return Err(format!("refused: cgroup {} is not a cgroup2 directory", dir.display()));
        }
        Ok(real)
    }
}

/// The uid of `who`, a user name or a decimal uid.
fn lookup_name_or_uid(who: &str) -> Result<u32, String> {
    if let Ok(uid) = who.parse::<u32>() {
        return Ok(uid);
    }
    lookup_uid(&OsString::from(who))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "instance = 'c'\nbroker-user = 'root'\nallowed-shells = ['/bin/sh']\n";

    #[test]
    fn a_good_file_parses_and_bad_ones_name_their_field() {
        let c = Config::parse(GOOD).expect("good");
        assert_eq!((c.instance.as_str(), c.broker_uid, c.allow_root), ("c", 0, false));
        let e = Config::parse(&format!("{GOOD}colour = 'red'")).unwrap_err();
        assert!(e.contains("colour"), "{e}");
        let e = Config::parse("instance = 'c'\nbroker-user = 'root'\nallowed-shells = ['sh']").unwrap_err();
        assert!(e.contains("allowed-shells: 'sh' is not an absolute path"), "{e}");
        let e = Config::parse("instance = 'c'\nbroker-user = 'no-such-user-here'\nallowed-shells = ['/bin/sh']")
            .unwrap_err();
        assert!(e.starts_with("broker-user:"), "{e}");
        let e = Config::parse("broker-user = 'root'\nallowed-shells = ['/bin/sh']").unwrap_err();
        assert!(e.contains("instance"), "{e}");
        assert_eq!(c.credential_max_age, DEFAULT_CREDENTIAL_MAX_AGE);
        assert_eq!(Config::parse(&format!("{GOOD}credential-max-age = 60")).expect("good").credential_max_age, 60);
        let e = Config::parse(&format!("{GOOD}credential-max-age = 0")).unwrap_err();
        assert!(e.contains("credential-max-age: must be at least 1"), "{e}");
        let e = Config::parse(&format!("{GOOD}credential-max-age = -5")).unwrap_err();
        assert!(!e.is_empty(), "a negative age: {e}");
    }

    #[test]
    fn root_and_users_outside_the_list_are_refused() {
        let c = Config::parse(&format!("{GOOD}allowed-users = ['alice', '1002']")).expect("good");
        let u = |name: &str, uid| User { name: name.into(), uid, gid: uid, home: "/".into(), shell: "/bin/sh".into() };
        assert!(c.check_user(&u("alice", 1001)).is_ok());
        assert!(c.check_user(&u("bob", 1002)).is_ok());
        assert!(c.check_user(&u("carol", 1003)).unwrap_err().contains("not one of allowed-users"));
        assert!(c.check_user(&u("root", 0)).unwrap_err().contains("allow-root"));
        let c = Config::parse(&format!("{GOOD}allow-root = true")).expect("good");
        assert!(c.check_user(&u("root", 0)).is_ok());
    }

    #[test]
    fn only_listed_shells_run() {
        let c = Config::parse(GOOD).expect("good");
        assert!(c.check_shell(OsStr::new("/bin/sh")).is_ok());
        let e = c.check_shell(OsStr::new("/bin/bash")).unwrap_err();
        assert!(e.contains("not one of allowed-shells"), "{e}");
    }
}
