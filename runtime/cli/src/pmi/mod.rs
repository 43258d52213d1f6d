//! PMI in the broker: the blocking [`Client`] a broker uses to bootstrap an instance under any launcher that
//! serves PMI-1 (the simple wire protocol: MPICH's hydra, Flux, `vigil-shell`) or PMI-2 (Slurm's
//! `srun --mpi=pmi2`, hydra), over the codecs of [`vigil_proto::pmi`] (re-exported here) and
//! [`vigil_proto::pmi2`].
//!
//! Which protocol: `VIGIL_PMI=pmi1|pmi2|auto` (default `auto`). `auto` asks for PMI-2 with the first line (PMI-1
//! `init` with `pmi_version=2`, as the PMI-2 specification says) and takes what the server answers: PMI-2, or
//! PMI-1 when it answers version 1 or refuses version 2 (then it sends `init` again with version 1).
//!
//! The client does blocking I/O on the launcher's inherited socket, once at startup, so it is here and not in the
//! pure codec crates.

use std::io::{BufRead, BufReader, Read, Write};

pub use vigil_proto::pmi::*;
use vigil_proto::pmi2::{Command, HEADER};

/// Errors of the PMI client.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// `PMI_FD`, `PMI_RANK` or `PMI_SIZE` missing or malformed, or `VIGIL_PMI` not one of its values.
    #[error("not started by a PMI launcher: {0}")]
    NoEnv(String),
    /// Socket error.
    #[error("PMI i/o: {0}")]
    Io(#[from] std::io::Error),
    /// The server sent something unexpected or an error code.
    #[error("PMI protocol: {0}")]
    Protocol(String),
}

/// Which wire protocol a [`Client`] speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wire {
    /// PMI-1 simple (`cmd=... k=v\n` lines; Flux RFC 13).
    Pmi1,
    /// PMI-2 (length-framed `cmd=...;k=v;` commands; MPICH's `pmi-2.0.txt`).
    Pmi2,
}

impl std::fmt::Display for Wire {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Wire::Pmi1 => "PMI-1",
            Wire::Pmi2 => "PMI-2",
        })
    }
}

/// A blocking PMI-1 or PMI-2 client over the inherited `PMI_FD` socket.
#[derive(Debug)]
pub struct Client {
    rd: BufReader<std::os::unix::net::UnixStream>,
    wr: std::os::unix::net::UnixStream,
    /// The protocol the launcher agreed to.
    pub wire: Wire,
    /// This process's rank (`PMI_RANK`; under PMI-2, what `fullinit` answered).
    pub rank: u32,
    /// The number of processes (`PMI_SIZE`; under PMI-2, what `fullinit` answered).
    pub size: u32,
    /// The job's KVS name (PMI-1) or job id (PMI-2).
    pub kvsname: String,
}

impl Client {
    /// Take the launcher's socket from `PMI_FD` (and `PMI_RANK`, `PMI_SIZE`, `PMI_JOBID` where set), agree on the
    /// protocol (`VIGIL_PMI`, see the module docs) and initialize: PMI-1 `init` and `get_my_kvsname`, or PMI-2
    /// `fullinit`.
    ///
    /// Errors: [`ClientError::NoEnv`] when the variables are missing or malformed, [`ClientError::Protocol`] when
    /// the launcher refuses or answers out of protocol, [`ClientError::Io`] on the socket.
    pub fn from_env() -> Result<Client, ClientError> {
        let num = |n: &str| -> Result<Option<u32>, ClientError> {
            match std::env::var(n) {
                Err(_) => Ok(None),
                Ok(v) => v.parse().map(Some).map_err(|_| ClientError::NoEnv(format!("{n} is not a number"))),
            }
        };
        let want = match std::env::var("VIGIL_PMI").as_deref() {
            Err(_) | Ok("") | Ok("auto") => None,
            Ok("pmi1") | Ok("simple") => Some(Wire::Pmi1),
            Ok("pmi2") => Some(Wire::Pmi2),
            Ok(other) => {
                return Err(ClientError::NoEnv(format!("VIGIL_PMI={other}: expected pmi1, pmi2 or auto")));
            }
        };
        let fd = num("PMI_FD")?.ok_or_else(|| ClientError::NoEnv("PMI_FD is not set".into()))?;
        let fd = i32::try_from(fd).map_err(|_| ClientError::NoEnv("PMI_FD is not a descriptor".into()))?;
        // PMI-1 needs both; PMI-2 learns them from fullinit (PMI_RANK, where set, names us to the server).
        let (rank, size) = (num("PMI_RANK")?, num("PMI_SIZE")?);
        let jobid = std::env::var("PMI_JOBID").ok();
        // SAFETY: the launcher passed this descriptor for our exclusive use; we take ownership once.
        let s = unsafe { <std::os::unix::net::UnixStream as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        Client::start(s, want, rank, size, jobid)
    }

    /// Initialize over `s` (see [`Client::from_env`]): `want` forces a protocol (`None`: ask for PMI-2, take what
    /// the server answers); `rank`, `size`, `jobid` are what the environment said.
    pub fn start(
        s: std::os::unix::net::UnixStream,
        want: Option<Wire>,
        rank: Option<u32>,
        size: Option<u32>,
        jobid: Option<String>,
    ) -> Result<Client, ClientError> {
        let wr = s.try_clone()?;
        let mut c = Client {
            rd: BufReader::new(s),
            wr,
            wire: Wire::Pmi1,
            rank: rank.unwrap_or(0),
            size: size.unwrap_or(0),
            kvsname: String::new(),
        };
        // Written out, not encoded: servers read `init` by position (Slurm's by the exact text, hydra's by the
        // order of its tokens), and [`Line::encode`] sorts tokens by key.
        let init = |v: &str, sub: &str| format!("cmd=init pmi_version={v} pmi_subversion={sub}\n");
        let mut v1_done = false;
        if want != Some(Wire::Pmi1) {
            let r = c.call_raw(&init("2", "0"), "response_to_init")?;
            match (r.get("rc").unwrap_or("0"), r.get("pmi_version")) {
                ("0", Some("2")) => c.wire = Wire::Pmi2,
                ("0", _) if want.is_none() => v1_done = true,
                (rc, v) if want == Some(Wire::Pmi2) => {
                    return Err(ClientError::Protocol(format!(
                        "VIGIL_PMI=pmi2, but the launcher answered init with rc={rc} pmi_version={}",
                        v.unwrap_or("?")
                    )));
                }
                _ => {}
            }
        }
        match c.wire {
            Wire::Pmi2 => {
                let mut args: Vec<(String, String)> = Vec::new();
                if let Some(j) = &jobid {
                    args.push(("pmijobid".into(), j.clone()));
                }
                if let Some(r) = rank {
                    args.push(("pmirank".into(), r.to_string()));
                }
                args.push(("threaded".into(), "FALSE".into()));
                let a: Vec<(&str, &str)> = args.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                let r = c.call2(&Command::new("fullinit", &a), "fullinit-response")?;
                let field = |k: &str| -> Result<u32, ClientError> {
                    r.get(k)
                        .and_then(|v| v.parse().ok())
                        .ok_or_else(|| ClientError::Protocol(format!("fullinit-response without a numeric '{k}'")))
                };
                c.rank = field("rank")?;
                c.size = field("size")?;
                if c.rank >= c.size {
                    return Err(ClientError::Protocol(format!(
                        "fullinit-response: rank {} of size {}",
                        c.rank, c.size
                    )));
                }
                c.kvsname = match jobid {
                    Some(j) => j,
                    None => {
                        let r = c.call2(&Command::new("job-getid", &[]), "job-getid-response")?;
                        r.get("jobid").unwrap_or("").to_string()
                    }
                };
            }
            Wire::Pmi1 => {
                for (n, v) in [("PMI_RANK", rank), ("PMI_SIZE", size)] {
                    if v.is_none() {
                        return Err(ClientError::NoEnv(format!("{n} is not set")));
                    }
                }
                if !v1_done {
                    let r = c.call_raw(&init("1", "1"), "response_to_init")?;
                    c.check(&r)?;
                }
                let r = c.call(&Line::new("get_my_kvsname", &[]), "my_kvsname")?;
                c.check(&r)?;
                c.kvsname = r.get("kvsname").unwrap_or("").to_string();
            }
        }
        Ok(c)
    }

    /// One PMI-2 exchange: send `cmd`, read the answer, which must be `expect` with `rc=0`.
    fn call2(&mut self, cmd: &Command, expect: &str) -> Result<Command, ClientError> {
        let wire = cmd.encode().map_err(|e| ClientError::Protocol(e.to_string()))?;
        self.wr.write_all(&wire)?;
        let mut h = [0u8; HEADER];
        self.rd.read_exact(&mut h).map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => ClientError::Protocol("server closed the connection".into()),
            _ => ClientError::Io(e),
        })?;
        let n = Command::body_len(&h).map_err(|e| ClientError::Protocol(e.to_string()))?;
        let mut body = vec![0u8; n];
        self.rd.read_exact(&mut body)?;
        let r = Command::parse(&body).map_err(|e| ClientError::Protocol(e.to_string()))?;
        if r.cmd != expect {
            return Err(ClientError::Protocol(format!("expected {expect}, got {}", r.cmd)));
        }
        match r.get("rc") {
            Some("0") | None => Ok(r),
            Some(rc) => Err(ClientError::Protocol(format!(
                "{} failed with rc={rc} {}",
                cmd.cmd,
                r.get("errmsg").or(r.get("msg")).unwrap_or("")
            ))),
        }
    }

    fn call(&mut self, l: &Line, expect: &str) -> Result<Line, ClientError> {
        self.call_raw(&l.encode(), expect)
    }

    /// One PMI-1 exchange: send `line` as it is, read the answer, which must be `expect`.
    fn call_raw(&mut self, line: &str, expect: &str) -> Result<Line, ClientError> {
        self.wr.write_all(line.as_bytes())?;
        let mut buf = Vec::new();
        self.rd.read_until(b'\n', &mut buf)?;
        if buf.is_empty() {
            return Err(ClientError::Protocol("server closed the connection".into()));
        }
        let r = Line::parse(&buf).map_err(|e| ClientError::Protocol(e.to_string()))?;
        if r.cmd != expect {
            return Err(ClientError::Protocol(format!("expected {expect}, got {}", r.cmd)));
        }
        Ok(r)
    }

    fn check(&self, r: &Line) -> Result<(), ClientError> {
        match r.get("rc") {
            Some("0") | None => Ok(()),
            Some(rc) => {
                Err(ClientError::Protocol(format!("{} failed with rc={rc} {}", r.cmd, r.get("msg").unwrap_or(""))))
            }
        }
    }

    /// Put `key=value` in the job's KVS (visible to others after the next barrier).
    pub fn put(&mut self, key: &str, value: &str) -> Result<(), ClientError> {
        if self.wire == Wire::Pmi2 {
            return self
                .call2(&Command::new("kvs-put", &[("key", key), ("value", value)]), "kvs-put-response")
                .map(drop);
        }
        let kvs = self.kvsname.clone();
        let r = self.call(&Line::new("put", &[("kvsname", &kvs), ("key", key), ("value", value)]), "put_result")?;
        self.check(&r)
    }

    /// Get `key` from the job's KVS; `Ok(None)` if it does not exist.
    pub fn get(&mut self, key: &str) -> Result<Option<String>, ClientError> {
        if self.wire == Wire::Pmi2 {
            let r = self.call2(&Command::new("kvs-get", &[("srcid", "-1"), ("key", key)]), "kvs-get-response")?;
            let found = r.get("found").is_some_and(|f| f.eq_ignore_ascii_case("true"));
            return Ok(found.then(|| r.get("value").unwrap_or("").to_string()));
        }
        let kvs = self.kvsname.clone();
        let r = self.call(&Line::new("get", &[("kvsname", &kvs), ("key", key)]), "get_result")?;
        Ok(if r.get("rc") == Some("0") { Some(r.get("value").unwrap_or("").to_string()) } else { None })
    }

    /// Enter the job-wide barrier and wait for everyone (PMI-2: `kvs-fence`).
    pub fn barrier(&mut self) -> Result<(), ClientError> {
        if self.wire == Wire::Pmi2 {
            return self.call2(&Command::new("kvs-fence", &[]), "kvs-fence-response").map(drop);
        }
        let r = self.call(&Line::new("barrier_in", &[]), "barrier_out")?;
        self.check(&r)
    }

    /// Say goodbye (`finalize`).
    pub fn finalize(&mut self) -> Result<(), ClientError> {
        if self.wire == Wire::Pmi2 {
            return self.call2(&Command::new("finalize", &[]), "finalize-response").map(drop);
        }
        let r = self.call(&Line::new("finalize", &[]), "finalize_ack")?;
        self.check(&r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::os::unix::net::UnixStream;

    /// A launcher's PMI server on the other end of a socket pair: `v2` whether it speaks PMI-2, `init_v1` what it
    /// answers to `init pmi_version=2` when it does not (`true`: version 1, Flux's way; `false`: an error, as
    /// `vigil-shell` does). Serves one client of rank 1 of 2 until it finalizes; returns the commands it saw.
    fn server(s: UnixStream, v2: bool, init_v1: bool) -> std::thread::JoinHandle<Vec<String>> {
        std::thread::spawn(move || {
            let mut wr = s.try_clone().unwrap();
            let mut rd = BufReader::new(s);
            let mut kvs = BTreeMap::from([("peer".to_string(), "10.0.0.1:99".to_string())]);
            let mut seen = Vec::new();
            let mut pmi2 = false;
            loop {
                if pmi2 {
                    let mut h = [0u8; HEADER];
                    if rd.read_exact(&mut h).is_err() {
                        return seen;
                    }
                    let mut b = vec![0u8; Command::body_len(&h).unwrap()];
                    rd.read_exact(&mut b).unwrap();
                    let c = Command::parse(&b).unwrap();
                    seen.push(c.cmd.clone());
                    let r = match c.cmd.as_str() {
                        "fullinit" => {
                            assert_eq!((c.get("pmirank"), c.get("pmijobid")), (Some("1"), Some("7.0")));
                            Command::new("fullinit-response", &[("rc", "0"), ("rank", "1"), ("size", "2")])
                        }
                        "kvs-put" => {
                            kvs.insert(c.get("key").unwrap().into(), c.get("value").unwrap().into());
                            Command::new("kvs-put-response", &[("rc", "0")])
                        }
                        "kvs-fence" => Command::new("kvs-fence-response", &[("rc", "0")]),
                        "kvs-get" => match kvs.get(c.get("key").unwrap()) {
                            Some(v) => {
                                Command::new("kvs-get-response", &[("rc", "0"), ("found", "TRUE"), ("value", v)])
                            }
                            None => Command::new("kvs-get-response", &[("rc", "0"), ("found", "FALSE")]),
                        },
                        "finalize" => Command::new("finalize-response", &[("rc", "0")]),
                        _ => Command::new("error", &[("rc", "-1")]),
                    };
                    wr.write_all(&r.encode().unwrap()).unwrap();
                    if c.cmd == "finalize" {
                        return seen;
                    }
                    continue;
                }
                let mut line = Vec::new();
                if rd.read_until(b'\n', &mut line).unwrap_or(0) == 0 {
                    return seen;
                }
                let l = Line::parse(&line).unwrap();
                // Slurm takes init only as written by MPICH: version first.
                if l.cmd == "init" {
                    let text = String::from_utf8_lossy(&line);
                    assert!(text.starts_with("cmd=init pmi_version=") && text.contains(" pmi_subversion="), "{text}");
                }
                seen.push(format!("{}{}", l.cmd, l.get("pmi_version").map(|v| format!(" v{v}")).unwrap_or_default()));
                let r = match (l.cmd.as_str(), l.get("pmi_version")) {
                    ("init", Some("2")) if v2 => {
                        pmi2 = true;
                        Line::new("response_to_init", &[("rc", "0"), ("pmi_version", "2"), ("pmi_subversion", "0")])
                    }
                    ("init", Some("2")) if init_v1 => {
                        Line::new("response_to_init", &[("rc", "0"), ("pmi_version", "1"), ("pmi_subversion", "1")])
                    }
                    ("init", Some("2")) => {
                        Line::new("response_to_init", &[("rc", "-1"), ("msg", "unsupported_version")])
                    }
                    ("init", _) => Line::new("response_to_init", &[("rc", "0"), ("pmi_version", "1")]),
                    ("get_my_kvsname", _) => Line::new("my_kvsname", &[("rc", "0"), ("kvsname", "kvs_7")]),
                    ("put", _) => {
                        kvs.insert(l.get("key").unwrap().into(), l.get("value").unwrap().into());
                        Line::new("put_result", &[("rc", "0")])
                    }
                    ("barrier_in", _) => Line::new("barrier_out", &[("rc", "0")]),
                    ("get", _) => match kvs.get(l.get("key").unwrap()) {
                        Some(v) => Line::new("get_result", &[("rc", "0"), ("value", v)]),
                        None => Line::new("get_result", &[("rc", "-1")]),
                    },
                    ("finalize", _) => Line::new("finalize_ack", &[("rc", "0")]),
                    _ => Line::new("error", &[("rc", "-1")]),
                };
                wr.write_all(r.encode().as_bytes()).unwrap();
                if l.cmd == "finalize" {
                    return seen;
                }
            }
        })
    }

    /// Put, barrier, get a known and an unknown key, finalize: what the bootstrap does.
    fn exchange(c: &mut Client) {
        c.put("vigil.ep.1", "10.0.0.2:4711").unwrap();
        c.barrier().unwrap();
        assert_eq!(c.get("peer").unwrap().as_deref(), Some("10.0.0.1:99"));
        assert_eq!(c.get("vigil.ep.1").unwrap().as_deref(), Some("10.0.0.2:4711"));
        assert_eq!(c.get("nosuch").unwrap(), None);
        c.finalize().unwrap();
    }

    #[test]
    fn auto_speaks_pmi2_to_a_server_that_does() {
        let (a, b) = UnixStream::pair().unwrap();
        let srv = server(b, true, false);
        let mut c = Client::start(a, None, Some(1), None, Some("7.0".into())).unwrap();
        assert_eq!((c.wire, c.rank, c.size, c.kvsname.as_str()), (Wire::Pmi2, 1, 2, "7.0"));
        exchange(&mut c);
        let seen = srv.join().unwrap();
        assert_eq!(seen[..2], ["init v2", "fullinit"]);
        assert!(seen.contains(&"kvs-fence".to_string()), "{seen:?}");
    }

    #[test]
    fn auto_falls_back_to_pmi1_when_version_2_is_refused_or_answered_with_1() {
        for init_v1 in [false, true] {
            let (a, b) = UnixStream::pair().unwrap();
            let srv = server(b, false, init_v1);
            let mut c = Client::start(a, None, Some(1), Some(2), None).unwrap();
            assert_eq!((c.wire, c.rank, c.size, c.kvsname.as_str()), (Wire::Pmi1, 1, 2, "kvs_7"));
            exchange(&mut c);
            let seen = srv.join().unwrap();
            // Refused: init again with version 1; answered with version 1: initialized already.
            let want: &[&str] =
                if init_v1 { &["init v2", "get_my_kvsname"] } else { &["init v2", "init v1", "get_my_kvsname"] };
            assert_eq!(&seen[..want.len()], want, "init_v1={init_v1}");
        }
    }

    #[test]
    fn a_forced_protocol_is_kept_or_refused_clearly() {
        // pmi1: no version-2 question at all.
        let (a, b) = UnixStream::pair().unwrap();
        let srv = server(b, true, false);
        let mut c = Client::start(a, Some(Wire::Pmi1), Some(1), Some(2), None).unwrap();
        assert_eq!(c.wire, Wire::Pmi1);
        exchange(&mut c);
        assert_eq!(srv.join().unwrap()[0], "init v1");
        // pmi2 to a server without it: an error saying so.
        let (a, b) = UnixStream::pair().unwrap();
        let _srv = server(b, false, false);
        let e = Client::start(a, Some(Wire::Pmi2), Some(1), Some(2), None).expect_err("refused");
        assert!(e.to_string().contains("VIGIL_PMI=pmi2"), "{e}");
        // PMI-1 without PMI_SIZE: named.
        let (a, b) = UnixStream::pair().unwrap();
        let _srv = server(b, false, false);
        let e = Client::start(a, None, Some(1), None, None).expect_err("refused");
        assert!(e.to_string().contains("PMI_SIZE is not set"), "{e}");
    }

    #[test]
    fn a_server_that_hangs_up_or_answers_junk_is_an_error_not_a_panic() {
        let (a, b) = UnixStream::pair().unwrap();
        drop(b);
        assert!(Client::start(a, None, Some(0), Some(1), None).is_err());
        let (a, mut b) = UnixStream::pair().unwrap();
        let t = std::thread::spawn(move || {
            let mut buf = [0u8; 256];
            let _ = b.read(&mut buf);
            b.write_all(b"cmd=response_to_init rc=0 pmi_version=2\n").unwrap();
            let _ = b.read(&mut buf);
            b.write_all(b"zzzzzzcmd=x").unwrap();
        });
        let e = Client::start(a, None, Some(0), Some(1), None).expect_err("junk");
        assert!(e.to_string().contains("PMI protocol"), "{e}");
        t.join().unwrap();
    }
}
