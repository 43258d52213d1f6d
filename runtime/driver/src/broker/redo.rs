//! The state directory's redo log: rank 0's journal batches (`jobs/journal.rs`), appended to a plain file as the
//! loop takes them, before anything they led to is carried out; folded into the SQLite store (`store.rs`) in
//! large transactions by the writer thread, off the loop; replayed into the store at the next start.
//!
//! Why a log in front of SQLite: a job waits in its life for two writes of the journal (its shell's start, its
//! exit report's acknowledgement), each on the path from one job to the next. A SQLite transaction writes every
//! page it touches into SQLite's own log (a few 4 KiB pages for one small batch, 0.1 to 0.3 ms on the loop with
//! 4 brokers busy on 2 cores), and it cost 13 % of end-to-end job throughput; one append of the batch's record
//! here is one `write` of a few hundred bytes (a few microseconds). See docs/statedir.md for the numbers.
//!
//! Files: `DIR/vigil.redo.N` (N counts up from 1, six digits), the segments, each up to [`SEGMENT_BYTES`] and
//! then sealed (the next is started). A segment is removed once the store holds all of it durably (`redo_seq` in
//! the store's `meta`: the last record folded, in the same transaction). A record is one line:
//! `CRC32 SPACE JSON (TAB JOBSPEC)* NEWLINE`: the CRC-32 (8 hex digits) of what follows the space, the JSON a
//! batch (`Record`) with its sequence number (counted across segments and restarts, from 1), then the jobspec
//! of each job the batch adds, as its JSON text.
//!
//! Crash contract (the store's, see `store.rs`): a record whose `write` returned survives `kill -9` of rank 0 (it
//! is in the page cache); it survives a power cut once an fsync ([`SyncWork`], on the store thread) covers it,
//! and only then is a submission in it answered. At start ([`read`]), records are taken in order until the first
//! that is torn (no newline, bad checksum, unreadable) or out of sequence; what follows it is dropped, and
//! logged: a power cut tears only records no fsync covered, and no later record was acknowledged either (each
//! fsync covers every record written before it, in every segment: [`RedoLog::sync_work`]). The same rule as
//! SQLite's own log.

use crate::eventlog::Event;
use crate::jobs::history::HistoryRecord;
use crate::jobs::journal::{JobRecord, Journal, KeptRank, OutputRows};
use crate::jobs::{JobId, JobState};
use crate::shellproto::OutputLine;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::borrow::Cow;
use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::store::CommitError;

/// A segment's file name before its number.
pub const PREFIX: &str = "vigil.redo.";

/// A segment is sealed, and the next one started, once it is this long (bytes): 4 MiB, about 1,500 jobs' whole
/// lives (a jobspec with its environment is most of a job's records).
pub const SEGMENT_BYTES: u64 = 4 << 20;

/// One batch as a record of the log (JSON): the fields of [`Journal`], events as their RFC 18 objects.
#[derive(Serialize, Deserialize)]
struct Record<'a> {
    seq: u64,
    #[serde(borrow)]
    jobs: Vec<RecordJob<'a>>,
    resource_first: usize,
    resource_events: Vec<Cow<'a, Event>>,
    last_id: u64,
    epoch: f64,
    purged: Vec<u64>,
    /// (rank, hostname, cores, GPUs): the idsets as RFC 22 strings.
    ranks: Vec<(u32, Cow<'a, str>, String, String)>,
    /// History records added (`jobs/history.rs`); absent from records written before the history was.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    history: Vec<Cow<'a, HistoryRecord>>,
    /// History records removed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    history_expired: Vec<u64>,
}

/// One job's record in a [`Record`] ([`JobRecord`]).
#[derive(Serialize, Deserialize)]
struct RecordJob<'a> {
    id: u64,
    userid: u32,
    state: JobState,
    /// Its jobspec follows the JSON of the record, raw (see [`encode`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    raw_jobspec: bool,
    /// Its jobspec, in the JSON, when it cannot go raw (it holds a tab or a newline: never the compact JSON
    /// the job core keeps).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    jobspec: Option<Cow<'a, str>>,
    /// The client's submission key (`jobs/submit_key.rs`), with the jobspec; absent without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    submit_key: Option<Cow<'a, str>>,
    /// A guest's munge credential and the jobspec text it covers, with the jobspec; absent without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    credential: Option<Cow<'a, crate::shellproto::ImpCredential>>,
    first_event: usize,
    events: Vec<Cow<'a, Event>>,
    row: bool,
    // What most records of a job leave at its default is not written (a shorter line, less to serialize).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    r: Option<Cow<'a, Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    status: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    output: Option<Cow<'a, [OutputLine]>>,
    #[serde(default, skip_serializing_if = "is_empty")]
    new: Cow<'a, [OutputLine]>,
    #[serde(default, skip_serializing_if = "is_zero")]
    first: usize,
    #[serde(default, skip_serializing_if = "is_zero")]
    base: usize,
    #[serde(default, skip_serializing_if = "is_empty")]
    batches: Cow<'a, [(u32, u64)]>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    trim: bool,
}

/// serde's test for a list left out of a record when empty (it is handed the field, a `Cow`).
#[allow(clippy::ptr_arg)]
fn is_empty<T: Clone>(v: &Cow<'_, [T]>) -> bool {
    v.is_empty()
}

/// serde's test for a count left out of a record at 0.
#[allow(clippy::trivially_copy_pass_by_ref)]
fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl<'a> Record<'a> {
    /// Batch `b` as record number `seq`.
    fn of(seq: u64, b: &'a Journal) -> Record<'a> {
        let jobs = b
            .jobs
            .iter()
            .map(|j| RecordJob {
                id: j.id.0,
                userid: j.userid,
                state: j.state,
                raw_jobspec: j.jobspec.as_deref().is_some_and(raw),
                jobspec: j.jobspec.as_deref().filter(|t| !raw(t)).map(Cow::Borrowed),
                submit_key: j.submit_key.as_deref().map(Cow::Borrowed),
                credential: j.credential.as_deref().map(Cow::Borrowed),
                first_event: j.first_event,
                events: j.events.iter().map(|e| Cow::Borrowed(&**e)).collect(),
                row: j.row,
                r: j.r.as_ref().map(Cow::Borrowed),
                status: j.status,
                output: j.output.as_deref().map(Cow::Borrowed),
                new: Cow::Borrowed(&j.rows.new),
                first: j.rows.first,
                base: j.rows.base,
                batches: Cow::Borrowed(&j.rows.batches),
                trim: j.rows.trim,
            })
            .collect();
        Record {
            seq,
            jobs,
            resource_first: b.resource_first,
            resource_events: b.resource_events.iter().map(Cow::Borrowed).collect(),
            last_id: b.last_id.0,
            epoch: b.epoch,
            purged: b.purged.iter().map(|id| id.0).collect(),
            ranks: b
                .ranks
                .iter()
                .map(|(r, k)| (*r, Cow::Borrowed(k.hostname.as_str()), k.cores.to_string(), k.gpus.to_string()))
                .collect(),
            history: b.history.iter().map(|r| Cow::Borrowed(&**r)).collect(),
            history_expired: b.history_expired.iter().map(|id| id.0).collect(),
        }
    }

    /// The batch this record holds, with `raw`, the raw jobspecs that followed its JSON, in order.
    ///
    /// # Errors
    /// An idset that does not parse; raw jobspecs not one for each job that has one.
    fn into_journal(self, raw: &[&[u8]]) -> Result<Journal, String> {
        let mut jobs = Vec::with_capacity(self.jobs.len());
        let mut raw = raw.iter();
        for j in self.jobs {
            let jobspec = if j.raw_jobspec {
                let text = raw.next().ok_or_else(|| format!("job {}: its jobspec is missing", j.id))?;
                Some(Arc::from(std::str::from_utf8(text).map_err(|e| format!("job {}: jobspec: {e}", j.id))?))
            } else {
                j.jobspec.map(|s| Arc::from(s.into_owned()))
            };
            let events = j.events.into_iter().map(|e| Arc::new(e.into_owned())).collect();
            jobs.push(JobRecord {
                id: JobId(j.id),
                userid: j.userid,
                state: j.state,
                jobspec,
                submit_key: j.submit_key.map(|s| Arc::from(s.into_owned())),
                credential: j.credential.map(|c| Arc::new(c.into_owned())),
                first_event: j.first_event,
                events,
                row: j.row,
                r: j.r.map(Cow::into_owned),
                status: j.status,
                output: j.output.map(Cow::into_owned),
                rows: OutputRows {
                    new: j.new.into_owned(),
                    first: j.first,
                    base: j.base,
                    batches: j.batches.into_owned(),
                    trim: j.trim,
                },
            });
        }
        if raw.next().is_some() {
            return Err("more raw jobspecs than jobs with one".into());
        }
        let idset = |s: &str| crate::idset::IdSet::parse(s).map_err(|e| format!("idset '{s}': {e}"));
        let mut ranks = Vec::with_capacity(self.ranks.len());
        for (r, host, cores, gpus) in self.ranks {
            ranks.push((r, KeptRank { hostname: host.into_owned(), cores: idset(&cores)?, gpus: idset(&gpus)? }));
        }
        Ok(Journal {
            jobs,
            resource_first: self.resource_first,
            resource_events: self.resource_events.into_iter().map(Cow::into_owned).collect(),
            last_id: JobId(self.last_id),
            epoch: self.epoch,
            purged: self.purged.into_iter().map(JobId).collect(),
            ranks,
            history: self.history.into_iter().map(|r| Arc::new(r.into_owned())).collect(),
            history_expired: self.history_expired.into_iter().map(JobId).collect(),
            tick: 0,
        })
    }
}

/// Whether jobspec `text` can follow a record raw: it holds no tab (the separator) and no newline (the end of
/// the record). The compact JSON the job core keeps never does (serde_json escapes both inside strings).
fn raw(text: &str) -> bool {
    // memchr's vectorized scan: a jobspec with its environment is a few KiB, scanned for each record that adds it.
    memchr::memchr2(b'\t', b'\n', text.as_bytes()).is_none()
}

/// Batch `b` as record `seq`, one line (see the module documentation), into `buf` (cleared first): the record's
/// JSON, then each new job's jobspec, raw (it is JSON already: escaping it into a string cost the loop about a
/// tenth of its time per submission), after a tab.
pub fn encode(seq: u64, b: &Journal, buf: &mut Vec<u8>) {
    buf.clear();
    buf.extend_from_slice(b"00000000 ");
    // Writing JSON into a Vec cannot fail: every field serializes (maps have string keys).
    let _ = serde_json::to_writer(&mut *buf, &Record::of(seq, b));
    for text in b.jobs.iter().filter_map(|j| j.jobspec.as_deref()).filter(|t| raw(t)) {
        buf.push(b'\t');
        buf.extend_from_slice(text.as_bytes());
    }
    let crc = crc32fast::hash(&buf[9..]);
    buf[..8].copy_from_slice(format!("{crc:08x}").as_bytes());
    buf.push(b'\n');
}

/// Record `line` (without its newline): (sequence number, batch).
///
/// # Errors
/// Why it is not a whole record: too short, a bad checksum, JSON that is not a record.
pub fn decode(line: &[u8]) -> Result<(u64, Journal), String> {
    if line.len() < 10 || line[8] != b' ' {
        return Err(format!("a record of {} bytes", line.len()));
    }
    let want =
        std::str::from_utf8(&line[..8]).ok().and_then(|h| u32::from_str_radix(h, 16).ok()).ok_or("no checksum")?;
    let body = &line[9..];
    if crc32fast::hash(body) != want {
        return Err("checksum mismatch".into());
    }
    let mut parts = body.split(|&c| c == b'\t');
    let json = parts.next().unwrap_or_default();
    let raw: Vec<&[u8]> = parts.collect();
    let r: Record<'_> = serde_json::from_slice(json).map_err(|e| format!("not a record: {e}"))?;
    let seq = r.seq;
    Ok((seq, r.into_journal(&raw)?))
}

/// The segments in `dir`, in order: (number, path).
///
/// # Errors
/// The directory cannot be listed.
pub fn segments(dir: &Path) -> std::io::Result<Vec<(u64, PathBuf)>> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let name = e.file_name();
        let Some(n) = name.to_str().and_then(|n| n.strip_prefix(PREFIX)).and_then(|n| n.parse::<u64>().ok()) else {
            continue;
        };
        v.push((n, e.path()));
    }
    v.sort_unstable();
    Ok(v)
}

/// What [`read`] found in the segments of a state directory.
#[derive(Debug, Default)]
pub struct Replay {
    /// The records after the store's `redo_seq`, in order: (sequence number, batch).
    pub batches: Vec<(u64, Journal)>,
    /// Every segment read: removed once the store holds their records.
    pub segments: Vec<PathBuf>,
    /// What was dropped after a torn record, if anything (for the log).
    pub dropped: Option<String>,
}

/// Why the log cannot be replayed ([`read`]).
#[derive(Debug)]
pub enum ReadError {
    /// A segment cannot be listed or read.
    Io(String),
    /// The log is damaged, not torn: a bad record with whole ones after it, or records missing between the
    /// store's last and the log's first. Nothing is dropped: rank 0 starts with the store damaged.
    Damaged(String),
}

/// Read the records of `dir`'s segments that follow record `folded` (the store's `redo_seq`), up to the end of
/// the log or a torn tail: a bad record (no newline, a bad checksum, unreadable) with no whole record after it,
/// in its segment or a later one. Only a crash tears the log so (ext4 writes a file's new blocks before its
/// new size, and nothing after a torn record was acknowledged: each fsync covers every record before it).
///
/// # Errors
/// [`ReadError::Io`] when a segment cannot be read; [`ReadError::Damaged`] when a bad record is followed by whole
/// ones, or the first record after the store's is not `folded + 1` (the store lost changes it had committed, or
/// a segment was removed by hand), or records are out of sequence.
pub fn read(dir: &Path, folded: u64) -> Result<Replay, ReadError> {
    let mut out = Replay::default();
    let mut next = folded + 1;
    let mut torn: Option<(PathBuf, usize, String)> = None;
    let mut dropped_bytes = 0u64;
    for (_, path) in segments(dir).map_err(|e| ReadError::Io(format!("{}: {e}", dir.display())))? {
        let data = std::fs::read(&path).map_err(|e| ReadError::Io(format!("{}: {e}", path.display())))?;
        out.segments.push(path.clone());
        let mut at = 0usize;
        while at < data.len() {
            let end = data[at..].iter().position(|&c| c == b'\n').map(|n| at + n);
            let line = end.map(|e| decode(&data[at..e]));
            match (&torn, line) {
                // After a bad record: a whole one means damage, not a tear.
                (Some((bad, bad_at, why)), Some(Ok((seq, _)))) => {
                    return Err(ReadError::Damaged(format!(
                        "{}: {why} at byte {bad_at}, and a whole record ({seq}) follows it in {}: the redo log is \
                         damaged, not torn by a crash",
                        bad.display(),
                        path.display()
                    )));
                }
                (Some(_), _) => {}
                (None, Some(Ok((seq, _)))) if seq < next => {}
                (None, Some(Ok((seq, b)))) if seq == next => {
                    out.batches.push((seq, b));
                    next += 1;
                }
                (None, Some(Ok((seq, _)))) => {
                    let what = if next == folded + 1 {
                        format!(
                            "its first record is {seq}, but the store holds records up to {folded} only: the store \
                             lost changes it had committed (its files replaced or cut?), or a segment was removed"
                        )
                    } else {
                        format!("record {seq} where {next} was due")
                    };
                    return Err(ReadError::Damaged(format!("{}: {what}", path.display())));
                }
                (None, Some(Err(why))) => torn = Some((path.clone(), at, why)),
                (None, None) => torn = Some((path.clone(), at, "a record without its end".into())),
            }
            if torn.is_some() {
                dropped_bytes += (end.map_or(data.len(), |e| e + 1) - at) as u64;
            }
            at = end.map_or(data.len(), |e| e + 1);
        }
    }
    if let Some((path, at, why)) = torn {
        out.dropped = Some(format!(
            "{}: {why} at byte {at}: it and what follows ({dropped_bytes} bytes, no whole record) were never \
             acknowledged (torn by a crash before their fsync) and are dropped",
            path.display()
        ));
    }
    Ok(out)
}

/// A segment sealed (no more records go to it): removed once the store holds record `last` durably.
#[derive(Debug, Clone)]
pub struct Sealed {
    /// Its file.
    pub path: PathBuf,
    /// The last record in it (0: none).
    pub last: u64,
}

/// What one fsync must cover ([`RedoLog::sync_work`]): done on the store thread.
#[derive(Debug)]
pub struct SyncWork {
    /// The segments written since the last fsync (the current one last).
    pub files: Vec<Arc<File>>,
    /// The directory, when a segment was created since: so that its name survives a power cut.
    pub dir: Option<PathBuf>,
}

impl SyncWork {
    /// Do it: blocks for the disk's flushes (milliseconds).
    ///
    /// # Errors
    /// An fsync failed (`ENOSPC` for a full disk, `EIO` otherwise): what was appended since the last success may
    /// not survive a power cut.
    pub fn run(&self) -> Result<(), CommitError> {
        let err = |what: String, e: std::io::Error| CommitError {
            why: format!("{what}: {e}"),
            errno: if e.raw_os_error() == Some(libc::ENOSPC) {
                crate::message::errno::ENOSPC
            } else {
                crate::message::errno::EIO
            },
        };
        for f in &self.files {
            f.sync_data().map_err(|e| err("cannot sync the redo log".into(), e))?;
        }
        if let Some(d) = &self.dir {
            File::open(d).and_then(|d| d.sync_all()).map_err(|e| err(format!("cannot sync {}", d.display()), e))?;
        }
        Ok(())
    }
}

/// The loop's end of the redo log: appends records to the current segment.
#[derive(Debug)]
pub struct RedoLog {
    dir: PathBuf,
    /// The current segment, its number, path and length.
    file: Arc<File>,
    number: u64,
    path: PathBuf,
    len: u64,
    /// The sequence number of the last record appended (or folded before this start).
    seq: u64,
    /// Segments sealed since the last [`RedoLog::sync_work`] (their tails not yet synced).
    unsynced: Vec<Arc<File>>,
    /// A segment was created since the last [`RedoLog::sync_work`].
    dir_unsynced: bool,
    /// An append failed and its bytes could not be taken back: every later one fails too (a record after a torn
    /// one would never be read back).
    broken: Option<CommitError>,
    buf: Vec<u8>,
}

impl RedoLog {
    /// Start a new segment in `dir`, numbered after any there, whose first record follows record `folded` (the
    /// store's `redo_seq`: the last record it holds).
    ///
    /// # Errors
    /// The directory cannot be listed or the segment created.
    pub fn create(dir: &Path, folded: u64) -> std::io::Result<RedoLog> {
        let number = segments(dir)?.last().map_or(1, |(n, _)| n + 1);
        let (file, path) = Self::new_segment(dir, number)?;
        Ok(RedoLog {
            dir: dir.to_path_buf(),
            file,
            number,
            path,
            len: 0,
            seq: folded,
            unsynced: Vec::new(),
            dir_unsynced: true,
            broken: None,
            buf: Vec::with_capacity(16 << 10),
        })
    }

    /// Create segment `number` in `dir`, readable by its owner only (it holds the submitters' environments, as
    /// the store does).
    fn new_segment(dir: &Path, number: u64) -> std::io::Result<(Arc<File>, PathBuf)> {
        use std::os::unix::fs::OpenOptionsExt as _;
        let path = dir.join(format!("{PREFIX}{number:06}"));
        let f = std::fs::OpenOptions::new().append(true).create_new(true).mode(0o600).open(&path)?;
        Ok((Arc::new(f), path))
    }

    /// The sequence number of the last record appended.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Append batch `b` as the next record: it survives `kill -9` of rank 0 when this returns `Ok`. Returns its
    /// sequence number, and the segment sealed if this record started a new one.
    ///
    /// # Errors
    /// The write failed (`ENOSPC` for a full disk, `EIO` otherwise): nothing of `b` is in the log (its bytes are
    /// taken back), or, if they could not be, the log is broken and every later append fails too.
    pub fn append(&mut self, b: &Journal) -> Result<(u64, Option<Sealed>), CommitError> {
        if let Some(e) = &self.broken {
            return Err(e.clone());
        }
        let mut sealed = None;
        if self.len >= SEGMENT_BYTES {
            sealed = Some(self.start_segment()?);
        }
        let seq = self.seq + 1;
        encode(seq, b, &mut self.buf);
        if let Err(e) = (&*self.file).write_all(&self.buf) {
            let err = CommitError {
                why: format!("cannot append to {}: {e}", self.path.display()),
                errno: if e.raw_os_error() == Some(libc::ENOSPC) {
                    crate::message::errno::ENOSPC
                } else {
                    crate::message::errno::EIO
                },
            };
            // Take back what part of the record was written: a later record must not follow a torn one.
            if let Err(e2) = self.file.set_len(self.len) {
                let why = format!("{} (and its torn record could not be removed: {e2})", err.why);
                self.broken = Some(CommitError { why, errno: err.errno });
            }
            return Err(err);
        }
        self.len += self.buf.len() as u64;
        self.seq = seq;
        Ok((seq, sealed))
    }

    /// Seal the current segment and start the next.
    fn start_segment(&mut self) -> Result<Sealed, CommitError> {
        let (file, path) = Self::new_segment(&self.dir, self.number + 1).map_err(|e| CommitError {
            why: format!("cannot start a segment of the redo log in {}: {e}", self.dir.display()),
            errno: if e.raw_os_error() == Some(libc::ENOSPC) {
                crate::message::errno::ENOSPC
            } else {
                crate::message::errno::EIO
            },
        })?;
        self.number += 1;
        let old = std::mem::replace(&mut self.file, file);
        self.unsynced.push(old);
        self.dir_unsynced = true;
        let old_path = std::mem::replace(&mut self.path, path);
        self.len = 0;
        Ok(Sealed { path: old_path, last: self.seq })
    }

    /// The current segment as sealed (at a clean stop: it goes once the store holds it).
    pub fn sealed(&self) -> Sealed {
        Sealed { path: self.path.clone(), last: self.seq }
    }

    /// What an fsync covering every record appended so far must do.
    pub fn sync_work(&mut self) -> SyncWork {
        let mut files = std::mem::take(&mut self.unsynced);
        files.push(self.file.clone());
        SyncWork { files, dir: std::mem::take(&mut self.dir_unsynced).then(|| self.dir.clone()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(id: u64) -> Journal {
        let mut j = Journal {
            jobs: Vec::new(),
            resource_first: 0,
            resource_events: Vec::new(),
            last_id: JobId(id),
            epoch: 1_796_000_000.25,
            purged: Vec::new(),
            ranks: Vec::new(),
            history: Vec::new(),
            history_expired: Vec::new(),
            tick: 0,
        };
        j.jobs.push(JobRecord {
            id: JobId(id),
            userid: 1000,
            state: JobState::Run,
            jobspec: Some(Arc::from(r#"{"version":1,"tasks":[{"command":["true"]}]}"#)),
            submit_key: Some(Arc::from(format!("{id:032x}"))),
            credential: Some(Arc::new(crate::shellproto::ImpCredential {
                credential: format!("MUNGE:{id}:"),
                jobspec: r#"{"version":1,"tasks":[{"command":["true"]}]}"#.into(),
            })),
            first_event: 0,
            events: vec![Arc::new(
                Event::parse_line(r#"{"timestamp":1.5,"name":"submit","context":{"urgency":16}}"#).unwrap(),
            )],
            row: true,
            r: Some(serde_json::json!({"version": 1})),
            status: None,
            output: None,
            rows: OutputRows::default(),
        });
        j
    }

    /// A record reads back as the batch written: jobspecs raw after its JSON, or inside it for one that holds a
    /// tab or a newline; jobs without one (a later batch of theirs) in between.
    #[test]
    fn a_record_reads_back_as_written() {
        let mut b = batch(7);
        let mut odd = batch(8).jobs.remove(0);
        odd.jobspec = Some(Arc::from("{\"a\":\"x\ty\"}"));
        let mut later = batch(9).jobs.remove(0);
        later.jobspec = None;
        let plain = batch(10).jobs.remove(0);
        b.jobs.extend([odd, later, plain]);
        let mut buf = Vec::new();
        encode(3, &b, &mut buf);
        assert_eq!(buf.last(), Some(&b'\n'));
        assert_eq!(buf.iter().filter(|&&c| c == b'\t').count(), 2, "two jobspecs raw");
        let (seq, back) = decode(&buf[..buf.len() - 1]).unwrap();
        assert_eq!(seq, 3);
        assert_eq!(back, b);
    }

    #[test]
    fn a_damaged_record_is_refused() {
        let mut buf = Vec::new();
        encode(1, &batch(1), &mut buf);
        let n = buf.len() - 1;
        let mut bad = buf[..n].to_vec();
        bad[n / 2] ^= 0x20;
        assert!(decode(&bad).unwrap_err().contains("checksum"));
        assert!(decode(&buf[..n / 2]).is_err());
    }

    #[test]
    fn replay_takes_records_in_order_and_stops_at_a_torn_one() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = RedoLog::create(dir.path(), 0).unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        assert_eq!(std::fs::metadata(&log.path).unwrap().permissions().mode() & 0o777, 0o600);
        for id in 1..=3 {
            log.append(&batch(id)).unwrap();
        }
        let path = log.path.clone();
        drop(log);
        let r = read(dir.path(), 1).unwrap();
        assert_eq!(r.batches.iter().map(|(s, _)| *s).collect::<Vec<_>>(), vec![2, 3]);
        assert!(r.dropped.is_none());
        // A torn last record (a power cut before its fsync): dropped, the ones before kept.
        let len = std::fs::metadata(&path).unwrap().len();
        std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(len - 5).unwrap();
        let r = read(dir.path(), 0).unwrap();
        assert_eq!(r.batches.len(), 2);
        assert!(r.dropped.as_deref().unwrap().contains("without its end"), "{:?}", r.dropped);
        // A whole record after the torn one (here in a later segment) means the log is damaged, not torn: nothing
        // is dropped.
        let mut log = RedoLog::create(dir.path(), 2).unwrap();
        assert_eq!(log.append(&batch(3)).unwrap().0, 3);
        let why = damage(read(dir.path(), 0));
        assert!(why.contains("damaged, not torn"), "{why}");
    }

    /// Why [`read`] found the log damaged (a test fails if it did not).
    fn damage(r: Result<Replay, ReadError>) -> String {
        match r {
            Err(ReadError::Damaged(why)) => why,
            other => panic!("not damage: {other:?}"),
        }
    }

    /// A bad record in the middle (a flipped byte, whole records after it) is damage: reported, nothing dropped.
    #[test]
    fn a_bad_record_with_whole_ones_after_it_is_damage_not_a_tear() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = RedoLog::create(dir.path(), 0).unwrap();
        for id in 1..=3 {
            log.append(&batch(id)).unwrap();
        }
        let mut data = std::fs::read(&log.path).unwrap();
        let second = data.iter().position(|&c| c == b'\n').unwrap() + 1;
        data[second + 40] ^= 0x01;
        std::fs::write(&log.path, &data).unwrap();
        let why = damage(read(dir.path(), 0));
        assert!(why.contains("checksum mismatch") && why.contains("(3) follows"), "{why}");
    }

    /// A log whose first record is past the one after the store's last (the store lost changes it had
    /// committed, or a segment was removed) is damage, not something to replay from where it starts.
    #[test]
    fn records_missing_before_the_log_is_damage() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = RedoLog::create(dir.path(), 10).unwrap();
        log.append(&batch(1)).unwrap();
        assert_eq!(read(dir.path(), 10).unwrap().batches.len(), 1);
        let why = damage(read(dir.path(), 4));
        assert!(why.contains("first record is 11") && why.contains("up to 4"), "{why}");
    }

    #[test]
    fn a_full_segment_is_sealed_and_the_next_follows_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = RedoLog::create(dir.path(), 10).unwrap();
        assert!(log.sync_work().dir.is_some(), "a new segment's name is synced");
        let (seq, sealed) = log.append(&batch(1)).unwrap();
        assert_eq!((seq, sealed.is_none()), (11, true));
        assert_eq!(log.append(&batch(2)).unwrap().0, 12);
        log.len = SEGMENT_BYTES;
        let (seq, sealed) = log.append(&batch(3)).unwrap();
        assert_eq!(seq, 13);
        assert_eq!(sealed.unwrap().last, 12);
        // The next fsync covers the sealed segment's tail too, and the new one's name.
        let w = log.sync_work();
        assert_eq!(w.files.len(), 2);
        assert!(w.dir.is_some());
        w.run().unwrap();
        assert_eq!(log.sync_work().files.len(), 1);
        let r = read(dir.path(), 10).unwrap();
        assert_eq!(r.batches.iter().map(|(s, _)| *s).collect::<Vec<_>>(), vec![11, 12, 13]);
        assert_eq!(r.segments.len(), 2);
    }

    /// A full disk fails the append (`ENOSPC`) and leaves no torn record behind: the records before it read back
    /// whole, and one appended once there is room follows them in sequence. Needs root (a 64 KiB tmpfs).
    #[test]
    fn a_full_disk_fails_the_append_and_leaves_no_torn_record() {
        use std::os::unix::ffi::OsStrExt as _;
        let dir = tempfile::tempdir().unwrap();
        let target = std::ffi::CString::new(dir.path().as_os_str().as_bytes()).unwrap();
        // SAFETY: mount(2) with NUL-terminated strings that outlive the call.
        let rc = unsafe {
            libc::mount(c"tmpfs".as_ptr(), target.as_ptr(), c"tmpfs".as_ptr(), 0, c"size=64k".as_ptr().cast())
        };
        if rc != 0 {
            eprintln!("skipped: cannot mount a tmpfs (needs root): {}", std::io::Error::last_os_error());
            return;
        }
        struct Unmount(std::ffi::CString);
        impl Drop for Unmount {
            fn drop(&mut self) {
                // SAFETY: umount(2) of the tmpfs this test mounted.
                unsafe { libc::umount(self.0.as_ptr()) };
            }
        }
        let _unmount = Unmount(target);
        let mut log = RedoLog::create(dir.path(), 0).unwrap();
        let mut big = batch(1);
        big.jobs[0].jobspec = Some(Arc::from(format!(r#"{{"env":"{}"}}"#, "x".repeat(20_000))));
        let mut kept = 0;
        let err = loop {
            match log.append(&big) {
                Ok(_) => kept += 1,
                Err(e) => break e,
            }
            assert!(kept < 10, "a 64 KiB file system took {kept} records of 20 KB");
        };
        assert_eq!(err.errno, crate::message::errno::ENOSPC, "{}", err.why);
        assert!(err.why.contains("vigil.redo.000001"), "{}", err.why);
        let r = read(dir.path(), 0).unwrap();
        assert_eq!((r.batches.len(), r.dropped), (kept, None), "the records before it, and nothing torn");
        let (seq, _) = log.append(&batch(2)).expect("a small record fits in what is left");
        assert_eq!(seq, kept as u64 + 1);
        assert_eq!(read(dir.path(), 0).unwrap().batches.len(), kept + 1);
    }

    proptest::proptest! {
        /// Any batch reads back as written: jobspecs with tabs, newlines, quotes or any text, any number of jobs
        /// and events, with or without R.
        #[test]
        fn any_record_reads_back_as_written(
            jobs in proptest::collection::vec(
                (1u64..1_000_000, proptest::option::of(".{0,40}"), 0usize..4, proptest::option::of(0i32..512)),
                0..6,
            ),
            seq in 1u64..u64::MAX,
        ) {
            let mut b = batch(1);
            b.jobs.clear();
            for (id, spec, nev, status) in jobs {
                let mut r = batch(id).jobs.remove(0);
                r.jobspec = spec.map(|t| Arc::from(serde_json::json!({"cwd": t}).to_string().replace("cwd", &t)));
                r.events.truncate(nev);
                r.status = status;
                r.r = status.map(|s| serde_json::json!({"version": 1, "s": s}));
                b.jobs.push(r);
            }
            let mut buf = Vec::new();
            encode(seq, &b, &mut buf);
            let (got_seq, back) = decode(&buf[..buf.len() - 1]).unwrap();
            proptest::prop_assert_eq!(got_seq, seq);
            proptest::prop_assert_eq!(back, b);
        }
    }
}
