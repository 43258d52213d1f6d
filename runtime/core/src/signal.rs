//! Signal numbers the sans-IO rules hand out in effects (signal a job's shells, the initial program) and read in
//! inputs (a signal the broker process received). Linux's values on every architecture Vigil runs on (x86-64,
//! aarch64, ppc64le): named here so that the core links no libc; the driver passes them to `kill(2)` as they are.

/// Interrupt (`kill -INT`, Ctrl-C): 2.
pub const SIGINT: i32 = 2;
/// Kill, which cannot be caught: 9.
pub const SIGKILL: i32 = 9;
/// User-defined signal 1 (a job's warning before its time limit, `--signal`'s default): 10.
pub const SIGUSR1: i32 = 10;
/// User-defined signal 2: 12.
pub const SIGUSR2: i32 = 12;
/// Termination request: 15.
pub const SIGTERM: i32 = 15;
/// Continue a stopped process: 18.
pub const SIGCONT: i32 = 18;
/// The highest signal number (the last real-time signal, `SIGRTMAX()` of glibc and musl): 64.
pub const SIGRTMAX: i32 = 64;
