//! Reading back what the store keeps, at open: meta, jobs (with their jobspecs, eventlogs and the output kept), the
//! resource eventlog and the ranks. [`Store::open`](super::Store::open) (`mod.rs`) calls it; `write.rs` writes
//! the rows.

use rusqlite::{Connection, OptionalExtension};

use super::{Store, OUTPUT_READ};
use crate::eventlog::Event;
use crate::jobs::journal::{Kept, KeptJob, KeptRank};
use crate::jobs::{JobId, JobState};

impl Store {
    /// Everything kept, or `None` when nothing was ever committed.
    pub(crate) fn load(&self) -> Result<Option<Kept>, String> {
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
            .prepare(
                "SELECT id, userid, state, jobspec, R, status, submit_key, credential FROM jobs LEFT JOIN jobspecs \
                 USING(id)",
            )
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
            job.submit_key = r.get(6).map_err(s)?;
            let cred: Option<String> = r.get(7).map_err(s)?;
            job.credential =
                cred.map(|t| serde_json::from_str(&t)).transpose().map_err(|e| format!("job {id}: credential: {e}"))?;
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
        let mut q = c.prepare("SELECT id, record FROM history ORDER BY t_inactive, id").map_err(s)?;
        let mut rows = q.query([]).map_err(s)?;
        while let Some(r) = rows.next().map_err(s)? {
            let id: i64 = r.get(0).map_err(s)?;
            let text: String = r.get(1).map_err(s)?;
            kept.history.push(serde_json::from_str(&text).map_err(|e| format!("history record of job {id}: {e}"))?);
        }
        Ok(Some(kept))
    }
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
