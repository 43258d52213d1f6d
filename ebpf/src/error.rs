//! Error type shared by all watchers.

use std::io;

/// Errors from creating or driving a watcher.
#[derive(Debug, thiserror::Error)]
pub enum EbpfError {
    /// The eBPF backend needs root; carries the effective uid.
    #[error("not running as root (euid {0})")]
    NotRoot(u32),
    /// Called outside of a tokio runtime (no reactor for `AsyncFd`).
    #[error("must be called from within a tokio runtime")]
    NoRuntime,
    /// tracefs is not mounted and mounting it on /sys/kernel/tracing failed.
    #[error("cannot mount tracefs on /sys/kernel/tracing: {0}")]
    Tracefs(#[source] io::Error),
    /// Parsing/loading the BPF object (maps, BTF relocations) failed.
    #[error("loading BPF object: {}", chain(.0))]
    Load(#[from] aya::EbpfError),
    /// Loading (verifier) or attaching one program failed.
    #[error("BPF program {name}: {}", chain(.source))]
    Program {
        /// Program (function) name in the BPF object.
        name: &'static str,
        /// Underlying aya error.
        #[source]
        source: aya::programs::ProgramError,
    },
    /// The tracepoint already has as many BPF programs attached as the kernel allows (64 per tracepoint,
    /// `BPF_TRACE_MAX_PROGS`; attaching one more fails with `E2BIG`). Every broker on a machine attaches its own
    /// watchers, so a test instance of more than 64 brokers on one kernel runs out.
    #[error(
        "BPF program {name}: tracepoint {tracepoint} already has the kernel's maximum of 64 BPF programs attached (other brokers on this machine hold them)"
    )]
    TracepointFull {
        /// Program (function) name in the BPF object.
        name: &'static str,
        /// `category/name` of the tracepoint.
        tracepoint: String,
    },
    /// A BPF map operation failed.
    #[error("BPF map {name}: {}", chain(.source))]
    Map {
        /// Map name in the BPF object.
        name: &'static str,
        /// Underlying aya error.
        #[source]
        source: aya::maps::MapError,
    },
    /// An interface named by the caller is missing, or refused the program (e.g. no native XDP in its driver).
    #[error("interface {interface}: {msg}")]
    Interface {
        /// The interface name.
        interface: String,
        /// What went wrong.
        msg: String,
    },
    /// The BPF object lacks an expected program or map (build mismatch).
    #[error("BPF object has no {0}")]
    Missing(&'static str),
    /// The pid does not exist (already reaped) or is not a thread-group leader.
    #[error("no such process {pid}: {source}")]
    NoSuchProcess {
        /// The pid passed to `watch`.
        pid: u32,
        /// Error from `pidfd_open(2)`.
        #[source]
        source: io::Error,
    },
    /// Other I/O error (pidfd, epoll registration, ...).
    #[error(transparent)]
    Io(#[from] io::Error),
}

impl EbpfError {
    /// One line for a status or a log: the message without the verifier's whole walk of the program. A program
    /// the kernel refused reads `BPF program NAME: refused by the kernel (os error): LINE`, where LINE is the
    /// verifier's first line that states an error ([`verifier_error_line`]); the full output stays in
    /// `Display` (logged at debug level by the callers).
    pub fn summary(&self) -> String {
        let full = self.to_string();
        match full.split_once("Verifier output: ") {
            Some((head, log)) => {
                let head = head.trim_end().trim_end_matches('.');
                let head = head.replace("the BPF_PROG_LOAD syscall returned", "refused by the kernel");
                match verifier_error_line(log) {
                    Some(line) => format!("{head}: {line}"),
                    None => head.to_string(),
                }
            }
            None => full,
        }
    }
}

/// The verifier's first line that states an error: its output begins with notes (`func#0 @0`, the BTF check of
/// the main program's argument that 6.1 prints for every tracepoint program, `reg type unsupported for arg#0`),
/// then the walk of the instructions (`12: (85) call ...`, `; source line`, `R1=ctx() ...`, `from 3 to 5: ...`),
/// then the error, then statistics (`processed N insns`). `None` for an empty log.
pub fn verifier_error_line(log: &str) -> Option<&str> {
    let walk_or_note = |l: &str| {
        let numbered = l.split_once(':').is_some_and(|(n, _)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
        numbered
            || l.starts_with("; ")
            || l.starts_with("func#")
            || l.starts_with("reg type unsupported for arg#0")
            || l.starts_with("from ")
            || l.starts_with("R") && l.as_bytes().get(1).is_some_and(u8::is_ascii_digit)
            || l.starts_with("last_idx")
            || l.starts_with("regs=")
            || l.starts_with("parent ")
            || l.starts_with("Validating ")
            || l.starts_with("Func#")
            || l.starts_with("mark_precise")
    };
    let stats =
        |l: &str| l.starts_with("processed ") || l.starts_with("verification time") || l.starts_with("stack depth");
    log.lines().map(str::trim).find(|l| !l.is_empty() && !walk_or_note(l) && !stats(l))
}

/// Renders an error with its `source()` chain ("a: b: c"); aya's top-level
/// messages alone are often too terse to diagnose a verifier rejection.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(src) = cur {
        let m = src.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        cur = src.source();
    }
    s
}

pub(crate) fn map_err(name: &'static str) -> impl FnOnce(aya::maps::MapError) -> EbpfError {
    move |source| EbpfError::Map { name, source }
}

/// Whether `e` (or an error it wraps) is the system call error `E2BIG`.
pub(crate) fn is_e2big(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(x) = cur {
        if x.downcast_ref::<io::Error>().and_then(io::Error::raw_os_error) == Some(libc::E2BIG) {
            return true;
        }
        cur = x.source();
    }
    false
}

pub(crate) fn prog_err(name: &'static str) -> impl FnOnce(aya::programs::ProgramError) -> EbpfError {
    move |source| EbpfError::Program { name, source }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_verifier_line_is_the_error_not_the_notes_or_the_walk() {
        // What Debian 12's 6.1 printed for a CO-RE read it could not relocate (issue 43).
        let log = "reg type unsupported for arg#0 function vigil_process_exit#57\n\
                   0: R1=ctx(off=0,imm=0) R10=fp0\n\
                   ; int vigil_process_exit(struct trace_event_raw_sched_process_exit *ctx)\n\
                   0: (85) call unknown#195896080\n\
                   invalid func unknown#195896080\n\
                   processed 1 insns (limit 1000000) max_states_per_insn 0 total_states 0 peak_states 0 mark_read 0\n";
        assert_eq!(verifier_error_line(log), Some("invalid func unknown#195896080"));
        assert_eq!(verifier_error_line("processed 0 insns\n"), None);
    }

    #[test]
    fn e2big_is_found_in_a_chain_of_errors() {
        #[derive(Debug, thiserror::Error)]
        #[error("attaching")]
        struct Wrap(#[source] io::Error);
        assert!(is_e2big(&io::Error::from_raw_os_error(libc::E2BIG)));
        assert!(is_e2big(&Wrap(io::Error::from_raw_os_error(libc::E2BIG))));
        assert!(!is_e2big(&Wrap(io::Error::from_raw_os_error(libc::EPERM))));
        let full = EbpfError::TracepointFull { name: "p", tracepoint: "sched/sched_process_exit".into() };
        assert!(full.to_string().contains("sched/sched_process_exit") && full.to_string().contains("64"), "{full}");
    }
}
