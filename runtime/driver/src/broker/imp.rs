//! The privileged launcher, `vigil-imp`, as a broker that is not root uses it in a multi-user instance
//! (docs/security.md): the check at start that it can (the launcher is there, setuid root, and munged answers),
//! the request a guest's shell is started with (`vigil-imp exec`), and the signals sent to a guest's job
//! (`vigil-imp kill`). The request's format is the `vigil-imp` crate's ("Invocation").

use crate::shellproto::ImpCredential;
use std::path::{Path, PathBuf};

/// munge's own default socket, where `$VIGIL_MUNGE_SOCKET` names none.
const MUNGE_DEFAULT_SOCKET: &str = "/run/munge/munge.socket.2";

/// The launcher a broker running as `uid` uses: `None` where it needs none (an instance of its owner only, or a
/// root broker, which starts guests' shells as their users itself); else `exec.imp` (`configured`), or
/// `vigil-imp` beside this program, checked.
///
/// # Errors
/// A multi-user instance whose broker is not root, and the launcher is missing, not an executable file, or not
/// setuid root, or munged does not answer on this node: the message says which, and what to set.
pub(super) fn needed(guests: bool, uid: u32, configured: Option<&Path>) -> Result<Option<PathBuf>, String> {
    if !guests || uid == 0 {
        return Ok(None);
    }
    let path = match configured {
        Some(p) => p.to_path_buf(),
        None => std::env::current_exe()
            .ok()
            .and_then(|p| p.parent().map(|d| d.join("vigil-imp")))
            .ok_or("cannot tell where this program is, to find vigil-imp beside it: set exec.imp")?,
    };
    let why = |what: String| {
        format!(
            "a multi-user instance (access.allow-guest-users) whose brokers run as uid {uid}, not root, starts guests' \
             jobs through vigil-imp, and {what} (exec.imp names it; see docs/security.md)"
        )
    };
    let m = std::fs::metadata(&path).map_err(|e| why(format!("{}: {e}", path.display())))?;
    use std::os::unix::fs::MetadataExt;
    if !m.is_file() || m.mode() & 0o111 == 0 {
        return Err(why(format!("{} is not an executable file", path.display())));
    }
    if m.uid() != 0 || m.mode() & 0o4000 == 0 {
        return Err(why(format!(
            "{} is not setuid root (owner uid {}, mode {:o}: chown root:root, chmod 4755)",
            path.display(),
            m.uid(),
            m.mode() & 0o7777
        )));
    }
    let socket = munge_socket();
    std::os::unix::net::UnixStream::connect(&socket).map_err(|e| {
        why(format!(
            "munged does not answer on this node at {} ({e}): start munge, or set $VIGIL_MUNGE_SOCKET to its socket",
            socket.display()
        ))
    })?;
    Ok(Some(path))
}

/// munged's socket on this node: `$VIGIL_MUNGE_SOCKET`, else munge's default.
fn munge_socket() -> PathBuf {
    std::env::var_os(crate::client::munge::SOCKET_ENV)
        .filter(|s| !s.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| MUNGE_DEFAULT_SOCKET.into())
}

/// The request `vigil-imp exec` reads on its standard input before the shell's own input: for user `uid`, in
/// cgroup `cgroup` (if any), with the submitter's credential and the jobspec's text it covers.
pub(super) fn request(uid: u32, cgroup: Option<&Path>, c: &ImpCredential) -> Vec<u8> {
    let mut r = format!("vigil-imp 1\nuid={uid}\n");
    if let Some(d) = cgroup {
        r.push_str(&format!("cgroup={}\n", d.display()));
    }
    r.push_str(&format!("credential={}\njobspec-bytes={}\n\n", c.credential, c.jobspec.len()));
    let mut b = r.into_bytes();
    b.extend_from_slice(c.jobspec.as_bytes());
    b
}

/// Send `signal` to the processes of a guest's job in cgroup `cgroup` (all of them, or `pid` alone if it is
/// one of them) through `vigil-imp kill`, which checks that the cgroup is under its `cgroup-root`. Runs the
/// launcher and waits for it (milliseconds): call it off the broker's loop.
///
/// # Errors
/// The launcher could not be run, or refused: its message.
pub(super) fn kill(imp: &Path, cgroup: &Path, signal: i32, pid: Option<i32>) -> Result<(), String> {
    let mut c = std::process::Command::new(imp);
    c.arg("kill").arg(cgroup).arg(signal.to_string());
    if let Some(p) = pid {
        c.arg(p.to_string());
    }
    let o = c.stdin(std::process::Stdio::null()).output().map_err(|e| format!("cannot run {}: {e}", imp.display()))?;
    if o.status.success() {
        return Ok(());
    }
    Err(String::from_utf8_lossy(&o.stderr).trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_is_the_header_then_the_jobspec() {
        let c = ImpCredential { credential: "MUNGE:abc:".into(), jobspec: r#"{"version":1}"#.into() };
        let r = request(1001, Some(Path::new("/sys/fs/cgroup/v/job-1")), &c);
        assert_eq!(
            String::from_utf8(r).unwrap(),
            "vigil-imp 1\nuid=1001\ncgroup=/sys/fs/cgroup/v/job-1\ncredential=MUNGE:abc:\njobspec-bytes=13\n\n\
             {\"version\":1}"
        );
        let r = request(7, None, &c);
        assert!(String::from_utf8(r).unwrap().starts_with("vigil-imp 1\nuid=7\ncredential="));
    }

    #[test]
    fn only_a_multi_user_instance_of_a_broker_not_root_needs_it_and_a_bad_one_is_named() {
        assert_eq!(needed(false, 1000, None), Ok(None));
        assert_eq!(needed(true, 0, None), Ok(None));
        let e = needed(true, 1000, Some(Path::new("/nonexistent/vigil-imp"))).unwrap_err();
        assert!(e.contains("/nonexistent/vigil-imp") && e.contains("exec.imp"), "{e}");
        // An executable that is not setuid root.
        let e = needed(true, 1000, Some(Path::new("/bin/sh"))).unwrap_err();
        assert!(e.contains("is not setuid root") || e.contains("munged"), "{e}");
    }
}
