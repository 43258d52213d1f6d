//! Rank 0's state directory as the driver runs it: opening it at start ([`open_statedir`]), the redo log and
//! the writer thread that folds it into the store ([`Writer`]), the thread that fsyncs the log ([`Syncer`]), and
//! the two effects that use them: the broker's `Effect::Store` (append a batch of the journal to the log,
//! [`Driver::store`]) and `Effect::Sync` (fsync it, [`Driver::start_sync`]).
//!
//! The formats are the neighbours': `redo.rs` (the redo log's segments and records) and `store.rs` (the SQLite
//! store). When a batch is written and when an fsync is asked for (group commit) is the broker's rule: it hands
//! them out ahead of the effects that depend on them (`Effect::Store`'s documentation in `vigil-core`).

use super::core::Input;
use super::driver::{Driver, Event};
use super::BrokerOptions;
use std::collections::VecDeque;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tracing::info;

/// Rank 0's end of the state directory while it runs: the redo log (`redo.rs`), appended on the loop, and the
/// writer thread, which folds its records into the store (`store.rs`) off the loop.
///
/// The loop appends each batch of the journal to the log ([`Driver::store`]) before it carries out anything the
/// broker asked for in the same turn (the broker hands the batch out first): one `write` of the batch's record,
/// a few microseconds, so no client,
/// shell or broker learns of a change a `kill -9` of rank 0 would lose, and a job's way from one write to the
/// next is not held up (a SQLite transaction there cost 0.1 to 0.3 ms each, twice on the way of each job). The
/// batches (shared, not copied) go to the thread every [`FOLD_PERIOD`] (or [`FOLD_MAX`] records), all at once:
/// one wake-up of the thread per period, not one per record, which on 2 cores cost the loop as much as the
/// appends. The thread folds them into SQLite in one durable transaction, then removes the log's segments the
/// store holds whole. Fsyncs of the log are the [`Syncer`]'s.
///
pub(super) struct Writer {
    /// The log.
    redo: super::redo::RedoLog,
    /// The records appended since the last hand-over, and the segments sealed meanwhile.
    pending: Handover,
    /// When the oldest of them was appended.
    pending_since: Option<Instant>,
    /// Hands the thread what is pending.
    tx: std::sync::mpsc::Sender<Handover>,
    /// Why the thread's folds fail, while they do (for `vigil uptime`).
    fold_failing: std::sync::Arc<std::sync::Mutex<Option<String>>>,
    /// The thread, joined by [`Writer::stop`].
    thread: Option<std::thread::JoinHandle<()>>,
}

/// What the writer thread is handed at once ([`Writer`]).
#[derive(Default)]
struct Handover {
    /// Records of the log (number, batch), in order.
    records: Vec<(u64, std::sync::Arc<crate::jobs::journal::Journal>)>,
    /// Segments of the log that get no more records: each removed once its last is folded.
    sealed: Vec<super::redo::Sealed>,
}

/// The loop hands what the log holds to the writer thread at least this often (when it has something): 0.5 s,
/// about what a restart after `kill -9` replays from the log. An idle rank 0 (no input at all) hands it over at
/// its next input or at its stop.
const FOLD_PERIOD: Duration = Duration::from_millis(500);

/// ... or as soon as this many records are pending (a flood of submissions): a bound on what is folded at once.
const FOLD_MAX: usize = 4096;

impl Writer {
    /// Start the thread, which owns `store` and ends, once it has folded everything, when the [`Writer`] is
    /// stopped; and the log, in the store's directory, after the store's last record.
    ///
    /// # Errors
    /// The log's first segment cannot be created, or the thread started.
    fn start(mut store: super::store::Store, dir: &std::path::Path) -> Result<Writer, String> {
        let redo = super::redo::RedoLog::create(dir, store.redo_seq)
            .map_err(|e| format!("state directory {} cannot be written: {e}", dir.display()))?;
        store.mark_running(true).map_err(|e| format!("state directory {} cannot be written: {e}", dir.display()))?;
        let (tx, rx) = std::sync::mpsc::channel::<Handover>();
        let fold_failing = std::sync::Arc::new(std::sync::Mutex::new(None));
        let failing = fold_failing.clone();
        let thread = std::thread::Builder::new()
            .name("vigil-store-write".into())
            .spawn(move || fold_loop(store, &rx, &failing))
            .map_err(|e| format!("cannot start the state directory's writer thread: {e}"))?;
        Ok(Writer { redo, pending: Handover::default(), pending_since: None, tx, fold_failing, thread: Some(thread) })
    }

    /// Append batch `b` to the log (it survives `kill -9` once this returns `Ok`), to be folded later.
    ///
    /// # Errors
    /// The append failed: nothing of `b` is kept.
    pub(super) fn append(
        &mut self,
        b: &std::sync::Arc<crate::jobs::journal::Journal>,
    ) -> Result<(), super::store::CommitError> {
        let (seq, sealed) = self.redo.append(b)?;
        self.pending.sealed.extend(sealed);
        self.pending.records.push((seq, b.clone()));
        self.pending_since.get_or_insert_with(Instant::now);
        Ok(())
    }

    /// Hand the thread what is pending if it is due ([`FOLD_PERIOD`], [`FOLD_MAX`]), or at once (`now`).
    pub(super) fn hand_over(&mut self, now: bool) {
        let due =
            self.pending_since.is_some_and(|t| t.elapsed() >= FOLD_PERIOD) || self.pending.records.len() >= FOLD_MAX;
        if !(due || now) || (self.pending_since.is_none() && self.pending.sealed.is_empty()) {
            return;
        }
        self.pending_since = None;
        // A send fails only once the thread has ended (a panic): the records stay in the log, folded at the
        // next start.
        let _ = self.tx.send(std::mem::take(&mut self.pending));
    }

    /// What an fsync of the log must sync now (for the [`Syncer`]).
    pub(super) fn sync_work(&mut self) -> super::redo::SyncWork {
        self.redo.sync_work()
    }

    /// Why the thread's folds fail, while they do.
    pub(super) fn fold_failing(&self) -> Option<String> {
        self.fold_failing.lock().ok().and_then(|f| f.clone())
    }

    /// End the thread once it has folded every record, and close the store with it: its connection, closed
    /// last, checkpoints SQLite's log into the file and removes it, so that a stopped rank 0 leaves the store
    /// whole in one file (the log's segments removed too, once folded).
    pub(super) fn stop(mut self) {
        self.pending.sealed.push(self.redo.sealed());
        self.hand_over(true);
        let Writer { tx, thread, .. } = self;
        drop(tx);
        if let Some(t) = thread {
            let _ = t.join();
        }
    }
}

/// The writer thread ([`Writer`]): fold what it is handed into `store`, each hand-over in one transaction, and
/// remove the sealed segments folded whole; it ends when the loop's end is dropped. A fold that fails (a full
/// disk) is logged once, said in `failing` (for `vigil uptime`) until one succeeds, and tried again a period
/// later with what came meanwhile: its records stay in the log.
fn fold_loop(
    mut store: super::store::Store,
    rx: &std::sync::mpsc::Receiver<Handover>,
    said: &std::sync::Mutex<Option<String>>,
) {
    use std::sync::mpsc::RecvTimeoutError;
    let mut todo = Handover::default();
    let mut failing = false;
    let say = |why: Option<String>| {
        if let Ok(mut s) = said.lock() {
            *s = why;
        }
    };
    loop {
        let got =
            if failing { rx.recv_timeout(FOLD_PERIOD) } else { rx.recv().map_err(|_| RecvTimeoutError::Disconnected) };
        let open = match got {
            Ok(h) => {
                todo.records.extend(h.records);
                todo.sealed.extend(h.sealed);
                true
            }
            Err(RecvTimeoutError::Timeout) => true,
            Err(RecvTimeoutError::Disconnected) => false,
        };
        if let Some((upto, _)) = todo.records.last() {
            let upto = *upto;
            let batches: Vec<&crate::jobs::journal::Journal> = todo.records.iter().map(|(_, b)| &**b).collect();
            match store.fold(&batches, upto) {
                Ok(()) => {
                    todo.records.clear();
                    if std::mem::take(&mut failing) {
                        say(None);
                        info!("state directory: folding the redo log into the store works again");
                    }
                }
                Err(e) => {
                    say(Some(e.why.clone()));
                    if !std::mem::replace(&mut failing, true) {
                        tracing::warn!(
                            "state directory: cannot fold the redo log into the store: {} (its records stay in \
                             the log; tried again every {} ms)",
                            e.why,
                            FOLD_PERIOD.as_millis()
                        );
                    }
                }
            }
        }
        if !open && todo.records.is_empty() {
            // A clean stop, everything folded: no log in use from now on, recorded before its last segment goes
            // (recorded after, a crash between the two would leave a store that looks like its log was removed).
            if let Err(e) = store.mark_running(false) {
                tracing::warn!("state directory: cannot record the clean stop: {}", e.why);
            }
        }
        let folded = store.redo_seq;
        todo.sealed.retain(|s| {
            if s.last > folded {
                return true;
            }
            if let Err(e) = std::fs::remove_file(&s.path) {
                tracing::warn!("state directory: {}: cannot remove: {e}", s.path.display());
            }
            false
        });
        if !open {
            // What could not be folded stays in the log (and `running` with it), folded at the next start.
            return;
        }
    }
}

/// Rank 0's store thread: fsyncs the redo log ([`super::redo::SyncWork`]) when the loop asks (the broker's
/// `Effect::Sync`, [`Driver::start_sync`]), and reports each fsync to the loop ([`Event::Synced`]). The broker
/// asks for one at a time: whatever the loop writes meanwhile waits for the next, which covers it all (group
/// commit).
pub(super) struct Syncer {
    /// Asks for an fsync covering write `upto`, and what it must sync.
    tx: std::sync::mpsc::Sender<(u64, super::redo::SyncWork)>,
    /// The thread, joined by [`Syncer::stop`].
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Syncer {
    /// Start the thread, which calls `sync` (normally [`super::redo::SyncWork::run`]) for each fsync asked for,
    /// timing each into `times` (seconds, for the metrics endpoint); it ends when the [`Syncer`] is dropped.
    ///
    /// # Errors
    /// The thread cannot be started.
    fn start(
        mut sync: impl FnMut(super::redo::SyncWork) -> Result<(), super::store::CommitError> + Send + 'static,
        events: mpsc::UnboundedSender<Event>,
        times: prometheus_client::metrics::histogram::Histogram,
    ) -> Result<Syncer, String> {
        let (tx, rx) = std::sync::mpsc::channel::<(u64, super::redo::SyncWork)>();
        let thread = std::thread::Builder::new()
            .name("vigil-store-sync".into())
            .spawn(move || {
                while let Ok((upto, work)) = rx.recv() {
                    let t = std::time::Instant::now();
                    let result = sync(work);
                    times.observe(t.elapsed().as_secs_f64());
                    if events.send(Event::Synced { upto, result }).is_err() {
                        break;
                    }
                }
            })
            .map_err(|e| format!("cannot start the state directory's store thread: {e}"))?;
        Ok(Syncer { tx, thread: Some(thread) })
    }

    /// Ask for an fsync covering write `upto`, with what it must sync. `false`: the thread is gone.
    pub(super) fn ask(&self, upto: u64, work: super::redo::SyncWork) -> bool {
        self.tx.send((upto, work)).is_ok()
    }

    /// End the thread (after the fsync under way, if any).
    pub(super) fn stop(self) {
        let Syncer { tx, thread, .. } = self;
        drop(tx);
        if let Some(t) = thread {
            let _ = t.join();
        }
    }
}

impl Driver {
    /// Carry out the broker's `Effect::Store`: append `batch` to the redo log (`None`: nothing to write, "written"
    /// at once), then hand the broker the outcome ([`Input::Stored`]) at once, as the effect asks, before the
    /// next effect is polled.
    pub(super) fn store(&mut self, batch: Option<std::sync::Arc<crate::jobs::journal::Journal>>) {
        let result = match (batch, self.writer.as_mut()) {
            (None, _) => Ok(()),
            (Some(b), Some(w)) => w.append(&b).map_err(Into::into),
            // The broker writes only with a state directory open, which the writer is.
            (Some(_), None) => Err(vigil_core::broker::store::CommitError {
                why: "the state directory's redo log is not open".into(),
                errno: crate::message::errno::EIO,
            }),
        };
        let now = self.now();
        self.handle(now, Input::Stored { result, durable: false });
    }

    /// Carry out the broker's `Effect::Sync`: ask the store thread for an fsync covering write `upto`
    /// ([`Syncer`]), reported later as [`Event::Synced`]. If the thread is gone, the fsync failed: `queue` gets
    /// that.
    pub(super) fn start_sync(&mut self, upto: u64, queue: &mut VecDeque<Input>) {
        let asked = match (self.syncer.as_ref(), self.writer.as_mut()) {
            (Some(s), Some(w)) => s.ask(upto, w.sync_work()),
            _ => false,
        };
        if !asked {
            let why = "the state directory's store thread has stopped".to_string();
            queue.push_back(Input::Synced {
                upto,
                result: Err(vigil_core::broker::store::CommitError { why, errno: crate::message::errno::EIO }),
            });
        }
    }
}

/// Rank 0's store threads for `store`, none without one: the [`Syncer`], then the [`Writer`] (which takes the
/// store).
///
/// # Errors
/// A thread cannot be started, or the redo log created.
pub(super) fn start_store_threads(
    store: Option<super::store::Store>,
    events: &mpsc::UnboundedSender<Event>,
    fsync_times: prometheus_client::metrics::histogram::Histogram,
) -> Result<(Option<Syncer>, Option<Writer>), String> {
    let syncer = store.as_ref().map(|_| Syncer::start(|w| w.run(), events.clone(), fsync_times)).transpose()?;
    let writer = store
        .map(|s| {
            let dir = s.dir().to_path_buf();
            Writer::start(s, &dir)
        })
        .transpose()?;
    Ok((syncer, writer))
}

/// Rank 0's state directory, opened (`-S statedir`): the store and what it kept, or why it cannot be read.
///
/// # Errors
/// A directory that cannot be written: the broker does not start (the message names the directory).
pub(super) fn open_statedir(
    opts: &BrokerOptions,
) -> Result<(Option<super::store::Store>, super::core::StateDir, Option<crate::jobs::journal::Kept>), String> {
    use super::core::StateDir;
    use super::store::{OpenError, Store};
    let Some(dir) = opts.config.statedir.clone().filter(|_| opts.rank == 0) else {
        return Ok((None, StateDir::None, None));
    };
    let t = Instant::now();
    match Store::open(&dir) {
        Ok((mut store, kept)) => {
            // A system instance's (no initial program: its name is the bootstrap's, the same at every start; a
            // test or nested instance gets a new random one each time, and keeps its directory across them).
            if opts.initial_program.is_none() {
                store.claim_instance(&opts.instance).map_err(|why| {
                    format!(
                        "state directory {} cannot be used: {why} (give this instance its own statedir)",
                        dir.display()
                    )
                })?;
            }
            store.record_restart().map_err(|e| format!("state directory {} cannot be written: {e}", dir.display()))?;
            let restarts = store.restarts;
            let bytes = std::fs::metadata(dir.join(super::store::FILE)).map_or(0, |m| m.len());
            // What a restart costs before rank 0 serves anything (`vigil-bench restart` reads this line).
            info!(
                "state directory {}: store read in {:.3}s ({} job(s), {bytes} bytes)",
                dir.display(),
                t.elapsed().as_secs_f64(),
                kept.as_ref().map_or(0, |k| k.jobs.len())
            );
            Ok((Some(store), StateDir::Open { dir, restarts, failing: None }, kept))
        }
        Err(e @ (OpenError::Unwritable { .. } | OpenError::InUse { .. })) => Err(e.to_string()),
        Err(e @ OpenError::Damaged { .. }) => Ok((None, StateDir::Damaged { dir, why: e.to_string() }, None)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::store::CommitError;

    /// The writer thread gets the loop's records a fold period after the first (not one by one), folds them into
    /// the store, and at a clean stop folds the rest and leaves the store alone in its directory: no segment of
    /// the redo log, no SQLite log beside it.
    #[test]
    fn the_writer_folds_the_records_a_period_later_and_all_of_them_at_stop() {
        use super::super::redo::segments;
        use super::super::store::tests::{batch, record};
        let d = tempfile::tempdir().unwrap();
        let (store, _) = super::super::store::Store::open(d.path()).unwrap();
        let mut w = Writer::start(store, d.path()).unwrap();
        let jobs = |path: &std::path::Path| -> i64 {
            let c = rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
            c.query_row("SELECT COUNT(*) FROM jobs", [], |r| r.get(0)).unwrap()
        };
        let db = d.path().join(super::super::store::FILE);
        for id in 1..=3 {
            w.append(&std::sync::Arc::new(batch(vec![record(id, 0, &["submit"], true)], 0, 0, id))).unwrap();
            w.hand_over(false);
        }
        assert_eq!(w.pending.records.len(), 3, "not handed over before the period");
        w.pending_since = Some(Instant::now() - FOLD_PERIOD);
        w.hand_over(false);
        assert!(w.pending.records.is_empty(), "handed over once due");
        let t = Instant::now();
        while jobs(&db) < 3 {
            assert!(t.elapsed() < Duration::from_secs(10), "not folded");
            std::thread::sleep(Duration::from_millis(20));
        }
        w.append(&std::sync::Arc::new(batch(vec![record(4, 0, &["submit"], true)], 0, 0, 4))).unwrap();
        assert_eq!(segments(d.path()).unwrap().len(), 1);
        w.stop();
        assert!(segments(d.path()).unwrap().is_empty(), "the folded log is removed at stop");
        assert!(!d.path().join(format!("{}-wal", super::super::store::FILE)).exists());
        let (s, kept) = super::super::store::Store::open(d.path()).unwrap();
        assert_eq!(kept.unwrap().jobs.len(), 4);
        assert_eq!(s.redo_seq, 4);
    }

    /// A fold that fails is said (for `vigil uptime`) and its records stay in the redo log: read back at the
    /// next open, where the same record is refused as damage rather than lost.
    #[test]
    fn a_fold_that_fails_is_said_and_its_records_stay_in_the_log() {
        use super::super::redo::{read, segments};
        use super::super::store::tests::{batch, record};
        let d = tempfile::tempdir().unwrap();
        let (store, _) = super::super::store::Store::open(d.path()).unwrap();
        let mut w = Writer::start(store, d.path()).unwrap();
        // A change of job 5, which the store has no row for: the fold's UPDATE finds nothing, and fails.
        w.append(&std::sync::Arc::new(batch(vec![record(5, 1, &["alloc"], false)], 0, 0, 5))).unwrap();
        w.hand_over(true);
        let t = Instant::now();
        let why = loop {
            if let Some(why) = w.fold_failing.lock().unwrap().clone() {
                break why;
            }
            assert!(t.elapsed() < Duration::from_secs(10), "no failure said");
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(why.contains("job") && why.contains("no row"), "{why}");
        w.stop();
        assert_eq!(segments(d.path()).unwrap().len(), 1, "kept");
        assert_eq!(read(d.path(), 0).unwrap().batches.len(), 1);
        match super::super::store::Store::open(d.path()) {
            Err(super::super::store::OpenError::Damaged { why, .. }) => assert!(why.contains("no row"), "{why}"),
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("a record that cannot be folded was dropped"),
        }
    }

    /// The store thread reports an fsync only once it has returned (a slow disk: one that blocks until released),
    /// with the write it was asked to cover and its result.
    #[test]
    fn the_store_thread_reports_an_fsync_only_once_it_returned() {
        let (release, gate) = std::sync::mpsc::channel::<Result<(), CommitError>>();
        let (events, mut reports) = mpsc::unbounded_channel();
        let s = Syncer::start(
            move |_| gate.recv().expect("released"),
            events,
            super::super::metrics::Observed::default().fsync,
        )
        .expect("thread");
        let work = || super::super::redo::SyncWork { files: Vec::new(), dir: None };
        s.tx.send((7, work())).expect("asked");
        std::thread::sleep(Duration::from_millis(100));
        assert!(reports.try_recv().is_err(), "reported while the fsync still blocks");
        release.send(Ok(())).expect("released");
        assert!(matches!(reports.blocking_recv(), Some(Event::Synced { upto: 7, result: Ok(()) })));
        s.tx.send((9, work())).expect("asked");
        let eio = CommitError { why: "EIO".into(), errno: crate::message::errno::EIO };
        release.send(Err(eio.clone())).expect("released");
        assert!(matches!(reports.blocking_recv(), Some(Event::Synced { upto: 9, result: Err(e) }) if e == eio));
    }
}
