//! Tests of the store: what is committed comes back, the redo log is folded at open, damage and foreign files are
//! refused and left as they were, older schemas are upgraded, output is trimmed to its tail. `batch` and `record`
//! also serve the store thread's tests (`statedir_io.rs`).

use super::*;
use crate::eventlog::Event;
use crate::jobs::journal::JobRecord;
use crate::jobs::JobState;
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
        // Every other job was submitted with a key (`jobs/submit_key.rs`), as a client of today's does.
        submit_key: (spec && id.is_multiple_of(2)).then(|| format!("key-{id}").into()),
        // Every third, a guest's, with its munge credential (docs/security.md).
        credential: (spec && id.is_multiple_of(3)).then(|| {
            std::sync::Arc::new(crate::shellproto::ImpCredential {
                credential: format!("MUNGE:cred-{id}:"),
                jobspec: json!({"version": 1, "id": id}).to_string(),
            })
        }),
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
        history: Vec::new(),
        history_expired: Vec::new(),
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
    assert_eq!((kept.last_id, kept.jobs.keys().copied().collect::<Vec<_>>()), (JobId(14), vec![JobId(5), JobId(9)]));
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
    let rows = |s: &Store| -> i64 { s.conn.query_row("SELECT COUNT(*) FROM job_output", [], |r| r.get(0)).unwrap() };
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

/// A job's submission key (`jobs/submit_key.rs`) is written with its jobspec and comes back at the next
/// open, from the file and from the redo log alike; a job without one has none; a purged job's goes with it.
#[test]
fn submission_keys_come_back_after_reopening() {
    use super::super::redo::RedoLog;
    let d = tempfile::tempdir().unwrap();
    let (mut s, _) = Store::open(d.path()).unwrap();
    let keyed = |id: u64, key: &str| {
        let mut r = record(id, 0, &["submit"], true);
        r.submit_key = Some(key.into());
        r
    };
    let b1 = batch(vec![keyed(3, "0123456789abcdef0123456789abcdef"), record(5, 0, &["submit"], true)], 0, 0, 5);
    s.commit(&b1).unwrap();
    // A later record of job 3 carries no key: the kept one stays.
    s.commit(&batch(vec![record(3, 1, &["validate"], false), keyed(7, "purged-soon")], 0, 0, 7)).unwrap();
    s.commit(&Journal { purged: vec![JobId(7)], ..batch(vec![], 0, 0, 7) }).unwrap();
    // Job 9 only in the redo log (rank 0 killed before the fold).
    let mut log = RedoLog::create(d.path(), s.redo_seq).unwrap();
    log.append(&batch(vec![keyed(9, "in-the-log")], 0, 0, 9)).unwrap();
    drop((s, log));
    let (_s, kept) = Store::open(d.path()).unwrap();
    let kept = kept.unwrap();
    let keys: Vec<(u64, Option<&str>)> = kept.jobs.iter().map(|(id, k)| (id.0, k.submit_key.as_deref())).collect();
    assert_eq!(keys, [(3, Some("0123456789abcdef0123456789abcdef")), (5, None), (9, Some("in-the-log"))]);
    assert_eq!(kept.jobs[&JobId(3)].eventlog.len(), 2);
    // Guests' credentials (jobs 3 and 9: `record`) come back the same way, from the file and from the log.
    let creds: Vec<(u64, Option<&str>)> =
        kept.jobs.iter().map(|(id, k)| (id.0, k.credential.as_ref().map(|c| c.credential.as_str()))).collect();
    assert_eq!(creds, [(3, Some("MUNGE:cred-3:")), (5, None), (9, Some("MUNGE:cred-9:"))]);
    assert_eq!(kept.jobs[&JobId(9)].credential.as_ref().unwrap().jobspec, r#"{"id":9,"version":1}"#);
}

/// A store of schema 5 (no credentials) is brought to this one: its jobs come back without one, and guests'
/// jobs with theirs are written on.
#[test]
fn a_schema_5_store_gains_credentials() {
    let d = tempfile::tempdir().unwrap();
    let (mut s, _) = Store::open(d.path()).unwrap();
    s.commit(&batch(vec![record(3, 0, &["submit"], true)], 0, 0, 3)).unwrap();
    s.conn
        .execute_batch("ALTER TABLE jobspecs DROP COLUMN credential; PRAGMA user_version = 5;")
        .expect("made a schema 5 store");
    drop(s);
    let (mut s, kept) = Store::open(d.path()).unwrap();
    let v: i64 = s.conn.query_row("PRAGMA user_version", [], |r| r.get(0)).unwrap();
    assert_eq!(v, SCHEMA_VERSION);
    assert_eq!(kept.unwrap().jobs[&JobId(3)].credential, None);
    s.commit(&batch(vec![record(6, 0, &["submit"], true)], 0, 0, 6)).unwrap();
    drop(s);
    let (_, kept) = Store::open(d.path()).unwrap();
    let c = kept.unwrap().jobs[&JobId(6)].credential.clone().expect("job 6's credential");
    assert_eq!(c.credential, "MUNGE:cred-6:");
}

/// A store of schema 3 (no submission keys) is brought to this one: its jobs come back without a key, and
/// keyed jobs are written on.
#[test]
fn a_schema_3_store_gains_submission_keys() {
    let d = tempfile::tempdir().unwrap();
    let (mut s, _) = Store::open(d.path()).unwrap();
    s.commit(&batch(vec![record(1, 0, &["submit"], true)], 0, 0, 1)).unwrap();
    s.conn
        .execute_batch(
            "DROP TABLE history; ALTER TABLE jobspecs DROP COLUMN submit_key; ALTER TABLE jobspecs DROP COLUMN \
             credential; PRAGMA user_version = 3;",
        )
        .expect("made a schema 3 store");
    drop(s);
    let (mut s, kept) = Store::open(d.path()).unwrap();
    let v: i64 = s.conn.query_row("PRAGMA user_version", [], |r| r.get(0)).unwrap();
    assert_eq!(v, SCHEMA_VERSION);
    assert_eq!(kept.unwrap().jobs[&JobId(1)].submit_key, None);
    s.commit(&batch(vec![record(2, 0, &["submit"], true)], 0, 0, 2)).unwrap();
    drop(s);
    let (_, kept) = Store::open(d.path()).unwrap();
    assert_eq!(kept.unwrap().jobs[&JobId(2)].submit_key.as_deref(), Some("key-2"));
}

/// A store of schema 4 (no history) is brought to this one: it has no records yet (the job core writes one for
/// each INACTIVE job it keeps, `jobs/history.rs`); records written on come back, and expired ones go.
#[test]
fn a_schema_4_store_gains_the_history() {
    use crate::jobs::history::HistoryRecord;
    let d = tempfile::tempdir().unwrap();
    let (mut s, _) = Store::open(d.path()).unwrap();
    s.commit(&batch(vec![record(1, 0, &["submit"], true)], 0, 0, 1)).unwrap();
    s.conn
        .execute_batch("DROP TABLE history; ALTER TABLE jobspecs DROP COLUMN credential; PRAGMA user_version = 4;")
        .expect("made a schema 4 store");
    drop(s);
    let (mut s, kept) = Store::open(d.path()).unwrap();
    let v: i64 = s.conn.query_row("PRAGMA user_version", [], |r| r.get(0)).unwrap();
    assert_eq!(v, SCHEMA_VERSION);
    assert!(kept.unwrap().history.is_empty());
    let rec = |id: u64, t: f64| HistoryRecord {
        id: JobId(id),
        userid: 1000,
        name: format!("j{id}"),
        t_submit: t - 2.0,
        t_run: Some(t - 1.0),
        t_finish: Some(t),
        t_inactive: t,
        duration: None,
        nnodes: 1,
        ntasks: 1,
        ranks: "0".into(),
        nodelist: "node0".into(),
        result: "COMPLETED".into(),
        exit_code: 0,
        exception: None,
        usage: Some(crate::shellproto::Usage { cpu_usec: Some(1500), ..Default::default() }),
        requeues: 0,
        lost_nodelist: String::new(),
    };
    let mut b = batch(vec![], 0, 0, 3);
    b.history = vec![std::sync::Arc::new(rec(3, 30.0)), std::sync::Arc::new(rec(2, 20.0))];
    s.commit(&b).unwrap();
    let mut b = batch(vec![], 0, 0, 4);
    b.history = vec![std::sync::Arc::new(rec(4, 40.0))];
    b.history_expired = vec![JobId(2)];
    s.commit(&b).unwrap();
    drop(s);
    let (_, kept) = Store::open(d.path()).unwrap();
    assert_eq!(kept.unwrap().history, vec![rec(3, 30.0), rec(4, 40.0)], "in end order, the expired one gone");
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
