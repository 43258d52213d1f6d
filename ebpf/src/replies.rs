//! Reply collection on a parent's node: the XDP program records each child's last probe reply in an mmapped
//! array (`RESULTS` in `bpf/xdp.bpf.c`), so a prober reads all its children's replies from shared memory, with
//! no system call and no datagram per reply.
//!
//! Slots: a prober puts a slot number in its requests' `rank` field; unicast replies echo it, and a child node's
//! kernel, which learned it from a unicast request, puts it in its replies to group probes. Slots come in blocks
//! of [`SLOT_BLOCK`] claimed atomically in `SLOT_CLAIMS` (insert-if-absent), so the probers of every broker on
//! a node (nested and test instances) share one array without coordination. A prober releases its blocks when
//! it stops; blocks of a prober whose process is gone are reclaimed when no block is free.

use std::{net::SocketAddrV4, sync::Mutex};

use aya::{
    Pod,
    maps::{Array, HashMap, IterableMap, Map, MapData},
};

use crate::{
    Probe, ProbeKind,
    error::{EbpfError, map_err},
};

/// Slots in the array (`VIGIL_SLOTS` in `bpf/probe.h`).
pub const SLOTS: u32 = 65536;
/// Slots per claimed block (`VIGIL_SLOT_BLOCK`).
pub const SLOT_BLOCK: u32 = 64;

/// Every block of the reply array once, in the order process `pid`'s prober on UDP `port` tries to claim them:
/// from a start and with an odd stride both taken from a hash of the two (double hashing; any odd stride visits
/// every block of a power-of-two count). Probers of one machine so start apart and do not trail each other, and a
/// claim costs about one map insert while blocks are free, however many probers came before.
pub(crate) fn block_order(pid: u32, port: u16) -> impl Iterator<Item = u32> {
    const BLOCKS: u32 = SLOTS / SLOT_BLOCK;
    const { assert!(BLOCKS.is_power_of_two()) };
    let h = pid.wrapping_mul(0x9e37_79b1) ^ u32::from(port).wrapping_mul(0x85eb_ca6b);
    let h = (h ^ (h >> 15)).wrapping_mul(0x2c1b_3c6d);
    let (start, stride) = (h % BLOCKS, ((h >> 16) % BLOCKS) | 1);
    (0..BLOCKS).map(move |i| start.wrapping_add(i.wrapping_mul(stride)) % BLOCKS)
}

/// One slot (`struct vigil_result` in `bpf/probe.h`): the last reply collected for one child.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct ResultSlot {
    expect_addr: u32,
    expect_port: u16,
    prober_port: u16,
    seq: u32,
    flags: u16,
    kind: u8,
    pad: u8,
    sent_ns: u64,
    hb_age_ns: u64,
    answered: u64,
    replies: u64,
}
const _: () = assert!(std::mem::size_of::<ResultSlot>() == 48);
// SAFETY: repr(C) integers with explicit padding fields (48 bytes, checked above): every bit pattern is valid.
unsafe impl Pod for ResultSlot {}

/// Owner of a block of slots (`struct vigil_slot_claim`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct SlotClaim {
    pid: u32,
    port: u32,
}
// SAFETY: two u32, no padding: every bit pattern is valid.
unsafe impl Pod for SlotClaim {}

/// Whether no process `pid` exists.
fn pid_gone(pid: u32) -> bool {
    // SAFETY: kill with signal 0 sends nothing; it only checks that the process exists.
    let rc = unsafe { libc::kill(pid as libc::pid_t, 0) };
    rc != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
}

/// `BPF_NOEXIST`: insert only if the key is absent (include/uapi/linux/bpf.h).
const BPF_NOEXIST: u64 = 1;

/// The node's reply array, mapped into this process, and the table of slot claims.
pub struct ReplyArea {
    /// Keeps the array's map alive for as long as it is mapped.
    results: Array<MapData, ResultSlot>,
    claims: Mutex<HashMap<MapData, u32, SlotClaim>>,
    base: *mut ResultSlot,
    /// Pages of the array mapped so far (bit per page): only those of the blocks this process claimed. Mapping
    /// the whole 3 MiB array made it resident in every broker sharing the table (a BPF array's mmap inserts
    /// every page at once), most of which never probe.
    mapped: Mutex<Vec<u64>>,
}

// SAFETY: `base` points into a MAP_SHARED mapping that lives as long as the ReplyArea; every access goes through
// volatile reads and writes of plain integers (the kernel writes the same memory concurrently), never through
// references, so sharing the pointer between threads creates no data race in the Rust sense.
unsafe impl Send for ReplyArea {}
// SAFETY: as above.
unsafe impl Sync for ReplyArea {}

impl std::fmt::Debug for ReplyArea {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplyArea").field("slots", &SLOTS).finish()
    }
}

const AREA_BYTES: usize = SLOTS as usize * std::mem::size_of::<ResultSlot>();
/// Smallest page size of the architectures Vigil runs on; the mapping granule is [`page`], a multiple of it.
const MIN_PAGE: usize = 4096;
/// Upper bound of the pages of the array's value area (the bitmap's size).
const AREA_PAGES: usize = AREA_BYTES.div_ceil(MIN_PAGE);

/// The system's page size (a BPF array is mapped page by page).
fn page() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 { p as usize } else { MIN_PAGE }
}

impl ReplyArea {
    /// Maps `results` (the `RESULTS` array, created with `BPF_F_MMAPABLE`) and takes `claims` (`SLOT_CLAIMS`).
    pub(crate) fn new(results: Map, claims: Map) -> Result<ReplyArea, EbpfError> {
        let claims = HashMap::try_from(claims).map_err(map_err("SLOT_CLAIMS"))?;
        let results: Array<MapData, ResultSlot> = Array::try_from(results).map_err(map_err("RESULTS"))?;
        if results.len() != SLOTS {
            return Err(EbpfError::Missing("RESULTS of VIGIL_SLOTS entries"));
        }
        // SAFETY: reserves AREA_BYTES of address space, inaccessible until `map_pages` maps the array's pages over
        // it; checked before use and unmapped on drop.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                AREA_BYTES,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(EbpfError::Io(std::io::Error::last_os_error()));
        }
        let words = AREA_PAGES.div_ceil(64);
        Ok(ReplyArea {
            results,
            claims: Mutex::new(claims),
            base: p as *mut ResultSlot,
            mapped: Mutex::new(vec![0; words]),
        })
    }

    /// Pages (first, past-the-end) holding slots `first..first + n`.
    fn pages_of(first: u32, n: u32) -> (usize, usize) {
        let size = std::mem::size_of::<ResultSlot>();
        let start = first as usize * size;
        let end = (first as usize + n as usize).min(SLOTS as usize) * size;
        (start / page(), end.div_ceil(page()))
    }

    /// Maps the array's pages holding slots `first..first + n` into the reserved area (shared with the kernel).
    fn map_pages(&self, first: u32, n: u32) -> Result<(), EbpfError> {
        use std::os::fd::{AsFd, AsRawFd};
        let (lo, hi) = Self::pages_of(first, n);
        let page = page();
        let mut mapped = self.mapped.lock().unwrap_or_else(|e| e.into_inner());
        for p in lo..hi {
            if mapped[p / 64] & (1 << (p % 64)) != 0 {
                continue;
            }
            let fd = self.results.map().fd().as_fd().as_raw_fd();
            // SAFETY: page `p` holds slots below SLOTS, so the target lies inside the area reserved in `new`
            // (MAP_FIXED replaces only our own reservation there) and the offset inside the array's value area
            // (AREA_BYTES, a multiple of the page size: the kernel refuses anything past it).
            let m = unsafe {
                libc::mmap(
                    (self.base as *mut u8).add(p * page) as *mut libc::c_void,
                    page,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED | libc::MAP_FIXED,
                    fd,
                    (p * page) as libc::off_t,
                )
            };
            if m == libc::MAP_FAILED {
                return Err(EbpfError::Io(std::io::Error::last_os_error()));
            }
            mapped[p / 64] |= 1 << (p % 64);
        }
        Ok(())
    }

    /// Pins the array at `results` and the claims at `claims` (bpffs paths) for the other brokers of the node.
    pub(crate) fn pin(&self, results: &std::path::Path, claims: &std::path::Path) -> Result<(), aya::pin::PinError> {
        self.results.map().pin(results)?;
        let c = self.claims.lock().unwrap_or_else(|e| e.into_inner());
        aya::maps::IterableMap::map(&*c).pin(claims)
    }

    fn slot(&self, slot: u32) -> Option<*mut ResultSlot> {
        if slot >= SLOTS {
            return None;
        }
        let (lo, hi) = Self::pages_of(slot, 1);
        let mapped = self.mapped.lock().unwrap_or_else(|e| e.into_inner());
        if !(lo..hi).all(|p| mapped[p / 64] & (1 << (p % 64)) != 0) {
            return None; // not a slot of a block this process claimed
        }
        // SAFETY: in bounds (checked), and the pages holding the slot are mapped (checked).
        Some(unsafe { self.base.add(slot as usize) })
    }

    /// Claims a free block of [`SLOT_BLOCK`] slots for the prober on UDP `port`; returns its first slot.
    /// Blocks of probers whose process is gone are reclaimed when none is free. Errors: every block taken.
    /// The blocks are tried in an order of this process's own (`block_order`): with every prober trying them from
    /// block 0, the k-th prober of a machine made k failed map inserts first, and a 1,024-broker test instance
    /// spent half a million `bpf` system calls on its claims (quadratic in the brokers; the start-up curve's
    /// super-linear part, issue 42).
    pub fn claim_block(&self, port: u16) -> Result<u32, EbpfError> {
        let me = SlotClaim { pid: std::process::id(), port: u32::from(port) };
        let mut claims = self.claims.lock().unwrap_or_else(|e| e.into_inner());
        for attempt in 0..2 {
            for b in block_order(me.pid, port) {
                if claims.insert(b, me, BPF_NOEXIST).is_ok() {
                    if let Err(e) = self.map_pages(b * SLOT_BLOCK, SLOT_BLOCK) {
                        let _ = claims.remove(&b);
                        return Err(e);
                    }
                    for s in b * SLOT_BLOCK..(b + 1) * SLOT_BLOCK {
                        self.forget(s);
                    }
                    return Ok(b * SLOT_BLOCK);
                }
            }
            if attempt == 0 {
                // Reclaim the blocks of dead probers.
                let dead: Vec<u32> =
                    claims.iter().filter_map(Result::ok).filter(|(_, c)| pid_gone(c.pid)).map(|(b, _)| b).collect();
                for b in dead {
                    let _ = claims.remove(&b);
                }
            }
        }
        Err(EbpfError::Io(std::io::Error::other("every reply slot block is claimed")))
    }

    /// Gives back the block starting at `first_slot` (its slots stop collecting).
    pub fn release_block(&self, first_slot: u32) {
        for s in first_slot..first_slot.saturating_add(SLOT_BLOCK).min(SLOTS) {
            self.forget(s);
        }
        let _ = self.claims.lock().unwrap_or_else(|e| e.into_inner()).remove(&(first_slot / SLOT_BLOCK));
    }

    /// Collect, in `slot`, the replies to prober `prober_port` that come from `from`; clears the slot's last reply.
    /// Only slots of blocks this process claimed ([`claim_block`](Self::claim_block)) are mapped; others are ignored.
    pub fn expect(&self, slot: u32, prober_port: u16, from: SocketAddrV4) {
        let Some(p) = self.slot(slot) else { return };
        use std::sync::atomic::{Ordering, fence};
        // SAFETY: `p` is in bounds of the live mapping; volatile writes of integers (the kernel reads concurrently).
        // The address is written last: the XDP program matches on it, so it never sees a half-set slot.
        unsafe {
            std::ptr::addr_of_mut!((*p).expect_addr).write_volatile(0);
            fence(Ordering::Release);
            std::ptr::addr_of_mut!((*p).kind).write_volatile(0);
            std::ptr::addr_of_mut!((*p).seq).write_volatile(0);
            std::ptr::addr_of_mut!((*p).expect_port).write_volatile(from.port().to_be());
            std::ptr::addr_of_mut!((*p).prober_port).write_volatile(prober_port.to_be());
            fence(Ordering::Release);
            std::ptr::addr_of_mut!((*p).expect_addr).write_volatile(u32::from(*from.ip()).to_be());
        }
    }

    /// Stop collecting in `slot`.
    pub fn forget(&self, slot: u32) {
        let Some(p) = self.slot(slot) else { return };
        // SAFETY: in bounds of the live mapping; a volatile integer write. No reply comes from 0.0.0.0.
        unsafe { std::ptr::addr_of_mut!((*p).expect_addr).write_volatile(0) };
    }

    /// The last reply collected in `slot` (its `rank` field is the slot), and how many were collected; `None`
    /// before the first, and for a slot outside the blocks this process claimed.
    pub fn read(&self, slot: u32) -> Option<(Probe, u64)> {
        let p = self.slot(slot)?;
        use std::sync::atomic::{Ordering, fence};
        for _ in 0..4 {
            // SAFETY: in bounds of the live mapping; volatile reads of integers the kernel may be writing. The
            // kernel writes `seq` last: a slot read between two equal `seq` values is consistent.
            let (seq, v, seq2) = unsafe {
                let seq = std::ptr::addr_of!((*p).seq).read_volatile();
                fence(Ordering::Acquire);
                let v = (
                    std::ptr::addr_of!((*p).kind).read_volatile(),
                    std::ptr::addr_of!((*p).flags).read_volatile(),
                    std::ptr::addr_of!((*p).sent_ns).read_volatile(),
                    std::ptr::addr_of!((*p).hb_age_ns).read_volatile(),
                    std::ptr::addr_of!((*p).answered).read_volatile(),
                    std::ptr::addr_of!((*p).replies).read_volatile(),
                );
                fence(Ordering::Acquire);
                (seq, v, std::ptr::addr_of!((*p).seq).read_volatile())
            };
            if seq != seq2 {
                continue;
            }
            let (kind, flags, sent_ns, hb_age_ns, answered, replies) = v;
            let kind = match kind {
                2 => ProbeKind::ReplyKernel,
                3 => ProbeKind::ReplyUserspace,
                _ => return None,
            };
            return Some((Probe { kind, flags, seq, rank: slot, sent_ns, hb_age_ns, answered }, replies));
        }
        None
    }
}

impl Drop for ReplyArea {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the area reserved in `new` (with the pages mapped over it); no access follows.
        unsafe { libc::munmap(self.base as *mut libc::c_void, AREA_BYTES) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each prober's order visits every block exactly once, and the probers of one machine (consecutive pids, any
    /// port) start apart: the first free block is found in about one try while blocks are free.
    #[test]
    fn every_prober_tries_every_block_once_from_a_start_of_its_own() {
        let blocks = SLOTS / SLOT_BLOCK;
        for (pid, port) in [(1, 0), (4242, 7100), (u32::MAX, u16::MAX)] {
            let mut seen: Vec<u32> = block_order(pid, port).collect();
            seen.sort_unstable();
            assert_eq!(seen, (0..blocks).collect::<Vec<_>>(), "pid {pid} port {port}");
        }
        // Probers of consecutive pids fill half the array: count the tries of each first-free search.
        let mut taken = vec![false; blocks as usize];
        let mut tries = 0usize;
        for pid in 30_000..30_000 + blocks / 2 {
            let b = block_order(pid, 0).inspect(|_| tries += 1).find(|b| !taken[*b as usize]).expect("a free block");
            taken[b as usize] = true;
        }
        let n = (blocks / 2) as usize;
        // Half full: a first-fit scan from block 0 would have taken n(n+1)/2 tries in all.
        assert!(tries < 3 * n, "{tries} tries for {n} claims (first fit from 0: {})", n * (n + 1) / 2);
    }
}
