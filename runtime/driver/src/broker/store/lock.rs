//! The state directory's lock ([`LOCK`]): the rank 0 that uses a directory holds it, so that a second one is
//! refused naming the first's pid. [`Store::open`](super::Store::open) (`mod.rs`) takes it.

use std::path::Path;

use super::OpenError;

/// The lock file of a state directory: locked (`flock`, exclusive) by the rank 0 that uses the directory, and
/// naming its pid, so that a second rank 0 on the same directory (a copy of the configuration with other ports)
/// is refused instead of writing the same store. The kernel releases it when that process ends, however.
pub const LOCK: &str = "vigil.lock";

/// Take the lock of `dir` ([`LOCK`]), or say who holds it.
pub(crate) fn lock(dir: &Path) -> Result<std::fs::File, OpenError> {
    use std::io::{Read as _, Seek as _, Write as _};
    use std::os::fd::AsRawFd as _;
    let path = dir.join(LOCK);
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| OpenError::Unwritable { dir: dir.to_path_buf(), err: format!("{}: {e}", path.display()) })?;
    // A lock this process has just let go of may still be held for a moment by a child it is starting: between
    // fork (or vfork) and exec the child shares every open file, this one too. So a refusal is retried for
    // 100 ms; another rank 0 holds it for good.
    let mut locked = false;
    for _ in 0..10 {
        // SAFETY: flock on a descriptor we own; no memory is involved.
        locked = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0;
        if locked {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    if !locked {
        let mut s = String::new();
        let _ = f.read_to_string(&mut s);
        let pid = s.trim().chars().take(20).collect::<String>();
        return Err(OpenError::InUse { dir: dir.to_path_buf(), pid: if pid.is_empty() { "?".into() } else { pid } });
    }
    let _ = f.set_len(0).and_then(|()| f.rewind()).and_then(|()| writeln!(f, "{}", std::process::id()));
    Ok(f)
}
