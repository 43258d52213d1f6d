//! The state directory's store (`-S statedir=DIR`): rank 0's journal (`jobs/journal.rs`) in SQLite.
//!
//! One file, `DIR/vigil.sqlite`, in WAL mode with `synchronous=FULL`: a commit returns once it is on disk. The
//! loop does not write it: it appends each batch of the journal to the redo log (`redo.rs`, `DIR/vigil.redo.N`)
//! before it carries out anything the batch led to, and an fsync of that log (on the store thread) covers a
//! submission before it is answered. The writer thread folds the log's records into this file
//! ([`Store::fold`], many in one transaction, with `redo_seq` in `meta`, the last one folded) and removes the
//! segments it holds whole; at open, what the log holds past `redo_seq` (rank 0 killed before the fold) is
//! folded first ([`Store::open`]). A power cut of rank 0's node may lose records no fsync covered yet, never an
//! acknowledged job.
//!
//! Why SQLite: it is among the most tested pieces of software there is, crash-safe by design, and what Flux keeps
//! its content in; an operator can read the file with the `sqlite3` shell; and it builds with this workspace's
//! rust-version (redb 4, the pure-Rust alternative, needs Rust 1.90). Measured on the development VM's disk
//! (1 KiB records, fsync per commit): 262 commits/s one record each, 15,300 records/s at 100 per commit; redb
//! measured the same (248 and 15,800), the disk's fsync rate is the limit. See docs/statedir.md.
//!
//! Tables (schema [`SCHEMA_VERSION`], in `PRAGMA user_version`; the file is marked with [`APPLICATION_ID`]):
//! - `meta(key, value)`: `epoch` (seconds since the Unix epoch that job ids count from), `last_id` (the highest
//!   job id given), `restarts` (times rank 0 started on this file after the first);
//! - `jobs(id, userid, state, R, status, output)`: one row per job, small (so that the rows of the jobs running
//!   share a few pages, and a change of state rewrites a few hundred bytes); `R` JSON, `output` the JSON array of
//!   an INACTIVE job's output lines (its tail) in a store written before schema 2 (since, its output is in
//!   `job_output`);
//! - `jobspecs(id, jobspec)`: each job's jobspec (JSON) as submitted, written once (since schema 3; before, a
//!   column of `jobs`, rewritten with every change of the row: a jobspec carries the submitter's environment,
//!   kilobytes);
//! - `job_events(id, seq, event)`: each job's RFC 18 eventlog, as written: one row per job per fold of the redo
//!   log ([`Store::fold`]), `event` the lines of the events numbered from `seq` (one line per event, `\n` between
//!   them; one event per row before schema 3, one per write of the journal before the fold merged them);
//! - `job_output(id, seq, upto, lines, batches)`: the output of each job as it came: one row per job per record,
//!   `lines` the JSON array of the chunks numbered `seq` to `upto` (excluded) from the job's first, `batches` (JSON `{"rank": next}`, or NULL) the next output batch due from the job shells on
//!   those broker ranks whose number moved, so that a restarted rank 0 takes each batch once (read in row order,
//!   later rows win); rows wholly before the oldest chunk rank 0 still holds go (the row written with them then
//!   carries every shell's number), so that once the job is INACTIVE its rows are its tail; a purged job's go;
//! - `resource_events(seq, event)`: the RFC 44 resource eventlog;
//! - `ranks(rank, hostname, cores, gpus)`: each rank's node as it last joined (idsets), so that a restarted
//!   rank 0 counts ranks that have not joined again yet (since schema 3).
//!
//! Older schemas are brought to this one at open, in one transaction: 1 (before `job_output`) by adding it, 2
//! (the jobspec in `jobs`) by moving the jobspecs to their table. Rows of one event each read the same in 3.
//!
//! A file this build cannot read (not SQLite, damaged, truncated, another schema version) is [`OpenError::Damaged`]:
//! rank 0 then runs without a store, with scheduling stopped and submissions refused, and leaves the file as it is
//! for an operator. A directory that cannot be written is [`OpenError::Unwritable`]: rank 0 does not start.

use crate::eventlog::Event;
use crate::jobs::journal::{JobRecord, Journal, Kept, KeptJob, KeptRank};
use crate::jobs::{JobId, JobState};
use rusqlite::{params, Connection, OpenFlags, OptionalExtension};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The store's file name in the state directory.
pub const FILE: &str = "vigil.sqlite";

/// The schema this build writes and reads (`PRAGMA user_version`).
pub const SCHEMA_VERSION: i64 = 3;

/// `PRAGMA application_id` of a Vigil store: "VGL1".
pub const APPLICATION_ID: i64 = 0x5647_4c31;

/// Most output (bytes of JSON) read back for INACTIVE jobs at start, newest jobs first
/// ([`crate::jobs::INACTIVE_OUTPUT_TOTAL`]): older jobs' output stays in the file.
const OUTPUT_READ: usize = crate::jobs::INACTIVE_OUTPUT_TOTAL;

/// Why a state directory cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The directory cannot be created or written: rank 0 refuses to start.
    #[error("state directory {dir} cannot be written: {err}")]
    Unwritable {
        /// The directory.
        dir: PathBuf,
        /// What failed.
        err: String,
    },
    /// Another process (another rank 0) holds the directory's lock: rank 0 refuses to start.
    #[error(
        "state directory {dir} is in use by another rank 0 (pid {pid}, in {lock}): stop it first, or give this one \
         another statedir",
        lock = dir.join(LOCK).display()
    )]
    InUse {
        /// The directory.
        dir: PathBuf,
        /// The pid the lock file names ("?" when it names none).
        pid: String,
    },
    /// The store exists but cannot be read by this build: rank 0 starts with scheduling stopped and keeps it.
    #[error("{path}: {why}")]
    Damaged {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
    },
}

/// A commit that failed: nothing of its batch is kept.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{why}")]
pub struct CommitError {
    /// What failed.
    pub why: String,
    /// The errno a refused request is answered with: `ENOSPC` for a full disk, `EIO` otherwise.
    pub errno: u32,
}

impl From<rusqlite::Error> for CommitError {
    fn from(e: rusqlite::Error) -> CommitError {
        let full = matches!(e.sqlite_error_code(), Some(rusqlite::ErrorCode::DiskFull));
        CommitError {
            why: e.to_string(),
            errno: if full { crate::message::errno::ENOSPC } else { crate::message::errno::EIO },
        }
    }
}

impl From<CommitError> for vigil_core::broker::store::CommitError {
    /// The broker's view of a failed commit (`Input::Stored`, `Input::Synced`): the same two fields.
    fn from(e: CommitError) -> Self {
        Self { why: e.why, errno: e.errno }
    }
}

/// An open store.
pub struct Store {
    conn: Connection,
    path: PathBuf,
    /// Times rank 0 started on this store after the first (this start counted).
    pub restarts: u64,
    /// The last record of the redo log (`redo.rs`) the file holds (`redo_seq` in `meta`).
    pub redo_seq: u64,
    /// The highest job id the file holds as this connection last committed (`last_id`, or a higher job row: see
    /// [`write_meta_kept`]) and the epoch (its bits) it last wrote.
    meta_kept: Option<(JobId, u64)>,
    /// The directory's lock ([`LOCK`]), held while this store is open.
    _lock: std::fs::File,
}

/// The lock file of a state directory: locked (`flock`, exclusive) by the rank 0 that uses the directory, and
/// naming its pid, so that a second rank 0 on the same directory (a copy of the configuration with other ports)
/// is refused instead of writing the same store. The kernel releases it when that process ends, however.
pub const LOCK: &str = "vigil.lock";

/// Take the lock of `dir` ([`LOCK`]), or say who holds it.
fn lock(dir: &Path) -> Result<std::fs::File, OpenError> {
    use std::io::{Read as _, Seek as _, Write as _};
    use std::os::fd::AsRawFd as _;
    let path = dir.join(LOCK);
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| OpenError::Unwritable { dir: dir.to_path_buf(), err: format!("{}: {e}", path.display()) })?;
    // A lock this process has just let go of may still be held for a moment by a child it is starting: between
    // fork (or vfork) and exec the child shares every open file, this one too. So a refusal is retried for
    // 100 ms; another rank 0 holds it for good.
    let mut locked = false;
    for _ in 0..10 {
        // SAFETY: flock on a descriptor we own; no memory is involved.
        locked = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0;
        if locked {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    if !locked {
        let mut s = String::new();
        let _ = f.read_to_string(&mut s);
        let pid = s.trim().chars().take(20).collect::<String>();
        return Err(OpenError::InUse { dir: dir.to_path_buf(), pid: if pid.is_empty() { "?".into() } else { pid } });
    }
    let _ = f.set_len(0).and_then(|()| f.rewind()).and_then(|()| writeln!(f, "{}", std::process::id()));
    Ok(f)
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("path", &self.path).field("restarts", &self.restarts).finish()
    }
}

fn damaged(path: &Path, why: impl std::fmt::Display) -> OpenError {
    OpenError::Damaged { path: path.to_path_buf(), why: why.to_string() }
}

/// Write, fsync and remove a small file in `dir`: a directory that cannot take one cannot take the store.
fn probe(dir: &Path) -> Result<(), String> {
    use std::io::Write as _;
    let p = dir.join(".vigil-probe");
    let r = std::fs::File::create(&p).and_then(|mut f| {
        f.write_all(&[0u8; 4096])?;
        f.sync_all()
    });
    let _ = std::fs::remove_file(&p);
    r.map_err(|e| e.to_string())
}

/// Make a new, empty store at `path` (in `dir`, made private to its owner: it keeps every job's environment and
/// output): written in full as `FILE.new`, closed (which folds its WAL into it), synced, renamed into place, the
/// directory synced.
fn make_new(dir: &Path, path: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
    let tmp = dir.join(format!("{FILE}.new"));
    for p in [tmp.clone(), dir.join(format!("{FILE}.new-wal")), dir.join(format!("{FILE}.new-shm"))] {
        let _ = std::fs::remove_file(p);
    }
    {
        let conn = Connection::open(&tmp).map_err(|e| e.to_string())?;
        create(&conn).map_err(|e| e.to_string())?;
        // Closing the last connection checkpoints the WAL into the file and removes it: the file alone is the
        // store when it is renamed.
    }
    if dir.join(format!("{FILE}.new-wal")).exists() {
        return Err(format!("{FILE}.new-wal was left after closing the new store"));
    }
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600)).map_err(|e| e.to_string())?;
    std::fs::File::open(&tmp).and_then(|f| f.sync_all()).map_err(|e| e.to_string())?;
    std::fs::rename(&tmp, path).map_err(|e| e.to_string())?;
    std::fs::File::open(dir).and_then(|f| f.sync_all()).map_err(|e| e.to_string())?;
    Ok(())
}

impl Store {
    /// Open (or create) the store in `dir`, read back what it keeps (`None` for a new store), and count this
    /// start as a restart when it is not the first.
    ///
    /// # Errors
    /// [`OpenError::Unwritable`] when `dir` cannot be created, or a file cannot be written and synced in it;
    /// [`OpenError::Damaged`] when the file is not a store this build reads: not SQLite, another
    /// `application_id`, another schema version, or `PRAGMA quick_check` finds damage (a truncated file).
    pub fn open(dir: &Path) -> Result<(Store, Option<Kept>), OpenError> {
        let unwritable = |err: String| OpenError::Unwritable { dir: dir.to_path_buf(), err };
        if dir.exists() && !dir.is_dir() {
            return Err(unwritable("it exists and is not a directory".into()));
        }
        std::fs::create_dir_all(dir).map_err(|e| unwritable(e.to_string()))?;
        probe(dir).map_err(unwritable)?;
        let lock = lock(dir)?;
        let path = dir.join(FILE);
        if !path.exists() {
            // A new store is made whole beside its final name and renamed into place, so that a file named
            // FILE is always a store: one of no bytes (truncated, or emptied by hand) is damage, not a new start,
            // which would forget the job ids already given.
            make_new(dir, &path).map_err(unwritable)?;
        } else if std::fs::metadata(&path).is_ok_and(|m| m.len() == 0) {
            return Err(damaged(&path, "the file is empty (0 bytes): truncated?"));
        }
        let conn =
            Connection::open_with_flags(&path, OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX)
                .map_err(|e| damaged(&path, e))?;
        // Until the store is found whole, closing this connection must not fold SQLite's log into the file and
        // remove it (SQLite's default for the last connection): a damaged store is left exactly as it was, log
        // included (its frames after a damaged one may be what an operator recovers).
        conn.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true)
            .map_err(|e| damaged(&path, e))?;
        check(&conn).map_err(|why| damaged(&path, why))?;
        upgrade(&conn)
            .map_err(|e| unwritable(format!("{}: cannot bring it to schema {SCHEMA_VERSION}: {e}", path.display())))?;
        conn.pragma_update(None, "synchronous", "FULL").map_err(|e| damaged(&path, e))?;
        let mut store = Store { conn, path, restarts: 0, redo_seq: 0, meta_kept: None, _lock: lock };
        store.redo_seq = store.meta_u64("redo_seq").map_err(|e| damaged(&store.path, e))?;
        store.replay(dir)?;
        let kept = store.load().map_err(|e| damaged(&store.path, e))?;
        // Whole: a clean stop folds SQLite's log into the file again.
        store
            .conn
            .set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, false)
            .map_err(|e| damaged(&store.path, e))?;
        if kept.is_some() {
            // Counted once the instance has claimed the store (see `record_restart`), not by a rank 0 refused.
            store.restarts = store.meta_u64("restarts").map_err(|e| damaged(&store.path, e))? + 1;
        }
        Ok((store, kept))
    }

    /// The state directory.
    pub fn dir(&self) -> &Path {
        self.path.parent().unwrap_or(Path::new("."))
    }

    /// Record this start as a restart (`restarts` in `meta`, shown by `vigil uptime`), once the instance has
    /// claimed the store ([`Store::claim_instance`]): a rank 0 refused changes nothing. Nothing to do at a first
    /// start.
    ///
    /// # Errors
    /// The SQLite error.
    pub fn record_restart(&mut self) -> Result<(), String> {
        if self.restarts == 0 {
            return Ok(());
        }
        self.conn
            .execute("INSERT OR REPLACE INTO meta(key, value) VALUES('restarts', ?1)", params![self.restarts as i64])
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    /// Make sure this store is instance `name`'s (the `instance` id of the TOML bootstrap): recorded at the first
    /// start, checked at every later one. A store kept with another instance (a copied configuration, another
    /// cluster's directory) is not taken: its jobs would be shown and run here, its brokers would not come back.
    ///
    /// # Errors
    /// The instance the store belongs to, or an SQLite error.
    pub fn claim_instance(&mut self, name: &str) -> Result<(), String> {
        let kept: Option<String> = self
            .conn
            .query_row("SELECT value FROM meta WHERE key = 'instance'", [], |r| r.get(0))
            .optional()
            .map_err(|e| e.to_string())?;
        match kept {
            Some(k) if k == name => Ok(()),
            Some(k) => Err(format!("it keeps the jobs of instance '{k}', not of '{name}'")),
            None => self
                .conn
                .execute("INSERT INTO meta(key, value) VALUES('instance', ?1)", [name])
                .map(|_| ())
                .map_err(|e| e.to_string()),
        }
    }

    fn meta_u64(&self, key: &str) -> rusqlite::Result<u64> {
        let v: Option<String> =
            self.conn.query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0)).optional()?;
        Ok(v.and_then(|s| s.parse().ok()).unwrap_or(0))
    }

    /// Everything kept, or `None` when nothing was ever committed.
    fn load(&self) -> Result<Option<Kept>, String> {
        let c = &self.conn;
        let s = |e: rusqlite::Error| e.to_string();
        let epoch: Option<String> =
            c.query_row("SELECT value FROM meta WHERE key = 'epoch'", [], |r| r.get(0)).optional().map_err(s)?;
        let Some(epoch) = epoch else { return Ok(None) };
        let epoch: f64 = epoch.parse().map_err(|_| format!("meta.epoch '{epoch}' is not a number"))?;
        // Ids given: `last_id`, unless a job row is higher (`write_meta_kept` writes `last_id` only when no row
        // carries it).
        let top: Option<i64> = c.query_row("SELECT MAX(id) FROM jobs", [], |r| r.get(0)).map_err(s)?;
        let last_id = JobId(self.meta_u64("last_id").map_err(s)?).max(JobId(top.unwrap_or(0) as u64));
        let mut kept = Kept { epoch, last_id, ..Kept::default() };
        let mut q = c
            .prepare("SELECT id, userid, state, jobspec, R, status FROM jobs LEFT JOIN jobspecs USING(id)")
            .map_err(s)?;
        let mut rows = q.query([]).map_err(s)?;
        while let Some(r) = rows.next().map_err(s)? {
            let id = JobId(r.get::<_, i64>(0).map_err(s)? as u64);
            let state: String = r.get(2).map_err(s)?;
            let state: JobState = serde_json::from_value(serde_json::Value::String(state.clone()))
                .map_err(|_| format!("job {id}: unknown state '{state}'"))?;
            let jobspec: String =
                r.get::<_, Option<String>>(3).map_err(s)?.ok_or_else(|| format!("job {id} has no jobspec"))?;
            let rv: Option<String> = r.get(4).map_err(s)?;
            let mut job = KeptJob::new(
                r.get::<_, i64>(1).map_err(s)? as u32,
                serde_json::from_str(&jobspec).map_err(|e| format!("job {id}: jobspec: {e}"))?,
                state,
            );
            job.r = rv.map(|t| serde_json::from_str(&t)).transpose().map_err(|e| format!("job {id}: R: {e}"))?;
            job.status = r.get(5).map_err(s)?;
            kept.jobs.insert(id, job);
        }
        let mut q = c.prepare("SELECT id, seq, event FROM job_events ORDER BY id, seq").map_err(s)?;
        let mut rows = q.query([]).map_err(s)?;
        while let Some(r) = rows.next().map_err(s)? {
            let id = JobId(r.get::<_, i64>(0).map_err(s)? as u64);
            let seq: i64 = r.get(1).map_err(s)?;
            let lines: String = r.get(2).map_err(s)?;
            let job = kept.jobs.get_mut(&id).ok_or_else(|| format!("event {seq} of job {id}, which has no row"))?;
            if seq != job.eventlog.len() as i64 {
                return Err(format!("job {id}: event {seq} follows {} events", job.eventlog.len()));
            }
            for line in lines.split('\n') {
                let n = job.eventlog.len();
                job.eventlog.push(Event::parse_line(line).map_err(|e| format!("job {id} event {n}: {e}"))?);
            }
        }
        // Output of the newest INACTIVE jobs, up to what the job core keeps in memory.
        let mut q = c.prepare("SELECT id, output FROM jobs WHERE output IS NOT NULL ORDER BY id DESC").map_err(s)?;
        let mut rows = q.query([]).map_err(s)?;
        let mut read = 0usize;
        while let Some(r) = rows.next().map_err(s)? {
            let id = JobId(r.get::<_, i64>(0).map_err(s)? as u64);
            let text: String = r.get(1).map_err(s)?;
            read += text.len();
            if read > OUTPUT_READ {
                break;
            }
            if let Some(job) = kept.jobs.get_mut(&id) {
                job.output = serde_json::from_str(&text).map_err(|e| format!("job {id}: output: {e}"))?;
            }
        }
        load_output_rows(c, &mut kept, read)?;
        let mut q = c.prepare("SELECT seq, event FROM resource_events ORDER BY seq").map_err(s)?;
        let mut rows = q.query([]).map_err(s)?;
        while let Some(r) = rows.next().map_err(s)? {
            let seq: i64 = r.get(0).map_err(s)?;
            if seq != kept.resource_eventlog.len() as i64 {
                return Err(format!("resource event {seq} follows {} events", kept.resource_eventlog.len()));
            }
            let line: String = r.get(1).map_err(s)?;
            kept.resource_eventlog.push(Event::parse_line(&line).map_err(|e| format!("resource event {seq}: {e}"))?);
        }
        let mut q = c.prepare("SELECT rank, hostname, cores, gpus FROM ranks").map_err(s)?;
        let mut rows = q.query([]).map_err(s)?;
        while let Some(r) = rows.next().map_err(s)? {
            let rank: u32 = r.get(0).map_err(s)?;
            let set = |i: usize| -> Result<crate::idset::IdSet, String> {
                let text: String = r.get(i).map_err(s)?;
                crate::idset::IdSet::parse(&text).map_err(|e| format!("rank {rank}: '{text}': {e}"))
            };
            let k = KeptRank { hostname: r.get(1).map_err(s)?, cores: set(2)?, gpus: set(3)? };
            kept.ranks.insert(rank, k);
        }
        Ok(Some(kept))
    }

    /// Fold into the file what the redo log (`redo.rs`) holds past [`Store::redo_seq`] (written before a crash
    /// of rank 0 and not folded yet), durably, then remove its segments.
    ///
    /// # Errors
    /// [`OpenError::Damaged`] when a record cannot be folded (it names a job the file does not have);
    /// [`OpenError::Unwritable`] when the fold cannot be written (a full disk) or a segment cannot be read or
    /// removed. The segments are left as they are then.
    fn replay(&mut self, dir: &Path) -> Result<(), OpenError> {
        use super::redo::ReadError;
        let unwritable = |err: String| OpenError::Unwritable { dir: dir.to_path_buf(), err };
        let segments = super::redo::segments(dir).map_err(|e| unwritable(e.to_string()))?;
        if segments.is_empty() && self.meta_u64("running").map_err(|e| damaged(&self.path, e))? == 1 {
            // A rank 0 that did not stop cleanly leaves its current segment (at least): none is here.
            return Err(damaged(
                &self.path,
                format!(
                    "rank 0 did not stop cleanly and its redo log ({}*) is gone: the changes it held (up to the last \
                     half second before the stop) are lost; to start anyway with what the file holds, create an \
                     empty {}000001 in the directory",
                    super::redo::PREFIX,
                    super::redo::PREFIX
                ),
            ));
        }
        let r = super::redo::read(dir, self.redo_seq).map_err(|e| match e {
            ReadError::Io(why) => unwritable(why),
            ReadError::Damaged(why) => damaged(&self.path, why),
        })?;
        if let Some(why) = &r.dropped {
            tracing::warn!("state directory: {why}");
        }
        if let Some((last, _)) = r.batches.last() {
            let last = *last;
            let batches: Vec<&Journal> = r.batches.iter().map(|(_, b)| b).collect();
            self.fold(&batches, last).map_err(|e| {
                let why = format!("cannot fold the redo log into the store: {}", e.why);
                if e.errno == crate::message::errno::ENOSPC {
                    unwritable(why)
                } else {
                    damaged(&self.path, why)
                }
            })?;
            tracing::info!("state directory: {} record(s) of the redo log folded into the store", batches.len());
        }
        if !r.segments.is_empty() {
            // The log is in the file now: none is in use until rank 0 starts one ([`Store::mark_running`]).
            self.mark_running(false).map_err(|e| unwritable(e.why))?;
        }
        for seg in &r.segments {
            std::fs::remove_file(seg).map_err(|e| unwritable(format!("{}: {e}", seg.display())))?;
        }
        if !r.segments.is_empty() {
            std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(|e| unwritable(e.to_string()))?;
        }
        Ok(())
    }

    /// Record (`running` in `meta`, durably) that a rank 0 writes a redo log beside this file (`true`, when it
    /// starts one), or that none is in use (`false`: a clean stop folded it, or an open did). An open that finds
    /// `running` with no segment of the log refuses the store as damaged: the log was removed after a crash, and
    /// what it held with it.
    ///
    /// # Errors
    /// The SQLite error.
    pub fn mark_running(&mut self, running: bool) -> Result<(), CommitError> {
        self.conn
            .prepare_cached("INSERT OR REPLACE INTO meta(key, value) VALUES('running', ?1)")?
            .execute(params![if running { "1" } else { "0" }])?;
        Ok(())
    }

    /// Write batch `b` in one transaction, durable when this returns `Ok` (SQLite's log fsynced).
    ///
    /// # Errors
    /// The SQLite error (a full disk, an I/O error): then nothing of `b` is kept.
    pub fn commit(&mut self, b: &Journal) -> Result<(), CommitError> {
        self.fold(&[b], self.redo_seq)
    }

    /// Write `batches` (records of the redo log, in order, the last numbered `upto`) in one transaction, with
    /// `redo_seq` = `upto`; durable (fsynced) when this returns `Ok`.
    ///
    /// # Errors
    /// As [`Store::commit`]: then nothing of them is kept.
    pub fn fold(&mut self, batches: &[&Journal], upto: u64) -> Result<(), CommitError> {
        // BEGIN and COMMIT as cached statements.
        self.conn.prepare_cached("BEGIN")?.execute([])?;
        let mut meta_kept = self.meta_kept;
        let r = (|| {
            // Each job's records of the whole fold at once (a job's life is a few records, most within one
            // fold); then, batch by batch, what is not a job's.
            write_jobs(&self.conn, batches)?;
            for b in batches {
                meta_kept = Some(write_meta_kept(&self.conn, b, meta_kept)?);
            }
            if upto != self.redo_seq {
                self.conn
                    .prepare_cached("INSERT OR REPLACE INTO meta(key, value) VALUES('redo_seq', ?1)")?
                    .execute(params![upto.to_string()])?;
            }
            Ok::<_, CommitError>(())
        })();
        match r {
            Ok(()) => {
                if let Err(e) = self.conn.prepare_cached("COMMIT").and_then(|mut c| c.execute([])) {
                    let _ = self.conn.execute_batch("ROLLBACK");
                    return Err(e.into());
                }
            }
            Err(e) => {
                let _ = self.conn.execute_batch("ROLLBACK");
                return Err(e);
            }
        }
        self.meta_kept = meta_kept;
        self.redo_seq = upto;
        Ok(())
    }
}

/// Write what batch `b` holds besides its jobs' records ([`write_rest`]), given what the file held of its meta
/// rows (`kept`: the highest job id it holds and the epoch's bits, see [`Store::meta_kept`]); returns what it
/// holds after. The jobs' rows of the fold ([`write_jobs`]) are written already.
fn write_meta_kept(c: &Connection, b: &Journal, kept: Option<(JobId, u64)>) -> Result<(JobId, u64), CommitError> {
    // The highest id the file will hold without a `last_id` row: the one kept, or a new job's row.
    let new_rows = b.jobs.iter().filter(|r| r.jobspec.is_some()).map(|r| r.id).max();
    let covered = kept.map(|(id, _)| id).max(new_rows).unwrap_or_default();
    let write_meta =
        kept.map(|(_, epoch)| epoch) != Some(b.epoch.to_bits()) || !b.purged.is_empty() || covered < b.last_id;
    write_rest(c, b, write_meta)?;
    Ok((if write_meta { b.last_id.max(covered) } else { covered }, b.epoch.to_bits()))
}

/// The jobs' records of `batches` (one fold, in order), inside its transaction, job by job in id order: one
/// write of the job's row with what its last record says (the insert with its jobspec if a record adds the
/// job), its events in one row per run of consecutive ones, and its output's rows record by record. The file
/// ends as it would with each record written in turn (`Kept::apply`), in a third of the statements for a job
/// whose submission, start and end fall in one fold: the writer thread's cost per job on a busy rank 0.
fn write_jobs(c: &Connection, batches: &[&Journal]) -> Result<(), CommitError> {
    let mut by_job: BTreeMap<JobId, Vec<&JobRecord>> = BTreeMap::new();
    for r in batches.iter().flat_map(|b| &b.jobs) {
        by_job.entry(r.id).or_default().push(r);
    }
    let mut new_job = c.prepare_cached(
        "INSERT INTO jobs(id, userid, state, R, status, output) VALUES(?1, ?2, ?3, ?4, ?5, ?6)
         ON CONFLICT(id) DO UPDATE SET state = excluded.state, R = excluded.R, status = excluded.status,
         output = COALESCE(excluded.output, output)",
    )?;
    let mut jobspec = c.prepare_cached("INSERT OR REPLACE INTO jobspecs(id, jobspec) VALUES(?1, ?2)")?;
    let mut update = c.prepare_cached(
        "UPDATE jobs SET state = ?2, R = ?3, status = ?4, output = COALESCE(?5, output) WHERE id = ?1",
    )?;
    let mut event = c.prepare_cached("INSERT OR REPLACE INTO job_events(id, seq, event) VALUES(?1, ?2, ?3)")?;
    let mut lines = String::new();
    for (job, records) in &by_job {
        let id = job.0 as i64;
        // The row: a record writes it when it adds the job (its jobspec), says `row`, or carries output (a
        // store written before schema 2); each such write sets state, R and status, and the output unless
        // NULL, so the last one's values stand, with the last output given.
        let spec = records.iter().rev().find_map(|r| r.jobspec.as_deref());
        let last = records.iter().rev().find(|r| r.jobspec.is_some() || r.row || r.output.is_some());
        if let Some(last) = last {
            let rv = last.r.as_ref().map(|v| v.to_string());
            let output = records
                .iter()
                .rev()
                .find_map(|r| r.output.as_ref())
                .map(|o| serde_json::to_string(o).unwrap_or_else(|_| "[]".into()));
            match spec {
                Some(spec) => {
                    new_job.execute(params![id, i64::from(last.userid), last.state.name(), rv, last.status, output])?;
                    jobspec.execute(params![id, spec])?;
                }
                None => {
                    if update.execute(params![id, last.state.name(), rv, last.status, output])? != 1 {
                        return Err(CommitError {
                            why: format!("job {job} has no row to update"),
                            errno: crate::message::errno::EIO,
                        });
                    }
                }
            }
        }
        // Its events: one row per run of records whose events follow on (`first_event`), whatever their number.
        let mut run: Option<usize> = None;
        let mut next = 0;
        for r in records.iter().filter(|r| !r.events.is_empty()) {
            if run.is_some() && r.first_event != next {
                event.execute(params![id, run.take().unwrap_or_default() as i64, lines])?;
            }
            if run.is_none() {
                run = Some(r.first_event);
                lines.clear();
            }
            for e in &r.events {
                if !lines.is_empty() {
                    lines.push('\n');
                }
                lines.push_str(&e.to_line());
            }
            next = r.first_event + r.events.len();
        }
        if let Some(first) = run {
            event.execute(params![id, first as i64, lines])?;
        }
        for r in records {
            write_output_rows(c, r)?;
        }
    }
    Ok(())
}

/// What batch `b` writes besides its jobs' records ([`Store::fold`]), inside its transaction: resource events,
/// ranks, purges, and the meta rows if `write_meta`.
fn write_rest(c: &Connection, b: &Journal, write_meta: bool) -> Result<(), CommitError> {
    let mut res = c.prepare_cached("INSERT OR REPLACE INTO resource_events(seq, event) VALUES(?1, ?2)")?;
    for (i, e) in b.resource_events.iter().enumerate() {
        res.execute(params![(b.resource_first + i) as i64, e.to_line()])?;
    }
    for (rank, k) in &b.ranks {
        c.prepare_cached("INSERT OR REPLACE INTO ranks(rank, hostname, cores, gpus) VALUES(?1, ?2, ?3, ?4)")?
            .execute(params![rank, k.hostname, k.cores.to_string(), k.gpus.to_string()])?;
    }
    // Purged jobs (jobs/purge.rs) go whole; their id stays below `last_id`, so it is never given again.
    for id in &b.purged {
        for table in ["jobs", "jobspecs", "job_events", "job_output"] {
            c.prepare_cached(&format!("DELETE FROM {table} WHERE id = ?1"))?.execute(params![id.0 as i64])?;
        }
    }
    // The meta rows only when what they say is not in the file already: a page less in the log for most
    // writes. The highest id given is read back as the larger of `last_id` and the highest job row (`load`), so
    // a batch that adds the job of the newest id carries it by that row; one that purges jobs (it may remove
    // that row) writes `last_id`.
    if write_meta {
        let mut meta = c.prepare_cached("INSERT OR REPLACE INTO meta(key, value) VALUES(?1, ?2)")?;
        meta.execute(params!["last_id", b.last_id.0.to_string()])?;
        let mut epoch = c.prepare_cached("INSERT OR IGNORE INTO meta(key, value) VALUES('epoch', ?1)")?;
        epoch.execute(params![b.epoch.to_string()])?;
    }
    Ok(())
}

/// Write what changed in the output of job `r` (`job_output`): one row of its new chunks and of the batch
/// numbers that moved, and, once rank 0 dropped some chunks (past its bound, or to the tail of a job that became
/// INACTIVE: most jobs never do), the rows wholly before the oldest it holds. Nothing for a job with no new output:
/// one row, in the job's neighbourhood of one table, is what a write of output costs.
fn write_output_rows(tx: &Connection, r: &JobRecord) -> rusqlite::Result<()> {
    let id = r.id.0 as i64;
    let o = &r.rows;
    if o.trim {
        tx.prepare_cached("DELETE FROM job_output WHERE id = ?1 AND seq < ?2 AND upto <= ?2")?
            .execute(params![id, o.base as i64])?;
    }
    if o.new.is_empty() && o.batches.is_empty() {
        return Ok(());
    }
    let lines = serde_json::to_string(&o.new).unwrap_or_else(|_| "[]".into());
    let batches = (!o.batches.is_empty()).then(|| {
        let m: serde_json::Map<String, serde_json::Value> =
            o.batches.iter().map(|(rank, next)| (rank.to_string(), (*next).into())).collect();
        serde_json::Value::Object(m).to_string()
    });
    let upto = o.first + o.new.len();
    tx.prepare_cached("INSERT OR REPLACE INTO job_output(id, seq, upto, lines, batches) VALUES(?1, ?2, ?3, ?4, ?5)")?
        .execute(params![id, o.first as i64, upto as i64, lines, batches])?;
    Ok(())
}

/// Read back the output kept in rows (`job_output`; see [`KeptJob::put_output`]): in order, bounded as rank 0
/// held it, and the batch numbers the rows carry (later rows winning) for jobs not INACTIVE. Every job not
/// INACTIVE has its output read; INACTIVE ones, newest first, until [`OUTPUT_READ`] bytes were read (`read`
/// already, from `jobs.output`, where a store written before schema 2 keeps an INACTIVE job's output).
fn load_output_rows(c: &Connection, kept: &mut Kept, mut read: usize) -> Result<(), String> {
    let s = |e: rusqlite::Error| e.to_string();
    let mut q = c.prepare("SELECT id, seq, lines, batches FROM job_output ORDER BY id DESC, seq, upto").map_err(s)?;
    let mut rows = q.query([]).map_err(s)?;
    let mut got = std::collections::BTreeSet::new();
    let mut full = read > OUTPUT_READ;
    while let Some(r) = rows.next().map_err(s)? {
        let id = JobId(r.get::<_, i64>(0).map_err(s)? as u64);
        let seq = r.get::<_, i64>(1).map_err(s)?;
        let text: String = r.get(2).map_err(s)?;
        let Some(job) = kept.jobs.get_mut(&id) else { continue };
        let inactive = job.state == JobState::Inactive;
        if inactive {
            if full || (!got.contains(&id) && !job.output.is_empty()) {
                continue;
            }
            read += text.len();
            if read > OUTPUT_READ {
                // Older jobs' output stays in the file; this one's is not read in part.
                (full, job.output, job.output_base) = (true, Vec::new(), 0);
                got.remove(&id);
                continue;
            }
        }
        let lines: Vec<crate::shellproto::OutputLine> =
            serde_json::from_str(&text).map_err(|e| format!("job {id}: output from {seq}: {e}"))?;
        if !lines.is_empty() {
            job.put_output(usize::try_from(seq).map_err(|_| format!("job {id}: output at {seq}"))?, lines);
            got.insert(id);
        }
        let batches: Option<String> = r.get(3).map_err(s)?;
        if let (Some(b), false) = (batches, inactive) {
            let m: std::collections::BTreeMap<u32, u64> =
                serde_json::from_str(&b).map_err(|e| format!("job {id}: batches at {seq}: {e}"))?;
            job.batches.extend(m);
        }
    }
    for id in got {
        if let Some(job) = kept.jobs.get_mut(&id) {
            job.bound_output();
        }
    }
    Ok(())
}

/// The table schema 2 added to schema 1: the output of jobs as they run. Keyed by `upto` too: a row of batch
/// numbers alone (no chunks) and the row of chunks written after it start at the same `seq`.
const RUNNING_OUTPUT_TABLES: &str = "
    CREATE TABLE job_output(id INTEGER NOT NULL, seq INTEGER NOT NULL, upto INTEGER NOT NULL, lines TEXT NOT NULL,
                            batches TEXT, PRIMARY KEY(id, seq, upto)) WITHOUT ROWID;";

/// The tables schema 3 made or remade: `jobs` without its jobspec (a row of `jobs` is rewritten at every change
/// of state, a jobspec is written once and is kilobytes), `jobspecs`, and `ranks` (each rank's node).
const SCHEMA_3_TABLES: &str = "
    CREATE TABLE jobs(id INTEGER PRIMARY KEY, userid INTEGER NOT NULL, state TEXT NOT NULL, R TEXT,
                      status INTEGER, output TEXT);
    CREATE TABLE jobspecs(id INTEGER PRIMARY KEY, jobspec TEXT NOT NULL);
    CREATE TABLE ranks(rank INTEGER PRIMARY KEY, hostname TEXT NOT NULL, cores TEXT NOT NULL, gpus TEXT NOT NULL);";

/// Bring a store of schema 1 or 2 (checked by [`check`]) to [`SCHEMA_VERSION`], in one transaction: none of
/// it is changed if any step fails.
fn upgrade(c: &Connection) -> rusqlite::Result<()> {
    let version: i64 = c.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if version == SCHEMA_VERSION {
        return Ok(());
    }
    let output = if version == 1 { RUNNING_OUTPUT_TABLES } else { "" };
    let r = c.execute_batch(&format!(
        "BEGIN;
         {output}
         ALTER TABLE jobs RENAME TO jobs_2;
         {SCHEMA_3_TABLES}
         INSERT INTO jobs(id, userid, state, R, status, output) SELECT id, userid, state, R, status, output FROM jobs_2;
         INSERT INTO jobspecs(id, jobspec) SELECT id, jobspec FROM jobs_2;
         DROP TABLE jobs_2;
         PRAGMA user_version = {SCHEMA_VERSION};
         COMMIT;"
    ));
    if r.is_err() {
        let _ = c.execute_batch("ROLLBACK");
    }
    r
}

/// A new store's schema.
fn create(c: &Connection) -> rusqlite::Result<()> {
    c.pragma_update(None, "journal_mode", "WAL")?;
    c.execute_batch(&format!(
        "PRAGMA application_id = {APPLICATION_ID};
         PRAGMA user_version = {SCHEMA_VERSION};
         BEGIN;
         CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
         {SCHEMA_3_TABLES}
         CREATE TABLE job_events(id INTEGER NOT NULL, seq INTEGER NOT NULL, event TEXT NOT NULL,
                                 PRIMARY KEY(id, seq)) WITHOUT ROWID;
         CREATE TABLE resource_events(seq INTEGER PRIMARY KEY, event TEXT NOT NULL);
         {RUNNING_OUTPUT_TABLES}
         COMMIT;"
    ))
}

/// An existing file: ours, of our schema, undamaged. Nothing is written to it here.
fn check(c: &Connection) -> Result<(), String> {
    let app: i64 = c.query_row("PRAGMA application_id", [], |r| r.get(0)).map_err(|e| e.to_string())?;
    let version: i64 = c.query_row("PRAGMA user_version", [], |r| r.get(0)).map_err(|e| e.to_string())?;
    if app != APPLICATION_ID {
        return Err(format!(
            "not a Vigil state store (SQLite application_id {app:#x}, a Vigil store has {APPLICATION_ID:#x})"
        ));
    }
    if !(1..=SCHEMA_VERSION).contains(&version) {
        return Err(format!(
            "schema version {version}, but this build reads version {SCHEMA_VERSION} (use the Vigil that wrote it, \
             or move the file away to start afresh)"
        ));
    }
    let verdict: Vec<String> = c
        .prepare("PRAGMA quick_check")
        .and_then(|mut q| q.query_map([], |r| r.get(0))?.collect())
        .map_err(|e| e.to_string())?;
    if verdict != ["ok"] {
        // On one line (`vigil uptime` shows one): SQLite's rows may hold newlines ("*** in database main ***\n
        // Page 5: ..."), and may be a hundred.
        let lines: Vec<String> = verdict
            .iter()
            .flat_map(|r| r.lines())
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with("***"))
            .map(String::from)
            .collect();
        let shown = if lines.is_empty() {
            verdict.join(" ")
        } else {
            lines.iter().take(3).cloned().collect::<Vec<_>>().join("; ")
        };
        let more = if lines.len() > 3 { format!(" (and {} more problems)", lines.len() - 3) } else { String::new() };
        return Err(format!("damaged (PRAGMA quick_check): {shown}{more}"));
    }
    let mode: String = c.query_row("PRAGMA journal_mode", [], |r| r.get(0)).map_err(|e| e.to_string())?;
    if mode != "wal" {
        return Err(format!("journal_mode is {mode}, a Vigil store's is wal"));
    }
    Ok(())
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::jobs::journal::JobRecord;
    use proptest::prelude::*;
    use serde_json::json;

    fn ev(t: f64, name: &str) -> Event {
        Event::with_time(t, name, json!({"n": name}))
    }

    /// Job `id`'s record: events named `events` from index `first`, with its jobspec when `spec`.
    pub(in crate::broker) fn record(id: u64, first: usize, events: &[&str], spec: bool) -> JobRecord {
        JobRecord {
            id: JobId(id),
            userid: 1000,
            state: JobState::Sched,
            jobspec: spec.then(|| json!({"version": 1, "id": id}).to_string().into()),
            first_event: first,
            events: events.iter().map(|n| std::sync::Arc::new(ev(1.5, n))).collect(),
            row: true,
            r: None,
            status: None,
            output: None,
            rows: Default::default(),
        }
    }

    /// A batch of `jobs`, with `nres` resource events from `resource_first`.
    pub(in crate::broker) fn batch(jobs: Vec<JobRecord>, resource_first: usize, nres: usize, last_id: u64) -> Journal {
        Journal {
            jobs,
            resource_first,
            resource_events: (0..nres).map(|i| ev(2.0 + i as f64, "online")).collect(),
            last_id: JobId(last_id),
            epoch: 1000.25,
            purged: vec![],
            ranks: vec![],
            tick: 0,
        }
    }

    /// A store is claimed by the first instance that uses it and refused to any other.
    #[test]
    fn a_store_belongs_to_one_instance() {
        let d = tempfile::tempdir().unwrap();
        let (mut s, _) = Store::open(d.path()).unwrap();
        s.claim_instance("cluster").unwrap();
        s.claim_instance("cluster").unwrap();
        drop(s);
        let (mut s, _) = Store::open(d.path()).unwrap();
        assert_eq!(s.claim_instance("other"), Err("it keeps the jobs of instance 'cluster', not of 'other'".into()));
        s.claim_instance("cluster").unwrap();
    }

    /// A restart is counted when the instance takes the store, not when another instance's rank 0 is refused it.
    #[test]
    fn a_refused_rank_0_counts_no_restart() {
        let d = tempfile::tempdir().unwrap();
        let (mut s, _) = Store::open(d.path()).unwrap();
        s.claim_instance("cluster").unwrap();
        s.commit(&batch(vec![], 0, 1, 5)).unwrap();
        drop(s);
        let (mut s, _) = Store::open(d.path()).unwrap();
        assert!(s.claim_instance("other").is_err());
        drop(s);
        let (mut s, _) = Store::open(d.path()).unwrap();
        assert_eq!(s.restarts, 1, "the refused start was not counted");
        s.claim_instance("cluster").unwrap();
        s.record_restart().unwrap();
        drop(s);
        assert_eq!(Store::open(d.path()).unwrap().0.restarts, 2);
    }

    /// A second rank 0 on the same directory is refused, naming the first one's pid; the lock goes with the store.
    #[test]
    fn a_state_directory_in_use_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let (s, _) = Store::open(d.path()).unwrap();
        // flock locks belong to the open file description: a second open of the file, even here, is refused.
        match Store::open(d.path()) {
            Err(OpenError::InUse { pid, .. }) => assert_eq!(pid, std::process::id().to_string()),
            other => panic!("{other:?}"),
        }
        drop(s);
        assert!(Store::open(d.path()).is_ok(), "free again once the first store is closed");
    }

    #[test]
    fn what_is_committed_comes_back_after_reopening_and_restarts_are_counted() {
        let d = tempfile::tempdir().unwrap();
        let (mut s, kept) = Store::open(d.path()).unwrap();
        assert!(kept.is_none(), "a new store keeps nothing");
        assert_eq!(s.restarts, 0);
        let mut mem = Kept::default();
        let b1 = batch(vec![record(5, 0, &["submit", "validate"], true), record(9, 0, &["submit"], true)], 0, 2, 9);
        let mut done = record(5, 2, &["alloc", "finish", "clean"], false);
        done.state = JobState::Inactive;
        done.status = Some(256);
        done.r = Some(json!({"version": 1}));
        done.output = Some(vec![crate::shellproto::OutputLine::text(0, "stdout", "hi".into())]);
        let b2 = batch(vec![done], 2, 1, 12);
        for b in [&b1, &b2] {
            s.commit(b).unwrap();
            mem.apply(b).unwrap();
        }
        let sync: i64 = s.conn.query_row("PRAGMA synchronous", [], |r| r.get(0)).unwrap();
        assert_eq!(sync, 2, "every commit is fsynced (FULL)");
        drop(s);
        let (mut s, kept) = Store::open(d.path()).unwrap();
        assert_eq!(s.restarts, 1);
        assert_eq!(kept.as_ref(), Some(&mem), "the store keeps what the in-memory one does");
        s.record_restart().unwrap();
        drop(s);
        let (s, _) = Store::open(d.path()).unwrap();
        assert_eq!(s.restarts, 2);
    }

    /// `last_id` is written only when no job row carries it (a page less per write), and always with a purge: the
    /// highest id given comes back either way, even once the newest job is purged.
    #[test]
    fn the_highest_id_given_comes_back_though_last_id_is_written_only_when_needed() {
        let d = tempfile::tempdir().unwrap();
        let (mut s, _) = Store::open(d.path()).unwrap();
        let meta = |s: &Store| s.meta_u64("last_id").unwrap();
        s.commit(&batch(vec![record(5, 0, &["submit"], true)], 0, 0, 5)).unwrap();
        assert_eq!(meta(&s), 5, "the first write has the meta rows");
        s.commit(&batch(vec![record(9, 0, &["submit"], true)], 0, 0, 9)).unwrap();
        assert_eq!(meta(&s), 5, "job 9's row carries the id");
        s.commit(&batch(vec![record(5, 1, &["alloc"], false)], 0, 0, 9)).unwrap();
        assert_eq!(meta(&s), 5);
        drop(s);
        let (mut s, kept) = Store::open(d.path()).unwrap();
        assert_eq!(kept.unwrap().last_id, JobId(9));
        // An id given without a row to carry it (a batch that moved `last_id` alone) is written.
        s.commit(&batch(vec![], 0, 0, 11)).unwrap();
        assert_eq!(meta(&s), 11);
        s.commit(&batch(vec![record(14, 0, &["submit"], true)], 0, 0, 14)).unwrap();
        assert_eq!(meta(&s), 11, "job 14's row carries the id");
        // Purging job 14 takes that row: `last_id` is written with it.
        s.commit(&Journal { purged: vec![JobId(14)], ..batch(vec![], 0, 0, 14) }).unwrap();
        assert_eq!(meta(&s), 14);
        drop(s);
        let (_, kept) = Store::open(d.path()).unwrap();
        let kept = kept.unwrap();
        assert_eq!(
            (kept.last_id, kept.jobs.keys().copied().collect::<Vec<_>>()),
            (JobId(14), vec![JobId(5), JobId(9)])
        );
    }

    /// What the redo log holds past the last fold (rank 0 killed before the writer thread folded it) is folded
    /// into the file at the next open, whole, in order, and its segments go; the next log follows it.
    #[test]
    fn what_the_redo_log_holds_is_folded_at_the_next_open() {
        use super::super::redo::{segments, RedoLog};
        let d = tempfile::tempdir().unwrap();
        let (mut s, _) = Store::open(d.path()).unwrap();
        let mut log = RedoLog::create(d.path(), s.redo_seq).unwrap();
        let mut mem = Kept::default();
        let mut batches = Vec::new();
        for id in 1..=5u64 {
            let mut r = record(id, 0, &["submit", "validate"], true);
            r.rows.new = vec![crate::shellproto::OutputLine::text(0, "stdout", format!("{id}"))];
            let b = batch(vec![r], mem.resource_eventlog.len(), 1, id);
            log.append(&b).unwrap();
            mem.apply(&b).unwrap();
            batches.push(b);
        }
        // Records 1 and 2 folded (as the writer thread does), 3 to 5 not: then a kill -9.
        s.fold(&[&batches[0], &batches[1]], 2).unwrap();
        assert_eq!(s.meta_u64("redo_seq").unwrap(), 2);
        drop((s, log));
        let (s, kept) = Store::open(d.path()).unwrap();
        assert_eq!(kept.as_ref(), Some(&mem), "every record is in the store once");
        assert_eq!(s.redo_seq, 5);
        assert!(segments(d.path()).unwrap().is_empty(), "the folded segments are removed");
        let mut log = RedoLog::create(d.path(), s.redo_seq).unwrap();
        assert_eq!(log.append(&batch(vec![], mem.resource_eventlog.len(), 0, 5)).unwrap().0, 6);
    }

    /// A rank 0 killed leaves its redo log; one removed by hand after that (with what it held) makes the store
    /// damaged, saying so and how to start anyway; a clean stop (`running` cleared) or a log that was there does
    /// not.
    #[test]
    fn a_redo_log_removed_after_a_crash_is_damage() {
        use super::super::redo::{segments, RedoLog, PREFIX};
        let d = tempfile::tempdir().unwrap();
        let (mut s, _) = Store::open(d.path()).unwrap();
        let mut log = RedoLog::create(d.path(), s.redo_seq).unwrap();
        s.mark_running(true).unwrap();
        log.append(&batch(vec![record(1, 0, &["submit"], true)], 0, 0, 1)).unwrap();
        drop((s, log)); // kill -9
        for (_, p) in segments(d.path()).unwrap() {
            std::fs::remove_file(p).unwrap();
        }
        match Store::open(d.path()) {
            Err(OpenError::Damaged { why, .. }) => {
                assert!(why.contains("did not stop cleanly") && why.contains(&format!("{PREFIX}000001")), "{why}")
            }
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("a removed redo log went unnoticed"),
        }
        // What the message says to do: an empty segment, and the store opens with what it holds.
        std::fs::write(d.path().join(format!("{PREFIX}000001")), b"").unwrap();
        let (s, kept) = Store::open(d.path()).unwrap();
        assert!(kept.is_none());
        assert_eq!(s.meta_u64("running").unwrap(), 0);
        drop(s);
        assert!(Store::open(d.path()).is_ok(), "opened again: no log, none in use");
    }

    /// A store found damaged is left as it was, SQLite's log included: opening it does not fold the log into the
    /// file and remove it (its frames after a damaged one may be all that is left of some changes).
    #[test]
    fn a_damaged_store_keeps_its_sqlite_log() {
        use super::super::redo::RedoLog;
        let d = tempfile::tempdir().unwrap();
        let (mut s, _) = Store::open(d.path()).unwrap();
        s.commit(&batch(vec![record(1, 0, &["submit"], true)], 0, 0, 1)).unwrap();
        // Killed: its log not folded into the file.
        s.conn.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true).unwrap();
        drop(s);
        let wal = d.path().join(format!("{FILE}-wal"));
        let before = std::fs::read(&wal).unwrap();
        assert!(!before.is_empty());
        // A redo log that starts past what the store holds: damage.
        let mut log = RedoLog::create(d.path(), 4).unwrap();
        log.append(&batch(vec![], 0, 0, 1)).unwrap();
        drop(log);
        assert!(matches!(Store::open(d.path()), Err(OpenError::Damaged { .. })));
        assert_eq!(std::fs::read(&wal).unwrap(), before, "SQLite's log left as it was");
    }

    /// A running job's output is kept as it comes, across reopenings, bounded as rank 0 holds it, with its shells'
    /// batch numbers; once the job is INACTIVE its tail stays, the rows before it go.
    #[test]
    fn a_jobs_output_is_kept_as_it_comes_and_trimmed_to_its_tail_once_inactive() {
        use crate::jobs::journal::OutputRows;
        use crate::shellproto::OutputLine;
        let d = tempfile::tempdir().unwrap();
        let (mut s, _) = Store::open(d.path()).unwrap();
        let mut mem = Kept::default();
        let chunk = |i: usize| OutputLine::text(0, "stdout", format!("{i:06}"));
        let running = |first: usize, upto: usize, base: usize, batches: Vec<(u32, u64)>| OutputRows {
            new: (first..upto).map(chunk).collect(),
            first,
            base,
            batches,
            trim: base > 0,
        };
        let mut commit = |s: &mut Store, r: JobRecord| {
            let b = batch(vec![r], 0, 0, 5);
            s.commit(&b).unwrap();
            mem.apply(&b).unwrap();
            mem.clone()
        };
        let mut r = record(5, 0, &["submit"], true);
        r.state = JobState::Run;
        r.rows = running(0, 3, 0, vec![(1, 1), (2, 1)]);
        commit(&mut s, r);
        let mut r = record(5, 1, &[], false);
        r.state = JobState::Run;
        r.rows = running(3, 5, 0, vec![(1, 2)]);
        let want = commit(&mut s, r);
        let rows =
            |s: &Store| -> i64 { s.conn.query_row("SELECT COUNT(*) FROM job_output", [], |r| r.get(0)).unwrap() };
        assert_eq!(rows(&s), 2);
        drop(s);
        let (mut s, kept) = Store::open(d.path()).unwrap();
        let kept = kept.unwrap();
        assert_eq!(kept, want);
        assert_eq!(kept.jobs[&JobId(5)].output, (0..5).map(chunk).collect::<Vec<_>>());
        assert_eq!(kept.jobs[&JobId(5)].batches, [(1, 2), (2, 1)].into_iter().collect());
        // Rank 0 dropped chunks 0-3 (past its bound): the rows wholly before chunk 4 go, so that the file stays
        // bounded; what is read back is bounded by bytes as rank 0 holds it (`KeptJob::bound_output`).
        let mut r = record(5, 1, &[], false);
        r.state = JobState::Run;
        r.rows = running(5, 7, 4, vec![(1, 3), (2, 1)]); // every shell's number (`OutputRows::batches`)
        let want = commit(&mut s, r);
        assert_eq!(rows(&s), 2, "the first row went, the one holding chunk 4 stays");
        drop(s);
        let (mut s, kept) = Store::open(d.path()).unwrap();
        assert_eq!(kept.unwrap().jobs[&JobId(5)].batches, want.jobs[&JobId(5)].batches);
        // Job 6 prints 8 chunks of 200 kB, then 4 more as it ends: INACTIVE, it keeps its last 1 MiB, the last 5
        // chunks (`INACTIVE_OUTPUT_KEEP`); the row wholly before them goes.
        let big = |i: usize| OutputLine::text(0, "stdout", format!("{i:06}{}", "x".repeat(200_000)));
        let rows6 = |first: usize, upto: usize, base: usize| OutputRows {
            new: (first..upto).map(big).collect(),
            first,
            base,
            batches: vec![],
            trim: base > 0,
        };
        let mut r = record(6, 0, &["submit"], true);
        r.state = JobState::Run;
        r.rows = rows6(0, 4, 0);
        commit(&mut s, r);
        let mut r = record(6, 1, &[], false);
        r.state = JobState::Run;
        r.rows = rows6(4, 8, 0);
        commit(&mut s, r);
        let mut r = record(6, 1, &["clean"], false);
        r.state = JobState::Inactive;
        r.rows = rows6(8, 12, 7);
        let want = commit(&mut s, r);
        let k = &want.jobs[&JobId(6)];
        assert_eq!((k.output_base, k.output.len()), (7, 5), "the tail rank 0 holds");
        let rows6: i64 = s.conn.query_row("SELECT COUNT(*) FROM job_output WHERE id = 6", [], |r| r.get(0)).unwrap();
        assert_eq!(rows6, 2, "chunks 0-3 went; 4-7 and 8-11 stay");
        drop(s);
        let (_s, kept) = Store::open(d.path()).unwrap();
        // (Job 5's rows were cut at an index of this test's choosing, not by bytes: not compared.)
        assert!(kept.unwrap().jobs[&JobId(6)] == want.jobs[&JobId(6)], "job 6 as kept in memory");
    }

    /// A file of an older schema as that schema's Vigil wrote it: job 1 submitted (two events, one row each).
    fn old_store(dir: &Path, version: i64, b: &Journal) {
        let c = Connection::open(dir.join(FILE)).unwrap();
        c.pragma_update(None, "journal_mode", "WAL").unwrap();
        let output = if version >= 2 { RUNNING_OUTPUT_TABLES } else { "" };
        c.execute_batch(&format!(
            "PRAGMA application_id = {APPLICATION_ID};
             PRAGMA user_version = {version};
             CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
             CREATE TABLE jobs(id INTEGER PRIMARY KEY, userid INTEGER NOT NULL, state TEXT NOT NULL,
                               jobspec TEXT NOT NULL, R TEXT, status INTEGER, output TEXT);
             CREATE TABLE job_events(id INTEGER NOT NULL, seq INTEGER NOT NULL, event TEXT NOT NULL,
                                     PRIMARY KEY(id, seq)) WITHOUT ROWID;
             CREATE TABLE resource_events(seq INTEGER PRIMARY KEY, event TEXT NOT NULL);
             {output}"
        ))
        .unwrap();
        let r = &b.jobs[0];
        c.execute(
            "INSERT INTO jobs(id, userid, state, jobspec) VALUES(?1, ?2, ?3, ?4)",
            params![r.id.0 as i64, r.userid, r.state.name(), r.jobspec.as_deref().unwrap()],
        )
        .unwrap();
        for (i, e) in r.events.iter().enumerate() {
            c.execute(
                "INSERT INTO job_events(id, seq, event) VALUES(?1, ?2, ?3)",
                params![r.id.0 as i64, i as i64, e.to_line()],
            )
            .unwrap();
        }
        for (k, v) in [("epoch", b.epoch.to_string()), ("last_id", b.last_id.0.to_string())] {
            c.execute("INSERT INTO meta(key, value) VALUES(?1, ?2)", params![k, v]).unwrap();
        }
    }

    /// Stores of schemas 1 and 2 (the jobspec in `jobs`; 1 without running jobs' output) are brought to this
    /// one, their jobs as they were, and written on as usual.
    #[test]
    fn older_schemas_are_brought_to_this_one() {
        for version in [1, 2] {
            let d = tempfile::tempdir().unwrap();
            let b = batch(vec![record(1, 0, &["submit", "validate"], true)], 0, 0, 1);
            old_store(d.path(), version, &b);
            let mut mem = Kept::default();
            mem.apply(&b).unwrap();
            let (mut s, kept) = Store::open(d.path()).unwrap();
            assert_eq!(kept.as_ref(), Some(&mem), "schema {version}");
            let v: i64 = s.conn.query_row("PRAGMA user_version", [], |r| r.get(0)).unwrap();
            assert_eq!(v, SCHEMA_VERSION);
            let cols: Vec<String> = s
                .conn
                .prepare("SELECT name FROM pragma_table_info('jobs')")
                .unwrap()
                .query_map([], |r| r.get(0))
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap();
            assert!(!cols.contains(&"jobspec".to_string()), "{cols:?}");
            let mut r = record(1, 2, &["depend", "alloc"], false);
            r.rows.new = vec![crate::shellproto::OutputLine::text(0, "stdout", "hi".into())];
            let b2 = batch(vec![r, record(2, 0, &["submit"], true)], 0, 0, 2);
            s.commit(&b2).unwrap();
            mem.apply(&b2).unwrap();
            drop(s);
            let (_, kept) = Store::open(d.path()).unwrap();
            assert_eq!(kept.as_ref(), Some(&mem), "schema {version}, written on");
        }
    }

    /// A job's events of one write are one row; rows of one event (older stores) and of several read alike.
    #[test]
    fn the_events_of_one_write_are_one_row() {
        let d = tempfile::tempdir().unwrap();
        let (mut s, _) = Store::open(d.path()).unwrap();
        let mut mem = Kept::default();
        for b in [
            batch(vec![record(7, 0, &["submit", "validate", "depend", "priority"], true)], 0, 0, 7),
            batch(vec![record(7, 4, &["alloc"], false)], 0, 0, 7),
            batch(vec![record(7, 5, &["start", "finish", "release"], false)], 0, 0, 7),
        ] {
            s.commit(&b).unwrap();
            mem.apply(&b).unwrap();
        }
        let rows: i64 = s.conn.query_row("SELECT COUNT(*) FROM job_events", [], |r| r.get(0)).unwrap();
        assert_eq!(rows, 3);
        drop(s);
        let (_, kept) = Store::open(d.path()).unwrap();
        assert_eq!(kept.as_ref(), Some(&mem));
        assert_eq!(mem.jobs[&JobId(7)].eventlog.len(), 8);
    }

    /// The records of one job folded at once are one write of its row and one row of its events; the file reads
    /// back as the records written one by one would.
    #[test]
    fn a_jobs_records_of_one_fold_are_written_at_once() {
        let d = tempfile::tempdir().unwrap();
        let (mut s, _) = Store::open(d.path()).unwrap();
        let mut mem = Kept::default();
        let mut alloc = record(7, 4, &["alloc"], false);
        alloc.state = JobState::Run;
        alloc.r = Some(json!({"version": 1}));
        let mut done = record(7, 5, &["start", "finish", "release"], false);
        done.state = JobState::Inactive;
        done.status = Some(256);
        let batches = [
            batch(vec![record(7, 0, &["submit", "validate", "depend", "priority"], true)], 0, 0, 7),
            batch(vec![record(8, 0, &["submit"], true), alloc], 0, 0, 8),
            batch(vec![done], 0, 1, 8),
        ];
        for b in &batches {
            mem.apply(b).unwrap();
        }
        let refs: Vec<&Journal> = batches.iter().collect();
        s.fold(&refs, 3).unwrap();
        let rows: i64 = s.conn.query_row("SELECT COUNT(*) FROM job_events WHERE id = 7", [], |r| r.get(0)).unwrap();
        assert_eq!(rows, 1, "job 7's eight events in one row");
        drop(s);
        let (_, kept) = Store::open(d.path()).unwrap();
        assert_eq!(kept.as_ref(), Some(&mem));
        let j = &mem.jobs[&JobId(7)];
        assert_eq!((j.eventlog.len(), j.state, j.status), (8, JobState::Inactive, Some(256)));
        assert_eq!(j.r, None, "the last record that writes the row says R, as when written one by one");
    }

    #[test]
    fn a_damaged_or_foreign_file_is_refused_and_left_as_it_was() {
        let d = tempfile::tempdir().unwrap();
        let (mut s, _) = Store::open(d.path()).unwrap();
        s.commit(&batch(vec![record(1, 0, &["submit"], true)], 0, 0, 1)).unwrap();
        drop(s);
        let path = d.path().join(FILE);
        let good = std::fs::read(&path).unwrap();
        let mut cases: Vec<(&str, Vec<u8>)> = Vec::new();
        let mut v = good.clone();
        v[60..64].copy_from_slice(&99u32.to_be_bytes()); // user_version
        cases.push(("schema version 99", v));
        let mut v = good.clone();
        v[68..72].copy_from_slice(&7u32.to_be_bytes()); // application_id
        cases.push(("not a Vigil state store", v));
        cases.push(("", good[..good.len() / 2].to_vec()));
        cases.push(("", b"this is not a database at all, just some text that is long enough".repeat(100)));
        // Emptied: not a new start (that would forget the ids given).
        cases.push(("the file is empty", Vec::new()));
        for (want, bytes) in cases {
            std::fs::write(&path, &bytes).unwrap();
            match Store::open(d.path()) {
                Err(OpenError::Damaged { path: p, why }) => {
                    assert_eq!(p, path);
                    assert!(why.contains(want), "{why} (wanted {want:?})");
                }
                other => panic!("{want:?}: opened: {other:?}"),
            }
            assert_eq!(std::fs::read(&path).unwrap(), bytes, "{want:?}: the file is left as it was");
        }
    }

    /// The store keeps every job's environment and output: its directory and file are its owner's alone.
    #[test]
    fn a_new_store_is_private_to_its_owner() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("state");
        Store::open(&dir).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&dir.join(FILE)), 0o600);
        assert!(!dir.join(format!("{FILE}.new")).exists());
    }

    #[test]
    fn a_directory_that_cannot_be_written_is_refused_naming_it() {
        let d = tempfile::tempdir().unwrap();
        let file = d.path().join("plain-file");
        std::fs::write(&file, "x").unwrap();
        let dir = file.join("state");
        match Store::open(&dir) {
            Err(e @ OpenError::Unwritable { .. }) => assert!(e.to_string().contains(&dir.display().to_string()), "{e}"),
            other => panic!("{other:?}"),
        }
    }

    /// One step of [`folds_round_trip`]: (job, events, row written, state, status, output chunks, purge).
    type Step = (u64, usize, bool, usize, Option<i32>, usize, bool);

    /// The record `step` makes of job `id` given what `mem` holds of it (None: the step is skipped).
    fn step_record(mem: &Kept, (id, n, row, state, status, out, _): Step, i: usize) -> JobRecord {
        use crate::jobs::journal::OutputRows;
        use crate::shellproto::OutputLine;
        let kept = mem.jobs.get(&JobId(id));
        let first = kept.map_or(0, |k| k.eventlog.len());
        let names: Vec<String> = (0..n).map(|k| format!("e{i}.{k}")).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let mut r = record(id, first, &names, kept.is_none());
        r.row = kept.is_none() || row;
        // A record says a new state only with its row (the job core writes the row when the state changes), and
        // a job's state only moves on.
        let states = [JobState::Sched, JobState::Run, JobState::Cleanup, JobState::Inactive];
        let now = kept.and_then(|k| states.iter().position(|s| *s == k.state)).unwrap_or(0);
        r.state = states[if r.row { state.max(now) } else { now }];
        if r.row {
            r.status = status;
            r.r = (state > 0).then(|| json!({"version": 1, "step": i}));
        }
        let done = kept.map_or(0, |k| k.output_base + k.output.len());
        if out > 0 {
            r.rows = OutputRows {
                new: (0..out).map(|k| OutputLine::text(0, "stdout", format!("{i}.{k}"))).collect(),
                first: done,
                base: 0,
                batches: vec![(0, i as u64)],
                trim: false,
            };
        }
        r
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]
        /// Any sequence of batches, folded in groups of any size (each job's records of a group merged,
        /// `write_jobs`), purges included, reads back as the in-memory store holds it after applying them one by one.
        #[test]
        fn folds_round_trip(
            plan in proptest::collection::vec(
                (
                    0u64..5,
                    0usize..3,
                    any::<bool>(),
                    0usize..4,
                    proptest::option::of(0i32..3),
                    0usize..3,
                    proptest::bool::weighted(0.1),
                ),
                1..30,
            ),
            cuts in proptest::collection::vec(1usize..6, 1..30),
        ) {
            let d = tempfile::tempdir().unwrap();
            let (mut s, _) = Store::open(d.path()).unwrap();
            let mut mem = Kept::default();
            let mut purged = std::collections::BTreeSet::new();
            let mut group: Vec<Journal> = Vec::new();
            let mut cuts = cuts.into_iter().cycle();
            let mut size = cuts.next().unwrap_or(1);
            let mut seq = 0;
            for (i, step) in plan.into_iter().enumerate() {
                let id = step.0;
                if purged.contains(&id) {
                    continue;
                }
                let mut b = batch(vec![], 0, 0, mem.last_id.0.max(id));
                if step.6 && mem.jobs.contains_key(&JobId(id)) {
                    b.purged.push(JobId(id));
                    purged.insert(id);
                } else {
                    b.jobs.push(step_record(&mem, step, i));
                }
                mem.apply(&b).unwrap();
                group.push(b);
                if group.len() >= size {
                    seq += group.len() as u64;
                    let refs: Vec<&Journal> = group.iter().collect();
                    s.fold(&refs, seq).unwrap();
                    group.clear();
                    size = cuts.next().unwrap_or(1);
                }
            }
            if !group.is_empty() {
                seq += group.len() as u64;
                let refs: Vec<&Journal> = group.iter().collect();
                s.fold(&refs, seq).unwrap();
            }
            drop(s);
            let (_, kept) = Store::open(d.path()).unwrap();
            prop_assert_eq!(kept.as_ref(), Some(&mem));
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(16))]
        /// Any sequence of batches reads back as the in-memory store holds it, across reopenings.
        #[test]
        fn batches_round_trip(plan in proptest::collection::vec((0u64..6, 1usize..4, any::<bool>()), 1..20)) {
            let d = tempfile::tempdir().unwrap();
            let (mut s, _) = Store::open(d.path()).unwrap();
            let mut mem = Kept::default();
            let mut res = 0;
            for (i, (id, n, reopen)) in plan.into_iter().enumerate() {
                let first = mem.jobs.get(&JobId(id)).map_or(0, |k| k.eventlog.len());
                let names: Vec<String> = (0..n).map(|k| format!("e{i}.{k}")).collect();
                let names: Vec<&str> = names.iter().map(String::as_str).collect();
                let b = batch(vec![record(id, first, &names, first == 0)], res, i % 2, id.max(mem.last_id.0));
                res += i % 2;
                s.commit(&b).unwrap();
                mem.apply(&b).unwrap();
                if reopen {
                    drop(s);
                    let (s2, kept) = Store::open(d.path()).unwrap();
                    prop_assert_eq!(kept.as_ref(), Some(&mem));
                    s = s2;
                }
            }
        }
    }
}
