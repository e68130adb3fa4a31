//! The block volumes a host serves, each as an NBD export, a ublk device or a kernel nbd
//! device: one table, so attach refuses a volume served any way, `stats` reports all and
//! shutdown knows what each needs (an export closes; a device is kept for the next daemon to
//! recover).

use std::sync::Arc;

use crate::blockdev::BlockDevice;
use crate::control::replies::{VolumeReport, VolumeServed};
use crate::nbd::{NbdExport, NbdKernelDevice};
use crate::ublk::UblkTarget;

/// One attached volume.
pub enum Attached {
    Nbd(NbdExport),
    Ublk(UblkTarget),
    NbdDevice(NbdKernelDevice),
}

impl Attached {
    pub fn device(&self) -> &Arc<BlockDevice> {
        match self {
            Attached::Nbd(e) => e.device(),
            Attached::Ublk(t) => t.device(),
            Attached::NbdDevice(d) => d.device(),
        }
    }

    /// "nbd", "ublk" or "nbd-device".
    pub fn kind(&self) -> &'static str {
        match self {
            Attached::Nbd(_) => "nbd",
            Attached::Ublk(_) => "ublk",
            Attached::NbdDevice(_) => "nbd-device",
        }
    }

    /// Where clients find it: the export's address, or the device's path.
    pub fn address(&self) -> String {
        match self {
            Attached::Nbd(e) => e.address().to_string(),
            Attached::Ublk(t) => t.path(),
            Attached::NbdDevice(d) => d.path(),
        }
    }

    /// The NBD URI (empty for a device).
    pub fn uri(&self) -> String {
        match self {
            Attached::Nbd(e) => e.address().uri(),
            Attached::Ublk(_) | Attached::NbdDevice(_) => String::new(),
        }
    }

    /// NBD client connections (a device has none to show).
    pub fn connections(&self) -> usize {
        match self {
            Attached::Nbd(e) => e.connections(),
            Attached::Ublk(_) | Attached::NbdDevice(_) => 0,
        }
    }

    /// Stops serving for `volume detach`: the connections closed (an export), or the device
    /// deleted or disconnected (refused while it is mounted). Returns the connections closed.
    pub fn detach(&mut self) -> Result<usize, String> {
        match self {
            Attached::Nbd(e) => Ok(e.stop()),
            Attached::Ublk(t) => t.stop().map(|()| 0).map_err(|e| e.to_string()),
            Attached::NbdDevice(d) => d.stop().map(|()| 0).map_err(|e| e.to_string()),
        }
    }

    /// Stops serving as the daemon exits: an export closes; a device stays, its I/O held by
    /// the kernel until the next daemon recovers it.
    pub fn shut_down(&mut self) {
        match self {
            Attached::Nbd(e) => {
                e.stop();
            }
            Attached::Ublk(t) => t.suspend(),
            Attached::NbdDevice(d) => d.suspend(),
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
            limits: device.limits().into(),
            store: Some(device.volume().tenant().db().state()),
        }
    }
}
