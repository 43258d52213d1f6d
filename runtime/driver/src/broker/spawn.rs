//! Start a job shell directly inside its cgroup: `clone3(CLONE_INTO_CGROUP)` (Linux 5.7), the way `posix_spawn`
//! starts a program (the driver's side: process calls only; no rule lives here).
//!
//! **Why.** Moving a process into a cgroup after it has started (a write to `cgroup.procs`) takes the kernel's
//! cgroup thread-group lock for writing, and that waits for an RCU grace period whenever no other move happened
//! just before: 1.5 to 10 ms measured on a 2-core node, paid on every node of every job before its shell may
//! start. A child created in its cgroup pays none of it: `clone3` takes that lock for reading only.
//!
//! **How.** As glibc's `posix_spawn` does, the child shares the broker's memory (`CLONE_VM`) and the calling thread
//! waits (`CLONE_VFORK`) until the child has called `execve` or exited, so nothing is copied, whatever rank 0's
//! memory. The child runs on the calling thread's stack, below its stack pointer (the part the caller no longer
//! uses), never returns, and does only what is safe there: it calls async-signal-safe functions on data prepared
//! before the clone (program, arguments, environment, descriptors), puts every caught signal back to its default,
//! makes its own process group, connects its standard input and output, clears its signal mask and calls
//! `execve`. Signals are blocked in the calling thread around the clone, so that no handler of the broker runs in
//! the child. An `execve` that fails is reported through memory the two share.
//!
//! Only on x86_64 (the clone needs a few lines of assembly per architecture); elsewhere, and on a kernel without
//! `CLONE_INTO_CGROUP`, [`spawn`] returns [`SpawnError::Unsupported`] and the driver moves the shell after
//! spawning it, as before.

use std::ffi::{CString, OsString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicI32, Ordering};

/// Why [`spawn`] did not start the program.
#[derive(Debug)]
pub(crate) enum SpawnError {
    /// This kernel or architecture cannot create a process in a cgroup (`clone3` refused the request): use another
    /// way. Nothing was started.
    Unsupported(io::Error),
    /// The program could not be run (`execve` failed, or a set-up step before it): the error of that step.
    Failed(io::Error),
}

impl std::fmt::Display for SpawnError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SpawnError::Unsupported(e) => write!(f, "clone3(CLONE_INTO_CGROUP) is not available: {e}"),
            SpawnError::Failed(e) => write!(f, "{e}"),
        }
    }
}

/// A process started by [`spawn`], with the broker's ends of its standard input and output.
#[derive(Debug)]
pub(crate) struct Spawned {
    /// Its pid, which is also its process group.
    pub(crate) pid: i32,
    /// A pidfd for it (`CLONE_PIDFD`): readable once it has exited, see [`wait`].
    pub(crate) pidfd: OwnedFd,
    /// The write end of its standard input (close-on-exec, blocking).
    pub(crate) stdin: OwnedFd,
    /// The read end of its standard output (close-on-exec, blocking).
    pub(crate) stdout: OwnedFd,
    /// The read end of its standard error, when asked for (else it shares the broker's).
    pub(crate) stderr: Option<OwnedFd>,
}

/// Everything the child uses, prepared by the parent before the clone: the child allocates nothing.
struct Plan {
    path: CString,
    argv: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
    /// The descriptors to become the child's 0 and 1 (each at least 3, so that neither move undoes the other).
    stdin: RawFd,
    stdout: RawFd,
    /// The descriptor to become the child's 2 (at least 3), or -1: the broker's standard error.
    stderr: RawFd,
    /// 0, or the errno of the step that failed in the child.
    errno: AtomicI32,
    /// 0, or which step failed (1 setsid, 2 dup2, 3 execve, 4 becoming the job's user), for the error message.
    step: AtomicI32,
    /// The user to become before `execve`, if not the broker's.
    user: Option<RunAs>,
}

/// A user a job shell runs as (a multi-user instance's root broker starts each shell as its job's submitter,
/// docs/security.md): its uid, primary gid and supplementary groups, looked up by the parent (`initgroups` reads
/// the group database, which a child that may only make system calls cannot).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RunAs {
    /// The user's uid.
    pub(crate) uid: u32,
    /// Its primary group.
    pub(crate) gid: u32,
    /// Its groups, as `initgroups` would set them (the primary one included).
    pub(crate) groups: Vec<libc::gid_t>,
}

impl RunAs {
    /// The account of `uid` on this node, with its groups.
    ///
    /// # Errors
    /// No such user here, or its groups cannot be read: said with the uid.
    pub(crate) fn lookup(uid: u32) -> Result<RunAs, String> {
        use nix::unistd::{getgrouplist, Uid, User};
        let user = User::from_uid(Uid::from_raw(uid))
            .map_err(|e| format!("cannot look up uid {uid}: {e}"))?
            .ok_or_else(|| format!("uid {uid} has no account on this node"))?;
        let name = std::ffi::CString::new(user.name.as_bytes()).map_err(|_| format!("uid {uid}: a NUL in its name"))?;
        let groups = getgrouplist(&name, user.gid).map_err(|e| format!("cannot read the groups of uid {uid}: {e}"))?;
        Ok(RunAs { uid, gid: user.gid.as_raw(), groups: groups.iter().map(|g| g.as_raw()).collect() })
    }

    /// Become this user in a child before `execve`: groups, then gid, then uid (real, effective and saved, so
    /// that it cannot come back). Raw system calls, which change this task only (libc's wrappers would signal
    /// every thread of the broker to change theirs too, from a child that shares its memory). Async-signal-safe.
    ///
    /// # Errors
    /// The errno of the call that failed.
    pub(crate) fn become_user(&self) -> Result<(), i32> {
        // SAFETY: plain system calls on integers and on `groups`, which outlives them; none allocates.
        unsafe {
            let calls = [
                libc::syscall(libc::SYS_setgroups, self.groups.len(), self.groups.as_ptr()),
                libc::syscall(libc::SYS_setresgid, self.gid, self.gid, self.gid),
                libc::syscall(libc::SYS_setresuid, self.uid, self.uid, self.uid),
            ];
            for r in calls {
                if r != 0 {
                    return Err(*libc::__errno_location());
                }
            }
        }
        Ok(())
    }
}

/// The kernel's `struct clone_args` (include/uapi/linux/sched.h), up to `cgroup` (`CLONE_ARGS_SIZE_VER2`, 88 bytes).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

const CLONE_VM: u64 = 0x100;
const CLONE_PIDFD: u64 = 0x1000;
const CLONE_VFORK: u64 = 0x4000;
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// A pipe whose two ends are close-on-exec.
fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into the array it is given, which we then own.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just created and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// A close-on-exec duplicate of `fd` numbered 3 or more.
fn above_stdio(fd: &OwnedFd) -> io::Result<OwnedFd> {
    // SAFETY: F_DUPFD_CLOEXEC returns a new descriptor, which we then own.
    let n = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `n` was just created and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(n) })
}

fn cstring(s: &[u8]) -> io::Result<CString> {
    CString::new(s).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte in an argument or variable"))
}

/// Start `path` with `args` (after argv\[0\], which is `path`) in the cgroup whose directory `cgroup` is open,
/// in a process group of its own, with the broker's environment plus `env` (which replace variables of the
/// same name), pipes for stdin and stdout, and for stderr when `pipe_stderr` (else shared with the broker); as
/// `user` when given (the broker is root).
///
/// Errors: [`SpawnError::Unsupported`] where a process cannot be created in a cgroup here (try another way);
/// [`SpawnError::Failed`] when the program cannot be run (e.g. `ENOENT`), as `Command::spawn` would say.
pub(crate) fn spawn(
    path: &Path,
    args: &[OsString],
    env: &[(OsString, OsString)],
    cgroup: &std::fs::File,
    user: Option<&RunAs>,
    pipe_stderr: bool,
) -> Result<Spawned, SpawnError> {
    let failed = SpawnError::Failed;
    let c_path = cstring(path.as_os_str().as_bytes()).map_err(failed)?;
    let mut argv_owned = vec![c_path.clone()];
    for a in args {
        argv_owned.push(cstring(a.as_bytes()).map_err(failed)?);
    }
    let mut env_owned = Vec::new();
    for (k, v) in std::env::vars_os() {
        if !env.iter().any(|(ek, _)| *ek == k) {
            env_owned.push(cstring(&[k.as_bytes(), b"=", v.as_bytes()].concat()).map_err(failed)?);
        }
    }
    for (k, v) in env {
        env_owned.push(cstring(&[k.as_bytes(), b"=", v.as_bytes()].concat()).map_err(failed)?);
    }
    let (stdin_r, stdin_w) = pipe().map_err(failed)?;
    let (stdout_r, stdout_w) = pipe().map_err(failed)?;
    let (stdin_r, stdout_w) = (above_stdio(&stdin_r).map_err(failed)?, above_stdio(&stdout_w).map_err(failed)?);
    let stderr_pipe = match pipe_stderr {
        true => {
            let (r, w) = pipe().map_err(failed)?;
            Some((r, above_stdio(&w).map_err(failed)?))
        }
        false => None,
    };
    let plan = Plan {
        path: c_path,
        argv: argv_owned.iter().map(|a| a.as_ptr()).chain([std::ptr::null()]).collect(),
        envp: env_owned.iter().map(|a| a.as_ptr()).chain([std::ptr::null()]).collect(),
        stdin: stdin_r.as_raw_fd(),
        stdout: stdout_w.as_raw_fd(),
        stderr: stderr_pipe.as_ref().map_or(-1, |(_, w)| w.as_raw_fd()),
        errno: AtomicI32::new(0),
        step: AtomicI32::new(0),
        user: user.cloned(),
    };
    let mut pidfd: libc::c_int = -1;
    let args = CloneArgs {
        flags: CLONE_VM | CLONE_VFORK | CLONE_PIDFD | CLONE_INTO_CGROUP,
        pidfd: std::ptr::addr_of_mut!(pidfd) as u64,
        exit_signal: libc::SIGCHLD as u64,
        cgroup: cgroup.as_raw_fd() as u64,
        ..CloneArgs::default()
    };
    let ret = clone_vfork(&args, &plan);
    // The child has called execve or exited: the plan's strings may go.
    if ret < 0 {
        let e = io::Error::from_raw_os_error(-ret as i32);
        return Err(match -ret as i32 {
            libc::ENOSYS | libc::EINVAL | libc::E2BIG | libc::EOPNOTSUPP => SpawnError::Unsupported(e),
            _ => SpawnError::Failed(e),
        });
    }
    let pid = ret as i32;
    // SAFETY: the kernel stored a new pidfd there (CLONE_PIDFD), which we own.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    let errno = plan.errno.load(Ordering::Acquire);
    if errno != 0 {
        // It exited with 127 before or at execve: reap it, and say which step failed.
        let mut status = 0;
        // SAFETY: waits for our own child; `status` is a valid int.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        let e = io::Error::from_raw_os_error(errno);
        let what = match plan.step.load(Ordering::Acquire) {
            1 => "setsid",
            2 => "dup2",
            4 => "becoming the job's user",
            _ => return Err(SpawnError::Failed(e)),
        };
        return Err(SpawnError::Failed(io::Error::new(e.kind(), format!("{what} in the new process: {e}"))));
    }
    drop((stdin_r, stdout_w));
    let stderr = stderr_pipe.map(|(r, _w)| r);
    Ok(Spawned { pid, pidfd, stdin: stdin_w, stdout: stdout_r, stderr })
}

/// Clone as described in the module docs, with every signal blocked in this thread meanwhile. Returns the child's
/// pid, or `-errno`.
fn clone_vfork(args: &CloneArgs, plan: &Plan) -> i64 {
    // SAFETY: sigset_t is plain data, filled by sigfillset; pthread_sigmask only changes this thread's mask, which
    // is put back below.
    let old = unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        old
    };
    let ret = raw_clone(args, plan);
    // SAFETY: as above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    ret
}

#[cfg(target_arch = "x86_64")]
fn raw_clone(args: &CloneArgs, plan: &Plan) -> i64 {
    let ret: i64;
    // SAFETY: clone3 with CLONE_VM|CLONE_VFORK and no stack of its own: the child starts on this thread's stack at
    // this stack pointer while this thread is suspended until the child has exec'd or exited. The child calls
    // `child_main`, which never returns, so it only uses the stack below the stack pointer, which this thread does
    // not use (the block is not `nostack`: the compiler keeps nothing in the red zone and aligns the stack for the
    // call). `plan` stays borrowed, and so alive, until this thread resumes. In this thread the syscall clobbers
    // only rax, rcx and r11, declared so (`out`, so that `plan` is not placed in rcx or r11).
    unsafe {
        std::arch::asm!(
            "syscall",
            "test rax, rax",
            "jnz 2f",
            "mov rdi, {plan}",
            "call {child}",
            "ud2",
            "2:",
            plan = in(reg) plan as *const Plan,
            child = sym child_main,
            inlateout("rax") libc::SYS_clone3 => ret,
            in("rdi") args as *const CloneArgs,
            in("rsi") std::mem::size_of::<CloneArgs>(),
            out("rcx") _,
            out("r11") _,
        );
    }
    ret
}

#[cfg(not(target_arch = "x86_64"))]
fn raw_clone(_args: &CloneArgs, _plan: &Plan) -> i64 {
    -(libc::ENOSYS as i64)
}

/// The child, until `execve`. Only async-signal-safe calls, on memory the parent prepared (see the module docs).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
extern "C" fn child_main(plan: *const Plan) -> ! {
    // SAFETY: `plan` points at the parent's `Plan`, alive while the parent waits for us; every call below is
    // async-signal-safe and takes pointers into that plan or to locals of this stack.
    unsafe {
        let plan = &*plan;
        let fail = |step: i32| -> ! {
            plan.step.store(step, Ordering::Release);
            plan.errno.store(*libc::__errno_location(), Ordering::Release);
            libc::_exit(127)
        };
        // Every caught signal back to its default, so that no broker handler runs here once signals are
        // unblocked (execve would do it too, but only after that); SIGPIPE too, which the broker ignores, as
        // std's Command does. Ignored signals stay ignored, as across any execve.
        for sig in 1..65 {
            if sig == libc::SIGKILL || sig == libc::SIGSTOP {
                continue;
            }
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, std::ptr::null(), &mut old) != 0 {
                continue;
            }
            if old.sa_sigaction != libc::SIG_DFL && (old.sa_sigaction != libc::SIG_IGN || sig == libc::SIGPIPE) {
                let mut dfl: libc::sigaction = std::mem::zeroed();
                dfl.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(sig, &dfl, std::ptr::null_mut());
            }
        }
        // A session of its own (and so a process group: the job's signals go to it): the broker's session, and
        // with it its autogroup raised to nice -10 (priority.rs), is not shared with jobs, as Slurm's tasks do not
        // share slurmd's.
        if libc::setsid() < 0 {
            fail(1);
        }
        if libc::dup2(plan.stdin, 0) < 0
            || libc::dup2(plan.stdout, 1) < 0
            || (plan.stderr >= 0 && libc::dup2(plan.stderr, 2) < 0)
        {
            fail(2);
        }
        if let Some(u) = &plan.user {
            if let Err(e) = u.become_user() {
                *libc::__errno_location() = e;
                fail(4);
            }
        }
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::pthread_sigmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
        libc::execve(plan.path.as_ptr(), plan.argv.as_ptr(), plan.envp.as_ptr());
        fail(3)
    }
}

/// Whether this kernel and architecture can create a process in a cgroup, found without creating one: `clone3`
/// with `CLONE_INTO_CGROUP` and a descriptor that cannot be open fails with `EBADF` where the flag is known, and
/// with `ENOSYS` (no clone3, before Linux 5.3), `E2BIG` or `EINVAL` (no such flag, before 5.7) where it is not.
///
/// Errors: why not, for `vigil uptime`.
pub(crate) fn supported() -> Result<(), String> {
    if !cfg!(target_arch = "x86_64") {
        return Err("spawning into a cgroup is implemented for x86_64 only".into());
    }
    let args = CloneArgs {
        flags: CLONE_INTO_CGROUP,
        exit_signal: libc::SIGCHLD as u64,
        // The largest descriptor clone3 accepts; never open (fs.nr_open is below it).
        cgroup: i32::MAX as u64,
        ..CloneArgs::default()
    };
    // SAFETY: a clone3 without CLONE_VM that cannot succeed (the cgroup descriptor is not open); were it to, the
    // child (a copy, as after fork) exits at once and the parent reaps it.
    let r = unsafe { libc::syscall(libc::SYS_clone3, &args as *const CloneArgs, std::mem::size_of::<CloneArgs>()) };
    let e = io::Error::last_os_error();
    match r {
        // SAFETY: in the child of a fork-like clone (it cannot happen, see above): leave at once.
        0 => unsafe { libc::_exit(0) },
        pid if pid > 0 => {
            // SAFETY: reaps the child just made.
            unsafe { libc::waitpid(pid as i32, std::ptr::null_mut(), 0) };
            Ok(())
        }
        _ if e.raw_os_error() == Some(libc::EBADF) => Ok(()),
        _ => Err(format!("clone3(CLONE_INTO_CGROUP) is not available on this kernel: {e}")),
    }
}

/// Wait for a process started by [`spawn`] to exit, without blocking the runtime (its pidfd becomes readable),
/// then reap it. Returns its raw wait status (as `ExitStatus::into_raw`).
pub(crate) async fn wait(pid: i32, pidfd: OwnedFd) -> io::Result<i32> {
    // SAFETY: the OwnedFd is a valid open pidfd, owned by the AsyncFd until it is dropped here.
    let fd = unsafe { tokio::io::unix::AsyncFd::register_with_interest(pidfd, tokio::io::Interest::READABLE)? };
    loop {
        let mut status = 0;
        // SAFETY: waits for our own child, without blocking; `status` is a valid int.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            return Ok(status);
        }
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        fd.readable().await?.clear_ready();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// A cgroup2 directory this test may make a child in, if the machine has one we may write to.
    fn test_cgroup(name: &str) -> Option<std::path::PathBuf> {
        let base = std::path::Path::new("/sys/fs/cgroup/unified");
        let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
        let own = own.lines().find_map(|l| l.strip_prefix("0::"))?.trim_start_matches('/').to_string();
        let dir = base.join(own).join(format!("vigil-spawn-test-{}-{name}", std::process::id()));
        std::fs::create_dir(&dir).ok()?;
        Some(dir)
    }

    #[tokio::test]
    async fn a_child_is_born_in_its_cgroup_with_its_pipes_group_and_environment() {
        let Some(dir) = test_cgroup("born") else {
            eprintln!("no writable cgroup2 here: skipped");
            return;
        };
        let cg = std::fs::File::open(&dir).unwrap();
        let script =
            "read line; echo \"$line $VIGIL_SPAWN_TEST $(grep ^0:: /proc/self/cgroup) $(ps -o pgid=,sid= -p $$)\"; echo said >&2; exit 3";
        let s = match spawn(
            Path::new("/bin/sh"),
            &["-c".into(), script.into()],
            &[("VIGIL_SPAWN_TEST".into(), "yes".into())],
            &cg,
            None,
            true,
        ) {
            Err(SpawnError::Unsupported(e)) => {
                eprintln!("clone3(CLONE_INTO_CGROUP) not supported here ({e}): skipped");
                let _ = std::fs::remove_dir(&dir);
                return;
            }
            r => r.unwrap(),
        };
        let pid = s.pid;
        std::fs::File::from(s.stdin).write_all(b"hello\n").unwrap();
        let mut out = String::new();
        std::fs::File::from(s.stdout).read_to_string(&mut out).unwrap();
        let mut err = String::new();
        std::fs::File::from(s.stderr.expect("a stderr pipe, as asked")).read_to_string(&mut err).unwrap();
        assert_eq!(err, "said\n", "its standard error comes through the pipe");
        let status = wait(pid, s.pidfd).await.unwrap();
        let _ = std::fs::remove_dir(&dir);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 3, "status {status:#x}");
        let words: Vec<&str> = out.split_whitespace().collect();
        assert_eq!(words[0], "hello", "{out}");
        assert_eq!(words[1], "yes", "{out}");
        let cgroup_name = dir.file_name().unwrap().to_str().unwrap();
        assert!(words[2].ends_with(cgroup_name), "born in {} instead of {cgroup_name}", words[2]);
        assert_eq!(words[3], pid.to_string(), "its own process group");
        assert_eq!(words[4], pid.to_string(), "its own session");
    }

    /// As root, a child given a user is that user (uid, gid, groups) when it runs, in its cgroup.
    #[tokio::test]
    async fn a_child_given_a_user_runs_as_that_user() {
        if !nix::unistd::geteuid().is_root() {
            return eprintln!("not root: skipped");
        }
        let Ok(nobody) = RunAs::lookup(65534) else { return eprintln!("no uid 65534 here: skipped") };
        let Some(dir) = test_cgroup("user") else { return };
        let cg = std::fs::File::open(&dir).unwrap();
        let s = spawn(
            Path::new("/bin/sh"),
            &["-c".into(), "echo $(id -u) $(id -g) $(id -G)".into()],
            &[],
            &cg,
            Some(&nobody),
            false,
        );
        let s = match s {
            Err(SpawnError::Unsupported(_)) => return,
            r => r.unwrap(),
        };
        drop(s.stdin);
        let mut out = String::new();
        std::fs::File::from(s.stdout).read_to_string(&mut out).unwrap();
        let status = wait(s.pid, s.pidfd).await.unwrap();
        let _ = std::fs::remove_dir(&dir);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "status {status:#x}");
        let want: Vec<String> =
            [nobody.uid, nobody.gid].iter().chain(nobody.groups.iter()).map(u32::to_string).collect();
        let got: Vec<&str> = out.split_whitespace().collect();
        assert_eq!(got[..2], [want[0].as_str(), want[1].as_str()], "{out}");
        let mut groups: Vec<&str> = got[2..].to_vec();
        groups.sort();
        let mut want_groups: Vec<&str> = want[2..].iter().map(String::as_str).collect();
        want_groups.sort();
        want_groups.dedup();
        groups.dedup();
        assert_eq!(groups, want_groups, "{out}");
    }

    #[test]
    fn a_program_that_cannot_be_run_is_an_error() {
        let Some(dir) = test_cgroup("missing") else { return };
        let cg = std::fs::File::open(&dir).unwrap();
        let r = spawn(Path::new("/nonexistent/vigil-shell"), &[], &[], &cg, None, false);
        let _ = std::fs::remove_dir(&dir);
        match r {
            Err(SpawnError::Failed(e)) => assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "{e}"),
            Err(SpawnError::Unsupported(_)) => {}
            Ok(s) => panic!("spawned pid {}", s.pid),
        }
    }

    #[test]
    fn this_kernel_can_spawn_into_a_cgroup() {
        // Linux 5.7 and later on x86_64 (the CI machines): the probe must say so, without starting anything.
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
        let mut v = release.trim().split(['.', '-']).map(|n| n.parse::<u32>().unwrap_or(0));
        let (major, minor) = (v.next().unwrap_or(0), v.next().unwrap_or(0));
        if cfg!(target_arch = "x86_64") && (major, minor) >= (5, 7) {
            assert_eq!(supported(), Ok(()));
        } else {
            assert!(supported().is_err());
        }
    }

    #[test]
    fn a_cgroup_that_is_not_one_is_refused_without_starting_anything() {
        let f = std::fs::File::open("/tmp").unwrap();
        match spawn(Path::new("/bin/true"), &[], &[], &f, None, false) {
            Ok(s) => panic!("spawned pid {} into a plain directory", s.pid),
            Err(e) => assert!(!e.to_string().is_empty()),
        }
    }
}
