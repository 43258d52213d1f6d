//! The submitter's munge credential for `vigil-imp` (docs/security.md, "The privileged launcher").
//!
//! In a multi-user instance (`guests` in the broker's [`crate::Welcome`]) a guest's submission carries a munge
//! credential made by the submitting user over a payload that names the instance and the SHA-256 of the
//! jobspec's JSON text as sent. `vigil-imp` checks it on each node before it runs the job's shell as that user;
//! the payload's format is written down in the `vigil-imp` crate's docs ("The credential"), whose tests hold the
//! same text as [`payload`]'s.
//!
//! libmunge is loaded when a credential is first made (`dlopen("libmunge.so.2")`), not linked: personal
//! instances, and every broker, run on nodes without munge.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::Path;
use std::sync::OnceLock;

/// Environment variable naming munged's socket for the credentials this process makes (default: munge's own,
/// `/run/munge/munge.socket.2`).
pub const SOCKET_ENV: &str = "VIGIL_MUNGE_SOCKET";

/// Why a credential could not be made.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum CredentialError {
    /// libmunge is not installed on this node (Debian's `libmunge2`, with `munge`).
    #[error("cannot load libmunge ({0}): install munge to submit to a multi-user instance")]
    NoLibrary(String),
    /// munge refused, or munged could not be reached: munge's own message.
    #[error("munge: {0}")]
    Munge(String),
}

/// The payload a credential covers: `instance`'s name and the SHA-256 of `jobspec`, the jobspec's JSON text
/// exactly as it is sent (`vigil-imp`'s crate docs, "The credential").
pub fn payload(instance: &str, jobspec: &[u8]) -> String {
    format!("vigil-imp-credential 1\ninstance={instance}\njobspec-sha256={}\n", sha256_hex(jobspec))
}

/// Lowercase hex SHA-256 of `b` (a jobspec's, as the credential's payload and `vigil-imp` name it).
pub fn sha256_hex(b: &[u8]) -> String {
    use ring::digest::{digest, SHA256};
    digest(&SHA256, b).as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// `munge_ctx_set`'s `MUNGE_OPT_TTL` (an `int`) and `MUNGE_OPT_SOCKET` (a `const char *`).
const MUNGE_OPT_TTL: c_int = 4;
const MUNGE_OPT_SOCKET: c_int = 8;
/// `MUNGE_TTL_MAXIMUM`: the longest time to live munged allows (its `--max-ttl`).
const MUNGE_TTL_MAXIMUM: c_int = -1;

type CtxCreate = unsafe extern "C" fn() -> *mut c_void;
type CtxDestroy = unsafe extern "C" fn(*mut c_void);
type CtxSet = unsafe extern "C" fn(*mut c_void, c_int, ...) -> c_int;
type Encode = unsafe extern "C" fn(*mut *mut c_char, *mut c_void, *const c_void, c_int) -> c_int;
type StrError = unsafe extern "C" fn(c_int) -> *const c_char;

/// The libmunge functions used, resolved once.
struct Lib {
    ctx_create: CtxCreate,
    ctx_destroy: CtxDestroy,
    ctx_set: CtxSet,
    encode: Encode,
    strerror: StrError,
}

/// libmunge, loaded on first use (the handle is never closed).
fn lib() -> Result<&'static Lib, CredentialError> {
    static LIB: OnceLock<Result<Lib, String>> = OnceLock::new();
    LIB.get_or_init(|| {
        // SAFETY: dlopen with a valid C string; the library's initialisers are munge's own.
        let h = unsafe { libc::dlopen(c"libmunge.so.2".as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if h.is_null() {
            // SAFETY: dlerror returns null or a C string valid until the next dl* call on this thread.
            let e = unsafe { libc::dlerror() };
            return Err(if e.is_null() {
                "libmunge.so.2 not found".into()
            } else {
                // SAFETY: as above.
                unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
            });
        }
        let sym = |name: &CStr| {
            // SAFETY: `h` is a live handle and `name` a C string.
            let p = unsafe { libc::dlsym(h, name.as_ptr()) };
            if p.is_null() {
                Err(format!("libmunge.so.2 has no {}", name.to_string_lossy()))
            } else {
                Ok(p)
            }
        };
        // SAFETY: each symbol is libmunge's function of that name, whose C signature (munge.h, 0.5) is the type
        // it is cast to.
        unsafe {
            Ok(Lib {
                ctx_create: std::mem::transmute::<*mut c_void, CtxCreate>(sym(c"munge_ctx_create")?),
                ctx_destroy: std::mem::transmute::<*mut c_void, CtxDestroy>(sym(c"munge_ctx_destroy")?),
                ctx_set: std::mem::transmute::<*mut c_void, CtxSet>(sym(c"munge_ctx_set")?),
                encode: std::mem::transmute::<*mut c_void, Encode>(sym(c"munge_encode")?),
                strerror: std::mem::transmute::<*mut c_void, StrError>(sym(c"munge_strerror")?),
            })
        }
    })
    .as_ref()
    .map_err(|e| CredentialError::NoLibrary(e.clone()))
}

/// Make a credential, as this process's user, for `instance`'s job `jobspec` (its JSON text exactly as it is
/// sent): the longest time to live munged allows, munged at `socket` (`None`: `$VIGIL_MUNGE_SOCKET`, else munge's
/// default). Returns munge's text (`MUNGE:...:`).
///
/// # Errors
/// libmunge is missing, or munge failed (munged not running, ...).
pub fn credential(instance: &str, jobspec: &[u8], socket: Option<&Path>) -> Result<String, CredentialError> {
    let lib = lib()?;
    let body = payload(instance, jobspec);
    let from_env = std::env::var_os(SOCKET_ENV).filter(|s| !s.is_empty());
    let socket = socket.map(|p| p.as_os_str().to_owned()).or(from_env);
    let err = |e: c_int| {
        // SAFETY: munge_strerror returns a static C string for any code.
        let p = unsafe { (lib.strerror)(e) };
        let text = if p.is_null() {
            format!("error {e}")
        } else {
            // SAFETY: as above.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        };
        CredentialError::Munge(text)
    };
    // SAFETY: no arguments; null is checked.
    let ctx = unsafe { (lib.ctx_create)() };
    if ctx.is_null() {
        return Err(CredentialError::Munge("cannot create a munge context".into()));
    }
    struct Ctx<'a>(&'a Lib, *mut c_void);
    impl Drop for Ctx<'_> {
        fn drop(&mut self) {
            // SAFETY: a context from munge_ctx_create, destroyed once.
            unsafe { (self.0.ctx_destroy)(self.1) }
        }
    }
    let ctx = Ctx(lib, ctx);
    // SAFETY: MUNGE_OPT_TTL takes an int.
    let e = unsafe { (lib.ctx_set)(ctx.1, MUNGE_OPT_TTL, MUNGE_TTL_MAXIMUM) };
    if e != 0 {
        return Err(err(e));
    }
    if let Some(s) = socket {
        use std::os::unix::ffi::OsStrExt;
        let s = CString::new(s.as_bytes()).map_err(|_| CredentialError::Munge("socket path has a NUL".into()))?;
        // SAFETY: MUNGE_OPT_SOCKET takes a C string, which libmunge copies.
        let e = unsafe { (lib.ctx_set)(ctx.1, MUNGE_OPT_SOCKET, s.as_ptr()) };
        if e != 0 {
            return Err(err(e));
        }
    }
    let mut cred: *mut c_char = std::ptr::null_mut();
    let len = c_int::try_from(body.len()).map_err(|_| CredentialError::Munge("payload too long".into()))?;
    // SAFETY: `body` is `len` bytes; `cred` receives a malloc'd C string on success.
    let e = unsafe { (lib.encode)(&mut cred, ctx.1, body.as_ptr().cast(), len) };
    if e != 0 || cred.is_null() {
        return Err(err(e));
    }
    // SAFETY: a NUL-terminated string libmunge allocated with malloc; freed once, after it is copied.
    let text = unsafe { CStr::from_ptr(cred) }.to_string_lossy().into_owned();
    // SAFETY: as above.
    unsafe { libc::free(cred.cast()) };
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_payload_is_the_one_vigil_imp_checks() {
        // The same text as vigil-imp's request.rs test.
        assert_eq!(
            payload("cluster", b"{}"),
            "vigil-imp-credential 1\ninstance=cluster\njobspec-sha256=\
             44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a\n"
        );
    }

    #[test]
    fn a_missing_munged_is_said() {
        if lib().is_err() {
            eprintln!("skipped: libmunge is not installed");
            return;
        }
        let e = credential("c", b"{}", Some(Path::new("/nonexistent/munge.socket"))).unwrap_err();
        assert!(matches!(&e, CredentialError::Munge(m) if m.contains("ocket")), "{e}");
    }
}
