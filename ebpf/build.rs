//! Compiles the BPF C programs in `bpf/` with clang into `$OUT_DIR/*.bpf.o`.
//!
//! Needs `clang` (override with `$CLANG`) and libbpf's headers
//! (`/usr/include/bpf`, Debian package `libbpf-dev`; override the include dir
//! with `$LIBBPF_INCLUDE`). `bpf/vmlinux.h` is committed (generated with
//! `bpftool btf dump file /sys/kernel/btf/vmlinux format c`), CO-RE
//! relocations make the objects portable to other kernels.
use std::{env, path::PathBuf, process::Command};

/// (source in bpf/, object name, extra clang flags): the tracing programs twice, with the ring buffer and with the
/// perf buffer of older kernels (bpf/output.h).
const PROGRAMS: &[(&str, &str, &[&str])] = &[
    ("exit", "exit", &[]),
    ("exit", "exit-perfbuf", &["-DVIGIL_PERFBUF"]),
    ("tcp", "tcp", &[]),
    ("tcp", "tcp-perfbuf", &["-DVIGIL_PERFBUF"]),
    ("xdp", "xdp", &[]),
    ("hub", "hub", &[]),
];

fn main() {
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR"));
    let clang = env::var("CLANG").unwrap_or_else(|_| "clang".to_owned());
    println!("cargo:rerun-if-env-changed=CLANG");
    println!("cargo:rerun-if-env-changed=LIBBPF_INCLUDE");
    println!("cargo:rerun-if-changed=bpf/vmlinux.h");
    println!("cargo:rerun-if-changed=bpf/events.h");
    println!("cargo:rerun-if-changed=bpf/probe.h");
    println!("cargo:rerun-if-changed=bpf/frame.h");
    println!("cargo:rerun-if-changed=bpf/output.h");
    for (prog, name, flags) in PROGRAMS {
        let src = format!("bpf/{prog}.bpf.c");
        println!("cargo:rerun-if-changed={src}");
        let obj = out.join(format!("{name}.bpf.o"));
        let mut cmd = Command::new(&clang);
        cmd.args(["-O2", "-g", "-target", "bpf", "-D__TARGET_ARCH_x86", "-Wall", "-Werror"]).arg("-Ibpf").args(*flags);
        if let Ok(inc) = env::var("LIBBPF_INCLUDE") {
            cmd.arg(format!("-I{inc}"));
        }
        cmd.arg("-c").arg(&src).arg("-o").arg(&obj);
        let status = cmd.status().unwrap_or_else(|e| panic!("failed to run {clang} (install clang + libbpf-dev): {e}"));
        assert!(status.success(), "{clang} failed on {src}: {status}");
    }
}
