//! Thin syscall wrappers (clock, pidfd, waitid, tracefs mount).

use std::{
    ffi::CStr,
    io,
    os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd},
    path::Path,
    sync::Mutex,
};

use crate::event::ExitStatus;

/// `CLOCK_MONOTONIC` now, in nanoseconds: the clock used by
/// `bpf_ktime_get_ns()` and by every `ktime_ns` field of this crate.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    debug_assert_eq!(rc, 0);
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// True if a process with id `pid` exists in this pid namespace (`kill(pid, 0)` does not fail with `ESRCH`).
pub(crate) fn process_exists(pid: u32) -> bool {
    let Ok(pid) = i32::try_from(pid) else { return false };
    if pid <= 0 {
        return false;
    }
    // SAFETY: signal 0 only checks that the process exists and may be signalled; nothing is sent.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

pub(crate) fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// `pidfd_open(pid, 0)`; works for live and zombie (unreaped) processes.
pub(crate) fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    // SAFETY: plain syscall with integer arguments; no memory is passed.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0 as libc::c_uint) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the syscall returned a fresh file descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// True when the process behind `pidfd` has exited (pidfd is readable).
pub(crate) fn pidfd_exited(pidfd: BorrowedFd<'_>) -> io::Result<bool> {
    let mut pfd = libc::pollfd { fd: pidfd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    // SAFETY: `pfd` is one valid pollfd and nfds is 1; timeout 0 never blocks.
    let rc = unsafe { libc::poll(&mut pfd, 1, 0) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(rc > 0 && pfd.revents & libc::POLLIN != 0)
}

const P_PIDFD: libc::idtype_t = 3;

/// Exit status of an exited child via `waitid(P_PIDFD, WEXITED|WNOHANG|WNOWAIT)`.
///
/// `WNOWAIT` leaves the child reapable by its owner (e.g. `Child::wait`).
/// Returns [`ExitStatus::Unknown`] for non-children (`ECHILD`), for children
/// already reaped by someone else, or if the child is not yet waitable.
pub(crate) fn waitid_nowait(pidfd: BorrowedFd<'_>) -> ExitStatus {
    // SAFETY: siginfo_t is plain data; all-zero is a valid value and is what
    // WNOHANG relies on to signal "no state change" (si_pid stays 0).
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: `info` is a valid writable siginfo_t; the fd is borrowed and open.
    let rc = unsafe {
        libc::waitid(P_PIDFD, pidfd.as_raw_fd() as libc::id_t, &mut info, libc::WEXITED | libc::WNOHANG | libc::WNOWAIT)
    };
    if rc != 0 {
        return ExitStatus::Unknown;
    }
    // SAFETY: waitid filled a SIGCHLD siginfo, for which si_pid/si_status are
    // the valid union members.
    let (pid, status) = unsafe { (info.si_pid(), info.si_status()) };
    if pid == 0 {
        return ExitStatus::Unknown;
    }
    match info.si_code {
        libc::CLD_EXITED => ExitStatus::Exited(status),
        libc::CLD_KILLED => ExitStatus::Signaled { signal: status, core_dumped: false },
        libc::CLD_DUMPED => ExitStatus::Signaled { signal: status, core_dumped: true },
        _ => ExitStatus::Unknown,
    }
}

static TRACEFS_LOCK: Mutex<()> = Mutex::new(());

/// Makes sure tracefs is reachable where aya looks for it.
///
/// Must run before the first `TracePoint::attach` in the process: aya caches
/// the tracefs location (or its absence) in a process-wide `LazyLock`.
pub(crate) fn ensure_tracefs() -> io::Result<()> {
    let _g = TRACEFS_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let mounted = |p: &str| Path::new(p).join("events").is_dir();
    if mounted("/sys/kernel/tracing") || mounted("/sys/kernel/debug/tracing") {
        return Ok(());
    }
    let src: &CStr = c"nodev";
    let target: &CStr = c"/sys/kernel/tracing";
    let fstype: &CStr = c"tracefs";
    // SAFETY: all pointers are NUL-terminated C string literals that outlive
    // the call; `data` may be NULL for tracefs.
    let rc = unsafe { libc::mount(src.as_ptr(), target.as_ptr(), fstype.as_ptr(), 0, std::ptr::null()) };
    if rc != 0 {
        let err = io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::EBUSY) && mounted("/sys/kernel/tracing") {
            return Ok(());
        }
        return Err(err);
    }
    Ok(())
}

/// Mounts bpffs on `/sys/fs/bpf` if nothing is mounted there (needed to pin maps shared between brokers).
pub(crate) fn ensure_bpffs() -> io::Result<()> {
    const BPF_FS_MAGIC: i64 = 0xcafe4a11;
    let target: &CStr = c"/sys/fs/bpf";
    // SAFETY: statfs writes into a zeroed, correctly sized struct; the path is a NUL-terminated literal.
    let is_bpffs = unsafe {
        let mut st: libc::statfs = std::mem::zeroed();
        libc::statfs(target.as_ptr(), &mut st) == 0 && st.f_type as i64 == BPF_FS_MAGIC
    };
    if is_bpffs {
        return Ok(());
    }
    let src: &CStr = c"bpf";
    // SAFETY: NUL-terminated C string literals that outlive the call; `data` may be NULL for bpffs.
    let rc = unsafe { libc::mount(src.as_ptr(), target.as_ptr(), src.as_ptr(), 0, std::ptr::null()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Name of the network interface that carries IPv4 address `addr` (`lo` for 127.0.0.0/8), if any.
pub fn interface_for_addr(addr: std::net::Ipv4Addr) -> Option<String> {
    if addr.is_loopback() {
        return Some("lo".to_owned());
    }
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list we free below with freeifaddrs; we only read nodes while
    // the list is alive, and check every pointer before dereferencing it.
    unsafe {
        if libc::getifaddrs(&mut head) != 0 {
            return None;
        }
        let mut found = None;
        let mut cur = head;
        while !cur.is_null() {
            let ifa = &*cur;
            if !ifa.ifa_addr.is_null() && (*ifa.ifa_addr).sa_family as i32 == libc::AF_INET {
                let sin = &*(ifa.ifa_addr as *const libc::sockaddr_in);
                if u32::from_be(sin.sin_addr.s_addr) == u32::from(addr) && !ifa.ifa_name.is_null() {
                    found = Some(CStr::from_ptr(ifa.ifa_name).to_string_lossy().into_owned());
                    break;
                }
            }
            cur = ifa.ifa_next;
        }
        libc::freeifaddrs(head);
        found
    }
}

/// The first IPv4 address of network interface `name` (`tbon.job_network`): `Err` says why there is none (no
/// such interface, or it has no IPv4 address).
pub fn interface_ipv4(name: &str) -> Result<std::net::Ipv4Addr, String> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    let mut exists = false;
    // SAFETY: getifaddrs fills `head` with a list we free below with freeifaddrs; we only read nodes while the
    // list is alive, and check every pointer before dereferencing it.
    unsafe {
        if libc::getifaddrs(&mut head) != 0 {
            return Err(format!("cannot list the interfaces: {}", std::io::Error::last_os_error()));
        }
        let mut found = None;
        let mut cur = head;
        while !cur.is_null() {
            let ifa = &*cur;
            if !ifa.ifa_name.is_null() && CStr::from_ptr(ifa.ifa_name).to_bytes() == name.as_bytes() {
                exists = true;
                if !ifa.ifa_addr.is_null() && (*ifa.ifa_addr).sa_family as i32 == libc::AF_INET {
                    let sin = &*(ifa.ifa_addr as *const libc::sockaddr_in);
                    found = Some(std::net::Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)));
                    break;
                }
            }
            cur = ifa.ifa_next;
        }
        libc::freeifaddrs(head);
        match (found, exists) {
            (Some(a), _) => Ok(a),
            (None, true) => Err(format!("interface {name} has no IPv4 address")),
            (None, false) => Err(format!("no interface {name} on this node")),
        }
    }
}

/// The running kernel's release (`uname -r`), or `unknown`.
pub(crate) fn kernel_release() -> String {
    // SAFETY: all-zero is a valid utsname; uname fills it with NUL-terminated strings.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid, writable utsname.
    if unsafe { libc::uname(&mut u) } != 0 {
        return "unknown".into();
    }
    // SAFETY: uname NUL-terminates `release` within the array.
    unsafe { CStr::from_ptr(u.release.as_ptr()) }.to_string_lossy().into_owned()
}

/// Whether an array map with `BPF_F_MMAPABLE` can be created (Linux 5.5, `kernel/bpf/arraymap.c`): the flag the
/// XDP reply collector's array needs. aya's probes create arrays without flags, so this is a `BPF_MAP_CREATE` of
/// its own: map type, key size, value size, max entries, flags, the rest of `union bpf_attr` zero.
pub(crate) fn mmapable_array_supported() -> bool {
    const BPF_MAP_CREATE: libc::c_long = 0;
    const BPF_MAP_TYPE_ARRAY: u32 = 2;
    const BPF_F_MMAPABLE: u32 = 1 << 10;
    let mut attr = [0u32; 32];
    attr[..5].copy_from_slice(&[BPF_MAP_TYPE_ARRAY, 4, 8, 1, BPF_F_MMAPABLE]);
    // SAFETY: bpf(2) reads `size` bytes of `attr`, a live buffer of that size; a returned fd is ours to close.
    let fd = unsafe {
        libc::syscall(libc::SYS_bpf, BPF_MAP_CREATE, attr.as_mut_ptr(), std::mem::size_of_val(&attr) as libc::c_uint)
    };
    if fd < 0 {
        return false;
    }
    // SAFETY: `fd` was just returned by bpf(2) and nothing else owns it.
    drop(unsafe { OwnedFd::from_raw_fd(fd as i32) });
    true
}
