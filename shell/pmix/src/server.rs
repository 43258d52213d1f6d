//! The OpenPMIx server: set-up from the shell's [`Setup`], upcalls turned into [`FromHelper`] lines, and the shell's
//! answers ([`ToHelper`]) handed back to the library. OpenPMIx calls the upcalls on its own progress thread; this
//! module's main thread reads the shell's lines; what they share is [`STATE`].

use crate::send;
use base64::Engine as _;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ffi::{c_char, c_void, CStr, CString};
use std::io::BufRead as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use vigil_proto::pmix::{FromHelper, Setup, ToHelper};

#[allow(
    non_camel_case_types,
    non_snake_case,
    non_upper_case_globals,
    dead_code,
    missing_docs,
    unreachable_pub,
    missing_debug_implementations,
    clippy::all,
    clippy::undocumented_unsafe_blocks
)]
mod ffi {
    include!(concat!(env!("OUT_DIR"), "/bindings.rs"));
}
use ffi::*;

/// `PMIX_RANK_WILDCARD` (`UINT32_MAX-1` in `pmix_common.h`, a macro bindgen does not evaluate): every process of a
/// namespace.
const RANK_WILDCARD: pmix_rank_t = u32::MAX - 1;
/// Most bytes one node puts into one fence (64 MiB): a larger blob fails the fence with a clear error rather than
/// growing the shell's and rank 0's memory without bound.
pub(crate) const FENCE_MAX: usize = 64 << 20;

/// What the upcalls share with the main thread.
struct State {
    nspace: String,
    size: u32,
    /// The next fence's number.
    seq: AtomicU64,
    /// Fences sent to the shell and not yet answered: the library's callback and its argument (an address).
    pending: Mutex<HashMap<u64, (pmix_modex_cbfunc_t, usize)>>,
}

static STATE: OnceLock<State> = OnceLock::new();

/// A status code as OpenPMIx says it.
fn error_string(rc: pmix_status_t) -> String {
    // SAFETY: PMIx_Error_string returns a pointer to a static NUL-terminated string for any status.
    let p = unsafe { PMIx_Error_string(rc) };
    if p.is_null() {
        return format!("status {rc}");
    }
    // SAFETY: non-null, NUL-terminated, static (see above).
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// A fixed-size C string field (`pmix_nspace_t`, `pmix_key_t`) as a `&str`, up to its first NUL.
fn field_str(f: &[c_char]) -> String {
    let bytes: Vec<u8> = f.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// A `pmix_proc_t` of namespace `nspace` (at most 255 bytes, checked by the caller) and `rank`.
fn proc_of(nspace: &str, rank: pmix_rank_t) -> pmix_proc_t {
    let mut p = pmix_proc_t::default();
    for (d, s) in p.nspace.iter_mut().zip(nspace.bytes()) {
        *d = s as c_char;
    }
    p.rank = rank;
    p
}

/// A list of `pmix_info_t` built with OpenPMIx's own loaders (which copy what they are given).
struct InfoList(*mut c_void);

impl InfoList {
    fn new() -> InfoList {
        // SAFETY: no preconditions; the list is released in Drop.
        InfoList(unsafe { PMIx_Info_list_start() })
    }

    fn add(&mut self, key: &[u8], value: *const c_void, ty: u32) -> Result<(), String> {
        // SAFETY: `key` is one of bindgen's NUL-terminated key constants; `value` points to a live value of type
        // `ty` (or is a C string for PMIX_STRING), which the library copies before returning.
        let rc = unsafe { PMIx_Info_list_add(self.0, key.as_ptr() as *const c_char, value, ty as pmix_data_type_t) };
        if rc != PMIX_SUCCESS as pmix_status_t {
            return Err(format!("{}: {}", String::from_utf8_lossy(&key[..key.len() - 1]), error_string(rc)));
        }
        Ok(())
    }

    fn string(&mut self, key: &[u8], v: &str) -> Result<(), String> {
        let c = CString::new(v).map_err(|_| format!("{v:?} holds a NUL byte"))?;
        self.add(key, c.as_ptr() as *const c_void, PMIX_STRING)
    }

    fn u32(&mut self, key: &[u8], v: u32) -> Result<(), String> {
        self.add(key, &v as *const u32 as *const c_void, PMIX_UINT32)
    }

    fn u16(&mut self, key: &[u8], v: u16) -> Result<(), String> {
        self.add(key, &v as *const u16 as *const c_void, PMIX_UINT16)
    }

    fn rank(&mut self, key: &[u8], v: pmix_rank_t) -> Result<(), String> {
        self.add(key, &v as *const pmix_rank_t as *const c_void, PMIX_PROC_RANK)
    }

    /// A nested list, as a `PMIX_DATA_ARRAY` of `pmix_info_t` (copied in).
    fn list(&mut self, key: &[u8], inner: InfoList) -> Result<(), String> {
        let mut arr = inner.convert()?;
        let r = self.add(key, &arr.0 as *const pmix_data_array_t as *const c_void, PMIX_DATA_ARRAY);
        arr.destruct();
        r
    }

    /// The list as an array of `pmix_info_t`, owned by the result.
    fn convert(self) -> Result<DataArray, String> {
        let mut arr = pmix_data_array_t::default();
        // SAFETY: a list from PMIx_Info_list_start, converted into a zeroed data array the result owns.
        let rc = unsafe { PMIx_Info_list_convert(self.0, &mut arr) };
        if rc != PMIX_SUCCESS as pmix_status_t {
            return Err(format!("PMIx_Info_list_convert: {}", error_string(rc)));
        }
        Ok(DataArray(arr))
    }
}

impl Drop for InfoList {
    fn drop(&mut self) {
        // SAFETY: the list from PMIx_Info_list_start, released once.
        unsafe { PMIx_Info_list_release(self.0) };
    }
}

/// An array of `pmix_info_t` made by [`InfoList::convert`].
struct DataArray(pmix_data_array_t);

impl DataArray {
    fn infos(&mut self) -> (*mut pmix_info_t, usize) {
        (self.0.array as *mut pmix_info_t, self.0.size)
    }

    fn destruct(&mut self) {
        if !self.0.array.is_null() {
            // SAFETY: an array made by PMIx_Info_list_convert, released once (array set to null after).
            unsafe { PMIx_Data_array_destruct(&mut self.0) };
            self.0.array = std::ptr::null_mut();
        }
    }
}

impl Drop for DataArray {
    fn drop(&mut self) {
        self.destruct();
    }
}

/// `PMIx_generate_regex` or `PMIx_generate_ppn` of `input`, as a string.
fn generate(
    f: unsafe extern "C" fn(*const c_char, *mut *mut c_char) -> pmix_status_t,
    input: &str,
) -> Result<String, String> {
    let c = CString::new(input).map_err(|_| "a host name holds a NUL byte".to_string())?;
    let mut out: *mut c_char = std::ptr::null_mut();
    // SAFETY: a NUL-terminated input; the library allocates the output, freed below.
    let rc = unsafe { f(c.as_ptr(), &mut out) };
    if rc != PMIX_SUCCESS as pmix_status_t || out.is_null() {
        return Err(error_string(rc));
    }
    // SAFETY: the library's output is NUL-terminated for the "pmix:" representation it generates here.
    let s = unsafe { CStr::from_ptr(out) }.to_string_lossy().into_owned();
    // SAFETY: allocated by the library with malloc, freed once.
    unsafe { libc::free(out as *mut c_void) };
    Ok(s)
}

/// Check the shell's set-up before anything reaches the library.
fn check(s: &Setup) -> Result<(), String> {
    if s.nspace.is_empty() || s.nspace.len() > PMIX_MAX_NSLEN as usize {
        return Err(format!("nspace: {} bytes, not 1 to {PMIX_MAX_NSLEN}", s.nspace.len()));
    }
    if s.ranks.is_empty() || s.ranks.len() != s.hosts.len() {
        return Err(format!("ranks: {} node(s) against {} host(s)", s.ranks.len(), s.hosts.len()));
    }
    if s.nodeid as usize >= s.ranks.len() {
        return Err(format!("nodeid {} of {} node(s)", s.nodeid, s.ranks.len()));
    }
    let all: BTreeSet<u32> = s.ranks.iter().flatten().copied().collect();
    let n: usize = s.ranks.iter().map(Vec::len).sum();
    if all.len() != n || n != s.size as usize || all.iter().next_back().is_some_and(|&r| r >= s.size) {
        return Err(format!("ranks: not a partition of 0..{} across the nodes", s.size));
    }
    if s.ranks.iter().any(|r| r.len() > u16::MAX as usize) {
        return Err("ranks: more than 65535 tasks on one node".into());
    }
    Ok(())
}

/// Start the server for `s`; the environment of each local task.
fn setup(s: &Setup) -> Result<BTreeMap<u32, BTreeMap<String, String>>, String> {
    check(s)?;
    let mut module = pmix_server_module_t {
        client_connected: Some(client_state::<false>),
        client_finalized: Some(client_state::<true>),
        abort: Some(abort),
        fence_nb: Some(fence_nb),
        direct_modex: Some(direct_modex),
        register_events: Some(register_events),
        ..Default::default()
    };
    let mut init = InfoList::new();
    init.string(PMIX_SERVER_TMPDIR, &s.tmpdir)?;
    init.rank(PMIX_SERVER_RANK, s.nodeid)?;
    let mut init = init.convert()?;
    let (p, n) = init.infos();
    // SAFETY: the module lives for the whole process (the library keeps a copy of it); the info array is valid.
    let rc = unsafe { PMIx_server_init(&mut module, p, n) };
    if rc != PMIX_SUCCESS as pmix_status_t {
        return Err(format!("PMIx_server_init: {}", error_string(rc)));
    }
    let _ = STATE.set(State {
        nspace: s.nspace.clone(),
        size: s.size,
        seq: AtomicU64::new(0),
        pending: Mutex::new(HashMap::new()),
    });

    let node = s.nodeid as usize;
    let local = &s.ranks[node];
    let list = |v: &[u32]| v.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
    let node_map =
        generate(PMIx_generate_regex, &s.hosts.join(",")).map_err(|e| format!("PMIx_generate_regex: {e}"))?;
    let proc_map = generate(PMIx_generate_ppn, &s.ranks.iter().map(|r| list(r)).collect::<Vec<_>>().join(";"))
        .map_err(|e| format!("PMIx_generate_ppn: {e}"))?;
    let mut job = InfoList::new();
    job.string(PMIX_JOBID, &s.jobid)?;
    job.u32(PMIX_UNIV_SIZE, s.size)?;
    job.u32(PMIX_JOB_SIZE, s.size)?;
    job.u32(PMIX_MAX_PROCS, s.size)?;
    job.u32(PMIX_JOB_NUM_APPS, 1)?;
    job.u32(PMIX_NUM_NODES, s.ranks.len() as u32)?;
    job.string(PMIX_NODE_MAP, &node_map)?;
    job.string(PMIX_PROC_MAP, &proc_map)?;
    job.string(PMIX_TMPDIR, &s.tmpdir)?;
    job.string(PMIX_NSDIR, &s.tmpdir)?;
    job.string(PMIX_HOSTNAME, &s.hosts[node])?;
    job.u32(PMIX_NODEID, s.nodeid)?;
    job.u32(PMIX_LOCAL_SIZE, local.len() as u32)?;
    job.u32(PMIX_NODE_SIZE, local.len() as u32)?;
    job.string(PMIX_LOCAL_PEERS, &list(local))?;
    if let Some(&first) = local.iter().min() {
        job.rank(PMIX_LOCALLDR, first)?;
    }
    job.rank(PMIX_APPLDR, 0)?;
    job.u32(PMIX_APP_SIZE, s.size)?;
    for (nodeid, ranks) in s.ranks.iter().enumerate() {
        for (i, &r) in ranks.iter().enumerate() {
            let mut p = InfoList::new();
            p.rank(PMIX_RANK, r)?; // first, as the library expects
            p.u32(PMIX_APPNUM, 0)?;
            p.rank(PMIX_APP_RANK, r)?;
            p.rank(PMIX_GLOBAL_RANK, r)?;
            p.u16(PMIX_LOCAL_RANK, i as u16)?;
            p.u16(PMIX_NODE_RANK, i as u16)?;
            p.u32(PMIX_NODEID, nodeid as u32)?;
            p.string(PMIX_HOSTNAME, &s.hosts[nodeid])?;
            job.list(PMIX_PROC_INFO_ARRAY, p)?;
        }
    }
    let mut job = job.convert()?;
    let (p, n) = job.infos();
    let mut ns = proc_of(&s.nspace, 0).nspace;
    // SAFETY: a NUL-terminated namespace of at most PMIX_MAX_NSLEN bytes (checked); a valid info array. Without a
    // callback the call blocks until registered and says so with PMIX_OPERATION_SUCCEEDED.
    let rc =
        unsafe { PMIx_server_register_nspace(ns.as_mut_ptr(), local.len() as i32, p, n, None, std::ptr::null_mut()) };
    if rc != PMIX_OPERATION_SUCCEEDED && rc != PMIX_SUCCESS as pmix_status_t {
        return Err(format!("PMIx_server_register_nspace: {}", error_string(rc)));
    }
    // SAFETY: getuid and getgid cannot fail.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let mut envs = BTreeMap::new();
    for &r in local {
        let proc = proc_of(&s.nspace, r);
        // SAFETY: a valid proc; no callback: blocking.
        let rc =
            unsafe { PMIx_server_register_client(&proc, uid, gid, std::ptr::null_mut(), None, std::ptr::null_mut()) };
        if rc != PMIX_OPERATION_SUCCEEDED && rc != PMIX_SUCCESS as pmix_status_t {
            return Err(format!("PMIx_server_register_client for rank {r}: {}", error_string(rc)));
        }
        let mut env: *mut *mut c_char = std::ptr::null_mut();
        // SAFETY: a valid proc; the library allocates the array (NULL-terminated) and its strings, freed below.
        let rc = unsafe { PMIx_server_setup_fork(&proc, &mut env) };
        if rc != PMIX_SUCCESS as pmix_status_t {
            return Err(format!("PMIx_server_setup_fork for rank {r}: {}", error_string(rc)));
        }
        let mut vars = BTreeMap::new();
        if !env.is_null() {
            let mut i = 0;
            loop {
                // SAFETY: a NULL-terminated array of NUL-terminated strings from the library.
                let e = unsafe { *env.add(i) };
                if e.is_null() {
                    break;
                }
                // SAFETY: see above.
                let kv = unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned();
                if let Some((k, v)) = kv.split_once('=') {
                    vars.insert(k.to_string(), v.to_string());
                }
                // SAFETY: each string was malloc'd by the library and is freed once.
                unsafe { libc::free(e as *mut c_void) };
                i += 1;
            }
            // SAFETY: the array was malloc'd by the library and is freed once.
            unsafe { libc::free(env as *mut c_void) };
        }
        envs.insert(r, vars);
    }
    Ok(envs)
}

/// The helper's life: read the set-up, serve, and finalize at the end of the shell's input. The exit code.
pub(crate) fn run() -> i32 {
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    let setup_line = match lines.next() {
        Some(Ok(l)) => l,
        _ => return 0, // the shell went away before asking anything
    };
    let s: Setup = match serde_json::from_str(&setup_line) {
        Ok(s) => s,
        Err(e) => {
            send(&FromHelper::Error { error: format!("malformed set-up: {e}") });
            return 1;
        }
    };
    match setup(&s) {
        Ok(env) => {
            // SAFETY: PMIx_Get_version returns a static NUL-terminated string.
            let version = unsafe { CStr::from_ptr(PMIx_Get_version()) }.to_string_lossy().into_owned();
            send(&FromHelper::Ready { env, version });
        }
        Err(error) => {
            send(&FromHelper::Error { error });
            return 1;
        }
    }
    for line in lines {
        let Ok(line) = line else { break };
        match serde_json::from_str::<ToHelper>(&line) {
            Ok(ToHelper::FenceDone { seq, data }) => {
                let mut blob = Vec::new();
                let mut bad = None;
                for d in &data {
                    match base64::engine::general_purpose::STANDARD.decode(d) {
                        Ok(b) => blob.extend_from_slice(&b),
                        Err(e) => bad = Some(format!("fence {seq}: a blob is not base64: {e}")),
                    }
                }
                match bad {
                    None => complete(seq, PMIX_SUCCESS as pmix_status_t, blob),
                    Some(e) => {
                        eprintln!("vigil-pmix: {e}");
                        complete(seq, PMIX_ERROR, Vec::new());
                    }
                }
            }
            Ok(ToHelper::FenceFailed { seq, error }) => {
                eprintln!("vigil-pmix: fence {seq} failed: {error}");
                complete(seq, PMIX_ERROR, Vec::new());
            }
            Ok(ToHelper::NodeLost { ranks, hosts }) => {
                if let Err(e) = node_lost(&ranks, &hosts) {
                    eprintln!("vigil-pmix: the lost-node events for rank(s) {ranks:?}: {e}");
                }
            }
            Err(e) => eprintln!("vigil-pmix: malformed line from the shell: {e}"),
        }
    }
    // SAFETY: the server was initialised above; finalized once, at the end.
    unsafe { PMIx_server_finalize() };
    0
}

/// The info key under which the lost-node events name the lost nodes' host names (comma-separated): PMIx has no
/// standard key for it, and a host key of its own is what the standard allows.
const LOST_HOSTS_KEY: &[u8] = b"vigil.lost.hosts\0";

/// Tell this node's clients (range local) that `hosts` were lost, where the job's processes `ranks` ran, by two
/// events, in this order:
/// 1. `PMIX_ERR_PROC_ABORTED`, the code Open MPI's ULFM registers for (with `PMIX_ERR_PROC_TERM_WO_SYNC` and
///    `PMIX_ERR_PROC_ABORTED_BY_SIG`, all handled alike): one `PMIX_EVENT_AFFECTED_PROC` per lost process, which is
///    what ULFM reads (one `pmix_proc_t` each; it skips arrays), then `PMIX_EVENT_AFFECTED_PROCS` and
///    [`LOST_HOSTS_KEY`]. Delivered to default handlers too: a process that registered no handler of its own for
///    it learns a peer is gone (Open MPI without ULFM aborts on it, as it would on any peer's loss).
/// 2. `PMIX_EVENT_NODE_DOWN`, with `PMIX_EVENT_AFFECTED_PROCS` and [`LOST_HOSTS_KEY`], for handlers registered
///    for that code (SCR, tools), and marked `PMIX_EVENT_NON_DEFAULT`: a default handler, already told by the
///    first, is not told twice (Open MPI's, even with ULFM, aborts on an event code it does not handle).
///
/// The server caches each event for a client that registers later.
fn node_lost(ranks: &[u32], hosts: &[String]) -> Result<(), String> {
    let st = STATE.get().ok_or("the server is not set up")?;
    if ranks.is_empty() {
        return Err("ranks: no lost process named".into());
    }
    if let Some(r) = ranks.iter().find(|&&r| r >= st.size) {
        return Err(format!("ranks: {r} is not a rank of a job of {}", st.size));
    }
    let mut procs: Vec<pmix_proc_t> = ranks.iter().map(|&r| proc_of(&st.nspace, r)).collect();
    let mut aborted = InfoList::new();
    for p in &procs {
        // The library copies the proc before returning.
        aborted.add(PMIX_EVENT_AFFECTED_PROC, p as *const pmix_proc_t as *const c_void, PMIX_PROC)?;
    }
    lost_procs_and_hosts(&mut aborted, &mut procs, hosts)?;
    // Each event is tried even if the other fails.
    let first = notify("proc-aborted", PMIX_ERR_PROC_ABORTED, aborted);
    let mut down = InfoList::new();
    lost_procs_and_hosts(&mut down, &mut procs, hosts)?;
    let non_default = true;
    down.add(PMIX_EVENT_NON_DEFAULT, &non_default as *const bool as *const c_void, PMIX_BOOL)?;
    first.and(notify("node-down", PMIX_EVENT_NODE_DOWN, down))
}

/// Add `PMIX_EVENT_AFFECTED_PROCS` (`procs`, as one array) and [`LOST_HOSTS_KEY`] (`hosts`) to `info`.
fn lost_procs_and_hosts(info: &mut InfoList, procs: &mut [pmix_proc_t], hosts: &[String]) -> Result<(), String> {
    let arr = pmix_data_array_t {
        type_: PMIX_PROC as pmix_data_type_t,
        size: procs.len(),
        array: procs.as_mut_ptr() as *mut c_void,
    };
    // The library copies the array and its procs before returning.
    info.add(PMIX_EVENT_AFFECTED_PROCS, &arr as *const pmix_data_array_t as *const c_void, PMIX_DATA_ARRAY)?;
    info.string(LOST_HOSTS_KEY, &hosts.join(","))
}

/// Raise event `code` (`what`, for errors) from the server itself to this node's clients, with `info`.
fn notify(what: &'static str, code: pmix_status_t, info: InfoList) -> Result<(), String> {
    let infos = Box::new(info.convert()?);
    let (p, n) = (infos.0.array as *const pmix_info_t, infos.0.size);
    let keep = Box::into_raw(infos) as *mut c_void;
    // SAFETY: a valid info array, kept alive (in `keep`) until the library calls `notified`; a null source is the
    // server itself.
    let rc = unsafe {
        PMIx_Notify_event(code, std::ptr::null(), PMIX_RANGE_LOCAL as pmix_data_range_t, p, n, Some(notified), keep)
    };
    if rc != PMIX_SUCCESS as pmix_status_t {
        // The callback will not be called.
        // SAFETY: `keep` is the box leaked above, not handed to the library.
        drop(unsafe { Box::from_raw(keep as *mut DataArray) });
        if rc != PMIX_OPERATION_SUCCEEDED {
            return Err(format!("PMIx_Notify_event({what}): {}", error_string(rc)));
        }
    }
    Ok(())
}

/// A client registers an event handler: acknowledged at once. The events this server raises (node down) come from
/// the shell, not from a subscription the host keeps; without this upcall OpenPMIx fails the client's
/// `PMIx_Register_event_handler` (`SERVER FAILED REQUEST`).
extern "C" fn register_events(
    _codes: *mut pmix_status_t,
    _ncodes: usize,
    _info: *const pmix_info_t,
    _ninfo: usize,
    _cbfunc: pmix_op_cbfunc_t,
    _cbdata: *mut c_void,
) -> pmix_status_t {
    PMIX_OPERATION_SUCCEEDED
}

/// Frees a lost-node event's info once the library is done with it.
extern "C" fn notified(status: pmix_status_t, cbdata: *mut c_void) {
    if status != PMIX_SUCCESS as pmix_status_t {
        eprintln!("vigil-pmix: a lost-node event: {}", error_string(status));
    }
    if !cbdata.is_null() {
        // SAFETY: `cbdata` is the Box<DataArray> leaked by `notify`, released once here.
        drop(unsafe { Box::from_raw(cbdata as *mut DataArray) });
    }
}

/// Frees a fence's result once the library has taken it.
extern "C" fn release_blob(cbdata: *mut c_void) {
    if !cbdata.is_null() {
        // SAFETY: `cbdata` is the Box<Vec<u8>> leaked by `complete`, released once by the library.
        drop(unsafe { Box::from_raw(cbdata as *mut Vec<u8>) });
    }
}

/// Hand fence `seq`'s result to the library.
fn complete(seq: u64, status: pmix_status_t, blob: Vec<u8>) {
    let Some(st) = STATE.get() else { return };
    let Some((cb, cbdata)) = st.pending.lock().ok().and_then(|mut p| p.remove(&seq)) else {
        eprintln!("vigil-pmix: an answer to fence {seq}, which is not waiting");
        return;
    };
    let Some(cb) = cb else { return };
    let blob = Box::new(blob);
    let (ptr, len) = (blob.as_ptr() as *const c_char, blob.len());
    let keep = Box::into_raw(blob) as *mut c_void;
    // SAFETY: the callback and argument the library gave fence_nb for this fence, called once; the data stays
    // valid until the library calls release_blob with `keep`.
    unsafe { cb(status, ptr, len, cbdata as *mut c_void, Some(release_blob), keep) };
}

/// The global rank of a client the library names, if it is of our namespace.
///
/// # Safety
/// `proc` is null or points to a valid `pmix_proc_t`.
unsafe fn our_rank(proc: *const pmix_proc_t) -> Option<u32> {
    // SAFETY: by the caller's contract.
    let p = unsafe { proc.as_ref() }?;
    let st = STATE.get()?;
    (field_str(&p.nspace) == st.nspace).then_some(p.rank)
}

/// A client connected (`FINALIZED` false: `PMIx_Init`) or finalized (`PMIx_Finalize`): the shell is told which.
extern "C" fn client_state<const FINALIZED: bool>(
    proc: *const pmix_proc_t,
    _server_object: *mut c_void,
    _cbfunc: pmix_op_cbfunc_t,
    _cbdata: *mut c_void,
) -> pmix_status_t {
    // SAFETY: the library passes a valid proc.
    if let Some(rank) = unsafe { our_rank(proc) } {
        send(&if FINALIZED { FromHelper::Finalized { rank } } else { FromHelper::Connected { rank } });
    }
    PMIX_OPERATION_SUCCEEDED
}

#[allow(clippy::too_many_arguments)]
extern "C" fn abort(
    proc: *const pmix_proc_t,
    _server_object: *mut c_void,
    status: i32,
    msg: *const c_char,
    _procs: *mut pmix_proc_t,
    _nprocs: usize,
    _cbfunc: pmix_op_cbfunc_t,
    _cbdata: *mut c_void,
) -> pmix_status_t {
    // SAFETY: the library passes a valid proc.
    let Some(rank) = (unsafe { our_rank(proc) }) else { return PMIX_ERR_BAD_PARAM };
    let msg = if msg.is_null() {
        String::new()
    } else {
        // SAFETY: non-null, a NUL-terminated string from the client (lossily decoded: it may be anything).
        unsafe { CStr::from_ptr(msg) }.to_string_lossy().chars().take(1024).collect()
    };
    // The whole job is brought down by the shell, whatever subset `procs` names.
    send(&FromHelper::Abort { rank, status, msg });
    PMIX_OPERATION_SUCCEEDED
}

/// Whether `procs` names every process of the job (the only fence served: across the whole namespace).
///
/// # Safety
/// `procs` points to `nprocs` valid `pmix_proc_t` (or is null with `nprocs` 0).
unsafe fn whole_job(st: &State, procs: *const pmix_proc_t, nprocs: usize) -> Result<(), String> {
    if procs.is_null() || nprocs == 0 {
        return Err("a fence with no participants".into());
    }
    // SAFETY: by the caller's contract.
    let procs = unsafe { std::slice::from_raw_parts(procs, nprocs) };
    let mut ranks = BTreeSet::new();
    for p in procs {
        let ns = field_str(&p.nspace);
        if ns != st.nspace {
            return Err(format!("a fence with namespace {ns:?}, not this job's"));
        }
        if p.rank == RANK_WILDCARD {
            return Ok(());
        }
        if p.rank >= st.size {
            return Err(format!("a fence with rank {} of a job of {}", p.rank, st.size));
        }
        ranks.insert(p.rank);
    }
    if ranks.len() as u32 != st.size {
        return Err(format!(
            "a fence of {} of the job's {} processes (only fences across the whole job are served)",
            ranks.len(),
            st.size
        ));
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
extern "C" fn fence_nb(
    procs: *const pmix_proc_t,
    nprocs: usize,
    _info: *const pmix_info_t,
    _ninfo: usize,
    data: *mut c_char,
    ndata: usize,
    cbfunc: pmix_modex_cbfunc_t,
    cbdata: *mut c_void,
) -> pmix_status_t {
    let Some(st) = STATE.get() else { return PMIX_ERR_NOT_SUPPORTED };
    // SAFETY: the library passes `nprocs` valid procs.
    if let Err(e) = unsafe { whole_job(st, procs, nprocs) } {
        eprintln!("vigil-pmix: {e}");
        return PMIX_ERR_NOT_SUPPORTED;
    }
    if ndata > FENCE_MAX {
        eprintln!("vigil-pmix: this node's fence data is {ndata} bytes, above the bound of {FENCE_MAX}");
        return PMIX_ERR_BAD_PARAM;
    }
    let bytes = if data.is_null() || ndata == 0 {
        &[][..]
    } else {
        // SAFETY: the library passes `ndata` readable bytes at `data`, valid for this call.
        unsafe { std::slice::from_raw_parts(data as *const u8, ndata) }
    };
    let seq = st.seq.fetch_add(1, Ordering::SeqCst);
    if let Ok(mut p) = st.pending.lock() {
        p.insert(seq, (cbfunc, cbdata as usize));
    }
    send(&FromHelper::Fence { seq, data: base64::engine::general_purpose::STANDARD.encode(bytes) });
    PMIX_SUCCESS as pmix_status_t
}

extern "C" fn direct_modex(
    _proc: *const pmix_proc_t,
    _info: *const pmix_info_t,
    _ninfo: usize,
    _cbfunc: pmix_modex_cbfunc_t,
    _cbdata: *mut c_void,
) -> pmix_status_t {
    // Served from what the fences brought only (a direct request to the node of the process is not yet).
    PMIX_ERR_NOT_FOUND
}
