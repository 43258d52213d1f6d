//! Owned libfabric objects and the few raw helpers the endpoint needs (only with libfabric).
//!
//! Every object is closed exactly once by `Drop`. libfabric refuses to close an object still bound to another
//! (`FI_EBUSY`), so the endpoint's [`Handles`] declares its fields child first: Rust drops fields in declaration
//! order, which closes the endpoint before the completion queue and address vector it is bound to, those before
//! their domain, and the domain before its fabric.

use crate::error::CallError;
use crate::sys;
use std::ffi::CStr;
use std::os::raw::c_void;
use std::ptr::NonNull;

/// `FI_VERSION(1, 10)`: the API version the layer asks for (all it uses exists in 1.10; newer libraries serve
/// older API versions).
pub(crate) const API_VERSION: u32 = (1 << 16) | 10;
/// `FI_ADDR_UNSPEC` / `FI_ADDR_NOTAVAIL` (`(uint64_t) -1`, a cast bindgen does not evaluate).
pub(crate) const ADDR_UNSPEC: u64 = u64::MAX;

/// `fi_strerror(code)` for a positive error number.
pub(crate) fn strerror(code: i32) -> String {
    // SAFETY: fi_strerror accepts any value and returns a pointer to a static NUL-terminated string (libfabric's
    // own table, or strerror's for POSIX values).
    let p = unsafe { sys::fi_strerror(code) };
    if p.is_null() {
        return format!("error {code}");
    }
    // SAFETY: non-null, NUL-terminated, static (see above); copied at once.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// A `CallError` for a negative libfabric return value.
pub(crate) fn call_err(call: &'static str, rc: isize) -> CallError {
    let code = rc.unsigned_abs().min(i32::MAX as usize) as i32;
    CallError { call, code, text: strerror(code) }
}

/// Map a libfabric return value (0 or positive: success, negative: `-FI_E*`) to a `Result`.
pub(crate) fn check(call: &'static str, rc: i32) -> Result<(), CallError> {
    if rc >= 0 {
        Ok(())
    } else {
        Err(call_err(call, rc as isize))
    }
}

/// A `fi_info` list from `fi_getinfo` or `fi_allocinfo`, freed with `fi_freeinfo`.
pub(crate) struct Info(NonNull<sys::fi_info>);

impl Info {
    /// `fi_allocinfo()`: zeroed hints with their attribute structs allocated.
    pub(crate) fn alloc() -> Result<Info, CallError> {
        // SAFETY: fi_allocinfo takes no arguments and returns an owned fi_info (or NULL when out of memory).
        let p = unsafe { sys::vigil_fi_allocinfo() };
        NonNull::new(p).map(Info).ok_or(CallError { call: "fi_allocinfo", code: 12, text: strerror(12) })
    }

    /// Wrap a list `fi_getinfo` returned.
    ///
    /// # Safety
    /// `p` is an owned `fi_info` list that nothing else frees.
    pub(crate) unsafe fn from_raw(p: *mut sys::fi_info) -> Option<Info> {
        NonNull::new(p).map(Info)
    }

    pub(crate) fn as_ptr(&self) -> *mut sys::fi_info {
        self.0.as_ptr()
    }
}

impl Drop for Info {
    fn drop(&mut self) {
        // SAFETY: we own the list (fi_allocinfo / fi_getinfo) and free it once; strings set in hints were
        // allocated with libc's strdup, which fi_freeinfo frees.
        unsafe { sys::fi_freeinfo(self.0.as_ptr()) }
    }
}

/// A libfabric object whose first member is its `struct fid`, closed with `fi_close` on drop.
pub(crate) struct Fid<T> {
    ptr: NonNull<T>,
    what: &'static str,
}

impl<T> Fid<T> {
    /// Take ownership of an object just opened.
    ///
    /// # Safety
    /// `ptr` is a live libfabric object of type `T` (`fid_fabric`, `fid_domain`, `fid_av`, `fid_cq`, `fid_ep`),
    /// which all start with `struct fid fid`; nothing else closes it.
    pub(crate) unsafe fn new(ptr: *mut T, what: &'static str) -> Option<Fid<T>> {
        NonNull::new(ptr).map(|ptr| Fid { ptr, what })
    }

    pub(crate) fn as_ptr(&self) -> *mut T {
        self.ptr.as_ptr()
    }

    /// The object's `struct fid` (its first member).
    pub(crate) fn fid(&self) -> *mut sys::fid {
        self.ptr.as_ptr().cast()
    }
}

impl<T> Drop for Fid<T> {
    fn drop(&mut self) {
        // SAFETY: a live object we own (Fid::new's contract), closed once; its first member is its struct fid.
        let rc = unsafe { sys::vigil_fi_close(self.fid()) };
        if rc != 0 {
            tracing::warn!("fi_close({}): {}", self.what, strerror(-rc));
        }
    }
}

/// The objects of one endpoint, declared child first so that they are closed in a valid order (module doc).
pub(crate) struct Handles {
    pub(crate) ep: Fid<sys::fid_ep>,
    pub(crate) cq: Fid<sys::fid_cq>,
    pub(crate) av: Fid<sys::fid_av>,
    /// Only held, so that it is closed after its children.
    #[allow(dead_code)]
    pub(crate) domain: Fid<sys::fid_domain>,
    pub(crate) fabric: Fid<sys::fid_fabric>,
}

/// A fixed array of `T` at a stable address, handed to libfabric by raw pointer and only ever accessed through
/// raw pointers on the Rust side (the provider may write into one element while we read another, so no
/// reference to the whole array is ever made).
pub(crate) struct RawArray<T> {
    ptr: NonNull<T>,
    len: usize,
}

impl<T: Default> RawArray<T> {
    pub(crate) fn new(len: usize) -> RawArray<T> {
        let b: Box<[T]> = (0..len).map(|_| T::default()).collect();
        let ptr = NonNull::new(Box::into_raw(b).cast::<T>()).expect("Box pointers are non-null");
        RawArray { ptr, len }
    }

    /// Pointer to element `i` (< len).
    pub(crate) fn at(&self, i: usize) -> *mut T {
        assert!(i < self.len, "RawArray index {i} out of {}", self.len);
        // SAFETY: in bounds of the allocation (checked above).
        unsafe { self.ptr.as_ptr().add(i) }
    }

    /// Index of the element `p` points to, if it is one of ours.
    pub(crate) fn index_of(&self, p: *const c_void) -> Option<usize> {
        let base = self.ptr.as_ptr() as usize;
        let size = std::mem::size_of::<T>().max(1);
        let off = (p as usize).checked_sub(base)?;
        (off % size == 0 && off / size < self.len).then_some(off / size)
    }
}

impl<T> Drop for RawArray<T> {
    fn drop(&mut self) {
        let slice = std::ptr::slice_from_raw_parts_mut(self.ptr.as_ptr(), self.len);
        // SAFETY: ptr/len are those of the boxed slice leaked in `new`; rebuilt and dropped once.
        drop(unsafe { Box::from_raw(slice) });
    }
}
