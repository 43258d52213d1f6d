//! Test helper for vigil-ebpf: a child process that dies in a chosen way.
//!
//! Usage: `vigil-exit-helper [--wait-stdin] MODE [ARGS]`
//!   exit N            exit(N)
//!   exit-thread N     exit(N) called from a non-main thread
//!   sleep             sleep forever
//!   segv              touch a PROT_NONE page (real page fault -> SIGSEGV)
//!   segv-thread       same, from a non-main thread
//!   hog MIB           allocate + touch MIB MiB, print "ready", sleep
//!   cg-hog PROCS MIB  write own pid to cgroup file PROCS, then like hog
//! With `--wait-stdin`, a line is read from stdin before acting, so the
//! parent can start watching first.
use std::io::{BufRead, Write};

fn fault() -> ! {
    // SAFETY: mmap with a NULL hint and MAP_ANONYMOUS has no preconditions.
    let p = unsafe {
        libc::mmap(std::ptr::null_mut(), 4096, libc::PROT_NONE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
    };
    assert_ne!(p, libc::MAP_FAILED);
    // SAFETY: deliberately reads a mapped but PROT_NONE page to get a genuine
    // kernel-generated SIGSEGV (SEGV_ACCERR); the read never completes.
    let v = unsafe { std::ptr::read_volatile(p.cast::<u8>()) };
    unreachable!("read {v} from a PROT_NONE page");
}

fn hog(mib: usize) -> ! {
    let mut v: Vec<u8> = vec![0; mib << 20];
    // Touch every page so the memory is really resident.
    for i in (0..v.len()).step_by(4096) {
        v[i] = 1;
    }
    let mut out = std::io::stdout();
    writeln!(out, "ready").unwrap();
    out.flush().unwrap();
    loop {
        std::thread::sleep(std::time::Duration::from_secs(3600));
        std::hint::black_box(&v);
    }
}

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--wait-stdin") {
        args.remove(0);
        let mut line = String::new();
        std::io::stdin().lock().read_line(&mut line).unwrap();
    }
    let num = |i: usize| -> i64 { args.get(i).and_then(|s| s.parse().ok()).expect("numeric argument") };
    match args.first().map(String::as_str) {
        Some("exit") => std::process::exit(num(1) as i32),
        Some("exit-thread") => {
            let code = num(1) as i32;
            std::thread::spawn(move || std::process::exit(code)).join().unwrap();
            unreachable!()
        }
        Some("sleep") => loop {
            std::thread::sleep(std::time::Duration::from_secs(3600));
        },
        Some("segv") => fault(),
        Some("segv-thread") => {
            std::thread::spawn(|| fault()).join().unwrap();
            unreachable!()
        }
        Some("hog") => hog(num(1) as usize),
        Some("cg-hog") => {
            std::fs::write(&args[1], std::process::id().to_string()).expect("join cgroup");
            hog(num(2) as usize)
        }
        _ => {
            eprintln!(
                "usage: vigil-exit-helper [--wait-stdin] exit N|exit-thread N|sleep|segv|segv-thread|hog MIB|cg-hog PROCS MIB"
            );
            std::process::exit(64);
        }
    }
}
