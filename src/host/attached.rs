//! The block volumes a host serves, each as an NBD export or a ublk device: one table, so
//! attach refuses a volume served either way, `stats` reports both and shutdown knows what
//! each needs (an export closes; a ublk device is kept for the next daemon to recover).

use std::sync::Arc;

use crate::blockdev::BlockDevice;
use crate::control::replies::{VolumeReport, VolumeServed};
use crate::nbd::NbdExport;
use crate::ublk::{UblkServeError, UblkTarget};

/// One attached volume.
pub enum Attached {
    Nbd(NbdExport),
    Ublk(UblkTarget),
}

impl Attached {
    pub fn device(&self) -> &Arc<BlockDevice> {
        match self {
            Attached::Nbd(e) => e.device(),
            Attached::Ublk(t) => t.device(),
        }
    }

    /// "nbd" or "ublk".
    pub fn kind(&self) -> &'static str {
        match self {
            Attached::Nbd(_) => "nbd",
            Attached::Ublk(_) => "ublk",
        }
    }

    /// Where clients find it: the export's address, or /dev/ublkbN.
    pub fn address(&self) -> String {
        match self {
            Attached::Nbd(e) => e.address().to_string(),
            Attached::Ublk(t) => t.path(),
        }
    }

    /// The NBD URI (empty for a ublk device).
    pub fn uri(&self) -> String {
        match self {
            Attached::Nbd(e) => e.address().uri(),
            Attached::Ublk(_) => String::new(),
        }
    }

    /// NBD client connections (a ublk device has none).
    pub fn connections(&self) -> usize {
        match self {
            Attached::Nbd(e) => e.connections(),
            Attached::Ublk(_) => 0,
        }
    }

    /// Stops serving for `volume detach`: the connections closed (an export), or the device
    /// deleted (refused while it is mounted). Returns the connections closed.
    pub fn detach(&mut self) -> Result<usize, UblkServeError> {
        match self {
            Attached::Nbd(e) => Ok(e.stop()),
            Attached::Ublk(t) => t.stop().map(|()| 0),
        }
    }

    /// Stops serving as the daemon exits: an export closes; a ublk device stays, its I/O
    /// held by the kernel until the next daemon recovers it.
    pub fn shut_down(&mut self) {
        match self {
            Attached::Nbd(e) => {
                e.stop();
            }
            Attached::Ublk(t) => t.suspend(),
        }
    }

    /// Where and how it is served.
    pub fn served(&self, volume: &str) -> VolumeServed {
        VolumeServed {
            volume: volume.to_owned(),
            kind: self.kind().to_owned(),
            address: self.address(),
            uri: self.uri(),
            size_bytes: self.device().size(),
        }
    }

    /// What `tenantfs stats` shows of it.
    pub fn report(&self, volume: &str) -> VolumeReport {
        let device = self.device();
        VolumeReport {
            served: self.served(volume),
            connections: self.connections() as u64,
            activity: device.metrics().summary(),
            store: Some(device.volume().tenant().db().state()),
        }
    }
}
