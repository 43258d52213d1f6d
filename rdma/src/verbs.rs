//! Owned wrappers over the libibverbs objects the transport uses, each released exactly once by `Drop`.
//!
//! Lifetimes are enforced with `Arc`s pointing from dependent to parent objects: a protection domain keeps its
//! device context open, a memory region its protection domain, a CQ its completion channel and context, a QP
//! its CQ and protection domain. libibverbs refuses to release an object that is still in use (it returns
//! `EBUSY`), so releasing children first is required, and the `Arc`s guarantee it.
//!
//! What `Arc`s cannot express: registered memory must outlive every work request that points into it. The
//! connection keeps the QP and the buffers in one struct whose fields drop in order (QP first, buffers after),
//! and destroying a QP ends all its work requests (the device no longer touches their memory afterwards).
//!
//! Thread safety: libibverbs objects may be used from any thread (the library and the kernel driver lock
//! internally), which is why these wrappers are `Send` and `Sync`; each connection nevertheless drives its QP
//! and CQ from a single task.

use crate::ibverbs;
use rdma_sys as sys;
use std::ffi::CStr;
use std::io;
use std::ptr::NonNull;
use std::sync::Arc;

/// `errno` of the last failed libc/verbs call, as an `io::Error`, with context.
pub(crate) fn last_err(what: &str) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// Verbs calls that return an errno value (0 on success) instead of setting `errno`.
pub(crate) fn rc_err(what: &str, rc: i32) -> io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        let e = io::Error::from_raw_os_error(rc.abs());
        Err(io::Error::new(e.kind(), format!("{what}: {e}")))
    }
}

/// Names of the verbs devices libibverbs finds (empty when there are none or the kernel has no RDMA support).
/// libibverbs is loaded only if the kernel lists a verbs device (`ibverbs.rs`).
pub fn device_names() -> Vec<String> {
    if !ibverbs::kernel_lists_devices() {
        return Vec::new();
    }
    let Ok(ib) = ibverbs::load() else { return Vec::new() };
    let mut n: i32 = 0;
    // SAFETY: ibv_get_device_list writes the count into `n` and returns a NULL-terminated array we free below,
    // or NULL on failure (e.g. ENOSYS without kernel support), which we treat as "no devices".
    let list = unsafe { (ib.get_device_list)(&mut n) };
    if list.is_null() {
        return Vec::new();
    }
    let mut names = Vec::new();
    for i in 0..n.max(0) as usize {
        // SAFETY: `list` has `n` valid entries (ibv_get_device_list's contract).
        let dev = unsafe { *list.add(i) };
        if dev.is_null() {
            break;
        }
        // SAFETY: dev is a valid ibv_device; the returned name is a NUL-terminated string owned by it, which we
        // copy before the list is freed.
        let name = unsafe { CStr::from_ptr((ib.get_device_name)(dev)) };
        names.push(name.to_string_lossy().into_owned());
    }
    // SAFETY: `list` came from ibv_get_device_list and is freed once; no ibv_device pointer escapes.
    unsafe { (ib.free_device_list)(list) };
    names
}

/// An open device context (`ibv_open_device`); closed on drop.
pub(crate) struct Context {
    ptr: NonNull<sys::ibv_context>,
}

// SAFETY: an ibv_context may be used from any thread (libibverbs locks internally); we only hand out raw
// pointers to code in this crate that respects the object lifetimes.
unsafe impl Send for Context {}
// SAFETY: as above; no method takes `&mut` state on the Rust side.
unsafe impl Sync for Context {}

impl Context {
    /// Open the device called `name`.
    pub(crate) fn open(name: &str) -> io::Result<Arc<Context>> {
        let ib = ibverbs::load().map_err(|e| io::Error::new(io::ErrorKind::NotFound, e))?;
        let mut n: i32 = 0;
        // SAFETY: see `device_names`.
        let list = unsafe { (ib.get_device_list)(&mut n) };
        if list.is_null() {
            return Err(last_err("ibv_get_device_list"));
        }
        let mut ctx = std::ptr::null_mut();
        for i in 0..n.max(0) as usize {
            // SAFETY: `list` has `n` valid entries.
            let dev = unsafe { *list.add(i) };
            if dev.is_null() {
                break;
            }
            // SAFETY: valid device; the name is copied/compared before the list is freed.
            let dn = unsafe { CStr::from_ptr((ib.get_device_name)(dev)) };
            if dn.to_bytes() == name.as_bytes() {
                // SAFETY: valid device from the live list; the context stays valid after the list is freed
                // (ibv_open_device takes its own reference on the device).
                ctx = unsafe { (ib.open_device)(dev) };
                break;
            }
        }
        let err = if ctx.is_null() { Some(last_err(&format!("ibv_open_device({name})"))) } else { None };
        // SAFETY: freed once, after the last use of its entries.
        unsafe { (ib.free_device_list)(list) };
        match NonNull::new(ctx) {
            Some(ptr) => Ok(Arc::new(Context { ptr })),
            None => Err(err.unwrap_or_else(|| io::Error::other(format!("no device {name}")))),
        }
    }

    pub(crate) fn as_ptr(&self) -> *mut sys::ibv_context {
        self.ptr.as_ptr()
    }

    /// Number of physical ports.
    pub(crate) fn port_count(&self) -> io::Result<u8> {
        // SAFETY: ibv_device_attr is plain old data; ibv_query_device fills it for a valid context.
        let mut attr: sys::ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: valid context and a writable attr struct of the right type.
        let rc = unsafe { (ibverbs::loaded().query_device)(self.as_ptr(), &mut attr) };
        rc_err("ibv_query_device", rc)?;
        Ok(attr.phys_port_cnt)
    }

    /// Attributes of port `port` (1-based).
    pub(crate) fn query_port(&self, port: u8) -> io::Result<sys::ibv_port_attr> {
        // SAFETY: ibv_port_attr is plain old data.
        let mut attr: sys::ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: valid context and a writable attr struct of the right type.
        let rc = unsafe { query_port(self.as_ptr(), port, &mut attr) };
        rc_err("ibv_query_port", rc)?;
        Ok(attr)
    }

    /// GID `index` of `port`, as 16 raw bytes.
    pub(crate) fn query_gid(&self, port: u8, index: i32) -> io::Result<[u8; 16]> {
        // SAFETY: ibv_gid is a 16-byte union of plain data.
        let mut gid: sys::ibv_gid = unsafe { std::mem::zeroed() };
        // SAFETY: valid context and a writable gid.
        let rc = unsafe { (ibverbs::loaded().query_gid)(self.as_ptr(), port, index, &mut gid) };
        if rc != 0 {
            return Err(last_err("ibv_query_gid"));
        }
        // SAFETY: every bit pattern is a valid [u8; 16].
        Ok(unsafe { gid.raw })
    }

    /// The context's async event descriptor (owned by the context).
    pub(crate) fn async_fd(&self) -> i32 {
        // SAFETY: valid context; reading a plain field.
        unsafe { (*self.as_ptr()).async_fd }
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: opened by ibv_open_device and closed once; every child object holds an Arc to us, so none is
        // alive any more.
        unsafe { (ibverbs::loaded().close_device)(self.as_ptr()) };
    }
}

/// A protection domain; deallocated on drop.
pub(crate) struct Pd {
    ptr: NonNull<sys::ibv_pd>,
    _ctx: Arc<Context>,
}
// SAFETY: see Context.
unsafe impl Send for Pd {}
// SAFETY: see Context.
unsafe impl Sync for Pd {}

impl Pd {
    pub(crate) fn new(ctx: &Arc<Context>) -> io::Result<Arc<Pd>> {
        // SAFETY: valid context.
        let p = unsafe { (ibverbs::loaded().alloc_pd)(ctx.as_ptr()) };
        let ptr = NonNull::new(p).ok_or_else(|| last_err("ibv_alloc_pd"))?;
        Ok(Arc::new(Pd { ptr, _ctx: ctx.clone() }))
    }
    pub(crate) fn as_ptr(&self) -> *mut sys::ibv_pd {
        self.ptr.as_ptr()
    }
}

impl Drop for Pd {
    fn drop(&mut self) {
        // SAFETY: allocated once, released once; MRs and QPs hold an Arc<Pd>, so none remains.
        unsafe { (ibverbs::loaded().dealloc_pd)(self.as_ptr()) };
    }
}

/// A zeroed, page-aligned heap buffer registered with the device for local write (receives) and as a send
/// source. The memory is only touched through raw pointers, slot by slot, while the device does not own that
/// slot (the connection tracks ownership); it is deregistered before it is freed.
pub(crate) struct Buffer {
    mr: NonNull<sys::ibv_mr>,
    mem: NonNull<u8>,
    layout: std::alloc::Layout,
    _pd: Arc<Pd>,
}
// SAFETY: the buffer is plain memory plus an MR handle; see Context for the verbs object.
unsafe impl Send for Buffer {}
// SAFETY: shared access only hands out raw pointers; the connection serialises slot ownership.
unsafe impl Sync for Buffer {}

impl Buffer {
    pub(crate) fn new(pd: &Arc<Pd>, len: usize) -> io::Result<Buffer> {
        let layout = std::alloc::Layout::from_size_align(len.max(1), 4096)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        // SAFETY: layout has a non-zero size.
        let mem = NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) })
            .ok_or_else(|| io::Error::new(io::ErrorKind::OutOfMemory, "rdma buffer"))?;
        let access = sys::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0 as i32;
        // SAFETY: valid PD; [mem, mem+len) is a live allocation that stays alive until after ibv_dereg_mr.
        let mr = unsafe {
            (ibverbs::loaded().reg_mr)(pd.as_ptr(), mem.as_ptr() as *mut libc::c_void, layout.size(), access)
        };
        match NonNull::new(mr) {
            Some(mr) => Ok(Buffer { mr, mem, layout, _pd: pd.clone() }),
            None => {
                let e = last_err("ibv_reg_mr (is RLIMIT_MEMLOCK, `ulimit -l`, large enough?)");
                // SAFETY: allocated above with this layout, not registered, freed once.
                unsafe { std::alloc::dealloc(mem.as_ptr(), layout) };
                Err(e)
            }
        }
    }
    pub(crate) fn addr(&self) -> *mut u8 {
        self.mem.as_ptr()
    }
    pub(crate) fn len(&self) -> usize {
        self.layout.size()
    }
    pub(crate) fn lkey(&self) -> u32 {
        // SAFETY: valid MR; reading a plain field.
        unsafe { (*self.mr.as_ptr()).lkey }
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: registered once; the owning connection destroyed its QP before dropping the buffer, so no work
        // request refers to this memory any more. Deregistration happens before the memory is freed.
        unsafe {
            (ibverbs::loaded().dereg_mr)(self.mr.as_ptr());
            std::alloc::dealloc(self.mem.as_ptr(), self.layout);
        }
    }
}

/// A completion channel: its descriptor becomes readable when an armed CQ gets a completion.
pub(crate) struct CompChannel {
    ptr: NonNull<sys::ibv_comp_channel>,
    _ctx: Arc<Context>,
}
// SAFETY: see Context.
unsafe impl Send for CompChannel {}
// SAFETY: see Context.
unsafe impl Sync for CompChannel {}

impl CompChannel {
    pub(crate) fn new(ctx: &Arc<Context>) -> io::Result<Arc<CompChannel>> {
        // SAFETY: valid context.
        let p = unsafe { (ibverbs::loaded().create_comp_channel)(ctx.as_ptr()) };
        let ptr = NonNull::new(p).ok_or_else(|| last_err("ibv_create_comp_channel"))?;
        let ch = Arc::new(CompChannel { ptr, _ctx: ctx.clone() });
        set_nonblocking(ch.fd())?;
        Ok(ch)
    }
    pub(crate) fn as_ptr(&self) -> *mut sys::ibv_comp_channel {
        self.ptr.as_ptr()
    }
    pub(crate) fn fd(&self) -> i32 {
        // SAFETY: valid channel; plain field.
        unsafe { (*self.as_ptr()).fd }
    }
}

impl Drop for CompChannel {
    fn drop(&mut self) {
        // SAFETY: created once, destroyed once; CQs using it hold an Arc, so none remains.
        unsafe { (ibverbs::loaded().destroy_comp_channel)(self.as_ptr()) };
    }
}

/// Put a descriptor in non-blocking mode (for the completion channel and async event descriptors).
pub(crate) fn set_nonblocking(fd: i32) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor we own (through its verbs object); no memory is passed.
    unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        if fl < 0 || libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK) < 0 {
            return Err(last_err("fcntl(O_NONBLOCK)"));
        }
    }
    Ok(())
}

/// A completion queue bound to a completion channel.
pub(crate) struct Cq {
    ptr: NonNull<sys::ibv_cq>,
    channel: Arc<CompChannel>,
}
// SAFETY: see Context.
unsafe impl Send for Cq {}
// SAFETY: see Context.
unsafe impl Sync for Cq {}

/// What [`Cq::take_event`] found on the channel.
pub(crate) enum CqEvent {
    /// One event for our CQ was consumed (the CQ must be re-armed and drained).
    Event,
    /// Nothing to read.
    Empty,
}

impl Cq {
    pub(crate) fn new(ctx: &Arc<Context>, channel: &Arc<CompChannel>, entries: i32) -> io::Result<Arc<Cq>> {
        // SAFETY: valid context and channel; no cq_context.
        let p =
            unsafe { (ibverbs::loaded().create_cq)(ctx.as_ptr(), entries, std::ptr::null_mut(), channel.as_ptr(), 0) };
        let ptr = NonNull::new(p).ok_or_else(|| last_err("ibv_create_cq"))?;
        Ok(Arc::new(Cq { ptr, channel: channel.clone() }))
    }
    pub(crate) fn as_ptr(&self) -> *mut sys::ibv_cq {
        self.ptr.as_ptr()
    }

    /// Arm the CQ: the channel gets an event for the next completion.
    pub(crate) fn req_notify(&self) -> io::Result<()> {
        // SAFETY: valid CQ; rdma-sys calls the provider's req_notify_cq op.
        let rc = unsafe { sys::ibv_req_notify_cq(self.as_ptr(), 0) };
        rc_err("ibv_req_notify_cq", rc)
    }

    /// Read one event from the (non-blocking) channel and acknowledge it at once.
    pub(crate) fn take_event(&self) -> io::Result<CqEvent> {
        let mut cq: *mut sys::ibv_cq = std::ptr::null_mut();
        let mut cq_ctx: *mut libc::c_void = std::ptr::null_mut();
        // SAFETY: valid channel in non-blocking mode; out-pointers are valid locals.
        let rc = unsafe { (ibverbs::loaded().get_cq_event)(self.channel.as_ptr(), &mut cq, &mut cq_ctx) };
        if rc != 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::WouldBlock {
                return Ok(CqEvent::Empty);
            }
            return Err(io::Error::new(e.kind(), format!("ibv_get_cq_event: {e}")));
        }
        // SAFETY: `cq` is our CQ (the channel serves one CQ); acknowledging the one event just read, at once,
        // so none is left unacknowledged when the CQ is destroyed (ibv_destroy_cq would wait for it).
        unsafe { (ibverbs::loaded().ack_cq_events)(cq, 1) };
        Ok(CqEvent::Event)
    }

    /// Poll up to `wc.len()` completions; returns how many were written.
    pub(crate) fn poll(&self, wc: &mut [sys::ibv_wc]) -> io::Result<usize> {
        // SAFETY: valid CQ; `wc` has room for wc.len() entries.
        let n = unsafe { sys::ibv_poll_cq(self.as_ptr(), wc.len() as i32, wc.as_mut_ptr()) };
        if n < 0 {
            return Err(io::Error::other("ibv_poll_cq failed"));
        }
        Ok(n as usize)
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        // SAFETY: created once, destroyed once; every event was acknowledged (take_event acks at once) and the
        // QP using this CQ holds an Arc to it, so it is already destroyed.
        unsafe { (ibverbs::loaded().destroy_cq)(self.as_ptr()) };
    }
}

/// A reliable-connected queue pair.
pub(crate) struct Qp {
    ptr: NonNull<sys::ibv_qp>,
    /// Largest send the device accepts inline (`IBV_SEND_INLINE`), as granted at creation; 0 for none.
    max_inline: u32,
    _cq: Arc<Cq>,
    _pd: Arc<Pd>,
}
// SAFETY: see Context.
unsafe impl Send for Qp {}
// SAFETY: see Context.
unsafe impl Sync for Qp {}

/// What the remote side of an RC QP is, for the RESET→INIT→RTR→RTS transitions.
pub(crate) struct QpPath {
    pub port: u8,
    pub sgid_index: u8,
    pub dgid: [u8; 16],
    pub dlid: u16,
    pub dest_qpn: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub mtu: sys::ibv_mtu::Type,
}

impl Qp {
    /// Create an RC QP using `cq` for both queues. `max_inline` is the inline send size asked for (0: none);
    /// a device that refuses it gets a second try without inline sends, and the size it granted (which may be
    /// larger than asked) is what [`Qp::post_send`] uses.
    pub(crate) fn new_rc(pd: &Arc<Pd>, cq: &Arc<Cq>, send_wr: u32, recv_wr: u32, max_inline: u32) -> io::Result<Qp> {
        let create = |max_inline: u32| {
            // SAFETY: plain old data initialised field by field below.
            let mut init: sys::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
            init.send_cq = cq.as_ptr();
            init.recv_cq = cq.as_ptr();
            init.qp_type = sys::ibv_qp_type::IBV_QPT_RC;
            init.cap.max_send_wr = send_wr;
            init.cap.max_recv_wr = recv_wr;
            init.cap.max_send_sge = 1;
            init.cap.max_recv_sge = 1;
            init.cap.max_inline_data = max_inline;
            init.sq_sig_all = 0;
            // SAFETY: valid PD and CQ; `init` is fully initialised; on success libibverbs writes the granted
            // capabilities back into `init.cap`.
            let p = unsafe { (ibverbs::loaded().create_qp)(pd.as_ptr(), &mut init) };
            NonNull::new(p).map(|p| (p, init.cap.max_inline_data)).ok_or_else(|| last_err("ibv_create_qp"))
        };
        let (ptr, max_inline) = match create(max_inline) {
            Err(_) if max_inline > 0 => create(0)?,
            r => r?,
        };
        Ok(Qp { ptr, max_inline, _cq: cq.clone(), _pd: pd.clone() })
    }
    /// Largest message [`Qp::post_send`] sends inline (0: none).
    pub(crate) fn max_inline(&self) -> u32 {
        self.max_inline
    }
    pub(crate) fn as_ptr(&self) -> *mut sys::ibv_qp {
        self.ptr.as_ptr()
    }
    pub(crate) fn qpn(&self) -> u32 {
        // SAFETY: valid QP; plain field.
        unsafe { (*self.as_ptr()).qp_num }
    }

    fn modify(&self, attr: &mut sys::ibv_qp_attr, mask: sys::ibv_qp_attr_mask, what: &str) -> io::Result<()> {
        // SAFETY: valid QP; `attr` is initialised for every field named in `mask`.
        let rc = unsafe { (ibverbs::loaded().modify_qp)(self.as_ptr(), attr, mask.0 as i32) };
        rc_err(what, rc)
    }

    /// RESET → INIT → RTR → RTS with the given path and timers.
    pub(crate) fn connect(&self, p: &QpPath, cfg: &crate::Config) -> io::Result<()> {
        use sys::ibv_qp_attr_mask as M;
        // SAFETY: plain old data.
        let mut a: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = sys::ibv_qp_state::IBV_QPS_INIT;
        a.pkey_index = 0;
        a.port_num = p.port;
        a.qp_access_flags = 0;
        self.modify(
            &mut a,
            M::IBV_QP_STATE | M::IBV_QP_PKEY_INDEX | M::IBV_QP_PORT | M::IBV_QP_ACCESS_FLAGS,
            "modify QP to INIT",
        )?;

        // SAFETY: plain old data.
        let mut a: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = sys::ibv_qp_state::IBV_QPS_RTR;
        a.path_mtu = p.mtu;
        a.dest_qp_num = p.dest_qpn;
        a.rq_psn = p.rq_psn;
        a.max_dest_rd_atomic = 1;
        a.min_rnr_timer = cfg.min_rnr_timer;
        a.ah_attr.is_global = 1;
        a.ah_attr.grh.dgid = sys::ibv_gid { raw: p.dgid };
        a.ah_attr.grh.sgid_index = p.sgid_index;
        a.ah_attr.grh.hop_limit = 64;
        a.ah_attr.dlid = p.dlid;
        a.ah_attr.port_num = p.port;
        self.modify(
            &mut a,
            M::IBV_QP_STATE
                | M::IBV_QP_AV
                | M::IBV_QP_PATH_MTU
                | M::IBV_QP_DEST_QPN
                | M::IBV_QP_RQ_PSN
                | M::IBV_QP_MAX_DEST_RD_ATOMIC
                | M::IBV_QP_MIN_RNR_TIMER,
            "modify QP to RTR",
        )?;

        // SAFETY: plain old data.
        let mut a: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = sys::ibv_qp_state::IBV_QPS_RTS;
        a.timeout = cfg.timeout;
        a.retry_cnt = cfg.retry_cnt;
        a.rnr_retry = cfg.rnr_retry;
        a.sq_psn = p.sq_psn;
        a.max_rd_atomic = 1;
        self.modify(
            &mut a,
            M::IBV_QP_STATE
                | M::IBV_QP_TIMEOUT
                | M::IBV_QP_RETRY_CNT
                | M::IBV_QP_RNR_RETRY
                | M::IBV_QP_SQ_PSN
                | M::IBV_QP_MAX_QP_RD_ATOMIC,
            "modify QP to RTS",
        )
    }

    /// Move the QP to the error state: outstanding work requests complete with `IBV_WC_WR_FLUSH_ERR`.
    pub(crate) fn set_error(&self) -> io::Result<()> {
        // SAFETY: plain old data.
        let mut a: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = sys::ibv_qp_state::IBV_QPS_ERR;
        self.modify(&mut a, sys::ibv_qp_attr_mask::IBV_QP_STATE, "modify QP to ERR")
    }

    /// Post one receive of `len` bytes at `addr` (inside `buf`).
    pub(crate) fn post_recv(&self, wr_id: u64, buf: &Buffer, offset: usize, len: u32) -> io::Result<()> {
        debug_assert!(offset + len as usize <= buf.len());
        let mut sge = sys::ibv_sge { addr: buf.addr() as u64 + offset as u64, length: len, lkey: buf.lkey() };
        let mut wr = sys::ibv_recv_wr { wr_id, next: std::ptr::null_mut(), sg_list: &mut sge, num_sge: 1 };
        let mut bad: *mut sys::ibv_recv_wr = std::ptr::null_mut();
        // SAFETY: valid QP; the SGE lies inside a registered buffer that outlives the QP (see module docs); the
        // WR and SGE are copied by the provider during the call.
        let rc = unsafe { sys::ibv_post_recv(self.as_ptr(), &mut wr, &mut bad) };
        rc_err("ibv_post_recv", rc)
    }

    /// Post one SEND_WITH_IMM of `len` bytes at `offset` in `buf` (`len` may be 0). Only a `signaled` send
    /// produces a completion when it succeeds (the QP is created with `sq_sig_all = 0`); since a send queue
    /// completes in order, a signaled completion also means every send posted before it is done. A send of at
    /// most [`Qp::max_inline`] bytes goes inline: the provider copies the bytes into the work request during
    /// the call (no memory-region lookup, no read of `buf` by the device later).
    pub(crate) fn post_send(
        &self,
        wr_id: u64,
        buf: &Buffer,
        offset: usize,
        len: u32,
        imm: u32,
        signaled: bool,
    ) -> io::Result<()> {
        debug_assert!(offset + len as usize <= buf.len());
        let mut sge = sys::ibv_sge { addr: buf.addr() as u64 + offset as u64, length: len, lkey: buf.lkey() };
        // SAFETY: ibv_send_wr is plain old data (pointers, integers, unions of those); zero is valid.
        let mut wr: sys::ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = wr_id;
        wr.next = std::ptr::null_mut();
        wr.sg_list = &mut sge;
        wr.num_sge = if len == 0 { 0 } else { 1 };
        wr.opcode = sys::ibv_wr_opcode::IBV_WR_SEND_WITH_IMM;
        let mut flags = if signaled { sys::ibv_send_flags::IBV_SEND_SIGNALED.0 } else { 0 };
        if len > 0 && len <= self.max_inline {
            flags |= sys::ibv_send_flags::IBV_SEND_INLINE.0;
        }
        wr.send_flags = flags;
        wr.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
        let mut bad: *mut sys::ibv_send_wr = std::ptr::null_mut();
        // SAFETY: valid QP; the SGE lies inside a registered buffer that outlives the QP, and the connection does
        // not touch that slot again until this send's completion or a later signaled one (in-order send queue);
        // WR and SGE are read during the call only.
        let rc = unsafe { sys::ibv_post_send(self.as_ptr(), &mut wr, &mut bad) };
        rc_err("ibv_post_send", rc)
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        // SAFETY: created once, destroyed once; all async events were acknowledged as they were read.
        unsafe { (ibverbs::loaded().destroy_qp)(self.as_ptr()) };
    }
}

/// `ibv_query_port` as verbs.h defines it (inline): through the provider's `query_port` op with the size of the
/// whole `ibv_port_attr` when the context has one, else the exported compat entry point, which fills the older,
/// shorter layout (the fields after it stay zero).
///
/// # Safety
/// `ctx` is a live context made by libibverbs; `attr` points to a writable `ibv_port_attr`.
unsafe fn query_port(ctx: *mut sys::ibv_context, port: u8, attr: *mut sys::ibv_port_attr) -> i32 {
    // A verbs_context embeds the ibv_context as its last field; `abi_compat` is all ones in one.
    // SAFETY: `ctx` is live (caller).
    if unsafe { (*ctx).abi_compat } as usize == u32::MAX as usize {
        let off = std::mem::offset_of!(sys::verbs_context, context);
        // SAFETY: container_of: the context is the `context` field of a verbs_context (checked just above).
        let vctx = unsafe { ctx.cast::<u8>().sub(off).cast::<sys::verbs_context>() };
        // The op is there if the provider's verbs_context is large enough to hold it, and set.
        let needed = std::mem::size_of::<sys::verbs_context>() - std::mem::offset_of!(sys::verbs_context, query_port);
        // SAFETY: a live verbs_context; `sz` says how much of it the provider filled in.
        if unsafe { (*vctx).sz } >= needed {
            // SAFETY: as above; the field lies within the provider's structure.
            if let Some(op) = unsafe { (*vctx).query_port } {
                // SAFETY: the provider's op, given the live context and the caller's attr with its size.
                return unsafe { op(ctx, port, attr, std::mem::size_of::<sys::ibv_port_attr>()) };
            }
        }
    }
    // SAFETY: the compat layout is a prefix of ibv_port_attr, so the caller's struct has room for it.
    unsafe { (ibverbs::loaded().query_port)(ctx, port, attr.cast()) }
}

/// Human-readable name of a work completion status (`ibv_wc_status_str`).
/// Without libibverbs (no verbs device, so no completion either): `status N`.
pub fn wc_status_str(status: u32) -> String {
    let Ok(ib) = ibverbs::load() else { return format!("status {status}") };
    // SAFETY: ibv_wc_status_str accepts any value and returns a static NUL-terminated string.
    let s = unsafe { CStr::from_ptr((ib.wc_status_str)(status)) };
    s.to_string_lossy().into_owned()
}

/// Raw layout of `struct ibv_async_event` with the event type read as an integer (rdma-sys maps it to a Rust
/// enum, which would be undefined behaviour for a value a newer kernel might add).
#[repr(C)]
pub(crate) struct RawAsyncEvent {
    pub element: u64,
    pub event_type: u32,
}

/// Names of `enum ibv_event_type` values.
pub fn event_type_str(t: u32) -> &'static str {
    match t {
        0 => "IBV_EVENT_CQ_ERR",
        1 => "IBV_EVENT_QP_FATAL",
        2 => "IBV_EVENT_QP_REQ_ERR",
        3 => "IBV_EVENT_QP_ACCESS_ERR",
        4 => "IBV_EVENT_COMM_EST",
        5 => "IBV_EVENT_SQ_DRAINED",
        6 => "IBV_EVENT_PATH_MIG",
        7 => "IBV_EVENT_PATH_MIG_ERR",
        8 => "IBV_EVENT_DEVICE_FATAL",
        9 => "IBV_EVENT_PORT_ACTIVE",
        10 => "IBV_EVENT_PORT_ERR",
        11 => "IBV_EVENT_LID_CHANGE",
        12 => "IBV_EVENT_PKEY_CHANGE",
        13 => "IBV_EVENT_SM_CHANGE",
        14 => "IBV_EVENT_SRQ_ERR",
        15 => "IBV_EVENT_SRQ_LIMIT_REACHED",
        16 => "IBV_EVENT_QP_LAST_WQE_REACHED",
        17 => "IBV_EVENT_CLIENT_REREGISTER",
        18 => "IBV_EVENT_GID_CHANGE",
        19 => "IBV_EVENT_WQ_FATAL",
        _ => "IBV_EVENT_(unknown)",
    }
}

/// Read one async event from the context's (non-blocking) descriptor and acknowledge it.
/// Returns (event type, element: QP pointer / port number as raw bits), or None when there is none.
pub(crate) fn take_async_event(ctx: &Context) -> io::Result<Option<(u32, u64)>> {
    let mut ev = RawAsyncEvent { element: 0, event_type: 0 };
    // SAFETY: RawAsyncEvent has the layout of struct ibv_async_event (an 8-byte union of pointers/int, then a
    // 4-byte enum); the context is valid and its async_fd is non-blocking.
    let rc = unsafe {
        (ibverbs::loaded().get_async_event)(ctx.as_ptr(), &mut ev as *mut RawAsyncEvent as *mut sys::ibv_async_event)
    };
    if rc != 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::WouldBlock {
            return Ok(None);
        }
        return Err(io::Error::new(e.kind(), format!("ibv_get_async_event: {e}")));
    }
    let out = (ev.event_type, ev.element);
    // SAFETY: acknowledging the event just read, once (required before its QP/CQ can be destroyed).
    unsafe { (ibverbs::loaded().ack_async_event)(&mut ev as *mut RawAsyncEvent as *mut sys::ibv_async_event) };
    Ok(Some(out))
}

/// The `ibv_mtu` code for a path MTU in bytes (rounded down to a valid one).
pub(crate) fn mtu_code(bytes: u32) -> sys::ibv_mtu::Type {
    match bytes {
        4096.. => sys::ibv_mtu::IBV_MTU_4096,
        2048.. => sys::ibv_mtu::IBV_MTU_2048,
        1024.. => sys::ibv_mtu::IBV_MTU_1024,
        512.. => sys::ibv_mtu::IBV_MTU_512,
        _ => sys::ibv_mtu::IBV_MTU_256,
    }
}

/// Bytes of an `ibv_mtu` code (0 for an invalid code).
pub(crate) fn mtu_bytes(code: sys::ibv_mtu::Type) -> u32 {
    match code {
        1..=5 => 128 << code,
        _ => 0,
    }
}
