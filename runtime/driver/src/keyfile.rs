//! The overlay key: the 32-byte secret every broker of an instance holds, which authenticates and encrypts its
//! overlay links (see `broker::secure` and docs/wire-format.md, "Link security").
//!
//! A system instance reads it from the file named by `overlay_key` in its TOML bootstrap; `vigil keygen FILE`
//! writes one. `vigil start` and batch/alloc instances make a fresh key at start-up and never write it anywhere
//! others can read (a 0600 file in the run directory of a test instance; the PMI KVS of a nested one).
//!
//! File format (TOML, one key):
//! ```toml
//! # Vigil overlay key (vigil keygen): secret, mode 0600, the same file on every node of the instance.
//! overlay_key = "<64 hexadecimal digits>"
//! ```
//! A key file is refused (naming the file) when it is missing, not a regular file, readable or writable by group
//! or others, owned by another user than the broker's, or malformed.

use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

// The key as a value (bytes, hex form, never printed) is plain data the sans-IO broker's options hold: it lives in
// `vigil-proto`; making, reading and writing keys (this file) is I/O.
pub use vigil_proto::key::{OverlayKey, KEY_LEN};

/// Why a key could not be made, read or written. Every variant names the file it is about.
#[derive(Debug, thiserror::Error)]
pub enum KeyFileError {
    /// The random source failed.
    #[error("cannot make an overlay key: /dev/urandom: {0}")]
    Random(std::io::Error),
    /// The file could not be opened or read.
    #[error("overlay key file {path}: {err}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The system's error.
        err: std::io::Error,
    },
    /// The file is not a regular file.
    #[error("overlay key file {0}: not a regular file")]
    NotAFile(PathBuf),
    /// Group or others may read or write the file.
    #[error("overlay key file {path}: mode {mode:04o} lets group or others read or write it; run chmod 600 {path}")]
    Permissions {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// Someone else owns the file.
    #[error("overlay key file {path}: owned by uid {owner}, not by this broker's uid {uid}")]
    Owner {
        /// The file.
        path: PathBuf,
        /// Its owner.
        owner: u32,
        /// The broker's effective uid.
        uid: u32,
    },
    /// The contents are not a key file.
    #[error("overlay key file {path}: {why} (make a new one with: vigil keygen FILE)")]
    Malformed {
        /// The file.
        path: PathBuf,
        /// What is wrong, without any of the file's contents.
        why: String,
    },
    /// The file exists and overwriting it was not asked for.
    #[error("overlay key file {0} exists; remove it first or pass --force (every node needs the new key then)")]
    Exists(PathBuf),
    /// The file could not be written.
    #[error("cannot write overlay key file {path}: {err}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The system's error.
        err: std::io::Error,
    },
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyFileToml {
    overlay_key: String,
}

/// Making, reading and writing overlay keys: `OverlayKey::generate()`, `OverlayKey::load(path)` and
/// `key.write(path, force)` with this trait in scope.
pub trait KeyFile: Sized {
    /// A fresh random key from `/dev/urandom`.
    fn generate() -> Result<Self, KeyFileError>;
    /// Read a key file, refusing one that is missing, not a regular file, open to group or others, owned by
    /// another user than the effective uid, or malformed (see the module doc).
    fn load(path: &Path) -> Result<Self, KeyFileError>;
    /// Write this key to `path` as a key file, mode 0600 (created so: never readable by others, even briefly).
    /// An existing file is refused unless `force`; with `force` it is replaced.
    fn write(&self, path: &Path, force: bool) -> Result<(), KeyFileError>;
}

impl KeyFile for OverlayKey {
    fn generate() -> Result<OverlayKey, KeyFileError> {
        let mut k = [0u8; KEY_LEN];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut k))
            .map_err(KeyFileError::Random)?;
        Ok(OverlayKey::from_bytes(k))
    }

    fn load(path: &Path) -> Result<OverlayKey, KeyFileError> {
        let read = |err| KeyFileError::Read { path: path.to_path_buf(), err };
        // O_NOFOLLOW is not used: sites link /etc/vigil/overlay.key to a managed location; the checks below
        // apply to the file the link reaches.
        // Non-blocking: a FIFO (or a device) named by mistake must not hang the broker before the check below.
        let f = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path).map_err(read)?;
        let md = f.metadata().map_err(read)?;
        if !md.is_file() {
            return Err(KeyFileError::NotAFile(path.to_path_buf()));
        }
        let mode = md.mode() & 0o7777;
        if mode & 0o077 != 0 {
            return Err(KeyFileError::Permissions { path: path.to_path_buf(), mode });
        }
        let uid = nix::unistd::geteuid().as_raw();
        if md.uid() != uid {
            return Err(KeyFileError::Owner { path: path.to_path_buf(), owner: md.uid(), uid });
        }
        if md.len() > 4096 {
            return Err(KeyFileError::Malformed { path: path.to_path_buf(), why: "larger than a key file".into() });
        }
        let mut text = String::new();
        std::io::Read::read_to_string(&mut &f, &mut text).map_err(read)?;
        let malformed = |why: String| KeyFileError::Malformed { path: path.to_path_buf(), why };
        // The TOML error would quote the offending line, which may be the key: say only where it is.
        let t: KeyFileToml = toml::from_str(&text).map_err(|e| {
            malformed(match e.span() {
                Some(s) => format!("not a key file (TOML error at byte {})", s.start),
                None => "not a key file".into(),
            })
        })?;
        OverlayKey::from_hex(&t.overlay_key).map_err(malformed)
    }

    fn write(&self, path: &Path, force: bool) -> Result<(), KeyFileError> {
        use std::io::Write as _;
        let text = format!(
            "# Vigil overlay key (vigil keygen). Secret: mode 0600, owned by the instance owner, the same file on\n\
             # every node of the instance, named by overlay_key in the [bootstrap] table.\n\
             overlay_key = \"{}\"\n",
            self.to_hex()
        );
        let werr = |err| KeyFileError::Write { path: path.to_path_buf(), err };
        if force {
            match std::fs::remove_file(path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(werr(e)),
            }
        }
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path).map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                KeyFileError::Exists(path.to_path_buf())
            } else {
                werr(e)
            }
        })?;
        f.write_all(text.as_bytes()).and_then(|_| f.sync_all()).map_err(werr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_written_key_reads_back_and_is_mode_0600() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("k");
        let k = OverlayKey::generate().unwrap();
        k.write(&p, false).unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(OverlayKey::load(&p).unwrap(), k);
        // Not overwritten without --force; replaced with it.
        assert!(matches!(OverlayKey::generate().unwrap().write(&p, false), Err(KeyFileError::Exists(_))));
        let k2 = OverlayKey::generate().unwrap();
        k2.write(&p, true).unwrap();
        assert_eq!(OverlayKey::load(&p).unwrap(), k2);
        assert_ne!(k, k2);
    }

    #[test]
    fn group_readable_missing_and_malformed_files_are_refused_naming_the_file() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("k");
        let e = OverlayKey::load(&p).unwrap_err().to_string();
        assert!(e.contains(&p.display().to_string()) && e.contains("No such file"), "{e}");

        OverlayKey::generate().unwrap().write(&p, false).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o640)).unwrap();
        let e = OverlayKey::load(&p).unwrap_err().to_string();
        assert!(e.contains(&p.display().to_string()) && e.contains("0640") && e.contains("chmod 600"), "{e}");

        for bad in ["overlay_key = \"abcd\"\n", "overlay_key = \"zz", "key = \"00\"\n", ""] {
            std::fs::write(&p, bad).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
            let e = OverlayKey::load(&p).unwrap_err();
            assert!(matches!(e, KeyFileError::Malformed { .. }), "{bad:?}: {e}");
            assert!(e.to_string().contains(&p.display().to_string()), "{e}");
        }
        assert!(matches!(OverlayKey::load(d.path()), Err(KeyFileError::NotAFile(_))));
        // A FIFO is refused at once, not read (which would block until a writer came).
        let fifo = d.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        assert!(matches!(OverlayKey::load(&fifo), Err(KeyFileError::NotAFile(_))));
        // All zeros is a placeholder.
        std::fs::write(&p, format!("overlay_key = \"{}\"\n", "0".repeat(64))).unwrap();
        let e = OverlayKey::load(&p).unwrap_err().to_string();
        assert!(e.contains("placeholder"), "{e}");
    }

    #[test]
    fn errors_and_debug_never_show_the_key() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("k");
        let k = OverlayKey::generate().unwrap();
        let hex = k.to_hex();
        // A key with one digit too many: the error must not quote it.
        std::fs::write(&p, format!("overlay_key = \"{hex}0\"\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        let e = OverlayKey::load(&p).unwrap_err().to_string();
        assert!(!e.contains(&hex[..16]), "{e}");
        // A TOML error on the key's own line must not quote it either.
        std::fs::write(&p, format!("overlay_key = {hex}\n")).unwrap();
        let e = OverlayKey::load(&p).unwrap_err().to_string();
        assert!(!e.contains(&hex[..16]), "{e}");
        assert!(!format!("{k:?}").contains(&hex[..8]));
        assert_eq!(OverlayKey::from_hex(&hex).unwrap(), k);
    }
}
