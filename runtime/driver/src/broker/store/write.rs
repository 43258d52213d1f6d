//! Writing a fold of the redo log into the store: each job's records at once (its row, jobspec, events and output
//! rows), then what is not a job's (meta, the resource eventlog, ranks). [`Store::fold`](super::Store::fold)
//! (`mod.rs`) wraps these in one transaction; `read.rs` reads the rows back.

use std::collections::BTreeMap;

use rusqlite::{params, Connection};

use super::CommitError;
use crate::jobs::journal::{JobRecord, Journal};
use crate::jobs::JobId;

/// Write what batch `b` holds besides its jobs' records ([`write_rest`]), given what the file held of its meta
/// rows (`kept`: the highest job id it holds and the epoch's bits, see [`Store::meta_kept`]); returns what it
/// holds after. The jobs' rows of the fold ([`write_jobs`]) are written already.
pub(crate) fn write_meta_kept(
    c: &Connection,
    b: &Journal,
    kept: Option<(JobId, u64)>,
) -> Result<(JobId, u64), CommitError> {
    // The highest id the file will hold without a `last_id` row: the one kept, or a new job's row.
    let new_rows = b.jobs.iter().filter(|r| r.jobspec.is_some()).map(|r| r.id).max();
    let covered = kept.map(|(id, _)| id).max(new_rows).unwrap_or_default();
    let write_meta =
        kept.map(|(_, epoch)| epoch) != Some(b.epoch.to_bits()) || !b.purged.is_empty() || covered < b.last_id;
    write_history(c, b)?;
    write_rest(c, b, write_meta)?;
    Ok((if write_meta { b.last_id.max(covered) } else { covered }, b.epoch.to_bits()))
}

/// The jobs' records of `batches` (one fold, in order), inside its transaction, job by job in id order: one
/// write of the job's row with what its last record says (the insert with its jobspec if a record adds the
/// job), its events in one row per run of consecutive ones, and its output's rows record by record. The file
/// ends as it would with each record written in turn (`Kept::apply`), in a third of the statements for a job
/// whose submission, start and end fall in one fold: the writer thread's cost per job on a busy rank 0.
pub(crate) fn write_jobs(c: &Connection, batches: &[&Journal]) -> Result<(), CommitError> {
    let mut by_job: BTreeMap<JobId, Vec<&JobRecord>> = BTreeMap::new();
    for r in batches.iter().flat_map(|b| &b.jobs) {
        by_job.entry(r.id).or_default().push(r);
    }
    let mut new_job = c.prepare_cached(
        "INSERT INTO jobs(id, userid, state, R, status, output) VALUES(?1, ?2, ?3, ?4, ?5, ?6)
         ON CONFLICT(id) DO UPDATE SET state = excluded.state, R = excluded.R, status = excluded.status,
         output = COALESCE(excluded.output, output)",
    )?;
    let mut jobspec = c.prepare_cached(
        "INSERT OR REPLACE INTO jobspecs(id, jobspec, submit_key, credential) VALUES(?1, ?2, ?3, ?4)",
    )?;
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
        let spec = records.iter().rev().find(|r| r.jobspec.is_some());
        let last = records.iter().rev().find(|r| r.jobspec.is_some() || r.row || r.output.is_some());
        if let Some(last) = last {
            let rv = last.r.as_ref().map(|v| v.to_string());
            let output = records
                .iter()
                .rev()
                .find_map(|r| r.output.as_ref())
                .map(|o| serde_json::to_string(o).unwrap_or_else(|_| "[]".into()));
            match spec {
                Some(first) => {
                    new_job.execute(params![id, i64::from(last.userid), last.state.name(), rv, last.status, output])?;
                    let cred = first.credential.as_ref().and_then(|c| serde_json::to_string(&**c).ok());
                    jobspec.execute(params![id, first.jobspec.as_deref(), first.submit_key.as_deref(), cred])?;
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

/// The history records batch `b` adds and removes (`jobs/history.rs`), in its order: added first.
fn write_history(c: &Connection, b: &Journal) -> Result<(), CommitError> {
    if b.history.is_empty() && b.history_expired.is_empty() {
        return Ok(());
    }
    let mut add = c.prepare_cached("INSERT OR REPLACE INTO history(id, t_inactive, record) VALUES(?1, ?2, ?3)")?;
    for r in &b.history {
        let text = serde_json::to_string(&**r).map_err(|e| CommitError {
            why: format!("history record of job {}: {e}", r.id),
            errno: crate::message::errno::EIO,
        })?;
        add.execute(params![r.id.0 as i64, r.t_inactive, text])?;
    }
    let mut del = c.prepare_cached("DELETE FROM history WHERE id = ?1")?;
    for id in &b.history_expired {
        del.execute(params![id.0 as i64])?;
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
