//! An open block volume's device: byte-addressed reads and writes within its size, flush,
//! discard, over the volume's one device file. The servers (NBD, ublk) turn their requests
//! into these calls; each is counted in the device's metrics as a mount's operations are.

use std::sync::Arc;
use std::time::Instant;

use super::{BlockDevError, DEVICE_FILE};
use crate::io_limits::{IoLimits, LiveLimits};
use crate::metrics::{MountMetrics, Op};
use crate::volume::{Fallocate, FileKind, SetAttr, Volume, VolumeError, ROOT_INO};

/// Requests are carried out in pieces of at most this many bytes: the largest request a FUSE
/// mount sends, so a device write takes the same path (bulk writes into extent files, reads
/// in one batch of lookups) as a file write.
const PIECE: usize = 1 << 20;
/// The pieces of a logged write: below the volume's unlogged-write size.
const LOGGED_PIECE: usize = crate::volume::UNLOGGED_WRITE_MIN / 2;

/// Why a device request failed.
#[derive(Debug, thiserror::Error)]
pub enum DeviceIoError {
    #[error("{len} bytes at offset {offset} reach past the device's end ({size} bytes)")]
    OutOfRange { offset: u64, len: u64, size: u64 },
    #[error(transparent)]
    Volume(#[from] VolumeError),
}

impl DeviceIoError {
    /// The errno a block layer reports for it.
    pub fn errno(&self) -> i32 {
        match self {
            DeviceIoError::OutOfRange { .. } => libc::EINVAL,
            DeviceIoError::Volume(e) => e.errno(),
        }
    }
}

/// A block volume opened for serving.
pub struct BlockDevice {
    volume: Volume,
    ino: u64,
    size: u64,
    metrics: Arc<MountMetrics>,
    /// The volume's IOPS and bandwidth limits and weight: reads, writes and discards wait on
    /// them.
    limits: Arc<LiveLimits>,
}

impl BlockDevice {
    /// The device of block volume `volume`. A device file whose size differs from the
    /// record's (a resize interrupted between the two) is set to the recorded size.
    pub fn new(volume: Volume) -> Result<Self, BlockDevError> {
        let info = volume.tenant().info();
        let name = info.name.clone();
        let size = info
            .device_size
            .ok_or_else(|| BlockDevError::NotAVolume(name.clone()))?;
        let no_device = |detail: String| BlockDevError::NoDevice {
            name: name.clone(),
            file: String::from_utf8_lossy(DEVICE_FILE).into_owned(),
            detail,
        };
        let attr = match volume.lookup(ROOT_INO, DEVICE_FILE) {
            Ok(a) if a.kind == FileKind::File => a,
            Ok(a) => return Err(no_device(format!("it is a {:?}", a.kind))),
            Err(VolumeError::NotFound) => return Err(no_device("it is missing".into())),
            Err(source) => return Err(BlockDevError::Volume { name, source }),
        };
        if attr.size != size {
            tracing::warn!(
                volume = %name,
                file_size = attr.size,
                size,
                "device file size differs from the volume's record (an interrupted resize): \
                 setting it to the recorded size"
            );
            let set = SetAttr {
                size: Some(size),
                ..SetAttr::default()
            };
            let resized = volume.setattr(attr.ino, &set).and_then(|_| volume.fsync());
            resized.map_err(|source| BlockDevError::Volume {
                name: name.clone(),
                source,
            })?;
        }
        let (metrics, limits) = (MountMetrics::new(), Arc::new(LiveLimits::default()));
        let sink = crate::io_limits::background_sink(&limits, &metrics);
        volume.tenant().db().background().set_sink(sink);
        Ok(Self {
            ino: attr.ino,
            volume,
            size,
            metrics,
            limits,
        })
    }

    /// The volume's name.
    pub fn name(&self) -> &str {
        &self.volume.tenant().info().name
    }

    /// The device's size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The volume's block size: the unit a client should write in.
    pub fn block_size(&self) -> u32 {
        self.volume.block_size()
    }

    pub fn metrics(&self) -> &Arc<MountMetrics> {
        &self.metrics
    }

    /// The device file's inode.
    pub(super) fn ino(&self) -> u64 {
        self.ino
    }

    /// The volume (for its store's state).
    pub fn volume(&self) -> &Volume {
        &self.volume
    }

    /// From now on, requests are answered within `limits` and take their turns in the
    /// process's fair queue by its weight, as a mount's do.
    pub fn set_limits(&self, limits: IoLimits) {
        self.limits.set(limits);
    }

    /// The limits in force.
    pub fn limits(&self) -> IoLimits {
        self.limits.get()
    }

    fn check(&self, offset: u64, len: u64) -> Result<(), DeviceIoError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(DeviceIoError::OutOfRange {
                offset,
                len,
                size: self.size,
            }),
        }
    }

    fn counted<T>(
        &self,
        op: Op,
        f: impl FnOnce() -> Result<T, DeviceIoError>,
    ) -> Result<T, DeviceIoError> {
        let start = Instant::now();
        let r = f();
        self.metrics.record(op, start, r.is_ok());
        r
    }

    /// Reads `len` bytes at `offset` into `out` (replacing what it held).
    pub fn read(&self, offset: u64, len: u32, out: &mut Vec<u8>) -> Result<(), DeviceIoError> {
        // The wait on the limits comes before the request's clock starts (throttled time).
        let _turn = self.limits.admit(len.into(), &self.metrics);
        self.counted(Op::Read, || {
            self.check(offset, len.into())?;
            if len as usize <= PIECE {
                self.volume.read_into(self.ino, offset, len, out)?;
            } else {
                out.clear();
                out.reserve(len as usize);
                let mut piece = Vec::new();
                let mut at = offset;
                while at < offset + u64::from(len) {
                    let n = (offset + u64::from(len) - at).min(PIECE as u64) as u32;
                    self.volume.read_into(self.ino, at, n, &mut piece)?;
                    out.extend_from_slice(&piece);
                    at += u64::from(n);
                }
            }
            // Within the size, the file reads whole (holes as zeros).
            debug_assert_eq!(out.len(), len as usize);
            self.metrics.add_read_bytes(len.into());
            Ok(())
        })
    }

    /// Writes `data` at `offset`; with `fua`, durable before it returns. Without it, a
    /// bulk write (256 KiB and more) is durable at the next flush, like a disk's volatile
    /// cache: what NBD and FUSE promise.
    pub fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), DeviceIoError> {
        self.write_in(PIECE, offset, data, fua)
    }

    /// Writes `data` at `offset` in pieces small enough to go through the store's WAL, so
    /// that once it returns the write is in the kernel: it survives this process dying
    /// (surviving the machine's crash still takes a flush or `fua`). For clients that
    /// outlive the server and so cannot tell it died: a kernel device held across a daemon
    /// restart. Costs a second copy of bulk data (the WAL's).
    pub fn write_logged(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), DeviceIoError> {
        self.write_in(LOGGED_PIECE, offset, data, fua)
    }

    fn write_in(
        &self,
        piece_len: usize,
        offset: u64,
        data: &[u8],
        fua: bool,
    ) -> Result<(), DeviceIoError> {
        let _turn = self.limits.admit(data.len() as u64, &self.metrics);
        self.counted(Op::Write, || {
            self.check(offset, data.len() as u64)?;
            let mut at = offset;
            for piece in data.chunks(piece_len) {
                self.volume.write(self.ino, at, piece)?;
                at += piece.len() as u64;
            }
            self.metrics.add_written_bytes(data.len() as u64);
            if fua {
                self.volume.fsync()?;
            }
            Ok(())
        })
    }

    /// Makes every write so far durable.
    pub fn flush(&self) -> Result<(), DeviceIoError> {
        self.counted(Op::Fsync, || Ok(self.volume.fsync()?))
    }

    /// Discards `len` bytes at `offset` (TRIM, WRITE_ZEROES): their extents are freed and
    /// they read as zeros; with `fua`, durable before it returns.
    pub fn discard(&self, offset: u64, len: u64, fua: bool) -> Result<(), DeviceIoError> {
        // A request, whatever it frees: its bytes are not moved.
        let _turn = self.limits.admit(0, &self.metrics);
        self.counted(Op::Discard, || {
            self.check(offset, len)?;
            if len > 0 {
                self.volume
                    .fallocate(self.ino, offset, len, Fallocate::PunchHole)?;
            }
            if fua {
                self.volume.fsync()?;
            }
            Ok(())
        })
    }
}
