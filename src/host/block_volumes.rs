//! The block volumes a serving host attaches: over NBD (a socket, or the kernel's nbd device)
//! or as ublk devices, the devices a previous daemon of the data dir left, and detaching.

use std::sync::Arc;

use super::{lock, Attached, Role, ServingHost};
use crate::blockdev::BlockDevice;
use crate::control::replies::{VolumeAttachReply, VolumeDetachReply, VolumeReport};
use crate::control::{AttachVia, Refusal, RefusalCode};
use crate::nbd::{NbdAddress, NbdExport, NbdKernelDevice};
use crate::ublk::UblkTarget;

impl ServingHost {
    /// Serves block volume `volume` as `via` says (daemon only).
    pub fn attach_volume(
        &self,
        volume: &str,
        via: &AttachVia,
    ) -> Result<VolumeAttachReply, Refusal> {
        if self.role != Role::Daemon {
            return Err(Refusal::new(
                RefusalCode::DaemonOnly,
                "block volumes are attached by the daemon (start it with `tenantfs daemon`)",
            ));
        }
        let failed = |e: String| Refusal::new(RefusalCode::AttachFailed, e);
        let address = match via {
            AttachVia::Nbd(nbd) => Some(NbdAddress::parse(nbd).map_err(|e| failed(e.to_string()))?),
            AttachVia::Ublk | AttachVia::NbdDevice => None,
        };
        if let Some(NbdAddress::Unix(p)) = &address {
            if p.is_relative() {
                return Err(failed(format!(
                    "unix socket path {} is relative: the daemon needs an absolute path",
                    p.display()
                )));
            }
        }
        {
            let exports = lock(&self.exports);
            if let Some(a) = exports.get(volume) {
                return Err(Refusal::new(
                    RefusalCode::AlreadyAttached,
                    format!(
                        "volume {volume} is attached already, as {} {}; detach it first \
                         (`tenantfs volume detach {volume}`)",
                        a.kind(),
                        a.address()
                    ),
                ));
            }
            if !lock(&self.attaching).insert(volume.to_owned()) {
                return Err(Refusal::new(
                    RefusalCode::AlreadyAttached,
                    format!("volume {volume} is being attached right now"),
                ));
            }
        }
        // The volume opens outside the exports' lock (it may wait for an exiting holder).
        let started = self.open_device(volume).and_then(|d| {
            let root = self.data.root();
            match &address {
                Some(a) => NbdExport::start(d, a)
                    .map(Attached::Nbd)
                    .map_err(|e| e.to_string()),
                None if *via == AttachVia::Ublk => UblkTarget::start(d, root)
                    .map(Attached::Ublk)
                    .map_err(|e| e.to_string()),
                None => NbdKernelDevice::attach(d, root)
                    .map(Attached::NbdDevice)
                    .map_err(|e| e.to_string()),
            }
            .map_err(|e| format!("cannot attach volume {volume}: {e}"))
        });
        lock(&self.attaching).remove(volume);
        let attached = started.map_err(failed)?;
        let reply = VolumeAttachReply {
            served: attached.served(volume),
            pid: std::process::id(),
        };
        lock(&self.exports).insert(volume.to_owned(), attached);
        Ok(reply)
    }

    /// Opens block volume `volume`'s device.
    fn open_device(&self, volume: &str) -> Result<Arc<BlockDevice>, String> {
        let v = self.open_volume(volume).map_err(|e| e.to_string())?;
        BlockDevice::new(v).map(Arc::new).map_err(|e| e.to_string())
    }

    /// Takes over the ublk and nbd devices a previous daemon of this data dir left (killed,
    /// or stopped with them attached): their held I/O goes to this one. A device that cannot
    /// be recovered is logged and left as it is (its I/O stays held; a restart tries again).
    pub fn recover_block_devices(&self) {
        let root = self.data.root();
        let ublk = crate::ublk::leftovers(root).into_iter().map(|l| {
            let r = self.open_device(&l.volume).and_then(|d| {
                UblkTarget::recover(d, root, l.dev_id)
                    .map(Attached::Ublk)
                    .map_err(|e| e.to_string())
            });
            (l.volume, format!("/dev/ublkb{}", l.dev_id), r)
        });
        let nbd = crate::nbd::leftovers(root).into_iter().map(|l| {
            let r = self.open_device(&l.volume).and_then(|d| {
                NbdKernelDevice::recover(d, root, l.index)
                    .map(Attached::NbdDevice)
                    .map_err(|e| e.to_string())
            });
            (l.volume, format!("/dev/nbd{}", l.index), r)
        });
        for (volume, path, recovered) in ublk.chain(nbd) {
            match recovered {
                Ok(a) => {
                    tracing::info!(%volume, %path, "recovered a block device a previous daemon left");
                    lock(&self.exports).insert(volume, a);
                }
                Err(error) => tracing::error!(%volume, %path, %error,
                    "cannot recover a block device a previous daemon left; its I/O stays held"),
            }
        }
    }

    /// Stops serving block volume `volume`: requests in flight are answered, connections
    /// closed or the ublk device deleted, the store synced and closed.
    pub fn detach_volume(&self, volume: &str) -> Result<VolumeDetachReply, Refusal> {
        let Some(mut attached) = lock(&self.exports).remove(volume) else {
            return Err(Refusal::new(
                RefusalCode::NotAttached,
                format!("volume {volume} is not attached here (`tenantfs volume list` shows where volumes are)"),
            ));
        };
        let closed = match attached.detach() {
            Ok(n) => n,
            Err(e) => {
                lock(&self.exports).insert(volume.to_owned(), attached);
                return Err(Refusal::new(
                    RefusalCode::Busy,
                    format!("cannot detach volume {volume}: {e}"),
                ));
            }
        };
        // The device (and with it the store) closes when the last connection lets it go.
        drop(attached);
        crate::cache::malloc::give_back_free_heap();
        Ok(VolumeDetachReply {
            volume: volume.to_owned(),
            connections_closed: closed as u64,
        })
    }

    /// The attached volumes with their activity.
    pub(super) fn volume_reports(&self) -> Vec<VolumeReport> {
        lock(&self.exports)
            .iter()
            .map(|(name, a)| a.report(name))
            .collect()
    }
}
