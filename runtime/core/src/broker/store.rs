//! What the broker knows of rank 0's store (`-S statedir=DIR`): the broker hands out the job core's journal
//! (`jobs/journal.rs`) and the fsyncs that make it durable as effects ([`super::core::Effect::Store`],
//! [`super::core::Effect::Sync`], ahead of the effects that depend on them); the driver carries them out and
//! tells the broker whether the write, and later its fsync, succeeded ([`super::core::Input::Stored`],
//! [`super::core::Input::Synced`]). The SQLite store is the driver's (`broker/store.rs` in `vigil-driver`); the
//! simulator keeps the journal in memory (`jobs::journal::Kept`).

/// A commit that failed: nothing of its batch is kept.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{why}")]
pub struct CommitError {
    /// What failed.
    pub why: String,
    /// The errno a refused request is answered with: `ENOSPC` for a full disk, `EIO` otherwise.
    pub errno: u32,
}
