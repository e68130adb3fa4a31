//! Block volumes' lifecycle: create (empty, or a raw image base's copy on write), list,
//! resize, delete. Each is a tenant operation with a device on top; the daemon serves them
//! (`nbd`), these run without it and refuse a volume another process has open.

use super::{validate_size, BlockDevError, BlockDevice, DEVICE_FILE, SECTOR};
use crate::base::{open_volume, BaseStore, ImageDevice};
use crate::data_dir::DataDir;
use crate::store::StoreHost;
use crate::tenants::{self, NewTenant, TenantInfo};
use crate::volume::{FileKind, Opening, Owner, SetAttr, Volume, ROOT_INO};

/// Creates block volume `name` of `size` bytes: empty (reads as zeros), or from raw image base
/// `base` (its blocks shared, copy on write; `size` at least the image's, its size rounded up
/// to whole sectors when `None`).
pub fn create(
    data: &DataDir,
    host: &StoreHost,
    name: &str,
    size: Option<u64>,
    base: Option<&str>,
) -> Result<TenantInfo, BlockDevError> {
    let size = size.map(validate_size).transpose()?;
    if let Some(base) = base {
        let store = BaseStore::open(data, host)?;
        let device = ImageDevice {
            file: DEVICE_FILE,
            size,
            granule: SECTOR,
        };
        let info = store.create_volume(data, host, name, base, &device)?;
        return Ok(info);
    }
    let size = size.ok_or(BlockDevError::NoSize)?;
    let new = NewTenant {
        device_size: Some(size),
        ..NewTenant::default()
    };
    let info = tenants::create_as(data, host, name, &new)?;
    let made = (|| -> Result<(), BlockDevError> {
        let volume = Volume::open(tenants::open(data, host, name)?).map_err(|source| {
            BlockDevError::Volume {
                name: name.to_owned(),
                source,
            }
        })?;
        let root = Owner { uid: 0, gid: 0 };
        let made = volume
            .mknod(ROOT_INO, DEVICE_FILE, FileKind::File, 0o600, root, 0)
            .and_then(|a| {
                let set = SetAttr {
                    size: Some(size),
                    ..SetAttr::default()
                };
                volume.setattr(a.ino, &set)
            })
            .and_then(|_| volume.fsync());
        made.map(|_| ()).map_err(|source| BlockDevError::Volume {
            name: name.to_owned(),
            source,
        })
    })();
    if let Err(e) = made {
        if let Err(d) = tenants::delete(data, name) {
            tracing::error!(volume = name, error = %d, "cannot remove a volume whose device failed");
        }
        return Err(e);
    }
    tracing::info!(volume = name, size, "block volume created");
    // Its size on disk with the device in (that volume's directory only).
    Ok(tenants::info(data.root(), name).unwrap_or(info))
}

/// The block volumes in the data dir at `root`, by name.
pub fn list(root: &std::path::Path) -> Result<Vec<TenantInfo>, BlockDevError> {
    Ok(tenants::list(root)?
        .into_iter()
        .filter(|t| t.device_size.is_some())
        .collect())
}

/// Opens block volume `name`'s device in this process (base blocks read through the packs,
/// no host cache).
pub fn open(data: &DataDir, host: &StoreHost, name: &str) -> Result<BlockDevice, BlockDevError> {
    let tenant = tenants::open(data, host, name)?;
    if tenant.info().device_size.is_none() {
        return Err(BlockDevError::NotAVolume(name.to_owned()));
    }
    let volume = open_volume(data, tenant, None, Opening::Fresh).map_err(|source| {
        BlockDevError::Volume {
            name: name.to_owned(),
            source,
        }
    })?;
    BlockDevice::new(volume)
}

/// What a resize did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resize {
    pub old: u64,
    pub new: u64,
}

/// Sets block volume `name`'s size to `size`. Growing adds zeros; shrinking drops what lies
/// past the new end and is refused unless `shrink`. The volume must not be attached.
pub fn resize(
    data: &DataDir,
    host: &StoreHost,
    name: &str,
    size: u64,
    shrink: bool,
) -> Result<Resize, BlockDevError> {
    let size = validate_size(size)?;
    let device = open(data, host, name)?;
    let old = device.size();
    if size < old && !shrink {
        return Err(BlockDevError::WouldShrink {
            name: name.to_owned(),
            size: old,
            new: size,
        });
    }
    if size != old {
        // The record first: it is the volume's size, and opening the device sets the file to
        // it, so a crash between the two finishes the resize at the next open.
        let volume = device.volume();
        tenants::set_device_size(data, volume.tenant(), size)?;
        let set = SetAttr {
            size: Some(size),
            ..SetAttr::default()
        };
        let ino = device.ino();
        volume
            .setattr(ino, &set)
            .and_then(|_| volume.fsync())
            .map_err(|source| BlockDevError::Volume {
                name: name.to_owned(),
                source,
            })?;
        tracing::info!(volume = name, old, new = size, "block volume resized");
    }
    Ok(Resize { old, new: size })
}

/// Deletes block volume `name` and its data; refused while it is attached or open anywhere.
pub fn delete(data: &DataDir, name: &str) -> Result<(), BlockDevError> {
    // That volume's record only: deleting one costs the same however many tenants there are.
    if tenants::info(data.root(), name)?.device_size.is_none() {
        return Err(BlockDevError::NotAVolume(name.to_owned()));
    }
    tenants::delete(data, name)?;
    Ok(())
}
