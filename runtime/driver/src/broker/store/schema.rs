//! The store's tables: making a new, empty store, checking that a file is one this build reads, and bringing older
//! schemas to [`SCHEMA_VERSION`](super::SCHEMA_VERSION). Opening is in `mod.rs`; the rows are written in `write.rs`
//! and read in `read.rs`.

use std::path::Path;

use rusqlite::Connection;

use super::{APPLICATION_ID, FILE, SCHEMA_VERSION};

/// Make a new, empty store at `path` (in `dir`, made private to its owner: it keeps every job's environment and
/// output): written in full as `FILE.new`, closed (which folds its WAL into it), synced, renamed into place, the
/// directory synced.
pub(crate) fn make_new(dir: &Path, path: &Path) -> Result<(), String> {
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

/// The table schema 2 added to schema 1: the output of jobs as they run. Keyed by `upto` too: a row of batch
/// numbers alone (no chunks) and the row of chunks written after it start at the same `seq`.
pub(crate) const RUNNING_OUTPUT_TABLES: &str = "
    CREATE TABLE job_output(id INTEGER NOT NULL, seq INTEGER NOT NULL, upto INTEGER NOT NULL, lines TEXT NOT NULL,
                            batches TEXT, PRIMARY KEY(id, seq, upto)) WITHOUT ROWID;";

/// The tables schema 3 made or remade: `jobs` without its jobspec (a row of `jobs` is rewritten at every change
/// of state, a jobspec is written once and is kilobytes), `jobspecs`, and `ranks` (each rank's node).
const SCHEMA_3_TABLES: &str = "
    CREATE TABLE jobs(id INTEGER PRIMARY KEY, userid INTEGER NOT NULL, state TEXT NOT NULL, R TEXT,
                      status INTEGER, output TEXT);
    CREATE TABLE jobspecs(id INTEGER PRIMARY KEY, jobspec TEXT NOT NULL);
    CREATE TABLE ranks(rank INTEGER PRIMARY KEY, hostname TEXT NOT NULL, cores TEXT NOT NULL, gpus TEXT NOT NULL);";

/// What schema 4 changed in schema 3: the client's submission key beside each job's jobspec (NULL: none).
const SCHEMA_4_CHANGE: &str = "
    ALTER TABLE jobspecs ADD COLUMN submit_key TEXT;";

/// What schema 5 added to schema 4: the job history (`jobs/history.rs`), one row per ended job, its record as
/// JSON, indexed by end time for queries by time range.
const SCHEMA_5_CHANGE: &str = "
    CREATE TABLE history(id INTEGER PRIMARY KEY, t_inactive REAL NOT NULL, record TEXT NOT NULL);
    CREATE INDEX history_by_end ON history(t_inactive);";

/// What schema 6 added to schema 5: a guest's munge credential beside its job's jobspec, the JSON of
/// [`ImpCredential`](crate::shellproto::ImpCredential) (the credential and the jobspec text it covers; NULL: none).
const SCHEMA_6_CHANGE: &str = "
    ALTER TABLE jobspecs ADD COLUMN credential TEXT;";

/// Bring a store of schema 1 to 5 (checked by [`check`]) to [`SCHEMA_VERSION`], in one transaction: none of
/// it is changed if any step fails.
pub(crate) fn upgrade(c: &Connection) -> rusqlite::Result<()> {
    let version: i64 = c.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if version == SCHEMA_VERSION {
        return Ok(());
    }
    let output = if version == 1 { RUNNING_OUTPUT_TABLES } else { "" };
    let to_3 = if version < 3 {
        format!(
            "{output}
             ALTER TABLE jobs RENAME TO jobs_2;
             {SCHEMA_3_TABLES}
             INSERT INTO jobs(id, userid, state, R, status, output)
                 SELECT id, userid, state, R, status, output FROM jobs_2;
             INSERT INTO jobspecs(id, jobspec) SELECT id, jobspec FROM jobs_2;
             DROP TABLE jobs_2;"
        )
    } else {
        String::new()
    };
    let to_4 = if version < 4 { SCHEMA_4_CHANGE } else { "" };
    let to_5 = if version < 5 { SCHEMA_5_CHANGE } else { "" };
    let r = c.execute_batch(&format!(
        "BEGIN;
         {to_3}
         {to_4}
         {to_5}
         {SCHEMA_6_CHANGE}
         PRAGMA user_version = {SCHEMA_VERSION};
         COMMIT;"
    ));
    if r.is_err() {
        let _ = c.execute_batch("ROLLBACK");
    }
    r
}

/// A new store's schema.
pub(crate) fn create(c: &Connection) -> rusqlite::Result<()> {
    c.pragma_update(None, "journal_mode", "WAL")?;
    c.execute_batch(&format!(
        "PRAGMA application_id = {APPLICATION_ID};
         PRAGMA user_version = {SCHEMA_VERSION};
         BEGIN;
         CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
         {SCHEMA_3_TABLES}
         {SCHEMA_4_CHANGE}
         {SCHEMA_5_CHANGE}
         {SCHEMA_6_CHANGE}
         CREATE TABLE job_events(id INTEGER NOT NULL, seq INTEGER NOT NULL, event TEXT NOT NULL,
                                 PRIMARY KEY(id, seq)) WITHOUT ROWID;
         CREATE TABLE resource_events(seq INTEGER PRIMARY KEY, event TEXT NOT NULL);
         {RUNNING_OUTPUT_TABLES}
         COMMIT;"
    ))
}

/// An existing file: ours, of our schema, undamaged. Nothing is written to it here.
pub(crate) fn check(c: &Connection) -> Result<(), String> {
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
