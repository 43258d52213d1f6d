//! The shell links no libhwloc: its broker places the tasks (runtime/driver/src/broker/placement.rs). Loading
//! libhwloc and what it pulls in (libudev) was about a sixth of a short job's shell CPU, and the shell starts once
//! per job per node, so a use of hwloc that creeps back into the shell caps job throughput again. (It would also
//! break `cargo build-shell`, the static link, which ci/test.sh runs: libhwloc and libudev have no static archive.)

#[test]
fn the_shell_binary_does_not_link_libhwloc() {
    let shell = env!("CARGO_BIN_EXE_vigil-shell");
    let out = std::process::Command::new("ldd").arg(shell).output().expect("ldd runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("libc.so"), "ldd did not list the shell's libraries:\n{text}");
    assert!(!text.contains("libhwloc"), "vigil-shell links libhwloc again:\n{text}");
}
