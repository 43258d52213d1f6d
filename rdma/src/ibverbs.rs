//! libibverbs, loaded with `dlopen` the first time a verbs device is looked for, and only when the kernel lists
//! one.
//!
//! Linked at build time, libibverbs (and the two libnl libraries it needs) were mapped and relocated in every
//! `vigil` process, ~0.6 MB resident per broker, on the many nodes that have no verbs device at all. Now a
//! process maps them only when `/sys/class/infiniband_verbs` (where libibverbs itself looks) lists a device;
//! once loaded, the library stays loaded for the life of the process.
//!
//! The functions are looked up by the symbol versions the build-time link used, so they are the same entry
//! points as before. rdma-sys still provides the types and the inline verbs (post, poll, notify), which call
//! through the device context's operation table and need no symbol.

use rdma_sys as sys;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;

/// The file name `dlopen` is given (the library's soname: any libibverbs 1.x).
const SONAME: &CStr = c"libibverbs.so.1";

/// The entry points of libibverbs the transport calls.
#[allow(missing_docs)] // Each field is the libibverbs function of the same name (verbs.h documents them).
pub(crate) struct Ibverbs {
    pub get_device_list: unsafe extern "C" fn(*mut c_int) -> *mut *mut sys::ibv_device,
    pub free_device_list: unsafe extern "C" fn(*mut *mut sys::ibv_device),
    pub get_device_name: unsafe extern "C" fn(*mut sys::ibv_device) -> *const c_char,
    pub open_device: unsafe extern "C" fn(*mut sys::ibv_device) -> *mut sys::ibv_context,
    pub close_device: unsafe extern "C" fn(*mut sys::ibv_context) -> c_int,
    pub query_device: unsafe extern "C" fn(*mut sys::ibv_context, *mut sys::ibv_device_attr) -> c_int,
    /// The exported (compat) `ibv_query_port`, used when the provider has no `query_port` op of its own.
    pub query_port: unsafe extern "C" fn(*mut sys::ibv_context, u8, *mut sys::_compat_ibv_port_attr) -> c_int,
    pub query_gid: unsafe extern "C" fn(*mut sys::ibv_context, u8, c_int, *mut sys::ibv_gid) -> c_int,
    pub alloc_pd: unsafe extern "C" fn(*mut sys::ibv_context) -> *mut sys::ibv_pd,
    pub dealloc_pd: unsafe extern "C" fn(*mut sys::ibv_pd) -> c_int,
    pub reg_mr: unsafe extern "C" fn(*mut sys::ibv_pd, *mut c_void, usize, c_int) -> *mut sys::ibv_mr,
    pub dereg_mr: unsafe extern "C" fn(*mut sys::ibv_mr) -> c_int,
    pub create_comp_channel: unsafe extern "C" fn(*mut sys::ibv_context) -> *mut sys::ibv_comp_channel,
    pub destroy_comp_channel: unsafe extern "C" fn(*mut sys::ibv_comp_channel) -> c_int,
    pub create_cq: unsafe extern "C" fn(
        *mut sys::ibv_context,
        c_int,
        *mut c_void,
        *mut sys::ibv_comp_channel,
        c_int,
    ) -> *mut sys::ibv_cq,
    pub destroy_cq: unsafe extern "C" fn(*mut sys::ibv_cq) -> c_int,
    pub get_cq_event:
        unsafe extern "C" fn(*mut sys::ibv_comp_channel, *mut *mut sys::ibv_cq, *mut *mut c_void) -> c_int,
    pub ack_cq_events: unsafe extern "C" fn(*mut sys::ibv_cq, u32),
    pub create_qp: unsafe extern "C" fn(*mut sys::ibv_pd, *mut sys::ibv_qp_init_attr) -> *mut sys::ibv_qp,
    pub modify_qp: unsafe extern "C" fn(*mut sys::ibv_qp, *mut sys::ibv_qp_attr, c_int) -> c_int,
    pub destroy_qp: unsafe extern "C" fn(*mut sys::ibv_qp) -> c_int,
    pub wc_status_str: unsafe extern "C" fn(sys::ibv_wc_status::Type) -> *const c_char,
    pub get_async_event: unsafe extern "C" fn(*mut sys::ibv_context, *mut sys::ibv_async_event) -> c_int,
    pub ack_async_event: unsafe extern "C" fn(*mut sys::ibv_async_event),
}

static LIB: OnceLock<Result<Ibverbs, String>> = OnceLock::new();

/// libibverbs, loading it on first use; `Err` says why it cannot be loaded (not installed, a symbol missing).
pub(crate) fn load() -> Result<&'static Ibverbs, &'static str> {
    LIB.get_or_init(open).as_ref().map_err(String::as_str)
}

/// libibverbs, for code that holds an object made by it (a device context or its children): it was loaded.
pub(crate) fn loaded() -> &'static Ibverbs {
    match LIB.get() {
        Some(Ok(l)) => l,
        // Unreachable: every verbs object is made from a device list that `load` returned.
        _ => panic!("libibverbs is used before it was loaded"),
    }
}

/// Whether the kernel lists any verbs device: a `uverbs*` entry in `$SYSFS_PATH/class/infiniband_verbs`
/// (`SYSFS_PATH` defaults to `/sys`, as in libibverbs). Without one, libibverbs could only report "no
/// devices", and there is no reason to load it.
pub(crate) fn kernel_lists_devices() -> bool {
    let sysfs = std::env::var_os("SYSFS_PATH").unwrap_or_else(|| "/sys".into());
    let dir = std::path::Path::new(&sysfs).join("class/infiniband_verbs");
    std::fs::read_dir(dir)
        .map(|entries| entries.flatten().any(|e| e.file_name().to_string_lossy().starts_with("uverbs")))
        .unwrap_or(false)
}

fn open() -> Result<Ibverbs, String> {
    // SAFETY: dlopen with a NUL-terminated name; the handle is never closed, so every symbol taken from it stays
    // valid for the life of the process.
    let handle = unsafe { libc::dlopen(SONAME.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if handle.is_null() {
        return Err(format!("cannot load {}: {}", SONAME.to_string_lossy(), dl_error()));
    }
    macro_rules! sym {
        ($name:literal, $version:literal) => {{
            let name = concat!($name, "\0");
            let version = concat!($version, "\0");
            // SAFETY: a live handle and NUL-terminated strings.
            let p = unsafe { libc::dlvsym(handle, name.as_ptr().cast(), version.as_ptr().cast()) };
            if p.is_null() {
                return Err(format!("{} has no {}@{}", SONAME.to_string_lossy(), $name, $version));
            }
            // SAFETY: the symbol of this name and version has the C signature of the field it is stored in (the
            // one verbs.h declares, which rdma-sys's bindings mirror).
            unsafe { fn_ptr(p) }
        }};
    }
    Ok(Ibverbs {
        get_device_list: sym!("ibv_get_device_list", "IBVERBS_1.1"),
        free_device_list: sym!("ibv_free_device_list", "IBVERBS_1.1"),
        get_device_name: sym!("ibv_get_device_name", "IBVERBS_1.1"),
        open_device: sym!("ibv_open_device", "IBVERBS_1.1"),
        close_device: sym!("ibv_close_device", "IBVERBS_1.1"),
        query_device: sym!("ibv_query_device", "IBVERBS_1.1"),
        query_port: sym!("ibv_query_port", "IBVERBS_1.1"),
        query_gid: sym!("ibv_query_gid", "IBVERBS_1.1"),
        alloc_pd: sym!("ibv_alloc_pd", "IBVERBS_1.1"),
        dealloc_pd: sym!("ibv_dealloc_pd", "IBVERBS_1.1"),
        reg_mr: sym!("ibv_reg_mr", "IBVERBS_1.1"),
        dereg_mr: sym!("ibv_dereg_mr", "IBVERBS_1.1"),
        create_comp_channel: sym!("ibv_create_comp_channel", "IBVERBS_1.0"),
        destroy_comp_channel: sym!("ibv_destroy_comp_channel", "IBVERBS_1.0"),
        create_cq: sym!("ibv_create_cq", "IBVERBS_1.1"),
        destroy_cq: sym!("ibv_destroy_cq", "IBVERBS_1.1"),
        get_cq_event: sym!("ibv_get_cq_event", "IBVERBS_1.1"),
        ack_cq_events: sym!("ibv_ack_cq_events", "IBVERBS_1.1"),
        create_qp: sym!("ibv_create_qp", "IBVERBS_1.1"),
        modify_qp: sym!("ibv_modify_qp", "IBVERBS_1.1"),
        destroy_qp: sym!("ibv_destroy_qp", "IBVERBS_1.1"),
        wc_status_str: sym!("ibv_wc_status_str", "IBVERBS_1.1"),
        get_async_event: sym!("ibv_get_async_event", "IBVERBS_1.1"),
        ack_async_event: sym!("ibv_ack_async_event", "IBVERBS_1.1"),
    })
}

/// A symbol's address as the function pointer type `F`.
///
/// # Safety
/// `F` is an `unsafe extern "C" fn` type whose signature is the symbol's.
unsafe fn fn_ptr<F: Copy>(p: *mut c_void) -> F {
    const { assert!(std::mem::size_of::<F>() == std::mem::size_of::<*mut c_void>()) };
    // SAFETY: same size (checked above); the caller vouches for the signature.
    unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) }
}

/// The message of the last failed `dl*` call.
fn dl_error() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string valid until the next dl* call on this thread.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown error".into()
    } else {
        // SAFETY: non-null, NUL-terminated (above); copied at once.
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn loads_where_installed() {
        // The build machine has libibverbs (rdma-sys needs its headers); every entry point must resolve.
        if let Err(e) = super::load() {
            assert!(e.contains("cannot load"), "libibverbs loads but an entry point is missing: {e}");
        }
    }
}
