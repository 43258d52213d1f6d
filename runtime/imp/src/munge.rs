//! Decoding a munge credential: a hand-written declaration of the few libmunge functions used (`munge.h` of
//! munge 0.5; linked with `-lmunge`).

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::Path;

/// `munge_ctx_t`: an opaque context.
#[repr(C)]
struct MungeCtx {
    _private: [u8; 0],
}

/// `MUNGE_OPT_SOCKET` (a `const char *`).
const MUNGE_OPT_SOCKET: c_int = 8;
/// `MUNGE_OPT_ENCODE_TIME` (a `time_t`, got after a decode).
const MUNGE_OPT_ENCODE_TIME: c_int = 6;
/// `EMUNGE_SUCCESS`.
const EMUNGE_SUCCESS: c_int = 0;
/// `EMUNGE_CRED_EXPIRED`: good, but older than its TTL.
const EMUNGE_CRED_EXPIRED: c_int = 15;
/// `EMUNGE_CRED_REPLAYED`: good, but decoded before by this munged.
const EMUNGE_CRED_REPLAYED: c_int = 17;

#[link(name = "munge")]
extern "C" {
    fn munge_ctx_create() -> *mut MungeCtx;
    fn munge_ctx_destroy(ctx: *mut MungeCtx);
    fn munge_ctx_set(ctx: *mut MungeCtx, opt: c_int, ...) -> c_int;
    fn munge_ctx_get(ctx: *mut MungeCtx, opt: c_int, ...) -> c_int;
    fn munge_ctx_strerror(ctx: *mut MungeCtx) -> *const c_char;
    fn munge_strerror(e: c_int) -> *const c_char;
    fn munge_decode(
        cred: *const c_char,
        ctx: *mut MungeCtx,
        buf: *mut *mut c_void,
        len: *mut c_int,
        uid: *mut libc::uid_t,
        gid: *mut libc::gid_t,
    ) -> c_int;
}

/// What munged said of a credential whose MAC it verified (made with its key, unaltered).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    /// Within its TTL, and decoded for the first time on this node.
    Fresh,
    /// Older than its TTL (`EMUNGE_CRED_EXPIRED`).
    Expired,
    /// Decoded before on this node (`EMUNGE_CRED_REPLAYED`): a job requeued here, or another node of the job
    /// sharing this munged.
    Replayed,
}

impl Status {
    /// munge's name for it, for messages.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Status::Fresh => "EMUNGE_SUCCESS",
            Status::Expired => "EMUNGE_CRED_EXPIRED",
            Status::Replayed => "EMUNGE_CRED_REPLAYED",
        }
    }
}

/// A credential munged verified: who made it, when, its payload, and whether it is past its TTL or replayed.
#[derive(Debug)]
pub(crate) struct Decoded {
    /// The uid of the process that encoded it (munged's word, from the encoder's socket credentials).
    pub(crate) uid: u32,
    pub(crate) payload: Vec<u8>,
    /// When it was made (munged's clock on the encoding node), in seconds since the Unix epoch.
    pub(crate) encoded_at: i64,
    pub(crate) status: Status,
}

/// munge's error codes this program names (`munge_err_t`), beside munge's own text.
fn name(e: c_int) -> &'static str {
    match e {
        6 => "EMUNGE_SOCKET",
        8 => "EMUNGE_BAD_CRED",
        13 => "EMUNGE_BAD_REALM",
        14 => "EMUNGE_CRED_INVALID",
        15 => "EMUNGE_CRED_EXPIRED",
        16 => "EMUNGE_CRED_REWOUND",
        17 => "EMUNGE_CRED_REPLAYED",
        18 => "EMUNGE_CRED_UNAUTHORIZED",
        _ => "munge error",
    }
}

/// A context, destroyed when dropped.
struct Ctx(*mut MungeCtx);

impl Drop for Ctx {
    fn drop(&mut self) {
        // SAFETY: a context from munge_ctx_create, destroyed once.
        unsafe { munge_ctx_destroy(self.0) }
    }
}

/// Decode `cred` with the munged at `socket` (libmunge's default without). munge's checks of its making apply: the
/// credential is munged's key's (its MAC), well formed, and not rewound (made in the future). Past its TTL or
/// decoded before on this node (munged's replay cache; the decoding records it) it is returned with that
/// [`Status`]: the caller's rule decides (crate docs, "Credentials that wait").
///
/// # Errors
/// munge's refusal, with its code's name (`EMUNGE_CRED_INVALID`...) and munge's own message.
pub(crate) fn decode(cred: &str, socket: Option<&Path>) -> Result<Decoded, String> {
    let c = CString::new(cred).map_err(|_| "it has a NUL byte".to_string())?;
    // SAFETY: no arguments; a null result is handled.
    let ctx = Ctx(unsafe { munge_ctx_create() });
    if ctx.0.is_null() {
        return Err("cannot create a munge context".into());
    }
    if let Some(s) = socket {
        use std::os::unix::ffi::OsStrExt;
        let s = CString::new(s.as_os_str().as_bytes()).map_err(|_| "munge-socket has a NUL byte".to_string())?;
        // SAFETY: MUNGE_OPT_SOCKET takes a `const char *`, which libmunge copies; `s` outlives the call.
        let e = unsafe { munge_ctx_set(ctx.0, MUNGE_OPT_SOCKET, s.as_ptr()) };
        if e != EMUNGE_SUCCESS {
            return Err(format!("cannot set munge's socket: {}", message(&ctx, e)));
        }
    }
    let mut buf: *mut c_void = std::ptr::null_mut();
    let mut len: c_int = 0;
    let (mut uid, mut gid): (libc::uid_t, libc::gid_t) = (0, 0);
    // SAFETY: `c` is a valid C string; the out-pointers are to our locals; libmunge allocates `buf` with malloc.
    let e = unsafe { munge_decode(c.as_ptr(), ctx.0, &mut buf, &mut len, &mut uid, &mut gid) };
    let payload = if buf.is_null() || len <= 0 {
        Vec::new()
    } else {
        // SAFETY: libmunge returned `len` bytes at `buf`.
        unsafe { std::slice::from_raw_parts(buf as *const u8, len as usize) }.to_vec()
    };
    if !buf.is_null() {
        // SAFETY: `buf` was allocated by libmunge with malloc, and is ours to free, once.
        unsafe { libc::free(buf) };
    }
    let status = match e {
        EMUNGE_SUCCESS => Status::Fresh,
        EMUNGE_CRED_EXPIRED => Status::Expired,
        EMUNGE_CRED_REPLAYED => Status::Replayed,
        _ => return Err(format!("{} ({})", message(&ctx, e), name(e))),
    };
    let mut encoded_at: libc::time_t = 0;
    // SAFETY: MUNGE_OPT_ENCODE_TIME writes a time_t through the pointer, to our local.
    let g = unsafe { munge_ctx_get(ctx.0, MUNGE_OPT_ENCODE_TIME, &mut encoded_at as *mut libc::time_t) };
    if g != EMUNGE_SUCCESS || encoded_at <= 0 {
        return Err(format!("munge did not say when it was made ({})", message(&ctx, g)));
    }
    Ok(Decoded { uid, payload, encoded_at: encoded_at as i64, status })
}

/// munge's message for `e`: the context's (more precise) or the code's.
fn message(ctx: &Ctx, e: c_int) -> String {
    // SAFETY: a live context; the result is null or a NUL-terminated string owned by the context.
    let p = unsafe { munge_ctx_strerror(ctx.0) };
    // SAFETY: munge_strerror returns a static string for any code.
    let p = if p.is_null() { unsafe { munge_strerror(e) } } else { p };
    if p.is_null() {
        return format!("munge error {e}");
    }
    // SAFETY: a NUL-terminated string, alive while the context is.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}
