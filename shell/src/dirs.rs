//! The job's directories on this node: its temporary directory (`VIGIL_JOB_TMPDIR`: R and the jobspec's files) and
//! the allocation's (`VIGIL_ALLOC_TMPDIR`), made before the tasks start and removed after.

use crate::Shell;
use vigil_proto::shellproto::ALLOC_SUBDIR;

/// Make directory `dir`, new (not one that exists already), mode 0700, owned by this process's user.
fn make_private_dir(dir: &std::path::Path) -> Result<(), String> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new().mode(0o700).create(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    // Whatever the umask took away.
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| format!("cannot chmod {}: {e}", dir.display()))
}

impl Shell {
    /// Create the job's temporary directory on this node: `R.json` (the job's R, RFC 20) and the jobspec's files.
    pub(crate) fn make_tmpdir(&mut self) -> Result<(), String> {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        let dir = match &self.input.tmpdir {
            Some(d) => std::path::PathBuf::from(d),
            None => {
                let base = std::env::var("TMPDIR").unwrap_or_else(|_| "/tmp".into());
                std::path::PathBuf::from(base).join(format!(
                    "vigil-job-{}-{}-{}",
                    self.input.id_f58,
                    self.input.shell_rank,
                    std::process::id()
                ))
            }
        };
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        std::fs::write(dir.join("R.json"), self.input.r.to_string())
            .map_err(|e| format!("cannot write R.json: {e}"))?;
        for (name, f) in &self.input.files {
            if name.contains('/') || name == ".." || name.is_empty() {
                return Err(format!("invalid file name '{name}' in attributes.system.files"));
            }
            let data = f.get("data").and_then(|d| d.as_str()).unwrap_or("");
            let mode = f.get("mode").and_then(|m| m.as_u64()).unwrap_or(0o644) as u32 & 0o777;
            let path = dir.join(name);
            std::fs::write(&path, data).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
                .map_err(|e| format!("chmod {}: {e}", path.display()))?;
        }
        self.alloc_tmpdir = self.make_alloc_tmpdir(&dir);
        self.tmpdir = Some(dir);
        Ok(())
    }

    /// The allocation's directory on this node (`VIGIL_ALLOC_TMPDIR`, chosen by the broker). One this job owns
    /// is made here, new and mode 0700 (never one that someone made first: in a shared base such as /dev/shm
    /// that could be another user's); where it cannot be, the job gets `ALLOC_SUBDIR` of its tmpdir `job_dir`
    /// instead, and its stderr says why. One of the enclosing allocation is checked, and made again if a job of
    /// the allocation removed it. `None`: the tasks get none (said on stderr, unless the broker is too old to
    /// choose one).
    fn make_alloc_tmpdir(&mut self, job_dir: &std::path::Path) -> Option<(std::path::PathBuf, bool)> {
        let a = self.input.alloc_tmpdir.clone()?;
        let path = std::path::PathBuf::from(&a.path);
        let host = nix::unistd::gethostname().ok().and_then(|h| h.into_string().ok()).unwrap_or_default();
        let on = format!("on {host} (rank {})", self.input.broker_rank);
        let fallback = job_dir.join(ALLOC_SUBDIR);
        if !a.owned {
            if path.is_dir() {
                return Some((path, false));
            }
            // Removed by a job of the allocation (its owner, the batch job's shell, removes it only at the end):
            // made again, still the allocation's; else this job's own, as where one cannot be made.
            match make_private_dir(&path) {
                Ok(()) => {
                    self.notes.push(format!(
                        "vigil-shell: the allocation's directory {} was gone {on}: made again, empty",
                        path.display()
                    ));
                    return Some((path, false));
                }
                Err(e) => self.notes.push(format!(
                    "vigil-shell: the allocation's directory was gone and {e} {on}: VIGIL_ALLOC_TMPDIR is {} instead",
                    fallback.display()
                )),
            }
            return make_private_dir(&fallback)
                .map(|()| (fallback, true))
                .map_err(|e| {
                    self.notes.push(format!("vigil-shell: {e} {on}: VIGIL_ALLOC_TMPDIR is unset"));
                })
                .ok();
        }
        match make_private_dir(&path) {
            Ok(()) => return Some((path, true)),
            Err(e) if path == fallback => {
                self.notes.push(format!("vigil-shell: {e} {on}: VIGIL_ALLOC_TMPDIR is unset"));
                return None;
            }
            Err(e) => self.notes.push(format!(
                "vigil-shell: {e} {on} (exec.alloc-tmpdir-base): VIGIL_ALLOC_TMPDIR is {} instead",
                fallback.display()
            )),
        }
        match make_private_dir(&fallback) {
            Ok(()) => Some((fallback, true)),
            Err(e) => {
                self.notes.push(format!("vigil-shell: {e} {on}: VIGIL_ALLOC_TMPDIR is unset"));
                None
            }
        }
    }

    /// Remove the job's temporary directory `dir`: the files this shell wrote into it, then the directory, which
    /// is all it takes when the tasks left nothing there (two or three system calls where a recursive removal
    /// lists the directory first); a directory the tasks wrote into is removed recursively.
    pub(crate) fn remove_tmpdir(&self, dir: &std::path::Path) {
        let _ = std::fs::remove_file(dir.join("R.json"));
        for name in self.input.files.keys() {
            let _ = std::fs::remove_file(dir.join(name));
        }
        if std::fs::remove_dir(dir).is_err() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}
