//! Shared plumbing: loading BPF objects, attaching tracepoints and polling a
//! ring buffer map through tokio.

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    task::{Context, Poll, ready},
};

use aya::{
    Btf, Ebpf, EbpfLoader,
    maps::{
        MapData, RingBuf,
        perf::{PerfEvent, PerfEventArray, PerfEventArrayBuffer},
    },
    programs::{TracePoint, links::FdLink},
};
use tokio::io::unix::AsyncFd;

use crate::{
    error::{EbpfError, map_err, prog_err},
    event::read_pod,
    sys,
};

/// Preconditions + load of a BPF object embedded in the binary.
pub(crate) fn load(object: &[u8]) -> Result<Ebpf, EbpfError> {
    if tokio::runtime::Handle::try_current().is_err() {
        return Err(EbpfError::NoRuntime);
    }
    let euid = sys::euid();
    if euid != 0 {
        return Err(EbpfError::NotRoot(euid));
    }
    sys::ensure_tracefs().map_err(EbpfError::Tracefs)?;
    let shared = SHARED_BTF.lock().unwrap_or_else(|e| e.into_inner()).clone();
    match shared {
        Some(btf) => Ok(EbpfLoader::new().btf(Some(&btf)).load(object)?),
        None => Ok(Ebpf::load(object)?),
    }
}

/// The kernel's BTF, parsed once for every object loaded inside [`with_kernel_btf`].
static SHARED_BTF: Mutex<Option<Arc<Btf>>> = Mutex::new(None);

/// Runs `f` with the kernel's BTF (`/sys/kernel/btf/vmlinux`) parsed once for every watcher it creates, then
/// drops it. Each CO-RE object otherwise parses the whole kernel BTF again (tens of ms of CPU and ~10 MB of
/// heap each); a caller creating an [`ExitWatcher`](crate::ExitWatcher) and a [`TcpWatcher`](crate::TcpWatcher)
/// pays that once. Without kernel BTF, `f` runs as it would without this call.
pub fn with_kernel_btf<R>(f: impl FnOnce() -> R) -> R {
    let btf = Btf::from_sys_fs().ok().map(Arc::new);
    let had = btf.is_some();
    if had {
        *SHARED_BTF.lock().unwrap_or_else(|e| e.into_inner()) = btf;
    }
    let r = f();
    if had {
        *SHARED_BTF.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
    r
}

/// Directory on bpffs where tracepoint links are pinned while their watcher lives.
const LINK_DIR: &str = "/sys/fs/bpf/vigil-tp";

/// Tracepoint links held by pins on bpffs instead of file descriptors: `<pid>-<n>-<program>` under
/// [`LINK_DIR`]. Dropping removes the pins.
///
/// Why: detaching a tracepoint program waits for RCU grace periods (`tracepoint_synchronize_unregister`, tens of
/// ms each on a small VM). Closing a link's last file descriptor detaches it in the caller's context, so a
/// process holding six links waited for six grace periods in `exit`, and its parent with it. Removing a pin
/// only drops the kernel's reference, and on recent kernels (6.18 here: `bpf_link_put` defers the free to a
/// worker since 2023) the kernel detaches the link in a worker. On older ones (6.1, traced in the VM), bpffs drops
/// a pinned link's last reference in the `unlink` itself and waits there for the detach (`synchronize_rcu_tasks_trace` in `perf_event_free_bpf_prog`,
/// ~40-70 ms per link measured in the 6.1 VM), so the pins are removed by a detached grandchild process
/// ([`unlink_detached`]) on every kernel: the caller, and its exit, never wait.
#[derive(Debug, Default)]
pub(crate) struct LinkPins(Vec<PathBuf>);

impl Drop for LinkPins {
    fn drop(&mut self) {
        unlink_detached(std::mem::take(&mut self.0));
    }
}

/// Removes `paths` in a grandchild process and returns once the intermediate child is reaped (a fork and an exit,
/// not the removals): the grandchild, re-parented to init (or the nearest subreaper), waits for whatever the
/// kernel does on `unlink`. Falls back to removing them here if `fork` fails. Errors are ignored (a pin already
/// gone, or one the next process sweeps).
fn unlink_detached(paths: Vec<PathBuf>) {
    use std::os::unix::ffi::OsStrExt;
    let paths: Vec<std::ffi::CString> =
        paths.iter().filter_map(|p| std::ffi::CString::new(p.as_os_str().as_bytes()).ok()).collect();
    if paths.is_empty() {
        return;
    }
    // SAFETY: fork in a possibly multi-threaded process: the children call only async-signal-safe functions
    // (fork, unlink, _exit) and read memory prepared before the fork; nothing is allocated or locked there.
    let child = unsafe { libc::fork() };
    match child {
        0 => {
            // SAFETY: as above (in the child).
            unsafe {
                if libc::fork() == 0 {
                    for p in &paths {
                        libc::unlink(p.as_ptr());
                    }
                }
                libc::_exit(0)
            }
        }
        -1 => {
            for p in &paths {
                // SAFETY: unlink(2) of a NUL-terminated path we own.
                unsafe { libc::unlink(p.as_ptr()) };
            }
        }
        pid => {
            let mut status = 0;
            // SAFETY: waits for our own child; ECHILD (a reaper elsewhere in the process took it) is harmless.
            unsafe { libc::waitpid(pid, &mut status, 0) };
        }
    }
}

/// Pins `link` under [`LINK_DIR`] and closes its descriptor. On error the link is gone (detached), and the
/// caller attaches again without a pin.
fn pin_link(link: FdLink, prog: &str) -> Result<PathBuf, String> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static SEQ: AtomicU64 = AtomicU64::new(0);
    static SWEPT: std::sync::Once = std::sync::Once::new();
    SWEPT.call_once(|| sweep_dead_link_pins(Path::new(LINK_DIR)));
    let n = SEQ.fetch_add(1, Ordering::Relaxed);
    let path = Path::new(LINK_DIR).join(format!("{}-{n}-{prog}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    // Dropping the pinned link closes our descriptor; the pin holds the link.
    link.pin(&path).map(drop).map(|()| path).map_err(|e| e.to_string())
}

/// True if tracepoint links can be pinned here (bpffs mounted, or mountable, and [`LINK_DIR`] made).
fn can_pin() -> bool {
    sys::ensure_bpffs().is_ok() && std::fs::create_dir_all(LINK_DIR).is_ok()
}

/// Removes the link pins of processes that are gone (killed before their watchers were dropped); the kernel
/// then detaches their programs in the background.
fn sweep_dead_link_pins(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let name = e.file_name();
        let pid = name.to_str().and_then(|n| n.split('-').next()).and_then(|p| p.parse::<u32>().ok());
        if pid.is_some_and(|p| p != std::process::id() && !sys::process_exists(p)) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Loads (verifier) and attaches program `prog` to tracepoint `category/name`. The link is pinned in `pins`
/// (see [`LinkPins`]) when bpffs allows, else owned by the program, which lives as long as the `Ebpf`.
pub(crate) fn attach_tracepoint(
    bpf: &mut Ebpf,
    pins: &mut LinkPins,
    prog: &'static str,
    category: &str,
    name: &str,
) -> Result<(), EbpfError> {
    let p: &mut TracePoint =
        bpf.program_mut(prog).ok_or(EbpfError::Missing(prog))?.try_into().map_err(prog_err(prog))?;
    p.load().map_err(prog_err(prog))?;
    let attach = |p: &mut TracePoint| {
        p.attach(category, name).map_err(|e| {
            if crate::error::is_e2big(&e) {
                EbpfError::TracepointFull { name: prog, tracepoint: format!("{category}/{name}") }
            } else {
                prog_err(prog)(e)
            }
        })
    };
    let id = attach(p)?;
    if !can_pin() {
        return Ok(());
    }
    let pinned = p.take_link(id).map_err(|e| e.to_string()).and_then(|l| {
        let fd = FdLink::try_from(l).map_err(|e| e.to_string())?;
        pin_link(fd, prog)
    });
    match pinned {
        Ok(path) => pins.0.push(path),
        Err(e) => {
            log::debug!("vigil-ebpf: link of {prog} not pinned ({e}); held by this process");
            attach(p)?;
        }
    }
    Ok(())
}

/// Where a tracing object's events arrive (`bpf/output.h`): its ring buffer, or its perf event array's buffers,
/// one per online CPU, each registered with tokio.
pub(crate) enum Events {
    /// `BPF_MAP_TYPE_RINGBUF`.
    Ring(AsyncFd<RingBuf<MapData>>),
    /// `BPF_MAP_TYPE_PERF_EVENT_ARRAY`: the buffers, and the records drained from them not yet returned.
    Perf { buffers: Vec<AsyncFd<PerfEventArrayBuffer<MapData>>>, drained: std::collections::VecDeque<Vec<u8>> },
}

/// Pages (a power of two) of each CPU's perf buffer: 32 KiB with 4 KiB pages, ~550 exit records per CPU between
/// two reads.
const PERF_PAGES: usize = 8;

/// Takes the event map `name` of an object built for `channel` out of `bpf` and registers it with tokio.
pub(crate) fn take_events(
    bpf: &mut Ebpf,
    name: &'static str,
    channel: crate::EventChannel,
) -> Result<Events, EbpfError> {
    match channel {
        crate::EventChannel::RingBuffer => take_ring(bpf, name).map(Events::Ring),
        crate::EventChannel::PerfBuffer => {
            let map = bpf.take_map(name).ok_or(EbpfError::Missing(name))?;
            let mut array = PerfEventArray::try_from(map).map_err(map_err(name))?;
            let cpus =
                aya::util::online_cpus().map_err(|(what, e)| std::io::Error::new(e.kind(), format!("{what}: {e}")))?;
            let mut buffers = Vec::with_capacity(cpus.len());
            for cpu in cpus {
                let buf = array
                    .open(cpu, Some(PERF_PAGES))
                    .map_err(|e| std::io::Error::other(format!("perf buffer of CPU {cpu} for {name}: {e}")))?;
                // SAFETY: as in `take_ring`: the buffer owns its perf event fd, moves into the `AsyncFd` and is only
                // reached through `get_inner_mut`, which never replaces it; the fd stays open for the AsyncFd's life.
                let afd = unsafe { AsyncFd::register_with_interest(buf, tokio::io::Interest::READABLE) }
                    .map_err(std::io::Error::from)?;
                buffers.push(afd);
            }
            Ok(Events::Perf { buffers, drained: Default::default() })
        }
    }
}

/// Polls the next record of type `T` from `events` (see [`poll_ring`]; records shorter than `T` are skipped, and
/// records the kernel dropped from a full perf buffer are logged).
pub(crate) fn poll_events<T: Copy>(events: &mut Events, cx: &mut Context<'_>) -> Poll<Option<T>> {
    let (buffers, drained) = match events {
        Events::Ring(ring) => return poll_ring(ring, cx),
        Events::Perf { buffers, drained } => (buffers, drained),
    };
    loop {
        while let Some(rec) = drained.pop_front() {
            if let Some(v) = read_pod::<T>(&rec) {
                return Poll::Ready(Some(v));
            }
        }
        let mut any = false;
        for buf in buffers.iter_mut() {
            let mut guard = match buf.poll_read_ready_mut(cx) {
                Poll::Pending => continue,
                Poll::Ready(Ok(g)) => g,
                Poll::Ready(Err(e)) => {
                    log::error!("vigil-ebpf: perf buffer poll failed: {e}");
                    return Poll::Ready(None);
                }
            };
            // Drain, then clear readiness: a record written after the drain sets it again (new epoll tick).
            guard.get_inner_mut().for_each(|ev| match ev {
                PerfEvent::Sample { head, tail } => drained.push_back([head, tail].concat()),
                PerfEvent::Lost { count } => {
                    log::warn!("vigil-ebpf: the kernel dropped {count} events (perf buffer full)")
                }
            });
            guard.clear_ready();
            any = true;
        }
        if !any && drained.is_empty() {
            return Poll::Pending;
        }
    }
}

/// Takes ring buffer map `name` out of `bpf` and registers it with tokio.
pub(crate) fn take_ring(bpf: &mut Ebpf, name: &'static str) -> Result<AsyncFd<RingBuf<MapData>>, EbpfError> {
    let map = bpf.take_map(name).ok_or(EbpfError::Missing(name))?;
    let ring = RingBuf::try_from(map).map_err(map_err(name))?;
    // SAFETY: the `RingBuf` owns its `MapData` (and thus the map fd), moves
    // into the `AsyncFd` and is only accessed through `get_inner_mut`, which
    // never replaces it; the fd stays open and identical for the AsyncFd's life.
    let afd = unsafe { AsyncFd::register_with_interest(ring, tokio::io::Interest::READABLE) }
        .map_err(std::io::Error::from)?;
    Ok(afd)
}

/// Polls the next record of type `T` out of the ring buffer.
///
/// Returns `Ready(None)` only if the epoll registration failed (stream end).
/// Records shorter than `T` are skipped.
pub(crate) fn poll_ring<T: Copy>(ring: &mut AsyncFd<RingBuf<MapData>>, cx: &mut Context<'_>) -> Poll<Option<T>> {
    loop {
        let mut guard = match ready!(ring.poll_read_ready_mut(cx)) {
            Ok(g) => g,
            Err(e) => {
                log::error!("vigil-ebpf: ring buffer poll failed: {e}");
                return Poll::Ready(None);
            }
        };
        // Drain first; only clear readiness once the ring is empty, so a
        // producer racing with us sets readiness again (new epoll tick).
        let rb = guard.get_inner_mut();
        while let Some(item) = rb.next() {
            if let Some(rec) = read_pod::<T>(&item) {
                return Poll::Ready(Some(rec));
            }
        }
        guard.clear_ready();
    }
}
