//! Network namespaces for the detector tests that need more than loopback (tcp.rs, xdp.rs): made by the test,
//! addressed inside 10.200.0.0/16, removed on drop.

use std::process::Command;

/// Network namespaces a test made; removed on drop (their veth pairs with them).
pub(crate) struct Netns(pub(crate) Vec<String>);

impl Drop for Netns {
    fn drop(&mut self) {
        for n in &self.0 {
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
    }
}

/// Runs `ip ARGS` (split at spaces) and asserts it succeeded.
pub(crate) fn ip(args: &str) {
    let st = Command::new("ip").args(args.split_whitespace()).status().expect("ip");
    assert!(st.success(), "ip {args}");
}

/// Runs `f` on a thread that entered network namespace `ns` (sockets made there stay in it).
pub(crate) fn in_ns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let path = format!("/var/run/netns/{ns}");
    std::thread::spawn(move || {
        let fd = std::fs::File::open(&path).expect("netns file");
        // SAFETY: setns on a valid netns fd; affects only this thread.
        let rc = unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&fd), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns {path}: {}", std::io::Error::last_os_error());
        f()
    })
    .join()
    .expect("netns thread")
}
