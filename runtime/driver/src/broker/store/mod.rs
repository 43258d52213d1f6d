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
//! - `jobspecs(id, jobspec, submit_key, credential)`: each job's jobspec (JSON) as submitted, written once (since
//!   schema 3; before, a column of `jobs`, rewritten with every change of the row: a jobspec carries the
//!   submitter's environment, kilobytes), with the client's submission key (`jobs/submit_key.rs`; NULL without
//!   one, and in rows written before schema 4), so that a submission sent again after a restart finds its job, and
//!   a guest's munge credential with the jobspec text it covers (JSON `{"credential", "jobspec"}`; NULL without
//!   one, and in rows written before schema 6), so that a restarted rank 0 can still start the job through
//!   `vigil-imp`;
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
//!   rank 0 counts ranks that have not joined again yet (since schema 3);
//! - `history(id, t_inactive, record)`: every ended job's history record (`jobs/history.rs`, JSON), kept after the
//!   job is purged, until the history's own retention removes it (since schema 5).
//!
//! Older schemas are brought to this one at open, in one transaction: 1 (before `job_output`) by adding it, 2
//! (the jobspec in `jobs`) by moving the jobspecs to their table, 3 (no submission keys) by adding the column,
//! 4 (no history) by adding the table (the restore then writes a record for each INACTIVE job kept), 5 (no
//! credentials) by adding the column.
//! Rows of one event each read the same in 3.
//!
//! A file this build cannot read (not SQLite, damaged, truncated, another schema version) is [`OpenError::Damaged`]:
//! rank 0 then runs without a store, with scheduling stopped and submissions refused, and leaves the file as it is
//! for an operator. A directory that cannot be written is [`OpenError::Unwritable`]: rank 0 does not start.
//!
//! This file holds [`Store`]: opening it (and folding the redo log left by a crash), committing and folding
//! batches; its neighbours:
//!
//! | file | holds |
//! |------|-------|
//! | `lock.rs` | the state directory's lock ([`LOCK`]): one rank 0 per directory |
//! | `schema.rs` | the tables: creating a new store, checking an old one, upgrading older schemas |
//! | `write.rs` | writing a fold's records (jobs, events, output, meta) |
//! | `read.rs` | reading back what the file keeps, at open |
//! | `tests.rs` | unit tests (their `batch` and `record` also serve `statedir_io.rs`) |

use crate::jobs::journal::{Journal, Kept};
use crate::jobs::JobId;
use rusqlite::{params, Connection, OpenFlags, OptionalExtension};
use std::path::{Path, PathBuf};

mod lock;
mod read;
mod schema;
#[cfg(test)]
pub(super) mod tests;
mod write;

use lock::lock;
pub use lock::LOCK;
#[cfg(test)]
use schema::RUNNING_OUTPUT_TABLES;
use schema::{check, make_new, upgrade};
use write::{write_jobs, write_meta_kept};

/// The store's file name in the state directory.
pub const FILE: &str = "vigil.sqlite";

/// The schema this build writes and reads (`PRAGMA user_version`).
pub const SCHEMA_VERSION: i64 = 6;

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
