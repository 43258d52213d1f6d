//! Becoming the job's user: its account, its cgroup, its groups, gid and uid, its environment, the shell's
//! execution.

use std::ffi::{CStr, CString, OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;

/// A user's account on this node (`getpwuid_r`).
#[derive(Debug, Clone)]
pub(crate) struct User {
    pub(crate) name: String,
    pub(crate) uid: u32,
    /// The primary group.
    pub(crate) gid: u32,
    pub(crate) home: OsString,
    pub(crate) shell: OsString,
}

/// Look up a passwd entry with `f` (getpwuid_r or getpwnam_r), growing the buffer as asked.
fn lookup(
    what: &str,
    f: impl Fn(*mut libc::passwd, *mut libc::c_char, usize, *mut *mut libc::passwd) -> libc::c_int,
) -> Result<User, String> {
    let mut size = 1024usize;
    loop {
        let mut buf = vec![0 as libc::c_char; size];
        // SAFETY: a plain C struct that getpw*_r fills.
        let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
        let mut out: *mut libc::passwd = std::ptr::null_mut();
        let rc = f(&mut pw, buf.as_mut_ptr(), buf.len(), &mut out);
        if rc == libc::ERANGE && size < 1 << 20 {
            size *= 4;
            continue;
        }
        if rc != 0 {
            return Err(format!("{what}: {}", std::io::Error::from_raw_os_error(rc)));
        }
        if out.is_null() {
            return Err(format!("{what}: no such user on this node"));
        }
        // SAFETY: on success the strings point into `buf`, alive here, and are NUL-terminated.
        let s = |p: *const libc::c_char| unsafe { CStr::from_ptr(p) }.to_bytes().to_vec();
        return Ok(User {
            name: String::from_utf8_lossy(&s(pw.pw_name)).into_owned(),
            uid: pw.pw_uid,
            gid: pw.pw_gid,
            home: OsString::from_vec(s(pw.pw_dir)),
            shell: OsString::from_vec(s(pw.pw_shell)),
        });
    }
}

impl User {
    /// The account of `uid`.
    ///
    /// # Errors
    /// No such user on this node, or the user database failed.
    pub(crate) fn by_uid(uid: u32) -> Result<User, String> {
        lookup(&format!("refused: the job's user uid {uid}"), |pw, buf, len, out| {
            // SAFETY: every pointer is valid for the call: `pw` and `out` point to our locals, `buf` has `len`
            // bytes.
            unsafe { libc::getpwuid_r(uid, pw, buf, len, out) }
        })
    }
}

/// The uid of the user named `name`.
///
/// # Errors
/// No such user on this node.
pub(crate) fn lookup_uid(name: &OsStr) -> Result<u32, String> {
    let c = CString::new(name.as_bytes()).map_err(|_| "a user name with a NUL byte".to_string())?;
    let u = lookup(&format!("user '{}'", name.to_string_lossy()), |pw, buf, len, out| {
        // SAFETY: as in `User::by_uid`; `c` is a valid C string for the call's duration.
        unsafe { libc::getpwnam_r(c.as_ptr(), pw, buf, len, out) }
    })?;
    Ok(u.uid)
}

/// Move this process into the cgroup directory `dir` (checked already: config.rs), unless it is there already:
/// a broker that can creates the launcher in the job's cgroup (`clone3` with `CLONE_INTO_CGROUP`), and a write
/// to `cgroup.procs`, even of a process already listed, takes the kernel's cgroup lock for writing and waits for
/// an RCU grace period (~15 ms on a busy node: bench/imp.sh).
///
/// # Errors
/// `cgroup.procs` cannot be opened or written.
pub(crate) fn join_cgroup(dir: &Path) -> Result<(), String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let procs = dir.join("cgroup.procs");
    let me = std::process::id().to_string();
    if let Ok(listed) = std::fs::read_to_string(&procs) {
        if listed.lines().any(|l| l == me) {
            return Ok(());
        }
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&procs)
        .map_err(|e| format!("cannot join the job's cgroup: {}: {e}", procs.display()))?;
    f.write_all(me.as_bytes()).map_err(|e| format!("cannot join the job's cgroup: {}: {e}", procs.display()))
}

/// The processes in cgroup directory `dir` and in the cgroups below it (their `cgroup.procs`).
///
/// # Errors
/// A directory or `cgroup.procs` cannot be read.
pub(crate) fn cgroup_pids(dir: &Path) -> Result<Vec<i32>, String> {
    let mut pids = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        let procs = d.join("cgroup.procs");
        let text = std::fs::read_to_string(&procs).map_err(|e| format!("{}: {e}", procs.display()))?;
        pids.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
        for e in std::fs::read_dir(&d).map_err(|e| format!("{}: {e}", d.display()))?.flatten() {
            // A cgroup's children are directories; its files are not followed (no symbolic links in cgroupfs).
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                dirs.push(e.path());
            }
        }
    }
    Ok(pids)
}

/// The last OS error, as text.
fn os_error() -> std::io::Error {
    std::io::Error::last_os_error()
}

/// Become `user` for good: its groups (`initgroups`), its gid, its uid (real, effective, saved); then check
/// that root cannot be had back.
///
/// # Errors
/// A call failed, or root (or another uid or gid) could be taken back: the message says which.
pub(crate) fn become_user(user: &User) -> Result<(), String> {
    let name = CString::new(user.name.as_bytes()).map_err(|_| "the user's name has a NUL byte".to_string())?;
    let (uid, gid) = (user.uid, user.gid);
    // SAFETY: `name` is a valid C string; initgroups reads the group database and sets this process's groups.
    if unsafe { libc::initgroups(name.as_ptr(), gid) } != 0 {
        return Err(format!("initgroups({}, {gid}): {}", user.name, os_error()));
    }
    // SAFETY: plain system calls on this process's credentials.
    if unsafe { libc::setresgid(gid, gid, gid) } != 0 {
        return Err(format!("setresgid({gid}): {}", os_error()));
    }
    // SAFETY: as above.
    if unsafe { libc::setresuid(uid, uid, uid) } != 0 {
        return Err(format!("setresuid({uid}): {}", os_error()));
    }
    let (mut r, mut e, mut s) = (0, 0, 0);
    // SAFETY: the three pointers are to our locals.
    if unsafe { libc::getresuid(&mut r, &mut e, &mut s) } != 0 || [r, e, s] != [uid; 3] {
        return Err(format!("after setresuid({uid}) the uids are {r}, {e}, {s}"));
    }
    let (mut r, mut e, mut s) = (0, 0, 0);
    // SAFETY: as above.
    if unsafe { libc::getresgid(&mut r, &mut e, &mut s) } != 0 || [r, e, s] != [gid; 3] {
        return Err(format!("after setresgid({gid}) the gids are {r}, {e}, {s}"));
    }
    if uid != 0 {
        // SAFETY: attempts that must fail: an unprivileged process cannot take uid or gid 0.
        if unsafe { libc::setresuid(0, 0, 0) } == 0 || unsafe { libc::setresgid(0, 0, 0) } == 0 {
            return Err(format!("root could be taken back after becoming uid {uid}: not running the job"));
        }
    }
    Ok(())
}

/// The variable the shell finds the checked jobspec's SHA-256 in (lowercase hex).
pub(crate) const JOBSPEC_SHA_ENV: &str = "VIGIL_IMP_JOBSPEC_SHA256";

/// The `PATH` the shell gets.
const SAFE_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// The shell's environment: the caller's `VIGIL_*` variables (but `VIGIL_IMP_*`), the user's `HOME`, `USER`,
/// `LOGNAME`, `SHELL`, a fixed `PATH`, and [`JOBSPEC_SHA_ENV`].
pub(crate) fn shell_env(caller: impl Iterator<Item = (OsString, OsString)>, user: &User, sha: &str) -> Vec<CString> {
    let mut env: Vec<(OsString, OsString)> = caller
        .filter(|(k, _)| {
            let k = k.as_bytes();
            k.starts_with(b"VIGIL_") && !k.starts_with(b"VIGIL_IMP_")
        })
        .collect();
    env.push(("HOME".into(), user.home.clone()));
    env.push(("USER".into(), user.name.clone().into()));
    env.push(("LOGNAME".into(), user.name.clone().into()));
    env.push(("SHELL".into(), user.shell.clone()));
    env.push(("PATH".into(), SAFE_PATH.into()));
    env.push((JOBSPEC_SHA_ENV.into(), sha.into()));
    env.into_iter()
        .filter_map(|(k, v)| {
            let mut kv = k.into_vec();
            kv.push(b'=');
            kv.extend_from_slice(v.as_bytes());
            CString::new(kv).ok()
        })
        .collect()
}

/// Mark every descriptor above 2 close-on-exec, then execute `shell` with `args` and `env`. Returns only on
/// failure, with why.
pub(crate) fn exec(shell: &Path, args: &[OsString], env: &[CString]) -> String {
    // SAFETY: close_range with CLOSE_RANGE_CLOEXEC only sets flags on this process's descriptors. Kernels
    // before 5.11 lack the flag; the broker's own descriptors are close-on-exec already (Rust's default).
    unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, libc::CLOSE_RANGE_CLOEXEC) };
    let Ok(path) = CString::new(shell.as_os_str().as_bytes()) else { return "the shell's path has a NUL".into() };
    let mut argv: Vec<CString> = vec![path.clone()];
    for a in args {
        match CString::new(a.as_bytes()) {
            Ok(c) => argv.push(c),
            Err(_) => return "an argument has a NUL byte".into(),
        }
    }
    let mut argp: Vec<*const libc::c_char> = argv.iter().map(|c| c.as_ptr()).collect();
    argp.push(std::ptr::null());
    let mut envp: Vec<*const libc::c_char> = env.iter().map(|c| c.as_ptr()).collect();
    envp.push(std::ptr::null());
    // SAFETY: `path`, `argp` and `envp` are NUL-terminated arrays of valid C strings that outlive the call.
    unsafe { libc::execve(path.as_ptr(), argp.as_ptr(), envp.as_ptr()) };
    format!("cannot execute the shell {}: {}", shell.display(), os_error())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shell_gets_vigil_variables_and_the_users_own_nothing_else() {
        let user =
            User { name: "alice".into(), uid: 1001, gid: 1001, home: "/home/alice".into(), shell: "/bin/sh".into() };
        let caller = [
            ("VIGIL_URI", "local:///run/vigil/local-3"),
            ("LD_PRELOAD", "/tmp/evil.so"),
            ("PATH", "/tmp"),
            ("VIGIL_IMP_JOBSPEC_SHA256", "forged"),
            ("HOME", "/var/lib/vigil"),
        ]
        .map(|(k, v)| (OsString::from(k), OsString::from(v)));
        let env: Vec<String> =
            shell_env(caller.into_iter(), &user, "abc").iter().map(|c| c.to_string_lossy().into_owned()).collect();
        assert_eq!(
            env,
            [
                "VIGIL_URI=local:///run/vigil/local-3",
                "HOME=/home/alice",
                "USER=alice",
                "LOGNAME=alice",
                "SHELL=/bin/sh",
                "PATH=/usr/local/bin:/usr/bin:/bin",
                "VIGIL_IMP_JOBSPEC_SHA256=abc"
            ]
        );
    }

    #[test]
    fn root_is_known_and_a_missing_uid_is_said() {
        assert_eq!(User::by_uid(0).expect("root").name, "root");
        assert!(User::by_uid(4_000_000_000).unwrap_err().contains("no such user"));
    }
}
