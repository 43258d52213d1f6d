//! The request on standard input (crate docs, "Invocation") and the credential's payload ("The credential").

use crate::munge::Decoded;
#[cfg(test)]
use crate::munge::Status;
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::PathBuf;

/// The most bytes the header (up to and with its empty line) may take: 64 KiB.
pub(crate) const MAX_HEADER: usize = 64 << 10;
/// The most bytes a jobspec may take: 64 MiB.
pub(crate) const MAX_JOBSPEC: usize = 64 << 20;

/// The first line of a request.
const MAGIC: &str = "vigil-imp 1";
/// The first line of a credential's payload.
const PAYLOAD_MAGIC: &str = "vigil-imp-credential 1";

/// A request, read.
#[derive(Debug)]
pub(crate) struct Request {
    /// The job's user.
    pub(crate) uid: u32,
    /// The job's cgroup directory, if the shell is to join one.
    pub(crate) cgroup: Option<PathBuf>,
    /// The munge credential, as text.
    pub(crate) credential: String,
    /// The jobspec's bytes.
    pub(crate) jobspec: Vec<u8>,
}

/// Read one byte at a time to the end of the header: nothing past it is taken from the stream (it is the shell's).
fn read_header(r: &mut impl Read) -> Result<String, String> {
    let mut h = Vec::new();
    let mut b = [0u8];
    while !h.ends_with(b"\n\n") {
        if h.len() >= MAX_HEADER {
            return Err(format!("refused: the request's header is longer than {MAX_HEADER} bytes"));
        }
        match r.read(&mut b) {
            Ok(0) => return Err("refused: standard input ended inside the request's header".into()),
            Ok(_) => {
                h.push(b[0]);
                // Not a request at all: said at once, without waiting for an end that may never come.
                if b[0] == b'\n'
                    && h.iter().filter(|c| **c == b'\n').count() == 1
                    && h != format!("{MAGIC}\n").as_bytes()
                {
                    return Err(format!("refused: the request does not start with '{MAGIC}'"));
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("refused: reading the request: {e}")),
        }
    }
    String::from_utf8(h).map_err(|_| "refused: the request's header is not UTF-8".to_string())
}

impl Request {
    /// Read a request from `r` (standard input), taking exactly its bytes.
    ///
    /// # Errors
    /// A malformed request: the message names the line or key.
    pub(crate) fn read(r: &mut impl Read) -> Result<Request, String> {
        let text = read_header(r)?;
        let mut lines = text.lines();
        if lines.next() != Some(MAGIC) {
            return Err(format!("refused: the request does not start with '{MAGIC}'"));
        }
        let (mut uid, mut cgroup, mut credential, mut len) = (None, None, None, None);
        for line in lines.filter(|l| !l.is_empty()) {
            let Some((k, v)) = line.split_once('=') else {
                return Err(format!("refused: request line '{line}' is not key=value"));
            };
            let dup =
                match k {
                    "uid" => uid
                        .replace(v.parse::<u32>().map_err(|_| format!("refused: uid: '{v}' is not a uid"))?)
                        .is_some(),
                    "cgroup" => cgroup.replace(PathBuf::from(v)).is_some(),
                    "credential" => credential.replace(v.to_string()).is_some(),
                    "jobspec-bytes" => len
                        .replace(v.parse::<usize>().ok().filter(|n| *n <= MAX_JOBSPEC).ok_or_else(|| {
                            format!("refused: jobspec-bytes: '{v}' is not a length up to {MAX_JOBSPEC}")
                        })?)
                        .is_some(),
                    _ => return Err(format!("refused: unknown request key '{k}'")),
                };
            if dup {
                return Err(format!("refused: request key '{k}' given twice"));
            }
        }
        let missing = |k: &str| format!("refused: the request has no '{k}'");
        let uid = uid.ok_or_else(|| missing("uid"))?;
        let credential = credential.ok_or_else(|| missing("credential"))?;
        let len = len.ok_or_else(|| missing("jobspec-bytes"))?;
        let mut jobspec = vec![0u8; len];
        r.read_exact(&mut jobspec)
            .map_err(|e| format!("refused: reading the jobspec's {len} bytes from the request: {e}"))?;
        Ok(Request { uid, cgroup, credential, jobspec })
    }
}

/// The lowercase hex SHA-256 of `bytes`.
pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// Check a decoded credential against the request: made by `uid`, for `instance`, over the jobspec whose
/// SHA-256 is `sha`.
///
/// # Errors
/// What does not match, named.
pub(crate) fn check_credential(d: &Decoded, uid: u32, instance: &str, sha: &str) -> Result<(), String> {
    if d.uid != uid {
        return Err(format!("it was made by uid {}, but the job's user is uid {uid}", d.uid));
    }
    let text = std::str::from_utf8(&d.payload).map_err(|_| "its payload is not UTF-8".to_string())?;
    let mut lines = text.lines();
    if lines.next() != Some(PAYLOAD_MAGIC) {
        return Err(format!("its payload does not start with '{PAYLOAD_MAGIC}'"));
    }
    let (mut inst, mut hash) = (None, None);
    for line in lines {
        match line.split_once('=') {
            Some(("instance", v)) if inst.is_none() => inst = Some(v),
            Some(("jobspec-sha256", v)) if hash.is_none() => hash = Some(v),
            _ => return Err(format!("its payload has an unexpected line '{line}'")),
        }
    }
    match inst {
        Some(i) if i == instance => {}
        Some(i) => return Err(format!("it is for instance '{i}', not '{instance}'")),
        None => return Err("its payload names no instance".into()),
    }
    match hash {
        Some(h) if h == sha => Ok(()),
        Some(_) => Err("it covers another jobspec than the one given (their SHA-256 differ)".into()),
        None => Err("its payload has no jobspec-sha256".into()),
    }
}

/// The age rule (crate docs, "Credentials that wait"): a credential munged verified is good for
/// `max_age` seconds from its making, `now` (seconds since the Unix epoch): past munge's TTL, or decoded before
/// on this node, it is still good within that age.
///
/// # Errors
/// It is older than `max_age`: its age, the limit, and munge's word on it.
pub(crate) fn check_age(d: &Decoded, now: i64, max_age: u64) -> Result<(), String> {
    // A clock behind the encoding node's by less than munge's allowed skew: age 0.
    let age = now.saturating_sub(d.encoded_at).max(0) as u64;
    if age > max_age {
        return Err(format!(
            "it was made {age} s ago, more than credential-max-age ({max_age} s) allows ({}): submit the job again",
            d.status.name()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(header: &str, jobspec: &str, rest: &str) -> (Result<Request, String>, Vec<u8>) {
        let data = format!("{header}\n{jobspec}{rest}").into_bytes();
        let mut r = std::io::Cursor::new(data);
        let q = Request::read(&mut r);
        let mut left = Vec::new();
        r.read_to_end(&mut left).unwrap();
        (q, left)
    }

    #[test]
    fn a_request_takes_its_own_bytes_and_leaves_the_shells() {
        let h = "vigil-imp 1\nuid=1001\ncgroup=/sys/fs/cgroup/v/job\ncredential=MUNGE:abc:\njobspec-bytes=4\n";
        let (q, left) = request(h, "{\"a\"", "{\"shell input\":1}\n");
        let q = q.expect("good");
        assert_eq!((q.uid, q.credential.as_str(), q.jobspec.as_slice()), (1001, "MUNGE:abc:", &b"{\"a\""[..]));
        assert_eq!(q.cgroup.as_deref(), Some(std::path::Path::new("/sys/fs/cgroup/v/job")));
        assert_eq!(left, b"{\"shell input\":1}\n");
    }

    #[test]
    fn malformed_requests_name_what_is_wrong() {
        let cases = [
            ("vigil-imp 2\nuid=1\ncredential=x\njobspec-bytes=0\n", "start with 'vigil-imp 1'"),
            ("vigil-imp 1\nuid=x\ncredential=x\njobspec-bytes=0\n", "uid: 'x' is not a uid"),
            ("vigil-imp 1\nuid=1\nuid=2\ncredential=x\njobspec-bytes=0\n", "'uid' given twice"),
            ("vigil-imp 1\nuid=1\ncredential=x\njobspec-bytes=0\ncolour=red\n", "unknown request key 'colour'"),
            ("vigil-imp 1\nuid=1\njobspec-bytes=0\n", "no 'credential'"),
            ("vigil-imp 1\nuid=1\ncredential=x\njobspec-bytes=99999999999\n", "jobspec-bytes"),
            ("vigil-imp 1\nuid=1\ncredential=x\njobspec-bytes=10\n", "reading the jobspec's 10 bytes"),
        ];
        for (h, want) in cases {
            let e = request(h, "", "").0.expect_err(h);
            assert!(e.contains(want), "{h:?}: {e}");
        }
        let e = Request::read(&mut std::io::Cursor::new(b"vigil-imp 1\nuid=1".to_vec())).unwrap_err();
        assert!(e.contains("ended inside the request's header"), "{e}");
    }

    #[test]
    fn the_payload_binds_user_instance_and_jobspec() {
        let sha = sha256_hex(b"{}");
        assert_eq!(sha, "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a");
        // The client crate's munge module writes exactly this (its test has the same text).
        let payload = format!("vigil-imp-credential 1\ninstance=cluster\njobspec-sha256={sha}\n");
        let d = Decoded { uid: 1001, payload: payload.into_bytes(), encoded_at: 1, status: Status::Fresh };
        assert!(check_credential(&d, 1001, "cluster", &sha).is_ok());
        let e = check_credential(&d, 1002, "cluster", &sha).unwrap_err();
        assert!(e.contains("made by uid 1001, but the job's user is uid 1002"), "{e}");
        let e = check_credential(&d, 1001, "other", &sha).unwrap_err();
        assert!(e.contains("for instance 'cluster', not 'other'"), "{e}");
        let e = check_credential(&d, 1001, "cluster", &sha256_hex(b"[]")).unwrap_err();
        assert!(e.contains("another jobspec"), "{e}");
        let d = Decoded { uid: 1001, payload: b"hello".to_vec(), encoded_at: 1, status: Status::Fresh };
        assert!(check_credential(&d, 1001, "cluster", &sha).unwrap_err().contains("does not start with"));
    }

    #[test]
    fn a_credential_past_its_ttl_or_replayed_is_good_within_the_max_age_only() {
        let made = 1_000_000;
        let d = |status| Decoded { uid: 1, payload: Vec::new(), encoded_at: made, status };
        // A job that waited in the queue past munge's TTL (300 s), or was requeued on the same node: good.
        for s in [Status::Fresh, Status::Expired, Status::Replayed] {
            assert_eq!(check_age(&d(s), made + 3600, 7200), Ok(()), "{s:?}");
            assert_eq!(check_age(&d(s), made + 7200, 7200), Ok(()), "{s:?}: at the limit");
        }
        // A clock a little behind the encoding node's.
        assert_eq!(check_age(&d(Status::Fresh), made - 2, 10), Ok(()));
        // Past the max age: refused, saying how old, the limit, and munge's word.
        let e = check_age(&d(Status::Expired), made + 7201, 7200).unwrap_err();
        assert!(e.contains("made 7201 s ago, more than credential-max-age (7200 s)"), "{e}");
        assert!(e.contains("EMUNGE_CRED_EXPIRED"), "{e}");
        let e = check_age(&d(Status::Replayed), made + 11, 10).unwrap_err();
        assert!(e.contains("EMUNGE_CRED_REPLAYED"), "{e}");
    }
}
