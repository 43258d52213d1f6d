//! Task output and standard input of a job, as rank 0 holds them.
//!
//! Output comes from the shells in numbered `job-exec.output` batches, which [`BatchOrder`] puts back in the order
//! each shell numbered them; a job keeps at most [`OUTPUT_KEEP`] bytes while it runs and the tail of it
//! ([`INACTIVE_OUTPUT_KEEP`]) once INACTIVE, within [`INACTIVE_OUTPUT_TOTAL`] for all INACTIVE jobs. Standard input
//! (`vigil run`) is held whole until the job ends, up to [`STDIN_KEEP`] bytes ([`JobCore::stdin`]).

use super::{Action, Job, JobCore, JobId};
use crate::shellproto::OutputLine;
use std::collections::BTreeMap;

/// Output kept per job on rank 0 for `attach` and `run` (bytes); older chunks are dropped beyond it, and a
/// watcher that fell that far behind is told how much it missed. (Use `--output FILE` for large output.)
pub const OUTPUT_KEEP: usize = 16 << 20;

/// Output kept for each job once it is INACTIVE (its tail, bytes), for `vigil job attach` after the fact.
pub const INACTIVE_OUTPUT_KEEP: usize = 1 << 20;

/// Output kept for all INACTIVE jobs together (bytes); beyond it the oldest jobs' output is dropped.
pub const INACTIVE_OUTPUT_TOTAL: usize = 64 << 20;

/// Standard input held per job on rank 0 (bytes of input, decoded; held as base64 text, 4/3 as many bytes).
///
/// Every chunk is held until the job is INACTIVE, not only until it has been forwarded: each job shell's
/// `job-info.stdin` stream starts from the first chunk, so a shell that starts (or asks) later still gets all of
/// the input. So the bound is on everything accepted, and input past it is refused ([`StdinError::Full`]).
pub const STDIN_KEEP: usize = 4 << 20;

/// Why standard input for a job was refused ([`JobCore::stdin`]). Nothing already accepted is lost by a refusal.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StdinError {
    /// No such job.
    #[error("unknown job id {0}")]
    UnknownJob(JobId),
    /// The job's input has ended (end of input was sent, the job was submitted without `stdin`, or it is over).
    #[error("standard input of job {0} is closed")]
    Closed(JobId),
    /// The chunk is not base64 text.
    #[error("'data' must be base64: {0}")]
    NotBase64(String),
    /// Accepting the chunk would hold more than [`STDIN_KEEP`] bytes for the job; `held` and `chunk` in bytes.
    #[error(
        "standard input of job {id} is full: {held} bytes held, a chunk of {chunk} more would pass the {} MiB \
         kept per job until it ends",
        STDIN_KEEP >> 20
    )]
    Full {
        /// The job.
        id: JobId,
        /// Bytes of input already held.
        held: usize,
        /// Bytes in the refused chunk.
        chunk: usize,
    },
}

impl StdinError {
    /// The errno a request is answered with: `ENOENT` (unknown job), `EINVAL` (input closed), `EPROTO` (not
    /// base64), `ENOSPC` when full: not `EAGAIN`, since held input is freed only when the job ends, so a retry
    /// while the job runs cannot succeed.
    pub fn errno(&self) -> u32 {
        use crate::message::errno;
        match self {
            StdinError::UnknownJob(_) => errno::ENOENT,
            StdinError::Closed(_) => errno::EINVAL,
            StdinError::NotBase64(_) => errno::EPROTO,
            StdinError::Full { .. } => errno::ENOSPC,
        }
    }
}

/// Where a `job-exec.output` batch stands in its shell's numbering.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Batch {
    /// Not numbered (a shell that does not number its batches): taken as it comes.
    Unnumbered,
    /// Batch `seq` (0, 1, ...) of the shell on broker rank `rank`.
    Numbered {
        /// The shell's broker rank.
        rank: u32,
        /// The batch's number.
        seq: u64,
    },
    /// The shell on broker rank `rank` has nothing more in flight: what is held for it is released.
    Flush {
        /// The shell's broker rank.
        rank: u32,
    },
}

/// The `job-exec.output` batches of one shell, put back in the order the shell numbered them. A batch that a
/// router was lost with is sent again by the shell after later ones went up (they were queued by its re-parenting
/// broker first), and one whose acknowledgement alone was lost arrives twice: rank 0 takes each batch once, in
/// order, holding later ones while an earlier one is missing, up to [`BatchOrder::MAX_HELD`] batches or
/// [`BatchOrder::MAX_HELD_BYTES`], and releases what it holds when the shell flushes.
#[derive(Clone, Debug, Default)]
pub struct BatchOrder {
    /// The next batch due.
    next: u64,
    /// Batches that came before their turn, and their bytes.
    held: BTreeMap<u64, Vec<OutputLine>>,
    held_bytes: usize,
    /// The numbering is not known yet: the first batch taken is due, whatever its number (a shell re-attached
    /// after rank 0 restarted, `reattach.rs`).
    resume: bool,
}

impl BatchOrder {
    /// Most batches held while an earlier one is missing (a shell has at most 8 unacknowledged: this is the
    /// missing one's resends and then some); past this the missing batch is given up.
    pub const MAX_HELD: usize = 64;
    /// Most bytes held while an earlier batch is missing; past this the missing batch is given up.
    pub const MAX_HELD_BYTES: usize = 4 << 20;

    /// The order of a shell whose earlier batches went to a rank 0 that has since restarted: the first batch that
    /// comes is due, whatever its number, and the order goes on from it.
    pub fn resume() -> BatchOrder {
        BatchOrder { resume: true, ..Default::default() }
    }

    /// The order of a shell whose batches up to `next` (excluded) were taken before rank 0 restarted, as its state
    /// directory kept them (`journal.rs`): batch `next` is due, and one below it that comes again is taken no more.
    pub fn at(next: u64) -> BatchOrder {
        BatchOrder { next, ..Default::default() }
    }

    /// The next batch due, once known (not while the order waits for its first batch after [`BatchOrder::resume`]).
    pub fn due(&self) -> Option<u64> {
        (!self.resume).then_some(self.next)
    }

    /// Take batch `seq`: the lines now due, in order (none if it was taken before or must wait its turn).
    pub fn take(&mut self, seq: u64, lines: Vec<OutputLine>) -> Vec<OutputLine> {
        if std::mem::take(&mut self.resume) {
            self.next = seq;
        }
        if seq < self.next || self.held.contains_key(&seq) {
            return Vec::new();
        }
        self.held_bytes += lines.iter().map(OutputLine::size).sum::<usize>();
        self.held.insert(seq, lines);
        if self.held.len() > Self::MAX_HELD || self.held_bytes > Self::MAX_HELD_BYTES {
            // Give up on what is missing: the oldest batch held is next.
            self.next = self.held.keys().next().copied().unwrap_or(self.next);
        }
        let mut out = Vec::new();
        while let Some(l) = self.held.remove(&self.next) {
            self.held_bytes -= l.iter().map(OutputLine::size).sum::<usize>();
            out.extend(l);
            self.next += 1;
        }
        out
    }

    /// Everything held, in order, past any gap: the shell has nothing more in flight.
    pub fn flush(&mut self) -> Vec<OutputLine> {
        let held = std::mem::take(&mut self.held);
        self.held_bytes = 0;
        if let Some(last) = held.keys().next_back() {
            self.next = last + 1;
        }
        held.into_values().flatten().collect()
    }
}

impl JobCore {
    /// Standard input for job `id`: `data`, a chunk as base64 text, and/or `eof`, the end of input. Refused once
    /// the input has ended, when `data` is not base64, and when holding it would pass [`STDIN_KEEP`] bytes for
    /// the job (see [`StdinError`]); a refused chunk changes nothing, and what was accepted before is kept. End
    /// of input alone is accepted even when the input is full.
    pub fn stdin(&mut self, id: JobId, data: Option<String>, eof: bool) -> Result<(), StdinError> {
        use base64::Engine as _;
        let j = self.jobs.get_mut(&id).ok_or(StdinError::UnknownJob(id))?;
        if j.stdin_eof {
            return Err(StdinError::Closed(id));
        }
        if let Some(d) = data {
            let chunk = base64::engine::general_purpose::STANDARD
                .decode(&d)
                .map_err(|e| StdinError::NotBase64(e.to_string()))?
                .len();
            if j.stdin_bytes.saturating_add(chunk) > STDIN_KEEP {
                return Err(StdinError::Full { id, held: j.stdin_bytes, chunk });
            }
            j.stdin_bytes += chunk;
            j.stdin.push(d);
        }
        if eof || !j.state.is_active() {
            j.stdin_eof = true;
        }
        self.actions.push_back(Action::Updated(id));
        Ok(())
    }

    /// Output lines from a shell; `batch`: where they stand in the shell's numbering ([`BatchOrder`]).
    pub fn output(&mut self, id: JobId, batch: Batch, lines: Vec<OutputLine>) {
        if let Some(j) = self.jobs.get_mut(&id) {
            let shell = match batch {
                Batch::Numbered { rank, .. } | Batch::Flush { rank } => Some(rank),
                Batch::Unnumbered => None,
            };
            let due = |j: &Job| shell.and_then(|r| j.shells.get(&r)).and_then(|sh| sh.batches.due());
            let before = due(j);
            let lines = match batch {
                Batch::Unnumbered => lines,
                Batch::Numbered { rank, seq } => match j.shells.get_mut(&rank) {
                    Some(sh) => sh.batches.take(seq, lines),
                    None => lines,
                },
                Batch::Flush { rank } => {
                    let mut held = j.shells.get_mut(&rank).map(|sh| sh.batches.flush()).unwrap_or_default();
                    held.extend(lines);
                    held
                }
            };
            if lines.is_empty() {
                // A batch with nothing due still moves the shell's numbering, which the journal keeps.
                if due(j) != before {
                    self.actions.mark(id);
                }
                return;
            }
            for l in lines {
                j.output_bytes += l.size();
                j.output.push_back(l);
            }
            trim_output(j, OUTPUT_KEEP);
            self.actions.push_back(Action::Updated(id));
        }
    }

    /// A job became INACTIVE: keep only the tail of its output, and drop the output of the oldest inactive jobs
    /// beyond [`INACTIVE_OUTPUT_TOTAL`], so a long-lived instance does not grow with every job it ran.
    pub(super) fn retire_output(&mut self, id: JobId) {
        if let Some(j) = self.jobs.get_mut(&id) {
            retire_stdin(j);
            trim_output(j, INACTIVE_OUTPUT_KEEP);
            self.inactive_output.push_back(id);
            self.inactive_output_bytes += j.output_bytes;
        }
        while self.inactive_output_bytes > INACTIVE_OUTPUT_TOTAL {
            let Some(old) = self.inactive_output.pop_front() else { break };
            if let Some(j) = self.jobs.get_mut(&old) {
                self.inactive_output_bytes = self.inactive_output_bytes.saturating_sub(j.output_bytes);
                trim_output(j, 0);
            }
        }
    }
}

/// A job became INACTIVE: no task will read its standard input any more, so it is dropped (and closed).
pub(super) fn retire_stdin(j: &mut Job) {
    j.stdin = Vec::new();
    j.stdin_bytes = 0;
    j.stdin_eof = true;
}

/// Drop a job's oldest output until at most `keep` bytes remain.
pub(super) fn trim_output(j: &mut Job, keep: usize) {
    let before = j.output.len();
    while j.output_bytes > keep {
        match j.output.pop_front() {
            Some(l) => {
                j.output_bytes -= l.size();
                j.output_base += 1;
            }
            None => break,
        }
    }
    if j.output.len() < before {
        j.output.shrink_to_fit();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_batches_are_bounded_past_a_gap() {
        let mut o = BatchOrder::default();
        let line = || vec![OutputLine::text(0, "stdout", "x".into())];
        assert_eq!(o.take(0, line()).len(), 1);
        // Batch 1 never comes: later ones are held, but not past the bound.
        let mut out = 0;
        for k in 2..2 + 200 {
            out += o.take(k, line()).len();
            assert!(o.held.len() <= BatchOrder::MAX_HELD);
        }
        assert_eq!(out, 200, "everything after the gap came out once the gap was given up");
        assert!(o.take(1, line()).is_empty());
    }
}
