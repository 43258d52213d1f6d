//! Shared plumbing: loading BPF objects, attaching tracepoints and polling a
//! ring buffer map through tokio.

use std::task::{Context, Poll, ready};

use aya::{
    Ebpf,
    maps::{MapData, RingBuf},
    programs::TracePoint,
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
    Ok(Ebpf::load(object)?)
}

/// Loads (verifier) and attaches program `prog` to tracepoint `category/name`.
pub(crate) fn attach_tracepoint(
    bpf: &mut Ebpf,
    prog: &'static str,
    category: &str,
    name: &str,
) -> Result<(), EbpfError> {
    let p: &mut TracePoint =
        bpf.program_mut(prog).ok_or(EbpfError::Missing(prog))?.try_into().map_err(prog_err(prog))?;
    p.load().map_err(prog_err(prog))?;
    // The link is owned by the program, which lives as long as the `Ebpf`.
    p.attach(category, name).map_err(|e| {
        if crate::error::is_e2big(&e) {
            EbpfError::TracepointFull { name: prog, tracepoint: format!("{category}/{name}") }
        } else {
            prog_err(prog)(e)
        }
    })?;
    Ok(())
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
