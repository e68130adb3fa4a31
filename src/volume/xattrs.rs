//! Extended attributes: set (create or replace only, as asked), get, list and remove, each
//! under the inode's lock, with the kernel's name and size limits.

use super::codec::*;
use super::{now, Result, Volume, VolumeError, XattrMode, XATTR_NAME_MAX, XATTR_SIZE_MAX};
use crate::store::Family;

impl Volume {
    pub fn setxattr(&self, ino: u64, name: &[u8], value: &[u8], mode: XattrMode) -> Result<()> {
        if name.is_empty() {
            return Err(VolumeError::Invalid);
        }
        if name.len() > XATTR_NAME_MAX {
            return Err(VolumeError::Range);
        }
        if value.len() > XATTR_SIZE_MAX {
            return Err(VolumeError::ArgTooBig);
        }
        let _g = self.inodes.lock(ino);
        let (mut attr, target) = self.load(ino)?;
        let key = xattr_key(ino, name);
        let exists = self.db().get(Family::Meta, &key)?.is_some();
        match mode {
            XattrMode::Create if exists => return Err(VolumeError::Exists),
            XattrMode::Replace if !exists => return Err(VolumeError::NoAttr),
            _ => {}
        }
        attr.ctime = now();
        let mut b = self.db().batch();
        b.put(Family::Meta, &key, value);
        self.store_attr(&mut b, &attr, &target);
        self.db().write(b)?;
        Ok(())
    }

    pub fn getxattr(&self, ino: u64, name: &[u8]) -> Result<Vec<u8>> {
        self.getattr(ino)?;
        self.db()
            .get(Family::Meta, &xattr_key(ino, name))?
            .ok_or(VolumeError::NoAttr)
    }

    /// Attribute names, each followed by a NUL (the listxattr(2) format).
    pub fn listxattr(&self, ino: u64) -> Result<Vec<u8>> {
        self.getattr(ino)?;
        let prefix = xattr_prefix(ino);
        let end = xattr_prefix(ino + 1);
        let mut out = Vec::new();
        self.db().range(Family::Meta, &prefix, &end, |k, _| {
            out.extend_from_slice(&k[prefix.len()..]);
            out.push(0);
            true
        })?;
        Ok(out)
    }

    pub fn removexattr(&self, ino: u64, name: &[u8]) -> Result<()> {
        let _g = self.inodes.lock(ino);
        let (mut attr, target) = self.load(ino)?;
        let key = xattr_key(ino, name);
        if self.db().get(Family::Meta, &key)?.is_none() {
            return Err(VolumeError::NoAttr);
        }
        attr.ctime = now();
        let mut b = self.db().batch();
        b.delete(Family::Meta, &key);
        self.store_attr(&mut b, &attr, &target);
        self.db().write(b)?;
        Ok(())
    }
}
