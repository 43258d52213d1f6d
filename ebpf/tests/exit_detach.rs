//! The eBPF exit watcher's drop does not wait for the kernel to detach its tracepoints. In a test binary of its
//! own: it counts this process's tracepoint pins, which other tests of one binary (threads of the same process)
//! would add to while it counts. Run as root.

/// Dropping the eBPF watcher must not wait for its tracepoints to be detached: each detach waits for RCU grace
/// periods, and a broker holding the links' descriptors waited for them on every exit (its parent with it). The
/// links are held by pins, which drop has removed in the background; the kernel detaches then. Compares the drop with the
/// load measured in the same test (both include the same tracepoints), never with an absolute time.
#[tokio::test]
async fn dropping_the_ebpf_watcher_does_not_wait_for_the_detach() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: eBPF needs root");
        return;
    }
    let pins = || {
        std::fs::read_dir("/sys/fs/bpf/vigil-tp")
            .map(|d| {
                d.flatten()
                    .filter(|e| e.file_name().to_string_lossy().starts_with(&format!("{}-", std::process::id())))
                    .count()
            })
            .unwrap_or(0)
    };
    let before = pins();
    let t0 = std::time::Instant::now();
    let w = vigil_ebpf::ExitWatcher::new().expect("load the exit watcher");
    let load = t0.elapsed();
    assert_eq!(pins(), before + 3, "its three tracepoint links are pinned");
    let t1 = std::time::Instant::now();
    drop(w);
    let drop_time = t1.elapsed();
    assert!(drop_time * 4 < load, "dropping took {drop_time:?}, loading {load:?}: the drop waited for the detach");
    // The pins are removed in the background (by a detached process: on 6.1 the removal itself waits for the
    // detach).
    let t2 = std::time::Instant::now();
    while pins() != before && t2.elapsed() < std::time::Duration::from_secs(10) {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(pins(), before, "dropping the watcher removes its pins");
}
