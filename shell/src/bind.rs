//! CPU binding with the kernel's affinity calls (`sched_setaffinity`, `sched_getaffinity`): the shell is the only
//! Vigil program that binds. CPUs are *OS* indices of processing units, i.e. the numbers the kernel uses in
//! `sched_setaffinity` and `/proc/*/status` (what [`TaskPlacement::cpus`](vigil_proto::shellproto::TaskPlacement)
//! holds). Placement itself is the broker's, with hwloc; this module links no hwloc.

use std::fmt;
use vigil_proto::affinity::format_cpulist;

/// Why a [`CpuMask`] could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum MaskError {
    /// An empty CPU list was given where at least one CPU is required.
    #[error("empty cpu list")]
    EmptyCpuList,

    /// A CPU (OS PU index) is not representable in a `cpu_set_t`, i.e. it
    /// is `>= limit` where `limit` is `libc::CPU_SETSIZE` (1024 on glibc).
    #[error("cpu {cpu} is out of range (must be < {limit})")]
    CpuOutOfRange {
        /// The offending OS PU index.
        cpu: u32,
        /// Exclusive upper bound.
        limit: u32,
    },
}

/// A CPU affinity mask (`libc::cpu_set_t`, i.e. OS PU indices
/// `0..CPU_SETSIZE`) built ahead of time so that it can be applied in a
/// context where allocation is forbidden.
///
/// Typical use: build it in the parent with [`CpuMask::new`], then call
/// [`CpuMask::apply`] from `std::os::unix::process::CommandExt::pre_exec`
/// (after `fork`, before `exec`).
#[derive(Clone, Copy)]
pub(crate) struct CpuMask(libc::cpu_set_t);

/// `CPU_SETSIZE` as a `u32`.
const CPU_SETSIZE_U32: u32 = libc::CPU_SETSIZE as u32;

fn empty_cpu_set() -> libc::cpu_set_t {
    // SAFETY: cpu_set_t is a plain array of integers; all-zero is the empty set.
    unsafe { std::mem::zeroed() }
}

impl CpuMask {
    /// Build a mask containing exactly `cpus` (OS PU indices, any order,
    /// duplicates allowed).
    ///
    /// # Errors
    /// [`MaskError::EmptyCpuList`] if `cpus` is empty;
    /// [`MaskError::CpuOutOfRange`] if an index is `>= libc::CPU_SETSIZE`.
    /// CPUs that do not exist on the machine are only detected by the kernel
    /// in [`apply`](Self::apply) (EINVAL if *no* listed CPU is usable).
    pub(crate) fn new(cpus: &[u32]) -> Result<Self, MaskError> {
        if cpus.is_empty() {
            return Err(MaskError::EmptyCpuList);
        }
        let mut set = empty_cpu_set();
        for &c in cpus {
            if c >= CPU_SETSIZE_U32 {
                return Err(MaskError::CpuOutOfRange { cpu: c, limit: CPU_SETSIZE_U32 });
            }
            // SAFETY: c < CPU_SETSIZE, so CPU_SET stays in bounds.
            unsafe { libc::CPU_SET(c as usize, &mut set) };
        }
        Ok(CpuMask(set))
    }

    /// The OS PU indices in the mask, ascending.
    pub(crate) fn cpus(&self) -> Vec<u32> {
        (0..CPU_SETSIZE_U32)
            .filter(|&c| {
                // SAFETY: c < CPU_SETSIZE, in bounds of the set.
                unsafe { libc::CPU_ISSET(c as usize, &self.0) }
            })
            .collect()
    }

    /// Bind the calling thread (pid 0) to this mask with
    /// `sched_setaffinity`. Async-signal-safe (one syscall, no allocation),
    /// so it may run in `pre_exec`. In a single-threaded child this binds
    /// the whole process; in a multi-threaded process only the calling
    /// thread (and threads/children it creates later) are affected.
    ///
    /// # Errors
    /// The OS error from `sched_setaffinity` (e.g. `EINVAL` if no CPU in
    /// the mask is online and allowed by the cgroup).
    pub(crate) fn apply(&self) -> std::io::Result<()> {
        // SAFETY: valid pointer to a fully initialised cpu_set_t of the
        // size passed.
        let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &self.0) };
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }
}

impl fmt::Debug for CpuMask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CpuMask({})", format_cpulist(&self.cpus()))
    }
}

/// Read the calling thread's allowed CPUs (`sched_getaffinity` on pid 0) as
/// ascending OS PU indices. Works on machines with more than
/// `CPU_SETSIZE` CPUs (the buffer grows as needed). Allocates: not for use
/// in `pre_exec`.
///
/// # Errors
/// The OS error from `sched_getaffinity`.
pub(crate) fn current_affinity() -> std::io::Result<Vec<u32>> {
    const WORD_BITS: usize = libc::c_ulong::BITS as usize;
    let mut nbits: usize = libc::CPU_SETSIZE as usize;
    loop {
        let mut buf: Vec<libc::c_ulong> = vec![0; nbits / WORD_BITS];
        let bytes = buf.len() * std::mem::size_of::<libc::c_ulong>();
        // SAFETY: buf is `bytes` long and suitably aligned for cpu_set_t's
        // element type; the kernel writes at most `bytes` bytes.
        let rc = unsafe { libc::sched_getaffinity(0, bytes, buf.as_mut_ptr().cast::<libc::cpu_set_t>()) };
        if rc == 0 {
            let mut out = Vec::new();
            for (w, word) in buf.iter().enumerate() {
                for b in 0..WORD_BITS {
                    if word & (1 << b) != 0 {
                        out.push(u32::try_from(w * WORD_BITS + b).unwrap_or(u32::MAX));
                    }
                }
            }
            return Ok(out);
        }
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::EINVAL) && nbits < (1 << 22) {
            nbits *= 2;
            continue;
        }
        return Err(err);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vigil_proto::affinity::parse_cpulist;

    /// Bind the calling thread to `cpus` (EINVAL for a list a mask cannot hold).
    fn bind_current_process(cpus: &[u32]) -> std::io::Result<()> {
        CpuMask::new(cpus).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?.apply()
    }

    #[test]
    fn cpumask_validation() {
        assert_eq!(CpuMask::new(&[]).unwrap_err(), MaskError::EmptyCpuList);
        assert!(matches!(CpuMask::new(&[0, 5000]), Err(MaskError::CpuOutOfRange { cpu: 5000, .. })));
        assert_eq!(CpuMask::new(&[3, 1, 3]).unwrap().cpus(), vec![1, 3]);
        assert_eq!(format!("{:?}", CpuMask::new(&[3, 0, 1]).unwrap()), "CpuMask(0-1,3)");
        assert_eq!(MaskError::EmptyCpuList.to_string(), "empty cpu list");
        assert_eq!(
            CpuMask::new(&[5000]).unwrap_err().to_string(),
            format!("cpu 5000 is out of range (must be < {})", libc::CPU_SETSIZE)
        );
        let e = bind_current_process(&[]).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
        let e = bind_current_process(&[1 << 20]).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
    }

    /// A CPU this process may use: 0 if allowed, otherwise the first allowed.
    fn target_cpu() -> u32 {
        let aff = current_affinity().unwrap();
        assert!(!aff.is_empty());
        if aff.contains(&0) {
            0
        } else {
            aff[0]
        }
    }

    #[test]
    fn bind_roundtrip_in_thread() {
        let cpu = target_cpu();
        let before_main = current_affinity().unwrap();
        std::thread::spawn(move || {
            let before = current_affinity().unwrap();
            bind_current_process(&[cpu]).unwrap();
            assert_eq!(current_affinity().unwrap(), vec![cpu]);
            // restore
            bind_current_process(&before).unwrap();
            assert_eq!(current_affinity().unwrap(), before);
        })
        .join()
        .unwrap();
        // other threads were never affected
        assert_eq!(current_affinity().unwrap(), before_main);
    }

    #[test]
    fn bind_rejects_bad_cpus() {
        std::thread::spawn(|| {
            let before = current_affinity().unwrap();
            assert!(bind_current_process(&[]).is_err());
            assert!(bind_current_process(&[100_000]).is_err());
            if !before.contains(&1023) {
                let e = bind_current_process(&[1023]).unwrap_err();
                assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
            }
            assert_eq!(current_affinity().unwrap(), before, "failed binds must not change affinity");
        })
        .join()
        .unwrap();
    }

    /// Build the mask before fork, apply it in the child with only
    /// async-signal-safe calls, report via exit status.
    #[test]
    fn cpumask_apply_in_forked_child() {
        let cpu = target_cpu();
        let mask = CpuMask::new(&[cpu]).unwrap();
        let before = current_affinity().unwrap();
        // SAFETY: the child only performs async-signal-safe operations
        // (sched_setaffinity, sched_getaffinity, _exit).
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            let code = if mask.apply().is_err() {
                2
            } else {
                // SAFETY: zeroed cpu_set_t is valid; syscalls on our own stack data.
                unsafe {
                    let mut set: libc::cpu_set_t = std::mem::zeroed();
                    if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
                        3
                    } else if libc::CPU_COUNT(&set) == 1 && libc::CPU_ISSET(cpu as usize, &set) {
                        0
                    } else {
                        4
                    }
                }
            };
            // SAFETY: terminate the child without running destructors/atexit.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waiting for our own child.
        let rc = unsafe { libc::waitpid(pid, &mut status, 0) };
        assert_eq!(rc, pid);
        assert!(libc::WIFEXITED(status), "child did not exit normally");
        assert_eq!(libc::WEXITSTATUS(status), 0, "child binding check failed");
        assert_eq!(current_affinity().unwrap(), before, "parent affinity changed");
    }

    /// The intended production use: `pre_exec(move || mask.apply())`.
    #[test]
    fn cpumask_in_pre_exec() {
        use std::os::unix::process::CommandExt;
        let cpu = target_cpu();
        let mask = CpuMask::new(&[cpu]).unwrap();
        let mut cmd = std::process::Command::new("cat");
        cmd.arg("/proc/self/status");
        // SAFETY: CpuMask::apply is async-signal-safe.
        unsafe {
            cmd.pre_exec(move || mask.apply());
        }
        let out = cmd.output().expect("run cat");
        assert!(out.status.success());
        let text = String::from_utf8_lossy(&out.stdout);
        let line = text
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .expect("Cpus_allowed_list in /proc/self/status");
        assert_eq!(parse_cpulist(line.trim()).unwrap(), vec![cpu]);
        assert_eq!(format_cpulist(&[cpu]), line.trim());
    }
}
