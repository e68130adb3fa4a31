//! Block volumes: tenants whose store holds one device instead of a filesystem tree, for hosts
//! that format their own filesystems (microVMs, containers with their own ext4/xfs).
//!
//! A block volume is a tenant like any other (own key, own RocksDB, the host cache, the same
//! data path: chunks in extent files, blocks over them, folds, read-ahead, holes), whose record
//! carries the device's size and whose store holds one regular file, [`DEVICE_FILE`], in its
//! root: the device's bytes are that file's extents. Keeping the device a file of the same
//! volume format is what lets everything that works on tenants (snapshots and forks when they
//! come, copy on write from a base, `tenant delete`) work on volumes unchanged, and lets a
//! volume be mounted through FUSE for a loop device where a comparison needs one.
//!
//! `volumes` creates, lists, resizes and deletes them; `device` is the open device the
//! servers (`nbd`, `ublk`) read and write.

mod device;
mod volumes;

pub use device::{BlockDevice, DeviceIoError};
pub use volumes::{create, delete, list, open, resize, Resize};

/// The name of the device's file in a block volume's store.
pub const DEVICE_FILE: &[u8] = b"device";
/// Device sizes are whole sectors (what block layers address).
pub const SECTOR: u64 = 512;
/// The largest device (offsets stay well within a file's `i64` range).
pub const MAX_DEVICE_SIZE: u64 = 1 << 60;

/// Whether kernel block device `path` (/dev/ublkbN, /dev/nbdN) is mounted or held open
/// exclusively: an exclusive open fails with EBUSY then.
pub fn is_held(path: &str) -> bool {
    use std::os::unix::fs::OpenOptionsExt;
    matches!(
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_EXCL)
            .open(path),
        Err(e) if e.raw_os_error() == Some(libc::EBUSY)
    )
}

#[derive(Debug, thiserror::Error)]
pub enum BlockDevError {
    #[error(
        "invalid device size {0}: use a whole number of 512-byte sectors, more than 0 and at most \
         1 EiB (for example 512M, 20G)"
    )]
    BadSize(u64),
    #[error("a block volume needs a size: pass --size (or --base IMAGE for the image's size)")]
    NoSize,
    #[error(
        "{0} is a filesystem tenant, not a block volume; use `tenantfs tenant ...` for it \
         (`tenantfs volume list` shows the volumes)"
    )]
    NotAVolume(String),
    #[error(
        "block volume {name} has no device file in its store ({detail}); it was changed through \
         a FUSE mount: restore {file:?} as one regular file, or delete the volume"
    )]
    NoDevice {
        name: String,
        file: String,
        detail: String,
    },
    #[error(
        "volume {name} is {size} bytes; shrinking it to {new} bytes drops the data past that: \
         pass --shrink to do so"
    )]
    WouldShrink { name: String, size: u64, new: u64 },
    #[error(transparent)]
    Tenant(#[from] crate::tenants::TenantError),
    #[error(transparent)]
    Base(#[from] crate::base::BaseError),
    #[error("volume {name}: {source}")]
    Volume {
        name: String,
        source: crate::volume::VolumeError,
    },
}

/// Checks a device size.
pub fn validate_size(size: u64) -> Result<u64, BlockDevError> {
    if size > 0 && size.is_multiple_of(SECTOR) && size <= MAX_DEVICE_SIZE {
        Ok(size)
    } else {
        Err(BlockDevError::BadSize(size))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_whole_sectors() {
        for ok in [512, 4096, 1 << 30, MAX_DEVICE_SIZE] {
            assert_eq!(validate_size(ok).unwrap(), ok);
        }
        for bad in [0, 1, 511, 4097, MAX_DEVICE_SIZE + 512] {
            assert!(validate_size(bad).is_err(), "{bad}");
        }
    }
}
