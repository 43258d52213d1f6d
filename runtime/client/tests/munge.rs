//! `vigil_client::munge::credential` against a munged of the test's own (its own key, socket, pid and log files in
//! a temporary directory; killed after), decoded with munge's own `unmunge`: the credential is this process's
//! user's and carries the payload `vigil-imp` checks. Run as root (munged wants its files root's); skipped, saying
//! why, without munge.

use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::time::{Duration, Instant};

#[test]
fn a_credential_is_made_by_this_user_over_the_payload() {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: runs as root (munged)");
        return;
    }
    let have = |p: &str| {
        Command::new("sh").args(["-c", &format!("command -v {p}")]).output().is_ok_and(|o| o.status.success())
    };
    if !have("munged") || !have("unmunge") {
        eprintln!("skipped: munge is not installed (apt-get install munge)");
        return;
    }
    let dir = tempfile::Builder::new().prefix("vigil-client-munge").tempdir().unwrap();
    let p = |f: &str| dir.path().join(f);
    std::fs::write(p("munge.key"), (0..1024).map(|i| (i * 7919 % 251) as u8).collect::<Vec<u8>>()).unwrap();
    std::fs::set_permissions(p("munge.key"), std::fs::Permissions::from_mode(0o600)).unwrap();
    let arg = |k: &str, f: &str| format!("--{k}={}", p(f).display());
    let o = Command::new("munged")
        .args(["--force", &arg("socket", "sock"), &arg("key-file", "munge.key"), &arg("pid-file", "pid")])
        .args([arg("log-file", "log"), arg("seed-file", "seed")])
        .output()
        .unwrap();
    assert!(o.status.success(), "munged: {}", String::from_utf8_lossy(&o.stderr));
    struct Kill(std::path::PathBuf);
    impl Drop for Kill {
        fn drop(&mut self) {
            if let Some(pid) = std::fs::read_to_string(&self.0).ok().and_then(|s| s.trim().parse::<i32>().ok()) {
                // SAFETY: kill(2) on the munged this test started.
                unsafe { libc::kill(pid, libc::SIGTERM) };
            }
        }
    }
    let _kill = Kill(p("pid"));
    let t0 = Instant::now();
    while !p("sock").exists() {
        assert!(t0.elapsed() < Duration::from_secs(10), "munged's socket did not appear");
        std::thread::sleep(Duration::from_millis(20));
    }

    let jobspec = br#"{"version":1}"#;
    let cred = vigil_client::munge::credential("cluster", jobspec, Some(&p("sock"))).expect("a credential");
    assert!(cred.starts_with("MUNGE:"), "{cred}");
    let mut c = Command::new("unmunge");
    c.arg("-S").arg(p("sock")).arg("-m").arg(p("meta")).stdin(std::process::Stdio::piped());
    c.stdout(std::process::Stdio::piped());
    let mut child = c.spawn().unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), cred.as_bytes()).unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "unmunge: {}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(String::from_utf8_lossy(&o.stdout), vigil_client::munge::payload("cluster", jobspec));
    let meta = std::fs::read_to_string(p("meta")).unwrap();
    assert!(meta.lines().any(|l| l.starts_with("UID:") && l.contains("(0)")), "made by root: {meta}");
    assert!(meta.lines().any(|l| l.starts_with("TTL:")), "{meta}");

    // munged gone: the error says munge's reason.
    let e = vigil_client::munge::credential("cluster", jobspec, Some(&p("nosuch"))).unwrap_err();
    assert!(e.to_string().starts_with("munge: "), "{e}");
}
