//! Running a command as the terminal's foreground job: the initial program of `vigil start`, the command of
//! `vigil alloc` and `vigil proxy`. The command gets a process group of its own, so that all it starts can be
//! signalled together, and, when stdin is a tty, the terminal, so that Ctrl-C and job control reach it and not
//! the process that started it.

/// Makes `cmd` start in a process group of its own, made the terminal's foreground group if stdin is a tty.
/// Returns whether stdin is a tty: then call [`take_terminal_back`] once the command has exited.
pub fn own_foreground_group(cmd: &mut std::process::Command) -> bool {
    use std::os::unix::process::CommandExt as _;
    // SAFETY: isatty on fd 0 has no preconditions.
    let tty = unsafe { libc::isatty(0) } == 1;
    // SAFETY: only async-signal-safe calls between fork and exec: setpgid, signal, tcsetpgrp, getpid.
    unsafe {
        cmd.pre_exec(move || {
            libc::setpgid(0, 0);
            if tty {
                libc::signal(libc::SIGTTOU, libc::SIG_IGN);
                libc::tcsetpgrp(0, libc::getpid());
                libc::signal(libc::SIGTTOU, libc::SIG_DFL);
            }
            Ok(())
        });
    }
    tty
}

/// Makes this process's group the terminal's foreground group again (after [`own_foreground_group`]'s command
/// has exited). SIGTTOU is ignored around the call, since a background group may make it.
pub fn take_terminal_back() {
    // SAFETY: plain libc calls on fd 0; the old SIGTTOU disposition is restored.
    unsafe {
        let old = libc::signal(libc::SIGTTOU, libc::SIG_IGN);
        libc::tcsetpgrp(0, libc::getpgrp());
        libc::signal(libc::SIGTTOU, old);
    }
}
