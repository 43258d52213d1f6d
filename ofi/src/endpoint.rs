//! The endpoint over libfabric: one RDM endpoint, its completion queue and address vector, posted receive
//! buffers, per-peer send queues (only with libfabric; see `stub.rs` otherwise).

use crate::error::{CallError, CompletionError, Error, Op, OpenError};
use crate::raw::{self, check, Fid, Handles, Info, RawArray, ADDR_UNSPEC, API_VERSION};
use crate::{sys, Config, Event, PeerId, Stats};
use std::collections::{HashMap, VecDeque};
use std::ffi::{CStr, CString};
use std::os::fd::RawFd;
use std::os::raw::{c_char, c_int, c_void};
use std::ptr;
use vigil_flow::{self as frag, OutQueue, Push, Sequenced};

/// Completions read per `fi_cq_readfrom` call.
const CQ_BATCH: usize = 16;
/// Completions handled per [`Endpoint::progress`] call at most, so one busy endpoint cannot starve its task.
const CQ_MAX_PER_PROGRESS: usize = 256;

/// What the endpoint knows about one inserted peer.
struct Peer {
    /// Messages (or their unsent tails) waiting for a free send slot.
    queue: OutQueue,
    rx: Sequenced,
    /// Sequence number of the next fragment posted to this peer.
    tx_seq: u32,
    failed: Option<CompletionError>,
}

impl Peer {
    fn new(cfg: &Config) -> Peer {
        Peer { queue: OutQueue::new(), rx: Sequenced::new(cfg.max_message, cfg.frag_size), tx_seq: 0, failed: None }
    }
}

/// One reliable-datagram (`FI_EP_RDM`) endpoint: talks to any number of peers whose names were inserted with
/// [`Endpoint::insert_peer`]. Driven by one task (`&mut self`); see the crate docs for what it guarantees.
pub struct Endpoint {
    // Declared first: the libfabric objects are closed (the endpoint first, which ends every posted operation)
    // before the buffers and contexts below are freed.
    h: Handles,
    /// One `fi_context2` per operation slot: receive slots `0..rx_depth`, then send slots. Providers that need
    /// `FI_CONTEXT`/`FI_CONTEXT2` use this memory while the operation is outstanding; the slot index is
    /// recovered from the context pointer a completion returns.
    ctx: RawArray<sys::fi_context2>,
    rx_buf: RawArray<u8>,
    tx_buf: RawArray<u8>,
    cfg: Config,
    /// Bytes per buffer slot (header + fragment payload).
    stride: usize,
    rx_unposted: Vec<usize>,
    tx_free: Vec<usize>,
    /// Destination of each busy send slot.
    tx_peer: Vec<u64>,
    peers: HashMap<u64, Peer>,
    /// Peers with queued output, served round robin one fragment at a time.
    ready: VecDeque<u64>,
    queued: usize,
    events: VecDeque<Event>,
    wait_fd: Option<RawFd>,
    manual_progress: bool,
    provider: String,
    fabric_name: String,
    domain_name: String,
    stats: Stats,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("provider", &self.provider)
            .field("fabric_name", &self.fabric_name)
            .field("domain_name", &self.domain_name)
            .field("peers", &self.peers.len())
            .field("queued", &self.queued)
            .finish_non_exhaustive()
    }
}

// SAFETY: libfabric objects may be used from any thread as long as calls on one domain are serialized (the
// layer asks for FI_THREAD_DOMAIN); every call goes through `&mut self` or `&self` methods of this one owner,
// and the raw buffers are owned by it. It is deliberately not Sync.
unsafe impl Send for Endpoint {}

fn cstring(what: &str, s: &str) -> Result<CString, OpenError> {
    CString::new(s).map_err(|_| OpenError::Config(format!("{what} contains a NUL byte: {s:?}")))
}

/// `strdup` for hints strings, which `fi_freeinfo` frees with `free`.
fn strdup(s: &CStr) -> *mut c_char {
    // SAFETY: s is a valid NUL-terminated string; strdup returns malloc'd memory (or NULL).
    unsafe { libc::strdup(s.as_ptr()) }
}

/// Copy a C string owned by libfabric (NULL gives "").
///
/// # Safety
/// `p` is NULL or a NUL-terminated string valid for the call.
unsafe fn c_str(p: *const c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        // SAFETY: per the function's contract.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

impl Endpoint {
    /// Find the provider (`fi_getinfo`), open fabric, domain, completion queue (with a wait descriptor when the
    /// provider offers one), address vector and endpoint, and post the receive buffers.
    pub fn open(cfg: &Config) -> Result<Endpoint, OpenError> {
        cfg.validate()?;
        crate::load().map_err(OpenError::Unavailable)?;
        let hints = Info::alloc()?;
        let prov = cstring("provider", &cfg.provider)?;
        let domain_name = cfg.domain.as_deref().map(|d| cstring("domain", d)).transpose()?;
        let node = cfg.source_addr.as_deref().map(|a| cstring("source address", a)).transpose()?;
        // SAFETY: hints is a fresh fi_allocinfo() result: every attribute pointer is allocated and zeroed; the
        // strings we store are strdup'd, so fi_freeinfo frees them.
        unsafe {
            let h = hints.as_ptr();
            (*h).caps = sys::FI_MSG as u64 | sys::FI_SEND as u64 | sys::FI_RECV as u64 | sys::FI_SOURCE;
            (*h).mode = sys::FI_CONTEXT | sys::FI_CONTEXT2;
            (*(*h).ep_attr).type_ = sys::fi_ep_type_FI_EP_RDM;
            (*(*h).tx_attr).msg_order = sys::FI_ORDER_SAS as u64;
            (*(*h).rx_attr).msg_order = sys::FI_ORDER_SAS as u64;
            (*(*h).domain_attr).threading = sys::fi_threading_FI_THREAD_DOMAIN;
            (*(*h).domain_attr).resource_mgmt = sys::fi_resource_mgmt_FI_RM_ENABLED;
            // The layer registers no memory, so it cannot serve providers that need local buffers registered
            // (FI_MR_LOCAL); the other modes only constrain registrations it never makes, and cxi requires
            // FI_MR_ENDPOINT in the hints (as its own tests show).
            (*(*h).domain_attr).mr_mode =
                (sys::FI_MR_ENDPOINT | sys::FI_MR_ALLOCATED | sys::FI_MR_PROV_KEY | sys::FI_MR_VIRT_ADDR) as i32;
            (*(*h).fabric_attr).prov_name = strdup(&prov);
            if let Some(d) = &domain_name {
                (*(*h).domain_attr).name = strdup(d);
            }
        }
        let mut info_ptr = ptr::null_mut();
        let (node_ptr, flags) = match &node {
            Some(n) => (n.as_ptr(), sys::FI_SOURCE),
            None => (ptr::null(), 0),
        };
        // SAFETY: valid hints; node is NULL or a NUL-terminated string; the result list is owned by us.
        let rc = unsafe { sys::fi_getinfo(API_VERSION, node_ptr, ptr::null(), flags, hints.as_ptr(), &mut info_ptr) };
        if rc == -(sys::FI_ENODATA as i32) || (rc == 0 && info_ptr.is_null()) {
            return Err(OpenError::NoProvider { provider: cfg.provider.clone(), source_addr: cfg.source_addr.clone() });
        }
        check("fi_getinfo", rc)?;
        // SAFETY: fi_getinfo succeeded: info_ptr is an owned list.
        let info = unsafe { Info::from_raw(info_ptr) }.expect("checked non-null");
        let i = info.as_ptr();
        // SAFETY: the first entry of a fi_getinfo result has all attribute structs filled in; strings are copied.
        let (provider, fabric_name, dom_name, manual_progress, av_type) = unsafe {
            (
                c_str((*(*i).fabric_attr).prov_name),
                c_str((*(*i).fabric_attr).name),
                c_str((*(*i).domain_attr).name),
                (*(*i).domain_attr).data_progress == sys::fi_progress_FI_PROGRESS_MANUAL,
                (*(*i).domain_attr).av_type,
            )
        };

        let mut fabric = ptr::null_mut();
        // SAFETY: fabric_attr of a valid info entry; the out pointer is written on success.
        check("fi_fabric", unsafe { sys::fi_fabric((*i).fabric_attr, &mut fabric, ptr::null_mut()) })?;
        // SAFETY: fi_fabric succeeded; the fabric is ours.
        let fabric = unsafe { Fid::new(fabric, "fabric") }.expect("fi_fabric returned an object");
        let mut domain = ptr::null_mut();
        // SAFETY: live fabric, valid info.
        check("fi_domain", unsafe { sys::vigil_fi_domain(fabric.as_ptr(), i, &mut domain, ptr::null_mut()) })?;
        // SAFETY: fi_domain succeeded.
        let domain = unsafe { Fid::new(domain, "domain") }.expect("fi_domain returned an object");

        let (cq, wait_fd) = open_cq(&domain, cfg)?;

        let mut av_attr = sys::fi_av_attr {
            type_: if av_type == sys::fi_av_type_FI_AV_UNSPEC { sys::fi_av_type_FI_AV_MAP } else { av_type },
            ..Default::default()
        };
        let mut av = ptr::null_mut();
        // SAFETY: live domain, initialized attributes.
        check("fi_av_open", unsafe { sys::vigil_fi_av_open(domain.as_ptr(), &mut av_attr, &mut av, ptr::null_mut()) })?;
        // SAFETY: fi_av_open succeeded.
        let av = unsafe { Fid::new(av, "address vector") }.expect("fi_av_open returned an object");

        let mut ep = ptr::null_mut();
        // SAFETY: live domain and info.
        check("fi_endpoint", unsafe { sys::vigil_fi_endpoint(domain.as_ptr(), i, &mut ep, ptr::null_mut()) })?;
        // SAFETY: fi_endpoint succeeded.
        let ep = unsafe { Fid::new(ep, "endpoint") }.expect("fi_endpoint returned an object");
        let bind_flags = sys::FI_TRANSMIT as u64 | sys::FI_RECV as u64;
        // SAFETY: live endpoint, CQ and AV of the same domain.
        check("fi_ep_bind(cq)", unsafe { sys::vigil_fi_ep_bind(ep.as_ptr(), cq.fid(), bind_flags) })?;
        // SAFETY: as above.
        check("fi_ep_bind(av)", unsafe { sys::vigil_fi_ep_bind(ep.as_ptr(), av.fid(), 0) })?;
        // SAFETY: a bound endpoint.
        check("fi_enable", unsafe { sys::vigil_fi_enable(ep.as_ptr()) })?;
        drop(info);

        let stride = frag::HEADER + cfg.frag_size;
        let mut e = Endpoint {
            h: Handles { ep, cq, av, domain, fabric },
            ctx: RawArray::new(cfg.rx_depth + cfg.tx_depth),
            rx_buf: RawArray::new(cfg.rx_depth * stride),
            tx_buf: RawArray::new(cfg.tx_depth * stride),
            cfg: cfg.clone(),
            stride,
            rx_unposted: Vec::new(),
            tx_free: (0..cfg.tx_depth).rev().collect(),
            tx_peer: vec![ADDR_UNSPEC; cfg.tx_depth],
            peers: HashMap::new(),
            ready: VecDeque::new(),
            queued: 0,
            events: VecDeque::new(),
            wait_fd,
            manual_progress,
            provider,
            fabric_name,
            domain_name: dom_name,
            stats: Stats::default(),
        };
        for slot in 0..cfg.rx_depth {
            if !e.post_recv(slot)? {
                e.rx_unposted.push(slot);
            }
        }
        tracing::debug!(
            provider = %e.provider, fabric = %e.fabric_name, domain = %e.domain_name,
            wait_fd = ?e.wait_fd, manual_progress, "libfabric endpoint open"
        );
        Ok(e)
    }

    /// The provider that serves this endpoint, as libfabric names it (e.g. `tcp;ofi_rxm`).
    pub fn provider(&self) -> &str {
        &self.provider
    }

    /// The fabric and domain names (e.g. `127.0.0.1/32` and `lo` for tcp, `cxi0` for Slingshot).
    pub fn fabric_domain(&self) -> (&str, &str) {
        (&self.fabric_name, &self.domain_name)
    }

    /// The descriptor that becomes readable when the completion queue may hold entries (`FI_WAIT_FD`,
    /// `fi_control(FI_GETWAIT)`), or `None` when the provider offers no wait descriptor (the caller then polls).
    /// Owned by libfabric: never close it.
    pub fn wait_fd(&self) -> Option<RawFd> {
        self.wait_fd
    }

    /// Whether the provider makes data progress only inside libfabric calls (`FI_PROGRESS_MANUAL`): the caller
    /// must then call [`progress`](Self::progress) periodically even when the wait descriptor stays quiet.
    pub fn manual_progress(&self) -> bool {
        self.manual_progress
    }

    /// Counters since the endpoint was opened.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// The configuration the endpoint was opened with.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// This endpoint's address (`fi_getname`), to give to peers (e.g. in the authenticated TCP hello).
    pub fn name(&self) -> Result<Vec<u8>, CallError> {
        let mut buf = vec![0u8; 64];
        loop {
            let mut len = buf.len();
            // SAFETY: live endpoint; buf is writable for len bytes; libfabric writes at most len bytes and sets
            // len to the name's size (FI_ETOOSMALL when buf was too small).
            let rc = unsafe { sys::vigil_fi_getname(self.h.ep.fid(), buf.as_mut_ptr().cast(), &mut len) };
            if rc == -(sys::FI_ETOOSMALL as i32) && len > buf.len() {
                buf.resize(len, 0);
                continue;
            }
            check("fi_getname", rc)?;
            buf.truncate(len);
            return Ok(buf);
        }
    }

    /// A printable form of an endpoint name (`fi_av_straddr`), e.g. `fi_sockaddr_in://127.0.0.1:41235`.
    pub fn name_to_string(&self, name: &[u8]) -> String {
        let mut buf = [0u8; 256];
        let mut len = buf.len();
        // SAFETY: live AV; name is read only; buf is writable for len bytes and the result is NUL-terminated
        // within it (libfabric truncates).
        let p = unsafe {
            sys::vigil_fi_av_straddr(self.h.av.as_ptr(), name.as_ptr().cast(), buf.as_mut_ptr().cast(), &mut len)
        };
        if p.is_null() {
            return format!("{name:02x?}");
        }
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        String::from_utf8_lossy(&buf[..end]).into_owned()
    }

    /// Insert a peer's endpoint name (from its [`name`](Self::name)) into the address vector.
    pub fn insert_peer(&mut self, name: &[u8]) -> Result<PeerId, CallError> {
        if name.is_empty() {
            return Err(CallError { call: "fi_av_insert", code: libc::EINVAL, text: raw::strerror(libc::EINVAL) });
        }
        let mut addr: u64 = ADDR_UNSPEC;
        // SAFETY: live AV; name is a readable buffer the provider reads as one address of its format (peers
        // are opened with the same provider, and a name is checked by the provider: bad ones return an error
        // or count 0); addr receives one fi_addr_t.
        let rc = unsafe {
            sys::vigil_fi_av_insert(self.h.av.as_ptr(), name.as_ptr().cast(), 1, &mut addr, 0, ptr::null_mut())
        };
        check("fi_av_insert", rc)?;
        if rc != 1 || addr == ADDR_UNSPEC {
            return Err(CallError { call: "fi_av_insert", code: libc::EINVAL, text: "address not inserted".into() });
        }
        let cfg = &self.cfg;
        self.peers.entry(addr).or_insert_with(|| Peer::new(cfg));
        Ok(PeerId(addr))
    }

    /// Forget a peer: its queued messages and partial input are dropped and it is removed from the address
    /// vector. Completions of sends already posted to it are still consumed (and ignored).
    pub fn remove_peer(&mut self, peer: PeerId) -> Result<(), Error> {
        let p = self.peers.remove(&peer.0).ok_or(Error::UnknownPeer(peer))?;
        self.queued -= p.queue.bytes();
        self.ready.retain(|&a| a != peer.0);
        let mut addr = peer.0;
        // SAFETY: live AV; one fi_addr_t this AV returned.
        check("fi_av_remove", unsafe { sys::vigil_fi_av_remove(self.h.av.as_ptr(), &mut addr, 1, 0) })?;
        Ok(())
    }

    /// Bytes accepted by [`try_send`](Self::try_send) and not yet handed to the provider.
    pub fn queued(&self) -> usize {
        self.queued
    }

    /// Fragments handed to the provider whose send has not completed yet.
    pub fn in_flight(&self) -> usize {
        self.cfg.tx_depth - self.tx_free.len()
    }

    /// Send one message to `peer`: accepted whole (posted now as far as send slots allow, the rest queued and
    /// posted by later [`progress`](Self::progress) calls) or refused with [`Error::WouldBlock`] when the send
    /// queue is full. Messages to one peer are delivered in order, exactly once, unless the peer fails.
    pub fn try_send(&mut self, peer: PeerId, data: &[u8]) -> Result<(), Error> {
        if data.len() > self.cfg.max_message {
            return Err(Error::TooLarge { len: data.len(), max: self.cfg.max_message });
        }
        let p = self.peers.get(&peer.0).ok_or(Error::UnknownPeer(peer))?;
        if let Some(error) = &p.failed {
            return Err(Error::PeerFailed { peer, error: error.clone() });
        }
        if self.queued >= self.cfg.send_queue_limit {
            return Err(Error::WouldBlock { queued: self.queued });
        }
        self.stats.messages_sent += 1;
        let mut off = 0;
        if p.queue.is_empty() {
            // Fast path: post directly from the caller's buffer while slots are free.
            while let Some(slot) = self.tx_free.pop() {
                let (n, more) = frag::next_fragment(data.len(), off, self.cfg.frag_size);
                match self.post_send(slot, peer.0, more, &data[off..off + n]) {
                    Ok(true) => {
                        off += n;
                        if !more {
                            return Ok(());
                        }
                    }
                    Ok(false) => break,
                    Err(error) => {
                        self.fail_peer(peer.0, error.clone());
                        return Err(Error::PeerFailed { peer, error });
                    }
                }
            }
        }
        let p = self.peers.get_mut(&peer.0).expect("looked up above");
        if p.queue.is_empty() {
            self.ready.push_back(peer.0);
        }
        // Queue the unsent tail (copying only that part): its fragments carry the same header flags as if the
        // whole message had been queued (MORE on all but the last).
        p.queue.push(data[off..].to_vec());
        self.queued += data.len() - off;
        Ok(())
    }

    /// Post queued fragments while send slots are free.
    fn pump(&mut self) {
        while let Some(&addr) = self.ready.front() {
            let Some(slot) = self.tx_free.pop() else { return };
            let p = self.peers.get_mut(&addr).expect("ready peers exist");
            let (payload, more) = p.queue.front(self.cfg.frag_size).expect("ready peers have output");
            let rc = post_fragment(
                &self.h.ep,
                self.tx_buf.at(slot * self.stride),
                self.ctx.at(self.cfg.rx_depth + slot),
                addr,
                (more, p.tx_seq),
                payload,
            );
            if rc == 0 {
                p.tx_seq = p.tx_seq.wrapping_add(1);
                self.queued -= p.queue.advance(self.cfg.frag_size);
                self.ready.pop_front();
                if !p.queue.is_empty() {
                    self.ready.push_back(addr);
                }
            }
            match self.posted(slot, addr, rc) {
                Ok(true) => {}
                Ok(false) => return,
                Err(error) => self.fail_peer(addr, error),
            }
        }
    }

    /// Copy one fragment into send slot `slot` and post it. `Ok(false)`: the provider said `FI_EAGAIN` (the
    /// slot is returned to the free list; progress is needed). `Err`: the post failed for this peer (the slot
    /// is returned too).
    fn post_send(&mut self, slot: usize, addr: u64, more: bool, payload: &[u8]) -> Result<bool, CompletionError> {
        let p = self.peers.get_mut(&addr).expect("callers pass inserted peers");
        let rc = post_fragment(
            &self.h.ep,
            self.tx_buf.at(slot * self.stride),
            self.ctx.at(self.cfg.rx_depth + slot),
            addr,
            (more, p.tx_seq),
            payload,
        );
        if rc == 0 {
            p.tx_seq = p.tx_seq.wrapping_add(1);
        }
        self.posted(slot, addr, rc)
    }

    /// Book-keeping after posting send slot `slot` (see [`post_send`](Self::post_send)).
    fn posted(&mut self, slot: usize, addr: u64, rc: isize) -> Result<bool, CompletionError> {
        if rc == 0 {
            self.tx_peer[slot] = addr;
            self.stats.fragments_sent += 1;
            Ok(true)
        } else {
            self.tx_free.push(slot);
            if rc == -(sys::FI_EAGAIN as isize) {
                Ok(false)
            } else {
                let e = raw::call_err("fi_send", rc);
                Err(CompletionError {
                    op: Op::Send,
                    code: e.code,
                    text: e.text,
                    prov_errno: 0,
                    prov_text: String::new(),
                })
            }
        }
    }

    /// Post receive slot `slot`. `Ok(false)`: `FI_EAGAIN`, try again after progress.
    fn post_recv(&mut self, slot: usize) -> Result<bool, CallError> {
        let buf = self.rx_buf.at(slot * self.stride);
        let ctx = self.ctx.at(slot);
        // SAFETY: live endpoint; the slot's buffer (stride bytes inside rx_buf) and context are not in use by
        // any other operation and stay valid until its completion is read or the endpoint is closed.
        let rc = unsafe {
            sys::vigil_fi_recv(self.h.ep.as_ptr(), buf.cast(), self.stride, ptr::null_mut(), ADDR_UNSPEC, ctx.cast())
        };
        if rc == 0 {
            Ok(true)
        } else if rc == -(sys::FI_EAGAIN as isize) {
            Ok(false)
        } else {
            Err(raw::call_err("fi_recv", rc))
        }
    }

    /// Mark a peer failed (once): its queue is dropped and [`Event::PeerFailed`] is reported.
    fn fail_peer(&mut self, addr: u64, error: CompletionError) {
        let Some(p) = self.peers.get_mut(&addr) else { return };
        if p.failed.is_some() {
            return;
        }
        self.queued -= p.queue.clear();
        p.rx = Sequenced::new(self.cfg.max_message, self.cfg.frag_size);
        p.failed = Some(error.clone());
        self.ready.retain(|&a| a != addr);
        self.events.push_back(Event::PeerFailed { peer: PeerId(addr), error });
    }

    /// Read completions (this is also what drives a manual-progress provider), turn them into events, repost
    /// receive buffers and post queued fragments. Returns the number of events ready for
    /// [`poll_event`](Self::poll_event).
    pub fn progress(&mut self) -> Result<usize, Error> {
        let mut entries = [sys::fi_cq_msg_entry::default(); CQ_BATCH];
        let mut srcs = [ADDR_UNSPEC; CQ_BATCH];
        let mut handled = 0;
        while handled < CQ_MAX_PER_PROGRESS {
            // SAFETY: live CQ opened with FI_CQ_FORMAT_MSG, so each entry is a fi_cq_msg_entry; both arrays
            // hold CQ_BATCH elements.
            let n = unsafe {
                sys::vigil_fi_cq_readfrom(self.h.cq.as_ptr(), entries.as_mut_ptr().cast(), CQ_BATCH, srcs.as_mut_ptr())
            };
            if n > 0 {
                for k in 0..n as usize {
                    self.completed(&entries[k], srcs[k]);
                }
                handled += n as usize;
            } else if n == -(sys::FI_EAGAIN as isize) {
                break;
            } else if n == -(sys::FI_EAVAIL as isize) {
                self.read_error()?;
                handled += 1;
            } else {
                return Err(raw::call_err("fi_cq_readfrom", n).into());
            }
        }
        let unposted = std::mem::take(&mut self.rx_unposted);
        for slot in unposted {
            if !self.post_recv(slot)? {
                self.rx_unposted.push(slot);
            }
        }
        self.pump();
        Ok(self.events.len())
    }

    /// The next event, reading completions first when none is pending. `None`: nothing happened (wait on the
    /// wait descriptor after [`trywait`](Self::trywait), or poll again later).
    pub fn poll_event(&mut self) -> Result<Option<Event>, Error> {
        if self.events.is_empty() {
            self.progress()?;
        }
        Ok(self.events.pop_front())
    }

    /// `fi_trywait` on the completion queue: `true` when it is safe to block on the wait descriptor (nothing
    /// is pending), `false` when the caller must call [`progress`](Self::progress) first. Always `false`
    /// without a wait descriptor. Events already read are not its business: take them with
    /// [`poll_event`](Self::poll_event) before waiting.
    pub fn trywait(&self) -> Result<bool, CallError> {
        if self.wait_fd.is_none() {
            return Ok(false);
        }
        let mut fids = [self.h.cq.fid()];
        // SAFETY: live fabric; one live CQ fid of it.
        let rc = unsafe { sys::vigil_fi_trywait(self.h.fabric.as_ptr(), fids.as_mut_ptr(), 1) };
        if rc == 0 {
            Ok(true)
        } else if rc == -(sys::FI_EAGAIN as i32) {
            Ok(false)
        } else {
            Err(raw::call_err("fi_trywait", rc as isize))
        }
    }

    /// One successful completion.
    fn completed(&mut self, e: &sys::fi_cq_msg_entry, src: u64) {
        match self.slot_of(e.op_context) {
            Some(Slot::Rx(slot)) => {
                self.stats.fragments_received += 1;
                let len = e.len.min(self.stride);
                let buf = self.rx_buf.at(slot * self.stride);
                // SAFETY: the receive completed, so the provider no longer writes this slot; its `len` bytes
                // (≤ stride) lie inside the slot. The slice is dropped before the slot is reposted below.
                let frag = unsafe { std::slice::from_raw_parts(buf, len) };
                let mut out = Vec::new();
                match self.peers.get_mut(&src) {
                    Some(p) if p.failed.is_none() => p.rx.push(frag, &mut out),
                    Some(_) => {}
                    None => self.stats.unknown_source += 1,
                }
                for r in out {
                    let from = PeerId(src);
                    self.events.push_back(match r {
                        Push::Complete(data) => {
                            self.stats.messages_received += 1;
                            Event::Message { from, data }
                        }
                        Push::Oversized(len) => Event::Oversized { from, len },
                        Push::Malformed => {
                            self.stats.malformed += 1;
                            Event::Malformed { from }
                        }
                    });
                }
                self.repost(slot);
            }
            Some(Slot::Tx(slot)) => {
                self.tx_peer[slot] = ADDR_UNSPEC;
                self.tx_free.push(slot);
            }
            None => tracing::warn!("libfabric completion with a foreign context {:?}", e.op_context),
        }
    }

    fn repost(&mut self, slot: usize) {
        match self.post_recv(slot) {
            Ok(true) => {}
            Ok(false) => self.rx_unposted.push(slot),
            Err(e) => {
                tracing::warn!("reposting a receive buffer: {e}");
                self.rx_unposted.push(slot);
            }
        }
    }

    /// Read and dispatch one error completion.
    fn read_error(&mut self) -> Result<(), Error> {
        let mut e = sys::fi_cq_err_entry::default();
        // SAFETY: live CQ; a zeroed entry (err_data_size 0 asks the provider for its own err_data buffer,
        // valid until the next CQ read, which is after fi_cq_strerror below).
        let rc = unsafe { sys::vigil_fi_cq_readerr(self.h.cq.as_ptr(), &mut e, 0) };
        if rc == -(sys::FI_EAGAIN as isize) {
            return Ok(());
        }
        if rc < 0 {
            return Err(raw::call_err("fi_cq_readerr", rc).into());
        }
        let mut buf = [0 as c_char; 256];
        // SAFETY: live CQ; err_data is the provider's buffer from the entry just read; buf is writable.
        let prov_text = unsafe {
            c_str(sys::vigil_fi_cq_strerror(self.h.cq.as_ptr(), e.prov_errno, e.err_data, buf.as_mut_ptr(), buf.len()))
        };
        let slot = self.slot_of(e.op_context);
        let op = if matches!(slot, Some(Slot::Rx(_))) { Op::Recv } else { Op::Send };
        let error =
            CompletionError { op, code: e.err, text: raw::strerror(e.err), prov_errno: e.prov_errno, prov_text };
        self.stats.error_completions += 1;
        match slot {
            Some(Slot::Tx(slot)) => {
                let addr = std::mem::replace(&mut self.tx_peer[slot], ADDR_UNSPEC);
                self.tx_free.push(slot);
                self.fail_peer(addr, error);
            }
            Some(Slot::Rx(slot)) => {
                if e.err != sys::FI_ECANCELED as i32 {
                    self.events.push_back(Event::RecvFailed { error });
                    self.repost(slot);
                }
            }
            None => return Err(Error::Completion(error)),
        }
        Ok(())
    }

    fn slot_of(&self, ctx: *mut c_void) -> Option<Slot> {
        let i = self.ctx.index_of(ctx)?;
        Some(if i < self.cfg.rx_depth { Slot::Rx(i) } else { Slot::Tx(i - self.cfg.rx_depth) })
    }
}

enum Slot {
    Rx(usize),
    Tx(usize),
}

/// Copy one fragment (header + payload) into a send slot's buffer and post it; libfabric's return code.
fn post_fragment(
    ep: &Fid<sys::fid_ep>,
    buf: *mut u8,
    ctx: *mut sys::fi_context2,
    addr: u64,
    (more, seq): (bool, u32),
    payload: &[u8],
) -> isize {
    // SAFETY: `buf` is the start of a free send slot of HEADER + frag_size bytes (callers pass
    // tx_buf.at(slot * stride) for a slot taken from the free list, and payloads of at most frag_size bytes);
    // no operation uses the slot, and the payload (caller or queue memory) does not overlap it.
    unsafe {
        frag::write_header(std::slice::from_raw_parts_mut(buf, frag::HEADER), more, seq);
        ptr::copy_nonoverlapping(payload.as_ptr(), buf.add(frag::HEADER), payload.len());
    }
    // SAFETY: live endpoint; the buffer and the context stay valid and untouched until the send's completion is
    // read (or the endpoint is closed, which happens before they are freed).
    unsafe {
        sys::vigil_fi_send(
            ep.as_ptr(),
            buf as *const c_void,
            frag::HEADER + payload.len(),
            ptr::null_mut(),
            addr,
            ctx.cast(),
        )
    }
}

/// Open the completion queue, with a wait descriptor when the provider has one.
fn open_cq(domain: &Fid<sys::fid_domain>, cfg: &Config) -> Result<(Fid<sys::fid_cq>, Option<RawFd>), OpenError> {
    let size = if cfg.cq_size == 0 { cfg.rx_depth + cfg.tx_depth } else { cfg.cq_size };
    for wait_obj in [sys::fi_wait_obj_FI_WAIT_FD, sys::fi_wait_obj_FI_WAIT_NONE] {
        let mut attr =
            sys::fi_cq_attr { size, format: sys::fi_cq_format_FI_CQ_FORMAT_MSG, wait_obj, ..Default::default() };
        let mut cq = ptr::null_mut();
        // SAFETY: live domain, initialized attributes.
        let rc = unsafe { sys::vigil_fi_cq_open(domain.as_ptr(), &mut attr, &mut cq, ptr::null_mut()) };
        if rc != 0 {
            if wait_obj == sys::fi_wait_obj_FI_WAIT_FD {
                tracing::info!(
                    "libfabric provider {}: no FI_WAIT_FD completion queue ({}): polling",
                    cfg.provider,
                    raw::strerror(-rc)
                );
                continue;
            }
            return Err(raw::call_err("fi_cq_open", rc as isize).into());
        }
        // SAFETY: fi_cq_open succeeded.
        let cq = unsafe { Fid::new(cq, "completion queue") }.expect("fi_cq_open returned an object");
        if wait_obj != sys::fi_wait_obj_FI_WAIT_FD {
            return Ok((cq, None));
        }
        let mut fd: c_int = -1;
        // SAFETY: live CQ with a wait object; FI_GETWAIT writes an int descriptor for FI_WAIT_FD.
        let rc = unsafe { sys::vigil_fi_control(cq.fid(), sys::FI_GETWAIT as c_int, (&mut fd as *mut c_int).cast()) };
        if rc != 0 || fd < 0 {
            // udp;ofi_rxd 1.17 opens an FI_WAIT_FD queue but answers FI_GETWAIT with ENOSYS.
            tracing::info!(
                "libfabric provider {}: completion queue gives no wait descriptor ({}): polling",
                cfg.provider,
                raw::strerror(-rc)
            );
            continue;
        }
        return Ok((cq, Some(fd)));
    }
    unreachable!("the FI_WAIT_NONE attempt returns")
}
