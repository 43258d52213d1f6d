//! The tokio face of an [`Endpoint`]: wait for completions on the completion queue's wait descriptor
//! (`tokio::io::unix::AsyncFd`), calling `fi_trywait` before every wait, plus a periodic progress call for
//! providers with manual data progress (or while sends are outstanding).

use crate::{Endpoint, Error, Event, PeerId};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// libfabric's wait descriptor: registered with tokio, never closed by us (libfabric owns it).
struct WaitFd(RawFd);

impl AsRawFd for WaitFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// An [`Endpoint`] driven from tokio. Its methods are cancel-safe: a dropped [`next_event`](Self::next_event)
/// loses no event, a dropped [`send`](Self::send) either queued the whole message or nothing.
///
/// Messages accepted by [`send`](Self::send) but not posted yet (the send slots were busy) are posted by the
/// following calls: keep one task calling [`next_event`](Self::next_event) (the way a link's receive loop
/// does), or call [`flush`](Self::flush).
pub struct AsyncEndpoint {
    // Declared first: deregistered from tokio before the endpoint (and with it the descriptor) is closed.
    fd: Option<AsyncFd<WaitFd>>,
    ep: Endpoint,
}

impl std::fmt::Debug for AsyncEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncEndpoint").field("ep", &self.ep).finish_non_exhaustive()
    }
}

impl AsyncEndpoint {
    /// Register the endpoint's wait descriptor (if it has one) with the current tokio runtime.
    pub fn new(ep: Endpoint) -> Result<AsyncEndpoint, Error> {
        let fd = match ep.wait_fd() {
            // SAFETY: the descriptor belongs to the endpoint's completion queue, which `ep` (declared after `fd`
            // in this struct, so dropped after it) keeps open and unchanged for the whole life of the AsyncFd.
            Some(fd) => Some(
                unsafe { AsyncFd::register_with_interest(WaitFd(fd), Interest::READABLE) }
                    .map_err(|e| e.into_parts().1)?,
            ),
            None => None,
        };
        Ok(AsyncEndpoint { fd, ep })
    }

    /// The endpoint (name, provider, counters...).
    pub fn get_ref(&self) -> &Endpoint {
        &self.ep
    }

    /// The endpoint, e.g. to insert or remove peers.
    pub fn get_mut(&mut self) -> &mut Endpoint {
        &mut self.ep
    }

    /// Send one message to `peer`, waiting while the send queue is full.
    pub async fn send(&mut self, peer: PeerId, data: &[u8]) -> Result<(), Error> {
        loop {
            match self.ep.try_send(peer, data) {
                Err(Error::WouldBlock { .. }) => {
                    // Progress posts queued fragments (and keeps receiving: those events wait in the
                    // endpoint for next_event); wait only if that freed nothing.
                    self.ep.progress()?;
                    if self.ep.queued() >= self.ep.config().send_queue_limit {
                        self.wait().await?;
                    }
                }
                r => return r,
            }
        }
    }

    /// The next event: a message, or a peer's failure.
    pub async fn next_event(&mut self) -> Result<Event, Error> {
        loop {
            if let Some(e) = self.ep.poll_event()? {
                return Ok(e);
            }
            self.wait().await?;
        }
    }

    /// Wait until every accepted message has been posted and every posted send has completed (events read
    /// meanwhile stay queued for [`next_event`](Self::next_event)).
    pub async fn flush(&mut self) -> Result<(), Error> {
        loop {
            self.ep.progress()?;
            if self.ep.queued() == 0 && self.ep.in_flight() == 0 {
                return Ok(());
            }
            self.wait().await?;
        }
    }

    /// Wait until progress may find something: the wait descriptor became readable, or the progress interval
    /// passed (manual-progress provider, or sends outstanding), or at once (after a yield) when `fi_trywait`
    /// says completions are pending. The caller calls progress afterwards.
    async fn wait(&mut self) -> Result<(), Error> {
        let cfg = self.ep.config();
        let busy = self.ep.queued() > 0 || self.ep.in_flight() > 0;
        let tick = if self.ep.manual_progress() || busy { cfg.progress_interval } else { None };
        let Some(fd) = &self.fd else {
            tokio::time::sleep(cfg.poll_interval).await;
            return Ok(());
        };
        if !self.ep.trywait()? {
            tokio::task::yield_now().await;
            return Ok(());
        }
        let readable = async {
            let mut guard = fd.readable().await?;
            guard.clear_ready();
            Ok::<(), io::Error>(())
        };
        match tick {
            Some(d) => tokio::select! {
                r = readable => r?,
                _ = tokio::time::sleep(d) => {}
            },
            None => readable.await?,
        }
        Ok(())
    }
}
