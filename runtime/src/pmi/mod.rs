//! PMI-1 in the broker: the line codec ([`vigil_proto::pmi`], re-exported here) and a blocking [`Client`], what
//! a broker uses to bootstrap a nested instance under any PMI-1 launcher (`vigil-shell` is one).
//!
//! The client does blocking I/O on the launcher's inherited socket, once at startup, so it is here and not in the
//! pure codec crate.

use std::io::{BufRead, BufReader, Write};

pub use vigil_proto::pmi::*;

/// Errors of the PMI client.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// `PMI_FD`, `PMI_RANK` or `PMI_SIZE` missing or malformed.
    #[error("not started by a PMI-1 launcher: {0}")]
    NoEnv(String),
    /// Socket error.
    #[error("PMI i/o: {0}")]
    Io(#[from] std::io::Error),
    /// The server sent something unexpected or an error code.
    #[error("PMI protocol: {0}")]
    Protocol(String),
}

/// A blocking PMI-1 client over the inherited `PMI_FD` socket.
pub struct Client {
    rd: BufReader<std::os::unix::net::UnixStream>,
    wr: std::os::unix::net::UnixStream,
    /// `PMI_RANK`.
    pub rank: u32,
    /// `PMI_SIZE`.
    pub size: u32,
    /// The job's KVS name.
    pub kvsname: String,
}

impl Client {
    /// Take the launcher's socket from `PMI_FD`, `PMI_RANK`, `PMI_SIZE` and run `init`, `get_my_kvsname`.
    pub fn from_env() -> Result<Client, ClientError> {
        let var = |n: &str| std::env::var(n).map_err(|_| ClientError::NoEnv(format!("{n} is not set")));
        let fd: i32 = var("PMI_FD")?.parse().map_err(|_| ClientError::NoEnv("PMI_FD is not a number".into()))?;
        let rank: u32 = var("PMI_RANK")?.parse().map_err(|_| ClientError::NoEnv("PMI_RANK is not a number".into()))?;
        let size: u32 = var("PMI_SIZE")?.parse().map_err(|_| ClientError::NoEnv("PMI_SIZE is not a number".into()))?;
        // SAFETY: the launcher passed this descriptor for our exclusive use; we take ownership once.
        let s = unsafe { <std::os::unix::net::UnixStream as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        let wr = s.try_clone()?;
        let mut c = Client { rd: BufReader::new(s), wr, rank, size, kvsname: String::new() };
        let r = c.call(&Line::new("init", &[("pmi_version", "1"), ("pmi_subversion", "1")]), "response_to_init")?;
        c.check(&r)?;
        let r = c.call(&Line::new("get_my_kvsname", &[]), "my_kvsname")?;
        c.check(&r)?;
        c.kvsname = r.get("kvsname").unwrap_or("").to_string();
        Ok(c)
    }

    fn call(&mut self, l: &Line, expect: &str) -> Result<Line, ClientError> {
        self.wr.write_all(l.encode().as_bytes())?;
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
        let kvs = self.kvsname.clone();
        let r = self.call(&Line::new("put", &[("kvsname", &kvs), ("key", key), ("value", value)]), "put_result")?;
        self.check(&r)
    }

    /// Get `key` from the job's KVS; `Ok(None)` if it does not exist.
    pub fn get(&mut self, key: &str) -> Result<Option<String>, ClientError> {
        let kvs = self.kvsname.clone();
        let r = self.call(&Line::new("get", &[("kvsname", &kvs), ("key", key)]), "get_result")?;
        Ok(if r.get("rc") == Some("0") { Some(r.get("value").unwrap_or("").to_string()) } else { None })
    }

    /// Enter the job-wide barrier and wait for everyone.
    pub fn barrier(&mut self) -> Result<(), ClientError> {
        let r = self.call(&Line::new("barrier_in", &[]), "barrier_out")?;
        self.check(&r)
    }

    /// Say goodbye (`finalize`).
    pub fn finalize(&mut self) -> Result<(), ClientError> {
        let r = self.call(&Line::new("finalize", &[]), "finalize_ack")?;
        self.check(&r)
    }
}
