//! The endpoint of a build without libfabric: [`Endpoint::open`] reports why, so the caller falls back to
//! another transport. No value of this type can exist, so every other method is unreachable; they exist so
//! that code using the crate compiles the same way with or without libfabric.

use crate::error::{CallError, Error, OpenError};
use crate::{Config, Event, PeerId, Stats};
use std::convert::Infallible;
use std::os::fd::RawFd;

/// Why this build has no libfabric (set by the build script).
pub(crate) const UNAVAILABLE: &str = env!("VIGIL_OFI_UNAVAILABLE");

/// A reliable-datagram endpoint. This build has no libfabric: [`Endpoint::open`] always fails with
/// [`OpenError::Unavailable`].
#[derive(Debug)]
pub struct Endpoint {
    never: Infallible,
}

#[allow(missing_docs, clippy::missing_errors_doc)]
impl Endpoint {
    /// Always [`OpenError::Unavailable`] in this build.
    pub fn open(cfg: &Config) -> Result<Endpoint, OpenError> {
        cfg.validate()?;
        Err(OpenError::Unavailable(UNAVAILABLE))
    }
    pub fn provider(&self) -> &str {
        match self.never {}
    }
    pub fn fabric_domain(&self) -> (&str, &str) {
        match self.never {}
    }
    pub fn wait_fd(&self) -> Option<RawFd> {
        match self.never {}
    }
    pub fn manual_progress(&self) -> bool {
        match self.never {}
    }
    pub fn stats(&self) -> &Stats {
        match self.never {}
    }
    pub fn config(&self) -> &Config {
        match self.never {}
    }
    pub fn name(&self) -> Result<Vec<u8>, CallError> {
        match self.never {}
    }
    pub fn name_to_string(&self, _name: &[u8]) -> String {
        match self.never {}
    }
    pub fn insert_peer(&mut self, _name: &[u8]) -> Result<PeerId, CallError> {
        match self.never {}
    }
    pub fn remove_peer(&mut self, _peer: PeerId) -> Result<(), Error> {
        match self.never {}
    }
    pub fn queued(&self) -> usize {
        match self.never {}
    }
    pub fn in_flight(&self) -> usize {
        match self.never {}
    }
    pub fn try_send(&mut self, _peer: PeerId, _data: &[u8]) -> Result<(), Error> {
        match self.never {}
    }
    pub fn progress(&mut self) -> Result<usize, Error> {
        match self.never {}
    }
    pub fn poll_event(&mut self) -> Result<Option<Event>, Error> {
        match self.never {}
    }
    pub fn trywait(&self) -> Result<bool, CallError> {
        match self.never {}
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        match self.never {}
    }
}
